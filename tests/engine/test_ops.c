/* test_ops.c: CPU backend ops against plain reference code on fresh random inputs (odd
 * sizes included), SIMD paths against the scalar path, the chunked GDN kernel against the
 * recurrent one, and the sampler's contracts (attention and the KV formats: test_attn.c). The fixture tests check the composition;
 * this file pins down each op so a backend (CUDA) has a reference to match. */
#include "anna/anna.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_internal.h"
#include "base/threadpool.h"
#include "formats/dtype.h"
#include "formats/quant.h"
#include "model/config.h"
#include "runtime/sample_tail.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_RNG_SEED 88172645463325252ull
#include "test_util.h"

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void test_matmul(ops_backend *be) {
  printf("matmul\n");
  /* The prefill tiles (n >= 8) get rows off their 16/24-row tiles and 6-row blocks, K off the
   * k chunks (128, 256) and token counts off the 32-token panels and 16-token halves. */
  const int shapes[][3] = {{1, 17, 33}, {3, 64, 128}, {5, 129, 100}, {37, 40, 257}, {64, 96, 512}, {9, 7, 300},
                           {50, 53, 389}, {33, 121, 1000}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const int n = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
    float *x = malloc(sizeof(float) * n * cols), *wf = malloc(sizeof(float) * rows * cols), *y = malloc(sizeof(float) * n * rows);
    float *bias = malloc(sizeof(float) * rows);
    uint16_t *wb = malloc(2 * (size_t)rows * cols);
    double *ref = malloc(sizeof(double) * n * rows);
    fill(x, (int64_t)n * cols, 1), fill(wf, (int64_t)rows * cols, 0.5f), fill(bias, rows, 1);
    for (int i = 0; i < rows * cols; i++) wb[i] = to_bf16(wf[i]);
    for (int type = 0; type < 2; type++) {
      for (int t = 0; t < n; t++)
        for (int r = 0; r < rows; r++) {
          double acc = bias[r];
          for (int c = 0; c < cols; c++) acc += (double)x[t * cols + c] * (type ? from_bf16(wb[r * cols + c]) : wf[r * cols + c]);
          ref[t * rows + r] = acc;
        }
      ops_weight w = {type ? ANNA_DTYPE_BF16 : ANNA_DTYPE_F32, type ? (void *)wb : (void *)wf, rows, cols};
      for (int isa = 0; isa <= 2; isa++) {
        cpu_backend_force_isa(isa);
        memset(y, 0, sizeof(float) * n * rows);
        be->matmul(be, y, x, n, &w, bias);
        char what[96];
        snprintf(what, sizeof what, "%s %dx%dx%d isa=%s", type ? "bf16" : "f32", n, rows, cols, cpu_backend_isa());
        check(what, max_rel(y, ref, (int64_t)n * rows), 1e-5);
      }
      cpu_backend_force_isa(9);
    }
    free(x), free(wf), free(y), free(bias), free(wb), free(ref);
  }
}

/* The prefill tiles put tokens in vector lanes: a token's output must not depend on which
 * other tokens share its 32-token panel or where in the panel it sits (a batch-invariant
 * prefill, and prefix-cache reuse, rely on it). Tokens 5..44 of a 45-token batch are run
 * again as the tail of a 43-token batch with different leading tokens: bit-equal outputs. */
static void test_matmul_batch_invariant(ops_backend *be) {
  printf("matmul batch invariance\n");
  const int na = 45, nb = 43, shared = 40, rows = 53, cols = 389;
  float *xa = malloc(sizeof(float) * na * cols), *xb = malloc(sizeof(float) * nb * cols);
  float *w = malloc(sizeof(float) * rows * cols), *ya = malloc(sizeof(float) * na * rows);
  float *yb = malloc(sizeof(float) * nb * rows);
  fill(xa, (int64_t)na * cols, 1), fill(xb, (int64_t)nb * cols, 1), fill(w, (int64_t)rows * cols, 0.5f);
  memcpy(xb + (int64_t)(nb - shared) * cols, xa + (int64_t)(na - shared) * cols, sizeof(float) * shared * cols);
  ops_weight wt = {ANNA_DTYPE_F32, w, rows, cols};
  for (int isa = 1; isa <= 2; isa++) {
    cpu_backend_force_isa(isa);
    be->matmul(be, ya, xa, na, &wt, NULL);
    be->matmul(be, yb, xb, nb, &wt, NULL);
    double d = 0;
    for (int64_t i = 0; i < (int64_t)shared * rows; i++)
      d = fmax(d, fabs((double)ya[(int64_t)(na - shared) * rows + i] - yb[(int64_t)(nb - shared) * rows + i]));
    char what[96];
    snprintf(what, sizeof what, "shared tokens bit-equal across batches isa=%s", cpu_backend_isa());
    check(what, d, 0);
  }
  cpu_backend_force_isa(9);
  free(xa), free(xb), free(w), free(ya), free(yb);
}

/* Quantized weights (Q8_0 here: the one format with a writer in formats/quant.h). Prefill
 * (n >= 8) must equal the dequantized weights times f32 activations; decode (n < 8) uses
 * 8-bit activations like llama.cpp, so it gets the format's rounding budget. */
static void test_matmul_quant(ops_backend *be) {
  printf("matmul q8_0\n");
  const int shapes[][3] = {{1, 33, 64}, {3, 40, 96}, {8, 17, 128}, {37, 50, 256}, {70, 24, 4864}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const int n = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
    float *x = malloc(sizeof(float) * n * cols), *wf = malloc(sizeof(float) * rows * cols), *y = malloc(sizeof(float) * n * rows);
    float *deq = malloc(sizeof(float) * cols);
    const size_t rb = (size_t)dtype_row_bytes(ANNA_DTYPE_Q8_0, cols);
    unsigned char *wq = malloc(rb * rows);
    double *ref = malloc(sizeof(double) * n * rows);
    fill(x, (int64_t)n * cols, 1), fill(wf, (int64_t)rows * cols, 0.5f);
    for (int r = 0; r < rows; r++) quant_quantize_row_q8_0(wf + (int64_t)r * cols, wq + rb * r, cols);
    for (int r = 0; r < rows; r++) {
      quant_dequantize_row(ANNA_DTYPE_Q8_0, wq + rb * r, deq, cols);
      for (int t = 0; t < n; t++) {
        double acc = 0;
        for (int c = 0; c < cols; c++) acc += (double)deq[c] * x[t * cols + c];
        ref[t * rows + r] = acc;
      }
    }
    ops_weight w = {ANNA_DTYPE_Q8_0, wq, rows, cols};
    be->matmul(be, y, x, n, &w, NULL);
    char what[96];
    /* default: 8-bit activations (llama.cpp's numerics), so the format's rounding budget */
    snprintf(what, sizeof what, "q8_0 %dx%dx%d (8-bit activations)", n, rows, cols);
    check(what, max_rel(y, ref, (int64_t)n * rows), 2e-2);
    /* exact mode: dequantized weights x f32 activations */
    cpu_backend_set_exact_matmul(be, 1);
    be->matmul(be, y, x, n, &w, NULL);
    cpu_backend_set_exact_matmul(be, 0);
    snprintf(what, sizeof what, "q8_0 %dx%dx%d (exact)", n, rows, cols);
    check(what, max_rel(y, ref, (int64_t)n * rows), 1e-5);
    free(x), free(wf), free(y), free(deq), free(wq), free(ref);
  }
}

/* matmul_group: the CPU's is its matmuls in turn (the reference device backends match), so
 * the outputs must equal per-weight matmul bit for bit: mixed types (f32, bf16, Q8_0), odd
 * row counts, a bias on some entries, decode and prefill batch sizes, both numerics modes. */
static int same_bits(const float *x, const float *y, int64_t n);
static void test_matmul_group(ops_backend *be) {
  printf("matmul_group\n");
  const int cols = 256, rows[OPS_GROUP_MAX] = {33, 7, 64, 1};
  const int ns[] = {1, 3, 9};
  float *wf[OPS_GROUP_MAX], *bias[OPS_GROUP_MAX];
  void *data[OPS_GROUP_MAX];
  ops_weight ow[OPS_GROUP_MAX];
  const ops_weight *ws[OPS_GROUP_MAX];
  const int types[OPS_GROUP_MAX] = {ANNA_DTYPE_Q8_0, ANNA_DTYPE_F32, ANNA_DTYPE_BF16, ANNA_DTYPE_Q8_0};
  int64_t tot = 0;
  for (int i = 0; i < OPS_GROUP_MAX; i++) {
    wf[i] = malloc(sizeof(float) * (size_t)rows[i] * cols);
    fill(wf[i], (int64_t)rows[i] * cols, 0.5f);
    bias[i] = i % 2 ? malloc(sizeof(float) * (size_t)rows[i]) : NULL;
    if (bias[i]) fill(bias[i], rows[i], 1);
    if (types[i] == ANNA_DTYPE_F32) {
      data[i] = wf[i];
    } else if (types[i] == ANNA_DTYPE_BF16) {
      uint16_t *b = malloc(2 * (size_t)rows[i] * cols);
      for (int j = 0; j < rows[i] * cols; j++) b[j] = to_bf16(wf[i][j]);
      data[i] = b;
    } else {
      const size_t rb = (size_t)dtype_row_bytes(ANNA_DTYPE_Q8_0, cols);
      unsigned char *q = malloc(rb * (size_t)rows[i]);
      for (int r = 0; r < rows[i]; r++) quant_quantize_row_q8_0(wf[i] + (int64_t)r * cols, q + rb * r, cols);
      data[i] = q;
    }
    ow[i] = (ops_weight){types[i], data[i], rows[i], cols};
    ws[i] = &ow[i];
    tot += rows[i];
  }
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    const int n = ns[k];
    float *x = malloc(sizeof(float) * (size_t)n * cols), *a = malloc(sizeof(float) * (size_t)n * tot);
    float *b = malloc(sizeof(float) * (size_t)n * tot);
    fill(x, (int64_t)n * cols, 1);
    for (int exact = 0; exact < 2; exact++) {
      cpu_backend_set_exact_matmul(be, exact);
      for (int cnt = 1; cnt <= OPS_GROUP_MAX; cnt++) {
        float *ys[OPS_GROUP_MAX];
        int64_t off = 0;
        for (int i = 0; i < cnt; i++) {
          ys[i] = a + off;
          be->matmul(be, b + off, x, n, ws[i], bias[i]);
          off += (int64_t)n * rows[i];
        }
        be->matmul_group(be, cnt, ys, x, n, ws, (const float *const *)bias);
        char what[96];
        snprintf(what, sizeof what, "matmul_group = matmul x%d n=%d exact=%d", cnt, n, exact);
        check(what, same_bits(a, b, off) ? 0 : 1, 0);
      }
    }
    cpu_backend_set_exact_matmul(be, 0);
    free(x), free(a), free(b);
  }
  for (int i = 0; i < OPS_GROUP_MAX; i++) {
    if (data[i] != wf[i]) free(data[i]);
    free(wf[i]), free(bias[i]);
  }
}

