/* test_cuda_moe.c: the MoE ops against the CPU backend: moe_route (ties included), moe_ffn at
 * decode sizes (f32 and int8 kernels, with per-output int8 bounds, recorded steps) and prefill
 * sizes (host-grouped, grouped tensor-core tiles, cuBLAS and the pipelined tiles on
 * pre-dequantized experts, each forced by its test hook); and the
 * MoE prefill and decode benchmarks (--bench=moe). */
#include "cuda_test.h"

/* E experts: gate (2I rows when fused, gate then up), up (unless fused) and down weights of
 * the given types, with their f32 values (keep_f32) for the host bounds. */
typedef struct moe_mats {
  int E, fused, H, I;
  ops_weight *gate, *up, *down;
  float **gf, **uf, **df; /* [E] f32 values, NULL unless kept */
} moe_mats;

static void moe_mats_make(moe_mats *m, int E, int fused, int tg, int tu, int td, int H, int I, int keep_f32) {
  memset(m, 0, sizeof *m);
  m->E = E, m->fused = fused, m->H = H, m->I = I;
  m->gate = calloc((size_t)E, sizeof(ops_weight)), m->up = calloc((size_t)E, sizeof(ops_weight));
  m->down = calloc((size_t)E, sizeof(ops_weight));
  m->gf = calloc((size_t)E, sizeof(float *)), m->uf = calloc((size_t)E, sizeof(float *));
  m->df = calloc((size_t)E, sizeof(float *));
  for (int e = 0; e < E; e++) {
    const int64_t gr = fused ? 2 * (int64_t)I : I;
    m->gate[e] = (ops_weight){tg, make_weight(tg, gr, H, &m->gf[e]), gr, H};
    if (!fused) m->up[e] = (ops_weight){tu, make_weight(tu, I, H, &m->uf[e]), I, H};
    m->down[e] = (ops_weight){td, make_weight(td, H, I, &m->df[e]), H, I};
    if (!keep_f32) {
      free(m->gf[e]), free(m->uf[e]), free(m->df[e]);
      m->gf[e] = m->uf[e] = m->df[e] = NULL;
    }
  }
}

static void moe_mats_free(moe_mats *m) {
  for (int e = 0; e < m->E; e++) {
    free((void *)m->gate[e].data), free((void *)m->down[e].data), free(m->gf[e]), free(m->uf[e]), free(m->df[e]);
    if (!m->fused) free((void *)m->up[e].data);
  }
  free(m->gate), free(m->up), free(m->down), free(m->gf), free(m->uf), free(m->df);
}

/* n tokens routed to k distinct experts each (uniformly at random), positive weights. */
static void moe_route_random(int32_t *idx, float *w, int64_t n, int E, int k) {
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)E);
  for (int e = 0; e < E; e++) perm[e] = e;
  for (int64_t t = 0; t < n; t++)
    for (int j = 0; j < k; j++) { /* partial Fisher-Yates */
      const int r = j + (int)(rnd() % (uint64_t)(E - j));
      const int32_t s = perm[j];
      perm[j] = perm[r], perm[r] = s;
      idx[t * k + j] = perm[j];
      w[t * k + j] = 0.5f * (frand() + 1.0f) + 0.05f;
    }
  free(perm);
}

/* moe_ffn at decode sizes in the default numerics (int8 activations in both expert products
 * where the types have int8 kernels) against bounds derived as test_matvec_int8's: rounding
 * a 32-block of activations to q * s, s = max|v| / 127, moves each element by at most
 * max|v_blk| / 254, so a dot over row w moves by at most sum_c |w_c| max|v_blk(c)| / 254
 * (times 1.01 for the f32 rounding of s and of the kernel's products), plus 1e-5 * sum_c
 * |w_c v_c| for the f32 accumulation. Three checks per output, all f64 on the host:
 * 1. h (the device's gate/up result, which the decode path leaves at the start of the
 *    scratch: n * k * I floats) against act(g) * u of the f32 weights and x: with eg, eu the
 *    bounds of the two dots and |silu'| <= 1.1, |h' - h| <= 1.1 eg (|u| + eu) + |silu(g)| eu;
 *    an id out of range must leave its h row exactly 0;
 * 2. out against sum_j w_j down_e . h' from the device's h': the matvec bound of the second
 *    product alone (both checks are about as tight as test_matvec_int8's);
 * 3. out against the CPU op (f32 activations): the two propagated, sum_j |w_j| sum_i |D_ri|
 *    (bh_i + max_blk(|h| + bh) / 254). Looser (it adds the first product's worst case over
 *    I terms), but it is the op's own contract;
 * and a decode-step graph of the same call, built then replayed, gives the same bits. */
