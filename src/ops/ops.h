/* ops.h: the op interface the model code is written against.
 *
 * A backend is a table of functions over its own memory (host memory for the CPU backend,
 * device memory for CUDA). The model code (src/model/forward.c) calls only these; every
 * backend implements every op, and each op of each backend is tested against the CPU
 * reference (tests/engine/test_ops.c). A NULL entry means the backend lacks the op; the
 * model refuses to run on it rather than silently falling back.
 *
 * Conventions: activations are f32, row-major; `n` is the number of tokens in the batch.
 * Activations, KV caches and recurrent state live in backend memory (`alloc`); token ids,
 * positions and index arrays passed to ops are backend memory too, except the pointer
 * arrays of ops_attn_args (host arrays of backend pointers). Weights (ops_weight) and the
 * model's small f32 vectors are host memory owned by the model (mmap'd file or load-time
 * conversions): a device backend mirrors them, keyed by address, on first use. Output
 * buffers never alias inputs unless an op says "in place". Ops never allocate: scratch
 * comes from the backend's arena sized at context creation.
 */
#ifndef ANNA_OPS_OPS_H
#define ANNA_OPS_OPS_H

#include <stddef.h>
#include <stdint.h>

/* A weight matrix W [rows, cols] (y = W x): `data` holds rows of dtype_row_bytes(type,cols)
 * bytes each. Borrowed from the model (mmap'd file or device copy). */
typedef struct ops_weight {
  int type; /* anna_dtype */
  const void *data;
  int64_t rows, cols;
} ops_weight;

/* KV-cache element formats. Each position row holds n_kv_heads head records of head_dim
 * values; ops_kv_head_bytes gives a record's size. F32 is exact; F16 is IEEE half (llama.cpp's
 * default cache type). Q8/Q4 are llama.cpp's Q8_0/Q4_0 blocks of 32. TQ<b> is TurboQuant: the
 * head vector is rotated by a random-sign Walsh-Hadamard transform (orthonormal, head_dim a
 * power of two), then each coordinate is quantized with the b-bit Lloyd-Max quantizer of a
 * unit Gaussian, scaled by |x| / sqrt(head_dim) (one f32 per record). Attention runs in the
 * rotated space (q is rotated once; the V sum is rotated back once), so nothing is
 * dequantized to a copy. F16 sits next to F32 so that "type >= OPS_KV_TQ2" keeps meaning
 * "rotated". */
enum ops_kv_type { OPS_KV_F32 = 0, OPS_KV_F16, OPS_KV_Q8, OPS_KV_Q4, OPS_KV_TQ2, OPS_KV_TQ3, OPS_KV_TQ4 };

static inline int64_t ops_kv_head_bytes(int type, int d) {
  switch (type) {
  case OPS_KV_F16: return (int64_t)d * 2;
  case OPS_KV_Q8: return (int64_t)d / 32 * 34;
  case OPS_KV_Q4: return (int64_t)d / 32 * 18;
  case OPS_KV_TQ2: return 4 + (int64_t)d * 2 / 8;
  case OPS_KV_TQ3: return 4 + ((int64_t)d * 3 + 7) / 8;
  case OPS_KV_TQ4: return 4 + (int64_t)d * 4 / 8;
  default: return (int64_t)d * 4;
  }
}

/* Attention batch description over a paged KV cache. Token i (of n) belongs to a sequence
 * whose keys/values live in fixed-size blocks of block_len positions: position p of that
 * sequence is row (p & (block_len-1)) of block k_blocks[i][p / block_len] (rows of
 * kv_row_bytes bytes, each n_kv_heads records in kv_type format). Tokens may come from
 * different sequences; tokens of one sequence share one table. */
typedef struct ops_attn_args {
  int64_t n;
  int n_heads, n_kv_heads, head_dim, v_dim;
  int kv_type;              /* ops_kv_type of the blocks (F32, F16, Q8, Q4, TQ2..4) */
  int64_t kv_row_bytes;     /* bytes of one position (n_kv_heads records of kv_type) */
  int block_len;            /* positions per KV block, a power of two (>= 16) */
  float scale;
  int window;               /* 0: full causal; else key p visible when pos - p < window */
  float softcap;            /* 0: none; else scores = softcap * tanh(scores / softcap) */
  const int32_t *pos;       /* [n] query positions */
  /* [n] block table of token i's sequence (in backend memory): position p of that
   * sequence is row (p & (block_len-1)) of block k_blocks[i][p / block_len]. */
  const void *const *const *k_blocks;
  const void *const *const *v_blocks;
  /* --kv-cache-residual-len: when residual_len > 0 (quantized caches only), keys/values at
   * positions p > pos[i] - residual_len are read in f32 from a per-sequence ring instead of the
   * blocks: k_ring[i] + (p % ring_len) * n_kv_heads * head_dim floats (ring_len >= residual_len +
   * the batch size, so those rows are always present). NULL / 0 when unused. */
  int residual_len, ring_len;
  const float *const *k_ring;
  const float *const *v_ring;
  /* Host hint: 1 + the largest position in pos (0: unknown). A backend may size its work
   * for it (the CUDA decode kernels split the keys by it); results never depend on it. */
  int32_t keys_hint;
} ops_attn_args;

