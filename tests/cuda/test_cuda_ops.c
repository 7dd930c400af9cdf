/* test_cuda_ops.c: every op of the CUDA backend against the CPU backend on fresh random
 * inputs (several shapes, odd sizes, long sequences), and the quantized matmuls against a
 * dequantize-then-dot reference. Outputs start as NaN on the device so an element the
 * kernel never writes fails the check. Exits 77 ("skipped") without a CUDA device.
 * Usage: test_cuda_ops [FIXTURES_DIR] [--tests=NAME,...] [--bench | --bench=NAME] (NAME alone, no
 * tests); test names are those of the test_* functions without the prefix. */
#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "base/threadpool.h"
#include "formats/dtype.h"
#include "formats/quant.h"
#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_fail, g_checks;
static double now_s(void);
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static ops_backend *g_cpu, *g_gpu;

static uint64_t rnd(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return g_rng;
}

static float frand(void) {
  return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float *hrand(int64_t n, float scale) {
  float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) x[i] = frand() * scale;
  return x;
}

/* Device copy of host floats / bytes. */
static void *dput(const void *h, size_t bytes) {
  void *d = g_gpu->alloc(g_gpu, bytes);
  if (d && bytes) g_gpu->upload(g_gpu, d, h, bytes);
  return d;
}

/* Device buffer of n floats, all NaN (to catch unwritten outputs). */
static float *dnan(int64_t n) {
  float *h = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) h[i] = NAN;
  float *d = dput(h, sizeof(float) * (size_t)n);
  free(h);
  return d;
}

static float *dget(const float *d, int64_t n) {
  float *h = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  g_gpu->download(g_gpu, h, d, sizeof(float) * (size_t)n);
  return h;
}

static void gpu_status(const char *what) {
  char err[256];
  if (cuda_backend_error(g_gpu, err, sizeof err)) {
    printf("  FAIL %s: cuda error: %s\n", what, err);
    g_fail++;
    exit(1); /* the sticky error would fail everything after */
  }
}

/* Max |gpu - ref| over max |ref|; NaN anywhere fails. */
static void cmp(const char *what, const float *g, const float *ref, int64_t n, double tol) {
  gpu_status(what);
  double m = 0, scale = 1e-6;
  int nan = 0;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
  for (int64_t i = 0; i < n; i++) {
    if (isnan(g[i]) || isinf(g[i])) nan = 1;
    m = fmax(m, fabs((double)g[i] - ref[i]) / scale);
  }
  g_checks++;
  if (nan || !(m <= tol)) {
    printf("  FAIL %-58s rel err %.3g (tol %.1g)%s\n", what, m, tol, nan ? " NaN/unwritten" : "");
    g_fail++;
  }
}

/* Compares device result d with host ref and frees d's host copy. */
static void cmpd(const char *what, const float *d, const float *ref, int64_t n, double tol) {
  float *g = dget(d, n);
  cmp(what, g, ref, n, tol);
  free(g);
}

static void dfree(void *d) {
  g_gpu->free(g_gpu, d);
}

static float *hcopy(const float *x, int64_t n) {
  float *y = malloc(sizeof(float) * (size_t)n);
  memcpy(y, x, sizeof(float) * (size_t)n);
  return y;
}

/* ---- weights ---- */

/* Offsets of the f16 scale fields per block, set to sane values after random fill. */
static void fix_scales(int type, uint8_t *blk) {
  const int off[][3] = {
      {ANNA_DTYPE_Q4_0, 0, -1}, {ANNA_DTYPE_Q4_1, 0, 2},  {ANNA_DTYPE_Q5_0, 0, -1}, {ANNA_DTYPE_Q5_1, 0, 2},
      {ANNA_DTYPE_Q8_0, 0, -1}, {ANNA_DTYPE_IQ4_NL, 0, -1}, {ANNA_DTYPE_Q2_K, 80, 82}, {ANNA_DTYPE_Q3_K, 108, -1},
      {ANNA_DTYPE_Q4_K, 0, 2},  {ANNA_DTYPE_Q5_K, 0, 2},  {ANNA_DTYPE_Q6_K, 208, -1}, {ANNA_DTYPE_IQ4_XS, 0, -1},
  };
  for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
    if (off[i][0] != type) continue;
    for (int j = 1; j < 3; j++) {
      if (off[i][j] < 0) continue;
      uint16_t h = quant_f32_to_f16(0.002f + 0.01f * (frand() + 1.0f));
      memcpy(blk + off[i][j], &h, 2);
    }
  }
}

/* Random weight of type; *ref gets its f32 values [rows, cols]. */
static void *make_weight(int type, int64_t rows, int64_t cols, float **ref) {
  const int64_t rb = dtype_row_bytes(type, cols);
  uint8_t *w = malloc((size_t)(rb * rows));
  float *f = malloc(sizeof(float) * (size_t)(rows * cols));
  if (type == ANNA_DTYPE_F32 || type == ANNA_DTYPE_F16 || type == ANNA_DTYPE_BF16) {
    for (int64_t i = 0; i < rows * cols; i++) {
      float v = frand() * 0.5f;
      if (type == ANNA_DTYPE_F32) {
        memcpy(w + 4 * i, &v, 4);
      } else {
        uint16_t h;
        if (type == ANNA_DTYPE_F16) h = quant_f32_to_f16(v);
        else {
          uint32_t u;
          memcpy(&u, &v, 4);
          h = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
        }
        memcpy(w + 2 * i, &h, 2);
      }
    }
  } else {
    for (int64_t i = 0; i < rb * rows; i++) w[i] = (uint8_t)rnd();
    const int64_t bb = dtype_block_bytes(type), nb = rb * rows / bb;
    for (int64_t b = 0; b < nb; b++) fix_scales(type, w + b * bb);
  }
  for (int64_t r = 0; r < rows; r++) quant_dequantize_row(type, w + r * rb, f + r * cols, cols);
  *ref = f;
  return w;
}

/* ---- tests ---- */

/* Float weight types: exact on the tensor-core path too (bf16 used in place with split
 * activations; f16/f32 stay on SGEMM). */
static int cuda_float_type_host(int t) {
  return t == ANNA_DTYPE_F32 || t == ANNA_DTYPE_F16 || t == ANNA_DTYPE_BF16;
}

/* Types the int8 prefill GEMM (CUDA_GEMM_INT8) takes. */
static int gemm_int8_type(int t) {
  return t == ANNA_DTYPE_Q4_0 || t == ANNA_DTYPE_IQ4_NL || t == ANNA_DTYPE_IQ4_XS || t == ANNA_DTYPE_Q8_0 ||
         t == ANNA_DTYPE_Q4_K || t == ANNA_DTYPE_Q5_K || t == ANNA_DTYPE_Q6_K;
}

/* ref[t, r] = the f64 dot of x_t and row r of wf (+ bias), and bnd[t, r] its accuracy bound
 * (see test_matvec_int8 and gemm_variant_check): with urel == 0 the int8-activation one,
 * sum_c |w_c| max|x_blk(c)| / 254 (32-element blocks; a plain type's last block may be
 * shorter), else sum_c |w_c x_c| * urel; both with 1% slack, 1e-5 * sum |w x| for the f32
 * accumulation and 1e-6 |y|. Returns both, malloc'd (the caller frees them). */
static void int8_ref_bound(const float *x, const float *wf, const float *bias, int64_t n, int64_t rows, int64_t cols,
                           double urel, float **ref_out, double **bnd_out) {
  float *ref = malloc(sizeof(float) * (size_t)(n * rows));
  double *bnd = malloc(sizeof(double) * (size_t)(n * rows));
  for (int64_t t = 0; t < n; t++)
    for (int64_t r = 0; r < rows; r++) {
      double acc = bias ? bias[r] : 0, b = 0, mag = 0;
      for (int64_t c0 = 0; c0 < cols; c0 += 32) {
        const int64_t c1 = c0 + 32 < cols ? c0 + 32 : cols;
        double am = 0;
        for (int64_t c = c0; c < c1; c++) am = fmax(am, fabs(x[t * cols + c]));
        for (int64_t c = c0; c < c1; c++) {
          const double wv = wf[r * cols + c], xv = x[t * cols + c];
          acc += wv * xv, mag += fabs(wv * xv), b += fabs(wv) * am / 254.0;
        }
      }
      ref[t * rows + r] = (float)acc;
      if (urel > 0) b = mag * urel;
      bnd[t * rows + r] = 1.01 * b + 1e-5 * mag + 1e-6 * fabs(acc);
    }
  *ref_out = ref, *bnd_out = bnd;
}

/* One check: every device output g[i] within bnd[i] of ref[i] (NaN or inf fails). Returns the
 * largest error / bound of the outputs inside it. */
static double bound_check(const char *what, const float *g, const float *ref, const double *bnd, int64_t count,
                          const char *kind) {
  int64_t bad = 0;
  double q = 0;
  for (int64_t i = 0; i < count; i++) {
    const double e = fabs((double)g[i] - ref[i]);
    if (isnan(g[i]) || isinf(g[i]) || !(e <= bnd[i])) bad++;
    else q = fmax(q, e / bnd[i]);
  }
  g_checks++;
  if (bad) {
    printf("  FAIL %-58s %lld of %lld outside the %s bound\n", what, (long long)bad, (long long)count, kind);
    g_fail++;
  }
  return q;
}

/* Prefill GEMM with int8 activations (CUDA_GEMM_INT8, exact off) against the f64 dot of the
 * f32 inputs, with test_matvec_int8's bound: each 32-element activation block rounds to
 * q * s, s = max|x| / 127 (error <= s / 2 per element), so output r may differ by
 * sum_i |w_ri| * s_blk(i) / 2 (1% slack for the f32 rounding of s and the products) plus
 * 1e-5 * sum_i |w_ri x_i| for the f32 accumulation. Fresh NaN outputs: an unwritten one
 * fails. Leaves the variant at CUDA_GEMM_BF16 and exact mode on. Returns the largest error /
 * bound. variant CUDA_GEMM_BF16_SINGLE instead: activations rounded once to bf16 (relative
 * error <= 2^-8 each), a quantized weight's dequantized values too, so output r may differ by
 * sum_i |w_ri x_i| * (2^-8 + 2^-8 + 2^-16) (1% slack) plus the same accumulation term. */
static double gemm_variant_check(const char *what, int variant, const ops_weight *ow, const float *x,
                                 const float *dx, const float *wf, const float *bias, int64_t n) {
  const double ux = 1.0 / 256, uw = cuda_float_type_host(ow->type) ? 0.0 : 1.0 / 256; /* bf16 weights: exact */
  const int64_t rows = ow->rows;
  float *ref;
  double *bnd;
  int8_ref_bound(x, wf, bias, n, rows, ow->cols, variant == CUDA_GEMM_BF16_SINGLE ? ux + uw + ux * uw : 0.0, &ref,
                 &bnd);
  float *nan = calloc((size_t)(n * rows), sizeof(float)); /* dnan, inlined here, warned maybe-uninitialized */
  for (int64_t i = 0; i < n * rows; i++) nan[i] = NAN;
  float *dy = dput(nan, sizeof(float) * (size_t)(n * rows));
  free(nan);
  cuda_backend_set_exact(g_gpu, 0);
  cuda_backend_set_gemm_variant(g_gpu, variant);
  g_gpu->matmul(g_gpu, dy, dx, n, ow, bias);
  cuda_backend_set_gemm_variant(g_gpu, CUDA_GEMM_BF16);
  cuda_backend_set_exact(g_gpu, 1);
  float *g = dget(dy, n * rows);
  gpu_status(what);
  const double q = bound_check(what, g, ref, bnd, n * rows, variant == CUDA_GEMM_INT8 ? "int8" : "bf16");
  free(g), free(ref), free(bnd);
  dfree(dy);
  return q;
}

static void test_matmul(void) {
  printf("matmul\n");
  /* f32 activations in the decode matvecs (the int8 path has its own test and bound) */
  cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_F32);
  const int types[] = {ANNA_DTYPE_F32,  ANNA_DTYPE_F16,  ANNA_DTYPE_BF16, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q4_0,
                       ANNA_DTYPE_Q4_1, ANNA_DTYPE_Q5_0, ANNA_DTYPE_Q5_1, ANNA_DTYPE_IQ4_NL, ANNA_DTYPE_Q2_K,
                       ANNA_DTYPE_Q3_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q5_K, ANNA_DTYPE_Q6_K, ANNA_DTYPE_IQ4_XS};
  /* the last two have more rows than the decode kernels keep resident, so their warps
   * walk several row groups */
  const int shapes[][3] = {{1, 17, 1},  {1, 300, 4},  {2, 129, 2},    {5, 64, 3},
                           {8, 33, 1},  {9, 100, 2},  {67, 129, 3},   {1, 20001, 2}, {3, 9001, 1},
                           {40, 1000, 4}};
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    const int type = types[ti];
    const int64_t bs = dtype_block_size(type);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      cuda_backend_drop_mirrors(g_gpu);
      const int64_t n = shapes[s][0], rows = shapes[s][1];
      /* plain types get odd widths; block types whole blocks (256-blocks: 1..4 of them) */
      const int64_t cols = bs == 1 ? (s % 2 ? 8 * 33 : 257) : bs == 32 ? 32 * (3 + 5 * shapes[s][2]) : 256 * shapes[s][2];
      float *wf;
      void *w = make_weight(type, rows, cols, &wf);
      float *x = hrand(n * cols, 1.0f), *bias = s % 2 ? hrand(rows, 1.0f) : NULL;
      float *ref = malloc(sizeof(float) * (size_t)(n * rows));
      for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
          double acc = bias ? bias[r] : 0;
          for (int64_t c = 0; c < cols; c++) acc += (double)x[t * cols + c] * wf[r * cols + c];
          ref[t * rows + r] = (float)acc;
        }
      ops_weight ow = {type, w, rows, cols};
      float *dx = dput(x, sizeof(float) * (size_t)(n * cols)), *dy = dnan(n * rows);
      cuda_backend_set_exact(g_gpu, 1);
      g_gpu->matmul(g_gpu, dy, dx, n, &ow, bias);
      char what[128];
      snprintf(what, sizeof what, "%s n=%lld %lldx%lld%s", dtype_name(type), (long long)n, (long long)rows,
               (long long)cols, bias ? " +bias" : "");
      cmpd(what, dy, ref, n * rows, 1e-4);
      if (n > 8) {
        cuda_backend_set_exact(g_gpu, 0);
        /* Tensor-core GEMM (bf16 and quantized weights; f32/f16 stay exact): by default
         * bf16 weights times activations split into bf16 hi + lo (16 bits), quantized ones
         * dequantized to bf16 (2^-9 relative) times activations rounded once to bf16 (gemm
         * split below: split for those too), f32 accumulation: ~1e-3 of the largest output
         * on random data, while a layout or indexing error gives O(1). The single rounding's
         * own bound is gemm_variant_check's bf16x1. */
        for (int split = 0; split < 1 + !cuda_float_type_host(type); split++) {
          float *dz = dnan(n * rows);
          cuda_backend_set_gemm_variant(g_gpu, split ? CUDA_GEMM_BF16_SPLIT : CUDA_GEMM_BF16);
          g_gpu->matmul(g_gpu, dz, dx, n, &ow, bias);
          cuda_backend_set_gemm_variant(g_gpu, CUDA_GEMM_BF16);
          const char *tag = split ? " tensor cores split" : " tensor cores";
          strncat(what, tag, sizeof what - strlen(what) - 1);
          cmpd(what, dz, ref, n * rows, cuda_float_type_host(type) ? 1e-4 : 1e-2);
          dfree(dz);
          what[strlen(what) - strlen(tag)] = 0;
        }
        if (!cuda_float_type_host(type) && rows > 128) {
          /* the weight dequantized 128 rows at a time: several tiles, the last partial */
          float *dz = dnan(n * rows);
          cuda_backend_set_gemm_tile(g_gpu, (size_t)128 * (size_t)cols * 2);
          g_gpu->matmul(g_gpu, dz, dx, n, &ow, bias);
          cuda_backend_set_gemm_tile(g_gpu, 0);
          strncat(what, " tensor cores, 128-row tiles", sizeof what - strlen(what) - 1);
          cmpd(what, dz, ref, n * rows, 1e-2);
          dfree(dz);
          what[strlen(what) - strlen(" tensor cores, 128-row tiles")] = 0;
        }
        cuda_backend_set_exact(g_gpu, 1);
        if (gemm_int8_type(type)) {
          strncat(what, " int8", sizeof what - strlen(what) - 1);
          gemm_variant_check(what, CUDA_GEMM_INT8, &ow, x, dx, wf, bias, n);
          what[strlen(what) - strlen(" int8")] = 0;
        }
        if (!cuda_float_type_host(type) || type == ANNA_DTYPE_BF16) {
          strncat(what, " bf16x1", sizeof what - strlen(what) - 1);
          gemm_variant_check(what, CUDA_GEMM_BF16_SINGLE, &ow, x, dx, wf, bias, n);
          what[strlen(what) - strlen(" bf16x1")] = 0;
        }
      }
      if (s == 2) {
        /* activations off 16-byte alignment: the matvec falls back to its unit kernel */
        float *x1 = malloc(sizeof(float) * (size_t)(n * cols + 1));
        x1[0] = 0.0f;
        memcpy(x1 + 1, x, sizeof(float) * (size_t)(n * cols));
        float *dx1 = dput(x1, sizeof(float) * (size_t)(n * cols + 1));
        float *dy1 = dnan(n * rows);
        g_gpu->matmul(g_gpu, dy1, dx1 + 1, n, &ow, bias);
        strncat(what, " x unaligned", sizeof what - strlen(what) - 1);
        cmpd(what, dy1, ref, n * rows, 1e-4);
        dfree(dx1), dfree(dy1), free(x1);
      }
      dfree(dx), dfree(dy);
      free(w), free(wf), free(x), free(bias), free(ref);
    }
  }
  cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
  /* The int8 GEMM's tile edges (128 rows x 128 tokens, K steps of 256): tokens 9..1000 (one
   * and several token tiles, ragged), rows 17..1000 (odd, ragged), 1..4 super-blocks and 23
   * blocks (a partial K step for the 32-element formats), a zero activation block (scale 0),
   * a bias. {n, rows, super-blocks (32-element formats: 3 + 5 k blocks)}. */
  const int i8shapes[][3] = {{9, 17, 1}, {130, 257, 2}, {67, 1000, 4}, {1000, 301, 3}, {129, 128, 1}};
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    const int type = types[ti];
    if (!gemm_int8_type(type)) continue;
    const int64_t bs = dtype_block_size(type);
    double worst = 0;
    for (size_t s = 0; s < sizeof i8shapes / sizeof i8shapes[0]; s++) {
      cuda_backend_drop_mirrors(g_gpu);
      const int64_t n = i8shapes[s][0], rows = i8shapes[s][1];
      const int64_t cols = bs == 32 ? 32 * (3 + 5 * i8shapes[s][2]) : 256 * i8shapes[s][2];
      float *wf;
      void *w = make_weight(type, rows, cols, &wf);
      float *x = hrand(n * cols, 1.0f), *bias = s % 2 ? hrand(rows, 1.0f) : NULL;
      if (s == 1)
        for (int j = 32; j < 64; j++) x[cols + j] = 0.0f; /* token 1, block 1 */
      ops_weight ow = {type, w, rows, cols};
      float *dx = dput(x, sizeof(float) * (size_t)(n * cols));
      char what[128];
      snprintf(what, sizeof what, "%s n=%lld %lldx%lld%s int8 gemm", dtype_name(type), (long long)n, (long long)rows,
               (long long)cols, bias ? " +bias" : "");
      worst = fmax(worst, gemm_variant_check(what, CUDA_GEMM_INT8, &ow, x, dx, wf, bias, n));
      dfree(dx);
      free(w), free(wf), free(x), free(bias);
    }
    printf("  %-6s int8 gemm: largest error / bound %.3f\n", dtype_name(type), worst);
  }
}

/* Decode matvecs with int8 activations (exact off): each 32-element activation block is
 * rounded to q * s with s = max|x| / 127, an error of at most s / 2 per element, so output
 * r may differ from the f64 dot of the f32 inputs by sum_i |w_ri| * s_blk(i) / 2 (bound
 * below, with 1% for the f32 rounding of s and of the kernel's products and sums) plus
 * 1e-5 * sum_i |w_ri x_i| for the f32 accumulation; checked for both int8 variants
 * (2 and 4 rows per warp). Exact mode on must keep f32
 * activations: then the 1e-4 bound of test_matmul holds. Shapes: n = 1..8 (token groups
 * 8/4/2/1), odd row counts, rows past the resident warps, a zero activation block (scale
 * 0), a bias, 8 tokens of 8192 columns (90 KB of int8 activations: past the default 48 KB
 * of shared memory, so the opt-in limit set at backend creation is used) and 8 tokens of
 * 24576 columns (270 KB: past any limit, the f32 kernel takes them). */
static void test_matvec_int8(void) {
  printf("matvec int8 activations\n");
  const int types[] = {ANNA_DTYPE_Q4_0, ANNA_DTYPE_IQ4_NL, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_Q8_0,
                       ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q5_K,   ANNA_DTYPE_Q6_K};
  const int shapes[][3] = {{1, 17, 1}, {2, 300, 4}, {3, 129, 2}, {4, 64, 3}, {5, 33, 1},
                           {7, 100, 2}, {8, 129, 3}, {1, 20001, 2}, {3, 9001, 1}, {8, 40, 32}, {8, 24, 96}};
  cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    const int type = types[ti];
    const int64_t bs = dtype_block_size(type);
    double worst = 0; /* largest error / bound, printed for the record */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      cuda_backend_drop_mirrors(g_gpu);
      const int64_t n = shapes[s][0], rows = shapes[s][1];
      const int64_t cols = shapes[s][2] >= 32 ? 256 * shapes[s][2] : bs == 32 ? 32 * (3 + 5 * shapes[s][2]) : 256 * shapes[s][2];
      float *wf;
      void *w = make_weight(type, rows, cols, &wf);
      float *x = hrand(n * cols, 1.0f), *bias = s % 3 == 1 ? hrand(rows, 1.0f) : NULL;
      if (s == 2)
        for (int j = 32; j < 64; j++) x[j] = 0.0f; /* token 0, block 1 */
      float *ref;
      double *bnd;
      int8_ref_bound(x, wf, bias, n, rows, cols, 0.0, &ref, &bnd);
      ops_weight ow = {type, w, rows, cols};
      float *dx = dput(x, sizeof(float) * (size_t)(n * cols));
      char what[128];
      for (int pass = 0; pass < 3; pass++) { /* int8, int8 with 4 rows per warp, exact */
        const int exact = pass == 2;
        float *dy = dnan(n * rows); /* fresh NaNs: a row no pass writes fails */
        cuda_backend_set_exact(g_gpu, exact);
        cuda_backend_set_matvec_variant(g_gpu, pass == 1 ? CUDA_MV_INT8_R4 : CUDA_MV_DEFAULT);
        g_gpu->matmul(g_gpu, dy, dx, n, &ow, bias);
        snprintf(what, sizeof what, "%s n=%lld %lldx%lld%s%s", dtype_name(type), (long long)n, (long long)rows,
                 (long long)cols, bias ? " +bias" : "", exact ? " exact" : pass ? " int8 r4" : " int8");
        if (exact) {
          cmpd(what, dy, ref, n * rows, 1e-4);
          dfree(dy);
          continue;
        }
        float *g = dget(dy, n * rows);
        gpu_status(what);
        worst = fmax(worst, bound_check(what, g, ref, bnd, n * rows, "int8"));
        free(g);
        dfree(dy);
      }
      cuda_backend_set_exact(g_gpu, 0);
      cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
      dfree(dx);
      free(w), free(wf), free(x), free(bias), free(ref), free(bnd);
    }
    printf("  %-6s largest error / bound %.3f\n", dtype_name(type), worst);
  }
}

