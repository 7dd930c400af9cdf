/* cpu_matmul.c: y = x W^T (+ bias), the CPU backend's matmul dispatch.
 *
 * Quantized weights, default numerics (llama.cpp's): the activations are quantized to 8
 * bits as ggml does (formats/quant.h) and multiplied in integers per block. 8+ tokens: the
 * tiled GEMM of cpu_qgemm.c (AVX-512 VNNI or AVX2); fewer (decode steps), other types or
 * older CPUs: per row integer dots, rows split across threads, bandwidth-bound (Q8_0/Q5_0/Q4_0 batches of
 * 2..7 tokens decode each row once for all tokens).
 * f32/f16/bf16 weights, and quantized weights with exact_matmul: f32 activations. 8+ tokens
 * on AVX-512 or AVX2: weights converted to f32 tiles (dequantized) and an 8x32 FMA
 * micro-kernel over K-major token panels; fewer: per-row f32 dots (quantized rows dequantized once).
 * Accumulation is f32 in SIMD lanes: the order differs from a sequential sum by float
 * rounding only.
 */
#include "backends/cpu/cpu_deq_avx512.h"
#include "backends/cpu/cpu_internal.h"
#include "formats/dtype.h"
#include "formats/quant.h"

#include <immintrin.h>
#include <math.h>

#define TOK_BLOCK 32

static int g_isa = -1;

int cpu_isa_level(void) {
  if (g_isa < 0) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) g_isa = 2;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c"))
      g_isa = 1;
    else g_isa = 0;
  }
  return g_isa;
}

void cpu_backend_force_isa(int level) {
  g_isa = -1;
  int have = cpu_isa_level();
  g_isa = level < have ? level : have;
}

const char *cpu_backend_isa(void) {
  static const char *names[] = {"scalar", "avx2", "avx512"};
  return names[cpu_isa_level()];
}

static inline float f16_to_f32(uint16_t h) {
  return quant_f16_to_f32(h); /* portable: this file also builds without -march=native */
}

/* ---- scalar ---- */
static float wval(int type, const void *w, int64_t i) {
  switch (type) {
  case ANNA_DTYPE_BF16: return bf16_to_f32(((const uint16_t *)w)[i]);
  case ANNA_DTYPE_F16: return f16_to_f32(((const uint16_t *)w)[i]);
  default: return ((const float *)w)[i];
  }
}

static void dot_scalar(int type, const void *w, const float *x, int64_t xs, int nt, int64_t cols,
                       float *out) {
  for (int t = 0; t < nt; t++) {
    float s = 0;
    for (int64_t i = 0; i < cols; i++) s += wval(type, w, i) * x[t * xs + i];
    out[t] = s;
  }
}

/* ---- AVX2 ---- */
__attribute__((target("avx2,fma,f16c"))) static inline __m256 ld8(int type, const void *w, int64_t i) {
  switch (type) {
  case ANNA_DTYPE_BF16:
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i))), 16));
  case ANNA_DTYPE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
  default: return _mm256_loadu_ps((const float *)w + i);
  }
}

__attribute__((target("avx2,fma,f16c"))) static inline float hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
  return _mm_cvtss_f32(a);
}

__attribute__((target("avx2,fma,f16c"))) static void dot_avx2(int type, const void *w, const float *x,
                                                              int64_t xs, int nt, int64_t cols,
                                                              float *out) {
  int64_t c8 = cols & ~(int64_t)7;
  /* Four tokens share each weight load; every token keeps the two accumulators and the
   * summation order of the one-token loop below, so a row's result does not depend on how
   * the batch was grouped (prefix reuse and batched == alone compare bits: a single
   * accumulator here moved logits by 1e-4 between a chunked and a whole prefill). */
  if (nt == 4) {
    __m256 a[4][2];
    for (int t = 0; t < 4; t++) a[t][0] = a[t][1] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= c8; i += 16) {
      const __m256 w0 = ld8(type, w, i), w1 = ld8(type, w, i + 8);
      for (int t = 0; t < 4; t++) {
        a[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * xs + i), a[t][0]);
        a[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * xs + i + 8), a[t][1]);
      }
    }
    if (i < c8) {
      const __m256 w0 = ld8(type, w, i);
      for (int t = 0; t < 4; t++) a[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * xs + i), a[t][0]);
    }
    for (int t = 0; t < 4; t++) out[t] = hsum8(_mm256_add_ps(a[t][0], a[t][1]));
  } else {
    for (int t = 0; t < nt; t++) {
      __m256 a0 = _mm256_setzero_ps(), a1 = a0;
      int64_t i = 0;
      for (; i + 16 <= c8; i += 16) {
        a0 = _mm256_fmadd_ps(ld8(type, w, i), _mm256_loadu_ps(x + t * xs + i), a0);
        a1 = _mm256_fmadd_ps(ld8(type, w, i + 8), _mm256_loadu_ps(x + t * xs + i + 8), a1);
      }
      for (; i < c8; i += 8) a0 = _mm256_fmadd_ps(ld8(type, w, i), _mm256_loadu_ps(x + t * xs + i), a0);
      out[t] = hsum8(_mm256_add_ps(a0, a1));
    }
  }
  for (int64_t i = c8; i < cols; i++) {
    float wi = wval(type, w, i);
    for (int t = 0; t < nt; t++) out[t] += wi * x[t * xs + i];
  }
}