/* Gated DeltaNet run over consecutive tokens of ONE sequence. q, k: [n, hk, dk] already
 * l2-normalised (q also scaled by 1/sqrt(dk)); v: [n, hv, dv]; g: [n, hv] log-decay;
 * beta: [n, hv]; state: [hv, dk, dv] in/out; out: [n, hv, dv]. V-head h reads k-head
 * h / (hv / hk) (grouped, HF order) or h % hk (v_tiled: llama.cpp's GGUF order). */
typedef struct ops_gdn_args {
  int64_t n;
  int hk, hv, dk, dv;
  int v_tiled;
  const float *q, *k, *v, *g, *beta;
  float *state;
  float *out;
} ops_gdn_args;

/* One fused Gated DeltaNet decode step (ops_backend.gdn_step) for n consecutive tokens of
 * ONE sequence; the same math as this sequence of ops (and that is the CPU reference):
 *   conv1d_silu over the cd = 2*hk*dk + hv*dv projection channels (q | k | v) with conv_w,
 *   conv_state; l2norm of q (scale 1/sqrt(dk)) and k (scale 1), eps 1e-6; gdn_gates from
 *   b, a, a_log, dt_bias; the recurrent gated delta rule on state; then
 *   y = rmsnorm_gated(out, z, norm_w, eps) per v-head row of dv.
 * Row strides are implicit: qkv [n, cd], z and y [n, hv*dv], b and a [n, hv]. conv_w
 * [cd, kw], a_log and dt_bias [hv] and norm_w [dv] are model vectors (host memory, mirrored
 * like every weight); conv_state [cd, kw-1] and state [hv, dk, dv] are updated in place.
 * y aliases no input. work holds ops_gdn_step_work_floats(n, ...) floats of scratch (a
 * backend with one fused kernel leaves it alone). Meant for short runs (decode, n < 8).
 * Batched (n_runs > 0): the same step for up to OPS_GDN_STEP_MAX_RUNS runs at once (a decode
 * batch of several sequences, one op instead of one per sequence). runs[i] names rows
 * [start, start + n) of qkv, z, b, a and y (the pointers above are then row 0 of the batch)
 * and that run's own conv_state and state; the args' n, conv_state and state are ignored.
 * Runs' row ranges are disjoint and no two runs share a conv_state or state (each is read and
 * written once: backends run the runs concurrently); the result is exactly that of one call
 * per run in order (CPU: bit for bit). work holds ops_gdn_step_work_floats(m, ...) floats, m
 * the largest run's n. runs is host memory read during the call only. n_runs = 0 is the
 * single-run form above, so callers that set neither field keep it. */
#define OPS_GDN_STEP_MAX_RUNS 64
typedef struct ops_gdn_step_run {
  int64_t start, n;
  float *conv_state, *state;
} ops_gdn_step_run;

typedef struct ops_gdn_step_args {
  int64_t n;
  int hk, hv, dk, dv, kw;
  int v_tiled; /* as ops_gdn_args */
  float eps;   /* of the output RMSNorm */
  int n_runs;  /* 0: one run (n, conv_state, state); else runs[0 .. n_runs) (beside eps: no padding) */
  const float *qkv, *z, *b, *a;
  const float *conv_w, *a_log, *dt_bias, *norm_w;
  float *conv_state, *state;
  float *y;
  float *work;
  const ops_gdn_step_run *runs; /* [n_runs], n_runs <= OPS_GDN_STEP_MAX_RUNS */
} ops_gdn_step_args;

static inline int64_t ops_gdn_step_work_floats(int64_t n, int hk, int hv, int dk, int dv) {
  return n * (2 * (int64_t)hk * dk + (int64_t)hv * dv + 2 * (int64_t)hv);
}

/* Bidirectional attention over packed segments (ops_backend.attention_seg; vision encoders):
 * the n tokens are cut into n_seg segments [seg[i], seg[i+1]) and every query attends to every
 * key of its own segment and to nothing else (no mask inside, no cache, no positions).
 * q, k, v: rows of n_heads * head_dim floats at row strides q_stride, k_stride, v_stride (views
 * into one packed qkv buffer are fine); out [n, n_heads * head_dim] contiguous, aliasing none
 * of them: out = softmax(scale q k^T) v per head. seg: host memory read during the call only,
 * n_seg + 1 increasing offsets from seg[0] = 0 to seg[n_seg] = n, no empty segment.
 * head_dim <= OPS_SEG_ATTN_MAX_DIM. */
