/* cuda_moe.cu: router top-k on the device, and the sparse expert FFN.
 *
 * Decode batches (n <= CUDA_MOE_DECODE_MAX_TOK tokens) never leave the device, so MoE decode
 * steps can be captured as graphs: one kernel computes act(gate_e x) * up_e x for every
 * (token, slot) pair reading its expert's rows through a device table of per-expert
 * pointers (built once per layer, kept with the weight mirrors), a second computes
 * out = sum over slots of w * down_e h, each output row written once (no atomics, no
 * memset). Only the selected experts' rows are read. With exact mode off, experts of the
 * types with an int8 piece decoder (Q4_0, IQ4_NL, IQ4_XS, Q8_0, Q4_K-Q6_K, IQ2_XXS, IQ2_XS,
 * IQ2_S, IQ3_XXS, IQ3_S) take the dp4a kernels instead: each block quantizes its activations (x of its token, or h of
 * all k slots of its token) to int8 in shared memory exactly as the dense k_matvec_q8 does
 * (cuda_q8act.cuh), and its warps stream weight pieces (cuda_piece_load, the next ones in
 * flight while the current ones are decoded to int8 words and dotted). The f32 kernels stay
 * for exact mode, float experts and gate and up of different types; h between the two
 * launches is f32 either way, so each side picks its own.
 *
 * Larger batches (prefill; default numerics) run as grouped GEMMs, also entirely on the
 * device (no host sync, a fixed number of launches per layer):
 *   1. the (token, slot) pairs are sorted by expert: per-chunk histograms, one block that
 *      scans them (expert offsets, and a list of token tiles of BN pairs that never
 *      straddle two experts), and a stable placement (slot order = expert, then pair id:
 *      deterministic) with the inverse map pair -> slot;
 *   2. one launch for gate/up over (row tile, token tile): each block finds its expert in
 *      the tile list, dequantizes its weight rows tile by tile into shared memory as bf16
 *      and multiplies on tensor cores (WMMA, f32 accumulation) with the activations split
 *      into bf16 hi + lo (the two products of cuda_gemm.cu: 16 significant bits); gate and
 *      up rows of the same h columns sit in one block, so act(gate) * up is its epilogue,
 *      which writes h already split (hi, lo) in slot order;
 *   3. one launch for down the same way, writing y[slot] (f32);
 *   4. the combine out[t] = sum_j wts[t, j] * y[slot(t, j)], each output written once in a
 *      fixed order (no float atomics: the result does not depend on scheduling).
 * Blocks of a launch are an upper bound (sum_e ceil(cnt_e / BN) <= ceil(nk / BN) + E token
 * tiles); blocks past the device-side tile count exit at once. BN (16, 32 or 64 pairs) is
 * picked from the mean pairs per expert: small tiles waste less work on sparse experts,
 * large ones dequantize each weight tile fewer times.
 * From MOE_PIPE_PAIRS (32) pairs per expert on average, quantized experts are dequantized
 * to bf16 once per call (k_moe_deq_experts) and the same tiles run as k_moe_gemm_pipe, whose
 * operands come by cp.async in three stages instead of being decoded in the K loop (H200,
 * 35B-A3B layer: 64 pairs per expert 2417 -> 2101 us, 128 4059 -> 2884). From
 * MOE_CUBLAS_PAIRS (192), cuBLAS's grouped GEMM on the same buffer (the pair counts read
 * back, one sync per call; moe_ffn_cublas below) is as fast.
 * Exact mode (and weights this path does not take: f32/f16 experts, mixed types) keeps the
 * host-grouped path: the expert ids are read back (n * k int32, one sync) to group the
 * pairs, then per selected expert gather + matmuls (f32 SGEMM in exact mode) + scatter-add,
 * experts one after another on the stream so the adds never race. (Running prefill through
 * the decode kernels instead was measured slower on the 35B-A3B shape: 2544 vs 9186 tok/s at
 * 8192 tokens; f32 unit decoding per pair loses to dequantized tiles on tensor cores.) */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_async.cuh"
#include "backends/cuda/cuda_math.cuh"
#include "backends/cuda/cuda_q8act.cuh"
#include "backends/cuda/cuda_quant.cuh"
#include "backends/cuda/cuda_route.cuh"

#include "base/error.h"
#include "ops/ops.h"
#include "backends/cuda/cuda_moe.cuh" /* after ops/ops.h: ACT_KIND_* */

#include <cuda_bf16.h>
#include <mma.h>

#include <stdlib.h>
#include <string.h>

/* One warp per token: cuda_route_token (cuda_route.cuh); sh: the shared-expert slot after
 * them (rows of k + 1), NULL: none. */
template <int NE>
static __global__ void k_moe_route(int32_t *idx, float *wts, const float *logits, int64_t n, int E, int k, int renorm,
                                   const float *per_expert, const float *sh) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const int lane = threadIdx.x & 31;
  const int64_t t = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= n) return;
  const int kk = sh ? k + 1 : k;
  cuda_route_token<NE>(idx + t * kk, wts + t * kk, logits + t * E, E, k, renorm, per_expert, lane);
  if (sh) cuda_route_shared_slot(idx + t * kk + k, wts + t * kk + k, sh + t, E, lane);
}

void cuda_op_moe_route(ops_backend *be, int32_t *idx, float *wts, const float *logits, int64_t n, int n_experts, int k,
                       int renorm, const float *per_expert) {
  cuda_moe_route_shared(be, idx, wts, logits, n, n_experts, k, renorm, per_expert, NULL);
}

void cuda_moe_route_shared(ops_backend *be, int32_t *idx, float *wts, const float *logits, int64_t n, int n_experts,
                           int k, int renorm, const float *per_expert, const float *sh) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  if (k < 1 || k > 32 || k > n_experts || n_experts > 32 * 32) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: top-%d of %d experts not supported (at most 1024 experts, top-32)", k,
              n_experts);
    return;
  }
  const float *pe = per_expert ? (const float *)cuda_mirror(be, per_expert, (size_t)n_experts * sizeof(float)) : NULL;
  if (per_expert && !pe) return;
  const unsigned grid = cuda_blocks(n * 32, 128);
#define ROUTE(NE) \
  cuda_launch_pdl(ci, "moe_route", k_moe_route<NE>, grid, 128, 0, idx, wts, logits, n, n_experts, k, renorm, pe, sh)
  if (n_experts <= 32) ROUTE(1);
  else if (n_experts <= 64) ROUTE(2);
  else if (n_experts <= 128) ROUTE(4);
  else if (n_experts <= 256) ROUTE(8);
  else if (n_experts <= 512) ROUTE(16);
  else ROUTE(32);
#undef ROUTE
}

/* xs[r] = x[order[r] / k] */
static __global__ void k_gather(float *xs, const float *x, const int32_t *order, int64_t m, int H, int k) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m * H; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / H;
    xs[i] = x[(int64_t)(order[r] / k) * H + i % H];
  }
}

/* out[order[r] / k] += wts[order[r]] * ys[r]; one expert per launch, so rows are distinct. */
static __global__ void k_scatter_add(float *out, const float *ys, const int32_t *order, const float *wts, int64_t m,
                                     int H, int k) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m * H; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / H;
    const int32_t pair = order[r];
    out[(int64_t)(pair / k) * H + i % H] += wts[pair] * ys[i];
  }
}

