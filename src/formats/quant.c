/* quant.c: scalar reference dequantization, activation quantization, the scalar dot
 * kernels, ISA dispatch and the matmul core. SIMD kernels live in quant_avx2.c and
 * quant_avx512.c; see quant.h for the contract. */
#include "formats/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "formats/quant_grids.h"
#include "formats/quant_impl.h"

float quant_f16_to_f32(uint16_t h) { return quant_h2f(h); }

float quant_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t quant_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
  if (ax < 0x38800000u) { /* below 2^-14: subnormal half, units of 2^-24 */
    float a;
    memcpy(&a, &ax, 4);
    return (uint16_t)(sign | (uint16_t)lrintf(a * 16777216.0f));
  }
  uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u); /* round to nearest even at bit 13 */
  return (uint16_t)(sign | ((r - (112u << 23)) >> 13));
}

/* ---- dequantization: one block of each format -> floats ---- */

static void deq_q4_0(const blk_q4_0 *b, float *y) {
  float d = quant_h2f(b->d);
  for (int j = 0; j < 16; j++) {
    y[j] = d * (float)((b->qs[j] & 0xf) - 8);
    y[j + 16] = d * (float)((b->qs[j] >> 4) - 8);
  }
}

static void deq_q4_1(const blk_q4_1 *b, float *y) {
  float d = quant_h2f(b->d), m = quant_h2f(b->m);
  for (int j = 0; j < 16; j++) {
    y[j] = d * (float)(b->qs[j] & 0xf) + m;
    y[j + 16] = d * (float)(b->qs[j] >> 4) + m;
  }
}

static void deq_q5_0(const blk_q5_0 *b, float *y) {
  float d = quant_h2f(b->d);
  uint32_t qh;
  memcpy(&qh, b->qh, 4);
  for (int j = 0; j < 16; j++) {
    int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
    y[j] = d * (float)(((b->qs[j] & 0xf) | h0) - 16);
    y[j + 16] = d * (float)(((b->qs[j] >> 4) | h1) - 16);
  }
}

static void deq_q5_1(const blk_q5_1 *b, float *y) {
  float d = quant_h2f(b->d), m = quant_h2f(b->m);
  uint32_t qh;
  memcpy(&qh, b->qh, 4);
  for (int j = 0; j < 16; j++) {
    int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
    y[j] = d * (float)((b->qs[j] & 0xf) | h0) + m;
    y[j + 16] = d * (float)((b->qs[j] >> 4) | h1) + m;
  }
}

static void deq_q8_0(const blk_q8_0 *b, float *y) {
  float d = quant_h2f(b->d);
  for (int j = 0; j < 32; j++) y[j] = d * (float)b->qs[j];
}

static void deq_q2_k(const blk_q2_k *b, float *y) {
  float d = quant_h2f(b->d), dmin = quant_h2f(b->dmin);
  for (int h = 0; h < 2; h++)
    for (int s = 0; s < 4; s++)
      for (int l = 0; l < 32; l++) {
        int e = h * 128 + s * 32 + l;
        uint8_t sc = b->scales[e / 16];
        int q = (b->qs[h * 32 + l] >> (2 * s)) & 3;
        y[e] = d * (float)(sc & 0xf) * (float)q - dmin * (float)(sc >> 4);
      }
}

static void deq_q3_k(const blk_q3_k *b, float *y) {
  float d = quant_h2f(b->d);
  int sc[16];
  for (int i = 0; i < 16; i++) {
    int lo = (b->scales[i % 8] >> (4 * (i / 8))) & 0xf;
    int hi = (b->scales[8 + i % 4] >> (2 * (i / 4))) & 3;
    sc[i] = (lo | (hi << 4)) - 32;
  }
  for (int h = 0; h < 2; h++)
    for (int s = 0; s < 4; s++)
      for (int l = 0; l < 32; l++) {
        int e = h * 128 + s * 32 + l;
        int q = (b->qs[h * 32 + l] >> (2 * s)) & 3;
        if (!((b->hmask[l] >> (h * 4 + s)) & 1)) q -= 4;
        y[e] = d * (float)sc[e / 16] * (float)q;
      }
}

static void deq_q4_k(const blk_q4_k *b, float *y) {
  float d = quant_h2f(b->d), dmin = quant_h2f(b->dmin);
  for (int s = 0; s < 8; s++) {
    uint8_t sc, mn;
    quant_k4_scale_min(b->scales, s, &sc, &mn);
    float ds = d * sc, ms = dmin * mn;
    for (int l = 0; l < 32; l++)
      y[s * 32 + l] = ds * (float)((b->qs[(s / 2) * 32 + l] >> (4 * (s % 2))) & 0xf) - ms;
  }
}

