/* test_video_api.c: video end to end through the public API (anna.h "Video in prompts") against
 * transformers (tools/mkfix_vision.py --e2e-video -> tests/fixtures/qwen3_5_vision/e2e_video):
 * video FILES -> anna_media_video_decode (FFmpeg, frame sampling, the video processor) -> the
 * chat template with video / image parts -> anna_text_encode_chat_media (timestamps text, pad
 * runs per temporal group) -> anna_context_prefill -> greedy decode. Checks per case: the grids,
 * the preprocessed pixels (within 1/255) and the tower's rows (2e-3) against the processor's and
 * model.visual's, the prompt ids, the last prompt row's logits and every decode step's (2e-3),
 * the greedy ids and the rotary delta; two cases decoding in one batch; and the refusals
 * (limits, corrupt and truncated clips, a video to a text-only model, pads that do not match).
 *
 *   test_video_api MODEL_DIR E2E_VIDEO_DIR TEXT_ONLY_MODEL_DIR BAD_CLIPS_DIR
 * MODEL_DIR: the e2e_video folder with the shared fixture's weights linked in (CMake builds it).
 * Links anna_internal for two test hooks (media_pixels, ctx_vision_encode); the rest is anna.h.
 */
#include "anna/anna.h"
#include "media_device.h"
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
  *n = 0;
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

static double max_err(const float *a, const float *b, size_t n) {
  double e = 0;
  for (size_t i = 0; i < n; i++)
    e = fmax(e, fabs((double)a[i] - b[i]));
  return e;
}

static int32_t argmax(const float *x, int n) {
  int32_t b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

typedef struct vcase {
  const char *name;
  int n_media;
  anna_media *media[4]; /* in placeholder order */
  int32_t *ids, *at;
  size_t n;
  anna_media_ref refs[4];
  int32_t greedy[16];
  int n_gen;
  float *last, *steps;
} vcase;

static int decode_file(anna_media **out, const anna_model *m, const char *dir, const char *f,
                       int video, const anna_video_limits *lim, char *err, size_t errlen) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, f);
  size_t n;
  void *data = read_file(path, &n);
  if (!data) return anna_err(err, errlen, ANNA_EIO, "cannot read %s", path);
  int rc = video ? anna_media_video_decode(out, m, data, n, lim, err, errlen)
                 : anna_media_image_decode(out, m, data, n, 0, err, errlen);
  free(data);
  return rc;
}

