/* test_cuda_misc.c: the small ops of the CUDA backend against the CPU backend: embed, the
 * norms (rmsnorm, rmsnorm_gated, l2norm), elementwise ops and row copies, rope, conv1d_silu
 * and the GDN gates. */
#include "cuda_test.h"

void test_embed(void) {
  printf("embed\n");
  const int types[] = {ANNA_DTYPE_F32, ANNA_DTYPE_BF16, ANNA_DTYPE_F16, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K};
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int type = types[ti];
    const int64_t rows = 1000, cols = dtype_block_size(type) == 1 ? 200 : 512, n = 37;
    float *wf;
    void *w = make_weight(type, rows, cols, &wf);
    int32_t ids[37];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(rnd() % rows);
    ops_weight ow = {type, w, rows, cols};
    float *ref = malloc(sizeof(float) * (size_t)(n * cols));
    g_cpu->embed(g_cpu, ref, &ow, ids, n, 1.7f);
    int32_t *dids = dput(ids, sizeof ids);
    float *dy = dnan(n * cols);
    g_gpu->embed(g_gpu, dy, &ow, dids, n, 1.7f);
    char what[64];
    snprintf(what, sizeof what, "embed %s", dtype_name(type));
    cmpd(what, dy, ref, n * cols, 1e-6);
    dfree(dids), dfree(dy);
    free(w), free(wf), free(ref);
  }
}

void test_norms(void) {
  printf("norms\n");
  /* 4-aligned widths up to 16384 take the register-resident kernel; 7, 33, 20002 the strided one;
   * l2norm and rmsnorm_gated take a warp per row for 4-aligned widths up to 512 (64, 128, 260) */
  const int ds[] = {1, 7, 33, 64, 128, 260, 1000, 4096, 5120, 16384, 20002};
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int d = ds[i];
    const int64_t rows = 13;
    float *x = hrand(rows * d, 3.0f), *w = hrand(d, 1.0f), *z = hrand(rows * d, 2.0f);
    float *ref = malloc(sizeof(float) * (size_t)(rows * d));
    float *dx = dput(x, sizeof(float) * (size_t)(rows * d)), *dz = dput(z, sizeof(float) * (size_t)(rows * d));
    char what[64];
    for (int mode = 0; mode < 3; mode++) {
      g_cpu->rmsnorm(g_cpu, ref, x, mode ? w : NULL, rows, d, 1e-6f, mode == 2);
      float *dy = dnan(rows * d);
      g_gpu->rmsnorm(g_gpu, dy, dx, mode ? w : NULL, rows, d, 1e-6f, mode == 2);
      snprintf(what, sizeof what, "rmsnorm d=%d mode=%d", d, mode);
      cmpd(what, dy, ref, rows * d, 1e-5);
      dfree(dy);
    }
    { /* in place, as the model's final norm of a logits row runs */
      float *dxi = dput(x, sizeof(float) * (size_t)(rows * d));
      g_cpu->rmsnorm(g_cpu, ref, x, w, rows, d, 1e-6f, 0);
      g_gpu->rmsnorm(g_gpu, dxi, dxi, w, rows, d, 1e-6f, 0);
      snprintf(what, sizeof what, "rmsnorm in place d=%d", d);
      cmpd(what, dxi, ref, rows * d, 1e-5);
      dfree(dxi);
    }
    g_cpu->rmsnorm_gated(g_cpu, ref, x, z, w, rows, d, 1e-6f);
    float *dy = dnan(rows * d);
    g_gpu->rmsnorm_gated(g_gpu, dy, dx, dz, w, rows, d, 1e-6f);
    snprintf(what, sizeof what, "rmsnorm_gated d=%d", d);
    cmpd(what, dy, ref, rows * d, 1e-5);
    dfree(dy);
    memcpy(ref, x, sizeof(float) * (size_t)(rows * d));
    g_cpu->l2norm(g_cpu, ref, rows, d, 1e-6f, 0.3f);
    g_gpu->l2norm(g_gpu, dx, rows, d, 1e-6f, 0.3f);
    snprintf(what, sizeof what, "l2norm d=%d", d);
    cmpd(what, dx, ref, rows * d, 1e-5);
    dfree(dx), dfree(dz);
    free(x), free(w), free(z), free(ref);
  }
}

