/* cuda_internal.h: shared between the CUDA backend's .cu files; not a public interface.
 * Each op family's file exports host launchers only (cuda_op_*); kernels stay static. */
#ifndef ANNA_BACKENDS_CUDA_INTERNAL_H
#define ANNA_BACKENDS_CUDA_INTERNAL_H

#include "backends/cuda/cuda_backend.h"
#include "formats/dtype.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <string.h>

/* A one-row add_rmsnorm (x += r; y = rmsnorm(x) * w) left for the next op: when that op is a
 * one-token int8 matvec of y, the matvec computes it in its activation prologue (one kernel
 * fewer per norm of a decode step: ~3-4 us each, 64 per step of the 9B shape) and its last
 * block stores x and y; any other op launches it first (cuda_impl_of). */
typedef struct cuda_pnorm {
  float *x; /* NULL: nothing deferred */
  const float *r, *w; /* device pointers (w mirrored) */
  float *y;
  int d, one_plus;
  float eps;
} cuda_pnorm;

typedef struct cuda_mirror_ent {
  const void *host;
  void *dev;
  size_t bytes;
} cuda_mirror_ent;

/* One recorded operation of a decode step (see "Launches" below). Compared byte for byte
 * between steps, so every field is set (memset first) and the struct has no padding holes
 * that could differ. */
enum { CUDA_NODE_KERNEL = 1, CUDA_NODE_COPY = 2, CUDA_NODE_MEMSET = 3 };
typedef struct cuda_node {
  int32_t kind;      /* CUDA_NODE_* */
  int32_t copy_kind; /* cudaMemcpyKind of a copy */
  int32_t pdl;       /* kernel launched by cuda_launch_pdl: may start before its predecessor ends */
  int32_t spare;     /* zero */
  const void *func;  /* kernel */
  uint32_t grid[3], block[3];
  uint64_t smem;
  uint32_t arg0, arg_bytes; /* kernel arguments: log_args[arg0 .. arg0 + arg_bytes) */
  uint32_t off0, nargs;     /* their offsets in that span: log_offs[off0 .. off0 + nargs) */
  void *dst;                /* copy / memset */
  const void *src;          /* copy */
  uint64_t bytes;           /* copy / memset */
} cuda_node;

/* A cached executable graph of a recorded step: its nodes (the graph's handles, for
 * in-place argument updates) and the log it was made from. */
typedef struct cuda_graph_ent {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaGraphNode_t *nodes;
  cuda_node *log;
  uint8_t *args;
  uint32_t *offs;
  int64_t n, cap, args_n, args_cap, offs_n, offs_cap;
  int64_t tick; /* last use, for eviction */
} cuda_graph_ent;

/* Graphs kept: e.g. decode steps with and without a block-table upload, each as its early
 * piece and the rest (cuda_impl.piece_at). */
#define CUDA_GRAPH_CACHE 8
/* Default cuda_impl.piece_at: a decode step's first piece, launched while the rest of the step
 * is recorded (~0.3 us per node on the host, several us per node on the GPU: 48 nodes keep
 * the GPU busy while the host records hundreds more). */
#define CUDA_GRAPH_PIECE 48
#define CUDA_MAX_KARGS 32 /* kernel parameters a recorded launch may have */

