/* tts_qwen3.c: the Qwen3-TTS talker + code predictor (tts_qwen3.h). */
#define _POSIX_C_SOURCE 200809L
#include "model/tts_qwen3.h"

#include "base/error.h"
#include "formats/dtype.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/model.h"

#include <ctype.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define NG TTS_QWEN3_GROUPS
#define MAX_NAMES 64

typedef struct tts_name {
  char *name;    /* lower case, owned */
  int id;
  char *dialect; /* speakers: the dialect language key, NULL when not a dialect speaker */
} tts_name;

typedef struct tts_sampling {
  int do_sample, top_k;
  float top_p, temperature, penalty;
} tts_sampling;

struct tts_qwen3 {
  text_model *talker, *cp;
  ops_weight text_embed, fc1, fc2, mtp;
  float *fc1_b, *fc2_b, *mtp_b; /* host f32, owned */
  int has_mtp;
  ops_weight cp_embed[NG - 1], cp_head[NG - 1];
  int text_vocab, text_hidden, cp_vocab;
  int im_start, im_end, tts_pad, tts_bos, tts_eos;
  int c_eos, c_think, c_nothink, c_think_bos, c_think_eos, c_pad, c_bos;
  tts_name spk[MAX_NAMES], lang[MAX_NAMES];
  int n_spk, n_lang;
  tts_sampling talk, sub;
  int min_new;
  int voice_design;   /* tts_model_type "voice_design": no preset speakers, instructions */
  int base;           /* tts_model_type "base": voice cloning (speaker_embed), no presets */
  int no_instruct;    /* a 0.6B CustomVoice checkpoint: qwen-tts drops its instructions */
  char describe[200];
};

struct tts_qwen3_state {
  const tts_qwen3 *m;
  ops_backend *be;
  fwd_state *ts, *cs;
  int n_ctx;
  /* backend */
  int32_t *d_ids;
  float *d_te, *d_t1, *d_ones, *d_out, *d_x, *d_y;
  /* host */
  float *rows, *logits, *hidden, *tmp, *tts_rows, *cp_rows, *cp_hidden, *cp_logits, *probs;
  int32_t *tok, *seqv, *pos, *idx, *rowidx, *hist;
  int8_t *flags;
  uint64_t rng;
};

/* ---- load ---- */

static int f32_copy(const safetensors_tensor *t, float **out, int64_t n) {
  float *v = malloc((size_t)n * sizeof *v);
  if (!v) return ANNA_ENOMEM;
  for (int64_t i = 0; i < n; i++) v[i] = safetensors_tensor_f32(t, i);
  *out = v;
  return 0;
}

static int get_w(const tts_qwen3 *m, const char *dir, const char *name, int64_t rows, int64_t cols, ops_weight *w,
                 char *err, size_t errlen) {
  const safetensors_tensor *t = safetensors_find(m->talker->st, name);
  if (!t) return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s'", dir, name);
  if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: tensor '%s' has the wrong shape (expected [%lld, %lld])", t->file,
                    name, (long long)rows, (long long)cols);
  *w = (ops_weight){.type = t->dtype, .data = t->data, .rows = rows, .cols = cols};
  return 0;
}

static int get_b(const tts_qwen3 *m, const char *dir, const char *name, int64_t n, float **out, char *err,
                 size_t errlen) {
  const safetensors_tensor *t = safetensors_find(m->talker->st, name);
  if (!t) return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s'", dir, name);
  if (t->ndim != 1 || t->shape[0] != n)
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: tensor '%s' has the wrong shape (expected [%lld])", t->file, name,
                    (long long)n);
  if (f32_copy(t, out, n)) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  return 0;
}

static int jint(json_t *o, const char *k, int *out, int required, const char *path, char *err, size_t errlen) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) {
    if (!required) return 0;
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: missing field '%s'", path, k);
  }
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: field '%s' must be a non-negative integer", path, k);
  *out = (int)json_integer_value(v);
  return 0;
}

static void jnum(json_t *o, const char *k, float *out) {
  json_t *v = json_object_get(o, k);
  if (json_is_number(v)) *out = (float)json_number_value(v);
}

static char *lower_dup(const char *s) {
  char *d = strdup(s);
  for (char *p = d; p && *p; p++) *p = (char)tolower((unsigned char)*p);
  return d;
}

/* spk_id / codec_language_id: {name: id}; spk_is_dialect: {name: false | "dialect"} */
static int read_names(json_t *tc, const char *key, tts_name *out, int *n, int vocab, const char *path, char *err,
                      size_t errlen) {
  json_t *o = json_object_get(tc, key);
  if (!json_is_object(o)) return anna_err(err, errlen, ANNA_EFORMAT, "%s: talker_config.%s must be an object", path, key);
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    if (*n == MAX_NAMES) return anna_err(err, errlen, ANNA_EFORMAT, "%s: more than %d %s entries", path, MAX_NAMES, key);
    json_t *id = json_is_array(v) ? json_array_get(v, 0) : v; /* [id] accepted too (unverified form) */
    if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= vocab)
      return anna_err(err, errlen, ANNA_EFORMAT, "%s: talker_config.%s.%s must be a codec id below %d", path, key, k,
                      vocab);
    if (!(out[*n].name = lower_dup(k))) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    out[(*n)++].id = (int)json_integer_value(id);
  }
  return 0;
}