void test_elementwise(void) {
  printf("elementwise\n");
  const int64_t n = 11;
  const int d = 1031;
  char what[64];
  float *a = hrand(n * 2 * d, 4.0f), *b = hrand(n * 2 * d, 4.0f);
  for (int act = 0; act < 2; act++) {
    float *ref = malloc(sizeof(float) * (size_t)(n * d));
    g_cpu->act_mul(g_cpu, ref, a, b + 3, n, d, 2 * d, 2 * d, act);
    float *da = dput(a, sizeof(float) * (size_t)(n * 2 * d)), *db = dput(b, sizeof(float) * (size_t)(n * 2 * d));
    float *dy = dnan(n * d);
    g_gpu->act_mul(g_gpu, dy, da, db + 3, n, d, 2 * d, 2 * d, act);
    snprintf(what, sizeof what, "act_mul act=%d", act);
    cmpd(what, dy, ref, n * d, 1e-5);
    dfree(da), dfree(db), dfree(dy), free(ref);
  }
  {
    float *y = hcopy(a, n * d);
    float *dy = dput(a, sizeof(float) * (size_t)(n * d)), *dx = dput(b, sizeof(float) * (size_t)(n * d));
    g_cpu->add(g_cpu, y, b, n * d);
    g_gpu->add(g_gpu, dy, dx, n * d);
    cmpd("add", dy, y, n * d, 1e-6);
    g_cpu->scale(g_cpu, y, -0.37f, n * d);
    g_gpu->scale(g_gpu, dy, -0.37f, n * d);
    cmpd("scale", dy, y, n * d, 1e-6);
    g_cpu->softcap(g_cpu, y, n * d, 3.0f);
    g_gpu->softcap(g_gpu, dy, n * d, 3.0f);
    cmpd("softcap", dy, y, n * d, 1e-5);
    for (int bc = 0; bc < 2; bc++) {
      g_cpu->mul_sigmoid(g_cpu, y, b, n, d, bc ? 3 : d, bc);
      g_gpu->mul_sigmoid(g_gpu, dy, dx, n, d, bc ? 3 : d, bc);
      cmpd(bc ? "mul_sigmoid bcast" : "mul_sigmoid", dy, y, n * d, 1e-5);
    }
    dfree(dy), dfree(dx), free(y);
  }
  {
    float *y = hrand(n * 2 * d, 1.0f), *dy = dput(y, sizeof(float) * (size_t)(n * 2 * d));
    float *da = dput(a, sizeof(float) * (size_t)(n * 2 * d));
    g_cpu->copy_rows(g_cpu, y + 5, 2 * d, a + 7, 2 * d - 1, n, d - 9);
    g_gpu->copy_rows(g_gpu, dy + 5, 2 * d, da + 7, 2 * d - 1, n, d - 9);
    cmpd("copy_rows", dy, y, n * 2 * d, 0);
    /* scatter: rows to shuffled destinations */
    float *hdst[11], *ddst[11];
    for (int i = 0; i < n; i++) {
      int r = (int)((i * 7 + 3) % n);
      hdst[i] = y + (int64_t)r * 2 * d + 1;
      ddst[i] = dy + (int64_t)r * 2 * d + 1;
    }
    g_cpu->scatter_rows(g_cpu, hdst, a, n, d);
    g_gpu->scatter_rows(g_gpu, ddst, da, n, d);
    cmpd("scatter_rows", dy, y, n * 2 * d, 0);
    dfree(dy), dfree(da), free(y);
  }
  free(a), free(b);
}

