/* cpu_qgemm.c: y = x W^T for llama.cpp-quantized weights with 8-bit activations, as a tiled
 * GEMM: AVX-512 VNNI (vpdpbusd) or AVX2 (vpmaddubsw + vpmaddwd); the caller falls back to the
 * per-row dots on older CPUs.
 *
 * Numerics are llama.cpp's: the activations are quantized exactly as ggml-cpu does on x86
 * (quant_quantize_act: Q8_0, Q8_1 or Q8_K per quant_act_type), every weight x activation
 * product is an exact integer sum over a sub-block, and sub-block sums are scaled in f32.
 * Only the order of the float additions differs from ggml's vec_dot, so results agree
 * with it to float rounding.
 *
 * Every weight type is written as w[r][k] = fs[r][j] * (u[r][k] - o) + fm[r][j] for k in
 * sub-block j (S = 32 elements, 16 for the K-quants with 16-element scales): u an unsigned
 * byte, o a per-type constant, fs / fm per-row per-sub-block floats. Then
 *   sum_k w a = sum_j fs da_j (sum_k u q - o sum_k q) + fm ma_j
 * with q the int8 activations, da_j their scale, and ma_j the activation side of the min
 * term (Q8_1's stored s, or d * bsum for the K-quants). sum_k u q is vpdpbusd (u8 x s8).
 *
 * Tiling: each worker takes tiles of QG_ROWS = 32 weight rows, decodes them ONCE into its
 * scratch as unsigned bytes interleaved so that one zmm holds 4 consecutive k of 16 rows
 * ([sub-block][4-k group][row half][16 rows x 4 bytes]), then runs every token through the
 * tile QG_TOK tokens at a time: per 4-k group, two weight loads and 2 x QG_TOK vpdpbusd
 * against the tokens' 4 bytes broadcast. The decode costs one pass over the weights per
 * matmul call, shared by all tokens.
 */
#include "backends/cpu/cpu_internal.h"
#include "formats/dtype.h"
#include "formats/quant.h"
#include "formats/quant_grids.h"

#include <math.h>

#define QG_ROWS 32
#define QG_TOK 4

/* Sub-block size of the decoded form (0: type not handled). */
static int qg_sub(int type) {
  switch (type) {
  case ANNA_DTYPE_Q4_0: case ANNA_DTYPE_Q4_1: case ANNA_DTYPE_Q5_0: case ANNA_DTYPE_Q5_1:
  case ANNA_DTYPE_Q8_0: case ANNA_DTYPE_IQ4_NL: case ANNA_DTYPE_Q4_K: case ANNA_DTYPE_Q5_K:
  case ANNA_DTYPE_IQ4_XS:
    return 32;
  case ANNA_DTYPE_Q6_K: case ANNA_DTYPE_Q2_K: case ANNA_DTYPE_Q3_K: return 16;
  default: return 0;
  }
}

/* The constant offset o of the decoded form. */
static int qg_offset(int type) {
  switch (type) {
  case ANNA_DTYPE_Q4_0: return 8;
  case ANNA_DTYPE_Q5_0: return 16;
  case ANNA_DTYPE_Q8_0: case ANNA_DTYPE_IQ4_NL: case ANNA_DTYPE_IQ4_XS: return 128;
  case ANNA_DTYPE_Q6_K: return 32;
  case ANNA_DTYPE_Q3_K: return 4;
  default: return 0;
  }
}

static int qg_has_min(int type) {
  return type == ANNA_DTYPE_Q4_1 || type == ANNA_DTYPE_Q5_1 || type == ANNA_DTYPE_Q4_K ||
         type == ANNA_DTYPE_Q5_K || type == ANNA_DTYPE_Q2_K;
}

static inline float h2f(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return quant_f16_to_f32(h);
}

/* K-quant 6-bit scale and min j of 8 (Q4_K, Q5_K). */
static inline void k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* Decodes one weight row of K elements into u[K], fs[K/S], fm[K/S] (the form above).
 * Scalar: it runs once per row per matmul call, not per token. */
