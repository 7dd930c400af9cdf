/* cpu_kv.c: KV-cache formats on the CPU (see ops_kv_type in ops.h): encoding on write and
 * decoding of key/value records inside attention. */
#include "backends/cpu/cpu_internal.h"
#include "backends/kv_tables.h"

#include "formats/dtype.h"
#include "formats/quant.h"

#include <math.h>

/* The levels, signs and layouts are kv_tables.h's, shared with the CUDA kernels. */
static const float k_tq2[4] = KV_TQ2_LEVELS;
static const float k_tq3[8] = KV_TQ3_LEVELS;
static const float k_tq4[16] = KV_TQ4_LEVELS;

static const float *tq_levels(int bits) {
  return bits == 2 ? k_tq2 : bits == 3 ? k_tq3 : k_tq4;
}

const float *cpu_kv_tq_levels(int type) {
  return tq_levels(kv_tq_bits(type));
}

static void fwht(float *x, int d) {
  for (int len = 1; len < d; len <<= 1)
    for (int i = 0; i < d; i += 2 * len)
      for (int j = i; j < i + len; j++) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
}

void cpu_kv_rotate(float *x, int d) {
  for (int i = 0; i < d; i++) x[i] *= kv_tq_sign(i);
  fwht(x, d);
  const float s = 1.0f / sqrtf((float)d);
  for (int i = 0; i < d; i++) x[i] *= s;
}

void cpu_kv_unrotate(float *x, int d) {
  fwht(x, d);
  const float s = 1.0f / sqrtf((float)d);
  for (int i = 0; i < d; i++) x[i] *= s * kv_tq_sign(i);
}

/* Q4_0 block writer (llama.cpp's reference rounding): d = signed max / -8. */
static void quantize_q4_0(const float *x, uint8_t *dst, int n) {
  for (int b = 0; b < n / 32; b++) {
    const float *v = x + b * 32;
    float amax = 0, mx = 0;
    for (int j = 0; j < 32; j++)
      if (fabsf(v[j]) > amax) amax = fabsf(v[j]), mx = v[j];
    const float d = mx / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
    uint8_t *blk = dst + b * 18;
    const uint16_t hd = quant_f32_to_f16(d);
    memcpy(blk, &hd, 2);
    for (int j = 0; j < 16; j++) {
      int q0 = (int)(v[j] * id + 8.5f), q1 = (int)(v[j + 16] * id + 8.5f);
      q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
      q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
      blk[2 + j] = (uint8_t)(q0 | (q1 << 4));
    }
  }
}

/* One head record: x (d floats) -> rec. */
void cpu_kv_encode(int type, const float *x, int d, uint8_t *rec) {
  switch (type) {
  case OPS_KV_F32: memcpy(rec, x, (size_t)d * sizeof(float)); return;
  case OPS_KV_F16: /* IEEE half, round to nearest even (out of range: inf, as llama.cpp) */
    for (int i = 0; i < d; i++) {
      const uint16_t h = quant_f32_to_f16(x[i]);
      memcpy(rec + 2 * i, &h, 2);
    }
    return;
  case OPS_KV_Q8: quant_quantize_row_q8_0(x, rec, d); return;
  case OPS_KV_Q4: quantize_q4_0(x, rec, d); return;
  default: break;
  }
  float r[KV_TQ_MAX_DIM];
  memcpy(r, x, (size_t)d * sizeof(float));
  cpu_kv_rotate(r, d);
  double ss = 0;
  for (int i = 0; i < d; i++) ss += (double)r[i] * r[i];
  const float s = (float)sqrt(ss / d), inv = s > 0 ? 1.0f / s : 0.0f;
  memcpy(rec, &s, 4);
  const int bits = kv_tq_bits(type), nl = 1 << bits;
  const float *lv = tq_levels(bits);
  uint8_t *codes = rec + 4;
  memset(codes, 0, (size_t)(d * bits + 7) / 8);
  for (int i = 0; i < d; i++) {
    const float z = r[i] * inv;
    int c = 0; /* nearest level: levels are sorted, compare with midpoints */
    while (c + 1 < nl && z > 0.5f * (lv[c] + lv[c + 1])) c++;
    const int bit = i * bits;
    codes[bit >> 3] |= (uint8_t)(c << (bit & 7));
    if ((bit & 7) + bits > 8) codes[(bit >> 3) + 1] |= (uint8_t)(c >> (8 - (bit & 7)));
  }
}

/* One head record -> d floats (for TQ: in the rotated space). */
void cpu_kv_decode(int type, const uint8_t *rec, int d, float *y) {
  switch (type) {
  case OPS_KV_F32: memcpy(y, rec, (size_t)d * sizeof(float)); return;
  case OPS_KV_F16:
    for (int i = 0; i < d; i++) {
      uint16_t h;
      memcpy(&h, rec + 2 * i, 2);
      y[i] = quant_f16_to_f32(h);
    }
    return;
  case OPS_KV_Q8: quant_dequantize_row(ANNA_DTYPE_Q8_0, rec, y, d); return;
  case OPS_KV_Q4: quant_dequantize_row(ANNA_DTYPE_Q4_0, rec, y, d); return;
  default: break;
  }
  float s;
  memcpy(&s, rec, 4);
  const int bits = kv_tq_bits(type);
  const float *lv = tq_levels(bits);
  const uint8_t *codes = rec + 4;
  for (int i = 0; i < d; i++) {
    y[i] = s * lv[kv_tq_code(codes, i, bits)];
  }
}

void cpu_kv_store(ops_backend *be, void *const *dst, const float *src, int64_t rows, int n_heads, int head_dim,
                  int kv_type) {
  (void)be;
  const int64_t hb = ops_kv_head_bytes(kv_type, head_dim);
  for (int64_t r = 0; r < rows; r++)
    for (int h = 0; h < n_heads; h++)
      cpu_kv_encode(kv_type, src + (r * n_heads + h) * head_dim, head_dim, (uint8_t *)dst[r] + h * hb);
}
