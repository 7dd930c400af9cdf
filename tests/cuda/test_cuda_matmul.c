/* test_cuda_matmul.c: the CUDA matmul op against an f64 dequantize-then-dot reference: decode
 * matvecs (f32 and int8 activations, both int8 row variants), the prefill GEMMs (tensor cores
 * in bf16 hi + lo, bf16 single rounding, 128-row dequantization tiles) with per-output bounds;
 * and the prefill GEMM benchmark (--bench=gemm). */
#include "cuda_test.h"

/* Float weight types: exact on the tensor-core path too (bf16 used in place with split
 * activations; f16/f32 stay on SGEMM). */
static int cuda_float_type_host(int t) {
  return t == ANNA_DTYPE_F32 || t == ANNA_DTYPE_F16 || t == ANNA_DTYPE_BF16;
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

/* Prefill GEMM with activations rounded once to bf16 (CUDA_GEMM_BF16_SINGLE, --dtype bf16;
 * exact off) against the f64 dot of the f32 inputs: activations rounded once to bf16
 * (relative error <= 2^-8 each), a quantized weight's dequantized values too, so output r may
 * differ by sum_i |w_ri x_i| * (2^-8 + 2^-8 + 2^-16) (1% slack) plus 1e-5 * sum_i |w_ri x_i|
 * for the f32 accumulation. Fresh NaN outputs: an unwritten one fails. Leaves the variant at
 * CUDA_GEMM_BF16 and exact mode on. Returns the largest error / bound. */
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
  const double q = bound_check(what, g, ref, bnd, n * rows, "bf16");
  free(g), free(ref), free(bnd);
  dfree(dy);
  return q;
}

void test_matmul(void) {
  printf("matmul\n");
  /* f32 activations in the decode matvecs (the int8 path has its own test and bound) */
  cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_F32);
  const int types[] = {ANNA_DTYPE_F32,  ANNA_DTYPE_F16,  ANNA_DTYPE_BF16, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q4_0,
                       ANNA_DTYPE_Q4_1, ANNA_DTYPE_Q5_0, ANNA_DTYPE_Q5_1, ANNA_DTYPE_IQ4_NL, ANNA_DTYPE_Q2_K,
                       ANNA_DTYPE_Q3_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q5_K, ANNA_DTYPE_Q6_K, ANNA_DTYPE_IQ4_XS,
                       ANNA_DTYPE_IQ2_XXS, ANNA_DTYPE_IQ2_XS, ANNA_DTYPE_IQ2_S, ANNA_DTYPE_IQ3_XXS, ANNA_DTYPE_IQ3_S};
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
 * 24576 columns (270 KB: past any limit, the f32 kernel takes them). n = 9..64: the int8
 * tensor-core kernel of decode batches (cuda_mmq.cu), the same activation rounding, so the
 * same bound. */
void test_matvec_int8(void) {
  printf("matvec int8 activations\n");
  const int types[] = {ANNA_DTYPE_Q4_0,    ANNA_DTYPE_IQ4_NL, ANNA_DTYPE_IQ4_XS,  ANNA_DTYPE_Q8_0,
                       ANNA_DTYPE_Q4_K,    ANNA_DTYPE_Q5_K,   ANNA_DTYPE_Q6_K,    ANNA_DTYPE_IQ2_XXS,
                       ANNA_DTYPE_IQ2_XS,  ANNA_DTYPE_IQ2_S,  ANNA_DTYPE_IQ3_XXS, ANNA_DTYPE_IQ3_S};
  const int shapes[][3] = {{1, 17, 1}, {2, 300, 4}, {3, 129, 2}, {4, 64, 3}, {5, 33, 1},
                           {7, 100, 2}, {8, 129, 3}, {1, 20001, 2}, {3, 9001, 1}, {8, 40, 32}, {8, 24, 96},
                           /* decode batches on int8 tensor cores (cuda_mmq.cu): 16/32/64-token tiles,
                            * partial tiles of tokens and rows, several 256-column steps */
                           {9, 100, 2}, {16, 64, 4}, {17, 129, 3}, {33, 200, 1}, {40, 65, 5}, {64, 1000, 16}};
  cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
  cuda_backend_set_decode_mmq(g_gpu, 1);
  /* the MMQ shapes with and without K slices (tuning cuda_mmq_split_k); the matvec ignores it */
  for (int split = 0; split < 2; split++) {
  cuda_backend_set_mmq_split_k(g_gpu, split);
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
        snprintf(what, sizeof what, "%s n=%lld %lldx%lld%s%s%s", dtype_name(type), (long long)n, (long long)rows,
                 (long long)cols, bias ? " +bias" : "", exact ? " exact" : pass ? " int8 r4" : " int8",
                 split ? " split-K" : "");
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
    printf("  %-6s%s largest error / bound %.3f\n", dtype_name(type), split ? " split-K" : "", worst);
  }
  }
  cuda_backend_set_mmq_split_k(g_gpu, 0);
  cuda_backend_set_decode_mmq(g_gpu, 0);
}