static void test_embed(void) {
  printf("embed\n");
  const int types[] = {ANNA_DTYPE_F32, ANNA_DTYPE_BF16, ANNA_DTYPE_F16, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K};
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int type = types[ti];
    const int64_t rows = 1000, cols = dtype_block_size(type) == 1 ? 200 : 512, n = 37;
    float *wf;
    void *w = make_weight(type, rows, cols, &wf);
    int32_t ids[37];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(rnd() % rows);
    ops_weight ow = {type, w, rows, cols};
    float *ref = malloc(sizeof(float) * (size_t)(n * cols));
    g_cpu->embed(g_cpu, ref, &ow, ids, n, 1.7f);
    int32_t *dids = dput(ids, sizeof ids);
    float *dy = dnan(n * cols);
    g_gpu->embed(g_gpu, dy, &ow, dids, n, 1.7f);
    char what[64];
    snprintf(what, sizeof what, "embed %s", dtype_name(type));
    cmpd(what, dy, ref, n * cols, 1e-6);
    dfree(dids), dfree(dy);
    free(w), free(wf), free(ref);
  }
}

static void test_norms(void) {
  printf("norms\n");
  /* 4-aligned widths up to 16384 take the register-resident kernel; 7, 33, 20002 the strided one;
   * l2norm and rmsnorm_gated take a warp per row for 4-aligned widths up to 512 (64, 128, 260) */
  const int ds[] = {1, 7, 33, 64, 128, 260, 1000, 4096, 5120, 16384, 20002};
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int d = ds[i];
    const int64_t rows = 13;
    float *x = hrand(rows * d, 3.0f), *w = hrand(d, 1.0f), *z = hrand(rows * d, 2.0f);
    float *ref = malloc(sizeof(float) * (size_t)(rows * d));
    float *dx = dput(x, sizeof(float) * (size_t)(rows * d)), *dz = dput(z, sizeof(float) * (size_t)(rows * d));
    char what[64];
    for (int mode = 0; mode < 3; mode++) {
      g_cpu->rmsnorm(g_cpu, ref, x, mode ? w : NULL, rows, d, 1e-6f, mode == 2);
      float *dy = dnan(rows * d);
      g_gpu->rmsnorm(g_gpu, dy, dx, mode ? w : NULL, rows, d, 1e-6f, mode == 2);
      snprintf(what, sizeof what, "rmsnorm d=%d mode=%d", d, mode);
      cmpd(what, dy, ref, rows * d, 1e-5);
      dfree(dy);
    }
    { /* in place, as the model's final norm of a logits row runs */
      float *dxi = dput(x, sizeof(float) * (size_t)(rows * d));
      g_cpu->rmsnorm(g_cpu, ref, x, w, rows, d, 1e-6f, 0);
      g_gpu->rmsnorm(g_gpu, dxi, dxi, w, rows, d, 1e-6f, 0);
      snprintf(what, sizeof what, "rmsnorm in place d=%d", d);
      cmpd(what, dxi, ref, rows * d, 1e-5);
      dfree(dxi);
    }
    g_cpu->rmsnorm_gated(g_cpu, ref, x, z, w, rows, d, 1e-6f);
    float *dy = dnan(rows * d);
    g_gpu->rmsnorm_gated(g_gpu, dy, dx, dz, w, rows, d, 1e-6f);
    snprintf(what, sizeof what, "rmsnorm_gated d=%d", d);
    cmpd(what, dy, ref, rows * d, 1e-5);
    dfree(dy);
    memcpy(ref, x, sizeof(float) * (size_t)(rows * d));
    g_cpu->l2norm(g_cpu, ref, rows, d, 1e-6f, 0.3f);
    g_gpu->l2norm(g_gpu, dx, rows, d, 1e-6f, 0.3f);
    snprintf(what, sizeof what, "l2norm d=%d", d);
    cmpd(what, dx, ref, rows * d, 1e-5);
    dfree(dx), dfree(dz);
    free(x), free(w), free(z), free(ref);
  }
}

static void test_elementwise(void) {
  printf("elementwise\n");
  const int64_t n = 11;
  const int d = 1031;
  char what[64];
  float *a = hrand(n * 2 * d, 4.0f), *b = hrand(n * 2 * d, 4.0f);
  for (int act = 0; act < 2; act++) {
    float *ref = malloc(sizeof(float) * (size_t)(n * d));
    g_cpu->act_mul(g_cpu, ref, a, b + 3, n, d, 2 * d, 2 * d, act);
    float *da = dput(a, sizeof(float) * (size_t)(n * 2 * d)), *db = dput(b, sizeof(float) * (size_t)(n * 2 * d));
    float *dy = dnan(n * d);
    g_gpu->act_mul(g_gpu, dy, da, db + 3, n, d, 2 * d, 2 * d, act);
    snprintf(what, sizeof what, "act_mul act=%d", act);
    cmpd(what, dy, ref, n * d, 1e-5);
    dfree(da), dfree(db), dfree(dy), free(ref);
  }
  {
    float *y = hcopy(a, n * d);
    float *dy = dput(a, sizeof(float) * (size_t)(n * d)), *dx = dput(b, sizeof(float) * (size_t)(n * d));
    g_cpu->add(g_cpu, y, b, n * d);
    g_gpu->add(g_gpu, dy, dx, n * d);
    cmpd("add", dy, y, n * d, 1e-6);
    g_cpu->scale(g_cpu, y, -0.37f, n * d);
    g_gpu->scale(g_gpu, dy, -0.37f, n * d);
    cmpd("scale", dy, y, n * d, 1e-6);
    g_cpu->softcap(g_cpu, y, n * d, 3.0f);
    g_gpu->softcap(g_gpu, dy, n * d, 3.0f);
    cmpd("softcap", dy, y, n * d, 1e-5);
    for (int bc = 0; bc < 2; bc++) {
      g_cpu->mul_sigmoid(g_cpu, y, b, n, d, bc ? 3 : d, bc);
      g_gpu->mul_sigmoid(g_gpu, dy, dx, n, d, bc ? 3 : d, bc);
      cmpd(bc ? "mul_sigmoid bcast" : "mul_sigmoid", dy, y, n * d, 1e-5);
    }
    dfree(dy), dfree(dx), free(y);
  }
  {
    float *y = hrand(n * 2 * d, 1.0f), *dy = dput(y, sizeof(float) * (size_t)(n * 2 * d));
    float *da = dput(a, sizeof(float) * (size_t)(n * 2 * d));
    g_cpu->copy_rows(g_cpu, y + 5, 2 * d, a + 7, 2 * d - 1, n, d - 9);
    g_gpu->copy_rows(g_gpu, dy + 5, 2 * d, da + 7, 2 * d - 1, n, d - 9);
    cmpd("copy_rows", dy, y, n * 2 * d, 0);
    /* scatter: rows to shuffled destinations */
    float *hdst[11], *ddst[11];
    for (int i = 0; i < n; i++) {
      int r = (int)((i * 7 + 3) % n);
      hdst[i] = y + (int64_t)r * 2 * d + 1;
      ddst[i] = dy + (int64_t)r * 2 * d + 1;
    }
    g_cpu->scatter_rows(g_cpu, hdst, a, n, d);
    g_gpu->scatter_rows(g_gpu, ddst, da, n, d);
    cmpd("scatter_rows", dy, y, n * 2 * d, 0);
    dfree(dy), dfree(da), free(y);
  }
  free(a), free(b);
}

static void test_rope(void) {
  printf("rope\n");
  const int cfg[][4] = {/* heads, head_dim, rot, interleaved */ {3, 64, 64, 0}, {2, 128, 32, 0}, {4, 64, 64, 1},
                        {1, 256, 64, 1}};
  for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int H = cfg[c][0], D = cfg[c][1], rot = cfg[c][2], il = cfg[c][3];
    const int64_t n = 9, stride = (int64_t)H * D + 5;
    float *x = hrand(n * stride, 2.0f), *f = malloc(sizeof(float) * (size_t)(rot / 2));
    for (int i = 0; i < rot / 2; i++) f[i] = powf(10000.0f, -2.0f * i / rot);
    int32_t pos[9];
    for (int i = 0; i < n; i++) pos[i] = i * 911 + 3;
    float *dx = dput(x, sizeof(float) * (size_t)(n * stride));
    int32_t *dpos = dput(pos, sizeof pos);
    g_cpu->rope(g_cpu, x, n, H, D, stride, rot, f, pos, il);
    g_gpu->rope(g_gpu, dx, n, H, D, stride, rot, f, dpos, il);
    char what[64];
    snprintf(what, sizeof what, "rope H=%d D=%d rot=%d il=%d", H, D, rot, il);
    cmpd(what, dx, x, n * stride, 1e-5);
    dfree(dx), dfree(dpos), free(x), free(f);
  }
}

/* One attention case: sequence A continues at len0 with n1 tokens, sequence B starts at 0
 * with nB tokens, in one batch (paged caches of 16-position blocks). The CPU result is the
 * reference for both CUDA modes:
 * - exact=1 (CUDA-core f32 kernel): 1e-4 of the output scale, f32 rounding only;
 * - exact=0 (flash prefill on tensor cores when a run has >= 16 tokens; else the same f32
 *   kernel): 1e-2. Q (pre-scaled), K, V and the softmax weights P are rounded to f16
 *   (relative 2^-11 = 4.9e-4 each); with inputs in [-1, 1] and scale 1/sqrt(D) the scores
 *   are O(1) and move by ~1e-3, so each softmax weight moves by ~1e-3 relative and the
 *   output (a convex combination of V rows) by ~1e-3 of its scale; 1e-2 leaves 10x margin
 *   while a wrong mask, a lost rescale or a missed tile moves it by O(1). */
static void attn_case(int Hq, int Hkv, int D, int win, int cap, int len0, int n1, int nB) {
  const int64_t n = n1 + nB, kvd = (int64_t)Hkv * D, ctx = len0 + n1 + nB + 4;
  float *kA = hrand(ctx * kvd, 1.0f), *vA = hrand(ctx * kvd, 1.0f), *kB = hrand(ctx * kvd, 1.0f),
        *vB = hrand(ctx * kvd, 1.0f), *q = hrand(n * Hq * D, 1.0f);
  float *dkA = dput(kA, sizeof(float) * (size_t)(ctx * kvd)), *dvA = dput(vA, sizeof(float) * (size_t)(ctx * kvd));
  float *dkB = dput(kB, sizeof(float) * (size_t)(ctx * kvd)), *dvB = dput(vB, sizeof(float) * (size_t)(ctx * kvd));
  float *dq = dput(q, sizeof(float) * (size_t)(n * Hq * D));
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
  /* Paged: each sequence's cache as blocks of 16 positions (contiguous here; the block
   * tables are what the kernels read). Host tables for the CPU, device ones for the GPU. */
  const int BL = 16, nbk = (int)((ctx + BL - 1) / BL);
  const void **tkA = malloc(sizeof(void *) * nbk), **tvA = malloc(sizeof(void *) * nbk),
             **tkB = malloc(sizeof(void *) * nbk), **tvB = malloc(sizeof(void *) * nbk);
  const void **ukA = malloc(sizeof(void *) * nbk), **uvA = malloc(sizeof(void *) * nbk),
             **ukB = malloc(sizeof(void *) * nbk), **uvB = malloc(sizeof(void *) * nbk);
  for (int j = 0; j < nbk; j++) {
    const int64_t o = (int64_t)j * BL * kvd;
    tkA[j] = kA + o, tvA[j] = vA + o, tkB[j] = kB + o, tvB[j] = vB + o;
    ukA[j] = dkA + o, uvA[j] = dvA + o, ukB[j] = dkB + o, uvB[j] = dvB + o;
  }
  void *dtkA = dput(ukA, sizeof(void *) * nbk), *dtvA = dput(uvA, sizeof(void *) * nbk),
       *dtkB = dput(ukB, sizeof(void *) * nbk), *dtvB = dput(uvB, sizeof(void *) * nbk);
  const void **hk = malloc(sizeof(void *) * (size_t)n), **hv = malloc(sizeof(void *) * (size_t)n);
  const void **gk = malloc(sizeof(void *) * (size_t)n), **gv = malloc(sizeof(void *) * (size_t)n);
  for (int64_t t = 0; t < n; t++) {
    const int a = t < n1;
    pos[t] = a ? len0 + (int32_t)t : (int32_t)(t - n1);
    hk[t] = a ? tkA : tkB, hv[t] = a ? tvA : tvB, gk[t] = a ? dtkA : dtkB, gv[t] = a ? dtvA : dtvB;
  }
  int32_t *dpos = dput(pos, sizeof(int32_t) * (size_t)n);
  ops_attn_args ha = {.n = n, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .v_dim = D, .kv_type = OPS_KV_F32,
                      .kv_row_bytes = kvd * 4, .block_len = BL, .scale = 1.0f / sqrtf((float)D), .window = win,
                      .softcap = (float)cap, .pos = pos, .k_blocks = (const void *const *const *)hk,
                      .v_blocks = (const void *const *const *)hv};
  ops_attn_args ga = ha;
  ga.pos = dpos, ga.k_blocks = (const void *const *const *)gk, ga.v_blocks = (const void *const *const *)gv;
  float *ref = malloc(sizeof(float) * (size_t)(n * Hq * D));
  g_cpu->attention(g_cpu, ref, q, &ha);
  /* modes: exact (f32 kernels); not exact (flash attention where it applies). Each with the
   * decode kernel for grouped queries (the default where 2 <= Hq / Hkv <= 8 and D <= 256) and
   * the per-head kernel (CUDA_ATTN_PER_HEAD): both f32, so both within 1e-4 in exact mode. */
  static const char *const mname[] = {"exact", "fast", "exact per-head", "fast per-head", "fast wmma"};
  for (int mode = 0; mode < 5; mode++) {
    const int exact = mode == 0 || mode == 2;
    cuda_backend_set_exact(g_gpu, exact);
    cuda_backend_set_attn_variant(g_gpu, mode == 2 || mode == 3 ? CUDA_ATTN_PER_HEAD : CUDA_ATTN_DEFAULT);
    cuda_backend_set_flash_variant(g_gpu, mode == 4 ? CUDA_FLASH_WMMA : CUDA_FLASH_MMA);
    float *dy = dnan(n * Hq * D);
    g_gpu->attention(g_gpu, dy, dq, &ga);
    char what[112];
    snprintf(what, sizeof what, "attention H=%d/%d D=%d win=%d cap=%d len=%d n=%d+%d %s", Hq, Hkv, D, win, cap, len0,
             n1, nB, mname[mode]);
    cmpd(what, dy, ref, n * Hq * D, exact ? 1e-4 : 1e-2);
    dfree(dy);
  }
  cuda_backend_set_attn_variant(g_gpu, CUDA_ATTN_DEFAULT);
  cuda_backend_set_flash_variant(g_gpu, CUDA_FLASH_MMA);
  cuda_backend_set_exact(g_gpu, 1); /* back to the tests' default (exact) */
  /* keys_hint (the host's bound on the keys, which the grouped decode kernel sizes its key
   * splits by): the batch's true bound, and a wrong one (1): results never depend on it */
  int32_t pmax = 0;
  for (int64_t t = 0; t < n; t++) pmax = pos[t] + 1 > pmax ? pos[t] + 1 : pmax;
  const int32_t hints[2] = {pmax, 1};
  for (int h = 0; h < 2; h++) {
    ops_attn_args gh = ga;
    gh.keys_hint = hints[h];
    float *dy = dnan(n * Hq * D);
    g_gpu->attention(g_gpu, dy, dq, &gh);
    char what[112];
    snprintf(what, sizeof what, "attention H=%d/%d D=%d win=%d cap=%d len=%d n=%d+%d keys_hint %d", Hq, Hkv, D, win,
             cap, len0, n1, nB, hints[h]);
    cmpd(what, dy, ref, n * Hq * D, 1e-4);
    dfree(dy);
  }
  dfree(dkA), dfree(dvA), dfree(dkB), dfree(dvB), dfree(dq), dfree(dpos);
  free(kA), free(vA), free(kB), free(vB), free(q), free(pos), free(hk), free(hv), free(gk), free(gv), free(ref);
  dfree(dtkA), dfree(dtvA), dfree(dtkB), dfree(dtvB);
  free(tkA), free(tvA), free(tkB), free(tvB), free(ukA), free(uvA), free(ukB), free(uvB);
}

static void test_attention(void) {
  printf("attention\n");
  /* decode-like and mixed batches (the split-K kernel in both modes unless a run has >= 16
   * tokens), then prefill shapes for the flash kernel: GQA groups 1..8 and 3 (rows of a
   * tile not a multiple of the group), head dims 64..512 incl. 80 and 96, windows, softcap,
   * long cached prefixes (several key splits) and two long sequences in one batch */
  const int cfg[][8] = {/* heads, kv heads, head_dim, window, softcap, len0, n1, nB */
                        {4, 2, 64, 0, 0, 23, 23, 3},       {8, 1, 256, 0, 0, 0, 40, 3},
                        {6, 3, 32, 16, 0, 100, 7, 3},      {4, 4, 128, 0, 30, 5, 1, 3},
                        {16, 2, 128, 0, 0, 2000, 3, 3},    {2, 1, 512, 512, 50, 700, 2, 3},
                        {5, 5, 80, 64, 0, 0, 130, 3},      {8, 2, 256, 0, 0, 0, 512, 0},
                        {8, 2, 256, 0, 0, 1500, 512, 0},   {8, 1, 512, 512, 0, 700, 300, 0},
                        {4, 4, 128, 0, 30, 0, 130, 0},     {16, 2, 64, 0, 0, 0, 77, 0},
                        {6, 2, 96, 0, 0, 50, 45, 37},      {8, 2, 256, 100, 0, 300, 70, 20},
                        {2, 2, 512, 0, 0, 33, 17, 16},     {4, 1, 128, 1024, 20, 2000, 200, 40},
                        /* decode of the grouped-query kernel: the 9B shape at 8k (every split
                         * full), a group of 3 and odd dims, one token at position 0, a window
                         * shorter than a split, G = 8 at D = 256 (its largest shared memory) */
                        {16, 4, 256, 0, 0, 8000, 1, 0},    {12, 4, 40, 0, 0, 3000, 2, 1},
                        {4, 2, 64, 0, 0, 0, 0, 1},         {8, 4, 128, 40, 0, 900, 3, 0},
                        {8, 1, 256, 0, 30, 300, 2, 0}};
  for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
    attn_case(cfg[c][0], cfg[c][1], cfg[c][2], cfg[c][3], cfg[c][4], cfg[c][5], cfg[c][6], cfg[c][7]);
}

static void test_conv_gates(void) {
  printf("conv1d_silu, gdn_gates\n");
  /* n, channels, width: short runs keep part of the old state (n < kw - 1) */
  const int cs[][3] = {{1, 67, 4}, {2, 67, 4}, {3, 67, 4}, {7, 67, 4}, {100, 67, 4}, {2049, 300, 4},
                       {1, 33, 8}, {5, 33, 8}, {40, 33, 1}, {3, 129, 2}};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int64_t n = cs[i][0];
    const int ch = cs[i][1], kw = cs[i][2];
    float *x = hrand(n * ch, 2.0f), *w = hrand(ch * kw, 0.5f), *st = hrand(ch * (kw > 1 ? kw - 1 : 1), 1.0f);
    float *dx = dput(x, sizeof(float) * (size_t)(n * ch)),
          *dst = dput(st, sizeof(float) * (size_t)(ch * (kw > 1 ? kw - 1 : 1)));
    float *y = malloc(sizeof(float) * (size_t)(n * ch)), *dy = dnan(n * ch);
    g_cpu->conv1d_silu(g_cpu, y, x, n, ch, w, kw, st);
    g_gpu->conv1d_silu(g_gpu, dy, dx, n, ch, w, kw, dst);
    char what[64];
    snprintf(what, sizeof what, "conv1d_silu n=%lld ch=%d kw=%d", (long long)n, ch, kw);
    cmpd(what, dy, y, n * ch, 1e-5);
    snprintf(what, sizeof what, "conv1d_silu state n=%lld ch=%d kw=%d", (long long)n, ch, kw);
    if (kw > 1) cmpd(what, dst, st, ch * (kw - 1), 0);
    dfree(dx), dfree(dst), dfree(dy), free(x), free(w), free(st), free(y);
  }
  cuda_backend_drop_mirrors(g_gpu);
  const int64_t n = 19;
  const int h = 48;
  float *ba = hrand(n * 2 * h, 5.0f), *alog = hrand(h, 1.0f), *dtb = hrand(h, 3.0f);
  ba[5] = 30.0f; /* softplus' large-input branch */
  float *beta = malloc(sizeof(float) * (size_t)(n * h)), *g = malloc(sizeof(float) * (size_t)(n * h));
  g_cpu->gdn_gates(g_cpu, beta, g, ba, 2 * h, ba + h, 2 * h, alog, dtb, n, h);
  float *dba = dput(ba, sizeof(float) * (size_t)(n * 2 * h)), *dbeta = dnan(n * h), *dg = dnan(n * h);
  g_gpu->gdn_gates(g_gpu, dbeta, dg, dba, 2 * h, dba + h, 2 * h, alog, dtb, n, h);
  cmpd("gdn_gates beta", dbeta, beta, n * h, 1e-6);
  cmpd("gdn_gates g", dg, g, n * h, 1e-5);
  dfree(dba), dfree(dbeta), dfree(dg), free(ba), free(alog), free(dtb), free(beta), free(g);
}

static void l2n(float *x, int64_t rows, int d, float scale) {
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)x[r * d + i] * x[r * d + i];
    for (int i = 0; i < d; i++) x[r * d + i] *= scale / (float)sqrt(s + 1e-6);
  }
}

static void test_gdn(void) {
  printf("gdn\n");
  const int cfgs[][6] = {/* n, hk, hv, dk, dv, tiled */ {1, 2, 4, 16, 16, 0},  {5, 2, 4, 32, 24, 1},
                         {64, 1, 3, 32, 8, 0},  {150, 2, 4, 128, 128, 0}, {300, 4, 8, 128, 128, 1},
                         {77, 2, 2, 64, 40, 0}, {33, 1, 2, 256, 64, 0}};
  for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
    const int64_t n = cfgs[c][0];
    const int hk = cfgs[c][1], hv = cfgs[c][2], dk = cfgs[c][3], dv = cfgs[c][4], tiled = cfgs[c][5];
    float *q = hrand(n * hk * dk, 1), *k = hrand(n * hk * dk, 1), *v = hrand(n * hv * dv, 1);
    l2n(q, n * hk, dk, 1.0f / sqrtf((float)dk)), l2n(k, n * hk, dk, 1.0f);
    float *g = malloc(sizeof(float) * (size_t)(n * hv)), *beta = malloc(sizeof(float) * (size_t)(n * hv));
    for (int64_t i = 0; i < n * hv; i++) g[i] = -0.3f * (frand() + 1.0f), beta[i] = 0.5f * (frand() + 1.0f);
    float *st0 = hrand((int64_t)hv * dk * dv, 0.2f);
    float *dq = dput(q, sizeof(float) * (size_t)(n * hk * dk)), *dk_ = dput(k, sizeof(float) * (size_t)(n * hk * dk));
    float *dv_ = dput(v, sizeof(float) * (size_t)(n * hv * dv)), *dg = dput(g, sizeof(float) * (size_t)(n * hv));
    float *db = dput(beta, sizeof(float) * (size_t)(n * hv));
    /* recurrent; chunked with exact on; chunked with exact off (the same f32 kernels: both
     * modes must agree with the CPU to f32 rounding) */
    for (int mode = 0; mode < 3; mode++) {
      const int chunked = mode > 0;
      cuda_backend_set_exact(g_gpu, mode != 2);
      float *st = hcopy(st0, (int64_t)hv * dk * dv), *out = malloc(sizeof(float) * (size_t)(n * hv * dv));
      float *dst = dput(st0, sizeof(float) * (size_t)hv * dk * dv), *dout = dnan(n * hv * dv);
      ops_gdn_args ha = {n, hk, hv, dk, dv, tiled, q, k, v, g, beta, st, out};
      ops_gdn_args ga = {n, hk, hv, dk, dv, tiled, dq, dk_, dv_, dg, db, dst, dout};
      if (chunked) g_cpu->gdn_chunked(g_cpu, &ha), g_gpu->gdn_chunked(g_gpu, &ga);
      else g_cpu->gdn_recurrent(g_cpu, &ha), g_gpu->gdn_recurrent(g_gpu, &ga);
      char what[96];
      snprintf(what, sizeof what, "gdn %s n=%lld hk=%d hv=%d dk=%d dv=%d tiled=%d",
               mode == 0 ? "recurrent" : mode == 1 ? "chunked" : "chunked fast mode", (long long)n, hk, hv, dk, dv,
               tiled);
      const double tol = 1e-4;
      cmpd(what, dout, out, n * hv * dv, tol);
      strcat(what, " state");
      cmpd(what, dst, st, (int64_t)hv * dk * dv, tol);
      dfree(dst), dfree(dout), free(st), free(out);
    }
    cuda_backend_set_exact(g_gpu, 1); /* back to the tests' default (exact) */
    dfree(dq), dfree(dk_), dfree(dv_), dfree(dg), dfree(db);
    free(q), free(k), free(v), free(g), free(beta), free(st0);
  }
}

