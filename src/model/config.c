/* config.c: Hugging Face config.json -> model_config, one function per family. Defaults
 * are those of transformers' config classes, so a config that omits a field means what it
 * means there. */
#include "model/config.h"

#include "base/error.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
  const char *path;
  char *err;
  size_t errlen;
} pctx;

static json_t *jget(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_null(v) ? NULL : v;
}

static int get_int(pctx *p, json_t *o, const char *k, int def, int *out) {
  json_t *v = jget(o, k);
  if (!v) {
    *out = def;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30))
    return anna_err(p->err, p->errlen, ANNA_EFORMAT, "%s: field '%s' must be a non-negative integer",
                    p->path, k);
  *out = (int)json_integer_value(v);
  return 0;
}

static int req_int(pctx *p, json_t *o, const char *k, int *out) {
  if (!jget(o, k))
    return anna_err(p->err, p->errlen, ANNA_EFORMAT, "%s: missing field '%s'", p->path, k);
  return get_int(p, o, k, 0, out);
}

static int get_num(pctx *p, json_t *o, const char *k, double def, double *out) {
  json_t *v = jget(o, k);
  if (!v) {
    *out = def;
    return 0;
  }
  if (!json_is_number(v))
    return anna_err(p->err, p->errlen, ANNA_EFORMAT, "%s: field '%s' must be a number", p->path, k);
  *out = json_number_value(v);
  return 0;
}

static int get_bool(json_t *o, const char *k, int def) {
  json_t *v = jget(o, k);
  return v ? json_is_true(v) : def;
}

/* How a family's config class treats a legacy `rope_scaling` beside `rope_parameters`
 * (transformers 5, RotaryEmbeddingConfigMixin.convert_rope_params_to_dict and the overrides). */
enum rope_legacy {
  ROPE_LEGACY_REPLACE = 0, /* base mixin: `rope_scaling or rope_parameters`, the legacy dict wins whole */
  ROPE_LEGACY_MERGE,       /* Gemma3: rope_parameters["full_attention"].update(rope_scaling) */
  ROPE_LEGACY_NONE,        /* layer types the legacy dict never reaches (Gemma3 sliding) */
};

/* The dict a layer's rope keys come from: `over` first (the legacy dict when it merges or
 * replaces), then `base` (rope_parameters, or its entry for the layer type). */
typedef struct rope_src {
  json_t *over, *base;
} rope_src;

static json_t *rget(const rope_src *s, const char *k) {
  json_t *v = s->over ? jget(s->over, k) : NULL;
  return v ? v : s->base ? jget(s->base, k) : NULL;
}

static int rnum(pctx *p, const rope_src *s, const char *k, double def, double *out) {
  json_t *v = rget(s, k);
  if (!v) {
    *out = def;
    return 0;
  }
  if (!json_is_number(v))
    return anna_err(p->err, p->errlen, ANNA_EFORMAT, "%s: rope field '%s' must be a number", p->path, k);
  *out = json_number_value(v);
  return 0;
}

/* YaRN (transformers modeling_rope_utils._compute_yarn_parameters): factor (None: the
 * max_position_embeddings / original ratio), attention_factor (None: from mscale and
 * mscale_all_dim when both are set, else 0.1 ln(factor) + 1), beta_fast / beta_slow (`or`
 * defaults 32 / 1, so 0 means the default too), truncate (read from the top-level
 * rope_parameters: a per-layer-type dict never has it, so true). */
static int parse_yarn(pctx *p, json_t *root, const rope_src *s, int nested, layer_config *l) {
  double max_pos = 0, mscale = 0, mscale_all = 0;
  if (get_num(p, root, "max_position_embeddings", 0, &max_pos) || rnum(p, s, "factor", 0, &l->rope_factor) ||
      rnum(p, s, "mscale", 0, &mscale) || rnum(p, s, "mscale_all_dim", 0, &mscale_all) ||
      rnum(p, s, "beta_fast", 0, &l->rope_beta_fast) || rnum(p, s, "beta_slow", 0, &l->rope_beta_slow) ||
      rnum(p, s, "attention_factor", 0, &l->rope_attn_factor))
    return ANNA_EFORMAT;
  if (!rget(s, "factor") && l->rope_orig_max_pos > 0) l->rope_factor = max_pos / l->rope_orig_max_pos;
  if (!(l->rope_factor > 0) || !(l->rope_orig_max_pos > 0) || !(l->rope_theta > 1))
    return anna_err(p->err, p->errlen, ANNA_EFORMAT,
                    "%s: rope_type 'yarn' needs a positive factor and original_max_position_embeddings and a "
                    "rope_theta > 1 (have %g, %g, %g)",
                    p->path, l->rope_factor, l->rope_orig_max_pos, l->rope_theta);
  if (!l->rope_beta_fast) l->rope_beta_fast = 32;
  if (!l->rope_beta_slow) l->rope_beta_slow = 1;
  l->rope_truncate = 1;
  json_t *tr = nested ? NULL : rget(s, "truncate");
  if (tr) {
    if (!json_is_boolean(tr))
      return anna_err(p->err, p->errlen, ANNA_EFORMAT, "%s: rope field 'truncate' must be true or false", p->path);
    l->rope_truncate = json_is_true(tr);
  }
  if (!rget(s, "attention_factor")) {
    const double f = l->rope_factor;
#define YARN_MSCALE(m) (f <= 1 ? 1.0 : 0.1 * (m) * log(f) + 1.0)
    l->rope_attn_factor = mscale && mscale_all ? YARN_MSCALE(mscale) / YARN_MSCALE(mscale_all) : YARN_MSCALE(1.0);
#undef YARN_MSCALE
  }
  return 0;
}

