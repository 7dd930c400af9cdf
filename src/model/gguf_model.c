/* gguf_model.c: GGUF -> model_config + layer_weights (see gguf_model.h). */
#include "model/gguf_model.h"

#include "base/error.h"
#include "formats/dtype.h"
#include "formats/gguf.h"
#include "formats/quant.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gb {
  text_model *m;
  gguf_file *f;
  char arch[32];
  char *err;
  size_t errlen;
} gb;

static void *gb_alloc(text_model *m, size_t bytes) {
  void *p = calloc(1, bytes ? bytes : 1);
  if (!p) return NULL;
  if (m->n_allocs == m->cap_allocs) {
    size_t cap = m->cap_allocs ? 2 * m->cap_allocs : 64;
    void **na = realloc(m->allocs, cap * sizeof *na);
    if (!na) {
      free(p);
      return NULL;
    }
    m->allocs = na;
    m->cap_allocs = cap;
  }
  m->allocs[m->n_allocs++] = p;
  return p;
}

/* ---- metadata ---- */

static const gguf_kv *kv(gb *b, const char *key) {
  char full[128];
  snprintf(full, sizeof full, "%s.%s", b->arch, key);
  return gguf_kv_find(b->f, full);
}

static int kv_is_num(const gguf_kv *k) {
  return k && k->type != GGUF_TYPE_STRING && k->type != GGUF_TYPE_ARRAY;
}

static double kv_num(const gguf_kv *k) {
  switch (k->type) {
  case GGUF_TYPE_FLOAT32:
  case GGUF_TYPE_FLOAT64: return k->f;
  case GGUF_TYPE_INT8:
  case GGUF_TYPE_INT16:
  case GGUF_TYPE_INT32:
  case GGUF_TYPE_INT64: return (double)k->i;
  case GGUF_TYPE_BOOL: return k->b;
  default: return (double)k->u;
  }
}

/* Integer key (scalar, or the entry for `layer` of a per-layer array). */
static int get_u(gb *b, const char *key, int layer, int def, int required, int *out) {
  const gguf_kv *k = kv(b, key);
  if (!k) {
    if (required) return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: missing key %s.%s", b->m->path, b->arch, key);
    *out = def;
    return 0;
  }
  double v;
  if (k->type == GGUF_TYPE_ARRAY) {
    if (layer < 0 || layer >= k->arr.count)
      return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: %s.%s has %lld entries, need layer %d", b->m->path,
                      b->arch, key, (long long)k->arr.count, layer);
    v = (double)gguf_array_get_i64(&k->arr, layer);
  } else if (kv_is_num(k)) {
    v = kv_num(k);
  } else {
    return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: %s.%s is not a number", b->m->path, b->arch, key);
  }
  if (v < 0 || v > (1 << 30))
    return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: %s.%s = %g out of range", b->m->path, b->arch, key, v);
  *out = (int)v;
  return 0;
}

static double get_f(gb *b, const char *key, double def) {
  const gguf_kv *k = kv(b, key);
  return kv_is_num(k) ? kv_num(k) : def;
}

/* ---- tensors ---- */

static const gguf_tensor *tfind(gb *b, const char *fmt, va_list ap, char *name, size_t n) {
  vsnprintf(name, n, fmt, ap);
  return gguf_tensor_find(b->f, name);
}

/* Matrix with PyTorch shape [rows, cols] = GGUF dims {cols, rows}. */
__attribute__((format(printf, 6, 7))) static int mat(gb *b, ops_weight *w, int64_t rows, int64_t cols, int required,
                                                     const char *fmt, ...) {
  char name[160];
  va_list ap;
  va_start(ap, fmt);
  const gguf_tensor *t = tfind(b, fmt, ap, name, sizeof name);
  va_end(ap);
  memset(w, 0, sizeof *w);
  if (!t) {
    if (!required) return 0;
    return anna_err(b->err, b->errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s'", b->m->path, name);
  }
  if (t->ndim > 2 || t->dims[0] != cols || t->dims[1] != rows)
    return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: tensor '%s' has dims {%lld, %lld}, expected {%lld, %lld}",
                    b->m->path, name, (long long)t->dims[0], (long long)t->dims[1], (long long)cols, (long long)rows);
  if (t->type != ANNA_DTYPE_F32 && t->type != ANNA_DTYPE_F16 && t->type != ANNA_DTYPE_BF16 && !quant_can_dot(t->type))
    return anna_err(b->err, b->errlen, ANNA_EUNSUPPORTED, "%s: tensor '%s' has unsupported type %s", b->m->path, name,
                    dtype_name(t->type));
  *w = (ops_weight){t->type, t->data, rows, cols};
  if (cols > b->m->max_cols) b->m->max_cols = cols;
  return 0;
}

