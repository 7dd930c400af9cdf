/* quant_avx2.c: AVX2+FMA+F16C dot kernels. Compiled for any x86-64 target via function
 * target attributes; only called after quant.c has checked the CPU. */
#include "formats/quant_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx2,fma,f16c")))

TGT static inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

TGT static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* Signed int8 x int8 dot of 32 lanes into 8 int32: maddubs needs an unsigned operand, so
 * move x's sign onto y. */
TGT static inline __m256i dot_i8(__m256i x, __m256i y) {
  __m256i ax = _mm256_sign_epi8(x, x), sy = _mm256_sign_epi8(y, x);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}

/* Unsigned (< 128) x signed dot into 16 int16 (pairs summed). */
TGT static inline __m256i dot_u8_16(__m256i u, __m256i s) { return _mm256_maddubs_epi16(u, s); }

TGT static float dot_q8_0(int64_t n, const void *w, const void *act) {
  const blk_q8_0 *x = w, *y = act;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK; i++) {
    __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
    __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
    __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(qx, qy)), acc);
  }
  return hsum_ps(acc);
}

TGT static float dot_q4_0(int64_t n, const void *w, const void *act) {
  const blk_q4_0 *x = w;
  const blk_q8_0 *y = act;
  const __m256i m4 = _mm256_set1_epi8(0x0f), off = _mm256_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK; i++) {
    __m128i b = _mm_loadu_si128((const __m128i *)x[i].qs);
    __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), m4);
    q = _mm256_sub_epi8(q, off);
    __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
    __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(q, qy)), acc);
  }
  return hsum_ps(acc);
}

TGT static float dot_q4_k(int64_t n, const void *w, const void *act) {
  const blk_q4_k *x = w;
  const blk_q8_k *y = act;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256 acc = _mm256_setzero_ps();
  float acc_m = 0;
  for (int64_t i = 0; i < n / QKK; i++) {
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) quant_k4_scale_min(x[i].scales, j, &sc[j], &mn[j]);
    int summ = 0;
    for (int j = 0; j < 8; j++) summ += mn[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
      __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
      __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      __m256i a0 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c));
      __m256i a1 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c + 32));
      __m256i p0 = _mm256_madd_epi16(dot_u8_16(lo, a0), _mm256_set1_epi16(sc[2 * c]));
      __m256i p1 = _mm256_madd_epi16(dot_u8_16(hi, a1), _mm256_set1_epi16(sc[2 * c + 1]));
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
    }
    float d = h2f(x[i].d) * y[i].d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    acc_m += h2f(x[i].dmin) * y[i].d * (float)summ;
  }
  return hsum_ps(acc) - acc_m;
}

TGT static float dot_q6_k(int64_t n, const void *w, const void *act) {
  const blk_q6_k *x = w;
  const blk_q8_k *y = act;
  const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  float acc_off = 0;
  for (int64_t i = 0; i < n / QKK; i++) {
    const int8_t *sc = x[i].scales;
    /* q - 32 folded out: dot(q - 32, a) = dot(q, a) - 32 * sum(a) per 16-group. */
    int off = 0;
    for (int k = 0; k < 16; k++) off += sc[k] * y[i].bsums[k];
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
      const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
      const int8_t *a = y[i].qs + 128 * h;
      __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
      __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
      __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                             _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));
      q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4));
      for (int s = 0; s < 4; s++) {
        __m256i av = _mm256_loadu_si256((const __m256i *)(a + 32 * s));
        __m256i p = dot_u8_16(q[s], av);
        int k = 8 * h + 2 * s;
        __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[k + 1]), _mm_set1_epi16(sc[k]));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scv));
      }
    }
    float d = h2f(x[i].d) * y[i].d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    acc_off += d * 32.0f * (float)off;
  }
  return hsum_ps(acc) - acc_off;
}

TGT static float dot_f32(int64_t n, const void *w, const void *act) {
  const float *a = w, *b = act;
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  float s = hsum_ps(_mm256_add_ps(s0, s1));
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

TGT static float dot_f16(int64_t n, const void *w, const void *act) {
  const uint8_t *a = w;
  const float *b = act;
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + 2 * i)));
    __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + 2 * i + 16)));
    s0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(b + i + 8), s1);
  }
  float s = hsum_ps(_mm256_add_ps(s0, s1));
  for (; i < n; i++) {
    uint16_t h;
    memcpy(&h, a + 2 * i, 2);
    s += h2f(h) * b[i];
  }
  return s;
}

TGT static float dot_bf16(int64_t n, const void *w, const void *act) {
  const uint8_t *a = w;
  const float *b = act;
  __m256 s0 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(a + 2 * i)));
    __m256 wv = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
    s0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(b + i), s0);
  }
  float s = hsum_ps(s0);
  for (; i < n; i++) {
    uint16_t h;
    memcpy(&h, a + 2 * i, 2);
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    s += f * b[i];
  }
  return s;
}

void quant_avx2_fill(quant_dot_fn t[ANNA_DTYPE_COUNT]) {
  t[ANNA_DTYPE_F32] = dot_f32;
  t[ANNA_DTYPE_F16] = dot_f16;
  t[ANNA_DTYPE_BF16] = dot_bf16;
  t[ANNA_DTYPE_Q8_0] = dot_q8_0;
  t[ANNA_DTYPE_Q4_0] = dot_q4_0;
  t[ANNA_DTYPE_Q4_K] = dot_q4_k;
  t[ANNA_DTYPE_Q6_K] = dot_q6_k;
}

#else
void quant_avx2_fill(quant_dot_fn t[ANNA_DTYPE_COUNT]) { (void)t; }
#endif
