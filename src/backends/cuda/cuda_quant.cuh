/* cuda_quant.cuh: device-side decoding of weight rows (included by the .cu files that read
 * weights; all functions are static device code). A quantized row is read in units of 32
 * elements: one block of the 32-element formats, or one eighth of a 256-element block.
 * Byte layouts are llama.cpp's (see formats/quant_impl.h). cuda_deq32 reads fields byte by
 * byte (any alignment, every type); the piece decoders at the end (decode matvec) use wide
 * loads and need the row alignment that cuda_matmul.cu's piece_ok checks.
 * Every decoder is __host__ __device__ (CUDA_HD) so tests/cuda/test_cuda_decode.cu checks it
 * against the CPU dequantizer on a machine without a GPU: the device intrinsics and PTX it
 * uses go through the cuda_hd_* twins below, whose host branches compute the same bits and
 * whose device branches are the original calls (the device code is unchanged). */
#ifndef ANNA_BACKENDS_CUDA_QUANT_CUH
#define ANNA_BACKENDS_CUDA_QUANT_CUH

#include "formats/dtype.h"

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#define CUDA_HD __host__ __device__ __forceinline__
/* #pragma unroll in the device pass only: the host compiler does not know it. */
#ifdef __CUDA_ARCH__
#define CUDA_UNROLL _Pragma("unroll")
#else
#define CUDA_UNROLL
#endif

__constant__ static const int8_t c_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                        1,    13,   25,  38,  53,  69,  89,  113};
/* The same table for the host build of the decoders (host code cannot read __constant__). */
static const int8_t h_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                           1,    13,   25,  38,  53,  69,  89,  113};

CUDA_HD int8_t cuda_hd_iq4nl(int n) {
#ifdef __CUDA_ARCH__
  return c_kvalues_iq4nl[n];
#else
  return h_kvalues_iq4nl[n];
#endif
}

/* The 2- and 3-bit i-quant grids, packed one word per row (cuda_iq_grids.inc, generated from
 * formats/quant_grids.c and checked against it by tests/formats/test_cuda_iq_grids.c): global
 * memory on the device (__device__: lanes gather different rows, which __constant__ would
 * serialize), plain arrays for the host build of the decoders. */
#define CUDA_IQ_GRID_BEGIN(T, name, rows) __device__ static const T c_##name[rows] = {
#define CUDA_IQ_GRID_END };
#include "backends/cuda/cuda_iq_grids.inc"
#undef CUDA_IQ_GRID_BEGIN
#define CUDA_IQ_GRID_BEGIN(T, name, rows) static const T h_##name[rows] = {
#include "backends/cuda/cuda_iq_grids.inc"
#undef CUDA_IQ_GRID_BEGIN
#undef CUDA_IQ_GRID_END

#ifdef __CUDA_ARCH__
#define CUDA_IQ_GRID(name, i) c_##name[i]
#else
#define CUDA_IQ_GRID(name, i) h_##name[i]
#endif

/* Host twins of the device intrinsics (CUDA Math API / PTX ISA definitions). __byte_perm:
 * byte i of the result is byte (s >> 4i) & 7 of the pair {y: bytes 4-7, x: bytes 0-3}. */
CUDA_HD uint32_t cuda_hd_byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (uint64_t)y << 32 | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; i++) r |= (uint32_t)(v >> (8 * ((s >> (4 * i)) & 7)) & 0xff) << (8 * i);
  return r;
#endif
}
/* The low word of {hi, lo} >> min(sh, 32). */
CUDA_HD uint32_t cuda_hd_funnelshift_rc(uint32_t lo, uint32_t hi, uint32_t sh) {
#ifdef __CUDA_ARCH__
  return __funnelshift_rc(lo, hi, sh);
#else
  return (uint32_t)(((uint64_t)hi << 32 | lo) >> (sh < 32 ? sh : 32));
#endif
}
CUDA_HD float cuda_hd_int_as_float(int v) {
#ifdef __CUDA_ARCH__
  return __int_as_float(v);
#else
  float f;
  memcpy(&f, &v, 4);
  return f;
#endif
}
CUDA_HD float cuda_hd_uint_as_float(uint32_t v) {
  return cuda_hd_int_as_float((int)v); /* the same 32 bits */
}

CUDA_HD int cuda_hd_popc(uint32_t v) {
#ifdef __CUDA_ARCH__
  return __popc(v);
#else
  return __builtin_popcount(v);
#endif
}