#define OPS_SEG_ATTN_MAX_DIM 256
typedef struct ops_seg_attn_args {
  int64_t n;
  int n_heads, head_dim;
  float scale;
  const float *q, *k, *v;
  int64_t q_stride, k_stride, v_stride;
  int n_seg;
  const int64_t *seg;
} ops_seg_attn_args;

/* Activation of gated FFNs (act_mul, act_matmul, moe_ffn's `act`): the model config names
 * one per model (model_config.act); backends implement each. */
enum act_kind { ACT_KIND_SILU = 0, ACT_KIND_GELU_TANH };

/* Most layers a model shape describes (model/config.h's CONFIG_MAX_LAYERS must not exceed it). */
#define OPS_MAX_LAYERS 256

/* What a backend needs to know about the model to size its own scratch at creation (the
 * backend owns its fusions and kernels, so only it knows their scratch needs): filled by
 * model_shape_get (model/model.h), read by a backend's create (backends/registry.h). */
typedef struct ops_layer_shape {
  int n_kv_heads, head_dim;
  /* MoE layers: the expert arrays (n_exp weights each; up NULL when gate is fused) exactly
   * as the forward pass hands them to moe_ffn on a backend with matmul_group_route (the
   * E + 1 arrays with a linked shared expert), so a backend that offloads experts knows
   * them before the first token. Borrowed from the model; NULL / 0 on other layers. */
  const ops_weight *exp_gate, *exp_up, *exp_down;
  int n_exp;
  int64_t weight_bytes; /* the layer's matrices, routed experts included (placement reports) */
} ops_layer_shape;
typedef struct ops_model_shape {
  int64_t max_cols;   /* widest weight row (columns) of any matmul */
  int n_ctx;          /* positions per sequence */
  int vocab;
  int n_heads;        /* query heads (every attention layer) */
  int gdn_dk, gdn_dv; /* Gated DeltaNet head dims (0: no GDN layers) */
  int n_layers;
  /* Bytes of the matrices other than the routed experts (a tied lm_head counted once): what
   * a backend that offloads experts must still hold. */
  int64_t dense_weight_bytes;
  /* Placement reports (pipeline stages): the matrices the first stage reads before any layer
   * (token embedding, Gemma4's per-layer input tables) and those the last reads after them
   * (lm_head, counted again when it is the tied embedding: that stage mirrors it too). */
  int64_t embed_weight_bytes, head_weight_bytes;
  /* A GGUF model: its file and the mapping the weights' data pointers point into (file
   * offset = data - weights_map), so a backend may read weight bytes with pread instead of
   * through the mapping (expert offload's file tier). NULL / 0 for folders. Borrowed. */
  const char *weights_file;
  const void *weights_map;
  int64_t weights_map_bytes;
  ops_layer_shape layers[OPS_MAX_LAYERS];
} ops_model_shape;

/* Decode-step statistics of a backend that records steps (CUDA graphs); zeros otherwise. */
typedef struct ops_step_stats {
  int64_t steps, builds, updates;      /* graph launches, new graphs, in-place updates */
  double capture_s, update_s, gpu_s;   /* host recording, host updating, device replay seconds */
} ops_step_stats;

/* Most weights one matmul_group call takes (GDN's four in-projections). */
#define OPS_GROUP_MAX 4

/* MoE expert offload counters (anna.h anna_offload_stats says what each means). */
typedef struct ops_offload_stats {
  int on, cache_per_layer, staging_slots;
  int64_t mirrored, routed, hits, swaps, bytes_mirror, bytes_file, device_bytes;
  const char *summary;
} ops_offload_stats;

/* One draw of the sample_tail op (see there), and its result: the kept mass and the token. */
typedef struct ops_tail_req {
  int64_t row;            /* the logits row */
  double z, sum, u;       /* softmax sum; the kept mass so far (sum mode); u > 0: the walk */
  float inv_t, mx, floor; /* 1 / temperature, row max / temperature, min-p floor (0: none) */
  int32_t nh;             /* head ids, <= OPS_TOPK_MAX */
  int32_t head[256];      /* (OPS_TOPK_MAX) */
} ops_tail_req;

typedef struct ops_tail_out {
  double sum;
  int32_t tok;
  int32_t pad_;
} ops_tail_out;

typedef struct ops_backend ops_backend;

struct ops_backend {
  const char *name;
  void *impl;

