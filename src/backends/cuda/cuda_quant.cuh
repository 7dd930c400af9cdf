/* cuda_quant.cuh: device-side decoding of weight rows (included by the .cu files that read
 * weights; all functions are static device code). A quantized row is read in units of 32
 * elements: one block of the 32-element formats, or one eighth of a 256-element block.
 * Byte layouts are llama.cpp's (see formats/quant_impl.h); fields are read byte by byte
 * because blocks are not aligned. */
#ifndef ANNA_BACKENDS_CUDA_QUANT_CUH
#define ANNA_BACKENDS_CUDA_QUANT_CUH

#include "formats/dtype.h"

#include <cuda_fp16.h>
#include <stdint.h>

__constant__ static const int8_t c_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                        1,    13,   25,  38,  53,  69,  89,  113};

__device__ __forceinline__ float ldh(const uint8_t *p) {
  return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

/* True for the types cuda_deq32 decodes. */
__host__ __device__ static inline bool cuda_quant_supported(int t) {
  switch (t) {
  case ANNA_DTYPE_Q4_0: case ANNA_DTYPE_Q4_1: case ANNA_DTYPE_Q5_0: case ANNA_DTYPE_Q5_1:
  case ANNA_DTYPE_Q8_0: case ANNA_DTYPE_IQ4_NL: case ANNA_DTYPE_Q2_K: case ANNA_DTYPE_Q3_K:
  case ANNA_DTYPE_Q4_K: case ANNA_DTYPE_Q5_K: case ANNA_DTYPE_Q6_K: case ANNA_DTYPE_IQ4_XS:
    return true;
  default: return false;
  }
}

__host__ __device__ static inline bool cuda_float_type(int t) {
  return t == ANNA_DTYPE_F32 || t == ANNA_DTYPE_F16 || t == ANNA_DTYPE_BF16;
}

__device__ __forceinline__ void k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* Elements [32u, 32u + 32) of a quantized row into y. */
__device__ __forceinline__ void cuda_deq32(int type, const uint8_t *row, int64_t u, float *y) {
  switch (type) {
  case ANNA_DTYPE_Q4_0: {
    const uint8_t *b = row + u * 18;
    const float d = ldh(b);
    #pragma unroll
    for (int j = 0; j < 16; j++) {
      y[j] = d * (float)((b[2 + j] & 0xf) - 8);
      y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
    }
    break;
  }
  case ANNA_DTYPE_Q4_1: {
    const uint8_t *b = row + u * 20;
    const float d = ldh(b), m = ldh(b + 2);
    #pragma unroll
    for (int j = 0; j < 16; j++) {
      y[j] = d * (float)(b[4 + j] & 0xf) + m;
      y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
    }
    break;
  }
  case ANNA_DTYPE_Q5_0: {
    const uint8_t *b = row + u * 22;
    const float d = ldh(b);
    const uint32_t qh = b[2] | (b[3] << 8) | (b[4] << 16) | ((uint32_t)b[5] << 24);
    #pragma unroll
    for (int j = 0; j < 16; j++) {
      const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
      y[j] = d * (float)(((b[6 + j] & 0xf) | h0) - 16);
      y[j + 16] = d * (float)(((b[6 + j] >> 4) | h1) - 16);
    }
    break;
  }
  case ANNA_DTYPE_Q5_1: {
    const uint8_t *b = row + u * 24;
    const float d = ldh(b), m = ldh(b + 2);
    const uint32_t qh = b[4] | (b[5] << 8) | (b[6] << 16) | ((uint32_t)b[7] << 24);
    #pragma unroll
    for (int j = 0; j < 16; j++) {
      const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
      y[j] = d * (float)((b[8 + j] & 0xf) | h0) + m;
      y[j + 16] = d * (float)((b[8 + j] >> 4) | h1) + m;
    }
    break;
  }
  case ANNA_DTYPE_Q8_0: {
    const uint8_t *b = row + u * 34;
    const float d = ldh(b);
    #pragma unroll
    for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
    break;
  }
  case ANNA_DTYPE_IQ4_NL: {
    const uint8_t *b = row + u * 18;
    const float d = ldh(b);
    #pragma unroll
    for (int j = 0; j < 16; j++) {
      y[j] = d * (float)c_kvalues_iq4nl[b[2 + j] & 0xf];
      y[j + 16] = d * (float)c_kvalues_iq4nl[b[2 + j] >> 4];
    }
    break;
  }
  case ANNA_DTYPE_Q2_K: {
    const uint8_t *b = row + (u >> 3) * 84;
    const int sub = (int)(u & 7), h = sub >> 2, s = sub & 3;
    const float d = ldh(b + 80), dmin = ldh(b + 82);
    #pragma unroll
    for (int l = 0; l < 32; l++) {
      const int e = h * 128 + s * 32 + l;
      const uint8_t sc = b[e / 16];
      const int q = (b[16 + h * 32 + l] >> (2 * s)) & 3;
      y[l] = d * (float)(sc & 0xf) * (float)q - dmin * (float)(sc >> 4);
    }
    break;
  }
  case ANNA_DTYPE_Q3_K: {
    const uint8_t *b = row + (u >> 3) * 110;
    const int sub = (int)(u & 7), h = sub >> 2, s = sub & 3;
    const float d = ldh(b + 108);
    const uint8_t *scl = b + 96;
    #pragma unroll
    for (int l = 0; l < 32; l++) {
      const int e = h * 128 + s * 32 + l, i = e / 16;
      const int lo = (scl[i % 8] >> (4 * (i / 8))) & 0xf, hi = (scl[8 + i % 4] >> (2 * (i / 4))) & 3;
      int q = (b[32 + h * 32 + l] >> (2 * s)) & 3;
      if (!((b[l] >> (h * 4 + s)) & 1)) q -= 4;
      y[l] = d * (float)((lo | (hi << 4)) - 32) * (float)q;
    }
    break;
  }
  case ANNA_DTYPE_Q4_K: {
    const uint8_t *b = row + (u >> 3) * 144;
    const int s = (int)(u & 7);
    int sc, mn;
    k4_scale_min(b + 4, s, &sc, &mn);
    const float ds = ldh(b) * (float)sc, ms = ldh(b + 2) * (float)mn;
    const uint8_t *q = b + 16 + (s / 2) * 32;
    #pragma unroll
    for (int l = 0; l < 32; l++) y[l] = ds * (float)((q[l] >> (4 * (s % 2))) & 0xf) - ms;
    break;
  }
  case ANNA_DTYPE_Q5_K: {
    const uint8_t *b = row + (u >> 3) * 176;
    const int s = (int)(u & 7);
    int sc, mn;
    k4_scale_min(b + 4, s, &sc, &mn);
    const float ds = ldh(b) * (float)sc, ms = ldh(b + 2) * (float)mn;
    const uint8_t *qh = b + 16, *q = b + 48 + (s / 2) * 32;
    #pragma unroll
    for (int l = 0; l < 32; l++) {
      const int v = ((q[l] >> (4 * (s % 2))) & 0xf) | (((qh[l] >> s) & 1) << 4);
      y[l] = ds * (float)v - ms;
    }
    break;
  }
  case ANNA_DTYPE_Q6_K: {
    const uint8_t *b = row + (u >> 3) * 210;
    const int sub = (int)(u & 7);
    const float d = ldh(b + 208);
    const int8_t *scales = (const int8_t *)(b + 192);
    #pragma unroll
    for (int l = 0; l < 32; l++) {
      const int e = sub * 32 + l, h = e / 128, p = e % 128;
      const int lo = (b[h * 64 + p % 64] >> (4 * (p / 64))) & 0xf;
      const int hi = (b[128 + h * 32 + p % 32] >> (2 * (p / 32))) & 3;
      y[l] = d * (float)scales[e / 16] * (float)((lo | (hi << 4)) - 32);
    }
    break;
  }
  case ANNA_DTYPE_IQ4_XS: {
    const uint8_t *b = row + (u >> 3) * 136;
    const int ib = (int)(u & 7);
    const float d = ldh(b);
    const int sh = b[2] | (b[3] << 8);
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((sh >> (2 * ib)) & 3) << 4);
    const float dl = d * (float)(ls - 32);
    const uint8_t *q = b + 8 + 16 * ib;
    #pragma unroll
    for (int j = 0; j < 16; j++) {
      y[j] = dl * (float)c_kvalues_iq4nl[q[j] & 0xf];
      y[j + 16] = dl * (float)c_kvalues_iq4nl[q[j] >> 4];
    }
    break;
  }
  default:
    #pragma unroll
    for (int j = 0; j < 32; j++) y[j] = 0.0f;
  }
}

