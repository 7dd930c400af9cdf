/* cuda_moe_decode.cu: the MoE expert FFN of decode batches (n <= CUDA_MOE_DECODE_MAX_TOK tokens),
 * entirely on the device so decode steps can be captured as graphs (cuda_moe.cu's header
 * describes the scheme): the f32 kernels (k_moe_gate_up, k_moe_down) and, with exact mode
 * off, the dp4a kernels on int8 activations; the per-layer table of expert pointers
 * (moe_table) and the path's entry point moe_ffn_decode (cuda_moe.cuh), which cuda_op_moe_ffn
 * calls first. */
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

/* ---- decode: device-side expert FFN ---- */

#define MOE_WARPS 4

/* This lane's share of row . x (cols elements; the caller reduces over the warp). Quantized
 * rows go by 32-element units (cols % 32 == 0), float rows by elements. */
__device__ __forceinline__ float moe_lane_dot(int type, const uint8_t *row, const float *x, int64_t cols, int lane) {
  float acc = 0.0f;
  if (cuda_float_type(type)) {
    for (int64_t c = lane; c < cols; c += 32) acc += cuda_ldw(type, row, c) * x[c];
    return acc;
  }
  for (int64_t u = lane; u < cols / 32; u += 32) {
    float w[32];
    moe_deq32_fast(type, row, u, w);
    const float4 *xu = (const float4 *)(x + u * 32);
#pragma unroll
    for (int q = 0; q < 8; q++) {
      const float4 v = xu[q];
      acc += w[4 * q] * v.x + w[4 * q + 1] * v.y + w[4 * q + 2] * v.z + w[4 * q + 3] * v.w;
    }
  }
  return acc;
}

/* h[p, i] = act(gate_e[i] . x_t) * (up_e[i] . x_t) for pair p = t * k + j, e = idx[p];
 * grid (ceil(I / MOE_WARPS), n * k), one warp per row. tab: [gate E][up E][down E]
 * device row pointers; fused: gate_e holds 2I rows (gate, then up). */
static __global__ void k_moe_gate_up(float *h, const float *x, int64_t H, int64_t I, const int32_t *idx, int k, int E,
                                     const uint8_t *const *tab, int tg, int tu, int64_t rbg, int64_t rbu, int fused,
                                     int act) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const int lane = threadIdx.x & 31;
  const int64_t p = blockIdx.y, i = (int64_t)blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
  if (i >= I) return;
  const int e = idx[p];
  float g = 0.0f, u = 0.0f;
  if (e >= 0 && e < E) { /* an id out of range (never from moe_route) contributes nothing */
    const float *xt = x + (p / k) * H;
    const uint8_t *G = tab[e];
    const uint8_t *gr = G + i * rbg, *ur = fused ? G + (I + i) * rbg : tab[E + e] + i * rbu;
    const int tur = fused ? tg : tu;
    if (!cuda_float_type(tg) && !cuda_float_type(tur)) {
      /* gate and up units of one step decoded together: their weight loads are in flight at
       * once instead of a chain per row (unrolling further spills: cuda_deq32 takes any type) */
#pragma unroll 1
      for (int64_t c = lane; c < H / 32; c += 32) {
        float wg[32], wu[32];
        moe_deq32_fast(tg, gr, c, wg);
        moe_deq32_fast(tur, ur, c, wu);
        const float4 *xu = (const float4 *)(xt + c * 32);
#pragma unroll
        for (int q = 0; q < 8; q++) {
          const float4 v = xu[q];
          g += wg[4 * q] * v.x + wg[4 * q + 1] * v.y + wg[4 * q + 2] * v.z + wg[4 * q + 3] * v.w;
          u += wu[4 * q] * v.x + wu[4 * q + 1] * v.y + wu[4 * q + 2] * v.z + wu[4 * q + 3] * v.w;
        }
      }
    } else {
      g = moe_lane_dot(tg, gr, xt, H, lane);
      u = moe_lane_dot(tur, ur, xt, H, lane);
    }
    g = cuda_warp_sum(g);
    u = cuda_warp_sum(u);
  }
  if (lane == 0) h[p * I + i] = e >= 0 && e < E ? moe_act(g, act) * u : 0.0f;
}