  /* ---- Lifecycle (the device side of the table). destroy is always set; the rest are
   * optional, NULL on a synchronous host backend (CPU). The caller (runtime/context.c) uses
   * only these, never a backend's own header. ---- */
  /* Frees the backend and everything it owns (its memory, streams, thread pool when it made
   * one). Not for a profiling wrapper (ops_profile_free). */
  void (*destroy)(ops_backend *be);
  /* Makes this backend's device current on the calling thread (a device backend whose
   * device is not the thread's default: "cuda:1", or pipeline stages on several devices).
   * Callers bind before a forward pass; memory entries bind themselves. NULL: nothing to do. */
  void (*bind)(ops_backend *be);
  /* Waits for queued work, then 0 or the first (sticky) device error with its message. */
  int (*error)(ops_backend *be, char *err, size_t errlen);
  /* Brackets one forward call of n_tokens tokens (a device may record it as a graph). */
  void (*step_begin)(ops_backend *be, int64_t n_tokens);
  void (*step_end)(ops_backend *be);
  /* Records decode steps as graphs (on) or runs them eagerly (off: profiling). */
  void (*set_graphs)(ops_backend *be, int on);
  /* Tensor parallelism's collective over backends of this kind (runtime/tp.h; NULL: none,
   * the host transport only). comm_create: a communicator over be[0..n), one per distinct
   * device (NULL, err set, when it cannot be made); comm_all_reduce: buf [count] in be's
   * memory becomes the sum over the ranks, in be's queue order (rank: be's index in the
   * create call; every rank calls it, each from its own thread); comm_free. */
  void *(*comm_create)(ops_backend *const *be, int n, char *err, size_t errlen);
  void (*comm_all_reduce)(ops_backend *be, void *comm, int rank, float *buf, int64_t count);
  void (*comm_free)(void *comm);
  /* Step statistics so far (ops_step_stats). */
  void (*step_stats)(ops_backend *be, ops_step_stats *st);
  /* The device's free and total memory in bytes (all processes' use counted), for sizing
   * the KV pool from a memory budget; 0 or a negative ANNA_E* code. NULL: cannot tell (CPU). */
  int (*mem_info)(ops_backend *be, int64_t *free_bytes, int64_t *total_bytes);
  /* MoE expert offload counters (ops_offload_stats); NULL: the backend never offloads. */
  void (*offload_stats)(ops_backend *be, ops_offload_stats *st);
  /* 1: weights are copied to the backend on first use, so the caller runs one throwaway
   * token at creation to keep that copy out of the first timed decode. */
  int warmup;
  /* KV-cache formats its attention reads: bit (1u << ops_kv_type) per type, 0 = every type;
   * residual_ring: 1 when it also attends the f32 ring of --kv-cache-residual-len. The context
   * refuses other combinations at creation, before anything is allocated or run. */
  uint32_t kv_types;
  int residual_ring;

  /* Backend memory: zero-filled; NULL when out of memory (an error, never an abort). */
  void *(*alloc)(ops_backend *be, size_t bytes);
  void (*free)(ops_backend *be, void *p);
  void (*memset0)(ops_backend *be, void *p, size_t bytes);
  /* Host <-> backend copies (synchronous). */
  void (*upload)(ops_backend *be, void *dst, const void *src, size_t bytes);
  void (*download)(ops_backend *be, void *dst, const void *src, size_t bytes);
  /* Pipeline stages: bytes from src (be's memory) to dst in the memory of `to`, another
   * instance of the same backend (same or another device), after be's queued work and
   * synchronous like download; `to`'s later ops see the bytes. Callers use it only when both
   * tables carry the same function. NULL: the caller stages through host memory
   * (download + upload). */
  void (*copy_to)(ops_backend *be, ops_backend *to, void *dst, const void *src, size_t bytes);
  /* Waits until every queued op has finished (device backends, for timing); NULL when
   * every op is synchronous (CPU). */
  void (*sync)(ops_backend *be);