static unsigned grid_of(int64_t n) {
  int64_t b = (n + 255) / 256;
  return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

/* ---- prefill: grouped GEMMs over all experts ---- */

#define MG_BM 128          /* weight rows per block tile (gate/up: 64 gate + 64 up rows) */
#define MG_BK 64           /* K step: two 32-element units per weight row */
#define MG_LDS (MG_BK + 8) /* bf16 per shared row: 144 bytes, so 8 consecutive rows hit distinct banks */
#define MG_LDC (MG_BM + 4) /* floats per shared column of the f32 result */
#define MG_THREADS 256
#define MG_CHUNK 256 /* pairs per histogram / placement block */
#define MG_MAX_E 1024

/* Pair counts per (chunk, expert): cnt[b * E + e]. Integer atomics in shared memory only. */
static __global__ void k_moe_hist(int32_t *cnt, const int32_t *idx, int64_t nk, int E) {
  __shared__ int h[MG_MAX_E];
  for (int e = threadIdx.x; e < E; e += blockDim.x) h[e] = 0;
  __syncthreads();
  const int64_t p = (int64_t)blockIdx.x * MG_CHUNK + threadIdx.x;
  if (p < nk) {
    const int e = idx[p];
    if (e >= 0 && e < E) atomicAdd(&h[e], 1); /* an id out of range contributes nothing (as decode) */
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[(int64_t)blockIdx.x * E + e] = h[e];
}

/* One block of 1024 threads (E <= 1024), thread e owns expert e: cnt[b * E + e] becomes the
 * exclusive prefix over chunks (the chunk's first rank within the expert); off[e] = first
 * slot of expert e (off[E] = pairs placed); tiles[2 t], tiles[2 t + 1] = expert and first
 * slot of token tile t (tiles of bn slots within one expert); *ntiles = their count. */
static __global__ void __launch_bounds__(1024) k_moe_scan(int32_t *cnt, int32_t *off, int32_t *tiles, int32_t *ntiles,
                                                          int64_t nb, int E, int bn) {
  __shared__ int ws[2][32];
  const int e = threadIdx.x, lane = e & 31, w = e >> 5;
  int tot = 0;
  if (e < E)
    for (int64_t b0 = 0; b0 < nb; b0 += 8) { /* 8 loads in flight, then their prefixes */
      int c[8];
#pragma unroll
      for (int j = 0; j < 8; j++) c[j] = b0 + j < nb ? cnt[(b0 + j) * E + e] : 0;
#pragma unroll
      for (int j = 0; j < 8; j++)
        if (b0 + j < nb) cnt[(b0 + j) * E + e] = tot, tot += c[j];
    }
  const int nt = (tot + bn - 1) / bn;
  int it = tot, in = nt; /* inclusive scans within the warp */
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, it, o), b = __shfl_up_sync(0xffffffffu, in, o);
    if (lane >= o) it += a, in += b;
  }
  if (lane == 31) ws[0][w] = it, ws[1][w] = in;
  __syncthreads();
  if (w == 0) {
    const int a0 = ws[0][lane], b0 = ws[1][lane];
    int a = a0, b = b0;
    for (int o = 1; o < 32; o <<= 1) {
      const int x = __shfl_up_sync(0xffffffffu, a, o), y = __shfl_up_sync(0xffffffffu, b, o);
      if (lane >= o) a += x, b += y;
    }
    ws[0][lane] = a - a0, ws[1][lane] = b - b0; /* exclusive over warps */
  }
  __syncthreads();
  const int xo = ws[0][w] + it - tot, xt = ws[1][w] + in - nt;
  if (e < E) {
    off[e] = xo;
    for (int j = 0; j < nt; j++) tiles[2 * (xt + j)] = e, tiles[2 * (xt + j) + 1] = xo + j * bn;
  }
  if (e == E - 1) off[E] = xo + tot, *ntiles = xt + nt;
}

/* Stable placement: pair p of chunk b goes to slot off[e] + cnt[b * E + e] + (pairs of
 * expert e before p in the chunk); order[slot] = p, inv[p] = slot (-1: id out of range). */
static __global__ void k_moe_place(int32_t *order, int32_t *inv, const int32_t *idx, const int32_t *cnt,
                                   const int32_t *off, int64_t nk, int E) {
  __shared__ int se[MG_CHUNK];
  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t p = (int64_t)blockIdx.x * MG_CHUNK + tid;
  int e = -1;
  if (p < nk) {
    e = idx[p];
    if (e < 0 || e >= E) e = -1;
  }
  se[tid] = e;
  __syncthreads();
  const unsigned peers = __match_any_sync(0xffffffffu, e); /* all lanes: blockDim is a multiple of 32 */
  if (p >= nk) return;
  if (e < 0) {
    inv[p] = -1;
    return;
  }
  int rank = __popc(peers & ((1u << lane) - 1u));
  for (int j = 0; j < (tid & ~31); j++) rank += se[j] == e; /* earlier warps; same j across the warp: broadcast */
  const int slot = off[e] + cnt[(int64_t)blockIdx.x * E + e] + rank;
  order[slot] = (int32_t)p;
  inv[p] = slot;
}

/* x[n, H] f32 -> hi, lo [n, Hs] bf16 (hi = bf16(x), lo = bf16(x - hi)), columns H..Hs zero. */
static __global__ void k_moe_split(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *x, int64_t n, int64_t H,
                                   int64_t Hs) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * Hs; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = i / Hs, c = i - t * Hs;
    const float v = c < H ? x[t * H + c] : 0.0f;
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    hi[i] = h;
    if (lo) lo[i] = __float2bfloat16_rn(v - __bfloat162float(h)); /* NULL: one-product GEMMs */
  }
}

/* out[t, c] = sum_j wts[t k + j] * y[inv[t k + j], c], j in order: every element written once. */
static __global__ void k_moe_combine(float *out, const float *y, const int32_t *inv, const float *wts, int64_t n,
                                     int64_t H, int k) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * H; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = i / H, c = i - t * H;
    float acc = 0.0f;
    for (int j = 0; j < k; j++) {
      const int32_t s = inv[t * k + j];
      if (s >= 0) acc += wts[t * k + j] * y[(int64_t)s * H + c];
    }
    out[i] = acc;
  }
}

/* Pieces of a call's MoE scratch, 256-byte aligned, within ops_moe_scratch_floats(n, k, H, I)
 * floats; fits() says whether they all did. */
struct moe_carver {
  uintptr_t at, limit;
  moe_carver(float *scratch, int64_t n, int k, int H, int64_t I)
      : at((uintptr_t)scratch),
        limit((uintptr_t)scratch + (uintptr_t)ops_moe_scratch_floats(n, k, H, (int)I) * sizeof(float)) {}
  template <typename T> T *take(int64_t bytes) {
    at = (at + 255) & ~(uintptr_t)255;
    T *r = (T *)at;
    at += (uintptr_t)bytes;
    return r;
  }
  bool fits() const { return at <= limit; }
};

/* The pairs sorted by expert (k_moe_hist, k_moe_scan, k_moe_place): slot order and its
 * inverse, per-chunk counts, expert offsets, token tiles of bn (tmax at most) and their count. */
struct moe_sort {
  int32_t *order, *inv, *cnt, *off, *tiles, *ntiles;
  int64_t nk, nb;
  moe_sort(moe_carver &c, int64_t nk_, int E, int64_t tmax) : nk(nk_), nb((nk_ + MG_CHUNK - 1) / MG_CHUNK) {
    order = c.take<int32_t>(nk * 4), inv = c.take<int32_t>(nk * 4);
    cnt = c.take<int32_t>(nb * E * 4), off = c.take<int32_t>(((int64_t)E + 1) * 4);
    tiles = c.take<int32_t>(tmax * 2 * 4), ntiles = c.take<int32_t>(4);
  }
  void launch(cuda_impl *ci, const int32_t *idx, int E, int bn) const {
    cuda_launch(ci, "moe hist", k_moe_hist, (unsigned)nb, MG_CHUNK, 0, cnt, idx, nk, E);
    cuda_launch(ci, "moe scan", k_moe_scan, 1, 1024, 0, cnt, off, tiles, ntiles, nb, E, bn);
    cuda_launch(ci, "moe place", k_moe_place, (unsigned)nb, MG_CHUNK, 0, order, inv, idx, (const int32_t *)cnt,
                (const int32_t *)off, nk, E);
  }
};

/* Arguments of the grouped GEMM kernels (one struct: fewer parameters to pass; no padding). */
typedef struct moe_gemm_args {
  const uint8_t *const *tab;       /* [gate E][up E][down E] device row pointers (moe_table) */
  const __nv_bfloat16 *bhi, *blo;  /* activations, split: gate/up: x [n, astride]; down: h [nk, astride] */
  const int32_t *order, *off, *tiles, *ntiles;
  __nv_bfloat16 *hhi, *hlo;        /* gate/up output h [nk, Is], split */
  float *y;                        /* down output [nk, M] */
  int64_t K, M;                    /* reduction length (weight cols) and output rows (I or H) */
  int64_t astride, Is;             /* row strides of the activations and of h (multiples of MG_BK) */
  int64_t rb0, rb1;                /* row bytes: gate (or down), up */
  int32_t t0, t1;                  /* types: gate (or down), up */
  int32_t be0, bb0, be1, bb1;      /* their blocks: elements and bytes (bf16: 32 elements, 64 bytes) */
  int32_t E, k, fused, act;
} moe_gemm_args;

/* Hint: bring [p, p + bytes) into L2 (no registers, no fault; only valid addresses are given). */
__device__ __forceinline__ void moe_prefetch(const void *p, int bytes) {
  for (int o = 0; o < bytes; o += 64) asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + o));
  asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + bytes - 1));
}

