/* audio_qwen3_asr.c: the Qwen3-ASR audio encoder (see audio_qwen3_asr.h). Forward per run (one
 * clip of L frames, chunks of C = 2 n_window frames, n_img = ceil(L / C) images of T = min(L, C)
 * frames each, the tail zero-padded):
 *   conv front, per group of chunks: three times  x = gelu(im2col_3x3s2(x) W^T + b)
 *   rows = conv_out(x per time step) + sinusoid(step in chunk); keep the valid steps
 *   per layer: x += out_proj(attn_seg(q, k, v of LN1 x)); x += fc2(gelu(fc1(LN2 x)))
 *   out = proj2(gelu(proj1(ln_post x)))
 * Layout trick: the chunk image is stored [time, freq] (channel-last after each conv, as matmul
 * writes rows), i.e. transposed against PyTorch's [freq, time]. The 3x3 stride-2 pad-1 convs are
 * symmetric in the two axes, so the transposed image with the kernels transposed (ky <-> kx, done
 * once at load) gives the transposed output; each time step's (freq, channel) block is then one
 * contiguous row, and conv_out's columns are permuted at load from (channel, freq) to (freq,
 * channel) order so that it is one matmul over those rows, with no gather. The valid steps of
 * the tail chunk are the last image's first ones, so the kept rows are a prefix. */
#include "model/audio_qwen3_asr.h"

#include "base/error.h"
#include "formats/dtype.h"
#include "formats/safetensors.h"
#include "media/asr_front.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AQ_MAX_LAYERS 128
#define AQ_DEFAULT_FRAMES 3000
#define AQ_GROUP 4 /* chunks per conv-front pass */
#define AQ_PREFIX "thinker.audio_tower."

typedef struct aq_layer {
  float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
  ops_weight q, k, v, o, fc1, fc2;
  float *q_b, *k_b, *v_b, *o_b, *fc1_b, *fc2_b;
} aq_layer;

typedef struct audio_model {
  char path[PATH_MAX];
  char describe[192];
  safetensors_set *st;
  int n_mels, d, n_layers, heads, head_dim, ffn, hid, out_dim, n_window, n_window_infer;
  int f1, f2, f3; /* frequency bins after each conv */
  audio_qwen3_asr_ids ids;
  ops_weight conv1, conv2, conv3, conv_out; /* f32 load-time copies, transposed / permuted */
  float *conv1_b, *conv2_b, *conv3_b;
  aq_layer layers[AQ_MAX_LAYERS];
  float *lnp_w, *lnp_b, *p1_b, *p2_b;
  ops_weight p1, p2;
  void **allocs;
  int n_allocs, cap_allocs;
} audio_model;

typedef struct audio_state {
  const audio_model *m;
  ops_backend *be; /* borrowed: frees the backend buffers */
  int64_t max_frames, max_img, max_tok;
  /* backend memory (also listed in bufs for freeing) */
  float *img, *cols, *a1, *a2, *a3, *x, *pos, *xn, *q, *k, *v, *att, *mlp, *out;
  void *bufs[14];
  int n_bufs;
  /* host scratch: one run's transposed chunk images and window offsets */
  float *h_img;
  int64_t *h_seg;
  int max_seg;
} audio_state;

static int64_t half_up(int64_t x) {
  return x > 0 ? (x - 1) / 2 + 1 : 0;
}

/* ---- loading ---- */

static void *am_alloc(audio_model *m, size_t bytes) {
  if (m->n_allocs == m->cap_allocs) {
    int cap = m->cap_allocs ? 2 * m->cap_allocs : 64;
    void **na = realloc(m->allocs, (size_t)cap * sizeof *na);
    if (!na) return NULL;
    m->allocs = na;
    m->cap_allocs = cap;
  }
  void *p = calloc(1, bytes ? bytes : 1);
  if (p) m->allocs[m->n_allocs++] = p;
  return p;
}

static void am_free(void *impl) {
  audio_model *m = impl;
  if (!m) return;
  for (int i = 0; i < m->n_allocs; i++)
    free(m->allocs[i]);
  free(m->allocs);
  safetensors_close(m->st);
  free(m);
}

