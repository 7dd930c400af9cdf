/* test_cuda_encoder.c: the encoder and waveform decoder ops (ops.h "Encoder ops", "Waveform
 * decoder ops"; cuda_encoder.cu) against the CPU backend on random inputs of the shapes the
 * models use: the Qwen3.5 vision tower (d 1152 = 16 heads of 72, segments of 1, 64 and 1024
 * rows, the 4-tap position gather), the Qwen3-ASR conv front (3x3 stride-2 im2col of mel
 * images and of 480-channel maps) and the Qwen3-TTS codec (kw 7 convs at dilations 1, 3, 9,
 * transposed convs of stride 2..8, 32..1024 channels), plus odd sizes, NULL biases and the
 * in-place calls the contracts allow. Sums run in another order than the CPU's: relative
 * 1e-4 of the largest reference value (1e-5 for the row and elementwise ops, exact for the
 * copies). Device outputs start as NaN, so an unwritten element fails. The ops run once more
 * inside a recorded step (a small image is one: the encoders bracket their pass with
 * step_begin), which must give the eager bits. Model vectors are host memory mirrored by
 * address, so the mirrors are dropped after each case (a freed vector's address may come
 * back holding other values). */
#include "cuda_test.h"

#include "base/error.h"
#include "ops/ops.h"

/* ---- helpers ---- */

static float *dcopy(const float *h, int64_t n) {
  return dput(h, sizeof(float) * (size_t)n);
}

static void case_done(void) {
  gpu_status("encoder case");
  cuda_backend_drop_mirrors(g_gpu);
}

/* ---- LayerNorm ---- */

static void ln_case(int64_t rows, int d, float offset, int with_b, int in_place) {
  float *x = hrand(rows * d, 2.0f), *w = hrand(d, 1.0f), *b = with_b ? hrand(d, 0.5f) : NULL;
  for (int64_t i = 0; i < rows * d; i++) x[i] += offset;
  float *ref = malloc(sizeof(float) * (size_t)(rows * d));
  g_cpu->layer_norm(g_cpu, ref, x, w, b, rows, d, 1e-6f);
  float *dx = dcopy(x, rows * d), *dy = in_place ? dx : dnan(rows * d);
  g_gpu->layer_norm(g_gpu, dy, dx, w, b, rows, d, 1e-6f);
  char what[128];
  snprintf(what, sizeof what, "layer_norm rows %lld d %d offset %g%s%s", (long long)rows, d, offset,
           with_b ? "" : " no bias", in_place ? " in place" : "");
  cmpd(what, dy, ref, rows * d, 1e-5);
  if (!in_place) dfree(dy);
  dfree(dx);
  free(x), free(w), free(b), free(ref);
  case_done();
}

/* ---- GELU ---- */

static void gelu_case(int64_t n, int exact) {
  float *x = hrand(n, 5.0f);
  float *dx = dcopy(x, n);
  g_cpu->gelu(g_cpu, x, n, exact);
  g_gpu->gelu(g_gpu, dx, n, exact);
  char what[96];
  snprintf(what, sizeof what, "gelu %s n %lld", exact ? "erf" : "tanh", (long long)n);
  cmpd(what, dx, x, n, 1e-5);
  dfree(dx);
  free(x);
  case_done();
}

/* ---- segmented attention ---- */

