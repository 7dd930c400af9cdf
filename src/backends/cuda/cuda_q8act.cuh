/* cuda_q8act.cuh: int8 activations in shared memory for the dp4a decode kernels (the dense
 * matvec k_matvec_q8 in cuda_matmul.cu and the MoE expert kernels in cuda_moe.cu), so both
 * quantize, fetch and dot with the same arithmetic. Static device code only.
 *
 * A span of len activations (len % 32 == 0, nb = len / 32 blocks) is held as: len int8 in
 * 16-byte chunks, swizzled by q8_chunk<TYPE> (physical chunk of logical chunk c); nb f32
 * block scales xd (max|x| / 127), rounded up to an even count; 2 nb f32 run sums xs (scale *
 * sum q over each 16-element run). cuda_q8act_smem gives the bytes. Element f of the span is
 * its flat index: a kernel that keeps several rows (tokens, expert slots) in one span adds
 * row * row_len, and the piece fetches below need that row offset to be a multiple of 64
 * elements for the K-quants (their paired scales are read as one float2) and of 32 for the
 * others. IQ4 types store each 32-block interleaved (cuda_q8_interleaved). */
#ifndef ANNA_BACKENDS_CUDA_Q8ACT_CUH
#define ANNA_BACKENDS_CUDA_Q8ACT_CUH

#include "backends/cuda/cuda_quant.cuh"

#include <stdint.h>

/* dp4a accumulators start at the bits of 1.5 * 2^23, so the integer sum (|sum| < 2^22: at
 * most 32 * 127 * 127) turns into a float with one subtraction (no I2F, a quarter-rate
 * instruction). */
#define MVQ8_MAGIC 0x4B400000 /* 12582912.0f: 2^23 + 2^22 */

/* Shared-memory bytes of a span of len activations. */
static inline size_t cuda_q8act_smem(int64_t len) {
  const int64_t nb = len / 32;
  return (size_t)(len + 4 * ((nb + 1) & ~(int64_t)1) + 8 * nb);
}

/* Physical 16-byte chunk of logical chunk c. The 32-element formats read chunks 2p, 2p + 1
 * in lanes p = 0..7 of a quarter-warp: flipping bit 0 where bit 3 is set makes their
 * chunks distinct mod 8 (8 chunks = the 32 banks). Q4_K/Q5_K lanes k = 0..7 of a block read
 * chunks 4 (k / 2) + k % 2 (+ 2 for run 1): flipping bit 1 where bit 3 is set does the same;
 * Q6_K lanes read chunks 8 (k / 4) + k % 4 (+ 4): flipping bit 2.
 * SW 1 (the one-token Q4_K matvec, cuda_q8act_fetch64): consecutive lanes read the 4 chunks
 * of consecutive 64-element groups g, chunk i of each at a time; flipping the low two bits by
 * bits 3-4 (g / 2 mod 4) puts the 8 lanes of a quarter-warp on 8 distinct bank groups. */
template <int TYPE, int SW = 0> __device__ __forceinline__ int q8_chunk(int c) {
  if constexpr (SW == 1) return c ^ ((c >> 3) & 3);
  else if constexpr (TYPE == ANNA_DTYPE_Q4_K || TYPE == ANNA_DTYPE_Q5_K) return c ^ (((c >> 3) & 1) << 1);
  else if constexpr (TYPE == ANNA_DTYPE_Q6_K) return c ^ (((c >> 3) & 1) << 2);
  else return c ^ ((c >> 3) & 1);
}

/* Quantizes the U blocks of one warp step into (xq, xd, xs): v[u] holds elements
 * 4m..4m+3 (m = lane % 8) of block b0 + u * 4 * WARPS + lane / 8, zeros past nb. 8 lanes per
 * 32-block, 4 blocks per warp step; every lane takes part in the shuffles, only blocks < nb
 * are stored. */
