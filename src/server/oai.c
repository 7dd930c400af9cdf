/* oai.c: OpenAI request parsing and response rendering (see oai.h). */
#include "oai.h"
#include "jsonschema.h"
#include "gbnf.h"

#include "imgfetch.h"

#include "anna/anna.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

int oai_fail(oai_error *e, int status, const char *param, const char *code, const char *fmt, ...) {
  e->status = status;
  e->type = status == 404   ? "not_found_error"
            : status == 413 ? "invalid_request_error"
            : status == 429 ? "rate_limit_error"
            : status >= 500 ? "server_error"
                            : "invalid_request_error";
  e->code = code;
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  return -1;
}

char *oai_error_json(const oai_error *e) {
  json_t *err = json_object();
  /* The message may quote user bytes: never let invalid UTF-8 lose the whole object. */
  json_t *msg = json_string(e->message);
  json_object_set_new(err, "message", msg ? msg : json_string("invalid request"));
  json_object_set_new(err, "type", json_string(e->type ? e->type : "invalid_request_error"));
  json_object_set_new(err, "param", e->param[0] ? json_string(e->param) : json_null());
  json_object_set_new(err, "code", e->code ? json_string(e->code) : json_null());
  json_t *o = json_pack("{s:o}", "error", err);
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return s;
}

void oai_job_clear(oai_job *job) {
  gen_request_release(job->r);
  free(job->model);
  memset(job, 0, sizeof *job);
}

/* ---- request parsing ---- */

static const char *type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a number";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  default: return "null";
  }
}

/* Optional number field in [lo, hi]; absent or null keeps *out. */
static int get_num(json_t *root, const char *key, double lo, double hi, float *out, oai_error *e) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v))
    return oai_fail(e, 400, key, "invalid_type", "'%s' must be a number, got %s", key,
                    type_name(v));
  double x = json_number_value(v);
  if (!(x >= lo && x <= hi))
    return oai_fail(e, 400, key, "invalid_value", "'%s' must be in [%g, %g], got %g", key, lo, hi,
                    x);
  *out = (float)x;
  return 0;
}

static int get_int(json_t *root, const char *key, long long lo, long long hi, long long *out,
                   int *present, oai_error *e) {
  json_t *v = json_object_get(root, key);
  if (present) *present = 0;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v)) {
    /* 5.0 is an integer to most clients */
    if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) &&
        fabs(json_real_value(v)) < 9e15) {
      *out = (long long)json_real_value(v);
    } else {
      return oai_fail(e, 400, key, "invalid_type", "'%s' must be an integer, got %s", key,
                      type_name(v));
    }
  } else {
    *out = json_integer_value(v);
  }
  if (*out < lo || *out > hi)
    return oai_fail(e, 400, key, "invalid_value", "'%s' must be in [%lld, %lld], got %lld", key, lo,
                    hi, *out);
  if (present) *present = 1;
  return 0;
}

static int get_bool(json_t *root, const char *key, int *out, oai_error *e) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v))
    return oai_fail(e, 400, key, "invalid_type", "'%s' must be a boolean, got %s", key,
                    type_name(v));
  *out = json_is_true(v);
  return 0;
}

static int parse_model(const oai_config *cfg, json_t *root, oai_job *job, oai_error *e) {
  json_t *v = json_object_get(root, "model");
  if (v && !json_is_null(v) && !json_is_string(v))
    return oai_fail(e, 400, "model", "invalid_type", "'model' must be a string, got %s",
                    type_name(v));
  const char *name = json_is_string(v) ? json_string_value(v) : NULL;
  if (name && *name && strcmp(name, cfg->model_name))
    return oai_fail(e, 404, "model", "model_not_found",
                    "The model '%.200s' does not exist; this server serves '%s'", name,
                    cfg->model_name);
  job->model = strdup(cfg->model_name);
  return job->model ? 0 : oai_fail(e, 500, NULL, NULL, "out of memory");
}

/* logit_bias as OpenAI validates it: an object whose keys are token ids written in decimal
 * (digits only) below the vocabulary size and whose values are numbers in [-100, 100]. The
 * engine cannot apply a bias yet, so a valid non-empty map is refused rather than ignored:
 * a client asking to ban a token must not silently get it. null and {} are accepted. */
static int parse_logit_bias(const oai_config *cfg, json_t *root, oai_error *e) {
  json_t *lb = json_object_get(root, "logit_bias");
  if (!lb || json_is_null(lb)) return 0;
  if (!json_is_object(lb))
    return oai_fail(e, 400, "logit_bias", "invalid_type",
                    "'logit_bias' must be an object mapping token ids (strings) to numbers, got %s",
                    type_name(lb));
  const long long vocab = anna_text_vocab(cfg->text);
  const char *k;
  json_t *v;
  json_object_foreach(lb, k, v) {
    long long id = 0;
    int ok = *k != '\0';
    for (const char *p = k; ok && *p; p++) {
      ok = *p >= '0' && *p <= '9';
      if (ok) id = id * 10 + (*p - '0');
      if (id >= vocab) ok = 0; /* stops before any overflow too */
    }
    if (!ok)
      return oai_fail(e, 400, "logit_bias", "invalid_value",
                      "invalid key in 'logit_bias': '%.64s' (keys are token ids, integers in [0, %lld))", k,
                      vocab);
    if (!json_is_number(v))
      return oai_fail(e, 400, "logit_bias", "invalid_type",
                      "'logit_bias' value for key '%s' must be a number in [-100, 100], got %s", k, type_name(v));
    const double b = json_number_value(v);
    if (!(b >= -100 && b <= 100))
      return oai_fail(e, 400, "logit_bias", "invalid_value",
                      "'logit_bias' value for key '%s' is %g: it must be in [-100, 100]", k, b);
  }
  if (json_object_size(lb))
    return oai_fail(e, 400, "logit_bias", "unsupported_parameter",
                    "'logit_bias' is valid but this server does not apply logit biases yet; send {} or leave it out");
  return 0;
}

static int parse_sampling(const oai_config *cfg, json_t *root, gen_request *r, oai_error *e) {
  r->sp = cfg->defaults;
  if (parse_logit_bias(cfg, root, e)) return -1;
  if (get_num(root, "temperature", 0, 2, &r->sp.temperature, e) ||
      get_num(root, "top_p", 0, 1, &r->sp.top_p, e) ||
      get_num(root, "min_p", 0, 1, &r->sp.min_p, e) ||
      get_num(root, "presence_penalty", -2, 2, &r->sp.presence_penalty, e) ||
      get_num(root, "frequency_penalty", -2, 2, &r->sp.frequency_penalty, e) ||
      get_num(root, "repetition_penalty", 0.01, 10, &r->sp.repetition_penalty, e))
    return -1;
  long long v;
  int present;
  if (get_int(root, "top_k", -1, 1 << 30, &v, &present, e)) return -1;
  if (present) r->sp.top_k = v < 0 ? 0 : (int)v;
  if (get_int(root, "seed", INT64_MIN, INT64_MAX, &v, &present, e)) return -1;
  if (present)
    r->sp.seed = (uint64_t)v;
  else if (cfg->defaults.seed == (uint64_t)-1 || cfg->defaults.seed == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->sp.seed = (uint64_t)ts.tv_nsec * 6364136223846793005ULL + (uint64_t)ts.tv_sec +
                 (uint64_t)(uintptr_t)r;
  }
  /* n */
  if (get_int(root, "n", 1, cfg->max_n, &v, &present, e)) return -1;
  r->n = present ? (int)v : 1;
  /* stop */
  json_t *st = json_object_get(root, "stop");
  if (st && !json_is_null(st)) {
    json_t *arr = st;
    if (json_is_string(st)) {
      arr = json_array();
      json_array_append(arr, st);
    } else if (!json_is_array(st)) {
      return oai_fail(e, 400, "stop", "invalid_type",
                      "'stop' must be a string or an array of strings, got %s", type_name(st));
    } else {
      json_incref(arr);
    }
    int rc = 0;
    if (json_array_size(arr) > GEN_MAX_STOP)
      rc = oai_fail(e, 400, "stop", "invalid_value", "'stop' holds at most %d sequences",
                    GEN_MAX_STOP);
    for (size_t i = 0; !rc && i < json_array_size(arr); i++) {
      json_t *s = json_array_get(arr, i);
      if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) > 512)
        rc = oai_fail(e, 400, "stop", "invalid_value",
                      "'stop' entries must be non-empty strings of at most 512 bytes");
      else if (!(r->stop[r->n_stop++] = strdup(json_string_value(s))))
        rc = oai_fail(e, 500, NULL, NULL, "out of memory");
    }
    json_decref(arr);
    if (rc) return rc;
  }
  if (get_bool(root, "ignore_eos", &r->ignore_eos, e)) return -1;
  return 0;
}

static int parse_max_tokens(const oai_config *cfg, json_t *root, gen_request *r, int dflt,
                            oai_error *e) {
  long long v;
  int present;
  const char *keys[2] = {"max_completion_tokens", "max_tokens"};
  r->max_tokens = dflt;
  for (int k = 0; k < 2; k++) {
    if (get_int(root, keys[k], 1, INT32_MAX, &v, &present, e)) return -1;
    if (present) {
      if (v > cfg->n_ctx)
        return oai_fail(e, 400, keys[k], "invalid_value",
                        "'%s' is %lld, more than this server's context of %d tokens (--ctx-size)",
                        keys[k], v, cfg->n_ctx);
      r->max_tokens = (int)v;
      break;
    }
  }
  return 0;
}

/* vLLM's min_tokens (after max_tokens): an integer in [0, max_tokens], or [0, the context]
 * when max_tokens is not bounded. */