/* The unfused GDN decode sequence on one backend (what gdn_step replaces); device buffers
 * conv [n, cd], qkv2 [n, cd], gates [2n, hv], o [n, Vd] given by the caller. */
static void gdn_unfused(ops_backend *be, const ops_gdn_step_args *a, float *conv, float *qkv2, float *gates,
                        float *o) {
  const int64_t n = a->n, Kd = (int64_t)a->hk * a->dk, Vd = (int64_t)a->hv * a->dv, cd = 2 * Kd + Vd;
  be->conv1d_silu(be, conv, a->qkv, n, (int)cd, a->conv_w, a->kw, a->conv_state);
  float *q = qkv2, *k = qkv2 + n * Kd, *v = qkv2 + 2 * n * Kd;
  be->copy_rows(be, q, Kd, conv, cd, n, (int)Kd);
  be->copy_rows(be, k, Kd, conv + Kd, cd, n, (int)Kd);
  be->copy_rows(be, v, Vd, conv + 2 * Kd, cd, n, (int)Vd);
  be->l2norm(be, q, n * a->hk, a->dk, 1e-6f, 1.0f / sqrtf((float)a->dk));
  be->l2norm(be, k, n * a->hk, a->dk, 1e-6f, 1.0f);
  be->gdn_gates(be, gates, gates + n * a->hv, a->b, a->hv, a->a, a->hv, a->a_log, a->dt_bias, n, a->hv);
  ops_gdn_args r = {n, a->hk, a->hv, a->dk, a->dv, a->v_tiled, q, k, v, gates + n * a->hv, gates, a->state, o};
  be->gdn_recurrent(be, &r);
  be->rmsnorm_gated(be, a->y, o, a->z, a->norm_w, n * a->hv, a->dv, a->eps);
}

/* gdn_step, add_rmsnorm and norm_rope against the CPU backend's (the unfused sequences, bit for bit:
 * test_ops), in both numerics modes (both run f32 kernels: the modes must agree).
 * Tolerances (max error over max |ref|): gdn_step output and state 1e-4, as the recurrent
 * kernel's test: the delta rule's dot products over dk are summed in another order (a tree
 * over P lanes) and the CPU's norms accumulate in double, so f32 rounding of ~dk terms,
 * carried through up to 12 tokens of state, differs by well under 1e-5; rsqrtf adds 2 ulp.
 * The conv state is a copy of raw inputs: exact. add_rmsnorm: x exact (one f32 add, as the
 * CPU), y 1e-5 as the rmsnorm test. */
static void test_fused(void) {
  printf("fused ops (gdn_step, add_rmsnorm, norm_rope)\n");
  const int cfgs[][7] = {
      /* n, hk, hv, dk, dv, tiled, kw */
      {1, 16, 16, 128, 128, 0, 4}, /* Qwen3.5-0.8B decode */
      {3, 16, 16, 128, 128, 0, 4}, {7, 16, 32, 128, 128, 1, 4}, /* two v-heads per block, tiled */
      {12, 2, 4, 128, 128, 0, 4},                                /* two launches (8 + 4 tokens) */
      {5, 2, 6, 40, 24, 0, 4},                                   /* odd sizes, three v-heads per block */
      {2, 1, 2, 256, 200, 1, 3},                                 /* widest: 2 lanes per column */
      {9, 3, 3, 64, 64, 0, 2},     {1, 1, 1, 16, 16, 0, 4},
  };
  for (int exact = 0; exact < 2; exact++) {
    cuda_backend_set_exact(g_gpu, exact);
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
      cuda_backend_drop_mirrors(g_gpu);
      const int64_t n = cfgs[c][0];
      const int hk = cfgs[c][1], hv = cfgs[c][2], dk = cfgs[c][3], dv = cfgs[c][4], tiled = cfgs[c][5],
                kw = cfgs[c][6];
      const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd, ssz = (int64_t)hv * dk * dv;
      const int64_t csz = cd * (kw - 1);
      float *qkv = hrand(n * cd, 2.0f), *z = hrand(n * Vd, 2.0f), *ba = hrand(2 * n * hv, 2.0f);
      float *cw = hrand(cd * kw, 0.5f), *alog = hrand(hv, 1.0f), *dtb = hrand(hv, 1.0f), *nw = hrand(dv, 1.0f);
      float *cs = hrand(csz, 1.0f), *st = hrand(ssz, 0.2f), *y = malloc(sizeof(float) * (size_t)(n * Vd));
      float *work = malloc(sizeof(float) * (size_t)ops_gdn_step_work_floats(n, hk, hv, dk, dv));
      float *dqkv = dput(qkv, sizeof(float) * (size_t)(n * cd)), *dz = dput(z, sizeof(float) * (size_t)(n * Vd));
      float *dba = dput(ba, sizeof(float) * (size_t)(2 * n * hv)), *dcs = dput(cs, sizeof(float) * (size_t)csz);
      float *dst = dput(st, sizeof(float) * (size_t)ssz), *dy = dnan(n * Vd);
      ops_gdn_step_args a = {
          .n = n, .hk = hk, .hv = hv, .dk = dk, .dv = dv, .kw = kw, .v_tiled = tiled, .eps = 1e-6f, .qkv = qkv,
          .z = z, .b = ba, .a = ba + n * hv, .conv_w = cw, .a_log = alog, .dt_bias = dtb, .norm_w = nw,
          .conv_state = cs, .state = st, .y = y, .work = work,
      };
      g_cpu->gdn_step(g_cpu, &a);
      a.qkv = dqkv, a.z = dz, a.b = dba, a.a = dba + n * hv, a.conv_state = dcs, a.state = dst, a.y = dy;
      a.work = NULL; /* the fused kernel needs none */
      g_gpu->gdn_step(g_gpu, &a);
      char what[96];
      snprintf(what, sizeof what, "gdn_step n=%lld hk=%d hv=%d dk=%d dv=%d t=%d kw=%d ex=%d", (long long)n, hk, hv,
               dk, dv, tiled, kw, exact);
      cmpd(what, dy, y, n * Vd, 1e-4);
      strcat(what, " state");
      cmpd(what, dst, st, ssz, 1e-4);
      strcat(what, " conv");
      cmpd(what, dcs, cs, csz, 0);
      dfree(dqkv), dfree(dz), dfree(dba), dfree(dcs), dfree(dst), dfree(dy);
      free(qkv), free(z), free(ba), free(cw), free(alog), free(dtb), free(nw), free(cs), free(st), free(y), free(work);
    }
    const int ds[] = {1, 37, 1000, 1024, 4096, 5120, 16384, 20000};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
      cuda_backend_drop_mirrors(g_gpu);
      const int d = ds[i];
      const int64_t rows = i % 2 ? 5 : 1;
      float *x = hrand(rows * d, 3.0f), *r = hrand(rows * d, 3.0f), *w = hrand(d, 1.0f);
      float *y = malloc(sizeof(float) * (size_t)(rows * d));
      float *dr = dput(r, sizeof(float) * (size_t)(rows * d));
      for (int mode = 0; mode < 3; mode++) {
        float *xh = hcopy(x, rows * d), *dx = dput(x, sizeof(float) * (size_t)(rows * d)), *dy = dnan(rows * d);
        g_cpu->add_rmsnorm(g_cpu, xh, r, y, mode ? w : NULL, rows, d, 1e-6f, mode == 2);
        g_gpu->add_rmsnorm(g_gpu, dx, dr, dy, mode ? w : NULL, rows, d, 1e-6f, mode == 2);
        char what[64];
        snprintf(what, sizeof what, "add_rmsnorm d=%d rows=%lld mode=%d ex=%d", d, (long long)rows, mode, exact);
        cmpd(what, dy, y, rows * d, 1e-5);
        strcat(what, " x");
        cmpd(what, dx, xh, rows * d, 0);
        dfree(dx), dfree(dy), free(xh);
      }
      dfree(dr), free(x), free(r), free(w), free(y);
    }
    /* norm_rope: Qwen3.5's strided q (head_dim 256, [q | gate] per head) and in place (k);
     * partial and interleaved rotations; 1e-5 as the rmsnorm and rope tests. */
    const int nr[][6] = {/* n, heads, D, rot, interleaved, strided */ {1, 8, 256, 64, 0, 1}, {3, 2, 256, 64, 0, 0},
                         {7, 3, 40, 40, 1, 1}, {2, 5, 96, 32, 1, 0}, {1, 1, 32, 0, 0, 1}};
    for (size_t i = 0; i < sizeof nr / sizeof nr[0]; i++) {
      cuda_backend_drop_mirrors(g_gpu);
      const int64_t n = nr[i][0];
      const int H = nr[i][1], D = nr[i][2], rot = nr[i][3], il = nr[i][4], strided = nr[i][5];
      const int64_t xhs = strided ? 2 * D : D, xs = H * xhs, out = n * H * D;
      float *x = hrand(n * xs, 2.0f), *w = hrand(D, 1.0f), *f = malloc(sizeof(float) * (size_t)(rot / 2 + 1));
      for (int j = 0; j < rot / 2; j++) f[j] = powf(1e6f, -2.0f * j / (float)rot);
      int32_t pos[7];
      for (int t = 0; t < n; t++) pos[t] = t * 911 + 3;
      float *y = malloc(sizeof(float) * (size_t)out), *dx = dput(x, sizeof(float) * (size_t)(n * xs));
      int32_t *dpos = dput(pos, sizeof(int32_t) * (size_t)n);
      float *dy = strided ? dnan(out) : dx;
      g_cpu->norm_rope(g_cpu, y, x, n, H, D, xs, xhs, w, 1e-6f, i % 2, rot, rot ? f : NULL, pos, il);
      g_gpu->norm_rope(g_gpu, dy, dx, n, H, D, xs, xhs, w, 1e-6f, i % 2, rot, rot ? f : NULL, dpos, il);
      char what[80];
      snprintf(what, sizeof what, "norm_rope n=%lld H=%d D=%d rot=%d il=%d strided=%d ex=%d", (long long)n, H, D, rot,
               il, strided, exact);
      cmpd(what, dy, y, out, 1e-5);
      if (strided) dfree(dy);
      dfree(dx), dfree(dpos), free(x), free(w), free(f), free(y);
    }
  }
  cuda_backend_set_exact(g_gpu, 1); /* back to the tests' default (exact) */
  cuda_backend_drop_mirrors(g_gpu);
}

/* gdn_step over consecutive calls (state and conv state carry from call to call) against the
 * CPU's gdn_step: the Qwen3.5 shapes (0.8B: hk = hv = 16; 9B / 35B-A3B: hv = 32, both v-head
 * orders), odd sizes whose per-block column ranges straddle v-heads, a group narrower than the
 * 8-block cluster (blocks without columns), 32 v-heads per k-head (several column passes per
 * block); n = 1, 3, 8, 11 (two launches), 1. Then three decode steps through a recorded step
 * (a graph, as the model runs it): the cluster launch must hold there too. Tolerance 1e-4 as
 * test_fused, for the same reasons; the output norm's row sums are added as per-block partials
 * (f32 rounding of <= dv terms, far below it). The conv state is a copy of inputs: exact. */
static void test_gdn_step(void) {
  printf("gdn_step (consecutive calls, recorded steps)\n");
  const int cfgs[][6] = {
      /* hk, hv, dk, dv, tiled, kw */
      {16, 16, 128, 128, 0, 4}, {16, 32, 128, 128, 1, 4}, {16, 32, 128, 128, 0, 4}, {3, 6, 40, 24, 0, 4},
      {3, 6, 40, 24, 1, 4},     {1, 3, 32, 2, 0, 4},      {2, 2, 256, 256, 1, 3},  {1, 32, 64, 64, 0, 2},
      {4, 16, 128, 64, 1, 4},   {2, 8, 128, 128, 0, 4},
  };
  const int64_t ns[] = {1, 3, 8, 11, 1, 1, 1, 1}; /* the last three: recorded steps */
  const int ncalls = 8, neager = 5;
  /* both variants (CUDA_GDN_HEAD takes dk, dv <= 128 with 1, 2 or 4 v-heads per k-head and
   * leaves the rest to the cluster kernel) */
  for (size_t cv = 0; cv < 2 * (sizeof cfgs / sizeof cfgs[0]); cv++) {
    const size_t c = cv % (sizeof cfgs / sizeof cfgs[0]);
    const int var = cv >= sizeof cfgs / sizeof cfgs[0];
    cuda_backend_set_gdn_variant(g_gpu, var ? CUDA_GDN_HEAD : CUDA_GDN_CLUSTER);
    cuda_backend_drop_mirrors(g_gpu);
    const int hk = cfgs[c][0], hv = cfgs[c][1], dk = cfgs[c][2], dv = cfgs[c][3], tiled = cfgs[c][4], kw = cfgs[c][5];
    const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd, ssz = (int64_t)hv * dk * dv;
    const int64_t csz = cd * (kw - 1), nmax = 11;
    float *cw = hrand(cd * kw, 0.5f), *alog = hrand(hv, 1.0f), *dtb = hrand(hv, 1.0f), *nw = hrand(dv, 1.0f);
    float *cs = hrand(csz, 1.0f), *st = hrand(ssz, 0.2f), *y = malloc(sizeof(float) * (size_t)(nmax * Vd));
    float *work = malloc(sizeof(float) * (size_t)ops_gdn_step_work_floats(nmax, hk, hv, dk, dv));
    float *dcs = dput(cs, sizeof(float) * (size_t)csz), *dst = dput(st, sizeof(float) * (size_t)ssz);
    float *dqkv = dnan(nmax * cd), *dz = dnan(nmax * Vd), *dba = dnan(2 * nmax * hv), *dy = dnan(nmax * Vd);
    for (int call = 0; call < ncalls; call++) {
      const int64_t n = ns[call];
      const int rec = call >= neager;
      float *qkv = hrand(n * cd, 2.0f), *z = hrand(n * Vd, 2.0f), *ba = hrand(2 * n * hv, 2.0f);
      g_gpu->upload(g_gpu, dqkv, qkv, sizeof(float) * (size_t)(n * cd));
      g_gpu->upload(g_gpu, dz, z, sizeof(float) * (size_t)(n * Vd));
      g_gpu->upload(g_gpu, dba, ba, sizeof(float) * (size_t)(2 * n * hv));
      ops_gdn_step_args a = {
          .n = n, .hk = hk, .hv = hv, .dk = dk, .dv = dv, .kw = kw, .v_tiled = tiled, .eps = 1e-6f, .qkv = qkv,
          .z = z, .b = ba, .a = ba + n * hv, .conv_w = cw, .a_log = alog, .dt_bias = dtb, .norm_w = nw,
          .conv_state = cs, .state = st, .y = y, .work = work,
      };
      g_cpu->gdn_step(g_cpu, &a);
      a.qkv = dqkv, a.z = dz, a.b = dba, a.a = dba + n * hv, a.conv_state = dcs, a.state = dst, a.y = dy;
      a.work = NULL;
      if (rec) cuda_backend_set_graphs(g_gpu, 1), cuda_backend_step_begin(g_gpu, n);
      g_gpu->gdn_step(g_gpu, &a);
      if (rec) cuda_backend_step_end(g_gpu), cuda_backend_set_graphs(g_gpu, 0);
      char what[96];
      snprintf(what, sizeof what, "gdn_step%s call %d%s n=%lld hk=%d hv=%d dk=%d dv=%d t=%d kw=%d",
               var ? " head" : "", call, rec ? " (graph)" : "", (long long)n, hk, hv, dk, dv, tiled, kw);
      cmpd(what, dy, y, n * Vd, 1e-4);
      strcat(what, " state");
      cmpd(what, dst, st, ssz, 1e-4);
      strcat(what, " conv");
      cmpd(what, dcs, cs, csz, 0);
      free(qkv), free(z), free(ba);
    }
    dfree(dcs), dfree(dst), dfree(dqkv), dfree(dz), dfree(dba), dfree(dy);
    free(cw), free(alog), free(dtb), free(nw), free(cs), free(st), free(y), free(work);
  }
  cuda_backend_set_gdn_variant(g_gpu, CUDA_GDN_HEAD); /* back to the default */
  cuda_backend_drop_mirrors(g_gpu);
}

/* Random GDN inputs for one run: q, k l2-normalised (q scaled by 1/sqrt(dk)), beta in [0, 1],
 * g in [-0.6, 0] (fast decay) or [-0.02, 0] (slow: the state carries across many chunks). */
typedef struct gdn_case {
  int64_t n;
  int hk, hv, dk, dv, tiled;
  float *q, *k, *v, *g, *beta, *st0;
} gdn_case;

static void gdn_case_make(gdn_case *c, int64_t n, int hk, int hv, int dk, int dv, int tiled, int slow) {
  *c = (gdn_case){n, hk, hv, dk, dv, tiled, NULL, NULL, NULL, NULL, NULL, NULL};
  c->q = hrand(n * hk * dk, 1), c->k = hrand(n * hk * dk, 1), c->v = hrand(n * hv * dv, 1);
  l2n(c->q, n * hk, dk, 1.0f / sqrtf((float)dk)), l2n(c->k, n * hk, dk, 1.0f);
  c->g = malloc(sizeof(float) * (size_t)(n * hv)), c->beta = malloc(sizeof(float) * (size_t)(n * hv));
  for (int64_t i = 0; i < n * hv; i++)
    c->g[i] = (slow ? -0.01f : -0.3f) * (frand() + 1.0f), c->beta[i] = 0.5f * (frand() + 1.0f);
  c->st0 = hrand((int64_t)hv * dk * dv, 0.2f);
}

static void gdn_case_free(gdn_case *c) {
  free(c->q), free(c->k), free(c->v), free(c->g), free(c->beta), free(c->st0);
}

/* The chunk-64 CUDA kernels (gdn_chunked) against both CPU forms, output and final state,
 * in both numerics modes, from a nonzero state. n covers the short-run fallback (8), partial
 * and exact chunks (63, 64, 65), several chunks, and (hv 64) more chunks than one scratch
 * segment holds (the state carries between segments); dv 40 is not a multiple of the 16-
 * column phase-2 slice, dk 256 needs two solve columns per thread. Tolerances, of max |ref|:
 * 1e-4 in both numerics modes (the kernels are f32 in both): the two f32 computations differ
 * only in summation order and in gam (a scan instead of a serial sum), ~1e-6 relative, and the
 * recurrent form differs from the chunked one by the same rounding, which the decays keep
 * from growing. */
static void test_gdn_chunked(void) {
  printf("gdn chunked (chunk-64 kernels)\n");
  const int cfgs[][7] = {/* n, hk, hv, dk, dv, tiled, slow */
                         {8, 2, 2, 128, 128, 0, 0},    {63, 2, 4, 128, 128, 0, 0},   {64, 2, 4, 64, 64, 1, 0},
                         {65, 2, 2, 32, 32, 0, 1},     {200, 2, 4, 128, 128, 1, 1},  {512, 16, 32, 128, 128, 0, 0},
                         {1000, 2, 4, 64, 64, 0, 1},   {1000, 2, 2, 128, 64, 0, 0},  {200, 2, 4, 32, 128, 0, 1},
                         {130, 2, 2, 256, 128, 0, 1},  {97, 1, 3, 128, 40, 0, 0},    {1000, 16, 64, 128, 128, 0, 1},
                         {512, 2, 4, 128, 128, 1, 1}};
  for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
    gdn_case c;
    gdn_case_make(&c, cfgs[ci][0], cfgs[ci][1], cfgs[ci][2], cfgs[ci][3], cfgs[ci][4], cfgs[ci][5], cfgs[ci][6]);
    const int64_t n = c.n, nq = n * c.hk * c.dk, nv = n * c.hv * c.dv, ns = (int64_t)c.hv * c.dk * c.dv;
    /* CPU references: chunked and recurrent */
    float *st_c = hcopy(c.st0, ns), *out_c = malloc(sizeof(float) * (size_t)nv);
    float *st_r = hcopy(c.st0, ns), *out_r = malloc(sizeof(float) * (size_t)nv);
    ops_gdn_args hc = {n, c.hk, c.hv, c.dk, c.dv, c.tiled, c.q, c.k, c.v, c.g, c.beta, st_c, out_c};
    ops_gdn_args hr = {n, c.hk, c.hv, c.dk, c.dv, c.tiled, c.q, c.k, c.v, c.g, c.beta, st_r, out_r};
    g_cpu->gdn_chunked(g_cpu, &hc);
    g_cpu->gdn_recurrent(g_cpu, &hr);
    float *dq = dput(c.q, sizeof(float) * (size_t)nq), *dk_ = dput(c.k, sizeof(float) * (size_t)nq);
    float *dv_ = dput(c.v, sizeof(float) * (size_t)nv), *dg = dput(c.g, sizeof(float) * (size_t)(n * c.hv));
    float *db = dput(c.beta, sizeof(float) * (size_t)(n * c.hv));
    for (int pass = 0; pass < 3; pass++) { /* exact, fast, fast with 32 scan columns per block */
      const int exact = pass == 0, cols = pass == 2 ? 32 : 16;
      cuda_backend_set_exact(g_gpu, exact);
      cuda_backend_set_gdn_scan_cols(g_gpu, cols);
      float *dst = dput(c.st0, sizeof(float) * (size_t)ns), *dout = dnan(nv);
      ops_gdn_args ga = {n, c.hk, c.hv, c.dk, c.dv, c.tiled, dq, dk_, dv_, dg, db, dst, dout};
      g_gpu->gdn_chunked(g_gpu, &ga);
      float *go = dget(dout, nv), *gs = dget(dst, ns);
      const double tol = 1e-4;
      char what[160];
      for (int ref = 0; ref < 2; ref++) {
        snprintf(what, sizeof what,
                 "gdn chunked n=%lld hk=%d hv=%d dk=%d dv=%d tiled=%d slow=%d exact=%d cols=%d vs cpu %s",
                 (long long)n, c.hk, c.hv, c.dk, c.dv, c.tiled, cfgs[ci][6], exact, cols, ref ? "recurrent" : "chunked");
        cmp(what, go, ref ? out_r : out_c, nv, tol);
        strcat(what, " state");
        cmp(what, gs, ref ? st_r : st_c, ns, tol);
      }
      free(go), free(gs), dfree(dst), dfree(dout);
    }
    cuda_backend_set_exact(g_gpu, 1); /* back to the tests' defaults (exact, scan columns by shape) */
    cuda_backend_set_gdn_scan_cols(g_gpu, 0);
    dfree(dq), dfree(dk_), dfree(dv_), dfree(dg), dfree(db);
    free(st_c), free(out_c), free(st_r), free(out_r);
    gdn_case_free(&c);
  }
}