/* Q4_K unit with wide loads: blocks are 144 bytes and device rows start 16-byte aligned,
 * so the 32 quant bytes of a unit are two aligned 16-byte loads and the scales three
 * 4-byte loads (the byte-wise decoder issues ~50 loads per unit). */
__device__ __forceinline__ void cuda_deq32_q4k_wide(const uint8_t *row, int64_t u, float *y) {
  const uint8_t *b = row + (u >> 3) * 144;
  const int s = (int)(u & 7);
  const uint32_t dm = *(const uint32_t *)b;
  const uint32_t s0 = *(const uint32_t *)(b + 4), s1 = *(const uint32_t *)(b + 8), s2 = *(const uint32_t *)(b + 12);
  uint8_t sb[12];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    sb[i] = (uint8_t)(s0 >> (8 * i));
    sb[4 + i] = (uint8_t)(s1 >> (8 * i));
    sb[8 + i] = (uint8_t)(s2 >> (8 * i));
  }
  int sc, mn;
  if (s < 4) {
    sc = sb[s] & 63;
    mn = sb[s + 4] & 63;
  } else {
    sc = (sb[s + 4] & 0x0f) | ((sb[s - 4] >> 6) << 4);
    mn = (sb[s + 4] >> 4) | ((sb[s] >> 6) << 4);
  }
  const float ds = __half2float(__ushort_as_half((unsigned short)(dm & 0xffff))) * (float)sc;
  const float ms = __half2float(__ushort_as_half((unsigned short)(dm >> 16))) * (float)mn;
  const uint4 *q = (const uint4 *)(b + 16 + (s / 2) * 32);
  const uint4 qa = q[0], qb = q[1];
  const uint32_t wv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
  const int sh = 4 * (s % 2);
