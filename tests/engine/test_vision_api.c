/* test_vision_api.c: images end to end through the public API (anna.h "Images in prompts")
 * against transformers (tools/mkfix_vision.py --e2e -> tests/fixtures/qwen3_5_vision/e2e):
 * image FILES -> anna_media (decode + processor) -> chat template with image parts -> pad
 * expansion -> anna_context_prefill -> greedy decode. Checks per case: the grids, the expanded
 * prompt ids, the last prompt row's logits (2e-3), the greedy ids, the rotary delta; both cases
 * at once on two sequences decoding in one batch; and the refusals (pad runs that do not match,
 * a stray pad, a text-only model).
 *
 *   test_vision_api MODEL_DIR E2E_DIR TEXT_ONLY_MODEL_DIR [--device D] [--exact] [--tuning S]
 * The flags (media_device.h) run the context, tower included, on a device: the same checks
 * against transformers; "--tuning encoder_cpu=1" is the CPU tower beside a device decoder.
 * MODEL_DIR is the e2e folder with the shared fixture's weights and tokenizer linked in (CMake
 * assembles it in the build folder). Uses anna.h only, like the CLI and the server.
 */
#include "anna/anna.h"
#include "media_device.h"

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

typedef struct vcase {
  const char *name;
  int n_img;
  anna_media *media[4];
  int32_t *ids; /* expanded prompt */
  int32_t n;
  anna_media_ref refs[4];
  int32_t greedy[16];
  int n_gen;
  float *last;  /* [vocab] */
  float *steps; /* [n_gen, vocab]: generate's logits per step (step 0 = last) */
} vcase;

/* Renders the messages, expands each pad to its media's tokens (the processor's rule). */
static int build_prompt(const anna_text *tx, const anna_vision_info *vi, const json_t *c, vcase *v,
                        char *err, size_t errlen) {
  char *msgs = json_dumps(json_object_get(c, "messages"), JSON_COMPACT);
  int32_t *ids0 = NULL;
  size_t n0 = 0;
  int rc = anna_text_encode_chat(tx, msgs, NULL, NULL, &ids0, &n0, err, errlen);
  free(msgs);
  if (rc) return rc;
  int64_t total = (int64_t)n0;
  for (int i = 0; i < v->n_img; i++)
    total += anna_media_n_tokens(v->media[i]) - 1;
  v->ids = malloc(sizeof *v->ids * (size_t)total);
  int k = 0;
  int32_t n = 0;
  for (size_t i = 0; i < n0; i++) {
    if (ids0[i] == vi->image_token_id && k < v->n_img) {
      v->refs[k] = (anna_media_ref){v->media[k], n};
      for (int32_t j = 0; j < anna_media_n_tokens(v->media[k]); j++)
        v->ids[n++] = ids0[i];
      k++;
    } else {
      v->ids[n++] = ids0[i];
    }
  }
  free(ids0);
  v->n = n;
  return k == v->n_img ? 0
                       : anna_err(err, errlen, ANNA_EINVAL,
                                  "template wrote %d image pads for %d images", k, v->n_img);
}

static double max_err(const float *a, const float *b, int n) {
  double e = 0;
  for (int i = 0; i < n; i++)
    e = fmax(e, fabs((double)a[i] - b[i]));
  return e;
}

