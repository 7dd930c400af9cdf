/* test_cuda_fused.c: the fused decode ops against the CPU backend and against the unfused
 * sequences on the device: gdn_step, add_rmsnorm and norm_rope; act_matmul and
 * act_matmul_gated_add (activation and gate folded into the int8 down projection); a one-row
 * add_rmsnorm deferred into the next int8 matvec. gdn_unfused serves the --bench=ops GDN bench. */
#include "cuda_test.h"

/* The unfused GDN decode sequence on one backend (what gdn_step replaces); device buffers
 * conv [n, cd], qkv2 [n, cd], gates [2n, hv], o [n, Vd] given by the caller. */
void gdn_unfused(ops_backend *be, const ops_gdn_step_args *a, float *conv, float *qkv2, float *gates,
                        float *o) {
  const int64_t n = a->n, Kd = (int64_t)a->hk * a->dk, Vd = (int64_t)a->hv * a->dv, cd = 2 * Kd + Vd;
  be->conv1d_silu(be, conv, a->qkv, n, (int)cd, a->conv_w, a->kw, a->conv_state);
  float *q = qkv2, *k = qkv2 + n * Kd, *v = qkv2 + 2 * n * Kd;
  be->copy_rows(be, q, Kd, conv, cd, n, (int)Kd);
  be->copy_rows(be, k, Kd, conv + Kd, cd, n, (int)Kd);
  be->copy_rows(be, v, Vd, conv + 2 * Kd, cd, n, (int)Vd);
  be->l2norm(be, q, n * a->hk, a->dk, 1e-6f, 1.0f / sqrtf((float)a->dk));
  be->l2norm(be, k, n * a->hk, a->dk, 1e-6f, 1.0f);
  be->gdn_gates(be, gates, gates + n * a->hv, a->b, a->hv, a->a, a->hv, a->a_log, a->dt_bias, n, a->hv);
  ops_gdn_args r = {n, a->hk, a->hv, a->dk, a->dv, a->v_tiled, q, k, v, gates + n * a->hv, gates, a->state, o};
  be->gdn_recurrent(be, &r);
  be->rmsnorm_gated(be, a->y, o, a->z, a->norm_w, n * a->hv, a->dv, a->eps);
}

/* gdn_step, add_rmsnorm and norm_rope against the CPU backend's (the unfused sequences, bit for bit:
 * test_ops), in both numerics modes (both run f32 kernels: the modes must agree).
 * Tolerances (max error over max |ref|): gdn_step output and state 1e-4, as the recurrent
 * kernel's test: the delta rule's dot products over dk are summed in another order (a tree
 * over P lanes) and the CPU's norms accumulate in double, so f32 rounding of ~dk terms,
 * carried through up to 12 tokens of state, differs by well under 1e-5; rsqrtf adds 2 ulp.
 * The conv state is a copy of raw inputs: exact. add_rmsnorm: x exact (one f32 add, as the
 * CPU), y 1e-5 as the rmsnorm test. */
