/* test_quant: dequantization against vectors from the gguf Python package (data/, made by
 * scripts/gen_quant_testdata.py), every vec_dot ISA path against dequantize + f32 dot,
 * SIMD against scalar, matmul row ranges, and (with --bench) matvec throughput. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "formats/dtype.h"
#include "formats/quant.h"

#ifndef ANNA_QUANT_DATA
#define ANNA_QUANT_DATA "tests/formats/data"
#endif

static int g_fail;
#define CHECK(c)                                                            \
  do {                                                                      \
    if (!(c)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
      g_fail++;                                                             \
    }                                                                       \
  } while (0)

static const int k_types[] = {
    ANNA_DTYPE_F32,    ANNA_DTYPE_F16,    ANNA_DTYPE_BF16,    ANNA_DTYPE_Q4_0,   ANNA_DTYPE_Q4_1,
    ANNA_DTYPE_Q5_0,   ANNA_DTYPE_Q5_1,   ANNA_DTYPE_Q8_0,    ANNA_DTYPE_Q2_K,   ANNA_DTYPE_Q3_K,
    ANNA_DTYPE_Q4_K,   ANNA_DTYPE_Q5_K,   ANNA_DTYPE_Q6_K,    ANNA_DTYPE_IQ4_NL, ANNA_DTYPE_IQ4_XS,
    ANNA_DTYPE_IQ1_S,  ANNA_DTYPE_IQ1_M,  ANNA_DTYPE_IQ2_XS,  ANNA_DTYPE_IQ2_XXS,
    ANNA_DTYPE_IQ2_S,  ANNA_DTYPE_IQ3_XXS, ANNA_DTYPE_IQ3_S,
};
#define N_TYPES (int)(sizeof k_types / sizeof k_types[0])
#define N_ELEM 2048

static void *read_all(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *p = malloc(n > 0 ? (size_t)n : 1);
  if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
    free(p);
    p = NULL;
  }
  fclose(f);
  *size = (size_t)n;
  return p;
}

static uint64_t g_rng = 88172645463325252ull;
static float frand(void) { /* xorshift, uniform in [-1, 1) */
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return (float)((g_rng >> 40) * (1.0 / (1 << 23))) - 1.0f;
}

