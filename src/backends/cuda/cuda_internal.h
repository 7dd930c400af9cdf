/* cuda_internal.h: shared between the CUDA backend's .cu files; not a public interface.
 * Each op family's file exports host launchers only (cuda_op_*); kernels stay static. */
#ifndef ANNA_BACKENDS_CUDA_INTERNAL_H
#define ANNA_BACKENDS_CUDA_INTERNAL_H

#include "backends/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdint.h>

typedef struct cuda_mirror_ent {
  const void *host;
  void *dev;
  size_t bytes;
} cuda_mirror_ent;

typedef struct cuda_impl {
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  int err;          /* sticky: first ANNA_E* code, 0 while healthy */
  char msg[256];
  cuda_mirror_ent *map; /* open addressing on the host address */
  size_t map_cap, map_n;
  float *deq;       /* weight tiles dequantized to f32 for GEMM */
  size_t deq_floats;
  char *ring_h, *ring_d; /* pinned host ring and its device twin */
  size_t ring_cap, ring_off;
  int64_t max_batch;
  cudaStream_t copy_stream; /* weight mirror copies: never part of a captured step */
  int exact;                /* cuda_backend_set_exact: f32 inputs and arithmetic everywhere */
  int mv_variant;           /* cuda_backend_set_matvec_variant (CUDA_MV_*) */
  size_t mv_smem;           /* int8 matvec shared-memory limit (cuda_matmul_setup) */
  int graphs;               /* decode steps (n <= CUDA_GRAPH_MAX_TOK) replay as CUDA graphs */
  int capturing;            /* the stream is being captured for the current step */
  cudaGraphExec_t gexec;    /* last step's executable graph, updated in place when it fits */
  int64_t graph_launches, graph_builds;
  double t_capture, t_update, t_gpu; /* cuda_backend_graph_times */
  double cap_t0;                     /* host clock at begin capture */
  cudaEvent_t ev0, ev1;              /* around the last replay; pending until read */
  int ev_pending;
  void *act16;              /* bf16/f16 activations of a tensor-core GEMM (cuda_gemm.cu), grown on demand */
  size_t act16_bytes;
  float *att_part;          /* split-K attention partials */
  size_t att_part_floats;
  float *gdn_scr;           /* chunked GDN scratch (W, U, P, gam), allocated at first use */
} cuda_impl;

#define CUDA_GRAPH_MAX_TOK 8

static inline cuda_impl *cuda_impl_of(ops_backend *be) {
  return (cuda_impl *)be->impl;
}

/* Records the first failure (later ones are consequences); returns the code. */
int cuda_fail(cuda_impl *ci, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Checks a runtime result / the last launch; false (and sticky error) on failure. */
bool cuda_check(cuda_impl *ci, cudaError_t e, const char *what);
bool cuda_check_launch(cuda_impl *ci, const char *what);

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
 * caller queues the copy. Never waits while a step is being captured. */
bool cuda_ring_reserve(ops_backend *be, size_t bytes, char **h, char **d);
/* Copies `bytes` of host data through the pinned ring to device memory valid for work
 * queued on the stream after this call. NULL on failure. */
void *cuda_ring_put(ops_backend *be, const void *host, size_t bytes);

/* Tensor-core GEMM for batches above the matvec range (cuda_gemm.cu): true when it took
 * the product (or set a sticky error trying), false when the f32 path must (exact mode, f32
 * weights, unsupported shape). W: the weight's device copy, rb its row bytes. */
bool cuda_gemm_tc(ops_backend *be, float *y, const float *x, int64_t n, const ops_weight *w, const uint8_t *W,
                  int64_t rb);

/* Sets the int8 decode matvec kernels' shared-memory limit to the device's opt-in maximum
 * and returns it (48 KB, the default, when that fails). Called once at backend creation:
 * the attribute is not changed while a stream is being captured. */
size_t cuda_matmul_setup(void);

/* Launchers (one per op; signatures as ops.h). */
void cuda_op_matmul(ops_backend *be, float *y, const float *x, int64_t n, const ops_weight *w, const float *bias);
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
void cuda_op_softcap(ops_backend *be, float *y, int64_t n, float cap);
void cuda_op_moe_ffn(ops_backend *be, float *out, const float *x, int64_t n, int hidden, const int32_t *idx,
                     const float *wts, int k, int n_experts, const ops_weight *gate, const ops_weight *up,
                     const ops_weight *down, int act, float *scratch);
void cuda_op_moe_route(ops_backend *be, int32_t *idx, float *wts, const float *logits, int64_t n, int n_experts,
                       int k, int renorm, const float *per_expert);

/* Grid size for a 1-D elementwise launch of n items with `threads` per block. */
static inline unsigned cuda_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 1 << 30) b = 1 << 30;
  return (unsigned)b;
}

#endif