  /* y[n, W.rows] = x[n, W.cols] W^T (+ bias[W.rows] when bias != NULL). */
  void (*matmul)(ops_backend *be, float *y, const float *x, int64_t n, const ops_weight *w,
                 const float *bias);
  /* Several matmuls of one input: for i < count, ys[i][n, ws[i]->rows] = x[n, cols] ws[i]^T
   * (+ biases[i][ws[i]->rows] when biases && biases[i]), each exactly as matmul computes it
   * (same result bits), where every ws[i]->cols == cols. 1 <= count <= OPS_GROUP_MAX; the ys
   * do not overlap each other or x. A device backend runs the group in fewer launches (the
   * decode projections that share an input). NULL: the model calls matmul per weight. */
  void (*matmul_group)(ops_backend *be, int count, float *const *ys, const float *x, int64_t n,
                       const ops_weight *const *ws, const float *const *biases);
  /* matmul_group, then moe_route(idx, wts, ys[route], n, ws[route]->rows, k, renorm,
   * per_expert) on entry route's output (a MoE router's logits), with the same result bits
   * as the two ops (a device backend routes inside the group's launch: one kernel fewer per
   * MoE decode layer). shared >= 0: entry shared is a one-row weight, a shared expert's gate
   * logit; each token then gets k + 1 slots (idx/wts rows of k + 1): its k routed experts as
   * above, then expert E = ws[route]->rows with weight sigmoid(ys[shared][t]), so moe_ffn
   * runs the shared expert as expert E of E + 1. NULL: the model calls the ops itself. */
  void (*matmul_group_route)(ops_backend *be, int count, float *const *ys, const float *x, int64_t n,
                             const ops_weight *const *ws, const float *const *biases, int route, int32_t *idx,
                             float *wts, int k, int renorm, const float *per_expert, int shared);
  /* y[n, W.rows] = (act(gate) * up) W^T: act_mul then matmul (FFN down projections). gate,
   * up: [n, W.cols] rows at strides gs, us; h [n, W.cols] receives act(gate) * up when the
   * backend forms it (unspecified when it folds it into the product); h may be gate. NULL:
   * the model calls act_mul and matmul. */
  void (*act_matmul)(ops_backend *be, float *y, float *h, const float *gate, const float *up, int64_t n, int64_t gs,
                     int64_t us, int act, const ops_weight *w);
  /* y[n, W.rows] += sigmoid(g[t * g_stride]) * ((act(gate) * up) W^T) for each token t (a
   * gated output added into a residual: the MoE shared expert): act_matmul into tmp, then
   * mul_sigmoid(tmp, g, n, W.rows, g_stride, one gate per row), then add(y, tmp), with the
   * same result bits. gate, up, gs, us, act, h as act_matmul; tmp [n, W.rows] and h
   * [n, W.cols] are scratch (unspecified after); y overlaps none of the others. NULL: the
   * model composes the three. */
  void (*act_matmul_gated_add)(ops_backend *be, float *y, float *tmp, float *h, const float *gate, const float *up,
                               int64_t n, int64_t gs, int64_t us, int act, const float *g, int64_t g_stride,
                               const ops_weight *w);
  /* Rows of table (any weight dtype) for ids, times scale: out[n, cols]. */
  void (*embed)(ops_backend *be, float *out, const ops_weight *table, const int32_t *ids, int64_t n,
                float scale);
  /* Per row of d: y = x / sqrt(mean(x^2) + eps) * (w | 1 + w | 1). w may be NULL (no weight).
   * rows = n * heads; in place allowed. */
  void (*rmsnorm)(ops_backend *be, float *y, const float *x, const float *w, int64_t rows, int d,
                  float eps, int one_plus);
  /* In place on x [n, n_heads, head_dim] (row stride `stride` floats per token): rotate
   * pairs (i, i + rot/2) (NeoX; interleaved: (2i, 2i+1)), i < rot/2, by pos * inv_freq[i]. */
  void (*rope)(ops_backend *be, float *x, int64_t n, int n_heads, int head_dim, int64_t stride,
               int rot, const float *inv_freq, const int32_t *pos, int interleaved);
  /* out[n, n_heads, v_dim] = softmax(scale q k^T [+softcap], causal/window) v. */
  void (*attention)(ops_backend *be, float *out, const float *q, const ops_attn_args *a);
  /* y = act(gate) * up elementwise over n*d (act: act_kind); y may alias gate. */
  void (*act_mul)(ops_backend *be, float *y, const float *gate, const float *up, int64_t n, int d,
                  int64_t gate_stride, int64_t up_stride, int act);
  /* Causal depthwise conv over one sequence's n tokens, then SiLU. x: [n, ch];
   * w: [ch, kw]; state: [ch, kw-1] (the previous kw-1 inputs, oldest first), updated. */
  void (*conv1d_silu)(ops_backend *be, float *y, const float *x, int64_t n, int ch, const float *w,
                      int kw, float *state);
  /* Gated delta rule, chunked (C = 64) form for prefill. */
  void (*gdn_chunked)(ops_backend *be, const ops_gdn_args *a);
  /* Gated delta rule, token by token (decode; also the reference for the chunked form). */
  void (*gdn_recurrent)(ops_backend *be, const ops_gdn_args *a);
  /* beta = sigmoid(b), g = -exp(a_log) * softplus(a + dt_bias); b, a, beta, g: [n, h]
   * with row strides b_stride / a_stride for b and a. */
  void (*gdn_gates)(ops_backend *be, float *beta, float *g, const float *b, int64_t b_stride,
                    const float *a, int64_t a_stride, const float *a_log, const float *dt_bias,
                    int64_t n, int h);
  /* Per row of d: x = x / sqrt(sum(x^2) + eps) * scale (in place). */
  void (*l2norm)(ops_backend *be, float *x, int64_t rows, int d, float eps, float scale);
  /* Per row of d: y = w * rmsnorm(x) * silu(z) (GDN output norm). */
  void (*rmsnorm_gated)(ops_backend *be, float *y, const float *x, const float *z, const float *w,
                        int64_t rows, int d, float eps);
  /* Fused decode step of a GDN mixer (see ops_gdn_step_args). NULL: the model composes it
   * from the ops above. */
  void (*gdn_step)(ops_backend *be, const ops_gdn_step_args *a);
  /* Residual add then RMSNorm, as add followed by rmsnorm: x[rows, d] += r; then per row
   * y = x / sqrt(mean(x^2) + eps) * (w | 1 + w | 1). y aliases neither x nor r. NULL: the
   * model calls add and rmsnorm. */
  void (*add_rmsnorm)(ops_backend *be, float *x, const float *r, float *y, const float *w, int64_t rows, int d,
                      float eps, int one_plus);
  /* Per-head RMSNorm then rotary embedding, as copy_rows + rmsnorm + rope: for t < n and
   * h < n_heads, the head_dim values at x + t * x_stride + h * x_head_stride are normalised
   * (w, eps, one_plus as rmsnorm; w not NULL), then rotated as rope does (rot, inv_freq,
   * pos, interleaved), into y[t, h, :] (contiguous [n, n_heads, head_dim]). y may be x when x
   * already has that layout (in place); otherwise they do not overlap. NULL: the model calls
   * the three ops. */
  void (*norm_rope)(ops_backend *be, float *y, const float *x, int64_t n, int n_heads, int head_dim,
                    int64_t x_stride, int64_t x_head_stride, const float *w, float eps, int one_plus, int rot,
                    const float *inv_freq, const int32_t *pos, int interleaved);
  /* y[i] += x[i], i < n. */
  void (*add)(ops_backend *be, float *y, const float *x, int64_t n);
  /* y[i] *= s. */
  void (*scale)(ops_backend *be, float *y, float s, int64_t n);
  /* y[r, i] *= sigmoid(g[r * g_stride + (g_bcast ? 0 : i)]) for r < rows, i < d (y row
   * stride d); g_bcast: one gate per row. */
  void (*mul_sigmoid)(ops_backend *be, float *y, const float *g, int64_t rows, int d, int64_t g_stride,
                      int g_bcast);
  /* Strided row copy: dst[r*dst_stride + :d] = src[r*src_stride + :d]. */
  void (*copy_rows)(ops_backend *be, float *dst, int64_t dst_stride, const float *src,
                    int64_t src_stride, int64_t rows, int d);
  /* Row r of src [rows, d] to dst[r] (a host array of backend pointers): KV-cache writes of
   * a batch whose tokens belong to different sequences and positions. */
  void (*scatter_rows)(ops_backend *be, float *const *dst, const float *src, int64_t rows, int d);
  /* KV-cache write in any ops_kv_type: row r of src ([rows, n_heads * head_dim] f32) is
   * encoded into dst[r] (host array of backend pointers). NULL: F32 only (scatter_rows). */
  void (*kv_store)(ops_backend *be, void *const *dst, const float *src, int64_t rows, int n_heads, int head_dim,
                   int kv_type);
  /* Byte copy within backend memory. */
  void (*copy)(ops_backend *be, void *dst, const void *src, size_t bytes);
  /* y = cap * tanh(y / cap). */
  void (*softcap)(ops_backend *be, float *y, int64_t n, float cap);
  /* Sparse MoE FFN: out[n, H] = sum_j wts[i, j] * down_e(act(gate_e x) * up_e x) over the k
   * experts e = idx[i, j] of token i. Experts are given as arrays of E weights (gate/up may
   * be one fused gate_up weight of 2I rows: then up[] is NULL); n_experts = E, the length
   * of those arrays. scratch must hold ops_moe_scratch_floats(n, k, H, I) floats. */
  void (*moe_ffn)(ops_backend *be, float *out, const float *x, int64_t n, int hidden,
                  const int32_t *idx, const float *wts, int k, int n_experts, const ops_weight *gate,
                  const ops_weight *up, const ops_weight *down, int act, float *scratch);
  /* Router: logits [n, E] -> top-k indices and weights. mode: 0 = softmax then top-k
   * (renormalised when renorm); weights additionally multiplied by per_expert[e] if given. */
  void (*moe_route)(ops_backend *be, int32_t *idx, float *wts, const float *logits, int64_t n,
                    int n_experts, int k, int renorm, const float *per_expert);
  /* Sampling candidates (on-device sampling: a few KB cross to the host instead of the logits).
   * Per row r of logits [rows, vocab]: idx/val[r * k + j], j < k, the k largest logits in
   * descending order, ties by lower index first (the host sampler's order); NaN counts as -inf
   * and -0 as +0 (val holds the value so normalised). stats[2r] = the row's largest logit and
   * stats[2r + 1] = the sum over the WHOLE row of ops_exp_nonpos(l * (1/temp) - max * (1/temp))
   * (temp <= 0: not computed, 0: greedy and top-k sampling do not need it), the softmax
   * denominator at that temperature (the CPU reference sums in vocabulary order exactly as the
   * sampler does; a device backend to its own rounding).
   * 1 <= k <= OPS_TOPK_MAX and k <= vocab. NULL: not offered (the caller downloads the logits). */
  void (*topk)(ops_backend *be, int32_t *idx, float *val, double *stats, const float *logits, int64_t rows,
               int64_t vocab, int k, float temp);
  /* The sampler's tail (anna_sampler_sample past its sorted head; runtime/sampler.c), for n
   * draws req[0, n) (backend memory) on rows of logits [rows][vocab], where the logits are, so
   * that no row need cross to the host. Draw i on row l = logits + req[i].row * vocab: its
   * tail is every token t not among req[i].head[0, nh) (ids distinct and in range), in
   * vocabulary order, with q_t = (float)(ops_exp_nonpos(l[t] * inv_t - mx) / z) kept where
   * q_t > 0 and q_t >= floor (floor 0: every q_t > 0). Two modes: u <= 0 (the kept mass, for
   * min-p's draw): out[i].sum = sum + the kept q_t added in vocabulary order, out[i].tok = -1;
   * u > 0 (the walk): out[i].tok = the first kept t at which u minus the kept q up to and
   * including t is <= 0, or the last kept t when u outlasts them, -1 when nothing is kept;
   * out[i].sum is then unspecified (the CPU op stops at the token). out: backend memory [n].
   * The CPU reference does the sampler's arithmetic in its order (bit-exact); a device adds
   * per chunk and scans the chunk sums in double, so a draw within rounding of a boundary
   * (about 1e-12 of the mass) may move to the neighbouring kept token. NULL: not offered (the
   * caller downloads the rows). */
  void (*sample_tail)(ops_backend *be, ops_tail_out *out, const float *logits, int64_t vocab, const ops_tail_req *req,
                      int n);
  /* For i < n: logits[rows[i] * vocab + t] = -inf wherever bit t of bits[i * words ..] is set
   * (words = (vocab + 63) / 64 uint64 per row, bit t % 64 of word t / 64: the engine's rejection
   * bitsets). rows, bits: backend memory; rows distinct. NULL: not offered. */
  void (*mask_rows)(ops_backend *be, float *logits, int64_t vocab, const int32_t *rows, const uint64_t *bits,
                    int64_t n);