/* Prefill GEMM throughput: n tokens x a 12288 x 4096 weight, f32 path (exact) against the
 * tensor-core paths (bf16: dequantized weights, the default numerics and the hi + lo split
 * for every type); TFLOP/s = 2 * n * rows * cols / time (quantization included). Q4_K
 * also at 2048 and 8192 tokens (the issue-6 prefill size). */
void bench_gemm(void) {
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
    for (int mode = 0; mode < 3; mode++) { /* f32, bf16 tensor cores (default, split) */
      if (mode == 2 && type == ANNA_DTYPE_BF16) continue; /* its default is the split */
      cuda_backend_set_exact(g_gpu, mode == 0);
      cuda_backend_set_gemm_variant(g_gpu, mode == 2 ? CUDA_GEMM_BF16_SPLIT : CUDA_GEMM_BF16);
      g_gpu->matmul(g_gpu, dy, dx, n, &ow, NULL);
      gpu_status("gemm warmup");
      const int reps = n >= 8192 ? 5 : 20;
      double t0 = now_s();
      for (int r = 0; r < reps; r++) g_gpu->matmul(g_gpu, dy, dx, n, &ow, NULL);
      gpu_status("gemm");
      double dt = (now_s() - t0) / reps;
      printf("  gemm %-6s n=%-4lld %lldx%lld %-12s: %8.1f us, %6.1f TFLOP/s\n", dtype_name(type), (long long)n,
             (long long)rows, (long long)cols,
             mode == 0 ? "f32" : mode == 1 ? "tensor cores" : "tc split", dt * 1e6,
             2.0 * n * rows * cols / dt / 1e12);
    }
    cuda_backend_drop_mirrors(g_gpu);
    free(w);
  }
  /* decode batches: the int8 paths (matvec up to 8 tokens, cuda_mmq above) against the bf16
   * tensor-core GEMM they replace (the f32-activation variant turns the int8 paths off);
   * GB/s = the weight's bytes / time */
  const int dtypes[] = {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K};
  const int64_t dns[] = {8, 16, 32, 64};
  cuda_backend_set_exact(g_gpu, 0);
  cuda_backend_set_decode_mmq(g_gpu, 1);
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
    float *f;
    void *w = make_weight(dtypes[i], rows, cols, &f);
    free(f);
    ops_weight ow = {dtypes[i], w, rows, cols};
    const double wbytes = (double)dtype_row_bytes(dtypes[i], cols) * rows;
    for (size_t j = 0; j < sizeof dns / sizeof dns[0]; j++)
      for (int mode = 0; mode < 2; mode++) {
        cuda_backend_set_matvec_variant(g_gpu, mode ? CUDA_MV_F32 : CUDA_MV_DEFAULT);
        g_gpu->matmul(g_gpu, dy, dx, dns[j], &ow, NULL);
        gpu_status("decode batch warmup");
        const int reps = 50;
        double t0 = now_s();
        for (int r = 0; r < reps; r++) g_gpu->matmul(g_gpu, dy, dx, dns[j], &ow, NULL);
        gpu_status("decode batch");
        double dt = (now_s() - t0) / reps;
        printf("  batch %-6s n=%-3lld %lldx%lld %-14s: %8.1f us, %6.0f GB/s of weights\n", dtype_name(dtypes[i]),
               (long long)dns[j], (long long)rows, (long long)cols,
               mode ? "bf16 GEMM" : dns[j] <= 8 ? "int8 matvec" : "int8 mmq", dt * 1e6, wbytes / dt / 1e9);
      }
    cuda_backend_drop_mirrors(g_gpu);
    free(w);
  }
  cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
  cuda_backend_set_decode_mmq(g_gpu, 0);
  cuda_backend_set_gemm_variant(g_gpu, CUDA_GEMM_BF16);
  cuda_backend_set_exact(g_gpu, 1);
  dfree(dx), dfree(dy), free(x);
}