#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) y[4 * i + j] = ds * (float)((wv[i] >> (8 * j + sh)) & 0xf) - ms;
}

/* Element i of a plain-typed row. */
__device__ __forceinline__ float cuda_ldw(int type, const void *row, int64_t i) {
  if (type == ANNA_DTYPE_BF16) return __uint_as_float((uint32_t)((const uint16_t *)row)[i] << 16);
  if (type == ANNA_DTYPE_F16) return __half2float(__ushort_as_half(((const unsigned short *)row)[i]));
  return ((const float *)row)[i];
}

/* ---- Decode pieces for the matvec kernels ----
 * A piece is 32 weights of one row that one lane decodes from a few wide loads: two runs
 * of 16 consecutive elements, [e0, e0 + 16) into w[0..15] and [e0 + HI, e0 + HI + 16) into
 * w[16..31] (HI is the format's distance between the low- and high-nibble runs). Small
 * integers become floats by the exponent trick (0x4B000000 | v is 2^23 + v exactly), so the
 * decode needs no int-to-float conversions (a quarter-rate instruction on sm_90); values
 * are scale * q in f32, the same products as the CPU decoder. Loads: 16-byte when the
 * format's blocks are 16-byte multiples (Q4_K, Q5_K), 8-byte for IQ4_XS, 2-byte where
 * blocks are only 2-byte aligned (Q4_0, IQ4_NL, Q8_0, Q6_K): a wider load there would read
 * past the block at the row's end. */
template <int TYPE> struct cuda_piece;
template <> struct cuda_piece<ANNA_DTYPE_Q4_0> { enum { BB = 18, PPB = 1, HI = 16 }; };
template <> struct cuda_piece<ANNA_DTYPE_IQ4_NL> { enum { BB = 18, PPB = 1, HI = 16 }; };
template <> struct cuda_piece<ANNA_DTYPE_Q8_0> { enum { BB = 34, PPB = 1, HI = 16 }; };
template <> struct cuda_piece<ANNA_DTYPE_Q4_K> { enum { BB = 144, PPB = 8, HI = 32 }; };
template <> struct cuda_piece<ANNA_DTYPE_Q5_K> { enum { BB = 176, PPB = 8, HI = 32 }; };
template <> struct cuda_piece<ANNA_DTYPE_Q6_K> { enum { BB = 210, PPB = 8, HI = 64 }; };
template <> struct cuda_piece<ANNA_DTYPE_IQ4_XS> { enum { BB = 136, PPB = 8, HI = 16 }; };

