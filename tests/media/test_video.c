/* test_video: src/media/video.c and the video half of vision_preproc.c against torchcodec and
 * transformers 5.25 (tests/fixtures/vision_video, made by tools/mkfix_vvid.py).
 *   - stream facts (total frames, fps), sampled frame indices, per-group timestamps and their
 *     "<%.1f seconds>" text equal the processor's;
 *   - decoded RGB vs torchcodec's: exact count and max difference reported (same libswscale:
 *     expected bit-exact);
 *   - pixel_values from our decode vs the processor: >= 99.9% within 1/255, grid equal; from
 *     torchcodec's RGB (resize, padding and patch order alone): bit-exact;
 *   - video smart_resize (with and without the per-frame cap) vs the processor's resize on the
 *     published config, including the scale-up and aspect-ratio branches;
 *   - bad input: empty, random bytes, a PNG, an HLS playlist naming a local file, audio-only,
 *     truncated MP4 / WebM, and each limit: an error with a message naming the problem. */
#include "media/video.h"
#include "media/vision_preproc.h"

#include "anna/anna.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    g_checks++;                                                                                    \
    if (!(cond)) {                                                                                 \
      g_fail++;                                                                                    \
      printf("  FAIL %s:%d: ", __FILE__, __LINE__);                                                \
      printf(__VA_ARGS__);                                                                         \
      printf("\n");                                                                                \
    }                                                                                              \
  } while (0)

static uint8_t *read_file(const char *dir, const char *name, size_t *n) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  *n = 0;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = (uint8_t *)malloc(len > 0 ? (size_t)len : 1);
  *n = b && fread(b, 1, (size_t)len, f) == (size_t)len ? (size_t)len : 0;
  fclose(f);
  return b;
}

static double cmp_f32(const float *a, const float *b, int64_t n, double tol, int64_t *within) {
  double mx = 0;
  *within = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= mx)) mx = isnan(d) ? INFINITY : d;
    *within += d <= tol;
  }
  return mx;
}

static void fixture_config(json_t *meta, vision_video_config *vc) {
  vision_video_config_default(vc);
  json_t *size = json_object_get(json_object_get(meta, "fixture_config"), "size");
  vc->pre.min_pixels = json_integer_value(json_object_get(size, "shortest_edge"));
  vc->pre.max_pixels = json_integer_value(json_object_get(size, "longest_edge"));
}