/* Reference GDN: the recurrence written from the definition, in double. */
static void gdn_ref(int64_t n, int hk, int hv, int dk, int dv, int tiled, const float *q, const float *k, const float *v,
                    const float *g, const float *beta, double *S, double *out) {
  const int r = hv / hk;
  double *u = malloc(sizeof(double) * dv);
  for (int h = 0; h < hv; h++) {
    const int kh = tiled ? h % hk : h / r;
    double *Sh = S + (int64_t)h * dk * dv;
    for (int64_t t = 0; t < n; t++) {
      const float *qt = q + (t * hk + kh) * dk, *kt = k + (t * hk + kh) * dk, *vt = v + (t * hv + h) * dv;
      double d = exp(g[t * hv + h]), b = beta[t * hv + h];
      for (int i = 0; i < dk * dv; i++) Sh[i] *= d;
      for (int j = 0; j < dv; j++) {
        u[j] = 0;
        for (int i = 0; i < dk; i++) u[j] += kt[i] * Sh[i * dv + j];
      }
      for (int i = 0; i < dk; i++)
        for (int j = 0; j < dv; j++) Sh[i * dv + j] += kt[i] * b * (vt[j] - u[j]);
      for (int j = 0; j < dv; j++) {
        double o = 0;
        for (int i = 0; i < dk; i++) o += qt[i] * Sh[i * dv + j];
        out[(t * hv + h) * dv + j] = o;
      }
    }
  }
  free(u);
}

static void l2n(float *x, int64_t rows, int d, float scale) {
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int i = 0; i < d; i++) s += x[r * d + i] * x[r * d + i];
    for (int i = 0; i < d; i++) x[r * d + i] *= scale / sqrt(s + 1e-6);
  }
}

static void test_gdn(ops_backend *be) {
  printf("gated delta rule\n");
  const int cfgs[][6] = {/* n, hk, hv, dk, dv, tiled */ {1, 2, 4, 16, 16, 0},  {63, 2, 4, 16, 24, 0}, {64, 1, 3, 32, 8, 0},
                         {65, 2, 6, 16, 24, 1}, {200, 2, 2, 32, 32, 0}, {130, 3, 6, 8, 40, 1}};
  for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
    const int n = cfgs[c][0], hk = cfgs[c][1], hv = cfgs[c][2], dk = cfgs[c][3], dv = cfgs[c][4], tiled = cfgs[c][5];
    float *q = malloc(sizeof(float) * n * hk * dk), *k = malloc(sizeof(float) * n * hk * dk);
    float *v = malloc(sizeof(float) * n * hv * dv), *g = malloc(sizeof(float) * n * hv), *beta = malloc(sizeof(float) * n * hv);
    float *o1 = malloc(sizeof(float) * n * hv * dv), *o2 = malloc(sizeof(float) * n * hv * dv);
    float *S1 = calloc((size_t)hv * dk * dv, sizeof(float)), *S2 = calloc((size_t)hv * dk * dv, sizeof(float));
    double *Sr = calloc((size_t)hv * dk * dv, sizeof(double)), *orf = malloc(sizeof(double) * n * hv * dv);
    fill(q, (int64_t)n * hk * dk, 1), fill(k, (int64_t)n * hk * dk, 1), fill(v, (int64_t)n * hv * dv, 1);
    l2n(q, (int64_t)n * hk, dk, 1.0f / sqrtf((float)dk)), l2n(k, (int64_t)n * hk, dk, 1.0f);
    for (int i = 0; i < n * hv; i++) g[i] = -fabsf(frand()) * 0.7f, beta[i] = 0.5f + 0.5f * frand();
    /* a carried, non-zero initial state */
    for (int i = 0; i < hv * dk * dv; i++) S1[i] = S2[i] = (float)(Sr[i] = 0.1 * frand());
    gdn_ref(n, hk, hv, dk, dv, tiled, q, k, v, g, beta, Sr, orf);
    ops_gdn_args a = {n, hk, hv, dk, dv, tiled, q, k, v, g, beta, S1, o1};
    be->gdn_recurrent(be, &a);
    ops_gdn_args b = {n, hk, hv, dk, dv, tiled, q, k, v, g, beta, S2, o2};
    be->gdn_chunked(be, &b);
    char what[96];
    snprintf(what, sizeof what, "recurrent n=%d hk=%d hv=%d dk=%d dv=%d%s", n, hk, hv, dk, dv, tiled ? " tiled" : "");
    check(what, max_rel(o1, orf, (int64_t)n * hv * dv), 1e-4);
    snprintf(what, sizeof what, "chunked   n=%d hk=%d hv=%d dk=%d dv=%d%s", n, hk, hv, dk, dv, tiled ? " tiled" : "");
    check(what, max_rel(o2, orf, (int64_t)n * hv * dv), 1e-4);
    snprintf(what, sizeof what, "chunked final state n=%d", n);
    check(what, max_rel(S2, Sr, (int64_t)hv * dk * dv), 1e-4);
    free(q), free(k), free(v), free(g), free(beta), free(o1), free(o2), free(S1), free(S2), free(Sr), free(orf);
  }
}

/* Pages a contiguous cache of L rows (rowb bytes each) into blocks of BL rows laid out in
 * reverse order in a pool, as a paged KV cache would scatter them: table[j] is the block of
 * rows [j*BL, (j+1)*BL). Caller frees *pool and the table. */
static const void **page_cache(const void *rows, int L, int64_t rowb, int BL, void **pool) {
  const int nb = (L + BL - 1) / BL;
  uint8_t *p = calloc((size_t)nb * BL, (size_t)rowb);
  const void **tab = malloc(sizeof(void *) * (size_t)nb);
  for (int j = 0; j < nb; j++) {
    uint8_t *blk = p + (int64_t)(nb - 1 - j) * BL * rowb;
    const int cnt = L - j * BL < BL ? L - j * BL : BL;
    memcpy(blk, (const uint8_t *)rows + (int64_t)j * BL * rowb, (size_t)(cnt * rowb));
    tab[j] = blk;
  }
  *pool = p;
  return tab;
}

/* A second, independent check of the attention op (test_attn is the main one): blocks laid
 * out in reverse order in the pool, and an f32 residual ring. */
static void test_attention(ops_backend *be) {
  printf("attention\n");
  const int cfgs[][6] = {/* n_ctx, Hq, Hkv, D, window, softcap*10 */ {1, 4, 2, 32, 0, 0}, {37, 6, 2, 16, 0, 0},
                         {70, 4, 1, 64, 16, 0},  {50, 8, 8, 8, 5, 300}};
  for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
    const int L = cfgs[c][0], Hq = cfgs[c][1], Hkv = cfgs[c][2], D = cfgs[c][3], win = cfgs[c][4];
    const float cap = cfgs[c][5] / 10.0f, scale = 1.0f / sqrtf((float)D);
    float *K = malloc(sizeof(float) * L * Hkv * D), *V = malloc(sizeof(float) * L * Hkv * D);
    float *q = malloc(sizeof(float) * L * Hq * D), *o = malloc(sizeof(float) * L * Hq * D);
    double *ref = malloc(sizeof(double) * L * Hq * D), *p = malloc(sizeof(double) * L);
    fill(K, (int64_t)L * Hkv * D, 1), fill(V, (int64_t)L * Hkv * D, 1), fill(q, (int64_t)L * Hq * D, 2);
    int32_t *pos = malloc(sizeof(int32_t) * L);
    const void ***kp = malloc(sizeof(void *) * L), ***vp = malloc(sizeof(void *) * L);
    void *kpool, *vpool;
    const int BL = c % 2 ? 16 : 32; /* blocks of 16 or 32 positions, scattered */
    const void **ktab = page_cache(K, L, (int64_t)Hkv * D * 4, BL, &kpool),
               **vtab = page_cache(V, L, (int64_t)Hkv * D * 4, BL, &vpool);
    for (int t = 0; t < L; t++) pos[t] = t, kp[t] = ktab, vp[t] = vtab;
    for (int t = 0; t < L; t++)
      for (int h = 0; h < Hq; h++) {
        const int kh = h / (Hq / Hkv), lo = win && t - win + 1 > 0 ? t - win + 1 : 0;
        double mx = -1e300, sum = 0;
        for (int j = lo; j <= t; j++) {
          double s = 0;
          for (int d = 0; d < D; d++) s += (double)q[(t * Hq + h) * D + d] * K[(j * Hkv + kh) * D + d];
          s *= scale;
          if (cap > 0) s = cap * tanh(s / cap);
          p[j] = s, mx = fmax(mx, s);
        }
        for (int j = lo; j <= t; j++) sum += p[j] = exp(p[j] - mx);
        for (int d = 0; d < D; d++) {
          double acc = 0;
          for (int j = lo; j <= t; j++) acc += p[j] / sum * V[(j * Hkv + kh) * D + d];
          ref[(t * Hq + h) * D + d] = acc;
        }
      }
    ops_attn_args a = {.n = L, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .v_dim = D,
                       .kv_type = OPS_KV_F32, .kv_row_bytes = (int64_t)Hkv * D * 4, .block_len = BL, .scale = scale,
                       .window = win, .softcap = cap, .pos = pos, .k_blocks = (const void *const *const *)kp,
                       .v_blocks = (const void *const *const *)vp};
    be->attention(be, o, q, &a);
    char what[96];
    snprintf(what, sizeof what, "L=%d Hq=%d Hkv=%d D=%d window=%d softcap=%g", L, Hq, Hkv, D, win, cap);
    check(what, max_rel(o, ref, (int64_t)L * Hq * D), 1e-5);
    free(K), free(V), free(q), free(o), free(ref), free(p), free(pos), free(kp), free(vp);
    free(kpool), free(vpool), free(ktab), free(vtab);
  }
}