void test_fused(void) {
  printf("fused ops (gdn_step, add_rmsnorm, norm_rope)\n");
  const int cfgs[][7] = {
      /* n, hk, hv, dk, dv, tiled, kw */
      {1, 16, 16, 128, 128, 0, 4}, /* Qwen3.5-0.8B decode */
      {3, 16, 16, 128, 128, 0, 4}, {7, 16, 32, 128, 128, 1, 4}, /* two v-heads per block, tiled */
      {12, 2, 4, 128, 128, 0, 4},                                /* two launches (8 + 4 tokens) */
      {5, 2, 6, 40, 24, 0, 4},                                   /* odd sizes, three v-heads per block */
      {2, 1, 2, 256, 200, 1, 3},                                 /* widest: 2 lanes per column */
      {9, 3, 3, 64, 64, 0, 2},     {1, 1, 1, 16, 16, 0, 4},
  };
  for (int exact = 0; exact < 2; exact++) {
    cuda_backend_set_exact(g_gpu, exact);
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
      cuda_backend_drop_mirrors(g_gpu);
      const int64_t n = cfgs[c][0];
      const int hk = cfgs[c][1], hv = cfgs[c][2], dk = cfgs[c][3], dv = cfgs[c][4], tiled = cfgs[c][5],
                kw = cfgs[c][6];
      const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd, ssz = (int64_t)hv * dk * dv;
      const int64_t csz = cd * (kw - 1);
      float *qkv = hrand(n * cd, 2.0f), *z = hrand(n * Vd, 2.0f), *ba = hrand(2 * n * hv, 2.0f);
      float *cw = hrand(cd * kw, 0.5f), *alog = hrand(hv, 1.0f), *dtb = hrand(hv, 1.0f), *nw = hrand(dv, 1.0f);
      float *cs = hrand(csz, 1.0f), *st = hrand(ssz, 0.2f), *y = malloc(sizeof(float) * (size_t)(n * Vd));
      float *work = malloc(sizeof(float) * (size_t)ops_gdn_step_work_floats(n, hk, hv, dk, dv));
      float *dqkv = dput(qkv, sizeof(float) * (size_t)(n * cd)), *dz = dput(z, sizeof(float) * (size_t)(n * Vd));
      float *dba = dput(ba, sizeof(float) * (size_t)(2 * n * hv)), *dcs = dput(cs, sizeof(float) * (size_t)csz);
      float *dst = dput(st, sizeof(float) * (size_t)ssz), *dy = dnan(n * Vd);
      ops_gdn_step_args a = {
          .n = n, .hk = hk, .hv = hv, .dk = dk, .dv = dv, .kw = kw, .v_tiled = tiled, .eps = 1e-6f, .qkv = qkv,
          .z = z, .b = ba, .a = ba + n * hv, .conv_w = cw, .a_log = alog, .dt_bias = dtb, .norm_w = nw,
          .conv_state = cs, .state = st, .y = y, .work = work,
      };
      g_cpu->gdn_step(g_cpu, &a);
      a.qkv = dqkv, a.z = dz, a.b = dba, a.a = dba + n * hv, a.conv_state = dcs, a.state = dst, a.y = dy;
      a.work = NULL; /* the fused kernel needs none */
      g_gpu->gdn_step(g_gpu, &a);
      char what[96];
      snprintf(what, sizeof what, "gdn_step n=%lld hk=%d hv=%d dk=%d dv=%d t=%d kw=%d ex=%d", (long long)n, hk, hv,
               dk, dv, tiled, kw, exact);
      cmpd(what, dy, y, n * Vd, 1e-4);
      strcat(what, " state");
      cmpd(what, dst, st, ssz, 1e-4);
      strcat(what, " conv");
      cmpd(what, dcs, cs, csz, 0);
      dfree(dqkv), dfree(dz), dfree(dba), dfree(dcs), dfree(dst), dfree(dy);
      free(qkv), free(z), free(ba), free(cw), free(alog), free(dtb), free(nw), free(cs), free(st), free(y), free(work);
    }
    const int ds[] = {1, 37, 1000, 1024, 4096, 5120, 16384, 20000};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
      cuda_backend_drop_mirrors(g_gpu);
      const int d = ds[i];
      const int64_t rows = i % 2 ? 5 : 1;
      float *x = hrand(rows * d, 3.0f), *r = hrand(rows * d, 3.0f), *w = hrand(d, 1.0f);
      float *y = malloc(sizeof(float) * (size_t)(rows * d));
      float *dr = dput(r, sizeof(float) * (size_t)(rows * d));
      for (int mode = 0; mode < 3; mode++) {
        float *xh = hcopy(x, rows * d), *dx = dput(x, sizeof(float) * (size_t)(rows * d)), *dy = dnan(rows * d);
        g_cpu->add_rmsnorm(g_cpu, xh, r, y, mode ? w : NULL, rows, d, 1e-6f, mode == 2);
        g_gpu->add_rmsnorm(g_gpu, dx, dr, dy, mode ? w : NULL, rows, d, 1e-6f, mode == 2);
        char what[64];
        snprintf(what, sizeof what, "add_rmsnorm d=%d rows=%lld mode=%d ex=%d", d, (long long)rows, mode, exact);
        cmpd(what, dy, y, rows * d, 1e-5);
        strcat(what, " x");
        cmpd(what, dx, xh, rows * d, 0);
        dfree(dx), dfree(dy), free(xh);
      }
      dfree(dr), free(x), free(r), free(w), free(y);
    }
    /* norm_rope: Qwen3.5's strided q (head_dim 256, [q | gate] per head) and in place (k);
     * partial and interleaved rotations; 1e-5 as the rmsnorm and rope tests. */
    const int nr[][6] = {/* n, heads, D, rot, interleaved, strided */ {1, 8, 256, 64, 0, 1}, {3, 2, 256, 64, 0, 0},
                         {7, 3, 40, 40, 1, 1}, {2, 5, 96, 32, 1, 0}, {1, 1, 32, 0, 0, 1}};
    for (size_t i = 0; i < sizeof nr / sizeof nr[0]; i++) {
      cuda_backend_drop_mirrors(g_gpu);
      const int64_t n = nr[i][0];
      const int H = nr[i][1], D = nr[i][2], rot = nr[i][3], il = nr[i][4], strided = nr[i][5];
      const int64_t xhs = strided ? 2 * D : D, xs = H * xhs, out = n * H * D;
      float *x = hrand(n * xs, 2.0f), *w = hrand(D, 1.0f), *f = malloc(sizeof(float) * (size_t)(rot / 2 + 1));
      for (int j = 0; j < rot / 2; j++) f[j] = powf(1e6f, -2.0f * j / (float)rot);
      int32_t pos[7];
      for (int t = 0; t < n; t++) pos[t] = t * 911 + 3;
      float *y = malloc(sizeof(float) * (size_t)out), *dx = dput(x, sizeof(float) * (size_t)(n * xs));
      int32_t *dpos = dput(pos, sizeof(int32_t) * (size_t)n);
      float *dy = strided ? dnan(out) : dx;
      g_cpu->norm_rope(g_cpu, y, x, n, H, D, xs, xhs, w, 1e-6f, i % 2, rot, rot ? f : NULL, pos, il);
      g_gpu->norm_rope(g_gpu, dy, dx, n, H, D, xs, xhs, w, 1e-6f, i % 2, rot, rot ? f : NULL, dpos, il);
      char what[80];
      snprintf(what, sizeof what, "norm_rope n=%lld H=%d D=%d rot=%d il=%d strided=%d ex=%d", (long long)n, H, D, rot,
               il, strided, exact);
      cmpd(what, dy, y, out, 1e-5);
      if (strided) dfree(dy);
      dfree(dx), dfree(dpos), free(x), free(w), free(f), free(y);
    }
  }
  cuda_backend_set_exact(g_gpu, 1); /* back to the tests' default (exact) */
  cuda_backend_drop_mirrors(g_gpu);
}

