/* test_vision.c: the Qwen3.5 vision tower kind (model/vision_qwen35.c) against transformers.
 * For every case of tests/fixtures/qwen3_5_vision (tools/mkfix_vision.py: images of several
 * grids, two images in one call, a 4-frame video) the tower's rows must match transformers'
 * merger output within 2e-3 absolute and 1e-4 of the largest reference value (the rows are
 * small, |ref| <= 0.21, so the relative bound is the one that catches a wrong formula); all
 * cases concatenated into one call must give the same rows (batching keeps inputs apart).
 * Bad input is refused with a message naming what was wrong: grids that are not multiples of
 * the merge size, a pixel count that does not match the grids, rows of the wrong width, more
 * patches than the state holds, a wrong io, a model without a vision tower (text-only
 * model_type, a qwen3_5 config without vision_config, missing tensors, an unsupported
 * vision_config key) and a backend without the encoder ops (as CUDA is today).
 * Language side (the text decoder fed embedding rows and 3-axis positions, on the HF folder and
 * on llama.cpp's bf16 GGUF of it, whose rope.dimension_sections is read): the positions
 * equal get_rope_index's, every prompt row's logits match transformers' within 2e-3 (controls:
 * 1-axis positions, or no tower rows, miss by far more), the 6 greedy ids equal generate's.
 * Usage: test_vision SHARED_FIXTURES_DIR VISION_FIXTURE_DIR */
#define _DEFAULT_SOURCE /* realpath, mkdtemp */
#include "anna/anna.h"
#include "backends/registry.h"
#include "base/error.h"
#include "base/tuning.h"
#include "model/kind.h"
#include "model/vision_qwen35.h"

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
  printf("  %-72s %s\n", what, cond ? "ok" : "FAIL");
  if (!cond) g_fail++;
}

#define MAX_PATCHES 512

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

typedef struct vcase {
  char name[32];
  int n_grids;
  int32_t grid[3 * 8];
  int64_t n_patches, rows;
  int patch_dim, out_hidden;
  float *pix, *ref;
} vcase;

static int load_case(const char *dir, const json_t *c, vcase *v) {
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s", json_string_value(json_object_get(c, "name")));
  const json_t *g = json_object_get(c, "grid_thw");
  v->n_grids = (int)json_array_size(g);
  for (int i = 0; i < v->n_grids && i < 8; i++)
    for (int j = 0; j < 3; j++) v->grid[3 * i + j] = (int32_t)json_integer_value(json_array_get(json_array_get(g, i), j));
  v->n_patches = json_integer_value(json_object_get(c, "n_patches"));
  v->patch_dim = (int)json_integer_value(json_object_get(c, "patch_dim"));
  v->rows = json_integer_value(json_object_get(c, "tower_rows"));
  v->out_hidden = (int)json_integer_value(json_object_get(c, "out_hidden"));
  char path[1400];
  size_t n;
  snprintf(path, sizeof path, "%s/%s.pix.u8", dir, v->name);
  unsigned char *u8 = read_file(path, &n);
  if (!u8 || n != (size_t)(v->n_patches * v->patch_dim)) {
    printf("  cannot read %s\n", path);
    free(u8);
    return -1;
  }
  /* the processor's normalisation, as the generator computed it in f32 */
  v->pix = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) v->pix[i] = ((float)u8[i] / 255.0f - 0.5f) / 0.5f;
  free(u8);
  snprintf(path, sizeof path, "%s/%s.tower.f32", dir, v->name);
  v->ref = read_file(path, &n);
  if (!v->ref || n != (size_t)(v->rows * v->out_hidden) * sizeof(float)) {
    printf("  cannot read %s\n", path);
    return -1;
  }
  return 0;
}

typedef struct rig {
  const model_kind *k;
  void *impl, *st;
  ops_backend *be;
  model_desc desc;
} rig;

