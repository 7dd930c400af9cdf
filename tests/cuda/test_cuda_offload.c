/* test_cuda_offload.c: MoE expert offload (cuda_backend_set_offload, cuda_offload.cu) against
 * the CPU backend and the all-resident CUDA path. A second CUDA backend offloads three MoE
 * layers with a tiny cache (2 slots per layer, a swap plan after every step), with a host
 * mirror that holds only some experts (the rest come from the weights' host memory), all
 * of them (zero-copy: the kernels read misses from the mirror, counters on the device), and
 * all of them with zero-copy off, so every tier and swaps run on every step; each with the
 * prefill streaming hook off and on. 60 steps of skewed random routing, 1 to 13 tokens, each
 * step recorded as a graph where the size allows: exact mode against the CPU op (f32: 1e-4),
 * default numerics against g_gpu's all-resident kernels (bit for bit where the offload ran
 * the decode kernels, 1e-3 where it streamed), that reference itself against the CPU op, and
 * the offload's state after every step (cuda_backend_offload_check); each pass prints the
 * path its steps took. Then the counters (hits, swaps, bytes from each tier, calls by path),
 * the prefill streaming cases and the budget errors. g_gpu's mirror map is keyed by host
 * address: every case drops it before and after (weights freed by one case come back at the
 * same addresses in the next, and the old copies would be found; session 20's device run of
 * this test failed that way, see offload_case). */
#include "cuda_test.h"

#include "anna/anna.h" /* ANNA_E* */
#include "backends/cuda/cuda_offload_check.h"

#define OFF_L 3

typedef struct off_layer {
  int E, fused, H, I;
  ops_weight *gate, *up, *down;
} off_layer;

/* down_type: the down projections' type (llama.cpp's Q4_K_M gives some layers Q6_K there) */
static void off_layer_make_mixed(off_layer *m, int E, int fused, int type, int down_type, int H, int I) {
  memset(m, 0, sizeof *m);
  m->E = E, m->fused = fused, m->H = H, m->I = I;
  m->gate = calloc((size_t)E, sizeof(ops_weight)), m->up = fused ? NULL : calloc((size_t)E, sizeof(ops_weight));
  m->down = calloc((size_t)E, sizeof(ops_weight));
  for (int e = 0; e < E; e++) {
    const int64_t gr = fused ? 2 * (int64_t)I : I;
    m->gate[e] = (ops_weight){type, make_weight(type, gr, H, NULL), gr, H};
    if (!fused) m->up[e] = (ops_weight){type, make_weight(type, I, H, NULL), I, H};
    m->down[e] = (ops_weight){down_type, make_weight(down_type, H, I, NULL), H, I};
  }
}

static void off_layer_make(off_layer *m, int E, int fused, int type, int H, int I) {
  off_layer_make_mixed(m, E, fused, type, type, H, I);
}

static void off_layer_free(off_layer *m) {
  for (int e = 0; e < m->E; e++) {
    free((void *)m->gate[e].data), free((void *)m->down[e].data);
    if (m->up) free((void *)m->up[e].data);
  }
  free(m->gate), free(m->up), free(m->down);
}

/* k distinct experts per token, half the picks from a few hot ones that drift with step. */
static void off_route(int32_t *idx, float *w, int64_t n, int E, int k, int step) {
  for (int64_t t = 0; t < n; t++)
    for (int j = 0; j < k; j++) {
      int e;
      for (;;) {
        e = rnd() % 2 ? (int)((step / 20 + rnd() % 3) % (uint64_t)E) : (int)(rnd() % (uint64_t)E);
        int dup = 0;
        for (int i = 0; i < j; i++) dup |= idx[t * k + i] == e;
        if (!dup) break;
      }
      idx[t * k + j] = e;
      w[t * k + j] = 0.5f * (frand() + 1.0f) + 0.05f;
    }
}

/* max |g - ref| / max |ref| (cmp's measure) without counting a check: the diagnosis printed
 * beside a failed comparison. */