/* Dequantize vs python, then dot for every ISA. */
static void test_type(const char *dir, int type) {
  char p1[512], p2[512];
  snprintf(p1, sizeof p1, "%s/%s.bin", dir, dtype_name(type));
  snprintf(p2, sizeof p2, "%s/%s.f32", dir, dtype_name(type));
  size_t nraw = 0, nref = 0;
  uint8_t *raw = read_all(p1, &nraw);
  float *ref = read_all(p2, &nref);
  CHECK(raw && ref);
  if (!raw || !ref) {
    fprintf(stderr, "missing %s / %s\n", p1, p2);
    free(raw), free(ref);
    return;
  }
  CHECK((int64_t)nraw == dtype_row_bytes(type, N_ELEM) && nref == N_ELEM * sizeof(float));
  float *deq = malloc(N_ELEM * sizeof(float));
  CHECK(quant_dequantize_row(type, raw, deq, N_ELEM) == 0);
  int bad = 0;
  for (int i = 0; i < N_ELEM; i++) {
    float tol = 1e-6f * fmaxf(1.0f, fabsf(ref[i]));
    if (!(fabsf(deq[i] - ref[i]) <= tol)) {
      if (bad++ < 3)
        fprintf(stderr, "%s[%d]: got %.9g want %.9g\n", dtype_name(type), i, deq[i], ref[i]);
    }
  }
  CHECK(bad == 0);
  CHECK(quant_dequantize_row(type, raw, deq, N_ELEM - 1) == ANNA_EINVAL ||
        dtype_block_size(type) == 1);

  /* Dot: x random; the exact answer uses the dequantized weights and the unquantized x. */
  float *x = malloc(N_ELEM * sizeof(float));
  for (int i = 0; i < N_ELEM; i++) x[i] = frand();
  double exact = 0, mag = 0;
  for (int i = 0; i < N_ELEM; i++) {
    exact += (double)deq[i] * x[i];
    mag += fabs((double)deq[i] * x[i]);
  }
  int64_t ab = quant_act_row_bytes(type, N_ELEM);
  CHECK(ab > 0);
  void *act = malloc((size_t)ab);
  CHECK(quant_quantize_act(type, x, act, N_ELEM) == 0);
  float d_scalar = quant_vec_dot_isa(QUANT_ISA_SCALAR, type, N_ELEM, raw, act);
  /* 8-bit activations: error relative to sum |w x| is about 1/127/sqrt-ish; 1e-2 bound. */
  double rel = fabs(d_scalar - exact) / mag;
  bool is_float = dtype_block_size(type) == 1;
  CHECK(rel < (is_float ? 1e-5 : 1e-2));
  printf("  %-8s dequant ok, dot rel.err %.2e", dtype_name(type), rel);
  for (int isa = QUANT_ISA_AVX2; isa <= quant_isa_best(); isa++) {
    float d = quant_vec_dot_isa(isa, type, N_ELEM, raw, act);
    double r = fabs((double)d - d_scalar) / mag;
    printf(", %s vs scalar %.1e", quant_isa_name(isa), r);
    CHECK(r < 1e-5);
  }
  printf("\n");

  /* Short rows exercise the tails: an odd number of 32-blocks (AVX-512 pairs blocks), a
   * few super-blocks, and plain types not a multiple of the SIMD width. */
  int64_t bs = dtype_block_size(type);
  int64_t n2 = bs == 32 ? 160 : bs == 256 ? 768 : 100;
  void *act2 = malloc((size_t)quant_act_row_bytes(type, n2));
  CHECK(quant_quantize_act(type, x, act2, n2) == 0);
  double ex2 = 0, mag2 = 0;
  for (int i = 0; i < n2; i++) {
    ex2 += (double)deq[i] * x[i];
    mag2 += fabs((double)deq[i] * x[i]);
  }
  float s2 = quant_vec_dot_isa(QUANT_ISA_SCALAR, type, n2, raw, act2);
  CHECK(fabs(s2 - ex2) / mag2 < (is_float ? 1e-5 : 2e-2));
  for (int isa = QUANT_ISA_AVX2; isa <= quant_isa_best(); isa++)
    CHECK(fabs((double)quant_vec_dot_isa(isa, type, n2, raw, act2) - s2) / mag2 < 1e-5);
  free(act2);
  free(act), free(x), free(deq), free(raw), free(ref);
}

/* Random weights quantized by hand-made bytes would need per-format encoders; instead reuse
 * the test vectors' blocks tiled into a matrix and check matmul against vec_dot per row. */