typedef struct cuda_impl {
  int device;
  int n_sm; /* multiprocessors (read at creation; 0 if the query failed: launchers guess 132) */
  cudaStream_t stream;
  cublasHandle_t blas;
  int err;          /* sticky: first ANNA_E* code, 0 while healthy */
  char msg[256];
  cuda_mirror_ent *map; /* open addressing on the host address */
  size_t map_cap, map_n;
  float *deq;       /* weight tiles dequantized to f32 for GEMM */
  size_t deq_floats;
  size_t gemm_tile_bytes; /* bf16 weight tile of a quantized prefill GEMM (cuda_backend_set_gemm_tile) */
  char *ring_h, *ring_d; /* pinned host ring and its device twin */
  size_t ring_cap, ring_off;
  int64_t max_batch;
  cudaStream_t copy_stream; /* weight mirror copies: never part of a recorded step */
  int exact;                /* cuda_backend_set_exact: f32 inputs and arithmetic everywhere */
  int mv_variant;           /* cuda_backend_set_matvec_variant (CUDA_MV_*) */
  int moe_variant;          /* cuda_backend_set_moe_variant (CUDA_MOE_*) */
  int attn_variant;         /* cuda_backend_set_attn_variant (CUDA_ATTN_*) */
  int flash_variant;        /* cuda_backend_set_flash_variant (CUDA_FLASH_*) */
  int gemm_variant;         /* cuda_backend_set_gemm_variant (CUDA_GEMM_*) */
  int gdn_variant;          /* cuda_backend_set_gdn_variant (CUDA_GDN_*) */
  int gdn_scan_cols;        /* cuda_backend_set_gdn_scan_cols (0 auto, 16, 32) */
  size_t mv_smem;           /* int8 matvec shared-memory limit (cuda_matmul_setup) */
  int graphs;               /* decode steps (n <= graph_max_tok) replay as CUDA graphs */
  int decode_mmq;           /* tuning cuda_decode_mmq: cuda_mmq takes 9..CUDA_MMQ_MAX_TOK tokens */
  int graph_max_tok;        /* CUDA_GRAPH_MAX_TOK with decode_mmq, else MV_MAX_TOK (8) */
  int batch_inv;            /* tuning cuda_batch_invariant: per-token matmul results independent of n */
  int mmq_split;            /* tuning cuda_mmq_split_k: cuda_mmq cuts K into slices */
  int mmq_v2;               /* tuning cuda_mmq_v2: cuda_mmq's form 0..3 (cuda_mmq.cu; the same bits) */
  int mmq_bf16;             /* tuning cuda_mmq_bf16: Q4_K / Q6_K decode batches on bf16 tensor cores, 1 or 2 (cuda_mmq_bf.cu) */
  int recording;            /* the current step's launches go to the log (cuda_backend_step_begin) */
  int pdl, pdl_ok;          /* programmatic edges into cuda_launch_pdl kernels (cuda_backend_set_pdl); sm_90+ */
  cuda_node *log;           /* the step being recorded: nodes, kernel argument bytes, offsets */
  uint8_t *log_args;
  uint32_t *log_offs;
  int64_t log_n, log_cap, log_args_n, log_args_cap, log_offs_n, log_offs_cap;
  cuda_graph_ent gcache[CUDA_GRAPH_CACHE];
  int64_t gtick;
  int64_t graph_launches, graph_builds, graph_updates; /* updates: launches with changed arguments */
  double t_capture, t_update, t_gpu; /* cuda_backend_graph_times */
  double cap_t0;                     /* host clock at step begin (at the last piece launch) */
  cudaEvent_t ev0, ev1;              /* around the last replay; pending until read */
  int ev_pending;
  /* Early launch: once the step's log holds piece_at nodes it runs as a graph of its own and
   * recording goes on into an empty log, so the GPU starts on the step while the host records
   * the rest of it (which would otherwise leave the GPU idle for the whole recording, ~4% of a
   * 35B-A3B decode step). 0: one graph per step. Once per step. */
  int64_t piece_at;
  int piece_done;    /* this step's early piece is launched */
  int step_launched; /* a graph of this step is launched (its first launch is timed and counted) */
  void *act16;              /* bf16/f16 activations of a tensor-core GEMM (cuda_gemm.cu), grown on demand */
  size_t act16_bytes;
  void *moe_deq;            /* experts dequantized to bf16 for the cuBLAS MoE prefill, grown on demand */
  size_t moe_deq_bytes;
  size_t moe_deq_cap;       /* its limit (tuning key cuda_moe_deq_mb; default 2 GiB) */
  void *moe_host;           /* pinned host arrays of the cuBLAS MoE prefill (counts, shapes, pointers) */
  int moe_blas_grouped;     /* -1: cublasGemmGroupedBatchedEx refused these types; the per-expert loop */
  float *att_part;          /* split-K attention partials */
  size_t att_part_floats;
  float *gdn_scr;           /* chunked GDN scratch (W, U, P, gam), allocated at first use */
  void *topk_scr;           /* topk's key levels (cuda_sample.cu), allocated at creation */
  size_t topk_scr_bytes;
  cuda_pnorm pnorm;         /* a deferred one-row add_rmsnorm (cuda_pnorm); x NULL: none */
  int *pnorm_count;         /* device counter of the fused prologue's last-block election */
  int *route_count;         /* device counter of a routed group launch's last-block election */
  struct cuda_offload *offload; /* MoE expert offload (cuda_offload.cu); NULL: every expert mirrored */
  size_t free_at_create;    /* cudaMemGetInfo's free bytes when the backend was made (offload sizing) */
  int kv_quant;             /* tuning key cuda_kv_quant: quantized KV caches and the residual ring */
} cuda_impl;