static double off_relerr(const float *g, const float *ref, int64_t n) {
  double m = 0, scale = 1e-6;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
  for (int64_t i = 0; i < n; i++) m = fmax(m, isfinite(g[i]) ? fabs((double)g[i] - ref[i]) / scale : INFINITY);
  return m;
}

/* How many host addresses of these layers' weights (the arrays, &gate->data, each matrix's
 * bytes) are already keys of g_gpu's mirror map: weights freed by an earlier case and made
 * again at the same address would find the old device copies there (the resident
 * reference would then read another case's bytes, or take a pointer table from an old
 * weight's bytes). Printed, then the map is dropped. */
static int off_stale_keys(const off_layer *L) {
  int n = 0;
  for (int l = 0; l < OFF_L; l++) {
    n += cuda_backend_mirror_has(g_gpu, L[l].gate) + cuda_backend_mirror_has(g_gpu, &L[l].gate->data);
    if (L[l].up) n += cuda_backend_mirror_has(g_gpu, L[l].up);
    n += cuda_backend_mirror_has(g_gpu, L[l].down);
    for (int e = 0; e < L[l].E; e++) {
      n += cuda_backend_mirror_has(g_gpu, L[l].gate[e].data) + cuda_backend_mirror_has(g_gpu, L[l].down[e].data);
      if (L[l].up) n += cuda_backend_mirror_has(g_gpu, L[l].up[e].data);
    }
  }
  return n;
}

/* The path letters of the layer calls between two stats snapshots: Z zero-copy kernels,
 * D ids read back and misses copied into staging (decode batches), S prefill streamed,
 * x streaming on but declined (then D or Z ran). */
static void off_path(const cuda_offload_paths *a, const cuda_offload_paths *b, char *out) {
  int i = 0;
  if (b->zero_copy > a->zero_copy) out[i++] = 'Z';
  if (b->staged > a->staged) out[i++] = 'D';
  if (b->streamed > a->streamed) out[i++] = 'S';
  if (b->stream_declined > a->stream_declined) out[i++] = 'x';
  if (!i) out[i++] = '-';
  out[i] = 0;
}

/* mirror: 0 a third of the experts (misses copied into staging, the rest read from the
 * weights), 1 all (zero-copy: the kernels read misses from the pinned mirror), 2 all with
 * the zero-copy path off (misses copied from the mirror). stream: the prefill streaming
 * hook (no_prefill_stream = !stream). Two passes of 30 steps of 1..13 tokens: exact mode
 * (streaming declined: f32 decode batches) against the CPU op (1e-4); default numerics
 * against g_gpu's all-resident kernels on the same inputs: bit for bit where the offload ran
 * the decode kernels (the reference in the same batches of up to 8 tokens), 1e-3 where it
 * streamed (the resident grouped path on the whole batch). Each default comparison also
 * checks that reference against the CPU op (0.1: int8 activations; a wrong reference reads
 * as rel err ~1), and a failed comparison prints both sides against the CPU, so a wrong
 * offload and a wrong reference are told apart. After every step: the offload's own
 * invariants (cuda_backend_offload_check: store map, slot bytes, mirror bytes, zero-copy
 * table). Each pass prints the path each step took. */