static int rig_open(rig *r, const char *model_dir, int64_t n_batch, char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  r->k = model_kind_by_name("qwen3_5_vision");
  if (!r->k) return anna_err(err, errlen, ANNA_ENOTFOUND, "no qwen3_5_vision kind");
  model_source src = {.path = model_dir, .is_gguf = 0, .model_type = "qwen3_5"};
  anna_tuning t;
  tuning_defaults(&t);
  const model_load_params lp = {.tuning = &t};
  int rc = r->k->load(&r->impl, &src, &lp, err, errlen);
  if (rc) return rc;
  r->k->describe(r->impl, &r->desc);
  ops_model_shape *shape = calloc(1, sizeof *shape);
  r->k->backend_shape(r->impl, 0, shape);
  const backend_params bp = {.n_threads = 2, .n_batch = n_batch, .shape = shape, .tuning = &t};
  rc = backend_registry_find("cpu")->create(&bp, &r->be, err, errlen);
  free(shape);
  if (rc) return rc;
  const model_state_params sp = {.n_seq = 1, .n_batch = (int)n_batch};
  return r->k->state_create(&r->st, r->impl, r->be, &sp, err, errlen);
}

static void rig_close(rig *r) {
  if (r->st) r->k->state_free(r->st);
  if (r->be) r->be->destroy(r->be);
  if (r->impl) r->k->free(r->impl);
}

static int run(rig *r, const float *pix, int64_t n_patches, int patch_dim, const int32_t *grid, int n_grids,
               float *out, int64_t out_rows, int64_t *written, char *err, size_t errlen) {
  const model_input in = {.io = MODEL_IO_PIXELS, .pixels = pix, .n_patches = n_patches, .patch_dim = patch_dim,
                          .n_grids = n_grids, .grid_thw = grid};
  const model_output o = {.io = MODEL_IO_EMBEDDINGS, .embd = out, .embd_rows = out_rows, .embd_written = written};
  return r->k->run(r->impl, r->st, r->be, &in, &o, err, errlen);
}

static void compare(const char *what, const float *got, const float *ref, int64_t n) {
  double mx = 0, mref = 0;
  for (int64_t i = 0; i < n; i++) {
    mx = fmax(mx, fabs((double)got[i] - ref[i]));
    mref = fmax(mref, fabs((double)ref[i]));
  }
  if (isnan(mx)) mx = INFINITY;
  char line[160];
  snprintf(line, sizeof line, "%s: max err %.3g (max |ref| %.3g, rel %.3g)", what, mx, mref, mx / mref);
  ok(line, mx <= 2e-3 && mx / mref <= 1e-4);
}

static void test_exact(rig *r, vcase *cs, int n_cases) {
  printf("tower vs transformers (%s)\n", r->desc.text);
  ok("describe: embeddings of out_hidden, no vocab", r->desc.n_embd == 128 && r->desc.vocab == 0);
  char err[512] = "";
  int64_t tot_p = 0, tot_r = 0;
  int tot_g = 0;
  for (int c = 0; c < n_cases; c++) {
    vcase *v = &cs[c];
    float *out = malloc((size_t)(v->rows * v->out_hidden) * sizeof(float));
    int64_t written = -1;
    int rc = run(r, v->pix, v->n_patches, v->patch_dim, v->grid, v->n_grids, out, v->rows, &written, err, sizeof err);
    if (rc) printf("  %s: %s\n", v->name, err);
    ok("run succeeds, rows written", !rc && written == v->rows);
    if (!rc) compare(v->name, out, v->ref, v->rows * v->out_hidden);
    free(out);
    tot_p += v->n_patches, tot_r += v->rows, tot_g += v->n_grids;
  }
  /* every case in one call: images and the video side by side */
  float *pix = malloc((size_t)(tot_p * cs[0].patch_dim) * sizeof(float));
  float *ref = malloc((size_t)(tot_r * cs[0].out_hidden) * sizeof(float));
  float *out = malloc((size_t)(tot_r * cs[0].out_hidden) * sizeof(float));
  int32_t *grid = malloc((size_t)tot_g * 3 * sizeof(int32_t));
  int64_t po = 0, ro = 0;
  int go = 0;
  for (int c = 0; c < n_cases; c++) {
    vcase *v = &cs[c];
    memcpy(pix + po * v->patch_dim, v->pix, (size_t)(v->n_patches * v->patch_dim) * sizeof(float));
    memcpy(ref + ro * v->out_hidden, v->ref, (size_t)(v->rows * v->out_hidden) * sizeof(float));
    memcpy(grid + 3 * go, v->grid, (size_t)v->n_grids * 3 * sizeof(int32_t));
    po += v->n_patches, ro += v->rows, go += v->n_grids;
  }
  int rc = run(r, pix, tot_p, cs[0].patch_dim, grid, tot_g, out, tot_r, NULL, err, sizeof err);
  if (rc) printf("  %s\n", err);
  char what[96];
  snprintf(what, sizeof what, "all cases in one call (%d inputs, %lld patches)", tot_g, (long long)tot_p);
  ok(what, !rc);
  if (!rc) compare("  batched", out, ref, tot_r * cs[0].out_hidden);
  free(pix);
  free(ref);
  free(out);
  free(grid);
}