/* 32-element unit u of a quantized row to 32 bf16 at dst (16-byte aligned): q * d rounded once. */
__device__ __forceinline__ void moe_unit_deq_bf16(int type, const uint8_t *row, int64_t u, uint4 *dst) {
  float w[32];
  moe_deq32_fast(type, row, u, w);
  uint32_t v[16];
#pragma unroll
  for (int j = 0; j < 16; j++) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(w[2 * j], w[2 * j + 1]);
    v[j] = *(const uint32_t *)&h;
  }
#pragma unroll
  for (int q = 0; q < 4; q++) dst[q] = make_uint4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
}

/* 32-element unit u of a weight row to 32 bf16 at dst (16-byte aligned shared memory):
 * zeros for a missing row (NULL) and for elements at or past K. Quantized types have
 * K % 32 == 0 (whole units); bf16 rows may end mid-unit. */
__device__ __forceinline__ void moe_unit_bf16(int type, const uint8_t *row, int64_t u, int64_t K, uint4 *dst) {
  const int64_t c0 = u * 32;
  if (!row || c0 >= K) {
#pragma unroll
    for (int q = 0; q < 4; q++) dst[q] = make_uint4(0, 0, 0, 0);
    return;
  }
  if (type == ANNA_DTYPE_BF16) {
    const uint16_t *p = (const uint16_t *)row + c0;
    if (c0 + 32 <= K && ((uintptr_t)p & 15) == 0) {
#pragma unroll
      for (int q = 0; q < 4; q++) dst[q] = ((const uint4 *)p)[q];
    } else {
      uint32_t v[16];
#pragma unroll
      for (int j = 0; j < 16; j++) {
        const uint32_t a = c0 + 2 * j < K ? p[2 * j] : 0, b = c0 + 2 * j + 1 < K ? p[2 * j + 1] : 0;
        v[j] = a | b << 16;
      }
#pragma unroll
      for (int q = 0; q < 4; q++) dst[q] = make_uint4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    }
    return;
  }
  moe_unit_deq_bf16(type, row, u, dst);
}

/* The warp layout of a grouped-GEMM tile of MG_BM weight rows x BN tokens: 8 warps as
 * WM x WN, each FM x FN fragments of 16 x 16. */
template <int BN> struct moe_tile {
  static constexpr int WN = BN >= 64 ? 2 : 1, WM = 8 / WN, FM = MG_BM / 16 / WM, FN = BN / 16 / WN;
  static_assert(FM * 16 * WM == MG_BM && FN * 16 * WN == BN, "warp layout");
  using acc_t = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;
};

/* A tile block's place (blockIdx: row tile x, token tile y): its expert e, first slot s0,
 * pairs cnt (<= BN) and first weight row m0, and its activation rows: s_row[r] = element
 * offset of token tile row r in the activations (MODE 0: x rows of the pairs' tokens; 1: h
 * rows of the slots), -1 for padding (a barrier must follow before they are read). false: a
 * surplus block of the upper-bound grid (past the device-side tile count). */
template <int BN, int MODE>
__device__ __forceinline__ bool moe_tile_begin(const moe_gemm_args &a, int64_t *s_row, int *e, int *s0, int *cnt,
                                               int64_t *m0) {
  const int tile = blockIdx.y;
  if (tile >= *a.ntiles) return false;
  *e = a.tiles[2 * tile], *s0 = a.tiles[2 * tile + 1];
  *cnt = min(BN, a.off[*e + 1] - *s0);
  *m0 = (int64_t)blockIdx.x * (MODE == 0 ? MG_BM / 2 : MG_BM);
  for (int r = threadIdx.x; r < BN; r += MG_THREADS) {
    int64_t ro = -1; /* padding slot: zero activations */
    if (r < *cnt) ro = (MODE == 0 ? (int64_t)(a.order[*s0 + r] / a.k) : (int64_t)(*s0 + r)) * a.astride;
    s_row[r] = ro;
  }
  return true;
}

template <int BN>
__device__ __forceinline__ void moe_tile_zero(typename moe_tile<BN>::acc_t (&acc)[moe_tile<BN>::FM][moe_tile<BN>::FN]) {
#pragma unroll
  for (int i = 0; i < moe_tile<BN>::FM; i++)
#pragma unroll
    for (int j = 0; j < moe_tile<BN>::FN; j++) nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
}

/* One K step of MG_BK from the tiles in shared memory (rows MG_LDS apart): acc += W X^T, and
 * + W Xl^T with SPLIT. */
template <int BN, bool SPLIT>
__device__ __forceinline__ void moe_tile_mma(typename moe_tile<BN>::acc_t (&acc)[moe_tile<BN>::FM][moe_tile<BN>::FN],
                                             const __nv_bfloat16 *Ws, const __nv_bfloat16 *Xh,
                                             const __nv_bfloat16 *Xl, int wm, int wn) {
  using namespace nvcuda;
  constexpr int FM = moe_tile<BN>::FM, FN = moe_tile<BN>::FN;
#pragma unroll
  for (int kk = 0; kk < MG_BK; kk += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[FM];
#pragma unroll
    for (int i = 0; i < FM; i++) wmma::load_matrix_sync(fa[i], Ws + (wm * FM + i) * 16 * MG_LDS + kk, MG_LDS);
#pragma unroll
    for (int j = 0; j < FN; j++) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fh, fl;
      wmma::load_matrix_sync(fh, Xh + (wn * FN + j) * 16 * MG_LDS + kk, MG_LDS);
      if (SPLIT) wmma::load_matrix_sync(fl, Xl + (wn * FN + j) * 16 * MG_LDS + kk, MG_LDS);
#pragma unroll
      for (int i = 0; i < FM; i++) {
        wmma::mma_sync(acc[i][j], fa[i], fh, acc[i][j]);
        if (SPLIT) wmma::mma_sync(acc[i][j], fa[i], fl, acc[i][j]);
      }
    }
  }
}

/* The tile's result through shared memory Cs (BN x MG_LDC floats, free for it) into its
 * outputs. MODE 0: h = act(gate) * up, bf16 (and the lo half with SPLIT), h[slot, m0..m0+63]
 * (zero past M); MODE 1: y[slot, rows]. */
template <int BN, int MODE, bool SPLIT>
__device__ __forceinline__ void moe_tile_store(const moe_gemm_args &a,
                                               typename moe_tile<BN>::acc_t (&acc)[moe_tile<BN>::FM][moe_tile<BN>::FN],
                                               float *Cs, int s0, int cnt, int64_t m0, int wm, int wn) {
  using namespace nvcuda;
  constexpr int FM = moe_tile<BN>::FM, FN = moe_tile<BN>::FN;
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < FM; i++)
#pragma unroll
    for (int j = 0; j < FN; j++) /* C[row, col] at Cs[col * MG_LDC + row] */
      wmma::store_matrix_sync(Cs + (wn * FN + j) * 16 * MG_LDC + (wm * FM + i) * 16, acc[i][j], MG_LDC,
                              wmma::mem_col_major);
  __syncthreads();
  if (MODE == 0) {
    constexpr int HALF = MG_BM / 2;
    for (int q = tid; q < cnt * HALF; q += MG_THREADS) {
      const int c = q / HALF, r = q % HALF;
      const int64_t i = m0 + r; /* < Is: Is is a multiple of HALF */
      const float h = i < a.M ? moe_act(Cs[c * MG_LDC + r], a.act) * Cs[c * MG_LDC + HALF + r] : 0.0f;
      const __nv_bfloat16 hh = __float2bfloat16_rn(h);
      const int64_t o = (int64_t)(s0 + c) * a.Is + i;
      a.hhi[o] = hh;
      if (SPLIT) a.hlo[o] = __float2bfloat16_rn(h - __bfloat162float(hh));
    }
  } else {
    for (int q = tid; q < cnt * MG_BM; q += MG_THREADS) {
      const int c = q / MG_BM, r = q % MG_BM;
      if (m0 + r < a.M) a.y[(int64_t)(s0 + c) * a.M + m0 + r] = Cs[c * MG_LDC + r];
    }
  }
}

/* One (row tile, token tile) block of a grouped GEMM: C[MG_BM, BN] = W_e[rows, K] . B[slots, K]^T
 * on bf16 tensor cores (B as hi and lo: two products into one f32 accumulator).
 * MODE 0 (gate/up): rows 0..63 of the tile are gate rows m0.., rows 64..127 the up rows of the
 * same h columns; epilogue h = act(gate) * up, split, into h[slot, m0..m0+63] (zero past I).
 * B rows are x rows of the pairs' tokens (order[slot] / k).
 * MODE 1 (down): rows m0..m0+127 of down_e; B rows are h rows of the slots; y[slot, rows].
 * 8 warps as WM x WN, each FM x FN fragments of 16 x 16. grid (row tiles, token tiles).
 * SPLIT false (cuda_gemm_split): the hi activations alone, one product; lo is neither read
 * nor written. */