static void moe_int8_check(const char *what, const moe_mats *m, const float *x, const int32_t *idx, const float *w,
                           int64_t n, int k, const float *ref, const float *dx, const int32_t *didx, const float *dw,
                           float *dscr) {
  const int64_t H = m->H, I = m->I, nk = n * k;
  const ops_weight *up = m->fused ? NULL : m->up;
  float *dy = dnan(n * H);
  g_gpu->moe_ffn(g_gpu, dy, dx, n, (int)H, didx, dw, k, m->E, m->gate, up, m->down, ACT_KIND_SILU, dscr);
  float *y = dget(dy, n * H), *hg = dget(dscr, nk * I);
  char cw[192];
  snprintf(cw, sizeof cw, "%s int8", what);
  gpu_status(cw);
  double *h64 = calloc((size_t)(nk * I), sizeof(double)), *bh = calloc((size_t)(nk * I), sizeof(double));
  double *ab = malloc(sizeof(double) * (size_t)((H + 31) / 32)); /* float experts' H, I: any multiple of 4 */
  int bad[3] = {0, 0, 0};
  double q[3] = {0, 0, 0};
  for (int64_t t = 0; t < n; t++) {
    const float *xt = x + t * H;
    for (int64_t b = 0; b < (H + 31) / 32; b++) {
      ab[b] = 0;
      for (int64_t c = b * 32; c < H && c < b * 32 + 32; c++) ab[b] = fmax(ab[b], fabs(xt[c]));
    }
    for (int j = 0; j < k; j++) {
      const int64_t p = t * k + j;
      const int e = idx[p];
      for (int64_t i = 0; i < I; i++) {
        if (e < 0) { /* out of range on the device (E or -1): nothing */
          if (hg[p * I + i] != 0.0f) bad[0]++;
          continue;
        }
        const float *gr = m->gf[e] + i * H, *ur = m->fused ? m->gf[e] + (I + i) * H : m->uf[e] + i * H;
        double g = 0, u = 0, bg = 0, bu = 0, mg = 0, mu = 0;
        for (int64_t c = 0; c < H; c++) {
          g += (double)gr[c] * xt[c], u += (double)ur[c] * xt[c];
          bg += fabs(gr[c]) * ab[c / 32] / 254.0, bu += fabs(ur[c]) * ab[c / 32] / 254.0;
          mg += fabs((double)gr[c] * xt[c]), mu += fabs((double)ur[c] * xt[c]);
        }
        const double eg = 1.01 * bg + 1e-5 * mg, eu = 1.01 * bu + 1e-5 * mu, sg = g / (1.0 + exp(-g));
        const double hv = sg * u, b = 1.1 * eg * (fabs(u) + eu) + fabs(sg) * eu + 1e-6 * fabs(hv);
        h64[p * I + i] = hv, bh[p * I + i] = b;
        const double err = fabs((double)hg[p * I + i] - hv);
        if (isnan(hg[p * I + i]) || !(err <= b)) bad[0]++;
        else q[0] = fmax(q[0], err / b);
      }
    }
    for (int64_t r = 0; r < H; r++) {
      double y2 = 0, b2 = 0, m2 = 0, b3 = 0, m3 = 0;
      for (int j = 0; j < k; j++) {
        const int64_t p = t * k + j;
        const int e = idx[p];
        if (e < 0) continue;
        const float *dr = m->df[e] + r * I, *hp = hg + p * I;
        const double *hv = h64 + p * I, *hb = bh + p * I;
        for (int64_t b0 = 0; b0 < I; b0 += 32) {
          const int64_t b1 = b0 + 32 < I ? b0 + 32 : I;
          double am = 0, am3 = 0;
          for (int64_t i = b0; i < b1; i++) am = fmax(am, fabs(hp[i])), am3 = fmax(am3, fabs(hv[i]) + hb[i]);
          for (int64_t i = b0; i < b1; i++) {
            const double wd = fabs((double)w[p] * dr[i]);
            y2 += (double)w[p] * dr[i] * hp[i], b2 += wd * am / 254.0, m2 += wd * fabs(hp[i]);
            b3 += wd * (hb[i] + am3 / 254.0), m3 += wd * (fabs(hv[i]) + hb[i]);
          }
        }
      }
      const double v = y[t * H + r], e2 = fabs(v - y2), e3 = fabs(v - ref[t * H + r]);
      const double bound2 = 1.01 * b2 + 1e-5 * m2 + 1e-6 * fabs(y2), bound3 = 1.01 * b3 + 1e-5 * m3 + 1e-6 * fabs(y2);
      if (isnan(y[t * H + r]) || !(e2 <= bound2)) bad[1]++;
      else q[1] = fmax(q[1], e2 / bound2);
      if (isnan(y[t * H + r]) || !(e3 <= bound3)) bad[2]++;
      else q[2] = fmax(q[2], e3 / bound3);
    }
  }
  static const char *const stage[3] = {"h (gate/up)", "out from the device's h (down)", "out vs the CPU op"};
  for (int s = 0; s < 3; s++) {
    g_checks++;
    if (bad[s]) {
      printf("  FAIL %s: %s: %d outside the int8 bound\n", cw, stage[s], bad[s]);
      g_fail++;
    }
  }
  printf("  %-52s error / bound: h %.3f, down %.3f, op %.3f\n", cw, q[0], q[1], q[2]);
  /* recorded: built, then replayed; the same bits as the eager call */
  cuda_backend_set_graphs(g_gpu, 1);
  for (int rep = 0; rep < 2; rep++) {
    float *dg = dnan(n * H);
    cuda_backend_step_begin(g_gpu, n);
    g_gpu->moe_ffn(g_gpu, dg, dx, n, (int)H, didx, dw, k, m->E, m->gate, up, m->down, ACT_KIND_SILU, dscr);
    cuda_backend_step_end(g_gpu);
    float *g = dget(dg, n * H);
    gpu_status(cw);
    g_checks++;
    if (memcmp(g, y, sizeof(float) * (size_t)(n * H))) {
      printf("  FAIL %s graph %d: differs from the eager result\n", cw, rep);
      g_fail++;
    }
    free(g), dfree(dg);
  }
  cuda_backend_set_graphs(g_gpu, 0);
  free(h64), free(bh), free(ab), free(y), free(hg), dfree(dy);
}

