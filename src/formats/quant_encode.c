/* quant_encode.c: ggml's reference quantizers, ported (see quant_encode.h). The code keeps
 * ggml's loop structure and operation order on purpose: a reassociated sum or a fused
 * multiply-add changes a rounding and with it the bytes. Compiled with -ffp-contract=off. */
#include "formats/quant_encode.h"

#include "base/error.h"
#include "formats/dtype.h"

#include <math.h>
#include <string.h>

#define GROUP_MAX_EPS 1e-15f
#define QK_K 256

static inline float f32_from_bits(uint32_t w) {
  float f;
  memcpy(&f, &w, 4);
  return f;
}
static inline uint32_t f32_to_bits(float f) {
  uint32_t w;
  memcpy(&w, &f, 4);
  return w;
}

uint16_t quant_encode_f16(float f) {
  const float scale_to_inf = 0x1.0p+112f, scale_to_zero = 0x1.0p-110f;
  float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = f32_to_bits(f), shl1_w = w + w, sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_to_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u, mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline float f16_to_f32(uint16_t h) {
  /* exact: every half is a float */
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return f32_from_bits(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    float v = (float)m * 0x1.0p-24f;
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
}

static inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
  return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

void quant_encode_bf16_to_f32(const uint16_t *src, float *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = f32_from_bits((uint32_t)src[i] << 16);
}

/* ggml's nearest_int: round to nearest even via the 1.5 * 2^23 trick (|fval| < 2^22). */
static inline int nearest_int(float fval) {
  float val = fval + 12582912.f;
  int i;
  memcpy(&i, &val, sizeof(int));
  return (i & 0x007fffff) - 0x00400000;
}

#define MAXI(a, b) ((a) > (b) ? (a) : (b))
#define MINI(a, b) ((a) < (b) ? (a) : (b))
#define MAXF(a, b) ((a) > (b) ? (a) : (b))

/* ---- Q8_0 / Q5_0 ---- */

void quant_encode_q8_0(const float *x, void *dst, int64_t n) {
  uint8_t *y = dst;
  for (int64_t i = 0; i < n / 32; i++, y += 34) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = MAXF(amax, fabsf(x[i * 32 + j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    const uint16_t dh = quant_encode_f16(d);
    memcpy(y, &dh, 2);
    for (int j = 0; j < 32; j++) y[2 + j] = (uint8_t)(int8_t)roundf(x[i * 32 + j] * id);
  }
}

void quant_encode_q5_0(const float *x, void *dst, int64_t n) {
  uint8_t *y = dst;
  for (int64_t i = 0; i < n / 32; i++, y += 22) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
      const float v = x[i * 32 + j];
      if (amax < fabsf(v)) {
        amax = fabsf(v);
        max = v;
      }
    }
    const float d = max / -16;
    const float id = d ? 1.0f / d : 0.0f;
    const uint16_t dh = quant_encode_f16(d);
    memcpy(y, &dh, 2);
    uint32_t qh = 0;
    uint8_t *qs = y + 6;
    for (int j = 0; j < 16; ++j) {
      const float x0 = x[i * 32 + j] * id, x1 = x[i * 32 + 16 + j] * id;
      const uint8_t xi0 = (uint8_t)MINI(31, (int8_t)(x0 + 16.5f));
      const uint8_t xi1 = (uint8_t)MINI(31, (int8_t)(x1 + 16.5f));
      qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
    }
    memcpy(y + 2, &qh, 4);
  }
}

/* ---- K-quant helpers ---- */

static float make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    float ax = fabsf(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < GROUP_MAX_EPS) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  if (rmse_type == 0) {
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      L[i] = (int8_t)(nmax + MAXI(-nmax, MINI(nmax - 1, l)));
    }
    return 1 / iscale;
  }
  /* only rmse_type 1 (weights x^2, no importance matrix) is used by the types here */
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = MAXI(-nmax, MINI(nmax - 1, l));
    L[i] = (int8_t)(l + nmax);
    float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = MAXI(-nmax, MINI(nmax - 1, l));
      float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        L[i] = (int8_t)(nmax + MAXI(-nmax, MINI(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                              uint8_t *Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * (x[i] - min));
    L[i] = (uint8_t)MAXI(0, MINI(nmax, l));
    float diff = scale * L[i] + min - x[i];
    diff = diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = MAXI(0, MINI(nmax, l));
      Laux[i] = (uint8_t)l;
      float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

static inline void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

/* ---- Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles ---- */

void quant_encode_q4_k(const float *x, void *dst, int64_t n) {
  uint8_t *blk = dst;
  uint8_t L[QK_K], Laux[32];
  float weights[32], mins[QK_K / 32], scales[QK_K / 32];
  for (int64_t i = 0; i < n / QK_K; i++, blk += 144, x += QK_K) {
    uint8_t *ysc = blk + 4, *q = blk + 16;
    memset(ysc, 0, 12);
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
      float av_x = sqrtf(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
      scales[j] = make_qkx2_quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; ++j) {
      uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
      uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
      ls = MINI(63, ls);
      lm = MINI(63, lm);
      if (j < 4) {
        ysc[j] = ls;
        ysc[j + 4] = lm;
      } else {
        ysc[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        ysc[j - 4] |= (uint8_t)((ls >> 4) << 6);
        ysc[j - 0] |= (uint8_t)((lm >> 4) << 6);
      }
    }
    const uint16_t dh = quant_encode_f16(max_scale / 63.f), mh = quant_encode_f16(max_min / 63.f);
    memcpy(blk, &dh, 2);
    memcpy(blk + 2, &mh, 2);
    for (int j = 0; j < QK_K / 32; ++j) {
      uint8_t sc, m;
      get_scale_min_k4(j, ysc, &sc, &m);
      const float d = f16_to_f32(dh) * sc;
      if (!d) continue;
      const float dm = f16_to_f32(mh) * m;
      for (int ii = 0; ii < 32; ++ii) {
        int l = nearest_int((x[32 * j + ii] + dm) / d);
        L[32 * j + ii] = (uint8_t)MAXI(0, MINI(15, l));
      }
    }
    for (int j = 0; j < QK_K; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
  }
}

/* ---- Q6_K: 128 bytes low nibbles, 64 bytes high 2 bits, 16 int8 scales, f16 d ---- */

void quant_encode_q6_k(const float *x, void *dst, int64_t n) {
  uint8_t *blk = dst;
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t i = 0; i < n / QK_K; i++, blk += 210, x += QK_K) {
    uint8_t *ql = blk, *qh = blk + 128;
    int8_t *ysc = (int8_t *)(blk + 192);
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);
      scales[ib] = scale;
      const float abs_scale = fabsf(scale);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scale;
      }
    }
    if (max_abs_scale < GROUP_MAX_EPS) {
      memset(blk, 0, 210);
      continue; /* d = f16(0) = 0 */
    }
    float iscale = -128.f / max_scale;
    const uint16_t dh = quant_encode_f16(1 / iscale);
    memcpy(blk + 208, &dh, 2);
    for (int ib = 0; ib < QK_K / 16; ++ib) ysc[ib] = (int8_t)MINI(127, nearest_int(iscale * scales[ib]));
    for (int j = 0; j < QK_K / 16; ++j) {
      float d = f16_to_f32(dh) * ysc[j];
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = MAXI(-32, MINI(31, l));
        L[16 * j + ii] = (int8_t)(l + 32);
      }
    }
    for (int j = 0; j < QK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF, q3 = L[j + l + 64] & 0xF,
                      q4 = L[j + l + 96] & 0xF;
        ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
        ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
        qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                          ((L[j + l + 96] >> 4) << 6));
      }
      ql += 64;
      qh += 32;
    }
  }
}