static int parse_min_tokens(const oai_config *cfg, json_t *root, gen_request *r, oai_error *e) {
  long long v;
  int present;
  if (get_int(root, "min_tokens", 0, INT32_MAX, &v, &present, e)) return -1;
  if (!present) return 0;
  if (r->max_tokens > 0 && v > r->max_tokens)
    return oai_fail(e, 400, "min_tokens", "invalid_value",
                    "'min_tokens' (%lld) must not exceed 'max_tokens' (%d)", v, r->max_tokens);
  if (v > cfg->n_ctx)
    return oai_fail(e, 400, "min_tokens", "invalid_value",
                    "'min_tokens' is %lld, more than this server's context of %d tokens (--ctx-size)", v,
                    cfg->n_ctx);
  r->min_tokens = (int)v;
  return 0;
}

static int valid_fn_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 64) return 0;
  for (size_t i = 0; i < n; i++)
    if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != '.') return 0;
  return 1;
}

/* ---- images (chat content parts) ---- */

/* The images of one chat request, in message order, before they join the gen_request. */
typedef struct img_list {
  const oai_config *cfg;
  anna_media *media[64]; /* images and videos, in content order */
  int n;
  int n_video; /* of them videos (video_url parts) */
} img_list;

static void img_list_clear(img_list *l) {
  for (int i = 0; i < l->n; i++)
    anna_media_free(l->media[i]);
  l->n = 0;
  l->n_video = 0;
}

/* RFC 4648 base64 (standard alphabet, '=' padding optional at the end, no whitespace): a
 * small strict decoder rather than a crypto library dependency for one function. Returns the
 * bytes written to out (>= 3 * n / 4 bytes), or -1 with *bad_at the offending offset. */
static long b64_decode(const char *in, size_t n, uint8_t *out, size_t *bad_at) {
  uint32_t acc = 0;
  int bits = 0;
  size_t o = 0, i, pad = 0;
  while (n > 0 && in[n - 1] == '=') {
    n--;
    if (++pad > 2) {
      *bad_at = n;
      return -1;
    }
  }
  for (i = 0; i < n; i++) {
    const unsigned char ch = (unsigned char)in[i];
    int v = ch >= 'A' && ch <= 'Z'   ? ch - 'A'
            : ch >= 'a' && ch <= 'z' ? ch - 'a' + 26
            : ch >= '0' && ch <= '9' ? ch - '0' + 52
            : ch == '+'              ? 62
            : ch == '/'              ? 63
                                     : -1;
    if (v < 0) {
      *bad_at = i;
      return -1;
    }
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[o++] = (uint8_t)(acc >> bits);
    }
  }
  if (bits >= 6) { /* a lone trailing character carries no whole byte */
    *bad_at = n - 1;
    return -1;
  }
  return (long)o;
}

/* Encoded image bytes (freed here) -> the next media of l. */
static int image_bytes(img_list *l, uint8_t *bytes, size_t n, const char *pp, oai_error *e) {
  char err[256];
  int rc = anna_media_image_decode(&l->media[l->n], l->cfg->model, bytes, n, l->cfg->max_image_pixels, err,
                                   sizeof err);
  free(bytes);
  if (rc == ANNA_ENOMEM) return oai_fail(e, 500, NULL, NULL, "out of memory");
  if (rc) {
    const int limit = strstr(err, "over the limit") != NULL;
    return oai_fail(e, 400, pp, limit ? "image_too_large" : "invalid_image", "image %d: %s%s", l->n, err,
                    limit ? " (--max-image-pixels)" : "");
  }
  l->n++;
  return 0;
}

/* What differs between an image_url and a video_url part's URL handling. */
typedef struct media_url_kind {
  const char *what, *mime, *example, *flag, *too_large, *fetch_failed;
  size_t (*max_bytes)(const oai_config *cfg);
  size_t slack; /* a base64 length's estimate runs up to 2 bytes over (padding) */
} media_url_kind;
static size_t image_max_bytes(const oai_config *cfg) {
  return cfg->max_image_bytes;
}
static size_t video_max_bytes(const oai_config *cfg) {
  return cfg->max_video_bytes;
}
static const media_url_kind MEDIA_IMAGE = {"image", "image/", "data:image/png;base64,...", "--max-image-bytes",
                                           "image_too_large", "image_fetch_failed", image_max_bytes, 0};
static const media_url_kind MEDIA_VIDEO = {"video", "video/", "data:video/mp4;base64,...", "--max-video-bytes",
                                           "video_too_large", "video_fetch_failed", video_max_bytes, 2};

/* A media part's url (a JSON string) -> its encoded bytes in *out (caller frees), *n: fetched
 * from an http(s) URL on an allowed host (imgfetch.h) or decoded from a base64 data: URL of the
 * kind's media type; every refusal is a 400 naming the problem (returns -1 after oai_fail). */
static int media_url_bytes(const oai_config *cfg, const media_url_kind *k, json_t *url, const char *pp, uint8_t **out,
                           size_t *n, oai_error *e) {
  const size_t max = k->max_bytes(cfg);
  const char *u = json_string_value(url);
  const size_t ul = json_string_length(url);
  if (!strncasecmp(u, "http://", 7) || !strncasecmp(u, "https://", 8)) {
    if (!cfg->allowed_image_domains || !*cfg->allowed_image_domains)
      return oai_fail(e, 400, pp, "remote_url_not_allowed",
                      "remote %s URLs are not fetched by this server (no server-side requests without "
                      "--allowed-image-domains); send the %s inline as a %s URL", k->what, k->what, k->example);
    const imgfetch_limits fl = {cfg->allowed_image_domains, max, cfg->image_fetch_timeout_s};
    char ferr[256];
    if (imgfetch_check(u, &fl, ferr, sizeof ferr))
      return oai_fail(e, 400, pp, "remote_url_not_allowed", "%s", ferr);
    if (imgfetch_get(u, &fl, out, n, ferr, sizeof ferr)) return oai_fail(e, 400, pp, k->fetch_failed, "%s", ferr);
    return 0;
  }
  if (strncasecmp(u, "data:", 5))
    return oai_fail(e, 400, pp, "invalid_value", "'%s.url' must be a data: URL (%s)", pp, k->example);
  const char *comma = memchr(u, ',', ul);
  if (!comma)
    return oai_fail(e, 400, pp, "invalid_value", "'%s.url': a data: URL needs a ',' before its data", pp);
  const size_t hl = (size_t)(comma - u);
  if (hl < 11 || strncasecmp(u + 5, k->mime, 6)) {
    size_t ml = strcspn(u + 5, ";,");
    return oai_fail(e, 400, pp, "unsupported_media_type", "'%s.url': the data: URL's media type must be %s*, got "
                    "'%.*s'", pp, k->mime, (int)(ml > 40 ? 40 : ml), u + 5);
  }
  if (hl < 7 || strncasecmp(comma - 7, ";base64", 7))
    return oai_fail(e, 400, pp, "invalid_value", "'%s.url': only base64 data: URLs are accepted (';base64,')", pp);
  const char *b = comma + 1;
  const size_t bl = ul - hl - 1;
  if (bl / 4 * 3 > max + k->slack)
    return oai_fail(e, 400, pp, k->too_large, "the %s is about %zu bytes; this server takes at most %zu bytes per %s (%s)",
                    k->what, bl / 4 * 3, max, k->what, k->flag);
  uint8_t *bytes = malloc(bl / 4 * 3 + 3);
  if (!bytes) return oai_fail(e, 500, NULL, NULL, "out of memory");
  size_t bad = 0;
  long nb = b64_decode(b, bl, bytes, &bad);
  if (nb <= 0) {
    free(bytes);
    return oai_fail(e, 400, pp, "invalid_base64",
                    nb == 0 ? "'%s.url': the %s data is empty" : "'%s.url': invalid base64 in the %s data (at data offset %zu)",
                    pp, k->what, bad);
  }
  *out = bytes;
  *n = (size_t)nb;
  return 0;
}

/* One image_url part: a data: URL (base64), or an http(s) URL on an allowed host (imgfetch.h),
 * decoded and prepared for the model's tower. */
static int image_part(img_list *l, json_t *part, const char *p, size_t i, oai_error *e) {
  const oai_config *cfg = l->cfg;
  char pp[96];
  snprintf(pp, sizeof pp, "%s[%zu].image_url", p, i);
  if (!cfg->model || !anna_model_has_vision(cfg->model))
    return oai_fail(e, 400, pp, "unsupported_content",
                    "the model '%s' is text only: it does not accept images (content part type 'image_url')",
                    cfg->model_name);
  if (l->n >= cfg->max_images || l->n >= 64)
    return oai_fail(e, 400, pp, "too_many_images",
                    "too many images: this server takes at most %d per request (--max-images-per-request)",
                    cfg->max_images < 64 ? cfg->max_images : 64);
  json_t *iu = json_object_get(part, "image_url"), *url = json_is_object(iu) ? json_object_get(iu, "url") : iu;
  if (!json_is_string(url))
    return oai_fail(e, 400, pp, "invalid_type", "'%s' must be {\"url\": \"data:image/...;base64,...\"}", pp);
  json_t *detail = json_is_object(iu) ? json_object_get(iu, "detail") : NULL;
  if (detail && !json_is_null(detail) &&
      (!json_is_string(detail) || (strcmp(json_string_value(detail), "auto") &&
                                   strcmp(json_string_value(detail), "low") && strcmp(json_string_value(detail), "high"))))
    return oai_fail(e, 400, pp, "invalid_value", "'%s.detail' must be auto, low or high (all three mean the model's "
                    "own resolution here)", pp);
  uint8_t *bytes = NULL;
  size_t n = 0;
  if (media_url_bytes(cfg, &MEDIA_IMAGE, url, pp, &bytes, &n, e)) return -1;
  return image_bytes(l, bytes, n, pp, e);
}

/* Encoded video bytes (freed here) -> the next media of l: FFmpeg decode, frame sampling and
 * the video processor on this (connection) thread, limits from the flags. */
