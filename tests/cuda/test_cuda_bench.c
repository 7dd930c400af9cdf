/* test_cuda_bench.c: the mixed benchmark (--bench=ops, part of --bench): attention, copies,
 * launch cost, a recorded decode-like step, the GDN mixer (unfused vs gdn_step) and matvec
 * bandwidth per weight type and token count. */
#include "cuda_test.h"

/* Matvec bandwidth of each of ntypes weight types, 12288 x 4096, 1..8 tokens. */
static void bench_matvec_types(const int *types, int ntypes) {
  /* NCOPY copies of the weight (distinct host pointers, so distinct device mirrors) are used
   * in turn, so together they exceed the L2 (60 MB) and each call reads its weight from
   * device memory, as a decode step does. */
  enum { NCOPY = 4 };
  const int64_t rows = 12288, cols = 4096;
  for (int i = 0; i < ntypes; i++) {
    float *f;
    void *w = make_weight(types[i], rows, cols, &f);
    free(f);
    const size_t wb = (size_t)(dtype_row_bytes(types[i], cols) * rows);
    ops_weight ow[NCOPY];
    void *wc[NCOPY];
    for (int c = 0; c < NCOPY; c++) {
      wc[c] = malloc(wb);
      memcpy(wc[c], w, wb);
      ow[c] = (ops_weight){types[i], wc[c], rows, cols};
    }
    float *x = hrand(8 * cols, 1.0f), *dx = dput(x, sizeof(float) * 8 * (size_t)cols), *dy = dnan(64 * rows);
    const int nts[] = {1, 2, 4, 8};
    /* f32: f32 activations (the kernels exact mode uses); int8: the default (exact off),
     * int8 activations where the type has a dp4a kernel (else the same kernel again);
     * i8r4: int8 with 4 rows per warp (each activation load serves more rows) */
    const int modes[] = {CUDA_MV_F32, CUDA_MV_DEFAULT, CUDA_MV_INT8_R4};
    const char *mname[] = {"f32", "int8", "i8r4"};
    for (int k = 0; k < 4; k++)
      for (int mi = 0; mi < (nts[k] <= 2 ? 3 : 2); mi++) { /* i8r4 differs for n <= 2 only */
        const int nt = nts[k], mode = modes[mi];
        cuda_backend_set_matvec_variant(g_gpu, mode);
        for (int c = 0; c < NCOPY; c++) g_gpu->matmul(g_gpu, dy, dx, nt, &ow[c], NULL);
        gpu_status("matvec warmup");
        const int reps = 200;
        double t0 = now_s();
        for (int r = 0; r < reps; r++) g_gpu->matmul(g_gpu, dy, dx, nt, &ow[r % NCOPY], NULL);
        gpu_status("matvec");
        double dt = (now_s() - t0) / reps;
        printf("  matvec %-7s n=%d %lldx%lld %-4s: %7.1f us, %6.0f GB/s\n", dtype_name(types[i]), nt,
               (long long)rows, (long long)cols, mname[mi], dt * 1e6, (double)wb / dt / 1e9);
      }
    cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
    dfree(dx), dfree(dy), free(x), free(w);
    cuda_backend_drop_mirrors(g_gpu);
    for (int c = 0; c < NCOPY; c++) free(wc[c]);
  }
}

