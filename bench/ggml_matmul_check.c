/* ggml_matmul_check.c: anna's CPU matmul against ggml's own (the llama.cpp build from
 * scripts/setup_llamacpp.sh) on the same quantized weights and f32 activations.
 *
 * In its default mode anna quantizes activations as ggml-cpu does and multiplies in
 * integers, so the two should differ by float summation order only (~1e-6 of sum |w x|);
 * anna's --exact mode differs by the 8-bit activation rounding (~1e-3). Not part of ctest
 * (it needs the llama.cpp build); run with bench/ggml_matmul_check.sh.
 *
 * Weights: random blocks with sane f16 scales; activations: Gaussian-ish. Shapes: a few
 * rows x K for token counts 1 (decode: ggml vec_dot) and 64 (prefill: anna's GEMM). */
#include "backends/cpu/cpu_backend.h"
#include "base/threadpool.h"
#include "formats/dtype.h"
#include "formats/quant.h"

#include <ggml-cpu.h>
#include <ggml.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 12345;
static uint64_t rnd(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return g_rng;
}
static float frand(void) { return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }

/* f16 scale fields per block (d, and dmin / m where the type has one). */
static void scale_fields(int type, int f[2]) {
  f[0] = 0, f[1] = -1;
  switch (type) {
  case ANNA_DTYPE_Q4_1: case ANNA_DTYPE_Q5_1: case ANNA_DTYPE_Q4_K: case ANNA_DTYPE_Q5_K: f[1] = 2; break;
  case ANNA_DTYPE_Q6_K: f[0] = 208; break;
  case ANNA_DTYPE_Q2_K: f[0] = 80, f[1] = 82; break;
  case ANNA_DTYPE_Q3_K: f[0] = 108; break;
  default: break;
  }
}

int main(int argc, char **argv) {
  const int nth = argc > 1 ? atoi(argv[1]) : 2;
  /* anna dtype ids are ggml's type ids (formats/dtype.h) */
  const int types[] = {ANNA_DTYPE_Q4_0, ANNA_DTYPE_Q4_1, ANNA_DTYPE_Q5_0, ANNA_DTYPE_Q5_1, ANNA_DTYPE_Q8_0,
                       ANNA_DTYPE_IQ4_NL, ANNA_DTYPE_Q2_K, ANNA_DTYPE_Q3_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q5_K,
                       ANNA_DTYPE_Q6_K, ANNA_DTYPE_IQ4_XS};
  const int64_t rows = 96, K = 1024, nmax = 64;
  threadpool *tp = NULL;
  ops_backend *be = NULL;
  char err[256];
  if (threadpool_create(&tp, nth, err, sizeof err) ||
      cpu_backend_create(&be, tp, cpu_matmul_scratch_floats(K), (size_t)(nmax + 32) * K * 4, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  float *x = malloc(sizeof(float) * nmax * K), *ya = malloc(sizeof(float) * nmax * rows);
  double worst = 0;
  printf("%-7s %4s  %-28s %-28s\n", "type", "n", "anna default vs ggml", "anna --exact vs ggml");
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    const int type = types[ti];
    const int64_t rb = dtype_row_bytes(type, K), bb = dtype_block_bytes(type), nb = rows * K / dtype_block_size(type);
    struct ggml_init_params ip = {(size_t)256 << 20, NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *W = ggml_new_tensor_2d(ctx, (enum ggml_type)type, K, rows);
    uint8_t *w = W->data;
    for (int64_t i = 0; i < rows * rb; i++) w[i] = (uint8_t)rnd();
    int f[2];
    scale_fields(type, f);
    for (int64_t b = 0; b < nb; b++)
      for (int k = 0; k < 2 && f[k] >= 0; k++) {
        const uint16_t h = quant_f32_to_f16((0.2f + 0.8f * fabsf(frand())) * 0.01f);
        memcpy(w + b * bb + f[k], &h, 2);
      }
    for (int64_t i = 0; i < nmax * K; i++) x[i] = (frand() + frand() + frand()) * (i % 97 == 3 ? 8.0f : 1.0f);
    const int64_t ns[2] = {1, nmax};
    for (int ni = 0; ni < 2; ni++) {
      const int64_t n = ns[ni];
      struct ggml_tensor *X = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, n);
      memcpy(X->data, x, sizeof(float) * n * K);
      struct ggml_tensor *Y = ggml_mul_mat(ctx, W, X); /* [rows, n] */
      struct ggml_cgraph *gf = ggml_new_graph(ctx);
      ggml_build_forward_expand(gf, Y);
      ggml_graph_compute_with_ctx(ctx, gf, nth);
      const float *yg = Y->data;
      ops_weight ow = {type, w, rows, K};
      double e[2];
      for (int mode = 0; mode < 2; mode++) {
        cpu_backend_set_exact_matmul(be, mode);
        be->matmul(be, ya, x, n, &ow, NULL);
        e[mode] = 0;
        float *deq = malloc(sizeof(float) * K);
        for (int64_t r = 0; r < rows; r++) {
          quant_dequantize_row(type, w + r * rb, deq, K);
          for (int64_t t = 0; t < n; t++) {
            double mag = 0;
            for (int64_t k = 0; k < K; k++) mag += fabs((double)deq[k] * x[t * K + k]);
            e[mode] = fmax(e[mode], fabs((double)ya[t * rows + r] - yg[t * rows + r]) / mag);
          }
        }
        free(deq);
      }
      cpu_backend_set_exact_matmul(be, 0);
      printf("%-7s %4lld  %-28.2e %-28.2e\n", ggml_type_name((enum ggml_type)type), (long long)n, e[0], e[1]);
      worst = fmax(worst, e[0]);
    }
    ggml_free(ctx);
  }
  printf("worst anna-default vs ggml: %.2e of sum |w x| (float summation order: expect < 1e-5)\n", worst);
  free(x), free(ya);
  cpu_backend_free(be);
  threadpool_free(tp);
  return worst < 1e-5 ? 0 : 1;
}