void test_moe(void) {
  printf("moe\n");
  /* the last two: logits rounded to a few values, so equal logits compete (ties go to the
   * lower expert id, across lanes and within one) */
  const int rc[][5] = {/* n, E, k, renorm, ties */ {1, 8, 2, 1, 0},   {7, 16, 4, 0, 0},  {33, 128, 8, 1, 0},
                       {5, 256, 8, 1, 0},  {3, 1000, 10, 0, 0}, {4, 256, 8, 1, 1}, {2, 100, 32, 0, 1}};
  for (size_t c = 0; c < sizeof rc / sizeof rc[0]; c++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int64_t n = rc[c][0];
    const int E = rc[c][1], k = rc[c][2], renorm = rc[c][3];
    float *lg = hrand(n * E, 3.0f), *pe = c % 2 ? hrand(E, 1.0f) : NULL;
    if (rc[c][4])
      for (int64_t i = 0; i < n * E; i++) lg[i] = roundf(lg[i]);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(n * k));
    float *w = malloc(sizeof(float) * (size_t)(n * k));
    g_cpu->moe_route(g_cpu, idx, w, lg, n, E, k, renorm, pe);
    float *dlg = dput(lg, sizeof(float) * (size_t)(n * E));
    int32_t *didx = g_gpu->alloc(g_gpu, sizeof(int32_t) * (size_t)(n * k));
    float *dw = dnan(n * k);
    g_gpu->moe_route(g_gpu, didx, dw, dlg, n, E, k, renorm, pe);
    int32_t *gidx = malloc(sizeof(int32_t) * (size_t)(n * k));
    g_gpu->download(g_gpu, gidx, didx, sizeof(int32_t) * (size_t)(n * k));
    char what[64];
    snprintf(what, sizeof what, "moe_route n=%lld E=%d k=%d", (long long)n, E, k);
    g_checks++;
    if (memcmp(gidx, idx, sizeof(int32_t) * (size_t)(n * k))) {
      printf("  FAIL %s: expert ids differ\n", what);
      g_fail++;
    }
    cmpd(what, dw, w, n * k, 1e-5);
    dfree(dlg), dfree(didx), dfree(dw), free(lg), free(pe), free(idx), free(w), free(gidx);
  }
  /* moe_ffn: decode (n <= 8: device-side kernels, also replayed as a graph) and prefill
   * sizes (host-grouped), separate and fused gate/up, float and quantized experts, gate/up
   * and down of different types, odd expert counts, ids out of range (decode only: E on the
   * device, where the kernels skip it, and -1 on the CPU, whose op skips that; or -1 on
   * both). Exact mode first (f32 kernels: 1e-4), then for decode sizes the default numerics
   * (moe_int8_check) and the f32 decode variant in default mode (1e-4). */
  const int fc[][10] = {
      /* n, fused, gate, up, down type, H, I, E, k, out of range (1: E, 2: -1) */
      {1, 0, ANNA_DTYPE_BF16, ANNA_DTYPE_BF16, ANNA_DTYPE_BF16, 64, 96, 8, 2, 0},
      {20, 1, ANNA_DTYPE_BF16, ANNA_DTYPE_BF16, ANNA_DTYPE_BF16, 64, 96, 8, 2, 0},
      {3, 0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, 256, 512, 8, 2, 0},
      {40, 1, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0, 96, 160, 8, 2, 0},
      {8, 0, ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q6_K, 256, 256, 8, 2, 0},
      {2, 1, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_IQ4_XS, ANNA_DTYPE_IQ4_XS, 256, 512, 8, 2, 0},
      {5, 1, ANNA_DTYPE_F32, ANNA_DTYPE_F32, ANNA_DTYPE_F32, 40, 24, 8, 2, 0},
      {1, 0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K, 512, 256, 7, 4, 1},
      {2, 1, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K, 256, 512, 9, 3, 2},
      {8, 0, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0, 512, 512, 13, 8, 1},
      {3, 1, ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q6_K, 512, 256, 5, 2, 0},
      {2, 0, ANNA_DTYPE_Q5_K, ANNA_DTYPE_Q5_K, ANNA_DTYPE_Q8_0, 256, 96, 8, 2, 0},
      {8, 1, ANNA_DTYPE_Q4_0, ANNA_DTYPE_Q4_0, ANNA_DTYPE_IQ4_NL, 96, 160, 11, 4, 2},
      {1, 0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q4_K, 256, 256, 8, 2, 0},
      {1, 0, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q8_0, 2816, 704, 6, 3, 0},
      /* the 2- and 3-bit i-quants (an IQ2_M-like mix: IQ2_XXS / IQ2_S experts, IQ3 down) */
      {1, 0, ANNA_DTYPE_IQ2_XXS, ANNA_DTYPE_IQ2_XXS, ANNA_DTYPE_IQ2_XXS, 256, 512, 8, 2, 0},
      {4, 1, ANNA_DTYPE_IQ2_S, ANNA_DTYPE_IQ2_S, ANNA_DTYPE_IQ3_S, 512, 256, 9, 3, 1},
      {8, 0, ANNA_DTYPE_IQ2_XS, ANNA_DTYPE_IQ2_XS, ANNA_DTYPE_IQ3_XXS, 256, 256, 8, 2, 0},
      {20, 1, ANNA_DTYPE_IQ2_XXS, ANNA_DTYPE_IQ2_XXS, ANNA_DTYPE_IQ2_S, 256, 512, 8, 2, 0},
  };
  for (size_t c = 0; c < sizeof fc / sizeof fc[0]; c++) {
    cuda_backend_drop_mirrors(g_gpu);
    const int64_t n = fc[c][0];
    const int fused = fc[c][1], tg = fc[c][2], tu = fc[c][3], td = fc[c][4], H = fc[c][5], I = fc[c][6];
    const int E = fc[c][7], k = fc[c][8], oor = fc[c][9];
    moe_mats m;
    moe_mats_make(&m, E, fused, tg, tu, td, H, I, 1);
    float *x = hrand(n * H, 1.0f), *w = malloc(sizeof(float) * (size_t)(n * k));
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(n * k)), *gidx = malloc(sizeof(int32_t) * (size_t)(n * k));
    moe_route_random(idx, w, n, E, k);
    memcpy(gidx, idx, sizeof(int32_t) * (size_t)(n * k));
    if (oor == 1) idx[k - 1] = -1, gidx[k - 1] = E;
    if (oor == 2) idx[n * k - 1] = gidx[n * k - 1] = -1;
    const int64_t sf = ops_moe_scratch_floats(n, k, H, I);
    float *scratch = malloc(sizeof(float) * (size_t)sf), *ref = malloc(sizeof(float) * (size_t)(n * H));
    /* f32 activations on both sides (the CPU's default would quantize them to 8 bits) */
    cpu_backend_set_exact_matmul(g_cpu, 1);
    g_cpu->moe_ffn(g_cpu, ref, x, n, H, idx, w, k, E, m.gate, fused ? NULL : m.up, m.down, ACT_KIND_SILU, scratch);
    float *dx = dput(x, sizeof(float) * (size_t)(n * H)), *dw = dput(w, sizeof(float) * (size_t)(n * k));
    int32_t *didx = dput(gidx, sizeof(int32_t) * (size_t)(n * k));
    float *dscr = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)sf), *dy = dnan(n * H);
    g_gpu->moe_ffn(g_gpu, dy, dx, n, H, didx, dw, k, E, m.gate, fused ? NULL : m.up, m.down, ACT_KIND_SILU, dscr);
    char what[128];
    snprintf(what, sizeof what, "moe_ffn n=%lld E=%d k=%d %s/%s/%s%s", (long long)n, E, k, dtype_name(tg),
             dtype_name(fused ? tg : tu), dtype_name(td), fused ? " fused" : "");
    cpu_backend_set_exact_matmul(g_cpu, 0);
    const double tol = 1e-4;
    cmpd(what, dy, ref, n * H, tol);
    if (n <= 8) {
      /* the same op captured into a decode-step graph, built then replayed */
      cuda_backend_set_graphs(g_gpu, 1);
      for (int rep = 0; rep < 2; rep++) {
        float *dg = dnan(n * H);
        cuda_backend_step_begin(g_gpu, n);
        g_gpu->moe_ffn(g_gpu, dg, dx, n, H, didx, dw, k, E, m.gate, fused ? NULL : m.up, m.down, ACT_KIND_SILU, dscr);
        cuda_backend_step_end(g_gpu);
        char gw[160];
        snprintf(gw, sizeof gw, "%s graph %d", what, rep);
        cmpd(gw, dg, ref, n * H, tol);
        dfree(dg);
      }
      cuda_backend_set_graphs(g_gpu, 0);
      /* default numerics: the int8 kernels where the types have them */
      cuda_backend_set_exact(g_gpu, 0);
      moe_int8_check(what, &m, x, idx, w, n, k, ref, dx, didx, dw, dscr);
      cuda_backend_set_exact(g_gpu, 1);
    }
    dfree(dx), dfree(dw), dfree(didx), dfree(dscr), dfree(dy);
    moe_mats_free(&m);
    free(x), free(w), free(idx), free(gidx), free(scratch), free(ref);
  }
}