static void test_matmul(const char *dir, int type) {
  char p1[512];
  snprintf(p1, sizeof p1, "%s/%s.bin", dir, dtype_name(type));
  size_t nraw = 0;
  uint8_t *raw = read_all(p1, &nraw);
  if (!raw) return;
  const int64_t cols = 512, rows = 12, n_tok = 3;
  int64_t rb = dtype_row_bytes(type, cols);
  uint8_t *W = malloc((size_t)(rb * rows));
  for (int64_t r = 0; r < rows; r++) /* row r starts at a different offset of the vectors */
    memcpy(W + r * rb, raw + (r % 4) * rb, (size_t)rb);
  float *x = malloc(sizeof(float) * cols * n_tok), *y = malloc(sizeof(float) * rows * n_tok);
  float *y2 = malloc(sizeof(float) * rows * n_tok);
  for (int64_t i = 0; i < cols * n_tok; i++) x[i] = frand();
  char err[256];
  CHECK(quant_matmul(type, W, rows, cols, x, n_tok, y, NULL, err, sizeof err) == 0);
  int64_t ab = quant_act_row_bytes(type, cols);
  uint8_t *act = malloc((size_t)(ab * n_tok));
  for (int64_t t = 0; t < n_tok; t++) quant_quantize_act(type, x + t * cols, act + t * ab, cols);
  /* Split rows in two ranges as a thread pool would. */
  quant_matmul_rows(type, W, cols, 0, 5, act, n_tok, y2, rows);
  quant_matmul_rows(type, W, cols, 5, rows, act, n_tok, y2, rows);
  for (int64_t t = 0; t < n_tok; t++)
    for (int64_t r = 0; r < rows; r++) {
      float want = quant_vec_dot(type, cols, W + r * rb, act + t * ab);
      CHECK(y[t * rows + r] == want && y2[t * rows + r] == want);
    }
  if (dtype_block_size(type) > 1) /* partial block: rejected before touching x or W */
    CHECK(quant_matmul(type, W, rows, cols + 1, x, n_tok, y, NULL, err, sizeof err) ==
          ANNA_EINVAL);
  free(act), free(y2), free(y), free(x), free(W), free(raw);
}

/* Extreme scales: weight blocks whose f16 scales are 0, +-65504, a subnormal, or ordinary,
 * against activation blocks that are all zero, one spike of 1e4 among tiny values, tiny
 * (1e-2) or ordinary. Every ISA's dot must be finite, agree with the scalar dot, and the
 * scalar dot must be within the 8-bit activation rounding of the exact dot: each activation
 * moves by at most half its block's step (amax / 127, plus the f16 rounding of the step). */
static void test_extreme(const char *dir, int type) {
  if (dtype_block_size(type) == 1) return;
  char p1[512];
  snprintf(p1, sizeof p1, "%s/%s.bin", dir, dtype_name(type));
  size_t nraw = 0;
  uint8_t *raw = read_all(p1, &nraw);
  CHECK(raw != NULL);
  if (!raw) return;
  static const uint16_t scales[] = {0x0000, 0x7bff, 0xfbff, 0x0003, 0x3c00, 0xb800, 0x2e66};
  const int64_t bb = dtype_block_bytes(type), nb = N_ELEM / dtype_block_size(type);
  int off[2];
  const int nsc = dtype_f16_fields(type, off);
  float *deq = malloc(N_ELEM * sizeof(float)), *x = malloc(N_ELEM * sizeof(float));
  void *act = malloc((size_t)quant_act_row_bytes(type, N_ELEM));
  const int ab = quant_act_type(type) == ANNA_DTYPE_Q8_0 ? 32 : 256;
  for (int variant = 0; variant < 4; variant++) {
    for (int64_t b = 0; b < nb; b++)
      for (int f = 0; f < nsc; f++) {
        uint16_t h = scales[(b * 3 + f + variant) % (int64_t)(sizeof scales / sizeof scales[0])];
        memcpy(raw + b * bb + off[f], &h, 2);
      }
    CHECK(quant_dequantize_row(type, raw, deq, N_ELEM) == 0);
    for (int64_t i0 = 0; i0 < N_ELEM; i0 += ab) {
      const int kind = (int)((i0 / ab + variant) % 4);
      for (int64_t i = i0; i < i0 + ab; i++) {
        float v = frand();
        x[i] = kind == 0 ? 0.0f : kind == 1 ? (i == i0 + 5 ? 1e4f : 1e-3f * v) : kind == 2 ? 1e-2f * v : v;
      }
    }
    CHECK(quant_quantize_act(type, x, act, N_ELEM) == 0);
    /* Checked per activation block, so a huge block cannot hide the error of a tiny one. */
    const int64_t wb = dtype_row_bytes(type, ab), xb = quant_act_row_bytes(type, ab);
    for (int64_t i0 = 0; i0 < N_ELEM; i0 += ab) {
      double amax = 0, exact = 0, mag = 0, bound = 0;
      for (int64_t i = i0; i < i0 + ab; i++) amax = fmax(amax, fabs(x[i]));
      for (int64_t i = i0; i < i0 + ab; i++) {
        exact += (double)deq[i] * x[i];
        mag += fabs((double)deq[i] * x[i]);
        bound += fabs((double)deq[i]) * amax / 127.0 * 0.6;
      }
      const uint8_t *w = raw + i0 / ab * wb, *a = (const uint8_t *)act + i0 / ab * xb;
      const float ds = quant_vec_dot_isa(QUANT_ISA_SCALAR, type, ab, w, a);
      const double tol = bound + 1e-6 * mag + 1e-30;
      if (!isfinite(ds) || !(fabs(ds - exact) <= tol))
        fprintf(stderr, "%s extreme %d @%lld: scalar %.9g exact %.9g bound %.3g\n", dtype_name(type), variant,
                (long long)i0, ds, exact, bound);
      CHECK(isfinite(ds) && fabs(ds - exact) <= tol);
      for (int isa = QUANT_ISA_AVX2; isa <= quant_isa_best(); isa++) {
        const float d = quant_vec_dot_isa(isa, type, ab, w, a);
        if (!(fabs((double)d - ds) <= 1e-6 * mag + 1e-30))
          fprintf(stderr, "%s extreme %d @%lld: %s %.9g scalar %.9g\n", dtype_name(type), variant, (long long)i0,
                  quant_isa_name(isa), d, ds);
        CHECK(fabs((double)d - ds) <= 1e-6 * mag + 1e-30);
      }
    }
  }
  printf("  %-8s extreme scales ok\n", dtype_name(type));
  free(act), free(x), free(deq), free(raw);
}