static void test_cases(const char *dir, json_t *meta) {
  json_t *cases = json_object_get(meta, "cases");
  vision_video_config vc;
  fixture_config(meta, &vc);
  CHECK(json_array_size(cases) >= 3, "cases.json lists %zu cases", json_array_size(cases));
  int64_t px_within = 0, px_total = 0;
  double px_max = 0;
  size_t i;
  json_t *c;
  json_array_foreach(cases, i, c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *file = json_string_value(json_object_get(c, "file"));
    char err[256] = "", fn[256];
    size_t n = 0, nref = 0, nrgb = 0;
    uint8_t *data = read_file(dir, file, &n);
    CHECK(data && n > 0, "%s: cannot read", file);
    if (!data) continue;
    media_video v;
    int rc = media_video_decode(data, n, NULL, &v, err, sizeof err);
    CHECK(rc == 0, "%s: decode rc %d: %s", name, rc, err);
    free(data);
    if (rc) continue;
    int64_t total = json_integer_value(json_object_get(c, "total_frames"));
    double fps = json_real_value(json_object_get(c, "fps"));
    json_t *idx = json_object_get(c, "indices");
    CHECK(v.total_frames == total, "%s: total frames %lld, reference %lld", name,
          (long long)v.total_frames, (long long)total);
    CHECK(fabs(v.fps - fps) <= 1e-12 * fps, "%s: fps %.17g, reference %.17g", name, v.fps, fps);
    CHECK(v.n_frames == (int32_t)json_array_size(idx), "%s: %d sampled frames, reference %zu", name,
          v.n_frames, json_array_size(idx));
    int idx_ok = v.n_frames == (int32_t)json_array_size(idx);
    for (int32_t k = 0; idx_ok && k < v.n_frames; k++)
      idx_ok = v.indices[k] == json_integer_value(json_array_get(idx, (size_t)k));
    CHECK(idx_ok, "%s: sampled frame indices differ", name);
    CHECK(v.width == json_integer_value(json_object_get(c, "width")) &&
              v.height == json_integer_value(json_object_get(c, "height")),
          "%s: size %d x %d", name, v.width, v.height);

    /* timestamps per temporal group */
    json_t *ts = json_object_get(c, "timestamps"), *tt = json_object_get(c, "timestamp_text");
    int32_t tp = vc.pre.temporal_patch_size, groups = (v.n_frames + tp - 1) / tp;
    double tsv[1024];
    CHECK(groups == (int32_t)json_array_size(ts) && groups <= 1024, "%s: %d groups, reference %zu",
          name, groups, json_array_size(ts));
    if (groups == (int32_t)json_array_size(ts) && groups <= 1024) {
      vision_video_timestamps(v.indices, v.n_frames, v.fps, tp, tsv);
      for (int32_t g = 0; g < groups; g++) {
        char txt[64];
        double ref = json_real_value(json_array_get(ts, (size_t)g));
        CHECK(tsv[g] == ref, "%s: group %d time %.17g, reference %.17g", name, g, tsv[g], ref);
        CHECK(vision_video_timestamp_text(tsv[g], txt, sizeof txt) > 0 &&
                  !strcmp(txt, json_string_value(json_array_get(tt, (size_t)g))),
              "%s: group %d text %s, reference %s", name, g, txt,
              json_string_value(json_array_get(tt, (size_t)g)));
      }
    }

    /* decoded RGB vs torchcodec */
    snprintf(fn, sizeof fn, "%s.rgb", name);
    uint8_t *rgb = read_file(dir, fn, &nrgb);
    size_t fb = (size_t)v.width * (size_t)v.height * 3;
    CHECK(rgb && nrgb == fb * (size_t)v.n_frames, "%s: reference RGB size %zu", name, nrgb);
    if (rgb && nrgb == fb * (size_t)v.n_frames) {
      size_t same = 0;
      int mx = 0;
      for (size_t k = 0; k < nrgb; k++) {
        int d = abs((int)rgb[k] - (int)v.rgb[k]);
        same += d == 0;
        if (d > mx) mx = d;
      }
      printf("  %s: %lld frames at %.6g fps, sampled %d; RGB vs torchcodec: %zu / %zu equal, "
             "max diff %d\n",
             name, (long long)v.total_frames, v.fps, v.n_frames, same, nrgb, mx);
      CHECK(same == nrgb, "%s: RGB differs from torchcodec's (%zu of %zu equal, max %d)", name,
            same, nrgb, mx);
    }

    /* pixel_values: our frames, then torchcodec's frames */
    snprintf(fn, sizeof fn, "%s.f32", name);
    float *ref = (float *)read_file(dir, fn, &nref);
    json_t *grid = json_object_get(c, "grid_thw");
    for (int src = 0; src < 2 && ref; src++) {
      const uint8_t *frames = src == 0 ? v.rgb : rgb;
      if (!frames || (src == 1 && nrgb != fb * (size_t)v.n_frames)) continue;
      vision_pixels px;
      rc = vision_preproc_video(&vc, frames, v.n_frames, v.width, v.height, &px, err, sizeof err);
      CHECK(rc == 0, "%s: preprocess rc %d: %s", name, rc, err);
      if (rc) continue;
      CHECK(px.grid_t == json_integer_value(json_array_get(grid, 0)) &&
                px.grid_h == json_integer_value(json_array_get(grid, 1)) &&
                px.grid_w == json_integer_value(json_array_get(grid, 2)),
            "%s: grid (%d, %d, %d)", name, px.grid_t, px.grid_h, px.grid_w);
      int64_t cnt = px.n_patches * px.patch_dim, within = 0;
      CHECK(nref == (size_t)cnt * sizeof(float), "%s: reference has %zu bytes, we have %lld values",
            name, nref, (long long)cnt);
      if (nref == (size_t)cnt * sizeof(float)) {
        double mx = cmp_f32(px.values, ref, cnt, 1.0 / 255 + 1e-6, &within);
        if (src == 0) {
          px_within += within, px_total += cnt;
          if (mx > px_max) px_max = mx;
          printf("  %s: pixel_values (our decode) %lld / %lld within 1/255, max %.3g\n", name,
                 (long long)within, (long long)cnt, mx);
        } else {
          int64_t exact = 0;
          cmp_f32(px.values, ref, cnt, 0.0, &exact);
          CHECK(exact == cnt,
                "%s: pixel_values from torchcodec's RGB not bit-exact (%lld / %lld, "
                "max %.3g)",
                name, (long long)exact, (long long)cnt, mx);
        }
      }
      vision_pixels_free(&px);
    }
    /* streaming: decode straight into a builder (no full-size frame buffer) */
    if (ref) {
      size_t nd = 0;
      uint8_t *d2 = read_file(dir, file, &nd);
      vision_video_builder b;
      vision_video_builder_init(&b, &vc);
      media_video_options o;
      media_video_options_default(&o);
      o.frame_cb = vision_video_builder_frame_cb;
      o.frame_user = &b;
      media_video sv;
      vision_pixels px;
      memset(&px, 0, sizeof px);
      rc = d2 ? media_video_decode(d2, nd, &o, &sv, err, sizeof err) : -1;
      CHECK(rc == 0 && sv.rgb == NULL && sv.n_frames == v.n_frames, "%s: streaming decode rc %d %s",
            name, rc, err);
      if (rc == 0) rc = vision_video_builder_finish(&b, &px, err, sizeof err);
      CHECK(rc == 0, "%s: builder finish rc %d %s", name, rc, err);
      int64_t cnt = px.n_patches * px.patch_dim, exact = 0;
      if (rc == 0 && nref == (size_t)cnt * sizeof(float)) cmp_f32(px.values, ref, cnt, 0.0, &exact);
      CHECK(rc == 0 && nref == (size_t)cnt * sizeof(float) && exact == cnt,
            "%s: streamed pixel_values %lld / %lld bit-exact", name, (long long)exact,
            (long long)cnt);
      vision_pixels_free(&px);
      vision_video_builder_free(&b);
      if (rc == 0) media_video_free(&sv);
      free(d2);
    }
    free(ref);
    free(rgb);
    media_video_free(&v);
  }
  printf("  pixel_values over all clips: %lld / %lld within 1/255 (%.5f%%), max %.3g\n",
         (long long)px_within, (long long)px_total,
         px_total ? 100.0 * (double)px_within / (double)px_total : 0.0, px_max);
  CHECK(px_total > 0 && (double)px_within >= 0.999 * (double)px_total,
        "pixel_values within 1/255 on %lld of %lld", (long long)px_within, (long long)px_total);
}