/* ---- MoE prefill: grouped GEMMs on the device ---- */

/* E experts of one type (gate/up separate or fused as 2I rows), and n tokens routed to k
 * distinct experts each (uniformly at random) with positive weights. */
typedef struct moe_case {
  int64_t n;
  int E, k, H, I, type, fused;
  ops_weight *gate, *up, *down;
  void **mem;
  int nm;
  float *x, *w;
  int32_t *idx;
} moe_case;

static void moe_case_make(moe_case *c, int64_t n, int E, int k, int H, int I, int type, int fused) {
  memset(c, 0, sizeof *c);
  c->n = n, c->E = E, c->k = k, c->H = H, c->I = I, c->type = type, c->fused = fused;
  c->gate = malloc(sizeof(ops_weight) * (size_t)E), c->up = malloc(sizeof(ops_weight) * (size_t)E);
  c->down = malloc(sizeof(ops_weight) * (size_t)E);
  c->mem = malloc(sizeof(void *) * (size_t)(3 * E));
  for (int e = 0; e < E; e++) {
    float *f;
    void *p = make_weight(type, fused ? 2 * I : I, H, &f);
    free(f);
    c->gate[e] = (ops_weight){type, p, fused ? 2 * I : I, H};
    c->mem[c->nm++] = p;
    if (!fused) {
      p = make_weight(type, I, H, &f);
      free(f);
      c->up[e] = (ops_weight){type, p, I, H};
      c->mem[c->nm++] = p;
    }
    p = make_weight(type, H, I, &f);
    free(f);
    c->down[e] = (ops_weight){type, p, H, I};
    c->mem[c->nm++] = p;
  }
  c->x = hrand(n * H, 1.0f);
  c->w = malloc(sizeof(float) * (size_t)(n * k));
  c->idx = malloc(sizeof(int32_t) * (size_t)(n * k));
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)E);
  for (int e = 0; e < E; e++) perm[e] = e;
  for (int64_t t = 0; t < n; t++)
    for (int j = 0; j < k; j++) { /* partial Fisher-Yates: k distinct experts */
      const int r = j + (int)(rnd() % (uint64_t)(E - j));
      const int32_t s = perm[j];
      perm[j] = perm[r], perm[r] = s;
      c->idx[t * k + j] = perm[j];
      c->w[t * k + j] = 0.5f * (frand() + 1.0f) + 0.05f;
    }
  free(perm);
}