CUDA_HD float ldh(const uint8_t *p) {
  return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

/* True for the types cuda_deq32 decodes. */
__host__ __device__ static inline bool cuda_quant_supported(int t) {
  switch (t) {
  case ANNA_DTYPE_Q4_0: case ANNA_DTYPE_Q4_1: case ANNA_DTYPE_Q5_0: case ANNA_DTYPE_Q5_1:
  case ANNA_DTYPE_Q8_0: case ANNA_DTYPE_IQ4_NL: case ANNA_DTYPE_Q2_K: case ANNA_DTYPE_Q3_K:
  case ANNA_DTYPE_Q4_K: case ANNA_DTYPE_Q5_K: case ANNA_DTYPE_Q6_K: case ANNA_DTYPE_IQ4_XS:
  case ANNA_DTYPE_IQ2_XXS: case ANNA_DTYPE_IQ2_XS: case ANNA_DTYPE_IQ2_S: case ANNA_DTYPE_IQ3_XXS:
  case ANNA_DTYPE_IQ3_S:
    return true;
  default: return false;
  }
}

/* The 2- and 3-bit i-quants (grid + sign formats): 256-element blocks of 8 sub-blocks of 32,
 * decoded through cuda_iq_decode below. */
__host__ __device__ constexpr bool cuda_iq_grid_type(int t) {
  return t == ANNA_DTYPE_IQ2_XXS || t == ANNA_DTYPE_IQ2_XS || t == ANNA_DTYPE_IQ2_S || t == ANNA_DTYPE_IQ3_XXS ||
         t == ANNA_DTYPE_IQ3_S;
}
/* Those with one scale per 16 elements (the two runs of a piece have their own scale). */
__host__ __device__ constexpr bool cuda_iq_run_scales(int t) {
  return t == ANNA_DTYPE_IQ2_XS || t == ANNA_DTYPE_IQ2_S;
}

/* ---- i-quant sub-blocks ----
 * Sub-block ib (32 elements) of an i-quant block as 4 canonical words, the same whether read
 * byte by byte (cuda_iq_gather, any alignment) or by the piece loads (cuda_piece_load):
 *   IQ2_XXS: [0] d            [1] 4 grid indices       [2] 4 x 7 sign bits | scale << 28
 *   IQ2_XS:  [0] d | sc << 16 [1][2] 4 x (9-bit index | 7 sign bits << 9)
 *   IQ2_S:   [0] d | qh << 16 | sc << 24   [1] 4 index low bytes   [2] 4 sign bytes
 *   IQ3_XXS: [0] d            [1][2] 8 grid indices    [3] 4 x 7 sign bits | scale << 28
 *   IQ3_S:   [0] d | qh << 16 | scale nibble << 24     [1][2] 8 index low bytes  [3] 4 sign bytes
 * (sc: the sub-block's scale byte, two 4-bit scales of its 16-element halves; qh: its high
 * index bits.) Block layouts as formats/quant_impl.h; every field of sub-block ib lies at a
 * fixed offset, 2 mod 4 from the block start (the blocks are 66, 74, 82, 98, 110 bytes). */
template <int TYPE> struct cuda_iq_layout;
template <> struct cuda_iq_layout<ANNA_DTYPE_IQ2_XXS> { enum { BB = 66 }; };
template <> struct cuda_iq_layout<ANNA_DTYPE_IQ2_XS> { enum { BB = 74 }; };
template <> struct cuda_iq_layout<ANNA_DTYPE_IQ2_S> { enum { BB = 82 }; };
template <> struct cuda_iq_layout<ANNA_DTYPE_IQ3_XXS> { enum { BB = 98 }; };
template <> struct cuda_iq_layout<ANNA_DTYPE_IQ3_S> { enum { BB = 110 }; };

/* 4 little-endian bytes at any address. */
CUDA_HD uint32_t iq_b4(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

template <int TYPE> CUDA_HD void cuda_iq_gather(const uint8_t *b, int ib, uint32_t *raw) {
  const uint32_t d = (uint32_t)b[0] | (uint32_t)b[1] << 8;
  raw[3] = 0;
  if constexpr (TYPE == ANNA_DTYPE_IQ2_XXS) {
    raw[0] = d, raw[1] = iq_b4(b + 2 + 8 * ib), raw[2] = iq_b4(b + 6 + 8 * ib);
  } else if constexpr (TYPE == ANNA_DTYPE_IQ2_XS) {
    raw[0] = d | (uint32_t)b[66 + ib] << 16, raw[1] = iq_b4(b + 2 + 8 * ib), raw[2] = iq_b4(b + 6 + 8 * ib);
  } else if constexpr (TYPE == ANNA_DTYPE_IQ2_S) {
    raw[0] = d | (uint32_t)b[66 + ib] << 16 | (uint32_t)b[74 + ib] << 24;
    raw[1] = iq_b4(b + 2 + 4 * ib), raw[2] = iq_b4(b + 34 + 4 * ib);
  } else if constexpr (TYPE == ANNA_DTYPE_IQ3_XXS) {
    raw[0] = d, raw[1] = iq_b4(b + 2 + 8 * ib), raw[2] = iq_b4(b + 6 + 8 * ib), raw[3] = iq_b4(b + 66 + 4 * ib);
  } else { /* IQ3_S */
    raw[0] = d | (uint32_t)b[66 + ib] << 16 | (uint32_t)((b[106 + ib / 2] >> (4 * (ib % 2))) & 0xf) << 24;
    raw[1] = iq_b4(b + 2 + 8 * ib), raw[2] = iq_b4(b + 6 + 8 * ib), raw[3] = iq_b4(b + 74 + 4 * ib);
  }
}

/* 4 unsigned grid bytes (each 1..127) negated where sign bits s (bits 0-3) are set: two's
 * complement per byte as (g ^ m) + 1, which cannot carry across bytes since g != 0 (as the
 * CPU's signed8). The multiply spreads bit i of s to bit 8i. */
CUDA_HD uint32_t iq_signed4(uint32_t g, uint32_t s) {
  const uint32_t m = (((s & 15u) * 0x00204081u) & 0x01010101u) * 0xffu;
  return (g ^ m) + (m & 0x01010101u);
}
/* 7 stored sign bits to 8: bit 7 makes the parity even (the ksigns table's rule). */
CUDA_HD uint32_t iq_signs8(uint32_t s7) {
  return s7 | (uint32_t)(cuda_hd_popc(s7) & 1) << 7;
}
/* One grid row of 8 (two words) with 8 sign bits into q[0], q[1]. */
CUDA_HD void iq_row8(uint64_t g, uint32_t s8, uint32_t *q) {
  q[0] = iq_signed4((uint32_t)g, s8), q[1] = iq_signed4((uint32_t)(g >> 32), s8 >> 4);
}

/* Canonical words (above) to the sub-block's 32 values as 8 words of int8 (word m: elements
 * 4m..4m+3) and its scales: element i is sc[i / 16] * q_i, the same product as the CPU's
 * dequantizer (db * grid * sign) bit for bit. */
template <int TYPE> CUDA_HD void cuda_iq_decode(const uint32_t *raw, uint32_t *q, float *sc) {
  const float d = __half2float(__ushort_as_half((unsigned short)(raw[0] & 0xffff)));
  if constexpr (TYPE == ANNA_DTYPE_IQ2_XXS) {
    sc[0] = sc[1] = d * (0.5f + (float)(raw[2] >> 28)) * 0.25f;
    CUDA_UNROLL
    for (int l = 0; l < 4; l++)
      iq_row8(CUDA_IQ_GRID(iq2xxs, (raw[1] >> (8 * l)) & 0xff), iq_signs8((raw[2] >> (7 * l)) & 127), q + 2 * l);
  } else if constexpr (TYPE == ANNA_DTYPE_IQ2_XS) {
    const uint32_t s = raw[0] >> 16;
    sc[0] = d * (0.5f + (float)(s & 0xf)) * 0.25f, sc[1] = d * (0.5f + (float)((s >> 4) & 0xf)) * 0.25f;
    CUDA_UNROLL
    for (int l = 0; l < 4; l++) {
      const uint32_t v = (raw[1 + l / 2] >> (16 * (l & 1))) & 0xffff;
      iq_row8(CUDA_IQ_GRID(iq2xs, v & 511), iq_signs8(v >> 9), q + 2 * l);
    }
  } else if constexpr (TYPE == ANNA_DTYPE_IQ2_S) {
    const uint32_t qh = (raw[0] >> 16) & 0xff, s = raw[0] >> 24;
    sc[0] = d * (0.5f + (float)(s & 0xf)) * 0.25f, sc[1] = d * (0.5f + (float)(s >> 4)) * 0.25f;
    CUDA_UNROLL
    for (int l = 0; l < 4; l++) {
      const uint32_t idx = ((raw[1] >> (8 * l)) & 0xff) | ((qh >> (2 * l)) & 3) << 8;
      iq_row8(CUDA_IQ_GRID(iq2s, idx), (raw[2] >> (8 * l)) & 0xff, q + 2 * l);
    }
  } else if constexpr (TYPE == ANNA_DTYPE_IQ3_XXS) {
    sc[0] = sc[1] = d * (0.5f + (float)(raw[3] >> 28)) * 0.5f;
    CUDA_UNROLL
    for (int l = 0; l < 4; l++) {
      const uint32_t w = raw[1 + l / 2] >> (16 * (l & 1)), s8 = iq_signs8((raw[3] >> (7 * l)) & 127);
      q[2 * l] = iq_signed4(CUDA_IQ_GRID(iq3xxs, w & 0xff), s8);
      q[2 * l + 1] = iq_signed4(CUDA_IQ_GRID(iq3xxs, (w >> 8) & 0xff), s8 >> 4);
    }
  } else { /* IQ3_S */
    const uint32_t qh = (raw[0] >> 16) & 0xff;
    sc[0] = sc[1] = d * (float)(1 + 2 * (int)(raw[0] >> 24));
    CUDA_UNROLL
    for (int l = 0; l < 4; l++) {
      const uint32_t w = raw[1 + l / 2] >> (16 * (l & 1)), s8 = (raw[3] >> (8 * l)) & 0xff;
      const uint32_t i0 = (w & 0xff) | ((qh >> (2 * l)) & 1) << 8, i1 = ((w >> 8) & 0xff) | ((qh >> (2 * l + 1)) & 1) << 8;
      q[2 * l] = iq_signed4(CUDA_IQ_GRID(iq3s, i0), s8);
      q[2 * l + 1] = iq_signed4(CUDA_IQ_GRID(iq3s, i1), s8 >> 4);
    }
  }
}

/* cuda_deq32 of an i-quant unit. */
template <int TYPE> CUDA_HD void cuda_deq32_iq(const uint8_t *row, int64_t u, float *y) {
  uint32_t raw[4], q[8];
  float sc[2];
  cuda_iq_gather<TYPE>(row + (u >> 3) * cuda_iq_layout<TYPE>::BB, (int)(u & 7), raw);
  cuda_iq_decode<TYPE>(raw, q, sc);
  CUDA_UNROLL
  for (int j = 0; j < 32; j++) y[j] = sc[j >> 4] * (float)(int8_t)(uint8_t)(q[j >> 2] >> (8 * (j & 3)));
}

__host__ __device__ static inline bool cuda_float_type(int t) {
  return t == ANNA_DTYPE_F32 || t == ANNA_DTYPE_F16 || t == ANNA_DTYPE_BF16;
}

CUDA_HD void k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* Elements [32u, 32u + 32) of a quantized row into y. */
CUDA_HD void cuda_deq32(int type, const uint8_t *row, int64_t u, float *y) {
  switch (type) {
  case ANNA_DTYPE_Q4_0: {
    const uint8_t *b = row + u * 18;
    const float d = ldh(b);
    CUDA_UNROLL
    for (int j = 0; j < 16; j++) {
      y[j] = d * (float)((b[2 + j] & 0xf) - 8);
      y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
    }
    break;
  }
  case ANNA_DTYPE_Q4_1: {
    const uint8_t *b = row + u * 20;
    const float d = ldh(b), m = ldh(b + 2);
    CUDA_UNROLL
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
    CUDA_UNROLL
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
    CUDA_UNROLL
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
    CUDA_UNROLL
    for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
    break;
  }
  case ANNA_DTYPE_IQ4_NL: {
    const uint8_t *b = row + u * 18;
    const float d = ldh(b);
    CUDA_UNROLL
    for (int j = 0; j < 16; j++) {
      y[j] = d * (float)cuda_hd_iq4nl(b[2 + j] & 0xf);
      y[j + 16] = d * (float)cuda_hd_iq4nl(b[2 + j] >> 4);
    }
    break;
  }
  case ANNA_DTYPE_Q2_K: {
    const uint8_t *b = row + (u >> 3) * 84;
    const int sub = (int)(u & 7), h = sub >> 2, s = sub & 3;
    const float d = ldh(b + 80), dmin = ldh(b + 82);
    CUDA_UNROLL
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
    CUDA_UNROLL
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
    CUDA_UNROLL
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
    CUDA_UNROLL
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
    CUDA_UNROLL
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
    CUDA_UNROLL
    for (int j = 0; j < 16; j++) {
      y[j] = dl * (float)cuda_hd_iq4nl(q[j] & 0xf);
      y[j + 16] = dl * (float)cuda_hd_iq4nl(q[j] >> 4);
    }
    break;
  }
  case ANNA_DTYPE_IQ2_XXS: cuda_deq32_iq<ANNA_DTYPE_IQ2_XXS>(row, u, y); break;
  case ANNA_DTYPE_IQ2_XS: cuda_deq32_iq<ANNA_DTYPE_IQ2_XS>(row, u, y); break;
  case ANNA_DTYPE_IQ2_S: cuda_deq32_iq<ANNA_DTYPE_IQ2_S>(row, u, y); break;
  case ANNA_DTYPE_IQ3_XXS: cuda_deq32_iq<ANNA_DTYPE_IQ3_XXS>(row, u, y); break;
  case ANNA_DTYPE_IQ3_S: cuda_deq32_iq<ANNA_DTYPE_IQ3_S>(row, u, y); break;
  default:
    CUDA_UNROLL
    for (int j = 0; j < 32; j++) y[j] = 0.0f;
  }
}

/* Q4_K unit with wide loads: blocks are 144 bytes and device rows start 16-byte aligned,
 * so the 32 quant bytes of a unit are two aligned 16-byte loads and the scales three
 * 4-byte loads (the byte-wise decoder issues ~50 loads per unit). */
CUDA_HD void cuda_deq32_q4k_wide(const uint8_t *row, int64_t u, float *y) {
  const uint8_t *b = row + (u >> 3) * 144;
  const int s = (int)(u & 7);
  const uint32_t dm = *(const uint32_t *)b;
  const uint32_t s0 = *(const uint32_t *)(b + 4), s1 = *(const uint32_t *)(b + 8), s2 = *(const uint32_t *)(b + 12);
  uint8_t sb[12];
  CUDA_UNROLL
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
  CUDA_UNROLL
  for (int i = 0; i < 8; i++)
    CUDA_UNROLL
    for (int j = 0; j < 4; j++) y[4 * i + j] = ds * (float)((wv[i] >> (8 * j + sh)) & 0xf) - ms;
}

/* Element i of a plain-typed row. */
CUDA_HD float cuda_ldw(int type, const void *row, int64_t i) {
  if (type == ANNA_DTYPE_BF16) return cuda_hd_uint_as_float((uint32_t)((const uint16_t *)row)[i] << 16);
  if (type == ANNA_DTYPE_F16) return __half2float(__ushort_as_half(((const unsigned short *)row)[i]));
  return ((const float *)row)[i];
}

/* ---- Decode pieces for the matvec kernels ----
 * A piece is 32 weights of one row that one lane decodes: two runs of 16 consecutive
 * elements, [e0, e0 + 16) into w[0..15] and [e0 + HI, e0 + HI + 16) into w[16..31] (HI is
 * the format's distance between the low- and high-nibble runs). Loading and decoding are
 * separate steps (cuda_piece_load fills RAW words, cuda_piece_decode turns them into
 * floats) so the kernel can issue the next piece's loads before it decodes this one.
 * Loads are 16-byte where the format's blocks are 16-byte multiples (Q4_K, Q5_K), 8-byte
 * for IQ4_XS, and aligned 4-byte words where blocks are only 2-byte aligned (Q4_0, IQ4_NL,
 * Q8_0, Q6_K): the covering words are read and funnel-shifted into place. Small integers
 * become floats by the exponent trick (0x4B000000 | v is 2^23 + v exactly), so the decode
 * needs no int-to-float conversions (a quarter-rate instruction on sm_90). The kernel dots
 * these integers with the activations and applies each run's scale (and min) once, which
 * rounds differently from the CPU's per-weight scale * q but stays within f32 rounding of
 * the same sum. */
template <int TYPE> struct cuda_piece;
template <> struct cuda_piece<ANNA_DTYPE_Q4_0> { enum { PPB = 1, HI = 16, RAW = 5 }; };
template <> struct cuda_piece<ANNA_DTYPE_IQ4_NL> { enum { PPB = 1, HI = 16, RAW = 5 }; };
template <> struct cuda_piece<ANNA_DTYPE_Q8_0> { enum { PPB = 1, HI = 16, RAW = 9 }; };
template <> struct cuda_piece<ANNA_DTYPE_Q4_K> { enum { PPB = 8, HI = 32, RAW = 8 }; };
template <> struct cuda_piece<ANNA_DTYPE_Q5_K> { enum { PPB = 8, HI = 32, RAW = 12 }; };
template <> struct cuda_piece<ANNA_DTYPE_Q6_K> { enum { PPB = 8, HI = 64, RAW = 13 }; };
template <> struct cuda_piece<ANNA_DTYPE_IQ4_XS> { enum { PPB = 8, HI = 16, RAW = 6 }; };
/* i-quants: piece ib is sub-block ib, RAW its canonical words (cuda_iq_gather) */
template <> struct cuda_piece<ANNA_DTYPE_IQ2_XXS> { enum { PPB = 8, HI = 16, RAW = 4 }; };
template <> struct cuda_piece<ANNA_DTYPE_IQ2_XS> { enum { PPB = 8, HI = 16, RAW = 4 }; };
template <> struct cuda_piece<ANNA_DTYPE_IQ2_S> { enum { PPB = 8, HI = 16, RAW = 4 }; };
template <> struct cuda_piece<ANNA_DTYPE_IQ3_XXS> { enum { PPB = 8, HI = 16, RAW = 4 }; };
template <> struct cuda_piece<ANNA_DTYPE_IQ3_S> { enum { PPB = 8, HI = 16, RAW = 4 }; };

/* 2^23 + byte i of v, as a float (byte_perm places the byte under the exponent 0x4B). */
CUDA_HD float pc_bf(uint32_t v, int i) {
  return cuda_hd_int_as_float((int)cuda_hd_byte_perm(v, 0x4B000000u, 0x7440u + (unsigned)i));
}
CUDA_HD float pc_h2f(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)v)); }