static void offload_run(off_layer *L, int type, int H, int I, int E, int k, int mirror, int stream, const char *what0) {
  ops_model_shape *shape = calloc(1, sizeof *shape);
  shape->n_layers = OFF_L;
  shape->max_cols = H > I ? H : I;
  for (int l = 0; l < OFF_L; l++) {
    shape->layers[l].exp_gate = L[l].gate;
    shape->layers[l].exp_up = L[l].up;
    shape->layers[l].exp_down = L[l].down;
    shape->layers[l].n_exp = E;
  }
  const int64_t eb = dtype_row_bytes(type, H) * 2 * I + dtype_row_bytes(type, I) * H; /* gate + up (or fused) + down */
  char what[200], err[512];
  snprintf(what, sizeof what, "%s stream %s", what0, stream ? "on" : "off");
  printf("  %s ...\n", what); /* the cases print their figures at the end: say where a crash was */
  fflush(stdout);
  ops_backend *ob = NULL;
  if (cuda_backend_create(&ob, 64, err, sizeof err)) {
    printf("  FAIL %s: backend: %s\n", what, err);
    g_fail++;
    free(shape);
    return;
  }
  /* a host mirror of about a third of the experts: the rest are read from the weights */
  const cuda_offload_params op = {.host_memory_limit = mirror ? 0 : (int64_t)OFF_L * E * (eb + 64) / 3,
                                  .cached_experts_per_layer = 2,
                                  .swap_every = 1,
                                  .no_zero_copy = mirror == 2,
                                  .no_prefill_stream = !stream};
  g_checks++;
  if (cuda_backend_set_offload(ob, shape, &op, err, sizeof err)) {
    printf("  FAIL %s: set_offload: %s\n", what, err);
    g_fail++;
    ob->destroy(ob);
    free(shape);
    return;
  }
  const int64_t NMAX = 13;
  const int64_t sf = ops_moe_scratch_floats(NMAX, k, H, I);
  float *dscr = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)sf), *scratch = malloc(sizeof(float) * (size_t)sf);
  float *ref = malloc(sizeof(float) * (size_t)(NMAX * H));
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)(NMAX * k));
  float *w = malloc(sizeof(float) * (size_t)(NMAX * k));
  static const int sizes[] = {1, 2, 8, 3, 13, 1, 5, 9};
  int broken = 0; /* an invariant failed: the rest of the case would only repeat it */
  for (int pass = 0; pass < 2 && !broken; pass++) {
    const int exact = pass == 0;
    cuda_backend_set_exact(ob, exact);
    cuda_backend_set_exact(g_gpu, exact);
    cuda_backend_set_graphs(ob, 1);
    char paths[30 * 12] = "";
    size_t pl = 0;
    for (int step = 0; step < 30; step++) {
      const int64_t n = sizes[step % 8];
      float *x = hrand(n * H, 1.0f);
      float *dx = dput(x, sizeof(float) * (size_t)(n * H));
      float *dy[OFF_L];
      int32_t *didx[OFF_L];
      float *dw[OFF_L], *refs[OFF_L];
      cuda_offload_paths s0, s1;
      cuda_backend_offload_paths(ob, &s0);
      cuda_backend_step_begin(ob, n);
      for (int l = 0; l < OFF_L; l++) {
        off_route(idx, w, n, E, k, step + 30 * pass);
        didx[l] = dput(idx, sizeof(int32_t) * (size_t)(n * k));
        dw[l] = dput(w, sizeof(float) * (size_t)(n * k));
        dy[l] = dnan(n * H);
        ob->moe_ffn(ob, dy[l], dx, n, H, didx[l], dw[l], k, E, L[l].gate, L[l].up, L[l].down, ACT_KIND_SILU, dscr);
        /* the CPU op, f32 activations: exact mode's reference, the default pass's diagnosis */
        cpu_backend_set_exact_matmul(g_cpu, 1);
        g_cpu->moe_ffn(g_cpu, ref, x, n, H, idx, w, k, E, L[l].gate, L[l].up, L[l].down, ACT_KIND_SILU, scratch);
        cpu_backend_set_exact_matmul(g_cpu, 0);
        refs[l] = hcopy(ref, n * H);
      }
      cuda_backend_step_end(ob);
      cuda_backend_offload_paths(ob, &s1);
      char path[8];
      off_path(&s0, &s1, path);
      if (pl + 16 < sizeof paths) pl += (size_t)snprintf(paths + pl, sizeof paths - pl, " %lld:%s", (long long)n, path);
      if (ob->error(ob, err, sizeof err)) {
        printf("  FAIL %s %s step %d n=%lld path %s: %s\n", what, exact ? "exact" : "default", step, (long long)n, path,
               err);
        g_fail++;
        broken = 1;
        break;
      }
      const int streamed = strchr(path, 'S') != NULL;
      for (int l = 0; l < OFF_L; l++) {
        char cw[260];
        snprintf(cw, sizeof cw, "%s %s step %d layer %d n=%lld path %s", what, exact ? "exact" : "default", step, l,
                 (long long)n, path);
        float *g = dget(dy[l], n * H);
        if (exact) {
          cmp(cw, g, refs[l], n * H, 1e-4);
        } else {
          /* the all-resident kernels on the same inputs: the decode kernels in the offload's
           * batches of up to 8 tokens (the same bits), or the grouped path on the whole
           * batch where the offload streamed */
          float *dr = dnan(n * H), *dscr2 = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)sf);
          const int64_t step_tok = streamed ? n : 8;
          for (int64_t t0 = 0; t0 < n; t0 += step_tok) {
            const int64_t m = n - t0 < step_tok ? n - t0 : step_tok;
            g_gpu->moe_ffn(g_gpu, dr + t0 * H, dx + t0 * H, m, H, didx[l] + t0 * k, dw[l] + t0 * k, k, E, L[l].gate,
                           L[l].up, L[l].down, ACT_KIND_SILU, dscr2);
          }
          float *r = dget(dr, n * H);
          const int f0 = g_fail;
          cmp(cw, g, r, n * H, streamed ? 1e-3 : 0.0);
          const int bad = g_fail != f0;
          char cr[300];
          snprintf(cr, sizeof cr, "%s: resident reference vs CPU", cw);
          cmp(cr, r, refs[l], n * H, 0.1);
          if (bad)
            printf("  %s: offload vs CPU f32 rel err %.3g, resident reference vs CPU %.3g (the one far from the CPU "
                   "is wrong)\n",
                   cw, off_relerr(g, refs[l], n * H), off_relerr(r, refs[l], n * H));
          free(r), dfree(dr), dfree(dscr2);
        }
        free(g), free(refs[l]), dfree(dy[l]), dfree(didx[l]), dfree(dw[l]);
      }
      dfree(dx), free(x);
      /* the offload's own state after the step (swaps included) */
      g_checks++;
      if (cuda_backend_offload_check(ob, err, sizeof err)) {
        printf("  FAIL %s %s step %d n=%lld path %s: %s\n", what, exact ? "exact" : "default", step, (long long)n, path,
               err);
        g_fail++;
        broken = 1;
        break;
      }
    }
    printf("  %s %s paths (tokens:path; Z zero-copy, D ids read back + staging copies, S streamed, x streaming "
           "declined):%s\n",
           what, exact ? "exact" : "default", paths);
  }
  cuda_backend_set_exact(g_gpu, 1);
  cuda_offload_stats st;
  cuda_backend_offload_stats(ob, &st);
  g_checks++;
  const int tiers_ok = mirror ? st.bytes_file == 0 && st.mirrored == (int64_t)OFF_L * E
                              : st.bytes_file > 0 && st.mirrored > 0 && st.mirrored < (int64_t)OFF_L * E;
  const int zc = st.summary && strstr(st.summary, "zero-copy");
  /* paths: zero-copy kernels exactly when zc; streaming only with the hook on (the default
   * pass's 9- and 13-token steps), declined only with it on (the exact pass's). Zero-copy
   * steps are recorded as graphs here (every step <= 64 tokens), and a recorded zero-copy step
   * declines streaming by design (cuda_offload_moe_ffn: it stays a graph), so with zc the
   * hook only declines. */
  cuda_offload_paths pa;
  cuda_backend_offload_paths(ob, &pa);
  const int stream_ok = !stream ? pa.streamed == 0 && pa.stream_declined == 0
                        : zc    ? pa.streamed == 0 && pa.stream_declined > 0
                                : pa.streamed > 0 && pa.stream_declined > 0;
  const int paths_ok = (zc ? pa.zero_copy > 0 && pa.staged == 0 : pa.zero_copy == 0 && pa.staged > 0) && stream_ok;
  if (!st.on || st.cache_per_layer != 2 || st.hits <= 0 || st.swaps <= 0 || st.bytes_mirror <= 0 || !tiers_ok ||
      st.hits >= st.routed || zc != (mirror == 1) || (!broken && !paths_ok)) {
    printf("  FAIL %s: counters: cache %d, mirrored %lld, routed %lld, hits %lld, swaps %lld, bytes %lld + %lld, calls "
           "zero-copy %lld staged %lld streamed %lld declined %lld\n",
           what, st.cache_per_layer, (long long)st.mirrored, (long long)st.routed, (long long)st.hits,
           (long long)st.swaps, (long long)st.bytes_mirror, (long long)st.bytes_file, (long long)pa.zero_copy,
           (long long)pa.staged, (long long)pa.streamed, (long long)pa.stream_declined);
    g_fail++;
  } else {
    printf("  %s: %lld routed, hit rate %.2f, %lld swaps, %lld of %d experts mirrored, %lld B from the mirror, "
           "%lld B from the weights\n  %s\n",
           what, (long long)st.routed, (double)st.hits / (double)st.routed, (long long)st.swaps, (long long)st.mirrored,
           OFF_L * E, (long long)st.bytes_mirror, (long long)st.bytes_file, st.summary ? st.summary : "");
  }
  ob->destroy(ob);
  dfree(dscr);
  free(scratch), free(ref), free(idx), free(w);
  free(shape);
}