static const tts_name *find_name(const tts_name *a, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcasecmp(a[i].name, name)) return &a[i];
  return NULL;
}

static int parse_top(tts_qwen3 *m, const char *dir, char *err, size_t errlen) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) return anna_err(err, errlen, ANNA_EFORMAT, "%s: line %d: %s", path, je.line, je.text);
  int rc = 0;
  json_t *tc = json_object_get(root, "talker_config");
  json_t *ty = json_object_get(root, "tts_model_type");
  if (!json_is_object(tc)) {
    rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: missing object 'talker_config'", path);
    goto out;
  }
  if (json_is_string(ty) && strcmp(json_string_value(ty), "custom_voice") &&
      strcmp(json_string_value(ty), "voice_design") && strcmp(json_string_value(ty), "base")) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "%s: tts_model_type '%s' is not supported (have: custom_voice, voice_design; voice cloning "
                  "(base) is not implemented)",
                  path, json_string_value(ty));
    goto out;
  }
  m->voice_design = json_is_string(ty) && !strcmp(json_string_value(ty), "voice_design");
  m->base = json_is_string(ty) && !strcmp(json_string_value(ty), "base");
  {
    /* qwen-tts' generate_custom_voice sets instruct = None when tts_model_size is "0b6" */
    const json_t *sz = json_object_get(root, "tts_model_size");
    m->no_instruct = m->base || (!m->voice_design && json_is_string(sz) && strstr("0b6", json_string_value(sz)));
  }
  m->im_start = 151644, m->im_end = 151645, m->tts_pad = 151671, m->tts_bos = 151672, m->tts_eos = 151673;
  int groups = NG;
  m->text_vocab = 151936, m->text_hidden = 2048;
  const int V = m->talker->cfg.vocab;
  if ((rc = jint(root, "im_start_token_id", &m->im_start, 0, path, err, errlen)) ||
      (rc = jint(root, "im_end_token_id", &m->im_end, 0, path, err, errlen)) ||
      (rc = jint(root, "tts_pad_token_id", &m->tts_pad, 0, path, err, errlen)) ||
      (rc = jint(root, "tts_bos_token_id", &m->tts_bos, 0, path, err, errlen)) ||
      (rc = jint(root, "tts_eos_token_id", &m->tts_eos, 0, path, err, errlen)) ||
      (rc = jint(tc, "num_code_groups", &groups, 1, path, err, errlen)) ||
      (rc = jint(tc, "text_vocab_size", &m->text_vocab, 0, path, err, errlen)) ||
      (rc = jint(tc, "text_hidden_size", &m->text_hidden, 0, path, err, errlen)) ||
      (rc = jint(tc, "codec_eos_token_id", &m->c_eos, 1, path, err, errlen)) ||
      (rc = jint(tc, "codec_think_id", &m->c_think, 1, path, err, errlen)) ||
      (rc = jint(tc, "codec_nothink_id", &m->c_nothink, 1, path, err, errlen)) ||
      (rc = jint(tc, "codec_think_bos_id", &m->c_think_bos, 1, path, err, errlen)) ||
      (rc = jint(tc, "codec_think_eos_id", &m->c_think_eos, 1, path, err, errlen)) ||
      (rc = jint(tc, "codec_pad_id", &m->c_pad, 1, path, err, errlen)) ||
      (rc = jint(tc, "codec_bos_id", &m->c_bos, 1, path, err, errlen)))
    goto out;
  if (groups != NG) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: num_code_groups %d (have: %d)", path, groups, NG);
    goto out;
  }
  const int ids[] = {m->c_eos, m->c_think, m->c_nothink, m->c_think_bos, m->c_think_eos, m->c_pad, m->c_bos};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    if (ids[i] >= V) {
      rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: codec control id %d is outside the codec vocabulary %d", path,
                    ids[i], V);
      goto out;
    }
  const int tids[] = {m->im_start, m->im_end, m->tts_pad, m->tts_bos, m->tts_eos};
  for (size_t i = 0; i < sizeof tids / sizeof tids[0]; i++)
    if (tids[i] >= m->text_vocab || m->text_hidden < 1) {
      rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: token id %d is outside the text vocabulary %d", path, tids[i],
                    m->text_vocab);
      goto out;
    }
  if ((!(m->voice_design || m->base) || json_object_get(tc, "spk_id")) &&
      (rc = read_names(tc, "spk_id", m->spk, &m->n_spk, V, path, err, errlen)))
    goto out;
  if (m->voice_design || m->base) m->n_spk = 0; /* the wrapper passes no preset speaker to these */
  if (
      (rc = read_names(tc, "codec_language_id", m->lang, &m->n_lang, V, path, err, errlen)))
    goto out;
  json_t *dia = json_object_get(tc, "spk_is_dialect");
  for (int i = 0; i < m->n_spk && json_is_object(dia); i++) {
    const char *k;
    json_t *v;
    json_object_foreach(dia, k, v) {
      if (strcasecmp(k, m->spk[i].name) || !json_is_string(v)) continue;
      if (!find_name(m->lang, m->n_lang, json_string_value(v))) {
        rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: speaker '%s' has dialect '%s', not in codec_language_id", path,
                      k, json_string_value(v));
        goto out;
      }
      if (!(m->spk[i].dialect = lower_dup(json_string_value(v)))) {
        rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
        goto out;
      }
    }
  }
