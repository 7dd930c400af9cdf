/* test_qgemm.c: CPU matmul of llama.cpp-quantized weights in every numerics mode.
 *
 * For each weight type, on random blocks (random bytes with sane f16 scales, some blocks
 * with extreme scales), odd token counts and row counts that are not a multiple of the
 * GEMM tile:
 *  - default mode (8-bit activations, tiled VNNI GEMM for >= 8 tokens, row dots below and
 *    on CPUs without AVX-512 VNNI) against the scalar reference of the same quantized
 *    arithmetic (quant_quantize_act + scalar quant_vec_dot), to float rounding (1e-5 of
 *    sum |w a|);
 *  - the same against dequantize + float64, within the 8-bit activation rounding bound
 *    sum |w| |x - dequant(quant(x))| (+ Q8_1's f16 s) plus 1e-5 of sum |w a|;
 *  - exact mode against dequantize + float64 to f32 rounding (1e-5);
 *  - the lower ISA paths (AVX2, scalar) against the same references.
 * Also pins the activation quantizers to ggml's conventions (Q8_K's sign, Q8_1's s).
 * With --bench: times the matmul at real prefill shapes (single-threaded and 2 threads). */
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_internal.h"
#include "base/threadpool.h"
#include "formats/dtype.h"
#include "formats/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"

/* Random weight rows: random bytes, then every f16 scale set to a finite value; one block
 * in 7 gets an extreme scale (tiny subnormal-range or large). */
static void random_weights(int type, uint8_t *w, int64_t rows, int64_t cols) {
  const int64_t bb = dtype_block_bytes(type), nb = rows * cols / dtype_block_size(type);
  for (int64_t i = 0; i < nb * bb; i++) w[i] = (uint8_t)rnd();
  int f[2];
  const int nf = dtype_f16_fields(type, f);
  for (int64_t b = 0; b < nb; b++)
    for (int k = 0; k < nf; k++) {
      float v = (0.2f + 0.8f * fabsf(frand())) * 0.02f;
      const uint64_t e = rnd() % 7;
      if (e == 0) v *= 1e-4f;       /* f16 subnormal range */
      else if (e == 1) v *= 3000.0f; /* large */
      if (k == 0 && (type == ANNA_DTYPE_Q8_0 || type == ANNA_DTYPE_Q4_0) && (rnd() & 1)) v = -v;
      const uint16_t h = quant_f32_to_f16(v);
      memcpy(w + b * bb + f[k], &h, 2);
    }
}

/* Activations: mostly uniform; token 1 scaled by 1e3, token 2 all zero, token 4 with one
 * large outlier per row (the Q8 scales then swallow the rest). */
static void random_acts(float *x, int64_t n, int64_t cols) {
  for (int64_t t = 0; t < n; t++)
    for (int64_t k = 0; k < cols; k++) {
      float v = frand();
      if (t == 1) v *= 1e3f; /* Q8_1's f16 s = d * sum(q) overflows (in ggml too) near 1e4 */
      if (t == 2) v = 0;
      if (t == 4 && k == cols / 3) v = 300.0f;
      x[t * cols + k] = v;
    }
}

typedef struct refs {
  double *quant; /* scalar quantized-arithmetic reference */
  double *exact; /* dequantized weights x f32 activations, float64 */
  double *mag;   /* sum |w x| per output: the scale errors are measured against */
  double *qerr;  /* bound of the 8-bit activation rounding: sum |w| |x - deq(q(x))| (+ Q8_1's s) */
} refs;

/* Dequantized activation row (the 8-bit values times their block scale) and, for Q8_1,
 * the f16 rounding bound of each block's s. */