/* ---- AVX-512 ---- */
__attribute__((target("avx512f,avx512bw"))) static inline __m512 ld16(int type, const void *w, int64_t i) {
  switch (type) {
  case ANNA_DTYPE_BF16:
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i))), 16));
  case ANNA_DTYPE_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
  default: return _mm512_loadu_ps((const float *)w + i);
  }
}

__attribute__((target("avx512f,avx512bw"))) static void dot_avx512(int type, const void *w,
                                                                  const float *x, int64_t xs, int nt,
                                                                  int64_t cols, float *out) {
  int64_t c16 = cols & ~(int64_t)15;
  if (nt == 4) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < c16; i += 16) {
      __m512 wv = ld16(type, w, i);
      a0 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + i), a0);
      a1 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + xs + i), a1);
      a2 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + 2 * xs + i), a2);
      a3 = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + 3 * xs + i), a3);
    }
    out[0] = _mm512_reduce_add_ps(a0), out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2), out[3] = _mm512_reduce_add_ps(a3);
  } else {
    for (int t = 0; t < nt; t++) {
      __m512 a0 = _mm512_setzero_ps(), a1 = a0;
      int64_t i = 0;
      for (; i + 32 <= c16; i += 32) {
        a0 = _mm512_fmadd_ps(ld16(type, w, i), _mm512_loadu_ps(x + t * xs + i), a0);
        a1 = _mm512_fmadd_ps(ld16(type, w, i + 16), _mm512_loadu_ps(x + t * xs + i + 16), a1);
      }
      for (; i < c16; i += 16) a0 = _mm512_fmadd_ps(ld16(type, w, i), _mm512_loadu_ps(x + t * xs + i), a0);
      out[t] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    }
  }
  for (int64_t i = c16; i < cols; i++) {
    float wi = wval(type, w, i);
    for (int t = 0; t < nt; t++) out[t] += wi * x[t * xs + i];
  }
}

/* Prefill micro-kernel: 8 weight rows x 32 tokens, K-major token panel. For each k it loads
 * two 16-token vectors of x^T and multiplies them by 8 broadcast weights: 16 FMAs, 2 vector
 * loads, and no horizontal reductions (the vector dimension is tokens, not k). c: [8][32]
 * accumulators in memory, added to (acc != 0) or overwritten. */
__attribute__((target("avx512f,avx512bw"))) static void mk8x32_avx512(const float *w, int64_t ws, const float *xt,
                                                                      int64_t K, float *c, int acc) {
  __m512 a[8][2];
  for (int r = 0; r < 8; r++) {
    a[r][0] = acc ? _mm512_loadu_ps(c + r * 32) : _mm512_setzero_ps();
    a[r][1] = acc ? _mm512_loadu_ps(c + r * 32 + 16) : _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < K; k++) {
    const __m512 x0 = _mm512_loadu_ps(xt + k * 32), x1 = _mm512_loadu_ps(xt + k * 32 + 16);
    for (int r = 0; r < 8; r++) {
      const __m512 b = _mm512_set1_ps(w[r * ws + k]);
      a[r][0] = _mm512_fmadd_ps(b, x0, a[r][0]);
      a[r][1] = _mm512_fmadd_ps(b, x1, a[r][1]);
    }
  }
  for (int r = 0; r < 8; r++) {
    _mm512_storeu_ps(c + r * 32, a[r][0]);
    _mm512_storeu_ps(c + r * 32 + 16, a[r][1]);
  }
}

/* AVX2 prefill micro-kernel: 6 weight rows x 16 tokens. 12 ymm accumulators (+2 x vectors
 * +1 broadcast = 15 of 16 registers) so both FMA pipes stay busy past the FMA latency; the
 * weights come K-interleaved (wp[k][6], packed once per tile) so the six broadcasts per k
 * read one contiguous 24-byte run instead of six rows a row-stride apart (which alias in L1
 * when the stride is a multiple of 4 KiB). Per token and row it is one FMA per k in k order,
 * the AVX-512 kernel's order, so the two ISAs give the same bits. c: [6][32] (row stride
 * PANEL), added to (acc != 0) or overwritten. */