static int32_t argmax(const float *x, int n) {
  int32_t b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

/* Prefill of p on a fresh sequence 0 (no attach: nothing registered) into lg. */
static int fresh_prefill(anna_context *ctx, const int32_t *ids, int32_t n, const anna_media_ref *refs, int nr,
                         float *lg, char *err, size_t errlen) {
  anna_context_seq_reset(ctx, 0);
  const anna_prompt p = {ids, n, refs, nr};
  int rc = anna_context_prefill(ctx, 0, &p, lg, err, errlen);
  anna_context_seq_reset(ctx, 0);
  return rc;
}

/* Attach on sequence 1 with the pads keyed by content, then the rest (media at or after r), the
 * last token, and the logits. *r receives the reused length. */
static int32_t g_attach_delta; /* sequence 1's rotary delta right after the attach */
static int attach_prefill(anna_context *ctx, const int32_t *ids, int32_t n, const anna_media_ref *refs, int nr,
                          int32_t *r, float *lg, char *err, size_t errlen) {
  const anna_prompt p = {ids, n - 1, refs, nr};
  *r = anna_context_prefix_attach_media(ctx, 1, &p, ANNA_PREFIX_REGISTER, err, errlen);
  if (*r < 0) return *r;
  g_attach_delta = anna_context_seq_rope_delta(ctx, 1);
  anna_media_ref rest[4];
  int k = 0;
  for (int i = 0; i < nr; i++)
    if (refs[i].at >= *r) rest[k++] = (anna_media_ref){refs[i].media, refs[i].at - *r};
  const anna_prompt q = {ids + *r, n - *r, rest, k};
  return anna_context_prefill(ctx, 1, &q, lg, err, errlen);
}

/* anna_context_prefix_attach_media on cli_two_images (51 tokens, image pads 20..25 and 28..35)
 * with blocks of 16 and a snapshot at each boundary: the same prompt again reuses 48 tokens (both
 * images) with the full rotary delta; a prompt differing after the second image matches up to
 * 32, inside that image, so it is cut back to a boundary before it (16); another first image of
 * the same grid matches only the text block before it. Each continues to the logits of a fresh
 * prefill (1e-4). */
static void test_prefix_media(anna_model *m, vcase *v, int vocab) {
  char err[512];
  anna_context *ctx = NULL;
  const anna_context_options co = {.n_seq = 2, .n_ctx = 256, .n_batch = 32, .n_threads = 2, .n_checkpoints = 8,
                                   .kv_block_len = 16, .prefix_snapshot_interval = 16};
  int rc = anna_context_create(&ctx, m, &co, err, sizeof err);
  if (rc) {
    printf("  prefix context: %s\n", err);
    ok("prefix context", 0);
    return;
  }
  float *want = malloc(sizeof(float) * (size_t)vocab), *got = malloc(sizeof(float) * (size_t)vocab);
  int32_t r = 0;
  printf("prefix cache with images (%s, pads at %d and %d)\n", v->name, v->refs[0].at, v->refs[1].at);
  /* register: the prompt once on sequence 1, then reset (its blocks and snapshots stay cached) */
  rc = attach_prefill(ctx, v->ids, v->n, v->refs, v->n_img, &r, got, err, sizeof err);
  ok("first attach reuses nothing", !rc && r == 0);
  const int32_t full_delta = anna_context_seq_rope_delta(ctx, 1);
  anna_context_seq_reset(ctx, 1);
  rc = fresh_prefill(ctx, v->ids, v->n, v->refs, v->n_img, want, err, sizeof err);
  if (!rc) rc = attach_prefill(ctx, v->ids, v->n, v->refs, v->n_img, &r, got, err, sizeof err);
  if (rc) printf("  same prompt: %s\n", err);
  printf("  same prompt: reused %d, delta %d (full %d), logits err %.2e\n", r, g_attach_delta, full_delta,
         rc ? 1e9 : max_err(got, want, vocab));
  ok("same image + text: 48 tokens reused with both images' delta",
     !rc && r == 48 && g_attach_delta == full_delta && full_delta != 0 &&
         anna_context_seq_rope_delta(ctx, 1) == full_delta);
  ok("same image + text: logits = a fresh prefill (1e-4)", !rc && max_err(got, want, vocab) <= 1e-4);
  anna_context_seq_reset(ctx, 1);
  /* a text token after the second image differs: the match (32) ends inside that image */
  int32_t *ids2 = malloc(sizeof *ids2 * (size_t)v->n);
  memcpy(ids2, v->ids, sizeof *ids2 * (size_t)v->n);
  const int32_t last_pad = v->refs[1].at + anna_media_n_tokens(v->media[1]) - 1;
  ids2[last_pad + 3] = ids2[last_pad + 3] == 100 ? 101 : 100;
  rc = fresh_prefill(ctx, ids2, v->n, v->refs, v->n_img, want, err, sizeof err);
  if (!rc) rc = attach_prefill(ctx, ids2, v->n, v->refs, v->n_img, &r, got, err, sizeof err);
  if (rc) printf("  other text: %s\n", err);
  printf("  text after image 2 differs: reused %d, delta %d, logits err %.2e\n", r, g_attach_delta,
         rc ? 1e9 : max_err(got, want, vocab));
  ok("a match ending inside an image is cut before it (16, no delta)", !rc && r == 16 && g_attach_delta == 0);
  ok("cut match: logits = a fresh prefill (1e-4)", !rc && max_err(got, want, vocab) <= 1e-4);
  anna_context_seq_reset(ctx, 1);
  /* another first image with the same grid: same token ids, other pixels */
  int32_t thw[3], w = 0, h = 0;
  anna_media_grid(v->media[0], thw, &w, &h);
  uint8_t *px = malloc((size_t)w * (size_t)h * 3);
  for (size_t i = 0; i < (size_t)w * (size_t)h * 3; i++) px[i] = (uint8_t)(i * 2654435761u >> 13);
  const anna_image im = {w, h, 3, (size_t)w * 3, px};
  anna_media *other = NULL;
  rc = anna_media_image_from_pixels(&other, m, &im, err, sizeof err);
  ok("another image of the same size: same tokens", !rc && anna_media_n_tokens(other) == anna_media_n_tokens(v->media[0]));
  anna_media_ref refs3[2] = {{other, v->refs[0].at}, v->refs[1]};
  if (!rc) rc = fresh_prefill(ctx, v->ids, v->n, refs3, 2, want, err, sizeof err);
  if (!rc) rc = attach_prefill(ctx, v->ids, v->n, refs3, 2, &r, got, err, sizeof err);
  if (rc) printf("  other image: %s\n", err);
  printf("  other first image: reused %d, logits err %.2e, vs the first image's %.2e\n", r,
         rc ? 1e9 : max_err(got, want, vocab), rc ? 1e9 : max_err(got, v->last, vocab));
  ok("another image at the same positions: only the text before it is reused", !rc && r == 16);
  ok("another image: logits = a fresh prefill (1e-4), not the first image's",
     !rc && max_err(got, want, vocab) <= 1e-4 && max_err(got, v->last, vocab) > 1e-3);
  anna_media_free(other);
  free(px);
  free(ids2);
  free(want);
  free(got);
  anna_context_free(ctx);
}

int main(int argc, char **argv) {
  media_device md_opt;
  if (argc < 4 || media_device_parse(&md_opt, argc, argv, 4)) {
    fprintf(stderr, "usage: test_vision_api MODEL_DIR E2E_DIR TEXT_ONLY_MODEL_DIR [--device D] [--exact] [--tuning S]\n");
    return 2;
  }
  if (media_device_absent(&md_opt)) return 77;
  const char *mdir = argv[1], *edir = argv[2];
  char err[512], path[4096];
  anna_model *m = NULL;
  anna_text *tx = NULL;
  int rc = anna_model_load(&m, mdir, NULL, err, sizeof err);
  if (rc) {
    printf("load %s: %s\n", mdir, err);
    return 1;
  }
  printf("api %d, %s\n", ANNA_API_VERSION, anna_model_describe(m));
  ok("has vision", anna_model_has_vision(m) == 1);
  anna_vision_info vi;
  rc = anna_model_vision_info(m, &vi, err, sizeof err);
  ok("vision info", !rc && vi.image_token_id == 9 && vi.vision_start_id == 7 &&
                        vi.vision_end_id == 8 && vi.merge_size == 2 && vi.max_pixels == 16384 &&
                        vi.n_embd == 128);
  rc = anna_text_open(&tx, mdir, 0, err, sizeof err);
  if (rc) {
    printf("text: %s\n", err);
    return 1;
  }
  snprintf(path, sizeof path, "%s/expected.json", edir);
  json_t *exp = json_load_file(path, 0, NULL);
  json_t *cases = json_object_get(exp, "cases");
  const int vocab = anna_model_vocab(m);
  vcase cs[3];
  memset(cs, 0, sizeof cs);
  const int nc = (int)json_array_size(cases);
  if (!exp || nc != 3) {
    printf("bad %s\n", path);
    return 1;
  }
  for (int ci = 0; ci < nc; ci++) {
    const json_t *c = json_array_get(cases, (size_t)ci);
    vcase *v = &cs[ci];
    v->name = json_string_value(json_object_get(c, "name"));
    const json_t *imgs = json_object_get(c, "images"), *grids = json_object_get(c, "grid_thw");
    v->n_img = (int)json_array_size(imgs);
    for (int i = 0; i < v->n_img; i++) {
      snprintf(path, sizeof path, "%s/%s", edir,
               json_string_value(json_array_get(imgs, (size_t)i)));
      size_t n;
      void *data = read_file(path, &n);
      rc = data ? anna_media_image_decode(&v->media[i], m, data, n, 0, err, sizeof err) : -1;
      free(data);
      if (rc) {
        printf("  %s: %s\n", path, err);
        ok("image decodes", 0);
        return 1;
      }
      int32_t thw[3];
      anna_media_grid(v->media[i], thw, NULL, NULL);
      const json_t *g = json_array_get(grids, (size_t)i);
      int same = 1;
      for (int a = 0; a < 3; a++)
        same &= thw[a] == json_integer_value(json_array_get(g, (size_t)a));
      printf("  %s image %d: grid %d x %d x %d, %d tokens\n", v->name, i, thw[0], thw[1], thw[2],
             anna_media_n_tokens(v->media[i]));
      ok("grid equals the processor's", same);
    }
    rc = build_prompt(tx, &vi, c, v, err, sizeof err);
    if (rc) printf("  %s: %s\n", v->name, err);
    const json_t *pids = json_object_get(c, "prompt_ids");
    int same = !rc && (size_t)v->n == json_array_size(pids);
    for (int32_t i = 0; same && i < v->n; i++)
      same = v->ids[i] == json_integer_value(json_array_get(pids, (size_t)i));
    ok("prompt ids equal transformers' (template + pad expansion)", same);
    const json_t *gi = json_object_get(c, "greedy_ids");
    v->n_gen = (int)json_array_size(gi);
    for (int i = 0; i < v->n_gen; i++)
      v->greedy[i] = (int32_t)json_integer_value(json_array_get(gi, (size_t)i));
    snprintf(path, sizeof path, "%s/%s.last_logits.f32", edir, v->name);
    size_t nb;
    v->last = read_file(path, &nb);
    ok("last logits file", v->last && nb == sizeof(float) * (size_t)vocab);
    snprintf(path, sizeof path, "%s/%s.step_logits.f32", edir, v->name);
    v->steps = read_file(path, &nb);
    ok("step logits file", v->steps && nb == sizeof(float) * (size_t)vocab * (size_t)v->n_gen);
    if (g_fail) return 1;
  }

  /* one case at a time on sequence 0, then both on sequences 0 and 1 decoding together */
  anna_context *ctx = NULL;
  const anna_context_options co = {.n_seq = 2,
                                   .n_ctx = 256,
                                   .n_batch = 32,
                                   .n_threads = 2,
                                   .n_checkpoints = 2,
                                   .device = md_opt.device,
                                   .exact_matmul = md_opt.exact,
                                   .tuning = md_opt.tuning};
  rc = anna_context_create(&ctx, m, &co, err, sizeof err);
  if (rc && media_device_missing(rc, err)) {
    printf("SKIP: %s\n", err);
    return 77;
  }
  if (rc) {
    printf("context: %s\n", err);
    return 1;
  }
  float *lg = malloc(sizeof *lg * (size_t)vocab * 2);
  const int32_t want_delta[3] = {-3, -7, -7}; /* 2x3 tokens advance 3; + 4x2 tokens advance 4 */
  for (int ci = 0; ci < nc; ci++) {
    vcase *v = &cs[ci];
    anna_context_seq_reset(ctx, 0);
    const anna_prompt p = {v->ids, v->n, v->refs, v->n_img};
    rc = anna_context_prefill(ctx, 0, &p, lg, err, sizeof err);
    if (rc) printf("  %s prefill: %s\n", v->name, err);
    ok("prefill", !rc);
    if (md_opt.device && !rc) {
      const double de = media_device_encoder_diff(m, &co, &p, lg, vocab);
      printf("  %s: last-row logits, tower on %s vs tower on the cpu: max diff %.2e\n", v->name, md_opt.device, de);
      ok("tower on the device vs the cpu: last-row logits within 1e-3", de <= 1e-3);
    }
    double e = 0;
    for (int i = 0; i < vocab; i++)
      e = fmax(e, fabs((double)lg[i] - v->last[i]));
    printf("  %s: %d prompt tokens (n_batch 32: chunks), last-row logits max err %.2e, delta %d\n",
           v->name, v->n, e, anna_context_seq_rope_delta(ctx, 0));
    ok("last-row logits within 2e-3", e <= 2e-3);
    ok("rope delta", anna_context_seq_rope_delta(ctx, 0) == want_delta[ci]);
    int32_t t = argmax(lg, vocab), pos = v->n, same = 1;
    double es = 0;
    for (int g = 0; g < v->n_gen; g++) {
      same &= t == v->greedy[g];
      es = fmax(es, max_err(lg, v->steps + (size_t)g * (size_t)vocab, vocab));
      const int32_t sq = 0;
      const int8_t fl = 1;
      const anna_batch b = {1, &t, &sq, &pos, &fl};
      if (g + 1 < v->n_gen && (rc = anna_context_decode(ctx, &b, lg, err, sizeof err))) break;
      pos++;
      t = argmax(lg, vocab);
    }
    printf("  %s: greedy %s, decode-step logits max err %.2e\n", v->name,
           same && !rc ? "same" : "DIFFERENT", es);
    ok("decode-step logits within 2e-3 (rope delta on every axis)", es <= 2e-3);
    ok("greedy ids equal transformers'", same && !rc);
  }
  /* the later cases met wide.png (and tall.jpg) again: rows from the encoder cache, still exact */
  anna_vision_stats vs;
  anna_context_vision_stats(ctx, &vs);
  printf("  vision stats: %lld images, %lld tower runs (%.1f ms), %lld cache hits\n",
         (long long)vs.images, (long long)vs.tower_runs, vs.tower_s * 1e3,
         (long long)vs.cache_hits);
  ok("encoder cache: 5 images, 2 tower runs, 3 hits",
     vs.images == 5 && vs.tower_runs == 2 && vs.cache_hits == 3);
  ok("encoder cache: 2 misses, 2 entries, the default 256 MiB budget",
     vs.cache_misses == 2 && vs.cache_entries == 2 && vs.cache_budget == (int64_t)256 << 20 &&
         vs.cache_bytes > 0 && vs.cache_evictions == 0);
  /* both sequences: prefill each, then decode steps carrying both rows in one batch */
  anna_context_seq_reset(ctx, 0);
  int32_t tk[2], pos[2];
  for (int s = 0; s < 2; s++) {
    const anna_prompt p = {cs[s].ids, cs[s].n, cs[s].refs, cs[s].n_img};
    rc = anna_context_prefill(ctx, s, &p, lg, err, sizeof err);
    tk[s] = argmax(lg, vocab);
    pos[s] = cs[s].n;
  }
  int same = !rc;
  double eb = 0;
  for (int g = 0; same && g < 6; g++) {
    same = tk[0] == cs[0].greedy[g] && tk[1] == cs[1].greedy[g];
    if (g > 0)
      for (int s = 0; s < 2; s++)
        eb = fmax(eb, max_err(lg + (size_t)s * (size_t)vocab,
                              cs[s].steps + (size_t)g * (size_t)vocab, vocab));
    const int32_t sq[2] = {0, 1};
    const int8_t fl[2] = {1, 1};
    const anna_batch b = {2, tk, sq, pos, fl};
    if ((rc = anna_context_decode(ctx, &b, lg, err, sizeof err))) break;
    for (int s = 0; s < 2; s++) {
      pos[s]++;
      tk[s] = argmax(lg + (size_t)s * (size_t)vocab, vocab);
    }
  }
  printf("  two sequences in one batch: greedy %s, step logits max err %.2e\n",
         same && !rc ? "same" : "DIFFERENT", eb);
  ok("two image sequences decoding in one batch: both greedy runs", same && !rc && eb <= 2e-3);
  /* the delta follows the sequence: copy, reset */
  rc = anna_context_seq_copy(ctx, 0, 1, anna_context_seq_len(ctx, 1), err, sizeof err);
  ok("seq_copy carries the delta", !rc && anna_context_seq_rope_delta(ctx, 0) == -7);
  anna_context_seq_reset(ctx, 1);
  ok("reset clears the delta", anna_context_seq_rope_delta(ctx, 1) == 0);

  /* a prompt in two prefills (split between its images), a checkpoint at the split, a rewind to
   * it: the delta of the first image only, then the second part again gives the same logits */
  {
    vcase *w = &cs[1];
    const int32_t cut = w->refs[1].at - 1;
    anna_context_seq_reset(ctx, 0);
    const anna_prompt p1 = {w->ids, cut, w->refs, 1};
    const anna_media_ref r2 = {w->media[1], w->refs[1].at - cut};
    const anna_prompt p2 = {w->ids + cut, w->n - cut, &r2, 1};
    rc = anna_context_prefill(ctx, 0, &p1, NULL, err, sizeof err);
    if (!rc) rc = anna_context_seq_checkpoint(ctx, 0, err, sizeof err);
    if (!rc) rc = anna_context_prefill(ctx, 0, &p2, lg, err, sizeof err);
    if (rc) printf("  split prefill: %s\n", err);
    const double e1 = rc ? 1e9 : max_err(lg, w->last, vocab);
    const int32_t d_full = anna_context_seq_rope_delta(ctx, 0);
    if (!rc) rc = anna_context_seq_rewind(ctx, 0, cut, err, sizeof err);
    const int32_t d_back = anna_context_seq_rope_delta(ctx, 0);
    if (!rc) rc = anna_context_prefill(ctx, 0, &p2, lg, err, sizeof err);
    const double e2 = rc ? 1e9 : max_err(lg, w->last, vocab);
    printf(
        "  split prefill: logits err %.2e, after rewind + again %.2e; delta %d, after rewind %d\n",
        e1, e2, d_full, d_back);
    ok("prefill in two parts = one (2e-3)", !rc && e1 <= 2e-3);
    ok("rewind between images keeps the first image's delta", d_full == -7 && d_back == -3);
    ok("after the rewind the second part again (2e-3)", !rc && e2 <= 2e-3);
    rc = anna_context_seq_copy(ctx, 1, 0, cut, err, sizeof err);
    ok("seq_copy of a prefix holding one image", !rc && anna_context_seq_rope_delta(ctx, 1) == -3);
    /* copy of a prefix that ends before the images (checkpointed there: the recurrent layers
     * copy only at checkpoints): no delta */
    const int32_t a0 = w->refs[0].at;
    const anna_prompt q1 = {w->ids, a0, NULL, 0};
    const anna_media_ref rr[2] = {{w->media[0], 0}, {w->media[1], w->refs[1].at - a0}};
    const anna_prompt q2 = {w->ids + a0, w->n - a0, rr, 2};
    anna_context_seq_reset(ctx, 0);
    rc = anna_context_prefill(ctx, 0, &q1, NULL, err, sizeof err);
    if (!rc) rc = anna_context_seq_checkpoint(ctx, 0, err, sizeof err);
    if (!rc) rc = anna_context_prefill(ctx, 0, &q2, lg, err, sizeof err);
    const double e3 = rc ? 1e9 : max_err(lg, w->last, vocab);
    if (!rc) rc = anna_context_seq_copy(ctx, 1, 0, a0, err, sizeof err);
    if (rc) printf("  copy before the images: %s\n", err);
    ok("a prompt whose text part came first (2e-3)",
       e3 <= 2e-3 && anna_context_seq_rope_delta(ctx, 0) == -7);
    ok("seq_copy of a prefix before the images: delta 0",
       !rc && anna_context_seq_rope_delta(ctx, 1) == 0);
  }

  /* refusals */
  anna_context_seq_reset(ctx, 0);
  vcase *v = &cs[0];
  anna_media_ref bad = {v->media[0], v->refs[0].at + 1};
  anna_prompt p = {v->ids, v->n, &bad, 1};
  rc = anna_context_prefill(ctx, 0, &p, NULL, err, sizeof err);
  printf("  shifted run: %s\n", err);
  ok("a run that does not match its media: EINVAL", rc == ANNA_EINVAL);
  p = (anna_prompt){v->ids, v->n, NULL, 0};
  rc = anna_context_prefill(ctx, 0, &p, NULL, err, sizeof err);
  printf("  pads without media: %s\n", err);
  ok("pad ids without media: EINVAL", rc == ANNA_EINVAL && strstr(err, "no image covers"));
  anna_context_seq_reset(ctx, 0);
  const int32_t txt[3] = {1, 50, 60};
  p = (anna_prompt){txt, 3, NULL, 0};
  rc = anna_context_prefill(ctx, 0, &p, lg, err, sizeof err);
  ok("text-only prefill",
     !rc && anna_context_seq_len(ctx, 0) == 3 && anna_context_seq_rope_delta(ctx, 0) == 0);
  size_t n;
  snprintf(path, sizeof path, "%s/wide.png", edir);
  void *png = read_file(path, &n);
  anna_media *md = NULL;
  rc = anna_media_image_decode(&md, m, png, n, 1000, err, sizeof err);
  printf("  max_pixels 1000: %s\n", err);
  ok("max_pixels refuses from the header", rc == ANNA_EINVAL && !md);
  rc = anna_media_image_decode(&md, m, png, n / 2, 0, err, sizeof err);
  printf("  truncated: %s\n", err);
  ok("truncated PNG: EINVAL", rc == ANNA_EINVAL && !md);
  anna_model *tm = NULL;
  rc = anna_model_load(&tm, argv[3], NULL, err, sizeof err);
  ok("text-only model loads", !rc);
  if (!rc) {
    ok("text-only: no vision", !anna_model_has_vision(tm));
    rc = anna_media_image_decode(&md, tm, png, n, 0, err, sizeof err);
    printf("  text-only model: %s\n", err);
    ok("text-only: image refused with EUNSUPPORTED", rc == ANNA_EUNSUPPORTED && !md);
  }
  anna_model_free(tm);
  free(png);

  test_prefix_media(m, &cs[2], vocab);

  for (int ci = 0; ci < nc; ci++) {
    for (int i = 0; i < cs[ci].n_img; i++)
      anna_media_free(cs[ci].media[i]);
    free(cs[ci].ids);
    free(cs[ci].last);
    free(cs[ci].steps);
  }
  free(lg);
  json_decref(exp);
  anna_context_free(ctx);
  anna_text_free(tx);
  anna_model_free(m);
  printf("%d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
