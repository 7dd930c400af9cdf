/* test_asr.c: Qwen3-ASR (model/audio_qwen3_asr.c + the thinker's text decoder) against qwen-asr
 * 0.0.6 on the shrunk random model of tests/fixtures/qwen3_asr (tools/mkfix_asr.py).
 * - im2col_3x3s2 (CPU) equals a direct loop on odd / even image sizes.
 * - per clip (reference features of tests/fixtures/audio, 1.2-2 s, 16-26 encoder rows over two
 *   13-row attention windows): the encoder's rows within 2e-3 absolute and 1e-4 of the largest
 *   reference value; control: the same weights with one window over the whole clip
 *   (n_window_infer 800) miss by more, so the block-diagonal mask is exercised.
 * - the thinker (text decoder loaded from thinker.model.*, lm_head tied because absent) fed the
 *   encoder rows at the <|audio_pad|> rows: every prompt row's logits within 2e-3; control
 *   without the rows misses; 8 greedy ids equal the reference's.
 * - bad input: features of the wrong mel count, zero frames, no features, more frames than the
 *   state holds, a short output, a wrong io, folders without an audio tower (no audio_config,
 *   weights without thinker.audio_tower.*), an unsupported audio_config key, a backend without
 *   im2col_3x3s2 (as CUDA today).
 * Usage: test_asr SHARED_FIXTURES_DIR ASR_FIXTURE_DIR AUDIO_FIXTURE_DIR */
#define _DEFAULT_SOURCE /* realpath, mkdtemp, symlink */
#include "anna/anna.h"
#include "backends/registry.h"
#include "base/error.h"
#include "base/tuning.h"
#include "model/audio_qwen3_asr.h"
#include "model/kind.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_fail, g_checks;

static void ok(const char *what, int cond) {
  g_checks++;
  printf("  %-76s %s\n", what, cond ? "ok" : "FAIL");
  if (!cond) g_fail++;
}

static void expect(const char *what, int rc, int want_rc, const char *err, const char *needle) {
  printf("    -> %s\n", err);
  ok(what, rc == want_rc && strstr(err, needle) != NULL);
}

static void *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *p = malloc((size_t)sz + 1);
  if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) {
    free(p);
    p = NULL;
  }
  fclose(f);
  *n = (size_t)sz;
  return p;
}

typedef struct rig {
  const model_kind *k;
  void *impl, *st;
  ops_backend *be;
  model_desc desc;
} rig;

/* Loads `kind` from dir on a CPU backend with a state of n_batch (frames or tokens), n_ctx. */
static int rig_open(rig *r, const char *kind, const char *dir, int n_batch, int n_ctx, char *err,
                    size_t errlen) {
  memset(r, 0, sizeof *r);
  r->k = model_kind_by_name(kind);
  if (!r->k) return anna_err(err, errlen, ANNA_ENOTFOUND, "no %s kind", kind);
  model_source src = {.path = dir, .is_gguf = 0, .model_type = "qwen3_asr"};
  anna_tuning t;
  tuning_defaults(&t);
  const model_load_params lp = {.tuning = &t};
  int rc = r->k->load(&r->impl, &src, &lp, err, errlen);
  if (rc) return rc;
  r->k->describe(r->impl, &r->desc);
  ops_model_shape *shape = calloc(1, sizeof *shape);
  r->k->backend_shape(r->impl, n_ctx, shape);
  const backend_params bp = {.n_threads = 2, .n_batch = n_batch, .shape = shape, .tuning = &t};
  rc = backend_registry_find("cpu")->create(&bp, &r->be, err, errlen);
  free(shape);
  if (rc) return rc;
  const model_state_params sp = {.n_seq = 1, .n_ctx = n_ctx, .n_batch = n_batch};
  return r->k->state_create(&r->st, r->impl, r->be, &sp, err, errlen);
}

static void rig_close(rig *r) {
  if (r->st) r->k->state_free(r->st);
  if (r->be) r->be->destroy(r->be);
  if (r->impl) r->k->free(r->impl);
}

static int encode(rig *r, const float *mel, int n_mels, int64_t L, float *out, int64_t rows,
                  int64_t *written, char *err, size_t errlen) {
  const model_input in = {.io = MODEL_IO_AUDIO, .features = mel, .n_frames = L, .n_mels = n_mels};
  const model_output o = {
      .io = MODEL_IO_EMBEDDINGS, .embd = out, .embd_rows = rows, .embd_written = written};
  return r->k->run(r->impl, r->st, r->be, &in, &o, err, errlen);
}