template <int TYPE, int U, int WARPS, int SW = 0>
__device__ __forceinline__ void cuda_q8act_store(const float4 *v, int b0, int nb, uint8_t *xq, float *xd, float *xs,
                                                 int lane) {
  const int m = lane & 7;
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int blk = b0 + u * 4 * WARPS + (lane >> 3);
    float am = fmaxf(fmaxf(fabsf(v[u].x), fabsf(v[u].y)), fmaxf(fabsf(v[u].z), fabsf(v[u].w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    const float d = am * (1.0f / 127.0f), inv = am > 0.0f ? 127.0f / am : 0.0f;
    const int q0 = max(-127, min(127, __float2int_rn(v[u].x * inv)));
    const int q1 = max(-127, min(127, __float2int_rn(v[u].y * inv)));
    const int q2 = max(-127, min(127, __float2int_rn(v[u].z * inv)));
    const int q3 = max(-127, min(127, __float2int_rn(v[u].w * inv)));
    const uint32_t wv = __byte_perm(__byte_perm(q0, q1, 0x0040), __byte_perm(q2, q3, 0x0040), 0x5410);
    int s = q0 + q1 + q2 + q3;
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    int pos; /* byte of this lane's word in the block */
    uint32_t ov = wv;
    if constexpr (cuda_q8_interleaved<TYPE>()) {
      /* lanes m and m + 4 hold elements 4m.. and 16 + 4m..: each writes one word of their
       * interleaved 8 bytes */
      const uint32_t pv = __shfl_xor_sync(0xffffffffu, wv, 4);
      ov = m < 4 ? __byte_perm(wv, pv, 0x5140) : __byte_perm(pv, wv, 0x7362);
      pos = m < 4 ? 8 * m : 8 * (m - 4) + 4;
    } else {
      pos = 4 * m;
    }
    if (blk < nb) {
      const int fb = blk * 32 + pos;
      *(uint32_t *)(xq + (q8_chunk<TYPE, SW>(fb >> 4) << 4) + (fb & 15)) = ov;
      if (m == 0) xd[blk] = d;
      if ((m & 3) == 0) xs[2 * blk + (m >> 2)] = d * (float)s;
    }
  }
}

/* Quantizes nb blocks into (xq, xd, xs); called by all WARPS warps of the block (warp, lane:
 * this thread's). ld(blk, m) returns elements 4m..4m+3 of block blk (blk < nb) as a float4.
 * U steps' loads are issued together (the loop is bound by their L2 latency: 4096
 * activations are one round with U = 4). The caller synchronizes the block before reading
 * the span. */
template <int TYPE, int U, int WARPS, typename LD>
__device__ __forceinline__ void cuda_q8act_quantize(const LD &ld, int nb, uint8_t *xq, float *xd, float *xs, int warp,
                                                    int lane) {
  for (int b0 = warp * 4; b0 < nb; b0 += 4 * WARPS * U) {
    float4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int blk = b0 + u * 4 * WARPS + (lane >> 3);
      v[u] = blk < nb ? ld(blk, lane & 7) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    cuda_q8act_store<TYPE, U, WARPS>(v, b0, nb, xq, xd, xs, lane);
  }
}

/* The activation words a[0..7], block scales dx and run sums sx that a piece whose run 0
 * starts at span element f pairs with (cuda_q8p: words 0-3 are run 0, 4-7 run 1). */
template <int TYPE, int SW = 0>
__device__ __forceinline__ void cuda_q8act_fetch(const uint8_t *xq, const float *xd, const float *xs, int f, int *a,
                                                 float *dx, float *sx) {
  constexpr bool KQ = TYPE == ANNA_DTYPE_Q4_K || TYPE == ANNA_DTYPE_Q5_K, Q6 = TYPE == ANNA_DTYPE_Q6_K;
  const int c0 = f >> 4, c1 = c0 + (KQ ? 2 : Q6 ? 4 : 1);
  const uint4 A0 = *(const uint4 *)(xq + (q8_chunk<TYPE, SW>(c0) << 4));
  const uint4 A1 = *(const uint4 *)(xq + (q8_chunk<TYPE, SW>(c1) << 4));
  a[0] = (int)A0.x, a[1] = (int)A0.y, a[2] = (int)A0.z, a[3] = (int)A0.w;
  a[4] = (int)A1.x, a[5] = (int)A1.y, a[6] = (int)A1.z, a[7] = (int)A1.w;
  if constexpr (KQ) {
    const float2 d2 = *(const float2 *)(xd + (f >> 5)); /* f / 32 is even */
    dx[0] = d2.x, dx[1] = d2.y, sx[0] = xs[f >> 4], sx[1] = xs[(f >> 4) + 2];
  } else if constexpr (Q6) { /* run 1 is 64 elements on: 2 blocks, 4 runs */
    dx[0] = xd[f >> 5], dx[1] = xd[(f >> 5) + 2], sx[0] = xs[f >> 4], sx[1] = xs[(f >> 4) + 4];
  } else {
    dx[0] = xd[f >> 5];
    if constexpr (TYPE == ANNA_DTYPE_Q4_0) {
      const float2 s2 = *(const float2 *)(xs + (f >> 4));
      sx[0] = s2.x + s2.y;
    }
  }
}

/* The 64 activations of group g (span elements 64 g ..), stored with SW 1: a[0..7] the first
 * 32-block, a[8..15] the second, their scales dx and their block sums sx (scale * sum q). */
__device__ __forceinline__ void cuda_q8act_fetch64(const uint8_t *xq, const float *xd, const float *xs, int g, int *a,
                                                   float *dx, float *sx) {
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const uint4 A = *(const uint4 *)(xq + (q8_chunk<ANNA_DTYPE_Q4_K, 1>(4 * g + i) << 4));
    a[4 * i] = (int)A.x, a[4 * i + 1] = (int)A.y, a[4 * i + 2] = (int)A.z, a[4 * i + 3] = (int)A.w;
  }
  const float2 d2 = *(const float2 *)(xd + 2 * g), s0 = *(const float2 *)(xs + 4 * g),
               s1 = *(const float2 *)(xs + 4 * g + 2);
  dx[0] = d2.x, dx[1] = d2.y, sx[0] = s0.x + s0.y, sx[1] = s1.x + s1.y;
}

/* dp4a of unsigned weight bytes with signed activation bytes (the high Q4_K nibbles kept in
 * place: 16 x their value, 0..240, which the signed form would read as negative). */
__device__ __forceinline__ int cuda_dp4a_us(uint32_t w, int a, int c) {
#ifdef __CUDA_ARCH__
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(w), "r"(a), "r"(c));
  return d;
#else
  for (int i = 0; i < 4; i++) c += (int)((w >> (8 * i)) & 0xff) * (int)(int8_t)(a >> (8 * i));
  return c;
#endif
}