int quant_encode_supported(int type) {
  switch (type) {
  case ANNA_DTYPE_F32: case ANNA_DTYPE_F16: case ANNA_DTYPE_BF16: case ANNA_DTYPE_Q8_0: case ANNA_DTYPE_Q5_0:
  case ANNA_DTYPE_Q4_K: case ANNA_DTYPE_Q6_K: return 1;
  default: return 0;
  }
}

int quant_encode_row(int type, const float *x, void *dst, int64_t n) {
  if (!quant_encode_supported(type)) return ANNA_EUNSUPPORTED;
  const int64_t bs = dtype_block_size(type);
  if (n < 0 || bs <= 0 || n % bs) return ANNA_EINVAL;
  switch (type) {
  case ANNA_DTYPE_F32: memcpy(dst, x, (size_t)n * sizeof(float)); break;
  case ANNA_DTYPE_F16:
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = quant_encode_f16(x[i]);
    break;
  case ANNA_DTYPE_BF16:
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = f32_to_bf16(x[i]);
    break;
  case ANNA_DTYPE_Q8_0: quant_encode_q8_0(x, dst, n); break;
  case ANNA_DTYPE_Q5_0: quant_encode_q5_0(x, dst, n); break;
  case ANNA_DTYPE_Q4_K: quant_encode_q4_k(x, dst, n); break;
  case ANNA_DTYPE_Q6_K: quant_encode_q6_k(x, dst, n); break;
  }
  return 0;
}