static void deq_q5_k(const blk_q5_k *b, float *y) {
  float d = quant_h2f(b->d), dmin = quant_h2f(b->dmin);
  for (int s = 0; s < 8; s++) {
    uint8_t sc, mn;
    quant_k4_scale_min(b->scales, s, &sc, &mn);
    float ds = d * sc, ms = dmin * mn;
    for (int l = 0; l < 32; l++) {
      int q = (b->qs[(s / 2) * 32 + l] >> (4 * (s % 2))) & 0xf;
      q |= ((b->qh[l] >> s) & 1) << 4;
      y[s * 32 + l] = ds * (float)q - ms;
    }
  }
}

static void deq_q6_k(const blk_q6_k *b, float *y) {
  float d = quant_h2f(b->d);
  for (int h = 0; h < 2; h++)
    for (int p = 0; p < 128; p++) {
      int lo = (b->ql[h * 64 + p % 64] >> (4 * (p / 64))) & 0xf;
      int hi = (b->qh[h * 32 + p % 32] >> (2 * (p / 32))) & 3;
      int e = h * 128 + p;
      y[e] = d * (float)b->scales[e / 16] * (float)((lo | (hi << 4)) - 32);
    }
}

static void deq_iq4_nl(const blk_iq4_nl *b, float *y) {
  float d = quant_h2f(b->d);
  for (int j = 0; j < 16; j++) {
    y[j] = d * (float)quant_kvalues_iq4nl[b->qs[j] & 0xf];
    y[j + 16] = d * (float)quant_kvalues_iq4nl[b->qs[j] >> 4];
  }
}

static void deq_iq4_xs(const blk_iq4_xs *b, float *y) {
  float d = quant_h2f(b->d);
  for (int ib = 0; ib < 8; ib++) {
    int ls = ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((b->scales_h >> (2 * ib)) & 3) << 4);
    float dl = d * (float)(ls - 32);
    const uint8_t *q = b->qs + 16 * ib;
    for (int j = 0; j < 16; j++) {
      y[32 * ib + j] = dl * (float)quant_kvalues_iq4nl[q[j] & 0xf];
      y[32 * ib + j + 16] = dl * (float)quant_kvalues_iq4nl[q[j] >> 4];
    }
  }
}

/* 8 grid values with signs from a ksigns byte (bit j set = negative). */
static void put8(float *y, float db, const uint8_t *g, uint8_t signs) {
  for (int j = 0; j < 8; j++) y[j] = db * (float)g[j] * ((signs >> j) & 1 ? -1.0f : 1.0f);
}

static void deq_iq2_xxs(const blk_iq2_xxs *b, float *y) {
  float d = quant_h2f(b->d);
  for (int ib = 0; ib < 8; ib++) {
    uint32_t a0, a1;
    memcpy(&a0, b->qs + 4 * ib, 4);
    memcpy(&a1, b->qs + 4 * ib + 2, 4);
    float db = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
    for (int l = 0; l < 4; l++)
      put8(y + 32 * ib + 8 * l, db, quant_grid_iq2xxs[(a0 >> (8 * l)) & 0xff],
           quant_ksigns[(a1 >> (7 * l)) & 127]);
  }
}

static void deq_iq2_xs(const blk_iq2_xs *b, float *y) {
  float d = quant_h2f(b->d);
  for (int g = 0; g < 32; g++) {
    int k = g / 2; /* scale nibble per 16 elements */
    float db = d * (0.5f + (float)((b->scales[k / 2] >> (4 * (k % 2))) & 0xf)) * 0.25f;
    put8(y + 8 * g, db, quant_grid_iq2xs[b->qs[g] & 511], quant_ksigns[b->qs[g] >> 9]);
  }
}

static void deq_iq2_s(const blk_iq2_s *b, float *y) {
  float d = quant_h2f(b->d);
  for (int g = 0; g < 32; g++) {
    int k = g / 2;
    float db = d * (0.5f + (float)((b->scales[k / 2] >> (4 * (k % 2))) & 0xf)) * 0.25f;
    int idx = b->qs[g] | (((b->qh[g / 4] >> (2 * (g % 4))) & 3) << 8);
    put8(y + 8 * g, db, quant_grid_iq2s[idx], b->signs[g]);
  }
}