/* act_matmul (the FFN activation folded into the down projection's int8 prologue at decode
 * sizes) against act_mul + matmul on the GPU (the same arithmetic: silu identical, gelu to
 * 1e-6 as its fused multiply-adds may contract differently) and against the CPU op (exact f32
 * reference; 3e-2 as for the int8 matvecs: the activation rounding, bounded per element by
 * test_matvec_int8). Separate gate/up rows and one [n, 2d] gate|up buffer; n = 9 takes the
 * unfused path; bf16 weights never fold. */
void test_act_matmul(void) {
  printf("act_matmul\n");
  const int types[] = {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q6_K, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_BF16};
  const int64_t ns[] = {1, 2, 3, 8, 9};
  const int64_t d = 512, rows = 300;
  cuda_backend_set_exact(g_gpu, 0);
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    cuda_backend_drop_mirrors(g_gpu);
    float *wf;
    void *w = make_weight(types[ti], rows, d, &wf);
    ops_weight ow = {types[ti], w, rows, d};
    for (int layout = 0; layout < 2; layout++)
      for (int act = 0; act < 2; act++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
          const int64_t n = ns[ni], gs = layout ? 2 * d : d;
          const int ak = act ? ACT_KIND_GELU_TANH : ACT_KIND_SILU;
          float *gu = hrand(n * 2 * d, 2.0f), *h = malloc(sizeof(float) * (size_t)(n * d));
          float *ref = malloc(sizeof(float) * (size_t)(n * rows));
          const float *hg = gu, *hu = layout ? gu + d : gu + n * d;
          cpu_backend_set_exact_matmul(g_cpu, 1);
          g_cpu->act_matmul(g_cpu, ref, h, hg, hu, n, gs, gs, ak, &ow);
          cpu_backend_set_exact_matmul(g_cpu, 0);
          float *dgu = dput(gu, sizeof(float) * (size_t)(n * 2 * d));
          const float *dg = dgu, *du = layout ? dgu + d : dgu + n * d;
          float *dh = dnan(n * d), *dy = dnan(n * rows), *dy2 = dnan(n * rows), *dh2 = dnan(n * d);
          g_gpu->act_matmul(g_gpu, dy, dh, dg, du, n, gs, gs, ak, &ow);
          g_gpu->act_mul(g_gpu, dh2, dg, du, n, (int)d, gs, gs, ak);
          g_gpu->matmul(g_gpu, dy2, dh2, n, &ow, NULL);
          float *sep = dget(dy2, n * rows);
          char what[128];
          snprintf(what, sizeof what, "act_matmul %s n=%lld %s %s", dtype_name(types[ti]), (long long)n,
                   layout ? "gate|up" : "gate, up", act ? "gelu" : "silu");
          cmpd(what, dy, sep, n * rows, act ? 1e-6 : 0.0);
          strcat(what, " vs cpu");
          cmpd(what, dy, ref, n * rows, 3e-2);
          free(sep), free(gu), free(h), free(ref);
          dfree(dgu), dfree(dh), dfree(dy), dfree(dy2), dfree(dh2);
        }
    free(w), free(wf);
  }
  cuda_backend_set_exact(g_gpu, 1);
}

