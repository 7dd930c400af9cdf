/* quant_avx512.c: AVX-512 (F/BW/VL/DQ + VNNI) dot kernels. 32-element block formats take
 * two blocks per 512-bit register and use vpdpbusd; K-quants take two 32-element
 * sub-blocks per register. Types not filled here keep their AVX2 kernel (quant.c). */
#include "formats/quant_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

TGT static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

TGT static inline __m512i load2x256(const void *lo, const void *hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                            _mm256_loadu_si256((const __m256i *)hi), 1);
}

/* Two blocks of 16 nibble bytes -> 64 bytes (block 0 in the low 256 bits). */
TGT static inline __m512i nibbles2(const uint8_t *p0, const uint8_t *p1) {
  __m128i b0 = _mm_loadu_si128((const __m128i *)p0), b1 = _mm_loadu_si128((const __m128i *)p1);
  __m256i v0 = _mm256_set_m128i(_mm_srli_epi16(b0, 4), b0);
  __m256i v1 = _mm256_set_m128i(_mm_srli_epi16(b1, 4), b1);
  return _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(v0), v1, 1),
                          _mm512_set1_epi8(0x0f));
}

/* Scale vector: d0 in lanes 0..7, d1 in lanes 8..15. */
TGT static inline __m512 scales2(float d0, float d1) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0)), _mm256_set1_ps(d1), 1);
}

/* Signed x signed int8 dot, 4 products per int32 lane: vpdpbusd wants the first operand
 * unsigned, so take |x| and move x's sign onto y. */
TGT static inline __m512i dot_i8(__m512i x, __m512i y) {
  __mmask64 neg = _mm512_movepi8_mask(x);
  __m512i ax = _mm512_abs_epi8(x);
  __m512i sy = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy);
}

TGT static float dot_q8_0(int64_t n, const void *w, const void *act) {
  const blk_q8_0 *x = w, *y = act;
  int64_t nb = n / QK, i = 0;
  __m512 acc = _mm512_setzero_ps();
  for (; i + 2 <= nb; i += 2) {
    __m512i qx = load2x256(x[i].qs, x[i + 1].qs), qy = load2x256(y[i].qs, y[i + 1].qs);
    __m512 d = scales2(h2f(x[i].d) * h2f(y[i].d), h2f(x[i + 1].d) * h2f(y[i + 1].d));
    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot_i8(qx, qy)), acc);
  }
  float s = _mm512_reduce_add_ps(acc);
  for (; i < nb; i++) {
    int sum = 0;
    for (int j = 0; j < QK; j++) sum += x[i].qs[j] * y[i].qs[j];
    s += h2f(x[i].d) * h2f(y[i].d) * (float)sum;
  }
  return s;
}

TGT static float dot_q4_0(int64_t n, const void *w, const void *act) {
  const blk_q4_0 *x = w;
  const blk_q8_0 *y = act;
  int64_t nb = n / QK, i = 0;
  const __m512i off = _mm512_set1_epi8(8);
  __m512 acc = _mm512_setzero_ps();
  for (; i + 2 <= nb; i += 2) {
    __m512i q = _mm512_sub_epi8(nibbles2(x[i].qs, x[i + 1].qs), off);
    __m512i qy = load2x256(y[i].qs, y[i + 1].qs);
    __m512 d = scales2(h2f(x[i].d) * h2f(y[i].d), h2f(x[i + 1].d) * h2f(y[i + 1].d));
    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot_i8(q, qy)), acc);
  }
  float s = _mm512_reduce_add_ps(acc);
  for (; i < nb; i++) {
    int sum = 0;
    for (int j = 0; j < 16; j++)
      sum += ((x[i].qs[j] & 0xf) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
    s += h2f(x[i].d) * h2f(y[i].d) * (float)sum;
  }
  return s;
}

/* 2 x 32 bits -> 64 bytes, 0xff where the bit is set. */
TGT static inline __m512i bits2_to_bytes(const uint8_t *p0, const uint8_t *p1) {
  uint32_t a, b;
  memcpy(&a, p0, 4);
  memcpy(&b, p1, 4);
  __mmask64 m = (__mmask64)a | ((__mmask64)b << 32);
  return _mm512_movm_epi8(m);
}