__attribute__((target("avx2,fma"))) static void mk6x16_avx2(const float *wp, const float *xt, int64_t K, float *c,
                                                             int acc) {
  __m256 a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11;
  if (acc) {
    a0 = _mm256_loadu_ps(c + 0 * 32), a1 = _mm256_loadu_ps(c + 0 * 32 + 8);
    a2 = _mm256_loadu_ps(c + 1 * 32), a3 = _mm256_loadu_ps(c + 1 * 32 + 8);
    a4 = _mm256_loadu_ps(c + 2 * 32), a5 = _mm256_loadu_ps(c + 2 * 32 + 8);
    a6 = _mm256_loadu_ps(c + 3 * 32), a7 = _mm256_loadu_ps(c + 3 * 32 + 8);
    a8 = _mm256_loadu_ps(c + 4 * 32), a9 = _mm256_loadu_ps(c + 4 * 32 + 8);
    a10 = _mm256_loadu_ps(c + 5 * 32), a11 = _mm256_loadu_ps(c + 5 * 32 + 8);
  } else {
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = a10 = a11 = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < K; k++) {
    const __m256 x0 = _mm256_loadu_ps(xt + k * 32), x1 = _mm256_loadu_ps(xt + k * 32 + 8);
    const float *b = wp + k * 6;
    __m256 v = _mm256_broadcast_ss(b + 0);
    a0 = _mm256_fmadd_ps(v, x0, a0), a1 = _mm256_fmadd_ps(v, x1, a1);
    v = _mm256_broadcast_ss(b + 1);
    a2 = _mm256_fmadd_ps(v, x0, a2), a3 = _mm256_fmadd_ps(v, x1, a3);
    v = _mm256_broadcast_ss(b + 2);
    a4 = _mm256_fmadd_ps(v, x0, a4), a5 = _mm256_fmadd_ps(v, x1, a5);
    v = _mm256_broadcast_ss(b + 3);
    a6 = _mm256_fmadd_ps(v, x0, a6), a7 = _mm256_fmadd_ps(v, x1, a7);
    v = _mm256_broadcast_ss(b + 4);
    a8 = _mm256_fmadd_ps(v, x0, a8), a9 = _mm256_fmadd_ps(v, x1, a9);
    v = _mm256_broadcast_ss(b + 5);
    a10 = _mm256_fmadd_ps(v, x0, a10), a11 = _mm256_fmadd_ps(v, x1, a11);
  }
  _mm256_storeu_ps(c + 0 * 32, a0), _mm256_storeu_ps(c + 0 * 32 + 8, a1);
  _mm256_storeu_ps(c + 1 * 32, a2), _mm256_storeu_ps(c + 1 * 32 + 8, a3);
  _mm256_storeu_ps(c + 2 * 32, a4), _mm256_storeu_ps(c + 2 * 32 + 8, a5);
  _mm256_storeu_ps(c + 3 * 32, a6), _mm256_storeu_ps(c + 3 * 32 + 8, a7);
  _mm256_storeu_ps(c + 4 * 32, a8), _mm256_storeu_ps(c + 4 * 32 + 8, a9);
  _mm256_storeu_ps(c + 5 * 32, a10), _mm256_storeu_ps(c + 5 * 32 + 8, a11);
}

typedef void (*dot_fn)(int, const void *, const float *, int64_t, int, int64_t, float *);

static dot_fn pick_dot(void) {
  switch (cpu_isa_level()) {
  case 2: return dot_avx512;
  case 1: return dot_avx2;
  default: return dot_scalar;
  }
}

static int is_plain(int type) {
  return type == ANNA_DTYPE_F32 || type == ANNA_DTYPE_F16 || type == ANNA_DTYPE_BF16;
}

/* AVX-512 dequantization of the formats that dominate real GGUFs (Q8_0, Q4_0, Q5_0, Q4_K,
 * Q6_K: --exact converts every weight row once per matmul call, so this is its hot path;
 * the Q8_0/Q4_0 block decoders are shared with the KV-cache records, cpu_deq_avx512.h).
 * Same values as quant_dequantize_row: d * small integer, exact in f32. Returns 0 when the
 * type has no fast path here. */