void test_rope(void) {
  printf("rope\n");
  const int cfg[][4] = {/* heads, head_dim, rot, interleaved */ {3, 64, 64, 0}, {2, 128, 32, 0}, {4, 64, 64, 1},
                        {1, 256, 64, 1}};
  for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int H = cfg[c][0], D = cfg[c][1], rot = cfg[c][2], il = cfg[c][3];
    const int64_t n = 9, stride = (int64_t)H * D + 5;
    float *x = hrand(n * stride, 2.0f), *f = malloc(sizeof(float) * (size_t)(rot / 2));
    for (int i = 0; i < rot / 2; i++) f[i] = powf(10000.0f, -2.0f * i / rot);
    int32_t pos[9];
    for (int i = 0; i < n; i++) pos[i] = i * 911 + 3;
    float *dx = dput(x, sizeof(float) * (size_t)(n * stride));
    int32_t *dpos = dput(pos, sizeof pos);
    g_cpu->rope(g_cpu, x, n, H, D, stride, rot, f, pos, il);
    g_gpu->rope(g_gpu, dx, n, H, D, stride, rot, f, dpos, il);
    char what[64];
    snprintf(what, sizeof what, "rope H=%d D=%d rot=%d il=%d", H, D, rot, il);
    cmpd(what, dx, x, n * stride, 1e-5);
    dfree(dx), dfree(dpos), free(x), free(f);
  }
}

void test_conv_gates(void) {
  printf("conv1d_silu, gdn_gates\n");
  /* n, channels, width: short runs keep part of the old state (n < kw - 1) */
  const int cs[][3] = {{1, 67, 4}, {2, 67, 4}, {3, 67, 4}, {7, 67, 4}, {100, 67, 4}, {2049, 300, 4},
                       {1, 33, 8}, {5, 33, 8}, {40, 33, 1}, {3, 129, 2}};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int64_t n = cs[i][0];
    const int ch = cs[i][1], kw = cs[i][2];
    float *x = hrand(n * ch, 2.0f), *w = hrand(ch * kw, 0.5f), *st = hrand(ch * (kw > 1 ? kw - 1 : 1), 1.0f);
    float *dx = dput(x, sizeof(float) * (size_t)(n * ch)),
          *dst = dput(st, sizeof(float) * (size_t)(ch * (kw > 1 ? kw - 1 : 1)));
    float *y = malloc(sizeof(float) * (size_t)(n * ch)), *dy = dnan(n * ch);
    g_cpu->conv1d_silu(g_cpu, y, x, n, ch, w, kw, st);
    g_gpu->conv1d_silu(g_gpu, dy, dx, n, ch, w, kw, dst);
    char what[64];
    snprintf(what, sizeof what, "conv1d_silu n=%lld ch=%d kw=%d", (long long)n, ch, kw);
    cmpd(what, dy, y, n * ch, 1e-5);
    snprintf(what, sizeof what, "conv1d_silu state n=%lld ch=%d kw=%d", (long long)n, ch, kw);
    if (kw > 1) cmpd(what, dst, st, ch * (kw - 1), 0);
    dfree(dx), dfree(dst), dfree(dy), free(x), free(w), free(st), free(y);
  }
  cuda_backend_drop_mirrors(g_gpu);
  const int64_t n = 19;
  const int h = 48;
  float *ba = hrand(n * 2 * h, 5.0f), *alog = hrand(h, 1.0f), *dtb = hrand(h, 3.0f);
  ba[5] = 30.0f; /* softplus' large-input branch */
  float *beta = malloc(sizeof(float) * (size_t)(n * h)), *g = malloc(sizeof(float) * (size_t)(n * h));
  g_cpu->gdn_gates(g_cpu, beta, g, ba, 2 * h, ba + h, 2 * h, alog, dtb, n, h);
  float *dba = dput(ba, sizeof(float) * (size_t)(n * 2 * h)), *dbeta = dnan(n * h), *dg = dnan(n * h);
  g_gpu->gdn_gates(g_gpu, dbeta, dg, dba, 2 * h, dba + h, 2 * h, alog, dtb, n, h);
  cmpd("gdn_gates beta", dbeta, beta, n * h, 1e-6);
  cmpd("gdn_gates g", dg, g, n * h, 1e-5);
  dfree(dba), dfree(dbeta), dfree(dg), free(ba), free(alog), free(dtb), free(beta), free(g);
}