static void act_dequant(int type, const uint8_t *a, int64_t cols, float *xq, float *s_err) {
  const int at = quant_act_type(type);
  for (int64_t b = 0; b < cols / (at == ANNA_DTYPE_Q8_K ? 256 : 32); b++) {
    if (at == ANNA_DTYPE_Q8_K) {
      float d;
      memcpy(&d, a + b * 292, 4);
      for (int j = 0; j < 256; j++) xq[b * 256 + j] = d * (float)(int8_t)a[b * 292 + 4 + j];
      continue;
    }
    const int64_t bb = at == ANNA_DTYPE_Q8_1 ? 36 : 34, qo = at == ANNA_DTYPE_Q8_1 ? 4 : 2;
    uint16_t h;
    memcpy(&h, a + b * bb, 2);
    const float d = quant_f16_to_f32(h);
    for (int j = 0; j < 32; j++) xq[b * 32 + j] = d * (float)(int8_t)a[b * bb + qo + j];
    if (at == ANNA_DTYPE_Q8_1) {
      memcpy(&h, a + b * bb + 2, 2);
      s_err[b] = fabs((double)quant_f16_to_f32(h)) / 1024.0;
    }
  }
}

static void make_refs(int type, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int64_t n, refs *r) {
  const int64_t rb = dtype_row_bytes(type, cols), ab = quant_act_row_bytes(type, cols);
  uint8_t *act = malloc((size_t)(ab * n));
  float *deq = malloc(sizeof(float) * cols), *xq = malloc(sizeof(float) * cols * n), *serr = calloc((size_t)(cols / 32 * n), sizeof(float));
  char err[128];
  quant_isa_set(QUANT_ISA_SCALAR, err, sizeof err); /* the scalar quantizers are the reference */
  for (int64_t t = 0; t < n; t++) {
    quant_quantize_act(type, x + t * cols, act + t * ab, cols);
    act_dequant(type, act + t * ab, cols, xq + t * cols, serr + t * (cols / 32));
  }
  quant_isa_set(quant_isa_best(), err, sizeof err);
  for (int64_t i = 0; i < rows; i++) {
    quant_dequantize_row(type, w + i * rb, deq, cols);
    for (int64_t t = 0; t < n; t++) {
      double e = 0, m = 0, qe = 0;
      for (int64_t k = 0; k < cols; k++) {
        e += (double)deq[k] * x[t * cols + k];
        m += fabs((double)deq[k] * x[t * cols + k]);
        qe += fabs((double)deq[k]) * fabs((double)x[t * cols + k] - xq[t * cols + k]);
      }
      if (quant_act_type(type) == ANNA_DTYPE_Q8_1) { /* m_w * (s - d sum q) per block */
        const int64_t bb = dtype_block_bytes(type);
        for (int64_t b = 0; b < cols / 32; b++) {
          uint16_t h;
          memcpy(&h, w + i * rb + b * bb + 2, 2);
          qe += fabs((double)quant_f16_to_f32(h)) * serr[t * (cols / 32) + b];
        }
      }
      r->qerr[t * rows + i] = qe;
      r->exact[t * rows + i] = e;
      r->mag[t * rows + i] = m;
      r->quant[t * rows + i] = quant_vec_dot_isa(QUANT_ISA_SCALAR, type, cols, w + i * rb, act + t * ab);
    }
  }
  free(act), free(deq), free(xq), free(serr);
}

/* max over outputs of |y - exact| beyond the activation rounding bound, per sum |w x| */
static double err_beyond(const float *y, const double *ex, const double *qerr, const double *mag, int64_t m) {
  double e = 0, floor = 1e-30;
  for (int64_t i = 0; i < m; i++) floor = fmax(floor, mag[i] * 1e-6);
  for (int64_t i = 0; i < m; i++) {
    const double d = fmax(0.0, fabs((double)y[i] - ex[i]) - qerr[i]) / fmax(mag[i], floor);
    e = fmax(e, isnan(d) ? INFINITY : d);
  }
  return e;
}

/* max over outputs of |y - ref| / max(mag, floor): floor keeps all-zero rows meaningful */
static double err_vs(const float *y, const double *ref, const double *mag, int64_t m) {
  double e = 0, floor = 1e-30;
  for (int64_t i = 0; i < m; i++) floor = fmax(floor, mag[i] * 1e-6);
  for (int64_t i = 0; i < m; i++) {
    const double d = fabs((double)y[i] - ref[i]) / fmax(mag[i], floor);
    e = fmax(e, isnan(d) ? INFINITY : d);
  }
  return e;
}