static void test_f16(void) {
  float vals[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f,
                  1e-9f, 70000.0f, 0.333333f};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    uint16_t h = quant_f32_to_f16(vals[i]);
    float back = quant_f16_to_f32(h);
    if (fabsf(vals[i]) > 65520.0f) CHECK(isinf(back));
    else CHECK(fabsf(back - vals[i]) <= fabsf(vals[i]) * 1e-3f + 3e-8f);
  }
  CHECK(quant_f32_to_f16(1.0f) == 0x3c00 && quant_f16_to_f32(0x0001) == 5.9604645e-08f);
  /* every half round-trips */
  int bad = 0;
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN payloads */
    if (quant_f32_to_f16(quant_f16_to_f32((uint16_t)h)) != h) bad++;
  }
  CHECK(bad == 0);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 4096x4096 matvec, single thread, per ISA. Weights: random bytes with small f16 scales
 * patched in (values do not matter for speed, but must not be NaN). */
static void bench(int type) {
  const int64_t rows = 4096, cols = 4096;
  int64_t rb = dtype_row_bytes(type, cols);
  if (rb <= 0) return;
  size_t bytes = (size_t)(rb * rows);
  uint8_t *W = malloc(bytes);
  for (size_t i = 0; i < bytes; i++) W[i] = (uint8_t)(frand() * 127);
  int64_t bb = dtype_block_bytes(type);
  int off = type == ANNA_DTYPE_Q6_K ? 208 : type == ANNA_DTYPE_Q3_K ? 108 : type == ANNA_DTYPE_Q2_K ? 80 : 0;
  for (size_t b = 0; b + (size_t)bb <= bytes; b += (size_t)bb) {
    W[b + (size_t)off] = 0x00;
    W[b + (size_t)off + 1] = 0x20;
  }
  float *x = malloc(sizeof(float) * cols), *y = malloc(sizeof(float) * rows);
  for (int64_t i = 0; i < cols; i++) x[i] = frand();
  void *scratch = malloc((size_t)quant_act_row_bytes(type, cols));
  char err[128];
  /* "hot": one matrix, resident in the 32 MB L3 after the first pass; "mem": a rotation of
   * copies totalling > 128 MB, so weights stream from DRAM as in real decoding. */
  int ncopy = (int)(128e6 / (double)bytes) + 1;
  uint8_t **Ws = malloc(sizeof(uint8_t *) * (size_t)ncopy);
  for (int c = 0; c < ncopy; c++) {
    Ws[c] = malloc(bytes);
    memcpy(Ws[c], W, bytes);
  }
  printf("  matvec %s 4096x4096 (%.1f MB):\n", dtype_name(type), bytes / 1e6);
  for (int isa = 0; isa <= quant_isa_best(); isa++) {
    quant_isa_set(isa, err, sizeof err);
    quant_matvec(type, W, rows, cols, x, y, scratch, err, sizeof err); /* warm */
    /* Minimum over runs: the machine is shared, and the minimum is the least disturbed. */
    int iters = isa == 0 ? 3 : 40;
    double dt = 1e9, dm = 1e9;
    for (int k = 0; k < iters; k++) {
      double t0 = now_s();
      quant_matvec(type, W, rows, cols, x, y, scratch, err, sizeof err);
      double t1 = now_s();
      quant_matvec(type, Ws[k % ncopy], rows, cols, x, y, scratch, err, sizeof err);
      double t2 = now_s();
      dt = fmin(dt, t1 - t0);
      dm = fmin(dm, t2 - t1);
    }
    printf("    %-7s hot %6.2f ms %5.1f GB/s   mem %6.2f ms %5.1f GB/s\n", quant_isa_name(isa),
           dt * 1e3, bytes / dt / 1e9, dm * 1e3, bytes / dm / 1e9);
  }
  for (int c = 0; c < ncopy; c++) free(Ws[c]);
  free(Ws);
  quant_isa_set(quant_isa_best(), err, sizeof err);
  free(scratch), free(y), free(x), free(W);
}