out:
  json_decref(root);
  return rc;
}

/* generation_config.json (optional): the wrapper's fallbacks otherwise. */
static void parse_generation(tts_qwen3 *m, const char *dir) {
  m->talk = (tts_sampling){1, 50, 1.0f, 0.9f, 1.05f};
  m->sub = (tts_sampling){1, 50, 1.0f, 0.9f, 1.0f};
  m->min_new = 2;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  json_t *g = json_load_file(path, 0, NULL);
  if (!g) return;
  json_t *v;
  if ((v = json_object_get(g, "do_sample")) && json_is_boolean(v)) m->talk.do_sample = json_is_true(v);
  if ((v = json_object_get(g, "subtalker_dosample")) && json_is_boolean(v)) m->sub.do_sample = json_is_true(v);
  if ((v = json_object_get(g, "top_k")) && json_is_integer(v)) m->talk.top_k = (int)json_integer_value(v);
  if ((v = json_object_get(g, "subtalker_top_k")) && json_is_integer(v)) m->sub.top_k = (int)json_integer_value(v);
  jnum(g, "top_p", &m->talk.top_p);
  jnum(g, "temperature", &m->talk.temperature);
  jnum(g, "repetition_penalty", &m->talk.penalty);
  jnum(g, "subtalker_top_p", &m->sub.top_p);
  jnum(g, "subtalker_temperature", &m->sub.temperature);
  json_decref(g);
}

void tts_qwen3_free(tts_qwen3 *m) {
  if (!m) return;
  model_free(m->talker);
  model_free(m->cp);
  free(m->fc1_b);
  free(m->fc2_b);
  free(m->mtp_b);
  for (int i = 0; i < m->n_spk; i++) free(m->spk[i].name), free(m->spk[i].dialect);
  for (int i = 0; i < m->n_lang; i++) free(m->lang[i].name);
  free(m);
}

int tts_qwen3_load(tts_qwen3 **out, const char *dir, char *err, size_t errlen) {
  *out = NULL;
  tts_qwen3 *m = calloc(1, sizeof *m);
  if (!m) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/config.json", dir);
  static const char *const tk[] = {"talker_config"}, *const ck[] = {"talker_config", "code_predictor_config"};
  model_config tcfg, ccfg;
  int rc;
  if ((rc = config_parse_hf_nested(&tcfg, path, tk, 1, "qwen3", err, errlen)) ||
      (rc = config_parse_hf_nested(&ccfg, path, ck, 2, "qwen3", err, errlen)))
    goto fail;
  /* The predictor's model has no token embedding of its own width (its inputs are talker-wide
   * rows, projected): lm_head.0 [vocab, hidden] stands in for the table forward_batch reads
   * before every row is replaced. */
  if ((rc = model_load_hf_named(&m->talker, dir, &tcfg, "talker.model.", "talker.model.codec_embedding.weight",
                                "talker.model.norm.weight", "talker.codec_head.weight", err, errlen)) ||
      (rc = model_load_hf_named(&m->cp, dir, &ccfg, "talker.code_predictor.model.",
                                "talker.code_predictor.lm_head.0.weight", "talker.code_predictor.model.norm.weight",
                                "talker.code_predictor.lm_head.0.weight", err, errlen)))
    goto fail;
  if ((rc = parse_top(m, dir, err, errlen))) goto fail;
  parse_generation(m, dir);
  const int H = tcfg.hidden, Hc = ccfg.hidden, TH = m->text_hidden;
  m->cp_vocab = ccfg.vocab;
  if ((rc = get_w(m, dir, "talker.model.text_embedding.weight", m->text_vocab, TH, &m->text_embed, err, errlen)) ||
      (rc = get_w(m, dir, "talker.text_projection.linear_fc1.weight", TH, TH, &m->fc1, err, errlen)) ||
      (rc = get_b(m, dir, "talker.text_projection.linear_fc1.bias", TH, &m->fc1_b, err, errlen)) ||
      (rc = get_w(m, dir, "talker.text_projection.linear_fc2.weight", H, TH, &m->fc2, err, errlen)) ||
      (rc = get_b(m, dir, "talker.text_projection.linear_fc2.bias", H, &m->fc2_b, err, errlen)))
    goto fail;
  m->has_mtp = Hc != H;
  if (m->has_mtp && ((rc = get_w(m, dir, "talker.code_predictor.small_to_mtp_projection.weight", Hc, H, &m->mtp, err,
                                 errlen)) ||
                     (rc = get_b(m, dir, "talker.code_predictor.small_to_mtp_projection.bias", Hc, &m->mtp_b, err,
                                 errlen))))
    goto fail;
  for (int k = 0; k < NG - 1; k++) {
    char n[128];
    snprintf(n, sizeof n, "talker.code_predictor.model.codec_embedding.%d.weight", k);
    if ((rc = get_w(m, dir, n, m->cp_vocab, H, &m->cp_embed[k], err, errlen))) goto fail;
    snprintf(n, sizeof n, "talker.code_predictor.lm_head.%d.weight", k);
    if ((rc = get_w(m, dir, n, m->cp_vocab, Hc, &m->cp_head[k], err, errlen))) goto fail;
  }
  snprintf(m->describe, sizeof m->describe,
           "qwen3_tts: talker %d layers, hidden %d, codec vocab %d; predictor %d layers, hidden %d; %d speakers",
           tcfg.n_layers, H, tcfg.vocab, ccfg.n_layers, Hc, m->n_spk);
  *out = m;
  return 0;
fail:
  tts_qwen3_free(m);
  return rc;
}