/* One Q4_K 32-byte quant group (64 weights: sub-blocks 2c and 2c + 1 of a super-block, low
 * and high nibbles of the same bytes) against its activations (cuda_q8act_fetch64). h: the
 * super-block's 16-byte header (d, dmin, 12 scale bytes), q: the group's 8 quant words.
 * The 6-bit scales and mins of both sub-blocks come from whole words without branches (c
 * differs between lanes, so the j < 4 / j >= 4 cases of the format would diverge). */
__device__ __forceinline__ float cuda_q4k_group_dot(const uint32_t *h, const uint32_t *q, int c, const int *a,
                                                    const float *dx, const float *sx) {
  int lo = MVQ8_MAGIC, hi = MVQ8_MAGIC;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    lo = __dp4a((int)(q[i] & 0x0f0f0f0fu), a[i], lo);
    hi = cuda_dp4a_us(q[i] & 0xf0f0f0f0u, a[8 + i], hi);
  }
  const uint32_t A = h[1], B = h[2], C = h[3];
  const bool up = c >= 2; /* sub-blocks 4..7: scale and min split over three bytes */
  const uint32_t scw = up ? (C & 0x0f0f0f0fu) | ((A >> 2) & 0x30303030u) : A & 0x3f3f3f3fu;
  const uint32_t mnw = up ? ((C >> 4) & 0x0f0f0f0fu) | ((B >> 2) & 0x30303030u) : B & 0x3f3f3f3fu;
  const int sh = 16 * (c & 1);
  const float d = pc_h2f(h[0]), dmin = pc_h2f(h[0] >> 16);
  const float s0 = (float)((scw >> sh) & 0xff), s1 = (float)((scw >> (sh + 8)) & 0xff);
  const float m0 = (float)((mnw >> sh) & 0xff), m1 = (float)((mnw >> (sh + 8)) & 0xff);
  const float f0 = __int_as_float(lo) - 12582912.0f, f1 = __int_as_float(hi) - 12582912.0f;
  return d * fmaf(s0 * dx[0], f0, (s1 * dx[1] * 0.0625f) * f1) - dmin * fmaf(m0, sx[0], m1 * sx[1]);
}