/* q, k, v as views of one packed [n, 3 * H * D] buffer (the towers' qkv matmul output). */
static void seg_case(int H, int D, const int64_t *lens, int n_seg, float qk_scale) {
  int64_t seg[64];
  seg[0] = 0;
  for (int i = 0; i < n_seg; i++) seg[i + 1] = seg[i] + lens[i];
  const int64_t n = seg[n_seg], row = 3 * (int64_t)H * D, od = (int64_t)H * D;
  float *qkv = hrand(n * row, 1.0f);
  for (int64_t t = 0; t < n; t++)
    for (int64_t i = 0; i < 2 * od; i++) qkv[t * row + i] *= qk_scale; /* q and k: peaked or flat softmax */
  float *ref = malloc(sizeof(float) * (size_t)(n * od));
  ops_seg_attn_args a = {.n = n,
                         .n_heads = H,
                         .head_dim = D,
                         .scale = 1.0f / sqrtf((float)D),
                         .q = qkv,
                         .k = qkv + od,
                         .v = qkv + 2 * od,
                         .q_stride = row,
                         .k_stride = row,
                         .v_stride = row,
                         .n_seg = n_seg,
                         .seg = seg};
  g_cpu->attention_seg(g_cpu, ref, &a);
  float *dqkv = dcopy(qkv, n * row), *dout = dnan(n * od);
  a.q = dqkv, a.k = dqkv + od, a.v = dqkv + 2 * od;
  g_gpu->attention_seg(g_gpu, dout, &a);
  char what[128];
  snprintf(what, sizeof what, "attention_seg %d heads of %d, n %lld in %d segments (first %lld), qk x%g", H, D,
           (long long)n, n_seg, (long long)lens[0], qk_scale);
  cmpd(what, dout, ref, n * od, 1e-4);
  dfree(dqkv), dfree(dout);
  free(qkv), free(ref);
  case_done();
}

/* ---- weighted gather ---- */

static void bag_case(int type, int64_t rows, int64_t cols, int64_t n, int k) {
  float *tf;
  void *tab = make_weight(type, rows, cols, &tf);
  const ops_weight t = {type, tab, rows, cols};
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n * k));
  float *wts = hrand(n * k, 1.0f), *y = hrand(n * cols, 1.0f);
  for (int64_t i = 0; i < n * k; i++) ids[i] = (int32_t)(rnd() % (uint64_t)rows);
  float *dy = dcopy(y, n * cols), *dw = dcopy(wts, n * k);
  int32_t *di = dput(ids, sizeof(int32_t) * (size_t)(n * k));
  g_cpu->embed_bag(g_cpu, y, &t, ids, wts, n, k);
  g_gpu->embed_bag(g_gpu, dy, &t, di, dw, n, k);
  char what[96];
  snprintf(what, sizeof what, "embed_bag %s [%lld, %lld] n %lld k %d", dtype_name(type), (long long)rows,
           (long long)cols, (long long)n, k);
  cmpd(what, dy, y, n * cols, 1e-5);
  dfree(dy), dfree(dw), dfree(di);
  free(tab), free(tf), free(ids), free(wts), free(y);
  case_done();
}

/* ---- convs ---- */

static void conv_case(int64_t n, int cin, int cout, int kw, int dil, int with_bias) {
  const int64_t rows = n + (int64_t)(kw - 1) * dil;
  float *x = hrand(rows * cin, 1.0f), *w = hrand((int64_t)cout * kw * cin, 0.1f);
  float *b = with_bias ? hrand(cout, 0.5f) : NULL, *ref = malloc(sizeof(float) * (size_t)(n * cout));
  g_cpu->conv1d(g_cpu, ref, x, n, cin, cout, w, kw, dil, b);
  float *dx = dcopy(x, rows * cin), *dy = dnan(n * cout);
  g_gpu->conv1d(g_gpu, dy, dx, n, cin, cout, w, kw, dil, b);
  char what[128];
  snprintf(what, sizeof what, "conv1d n %lld cin %d cout %d kw %d dil %d%s", (long long)n, cin, cout, kw, dil,
           with_bias ? "" : " no bias");
  cmpd(what, dy, ref, n * cout, 1e-4);
  dfree(dx), dfree(dy);
  free(x), free(w), free(b), free(ref);
  case_done();
}