/* Batch invariance (tuning cuda_batch_invariant): with it on, each token's row of a matmul,
 * a matmul group and an act_matmul is bit for bit the one that token gets alone (n = 1), for
 * every size (the one-token matvec / group / activation folds are off, the int8 kernel takes
 * all sizes of its types in 64-token calls, the others the matvec in groups of 8): the
 * property that makes the greedy outputs of requests decoded together equal to those decoded
 * alone. Shapes cross the 8-token matvec groups and the 64-token calls; f32 and bf16 weights
 * take the matvec path. A deferred add_rmsnorm before the one-token call must not change
 * the bits either (the fold is off). */
void test_batch_invariant(void) {
  printf("batch invariance\n");
  const int types[] = {ANNA_DTYPE_Q4_0, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q5_K,
                       ANNA_DTYPE_Q6_K, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_F32, ANNA_DTYPE_BF16,
                       ANNA_DTYPE_IQ2_XXS, ANNA_DTYPE_IQ2_XS, ANNA_DTYPE_IQ3_S};
  const int64_t ns[] = {2, 9, 13, 64, 100, 300};
  cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
  cuda_backend_set_exact(g_gpu, 0);
  cuda_backend_set_batch_invariant(g_gpu, 1);
  for (int split = 0; split < 2; split++) { /* K slices (cuda_mmq_split_k) keep the property */
  cuda_backend_set_mmq_split_k(g_gpu, split);
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    const int type = types[ti];
    const int64_t rows = 200, cols = 512, nmax = 300;
    cuda_backend_drop_mirrors(g_gpu);
    float *wf;
    void *w = make_weight(type, rows, cols, &wf);
    ops_weight ow = {type, w, rows, cols};
    float *x = hrand(nmax * cols, 1.0f);
    float *dx = dput(x, sizeof(float) * (size_t)(nmax * cols));
    /* alone: each token by itself */
    float *alone = malloc(sizeof(float) * (size_t)(nmax * rows));
    for (int64_t t = 0; t < nmax; t++) {
      float *dy = dnan(rows);
      g_gpu->matmul(g_gpu, dy, dx + t * cols, 1, &ow, NULL);
      float *g = dget(dy, rows);
      memcpy(alone + t * rows, g, sizeof(float) * (size_t)rows);
      free(g);
      dfree(dy);
    }
    gpu_status("batch invariance: alone");
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
      const int64_t n = ns[k];
      float *dy = dnan(n * rows);
      g_gpu->matmul(g_gpu, dy, dx, n, &ow, NULL);
      float *g = dget(dy, n * rows);
      char what[96];
      snprintf(what, sizeof what, "%s n=%lld matmul%s", dtype_name(type), (long long)n, split ? " split-K" : "");
      gpu_status(what);
      g_checks++;
      if (memcmp(g, alone, sizeof(float) * (size_t)(n * rows))) {
        int64_t i = 0;
        while (g[i] == alone[i]) i++;
        printf("  FAIL %s: token %lld row %lld: %.9g batched vs %.9g alone\n", what, (long long)(i / rows),
               (long long)(i % rows), g[i], alone[i]);
        g_fail++;
      }
      free(g);
      dfree(dy);
    }
    /* a group of two (q/k-like) and an act_matmul at n = 1 and n = 13 */
    {
      float *wf2;
      void *w2 = make_weight(type, 96, cols, &wf2);
      ops_weight ow2 = {type, w2, 96, cols};
      const ops_weight *ws[2] = {&ow, &ow2};
      float *a1 = dnan(rows), *b1 = dnan(96), *an = dnan(13 * rows), *bn = dnan(13 * 96);
      float *y1[2] = {a1, b1}, *yn[2] = {an, bn};
      g_gpu->matmul_group(g_gpu, 2, y1, dx + 12 * cols, 1, ws, NULL);
      g_gpu->matmul_group(g_gpu, 2, yn, dx, 13, ws, NULL);
      float *ga = dget(a1, rows), *gb = dget(b1, 96), *gan = dget(an, 13 * rows), *gbn = dget(bn, 13 * 96);
      char what[96];
      snprintf(what, sizeof what, "%s matmul_group n=13 token 12", dtype_name(type));
      gpu_status(what);
      g_checks++;
      if (memcmp(ga, gan + 12 * rows, sizeof(float) * (size_t)rows) || memcmp(gb, gbn + 12 * 96, sizeof(float) * 96) ||
          memcmp(ga, alone + 12 * rows, sizeof(float) * (size_t)rows)) {
        printf("  FAIL %s: differs from the lone token\n", what);
        g_fail++;
      }
      free(ga), free(gb), free(gan), free(gbn);
      dfree(a1), dfree(b1), dfree(an), dfree(bn);
      cuda_backend_drop_mirrors(g_gpu); /* w2's mirror, before its host copy goes */
      free(w2), free(wf2);
    }
    dfree(dx);
    /* the mirrors are keyed by host address: drop them before the host copies go, or a later
     * test's weight allocated at the same address would find this one's device copy */
    cuda_backend_drop_mirrors(g_gpu);
    free(w), free(wf), free(x), free(alone);
  }
  }
  cuda_backend_set_mmq_split_k(g_gpu, 0);
  cuda_backend_set_batch_invariant(g_gpu, 0);
}