template <int BN, int MODE, bool SPLIT>
static __global__ void __launch_bounds__(MG_THREADS, 2) k_moe_gemm(moe_gemm_args a) {
  constexpr int WM = moe_tile<BN>::WM, FM = moe_tile<BN>::FM, FN = moe_tile<BN>::FN;
  constexpr int STAGE = (MG_BM + 2 * BN) * MG_LDS * 2, CBYTES = BN * MG_LDC * 4;
  __shared__ __align__(128) unsigned char smem[STAGE > CBYTES ? STAGE : CBYTES];
  __shared__ int64_t s_row[BN];
  int e, s0, cnt;
  int64_t m0;
  if (!moe_tile_begin<BN, MODE>(a, s_row, &e, &s0, &cnt, &m0)) return; /* surplus block */
  const int tid = threadIdx.x;
  /* This thread's weight row and unit within each K step: consecutive threads take
   * consecutive rows (conflict-free 16-byte shared stores). A warp's rows are all gate or
   * all up rows: the type branch is uniform. */
  const int wr = tid % MG_BM, wu = tid / MG_BM;
  const uint8_t *wrow = NULL;
  int wt = a.t0, wbe = a.be0, wbb = a.bb0;
  if (MODE == 0) {
    const int64_t i = m0 + (wr & (MG_BM / 2 - 1));
    if (i < a.M) {
      if (wr < MG_BM / 2) wrow = a.tab[e] + i * a.rb0;
      else if (a.fused) wrow = a.tab[e] + (a.M + i) * a.rb0;
      else wrow = a.tab[a.E + e] + i * a.rb1, wt = a.t1, wbe = a.be1, wbb = a.bb1;
    }
  } else {
    const int64_t r = m0 + wr;
    if (r < a.M) wrow = a.tab[2 * a.E + e] + r * a.rb0;
  }
  __nv_bfloat16 *Ws = (__nv_bfloat16 *)smem, *Xh = Ws + MG_BM * MG_LDS, *Xl = Xh + BN * MG_LDS;
  typename moe_tile<BN>::acc_t acc[FM][FN];
  moe_tile_zero<BN>(acc);
  const int warp = tid >> 5, wm = warp % WM, wn = warp / WM;
  __syncthreads(); /* s_row */
  for (int64_t k0 = 0; k0 < a.K; k0 += MG_BK) {
    /* The next step's weight block (when it starts a new one) and activation rows toward
     * L2 while this step loads, decodes and multiplies: the loads below wait on DRAM only
     * for the first step. Addresses stay inside the row / padded activation row. */
    const int64_t un = (k0 + MG_BK) / 32 + wu;
    if (wrow && un * 32 < a.K && (un * 32) / wbe != (un * 32 - MG_BK) / wbe)
      moe_prefetch(wrow + (un * 32) / wbe * wbb,
                   wt == ANNA_DTYPE_BF16 ? (int)min((a.K - un * 32) * 2, (int64_t)64) : wbb);
    if (k0 + MG_BK < a.K)
      for (int r = tid; r < BN; r += MG_THREADS)
        if (s_row[r] >= 0) { /* one 128-byte line per row and half */
          asm volatile("prefetch.global.L2 [%0];" ::"l"(a.bhi + s_row[r] + k0 + MG_BK));
          if (SPLIT) asm volatile("prefetch.global.L2 [%0];" ::"l"(a.blo + s_row[r] + k0 + MG_BK));
        }
    moe_unit_bf16(wt, wrow, k0 / 32 + wu, a.K, (uint4 *)(Ws + wr * MG_LDS + wu * 32));
    for (int q = tid; q < BN * (MG_BK / 8); q += MG_THREADS) {
      const int r = q / (MG_BK / 8), ch = q % (MG_BK / 8);
      const int64_t ro = s_row[r];
      uint4 vh = make_uint4(0, 0, 0, 0), vl = vh;
      if (ro >= 0) { /* k0 + 64 <= astride: the padded row holds the whole step */
        vh = *(const uint4 *)(a.bhi + ro + k0 + ch * 8);
        if (SPLIT) vl = *(const uint4 *)(a.blo + ro + k0 + ch * 8);
      }
      *(uint4 *)(Xh + r * MG_LDS + ch * 8) = vh;
      if (SPLIT) *(uint4 *)(Xl + r * MG_LDS + ch * 8) = vl;
    }
    __syncthreads();
    moe_tile_mma<BN, SPLIT>(acc, Ws, Xh, Xl, wm, wn);
    __syncthreads(); /* the next step overwrites the tiles */
  }
  moe_tile_store<BN, MODE, SPLIT>(a, acc, (float *)smem, s0, cnt, m0, wm, wn);
}

static bool moe_type_grouped(int t, int64_t cols) {
  return t == ANNA_DTYPE_BF16 || (cuda_quant_supported(t) && cols % 32 == 0);
}

/* Block shape for the prefetch: bf16 rows count as 32-element "blocks" of 64 bytes. */
static int32_t moe_block_elems(int t) {
  return t == ANNA_DTYPE_BF16 ? 32 : (int32_t)dtype_block_size(t);
}
static int32_t moe_block_bytes(int t) {
  return t == ANNA_DTYPE_BF16 ? 64 : (int32_t)dtype_block_bytes(t);
}

/* Experts [e0, e0 + ec) to bf16 at dst, each 3 I H elements: its gate/up rows as [2I][H]
 * (gate rows, then up rows) and its down rows as [H][I]. Experts without pairs (off) are
 * skipped. One thread per 32-element unit, a row's units on consecutive threads. */
static __global__ void k_moe_deq_experts(__nv_bfloat16 *dst, const uint8_t *const *tab, const int32_t *off, int E,
                                         int e0, int ec, int64_t H, int64_t I, int tg, int tu, int td, int64_t rbg,
                                         int64_t rbu, int64_t rbd, int fused) {
  const int64_t uh = H / 32, ui = I / 32, ug = 2 * I * uh, per = ug + H * ui;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < ec * per; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t ex = i / per;
    int64_t r = i - ex * per;
    const int e = e0 + (int)ex;
    if (off[e + 1] == off[e]) continue;
    const uint8_t *row;
    int type;
    int64_t u;
    __nv_bfloat16 *o = dst + ex * 3 * I * H;
    if (r < ug) {
      const int64_t w = r / uh;
      u = r - w * uh;
      o += w * H + u * 32;
      if (w < I || fused) row = tab[e] + w * rbg, type = tg;
      else row = tab[E + e] + (w - I) * rbu, type = tu;
    } else {
      r -= ug;
      const int64_t w = r / ui;
      u = r - w * ui;
      o += 2 * I * H + w * I + u * 32;
      row = tab[2 * E + e] + w * rbd, type = td;
    }
    moe_unit_deq_bf16(type, row, u, (uint4 *)o);
  }
}

/* ---- the pipelined tile kernel on experts dequantized to bf16 ----
 *
 * k_moe_gemm decodes its weight units inside the K loop and loads every step after the
 * previous one's products (one block's loads, decode and tensor-core work never overlap;
 * ~42-55 TFLOP/s on the 35B-A3B layer). With the experts dequantized to bf16 first
 * (k_moe_deq_experts, the cuBLAS path's buffer), both operands are plain bf16 rows and the
 * tiles come by cp.async in MP_STAGES stages: the copies of step s + 2 are in flight while
 * the tensor cores work on step s; one barrier per step. Same tiles, warps and epilogue as
 * k_moe_gemm (the numerics of its one-product mode: bf16 weights and activations, f32
 * accumulation; only the order of loads differs, so the result bits are k_moe_gemm's on the
 * same bf16 weights). */
#define MP_STAGES 3

template <int BN> static constexpr size_t mp_smem_bytes() {
  return (size_t)MP_STAGES * (MG_BM + BN) * MG_LDS * 2 > (size_t)BN * MG_LDC * 4
             ? (size_t)MP_STAGES * (MG_BM + BN) * MG_LDS * 2
             : (size_t)BN * MG_LDC * 4;
}

/* As k_moe_gemm (MODE, tiles, epilogue; one product) with bf16 weight rows (a.tab: gate/up
 * of expert e as one [2M][K] matrix at tab[e], gate rows then up rows; down at tab[2E + e];
 * rows 16-byte aligned, K % MG_BK == 0). Dynamic shared memory: mp_smem_bytes<BN>(). */