static int video_bytes(img_list *l, uint8_t *bytes, size_t n, const char *pp, oai_error *e) {
  const oai_config *cfg = l->cfg;
  const anna_video_limits lim = {.max_bytes = (int64_t)cfg->max_video_bytes,
                                 .max_pixels = cfg->max_video_pixels,
                                 .max_seconds = cfg->max_video_seconds,
                                 .max_frames = cfg->max_video_frames,
                                 .threads = 1};
  char err[256];
  int rc = anna_media_video_decode(&l->media[l->n], cfg->model, bytes, n, &lim, err, sizeof err);
  free(bytes);
  if (rc == ANNA_ENOMEM) return oai_fail(e, 500, NULL, NULL, "out of memory");
  if (rc) { /* media/video.h's limit messages say which limit */
    const char *flag = !strstr(err, "exceed") ? NULL
                       : strstr(err, "bytes exceed")  ? "--max-video-bytes"
                       : strstr(err, "pixels per frame") ? "--max-video-pixels"
                       : strstr(err, "sampled frames") ? "--max-video-frames"
                                                       : "--max-video-seconds";
    const char *msg = strncmp(err, "video: ", 7) ? err : err + 7;
    if (flag)
      return oai_fail(e, 400, pp, "video_too_large", "video %d: %s (%s)", l->n_video, msg, flag);
    return oai_fail(e, 400, pp, rc == ANNA_EUNSUPPORTED ? "unsupported_content" : "invalid_video",
                    "video %d: %s", l->n_video, msg);
  }
  l->n++;
  l->n_video++;
  return 0;
}

/* One video_url part (vLLM's form: {"type": "video_url", "video_url": {"url": ...}}): a
 * data:video/...;base64 URL, or an http(s) URL on a host of --allowed-image-domains. */
static int video_part(img_list *l, json_t *part, const char *p, size_t i, oai_error *e) {
  const oai_config *cfg = l->cfg;
  char pp[96];
  snprintf(pp, sizeof pp, "%s[%zu].video_url", p, i);
  if (!cfg->model || !anna_model_has_vision(cfg->model))
    return oai_fail(e, 400, pp, "unsupported_content",
                    "the model '%s' is text only: it does not accept video (content part type 'video_url')",
                    cfg->model_name);
  if (l->n_video >= cfg->max_videos)
    return oai_fail(e, 400, pp, "too_many_videos",
                    "too many videos: this server takes at most %d per request (--max-videos-per-request)",
                    cfg->max_videos);
  if (l->n >= cfg->max_images || l->n >= 64)
    return oai_fail(e, 400, pp, "too_many_images",
                    "too many images and videos: this server takes at most %d per request "
                    "(--max-images-per-request)", cfg->max_images < 64 ? cfg->max_images : 64);
  json_t *vu = json_object_get(part, "video_url"), *url = json_is_object(vu) ? json_object_get(vu, "url") : vu;
  if (!json_is_string(url))
    return oai_fail(e, 400, pp, "invalid_type", "'%s' must be {\"url\": \"data:video/mp4;base64,...\"}", pp);
  uint8_t *bytes = NULL;
  size_t n = 0;
  if (media_url_bytes(cfg, &MEDIA_VIDEO, url, pp, &bytes, &n, e)) return -1;
  return video_bytes(l, bytes, n, pp, e);
}

/* Content as a plain string: a string, null, or an array of text parts; with image parts
 * (imgs not NULL: user messages) an array of {type: text, text} and {type: image} parts for
 * the template, the images appended to imgs. */
static int content_text(json_t *c, int idx, img_list *imgs, json_t **out, oai_error *e) {
  char p[64];
  snprintf(p, sizeof p, "messages[%d].content", idx);
  if (!c || json_is_null(c)) {
    *out = NULL;
    return 0;
  }
  if (json_is_string(c)) {
    *out = json_incref(c);
    return 0;
  }
  if (!json_is_array(c))
    return oai_fail(e, 400, p, "invalid_type",
                    "'%s' must be a string or an array of content parts, got %s", p, type_name(c));
  size_t total = 0;
  for (size_t i = 0; i < json_array_size(c); i++) {
    json_t *part = json_array_get(c, i), *t = json_object_get(part, "type"),
           *tx = json_object_get(part, "text");
    if (!json_is_object(part) || !json_is_string(t))
      return oai_fail(e, 400, p, "invalid_type", "'%s[%zu]' must be an object with a 'type'", p, i);
    if (!strcmp(json_string_value(t), "image_url") || !strcmp(json_string_value(t), "video_url")) {
      if (!imgs)
        return oai_fail(e, 400, p, "unsupported_content", "'%s[%zu]': %s are only accepted in user messages",
                        p, i, json_string_value(t)[0] == 'i' ? "images" : "videos");
      continue;
    }
    if (strcmp(json_string_value(t), "text"))
      return oai_fail(e, 400, p, "unsupported_content",
                      "content part type '%.40s' is not supported by this model",
                      json_string_value(t));
    if (!json_is_string(tx))
      return oai_fail(e, 400, p, "invalid_type", "'%s[%zu].text' must be a string", p, i);
    total += json_string_length(tx);
  }
  int has_img = 0;
  for (size_t i = 0; i < json_array_size(c); i++)
    has_img |= !strcmp(json_string_value(json_object_get(json_array_get(c, i), "type")), "image_url") ||
               !strcmp(json_string_value(json_object_get(json_array_get(c, i), "type")), "video_url");
  if (has_img) { /* parts in order: the template puts each image's placeholder where it was */
    json_t *parts = json_array();
    for (size_t i = 0; parts && i < json_array_size(c); i++) {
      json_t *part = json_array_get(c, i);
      if (!strcmp(json_string_value(json_object_get(part, "type")), "image_url")) {
        if (image_part(imgs, part, p, i, e)) {
          json_decref(parts);
          return -1;
        }
        json_array_append_new(parts, json_pack("{s:s}", "type", "image"));
      } else if (!strcmp(json_string_value(json_object_get(part, "type")), "video_url")) {
        if (video_part(imgs, part, p, i, e)) {
          json_decref(parts);
          return -1;
        }
        json_array_append_new(parts, json_pack("{s:s}", "type", "video"));
      } else {
        json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", json_object_get(part, "text")));
      }
    }
    *out = parts;
    return parts ? 0 : oai_fail(e, 500, NULL, NULL, "out of memory");
  }
  char *buf = malloc(total + 1);
  if (!buf) return oai_fail(e, 500, NULL, NULL, "out of memory");
  size_t at = 0;
  for (size_t i = 0; i < json_array_size(c); i++) {
    json_t *tx = json_object_get(json_array_get(c, i), "text");
    memcpy(buf + at, json_string_value(tx), json_string_length(tx));
    at += json_string_length(tx);
  }
  *out = json_stringn(buf, at);
  free(buf);
  return *out ? 0 : oai_fail(e, 500, NULL, NULL, "out of memory");
}

static int parse_messages(json_t *root, img_list *imgs, json_t **out, oai_error *e) {
  json_t *msgs = json_object_get(root, "messages");
  if (!msgs)
    return oai_fail(e, 400, "messages", "missing_required_parameter", "'messages' is required");
  if (!json_is_array(msgs))
    return oai_fail(e, 400, "messages", "invalid_type", "'messages' must be an array, got %s",
                    type_name(msgs));
  if (json_array_size(msgs) == 0)
    return oai_fail(e, 400, "messages", "invalid_value", "'messages' must not be empty");
  if (json_array_size(msgs) > 4096)
    return oai_fail(e, 400, "messages", "invalid_value", "too many messages");
  json_t *norm = json_array();
  for (size_t i = 0; i < json_array_size(msgs); i++) {
    json_t *m = json_array_get(msgs, i);
    char p[64];
    snprintf(p, sizeof p, "messages[%zu]", i);
    if (!json_is_object(m)) {
      json_decref(norm);
      return oai_fail(e, 400, p, "invalid_type", "'%s' must be an object, got %s", p, type_name(m));
    }
    json_t *role = json_object_get(m, "role");
    const char *rs = json_is_string(role) ? json_string_value(role) : NULL;
    if (!rs || (strcmp(rs, "system") && strcmp(rs, "developer") && strcmp(rs, "user") &&
                strcmp(rs, "assistant") && strcmp(rs, "tool"))) {
      json_decref(norm);
      snprintf(p, sizeof p, "messages[%zu].role", i);
      return oai_fail(e, 400, p, "invalid_value",
                      "'%s' must be one of system, developer, user, assistant, tool", p);
    }
    json_t *content;
    if (content_text(json_object_get(m, "content"), (int)i, !strcmp(rs, "user") ? imgs : NULL, &content, e)) {
      json_decref(norm);
      return -1;
    }
    json_t *tc = json_object_get(m, "tool_calls");
    int is_asst = !strcmp(rs, "assistant");
    if (!content && !(is_asst && tc)) {
      json_decref(norm);
      snprintf(p, sizeof p, "messages[%zu].content", i);
      return oai_fail(e, 400, p, "missing_required_parameter", "'%s' is required for role '%s'", p,
                      rs);
    }
    json_t *nm = json_object();
    json_object_set_new(nm, "role", json_string(!strcmp(rs, "developer") ? "system" : rs));
    json_object_set_new(nm, "content", content ? content : json_string(""));
    json_t *v;
    if ((v = json_object_get(m, "name")) && json_is_string(v)) json_object_set(nm, "name", v);
    if ((v = json_object_get(m, "tool_call_id")) && json_is_string(v))
      json_object_set(nm, "tool_call_id", v);
    if ((v = json_object_get(m, "reasoning_content")) && json_is_string(v))
      json_object_set(nm, "reasoning_content", v);
    if (tc && !json_is_null(tc)) {
      snprintf(p, sizeof p, "messages[%zu].tool_calls", i);
      if (!is_asst || !json_is_array(tc)) {
        json_decref(nm);
        json_decref(norm);
        return oai_fail(e, 400, p, "invalid_value", "'%s' must be an array on an assistant message",
                        p);
      }
      json_t *calls = json_array();
      for (size_t k = 0; k < json_array_size(tc); k++) {
        json_t *c = json_array_get(tc, k), *fn = json_object_get(c, "function");
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        if (!json_is_object(c) || !json_is_object(fn) || !json_is_string(name) ||
            (args && !json_is_string(args) && !json_is_object(args))) {
          json_decref(calls);
          json_decref(nm);
          json_decref(norm);
          return oai_fail(e, 400, p, "invalid_value",
                          "'%s[%zu]' must be {type, function: {name, arguments}}", p, k);
        }
        /* Templates index into the arguments, so a JSON string becomes an object. */
        json_t *aobj = NULL;
        if (json_is_string(args)) {
          json_error_t je;
          aobj = json_loads(json_string_value(args), 0, &je);
          if (!json_is_object(aobj)) {
            json_decref(aobj);
            aobj = json_incref(args);
          }
        } else {
          aobj = args ? json_incref(args) : json_object();
        }
        json_t *nc = json_pack("{s:s,s:{s:O,s:o}}", "type", "function", "function", "name", name,
                               "arguments", aobj);
        if ((v = json_object_get(c, "id")) && json_is_string(v)) json_object_set(nc, "id", v);
        json_array_append_new(calls, nc);
      }
      json_object_set_new(nm, "tool_calls", calls);
    }
    json_array_append_new(norm, nm);
  }
  *out = norm;
  return 0;
}