/* The int8 decode kernel's forms (tuning cuda_mmq_v2: 0 128 threads; 1 256 threads, 8 warps
 * per block; 2 the same with 128-column K steps; 3 form 2 with packed scales): the same
 * per-(row, token) dots in the same order, so the outputs of 1-3 must equal those of 0 bit for bit, with and without K
 * slices, and be within the int8 bound of the f64 reference (int8_ref_bound). Token counts cross the 16/32/64-token tiles (partial tiles
 * included), rows are not multiples of the 64-row block, columns span several 256-column steps
 * (32-element formats also a partial last step), and one shape has enough rows for several
 * row blocks with few K slices. Then batch invariance with v2: in batch-invariant mode a
 * token alone (n = 1, the 16-token tile) equals its row of a 64-token call and the 128-thread
 * kernel's lone result, in every v2 form. */
void test_mmq_v2(void) {
  printf("int8 decode kernel: 256-thread form (cuda_mmq_v2) vs 128-thread\n");
  const int types[] = {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q5_K,
                       ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_Q4_0, ANNA_DTYPE_IQ4_NL, ANNA_DTYPE_IQ2_XXS,
                       ANNA_DTYPE_IQ2_S, ANNA_DTYPE_IQ3_XXS};
  /* n, rows, column steps (32-element formats: 32 (3 + 5 steps) columns, not whole steps) */
  const int shapes[][3] = {{9, 100, 2}, {16, 65, 4}, {33, 200, 3}, {64, 130, 8}, {64, 1000, 16}, {40, 63, 1}};
  cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
  cuda_backend_set_exact(g_gpu, 0);
  cuda_backend_set_decode_mmq(g_gpu, 1);
  for (int split = 0; split < 2; split++) {
    cuda_backend_set_mmq_split_k(g_gpu, split);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
      const int type = types[ti];
      const int64_t bs = dtype_block_size(type);
      double worst = 0;
      for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        cuda_backend_drop_mirrors(g_gpu);
        const int64_t n = shapes[s][0], rows = shapes[s][1];
        const int64_t cols = bs == 32 && s % 2 == 0 ? 32 * (3 + 5 * shapes[s][2]) : 256 * shapes[s][2];
        float *wf;
        void *w = make_weight(type, rows, cols, &wf);
        float *x = hrand(n * cols, 1.0f);
        for (int j = 64; j < 96; j++) x[cols + j] = 0.0f; /* token 1, block 2: scale 0 */
        float *ref;
        double *bnd;
        int8_ref_bound(x, wf, NULL, n, rows, cols, 0.0, &ref, &bnd);
        ops_weight ow = {type, w, rows, cols};
        float *dx = dput(x, sizeof(float) * (size_t)(n * cols));
        float *g[4];
        for (int v2 = 0; v2 < 4; v2++) {
          float *dy = dnan(n * rows);
          cuda_backend_set_mmq_v2(g_gpu, v2);
          g_gpu->matmul(g_gpu, dy, dx, n, &ow, NULL);
          g[v2] = dget(dy, n * rows);
          dfree(dy);
        }
        for (int v2 = 0; v2 < 4; v2++) {
          char what[128];
          snprintf(what, sizeof what, "%s n=%lld %lldx%lld mmq form %d%s", dtype_name(type), (long long)n,
                   (long long)rows, (long long)cols, v2, split ? " split-K" : "");
          gpu_status(what);
          worst = fmax(worst, bound_check(what, g[v2], ref, bnd, n * rows, "int8"));
          if (v2 == 0) continue;
          g_checks++;
          if (memcmp(g[0], g[v2], sizeof(float) * (size_t)(n * rows))) {
            int64_t i = 0;
            while (!memcmp(&g[0][i], &g[v2][i], sizeof(float))) i++;
            printf("  FAIL %s: token %lld row %lld: %.9g vs %.9g (128 threads)\n", what, (long long)(i / rows),
                   (long long)(i % rows), g[v2][i], g[0][i]);
            g_fail++;
          }
        }
        dfree(dx);
        free(g[0]), free(g[1]), free(g[2]), free(g[3]), free(w), free(wf), free(x), free(ref), free(bnd);
      }
      printf("  %-6s%s largest error / bound %.3f (forms 0-3)\n", dtype_name(type), split ? " split-K" : "", worst);
    }
  }
  cuda_backend_set_mmq_v2(g_gpu, 0);
  cuda_backend_set_decode_mmq(g_gpu, 0);

  /* batch invariance with v2 (split K on, the default) */
  cuda_backend_set_batch_invariant(g_gpu, 1);
  cuda_backend_set_mmq_split_k(g_gpu, 1);
  const int btypes[] = {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K, ANNA_DTYPE_IQ4_XS};
  for (size_t ti = 0; ti < sizeof btypes / sizeof btypes[0]; ti++) {
    const int type = btypes[ti];
    const int64_t rows = 136, cols = 1024, n = 64;
    cuda_backend_drop_mirrors(g_gpu);
    void *w = make_weight(type, rows, cols, NULL);
    ops_weight ow = {type, w, rows, cols};
    float *x = hrand(n * cols, 1.0f), *dx = dput(x, sizeof(float) * (size_t)(n * cols));
    for (int form = 1; form < 4; form++) {
      float *dy = dnan(n * rows);
      cuda_backend_set_mmq_v2(g_gpu, form);
      g_gpu->matmul(g_gpu, dy, dx, n, &ow, NULL);
      float *all = dget(dy, n * rows);
      dfree(dy);
      const int64_t picks[] = {0, 17, 63};
      for (size_t k = 0; k < sizeof picks / sizeof picks[0]; k++) {
        const int64_t t = picks[k];
        float *alone[2];
        for (int v = 0; v < 2; v++) { /* the 128-thread kernel, then this form */
          float *d1 = dnan(rows);
          cuda_backend_set_mmq_v2(g_gpu, v ? form : 0);
          g_gpu->matmul(g_gpu, d1, dx + t * cols, 1, &ow, NULL);
          alone[v] = dget(d1, rows);
          dfree(d1);
        }
        char what[96];
        snprintf(what, sizeof what, "%s token %lld of 64 vs alone, mmq form %d", dtype_name(type), (long long)t, form);
        gpu_status(what);
        g_checks++;
        if (memcmp(alone[1], all + t * rows, sizeof(float) * (size_t)rows) ||
            memcmp(alone[0], alone[1], sizeof(float) * (size_t)rows)) {
          printf("  FAIL %s: differs (in the batch, alone, 128 threads alone)\n", what);
          g_fail++;
        }
        free(alone[0]), free(alone[1]);
      }
      free(all);
    }
    dfree(dx);
    cuda_backend_drop_mirrors(g_gpu);
    free(x), free(w);
  }
  cuda_backend_set_mmq_v2(g_gpu, 0);
  cuda_backend_set_mmq_split_k(g_gpu, 0);
  cuda_backend_set_batch_invariant(g_gpu, 0);
  cuda_backend_set_exact(g_gpu, 1); /* the harness default */
}