TGT static float dot_q5_0(int64_t n, const void *w, const void *act) {
  const blk_q5_0 *x = w;
  const blk_q8_0 *y = act;
  int64_t nb = n / QK, i = 0;
  const __m512i h16 = _mm512_set1_epi8(0x10), off = _mm512_set1_epi8(16);
  __m512 acc = _mm512_setzero_ps();
  for (; i + 2 <= nb; i += 2) {
    __m512i q = _mm512_or_si512(nibbles2(x[i].qs, x[i + 1].qs),
                                _mm512_and_si512(bits2_to_bytes(x[i].qh, x[i + 1].qh), h16));
    q = _mm512_sub_epi8(q, off);
    __m512i qy = load2x256(y[i].qs, y[i + 1].qs);
    __m512 d = scales2(h2f(x[i].d) * h2f(y[i].d), h2f(x[i + 1].d) * h2f(y[i + 1].d));
    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot_i8(q, qy)), acc);
  }
  float s = _mm512_reduce_add_ps(acc);
  for (; i < nb; i++) {
    uint32_t qh;
    memcpy(&qh, x[i].qh, 4);
    int sum = 0;
    for (int j = 0; j < 16; j++) {
      int q0 = ((x[i].qs[j] & 0xf) | (int)(((qh >> j) & 1) << 4)) - 16;
      int q1 = ((x[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16;
      sum += q0 * y[i].qs[j] + q1 * y[i].qs[j + 16];
    }
    s += h2f(x[i].d) * h2f(y[i].d) * (float)sum;
  }
  return s;
}

TGT static float dot_q4_1(int64_t n, const void *w, const void *act) {
  const blk_q4_1 *x = w;
  const blk_q8_0 *y = act;
  int64_t nb = n / QK, i = 0;
  const __m512i ones = _mm512_set1_epi8(1);
  __m512 acc = _mm512_setzero_ps();
  for (; i + 2 <= nb; i += 2) {
    __m512i q = nibbles2(x[i].qs, x[i + 1].qs); /* unsigned 0..15: no sign trick needed */
    __m512i qy = load2x256(y[i].qs, y[i + 1].qs);
    float dy0 = h2f(y[i].d), dy1 = h2f(y[i + 1].d);
    __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, qy);
    __m512i sy = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, qy);
    acc = _mm512_fmadd_ps(scales2(h2f(x[i].d) * dy0, h2f(x[i + 1].d) * dy1),
                          _mm512_cvtepi32_ps(p), acc);
    acc = _mm512_fmadd_ps(scales2(h2f(x[i].m) * dy0, h2f(x[i + 1].m) * dy1),
                          _mm512_cvtepi32_ps(sy), acc);
  }
  float s = _mm512_reduce_add_ps(acc);
  for (; i < nb; i++) {
    int sum = 0, sa = 0;
    for (int j = 0; j < 16; j++) {
      sum += (x[i].qs[j] & 0xf) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + 16];
      sa += y[i].qs[j] + y[i].qs[j + 16];
    }
    float dy = h2f(y[i].d);
    s += h2f(x[i].d) * dy * (float)sum + h2f(x[i].m) * dy * (float)sa;
  }
  return s;
}

/* 16 int16 lanes of s0 then 16 of s1, for madd against per-sub-block scales. */
TGT static inline __m512i scales16x2(int s0, int s1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)s0)),
                            _mm256_set1_epi16((short)s1), 1);
}

