/* test_cuda_mmq_bf16.c: the bf16 tensor-core decode kernel (cuda_mmq_bf.cu, tuning cuda_mmq_bf16)
 * against CPU references, and its benchmark next to the int8 kernel (cuda_mmq.cu). */
#include "cuda_test.h"

/* Round to nearest even bf16, as f32 (the kernel's __float2bfloat16_rn; no NaN in the inputs). */
static float bf16_round(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float r;
  memcpy(&r, &u, 4);
  return r;
}

/* For tokens [0, n) and all rows: ref_bf = sum_k bf16(x) bf16(w) in double (the kernel's
 * products exactly, only its f32 summation order differs), ref_f = sum_k x w in double (the
 * f32 product), mag = sum_k |bf16(x) bf16(w)| (the scale of f32 summation error). */
static void bf16_refs(const float *x, const float *wf, int64_t n, int64_t rows, int64_t cols, double *ref_bf,
                      double *ref_f, double *mag) {
  float *xb = malloc(sizeof(float) * (size_t)(n * cols)), *wb = malloc(sizeof(float) * (size_t)cols);
  for (int64_t i = 0; i < n * cols; i++) xb[i] = bf16_round(x[i]);
  for (int64_t r = 0; r < rows; r++) {
    const float *w = wf + r * cols;
    for (int64_t k = 0; k < cols; k++) wb[k] = bf16_round(w[k]);
    for (int64_t t = 0; t < n; t++) {
      const float *xt = x + t * cols, *xbt = xb + t * cols;
      double a = 0, f = 0, m = 0;
      for (int64_t k = 0; k < cols; k++) {
        const double p = (double)xbt[k] * (double)wb[k];
        a += p, m += fabs(p), f += (double)xt[k] * (double)w[k];
      }
      ref_bf[t * rows + r] = a, ref_f[t * rows + r] = f, mag[t * rows + r] = m;
    }
  }
  free(xb), free(wb);
}

/* The bf16 kernel's outputs for n tokens (mmq_bf16 on) against both references: |g - ref_bf| /
 * mag under 5e-5 (f32 summation order and the tensor cores' f32 adds only: a wrong fragment
 * map, scale or min gives O(1e-1) and more) and |g - ref_f| / mag under 1e-2 (bf16 rounding of
 * x and w, ~2^-9 per product at worst; a K permutation that pairs weights with the wrong
 * activations breaks it by far). Mode 2 (128-row blocks) must give mode 1's bits, and the same
 * tokens of the 64-token call these bits (K slices depend on the weight's shape only; padding
 * tokens are zeros); a type the kernel does not take (Q5_K) must give the int8 kernel's bits
 * with the switch on; and a recorded step (graph) the eager bits. */