static void test_type(ops_backend *be, int type) {
  const int bs = (int)dtype_block_size(type);
  const int64_t ks32[] = {96, 288}, ks256[] = {256, 768};
  const int64_t *ks = bs == 32 ? ks32 : ks256;
  const int64_t ns[] = {1, 3, 8, 17, 33, 100}, rows_list[] = {5, 37, 70};
  double worst_q = 0, worst_8 = 0, worst_x = 0;
  for (int ki = 0; ki < 2; ki++)
    for (int ri = 0; ri < 3; ri++) {
      const int64_t K = ks[ki], rows = rows_list[ri], nmax = 100;
      uint8_t *w = malloc((size_t)(dtype_row_bytes(type, K) * rows));
      float *x = malloc(sizeof(float) * nmax * K), *y = malloc(sizeof(float) * nmax * rows);
      refs r = {malloc(sizeof(double) * nmax * rows), malloc(sizeof(double) * nmax * rows),
                malloc(sizeof(double) * nmax * rows), malloc(sizeof(double) * nmax * rows)};
      random_weights(type, w, rows, K);
      random_acts(x, nmax, K);
      float bias[70];
      for (int i = 0; i < 70; i++) bias[i] = 0.25f * (float)(i % 5) - 0.5f; /* y + b - b: one rounding of y + b, far inside the tolerance */
      make_refs(type, w, rows, K, x, nmax, &r);
      ops_weight ow = {type, w, rows, K};
      for (int ni = 0; ni < 6; ni++) {
        const int64_t n = ns[ni];
        char what[128];
        for (int isa = 2; isa >= 0; isa--) {
          cpu_backend_force_isa(isa);
          memset(y, 0xff, sizeof(float) * n * rows);
          /* odd token counts with a bias (added after the sums), taken off again here */
          be->matmul(be, y, x, n, &ow, n % 2 ? bias : NULL);
          if (n % 2)
            for (int64_t i = 0; i < n * rows; i++) y[i] -= bias[i % rows];
          const double eq = err_vs(y, r.quant, r.mag, n * rows), e8 = err_beyond(y, r.exact, r.qerr, r.mag, n * rows);
          snprintf(what, sizeof what, "%s n=%lld rows=%lld K=%lld isa=%d vs quantized ref", dtype_name(type),
                   (long long)n, (long long)rows, (long long)K, isa);
          check(what, eq, 1e-5);
          snprintf(what, sizeof what, "%s n=%lld rows=%lld K=%lld isa=%d vs exact + act. rounding", dtype_name(type), (long long)n,
                   (long long)rows, (long long)K, isa);
          check(what, e8, 1e-5);
          worst_q = fmax(worst_q, eq), worst_8 = fmax(worst_8, e8);
        }
        cpu_backend_force_isa(2);
        cpu_backend_set_exact_matmul(be, 1);
        be->matmul(be, y, x, n, &ow, NULL);
        cpu_backend_set_exact_matmul(be, 0);
        const double ex = err_vs(y, r.exact, r.mag, n * rows);
        snprintf(what, sizeof what, "%s n=%lld rows=%lld K=%lld exact mode", dtype_name(type), (long long)n,
                 (long long)rows, (long long)K);
        check(what, ex, 1e-5);
        worst_x = fmax(worst_x, ex);
      }
      free(w), free(x), free(y), free(r.quant), free(r.exact), free(r.mag), free(r.qerr);
    }
  printf("  %-7s vs quantized ref %.1e, vs exact beyond act. rounding %.1e, exact mode %.1e\n", dtype_name(type), worst_q,
         worst_8, worst_x);
}

