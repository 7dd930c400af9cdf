/* vision_preproc.c: Qwen2-VL / Qwen3.5 image preprocessing (see vision_preproc.h). */
#include "media/vision_preproc.h"

#include "base/error.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void vision_preproc_config_default(vision_preproc_config *c) {
  memset(c, 0, sizeof *c);
  c->patch_size = 16;
  c->merge_size = 2;
  c->temporal_patch_size = 2;
  c->min_pixels = 65536;
  c->max_pixels = 16777216;
  c->rescale_factor = 1.0 / 255.0;
  for (int i = 0; i < 3; i++) c->image_mean[i] = 0.5f, c->image_std[i] = 0.5f;
  c->do_resize = c->do_rescale = c->do_normalize = c->do_convert_rgb = 1;
}

/* Keys that describe the file rather than the processing: accepted, no effect. */
static const char *const k_info_keys[] = {"processor_class", "image_processor_type", "auto_map",
                                          "_processor_class", NULL};

static int get_int(json_t *v, const char *key, int64_t lo, int64_t hi, int64_t *out, char *err,
                   size_t errlen) {
  if (!json_is_integer(v))
    return anna_err(err, errlen, ANNA_EINVAL, "preprocessor_config: %s must be an integer", key);
  int64_t x = json_integer_value(v);
  if (x < lo || x > hi)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "preprocessor_config: %s = %lld is out of range [%lld, %lld]", key,
                    (long long)x, (long long)lo, (long long)hi);
  *out = x;
  return 0;
}

static int get_bool(json_t *v, const char *key, int *out, char *err, size_t errlen) {
  if (!json_is_boolean(v))
    return anna_err(err, errlen, ANNA_EINVAL, "preprocessor_config: %s must be true or false", key);
  *out = json_is_true(v);
  return 0;
}

static int get_triple(json_t *v, const char *key, int positive, float out[3], char *err,
                      size_t errlen) {
  float t[3];
  if (json_is_number(v)) {
    t[0] = t[1] = t[2] = (float)json_number_value(v);
  } else if (json_is_array(v) && json_array_size(v) == 3) {
    for (int i = 0; i < 3; i++) {
      json_t *e = json_array_get(v, (size_t)i);
      if (!json_is_number(e))
        return anna_err(err, errlen, ANNA_EINVAL, "preprocessor_config: %s[%d] is not a number",
                        key, i);
      t[i] = (float)json_number_value(e);
    }
  } else {
    return anna_err(err, errlen, ANNA_EINVAL,
                    "preprocessor_config: %s must be a number or an array of 3 numbers", key);
  }
  for (int i = 0; i < 3; i++)
    if (!isfinite(t[i]) || (positive && !(t[i] > 0)))
      return anna_err(err, errlen, ANNA_EINVAL, "preprocessor_config: %s[%d] = %g is invalid",
                      key, i, (double)t[i]);
  memcpy(out, t, sizeof t);
  return 0;
}