/* *force: the function a reply must call (tool_choice names it, or "required" with one
 * tool); borrowed from root. */
static int parse_tools(json_t *root, json_t **tools_out, int *use_tools, const char **force,
                       oai_error *e) {
  *tools_out = NULL;
  *use_tools = 0;
  *force = NULL;
  json_t *tools = json_object_get(root, "tools"), *choice = json_object_get(root, "tool_choice");
  if (tools && !json_is_null(tools)) {
    if (!json_is_array(tools))
      return oai_fail(e, 400, "tools", "invalid_type", "'tools' must be an array, got %s",
                      type_name(tools));
    if (json_array_size(tools) > 128)
      return oai_fail(e, 400, "tools", "invalid_value", "at most 128 tools");
    for (size_t i = 0; i < json_array_size(tools); i++) {
      json_t *t = json_array_get(tools, i), *ty = json_object_get(t, "type"),
             *fn = json_object_get(t, "function");
      char p[48];
      snprintf(p, sizeof p, "tools[%zu]", i);
      if (!json_is_object(t) || !json_is_string(ty) || strcmp(json_string_value(ty), "function") ||
          !json_is_object(fn))
        return oai_fail(e, 400, p, "invalid_value",
                        "'%s' must be {\"type\": \"function\", \"function\": {...}}", p);
      json_t *name = json_object_get(fn, "name"), *params = json_object_get(fn, "parameters"),
             *desc = json_object_get(fn, "description");
      if (!json_is_string(name) || !valid_fn_name(json_string_value(name)))
        return oai_fail(e, 400, p, "invalid_value",
                        "'%s.function.name' must be 1-64 letters, digits, '_', '-' or '.'", p);
      if (params && !json_is_null(params) && !json_is_object(params))
        return oai_fail(e, 400, p, "invalid_value",
                        "'%s.function.parameters' must be a JSON Schema object", p);
      if (desc && !json_is_null(desc) && !json_is_string(desc))
        return oai_fail(e, 400, p, "invalid_type", "'%s.function.description' must be a string", p);
    }
  }
  int has_tools = tools && json_is_array(tools) && json_array_size(tools) > 0;
  int none = 0;
  if (choice && !json_is_null(choice)) {
    if (!has_tools)
      return oai_fail(e, 400, "tool_choice", "invalid_value",
                      "'tool_choice' is only allowed when 'tools' are given");
    if (json_is_string(choice)) {
      const char *c = json_string_value(choice);
      if (strcmp(c, "none") && strcmp(c, "auto") && strcmp(c, "required"))
        return oai_fail(e, 400, "tool_choice", "invalid_value",
                        "'tool_choice' must be none, auto, required or a function");
      none = !strcmp(c, "none");
      if (!strcmp(c, "required") && json_array_size(tools) == 1)
        *force = json_string_value(
            json_object_get(json_object_get(json_array_get(tools, 0), "function"), "name"));
    } else {
      json_t *fn = json_object_get(choice, "function"), *name = json_object_get(fn, "name");
      if (!json_is_object(choice) || !json_is_string(name))
        return oai_fail(e, 400, "tool_choice", "invalid_value",
                        "'tool_choice' must be a string or {type: function, function: {name}}");
      int found = 0;
      for (size_t i = 0; i < json_array_size(tools); i++)
        found |= !strcmp(json_string_value(json_object_get(
                             json_object_get(json_array_get(tools, i), "function"), "name")),
                         json_string_value(name));
      if (!found)
        return oai_fail(e, 400, "tool_choice", "invalid_value",
                        "'tool_choice' names a function that is not in 'tools'");
      *force = json_string_value(name);
    }
  }
  if (has_tools && !none) {
    *tools_out = tools;
    *use_tools = 1;
  }
  return 0;
}

/* "Any JSON object" as a compiled schema: JSON mode runs on the schema mask too, which
 * walks the vocabulary in byte order instead of probing every token. */
static int object_schema(jsonschema **out) {
  json_t *o = json_pack("{s:s}", "type", "object");
  char err[128];
  int rc = o ? jsonschema_get(o, out, err, sizeof err) : ANNA_ENOMEM;
  json_decref(o);
  return rc;
}

static int parse_response_format(json_t *root, gen_request *r, oai_error *e) {
  json_t *rf = json_object_get(root, "response_format");
  if (!rf || json_is_null(rf)) return 0;
  json_t *t = json_object_get(rf, "type");
  if (!json_is_object(rf) || !json_is_string(t))
    return oai_fail(e, 400, "response_format", "invalid_value",
                    "'response_format' must be an object with a 'type'");
  const char *ts = json_string_value(t);
  if (!strcmp(ts, "json_schema") && !json_is_object(json_object_get(rf, "json_schema")))
    return oai_fail(e, 400, "response_format", "invalid_value",
                    "'response_format.json_schema' must be an object");
  if (strcmp(ts, "text") && strcmp(ts, "json_object") && strcmp(ts, "json_schema"))
    return oai_fail(e, 400, "response_format", "invalid_value",
                    "'response_format.type' must be text, json_object or json_schema");
  r->json_mode = strcmp(ts, "text") != 0;
  if (r->json_mode && object_schema(&r->schema)) return oai_fail(e, 500, NULL, NULL, "out of memory");
  if (strcmp(ts, "json_schema")) return 0;
  /* json_schema: the schema is enforced whether strict is true or false (a reply that does
   * not follow it helps nobody); without a schema the reply is held to a JSON object. */
  json_t *js = json_object_get(rf, "json_schema"), *sch = json_object_get(js, "schema");
  const char *k;
  json_t *v;
  json_object_foreach(js, k, v) {
    if (strcmp(k, "name") && strcmp(k, "description") && strcmp(k, "schema") && strcmp(k, "strict"))
      return oai_fail(e, 400, "response_format.json_schema", "invalid_value",
                      "unknown field 'response_format.json_schema.%s'", k);
  }
  v = json_object_get(js, "strict");
  if (v && !json_is_null(v) && !json_is_boolean(v))
    return oai_fail(e, 400, "response_format.json_schema.strict", "invalid_type",
                    "'response_format.json_schema.strict' must be a boolean");
  if (!sch || json_is_null(sch)) return 0;
  char err[400];
  jsonschema_release(r->schema);
  r->schema = NULL;
  int rc = jsonschema_get(sch, &r->schema, err, sizeof err);
  if (rc == ANNA_ENOMEM) return oai_fail(e, 500, NULL, NULL, "out of memory");
  if (rc)
    return oai_fail(e, 400, "response_format.json_schema.schema", "invalid_value",
                    "unsupported or invalid schema: %s", err);
  return 0;
}

/* The compiled parameters schema of the forced function, or NULL when its parameters say
 * nothing beyond "an object" (the JSON-object mask is then enough). */
static int forced_schema(json_t *root, const char *name, jsonschema **out, oai_error *e) {
  *out = NULL;
  json_t *tools = json_object_get(root, "tools"), *params = NULL;
  for (size_t i = 0; i < json_array_size(tools); i++) {
    json_t *fn = json_object_get(json_array_get(tools, i), "function");
    if (!strcmp(json_string_value(json_object_get(fn, "name")), name))
      params = json_object_get(fn, "parameters");
  }
  if (!json_is_object(params)) return 0;
  json_t *ty = json_object_get(params, "type");
  if (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "object")))
    return oai_fail(e, 400, "tools", "invalid_value",
                    "the parameters of function '%s' must be an object schema", name);
  if (!json_object_get(params, "properties") && !json_object_get(params, "$ref") &&
      !json_object_get(params, "anyOf"))
    return 0;
  char err[400];
  int rc = jsonschema_get(params, out, err, sizeof err);
  if (rc == ANNA_ENOMEM) return oai_fail(e, 500, NULL, NULL, "out of memory");
  if (rc)
    return oai_fail(e, 400, "tools", "invalid_value",
                    "the parameters schema of function '%s' is unsupported or invalid: %s", name, err);
  return 0;
}