/* Rope parameters: transformers 5 `rope_parameters` (flat, or keyed by layer type), the older
 * top-level `rope_theta` + `rope_scaling`, or both, resolved as the family's config class does
 * (enum rope_legacy). rope_theta: the dict's, else the top-level theta_key, else def_theta.
 * original_max_position_embeddings (llama3, yarn): like standardize_rope_params, a top-level
 * field wins for a flat dict, then the dict's, then max_position_embeddings. An unknown type,
 * or one whose frequencies depend on the current sequence length, is ANNA_EUNSUPPORTED. */
static int parse_rope(pctx *p, json_t *root, const char *layer_type, const char *theta_key, double def_theta,
                      int legacy, layer_config *l, double *partial) {
  json_t *rp = jget(root, "rope_parameters");
  int nested = 0;
  if (rp && layer_type && jget(rp, layer_type)) {
    rp = jget(rp, layer_type);
    nested = 1;
  }
  json_t *rs = jget(root, "rope_scaling");
  if (rs && (!json_is_object(rs) || json_object_size(rs) == 0)) rs = NULL; /* `rope_scaling or ...` */
  rope_src s = {NULL, rp};
  if (rs && legacy == ROPE_LEGACY_REPLACE) s = (rope_src){rs, NULL};
  else if (rs && legacy == ROPE_LEGACY_MERGE) s = (rope_src){rs, rp}, nested = 1;
  double theta = def_theta;
  if (theta_key && get_num(p, root, theta_key, def_theta, &theta)) return ANNA_EFORMAT;
  if (rnum(p, &s, "rope_theta", theta, &theta)) return ANNA_EFORMAT;
  l->rope_theta = theta;
  l->rope_type = ROPE_KIND_DEFAULT;
  l->rope_factor = 1.0;
  l->rope_attn_factor = 1.0;
  if (rget(&s, "partial_rotary_factor") && partial) {
    if (rnum(p, &s, "partial_rotary_factor", 1.0, partial)) return ANNA_EFORMAT;
  }
  const char *type = "default";
  json_t *t = rget(&s, "rope_type");
  if (!t) t = rget(&s, "type");
  if (t && json_is_string(t)) type = json_string_value(t);
  else if (t) return anna_err(p->err, p->errlen, ANNA_EFORMAT, "%s: rope_type must be a string", p->path);
  if (!strcmp(type, "default")) return 0;
  if (!strcmp(type, "llama3") || !strcmp(type, "yarn")) {
    double max_pos = 0;
    if (get_num(p, root, "max_position_embeddings", 0, &max_pos) ||
        rnum(p, &s, "original_max_position_embeddings", max_pos, &l->rope_orig_max_pos))
      return ANNA_EFORMAT;
    if (!nested && jget(root, "original_max_position_embeddings") &&
        get_num(p, root, "original_max_position_embeddings", 0, &l->rope_orig_max_pos))
      return ANNA_EFORMAT;
  }
  if (!strcmp(type, "yarn")) {
    l->rope_type = ROPE_KIND_YARN;
    return parse_yarn(p, root, &s, nested, l);
  }
  if (rnum(p, &s, "factor", 1.0, &l->rope_factor)) return ANNA_EFORMAT;
  if (!strcmp(type, "linear")) {
    l->rope_type = ROPE_KIND_LINEAR;
  } else if (!strcmp(type, "llama3")) {
    l->rope_type = ROPE_KIND_LLAMA3;
    if (rnum(p, &s, "low_freq_factor", 1.0, &l->rope_low_freq_factor) ||
        rnum(p, &s, "high_freq_factor", 4.0, &l->rope_high_freq_factor))
      return ANNA_EFORMAT;
    if (!(l->rope_orig_max_pos > 0))
      return anna_err(p->err, p->errlen, ANNA_EFORMAT,
                      "%s: rope_type 'llama3' needs original_max_position_embeddings (or max_position_embeddings)",
                      p->path);
  } else if (!strcmp(type, "proportional")) {
    l->rope_type = ROPE_KIND_PROPORTIONAL;
  } else if (!strcmp(type, "dynamic") || !strcmp(type, "longrope")) {
    return anna_err(p->err, p->errlen, ANNA_EUNSUPPORTED,
                    "%s: rope_type '%s' is not supported: transformers recomputes its frequencies from the "
                    "length of each forward call, which a per-position table cannot reproduce",
                    p->path, type);
  } else {
    return anna_err(p->err, p->errlen, ANNA_EUNSUPPORTED,
                    "%s: rope_type '%s' is not supported (have: default, linear, llama3, yarn, proportional)",
                    p->path, type);
  }
  return 0;
}

