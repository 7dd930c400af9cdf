/* api_vision.c: images in prompts (anna.h "Images in prompts") over the vision tower kind
 * (model/vision_qwen35.h), the image decoder and processor (media/) and the text decoder's
 * multimodal input (embedding rows + 3-axis rotary positions, model_input).
 *
 * The model handle keeps the tower as a second kind + impl (model_vision); a context keeps
 * per-sequence rotary deltas and, from the first prefill with media on, the tower's own CPU
 * backend and state (ctx_vision). Prefill: tower over each image (one call per group of
 * images that fits the state), positions from vision_qwen35_rope_positions offset by the
 * sequence's length and delta, then decoder runs of n_batch rows whose pad rows take the
 * tower's rows. Decode steps afterwards add the delta on every axis (ctx_vision_rope).
 */
#define _DEFAULT_SOURCE
#include "anna/anna.h"

#include "base/error.h"
#include "formats/gguf.h"
#include "media/image.h"
#include "media/video.h"
#include "media/vision_preproc.h"
#include "model/vision_qwen35.h"
#include "runtime/model_handle.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct model_vision {
  const model_kind *kind; /* static */
  void *impl;             /* owned: kind->free */
  model_desc desc;
  anna_vision_info info;
  vision_preproc_config pre;
  vision_video_config vid; /* video_preprocessor_config.json or the published values */
  int32_t video_token_id;  /* -1 when the config names none */
  int32_t patch_dim, temporal_patch;
};

struct anna_media {
  vision_pixels px; /* images only */
  int32_t n_tokens, merge;
  int32_t src_w, src_h;
  uint64_t hash;
  audio_clip *audio; /* owned; non-NULL: an audio clip (api_audio.c), px unused */
  double seconds;    /* audio: clip length; video: the scanned stream span */
  int is_video;      /* px holds grid_t temporal groups, one pad run each in a prompt */
  double *group_ts;  /* video: [grid_t] seconds of each group (the processor's timestamps), owned */
  double fps;        /* video: the stream's average frame rate */
  int32_t n_frames;  /* video: sampled frames (before padding to the temporal patch) */
};

/* Encoder output cache: the tower's rows of recent media, found by content hash (the
 * preprocessed pixels, grid and processor settings) and confirmed by comparing the pixels
 * themselves (the 64-bit FNV hash is not collision resistant, and a crafted collision must not
 * hand one client the rows of another's image). Bounded by bytes (pixels + rows of every entry,
 * anna_context_options.mm_cache_bytes), least recently used out first; the entry table grows
 * with the entries (a prefill-time path, not per token). */
#define ENC_DEFAULT_BYTES ((int64_t)256 << 20)
typedef struct enc_entry {
  uint64_t hash, tick;
  int32_t grid[3];
  int64_t n_patches, n_rows;
  float *pix, *rows; /* owned */
  size_t bytes;
} enc_entry;

struct ctx_vision {
  const struct model_vision *mv; /* borrowed from the model */
  enc_entry *enc; /* [n_enc] of cap_enc, in no order */
  int n_enc, cap_enc;
  size_t enc_bytes, enc_budget; /* budget 0: the cache is off */
  uint64_t tick;
  anna_vision_stats stats;
  int n_seq, n_batch;
  ctx_encoder_device dev; /* where the tower runs */
  int32_t *delta; /* [n_seq] */
  /* per sequence, its image runs in order: run_end[k] the cache position after run k and
   * run_delta[k] the delta from there on (rewind and copy find the delta of a length);
   * n_runs[seq] entries of cap_runs[seq], grown at prefill (not a per-token path) */
  int32_t **run_end, **run_delta;
  int32_t *n_runs, *cap_runs;
  int32_t *rope;   /* [3 * n_batch] decode-step positions */
  ops_backend *be; /* the tower's backend on dev (lazy) */
  void *st;        /* the tower's state (lazy) */
  int64_t cap;     /* patches st takes */
};

/* ---- model ---- */

static int32_t cfg_id(const json_t *root, const char *key, int32_t dflt) {
  const json_t *v = json_object_get(root, key);
  if (!v) {
    const json_t *tc = json_object_get(root, "text_config");
    v = tc ? json_object_get(tc, key) : NULL;
  }
  return json_is_integer(v) ? (int32_t)json_integer_value(v) : dflt;
}

/* Reads a whole small file; *buf NULL (and 0) when it does not exist. */
static int read_small(const char *path, char **buf, size_t *n, char *err, size_t errlen) {
  *buf = NULL;
  *n = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  char *b = NULL;
  size_t cap = 0, len = 0;
  for (;;) {
    if (len + 4096 > cap) {
      if (cap > (1u << 22)) {
        fclose(f);
        free(b);
        return anna_err(err, errlen, ANNA_EFORMAT, "%s: larger than 4 MB", path);
      }
      char *nb = realloc(b, cap = cap * 2 + 8192);
      if (!nb) {
        fclose(f);
        free(b);
        return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      }
      b = nb;
    }
    size_t r = fread(b + len, 1, cap - len, f);
    len += r;
    if (r == 0) break;
  }
  fclose(f);
  *buf = b;
  *n = len;
  return 0;
}

/* The folder's preprocessor_config.json and video_preprocessor_config.json over v->pre and
 * v->vid (the published values where a file is absent). */
static int read_processors(struct model_vision *v, const char *dir, char *err, size_t errlen) {
  char path[PATH_MAX + 40], e2[256];
  char *txt;
  size_t n;
  int rc;
  snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
  if (!(rc = read_small(path, &txt, &n, err, errlen)) && txt) {
    rc = vision_preproc_config_parse(txt, n, &v->pre, e2, sizeof e2);
    if (rc) anna_err(err, errlen, rc, "%s: %s", path, e2);
    free(txt);
  }
  if (!rc) { /* the video processor's file; the published values when the folder has none */
    snprintf(path, sizeof path, "%s/video_preprocessor_config.json", dir);
    if (!(rc = read_small(path, &txt, &n, err, errlen)) && txt) {
      rc = vision_video_config_parse(txt, n, &v->vid, e2, sizeof e2);
      if (rc) anna_err(err, errlen, rc, "%s: %s", path, e2);
      free(txt);
    }
    if (!rc && (v->vid.pre.patch_size != v->pre.patch_size ||
                v->vid.pre.merge_size != v->pre.merge_size ||
                v->vid.pre.temporal_patch_size != v->pre.temporal_patch_size))
      rc = anna_err(err, errlen, ANNA_EFORMAT,
                    "%s: patch / merge / temporal patch sizes differ from preprocessor_config.json",
                    path);
  }
  return rc;
}

static void finish_info(struct model_vision *v) {
  v->temporal_patch = v->pre.temporal_patch_size;
  v->patch_dim = 3 * v->pre.temporal_patch_size * v->pre.patch_size * v->pre.patch_size;
  v->info.patch_size = v->pre.patch_size;
  v->info.merge_size = v->pre.merge_size;
  v->info.min_pixels = v->pre.min_pixels;
  v->info.max_pixels = v->pre.max_pixels;
  v->info.n_embd = v->desc.n_embd;
}

/* The processor settings from an mmproj GGUF's metadata over the published defaults:
 * clip.vision.image_mean / image_std / patch_size / spatial_merge_size, and
 * clip.vision.image_min_pixels / image_max_pixels when the converter wrote them (its
 * Qwen3-VL class does not: the published 65536 / 16777216 then apply, as transformers'). */