static int parse_keys(json_t *root, vision_preproc_config *c, char *err, size_t errlen) {
  const char *key;
  json_t *v;
  int64_t x;
  int rc;
  int64_t min_override = -1, max_override = -1;
  json_object_foreach(root, key, v) {
    if (!strcmp(key, "patch_size")) {
      if ((rc = get_int(v, key, 1, 1024, &x, err, errlen))) return rc;
      c->patch_size = (int32_t)x;
    } else if (!strcmp(key, "merge_size")) {
      if ((rc = get_int(v, key, 1, 64, &x, err, errlen))) return rc;
      c->merge_size = (int32_t)x;
    } else if (!strcmp(key, "temporal_patch_size")) {
      if ((rc = get_int(v, key, 1, 64, &x, err, errlen))) return rc;
      c->temporal_patch_size = (int32_t)x;
    } else if (!strcmp(key, "min_pixels")) {
      if ((rc = get_int(v, key, 1, INT64_C(1) << 40, &min_override, err, errlen))) return rc;
    } else if (!strcmp(key, "max_pixels")) {
      if ((rc = get_int(v, key, 1, INT64_C(1) << 40, &max_override, err, errlen))) return rc;
    } else if (!strcmp(key, "size")) {
      if (!json_is_object(v))
        return anna_err(err, errlen, ANNA_EINVAL, "preprocessor_config: size must be an object");
      const char *sk;
      json_t *sv;
      int have_short = 0, have_long = 0;
      json_object_foreach(v, sk, sv) {
        if (!strcmp(sk, "shortest_edge")) {
          if ((rc = get_int(sv, "size.shortest_edge", 1, INT64_C(1) << 40, &c->min_pixels, err,
                            errlen)))
            return rc;
          have_short = 1;
        } else if (!strcmp(sk, "longest_edge")) {
          if ((rc = get_int(sv, "size.longest_edge", 1, INT64_C(1) << 40, &c->max_pixels, err,
                            errlen)))
            return rc;
          have_long = 1;
        } else {
          return anna_err(err, errlen, ANNA_EINVAL,
                          "preprocessor_config: size.%s is not supported (this processor takes "
                          "size.shortest_edge and size.longest_edge, both pixel counts)",
                          sk);
        }
      }
      if (!have_short || !have_long)
        return anna_err(err, errlen, ANNA_EINVAL,
                        "preprocessor_config: size must hold both shortest_edge and longest_edge");
    } else if (!strcmp(key, "image_mean")) {
      if ((rc = get_triple(v, key, 0, c->image_mean, err, errlen))) return rc;
    } else if (!strcmp(key, "image_std")) {
      if ((rc = get_triple(v, key, 1, c->image_std, err, errlen))) return rc;
    } else if (!strcmp(key, "rescale_factor")) {
      if (!json_is_number(v) || !(json_number_value(v) > 0))
        return anna_err(err, errlen, ANNA_EINVAL,
                        "preprocessor_config: rescale_factor must be a positive number");
      c->rescale_factor = json_number_value(v);
    } else if (!strcmp(key, "resample")) {
      if ((rc = get_int(v, key, 0, 5, &x, err, errlen))) return rc;
      if (x != 3)
        return anna_err(err, errlen, ANNA_EINVAL,
                        "preprocessor_config: resample = %lld is not supported (only 3, bicubic)",
                        (long long)x);
    } else if (!strcmp(key, "do_resize")) {
      if ((rc = get_bool(v, key, &c->do_resize, err, errlen))) return rc;
    } else if (!strcmp(key, "do_rescale")) {
      if ((rc = get_bool(v, key, &c->do_rescale, err, errlen))) return rc;
    } else if (!strcmp(key, "do_normalize")) {
      if ((rc = get_bool(v, key, &c->do_normalize, err, errlen))) return rc;
    } else if (!strcmp(key, "do_convert_rgb")) {
      int b = 1;
      if ((rc = get_bool(v, key, &b, err, errlen))) return rc;
      /* The decoder always yields RGB; a model asking for anything else is not supported. */
      if (!b)
        return anna_err(err, errlen, ANNA_EINVAL,
                        "preprocessor_config: do_convert_rgb = false is not supported");
    } else {
      int info = 0;
      for (int i = 0; k_info_keys[i]; i++) info |= !strcmp(key, k_info_keys[i]);
      if (!info)
        return anna_err(err, errlen, ANNA_EINVAL, "preprocessor_config: unknown key \"%s\"",
                        key);
    }
  }
  /* transformers: min_pixels / max_pixels, when given, override size. */
  if (min_override > 0) c->min_pixels = min_override;
  if (max_override > 0) c->max_pixels = max_override;
  if (c->min_pixels > c->max_pixels)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "preprocessor_config: min pixels %lld exceed max pixels %lld",
                    (long long)c->min_pixels, (long long)c->max_pixels);
  return 0;
}

int vision_preproc_config_parse(const char *json, size_t n, vision_preproc_config *c, char *err,
                                size_t errlen) {
  json_error_t je;
  json_t *root = json_loadb(json, n, 0, &je);
  if (!root)
    return anna_err(err, errlen, ANNA_EINVAL, "preprocessor_config: bad JSON at line %d: %s",
                    je.line, je.text);
  vision_preproc_config t = *c;
  int rc = json_is_object(root)
               ? parse_keys(root, &t, err, errlen)
               : anna_err(err, errlen, ANNA_EINVAL, "preprocessor_config: not a JSON object");
  json_decref(root);
  if (rc == 0) *c = t;
  return rc;
}