static void test_conv_rope_norm(ops_backend *be) {
  printf("conv1d, rope, norms\n");
  const int n = 23, ch = 37, kw = 4;
  float *x = malloc(sizeof(float) * n * ch), *w = malloc(sizeof(float) * ch * kw), *y1 = malloc(sizeof(float) * n * ch),
        *y2 = malloc(sizeof(float) * n * ch);
  float *s1 = calloc((size_t)ch * (kw - 1), sizeof(float)), *s2 = calloc((size_t)ch * (kw - 1), sizeof(float));
  fill(x, (int64_t)n * ch, 1), fill(w, (int64_t)ch * kw, 1);
  be->conv1d_silu(be, y1, x, n, ch, w, kw, s1);
  /* same input fed as 1 + 2 + 20 tokens through the carried state */
  be->conv1d_silu(be, y2, x, 1, ch, w, kw, s2);
  be->conv1d_silu(be, y2 + ch, x + ch, 2, ch, w, kw, s2);
  be->conv1d_silu(be, y2 + 3 * ch, x + 3 * ch, n - 3, ch, w, kw, s2);
  double *ref = malloc(sizeof(double) * n * ch);
  for (int t = 0; t < n; t++)
    for (int c = 0; c < ch; c++) {
      double s = 0;
      for (int j = 0; j < kw; j++) {
        int src = t - (kw - 1) + j;
        if (src >= 0) s += w[c * kw + j] * x[src * ch + c];
      }
      ref[t * ch + c] = s / (1 + exp(-s));
    }
  check("conv1d+silu whole", max_rel(y1, ref, (int64_t)n * ch), 1e-5);
  check("conv1d+silu in pieces (state)", max_rel(y2, ref, (int64_t)n * ch), 1e-5);
  double sd = 0;
  for (int i = 0; i < ch * (kw - 1); i++) sd = fmax(sd, fabs(s1[i] - s2[i]));
  check("conv1d final state whole = in pieces", sd, 0);
  /* rope: a rotation keeps each pair's norm and rotating by pos then -pos restores x */
  const int D = 16, H = 3;
  float *r = malloc(sizeof(float) * 2 * H * D), *r0 = malloc(sizeof(float) * 2 * H * D), inv[8], ninv[8];
  int32_t pos[2] = {5, 1000};
  fill(r, 2 * H * D, 1);
  memcpy(r0, r, sizeof(float) * 2 * H * D);
  for (int i = 0; i < 8; i++) inv[i] = powf(10000.0f, -2.0f * i / D), ninv[i] = -inv[i];
  for (int il = 0; il < 2; il++) {
    be->rope(be, r, 2, H, D, H * D, D, inv, pos, il);
    double diff = 0;
    for (int i = 0; i < 2 * H * D; i++) diff = fmax(diff, fabs(r[i] - r0[i]));
    check(il ? "rope interleaved moves values" : "rope neox moves values", diff > 1e-3 ? 0 : 1, 0);
    be->rope(be, r, 2, H, D, H * D, D, ninv, pos, il);
    double back[2 * 3 * 16];
    for (int i = 0; i < 2 * H * D; i++) back[i] = r0[i];
    check(il ? "rope interleaved inverse" : "rope neox inverse", max_rel(r, back, 2 * H * D), 1e-5);
  }
  /* rmsnorm variants */
  float xn[2 * 10], wn[10], out[20];
  double rr[20];
  fill(xn, 20, 3), fill(wn, 10, 1);
  for (int mode = 0; mode < 3; mode++) {
    be->rmsnorm(be, out, xn, mode == 2 ? NULL : wn, 2, 10, 1e-6f, mode == 1);
    for (int row = 0; row < 2; row++) {
      double ss = 0;
      for (int i = 0; i < 10; i++) ss += xn[row * 10 + i] * xn[row * 10 + i];
      for (int i = 0; i < 10; i++)
        rr[row * 10 + i] = xn[row * 10 + i] / sqrt(ss / 10 + 1e-6) * (mode == 2 ? 1 : mode == 1 ? 1 + wn[i] : wn[i]);
    }
    check(mode == 0 ? "rmsnorm w" : mode == 1 ? "rmsnorm 1+w" : "rmsnorm no weight", max_rel(out, rr, 20), 1e-6);
  }
  free(x), free(w), free(y1), free(y2), free(s1), free(s2), free(ref), free(r), free(r0);
}

/* The unfused GDN decode sequence as forward.c ran it before gdn_step (and still runs it for
 * long or cut runs): conv, three copies, two l2norms, gates, delta rule, gated norm. */
static void gdn_step_unfused(ops_backend *be, const ops_gdn_step_args *a) {
  const int64_t n = a->n, Kd = (int64_t)a->hk * a->dk, Vd = (int64_t)a->hv * a->dv, cd = 2 * Kd + Vd;
  float *conv = malloc(sizeof(float) * (size_t)(n * cd)), *qkv = malloc(sizeof(float) * (size_t)(n * cd));
  float *gates = malloc(sizeof(float) * (size_t)(2 * n * a->hv)), *o = malloc(sizeof(float) * (size_t)(n * Vd));
  be->conv1d_silu(be, conv, a->qkv, n, (int)cd, a->conv_w, a->kw, a->conv_state);
  float *q = qkv, *k = qkv + n * Kd, *v = qkv + 2 * n * Kd;
  be->copy_rows(be, q, Kd, conv, cd, n, (int)Kd);
  be->copy_rows(be, k, Kd, conv + Kd, cd, n, (int)Kd);
  be->copy_rows(be, v, Vd, conv + 2 * Kd, cd, n, (int)Vd);
  be->l2norm(be, q, n * a->hk, a->dk, 1e-6f, 1.0f / sqrtf((float)a->dk));
  be->l2norm(be, k, n * a->hk, a->dk, 1e-6f, 1.0f);
  float *beta = gates, *g = gates + n * a->hv;
  be->gdn_gates(be, beta, g, a->b, a->hv, a->a, a->hv, a->a_log, a->dt_bias, n, a->hv);
  ops_gdn_args r = {n, a->hk, a->hv, a->dk, a->dv, a->v_tiled, q, k, v, g, beta, a->state, o};
  be->gdn_recurrent(be, &r);
  be->rmsnorm_gated(be, a->y, o, a->z, a->norm_w, n * a->hv, a->dv, a->eps);
  free(conv), free(qkv), free(gates), free(o);
}

static int same_bits(const float *x, const float *y, int64_t n) {
  return memcmp(x, y, sizeof(float) * (size_t)n) == 0;
}

/* Batched gdn_step (n_runs > 0) against one single-run call per run: bit for bit, runs of
 * lengths 1..7 in mixed order (not in row order either), each with its own states. */
static void test_gdn_step_batched(ops_backend *be) {
  printf("gdn_step batched (run table) = per-run calls\n");
  enum { NR = 7 };
  const int lens[NR] = {3, 1, 7, 2, 5, 4, 6}, order[NR] = {2, 0, 5, 1, 6, 3, 4}; /* run i at row block order[i] */
  const int cfgs[][6] = {/* hk, hv, dk, dv, tiled, kw */ {2, 4, 16, 24, 1, 4}, {1, 3, 20, 8, 0, 2}};
  for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
    const int hk = cfgs[c][0], hv = cfgs[c][1], dk = cfgs[c][2], dv = cfgs[c][3], tiled = cfgs[c][4], kw = cfgs[c][5];
    const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd, ssz = (int64_t)hv * dk * dv;
    const int64_t csz = cd * (kw - 1);
    int64_t start[NR], n = 0, nmax = 0;
    for (int b = 0; b < NR; b++) /* row blocks in `order`: run i's rows follow those placed before it */
      for (int i = 0; i < NR; i++)
        if (order[i] == b) start[i] = n, n += lens[i], nmax = lens[i] > nmax ? lens[i] : nmax;
    float *qkv = malloc(sizeof(float) * (size_t)(n * cd)), *z = malloc(sizeof(float) * (size_t)(n * Vd));
    float *ba = malloc(sizeof(float) * (size_t)(2 * n * hv)), *cw = malloc(sizeof(float) * (size_t)(cd * kw));
    float *alog = malloc(sizeof(float) * (size_t)hv), *dtb = malloc(sizeof(float) * (size_t)hv);
    float *nw = malloc(sizeof(float) * (size_t)dv), *y[2], *cs[2], *st[2];
    fill(qkv, n * cd, 2), fill(z, n * Vd, 2), fill(ba, 2 * n * hv, 2), fill(cw, cd * kw, 0.5f);
    fill(alog, hv, 1), fill(dtb, hv, 1), fill(nw, dv, 1);
    for (int i = 0; i < 2; i++) {
      y[i] = malloc(sizeof(float) * (size_t)(n * Vd));
      cs[i] = malloc(sizeof(float) * (size_t)(NR * csz + 1)), st[i] = malloc(sizeof(float) * (size_t)(NR * ssz));
    }
    fill(cs[0], NR * csz, 1), fill(st[0], NR * ssz, 0.2f); /* a different state per run */
    memcpy(cs[1], cs[0], sizeof(float) * (size_t)(NR * csz)), memcpy(st[1], st[0], sizeof(float) * (size_t)(NR * ssz));
    memset(y[0], 0, sizeof(float) * (size_t)(n * Vd)), memset(y[1], 0, sizeof(float) * (size_t)(n * Vd));
    float *work = malloc(sizeof(float) * (size_t)ops_gdn_step_work_floats(nmax, hk, hv, dk, dv));
    ops_gdn_step_run runs[NR];
    for (int i = 0; i < NR; i++)
      runs[i] = (ops_gdn_step_run){.start = start[i], .n = lens[i], .conv_state = cs[0] + i * csz,
                                   .state = st[0] + i * ssz};
    ops_gdn_step_args a = {
        .n = 0, .hk = hk, .hv = hv, .dk = dk, .dv = dv, .kw = kw, .v_tiled = tiled, .eps = 1e-6f, .qkv = qkv,
        .z = z, .b = ba, .a = ba + n * hv, .conv_w = cw, .a_log = alog, .dt_bias = dtb, .norm_w = nw,
        .y = y[0], .work = work, .n_runs = NR, .runs = runs,
    };
    be->gdn_step(be, &a);
    for (int i = 0; i < NR; i++) { /* the reference: one single-run call per run */
      const int64_t t0 = start[i];
      const ops_gdn_step_args r = {
          .n = lens[i], .hk = hk, .hv = hv, .dk = dk, .dv = dv, .kw = kw, .v_tiled = tiled, .eps = 1e-6f,
          .qkv = qkv + t0 * cd, .z = z + t0 * Vd, .b = ba + t0 * hv, .a = ba + n * hv + t0 * hv, .conv_w = cw,
          .a_log = alog, .dt_bias = dtb, .norm_w = nw, .conv_state = cs[1] + i * csz, .state = st[1] + i * ssz,
          .y = y[1] + t0 * Vd, .work = work,
      };
      be->gdn_step(be, &r);
    }
    char what[96];
    snprintf(what, sizeof what, "gdn_step batched %d runs hk=%d hv=%d dk=%d dv=%d kw=%d", NR, hk, hv, dk, dv, kw);
    check(what, same_bits(y[0], y[1], n * Vd) && same_bits(st[0], st[1], NR * ssz) &&
                        same_bits(cs[0], cs[1], NR * csz) ? 0 : 1, 0);
    double yabs = 0, dst = 0;
    for (int64_t i = 0; i < n * Vd; i++) yabs = fmax(yabs, fabs(y[0][i]));
    for (int64_t i = 0; i < ssz; i++) dst = fmax(dst, fabs(st[0][(NR - 1) * ssz + i] - st[0][i]));
    check("gdn_step batched: output nonzero, states distinct", yabs > 1e-3 && isfinite(yabs) && dst > 0 ? 0 : 1, 0);
    for (int i = 0; i < 2; i++) free(y[i]), free(cs[i]), free(st[i]);
    free(qkv), free(z), free(ba), free(cw), free(alog), free(dtb), free(nw), free(work);
  }
}