static void qg_decode_row(int type, const uint8_t *row, int64_t K, uint8_t *u, float *fs, float *fm) {
  switch (type) {
  case ANNA_DTYPE_Q4_0: case ANNA_DTYPE_Q4_1: case ANNA_DTYPE_Q5_0: case ANNA_DTYPE_Q5_1:
  case ANNA_DTYPE_Q8_0: case ANNA_DTYPE_IQ4_NL: {
    const int64_t bb = dtype_block_bytes(type);
    for (int64_t i = 0; i < K / 32; i++) {
      const uint8_t *b = row + i * bb;
      uint8_t *o = u + i * 32;
      fs[i] = h2f(b);
      fm[i] = 0;
      if (type == ANNA_DTYPE_Q8_0) {
        for (int j = 0; j < 32; j++) o[j] = (uint8_t)(b[2 + j] ^ 0x80);
        continue;
      }
      const uint8_t *qs;
      uint32_t qh = 0;
      if (type == ANNA_DTYPE_Q4_1 || type == ANNA_DTYPE_Q5_1) fm[i] = h2f(b + 2);
      switch (type) {
      case ANNA_DTYPE_Q4_0: case ANNA_DTYPE_IQ4_NL: qs = b + 2; break;
      case ANNA_DTYPE_Q4_1: qs = b + 4; break;
      case ANNA_DTYPE_Q5_0: memcpy(&qh, b + 2, 4), qs = b + 6; break;
      default: memcpy(&qh, b + 4, 4), qs = b + 8; break;
      }
      for (int j = 0; j < 16; j++) {
        o[j] = (uint8_t)((qs[j] & 0xf) | (((qh >> j) & 1) << 4));
        o[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
      }
      if (type == ANNA_DTYPE_IQ4_NL)
        for (int j = 0; j < 32; j++) o[j] = (uint8_t)(quant_kvalues_iq4nl[o[j]] + 128);
    }
    return;
  }
  case ANNA_DTYPE_Q4_K: case ANNA_DTYPE_Q5_K: {
    const int q5 = type == ANNA_DTYPE_Q5_K;
    const int64_t bb = dtype_block_bytes(type);
    for (int64_t i = 0; i < K / 256; i++) {
      const uint8_t *b = row + i * bb, *sc = b + 4, *qh = b + 16, *qs = b + (q5 ? 48 : 16);
      const float d = h2f(b), dmin = h2f(b + 2);
      for (int s = 0; s < 8; s++) {
        int scv, mnv;
        k4_scale_min(sc, s, &scv, &mnv);
        fs[i * 8 + s] = d * (float)scv;
        fm[i * 8 + s] = -dmin * (float)mnv;
        uint8_t *o = u + i * 256 + s * 32;
        for (int l = 0; l < 32; l++) {
          int q = (qs[(s / 2) * 32 + l] >> (4 * (s % 2))) & 0xf;
          if (q5) q |= ((qh[l] >> s) & 1) << 4;
          o[l] = (uint8_t)q;
        }
      }
    }
    return;
  }
  case ANNA_DTYPE_Q6_K:
    for (int64_t i = 0; i < K / 256; i++) {
      const uint8_t *b = row + i * 210, *ql = b, *qh = b + 128;
      const int8_t *sc = (const int8_t *)(b + 192);
      const float d = h2f(b + 208);
      for (int g = 0; g < 16; g++) fs[i * 16 + g] = d * (float)sc[g], fm[i * 16 + g] = 0;
      uint8_t *o = u + i * 256;
      for (int h = 0; h < 2; h++)
        for (int p = 0; p < 128; p++) {
          const int lo = (ql[h * 64 + p % 64] >> (4 * (p / 64))) & 0xf;
          const int hi = (qh[h * 32 + p % 32] >> (2 * (p / 32))) & 3;
          o[h * 128 + p] = (uint8_t)(lo | (hi << 4));
        }
    }
    return;
  case ANNA_DTYPE_Q2_K:
    for (int64_t i = 0; i < K / 256; i++) {
      const uint8_t *b = row + i * 84, *sc = b, *qs = b + 16;
      const float d = h2f(b + 80), dmin = h2f(b + 82);
      for (int g = 0; g < 16; g++) fs[i * 16 + g] = d * (float)(sc[g] & 0xf), fm[i * 16 + g] = -dmin * (float)(sc[g] >> 4);
      uint8_t *o = u + i * 256;
      for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
          for (int l = 0; l < 32; l++) o[h * 128 + s * 32 + l] = (uint8_t)((qs[h * 32 + l] >> (2 * s)) & 3);
    }
    return;
  case ANNA_DTYPE_Q3_K:
    for (int64_t i = 0; i < K / 256; i++) {
      const uint8_t *b = row + i * 110, *hm = b, *qs = b + 32, *sc = b + 96;
      const float d = h2f(b + 108);
      for (int g = 0; g < 16; g++) {
        const int lo = (sc[g % 8] >> (4 * (g / 8))) & 0xf, hi = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
        fs[i * 16 + g] = d * (float)((lo | (hi << 4)) - 32);
        fm[i * 16 + g] = 0;
      }
      uint8_t *o = u + i * 256;
      for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
          for (int l = 0; l < 32; l++) {
            int q = (qs[h * 32 + l] >> (2 * s)) & 3;
            if ((hm[l] >> (h * 4 + s)) & 1) q += 4; /* value q - 4 + 4 * hbit, stored +4 */
            o[h * 128 + s * 32 + l] = (uint8_t)q;
          }
    }
    return;
  case ANNA_DTYPE_IQ4_XS:
    for (int64_t i = 0; i < K / 256; i++) {
      const uint8_t *b = row + i * 136, *sl = b + 4, *qs = b + 8;
      uint16_t shv;
      memcpy(&shv, b + 2, 2);
      const float d = h2f(b);
      for (int ib = 0; ib < 8; ib++) {
        const int ls = ((sl[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((shv >> (2 * ib)) & 3) << 4);
        fs[i * 8 + ib] = d * (float)(ls - 32);
        fm[i * 8 + ib] = 0;
        uint8_t *o = u + i * 256 + ib * 32;
        for (int j = 0; j < 16; j++) {
          o[j] = (uint8_t)(quant_kvalues_iq4nl[qs[16 * ib + j] & 0xf] + 128);
          o[j + 16] = (uint8_t)(quant_kvalues_iq4nl[qs[16 * ib + j] >> 4] + 128);
        }
      }
    }
    return;
  default: return;
  }
}

/* AVX-512 versions of qg_decode_row for the common types (same bytes and scales; the
 * decode is ~10% of the GEMM's time when scalar). Returns 0 for other types. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) static int qg_decode_row_avx512(
    int type, const uint8_t *row, int64_t K, uint8_t *u, float *fs, float *fm) {
  const __m128i lo4 = _mm_set1_epi8(0x0f);
  switch (type) {
  case ANNA_DTYPE_Q8_0:
    for (int64_t i = 0; i < K / 32; i++) {
      const uint8_t *b = row + i * 34;
      fs[i] = h2f(b), fm[i] = 0;
      _mm256_storeu_si256((__m256i *)(u + i * 32),
                          _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_epi8((char)0x80)));
    }
    return 1;
  case ANNA_DTYPE_Q4_0: case ANNA_DTYPE_Q4_1: case ANNA_DTYPE_Q5_0: case ANNA_DTYPE_Q5_1: {
    const int q5 = type == ANNA_DTYPE_Q5_0 || type == ANNA_DTYPE_Q5_1, mn = type == ANNA_DTYPE_Q4_1 || type == ANNA_DTYPE_Q5_1;
    const int64_t bb = dtype_block_bytes(type), qo = 2 + 2 * mn + 4 * q5;
    for (int64_t i = 0; i < K / 32; i++) {
      const uint8_t *b = row + i * bb;
      fs[i] = h2f(b), fm[i] = mn ? h2f(b + 2) : 0.0f;
      const __m128i qs = _mm_loadu_si128((const __m128i *)(b + qo));
      __m128i v0 = _mm_and_si128(qs, lo4), v1 = _mm_and_si128(_mm_srli_epi16(qs, 4), lo4);
      if (q5) {
        uint32_t qh;
        memcpy(&qh, b + 2 + 2 * mn, 4);
        const __m128i h = _mm_set1_epi8(0x10);
        v0 = _mm_or_si128(v0, _mm_maskz_mov_epi8((__mmask16)(qh & 0xffff), h));
        v1 = _mm_or_si128(v1, _mm_maskz_mov_epi8((__mmask16)(qh >> 16), h));
      }
      _mm_storeu_si128((__m128i *)(u + i * 32), v0);
      _mm_storeu_si128((__m128i *)(u + i * 32 + 16), v1);
    }
    return 1;
  }
  case ANNA_DTYPE_Q4_K:
    for (int64_t i = 0; i < K / 256; i++) {
      const uint8_t *b = row + i * 144, *qs = b + 16;
      const float d = h2f(b), dmin = h2f(b + 2);
      for (int s = 0; s < 8; s++) {
        int scv, mnv;
        k4_scale_min(b + 4, s, &scv, &mnv);
        fs[i * 8 + s] = d * (float)scv;
        fm[i * 8 + s] = -dmin * (float)mnv;
      }
      for (int p = 0; p < 4; p++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
        _mm256_storeu_si256((__m256i *)(u + i * 256 + 64 * p), _mm256_and_si256(q, _mm256_set1_epi8(0x0f)));
        _mm256_storeu_si256((__m256i *)(u + i * 256 + 64 * p + 32),
                            _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(0x0f)));
      }
    }
    return 1;
  case ANNA_DTYPE_Q6_K:
    for (int64_t i = 0; i < K / 256; i++) {
      const uint8_t *b = row + i * 210;
      const int8_t *sc = (const int8_t *)(b + 192);
      const float d = h2f(b + 208);
      for (int g = 0; g < 16; g++) fs[i * 16 + g] = d * (float)sc[g], fm[i * 16 + g] = 0;
      const __m128i m3 = _mm_set1_epi8(3);
      for (int h = 0; h < 2; h++)
        for (int c = 0; c < 8; c++) {
          __m128i l = _mm_loadu_si128((const __m128i *)(b + h * 64 + 16 * (c % 4)));
          l = c >= 4 ? _mm_and_si128(_mm_srli_epi16(l, 4), lo4) : _mm_and_si128(l, lo4);
          __m128i hb = _mm_loadu_si128((const __m128i *)(b + 128 + h * 32 + 16 * (c % 2)));
          hb = _mm_and_si128(_mm_srl_epi16(hb, _mm_cvtsi32_si128(2 * (c / 2))), m3);
          _mm_storeu_si128((__m128i *)(u + i * 256 + h * 128 + c * 16), _mm_or_si128(l, _mm_slli_epi16(hb, 4)));
        }
    }
    return 1;
  default: return 0;
  }
}

/* ---- activations ----
 * Shared by all workers, built once per call: q8 [n + 1][K] int8 (row n all zero: the
 * padding token of a partial token group), and per (token, sub-block) da (scale),
 * ia (o * sum of the sub-block's q, an exact int) and ma (min-term factor). */
typedef struct qg_acts {
  int64_t n, K, nsb;
  int8_t *q8;
  float *da, *ma;
  int32_t *ia;
  uint8_t *blocks; /* per-worker room for one quantized row in the ggml block format */
  size_t block_bytes;
} qg_acts;

struct qg_ctx {
  ops_backend *be;
  float *y;
  const float *x;
  const ops_weight *w;
  const float *bias;
  qg_acts a;
  int sub, off, has_min;
};

static void qg_quant_task(void *p, int ith, int nth) {
  struct qg_ctx *c = p;
  qg_acts *a = &c->a;
  const int type = c->w->type, S = c->sub, at = quant_act_type(type);
  const int64_t K = a->K, nsb = a->nsb;
  uint8_t *blk = a->blocks + (size_t)ith * a->block_bytes;
  int64_t t0, t1;
  threadpool_range(a->n + 1, ith, nth, &t0, &t1);
  for (int64_t t = t0; t < t1; t++) {
    int8_t *q = a->q8 + t * K;
    float *da = a->da + t * nsb, *ma = a->ma + t * nsb;
    int32_t *ia = a->ia + t * nsb;
    if (t == a->n) { /* padding token */
      memset(q, 0, (size_t)K);
      for (int64_t j = 0; j < nsb; j++) da[j] = ma[j] = 0, ia[j] = 0;
      continue;
    }
    quant_quantize_act(type, c->x + t * K, blk, K);
    if (at == ANNA_DTYPE_Q8_K) {
      for (int64_t i = 0; i < K / 256; i++) {
        const uint8_t *b = blk + i * 292;
        float d;
        int16_t bs[16];
        memcpy(&d, b, 4);
        memcpy(q + i * 256, b + 4, 256);
        memcpy(bs, b + 260, 32);
        for (int g = 0; g < 256 / S; g++) {
          const int32_t s = S == 16 ? bs[g] : bs[2 * g] + bs[2 * g + 1];
          const int64_t j = i * (256 / S) + g;
          da[j] = d;
          ia[j] = c->off * s;
          ma[j] = d * (float)s; /* one rounding; ggml rounds d * sum(m bsum) instead */
        }
      }
    } else {
      const int64_t bb = at == ANNA_DTYPE_Q8_1 ? 36 : 34, qo = at == ANNA_DTYPE_Q8_1 ? 4 : 2;
      for (int64_t i = 0; i < K / 32; i++) {
        const uint8_t *b = blk + i * bb;
        memcpy(q + i * 32, b + qo, 32);
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += (int8_t)b[qo + j];
        da[i] = h2f(b);
        ia[i] = c->off * s;
        ma[i] = at == ANNA_DTYPE_Q8_1 ? h2f(b + 2) : 0.0f;
      }
    }
  }
}

/* ---- the tile kernel ---- */
#define QG_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* QG_TOK tokens (rows of q8 at tok[0..3]) x 32 decoded rows (wt, fst, fmt) over all K;
 * out[t][32] gets the sums. Always inlined into one copy per (S, has_min) so that every
 * loop below has constant trip counts and the accumulators live in registers. */
QG_TGT static inline __attribute__((always_inline)) void qg_kernel_body(
    const uint8_t *wt, const float *fst, const float *fmt, const qg_acts *a, const int64_t tok[QG_TOK], const int S,
    const int has_min, float out[QG_TOK][QG_ROWS]) {
  const int64_t K = a->K, nsb = a->nsb;
  const int G = S / 4;
  const int8_t *q[QG_TOK];
  const float *da[QG_TOK], *ma[QG_TOK];
  const int32_t *ia[QG_TOK];
#pragma GCC unroll 8
  for (int t = 0; t < QG_TOK; t++) {
    q[t] = a->q8 + tok[t] * K;
    da[t] = a->da + tok[t] * nsb;
    ma[t] = a->ma + tok[t] * nsb;
    ia[t] = a->ia + tok[t] * nsb;
  }
  __m512 acc[2][QG_TOK];
#pragma GCC unroll 8
  for (int t = 0; t < QG_TOK; t++) acc[0][t] = acc[1][t] = _mm512_setzero_ps();
  for (int64_t j = 0; j < nsb; j++) {
    __m512i is[2][QG_TOK];
#pragma GCC unroll 8
    for (int t = 0; t < QG_TOK; t++) is[0][t] = is[1][t] = _mm512_setzero_si512();
    const uint8_t *wj = wt + j * G * 128;
#pragma GCC unroll 8
    for (int g = 0; g < G; g++) {
      const __m512i w0 = _mm512_load_si512((const void *)(wj + g * 128));
      const __m512i w1 = _mm512_load_si512((const void *)(wj + g * 128 + 64));
#pragma GCC unroll 8
      for (int t = 0; t < QG_TOK; t++) {
        int32_t v;
        memcpy(&v, q[t] + j * S + g * 4, 4);
        const __m512i b = _mm512_set1_epi32(v);
        is[0][t] = _mm512_dpbusd_epi32(is[0][t], w0, b);
        is[1][t] = _mm512_dpbusd_epi32(is[1][t], w1, b);
      }
    }
    const __m512 fs0 = _mm512_load_ps(fst + j * 32), fs1 = _mm512_load_ps(fst + j * 32 + 16);
#pragma GCC unroll 8
    for (int t = 0; t < QG_TOK; t++) {
      const __m512i o = _mm512_set1_epi32(ia[t][j]);
      const __m512 d = _mm512_set1_ps(da[t][j]);
      acc[0][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(is[0][t], o)), _mm512_mul_ps(fs0, d), acc[0][t]);
      acc[1][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(is[1][t], o)), _mm512_mul_ps(fs1, d), acc[1][t]);
    }
    if (has_min) {
      const __m512 fm0 = _mm512_load_ps(fmt + j * 32), fm1 = _mm512_load_ps(fmt + j * 32 + 16);
#pragma GCC unroll 8
      for (int t = 0; t < QG_TOK; t++) {
        const __m512 m = _mm512_set1_ps(ma[t][j]);
        acc[0][t] = _mm512_fmadd_ps(fm0, m, acc[0][t]);
        acc[1][t] = _mm512_fmadd_ps(fm1, m, acc[1][t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < QG_TOK; t++) {
    _mm512_storeu_ps(out[t], acc[0][t]);
    _mm512_storeu_ps(out[t] + 16, acc[1][t]);
  }
}

/* ---- the AVX2 tile kernel ----
 * No vpdpbusd: vpmaddubsw multiplies u8 x s8 and adds pairs into i16 with saturation, exact
 * while 2 * u * 127 < 2^15, i.e. decoded bytes u <= 128; vpmaddwd against ones then adds the
 * pairs into the i32 sums vpdpbusd makes. The offset-128 types (Q8_0, IQ4_NL, IQ4_XS: bytes
 * up to 255) take the signed form instead (SGN): w = u - 128 in -128..127, multiplied as
 * |w| x (a * sign w), |w| <= 128 (vpsignb), which sums sum_k (u - 128) a = sum_k u a - o * sum_k a
 * directly, the integer the VNNI kernel gets after subtracting the offset term. A ymm holds 8 rows x 4 k, so a 4-k group of the 32-row tile is
 * four loads (the same scratch layout: [sub-block][group][32 rows x 4 bytes]). Tokens go two
 * at a time (8 i32 accumulators + 4 weight vectors + broadcast + ones: 14 of the 16 ymm);
 * the float sums live in out[][] and take, lane by lane, the AVX-512 kernel's operations in
 * its order, so both kernels give the same bits. */
#define QG2_TGT __attribute__((target("avx2,fma,f16c")))

static int qg_signed_type(int type) {
  return type == ANNA_DTYPE_Q8_0 || type == ANNA_DTYPE_IQ4_NL || type == ANNA_DTYPE_IQ4_XS;
}

QG2_TGT static inline __attribute__((always_inline)) void qg2_kernel_body(
    const uint8_t *wt, const float *fst, const float *fmt, const qg_acts *a, const int64_t tok[QG_TOK], const int S,
    const int has_min, const int sgn, float out[QG_TOK][QG_ROWS]) {
  const int64_t K = a->K, nsb = a->nsb;
  const int G = S / 4;
  const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
  for (int t = 0; t < QG_TOK; t++)
    for (int h = 0; h < 4; h++) _mm256_storeu_ps(out[t] + 8 * h, _mm256_setzero_ps());
  for (int tp = 0; tp < QG_TOK; tp += 2) {
    const int8_t *q[2] = {a->q8 + tok[tp] * K, a->q8 + tok[tp + 1] * K};
    const float *da[2] = {a->da + tok[tp] * nsb, a->da + tok[tp + 1] * nsb};
    const float *ma[2] = {a->ma + tok[tp] * nsb, a->ma + tok[tp + 1] * nsb};
    const int32_t *ia[2] = {a->ia + tok[tp] * nsb, a->ia + tok[tp + 1] * nsb};
    for (int64_t j = 0; j < nsb; j++) {
      __m256i is[2][4];
#pragma GCC unroll 8
      for (int t = 0; t < 2; t++)
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) is[t][h] = _mm256_setzero_si256();
      const uint8_t *wj = wt + j * G * 128;
#pragma GCC unroll 8
      for (int g = 0; g < G; g++) {
        __m256i w[4];
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
          w[h] = _mm256_load_si256((const __m256i *)(wj + g * 128 + 32 * h));
          if (sgn) w[h] = _mm256_xor_si256(w[h], flip); /* u - 128 as int8 */
        }
#pragma GCC unroll 2
        for (int t = 0; t < 2; t++) {
          int32_t v;
          memcpy(&v, q[t] + j * S + g * 4, 4);
          const __m256i b = _mm256_set1_epi32(v);
#pragma GCC unroll 4
          for (int h = 0; h < 4; h++) {
            const __m256i p = sgn ? _mm256_maddubs_epi16(_mm256_sign_epi8(w[h], w[h]), _mm256_sign_epi8(b, w[h]))
                                  : _mm256_maddubs_epi16(w[h], b);
            is[t][h] = _mm256_add_epi32(is[t][h], _mm256_madd_epi16(p, ones));
          }
        }
      }
#pragma GCC unroll 2
      for (int t = 0; t < 2; t++) {
        const __m256i o = _mm256_set1_epi32(sgn ? 0 : ia[t][j]); /* signed form: already subtracted */
        const __m256 d = _mm256_set1_ps(da[t][j]), m = _mm256_set1_ps(ma[t][j]);
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) {
          float *acc = out[tp + t] + 8 * h;
          __m256 v = _mm256_loadu_ps(acc);
          v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(is[t][h], o)),
                              _mm256_mul_ps(_mm256_load_ps(fst + j * 32 + 8 * h), d), v);
          if (has_min) v = _mm256_fmadd_ps(_mm256_load_ps(fmt + j * 32 + 8 * h), m, v);
          _mm256_storeu_ps(acc, v);
        }
      }
    }
  }
}