/* thinker.audio_tower.<name> with rows x cols elements (first dim rows), a plain float dtype. */
static int get_tensor(audio_model *m, const char *name, int64_t rows, int64_t cols,
                      const safetensors_tensor **out, char *err, size_t errlen) {
  char full[256];
  snprintf(full, sizeof full, AQ_PREFIX "%s", name);
  const safetensors_tensor *t = safetensors_find(m->st, full);
  if (!t)
    return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s' (no audio tower?)",
                    m->path, full);
  if (safetensors_tensor_numel(t) != rows * cols || t->shape[0] != rows)
    return anna_err(err, errlen, ANNA_EFORMAT,
                    "%s: tensor '%s' has %lld elements (first dim %lld), expected [%lld, %lld]",
                    t->file, full, (long long)safetensors_tensor_numel(t), (long long)t->shape[0], (long long)rows,
                    (long long)cols);
  if (t->dtype != ANNA_DTYPE_F32 && t->dtype != ANNA_DTYPE_BF16 && t->dtype != ANNA_DTYPE_F16)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "%s: tensor '%s' has dtype %s (F32, BF16 or F16 expected)", t->file, full,
                    dtype_name(t->dtype));
  *out = t;
  return 0;
}

static int get_mat(audio_model *m, ops_weight *w, int64_t rows, int64_t cols, char *err,
                   size_t errlen, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int get_mat(audio_model *m, ops_weight *w, int64_t rows, int64_t cols, char *err,
                   size_t errlen, const char *fmt, ...) {
  char name[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  const safetensors_tensor *t;
  int rc = get_tensor(m, name, rows, cols, &t, err, errlen);
  if (rc) return rc;
  *w = (ops_weight){.type = t->dtype, .data = t->data, .rows = rows, .cols = cols};
  return 0;
}

static int get_vec(audio_model *m, float **out, int64_t n, char *err, size_t errlen,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int get_vec(audio_model *m, float **out, int64_t n, char *err, size_t errlen,
                   const char *fmt, ...) {
  char name[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  const safetensors_tensor *t;
  int rc = get_tensor(m, name, n, 1, &t, err, errlen);
  if (rc) return rc;
  float *v = am_alloc(m, (size_t)n * sizeof(float));
  if (!v) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  for (int64_t i = 0; i < n; i++)
    v[i] = safetensors_tensor_f32(t, i);
  *out = v;
  return 0;
}

/* A conv weight [co, ci, 3(freq), 3(time)] as the f32 matrix [co, ci * 9] of the transposed
 * image: column (ci, ky, kx) with ky along time holds w[co, ci, kx, ky]. */
static int get_conv(audio_model *m, ops_weight *w, int co, int ci, char *err, size_t errlen,
                    const char *name) {
  const safetensors_tensor *t;
  int rc = get_tensor(m, name, co, (int64_t)ci * 9, &t, err, errlen);
  if (rc) return rc;
  float *d = am_alloc(m, (size_t)co * (size_t)ci * 9 * sizeof(float));
  if (!d) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  for (int64_t r = 0; r < (int64_t)co * ci; r++)
    for (int ky = 0; ky < 3; ky++)
      for (int kx = 0; kx < 3; kx++)
        d[r * 9 + ky * 3 + kx] = safetensors_tensor_f32(t, r * 9 + kx * 3 + ky);
  *w = (ops_weight){.type = ANNA_DTYPE_F32, .data = d, .rows = co, .cols = (int64_t)ci * 9};
  return 0;
}

static int cfg_int(const json_t *o, const char *path, const char *key, int def, int lo, int hi,
                   int *out, char *err, size_t errlen) {
  const json_t *v = json_object_get(o, key);
  if (!v) {
    if (def >= lo) {
      *out = def;
      return 0;
    }
    return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: thinker_config.audio_config.%s is missing",
                    path, key);
  }
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
    return anna_err(err, errlen, ANNA_EFORMAT,
                    "%s: thinker_config.audio_config.%s must be an integer in [%d, %d]", path, key,
                    lo, hi);
  *out = (int)json_integer_value(v);
  return 0;
}

/* audio_config keys that change nothing at inference (dropouts, init, bookkeeping; conv_chunksize
 * only bounds the reference's memory; max_source_positions only sizes its sinusoid table, whose
 * rows restart every chunk). Any key not here nor read below is refused. */
static const char *const k_noop_keys[] = {"dropout",
                                          "attention_dropout",
                                          "activation_dropout",
                                          "initializer_range",
                                          "model_type",
                                          "_name_or_path",
                                          "torch_dtype",
                                          "dtype",
                                          "transformers_version",
                                          "architectures",
                                          "conv_chunksize",
                                          "max_source_positions",
                                          "output_attentions",
                                          "output_hidden_states",
                                          "return_dict",
                                          "use_return_dict",
                                          "_attn_implementation_autoset",
                                          "id2label",
                                          "label2id",
                                          "encoder_layerdrop"};

static int parse_config(audio_model *m, const char *cfg_path, char *err, size_t errlen) {
  json_error_t je;
  json_t *root = json_load_file(cfg_path, 0, &je);
  if (!root)
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: %s (line %d)", cfg_path, je.text, je.line);
  int rc = 0;
  const json_t *mt = json_object_get(root, "model_type"),
               *tc = json_object_get(root, "thinker_config");
  const char *type = json_is_string(mt) ? json_string_value(mt) : "";
  const json_t *ac = json_is_object(tc) ? json_object_get(tc, "audio_config") : NULL;
  if (strcmp(type, "qwen3_asr")) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "%s: model_type '%s' has no Qwen3-ASR audio tower", cfg_path, type);
    goto out;
  }
  if (!json_is_object(ac)) {
    rc = anna_err(err, errlen, ANNA_ENOTFOUND,
                  "%s: no thinker_config.audio_config: this model has no audio tower", cfg_path);
    goto out;
  }
  static const char *const known[] = {"num_mel_bins",
                                      "encoder_layers",
                                      "encoder_attention_heads",
                                      "encoder_ffn_dim",
                                      "d_model",
                                      "n_window",
                                      "n_window_infer",
                                      "downsample_hidden_size",
                                      "output_dim",
                                      "activation_function",
                                      "scale_embedding"};
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)ac, key, val) {
    int ok = 0;
    for (size_t i = 0; i < sizeof known / sizeof *known && !ok; i++)
      ok = !strcmp(key, known[i]);
    for (size_t i = 0; i < sizeof k_noop_keys / sizeof *k_noop_keys && !ok; i++)
      ok = !strcmp(key, k_noop_keys[i]);
    if (!ok) {
      rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "%s: thinker_config.audio_config.%s is not supported", cfg_path, key);
      goto out;
    }
  }
  /* defaults: qwen-asr's class defaults where the released configs always set the key anyway */
  if ((rc = cfg_int(ac, cfg_path, "num_mel_bins", 128, 1, 1024, &m->n_mels, err, errlen)) ||
      (rc = cfg_int(ac, cfg_path, "encoder_layers", -1, 1, AQ_MAX_LAYERS, &m->n_layers, err,
                    errlen)) ||
      (rc =
           cfg_int(ac, cfg_path, "encoder_attention_heads", -1, 1, 1024, &m->heads, err, errlen)) ||
      (rc = cfg_int(ac, cfg_path, "encoder_ffn_dim", -1, 1, 1 << 18, &m->ffn, err, errlen)) ||
      (rc = cfg_int(ac, cfg_path, "d_model", -1, 4, 1 << 16, &m->d, err, errlen)) ||
      (rc = cfg_int(ac, cfg_path, "n_window", -1, 1, 1 << 12, &m->n_window, err, errlen)) ||
      (rc = cfg_int(ac, cfg_path, "n_window_infer", -1, 1, 1 << 20, &m->n_window_infer, err,
                    errlen)) ||
      (rc =
           cfg_int(ac, cfg_path, "downsample_hidden_size", -1, 1, 1 << 14, &m->hid, err, errlen)) ||
      (rc = cfg_int(ac, cfg_path, "output_dim", -1, 1, 1 << 18, &m->out_dim, err, errlen)))
    goto out;
  const json_t *act = json_object_get(ac, "activation_function"),
               *se = json_object_get(ac, "scale_embedding");
  if (act && (!json_is_string(act) || strcmp(json_string_value(act), "gelu"))) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "%s: thinker_config.audio_config.activation_function must be gelu", cfg_path);
    goto out;
  }
  if (se && !json_is_false(se)) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "%s: thinker_config.audio_config.scale_embedding must be false", cfg_path);
    goto out;
  }
  m->head_dim = m->d / m->heads;
  if (m->d % 2 || m->d % m->heads || m->head_dim > OPS_SEG_ATTN_MAX_DIM) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "%s: audio d_model %d with %d heads: d must be even and a multiple of the heads, "
                  "head dim <= %d",
                  cfg_path, m->d, m->heads, OPS_SEG_ATTN_MAX_DIM);
    goto out;
  }
  if (m->n_window_infer < 2 * m->n_window) {
    rc = anna_err(err, errlen, ANNA_EFORMAT,
                  "%s: thinker_config.audio_config.n_window_infer %d is shorter than one chunk (2 "
                  "* n_window = %d)",
                  cfg_path, m->n_window_infer, 2 * m->n_window);
    goto out;
  }
  /* released ids unless the config names others (the test fixture remaps them) */
  m->ids = (audio_qwen3_asr_ids){151676, 151669, 151670};
  const struct {
    const char *key;
    int32_t *dst;
  } idk[] = {{"audio_token_id", &m->ids.audio_pad},
             {"audio_start_token_id", &m->ids.audio_start},
             {"audio_end_token_id", &m->ids.audio_end}};
  for (size_t i = 0; i < sizeof idk / sizeof *idk; i++) {
    const json_t *v = json_object_get(tc, idk[i].key);
    if (!v) continue;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
      rc = anna_err(err, errlen, ANNA_EFORMAT,
                    "%s: thinker_config.%s must be a non-negative integer", cfg_path, idk[i].key);
      goto out;
    }
    *idk[i].dst = (int32_t)json_integer_value(v);
  }