/* out[t, r] = sum_j wts[t * k + j] * (down_e[r] . h[t * k + j]); grid (ceil(H / MOE_WARPS),
 * n), one warp per output row: every row written exactly once. */
static __global__ void k_moe_down(float *out, const float *h, int64_t H, int64_t I, const int32_t *idx,
                                  const float *wts, int k, int E, const uint8_t *const *tab, int td, int64_t rbd) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const int lane = threadIdx.x & 31;
  const int64_t t = blockIdx.y, r = (int64_t)blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
  if (r >= H) return;
  float acc = 0.0f;
  if (!cuda_float_type(td)) {
    /* The k experts' 32-element units of this row spread over all lanes at once (with I = 512
     * a lane per unit would idle half the warp and walk the experts one after the other: a
     * chain of k dependent loads); unrolled so a lane's loads are in flight together. */
    const int units = (int)(I / 32), items = k * units;
#pragma unroll 4
    for (int it = lane; it < items; it += 32) {
      const int j = it / units, u = it - j * units;
      const int64_t p = t * k + j;
      const int e = idx[p];
      if (e < 0 || e >= E) continue;
      float w[32];
      moe_deq32_fast(td, tab[2 * E + e] + r * rbd, u, w);
      const float4 *hu = (const float4 *)(h + p * I + (int64_t)u * 32);
      float s = 0.0f;
#pragma unroll
      for (int q = 0; q < 8; q++) {
        const float4 v = hu[q];
        s += w[4 * q] * v.x + w[4 * q + 1] * v.y + w[4 * q + 2] * v.z + w[4 * q + 3] * v.w;
      }
      acc += wts[p] * s;
    }
  } else {
    for (int j = 0; j < k; j++) {
      const int64_t p = t * k + j;
      const int e = idx[p];
      if (e < 0 || e >= E) continue;
      acc += wts[p] * moe_lane_dot(td, tab[2 * E + e] + r * rbd, h + p * I, I, lane);
    }
  }
  acc = cuda_warp_sum(acc);
  if (lane == 0) out[t * H + r] = acc;
}

/* ---- decode with int8 activations (exact off) ----
 * The same outputs and grids as k_moe_gate_up / k_moe_down, with cuda_q8act.cuh's int8
 * activations: the accuracy bound of the dense int8 matvec (test_matvec_int8) holds for each
 * of the two products. The expert ids come from the router (an earlier kernel), so unlike
 * k_matvec_q8 no weight address is known before cuda_pdl_enter; the first weight loads are
 * issued right after the ids are read, before the block quantizes its activations, so the
 * two latencies overlap. Out-of-range ids contribute nothing, as in the f32 kernels. */
#define MOEQ_WARPS 8
#define MOEQ_DU 2 /* down: items per lane per stage (two stages in flight: 4 pieces per lane) */

/* h[p, i] = act(gate_e[i] . x_t) * (up_e[i] . x_t), p = t * k + j, e = idx[p]; grid
 * (ceil(I / MOEQ_WARPS), n * k), one warp per i: its gate and up rows, lane l on pieces l,
 * l + 32, ... of both (consecutive lanes on consecutive pieces: coalesced), the next
 * pieces' loads issued before the current ones are decoded. Shared memory: x_t as one span
 * of H (cuda_q8act_smem(H)). gate and up rows are of type TYPE (fused: gate_e holds 2I rows,
 * gate then up), rows rb bytes. */