/* Fused ops against the unfused sequences they replace: bit for bit (the CPU's fused ops are
 * those sequences, which is what keeps the fixtures' CPU logits unchanged). */
static void test_fused(ops_backend *be) {
  printf("fused ops (gdn_step, add_rmsnorm)\n");
  const int cfgs[][7] = {/* n, hk, hv, dk, dv, tiled, kw */ {1, 2, 2, 16, 16, 0, 4}, {3, 2, 4, 32, 24, 1, 4},
                         {7, 1, 3, 20, 8, 0, 2},   {5, 2, 4, 16, 40, 0, 4},  {11, 4, 8, 32, 32, 1, 3}};
  for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
    const int64_t n = cfgs[c][0];
    const int hk = cfgs[c][1], hv = cfgs[c][2], dk = cfgs[c][3], dv = cfgs[c][4], tiled = cfgs[c][5], kw = cfgs[c][6];
    const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd, ssz = (int64_t)hv * dk * dv;
    float *qkv = malloc(sizeof(float) * (size_t)(n * cd)), *z = malloc(sizeof(float) * (size_t)(n * Vd));
    float *ba = malloc(sizeof(float) * (size_t)(2 * n * hv)), *cw = malloc(sizeof(float) * (size_t)(cd * kw));
    float *alog = malloc(sizeof(float) * (size_t)hv), *dtb = malloc(sizeof(float) * (size_t)hv);
    float *nw = malloc(sizeof(float) * (size_t)dv);
    float *cs[2], *st[2], *y[2];
    fill(qkv, n * cd, 2), fill(z, n * Vd, 2), fill(ba, 2 * n * hv, 2), fill(cw, cd * kw, 0.5f);
    fill(alog, hv, 1), fill(dtb, hv, 1), fill(nw, dv, 1);
    for (int i = 0; i < 2; i++) {
      cs[i] = malloc(sizeof(float) * (size_t)(cd * (kw - 1) + 1)), st[i] = malloc(sizeof(float) * (size_t)ssz);
      y[i] = malloc(sizeof(float) * (size_t)(n * Vd));
    }
    fill(cs[0], cd * (kw - 1), 1), fill(st[0], ssz, 0.2f);
    memcpy(cs[1], cs[0], sizeof(float) * (size_t)(cd * (kw - 1))), memcpy(st[1], st[0], sizeof(float) * (size_t)ssz);
    float *work = malloc(sizeof(float) * (size_t)ops_gdn_step_work_floats(n, hk, hv, dk, dv));
    ops_gdn_step_args a = {
        .n = n, .hk = hk, .hv = hv, .dk = dk, .dv = dv, .kw = kw, .v_tiled = tiled, .eps = 1e-6f, .qkv = qkv,
        .z = z, .b = ba, .a = ba + n * hv, .conv_w = cw, .a_log = alog, .dt_bias = dtb, .norm_w = nw,
        .conv_state = cs[0], .state = st[0], .y = y[0], .work = work,
    };
    be->gdn_step(be, &a);
    a.conv_state = cs[1], a.state = st[1], a.y = y[1];
    gdn_step_unfused(be, &a);
    char what[96];
    snprintf(what, sizeof what, "gdn_step = unfused n=%lld hk=%d hv=%d dk=%d dv=%d", (long long)n, hk, hv, dk, dv);
    check(what, same_bits(y[0], y[1], n * Vd) && same_bits(st[0], st[1], ssz) &&
                        same_bits(cs[0], cs[1], cd * (kw - 1)) ? 0 : 1, 0);
    /* equal outputs that are all zero would prove nothing (the pieces are checked against
     * plain references in test_gdn and test_conv_rope_norm) */
    double yabs = 0;
    for (int64_t i = 0; i < n * Vd; i++) yabs = fmax(yabs, fabs(y[0][i]));
    check("gdn_step output is finite and nonzero", yabs > 1e-3 && isfinite(yabs) ? 0 : 1, 0);
    for (int i = 0; i < 2; i++) free(cs[i]), free(st[i]), free(y[i]);
    free(qkv), free(z), free(ba), free(cw), free(alog), free(dtb), free(nw), free(work);
  }
  const int ds[] = {1, 10, 37, 1024};
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
    const int d = ds[i], rows = 3;
    float *x0 = malloc(sizeof(float) * (size_t)(rows * d)), *r = malloc(sizeof(float) * (size_t)(rows * d));
    float *w = malloc(sizeof(float) * (size_t)d), *x1 = malloc(sizeof(float) * (size_t)(rows * d));
    float *x2 = malloc(sizeof(float) * (size_t)(rows * d)), *y1 = malloc(sizeof(float) * (size_t)(rows * d));
    float *y2 = malloc(sizeof(float) * (size_t)(rows * d));
    fill(x0, rows * d, 3), fill(r, rows * d, 3), fill(w, d, 1);
    for (int mode = 0; mode < 3; mode++) {
      memcpy(x1, x0, sizeof(float) * (size_t)(rows * d)), memcpy(x2, x0, sizeof(float) * (size_t)(rows * d));
      be->add_rmsnorm(be, x1, r, y1, mode ? w : NULL, rows, d, 1e-6f, mode == 2);
      be->add(be, x2, r, (int64_t)rows * d);
      be->rmsnorm(be, y2, x2, mode ? w : NULL, rows, d, 1e-6f, mode == 2);
      char what[64];
      snprintf(what, sizeof what, "add_rmsnorm = add, rmsnorm d=%d mode=%d", d, mode);
      check(what, same_bits(x1, x2, rows * d) && same_bits(y1, y2, rows * d) ? 0 : 1, 0);
    }
    free(x0), free(r), free(w), free(x1), free(x2), free(y1), free(y2);
  }
  /* norm_rope: from a strided [head][q | gate] layout (Qwen3.5's q projection) and in place */
  const int nr[][5] = {/* n, heads, D, rot, interleaved */ {1, 2, 16, 16, 0}, {3, 4, 32, 16, 1}, {5, 3, 24, 24, 0}};
  for (size_t i = 0; i < sizeof nr / sizeof nr[0]; i++) {
    const int n = nr[i][0], H = nr[i][1], D = nr[i][2], rot = nr[i][3], il = nr[i][4];
    float *src = malloc(sizeof(float) * (size_t)(n * H * 2 * D)), *w = malloc(sizeof(float) * (size_t)D);
    float *y1 = malloc(sizeof(float) * (size_t)(n * H * D)), *y2 = malloc(sizeof(float) * (size_t)(n * H * D));
    float inv[64];
    int32_t pos[5];
    fill(src, n * H * 2 * D, 2), fill(w, D, 1);
    for (int j = 0; j < rot / 2; j++) inv[j] = powf(10000.0f, -2.0f * j / rot);
    for (int t = 0; t < n; t++) pos[t] = 7 + 300 * t;
    for (int inplace = 0; inplace < 2; inplace++) {
      const int64_t xs = inplace ? (int64_t)H * D : (int64_t)H * 2 * D, xhs = inplace ? D : 2 * D;
      if (inplace) memcpy(y1, src, sizeof(float) * (size_t)(n * H * D));
      be->norm_rope(be, y1, inplace ? y1 : src, n, H, D, xs, xhs, w, 1e-6f, il, rot, inv, pos, il);
      be->copy_rows(be, y2, D, src, xhs, (int64_t)n * H, D);
      be->rmsnorm(be, y2, y2, w, (int64_t)n * H, D, 1e-6f, il);
      be->rope(be, y2, n, H, D, (int64_t)H * D, rot, inv, pos, il);
      char what[80];
      snprintf(what, sizeof what, "norm_rope = copy, rmsnorm, rope n=%d H=%d D=%d%s", n, H, D, inplace ? " in place" : "");
      check(what, same_bits(y1, y2, (int64_t)n * H * D) ? 0 : 1, 0);
    }
    free(src), free(w), free(y1), free(y2);
  }
}

static void test_moe_route(ops_backend *be) {
  printf("moe routing\n");
  float logits[2 * 6] = {0.1f, 2.0f, -1.0f, 1.5f, 0.3f, 0.0f, 3.0f, 1.0f, 2.9f, -2.0f, 0.0f, 1.0f};
  int32_t idx[4];
  float w[4];
  be->moe_route(be, idx, w, logits, 2, 6, 2, 1, NULL);
  check("top-2 picks token 0", !(idx[0] == 1 && idx[1] == 3), 0);
  check("top-2 picks token 1", !(idx[2] == 0 && idx[3] == 2), 0);
  check("renormalised weights sum to 1", fabs(w[0] + w[1] - 1) + fabs(w[2] + w[3] - 1), 1e-6);
  check("weights ordered", w[0] >= w[1] ? 0 : 1, 0);
}