out:
  json_decref(root);
  return rc;
}

static int aq_load(void **impl, const model_source *src, const model_load_params *p, char *err,
                   size_t errlen) {
  (void)p;
  *impl = NULL;
  if (src->is_gguf)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "%s: the Qwen3-ASR audio encoder loads from HF folders", src->path);
  audio_model *m = calloc(1, sizeof *m);
  if (!m) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  snprintf(m->path, sizeof m->path, "%s", src->path);
  char cfg[PATH_MAX + 16];
  snprintf(cfg, sizeof cfg, "%s/config.json", src->path);
  int rc = parse_config(m, cfg, err, errlen);
  if (!rc) rc = safetensors_open(&m->st, src->path, err, errlen);
  if (rc) {
    am_free(m);
    return rc;
  }
  const int d = m->d, h = m->hid;
  m->f1 = (int)half_up(m->n_mels), m->f2 = (int)half_up(m->f1), m->f3 = (int)half_up(m->f2);
  rc = get_conv(m, &m->conv1, h, 1, err, errlen, "conv2d1.weight");
  if (!rc) rc = get_vec(m, &m->conv1_b, h, err, errlen, "conv2d1.bias");
  if (!rc) rc = get_conv(m, &m->conv2, h, h, err, errlen, "conv2d2.weight");
  if (!rc) rc = get_vec(m, &m->conv2_b, h, err, errlen, "conv2d2.bias");
  if (!rc) rc = get_conv(m, &m->conv3, h, h, err, errlen, "conv2d3.weight");
  if (!rc) rc = get_vec(m, &m->conv3_b, h, err, errlen, "conv2d3.bias");
  if (!rc) {
    /* conv_out [d, h * f3] on (channel, freq) columns -> (freq, channel) columns */
    const safetensors_tensor *t;
    const int64_t K = (int64_t)h * m->f3;
    rc = get_tensor(m, "conv_out.weight", d, K, &t, err, errlen);
    float *w = rc ? NULL : am_alloc(m, (size_t)(d * K) * sizeof(float));
    if (!rc && !w) rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    for (int64_t j = 0; !rc && j < d; j++)
      for (int64_t f = 0; f < m->f3; f++)
        for (int64_t c = 0; c < h; c++)
          w[j * K + f * h + c] = safetensors_tensor_f32(t, j * K + c * m->f3 + f);
    if (!rc) m->conv_out = (ops_weight){.type = ANNA_DTYPE_F32, .data = w, .rows = d, .cols = K};
  }
  for (int l = 0; !rc && l < m->n_layers; l++) {
    aq_layer *b = &m->layers[l];
    if ((rc = get_vec(m, &b->ln1_w, d, err, errlen, "layers.%d.self_attn_layer_norm.weight", l)) ||
        (rc = get_vec(m, &b->ln1_b, d, err, errlen, "layers.%d.self_attn_layer_norm.bias", l)) ||
        (rc = get_vec(m, &b->ln2_w, d, err, errlen, "layers.%d.final_layer_norm.weight", l)) ||
        (rc = get_vec(m, &b->ln2_b, d, err, errlen, "layers.%d.final_layer_norm.bias", l)) ||
        (rc = get_mat(m, &b->q, d, d, err, errlen, "layers.%d.self_attn.q_proj.weight", l)) ||
        (rc = get_vec(m, &b->q_b, d, err, errlen, "layers.%d.self_attn.q_proj.bias", l)) ||
        (rc = get_mat(m, &b->k, d, d, err, errlen, "layers.%d.self_attn.k_proj.weight", l)) ||
        (rc = get_vec(m, &b->k_b, d, err, errlen, "layers.%d.self_attn.k_proj.bias", l)) ||
        (rc = get_mat(m, &b->v, d, d, err, errlen, "layers.%d.self_attn.v_proj.weight", l)) ||
        (rc = get_vec(m, &b->v_b, d, err, errlen, "layers.%d.self_attn.v_proj.bias", l)) ||
        (rc = get_mat(m, &b->o, d, d, err, errlen, "layers.%d.self_attn.out_proj.weight", l)) ||
        (rc = get_vec(m, &b->o_b, d, err, errlen, "layers.%d.self_attn.out_proj.bias", l)) ||
        (rc = get_mat(m, &b->fc1, m->ffn, d, err, errlen, "layers.%d.fc1.weight", l)) ||
        (rc = get_vec(m, &b->fc1_b, m->ffn, err, errlen, "layers.%d.fc1.bias", l)) ||
        (rc = get_mat(m, &b->fc2, d, m->ffn, err, errlen, "layers.%d.fc2.weight", l)))
      break;
    rc = get_vec(m, &b->fc2_b, d, err, errlen, "layers.%d.fc2.bias", l);
  }
  if (!rc) rc = get_vec(m, &m->lnp_w, d, err, errlen, "ln_post.weight");
  if (!rc) rc = get_vec(m, &m->lnp_b, d, err, errlen, "ln_post.bias");
  if (!rc) rc = get_mat(m, &m->p1, d, d, err, errlen, "proj1.weight");
  if (!rc) rc = get_vec(m, &m->p1_b, d, err, errlen, "proj1.bias");
  if (!rc) rc = get_mat(m, &m->p2, m->out_dim, d, err, errlen, "proj2.weight");
  if (!rc) rc = get_vec(m, &m->p2_b, m->out_dim, err, errlen, "proj2.bias");
  if (rc) {
    am_free(m);
    return rc;
  }
  snprintf(m->describe, sizeof m->describe,
           "qwen3_asr_audio: %d layers, d %d, heads %d, ffn %d, conv %d, out %d, chunk %d frames, "
           "window %d frames",
           m->n_layers, d, m->heads, m->ffn, h, m->out_dim, 2 * m->n_window, m->n_window_infer);
  *impl = m;
  return 0;
}