/* act_matmul_gated_add (the MoE shared expert's gated output added into the residual: at
 * decode sizes the gate and the add ride in the int8 down projection's epilogue) against the
 * GPU's own act_matmul + mul_sigmoid + add on the same inputs (the same bits: memcmp) and
 * against the CPU ops composed the same way with an exact matmul (3e-2 as test_act_matmul).
 * y starts random (the op adds into it); one gate per token at strides 1 and 3; n = 9 takes
 * the composed path, bf16 weights never fold. */
void test_act_matmul_gated_add(void) {
  printf("act_matmul_gated_add\n");
  if (!g_gpu->act_matmul_gated_add) {
    printf("  FAIL act_matmul_gated_add: not in the cuda op table\n");
    g_fail++;
    return;
  }
  const int types[] = {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q6_K, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_BF16};
  const int64_t ns[] = {1, 2, 3, 8, 9}, gsts[] = {1, 3};
  const int64_t d = 512, rows = 300;
  cuda_backend_set_exact(g_gpu, 0);
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    cuda_backend_drop_mirrors(g_gpu);
    float *wf;
    void *w = make_weight(types[ti], rows, d, &wf);
    ops_weight ow = {types[ti], w, rows, d};
    for (size_t si = 0; si < sizeof gsts / sizeof gsts[0]; si++)
      for (int act = 0; act < 2; act++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
          const int64_t n = ns[ni], gst = gsts[si];
          const int ak = act ? ACT_KIND_GELU_TANH : ACT_KIND_SILU;
          float *gu = hrand(n * 2 * d, 2.0f), *sg = hrand(n * gst, 4.0f), *y0 = hrand(n * rows, 1.0f);
          float *h = malloc(sizeof(float) * (size_t)(n * d)), *tmp = malloc(sizeof(float) * (size_t)(n * rows));
          float *ref = hcopy(y0, n * rows);
          const float *hg = gu, *hu = gu + n * d;
          cpu_backend_set_exact_matmul(g_cpu, 1);
          g_cpu->act_matmul(g_cpu, tmp, h, hg, hu, n, d, d, ak, &ow);
          cpu_backend_set_exact_matmul(g_cpu, 0);
          g_cpu->mul_sigmoid(g_cpu, tmp, sg, n, (int)rows, gst, 1);
          g_cpu->add(g_cpu, ref, tmp, n * rows);
          float *dgu = dput(gu, sizeof(float) * (size_t)(n * 2 * d)), *dsg = dput(sg, sizeof(float) * (size_t)(n * gst));
          const float *dg = dgu, *du = dgu + n * d;
          float *dy = dput(y0, sizeof(float) * (size_t)(n * rows)), *dy2 = dput(y0, sizeof(float) * (size_t)(n * rows));
          float *dt = dnan(n * rows), *dh = dnan(n * d), *dt2 = dnan(n * rows), *dh2 = dnan(n * d);
          g_gpu->act_matmul_gated_add(g_gpu, dy, dt, dh, dg, du, n, d, d, ak, dsg, gst, &ow);
          g_gpu->act_matmul(g_gpu, dt2, dh2, dg, du, n, d, d, ak, &ow);
          g_gpu->mul_sigmoid(g_gpu, dt2, dsg, n, (int)rows, gst, 1);
          g_gpu->add(g_gpu, dy2, dt2, n * rows);
          float *fused = dget(dy, n * rows), *sep = dget(dy2, n * rows);
          char what[128];
          snprintf(what, sizeof what, "act_matmul_gated_add %s n=%lld gstride %lld %s", dtype_name(types[ti]),
                   (long long)n, (long long)gst, act ? "gelu" : "silu");
          gpu_status(what);
          g_checks++;
          if (memcmp(fused, sep, sizeof(float) * (size_t)(n * rows))) {
            printf("  FAIL %-58s differs from act_matmul + mul_sigmoid + add\n", what);
            g_fail++;
          }
          strcat(what, " vs cpu");
          cmp(what, fused, ref, n * rows, 3e-2);
          free(fused), free(sep), free(gu), free(sg), free(y0), free(h), free(tmp), free(ref);
          dfree(dgu), dfree(dsg), dfree(dy), dfree(dy2), dfree(dt), dfree(dh), dfree(dt2), dfree(dh2);
        }
    free(w), free(wf);
  }
  cuda_backend_set_exact(g_gpu, 1);
}