/* Standard rope over the first rot dims (rot = partial * head_dim). */
static void rope_standard(layer_config *l, double partial) {
  int rot = (int)(partial * l->head_dim);
  rot &= ~1;
  l->rope_dims = rot;
  l->rope_n_freq = rot / 2;
  l->rope_freq_denom = rot;
}

int config_link_shared_kv(model_config *c, char *err, size_t errlen) {
  const int first_shared = c->n_layers - c->n_kv_shared;
  if (c->n_kv_shared <= 0) return 0;
  for (int i = first_shared; i < c->n_layers; i++) {
    layer_config *l = &c->layers[i];
    l->kv_source = -1;
    for (int j = first_shared - 1; j >= 0; j--)
      if (c->layers[j].kind == l->kind) {
        l->kv_source = j;
        break;
      }
    if (l->kv_source < 0)
      return anna_err(err, errlen, ANNA_EFORMAT, "layer %d shares KV but no earlier layer has its type", i);
    if (c->layers[l->kv_source].head_dim != l->head_dim)
      return anna_err(err, errlen, ANNA_EFORMAT, "layer %d shares KV with a layer of another head_dim", i);
    l->n_kv_heads = c->layers[l->kv_source].n_kv_heads;
  }
  return 0;
}

/* YaRN's correction range [*low, *high] in frequency index (transformers
 * _compute_yarn_parameters.find_correction_range, in double like Python's math), with the
 * 0.001 widening linear_ramp_factor applies to an empty range. */
static void yarn_range(const layer_config *l, double *low, double *high) {
  const double dim = l->rope_freq_denom, base = l->rope_theta, orig = l->rope_orig_max_pos;
  double lo = dim * log(orig / (l->rope_beta_fast * 2 * M_PI)) / (2 * log(base));
  double hi = dim * log(orig / (l->rope_beta_slow * 2 * M_PI)) / (2 * log(base));
  if (l->rope_truncate) lo = floor(lo), hi = ceil(hi);
  if (lo < 0) lo = 0;
  if (hi > dim - 1) hi = dim - 1;
  if (lo == hi) hi += 0.001;
  *low = lo;
  *high = hi;
}

void config_rope_inv_freq(const layer_config *l, float *inv_freq) {
  int half = l->rope_dims / 2;
  double ylo = 0, yhi = 1;
  if (l->rope_type == ROPE_KIND_YARN) yarn_range(l, &ylo, &yhi);
  for (int i = 0; i < half; i++) {
    if (i >= l->rope_n_freq) {
      inv_freq[i] = 0.0f;
      continue;
    }
    /* Computed in float like transformers: base ** (arange(0, dim, 2).float() / dim). */
    float e = (float)(2 * i) / (float)l->rope_freq_denom;
    float f = 1.0f / powf((float)l->rope_theta, e);
    if (l->rope_type == ROPE_KIND_LINEAR) {
      f /= (float)l->rope_factor;
    } else if (l->rope_type == ROPE_KIND_YARN) {
      /* In float like torch: interpolation 1/(factor*pos), extrapolation 1/pos, blended by
       * 1 - clamp((i - low) / (high - low), 0, 1). */
      const float pos = powf((float)l->rope_theta, e);
      const float inter = 1.0f / ((float)l->rope_factor * pos);
      float ramp = ((float)i - (float)ylo) / (float)(yhi - ylo);
      ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
      const float extra_w = 1.0f - ramp;
      f = inter * (1.0f - extra_w) + f * extra_w;
    } else if (l->rope_type == ROPE_KIND_LLAMA3) {
      double low_wl = l->rope_orig_max_pos / l->rope_low_freq_factor;
      double high_wl = l->rope_orig_max_pos / l->rope_high_freq_factor;
      double wl = 2 * M_PI / f;
      if (wl > low_wl) {
        f = (float)(f / l->rope_factor);
      } else if (wl >= high_wl) {
        double smooth = (l->rope_orig_max_pos / wl - l->rope_low_freq_factor) /
                        (l->rope_high_freq_factor - l->rope_low_freq_factor);
        f = (float)((1 - smooth) * f / l->rope_factor + smooth * f);
      }
    }
    inv_freq[i] = f;
  }
}

const char *config_rope_name(int rope_type) {
  switch (rope_type) {
  case ROPE_KIND_DEFAULT: return "default";
  case ROPE_KIND_LINEAR: return "linear";
  case ROPE_KIND_LLAMA3: return "llama3";
  case ROPE_KIND_PROPORTIONAL: return "proportional";
  case ROPE_KIND_YARN: return "yarn";
  }
  return "?";
}

static double attn_factor(const layer_config *l) { return l->rope_attn_factor ? l->rope_attn_factor : 1.0; }