static int mmproj_preproc(const char *path, vision_preproc_config *pre, char *err, size_t errlen) {
  gguf_file *f;
  int rc = gguf_open(&f, path, err, errlen);
  if (rc) return rc;
  const gguf_array *a;
  char e2[128];
  const char *keys[2] = {"clip.vision.image_mean", "clip.vision.image_std"};
  for (int k = 0; k < 2 && !rc; k++) {
    if (gguf_get_arr(f, keys[k], &a, e2, sizeof e2)) continue;
    if (a->count != 3 || a->elem_type == GGUF_TYPE_STRING) {
      rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: %s must hold 3 numbers", path, keys[k]);
      break;
    }
    for (int c = 0; c < 3; c++) (k ? pre->image_std : pre->image_mean)[c] = (float)gguf_array_get_f64(a, c);
    if (k && (pre->image_std[0] <= 0 || pre->image_std[1] <= 0 || pre->image_std[2] <= 0))
      rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: clip.vision.image_std must be positive", path);
  }
  uint32_t u;
  int64_t px;
  if (!rc && !gguf_get_u32(f, "clip.vision.patch_size", &u, e2, sizeof e2)) pre->patch_size = (int32_t)u;
  if (!rc && !gguf_get_u32(f, "clip.vision.spatial_merge_size", &u, e2, sizeof e2)) pre->merge_size = (int32_t)u;
  if (!rc && !gguf_get_i64(f, "clip.vision.image_min_pixels", &px, e2, sizeof e2)) pre->min_pixels = px;
  if (!rc && !gguf_get_i64(f, "clip.vision.image_max_pixels", &px, e2, sizeof e2)) pre->max_pixels = px;
  if (!rc && (pre->min_pixels < 1 || pre->max_pixels < pre->min_pixels))
    rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: image min / max pixels %lld / %lld", path,
                  (long long)pre->min_pixels, (long long)pre->max_pixels);
  gguf_close(f);
  return rc;
}

/* Id of the token spelled `text` in a GGUF's embedded vocabulary, -1 when absent. */
static int32_t gguf_vocab_id(const gguf_array *toks, const char *text) {
  for (int64_t i = 0; toks && i < toks->count; i++)
    if (!strcmp(toks->strs[i], text)) return (int32_t)i;
  return -1;
}

/* Token ids of the vision markers for a text model: an HF folder's config.json names them; a
 * GGUF names none (llama.cpp's mtmd spells the markers), so they are looked up by their text
 * in its vocabulary, as a Qwen tokenizer spells them. */
static int vision_ids(struct model_vision *v, const model_source *src, char *err, size_t errlen) {
  v->info.image_token_id = v->info.vision_start_id = v->info.vision_end_id = v->video_token_id = -1;
  if (!src->is_gguf) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", src->path);
    json_t *root = json_load_file(path, 0, NULL);
    if (!root) return anna_err(err, errlen, ANNA_EFORMAT, "%s: cannot read", path);
    v->info.image_token_id = cfg_id(root, "image_token_id", -1);
    v->info.vision_start_id = cfg_id(root, "vision_start_token_id", -1);
    v->info.vision_end_id = cfg_id(root, "vision_end_token_id", -1);
    v->video_token_id = cfg_id(root, "video_token_id", -1);
    json_decref(root);
    return 0;
  }
  gguf_file *f;
  int rc = gguf_open(&f, src->path, err, errlen);
  if (rc) return rc;
  const gguf_array *toks = NULL;
  char e2[128];
  if (!gguf_get_arr(f, "tokenizer.ggml.tokens", &toks, e2, sizeof e2) && toks->elem_type == GGUF_TYPE_STRING) {
    v->info.image_token_id = gguf_vocab_id(toks, "<|image_pad|>");
    v->info.vision_start_id = gguf_vocab_id(toks, "<|vision_start|>");
    v->info.vision_end_id = gguf_vocab_id(toks, "<|vision_end|>");
    v->video_token_id = gguf_vocab_id(toks, "<|video_pad|>");
  }
  gguf_close(f);
  return 0;
}

/* --mmproj: the tower from `mmproj` (a llama.cpp mmproj GGUF, or an HF folder with
 * model.visual.*) beside any text model (HF folder or GGUF). Token ids from the text model;
 * processor settings from the text model's folder, else the mmproj folder's, else the mmproj
 * GGUF's metadata. A tower whose output width is not the text model's hidden size, or a text
 * model without an <|image_pad|> token, is refused naming the mismatch. */
static int attach_mmproj(anna_model *m, const model_source *src, const model_load_params *lp, const char *mmproj,
                         const model_kind *k, char *err, size_t errlen) {
  struct stat sb;
  if (stat(mmproj, &sb))
    return anna_err(err, errlen, ANNA_ENOTFOUND, "mmproj %s: %s", mmproj, strerror(errno));
  const int is_dir = S_ISDIR(sb.st_mode);
  /* the tower's rows go with Qwen3.5's 3-axis rotary: another text family would take them but
   * fail at the first image (no mRoPE sections), so it is refused here */
  const char *fam = src->is_gguf ? src->gguf_arch : src->model_type;
  static const char *const ok_fam[] = {"qwen35", "qwen35moe", "qwen3_5", "qwen3_5_moe", "qwen3_5_text",
                                       "qwen3_5_moe_text"};
  int known = 0;
  for (size_t i = 0; i < sizeof ok_fam / sizeof *ok_fam; i++) known |= !strcmp(fam, ok_fam[i]);
  if (!known)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "mmproj %s: the text model %s is '%s', not Qwen3.5 (qwen35 / qwen35moe): the Qwen3.5 vision "
                    "tower feeds only Qwen3.5 text models",
                    mmproj, src->path, fam);
  struct model_vision *v = calloc(1, sizeof *v);
  if (!v) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  char e2[512];
  int rc = vision_ids(v, src, err, errlen);
  if (!rc && v->info.image_token_id < 0)
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "mmproj %s: the text model %s has no image pad token (%s): it cannot take images", mmproj, src->path,
                  src->is_gguf ? "<|image_pad|> in its vocabulary" : "image_token_id in config.json");
  if (rc) {
    free(v);
    return rc;
  }
  model_source ts = {.path = mmproj, .is_gguf = !is_dir};
  if ((rc = k->load(&v->impl, &ts, lp, e2, sizeof e2))) {
    free(v);
    return anna_err(err, errlen, rc, "mmproj: %s", e2);
  }
  v->kind = k;
  k->describe(v->impl, &v->desc);
  if (m->desc.hidden > 0 && v->desc.n_embd != m->desc.hidden)
    rc = anna_err(err, errlen, ANNA_EINVAL,
                  "mmproj %s: the tower's output width (projection_dim) %d does not match the text model's hidden size %d "
                  "(%s): an mmproj of another model",
                  mmproj, v->desc.n_embd, m->desc.hidden, src->path);
  vision_preproc_config_default(&v->pre);
  vision_video_config_default(&v->vid);
  const char *proc_dir = !src->is_gguf ? src->path : is_dir ? mmproj : NULL;
  if (!rc && proc_dir) rc = read_processors(v, proc_dir, err, errlen);
  if (!rc && !proc_dir && !(rc = mmproj_preproc(mmproj, &v->pre, err, errlen))) {
    v->vid.pre.patch_size = v->pre.patch_size;
    v->vid.pre.merge_size = v->pre.merge_size;
    memcpy(v->vid.pre.image_mean, v->pre.image_mean, sizeof v->pre.image_mean);
    memcpy(v->vid.pre.image_std, v->pre.image_std, sizeof v->pre.image_std);
  }
  if (rc) {
    k->free(v->impl);
    free(v);
    return rc;
  }
  finish_info(v);
  m->vis = v;
  return 0;
}