/* Prefill GDN from a nonzero state at the 0.8B shape (hk 16, hv 16, dk = dv = 128; 512 and
 * 4096 tokens) and the 9B / 35B-A3B shape (hk 16, hv 32; 8192 tokens): the token-sequential
 * kernel (gdn_recurrent; not at 8192) against the chunk-64 kernels (f32) with 16 and 32 state
 * columns per scan block. */
static void bench_gdn(void) {
  const int shapes[][3] = {{512, 16, 16}, {4096, 16, 16}, {8192, 16, 32}}; /* n, hk, hv */
  for (int si = 0; si < 3; si++) {
    gdn_case c;
    gdn_case_make(&c, shapes[si][0], shapes[si][1], shapes[si][2], 128, 128, 0, 0);
    const int64_t n = c.n, nq = n * c.hk * c.dk, nv = n * c.hv * c.dv, ns = (int64_t)c.hv * c.dk * c.dv;
    float *dq = dput(c.q, sizeof(float) * (size_t)nq), *dk_ = dput(c.k, sizeof(float) * (size_t)nq);
    float *dv_ = dput(c.v, sizeof(float) * (size_t)nv), *dg = dput(c.g, sizeof(float) * (size_t)(n * c.hv));
    float *db = dput(c.beta, sizeof(float) * (size_t)(n * c.hv));
    float *dst = dput(c.st0, sizeof(float) * (size_t)ns), *dout = dnan(nv);
    ops_gdn_args ga = {n, c.hk, c.hv, c.dk, c.dv, c.tiled, dq, dk_, dv_, dg, db, dst, dout};
    for (int mode = n > 4096 ? 1 : 0; mode < 3; mode++) { /* recurrent, chunked 16, chunked 32 */
      cuda_backend_set_gdn_scan_cols(g_gpu, mode == 2 ? 32 : 16);
      for (int i = 0; i < 3; i++) /* warm-up (and the scratch allocation) */
        mode ? g_gpu->gdn_chunked(g_gpu, &ga) : g_gpu->gdn_recurrent(g_gpu, &ga);
      float sync1;
      g_gpu->download(g_gpu, &sync1, dout, sizeof sync1);
      gpu_status("gdn bench warmup");
      const int reps = n > 512 ? 10 : 50;
      double t0 = now_s();
      for (int i = 0; i < reps; i++) mode ? g_gpu->gdn_chunked(g_gpu, &ga) : g_gpu->gdn_recurrent(g_gpu, &ga);
      g_gpu->download(g_gpu, &sync1, dout, sizeof sync1);
      gpu_status("gdn bench");
      printf("  gdn %-18s %4lld tok, hk %d hv %d dk=dv=128: %8.1f us per call\n",
             mode == 0 ? "recurrent" : mode == 1 ? "chunked, 16 cols" : "chunked, 32 cols", (long long)n, c.hk, c.hv,
             (now_s() - t0) / reps * 1e6);
    }
    cuda_backend_set_gdn_scan_cols(g_gpu, 0);
    dfree(dq), dfree(dk_), dfree(dv_), dfree(dg), dfree(db), dfree(dst), dfree(dout);
    gdn_case_free(&c);
  }
}

/* E experts: gate (2I rows when fused, gate then up), up (unless fused) and down weights of
 * the given types, with their f32 values (keep_f32) for the host bounds. */
typedef struct moe_mats {
  int E, fused, H, I;
  ops_weight *gate, *up, *down;
  float **gf, **uf, **df; /* [E] f32 values, NULL unless kept */
} moe_mats;

static void moe_mats_make(moe_mats *m, int E, int fused, int tg, int tu, int td, int H, int I, int keep_f32) {
  memset(m, 0, sizeof *m);
  m->E = E, m->fused = fused, m->H = H, m->I = I;
  m->gate = calloc((size_t)E, sizeof(ops_weight)), m->up = calloc((size_t)E, sizeof(ops_weight));
  m->down = calloc((size_t)E, sizeof(ops_weight));
  m->gf = calloc((size_t)E, sizeof(float *)), m->uf = calloc((size_t)E, sizeof(float *));
  m->df = calloc((size_t)E, sizeof(float *));
  for (int e = 0; e < E; e++) {
    const int64_t gr = fused ? 2 * (int64_t)I : I;
    m->gate[e] = (ops_weight){tg, make_weight(tg, gr, H, &m->gf[e]), gr, H};
    if (!fused) m->up[e] = (ops_weight){tu, make_weight(tu, I, H, &m->uf[e]), I, H};
    m->down[e] = (ops_weight){td, make_weight(td, H, I, &m->df[e]), H, I};
    if (!keep_f32) {
      free(m->gf[e]), free(m->uf[e]), free(m->df[e]);
      m->gf[e] = m->uf[e] = m->df[e] = NULL;
    }
  }
}

static void moe_mats_free(moe_mats *m) {
  for (int e = 0; e < m->E; e++) {
    free((void *)m->gate[e].data), free((void *)m->down[e].data), free(m->gf[e]), free(m->uf[e]), free(m->df[e]);
    if (!m->fused) free((void *)m->up[e].data);
  }
  free(m->gate), free(m->up), free(m->down), free(m->gf), free(m->uf), free(m->df);
}

/* n tokens routed to k distinct experts each (uniformly at random), positive weights. */
static void moe_route_random(int32_t *idx, float *w, int64_t n, int E, int k) {
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)E);
  for (int e = 0; e < E; e++) perm[e] = e;
  for (int64_t t = 0; t < n; t++)
    for (int j = 0; j < k; j++) { /* partial Fisher-Yates */
      const int r = j + (int)(rnd() % (uint64_t)(E - j));
      const int32_t s = perm[j];
      perm[j] = perm[r], perm[r] = s;
      idx[t * k + j] = perm[j];
      w[t * k + j] = 0.5f * (frand() + 1.0f) + 0.05f;
    }
  free(perm);
}

/* moe_ffn at decode sizes in the default numerics (int8 activations in both expert products
 * where the types have int8 kernels) against bounds derived as test_matvec_int8's: rounding
 * a 32-block of activations to q * s, s = max|v| / 127, moves each element by at most
 * max|v_blk| / 254, so a dot over row w moves by at most sum_c |w_c| max|v_blk(c)| / 254
 * (times 1.01 for the f32 rounding of s and of the kernel's products), plus 1e-5 * sum_c
 * |w_c v_c| for the f32 accumulation. Three checks per output, all f64 on the host:
 * 1. h (the device's gate/up result, which the decode path leaves at the start of the
 *    scratch: n * k * I floats) against act(g) * u of the f32 weights and x: with eg, eu the
 *    bounds of the two dots and |silu'| <= 1.1, |h' - h| <= 1.1 eg (|u| + eu) + |silu(g)| eu;
 *    an id out of range must leave its h row exactly 0;
 * 2. out against sum_j w_j down_e . h' from the device's h': the matvec bound of the second
 *    product alone (both checks are about as tight as test_matvec_int8's);
 * 3. out against the CPU op (f32 activations): the two propagated, sum_j |w_j| sum_i |D_ri|
 *    (bh_i + max_blk(|h| + bh) / 254). Looser (it adds the first product's worst case over
 *    I terms), but it is the op's own contract;
 * and a decode-step graph of the same call, built then replayed, gives the same bits. */
static void moe_int8_check(const char *what, const moe_mats *m, const float *x, const int32_t *idx, const float *w,
                           int64_t n, int k, const float *ref, const float *dx, const int32_t *didx, const float *dw,
                           float *dscr) {
  const int64_t H = m->H, I = m->I, nk = n * k;
  const ops_weight *up = m->fused ? NULL : m->up;
  float *dy = dnan(n * H);
  g_gpu->moe_ffn(g_gpu, dy, dx, n, (int)H, didx, dw, k, m->E, m->gate, up, m->down, ACT_KIND_SILU, dscr);
  float *y = dget(dy, n * H), *hg = dget(dscr, nk * I);
  char cw[192];
  snprintf(cw, sizeof cw, "%s int8", what);
  gpu_status(cw);
  double *h64 = calloc((size_t)(nk * I), sizeof(double)), *bh = calloc((size_t)(nk * I), sizeof(double));
  double *ab = malloc(sizeof(double) * (size_t)((H + 31) / 32)); /* float experts' H, I: any multiple of 4 */
  int bad[3] = {0, 0, 0};
  double q[3] = {0, 0, 0};
  for (int64_t t = 0; t < n; t++) {
    const float *xt = x + t * H;
    for (int64_t b = 0; b < (H + 31) / 32; b++) {
      ab[b] = 0;
      for (int64_t c = b * 32; c < H && c < b * 32 + 32; c++) ab[b] = fmax(ab[b], fabs(xt[c]));
    }
    for (int j = 0; j < k; j++) {
      const int64_t p = t * k + j;
      const int e = idx[p];
      for (int64_t i = 0; i < I; i++) {
        if (e < 0) { /* out of range on the device (E or -1): nothing */
          if (hg[p * I + i] != 0.0f) bad[0]++;
          continue;
        }
        const float *gr = m->gf[e] + i * H, *ur = m->fused ? m->gf[e] + (I + i) * H : m->uf[e] + i * H;
        double g = 0, u = 0, bg = 0, bu = 0, mg = 0, mu = 0;
        for (int64_t c = 0; c < H; c++) {
          g += (double)gr[c] * xt[c], u += (double)ur[c] * xt[c];
          bg += fabs(gr[c]) * ab[c / 32] / 254.0, bu += fabs(ur[c]) * ab[c / 32] / 254.0;
          mg += fabs((double)gr[c] * xt[c]), mu += fabs((double)ur[c] * xt[c]);
        }
        const double eg = 1.01 * bg + 1e-5 * mg, eu = 1.01 * bu + 1e-5 * mu, sg = g / (1.0 + exp(-g));
        const double hv = sg * u, b = 1.1 * eg * (fabs(u) + eu) + fabs(sg) * eu + 1e-6 * fabs(hv);
        h64[p * I + i] = hv, bh[p * I + i] = b;
        const double err = fabs((double)hg[p * I + i] - hv);
        if (isnan(hg[p * I + i]) || !(err <= b)) bad[0]++;
        else q[0] = fmax(q[0], err / b);
      }
    }
    for (int64_t r = 0; r < H; r++) {
      double y2 = 0, b2 = 0, m2 = 0, b3 = 0, m3 = 0;
      for (int j = 0; j < k; j++) {
        const int64_t p = t * k + j;
        const int e = idx[p];
        if (e < 0) continue;
        const float *dr = m->df[e] + r * I, *hp = hg + p * I;
        const double *hv = h64 + p * I, *hb = bh + p * I;
        for (int64_t b0 = 0; b0 < I; b0 += 32) {
          const int64_t b1 = b0 + 32 < I ? b0 + 32 : I;
          double am = 0, am3 = 0;
          for (int64_t i = b0; i < b1; i++) am = fmax(am, fabs(hp[i])), am3 = fmax(am3, fabs(hv[i]) + hb[i]);
          for (int64_t i = b0; i < b1; i++) {
            const double wd = fabs((double)w[p] * dr[i]);
            y2 += (double)w[p] * dr[i] * hp[i], b2 += wd * am / 254.0, m2 += wd * fabs(hp[i]);
            b3 += wd * (hb[i] + am3 / 254.0), m3 += wd * (fabs(hv[i]) + hb[i]);
          }
        }
      }
      const double v = y[t * H + r], e2 = fabs(v - y2), e3 = fabs(v - ref[t * H + r]);
      const double bound2 = 1.01 * b2 + 1e-5 * m2 + 1e-6 * fabs(y2), bound3 = 1.01 * b3 + 1e-5 * m3 + 1e-6 * fabs(y2);
      if (isnan(y[t * H + r]) || !(e2 <= bound2)) bad[1]++;
      else q[1] = fmax(q[1], e2 / bound2);
      if (isnan(y[t * H + r]) || !(e3 <= bound3)) bad[2]++;
      else q[2] = fmax(q[2], e3 / bound3);
    }
  }
  static const char *const stage[3] = {"h (gate/up)", "out from the device's h (down)", "out vs the CPU op"};
  for (int s = 0; s < 3; s++) {
    g_checks++;
    if (bad[s]) {
      printf("  FAIL %s: %s: %d outside the int8 bound\n", cw, stage[s], bad[s]);
      g_fail++;
    }
  }
  printf("  %-52s error / bound: h %.3f, down %.3f, op %.3f\n", cw, q[0], q[1], q[2]);
  /* recorded: built, then replayed; the same bits as the eager call */
  cuda_backend_set_graphs(g_gpu, 1);
  for (int rep = 0; rep < 2; rep++) {
    float *dg = dnan(n * H);
    cuda_backend_step_begin(g_gpu, n);
    g_gpu->moe_ffn(g_gpu, dg, dx, n, (int)H, didx, dw, k, m->E, m->gate, up, m->down, ACT_KIND_SILU, dscr);
    cuda_backend_step_end(g_gpu);
    float *g = dget(dg, n * H);
    gpu_status(cw);
    g_checks++;
    if (memcmp(g, y, sizeof(float) * (size_t)(n * H))) {
      printf("  FAIL %s graph %d: differs from the eager result\n", cw, rep);
      g_fail++;
    }
    free(g), dfree(dg);
  }
  cuda_backend_set_graphs(g_gpu, 0);
  free(h64), free(bh), free(ab), free(y), free(hg), dfree(dy);
}

static void test_moe(void) {
  printf("moe\n");
  /* the last two: logits rounded to a few values, so equal logits compete (ties go to the
   * lower expert id, across lanes and within one) */
  const int rc[][5] = {/* n, E, k, renorm, ties */ {1, 8, 2, 1, 0},   {7, 16, 4, 0, 0},  {33, 128, 8, 1, 0},
                       {5, 256, 8, 1, 0},  {3, 1000, 10, 0, 0}, {4, 256, 8, 1, 1}, {2, 100, 32, 0, 1}};
  for (size_t c = 0; c < sizeof rc / sizeof rc[0]; c++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int64_t n = rc[c][0];
    const int E = rc[c][1], k = rc[c][2], renorm = rc[c][3];
    float *lg = hrand(n * E, 3.0f), *pe = c % 2 ? hrand(E, 1.0f) : NULL;
    if (rc[c][4])
      for (int64_t i = 0; i < n * E; i++) lg[i] = roundf(lg[i]);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(n * k));
    float *w = malloc(sizeof(float) * (size_t)(n * k));
    g_cpu->moe_route(g_cpu, idx, w, lg, n, E, k, renorm, pe);
    float *dlg = dput(lg, sizeof(float) * (size_t)(n * E));
    int32_t *didx = g_gpu->alloc(g_gpu, sizeof(int32_t) * (size_t)(n * k));
    float *dw = dnan(n * k);
    g_gpu->moe_route(g_gpu, didx, dw, dlg, n, E, k, renorm, pe);
    int32_t *gidx = malloc(sizeof(int32_t) * (size_t)(n * k));
    g_gpu->download(g_gpu, gidx, didx, sizeof(int32_t) * (size_t)(n * k));
    char what[64];
    snprintf(what, sizeof what, "moe_route n=%lld E=%d k=%d", (long long)n, E, k);
    g_checks++;
    if (memcmp(gidx, idx, sizeof(int32_t) * (size_t)(n * k))) {
      printf("  FAIL %s: expert ids differ\n", what);
      g_fail++;
    }
    cmpd(what, dw, w, n * k, 1e-5);
    dfree(dlg), dfree(didx), dfree(dw), free(lg), free(pe), free(idx), free(w), free(gidx);
  }
  /* moe_ffn: decode (n <= 8: device-side kernels, also replayed as a graph) and prefill
   * sizes (host-grouped), separate and fused gate/up, float and quantized experts, gate/up
   * and down of different types, odd expert counts, ids out of range (decode only: E on the
   * device, where the kernels skip it, and -1 on the CPU, whose op skips that; or -1 on
   * both). Exact mode first (f32 kernels: 1e-4), then for decode sizes the default numerics
   * (moe_int8_check) and the f32 decode variant in default mode (1e-4). */
  const int fc[][10] = {
      /* n, fused, gate, up, down type, H, I, E, k, out of range (1: E, 2: -1) */
      {1, 0, ANNA_DTYPE_BF16, ANNA_DTYPE_BF16, ANNA_DTYPE_BF16, 64, 96, 8, 2, 0},
      {20, 1, ANNA_DTYPE_BF16, ANNA_DTYPE_BF16, ANNA_DTYPE_BF16, 64, 96, 8, 2, 0},
      {3, 0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, 256, 512, 8, 2, 0},
      {40, 1, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0, 96, 160, 8, 2, 0},
      {8, 0, ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q6_K, 256, 256, 8, 2, 0},
      {2, 1, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_IQ4_XS, 256, 512, 8, 2, 0},
      {5, 1, ANNA_DTYPE_F32, ANNA_DTYPE_F32, ANNA_DTYPE_F32, 40, 24, 8, 2, 0},
      {1, 0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K, 512, 256, 7, 4, 1},
      {2, 1, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K, 256, 512, 9, 3, 2},
      {8, 0, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0, 512, 512, 13, 8, 1},
      {3, 1, ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q6_K, 512, 256, 5, 2, 0},
      {2, 0, ANNA_DTYPE_Q5_K, ANNA_DTYPE_Q5_K, ANNA_DTYPE_Q8_0, 256, 96, 8, 2, 0},
      {8, 1, ANNA_DTYPE_Q4_0, ANNA_DTYPE_Q4_0, ANNA_DTYPE_IQ4_NL, 96, 160, 11, 4, 2},
      {1, 0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q4_K, 256, 256, 8, 2, 0},
      {1, 0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0, 2816, 704, 6, 3, 0},
  };
  for (size_t c = 0; c < sizeof fc / sizeof fc[0]; c++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int64_t n = fc[c][0];
    const int fused = fc[c][1], tg = fc[c][2], tu = fc[c][3], td = fc[c][4], H = fc[c][5], I = fc[c][6];
    const int E = fc[c][7], k = fc[c][8], oor = fc[c][9];
    moe_mats m;
    moe_mats_make(&m, E, fused, tg, tu, td, H, I, 1);
    float *x = hrand(n * H, 1.0f), *w = malloc(sizeof(float) * (size_t)(n * k));
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(n * k)), *gidx = malloc(sizeof(int32_t) * (size_t)(n * k));
    moe_route_random(idx, w, n, E, k);
    memcpy(gidx, idx, sizeof(int32_t) * (size_t)(n * k));
    if (oor == 1) idx[k - 1] = -1, gidx[k - 1] = E;
    if (oor == 2) idx[n * k - 1] = gidx[n * k - 1] = -1;
    const int64_t sf = ops_moe_scratch_floats(n, k, H, I);
    float *scratch = malloc(sizeof(float) * (size_t)sf), *ref = malloc(sizeof(float) * (size_t)(n * H));
    /* f32 activations on both sides (the CPU's default would quantize them to 8 bits) */
    cpu_backend_set_exact_matmul(g_cpu, 1);
    g_cpu->moe_ffn(g_cpu, ref, x, n, H, idx, w, k, E, m.gate, fused ? NULL : m.up, m.down, ACT_KIND_SILU, scratch);
    float *dx = dput(x, sizeof(float) * (size_t)(n * H)), *dw = dput(w, sizeof(float) * (size_t)(n * k));
    int32_t *didx = dput(gidx, sizeof(int32_t) * (size_t)(n * k));
    float *dscr = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)sf), *dy = dnan(n * H);
    g_gpu->moe_ffn(g_gpu, dy, dx, n, H, didx, dw, k, E, m.gate, fused ? NULL : m.up, m.down, ACT_KIND_SILU, dscr);
    char what[128];
    snprintf(what, sizeof what, "moe_ffn n=%lld E=%d k=%d %s/%s/%s%s", (long long)n, E, k, dtype_name(tg),
             dtype_name(fused ? tg : tu), dtype_name(td), fused ? " fused" : "");
    cpu_backend_set_exact_matmul(g_cpu, 0);
    const double tol = 1e-4;
    cmpd(what, dy, ref, n * H, tol);
    if (n <= 8) {
      /* the same op captured into a decode-step graph, built then replayed */
      cuda_backend_set_graphs(g_gpu, 1);
      for (int rep = 0; rep < 2; rep++) {
        float *dg = dnan(n * H);
        cuda_backend_step_begin(g_gpu, n);
        g_gpu->moe_ffn(g_gpu, dg, dx, n, H, didx, dw, k, E, m.gate, fused ? NULL : m.up, m.down, ACT_KIND_SILU, dscr);
        cuda_backend_step_end(g_gpu);
        char gw[160];
        snprintf(gw, sizeof gw, "%s graph %d", what, rep);
        cmpd(gw, dg, ref, n * H, tol);
        dfree(dg);
      }
      cuda_backend_set_graphs(g_gpu, 0);
      /* default numerics: the int8 kernels where the types have them */
      cuda_backend_set_exact(g_gpu, 0);
      moe_int8_check(what, &m, x, idx, w, n, k, ref, dx, didx, dw, dscr);
      /* the f32 decode kernels kept as a variant: f32 arithmetic in default mode too */
      cuda_backend_set_moe_variant(g_gpu, CUDA_MOE_DECODE_F32);
      float *df = dnan(n * H);
      g_gpu->moe_ffn(g_gpu, df, dx, n, H, didx, dw, k, E, m.gate, fused ? NULL : m.up, m.down, ACT_KIND_SILU, dscr);
      char fw[160];
      snprintf(fw, sizeof fw, "%s f32 variant", what);
      cmpd(fw, df, ref, n * H, tol);
      dfree(df);
      cuda_backend_set_moe_variant(g_gpu, CUDA_MOE_DEFAULT);
      cuda_backend_set_exact(g_gpu, 1);
    }
    dfree(dx), dfree(dw), dfree(didx), dfree(dscr), dfree(dy);
    moe_mats_free(&m);
    free(x), free(w), free(idx), free(gidx), free(scratch), free(ref);
  }
}

/* Early launch of a recorded step (cuda_backend_set_graph_piece): a step of ~160 dependent
 * ops (an uploaded id, its embedding row, then rmsnorm, bf16 matvec, scale and residual add
 * 40 times, ending in a download) with the first piece at 0 (off), 1, 7, 48 nodes and around
 * the step's length; three steps each (the graphs built, replayed, then updated for a new id).
 * Every result bit-identical to the eager run of the same id, and one launch counted per
 * step. */