static void dw_case(int64_t n, int ch, int kw, int dil, int with_bias) {
  const int64_t rows = n + (int64_t)(kw - 1) * dil;
  float *x = hrand(rows * ch, 1.0f), *w = hrand((int64_t)ch * kw, 0.5f);
  float *b = with_bias ? hrand(ch, 0.5f) : NULL, *ref = malloc(sizeof(float) * (size_t)(n * ch));
  g_cpu->conv1d_dw(g_cpu, ref, x, n, ch, w, kw, dil, b);
  float *dx = dcopy(x, rows * ch), *dy = dnan(n * ch);
  g_gpu->conv1d_dw(g_gpu, dy, dx, n, ch, w, kw, dil, b);
  char what[128];
  snprintf(what, sizeof what, "conv1d_dw n %lld ch %d kw %d dil %d%s", (long long)n, ch, kw, dil,
           with_bias ? "" : " no bias");
  cmpd(what, dy, ref, n * ch, 1e-5);
  dfree(dx), dfree(dy);
  free(x), free(w), free(b), free(ref);
  case_done();
}

static void tconv_case(int64_t n, int cin, int cout, int m, int stride, int with_bias) {
  const int64_t rows = n + m - 1, orows = n * stride;
  float *x = hrand(rows * cin, 1.0f), *w = hrand((int64_t)stride * cout * m * cin, 0.1f);
  float *b = with_bias ? hrand(cout, 0.5f) : NULL, *ref = malloc(sizeof(float) * (size_t)(orows * cout));
  g_cpu->conv_transpose1d(g_cpu, ref, x, n, cin, cout, w, m, stride, b);
  float *dx = dcopy(x, rows * cin), *dy = dnan(orows * cout);
  g_gpu->conv_transpose1d(g_gpu, dy, dx, n, cin, cout, w, m, stride, b);
  char what[128];
  snprintf(what, sizeof what, "conv_transpose1d n %lld cin %d cout %d m %d stride %d%s", (long long)n, cin, cout, m,
           stride, with_bias ? "" : " no bias");
  cmpd(what, dy, ref, orows * cout, 1e-4);
  dfree(dx), dfree(dy);
  free(x), free(w), free(b), free(ref);
  case_done();
}

/* ---- elementwise ---- */

static void snake_case(int64_t rows, int ch, int in_place) {
  float *x = hrand(rows * ch, 3.0f), *alpha = hrand(ch, 1.0f), *ib = hrand(ch, 1.0f);
  for (int c = 0; c < ch; c++) alpha[c] = expf(alpha[c]), ib[c] = 1.0f / (expf(ib[c]) + 1e-9f);
  float *ref = malloc(sizeof(float) * (size_t)(rows * ch));
  g_cpu->snake_beta(g_cpu, ref, x, rows, ch, alpha, ib);
  float *dx = dcopy(x, rows * ch), *dy = in_place ? dx : dnan(rows * ch);
  g_gpu->snake_beta(g_gpu, dy, dx, rows, ch, alpha, ib);
  char what[96];
  snprintf(what, sizeof what, "snake_beta rows %lld ch %d%s", (long long)rows, ch, in_place ? " in place" : "");
  cmpd(what, dy, ref, rows * ch, 1e-5);
  if (!in_place) dfree(dy);
  dfree(dx);
  free(x), free(alpha), free(ib), free(ref);
  case_done();
}

static void add_scaled_case(int64_t rows, int d) {
  float *y = hrand(rows * d, 1.0f), *x = hrand(rows * d, 1.0f), *s = hrand(d, 0.1f);
  float *dy = dcopy(y, rows * d), *dx = dcopy(x, rows * d);
  g_cpu->add_scaled(g_cpu, y, x, s, rows, d);
  g_gpu->add_scaled(g_gpu, dy, dx, s, rows, d);
  char what[96];
  snprintf(what, sizeof what, "add_scaled rows %lld d %d", (long long)rows, d);
  cmpd(what, dy, y, rows * d, 1e-6);
  dfree(dy), dfree(dx);
  free(y), free(x), free(s);
  case_done();
}