static void test_sampler(void) {
  printf("sampler\n");
  const int V = 50;
  float base[50], l[50];
  for (int i = 0; i < V; i++) base[i] = frand() * 3;
  int best = 0;
  for (int i = 1; i < V; i++)
    if (base[i] > base[best]) best = i;
  anna_sampler *s = NULL;
  anna_sampler_params p = anna_sampler_params_default();
  anna_sampler_create(&s, V, &p, NULL, 0);
  memcpy(l, base, sizeof l);
  check("greedy = argmax", anna_sampler_sample(s, l) != best, 0);
  anna_sampler_free(s);
  {
    /* a vocabulary past the argmax's 16-wide blocks, with a tie (the first index wins, as a
     * plain scan) in the block tail and -inf entries */
    enum { W = 1003 };
    float *big = malloc(sizeof(float) * W);
    for (int i = 0; i < W; i++) big[i] = i % 7 == 0 ? -INFINITY : frand() * 3;
    for (int at = 0; at < W; at += 97) {
      float *c = malloc(sizeof(float) * W);
      memcpy(c, big, sizeof(float) * W);
      c[at] = 9.0f;
      if (at + 500 < W) c[at + 500] = 9.0f;
      anna_sampler *g = NULL;
      anna_sampler_create(&g, W, &p, NULL, 0);
      check("greedy argmax, first of tied maxima", anna_sampler_sample(g, c) != at, 0);
      anna_sampler_free(g);
      free(c);
    }
    free(big);
  }
  p.temperature = 1.0f, p.top_k = 1, p.seed = 7;
  anna_sampler_create(&s, V, &p, NULL, 0);
  memcpy(l, base, sizeof l);
  check("top-k 1 = argmax", anna_sampler_sample(s, l) != best, 0);
  anna_sampler_free(s);
  /* same seed, same stream; draws stay inside top-k */
  p.top_k = 5, p.top_p = 0.9f;
  anna_sampler *a = NULL, *b = NULL;
  anna_sampler_create(&a, V, &p, NULL, 0), anna_sampler_create(&b, V, &p, NULL, 0);
  int same = 1, inside = 1;
  float sorted[50];
  memcpy(sorted, base, sizeof sorted);
  for (int i = 0; i < V; i++)
    for (int j = i + 1; j < V; j++)
      if (sorted[j] > sorted[i]) {
        float t = sorted[i];
        sorted[i] = sorted[j], sorted[j] = t;
      }
  for (int it = 0; it < 200; it++) {
    memcpy(l, base, sizeof l);
    int x = anna_sampler_sample(a, l);
    memcpy(l, base, sizeof l);
    int y = anna_sampler_sample(b, l);
    same &= x == y;
    inside &= base[x] >= sorted[4];
  }
  check("seeded draws reproduce", !same, 0);
  check("draws stay in top-k", !inside, 0);
  anna_sampler_free(a), anna_sampler_free(b);
  /* repetition penalty pushes the seen argmax down */
  p = anna_sampler_params_default();
  p.repetition_penalty = 100.0f;
  anna_sampler_create(&s, V, &p, NULL, 0);
  anna_sampler_accept(s, best);
  memcpy(l, base, sizeof l);
  check("repetition penalty avoids the seen token", anna_sampler_sample(s, l) == best, 0);
  anna_sampler_free(s);
  anna_sampler_params bad = anna_sampler_params_default();
  bad.temperature = -1;
  char err[128];
  check("bad parameters rejected", anna_sampler_create(&s, V, &bad, err, sizeof err) < 0 ? 0 : 1,
        0);
  {
    /* Draw frequencies against the softmax over a vocabulary larger than the sorted head
     * (256), flat enough that most draws land past it: t = 0.7; min-p 0.3 (a floor inside the
     * tail); top-k 300 (the heap path, all sorted); top-p 0.5 (a nucleus past the head:
     * the full-sort fallback). Ten groups of 100 ids each, compared as a z-score of the group
     * count; masked (-inf) ids must never come out. */
    enum { W = 1000, DRAWS = 40000, GROUPS = 10 };
    float *lg = malloc(sizeof(float) * W), *c = malloc(sizeof(float) * W);
    for (int i = 0; i < W; i++) lg[i] = i % 10 == 3 ? -INFINITY : frand() * 2.0f - (float)(i / 100) * 0.1f;
    const float minps[] = {0.0f, 0.3f, 0.0f, 0.0f};
    const int topks[] = {0, 0, 300, 0};
    const float topps[] = {1.0f, 1.0f, 1.0f, 0.5f};
    for (int v = 0; v < 4; v++) {
      anna_sampler_params q = anna_sampler_params_default();
      q.temperature = 0.7f, q.min_p = minps[v], q.top_k = topks[v], q.top_p = topps[v], q.seed = 11 + v;
      /* reference probabilities with the same rules over a full sort */
      double pr[W], z = 0, mxl = -INFINITY;
      int ord[W];
      for (int i = 0; i < W; i++) mxl = fmax(mxl, lg[i]), ord[i] = i;
      for (int i = 0; i < W; i++)
        for (int j = i + 1; j < W; j++)
          if (lg[ord[j]] > lg[ord[i]]) {
            int t = ord[i];
            ord[i] = ord[j], ord[j] = t;
          }
      const int nk = q.top_k > 0 ? q.top_k : W;
      for (int i = 0; i < W; i++) pr[i] = 0;
      for (int r = 0; r < nk; r++) z += exp((lg[ord[r]] - mxl) / q.temperature);
      double cum = 0, kept = 0;
      for (int r = 0; r < nk; r++) {
        const double pp = exp((lg[ord[r]] - mxl) / q.temperature) / z;
        if (pp < q.min_p * (1.0 / z)) break; /* the top token's probability is 1 / z */
        pr[ord[r]] = pp, kept += pp, cum += pp;
        if (cum >= q.top_p) break;
      }
      double grp[GROUPS] = {0};
      for (int i = 0; i < W; i++) grp[i / 100] += pr[i] / kept;
      int cnt[GROUPS] = {0}, masked = 0, dropped = 0;
      anna_sampler *g = NULL;
      anna_sampler_create(&g, W, &q, NULL, 0);
      for (int d = 0; d < DRAWS; d++) {
        memcpy(c, lg, sizeof(float) * W);
        const int t = anna_sampler_sample(g, c);
        cnt[t / 100]++;
        masked += t % 10 == 3;
        dropped += pr[t] == 0;
      }
      anna_sampler_free(g);
      double worst = 0;
      for (int k = 0; k < GROUPS; k++) {
        const double e = grp[k] * DRAWS, sd = sqrt(fmax(e * (1 - grp[k]), 1.0));
        worst = fmax(worst, fabs(cnt[k] - e) / sd);
      }
      char what[96];
      snprintf(what, sizeof what, "sampler distribution (min_p %.1f, top_k %d, top_p %.1f): max |z|", q.min_p, q.top_k,
               q.top_p);
      check(what, worst, 5.0);
      check("sampler never draws a masked or cut token", masked + dropped, 0);
    }
    free(lg), free(c);
  }
}

/* The CPU backend's AVX-512 dequantization must equal formats/quant.h's reference, bit
 * for bit, on random blocks (random scales, all nibble/high-bit patterns). */
static void test_dequant_fast(void) {
  printf("dequantize fast paths\n");
  const int types[] = {ANNA_DTYPE_Q8_0, ANNA_DTYPE_Q4_0, ANNA_DTYPE_Q5_0};
  const int64_t n = 32 * 37;
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    const int type = types[ti];
    const int64_t rbs = dtype_row_bytes(type, n);
    if (rbs <= 0) continue;
    const size_t rb = (size_t)rbs;
    unsigned char *row = malloc(rb);
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    for (size_t i = 0; i < rb; i++) row[i] = (unsigned char)(frand() * 128 + 128);
    for (int64_t blk = 0; blk < n / 32; blk++) { /* sane f16 scales: 2^-8 .. 2^4 with random mantissa */
      uint16_t h = (uint16_t)(((7 + (int)(fabsf(frand()) * 12)) << 10) | ((int)(fabsf(frand()) * 1023)));
      memcpy(row + blk * (rb / (size_t)(n / 32)), &h, 2);
    }
    quant_dequantize_row(type, row, a, n);
    ops_weight w = {type, row, 1, n};
    cpu_weight_row_f32(&w, 0, b);
    double d = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    char what[64];
    snprintf(what, sizeof what, "%s fast dequantize == reference", dtype_name(type));
    check(what, d, 0);
    free(row), free(a), free(b);
  }
}


/* ---- sampling candidates: the topk op and the sampler's candidate path ---- */

typedef struct tk_pair {
  float v;
  int32_t i;
} tk_pair;

static int tk_pair_cmp(const void *a, const void *b) {
  const tk_pair *x = a, *y = b;
  if (x->v != y->v) return x->v < y->v ? 1 : -1;
  return x->i < y->i ? -1 : x->i > y->i;
}

/* A logits row with the awkward cases: values on a coarse grid (many ties), -inf, NaN, -0,
 * huge magnitudes, and a plain spread. */
static void tk_fill(float *l, int64_t V, int kind) {
  for (int64_t t = 0; t < V; t++) {
    const uint64_t r = rnd() % 100;
    float x = kind == 0 ? frand() * 8.0f : (float)(int)(frand() * 6.0f); /* kind 1: ties everywhere */
    if (kind == 2 && r < 3) x = -INFINITY;
    if (kind == 2 && r == 3) x = NAN;
    if (kind == 2 && r == 4) x = -0.0f;
    if (kind == 2 && r == 5) x = (rnd() & 1) ? 3e38f : -3e38f;
    l[t] = x;
  }
}

/* The op against a full sort of (value with NaN as -inf and -0 as +0, index) pairs and the
 * softmax sum written out as the sampler sums it: exact (the same float operations). */
static void test_topk(ops_backend *be) {
  printf("topk (sampling candidates)\n");
  static const int64_t vocabs[] = {1, 7, 255, 256, 1000, 4097, 151936};
  static const int ks[] = {1, 7, 64, 256};
  const int64_t rows = 3;
  for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++) {
    const int64_t V = vocabs[vi];
    float *l = malloc(sizeof(float) * (size_t)(rows * V));
    tk_pair *ref = malloc(sizeof(tk_pair) * (size_t)V);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)rows * OPS_TOPK_MAX);
    float *val = malloc(sizeof(float) * (size_t)rows * OPS_TOPK_MAX);
    double st[2 * 3];
    for (int kind = 0; kind < 3; kind++) {
      for (int64_t r = 0; r < rows; r++) tk_fill(l + r * V, V, kind);
      for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
        const int k = ks[ki];
        if (k > V) continue;
        const float temp = ki == 2 ? 0.7f : ki == 1 ? 0.0f : 1.0f; /* 0: no softmax sum (0) */
        be->topk(be, idx, val, st, l, rows, V, k, temp);
        double bad = 0, zerr = 0;
        for (int64_t r = 0; r < rows; r++) {
          const float *lr = l + r * V;
          for (int64_t t = 0; t < V; t++) {
            float x = isnan(lr[t]) ? -INFINITY : lr[t];
            ref[t] = (tk_pair){x == 0.0f ? 0.0f : x, (int32_t)t};
          }
          qsort(ref, (size_t)V, sizeof *ref, tk_pair_cmp);
          for (int j = 0; j < k; j++)
            bad += idx[r * k + j] != ref[j].i || memcmp(&val[r * k + j], &ref[j].v, sizeof(float)) != 0;
          const float inv_t = temp > 0 ? 1.0f / temp : 0.0f, mt = ref[0].v * inv_t;
          double z = 0;
          for (int64_t t = 0; t < V && temp > 0; t++) z += ops_exp_nonpos(lr[t] * inv_t - mt);
          bad += st[2 * r] != ref[0].v;
          zerr = fmax(zerr, fabs(st[2 * r + 1] - z));
        }
        char what[96];
        snprintf(what, sizeof what, "topk V %lld k %d kind %d: ids, values, max", (long long)V, k, kind);
        check(what, bad, 0);
        snprintf(what, sizeof what, "topk V %lld k %d kind %d: softmax sum", (long long)V, k, kind);
        check(what, zerr, 0);
      }
    }
    free(l);
    free(ref);
    free(idx);
    free(val);
  }
  float bad_row[5] = {NAN, -INFINITY, NAN, -INFINITY, -INFINITY};
  int32_t bi[3];
  float bv[3];
  double bs[2];
  be->topk(be, bi, bv, bs, bad_row, 1, 5, 1, 1.0f);
  check("topk k 1, no finite logit: the first entry", bi[0] != 0 || bv[0] != -INFINITY, 0);
  be->topk(be, bi, bv, bs, bad_row, 1, 5, 3, 1.0f);
  check("topk k 3, no finite logit: the first entries", bi[0] != 0 || bi[1] != 1 || bi[2] != 2, 0);
}