int tts_qwen3_vocab(const tts_qwen3 *m) {
  return m->talker->cfg.vocab;
}

void tts_qwen3_backend_shape(const tts_qwen3 *m, int n_ctx, ops_model_shape *out) {
  ops_model_shape c;
  model_shape_get(m->talker, n_ctx, out);
  model_shape_get(m->cp, NG + 1, &c);
  int64_t cols = m->text_hidden;
  if (cols < out->max_cols) cols = out->max_cols;
  if (cols < c.max_cols) cols = c.max_cols;
  out->max_cols = cols;
  if (c.n_heads > out->n_heads) out->n_heads = c.n_heads;
  for (int i = 0; i < c.n_layers; i++) {
    ops_layer_shape *l = &out->layers[i];
    if (i >= out->n_layers) *l = c.layers[i];
    if (c.layers[i].n_kv_heads > l->n_kv_heads) l->n_kv_heads = c.layers[i].n_kv_heads;
    if (c.layers[i].head_dim > l->head_dim) l->head_dim = c.layers[i].head_dim;
  }
  if (c.n_layers > out->n_layers) out->n_layers = c.n_layers;
}

/* ---- state ---- */

void tts_qwen3_state_free(tts_qwen3_state *s) {
  if (!s) return;
  fwd_state_free(s->ts);
  fwd_state_free(s->cs);
  void *dev[] = {s->d_ids, s->d_te, s->d_t1, s->d_ones, s->d_out, s->d_x, s->d_y};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
    if (dev[i]) s->be->free(s->be, dev[i]);
  void *host[] = {s->rows, s->logits,  s->hidden, s->tmp, s->tts_rows, s->cp_rows, s->cp_hidden, s->cp_logits,
                  s->probs, s->tok,     s->seqv,  s->pos, s->idx, s->rowidx, s->hist, s->flags};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
  free(s);
}

int tts_qwen3_state_create(tts_qwen3_state **out, const tts_qwen3 *m, ops_backend *be, int n_ctx, char *err,
                           size_t errlen) {
  *out = NULL;
  if (n_ctx < 16 || n_ctx > 1 << 20) return anna_err(err, errlen, ANNA_EINVAL, "n_ctx %d out of range 16..2^20", n_ctx);
  tts_qwen3_state *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  s->m = m, s->be = be, s->n_ctx = n_ctx;
  const int64_t N = n_ctx, H = m->talker->cfg.hidden, Hc = m->cp->cfg.hidden, TH = m->text_hidden;
  const int64_t V = m->talker->cfg.vocab, Vc = m->cp_vocab, Vmax = V > Vc ? V : Vc;
  const fwd_state_options fo = {0};
  int rc;
  if ((rc = fwd_state_create(&s->ts, m->talker, be, 1, n_ctx, n_ctx, &fo, err, errlen)) ||
      (rc = fwd_state_create(&s->cs, m->cp, be, 1, NG + 1, 2, &fo, err, errlen)))
    goto fail;
  s->d_ids = be->alloc(be, (size_t)N * sizeof(int32_t));
  s->d_te = be->alloc(be, (size_t)(N * TH) * sizeof(float));
  s->d_t1 = be->alloc(be, (size_t)(N * TH) * sizeof(float));
  s->d_ones = be->alloc(be, (size_t)(N * TH) * sizeof(float));
  s->d_out = be->alloc(be, (size_t)(N * H) * sizeof(float));
  s->d_x = be->alloc(be, (size_t)(2 * H) * sizeof(float));
  s->d_y = be->alloc(be, (size_t)(2 * (H > Vmax ? H : Vmax)) * sizeof(float));
  s->rows = malloc((size_t)(N * H) * sizeof(float));
  s->logits = malloc((size_t)(N * V) * sizeof(float));
  s->hidden = malloc((size_t)(N * H) * sizeof(float));
  s->tmp = malloc((size_t)H * sizeof(float));
  s->tts_rows = malloc((size_t)(3 * H) * sizeof(float));
  s->rowidx = malloc((size_t)N * sizeof(int32_t));
  s->cp_rows = malloc((size_t)(2 * (H > Hc ? H : Hc)) * sizeof(float));
  s->cp_hidden = malloc((size_t)(2 * Hc) * sizeof(float));
  s->cp_logits = malloc((size_t)Vc * sizeof(float));
  s->probs = malloc((size_t)Vmax * sizeof(float));
  s->tok = calloc((size_t)N, sizeof(int32_t));
  s->seqv = calloc((size_t)N, sizeof(int32_t));
  s->pos = malloc((size_t)N * sizeof(int32_t));
  s->idx = malloc((size_t)Vmax * sizeof(int32_t));
  s->hist = malloc((size_t)N * sizeof(int32_t));
  s->flags = malloc((size_t)N);
  if (!s->d_ids || !s->d_te || !s->d_t1 || !s->d_ones || !s->d_out || !s->d_x || !s->d_y ||
      !s->rows || !s->logits || !s->hidden || !s->tmp || !s->tts_rows || !s->rowidx ||
      !s->cp_rows || !s->cp_hidden || !s->cp_logits || !s->probs || !s->tok || !s->seqv || !s->pos || !s->idx ||
      !s->hist || !s->flags) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory (tts state for %d positions)", n_ctx);
    goto fail;
  }
  {
    /* the SiLU of the text projection is act_mul(gate, ones) */
    float *ones = malloc((size_t)(N * TH) * sizeof(float));
    if (!ones) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      goto fail;
    }
    for (int64_t i = 0; i < N * TH; i++) ones[i] = 1.0f;
    be->upload(be, s->d_ones, ones, (size_t)(N * TH) * sizeof(float));
    free(ones);
  }
  *out = s;
  return 0;