int64_t audio_qwen3_asr_tokens(const void *impl, int64_t n_frames) {
  const audio_model *m = impl;
  return media_asr_front_tokens(n_frames, 2 * m->n_window);
}

void audio_qwen3_asr_get_ids(const void *impl, audio_qwen3_asr_ids *out) {
  *out = ((const audio_model *)impl)->ids;
}

static int aq_probe(const model_source *src) {
  return !src->is_gguf && !strcmp(src->model_type, "qwen3_asr");
}

static void aq_describe(const void *impl, model_desc *out) {
  const audio_model *m = impl;
  *out =
      (model_desc){.text = m->describe, .vocab = 0, .n_embd = m->out_dim, .n_layers = m->n_layers};
}

static int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

static void aq_backend_shape(const void *impl, int n_ctx, ops_model_shape *out) {
  const audio_model *m = impl;
  memset(out, 0, sizeof *out);
  out->max_cols = max64(max64(9 * (int64_t)m->hid, (int64_t)m->f3 * m->hid), max64(m->ffn, m->d));
  out->n_ctx = n_ctx;
  out->n_heads = m->heads;
}

/* ---- state ---- */

static void aq_state_free(void *state) {
  audio_state *s = state;
  if (!s) return;
  for (int i = 0; i < s->n_bufs; i++)
    s->be->free(s->be, s->bufs[i]);
  free(s->h_img);
  free(s->h_seg);
  free(s);
}