static void test_im2col(void) {
  printf("im2col_3x3s2 (CPU) vs a direct loop\n");
  char err[256] = "";
  ops_model_shape shape = {.max_cols = 64};
  anna_tuning t;
  tuning_defaults(&t);
  const backend_params bp = {.n_threads = 2, .n_batch = 16, .shape = &shape, .tuning = &t};
  ops_backend *be = NULL;
  if (backend_registry_find("cpu")->create(&bp, &be, err, sizeof err)) {
    ok(err, 0);
    return;
  }
  const int sizes[3][3] = {{7, 5, 3}, {8, 6, 1}, {1, 2, 4}}; /* h, w, c */
  for (int si = 0; si < 3; si++) {
    const int h = sizes[si][0], w = sizes[si][1], c = sizes[si][2], ho = (h + 1) / 2,
              wo = (w + 1) / 2;
    const int64_t n_img = 2, nx = n_img * h * w * c, nc = n_img * ho * wo * c * 9;
    float *x = be->alloc(be, (size_t)nx * 4), *cols = be->alloc(be, (size_t)nc * 4);
    float *hx = malloc((size_t)nx * 4), *hc = malloc((size_t)nc * 4),
          *want = malloc((size_t)nc * 4);
    for (int64_t i = 0; i < nx; i++)
      hx[i] = (float)((i * 37) % 101) - 50.0f;
    be->upload(be, x, hx, (size_t)nx * 4);
    be->im2col_3x3s2(be, cols, x, n_img, h, w, c);
    be->download(be, hc, cols, (size_t)nc * 4);
    for (int64_t im = 0; im < n_img; im++)
      for (int oy = 0; oy < ho; oy++)
        for (int ox = 0; ox < wo; ox++)
          for (int ci = 0; ci < c; ci++)
            for (int ky = 0; ky < 3; ky++)
              for (int kx = 0; kx < 3; kx++) {
                const int iy = 2 * oy + ky - 1, ix = 2 * ox + kx - 1;
                want[(((im * ho + oy) * wo + ox) * c + ci) * 9 + ky * 3 + kx] =
                    iy < 0 || iy >= h || ix < 0 || ix >= w ? 0.0f
                                                           : hx[((im * h + iy) * w + ix) * c + ci];
              }
    char what[96];
    snprintf(what, sizeof what, "2 images %dx%d, %d channels: identical", h, w, c);
    ok(what, !memcmp(hc, want, (size_t)nc * 4));
    be->free(be, x), be->free(be, cols);
    free(hx), free(hc), free(want);
  }
  be->destroy(be);
}

typedef struct acase {
  char name[48];
  int64_t L, N;
  float *mel, *enc;
  const json_t *j;
} acase;

static double max_diff(const float *a, const float *b, int64_t n, double *mref) {
  double mx = 0;
  *mref = 0;
  for (int64_t i = 0; i < n; i++) {
    mx = fmax(mx, fabs((double)a[i] - b[i]));
    *mref = fmax(*mref, fabs((double)b[i]));
  }
  return isnan(mx) ? INFINITY : mx;
}

static void test_encoder(rig *r, acase *cs, int nc) {
  printf("encoder vs qwen-asr (%s)\n", r->desc.text);
  char err[512] = "", what[1024];
  for (int i = 0; i < nc; i++) {
    acase *c = &cs[i];
    ok("  tokens for the frames = the reference's rows",
       audio_qwen3_asr_tokens(r->impl, c->L) == c->N);
    float *out = malloc(sizeof(float) * (size_t)(c->N * r->desc.n_embd));
    int64_t w = -1;
    int rc = encode(r, c->mel, 128, c->L, out, c->N, &w, err, sizeof err);
    if (rc) printf("    %s\n", err);
    double mref, mx = rc ? INFINITY : max_diff(out, c->enc, c->N * r->desc.n_embd, &mref);
    snprintf(what, sizeof what, "%s: L %lld -> %lld rows, max err %.3g (max |ref| %.3g)", c->name,
             (long long)c->L, (long long)c->N, mx, rc ? 0 : mref);
    ok(what, !rc && w == c->N && mx <= 2e-3 && mx / mref <= 1e-4);
    free(out);
  }
}