fail:
  tts_qwen3_state_free(s);
  return rc;
}

/* ---- building blocks ---- */

/* host out[n, H] = T(ids) */
static void text_rows(tts_qwen3_state *s, const int32_t *ids, int64_t n, float *out) {
  const tts_qwen3 *m = s->m;
  ops_backend *be = s->be;
  const int TH = m->text_hidden, H = m->talker->cfg.hidden;
  be->upload(be, s->d_ids, ids, (size_t)n * sizeof(int32_t));
  be->embed(be, s->d_te, &m->text_embed, s->d_ids, n, 1.0f);
  /* biases are model vectors (host memory; a device backend mirrors them by address) */
  be->matmul(be, s->d_t1, s->d_te, n, &m->fc1, m->fc1_b);
  be->act_mul(be, s->d_t1, s->d_t1, s->d_ones, n, TH, TH, TH, ACT_KIND_SILU);
  be->matmul(be, s->d_out, s->d_t1, n, &m->fc2, m->fc2_b);
  be->download(be, out, s->d_out, (size_t)(n * H) * sizeof(float));
}

/* host out[cols] = table[id] */
static void table_row(tts_qwen3_state *s, const ops_weight *table, int32_t id, float *out) {
  ops_backend *be = s->be;
  be->upload(be, s->d_ids, &id, sizeof id);
  be->embed(be, s->d_x, table, s->d_ids, 1, 1.0f);
  be->download(be, out, s->d_x, (size_t)table->cols * sizeof(float));
}