/* Bit-exact, with NaN kept where the input had one (torch.clamp). */
static void clamp_case(int64_t n) {
  float *y = hrand(n, 2.0f);
  for (int64_t i = 0; i < n; i += 97) y[i] = NAN;
  float *dy = dcopy(y, n);
  g_cpu->clamp(g_cpu, y, n, -1.0f, 1.0f);
  g_gpu->clamp(g_gpu, dy, n, -1.0f, 1.0f);
  float *got = dget(dy, n);
  gpu_status("clamp");
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++)
    if (isnan(y[i]) ? !isnan(got[i]) : got[i] != y[i]) bad++;
  g_checks++;
  if (bad) {
    printf("  FAIL clamp n %lld: %lld values differ (NaN must stay NaN)\n", (long long)n, (long long)bad);
    g_fail++;
  }
  dfree(dy);
  free(y), free(got);
  case_done();
}

static void im2col_case(int64_t n_img, int h, int w, int c) {
  const int64_t in = n_img * h * w * c, out = n_img * ((h + 1) / 2) * ((w + 1) / 2) * (int64_t)c * 9;
  float *x = hrand(in, 1.0f), *ref = malloc(sizeof(float) * (size_t)out);
  g_cpu->im2col_3x3s2(g_cpu, ref, x, n_img, h, w, c);
  float *dx = dcopy(x, in), *dy = dnan(out);
  g_gpu->im2col_3x3s2(g_gpu, dy, dx, n_img, h, w, c);
  char what[96];
  snprintf(what, sizeof what, "im2col_3x3s2 %lld images [%d, %d, %d]", (long long)n_img, h, w, c);
  cmpd(what, dy, ref, out, 0.0);
  dfree(dx), dfree(dy);
  free(x), free(ref);
  case_done();
}

/* ---- inside a recorded step: a 4-patch "image" through the vision ops and a short codec
 * piece, eager first, then recorded twice (built, replayed): the same bits. ---- */