/* One weight set through offload_run with prefill streaming off, then on. g_gpu's mirror
 * map is dropped first (and the stale keys the new weights found are printed) and after. */
/* down1 > 0: layer 1's down projections in that type (experts of different sizes per layer) */
static void offload_case(int type, int fused, int H, int I, int E, int k, int mirror, int down1) {
  off_layer L[OFF_L];
  for (int l = 0; l < OFF_L; l++) off_layer_make_mixed(&L[l], E, fused, type, l == 1 && down1 > 0 ? down1 : type, H, I);
  char what[160];
  snprintf(what, sizeof what, "offload %s%s%s%s H=%d I=%d E=%d k=%d %s", dtype_name(type), fused ? " fused" : "",
           down1 > 0 ? ", layer 1 down " : "", down1 > 0 ? dtype_name(down1) : "", H, I, E, k,
           mirror == 0 ? "partial mirror" : mirror == 1 ? "zero-copy" : "mirror copies");
  const int stale = off_stale_keys(L);
  if (stale)
    printf("  %s: %d host addresses of its weights were keys of g_gpu's mirror map (copies of freed weights: "
           "dropped)\n",
           what, stale);
  cuda_backend_drop_mirrors(g_gpu);
  for (int stream = 0; stream < 2; stream++) offload_run(L, type, H, I, E, k, mirror, stream, what);
  cuda_backend_drop_mirrors(g_gpu);
  for (int l = 0; l < OFF_L; l++) off_layer_free(&L[l]);
}