#define QG2_KERNEL(name, S, MIN, SGN)                                                                      \
  QG2_TGT static void name(const uint8_t *wt, const float *fst, const float *fmt, const qg_acts *a,         \
                           const int64_t tok[QG_TOK], float out[QG_TOK][QG_ROWS]) {                        \
    qg2_kernel_body(wt, fst, fmt, a, tok, S, MIN, SGN, out);                                               \
  }
QG2_KERNEL(qg2_kernel_32, 32, 0, 0)
QG2_KERNEL(qg2_kernel_32m, 32, 1, 0)
QG2_KERNEL(qg2_kernel_32s, 32, 0, 1)
QG2_KERNEL(qg2_kernel_16, 16, 0, 0)
QG2_KERNEL(qg2_kernel_16m, 16, 1, 0)

#define QG_KERNEL(name, S, MIN)                                                                            \
  QG_TGT static void name(const uint8_t *wt, const float *fst, const float *fmt, const qg_acts *a,          \
                          const int64_t tok[QG_TOK], float out[QG_TOK][QG_ROWS]) {                         \
    qg_kernel_body(wt, fst, fmt, a, tok, S, MIN, out);                                                     \
  }
QG_KERNEL(qg_kernel_32, 32, 0)
QG_KERNEL(qg_kernel_32m, 32, 1)
QG_KERNEL(qg_kernel_16, 16, 0)
QG_KERNEL(qg_kernel_16m, 16, 1)