/* A one-row add_rmsnorm in the default numerics is deferred into the next one-token int8
 * matvec of its output (cuda_pnorm). Per case: add_rmsnorm then matmul_group (or matmul) of y,
 * against the same sequence with a download in between (which launches the norm on its own):
 * x and y must match the unfused ones (x bit for bit: one f32 add; y within 1e-5: another
 * summation order of the squares), the products within 2e-3 of their scale (int8 values of
 * (x + r) * w against those of the normalised row: a rounding may flip). Then against the CPU
 * in exact mode within the matmul_group int8 bound (3e-2). Cases: a group with an int8 entry
 * (fused), one without (Q5_0 and f32: the norm runs on its own), one weight (matmul),
 * one_plus weights, and a second norm deferred right after (the counter reset). */
void test_norm_fused(void) {
  printf("add_rmsnorm fused into the next matvec\n");
  typedef struct {
    int count, d, one_plus;
    int type[3];
    int64_t rows[3];
  } ncase;
  const ncase cases[] = {
      {3, 4096, 0, {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0, ANNA_DTYPE_F32}, {257, 65, 9}},
      {2, 1024, 1, {ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q4_K}, {100, 33}},
      {2, 512, 0, {ANNA_DTYPE_Q5_0, ANNA_DTYPE_F32}, {40, 7}},
      {1, 2048, 1, {ANNA_DTYPE_Q4_K}, {300}},
  };
  cuda_backend_set_exact(g_gpu, 0);
  cpu_backend_set_exact_matmul(g_cpu, 1);
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const ncase *c = &cases[ci];
    const int d = c->d;
    cuda_backend_drop_mirrors(g_gpu);
    void *wd[3];
    ops_weight ow[3];
    const ops_weight *ws[3];
    int64_t ytot = 0;
    for (int i = 0; i < c->count; i++) {
      float *f;
      wd[i] = make_weight(c->type[i], c->rows[i], d, &f);
      free(f);
      ow[i] = (ops_weight){c->type[i], wd[i], c->rows[i], d};
      ws[i] = &ow[i];
      ytot += c->rows[i];
    }
    float *x = hrand(d, 1.0f), *r = hrand(d, 1.0f), *w = hrand(d, 1.0f);
    /* CPU: x + r, its norm, the products (exact) */
    float *xc = hcopy(x, d), *yc = malloc(sizeof(float) * (size_t)d), *ref = malloc(sizeof(float) * (size_t)ytot);
    float *hy[3];
    int64_t off = 0;
    for (int i = 0; i < c->count; i++) hy[i] = ref + off, off += c->rows[i];
    g_cpu->add_rmsnorm(g_cpu, xc, r, yc, w, 1, d, 1e-6f, c->one_plus);
    g_cpu->matmul_group(g_cpu, c->count, hy, yc, 1, ws, NULL);
    float *res[2][3]; /* [0] unfused, [1] fused: x, y, products */
    for (int fused = 0; fused < 2; fused++) {
      float *dx = dput(x, sizeof(float) * (size_t)d), *dr = dput(r, sizeof(float) * (size_t)d), *dy = dnan(d);
      float *dout = dnan(ytot), *dys[3], tmp;
      off = 0;
      for (int i = 0; i < c->count; i++) dys[i] = dout + off, off += c->rows[i];
      g_gpu->add_rmsnorm(g_gpu, dx, dr, dy, w, 1, d, 1e-6f, c->one_plus);
      if (!fused) g_gpu->download(g_gpu, &tmp, dr, sizeof tmp); /* any other op launches the norm */
      if (c->count == 1) g_gpu->matmul(g_gpu, dys[0], dy, 1, ws[0], NULL);
      else g_gpu->matmul_group(g_gpu, c->count, dys, dy, 1, ws, NULL);
      if (fused) { /* a second deferred norm right after: the election counter must be back at 0 */
        g_gpu->add_rmsnorm(g_gpu, dx, dr, dy, w, 1, d, 1e-6f, c->one_plus);
        g_gpu->matmul(g_gpu, dys[0], dy, 1, ws[0], NULL);
        g_gpu->add_rmsnorm(g_gpu, dx, dr, dy, w, 1, d, 1e-6f, c->one_plus); /* a third: the download launches it */
      }
      res[fused][0] = dget(dx, d), res[fused][1] = dget(dy, d), res[fused][2] = dget(dout, ytot);
      dfree(dx), dfree(dr), dfree(dy), dfree(dout);
    }
    char what[96];
    snprintf(what, sizeof what, "norm+matvec d=%d %s x%d unfused vs cpu", d, dtype_name(c->type[0]), c->count);
    cmp(what, res[0][0], xc, d, 0);
    cmp(what, res[0][2], ref, ytot, 3e-2);
    /* the fused run added r three times (x, y: the third norm's) and entry 0's products are
     * the second norm's; the other entries are the first (fused) launch's */
    float *x3 = hcopy(x, d), *y3 = malloc(sizeof(float) * (size_t)d);
    for (int k = 0; k < 3; k++) g_cpu->add_rmsnorm(g_cpu, x3, r, y3, w, 1, d, 1e-6f, c->one_plus);
    snprintf(what, sizeof what, "norm+matvec d=%d %s x%d fused: x", d, dtype_name(c->type[0]), c->count);
    cmp(what, res[1][0], x3, d, 1e-6);
    snprintf(what, sizeof what, "norm+matvec d=%d %s x%d fused: y", d, dtype_name(c->type[0]), c->count);
    cmp(what, res[1][1], y3, d, 1e-5);
    snprintf(what, sizeof what, "norm+matvec d=%d %s x%d fused vs unfused", d, dtype_name(c->type[0]), c->count);
    if (c->count > 1) cmp(what, res[1][2] + c->rows[0], res[0][2] + c->rows[0], ytot - c->rows[0], 2e-3);
    /* entry 0 after the second norm: its input was rmsnorm(x + 2r) */
    float *x2 = hcopy(x, d), *y2 = malloc(sizeof(float) * (size_t)d), *r0 = malloc(sizeof(float) * (size_t)c->rows[0]);
    for (int k = 0; k < 2; k++) g_cpu->add_rmsnorm(g_cpu, x2, r, y2, w, 1, d, 1e-6f, c->one_plus);
    g_cpu->matmul(g_cpu, r0, y2, 1, ws[0], NULL);
    snprintf(what, sizeof what, "norm+matvec d=%d %s x%d fused, second norm", d, dtype_name(c->type[0]), c->count);
    cmp(what, res[1][2], r0, c->rows[0], 3e-2);
    for (int k = 0; k < 2; k++)
      for (int j = 0; j < 3; j++) free(res[k][j]);
    for (int i = 0; i < c->count; i++) free(wd[i]);
    free(x), free(r), free(w), free(xc), free(yc), free(ref), free(x3), free(y3), free(x2), free(y2), free(r0);
  }
  cpu_backend_set_exact_matmul(g_cpu, 0);
  cuda_backend_set_exact(g_gpu, 1);
  cuda_backend_drop_mirrors(g_gpu);
}