int vision_preproc_smart_resize(int64_t h, int64_t w, int32_t factor, int64_t min_pixels,
                                int64_t max_pixels, int32_t *out_h, int32_t *out_w, char *err,
                                size_t errlen) {
  if (h <= 0 || w <= 0 || factor <= 0)
    return anna_err(err, errlen, ANNA_EINVAL, "image size %lld x %lld is empty", (long long)w,
                    (long long)h);
  double hi = (double)(h > w ? h : w), lo = (double)(h > w ? w : h);
  if (hi / lo > 200)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "image aspect ratio %.1f (%lld x %lld) is above the limit of 200",
                    hi / lo, (long long)w, (long long)h);
  double F = factor;
  /* Python's round() ties to even: rint under the default rounding mode. */
  double hb = rint((double)h / F) * F, wb = rint((double)w / F) * F;
  if (hb * wb > (double)max_pixels) {
    double beta = sqrt((double)(h * w) / (double)max_pixels);
    hb = fmax(F, floor((double)h / beta / F) * F);
    wb = fmax(F, floor((double)w / beta / F) * F);
  } else if (hb * wb < (double)min_pixels) {
    double beta = sqrt((double)min_pixels / (double)(h * w));
    hb = ceil((double)h * beta / F) * F;
    wb = ceil((double)w * beta / F) * F;
  }
  if (hb > 1 << 30 || wb > 1 << 30 || hb < F || wb < F)
    return anna_err(err, errlen, ANNA_EINVAL, "image size %lld x %lld resizes to %.0f x %.0f",
                    (long long)w, (long long)h, wb, hb);
  *out_h = (int32_t)hb, *out_w = (int32_t)wb;
  return 0;
}

/* ---- torch's antialiased bicubic on uint8 (aten/src/ATen/native/cpu/UpSampleKernel.cpp,
 * upsample_avx_bilinear_bicubic_uint8 and HelperInterpBase) -------------------------------- */