int config_rope_fold(model_config *c, const char *path, char *err, size_t errlen) {
  double f0 = 1.0;
  int any = 0, uniform = 1, full = 1, first = 1;
  for (int i = 0; i < c->n_layers; i++) {
    layer_config *l = &c->layers[i];
    l->rope_fold = ROPE_FOLD_NONE;
    if (l->kind == LAYER_KIND_GDN) continue;
    const double f = attn_factor(l);
    if (f != 1.0) any = 1;
    if (first) f0 = f, first = 0;
    else if (f != f0) uniform = 0;
    if (l->rope_dims != l->head_dim) full = 0;
  }
  if (!any) return 0;
  if (uniform && full) {
    /* Both rotated vectors carry the factor: their dot product carries its square. */
    c->attn_scale = (float)((double)c->attn_scale * f0 * f0);
    for (int i = 0; i < c->n_layers; i++)
      if (c->layers[i].kind != LAYER_KIND_GDN) c->layers[i].rope_fold = ROPE_FOLD_SCALE;
    return 0;
  }
  for (int i = 0; i < c->n_layers; i++) {
    layer_config *l = &c->layers[i];
    if (l->kind == LAYER_KIND_GDN || attn_factor(l) == 1.0) continue;
    if (!c->qk_norm)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "%s: rope_type '%s' attention factor %g on layer %d cannot be applied: %s and the model has "
                      "no q/k norm weights to fold it into",
                      path, config_rope_name(l->rope_type), attn_factor(l), i,
                      full ? "the layers' factors differ" : "rotary dims are partial");
    l->rope_fold = ROPE_FOLD_NORM;
  }
  return 0;
}

void config_rope_fold_norm(const model_config *c, const layer_config *l, float *w) {
  if (!w || l->rope_fold != ROPE_FOLD_NORM) return;
  /* Scaling both elements of a rotation pair commutes with the rotation, so the factor can
   * ride on the normed q / k before rope: x*(1+w) -> x*(1+w)*f, x*w -> x*w*f. */
  const double f = attn_factor(l);
  for (int i = 0; i < l->rope_dims; i++)
    w[i] = c->norm == NORM_KIND_1PW ? (float)((1.0 + w[i]) * f - 1.0) : (float)(w[i] * f);
}

static int layer_types(pctx *p, json_t *t, model_config *c, const char *first_kind_default) {
  json_t *lt = jget(t, "layer_types");
  if (!lt) return 1; /* caller derives */
  if (!json_is_array(lt) || (int)json_array_size(lt) != c->n_layers)
    return anna_err(p->err, p->errlen, ANNA_EFORMAT, "%s: layer_types must list %d layers", p->path,
                    c->n_layers);
  (void)first_kind_default;
  for (int i = 0; i < c->n_layers; i++) {
    const char *s = json_string_value(json_array_get(lt, i));
    if (!s) return anna_err(p->err, p->errlen, ANNA_EFORMAT, "%s: layer_types[%d] not a string", p->path, i);
    if (!strcmp(s, "full_attention")) c->layers[i].kind = LAYER_KIND_ATTN;
    else if (!strcmp(s, "sliding_attention")) c->layers[i].kind = LAYER_KIND_SLIDING;
    else if (!strcmp(s, "linear_attention")) c->layers[i].kind = LAYER_KIND_GDN;
    else
      return anna_err(p->err, p->errlen, ANNA_EUNSUPPORTED, "%s: layer type '%s' is not supported",
                      p->path, s);
  }
  return 0;
}

static int parse_common(pctx *p, json_t *t, model_config *c) {
  int rc;
  if ((rc = req_int(p, t, "hidden_size", &c->hidden)) || (rc = req_int(p, t, "num_hidden_layers", &c->n_layers)) ||
      (rc = req_int(p, t, "vocab_size", &c->vocab)) ||
      (rc = req_int(p, t, "num_attention_heads", &c->n_heads)) ||
      (rc = get_int(p, t, "num_key_value_heads", c->n_heads, &c->n_kv_heads)) ||
      (rc = get_int(p, t, "intermediate_size", 0, &c->ffn_dim)))
    return rc;
  if (c->n_layers < 1 || c->n_layers > CONFIG_MAX_LAYERS)
    return anna_err(p->err, p->errlen, ANNA_EFORMAT, "%s: num_hidden_layers %d out of range 1..%d",
                    p->path, c->n_layers, CONFIG_MAX_LAYERS);
  if (c->hidden < 1 || c->vocab < 1 || c->n_heads < 1 || c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads)
    return anna_err(p->err, p->errlen, ANNA_EFORMAT,
                    "%s: inconsistent sizes (hidden %d, vocab %d, heads %d, kv heads %d)", p->path,
                    c->hidden, c->vocab, c->n_heads, c->n_kv_heads);
  int hd = c->hidden / c->n_heads;
  if ((rc = get_int(p, t, "head_dim", hd, &c->head_dim))) return rc;
  if (c->head_dim < 2 || c->head_dim > 1024 || (c->head_dim & 1))
    return anna_err(p->err, p->errlen, ANNA_EFORMAT, "%s: head_dim %d out of range", p->path, c->head_dim);
  if ((rc = get_num(p, t, "rms_norm_eps", 1e-6, &c->eps))) return rc;
  c->tie_embeddings = get_bool(t, "tie_word_embeddings", 0);
  c->embed_scale = 1.0f;
  c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
  for (int i = 0; i < c->n_layers; i++) {
    layer_config *l = &c->layers[i];
    l->kind = LAYER_KIND_ATTN;
    l->head_dim = c->head_dim;
    l->n_kv_heads = c->n_kv_heads;
    l->kv_source = i;
    l->ffn_dim = c->ffn_dim;
  }
  return 0;
}