/* 2^23 + byte i of v, as a float (byte_perm places the byte under the exponent 0x4B). */
__device__ __forceinline__ float pc_bf(uint32_t v, int i) {
  return __int_as_float((int)__byte_perm(v, 0x4B000000u, 0x7440u + (unsigned)i));
}
__device__ __forceinline__ uint32_t pc_ld16x2(const uint8_t *p) {
  const uint16_t *h = (const uint16_t *)p;
  return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}
__device__ __forceinline__ float pc_h2f(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)v)); }

/* Bytes q[0..3] of 4 words (16 values, one per byte, 0..255 after masking) to floats
 * d * (v - bias): into w[0..15]. */
__device__ __forceinline__ void pc_bytes16(const uint32_t *q, float bias, float d, float *w) {
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) w[4 * i + j] = d * (pc_bf(q[i], j) - bias);
}

/* Piece p of a row: w[32] and the first element of the low run. tab: the IQ4 value table
 * (shared memory) or NULL. */
template <int TYPE>
__device__ __forceinline__ int64_t cuda_piece_decode(const uint8_t *row, int64_t p, float *w, const float *tab) {
  if constexpr (TYPE == ANNA_DTYPE_Q4_0 || TYPE == ANNA_DTYPE_IQ4_NL) {
    const uint8_t *b = row + p * 18;
    const float d = pc_h2f(*(const uint16_t *)b);
    uint32_t q[4];
#pragma unroll
    for (int i = 0; i < 4; i++) q[i] = pc_ld16x2(b + 2 + 4 * i);
    if constexpr (TYPE == ANNA_DTYPE_Q4_0) {
      uint32_t lo[4], hi[4];
#pragma unroll
      for (int i = 0; i < 4; i++) lo[i] = q[i] & 0x0f0f0f0fu, hi[i] = (q[i] >> 4) & 0x0f0f0f0fu;
      pc_bytes16(lo, 8388616.0f, d, w);
      pc_bytes16(hi, 8388616.0f, d, w + 16);
    } else {
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
          w[4 * i + j] = d * tab[(q[i] >> (8 * j)) & 15];
          w[16 + 4 * i + j] = d * tab[(q[i] >> (8 * j + 4)) & 15];
        }
    }
    return p * 32;
  } else if constexpr (TYPE == ANNA_DTYPE_Q8_0) {
    const uint8_t *b = row + p * 34;
    const float d = pc_h2f(*(const uint16_t *)b);
    uint32_t q[8];
#pragma unroll
    for (int i = 0; i < 8; i++) q[i] = pc_ld16x2(b + 2 + 4 * i) ^ 0x80808080u; /* int8 + 128 */
    pc_bytes16(q, 8388736.0f, d, w);
    pc_bytes16(q + 4, 8388736.0f, d, w + 16);
    return p * 32;
  } else if constexpr (TYPE == ANNA_DTYPE_Q4_K || TYPE == ANNA_DTYPE_Q5_K) {
    /* piece k covers quant bytes 16k..16k+15: low nibbles are sub-block 2c, high 2c+1 */
    const int k = (int)(p & 7), c = k >> 1, l = 16 * (k & 1);
    const uint8_t *b = row + (p >> 3) * (TYPE == ANNA_DTYPE_Q4_K ? 144 : 176);
    const uint4 h = *(const uint4 *)b;
    const uint4 qv = *(const uint4 *)(b + (TYPE == ANNA_DTYPE_Q4_K ? 16 : 48) + 16 * k);
    const int jj = (2 * c) & 3, sa = 8 * jj, sb = sa + 8;
    int sc0, mn0, sc1, mn1;
    if (c < 2) {
      sc0 = (h.y >> sa) & 63, mn0 = (h.z >> sa) & 63;
      sc1 = (h.y >> sb) & 63, mn1 = (h.z >> sb) & 63;
    } else {
      sc0 = ((h.w >> sa) & 0x0f) | (((h.y >> sa) >> 6 & 3) << 4);
      mn0 = ((h.w >> sa) >> 4 & 0x0f) | (((h.z >> sa) >> 6 & 3) << 4);
      sc1 = ((h.w >> sb) & 0x0f) | (((h.y >> sb) >> 6 & 3) << 4);
      mn1 = ((h.w >> sb) >> 4 & 0x0f) | (((h.z >> sb) >> 6 & 3) << 4);
    }
    const float d = pc_h2f(h.x), dm = pc_h2f(h.x >> 16);
    const float ds0 = d * (float)sc0, ms0 = dm * (float)mn0, ds1 = d * (float)sc1, ms1 = dm * (float)mn1;
    const uint32_t q[4] = {qv.x, qv.y, qv.z, qv.w};
    uint32_t qh[4] = {0, 0, 0, 0};
    if constexpr (TYPE == ANNA_DTYPE_Q5_K) {
      const uint4 hv = *(const uint4 *)(b + 16 + l);
      qh[0] = hv.x, qh[1] = hv.y, qh[2] = hv.z, qh[3] = hv.w;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
      uint32_t lo = q[i] & 0x0f0f0f0fu, hi = (q[i] >> 4) & 0x0f0f0f0fu;
      if constexpr (TYPE == ANNA_DTYPE_Q5_K) {
        lo |= ((qh[i] >> (2 * c)) & 0x01010101u) << 4;
        hi |= ((qh[i] >> (2 * c + 1)) & 0x01010101u) << 4;
      }
#pragma unroll
      for (int j = 0; j < 4; j++) {
        w[4 * i + j] = ds0 * (pc_bf(lo, j) - 8388608.0f) - ms0;
        w[16 + 4 * i + j] = ds1 * (pc_bf(hi, j) - 8388608.0f) - ms1;
      }
    }
    return (p >> 3) * 256 + 64 * c + l;
  } else if constexpr (TYPE == ANNA_DTYPE_Q6_K) {
    /* piece k: half hh = k / 4, quant-low bytes hh*64 + m .. +15 (m = 16 (k % 4)) hold
     * elements 128 hh + m + i (low nibbles) and 128 hh + 64 + m + i (high nibbles) */
    const int k = (int)(p & 7), hh = k >> 2, m = 16 * (k & 3);
    const uint8_t *b = row + (p >> 3) * 210;
    uint32_t ql[4], qh[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      ql[i] = pc_ld16x2(b + hh * 64 + m + 4 * i);
      qh[i] = pc_ld16x2(b + 128 + hh * 32 + (m & 31) + 4 * i);
    }
    const float d = pc_h2f(*(const uint16_t *)(b + 208));
    const int8_t *scl = (const int8_t *)(b + 192 + 8 * hh + (k & 3));
    const float d0 = d * (float)scl[0], d1 = d * (float)scl[4];
    const int s0 = 2 * (m >> 5);
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      lo[i] = (ql[i] & 0x0f0f0f0fu) | (((qh[i] >> s0) & 0x03030303u) << 4);
      hi[i] = ((ql[i] >> 4) & 0x0f0f0f0fu) | (((qh[i] >> (s0 + 4)) & 0x03030303u) << 4);
    }
    pc_bytes16(lo, 8388640.0f, d0, w);
    pc_bytes16(hi, 8388640.0f, d1, w + 16);
    return (p >> 3) * 256 + 128 * hh + m;
  } else { /* IQ4_XS: piece ib is sub-block ib */
    const int ib = (int)(p & 7);
    const uint8_t *b = row + (p >> 3) * 136;
    const uint2 h = *(const uint2 *)b;
    const uint2 qa = *(const uint2 *)(b + 8 + 16 * ib), qb = *(const uint2 *)(b + 16 + 16 * ib);
    const int ls = ((h.y >> (4 * ib)) & 0xf) | (((h.x >> (16 + 2 * ib)) & 3) << 4);
    const float dl = pc_h2f(h.x) * (float)(ls - 32);
    const uint32_t q[4] = {qa.x, qa.y, qb.x, qb.y};
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) {
        w[4 * i + j] = dl * tab[(q[i] >> (8 * j)) & 15];
        w[16 + 4 * i + j] = dl * tab[(q[i] >> (8 * j + 4)) & 15];
      }
    return (p >> 3) * 256 + 32 * ib;
  }
}

#endif
