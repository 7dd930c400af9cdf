/* quant_avx2.c: AVX2+FMA+F16C dot kernels. Compiled for any x86-64 target via function
 * target attributes; only called after quant.c has checked the CPU. */
#include "formats/quant_grids.h"
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

/* sum_j mn[j] * (bsums[2j] + bsums[2j+1]) as 4 int32 lanes. */
TGT static inline __m128i k4_min_sums(const uint8_t mn[8], const int16_t *bsums) {
  __m128i b0 = _mm_loadu_si128((const __m128i *)bsums);
  __m128i b1 = _mm_loadu_si128((const __m128i *)(bsums + 8));
  __m128i pairs = _mm_hadd_epi16(b0, b1);
  return _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn)), pairs);
}

TGT static float dot_q4_k(int64_t n, const void *w, const void *act) {
  const blk_q4_k *x = w;
  const blk_q8_k *y = act;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256 acc = _mm256_setzero_ps();
  __m128 accm = _mm_setzero_ps();
  for (int64_t i = 0; i < n / QKK; i++) {
    uint8_t sc[8], mn[8];
    quant_k4_unpack(x[i].scales, sc, mn);
    __m128i ms = k4_min_sums(mn, y[i].bsums);
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
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
    accm = _mm_fmadd_ps(_mm_set1_ps(h2f(x[i].dmin) * y[i].d), _mm_cvtepi32_ps(ms), accm);
  }
  __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return hsum_ps(acc) - _mm_cvtss_f32(m);
}

TGT static float dot_q6_k(int64_t n, const void *w, const void *act) {
  const blk_q6_k *x = w;
  const blk_q8_k *y = act;
  const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QKK; i++) {
    const int8_t *sc = x[i].scales;
    /* q - 32 folded out: dot(q - 32, a) = dot(q, a) - 32 * sum(a) per 16-group. */
    __m256i offv = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)),
                                     _mm256_loadu_si256((const __m256i *)y[i].bsums));
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
    sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(offv, 5));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum_ps(acc);
}


/* 32 bits -> 32 bytes, 0xff where the bit is set (byte j <- bit j). */
TGT static inline __m256i bits_to_bytes(const uint8_t *p) {
  uint32_t x;
  memcpy(&x, p, 4);
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                        2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* 16 packed nibble bytes -> 32 bytes: low nibbles are elements 0..15, high ones 16..31. */
TGT static inline __m256i nibbles32(const uint8_t *p) {
  __m128i b = _mm_loadu_si128((const __m128i *)p);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0f));
}

TGT static float dot_q4_1(int64_t n, const void *w, const void *act) {
  const blk_q4_1 *x = w;
  const blk_q8_1 *y = act;
  __m256 acc = _mm256_setzero_ps();
  float accm = 0; /* min term: m_w * s_a per block, as ggml */
  for (int64_t i = 0; i < n / QK; i++) {
    __m256i q = nibbles32(x[i].qs);
    __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
    float dy = h2f(y[i].d);
    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, qy), _mm256_set1_epi16(1));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * dy), _mm256_cvtepi32_ps(p), acc);
    accm += h2f(x[i].m) * h2f(y[i].s);
  }
  return hsum_ps(acc) + accm;
}

TGT static float dot_q5_0(int64_t n, const void *w, const void *act) {
  const blk_q5_0 *x = w;
  const blk_q8_0 *y = act;
  const __m256i h16 = _mm256_set1_epi8(0x10), off = _mm256_set1_epi8(16);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK; i++) {
    __m256i q = _mm256_or_si256(nibbles32(x[i].qs), _mm256_and_si256(bits_to_bytes(x[i].qh), h16));
    q = _mm256_sub_epi8(q, off);
    __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
    __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(q, qy)), acc);
  }
  return hsum_ps(acc);
}

TGT static float dot_q5_1(int64_t n, const void *w, const void *act) {
  const blk_q5_1 *x = w;
  const blk_q8_1 *y = act;
  const __m256i h16 = _mm256_set1_epi8(0x10);
  __m256 acc = _mm256_setzero_ps();
  float accm = 0; /* min term: m_w * s_a per block, as ggml */
  for (int64_t i = 0; i < n / QK; i++) {
    __m256i q = _mm256_or_si256(nibbles32(x[i].qs), _mm256_and_si256(bits_to_bytes(x[i].qh), h16));
    __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
    float dy = h2f(y[i].d);
    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, qy), _mm256_set1_epi16(1));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * dy), _mm256_cvtepi32_ps(p), acc);
    accm += h2f(x[i].m) * h2f(y[i].s);
  }
  return hsum_ps(acc) + accm;
}