/* Did the rendered prompt leave a <think> block open (Qwen3.5 templates do)? */
static int prompt_opens_think(const anna_text *tok, const int32_t *ids, size_t n) {
  size_t k = n < 8 ? n : 8;
  char *s = NULL;
  size_t len = 0;
  if (anna_text_detokenize(tok, ids + n - k, k, 0, &s, &len, NULL, 0)) return 0;
  const char *open = NULL;
  for (const char *p = s; (p = strstr(p, "<think>")); p++)
    open = p;
  int r = open && !strstr(open, "</think>");
  free(s);
  return r;
}

/* tool_choice that names a function, for templates whose calls are
 * <tool_call>{"name": ..., "arguments": {...}}</tool_call> (the rendered tool instructions say
 * so): the reply is forced to open that call, its arguments are held to one JSON object, and
 * the call is closed. Templates with another call syntax (Qwen3.5 XML) are left free. */
static int force_tool_call(const oai_config *cfg, gen_request *r, const char *name,
                           jsonschema **schema) {
  char *prompt = NULL;
  size_t plen = 0;
  if (anna_text_detokenize(cfg->text, r->prompts[0], r->n_prompt[0], 0, &prompt, &plen, NULL, 0))
    return 0;
  int json_style = strstr(prompt, "<tool_call>") && !strstr(prompt, "<function=");
  free(prompt);
  if (!json_style) return 0;
  char pre[160];
  snprintf(pre, sizeof pre, "<tool_call>\n{\"name\": \"%s\", \"arguments\": ", name);
  const char *suf = "}\n</tool_call>";
  if (anna_text_tokenize(cfg->text, pre, strlen(pre), 0, &r->prefix, &r->n_prefix, NULL, 0) ||
      anna_text_tokenize(cfg->text, suf, strlen(suf), 0, &r->suffix, &r->n_suffix, NULL, 0))
    return ANNA_ENOMEM;
  r->json_mode = 1;
  /* The arguments follow the tool's parameters (taken over), or are any object. */
  jsonschema_release(r->schema);
  r->schema = NULL;
  if (*schema) {
    r->schema = *schema;
    *schema = NULL;
  } else if (object_schema(&r->schema)) {
    return ANNA_ENOMEM;
  }
  return 0;
}

static int set_prompts(gen_request *r, int n) {
  r->n_prompts = n;
  r->prompts = calloc((size_t)n, sizeof *r->prompts);
  r->n_prompt = calloc((size_t)n, sizeof *r->n_prompt);
  return r->prompts && r->n_prompt ? 0 : ANNA_ENOMEM;
}

/* The rendered prompt has one image pad id per image: each becomes the image's run of
 * anna_media_n_tokens pads (the HF processor's expansion), and the images move to r. */
static int expand_images(const oai_config *cfg, gen_request *r, img_list *imgs, oai_error *e) {
  anna_vision_info vi;
  char err[256];
  if (anna_model_vision_info(cfg->model, &vi, err, sizeof err))
    return oai_fail(e, 400, "messages", "unsupported_content", "%s", err);
  const int32_t *ids = r->prompts[0];
  const size_t n0 = r->n_prompt[0];
  size_t total = n0, pads = 0;
  for (size_t i = 0; i < n0; i++) pads += ids[i] == vi.image_token_id;
  if (pads != (size_t)imgs->n)
    return oai_fail(e, 400, "messages", "invalid_value",
                    "the prompt has %zu image placeholder tokens for %d images (a message's text may not contain "
                    "the image pad token, and the chat template must render image parts)", pads, imgs->n);
  for (int k = 0; k < imgs->n; k++) total += (size_t)anna_media_n_tokens(imgs->media[k]) - 1;
  int32_t *out = malloc(sizeof *out * total), *at = malloc(sizeof *at * (size_t)imgs->n);
  anna_media **media = malloc(sizeof *media * (size_t)imgs->n);
  if (!out || !at || !media) {
    free(out), free(at), free(media);
    return oai_fail(e, 500, NULL, NULL, "out of memory");
  }
  size_t o = 0;
  int k = 0;
  for (size_t i = 0; i < n0; i++) {
    if (ids[i] != vi.image_token_id) {
      out[o++] = ids[i];
      continue;
    }
    at[k] = (int32_t)o;
    for (int32_t j = 0; j < anna_media_n_tokens(imgs->media[k]); j++) out[o++] = ids[i];
    k++;
  }
  if (o == 0 || out[o - 1] == vi.image_token_id) {
    free(out), free(at), free(media);
    return oai_fail(e, 400, "messages", "invalid_value", "the prompt must not end with an image");
  }
  memcpy(media, imgs->media, sizeof *media * (size_t)imgs->n);
  free(r->prompts[0]);
  r->prompts[0] = out;
  r->n_prompt[0] = o;
  r->media = media;
  r->media_at = at;
  r->n_media = imgs->n;
  imgs->n = 0; /* r owns them now */
  return 0;
}

/* The prompt anna_text_encode_chat_media built (pads already expanded): the media move to r with
 * their run starts (media_at, freed here). */
static int take_media(gen_request *r, img_list *imgs, int32_t *media_at, oai_error *e) {
  const int32_t *ids = r->prompts[0];
  const size_t n = r->n_prompt[0];
  anna_media **media = malloc(sizeof *media * (size_t)imgs->n);
  if (!media) {
    free(media_at);
    return oai_fail(e, 500, NULL, NULL, "out of memory");
  }
  const int32_t last = n ? ids[n - 1] : -1;
  int ends_with_media = n == 0;
  for (int k = 0; k < imgs->n && !ends_with_media; k++)
    ends_with_media = last == ids[media_at[k]]; /* the last token is an image or video pad */
  if (ends_with_media) {
    free(media), free(media_at);
    return oai_fail(e, 400, "messages", "invalid_value", "the prompt must not end with an image or a video");
  }
  memcpy(media, imgs->media, sizeof *media * (size_t)imgs->n);
  r->media = media;
  r->media_at = media_at;
  r->n_media = imgs->n;
  imgs->n = 0; /* r owns them now */
  imgs->n_video = 0;
  return 0;
}

/* The `grammar` field (llama-server; vLLM's `guided_grammar` is the same): a GBNF text the
 * output must follow. Not with response_format json_object / json_schema or a forced tool
 * call (two constraints on one output). */
static int parse_grammar_field(json_t *root, gen_request *r, oai_error *e) {
  json_t *g = json_object_get(root, "grammar"), *gg = json_object_get(root, "guided_grammar");
  const char *name = "grammar";
  if (json_is_null(g)) g = NULL;
  if (json_is_null(gg)) gg = NULL;
  if (g && gg)
    return oai_fail(e, 400, "guided_grammar", "invalid_value",
                    "'grammar' and 'guided_grammar' are the same field: give one");
  if (gg) g = gg, name = "guided_grammar";
  if (!g) return 0;
  if (!json_is_string(g))
    return oai_fail(e, 400, name, "invalid_type", "'%s' must be a string (a GBNF grammar)", name);
  if (r->json_mode || r->prefix)
    return oai_fail(e, 400, name, "invalid_value",
                    "'%s' cannot be combined with %s: both constrain the output", name,
                    r->prefix ? "a forced tool call (tool_choice)" : "response_format json_object/json_schema");
  char err[400];
  int rc = gbnf_get(json_string_value(g), json_string_length(g), &r->grammar, err, sizeof err);
  if (rc == ANNA_ENOMEM) return oai_fail(e, 500, NULL, NULL, "out of memory");
  if (rc) return oai_fail(e, 400, name, "invalid_value", "invalid grammar: %s", err);
  return 0;
}