static void moe_case_free(moe_case *c) {
  for (int i = 0; i < c->nm; i++) free(c->mem[i]);
  free(c->mem), free(c->gate), free(c->up), free(c->down), free(c->x), free(c->w), free(c->idx);
}

/* moe_ffn above the decode range against the CPU op (exact matmul: f32 activations):
 * - exact mode 1 (host-grouped path, f32 SGEMMs): 1e-4 of the output scale, f32 rounding;
 * - exact mode 0 (grouped GEMMs on tensor cores), the automatic token tile and each forced
 *   one (16, 32, 64 pairs): the bounds of the dense tensor-core GEMM test, since each of the
 *   two chained products has that GEMM's numerics (activations and h split into bf16 hi +
 *   lo: 16 significant bits; quantized weights rounded to bf16: 2^-9 relative; f32
 *   accumulation): 1e-4 for bf16 experts (used exactly), 1e-2 for quantized ones, while a
 *   wrong slot, tile or expert gives O(1). The automatic tile is run twice: bitwise equal
 *   (no float atomics anywhere).
 * Shapes: n 9..777, E 8 (every expert busy, many tiles each) and 256 (most experts with a
 * few pairs, some with none), H 256..2048 (300: bf16 rows that end mid-unit), I 96..512
 * (not multiples of the 64-column K step), fused and separate gate/up, k 8 and 2. */