static int parse_classic(pctx *p, json_t *t, model_config *c) {
  int rc = parse_common(p, t, c);
  if (rc) return rc;
  c->norm = NORM_KIND_W;
  c->act = ACT_KIND_SILU;
  c->qk_norm = c->arch == MODEL_ARCH_QWEN3 || c->arch == MODEL_ARCH_QWEN3_MOE;
  c->attn_bias = c->arch == MODEL_ARCH_QWEN2 ? 1 : get_bool(t, "attention_bias", 0);
  rc = layer_types(p, t, c, "full_attention");
  if (rc < 0) return rc;
  int window = 0;
  if ((rc = get_int(p, t, "sliding_window", 0, &window))) return rc;
  if (rc == 0 && jget(t, "layer_types") == NULL && c->arch == MODEL_ARCH_QWEN2 &&
      get_bool(t, "use_sliding_window", 0)) {
    int mwl = 0;
    if ((rc = get_int(p, t, "max_window_layers", c->n_layers, &mwl))) return rc;
    for (int i = mwl; i < c->n_layers; i++) c->layers[i].kind = LAYER_KIND_SLIDING;
  }
  if (c->arch == MODEL_ARCH_QWEN3_MOE) {
    int step = 1;
    if ((rc = get_int(p, t, "num_experts", 0, &c->n_experts))) return rc;
    if (!c->n_experts && (rc = get_int(p, t, "num_local_experts", 0, &c->n_experts))) return rc;
    if ((rc = req_int(p, t, "num_experts_per_tok", &c->top_k)) ||
        (rc = req_int(p, t, "moe_intermediate_size", &c->expert_ffn)) ||
        (rc = get_int(p, t, "decoder_sparse_step", 1, &step)))
      return rc;
    c->norm_topk = get_bool(t, "norm_topk_prob", 1);
    json_t *mlp_only = jget(t, "mlp_only_layers");
    for (int i = 0; i < c->n_layers; i++) {
      int only = 0;
      for (size_t j = 0; mlp_only && j < json_array_size(mlp_only); j++)
        if (json_integer_value(json_array_get(mlp_only, j)) == i) only = 1;
      c->layers[i].is_moe = !only && c->n_experts > 0 && step > 0 && (i + 1) % step == 0;
      if (c->layers[i].is_moe) c->layers[i].ffn_dim = 0;
    }
  }
  for (int i = 0; i < c->n_layers; i++) {
    layer_config *l = &c->layers[i];
    double partial = 1.0;
    get_num(p, t, "partial_rotary_factor", 1.0, &partial);
    if ((rc = parse_rope(p, t, NULL, "rope_theta", 10000.0, ROPE_LEGACY_REPLACE, l, &partial))) return rc;
    rope_standard(l, partial);
    if (l->kind == LAYER_KIND_SLIDING) l->window = window;
  }
  return 0;
}