CPU_DEQ_AVX512_TARGET static int deq_row_avx512(int type, const uint8_t *row, float *y, int64_t n) {
  const int64_t nb = n / 32;
  switch (type) {
  case ANNA_DTYPE_Q8_0:
    for (int64_t i = 0; i < nb; i++) cpu_deq_q8_0_block_avx512(row + i * 34, y + i * 32);
    return 1;
  case ANNA_DTYPE_Q4_0:
    for (int64_t i = 0; i < nb; i++) cpu_deq_q4_0_block_avx512(row + i * 18, y + i * 32);
    return 1;
  case ANNA_DTYPE_Q5_0: {
    const __m128i lo4 = _mm_set1_epi8(0x0f);
    for (int64_t i = 0; i < nb; i++) {
      const uint8_t *b = row + i * 22;
      uint16_t hd;
      memcpy(&hd, b, 2);
      const __m512 d = _mm512_set1_ps(_cvtsh_ss(hd));
      const __m128i qs = _mm_loadu_si128((const __m128i *)(b + 6));
      __m128i v0 = _mm_and_si128(qs, lo4), v1 = _mm_and_si128(_mm_srli_epi16(qs, 4), lo4);
      uint32_t qh;
      memcpy(&qh, b + 2, 4);
      const __m128i h = _mm_set1_epi8(0x10);
      v0 = _mm_or_si128(v0, _mm_maskz_mov_epi8((__mmask16)(qh & 0xffff), h));
      v1 = _mm_or_si128(v1, _mm_maskz_mov_epi8((__mmask16)(qh >> 16), h));
      const __m128i off = _mm_set1_epi8(16);
      v0 = _mm_sub_epi8(v0, off), v1 = _mm_sub_epi8(v1, off);
      _mm512_storeu_ps(y + i * 32, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v0))));
      _mm512_storeu_ps(y + i * 32 + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v1))));
    }
    return 1;
  }
  case ANNA_DTYPE_Q4_K:
    for (int64_t i = 0; i < n / 256; i++) {
      const uint8_t *b = row + i * 144, *qs = b + 16;
      uint16_t hd, hm;
      memcpy(&hd, b, 2), memcpy(&hm, b + 2, 2);
      const float d = _cvtsh_ss(hd), dmin = _cvtsh_ss(hm);
      for (int p = 0; p < 4; p++) {
        const __m128i q0 = _mm_loadu_si128((const __m128i *)(qs + 32 * p)), q1 = _mm_loadu_si128((const __m128i *)(qs + 32 * p + 16));
        for (int hi = 0; hi < 2; hi++) {
          const int s = 2 * p + hi;
          int sc, mn;
          if (s < 4) sc = b[4 + s] & 63, mn = b[4 + s + 4] & 63;
          else sc = (b[4 + s + 4] & 0x0f) | ((b[4 + s - 4] >> 6) << 4), mn = (b[4 + s + 4] >> 4) | ((b[4 + s] >> 6) << 4);
          const __m512 ds = _mm512_set1_ps(d * (float)sc), ms = _mm512_set1_ps(dmin * (float)mn);
          const __m128i lo4 = _mm_set1_epi8(0x0f);
          const __m128i v0 = hi ? _mm_and_si128(_mm_srli_epi16(q0, 4), lo4) : _mm_and_si128(q0, lo4);
          const __m128i v1 = hi ? _mm_and_si128(_mm_srli_epi16(q1, 4), lo4) : _mm_and_si128(q1, lo4);
          float *o = y + i * 256 + s * 32;
          _mm512_storeu_ps(o, _mm512_sub_ps(_mm512_mul_ps(ds, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v0))), ms));
          _mm512_storeu_ps(o + 16, _mm512_sub_ps(_mm512_mul_ps(ds, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v1))), ms));
        }
      }
    }
    return 1;
  case ANNA_DTYPE_Q6_K:
    for (int64_t i = 0; i < n / 256; i++) {
      const uint8_t *b = row + i * 210;
      const int8_t *sc = (const int8_t *)(b + 192);
      uint16_t hd;
      memcpy(&hd, b + 208, 2);
      const float d = _cvtsh_ss(hd);
      const __m128i lo4 = _mm_set1_epi8(0x0f), m3 = _mm_set1_epi8(3);
      const __m512 off = _mm512_set1_ps(32.0f);
      for (int h = 0; h < 2; h++)
        for (int c = 0; c < 8; c++) {
          __m128i l = _mm_loadu_si128((const __m128i *)(b + h * 64 + 16 * (c % 4)));
          l = c >= 4 ? _mm_and_si128(_mm_srli_epi16(l, 4), lo4) : _mm_and_si128(l, lo4);
          __m128i hb = _mm_loadu_si128((const __m128i *)(b + 128 + h * 32 + 16 * (c % 2)));
          hb = _mm_and_si128(_mm_srlv_epi16(hb, _mm_set1_epi16((short)(2 * (c / 2)))), m3);
          const __m128i q = _mm_or_si128(l, _mm_slli_epi16(hb, 4)); /* hb < 4: no carry across bytes */
          const __m512 v = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), off);
          _mm512_storeu_ps(y + i * 256 + h * 128 + c * 16, _mm512_mul_ps(_mm512_set1_ps(d * (float)sc[h * 8 + c]), v));
        }
    }
    return 1;
  default: return 0;
  }
}