  /* ---- Encoder ops (vision towers: model/vision_qwen35.c). NULL on a backend that has not
   * implemented them yet (CUDA today): the encoder kinds then refuse that backend. ---- */
  /* Per row of d: y = (x - mean) / sqrt(var + eps) * w + b (biased variance; w, b model
   * vectors, b may be NULL). rows = n; in place allowed. */
  void (*layer_norm)(ops_backend *be, float *y, const float *x, const float *w, const float *b, int64_t rows,
                     int d, float eps);
  /* In place over n values: y = gelu(y), the tanh approximation (gelu_pytorch_tanh) when
   * exact is 0, else x/2 (1 + erf(x / sqrt 2)) (nn.GELU()). */
  void (*gelu)(ops_backend *be, float *y, int64_t n, int exact);
  /* Bidirectional attention inside segments (ops_seg_attn_args). */
  void (*attention_seg)(ops_backend *be, float *out, const ops_seg_attn_args *a);
  /* Weighted gather: y[t, :] += sum_j<k wts[t*k + j] * table[ids[t*k + j], :] for t < n, the
   * k-term sum formed first (in j order), then added (an interpolated learned-position
   * table). table any plain dtype (F32, F16, BF16); ids and wts backend memory, every id
   * < table->rows (the caller checks). */
  void (*embed_bag)(ops_backend *be, float *y, const ops_weight *table, const int32_t *ids, const float *wts,
                    int64_t n, int k);
  /* ---- Waveform decoder ops (the Qwen3-TTS speech-tokenizer decoder, model/codec_qwen3_tts.c).
   * Activations are time-major, [rows, channels]. Causal convs read their left context from
   * the rows in front of the first output's own row: x holds ctx + n rows, ctx zero rows at a
   * stream's start and the previous piece's last inputs after (exact streaming). Weights are f32
   * host vectors repacked by the model at load. NULL: not offered (the codec refuses the
   * backend). ---- */
  /* Causal conv1d, ctx = (kw - 1) * dil: y[t, co] = bias[co] + sum_{k < kw} sum_ci
   * w[co, k, ci] x[t + k dil, ci] for t < n (x: [n + ctx, cin]). w: [cout, kw, cin] (PyTorch's
   * [cout, cin, kw] tap-major); bias [cout] or NULL. */
  void (*conv1d)(ops_backend *be, float *y, const float *x, int64_t n, int cin, int cout, const float *w, int kw,
                 int dil, const float *bias);
  /* Depthwise causal conv1d (groups = channels): y[t, c] = bias[c] + sum_k w[c, k] x[t + k dil, c]
   * (x: [n + (kw - 1) dil, ch]); w [ch, kw]; bias [ch] or NULL. */
  void (*conv1d_dw)(ops_backend *be, float *y, const float *x, int64_t n, int ch, const float *w, int kw, int dil,
                    const float *bias);
  /* Causal ConvTranspose1d of kernel m * stride with its last (m - 1) * stride outputs dropped
   * (the trailing overlap belongs to the next input frame): for j < n, p < stride,
   * y[j stride + p, co] = bias[co] + sum_{u < m} sum_ci w[p, co, u, ci] x[j + u, ci]; x: [n + m - 1,
   * cin] (m - 1 rows of left context), y: [n stride, cout]. w [stride, cout, m, cin] holds
   * PyTorch's W[ci, co, (m - 1 - u) stride + p]; bias [cout] or NULL. */
  void (*conv_transpose1d)(ops_backend *be, float *y, const float *x, int64_t n, int cin, int cout, const float *w,
                           int m, int stride, const float *bias);
  /* SnakeBeta per channel c of x [rows, ch]: y = x + inv_beta[c] * sin(x * alpha[c])^2 where the
   * model passes alpha = exp(log_alpha) and inv_beta = 1 / (exp(log_beta) + 1e-9). In place
   * allowed. */
  void (*snake_beta)(ops_backend *be, float *y, const float *x, int64_t rows, int ch, const float *alpha,
                     const float *inv_beta);
  /* Channel-scaled residual add: y[r, i] += s[i] * x[r, i] (layer scales, ConvNeXt gamma). */
  void (*add_scaled)(ops_backend *be, float *y, const float *x, const float *s, int64_t rows, int d);
  /* y[i] = min(max(y[i], lo), hi) in place (NaN stays NaN, as torch.clamp). */
  void (*clamp)(ops_backend *be, float *y, int64_t n, float lo, float hi);
  /* Patches of a 3x3 convolution with stride 2 and zero padding 1 (audio encoders'
   * conv2d fronts; the convolution is then matmul with the weight [co, c * 9]): x holds n_img
   * images [h, w, c] channel-last (a matmul's output rows are pixels); cols receives, for every
   * output pixel (img, oy < ceil(h/2), ox < ceil(w/2)) in that order, a row of c * 9 values
   * x[img, 2 oy + ky - 1, 2 ox + kx - 1, ci] ordered (ci, ky, kx), 0 outside the image
   * (PyTorch's Conv2d weight [co, ci, ky, kx] flattened). cols does not alias x. */
  void (*im2col_3x3s2)(ops_backend *be, float *cols, const float *x, int64_t n_img, int h, int w, int c);
};