static void add_row(float *y, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* host out[n, Hc] = small_to_mtp_projection(in[n, H]) (a copy when the widths are equal) */
static void mtp_rows(tts_qwen3_state *s, const float *in, int64_t n, float *out) {
  const tts_qwen3 *m = s->m;
  const int64_t H = m->talker->cfg.hidden, Hc = m->cp->cfg.hidden;
  if (!m->has_mtp) {
    memmove(out, in, (size_t)(n * H) * sizeof(float));
    return;
  }
  s->be->upload(s->be, s->d_x, in, (size_t)(n * H) * sizeof(float));
  s->be->matmul(s->be, s->d_y, s->d_x, n, &m->mtp, m->mtp_b);
  s->be->download(s->be, out, s->d_y, (size_t)(n * Hc) * sizeof(float));
}

static uint64_t rng_next(uint64_t *x) { /* splitmix64 */
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* HF order: the logits processors were applied by the caller; then temperature, top-k,
 * top-p (keep the smallest set whose probability reaches top_p), softmax, draw. */
static int32_t pick(tts_qwen3_state *s, float *lg, int V, const tts_sampling *sp, int greedy) {
  int32_t best = 0;
  for (int i = 1; i < V; i++)
    if (lg[i] > lg[best]) best = i;
  if (greedy || !sp->do_sample) return best;
  const float t = sp->temperature > 0 ? sp->temperature : 1.0f;
  /* top-k: one pass keeping a sorted list of the best k (ties: the lower id first, as a
   * stable descending sort would) */
  int k = sp->top_k > 0 && sp->top_k < V ? sp->top_k : V;
  int32_t *idx = s->idx;
  int have = 0;
  for (int i = 0; i < V; i++) {
    if (lg[i] == -INFINITY) continue;
    if (have == k && !(lg[i] > lg[idx[k - 1]])) continue;
    int j = have < k ? have++ : k - 1;
    while (j > 0 && lg[idx[j - 1]] < lg[i]) {
      idx[j] = idx[j - 1];
      j--;
    }
    idx[j] = i;
  }
  if (have == 0) return best;
  k = have;
  double sum = 0;
  float *p = s->probs;
  const float mx = lg[idx[0]] / t;
  for (int j = 0; j < k; j++) sum += (p[j] = expf(lg[idx[j]] / t - mx));
  int keep = k;
  if (sp->top_p < 1.0f) {
    double c = 0;
    for (int j = 0; j < k; j++) {
      c += p[j] / sum;
      if (c >= sp->top_p) {
        keep = j + 1;
        break;
      }
    }
    sum = 0;
    for (int j = 0; j < keep; j++) sum += p[j];
  }
  double u = (double)(rng_next(&s->rng) >> 11) * (1.0 / 9007199254740992.0) * sum;
  for (int j = 0; j < keep; j++) {
    u -= p[j];
    if (u < 0) return idx[j];
  }
  return idx[keep - 1];
}

/* ---- request ---- */

typedef struct prompt {
  int codec[8], n_codec; /* codec prefix incl. the speaker and [pad, bos] */
  int body, n_body;      /* body = ids[3 .. 3 + n_body) */
  int n_instruct;        /* instruction rows before the role */
} prompt;

static int plan(const tts_qwen3 *m, const tts_qwen3_request *rq, prompt *p, char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  if (!rq->ids || rq->n_ids < 9)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "empty text: the ids must be <|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n "
                    "with a non-empty text (%d ids)",
                    rq->n_ids);
  const int n = rq->n_ids;
  if (rq->ids[0] != m->im_start || rq->ids[n - 5] != m->im_end || rq->ids[n - 3] != m->im_start)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "the ids are not <|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n");
  for (int i = 0; i < n; i++)
    if (rq->ids[i] < 0 || rq->ids[i] >= m->text_vocab)
      return anna_err(err, errlen, ANNA_EINVAL, "text id %d at %d is outside the text vocabulary %d", rq->ids[i], i,
                      m->text_vocab);
  if (rq->max_frames < 1) return anna_err(err, errlen, ANNA_EINVAL, "max_frames %d must be >= 1", rq->max_frames);
  if (rq->n_instruct_ids > 0) {
    if (m->no_instruct)
      return anna_err(err, errlen, ANNA_EINVAL,
                      m->base ? "instructions: a Base (voice clone) checkpoint takes none (qwen-tts passes none)"
                              : "instructions: this 0.6B CustomVoice checkpoint takes none (qwen-tts drops them); use "
                                "a 1.7B CustomVoice or a VoiceDesign checkpoint");
    if (!rq->instruct_ids) return anna_err(err, errlen, ANNA_EINVAL, "instruction ids: NULL");
    for (int i = 0; i < rq->n_instruct_ids; i++)
      if (rq->instruct_ids[i] < 0 || rq->instruct_ids[i] >= m->text_vocab)
        return anna_err(err, errlen, ANNA_EINVAL, "instruction id %d at %d is outside the text vocabulary %d",
                        rq->instruct_ids[i], i, m->text_vocab);
    p->n_instruct = rq->n_instruct_ids;
  }
  if (rq->speaker_embed && rq->speaker && *rq->speaker)
    return anna_err(err, errlen, ANNA_EINVAL, "a preset voice and a cloned voice together");
  if (rq->speaker_embed && !m->base)
    return anna_err(err, errlen, ANNA_EINVAL, "a cloned voice needs a Base checkpoint (tts_model_type \"base\")");
  if (m->base && !rq->speaker_embed)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "a Base checkpoint speaks with a cloned voice: give a reference clip (it has no preset voices)");
  if (m->voice_design && rq->speaker && *rq->speaker)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "voice '%s': a VoiceDesign checkpoint has no preset voices (describe the voice in the "
                    "instructions)",
                    rq->speaker);
  const tts_name *spk = NULL;
  if (rq->speaker && *rq->speaker && !(spk = find_name(m->spk, m->n_spk, rq->speaker))) {
    char have[512] = "";
    for (int i = 0; i < m->n_spk; i++)
      snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", i ? ", " : "", m->spk[i].name);
    return anna_err(err, errlen, ANNA_EINVAL, "unknown speaker '%s' (have: %s)", rq->speaker, have);
  }
  const char *lang = rq->language && *rq->language ? rq->language : "auto";
  const tts_name *ln = NULL;
  const int is_auto = !strcasecmp(lang, "auto");
  if (!is_auto && !(ln = find_name(m->lang, m->n_lang, lang))) {
    char have[512] = "auto";
    for (int i = 0; i < m->n_lang; i++)
      if (!strstr(m->lang[i].name, "dialect"))
        snprintf(have + strlen(have), sizeof have - strlen(have), ", %s", m->lang[i].name);
    return anna_err(err, errlen, ANNA_EINVAL, "unknown language '%s' (have: %s)", lang, have);
  }
  /* a dialect speaker speaking Chinese (or auto) uses the dialect's language id */
  if (spk && spk->dialect && (is_auto || !strcasecmp(lang, "chinese"))) ln = find_name(m->lang, m->n_lang, spk->dialect);
  if (ln) {
    p->codec[p->n_codec++] = m->c_think;
    p->codec[p->n_codec++] = m->c_think_bos;
    p->codec[p->n_codec++] = ln->id;
  } else {
    p->codec[p->n_codec++] = m->c_nothink;
    p->codec[p->n_codec++] = m->c_think_bos;
  }
  p->codec[p->n_codec++] = m->c_think_eos;
  if (spk) p->codec[p->n_codec++] = spk->id;
  if (rq->speaker_embed) p->codec[p->n_codec++] = -1; /* the x-vector's row */
  p->codec[p->n_codec++] = m->c_pad;
  p->codec[p->n_codec++] = m->c_bos;
  p->body = 3;
  p->n_body = n - 8;
  return 0;
}

static int prefill_rows(const prompt *p) {
  return p->n_instruct + 3 + (p->n_codec - 1) + p->n_body + 2;
}

