/* ggml_quant_check.c: anna's encoders (formats/quant_encode.h) against ggml's own
 * ggml_quantize_chunk (no importance matrix) from the llama.cpp build of
 * scripts/setup_llamacpp.sh: byte identity on random rows (several distributions, zeros,
 * outliers, tiny and huge scales) and on real weight rows (dequantized from a GGUF, default:
 * the default model). Not part of ctest (it needs ggml); run with bench/ggml_quant_check.sh.
 *
 * With a second argument it also writes the golden the ctest compares against
 * (tests/fixtures/quant/golden.bin): a few rows per type, ggml's bytes.
 * Format: "AQG1", u32 count, then per entry: u32 type, u32 n, n f32 inputs, u32 nbytes, bytes. */
#include "formats/dtype.h"
#include "formats/gguf.h"
#include "formats/quant.h"
#include "formats/quant_encode.h"

#include <ggml.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return g_rng;
}
static float frand(void) { return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)); }
static float gauss(void) {
  float u = frand() + 1e-12f, v = frand();
  return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* Row kinds: 0 gaussian, 1 uniform [-1,1], 2 gaussian with outliers, 3 all zero, 4 positive
 * only, 5 tiny scale (1e-6), 6 huge scale (1e3), 7 sparse (90% zero), 8 bf16-rounded gaussian. */
static void gen_row(int kind, float *x, int64_t n) {
  const float s = 0.02f + 0.2f * frand();
  for (int64_t i = 0; i < n; i++) {
    float g = gauss() * s;
    switch (kind) {
    case 1: x[i] = 2 * frand() - 1; break;
    case 2: x[i] = (rnd() % 97 == 0) ? g * 40 : g; break;
    case 3: x[i] = 0; break;
    case 4: x[i] = fabsf(g); break;
    case 5: x[i] = g * 1e-4f; break;
    case 6: x[i] = g * 1e4f; break;
    case 7: x[i] = (rnd() % 10) ? 0 : g; break;
    case 8: {
      uint32_t b;
      memcpy(&b, &g, 4);
      b &= 0xffff0000u;
      memcpy(&x[i], &b, 4);
      break;
    }
    default: x[i] = g;
    }
  }
}

typedef struct golden {
  FILE *f;
  uint32_t count;
} golden;

static void golden_put(golden *g, int type, const float *x, int64_t n, const void *bytes, size_t nb) {
  if (!g->f) return;
  uint32_t h[2] = {(uint32_t)type, (uint32_t)n}, b = (uint32_t)nb;
  fwrite(h, 4, 2, g->f);
  fwrite(x, 4, (size_t)n, g->f);
  fwrite(&b, 4, 1, g->f);
  fwrite(bytes, 1, nb, g->f);
  g->count++;
}

static int check_rows(int type, const float *x, int64_t nrow, int64_t n, const char *what, golden *gd, int n_gold) {
  const size_t rb = (size_t)dtype_row_bytes(type, n);
  unsigned char *a = malloc(rb * (size_t)nrow), *b = malloc(rb * (size_t)nrow);
  for (int64_t r = 0; r < nrow; r++) quant_encode_row(type, x + r * n, a + rb * (size_t)r, n);
  ggml_quantize_chunk((enum ggml_type)type, x, b, 0, nrow, n, NULL);
  int64_t bad = 0, first = -1;
  for (int64_t r = 0; r < nrow; r++)
    if (memcmp(a + rb * (size_t)r, b + rb * (size_t)r, rb)) {
      if (first < 0) first = r;
      bad++;
    }
  printf("%-5s %-28s rows %5lld x %5lld: %s", dtype_name(type), what, (long long)nrow, (long long)n,
         bad ? "MISMATCH" : "identical");
  if (bad) printf(" (%lld rows differ, first %lld)", (long long)bad, (long long)first);
  printf("\n");
  for (int r = 0; r < n_gold && r < nrow; r++) golden_put(gd, type, x + r * n, n, b + rb * (size_t)r, rb);
  free(a);
  free(b);
  return bad != 0;
}

int main(int argc, char **argv) {
  const char *model = argc > 1 ? argv[1] : NULL;
  golden gd = {NULL, 0};
  if (argc > 2) {
    gd.f = fopen(argv[2], "wb");
    if (!gd.f) return perror(argv[2]), 1;
    fwrite("AQG1", 1, 4, gd.f);
    fwrite(&gd.count, 4, 1, gd.f);
  }
  const int types[] = {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q5_0, ANNA_DTYPE_Q8_0};
  int fails = 0;
  const int64_t n = 1024, rows_per_kind = 64;
  float *x = malloc(sizeof(float) * (size_t)(n * rows_per_kind));
  static const char *kinds[] = {"gaussian", "uniform", "outliers", "zero", "positive", "tiny", "huge", "sparse", "bf16"};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
    for (int k = 0; k < 9; k++) {
      for (int64_t r = 0; r < rows_per_kind; r++) gen_row(k, x + r * n, n);
      char what[64];
      snprintf(what, sizeof what, "random %s", kinds[k]);
      /* golden: one row of each kind (the ctest stays small) */
      fails += check_rows(types[t], x, rows_per_kind, n, what, &gd, k == 0 || k == 2 || k == 3 || k == 5 || k == 8 ? 1 : 0);
    }
  free(x);
  if (model) {
    char err[512];
    gguf_file *f = NULL;
    if (gguf_open(&f, model, err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      return 1;
    }
    static const char *names[] = {"blk.0.ffn_down.weight", "blk.3.ffn_up.weight", "blk.5.attn_q.weight",
                                  "blk.7.attn_v.weight", "token_embd.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
      const gguf_tensor *t = gguf_tensor_find(f, names[i]);
      if (!t) continue;
      const int64_t cols = t->dims[0], nrow = t->dims[1] < 128 ? t->dims[1] : 128;
      float *w = malloc(sizeof(float) * (size_t)(cols * nrow));
      const size_t rb = (size_t)dtype_row_bytes(t->type, cols);
      for (int64_t r = 0; r < nrow; r++) quant_dequantize_row(t->type, (const char *)t->data + rb * (size_t)r, w + r * cols, cols);
      for (size_t ty = 0; ty < sizeof types / sizeof types[0]; ty++) {
        if (cols % dtype_block_size(types[ty])) continue;
        char what[80];
        snprintf(what, sizeof what, "real %s", names[i]);
        fails += check_rows(types[ty], w, nrow, cols, what, &gd, i == 0 ? 1 : 0);
      }
      free(w);
    }
    gguf_close(f);
  }
  if (gd.f) {
    fseek(gd.f, 4, SEEK_SET);
    fwrite(&gd.count, 4, 1, gd.f);
    fclose(gd.f);
    printf("golden: %u rows written to %s\n", gd.count, argv[2]);
  }
  printf("%s: %d check(s) differ\n", fails ? "FAIL" : "OK", fails);
  return fails ? 1 : 0;
}