TGT static inline __m256i iq4nl_table(void) {
  __m128i t = _mm_loadu_si128((const __m128i *)quant_kvalues_iq4nl);
  return _mm256_set_m128i(t, t);
}

TGT static float dot_iq4_nl(int64_t n, const void *w, const void *act) {
  const blk_iq4_nl *x = w;
  const blk_q8_0 *y = act;
  const __m256i tab = iq4nl_table();
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK; i++) {
    __m256i q = _mm256_shuffle_epi8(tab, nibbles32(x[i].qs));
    __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
    __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(q, qy)), acc);
  }
  return hsum_ps(acc);
}

TGT static float dot_iq4_xs(int64_t n, const void *w, const void *act) {
  const blk_iq4_xs *x = w;
  const blk_q8_k *y = act;
  const __m256i tab = iq4nl_table();
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QKK; i++) {
    __m256i sumi = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ib++) {
      int ls = ((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) |
               (((x[i].scales_h >> (2 * ib)) & 3) << 4);
      __m256i q = _mm256_shuffle_epi8(tab, nibbles32(x[i].qs + 16 * ib));
      __m256i a = _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * ib));
      __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16((short)(ls - 32))));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum_ps(acc);
}

TGT static float dot_q5_k(int64_t n, const void *w, const void *act) {
  const blk_q5_k *x = w;
  const blk_q8_k *y = act;
  const __m256i m4 = _mm256_set1_epi8(0x0f), m1 = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  __m128 accm = _mm_setzero_ps();
  for (int64_t i = 0; i < n / QKK; i++) {
    uint8_t sc[8], mn[8];
    quant_k4_unpack(x[i].scales, sc, mn);
    __m128i ms = k4_min_sums(mn, y[i].bsums);
    __m256i hb = _mm256_loadu_si256((const __m256i *)x[i].qh);
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
      __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
      __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * c), m1);
      __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * c + 1), m1);
      __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(h0, 4));
      __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                   _mm256_slli_epi16(h1, 4));
      __m256i a0 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c));
      __m256i a1 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c + 32));
      __m256i p0 = _mm256_madd_epi16(dot_u8_16(lo, a0), _mm256_set1_epi16(sc[2 * c]));
      __m256i p1 = _mm256_madd_epi16(dot_u8_16(hi, a1), _mm256_set1_epi16(sc[2 * c + 1]));
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
    accm = _mm_fmadd_ps(_mm_set1_ps(h2f(x[i].dmin) * y[i].d), _mm_cvtepi32_ps(ms), accm);
  }
  __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return hsum_ps(acc) - _mm_cvtss_f32(m);
}

/* Q2_K and Q3_K share the 2-bit plane layout: element h*128 + 32*s + l is bits 2s..2s+1 of
 * qs[32*h + l]; one scale per 16 elements. */
TGT static float dot_q2_k(int64_t n, const void *w, const void *act) {
  const blk_q2_k *x = w;
  const blk_q8_k *y = act;
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QKK; i++) {
    __m128i sb = _mm_loadu_si128((const __m128i *)x[i].scales);
    __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(0x0f)));
    __m256i msum = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)y[i].bsums));
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
      __m256i qb = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
      for (int s = 0; s < 4; s++) {
        __m256i q = _mm256_and_si256(_mm256_srli_epi16(qb, 2 * s), m3);
        __m256i a = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * s));
        int k = 8 * h + 2 * s;
        __m256i scv = _mm256_set_m128i(_mm_set1_epi16(x[i].scales[k + 1] & 0xf),
                                       _mm_set1_epi16(x[i].scales[k] & 0xf));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(dot_u8_16(q, a), scv));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
    accm = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].dmin) * y[i].d), _mm256_cvtepi32_ps(msum), accm);
  }
  return hsum_ps(_mm256_sub_ps(acc, accm));
}