int tts_qwen3_prefill_len(const tts_qwen3 *m, const tts_qwen3_request *rq, char *err, size_t errlen) {
  prompt p;
  int rc = plan(m, rq, &p, err, errlen);
  return rc ? rc : prefill_rows(&p);
}

/* The talker over n rows of s->rows at positions pos0.., flagging every row; logits to
 * s->logits, hidden to s->hidden. */
static int talker_run(tts_qwen3_state *s, int64_t n, int32_t pos0, char *err, size_t errlen) {
  for (int64_t i = 0; i < n; i++) s->pos[i] = pos0 + (int32_t)i, s->flags[i] = 1, s->rowidx[i] = (int32_t)i;
  const anna_batch b = {(int32_t)n, s->tok, s->seqv, s->pos, s->flags};
  const fwd_mm mm = {.embd = s->rows, .embd_idx = s->rowidx, .n_embd = n, .hidden = s->hidden};
  return forward_batch_mm(s->m->talker, s->be, s->ts, &b, &mm, s->logits, NULL, err, errlen);
}

/* c0's logits processors (HF order: repetition penalty, suppress, min_new_tokens). */
static void talker_logits(const tts_qwen3 *m, tts_qwen3_state *s, float *lg, int n_hist, float penalty) {
  const int V = m->talker->cfg.vocab;
  for (int i = 0; i < n_hist && penalty != 1.0f; i++) {
    const int32_t t = s->hist[i];
    int seen = 0;
    for (int j = 0; j < i && !seen; j++) seen = s->hist[j] == t;
    if (!seen) lg[t] = lg[t] > 0 ? lg[t] / penalty : lg[t] * penalty;
  }
  for (int i = V - 1024 > 0 ? V - 1024 : 0; i < V; i++)
    if (i != m->c_eos) lg[i] = -INFINITY;
  if (n_hist < m->min_new) lg[m->c_eos] = -INFINITY;
}

/* c1..c15 of one frame from the talker's hidden h and c0. */
static int predict(tts_qwen3_state *s, const float *h, int32_t *frame, int greedy, char *err, size_t errlen) {
  const tts_qwen3 *m = s->m;
  const int64_t H = m->talker->cfg.hidden, Hc = m->cp->cfg.hidden;
  fwd_state_seq_reset(s->cs, 0);
  memcpy(s->cp_rows, h, (size_t)H * sizeof(float));
  table_row(s, &m->talker->embed, frame[0], s->cp_rows + H);
  mtp_rows(s, s->cp_rows, 2, s->cp_rows);
  for (int k = 1; k < NG; k++) {
    const int n = k == 1 ? 2 : 1;
    if (k > 1) {
      table_row(s, &m->cp_embed[k - 2], frame[k - 1], s->cp_rows);
      mtp_rows(s, s->cp_rows, 1, s->cp_rows);
    }
    const int32_t tok[2] = {0, 0}, seq[2] = {0, 0}, pos[2] = {k == 1 ? 0 : k, 1}, idx[2] = {0, 1};
    const int8_t fl[2] = {n == 1, 1};
    const anna_batch b = {n, tok, seq, pos, fl};
    const fwd_mm mm = {.embd = s->cp_rows, .embd_idx = idx, .n_embd = n, .hidden = s->cp_hidden};
    int rc = forward_batch_mm(m->cp, s->be, s->cs, &b, &mm, NULL, NULL, err, errlen);
    if (rc) return rc;
    s->be->upload(s->be, s->d_x, s->cp_hidden, (size_t)Hc * sizeof(float));
    s->be->matmul(s->be, s->d_y, s->d_x, 1, &m->cp_head[k - 1], NULL);
    s->be->download(s->be, s->cp_logits, s->d_y, (size_t)m->cp_vocab * sizeof(float));
    frame[k] = pick(s, s->cp_logits, m->cp_vocab, &m->sub, greedy);
  }
  return 0;
}