void cpu_weight_row_f32(const ops_weight *w, int64_t r, float *dst) {
  size_t rb = (size_t)dtype_row_bytes(w->type, w->cols);
  const char *row = (const char *)w->data + (size_t)r * rb;
  if (cpu_isa_level() == 2 && deq_row_avx512(w->type, (const uint8_t *)row, dst, w->cols)) return;
  if (is_plain(w->type)) {
    for (int64_t i = 0; i < w->cols; i++) dst[i] = wval(w->type, row, i);
  } else {
    quant_dequantize_row(w->type, row, dst, w->cols);
  }
}

struct mm_ctx {
  ops_backend *be;
  float *y;
  const float *x;
  int64_t n;
  const ops_weight *w;
  const float *bias;
  dot_fn dot;
  const void *act; /* quantized activations (quantized weights only) */
};

/* Small decode batches (2..7 tokens) of Q8_0/Q5_0/Q4_0 weights: each weight row is decoded
 * to int8 + per-block scales once, then dotted with every token's Q8_0 activation blocks
 * with VNNI (sign trick: |w| x sign(w)*a), accumulating scaled block sums in SIMD lanes.
 * Same integer products and scales as the per-token vec_dot; only the float summation
 * order differs. */
static int row_i8_type(int type) {
  return type == ANNA_DTYPE_Q8_0 || type == ANNA_DTYPE_Q5_0 || type == ANNA_DTYPE_Q4_0;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))) static void
row_i8_decode(int type, const uint8_t *row, int64_t nb, int8_t *q, float *d) {
  const __m128i lo4 = _mm_set1_epi8(0x0f);
  for (int64_t i = 0; i < nb; i++) {
    uint16_t hd;
    if (type == ANNA_DTYPE_Q8_0) {
      const uint8_t *b = row + i * 34;
      memcpy(&hd, b, 2);
      memcpy(q + i * 32, b + 2, 32);
    } else {
      const int q5 = type == ANNA_DTYPE_Q5_0;
      const uint8_t *b = row + i * (q5 ? 22 : 18);
      memcpy(&hd, b, 2);
      const __m128i qs = _mm_loadu_si128((const __m128i *)(b + (q5 ? 6 : 2)));
      __m128i v0 = _mm_and_si128(qs, lo4), v1 = _mm_and_si128(_mm_srli_epi16(qs, 4), lo4);
      if (q5) {
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        const __m128i h = _mm_set1_epi8(0x10);
        v0 = _mm_or_si128(v0, _mm_maskz_mov_epi8((__mmask16)(qh & 0xffff), h));
        v1 = _mm_or_si128(v1, _mm_maskz_mov_epi8((__mmask16)(qh >> 16), h));
      }
      const __m128i off = _mm_set1_epi8(q5 ? 16 : 8);
      _mm_storeu_si128((__m128i *)(q + i * 32), _mm_sub_epi8(v0, off));
      _mm_storeu_si128((__m128i *)(q + i * 32 + 16), _mm_sub_epi8(v1, off));
    }
    d[i] = _cvtsh_ss(hd);
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))) static void
row_i8_dots(int type, const uint8_t *row, int64_t nb, const uint8_t *act, int64_t ab, int nt, int8_t *q, float *d,
            float *out) {
  row_i8_decode(type, row, nb, q, d);
  for (int t = 0; t < nt; t++) {
    const uint8_t *a = act + t * ab;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
      const uint8_t *ab_ = a + i * 34;
      uint16_t ha;
      memcpy(&ha, ab_, 2);
      const __m256i wv = _mm256_loadu_si256((const __m256i *)(q + i * 32));
      const __m256i av = _mm256_loadu_si256((const __m256i *)(ab_ + 2));
      const __m256i sa = _mm256_sign_epi8(av, wv);
      const __m256i dp = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wv), sa);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp), _mm256_set1_ps(d[i] * _cvtsh_ss(ha)), acc);
    }
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
    out[t] = _mm_cvtss_f32(s4);
  }
}

static int g_vnni = -1; /* the CPU has AVX-512 VNNI (cached) */

int cpu_vnni_usable(void) {
  if (g_vnni < 0) {
    __builtin_cpu_init();
    g_vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }
  return g_vnni && cpu_isa_level() == 2;
}