static void test_graph_pieces(void) {
  printf("graph pieces (early launch)\n");
  enum { D = 256, V = 16, L = 40 };
  float *tf, *wf[3];
  void *tab = make_weight(ANNA_DTYPE_BF16, V, D, &tf), *w[3];
  ops_weight ot = {ANNA_DTYPE_BF16, tab, V, D}, ow[3];
  for (int i = 0; i < 3; i++) w[i] = make_weight(ANNA_DTYPE_BF16, D, D, &wf[i]), ow[i] = (ops_weight){ANNA_DTYPE_BF16, w[i], D, D};
  float *nw = hrand(D, 1.0f), *dy = dnan(D), *dn = dnan(D), *dt = dnan(D);
  int32_t *did = g_gpu->alloc(g_gpu, sizeof(int32_t));
  float ref[V][D], got[D];
  const int ids[3] = {3, 3, 11};
  for (int pass = 0; pass < 2; pass++) { /* 0: eager references; 1: recorded */
    const int64_t pieces[] = {0, 1, 7, 48, 160, 161, 162, 163, 1000};
    const int np = pass ? (int)(sizeof pieces / sizeof pieces[0]) : 1;
    for (int pi = 0; pi < np; pi++) {
      cuda_backend_set_graphs(g_gpu, pass);
      cuda_backend_set_graph_piece(g_gpu, pieces[pi]);
      for (int s = 0; s < (pass ? 3 : 2); s++) {
        const int32_t id = pass ? ids[s] : ids[s + 1];
        int64_t l0, l1, b0, u0;
        cuda_backend_graph_stats(g_gpu, &l0, &b0, &u0);
        cuda_backend_step_begin(g_gpu, 1);
        g_gpu->upload(g_gpu, did, &id, sizeof id);
        g_gpu->embed(g_gpu, dy, &ot, did, 1, 1.0f);
        for (int i = 0; i < L; i++) {
          g_gpu->rmsnorm(g_gpu, dn, dy, nw, 1, D, 1e-6f, 0);
          g_gpu->matmul(g_gpu, dt, dn, 1, &ow[i % 3], NULL);
          g_gpu->scale(g_gpu, dt, 0.5f, D);
          g_gpu->add(g_gpu, dy, dt, D);
        }
        g_gpu->download(g_gpu, pass ? got : ref[id], dy, sizeof got);
        cuda_backend_step_end(g_gpu);
        char what[96];
        snprintf(what, sizeof what, "graph pieces: first piece %lld, step %d", (long long)pieces[pi], s);
        gpu_status(what);
        cuda_backend_graph_stats(g_gpu, &l1, &b0, &u0);
        if (!pass) continue;
        g_checks++;
        if (memcmp(got, ref[id], sizeof got) || l1 != l0 + 1) {
          printf("  FAIL %s: %s\n", what, l1 != l0 + 1 ? "launches not counted once" : "differs from the eager run");
          g_fail++;
        }
      }
    }
  }
  cuda_backend_set_graphs(g_gpu, 0);
  cuda_backend_set_graph_piece(g_gpu, 48);
  dfree(dy), dfree(dn), dfree(dt), dfree(did);
  free(tab), free(tf), free(nw);
  for (int i = 0; i < 3; i++) free(w[i]), free(wf[i]);
  cuda_backend_drop_mirrors(g_gpu);
}

/* ---- MoE prefill: grouped GEMMs on the device ---- */

/* E experts of one type (gate/up separate or fused as 2I rows), and n tokens routed to k
 * distinct experts each (uniformly at random) with positive weights. */
typedef struct moe_case {
  int64_t n;
  int E, k, H, I, type, fused;
  ops_weight *gate, *up, *down;
  void **mem;
  int nm;
  float *x, *w;
  int32_t *idx;
} moe_case;

static void moe_case_make(moe_case *c, int64_t n, int E, int k, int H, int I, int type, int fused) {
  memset(c, 0, sizeof *c);
  c->n = n, c->E = E, c->k = k, c->H = H, c->I = I, c->type = type, c->fused = fused;
  c->gate = malloc(sizeof(ops_weight) * (size_t)E), c->up = malloc(sizeof(ops_weight) * (size_t)E);
  c->down = malloc(sizeof(ops_weight) * (size_t)E);
  c->mem = malloc(sizeof(void *) * (size_t)(3 * E));
  for (int e = 0; e < E; e++) {
    float *f;
    void *p = make_weight(type, fused ? 2 * I : I, H, &f);
    free(f);
    c->gate[e] = (ops_weight){type, p, fused ? 2 * I : I, H};
    c->mem[c->nm++] = p;
    if (!fused) {
      p = make_weight(type, I, H, &f);
      free(f);
      c->up[e] = (ops_weight){type, p, I, H};
      c->mem[c->nm++] = p;
    }
    p = make_weight(type, H, I, &f);
    free(f);
    c->down[e] = (ops_weight){type, p, H, I};
    c->mem[c->nm++] = p;
  }
  c->x = hrand(n * H, 1.0f);
  c->w = malloc(sizeof(float) * (size_t)(n * k));
  c->idx = malloc(sizeof(int32_t) * (size_t)(n * k));
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)E);
  for (int e = 0; e < E; e++) perm[e] = e;
  for (int64_t t = 0; t < n; t++)
    for (int j = 0; j < k; j++) { /* partial Fisher-Yates: k distinct experts */
      const int r = j + (int)(rnd() % (uint64_t)(E - j));
      const int32_t s = perm[j];
      perm[j] = perm[r], perm[r] = s;
      c->idx[t * k + j] = perm[j];
      c->w[t * k + j] = 0.5f * (frand() + 1.0f) + 0.05f;
    }
  free(perm);
}

static void moe_case_free(moe_case *c) {
  for (int i = 0; i < c->nm; i++) free(c->mem[i]);
  free(c->mem), free(c->gate), free(c->up), free(c->down), free(c->x), free(c->w), free(c->idx);
}

/* moe_ffn above the decode range against the CPU op (exact matmul: f32 activations):
 * - exact mode 1 (host-grouped path, f32 SGEMMs): 1e-4 of the output scale, f32 rounding;
 * - exact mode 0 (grouped GEMMs on tensor cores), the automatic token tile and each forced
 *   one (16, 32, 64 pairs): the bounds of the dense tensor-core GEMM test, since each of the
 *   two chained products has that GEMM's numerics (activations and h split into bf16 hi +
 *   lo: 16 significant bits; quantized weights rounded to bf16: 2^-9 relative; f32
 *   accumulation): 1e-4 for bf16 experts (used exactly), 1e-2 for quantized ones, while a
 *   wrong slot, tile or expert gives O(1). The automatic tile is run twice: bitwise equal
 *   (no float atomics anywhere).
 * Shapes: n 9..777, E 8 (every expert busy, many tiles each) and 256 (most experts with a
 * few pairs, some with none), H 256..2048 (300: bf16 rows that end mid-unit), I 96..512
 * (not multiples of the 64-column K step), fused and separate gate/up, k 8 and 2. */
/* act_matmul (the FFN activation folded into the down projection's int8 prologue at decode
 * sizes) against act_mul + matmul on the GPU (the same arithmetic: silu identical, gelu to
 * 1e-6 as its fused multiply-adds may contract differently) and against the CPU op (exact f32
 * reference; 3e-2 as for the int8 matvecs: the activation rounding, bounded per element by
 * test_matvec_int8). Separate gate/up rows and one [n, 2d] gate|up buffer; n = 9 takes the
 * unfused path; bf16 weights never fold. */
static void test_act_matmul(void) {
  printf("act_matmul\n");
  const int types[] = {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q6_K, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_BF16};
  const int64_t ns[] = {1, 2, 3, 8, 9};
  const int64_t d = 512, rows = 300;
  cuda_backend_set_exact(g_gpu, 0);
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    cuda_backend_drop_mirrors(g_gpu);
    float *wf;
    void *w = make_weight(types[ti], rows, d, &wf);
    ops_weight ow = {types[ti], w, rows, d};
    for (int layout = 0; layout < 2; layout++)
      for (int act = 0; act < 2; act++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
          const int64_t n = ns[ni], gs = layout ? 2 * d : d;
          const int ak = act ? ACT_KIND_GELU_TANH : ACT_KIND_SILU;
          float *gu = hrand(n * 2 * d, 2.0f), *h = malloc(sizeof(float) * (size_t)(n * d));
          float *ref = malloc(sizeof(float) * (size_t)(n * rows));
          const float *hg = gu, *hu = layout ? gu + d : gu + n * d;
          cpu_backend_set_exact_matmul(g_cpu, 1);
          g_cpu->act_matmul(g_cpu, ref, h, hg, hu, n, gs, gs, ak, &ow);
          cpu_backend_set_exact_matmul(g_cpu, 0);
          float *dgu = dput(gu, sizeof(float) * (size_t)(n * 2 * d));
          const float *dg = dgu, *du = layout ? dgu + d : dgu + n * d;
          float *dh = dnan(n * d), *dy = dnan(n * rows), *dy2 = dnan(n * rows), *dh2 = dnan(n * d);
          g_gpu->act_matmul(g_gpu, dy, dh, dg, du, n, gs, gs, ak, &ow);
          g_gpu->act_mul(g_gpu, dh2, dg, du, n, (int)d, gs, gs, ak);
          g_gpu->matmul(g_gpu, dy2, dh2, n, &ow, NULL);
          float *sep = dget(dy2, n * rows);
          char what[128];
          snprintf(what, sizeof what, "act_matmul %s n=%lld %s %s", dtype_name(types[ti]), (long long)n,
                   layout ? "gate|up" : "gate, up", act ? "gelu" : "silu");
          cmpd(what, dy, sep, n * rows, act ? 1e-6 : 0.0);
          strcat(what, " vs cpu");
          cmpd(what, dy, ref, n * rows, 3e-2);
          free(sep), free(gu), free(h), free(ref);
          dfree(dgu), dfree(dh), dfree(dy), dfree(dy2), dfree(dh2);
        }
    free(w), free(wf);
  }
  cuda_backend_set_exact(g_gpu, 1);
}

/* act_matmul_gated_add (the MoE shared expert's gated output added into the residual: at
 * decode sizes the gate and the add ride in the int8 down projection's epilogue) against the
 * GPU's own act_matmul + mul_sigmoid + add on the same inputs (the same bits: memcmp) and
 * against the CPU ops composed the same way with an exact matmul (3e-2 as test_act_matmul).
 * y starts random (the op adds into it); one gate per token at strides 1 and 3; n = 9 takes
 * the composed path, bf16 weights never fold. */
static void test_act_matmul_gated_add(void) {
  printf("act_matmul_gated_add\n");
  if (!g_gpu->act_matmul_gated_add) {
    printf("  FAIL act_matmul_gated_add: not in the cuda op table\n");
    g_fail++;
    return;
  }
  const int types[] = {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q6_K, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_BF16};
  const int64_t ns[] = {1, 2, 3, 8, 9}, gsts[] = {1, 3};
  const int64_t d = 512, rows = 300;
  cuda_backend_set_exact(g_gpu, 0);
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    cuda_backend_drop_mirrors(g_gpu);
    float *wf;
    void *w = make_weight(types[ti], rows, d, &wf);
    ops_weight ow = {types[ti], w, rows, d};
    for (size_t si = 0; si < sizeof gsts / sizeof gsts[0]; si++)
      for (int act = 0; act < 2; act++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
          const int64_t n = ns[ni], gst = gsts[si];
          const int ak = act ? ACT_KIND_GELU_TANH : ACT_KIND_SILU;
          float *gu = hrand(n * 2 * d, 2.0f), *sg = hrand(n * gst, 4.0f), *y0 = hrand(n * rows, 1.0f);
          float *h = malloc(sizeof(float) * (size_t)(n * d)), *tmp = malloc(sizeof(float) * (size_t)(n * rows));
          float *ref = hcopy(y0, n * rows);
          const float *hg = gu, *hu = gu + n * d;
          cpu_backend_set_exact_matmul(g_cpu, 1);
          g_cpu->act_matmul(g_cpu, tmp, h, hg, hu, n, d, d, ak, &ow);
          cpu_backend_set_exact_matmul(g_cpu, 0);
          g_cpu->mul_sigmoid(g_cpu, tmp, sg, n, (int)rows, gst, 1);
          g_cpu->add(g_cpu, ref, tmp, n * rows);
          float *dgu = dput(gu, sizeof(float) * (size_t)(n * 2 * d)), *dsg = dput(sg, sizeof(float) * (size_t)(n * gst));
          const float *dg = dgu, *du = dgu + n * d;
          float *dy = dput(y0, sizeof(float) * (size_t)(n * rows)), *dy2 = dput(y0, sizeof(float) * (size_t)(n * rows));
          float *dt = dnan(n * rows), *dh = dnan(n * d), *dt2 = dnan(n * rows), *dh2 = dnan(n * d);
          g_gpu->act_matmul_gated_add(g_gpu, dy, dt, dh, dg, du, n, d, d, ak, dsg, gst, &ow);
          g_gpu->act_matmul(g_gpu, dt2, dh2, dg, du, n, d, d, ak, &ow);
          g_gpu->mul_sigmoid(g_gpu, dt2, dsg, n, (int)rows, gst, 1);
          g_gpu->add(g_gpu, dy2, dt2, n * rows);
          float *fused = dget(dy, n * rows), *sep = dget(dy2, n * rows);
          char what[128];
          snprintf(what, sizeof what, "act_matmul_gated_add %s n=%lld gstride %lld %s", dtype_name(types[ti]),
                   (long long)n, (long long)gst, act ? "gelu" : "silu");
          gpu_status(what);
          g_checks++;
          if (memcmp(fused, sep, sizeof(float) * (size_t)(n * rows))) {
            printf("  FAIL %-58s differs from act_matmul + mul_sigmoid + add\n", what);
            g_fail++;
          }
          strcat(what, " vs cpu");
          cmp(what, fused, ref, n * rows, 3e-2);
          free(fused), free(sep), free(gu), free(sg), free(y0), free(h), free(tmp), free(ref);
          dfree(dgu), dfree(dsg), dfree(dy), dfree(dy2), dfree(dt), dfree(dh), dfree(dt2), dfree(dh2);
        }
    free(w), free(wf);
  }
  cuda_backend_set_exact(g_gpu, 1);
}

static void test_moe_grouped(void) {
  printf("moe grouped (prefill)\n");
  const int cs[][7] = {/* n, E, k, H, I, type, fused */
                       {9, 8, 8, 256, 128, ANNA_DTYPE_BF16, 0},    {9, 256, 8, 256, 256, ANNA_DTYPE_Q4_K, 0},
                       {33, 8, 8, 384, 160, ANNA_DTYPE_Q8_0, 1},   {33, 256, 8, 512, 256, ANNA_DTYPE_Q4_K, 1},
                       {512, 256, 8, 2048, 512, ANNA_DTYPE_Q4_K, 0}, {777, 256, 8, 1024, 256, ANNA_DTYPE_Q6_K, 1},
                       {777, 8, 8, 300, 136, ANNA_DTYPE_BF16, 1},  {512, 8, 8, 256, 512, ANNA_DTYPE_Q6_K, 0},
                       {100, 8, 2, 288, 96, ANNA_DTYPE_Q8_0, 0}};
  /* mode 5: default tiles with split activations for every type (CUDA_GEMM_BF16_SPLIT);
   * 6, 7: the cuBLAS path (quantized experts; bf16 ones fall back to the tile kernels) as
   * one grouped call and as a loop of GEMMs; 8, 9: the pipelined and the plain tile kernel
   * on experts dequantized first (also quantized experts only) */
  const int variants[] = {CUDA_MOE_DEFAULT, CUDA_MOE_T16,    CUDA_MOE_T32,         CUDA_MOE_T64, CUDA_MOE_DEFAULT,
                          CUDA_MOE_CUBLAS,  CUDA_MOE_CUBLAS_LOOP, CUDA_MOE_PIPE, CUDA_MOE_PREDEQ};
  for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
    cuda_backend_drop_mirrors(g_gpu);
    moe_case c;
    moe_case_make(&c, cs[ci][0], cs[ci][1], cs[ci][2], cs[ci][3], cs[ci][4], cs[ci][5], cs[ci][6]);
    const int64_t n = c.n, nk = n * c.k, sf = ops_moe_scratch_floats(n, c.k, c.H, c.I);
    float *scratch = malloc(sizeof(float) * (size_t)sf), *ref = malloc(sizeof(float) * (size_t)(n * c.H));
    cpu_backend_set_exact_matmul(g_cpu, 1);
    g_cpu->moe_ffn(g_cpu, ref, c.x, n, c.H, c.idx, c.w, c.k, c.E, c.gate, c.fused ? NULL : c.up, c.down,
                   ACT_KIND_SILU, scratch);
    cpu_backend_set_exact_matmul(g_cpu, 0);
    float *dx = dput(c.x, sizeof(float) * (size_t)(n * c.H)), *dw = dput(c.w, sizeof(float) * (size_t)nk);
    int32_t *didx = dput(c.idx, sizeof(int32_t) * (size_t)nk);
    float *dscr = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)sf);
    float *first = NULL;
    for (int mode = 0; mode < 1 + (int)(sizeof variants / sizeof variants[0]); mode++) {
      const int exact = mode == 0;
      cuda_backend_set_exact(g_gpu, exact);
      if (!exact) cuda_backend_set_moe_variant(g_gpu, variants[mode - 1]);
      cuda_backend_set_gemm_variant(g_gpu, mode == 5 ? CUDA_GEMM_BF16_SPLIT : CUDA_GEMM_BF16);
      float *dy = dnan(n * c.H);
      g_gpu->moe_ffn(g_gpu, dy, dx, n, c.H, didx, dw, c.k, c.E, c.gate, c.fused ? NULL : c.up, c.down, ACT_KIND_SILU,
                     dscr);
      cuda_backend_set_gemm_variant(g_gpu, CUDA_GEMM_BF16);
      char what[128];
      static const char *const mname[] = {"exact",         "grouped", "grouped t16", "grouped t32",
                                          "grouped t64",   "grouped split", "cublas",  "cublas loop",
                                          "pipe (predeq)", "predeq"};
      snprintf(what, sizeof what, "moe_ffn n=%lld E=%d k=%d H=%d I=%d %s%s %s", (long long)n, c.E, c.k, c.H, c.I,
               dtype_name(c.type), c.fused ? " fused" : "", mname[mode]);
      const double tol = exact || c.type == ANNA_DTYPE_BF16 ? 1e-4 : 1e-2;
      float *g = dget(dy, n * c.H);
      cmp(what, g, ref, n * c.H, tol);
      if (mode == 1) {
        first = g, g = NULL;
        /* again: the same bits */
        float *dz = dnan(n * c.H);
        g_gpu->moe_ffn(g_gpu, dz, dx, n, c.H, didx, dw, c.k, c.E, c.gate, c.fused ? NULL : c.up, c.down,
                       ACT_KIND_SILU, dscr);
        float *g2 = dget(dz, n * c.H);
        gpu_status(what);
        g_checks++;
        if (memcmp(g2, first, sizeof(float) * (size_t)(n * c.H))) {
          printf("  FAIL %s: a second run differs\n", what);
          g_fail++;
        }
        free(g2), dfree(dz);
      }
      free(g), dfree(dy);
    }
    cuda_backend_set_moe_variant(g_gpu, CUDA_MOE_DEFAULT);
    cuda_backend_set_exact(g_gpu, 1); /* back to the tests' default (exact) */
    dfree(dx), dfree(dw), dfree(didx), dfree(dscr);
    free(first), free(scratch), free(ref);
    moe_case_free(&c);
  }
}

/* MoE decode on the 35B-A3B layer shape (E 256, top-8, H 2048, I 512, separate gate/up): the
 * int8-activation kernels (default) against the f32 ones (CUDA_MOE_DECODE_F32), n = 1 and 4
 * tokens. A step is NL calls with different random routings (as layers: 8 x 8 experts of
 * ~1.8 MB each at Q4_K, more than the 50 MB L2 holds, so a replay reads its experts from
 * memory), recorded as a graph; us per call = the replay's device time / NL. GB/s counts the
 * expert rows a call must read: gate, up and down of each distinct expert of its tokens. */
static void bench_moe_decode(int tgu, int td) {
  enum { NL = 8, NMAX = 4 };
  const int E = 256, k = 8, H = 2048, I = 512;
  printf("bench moe decode (E 256, k 8, H 2048, I 512, gate/up %s, down %s)\n", dtype_name(tgu), dtype_name(td));
  cuda_backend_drop_mirrors(g_gpu);
  moe_mats m;
  moe_mats_make(&m, E, 0, tgu, tgu, td, H, I, 0);
  const double ebytes = 2.0 * I * dtype_row_bytes(tgu, H) + (double)H * dtype_row_bytes(td, I);
  float *x = hrand(NMAX * H, 1.0f), *dx = dput(x, sizeof(float) * (size_t)(NMAX * H));
  int32_t idx[NL][NMAX * 8], *didx[NL];
  float w[NL][NMAX * 8], *dw[NL];
  for (int l = 0; l < NL; l++) {
    moe_route_random(idx[l], w[l], NMAX, E, k);
    didx[l] = dput(idx[l], sizeof idx[l]), dw[l] = dput(w[l], sizeof w[l]);
  }
  float *dscr = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)ops_moe_scratch_floats(NMAX, k, H, I));
  float *dy = dnan(NMAX * H), res[4];
  const int ns[] = {1, NMAX}, variants[] = {CUDA_MOE_DEFAULT, CUDA_MOE_DECODE_F32};
  cuda_backend_set_exact(g_gpu, 0);
  for (int ni = 0; ni < 2; ni++) {
    const int n = ns[ni];
    double bytes = 0; /* distinct experts per call */
    for (int l = 0; l < NL; l++)
      for (int p = 0; p < n * k; p++) {
        int seen = 0;
        for (int q = 0; q < p; q++) seen |= idx[l][q] == idx[l][p];
        if (!seen) bytes += ebytes;
      }
    for (int v = 0; v < 2; v++) {
      cuda_backend_set_moe_variant(g_gpu, variants[v]);
      for (int l = 0; l < NL; l++) /* warm-up: mirrors and tables made outside the step */
        g_gpu->moe_ffn(g_gpu, dy, dx, n, H, didx[l], dw[l], k, E, m.gate, m.up, m.down, ACT_KIND_SILU, dscr);
      gpu_status("moe decode bench warmup");
      cuda_backend_set_graphs(g_gpu, 1);
      double best = 1e9;
      for (int rep = 0; rep < 10; rep++) {
        double cap, upd, gpu0, gpu1;
        cuda_backend_graph_times(g_gpu, &cap, &upd, &gpu0);
        cuda_backend_step_begin(g_gpu, n);
        for (int l = 0; l < NL; l++)
          g_gpu->moe_ffn(g_gpu, dy, dx, n, H, didx[l], dw[l], k, E, m.gate, m.up, m.down, ACT_KIND_SILU, dscr);
        g_gpu->download(g_gpu, res, dy, sizeof res);
        cuda_backend_step_end(g_gpu);
        gpu_status("moe decode bench");
        cuda_backend_graph_times(g_gpu, &cap, &upd, &gpu1);
        if (rep > 1 && gpu1 - gpu0 < best) best = gpu1 - gpu0; /* the first reps build the graph */
      }
      cuda_backend_set_graphs(g_gpu, 0);
      printf("  moe decode n=%d %-8s: %7.1f us per call, %6.0f GB/s of expert rows (%.1f MB per call)\n", n,
             v ? "f32" : "int8", best / NL * 1e6, bytes / best / 1e9, bytes / NL / 1e6);
    }
  }
  cuda_backend_set_moe_variant(g_gpu, CUDA_MOE_DEFAULT);
  cuda_backend_set_exact(g_gpu, 1);
  cuda_backend_drop_mirrors(g_gpu);
  for (int l = 0; l < NL; l++) dfree(didx[l]), dfree(dw[l]);
  dfree(dx), dfree(dscr), dfree(dy), free(x);
  moe_mats_free(&m);
}