template <int TYPE>
static __global__ void __launch_bounds__(32 * MOEQ_WARPS)
    k_moe_gate_up_q8(float *h, const float *x, int64_t H, int64_t I, const int32_t *idx, int k, int E,
                     const uint8_t *const *tab, int64_t rb, int fused, int act) {
  constexpr int RAW = cuda_piece<TYPE>::RAW, NW = cuda_q8p<TYPE>::NW;
  extern __shared__ __align__(16) uint8_t moeq_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t p = blockIdx.y, i = (int64_t)blockIdx.x * MOEQ_WARPS + warp;
  cuda_pdl_enter(); /* launched by cuda_launch_pdl: idx and x are written by earlier kernels */
  const int e = idx[p];
  if (e < 0 || e >= E) { /* the whole block (one pair): zero rows, no barrier reached */
    if (lane == 0 && i < I) h[p * I + i] = 0.0f;
    return;
  }
  const int ncol = (int)H, nb = ncol / 32, pieces = ncol / 32;
  uint8_t *xq = moeq_smem;
  float *xd = (float *)(moeq_smem + ncol), *xs = xd + ((nb + 1) & ~1);
  const bool active = i < I;
  const int64_t ir = active ? i : I - 1; /* a warp past I loads nothing; its row stays in bounds */
  const uint8_t *row[2] = {tab[e] + ir * rb, fused ? tab[e] + (I + ir) * rb : tab[E + e] + ir * rb};
  uint32_t raw[2][RAW];
  if (active && lane < pieces) {
#pragma unroll
    for (int r = 0; r < 2; r++) cuda_piece_load<TYPE>(row[r], lane, lane == pieces - 1, raw[r]);
  }
  const float *xt = x + (p / k) * H;
  cuda_q8act_quantize<TYPE, 4, MOEQ_WARPS>(
      [&](int blk, int m) -> float4 { return *(const float4 *)(xt + (int64_t)blk * 32 + 4 * m); }, nb, xq, xd,
      xs, warp, lane);
  __syncthreads();
  if (!active) return;
  float acc[2] = {0.0f, 0.0f};
  const int iters = (pieces + 31) / 32;
  for (int it = 0; it < iters; it++) {
    const int pc = it * 32 + lane, pn = pc + 32;
    uint32_t nxt[2][RAW];
    if (pn < pieces) {
#pragma unroll
      for (int r = 0; r < 2; r++) cuda_piece_load<TYPE>(row[r], pn, pn == pieces - 1, nxt[r]);
    }
    if (pc < pieces) {
      int a[8];
      float dx[2], sx[2];
      cuda_q8act_fetch<TYPE>(xq, xd, xs, (int)cuda_q8_e0<TYPE>(pc), a, dx, sx);
#pragma unroll
      for (int r = 0; r < 2; r++) { /* one row at a time: only its decoded words are live */
        int wq[NW];
        float sc[2], mn[2];
        cuda_q8_decode<TYPE>(row[r], pc, raw[r], wq, sc, mn);
        acc[r] += cuda_q8act_dot<TYPE>(wq, sc, mn, a, dx, sx);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
      for (int w = 0; w < RAW; w++) raw[r][w] = nxt[r][w];
  }
  const float g = cuda_warp_sum(acc[0]), u = cuda_warp_sum(acc[1]);
  if (lane == 0) h[p * I + i] = moe_act(g, act) * u;
}

/* out[t, r] = sum_j wts[t * k + j] * (down_e[r] . h[t * k + j]); grid (ceil(H / MOEQ_WARPS),
 * n), one warp per output row r: every row written exactly once, no atomics. Shared memory:
 * the k rows h[t * k .. t * k + k - 1] (contiguous) as one span of k * I, slot j at j * I. The
 * row's work is k * P items (P = I / 32 pieces per expert row), item q = slot q / P, piece
 * q % P, lane l taking items l, l + 32, ... (with I = 512 a lane per expert row would idle
 * half the warp), MOEQ_DU items per stage, the next stage's loads issued before the current
 * one is decoded. */
template <int TYPE>
static __global__ void __launch_bounds__(32 * MOEQ_WARPS)
    k_moe_down_q8(float *out, const float *h, int64_t H, int64_t I, const int32_t *idx, const float *wts, int k,
                  int E, const uint8_t *const *tab, int64_t rb) {
  constexpr int RAW = cuda_piece<TYPE>::RAW, NW = cuda_q8p<TYPE>::NW, DU = MOEQ_DU;
  extern __shared__ __align__(16) uint8_t moeq_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = blockIdx.y, r = (int64_t)blockIdx.x * MOEQ_WARPS + warp;
  const int P = (int)(I / 32), items = k * P, len = k * (int)I, nb = len / 32;
  uint8_t *xq = moeq_smem;
  float *xd = (float *)(moeq_smem + len), *xs = xd + ((nb + 1) & ~1);
  const bool active = r < H;
  const int32_t *ti = idx + t * k;
  cuda_pdl_enter(); /* launched by cuda_launch_pdl: idx, wts and h are written by earlier kernels */
  /* Stage s's items of this lane: row (NULL: no item, or an id out of range), piece, slot. */
  auto locate = [&](int s, const uint8_t **row, int *pc, int *j) {
#pragma unroll
    for (int u = 0; u < DU; u++) {
      const int q = (s * DU + u) * 32 + lane;
      row[u] = NULL, pc[u] = 0, j[u] = 0;
      if (active && q < items) {
        const int jj = q / P, e = ti[jj];
        j[u] = jj, pc[u] = q - jj * P;
        if (e >= 0 && e < E) row[u] = tab[2 * E + e] + r * rb;
      }
    }
  };
  const uint8_t *row[DU];
  int pc[DU], js[DU];
  uint32_t raw[DU][RAW];
  locate(0, row, pc, js);
#pragma unroll
  for (int u = 0; u < DU; u++)
    if (row[u]) cuda_piece_load<TYPE>(row[u], pc[u], pc[u] == P - 1, raw[u]);
  const float *ht = h + t * len;
  cuda_q8act_quantize<TYPE, 4, MOEQ_WARPS>(
      [&](int blk, int m) -> float4 { return *(const float4 *)(ht + (int64_t)blk * 32 + 4 * m); }, nb, xq, xd,
      xs, warp, lane);
  __syncthreads();
  if (!active) return;
  float acc = 0.0f;
  const int stages = (items + 32 * DU - 1) / (32 * DU);
  for (int s = 0; s < stages; s++) {
    const uint8_t *row2[DU];
    int pc2[DU], js2[DU];
    uint32_t nxt[DU][RAW];
    locate(s + 1, row2, pc2, js2); /* past the last stage: no items */
#pragma unroll
    for (int u = 0; u < DU; u++)
      if (row2[u]) cuda_piece_load<TYPE>(row2[u], pc2[u], pc2[u] == P - 1, nxt[u]);
#pragma unroll
    for (int u = 0; u < DU; u++) {
      if (!row[u]) continue;
      int a[8], wq[NW];
      float dx[2], sx[2], sc[2], mn[2];
      cuda_q8act_fetch<TYPE>(xq, xd, xs, js[u] * (int)I + (int)cuda_q8_e0<TYPE>(pc[u]), a, dx, sx);
      cuda_q8_decode<TYPE>(row[u], pc[u], raw[u], wq, sc, mn);
      acc += wts[t * k + js[u]] * cuda_q8act_dot<TYPE>(wq, sc, mn, a, dx, sx);
    }
#pragma unroll
    for (int u = 0; u < DU; u++) {
      row[u] = row2[u], pc[u] = pc2[u], js[u] = js2[u];
#pragma unroll
      for (int w = 0; w < RAW; w++) raw[u][w] = nxt[u][w];
    }
  }
  acc = cuda_warp_sum(acc);
  if (lane == 0) out[t * H + r] = acc;
}

/* The layer's device table of expert row pointers ([gate E][up E][down E]), built on first
 * use and kept under the host address of the gate array. NULL when the experts of one matrix
 * differ in type or shape, or a type this path cannot read (the caller falls back). aligned
 * (may be NULL): every pointer in the table is 16-byte aligned, as the int8 kernels' piece
 * loads need (cudaMalloc'd mirrors are; a weight that already is device memory is used as
 * is and may not be). That is known when the table is built and kept as a marker entry
 * under the host address &gate->data (a field of the model's array, never itself a mirror
 * key), so a cached table costs one more lookup, not a pass over the pointers. */
bool moe_decode_types_ok(int E, const ops_weight *gate, const ops_weight *up, const ops_weight *down) {
  const ops_weight *mats[3] = {gate, up, down};
  for (int m = 0; m < 3; m++) {
    if (!mats[m]) continue;
    const int ty = mats[m][0].type;
    if (!cuda_float_type(ty) && !(cuda_quant_supported(ty) && mats[m][0].cols % 32 == 0)) return false;
    for (int e = 1; e < E; e++)
      if (mats[m][e].type != ty || mats[m][e].rows != mats[m][0].rows || mats[m][e].cols != mats[m][0].cols)
        return false;
  }
  return true;
}

const uint8_t *const *moe_table(ops_backend *be, int E, const ops_weight *gate, const ops_weight *up,
                                const ops_weight *down, bool *aligned) {
  const void *hit = cuda_mirror_find(be, gate);
  if (hit) {
    if (aligned) *aligned = cuda_mirror_find(be, &gate->data) != NULL;
    return (const uint8_t *const *)hit;
  }
  if (aligned) *aligned = false;
  const ops_weight *mats[3] = {gate, up, down};
  if (!moe_decode_types_ok(E, gate, up, down)) return NULL;
  const uint8_t **t = (const uint8_t **)calloc((size_t)3 * E, sizeof *t);
  if (!t) return NULL;
  for (int m = 0; m < 3; m++) {
    if (!mats[m]) continue;
    const size_t bytes = (size_t)(dtype_row_bytes(mats[m][0].type, mats[m][0].cols) * mats[m][0].rows);
    for (int e = 0; e < E; e++)
      if (!(t[m * E + e] = (const uint8_t *)cuda_mirror(be, mats[m][e].data, bytes))) {
        free(t);
        return NULL;
      }
  }
  uintptr_t low = 0;
  for (int i = 0; i < 3 * E; i++) low |= (uintptr_t)t[i];
  const void *d = cuda_mirror_keyed(be, gate, t, (size_t)3 * E * sizeof *t);
  free(t);
  if (d && (low & 15) == 0) {
    const uint8_t one = 1;
    if (!cuda_mirror_keyed(be, &gate->data, &one, 1)) return NULL;
    if (aligned) *aligned = true;
  }
  return (const uint8_t *const *)d;
}

#define MOEQ_SMEM_MAX (48 * 1024) /* the default dynamic shared-memory limit: no opt-in needed */
/* The types with an int8 piece decoder (cuda_q8_decode). */
#define MOEQ_TYPES(X) \
  X(ANNA_DTYPE_Q4_0) X(ANNA_DTYPE_IQ4_NL) X(ANNA_DTYPE_IQ4_XS) X(ANNA_DTYPE_Q8_0) X(ANNA_DTYPE_Q4_K) \
  X(ANNA_DTYPE_Q5_K) X(ANNA_DTYPE_Q6_K) X(ANNA_DTYPE_IQ2_XXS) X(ANNA_DTYPE_IQ2_XS) X(ANNA_DTYPE_IQ2_S) \
  X(ANNA_DTYPE_IQ3_XXS) X(ANNA_DTYPE_IQ3_S)

static bool moeq_type(int t) {
  switch (t) {
#define MOEQ_IS(T) case T:
    MOEQ_TYPES(MOEQ_IS)
#undef MOEQ_IS
    return true;
  default: return false;
  }
}

/* Queues the int8 gate/up (down) kernel for type t, one of MOEQ_TYPES. */
static void moeq_gate_up(cuda_impl *ci, int t, dim3 grid, size_t sm, float *h, const float *x, int64_t H, int64_t I,
                         const int32_t *idx, int k, int E, const uint8_t *const *tab, int64_t rb, int fused, int act) {
  switch (t) {
#define MOEQ_GU(T)                                                                                                   \
  case T:                                                                                                            \
    cuda_launch_pdl(ci, "moe gate/up q8", k_moe_gate_up_q8<T>, grid, 32 * MOEQ_WARPS, sm, h, x, H, I, idx, k, E, tab, \
                    rb, fused, act);                                                                                 \
    break;
    MOEQ_TYPES(MOEQ_GU)
#undef MOEQ_GU
  default: break;
  }
}
static void moeq_down(cuda_impl *ci, int t, dim3 grid, size_t sm, float *out, const float *h, int64_t H, int64_t I,
                      const int32_t *idx, const float *wts, int k, int E, const uint8_t *const *tab, int64_t rb) {
  switch (t) {
#define MOEQ_DN(T)                                                                                                   \
  case T:                                                                                                            \
    cuda_launch_pdl(ci, "moe down q8", k_moe_down_q8<T>, grid, 32 * MOEQ_WARPS, sm, out, h, H, I, idx, wts, k, E, tab, \
                    rb);                                                                                             \
    break;
    MOEQ_TYPES(MOEQ_DN)
#undef MOEQ_DN
  default: break;
  }
}

/* The decode path; false when it cannot take these weights (nothing queued). */
bool moe_ffn_decode(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                    const float *wts, int k, const ops_weight *gate, const ops_weight *up,
                    const ops_weight *down, int act, float *scratch, int E) {
  const int64_t I = up ? up[0].rows : gate[0].rows / 2;
  if (((uintptr_t)x & 15) != 0 || H % 4 != 0 || I % 4 != 0 || down[0].rows != H || down[0].cols != I ||
      gate[0].cols != H)
    return false;
  bool aligned = false;
  const uint8_t *const *tab = moe_table(be, E, gate, up, down, &aligned);
  if (!tab) return false;
  return moe_ffn_decode_tab(be, out, x, n, H, idx, wts, k, gate, up, down, act, scratch, E, tab, aligned);
}

bool moe_ffn_decode_tab(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                        const float *wts, int k, const ops_weight *gate, const ops_weight *up, const ops_weight *down,
                        int act, float *scratch, int E, const uint8_t *const *tab, bool aligned) {
  cuda_impl *ci = cuda_impl_of(be);
  const int64_t I = up ? up[0].rows : gate[0].rows / 2;
  if (((uintptr_t)x & 15) != 0 || H % 4 != 0 || I % 4 != 0 || down[0].rows != H || down[0].cols != I ||
      gate[0].cols != H)
    return false;
  const int tg = gate[0].type, tu = up ? up[0].type : tg, td = down[0].type;
  const int64_t rbg = dtype_row_bytes(tg, H), rbu = dtype_row_bytes(tu, H), rbd = dtype_row_bytes(td, I);
  float *h = scratch; /* n * k * I floats: within ops_moe_scratch_floats */
  /* int8 activations: each side on its own (h is f32 between them); both need 16-byte
   * aligned rows (piece loads) and activations (float4 loads: x checked above, h here) */
  const bool q8 = !ci->exact && aligned && ((uintptr_t)h & 15) == 0;
  const size_t smg = cuda_q8act_smem(H), smd = cuda_q8act_smem((int64_t)k * I);
  if (q8 && tu == tg && moeq_type(tg) && H % dtype_block_size(tg) == 0 && smg <= MOEQ_SMEM_MAX)
    moeq_gate_up(ci, tg, dim3((unsigned)((I + MOEQ_WARPS - 1) / MOEQ_WARPS), (unsigned)(n * k)), smg, h, x, H, I, idx,
                 k, E, tab, rbg, up == NULL, act);
  else
    cuda_launch_pdl(ci, "moe gate/up", k_moe_gate_up,
                    dim3((unsigned)((I + MOE_WARPS - 1) / MOE_WARPS), (unsigned)(n * k)), 32 * MOE_WARPS, 0, h, x, H,
                    I, idx, k, E, tab, tg, tu, rbg, rbu, up == NULL, act);
  if (ci->err) return true;
  if (q8 && moeq_type(td) && I % dtype_block_size(td) == 0 && I % 32 == 0 && smd <= MOEQ_SMEM_MAX)
    moeq_down(ci, td, dim3((unsigned)((H + MOEQ_WARPS - 1) / MOEQ_WARPS), (unsigned)n), smd, out, h, H, I, idx, wts, k,
              E, tab, rbd);
  else
    cuda_launch_pdl(ci, "moe down", k_moe_down, dim3((unsigned)((H + MOE_WARPS - 1) / MOE_WARPS), (unsigned)n),
                    32 * MOE_WARPS, 0, out, h, H, I, idx, wts, k, E, tab, td, rbd);
  return true;
}