/* Vector of n values (any shape with n elements), to f32. */
__attribute__((format(printf, 5, 6))) static int vec(gb *b, float **out, int64_t n, int required, const char *fmt,
                                                     ...) {
  char name[160];
  va_list ap;
  va_start(ap, fmt);
  const gguf_tensor *t = tfind(b, fmt, ap, name, sizeof name);
  va_end(ap);
  *out = NULL;
  if (!t) {
    if (!required) return 0;
    return anna_err(b->err, b->errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s'", b->m->path, name);
  }
  if (t->nelem != n)
    return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: tensor '%s' has %lld elements, expected %lld", b->m->path,
                    name, (long long)t->nelem, (long long)n);
  float *v = gb_alloc(b->m, (size_t)n * sizeof(float));
  if (!v) return anna_err(b->err, b->errlen, ANNA_ENOMEM, "out of memory");
  if (quant_dequantize_row(t->type, t->data, v, n) != 0)
    return anna_err(b->err, b->errlen, ANNA_EUNSUPPORTED, "%s: tensor '%s': cannot read type %s", b->m->path, name,
                    dtype_name(t->type));
  *out = v;
  return 0;
}

/* Experts: GGUF dims {cols, rows, E} = PyTorch [E, rows, cols]. */
static int experts(gb *b, ops_weight **out, int E, int64_t rows, int64_t cols, int required, const char *name) {
  const gguf_tensor *t = gguf_tensor_find(b->f, name);
  *out = NULL;
  if (!t) {
    if (!required) return 0;
    return anna_err(b->err, b->errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s'", b->m->path, name);
  }
  if (t->ndim != 3 || t->dims[0] != cols || t->dims[1] != rows || t->dims[2] != E)
    return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: tensor '%s' has dims {%lld, %lld, %lld}, expected {%lld, %lld, %d}",
                    b->m->path, name, (long long)t->dims[0], (long long)t->dims[1], (long long)t->dims[2],
                    (long long)cols, (long long)rows, E);
  ops_weight *arr = gb_alloc(b->m, (size_t)E * sizeof *arr);
  if (!arr) return anna_err(b->err, b->errlen, ANNA_ENOMEM, "out of memory");
  size_t per = (size_t)dtype_row_bytes(t->type, cols) * (size_t)rows;
  for (int e = 0; e < E; e++) arr[e] = (ops_weight){t->type, (const char *)t->data + per * (size_t)e, rows, cols};
  if (cols > b->m->max_cols) b->m->max_cols = cols;
  *out = arr;
  return 0;
}

/* ---- config ---- */

enum { G_QWEN35, G_QWEN35MOE, G_GEMMA4, G_GEMMA3, G_QWEN3, G_QWEN2, G_LLAMA, G_QWEN3MOE };
static const struct {
  const char *name;
  int g, arch;
} k_garch[] = {
    {"qwen35", G_QWEN35, MODEL_ARCH_QWEN3_5}, {"qwen35moe", G_QWEN35MOE, MODEL_ARCH_QWEN3_5_MOE},
    {"gemma4", G_GEMMA4, MODEL_ARCH_GEMMA4},  {"gemma3", G_GEMMA3, MODEL_ARCH_GEMMA3},
    {"qwen3", G_QWEN3, MODEL_ARCH_QWEN3},     {"qwen2", G_QWEN2, MODEL_ARCH_QWEN2},
    {"llama", G_LLAMA, MODEL_ARCH_LLAMA},     {"qwen3moe", G_QWEN3MOE, MODEL_ARCH_QWEN3_MOE},
};

int gguf_model_arch_known(const char *arch) {
  for (size_t i = 0; i < sizeof k_garch / sizeof k_garch[0]; i++)
    if (!strcmp(arch, k_garch[i].name)) return 1;
  return 0;
}

static int bool_at(gb *b, const char *key, int layer, int *out) {
  const gguf_kv *k = kv(b, key);
  if (!k || k->type != GGUF_TYPE_ARRAY || layer >= k->arr.count) return 0;
  *out = gguf_array_get_i64(&k->arr, layer) != 0;
  return 1;
}

/* Rope scaling beyond what the tensors carry (rope_freqs: llama3, Gemma4 proportional), from
 * <arch>.rope.scaling.*: "linear" on every attention layer (Gemma: the global layers only, as
 * build_config already set), "yarn" with transformers' semantics (config.h: the same inv_freq
 * blend and attention factor; llama.cpp's corr dims floor/ceil like truncate = true). A type
 * anna does not implement, or YaRN tweaks whose llama.cpp meaning has no transformers
 * counterpart, is ANNA_EUNSUPPORTED. */