TGT static float dot_q3_k(int64_t n, const void *w, const void *act) {
  const blk_q3_k *x = w;
  const blk_q8_k *y = act;
  const __m256i m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QKK; i++) {
    /* 16 6-bit scales: low nibbles from bytes 0..7, high 2 bits from bytes 8..11, four at
     * a time in 32-bit words (word w holds scales 4w..4w+3). */
    uint32_t u[3], wv[4];
    memcpy(u, x[i].scales, 12);
    wv[0] = (u[0] & 0x0f0f0f0fu) | ((u[2] & 0x03030303u) << 4);
    wv[1] = (u[1] & 0x0f0f0f0fu) | (((u[2] >> 2) & 0x03030303u) << 4);
    wv[2] = ((u[0] >> 4) & 0x0f0f0f0fu) | (((u[2] >> 4) & 0x03030303u) << 4);
    wv[3] = ((u[1] >> 4) & 0x0f0f0f0fu) | (((u[2] >> 6) & 0x03030303u) << 4);
    __m128i s8 = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)wv), _mm_set1_epi8(32));
    __m256i s16 = _mm256_cvtepi8_epi16(s8);
    int16_t sc[16];
    _mm256_storeu_si256((__m256i *)sc, s16);
    /* q = low2 + 4*hbit - 4: the unsigned part goes through maddubs, -4 via bsums. */
    __m256i offv = _mm256_madd_epi16(s16, _mm256_loadu_si256((const __m256i *)y[i].bsums));
    __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
      __m256i qb = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
      for (int s = 0; s < 4; s++) {
        __m256i hbit = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + s), m1);
        __m256i q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 2 * s), m3),
                                    _mm256_slli_epi16(hbit, 2));
        __m256i a = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * s));
        int k = 8 * h + 2 * s;
        __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[k + 1]), _mm_set1_epi16(sc[k]));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(dot_u8_16(q, a), scv));
      }
    }
    sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(offv, 2));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum_ps(acc);
}

/* i-quants: decode a super-block to int8 + per-16 scales (quant.c), then an int8 dot. The
 * decode is table lookups, so this is far from llama.cpp's hand-tuned kernels, but an order
 * of magnitude above the float reference. */
TGT static float dot_iq(int type, int64_t n, const void *w, const void *act) {
  const uint8_t *wp = w;
  const blk_q8_k *y = act;
  int64_t bb = dtype_block_bytes(type);
  int8_t q[QKK] __attribute__((aligned(32)));
  float sc[16];
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QKK; i++) {
    quant_iq_decode(type, wp + i * bb, q, sc);
    __m256 accb = _mm256_setzero_ps();
    for (int g = 0; g < 8; g++) {
      __m256i qv = _mm256_load_si256((const __m256i *)(q + 32 * g));
      __m256i av = _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * g));
      __m256 s = _mm256_set_m128(_mm_set1_ps(sc[2 * g + 1]), _mm_set1_ps(sc[2 * g]));
      accb = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dot_i8(qv, av)), accb);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d), accb, acc);
  }
  return hsum_ps(acc);
}

#define IQ(T) \
  TGT static float dot_##T(int64_t n, const void *w, const void *a) { \
    return dot_iq(ANNA_DTYPE_##T, n, w, a); \
  }
IQ(IQ2_XXS) IQ(IQ2_XS) IQ(IQ2_S) IQ(IQ3_XXS) IQ(IQ3_S) IQ(IQ1_S) IQ(IQ1_M)
#undef IQ

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
  t[ANNA_DTYPE_Q4_1] = dot_q4_1;
  t[ANNA_DTYPE_Q5_0] = dot_q5_0;
  t[ANNA_DTYPE_Q5_1] = dot_q5_1;
  t[ANNA_DTYPE_IQ4_NL] = dot_iq4_nl;
  t[ANNA_DTYPE_IQ4_XS] = dot_iq4_xs;
  t[ANNA_DTYPE_Q5_K] = dot_q5_k;
  t[ANNA_DTYPE_Q2_K] = dot_q2_k;
  t[ANNA_DTYPE_Q3_K] = dot_q3_k;
  t[ANNA_DTYPE_IQ2_XXS] = dot_IQ2_XXS;
  t[ANNA_DTYPE_IQ2_XS] = dot_IQ2_XS;
  t[ANNA_DTYPE_IQ2_S] = dot_IQ2_S;
  t[ANNA_DTYPE_IQ3_XXS] = dot_IQ3_XXS;
  t[ANNA_DTYPE_IQ3_S] = dot_IQ3_S;
  t[ANNA_DTYPE_IQ1_S] = dot_IQ1_S;
  t[ANNA_DTYPE_IQ1_M] = dot_IQ1_M;
}

#else
void quant_avx2_fill(quant_dot_fn t[ANNA_DTYPE_COUNT]) { (void)t; }
#endif