typedef void (*qg_kernel_fn)(const uint8_t *, const float *, const float *, const qg_acts *, const int64_t *,
                             float (*)[QG_ROWS]);

/* y[0..nr) = out[0..nr) (+ bias): two masked 16-float stores. */
QG_TGT static void qg_store(float *y, const float *out, const float *bias, int nr) {
  for (int h = 0; h < 2 && h * 16 < nr; h++) {
    const int m = nr - h * 16 >= 16 ? 16 : nr - h * 16;
    const __mmask16 k = (__mmask16)((1u << m) - 1);
    __m512 v = _mm512_loadu_ps(out + h * 16);
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, bias + h * 16));
    _mm512_mask_storeu_ps(y + h * 16, k, v);
  }
}

/* y[0..nr) = out[0..nr) (+ bias), for the AVX2 path. */
static void qg_store_plain(float *y, const float *out, const float *bias, int nr) {
  for (int r = 0; r < nr; r++) y[r] = bias ? out[r] + bias[r] : out[r];
}

/* Scratch layout per worker (bytes): wt [nsb][G][2][64] = 32 K; fst, fmt [nsb][32] floats;
 * u [K]; fs, fm [nsb] floats for one row. */
static size_t qg_scratch_bytes(int64_t K) {
  const int64_t nsb = K / 16; /* worst case S = 16 */
  return (size_t)(QG_ROWS * K + 2 * QG_ROWS * nsb * 4 + K + 2 * nsb * 4 + 256);
}

