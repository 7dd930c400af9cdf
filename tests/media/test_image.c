/* test_image: src/media/ against PIL and transformers 5.25 (tests/fixtures/vision_pre, made by
 * tools/mkfix_vimg.py).
 *   - decoded RGB of every PNG / WebP / GIF fixture equals PIL's convert_to_rgb output exactly;
 *     JPEG within the IDCT difference between libjpeg builds (max and count reported);
 *   - pixel_values from our decode vs the processor: >= 99.9% of values within 1/255, grid_thw
 *     equal; from PIL's RGB (the resize and patch order alone): bit-exact;
 *   - smart_resize grids under the published Qwen3.5 config equal the processor's;
 *   - preprocessor_config.json parsing (published values, unknown keys, bad values);
 *   - bad input: corrupt, truncated, bad magic, empty, 50000 x 50000 headers, zero size,
 *     aspect > 200: each an error with a message naming the problem. */
#include "media/image.h"
#include "media/vision_preproc.h"

#include "anna/anna.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;

#define CHECK(cond, ...)                                                                       \
  do {                                                                                         \
    g_checks++;                                                                                \
    if (!(cond)) {                                                                             \
      g_fail++;                                                                                \
      printf("  FAIL %s:%d: ", __FILE__, __LINE__);                                            \
      printf(__VA_ARGS__);                                                                     \
      printf("\n");                                                                            \
    }                                                                                          \
  } while (0)

static uint8_t *read_file(const char *dir, const char *name, size_t *n) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = (uint8_t *)malloc(len > 0 ? (size_t)len : 1);
  *n = b && fread(b, 1, (size_t)len, f) == (size_t)len ? (size_t)len : 0;
  fclose(f);
  return b;
}

/* Compares pixel_values [n, 3, tp, ps, ps] against the stored t = 0 half [n, 3, ps, ps] for
 * every t. Returns the max |diff|; *within counts values within tol. */
static double cmp_pixels(const vision_pixels *px, const float *ref, int tp, int ps, double tol,
                         int64_t *within, int64_t *total) {
  double mx = 0;
  *within = *total = 0;
  int64_t pp = (int64_t)ps * ps;
  for (int64_t i = 0; i < px->n_patches; i++)
    for (int c = 0; c < 3; c++)
      for (int t = 0; t < tp; t++)
        for (int64_t k = 0; k < pp; k++) {
          float a = px->values[i * px->patch_dim + (c * tp + t) * pp + k];
          float b = ref[(i * 3 + c) * pp + k];
          double d = fabs((double)a - (double)b);
          if (!(d <= mx)) mx = isnan(d) ? INFINITY : d;
          *within += d <= tol;
          (*total)++;
        }
  return mx;
}