static void deq_iq3_xxs(const blk_iq3_xxs *b, float *y) {
  float d = quant_h2f(b->d);
  for (int ib = 0; ib < 8; ib++) {
    uint32_t ss;
    memcpy(&ss, b->qs + 64 + 4 * ib, 4);
    float db = d * (0.5f + (float)(ss >> 28)) * 0.5f;
    for (int l = 0; l < 4; l++) {
      uint8_t g[8];
      memcpy(g, quant_grid_iq3xxs[b->qs[8 * ib + 2 * l]], 4);
      memcpy(g + 4, quant_grid_iq3xxs[b->qs[8 * ib + 2 * l + 1]], 4);
      put8(y + 32 * ib + 8 * l, db, g, quant_ksigns[(ss >> (7 * l)) & 127]);
    }
  }
}

static void deq_iq3_s(const blk_iq3_s *b, float *y) {
  float d = quant_h2f(b->d);
  for (int g = 0; g < 32; g++) { /* 8-element groups, 2 grid entries each */
    int ib = g / 4;
    float db = d * (float)(1 + 2 * ((b->scales[ib / 2] >> (4 * (ib % 2))) & 0xf));
    uint8_t q[8];
    for (int h = 0; h < 2; h++) {
      int i = 2 * g + h;
      int idx = b->qs[i] | (((b->qh[i / 8] >> (i % 8)) & 1) << 8);
      memcpy(q + 4 * h, quant_grid_iq3s[idx], 4);
    }
    put8(y + 8 * g, db, q, b->signs[g]);
  }
}

static void deq_iq1_s(const blk_iq1_s *b, float *y) {
  float d = quant_h2f(b->d);
  for (int ib = 0; ib < 8; ib++) {
    uint16_t qh = b->qh[ib];
    float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
    float delta = (qh & 0x8000) ? -0.125f : 0.125f;
    for (int l = 0; l < 4; l++) {
      const int8_t *g = quant_grid_iq1s[b->qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
      for (int j = 0; j < 8; j++) y[32 * ib + 8 * l + j] = dl * ((float)g[j] + delta);
    }
  }
}

static void deq_iq1_m(const blk_iq1_m *b, float *y) {
  uint16_t sc[4];
  memcpy(sc, b->scales, 8);
  uint16_t dbits = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                              (sc[3] & 0xf000));
  float d = quant_h2f(dbits);
  for (int g = 0; g < 32; g++) { /* 8-element groups; one 3-bit scale per 16 elements */
    int k = g / 2;
    float dl = d * (float)(2 * ((sc[k / 4] >> (3 * (k % 4))) & 7) + 1);
    int nib = (b->qh[g / 2] >> (4 * (g % 2))) & 0xf;
    float delta = (nib & 8) ? -0.125f : 0.125f;
    const int8_t *gr = quant_grid_iq1s[b->qs[g] | ((nib & 7) << 8)];
    for (int j = 0; j < 8; j++) y[8 * g + j] = dl * ((float)gr[j] + delta);
  }
}

/* Dequantizes nb blocks starting at src. Returns 0 or ANNA_EUNSUPPORTED. */
static int deq_blocks(int type, const void *src, float *y, int64_t nb) {
  const uint8_t *p = src;
  int64_t bb = dtype_block_bytes(type), bs = dtype_block_size(type);
  switch (type) {
  case ANNA_DTYPE_F32: memcpy(y, src, (size_t)nb * 4); return 0;
  case ANNA_DTYPE_F16:
    for (int64_t i = 0; i < nb; i++) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      y[i] = quant_h2f(h);
    }
    return 0;
  case ANNA_DTYPE_BF16:
    for (int64_t i = 0; i < nb; i++) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      y[i] = quant_bf16_to_f32(h);
    }
    return 0;
  default: break;
  }
#define DEQ(T, fn)                                                        \
  case T:                                                                 \
    for (int64_t i = 0; i < nb; i++) fn((const void *)(p + i * bb), y + i * bs); \
    return 0;
  switch (type) {
    DEQ(ANNA_DTYPE_Q4_0, deq_q4_0)
    DEQ(ANNA_DTYPE_Q4_1, deq_q4_1)
    DEQ(ANNA_DTYPE_Q5_0, deq_q5_0)
    DEQ(ANNA_DTYPE_Q5_1, deq_q5_1)
    DEQ(ANNA_DTYPE_Q8_0, deq_q8_0)
    DEQ(ANNA_DTYPE_Q2_K, deq_q2_k)
    DEQ(ANNA_DTYPE_Q3_K, deq_q3_k)
    DEQ(ANNA_DTYPE_Q4_K, deq_q4_k)
    DEQ(ANNA_DTYPE_Q5_K, deq_q5_k)
    DEQ(ANNA_DTYPE_Q6_K, deq_q6_k)
    DEQ(ANNA_DTYPE_IQ4_NL, deq_iq4_nl)
    DEQ(ANNA_DTYPE_IQ4_XS, deq_iq4_xs)
    DEQ(ANNA_DTYPE_IQ2_XXS, deq_iq2_xxs)
    DEQ(ANNA_DTYPE_IQ2_XS, deq_iq2_xs)
    DEQ(ANNA_DTYPE_IQ2_S, deq_iq2_s)
    DEQ(ANNA_DTYPE_IQ3_XXS, deq_iq3_xxs)
    DEQ(ANNA_DTYPE_IQ3_S, deq_iq3_s)
    DEQ(ANNA_DTYPE_IQ1_S, deq_iq1_s)
    DEQ(ANNA_DTYPE_IQ1_M, deq_iq1_m)
  default: return ANNA_EUNSUPPORTED;
  }