/* Steps of up to graph_max_tok tokens are recorded and replayed as CUDA graphs: every op of
 * such a step stays on the device (matvec up to MV_MAX_TOK = 8 tokens, cuda_mmq up to
 * CUDA_MMQ_MAX_TOK when tuning cuda_decode_mmq is on), so a decode step of many sequences
 * is one graph launch; above it cuBLAS GEMMs (not recordable) end the recorded part. The MoE expert
 * FFN takes its decode kernels (cuda_moe_decode.cu) up to CUDA_MOE_DECODE_MAX_TOK tokens;
 * larger batches read expert ids back and end the recorded part of the step. */
#define CUDA_GRAPH_MAX_TOK 64
#define CUDA_MMQ_MAX_TOK 64
#define CUDA_MOE_DECODE_MAX_TOK 8

/* ---- MoE expert offload (cuda_offload.cu) ----
 * The expert FFN of a layer whose experts are offloaded: true when it took the call (or set
 * a sticky error), false when gate is not an offloaded layer's array (the caller goes on as
 * without offload). */
bool cuda_offload_moe_ffn(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                          const float *wts, int k, int n_experts, const ops_weight *gate, const ops_weight *up,
                          const ops_weight *down, int act, float *scratch);
/* At step end: a swap plan when one is due (copies ordered after the step's work). */
void cuda_offload_step_end(cuda_impl *ci);
void cuda_offload_free(cuda_impl *ci);

/* Launches the deferred add_rmsnorm (its own kernel) and clears it. */
void cuda_norm_flush(cuda_impl *ci);

/* The backend of an op. Every op starts here, so a deferred add_rmsnorm is launched before
 * any op that is not its fused consumer (cuda_norm_take) can read x or y. */
static inline cuda_impl *cuda_impl_of(ops_backend *be) {
  cuda_impl *ci = (cuda_impl *)be->impl;
  if (ci->pnorm.x) cuda_norm_flush(ci);
  return ci;
}

/* The deferred add_rmsnorm when x is its output and a one-token matvec may take it (then
 * cleared: the caller launches it, fused or by cuda_norm_flush); else none (zeroed), after
 * flushing one that is pending. Consumers call it before anything that may reach
 * cuda_impl_of. */
static inline cuda_pnorm cuda_norm_take(ops_backend *be, const float *x, int64_t n) {
  cuda_impl *ci = (cuda_impl *)be->impl;
  cuda_pnorm p = ci->pnorm;
  if (p.x && x == p.y && n == 1) {
    memset(&ci->pnorm, 0, sizeof ci->pnorm);
    return p;
  }
  if (p.x) cuda_norm_flush(ci);
  memset(&p, 0, sizeof p);
  return p;
}

