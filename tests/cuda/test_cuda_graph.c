/* test_cuda_graph.c: decode steps recorded as CUDA graphs: the eager results from built, replayed
 * and updated graphs with launch/build/update counts, and the early launch of a first piece. */
#include "cuda_test.h"

/* Early launch of a recorded step (cuda_backend_set_graph_piece): a step of ~160 dependent
 * ops (an uploaded id, its embedding row, then rmsnorm, bf16 matvec, scale and residual add
 * 40 times, ending in a download) with the first piece at 0 (off), 1, 7, 48 nodes and around
 * the step's length; three steps each (the graphs built, replayed, then updated for a new id).
 * Every result bit-identical to the eager run of the same id, and one launch counted per
 * step. */
void test_graph_pieces(void) {
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

/* A decode-like step captured as a graph (upload, ops, ring arguments, download) gives the
 * eager result, also when replayed with new inputs (graph updated in place). */
void test_graphs(void) {
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
