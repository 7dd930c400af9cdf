/* cuda_route.cuh: the MoE router's top-k for one token, as a warp-level device function.
 *
 * Contract: cuda_route_token<NE>(...) is called by all 32 lanes of one warp (E <= 32 * NE,
 * 1 <= k <= 32) and writes idx[k] / wts[k] of the token whose logits row is l: the same
 * values, bit for bit, wherever it runs (k_moe_route in cuda_moe.cu, one warp per token, and
 * the plain matvec group of cuda_matmul.cu, whose last block routes the logits it produced).
 * The logits are read with ld.global.cg (L2): in the fused form they were written by other
 * blocks of the same grid, which this SM's L1 may not see.
 *
 * Lane l holds experts l, l + 32, ... in registers (NE of them); `taken` marks the ones
 * already chosen. Each of the k rounds is a warp maximum of the lanes' best remaining logits
 * and a warp minimum of the ids that reach it (ties to the lower expert id, as the CPU's
 * first-maximum scan): two redux instructions, where a shuffle tree of (value, id) pairs per
 * round, over logits re-read from memory, made the route 8.6 us for top-8 of 256, longer
 * than the expert products it feeds. Lane j keeps round j's pick; the k probabilities (the
 * CPU's double softmax sums) are then computed side by side. */
#ifndef ANNA_BACKENDS_CUDA_ROUTE_CUH
#define ANNA_BACKENDS_CUDA_ROUTE_CUH

#include "backends/cuda/cuda_math.cuh"

#include <stdint.h>

/* Orderable bits of a float: unsigned comparison of the keys is float comparison. */
static __device__ __forceinline__ uint32_t cuda_route_key(float v) {
  const uint32_t u = __float_as_uint(v);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}
static __device__ __forceinline__ float cuda_route_val(uint32_t k) {
  return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k);
}

template <int NE>
static __device__ __forceinline__ void cuda_route_token(int32_t *idx, float *wts, const float *l, int E, int k,
                                                        int renorm, const float *per_expert, int lane) {
  float v[NE];
  float mx = -INFINITY;
#pragma unroll
  for (int q = 0; q < NE; q++) {
    const int e = lane + 32 * q;
    v[q] = e < E ? __ldcg(l + e) : -INFINITY;
    mx = fmaxf(mx, v[q]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  double sum = 0;
#pragma unroll
  for (int q = 0; q < NE; q++)
    if (lane + 32 * q < E) sum += exp((double)v[q] - mx);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  uint32_t taken = 0;
  float mine = -INFINITY; /* lane j: round j's logit and expert */
  int mine_e = -1;
  for (int j = 0; j < k; j++) {
    uint32_t bk = 0, bid = 0xffffffffu;
#pragma unroll
    for (int q = 0; q < NE; q++) /* ascending ids: a strict > keeps the lowest of equals */
      if (lane + 32 * q < E && !(taken >> q & 1u) && (bid == 0xffffffffu || cuda_route_key(v[q]) > bk))
        bk = cuda_route_key(v[q]), bid = (uint32_t)(lane + 32 * q);
    const uint32_t gk = __reduce_max_sync(0xffffffffu, bid == 0xffffffffu ? 0u : bk);
    const uint32_t ge = __reduce_min_sync(0xffffffffu, bid != 0xffffffffu && bk == gk ? bid : 0xffffffffu);
    if ((int)(ge & 31) == lane) taken |= 1u << (ge >> 5);
    if (lane == j) mine = cuda_route_val(gk), mine_e = (int)ge;
  }
  const float w = lane < k ? (float)(exp((double)mine - mx) / sum) : 0.0f;
  float wsum = w;
  for (int o = 16; o > 0; o >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, o);
  if (lane < k) {
    float o = renorm ? w / wsum : w;
    if (per_expert) o *= per_expert[mine_e];
    idx[lane] = mine_e, wts[lane] = o;
  }
}

/* The shared-expert slot after a token's k routed ones (matmul_group_route's shared): expert
 * E with weight sigmoid(*sh), the gate mul_sigmoid applies (the logit read from L2, as the
 * router's). One lane writes it. */
static __device__ __forceinline__ void cuda_route_shared_slot(int32_t *idx, float *wts, const float *sh, int E,
                                                              int lane) {
  if (lane == 0) *idx = E, *wts = cuda_sigmoid(__ldcg(sh));
}

#endif