/* The candidate path against the full-row sampler: two samplers with one seed, one fed the
 * whole row, the other the op's candidates (the full row only where it reports that they do
 * not decide the draw): the same tokens, every step, for every parameter set. */
static void test_sampler_candidates(ops_backend *be) {
  printf("sampler from candidates\n");
  typedef struct {
    float temp, top_p, min_p, rep;
    int top_k;
  } ps;
  static const ps sets[] = {
      {0.0f, 1.0f, 0.0f, 1.0f, 0},    {0.7f, 1.0f, 0.0f, 1.0f, 40},    {1.0f, 0.9f, 0.0f, 1.0f, 0},
      {0.8f, 1.0f, 0.1f, 1.0f, 0},    {1.3f, 0.5f, 0.0f, 1.0f, 5},     {1.0f, 0.999f, 0.0f, 1.0f, 0},
      {1.0f, 0.95f, 0.02f, 1.0f, 0},  {2.0f, 1.0f, 0.0f, 1.0f, 256},   {1.0f, 1.0f, 0.0f, 1.0f, 0},
      {0.7f, 1.0f, 0.0f, 1.1f, 40},   {1.0f, 1.0f, 0.0f, 1.0f, 300},   {0.0f, 1.0f, 0.0f, 1.2f, 0},
  };
  static const int32_t vocabs[] = {200, 5000, 151936};
  int32_t idx[OPS_TOPK_MAX];
  float val[OPS_TOPK_MAX];
  double st[2];
  for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++) {
    const int32_t V = vocabs[vi];
    float *row = malloc(sizeof(float) * (size_t)V), *a = malloc(sizeof(float) * (size_t)V),
          *b = malloc(sizeof(float) * (size_t)V);
    for (size_t si = 0; si < sizeof sets / sizeof *sets; si++) {
      const ps *q = &sets[si];
      const int steps = V > 10000 ? 12 : 60;
      int diff = 0, kbad = 0, fallbacks = 0, k_used = 0;
      for (uint64_t seed = 1; seed <= 6; seed++) {
        anna_sampler_params p = anna_sampler_params_default();
        p.temperature = q->temp, p.top_p = q->top_p, p.min_p = q->min_p, p.top_k = q->top_k;
        p.repetition_penalty = q->rep, p.seed = seed;
        anna_sampler *full = NULL, *cand = NULL;
        anna_sampler_create(&full, V, &p, NULL, 0);
        anna_sampler_create(&cand, V, &p, NULL, 0);
        float temp = 0.0f;
        const int k = anna_sampler_candidates_k(cand, &temp);
        k_used = k > 0;
        /* the contract: penalties 0; greedy 1; top-k (<= 256) its k; a small vocabulary all of it;
         * top-p / min-p the head of 256; pure temperature 0 */
        int want = q->rep != 1.0f          ? 0
                   : q->temp <= 0          ? 1
                   : q->top_k > 0 && q->top_k < V ? (q->top_k <= 256 ? q->top_k : 0)
                   : V <= 256              ? V
                   : q->top_p >= 1.0f && q->min_p <= 0 ? 0
                                           : 256;
        kbad += k != want || (temp > 0) != (want == 256 && !(q->top_k > 0 && q->top_k < V));
        for (int step = 0; step < steps; step++) {
          /* Rows as a model's: a few dominant logits (30 or 150 tokens well above the rest; the
           * nucleus fits the head) or a flat row (it does not: the full-row fallback). */
          for (int32_t t = 0; t < V; t++) row[t] = frand() * 3.0f;
          const int lift = step % 3 == 0 ? 30 : step % 3 == 1 ? 150 : 0;
          for (int j = 0; j < lift; j++) row[rnd() % (uint64_t)V] += 14.0f + 4.0f * frand();
          if (step % 5 == 4) row[rnd() % (uint64_t)V] = row[rnd() % (uint64_t)V]; /* a tie */
          memcpy(a, row, sizeof(float) * (size_t)V);
          memcpy(b, row, sizeof(float) * (size_t)V);
          const int32_t ta = anna_sampler_sample(full, a);
          int32_t tb = -1;
          if (k > 0) {
            be->topk(be, idx, val, st, row, 1, V, k, temp);
            if (anna_sampler_sample_candidates(cand, idx, val, k, st, &tb)) fallbacks++, tb = -1;
          } else {
            check("k = 0: sample_candidates declines",
                  anna_sampler_sample_candidates(cand, idx, val, 1, st, &tb) != 1, 0);
            tb = -1;
          }
          if (tb < 0) tb = anna_sampler_sample(cand, b);
          diff += ta != tb;
          anna_sampler_accept(full, ta);
          anna_sampler_accept(cand, tb);
        }
        anna_sampler_free(full);
        anna_sampler_free(cand);
      }
      char what[128];
      snprintf(what, sizeof what, "V %d T %.1f k %d p %.3f minp %.2f rep %.1f: candidates_k", V, q->temp, q->top_k,
               q->top_p, q->min_p, q->rep);
      check(what, kbad, 0);
      snprintf(what, sizeof what, "V %d T %.1f k %d p %.3f minp %.2f rep %.1f: same tokens (%d fallbacks)", V, q->temp,
               q->top_k, q->top_p, q->min_p, q->rep, fallbacks);
      check(what, diff, 0);
      if (k_used) printf("  V %6d set %2zu: %d of %d draws fell back to the full row\n", V, si, fallbacks, 6 * steps);
    }
    free(row);
    free(a);
    free(b);
  }
}

/* anna_context_sample_tail's resolution of draws, against the backend's op on a host row (the
 * CPU backend's memory is host memory): the head walk shared with the context, the op for the
 * tail's mass (min-p) and the tail walk. */
static ops_tail_out tail_op(ops_backend *be, const float *row, int64_t V, const anna_sample_tail *t, double sum,
                            double u) {
  ops_tail_req q = {.row = 0, .z = t->z, .sum = sum, .u = u, .inv_t = t->inv_t, .mx = t->mx, .floor = t->floor_p,
                    .nh = t->nh};
  memcpy(q.head, t->head, sizeof(int32_t) * (size_t)t->nh);
  ops_tail_out o;
  be->sample_tail(be, &o, row, V, &q, 1);
  return o;
}

static int32_t tail_resolve(ops_backend *be, const float *row, int64_t V, const anna_sample_tail *t) {
  double u = t->u;
  if (t->floor_p > 0.0f) {
    u = t->r * tail_op(be, row, V, t, t->sum, 0.0).sum;
    const int32_t h = sample_tail_head_walk(t, &u);
    if (h >= 0) return t->head[h];
  }
  const ops_tail_out o = tail_op(be, row, V, t, 0.0, u);
  return o.tok >= 0 ? o.tok : t->fallback;
}

/* Rows: 0 heavy (a few dominant logits), 1 medium (150 lifted), 2 flat (nothing lifted: the
 * draw mostly lands past the head), 3 flat with a few -inf / NaN. */
static void tail_row(float *row, int32_t V, int kind) {
  for (int32_t t = 0; t < V; t++) row[t] = frand() * 3.0f;
  const int lift = kind == 0 ? 8 : kind == 1 ? 150 : 0;
  for (int j = 0; j < lift; j++) row[rnd() % (uint64_t)V] += 10.0f + 4.0f * frand();
  if (kind == 3)
    for (int j = 0; j < 20; j++) row[rnd() % (uint64_t)V] = j & 1 ? NAN : -INFINITY;
}

/* Issue 29: candidates + the tail op == anna_sampler_sample token for token (one seed, two
 * samplers), for pure temperature, min-p, top-p and both, over heavy and flat rows; and masked
 * rows (mask_rows + topk, then the same draw) == the host masking the full row. */