/* Weight loads: evict-first (ld.global.cs), so the streamed weights leave the activations,
 * which every row reads again, in L1. On the host: the same bytes, reported to
 * CUDA_QUANT_HOST_LOAD(p, bytes) where a test defines it (to check a row's loads stay inside
 * the row). */
#ifndef CUDA_QUANT_HOST_LOAD
#define CUDA_QUANT_HOST_LOAD(p, bytes) ((void)0)
#endif
template <typename T> CUDA_HD T pc_ld(const T *p) {
#ifdef __CUDA_ARCH__
  return __ldcs(p);
#else
  CUDA_QUANT_HOST_LOAD(p, sizeof(T));
  T v;
  memcpy(&v, p, sizeof v);
  return v;
#endif
}

/* The N aligned words from p - (p & 2), for a 2-byte aligned p whose data (4N - 2 bytes
 * when p & 2, else up to 4N) lie in the weight. last: the data end a row, so when p is
 * 4-byte aligned the final word's upper half may lie past the allocation: it is read as 2
 * bytes. */
template <int N>
CUDA_HD void pc_window(const uint8_t *p, uint32_t *o, bool last) {
  const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
  CUDA_UNROLL
  for (int i = 0; i < N - 1; i++) o[i] = pc_ld(a + i);
  if (last && ((uintptr_t)p & 2) == 0) o[N - 1] = pc_ld((const unsigned short *)(a + N - 1));
  else o[N - 1] = pc_ld(a + N - 1);
}
/* Word i of a window shifted right by sh bits (0, 16 or 32): the bytes starting sh / 8
 * bytes into word i. The clamped funnel shift returns the upper word when sh is 32. */
