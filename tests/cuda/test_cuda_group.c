/* test_cuda_group.c: matmul_group (weights sharing an input, grouped launches of mixed types)
 * against single matmuls on the device and the CPU backend, also in recorded steps;
 * matmul_group_route (router group + route in one op) bit for bit against matmul_group +
 * moe_route; and the grouped in-projection benchmark (--bench=group). */
#include "cuda_test.h"

/* matmul_group: groups of up to OPS_GROUP_MAX weights of mixed types (the grouped kernels
 * take the weights of one type and path together; the others launch alone), odd row counts,
 * biases on some entries, one shared input, n = 1, 2, 3, 8 (the decode token groups) and 9
 * (per-weight GEMMs). Checks, per mode (exact; default int8; int8 with 4 rows per warp,
 * which has no grouped instance):
 * - against the same weights through matmul on the device, bit for bit (tolerance 0): a
 *   grouped launch runs each row's arithmetic unchanged and adds a bias with the one f32 add
 *   the single path's bias kernel does;
 * - against the CPU backend's matmul_group in exact mode (f32 activations): 1e-4 of the
 *   output scale when the device is exact too (f32 rounding, another summation order, as
 *   test_matmul); 3e-2 in the default mode, a layout and indexing check only (int8
 *   activations: about 1e-3 of the scale on these random inputs, bounded per element by
 *   test_matvec_int8; n = 9 runs the tensor-core GEMM, 1e-2 in test_matmul).
 * Outputs start as NaN, so a row nobody writes fails. Then one group replayed in a recorded
 * step (graphs on) must give the eager bits. */