int tts_qwen3_generate(const tts_qwen3 *m, tts_qwen3_state *s, const tts_qwen3_request *rq, int32_t *codes,
                       int *n_frames, float *prefill_logits, char *err, size_t errlen) {
  *n_frames = 0;
  prompt p;
  int rc = plan(m, rq, &p, err, errlen);
  if (rc) return rc;
  const int P = prefill_rows(&p);
  const int64_t H = m->talker->cfg.hidden, V = m->talker->cfg.vocab;
  if (P + rq->max_frames > s->n_ctx)
    return anna_err(err, errlen, ANNA_ERANGE, "%d prefill rows + %d frames exceed the state's %d positions", P,
                    rq->max_frames, s->n_ctx);
  s->rng = rq->seed;
  if (s->be->bind) s->be->bind(s->be); /* a device backend: the text rows below run before any forward pass binds */
  fwd_state_seq_reset(s->ts, 0);
  /* prefill rows */
  const int32_t tts3[3] = {m->tts_pad, m->tts_bos, m->tts_eos};
  float *r = s->rows;
  if (p.n_instruct) { /* T(<|im_start|>user\n{instruct}<|im_end|>\n) first, text side only */
    text_rows(s, rq->instruct_ids, p.n_instruct, r);
    r += (int64_t)p.n_instruct * H;
  }
  text_rows(s, rq->ids, 3, r); /* role: text side only */
  r += 3 * H;
  text_rows(s, tts3, 3, s->tts_rows);
  const float *pad_row = s->tts_rows, *bos_row = s->tts_rows + H, *eos_row = s->tts_rows + 2 * H;
  for (int i = 0; i < p.n_codec - 1; i++, r += H) {
    if (p.codec[i] < 0)
      memcpy(r, rq->speaker_embed, (size_t)H * sizeof(float));
    else
      table_row(s, &m->talker->embed, p.codec[i], r);
    add_row(r, i < p.n_codec - 2 ? pad_row : bos_row, H);
  }
  text_rows(s, rq->ids + p.body, p.n_body, r);
  table_row(s, &m->talker->embed, m->c_pad, s->tmp);
  for (int i = 0; i < p.n_body; i++, r += H) add_row(r, s->tmp, H);
  memcpy(r, eos_row, (size_t)H * sizeof(float)); /* tts_eos + pad */
  add_row(r, s->tmp, H);
  r += H;
  table_row(s, &m->talker->embed, m->c_bos, r); /* tts_pad + bos */
  add_row(r, pad_row, H);
  if ((rc = talker_run(s, P, 0, err, errlen))) return rc;
  if (prefill_logits) memcpy(prefill_logits, s->logits, (size_t)(P * V) * sizeof(float));
  float *h = s->hidden + (int64_t)(P - 1) * H;
  float *lg = s->logits + (int64_t)(P - 1) * V;
  for (int f = 0; f < rq->max_frames; f++) {
    talker_logits(m, s, lg, f, m->talk.penalty);
    int32_t *frame = codes + (int64_t)f * NG;
    frame[0] = pick(s, lg, (int)V, &m->talk, rq->greedy);
    if (frame[0] == m->c_eos) break;
    s->hist[f] = frame[0];
    if ((rc = predict(s, h, frame, rq->greedy, err, errlen))) return rc;
    /* a device's failures are sticky and silent until asked: never hand on a frame made after one */
    if (s->be->error && (rc = s->be->error(s->be, err, errlen))) return rc;
    *n_frames = f + 1;
    if (rq->on_frame && rq->on_frame(rq->user, frame, f)) break;
    if (f + 1 == rq->max_frames) break;
    /* next input: the frame's code embeddings + tts_pad */
    table_row(s, &m->talker->embed, frame[0], s->rows);
    for (int k = 1; k < NG; k++) {
      table_row(s, &m->cp_embed[k - 1], frame[k], s->tmp);
      add_row(s->rows, s->tmp, H);
    }
    add_row(s->rows, pad_row, H);
    if ((rc = talker_run(s, 1, P + f, err, errlen))) return rc;
    h = s->hidden;
    lg = s->logits;
  }
  return 0;
}

int tts_qwen3_is_base(const tts_qwen3 *m) {
  return m->base;
}

int tts_qwen3_takes_instructions(const tts_qwen3 *m) {
  return !m->no_instruct;
}

const char *tts_qwen3_speaker(const tts_qwen3 *m, int i) {
  return i >= 0 && i < m->n_spk ? m->spk[i].name : NULL;
}

/* ---- kind table ---- */

static int tq_probe(const model_source *src) {
  return !src->is_gguf && !strcmp(src->model_type, "qwen3_tts");
}

static int tq_load(void **impl, const model_source *src, const model_load_params *p, char *err, size_t errlen) {
  (void)p;
  return tts_qwen3_load((tts_qwen3 **)impl, src->path, err, errlen);
}

static void tq_free(void *impl) {
  tts_qwen3_free(impl);
}

static void tq_describe(const void *impl, model_desc *out) {
  const tts_qwen3 *m = impl;
  *out = (model_desc){.text = m->describe, .vocab = m->talker->cfg.vocab, .n_layers = m->talker->cfg.n_layers};
}

static void tq_backend_shape(const void *impl, int n_ctx, ops_model_shape *out) {
  tts_qwen3_backend_shape(impl, n_ctx, out);
}

static int tq_state_create(void **state, const void *impl, ops_backend *be, const model_state_params *p, char *err,
                           size_t errlen) {
  if (p->n_seq > 1) return anna_err(err, errlen, ANNA_EUNSUPPORTED, "qwen3_tts: one stream per state (n_seq %d)", p->n_seq);
  return tts_qwen3_state_create((tts_qwen3_state **)state, impl, be, p->n_ctx > 0 ? p->n_ctx : 4096, err, errlen);
}

static void tq_state_free(void *state) {
  tts_qwen3_state_free(state);
}

static int tq_run(const void *impl, void *state, ops_backend *be, const model_input *in, const model_output *out,
                  char *err, size_t errlen) {
  (void)impl, (void)state, (void)be, (void)in, (void)out;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "qwen3_tts: generation goes through tts_qwen3_generate (the kind io set has no codes output yet)");
}

const model_kind tts_qwen3_kind = {
    .name = "qwen3_tts",
    .inputs = MODEL_IO_BIT(MODEL_IO_TOKENS),
    .outputs = MODEL_IO_BIT(MODEL_IO_CODES),
    .probe = tq_probe,
    .load = tq_load,
    .free = tq_free,
    .describe = tq_describe,
    .backend_shape = tq_backend_shape,
    .state_create = tq_state_create,
    .state_free = tq_state_free,
    .run = tq_run,
};