CUDA_HD uint32_t pc_at(const uint32_t *wv, int i, int sh) {
  return cuda_hd_funnelshift_rc(wv[i], wv[i + 1], sh);
}

/* Bytes of 4 words (16 values, 0..255 each) to floats v - bias (exact): into w[0..15]. */
CUDA_HD void pc_bytes16(const uint32_t *q, float bias, float *w) {
  CUDA_UNROLL
  for (int i = 0; i < 4; i++)
    CUDA_UNROLL
    for (int j = 0; j < 4; j++) w[4 * i + j] = pc_bf(q[i], j) - bias;
}

/* 4 bytes at a 2-byte aligned p (the i-quant fields, 2 mod 4 from an odd-sized block's start)
 * as two 2-byte loads: never past the field, whatever the block's alignment. */
CUDA_HD uint32_t pc_ld4h(const uint8_t *p) {
  return (uint32_t)pc_ld((const unsigned short *)p) | (uint32_t)pc_ld((const unsigned short *)(p + 2)) << 16;
}

/* Loads piece p of a row into raw (cuda_piece<TYPE>::RAW words). last: p is the row's
 * final piece. */
template <int TYPE>
CUDA_HD void cuda_piece_load(const uint8_t *row, int64_t p, bool last, uint32_t *raw) {
  if constexpr (TYPE == ANNA_DTYPE_Q4_0 || TYPE == ANNA_DTYPE_IQ4_NL) {
    pc_window<5>(row + p * 18, raw, last);
  } else if constexpr (TYPE == ANNA_DTYPE_Q8_0) {
    pc_window<9>(row + p * 34, raw, last);
  } else if constexpr (TYPE == ANNA_DTYPE_Q4_K || TYPE == ANNA_DTYPE_Q5_K) {
    const int k = (int)(p & 7);
    const uint8_t *b = row + (p >> 3) * (TYPE == ANNA_DTYPE_Q4_K ? 144 : 176);
    const uint4 h = pc_ld((const uint4 *)b);
    const uint4 q = pc_ld((const uint4 *)(b + (TYPE == ANNA_DTYPE_Q4_K ? 16 : 48) + 16 * k));
    raw[0] = h.x, raw[1] = h.y, raw[2] = h.z, raw[3] = h.w;
    raw[4] = q.x, raw[5] = q.y, raw[6] = q.z, raw[7] = q.w;
    if constexpr (TYPE == ANNA_DTYPE_Q5_K) {
      const uint4 hv = pc_ld((const uint4 *)(b + 16 + 16 * (k & 1)));
      raw[8] = hv.x, raw[9] = hv.y, raw[10] = hv.z, raw[11] = hv.w;
    }
  } else if constexpr (TYPE == ANNA_DTYPE_Q6_K) {
    const int k = (int)(p & 7), hh = k >> 2, m = 16 * (k & 3);
    const uint8_t *b = row + (p >> 3) * 210;
    pc_window<5>(b + hh * 64 + m, raw, false);             /* ends inside the block */
    pc_window<5>(b + 128 + hh * 32 + (m & 31), raw + 5, false);
    const uint8_t *scl = b + 192 + 8 * hh + (k & 3);
    raw[10] = pc_ld(scl), raw[11] = pc_ld(scl + 4);
    raw[12] = pc_ld((const unsigned short *)(b + 208));
  } else if constexpr (cuda_iq_grid_type(TYPE)) {
    /* cuda_iq_gather's words with 2-byte loads (rows are only 2-byte aligned) */
    const int ib = (int)(p & 7);
    const uint8_t *b = row + (p >> 3) * cuda_iq_layout<TYPE>::BB;
    const uint32_t d = pc_ld((const unsigned short *)b);
    raw[3] = 0;
    if constexpr (TYPE == ANNA_DTYPE_IQ2_S) {
      raw[0] = d | (uint32_t)pc_ld(b + 66 + ib) << 16 | (uint32_t)pc_ld(b + 74 + ib) << 24;
      raw[1] = pc_ld4h(b + 2 + 4 * ib), raw[2] = pc_ld4h(b + 34 + 4 * ib);
    } else {
      raw[1] = pc_ld4h(b + 2 + 8 * ib), raw[2] = pc_ld4h(b + 6 + 8 * ib);
      if constexpr (TYPE == ANNA_DTYPE_IQ2_XXS) {
        raw[0] = d;
      } else if constexpr (TYPE == ANNA_DTYPE_IQ2_XS) {
        raw[0] = d | (uint32_t)pc_ld(b + 66 + ib) << 16;
      } else if constexpr (TYPE == ANNA_DTYPE_IQ3_XXS) {
        raw[0] = d, raw[3] = pc_ld4h(b + 66 + 4 * ib);
      } else { /* IQ3_S */
        raw[0] = d | (uint32_t)pc_ld(b + 66 + ib) << 16 | (uint32_t)((pc_ld(b + 106 + ib / 2) >> (4 * (ib % 2))) & 0xf) << 24;
        raw[3] = pc_ld4h(b + 74 + 4 * ib);
      }
    }
  } else { /* IQ4_XS */
    const int ib = (int)(p & 7);
    const uint8_t *b = row + (p >> 3) * 136;
    const uint2 h = pc_ld((const uint2 *)b);
    const uint2 qa = pc_ld((const uint2 *)(b + 8 + 16 * ib)), qb = pc_ld((const uint2 *)(b + 16 + 16 * ib));
    raw[0] = h.x, raw[1] = h.y, raw[2] = qa.x, raw[3] = qa.y, raw[4] = qb.x, raw[5] = qb.y;
  }
}