static void expect(const char *what, int rc, int want_rc, const char *err, const char *needle) {
  printf("    -> %s\n", err);
  ok(what, rc == want_rc && strstr(err, needle) != NULL);
}

static void test_bad_input(rig *r, const vcase *v) {
  printf("bad input\n");
  char err[512] = "";
  float *out = malloc((size_t)(MAX_PATCHES * 128) * sizeof(float));
  int32_t g1[3] = {1, 5, 4};
  int rc = run(r, v->pix, 20, v->patch_dim, g1, 1, out, MAX_PATCHES, NULL, err, sizeof err);
  expect("grid h not a multiple of the merge size", rc, ANNA_EINVAL, err, "multiples of the merge size 2");
  int32_t g0[3] = {0, 4, 4};
  rc = run(r, v->pix, 0, v->patch_dim, g0, 1, out, MAX_PATCHES, NULL, err, sizeof err);
  expect("grid t = 0", rc, ANNA_EINVAL, err, "t >= 1");
  int32_t gbig[3] = {1 << 30, 1 << 16, 1 << 16}; /* t*h*w would overflow 64 bits */
  rc = run(r, v->pix, 16, v->patch_dim, gbig, 1, out, MAX_PATCHES, NULL, err, sizeof err);
  expect("grid of 2^62 patches", rc, ANNA_EINVAL, err, "each at most 65536");
  int32_t g2[3] = {1, 4, 4};
  rc = run(r, v->pix, 15, v->patch_dim, g2, 1, out, MAX_PATCHES, NULL, err, sizeof err);
  expect("pixel rows != t*h*w", rc, ANNA_EINVAL, err, "15 pixel rows given, the grids need 16");
  rc = run(r, v->pix, 16, 768, g2, 1, out, MAX_PATCHES, NULL, err, sizeof err);
  expect("pixel rows of the wrong width", rc, ANNA_EINVAL, err, "pixel rows have 768 values, this tower takes 1536");
  int32_t g3[3] = {2, 16, 20};
  rc = run(r, v->pix, 640, v->patch_dim, g3, 1, out, MAX_PATCHES, NULL, err, sizeof err);
  expect("more patches than the state holds", rc, ANNA_ERANGE, err, "more than the state's 512 patches");
  rc = run(r, v->pix, 16, v->patch_dim, g2, 1, out, 3, NULL, err, sizeof err);
  expect("output too small", rc, ANNA_EINVAL, err, "the output holds 3 rows, the grids make 4");
  const model_input in = {.io = MODEL_IO_TOKENS};
  const model_output o = {.io = MODEL_IO_LOGITS};
  rc = r->k->run(r->impl, r->st, r->be, &in, &o, err, sizeof err);
  expect("tokens -> logits refused", rc, ANNA_EUNSUPPORTED, err, "maps pixels to embeddings, not tokens to logits");
  /* the state survived the refusals */
  int64_t w = 0;
  rc = run(r, v->pix, v->n_patches, v->patch_dim, v->grid, v->n_grids, out, MAX_PATCHES, &w, err, sizeof err);
  ok("a good run after the refusals", !rc && w == v->rows);
  if (!rc) compare("  same rows", out, v->ref, v->rows * v->out_hidden);
  free(out);
}

/* Loads dir as the vision kind; returns rc with the message in err. */
static int try_load(const char *dir, char *err, size_t errlen) {
  const model_kind *k = model_kind_by_name("qwen3_5_vision");
  model_source src = {.path = dir};
  void *impl = NULL;
  anna_tuning t;
  tuning_defaults(&t);
  const model_load_params lp = {.tuning = &t};
  int rc = k->load(&impl, &src, &lp, err, errlen);
  if (impl) k->free(impl);
  return rc;
}