/* MoE prefill throughput on the 35B-A3B layer shape (E 256, top-8, H 2048, I 512, Q4_K
 * experts, separate gate/up as in the GGUF files; uniform random routing, so every expert
 * gets about n * 8 / 256 pairs): us per call of the host-grouped path (ids read back,
 * per-expert cuBLAS GEMMs), the default, the in-loop dequantizing tile kernels (each tile
 * forced, and their automatic pick), the cuBLAS path (dequantized experts, one grouped call
 * or a loop of GEMMs) and the tile kernels on dequantized experts (pipelined, plain). TFLOP/s counts the useful 2 * n * k * 3 * H * I flops. */
static void bench_moe(void) {
  printf("bench moe prefill (E 256, k 8, H 2048, I 512, Q4_K)\n");
  cuda_backend_drop_mirrors(g_gpu); /* the weights below may reuse freed host addresses */
  moe_case c;
  moe_case_make(&c, 8192, 256, 8, 2048, 512, ANNA_DTYPE_Q4_K, 0);
  const int64_t ns[] = {512, 2048, 4096, 8192};
  const int variants[] = {CUDA_MOE_HOST,   CUDA_MOE_DEFAULT, CUDA_MOE_T16,         CUDA_MOE_T32,
                          CUDA_MOE_T64,    CUDA_MOE_TILES,   CUDA_MOE_CUBLAS,      CUDA_MOE_CUBLAS_LOOP,
                          CUDA_MOE_PIPE,   CUDA_MOE_PREDEQ};
  const char *const vname[] = {"host-grouped", "default",      "tiles t16", "tiles t32",   "tiles t64",
                               "tiles (auto)", "cublas",       "cublas loop", "pipe",      "predeq"};
  cuda_backend_set_exact(g_gpu, 0);
  for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
    const int64_t n = ns[ni], nk = n * c.k, sf = ops_moe_scratch_floats(n, c.k, c.H, c.I);
    float *dx = dput(c.x, sizeof(float) * (size_t)(n * c.H)), *dw = dput(c.w, sizeof(float) * (size_t)nk);
    int32_t *didx = dput(c.idx, sizeof(int32_t) * (size_t)nk);
    float *dscr = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)sf), *dy = dnan(n * c.H);
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
      cuda_backend_set_moe_variant(g_gpu, variants[v]);
      g_gpu->moe_ffn(g_gpu, dy, dx, n, c.H, didx, dw, c.k, c.E, c.gate, c.up, c.down, ACT_KIND_SILU, dscr);
      gpu_status("moe bench warmup");
      const int reps = variants[v] == CUDA_MOE_HOST ? 3 : 10;
      double t0 = now_s();
      for (int r = 0; r < reps; r++)
        g_gpu->moe_ffn(g_gpu, dy, dx, n, c.H, didx, dw, c.k, c.E, c.gate, c.up, c.down, ACT_KIND_SILU, dscr);
      gpu_status("moe bench");
      const double dt = (now_s() - t0) / reps;
      printf("  moe n=%-5lld %-13s: %9.1f us, %6.1f TFLOP/s\n", (long long)n, vname[v], dt * 1e6,
             2.0 * nk * 3.0 * c.H * c.I / dt / 1e12);
    }
    dfree(dx), dfree(dw), dfree(didx), dfree(dscr), dfree(dy);
  }
  cuda_backend_set_moe_variant(g_gpu, CUDA_MOE_DEFAULT);
  cuda_backend_set_exact(g_gpu, 1);
  cuda_backend_drop_mirrors(g_gpu);
  moe_case_free(&c);
  /* decode: Q4_K and Q8_0 files, and Q4_K_M's Q6_K down */
  bench_moe_decode(ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K);
  bench_moe_decode(ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0);
  bench_moe_decode(ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K);
}

/* A decode-like step captured as a graph (upload, ops, ring arguments, download) gives the
 * eager result, also when replayed with new inputs (graph updated in place). */
static void test_graphs(void) {
  printf("graphs\n");
  cuda_backend_drop_mirrors(g_gpu);
  const int64_t n = 3, d = 256, rows = 300;
  float *wf;
  void *w = make_weight(ANNA_DTYPE_BF16, rows, d, &wf);
  ops_weight ow = {ANNA_DTYPE_BF16, w, rows, d};
  float *nw = hrand(d, 1.0f);
  float *dx = g_gpu->alloc(g_gpu, sizeof(float) * n * d), *dn = g_gpu->alloc(g_gpu, sizeof(float) * n * d);
  float *dy = g_gpu->alloc(g_gpu, sizeof(float) * n * rows), *dk = g_gpu->alloc(g_gpu, sizeof(float) * 8 * rows);
  /* eager once so the mirrors exist, as after the context's warm-up */
  g_gpu->rmsnorm(g_gpu, dn, dx, nw, n, (int)d, 1e-6f, 0);
  g_gpu->matmul(g_gpu, dy, dn, n, &ow, NULL);
  gpu_status("graph warmup");
  int64_t launches0, builds0, updates0;
  cuda_backend_graph_stats(g_gpu, &launches0, &builds0, &updates0); /* earlier tests replay graphs too */
  cuda_backend_set_graphs(g_gpu, 1);
  /* Step 3 writes the product to another buffer: the same nodes with one changed
   * argument, which must update the cached graph in place. */
  float *dy_alt = g_gpu->alloc(g_gpu, sizeof(float) * n * rows);
  for (int step = 0; step < 4; step++) {
    float *dyo = step == 3 ? dy_alt : dy;
    float *x = hrand(n * d, 1.0f), *ref = malloc(sizeof(float) * n * rows), *xn = malloc(sizeof(float) * n * d);
    float *out = malloc(sizeof(float) * n * rows), *kc = malloc(sizeof(float) * 8 * rows);
    g_cpu->rmsnorm(g_cpu, xn, x, nw, n, (int)d, 1e-6f, 0);
    g_cpu->matmul(g_cpu, ref, xn, n, &ow, NULL);
    cuda_backend_step_begin(g_gpu, n);
    g_gpu->upload(g_gpu, dx, x, sizeof(float) * n * d);
    memset(x, 0, sizeof(float) * n * d); /* the staged copy must not read the caller's buffer later */
    g_gpu->rmsnorm(g_gpu, dn, dx, nw, n, (int)d, 1e-6f, 0);
    g_gpu->matmul(g_gpu, dyo, dn, n, &ow, NULL);
    float *dst[3] = {dk + (step + 0) * rows, dk + (step + 2) * rows, dk + (step + 4) * rows};
    g_gpu->scatter_rows(g_gpu, dst, dyo, n, (int)rows);
    g_gpu->download(g_gpu, out, dyo, sizeof(float) * n * rows);
    cuda_backend_step_end(g_gpu);
    char what[64];
    snprintf(what, sizeof what, "graph step %d", step);
    cmp(what, out, ref, n * rows, 1e-4);
    g_gpu->download(g_gpu, kc, dk + (step + 4) * rows, sizeof(float) * rows);
    snprintf(what, sizeof what, "graph step %d scatter", step);
    cmp(what, kc, ref + 2 * rows, rows, 1e-4);
    free(x), free(ref), free(xn), free(out), free(kc);
  }
  int64_t launches, builds, updates;
  cuda_backend_graph_stats(g_gpu, &launches, &builds, &updates);
  launches -= launches0, builds -= builds0, updates -= updates0;
  g_checks++;
  /* Step 0 builds a graph (or updates one an earlier test left with the same kernels);
   * steps 1 and 2 record the same nodes with the same arguments (the uploads and scatter
   * pointers change only in the ring): relaunched as is; step 3 updates one argument. */
  if (launches != 4 || builds + updates != 2 || updates < 1) {
    printf("  FAIL graph launches %lld builds %lld updates %lld\n", (long long)launches, (long long)builds,
           (long long)updates);
    g_fail++;
  }
  printf("  graph launches %lld, builds %lld, updates %lld\n", (long long)launches, (long long)builds,
         (long long)updates);
  cuda_backend_set_graphs(g_gpu, 0);
  dfree(dx), dfree(dn), dfree(dy), dfree(dk), dfree(dy_alt), free(w), free(wf), free(nw);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Prefill attention: a 512-token chunk of one sequence at positions len0.. (Qwen3.5-0.8B
 * shape: 8 q heads, 2 kv heads, head dim 256), split-K f32 kernel (exact) vs flash (not
 * exact). Effective TFLOP/s counts 4 * D * heads flops per visible (query, key) pair. */
static void bench_attention(int len0) {
  const int Hq = 8, Hkv = 2, D = 256, BL = 16;
  const int64_t n = 512, kvd = (int64_t)Hkv * D, ctx = len0 + n, nbk = (ctx + BL - 1) / BL;
  float *k = hrand(ctx * kvd, 1.0f), *v = hrand(ctx * kvd, 1.0f), *q = hrand(n * Hq * D, 1.0f);
  float *dk = dput(k, sizeof(float) * (size_t)(ctx * kvd)), *dv = dput(v, sizeof(float) * (size_t)(ctx * kvd));
  float *dq = dput(q, sizeof(float) * (size_t)(n * Hq * D)), *dy = dnan(n * Hq * D);
  const void **tk = malloc(sizeof(void *) * (size_t)nbk), **tv = malloc(sizeof(void *) * (size_t)nbk);
  for (int64_t j = 0; j < nbk; j++) tk[j] = dk + j * BL * kvd, tv[j] = dv + j * BL * kvd;
  void *dtk = dput(tk, sizeof(void *) * (size_t)nbk), *dtv = dput(tv, sizeof(void *) * (size_t)nbk);
  const void **gk = malloc(sizeof(void *) * (size_t)n), **gv = malloc(sizeof(void *) * (size_t)n);
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
  double pairs = 0;
  for (int64_t t = 0; t < n; t++) gk[t] = dtk, gv[t] = dtv, pos[t] = len0 + (int32_t)t, pairs += pos[t] + 1;
  int32_t *dpos = dput(pos, sizeof(int32_t) * (size_t)n);
  ops_attn_args ga = {.n = n, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .v_dim = D, .kv_type = OPS_KV_F32,
                      .kv_row_bytes = kvd * 4, .block_len = BL, .scale = 1.0f / sqrtf((float)D), .pos = dpos,
                      .k_blocks = (const void *const *const *)gk, .v_blocks = (const void *const *const *)gv};
  static const char *const mname[] = {"f32 split-K", "flash wmma", "flash mma"};
  for (int mode = 0; mode < 3; mode++) {
    cuda_backend_set_exact(g_gpu, mode == 0);
    cuda_backend_set_flash_variant(g_gpu, mode == 1 ? CUDA_FLASH_WMMA : CUDA_FLASH_MMA);
    g_gpu->attention(g_gpu, dy, dq, &ga);
    gpu_status("attention warmup");
    const int reps = 20;
    double t0 = now_s();
    for (int r = 0; r < reps; r++) g_gpu->attention(g_gpu, dy, dq, &ga);
    gpu_status("attention bench");
    const double dt = (now_s() - t0) / reps;
    printf("  attention %-12s n=%lld after %d (H=%d/%d D=%d): %8.1f us, %6.1f TFLOP/s\n", mname[mode], (long long)n,
           len0, Hq, Hkv, D, dt * 1e6, 4.0 * D * Hq * pairs / dt / 1e12);
  }
  cuda_backend_set_exact(g_gpu, 0);
  cuda_backend_set_flash_variant(g_gpu, CUDA_FLASH_MMA);
  dfree(dk), dfree(dv), dfree(dq), dfree(dy), dfree(dtk), dfree(dtv), dfree(dpos);
  free(k), free(v), free(q), free(tk), free(tv), free(gk), free(gv), free(pos);
}

/* Decode attention of one token after len keys, Qwen3.5-9B shape (16 q heads, 4 kv heads,
 * head dim 256, f32 cache): the grouped-query kernel against the per-head one. GB/s counts
 * the K and V bytes once (what a kernel that reads each row once must move). */
static void bench_attention_decode(int len) {
  const int Hq = 16, Hkv = 4, D = 256, BL = 64;
  const int64_t kvd = (int64_t)Hkv * D, ctx = len + 1, nbk = (ctx + BL - 1) / BL;
  float *k = hrand(ctx * kvd, 1.0f), *v = hrand(ctx * kvd, 1.0f), *q = hrand(Hq * D, 1.0f);
  float *dk = dput(k, sizeof(float) * (size_t)(ctx * kvd)), *dv = dput(v, sizeof(float) * (size_t)(ctx * kvd));
  float *dq = dput(q, sizeof(float) * (size_t)(Hq * D)), *dy = dnan(Hq * D);
  const void **tk = malloc(sizeof(void *) * (size_t)nbk), **tv = malloc(sizeof(void *) * (size_t)nbk);
  for (int64_t j = 0; j < nbk; j++) tk[j] = dk + j * BL * kvd, tv[j] = dv + j * BL * kvd;
  void *dtk = dput(tk, sizeof(void *) * (size_t)nbk), *dtv = dput(tv, sizeof(void *) * (size_t)nbk);
  const void *gk[1] = {dtk}, *gv[1] = {dtv};
  int32_t pos = len, *dpos = dput(&pos, sizeof(int32_t));
  ops_attn_args ga = {.n = 1, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .v_dim = D, .kv_type = OPS_KV_F32,
                      .kv_row_bytes = kvd * 4, .block_len = BL, .scale = 1.0f / sqrtf((float)D), .pos = dpos,
                      .k_blocks = (const void *const *const *)gk, .v_blocks = (const void *const *const *)gv};
  static const char *const vname[] = {"grouped", "per-head"};
  for (int var = 0; var < 2; var++) {
    cuda_backend_set_attn_variant(g_gpu, var ? CUDA_ATTN_PER_HEAD : CUDA_ATTN_DEFAULT);
    g_gpu->attention(g_gpu, dy, dq, &ga);
    gpu_status("decode attention warmup");
    const int reps = 50;
    double t0 = now_s();
    for (int r = 0; r < reps; r++) g_gpu->attention(g_gpu, dy, dq, &ga);
    gpu_status("decode attention bench");
    const double dt = (now_s() - t0) / reps;
    printf("  attention decode %-8s n=1 after %d (H=%d/%d D=%d): %8.1f us, %6.0f GB/s of K+V\n", vname[var], len, Hq,
           Hkv, D, dt * 1e6, 2.0 * ctx * kvd * 4 / dt / 1e9);
  }
  cuda_backend_set_attn_variant(g_gpu, CUDA_ATTN_DEFAULT);
  dfree(dk), dfree(dv), dfree(dq), dfree(dy), dfree(dtk), dfree(dtv), dfree(dpos);
  free(k), free(v), free(q), free(tk), free(tv);
}

/* Decode-shaped matvec bandwidth (weight bytes / time) against a device copy. */
static void bench(void) {
  printf("bench (GB/s: weight bytes read per second; copy counts read + write)\n");
  bench_attention(8192 - 512);
  bench_attention(0);
  bench_attention_decode(8192);
  bench_attention_decode(32768);
  cuda_backend_drop_mirrors(g_gpu);
  const int64_t big = (int64_t)1 << 28; /* 1 GiB of floats */
  float *a = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)big), *b = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)big);
  if (a && b) {
    g_gpu->copy_rows(g_gpu, b, big / 4, a, big / 4, 4, (int)(big / 4));
    gpu_status("copy warmup");
    double t0 = now_s();
    for (int i = 0; i < 5; i++) g_gpu->copy_rows(g_gpu, b, big / 4, a, big / 4, 4, (int)(big / 4));
    gpu_status("copy");
    double dt = (now_s() - t0) / 5;
    printf("  copy_rows 1 GiB: %.0f GB/s\n", 2.0 * sizeof(float) * big / dt / 1e9);
    /* the driver's own device-to-device copy: the ceiling the notes compare against */
    g_gpu->copy(g_gpu, b, a, sizeof(float) * (size_t)big);
    gpu_status("memcpy warmup");
    t0 = now_s();
    for (int i = 0; i < 5; i++) g_gpu->copy(g_gpu, b, a, sizeof(float) * (size_t)big);
    gpu_status("memcpy");
    dt = (now_s() - t0) / 5;
    printf("  cudaMemcpy d2d 1 GiB: %.0f GB/s\n", 2.0 * sizeof(float) * big / dt / 1e9);
  }
  dfree(a), dfree(b);
  {
    /* per-op cost when launches, not bandwidth, bound the time */
    float *one = dnan(1), *z = g_gpu->alloc(g_gpu, sizeof(float));
    g_gpu->add(g_gpu, z, z, 1);
    gpu_status("launch warmup");
    const int reps = 2000;
    double t0 = now_s();
    for (int i = 0; i < reps; i++) g_gpu->add(g_gpu, z, z, 1);
    gpu_status("launch");
    printf("  launch: %.2f us per tiny op (add of 1 float, %d in a row)\n", (now_s() - t0) / reps * 1e6, reps);
    t0 = now_s();
    for (int i = 0; i < 200; i++) {
      g_gpu->add(g_gpu, z, z, 1);
      gpu_status("sync");
    }
    printf("  launch + sync: %.2f us\n", (now_s() - t0) / 200 * 1e6);
    dfree(one), dfree(z);
  }
  {
    /* a decode-like step of 300 small ops (rmsnorm, 1024x1024 bf16 matvec, add), eager and
     * captured as a graph, each ending in a small download */
    float *wf;
    void *w = make_weight(ANNA_DTYPE_BF16, 1024, 1024, &wf);
    ops_weight ow = {ANNA_DTYPE_BF16, w, 1024, 1024};
    float *nw = hrand(1024, 1.0f), *x = hrand(1024, 1.0f), res[4];
    float *dx = dput(x, sizeof(float) * 1024), *dn = dnan(1024), *dy = dnan(1024);
    /* 0: eager; 1: graph with programmatic launches (the default on sm_90); 2: graph without */
    for (int mode = 0; mode < 3; mode++) {
      const int graphs = mode > 0;
      cuda_backend_set_graphs(g_gpu, graphs);
      cuda_backend_set_pdl(g_gpu, mode == 1);
      double best = 1e9;
      for (int rep = 0; rep < 6; rep++) {
        double t0 = now_s();
        cuda_backend_step_begin(g_gpu, 1);
        for (int i = 0; i < 100; i++) {
          g_gpu->rmsnorm(g_gpu, dn, dx, nw, 1, 1024, 1e-6f, 0);
          g_gpu->matmul(g_gpu, dy, dn, 1, &ow, NULL);
          g_gpu->scale(g_gpu, dy, 0.01f, 1024);
        }
        g_gpu->download(g_gpu, res, dy, sizeof res);
        cuda_backend_step_end(g_gpu);
        gpu_status("step bench");
        double dt = now_s() - t0;
        if (rep > 0 && dt < best) best = dt; /* rep 0 builds the graph */
      }
      printf("  step of 300 ops (%s): %.0f us\n", mode == 0 ? "eager" : mode == 1 ? "graph" : "graph, no PDL",
             best * 1e6);
    }
    cuda_backend_set_graphs(g_gpu, 0);
    cuda_backend_set_pdl(g_gpu, 1);
    dfree(dx), dfree(dn), dfree(dy), free(w), free(wf), free(nw), free(x);
    cuda_backend_drop_mirrors(g_gpu);
  }
  {
    /* The GDN mixer between its projections for the GDN layers of a decode step, as a graph:
     * the 9-op sequence vs gdn_step, per layer (the step's fixed cost, its download and
     * graph launch, included and spread over the layers). Qwen3.5-0.8B: 18 layers, hk = hv = 16;
     * 9B: 24 layers, hv = 32; dk = dv = 128. */
    const int shapes[][3] = {{16, 16, 18}, {16, 32, 24}}; /* hk, hv, layers */
    for (int si = 0; si < 2; si++) {
      const int hk = shapes[si][0], hv = shapes[si][1], dk = 128, dv = 128, kw = 4, L = shapes[si][2];
      const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd, ssz = (int64_t)hv * dk * dv;
      const int64_t NT = 8; /* inputs for up to 8 tokens */
      float *cw = hrand(cd * kw, 0.5f), *alog = hrand(hv, 1.0f), *dtb = hrand(hv, 1.0f), *nw = hrand(dv, 1.0f);
      float *h = hrand(NT * cd, 1.0f), *dqkv = dput(h, sizeof(float) * (size_t)(NT * cd));
      float *dz = dput(h, sizeof(float) * (size_t)(NT * Vd)), *dba = dput(h, sizeof(float) * 2 * (size_t)(NT * hv));
      float *dy = dnan(NT * Vd), *dconv = dnan(NT * cd), *dq2 = dnan(NT * cd), *dg = dnan(2 * NT * hv);
      float *dout = dnan(NT * Vd), *dcs[24], *dst[24], res[4];
      for (int l = 0; l < L; l++)
        dcs[l] = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)(cd * (kw - 1))),
        dst[l] = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)ssz);
      cuda_backend_set_graphs(g_gpu, 1);
      for (int run = 0; run < 5; run++) { /* unfused n = 1, gdn_step n = 1, 8, per-head variant n = 1, 8 */
        const int fused = run > 0;
        const int64_t n = run == 2 || run == 4 ? 8 : 1;
        cuda_backend_set_gdn_variant(g_gpu, run >= 3 ? CUDA_GDN_HEAD : CUDA_GDN_CLUSTER);
        ops_gdn_step_args sa = {
            .n = n, .hk = hk, .hv = hv, .dk = dk, .dv = dv, .kw = kw, .v_tiled = 0, .eps = 1e-6f, .qkv = dqkv,
            .z = dz, .b = dba, .a = dba + n * hv, .conv_w = cw, .a_log = alog, .dt_bias = dtb, .norm_w = nw, .y = dy,
        };
        double best = 1e9, best_gpu = 1e9;
        for (int rep = 0; rep < 8; rep++) {
          double t0 = now_s(), cap, upd, gpu0, gpu1;
          cuda_backend_graph_times(g_gpu, &cap, &upd, &gpu0);
          cuda_backend_step_begin(g_gpu, n);
          for (int l = 0; l < L; l++) {
            sa.conv_state = dcs[l], sa.state = dst[l];
            if (fused) g_gpu->gdn_step(g_gpu, &sa);
            else gdn_unfused(g_gpu, &sa, dconv, dq2, dg, dout);
          }
          g_gpu->download(g_gpu, res, dy, sizeof res);
          cuda_backend_step_end(g_gpu);
          gpu_status("gdn step bench");
          double dt = now_s() - t0;
          cuda_backend_graph_times(g_gpu, &cap, &upd, &gpu1);
          if (rep > 1 && dt < best) best = dt; /* the first reps build the graph */
          if (rep > 1 && gpu1 - gpu0 < best_gpu) best_gpu = gpu1 - gpu0;
        }
        /* step: host time of the whole step; gpu: the graph replay alone (events around it) */
        printf("  GDN mixer x%d, %s shape (hv %d), n=%lld, graph, %-20s step %6.1f us, gpu %6.1f us = %5.2f us/layer\n",
               L, si ? "9B" : "0.8B", hv, (long long)n,
               run >= 3 ? "gdn_step per head:" : fused ? "gdn_step (1 kernel):" : "unfused (9 kernels):",
               best * 1e6, best_gpu * 1e6, best_gpu * 1e6 / L);
      }
      cuda_backend_set_graphs(g_gpu, 0);
      cuda_backend_set_gdn_variant(g_gpu, CUDA_GDN_HEAD); /* back to the default */
      for (int l = 0; l < L; l++) dfree(dcs[l]), dfree(dst[l]);
      dfree(dqkv), dfree(dz), dfree(dba), dfree(dy), dfree(dconv), dfree(dq2), dfree(dg), dfree(dout);
      free(cw), free(alog), free(dtb), free(nw), free(h);
      cuda_backend_drop_mirrors(g_gpu);
    }
  }
  /* Matvec bandwidth: NCOPY copies of the weight (distinct host pointers, so distinct device
   * mirrors) are used in turn, so together they exceed the L2 (60 MB) and each call reads
   * its weight from device memory, as a decode step does. */
  enum { NCOPY = 4 };
  const int types[] = {ANNA_DTYPE_BF16, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q4_K,   ANNA_DTYPE_Q5_K,
                       ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q4_0, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_IQ4_NL};
  const int64_t rows = 12288, cols = 4096;
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    float *f;
    void *w = make_weight(types[i], rows, cols, &f);
    free(f);
    const size_t wb = (size_t)(dtype_row_bytes(types[i], cols) * rows);
    ops_weight ow[NCOPY];
    void *wc[NCOPY];
    for (int c = 0; c < NCOPY; c++) {
      wc[c] = malloc(wb);
      memcpy(wc[c], w, wb);
      ow[c] = (ops_weight){types[i], wc[c], rows, cols};
    }
    float *x = hrand(8 * cols, 1.0f), *dx = dput(x, sizeof(float) * 8 * (size_t)cols), *dy = dnan(64 * rows);
    const int nts[] = {1, 2, 4, 8};
    /* f32: f32 activations (the kernels exact mode uses); int8: the default (exact off),
     * int8 activations where the type has a dp4a kernel (else the same kernel again);
     * i8r4: int8 with 4 rows per warp (each activation load serves more rows) */
    const int modes[] = {CUDA_MV_F32, CUDA_MV_DEFAULT, CUDA_MV_INT8_R4};
    const char *mname[] = {"f32", "int8", "i8r4"};
    for (int k = 0; k < 4; k++)
      for (int mi = 0; mi < (nts[k] <= 2 ? 3 : 2); mi++) { /* i8r4 differs for n <= 2 only */
        const int nt = nts[k], mode = modes[mi];
        cuda_backend_set_matvec_variant(g_gpu, mode);
        for (int c = 0; c < NCOPY; c++) g_gpu->matmul(g_gpu, dy, dx, nt, &ow[c], NULL);
        gpu_status("matvec warmup");
        const int reps = 200;
        double t0 = now_s();
        for (int r = 0; r < reps; r++) g_gpu->matmul(g_gpu, dy, dx, nt, &ow[r % NCOPY], NULL);
        gpu_status("matvec");
        double dt = (now_s() - t0) / reps;
        printf("  matvec %-6s n=%d %lldx%lld %-4s: %7.1f us, %6.0f GB/s\n", dtype_name(types[i]), nt,
               (long long)rows, (long long)cols, mname[mi], dt * 1e6, (double)wb / dt / 1e9);
      }
    cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
    dfree(dx), dfree(dy), free(x), free(w);
    cuda_backend_drop_mirrors(g_gpu);
    for (int c = 0; c < NCOPY; c++) free(wc[c]);
  }
}