/* Prefill streaming (off_prefill): chunks above CUDA_MOE_DECODE_MAX_TOK tokens (300, 64,
 * 9) through OFF_L offloaded layers with a tiny cache (1 slot per layer), so most routed
 * experts stream through the staging halves. Each layer's output against g_gpu's
 * all-resident prefill (the same grouped kernels on the same weights; 1e-3 relative: the
 * resident path may take its dequantize-first variant), or with the hook off against the
 * resident decode kernels on the same 8-token slices (bit for bit), then the traffic: every routed miss
 * copied at most once per layer chunk (bytes <= distinct routed experts x expert bytes),
 * and below what the decode batches (no_prefill_stream) copy for the same chunks. */
static int64_t offload_prefill_run(off_layer *L, int type, int fused, int H, int I, int E, int k, int mirror,
                                   int stream, const char *what0) {
  ops_model_shape *shape = calloc(1, sizeof *shape);
  shape->n_layers = OFF_L;
  shape->max_cols = H > I ? H : I;
  for (int l = 0; l < OFF_L; l++) {
    shape->layers[l].exp_gate = L[l].gate;
    shape->layers[l].exp_up = L[l].up;
    shape->layers[l].exp_down = L[l].down;
    shape->layers[l].n_exp = E;
  }
  /* the offload's blob: each part at a 16-byte aligned offset */
#define R16(b) (((b) + 15) / 16 * 16)
  const int64_t eb = fused ? R16(dtype_row_bytes(type, H) * 2 * I) + R16(dtype_row_bytes(type, I) * H)
                           : 2 * R16(dtype_row_bytes(type, H) * I) + R16(dtype_row_bytes(type, I) * H);
#undef R16
  char what[200], err[512];
  snprintf(what, sizeof what, "%s %s", what0, stream ? "streamed" : "decode batches");
  ops_backend *ob = NULL;
  if (cuda_backend_create(&ob, 512, err, sizeof err)) {
    printf("  FAIL %s: backend: %s\n", what, err);
    g_fail++;
    free(shape);
    return -1;
  }
  const cuda_offload_params op = {.host_memory_limit = mirror ? 0 : (int64_t)OFF_L * E * (eb + 64) / 3,
                                  .cached_experts_per_layer = 1,
                                  .swap_every = 1,
                                  .no_zero_copy = mirror == 2,
                                  .no_prefill_stream = !stream};
  g_checks++;
  if (cuda_backend_set_offload(ob, shape, &op, err, sizeof err)) {
    printf("  FAIL %s: set_offload: %s\n", what, err);
    g_fail++;
    ob->destroy(ob);
    free(shape);
    return -1;
  }
  cuda_backend_set_exact(ob, 0);
  cuda_backend_set_exact(g_gpu, 0);
  static const int sizes[] = {300, 64, 9, 300};
  const int64_t NMAX = 300;
  const int64_t sf = ops_moe_scratch_floats(NMAX, k, H, I);
  float *dscr = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)sf), *dscr2 = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)sf);
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)(NMAX * k));
  float *w = malloc(sizeof(float) * (size_t)(NMAX * k));
  int64_t distinct = 0; /* sum over layer chunks of the distinct routed experts */
  for (int step = 0; step < 4; step++) {
    const int64_t n = sizes[step];
    float *x = hrand(n * H, 1.0f);
    float *dx = dput(x, sizeof(float) * (size_t)(n * H));
    cuda_backend_step_begin(ob, n);
    for (int l = 0; l < OFF_L; l++) {
      off_route(idx, w, n, E, k, 7 * step + l);
      int seen[256] = {0};
      for (int64_t i = 0; i < n * k; i++)
        if (idx[i] < 256 && !seen[idx[i]]) seen[idx[i]] = 1, distinct++;
      int32_t *didx = dput(idx, sizeof(int32_t) * (size_t)(n * k));
      float *dw = dput(w, sizeof(float) * (size_t)(n * k));
      float *dy = dnan(n * H), *dr = dnan(n * H);
      ob->moe_ffn(ob, dy, dx, n, H, didx, dw, k, E, L[l].gate, L[l].up, L[l].down, ACT_KIND_SILU, dscr);
      /* streamed: the resident grouped path on the whole chunk (1e-3); decode batches: the
       * resident decode kernels on the same 8-token slices (the same bits; the grouped path
       * differs from their int8 activations by more than 1e-3) */
      const int64_t slice = stream ? n : 8;
      for (int64_t t0 = 0; t0 < n; t0 += slice) {
        const int64_t m = n - t0 < slice ? n - t0 : slice;
        g_gpu->moe_ffn(g_gpu, dr + t0 * H, dx + t0 * H, m, H, didx + t0 * k, dw + t0 * k, k, E, L[l].gate, L[l].up,
                       L[l].down, ACT_KIND_SILU, dscr2);
      }
      if (ob->error(ob, err, sizeof err)) {
        printf("  FAIL %s step %d layer %d: %s\n", what, step, l, err);
        g_fail++;
      } else {
        char cw[260];
        snprintf(cw, sizeof cw, "%s step %d layer %d n=%lld", what, step, l, (long long)n);
        float *r = dget(dr, n * H);
        cmpd(cw, dy, r, n * H, stream ? 1e-3 : 0.0);
        free(r);
      }
      dfree(dy), dfree(dr), dfree(didx), dfree(dw);
    }
    cuda_backend_step_end(ob);
    dfree(dx), free(x);
    g_checks++;
    if (cuda_backend_offload_check(ob, err, sizeof err)) {
      printf("  FAIL %s step %d n=%lld: %s\n", what, step, (long long)n, err);
      g_fail++;
      break;
    }
  }
  cuda_backend_set_exact(g_gpu, 1);
  cuda_offload_stats st;
  cuda_backend_offload_stats(ob, &st);
  const int64_t copied = st.bytes_mirror + st.bytes_file;
  g_checks++;
  if (stream && (st.prefill_bytes <= 0 || st.prefill_bytes > distinct * eb || st.prefill_tokens != 300 + 64 + 9 + 300 ||
                 !st.summary || !strstr(st.summary, "per token"))) {
    printf("  FAIL %s: prefill traffic %lld bytes (at most %lld: %lld distinct routed x %lld), %lld tokens\n  %s\n",
           what, (long long)st.prefill_bytes, (long long)(distinct * eb), (long long)distinct, (long long)eb,
           (long long)st.prefill_tokens, st.summary ? st.summary : "");
    g_fail++;
  } else if (!stream && st.prefill_bytes != 0) {
    printf("  FAIL %s: prefill streaming ran with the hook off\n", what);
    g_fail++;
  } else {
    printf("  %s: %lld B copied, %lld B by the prefill streaming (%lld distinct routed per layer chunk x %lld B)\n", what,
           (long long)copied, (long long)st.prefill_bytes, (long long)distinct, (long long)eb);
  }
  ob->destroy(ob);
  dfree(dscr), dfree(dscr2);
  free(idx), free(w), free(shape);
  return copied;
}