int64_t cpu_qgemm_scratch_floats(int64_t max_cols) {
  return (int64_t)(qg_scratch_bytes(max_cols) + 3) / 4;
}

/* Bytes of one worker's activation block row: >= a Q8_1 (36 per 32) or Q8_K (292 per 256)
 * row, rounded to 64 so every worker's row starts aligned (the block structs need it). */
static int64_t qg_block_row_bytes(int64_t K) {
  return (K / 32 * 37 + 64 + 63) & ~(int64_t)63;
}

size_t cpu_qgemm_act_bytes(int64_t n, int64_t K, int nth) {
  const int64_t nsb = K / 16;
  return (size_t)((n + 1) * K + 64 + 3 * (n + 1) * nsb * 4 + (int64_t)nth * qg_block_row_bytes(K) + 64);
}

static void qg_tile_task(void *p, int ith, int nth) {
  struct qg_ctx *c = p;
  const ops_weight *w = c->w;
  const int64_t K = w->cols, rows = w->rows, S = c->sub, G = S / 4, nsb = K / S, n = c->a.n;
  const size_t rb = (size_t)dtype_row_bytes(w->type, K);
  uint8_t *sc = (uint8_t *)cpu_scratch(c->be, ith);
  uint8_t *wt = (uint8_t *)(((uintptr_t)sc + 63) & ~(uintptr_t)63);
  float *fst = (float *)(wt + QG_ROWS * K), *fmt = fst + QG_ROWS * nsb;
  uint8_t *u = (uint8_t *)(fmt + QG_ROWS * nsb);
  float *fs = (float *)(u + K), *fm = fs + nsb;
  /* Work items are (row tile, token chunk) pairs, tile-major so that a worker decodes each
   * tile once. Token chunks only when there are too few tiles to keep every worker busy
   * (k/v projections on many-core machines); each chunk keeps >= 32 tokens. */
  const int64_t tiles = (rows + QG_ROWS - 1) / QG_ROWS;
  int64_t tch = tiles >= 2 * nth ? 1 : (2 * nth + tiles - 1) / tiles;
  if (tch > (n + 31) / 32) tch = (n + 31) / 32;
  if (tch < 1) tch = 1;
  const int64_t per_chunk = ((n + tch - 1) / tch + QG_TOK - 1) / QG_TOK * QG_TOK;
  int64_t it0, it1;
  threadpool_range(tiles * tch, ith, nth, &it0, &it1);
  float out[QG_TOK][QG_ROWS];
  const int v512 = cpu_vnni_usable();
  const qg_kernel_fn kern = v512 ? (S == 32 ? (c->has_min ? qg_kernel_32m : qg_kernel_32)
                                            : (c->has_min ? qg_kernel_16m : qg_kernel_16))
                                 : qg_signed_type(w->type) ? qg2_kernel_32s
                                 : (S == 32 ? (c->has_min ? qg2_kernel_32m : qg2_kernel_32)
                                            : (c->has_min ? qg2_kernel_16m : qg2_kernel_16));
  int64_t have = -1; /* tile now decoded in wt */
  for (int64_t item = it0; item < it1; item++) {
    const int64_t tile = item / tch, chunk = item % tch;
    const int64_t r0 = tile * QG_ROWS, nr = rows - r0 < QG_ROWS ? rows - r0 : QG_ROWS;
    for (int64_t r = 0; r < QG_ROWS && tile != have; r++) {
      if (r < nr) {
        const uint8_t *src = (const uint8_t *)w->data + (size_t)(r0 + r) * rb;
        if (!v512 || !qg_decode_row_avx512(w->type, src, K, u, fs, fm)) qg_decode_row(w->type, src, K, u, fs, fm);
      } else { /* missing rows of the last tile: zero weights */
        memset(u, 0, (size_t)K);
        for (int64_t j = 0; j < nsb; j++) fs[j] = fm[j] = 0;
      }
      const int64_t h = r / 16, l = r % 16;
      for (int64_t j = 0; j < nsb; j++) {
        fst[j * 32 + r] = fs[j];
        fmt[j * 32 + r] = fm[j];
        for (int64_t g = 0; g < G; g++) memcpy(wt + ((j * G + g) * 2 + h) * 64 + l * 4, u + j * S + g * 4, 4);
      }
    }
    have = tile;
    const int64_t tb = chunk * per_chunk, te = tb + per_chunk < n ? tb + per_chunk : n;
    for (int64_t t0 = tb; t0 < te; t0 += QG_TOK) {
      int64_t tok[QG_TOK];
      for (int t = 0; t < QG_TOK; t++) tok[t] = t0 + t < te ? t0 + t : n;
      kern(wt, fst, fmt, &c->a, tok, out);
      for (int t = 0; t < QG_TOK && t0 + t < te; t++) {
        float *yt = c->y + (t0 + t) * rows + r0;
        const float *bt = c->bias ? c->bias + r0 : NULL;
        if (v512) qg_store(yt, out[t], bt, (int)nr);
        else qg_store_plain(yt, out[t], bt, (int)nr);
      }
    }
  }
}