/* Decode-shaped matvec bandwidth (weight bytes / time) against a device copy. */
void bench_ops(void) {
  printf("bench (GB/s: weight bytes read per second; copy counts read + write)\n");
  bench_attention(8192 - 512);
  bench_attention(0);
  bench_attention_decode(8192);
  bench_attention_decode(32768);
  cuda_backend_drop_mirrors(g_gpu);
  const int64_t big = (int64_t)1 << 28; /* 1 GiB of floats */
  float *a = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)big), *b = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)big);
  if (a && b) {
    g_gpu->copy_rows(g_gpu, b, big / 4, a, big / 4, 4, (int)(big / 4));
    gpu_status("copy warmup");
    double t0 = now_s();
    for (int i = 0; i < 5; i++) g_gpu->copy_rows(g_gpu, b, big / 4, a, big / 4, 4, (int)(big / 4));
    gpu_status("copy");
    double dt = (now_s() - t0) / 5;
    printf("  copy_rows 1 GiB: %.0f GB/s\n", 2.0 * sizeof(float) * big / dt / 1e9);
    /* the driver's own device-to-device copy: the ceiling the notes compare against */
    g_gpu->copy(g_gpu, b, a, sizeof(float) * (size_t)big);
    gpu_status("memcpy warmup");
    t0 = now_s();
    for (int i = 0; i < 5; i++) g_gpu->copy(g_gpu, b, a, sizeof(float) * (size_t)big);
    gpu_status("memcpy");
    dt = (now_s() - t0) / 5;
    printf("  cudaMemcpy d2d 1 GiB: %.0f GB/s\n", 2.0 * sizeof(float) * big / dt / 1e9);
  }
  dfree(a), dfree(b);
  {
    /* per-op cost when launches, not bandwidth, bound the time */
    float *one = dnan(1), *z = g_gpu->alloc(g_gpu, sizeof(float));
    g_gpu->add(g_gpu, z, z, 1);
    gpu_status("launch warmup");
    const int reps = 2000;
    double t0 = now_s();
    for (int i = 0; i < reps; i++) g_gpu->add(g_gpu, z, z, 1);
    gpu_status("launch");
    printf("  launch: %.2f us per tiny op (add of 1 float, %d in a row)\n", (now_s() - t0) / reps * 1e6, reps);
    t0 = now_s();
    for (int i = 0; i < 200; i++) {
      g_gpu->add(g_gpu, z, z, 1);
      gpu_status("sync");
    }
    printf("  launch + sync: %.2f us\n", (now_s() - t0) / 200 * 1e6);
    dfree(one), dfree(z);
  }
  {
    /* a decode-like step of 300 small ops (rmsnorm, 1024x1024 bf16 matvec, add), eager and
     * captured as a graph, each ending in a small download */
    float *wf;
    void *w = make_weight(ANNA_DTYPE_BF16, 1024, 1024, &wf);
    ops_weight ow = {ANNA_DTYPE_BF16, w, 1024, 1024};
    float *nw = hrand(1024, 1.0f), *x = hrand(1024, 1.0f), res[4];
    float *dx = dput(x, sizeof(float) * 1024), *dn = dnan(1024), *dy = dnan(1024);
    /* 0: eager; 1: graph with programmatic launches (the default on sm_90); 2: graph without */
    for (int mode = 0; mode < 3; mode++) {
      const int graphs = mode > 0;
      cuda_backend_set_graphs(g_gpu, graphs);
      cuda_backend_set_pdl(g_gpu, mode == 1);
      double best = 1e9;
      for (int rep = 0; rep < 6; rep++) {
        double t0 = now_s();
        cuda_backend_step_begin(g_gpu, 1);
        for (int i = 0; i < 100; i++) {
          g_gpu->rmsnorm(g_gpu, dn, dx, nw, 1, 1024, 1e-6f, 0);
          g_gpu->matmul(g_gpu, dy, dn, 1, &ow, NULL);
          g_gpu->scale(g_gpu, dy, 0.01f, 1024);
        }
        g_gpu->download(g_gpu, res, dy, sizeof res);
        cuda_backend_step_end(g_gpu);
        gpu_status("step bench");
        double dt = now_s() - t0;
        if (rep > 0 && dt < best) best = dt; /* rep 0 builds the graph */
      }
      printf("  step of 300 ops (%s): %.0f us\n", mode == 0 ? "eager" : mode == 1 ? "graph" : "graph, no PDL",
             best * 1e6);
    }
    cuda_backend_set_graphs(g_gpu, 0);
    cuda_backend_set_pdl(g_gpu, 1);
    dfree(dx), dfree(dn), dfree(dy), free(w), free(wf), free(nw), free(x);
    cuda_backend_drop_mirrors(g_gpu);
  }
  {
    /* The GDN mixer between its projections for the GDN layers of a decode step, as a graph:
     * the 9-op sequence vs gdn_step, per layer (the step's fixed cost, its download and
     * graph launch, included and spread over the layers). Qwen3.5-0.8B: 18 layers, hk = hv = 16;
     * 9B: 24 layers, hv = 32; dk = dv = 128. */
    const int shapes[][3] = {{16, 16, 18}, {16, 32, 24}}; /* hk, hv, layers */
    for (int si = 0; si < 2; si++) {
      const int hk = shapes[si][0], hv = shapes[si][1], dk = 128, dv = 128, kw = 4, L = shapes[si][2];
      const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd, ssz = (int64_t)hv * dk * dv;
      const int64_t NT = 8; /* inputs for up to 8 tokens */
      float *cw = hrand(cd * kw, 0.5f), *alog = hrand(hv, 1.0f), *dtb = hrand(hv, 1.0f), *nw = hrand(dv, 1.0f);
      float *h = hrand(NT * cd, 1.0f), *dqkv = dput(h, sizeof(float) * (size_t)(NT * cd));
      float *dz = dput(h, sizeof(float) * (size_t)(NT * Vd)), *dba = dput(h, sizeof(float) * 2 * (size_t)(NT * hv));
      float *dy = dnan(NT * Vd), *dconv = dnan(NT * cd), *dq2 = dnan(NT * cd), *dg = dnan(2 * NT * hv);
      float *dout = dnan(NT * Vd), *dcs[24], *dst[24], res[4];
      for (int l = 0; l < L; l++)
        dcs[l] = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)(cd * (kw - 1))),
        dst[l] = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)ssz);
      cuda_backend_set_graphs(g_gpu, 1);
      for (int run = 0; run < 5; run++) { /* unfused n = 1, gdn_step n = 1, 8, per-head variant n = 1, 8 */
        const int fused = run > 0;
        const int64_t n = run == 2 || run == 4 ? 8 : 1;
        cuda_backend_set_gdn_variant(g_gpu, run >= 3 ? CUDA_GDN_HEAD : CUDA_GDN_CLUSTER);
        ops_gdn_step_args sa = {
            .n = n, .hk = hk, .hv = hv, .dk = dk, .dv = dv, .kw = kw, .v_tiled = 0, .eps = 1e-6f, .qkv = dqkv,
            .z = dz, .b = dba, .a = dba + n * hv, .conv_w = cw, .a_log = alog, .dt_bias = dtb, .norm_w = nw, .y = dy,
        };
        double best = 1e9, best_gpu = 1e9;
        for (int rep = 0; rep < 8; rep++) {
          double t0 = now_s(), cap, upd, gpu0, gpu1;
          cuda_backend_graph_times(g_gpu, &cap, &upd, &gpu0);
          cuda_backend_step_begin(g_gpu, n);
          for (int l = 0; l < L; l++) {
            sa.conv_state = dcs[l], sa.state = dst[l];
            if (fused) g_gpu->gdn_step(g_gpu, &sa);
            else gdn_unfused(g_gpu, &sa, dconv, dq2, dg, dout);
          }
          g_gpu->download(g_gpu, res, dy, sizeof res);
          cuda_backend_step_end(g_gpu);
          gpu_status("gdn step bench");
          double dt = now_s() - t0;
          cuda_backend_graph_times(g_gpu, &cap, &upd, &gpu1);
          if (rep > 1 && dt < best) best = dt; /* the first reps build the graph */
          if (rep > 1 && gpu1 - gpu0 < best_gpu) best_gpu = gpu1 - gpu0;
        }
        /* step: host time of the whole step; gpu: the graph replay alone (events around it) */
        printf("  GDN mixer x%d, %s shape (hv %d), n=%lld, graph, %-20s step %6.1f us, gpu %6.1f us = %5.2f us/layer\n",
               L, si ? "9B" : "0.8B", hv, (long long)n,
               run >= 3 ? "gdn_step per head:" : fused ? "gdn_step (1 kernel):" : "unfused (9 kernels):",
               best * 1e6, best_gpu * 1e6, best_gpu * 1e6 / L);
      }
      cuda_backend_set_graphs(g_gpu, 0);
      cuda_backend_set_gdn_variant(g_gpu, CUDA_GDN_HEAD); /* back to the default */
      for (int l = 0; l < L; l++) dfree(dcs[l]), dfree(dst[l]);
      dfree(dqkv), dfree(dz), dfree(dba), dfree(dy), dfree(dconv), dfree(dq2), dfree(dg), dfree(dout);
      free(cw), free(alog), free(dtb), free(nw), free(h);
      cuda_backend_drop_mirrors(g_gpu);
    }
  }
  const int types[] = {ANNA_DTYPE_BF16, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q4_K,   ANNA_DTYPE_Q5_K,
                       ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q4_0, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_IQ4_NL};
  bench_matvec_types(types, (int)(sizeof types / sizeof types[0]));
}

/* --bench=matvec_iq: the 2- and 3-bit i-quants beside Q4_K and IQ4_XS (the reference rows). */
void bench_matvec_iq(void) {
  const int types[] = {ANNA_DTYPE_Q4_K,  ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_IQ2_XXS, ANNA_DTYPE_IQ2_XS,
                       ANNA_DTYPE_IQ2_S, ANNA_DTYPE_IQ3_XXS, ANNA_DTYPE_IQ3_S};
  bench_matvec_types(types, (int)(sizeof types / sizeof types[0]));
}