/* Same weights, one attention window over the whole clip: must miss the reference. */
static void test_window_control(const char *fix, acase *c) {
  char dir[] = "/tmp/anna_asr_XXXXXX", path[1400], st[PATH_MAX], err[512] = "";
  if (!mkdtemp(dir)) {
    ok("mkdtemp", 0);
    return;
  }
  snprintf(path, sizeof path, "%s/config.json", fix);
  json_t *root = json_load_file(path, 0, NULL);
  json_object_set_new(json_object_get(json_object_get(root, "thinker_config"), "audio_config"),
                      "n_window_infer", json_integer(800));
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_dump_file(root, path, JSON_INDENT(1));
  json_decref(root);
  snprintf(path, sizeof path, "%s/model.safetensors", fix);
  if (!realpath(path, st)) snprintf(st, sizeof st, "%s", path);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  if (symlink(st, path)) printf("  symlink failed\n");
  rig r;
  int rc = rig_open(&r, "qwen3_asr_audio", dir, 400, 0, err, sizeof err);
  float *out = malloc(sizeof(float) * (size_t)(c->N * 48));
  if (!rc) rc = encode(&r, c->mel, 128, c->L, out, c->N, NULL, err, sizeof err);
  double mref, mx = rc ? 0 : max_diff(out, c->enc, c->N * 48, &mref);
  char what[160];
  snprintf(what, sizeof what, "control %s with one 104-row window: max err %.3g > 2e-3", c->name,
           mx);
  ok(what, !rc && mx > 2e-3);
  free(out);
  rig_close(&r);
  unlink(path);
  snprintf(path, sizeof path, "%s/config.json", dir);
  unlink(path);
  rmdir(dir);
}

static void test_decoder(rig *enc, const char *fix, acase *cs, int nc) {
  char err[512] = "", path[1400], what[1024];
  rig r;
  int rc = rig_open(&r, "text_decoder", fix, 64, 128, err, sizeof err);
  printf("thinker decoder fed the encoder rows (%s)\n", rc ? err : r.desc.text);
  ok("text decoder loads from thinker.model.* (lm_head tied)", !rc && r.desc.vocab == 1004);
  audio_qwen3_asr_ids ids;
  audio_qwen3_asr_get_ids(enc->impl, &ids);
  ok("special ids from thinker_config (remapped: pad 1002, start 1000, end 1001)",
     ids.audio_pad == 1002 && ids.audio_start == 1000 && ids.audio_end == 1001);
  for (int ci = 0; !rc && ci < nc; ci++) {
    acase *c = &cs[ci];
    const json_t *pj = json_object_get(c->j, "prompt_ids"),
                 *gj = json_object_get(c->j, "greedy_ids");
    const int32_t n = (int32_t)json_array_size(pj);
    const int V = r.desc.vocab, H = enc->desc.n_embd;
    int32_t *tok = malloc(sizeof(int32_t) * n), *seq = calloc((size_t)n, sizeof(int32_t));
    int32_t *pos = malloc(sizeof(int32_t) * n), *eidx = malloc(sizeof(int32_t) * n);
    int8_t *want = malloc((size_t)n);
    float *rows = malloc(sizeof(float) * (size_t)(c->N * H)),
          *lg = malloc(sizeof(float) * (size_t)n * V);
    int64_t ne = 0;
    for (int32_t i = 0; i < n; i++) {
      tok[i] = (int32_t)json_integer_value(json_array_get(pj, (size_t)i));
      pos[i] = i, want[i] = 1, seq[i] = 0;
      if (tok[i] == ids.audio_pad) eidx[ne++] = i;
    }
    int64_t w = 0;
    rc = encode(enc, c->mel, 128, c->L, rows, c->N, &w, err, sizeof err);
    ok("  one encoder row per <|audio_pad|>", !rc && w == ne);
    if (rc || w != ne) break;
    anna_batch b = {n, tok, seq, pos, want};
    model_input in = {
        .io = MODEL_IO_TOKENS, .batch = &b, .embd = rows, .embd_idx = eidx, .n_embd = ne};
    const model_output o = {.io = MODEL_IO_LOGITS, .logits = lg};
    r.k->seq->reset(r.st, 0);
    rc = r.k->run(r.impl, r.st, r.be, &in, &o, err, sizeof err);
    if (rc) printf("    %s\n", err);
    snprintf(path, sizeof path, "%s/%s.logits.f32", fix, c->name);
    size_t nb = 0;
    float *ref = read_file(path, &nb);
    const int have = ref && nb == sizeof(float) * (size_t)n * V;
    double mref = 0, mx = !rc && have ? max_diff(lg, ref, (int64_t)n * V, &mref) : INFINITY;
    snprintf(what, sizeof what, "%s: logits of %d prompt rows, max err %.3g (max |ref| %.3g)",
             c->name, n, mx, mref);
    ok(what, !rc && have && mx <= 2e-3 && mref > 0);
    if (have && !rc) {
      model_input cin = in;
      cin.n_embd = 0;
      r.k->seq->reset(r.st, 0);
      double cx = 0, cref;
      if (!r.k->run(r.impl, r.st, r.be, &cin, &o, err, sizeof err))
        cx = max_diff(lg, ref, (int64_t)n * V, &cref);
      snprintf(what, sizeof what, "  control without the encoder rows: max err %.3g > 2e-3", cx);
      ok(what, cx > 2e-3);
      r.k->seq->reset(r.st, 0);
      rc = r.k->run(r.impl, r.st, r.be, &in, &o, err, sizeof err);
    }
    free(ref);
    /* greedy: one token per step at position n + i, no eos stop (as the generator) */
    float best, second = -INFINITY;
    int32_t g = (int32_t)ops_argmax_f32(lg + (int64_t)(n - 1) * V, V, &best), gp, gs = 0;
    int8_t gw = 1;
    int match = 1;
    double margin = INFINITY;
    char got[128] = "";
    for (size_t i = 0; !rc && i < json_array_size(gj); i++) {
      const float *row = i == 0 ? lg + (int64_t)(n - 1) * V : lg;
      second = -INFINITY;
      for (int v = 0; v < V; v++)
        if (v != g && row[v] > second) second = row[v];
      margin = fmin(margin, (double)best - second);
      match &= g == json_integer_value(json_array_get(gj, i));
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", i ? "," : "", g);
      if (i + 1 == json_array_size(gj)) break;
      gp = n + (int32_t)i;
      anna_batch b1 = {1, &g, &gs, &gp, &gw};
      model_input in1 = {.io = MODEL_IO_TOKENS, .batch = &b1};
      if ((rc = r.k->run(r.impl, r.st, r.be, &in1, &o, err, sizeof err))) break;
      g = (int32_t)ops_argmax_f32(lg, V, &best);
    }
    snprintf(what, sizeof what, "  greedy ids = reference's (%s; smallest top-2 margin %.3g)", got,
             margin);
    ok(what, !rc && match);
    free(tok), free(seq), free(pos), free(eidx), free(want), free(rows), free(lg);
  }
  rig_close(&r);
}