static int parse_chat(const oai_config *cfg, json_t *root, oai_job *job, oai_error *e) {
  gen_request *r = job->r;
  json_t *msgs = NULL, *tools = NULL, *kw_own = NULL;
  img_list imgs = {.cfg = cfg};
  const char *force = NULL;
  jsonschema *fschema = NULL; /* before the first goto: done releases it */
  int rc = -1;
  if (parse_messages(root, &imgs, &msgs, e)) goto done;
  if (parse_tools(root, &tools, &job->tools, &force, e) || parse_response_format(root, r, e))
    goto done;
  if (force && forced_schema(root, force, &fschema, e)) goto done;
  json_t *kw = json_object_get(root, "chat_template_kwargs");
  if (kw && !json_is_null(kw) && !json_is_object(kw)) {
    oai_fail(e, 400, "chat_template_kwargs", "invalid_type",
             "'chat_template_kwargs' must be an object");
    goto done;
  }
  if (json_is_null(kw)) kw = NULL;
  if (cfg->default_enable_thinking >= 0 && !json_object_get(kw, "enable_thinking")) {
    kw_own = kw ? json_deep_copy(kw) : json_object();
    json_object_set_new(kw_own, "enable_thinking", json_boolean(cfg->default_enable_thinking));
    kw = kw_own;
  }
  long long lp = 0;
  int logprobs = 0, present;
  if (get_bool(root, "logprobs", &logprobs, e) ||
      get_int(root, "top_logprobs", 0, GEN_MAX_TOP, &lp, &present, e))
    goto done;
  if (present && !logprobs) {
    oai_fail(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs': true");
    goto done;
  }
  r->logprobs = logprobs;
  r->top_logprobs = (int)lp;
  char err[512];
  if (set_prompts(r, 1)) {
    oai_fail(e, 500, NULL, NULL, "out of memory");
    goto done;
  }
  /* anna.h takes JSON as text; jansson writes reals with 17 significant digits and keeps key
   * order, so the template sees exactly the values parsed here. */
  const size_t jf = JSON_COMPACT | JSON_ENCODE_ANY;
  char *mj = json_dumps(msgs, jf), *tj = tools ? json_dumps(tools, jf) : NULL;
  char *kj = kw ? json_dumps(kw, jf) : NULL;
  int oom = !mj || (tools && !tj) || (kw && !kj);
  int32_t *media_at = NULL; /* with video: the prompt is built with the media (timestamp text) */
  int terr = oom            ? ANNA_ENOMEM
             : imgs.n_video ? anna_text_encode_chat_media(cfg->text, cfg->model, mj, tj, kj, imgs.media, imgs.n,
                                                          &r->prompts[0], &r->n_prompt[0], &media_at, err, sizeof err)
                            : anna_text_encode_chat(cfg->text, mj, tj, kj, &r->prompts[0], &r->n_prompt[0], err,
                                                    sizeof err);
  free(mj);
  free(tj);
  free(kj);
  if (oom) {
    oai_fail(e, 500, NULL, NULL, "out of memory");
    goto done;
  }
  if (terr && imgs.n_video && terr == ANNA_EINVAL) {
    oai_fail(e, 400, "messages", "invalid_value", "%s", err);
    goto done;
  }
  if (terr) {
    oai_fail(e, 400, "messages", "template_error", "the chat template rejected these messages: %s",
             err);
    goto done;
  }
  if (imgs.n_video && take_media(r, &imgs, media_at, e)) goto done;
  if (imgs.n && !imgs.n_video && expand_images(cfg, r, &imgs, e)) goto done;
  job->reasoning = cfg->reasoning_deepseek;
  if (r->n_prompt[0])
    job->start_in_reasoning =
        job->reasoning && prompt_opens_think(cfg->text, r->prompts[0], r->n_prompt[0]);
  if (force && r->n_prompt[0] && force_tool_call(cfg, r, force, &fschema)) {
    oai_fail(e, 500, NULL, NULL, "out of memory");
    goto done;
  }
  rc = 0;
done:
  img_list_clear(&imgs);
  jsonschema_release(fschema);
  json_decref(kw_own);
  json_decref(msgs);
  return rc;
}

/* One completions prompt: a string or an array of token ids. */
static int completion_prompt(const oai_config *cfg, json_t *p, int32_t **ids, size_t *n,
                             oai_error *e) {
  char err[512];
  if (json_is_string(p)) {
    if (anna_text_tokenize(cfg->text, json_string_value(p), json_string_length(p),
                         ANNA_TOKENIZE_ADD_SPECIAL, ids, n, err, sizeof err))
      return oai_fail(e, 400, "prompt", "invalid_value", "cannot tokenize the prompt: %s", err);
    return 0;
  }
  if (json_is_array(p) && json_array_size(p) > 0) {
    size_t k = json_array_size(p);
    *ids = malloc(k * sizeof **ids);
    if (!*ids) return oai_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < k; i++) {
      json_t *v = json_array_get(p, i);
      int32_t vocab = anna_text_vocab(cfg->text);
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
        free(*ids);
        *ids = NULL;
        return oai_fail(e, 400, "prompt", "invalid_value",
                        "prompt token ids must be integers in [0, %d)", vocab);
      }
      (*ids)[i] = (int32_t)json_integer_value(v);
    }
    *n = k;
    return 0;
  }
  return oai_fail(e, 400, "prompt", "invalid_type",
                  "'prompt' must be a string, an array of token ids, or an array of those");
}

static int parse_completion(const oai_config *cfg, json_t *root, oai_job *job, oai_error *e) {
  gen_request *r = job->r;
  json_t *p = json_object_get(root, "prompt");
  if (!p || json_is_null(p))
    return oai_fail(e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
  json_t *sfx = json_object_get(root, "suffix");
  if (sfx && !json_is_null(sfx))
    return oai_fail(e, 400, "suffix", "unsupported", "'suffix' is not supported");
  int echo = 0;
  if (get_bool(root, "echo", &echo, e)) return -1;
  if (echo) return oai_fail(e, 400, "echo", "unsupported", "'echo' is not supported");
  long long lp = 0;
  int present;
  if (get_int(root, "logprobs", 0, 5, &lp, &present, e)) return -1;
  r->logprobs = present;
  r->top_logprobs = (int)lp;
  long long best_of;
  if (get_int(root, "best_of", 1, 16, &best_of, &present, e)) return -1;
  if (present && best_of != r->n)
    return oai_fail(e, 400, "best_of", "unsupported", "'best_of' other than 'n' is not supported");
  /* A list of prompts (strings or id lists) batches them: choice index = prompt * n + i. */
  int multi = json_is_array(p) && json_array_size(p) > 0 &&
              (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)));
  int np = multi ? (int)json_array_size(p) : 1;
  if (np > 64) return oai_fail(e, 400, "prompt", "invalid_value", "at most 64 prompts per request");
  if (set_prompts(r, np)) return oai_fail(e, 500, NULL, NULL, "out of memory");
  for (int i = 0; i < np; i++)
    if (completion_prompt(cfg, multi ? json_array_get(p, (size_t)i) : p, &r->prompts[i],
                          &r->n_prompt[i], e))
      return -1;
  return 0;
}

/* Every top-level field each route accepts (docs/api_fields.md says what each does); any
 * other is a 400 naming it, never silently ignored. NOOPS: accepted and ignored, as the
 * OpenAI SDKs and agents send them (checked for their type only). */
static const char *const CHAT_FIELDS[] = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
    "stream", "stream_options", "stop", "seed", "presence_penalty", "frequency_penalty",
    "logit_bias", "logprobs", "top_logprobs", "response_format", "tools", "tool_choice",
    "chat_template_kwargs", "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos",
    "grammar", "guided_grammar", "anna_debug_output", NULL};
static const char *const COMPLETION_FIELDS[] = {
    "model", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
    "stream", "stream_options", "stop", "seed", "presence_penalty", "frequency_penalty",
    "logit_bias", "logprobs", "echo", "suffix", "best_of", "top_k", "min_p",
    "repetition_penalty", "min_tokens", "ignore_eos", "grammar", "guided_grammar",
    "anna_debug_output", NULL};
static const struct {
  const char *name;
  int chat_only;
  int type; /* jansson type the value must have (null always passes) */
} NOOPS[] = {
    {"user", 0, JSON_STRING},          {"store", 1, JSON_TRUE},
    {"metadata", 1, JSON_OBJECT},      {"service_tier", 1, JSON_STRING},
    {"parallel_tool_calls", 1, JSON_TRUE}, {"safety_identifier", 1, JSON_STRING},
    {"prompt_cache_key", 1, JSON_STRING},
};

static int check_fields(json_t *root, int kind, oai_error *e) {
  const char *const *known = kind == OAI_CHAT ? CHAT_FIELDS : COMPLETION_FIELDS;
  const char *k;
  json_t *v;
  json_object_foreach(root, k, v) {
    int ok = 0;
    for (int i = 0; known[i] && !ok; i++)
      ok = !strcmp(k, known[i]);
    for (size_t i = 0; i < sizeof NOOPS / sizeof *NOOPS && !ok; i++) {
      if (strcmp(k, NOOPS[i].name) || (NOOPS[i].chat_only && kind != OAI_CHAT)) continue;
      int t = NOOPS[i].type;
      if (!json_is_null(v) && (t == JSON_TRUE ? !json_is_boolean(v) : json_typeof(v) != (json_type)t))
        return oai_fail(e, 400, k, "invalid_type", "'%s' must be %s, got %s", k,
                        t == JSON_TRUE ? "a boolean" : t == JSON_STRING ? "a string" : "an object",
                        type_name(v));
      ok = 1;
    }
    if (!ok)
      return oai_fail(e, 400, k, "unsupported_parameter",
                      "unknown or unsupported field '%.60s' (docs/api_fields.md lists the accepted ones)", k);
  }
  return 0;
}

int oai_parse(const oai_config *cfg, int kind, const char *body, size_t len, const char *rid,
              oai_job *job, oai_error *e) {
  memset(job, 0, sizeof *job);
  job->kind = kind;
  job->created = (long long)time(NULL);
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root)
    return oai_fail(e, 400, NULL, "invalid_json",
                    "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                    je.column);
  int rc = -1;
  if (!json_is_object(root)) {
    oai_fail(e, 400, NULL, "invalid_type", "the body must be a JSON object, got %s",
             type_name(root));
    goto done;
  }
  if (check_fields(root, kind, e)) goto done;
  job->r = gen_request_new();
  if (!job->r) {
    oai_fail(e, 500, NULL, NULL, "out of memory");
    goto done;
  }
  snprintf(job->r->id, sizeof job->r->id, "%s", rid);
  if (parse_model(cfg, root, job, e) || parse_sampling(cfg, root, job->r, e) ||
      parse_max_tokens(cfg, root, job->r, kind == OAI_CHAT ? cfg->default_max_tokens : 16, e) ||
      parse_min_tokens(cfg, root, job->r, e) || get_bool(root, "stream", &job->stream, e))
    goto done;
  json_t *so = json_object_get(root, "stream_options");
  if (so && !json_is_null(so)) {
    if (!json_is_object(so)) {
      oai_fail(e, 400, "stream_options", "invalid_type", "'stream_options' must be an object");
      goto done;
    }
    if (get_bool(so, "include_usage", &job->include_usage, e)) goto done;
  }
  if ((kind == OAI_CHAT ? parse_chat(cfg, root, job, e) : parse_completion(cfg, root, job, e)) ||
      parse_grammar_field(root, job->r, e))
    goto done;
  for (int i = 0; i < job->r->n_prompts; i++) {
    if (job->r->n_prompt[i] == 0) {
      oai_fail(e, 400, kind == OAI_CHAT ? "messages" : "prompt", "invalid_value",
               "the prompt is empty after tokenization");
      goto done;
    }
    if (job->r->n_prompt[i] >= (size_t)cfg->n_ctx) {
      oai_fail(e, 400, kind == OAI_CHAT ? "messages" : "prompt", "context_length_exceeded",
               "the prompt has %zu tokens; this server's context (--ctx-size) is %d tokens",
               job->r->n_prompt[i], cfg->n_ctx);
      goto done;
    }
  }
  json_t *dbg = json_object_get(root, "anna_debug_output");
  if (dbg && cfg->debug_hooks) {
    char err[256];
    if (!json_is_string(dbg) ||
        anna_text_tokenize(cfg->text, json_string_value(dbg), json_string_length(dbg), 0,
                         &job->r->forced, &job->r->n_forced, err, sizeof err)) {
      oai_fail(e, 400, "anna_debug_output", "invalid_value",
               "'anna_debug_output' must be a string of valid UTF-8");
      goto done;
    }
  }
  if (job->r->n_prompts * job->r->n > 64) {
    oai_fail(e, 400, "n", "invalid_value", "prompts x n must be at most 64");
    goto done;
  }
  if (gen_request_prepare(job->r)) {
    oai_fail(e, 500, NULL, NULL, "out of memory");
    goto done;
  }
  rc = 0;
done:
  json_decref(root);
  return rc;
}

