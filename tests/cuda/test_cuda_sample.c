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

/* ---- the sampler's tail (sample_tail) and masked candidates (mask_rows + topk), issue 29 ---- */

/* The CPU op's walk for draw u (the reference; sample_tail's CPU code is the host sampler's). */
static ops_tail_out tail_cpu(const float *l, int64_t V, const int32_t *head, int nh, float inv_t, float mx, double z,
                             float floor, double sum, double u) {
  ops_tail_out o;
  g_cpu->sample_tail(g_cpu, &o, l, V, head, nh, inv_t, mx, z, floor, sum, u);
  return o;
}

/* One row: head = the CPU topk's 256 best, z its softmax sum; the kept tail mass M from the
 * CPU op; then draws u over (0, 1.02 M) (a few past M: the last kept token), the sum mode
 * (u = 0), on the device against the CPU op. The token must be the CPU's, except where u lies
 * within 1e-9 of M of a boundary (the device sums per chunk): then the CPU op at u (1 +- 1e-9)
 * must give the device's token. The kept mass (u = 0, the sum mode): relative 1e-9. */
static void tail_case(int64_t V, float temp, float floor_rel, int kind, int in_graph) {
  float *l = malloc(sizeof(float) * (size_t)V);
  topk_fill(l, V, kind);
  if (kind == 3) /* a flat row: most of the mass past the head */
    for (int64_t t = 0; t < V; t++) l[t] = frand() * 0.5f;
  const int nh = V < OPS_TOPK_MAX ? (int)V - 1 : OPS_TOPK_MAX;
  int32_t head[OPS_TOPK_MAX];
  float hv[OPS_TOPK_MAX];
  double st[2];
  g_cpu->topk(g_cpu, head, hv, st, l, 1, V, nh, temp);
  const float inv_t = 1.0f / temp, mx = hv[0] * inv_t;
  const double z = st[1];
  const float floor = floor_rel > 0 ? floor_rel * (float)(ops_exp_nonpos(hv[0] * inv_t - mx) / z) : 0.0f;
  const double M = tail_cpu(l, V, head, nh, inv_t, mx, z, floor, 0.0, 0.0).sum;
  float *dl = dput(l, sizeof(float) * (size_t)V);
  int32_t *dh = dput(head, sizeof(int32_t) * (size_t)nh);
  ops_tail_out *dout = g_gpu->alloc(g_gpu, sizeof(ops_tail_out));
  int64_t bad = 0, near = 0, draws = 0;
  double sum_err = 0;
  char what[160];
  snprintf(what, sizeof what, "sample_tail V=%lld T=%.2f floor=%.3g kind=%d%s", (long long)V, temp, floor_rel, kind,
           in_graph ? " graph" : "");
  for (int d = -1; d < 48; d++) {
    /* d = -1: the sum alone; then u spread over the kept mass, the last few past it */
    const double u = d < 0 ? 0.0 : M * (d < 44 ? ((double)(rnd() >> 11) * (1.0 / 9007199254740992.0)) : 1.0 + 0.005 * (d - 43));
    const double s0 = 0.25;
    const ops_tail_out r = tail_cpu(l, V, head, nh, inv_t, mx, z, floor, s0, u);
    if (in_graph) cuda_backend_step_begin(g_gpu, 1);
    g_gpu->sample_tail(g_gpu, dout, dl, V, dh, nh, inv_t, mx, z, floor, s0, u);
    if (in_graph) cuda_backend_step_end(g_gpu);
    ops_tail_out g;
    g_gpu->download(g_gpu, &g, dout, sizeof g);
    gpu_status(what);
    draws++;
    if (u == 0) sum_err = fmax(sum_err, fabs(g.sum - r.sum) / fmax(r.sum, 1e-300)); /* the sum mode */
    if (g.tok == r.tok) continue;
    const int32_t lo = tail_cpu(l, V, head, nh, inv_t, mx, z, floor, s0, u * (1 - 1e-9)).tok,
                  hi = tail_cpu(l, V, head, nh, inv_t, mx, z, floor, s0, u * (1 + 1e-9)).tok;
    if (u > 0 && (g.tok == lo || g.tok == hi)) {
      near++;
      continue;
    }
    if (bad++ == 0) printf("    first bad draw: u %.17g of %.17g: gpu %d cpu %d\n", u, M, g.tok, r.tok);
  }
  g_checks++;
  if (bad || !(sum_err <= 1e-9)) {
    printf("  FAIL %-58s %lld of %lld tokens differ, kept-mass rel err %.3g (tol 1e-9)\n", what, (long long)bad,
           (long long)draws, sum_err);
    g_fail++;
  } else if (near) {
    printf("  note %-58s %lld of %lld draws within 1e-9 of a boundary moved\n", what, (long long)near,
           (long long)draws);
  }
  dfree(dl), dfree(dh), dfree(dout), free(l);
}