/* Keys' cubic convolution with a = -0.5, the antialias filter torch uses. */
static double aa_cubic(double x) {
  const double a = -0.5;
  x = fabs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

/* One axis: per output index the first input index, the tap count and ksize int16 weights
 * with `precision` fractional bits. */
typedef struct resize_axis {
  int32_t ksize, precision;
  int32_t *xmin, *xsize;
  int16_t *w;
} resize_axis;

static void axis_free(resize_axis *a) {
  free(a->xmin), free(a->xsize), free(a->w);
  memset(a, 0, sizeof *a);
}

static int axis_init(resize_axis *a, int32_t in, int32_t out) {
  memset(a, 0, sizeof *a);
  double scale = (double)in / (double)out;
  double support = (scale >= 1.0 ? 2.0 * scale : 2.0);
  /* torch: interp_size = (int)ceilf(support) * 2 + 1 (a float ceil, kept for exactness). */
  int32_t ksize = (int32_t)ceilf((float)support) * 2 + 1;
  double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  double *wd = (double *)calloc((size_t)out * (size_t)ksize, sizeof(double));
  a->xmin = (int32_t *)malloc(sizeof(int32_t) * (size_t)out);
  a->xsize = (int32_t *)malloc(sizeof(int32_t) * (size_t)out);
  a->w = (int16_t *)calloc((size_t)out * (size_t)ksize, sizeof(int16_t));
  if (!wd || !a->xmin || !a->xsize || !a->w) {
    free(wd);
    axis_free(a);
    return ANNA_ENOMEM;
  }
  a->ksize = ksize;
  double wt_max = 0.0;
  for (int32_t i = 0; i < out; i++) {
    double center = scale * (i + 0.5);
    int64_t xmin = (int64_t)(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int64_t xend = (int64_t)(center + support + 0.5);
    if (xend > in) xend = in;
    int64_t xsize = xend - xmin;
    if (xsize < 0) xsize = 0;
    if (xsize > ksize) xsize = ksize;
    double *w = wd + (size_t)i * (size_t)ksize, total = 0.0;
    for (int64_t j = 0; j < xsize; j++) {
      w[j] = aa_cubic(((double)(j + xmin) - center + 0.5) * invscale);
      total += w[j];
    }
    if (total != 0.0)
      for (int64_t j = 0; j < xsize; j++) {
        w[j] /= total;
        if (w[j] > wt_max) wt_max = w[j];
      }
    a->xmin[i] = (int32_t)xmin, a->xsize[i] = (int32_t)xsize;
  }
  int32_t p = 0;
  for (p = 0; p < 22; p++) {
    int next = (int)(0.5 + wt_max * (double)(1 << (p + 1)));
    if (next >= (1 << 15)) break;
  }
  a->precision = p;
  for (size_t k = 0; k < (size_t)out * (size_t)ksize; k++) {
    double v = wd[k] * (double)(1 << p);
    a->w[k] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
  }
  free(wd);
  return 0;
}

static inline uint8_t clip_shift(int32_t acc, int32_t p) {
  int32_t v = acc >> p; /* arithmetic: floor, as _mm_srai_epi32 */
  return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Horizontal pass: rows of src (sw wide) -> rows of dst (dw wide), 3 channels. */
static void resize_h(const uint8_t *src, int32_t sw, int32_t rows, uint8_t *dst, int32_t dw,
                     const resize_axis *a) {
  int32_t p = a->precision, half = p > 0 ? 1 << (p - 1) : 0;
  for (int32_t y = 0; y < rows; y++) {
    const uint8_t *s = src + (size_t)y * (size_t)sw * 3;
    uint8_t *d = dst + (size_t)y * (size_t)dw * 3;
    for (int32_t x = 0; x < dw; x++) {
      const int16_t *w = a->w + (size_t)x * (size_t)a->ksize;
      const uint8_t *in = s + (size_t)a->xmin[x] * 3;
      int32_t r = half, g = half, b = half;
      for (int32_t k = 0; k < a->xsize[x]; k++) {
        r += in[3 * k] * w[k], g += in[3 * k + 1] * w[k], b += in[3 * k + 2] * w[k];
      }
      d[3 * x] = clip_shift(r, p), d[3 * x + 1] = clip_shift(g, p), d[3 * x + 2] = clip_shift(b, p);
    }
  }
}

/* Vertical pass: sh rows of w3 bytes -> dh rows. Taps outer, columns inner (rows are
 * contiguous); acc is a caller-owned scratch row of w3 int32. */
static void resize_v(const uint8_t *src, int32_t w3, uint8_t *dst, int32_t dh,
                     const resize_axis *a, int32_t *acc) {
  int32_t p = a->precision, half = p > 0 ? 1 << (p - 1) : 0;
  for (int32_t y = 0; y < dh; y++) {
    const int16_t *w = a->w + (size_t)y * (size_t)a->ksize;
    const uint8_t *s = src + (size_t)a->xmin[y] * (size_t)w3;
    uint8_t *d = dst + (size_t)y * (size_t)w3;
    for (int32_t x = 0; x < w3; x++) acc[x] = half;
    for (int32_t k = 0; k < a->xsize[y]; k++) {
      const uint8_t *r = s + (size_t)k * (size_t)w3;
      int32_t wk = w[k];
      for (int32_t x = 0; x < w3; x++) acc[x] += r[x] * wk;
    }
    for (int32_t x = 0; x < w3; x++) d[x] = clip_shift(acc[x], p);
  }
}

int vision_preproc_resize_rgb8(const uint8_t *src, int32_t sw, int32_t sh, uint8_t *dst,
                               int32_t dw, int32_t dh, char *err, size_t errlen) {
  if (sw <= 0 || sh <= 0 || dw <= 0 || dh <= 0)
    return anna_err(err, errlen, ANNA_EINVAL, "resize: empty size %dx%d -> %dx%d", sw, sh, dw,
                    dh);
  int need_h = sw != dw, need_v = sh != dh;
  if (!need_h && !need_v) {
    memcpy(dst, src, (size_t)sw * (size_t)sh * 3);
    return 0;
  }
  resize_axis ah = {0}, av = {0};
  uint8_t *tmp = NULL;
  int32_t *acc = NULL;
  int rc = 0;
  if ((need_h && axis_init(&ah, sw, dw)) || (need_v && axis_init(&av, sh, dh)) ||
      (need_v && !(acc = (int32_t *)malloc(sizeof(int32_t) * (size_t)dw * 3)))) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "resize: out of memory");
    goto done;
  }
  if (need_h && need_v) {
    tmp = (uint8_t *)malloc((size_t)dw * (size_t)sh * 3);
    if (!tmp) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "resize: out of memory");
      goto done;
    }
    resize_h(src, sw, sh, tmp, dw, &ah);
    resize_v(tmp, dw * 3, dst, dh, &av, acc);
  } else if (need_h) {
    resize_h(src, sw, sh, dst, dw, &ah);
  } else {
    resize_v(src, sw * 3, dst, dh, &av, acc);
  }
done:
  free(tmp);
  free(acc);
  axis_free(&ah);
  axis_free(&av);
  return rc;
}

void vision_pixels_free(vision_pixels *p) {
  if (!p) return;
  free(p->values);
  memset(p, 0, sizeof *p);
}

int64_t vision_pixels_tokens(const vision_pixels *p, const vision_preproc_config *c) {
  int64_t m2 = (int64_t)c->merge_size * c->merge_size;
  return m2 > 0 ? p->n_patches / m2 : 0;
}

/* Normalises and patchifies groups * tp frames (frames[g * tp + t], each rw x rh RGB8) into
 * *out [groups * gh * gw, 3 * tp * ps * ps] (allocated here): rows by group, then merge-block
 * order (block row, block column, row in block, column in block), each row (c, t, y, x). */