#undef DEQ
}

bool quant_can_dequantize(int type) {
  switch (type) {
  case ANNA_DTYPE_F32: case ANNA_DTYPE_F16: case ANNA_DTYPE_BF16:
  case ANNA_DTYPE_Q4_0: case ANNA_DTYPE_Q4_1: case ANNA_DTYPE_Q5_0: case ANNA_DTYPE_Q5_1:
  case ANNA_DTYPE_Q8_0: case ANNA_DTYPE_Q2_K: case ANNA_DTYPE_Q3_K: case ANNA_DTYPE_Q4_K:
  case ANNA_DTYPE_Q5_K: case ANNA_DTYPE_Q6_K: case ANNA_DTYPE_IQ4_NL: case ANNA_DTYPE_IQ4_XS:
  case ANNA_DTYPE_IQ2_XXS: case ANNA_DTYPE_IQ2_XS: case ANNA_DTYPE_IQ2_S:
  case ANNA_DTYPE_IQ3_XXS: case ANNA_DTYPE_IQ3_S: case ANNA_DTYPE_IQ1_S: case ANNA_DTYPE_IQ1_M:
    return true;
  default: return false;
  }
}

bool quant_can_dot(int type) { return quant_can_dequantize(type); }

int quant_act_type(int wtype) {
  if (!quant_can_dot(wtype)) return -1;
  if (wtype == ANNA_DTYPE_Q4_1 || wtype == ANNA_DTYPE_Q5_1) return ANNA_DTYPE_Q8_1; /* as ggml */
  switch (dtype_block_size(wtype)) {
  case 1: return ANNA_DTYPE_F32;
  case 32: return ANNA_DTYPE_Q8_0;
  default: return ANNA_DTYPE_Q8_K;
  }
}

int64_t quant_act_row_bytes(int wtype, int64_t n) {
  int at = quant_act_type(wtype);
  if (at < 0 || dtype_row_bytes(wtype, n) < 0) return -1;
  return dtype_row_bytes(at, n);
}

int quant_dequantize_row(int type, const void *src, float *dst, int64_t n) {
  if (!quant_can_dequantize(type)) return ANNA_EUNSUPPORTED;
  if (dtype_row_bytes(type, n) < 0) return ANNA_EINVAL;
  return deq_blocks(type, src, dst, n / dtype_block_size(type));
}

/* ---- activation quantization ----
 * These reproduce ggml-cpu's x86 activation quantizers value for value (llama.cpp's
 * numerics; checked against the vendored source, see bench/notes/exactness.md):
 *  Q8_0 / Q8_1 (quantize_row_q8_0/_q8_1, AVX path): amax over the block, d = amax / 127
 *    stored as f16 (round to nearest even), multiplier 127 / amax (not 1 / d: the two differ
 *    in the last bit for some amax), products rounded to nearest even. Q8_1 also stores
 *    s = f16(d * sum(q)) with the unrounded f32 d.
 *  Q8_K (quantize_row_q8_K_ref, which x86 uses): the signed value of largest magnitude
 *    (first one in index order) gives iscale = -127 / max; q = round-half-even(iscale * x),
 *    at most 127; d = 1 / iscale in f32 (negative when max > 0); bsums per 16.
 * lrintf rounds half to even in the default rounding mode, like _mm256_round_ps. */

static void q8_block(const float *v, int8_t *q, float *d_out, int *sum) {
  float amax = 0;
  for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(v[j]));
  const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
  int s = 0;
  for (int j = 0; j < QK; j++) {
    q[j] = (int8_t)lrintf(v[j] * id);
    s += q[j];
  }
  *d_out = d;
  *sum = s;
}