/* Decodes a loaded piece: weight i of run k (k = i / 16) is sc[k] * w[i] - mn[k], with
 * w[i] a small integer (exact in f32) or an IQ4 table value, so the kernel can dot the
 * integers with the activations and apply the scales once per run. mn is set only where
 * cuda_piece_has_min<TYPE>. Returns e0. tab: the IQ4 value table (shared memory) or NULL. */
template <int TYPE> __host__ __device__ constexpr bool cuda_piece_has_min() {
  return TYPE == ANNA_DTYPE_Q4_K || TYPE == ANNA_DTYPE_Q5_K;
}
/* Q4_K / Q5_K: the scales and mins of sub-blocks 2c and 2c + 1 of a super-block whose
 * header (d, dmin, 12 bytes of 6-bit scales/mins) is raw[0..3], times d and dmin. Shared by the
 * f32 piece decoder and the int8 one. */
CUDA_HD void pc_k_scales(const uint32_t *raw, int c, float *sc, float *mn) {
  const uint32_t hx = raw[0], hy = raw[1], hz = raw[2], hw = raw[3];
  const int jj = (2 * c) & 3, sa = 8 * jj, sb = sa + 8;
  int sc0, mn0, sc1, mn1;
  if (c < 2) {
    sc0 = (hy >> sa) & 63, mn0 = (hz >> sa) & 63;
    sc1 = (hy >> sb) & 63, mn1 = (hz >> sb) & 63;
  } else {
    sc0 = ((hw >> sa) & 0x0f) | (((hy >> sa) >> 6 & 3) << 4);
    mn0 = ((hw >> sa) >> 4 & 0x0f) | (((hz >> sa) >> 6 & 3) << 4);
    sc1 = ((hw >> sb) & 0x0f) | (((hy >> sb) >> 6 & 3) << 4);
    mn1 = ((hw >> sb) >> 4 & 0x0f) | (((hz >> sb) >> 6 & 3) << 4);
  }
  const float d = pc_h2f(hx), dm = pc_h2f(hx >> 16);
  sc[0] = d * (float)sc0, mn[0] = dm * (float)mn0, sc[1] = d * (float)sc1, mn[1] = dm * (float)mn1;
}