static void offload_prefill_case(int type, int fused, int H, int I, int E, int k, int mirror) {
  off_layer L[OFF_L];
  for (int l = 0; l < OFF_L; l++) off_layer_make(&L[l], E, fused, type, H, I);
  char what[160];
  snprintf(what, sizeof what, "offload prefill %s%s H=%d I=%d E=%d k=%d %s", dtype_name(type), fused ? " fused" : "",
           H, I, E, k, mirror == 0 ? "partial mirror" : mirror == 1 ? "zero-copy" : "mirror copies");
  printf("  %s ...\n", what);
  const int stale = off_stale_keys(L);
  if (stale)
    printf("  %s: %d host addresses of its weights were keys of g_gpu's mirror map (copies of freed weights: "
           "dropped)\n",
           what, stale);
  cuda_backend_drop_mirrors(g_gpu);
  const int64_t s = offload_prefill_run(L, type, fused, H, I, E, k, mirror, 1, what);
  /* the decode batches copy misses per 8 tokens (zero-copy: they read them over PCIe and
   * count no copies, so there is nothing to compare) */
  if (mirror != 1) {
    const int64_t b = offload_prefill_run(L, type, fused, H, I, E, k, mirror, 0, what);
    g_checks++;
    if (s >= 0 && b >= 0 && !(s < b)) {
      printf("  FAIL %s: streaming copied %lld bytes, the decode batches %lld\n", what, (long long)s, (long long)b);
      g_fail++;
    }
  }
  cuda_backend_drop_mirrors(g_gpu);
  for (int l = 0; l < OFF_L; l++) off_layer_free(&L[l]);
}