/* ---- responses ---- */

typedef struct tc_item {
  char *name, *args;
} tc_item;

/* What one choice's text splits into (non-stream) or the events of one stream step. */
typedef struct split {
  char *content, *reasoning;
  size_t clen, ccap, rlen, rcap;
  tc_item *calls;
  int n_calls, cap_calls;
  /* streaming: ordered events */
  struct ev {
    int kind;
    size_t a, alen; /* into content/reasoning for text kinds, call index for tools */
  } * evs;
  int n_evs, cap_evs;
} split;

static int sb_add(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
  if (*len + n + 1 > *cap) {
    size_t nc = (*len + n + 1) * 2;
    char *nb = realloc(*b, nc);
    if (!nb) return ANNA_ENOMEM;
    *b = nb;
    *cap = nc;
  }
  memcpy(*b + *len, s, n);
  *len += n;
  (*b)[*len] = '\0';
  return 0;
}

static int split_sink(void *ud, int kind, const char *a, size_t alen, const char *b, size_t blen) {
  split *sp = ud;
  if (sp->n_evs == sp->cap_evs) {
    int nc = sp->cap_evs ? sp->cap_evs * 2 : 8;
    struct ev *ne = realloc(sp->evs, (size_t)nc * sizeof *ne);
    if (!ne) return ANNA_ENOMEM;
    sp->evs = ne;
    sp->cap_evs = nc;
  }
  struct ev *ev = &sp->evs[sp->n_evs];
  ev->kind = kind;
  if (kind == OUTPARSE_TOOL_CALL) {
    if (sp->n_calls == sp->cap_calls) {
      int nc = sp->cap_calls ? sp->cap_calls * 2 : 4;
      tc_item *ni = realloc(sp->calls, (size_t)nc * sizeof *ni);
      if (!ni) return ANNA_ENOMEM;
      sp->calls = ni;
      sp->cap_calls = nc;
    }
    sp->calls[sp->n_calls].name = strndup(a, alen);
    sp->calls[sp->n_calls].args = strndup(b, blen);
    ev->a = (size_t)sp->n_calls++;
  } else if (kind == OUTPARSE_REASONING) {
    ev->a = sp->rlen;
    ev->alen = alen;
    if (sb_add(&sp->reasoning, &sp->rlen, &sp->rcap, a, alen)) return ANNA_ENOMEM;
  } else {
    ev->a = sp->clen;
    ev->alen = alen;
    if (sb_add(&sp->content, &sp->clen, &sp->ccap, a, alen)) return ANNA_ENOMEM;
  }
  sp->n_evs++;
  return 0;
}

static void split_clear(split *sp) {
  free(sp->content);
  free(sp->reasoning);
  for (int i = 0; i < sp->n_calls; i++)
    free(sp->calls[i].name), free(sp->calls[i].args);
  free(sp->calls);
  free(sp->evs);
  memset(sp, 0, sizeof *sp);
}

static void call_id(char *out, size_t cap, const gen_request *r, int ci, int k) {
  /* Unique per request: the request id is unique, the rest indexes within it. */
  unsigned h = 2166136261u;
  for (const char *p = r->id; *p; p++)
    h = (h ^ (unsigned char)*p) * 16777619u;
  snprintf(out, cap, "call_%08x%04x%04x", h, (unsigned)ci & 0xffff, (unsigned)k & 0xffff);
}

static json_t *token_text(const anna_text *tok, int32_t id, json_t **bytes) {
  char *s = NULL;
  size_t n = 0;
  if (anna_text_detokenize(tok, &id, 1, 0, &s, &n, NULL, 0)) {
    s = strdup("");
    n = 0;
  }
  json_t *j = json_stringn(s ? s : "", s ? n : 0);
  if (!j) j = json_string("\xef\xbf\xbd");
  if (bytes) {
    *bytes = json_array();
    for (size_t i = 0; i < n; i++)
      json_array_append_new(*bytes, json_integer((unsigned char)s[i]));
  }
  free(s);
  return j;
}

/* Chat logprobs content entries for toks[from, to). */
static json_t *chat_logprobs(const anna_text *tok, const gen_token *toks, size_t from, size_t to) {
  json_t *arr = json_array();
  for (size_t i = from; i < to; i++) {
    const gen_token *g = &toks[i];
    json_t *bytes, *t = token_text(tok, g->id, &bytes), *top = json_array();
    for (int k = 0; k < g->n_top; k++) {
      json_t *tb, *tt = token_text(tok, g->top_id[k], &tb);
      json_array_append_new(top, json_pack("{s:o,s:f,s:o}", "token", tt, "logprob",
                                           (double)g->top_lp[k], "bytes", tb));
    }
    json_array_append_new(arr, json_pack("{s:o,s:f,s:o,s:o}", "token", t, "logprob",
                                         (double)g->logprob, "bytes", bytes, "top_logprobs", top));
  }
  return json_pack("{s:o}", "content", arr);
}

/* Completions (legacy) logprobs for toks[from, to), text offsets from base. */
static json_t *completion_logprobs(const anna_text *tok, const gen_token *toks, size_t from,
                                   size_t to, size_t *offset) {
  json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
  for (size_t i = from; i < to; i++) {
    const gen_token *g = &toks[i];
    json_t *t = token_text(tok, g->id, NULL);
    size_t tl = json_string_length(t);
    json_array_append_new(tokens, t);
    json_array_append_new(lps, json_real(g->logprob));
    json_t *top = json_object();
    for (int k = 0; k < g->n_top; k++) {
      json_t *tt = token_text(tok, g->top_id[k], NULL);
      json_object_set_new(top, json_string_value(tt), json_real(g->top_lp[k]));
      json_decref(tt);
    }
    json_array_append_new(tops, top);
    json_array_append_new(offs, json_integer((json_int_t)*offset));
    *offset += tl;
  }
  return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs",
                   tops, "text_offset", offs);
}

static const char *public_reason(const char *r, int has_calls) {
  if (!r) return "stop";
  if (!strcmp(r, "cancelled")) return "length"; /* cut short by shutdown: the text is truncated */
  if (!strcmp(r, "stop") && has_calls) return "tool_calls";
  return r;
}

static json_t *usage_json(const gen_request *r) {
  long long pt = 0, ct = 0;
  for (int p = 0; p < r->n_prompts; p++)
    pt += (long long)r->n_prompt[p];
  for (int i = 0; i < r->n_choices; i++)
    ct += r->choices[i].n_gen;
  return json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)pt, "completion_tokens",
                   (json_int_t)ct, "total_tokens", (json_int_t)(pt + ct));
}

static const char *id_prefix(int kind) {
  return kind == OAI_CHAT ? "chatcmpl-" : "cmpl-";
}

char *oai_response_json(const oai_config *cfg, const oai_job *job) {
  gen_request *r = job->r;
  json_t *choices = json_array();
  pthread_mutex_lock(&r->mu);
  for (int i = 0; i < r->n_choices; i++) {
    gen_choice *c = &r->choices[i];
    json_t *ch;
    if (job->kind == OAI_COMPLETION) {
      size_t off = 0;
      json_t *lp = r->logprobs ? completion_logprobs(cfg->text, c->toks, 0, c->n_toks, &off)
                               : json_null();
      ch = json_pack("{s:i,s:s%,s:o,s:s}", "index", i, "text", c->text ? c->text : "", c->text_len,
                     "logprobs", lp, "finish_reason", public_reason(c->finish_reason, 0));
    } else {
      split sp = {0};
      outparse *op = outparse_new(job->reasoning, job->start_in_reasoning, job->tools);
      if (op) outparse_feed(op, c->text ? c->text : "", c->text_len, 1, split_sink, &sp);
      outparse_free(op);
      json_t *msg = json_object();
      json_object_set_new(msg, "role", json_string("assistant"));
      int only_ws = 1;
      for (size_t k = 0; k < sp.clen; k++)
        only_ws &= isspace((unsigned char)sp.content[k]) != 0;
      json_object_set_new(msg, "content",
                          sp.n_calls && only_ws
                              ? json_null()
                              : json_stringn(sp.content ? sp.content : "", sp.clen));
      if (sp.reasoning)
        json_object_set_new(msg, "reasoning_content", json_stringn(sp.reasoning, sp.rlen));
      if (sp.n_calls) {
        json_t *calls = json_array();
        for (int k = 0; k < sp.n_calls; k++) {
          char id[48];
          call_id(id, sizeof id, r, i, k);
          json_array_append_new(
              calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function",
                               "name", sp.calls[k].name ? sp.calls[k].name : "", "arguments",
                               sp.calls[k].args ? sp.calls[k].args : "{}"));
        }
        json_object_set_new(msg, "tool_calls", calls);
      }
      json_t *lp = r->logprobs ? chat_logprobs(cfg->text, c->toks, 0, c->n_toks) : json_null();
      ch = json_pack("{s:i,s:o,s:o,s:s}", "index", i, "message", msg, "logprobs", lp,
                     "finish_reason", public_reason(c->finish_reason, sp.n_calls > 0));
      split_clear(&sp);
    }
    json_array_append_new(choices, ch);
  }
  json_t *usage = usage_json(r);
  pthread_mutex_unlock(&r->mu);
  char id[128];
  snprintf(id, sizeof id, "%s%s", id_prefix(job->kind), r->id);
  json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:o}", "id", id, "object",
                        job->kind == OAI_CHAT ? "chat.completion" : "text_completion", "created",
                        (json_int_t)job->created, "model", job->model, "system_fingerprint", "anna",
                        "choices", choices, "usage", usage);
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  return s;
}