void test_matmul_group(void) {
  printf("matmul_group\n");
  typedef struct {
    int count;
    int64_t cols;
    int type[OPS_GROUP_MAX];
    int64_t rows[OPS_GROUP_MAX];
    int bias[OPS_GROUP_MAX];
  } gcase;
  const gcase cases[] = {
      /* GDN-like: two pairs of one type each (two grouped launches) */
      {4, 512, {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0}, {129, 33, 17, 1}, {0, 0, 0, 0}},
      /* q/k/v with biases (Qwen2), one type */
      {3, 768, {ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0}, {300, 65, 65}, {1, 1, 1, 0}},
      /* float weights: plain kernel groups (bf16 pair) and a lone f32 with a bias */
      {3, 512, {ANNA_DTYPE_BF16, ANNA_DTYPE_F32, ANNA_DTYPE_BF16}, {300, 7, 5}, {0, 1, 1, 0}},
      /* odd width: the plain kernel without 16-byte loads */
      {2, 257, {ANNA_DTYPE_F16, ANNA_DTYPE_F16}, {3, 1}, {1, 0}},
      /* all different types: every weight alone */
      {4, 512, {ANNA_DTYPE_Q6_K, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_Q5_K, ANNA_DTYPE_Q4_0}, {65, 31, 3, 100}, {0, 1, 0, 0}},
      /* unit kernel types (no piece decoder): Q5_0 pair grouped */
      {4, 512, {ANNA_DTYPE_Q5_0, ANNA_DTYPE_Q2_K, ANNA_DTYPE_Q5_0, ANNA_DTYPE_Q3_K}, {40, 19, 7, 11}, {1, 0, 0, 1}},
      {4, 512, {ANNA_DTYPE_IQ4_NL, ANNA_DTYPE_Q4_1, ANNA_DTYPE_IQ4_NL, ANNA_DTYPE_Q5_1}, {64, 20, 33, 5}, {0, 0, 1, 0}},
      /* more rows than the device keeps resident: the blocks are split in proportion */
      {3, 256, {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K}, {20001, 31, 2}, {0, 0, 1}},
      {2, 512, {ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0}, {9001, 3}, {0, 0}},
      /* 8 tokens of 8192 columns: past the default 48 KB of int8 activations (opt-in limit) */
      {2, 8192, {ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q6_K}, {40, 9}, {0, 1}},
  };
  const int ns[] = {1, 2, 3, 8, 9};
  cpu_backend_set_exact_matmul(g_cpu, 1);
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const gcase *gc = &cases[ci];
    cuda_backend_drop_mirrors(g_gpu);
    const int cnt = gc->count;
    const int64_t cols = gc->cols;
    void *wdata[OPS_GROUP_MAX];
    ops_weight ow[OPS_GROUP_MAX];
    const ops_weight *ws[OPS_GROUP_MAX];
    float *bias[OPS_GROUP_MAX];
    int64_t ytot = 0;
    for (int i = 0; i < cnt; i++) {
      float *wf;
      wdata[i] = make_weight(gc->type[i], gc->rows[i], cols, &wf);
      free(wf);
      ow[i] = (ops_weight){gc->type[i], wdata[i], gc->rows[i], cols};
      ws[i] = &ow[i];
      bias[i] = gc->bias[i] ? hrand(gc->rows[i], 1.0f) : NULL;
      ytot += gc->rows[i];
    }
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
      const int64_t n = ns[ni];
      if (gc->rows[0] > 5000 && n != 1 && n != 3) continue; /* big weights: a few token counts */
      float *x = hrand(n * cols, 1.0f), *ref = malloc(sizeof(float) * (size_t)(n * ytot));
      float *dx = dput(x, sizeof(float) * (size_t)(n * cols));
      float *hy[OPS_GROUP_MAX];
      int64_t off = 0;
      for (int i = 0; i < cnt; i++) hy[i] = ref + off, off += n * gc->rows[i];
      g_cpu->matmul_group(g_cpu, cnt, hy, x, n, ws, (const float *const *)bias);
      for (int mode = 0; mode < 3; mode++) {
        const int exact = mode == 0;
        cuda_backend_set_exact(g_gpu, exact);
        cuda_backend_set_matvec_variant(g_gpu, mode == 2 ? CUDA_MV_INT8_R4 : CUDA_MV_DEFAULT);
        float *dg = dnan(n * ytot), *ds = dnan(n * ytot), *dgy[OPS_GROUP_MAX];
        off = 0;
        for (int i = 0; i < cnt; i++) {
          dgy[i] = dg + off;
          g_gpu->matmul(g_gpu, ds + off, dx, n, ws[i], bias[i]);
          off += n * gc->rows[i];
        }
        g_gpu->matmul_group(g_gpu, cnt, dgy, dx, n, ws, (const float *const *)bias);
        char what[160];
        int wl = snprintf(what, sizeof what, "group n=%lld cols=%lld", (long long)n, (long long)cols);
        for (int i = 0; i < cnt && wl < (int)sizeof what - 24; i++)
          wl += snprintf(what + wl, sizeof what - (size_t)wl, " %s:%lld%s", dtype_name(gc->type[i]),
                         (long long)gc->rows[i], bias[i] ? "+b" : "");
        snprintf(what + wl, sizeof what - (size_t)wl, " %s", mode == 0 ? "exact" : mode == 1 ? "int8" : "i8r4");
        float *g = dget(dg, n * ytot), *sgl = dget(ds, n * ytot);
        gpu_status(what);
        g_checks++;
        if (memcmp(g, sgl, sizeof(float) * (size_t)(n * ytot))) {
          int64_t bad = 0;
          for (int64_t i = 0; i < n * ytot; i++) bad += memcmp(&g[i], &sgl[i], sizeof(float)) != 0;
          printf("  FAIL %s: %lld of %lld differ from single matmuls\n", what, (long long)bad, (long long)(n * ytot));
          g_fail++;
        }
        off = 0;
        for (int i = 0; i < cnt; i++) { /* per weight: each has its own output scale */
          char wi[192];
          snprintf(wi, sizeof wi, "%s vs cpu [%d]", what, i);
          cmp(wi, g + off, ref + off, n * gc->rows[i], exact ? 1e-4 : 3e-2);
          off += n * gc->rows[i];
        }
        free(g), free(sgl);
        dfree(dg), dfree(ds);
      }
      dfree(dx);
      free(x), free(ref);
    }
    for (int i = 0; i < cnt; i++) free(wdata[i]), free(bias[i]);
  }
  cuda_backend_set_matvec_variant(g_gpu, CUDA_MV_DEFAULT);
  cpu_backend_set_exact_matmul(g_cpu, 0);
  {
    /* recorded: the q/k/v case's group inside decode steps (graph built, then relaunched) */
    const gcase *gc = &cases[1];
    cuda_backend_drop_mirrors(g_gpu);
    cuda_backend_set_exact(g_gpu, 0);
    ops_weight ow[OPS_GROUP_MAX];
    const ops_weight *ws[OPS_GROUP_MAX];
    void *wdata[OPS_GROUP_MAX];
    float *bias[OPS_GROUP_MAX];
    int64_t ytot = 0;
    for (int i = 0; i < gc->count; i++) {
      float *wf;
      wdata[i] = make_weight(gc->type[i], gc->rows[i], gc->cols, &wf);
      free(wf);
      ow[i] = (ops_weight){gc->type[i], wdata[i], gc->rows[i], gc->cols};
      ws[i] = &ow[i];
      bias[i] = gc->bias[i] ? hrand(gc->rows[i], 1.0f) : NULL;
      ytot += gc->rows[i];
    }
    const int64_t n = 1;
    float *x = hrand(gc->cols, 1.0f), *dx = dput(x, sizeof(float) * (size_t)gc->cols), *dy = dnan(ytot);
    float *dyy[OPS_GROUP_MAX], *eager = NULL;
    int64_t off = 0;
    for (int i = 0; i < gc->count; i++) dyy[i] = dy + off, off += gc->rows[i];
    g_gpu->matmul_group(g_gpu, gc->count, dyy, dx, n, ws, (const float *const *)bias);
    eager = dget(dy, ytot);
    cuda_backend_set_graphs(g_gpu, 1);
    for (int step = 0; step < 3; step++) {
      float *out = malloc(sizeof(float) * (size_t)ytot);
      g_gpu->memset0(g_gpu, dy, sizeof(float) * (size_t)ytot);
      cuda_backend_step_begin(g_gpu, n);
      g_gpu->matmul_group(g_gpu, gc->count, dyy, dx, n, ws, (const float *const *)bias);
      g_gpu->download(g_gpu, out, dy, sizeof(float) * (size_t)ytot);
      cuda_backend_step_end(g_gpu);
      char what[64];
      snprintf(what, sizeof what, "group in a recorded step %d", step);
      gpu_status(what);
      g_checks++;
      if (memcmp(out, eager, sizeof(float) * (size_t)ytot)) {
        printf("  FAIL %s: differs from the eager launch\n", what);
        g_fail++;
      }
      free(out);
    }
    cuda_backend_set_graphs(g_gpu, 0);
    dfree(dx), dfree(dy), free(x), free(eager);
    for (int i = 0; i < gc->count; i++) free(wdata[i]), free(bias[i]);
  }
  cuda_backend_set_exact(g_gpu, 1); /* back to the tests' default (exact) */
  cuda_backend_drop_mirrors(g_gpu);
}