static int parse_qwen3_5(pctx *p, json_t *t, model_config *c) {
  int rc = parse_common(p, t, c);
  if (rc) return rc;
  c->norm = NORM_KIND_1PW;
  c->act = ACT_KIND_SILU;
  c->qk_norm = 1;
  c->attn_out_gate = 1;
  c->mrope_section[0] = 11, c->mrope_section[1] = 11, c->mrope_section[2] = 10;
  {
    json_t *rp = jget(t, "rope_parameters"), *ms = rp ? jget(rp, "mrope_section") : NULL;
    if (ms) {
      for (int i = 0; i < 3; i++) {
        const json_t *v = json_array_get(ms, (size_t)i);
        if (!json_is_array(ms) || json_array_size(ms) != 3 || !json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > 1024)
          return anna_err(p->err, p->errlen, ANNA_EFORMAT, "%s: rope_parameters.mrope_section must be 3 integers",
                          p->path);
        c->mrope_section[i] = (int)json_integer_value(v);
      }
    }
  }
  if ((rc = req_int(p, t, "linear_num_key_heads", &c->gdn_hk)) ||
      (rc = req_int(p, t, "linear_num_value_heads", &c->gdn_hv)) ||
      (rc = req_int(p, t, "linear_key_head_dim", &c->gdn_dk)) ||
      (rc = req_int(p, t, "linear_value_head_dim", &c->gdn_dv)) ||
      (rc = get_int(p, t, "linear_conv_kernel_dim", 4, &c->gdn_conv)))
    return rc;
  if (c->gdn_hk < 1 || c->gdn_hv < 1 || c->gdn_hv % c->gdn_hk || c->gdn_dk < 1 || c->gdn_dv < 1 ||
      c->gdn_conv < 1 || c->gdn_conv > 16)
    return anna_err(p->err, p->errlen, ANNA_EFORMAT,
                    "%s: inconsistent linear attention sizes (k heads %d, v heads %d, dk %d, dv %d, conv %d)",
                    p->path, c->gdn_hk, c->gdn_hv, c->gdn_dk, c->gdn_dv, c->gdn_conv);
  rc = layer_types(p, t, c, NULL);
  if (rc < 0) return rc;
  if (rc == 1) {
    int interval = 4;
    if ((rc = get_int(p, t, "full_attention_interval", 4, &interval))) return rc;
    if (interval < 1) interval = 1;
    for (int i = 0; i < c->n_layers; i++)
      c->layers[i].kind = (i + 1) % interval == 0 ? LAYER_KIND_ATTN : LAYER_KIND_GDN;
  }
  if (c->arch == MODEL_ARCH_QWEN3_5_MOE) {
    if ((rc = req_int(p, t, "num_experts", &c->n_experts)) ||
        (rc = req_int(p, t, "num_experts_per_tok", &c->top_k)) ||
        (rc = req_int(p, t, "moe_intermediate_size", &c->expert_ffn)) ||
        (rc = get_int(p, t, "shared_expert_intermediate_size", 0, &c->shared_ffn)))
      return rc;
    c->norm_topk = 1;
    for (int i = 0; i < c->n_layers; i++) {
      c->layers[i].is_moe = 1;
      c->layers[i].ffn_dim = 0;
    }
  }
  for (int i = 0; i < c->n_layers; i++) {
    layer_config *l = &c->layers[i];
    double partial = 0.25;
    get_num(p, t, "partial_rotary_factor", 0.25, &partial);
    if ((rc = parse_rope(p, t, NULL, "rope_theta", 10000.0, ROPE_LEGACY_REPLACE, l, &partial))) return rc;
    rope_standard(l, partial);
  }
  return 0;
}

