/* test_mmproj.c: the Qwen3.5 vision tower from a llama.cpp mmproj GGUF (anna_model_options.mmproj,
 * tests/fixtures/mmproj/qwen3_5.mmproj.gguf, written by llama.cpp's convert_hf_to_gguf.py
 * --mmproj from the shared qwen3_5 fixture: tools/mkfix_mmproj.py).
 *
 *   test_mmproj MODEL_DIR E2E_DIR MMPROJ TEXT_GGUF OTHER_GGUF
 * MODEL_DIR: the e2e HF folder (its own tower); TEXT_GGUF: the qwen3_5 fixture's text model as
 * llama.cpp's converter writes it (bf16); OTHER_GGUF: a text GGUF of hidden size != 128.
 * Checks:
 *  1. HF folder + mmproj: tower rows = the folder's own tower's (1e-5), vision info unchanged,
 *     prompt ids = transformers', last-row logits within 1e-4 of the folder alone (and 2e-3 of
 *     transformers'), greedy ids = transformers'.
 *  2. GGUF text + mmproj: marker ids from the GGUF vocabulary (= the e2e config's 9 / 7 / 8),
 *     processor settings from the mmproj (1024 / 16384: the same grids), prompt ids =
 *     transformers', logits within 1e-4 of the same GGUF with the HF folder's tower (mmproj =
 *     the folder) and of the HF folder path (the fixture's weights are bf16 values, so the bf16
 *     GGUF is exact), greedy ids equal to both and to transformers'.
 *  3. Refusals, each naming the mismatch: an mmproj whose projection width is not the text
 *     model's hidden size, a text model of another family (qwen3.gguf beside OTHER_GGUF), another projector type (the fixture with its type patched), a file
 *     that is not an mmproj, a missing path. */
#include "anna/anna.h"
#include "runtime/model_handle.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;

static void ok(const char *what, int cond) {
  g_checks++;
  if (!cond) {
    printf("  FAIL %s\n", what);
    g_fail++;
  }
}

static void *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *b = malloc((size_t)sz + 1);
  if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
    free(b);
    b = NULL;
  }
  fclose(f);
  *n = (size_t)sz;
  return b;
}

static double max_err(const float *a, const float *b, int n) {
  double e = 0;
  for (int i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - b[i]));
  return e;
}