static void recorded_case(void) {
  enum { N = 4, H = 2, D = 72, HD = H * D, CIN = 48, COUT = 40, KW = 7, DIL = 3, TR = 3 };
  const int64_t xr = N + (KW - 1) * DIL;
  float *x = hrand(N * HD, 1.0f), *lw = hrand(HD, 1.0f), *lb = hrand(HD, 0.2f), *qkv = hrand(N * 3 * HD, 1.0f);
  float *cx = hrand(xr * CIN, 1.0f), *cw = hrand((int64_t)COUT * KW * CIN, 0.1f), *cb = hrand(COUT, 0.1f);
  float *tw = hrand((int64_t)TR * COUT * 2 * CIN, 0.1f), *wts = hrand(N * 4, 0.5f);
  float *tf;
  void *tab = make_weight(ANNA_DTYPE_F32, 16, HD, &tf);
  const ops_weight t = {ANNA_DTYPE_F32, tab, 16, HD};
  int32_t ids[N * 4];
  for (int i = 0; i < N * 4; i++) ids[i] = (int32_t)(rnd() % 16);
  const int64_t seg[3] = {0, 1, N};
  float *dx = dcopy(x, N * HD), *dq = dcopy(qkv, N * 3 * HD), *dcx = dcopy(cx, xr * CIN), *dw = dcopy(wts, N * 4);
  int32_t *di = dput(ids, sizeof ids);
  float *dn = dnan(N * HD), *da = dnan(N * HD), *dc = dnan(N * COUT), *dt = dnan(N * TR * COUT);
  float *res[3][5];
  int64_t l0, l1, b0, u0;
  cuda_backend_graph_stats(g_gpu, &l0, &b0, &u0);
  for (int pass = 0; pass < 3; pass++) {
    cuda_backend_set_graphs(g_gpu, pass > 0);
    g_gpu->upload(g_gpu, dx, x, sizeof(float) * N * HD);
    g_gpu->step_begin(g_gpu, N);
    g_gpu->embed_bag(g_gpu, dx, &t, di, dw, N, 4);
    g_gpu->layer_norm(g_gpu, dn, dx, lw, lb, N, HD, 1e-6f);
    g_gpu->gelu(g_gpu, dn, N * HD, pass & 1);
    g_gpu->gelu(g_gpu, dn, N * HD, !(pass & 1));
    const ops_seg_attn_args a = {N, H, D, 0.1f, dq, dq + HD, dq + 2 * HD, 3 * HD, 3 * HD, 3 * HD, 2, seg};
    g_gpu->attention_seg(g_gpu, da, &a);
    g_gpu->conv1d(g_gpu, dc, dcx, N, CIN, COUT, cw, KW, DIL, cb);
    g_gpu->snake_beta(g_gpu, dc, dc, N, COUT, lw, lb);
    g_gpu->add_scaled(g_gpu, dc, dc, cb, N, COUT);
    g_gpu->clamp(g_gpu, dc, N * COUT, -0.5f, 0.5f);
    g_gpu->conv_transpose1d(g_gpu, dt, dcx, N, CIN, COUT, tw, 2, TR, NULL);
    g_gpu->step_end(g_gpu);
    res[pass][0] = dget(dx, N * HD), res[pass][1] = dget(dn, N * HD), res[pass][2] = dget(da, N * HD);
    res[pass][3] = dget(dc, N * COUT), res[pass][4] = dget(dt, N * TR * COUT);
    gpu_status("recorded encoder step");
  }
  cuda_backend_set_graphs(g_gpu, 0);
  cuda_backend_graph_stats(g_gpu, &l1, &b0, &u0);
  g_checks++;
  int same = 1;
  /* pass 0 (eager) and pass 2 (replayed) ran the same gelu order; pass 1 the other */
  same &= !memcmp(res[0][0], res[2][0], sizeof(float) * N * HD);
  same &= !memcmp(res[0][2], res[2][2], sizeof(float) * N * HD);
  same &= !memcmp(res[0][3], res[2][3], sizeof(float) * N * COUT);
  same &= !memcmp(res[0][1], res[2][1], sizeof(float) * N * HD);
  same &= !memcmp(res[0][4], res[2][4], sizeof(float) * N * TR * COUT);
  if (!same || l1 < l0 + 2) {
    printf("  FAIL recorded encoder step: %s\n", same ? "no graph launched" : "differs from the eager run");
    g_fail++;
  }
  for (int p = 0; p < 3; p++)
    for (int i = 0; i < 5; i++) free(res[p][i]);
  dfree(dx), dfree(dq), dfree(dcx), dfree(dw), dfree(di), dfree(dn), dfree(da), dfree(dc), dfree(dt);
  free(x), free(lw), free(lb), free(qkv), free(cx), free(cw), free(cb), free(tw), free(wts), free(tab), free(tf);
  case_done();
}

/* ---- bad arguments: a sticky error naming the op, never a launch out of bounds ---- */

static void bad_case(void) {
  ops_backend *be = NULL;
  char err[256] = "";
  if (cuda_backend_create(&be, 16, err, sizeof err)) {
    printf("  FAIL second backend: %s\n", err);
    g_fail++;
    return;
  }
  float *d = be->alloc(be, 64 * sizeof(float));
  const int64_t seg[3] = {0, 2, 2}; /* an empty segment */
  const ops_seg_attn_args a = {2, 1, 8, 1.0f, d, d, d, 8, 8, 8, 2, seg};
  be->attention_seg(be, d, &a);
  int rc = be->error(be, err, sizeof err);
  g_checks++;
  if (rc != ANNA_EINVAL || !strstr(err, "attention_seg")) {
    printf("  FAIL attention_seg with an empty segment: rc %d (%s)\n", rc, err);
    g_fail++;
  }
  be->free(be, d);
  cuda_backend_free(be);
}