static float *be_buf(audio_state *s, int64_t floats) {
  void *p = s->be->alloc(s->be, (size_t)(floats > 0 ? floats : 1) * sizeof(float));
  if (p) s->bufs[s->n_bufs++] = p;
  return p;
}

static int aq_state_create(void **state, const void *impl, ops_backend *be,
                           const model_state_params *p, char *err, size_t errlen) {
  *state = NULL;
  const audio_model *m = impl;
  const struct {
    const char *name;
    int have;
  } need[] = {{"matmul", be->matmul != NULL},
              {"add", be->add != NULL},
              {"layer_norm", be->layer_norm != NULL},
              {"gelu", be->gelu != NULL},
              {"attention_seg", be->attention_seg != NULL},
              {"im2col_3x3s2", be->im2col_3x3s2 != NULL},
              {"alloc", be->alloc && be->free && be->upload && be->download}};
  for (size_t i = 0; i < sizeof need / sizeof *need; i++)
    if (!need[i].have)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "audio encoder: %s ops not implemented yet (the %s backend has no %s op)",
                      !strcmp(be->name, "cuda") ? "CUDA" : be->name, be->name, need[i].name);
  const int64_t L = p->n_batch > 0 ? p->n_batch : AQ_DEFAULT_FRAMES, C = 2 * (int64_t)m->n_window;
  if (L > (int64_t)1 << 24)
    return anna_err(err, errlen, ANNA_ERANGE,
                    "audio encoder: n_batch %lld frames out of range [1, %d]", (long long)L,
                    1 << 24);
  audio_state *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  s->be = be;
  s->m = m;
  s->max_frames = L;
  const int64_t T = L < C ? L : C, t1 = half_up(T), t2 = half_up(t1), t3 = half_up(t2);
  const int64_t n_img = (L + C - 1) / C, G = n_img < AQ_GROUP ? n_img : AQ_GROUP;
  const int64_t h = m->hid, d = m->d, nm = m->n_mels;
  s->max_img = n_img;
  s->max_tok = n_img * t3;
  const int64_t win = t3 * (m->n_window_infer / C);
  s->max_seg = (int)(s->max_tok / (win > 0 ? win : 1) + 2);
  const int64_t cols =
      max64(G * t1 * m->f1 * 9, max64(G * t2 * m->f2 * 9 * h, G * t3 * m->f3 * 9 * h));
  s->img = be_buf(s, n_img * T * nm);
  s->cols = be_buf(s, cols);
  s->a1 = be_buf(s, G * t1 * m->f1 * h);
  s->a2 = be_buf(s, G * t2 * m->f2 * h);
  s->a3 = be_buf(s, G * t3 * m->f3 * h);
  s->x = be_buf(s, s->max_tok * d);
  s->pos = be_buf(s, s->max_tok * d);
  s->xn = be_buf(s, s->max_tok * d);
  s->q = be_buf(s, s->max_tok * d);
  s->k = be_buf(s, s->max_tok * d);
  s->v = be_buf(s, s->max_tok * d);
  s->att = be_buf(s, s->max_tok * d);
  s->mlp = be_buf(s, s->max_tok * max64(m->ffn, d));
  s->out = be_buf(s, s->max_tok * m->out_dim);
  s->h_img = malloc((size_t)(n_img * T * nm) * sizeof(float));
  s->h_seg = malloc((size_t)(s->max_seg + 1) * sizeof(int64_t));
  float *hpos = malloc((size_t)(s->max_tok * d) * sizeof(float));
  if (s->n_bufs != 14 || !s->h_img || !s->h_seg || !hpos) {
    free(hpos);
    aq_state_free(s);
    return anna_err(err, errlen, ANNA_ENOMEM,
                    "audio encoder: cannot allocate buffers for %lld frames", (long long)L);
  }
  /* Sinusoids of step p in its chunk (p restarts every chunk), the same f32 formula as the
   * reference (media/asr_front.c): row r gets p = r mod t3. A shorter single chunk (L < C)
   * uses the first rows, whose p are 0.. as well. */
  const float neg_inc = (float)(-log(10000.0) / (double)(d / 2 - 1));
  for (int64_t r = 0; r < s->max_tok; r++)
    for (int64_t i = 0; i < d / 2; i++) {
      const float ang = (float)(r % t3) * expf(neg_inc * (float)i);
      hpos[r * d + i] = sinf(ang);
      hpos[r * d + d / 2 + i] = cosf(ang);
    }
  be->upload(be, s->pos, hpos, (size_t)(s->max_tok * d) * sizeof(float));
  free(hpos);
  *state = s;
  return 0;
}