/* mask_rows on rows [rows, V] (a mask per chosen row: end-of-generation-like few ids, or most
 * of the vocabulary), then topk over all rows: the masked logits bit for bit, the candidates
 * as test_topk compares them (ids / values / max exact, the softmax sum within 1e-5). */
static void mask_case(int64_t rows, int64_t V, int k, float temp, int dense) {
  float *l = malloc(sizeof(float) * (size_t)(rows * V));
  topk_fill(l, rows * V, 0);
  const int64_t words = (V + 63) / 64;
  int32_t rid[8];
  int n = 0;
  for (int64_t r = 0; r < rows && n < 8; r++)
    if (r % 2 == 0 || dense) rid[n++] = (int32_t)r;
  uint64_t *bits = calloc((size_t)(n * words), sizeof(uint64_t));
  for (int i = 0; i < n; i++) {
    uint64_t *b = bits + i * words;
    if (dense) {
      for (int64_t w = 0; w < words; w++) b[w] = rnd() | rnd(); /* about 3/4 rejected */
    } else {
      float best;
      const int64_t top = ops_argmax_f32(l + rid[i] * V, V, &best);
      const int64_t ids[3] = {top, (int64_t)(rnd() % (uint64_t)V), V - 1};
      for (int j = 0; j < 3; j++) b[ids[j] / 64] |= 1ull << (ids[j] % 64);
    }
  }
  float *dl = dput(l, sizeof(float) * (size_t)(rows * V));
  int32_t *drid = dput(rid, sizeof(int32_t) * (size_t)n);
  uint64_t *db = dput(bits, sizeof(uint64_t) * (size_t)(n * words));
  g_cpu->mask_rows(g_cpu, l, V, rid, bits, n);
  g_gpu->mask_rows(g_gpu, dl, V, drid, db, n);
  char what[128];
  snprintf(what, sizeof what, "mask_rows rows=%lld V=%lld %s", (long long)rows, (long long)V, dense ? "dense" : "few");
  gpu_status(what);
  float *gl = dget(dl, rows * V);
  g_checks++;
  if (memcmp(gl, l, sizeof(float) * (size_t)(rows * V)) != 0) {
    printf("  FAIL %-58s masked rows differ\n", what);
    g_fail++;
  }
  free(gl);
  int32_t *ri = malloc(sizeof(int32_t) * (size_t)(rows * k)), *gi = malloc(sizeof(int32_t) * (size_t)(rows * k));
  float *rv = malloc(sizeof(float) * (size_t)(rows * k)), *gv = malloc(sizeof(float) * (size_t)(rows * k));
  double *rs = malloc(sizeof(double) * (size_t)(2 * rows)), *gs = malloc(sizeof(double) * (size_t)(2 * rows));
  g_cpu->topk(g_cpu, ri, rv, rs, l, rows, V, k, temp);
  int32_t *di = g_gpu->alloc(g_gpu, sizeof(int32_t) * (size_t)(rows * k));
  float *dv = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)(rows * k));
  double *ds = g_gpu->alloc(g_gpu, sizeof(double) * (size_t)(2 * rows));
  g_gpu->topk(g_gpu, di, dv, ds, dl, rows, V, k, temp);
  g_gpu->download(g_gpu, gi, di, sizeof(int32_t) * (size_t)(rows * k));
  g_gpu->download(g_gpu, gv, dv, sizeof(float) * (size_t)(rows * k));
  g_gpu->download(g_gpu, gs, ds, sizeof(double) * (size_t)(2 * rows));
  snprintf(what, sizeof what, "masked topk rows=%lld V=%lld k=%d %s", (long long)rows, (long long)V, k,
           dense ? "dense" : "few");
  gpu_status(what);
  int64_t bad = 0;
  double zr = 0;
  for (int64_t i = 0; i < rows * k; i++) bad += gi[i] != ri[i] || memcmp(&gv[i], &rv[i], sizeof(float)) != 0;
  for (int64_t r = 0; r < rows; r++) {
    bad += gs[2 * r] != rs[2 * r];
    zr = fmax(zr, fabs(gs[2 * r + 1] - rs[2 * r + 1]) / fmax(rs[2 * r + 1], 1e-300));
  }
  g_checks++;
  if (bad || !(zr <= 1e-5)) {
    printf("  FAIL %-58s %lld wrong ids/values/max, sum rel err %.3g (tol 1e-5)\n", what, (long long)bad, zr);
    g_fail++;
  }
  dfree(dl), dfree(drid), dfree(db), dfree(di), dfree(dv), dfree(ds);
  free(l), free(bits), free(ri), free(gi), free(rv), free(gv), free(rs), free(gs);
}