/* ggml's conventions, written out independently here. */
static void test_act_quant(void) {
  float x[256];
  for (int i = 0; i < 256; i++) x[i] = frand();
  x[37] = 2.5f, x[90] = -2.5f; /* tie in magnitude: the first (positive) one sets the sign */
  uint8_t blk[292];
  quant_quantize_row_q8_k(x, blk, 256);
  float d;
  memcpy(&d, blk, 4);
  check("q8_K: d = 1 / (-127 / max) < 0 for a positive max", fabs((double)d - (double)(1.0f / (-127.0f / 2.5f))), 0);
  check("q8_K: max -> -127", fabs((double)(int8_t)blk[4 + 37] + 127), 0);
  check("q8_K: -max -> 127", fabs((double)(int8_t)blk[4 + 90] - 127), 0);
  int bad = 0;
  for (int i = 0; i < 256; i++) bad += (int8_t)blk[4 + i] != (int8_t)lrintf(x[i] * (-127.0f / 2.5f));
  check("q8_K: values round half to even of x * iscale", bad, 0);
  /* Q8_0 / Q8_1: multiplier 127 / amax, d = f16(amax / 127), s = f16(d * sum) */
  uint8_t b0[34], b1[36];
  quant_quantize_row_q8_0(x, b0, 32);
  quant_quantize_row_q8_1(x, b1, 32);
  float amax = 0;
  for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
  int sum = 0;
  bad = 0;
  for (int i = 0; i < 32; i++) {
    const int q = (int)lrintf(x[i] * (127.0f / amax));
    bad += (int8_t)b0[2 + i] != q || (int8_t)b1[4 + i] != q;
    sum += q;
  }
  uint16_t h;
  memcpy(&h, b0, 2);
  check("q8_0: d = f16(amax / 127)", h != quant_f32_to_f16(amax / 127.0f), 0);
  check("q8_0/q8_1: q = rne(x * 127 / amax)", bad, 0);
  memcpy(&h, b1 + 2, 2);
  check("q8_1: s = f16(d * sum q)", h != quant_f32_to_f16(amax / 127.0f * (float)sum), 0);
  /* SIMD quantizers: bit-identical to the scalar ones (random, huge, tiny, zero blocks) */
  enum { NQ = 2048 };
  float *xr = malloc(sizeof(float) * NQ);
  uint8_t *qa = malloc(NQ * 2), *qb = malloc(NQ * 2);
  char err[128];
  for (int i = 0; i < NQ; i++) {
    const int bi = i / 256;
    xr[i] = frand() * (bi == 1 ? 1e4f : bi == 2 ? 1e-30f : bi == 3 ? 0.0f : 1.0f);
    if (bi == 4 && i % 64 == 5) xr[i] = 7.0f, xr[i + 1] = -7.0f;
  }
  for (int at = 0; at < 3; at++) {
    for (int isa = 0; isa <= quant_isa_best(); isa += quant_isa_best() ? quant_isa_best() : 1) {
      quant_isa_set(isa, err, sizeof err);
      uint8_t *o = isa ? qb : qa;
      if (at == 0) quant_quantize_row_q8_0(xr, o, NQ);
      else if (at == 1) quant_quantize_row_q8_1(xr, o, NQ);
      else quant_quantize_row_q8_k(xr, o, NQ);
    }
    const size_t nbytes = at == 0 ? NQ / 32 * 34 : at == 1 ? NQ / 32 * 36 : NQ / 256 * 292;
    check(at == 0 ? "q8_0 SIMD == scalar" : at == 1 ? "q8_1 SIMD == scalar" : "q8_K SIMD == scalar",
          quant_isa_best() ? memcmp(qa, qb, nbytes) != 0 : 0, 0);
  }
  quant_isa_set(quant_isa_best(), err, sizeof err);
  free(xr), free(qa), free(qb);
  float z[32] = {0};
  quant_quantize_row_q8_0(z, b0, 32);
  bad = 0;
  for (int i = 0; i < 34; i++) bad += b0[i] != 0;
  check("q8_0: zero block", bad, 0);
}