int model_vision_attach(anna_model *m, const model_source *src, const model_load_params *lp, const char *mmproj,
                        char *err, size_t errlen) {
  m->vis = NULL;
  const model_kind *k = model_kind_by_name("qwen3_5_vision");
  if (!k) return 0;
  if (mmproj) return attach_mmproj(m, src, lp, mmproj, k, err, errlen);
  if (src->is_gguf || !k->probe(src)) return 0;
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/config.json", src->path);
  json_t *root = json_load_file(path, 0, NULL);
  if (!root) return 0; /* the text kind read it already; nothing more to say here */
  if (!json_is_object(json_object_get(root, "vision_config"))) {
    json_decref(root);
    return 0;
  }
  struct model_vision *v = calloc(1, sizeof *v);
  if (!v) {
    json_decref(root);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  v->info.image_token_id = cfg_id(root, "image_token_id", -1);
  v->info.vision_start_id = cfg_id(root, "vision_start_token_id", -1);
  v->info.vision_end_id = cfg_id(root, "vision_end_token_id", -1);
  v->video_token_id = cfg_id(root, "video_token_id", -1);
  json_decref(root);
  char e2[256];
  int rc = k->load(&v->impl, src, lp, e2, sizeof e2);
  if (rc == ANNA_ENOTFOUND) { /* a text-only export that kept vision_config: text only */
    free(v);
    return 0;
  }
  if (rc) {
    free(v);
    return anna_err(err, errlen, rc, "%s: vision tower: %s", src->path, e2);
  }
  v->kind = k;
  k->describe(v->impl, &v->desc);
  vision_preproc_config_default(&v->pre);
  vision_video_config_default(&v->vid);
  rc = read_processors(v, src->path, err, errlen);
  if (!rc && v->info.image_token_id < 0)
    rc = anna_err(err, errlen, ANNA_EFORMAT, "%s/config.json: vision_config without image_token_id",
                  src->path);
  if (rc) {
    k->free(v->impl);
    free(v);
    return rc;
  }
  finish_info(v);
  m->vis = v;
  return 0;
}

void model_vision_detach(anna_model *m) {
  if (!m->vis) return;
  m->vis->kind->free(m->vis->impl);
  free(m->vis);
  m->vis = NULL;
}

int anna_model_has_vision(const anna_model *m) {
  return m && m->vis != NULL;
}

static int no_vision(const anna_model *m, char *err, size_t errlen) {
  return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "the model %s has no vision tower (text only): it takes no images",
                  m ? m->path : "(none)");
}

int anna_model_vision_info(const anna_model *m, anna_vision_info *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (!anna_model_has_vision(m)) return no_vision(m, err, errlen);
  *out = m->vis->info;
  return 0;
}

/* ---- media ---- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* The processor settings that shape an image's pixels, field by field (no struct padding): part
 * of a media's content hash, so caches keyed on it never mix two preprocessings. */
static uint64_t pre_hash(const vision_preproc_config *c) {
  const int64_t iv[7] = {c->patch_size, c->merge_size, c->temporal_patch_size, c->min_pixels, c->max_pixels,
                         c->do_resize | c->do_rescale << 1 | c->do_normalize << 2, c->do_convert_rgb};
  uint64_t h = fnv1a(1469598103934665603ull, iv, sizeof iv);
  h = fnv1a(h, &c->rescale_factor, sizeof c->rescale_factor);
  h = fnv1a(h, c->image_mean, sizeof c->image_mean);
  return fnv1a(h, c->image_std, sizeof c->image_std);
}

static int media_from_rgb(anna_media **out, const anna_model *m, const uint8_t *rgb, int32_t w,
                          int32_t h, char *err, size_t errlen) {
  anna_media *md = calloc(1, sizeof *md);
  if (!md) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  const struct model_vision *v = m->vis;
  int rc = vision_preproc_image(&v->pre, rgb, w, h, &md->px, err, errlen);
  if (rc) {
    free(md);
    return rc;
  }
  md->merge = v->pre.merge_size;
  md->n_tokens = (int32_t)vision_pixels_tokens(&md->px, &v->pre);
  md->src_w = w;
  md->src_h = h;
  const int32_t g[3] = {md->px.grid_t, md->px.grid_h, md->px.grid_w};
  uint64_t hs = fnv1a(pre_hash(&v->pre), g, sizeof g);
  md->hash =
      fnv1a(hs, md->px.values, sizeof(float) * (size_t)md->px.n_patches * (size_t)md->px.patch_dim);
  *out = md;
  return 0;
}

int anna_media_image_decode(anna_media **out, const anna_model *m, const void *data, size_t n,
                            int64_t max_pixels, char *err, size_t errlen) {
  *out = NULL;
  if (!anna_model_has_vision(m)) return no_vision(m, err, errlen);
  if (!data || !n) return anna_err(err, errlen, ANNA_EINVAL, "image: no data");
  media_image img;
  int rc = media_image_decode(data, n, max_pixels, &img, err, errlen);
  if (rc) return rc;
  rc = media_from_rgb(out, m, img.rgb, img.width, img.height, err, errlen);
  media_image_free(&img);
  return rc;
}

int anna_media_image_from_pixels(anna_media **out, const anna_model *m, const anna_image *img,
                                 char *err, size_t errlen) {
  *out = NULL;
  if (!anna_model_has_vision(m)) return no_vision(m, err, errlen);
  if (!img || !img->pixels || img->width <= 0 || img->height <= 0)
    return anna_err(err, errlen, ANNA_EINVAL, "image: no pixels or a zero size");
  const int ch = img->channels;
  if (ch != 1 && ch != 3 && ch != 4)
    return anna_err(err, errlen, ANNA_EINVAL, "image: %d channels (have: 1, 3, 4)", ch);
  if (img->row_stride < (size_t)img->width * (size_t)ch)
    return anna_err(err, errlen, ANNA_EINVAL, "image: row stride %zu below width * channels",
                    img->row_stride);
  const size_t W = (size_t)img->width, H = (size_t)img->height;
  uint8_t *rgb = malloc(W * H * 3);
  if (!rgb) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  for (size_t y = 0; y < H; y++) {
    const uint8_t *s = img->pixels + y * img->row_stride;
    uint8_t *d = rgb + y * W * 3;
    for (size_t x = 0; x < W; x++, d += 3, s += ch) {
      if (ch == 1)
        d[0] = d[1] = d[2] = s[0];
      else if (ch == 3)
        memcpy(d, s, 3);
      else
        for (int k = 0; k < 3; k++)
          d[k] = media_image_over_white(s[k], s[3]);
    }
  }
  int rc = media_from_rgb(out, m, rgb, img->width, img->height, err, errlen);
  free(rgb);
  return rc;
}