static int parse_gemma(pctx *p, json_t *t, model_config *c) {
  int rc = parse_common(p, t, c);
  if (rc) return rc;
  const int g4 = c->arch == MODEL_ARCH_GEMMA4;
  c->norm = g4 ? NORM_KIND_W : NORM_KIND_1PW;
  c->act = ACT_KIND_GELU_TANH;
  c->qk_norm = 1;
  c->post_norms = 1;
  c->embed_scale = sqrtf((float)c->hidden);
  c->tie_embeddings = get_bool(t, "tie_word_embeddings", 1);
  double cap = 0;
  if ((rc = get_num(p, t, "final_logit_softcapping", 0, &cap))) return rc;
  c->final_softcap = (float)cap;
  if ((rc = get_num(p, t, "attn_logit_softcapping", 0, &cap))) return rc;
  c->attn_softcap = (float)cap;
  int window = 0;
  if ((rc = get_int(p, t, "sliding_window", 4096, &window))) return rc;
  rc = layer_types(p, t, c, NULL);
  if (rc < 0) return rc;
  if (rc == 1) {
    int pattern = 6;
    if ((rc = get_int(p, t, "sliding_window_pattern", 6, &pattern))) return rc;
    if (jget(t, "_sliding_window_pattern")) get_int(p, t, "_sliding_window_pattern", 6, &pattern);
    if (pattern < 1) pattern = 1;
    for (int i = 0; i < c->n_layers; i++)
      c->layers[i].kind = (i + 1) % pattern ? LAYER_KIND_SLIDING : LAYER_KIND_ATTN;
  }
  if (!g4) {
    double qpas = c->head_dim;
    if ((rc = get_num(p, t, "query_pre_attn_scalar", c->head_dim, &qpas))) return rc;
    c->attn_scale = (float)(1.0 / sqrt(qpas));
    for (int i = 0; i < c->n_layers; i++) {
      layer_config *l = &c->layers[i];
      int sl = l->kind == LAYER_KIND_SLIDING;
      /* Gemma3's local layers: the sliding entry, else rope_local_base_freq (old configs); a
       * legacy rope_scaling reaches the global layers only (merged into full_attention). */
      if ((rc = sl ? parse_rope(p, t, "sliding_attention", "rope_local_base_freq", 1e4, ROPE_LEGACY_NONE, l, NULL)
                   : parse_rope(p, t, "full_attention", "rope_theta", 1e6, ROPE_LEGACY_MERGE, l, NULL)))
        return rc;
      rope_standard(l, 1.0);
      if (sl) l->window = window;
    }
    return 0;
  }
  /* Gemma4 */
  json_t *legacy = jget(t, "rope_scaling");
  if (legacy && (!json_is_object(legacy) || json_object_size(legacy) > 0))
    /* Gemma4's config class drops a legacy rope_scaling; refusing beats ignoring it. */
    return anna_err(p->err, p->errlen, ANNA_EUNSUPPORTED,
                    "%s: gemma4 takes rope scaling from rope_parameters only (transformers ignores rope_scaling)",
                    p->path);
  c->attn_scale = 1.0f;
  c->v_norm = 1;
  int k_eq_v = get_bool(t, "attention_k_eq_v", 0);
  int global_hd = 512, global_kv = 0;
  if ((rc = get_int(p, t, "global_head_dim", 512, &global_hd)) ||
      (rc = get_int(p, t, "num_global_key_value_heads", 0, &global_kv)) ||
      (rc = get_int(p, t, "hidden_size_per_layer_input", 0, &c->ple_dim)) ||
      (rc = get_int(p, t, "vocab_size_per_layer_input", c->vocab, &c->ple_vocab)) ||
      (rc = get_int(p, t, "num_kv_shared_layers", 0, &c->n_kv_shared)))
    return rc;
  c->double_wide = get_bool(t, "use_double_wide_mlp", 0);
  c->moe_block = get_bool(t, "enable_moe_block", 0);
  if (c->moe_block) {
    if ((rc = req_int(p, t, "num_experts", &c->n_experts)) || (rc = req_int(p, t, "top_k_experts", &c->top_k)) ||
        (rc = req_int(p, t, "moe_intermediate_size", &c->expert_ffn)))
      return rc;
    c->norm_topk = 1;
  }
  if (c->n_kv_shared < 0 || c->n_kv_shared >= c->n_layers)
    return anna_err(p->err, p->errlen, ANNA_EFORMAT, "%s: num_kv_shared_layers %d out of range", p->path,
                    c->n_kv_shared);
  json_t *plc = jget(t, "per_layer_config");
  const int first_shared = c->n_layers - c->n_kv_shared;
  for (int i = 0; i < c->n_layers; i++) {
    layer_config *l = &c->layers[i];
    int sl = l->kind == LAYER_KIND_SLIDING;
    if (plc) {
      char key[16];
      snprintf(key, sizeof key, "%d", i);
      json_t *e = jget(plc, key);
      if (e) {
        if ((rc = get_int(p, e, "head_dim", c->head_dim, &l->head_dim)) ||
            (rc = get_int(p, e, "num_key_value_heads", c->n_kv_heads, &l->n_kv_heads)))
          return rc;
      }
    } else if (!sl) {
      l->head_dim = global_hd;
      if (k_eq_v && global_kv) l->n_kv_heads = global_kv;
    }
    if (l->head_dim < 2 || (l->head_dim & 1) || l->n_kv_heads < 1 || c->n_heads % l->n_kv_heads)
      return anna_err(p->err, p->errlen, ANNA_EFORMAT, "%s: layer %d: bad head_dim %d / kv heads %d", p->path,
                      i, l->head_dim, l->n_kv_heads);
    if ((rc = parse_rope(p, t, sl ? "sliding_attention" : "full_attention", "rope_theta", sl ? 1e4 : 1e6,
                         ROPE_LEGACY_NONE, l, NULL)))
      return rc;
    if (l->rope_type == ROPE_KIND_PROPORTIONAL) {
      /* Pairs span the whole head; only the first partial*D/2 frequencies are non-zero. */
      json_t *rp = jget(jget(t, "rope_parameters"), "full_attention");
      double partial = 1.0;
      if (rp) get_num(p, rp, "partial_rotary_factor", 1.0, &partial);
      l->rope_dims = l->head_dim;
      l->rope_n_freq = (int)(partial * l->head_dim / 2);
      l->rope_freq_denom = l->head_dim;
      l->rope_type = ROPE_KIND_DEFAULT;
      if (l->rope_factor != 1.0) l->rope_type = ROPE_KIND_LINEAR;
    } else {
      rope_standard(l, 1.0);
    }
    if (sl) l->window = window;
    if (c->double_wide && c->n_kv_shared > 0 && i >= first_shared) l->ffn_dim = 2 * c->ffn_dim;
    l->is_moe = c->moe_block;
  }
  if ((rc = config_link_shared_kv(c, p->err, p->errlen))) return anna_err_prefix(p->err, p->errlen, rc, "%s", p->path);
  c->k_eq_v = k_eq_v;
  return 0;
}

static const struct {
  const char *name;
  int arch;
} k_archs[] = {
    {"qwen3_5", MODEL_ARCH_QWEN3_5},         {"qwen3_5_text", MODEL_ARCH_QWEN3_5},
    {"qwen3_5_moe", MODEL_ARCH_QWEN3_5_MOE}, {"qwen3_5_moe_text", MODEL_ARCH_QWEN3_5_MOE},
    {"gemma4", MODEL_ARCH_GEMMA4},           {"gemma4_text", MODEL_ARCH_GEMMA4},
    {"gemma3", MODEL_ARCH_GEMMA3},           {"gemma3_text", MODEL_ARCH_GEMMA3},
    {"qwen3", MODEL_ARCH_QWEN3},             {"qwen2", MODEL_ARCH_QWEN2},
    {"llama", MODEL_ARCH_LLAMA},             {"qwen3_moe", MODEL_ARCH_QWEN3_MOE},
    {"qwen3_asr", MODEL_ARCH_QWEN3}, /* the thinker's text decoder (rope_scaling.mrope_section: 1-D positions) */
};