static void mm_quant_task(void *p, int ith, int nth) {
  struct mm_ctx *m = p;
  const ops_weight *w = m->w;
  int64_t r0, r1;
  threadpool_range(w->rows, ith, nth, &r0, &r1);
  if (r0 >= r1) return;
  if (m->n >= 2 && cpu_vnni_usable() && row_i8_type(w->type) && quant_act_type(w->type) == ANNA_DTYPE_Q8_0) {
    const int64_t nb = w->cols / 32, ab = quant_act_row_bytes(w->type, w->cols);
    const size_t rb = (size_t)dtype_row_bytes(w->type, w->cols);
    float *sc = cpu_scratch(m->be, ith), *d = sc, out[8];
    int8_t *q = (int8_t *)(sc + nb);
    for (int64_t r = r0; r < r1; r++)
      for (int64_t t0 = 0; t0 < m->n; t0 += 8) {
        const int nt = m->n - t0 < 8 ? (int)(m->n - t0) : 8;
        row_i8_dots(w->type, (const uint8_t *)w->data + (size_t)r * rb, nb, (const uint8_t *)m->act + t0 * ab, ab, nt,
                    q, d, out);
        for (int t = 0; t < nt; t++) m->y[(t0 + t) * w->rows + r] = out[t];
      }
  } else {
    quant_matmul_rows(w->type, w->data, w->cols, r0, r1, m->act, m->n, m->y, w->rows);
  }
  if (m->bias)
    for (int64_t t = 0; t < m->n; t++)
      for (int64_t r = r0; r < r1; r++) m->y[t * w->rows + r] += m->bias[r];
}

static void mm_task(void *p, int ith, int nth) {
  struct mm_ctx *m = p;
  const ops_weight *w = m->w;
  int64_t r0, r1;
  threadpool_range(w->rows, ith, nth, &r0, &r1);
  const int64_t cols = w->cols, rows = w->rows;
  const size_t rb = (size_t)dtype_row_bytes(w->type, cols);
  for (int64_t t0 = 0; t0 < m->n; t0 += TOK_BLOCK) {
    int64_t t1 = t0 + TOK_BLOCK < m->n ? t0 + TOK_BLOCK : m->n;
    for (int64_t r = r0; r < r1; r++) {
      const void *wr = (const char *)w->data + (size_t)r * rb;
      const int type = w->type;
      float b = m->bias ? m->bias[r] : 0.0f;
      float out[4];
      for (int64_t t = t0; t < t1; t += 4) {
        int nt = t1 - t >= 4 ? 4 : (int)(t1 - t);
        m->dot(type, wr, m->x + t * cols, cols, nt, cols, out);
        for (int j = 0; j < nt; j++) m->y[(t + j) * rows + r] = out[j] + b;
      }
    }
  }
}

/* Prefill path (n >= 8, AVX-512 or AVX2). Exact: weights are converted (dequantized) to f32 and
 * multiplied with f32 activations, like the reference, at FMA speed rather than block-decode
 * speed. Layout: the activations are transposed once into panels of 32 tokens, K-major
 * ([panel][k][32], zero-padded), shared by all workers; each worker converts TILE_ROWS rows
 * at a time into its scratch and runs the 8x32 kernel over K in chunks that keep the panel
 * slice in L1 (AVX-512; AVX2 has its own tiles below). Workers split rows in whole tiles. */
#define TILE_ROWS 16
#define PANEL 32
#define KC 256

struct tile_ctx {
  struct mm_ctx *m;
  const float *xt; /* [n_panels][cols][PANEL] */
  void (*mk)(const float *w, int64_t ws, const float *xt, int64_t K, float *c, int acc); /* 8x32 kernel (AVX-512) */
};

static void mm_tile_task(void *p, int ith, int nth) {
  struct tile_ctx *tc = p;
  struct mm_ctx *m = tc->m;
  const ops_weight *w = m->w;
  const int64_t cols = w->cols, rows = w->rows, n = m->n, panels = (n + PANEL - 1) / PANEL;
  const int64_t tiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
  int64_t tl0, tl1;
  threadpool_range(tiles, ith, nth, &tl0, &tl1);
  float *wt = cpu_scratch(m->be, ith);          /* [TILE_ROWS][cols] */
  float *cbuf = wt + TILE_ROWS * cols;          /* [TILE_ROWS][PANEL] */
  for (int64_t tile = tl0; tile < tl1; tile++) {
    const int64_t r0 = tile * TILE_ROWS, nr = r0 + TILE_ROWS < rows ? TILE_ROWS : rows - r0;
    for (int64_t r = 0; r < nr; r++) cpu_weight_row_f32(w, r0 + r, wt + r * cols);
    for (int64_t r = nr; r < TILE_ROWS; r++) memset(wt + r * cols, 0, (size_t)cols * sizeof(float));
    for (int64_t pnl = 0; pnl < panels; pnl++) {
      const float *xt = tc->xt + pnl * cols * PANEL;
      for (int64_t k0 = 0; k0 < cols; k0 += KC) {
        const int64_t kl = cols - k0 < KC ? cols - k0 : KC;
        for (int g = 0; g < TILE_ROWS / 8; g++)
          tc->mk(wt + g * 8 * cols + k0, cols, xt + k0 * PANEL, kl, cbuf + g * 8 * PANEL, k0 > 0);
      }
      const int64_t t0 = pnl * PANEL, nt = n - t0 < PANEL ? n - t0 : PANEL;
      for (int64_t r = 0; r < nr; r++) {
        const float b = m->bias ? m->bias[r0 + r] : 0.0f;
        for (int64_t t = 0; t < nt; t++) m->y[(t0 + t) * rows + r0 + r] = cbuf[r * PANEL + t] + b;
      }
    }
  }
}