void test_encoder(void) {
  printf("encoder ops (vision, ASR, codec)\n");
  /* vision tower rows: d 1152; a large offset checks the two-pass variance */
  ln_case(5, 1152, 0.0f, 1, 0);
  ln_case(37, 1152, 30.0f, 1, 1);
  ln_case(3, 1000, 0.5f, 0, 0);
  ln_case(2, 4304, 0.0f, 1, 0);
  ln_case(1, 1, 0.0f, 1, 0);
  gelu_case(100003, 0);
  gelu_case(100003, 1);
  gelu_case(1, 1);
  {
    const int64_t ones[7] = {1, 1, 1, 1, 1, 1, 1};
    seg_case(16, 72, ones, 7, 1.0f);
    const int64_t sixty4[3] = {64, 64, 37};
    seg_case(16, 72, sixty4, 3, 2.0f);
    const int64_t big[1] = {1024};
    seg_case(16, 72, big, 1, 1.0f);
    const int64_t mixed[5] = {1, 64, 1024, 5, 33};
    seg_case(4, 72, mixed, 5, 3.0f);
    const int64_t asr[2] = {104, 50}; /* audio encoder windows: 20 heads of 64 in the small model */
    seg_case(20, 64, asr, 2, 1.0f);
    const int64_t odd[3] = {9, 17, 3};
    seg_case(3, 33, odd, 3, 1.0f);
    seg_case(2, 128, odd, 3, 1.0f);
    seg_case(2, 256, sixty4, 3, 1.0f); /* the largest head_dim: shared memory above 48 KB */
    seg_case(1, 200, odd, 3, 0.0f);    /* flat softmax: the mean of the segment's values */
  }
  bag_case(ANNA_DTYPE_F32, 2304, 1152, 100, 4);
  bag_case(ANNA_DTYPE_F16, 2304, 1152, 37, 4);
  bag_case(ANNA_DTYPE_BF16, 100, 77, 9, 3);
  /* codec: kw 7 at dilations 1 / 3 / 9, pointwise, the final 1-channel conv */
  conv_case(50, 32, 64, 7, 1, 1);
  conv_case(37, 96, 48, 7, 3, 1);
  conv_case(20, 1024, 1024, 7, 9, 1);
  conv_case(65, 512, 1024, 1, 1, 0);
  conv_case(129, 33, 1, 7, 1, 1);
  conv_case(3, 17, 5, 3, 2, 0);
  dw_case(40, 1024, 7, 1, 1);
  dw_case(33, 37, 7, 9, 0);
  tconv_case(10, 1024, 512, 2, 8, 1);
  tconv_case(33, 64, 32, 2, 2, 1);
  tconv_case(17, 96, 48, 2, 5, 0);
  tconv_case(11, 37, 19, 3, 3, 1);
  tconv_case(5, 512, 256, 2, 4, 1);
  tconv_case(7, 256, 128, 2, 6, 1);
  snake_case(300, 96, 0);
  snake_case(71, 1024, 1);
  add_scaled_case(77, 1024);
  add_scaled_case(3, 5);
  clamp_case(10001);
  /* ASR conv front: mel images (c 1), then 480-channel maps; odd sizes */
  im2col_case(2, 100, 128, 1);
  im2col_case(3, 50, 64, 480);
  im2col_case(1, 7, 9, 3);
  recorded_case();
  bad_case();
}

/* ---- benchmark (--bench=encoder): the ops at model sizes, device time per call (after a
 * warm-up call, the mirrors made) and the CPU backend's (the harness's 2-thread pool: a
 * reference point, not the CPU's best). ---- */

typedef struct enc_bench {
  const char *what;
  double gflop; /* 0: a memory-bound op, GB/s of gbytes printed instead */
  double gbytes;
} enc_bench;