template <int TYPE>
CUDA_HD int64_t cuda_piece_decode(const uint8_t *row, int64_t p, const uint32_t *raw, float *w, const float *tab,
                                  float *sc, float *mn) {
  if constexpr (TYPE == ANNA_DTYPE_Q4_0 || TYPE == ANNA_DTYPE_IQ4_NL || TYPE == ANNA_DTYPE_Q8_0) {
    const int sh = (int)((uintptr_t)(row + p * (TYPE == ANNA_DTYPE_Q8_0 ? 34 : 18)) & 2) * 8;
    const float d = pc_h2f(pc_at(raw, 0, sh));
    uint32_t q[8];
    if constexpr (TYPE == ANNA_DTYPE_Q8_0) {
      CUDA_UNROLL
      for (int i = 0; i < 8; i++) q[i] = pc_at(raw, i, sh + 16) ^ 0x80808080u; /* int8 + 128 */
      pc_bytes16(q, 8388736.0f, w);
      pc_bytes16(q + 4, 8388736.0f, w + 16);
    } else {
      CUDA_UNROLL
      for (int i = 0; i < 4; i++) q[i] = pc_at(raw, i, sh + 16);
      if constexpr (TYPE == ANNA_DTYPE_Q4_0) {
        CUDA_UNROLL
        for (int i = 0; i < 4; i++) q[4 + i] = (q[i] >> 4) & 0x0f0f0f0fu, q[i] &= 0x0f0f0f0fu;
        pc_bytes16(q, 8388616.0f, w);
        pc_bytes16(q + 4, 8388616.0f, w + 16);
      } else {
        CUDA_UNROLL
        for (int i = 0; i < 4; i++)
          CUDA_UNROLL
          for (int j = 0; j < 4; j++) {
            w[4 * i + j] = tab[(q[i] >> (8 * j)) & 15];
            w[16 + 4 * i + j] = tab[(q[i] >> (8 * j + 4)) & 15];
          }
      }
    }
    sc[0] = sc[1] = d;
    return p * 32;
  } else if constexpr (TYPE == ANNA_DTYPE_Q4_K || TYPE == ANNA_DTYPE_Q5_K) {
    /* piece k covers quant bytes 16k..16k+15: low nibbles are sub-block 2c, high 2c+1 */
    const int k = (int)(p & 7), c = k >> 1, l = 16 * (k & 1);
    pc_k_scales(raw, c, sc, mn);
    CUDA_UNROLL
    for (int i = 0; i < 4; i++) {
      uint32_t lo = raw[4 + i] & 0x0f0f0f0fu, hi = (raw[4 + i] >> 4) & 0x0f0f0f0fu;
      if constexpr (TYPE == ANNA_DTYPE_Q5_K) {
        lo |= ((raw[8 + i] >> (2 * c)) & 0x01010101u) << 4;
        hi |= ((raw[8 + i] >> (2 * c + 1)) & 0x01010101u) << 4;
      }
      CUDA_UNROLL
      for (int j = 0; j < 4; j++) {
        w[4 * i + j] = pc_bf(lo, j) - 8388608.0f;
        w[16 + 4 * i + j] = pc_bf(hi, j) - 8388608.0f;
      }
    }
    return (p >> 3) * 256 + 64 * c + l;
  } else if constexpr (TYPE == ANNA_DTYPE_Q6_K) {
    /* piece k: half hh = k / 4, low-quant bytes hh*64 + m .. +15 (m = 16 (k % 4)) hold
     * elements 128 hh + m + i (low nibbles) and 128 hh + 64 + m + i (high nibbles); their
     * 2 high bits are field m / 32 (+ 2 for the high run) of bytes 128 + 32 hh + m % 32 + i */
    const int k = (int)(p & 7), hh = k >> 2, m = 16 * (k & 3);
    const uint8_t *b = row + (p >> 3) * 210;
    const int shl = (int)((uintptr_t)(b + hh * 64 + m) & 2) * 8;
    const int shh = (int)((uintptr_t)(b + 128 + hh * 32 + (m & 31)) & 2) * 8;
    const float d = pc_h2f(raw[12]);
    sc[0] = d * (float)(int8_t)raw[10], sc[1] = d * (float)(int8_t)raw[11];
    const int s0 = 2 * (m >> 5);
    uint32_t lo[4], hi[4];
    CUDA_UNROLL
    for (int i = 0; i < 4; i++) {
      const uint32_t ql = pc_at(raw, i, shl), qh = pc_at(raw + 5, i, shh);
      lo[i] = (ql & 0x0f0f0f0fu) | (((qh >> s0) & 0x03030303u) << 4);
      hi[i] = ((ql >> 4) & 0x0f0f0f0fu) | (((qh >> (s0 + 4)) & 0x03030303u) << 4);
    }
    pc_bytes16(lo, 8388640.0f, w);
    pc_bytes16(hi, 8388640.0f, w + 16);
    return (p >> 3) * 256 + 128 * hh + m;
  } else if constexpr (cuda_iq_grid_type(TYPE)) {
    /* the int8 values as floats: byte ^ 0x80 is v + 128, 0..255 */
    uint32_t q[8];
    cuda_iq_decode<TYPE>(raw, q, sc);
    CUDA_UNROLL
    for (int i = 0; i < 8; i++) q[i] ^= 0x80808080u;
    pc_bytes16(q, 8388736.0f, w);
    pc_bytes16(q + 4, 8388736.0f, w + 16);
    return (p >> 3) * 256 + 32 * (p & 7);
  } else { /* IQ4_XS: piece ib is sub-block ib */
    const int ib = (int)(p & 7);
    const int ls = ((raw[1] >> (4 * ib)) & 0xf) | (((raw[0] >> (16 + 2 * ib)) & 3) << 4);
    sc[0] = sc[1] = pc_h2f(raw[0]) * (float)(ls - 32);
    CUDA_UNROLL
    for (int i = 0; i < 4; i++)
      CUDA_UNROLL
      for (int j = 0; j < 4; j++) {
        w[4 * i + j] = tab[(raw[2 + i] >> (8 * j)) & 15];
        w[16 + 4 * i + j] = tab[(raw[2 + i] >> (8 * j + 4)) & 15];
      }
    return (p >> 3) * 256 + 32 * ib;
  }
}