/* One piece's contribution: decoded weight words wq with their run scales sc and mins mn
 * (cuda_q8_decode) against fetched activations (cuda_q8act_fetch). */
template <int TYPE>
__device__ __forceinline__ float cuda_q8act_dot(const int *wq, const float *sc, const float *mn, const int *a,
                                                const float *dx, const float *sx) {
  constexpr bool KQ = TYPE == ANNA_DTYPE_Q4_K || TYPE == ANNA_DTYPE_Q5_K, Q6 = TYPE == ANNA_DTYPE_Q6_K;
  if constexpr (KQ) {
    int i0 = MVQ8_MAGIC, i1 = MVQ8_MAGIC;
#pragma unroll
    for (int k = 0; k < 4; k++) i0 = __dp4a(wq[k], a[k], i0), i1 = __dp4a(wq[4 + k], a[4 + k], i1);
    const float f0 = __int_as_float(i0) - 12582912.0f, f1 = __int_as_float(i1) - 12582912.0f;
    return fmaf(sc[0] * dx[0], f0, fmaf(sc[1] * dx[1], f1, -(mn[0] * sx[0] + mn[1] * sx[1])));
  } else if constexpr (Q6) {
    int i0 = MVQ8_MAGIC, i1 = MVQ8_MAGIC;
#pragma unroll
    for (int k = 0; k < 4; k++) i0 = __dp4a(wq[k], a[k], i0), i1 = __dp4a(wq[4 + k], a[4 + k], i1);
    const float f0 = __int_as_float(i0) - 12582912.0f, f1 = __int_as_float(i1) - 12582912.0f;
    return sc[0] * fmaf(dx[0], f0, -32.0f * sx[0]) + sc[1] * fmaf(dx[1], f1, -32.0f * sx[1]);
  } else if constexpr (cuda_iq_run_scales(TYPE)) { /* IQ2_XS, IQ2_S: a scale per 16-run, one block */
    int i0 = MVQ8_MAGIC, i1 = MVQ8_MAGIC;
#pragma unroll
    for (int k = 0; k < 4; k++) i0 = __dp4a(wq[k], a[k], i0), i1 = __dp4a(wq[4 + k], a[4 + k], i1);
    const float f0 = __int_as_float(i0) - 12582912.0f, f1 = __int_as_float(i1) - 12582912.0f;
    return dx[0] * fmaf(sc[0], f0, sc[1] * f1);
  } else {
    int i0 = MVQ8_MAGIC, i1 = MVQ8_MAGIC;
#pragma unroll
    for (int k = 0; k < 8; k += 2) i0 = __dp4a(wq[k], a[k], i0), i1 = __dp4a(wq[k + 1], a[k + 1], i1);
    if constexpr (cuda_q8p<TYPE>::NW == 16) {
#pragma unroll
      for (int k = 0; k < 8; k += 2) i0 = __dp4a(wq[8 + k], a[k], i0), i1 = __dp4a(wq[9 + k], a[k + 1], i1);
    }
    /* two chains for latency; each < 2^21 in magnitude, so the sum of both floats (each
     * exact) is exact */
    const float f = (__int_as_float(i0) - 12582912.0f) + (__int_as_float(i1) - 12582912.0f);
    if constexpr (TYPE == ANNA_DTYPE_Q4_0) return sc[0] * fmaf(dx[0], f, -8.0f * sx[0]);
    else return sc[0] * dx[0] * f;
  }
}

#endif