void quant_quantize_row_q8_0(const float *x, void *dst, int64_t n) {
  if (quant_isa_get() == QUANT_ISA_AVX512) {
    quant_avx512_quantize_q8_0(x, dst, n, 0);
    return;
  }
  blk_q8_0 *y = dst;
  for (int64_t i = 0; i < n / QK; i++) {
    float d;
    int s;
    q8_block(x + i * QK, y[i].qs, &d, &s);
    y[i].d = quant_f32_to_f16(d);
  }
}

void quant_quantize_row_q8_1(const float *x, void *dst, int64_t n) {
  if (quant_isa_get() == QUANT_ISA_AVX512) {
    quant_avx512_quantize_q8_0(x, dst, n, 1);
    return;
  }
  blk_q8_1 *y = dst;
  for (int64_t i = 0; i < n / QK; i++) {
    float d;
    int s;
    q8_block(x + i * QK, y[i].qs, &d, &s);
    y[i].d = quant_f32_to_f16(d);
    y[i].s = quant_f32_to_f16(d * (float)s);
  }
}

void quant_quantize_row_q8_k(const float *x, void *dst, int64_t n) {
  if (quant_isa_get() == QUANT_ISA_AVX512) {
    quant_avx512_quantize_q8_k(x, dst, n);
    return;
  }
  blk_q8_k *y = dst;
  for (int64_t i = 0; i < n / QKK; i++) {
    const float *v = x + i * QKK;
    float amax = 0, max = 0;
    for (int j = 0; j < QKK; j++)
      if (fabsf(v[j]) > amax) amax = fabsf(v[j]), max = v[j];
    if (amax == 0.0f) {
      memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < QKK; j++) {
      long q = lrintf(iscale * v[j]);
      y[i].qs[j] = (int8_t)(q < 127 ? q : 127);
    }
    for (int g = 0; g < 16; g++) {
      int s = 0;
      for (int j = 0; j < 16; j++) s += y[i].qs[16 * g + j];
      y[i].bsums[g] = (int16_t)s;
    }
    y[i].d = 1.0f / iscale;
  }
}

int quant_quantize_act(int wtype, const float *x, void *dst, int64_t n) {
  if (quant_act_row_bytes(wtype, n) < 0) return ANNA_EINVAL;
  switch (quant_act_type(wtype)) {
  case ANNA_DTYPE_F32: memcpy(dst, x, (size_t)n * sizeof(float)); return 0;
  case ANNA_DTYPE_Q8_0: quant_quantize_row_q8_0(x, dst, n); return 0;
  case ANNA_DTYPE_Q8_1: quant_quantize_row_q8_1(x, dst, n); return 0;
  default: quant_quantize_row_q8_k(x, dst, n); return 0;
  }
}

/* ---- scalar dot kernels ---- */

/* Reference for every quantized type: dequantize one weight block, dot it with the int8
 * activation block, scale by the activation's d. Slow but obviously right; the SIMD
 * kernels are checked against it. */
static float dot_generic(int type, int64_t n, const void *w, const void *act) {
  int64_t bs = dtype_block_size(type), bb = dtype_block_bytes(type);
  const uint8_t *wp = w;
  float buf[QKK];
  double sum = 0;
  for (int64_t i = 0; i < n / bs; i++) {
    if (type == ANNA_DTYPE_Q4_1 || type == ANNA_DTYPE_Q5_1) {
      /* ggml's form: d_w d_a sum(q_w q_a) + m_w s_a, with s_a the stored f16 of d_a sum(q_a). */
      const blk_q8_1 *a = (const blk_q8_1 *)act + i;
      const uint8_t *b = wp + i * bb;
      uint16_t hd, hm;
      uint32_t qh = 0;
      memcpy(&hd, b, 2);
      memcpy(&hm, b + 2, 2);
      const uint8_t *qs = b + 4;
      if (type == ANNA_DTYPE_Q5_1) memcpy(&qh, b + 4, 4), qs = b + 8;
      const float dw = quant_h2f(hd), mw = quant_h2f(hm);
      int32_t si = 0;
      for (int j = 0; j < 16; j++) {
        si += (int32_t)((qs[j] & 0xf) | (((qh >> j) & 1) << 4)) * a->qs[j];
        si += (int32_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) * a->qs[j + 16];
      }
      sum += (double)(dw * quant_h2f(a->d) * (float)si) + (double)(mw * quant_h2f(a->s));
      continue;
    }
    deq_blocks(type, wp + i * bb, buf, 1);
    float s = 0, d;
    const int8_t *q;
    if (bs == QK) {
      const blk_q8_0 *a = (const blk_q8_0 *)act + i;
      q = a->qs;
      d = quant_h2f(a->d);
    } else {
      const blk_q8_k *a = (const blk_q8_k *)act + i;
      q = a->qs;
      d = a->d;
    }
    for (int j = 0; j < bs; j++) s += buf[j] * (float)q[j];
    sum += (double)(s * d);
  }
  return (float)sum;
}