static int32_t argmax(const float *x, int n) {
  int32_t b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

/* One model's run of the e2e case "one_image": its prompt ids, last-row logits, greedy ids and the
 * tower's rows of the image. */
typedef struct run {
  int32_t ids[512], n, greedy[8];
  float last[1000];
  float rows[64 * 128];
  int n_rows;
  anna_vision_info vi;
} run;

static int run_case(const char *model, const char *mmproj, const char *tmpl_dir, const char *img, const char *msgs,
                    run *r, char *err, size_t errlen) {
  anna_model *m = NULL;
  anna_text *tx = NULL;
  anna_context *ctx = NULL;
  anna_media *md = NULL;
  int32_t *ids0 = NULL;
  size_t n0 = 0, nb = 0;
  void *data = read_file(img, &nb);
  const anna_model_options mo = {.mmproj = mmproj};
  int rc = anna_model_load(&m, model, &mo, err, errlen);
  if (!rc) rc = anna_model_vision_info(m, &r->vi, err, errlen);
  /* the e2e folder's tokenizer and chat template (the GGUF's template renders no image parts;
   * the tokenizer is the same) */
  if (!rc) rc = anna_text_open(&tx, tmpl_dir, 0, err, errlen);
  if (!rc) rc = data ? anna_media_image_decode(&md, m, data, nb, 0, err, errlen) : ANNA_EINVAL;
  if (!rc) rc = anna_text_encode_chat(tx, msgs, NULL, NULL, &ids0, &n0, err, errlen);
  anna_media_ref ref = {md, 0};
  r->n = 0;
  for (size_t i = 0; !rc && i < n0; i++) {
    if (ids0[i] == r->vi.image_token_id) {
      ref.at = r->n;
      for (int32_t j = 0; j < anna_media_n_tokens(md) && r->n < 512; j++) r->ids[r->n++] = ids0[i];
    } else if (r->n < 512) {
      r->ids[r->n++] = ids0[i];
    }
  }
  const anna_context_options co = {.n_seq = 1, .n_ctx = 256, .n_batch = 32, .n_threads = 2};
  if (!rc) rc = anna_context_create(&ctx, m, &co, err, errlen);
  if (!rc) {
    r->n_rows = anna_media_n_tokens(md);
    rc = r->n_rows <= 64 ? ctx_vision_encode(ctx, md, r->rows, err, errlen) : ANNA_ERANGE;
  }
  const anna_prompt p = {r->ids, r->n, &ref, 1};
  if (!rc) rc = anna_context_prefill(ctx, 0, &p, r->last, err, errlen);
  float lg[1000];
  memcpy(lg, r->last, sizeof lg);
  int32_t pos = r->n;
  for (int g = 0; !rc && g < 8; g++) {
    int32_t t = argmax(lg, 1000);
    r->greedy[g] = t;
    const int32_t sq = 0;
    const int8_t fl = 1;
    const anna_batch b = {1, &t, &sq, &pos, &fl};
    if (g + 1 < 8) rc = anna_context_decode(ctx, &b, lg, err, errlen);
    pos++;
  }
  free(ids0);
  free(data);
  anna_media_free(md);
  anna_context_free(ctx);
  anna_text_free(tx);
  anna_model_free(m);
  return rc;
}

static int load_err(const char *model, const char *mmproj, char *err, size_t errlen) {
  anna_model *m = NULL;
  const anna_model_options mo = {.mmproj = mmproj};
  int rc = anna_model_load(&m, model, &mo, err, errlen);
  anna_model_free(m);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: test_mmproj MODEL_DIR E2E_DIR MMPROJ TEXT_GGUF OTHER_GGUF\n");
    return 2;
  }
  const char *mdir = argv[1], *edir = argv[2], *mmproj = argv[3], *gguf = argv[4], *other = argv[5];
  char err[512], path[4096], img[4096];
  snprintf(path, sizeof path, "%s/expected.json", edir);
  json_t *exp = json_load_file(path, 0, NULL);
  const json_t *c = json_array_get(json_object_get(exp, "cases"), 0);
  if (!c || strcmp(json_string_value(json_object_get(c, "name")), "one_image")) {
    printf("bad %s\n", path);
    return 1;
  }
  char *msgs = json_dumps(json_object_get(c, "messages"), JSON_COMPACT);
  snprintf(img, sizeof img, "%s/%s", edir, json_string_value(json_array_get(json_object_get(c, "images"), 0)));
  const json_t *pids = json_object_get(c, "prompt_ids"), *gids = json_object_get(c, "greedy_ids");
  size_t nb;
  snprintf(path, sizeof path, "%s/one_image.last_logits.f32", edir);
  float *hf_last = read_file(path, &nb);
  if (!hf_last || nb != sizeof(float) * 1000) {
    printf("bad %s\n", path);
    return 1;
  }
  static run base, hfm, gm, gf;
  int rc;
#define RUN(r, model, mp)                                                                                              \
  do {                                                                                                               \
    rc = run_case(model, mp, mdir, img, msgs, r, err, sizeof err);                                                   \
    if (rc) printf("  %s + %s: %s\n", model, mp ? mp : "(own tower)", err);                                          \
    ok("run " #r, !rc);                                                                                              \
    if (rc) return 1;                                                                                                \
  } while (0)
  RUN(&base, mdir, NULL);
  RUN(&hfm, mdir, mmproj);
  RUN(&gm, gguf, mmproj);
  RUN(&gf, gguf, mdir);

  /* 1. HF folder + mmproj */
  int same_ids = hfm.n == (int)json_array_size(pids) && gm.n == hfm.n && gf.n == hfm.n;
  for (int i = 0; same_ids && i < hfm.n; i++)
    same_ids = hfm.ids[i] == json_integer_value(json_array_get(pids, (size_t)i)) && gm.ids[i] == hfm.ids[i] &&
               gf.ids[i] == hfm.ids[i];
  ok("prompt ids (folder + mmproj, GGUF + mmproj, GGUF + folder tower) = transformers'", same_ids);
  const double e_rows = hfm.n_rows == base.n_rows ? max_err(hfm.rows, base.rows, base.n_rows * 128) : 1e9;
  const double e_base = max_err(hfm.last, base.last, 1000), e_hf = max_err(hfm.last, hf_last, 1000);
  printf("  folder + mmproj: %d tower rows, max err vs the folder's tower %.2e; logits vs the folder %.2e, vs "
         "transformers %.2e\n",
         hfm.n_rows, e_rows, e_base, e_hf);
  ok("tower rows from the mmproj = the folder's (1e-5)", e_rows <= 1e-5);
  ok("logits within 1e-4 of the folder alone", e_base <= 1e-4);
  ok("logits within 2e-3 of transformers'", e_hf <= 2e-3);
  int same_g = 1;
  for (int g = 0; g < 8; g++) same_g &= hfm.greedy[g] == json_integer_value(json_array_get(gids, (size_t)g));
  ok("greedy ids (folder + mmproj) = transformers'", same_g);
  ok("vision info unchanged", !memcmp(&hfm.vi, &base.vi, sizeof base.vi));

  /* 2. GGUF text + mmproj vs the same GGUF with the folder's tower */
  printf("  gguf + mmproj: ids image %d start %d end %d, pixels %lld..%lld, n_embd %d\n", gm.vi.image_token_id,
         gm.vi.vision_start_id, gm.vi.vision_end_id, (long long)gm.vi.min_pixels, (long long)gm.vi.max_pixels,
         gm.vi.n_embd);
  ok("GGUF vocabulary markers = the e2e config's", gm.vi.image_token_id == base.vi.image_token_id &&
                                                       gm.vi.vision_start_id == base.vi.vision_start_id &&
                                                       gm.vi.vision_end_id == base.vi.vision_end_id);
  ok("processor from the mmproj metadata", gm.vi.min_pixels == 1024 && gm.vi.max_pixels == 16384 &&
                                               gm.vi.merge_size == 2 && gm.vi.patch_size == 16 && gm.vi.n_embd == 128);
  const double e_g = max_err(gm.last, gf.last, 1000), e_gr = max_err(gm.rows, gf.rows, gf.n_rows * 128);
  int same_gg = 1, same_gt = 1;
  for (int g = 0; g < 8; g++) {
    same_gg &= gm.greedy[g] == gf.greedy[g];
    same_gt &= gm.greedy[g] == json_integer_value(json_array_get(gids, (size_t)g));
  }
  printf("  gguf + mmproj vs gguf + folder tower: rows %.2e, logits %.2e, greedy %s (vs transformers': %s)\n", e_gr, e_g,
         same_gg ? "same" : "DIFFERENT", same_gt ? "same" : "different");
  ok("GGUF + mmproj: tower rows = the folder tower's (1e-5)", e_gr <= 1e-5);
  ok("GGUF + mmproj: logits within 1e-4 of GGUF + folder tower", e_g <= 1e-4);
  ok("GGUF + mmproj: greedy ids equal", same_gg);
  /* the fixture's weights are bf16 values stored as f32, so the converter's bf16 text GGUF is exact:
   * the GGUF path also matches the HF folder path itself */
  const double e_gb = max_err(gm.last, base.last, 1000);
  printf("  gguf + mmproj vs the HF folder: logits %.2e\n", e_gb);
  ok("GGUF + mmproj: logits within 1e-4 of the HF folder path", e_gb <= 1e-4);
  ok("GGUF + mmproj: greedy ids = transformers'", same_gt);

  /* 3. refusals */
  rc = load_err(other, mmproj, err, sizeof err);
  printf("  other text model: %s\n", err);
  ok("hidden size mismatch: EINVAL naming both widths",
     rc == ANNA_EINVAL && strstr(err, "projection_dim") && strstr(err, "128") && strstr(err, "96"));
  snprintf(path, sizeof path, "%s", other);
  char *slash = strrchr(path, '/');
  if (slash) snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "qwen3.gguf");
  rc = load_err(path, mmproj, err, sizeof err);
  printf("  qwen3 text model: %s\n", err);
  ok("a text model of another family: EUNSUPPORTED naming it", rc == ANNA_EUNSUPPORTED && strstr(err, "'qwen3'"));
  size_t n;
  char *b = read_file(mmproj, &n);
  char *hit = NULL;
  for (size_t i = 0; b && i + 14 <= n && !hit; i++)
    if (!memcmp(b + i, "qwen3vl_merger", 14)) hit = b + i;
  ok("fixture holds the projector type", hit != NULL);
  if (hit) {
    memcpy(hit, "qwen2vl_merger", 14);
    snprintf(path, sizeof path, "test_mmproj_patched.gguf");
    FILE *f = fopen(path, "wb");
    const int wrote = f && fwrite(b, 1, n, f) == n;
    if (f) fclose(f);
    rc = wrote ? load_err(gguf, path, err, sizeof err) : -1;
    printf("  qwen2vl_merger: %s\n", err);
    ok("another projector type: EUNSUPPORTED naming it", rc == ANNA_EUNSUPPORTED && strstr(err, "qwen2vl_merger"));
    remove(path);
  }
  free(b);
  rc = load_err(gguf, gguf, err, sizeof err);
  printf("  text GGUF as mmproj: %s\n", err);
  ok("a text GGUF as mmproj: EFORMAT, not an mmproj", rc == ANNA_EFORMAT && strstr(err, "not an mmproj"));
  rc = load_err(gguf, "/nonexistent/x.mmproj.gguf", err, sizeof err);
  printf("  missing: %s\n", err);
  ok("a missing mmproj: ENOTFOUND naming it", rc == ANNA_ENOTFOUND && strstr(err, "/nonexistent/x.mmproj.gguf"));
  free(hf_last);
  free(msgs);
  json_decref(exp);
  printf("%d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