static void test_sampler_tail(ops_backend *be) {
  printf("sampler tail (issue 29) and masked candidates\n");
  typedef struct {
    float top_p, min_p;
  } ps;
  static const ps sets[] = {{1.0f, 0.0f}, {1.0f, 0.02f}, {1.0f, 0.002f}, {0.9f, 0.0f}, {0.95f, 0.05f}};
  static const float temps[] = {0.6f, 1.0f, 1.7f};
  static const int32_t vocabs[] = {1000, 248320};
  int32_t idx[OPS_TOPK_MAX];
  float val[OPS_TOPK_MAX];
  double st[2];
  anna_sample_tail tl;
  for (size_t vi = 0; vi < 2; vi++) {
    const int32_t V = vocabs[vi];
    const int64_t words = (V + 63) / 64;
    float *row = malloc(sizeof(float) * (size_t)V), *a = malloc(sizeof(float) * (size_t)V),
          *b = malloc(sizeof(float) * (size_t)V);
    uint64_t *bits = malloc(sizeof(uint64_t) * (size_t)words);
    for (int masked = 0; masked < 3; masked++) /* 0 none, 1 end-of-generation ids, 2 a JSON-like mask */
      for (size_t si = 0; si < sizeof sets / sizeof *sets; si++)
        for (size_t ti = 0; ti < sizeof temps / sizeof *temps; ti++) {
          const int steps = V > 10000 ? 4 : 24;
          int diff = 0, tails = 0, fulls = 0, draws = 0, declined = 0;
          for (uint64_t seed = 1; seed <= 3; seed++) {
            anna_sampler_params p = anna_sampler_params_default();
            p.temperature = temps[ti], p.top_p = sets[si].top_p, p.min_p = sets[si].min_p, p.seed = seed;
            anna_sampler *full = NULL, *cand = NULL;
            anna_sampler_create(&full, V, &p, NULL, 0);
            anna_sampler_create(&cand, V, &p, NULL, 0);
            float temp = 0.0f;
            const int k = anna_sampler_candidates_tail_k(cand, &temp);
            declined += k <= 0;
            for (int step = 0; step < steps && k > 0; step++) {
              tail_row(row, V, step % 4);
              memset(bits, 0, sizeof(uint64_t) * (size_t)words);
              if (masked == 1) { /* three ids, one of them the row's best (it must not come out) */
                float bst;
                const int32_t top = (int32_t)ops_argmax_f32(row, V, &bst);
                const int32_t ids[3] = {top, (int32_t)(rnd() % (uint64_t)V), V - 1};
                for (int j = 0; j < 3; j++) bits[ids[j] / 64] |= 1ull << (ids[j] % 64);
              } else if (masked == 2) { /* most tokens rejected, a few hundred allowed */
                for (int64_t w = 0; w < words; w++) bits[w] = ~0ull;
                for (int j = 0; j < 400; j++) {
                  const int32_t t = (int32_t)(rnd() % (uint64_t)V);
                  bits[t / 64] &= ~(1ull << (t % 64));
                }
              }
              memcpy(a, row, sizeof(float) * (size_t)V);
              memcpy(b, row, sizeof(float) * (size_t)V);
              if (masked) { /* the host path: -inf on the full row */
                for (int32_t t = 0; t < V; t++)
                  if (bits[t / 64] >> (t % 64) & 1) a[t] = -INFINITY;
                const int32_t r0 = 0;
                be->mask_rows(be, b, V, &r0, bits, 1);
              }
              const int32_t ta = anna_sampler_sample(full, a);
              be->topk(be, idx, val, st, b, 1, V, k, temp);
              int32_t tb = -1;
              const int rc = anna_sampler_sample_candidates_tail(cand, idx, val, k, st, &tl, &tb);
              if (rc == 2) {
                tb = tail_resolve(be, b, V, &tl);
                tails++;
              } else if (rc == 1) {
                tb = anna_sampler_sample(cand, b);
                fulls++;
              }
              diff += ta != tb;
              draws++;
              anna_sampler_accept(full, ta);
              anna_sampler_accept(cand, tb);
            }
            anna_sampler_free(full);
            anna_sampler_free(cand);
          }
          char what[160];
          snprintf(what, sizeof what, "V %d T %.1f p %.2f minp %.3f mask %d: candidates_tail_k offered", V, temps[ti],
                   sets[si].top_p, sets[si].min_p, masked);
          check(what, declined, 0);
          snprintf(what, sizeof what, "V %d T %.1f p %.2f minp %.3f mask %d: same tokens (%d tail, %d full of %d)", V,
                   temps[ti], sets[si].top_p, sets[si].min_p, masked, tails, fulls, draws);
          check(what, diff, 0);
          /* only a top-p nucleus past the head may still need the full row */
          if (sets[si].top_p >= 1.0f) {
            snprintf(what, sizeof what, "V %d T %.1f minp %.3f mask %d: no full row", V, temps[ti], sets[si].min_p,
                     masked);
            check(what, fulls, 0);
          }
          if (masked == 0 && ti == 1) printf("  V %6d p %.2f minp %.3f T 1: %d of %d draws took the tail op, %d the full row\n", V,
                                  sets[si].top_p, sets[si].min_p, tails, draws, fulls);
        }
    free(row), free(a), free(b), free(bits);
  }
  /* the op's edges: nothing kept past the head (-1), u past the kept mass, the sum mode; and
   * several draws in one call (rows 0 and 1 of a two-row block) */
  {
    float l[8] = {1.0f, -INFINITY, NAN, -INFINITY, 1.0f, -INFINITY, 1.0f, 1.0f};
    ops_tail_req q[2] = {{.row = 0, .z = 1.0, .sum = 0.5, .u = 0.25, .inv_t = 1.0f, .mx = 1.0f, .nh = 1},
                         {.row = 1, .z = 4.0, .sum = 0.5, .u = 0.0, .inv_t = 1.0f, .mx = 1.0f, .nh = 1}};
    q[0].head[0] = 0, q[1].head[0] = 3;
    ops_tail_out o[2];
    be->sample_tail(be, o, l, 4, q, 2);
    check("sample_tail: nothing kept -> tok -1", o[0].tok != -1, 0);
    check("sample_tail: the sum mode, the second draw's row", o[1].tok != -1 || o[1].sum != 1.0, 0);
    l[3] = 1.0f;
    q[0].z = 2.0, q[0].u = 0.75;
    be->sample_tail(be, o, l, 4, q, 1);
    check("sample_tail: u past the kept mass -> the last kept token", o[0].tok != 3, 0);
  }
}

/* ---- encoder ops (vision towers): layer_norm, gelu, attention_seg, embed_bag, and the
 * axial 2-D rope the Qwen3.5 tower builds from two rope calls ---- */

static void test_encoder_ops(ops_backend *be) {
  printf("encoder ops\n");
  /* layer_norm: rows with a large offset (the centred variance must survive), bias and none,
   * out of place and in place */
  const int dims[2] = {67, 1152};
  for (int di = 0; di < 2; di++) {
    const int d = dims[di], rows = 9;
    float *x = malloc(sizeof(float) * rows * d), *y = malloc(sizeof(float) * rows * d), *w = malloc(sizeof(float) * d),
          *b = malloc(sizeof(float) * d);
    double *ref = malloc(sizeof(double) * rows * d);
    fill(x, (int64_t)rows * d, 2), fill(w, d, 1), fill(b, d, 1);
    for (int i = 0; i < rows * d; i++) x[i] += 40.0f;
    for (int bias = 0; bias < 2; bias++) {
      for (int r = 0; r < rows; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < d; i++) m += x[r * d + i];
        m /= d;
        for (int i = 0; i < d; i++) v += (x[r * d + i] - m) * (x[r * d + i] - m);
        v /= d;
        for (int i = 0; i < d; i++) ref[r * d + i] = (x[r * d + i] - m) / sqrt(v + 1e-6) * w[i] + (bias ? b[i] : 0);
      }
      be->layer_norm(be, y, x, w, bias ? b : NULL, rows, d, 1e-6f);
      char what[80];
      snprintf(what, sizeof what, "layer_norm d=%d %s (offset 40)", d, bias ? "with bias" : "no bias");
      check(what, max_rel(y, ref, (int64_t)rows * d), 2e-6);
    }
    be->layer_norm(be, x, x, w, b, rows, d, 1e-6f);
    check("layer_norm in place", max_rel(x, ref, (int64_t)rows * d), 2e-6);
    free(x), free(y), free(w), free(b), free(ref);
  }
  /* gelu, both forms, over [-8, 8] (and a size that takes the threaded path) */
  const int64_t ng = 40001;
  float *g = malloc(sizeof(float) * ng);
  double *gr = malloc(sizeof(double) * ng);
  for (int exact = 0; exact < 2; exact++) {
    for (int64_t i = 0; i < ng; i++) {
      const double v = -8.0 + 16.0 * (double)i / (double)(ng - 1);
      g[i] = (float)v;
      gr[i] = exact ? 0.5 * v * (1 + erf(v / sqrt(2.0)))
                    : 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    }
    be->gelu(be, g, ng, exact);
    check(exact ? "gelu erf (nn.GELU)" : "gelu tanh (gelu_pytorch_tanh)", max_rel(g, gr, ng), 1e-6);
  }
  free(g), free(gr);
  /* attention_seg: packed qkv rows (strides 3H), segments of 1, 5, 16 and 150 tokens (the last
   * spans three 64-key tiles with growing scores, so the online max is rescaled) */
  const int heads_l[2] = {3, 2}, dim_l[2] = {40, 72};
  for (int cfg = 0; cfg < 2; cfg++) {
    const int Hh = heads_l[cfg], D = dim_l[cfg], H = Hh * D;
    const int64_t seg[5] = {0, 1, 6, 22, 172}, n = 172;
    float *qkv = malloc(sizeof(float) * n * 3 * H), *o = malloc(sizeof(float) * n * H);
    double *ref = malloc(sizeof(double) * n * H), *p = malloc(sizeof(double) * n);
    fill(qkv, n * 3 * H, 1);
    for (int64_t t = 0; t < n; t++)
      for (int i = 0; i < H; i++) qkv[t * 3 * H + H + i] *= 1.0f + (float)t / 40.0f; /* keys grow */
    const float scale = 1.0f / sqrtf((float)D);
    for (int s = 0; s < 4; s++)
      for (int64_t t = seg[s]; t < seg[s + 1]; t++)
        for (int h = 0; h < Hh; h++) {
          double mx = -INFINITY, sum = 0;
          for (int64_t j = seg[s]; j < seg[s + 1]; j++) {
            double d = 0;
            for (int i = 0; i < D; i++) d += (double)qkv[t * 3 * H + h * D + i] * qkv[j * 3 * H + H + h * D + i];
            p[j] = d * scale;
            mx = fmax(mx, p[j]);
          }
          for (int64_t j = seg[s]; j < seg[s + 1]; j++) sum += (p[j] = exp(p[j] - mx));
          for (int i = 0; i < D; i++) {
            double acc = 0;
            for (int64_t j = seg[s]; j < seg[s + 1]; j++) acc += p[j] * qkv[j * 3 * H + 2 * H + h * D + i];
            ref[t * H + h * D + i] = acc / sum;
          }
        }
    const ops_seg_attn_args a = {.n = n, .n_heads = Hh, .head_dim = D, .scale = scale, .q = qkv, .k = qkv + H,
                                 .v = qkv + 2 * H, .q_stride = 3 * H, .k_stride = 3 * H, .v_stride = 3 * H,
                                 .n_seg = 4, .seg = seg};
    for (int isa = 0; isa < 3; isa++) { /* the generic body, the AVX2 kernel, and the best (9) */
      cpu_backend_force_isa(isa == 2 ? 9 : isa);
      memset(o, 0, sizeof(float) * n * H);
      be->attention_seg(be, o, &a);
      char what[96];
      snprintf(what, sizeof what, "attention_seg heads=%d D=%d segments 1,5,16,150 isa<=%d", Hh, D, isa == 2 ? 9 : isa);
      check(what, max_rel(o, ref, n * H), 1e-5);
    }
    free(qkv), free(o), free(ref), free(p);
  }
  /* embed_bag: 4 weighted taps added into y, f32 and bf16 tables */
  const int rows = 50, cols = 33, n = 29, k = 4;
  float *tab = malloc(sizeof(float) * rows * cols), *y = malloc(sizeof(float) * n * cols), *wts = malloc(sizeof(float) * n * k);
  uint16_t *tb = malloc(sizeof(uint16_t) * rows * cols);
  int32_t *ids = malloc(sizeof(int32_t) * n * k);
  double *ref = malloc(sizeof(double) * n * cols);
  fill(tab, (int64_t)rows * cols, 1), fill(wts, (int64_t)n * k, 1);
  for (int i = 0; i < rows * cols; i++) tb[i] = to_bf16(tab[i]);
  for (int i = 0; i < n * k; i++) ids[i] = (int32_t)(rnd() % rows);
  for (int bf = 0; bf < 2; bf++) {
    fill(y, (int64_t)n * cols, 1);
    for (int t = 0; t < n; t++)
      for (int c = 0; c < cols; c++) {
        double s = 0;
        for (int j = 0; j < k; j++)
          s += (double)wts[t * k + j] * (bf ? from_bf16(tb[ids[t * k + j] * cols + c]) : tab[ids[t * k + j] * cols + c]);
        ref[t * cols + c] = y[t * cols + c] + s;
      }
    const ops_weight w = {bf ? ANNA_DTYPE_BF16 : ANNA_DTYPE_F32, bf ? (const void *)tb : (const void *)tab, rows, cols};
    be->embed_bag(be, y, &w, ids, wts, n, k);
    check(bf ? "embed_bag bf16 table" : "embed_bag f32 table", max_rel(y, ref, (int64_t)n * cols), 1e-6);
  }
  free(tab), free(y), free(wts), free(tb), free(ids), free(ref);
  /* axial 2-D rope as vision_qwen35.c applies it: two rope calls, each with the other axis'
   * frequencies zeroed, equal the rotation of pairs (j, j + D/2) by row * f_j (j < D/4) and by
   * col * f_(j - D/4) (D/4 <= j < D/2) */
  {
    const int D = 40, Hh = 3, nt = 11;
    float *x = malloc(sizeof(float) * nt * Hh * D), fr[20] = {0}, fc[20] = {0};
    double *rr = malloc(sizeof(double) * nt * Hh * D);
    int32_t prow[11], pcol[11];
    fill(x, (int64_t)nt * Hh * D, 1);
    for (int t = 0; t < nt; t++) prow[t] = t * 3 % 13, pcol[t] = 40 - t * 7 % 19;
    for (int j = 0; j < D / 4; j++) fr[j] = fc[D / 4 + j] = 1.0f / powf(10000.0f, (float)(2 * j) / (float)(D / 2));
    for (int t = 0; t < nt; t++)
      for (int h = 0; h < Hh; h++)
        for (int j = 0; j < D / 2; j++) {
          const float *v = x + (t * Hh + h) * D;
          const double ang = j < D / 4 ? (double)prow[t] * fr[j] : (double)pcol[t] * fc[j];
          rr[(t * Hh + h) * D + j] = v[j] * cos(ang) - v[j + D / 2] * sin(ang);
          rr[(t * Hh + h) * D + j + D / 2] = v[j + D / 2] * cos(ang) + v[j] * sin(ang);
        }
    be->rope(be, x, nt, Hh, D, Hh * D, D, fr, prow, 0);
    be->rope(be, x, nt, Hh, D, Hh * D, D, fc, pcol, 0);
    check("axial 2-D rope from two rope calls", max_rel(x, rr, (int64_t)nt * Hh * D), 1e-5);
    free(x), free(rr);
  }
}