/* ---- Pieces against int8 activations (exact off: the dp4a decode matvec) ----
 * The kernel quantizes each 32-element block of the activations to int8 with one f32
 * scale (q = rint(x * 127 / max|x|)), and keeps per 16-element run the f32 sum of the
 * quantized values (scale * sum q), in shared memory. A piece then becomes NW words of
 * four int8 weights each, dotted with four int8 activations by one dp4a (about 0.3
 * instructions per weight instead of ~3 with f32 activations). Word m (m < 8) pairs with
 * activation word m of the piece: words 0-3 are the run [e0, e0 + 16), words 4-7 the run
 * [e0 + HI, e0 + HI + 16), in the activation order cuda_q8_interleaved<TYPE> names.
 * IQ4 formats need 16 words (two table halves, below) that pair with activation words
 * m % 8. */
template <int TYPE> struct cuda_q8p { enum { NW = 8 }; };
template <> struct cuda_q8p<ANNA_DTYPE_IQ4_NL> { enum { NW = 16 }; };
template <> struct cuda_q8p<ANNA_DTYPE_IQ4_XS> { enum { NW = 16 }; };

/* True when the kernel must store a 32-block's activations as elements 0, 16, 1, 17, ...,
 * 15, 31: the IQ4 lookup below makes a word of nibbles (lo, hi) of two consecutive bytes,
 * i.e. elements j, j + 16, j + 1, j + 17. */
template <int TYPE> __host__ __device__ constexpr bool cuda_q8_interleaved() {
  return TYPE == ANNA_DTYPE_IQ4_NL || TYPE == ANNA_DTYPE_IQ4_XS;
}

/* prmt in its generic mode: selector nibble bits 0-2 pick a byte of {b, a}, bit 3 set
 * replicates that byte's sign bit instead (0x00 or 0xff). __byte_perm ignores bit 3. Only
 * the low 16 bits of sel count. */
CUDA_HD uint32_t pc_prmt(uint32_t a, uint32_t b, uint32_t sel) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t v = (uint64_t)b << 32 | a;
  uint32_t d = 0;
  for (int i = 0; i < 4; i++) {
    const uint32_t n = (sel >> (4 * i)) & 15, byte = (uint32_t)(v >> (8 * (n & 7))) & 0xff;
    d |= (n & 8 ? (byte & 0x80 ? 0xffu : 0u) : byte) << (8 * i);
  }
  return d;
#endif
}

/* IQ4 values of the 4 nibbles in the low 16 bits of q, as int8 in two words whose
 * byte-wise sum is the value: lo = prmt(T[0..7], q) gives T[n] for n < 8 and, with bit 3
 * set, the sign of T[n - 8] (all negative: -1); hi = prmt(T[8..15] + 1, q ^ 8) gives
 * T[n] + 1 for n >= 8 and the sign of a positive byte (0) for n < 8. So lo + hi = T[n] in
 * every byte, and the kernel dots both words with the same activations (two dp4a). The
 * table words are c_kvalues_iq4nl as little-endian bytes: T[0..7] = -127 -104 -83 -65 |
 * -49 -35 -22 -10, T[8..15] + 1 = 2 14 26 39 | 54 70 90 114. */