void test_mmq_bf16(void) {
  printf("bf16 decode kernel (cuda_mmq_bf16) vs CPU references\n");
  const int types[] = {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K};
  /* rows (ragged: not multiples of the 128/256-row blocks), columns (1 step, split K on 4 and
   * 48 steps) */
  const int64_t shapes[][2] = {{100, 256}, {1000, 1024}, {4160, 512}, {257, 12288}, {130, 4096}};
  const int64_t ns[] = {9, 16, 17, 31, 32, 33, 48, 64}, nmax = 64;
  const int nn = (int)(sizeof ns / sizeof ns[0]);
  cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
  cuda_backend_set_exact(g_gpu, 0);
  cuda_backend_set_decode_mmq(g_gpu, 1);
  cuda_backend_set_mmq_split_k(g_gpu, 1);
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    const int type = types[ti];
    double worst_bf = 0, worst_f = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      cuda_backend_drop_mirrors(g_gpu);
      const int64_t rows = shapes[si][0], cols = shapes[si][1];
      float *wf;
      void *w = make_weight(type, rows, cols, &wf);
      float *x = hrand(nmax * cols, 1.0f);
      for (int64_t k = 0; k < cols; k += 7) x[3 * cols + k] *= 64.0f; /* a token with outliers */
      double *ref_bf = malloc(sizeof(double) * (size_t)(nmax * rows));
      double *ref_f = malloc(sizeof(double) * (size_t)(nmax * rows));
      double *mag = malloc(sizeof(double) * (size_t)(nmax * rows));
      bf16_refs(x, wf, nmax, rows, cols, ref_bf, ref_f, mag);
      ops_weight ow = {type, w, rows, cols};
      float *dx = dput(x, sizeof(float) * (size_t)(nmax * cols));
      float *g[8], *g2[8];
      for (int mode = 1; mode <= 2; mode++) {
        cuda_backend_set_mmq_bf16(g_gpu, mode);
        for (int j = 0; j < nn; j++) {
          float *dy = dnan(ns[j] * rows);
          g_gpu->matmul(g_gpu, dy, dx, ns[j], &ow, NULL);
          (mode == 1 ? g : g2)[j] = dget(dy, ns[j] * rows);
          dfree(dy);
        }
      }
      cuda_backend_set_mmq_bf16(g_gpu, 0);
      char what[128];
      snprintf(what, sizeof what, "%s %lldx%lld mmq bf16", dtype_name(type), (long long)rows, (long long)cols);
      gpu_status(what);
      for (int j = 0; j < nn; j++) {
        const int64_t n = ns[j];
        double e_bf = 0, e_f = 0;
        int64_t at = 0, bad = 0;
        for (int64_t i = 0; i < n * rows; i++) {
          const double m = mag[i] > 0 ? mag[i] : 1e-30;
          if (!isfinite(g[j][i])) {
            bad++, at = i, e_bf = INFINITY;
            continue;
          }
          const double a = fabs(g[j][i] - ref_bf[i]) / m, b = fabs(g[j][i] - ref_f[i]) / m;
          if (a > e_bf) e_bf = a, at = i;
          if (b > e_f) e_f = b;
        }
        g_checks++;
        if (!(e_bf <= 5e-5) || !(e_f <= 1e-2) || bad) {
          printf("  FAIL %s n=%lld: err/bf16 ref %.3g (token %lld row %lld: %.9g vs %.9g), err/f32 ref %.3g, "
                 "%lld non-finite\n",
                 what, (long long)n, e_bf, (long long)(at / rows), (long long)(at % rows), g[j][at], ref_bf[at], e_f,
                 (long long)bad);
          g_fail++;
        }
        worst_bf = fmax(worst_bf, e_bf), worst_f = fmax(worst_f, e_f);
        g_checks++; /* mode 2 (128-row blocks): the same bits */
        if (memcmp(g[j], g2[j], sizeof(float) * (size_t)(n * rows))) {
          int64_t i = 0;
          while (!memcmp(&g[j][i], &g2[j][i], sizeof(float))) i++;
          printf("  FAIL %s n=%lld mode 2 vs 1: token %lld row %lld: %.9g vs %.9g\n", what, (long long)n,
                 (long long)(i / rows), (long long)(i % rows), g2[j][i], g[j][i]);
          g_fail++;
        }
        if (n == nmax) continue;
        g_checks++; /* the same tokens of the 64-token call: the same bits */
        if (memcmp(g[j], g[nn - 1], sizeof(float) * (size_t)(n * rows))) {
          int64_t i = 0;
          while (!memcmp(&g[j][i], &g[nn - 1][i], sizeof(float))) i++;
          printf("  FAIL %s n=%lld vs n=64: token %lld row %lld: %.9g vs %.9g\n", what, (long long)n,
                 (long long)(i / rows), (long long)(i % rows), g[j][i], g[nn - 1][i]);
          g_fail++;
        }
      }
      for (int j = 0; j < nn; j++) free(g[j]), free(g2[j]);
      dfree(dx);
      free(w), free(wf), free(x), free(ref_bf), free(ref_f), free(mag);
    }
    printf("  %-6s largest |err| / sum|x w|: %.3g against the bf16-rounded reference, %.3g against the f32 product\n",
           dtype_name(type), worst_bf, worst_f);
  }

  /* a type it does not take: the int8 kernel's bits with the switch on */
  {
    cuda_backend_drop_mirrors(g_gpu);
    const int64_t rows = 300, cols = 1024, n = 40;
    void *w = make_weight(ANNA_DTYPE_Q5_K, rows, cols, NULL);
    ops_weight ow = {ANNA_DTYPE_Q5_K, w, rows, cols};
    float *x = hrand(n * cols, 1.0f), *dx = dput(x, sizeof(float) * (size_t)(n * cols));
    float *o[2];
    for (int v = 0; v < 2; v++) {
      float *dy = dnan(n * rows);
      cuda_backend_set_mmq_bf16(g_gpu, v);
      g_gpu->matmul(g_gpu, dy, dx, n, &ow, NULL);
      o[v] = dget(dy, n * rows);
      dfree(dy);
    }
    cuda_backend_set_mmq_bf16(g_gpu, 0);
    gpu_status("mmq bf16 fallback");
    g_checks++;
    if (memcmp(o[0], o[1], sizeof(float) * (size_t)(n * rows))) {
      printf("  FAIL Q5_K with cuda_mmq_bf16 on: not the int8 kernel's bits\n");
      g_fail++;
    }
    free(o[0]), free(o[1]), free(x), free(w);
    dfree(dx);
  }

  /* recorded steps (CUDA graph) give the eager bits, also replayed with new inputs */
  {
    cuda_backend_drop_mirrors(g_gpu);
    const int64_t rows = 700, cols = 2048, n = 33;
    void *w = make_weight(ANNA_DTYPE_Q4_K, rows, cols, NULL);
    ops_weight ow = {ANNA_DTYPE_Q4_K, w, rows, cols};
    float *dx = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)(n * cols));
    float *dy = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)(n * rows));
    float *out = malloc(sizeof(float) * (size_t)(n * rows));
    cuda_backend_set_mmq_bf16(g_gpu, 1);
    for (int step = 0; step < 3; step++) {
      float *x = hrand(n * cols, 1.0f);
      g_gpu->upload(g_gpu, dx, x, sizeof(float) * (size_t)(n * cols));
      g_gpu->matmul(g_gpu, dy, dx, n, &ow, NULL);
      float *eager = dget(dy, n * rows);
      cuda_backend_set_graphs(g_gpu, 1);
      cuda_backend_step_begin(g_gpu, n);
      g_gpu->upload(g_gpu, dx, x, sizeof(float) * (size_t)(n * cols));
      g_gpu->matmul(g_gpu, dy, dx, n, &ow, NULL);
      g_gpu->download(g_gpu, out, dy, sizeof(float) * (size_t)(n * rows));
      cuda_backend_step_end(g_gpu);
      cuda_backend_set_graphs(g_gpu, 0);
      gpu_status("mmq bf16 graph");
      g_checks++;
      if (memcmp(out, eager, sizeof(float) * (size_t)(n * rows))) {
        printf("  FAIL mmq bf16 recorded step %d: not the eager bits\n", step);
        g_fail++;
      }
      free(x), free(eager);
    }
    cuda_backend_set_mmq_bf16(g_gpu, 0);
    dfree(dx), dfree(dy);
    free(out), free(w);
    cuda_backend_drop_mirrors(g_gpu);
  }
  cuda_backend_set_mmq_split_k(g_gpu, 0);
  cuda_backend_set_decode_mmq(g_gpu, 0);
  cuda_backend_set_exact(g_gpu, 1); /* the harness default */
}