/* Budgets below what must stay on the device: refused at set_offload (dense weights) or at
 * the first MoE call (the staging slots), each naming the bytes needed. */
static void offload_budgets(void) {
  off_layer m;
  off_layer_make(&m, 8, 0, ANNA_DTYPE_Q8_0, 256, 256);
  ops_model_shape *shape = calloc(1, sizeof *shape);
  shape->n_layers = 1;
  shape->max_cols = 256;
  shape->dense_weight_bytes = (int64_t)1 << 30;
  shape->layers[0] = (ops_layer_shape){.exp_gate = m.gate, .exp_up = m.up, .exp_down = m.down, .n_exp = 8};
  char err[512] = "";
  ops_backend *ob = NULL;
  if (cuda_backend_create(&ob, 64, err, sizeof err)) {
    printf("  FAIL offload budgets: backend: %s\n", err);
    g_fail++;
    return;
  }
  cuda_offload_params op = {.gpu_memory_limit = (int64_t)512 << 20};
  int rc = cuda_backend_set_offload(ob, shape, &op, err, sizeof err);
  g_checks++;
  if (rc != ANNA_EINVAL || !strstr(err, "bytes needed") || !strstr(err, "1073741824")) {
    printf("  FAIL offload budgets: limit below the dense weights: %d %s\n", rc, err);
    g_fail++;
  }
  /* passes the dense check, then the staging slots (8 tokens x k 2 experts) do not fit */
  shape->dense_weight_bytes = 0;
  op.gpu_memory_limit = dtype_row_bytes(ANNA_DTYPE_Q8_0, 256) * 256 * 3 * 2;
  rc = cuda_backend_set_offload(ob, shape, &op, err, sizeof err);
  g_checks++;
  if (rc) {
    printf("  FAIL offload budgets: set_offload: %s\n", err);
    g_fail++;
  } else {
    float *hx = hrand(256, 1.0f);
    float *dx = dput(hx, 256 * sizeof(float)), *dy = dnan(256);
    free(hx);
    int32_t ids[2] = {0, 1};
    float wts[2] = {0.5f, 0.5f};
    int32_t *didx = dput(ids, sizeof ids);
    float *dw = dput(wts, sizeof wts);
    float *dscr = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)ops_moe_scratch_floats(1, 2, 256, 256));
    ob->moe_ffn(ob, dy, dx, 1, 256, didx, dw, 2, 8, m.gate, m.up, m.down, ACT_KIND_SILU, dscr);
    rc = ob->error(ob, err, sizeof err);
    g_checks++;
    if (rc != ANNA_EINVAL || !strstr(err, "bytes needed")) {
      printf("  FAIL offload budgets: staging over the limit: %d %s\n", rc, err);
      g_fail++;
    }
    dfree(dx), dfree(dy), dfree(didx), dfree(dw), dfree(dscr);
  }
  ob->destroy(ob);
  off_layer_free(&m);
  free(shape);
}