int cpu_qgemm_usable(int type) {
  if (cpu_vnni_usable()) return qg_sub(type) != 0;
  return cpu_isa_level() >= 1 && qg_sub(type) != 0;
}

int cpu_qgemm(ops_backend *be, float *y, const float *x, int64_t n, const ops_weight *w, const float *bias) {
  cpu_impl *ci = be->impl;
  const int S = qg_sub(w->type);
  const int64_t K = w->cols;
  const int nth = ci->tp ? threadpool_size(ci->tp) : 1;
  if (!S || K % dtype_block_size(w->type) != 0 || ci->scratch_per_thread < cpu_qgemm_scratch_floats(K) ||
      ci->act_bytes < cpu_qgemm_act_bytes(n, K, nth))
    return 0;
  struct qg_ctx c = {be, y, x, w, bias, {0}, S, qg_offset(w->type), qg_has_min(w->type)};
  const int64_t nsb = K / S;
  uint8_t *p = (uint8_t *)(((uintptr_t)ci->act + 63) & ~(uintptr_t)63);
  c.a.n = n, c.a.K = K, c.a.nsb = nsb;
  c.a.q8 = (int8_t *)p;
  p += ((n + 1) * K + 63) & ~(int64_t)63;
  c.a.da = (float *)p, c.a.ma = c.a.da + (n + 1) * nsb;
  c.a.ia = (int32_t *)(c.a.ma + (n + 1) * nsb);
  c.a.blocks = (uint8_t *)(c.a.ia + (n + 1) * nsb);
  c.a.block_bytes = (size_t)qg_block_row_bytes(K);
  threadpool_run(ci->tp, qg_quant_task, &c);
  threadpool_run(ci->tp, qg_tile_task, &c);
  return 1;
}