int main(int argc, char **argv) {
  media_device md_opt;
  if (argc < 5 || media_device_parse(&md_opt, argc, argv, 5)) {
    fprintf(stderr,
            "usage: test_video_api MODEL_DIR E2E_VIDEO_DIR TEXT_ONLY_MODEL_DIR BAD_DIR [--device D] [--exact] [--tuning S]\n");
    return 2;
  }
  if (media_device_absent(&md_opt)) return 77;
  const char *mdir = argv[1], *edir = argv[2], *bdir = argv[4];
  char err[512], path[4096];
  anna_model *m = NULL;
  anna_text *tx = NULL;
  int rc = anna_model_load(&m, mdir, NULL, err, sizeof err);
  if (rc || (rc = anna_text_open(&tx, mdir, 0, err, sizeof err))) {
    printf("load %s: %s\n", mdir, err);
    return 1;
  }
  printf("api %d, %s\n", ANNA_API_VERSION, anna_model_describe(m));
  ok("api 1.4", ANNA_API_VERSION_MINOR >= 4);
  snprintf(path, sizeof path, "%s/expected.json", edir);
  json_t *exp = json_load_file(path, 0, NULL);
  json_t *cases = json_object_get(exp, "cases");
  const int nc = (int)json_array_size(cases);
  if (!exp || nc != 3) {
    printf("bad %s\n", path);
    return 1;
  }
  const int vocab = anna_model_vocab(m);
  anna_context *ctx = NULL;
  const anna_context_options co = {.n_seq = 2,
                                   .n_ctx = 256,
                                   .n_batch = 32,
                                   .n_threads = 2,
                                   .n_checkpoints = 2,
                                   .device = md_opt.device,
                                   .exact_matmul = md_opt.exact,
                                   .tuning = md_opt.tuning};
  if ((rc = anna_context_create(&ctx, m, &co, err, sizeof err))) {
    printf("%s: %s\n", media_device_missing(rc, err) ? "SKIP" : "context", err);
    return media_device_missing(rc, err) ? 77 : 1;
  }
  anna_vision_info vi;
  anna_model_vision_info(m, &vi, err, sizeof err);
  vcase cs[3];
  memset(cs, 0, sizeof cs);
  int32_t want_delta[3] = {0};
  for (int ci = 0; ci < nc; ci++) {
    const json_t *c = json_array_get(cases, (size_t)ci);
    vcase *v = &cs[ci];
    v->name = json_string_value(json_object_get(c, "name"));
    const json_t *imgs = json_object_get(c, "images"), *vids = json_object_get(c, "videos");
    const json_t *vg = json_object_get(c, "video_grid_thw"), *ig = json_object_get(c, "image_grid_thw");
    size_t ki = 0, kv = 0;
    json_t *msgs = json_object_get(c, "messages"), *msg;
    size_t mi;
    json_array_foreach(msgs, mi, msg) {
      json_t *content = json_object_get(msg, "content"), *part;
      size_t pi;
      if (!json_is_array(content)) continue;
      json_array_foreach(content, pi, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        const int video = !strcmp(type, "video");
        if (!video && strcmp(type, "image")) continue;
        const json_t *g = json_array_get(video ? vg : ig, video ? kv : ki);
        const char *f = json_string_value(json_array_get(video ? vids : imgs, video ? kv++ : ki++));
        anna_media **md = &v->media[v->n_media++];
        rc = decode_file(md, m, edir, f, video, NULL, err, sizeof err);
        if (rc) {
          printf("  %s: %s: %s\n", v->name, f, err);
          ok("media decodes", 0);
          return 1;
        }
        int32_t thw[3];
        anna_media_grid(*md, thw, NULL, NULL);
        int same = anna_media_is_video(*md) == video;
        for (int a = 0; a < 3; a++)
          same &= thw[a] == json_integer_value(json_array_get(g, (size_t)a));
        ok("grid equals the processor's", same);
        const int32_t gh = thw[1] / 2, gw = thw[2] / 2;
        want_delta[ci] += thw[0] * ((gh > gw ? gh : gw) - gh * gw);
        if (!video) continue;
        anna_video_info inf;
        ok("video info", !anna_media_video_info(*md, &inf) && inf.n_groups == thw[0] &&
                             inf.tokens_per_group * thw[0] == anna_media_n_tokens(*md));
        printf("  %s video %s: %d frames at %.3f fps (%.2f s), grid %d x %d x %d, %d tokens, "
               "groups at",
               v->name, f, inf.n_frames, inf.fps, inf.seconds, thw[0], thw[1], thw[2],
               anna_media_n_tokens(*md));
        for (int gi = 0; gi < thw[0]; gi++)
          printf(" %.3f", anna_media_video_group_time(*md, gi));
        printf(" s\n");
        /* the processor's pixels (bytes: mean = std = 0.5) and model.visual's rows */
        size_t nb;
        snprintf(path, sizeof path, "%s/%s.pix.u8", edir, v->name);
        uint8_t *pu = read_file(path, &nb);
        int64_t np;
        int32_t pd;
        const float *px = media_pixels(*md, &np, &pd);
        size_t within = 0, total = (size_t)np * (size_t)pd;
        double pe = 0;
        if (pu && nb == total)
          for (size_t i = 0; i < total; i++) {
            const double d = fabs(px[i] - ((double)pu[i] / 127.5 - 1.0));
            pe = fmax(pe, d);
            within += d <= 2.0 / 255 + 1e-6; /* 1/255 of the [0, 1] range = 2/255 here */
          }
        printf("    pixel_values: %zu / %zu values within 1/255, max |diff| %.3g\n", within, total, pe);
        ok("pixel values equal the processor's (99.9% within 1/255)",
           pu && nb == total && within >= total - total / 1000);
        free(pu);
        snprintf(path, sizeof path, "%s/%s.tower.f32", edir, v->name);
        float *tw = read_file(path, &nb);
        const size_t rows_n = (size_t)anna_media_n_tokens(*md) * (size_t)vi.n_embd;
        float *rows = malloc(sizeof *rows * rows_n);
        rc = ctx_vision_encode(ctx, *md, rows, err, sizeof err);
        const double te = !rc && tw && nb == sizeof(float) * rows_n ? max_err(rows, tw, rows_n) : 1e9;
        printf("    tower rows: max err %.2e\n", te);
        ok("tower rows within 2e-3 of model.visual", te <= 2e-3);
        free(rows);
        free(tw);
      }
    }
    char *mj = json_dumps(msgs, JSON_COMPACT);
    rc = anna_text_encode_chat_media(tx, m, mj, NULL, NULL, v->media, v->n_media, &v->ids, &v->n,
                                     &v->at, err, sizeof err);
    free(mj);
    if (rc) printf("  %s: %s\n", v->name, err);
    const json_t *pids = json_object_get(c, "prompt_ids");
    int same = !rc && v->n == json_array_size(pids);
    for (size_t i = 0; same && i < v->n; i++)
      same = v->ids[i] == json_integer_value(json_array_get(pids, i));
    printf("  %s: %zu prompt ids (transformers %zu)\n", v->name, v->n, json_array_size(pids));
    ok("prompt ids equal Qwen3VLProcessor's (template, timestamps, pad runs)", same);
    for (int i = 0; !rc && i < v->n_media; i++)
      v->refs[i] = (anna_media_ref){v->media[i], v->at[i]};
    const json_t *gi = json_object_get(c, "greedy_ids");
    v->n_gen = (int)json_array_size(gi);
    for (int i = 0; i < v->n_gen; i++)
      v->greedy[i] = (int32_t)json_integer_value(json_array_get(gi, (size_t)i));
    size_t nb;
    snprintf(path, sizeof path, "%s/%s.last_logits.f32", edir, v->name);
    v->last = read_file(path, &nb);
    ok("last logits file", v->last && nb == sizeof(float) * (size_t)vocab);
    snprintf(path, sizeof path, "%s/%s.step_logits.f32", edir, v->name);
    v->steps = read_file(path, &nb);
    ok("step logits file", v->steps && nb == sizeof(float) * (size_t)vocab * (size_t)v->n_gen);
    if (g_fail) return 1;
  }

  float *lg = malloc(sizeof *lg * (size_t)vocab * 2);
  for (int ci = 0; ci < nc; ci++) {
    vcase *v = &cs[ci];
    anna_context_seq_reset(ctx, 0);
    const anna_prompt p = {v->ids, (int32_t)v->n, v->refs, v->n_media};
    rc = anna_context_prefill(ctx, 0, &p, lg, err, sizeof err);
    if (rc) printf("  %s prefill: %s\n", v->name, err);
    ok("prefill", !rc);
    if (md_opt.device && !rc) {
      const double de = media_device_encoder_diff(m, &co, &p, lg, vocab);
      printf("  %s: last-row logits, tower on %s vs tower on the cpu: max diff %.2e\n", v->name, md_opt.device, de);
      ok("tower on the device vs the cpu: last-row logits within 1e-3", de <= 1e-3);
    }
    const double e = max_err(lg, v->last, (size_t)vocab);
    printf("  %s: last-row logits max err %.2e, delta %d (want %d)\n", v->name, e,
           anna_context_seq_rope_delta(ctx, 0), want_delta[ci]);
    ok("last-row logits within 2e-3", e <= 2e-3);
    ok("rope delta: each group as an image", anna_context_seq_rope_delta(ctx, 0) == want_delta[ci]);
    int32_t t = argmax(lg, vocab), pos = (int32_t)v->n, same = 1;
    double es = 0;
    for (int g = 0; g < v->n_gen; g++) {
      same &= t == v->greedy[g];
      es = fmax(es, max_err(lg, v->steps + (size_t)g * (size_t)vocab, (size_t)vocab));
      const int32_t sq = 0;
      const int8_t fl = 1;
      const anna_batch b = {1, &t, &sq, &pos, &fl};
      if (g + 1 < v->n_gen && (rc = anna_context_decode(ctx, &b, lg, err, sizeof err))) break;
      pos++;
      t = argmax(lg, vocab);
    }
    printf("  %s: greedy %s, decode-step logits max err %.2e\n", v->name,
           same && !rc ? "same" : "DIFFERENT", es);
    ok("decode-step logits within 2e-3", es <= 2e-3);
    ok("greedy ids equal transformers'", same && !rc);
  }
  /* video and image+video on two sequences, decode steps in one batch */
  anna_context_seq_reset(ctx, 0);
  int32_t tk[2], pos[2];
  const int pick[2] = {0, 2};
  rc = 0;
  for (int s = 0; s < 2 && !rc; s++) {
    const vcase *v = &cs[pick[s]];
    const anna_prompt p = {v->ids, (int32_t)v->n, v->refs, v->n_media};
    rc = anna_context_prefill(ctx, s, &p, lg, err, sizeof err);
    tk[s] = argmax(lg, vocab);
    pos[s] = (int32_t)v->n;
  }
  int same = !rc;
  double eb = 0;
  for (int g = 0; same && g < 6; g++) {
    for (int s = 0; s < 2; s++) {
      const vcase *v = &cs[pick[s]];
      same &= tk[s] == v->greedy[g];
      if (g > 0)
        eb = fmax(eb, max_err(lg + (size_t)s * (size_t)vocab, v->steps + (size_t)g * (size_t)vocab,
                              (size_t)vocab));
    }
    const int32_t sq[2] = {0, 1};
    const int8_t fl[2] = {1, 1};
    const anna_batch b = {2, tk, sq, pos, fl};
    if ((rc = anna_context_decode(ctx, &b, lg, err, sizeof err))) break;
    for (int s = 0; s < 2; s++) {
      pos[s]++;
      tk[s] = argmax(lg + (size_t)s * (size_t)vocab, vocab);
    }
  }
  printf("  two video sequences in one batch: greedy %s, step logits max err %.2e\n",
         same && !rc ? "same" : "DIFFERENT", eb);
  ok("video + image/video sequences decoding in one batch", same && !rc && eb <= 2e-3);
  anna_vision_stats st;
  anna_context_vision_stats(ctx, &st);
  printf("  vision stats: %lld media, %lld tower runs (%.1f ms), %lld cache hits\n",
         (long long)st.images, (long long)st.tower_runs, st.tower_s * 1e3, (long long)st.cache_hits);

  /* refusals */
  vcase *v = &cs[0];
  anna_context_seq_reset(ctx, 0);
  anna_prompt p = {v->ids, (int32_t)v->n, NULL, 0};
  rc = anna_context_prefill(ctx, 0, &p, NULL, err, sizeof err);
  printf("  video pads without media: %s\n", err);
  ok("video pads without media: EINVAL", rc == ANNA_EINVAL && strstr(err, "video"));
  anna_context_seq_reset(ctx, 0);
  {
    /* the groups' runs cut short: drop the last pad of the second group */
    int32_t *ids2 = malloc(sizeof *ids2 * v->n);
    size_t n2 = 0;
    int seen = 0;
    for (size_t i = 0; i < v->n; i++) {
      if (ids2 && v->ids[i] == 999 && i + 1 < v->n && v->ids[i + 1] != 999 && ++seen == 2) continue;
      ids2[n2++] = v->ids[i];
    }
    p = (anna_prompt){ids2, (int32_t)n2, v->refs, 1};
    rc = anna_context_prefill(ctx, 0, &p, NULL, err, sizeof err);
    printf("  a group one pad short: %s\n", err);
    ok("a group's run that does not match: EINVAL", rc == ANNA_EINVAL);
    free(ids2);
    anna_context_seq_reset(ctx, 0);
  }
  {
    int32_t *ids3 = NULL, *at3 = NULL;
    size_t n3 = 0;
    const char *two = "[{\"role\":\"user\",\"content\":[{\"type\":\"video\"},{\"type\":\"video\"}]}]";
    rc = anna_text_encode_chat_media(tx, m, two, NULL, NULL, v->media, 1, &ids3, &n3, &at3, err,
                                     sizeof err);
    printf("  two video parts, one media: %s\n", err);
    ok("placeholders != media: EINVAL", rc == ANNA_EINVAL && !ids3);
    const char *typed = "[{\"role\":\"user\",\"content\":[{\"type\":\"video\"},{\"type\":\"text\","
                        "\"text\":\"<|video_pad|>\"}]}]";
    rc = anna_text_encode_chat_media(tx, m, typed, NULL, NULL, v->media, 1, &ids3, &n3, &at3, err,
                                     sizeof err);
    printf("  a typed <|video_pad|>: %s\n", err);
    ok("a typed pad: EINVAL", rc == ANNA_EINVAL && !ids3);
    anna_media *swap[2] = {cs[2].media[1], cs[2].media[0]}; /* video where the image goes */
    char *mj = json_dumps(json_object_get(json_array_get(cases, 2), "messages"), JSON_COMPACT);
    rc = anna_text_encode_chat_media(tx, m, mj, NULL, NULL, swap, 2, &ids3, &n3, &at3, err,
                                     sizeof err);
    free(mj);
    printf("  media in the wrong order: %s\n", err);
    ok("a video for an image placeholder: EINVAL", rc == ANNA_EINVAL && !ids3);
  }
  const char *bad[] = {"truncated.mp4", "truncated_faststart.mp4", "truncated.webm", "audio_only.mp4"};
  for (int i = 0; i < 4; i++) {
    anna_media *md = NULL;
    rc = decode_file(&md, m, bdir, bad[i], 1, NULL, err, sizeof err);
    printf("  %s: %s\n", bad[i], err);
    ok("bad clip: EINVAL, nothing returned", rc == ANNA_EINVAL && !md);
  }
  {
    anna_media *md = NULL;
    rc = decode_file(&md, m, edir, "config.json", 1, NULL, err, sizeof err);
    printf("  not a video: %s\n", err);
    ok("not a video: EINVAL", rc == ANNA_EINVAL && !md);
    const anna_video_limits lims[4] = {{.max_bytes = 1000}, {.max_pixels = 1000},
                                       {.max_seconds = 1.0}, {.max_frames = 3}};
    const char *names[4] = {"bytes", "pixels", "duration", "frames"};
    for (int i = 0; i < 4; i++) {
      rc = decode_file(&md, m, edir, "h264_96x64.mp4", 1, &lims[i], err, sizeof err);
      printf("  limit %s: %s\n", names[i], err);
      ok("limit refusal: EINVAL naming the limit", rc == ANNA_EINVAL && !md && strstr(err, "limit"));
    }
    const anna_video_limits loose = {.max_bytes = 1 << 20, .max_pixels = 96 * 64, .max_seconds = 3,
                                     .max_frames = 5};
    rc = decode_file(&md, m, edir, "h264_96x64.mp4", 1, &loose, err, sizeof err);
    ok("limits at the clip's own size pass", !rc && md && anna_media_n_tokens(md) == 18);
    anna_media_free(md);
  }
  anna_model *tm = NULL;
  rc = anna_model_load(&tm, argv[3], NULL, err, sizeof err);
  ok("text-only model loads", !rc);
  if (!rc) {
    anna_media *md = NULL;
    rc = decode_file(&md, tm, edir, "h264_96x64.mp4", 1, NULL, err, sizeof err);
    printf("  text-only model: %s\n", err);
    ok("text-only: video refused with EUNSUPPORTED", rc == ANNA_EUNSUPPORTED && !md);
  }
  anna_model_free(tm);

  for (int ci = 0; ci < nc; ci++) {
    for (int i = 0; i < cs[ci].n_media; i++)
      anna_media_free(cs[ci].media[i]);
    free(cs[ci].ids);
    free(cs[ci].at);
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