template <int BN, int MODE>
static __global__ void __launch_bounds__(MG_THREADS, 2) k_moe_gemm_pipe(moe_gemm_args a) {
  constexpr int WM = moe_tile<BN>::WM, FM = moe_tile<BN>::FM, FN = moe_tile<BN>::FN;
  constexpr int STAGE = (MG_BM + BN) * MG_LDS; /* bf16 per stage: weights, then activations */
  static_assert(MG_BM * (MG_BK / 8) == 4 * MG_THREADS, "four weight chunks per thread and step");
  extern __shared__ __align__(128) unsigned char mp_smem[];
  __nv_bfloat16 *const sm = (__nv_bfloat16 *)mp_smem;
  __shared__ int64_t s_row[BN];
  int e, s0, cnt;
  int64_t m0;
  if (!moe_tile_begin<BN, MODE>(a, s_row, &e, &s0, &cnt, &m0)) return; /* surplus block */
  const int tid = threadIdx.x;
  /* this thread's four weight chunks per step: tile row R = q / 8, 16-byte chunk q % 8 */
  const __nv_bfloat16 *wr[4];
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int R = (tid + j * MG_THREADS) >> 3;
    wr[j] = NULL;
    if (MODE == 0) {
      const int64_t i = m0 + (R & (MG_BM / 2 - 1));
      if (i < a.M) wr[j] = (const __nv_bfloat16 *)(a.tab[e] + (R < MG_BM / 2 ? i : a.M + i) * a.rb0);
    } else {
      const int64_t r = m0 + R;
      if (r < a.M) wr[j] = (const __nv_bfloat16 *)(a.tab[2 * a.E + e] + r * a.rb0);
    }
  }
  __syncthreads(); /* s_row */
  auto load = [&](int st, int64_t k0) {
    __nv_bfloat16 *Ws = sm + st * STAGE, *Xs = Ws + MG_BM * MG_LDS;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int q = tid + j * MG_THREADS, R = q >> 3, ch = q & 7;
      cuda_cp16_zfill(Ws + R * MG_LDS + ch * 8, wr[j] ? (const void *)(wr[j] + k0 + ch * 8) : (const void *)a.bhi,
              wr[j] ? 16 : 0);
    }
    for (int q = tid; q < BN * (MG_BK / 8); q += MG_THREADS) {
      const int r = q >> 3, ch = q & 7;
      const int64_t ro = s_row[r];
      cuda_cp16_zfill(Xs + r * MG_LDS + ch * 8, ro >= 0 ? (const void *)(a.bhi + ro + k0 + ch * 8) : (const void *)a.bhi,
              ro >= 0 ? 16 : 0);
    }
  };
  typename moe_tile<BN>::acc_t acc[FM][FN];
  moe_tile_zero<BN>(acc);
  const int warp = tid >> 5, wm = warp % WM, wn = warp / WM;
  const int nk = (int)(a.K / MG_BK);
#pragma unroll
  for (int s = 0; s < MP_STAGES - 1; s++) {
    if (s < nk) load(s, (int64_t)s * MG_BK);
    cuda_cp_commit(); /* empty groups too: the wait below counts groups */
  }
  for (int kt = 0; kt < nk; kt++) {
    cuda_cp_wait<MP_STAGES - 2>(); /* step kt's copies (this thread's) have landed */
    __syncthreads();          /* everyone's, and everyone is done with step kt - 1's stage */
    const int nx = kt + MP_STAGES - 1;
    if (nx < nk) load(nx % MP_STAGES, (int64_t)nx * MG_BK);
    cuda_cp_commit();
    const __nv_bfloat16 *Ws = sm + (kt % MP_STAGES) * STAGE, *Xs = Ws + MG_BM * MG_LDS;
    moe_tile_mma<BN, false>(acc, Ws, Xs, NULL, wm, wn);
  }
  cuda_cp_wait<0>();
  __syncthreads(); /* the stages become the result tile */
  moe_tile_store<BN, MODE, false>(a, acc, (float *)mp_smem, s0, cnt, m0, wm, wn);
}

/* Queues both pipelined GEMMs for token tiles of BN (their shared memory opted in first). */
template <int BN>
static void moe_gemms_pipe(cuda_impl *ci, const moe_gemm_args &gu, const moe_gemm_args &dn, int64_t tmax) {
  const size_t sm = mp_smem_bytes<BN>();
  if (!cuda_check(ci, cudaFuncSetAttribute(k_moe_gemm_pipe<BN, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm),
                  "moe pipe smem") ||
      !cuda_check(ci, cudaFuncSetAttribute(k_moe_gemm_pipe<BN, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm),
                  "moe pipe smem"))
    return;
  cuda_launch(ci, "moe grouped gate/up (pipelined)", k_moe_gemm_pipe<BN, 0>,
              dim3((unsigned)(gu.Is / (MG_BM / 2)), (unsigned)tmax), MG_THREADS, sm, gu);
  cuda_launch(ci, "moe grouped down (pipelined)", k_moe_gemm_pipe<BN, 1>,
              dim3((unsigned)((dn.M + MG_BM - 1) / MG_BM), (unsigned)tmax), MG_THREADS, sm, dn);
}

/* From the mean pairs per expert up, the default takes the pipelined kernel (below). H200,
 * 35B-A3B layer (test_cuda_ops --bench=moe), in-loop tiles vs pipelined with the dequantization:
 * 16 pairs per expert 1390 vs 1514 us, 64 2417 vs 2101, 128 4059 vs 2884, 256 7365 vs 5882. */
#define MOE_PIPE_PAIRS 32

/* ci->moe_deq holding at least bytes (grown; never inside a recorded step); false when the
 * device has no room (nothing set: the callers fall back to paths that need no buffer). */
static bool moe_deq_reserve(cuda_impl *ci, size_t bytes) {
  if (ci->moe_deq_bytes >= bytes) return true;
  if (ci->recording || bytes > ci->moe_deq_cap) return false;
  if (ci->moe_deq) cudaFree(ci->moe_deq);
  ci->moe_deq = NULL, ci->moe_deq_bytes = 0;
  if (cudaMalloc(&ci->moe_deq, bytes) != cudaSuccess) {
    (void)cudaGetLastError(); /* no room */
    ci->moe_deq = NULL;
    return false;
  }
  ci->moe_deq_bytes = bytes;
  return true;
}

/* Queues both grouped GEMMs for token tiles of BN. */
template <int BN, bool SPLIT>
static void moe_gemms(cuda_impl *ci, const moe_gemm_args &gu, const moe_gemm_args &dn, int64_t tmax) {
  cuda_launch(ci, "moe grouped gate/up", k_moe_gemm<BN, 0, SPLIT>,
              dim3((unsigned)(gu.Is / (MG_BM / 2)), (unsigned)tmax), MG_THREADS, 0, gu);
  cuda_launch(ci, "moe grouped down", k_moe_gemm<BN, 1, SPLIT>,
              dim3((unsigned)((dn.M + MG_BM - 1) / MG_BM), (unsigned)tmax), MG_THREADS, 0, dn);
}

/* The grouped prefill path; false (nothing queued) when it cannot take these weights or
 * the scratch is too small. */