const char *config_arch_name(int arch) {
  for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
    if (k_archs[i].arch == arch) return k_archs[i].name;
  return "?";
}

int config_arch_from_name(const char *model_type) {
  for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
    if (!strcmp(k_archs[i].name, model_type)) return k_archs[i].arch;
  return -1;
}

/* The steps config_parse_hf and config_probe_hf share, with the same messages: the file as
 * JSON, the object the text fields live in (*t: text_config when present) and model_type
 * (top level, else text_config's). On success the caller owns *root. */
static int config_open(const char *path, json_t **root, json_t **t, const char **name, char *err, size_t errlen) {
  json_error_t je;
  *root = json_load_file(path, 0, &je);
  if (!*root) return anna_err(err, errlen, ANNA_EFORMAT, "%s: line %d: %s", path, je.line, je.text);
  *t = *root;
  if (jget(*root, "text_config")) *t = jget(*root, "text_config");
  /* Qwen3-ASR (qwen-asr's original layout): the decoder's fields sit one level deeper, in
   * thinker_config.text_config; the audio tower's are read by model/audio_qwen3_asr.c. */
  json_t *thinker = jget(*root, "thinker_config");
  if (json_is_object(thinker) && jget(thinker, "text_config")) *t = jget(thinker, "text_config");
  int rc = 0;
  json_t *mt = NULL;
  if (!json_is_object(*t)) {
    rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: not a JSON object", path);
  } else {
    mt = jget(*root, "model_type");
    if (!json_is_string(mt)) mt = jget(*t, "model_type");
    if (!json_is_string(mt)) rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: missing model_type", path);
  }
  if (rc) {
    json_decref(*root);
    *root = NULL;
    return rc;
  }
  *name = json_string_value(mt);
  return 0;
}

int config_probe_hf(const char *path, char *model_type, size_t mt_len, char *architecture, size_t arch_len, char *err,
                    size_t errlen) {
  json_t *root, *t;
  const char *name;
  int rc = config_open(path, &root, &t, &name, err, errlen);
  if (rc) return rc;
  snprintf(model_type, mt_len, "%s", name);
  json_t *a = jget(root, "architectures");
  json_t *a0 = json_is_array(a) ? json_array_get(a, 0) : NULL;
  snprintf(architecture, arch_len, "%s", json_is_string(a0) ? json_string_value(a0) : "");
  json_decref(root);
  return 0;
}

int config_parse_hf(model_config *cfg, const char *path, char *err, size_t errlen) {
  memset(cfg, 0, sizeof *cfg);
  json_t *root, *t;
  const char *name;
  int rc = config_open(path, &root, &t, &name, err, errlen);
  if (rc) return rc;
  pctx p = {path, err, errlen};
  const int arch = config_arch_from_name(name);
  if (arch < 0) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: model_type '%s' is not supported", path, name);
    goto out;
  }
  cfg->arch = arch;
  snprintf(cfg->model_type, sizeof cfg->model_type, "%s", name);
  switch (arch) {
  case MODEL_ARCH_QWEN3_5:
  case MODEL_ARCH_QWEN3_5_MOE: rc = parse_qwen3_5(&p, t, cfg); break;
  case MODEL_ARCH_GEMMA3:
  case MODEL_ARCH_GEMMA4: rc = parse_gemma(&p, t, cfg); break;
  default: rc = parse_classic(&p, t, cfg); break;
  }
  /* Composite checkpoints keep tie_word_embeddings at the top level. */
  if (!rc && t != root && jget(root, "tie_word_embeddings"))
    cfg->tie_embeddings = get_bool(root, "tie_word_embeddings", cfg->tie_embeddings);
  if (!rc) rc = config_rope_fold(cfg, path, err, errlen);
out:
  json_decref(root);
  return rc;
}

int config_parse_hf_nested(model_config *cfg, const char *path, const char *const *keys, int n_keys,
                           const char *as_type, char *err, size_t errlen) {
  memset(cfg, 0, sizeof *cfg);
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) return anna_err(err, errlen, ANNA_EFORMAT, "%s: line %d: %s", path, je.line, je.text);
  json_t *t = root;
  int rc = 0;
  for (int i = 0; i < n_keys && t; i++) {
    t = jget(t, keys[i]);
    if (!json_is_object(t)) {
      rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: missing object '%s'", path, keys[i]);
      goto out;
    }
  }
  const int arch = config_arch_from_name(as_type);
  if (arch != MODEL_ARCH_QWEN3 && arch != MODEL_ARCH_QWEN2 && arch != MODEL_ARCH_LLAMA) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: nested decoder type '%s' is not supported", path, as_type);
    goto out;
  }
  cfg->arch = arch;
  snprintf(cfg->model_type, sizeof cfg->model_type, "%s", as_type);
  pctx p = {path, err, errlen};
  rc = parse_classic(&p, t, cfg);
  if (!rc) rc = config_rope_fold(cfg, path, err, errlen);
out:
  json_decref(root);
  return rc;
}