/* AVX2 tiles: 24 rows = four 6-row blocks, each packed K-interleaved ([block][cols][6]) once
 * per tile and reused by every panel. The k chunk is smaller than the AVX-512 one so a
 * chunk's packed weights (24 x KC2 floats) and its half-panel slice (KC2 x 16) stay in a
 * 32 KiB L1 together while the four row blocks and two token halves reuse them. */
#define TILE_ROWS2 24
#define KC2 128

static void mm_tile_avx2_task(void *p, int ith, int nth) {
  struct tile_ctx *tc = p;
  struct mm_ctx *m = tc->m;
  const ops_weight *w = m->w;
  const int64_t cols = w->cols, rows = w->rows, n = m->n, panels = (n + PANEL - 1) / PANEL;
  const int64_t tiles = (rows + TILE_ROWS2 - 1) / TILE_ROWS2;
  int64_t tl0, tl1;
  threadpool_range(tiles, ith, nth, &tl0, &tl1);
  float *wp = cpu_scratch(m->be, ith);   /* [TILE_ROWS2 / 6][cols][6] */
  float *row = wp + TILE_ROWS2 * cols;   /* [cols]: one converted row before packing */
  float *cbuf = row + cols;              /* [TILE_ROWS2][PANEL] */
  for (int64_t tile = tl0; tile < tl1; tile++) {
    const int64_t r0 = tile * TILE_ROWS2, nr = r0 + TILE_ROWS2 < rows ? TILE_ROWS2 : rows - r0;
    const int nb = (int)((nr + 5) / 6); /* 6-row blocks holding rows: a short last tile skips the rest */
    for (int64_t r = 0; r < nb * 6; r++) {
      float *dst = wp + (r / 6) * cols * 6 + r % 6;
      if (r < nr) {
        cpu_weight_row_f32(w, r0 + r, row);
        for (int64_t k = 0; k < cols; k++) dst[k * 6] = row[k];
      } else {
        for (int64_t k = 0; k < cols; k++) dst[k * 6] = 0.0f;
      }
    }
    for (int64_t pnl = 0; pnl < panels; pnl++) {
      const float *xt = tc->xt + pnl * cols * PANEL;
      for (int64_t k0 = 0; k0 < cols; k0 += KC2) {
        const int64_t kl = cols - k0 < KC2 ? cols - k0 : KC2;
        for (int th = 0; th < 2; th++)
          for (int rb = 0; rb < nb; rb++)
            mk6x16_avx2(wp + rb * cols * 6 + k0 * 6, xt + k0 * PANEL + th * 16, kl, cbuf + rb * 6 * PANEL + th * 16,
                        k0 > 0);
      }
      const int64_t t0 = pnl * PANEL, nt = n - t0 < PANEL ? n - t0 : PANEL;
      for (int64_t r = 0; r < nr; r++) {
        const float b = m->bias ? m->bias[r0 + r] : 0.0f;
        for (int64_t t = 0; t < nt; t++) m->y[(t0 + t) * rows + r0 + r] = cbuf[r * PANEL + t] + b;
      }
    }
  }
}

int64_t cpu_matmul_scratch_floats(int64_t max_cols) {
  const int64_t f32_tile = TILE_ROWS * max_cols + TILE_ROWS * PANEL, qg = cpu_qgemm_scratch_floats(max_cols);
  const int64_t f32_tile2 = TILE_ROWS2 * max_cols + max_cols + TILE_ROWS2 * PANEL;
  const int64_t t = f32_tile > f32_tile2 ? f32_tile : f32_tile2;
  return t > qg ? t : qg;
}

/* Exact path for small batches of quantized weights: each row dequantized once into the
 * worker's scratch, then f32 dots with every token. */
static void mm_exact_rows_task(void *p, int ith, int nth) {
  struct mm_ctx *m = p;
  const ops_weight *w = m->w;
  int64_t r0, r1;
  threadpool_range(w->rows, ith, nth, &r0, &r1);
  float *row = cpu_scratch(m->be, ith), out[4];
  for (int64_t r = r0; r < r1; r++) {
    cpu_weight_row_f32(w, r, row);
    const float b = m->bias ? m->bias[r] : 0.0f;
    for (int64_t t = 0; t < m->n; t += 4) {
      const int nt = m->n - t >= 4 ? 4 : (int)(m->n - t);
      m->dot(ANNA_DTYPE_F32, row, m->x + t * w->cols, w->cols, nt, w->cols, out);
      for (int j = 0; j < nt; j++) m->y[(t + j) * w->rows + r] = out[j] + b;
    }
  }
}