int main(int argc, char **argv) {
  const char *dir = ANNA_QUANT_DATA;
  bool do_bench = false;
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--bench")) do_bench = true;
  printf("best ISA: %s\n", quant_isa_name(quant_isa_best()));
  test_f16();
  for (int k = 0; k < N_TYPES; k++) test_type(dir, k_types[k]);
  for (int k = 0; k < N_TYPES; k++) test_matmul(dir, k_types[k]);
  for (int k = 0; k < N_TYPES; k++) test_extreme(dir, k_types[k]);
  CHECK(quant_act_type(ANNA_DTYPE_Q4_K) == ANNA_DTYPE_Q8_K);
  CHECK(quant_act_type(ANNA_DTYPE_IQ4_NL) == ANNA_DTYPE_Q8_0);
  CHECK(quant_act_type(ANNA_DTYPE_F16) == ANNA_DTYPE_F32);
  CHECK(quant_act_type(ANNA_DTYPE_I32) == -1 && quant_act_type(99) == -1);
  CHECK(quant_dequantize_row(ANNA_DTYPE_TQ1_0, NULL, NULL, 256) == ANNA_EUNSUPPORTED);
  if (do_bench) {
    bench(ANNA_DTYPE_Q4_K);
    bench(ANNA_DTYPE_Q8_0);
    bench(ANNA_DTYPE_Q6_K);
    bench(ANNA_DTYPE_Q4_0);
    bench(ANNA_DTYPE_Q5_0);
    bench(ANNA_DTYPE_Q4_1);
    bench(ANNA_DTYPE_Q5_K);
    bench(ANNA_DTYPE_Q3_K);
    bench(ANNA_DTYPE_Q2_K);
    bench(ANNA_DTYPE_IQ4_XS);
    bench(ANNA_DTYPE_IQ2_XXS);
  }
  if (g_fail) {
    fprintf(stderr, "test_quant: %d failures\n", g_fail);
    return 1;
  }
  printf("test_quant: ok\n");
  return 0;
}