static void test_cases(const char *dir, json_t *meta, const vision_preproc_config *cfg) {
  json_t *cases = json_object_get(meta, "cases");
  size_t i;
  json_t *c;
  int64_t jpeg_px = 0, jpeg_off = 0;
  int jpeg_max = 0;
  int64_t all_within = 0, all_total = 0;
  double all_max = 0;
  CHECK(json_array_size(cases) >= 15, "cases.json lists %zu cases", json_array_size(cases));
  json_array_foreach(cases, i, c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *file = json_string_value(json_object_get(c, "file"));
    int W = (int)json_integer_value(json_object_get(c, "width"));
    int H = (int)json_integer_value(json_object_get(c, "height"));
    char fn[512];
    size_t n = 0, nrgb = 0, npv = 0;
    uint8_t *data = read_file(dir, file, &n);
    snprintf(fn, sizeof fn, "%s.rgb", name);
    uint8_t *ref_rgb = read_file(dir, fn, &nrgb);
    snprintf(fn, sizeof fn, "%s.f32", name);
    float *ref_pv = (float *)read_file(dir, fn, &npv);
    CHECK(data && ref_rgb && ref_pv && n && nrgb == (size_t)W * H * 3, "%s: fixture files", name);
    if (!data || !ref_rgb || !ref_pv || nrgb != (size_t)W * H * 3) {
      free(data), free(ref_rgb), free(ref_pv);
      continue;
    }
    char err[256] = "";
    media_image img;
    int rc = media_image_decode(data, n, INT64_C(1) << 26, &img, err, sizeof err);
    CHECK(rc == 0, "%s: decode: %s", name, err);
    if (rc == 0) {
      CHECK(img.width == W && img.height == H, "%s: size %dx%d, PIL %dx%d", name, img.width,
            img.height, W, H);
      int64_t off = 0;
      int mx = 0;
      for (size_t k = 0; k < nrgb && img.width == W && img.height == H; k++) {
        int d = abs((int)img.rgb[k] - (int)ref_rgb[k]);
        off += d != 0;
        if (d > mx) mx = d;
      }
      if (img.format == MEDIA_IMAGE_JPEG) {
        jpeg_px += (int64_t)nrgb, jpeg_off += off;
        if (mx > jpeg_max) jpeg_max = mx;
        /* Both sides are libjpeg-turbo's islow IDCT and fancy upsampling; a different build
         * may differ by an IDCT rounding step. */
        CHECK(mx <= 2, "%s: JPEG RGB differs from PIL by up to %d", name, mx);
      } else {
        CHECK(mx == 0, "%s: RGB differs from PIL in %lld samples (max %d)", name, (long long)off,
              mx);
      }
      printf("  %-28s %s %dx%d: RGB vs PIL: %lld samples differ (max %d)\n", name,
             media_image_format_name(img.format), W, H, (long long)off, mx);
    }
    json_t *g = json_object_get(c, "grid_thw");
    int gt = (int)json_integer_value(json_array_get(g, 0));
    int gh = (int)json_integer_value(json_array_get(g, 1));
    int gw = (int)json_integer_value(json_array_get(g, 2));
    size_t n_ref = npv / sizeof(float);
    /* 1. PIL's RGB through our processor: the resize, normalisation and order, bit-exact. */
    vision_pixels px;
    rc = vision_preproc_image(cfg, ref_rgb, W, H, &px, err, sizeof err);
    CHECK(rc == 0, "%s: preprocess: %s", name, err);
    if (rc == 0) {
      CHECK(px.grid_t == gt && px.grid_h == gh && px.grid_w == gw,
            "%s: grid %d,%d,%d vs processor %d,%d,%d", name, px.grid_t, px.grid_h, px.grid_w, gt,
            gh, gw);
      CHECK(px.patch_dim == 1536 && (size_t)px.n_patches * 768 == n_ref,
            "%s: %lld patches x %d vs %zu reference values", name, (long long)px.n_patches,
            px.patch_dim, n_ref);
      CHECK(vision_pixels_tokens(&px, cfg) == (int64_t)gt * gh * gw / 4, "%s: token count",
            name);
      if ((size_t)px.n_patches * 768 == n_ref) {
        int64_t w_in, tot;
        double mx = cmp_pixels(&px, ref_pv, 2, 16, 0.0, &w_in, &tot);
        CHECK(mx == 0.0, "%s: pixel_values from PIL's RGB differ by %g (%lld of %lld equal)",
              name, mx, (long long)w_in, (long long)tot);
      }
      vision_pixels_free(&px);
    }
    /* 2. Our decode end to end: the bar. */
    if (img.rgb) {
      rc = vision_preproc_image(cfg, img.rgb, img.width, img.height, &px, err, sizeof err);
      CHECK(rc == 0, "%s: preprocess (own decode): %s", name, err);
      if (rc == 0 && (size_t)px.n_patches * 768 == n_ref) {
        int64_t w_in, tot;
        double mx = cmp_pixels(&px, ref_pv, 2, 16, 1.0 / 255.0 + 1e-6, &w_in, &tot);
        all_within += w_in, all_total += tot;
        if (mx > all_max) all_max = mx;
        CHECK((double)w_in >= 0.999 * (double)tot,
              "%s: only %lld of %lld pixel values within 1/255 (max %g)", name,
              (long long)w_in, (long long)tot, mx);
        printf("  %-28s grid %d,%d,%d: pixel_values max |diff| %.5f, %.5f%% within 1/255\n",
               name, gt, gh, gw, mx, 100.0 * (double)w_in / (double)tot);
      }
      vision_pixels_free(&px);
    }
    media_image_free(&img);
    free(data), free(ref_rgb), free(ref_pv);
  }
  printf("  JPEG: %lld of %lld RGB samples differ from PIL (max %d)\n", (long long)jpeg_off,
         (long long)jpeg_px, jpeg_max);
  printf("  all cases: pixel_values max |diff| %.5f, %.5f%% within 1/255 (%lld values)\n",
         all_max, all_total ? 100.0 * (double)all_within / (double)all_total : 0.0,
         (long long)all_total);
}