/* ---- streaming ---- */

typedef struct stream_choice {
  outparse *op;
  size_t text_off, tok_off, lp_text_off;
  int role_sent, finish_sent, n_calls;
} stream_choice;

struct oai_stream {
  const oai_config *cfg;
  const oai_job *job;
  stream_choice *ch;
  int done_sent;
};

oai_stream *oai_stream_new(const oai_config *cfg, const oai_job *job) {
  oai_stream *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->cfg = cfg;
  s->job = job;
  s->ch = calloc((size_t)job->r->n_choices, sizeof *s->ch);
  if (!s->ch) {
    free(s);
    return NULL;
  }
  for (int i = 0; i < job->r->n_choices; i++) {
    if (job->kind == OAI_CHAT &&
        !(s->ch[i].op = outparse_new(job->reasoning, job->start_in_reasoning, job->tools))) {
      oai_stream_free(s);
      return NULL;
    }
  }
  return s;
}

void oai_stream_free(oai_stream *s) {
  if (!s) return;
  for (int i = 0; s->ch && i < s->job->r->n_choices; i++)
    outparse_free(s->ch[i].op);
  free(s->ch);
  free(s);
}

int oai_stream_has_news(const oai_stream *s) {
  const gen_request *r = s->job->r;
  for (int i = 0; i < r->n_choices; i++) {
    const gen_choice *c = &r->choices[i];
    const stream_choice *sc = &s->ch[i];
    if (c->text_len > sc->text_off || c->n_toks > sc->tok_off || (c->done && !sc->finish_sent) ||
        !sc->role_sent)
      return 1;
  }
  return !s->done_sent && r->n_done == r->n_choices;
}

static int emit_event(char **out, size_t *len, size_t *cap, json_t *o) {
  char *js = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (!js) return ANNA_ENOMEM;
  int rc = sb_add(out, len, cap, "data: ", 6);
  if (!rc) rc = sb_add(out, len, cap, js, strlen(js));
  if (!rc) rc = sb_add(out, len, cap, "\n\n", 2);
  free(js);
  return rc;
}

static json_t *chunk_base(const oai_stream *s, json_t *choices) {
  const oai_job *job = s->job;
  char id[128];
  snprintf(id, sizeof id, "%s%s", id_prefix(job->kind), job->r->id);
  json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o}", "id", id, "object",
                        job->kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion",
                        "created", (json_int_t)job->created, "model", job->model,
                        "system_fingerprint", "anna", "choices", choices);
  if (o && job->include_usage) json_object_set_new(o, "usage", json_null());
  return o;
}

static int chat_chunk(const oai_stream *s, char **out, size_t *len, size_t *cap, int index,
                      json_t *delta, json_t *lp, const char *finish) {
  json_t *ch =
      json_pack("{s:i,s:o,s:o,s:o}", "index", index, "delta", delta, "logprobs",
                lp ? lp : json_null(), "finish_reason", finish ? json_string(finish) : json_null());
  json_t *arr = json_array();
  json_array_append_new(arr, ch);
  return emit_event(out, len, cap, chunk_base(s, arr));
}

int oai_stream_step(oai_stream *s, char **out, size_t *len, size_t *cap, int *finished) {
  const oai_job *job = s->job;
  gen_request *r = job->r;
  const anna_text *tok = s->cfg->text;
  int rc = 0;
  *finished = s->done_sent;
  if (s->done_sent) return 0;
  for (int i = 0; i < r->n_choices && !rc; i++) {
    stream_choice *sc = &s->ch[i];
    if (sc->finish_sent) continue;
    /* Copy what is new under the lock; render outside it. */
    pthread_mutex_lock(&r->mu);
    gen_choice *c = &r->choices[i];
    size_t tl = c->text_len - sc->text_off, nt = c->n_toks - sc->tok_off;
    char *txt = tl ? strndup(c->text + sc->text_off, tl) : NULL;
    gen_token *toks = nt ? malloc(nt * sizeof *toks) : NULL;
    if (toks) memcpy(toks, c->toks + sc->tok_off, nt * sizeof *toks);
    int done = c->done;
    const char *reason = c->finish_reason;
    pthread_mutex_unlock(&r->mu);
    if ((tl && !txt) || (nt && !toks)) {
      free(txt);
      free(toks);
      return ANNA_ENOMEM;
    }
    sc->text_off += tl;
    sc->tok_off += nt;
    if (job->kind == OAI_COMPLETION) {
      sc->role_sent = 1; /* no role chunk in this format; marks the choice as started */
      if (tl || nt || done) {
        json_t *lp = json_null();
        if (r->logprobs && nt) {
          json_decref(lp);
          lp = completion_logprobs(tok, toks, 0, nt, &sc->lp_text_off);
        }
        json_t *ch =
            json_pack("{s:i,s:s%,s:o,s:o}", "index", i, "text", txt ? txt : "", tl, "logprobs", lp,
                      "finish_reason", done ? json_string(public_reason(reason, 0)) : json_null());
        json_t *arr = json_array();
        json_array_append_new(arr, ch);
        rc = emit_event(out, len, cap, chunk_base(s, arr));
        sc->finish_sent = done;
      }
    } else {
      if (!sc->role_sent) {
        rc = chat_chunk(s, out, len, cap, i,
                        json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL, NULL);
        sc->role_sent = 1;
      }
      split sp = {0};
      if (!rc && (tl || done))
        rc = outparse_feed(sc->op, txt ? txt : "", tl, done, split_sink, &sp);
      json_t *lp = r->logprobs && nt ? chat_logprobs(tok, toks, 0, nt) : NULL;
      /* Merge neighbouring pieces of one kind: fewer, larger chunks. */
      for (int k = 0; k < sp.n_evs && !rc;) {
        struct ev *ev = &sp.evs[k];
        json_t *delta;
        if (ev->kind == OUTPARSE_TOOL_CALL) {
          tc_item *t = &sp.calls[ev->a];
          char id[48];
          call_id(id, sizeof id, r, i, sc->n_calls);
          json_t *d1 = json_pack("{s:[{s:i,s:s,s:s,s:{s:s,s:s}}]}", "tool_calls", "index",
                                 sc->n_calls, "id", id, "type", "function", "function", "name",
                                 t->name ? t->name : "", "arguments", "");
          rc = chat_chunk(s, out, len, cap, i, d1, lp, NULL);
          lp = NULL;
          delta = json_pack("{s:[{s:i,s:{s:s}}]}", "tool_calls", "index", sc->n_calls, "function",
                            "arguments", t->args ? t->args : "{}");
          sc->n_calls++;
          k++;
        } else {
          size_t a = ev->a, n = ev->alen;
          int kind = ev->kind;
          k++;
          while (k < sp.n_evs && sp.evs[k].kind == kind)
            n += sp.evs[k++].alen;
          const char *base = kind == OUTPARSE_REASONING ? sp.reasoning : sp.content;
          delta = json_pack("{s:s%}", kind == OUTPARSE_REASONING ? "reasoning_content" : "content",
                            base + a, n);
        }
        if (!rc)
          rc = chat_chunk(s, out, len, cap, i, delta, lp, NULL);
        else
          json_decref(delta);
        lp = NULL;
      }
      if (lp && !rc)
        rc = chat_chunk(s, out, len, cap, i, json_pack("{s:s}", "content", ""), lp, NULL);
      else
        json_decref(lp);
      if (done && !rc) {
        rc = chat_chunk(s, out, len, cap, i, json_object(), NULL,
                        public_reason(reason, sc->n_calls > 0));
        sc->finish_sent = 1;
      }
      split_clear(&sp);
    }
    free(txt);
    free(toks);
  }
  int all = 1;
  for (int i = 0; i < r->n_choices; i++)
    all &= s->ch[i].finish_sent;
  if (all && !rc) {
    pthread_mutex_lock(&r->mu);
    int err = r->error[0] != 0, code = r->error_code;
    char msg[256];
    snprintf(msg, sizeof msg, "%s", r->error);
    json_t *usage = usage_json(r);
    pthread_mutex_unlock(&r->mu);
    if (err) {
      oai_error e;
      if (code == ANNA_ENOMEM) /* what a non-stream request answers with 503 + Retry-After */
        oai_fail(&e, 503, NULL, "resources_exhausted", "generation failed: %s", msg);
      else
        oai_fail(&e, 500, NULL, "generation_failed", "generation failed: %s", msg);
      char *ej = oai_error_json(&e);
      if (ej) {
        rc = sb_add(out, len, cap, "data: ", 6);
        if (!rc) rc = sb_add(out, len, cap, ej, strlen(ej));
        if (!rc) rc = sb_add(out, len, cap, "\n\n", 2);
        free(ej);
      }
    }
    if (job->include_usage && !rc) {
      json_t *o = chunk_base(s, json_array());
      json_object_set_new(o, "usage", usage);
      usage = NULL;
      rc = emit_event(out, len, cap, o);
    }
    json_decref(usage);
    if (!rc) rc = sb_add(out, len, cap, "data: [DONE]\n\n", 14);
    if (!rc) s->done_sent = 1;
  }
  *finished = s->done_sent;
  return rc;
}

char *oai_models_json(const oai_config *cfg, long long created) {
  json_t *o =
      json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", cfg->model_name,
                "object", "model", "created", (json_int_t)created, "owned_by", "anna");
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  return s;
}