CUDA_HD void pc_iq4_words(uint32_t q, int *lo, int *hi) {
  const uint32_t x = q ^ 0x88888888u;
  lo[0] = (int)pc_prmt(0xBFAD9881u, 0xF6EADDCFu, q), lo[1] = (int)pc_prmt(0xBFAD9881u, 0xF6EADDCFu, q >> 16);
  hi[0] = (int)pc_prmt(0x271A0E02u, 0x725A4636u, x), hi[1] = (int)pc_prmt(0x271A0E02u, 0x725A4636u, x >> 16);
}

/* First element of piece p (its run 0) in the row. */
template <int TYPE> CUDA_HD int64_t cuda_q8_e0(int64_t p) {
  if constexpr (TYPE == ANNA_DTYPE_Q4_K || TYPE == ANNA_DTYPE_Q5_K) {
    const int k = (int)(p & 7);
    return (p >> 3) * 256 + 64 * (k >> 1) + 16 * (k & 1);
  } else if constexpr (TYPE == ANNA_DTYPE_IQ4_XS || cuda_iq_grid_type(TYPE)) {
    return (p >> 3) * 256 + 32 * (p & 7);
  } else if constexpr (TYPE == ANNA_DTYPE_Q6_K) {
    const int k = (int)(p & 7);
    return (p >> 3) * 256 + 128 * (k >> 2) + 16 * (k & 3);
  } else {
    return p * 32;
  }
}

/* Decodes a loaded piece (cuda_piece_load) to cuda_q8p<TYPE>::NW int8x4 words: weight i of
 * run k is sc[k] * q_i - mn[k] (Q4_K, Q5_K: q in 0..31, mn set), sc[0] * (q_i - 8) (Q4_0:
 * q in 0..15, the kernel subtracts 8 * the block's activation sum), sc[k] * (q_i - 32)
 * (Q6_K: q in 0..63, runs 64 elements apart, likewise), sc[0] * T[n_i] (IQ4) or sc[0] * q_i
 * (Q8_0), sc[k] * q_i (2- and 3-bit i-quants: q signed, |q| <= 62; sc[0] == sc[1] unless
 * cuda_iq_run_scales). */
template <int TYPE>
CUDA_HD void cuda_q8_decode(const uint8_t *row, int64_t p, const uint32_t *raw, int *wq, float *sc, float *mn) {
  if constexpr (TYPE == ANNA_DTYPE_Q4_0 || TYPE == ANNA_DTYPE_IQ4_NL || TYPE == ANNA_DTYPE_Q8_0) {
    const int sh = (int)((uintptr_t)(row + p * (TYPE == ANNA_DTYPE_Q8_0 ? 34 : 18)) & 2) * 8;
    sc[0] = sc[1] = pc_h2f(pc_at(raw, 0, sh));
    if constexpr (TYPE == ANNA_DTYPE_Q8_0) {
      CUDA_UNROLL
      for (int i = 0; i < 8; i++) wq[i] = (int)pc_at(raw, i, sh + 16);
    } else {
      CUDA_UNROLL
      for (int i = 0; i < 4; i++) {
        const uint32_t q = pc_at(raw, i, sh + 16);
        if constexpr (TYPE == ANNA_DTYPE_Q4_0) {
          wq[i] = (int)(q & 0x0f0f0f0fu), wq[4 + i] = (int)((q >> 4) & 0x0f0f0f0fu);
        } else {
          pc_iq4_words(q, wq + 2 * i, wq + 8 + 2 * i);
        }
      }
    }
  } else if constexpr (TYPE == ANNA_DTYPE_Q4_K || TYPE == ANNA_DTYPE_Q5_K) {
    const int k = (int)(p & 7), c = k >> 1;
    pc_k_scales(raw, c, sc, mn);
    CUDA_UNROLL
    for (int i = 0; i < 4; i++) {
      uint32_t lo = raw[4 + i] & 0x0f0f0f0fu, hi = (raw[4 + i] >> 4) & 0x0f0f0f0fu;
      if constexpr (TYPE == ANNA_DTYPE_Q5_K) {
        lo |= ((raw[8 + i] >> (2 * c)) & 0x01010101u) << 4;
        hi |= ((raw[8 + i] >> (2 * c + 1)) & 0x01010101u) << 4;
      }
      wq[i] = (int)lo, wq[4 + i] = (int)hi;
    }
  } else if constexpr (TYPE == ANNA_DTYPE_Q6_K) {
    /* as cuda_piece_decode: low nibbles + 2 high bits are run 0, high nibbles run 1 */
    const int k = (int)(p & 7), hh = k >> 2, m = 16 * (k & 3);
    const uint8_t *b = row + (p >> 3) * 210;
    const int shl = (int)((uintptr_t)(b + hh * 64 + m) & 2) * 8;
    const int shh = (int)((uintptr_t)(b + 128 + hh * 32 + (m & 31)) & 2) * 8;
    const float d = pc_h2f(raw[12]);
    sc[0] = d * (float)(int8_t)raw[10], sc[1] = d * (float)(int8_t)raw[11];
    const int s0 = 2 * (m >> 5);
    CUDA_UNROLL
    for (int i = 0; i < 4; i++) {
      const uint32_t ql = pc_at(raw, i, shl), qh = pc_at(raw + 5, i, shh);
      wq[i] = (int)((ql & 0x0f0f0f0fu) | (((qh >> s0) & 0x03030303u) << 4));
      wq[4 + i] = (int)(((ql >> 4) & 0x0f0f0f0fu) | (((qh >> (s0 + 4)) & 0x03030303u) << 4));
    }
  } else if constexpr (cuda_iq_grid_type(TYPE)) {
    cuda_iq_decode<TYPE>(raw, (uint32_t *)wq, sc);
  } else { /* IQ4_XS */
    const int ib = (int)(p & 7);
    const int ls = ((raw[1] >> (4 * ib)) & 0xf) | (((raw[0] >> (16 + 2 * ib)) & 3) << 4);
    sc[0] = sc[1] = pc_h2f(raw[0]) * (float)(ls - 32);
    CUDA_UNROLL
    for (int i = 0; i < 4; i++) pc_iq4_words(raw[2 + i], wq + 2 * i, wq + 8 + 2 * i);
  }
}

#endif