int anna_media_video_decode(anna_media **out, const anna_model *m, const void *data, size_t n,
                            const anna_video_limits *lim, char *err, size_t errlen) {
  *out = NULL;
  if (!anna_model_has_vision(m))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "the model %s has no vision tower (text only): it takes no video",
                    m ? m->path : "(none)");
  const struct model_vision *v = m->vis;
  if (v->video_token_id < 0)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "the model %s names no video_token_id in config.json: it takes no video",
                    m->path);
  if (!data || !n) return anna_err(err, errlen, ANNA_EINVAL, "video: no data");
  media_video_options o;
  media_video_options_default(&o);
  o.sample_fps = v->vid.fps;
  o.min_frames = v->vid.min_frames;
  o.max_frames = v->vid.max_frames;
  if (lim) {
    if (lim->max_bytes < 0 || lim->max_pixels < 0 || lim->max_seconds < 0 || lim->max_frames < 0)
      return anna_err(err, errlen, ANNA_EINVAL, "video: a negative limit");
    o.max_bytes = lim->max_bytes;
    o.max_pixels = lim->max_pixels;
    o.max_duration_s = lim->max_seconds;
    o.limit_frames = lim->max_frames;
    o.threads = lim->threads;
  }
  /* frames stream into the processor: only the resized frames are kept, never n full ones */
  vision_video_builder b;
  vision_video_builder_init(&b, &v->vid);
  o.frame_cb = vision_video_builder_frame_cb;
  o.frame_user = &b;
  media_video mv;
  int rc = media_video_decode(data, n, &o, &mv, err, errlen);
  anna_media *md = NULL;
  if (!rc && !(md = calloc(1, sizeof *md))) rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (!rc) rc = vision_video_builder_finish(&b, &md->px, err, errlen);
  vision_video_builder_free(&b);
  if (!rc && !(md->group_ts = malloc(sizeof *md->group_ts * (size_t)md->px.grid_t)))
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (!rc && mv.n_frames < 1) rc = anna_err(err, errlen, ANNA_EINVAL, "video: no frames sampled");
  if (rc) {
    media_video_free(&mv);
    anna_media_free(md);
    return rc;
  }
  vision_video_timestamps(mv.indices, mv.n_frames, mv.fps, v->vid.pre.temporal_patch_size,
                          md->group_ts);
  md->is_video = 1;
  md->fps = mv.fps;
  md->seconds = mv.duration_s;
  md->n_frames = mv.n_frames;
  md->merge = v->pre.merge_size;
  md->n_tokens = (int32_t)vision_pixels_tokens(&md->px, &v->pre);
  md->src_w = mv.width;
  md->src_h = mv.height;
  media_video_free(&mv);
  const int32_t g[4] = {md->px.grid_t, md->px.grid_h, md->px.grid_w, 1 /* video */};
  uint64_t hs = fnv1a(pre_hash(&v->vid.pre), g, sizeof g);
  md->hash =
      fnv1a(hs, md->px.values, sizeof(float) * (size_t)md->px.n_patches * (size_t)md->px.patch_dim);
  *out = md;
  return 0;
}

int anna_media_is_video(const anna_media *md) {
  return md && md->is_video;
}

int anna_media_video_info(const anna_media *md, anna_video_info *out) {
  memset(out, 0, sizeof *out);
  if (!md || !md->is_video) return ANNA_EINVAL;
  out->n_frames = md->n_frames;
  out->n_groups = md->px.grid_t;
  out->width = md->src_w;
  out->height = md->src_h;
  out->fps = md->fps;
  out->seconds = md->seconds;
  out->tokens_per_group = md->n_tokens / (md->px.grid_t > 0 ? md->px.grid_t : 1);
  return 0;
}

double anna_media_video_group_time(const anna_media *md, int32_t g) {
  return md && md->is_video && g >= 0 && g < md->px.grid_t ? md->group_ts[g] : -1.0;
}

int32_t anna_media_n_tokens(const anna_media *md) {
  return md ? md->n_tokens : 0;
}