TGT static float dot_q4_k(int64_t n, const void *w, const void *act) {
  const blk_q4_k *x = w;
  const blk_q8_k *y = act;
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  __m512 acc = _mm512_setzero_ps();
  __m128 accm = _mm_setzero_ps();
  for (int64_t i = 0; i < n / QKK; i++) {
    uint8_t sc[8], mn[8];
    quant_k4_unpack(x[i].scales, sc, mn);
    __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y[i].bsums),
                                   _mm_loadu_si128((const __m128i *)(y[i].bsums + 8)));
    __m128i ms = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)), pairs);
    __m512i sumi = _mm512_setzero_si512();
    const int8_t *a = y[i].qs;
    for (int p = 0; p < 2; p++) { /* chunks 2p, 2p+1 = sub-blocks 4p..4p+3 */
      __m512i q = _mm512_loadu_si512((const void *)(x[i].qs + 64 * p));
      __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
      __m512i alo = load2x256(a + 128 * p, a + 128 * p + 64);
      __m512i ahi = load2x256(a + 128 * p + 32, a + 128 * p + 96);
      __m512i p0 = _mm512_madd_epi16(_mm512_maddubs_epi16(lo, alo),
                                     scales16x2(sc[4 * p], sc[4 * p + 2]));
      __m512i p1 = _mm512_madd_epi16(_mm512_maddubs_epi16(hi, ahi),
                                     scales16x2(sc[4 * p + 1], sc[4 * p + 3]));
      sumi = _mm512_add_epi32(sumi, _mm512_add_epi32(p0, p1));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(h2f(x[i].d) * y[i].d), _mm512_cvtepi32_ps(sumi), acc);
    accm = _mm_fmadd_ps(_mm_set1_ps(h2f(x[i].dmin) * y[i].d), _mm_cvtepi32_ps(ms), accm);
  }
  __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(m);
}

TGT static float dot_q6_k(int64_t n, const void *w, const void *act) {
  const blk_q6_k *x = w;
  const blk_q8_k *y = act;
  const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(3);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n / QKK; i++) {
    const int8_t *sc = x[i].scales;
    __m256i offv = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)),
                                     _mm256_loadu_si256((const __m256i *)y[i].bsums));
    __m512i sumi = _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
      /* groups s = 0..3 of 32: low nibbles of ql[0..63] are groups 0,1; high are 2,3;
       * qh[0..31] bit pairs 0..3 give groups 0..3. */
      __m512i l = _mm512_loadu_si512((const void *)(x[i].ql + 64 * h));
      __m256i hb = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
      __m512i h01 = _mm512_inserti64x4(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 2), 1);
      __m512i h23 = _mm512_srli_epi16(h01, 4);
      __m512i q01 = _mm512_or_si512(_mm512_and_si512(l, m4),
                                    _mm512_slli_epi16(_mm512_and_si512(h01, m3), 4));
      __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                    _mm512_slli_epi16(_mm512_and_si512(h23, m3), 4));
      const int8_t *a = y[i].qs + 128 * h;
      __m512i a01 = _mm512_loadu_si512((const void *)a);
      __m512i a23 = _mm512_loadu_si512((const void *)(a + 64));
      const int8_t *s = sc + 8 * h;
      /* 8 scales per half, one per 16 elements = per 128-bit lane of the 4 x 128 layout */
      __m512i sv01 = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16(s[1]), _mm_set1_epi16(s[0]))),
          _mm256_set_m128i(_mm_set1_epi16(s[3]), _mm_set1_epi16(s[2])), 1);
      __m512i sv23 = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16(s[5]), _mm_set1_epi16(s[4]))),
          _mm256_set_m128i(_mm_set1_epi16(s[7]), _mm_set1_epi16(s[6])), 1);
      sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_maddubs_epi16(q01, a01), sv01));
      sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_maddubs_epi16(q23, a23), sv23));
    }
    float d = h2f(x[i].d) * y[i].d;
    sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(_mm256_slli_epi32(offv, 5)));
    acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

void quant_avx512_fill(quant_dot_fn t[ANNA_DTYPE_COUNT]) {
  t[ANNA_DTYPE_Q8_0] = dot_q8_0;
  t[ANNA_DTYPE_Q4_0] = dot_q4_0;
  t[ANNA_DTYPE_Q5_0] = dot_q5_0;
  t[ANNA_DTYPE_Q4_1] = dot_q4_1;
  t[ANNA_DTYPE_Q4_K] = dot_q4_k;
  t[ANNA_DTYPE_Q6_K] = dot_q6_k;
}

#else
void quant_avx512_fill(quant_dot_fn t[ANNA_DTYPE_COUNT]) { (void)t; }
#endif
