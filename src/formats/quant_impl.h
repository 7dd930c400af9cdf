/* quant_impl.h: internal to src/formats/quant*.c: block layouts (byte-exact with ggml,
 * checked by static asserts) and the per-ISA kernel tables. Not for use outside formats/. */
#ifndef ANNA_FORMATS_QUANT_IMPL_H
#define ANNA_FORMATS_QUANT_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "formats/dtype.h"

#define QK 32
#define QKK 256

typedef struct { uint16_t d; uint8_t qs[16]; } blk_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[16]; } blk_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_1;
typedef struct { uint16_t d; int8_t qs[32]; } blk_q8_0;
/* Activation block for Q4_1/Q5_1: s = f16(d * sum(qs)), for the weights' min term. */
typedef struct { uint16_t d, s; int8_t qs[32]; } blk_q8_1;
typedef struct { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; } blk_q2_k;
typedef struct { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; } blk_q3_k;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } blk_q4_k;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } blk_q5_k;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } blk_q6_k;
/* Activation block: bsums[j] = sum of qs[16j .. 16j+15], for the K-quant min terms. */
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } blk_q8_k;
typedef struct { uint16_t d; uint16_t qs[32]; } blk_iq2_xxs;
typedef struct { uint16_t d; uint16_t qs[32]; uint8_t scales[8]; } blk_iq2_xs;
typedef struct { uint16_t d; uint8_t qs[32]; uint8_t signs[32]; uint8_t qh[8]; uint8_t scales[8]; } blk_iq2_s;
typedef struct { uint16_t d; uint8_t qs[96]; } blk_iq3_xxs;
typedef struct { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4]; } blk_iq3_s;
typedef struct { uint16_t d; uint8_t qs[32]; uint16_t qh[8]; } blk_iq1_s;
typedef struct { uint8_t qs[32]; uint8_t qh[16]; uint8_t scales[8]; } blk_iq1_m;
typedef struct { uint16_t d; uint8_t qs[16]; } blk_iq4_nl;
typedef struct { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; } blk_iq4_xs;

_Static_assert(sizeof(blk_q4_0) == 18, "q4_0");
_Static_assert(sizeof(blk_q4_1) == 20, "q4_1");
_Static_assert(sizeof(blk_q5_0) == 22, "q5_0");
_Static_assert(sizeof(blk_q5_1) == 24, "q5_1");
_Static_assert(sizeof(blk_q8_0) == 34, "q8_0");
_Static_assert(sizeof(blk_q8_1) == 36, "q8_1");
_Static_assert(sizeof(blk_q2_k) == 84, "q2_k");
_Static_assert(sizeof(blk_q3_k) == 110, "q3_k");
_Static_assert(sizeof(blk_q4_k) == 144, "q4_k");
_Static_assert(sizeof(blk_q5_k) == 176, "q5_k");
_Static_assert(sizeof(blk_q6_k) == 210, "q6_k");
_Static_assert(sizeof(blk_q8_k) == 292, "q8_k");
_Static_assert(sizeof(blk_iq2_xxs) == 66, "iq2_xxs");
_Static_assert(sizeof(blk_iq2_xs) == 74, "iq2_xs");
_Static_assert(sizeof(blk_iq2_s) == 82, "iq2_s");
_Static_assert(sizeof(blk_iq3_xxs) == 98, "iq3_xxs");
_Static_assert(sizeof(blk_iq3_s) == 110, "iq3_s");
_Static_assert(sizeof(blk_iq1_s) == 50, "iq1_s");
_Static_assert(sizeof(blk_iq1_m) == 56, "iq1_m");
_Static_assert(sizeof(blk_iq4_nl) == 18, "iq4_nl");
_Static_assert(sizeof(blk_iq4_xs) == 136, "iq4_xs");

typedef float (*quant_dot_fn)(int64_t n, const void *w, const void *act);

/* i-quant super-block decoded for integer dots: q[256] signed values (|q| <= 127) and one
 * float scale per 16 elements, so that weight[e] == sc[e / 16] * q[e] up to float rounding.
 * IQ1 deltas (+-1/8) are folded in exactly as q = 8 * grid +- 1 with sc / 8. Returns false
 * for a type that has no decoder. */
bool quant_iq_decode(int type, const void *blk, int8_t q[256], float sc[16]);

/* Fill table[type] with the kernels an ISA file provides (others untouched). */
void quant_avx2_fill(quant_dot_fn table[ANNA_DTYPE_COUNT]);
void quant_avx512_fill(quant_dot_fn table[ANNA_DTYPE_COUNT]);
/* AVX-512 activation quantizers, bit-identical to the scalar ones (Q8_0, or Q8_1 with
 * with_s; Q8_K). Only called when the CPU has AVX-512. */
void quant_avx512_quantize_q8_0(const float *x, void *dst, int64_t n, int with_s);
void quant_avx512_quantize_q8_k(const float *x, void *dst, int64_t n);

/* Half -> float without F16C, so the scalar reference builds for any target. */
static inline float quant_h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: value = man * 2^-24, exact in float */
      float v = (float)man * (1.0f / 16777216.0f);
      memcpy(&bits, &v, 4);
      bits |= sign;
    }
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* K-quant 6-bit scale/min unpacking (Q4_K, Q5_K): sub-block j of 8. */
static inline void quant_k4_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
    *mn = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

/* Q4_K/Q5_K 6-bit scales and mins, unpacked four at a time with 32-bit masks. */
static inline void quant_k4_unpack(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
  uint32_t u[3], a, b, c, e;
  memcpy(u, s, 12);
  a = u[0] & 0x3f3f3f3fu;
  b = u[1] & 0x3f3f3f3fu;
  c = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u);
  e = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u);
  memcpy(sc, &a, 4);
  memcpy(sc + 4, &c, 4);
  memcpy(mn, &b, 4);
  memcpy(mn + 4, &e, 4);
}

#endif