static int patchify(const vision_preproc_config *c, const uint8_t *const *frames, int32_t groups,
                    int32_t rw, int32_t rh, float **out, char *err, size_t errlen) {
  const int32_t ps = c->patch_size, ms = c->merge_size, tp = c->temporal_patch_size;
  /* transformers fuses rescale into normalize: mean and std are divided by the rescale factor
   * in f32, then (x - mean) / std in f32. */
  float mean[3] = {0, 0, 0}, stdv[3] = {1, 1, 1}, scale = 1.0f;
  if (c->do_normalize) {
    float inv = c->do_rescale ? (float)(1.0 / c->rescale_factor) : 1.0f;
    for (int i = 0; i < 3; i++) mean[i] = c->image_mean[i] * inv, stdv[i] = c->image_std[i] * inv;
  } else if (c->do_rescale) {
    scale = (float)c->rescale_factor;
  }
  const int32_t gh = rh / ps, gw = rw / ps;
  const int32_t dim = 3 * tp * ps * ps;
  const int64_t np = (int64_t)groups * gh * gw;
  float *v = (float *)malloc(sizeof(float) * (size_t)np * (size_t)dim);
  if (!v) return anna_err(err, errlen, ANNA_ENOMEM, "vision preprocessing: out of memory");
  int64_t row = 0;
  for (int32_t g = 0; g < groups; g++)
    for (int32_t bh = 0; bh < gh / ms; bh++)
      for (int32_t bw = 0; bw < gw / ms; bw++)
        for (int32_t mh = 0; mh < ms; mh++)
          for (int32_t mw = 0; mw < ms; mw++, row++) {
            float *o = v + row * dim;
            int32_t y0 = (bh * ms + mh) * ps, x0 = (bw * ms + mw) * ps;
            for (int32_t ch = 0; ch < 3; ch++)
              for (int32_t t = 0; t < tp; t++) {
                const uint8_t *img = frames[(size_t)g * (size_t)tp + (size_t)t];
                for (int32_t py = 0; py < ps; py++)
                  for (int32_t px = 0; px < ps; px++) {
                    float x = img[((size_t)(y0 + py) * (size_t)rw + (size_t)(x0 + px)) * 3 + ch];
                    *o++ = c->do_normalize ? (x - mean[ch]) / stdv[ch] : x * scale;
                  }
              }
          }
  *out = v;
  return 0;
}

int vision_preproc_image(const vision_preproc_config *c, const uint8_t *rgb, int32_t w,
                         int32_t h, vision_pixels *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (c->patch_size <= 0 || c->merge_size <= 0 || c->temporal_patch_size <= 0)
    return anna_err(err, errlen, ANNA_EINVAL, "vision preprocessing: bad patch/merge sizes");
  const int32_t ps = c->patch_size, ms = c->merge_size, tp = c->temporal_patch_size;
  const int32_t F = ps * ms;
  int32_t rh = h, rw = w;
  int rc;
  if (c->do_resize) {
    if ((rc = vision_preproc_smart_resize(h, w, F, c->min_pixels, c->max_pixels, &rh, &rw, err,
                                          errlen)))
      return rc;
  } else if (w <= 0 || h <= 0 || w % F || h % F) {
    return anna_err(err, errlen, ANNA_EINVAL,
                    "vision preprocessing: %d x %d is not a multiple of %d and resizing is off",
                    w, h, F);
  }
  uint8_t *img = (uint8_t *)malloc((size_t)rw * (size_t)rh * 3);
  if (!img) return anna_err(err, errlen, ANNA_ENOMEM, "vision preprocessing: out of memory");
  if ((rc = vision_preproc_resize_rgb8(rgb, w, h, img, rw, rh, err, errlen))) {
    free(img);
    return rc;
  }
  const int32_t gh = rh / ps, gw = rw / ps;
  const uint8_t *frames[64];
  if (tp > 64) {
    free(img);
    return anna_err(err, errlen, ANNA_EINVAL,
                    "vision preprocessing: temporal_patch_size %d > 64", tp);
  }
  for (int32_t t = 0; t < tp; t++) frames[t] = img; /* an image is one frame repeated */
  float *v = NULL;
  if ((rc = patchify(c, frames, 1, rw, rh, &v, err, errlen))) {
    free(img);
    return rc;
  }
  const int32_t dim = 3 * tp * ps * ps;
  const int64_t np = (int64_t)gh * gw;
  free(img);
  out->values = v;
  out->n_patches = np;
  out->patch_dim = dim;
  out->grid_t = 1, out->grid_h = gh, out->grid_w = gw;
  out->height = rh, out->width = rw;
  return 0;
}