/* A one-row add_rmsnorm in the default numerics is deferred into the next one-token int8
 * matvec of its output (cuda_pnorm). Per case: add_rmsnorm then matmul_group (or matmul) of y,
 * against the same sequence with a download in between (which launches the norm on its own):
 * x and y must match the unfused ones (x bit for bit: one f32 add; y within 1e-5: another
 * summation order of the squares), the products within 2e-3 of their scale (int8 values of
 * (x + r) * w against those of the normalised row: a rounding may flip). Then against the CPU
 * in exact mode within the matmul_group int8 bound (3e-2). Cases: a group with an int8 entry
 * (fused), one without (Q5_0 and f32: the norm runs on its own), one weight (matmul),
 * one_plus weights, and a second norm deferred right after (the counter reset). */
static void test_norm_fused(void) {
  printf("add_rmsnorm fused into the next matvec\n");
  typedef struct {
    int count, d, one_plus;
    int type[3];
    int64_t rows[3];
  } ncase;
  const ncase cases[] = {
      {3, 4096, 0, {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0, ANNA_DTYPE_F32}, {257, 65, 9}},
      {2, 1024, 1, {ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q4_K}, {100, 33}},
      {2, 512, 0, {ANNA_DTYPE_Q5_0, ANNA_DTYPE_F32}, {40, 7}},
      {1, 2048, 1, {ANNA_DTYPE_Q4_K}, {300}},
  };
  cuda_backend_set_exact(g_gpu, 0);
  cpu_backend_set_exact_matmul(g_cpu, 1);
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const ncase *c = &cases[ci];
    const int d = c->d;
    cuda_backend_drop_mirrors(g_gpu);
    void *wd[3];
    ops_weight ow[3];
    const ops_weight *ws[3];
    int64_t ytot = 0;
    for (int i = 0; i < c->count; i++) {
      float *f;
      wd[i] = make_weight(c->type[i], c->rows[i], d, &f);
      free(f);
      ow[i] = (ops_weight){c->type[i], wd[i], c->rows[i], d};
      ws[i] = &ow[i];
      ytot += c->rows[i];
    }
    float *x = hrand(d, 1.0f), *r = hrand(d, 1.0f), *w = hrand(d, 1.0f);
    /* CPU: x + r, its norm, the products (exact) */
    float *xc = hcopy(x, d), *yc = malloc(sizeof(float) * (size_t)d), *ref = malloc(sizeof(float) * (size_t)ytot);
    float *hy[3];
    int64_t off = 0;
    for (int i = 0; i < c->count; i++) hy[i] = ref + off, off += c->rows[i];
    g_cpu->add_rmsnorm(g_cpu, xc, r, yc, w, 1, d, 1e-6f, c->one_plus);
    g_cpu->matmul_group(g_cpu, c->count, hy, yc, 1, ws, NULL);
    float *res[2][3]; /* [0] unfused, [1] fused: x, y, products */
    for (int fused = 0; fused < 2; fused++) {
      float *dx = dput(x, sizeof(float) * (size_t)d), *dr = dput(r, sizeof(float) * (size_t)d), *dy = dnan(d);
      float *dout = dnan(ytot), *dys[3], tmp;
      off = 0;
      for (int i = 0; i < c->count; i++) dys[i] = dout + off, off += c->rows[i];
      g_gpu->add_rmsnorm(g_gpu, dx, dr, dy, w, 1, d, 1e-6f, c->one_plus);
      if (!fused) g_gpu->download(g_gpu, &tmp, dr, sizeof tmp); /* any other op launches the norm */
      if (c->count == 1) g_gpu->matmul(g_gpu, dys[0], dy, 1, ws[0], NULL);
      else g_gpu->matmul_group(g_gpu, c->count, dys, dy, 1, ws, NULL);
      if (fused) { /* a second deferred norm right after: the election counter must be back at 0 */
        g_gpu->add_rmsnorm(g_gpu, dx, dr, dy, w, 1, d, 1e-6f, c->one_plus);
        g_gpu->matmul(g_gpu, dys[0], dy, 1, ws[0], NULL);
        g_gpu->add_rmsnorm(g_gpu, dx, dr, dy, w, 1, d, 1e-6f, c->one_plus); /* a third: the download launches it */
      }
      res[fused][0] = dget(dx, d), res[fused][1] = dget(dy, d), res[fused][2] = dget(dout, ytot);
      dfree(dx), dfree(dr), dfree(dy), dfree(dout);
    }
    char what[96];
    snprintf(what, sizeof what, "norm+matvec d=%d %s x%d unfused vs cpu", d, dtype_name(c->type[0]), c->count);
    cmp(what, res[0][0], xc, d, 0);
    cmp(what, res[0][2], ref, ytot, 3e-2);
    /* the fused run added r three times (x, y: the third norm's) and entry 0's products are
     * the second norm's; the other entries are the first (fused) launch's */
    float *x3 = hcopy(x, d), *y3 = malloc(sizeof(float) * (size_t)d);
    for (int k = 0; k < 3; k++) g_cpu->add_rmsnorm(g_cpu, x3, r, y3, w, 1, d, 1e-6f, c->one_plus);
    snprintf(what, sizeof what, "norm+matvec d=%d %s x%d fused: x", d, dtype_name(c->type[0]), c->count);
    cmp(what, res[1][0], x3, d, 1e-6);
    snprintf(what, sizeof what, "norm+matvec d=%d %s x%d fused: y", d, dtype_name(c->type[0]), c->count);
    cmp(what, res[1][1], y3, d, 1e-5);
    snprintf(what, sizeof what, "norm+matvec d=%d %s x%d fused vs unfused", d, dtype_name(c->type[0]), c->count);
    if (c->count > 1) cmp(what, res[1][2] + c->rows[0], res[0][2] + c->rows[0], ytot - c->rows[0], 2e-3);
    /* entry 0 after the second norm: its input was rmsnorm(x + 2r) */
    float *x2 = hcopy(x, d), *y2 = malloc(sizeof(float) * (size_t)d), *r0 = malloc(sizeof(float) * (size_t)c->rows[0]);
    for (int k = 0; k < 2; k++) g_cpu->add_rmsnorm(g_cpu, x2, r, y2, w, 1, d, 1e-6f, c->one_plus);
    g_cpu->matmul(g_cpu, r0, y2, 1, ws[0], NULL);
    snprintf(what, sizeof what, "norm+matvec d=%d %s x%d fused, second norm", d, dtype_name(c->type[0]), c->count);
    cmp(what, res[1][2], r0, c->rows[0], 3e-2);
    for (int k = 0; k < 2; k++)
      for (int j = 0; j < 3; j++) free(res[k][j]);
    for (int i = 0; i < c->count; i++) free(wd[i]);
    free(x), free(r), free(w), free(xc), free(yc), free(ref), free(x3), free(y3), free(x2), free(y2), free(r0);
  }
  cpu_backend_set_exact_matmul(g_cpu, 0);
  cuda_backend_set_exact(g_gpu, 1);
  cuda_backend_drop_mirrors(g_gpu);
}

/* matmul_group: groups of up to OPS_GROUP_MAX weights of mixed types (the grouped kernels
 * take the weights of one type and path together; the others launch alone), odd row counts,
 * biases on some entries, one shared input, n = 1, 2, 3, 8 (the decode token groups) and 9
 * (per-weight GEMMs). Checks, per mode (exact; default int8; int8 with 4 rows per warp,
 * which has no grouped instance):
 * - against the same weights through matmul on the device, bit for bit (tolerance 0): a
 *   grouped launch runs each row's arithmetic unchanged and adds a bias with the one f32 add
 *   the single path's bias kernel does;
 * - against the CPU backend's matmul_group in exact mode (f32 activations): 1e-4 of the
 *   output scale when the device is exact too (f32 rounding, another summation order, as
 *   test_matmul); 3e-2 in the default mode, a layout and indexing check only (int8
 *   activations: about 1e-3 of the scale on these random inputs, bounded per element by
 *   test_matvec_int8; n = 9 runs the tensor-core GEMM, 1e-2 in test_matmul).
 * Outputs start as NaN, so a row nobody writes fails. Then one group replayed in a recorded
 * step (graphs on) must give the eager bits. */
/* matmul_group_route (the MoE layer's router, shared-expert gate/up and gate logit, then the
 * route): bit-identical to matmul_group then moe_route, for 1-9 tokens (4 and 8 fold the route
 * into the plain group's last block; 3 and 9 fall back), eagerly three times in a row (the
 * election counter resets), inside recorded steps (graphs: the second step replays), after a
 * deferred add_rmsnorm (one token: the int8 launch takes the norm), and with the router in
 * bf16 (still plain) and Q8_0 (int8 path: routed by its own kernel). Each also with the
 * shared slot, on the group of the router and the one-row f32 gate logit (entry 3): rows of
 * k + 1, the routed slots as moe_route's and slot k = (E, sigmoid(logit)). With the f32
 * router that group is one plain launch: folded route, and for one token with a deferred norm
 * the norm in its blocks (the same bits as the add_rmsnorm kernel the reference runs); with
 * the bf16 / Q8_0 router the logit runs in another launch, so the route is not folded. */
static void test_matmul_group_route(void) {
  printf("matmul_group_route\n");
  const int64_t H = 512, I = 96;
  const int rtypes[] = {ANNA_DTYPE_F32, ANNA_DTYPE_BF16, ANNA_DTYPE_Q8_0};
  const int Es[] = {256, 64, 128};
  const int ns[] = {1, 2, 3, 4, 8, 9};
  for (int rt = 0; rt < 3; rt++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int E = Es[rt], k = rt == 1 ? 4 : 8;
    const int types[4] = {rtypes[rt], ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_F32};
    const int64_t rows[4] = {E, I, I, 1};
    void *wd[4];
    ops_weight ow[4];
    const ops_weight *ws[4];
    int64_t ytot = 0;
    for (int i = 0; i < 4; i++) {
      float *wf;
      wd[i] = make_weight(types[i], rows[i], H, &wf);
      free(wf);
      ow[i] = (ops_weight){types[i], wd[i], rows[i], H};
      ws[i] = &ow[i];
      ytot += rows[i];
    }
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
      const int64_t n = ns[ni];
      float *x = hrand(n * H, 1.0f), *r0 = hrand(H, 1.0f), *nw = hrand(H, 1.0f);
      float *dx = dput(x, sizeof(float) * (size_t)(n * H));
      for (int mode = 0; mode < 8; mode++) { /* eager, eager again (x3), recorded step (x2), deferred norm */
        const int sh = mode >= 4; /* 4..7: the same with the shared slot (entry 3's logit) */
        if (mode % 4 == 3 && n != 1) continue;
        const int kk = k + sh;
        float *dy[2], *dyi[2][4];
        int32_t *didx[2];
        float *dw[2], *dxn[2] = {NULL, NULL}, *dres[2] = {NULL, NULL};
        for (int v = 0; v < 2; v++) { /* v 0: fused op, 1: group then route */
          dy[v] = dnan(n * ytot);
          int64_t off = 0;
          for (int i = 0; i < 4; i++) dyi[v][i] = dy[v] + off, off += n * rows[i];
          didx[v] = g_gpu->alloc(g_gpu, sizeof(int32_t) * (size_t)(n * (v ? k : kk)));
          dw[v] = dnan(n * (v ? k : kk));
          const float *xin = dx;
          if (mode % 4 == 3) { /* x += r, xn = rmsnorm(x) * w, deferred into the group's int8 launch */
            dres[v] = dput(x, sizeof(float) * (size_t)H);
            float *dr = dput(r0, sizeof(float) * (size_t)H);
            dxn[v] = dnan(H);
            g_gpu->add_rmsnorm(g_gpu, dres[v], dr, dxn[v], nw, 1, (int)H, 1e-6f, 0);
            xin = dxn[v];
            dfree(dr);
          }
          const int reps = mode % 4 == 1 ? 3 : mode % 4 == 2 ? 2 : 1;
          for (int rep = 0; rep < reps; rep++) {
            if (mode % 4 == 2) cuda_backend_set_graphs(g_gpu, 1), cuda_backend_step_begin(g_gpu, n);
            /* the shared-slot modes group the router and the logit only (the model's group
             * then: with an f32 router one plain launch, which takes a deferred norm itself) */
            float *ys2[2] = {dyi[v][0], dyi[v][3]};
            const ops_weight *ws2[2] = {ws[0], ws[3]};
            if (v == 0 && sh) {
              g_gpu->matmul_group_route(g_gpu, 2, ys2, xin, n, ws2, NULL, 0, didx[v], dw[v], k, 1, NULL, 1);
            } else if (v == 0) {
              g_gpu->matmul_group_route(g_gpu, 4, dyi[v], xin, n, ws, NULL, 0, didx[v], dw[v], k, 1, NULL, -1);
            } else {
              if (sh) g_gpu->matmul_group(g_gpu, 2, ys2, xin, n, ws2, NULL);
              else g_gpu->matmul_group(g_gpu, 4, dyi[v], xin, n, ws, NULL);
              g_gpu->moe_route(g_gpu, didx[v], dw[v], dyi[v][0], n, E, k, 1, NULL);
            }
            if (mode % 4 == 2) cuda_backend_step_end(g_gpu), cuda_backend_set_graphs(g_gpu, 0);
          }
        }
        char what[128];
        snprintf(what, sizeof what, "group_route n=%lld E=%d k=%d router %s %s%s", (long long)n, E, k,
                 dtype_name(rtypes[rt]),
                 mode % 4 == 0 ? "eager" : mode % 4 == 1 ? "eager x3" : mode % 4 == 2 ? "graph x2" : "norm",
                 sh ? " shared slot" : "");
        float *g0 = dget(dy[0], n * ytot), *g1 = dget(dy[1], n * ytot);
        float *w0 = dget(dw[0], n * kk), *w1 = dget(dw[1], n * k);
        int32_t *i0 = malloc(sizeof(int32_t) * (size_t)(n * kk)), *i1 = malloc(sizeof(int32_t) * (size_t)(n * k));
        g_gpu->download(g_gpu, i0, didx[0], sizeof(int32_t) * (size_t)(n * kk));
        g_gpu->download(g_gpu, i1, didx[1], sizeof(int32_t) * (size_t)(n * k));
        gpu_status(what);
        g_checks++;
        int bad = memcmp(g0, g1, sizeof(float) * (size_t)(n * ytot)) != 0;
        for (int64_t t = 0; t < n; t++) {
          /* the routed slots as moe_route's; the shared one (E, sigmoid(entry 3's logit)) */
          bad |= memcmp(w0 + t * kk, w1 + t * k, sizeof(float) * (size_t)k) != 0;
          bad |= memcmp(i0 + t * kk, i1 + t * k, sizeof(int32_t) * (size_t)k) != 0;
          for (int j = 0; j < k; j++) bad |= i0[t * kk + j] < 0 || i0[t * kk + j] >= E || isnan(w0[t * kk + j]);
          if (sh) {
            const float lg = g1[n * (E + 2 * I) + t], want = 1.0f / (1.0f + expf(-lg));
            bad |= i0[t * kk + k] != E || !(fabsf(w0[t * kk + k] - want) <= 1e-6f);
          }
        }
        if (mode % 4 == 3) {
          float *a0 = dget(dres[0], H), *a1 = dget(dres[1], H), *n0 = dget(dxn[0], H), *n1 = dget(dxn[1], H);
          bad |= memcmp(a0, a1, sizeof(float) * (size_t)H) != 0 || memcmp(n0, n1, sizeof(float) * (size_t)H) != 0;
          free(a0), free(a1), free(n0), free(n1);
        }
        if (bad) {
          printf("  FAIL %s: differs from matmul_group + moe_route\n", what);
          g_fail++;
        }
        free(g0), free(g1), free(w0), free(w1), free(i0), free(i1);
        for (int v = 0; v < 2; v++) {
          dfree(dy[v]), dfree(dw[v]), g_gpu->free(g_gpu, didx[v]);
          if (dxn[v]) dfree(dxn[v]), dfree(dres[v]);
        }
      }
      dfree(dx), free(x), free(r0), free(nw);
    }
    for (int i = 0; i < 4; i++) free(wd[i]);
  }
  cuda_backend_drop_mirrors(g_gpu);
}

static void test_matmul_group(void) {
  printf("matmul_group\n");
  typedef struct {
    int count;
    int64_t cols;
    int type[OPS_GROUP_MAX];
    int64_t rows[OPS_GROUP_MAX];
    int bias[OPS_GROUP_MAX];
  } gcase;
  const gcase cases[] = {
      /* GDN-like: two pairs of one type each (two grouped launches) */
      {4, 512, {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0}, {129, 33, 17, 1}, {0, 0, 0, 0}},
      /* q/k/v with biases (Qwen2), one type */
      {3, 768, {ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0}, {300, 65, 65}, {1, 1, 1, 0}},
      /* float weights: plain kernel groups (bf16 pair) and a lone f32 with a bias */
      {3, 512, {ANNA_DTYPE_BF16, ANNA_DTYPE_F32, ANNA_DTYPE_BF16}, {300, 7, 5}, {0, 1, 1, 0}},
      /* odd width: the plain kernel without 16-byte loads */
      {2, 257, {ANNA_DTYPE_F16, ANNA_DTYPE_F16}, {3, 1}, {1, 0}},
      /* all different types: every weight alone */
      {4, 512, {ANNA_DTYPE_Q6_K, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_Q5_K, ANNA_DTYPE_Q4_0}, {65, 31, 3, 100}, {0, 1, 0, 0}},
      /* unit kernel types (no piece decoder): Q5_0 pair grouped */
      {4, 512, {ANNA_DTYPE_Q5_0, ANNA_DTYPE_Q2_K, ANNA_DTYPE_Q5_0, ANNA_DTYPE_Q3_K}, {40, 19, 7, 11}, {1, 0, 0, 1}},
      {4, 512, {ANNA_DTYPE_IQ4_NL, ANNA_DTYPE_Q4_1, ANNA_DTYPE_IQ4_NL, ANNA_DTYPE_Q5_1}, {64, 20, 33, 5}, {0, 0, 1, 0}},
      /* more rows than the device keeps resident: the blocks are split in proportion */
      {3, 256, {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K}, {20001, 31, 2}, {0, 0, 1}},
      {2, 512, {ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0}, {9001, 3}, {0, 0}},
      /* 8 tokens of 8192 columns: past the default 48 KB of int8 activations (opt-in limit) */
      {2, 8192, {ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q6_K}, {40, 9}, {0, 1}},
  };
  const int ns[] = {1, 2, 3, 8, 9};
  cpu_backend_set_exact_matmul(g_cpu, 1);
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const gcase *gc = &cases[ci];
    cuda_backend_drop_mirrors(g_gpu);
    const int cnt = gc->count;
    const int64_t cols = gc->cols;
    void *wdata[OPS_GROUP_MAX];
    ops_weight ow[OPS_GROUP_MAX];
    const ops_weight *ws[OPS_GROUP_MAX];
    float *bias[OPS_GROUP_MAX];
    int64_t ytot = 0;
    for (int i = 0; i < cnt; i++) {
      float *wf;
      wdata[i] = make_weight(gc->type[i], gc->rows[i], cols, &wf);
      free(wf);
      ow[i] = (ops_weight){gc->type[i], wdata[i], gc->rows[i], cols};
      ws[i] = &ow[i];
      bias[i] = gc->bias[i] ? hrand(gc->rows[i], 1.0f) : NULL;
      ytot += gc->rows[i];
    }
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
      const int64_t n = ns[ni];
      if (gc->rows[0] > 5000 && n != 1 && n != 3) continue; /* big weights: a few token counts */
      float *x = hrand(n * cols, 1.0f), *ref = malloc(sizeof(float) * (size_t)(n * ytot));
      float *dx = dput(x, sizeof(float) * (size_t)(n * cols));
      float *hy[OPS_GROUP_MAX];
      int64_t off = 0;
      for (int i = 0; i < cnt; i++) hy[i] = ref + off, off += n * gc->rows[i];
      g_cpu->matmul_group(g_cpu, cnt, hy, x, n, ws, (const float *const *)bias);
      for (int mode = 0; mode < 3; mode++) {
        const int exact = mode == 0;
        cuda_backend_set_exact(g_gpu, exact);
        cuda_backend_set_matvec_variant(g_gpu, mode == 2 ? CUDA_MV_INT8_R4 : CUDA_MV_DEFAULT);
        float *dg = dnan(n * ytot), *ds = dnan(n * ytot), *dgy[OPS_GROUP_MAX];
        off = 0;
        for (int i = 0; i < cnt; i++) {
          dgy[i] = dg + off;
          g_gpu->matmul(g_gpu, ds + off, dx, n, ws[i], bias[i]);
          off += n * gc->rows[i];
        }
        g_gpu->matmul_group(g_gpu, cnt, dgy, dx, n, ws, (const float *const *)bias);
        char what[160];
        int wl = snprintf(what, sizeof what, "group n=%lld cols=%lld", (long long)n, (long long)cols);
        for (int i = 0; i < cnt && wl < (int)sizeof what - 24; i++)
          wl += snprintf(what + wl, sizeof what - (size_t)wl, " %s:%lld%s", dtype_name(gc->type[i]),
                         (long long)gc->rows[i], bias[i] ? "+b" : "");
        snprintf(what + wl, sizeof what - (size_t)wl, " %s", mode == 0 ? "exact" : mode == 1 ? "int8" : "i8r4");
        float *g = dget(dg, n * ytot), *sgl = dget(ds, n * ytot);
        gpu_status(what);
        g_checks++;
        if (memcmp(g, sgl, sizeof(float) * (size_t)(n * ytot))) {
          int64_t bad = 0;
          for (int64_t i = 0; i < n * ytot; i++) bad += memcmp(&g[i], &sgl[i], sizeof(float)) != 0;
          printf("  FAIL %s: %lld of %lld differ from single matmuls\n", what, (long long)bad, (long long)(n * ytot));
          g_fail++;
        }
        off = 0;
        for (int i = 0; i < cnt; i++) { /* per weight: each has its own output scale */
          char wi[192];
          snprintf(wi, sizeof wi, "%s vs cpu [%d]", what, i);
          cmp(wi, g + off, ref + off, n * gc->rows[i], exact ? 1e-4 : 3e-2);
          off += n * gc->rows[i];
        }
        free(g), free(sgl);
        dfree(dg), dfree(ds);
      }
      dfree(dx);
      free(x), free(ref);
    }
    for (int i = 0; i < cnt; i++) free(wdata[i]), free(bias[i]);
  }
  cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
  cpu_backend_set_exact_matmul(g_cpu, 0);
  {
    /* recorded: the q/k/v case's group inside decode steps (graph built, then relaunched) */
    const gcase *gc = &cases[1];
    cuda_backend_drop_mirrors(g_gpu);
    cuda_backend_set_exact(g_gpu, 0);
    ops_weight ow[OPS_GROUP_MAX];
    const ops_weight *ws[OPS_GROUP_MAX];
    void *wdata[OPS_GROUP_MAX];
    float *bias[OPS_GROUP_MAX];
    int64_t ytot = 0;
    for (int i = 0; i < gc->count; i++) {
      float *wf;
      wdata[i] = make_weight(gc->type[i], gc->rows[i], gc->cols, &wf);
      free(wf);
      ow[i] = (ops_weight){gc->type[i], wdata[i], gc->rows[i], gc->cols};
      ws[i] = &ow[i];
      bias[i] = gc->bias[i] ? hrand(gc->rows[i], 1.0f) : NULL;
      ytot += gc->rows[i];
    }
    const int64_t n = 1;
    float *x = hrand(gc->cols, 1.0f), *dx = dput(x, sizeof(float) * (size_t)gc->cols), *dy = dnan(ytot);
    float *dyy[OPS_GROUP_MAX], *eager = NULL;
    int64_t off = 0;
    for (int i = 0; i < gc->count; i++) dyy[i] = dy + off, off += gc->rows[i];
    g_gpu->matmul_group(g_gpu, gc->count, dyy, dx, n, ws, (const float *const *)bias);
    eager = dget(dy, ytot);
    cuda_backend_set_graphs(g_gpu, 1);
    for (int step = 0; step < 3; step++) {
      float *out = malloc(sizeof(float) * (size_t)ytot);
      g_gpu->memset0(g_gpu, dy, sizeof(float) * (size_t)ytot);
      cuda_backend_step_begin(g_gpu, n);
      g_gpu->matmul_group(g_gpu, gc->count, dyy, dx, n, ws, (const float *const *)bias);
      g_gpu->download(g_gpu, out, dy, sizeof(float) * (size_t)ytot);
      cuda_backend_step_end(g_gpu);
      char what[64];
      snprintf(what, sizeof what, "group in a recorded step %d", step);
      gpu_status(what);
      g_checks++;
      if (memcmp(out, eager, sizeof(float) * (size_t)ytot)) {
        printf("  FAIL %s: differs from the eager launch\n", what);
        g_fail++;
      }
      free(out);
    }
    cuda_backend_set_graphs(g_gpu, 0);
    dfree(dx), dfree(dy), free(x), free(eager);
    for (int i = 0; i < gc->count; i++) free(wdata[i]), free(bias[i]);
  }
  cuda_backend_set_exact(g_gpu, 1); /* back to the tests' default (exact) */
  cuda_backend_drop_mirrors(g_gpu);
}