/* Waveform decoder ops (cpu_conv.c) against PyTorch-layout references in double: Conv1d with
 * dilation (as the codec's causal convs pad it), depthwise Conv1d, ConvTranspose1d(k = m s, s)
 * over context + n frames keeping the frames' outputs, SnakeBeta, channel-scaled add, clamp
 * (and the encoder ops' LayerNorm and erf GELU as the codec calls them). Weights are repacked as the op contracts say (ops.h). */
static void test_waveform_ops(ops_backend *be) {
  printf("waveform decoder ops\n");
  const int n = 19, cin = 13, cout = 11, kw = 7;
  for (int dil = 1; dil <= 3; dil += 2) {
    const int ctx = (kw - 1) * dil;
    float *x = malloc(sizeof(float) * (n + ctx) * cin), *wp = malloc(sizeof(float) * cout * cin * kw),
          *w = malloc(sizeof(float) * cout * cin * kw), *b = malloc(sizeof(float) * cout),
          *y = malloc(sizeof(float) * n * cout);
    double *ref = malloc(sizeof(double) * n * (cin > cout ? cin : cout));
    fill(x, (int64_t)(n + ctx) * cin, 1), fill(wp, (int64_t)cout * cin * kw, 1), fill(b, cout, 1);
    for (int o = 0; o < cout; o++)
      for (int i = 0; i < cin; i++)
        for (int k = 0; k < kw; k++) w[(o * kw + k) * cin + i] = wp[(o * cin + i) * kw + k];
    for (int t = 0; t < n; t++)
      for (int o = 0; o < cout; o++) {
        double s = b[o];
        for (int i = 0; i < cin; i++)
          for (int k = 0; k < kw; k++) s += (double)wp[(o * cin + i) * kw + k] * x[(t + k * dil) * cin + i];
        ref[t * cout + o] = s;
      }
    be->conv1d(be, y, x, n, cin, cout, w, kw, dil, b);
    check(dil == 1 ? "conv1d k7" : "conv1d k7 dilation 3", max_rel(y, ref, (int64_t)n * cout), 1e-5);
    /* the same outputs from a 5-row piece then the rest: the op is row-independent */
    float *y2 = malloc(sizeof(float) * n * cout);
    be->conv1d(be, y2, x, 5, cin, cout, w, kw, dil, b);
    be->conv1d(be, y2 + 5 * cout, x + 5 * cin, n - 5, cin, cout, w, kw, dil, b);
    check("  in pieces: the same bits", same_bits(y, y2, (int64_t)n * cout) ? 0 : 1, 0);
    /* depthwise over cin channels */
    for (int t = 0; t < n; t++)
      for (int c = 0; c < cin; c++) {
        double s = b[c % cout];
        for (int k = 0; k < kw; k++) s += (double)wp[c * kw + k] * x[(t + k * dil) * cin + c];
        ref[t * cin + c] = s;
      }
    float *bd = malloc(sizeof(float) * cin), *yd = malloc(sizeof(float) * n * cin);
    for (int c = 0; c < cin; c++) bd[c] = b[c % cout];
    be->conv1d_dw(be, yd, x, n, cin, wp, kw, dil, bd);
    check("conv1d depthwise", max_rel(yd, ref, (int64_t)n * cin), 1e-5);
    free(x), free(wp), free(w), free(b), free(y), free(y2), free(ref), free(bd), free(yd);
  }
  /* ConvTranspose1d(cin, cout, kernel = m * s, stride s), m = 2 and 1 */
  for (int m = 1; m <= 2; m++) {
    const int s = 4, K = m * s, rows = n + m - 1;
    float *x = malloc(sizeof(float) * rows * cin), *wp = malloc(sizeof(float) * cin * cout * K),
          *w = malloc(sizeof(float) * cin * cout * K), *b = malloc(sizeof(float) * cout),
          *y = malloc(sizeof(float) * n * s * cout);
    const int full = (rows - 1) * s + K;
    double *z = calloc((size_t)full * cout, sizeof(double)), *ref = malloc(sizeof(double) * n * s * cout);
    fill(x, (int64_t)rows * cin, 1), fill(wp, (int64_t)cin * cout * K, 1), fill(b, cout, 1);
    for (int p = 0; p < s; p++)
      for (int o = 0; o < cout; o++)
        for (int u = 0; u < m; u++)
          for (int i = 0; i < cin; i++)
            w[((p * cout + o) * m + u) * cin + i] = wp[(i * cout + o) * K + (m - 1 - u) * s + p];
    /* PyTorch: z[j s + k, o] = b[o] + sum_i x[j, i] W[i, o, k] over every input row j */
    for (int q = 0; q < full; q++)
      for (int o = 0; o < cout; o++) z[q * cout + o] = b[o];
    for (int j = 0; j < rows; j++)
      for (int k = 0; k < K; k++)
        for (int o = 0; o < cout; o++)
          for (int i = 0; i < cin; i++) z[(j * s + k) * cout + o] += (double)x[j * cin + i] * wp[(i * cout + o) * K + k];
    /* the frames after the context rows, their last (m - 1) s outputs left to the next frame */
    for (int q = 0; q < n * s; q++)
      for (int o = 0; o < cout; o++) ref[q * cout + o] = z[(q + (m - 1) * s) * cout + o];
    be->conv_transpose1d(be, y, x, n, cin, cout, w, m, s, b);
    check(m == 2 ? "conv_transpose1d k8 s4 (one context row)" : "conv_transpose1d k4 s4",
          max_rel(y, ref, (int64_t)n * s * cout), 1e-5);
    free(x), free(wp), free(w), free(b), free(y), free(z), free(ref);
  }
  /* elementwise */
  const int rows = 9, d = 33;
  float *x = malloc(sizeof(float) * rows * d), *y = malloc(sizeof(float) * rows * d), *a = malloc(sizeof(float) * d),
        *ib = malloc(sizeof(float) * d), *g = malloc(sizeof(float) * d);
  double *ref = malloc(sizeof(double) * rows * d);
  fill(x, (int64_t)rows * d, 3), fill(a, d, 1), fill(ib, d, 1), fill(g, d, 1);
  for (int r = 0; r < rows * d; r++) {
    const double v = x[r], sn = sin(v * a[r % d]);
    ref[r] = v + ib[r % d] * sn * sn;
  }
  be->snake_beta(be, y, x, rows, d, a, ib);
  check("snake_beta", max_rel(y, ref, (int64_t)rows * d), 1e-5);
  for (int r = 0; r < rows; r++) {
    double mu = 0, var = 0;
    for (int i = 0; i < d; i++) mu += x[r * d + i];
    mu /= d;
    for (int i = 0; i < d; i++) var += (x[r * d + i] - mu) * (x[r * d + i] - mu);
    var /= d;
    for (int i = 0; i < d; i++) ref[r * d + i] = (x[r * d + i] - mu) / sqrt(var + 1e-6) * a[i] + g[i];
  }
  be->layer_norm(be, y, x, a, g, rows, d, 1e-6f);
  check("layer_norm (codec use)", max_rel(y, ref, (int64_t)rows * d), 1e-5);
  for (int r = 0; r < rows * d; r++) ref[r] = 0.5 * x[r] * (1 + erf(x[r] / sqrt(2.0)));
  memcpy(y, x, sizeof(float) * rows * d);
  be->gelu(be, y, (int64_t)rows * d, 1);
  check("gelu erf (codec use)", max_rel(y, ref, (int64_t)rows * d), 1e-5);
  for (int r = 0; r < rows * d; r++) ref[r] = x[r] + (double)g[r % d] * ref[r];
  be->add_scaled(be, x, y, g, rows, d);
  check("add_scaled", max_rel(x, ref, (int64_t)rows * d), 1e-6);
  for (int r = 0; r < rows * d; r++) ref[r] = x[r] < -1 ? -1 : x[r] > 1 ? 1 : x[r];
  be->clamp(be, x, (int64_t)rows * d, -1.0f, 1.0f);
  check("clamp", max_rel(x, ref, (int64_t)rows * d), 0);
  free(x), free(y), free(a), free(ib), free(g), free(ref);
}

int main(void) {
  threadpool *tp = NULL;
  ops_backend *be = NULL;
  char err[256];
  if (threadpool_create(&tp, 2, err, sizeof err) || cpu_backend_create(&be, tp, cpu_matmul_scratch_floats(8192), (size_t)(128 + 32) * 8192 * 4, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  test_matmul(be);
  test_matmul_batch_invariant(be);
  test_matmul_quant(be);
  test_matmul_group(be);
  test_dequant_fast();
  test_gdn(be);
  test_attention(be);
  test_conv_rope_norm(be);
  test_fused(be);
  test_gdn_step_batched(be);
  test_moe_route(be);
  test_sampler();
  test_topk(be);
  test_sampler_candidates(be);
  test_sampler_tail(be);
  test_encoder_ops(be);
  test_waveform_ops(be);
  cpu_backend_free(be);
  threadpool_free(tp);
  printf("%d passed, %d failed\n", g_checks - g_fail, g_fail);
  return g_fail ? 1 : 0;
}
