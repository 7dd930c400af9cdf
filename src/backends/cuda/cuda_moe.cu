/* cuda_moe.cu: router top-k on the device, and the sparse expert FFN.
 *
 * Decode batches (n <= CUDA_GRAPH_MAX_TOK tokens) never leave the device, so MoE decode
 * steps can be captured as graphs: one kernel computes act(gate_e x) * up_e x for every
 * (token, slot) pair reading its expert's rows through a device table of per-expert
 * pointers (built once per layer, kept with the weight mirrors), a second computes
 * out = sum over slots of w * down_e h, each output row written once (no atomics, no
 * memset). Only the selected experts' rows are read.
 * Larger batches read the chosen expert ids back to the host (n * k int32, one sync) to
 * group the (token, slot) pairs by expert; then, per selected expert only, they gather that
 * expert's input rows, run gate/up/act/down through the matmul entry (tensor cores for
 * prefill) and add the weighted rows into out. Experts run one after another on the stream,
 * so the scatter-adds never race. (Running batches through the decode kernels instead, pairs
 * sorted by expert, measured slower on the 35B-A3B shape: 2544 vs 9186 tok/s at 8192 tokens;
 * f32 unit decoding per pair loses to dequantized tiles on tensor cores. A grouped GEMM over
 * all experts in one launch is the next step.) */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_math.cuh"
#include "backends/cuda/cuda_quant.cuh"

#include "base/error.h"
#include "model/config.h"

#include <stdlib.h>
#include <string.h>

/* One warp per token: softmax statistics by warp reductions, then k rounds of a warp
 * argmax (ties to the lower expert id, as the CPU's first-maximum scan). Lane l holds
 * experts l, l + 32, ...; `taken` marks the ones already chosen (E <= 32 * 32). */
static __global__ void k_moe_route(int32_t *idx, float *wts, const float *logits, int64_t n, int E, int k, int renorm,
                                   const float *per_expert) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const int lane = threadIdx.x & 31;
  const int64_t t = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= n) return;
  const float *l = logits + t * E;
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  double sum = 0;
  for (int e = lane; e < E; e += 32) sum += exp((double)l[e] - mx);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  uint32_t taken = 0;
  int32_t *ti = idx + t * k;
  float *tw = wts + t * k;
  float wsum = 0.0f;
  for (int j = 0; j < k; j++) {
    float bv = -INFINITY;
    int be = 0x7fffffff;
    for (int e = lane, q = 0; e < E; e += 32, q++)
      if (!(taken >> q & 1u) && (be == 0x7fffffff || l[e] > bv)) bv = l[e], be = e;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (oe != 0x7fffffff && (be == 0x7fffffff || ov > bv || (ov == bv && oe < be))) bv = ov, be = oe;
    }
    if ((be & 31) == lane) taken |= 1u << (be >> 5);
    const float w = (float)(exp((double)bv - mx) / sum);
    wsum += w;
    if (lane == 0) ti[j] = be, tw[j] = w;
  }
  if (lane == 0) {
    if (renorm)
      for (int j = 0; j < k; j++) tw[j] /= wsum;
    if (per_expert)
      for (int j = 0; j < k; j++) tw[j] *= per_expert[ti[j]];
  }
}

void cuda_op_moe_route(ops_backend *be, int32_t *idx, float *wts, const float *logits, int64_t n, int n_experts, int k,
                       int renorm, const float *per_expert) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  if (k < 1 || k > n_experts || n_experts > 32 * 32) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: top-%d of %d experts not supported (at most 1024 experts)", k, n_experts);
    return;
  }
  const float *pe = per_expert ? (const float *)cuda_mirror(be, per_expert, (size_t)n_experts * sizeof(float)) : NULL;
  if (per_expert && !pe) return;
  cuda_launch_pdl(ci, "moe_route", k_moe_route, cuda_blocks(n * 32, 128), 128, 0, idx, wts, logits, n, n_experts, k,
                  renorm, pe);
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