/* The 4 GDN in-projections of a Qwen3.5-9B layer (hidden 4096: qkv 8192 rows, z 4096, b and a
 * 32 each), all Q4_K or all Q8_0: separate matmuls (4 launches) against one matmul_group,
 * eager (us per call, launch cost included) and in recorded steps of NCOPY layers replayed as
 * a graph (us per layer, as a decode step runs them). NCOPY copies of the weights (distinct
 * mirrors, together past the 60 MB L2) are used in turn, so weights come from device memory. */
static void bench_matmul_group(void) {
  enum { NCOPY = 4, CNT = 4 };
  const int types[] = {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0};
  const int64_t cols = 4096, rows[CNT] = {8192, 4096, 32, 32};
  printf("bench matmul_group (GDN in-projections, 9B shape)\n");
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    cuda_backend_drop_mirrors(g_gpu);
    ops_weight ow[NCOPY][CNT];
    const ops_weight *ws[NCOPY][CNT];
    void *wd[NCOPY][CNT];
    size_t bytes = 0;
    for (int i = 0; i < CNT; i++) {
      float *f;
      void *w = make_weight(types[ti], rows[i], cols, &f);
      free(f);
      const size_t wb = (size_t)(dtype_row_bytes(types[ti], cols) * rows[i]);
      bytes += wb;
      for (int c = 0; c < NCOPY; c++) {
        wd[c][i] = malloc(wb);
        memcpy(wd[c][i], w, wb);
        ow[c][i] = (ops_weight){types[ti], wd[c][i], rows[i], cols};
        ws[c][i] = &ow[c][i];
      }
      free(w);
    }
    float *x = hrand(8 * cols, 1.0f), *dx = dput(x, sizeof(float) * 8 * (size_t)cols);
    float *dy[CNT], res[4];
    for (int i = 0; i < CNT; i++) dy[i] = dnan(8 * rows[i]);
    const int nts[] = {1, 4};
    for (int k = 0; k < 2; k++) {
      const int64_t nt = nts[k];
      for (int grouped = 0; grouped < 2; grouped++) {
        cuda_backend_set_exact(g_gpu, 0);
        for (int c = 0; c < NCOPY; c++) { /* warm-up: mirrors made */
          if (grouped) g_gpu->matmul_group(g_gpu, CNT, dy, dx, nt, ws[c], NULL);
          else
            for (int i = 0; i < CNT; i++) g_gpu->matmul(g_gpu, dy[i], dx, nt, ws[c][i], NULL);
        }
        gpu_status("group bench warmup");
        const int reps = 200;
        double t0 = now_s();
        for (int r = 0; r < reps; r++) {
          if (grouped) g_gpu->matmul_group(g_gpu, CNT, dy, dx, nt, ws[r % NCOPY], NULL);
          else
            for (int i = 0; i < CNT; i++) g_gpu->matmul(g_gpu, dy[i], dx, nt, ws[r % NCOPY][i], NULL);
        }
        gpu_status("group bench");
        const double eager = (now_s() - t0) / reps;
        cuda_backend_set_graphs(g_gpu, 1);
        double best = 1e9;
        for (int rep = 0; rep < 8; rep++) {
          double t1 = now_s();
          cuda_backend_step_begin(g_gpu, nt);
          for (int c = 0; c < NCOPY; c++) {
            if (grouped) g_gpu->matmul_group(g_gpu, CNT, dy, dx, nt, ws[c], NULL);
            else
              for (int i = 0; i < CNT; i++) g_gpu->matmul(g_gpu, dy[i], dx, nt, ws[c][i], NULL);
          }
          g_gpu->download(g_gpu, res, dy[0], sizeof res);
          cuda_backend_step_end(g_gpu);
          gpu_status("group bench graph");
          const double dt = now_s() - t1;
          if (rep > 1 && dt < best) best = dt; /* the first reps build the graph */
        }
        cuda_backend_set_graphs(g_gpu, 0);
        printf("  %s n=%lld %-8s: eager %7.1f us per call (%5.0f GB/s), graph %7.1f us per layer (%5.0f GB/s)\n",
               dtype_name(types[ti]), (long long)nt, grouped ? "grouped" : "separate", eager * 1e6,
               (double)bytes / eager / 1e9, best / NCOPY * 1e6, (double)bytes * NCOPY / best / 1e9);
      }
    }
    cuda_backend_set_exact(g_gpu, 1);
    for (int i = 0; i < CNT; i++) dfree(dy[i]);
    dfree(dx), free(x);
    cuda_backend_drop_mirrors(g_gpu);
    for (int c = 0; c < NCOPY; c++)
      for (int i = 0; i < CNT; i++) free(wd[c][i]);
  }
}

/* Prefill GEMM throughput: n tokens x a 12288 x 4096 weight, f32 path (exact) against the
 * tensor-core paths (bf16: dequantized weights, the default numerics and the hi + lo split
 * for every type; int8: CUDA_GEMM_INT8 for
 * the types it takes); TFLOP/s = 2 * n * rows * cols / time (quantization included). Q4_K
 * also at 2048 and 8192 tokens (the issue-6 prefill size). */
static void bench_gemm(void) {
  const int cases[][2] = {{ANNA_DTYPE_BF16, 512}, {ANNA_DTYPE_Q8_0, 512},  {ANNA_DTYPE_Q4_K, 512},
                          {ANNA_DTYPE_Q4_K, 2048}, {ANNA_DTYPE_Q4_K, 8192}, {ANNA_DTYPE_Q6_K, 512}};
  const int64_t rows = 12288, cols = 4096, nmax = 8192;
  printf("bench gemm (prefill)\n");
  float *x = hrand(nmax * cols, 1.0f), *dx = dput(x, sizeof(float) * (size_t)(nmax * cols)), *dy = dnan(nmax * rows);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const int type = cases[i][0];
    const int64_t n = cases[i][1];
    float *f;
    void *w = make_weight(type, rows, cols, &f);
    free(f);
    ops_weight ow = {type, w, rows, cols};
    for (int mode = 0; mode < 4; mode++) { /* f32, bf16 tensor cores (default, split), int8 tensor cores */
      if (mode == 3 && !gemm_int8_type(type)) continue;
      if (mode == 2 && type == ANNA_DTYPE_BF16) continue; /* its default is the split */
      cuda_backend_set_exact(g_gpu, mode == 0);
      cuda_backend_set_gemm_variant(g_gpu, mode == 3 ? CUDA_GEMM_INT8 : mode == 2 ? CUDA_GEMM_BF16_SPLIT : CUDA_GEMM_BF16);
      g_gpu->matmul(g_gpu, dy, dx, n, &ow, NULL);
      gpu_status("gemm warmup");
      const int reps = n >= 8192 ? 5 : 20;
      double t0 = now_s();
      for (int r = 0; r < reps; r++) g_gpu->matmul(g_gpu, dy, dx, n, &ow, NULL);
      gpu_status("gemm");
      double dt = (now_s() - t0) / reps;
      printf("  gemm %-6s n=%-4lld %lldx%lld %-12s: %8.1f us, %6.1f TFLOP/s\n", dtype_name(type), (long long)n,
             (long long)rows, (long long)cols,
             mode == 0 ? "f32" : mode == 1 ? "tensor cores" : mode == 2 ? "tc split" : "int8 tc", dt * 1e6,
             2.0 * n * rows * cols / dt / 1e12);
    }
    cuda_backend_drop_mirrors(g_gpu);
    free(w);
  }
  cuda_backend_set_gemm_variant(g_gpu, CUDA_GEMM_BF16);
  cuda_backend_set_exact(g_gpu, 1);
  dfree(dx), dfree(dy), free(x);
}


/* ---- topk (sampling candidates) ---- */

/* Rows as in tests/engine: kind 0 a spread, 1 a coarse grid (ties everywhere), 2 with -inf,
 * NaN, -0 and +-1e30 sprinkled in. */
static void topk_fill(float *l, int64_t n, int kind) {
  for (int64_t t = 0; t < n; t++) {
    const uint64_t r = rnd() % 100;
    float x = kind == 1 ? (float)(int)(frand() * 6.0f) : frand() * 8.0f;
    if (kind == 2 && r < 3) x = -INFINITY;
    if (kind == 2 && r == 3) x = NAN;
    if (kind == 2 && r == 4) x = -0.0f;
    if (kind == 2 && r == 5) x = (rnd() & 1) ? 1e30f : -1e30f;
    l[t] = x;
  }
}

/* One call on the device against the CPU op on the same rows. ids and values: exact (a
 * selection, no arithmetic); the row max: exact; the softmax sum: relative 1e-5 (the device
 * sums expf((l - m_slice) / T) per 4096-logit slice and rescales the slices in double, the CPU
 * the sampler's polynomial exp of l / T - m / T in vocabulary order: each term agrees to a few
 * 1e-7, the sum no worse). in_graph: inside a recorded step (replayed as a graph). */
static void topk_case(int64_t rows, int64_t V, int k, float temp, int kind, int in_graph) {
  float *l = malloc(sizeof(float) * (size_t)(rows * V));
  topk_fill(l, rows * V, kind);
  int32_t *ri = malloc(sizeof(int32_t) * (size_t)(rows * k)), *gi = malloc(sizeof(int32_t) * (size_t)(rows * k));
  float *rv = malloc(sizeof(float) * (size_t)(rows * k)), *gv = malloc(sizeof(float) * (size_t)(rows * k));
  double *rs = malloc(sizeof(double) * (size_t)(2 * rows)), *gs = malloc(sizeof(double) * (size_t)(2 * rows));
  g_cpu->topk(g_cpu, ri, rv, rs, l, rows, V, k, temp);
  float *dl = dput(l, sizeof(float) * (size_t)(rows * V));
  /* outputs start as all-ones bytes (id -1, value NaN): an unwritten entry fails */
  memset(gi, 0xff, sizeof(int32_t) * (size_t)(rows * k));
  memset(gv, 0xff, sizeof(float) * (size_t)(rows * k));
  memset(gs, 0xff, sizeof(double) * (size_t)(2 * rows));
  int32_t *di = dput(gi, sizeof(int32_t) * (size_t)(rows * k));
  float *dv = dput(gv, sizeof(float) * (size_t)(rows * k));
  double *ds = dput(gs, sizeof(double) * (size_t)(2 * rows));
  for (int rep = 0; rep < (in_graph ? 3 : 1); rep++) {
    if (in_graph) {
      if (rep > 0) { /* new logits at the same address: the replayed graph must see them */
        topk_fill(l, rows * V, kind);
        g_cpu->topk(g_cpu, ri, rv, rs, l, rows, V, k, temp);
        g_gpu->upload(g_gpu, dl, l, sizeof(float) * (size_t)(rows * V));
      }
      cuda_backend_step_begin(g_gpu, rows);
    }
    g_gpu->topk(g_gpu, di, dv, ds, dl, rows, V, k, temp);
    g_gpu->download(g_gpu, gi, di, sizeof(int32_t) * (size_t)(rows * k));
    if (in_graph) cuda_backend_step_end(g_gpu);
    g_gpu->download(g_gpu, gv, dv, sizeof(float) * (size_t)(rows * k));
    g_gpu->download(g_gpu, gs, ds, sizeof(double) * (size_t)(2 * rows));
    char what[128];
    snprintf(what, sizeof what, "topk rows=%lld V=%lld k=%d T=%.2f kind=%d%s", (long long)rows, (long long)V, k, temp,
             kind, in_graph ? " graph" : "");
    gpu_status(what);
    int64_t bad = 0;
    double zr = 0;
    for (int64_t i = 0; i < rows * k; i++) bad += gi[i] != ri[i] || memcmp(&gv[i], &rv[i], sizeof(float)) != 0;
    for (int64_t r = 0; r < rows; r++) {
      bad += gs[2 * r] != rs[2 * r];
      zr = fmax(zr, fabs(gs[2 * r + 1] - rs[2 * r + 1]) / fmax(rs[2 * r + 1], 1e-300));
      if (isnan(gs[2 * r + 1])) zr = INFINITY;
    }
    g_checks++;
    if (bad || !(zr <= 1e-5)) {
      printf("  FAIL %-58s %lld wrong ids/values/max, sum rel err %.3g (tol 1e-5)\n", what, (long long)bad, zr);
      for (int64_t i = 0; i < rows * k && bad; i++)
        if (gi[i] != ri[i] || memcmp(&gv[i], &rv[i], sizeof(float)) != 0) {
          printf("    first at %lld: gpu (%d, %g) cpu (%d, %g)\n", (long long)i, gi[i], gv[i], ri[i], rv[i]);
          break;
        }
      g_fail++;
    }
  }
  dfree(dl), dfree(di), dfree(dv), dfree(ds);
  free(l), free(ri), free(gi), free(rv), free(gv), free(rs), free(gs);
}

static void test_topk(void) {
  printf("topk\n");
  static const int64_t vocabs[] = {1, 33, 4096, 4097, 10007, 151936, 248320};
  static const int ks[] = {1, 2, 7, 20, 64, 67, 100, 255, 256};
  for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++)
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
      const int64_t V = vocabs[vi];
      const int k = ks[ki];
      if (k > V) continue;
      const int64_t rows = ki % 3 == 0 ? 1 : ki % 3 == 1 ? 3 : 8;
      topk_case(rows, V, k, ki % 4 == 3 ? 0.0f : ki % 2 ? 0.7f : 1.0f, (int)((vi + ki) % 3), 0); /* T 0: no sum */
    }
  /* every kind at the two real vocabularies, and inside recorded steps (graph replays) */
  for (int kind = 0; kind < 3; kind++) {
    topk_case(2, 151936, 64, 0.8f, kind, 0);
    topk_case(1, 248320, 1, 1.0f, kind, 0);
  }
  cuda_backend_set_graphs(g_gpu, 1);
  topk_case(1, 248320, 1, 1.0f, 0, 1);
  topk_case(2, 248320, 64, 0.7f, 2, 1);
  topk_case(3, 151936, 256, 1.0f, 1, 1);
  cuda_backend_set_graphs(g_gpu, 0);
}

/* us per call, 1 row x 248320 (a Qwen3.5 vocabulary), queued back to back. */
static void bench_topk(void) {
  printf("bench topk (1 x 248320)\n");
  const int64_t V = 248320;
  float *l = malloc(sizeof(float) * (size_t)V);
  for (int64_t t = 0; t < V; t++) l[t] = frand() * 10.0f;
  float *dl = dput(l, sizeof(float) * (size_t)V), *dv = g_gpu->alloc(g_gpu, sizeof(float) * OPS_TOPK_MAX);
  int32_t *di = g_gpu->alloc(g_gpu, sizeof(int32_t) * OPS_TOPK_MAX);
  double *ds = g_gpu->alloc(g_gpu, sizeof(double) * 2);
  static const int ks[] = {1, 20, 64, 256};
  for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
    g_gpu->topk(g_gpu, di, dv, ds, dl, 1, V, ks[i], 1.0f);
    gpu_status("topk warmup");
    const int reps = 200;
    double t0 = now_s();
    for (int r = 0; r < reps; r++) g_gpu->topk(g_gpu, di, dv, ds, dl, 1, V, ks[i], 1.0f);
    gpu_status("topk bench");
    printf("  topk k=%-3d: %7.1f us\n", ks[i], (now_s() - t0) / reps * 1e6);
  }
  dfree(dl), dfree(dv), dfree(di), dfree(ds), free(l);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* a crash keeps the lines before it, also through a pipe */
  int do_bench = 0;
  const char *only = NULL; /* --bench=NAME: that benchmark alone, no tests (gdn, gemm, moe, group, topk, attn, ops) */
  const char *pick = NULL; /* --tests=a,b: those tests only */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--bench")) do_bench = 1;
    if (!strncmp(argv[i], "--bench=", 8)) only = argv[i] + 8;
    if (!strncmp(argv[i], "--tests=", 8)) pick = argv[i] + 8;
  }
  if (!cuda_backend_available()) {
    printf("skipped: no CUDA device\n");
    return 77;
  }
  char err[256];
  threadpool *tp = NULL;
  int64_t sf = cpu_matmul_scratch_floats(8192);
  if (sf < 64 + 64 * 64 + 64 * 512 + 1024) sf = 64 + 64 * 64 + 64 * 512 + 1024;
  if (threadpool_create(&tp, 2, err, sizeof err) ||
      cpu_backend_create(&g_cpu, tp, sf, (size_t)128 * 8192 * 4, err, sizeof err) ||
      cuda_backend_create(&g_gpu, 1024, err, sizeof err)) {
    printf("FAILED: setup: %s\n", err);
    return 1;
  }
  printf("device: %s\n", cuda_backend_device_name());
  /* Exact (f32) numerics unless a test switches to the tensor-core paths on purpose. */
  cuda_backend_set_exact(g_gpu, 1);
  if (only) {
    if (!strcmp(only, "gdn")) bench_gdn();
    else if (!strcmp(only, "gemm")) bench_gemm();
    else if (!strcmp(only, "moe")) bench_moe();
    else if (!strcmp(only, "group")) bench_matmul_group();
    else if (!strcmp(only, "topk")) bench_topk();
    else if (!strcmp(only, "attn")) bench_attention(0), bench_attention(2048 - 512), bench_attention(8192 - 512);
    else if (!strcmp(only, "ops")) bench();
    else {
      printf("FAILED: unknown benchmark %s (gdn, gemm, moe, group, topk, attn, ops)\n", only);
      g_fail = 1;
    }
    cuda_backend_free(g_gpu);
    cpu_backend_free(g_cpu);
    threadpool_free(tp);
    return g_fail ? 1 : 0;
  }
  /* every test, in this order; --tests=a,b runs the named ones (e.g. under compute-sanitizer) */
  static const struct {
    const char *name;
    void (*fn)(void);
  } tests[] = {
      {"matmul", test_matmul},
      {"matvec_int8", test_matvec_int8},
      {"matmul_group", test_matmul_group},
      {"matmul_group_route", test_matmul_group_route},
      {"norm_fused", test_norm_fused},
      {"act_matmul", test_act_matmul},
      {"act_matmul_gated_add", test_act_matmul_gated_add},
      {"embed", test_embed},
      {"norms", test_norms},
      {"elementwise", test_elementwise},
      {"rope", test_rope},
      {"attention", test_attention},
      {"conv_gates", test_conv_gates},
      {"gdn", test_gdn},
      {"fused", test_fused},
      {"gdn_step", test_gdn_step},
      {"gdn_chunked", test_gdn_chunked},
      {"moe", test_moe},
      {"graph_pieces", test_graph_pieces},
      {"moe_grouped", test_moe_grouped},
      {"graphs", test_graphs},
      {"topk", test_topk},
  };
  int ran = 0;
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    if (pick) {
      const size_t len = strlen(tests[i].name);
      const char *p = pick;
      int hit = 0;
      while (*p && !hit) {
        const char *e = strchr(p, ',');
        const size_t l = e ? (size_t)(e - p) : strlen(p);
        hit = l == len && !strncmp(p, tests[i].name, len);
        p = e ? e + 1 : p + l;
      }
      if (!hit) continue;
    }
    tests[i].fn();
    ran++;
  }
  if (ran == 0) {
    printf("FAILED: no test named in --tests=%s\n", pick);
    g_fail++;
  }
  if (do_bench) {
    bench_topk();
    bench();
    bench_gemm();
    bench_gdn();
    bench_moe();
    bench_matmul_group();
  }
  cuda_backend_free(g_gpu);
  cpu_backend_free(g_cpu);
  threadpool_free(tp);
  printf("%s: %d check(s), %d failure(s)\n", g_fail ? "FAILED" : "OK", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