int media_wrap_audio(anna_media **out, audio_clip *clip, int32_t n_tokens, double seconds, uint64_t hash,
                     char *err, size_t errlen) {
  anna_media *md = calloc(1, sizeof *md);
  if (!md) {
    audio_clip_free(clip);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  md->audio = clip;
  md->n_tokens = n_tokens;
  md->seconds = seconds;
  md->hash = hash;
  *out = md;
  return 0;
}

const audio_clip *media_audio_clip(const anna_media *md) {
  return md ? md->audio : NULL;
}

int anna_media_is_audio(const anna_media *md) {
  return md && md->audio;
}

double anna_media_audio_seconds(const anna_media *md) {
  return md && md->audio ? md->seconds : 0;
}

void anna_media_grid(const anna_media *md, int32_t thw[3], int32_t *width, int32_t *height) {
  thw[0] = md->px.grid_t; /* zeros for audio (calloc) */
  thw[1] = md->px.grid_h;
  thw[2] = md->px.grid_w;
  if (width) *width = md->src_w;
  if (height) *height = md->src_h;
}

uint64_t anna_media_hash(const anna_media *md) {
  return md ? md->hash : 0;
}

void anna_media_free(anna_media *md) {
  if (!md) return;
  audio_clip_free(md->audio);
  vision_pixels_free(&md->px);
  free(md->group_ts);
  free(md);
}

/* ---- context ---- */

int ctx_vision_create(ctx_vision **out, const anna_model *m, int n_seq, int n_batch, const ctx_encoder_device *dev,
                      int64_t cache_bytes, char *err, size_t errlen) {
  *out = NULL;
  if (!m->vis) return 0;
  ctx_vision *v = calloc(1, sizeof *v);
  if (!v || !(v->delta = calloc((size_t)n_seq, sizeof *v->delta)) ||
      !(v->run_end = calloc((size_t)n_seq, sizeof *v->run_end)) ||
      !(v->run_delta = calloc((size_t)n_seq, sizeof *v->run_delta)) ||
      !(v->n_runs = calloc((size_t)n_seq, sizeof *v->n_runs)) ||
      !(v->cap_runs = calloc((size_t)n_seq, sizeof *v->cap_runs)) ||
      !(v->rope = malloc(sizeof *v->rope * 3 * (size_t)n_batch))) {
    ctx_vision_free(v);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  v->mv = m->vis;
  v->n_seq = n_seq;
  v->n_batch = n_batch;
  v->dev = *dev;
  v->enc_budget = cache_bytes < 0 ? 0 : cache_bytes == 0 ? (size_t)ENC_DEFAULT_BYTES : (size_t)cache_bytes;
  *out = v;
  return 0;
}

static void tower_close(ctx_vision *v) {
  ctx_encoder_close(v->mv->kind, &v->be, &v->st);
  v->cap = 0;
}

/* Frees entry i and moves the last entry into its place. */
static void enc_drop(ctx_vision *v, int i) {
  enc_entry *e = &v->enc[i];
  v->enc_bytes -= e->bytes;
  free(e->pix);
  free(e->rows);
  v->enc[i] = v->enc[--v->n_enc];
}

static void enc_clear(ctx_vision *v) {
  while (v->n_enc) enc_drop(v, v->n_enc - 1);
}

static const enc_entry *enc_find(ctx_vision *v, const anna_media *md) {
  const vision_pixels *px = &md->px;
  for (int i = 0; i < v->n_enc; i++) {
    enc_entry *e = &v->enc[i];
    if (e->hash == md->hash && e->n_patches == px->n_patches &&
        e->grid[0] == px->grid_t && e->grid[1] == px->grid_h && e->grid[2] == px->grid_w &&
        !memcmp(e->pix, px->values,
                sizeof(float) * (size_t)px->n_patches * (size_t)px->patch_dim)) {
      e->tick = ++v->tick;
      return e;
    }
  }
  return NULL;
}

/* Keeps md's rows, evicting the least recently used entries to stay within the budget. Out of
 * memory, or larger than the whole budget: not kept (the cache is an optimisation). */
static void enc_store(ctx_vision *v, const anna_media *md, const float *rows, int64_t n_rows,
                      int E) {
  const vision_pixels *px = &md->px;
  const size_t pb = sizeof(float) * (size_t)px->n_patches * (size_t)px->patch_dim;
  const size_t rb = sizeof(float) * (size_t)n_rows * (size_t)E;
  if (pb + rb > v->enc_budget) return;
  while (v->n_enc && v->enc_bytes + pb + rb > v->enc_budget) {
    int lru = 0;
    for (int i = 1; i < v->n_enc; i++)
      if (v->enc[i].tick < v->enc[lru].tick) lru = i;
    enc_drop(v, lru);
    v->stats.cache_evictions++;
  }
  if (v->n_enc == v->cap_enc) {
    const int cap = v->cap_enc ? 2 * v->cap_enc : 16;
    enc_entry *ne = realloc(v->enc, sizeof *ne * (size_t)cap);
    if (!ne) return;
    v->enc = ne;
    v->cap_enc = cap;
  }
  enc_entry *e = &v->enc[v->n_enc];
  memset(e, 0, sizeof *e);
  e->pix = malloc(pb);
  e->rows = malloc(rb);
  if (!e->pix || !e->rows) {
    free(e->pix);
    free(e->rows);
    return;
  }
  memcpy(e->pix, px->values, pb);
  memcpy(e->rows, rows, rb);
  e->hash = md->hash;
  e->tick = ++v->tick;
  e->grid[0] = px->grid_t;
  e->grid[1] = px->grid_h;
  e->grid[2] = px->grid_w;
  e->n_patches = px->n_patches;
  e->n_rows = n_rows;
  e->bytes = pb + rb;
  v->enc_bytes += e->bytes;
  v->n_enc++;
}

void anna_context_vision_stats(const anna_context *c, anna_vision_stats *st) {
  const ctx_vision *v = context_vision((anna_context *)c);
  if (v) {
    *st = v->stats;
    st->cache_bytes = (int64_t)v->enc_bytes;
    st->cache_entries = v->n_enc;
    st->cache_budget = (int64_t)v->enc_budget;
  } else {
    memset(st, 0, sizeof *st);
  }
}

void anna_context_vision_cache_clear(anna_context *c) {
  ctx_vision *v = context_vision(c);
  if (v) enc_clear(v);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ctx_vision_free(ctx_vision *v) {
  if (!v) return;
  enc_clear(v);
  free(v->enc);
  tower_close(v);
  for (int s = 0; v->run_end && s < v->n_seq; s++)
    free(v->run_end[s]);
  for (int s = 0; v->run_delta && s < v->n_seq; s++)
    free(v->run_delta[s]);
  free(v->run_end);
  free(v->run_delta);
  free(v->n_runs);
  free(v->cap_runs);
  free(v->delta);
  free(v->rope);
  free(v);
}

int ctx_vision_rope(ctx_vision *v, const anna_batch *b, const int32_t **rope, char *err,
                    size_t errlen) {
  *rope = NULL;
  int any = 0;
  for (int32_t i = 0; i < b->n && !any; i++)
    any = b->seq[i] >= 0 && b->seq[i] < v->n_seq && v->delta[b->seq[i]] != 0;
  if (!any) return 0;
  if (b->n > v->n_batch)
    return anna_err(err, errlen, ANNA_ERANGE, "batch of %d tokens exceeds n_batch %d", b->n,
                    v->n_batch);
  for (int32_t i = 0; i < b->n; i++) {
    const int s = b->seq[i];
    const int32_t p = b->pos[i] + (s >= 0 && s < v->n_seq ? v->delta[s] : 0);
    v->rope[i] = v->rope[b->n + i] = v->rope[2 * b->n + i] = p;
  }
  *rope = v->rope;
  return 0;
}

void ctx_vision_seq_truncate(ctx_vision *v, int seq, int32_t n) {
  if (seq < 0 || seq >= v->n_seq) return;
  int32_t k = v->n_runs[seq];
  while (k > 0 && v->run_end[seq][k - 1] > n)
    k--; /* a run cut in the middle goes too */
  v->n_runs[seq] = k;
  v->delta[seq] = k ? v->run_delta[seq][k - 1] : 0;
}

void ctx_vision_seq_reset(ctx_vision *v, int seq) {
  ctx_vision_seq_truncate(v, seq, 0);
}

static int runs_reserve(ctx_vision *v, int seq, int32_t need) {
  if (need <= v->cap_runs[seq]) return 0;
  const int32_t cap = need < 8 ? 8 : need * 2;
  int32_t *e = realloc(v->run_end[seq], sizeof *e * (size_t)cap);
  if (e) v->run_end[seq] = e;
  int32_t *d = e ? realloc(v->run_delta[seq], sizeof *d * (size_t)cap) : NULL;
  if (d) v->run_delta[seq] = d;
  if (!e || !d) return ANNA_ENOMEM;
  v->cap_runs[seq] = cap;
  return 0;
}

void ctx_vision_seq_copy(ctx_vision *v, int dst, int src, int32_t n) {
  if (dst < 0 || dst >= v->n_seq || src < 0 || src >= v->n_seq || dst == src) return;
  const int32_t k = v->n_runs[src];
  if (runs_reserve(v, dst, k)) { /* out of memory: the newest delta, no history */
    v->n_runs[dst] = 0;
    v->delta[dst] = v->delta[src];
    return;
  }
  if (k) { /* no runs: the arrays may not exist yet (memcpy with NULL is undefined even for 0) */
    memcpy(v->run_end[dst], v->run_end[src], sizeof(int32_t) * (size_t)k);
    memcpy(v->run_delta[dst], v->run_delta[src], sizeof(int32_t) * (size_t)k);
  }
  v->n_runs[dst] = k;
  ctx_vision_seq_truncate(v, dst, n);
}

int32_t anna_context_seq_rope_delta(const anna_context *c, int seq) {
  ctx_vision *v = context_vision((anna_context *)c);
  return v && seq >= 0 && seq < v->n_seq ? v->delta[seq] : 0;
}

/* The tower's backend and state for at least `patches` patches per call (rounded up to 1024:
 * a few sizes, not one per image). */
static int tower_open(ctx_vision *v, int64_t patches, char *err, size_t errlen) {
  if (v->st && v->cap >= patches) return 0;
  tower_close(v);
  const int64_t cap = (patches + 1023) / 1024 * 1024;
  const int rc =
      ctx_encoder_open(v->mv->kind, v->mv->impl, &v->dev, cap, "vision tower", &v->be, &v->st, err, errlen);
  if (rc) return rc;
  v->cap = cap;
  return 0;
}

/* Tower rows of every media of p into rows [sum n_tokens, n_embd], in prompt order: from the
 * encoder output cache, else one tower call per image. */
static int tower_rows(ctx_vision *v, const anna_prompt *p, float *rows, char *err, size_t errlen) {
  const struct model_vision *mv = v->mv;
  const int E = mv->desc.n_embd;
  int rc = 0;
  int64_t row = 0;
  for (int32_t i = 0; !rc && i < p->n_media; row += p->media[i].media->n_tokens, i++) {
    const anna_media *md = p->media[i].media;
    float *out = rows + row * E;
    v->stats.images++;
    const enc_entry *hit = enc_find(v, md);
    if (hit) {
      memcpy(out, hit->rows, sizeof(float) * (size_t)hit->n_rows * (size_t)E);
      v->stats.cache_hits++;
      continue;
    }
    if (v->enc_budget) v->stats.cache_misses++;
    const double t0 = now_s();
    if ((rc = tower_open(v, md->px.n_patches, err, errlen))) break;
    const int32_t grid[3] = {md->px.grid_t, md->px.grid_h, md->px.grid_w};
    const model_input in = {.io = MODEL_IO_PIXELS,
                            .pixels = md->px.values,
                            .n_patches = md->px.n_patches,
                            .patch_dim = mv->patch_dim,
                            .n_grids = 1,
                            .grid_thw = grid};
    int64_t wrote = 0;
    const model_output mo = {
        .io = MODEL_IO_EMBEDDINGS, .embd = out, .embd_rows = md->n_tokens, .embd_written = &wrote};
    rc = mv->kind->run(mv->impl, v->st, v->be, &in, &mo, err, errlen);
    if (!rc && wrote != md->n_tokens)
      rc = anna_err(err, errlen, ANNA_EFORMAT, "vision tower wrote %lld rows, expected %d",
                    (long long)wrote, md->n_tokens);
    if (rc) break;
    v->stats.tower_runs++;
    v->stats.tower_s += now_s() - t0;
    enc_store(v, md, out, md->n_tokens, E);
  }
  return rc;
}

const float *media_pixels(const anna_media *md, int64_t *n_patches, int32_t *patch_dim) {
  *n_patches = md && !md->audio ? md->px.n_patches : 0;
  *patch_dim = md && !md->audio ? md->px.patch_dim : 0;
  return md && !md->audio ? md->px.values : NULL;
}

int ctx_vision_encode(anna_context *c, const anna_media *md, float *rows, char *err, size_t errlen) {
  ctx_vision *v = context_vision(c);
  if (!v || !md || md->audio) return anna_err(err, errlen, ANNA_EINVAL, "encode: no tower or media");
  const anna_media_ref r = {md, 0};
  const anna_prompt p = {NULL, 0, &r, 1};
  return tower_rows(v, &p, rows, err, errlen);
}

/* Pad runs of p: one per image, one per temporal group of a video. */
static int32_t prompt_runs(const anna_prompt *p) {
  int32_t k = 0;
  for (int32_t r = 0; r < p->n_media; r++) {
    const anna_media *md = p->media[r].media;
    k += md && md->is_video ? md->px.grid_t : 1;
  }
  return k;
}

/* Checks p against the model: runs match their media, no stray pad ids. Fills is_vision, run_hw
 * (grid h, w per run) and run_end (the prompt index after each run). A video's first group
 * starts at its ref's `at`; each next group is the next run of video pads after the previous
 * one (the processor puts "<t seconds>" text and the vision end / start ids between them). */
static int prompt_check(const struct model_vision *mv, const anna_prompt *p, uint8_t *is_vision,
                        int32_t *run_hw, int32_t *run_end, char *err, size_t errlen) {
  const int32_t ipad = mv->info.image_token_id, vpad = mv->video_token_id;
  memset(is_vision, 0, (size_t)p->n);
  int32_t end = -1, k = 0;
  for (int32_t r = 0; r < p->n_media; r++) {
    const anna_media *md = p->media[r].media;
    int32_t at = p->media[r].at;
    if (!md) return anna_err(err, errlen, ANNA_EINVAL, "prompt media %d: no media", r);
    if (md->audio)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "prompt media %d is audio: this model has no audio encoder", r);
    if (md->px.patch_dim != mv->patch_dim || md->merge != mv->info.merge_size)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "prompt media %d: prepared for another model's tower", r);
    if (!md->is_video && md->px.grid_t != 1)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "prompt media %d: an image with %d temporal groups", r, md->px.grid_t);
    if (md->is_video && vpad < 0)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "prompt media %d is a video: the model names no video_token_id", r);
    const int32_t pad = md->is_video ? vpad : ipad;
    const int32_t groups = md->is_video ? md->px.grid_t : 1;
    const int32_t per = md->n_tokens / groups;
    if (at <= end)
      return anna_err(err, errlen, ANNA_EINVAL,
                      "prompt media %d at %d: media must come in increasing order, not adjacent to "
                      "the previous run",
                      r, at);
    for (int32_t g = 0; g < groups; g++) {
      if (g > 0) { /* the next group: the next video pad after the previous run */
        while (at < p->n && p->tokens[at] != pad) at++;
      }
      if (at < 0 || at > p->n - per)
        return anna_err(err, errlen, ANNA_EINVAL,
                        "prompt media %d: %s%d pad tokens at %d do not fit %d tokens", r,
                        md->is_video ? "a video group's " : "its ", per, at, p->n);
      for (int32_t i = at; i < at + per; i++) {
        if (p->tokens[i] != pad)
          return anna_err(err, errlen, ANNA_EINVAL,
                          "prompt media %d: token %d is %d, not the %s pad %d (the run needs %d pads)",
                          r, i, p->tokens[i], md->is_video ? "video" : "image", pad, per);
        is_vision[i] = 1;
      }
      end = at + per;
      if (end < p->n && p->tokens[end] == pad)
        return anna_err(err, errlen, ANNA_EINVAL,
                        "prompt media %d: its run at %d is longer than the %d pads it needs", r, at,
                        per);
      run_hw[2 * k] = md->px.grid_h;
      run_hw[2 * k + 1] = md->px.grid_w;
      run_end[k++] = end;
      at = end;
    }
  }
  for (int32_t i = 0; i < p->n; i++)
    if ((p->tokens[i] == ipad || (vpad >= 0 && p->tokens[i] == vpad)) && !is_vision[i])
      return anna_err(err, errlen, ANNA_EINVAL, "prompt token %d is the %s pad %d but no %s covers it",
                      i, p->tokens[i] == ipad ? "image" : "video", p->tokens[i],
                      p->tokens[i] == ipad ? "image" : "video");
  return 0;
}