static bool moe_ffn_grouped_impl(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                                 const float *wts, int k, const ops_weight *gate, const ops_weight *up,
                                 const ops_weight *down, int act, float *scratch, int E,
                                 const uint8_t *const *tab_in, bool dry, int64_t cap_n) {
  cuda_impl *ci = cuda_impl_of(be);
  if (E < 1 || E > MG_MAX_E || k < 1 || H < 1) return false;
  const int64_t I = up ? up[0].rows : gate[0].rows / 2;
  if (I < 1 || gate[0].cols != H || down[0].rows != H || down[0].cols != I || (!up && gate[0].rows != 2 * I) ||
      (up && up[0].cols != H))
    return false;
  if (!moe_type_grouped(gate[0].type, H) || (up && !moe_type_grouped(up[0].type, H)) ||
      !moe_type_grouped(down[0].type, I))
    return false;
  const int64_t nk = n * k;
  if (nk > 0x3fffffff || (int64_t)H * nk > ((int64_t)1 << 40)) return false;
  /* token tile: from the mean pairs per expert, unless a variant is forced. Measured on the
   * H200 (35B-A3B layer, Q4_K, test_cuda_ops --bench): 16 pairs per expert, tiles of 16 / 32 /
   * 64 took 1914 / 1611 / 1814 us; 128 pairs per expert, 11200 / 6967 / 4654 us. */
  int bn = ci->moe_variant == CUDA_MOE_T16 ? 16 : ci->moe_variant == CUDA_MOE_T32 ? 32
         : ci->moe_variant == CUDA_MOE_T64 ? 64 : 0;
  if (!bn) bn = nk < 8 * (int64_t)E ? 16 : nk < 56 * (int64_t)E ? 32 : 64;
  /* the pipelined kernel on experts dequantized first (k_moe_gemm_pipe): one-product numerics,
   * quantized experts, K steps without tails, the whole layer's bf16 experts within the
   * buffer's cap; by default from MOE_PIPE_PAIRS pairs per expert */
  const int v = ci->moe_variant;
  const int tg = gate[0].type, tu = up ? up[0].type : tg, td = down[0].type;
  const size_t per = (size_t)3 * (size_t)I * (size_t)H * sizeof(__nv_bfloat16);
  const bool split = cuda_gemm_split(ci, tg) || (up && cuda_gemm_split(ci, tu)) || cuda_gemm_split(ci, td);
  /* a caller's table (offload slots): no bf16 copy of the whole layer (its memory is not in
   * the offload budget) */
  bool pre = !tab_in && !split && cuda_quant_supported(tg) && cuda_quant_supported(tu) && cuda_quant_supported(td) &&
             H % MG_BK == 0 && I % MG_BK == 0 &&
             (v == CUDA_MOE_PIPE ||
              ((v == CUDA_MOE_DEFAULT || v == CUDA_MOE_CUBLAS || v == CUDA_MOE_CUBLAS_LOOP) &&
               nk >= (int64_t)MOE_PIPE_PAIRS * E));
  int64_t tmax = (nk + bn - 1) / bn + E;
  while (tmax > 65535 && bn < 64) bn *= 2, tmax = (nk + bn - 1) / bn + E;
  if (tmax > 65535) return false;
  const int64_t Hs = ((int64_t)H + MG_BK - 1) / MG_BK * MG_BK, Is = (I + MG_BK - 1) / MG_BK * MG_BK;
  /* a caller's scratch sized for cap_n tokens (offload groups of a few pairs carve theirs
   * from a whole chunk's: the per-expert arrays do not shrink with n) */
  moe_carver sc(scratch, cap_n > n ? cap_n : n, k, H, I);
  __nv_bfloat16 *xhi = sc.take<__nv_bfloat16>(n * Hs * 2), *xlo = sc.take<__nv_bfloat16>(n * Hs * 2);
  __nv_bfloat16 *hhi = sc.take<__nv_bfloat16>(nk * Is * 2), *hlo = sc.take<__nv_bfloat16>(nk * Is * 2);
  float *y = sc.take<float>(nk * H * 4);
  const moe_sort so(sc, nk, E, tmax);
  if (!sc.fits()) return false;
  if (dry) return true;
  const int32_t *order = so.order, *inv = so.inv, *off = so.off, *tiles = so.tiles, *ntiles = so.ntiles;
  const uint8_t *const *tab = tab_in ? tab_in : moe_table(be, E, gate, up, down, NULL);
  if (!tab) return false;
  pre = pre && moe_deq_reserve(ci, (size_t)E * per); /* the buffer only once the call is sure to run */

  /* one numerics for the layer: split when any of its weights wants it (h is written once) */
  cuda_launch(ci, "moe split", k_moe_split, cuda_blocks(n * Hs, 256), 256, 0, xhi, split ? xlo : NULL, x, n,
              (int64_t)H, Hs);
  so.launch(ci, idx, E, bn);
  moe_gemm_args gu, dn;
  memset(&gu, 0, sizeof gu);
  gu.tab = tab, gu.bhi = xhi, gu.blo = xlo, gu.order = order, gu.off = off, gu.tiles = tiles, gu.ntiles = ntiles;
  gu.hhi = hhi, gu.hlo = hlo, gu.K = H, gu.M = I, gu.astride = Hs, gu.Is = Is;
  gu.rb0 = dtype_row_bytes(gate[0].type, H), gu.rb1 = up ? dtype_row_bytes(up[0].type, H) : 0;
  gu.t0 = gate[0].type, gu.t1 = up ? up[0].type : gate[0].type, gu.E = E, gu.k = k, gu.fused = up == NULL, gu.act = act;
  gu.be0 = moe_block_elems(gu.t0), gu.bb0 = moe_block_bytes(gu.t0);
  gu.be1 = moe_block_elems(gu.t1), gu.bb1 = moe_block_bytes(gu.t1);
  dn = gu;
  dn.bhi = hhi, dn.blo = hlo, dn.hhi = NULL, dn.hlo = NULL, dn.y = y, dn.K = I, dn.M = H, dn.astride = Is;
  dn.rb0 = dtype_row_bytes(down[0].type, I), dn.rb1 = 0, dn.t0 = dn.t1 = down[0].type;
  dn.be0 = dn.be1 = moe_block_elems(dn.t0), dn.bb0 = dn.bb1 = moe_block_bytes(dn.t0);
  if (pre) { /* every expert with pairs to bf16, and a table of the bf16 matrices */
    __nv_bfloat16 *deq = (__nv_bfloat16 *)ci->moe_deq;
    cuda_launch(ci, "moe dequant experts", k_moe_deq_experts, grid_of((int64_t)E * 3 * I * H / 32), 256, 0, deq, tab,
                (const int32_t *)off, E, 0, E, (int64_t)H, I, tg, tu, td, gu.rb0, gu.rb1, dn.rb0, up == NULL ? 1 : 0);
    const size_t tb = (size_t)3 * E * sizeof(const uint8_t *);
    char *th, *td_; /* the table written straight into the argument ring: no host allocation */
    if (!cuda_ring_reserve(be, tb, &th, &td_)) return true; /* error set */
    const uint8_t **ht = (const uint8_t **)th;
    for (int e = 0; e < E; e++) {
      const uint8_t *b = (const uint8_t *)(deq + (int64_t)e * 3 * I * H);
      ht[e] = ht[E + e] = b, ht[2 * E + e] = b + 2 * I * H * sizeof(__nv_bfloat16);
    }
    cuda_copy_async(ci, td_, th, tb, cudaMemcpyHostToDevice, "moe bf16 table");
    if (ci->err) return true;
    gu.tab = dn.tab = (const uint8_t *const *)td_;
    gu.t0 = gu.t1 = dn.t0 = dn.t1 = ANNA_DTYPE_BF16, gu.fused = dn.fused = 1;
    gu.rb0 = gu.rb1 = (int64_t)H * 2, dn.rb0 = dn.rb1 = I * 2;
    gu.be0 = gu.be1 = dn.be0 = dn.be1 = moe_block_elems(ANNA_DTYPE_BF16);
    gu.bb0 = gu.bb1 = dn.bb0 = dn.bb1 = moe_block_bytes(ANNA_DTYPE_BF16);
    if (bn == 16) moe_gemms_pipe<16>(ci, gu, dn, tmax);
    else if (bn == 32) moe_gemms_pipe<32>(ci, gu, dn, tmax);
    else moe_gemms_pipe<64>(ci, gu, dn, tmax);
  } else if (bn == 16) split ? moe_gemms<16, true>(ci, gu, dn, tmax) : moe_gemms<16, false>(ci, gu, dn, tmax);
  else if (bn == 32) split ? moe_gemms<32, true>(ci, gu, dn, tmax) : moe_gemms<32, false>(ci, gu, dn, tmax);
  else split ? moe_gemms<64, true>(ci, gu, dn, tmax) : moe_gemms<64, false>(ci, gu, dn, tmax);
  cuda_launch(ci, "moe combine", k_moe_combine, cuda_blocks(n * H, 256), 256, 0, out, (const float *)y,
              (const int32_t *)inv, wts, n, (int64_t)H, k);
  return true;
}

static bool moe_ffn_grouped(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                            const float *wts, int k, const ops_weight *gate, const ops_weight *up,
                            const ops_weight *down, int act, float *scratch, int E) {
  return moe_ffn_grouped_impl(be, out, x, n, H, idx, wts, k, gate, up, down, act, scratch, E, NULL, false, 0);
}

bool moe_ffn_grouped_tab(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                         const float *wts, int k, const ops_weight *gate, const ops_weight *up, const ops_weight *down,
                         int act, float *scratch, int E, const uint8_t *const *tab, bool dry, int64_t cap_n) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->exact || ci->moe_variant == CUDA_MOE_HOST) return false; /* the grouped path's own conditions */
  return moe_ffn_grouped_impl(be, out, x, n, H, idx, wts, k, gate, up, down, act, scratch, E, tab, dry, cap_n);
}

void moe_combine(ops_backend *be, float *out, const float *y, const int32_t *inv, const float *wts, int64_t n, int H,
                 int k) {
  cuda_launch(cuda_impl_of(be), "moe combine", k_moe_combine, cuda_blocks(n * H, 256), 256, 0, out, y, inv, wts, n,
              (int64_t)H, k);
}