void test_sample_tail(void) {
  printf("sample_tail, mask_rows\n");
  static const int64_t vocabs[] = {1000, 4097, 151936, 248320};
  for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++)
    for (int kind = 0; kind < 4; kind++) {
      tail_case(vocabs[vi], kind == 1 ? 0.7f : 1.0f, 0.0f, kind, 0);
      tail_case(vocabs[vi], 1.3f, kind == 3 ? 0.05f : 0.002f, kind, 0);
    }
  tail_case(248320, 2.0f, 0.0f, 3, 0);
  cuda_backend_set_graphs(g_gpu, 1); /* inside a recorded step (the op is recordable) */
  tail_case(248320, 1.0f, 0.0f, 3, 1);
  cuda_backend_set_graphs(g_gpu, 0);
  for (int dense = 0; dense < 2; dense++) {
    mask_case(1, 1000, 256, 1.0f, dense);
    mask_case(5, 151936, 256, 0.8f, dense);
    mask_case(8, 248320, 64, 1.0f, dense);
  }
  /* timing: what a tail draw costs against what it replaces (the row's download) */
  const int64_t V = 248320;
  float *l = malloc(sizeof(float) * (size_t)V);
  for (int64_t t = 0; t < V; t++) l[t] = frand() * 0.5f;
  int32_t head[OPS_TOPK_MAX];
  float hv[OPS_TOPK_MAX];
  double st[2];
  g_cpu->topk(g_cpu, head, hv, st, l, 1, V, OPS_TOPK_MAX, 1.0f);
  float *dl = dput(l, sizeof(float) * (size_t)V);
  int32_t *dh = dput(head, sizeof head);
  ops_tail_out *dout = g_gpu->alloc(g_gpu, sizeof(ops_tail_out)), o;
  const int reps = 200;
  g_gpu->sample_tail(g_gpu, dout, dl, V, dh, OPS_TOPK_MAX, 1.0f, hv[0], st[1], 0.0f, 0.0, 0.5);
  g_gpu->download(g_gpu, &o, dout, sizeof o);
  gpu_status("sample_tail warmup");
  double t0 = now_s();
  for (int r = 0; r < reps; r++) {
    g_gpu->upload(g_gpu, dh, head, sizeof head); /* as anna_context_sample_tail: ids up, result down */
    g_gpu->sample_tail(g_gpu, dout, dl, V, dh, OPS_TOPK_MAX, 1.0f, hv[0], st[1], 0.0f, 0.0, 0.5);
    g_gpu->download(g_gpu, &o, dout, sizeof o);
  }
  const double t_tail = (now_s() - t0) / reps;
  t0 = now_s();
  for (int r = 0; r < reps; r++) g_gpu->download(g_gpu, l, dl, sizeof(float) * (size_t)V);
  const double t_row = (now_s() - t0) / reps;
  gpu_status("sample_tail bench");
  printf("  timing 1 x %lld: tail draw (upload + op + download) %7.1f us | full row download %7.1f us "
         "(the host sampler's passes over the row come on top)\n",
         (long long)V, t_tail * 1e6, t_row * 1e6);
  dfree(dl), dfree(dh), dfree(dout), free(l);
}