/* ---- video ---- */

void vision_video_config_default(vision_video_config *c) {
  memset(c, 0, sizeof *c);
  vision_preproc_config_default(&c->pre);
  c->pre.min_pixels = 4096;     /* video_preprocessor_config.json size.shortest_edge */
  c->pre.max_pixels = 25165824; /* size.longest_edge */
  c->fps = 2.0;
  c->min_frames = 4;
  c->max_frames = 768;
  c->cap_pixels_per_frame = 0;
  c->max_video_tokens = 768;
}

int vision_video_smart_resize(const vision_video_config *c, int32_t n, int64_t h, int64_t w,
                              int32_t *out_h, int32_t *out_w, char *err, size_t errlen) {
  const int64_t F = (int64_t)c->pre.patch_size * c->pre.merge_size;
  const int32_t tf = c->pre.temporal_patch_size;
  if (F <= 0 || tf <= 0)
    return anna_err(err, errlen, ANNA_EINVAL, "video preprocessing: bad patch sizes");
  if (n < tf)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "video preprocessing: %d frames, fewer than the temporal patch (%d)", n, tf);
  if (h <= 0 || w <= 0 || h > (1 << 24) || w > (1 << 24))
    return anna_err(err, errlen, ANNA_EINVAL, "video preprocessing: bad frame size %lld x %lld",
                    (long long)w, (long long)h);
  const int64_t longest = c->pre.max_pixels, shortest = c->pre.min_pixels;
  int64_t max_px = longest;
  if (c->cap_pixels_per_frame) {
    /* qwen-vl-utils' cap: a frame costs at most max_video_tokens merged tokens or its even
     * share of the clip budget, and at least 1.05 * shortest_edge. */
    int64_t frame_cap = (int64_t)c->max_video_tokens * F * F;
    int64_t share = longest / n;
    int64_t ppf = frame_cap < share ? frame_cap : share;
    int64_t floor_px = (int64_t)((double)shortest * 1.05);
    if (ppf < floor_px) ppf = floor_px;
    max_px = ppf * n;
  }
  if (h < F || w < F) {
    double s = fmax((double)F / (double)h, (double)F / (double)w);
    h = (int64_t)((double)h * s);
    w = (int64_t)((double)w * s);
  }
  double hi = (double)(h > w ? h : w), lo = (double)(h > w ? w : h);
  if (lo <= 0 || hi / lo > 200)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "video preprocessing: aspect ratio of %lld x %lld is above 200",
                    (long long)w, (long long)h);
  int64_t hb = (int64_t)rint((double)h / (double)F) * F;
  int64_t wb = (int64_t)rint((double)w / (double)F) * F;
  int64_t tb = (int64_t)rint((double)n / (double)tf) * tf;
  double vol = (double)n * (double)h * (double)w;
  if ((double)tb * (double)hb * (double)wb > (double)max_px) {
    double beta = sqrt(vol / (double)max_px);
    hb = (int64_t)floor((double)h / beta / (double)F) * F;
    wb = (int64_t)floor((double)w / beta / (double)F) * F;
    if (hb < F) hb = F;
    if (wb < F) wb = F;
  } else if ((double)tb * (double)hb * (double)wb < (double)shortest) {
    double beta = sqrt((double)shortest / vol);
    hb = (int64_t)ceil((double)h * beta / (double)F) * F;
    wb = (int64_t)ceil((double)w * beta / (double)F) * F;
  }
  if (hb > INT32_MAX || wb > INT32_MAX)
    return anna_err(err, errlen, ANNA_EINVAL, "video preprocessing: resized frame too large");
  *out_h = (int32_t)hb;
  *out_w = (int32_t)wb;
  return 0;
}

void vision_video_builder_init(vision_video_builder *b, const vision_video_config *c) {
  memset(b, 0, sizeof *b);
  b->cfg = *c;
}

void vision_video_builder_free(vision_video_builder *b) {
  if (!b) return;
  free(b->frames);
  free(b->filled);
  b->frames = b->filled = NULL;
  b->n = b->added = 0;
}