/* Times `run(be, dev)` on both backends: reps device calls, one CPU call. */
#define ENC_TIME(B, REPS, CALL_GPU, CALL_CPU)                                                                       \
  do {                                                                                                              \
    CALL_GPU;                                                                                                       \
    gpu_status((B).what);                                                                                           \
    double t0_ = now_s();                                                                                           \
    for (int r_ = 0; r_ < (REPS); r_++) CALL_GPU;                                                                   \
    gpu_status((B).what);                                                                                           \
    const double tg_ = (now_s() - t0_) / (REPS);                                                                    \
    t0_ = now_s();                                                                                                  \
    CALL_CPU;                                                                                                       \
    const double tc_ = now_s() - t0_;                                                                               \
    if ((B).gflop > 0)                                                                                              \
      printf("  %-58s cuda %8.3f ms (%6.0f GFLOP/s)  cpu %9.2f ms\n", (B).what, 1e3 * tg_, (B).gflop / tg_,      \
             1e3 * tc_);                                                                                            \
    else                                                                                                            \
      printf("  %-58s cuda %8.3f ms (%6.0f GB/s)     cpu %9.2f ms\n", (B).what, 1e3 * tg_, (B).gbytes / tg_,     \
             1e3 * tc_);                                                                                            \
  } while (0)

