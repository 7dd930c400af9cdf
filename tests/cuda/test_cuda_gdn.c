/* test_cuda_gdn.c: the Gated DeltaNet ops against the CPU backend: the recurrent and chunk-64
 * kernels (output and state, both numerics modes, scan widths), gdn_step over consecutive calls
 * and recorded steps (both variants), its batched form (a run table); and the GDN benchmark
 * (--bench=gdn: prefill, and a decode batch's gdn_step per run vs batched). */
#include "cuda_test.h"

static void l2n(float *x, int64_t rows, int d, float scale) {
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)x[r * d + i] * x[r * d + i];
    for (int i = 0; i < d; i++) x[r * d + i] *= scale / (float)sqrt(s + 1e-6);
  }
}

void test_gdn(void) {
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

/* gdn_step over consecutive calls (state and conv state carry from call to call) against the
 * CPU's gdn_step: the Qwen3.5 shapes (0.8B: hk = hv = 16; 9B / 35B-A3B: hv = 32, both v-head
 * orders), odd sizes whose per-block column ranges straddle v-heads, a group narrower than the
 * 8-block cluster (blocks without columns), 32 v-heads per k-head (several column passes per
 * block); n = 1, 3, 8, 11 (two launches), 1. Then three decode steps through a recorded step
 * (a graph, as the model runs it): the cluster launch must hold there too. Tolerance 1e-4 as
 * test_fused, for the same reasons; the output norm's row sums are added as per-block partials
 * (f32 rounding of <= dv terms, far below it). The conv state is a copy of inputs: exact. */
void test_gdn_step(void) {
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

/* The batched gdn_step (a run table: one launch for every run) against the CPU's (itself bit
 * for bit one call per run, test_ops), both variants, over consecutive calls so each run's
 * state and conv state carry: 16 runs of 1..3 tokens with rows in reverse run order; the
 * one-run table; 4 runs of 11, 1, 9, 3 tokens (two launches, the second over 2 runs); then
 * two recorded steps (graphs) of 8 one-token runs (a recorded step holds 8 tokens), the
 * second a replay. Shapes as test_gdn_step (the 9B one, both v-head orders; odd sizes; ones
 * the per-head variant leaves to the cluster kernel). Tolerances as there. */
void test_gdn_step_batched(void) {
  printf("gdn_step batched (run table)\n");
  enum { NR = 16 };
  const int cfgs[][6] = {
      /* hk, hv, dk, dv, tiled, kw */
      {16, 32, 128, 128, 0, 4}, {16, 32, 128, 128, 1, 4}, {16, 16, 128, 128, 0, 4},
      {3, 6, 40, 24, 1, 4},     {2, 2, 256, 256, 1, 3},   {1, 32, 64, 64, 0, 2},
  };
  const int ncalls = 5;
  for (size_t cv = 0; cv < 2 * (sizeof cfgs / sizeof cfgs[0]); cv++) {
    const size_t c = cv % (sizeof cfgs / sizeof cfgs[0]);
    const int var = cv >= sizeof cfgs / sizeof cfgs[0];
    cuda_backend_set_gdn_variant(g_gpu, var ? CUDA_GDN_HEAD : CUDA_GDN_CLUSTER);
    cuda_backend_drop_mirrors(g_gpu);
    const int hk = cfgs[c][0], hv = cfgs[c][1], dk = cfgs[c][2], dv = cfgs[c][3], tiled = cfgs[c][4], kw = cfgs[c][5];
    const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd, ssz = (int64_t)hv * dk * dv;
    const int64_t csz = cd * (kw - 1), nmax = 3 * NR; /* rows of the largest batch */
    float *cw = hrand(cd * kw, 0.5f), *alog = hrand(hv, 1.0f), *dtb = hrand(hv, 1.0f), *nw = hrand(dv, 1.0f);
    float *cs = hrand(NR * csz, 1.0f), *st = hrand(NR * ssz, 0.2f), *y = malloc(sizeof(float) * (size_t)(nmax * Vd));
    float *work = malloc(sizeof(float) * (size_t)ops_gdn_step_work_floats(nmax, hk, hv, dk, dv));
    float *dcs = dput(cs, sizeof(float) * (size_t)(NR * csz)), *dst = dput(st, sizeof(float) * (size_t)(NR * ssz));
    float *dqkv = dnan(nmax * cd), *dz = dnan(nmax * Vd), *dba = dnan(2 * nmax * hv), *dy = dnan(nmax * Vd);
    for (int call = 0; call < ncalls; call++) {
      int nr, lens[NR];
      if (call == 0) {
        nr = NR;
        for (int i = 0; i < nr; i++) lens[i] = 1 + (i * 7 + 1) % 3;
      } else if (call == 1) {
        nr = 1, lens[0] = 2;
      } else if (call == 2) {
        nr = 4, lens[0] = 11, lens[1] = 1, lens[2] = 9, lens[3] = 3;
      } else {
        nr = 8;
        for (int i = 0; i < nr; i++) lens[i] = 1;
      }
      const int rec = call >= 3;
      ops_gdn_step_run hr[NR], gr[NR];
      int64_t n = 0;
      for (int i = nr - 1; i >= 0; i--) { /* rows in reverse run order; run i has state i */
        hr[i] = (ops_gdn_step_run){.start = n, .n = lens[i], .conv_state = cs + i * csz, .state = st + i * ssz};
        gr[i] = (ops_gdn_step_run){.start = n, .n = lens[i], .conv_state = dcs + i * csz, .state = dst + i * ssz};
        n += lens[i];
      }
      float *qkv = hrand(n * cd, 2.0f), *z = hrand(n * Vd, 2.0f), *ba = hrand(2 * n * hv, 2.0f);
      g_gpu->upload(g_gpu, dqkv, qkv, sizeof(float) * (size_t)(n * cd));
      g_gpu->upload(g_gpu, dz, z, sizeof(float) * (size_t)(n * Vd));
      g_gpu->upload(g_gpu, dba, ba, sizeof(float) * (size_t)(2 * n * hv));
      ops_gdn_step_args a = {
          .hk = hk, .hv = hv, .dk = dk, .dv = dv, .kw = kw, .v_tiled = tiled, .eps = 1e-6f, .n_runs = nr,
          .qkv = qkv, .z = z, .b = ba, .a = ba + n * hv, .conv_w = cw, .a_log = alog, .dt_bias = dtb,
          .norm_w = nw, .y = y, .work = work, .runs = hr,
      };
      g_cpu->gdn_step(g_cpu, &a);
      a.qkv = dqkv, a.z = dz, a.b = dba, a.a = dba + n * hv, a.y = dy, a.work = NULL, a.runs = gr;
      if (rec) cuda_backend_set_graphs(g_gpu, 1), cuda_backend_step_begin(g_gpu, n);
      g_gpu->gdn_step(g_gpu, &a);
      if (rec) cuda_backend_step_end(g_gpu), cuda_backend_set_graphs(g_gpu, 0);
      char what[128];
      snprintf(what, sizeof what, "gdn_step batched%s call %d%s %d runs %lld tok hk=%d hv=%d dk=%d dv=%d t=%d kw=%d",
               var ? " head" : "", call, rec ? " (graph)" : "", nr, (long long)n, hk, hv, dk, dv, tiled, kw);
      cmpd(what, dy, y, n * Vd, 1e-4);
      strcat(what, " state");
      cmpd(what, dst, st, NR * ssz, 1e-4);
      strcat(what, " conv");
      cmpd(what, dcs, cs, NR * csz, 0);
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
void test_gdn_chunked(void) {
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

/* A decode batch's gdn_step at the 9B shape (hk 16, hv 32, dk = dv = 128, conv 4) over the 24
 * GDN layers of a step: one single-run launch per sequence (forward.c before the run table)
 * against one batched launch per layer, both variants. Eager with 16 one-token runs (a step
 * that large is not recorded: at most CUDA_GRAPH_MAX_TOK, 8, tokens): host time per step over
 * many steps, their launches included; recorded with 8: the device time of the graph replays
 * (events around each). Every (layer, sequence) has its own states, as in the model. */
static void bench_gdn_step_batch(void) {
  enum { L = 24, NR = 16, REPS = 50 };
  const int hk = 16, hv = 32, dk = 128, dv = 128, kw = 4;
  const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd, ssz = (int64_t)hv * dk * dv;
  const int64_t csz = cd * (kw - 1);
  float *cw = hrand(cd * kw, 0.5f), *alog = hrand(hv, 1.0f), *dtb = hrand(hv, 1.0f), *nw = hrand(dv, 1.0f);
  float *hs = hrand(ssz, 0.2f), *hc = hrand(csz, 1.0f), *h = hrand(NR * cd, 1.0f);
  float *dqkv = dput(h, sizeof(float) * (size_t)(NR * cd)), *dz = dput(h, sizeof(float) * (size_t)(NR * Vd));
  float *dba = dput(h, sizeof(float) * 2 * (size_t)(NR * hv)), *dy = dnan(NR * Vd), res[4];
  static ops_gdn_step_run runs[L][NR]; /* device states */
  for (int l = 0; l < L; l++)
    for (int r = 0; r < NR; r++)
      runs[l][r] = (ops_gdn_step_run){.start = r, .n = 1, .conv_state = dput(hc, sizeof(float) * (size_t)csz),
                                      .state = dput(hs, sizeof(float) * (size_t)ssz)};
  for (int var = 0; var < 2; var++) {
    cuda_backend_set_gdn_variant(g_gpu, var ? CUDA_GDN_CLUSTER : CUDA_GDN_HEAD);
    for (int rec = 0; rec < 2; rec++) {
      const int nr = rec ? 8 : NR;
      double us[2];
      cuda_backend_set_graphs(g_gpu, rec);
      for (int batched = 0; batched < 2; batched++) {
        ops_gdn_step_args a = {
            .n = 1, .hk = hk, .hv = hv, .dk = dk, .dv = dv, .kw = kw, .v_tiled = 0, .eps = 1e-6f, .qkv = dqkv,
            .z = dz, .b = dba, .a = dba + nr * hv, .conv_w = cw, .a_log = alog, .dt_bias = dtb, .norm_w = nw,
            .y = dy,
        };
        double t0 = 0, gpu0 = 0, gpu1, cap, upd;
        for (int it = 0; it < REPS + 3; it++) { /* 3 warm-up steps (the graph built in the first) */
          if (it == 3) {
            g_gpu->download(g_gpu, res, dy, sizeof res);
            cuda_backend_graph_times(g_gpu, &cap, &upd, &gpu0);
            t0 = now_s();
          }
          if (rec) cuda_backend_step_begin(g_gpu, nr);
          for (int l = 0; l < L; l++) {
            if (batched) {
              a.n_runs = nr, a.runs = runs[l];
              g_gpu->gdn_step(g_gpu, &a);
              continue;
            }
            for (int r = 0; r < nr; r++) {
              ops_gdn_step_args one = a;
              one.qkv = dqkv + r * cd, one.z = dz + r * Vd, one.b = dba + r * hv, one.a = dba + (nr + r) * hv;
              one.y = dy + r * Vd, one.conv_state = runs[l][r].conv_state, one.state = runs[l][r].state;
              g_gpu->gdn_step(g_gpu, &one);
            }
          }
          if (rec) cuda_backend_step_end(g_gpu);
        }
        g_gpu->download(g_gpu, res, dy, sizeof res);
        gpu_status("gdn_step batch bench");
        cuda_backend_graph_times(g_gpu, &cap, &upd, &gpu1);
        us[batched] = (rec ? gpu1 - gpu0 : now_s() - t0) / REPS * 1e6;
      }
      printf("  gdn_step %d runs: per-run launches vs one batched launch (%s, %s): %8.1f vs %8.1f us per step of %d "
             "layers (%.2fx)\n",
             nr, var ? "cluster" : "per head", rec ? "graph, device time" : "eager, host time", us[0], us[1], L,
             us[0] / us[1]);
    }
  }
  cuda_backend_set_graphs(g_gpu, 0);
  cuda_backend_set_gdn_variant(g_gpu, CUDA_GDN_HEAD); /* back to the default */
  for (int l = 0; l < L; l++)
    for (int r = 0; r < NR; r++) dfree(runs[l][r].conv_state), dfree(runs[l][r].state);
  dfree(dqkv), dfree(dz), dfree(dba), dfree(dy);
  free(cw), free(alog), free(dtb), free(nw), free(hs), free(hc), free(h);
  cuda_backend_drop_mirrors(g_gpu);
}

/* Prefill GDN from a nonzero state at the 0.8B shape (hk 16, hv 16, dk = dv = 128; 512 and
 * 4096 tokens) and the 9B / 35B-A3B shape (hk 16, hv 32; 8192 tokens): the token-sequential
 * kernel (gdn_recurrent; not at 8192) against the chunk-64 kernels (f32) with 16 and 32 state
 * columns per scan block. Then a decode batch's gdn_step, per run vs batched
 * (bench_gdn_step_batch). */
void bench_gdn(void) {
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
  }  bench_gdn_step_batch();
}