static int rope_scaling(gb *b, int g) {
  model_config *c = &b->m->cfg;
  const gguf_kv *tk = kv(b, "rope.scaling.type");
  if (!tk) return 0;
  if (tk->type != GGUF_TYPE_STRING)
    return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: %s.rope.scaling.type is not a string", b->m->path, b->arch);
  const char *type = tk->str;
  const int gemma = g == G_GEMMA3 || g == G_GEMMA4;
  if (!strcmp(type, "none") || (gemma && !strcmp(type, "linear"))) return 0;
  const double factor = get_f(b, "rope.scaling.factor", 0);
  if (!strcmp(type, "linear")) {
    if (!(factor > 0))
      return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: rope scaling 'linear' needs a positive rope.scaling.factor",
                      b->m->path);
    for (int i = 0; i < c->n_layers; i++)
      if (factor != 1.0) c->layers[i].rope_type = ROPE_KIND_LINEAR, c->layers[i].rope_factor = factor;
    return 0;
  }
  if (strcmp(type, "yarn") || gemma)
    return anna_err(b->err, b->errlen, ANNA_EUNSUPPORTED, "%s: rope scaling '%s' is not supported for %s GGUF files%s",
                    b->m->path, type, b->arch, gemma ? "" : " (have: none, linear, yarn)");
  const double orig = get_f(b, "rope.scaling.original_context_length", 0);
  if (!(factor > 0) || !(orig > 0))
    return anna_err(b->err, b->errlen, ANNA_EFORMAT,
                    "%s: rope scaling 'yarn' needs positive rope.scaling.factor and rope.scaling.original_context_length",
                    b->m->path);
  const double mscale = factor <= 1 ? 1.0 : 0.1 * log(factor) + 1.0;
  const double ext = get_f(b, "rope.scaling.yarn_ext_factor", -1), logmul = get_f(b, "rope.scaling.yarn_log_multiplier", 0),
               attn = get_f(b, "rope.scaling.yarn_attn_factor", mscale), attn_mul = get_f(b, "rope.scaling.attn_factor", 1);
  if ((ext >= 0 && ext != 1.0) || logmul != 0 || attn_mul != 1.0 || fabs(attn - mscale) > 1e-6 * mscale)
    return anna_err(b->err, b->errlen, ANNA_EUNSUPPORTED,
                    "%s: rope scaling 'yarn' with ext_factor %g, log_multiplier %g, attn_factor %g or yarn_attn_factor "
                    "%g is not supported (have: the defaults 1, 0, 1 and 0.1 ln(factor) + 1 = %g)",
                    b->m->path, ext, logmul, attn_mul, attn, mscale);
  for (int i = 0; i < c->n_layers; i++) {
    layer_config *l = &c->layers[i];
    l->rope_type = ROPE_KIND_YARN;
    l->rope_factor = factor;
    l->rope_orig_max_pos = orig;
    l->rope_beta_fast = get_f(b, "rope.scaling.yarn_beta_fast", 32);
    l->rope_beta_slow = get_f(b, "rope.scaling.yarn_beta_slow", 1);
    if (!l->rope_beta_fast) l->rope_beta_fast = 32;
    if (!l->rope_beta_slow) l->rope_beta_slow = 1;
    l->rope_truncate = 1;
    l->rope_attn_factor = mscale;
    if (!(l->rope_theta > 1))
      return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: rope scaling 'yarn' needs rope.freq_base > 1", b->m->path);
  }
  return 0;
}