/* ---- prefill on cuBLAS: experts dequantized to bf16, grouped GEMMs ----
 *
 * The same dequantized experts as the pipelined tiles, multiplied by cuBLAS instead; with
 * hundreds of pairs per expert the two are level (MOE_CUBLAS_PAIRS below). The experts
 * are dequantized once per call into a bf16 buffer (the same rounding as the dense prefill
 * GEMMs: q * d to bf16) and multiplied by cuBLAS's grouped GEMM, one problem per expert with
 * pairs; the activations are rounded to bf16 once (cuda_gemm_split: quantized weights only).
 * cuBLAS takes the problem shapes on the host, so the pair counts per expert are read back
 * (one stream sync per call: prefill only, never inside a recorded step). Experts go in
 * chunks that fit ci->moe_deq_cap: dequantize chunk, gate/up GEMM -> g [pairs, 2I] f32,
 * act -> h bf16, down GEMM -> y [pairs, H] f32; then the weighted combine. */

/* From the mean pairs per expert up, the default takes this path. H200, 35B-A3B layer (E 256,
 * k 8, H 2048, I 512, Q4_K; test_cuda_ops --bench=moe): 16 pairs per expert 4042 us (in-loop
 * tiles 1401), 64 4377 (2433), 128 5169 (4090), 256 5168 (7422; 80 TFLOP/s, the
 * dequantization ~0.6 ms of it); a later call: 256 pairs 5821 vs the pipelined tiles' 5882,
 * 128 5480 vs 2886. */
#define MOE_CUBLAS_PAIRS 192

/* Host arrays of one call: the pair offsets read back and one chunk's problems. */
typedef struct moe_host {
  int32_t off[MG_MAX_E + 1];
  int m[MG_MAX_E], n[MG_MAX_E], kk[MG_MAX_E], lda[MG_MAX_E], ldb[MG_MAX_E], ldc[MG_MAX_E], gsize[MG_MAX_E];
  cublasOperation_t ta[MG_MAX_E], tb[MG_MAX_E];
  float alpha[MG_MAX_E], beta[MG_MAX_E];
  const void *A[MG_MAX_E], *B[MG_MAX_E];
  void *C[MG_MAX_E];
} moe_host;

/* xs[s, :] = bf16(x[order[s] / k, :]) for the placed slots s < *placed (H % 4 == 0, x 16-byte aligned). */
static __global__ void k_moe_gather_bf16(__nv_bfloat16 *xs, const float *x, const int32_t *order,
                                         const int32_t *placed, int64_t H, int k) {
  const int64_t h4 = H / 4, total = (int64_t)*placed * h4;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t s = i / h4, c = i - s * h4;
    const float4 v = ((const float4 *)(x + (int64_t)(order[s] / k) * H))[c];
    const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    uint2 o;
    o.x = *(const uint32_t *)&a, o.y = *(const uint32_t *)&b;
    ((uint2 *)(xs + s * H))[c] = o;
  }
}

/* h[s, i] = bf16(act(g[s, i]) * g[s, I + i]) for slots [s0, s1) (I even). */
static __global__ void k_moe_act_bf16(__nv_bfloat16 *h, const float *g, int64_t s0, int64_t s1, int64_t I, int act) {
  const int64_t i2 = I / 2, total = (s1 - s0) * i2;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t s = s0 + i / i2, c = i % i2;
    const float2 a = ((const float2 *)(g + s * 2 * I))[c], b = ((const float2 *)(g + s * 2 * I + I))[c];
    ((__nv_bfloat162 *)(h + s * I))[c] = __floats2bfloat162_rn(moe_act(a.x, act) * b.x, moe_act(a.y, act) * b.y);
  }
}

/* The chunk's G problems (mh's arrays) on cuBLAS: one grouped call, or a loop of GEMMs
 * when this cuBLAS refuses the grouped call (the test hook CUDA_MOE_CUBLAS_LOOP forces it);
 * false on a cuBLAS error (set). */
static bool moe_blas_run(ops_backend *be, moe_host *mh, int G) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->moe_variant != CUDA_MOE_CUBLAS_LOOP && ci->moe_blas_grouped >= 0) {
    const void **dA = (const void **)cuda_ring_put(be, mh->A, (size_t)G * sizeof(void *));
    const void **dB = dA ? (const void **)cuda_ring_put(be, mh->B, (size_t)G * sizeof(void *)) : NULL;
    void **dC = dB ? (void **)cuda_ring_put(be, mh->C, (size_t)G * sizeof(void *)) : NULL;
    if (!dC) return false;
    const cublasStatus_t s = cublasGemmGroupedBatchedEx(
        ci->blas, mh->ta, mh->tb, mh->m, mh->n, mh->kk, mh->alpha, dA, CUDA_R_16BF, mh->lda, dB, CUDA_R_16BF, mh->ldb,
        mh->beta, dC, CUDA_R_32F, mh->ldc, G, mh->gsize, CUBLAS_COMPUTE_32F);
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    if (s != CUBLAS_STATUS_NOT_SUPPORTED && s != CUBLAS_STATUS_INVALID_VALUE) {
      cuda_fail(ci, ANNA_EIO, "cuda: cublasGemmGroupedBatchedEx failed (status %d)", (int)s);
      return false;
    }
    ci->moe_blas_grouped = -1; /* this cuBLAS cannot: the loop from now on */
  }
  for (int g = 0; g < G; g++) {
    const cublasStatus_t s =
        cublasGemmEx(ci->blas, mh->ta[g], mh->tb[g], mh->m[g], mh->n[g], mh->kk[g], &mh->alpha[g], mh->A[g],
                     CUDA_R_16BF, mh->lda[g], mh->B[g], CUDA_R_16BF, mh->ldb[g], &mh->beta[g], mh->C[g], CUDA_R_32F,
                     mh->ldc[g], CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
      cuda_fail(ci, ANNA_EIO, "cuda: cublasGemmEx (moe expert) failed (status %d)", (int)s);
      return false;
    }
  }
  return true;
}

/* Problem g of a chunk: C[cnt, m] = B[cnt, kk] A[m, kk]^T, row-major, as cuBLAS's column-major
 * C(m x cnt) = A^T B. */
static void moe_host_set(moe_host *mh, int g, int m, int cnt, int kk, const void *A, const void *B, void *C) {
  mh->ta[g] = CUBLAS_OP_T, mh->tb[g] = CUBLAS_OP_N;
  mh->m[g] = m, mh->n[g] = cnt, mh->kk[g] = kk;
  mh->lda[g] = kk, mh->ldb[g] = kk, mh->ldc[g] = m;
  mh->alpha[g] = 1.0f, mh->beta[g] = 0.0f, mh->gsize[g] = 1;
  mh->A[g] = A, mh->B[g] = B, mh->C[g] = C;
}

/* The cuBLAS prefill path; false (nothing queued) when it cannot take these weights or
 * buffers. */