/* --bench=mmq: the int8 decode kernel, 128 threads vs the v2 forms (tuning cuda_mmq_v2 1, 2), on the 9B
 * shape's weights (4096 x 4096: q/o-like; 12288 x 4096: gate/up-like; Q6_K for the ffn_down-like
 * rows Q4_K_M keeps in 6 bits) at 16, 32 and 64 tokens, split K on (the default). Time per call
 * includes the activation quantization (and the slice reduction), as a decode step pays it;
 * GB/s = the weight's bytes / time. */
void bench_mmq(void) {
  printf("bench mmq (int8 decode kernel, tuning cuda_mmq_v2: 0 = 128 threads, 1 = 256 threads, 2 = 1 + 128-column "
         "steps, 3 = 2 + packed scales; xN = speed-up over 0)\n");
  const int64_t shapes[][3] = {{ANNA_DTYPE_Q4_K, 4096, 4096}, {ANNA_DTYPE_Q4_K, 12288, 4096},
                               {ANNA_DTYPE_Q6_K, 4096, 12288}};
  const int64_t ns[] = {16, 32, 64}, nmax = 64;
  cuda_backend_set_exact(g_gpu, 0);
  cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
  cuda_backend_set_decode_mmq(g_gpu, 1);
  cuda_backend_set_mmq_split_k(g_gpu, 1);
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int type = (int)shapes[si][0];
    const int64_t rows = shapes[si][1], cols = shapes[si][2];
    void *w = make_weight(type, rows, cols, NULL);
    ops_weight ow = {type, w, rows, cols};
    float *x = hrand(nmax * cols, 1.0f), *dx = dput(x, sizeof(float) * (size_t)(nmax * cols)), *dy = dnan(nmax * rows);
    const double wbytes = (double)dtype_row_bytes(type, cols) * rows;
    for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
      double us[4];
      for (int v2 = 0; v2 < 4; v2++) {
        cuda_backend_set_mmq_v2(g_gpu, v2);
        g_gpu->matmul(g_gpu, dy, dx, ns[j], &ow, NULL);
        gpu_status("mmq bench warmup");
        const int reps = 200;
        const double t0 = now_s();
        for (int r = 0; r < reps; r++) g_gpu->matmul(g_gpu, dy, dx, ns[j], &ow, NULL);
        gpu_status("mmq bench");
        us[v2] = (now_s() - t0) / reps * 1e6;
      }
      printf("  mmq %-6s n=%-3lld %5lldx%-5lld: form 0 %7.1f us (%4.0f GB/s), 1 %7.1f us (x%.2f), 2 %7.1f us (x%.2f), "
             "3 %7.1f us (x%.2f)\n",
             dtype_name(type), (long long)ns[j], (long long)rows, (long long)cols, us[0], wbytes / us[0] / 1e3, us[1],
             us[0] / us[1], us[2], us[0] / us[2], us[3], us[0] / us[3]);
    }
    dfree(dx), dfree(dy);
    cuda_backend_drop_mirrors(g_gpu);
    free(x), free(w);
  }
  cuda_backend_set_mmq_v2(g_gpu, 0);
  cuda_backend_set_mmq_split_k(g_gpu, 0);
  cuda_backend_set_decode_mmq(g_gpu, 0);
  cuda_backend_set_exact(g_gpu, 1);
}