static void test_grids(json_t *meta) {
  vision_preproc_config d;
  vision_preproc_config_default(&d);
  json_t *grids = json_object_get(meta, "grids_published_config");
  size_t i;
  json_t *g;
  CHECK(json_array_size(grids) >= 5, "published-config grids present");
  json_array_foreach(grids, i, g) {
    int64_t w = json_integer_value(json_object_get(g, "width"));
    int64_t h = json_integer_value(json_object_get(g, "height"));
    json_t *t = json_object_get(g, "grid_thw");
    int32_t rh = 0, rw = 0;
    char err[256];
    int rc = vision_preproc_smart_resize(h, w, 32, d.min_pixels, d.max_pixels, &rh, &rw, err,
                                         sizeof err);
    CHECK(rc == 0 && rh / 16 == json_integer_value(json_array_get(t, 1)) &&
              rw / 16 == json_integer_value(json_array_get(t, 2)),
          "smart_resize %lldx%lld -> %dx%d, processor grid %lld,%lld", (long long)w,
          (long long)h, rw, rh, (long long)json_integer_value(json_array_get(t, 1)),
          (long long)json_integer_value(json_array_get(t, 2)));
  }
}

static void test_config(json_t *meta) {
  vision_preproc_config d, p;
  vision_preproc_config_default(&d);
  vision_preproc_config_default(&p);
  char *txt = json_dumps(json_object_get(meta, "published_config"), 0);
  char err[256] = "";
  int rc = vision_preproc_config_parse(txt, strlen(txt), &p, err, sizeof err);
  free(txt);
  CHECK(rc == 0, "published config parses: %s", err);
  CHECK(p.patch_size == 16 && p.merge_size == 2 && p.temporal_patch_size == 2 &&
            p.min_pixels == 65536 && p.max_pixels == 16777216 && p.image_mean[0] == 0.5f &&
            p.image_std[2] == 0.5f && fabs(p.rescale_factor - 1.0 / 255) < 1e-15,
        "published config values");
  CHECK(!memcmp(&p, &d, sizeof p), "defaults equal the published file");
  static const struct {
    const char *json, *needle;
  } bad[] = {
      {"{\"patch_size\": 16, \"crop_size\": 3}", "crop_size"},
      {"{\"patch_size\": \"16\"}", "patch_size"},
      {"{\"patch_size\": 0}", "patch_size"},
      {"{\"size\": {\"height\": 3, \"width\": 4}}", "size.height"},
      {"{\"size\": {\"shortest_edge\": 10}}", "longest_edge"},
      {"{\"image_std\": [0.5, 0, 0.5]}", "image_std"},
      {"{\"image_mean\": [0.5, 0.5]}", "image_mean"},
      {"{\"resample\": 2}", "resample"},
      {"{\"min_pixels\": 100, \"max_pixels\": 50}", "exceed"},
      {"[1, 2]", "not a JSON object"},
      {"{\"patch_size\": 16", "bad JSON"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    vision_preproc_config t;
    vision_preproc_config_default(&t);
    err[0] = 0;
    rc = vision_preproc_config_parse(bad[i].json, strlen(bad[i].json), &t, err, sizeof err);
    CHECK(rc == ANNA_EINVAL && strstr(err, bad[i].needle), "config %s: rc %d, \"%s\"",
          bad[i].json, rc, err);
    CHECK(!memcmp(&t, &d, sizeof t), "config %s: left unchanged on error", bad[i].json);
  }
  const char *mm = "{\"min_pixels\": 3136, \"max_pixels\": 1003520, \"patch_size\": 14}";
  rc = vision_preproc_config_parse(mm, strlen(mm), &p, err, sizeof err);
  CHECK(rc == 0 && p.min_pixels == 3136 && p.max_pixels == 1003520 && p.patch_size == 14,
        "min_pixels/max_pixels override size: %s", err);
}

/* Decoding must fail with rc and a message containing needle. */
static void expect_bad(const char *what, const uint8_t *d, size_t n, int64_t maxpx, int rc_want,
                       const char *needle) {
  media_image img;
  char err[256] = "";
  int rc = media_image_decode(d, n, maxpx, &img, err, sizeof err);
  CHECK(rc == rc_want && strstr(err, needle) && !img.rgb, "%s: rc %d (%s), \"%s\"", what, rc,
        anna_status_name(rc), err);
  printf("  bad input %-26s -> %s: %s\n", what, anna_status_name(rc), err);
  media_image_free(&img);
}

static void test_bad(const char *dir) {
  static const struct {
    const char *file, *needle;
  } huge[] = {{"bad/png_huge.png", "over the limit"},
              {"bad/jpeg_huge.jpg", "over the limit"},
              {"bad/gif_huge.gif", "over the limit"},
              {"bad/webp_huge_16384.webp", "over the limit"},
              {"bad/png_zero.png", "PNG"}};
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
    size_t n = 0;
    uint8_t *d = read_file(dir, huge[i].file, &n);
    CHECK(d && n, "%s present", huge[i].file);
    if (d) expect_bad(huge[i].file, d, n, 16777216, ANNA_EINVAL, huge[i].needle);
    free(d);
  }
  static const char *good[] = {"jpeg_rgb_97x61.jpg", "jpeg_prog_150x100.jpg",
                               "png_rgb_123x45.png", "png_palette_trns_50x90.png",
                               "webp_lossy_80x60.webp", "webp_lossless_rgba_50x50.webp",
                               "gif_trns_64x48.gif", "gif_interlace_45x70.gif"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    size_t n = 0;
    uint8_t *d = read_file(dir, good[i], &n);
    CHECK(d && n > 64, "%s present", good[i]);
    if (!d || n <= 64) {
      free(d);
      continue;
    }
    char what[128];
    /* Truncated: half the file, then all but the last 32 bytes of the coded data. */
    snprintf(what, sizeof what, "%s cut to half", good[i]);
    expect_bad(what, d, n / 2, 1 << 24, ANNA_EINVAL, "");
    /* Bad magic. */
    uint8_t *m = (uint8_t *)malloc(n);
    memcpy(m, d, n);
    m[1] ^= 0x55;
    snprintf(what, sizeof what, "%s bad magic", good[i]);
    expect_bad(what, m, n, 1 << 24, ANNA_EINVAL, "not recognised");
    /* A limit below the image: refused on the header. */
    snprintf(what, sizeof what, "%s over max_pixels", good[i]);
    expect_bad(what, d, n, 100, ANNA_EINVAL, "over the limit");
    /* Only the first 16 bytes: the header itself cut. */
    snprintf(what, sizeof what, "%s 16 bytes", good[i]);
    expect_bad(what, d, 16, 1 << 24, ANNA_EINVAL, "");
    free(m);
    free(d);
  }
  /* Corrupt: a PNG whose IHDR CRC is wrong, a PNG whose IDAT is garbage, a JPEG without its
   * Huffman tables (bytes after SOI replaced by a bogus marker). */
  size_t n = 0;
  uint8_t *d = read_file(dir, "png_rgb_123x45.png", &n);
  if (d && n > 40) {
    d[29] ^= 0xFF; /* IHDR CRC (8 signature + 8 length/type + 13 data = byte 29) */
    expect_bad("PNG IHDR CRC", d, n, 1 << 24, ANNA_EINVAL, "PNG");
    d[29] ^= 0xFF;
    for (size_t k = 45; k < n - 12; k++) d[k] = (uint8_t)(k * 37);
    expect_bad("PNG IDAT garbage", d, n, 1 << 24, ANNA_EINVAL, "PNG");
  }
  free(d);
  d = read_file(dir, "jpeg_rgb_97x61.jpg", &n);
  if (d && n > 40) {
    d[2] = 0xFF, d[3] = 0x01; /* TEM in place of APP0: no SOF follows properly */
    for (size_t k = 4; k < 40; k++) d[k] = 0xFF;
    expect_bad("JPEG corrupt markers", d, n, 1 << 24, ANNA_EINVAL, "JPEG");
  }
  free(d);
  static const uint8_t junk[] = "hello, this is not an image at all";
  expect_bad("text", junk, sizeof junk - 1, 1 << 24, ANNA_EINVAL, "not recognised");
  expect_bad("empty", junk, 0, 1 << 24, ANNA_EINVAL, "empty");
  /* Aspect > 200: decodes, the processor refuses. */
  d = read_file(dir, "bad/png_aspect_402x2.png", &n);
  media_image img;
  char err[256] = "";
  int rc = d ? media_image_decode(d, n, 1 << 24, &img, err, sizeof err) : -1;
  CHECK(rc == 0, "aspect fixture decodes: %s", err);
  if (rc == 0) {
    vision_preproc_config cfg;
    vision_preproc_config_default(&cfg);
    vision_pixels px;
    rc = vision_preproc_image(&cfg, img.rgb, img.width, img.height, &px, err, sizeof err);
    CHECK(rc == ANNA_EINVAL && strstr(err, "aspect ratio") && !px.values, "aspect 201: %d %s",
          rc, err);
    printf("  bad input %-26s -> %s: %s\n", "402x2 (aspect 201)", anna_status_name(rc), err);
    media_image_free(&img);
  }
  free(d);
  int32_t oh, ow;
  CHECK(vision_preproc_smart_resize(0, 10, 32, 1, 100, &oh, &ow, err, sizeof err) == ANNA_EINVAL,
        "smart_resize of a zero side");
  CHECK(vision_preproc_smart_resize(200, 1, 32, 1, 1 << 20, &oh, &ow, err, sizeof err) == 0,
        "aspect exactly 200 is allowed");
}