/* matmul_group_route (the MoE layer's router, shared-expert gate/up and gate logit, then the
 * route): bit-identical to matmul_group then moe_route, for 1-9 tokens (4 and 8 fold the route
 * into the plain group's last block; 3 and 9 fall back), eagerly three times in a row (the
 * election counter resets), inside recorded steps (graphs: the second step replays), after a
 * deferred add_rmsnorm (one token: the int8 launch takes the norm), and with the router in
 * bf16 (still plain) and Q8_0 (int8 path: routed by its own kernel). Each also with the
 * shared slot, on the group of the router and the one-row f32 gate logit (entry 3): rows of
 * k + 1, the routed slots as moe_route's and slot k = (E, sigmoid(logit)). With the f32
 * router that group is one plain launch: folded route, and for one token with a deferred norm
 * the norm in its blocks (the same bits as the add_rmsnorm kernel the reference runs); with
 * the bf16 / Q8_0 router the logit runs in another launch, so the route is not folded. */
void test_matmul_group_route(void) {
  printf("matmul_group_route\n");
  const int64_t H = 512, I = 96;
  const int rtypes[] = {ANNA_DTYPE_F32, ANNA_DTYPE_BF16, ANNA_DTYPE_Q8_0};
  const int Es[] = {256, 64, 128};
  const int ns[] = {1, 2, 3, 4, 8, 9};
  for (int rt = 0; rt < 3; rt++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int E = Es[rt], k = rt == 1 ? 4 : 8;
    const int types[4] = {rtypes[rt], ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_F32};
    const int64_t rows[4] = {E, I, I, 1};
    void *wd[4];
    ops_weight ow[4];
    const ops_weight *ws[4];
    int64_t ytot = 0;
    for (int i = 0; i < 4; i++) {
      float *wf;
      wd[i] = make_weight(types[i], rows[i], H, &wf);
      free(wf);
      ow[i] = (ops_weight){types[i], wd[i], rows[i], H};
      ws[i] = &ow[i];
      ytot += rows[i];
    }
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
      const int64_t n = ns[ni];
      float *x = hrand(n * H, 1.0f), *r0 = hrand(H, 1.0f), *nw = hrand(H, 1.0f);
      float *dx = dput(x, sizeof(float) * (size_t)(n * H));
      for (int mode = 0; mode < 8; mode++) { /* eager, eager again (x3), recorded step (x2), deferred norm */
        const int sh = mode >= 4; /* 4..7: the same with the shared slot (entry 3's logit) */
        if (mode % 4 == 3 && n != 1) continue;
        const int kk = k + sh;
        float *dy[2], *dyi[2][4];
        int32_t *didx[2];
        float *dw[2], *dxn[2] = {NULL, NULL}, *dres[2] = {NULL, NULL};
        for (int v = 0; v < 2; v++) { /* v 0: fused op, 1: group then route */
          dy[v] = dnan(n * ytot);
          int64_t off = 0;
          for (int i = 0; i < 4; i++) dyi[v][i] = dy[v] + off, off += n * rows[i];
          didx[v] = g_gpu->alloc(g_gpu, sizeof(int32_t) * (size_t)(n * (v ? k : kk)));
          dw[v] = dnan(n * (v ? k : kk));
          const float *xin = dx;
          if (mode % 4 == 3) { /* x += r, xn = rmsnorm(x) * w, deferred into the group's int8 launch */
            dres[v] = dput(x, sizeof(float) * (size_t)H);
            float *dr = dput(r0, sizeof(float) * (size_t)H);
            dxn[v] = dnan(H);
            g_gpu->add_rmsnorm(g_gpu, dres[v], dr, dxn[v], nw, 1, (int)H, 1e-6f, 0);
            xin = dxn[v];
            dfree(dr);
          }
          const int reps = mode % 4 == 1 ? 3 : mode % 4 == 2 ? 2 : 1;
          for (int rep = 0; rep < reps; rep++) {
            if (mode % 4 == 2) cuda_backend_set_graphs(g_gpu, 1), cuda_backend_step_begin(g_gpu, n);
            /* the shared-slot modes group the router and the logit only (the model's group
             * then: with an f32 router one plain launch, which takes a deferred norm itself) */
            float *ys2[2] = {dyi[v][0], dyi[v][3]};
            const ops_weight *ws2[2] = {ws[0], ws[3]};
            if (v == 0 && sh) {
              g_gpu->matmul_group_route(g_gpu, 2, ys2, xin, n, ws2, NULL, 0, didx[v], dw[v], k, 1, NULL, 1);
            } else if (v == 0) {
              g_gpu->matmul_group_route(g_gpu, 4, dyi[v], xin, n, ws, NULL, 0, didx[v], dw[v], k, 1, NULL, -1);
            } else {
              if (sh) g_gpu->matmul_group(g_gpu, 2, ys2, xin, n, ws2, NULL);
              else g_gpu->matmul_group(g_gpu, 4, dyi[v], xin, n, ws, NULL);
              g_gpu->moe_route(g_gpu, didx[v], dw[v], dyi[v][0], n, E, k, 1, NULL);
            }
            if (mode % 4 == 2) cuda_backend_step_end(g_gpu), cuda_backend_set_graphs(g_gpu, 0);
          }
        }
        char what[128];
        snprintf(what, sizeof what, "group_route n=%lld E=%d k=%d router %s %s%s", (long long)n, E, k,
                 dtype_name(rtypes[rt]),
                 mode % 4 == 0 ? "eager" : mode % 4 == 1 ? "eager x3" : mode % 4 == 2 ? "graph x2" : "norm",
                 sh ? " shared slot" : "");
        float *g0 = dget(dy[0], n * ytot), *g1 = dget(dy[1], n * ytot);
        float *w0 = dget(dw[0], n * kk), *w1 = dget(dw[1], n * k);
        int32_t *i0 = malloc(sizeof(int32_t) * (size_t)(n * kk)), *i1 = malloc(sizeof(int32_t) * (size_t)(n * k));
        g_gpu->download(g_gpu, i0, didx[0], sizeof(int32_t) * (size_t)(n * kk));
        g_gpu->download(g_gpu, i1, didx[1], sizeof(int32_t) * (size_t)(n * k));
        gpu_status(what);
        g_checks++;
        int bad = memcmp(g0, g1, sizeof(float) * (size_t)(n * ytot)) != 0;
        for (int64_t t = 0; t < n; t++) {
          /* the routed slots as moe_route's; the shared one (E, sigmoid(entry 3's logit)) */
          bad |= memcmp(w0 + t * kk, w1 + t * k, sizeof(float) * (size_t)k) != 0;
          bad |= memcmp(i0 + t * kk, i1 + t * k, sizeof(int32_t) * (size_t)k) != 0;
          for (int j = 0; j < k; j++) bad |= i0[t * kk + j] < 0 || i0[t * kk + j] >= E || isnan(w0[t * kk + j]);
          if (sh) {
            const float lg = g1[n * (E + 2 * I) + t], want = 1.0f / (1.0f + expf(-lg));
            bad |= i0[t * kk + k] != E || !(fabsf(w0[t * kk + k] - want) <= 1e-6f);
          }
        }
        if (mode % 4 == 3) {
          float *a0 = dget(dres[0], H), *a1 = dget(dres[1], H), *n0 = dget(dxn[0], H), *n1 = dget(dxn[1], H);
          bad |= memcmp(a0, a1, sizeof(float) * (size_t)H) != 0 || memcmp(n0, n1, sizeof(float) * (size_t)H) != 0;
          free(a0), free(a1), free(n0), free(n1);
        }
        if (bad) {
          printf("  FAIL %s: differs from matmul_group + moe_route\n", what);
          g_fail++;
        }
        free(g0), free(g1), free(w0), free(w1), free(i0), free(i1);
        for (int v = 0; v < 2; v++) {
          dfree(dy[v]), dfree(dw[v]), g_gpu->free(g_gpu, didx[v]);
          if (dxn[v]) dfree(dxn[v]), dfree(dres[v]);
        }
      }
      dfree(dx), free(x), free(r0), free(nw);
    }
    for (int i = 0; i < 4; i++) free(wd[i]);
  }
  cuda_backend_drop_mirrors(g_gpu);
}