static float dot_f32(int64_t n, const void *w, const void *act) {
  const float *a = w, *b = act;
  float s = 0;
  for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

static float dot_f16(int64_t n, const void *w, const void *act) {
  const uint8_t *p = w;
  const float *b = act;
  float s = 0;
  for (int64_t i = 0; i < n; i++) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    s += quant_h2f(h) * b[i];
  }
  return s;
}

static float dot_bf16(int64_t n, const void *w, const void *act) {
  const uint8_t *p = w;
  const float *b = act;
  float s = 0;
  for (int64_t i = 0; i < n; i++) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    s += quant_bf16_to_f32(h) * b[i];
  }
  return s;
}

#define GEN(T) \
  static float dot_scalar_##T(int64_t n, const void *w, const void *a) { \
    return dot_generic(ANNA_DTYPE_##T, n, w, a); \
  }
GEN(Q4_0) GEN(Q4_1) GEN(Q5_0) GEN(Q5_1) GEN(Q8_0) GEN(Q2_K) GEN(Q3_K) GEN(Q4_K) GEN(Q5_K)
GEN(Q6_K) GEN(IQ4_NL) GEN(IQ4_XS) GEN(IQ2_XXS) GEN(IQ2_XS) GEN(IQ2_S) GEN(IQ3_XXS) GEN(IQ3_S)
GEN(IQ1_S) GEN(IQ1_M)
#undef GEN


/* ---- i-quant decoding to int8 (for the SIMD integer dots) ---- */

static uint64_t g_sign_mask[256]; /* bit j of the index -> byte j = 0xff */

static void sign_mask_init(void) {
  for (int s = 0; s < 256; s++) {
    uint64_t m = 0;
    for (int j = 0; j < 8; j++)
      if ((s >> j) & 1) m |= (uint64_t)0xff << (8 * j);
    g_sign_mask[s] = m;
  }
}

/* 8 unsigned grid bytes (each 1..127), negated where the sign bit is set: two's complement
 * per byte as (g ^ m) + 1, which cannot carry across bytes since g != 0. */
static void signed8(int8_t *dst, const uint8_t *g, uint8_t signs) {
  uint64_t v, m = g_sign_mask[signs];
  memcpy(&v, g, 8);
  v = (v ^ m) + (m & 0x0101010101010101ull);
  memcpy(dst, &v, 8);
}

static void iq1_group(int8_t *dst, const int8_t *g, bool neg_delta) {
  int8_t dl = neg_delta ? -1 : 1;
  for (int j = 0; j < 8; j++) dst[j] = (int8_t)(8 * g[j] + dl);
}