/* The prefix cache's keys of p's tokens (kv_cache_next_keys): text tokens as they are; pad j of a
 * media (in prompt order, is_vision from prompt_check) keyed by that media's content hash and the
 * pixels of its own merge block (M x M patches), as a negative int32 (never a token id). Two
 * images differ in every pad whose pixels differ, so their blocks never match; the same image +
 * text keys the same. */
static void prompt_keys(const anna_prompt *p, const uint8_t *is_vision, int32_t *keys) {
  int32_t r = 0, j = 0;
  for (int32_t i = 0; i < p->n; i++) {
    keys[i] = p->tokens[i];
    if (!is_vision[i]) continue;
    while (r < p->n_media && j >= p->media[r].media->n_tokens) r++, j = 0;
    if (r >= p->n_media) continue; /* prompt_check already refused this */
    const anna_media *md = p->media[r].media;
    const size_t per = (size_t)md->px.n_patches / (size_t)md->n_tokens * (size_t)md->px.patch_dim;
    uint64_t h = fnv1a(md->hash, &j, sizeof j);
    h = fnv1a(h, md->px.values + (size_t)j * per, sizeof(float) * per);
    keys[i] = (int32_t)(0x80000000u | (uint32_t)((h ^ (h >> 32)) & 0x7fffffffu));
    j++;
  }
}

int32_t anna_context_prefix_attach_media(anna_context *c, int seq, const anna_prompt *p, int flags, char *err,
                                         size_t errlen) {
  ctx_vision *v = context_vision(c);
  if (!p || !p->tokens || p->n < 0 || p->n_media < 0 || (p->n_media > 0 && !p->media))
    return anna_err(err, errlen, ANNA_EINVAL, "prefix attach: no prompt");
  if (!v || p->n_media == 0) {
    if (p->n_media > 0) return no_vision(context_model(c), err, errlen);
    const int32_t r = anna_context_prefix_attach(c, seq, p->tokens, p->n, flags);
    return r < 0 ? anna_err(err, errlen, r, "prefix attach: sequence %d out of range", seq) : r;
  }
  if (seq < 0 || seq >= v->n_seq)
    return anna_err(err, errlen, ANNA_EINVAL, "prefix attach: sequence %d out of range [0, %d)", seq, v->n_seq);
  const int32_t n = p->n, n_runs = prompt_runs(p);
  uint8_t *isv = malloc((size_t)n + 1);
  int32_t *keys = malloc(sizeof *keys * ((size_t)n + 1));
  int32_t *run_hw = malloc(sizeof *run_hw * (2 * (size_t)n_runs + 1));
  int32_t *run_end = malloc(sizeof *run_end * ((size_t)n_runs + 1));
  int32_t rc = 0, r = 0;
  if (!isv || !keys || !run_hw || !run_end) rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (!rc) rc = prompt_check(v->mv, p, isv, run_hw, run_end, err, errlen);
  if (!rc) {
    prompt_keys(p, isv, keys);
    /* A media is reused whole or not at all (its rows cannot be prefilled in part): a match
     * that ends inside one, from its first pad to the end of its last run, attaches again up
     * to that media's start (GDN models may land inside an earlier one: until none). */
    int32_t want = n;
    for (;;) {
      r = anna_context_prefix_attach(c, seq, keys, want, flags);
      if (r <= 0) break;
      int32_t cut = -1, k = 0;
      for (int32_t m = 0; m < p->n_media && cut < 0; m++) {
        const int32_t groups = p->media[m].media->is_video ? p->media[m].media->px.grid_t : 1;
        const int32_t start = p->media[m].at, end = run_end[k + groups - 1];
        if (r > start && r < end) cut = start;
        k += groups;
      }
      if (cut < 0) break;
      want = cut;
    }
    if (r < 0) rc = anna_err(err, errlen, r, "prefix attach: sequence %d", seq);
  }
  /* the rotary delta of the runs the reused prefix holds (what prefill would have recorded) */
  if (!rc && r > 0 && !(rc = runs_reserve(v, seq, n_runs))) {
    int32_t d = 0;
    for (int32_t k = 0; k < n_runs && run_end[k] <= r; k++) {
      const int32_t M = v->mv->info.merge_size, gh = run_hw[2 * k] / M, gw = run_hw[2 * k + 1] / M;
      d += (gh > gw ? gh : gw) - gh * gw;
      v->run_end[seq][k] = run_end[k];
      v->run_delta[seq][k] = d;
      v->n_runs[seq] = k + 1;
    }
    v->delta[seq] = d;
  } else if (rc == ANNA_ENOMEM) {
    anna_err(err, errlen, rc, "out of memory");
  }
  if (rc) anna_context_seq_reset(c, seq);
  free(isv);
  free(keys);
  free(run_hw);
  free(run_end);
  return rc ? rc : r;
}