static bool moe_ffn_cublas(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                           const float *wts, int k, const ops_weight *gate, const ops_weight *up,
                           const ops_weight *down, int act, float *scratch, int E) {
  cuda_impl *ci = cuda_impl_of(be);
  if (E < 1 || E > MG_MAX_E || k < 1 || H < 32 || H % 32 != 0 || ci->recording || ((uintptr_t)x & 15) != 0)
    return false;
  const int64_t I = up ? up[0].rows : gate[0].rows / 2;
  if (I < 32 || I % 32 != 0 || gate[0].cols != H || down[0].rows != H || down[0].cols != I ||
      (!up && gate[0].rows != 2 * I) || (up && up[0].cols != H))
    return false;
  const int tg = gate[0].type, tu = up ? up[0].type : tg, td = down[0].type;
  if (!cuda_quant_supported(tg) || !cuda_quant_supported(tu) || !cuda_quant_supported(td) ||
      cuda_gemm_split(ci, tg) || cuda_gemm_split(ci, tu) || cuda_gemm_split(ci, td))
    return false;
  const int64_t nk = n * k;
  if (nk > 0x3fffffff || 2 * I * (int64_t)H > 0x7fffffff) return false;
  /* experts per chunk: as few chunks as the cap allows, balanced */
  const size_t per = (size_t)3 * (size_t)I * (size_t)H * sizeof(__nv_bfloat16);
  int64_t chunk = (int64_t)(ci->moe_deq_cap / per);
  if (chunk < 1) return false;
  if (chunk > E) chunk = E;
  const int64_t nchunks = (E + chunk - 1) / chunk;
  chunk = (E + nchunks - 1) / nchunks;
  if (!moe_deq_reserve(ci, (size_t)chunk * per)) return false; /* no room: the tile kernels need none */
  if (!ci->moe_host && cudaMallocHost(&ci->moe_host, sizeof(moe_host)) != cudaSuccess) {
    (void)cudaGetLastError();
    ci->moe_host = NULL;
    return false;
  }
  moe_host *mh = (moe_host *)ci->moe_host;
  moe_carver sc(scratch, n, k, H, I);
  __nv_bfloat16 *xs = sc.take<__nv_bfloat16>(nk * H * 2), *h = sc.take<__nv_bfloat16>(nk * I * 2);
  float *g = sc.take<float>(nk * 2 * I * 4), *y = sc.take<float>(nk * H * 4);
  const moe_sort so(sc, nk, E, E); /* one "tile" per expert: the tile list is not used here */
  if (!sc.fits()) return false;
  const int32_t *order = so.order, *inv = so.inv, *off = so.off;
  const uint8_t *const *tab = moe_table(be, E, gate, up, down, NULL);
  if (!tab) return false;

  so.launch(ci, idx, E, 0x3fffffff);
  cuda_launch(ci, "moe gather", k_moe_gather_bf16, grid_of(nk * (H / 4)), 256, 0, xs, x, (const int32_t *)order,
              (const int32_t *)off + E, (int64_t)H, k);
  cuda_copy_async(ci, mh->off, off, ((size_t)E + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost, "moe counts");
  if (ci->err || !cuda_check(ci, cudaStreamSynchronize(ci->stream), "moe counts sync")) return true;
  const int64_t rbg = dtype_row_bytes(tg, H), rbu = dtype_row_bytes(tu, H), rbd = dtype_row_bytes(td, I);
  __nv_bfloat16 *deq = (__nv_bfloat16 *)ci->moe_deq;
  for (int e0 = 0; e0 < E && !ci->err; e0 += (int)chunk) {
    const int ec = (int)(E - e0 < chunk ? E - e0 : chunk);
    const int64_t s0 = mh->off[e0], s1 = mh->off[e0 + ec];
    if (s1 == s0) continue;
    cuda_launch(ci, "moe dequant experts", k_moe_deq_experts, grid_of(ec * 3 * I * H / 32), 256, 0, deq, tab,
                (const int32_t *)off, E, e0, ec, (int64_t)H, I, tg, tu, td, rbg, rbu, rbd, up == NULL ? 1 : 0);
    int G = 0;
    for (int j = 0; j < ec; j++) {
      const int64_t a = mh->off[e0 + j], c = mh->off[e0 + j + 1] - a;
      if (c > 0)
        moe_host_set(mh, G++, (int)(2 * I), (int)c, H, deq + (int64_t)j * 3 * I * H, xs + a * H, g + a * 2 * I);
    }
    if (!moe_blas_run(be, mh, G)) return true;
    cuda_launch(ci, "moe act", k_moe_act_bf16, grid_of((s1 - s0) * (I / 2)), 256, 0, h, (const float *)g, s0, s1, I,
                act);
    G = 0;
    for (int j = 0; j < ec; j++) {
      const int64_t a = mh->off[e0 + j], c = mh->off[e0 + j + 1] - a;
      if (c > 0)
        moe_host_set(mh, G++, H, (int)c, (int)I, deq + (int64_t)j * 3 * I * H + 2 * I * H, h + a * I, y + a * H);
    }
    if (!moe_blas_run(be, mh, G)) return true;
  }
  cuda_launch(ci, "moe combine", k_moe_combine, cuda_blocks(n * H, 256), 256, 0, out, (const float *)y,
              (const int32_t *)inv, wts, n, (int64_t)H, k);
  return true;
}

void cuda_op_moe_ffn(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                     const float *wts, int k, int n_experts, const ops_weight *gate, const ops_weight *up,
                     const ops_weight *down, int act, float *scratch) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  if (ci->offload && cuda_offload_moe_ffn(be, out, x, n, H, idx, wts, k, n_experts, gate, up, down, act, scratch))
    return;
  if (n <= CUDA_MOE_DECODE_MAX_TOK &&
      moe_ffn_decode(be, out, x, n, H, idx, wts, k, gate, up, down, act, scratch, n_experts))
    return;
  const int v = ci->moe_variant;
  const bool tiles_only = v == CUDA_MOE_TILES || v == CUDA_MOE_T16 || v == CUDA_MOE_T32 || v == CUDA_MOE_T64;
  if (!ci->exact && v != CUDA_MOE_HOST && !tiles_only &&
      (v == CUDA_MOE_CUBLAS || v == CUDA_MOE_CUBLAS_LOOP || n * k >= (int64_t)MOE_CUBLAS_PAIRS * n_experts) &&
      moe_ffn_cublas(be, out, x, n, H, idx, wts, k, gate, up, down, act, scratch, n_experts))
    return;
  if (!ci->exact && v != CUDA_MOE_HOST &&
      moe_ffn_grouped(be, out, x, n, H, idx, wts, k, gate, up, down, act, scratch, n_experts))
    return;
  /* exact mode (f32 SGEMMs), or weights the grouped path does not take */
  cuda_flush(ci); /* the expert ids are read back mid-op: the rest of a recorded step runs eagerly */
  const int64_t I = up ? up[0].rows : gate[0].rows / 2;
  const int64_t nk = n * k;
  int32_t *hidx = (int32_t *)malloc((size_t)nk * 2 * sizeof(int32_t));
  if (!hidx) {
    cuda_fail(ci, ANNA_ENOMEM, "cuda: out of host memory in moe_ffn");
    return;
  }
  int32_t *order = hidx + nk;
  if (!cuda_check(ci, cudaMemcpyAsync(hidx, idx, (size_t)nk * sizeof(int32_t), cudaMemcpyDeviceToHost, ci->stream),
                  "moe ids") ||
      !cuda_check(ci, cudaStreamSynchronize(ci->stream), "moe ids sync")) {
    free(hidx);
    return;
  }
  int32_t emax = -1;
  for (int64_t i = 0; i < nk; i++) {
    if (hidx[i] < 0) {
      free(hidx);
      cuda_fail(ci, ANNA_ERANGE, "cuda: expert id %d out of range", hidx[i]);
      return;
    }
    emax = hidx[i] > emax ? hidx[i] : emax;
  }
  /* Counting sort of the pairs by expert. */
  int64_t *start = (int64_t *)calloc((size_t)emax + 2, sizeof(int64_t));
  if (!start) {
    free(hidx);
    cuda_fail(ci, ANNA_ENOMEM, "cuda: out of host memory in moe_ffn");
    return;
  }
  for (int64_t i = 0; i < nk; i++) start[hidx[i] + 1]++;
  for (int32_t e = 0; e <= emax; e++) start[e + 1] += start[e];
  {
    int64_t *fill = (int64_t *)malloc(((size_t)emax + 1) * sizeof(int64_t));
    if (!fill) {
      free(hidx);
      free(start);
      cuda_fail(ci, ANNA_ENOMEM, "cuda: out of host memory in moe_ffn");
      return;
    }
    memcpy(fill, start, ((size_t)emax + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < nk; i++) order[fill[hidx[i]]++] = (int32_t)i;
    free(fill);
  }
  const int32_t *dorder = (const int32_t *)cuda_ring_put(be, order, (size_t)nk * sizeof(int32_t));
  float *xs = scratch, *gu = xs + nk * H, *hbuf = gu + nk * 2 * I, *ys = hbuf + nk * I;
  if (dorder) cuda_memset_async(ci, out, (size_t)(n * H) * sizeof(float), "moe memset");
  for (int32_t e = 0; dorder && !ci->err && e <= emax; e++) {
    const int64_t m = start[e + 1] - start[e];
    if (!m) continue;
    const int32_t *ord = dorder + start[e];
    cuda_launch(ci, "moe gather", k_gather, grid_of(m * H), 256, 0, xs, x, ord, m, H, k);
    if (ci->err) break;
    if (up) {
      cuda_op_matmul(be, gu, xs, m, &gate[e], NULL);
      cuda_op_matmul(be, gu + m * I, xs, m, &up[e], NULL);
      cuda_op_act_mul(be, hbuf, gu, gu + m * I, m, (int)I, I, I, act);
    } else {
      cuda_op_matmul(be, gu, xs, m, &gate[e], NULL);
      cuda_op_act_mul(be, hbuf, gu, gu + I, m, (int)I, 2 * I, 2 * I, act);
    }
    cuda_op_matmul(be, ys, hbuf, m, &down[e], NULL);
    if (ci->err) break;
    cuda_launch(ci, "moe scatter", k_scatter_add, grid_of(m * H), 256, 0, out, ys, ord, wts, m, H, k);
  }
  free(start);
  free(hidx);
}