static void test_resize_table(json_t *meta) {
  json_t *tab = json_object_get(meta, "resize_table");
  CHECK(json_array_size(tab) >= 5, "resize_table has %zu rows", json_array_size(tab));
  size_t i;
  json_t *r;
  json_array_foreach(tab, i, r) {
    int32_t n = (int32_t)json_integer_value(json_object_get(r, "n"));
    int64_t h = json_integer_value(json_object_get(r, "h")),
            w = json_integer_value(json_object_get(r, "w"));
    for (int cap = 0; cap < 2; cap++) {
      vision_video_config vc;
      vision_video_config_default(&vc);
      vc.cap_pixels_per_frame = cap;
      json_t *want = json_object_get(r, cap ? "cap" : "nocap");
      int32_t oh = 0, ow = 0;
      char err[256] = "";
      int rc = vision_video_smart_resize(&vc, n, h, w, &oh, &ow, err, sizeof err);
      if (json_is_string(want)) {
        CHECK(rc == ANNA_EINVAL && err[0], "n=%d %lldx%lld cap=%d: want an error (%s), rc %d", n,
              (long long)h, (long long)w, cap, json_string_value(want), rc);
      } else {
        int64_t wh = json_integer_value(json_array_get(want, 0)),
                ww = json_integer_value(json_array_get(want, 1));
        CHECK(rc == 0 && oh == wh && ow == ww,
              "n=%d %lldx%lld cap=%d: %dx%d, processor %lldx%lld (rc %d %s)", n, (long long)h,
              (long long)w, cap, oh, ow, (long long)wh, (long long)ww, rc, err);
      }
    }
  }
  /* fewer frames than the temporal patch: transformers raises */
  vision_video_config vc;
  vision_video_config_default(&vc);
  int32_t oh, ow;
  char err[256] = "";
  CHECK(vision_video_smart_resize(&vc, 1, 64, 64, &oh, &ow, err, sizeof err) == ANNA_EINVAL &&
            strstr(err, "temporal"),
        "1 frame: %s", err);
}