bool quant_iq_decode(int type, const void *blk, int8_t q[256], float sc[16]) {
  switch (type) {
  case ANNA_DTYPE_IQ2_XXS: {
    const blk_iq2_xxs *b = blk;
    float d = quant_h2f(b->d);
    for (int ib = 0; ib < 8; ib++) {
      uint32_t a0, a1;
      memcpy(&a0, b->qs + 4 * ib, 4);
      memcpy(&a1, b->qs + 4 * ib + 2, 4);
      sc[2 * ib] = sc[2 * ib + 1] = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
      for (int l = 0; l < 4; l++)
        signed8(q + 32 * ib + 8 * l, quant_grid_iq2xxs[(a0 >> (8 * l)) & 0xff],
                quant_ksigns[(a1 >> (7 * l)) & 127]);
    }
    return true;
  }
  case ANNA_DTYPE_IQ2_XS: {
    const blk_iq2_xs *b = blk;
    float d = quant_h2f(b->d);
    for (int k = 0; k < 16; k++)
      sc[k] = d * (0.5f + (float)((b->scales[k / 2] >> (4 * (k % 2))) & 0xf)) * 0.25f;
    for (int g = 0; g < 32; g++)
      signed8(q + 8 * g, quant_grid_iq2xs[b->qs[g] & 511], quant_ksigns[b->qs[g] >> 9]);
    return true;
  }
  case ANNA_DTYPE_IQ2_S: {
    const blk_iq2_s *b = blk;
    float d = quant_h2f(b->d);
    for (int k = 0; k < 16; k++)
      sc[k] = d * (0.5f + (float)((b->scales[k / 2] >> (4 * (k % 2))) & 0xf)) * 0.25f;
    for (int g = 0; g < 32; g++) {
      int idx = b->qs[g] | (((b->qh[g / 4] >> (2 * (g % 4))) & 3) << 8);
      signed8(q + 8 * g, quant_grid_iq2s[idx], b->signs[g]);
    }
    return true;
  }
  case ANNA_DTYPE_IQ3_XXS: {
    const blk_iq3_xxs *b = blk;
    float d = quant_h2f(b->d);
    for (int ib = 0; ib < 8; ib++) {
      uint32_t ss;
      memcpy(&ss, b->qs + 64 + 4 * ib, 4);
      sc[2 * ib] = sc[2 * ib + 1] = d * (0.5f + (float)(ss >> 28)) * 0.5f;
      for (int l = 0; l < 4; l++) {
        uint8_t g[8];
        memcpy(g, quant_grid_iq3xxs[b->qs[8 * ib + 2 * l]], 4);
        memcpy(g + 4, quant_grid_iq3xxs[b->qs[8 * ib + 2 * l + 1]], 4);
        signed8(q + 32 * ib + 8 * l, g, quant_ksigns[(ss >> (7 * l)) & 127]);
      }
    }
    return true;
  }
  case ANNA_DTYPE_IQ3_S: {
    const blk_iq3_s *b = blk;
    float d = quant_h2f(b->d);
    for (int ib = 0; ib < 8; ib++)
      sc[2 * ib] = sc[2 * ib + 1] = d * (float)(1 + 2 * ((b->scales[ib / 2] >> (4 * (ib % 2))) & 0xf));
    for (int g = 0; g < 32; g++) {
      uint8_t v[8];
      for (int h = 0; h < 2; h++) {
        int i = 2 * g + h;
        memcpy(v + 4 * h, quant_grid_iq3s[b->qs[i] | (((b->qh[i / 8] >> (i % 8)) & 1) << 8)], 4);
      }
      signed8(q + 8 * g, v, b->signs[g]);
    }
    return true;
  }
  case ANNA_DTYPE_IQ1_S: {
    const blk_iq1_s *b = blk;
    float d = quant_h2f(b->d);
    for (int ib = 0; ib < 8; ib++) {
      uint16_t qh = b->qh[ib];
      sc[2 * ib] = sc[2 * ib + 1] = d * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
      for (int l = 0; l < 4; l++)
        iq1_group(q + 32 * ib + 8 * l,
                  quant_grid_iq1s[b->qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)], qh & 0x8000);
    }
    return true;
  }
  case ANNA_DTYPE_IQ1_M: {
    const blk_iq1_m *b = blk;
    uint16_t s4[4];
    memcpy(s4, b->scales, 8);
    float d = quant_h2f((uint16_t)((s4[0] >> 12) | ((s4[1] >> 8) & 0x00f0) |
                                   ((s4[2] >> 4) & 0x0f00) | (s4[3] & 0xf000)));
    for (int k = 0; k < 16; k++)
      sc[k] = d * (float)(2 * ((s4[k / 4] >> (3 * (k % 4))) & 7) + 1) * 0.125f;
    for (int g = 0; g < 32; g++) {
      int nib = (b->qh[g / 2] >> (4 * (g % 2))) & 0xf;
      iq1_group(q + 8 * g, quant_grid_iq1s[b->qs[g] | ((nib & 7) << 8)], nib & 8);
    }
    return true;
  }
  default: return false;
  }
}

/* ---- ISA dispatch ---- */

static quant_dot_fn g_tab[QUANT_ISA_COUNT][ANNA_DTYPE_COUNT];
static int g_best = QUANT_ISA_SCALAR;
static int g_isa = QUANT_ISA_SCALAR;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void dispatch_init(void) {
  sign_mask_init();
  quant_dot_fn *s = g_tab[QUANT_ISA_SCALAR];
  s[ANNA_DTYPE_F32] = dot_f32;
  s[ANNA_DTYPE_F16] = dot_f16;
  s[ANNA_DTYPE_BF16] = dot_bf16;
#define SET(T) s[ANNA_DTYPE_##T] = dot_scalar_##T;
  SET(Q4_0) SET(Q4_1) SET(Q5_0) SET(Q5_1) SET(Q8_0) SET(Q2_K) SET(Q3_K) SET(Q4_K) SET(Q5_K)
  SET(Q6_K) SET(IQ4_NL) SET(IQ4_XS) SET(IQ2_XXS) SET(IQ2_XS) SET(IQ2_S) SET(IQ3_XXS) SET(IQ3_S)
  SET(IQ1_S) SET(IQ1_M)
#undef SET
#if defined(__x86_64__)
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              __builtin_cpu_supports("f16c");
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  bool avx2 = false, avx512 = false;
#endif
  memcpy(g_tab[QUANT_ISA_AVX2], s, sizeof g_tab[0]);
  memcpy(g_tab[QUANT_ISA_AVX512], s, sizeof g_tab[0]);
  if (avx2) {
    quant_avx2_fill(g_tab[QUANT_ISA_AVX2]);
    quant_avx2_fill(g_tab[QUANT_ISA_AVX512]);
    g_best = QUANT_ISA_AVX2;
  }
  if (avx512) {
    quant_avx512_fill(g_tab[QUANT_ISA_AVX512]);
    g_best = QUANT_ISA_AVX512;
  }
  g_isa = g_best;
}

