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

/* The CPU op on one draw (the reference; sample_tail's CPU code is the host sampler's). l: the
 * whole [rows][V] array (the op adds q.row * V itself). */
static ops_tail_out tail_cpu(const float *l, int64_t V, ops_tail_req q, double u) {
  ops_tail_out o;
  q.u = u;
  g_cpu->sample_tail(g_cpu, &o, l, V, &q, 1);
  return o;
}

/* R rows, each with its draws: head = the CPU topk's 256 best, z its softmax sum; the kept
 * tail mass M from the CPU op; per row the sum mode (u = 0) and draws u over (0, 1.02 M) (a
 * few past M: the last kept token), all in ONE device call (the batched op, as
 * anna_context_sample_tail issues it), against the CPU op draw by draw. The token must be the
 * CPU's, except where u lies within 1e-9 of M of a boundary (the device sums per chunk): then
 * the CPU op at u (1 +- 1e-9) must give the device's token. The kept mass (the sum mode):
 * relative 1e-9. */
static void tail_case(int R, int64_t V, float temp, float floor_rel, int kind, int in_graph) {
  enum { D = 24 }; /* draws per row: 1 sum mode, 20 inside the mass, 3 past it */
  float *l = malloc(sizeof(float) * (size_t)(R * V));
  topk_fill(l, R * V, kind);
  if (kind == 3) /* flat rows: most of the mass past the head */
    for (int64_t t = 0; t < R * V; t++) l[t] = frand() * 0.5f;
  const int nh = V <= OPS_TOPK_MAX ? (int)V - 1 : OPS_TOPK_MAX;
  ops_tail_req *q = calloc((size_t)(R * D), sizeof *q);
  ops_tail_out *ref = calloc((size_t)(R * D), sizeof *ref), *got = calloc((size_t)(R * D), sizeof *got);
  double *M = calloc((size_t)R, sizeof *M);
  for (int r = 0; r < R; r++) {
    int32_t head[OPS_TOPK_MAX];
    float hv[OPS_TOPK_MAX];
    double st[2];
    const float *lr = l + (int64_t)r * V;
    g_cpu->topk(g_cpu, head, hv, st, lr, 1, V, nh, temp);
    ops_tail_req b = {.row = r, .z = st[1], .sum = 0.25, .inv_t = 1.0f / temp, .nh = nh};
    b.mx = hv[0] * b.inv_t;
    b.floor = floor_rel > 0 ? floor_rel * (float)(ops_exp_nonpos(hv[0] * b.inv_t - b.mx) / b.z) : 0.0f;
    memcpy(b.head, head, sizeof(int32_t) * (size_t)nh);
    M[r] = tail_cpu(l, V, b, 0.0).sum - 0.25;
    for (int d = 0; d < D; d++) {
      const double u = d == 0 ? 0.0
                       : d < D - 3 ? M[r] * ((double)(rnd() >> 11) * (1.0 / 9007199254740992.0))
                                   : M[r] * (1.0 + 0.005 * (d - (D - 4)));
      q[r * D + d] = b;
      q[r * D + d].u = u;
      ref[r * D + d] = tail_cpu(l, V, b, u);
    }
  }
  float *dl = dput(l, sizeof(float) * (size_t)(R * V));
  ops_tail_req *dq = dput(q, sizeof *q * (size_t)(R * D));
  ops_tail_out *dout = g_gpu->alloc(g_gpu, sizeof(ops_tail_out) * (size_t)(R * D));
  char what[160];
  snprintf(what, sizeof what, "sample_tail %d x V=%lld T=%.2f floor=%.3g kind=%d%s", R, (long long)V, temp, floor_rel,
           kind, in_graph ? " graph" : "");
  if (in_graph) cuda_backend_step_begin(g_gpu, R);
  g_gpu->sample_tail(g_gpu, dout, dl, V, dq, R * D);
  if (in_graph) cuda_backend_step_end(g_gpu);
  g_gpu->download(g_gpu, got, dout, sizeof(ops_tail_out) * (size_t)(R * D));
  gpu_status(what);
  int64_t bad = 0, near = 0;
  double sum_err = 0;
  for (int i = 0; i < R * D; i++) {
    if (q[i].u == 0) {
      sum_err = fmax(sum_err, fabs(got[i].sum - ref[i].sum) / fmax(ref[i].sum, 1e-300));
      bad += got[i].tok != -1;
      continue;
    }
    if (got[i].tok == ref[i].tok) continue;
    const int32_t lo = tail_cpu(l, V, q[i], q[i].u * (1 - 1e-9)).tok, hi = tail_cpu(l, V, q[i], q[i].u * (1 + 1e-9)).tok;
    if (got[i].tok == lo || got[i].tok == hi) {
      near++;
      continue;
    }
    if (bad++ == 0)
      printf("    first bad draw %d: u %.17g of %.17g: gpu %d cpu %d\n", i, q[i].u, M[q[i].row], got[i].tok, ref[i].tok);
  }
  g_checks++;
  if (bad || !(sum_err <= 1e-9)) {
    printf("  FAIL %-58s %lld of %d draws differ, kept-mass rel err %.3g (tol 1e-9)\n", what, (long long)bad, R * D,
           sum_err);
    g_fail++;
  } else if (near) {
    printf("  note %-58s %lld of %d draws within 1e-9 of a boundary moved\n", what, (long long)near, R * D);
  }
  dfree(dl), dfree(dq), dfree(dout);
  free(l), free(q), free(ref), free(got), free(M);
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
      tail_case(vi % 2 ? 3 : 1, vocabs[vi], kind == 1 ? 0.7f : 1.0f, 0.0f, kind, 0);
      tail_case(2, vocabs[vi], 1.3f, kind == 3 ? 0.05f : 0.002f, kind, 0);
    }
  tail_case(4, 248320, 2.0f, 0.0f, 3, 0);
  cuda_backend_set_graphs(g_gpu, 1); /* inside a recorded step (the op is recordable) */
  tail_case(2, 248320, 1.0f, 0.0f, 3, 1);
  cuda_backend_set_graphs(g_gpu, 0);
  for (int dense = 0; dense < 2; dense++) {
    mask_case(1, 1000, 256, 1.0f, dense);
    mask_case(5, 151936, 256, 0.8f, dense);
    mask_case(8, 248320, 64, 1.0f, dense);
  }
  /* timing at batch 64: the step's tail draws in one call (requests up, op, results down, as
   * anna_context_sample_tail) against what they replace (64 full-row downloads; the host
   * sampler's passes over each row come on top of that) */
  const int64_t V = 248320;
  enum { B = 64 };
  float *l = malloc(sizeof(float) * (size_t)(B * V));
  for (int64_t t = 0; t < B * V; t++) l[t] = frand() * 0.5f;
  ops_tail_req *q = calloc(B, sizeof *q);
  for (int r = 0; r < B; r++) {
    float hv[OPS_TOPK_MAX];
    double st[2];
    g_cpu->topk(g_cpu, q[r].head, hv, st, l + (int64_t)r * V, 1, V, OPS_TOPK_MAX, 1.0f);
    q[r].row = r, q[r].z = st[1], q[r].u = 0.5 * (1.0 - 0.1 * (r % 8)), q[r].inv_t = 1.0f, q[r].mx = hv[0];
    q[r].nh = OPS_TOPK_MAX;
  }
  float *dl = dput(l, sizeof(float) * (size_t)(B * V));
  ops_tail_req *dq = g_gpu->alloc(g_gpu, sizeof *q * B);
  ops_tail_out *dout = g_gpu->alloc(g_gpu, sizeof(ops_tail_out) * B), o[B];
  g_gpu->upload(g_gpu, dq, q, sizeof *q * B);
  g_gpu->sample_tail(g_gpu, dout, dl, V, dq, B);
  g_gpu->download(g_gpu, o, dout, sizeof o);
  gpu_status("sample_tail warmup");
  const int reps = 50;
  double t_tail[2];
  for (int w = 0; w < 2; w++) { /* 1 draw, then 64 */
    const int n = w ? B : 1;
    const double t0 = now_s();
    for (int r = 0; r < reps; r++) {
      g_gpu->upload(g_gpu, dq, q, sizeof *q * (size_t)n);
      g_gpu->sample_tail(g_gpu, dout, dl, V, dq, n);
      g_gpu->download(g_gpu, o, dout, sizeof(ops_tail_out) * (size_t)n);
    }
    t_tail[w] = (now_s() - t0) / reps;
  }
  const double t0 = now_s();
  for (int r = 0; r < reps; r++) g_gpu->download(g_gpu, l, dl, sizeof(float) * (size_t)(B * V));
  const double t_row = (now_s() - t0) / reps;
  gpu_status("sample_tail bench");
  printf("  timing V=%lld | tail, 1 draw: %8.1f us | tail, %d draws in one call: %8.1f us | %d full-row downloads: "
         "%8.1f us (+ the host sampler's passes)\n",
         (long long)V, t_tail[0] * 1e6, B, t_tail[1] * 1e6, B, t_row * 1e6);
  dfree(dl), dfree(dq), dfree(dout), free(l), free(q);
}