/* Records the first failure (later ones are consequences); returns the code. */
int cuda_fail(cuda_impl *ci, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Checks a runtime result / the last launch; false (and sticky error) on failure. */
bool cuda_check(cuda_impl *ci, cudaError_t e, const char *what);
bool cuda_check_launch(cuda_impl *ci, const char *what);

/* ---- Launches ----
 * Every kernel launch, async copy and memset of an op goes through cuda_launch /
 * cuda_copy_async / cuda_memset_async. Outside a decode step they are queued on the stream.
 * Inside one (cuda_backend_step_begin .. step_end) they are appended to the step log
 * instead: step end finds a cached graph with the same nodes and relaunches it, updating in
 * place only the nodes whose arguments changed (none, for consecutive decode steps of the
 * same sequences: positions, token ids and pointer arrays live in device or ring memory at
 * fixed addresses), or builds a graph from the log. This replaces stream capture, whose
 * per-launch recording cost about 1 us per kernel on every step.
 * Work that cannot be recorded (cuBLAS, a copy to the host, a wait) calls cuda_flush first:
 * the recorded part runs as a graph and the rest of the step runs eagerly. */
bool cuda_log_kernel(cuda_impl *ci, const void *func, dim3 grid, dim3 block, size_t smem, int pdl, int nargs,
                     const void *const *args, const size_t *sizes, const size_t *aligns);
void cuda_flush(cuda_impl *ci);

/* T, not deduced from the arguments: parameters convert as they would in k<<<>>>(args). */
template <typename T> struct cuda_nodeduce { typedef T type; };

/* k<<<grid, block, smem, stream>>>(a...), or recorded into the step log; `what` names the
 * launch in error messages. */
template <typename... P>
static inline void cuda_launch_as(cuda_impl *ci, int pdl, const char *what, void (*k)(P...), dim3 grid, dim3 block,
                                  size_t smem, typename cuda_nodeduce<P>::type... a) {
  if (ci->err) return;
  if (ci->recording) {
    const void *args[] = {(const void *)&a..., NULL};
    const size_t sizes[] = {sizeof(P)..., 0};
    const size_t aligns[] = {alignof(P)..., 1};
    cuda_log_kernel(ci, (const void *)k, grid, block, smem, pdl, (int)sizeof...(P), args, sizes, aligns);
    return;
  }
  k<<<grid, block, smem, ci->stream>>>(a...);
  cuda_check_launch(ci, what);
}
template <typename... P>
static inline void cuda_launch(cuda_impl *ci, const char *what, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                               typename cuda_nodeduce<P>::type... a) {
  cuda_launch_as(ci, 0, what, k, grid, block, smem, a...);
}
/* Programmatic dependent launch (Hopper): in a recorded step the kernel may be launched
 * while the kernel before it still runs, hiding the launch gap (~2 us per kernel in a
 * graph on the H200). Only for kernels that call cuda_pdl_enter() (cuda_math.cuh) before
 * their first access to memory an earlier op writes, and before any global write (weights,
 * which nothing writes, may be read before). Eager launches are ordinary. */
template <typename... P>
static inline void cuda_launch_pdl(cuda_impl *ci, const char *what, void (*k)(P...), dim3 grid, dim3 block,
                                   size_t smem, typename cuda_nodeduce<P>::type... a) {
  cuda_launch_as(ci, 1, what, k, grid, block, smem, a...);
}
/* cudaMemcpyAsync on the stream (kind: host-to-device from pinned memory, or
 * device-to-device; a copy to the host is not recordable: cuda_flush first), or recorded. */
void cuda_copy_async(cuda_impl *ci, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *what);
/* cudaMemsetAsync(p, 0, bytes) on the stream, or recorded. */
void cuda_memset_async(cuda_impl *ci, void *p, size_t bytes, const char *what);

/* Device address for a host buffer of `bytes` (the model's weights and vectors): the
 * mirror, made on first use; a device pointer is returned as is. NULL on failure (sticky
 * error set) or when host is NULL. */
const void *cuda_mirror(ops_backend *be, const void *host, size_t bytes);
/* Device data derived from model data (e.g. a table of device pointers to a layer's
 * expert weights), kept like a mirror under `key`, a host address owned by the model that is
 * not itself mirrored: find returns it or NULL; keyed copies src's bytes on first use (src
 * may be a temporary) and returns the existing copy afterwards. Freed with the mirrors. */
const void *cuda_mirror_find(ops_backend *be, const void *key);
const void *cuda_mirror_keyed(ops_backend *be, const void *key, const void *src, size_t bytes);
/* Reserves `bytes` of the pinned ring: *h (host, write now) and its device twin *d. The
 * caller queues the copy. Never waits while a step is being recorded. */
bool cuda_ring_reserve(ops_backend *be, size_t bytes, char **h, char **d);
/* Copies `bytes` of host data through the pinned ring to device memory valid for work
 * queued on the stream after this call. NULL on failure. */
void *cuda_ring_put(ops_backend *be, const void *host, size_t bytes);

/* Int8 tensor-core product for decode batches of up to CUDA_MMQ_MAX_TOK tokens
 * (cuda_mmq.cu): every weight read once per call. True when it took the product (or set a
 * sticky error), false when the weight's type or alignment is not one it reads, in exact
 * mode or the f32-activation matvec variant, with tuning cuda_decode_mmq off, or above
 * its token range. Recordable into a step graph (no cuBLAS, no host wait). */
bool cuda_mmq(cuda_impl *ci, float *y, const float *x, int64_t n, const ops_weight *w, const uint8_t *W, int64_t rb);
/* The split-K second pass of the decode GEMMs (cuda_mmq.cu, cuda_mmq_bf.cu): y[i] = the S partial
 * planes part[z * stride + i] added in slice order, i < count. Recordable. */
void cuda_mmq_reduce(cuda_impl *ci, float *y, const float *part, int64_t count, int64_t stride, int S);
/* The bf16 tensor-core product for the same decode batches (cuda_mmq_bf.cu), Q4_K and Q6_K
 * weights with their scales decoded in registers: bf16 activations and weights, f32 sums.
 * True when it took the product (or set a sticky error), false unless tuning cuda_mmq_bf16
 * and cuda_decode_mmq are on, in default numerics (not exact, not batch-invariant, not the
 * f32-activation variant), 1..CUDA_MMQ_MAX_TOK tokens, a type and alignment it reads and
 * scratch room for the bf16 activations. Recordable into a step graph. */
bool cuda_mmq_bf16(cuda_impl *ci, float *y, const float *x, int64_t n, const ops_weight *w, const uint8_t *W,
                   int64_t rb);

/* Tensor-core GEMM for batches above the matvec range (cuda_gemm.cu): true when it took
 * the product (or set a sticky error trying), false when the f32 path must (exact mode, f32
 * weights, unsupported shape). W: the weight's device copy, rb its row bytes. */
bool cuda_gemm_tc(ops_backend *be, float *y, const float *x, int64_t n, const ops_weight *w, const uint8_t *W,
                  int64_t rb);
/* Sets the int8 decode matvec kernels' shared-memory limit to the device's opt-in maximum
 * and returns it (48 KB, the default, when that fails). Called once at backend creation:
 * the attribute is not changed while a stream is being captured. */
size_t cuda_matmul_setup(void);

/* RMSNorm of rows of d (cuda_elem.cu): y = x / rms(x) * (w | 1 + w | 1); with r != NULL first
 * x += r (stored). Rows of d % 4 == 0, d <= 16384 and 16-byte aligned pointers are held in
 * registers (all loads before the reduction); other rows take a strided kernel. y may be x
 * only when r is NULL. Shared by rmsnorm and add_rmsnorm. */
void cuda_rmsnorm_rows(cuda_impl *ci, float *x, const float *r, float *y, const float *w, int64_t rows, int d, float eps,
                       int one_plus);

/* Launchers (one per op; signatures as ops.h). */
void cuda_op_matmul(ops_backend *be, float *y, const float *x, int64_t n, const ops_weight *w, const float *bias);
void cuda_op_act_matmul(ops_backend *be, float *y, float *h, const float *gate, const float *up, int64_t n, int64_t gs,
                        int64_t us, int act, const ops_weight *w);
void cuda_op_act_matmul_gated_add(ops_backend *be, float *y, float *tmp, float *h, const float *gate, const float *up,
                                  int64_t n, int64_t gs, int64_t us, int act, const float *g, int64_t g_stride,
                                  const ops_weight *w);
void cuda_op_matmul_group(ops_backend *be, int count, float *const *ys, const float *x, int64_t n,
                          const ops_weight *const *ws, const float *const *biases);
void cuda_op_matmul_group_route(ops_backend *be, int count, float *const *ys, const float *x, int64_t n,
                                const ops_weight *const *ws, const float *const *biases, int route, int32_t *idx,
                                float *wts, int k, int renorm, const float *per_expert, int shared);
void cuda_op_embed(ops_backend *be, float *out, const ops_weight *table, const int32_t *ids, int64_t n,
                   float scale);
void cuda_op_rmsnorm(ops_backend *be, float *y, const float *x, const float *w, int64_t rows, int d, float eps,
                     int one_plus);
void cuda_op_rope(ops_backend *be, float *x, int64_t n, int n_heads, int head_dim, int64_t stride, int rot,
                  const float *inv_freq, const int32_t *pos, int interleaved);
void cuda_op_attention(ops_backend *be, float *out, const float *q, const ops_attn_args *a);
void cuda_op_act_mul(ops_backend *be, float *y, const float *gate, const float *up, int64_t n, int d,
                     int64_t gate_stride, int64_t up_stride, int act);
void cuda_op_conv1d_silu(ops_backend *be, float *y, const float *x, int64_t n, int ch, const float *w, int kw,
                         float *state);
void cuda_op_gdn_chunked(ops_backend *be, const ops_gdn_args *a);
void cuda_op_gdn_recurrent(ops_backend *be, const ops_gdn_args *a);
/* cuda_gdn_chunked.cu: queues the chunk-64 form and returns true, or returns false (nothing
 * queued) when the recurrent kernel should run instead (see the file's contract). */
bool cuda_gdn_chunked_launch(ops_backend *be, const ops_gdn_args *a);
void cuda_op_gdn_gates(ops_backend *be, float *beta, float *g, const float *b, int64_t b_stride, const float *a,
                       int64_t a_stride, const float *a_log, const float *dt_bias, int64_t n, int h);
void cuda_op_l2norm(ops_backend *be, float *x, int64_t rows, int d, float eps, float scale);
void cuda_op_rmsnorm_gated(ops_backend *be, float *y, const float *x, const float *z, const float *w,
                           int64_t rows, int d, float eps);
void cuda_op_add(ops_backend *be, float *y, const float *x, int64_t n);
void cuda_op_gdn_step(ops_backend *be, const ops_gdn_step_args *a);
void cuda_op_norm_rope(ops_backend *be, float *y, const float *x, int64_t n, int n_heads, int head_dim,
                       int64_t x_stride, int64_t x_head_stride, const float *w, float eps, int one_plus, int rot,
                       const float *inv_freq, const int32_t *pos, int interleaved);
void cuda_op_add_rmsnorm(ops_backend *be, float *x, const float *r, float *y, const float *w, int64_t rows, int d,
                         float eps, int one_plus);
void cuda_op_scale(ops_backend *be, float *y, float s, int64_t n);
void cuda_op_mul_sigmoid(ops_backend *be, float *y, const float *g, int64_t rows, int d, int64_t g_stride,
                         int g_bcast);
void cuda_op_copy_rows(ops_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                       int64_t rows, int d);
void cuda_op_scatter_rows(ops_backend *be, float *const *dst, const float *src, int64_t rows, int d);
/* cuda_kv.cu: KV-cache writes in any ops_kv_type, the bytes cpu_kv_store writes. */
void cuda_op_kv_store(ops_backend *be, void *const *dst, const float *src, int64_t rows, int n_heads, int head_dim,
                      int kv_type);
void cuda_op_softcap(ops_backend *be, float *y, int64_t n, float cap);
void cuda_op_moe_ffn(ops_backend *be, float *out, const float *x, int64_t n, int hidden, const int32_t *idx,
                     const float *wts, int k, int n_experts, const ops_weight *gate, const ops_weight *up,
                     const ops_weight *down, int act, float *scratch);
void cuda_op_moe_route(ops_backend *be, int32_t *idx, float *wts, const float *logits, int64_t n, int n_experts,
                       int k, int renorm, const float *per_expert);
/* cuda_op_moe_route with a shared-expert slot: sh (device, NULL: none) holds one gate logit
 * per token; idx/wts rows are then k + 1 long, slot k = (n_experts, sigmoid(sh[t])). */
void cuda_moe_route_shared(ops_backend *be, int32_t *idx, float *wts, const float *logits, int64_t n, int n_experts,
                           int k, int renorm, const float *per_expert, const float *sh);
void cuda_op_topk(ops_backend *be, int32_t *idx, float *val, double *stats, const float *logits, int64_t rows,
                  int64_t vocab, int k, float temp);
void cuda_op_sample_tail(ops_backend *be, ops_tail_out *out, const float *logits, int64_t vocab,
                         const ops_tail_req *req, int n);
void cuda_op_mask_rows(ops_backend *be, float *logits, int64_t vocab, const int32_t *rows, const uint64_t *bits,
                       int64_t n);
/* cuda_encoder.cu: sets the encoder and waveform decoder ops of ops.h (layer_norm .. im2col_3x3s2). */
void cuda_encoder_ops_install(ops_backend *be);
/* cuda_comm.cu: sets ops.h comm_* (NCCL all-reduce) when the build has NCCL, else nothing. */
void cuda_comm_install(ops_backend *be);

/* Grid size for a 1-D elementwise launch of n items with `threads` per block. */
/* Whether the tensor-core GEMMs on weights of type t (cuda_gemm.cu, the MoE grouped GEMMs)
 * multiply split activations (hi + lo: 16 significant bits, two products) or activations
 * rounded once to bf16 (one product). By default (CUDA_GEMM_BF16) only bf16
 * weights take the split: they are exact, so the activations' rounding would be the
 * product's only error (the fixtures' logits moved past 5e-3 without it). A quantized
 * weight is itself rounded to bf16 when its tiles are dequantized (2^-9 relative) on top of
 * its format's own error (Q4_K: a 4-bit grid per 32 elements), so rounding the activations
 * the same way adds an error of the size already there, for half the tensor-core work
 * (llama.cpp goes further: 8-bit activations per 32-element block). */
static inline bool cuda_gemm_split(const cuda_impl *ci, int t) {
  /* --dtype bf16 (CUDA_GEMM_BF16_SINGLE) and the test hook CUDA_GEMM_BF16_SPLIT */
  if (ci->gemm_variant == CUDA_GEMM_BF16_SINGLE) return false;
  if (ci->gemm_variant == CUDA_GEMM_BF16_SPLIT) return true;
  return t == ANNA_DTYPE_BF16;
}

static inline unsigned cuda_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 1 << 30) b = 1 << 30;
  return (unsigned)b;
}

#endif