void test_moe_grouped(void) {
  printf("moe grouped (prefill)\n");
  const int cs[][7] = {/* n, E, k, H, I, type, fused */
                       {9, 8, 8, 256, 128, ANNA_DTYPE_BF16, 0},    {9, 256, 8, 256, 256, ANNA_DTYPE_Q4_K, 0},
                       {33, 8, 8, 384, 160, ANNA_DTYPE_Q8_0, 1},   {33, 256, 8, 512, 256, ANNA_DTYPE_Q4_K, 1},
                       {512, 256, 8, 2048, 512, ANNA_DTYPE_Q4_K, 0}, {777, 256, 8, 1024, 256, ANNA_DTYPE_Q6_K, 1},
                       {777, 8, 8, 300, 136, ANNA_DTYPE_BF16, 1},  {512, 8, 8, 256, 512, ANNA_DTYPE_Q6_K, 0},
                       {100, 8, 2, 288, 96, ANNA_DTYPE_Q8_0, 0},   {33, 64, 8, 512, 256, ANNA_DTYPE_IQ2_XXS, 0},
                       {100, 8, 4, 256, 512, ANNA_DTYPE_IQ2_S, 1},  {64, 8, 2, 256, 256, ANNA_DTYPE_IQ3_S, 0}};
  /* mode 5: default tiles with split activations for every type (CUDA_GEMM_BF16_SPLIT);
   * 6, 7: the cuBLAS path (quantized experts; bf16 ones fall back to the tile kernels) as
   * one grouped call and as the per-expert fallback loop; 8: the pipelined tile kernel on
   * experts dequantized first (also quantized experts only) */
  const int variants[] = {CUDA_MOE_DEFAULT, CUDA_MOE_T16,    CUDA_MOE_T32,         CUDA_MOE_T64, CUDA_MOE_DEFAULT,
                          CUDA_MOE_CUBLAS,  CUDA_MOE_CUBLAS_LOOP, CUDA_MOE_PIPE};
  for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
    cuda_backend_drop_mirrors(g_gpu);
    moe_case c;
    moe_case_make(&c, cs[ci][0], cs[ci][1], cs[ci][2], cs[ci][3], cs[ci][4], cs[ci][5], cs[ci][6]);
    const int64_t n = c.n, nk = n * c.k, sf = ops_moe_scratch_floats(n, c.k, c.H, c.I);
    float *scratch = malloc(sizeof(float) * (size_t)sf), *ref = malloc(sizeof(float) * (size_t)(n * c.H));
    cpu_backend_set_exact_matmul(g_cpu, 1);
    g_cpu->moe_ffn(g_cpu, ref, c.x, n, c.H, c.idx, c.w, c.k, c.E, c.gate, c.fused ? NULL : c.up, c.down,
                   ACT_KIND_SILU, scratch);
    cpu_backend_set_exact_matmul(g_cpu, 0);
    float *dx = dput(c.x, sizeof(float) * (size_t)(n * c.H)), *dw = dput(c.w, sizeof(float) * (size_t)nk);
    int32_t *didx = dput(c.idx, sizeof(int32_t) * (size_t)nk);
    float *dscr = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)sf);
    float *first = NULL;
    for (int mode = 0; mode < 1 + (int)(sizeof variants / sizeof variants[0]); mode++) {
      const int exact = mode == 0;
      cuda_backend_set_exact(g_gpu, exact);
      if (!exact) cuda_backend_set_moe_variant(g_gpu, variants[mode - 1]);
      cuda_backend_set_gemm_variant(g_gpu, mode == 5 ? CUDA_GEMM_BF16_SPLIT : CUDA_GEMM_BF16);
      float *dy = dnan(n * c.H);
      g_gpu->moe_ffn(g_gpu, dy, dx, n, c.H, didx, dw, c.k, c.E, c.gate, c.fused ? NULL : c.up, c.down, ACT_KIND_SILU,
                     dscr);
      cuda_backend_set_gemm_variant(g_gpu, CUDA_GEMM_BF16);
      char what[128];
      static const char *const mname[] = {"exact",         "grouped", "grouped t16", "grouped t32",
                                          "grouped t64",   "grouped split", "cublas",  "cublas loop",
                                          "pipe (predeq)"};
      snprintf(what, sizeof what, "moe_ffn n=%lld E=%d k=%d H=%d I=%d %s%s %s", (long long)n, c.E, c.k, c.H, c.I,
               dtype_name(c.type), c.fused ? " fused" : "", mname[mode]);
      const double tol = exact || c.type == ANNA_DTYPE_BF16 ? 1e-4 : 1e-2;
      float *g = dget(dy, n * c.H);
      cmp(what, g, ref, n * c.H, tol);
      if (mode == 1) {
        first = g, g = NULL;
        /* again: the same bits */
        float *dz = dnan(n * c.H);
        g_gpu->moe_ffn(g_gpu, dz, dx, n, c.H, didx, dw, c.k, c.E, c.gate, c.fused ? NULL : c.up, c.down,
                       ACT_KIND_SILU, dscr);
        float *g2 = dget(dz, n * c.H);
        gpu_status(what);
        g_checks++;
        if (memcmp(g2, first, sizeof(float) * (size_t)(n * c.H))) {
          printf("  FAIL %s: a second run differs\n", what);
          g_fail++;
        }
        free(g2), dfree(dz);
      }
      free(g), dfree(dy);
    }
    cuda_backend_set_moe_variant(g_gpu, CUDA_MOE_DEFAULT);
    cuda_backend_set_exact(g_gpu, 1); /* back to the tests' default (exact) */
    dfree(dx), dfree(dw), dfree(didx), dfree(dscr);
    free(first), free(scratch), free(ref);
    moe_case_free(&c);
  }
}