static int build_config(gb *b, int g) {
  model_config *c = &b->m->cfg;
  int rc;
  const gguf_tensor *emb = gguf_tensor_find(b->f, "token_embd.weight");
  if (!emb || emb->ndim != 2)
    return anna_err(b->err, b->errlen, ANNA_ENOTFOUND, "%s: missing tensor 'token_embd.weight'", b->m->path);
  if ((rc = get_u(b, "block_count", -1, 0, 1, &c->n_layers)) || (rc = get_u(b, "embedding_length", -1, 0, 1, &c->hidden)) ||
      (rc = get_u(b, "attention.head_count", 0, 0, 1, &c->n_heads)))
    return rc;
  if (c->n_layers < 1 || c->n_layers > CONFIG_MAX_LAYERS || c->hidden < 1 || c->n_heads < 1 || emb->dims[0] != c->hidden ||
      emb->dims[1] < 1 || emb->dims[1] > (1 << 24))
    return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: inconsistent sizes (layers %d, hidden %d, heads %d)",
                    b->m->path, c->n_layers, c->hidden, c->n_heads);
  c->vocab = (int)emb->dims[1];
  c->eps = get_f(b, "attention.layer_norm_rms_epsilon", 1e-6);
  c->norm = NORM_KIND_W; /* converters bake the +1 of zero-centred norms into the weights */
  c->act = ACT_KIND_SILU;
  c->embed_scale = 1.0f;
  c->tie_embeddings = gguf_tensor_find(b->f, "output.weight") == NULL;
  int hd_def = c->hidden / c->n_heads;
  if ((rc = get_u(b, "attention.key_length", -1, hd_def, 0, &c->head_dim))) return rc;
  c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
  const double theta = get_f(b, "rope.freq_base", 10000.0);
  int rot;
  if ((rc = get_u(b, "rope.dimension_count", -1, c->head_dim, 0, &rot))) return rc;
  for (int i = 0; i < c->n_layers; i++) {
    layer_config *l = &c->layers[i];
    l->kind = LAYER_KIND_ATTN;
    l->kv_source = i;
    l->head_dim = c->head_dim;
    if ((rc = get_u(b, "attention.head_count_kv", i, c->n_heads, 0, &l->n_kv_heads)) ||
        (rc = get_u(b, "feed_forward_length", i, 0, 0, &l->ffn_dim)))
      return rc;
    l->rope_theta = theta;
    l->rope_dims = rot;
    l->rope_n_freq = rot / 2;
    l->rope_freq_denom = rot;
    l->rope_factor = 1.0;
  }
  c->n_kv_heads = c->layers[0].n_kv_heads;
  c->ffn_dim = c->layers[0].ffn_dim;
  if ((rc = get_u(b, "expert_count", -1, 0, 0, &c->n_experts)) || (rc = get_u(b, "expert_used_count", -1, 0, 0, &c->top_k)) ||
      (rc = get_u(b, "expert_feed_forward_length", -1, 0, 0, &c->expert_ffn)) ||
      (rc = get_u(b, "expert_shared_feed_forward_length", -1, 0, 0, &c->shared_ffn)))
    return rc;
  if (c->n_experts && (c->top_k < 1 || c->top_k > c->n_experts || c->expert_ffn < 1))
    return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: bad expert counts (%d of %d, width %d)", b->m->path, c->top_k,
                    c->n_experts, c->expert_ffn);
  c->norm_topk = 1;

  switch (g) {
  case G_QWEN35:
  case G_QWEN35MOE: {
    c->qk_norm = 1;
    c->attn_out_gate = 1;
    c->gdn_v_tiled = 1;
    /* mRoPE sections (llama.cpp: <arch>.rope.dimension_sections, [T, H, W, 0]); transformers'
     * default when absent */
    c->mrope_section[0] = 11, c->mrope_section[1] = 11, c->mrope_section[2] = 10;
    {
      const gguf_kv *ds = kv(b, "rope.dimension_sections");
      if (ds && (ds->type != GGUF_TYPE_ARRAY || ds->arr.count < 3 || ds->arr.elem_size == 0))
        return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: rope.dimension_sections must be an array of integers",
                        b->m->path);
      for (int i = 0; ds && i < 3; i++) {
        const int64_t v = gguf_array_get_i64(&ds->arr, i);
        if (v < 0 || v > 1024)
          return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: rope.dimension_sections[%d] = %lld", b->m->path, i,
                          (long long)v);
        c->mrope_section[i] = (int)v;
      }
    }
    int inner = 0, interval = 4;
    if ((rc = get_u(b, "ssm.state_size", -1, 0, 1, &c->gdn_dk)) || (rc = get_u(b, "ssm.group_count", -1, 0, 1, &c->gdn_hk)) ||
        (rc = get_u(b, "ssm.time_step_rank", -1, 0, 1, &c->gdn_hv)) || (rc = get_u(b, "ssm.inner_size", -1, 0, 1, &inner)) ||
        (rc = get_u(b, "ssm.conv_kernel", -1, 4, 0, &c->gdn_conv)) ||
        (rc = get_u(b, "full_attention_interval", -1, 4, 0, &interval)))
      return rc;
    if (c->gdn_hk < 1 || c->gdn_hv < 1 || c->gdn_hv % c->gdn_hk || inner % c->gdn_hv || c->gdn_dk < 1 || c->gdn_conv < 1 ||
        c->gdn_conv > 16)
      return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: inconsistent ssm sizes", b->m->path);
    c->gdn_dv = inner / c->gdn_hv;
    for (int i = 0; i < c->n_layers; i++) {
      int rec = interval > 0 ? (i + 1) % interval != 0 : 1;
      bool_at(b, "attention.recurrent_layers", i, &rec);
      c->layers[i].kind = rec ? LAYER_KIND_GDN : LAYER_KIND_ATTN;
      if (g == G_QWEN35MOE) {
        c->layers[i].is_moe = 1;
        c->layers[i].ffn_dim = 0;
      }
    }
    break;
  }
  case G_GEMMA3:
  case G_GEMMA4: {
    c->act = ACT_KIND_GELU_TANH;
    c->qk_norm = 1;
    c->post_norms = 1;
    c->embed_scale = sqrtf((float)c->hidden);
    c->final_softcap = (float)get_f(b, "final_logit_softcapping", 0);
    c->attn_softcap = (float)get_f(b, "attn_logit_softcapping", 0);
    int window = 0, hd_swa = c->head_dim, rot_swa = c->head_dim;
    if ((rc = get_u(b, "attention.sliding_window", -1, 4096, 0, &window)) ||
        (rc = get_u(b, "attention.key_length_swa", -1, c->head_dim, 0, &hd_swa)) ||
        (rc = get_u(b, "rope.dimension_count_swa", -1, hd_swa, 0, &rot_swa)))
      return rc;
    const double theta_swa = get_f(b, "rope.freq_base_swa", 10000.0), factor = get_f(b, "rope.scaling.factor", 1.0);
    int shared = 0;
    if ((rc = get_u(b, "attention.shared_kv_layers", -1, 0, 0, &shared)) ||
        (rc = get_u(b, "embedding_length_per_layer_input", -1, 0, 0, &c->ple_dim)))
      return rc;
    if (shared >= c->n_layers) return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: shared_kv_layers %d", b->m->path, shared);
    c->n_kv_shared = shared;
    c->ple_vocab = c->vocab;
    if (g == G_GEMMA3) {
      /* GGUF has no query_pre_attn_scalar: like llama.cpp, assume it equals head_dim (true of
       * the released models but 27B) unless the file carries attention.scale. */
      c->attn_scale = (float)get_f(b, "attention.scale", 1.0 / sqrt((double)c->head_dim));
    }
    if (g == G_GEMMA4) {
      c->v_norm = 1;
      c->attn_scale = 1.0f;
      c->moe_block = c->n_experts > 0;
    }
    for (int i = 0; i < c->n_layers; i++) {
      layer_config *l = &c->layers[i];
      int sl = (i + 1) % 6 != 0;
      bool_at(b, "attention.sliding_window_pattern", i, &sl);
      l->kind = sl ? LAYER_KIND_SLIDING : LAYER_KIND_ATTN;
      l->window = sl ? window : 0;
      l->head_dim = sl ? hd_swa : c->head_dim;
      int r2 = sl ? rot_swa : rot;
      l->rope_dims = r2;
      l->rope_n_freq = r2 / 2;
      l->rope_freq_denom = r2;
      l->rope_theta = sl ? theta_swa : theta;
      if (!sl && factor != 1.0) {
        l->rope_type = ROPE_KIND_LINEAR;
        l->rope_factor = factor;
      }
      l->is_moe = c->moe_block;
    }
    if ((rc = config_link_shared_kv(c, b->err, b->errlen))) return anna_err_prefix(b->err, b->errlen, rc, "%s", b->m->path);
    break;
  }
  case G_QWEN3:
  case G_QWEN3MOE:
    c->qk_norm = 1;
    if (g == G_QWEN3MOE)
      for (int i = 0; i < c->n_layers; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", i);
        c->layers[i].is_moe = gguf_tensor_find(b->f, name) != NULL;
        if (c->layers[i].is_moe) c->layers[i].ffn_dim = 0;
      }
    break;
  case G_QWEN2: c->attn_bias = 1; break;
  case G_LLAMA:
    /* llama.cpp's converter permutes Llama's q/k rows for GPT-J style (interleaved) rope. */
    for (int i = 0; i < c->n_layers; i++) c->layers[i].rope_interleaved = 1;
    break;
  }
  for (int i = 0; i < c->n_layers; i++) {
    const layer_config *l = &c->layers[i];
    if (l->n_kv_heads < 1 || c->n_heads % l->n_kv_heads || l->head_dim < 2 || l->head_dim > 1024 || l->rope_dims > l->head_dim ||
        l->rope_dims < 0)
      return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: layer %d: bad heads (%d / %d kv, dim %d, rope %d)", b->m->path,
                      i, c->n_heads, l->n_kv_heads, l->head_dim, l->rope_dims);
  }
  if ((rc = rope_scaling(b, g))) return rc;
  return config_rope_fold(c, b->m->path, b->err, b->errlen);
}