int quant_isa_best(void) {
  pthread_once(&g_once, dispatch_init);
  return g_best;
}

int quant_isa_get(void) {
  pthread_once(&g_once, dispatch_init);
  return g_isa;
}

const char *quant_isa_name(int isa) {
  switch (isa) {
  case QUANT_ISA_SCALAR: return "scalar";
  case QUANT_ISA_AVX2: return "avx2";
  case QUANT_ISA_AVX512: return "avx512";
  default: return "?";
  }
}

int quant_isa_set(int isa, char *err, size_t errlen) {
  pthread_once(&g_once, dispatch_init);
  if (isa < 0 || isa > g_best)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "ISA %s not supported by this CPU (best: %s)",
                    quant_isa_name(isa), quant_isa_name(g_best));
  g_isa = isa;
  return 0;
}

float quant_vec_dot_isa(int isa, int type, int64_t n, const void *w_row, const void *act) {
  pthread_once(&g_once, dispatch_init);
  if (isa < 0 || isa > g_best) isa = g_best;
  if (type < 0 || type >= ANNA_DTYPE_COUNT || !g_tab[isa][type]) return 0.0f;
  return g_tab[isa][type](n, w_row, act);
}

float quant_vec_dot(int type, int64_t n, const void *w_row, const void *act) {
  pthread_once(&g_once, dispatch_init);
  if (type < 0 || type >= ANNA_DTYPE_COUNT || !g_tab[g_isa][type]) return 0.0f;
  return g_tab[g_isa][type](n, w_row, act);
}

/* ---- matmul ---- */

void quant_matmul_rows(int type, const void *W, int64_t cols, int64_t r0, int64_t r1,
                       const void *act, int64_t n_tok, float *y, int64_t ldy) {
  pthread_once(&g_once, dispatch_init);
  quant_dot_fn fn = (type >= 0 && type < ANNA_DTYPE_COUNT) ? g_tab[g_isa][type] : NULL;
  if (!fn) return;
  int64_t wb = dtype_row_bytes(type, cols), ab = quant_act_row_bytes(type, cols);
  const uint8_t *w = W;
  const uint8_t *a = act;
  /* Row-outer so a weight row is read from memory once for all tokens. */
  for (int64_t r = r0; r < r1; r++)
    for (int64_t t = 0; t < n_tok; t++) y[t * ldy + r] = fn(cols, w + r * wb, a + t * ab);
}

int quant_matmul(int type, const void *W, int64_t rows, int64_t cols, const float *x,
                 int64_t n_tok, float *y, void *scratch, char *err, size_t errlen) {
  if (!quant_can_dot(type))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "matmul: weight type %s not supported",
                    dtype_name(type));
  int64_t ab = quant_act_row_bytes(type, cols);
  if (ab < 0 || rows < 0 || n_tok < 0)
    return anna_err(err, errlen, ANNA_EINVAL, "matmul: %lld cols is not a whole number of %s "
                    "blocks", (long long)cols, dtype_name(type));
  void *buf = scratch;
  if (!buf) {
    buf = calloc(n_tok * ab > 0 ? (size_t)(n_tok * ab) : 1, 1);
    if (!buf) return anna_err(err, errlen, ANNA_ENOMEM, "matmul: out of memory");
  }
  for (int64_t t = 0; t < n_tok; t++)
    quant_quantize_act(type, x + t * cols, (uint8_t *)buf + t * ab, cols);
  quant_matmul_rows(type, W, cols, 0, rows, buf, n_tok, y, rows);
  if (!scratch) free(buf);
  return 0;
}

int quant_matvec(int type, const void *W, int64_t rows, int64_t cols, const float *x, float *y,
                 void *scratch, char *err, size_t errlen) {
  return quant_matmul(type, W, rows, cols, x, 1, y, scratch, err, errlen);
}