/* MoE decode on the 35B-A3B layer shape (E 256, top-8, H 2048, I 512, separate gate/up): the
 * int8-activation kernels (default) against the f32 ones (exact mode's), n = 1 and 4
 * tokens. A step is NL calls with different random routings (as layers: 8 x 8 experts of
 * ~1.8 MB each at Q4_K, more than the 50 MB L2 holds, so a replay reads its experts from
 * memory), recorded as a graph; us per call = the replay's device time / NL. GB/s counts the
 * expert rows a call must read: gate, up and down of each distinct expert of its tokens. */
static void bench_moe_decode(int tgu, int td) {
  enum { NL = 8, NMAX = 4 };
  const int E = 256, k = 8, H = 2048, I = 512;
  printf("bench moe decode (E 256, k 8, H 2048, I 512, gate/up %s, down %s)\n", dtype_name(tgu), dtype_name(td));
  cuda_backend_drop_mirrors(g_gpu);
  moe_mats m;
  moe_mats_make(&m, E, 0, tgu, tgu, td, H, I, 0);
  const double ebytes = 2.0 * I * dtype_row_bytes(tgu, H) + (double)H * dtype_row_bytes(td, I);
  float *x = hrand(NMAX * H, 1.0f), *dx = dput(x, sizeof(float) * (size_t)(NMAX * H));
  int32_t idx[NL][NMAX * 8], *didx[NL];
  float w[NL][NMAX * 8], *dw[NL];
  for (int l = 0; l < NL; l++) {
    moe_route_random(idx[l], w[l], NMAX, E, k);
    didx[l] = dput(idx[l], sizeof idx[l]), dw[l] = dput(w[l], sizeof w[l]);
  }
  float *dscr = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)ops_moe_scratch_floats(NMAX, k, H, I));
  float *dy = dnan(NMAX * H), res[4];
  const int ns[] = {1, NMAX};
  for (int ni = 0; ni < 2; ni++) {
    const int n = ns[ni];
    double bytes = 0; /* distinct experts per call */
    for (int l = 0; l < NL; l++)
      for (int p = 0; p < n * k; p++) {
        int seen = 0;
        for (int q = 0; q < p; q++) seen |= idx[l][q] == idx[l][p];
        if (!seen) bytes += ebytes;
      }
    for (int v = 0; v < 2; v++) {
      cuda_backend_set_exact(g_gpu, v); /* 0: int8 activations; 1: the f32 kernels */
      for (int l = 0; l < NL; l++) /* warm-up: mirrors and tables made outside the step */
        g_gpu->moe_ffn(g_gpu, dy, dx, n, H, didx[l], dw[l], k, E, m.gate, m.up, m.down, ACT_KIND_SILU, dscr);
      gpu_status("moe decode bench warmup");
      cuda_backend_set_graphs(g_gpu, 1);
      double best = 1e9;
      for (int rep = 0; rep < 10; rep++) {
        double cap, upd, gpu0, gpu1;
        cuda_backend_graph_times(g_gpu, &cap, &upd, &gpu0);
        cuda_backend_step_begin(g_gpu, n);
        for (int l = 0; l < NL; l++)
          g_gpu->moe_ffn(g_gpu, dy, dx, n, H, didx[l], dw[l], k, E, m.gate, m.up, m.down, ACT_KIND_SILU, dscr);
        g_gpu->download(g_gpu, res, dy, sizeof res);
        cuda_backend_step_end(g_gpu);
        gpu_status("moe decode bench");
        cuda_backend_graph_times(g_gpu, &cap, &upd, &gpu1);
        if (rep > 1 && gpu1 - gpu0 < best) best = gpu1 - gpu0; /* the first reps build the graph */
      }
      cuda_backend_set_graphs(g_gpu, 0);
      printf("  moe decode n=%d %-8s: %7.1f us per call, %6.0f GB/s of expert rows (%.1f MB per call)\n", n,
             v ? "f32" : "int8", best / NL * 1e6, bytes / best / 1e9, bytes / NL / 1e6);
    }
  }
  cuda_backend_set_moe_variant(g_gpu, CUDA_MOE_DEFAULT);
  cuda_backend_set_exact(g_gpu, 1);
  cuda_backend_drop_mirrors(g_gpu);
  for (int l = 0; l < NL; l++) dfree(didx[l]), dfree(dw[l]);
  dfree(dx), dfree(dscr), dfree(dy), free(x);
  moe_mats_free(&m);
}