/* ---- weights ---- */

static int load_layer(gb *b, int i) {
  text_model *m = b->m;
  const model_config *c = &m->cfg;
  const layer_config *lc = &c->layers[i];
  layer_weights *w = &m->layers[i];
  const int64_t H = c->hidden;
  const int gemma = c->post_norms;
  int rc;
  if ((rc = vec(b, &w->attn_norm, H, 1, "blk.%d.attn_norm.weight", i))) return rc;
  if (gemma) {
    if ((rc = vec(b, &w->post_attn_norm, H, 1, "blk.%d.post_attention_norm.weight", i)) ||
        (rc = vec(b, &w->pre_ff_norm, H, 1, "blk.%d.ffn_norm.weight", i)) ||
        (rc = vec(b, &w->post_ff_norm, H, 1, "blk.%d.post_ffw_norm.weight", i)))
      return rc;
  } else {
    /* qwen35 names the pre-FFN norm post_attention_norm; the classic archs ffn_norm. */
    if ((rc = vec(b, &w->pre_ff_norm, H, 0, "blk.%d.ffn_norm.weight", i))) return rc;
    if (!w->pre_ff_norm && (rc = vec(b, &w->pre_ff_norm, H, 1, "blk.%d.post_attention_norm.weight", i))) return rc;
  }
  if (lc->kind == LAYER_KIND_GDN) {
    const int64_t Kd = (int64_t)c->gdn_hk * c->gdn_dk, Vd = (int64_t)c->gdn_hv * c->gdn_dv, cd = 2 * Kd + Vd;
    float *ssm_a = NULL;
    if ((rc = mat(b, &w->qkv, cd, H, 1, "blk.%d.attn_qkv.weight", i)) || (rc = mat(b, &w->z, Vd, H, 1, "blk.%d.attn_gate.weight", i)) ||
        (rc = mat(b, &w->b, c->gdn_hv, H, 1, "blk.%d.ssm_beta.weight", i)) ||
        (rc = mat(b, &w->a, c->gdn_hv, H, 1, "blk.%d.ssm_alpha.weight", i)) ||
        (rc = mat(b, &w->out, H, Vd, 1, "blk.%d.ssm_out.weight", i)) ||
        (rc = vec(b, &w->conv_w, cd * c->gdn_conv, 1, "blk.%d.ssm_conv1d.weight", i)) ||
        (rc = vec(b, &ssm_a, c->gdn_hv, 1, "blk.%d.ssm_a", i)) ||
        (rc = vec(b, &w->dt_bias, c->gdn_hv, 1, "blk.%d.ssm_dt.bias", i)) ||
        (rc = vec(b, &w->gdn_norm, c->gdn_dv, 1, "blk.%d.ssm_norm.weight", i)))
      return rc;
    /* ssm_a holds -exp(A_log); the forward pass wants A_log. */
    for (int h = 0; h < c->gdn_hv; h++) {
      if (!(ssm_a[h] < 0))
        return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: blk.%d.ssm_a[%d] = %g must be negative", m->path, i, h, ssm_a[h]);
      ssm_a[h] = logf(-ssm_a[h]);
    }
    w->a_log = ssm_a;
  } else {
    const int64_t D = lc->head_dim, Hq = c->n_heads, Hkv = lc->n_kv_heads;
    const int own = lc->kv_source == i;
    if ((rc = mat(b, &w->q, Hq * D * (c->attn_out_gate ? 2 : 1), H, 1, "blk.%d.attn_q.weight", i)) ||
        (rc = mat(b, &w->o, H, Hq * D, 1, "blk.%d.attn_output.weight", i)))
      return rc;
    if (own) {
      if ((rc = mat(b, &w->k, Hkv * D, H, 1, "blk.%d.attn_k.weight", i)) ||
          (rc = mat(b, &w->v, Hkv * D, H, c->arch != MODEL_ARCH_GEMMA4, "blk.%d.attn_v.weight", i)))
        return rc;
    }
    if (c->attn_bias &&
        ((rc = vec(b, &w->q_bias, Hq * D, 0, "blk.%d.attn_q.bias", i)) || (rc = vec(b, &w->k_bias, Hkv * D, 0, "blk.%d.attn_k.bias", i)) ||
         (rc = vec(b, &w->v_bias, Hkv * D, 0, "blk.%d.attn_v.bias", i))))
      return rc;
    if (c->qk_norm) {
      if ((rc = vec(b, &w->q_norm, D, 1, "blk.%d.attn_q_norm.weight", i))) return rc;
      if (own && (rc = vec(b, &w->k_norm, D, 1, "blk.%d.attn_k_norm.weight", i))) return rc;
      config_rope_fold_norm(c, lc, w->q_norm);
      config_rope_fold_norm(c, lc, w->k_norm);
    }
    const int half = lc->rope_dims / 2;
    w->inv_freq = gb_alloc(m, (size_t)(half + 1) * sizeof(float));
    if (!w->inv_freq) return anna_err(b->err, b->errlen, ANNA_ENOMEM, "out of memory");
    config_rope_inv_freq(lc, w->inv_freq);
    /* rope_freqs: per-frequency divisors (llama3 scaling, Gemma4 proportional rope). */
    const gguf_tensor *rf = gguf_tensor_find(b->f, "rope_freqs.weight");
    if (rf && lc->kind == LAYER_KIND_ATTN) {
      float *ff = NULL;
      if ((rc = vec(b, &ff, half, 1, "rope_freqs.weight"))) return rc;
      for (int j = 0; j < half; j++) w->inv_freq[j] = ff[j] > 0 ? w->inv_freq[j] / ff[j] : 0.0f;
    }
  }
  /* FFN */
  if (lc->ffn_dim > 0) {
    if ((rc = mat(b, &w->gate, lc->ffn_dim, H, 1, "blk.%d.ffn_gate.weight", i)) ||
        (rc = mat(b, &w->up, lc->ffn_dim, H, 1, "blk.%d.ffn_up.weight", i)) ||
        (rc = mat(b, &w->down, H, lc->ffn_dim, 1, "blk.%d.ffn_down.weight", i)))
      return rc;
  }
  if (lc->is_moe) {
    const int E = c->n_experts;
    const int64_t I = c->expert_ffn;
    char n1[64], n2[64], n3[64];
    if ((rc = mat(b, &w->router, E, H, 1, "blk.%d.ffn_gate_inp.weight", i))) return rc;
    snprintf(n1, sizeof n1, "blk.%d.ffn_gate_up_exps.weight", i);
    if (gguf_tensor_find(b->f, n1)) {
      if ((rc = experts(b, &w->exp_gate, E, 2 * I, H, 1, n1))) return rc;
    } else {
      snprintf(n1, sizeof n1, "blk.%d.ffn_gate_exps.weight", i);
      snprintf(n2, sizeof n2, "blk.%d.ffn_up_exps.weight", i);
      if ((rc = experts(b, &w->exp_gate, E, I, H, 1, n1)) || (rc = experts(b, &w->exp_up, E, I, H, 1, n2))) return rc;
    }
    snprintf(n3, sizeof n3, "blk.%d.ffn_down_exps.weight", i);
    if ((rc = experts(b, &w->exp_down, E, H, I, 1, n3))) return rc;
    if (c->shared_ffn > 0) {
      w->has_shared = 1;
      const int64_t S = c->shared_ffn;
      if ((rc = mat(b, &w->sh_gate, S, H, 1, "blk.%d.ffn_gate_shexp.weight", i)) ||
          (rc = mat(b, &w->sh_up, S, H, 1, "blk.%d.ffn_up_shexp.weight", i)) ||
          (rc = mat(b, &w->sh_down, H, S, 1, "blk.%d.ffn_down_shexp.weight", i)) ||
          (rc = mat(b, &w->sh_gate_inp, 1, H, 1, "blk.%d.ffn_gate_inp_shexp.weight", i)))
        return rc;
    }
    if (c->arch == MODEL_ARCH_GEMMA4 &&
        ((rc = vec(b, &w->router_scale, H, 1, "blk.%d.ffn_gate_inp.scale", i)) ||
         (rc = vec(b, &w->per_expert_scale, E, 1, "blk.%d.ffn_down_exps.scale", i)) ||
         (rc = vec(b, &w->post_ff_norm1, H, 1, "blk.%d.post_ffw_norm_1.weight", i)) ||
         (rc = vec(b, &w->pre_ff_norm2, H, 1, "blk.%d.pre_ffw_norm_2.weight", i)) ||
         (rc = vec(b, &w->post_ff_norm2, H, 1, "blk.%d.post_ffw_norm_2.weight", i))))
      return rc;
  }
  w->layer_scalar = 1.0f;
  if (c->arch == MODEL_ARCH_GEMMA4) {
    float *ls = NULL;
    if ((rc = vec(b, &ls, 1, 0, "blk.%d.layer_output_scale.weight", i))) return rc;
    if (ls) w->layer_scalar = ls[0];
    if (c->ple_dim > 0 &&
        ((rc = mat(b, &w->ple_gate, c->ple_dim, H, 1, "blk.%d.inp_gate.weight", i)) ||
         (rc = mat(b, &w->ple_proj, H, c->ple_dim, 1, "blk.%d.proj.weight", i)) ||
         (rc = vec(b, &w->ple_post_norm, H, 1, "blk.%d.post_norm.weight", i))))
      return rc;
  }
  return 0;
}