/* ---- run ---- */

static int aq_run(const void *impl, void *state, ops_backend *be, const model_input *in,
                  const model_output *out, char *err, size_t errlen) {
  const audio_model *m = impl;
  audio_state *s = state;
  if (in->io != MODEL_IO_AUDIO || out->io != MODEL_IO_EMBEDDINGS)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "the audio encoder maps audio features to embeddings, not %s to %s",
                    model_io_name(in->io), model_io_name(out->io));
  if (!in->features) return anna_err(err, errlen, ANNA_EINVAL, "audio encoder: no features given");
  if (in->n_mels != m->n_mels)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "audio encoder: features have %d mel bins, this encoder takes %d", in->n_mels,
                    m->n_mels);
  const int64_t L = in->n_frames, C = 2 * (int64_t)m->n_window;
  if (L < 1)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "audio encoder: the features have %lld frames (need >= 1)", (long long)L);
  if (L > s->max_frames)
    return anna_err(err, errlen, ANNA_ERANGE,
                    "audio encoder: %lld frames exceed the state's %lld (n_batch)", (long long)L,
                    (long long)s->max_frames);
  const int64_t N = media_asr_front_tokens(L, (int)C);
  if (!out->embd || out->embd_rows < N)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "audio encoder: the output holds %lld rows, %lld frames make %lld",
                    (long long)(out->embd ? out->embd_rows : 0), (long long)L, (long long)N);
  const int64_t T = L < C ? L : C, t1 = half_up(T), t2 = half_up(t1), t3 = half_up(t2);
  const int64_t n_img = (L + C - 1) / C, nm = m->n_mels, h = m->hid, d = m->d;
  /* chunk images [img][time T][freq], the tail zero-padded */
  for (int64_t img = 0; img < n_img; img++)
    for (int64_t t = 0; t < T; t++) {
      float *dst = s->h_img + (img * T + t) * nm;
      const int64_t f = img * C + t;
      for (int64_t b = 0; b < nm; b++)
        dst[b] = f < L ? in->features[b * L + f] : 0.0f;
    }
  /* attention windows: t3 * (n_window_infer / C) tokens from the start, the last the remainder */
  const int64_t win = t3 * (m->n_window_infer / C);
  int n_seg = 0;
  s->h_seg[0] = 0;
  for (int64_t a = 0; a < N; a += win)
    s->h_seg[++n_seg] = a + win < N ? a + win : N;
  if (be->bind) be->bind(be); /* a device backend: this thread's work goes to its device */
  be->upload(be, s->img, s->h_img, (size_t)(n_img * T * nm) * sizeof(float));
  if (be->step_begin) be->step_begin(be, N);
  for (int64_t g0 = 0; g0 < n_img; g0 += AQ_GROUP) {
    const int64_t G = n_img - g0 < AQ_GROUP ? n_img - g0 : AQ_GROUP;
    be->im2col_3x3s2(be, s->cols, s->img + g0 * T * nm, G, (int)T, (int)nm, 1);
    be->matmul(be, s->a1, s->cols, G * t1 * m->f1, &m->conv1, m->conv1_b);
    be->gelu(be, s->a1, G * t1 * m->f1 * h, 1);
    be->im2col_3x3s2(be, s->cols, s->a1, G, (int)t1, m->f1, (int)h);
    be->matmul(be, s->a2, s->cols, G * t2 * m->f2, &m->conv2, m->conv2_b);
    be->gelu(be, s->a2, G * t2 * m->f2 * h, 1);
    be->im2col_3x3s2(be, s->cols, s->a2, G, (int)t2, m->f2, (int)h);
    be->matmul(be, s->a3, s->cols, G * t3 * m->f3, &m->conv3, m->conv3_b);
    be->gelu(be, s->a3, G * t3 * m->f3 * h, 1);
    be->matmul(be, s->x + g0 * t3 * d, s->a3, G * t3, &m->conv_out, NULL);
  }
  /* the kept rows are a prefix (only the last chunk has invalid steps) */
  be->add(be, s->x, s->pos, N * d);
  const ops_seg_attn_args sa = {.n = N,
                                .n_heads = m->heads,
                                .head_dim = m->head_dim,
                                .scale = 1.0f / sqrtf((float)m->head_dim),
                                .q = s->q,
                                .k = s->k,
                                .v = s->v,
                                .q_stride = d,
                                .k_stride = d,
                                .v_stride = d,
                                .n_seg = n_seg,
                                .seg = s->h_seg};
  for (int l = 0; l < m->n_layers; l++) {
    const aq_layer *b = &m->layers[l];
    be->layer_norm(be, s->xn, s->x, b->ln1_w, b->ln1_b, N, (int)d, 1e-5f);
    be->matmul(be, s->q, s->xn, N, &b->q, b->q_b);
    be->matmul(be, s->k, s->xn, N, &b->k, b->k_b);
    be->matmul(be, s->v, s->xn, N, &b->v, b->v_b);
    be->attention_seg(be, s->att, &sa);
    be->matmul(be, s->xn, s->att, N, &b->o, b->o_b);
    be->add(be, s->x, s->xn, N * d);
    be->layer_norm(be, s->xn, s->x, b->ln2_w, b->ln2_b, N, (int)d, 1e-5f);
    be->matmul(be, s->mlp, s->xn, N, &b->fc1, b->fc1_b);
    be->gelu(be, s->mlp, N * m->ffn, 1);
    be->matmul(be, s->xn, s->mlp, N, &b->fc2, b->fc2_b);
    be->add(be, s->x, s->xn, N * d);
  }
  be->layer_norm(be, s->xn, s->x, m->lnp_w, m->lnp_b, N, (int)d, 1e-5f);
  be->matmul(be, s->mlp, s->xn, N, &m->p1, m->p1_b);
  be->gelu(be, s->mlp, N * d, 1);
  be->matmul(be, s->out, s->mlp, N, &m->p2, m->p2_b);
  if (be->step_end) be->step_end(be);
  be->download(be, out->embd, s->out, (size_t)(N * m->out_dim) * sizeof(float));
  if (out->embd_written) *out->embd_written = N;
  if (be->error) return be->error(be, err, errlen);
  return 0;
}

const model_kind audio_qwen3_asr_kind = {
    .name = "qwen3_asr_audio",
    .inputs = MODEL_IO_BIT(MODEL_IO_AUDIO),
    .outputs = MODEL_IO_BIT(MODEL_IO_EMBEDDINGS),
    .probe = aq_probe,
    .load = aq_load,
    .free = am_free,
    .describe = aq_describe,
    .backend_shape = aq_backend_shape,
    .state_create = aq_state_create,
    .state_free = aq_state_free,
    .run = aq_run,
    .warmup = NULL,
    .seq = NULL,
};