/* Writes dir/config.json: the qwen3_5 fixture's config edited by edit(root). */
static void write_config(const char *shared, const char *dir, void (*edit)(json_t *)) {
  char path[1400];
  snprintf(path, sizeof path, "%s/qwen3_5/config.json", shared);
  json_t *root = json_load_file(path, 0, NULL);
  edit(root);
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_dump_file(root, path, JSON_INDENT(1));
  json_decref(root);
}
static void edit_no_vision(json_t *r) {
  json_object_del(r, "vision_config");
}
static void edit_window(json_t *r) {
  json_object_set_new(json_object_get(r, "vision_config"), "window_size", json_integer(112));
}
static void edit_deepstack(json_t *r) {
  json_t *a = json_array();
  json_array_append_new(a, json_integer(1));
  json_object_set_new(json_object_get(r, "vision_config"), "deepstack_visual_indexes", a);
}
static void edit_none(json_t *r) {
  (void)r;
}

static void test_no_tower(const char *shared) {
  printf("models without a (supported) vision tower\n");
  char dir[] = "/tmp/anna_vision_XXXXXX", path[1400], st[PATH_MAX], err[512] = "";
  if (!mkdtemp(dir)) {
    ok("mkdtemp", 0);
    return;
  }
  snprintf(path, sizeof path, "%s/qwen3_5_text", shared);
  int rc = try_load(path, err, sizeof err);
  expect("qwen3_5_text (text-only model_type)", rc, ANNA_EUNSUPPORTED, err, "model_type 'qwen3_5_text' has no Qwen3.5 vision tower");
  model_source src;
  const model_kind *k = NULL;
  rc = model_kind_find(path, &src, &k, err, sizeof err);
  ok("  and the vision probe does not take it", !rc && k && strcmp(k->name, "qwen3_5_vision") &&
                                                    !model_kind_by_name("qwen3_5_vision")->probe(&src));
  snprintf(path, sizeof path, "%s/qwen3_5", shared);
  rc = model_kind_find(path, &src, &k, err, sizeof err);
  ok("qwen3_5 folder: probe accepts, the text decoder comes first",
     !rc && model_kind_by_name("qwen3_5_vision")->probe(&src) && !strcmp(k->name, "text_decoder"));
  write_config(shared, dir, edit_no_vision);
  rc = try_load(dir, err, sizeof err);
  expect("qwen3_5 config without vision_config", rc, ANNA_ENOTFOUND, err, "no vision_config: this model has no vision tower");
  write_config(shared, dir, edit_window);
  rc = try_load(dir, err, sizeof err);
  expect("unsupported vision_config key (window_size)", rc, ANNA_EUNSUPPORTED, err, "vision_config.window_size is not supported");
  write_config(shared, dir, edit_deepstack);
  rc = try_load(dir, err, sizeof err);
  expect("deepstack indexes", rc, ANNA_EUNSUPPORTED, err, "deepstack_visual_indexes");
  /* a vision config over text-only weights: the first tower tensor is named as missing */
  write_config(shared, dir, edit_none);
  snprintf(path, sizeof path, "%s/qwen3_5_text/model.safetensors", shared);
  if (!realpath(path, st)) snprintf(st, sizeof st, "%s", path); /* the link is read from dir */
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  if (symlink(st, path)) printf("  symlink failed\n");
  rc = try_load(dir, err, sizeof err);
  expect("weights without model.visual.*", rc, ANNA_ENOTFOUND, err, "missing tensor 'model.visual.patch_embed.proj.weight'");
  unlink(path);
  snprintf(path, sizeof path, "%s/config.json", dir);
  unlink(path);
  rmdir(dir);
}

static void test_backend_refusal(const char *shared) {
  printf("a backend without the encoder ops\n");
  char path[1400], err[512] = "";
  snprintf(path, sizeof path, "%s/qwen3_5", shared);
  rig r;
  int rc = rig_open(&r, path, 64, err, sizeof err);
  ok("cpu rig", !rc);
  if (!rc) {
    /* the CUDA table as it is today: the encoder entries NULL */
    ops_backend fake = *r.be;
    fake.name = "cuda";
    fake.attention_seg = NULL;
    void *st = NULL;
    const model_state_params sp = {.n_batch = 64};
    rc = r.k->state_create(&st, r.impl, &fake, &sp, err, sizeof err);
    expect("refused with ANNA_EUNSUPPORTED", rc, ANNA_EUNSUPPORTED, err, "vision tower: CUDA ops not implemented yet");
    ok("  no state made", st == NULL);
  }
  rig_close(&r);
}

/* End to end on the language side: the tower's rows over the pad tokens, 3-axis positions
 * (checked against get_rope_index's), the full model's logits for every prompt row within
 * 2e-3, and 6 greedy tokens decoded at next + i as transformers' generate does. */