static void test_bad_input(rig *r, acase *c) {
  printf("bad input\n");
  char err[512] = "";
  float *out = malloc(sizeof(float) * 64 * 48);
  int rc = encode(r, c->mel, 64, c->L / 2, out, 64, NULL, err, sizeof err);
  expect("features of 64 mel bins", rc, ANNA_EINVAL, err,
         "features have 64 mel bins, this encoder takes 128");
  rc = encode(r, c->mel, 128, 0, out, 64, NULL, err, sizeof err);
  expect("zero frames", rc, ANNA_EINVAL, err, "0 frames (need >= 1)");
  rc = encode(r, NULL, 128, 10, out, 64, NULL, err, sizeof err);
  expect("no features", rc, ANNA_EINVAL, err, "no features given");
  rc = encode(r, c->mel, 128, 401, out, 64, NULL, err, sizeof err);
  expect("more frames than the state holds", rc, ANNA_ERANGE, err,
         "401 frames exceed the state's 400");
  rc = encode(r, c->mel, 128, c->L, out, 3, NULL, err, sizeof err);
  expect("output too short", rc, ANNA_EINVAL, err, "the output holds 3 rows");
  const model_input in = {.io = MODEL_IO_PIXELS};
  const model_output o = {.io = MODEL_IO_EMBEDDINGS, .embd = out, .embd_rows = 64};
  rc = r->k->run(r->impl, r->st, r->be, &in, &o, err, sizeof err);
  expect("pixels in", rc, ANNA_EUNSUPPORTED, err, "maps audio features to embeddings, not pixels");
  free(out);
  /* the CUDA table as it is today: no im2col_3x3s2 */
  ops_backend fake = *r->be;
  fake.name = "cuda";
  fake.im2col_3x3s2 = NULL;
  void *st = NULL;
  const model_state_params sp = {.n_batch = 100};
  rc = r->k->state_create(&st, r->impl, &fake, &sp, err, sizeof err);
  expect("backend without im2col_3x3s2", rc, ANNA_EUNSUPPORTED, err,
         "audio encoder: CUDA ops not implemented yet");
  ok("  no state made", st == NULL);
}

