/* test_cuda_sample.c: the topk op (sampling candidates: ids, values, row max, softmax sum)
 * against the CPU op on spread, tied and special-value rows, eager and in recorded steps; and
 * the topk benchmark (--bench=topk). */
#include "cuda_test.h"

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

void test_topk(void) {
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
void bench_topk(void) {
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