/* The 4 GDN in-projections of a Qwen3.5-9B layer (hidden 4096: qkv 8192 rows, z 4096, b and a
 * 32 each), all Q4_K or all Q8_0: separate matmuls (4 launches) against one matmul_group,
 * eager (us per call, launch cost included) and in recorded steps of NCOPY layers replayed as
 * a graph (us per layer, as a decode step runs them). NCOPY copies of the weights (distinct
 * mirrors, together past the 60 MB L2) are used in turn, so weights come from device memory. */
void bench_matmul_group(void) {
  enum { NCOPY = 4, CNT = 4 };
  const int types[] = {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0};
  const int64_t cols = 4096, rows[CNT] = {8192, 4096, 32, 32};
  printf("bench matmul_group (GDN in-projections, 9B shape)\n");
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    cuda_backend_drop_mirrors(g_gpu);
    ops_weight ow[NCOPY][CNT];
    const ops_weight *ws[NCOPY][CNT];
    void *wd[NCOPY][CNT];
    size_t bytes = 0;
    for (int i = 0; i < CNT; i++) {
      float *f;
      void *w = make_weight(types[ti], rows[i], cols, &f);
      free(f);
      const size_t wb = (size_t)(dtype_row_bytes(types[ti], cols) * rows[i]);
      bytes += wb;
      for (int c = 0; c < NCOPY; c++) {
        wd[c][i] = malloc(wb);
        memcpy(wd[c][i], w, wb);
        ow[c][i] = (ops_weight){types[ti], wd[c][i], rows[i], cols};
        ws[c][i] = &ow[c][i];
      }
      free(w);
    }
    float *x = hrand(8 * cols, 1.0f), *dx = dput(x, sizeof(float) * 8 * (size_t)cols);
    float *dy[CNT], res[4];
    for (int i = 0; i < CNT; i++) dy[i] = dnan(8 * rows[i]);
    const int nts[] = {1, 4};
    for (int k = 0; k < 2; k++) {
      const int64_t nt = nts[k];
      for (int grouped = 0; grouped < 2; grouped++) {
        cuda_backend_set_exact(g_gpu, 0);
        for (int c = 0; c < NCOPY; c++) { /* warm-up: mirrors made */
          if (grouped) g_gpu->matmul_group(g_gpu, CNT, dy, dx, nt, ws[c], NULL);
          else
            for (int i = 0; i < CNT; i++) g_gpu->matmul(g_gpu, dy[i], dx, nt, ws[c][i], NULL);
        }
        gpu_status("group bench warmup");
        const int reps = 200;
        double t0 = now_s();
        for (int r = 0; r < reps; r++) {
          if (grouped) g_gpu->matmul_group(g_gpu, CNT, dy, dx, nt, ws[r % NCOPY], NULL);
          else
            for (int i = 0; i < CNT; i++) g_gpu->matmul(g_gpu, dy[i], dx, nt, ws[r % NCOPY][i], NULL);
        }
        gpu_status("group bench");
        const double eager = (now_s() - t0) / reps;
        cuda_backend_set_graphs(g_gpu, 1);
        double best = 1e9;
        for (int rep = 0; rep < 8; rep++) {
          double t1 = now_s();
          cuda_backend_step_begin(g_gpu, nt);
          for (int c = 0; c < NCOPY; c++) {
            if (grouped) g_gpu->matmul_group(g_gpu, CNT, dy, dx, nt, ws[c], NULL);
            else
              for (int i = 0; i < CNT; i++) g_gpu->matmul(g_gpu, dy[i], dx, nt, ws[c][i], NULL);
          }
          g_gpu->download(g_gpu, res, dy[0], sizeof res);
          cuda_backend_step_end(g_gpu);
          gpu_status("group bench graph");
          const double dt = now_s() - t1;
          if (rep > 1 && dt < best) best = dt; /* the first reps build the graph */
        }
        cuda_backend_set_graphs(g_gpu, 0);
        printf("  %s n=%lld %-8s: eager %7.1f us per call (%5.0f GB/s), graph %7.1f us per layer (%5.0f GB/s)\n",
               dtype_name(types[ti]), (long long)nt, grouped ? "grouped" : "separate", eager * 1e6,
               (double)bytes / eager / 1e9, best / NCOPY * 1e6, (double)bytes * NCOPY / best / 1e9);
      }
    }
    cuda_backend_set_exact(g_gpu, 1);
    for (int i = 0; i < CNT; i++) dfree(dy[i]);
    dfree(dx), free(x);
    cuda_backend_drop_mirrors(g_gpu);
    for (int c = 0; c < NCOPY; c++)
      for (int i = 0; i < CNT; i++) free(wd[c][i]);
  }
}