/* ---- decode: device-side expert FFN ---- */

#define MOE_WARPS 4

__device__ __forceinline__ float moe_act(float g, int act) {
  return act == ACT_KIND_GELU_TANH ? cuda_gelu_tanh(g) : cuda_silu(g);
}

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
    cuda_deq32(type, row, u, w);
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
        cuda_deq32(tg, gr, c, wg);
        cuda_deq32(tur, ur, c, wu);
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
      cuda_deq32(td, tab[2 * E + e] + r * rbd, u, w);
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

/* The layer's device table of expert row pointers ([gate E][up E][down E]), built on first
 * use and kept under the host address of the gate array. NULL when the experts of one matrix
 * differ in type or shape, or a type this path cannot read (the caller falls back). */
static const uint8_t *const *moe_table(ops_backend *be, int E, const ops_weight *gate, const ops_weight *up,
                                       const ops_weight *down) {
  const void *hit = cuda_mirror_find(be, gate);
  if (hit) return (const uint8_t *const *)hit;
  const ops_weight *mats[3] = {gate, up, down};
  for (int m = 0; m < 3; m++) {
    if (!mats[m]) continue;
    const int ty = mats[m][0].type;
    if (!cuda_float_type(ty) && !(cuda_quant_supported(ty) && mats[m][0].cols % 32 == 0)) return NULL;
    for (int e = 1; e < E; e++)
      if (mats[m][e].type != ty || mats[m][e].rows != mats[m][0].rows || mats[m][e].cols != mats[m][0].cols)
        return NULL;
  }
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
  const void *d = cuda_mirror_keyed(be, gate, t, (size_t)3 * E * sizeof *t);
  free(t);
  return (const uint8_t *const *)d;
}

/* The decode path; false when it cannot take these weights (nothing queued). */
static bool moe_ffn_decode(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                           const float *wts, int k, const ops_weight *gate, const ops_weight *up,
                           const ops_weight *down, int act, float *scratch, int E) {
  cuda_impl *ci = cuda_impl_of(be);
  const int64_t I = up ? up[0].rows : gate[0].rows / 2;
  if (((uintptr_t)x & 15) != 0 || H % 4 != 0 || I % 4 != 0 || down[0].rows != H || down[0].cols != I ||
      gate[0].cols != H)
    return false;
  const uint8_t *const *tab = moe_table(be, E, gate, up, down);
  if (!tab) return false;
  const int tg = gate[0].type, tu = up ? up[0].type : tg, td = down[0].type;
  const int64_t rbg = dtype_row_bytes(tg, H), rbu = dtype_row_bytes(tu, H), rbd = dtype_row_bytes(td, I);
  float *h = scratch; /* n * k * I floats: within ops_moe_scratch_floats */
  cuda_launch_pdl(ci, "moe gate/up", k_moe_gate_up,
                  dim3((unsigned)((I + MOE_WARPS - 1) / MOE_WARPS), (unsigned)(n * k)), 32 * MOE_WARPS, 0, h, x, H, I,
                  idx, k, E, tab, tg, tu, rbg, rbu, up == NULL, act);
  if (ci->err) return true;
  cuda_launch_pdl(ci, "moe down", k_moe_down, dim3((unsigned)((H + MOE_WARPS - 1) / MOE_WARPS), (unsigned)n),
              32 * MOE_WARPS, 0, out, h, H, I, idx, wts, k, E, tab, td, rbd);
  return true;
}

void cuda_op_moe_ffn(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                     const float *wts, int k, int n_experts, const ops_weight *gate, const ops_weight *up,
                     const ops_weight *down, int act, float *scratch) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  if (n <= CUDA_GRAPH_MAX_TOK &&
      moe_ffn_decode(be, out, x, n, H, idx, wts, k, gate, up, down, act, scratch, n_experts))
    return;
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