void bench_encoder(void) {
  printf("bench encoder ops (model sizes)\n");
  cuda_backend_drop_mirrors(g_gpu);
  {
    /* a 64x64-patch image (4096 patches) of the 27-layer tower: d 1152, 16 heads of 72 */
    enum { N = 4096, H = 16, D = 72, HD = H * D, I = 4304 };
    float *x = hrand((int64_t)N * 3 * HD, 1.0f), *w = hrand(HD, 1.0f), *b = hrand(HD, 0.1f);
    float *hy = malloc(sizeof(float) * (size_t)N * I);
    float *dx = dcopy(x, (int64_t)N * 3 * HD), *dy = dnan((int64_t)N * I);
    enc_bench ln = {"layer_norm 4096 x 1152", 0, 2.0 * 4 * N * HD / 1e9};
    ENC_TIME(ln, 20, g_gpu->layer_norm(g_gpu, dy, dx, w, b, N, HD, 1e-6f),
             g_cpu->layer_norm(g_cpu, hy, x, w, b, N, HD, 1e-6f));
    enc_bench ge = {"gelu (tanh) 4096 x 4304", 0, 2.0 * 4 * N * I / 1e9};
    ENC_TIME(ge, 20, g_gpu->gelu(g_gpu, dy, (int64_t)N * I, 0), g_cpu->gelu(g_cpu, hy, (int64_t)N * I, 0));
    enc_bench ge1 = {"gelu (erf) 4096 x 4304", 0, 2.0 * 4 * N * I / 1e9};
    ENC_TIME(ge1, 20, g_gpu->gelu(g_gpu, dy, (int64_t)N * I, 1), g_cpu->gelu(g_cpu, hy, (int64_t)N * I, 1));
    for (int si = 0; si < 2; si++) {
      const int64_t seg1[2] = {0, N}, seg4[5] = {0, N / 4, N / 2, 3 * N / 4, N};
      ops_seg_attn_args a = {N, H, D, 1.0f / sqrtf((float)D), dx, dx + HD, dx + 2 * HD, 3 * HD, 3 * HD, 3 * HD,
                             si ? 4 : 1, si ? seg4 : seg1};
      ops_seg_attn_args ac = a;
      ac.q = x, ac.k = x + HD, ac.v = x + 2 * HD;
      const int64_t L = si ? N / 4 : N;
      enc_bench at = {si ? "attention_seg 4096 rows in 4 segments, 16 x 72" : "attention_seg one 4096-row segment, 16 x 72",
                      4.0 * N * L * HD / 1e9, 0};
      ENC_TIME(at, 5, g_gpu->attention_seg(g_gpu, dy, &a), g_cpu->attention_seg(g_cpu, hy, &ac));
    }
    dfree(dx), dfree(dy);
    free(x), free(w), free(b), free(hy);
    case_done();
  }
  {
    /* codec shapes: a kw 7 conv at 1024 channels over 1000 rows, a transposed conv of stride 8
     * (1024 -> 512), the depthwise conv and SnakeBeta at those sizes */
    enum { N = 1000, C = 1024, KW = 7, DIL = 3 };
    const int64_t xr = N + (KW - 1) * DIL;
    float *x = hrand(xr * C, 1.0f), *w = hrand((int64_t)C * KW * C, 0.05f), *bias = hrand(C, 0.1f);
    float *tw = hrand((int64_t)8 * 512 * 2 * C, 0.05f), *al = hrand(C, 1.0f), *ib = hrand(C, 1.0f);
    float *hy = malloc(sizeof(float) * (size_t)(8 * N * 512 > N * C ? 8 * N * 512 : N * C));
    float *dx = dcopy(x, xr * C), *dy = dnan((int64_t)8 * N * 512);
    enc_bench cv = {"conv1d 1000 rows, 1024 -> 1024, kw 7, dil 3", 2.0 * N * C * KW * C / 1e9, 0};
    ENC_TIME(cv, 10, g_gpu->conv1d(g_gpu, dy, dx, N, C, C, w, KW, DIL, bias),
             g_cpu->conv1d(g_cpu, hy, x, N, C, C, w, KW, DIL, bias));
    enc_bench cv1 = {"conv1d 1000 rows, 1024 -> 1024, kw 7, dil 1", 2.0 * N * C * KW * C / 1e9, 0};
    ENC_TIME(cv1, 10, g_gpu->conv1d(g_gpu, dy, dx, N, C, C, w, KW, 1, bias),
             g_cpu->conv1d(g_cpu, hy, x, N, C, C, w, KW, 1, bias));
    enc_bench tc = {"conv_transpose1d 1000 rows, 1024 -> 512, m 2, stride 8", 2.0 * N * 8 * 512 * 2 * C / 1e9, 0};
    ENC_TIME(tc, 10, g_gpu->conv_transpose1d(g_gpu, dy, dx, N, C, 512, tw, 2, 8, bias),
             g_cpu->conv_transpose1d(g_cpu, hy, x, N, C, 512, tw, 2, 8, bias));
    enc_bench dw = {"conv1d_dw 1000 rows, 1024 channels, kw 7", 0, 2.0 * 4 * N * C / 1e9};
    ENC_TIME(dw, 20, g_gpu->conv1d_dw(g_gpu, dy, dx, N, C, w, KW, 1, bias),
             g_cpu->conv1d_dw(g_cpu, hy, x, N, C, w, KW, 1, bias));
    enc_bench sn = {"snake_beta 1000 x 1024", 0, 2.0 * 4 * N * C / 1e9};
    ENC_TIME(sn, 20, g_gpu->snake_beta(g_gpu, dy, dx, N, C, al, ib), g_cpu->snake_beta(g_cpu, hy, x, N, C, al, ib));
    dfree(dx), dfree(dy);
    free(x), free(w), free(bias), free(tw), free(al), free(ib), free(hy);
    case_done();
  }
  {
    /* ASR front: 8 chunks of 100 frames x 128 mel bins, then 480-channel maps of 50 x 64 */
    const int64_t in = (int64_t)8 * 50 * 64 * 480, out = (int64_t)8 * 25 * 32 * 480 * 9;
    float *x = hrand(in, 1.0f), *hy = malloc(sizeof(float) * (size_t)out);
    float *dx = dcopy(x, in), *dy = dnan(out);
    enc_bench ic = {"im2col_3x3s2 8 x [50, 64, 480]", 0, 4.0 * (double)(in + out) / 1e9};
    ENC_TIME(ic, 20, g_gpu->im2col_3x3s2(g_gpu, dy, dx, 8, 50, 64, 480), g_cpu->im2col_3x3s2(g_cpu, hy, x, 8, 50, 64, 480));
    dfree(dx), dfree(dy);
    free(x), free(hy);
    case_done();
  }
}