void test_moe_offload(void) {
  printf("moe_offload\n  budgets ...\n");
  offload_budgets();
  for (int mirror = 0; mirror < 3; mirror++) {
    offload_case(ANNA_DTYPE_Q4_K, 0, 256, 512, 16, 4, mirror, 0);
    offload_case(ANNA_DTYPE_Q8_0, 1, 96, 160, 12, 2, mirror, 0);
    offload_case(ANNA_DTYPE_BF16, 0, 64, 96, 9, 3, mirror, 0);
    offload_case(ANNA_DTYPE_Q6_K, 1, 256, 256, 33, 8, mirror, 0);
    offload_case(ANNA_DTYPE_Q4_K, 0, 256, 512, 16, 4, mirror, ANNA_DTYPE_Q6_K); /* Q4_K_M's mix */
  }
  for (int mirror = 0; mirror < 3; mirror++) {
    /* staging min(8 k, E): 32 and 16 slots, so 4 and 8 miss groups per chunk reuse each half */
    offload_prefill_case(ANNA_DTYPE_Q4_K, 0, 256, 512, 128, 4, mirror);
    offload_prefill_case(ANNA_DTYPE_Q8_0, 1, 96, 160, 64, 2, mirror);
  }
  offload_prefill_case(ANNA_DTYPE_BF16, 0, 64, 96, 9, 3, 0);
}