int vision_video_builder_add(vision_video_builder *b, int32_t slot, int32_t n, const uint8_t *rgb,
                             int32_t w, int32_t h, char *err, size_t errlen) {
  const vision_preproc_config *c = &b->cfg.pre;
  int rc;
  if (!b->frames) {
    if (c->patch_size <= 0 || c->merge_size <= 0 || c->temporal_patch_size <= 0 ||
        c->temporal_patch_size > 64)
      return anna_err(err, errlen, ANNA_EINVAL, "video preprocessing: bad patch/merge sizes");
    if (n < 1) return anna_err(err, errlen, ANNA_EINVAL, "video preprocessing: no frames");
    const int32_t F = c->patch_size * c->merge_size;
    int32_t rh = h, rw = w;
    if (c->do_resize) {
      if ((rc = vision_video_smart_resize(&b->cfg, n, h, w, &rh, &rw, err, errlen))) return rc;
    } else if (w <= 0 || h <= 0 || w % F || h % F) {
      return anna_err(err, errlen, ANNA_EINVAL,
                      "video preprocessing: %d x %d is not a multiple of %d and resizing is off",
                      w, h, F);
    }
    const size_t fb = (size_t)rw * (size_t)rh * 3;
    if ((size_t)n > SIZE_MAX / fb)
      return anna_err(err, errlen, ANNA_EINVAL, "video preprocessing: too many frames");
    b->frames = (uint8_t *)malloc(fb * (size_t)n);
    b->filled = (uint8_t *)calloc((size_t)n, 1);
    if (!b->frames || !b->filled) {
      vision_video_builder_free(b);
      return anna_err(err, errlen, ANNA_ENOMEM, "video preprocessing: out of memory");
    }
    b->n = n, b->w = w, b->h = h, b->rw = rw, b->rh = rh, b->added = 0;
  }
  if (n != b->n || w != b->w || h != b->h)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "video preprocessing: frame of %d x %d (of %d) after %d x %d (of %d)", w, h,
                    n, b->w, b->h, b->n);
  if (slot < 0 || slot >= b->n || b->filled[slot])
    return anna_err(err, errlen, ANNA_EINVAL, "video preprocessing: bad or repeated slot %d",
                    slot);
  const size_t fb = (size_t)b->rw * (size_t)b->rh * 3;
  uint8_t *dst = b->frames + (size_t)slot * fb;
  if (c->do_resize)
    rc = vision_preproc_resize_rgb8(rgb, w, h, dst, b->rw, b->rh, err, errlen);
  else
    memcpy(dst, rgb, fb), rc = 0;
  if (rc) return rc;
  b->filled[slot] = 1;
  b->added++;
  return 0;
}

int vision_video_builder_frame_cb(void *user, int32_t slot, int32_t n, const uint8_t *rgb,
                                  int32_t w, int32_t h, char *err, size_t errlen) {
  return vision_video_builder_add((vision_video_builder *)user, slot, n, rgb, w, h, err, errlen);
}

int vision_video_builder_finish(vision_video_builder *b, vision_pixels *out, char *err,
                                size_t errlen) {
  memset(out, 0, sizeof *out);
  const vision_preproc_config *c = &b->cfg.pre;
  if (!b->frames || b->added != b->n)
    return anna_err(err, errlen, ANNA_EINVAL, "video preprocessing: %d of %d frames added",
                    b->added, b->n);
  const int32_t ps = c->patch_size, tp = c->temporal_patch_size, n = b->n;
  const size_t fb = (size_t)b->rw * (size_t)b->rh * 3;
  const int32_t groups = (n + tp - 1) / tp;
  const uint8_t **fp = (const uint8_t **)malloc(sizeof(uint8_t *) * (size_t)groups * (size_t)tp);
  if (!fp) return anna_err(err, errlen, ANNA_ENOMEM, "video preprocessing: out of memory");
  /* An odd count repeats the last frame up to the temporal patch (patchify's padding). */
  for (int32_t i = 0; i < groups * tp; i++) fp[i] = b->frames + (size_t)(i < n ? i : n - 1) * fb;
  float *v = NULL;
  int rc = patchify(c, fp, groups, b->rw, b->rh, &v, err, errlen);
  free(fp);
  if (rc) return rc;
  out->values = v;
  out->grid_t = groups, out->grid_h = b->rh / ps, out->grid_w = b->rw / ps;
  out->n_patches = (int64_t)groups * out->grid_h * out->grid_w;
  out->patch_dim = 3 * tp * ps * ps;
  out->height = b->rh, out->width = b->rw;
  return 0;
}

int vision_preproc_video(const vision_video_config *vc, const uint8_t *frames, int32_t n,
                         int32_t w, int32_t h, vision_pixels *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (n < 1 || !frames || w <= 0 || h <= 0)
    return anna_err(err, errlen, ANNA_EINVAL, "video preprocessing: no frames");
  vision_video_builder b;
  vision_video_builder_init(&b, vc);
  const size_t src_fb = (size_t)w * (size_t)h * 3;
  int rc = 0;
  for (int32_t i = 0; i < n && !rc; i++)
    rc = vision_video_builder_add(&b, i, n, frames + (size_t)i * src_fb, w, h, err, errlen);
  if (!rc) rc = vision_video_builder_finish(&b, out, err, errlen);
  vision_video_builder_free(&b);
  return rc;
}