int anna_context_prefill(anna_context *c, int seq, const anna_prompt *p, float *logits, char *err,
                         size_t errlen) {
  const anna_model *m = context_model(c);
  if (context_audio(c)) return ctx_audio_prefill(c, seq, p, logits, err, errlen);
  ctx_vision *v = context_vision(c);
  if (!p || !p->tokens || p->n <= 0)
    return anna_err(err, errlen, ANNA_EINVAL, "prefill: empty prompt");
  if (p->n_media < 0 || (p->n_media > 0 && !p->media))
    return anna_err(err, errlen, ANNA_EINVAL, "prefill: media count %d without media", p->n_media);
  if (p->n_media > 0 && !v) {
    if (p->media[0].media && anna_media_is_audio(p->media[0].media))
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "the model %s has no audio encoder: it takes no audio", m->path);
    return no_vision(m, err, errlen);
  }
  if (v && (seq < 0 || seq >= v->n_seq))
    return anna_err(err, errlen, ANNA_EINVAL, "prefill: sequence %d out of range [0, %d)", seq,
                    v->n_seq);
  const int32_t len = anna_context_seq_len(c, seq);
  if (len < 0) return anna_err(err, errlen, ANNA_EINVAL, "prefill: sequence %d has no state", seq);
  const int32_t n = p->n;
  const int nb = v ? v->n_batch : 512;
  int64_t rows_n = 0;
  for (int32_t r = 0; r < p->n_media; r++)
    rows_n += p->media[r].media ? p->media[r].media->n_tokens : 0;
  const int E = v ? v->mv->desc.n_embd : 0;
  const int vocab = anna_model_vocab(m);
  uint8_t *isv = malloc((size_t)n);
  const int32_t n_runs = prompt_runs(p);
  int32_t *run_hw = malloc(sizeof *run_hw * (2 * (size_t)n_runs + 1));
  int32_t *run_end = malloc(sizeof *run_end * ((size_t)n_runs + 1));
  int32_t *pos3 = malloc(sizeof *pos3 * 3 * (size_t)n);
  int32_t *bpos3 = malloc(sizeof *bpos3 * 3 * (size_t)nb);
  int32_t *bseq = malloc(sizeof *bseq * (size_t)nb), *bpos = malloc(sizeof *bpos * (size_t)nb);
  int32_t *bidx = malloc(sizeof *bidx * (size_t)nb);
  int8_t *bflag = calloc((size_t)nb, 1);
  float *rows = malloc(sizeof *rows * ((size_t)rows_n * (size_t)E + 1));
  float *lg = logits ? logits : malloc(sizeof *lg * (size_t)vocab);
  int32_t *keys = malloc(sizeof *keys * ((size_t)n + 1));
  int rc = 0;
  if (!keys || !isv || !run_hw || !run_end || !pos3 || !bpos3 || !bseq || !bpos || !bidx || !bflag || !rows || !lg)
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  int32_t next = n;
  if (!rc && v) rc = prompt_check(v->mv, p, isv, run_hw, run_end, err, errlen);
  if (!rc && v && p->n_media > 0) prompt_keys(p, isv, keys);
  if (!rc && v && p->n_media > 0) rc = tower_rows(v, p, rows, err, errlen);
  if (!rc && v && p->n_media > 0)
    rc = vision_qwen35_rope_positions(isv, n, run_hw, n_runs, v->mv->info.merge_size, pos3,
                                      &next, err, errlen);
  const int32_t base = len + (v ? v->delta[seq] : 0);
  int64_t row = 0;
  for (int32_t s0 = 0; !rc && s0 < n; s0 += nb) {
    const int32_t cn = n - s0 < nb ? n - s0 : nb;
    int64_t ne = 0;
    for (int32_t i = 0; i < cn; i++) {
      bseq[i] = seq;
      bpos[i] = len + s0 + i;
      bflag[i] = s0 + i == n - 1;
      if (p->n_media > 0) {
        for (int a = 0; a < 3; a++)
          bpos3[a * cn + i] = base + pos3[a * n + s0 + i];
        if (isv[s0 + i]) bidx[ne++] = i;
      }
    }
    const anna_batch b = {cn, p->tokens + s0, bseq, bpos, bflag};
    if (p->n_media > 0 || (v && v->delta[seq])) {
      if (p->n_media == 0)
        for (int32_t i = 0; i < cn; i++)
          bpos3[i] = bpos3[cn + i] = bpos3[2 * cn + i] = base + s0 + i;
      const model_input mm = {.embd = ne ? rows + row * E : NULL,
                              .embd_idx = ne ? bidx : NULL,
                              .n_embd = ne,
                              .rope_pos = bpos3,
                              .cache_keys = p->n_media > 0 ? keys + s0 : NULL};
      rc = context_run_mm(c, &b, &mm, lg, err, errlen);
    } else {
      rc = anna_context_decode(c, &b, lg, err, errlen);
    }
    row += ne;
  }
  if (!rc && v && p->n_media > 0 && !(rc = runs_reserve(v, seq, v->n_runs[seq] + n_runs))) {
    int32_t d = v->delta[seq];
    for (int32_t r = 0; r < n_runs; r++) { /* a run of gh x gw tokens advances max(gh, gw) */
      const int32_t M = v->mv->info.merge_size, gh = run_hw[2 * r] / M, gw = run_hw[2 * r + 1] / M;
      d += (gh > gw ? gh : gw) - gh * gw;
      const int32_t k = v->n_runs[seq]++;
      v->run_end[seq][k] = len + run_end[r];
      v->run_delta[seq][k] = d;
    }
    if (d != v->delta[seq] + next - n)
      rc = anna_err(err, errlen, ANNA_EFORMAT,
                    "prefill: rotary delta %d disagrees with the positions' %d", d,
                    v->delta[seq] + next - n);
    v->delta[seq] = d;
  }
  if (rc == ANNA_ENOMEM) anna_err(err, errlen, rc, "out of memory");
  if (lg != logits) free(lg);
  free(keys);
  free(isv);
  free(run_hw);
  free(run_end);
  free(pos3);
  free(bpos3);
  free(bseq);
  free(bpos);
  free(bidx);
  free(bflag);
  free(rows);
  return rc;
}