static void test_e2e(rig *vr, const char *shared, const char *gguf, const char *vdir, const json_t *cases, vcase *cs) {
  char path[1400], err[512] = "";
  if (gguf) snprintf(path, sizeof path, "%s", gguf);
  else snprintf(path, sizeof path, "%s/qwen3_5", shared);
  printf("language side (%s): embedding rows + mRoPE vs transformers logits\n", path);
  const model_kind *td = model_kind_by_name("text_decoder");
  model_source src = {.path = path, .is_gguf = gguf != NULL, .model_type = "qwen3_5", .gguf_arch = "qwen35"};
  anna_tuning t;
  tuning_defaults(&t);
  const model_load_params lp = {.tuning = &t};
  void *impl = NULL, *st = NULL;
  ops_backend *be = NULL;
  ops_model_shape *shape = calloc(1, sizeof *shape);
  int rc = td->load(&impl, &src, &lp, err, sizeof err);
  if (!rc) {
    td->backend_shape(impl, 128, shape);
    const backend_params bp = {.n_threads = 2, .n_batch = 64, .shape = shape, .tuning = &t};
    rc = backend_registry_find("cpu")->create(&bp, &be, err, sizeof err);
  }
  const model_state_params sp = {.n_seq = 1, .n_ctx = 128, .n_batch = 64};
  if (!rc) rc = td->state_create(&st, impl, be, &sp, err, sizeof err);
  if (rc) printf("  %s\n", err);
  ok("text decoder on the same checkpoint", !rc);
  model_desc desc;
  if (!rc) td->describe(impl, &desc);
  for (size_t ci = 0; !rc && ci < json_array_size(cases); ci++) {
    const json_t *c = json_array_get(cases, ci);
    vcase *v = &cs[ci];
    const json_t *ids = json_object_get(c, "prompt_ids"), *types = json_object_get(c, "mm_token_type_ids");
    const json_t *pth = json_object_get(c, "positions_thw"), *greedy = json_object_get(c, "greedy_ids");
    const int32_t n = (int32_t)json_array_size(ids);
    const int V = desc.vocab, H = v->out_hidden;
    int32_t *tok = malloc(sizeof(int32_t) * n), *seq = calloc((size_t)n, sizeof(int32_t)), *pos = malloc(sizeof(int32_t) * n);
    int32_t *pos3 = malloc(sizeof(int32_t) * 3 * n), *eidx = malloc(sizeof(int32_t) * n), run_hw[64];
    int8_t *want = malloc((size_t)n);
    uint8_t *isv = malloc((size_t)n);
    float *rows = malloc(sizeof(float) * (size_t)(v->rows * H)), *lg = malloc(sizeof(float) * (size_t)n * V);
    int64_t ne = 0;
    for (int32_t i = 0; i < n; i++) {
      tok[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
      pos[i] = i, want[i] = 1;
      isv[i] = json_integer_value(json_array_get(types, (size_t)i)) != 0;
      if (isv[i]) eidx[ne++] = i;
    }
    int n_runs = 0;
    for (int g = 0; g < v->n_grids; g++)
      for (int tt = 0; tt < v->grid[3 * g]; tt++) /* a video: one run per temporal group */
        run_hw[2 * n_runs] = v->grid[3 * g + 1], run_hw[2 * n_runs + 1] = v->grid[3 * g + 2], n_runs++;
    int32_t next = -1;
    int prc = vision_qwen35_rope_positions(isv, n, run_hw, n_runs, 2, pos3, &next, err, sizeof err);
    int same = !prc;
    for (int32_t i = 0; same && i < 3 * n; i++)
      same = pos3[i] == json_integer_value(json_array_get(json_array_get(pth, (size_t)(i / n)), (size_t)(i % n)));
    char what[120];
    snprintf(what, sizeof what, "%s: 3-axis positions = get_rope_index's (next %d, delta %d)", v->name, next, next - n);
    ok(what, same && next - n == json_integer_value(json_object_get(c, "rope_delta")));
    int64_t w = 0;
    rc = run(vr, v->pix, v->n_patches, v->patch_dim, v->grid, v->n_grids, rows, v->rows, &w, err, sizeof err);
    ok("  tower rows for the pads", !rc && w == ne);
    if (rc || w != ne) break;
    anna_batch b = {n, tok, seq, pos, want};
    model_input in = {.io = MODEL_IO_TOKENS, .batch = &b, .embd = rows, .embd_idx = eidx, .n_embd = ne, .rope_pos = pos3};
    const model_output o = {.io = MODEL_IO_LOGITS, .logits = lg};
    td->seq->reset(st, 0);
    rc = td->run(impl, st, be, &in, &o, err, sizeof err);
    if (rc) printf("  %s\n", err);
    snprintf(path, sizeof path, "%s/%s.logits.f32", vdir, v->name);
    size_t nb;
    float *ref = read_file(path, &nb);
    double mx = 0, mref = 0;
    for (int64_t i = 0; !rc && ref && nb == sizeof(float) * (size_t)n * V && i < (int64_t)n * V; i++) {
      mx = fmax(mx, fabs((double)lg[i] - ref[i]));
      mref = fmax(mref, fabs((double)ref[i]));
    }
    snprintf(what, sizeof what, "  logits, %d rows: max err %.3g (max |ref| %.3g)", n, mx, mref);
    ok(what, !rc && ref && nb == sizeof(float) * (size_t)n * V && mx <= 2e-3 && mref > 0);
    /* controls: the same prompt with plain positions, or without the tower's rows, must miss
     * the reference (so the comparison above sees both) */
    for (int ctl = 0; ref && !rc && ctl < 2; ctl++) {
      model_input cin = in;
      if (ctl == 0) cin.rope_pos = NULL;
      else cin.n_embd = 0;
      td->seq->reset(st, 0);
      double cx = 0;
      if (!td->run(impl, st, be, &cin, &o, err, sizeof err))
        for (int64_t i = 0; i < (int64_t)n * V; i++) cx = fmax(cx, fabs((double)lg[i] - ref[i]));
      snprintf(what, sizeof what, "  control %s: max err %.3g > 2e-3", ctl ? "without the tower rows" : "with 1-axis positions", cx);
      ok(what, cx > 2e-3);
    }
    td->seq->reset(st, 0);
    rc = td->run(impl, st, be, &in, &o, err, sizeof err); /* back to the real prompt for decoding */
    free(ref);
    /* greedy decode: one token per step at cache position n + i, rope position next + i */
    int32_t g = 0, gp = 0, g3[3], gs = 0;
    int8_t gw = 1;
    float best;
    g = (int32_t)ops_argmax_f32(lg + (int64_t)(n - 1) * V, V, &best);
    int match = 1;
    char got[96] = "";
    for (size_t i = 0; i < json_array_size(greedy); i++) {
      match &= g == json_integer_value(json_array_get(greedy, i));
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", i ? "," : "", g);
      if (i + 1 == json_array_size(greedy)) break;
      gp = n + (int32_t)i;
      g3[0] = g3[1] = g3[2] = next + (int32_t)i;
      anna_batch b1 = {1, &g, &gs, &gp, &gw};
      model_input in1 = {.io = MODEL_IO_TOKENS, .batch = &b1, .rope_pos = g3};
      const model_output o1 = {.io = MODEL_IO_LOGITS, .logits = lg};
      if ((rc = td->run(impl, st, be, &in1, &o1, err, sizeof err))) break;
      g = (int32_t)ops_argmax_f32(lg, V, &best);
    }
    snprintf(what, sizeof what, "  greedy ids = generate's (%s)", got);
    ok(what, !rc && match);
    free(tok), free(seq), free(pos), free(pos3), free(eidx), free(want), free(isv), free(rows), free(lg);
  }
  /* refusals of the language-side extras */
  if (!rc && !gguf) {
    int32_t tk[2] = {1, 2}, sq[2] = {0, 0}, ps[2] = {0, 1}, bad_idx[1] = {2}, p3[6] = {0, 1, 0, 1, 0, 1};
    int8_t wl[2] = {1, 1};
    float row[128] = {0}, *lg = malloc(sizeof(float) * 2 * (size_t)desc.vocab);
    anna_batch b = {2, tk, sq, ps, wl};
    const model_output o = {.io = MODEL_IO_LOGITS, .logits = lg};
    model_input in = {.io = MODEL_IO_TOKENS, .batch = &b, .embd = row, .embd_idx = bad_idx, .n_embd = 1};
    td->seq->reset(st, 0);
    int r2 = td->run(impl, st, be, &in, &o, err, sizeof err);
    expect("embedding row for a batch row out of range", r2, ANNA_EINVAL, err, "replaces batch row 2 of 2");
    free(lg);
    /* a model without mRoPE sections (qwen3) refuses 3-axis positions */
    void *impl2 = NULL, *st2 = NULL;
    ops_backend *be2 = NULL;
    snprintf(path, sizeof path, "%s/qwen3", shared);
    model_source s2 = {.path = path, .model_type = "qwen3"};
    int r3 = td->load(&impl2, &s2, &lp, err, sizeof err);
    if (!r3) {
      td->backend_shape(impl2, 128, shape);
      const backend_params bp = {.n_threads = 2, .n_batch = 64, .shape = shape, .tuning = &t};
      r3 = backend_registry_find("cpu")->create(&bp, &be2, err, sizeof err);
    }
    if (!r3) r3 = td->state_create(&st2, impl2, be2, &sp, err, sizeof err);
    if (!r3) {
      model_desc d2;
      td->describe(impl2, &d2);
      float *lg2 = malloc(sizeof(float) * 2 * (size_t)d2.vocab);
      const model_output o2 = {.io = MODEL_IO_LOGITS, .logits = lg2};
      model_input in2 = {.io = MODEL_IO_TOKENS, .batch = &b, .rope_pos = p3};
      r3 = td->run(impl2, st2, be2, &in2, &o2, err, sizeof err);
      expect("3-axis positions on qwen3 refused", r3, ANNA_EUNSUPPORTED, err, "model_type 'qwen3' has no mRoPE sections");
      free(lg2);
    } else {
      ok("qwen3 loads", 0);
    }
    if (st2) td->state_free(st2);
    if (be2) be2->destroy(be2);
    if (impl2) td->free(impl2);
  }
  free(shape);
  if (st) td->state_free(st);
  if (be) be->destroy(be);
  if (impl) td->free(impl);
}

static double now_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* test_vision --bench DIR [THREADS]: times the tower on DIR (tools/mkfix_vision.py --shape) and
 * checks its rows against transformers' (bench.tower.f32). Not a ctest entry. */
static int bench(const char *dir, int threads) {
  char path[1400], err[512] = "";
  snprintf(path, sizeof path, "%s/bench.json", dir);
  json_t *info = json_load_file(path, 0, NULL);
  if (!info) {
    fprintf(stderr, "cannot read %s\n", path);
    return 1;
  }
  const json_t *g = json_object_get(info, "grid_thw");
  int32_t grid[3];
  for (int j = 0; j < 3; j++) grid[j] = (int32_t)json_integer_value(json_array_get(g, (size_t)j));
  const int64_t n = json_integer_value(json_object_get(info, "n_patches")),
                rows = json_integer_value(json_object_get(info, "tower_rows"));
  const int pd = (int)json_integer_value(json_object_get(info, "patch_dim")),
            oh = (int)json_integer_value(json_object_get(info, "out_hidden"));
  size_t nb, nr;
  snprintf(path, sizeof path, "%s/bench.pix.f32", dir);
  float *pix = read_file(path, &nb);
  snprintf(path, sizeof path, "%s/bench.tower.f32", dir);
  float *ref = read_file(path, &nr);
  if (!pix || !ref || nb != (size_t)(n * pd) * 4 || nr != (size_t)(rows * oh) * 4) {
    fprintf(stderr, "bad bench files in %s\n", dir);
    return 1;
  }
  const model_kind *k = model_kind_by_name("qwen3_5_vision");
  model_source src = {.path = dir};
  anna_tuning t;
  tuning_defaults(&t);
  const model_load_params lp = {.tuning = &t};
  void *impl = NULL, *st = NULL;
  ops_backend *be = NULL;
  ops_model_shape shape;
  int rc = k->load(&impl, &src, &lp, err, sizeof err);
  if (!rc) {
    k->backend_shape(impl, 0, &shape);
    const backend_params bp = {.n_threads = threads, .n_batch = n, .shape = &shape, .tuning = &t};
    rc = backend_registry_find("cpu")->create(&bp, &be, err, sizeof err);
  }
  const model_state_params sp = {.n_batch = (int)n};
  if (!rc) rc = k->state_create(&st, impl, be, &sp, err, sizeof err);
  float *out = malloc((size_t)(rows * oh) * sizeof(float));
  double best = 1e30, cpu = 0, mx = 0, mref = 0;
  for (int it = 0; !rc && it < 4; it++) {
    const double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    const model_input in = {.io = MODEL_IO_PIXELS, .pixels = pix, .n_patches = n, .patch_dim = pd, .n_grids = 1,
                            .grid_thw = grid};
    const model_output o = {.io = MODEL_IO_EMBEDDINGS, .embd = out, .embd_rows = rows};
    rc = k->run(impl, st, be, &in, &o, err, sizeof err);
    const double w = now_s(CLOCK_MONOTONIC) - w0, c = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    if (it > 0 && w < best) best = w, cpu = c; /* the first run pages the weights in */
  }
  for (int64_t i = 0; !rc && i < rows * oh; i++) {
    mx = fmax(mx, fabs((double)out[i] - ref[i]));
    mref = fmax(mref, fabs((double)ref[i]));
  }
  if (rc) fprintf(stderr, "%s\n", err);
  else
    printf("{\"shape\": %s, \"patches\": %lld, \"threads\": %d, \"anna_s\": %.4f, \"anna_cpu_s\": %.4f, "
           "\"transformers_s\": %.4f, \"transformers_cpu_s\": %.4f, \"max_err\": %.3g, \"max_ref\": %.3g}\n",
           json_dumps(json_object_get(info, "shape"), JSON_ENCODE_ANY), (long long)n, threads, best, cpu,
           json_number_value(json_object_get(info, "transformers_s")),
           json_number_value(json_object_get(info, "transformers_cpu_s")), mx, mref);
  free(out), free(pix), free(ref);
  if (st) k->state_free(st);
  if (be) be->destroy(be);
  if (impl) k->free(impl);
  json_decref(info);
  return rc ? 1 : (mx <= 2e-3 ? 0 : 1);
}

int main(int argc, char **argv) {
  if (argc >= 3 && !strcmp(argv[1], "--bench")) return bench(argv[2], argc > 3 ? atoi(argv[3]) : 2);
  if (argc < 3) {
    fprintf(stderr, "usage: test_vision SHARED_FIXTURES_DIR VISION_FIXTURE_DIR | --bench DIR [THREADS]\n");
    return 2;
  }
  const char *shared = argv[1], *vdir = argv[2];
  const model_kind *k = model_kind_by_name("qwen3_5_vision");
  printf("registry\n");
  ok("qwen3_5_vision: pixels -> embeddings, no sequence state",
     k && k->inputs == MODEL_IO_BIT(MODEL_IO_PIXELS) && k->outputs == MODEL_IO_BIT(MODEL_IO_EMBEDDINGS) && !k->seq);
  if (!k) return 1;
  char path[1400], err[512] = "";
  snprintf(path, sizeof path, "%s/expected.json", vdir);
  json_t *root = json_load_file(path, 0, NULL);
  const json_t *cases = json_object_get(root, "cases");
  ok("fixture expected.json has cases", json_array_size(cases) >= 5);
  int n = (int)json_array_size(cases);
  vcase *cs = calloc((size_t)n + 1, sizeof *cs);
  int bad = 0;
  for (int i = 0; i < n; i++) bad |= load_case(vdir, json_array_get(cases, (size_t)i), &cs[i]);
  ok("fixture files read", !bad);
  snprintf(path, sizeof path, "%s/qwen3_5", shared);
  rig r;
  int rc = rig_open(&r, path, MAX_PATCHES, err, sizeof err);
  if (rc) printf("  %s\n", err);
  ok("load + state (512 patches)", !rc);
  if (!rc && !bad) {
    test_exact(&r, cs, n);
    test_bad_input(&r, &cs[0]);
    test_e2e(&r, shared, NULL, vdir, cases, cs);
    /* the same checkpoint converted by llama.cpp (bf16 GGUF; rope.dimension_sections read) */
    snprintf(path, sizeof path, "%s/../gguf/qwen3_5.gguf", vdir);
    if (access(path, R_OK) == 0) test_e2e(&r, shared, path, vdir, cases, cs);
    else ok("GGUF fixture present", 0);
  }
  rig_close(&r);
  test_no_tower(shared);
  test_backend_refusal(shared);
  for (int i = 0; i < n; i++) {
    free(cs[i].pix);
    free(cs[i].ref);
  }
  free(cs);
  json_decref(root);
  printf("%d passed, %d failed\n", g_checks - g_fail, g_fail);
  return g_fail ? 1 : 0;
}