/* MoE prefill throughput on the 35B-A3B layer shape (E 256, top-8, H 2048, I 512, Q4_K
 * experts, separate gate/up as in the GGUF files; uniform random routing, so every expert
 * gets about n * 8 / 256 pairs): us per call of the host-grouped path (ids read back,
 * per-expert cuBLAS GEMMs), the default, the in-loop dequantizing tile kernels (each tile
 * forced, and their automatic pick), the cuBLAS path (dequantized experts, one grouped call
 * or the fallback loop of GEMMs) and the pipelined tile kernel on dequantized experts. TFLOP/s
 * counts the useful 2 * n * k * 3 * H * I flops. */
void bench_moe(void) {
  printf("bench moe prefill (E 256, k 8, H 2048, I 512, Q4_K)\n");
  cuda_backend_drop_mirrors(g_gpu); /* the weights below may reuse freed host addresses */
  moe_case c;
  moe_case_make(&c, 8192, 256, 8, 2048, 512, ANNA_DTYPE_Q4_K, 0);
  const int64_t ns[] = {512, 2048, 4096, 8192};
  const int variants[] = {CUDA_MOE_HOST,   CUDA_MOE_DEFAULT, CUDA_MOE_T16,         CUDA_MOE_T32,
                          CUDA_MOE_T64,    CUDA_MOE_TILES,   CUDA_MOE_CUBLAS,      CUDA_MOE_CUBLAS_LOOP,
                          CUDA_MOE_PIPE};
  const char *const vname[] = {"host-grouped", "default",      "tiles t16", "tiles t32",   "tiles t64",
                               "tiles (auto)", "cublas",       "cublas loop", "pipe"};
  cuda_backend_set_exact(g_gpu, 0);
  for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
    const int64_t n = ns[ni], nk = n * c.k, sf = ops_moe_scratch_floats(n, c.k, c.H, c.I);
    float *dx = dput(c.x, sizeof(float) * (size_t)(n * c.H)), *dw = dput(c.w, sizeof(float) * (size_t)nk);
    int32_t *didx = dput(c.idx, sizeof(int32_t) * (size_t)nk);
    float *dscr = g_gpu->alloc(g_gpu, sizeof(float) * (size_t)sf), *dy = dnan(n * c.H);
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
      cuda_backend_set_moe_variant(g_gpu, variants[v]);
      g_gpu->moe_ffn(g_gpu, dy, dx, n, c.H, didx, dw, c.k, c.E, c.gate, c.up, c.down, ACT_KIND_SILU, dscr);
      gpu_status("moe bench warmup");
      const int reps = variants[v] == CUDA_MOE_HOST ? 3 : 10;
      double t0 = now_s();
      for (int r = 0; r < reps; r++)
        g_gpu->moe_ffn(g_gpu, dy, dx, n, c.H, didx, dw, c.k, c.E, c.gate, c.up, c.down, ACT_KIND_SILU, dscr);
      gpu_status("moe bench");
      const double dt = (now_s() - t0) / reps;
      printf("  moe n=%-5lld %-13s: %9.1f us, %6.1f TFLOP/s\n", (long long)n, vname[v], dt * 1e6,
             2.0 * nk * 3.0 * c.H * c.I / dt / 1e12);
    }
    dfree(dx), dfree(dw), dfree(didx), dfree(dscr), dfree(dy);
  }
  cuda_backend_set_moe_variant(g_gpu, CUDA_MOE_DEFAULT);
  cuda_backend_set_exact(g_gpu, 1);
  cuda_backend_drop_mirrors(g_gpu);
  moe_case_free(&c);
  /* decode: Q4_K and Q8_0 files, and Q4_K_M's Q6_K down */
  bench_moe_decode(ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q4_K);
  bench_moe_decode(ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q8_0);
  bench_moe_decode(ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K);
}