static void test_config(const char *dir) {
  size_t n = 0;
  char *js = (char *)read_file(dir, "video_preprocessor_config.json", &n);
  CHECK(js && n, "cannot read video_preprocessor_config.json");
  if (!js) return;
  vision_video_config a, b;
  vision_video_config_default(&a);
  vision_video_config_default(&b);
  a.fps = 7, a.pre.max_pixels = 1; /* overwritten by the file */
  char err[256] = "";
  int rc = vision_video_config_parse(js, n, &a, err, sizeof err);
  CHECK(rc == 0, "published video_preprocessor_config.json: %s", err);
  CHECK(a.fps == b.fps && a.min_frames == b.min_frames && a.max_frames == b.max_frames &&
            a.pre.min_pixels == b.pre.min_pixels && a.pre.max_pixels == b.pre.max_pixels &&
            a.pre.patch_size == b.pre.patch_size && a.max_video_tokens == b.max_video_tokens &&
            a.cap_pixels_per_frame == 0,
        "published config differs from the defaults");
  free(js);
  const char *bad[][2] = {
      {"{\"fps\": 0}", "fps"},
      {"{\"do_sample_frames\": false}", "do_sample_frames"},
      {"{\"num_frames\": 16}", "num_frames"},
      {"{\"min_frames\": 9, \"max_frames\": 8}", "min_frames"},
      {"{\"cap_pixels_per_frame\": 1}", "cap_pixels_per_frame"},
      {"{\"video_fps\": 2}", "video_fps"},
      {"{\"size\": {\"height\": 2}}", "size.height"},
      {"[1]", "object"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    vision_video_config c;
    vision_video_config_default(&c);
    err[0] = 0;
    rc = vision_video_config_parse(bad[i][0], strlen(bad[i][0]), &c, err, sizeof err);
    CHECK(rc == ANNA_EINVAL && strstr(err, bad[i][1]), "%s: rc %d \"%s\"", bad[i][0], rc, err);
  }
  vision_video_config c;
  vision_video_config_default(&c);
  const char *ok = "{\"cap_pixels_per_frame\": true, \"fps\": 1.5, \"return_metadata\": true}";
  rc = vision_video_config_parse(ok, strlen(ok), &c, err, sizeof err);
  CHECK(rc == 0 && c.cap_pixels_per_frame == 1 && c.fps == 1.5, "%s: rc %d %s", ok, rc, err);
}

static void test_sampling(void) {
  media_video_options o;
  media_video_options_default(&o);
  int64_t idx[8];
  /* numpy: linspace(0, 59, 5).round() = [0, 15, 30, 44, 59] (29.5 -> 30, 14.75 -> 15) */
  CHECK(media_video_sample_count(60, 24.0, &o) == 5, "60 frames at 24 fps: %d",
        media_video_sample_count(60, 24.0, &o));
  media_video_sample_indices(60, 5, idx);
  CHECK(idx[0] == 0 && idx[1] == 15 && idx[2] == 30 && idx[3] == 44 && idx[4] == 59,
        "indices %lld %lld %lld %lld %lld", (long long)idx[0], (long long)idx[1], (long long)idx[2],
        (long long)idx[3], (long long)idx[4]);
  /* half-way values round to even: linspace(0, 5, 3) = [0, 2.5, 5] -> [0, 2, 5] */
  media_video_sample_indices(6, 3, idx);
  CHECK(idx[0] == 0 && idx[1] == 2 && idx[2] == 5, "6 frames, 3 samples: %lld %lld %lld",
        (long long)idx[0], (long long)idx[1], (long long)idx[2]);
  CHECK(media_video_sample_count(3, 10.0, &o) == 3, "3 frames: at most the total");
  CHECK(media_video_sample_count(1000000, 30.0, &o) == 768, "long clip: max_frames");
  CHECK(media_video_sample_count(0, 30.0, &o) == 0, "no frames");
}

static void expect_bad(const char *what, const uint8_t *data, size_t n,
                       const media_video_options *o, const char *needle) {
  media_video v;
  char err[256] = "";
  int rc = media_video_decode(data, n, o, &v, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && err[0] && (!needle || strstr(err, needle)),
        "%s: rc %d, message \"%s\" (want ANNA_EINVAL naming \"%s\")", what, rc, err,
        needle ? needle : "");
  CHECK(v.rgb == NULL && v.indices == NULL && v.n_frames == 0, "%s: output not empty", what);
  printf("  %s -> %s\n", what, err);
}

static int stop_cb(void *user, int32_t slot, int32_t n, const uint8_t *rgb, int32_t w, int32_t h,
                   char *err, size_t errlen) {
  (void)user, (void)n, (void)rgb, (void)w, (void)h;
  if (slot < 2) return 0;
  snprintf(err, errlen, "stop at %d", slot);
  return ANNA_ENOMEM;
}

static void test_bad(const char *dir) {
  char d2[1024];
  snprintf(d2, sizeof d2, "%s/bad", dir);
  size_t n = 0;
  uint8_t junk[4096];
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (uint8_t)(i * 2654435761u >> 13);
  expect_bad("empty", junk, 0, NULL, "empty");
  expect_bad("random bytes", junk, sizeof junk, NULL, "container");
  static const uint8_t png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0,    0,    0,
                                13,   'I', 'H', 'D', 'R',  0,    0,    0,    1,    0,    0,
                                0,    1,   8,   2,   0,    0,    0,    0x90, 0x77, 0x53, 0xde};
  expect_bad("a PNG image", png, sizeof png, NULL, "container");
  /* HLS names other resources: its demuxer must never be reached from a request. */
  static const char hls[] = "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nfile:///etc/passwd\n"
                            "#EXT-X-ENDLIST\n";
  expect_bad("HLS playlist", (const uint8_t *)hls, sizeof hls - 1, NULL, "container");
  const char *files[][2] = {{"audio_only.mp4", "no video stream"},
                            {"truncated.mp4", NULL},
                            {"truncated.webm", NULL},
                            {"truncated_faststart.mp4", NULL}};
  for (int i = 0; i < 4; i++) {
    uint8_t *b = read_file(d2, files[i][0], &n);
    CHECK(b && n, "cannot read bad/%s", files[i][0]);
    if (b) expect_bad(files[i][0], b, n, NULL, files[i][1]);
    free(b);
  }
  /* corrupt.webm: random bytes written over the clip. The VP9 decoder may conceal the damage;
   * what must hold is no crash and no leak, and an error carries a message. */
  uint8_t *b = read_file(d2, "corrupt.webm", &n);
  if (b) {
    media_video v;
    char err[256] = "";
    int rc = media_video_decode(b, n, NULL, &v, err, sizeof err);
    CHECK(rc == 0 || (rc == ANNA_EINVAL && err[0]), "corrupt.webm: rc %d %s", rc, err);
    printf("  corrupt.webm -> rc %d %s\n", rc, rc ? err : "(decoded with concealment)");
    media_video_free(&v);
    free(b);
  }
  /* mutated copies of each clip (deterministic byte overwrites): never a crash or a leak; an
   * error always carries a message (FFmpeg may conceal damage and decode) */
  const char *clips[] = {"h264_96x64.mp4", "vp9_80x60.webm", "h264_bt709full_100x54.mkv"};
  uint32_t seed = 12345;
  int mut_ok = 0, mut_err = 0;
  for (int ci = 0; ci < 3; ci++) {
    uint8_t *orig = read_file(dir, clips[ci], &n);
    if (!orig || n < 64) {
      CHECK(0, "cannot read %s", clips[ci]);
      free(orig);
      continue;
    }
    uint8_t *m = (uint8_t *)malloc(n);
    for (int trial = 0; trial < 24 && m; trial++) {
      memcpy(m, orig, n);
      for (int k = 0; k < 1 + trial % 8; k++) {
        seed = seed * 1664525u + 1013904223u;
        size_t at = (size_t)(seed >> 8) % n;
        seed = seed * 1664525u + 1013904223u;
        m[at] = (uint8_t)(seed >> 24);
      }
      media_video v;
      char err[256] = "";
      int rc = media_video_decode(m, n, NULL, &v, err, sizeof err);
      CHECK(rc == 0 || ((rc == ANNA_EINVAL || rc == ANNA_EUNSUPPORTED) && err[0]),
            "%s mutation %d: rc %d \"%s\"", clips[ci], trial, rc, err);
      if (rc == 0)
        mut_ok++;
      else
        mut_err++;
      media_video_free(&v);
    }
    free(m);
    free(orig);
  }
  printf("  72 mutated clips: %d decoded (damage concealed), %d refused with a message\n", mut_ok,
         mut_err);
  /* a callback that fails stops decoding; its code and message come back */
  {
    uint8_t *g = read_file(dir, "h264_96x64.mp4", &n);
    media_video_options o;
    media_video_options_default(&o);
    o.frame_cb = stop_cb;
    media_video v;
    char err[256] = "";
    int rc = g ? media_video_decode(g, n, &o, &v, err, sizeof err) : -1;
    CHECK(rc == ANNA_ENOMEM && !strcmp(err, "stop at 2"), "frame_cb error: rc %d %s", rc, err);
    CHECK(v.n_frames == 0 && !v.indices, "frame_cb error: output not empty");
    free(g);
  }
  /* limits, on a good clip */
  uint8_t *good = read_file(dir, "h264_96x64.mp4", &n);
  CHECK(good && n, "cannot read h264_96x64.mp4");
  if (!good) return;
  media_video_options o;
  media_video_options_default(&o);
  o.max_bytes = (int64_t)n - 1;
  expect_bad("max_bytes", good, n, &o, "limit of");
  media_video_options_default(&o);
  o.max_pixels = 96 * 64 - 1;
  expect_bad("max_pixels", good, n, &o, "pixels per frame");
  media_video_options_default(&o);
  o.max_duration_s = 2.0;
  expect_bad("max_duration_s", good, n, &o, "limit of 2.000 s");
  media_video_options_default(&o);
  o.limit_frames = 4;
  expect_bad("limit_frames", good, n, &o, "limit of 4 frames");
  media_video_options_default(&o);
  o.sample_fps = 0;
  expect_bad("sample_fps 0", good, n, &o, "sampling options");
  /* the cut-off halves of a good clip: never a crash, errors with a message */
  for (size_t cut = 16; cut < n; cut += n / 7) {
    media_video v;
    char err[256] = "";
    int rc = media_video_decode(good, cut, NULL, &v, err, sizeof err);
    CHECK(rc == ANNA_EINVAL && err[0], "first %zu bytes: rc %d %s", cut, rc, err);
    media_video_free(&v);
  }
  free(good);
}

int main(void) {
  const char *dir = VVID_FIXTURES;
  if (!media_video_available()) {
    media_video v;
    char err[256] = "";
    uint8_t b[4] = {0};
    int rc = media_video_decode(b, sizeof b, NULL, &v, err, sizeof err);
    printf("test_video: built without FFmpeg: %s\n", err);
    return rc == ANNA_EUNSUPPORTED && strstr(err, "libavformat") ? 77 : 1;
  }
  size_t n = 0;
  char *js = (char *)read_file(dir, "cases.json", &n);
  json_error_t je;
  json_t *meta = js ? json_loadb(js, n, 0, &je) : NULL;
  free(js);
  if (!meta) {
    printf("FAIL: cannot load %s/cases.json\n", dir);
    return 1;
  }
  test_sampling();
  test_config(dir);
  test_cases(dir, meta);
  test_resize_table(meta);
  test_bad(dir);
  json_decref(meta);
  printf("test_video: %d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
