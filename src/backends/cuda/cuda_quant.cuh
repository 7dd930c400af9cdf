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

#endif