void vision_video_timestamps(const int64_t *indices, int32_t n, double fps, int32_t tp,
                             double *out) {
  if (n <= 0 || tp <= 0) return;
  const int32_t groups = (n + tp - 1) / tp;
  for (int32_t g = 0; g < groups; g++) {
    int32_t a = g * tp, b = g * tp + tp - 1;
    if (a > n - 1) a = n - 1;
    if (b > n - 1) b = n - 1;
    out[g] = ((double)indices[a] / fps + (double)indices[b] / fps) / 2;
  }
}

int vision_video_timestamp_text(double t, char *buf, size_t bufsize) {
  int k = snprintf(buf, bufsize, "<%.1f seconds>", t);
  if (k < 0 || (size_t)k >= bufsize) {
    if (bufsize) buf[0] = 0;
    return ANNA_EINVAL;
  }
  return k;
}

int vision_video_config_parse(const char *json, size_t n, vision_video_config *c, char *err,
                              size_t errlen) {
  json_error_t je;
  json_t *root = json_loadb(json, n, 0, &je);
  if (!root)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "video_preprocessor_config: bad JSON at line %d: %s", je.line, je.text);
  vision_video_config t = *c;
  int rc = 0;
  if (!json_is_object(root)) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "video_preprocessor_config: not a JSON object");
    goto done;
  }
  /* The video keys are taken out here; the rest are the image processor's. */
  static const char *const vkeys[] = {"fps", "min_frames", "max_frames", "max_video_tokens",
                                      "cap_pixels_per_frame", "do_sample_frames", "num_frames",
                                      "return_metadata", "video_processor_type", NULL};
  for (int i = 0; vkeys[i] && !rc; i++) {
    const char *key = vkeys[i];
    json_t *v = json_object_get(root, key);
    int64_t x;
    int b;
    if (!v) continue;
    if (!strcmp(key, "fps")) {
      if (!json_is_number(v) || !(json_number_value(v) > 0) || !(json_number_value(v) <= 1000))
        rc = anna_err(err, errlen, ANNA_EINVAL,
                      "video_preprocessor_config: fps must be a number in (0, 1000]");
      else
        t.fps = json_number_value(v);
    } else if (!strcmp(key, "min_frames")) {
      if (!(rc = get_int(v, key, 1, 1 << 20, &x, err, errlen))) t.min_frames = (int32_t)x;
    } else if (!strcmp(key, "max_frames")) {
      if (!(rc = get_int(v, key, 1, 1 << 20, &x, err, errlen))) t.max_frames = (int32_t)x;
    } else if (!strcmp(key, "max_video_tokens")) {
      if (!(rc = get_int(v, key, 1, 1 << 24, &x, err, errlen))) t.max_video_tokens = (int32_t)x;
    } else if (!strcmp(key, "cap_pixels_per_frame")) {
      /* transformers 5.25: None behaves as False (with a warning) */
      if (json_is_null(v))
        t.cap_pixels_per_frame = 0;
      else
        rc = get_bool(v, key, &t.cap_pixels_per_frame, err, errlen);
    } else if (!strcmp(key, "do_sample_frames")) {
      if (!(rc = get_bool(v, key, &b, err, errlen)) && !b)
        rc = anna_err(err, errlen, ANNA_EINVAL,
                      "video_preprocessor_config: do_sample_frames = false is not supported");
    } else if (!strcmp(key, "num_frames")) {
      if (!json_is_null(v))
        rc = anna_err(err, errlen, ANNA_EINVAL,
                      "video_preprocessor_config: num_frames is not supported (only null; "
                      "frames are sampled by fps)");
    } else if (!strcmp(key, "return_metadata")) {
      rc = get_bool(v, key, &b, err, errlen);
    } else if (!json_is_string(v)) {
      rc = anna_err(err, errlen, ANNA_EINVAL, "video_preprocessor_config: %s must be a string",
                    key);
    }
    if (!rc) json_object_del(root, key);
  }
  if (!rc) rc = parse_keys(root, &t.pre, err, errlen);
  if (!rc && t.min_frames > t.max_frames)
    rc = anna_err(err, errlen, ANNA_EINVAL,
                  "video_preprocessor_config: min_frames %d exceed max_frames %d", t.min_frames,
                  t.max_frames);
done:
  json_decref(root);
  if (rc == 0) *c = t;
  return rc;
}