/* --bench=mmq (after bench_mmq): the bf16 kernel (modes 1, 2) next to the int8 kernel's form 0 on the 9B
 * shape's weights at 16, 32 and 64 tokens, split K on (the default), time per call including
 * the activation pass and the slice reduction; GB/s = the weight's bytes / time. The lm_head
 * (248320 rows) repeats a 4096-row weight (the bytes do not matter to the time). */
void bench_mmq_bf16(void) {
  printf("bench mmq bf16 (bf16 tensor-core decode kernel, tuning cuda_mmq_bf16 1: 256-row blocks at 32/64 tokens, 2: "
         "128-row blocks; vs int8 form 0; xN = speed-up)\n");
  const int64_t shapes[][3] = {{ANNA_DTYPE_Q4_K, 4096, 4096},  {ANNA_DTYPE_Q4_K, 12288, 4096},
                               {ANNA_DTYPE_Q6_K, 4096, 12288}, {ANNA_DTYPE_Q4_K, 4096, 12288},
                               {ANNA_DTYPE_Q4_K, 1024, 4096},  {ANNA_DTYPE_Q4_K, 2048, 4096},
                               {ANNA_DTYPE_Q6_K, 1024, 4096},  {ANNA_DTYPE_Q6_K, 248320, 4096}};
  const int64_t ns[] = {16, 32, 64}, nmax = 64;
  cuda_backend_set_exact(g_gpu, 0);
  cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
  cuda_backend_set_decode_mmq(g_gpu, 1);
  cuda_backend_set_mmq_split_k(g_gpu, 1);
  cuda_backend_set_mmq_v2(g_gpu, 0);
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int type = (int)shapes[si][0];
    const int64_t rows = shapes[si][1], cols = shapes[si][2], base = rows < 4096 ? rows : 4096;
    const int64_t rb = dtype_row_bytes(type, cols);
    uint8_t *w = make_weight(type, base, cols, NULL);
    if (rows > base) {
      uint8_t *big = malloc((size_t)(rb * rows));
      for (int64_t r = 0; r < rows; r += base)
        memcpy(big + r * rb, w, (size_t)(rb * (rows - r < base ? rows - r : base)));
      free(w);
      w = big;
    }
    ops_weight ow = {type, w, rows, cols};
    float *x = hrand(nmax * cols, 1.0f), *dx = dput(x, sizeof(float) * (size_t)(nmax * cols)), *dy = dnan(nmax * rows);
    const double wbytes = (double)rb * rows;
    for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
      double us[3];
      for (int v = 0; v < 3; v++) {
        cuda_backend_set_mmq_bf16(g_gpu, v);
        g_gpu->matmul(g_gpu, dy, dx, ns[j], &ow, NULL);
        gpu_status("mmq bf16 bench warmup");
        const int reps = rows > 100000 ? 20 : 200;
        const double t0 = now_s();
        for (int r = 0; r < reps; r++) g_gpu->matmul(g_gpu, dy, dx, ns[j], &ow, NULL);
        gpu_status("mmq bf16 bench");
        us[v] = (now_s() - t0) / reps * 1e6;
      }
      printf("  mmq %-6s n=%-3lld %6lldx%-5lld: int8 form 0 %8.1f us (%5.0f GB/s), bf16 mode 1 %8.1f us (%5.0f GB/s, "
             "x%.2f), mode 2 %8.1f us (%5.0f GB/s, x%.2f)\n",
             dtype_name(type), (long long)ns[j], (long long)rows, (long long)cols, us[0], wbytes / us[0] / 1e3, us[1],
             wbytes / us[1] / 1e3, us[0] / us[1], us[2], wbytes / us[2] / 1e3, us[0] / us[2]);
    }
    cuda_backend_set_mmq_bf16(g_gpu, 0);
    dfree(dx), dfree(dy);
    cuda_backend_drop_mirrors(g_gpu);
    free(x), free(w);
  }
  cuda_backend_set_mmq_split_k(g_gpu, 0);
  cuda_backend_set_decode_mmq(g_gpu, 0);
  cuda_backend_set_exact(g_gpu, 1);
}
