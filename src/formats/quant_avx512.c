/* quant_avx512.c: AVX-512 (F/BW/VL/DQ) dot kernels for the K-quants, two 32-element
 * sub-blocks per 512-bit register. Only kernels that measured faster than AVX2 on the
 * development machine (AMD EPYC, Zen 4: 512-bit ops run as two 256-bit halves) are kept:
 * two-blocks-per-register VNNI versions of Q8_0/Q4_0/Q4_1/Q5_0 were 0-7% slower, and
 * Q5_K was equal, so they were removed. Types not filled here keep their AVX2 kernel (quant.c). */
#include "formats/quant_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

TGT static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

TGT static inline __m512i load2x256(const void *lo, const void *hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                            _mm256_loadu_si256((const __m256i *)hi), 1);
}

/* 16 int16 lanes of s0 then 16 of s1, for madd against per-sub-block scales. */
TGT static inline __m512i scales16x2(int s0, int s1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)s0)),
                            _mm256_set1_epi16((short)s1), 1);
}

/* Q8_0 and Q5_0 with 8-bit activations, two blocks per zmm: the weights as unsigned bytes
 * (Q8_0 + 128, Q5_0 0..31) against the signed activations with vpdpbusd, the offset
 * removed with a second vpdpbusd of the constant offset (o * sum a per 4 lanes). Same
 * integer sums per block as the AVX2 kernels; the float order differs. */
TGT static inline __m512 scale2(float s0, float s1) {
  return _mm512_insertf32x8(_mm512_set1_ps(s0), _mm256_set1_ps(s1), 1);
}

TGT static float dot_q8_0(int64_t n, const void *w, const void *act) {
  const blk_q8_0 *x = w, *y = act;
  const int64_t nb = n / QK;
  const __m512i bias = _mm512_set1_epi8((char)0x80);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m512i qx = _mm512_xor_si512(load2x256(x[i].qs, x[i + 1].qs), bias);
    const __m512i qy = load2x256(y[i].qs, y[i + 1].qs);
    const __m512i s = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy),
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, qy));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale2(h2f(x[i].d) * h2f(y[i].d), h2f(x[i + 1].d) * h2f(y[i + 1].d)), acc);
  }
  float sum = _mm512_reduce_add_ps(acc);
  for (; i < nb; i++) {
    int32_t s = 0;
    for (int j = 0; j < QK; j++) s += x[i].qs[j] * y[i].qs[j];
    sum += h2f(x[i].d) * h2f(y[i].d) * (float)s;
  }
  return sum;
}