/* Most candidates topk returns per row (ops_tail_req.head has as many). */
#define OPS_TOPK_MAX 256

/* First index of the largest value of x[0, n) and that value in *best: NaN never wins (a row
 * of NaN, or of -inf past the first: index 0, *best -inf). Sixteen running maxima keep the
 * scan free of a loop-carried dependency (vectorised), then a second scan finds where the
 * maximum sits: 115 us for a 248k vocabulary where a one-pass compare-and-index loop took
 * 890 us. Shared by the host sampler's greedy path and the CPU topk op. */
static inline int64_t ops_argmax_f32(const float *x, int64_t n, float *best) {
  float m[16];
  for (int j = 0; j < 16; j++) m[j] = -__builtin_inff();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
  float mx = -__builtin_inff();
  for (int j = 0; j < 16; j++) mx = m[j] > mx ? m[j] : mx;
  for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
  *best = mx;
  for (i = 0; i < n; i++)
    if (x[i] == mx) return i;
  return 0;
}

/* exp(x) for x <= 0 (softmax terms): x = k ln2 + r with |r| <= ln2/2, a degree-6 Taylor
 * polynomial (truncation <= 0.347^7/7! = 1.2e-7 relative), 2^k from the exponent bits;
 * exactly 0 below -87 (masked -inf logits keep probability 0). Branch-free: about a third of
 * expf's time per element in the sampler's vocabulary-wide loop. Shared by the sampler and
 * the CPU topk op so that sampling from candidates matches the full-row sampler bit for bit. */
static inline float ops_exp_nonpos(float x) {
  const int under = !(x >= -87.0f); /* also NaN */
  x = under ? -87.0f : x;
  const float k = __builtin_rintf(x * 1.44269504f);
  const float r = (x - k * 0.693145752f) - k * 1.42860677e-6f;
  float y = 1.0f / 720;
  y = y * r + 1.0f / 120;
  y = y * r + 1.0f / 24;
  y = y * r + 1.0f / 6;
  y = y * r + 0.5f;
  y = y * r + 1.0f;
  y = y * r + 1.0f;
  union {
    int32_t i;
    float f;
  } sc = {.i = ((int32_t)k + 127) << 23};
  return under ? 0.0f : y * sc.f;
}

/* Scratch floats moe_ffn needs for n tokens. */
static inline int64_t ops_moe_scratch_floats(int64_t n, int k, int hidden, int inter) {
  return n * k * (3 * (int64_t)inter + 2 * (int64_t)hidden) + 4 * n * k;
}

#endif