int gguf_model_load(text_model **out, const char *path, char *err, size_t errlen) {
  *out = NULL;
  text_model *m = calloc(1, sizeof *m);
  if (!m) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  int rc;
  m->path = strdup(path);
  gguf_file *f = NULL;
  if (!m->path) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    goto fail;
  }
  if ((rc = gguf_open(&f, path, err, errlen))) goto fail;
  m->gguf = f;
  gb b = {m, f, "", err, errlen};
  const char *arch = NULL;
  if ((rc = gguf_get_str(f, "general.architecture", &arch, err, errlen))) goto fail;
  int g = -1;
  for (size_t i = 0; i < sizeof k_garch / sizeof k_garch[0]; i++)
    if (!strcmp(arch, k_garch[i].name)) {
      g = k_garch[i].g;
      m->cfg.arch = k_garch[i].arch;
    }
  if (g < 0) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: GGUF architecture '%s' is not supported", path, arch);
    goto fail;
  }
  snprintf(b.arch, sizeof b.arch, "%s", arch);
  snprintf(m->cfg.model_type, sizeof m->cfg.model_type, "%s", arch);
  if ((rc = build_config(&b, g))) goto fail;
  const model_config *c = &m->cfg;
  if ((rc = mat(&b, &m->embed, c->vocab, c->hidden, 1, "token_embd.weight")) ||
      (rc = vec(&b, &m->final_norm, c->hidden, 1, "output_norm.weight")))
    goto fail;
  if (c->tie_embeddings) m->lm_head = m->embed;
  else if ((rc = mat(&b, &m->lm_head, c->vocab, c->hidden, 1, "output.weight")))
    goto fail;
  if (c->ple_dim > 0) {
    const int64_t LP = (int64_t)c->n_layers * c->ple_dim;
    if ((rc = mat(&b, &m->ple_embed, c->ple_vocab, LP, 1, "per_layer_token_embd.weight")) ||
        (rc = mat(&b, &m->ple_model_proj, LP, c->hidden, 1, "per_layer_model_proj.weight")) ||
        (rc = vec(&b, &m->ple_proj_norm, c->ple_dim, 1, "per_layer_proj_norm.weight")))
      goto fail;
  }
  for (int i = 0; i < c->n_layers; i++) {
    if (c->arch == MODEL_ARCH_GEMMA4 && c->layers[i].kind == LAYER_KIND_ATTN) {
      /* attention_k_eq_v: full layers without attn_v read V from the raw K projection. */
      char name[64];
      snprintf(name, sizeof name, "blk.%d.attn_v.weight", i);
      if (c->layers[i].kv_source == i && !gguf_tensor_find(f, name)) m->cfg.k_eq_v = 1;
    }
    if ((rc = load_layer(&b, i))) goto fail;
  }
  if ((rc = model_link_shared_experts(m, err, errlen))) goto fail;
  snprintf(m->describe, sizeof m->describe, "%s (gguf): %d layers, hidden %d, vocab %d", arch, c->n_layers, c->hidden,
           c->vocab);
  *out = m;
  return 0;