/* cpu_weight_row_f32's SIMD dequantization (the --exact path) == the scalar reference. */
static void test_fast_dequant(void) {
  const int types[] = {ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q4_0, ANNA_DTYPE_Q5_0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q4_1};
  const int64_t K = 768;
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    uint8_t *w = malloc((size_t)dtype_row_bytes(types[i], K));
    float *a = malloc(sizeof(float) * K), *b = malloc(sizeof(float) * K);
    random_weights(types[i], w, 1, K);
    quant_dequantize_row(types[i], w, a, K);
    ops_weight ow = {types[i], w, 1, K};
    cpu_weight_row_f32(&ow, 0, b);
    char what[64];
    snprintf(what, sizeof what, "%s fast dequantize == reference", dtype_name(types[i]));
    check(what, memcmp(a, b, sizeof(float) * K) != 0, 0);
    free(w), free(a), free(b);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench(int type, int64_t rows, int64_t K, int64_t n, int nthreads) {
  threadpool *tp = NULL;
  ops_backend *be = NULL;
  char err[256];
  if (threadpool_create(&tp, nthreads, err, sizeof err) ||
      cpu_backend_create(&be, tp, cpu_matmul_scratch_floats(K), (size_t)(n + 32) * K * 4, err, sizeof err)) {
    printf("bench setup: %s\n", err);
    return;
  }
  uint8_t *w = malloc((size_t)(dtype_row_bytes(type, K) * rows));
  float *x = malloc(sizeof(float) * n * K), *y = malloc(sizeof(float) * n * rows);
  random_weights(type, w, rows, K);
  for (int64_t i = 0; i < n * K; i++) x[i] = frand();
  ops_weight ow = {type, w, rows, K};
  for (int mode = 0; mode < 2; mode++) {
    cpu_backend_set_exact_matmul(be, mode);
    double best = 1e9;
    for (int it = 0; it < 5; it++) {
      const double t0 = now_s();
      be->matmul(be, y, x, n, &ow, NULL);
      best = fmin(best, now_s() - t0);
    }
    printf("  %-6s %6lldx%-5lld n=%-4lld threads %d %-6s %8.3f ms  %6.1f GMAC/s  %5.1f GB/s of weights\n",
           dtype_name(type), (long long)rows, (long long)K, (long long)n, nthreads, mode ? "exact" : "int8", best * 1e3,
           rows * K * n / best * 1e-9, (double)dtype_row_bytes(type, K) * rows / best * 1e-9);
  }
  free(w), free(x), free(y);
  cpu_backend_free(be);
  threadpool_free(tp);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--bench")) {
    const int th = argc > 2 ? atoi(argv[2]) : 1;
    bench(ANNA_DTYPE_Q5_0, 4864, 896, 512, th);
    bench(ANNA_DTYPE_Q8_0, 128, 896, 512, th);
    bench(ANNA_DTYPE_Q6_K, 896, 4864, 512, th);
    bench(ANNA_DTYPE_Q4_K, 896, 4864, 512, th);
    bench(ANNA_DTYPE_Q4_1, 1536, 576, 512, th);
    /* decode: one token, bandwidth-bound (weights larger than the caches) */
    bench(ANNA_DTYPE_Q8_0, 151936, 896, 1, th);
    bench(ANNA_DTYPE_Q5_0, 4864 * 8, 896, 1, th);
    bench(ANNA_DTYPE_Q6_K, 896 * 8, 4864, 1, th);
    bench(ANNA_DTYPE_Q4_K, 896 * 8, 4864, 1, th);
    return 0;
  }
  threadpool *tp = NULL;
  ops_backend *be = NULL;
  char err[256];
  if (threadpool_create(&tp, 2, err, sizeof err) ||
      cpu_backend_create(&be, tp, cpu_matmul_scratch_floats(1024), (size_t)(128 + 32) * 1024 * 4, err, sizeof err)) {
    printf("setup: %s\n", err);
    return 1;
  }
  printf("activation quantizers (ggml conventions)\n");
  test_act_quant();
  test_fast_dequant();
  printf("quantized matmul (default: 8-bit activations; exact mode)\n");
  const int types[] = {ANNA_DTYPE_Q4_0, ANNA_DTYPE_Q4_1, ANNA_DTYPE_Q5_0, ANNA_DTYPE_Q5_1, ANNA_DTYPE_Q8_0,
                       ANNA_DTYPE_IQ4_NL, ANNA_DTYPE_Q2_K, ANNA_DTYPE_Q3_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q5_K,
                       ANNA_DTYPE_Q6_K, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_IQ2_XXS};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) test_type(be, types[i]);
  cpu_backend_free(be);
  threadpool_free(tp);
  printf("%d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