/* Below this many tokens the quantized GEMM's one-off row decode (a pass over every weight
 * per call) is not amortized: batches (decode steps of a few sequences, verify windows) use
 * the per-row dots. The decode is cheap with AVX-512 (8 tokens); on AVX2 the per-row dots
 * stay ahead up to ~32 tokens (2-core EPYC, 0.5B Q8_0/Q4_K model, 1 thread: 8 tokens 232 vs
 * 702 ms, 16: 463 vs 780, 32: about even, 64: 2750 vs 1365; bench/notes/spec.md). */
static int64_t qg_min_tokens(void) {
  return cpu_vnni_usable() ? 8 : 32;
}

void cpu_matmul(ops_backend *be, float *y, const float *x, int64_t n, const ops_weight *w,
                const float *bias) {
  cpu_impl *c = be->impl;
  struct mm_ctx m = {be, y, x, n, w, bias, pick_dot(), NULL};
  if (!is_plain(w->type) && !c->exact_matmul) {
    /* llama.cpp's numerics: 8-bit activations (quant.h), integer block dots. */
    if (n >= qg_min_tokens() && cpu_qgemm_usable(w->type) && cpu_qgemm(be, y, x, n, w, bias)) return;
    /* Activations quantized once, shared by all workers (bounded by the backend's act
     * buffer, sized for n_batch x widest row at creation). */
    const int64_t ab = quant_act_row_bytes(w->type, w->cols);
    for (int64_t t = 0; t < n; t++) quant_quantize_act(w->type, x + t * w->cols, (char *)c->act + t * ab, w->cols);
    m.act = c->act;
    threadpool_run(c->tp, mm_quant_task, &m);
    return;
  }
  /* f32 activations: plain weights always, quantized ones in exact mode. */
  if (n >= 8 && cpu_isa_level() >= 1 && c->scratch_per_thread >= cpu_matmul_scratch_floats(w->cols) &&
      c->act_bytes >= (size_t)((n + PANEL - 1) / PANEL * PANEL * w->cols) * sizeof(float)) {
    /* Transpose the activations into zero-padded K-major panels (the act buffer is free:
     * this path quantizes nothing). */
    float *xt = c->act;
    const int64_t cols = w->cols, panels = (n + PANEL - 1) / PANEL;
    for (int64_t pnl = 0; pnl < panels; pnl++) {
      float *dst = xt + pnl * cols * PANEL;
      const int64_t t0 = pnl * PANEL, nt = n - t0 < PANEL ? n - t0 : PANEL;
      if (nt < PANEL) memset(dst, 0, (size_t)(cols * PANEL) * sizeof(float));
      for (int64_t t = 0; t < nt; t++) {
        const float *src = x + (t0 + t) * cols;
        for (int64_t k = 0; k < cols; k++) dst[k * PANEL + t] = src[k];
      }
    }
    struct tile_ctx tc = {&m, xt, mk8x32_avx512};
    threadpool_run(c->tp, cpu_isa_level() == 2 ? mm_tile_task : mm_tile_avx2_task, &tc);
    return;
  }
  if (!is_plain(w->type)) {
    threadpool_run(c->tp, mm_exact_rows_task, &m);
    return;
  }
  /* Tiny matrices (router, gates) are not worth waking the pool for. */
  if (w->rows * w->cols * n < 32768) mm_task(&m, 0, 1);
  else threadpool_run(c->tp, mm_task, &m);
}

/* The CPU gains nothing from one pass over several weights (each matmul already spreads
 * its rows over the pool), so a group is its matmuls in turn: also the reference the device
 * backends' grouped kernels are tested against. */
void cpu_matmul_group(ops_backend *be, int count, float *const *ys, const float *x, int64_t n,
                      const ops_weight *const *ws, const float *const *biases) {
  for (int i = 0; i < count; i++) cpu_matmul(be, ys[i], x, n, ws[i], biases ? biases[i] : NULL);
}

void cpu_backend_set_exact_matmul(ops_backend *be, int on) { ((cpu_impl *)be->impl)->exact_matmul = on; }

void cpu_embed(ops_backend *be, float *out, const ops_weight *table, const int32_t *ids, int64_t n,
               float scale) {
  (void)be;
  for (int64_t i = 0; i < n; i++) {
    float *o = out + i * table->cols;
    cpu_weight_row_f32(table, ids[i], o);
    if (scale != 1.0f)
      for (int64_t j = 0; j < table->cols; j++) o[j] *= scale;
  }
}