static int try_load(const char *dir, char *err, size_t errlen) {
  const model_kind *k = model_kind_by_name("qwen3_asr_audio");
  model_source src = {.path = dir};
  void *impl = NULL;
  anna_tuning t;
  tuning_defaults(&t);
  const model_load_params lp = {.tuning = &t};
  int rc = k->load(&impl, &src, &lp, err, errlen);
  if (impl) k->free(impl);
  return rc;
}

static void write_config(const char *fix, const char *dir, int what) {
  char path[1400];
  snprintf(path, sizeof path, "%s/config.json", fix);
  json_t *root = json_load_file(path, 0, NULL);
  json_t *ac = json_object_get(json_object_get(root, "thinker_config"), "audio_config");
  if (what == 0) json_object_del(json_object_get(root, "thinker_config"), "audio_config");
  if (what == 1) json_object_set_new(ac, "rope_theta", json_real(1e4));
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_dump_file(root, path, JSON_INDENT(1));
  json_decref(root);
}

static void test_folders(const char *shared, const char *fix) {
  printf("folders without a (supported) audio tower\n");
  char dir[] = "/tmp/anna_asr_XXXXXX", path[1400], st[PATH_MAX], err[512] = "";
  model_source src;
  const model_kind *k = NULL;
  int rc = model_kind_find(fix, &src, &k, err, sizeof err);
  ok("qwen3_asr folder: the text decoder comes first, the audio probe accepts",
     !rc && !strcmp(k->name, "text_decoder") && model_kind_by_name("qwen3_asr_audio")->probe(&src));
  snprintf(path, sizeof path, "%s/qwen3", shared);
  rc = try_load(path, err, sizeof err);
  expect("qwen3 (text model_type)", rc, ANNA_EUNSUPPORTED, err,
         "model_type 'qwen3' has no Qwen3-ASR audio tower");
  if (!mkdtemp(dir)) {
    ok("mkdtemp", 0);
    return;
  }
  write_config(fix, dir, 0);
  rc = try_load(dir, err, sizeof err);
  expect("qwen3_asr config without audio_config", rc, ANNA_ENOTFOUND, err,
         "this model has no audio tower");
  write_config(fix, dir, 1);
  rc = try_load(dir, err, sizeof err);
  expect("unsupported audio_config key", rc, ANNA_EUNSUPPORTED, err,
         "audio_config.rope_theta is not supported");
  write_config(fix, dir, 2);
  snprintf(path, sizeof path, "%s/qwen3/model.safetensors", shared);
  if (!realpath(path, st)) snprintf(st, sizeof st, "%s", path);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  if (symlink(st, path)) printf("  symlink failed\n");
  rc = try_load(dir, err, sizeof err);
  expect("weights without thinker.audio_tower.*", rc, ANNA_ENOTFOUND, err,
         "missing tensor 'thinker.audio_tower.conv2d1.weight'");
  unlink(path);
  snprintf(path, sizeof path, "%s/config.json", dir);
  unlink(path);
  rmdir(dir);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* test_asr --bench DIR [THREADS]: a released-shape tower (tools/mkfix_asr.py --shape): times the
 * encoder on DIR/bench.mel.f32 (best of 3) and checks its rows against qwen-asr's. Not a ctest. */
static int bench(const char *dir, int threads) {
  char path[1400], err[512] = "";
  snprintf(path, sizeof path, "%s/bench.json", dir);
  json_t *info = json_load_file(path, 0, NULL);
  if (!info) {
    fprintf(stderr, "cannot read %s\n", path);
    return 1;
  }
  const int64_t L = json_integer_value(json_object_get(info, "frames")),
                R = json_integer_value(json_object_get(info, "rows"));
  const int outd = (int)json_integer_value(json_object_get(info, "out_dim"));
  size_t n1 = 0, n2 = 0;
  snprintf(path, sizeof path, "%s/bench.mel.f32", dir);
  float *mel = read_file(path, &n1);
  snprintf(path, sizeof path, "%s/bench.enc.f32", dir);
  float *ref = read_file(path, &n2);
  rig r;
  int rc = !mel || !ref || n1 != sizeof(float) * 128 * (size_t)L ||
           n2 != sizeof(float) * (size_t)(R * outd);
  if (rc) snprintf(err, sizeof err, "bad bench files in %s", dir);
  memset(&r, 0, sizeof r);
  double t_load = now_s();
  if (!rc) {
    r.k = model_kind_by_name("qwen3_asr_audio");
    model_source src = {.path = dir, .model_type = "qwen3_asr"};
    anna_tuning t;
    tuning_defaults(&t);
    const model_load_params lp = {.tuning = &t};
    rc = r.k->load(&r.impl, &src, &lp, err, sizeof err);
    ops_model_shape shape;
    if (!rc) r.k->backend_shape(r.impl, 0, &shape);
    const backend_params bp = {.n_threads = threads, .n_batch = L, .shape = &shape, .tuning = &t};
    if (!rc) rc = backend_registry_find("cpu")->create(&bp, &r.be, err, sizeof err);
    const model_state_params sp = {.n_seq = 1, .n_batch = (int)L};
    if (!rc) rc = r.k->state_create(&r.st, r.impl, r.be, &sp, err, sizeof err);
  }
  t_load = now_s() - t_load;
  float *out = malloc(sizeof(float) * (size_t)(R * outd));
  double best = INFINITY;
  for (int i = 0; !rc && i < 3; i++) {
    const double t0 = now_s();
    rc = encode(&r, mel, 128, L, out, R, NULL, err, sizeof err);
    best = fmin(best, now_s() - t0);
  }
  if (rc) {
    fprintf(stderr, "%s\n", err);
  } else {
    double mref, mx = max_diff(out, ref, R * outd, &mref);
    printf("%s: %lld frames -> %lld rows, load %.2f s, encode %.3f s best of 3 (%d threads; "
           "reference %.3f s), "
           "max err %.3g (max |ref| %.3g)\n",
           json_string_value(json_object_get(info, "shape")), (long long)L, (long long)R, t_load,
           best, threads, json_real_value(json_object_get(info, "reference_s")), mx, mref);
    rc = !(mx <= 2e-3 || mx / mref <= 1e-4);
  }
  free(out), free(mel), free(ref);
  rig_close(&r);
  json_decref(info);
  return rc ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc >= 3 && !strcmp(argv[1], "--bench")) return bench(argv[2], argc > 3 ? atoi(argv[3]) : 2);
  if (argc < 4) {
    fprintf(stderr, "usage: test_asr SHARED_FIXTURES_DIR ASR_FIXTURE_DIR AUDIO_FIXTURE_DIR\n");
    return 2;
  }
  const char *shared = argv[1], *fix = argv[2], *audio = argv[3];
  char path[1400], err[512] = "";
  test_im2col();
  snprintf(path, sizeof path, "%s/expected.json", fix);
  json_t *exp = json_load_file(path, 0, NULL);
  const json_t *cj = json_object_get(exp, "cases");
  const int nc = (int)json_array_size(cj);
  acase cs[8];
  int bad = !exp || nc < 1 || nc > 8;
  for (int i = 0; !bad && i < nc; i++) {
    const json_t *c = json_array_get(cj, (size_t)i);
    acase *a = &cs[i];
    snprintf(a->name, sizeof a->name, "%s", json_string_value(json_object_get(c, "name")));
    a->L = json_integer_value(json_object_get(c, "frames"));
    a->N = json_integer_value(json_object_get(c, "tokens"));
    a->j = c;
    size_t n1 = 0, n2 = 0;
    snprintf(path, sizeof path, "%s/%s", audio, json_string_value(json_object_get(c, "mel")));
    a->mel = read_file(path, &n1);
    snprintf(path, sizeof path, "%s/%s.enc.f32", fix, a->name);
    a->enc = read_file(path, &n2);
    bad = !a->mel || !a->enc || n1 != sizeof(float) * 128 * (size_t)a->L ||
          n2 != sizeof(float) * 48 * (size_t)a->N;
  }
  ok("fixture readable", !bad);
  if (bad) return 1;
  rig r;
  int rc = rig_open(&r, "qwen3_asr_audio", fix, 400, 0, err, sizeof err);
  if (rc) printf("  %s\n", err);
  ok("audio encoder loads (n_batch 400 frames)", !rc && r.desc.n_embd == 48 && r.desc.vocab == 0);
  if (!rc) {
    test_encoder(&r, cs, nc);
    test_window_control(fix, &cs[0]);
    test_decoder(&r, fix, cs, nc);
    test_bad_input(&r, &cs[0]);
  }
  rig_close(&r);
  test_folders(shared, fix);
  for (int i = 0; i < nc; i++)
    free(cs[i].mel), free(cs[i].enc);
  json_decref(exp);
  printf("%d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