fail:
  model_free(m);
  return rc;
}

/* ---- text ---- */

int gguf_model_text(const char *path, tokenizer **tok, chat_template **ct, char *err, size_t errlen) {
  *tok = NULL;
  *ct = NULL;
  gguf_file *f = NULL;
  int rc = gguf_open(&f, path, err, errlen);
  if (rc) return rc;
  tokenizer_vocab_desc d;
  tokenizer_vocab_desc_init(&d);
  const gguf_array *toks = NULL, *merges = NULL, *types = NULL, *scores = NULL;
  float *sc = NULL;
  int32_t *ty = NULL;
  if ((rc = gguf_get_str(f, "tokenizer.ggml.model", &d.model, err, errlen)) ||
      (rc = gguf_get_arr(f, "tokenizer.ggml.tokens", &toks, err, errlen)))
    goto out;
  if (toks->elem_type != GGUF_TYPE_STRING) {
    rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: tokenizer.ggml.tokens is not a string array", path);
    goto out;
  }
  const gguf_kv *k;
  if ((k = gguf_kv_find(f, "tokenizer.ggml.pre")) && k->type == GGUF_TYPE_STRING) d.pre = k->str;
  d.n_tokens = (size_t)toks->count;
  d.tokens = toks->strs;
  d.token_lens = (const size_t *)toks->lens;
  if (gguf_get_arr(f, "tokenizer.ggml.merges", &merges, NULL, 0) == 0 && merges->elem_type == GGUF_TYPE_STRING) {
    d.n_merges = (size_t)merges->count;
    d.merges = merges->strs;
    d.merge_lens = (const size_t *)merges->lens;
  }
  if (gguf_get_arr(f, "tokenizer.ggml.token_type", &types, NULL, 0) == 0 && types->count == toks->count) {
    ty = malloc((size_t)types->count * sizeof *ty);
    if (!ty) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      goto out;
    }
    for (int64_t i = 0; i < types->count; i++) ty[i] = (int32_t)gguf_array_get_i64(types, i);
    d.token_types = ty;
  }
  if (gguf_get_arr(f, "tokenizer.ggml.scores", &scores, NULL, 0) == 0 && scores->count == toks->count) {
    sc = malloc((size_t)scores->count * sizeof *sc);
    if (!sc) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      goto out;
    }
    for (int64_t i = 0; i < scores->count; i++) sc[i] = (float)gguf_array_get_f64(scores, i);
    d.scores = sc;
  }
  static const struct {
    const char *key;
    size_t off;
  } ids[] = {
      {"tokenizer.ggml.bos_token_id", offsetof(tokenizer_vocab_desc, bos_id)},
      {"tokenizer.ggml.eos_token_id", offsetof(tokenizer_vocab_desc, eos_id)},
      {"tokenizer.ggml.padding_token_id", offsetof(tokenizer_vocab_desc, pad_id)},
      {"tokenizer.ggml.unknown_token_id", offsetof(tokenizer_vocab_desc, unk_id)},
      {"tokenizer.ggml.eot_token_id", offsetof(tokenizer_vocab_desc, eot_id)},
  };
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    if ((k = gguf_kv_find(f, ids[i].key)) && kv_is_num(k) && kv_num(k) >= 0 && kv_num(k) < (double)d.n_tokens)
      *(int32_t *)((char *)&d + ids[i].off) = (int32_t)kv_num(k);
  if ((k = gguf_kv_find(f, "tokenizer.ggml.add_bos_token")) && k->type == GGUF_TYPE_BOOL) d.add_bos = k->b;
  if ((k = gguf_kv_find(f, "tokenizer.ggml.add_eos_token")) && k->type == GGUF_TYPE_BOOL) d.add_eos = k->b;
  if ((k = gguf_kv_find(f, "tokenizer.ggml.add_space_prefix")) && k->type == GGUF_TYPE_BOOL) d.add_space_prefix = k->b;
  if ((rc = tokenizer_create_from_vocab(tok, &d, err, errlen))) {
    anna_err_prefix(err, errlen, rc, "%s", path);
    goto out;
  }
  if ((k = gguf_kv_find(f, "tokenizer.chat_template")) && k->type == GGUF_TYPE_STRING) {
    char *bos = NULL, *eos = NULL;
    size_t n;
    const char *s;
    if (d.bos_id >= 0 && (s = tokenizer_token_str(*tok, d.bos_id, &n))) bos = strndup(s, n);
    if (d.eos_id >= 0 && (s = tokenizer_token_str(*tok, d.eos_id, &n))) eos = strndup(s, n);
    rc = chat_template_from_source(ct, k->str, (size_t)k->str_len, bos, eos, err, errlen);
    free(bos);
    free(eos);
    if (rc) {
      anna_err_prefix(err, errlen, rc, "%s: tokenizer.chat_template", path);
      tokenizer_free(*tok);
      *tok = NULL;
    }
  }
out:
  free(sc);
  free(ty);
  gguf_close(f);
  return rc;
}