/* The white-background composite against values computed with PIL 12's alpha_composite. */
static void test_over_white(void) {
  static const uint8_t v[][3] = {{0, 0, 255},   {0, 255, 0},    {255, 0, 255}, {100, 128, 177},
                                 {100, 1, 254}, {37, 200, 84}, {200, 254, 200}};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    /* independent form: round(v*a/255 + 255*(255-a)/255) up to PIL's 7-bit coefficients */
    double exact = (v[i][0] * v[i][1] + 255.0 * (255 - v[i][1])) / 255.0;
    CHECK(fabs(media_image_over_white(v[i][0], v[i][1]) - exact) <= 0.5 + 1e-9 &&
              media_image_over_white(v[i][0], v[i][1]) == v[i][2],
          "over white (%d, a=%d) = %d, want %d", v[i][0], v[i][1],
          media_image_over_white(v[i][0], v[i][1]), v[i][2]);
  }
}

int main(int argc, char **argv) {
  (void)argc, (void)argv;
  const char *dir = VIMG_FIXTURES;
  size_t n = 0;
  char *txt = (char *)read_file(dir, "cases.json", &n);
  json_error_t je;
  json_t *meta = txt ? json_loadb(txt, n, 0, &je) : NULL;
  free(txt);
  if (!meta) {
    printf("FAIL: cannot read %s/cases.json\n", dir);
    return 1;
  }
  char *cj = (char *)read_file(dir, "preprocessor_config.json", &n);
  vision_preproc_config cfg;
  vision_preproc_config_default(&cfg);
  char err[256] = "";
  int rc = cj ? vision_preproc_config_parse(cj, n, &cfg, err, sizeof err) : -1;
  free(cj);
  CHECK(rc == 0, "fixture preprocessor_config.json: %s", err);
  printf("decode + preprocess vs PIL / transformers %s:\n",
         json_string_value(json_object_get(meta, "transformers")));
  test_over_white();
  test_cases(dir, meta, &cfg);
  test_grids(meta);
  test_config(meta);
  test_bad(dir);
  json_decref(meta);
  printf("test_image: %d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