/* ---- prompts with media ---- */

/* Appends n bytes to the growing buffer *b (*len of *cap). */
static int buf_put(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
  if (*len + n + 1 > *cap) {
    size_t nc = (*cap + n + 1) * 2;
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

/* The rendered text with each video's placeholder replaced as Qwen3VLProcessor does: the
 * template's <|vision_start|><|video_pad|><|vision_end|> (or a bare <|video_pad|>) becomes, per
 * temporal group, "<%.1f seconds><|vision_start|><|video_pad|><|vision_end|>" (one pad per group
 * here; the caller expands the ids). Images stay as rendered. Placeholders are matched to media
 * in order and must agree in kind and number. */
static int video_text_expand(const char *txt, size_t len, const char *ip, const char *vp,
                             const char *vs, const char *ve, anna_media *const *media,
                             int32_t n_media, char **out, char *err, size_t errlen) {
  const size_t ipl = strlen(ip), vpl = strlen(vp), vsl = strlen(vs), vel = strlen(ve);
  char *b = NULL;
  size_t bl = 0, cap = 0;
  int32_t k = 0;
  int rc = buf_put(&b, &bl, &cap, "", 0);
  size_t i = 0;
  while (!rc && i < len) {
    const int is_i = len - i >= ipl && !memcmp(txt + i, ip, ipl);
    const int is_v = !is_i && len - i >= vpl && !memcmp(txt + i, vp, vpl);
    if (!is_i && !is_v) {
      rc = buf_put(&b, &bl, &cap, txt + i, 1);
      i++;
      continue;
    }
    if (k >= n_media) {
      rc = anna_err(err, errlen, ANNA_EINVAL,
                    "the prompt has more image / video placeholders than the %d media given (a "
                    "message's text may not contain the pad tokens)",
                    n_media);
      break;
    }
    const anna_media *md = media[k];
    if (!md || md->audio || (md->is_video != 0) != is_v) {
      rc = anna_err(err, errlen, ANNA_EINVAL,
                    "placeholder %d is %s pad, but media %d is %s", k, is_v ? "a video" : "an image",
                    k, !md ? "missing" : md->audio ? "audio" : md->is_video ? "a video" : "an image");
      break;
    }
    k++;
    if (is_i) {
      rc = buf_put(&b, &bl, &cap, ip, ipl);
      i += ipl;
      continue;
    }
    i += vpl;
    if (bl >= vsl && !memcmp(b + bl - vsl, vs, vsl) && len - i >= vel && !memcmp(txt + i, ve, vel)) {
      bl -= vsl; /* the template's own start / end pair goes: each group brings its own */
      i += vel;
    }
    for (int32_t g = 0; !rc && g < md->px.grid_t; g++) {
      char ts[48];
      vision_video_timestamp_text(md->group_ts[g], ts, sizeof ts);
      if ((rc = buf_put(&b, &bl, &cap, ts, strlen(ts))) || (rc = buf_put(&b, &bl, &cap, vs, vsl)) ||
          (rc = buf_put(&b, &bl, &cap, vp, vpl)))
        break;
      rc = buf_put(&b, &bl, &cap, ve, vel);
    }
  }
  if (!rc && k != n_media)
    rc = anna_err(err, errlen, ANNA_EINVAL,
                  "the prompt has %d image / video placeholders for %d media (the chat template "
                  "must render every image and video part)",
                  k, n_media);
  if (rc == ANNA_ENOMEM) anna_err(err, errlen, rc, "out of memory");
  if (rc) {
    free(b);
    return rc;
  }
  *out = b;
  return 0;
}

int anna_text_encode_chat_media(const anna_text *t, const anna_model *m, const char *messages_json,
                                const char *tools_json, const char *kwargs_json,
                                anna_media *const *media, int32_t n_media, int32_t **ids,
                                size_t *n, int32_t **media_at, char *err, size_t errlen) {
  *ids = NULL;
  *n = 0;
  *media_at = NULL;
  if (!anna_model_has_vision(m)) return no_vision(m, err, errlen);
  if (n_media < 0 || (n_media > 0 && !media))
    return anna_err(err, errlen, ANNA_EINVAL, "media count %d without media", n_media);
  const anna_chat_template *ct = anna_text_template(t);
  if (!ct)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "the model has no chat template: images and video need one to place them");
  const struct model_vision *v = m->vis;
  const int32_t ipad = v->info.image_token_id, vpad = v->video_token_id;
  const char *ip = anna_text_token_piece(t, ipad, NULL);
  const char *vp = vpad >= 0 ? anna_text_token_piece(t, vpad, NULL) : NULL;
  const char *vs = anna_text_token_piece(t, v->info.vision_start_id, NULL);
  const char *ve = anna_text_token_piece(t, v->info.vision_end_id, NULL);
  int any_video = 0;
  for (int32_t i = 0; i < n_media; i++)
    any_video |= media[i] && media[i]->is_video;
  if (!ip || (any_video && (!vp || !vs || !ve)))
    return anna_err(err, errlen, ANNA_EFORMAT,
                    "the tokenizer lacks the model's image / video pad or vision start / end tokens");
  char *txt = NULL, *ex = NULL;
  size_t tl = 0;
  int rc = anna_chat_template_render(ct, messages_json, tools_json, 1, kwargs_json, &txt, &tl, err,
                                     errlen);
  if (!rc)
    rc = video_text_expand(txt, tl, ip, vp ? vp : "\x01\x01no video pad", vs ? vs : "",
                           ve ? ve : "", media, n_media, &ex, err, errlen);
  free(txt);
  int32_t *ids0 = NULL;
  size_t n0 = 0;
  if (!rc) rc = anna_text_tokenize(t, ex, strlen(ex), 0, &ids0, &n0, err, errlen);
  free(ex);
  int64_t total = (int64_t)n0;
  for (int32_t i = 0; !rc && i < n_media; i++)
    total += media[i]->n_tokens - (media[i]->is_video ? media[i]->px.grid_t : 1);
  int32_t *out = NULL, *at = NULL;
  if (!rc && (total > INT32_MAX || !(out = malloc(sizeof *out * (size_t)(total + 1))) ||
              !(at = malloc(sizeof *at * ((size_t)n_media + 1)))))
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  size_t o = 0;
  int32_t k = 0, g = 0; /* media k, its group g */
  for (size_t i = 0; !rc && i < n0; i++) {
    const int32_t id = ids0[i];
    if (id != ipad && (vpad < 0 || id != vpad)) {
      out[o++] = id;
      continue;
    }
    const anna_media *md = k < n_media ? media[k] : NULL;
    if (!md || (id == vpad) != (md->is_video != 0)) {
      rc = anna_err(err, errlen, ANNA_EINVAL,
                    "the prompt's %s pad at token %zu has no matching media (a message's text may "
                    "not contain the pad tokens)",
                    id == ipad ? "image" : "video", i);
      break;
    }
    if (g == 0) at[k] = (int32_t)o;
    const int32_t groups = md->is_video ? md->px.grid_t : 1, per = md->n_tokens / groups;
    for (int32_t j = 0; j < per; j++)
      out[o++] = id;
    if (++g == groups) {
      g = 0;
      k++;
    }
  }
  if (!rc && (k != n_media || g != 0 || (int64_t)o != total))
    rc = anna_err(err, errlen, ANNA_EINVAL,
                  "the prompt's pad tokens do not match the %d media given", n_media);
  free(ids0);
  if (rc) {
    free(out);
    free(at);
    return rc;
  }
  *ids = out;
  *n = o;
  *media_at = at;
  return 0;
}