TGT static float dot_q5_0(int64_t n, const void *w, const void *act) {
  const blk_q5_0 *x = w;
  const blk_q8_0 *y = act;
  const int64_t nb = n / QK;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m512i h16 = _mm512_set1_epi8(0x10);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  /* Lane order [blk0 e0-15 | blk1 e0-15 | blk0 e16-31 | blk1 e16-31]: the nibbles need no
   * permute, the activations one 128-bit lane shuffle, the high bits a reordered mask. */
  for (; i + 2 <= nb; i += 2) {
    const __m256i b = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)x[i + 1].qs), _mm_loadu_si128((const __m128i *)x[i].qs));
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b, m4)),
                                   _mm256_and_si256(_mm256_srli_epi16(b, 4), m4), 1);
    uint32_t h0, h1;
    memcpy(&h0, x[i].qh, 4);
    memcpy(&h1, x[i + 1].qh, 4);
    const uint64_t hm = (uint64_t)(h0 & 0xffff) | (uint64_t)(h1 & 0xffff) << 16 | (uint64_t)(h0 >> 16) << 32 |
                        (uint64_t)(h1 >> 16) << 48;
    q = _mm512_or_si512(q, _mm512_maskz_mov_epi8(_cvtu64_mask64(hm), h16));
    const __m512i ya = load2x256(y[i].qs, y[i + 1].qs); /* [y0 lo | y0 hi | y1 lo | y1 hi] */
    const __m512i qy = _mm512_shuffle_i64x2(ya, ya, _MM_SHUFFLE(3, 1, 2, 0));
    const __m512i s = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, qy),
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), h16, qy));
    const __m512 sc = _mm512_mask_blend_ps(0xf0f0, _mm512_set1_ps(h2f(x[i].d) * h2f(y[i].d)),
                                           _mm512_set1_ps(h2f(x[i + 1].d) * h2f(y[i + 1].d)));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc);
  }
  float sum = _mm512_reduce_add_ps(acc);
  for (; i < nb; i++) {
    uint32_t qh;
    memcpy(&qh, x[i].qh, 4);
    int32_t s = 0;
    for (int j = 0; j < 16; j++) {
      s += (((x[i].qs[j] & 0xf) | (int)(((qh >> j) & 1) << 4)) - 16) * y[i].qs[j];
      s += (((x[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16) * y[i].qs[j + 16];
    }
    sum += h2f(x[i].d) * h2f(y[i].d) * (float)s;
  }
  return sum;
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

/* Activation quantizers, value for value the scalar ones in quant.c (ggml's x86
 * conventions): max is exact in any order, the products and the round-half-even
 * conversion are the same per element. */
TGT void quant_avx512_quantize_q8_0(const float *x, void *dst, int64_t n, int with_s) {
  const int64_t bb = with_s ? 36 : 34, qo = with_s ? 4 : 2;
  uint8_t *y = dst;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t i = 0; i < n / QK; i++) {
    const __m512 v0 = _mm512_loadu_ps(x + i * QK), v1 = _mm512_loadu_ps(x + i * QK + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
    const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m512 m = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, m)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, m));
    uint8_t *b = y + i * bb;
    const uint16_t hd = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    memcpy(b, &hd, 2);
    _mm_storeu_si128((__m128i *)(b + qo), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(b + qo + 16), _mm512_cvtsepi32_epi8(q1));
    if (with_s) {
      const int s = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      const uint16_t hs = _cvtss_sh(d * (float)s, _MM_FROUND_TO_NEAREST_INT);
      memcpy(b + 2, &hs, 2);
    }
  }
}

TGT void quant_avx512_quantize_q8_k(const float *x, void *dst, int64_t n) {
  blk_q8_k *y = dst;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t i = 0; i < n / QKK; i++) {
    const float *v = x + i * QKK;
    __m512 am = _mm512_setzero_ps();
    for (int j = 0; j < QKK; j += 16) am = _mm512_max_ps(am, _mm512_andnot_ps(sign, _mm512_loadu_ps(v + j)));
    const float amax = _mm512_reduce_max_ps(am);
    if (amax == 0.0f) {
      memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    float max = 0; /* the first element of largest magnitude, with its sign */
    for (int j = 0; j < QKK; j += 16) {
      const __mmask16 k = _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_loadu_ps(v + j)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (k) {
        max = v[j + __builtin_ctz(k)];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m512 m = _mm512_set1_ps(iscale);
    const __m512i lim = _mm512_set1_epi32(127);
    for (int j = 0; j < QKK; j += 16) {
      const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + j), m)), lim);
      _mm_storeu_si128((__m128i *)(y[i].qs + j), _mm512_cvtsepi32_epi8(q));
      y[i].bsums[j / 16] = (int16_t)_mm512_reduce_add_epi32(q);
    }
    y[i].d = 1.0f / iscale;
  }
}

void quant_avx512_fill(quant_dot_fn t[ANNA_DTYPE_COUNT]) {
  t[ANNA_DTYPE_Q8_0] = dot_q8_0;
  t[ANNA_DTYPE_Q5_0] = dot_q5_0;
  t[ANNA_DTYPE_Q4_K] = dot_q4_k;
  t[ANNA_DTYPE_Q6_K] = dot_q6_k;
}

#else
void quant_avx512_fill(quant_dot_fn t[ANNA_DTYPE_COUNT]) { (void)t; }
void quant_avx512_quantize_q8_0(const float *x, void *dst, int64_t n, int with_s) { (void)x, (void)dst, (void)n, (void)with_s; }
void quant_avx512_quantize_q8_k(const float *x, void *dst, int64_t n) { (void)x, (void)dst, (void)n; }
#endif
