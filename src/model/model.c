/* model.c: building a model's weight views from a tensor source (HF safetensors here; the
 * GGUF loader reuses the same checks), with every shape verified against the config. */
#include "model/model.h"

#include "base/error.h"
#include "formats/dtype.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct builder {
  text_model *m;
  const char *prefix; /* "model." or "model.language_model." */
  char *err;
  size_t errlen;
} builder;

static int track(text_model *m, void *p) {
  if (m->n_allocs == m->cap_allocs) {
    size_t cap = m->cap_allocs ? 2 * m->cap_allocs : 64;
    void **na = realloc(m->allocs, cap * sizeof *na);
    if (!na) return ANNA_ENOMEM;
    m->allocs = na;
    m->cap_allocs = cap;
  }
  m->allocs[m->n_allocs++] = p;
  return 0;
}

void *model_alloc(text_model *m, size_t bytes) {
  void *p = calloc(1, bytes ? bytes : 1);
  if (p && track(m, p)) {
    free(p);
    return NULL;
  }
  return p;
}

static const safetensors_tensor *st_find(builder *b, const char *name) {
  return safetensors_find((const safetensors_set *)b->m->st, name);
}

static void fmt_name(char *out, size_t n, const char *fmt, va_list ap) {
  vsnprintf(out, n, fmt, ap);
}

static int shape_str(char *buf, size_t n, const safetensors_tensor *t) {
  int off = snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim; i++) off += snprintf(buf + off, n - (size_t)off, i ? ", %lld" : "%lld", (long long)t->shape[i]);
  snprintf(buf + off, n - (size_t)off, "]");
  return 0;
}

/* Matrix [rows, cols] (or [rows, 1, cols]-free plain 2-D). required=0: absent is fine. */
__attribute__((format(printf, 6, 7))) static int get_mat(builder *b, ops_weight *w, int64_t rows, int64_t cols,
                                                         int required, const char *fmt, ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  fmt_name(name, sizeof name, fmt, ap);
  va_end(ap);
  const safetensors_tensor *t = st_find(b, name);
  memset(w, 0, sizeof *w);
  if (!t) {
    if (!required) return 0;
    return anna_err(b->err, b->errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s'", b->m->path, name);
  }
  if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols) {
    char s[96];
    shape_str(s, sizeof s, t);
    return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: tensor '%s' has shape %s, expected [%lld, %lld]", t->file,
                    name, s, (long long)rows, (long long)cols);
  }
  w->type = t->dtype;
  w->data = t->data;
  w->rows = rows;
  w->cols = cols;
  if (cols > b->m->max_cols) b->m->max_cols = cols;
  return 0;
}

static void to_f32(int dtype, const void *src, float *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (dtype == ANNA_DTYPE_F32) {
      memcpy(&dst[i], (const char *)src + 4 * i, 4);
    } else {
      uint16_t h;
      memcpy(&h, (const char *)src + 2 * i, 2);
      if (dtype == ANNA_DTYPE_BF16) {
        uint32_t u = (uint32_t)h << 16;
        memcpy(&dst[i], &u, 4);
      } else {
        /* IEEE half -> float */
        uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023, u;
        if (exp == 0) {
          float f = ldexpf((float)man, -24);
          memcpy(&u, &f, 4);
          u |= sign;
        } else if (exp == 31) {
          u = sign | 0x7f800000u | (man << 13);
        } else {
          u = sign | ((exp + 112) << 23) | (man << 13);
        }
        memcpy(&dst[i], &u, 4);
      }
    }
  }
}

/* Vector of n elements (any leading shape whose product is n), converted to f32. */
__attribute__((format(printf, 5, 6))) static int get_vec(builder *b, float **out, int64_t n, int required,
                                                         const char *fmt, ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  fmt_name(name, sizeof name, fmt, ap);
  va_end(ap);
  *out = NULL;
  const safetensors_tensor *t = st_find(b, name);
  if (!t) {
    if (!required) return 0;
    return anna_err(b->err, b->errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s'", b->m->path, name);
  }
  int64_t nel = 1;
  for (int i = 0; i < t->ndim; i++) nel *= t->shape[i];
  if (nel != n) {
    char s[96];
    shape_str(s, sizeof s, t);
    return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: tensor '%s' has shape %s, expected %lld elements",
                    t->file, name, s, (long long)n);
  }
  float *v = model_alloc(b->m, (size_t)n * sizeof(float));
  if (!v) return anna_err(b->err, b->errlen, ANNA_ENOMEM, "out of memory");
  to_f32(t->dtype, t->data, v, n);
  *out = v;
  return 0;
}

/* Experts: fused [E, rows, cols] tensors, or per-expert 2-D tensors. */
static int get_experts(builder *b, ops_weight **out, int E, int64_t rows, int64_t cols, const char *fused,
                       const char *per_fmt, int layer) {
  ops_weight *arr = model_alloc(b->m, (size_t)E * sizeof *arr);
  if (!arr) return anna_err(b->err, b->errlen, ANNA_ENOMEM, "out of memory");
  *out = arr;
  char name[256];
  snprintf(name, sizeof name, "%slayers.%d.%s", b->prefix, layer, fused);
  const safetensors_tensor *t = st_find(b, name);
  if (t) {
    if (t->ndim != 3 || t->shape[0] != E || t->shape[1] != rows || t->shape[2] != cols) {
      char s[96];
      shape_str(s, sizeof s, t);
      return anna_err(b->err, b->errlen, ANNA_EFORMAT, "%s: tensor '%s' has shape %s, expected [%d, %lld, %lld]",
                      t->file, name, s, E, (long long)rows, (long long)cols);
    }
    size_t per = (size_t)dtype_row_bytes(t->dtype, cols) * (size_t)rows;
    for (int e = 0; e < E; e++)
      arr[e] = (ops_weight){t->dtype, (const char *)t->data + per * (size_t)e, rows, cols};
    if (cols > b->m->max_cols) b->m->max_cols = cols;
    return 0;
  }
  if (!per_fmt) return anna_err(b->err, b->errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s'", b->m->path, name);
  for (int e = 0; e < E; e++) {
    char pn[256];
    snprintf(pn, sizeof pn, per_fmt, e);
    int rc = get_mat(b, &arr[e], rows, cols, 1, "%slayers.%d.%s", b->prefix, layer, pn);
    if (rc) return rc;
  }
  return 0;
}

static int load_attention(builder *b, int i) {
  const model_config *c = &b->m->cfg;
  const layer_config *lc = &c->layers[i];
  layer_weights *w = &b->m->layers[i];
  const char *P = b->prefix;
  const int64_t H = c->hidden, D = lc->head_dim, Hq = c->n_heads, Hkv = lc->n_kv_heads;
  const int shared = lc->kv_source != i;
  int rc;
  if ((rc = get_mat(b, &w->q, Hq * D * (c->attn_out_gate ? 2 : 1), H, 1, "%slayers.%d.self_attn.q_proj.weight", P, i)) ||
      (rc = get_mat(b, &w->o, H, Hq * D, 1, "%slayers.%d.self_attn.o_proj.weight", P, i)))
    return rc;
  if (!shared) {
    if ((rc = get_mat(b, &w->k, Hkv * D, H, 1, "%slayers.%d.self_attn.k_proj.weight", P, i))) return rc;
    int need_v = !(c->k_eq_v && lc->kind == LAYER_KIND_ATTN);
    if ((rc = get_mat(b, &w->v, Hkv * D, H, need_v, "%slayers.%d.self_attn.v_proj.weight", P, i))) return rc;
  }
  if (c->attn_bias) {
    if ((rc = get_vec(b, &w->q_bias, Hq * D, 0, "%slayers.%d.self_attn.q_proj.bias", P, i)) ||
        (rc = get_vec(b, &w->k_bias, Hkv * D, 0, "%slayers.%d.self_attn.k_proj.bias", P, i)) ||
        (rc = get_vec(b, &w->v_bias, Hkv * D, 0, "%slayers.%d.self_attn.v_proj.bias", P, i)))
      return rc;
  }
  if (c->qk_norm) {
    if ((rc = get_vec(b, &w->q_norm, D, 1, "%slayers.%d.self_attn.q_norm.weight", P, i))) return rc;
    if (!shared && (rc = get_vec(b, &w->k_norm, D, 1, "%slayers.%d.self_attn.k_norm.weight", P, i))) return rc;
    /* YaRN's attention factor on the rotated dims, where config_rope_fold put it here. */
    config_rope_fold_norm(c, lc, w->q_norm);
    config_rope_fold_norm(c, lc, w->k_norm);
  }
  w->inv_freq = model_alloc(b->m, (size_t)(lc->rope_dims / 2 + 1) * sizeof(float));
  if (!w->inv_freq) return anna_err(b->err, b->errlen, ANNA_ENOMEM, "out of memory");
  config_rope_inv_freq(lc, w->inv_freq);
  return 0;
}

static int load_gdn(builder *b, int i) {
  const model_config *c = &b->m->cfg;
  layer_weights *w = &b->m->layers[i];
  const char *P = b->prefix;
  const int64_t H = c->hidden, Kd = (int64_t)c->gdn_hk * c->gdn_dk, Vd = (int64_t)c->gdn_hv * c->gdn_dv;
  const int64_t conv_dim = 2 * Kd + Vd;
  int rc;
  if ((rc = get_mat(b, &w->qkv, conv_dim, H, 1, "%slayers.%d.linear_attn.in_proj_qkv.weight", P, i)) ||
      (rc = get_mat(b, &w->z, Vd, H, 1, "%slayers.%d.linear_attn.in_proj_z.weight", P, i)) ||
      (rc = get_mat(b, &w->b, c->gdn_hv, H, 1, "%slayers.%d.linear_attn.in_proj_b.weight", P, i)) ||
      (rc = get_mat(b, &w->a, c->gdn_hv, H, 1, "%slayers.%d.linear_attn.in_proj_a.weight", P, i)) ||
      (rc = get_mat(b, &w->out, H, Vd, 1, "%slayers.%d.linear_attn.out_proj.weight", P, i)) ||
      (rc = get_vec(b, &w->conv_w, conv_dim * c->gdn_conv, 1, "%slayers.%d.linear_attn.conv1d.weight", P, i)) ||
      (rc = get_vec(b, &w->a_log, c->gdn_hv, 1, "%slayers.%d.linear_attn.A_log", P, i)) ||
      (rc = get_vec(b, &w->dt_bias, c->gdn_hv, 1, "%slayers.%d.linear_attn.dt_bias", P, i)) ||
      (rc = get_vec(b, &w->gdn_norm, c->gdn_dv, 1, "%slayers.%d.linear_attn.norm.weight", P, i)))
    return rc;
  return 0;
}

static int load_mlp(builder *b, int i, int64_t ffn) {
  layer_weights *w = &b->m->layers[i];
  const int64_t H = b->m->cfg.hidden;
  const char *P = b->prefix;
  int rc;
  if ((rc = get_mat(b, &w->gate, ffn, H, 1, "%slayers.%d.mlp.gate_proj.weight", P, i)) ||
      (rc = get_mat(b, &w->up, ffn, H, 1, "%slayers.%d.mlp.up_proj.weight", P, i)) ||
      (rc = get_mat(b, &w->down, H, ffn, 1, "%slayers.%d.mlp.down_proj.weight", P, i)))
    return rc;
  return 0;
}

static int load_moe(builder *b, int i) {
  const model_config *c = &b->m->cfg;
  layer_weights *w = &b->m->layers[i];
  const int64_t H = c->hidden, I = c->expert_ffn;
  const int E = c->n_experts;
  const char *P = b->prefix;
  int rc;
  if (c->arch == MODEL_ARCH_GEMMA4) {
    if ((rc = get_mat(b, &w->router, E, H, 1, "%slayers.%d.router.proj.weight", P, i)) ||
        (rc = get_vec(b, &w->router_scale, H, 1, "%slayers.%d.router.scale", P, i)) ||
        (rc = get_vec(b, &w->per_expert_scale, E, 1, "%slayers.%d.router.per_expert_scale", P, i)) ||
        (rc = get_experts(b, &w->exp_gate, E, 2 * I, H, "experts.gate_up_proj", NULL, i)) ||
        (rc = get_experts(b, &w->exp_down, E, H, I, "experts.down_proj", NULL, i)) ||
        (rc = get_vec(b, &w->post_ff_norm1, H, 1, "%slayers.%d.post_feedforward_layernorm_1.weight", P, i)) ||
        (rc = get_vec(b, &w->pre_ff_norm2, H, 1, "%slayers.%d.pre_feedforward_layernorm_2.weight", P, i)) ||
        (rc = get_vec(b, &w->post_ff_norm2, H, 1, "%slayers.%d.post_feedforward_layernorm_2.weight", P, i)))
      return rc;
    return 0;
  }
  if ((rc = get_mat(b, &w->router, E, H, 1, "%slayers.%d.mlp.gate.weight", P, i))) return rc;
  char fused[128];
  snprintf(fused, sizeof fused, "%slayers.%d.mlp.experts.gate_up_proj", P, i);
  if (st_find(b, fused)) {
    if ((rc = get_experts(b, &w->exp_gate, E, 2 * I, H, "mlp.experts.gate_up_proj", NULL, i)) ||
        (rc = get_experts(b, &w->exp_down, E, H, I, "mlp.experts.down_proj", NULL, i)))
      return rc;
  } else {
    if ((rc = get_experts(b, &w->exp_gate, E, I, H, "mlp.experts.gate_proj", "mlp.experts.%d.gate_proj.weight", i)) ||
        (rc = get_experts(b, &w->exp_up, E, I, H, "mlp.experts.up_proj", "mlp.experts.%d.up_proj.weight", i)) ||
        (rc = get_experts(b, &w->exp_down, E, H, I, "mlp.experts.down_proj", "mlp.experts.%d.down_proj.weight", i)))
      return rc;
  }
  if (c->shared_ffn > 0) {
    w->has_shared = 1;
    const int64_t S = c->shared_ffn;
    if ((rc = get_mat(b, &w->sh_gate, S, H, 1, "%slayers.%d.mlp.shared_expert.gate_proj.weight", P, i)) ||
        (rc = get_mat(b, &w->sh_up, S, H, 1, "%slayers.%d.mlp.shared_expert.up_proj.weight", P, i)) ||
        (rc = get_mat(b, &w->sh_down, H, S, 1, "%slayers.%d.mlp.shared_expert.down_proj.weight", P, i)) ||
        (rc = get_mat(b, &w->sh_gate_inp, 1, H, 1, "%slayers.%d.mlp.shared_expert_gate.weight", P, i)))
      return rc;
  }
  return 0;
}

static int load_layer(builder *b, int i) {
  const model_config *c = &b->m->cfg;
  const layer_config *lc = &c->layers[i];
  layer_weights *w = &b->m->layers[i];
  const char *P = b->prefix;
  const int64_t H = c->hidden;
  int rc;
  if ((rc = get_vec(b, &w->attn_norm, H, 1, "%slayers.%d.input_layernorm.weight", P, i)) ||
      (rc = get_vec(b, &w->post_attn_norm, H, 1, "%slayers.%d.post_attention_layernorm.weight", P, i)))
    return rc;
  if (c->post_norms) {
    if ((rc = get_vec(b, &w->pre_ff_norm, H, 1, "%slayers.%d.pre_feedforward_layernorm.weight", P, i)) ||
        (rc = get_vec(b, &w->post_ff_norm, H, 1, "%slayers.%d.post_feedforward_layernorm.weight", P, i)))
      return rc;
  } else {
    /* Qwen/Llama naming: post_attention_layernorm is the pre-FFN norm. */
    w->pre_ff_norm = w->post_attn_norm;
    w->post_attn_norm = NULL;
  }
  rc = lc->kind == LAYER_KIND_GDN ? load_gdn(b, i) : load_attention(b, i);
  if (rc) return rc;
  if (lc->ffn_dim > 0 && (rc = load_mlp(b, i, lc->ffn_dim))) return rc;
  if (lc->is_moe && (rc = load_moe(b, i))) return rc;
  w->layer_scalar = 1.0f;
  if (c->arch == MODEL_ARCH_GEMMA4) {
    float *ls = NULL;
    if ((rc = get_vec(b, &ls, 1, 0, "%slayers.%d.layer_scalar", P, i))) return rc;
    if (ls) w->layer_scalar = ls[0];
    if (c->ple_dim > 0) {
      if ((rc = get_mat(b, &w->ple_gate, c->ple_dim, H, 1, "%slayers.%d.per_layer_input_gate.weight", P, i)) ||
          (rc = get_mat(b, &w->ple_proj, H, c->ple_dim, 1, "%slayers.%d.per_layer_projection.weight", P, i)) ||
          (rc = get_vec(b, &w->ple_post_norm, H, 1, "%slayers.%d.post_per_layer_input_norm.weight", P, i)))
        return rc;
    }
  }
  return 0;
}

/* The shared expert joins the routed ones when a kernel over the E + 1 could not tell it
 * apart: the same intermediate size and weight types, separate gate and up (a fused gate_up
 * expert would need the shared gate and up rows adjacent in memory, which they are not). */
static int shared_fits(const model_config *c, const layer_weights *w) {
  if (!w->has_shared || !w->exp_gate || !w->exp_up || !w->exp_down || w->per_expert_scale) return 0;
  const ops_weight *g = &w->exp_gate[0], *u = &w->exp_up[0], *d = &w->exp_down[0];
  return c->n_experts >= 1 && w->sh_gate_inp.rows == 1 && w->sh_gate.type == g->type && w->sh_gate.rows == g->rows &&
         w->sh_gate.cols == g->cols && w->sh_up.type == u->type && w->sh_up.rows == u->rows &&
         w->sh_up.cols == u->cols && w->sh_down.type == d->type && w->sh_down.rows == d->rows &&
         w->sh_down.cols == d->cols;
}

int model_link_shared_experts(text_model *m, char *err, size_t errlen) {
  const model_config *c = &m->cfg;
  for (int i = 0; i < c->n_layers; i++) {
    layer_weights *w = &m->layers[i];
    if (!c->layers[i].is_moe || !shared_fits(c, w)) continue;
    const int E = c->n_experts;
    ops_weight *const src[3] = {w->exp_gate, w->exp_up, w->exp_down};
    const ops_weight sh[3] = {w->sh_gate, w->sh_up, w->sh_down};
    ops_weight *dst[3];
    for (int j = 0; j < 3; j++) {
      if (!(dst[j] = model_alloc(m, ((size_t)E + 1) * sizeof(ops_weight))))
        return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      memcpy(dst[j], src[j], (size_t)E * sizeof(ops_weight));
      dst[j][E] = sh[j];
    }
    w->sx_gate = dst[0], w->sx_up = dst[1], w->sx_down = dst[2];
  }
  return 0;
}

_Static_assert(CONFIG_MAX_LAYERS <= OPS_MAX_LAYERS, "ops_model_shape holds every layer");

static int64_t shape_w_bytes(const ops_weight *w) {
  return w->data && w->rows > 0 ? dtype_row_bytes(w->type, w->cols) * w->rows : 0;
}

void model_shape_get(const text_model *m, int n_ctx, ops_model_shape *out) {
  const model_config *c = &m->cfg;
  memset(out, 0, sizeof *out);
  out->max_cols = m->max_cols;
  out->n_ctx = n_ctx;
  out->vocab = c->vocab;
  out->n_heads = c->n_heads;
  out->gdn_dk = c->gdn_dk;
  out->gdn_dv = c->gdn_dv;
  out->n_layers = c->n_layers;
  if (m->gguf && gguf_tensor_count(m->gguf) > 0) {
    /* the mapping's start, from any tensor: its data lies at data_offset + offset */
    const gguf_tensor *t = gguf_tensor_at(m->gguf, 0);
    out->weights_file = m->path;
    out->weights_map = (const char *)t->data - gguf_data_offset(m->gguf) - t->offset;
    out->weights_map_bytes = (int64_t)gguf_file_size(m->gguf);
  }
  out->dense_weight_bytes = shape_w_bytes(&m->embed) + shape_w_bytes(&m->ple_embed) +
                            shape_w_bytes(&m->ple_model_proj) +
                            (m->lm_head.data != m->embed.data ? shape_w_bytes(&m->lm_head) : 0);
  out->embed_weight_bytes = shape_w_bytes(&m->embed) + shape_w_bytes(&m->ple_embed) + shape_w_bytes(&m->ple_model_proj);
  out->head_weight_bytes = shape_w_bytes(&m->lm_head);
  for (int i = 0; i < c->n_layers; i++) {
    const layer_weights *w = &m->layers[i];
    ops_layer_shape *ls = &out->layers[i];
    *ls = (ops_layer_shape){c->layers[i].n_kv_heads, c->layers[i].head_dim, NULL, NULL, NULL, 0, 0};
    const ops_weight *ws[] = {&w->q,      &w->k,      &w->v,       &w->o,           &w->qkv,      &w->z,
                              &w->b,      &w->a,      &w->out,     &w->gate,        &w->up,       &w->down,
                              &w->router, &w->sh_gate, &w->sh_up,  &w->sh_down,     &w->sh_gate_inp, &w->ple_gate,
                              &w->ple_proj};
    for (size_t j = 0; j < sizeof ws / sizeof ws[0]; j++) ls->weight_bytes += shape_w_bytes(ws[j]);
    out->dense_weight_bytes += ls->weight_bytes;
    for (int e = 0; w->exp_gate && e < c->n_experts; e++)
      ls->weight_bytes += shape_w_bytes(&w->exp_gate[e]) + (w->exp_up ? shape_w_bytes(&w->exp_up[e]) : 0) +
                          shape_w_bytes(&w->exp_down[e]);
    if (!c->layers[i].is_moe || !w->exp_gate) continue;
    /* the arrays forward.c passes to moe_ffn on a backend with matmul_group_route */
    const int sx = w->sx_gate && w->router.rows == c->n_experts;
    ls->exp_gate = sx ? w->sx_gate : w->exp_gate;
    ls->exp_up = sx ? w->sx_up : w->exp_up;
    ls->exp_down = sx ? w->sx_down : w->exp_down;
    ls->n_exp = sx ? c->n_experts + 1 : c->n_experts;
    /* the linked shared expert is an expert slot now, not a dense weight */
    if (sx) out->dense_weight_bytes -= shape_w_bytes(&w->sh_gate) + shape_w_bytes(&w->sh_up) + shape_w_bytes(&w->sh_down);
  }
}

/* A one-layer decoder beside m for its MTP head: the config of m's first full-attention layer
 * (the head's layer is full attention whatever the main pattern), the file mapping, embed and
 * lm_head borrowed. The caller loads the layer's weights into layers[0]. */
static int mtp_alloc(text_model *m, char *err, size_t errlen) {
  const model_config *c = &m->cfg;
  int a = -1;
  for (int i = 0; i < c->n_layers && a < 0; i++)
    if (c->layers[i].kind == LAYER_KIND_ATTN) a = i;
  if (a < 0) return anna_err(err, errlen, ANNA_EFORMAT, "%s: an MTP head needs a full-attention layer to copy", m->path);
  mtp_head *h = calloc(1, sizeof *h);
  text_model *d = calloc(1, sizeof *d);
  if (!h || !d || !(d->path = strdup(m->path))) {
    free(h);
    free(d);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  d->cfg = *c;
  d->cfg.n_layers = 1;
  d->cfg.layers[0] = c->layers[a];
  d->cfg.layers[0].kv_source = 0;
  d->cfg.ple_dim = 0;
  d->st = m->st;
  d->gguf = m->gguf;
  d->embed = m->embed;
  d->lm_head = m->lm_head;
  h->dec = d;
  m->mtp = h;
  snprintf(d->describe, sizeof d->describe, "%s MTP head", c->model_type);
  return 0;
}

int model_mtp_finish(text_model *m, char *err, size_t errlen) {
  text_model *d = m->mtp->dec;
  if (d->max_cols > m->max_cols) m->max_cols = d->max_cols; /* the backend sizes dequant scratch from m */
  return model_link_shared_experts(d, err, errlen);
}

/* `mtp.*` when present (Qwen3.5 / Qwen3.5-MoE checkpoints): the head's layer loads through the
 * same builder as the main layers, under the prefix "mtp.". */
static int load_mtp_hf(builder *b) {
  text_model *m = b->m;
  if (!st_find(b, "mtp.fc.weight")) return 0;
  if (m->cfg.arch != MODEL_ARCH_QWEN3_5 && m->cfg.arch != MODEL_ARCH_QWEN3_5_MOE)
    return anna_err(b->err, b->errlen, ANNA_EUNSUPPORTED, "%s: mtp.* tensors in a %s model", m->path,
                    m->cfg.model_type);
  int rc = mtp_alloc(m, b->err, b->errlen);
  if (rc) return rc;
  mtp_head *h = m->mtp;
  builder bd = {h->dec, "mtp.", b->err, b->errlen};
  const int64_t H = m->cfg.hidden;
  if ((rc = load_layer(&bd, 0)) || (rc = get_vec(&bd, &h->dec->final_norm, H, 1, "mtp.norm.weight")) ||
      (rc = get_mat(&bd, &h->fc, H, 2 * H, 1, "mtp.fc.weight")) ||
      (rc = get_vec(&bd, &h->norm_e, H, 1, "mtp.pre_fc_norm_embedding.weight")) ||
      (rc = get_vec(&bd, &h->norm_h, H, 1, "mtp.pre_fc_norm_hidden.weight")))
    return rc;
  return model_mtp_finish(m, b->err, b->errlen);
}

int model_load_hf(text_model **out, const char *dir, char *err, size_t errlen) {
  *out = NULL;
  text_model *m = calloc(1, sizeof *m);
  if (!m) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  int rc;
  char path[PATH_MAX];
  m->path = strdup(dir);
  if (!m->path) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    goto fail;
  }
  snprintf(path, sizeof path, "%s/config.json", dir);
  if ((rc = config_parse_hf(&m->cfg, path, err, errlen))) goto fail;
  safetensors_set *st = NULL;
  if ((rc = safetensors_open(&st, dir, err, errlen))) goto fail;
  m->st = st;
  builder b = {m, "model.", err, errlen};
  if (safetensors_find(st, "model.language_model.embed_tokens.weight")) b.prefix = "model.language_model.";
  /* Qwen3-ASR's original layout: the decoder is the thinker's; its lm_head, when absent, is tied */
  const char *lm_head = "lm_head.weight";
  if (safetensors_find(st, "thinker.model.embed_tokens.weight")) {
    b.prefix = "thinker.model.";
    lm_head = "thinker.lm_head.weight";
    if (!safetensors_find(st, lm_head)) m->cfg.tie_embeddings = 1;
  }
  const model_config *c = &m->cfg;
  if ((rc = get_mat(&b, &m->embed, c->vocab, c->hidden, 1, "%sembed_tokens.weight", b.prefix)) ||
      (rc = get_vec(&b, &m->final_norm, c->hidden, 1, "%snorm.weight", b.prefix)))
    goto fail;
  if (c->tie_embeddings || !safetensors_find(st, lm_head)) {
    if (!c->tie_embeddings) {
      rc = anna_err(err, errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s' (embeddings are not tied)", dir, lm_head);
      goto fail;
    }
    m->lm_head = m->embed;
  } else if ((rc = get_mat(&b, &m->lm_head, c->vocab, c->hidden, 1, "%s", lm_head))) {
    goto fail;
  }
  if (c->arch == MODEL_ARCH_GEMMA4 && c->ple_dim > 0) {
    const int64_t LP = (int64_t)c->n_layers * c->ple_dim;
    if ((rc = get_mat(&b, &m->ple_embed, c->ple_vocab, LP, 1, "%sembed_tokens_per_layer.weight", b.prefix)) ||
        (rc = get_mat(&b, &m->ple_model_proj, LP, c->hidden, 1, "%sper_layer_model_projection.weight", b.prefix)) ||
        (rc = get_vec(&b, &m->ple_proj_norm, c->ple_dim, 1, "%sper_layer_projection_norm.weight", b.prefix)))
      goto fail;
  }
  for (int i = 0; i < c->n_layers; i++)
    if ((rc = load_layer(&b, i))) goto fail;
  if ((rc = model_link_shared_experts(m, err, errlen))) goto fail;
  if (b.prefix[0] == 'm' && (rc = load_mtp_hf(&b))) goto fail; /* not under thinker.* */
  snprintf(m->describe, sizeof m->describe, "%s: %d layers, hidden %d, vocab %d%s", c->model_type, c->n_layers,
           c->hidden, c->vocab, m->mtp ? ", MTP head" : "");
  *out = m;
  return 0;
fail:
  model_free(m);
  return rc;
}

int model_load_hf_named(text_model **out, const char *dir, const model_config *cfg, const char *prefix,
                        const char *embed, const char *norm, const char *lm_head, char *err, size_t errlen) {
  *out = NULL;
  text_model *m = calloc(1, sizeof *m);
  if (!m) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  int rc;
  m->cfg = *cfg;
  if (!(m->path = strdup(dir))) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    goto fail;
  }
  safetensors_set *st = NULL;
  if ((rc = safetensors_open(&st, dir, err, errlen))) goto fail;
  m->st = st;
  builder b = {m, prefix, err, errlen};
  const model_config *c = &m->cfg;
  if ((rc = get_mat(&b, &m->embed, c->vocab, c->hidden, 1, "%s", embed)) ||
      (rc = get_vec(&b, &m->final_norm, c->hidden, 1, "%s", norm)) ||
      (rc = get_mat(&b, &m->lm_head, c->vocab, c->hidden, 1, "%s", lm_head)))
    goto fail;
  for (int i = 0; i < c->n_layers; i++)
    if ((rc = load_layer(&b, i))) goto fail;
  snprintf(m->describe, sizeof m->describe, "%s%s: %d layers, hidden %d, vocab %d", prefix, c->model_type,
           c->n_layers, c->hidden, c->vocab);
  *out = m;
  return 0;
fail:
  model_free(m);
  return rc;
}

void model_free(text_model *m) {
  if (!m) return;
  if (m->mtp) {
    if (m->mtp->dec) { /* its mapping is m's */
      m->mtp->dec->st = NULL;
      m->mtp->dec->gguf = NULL;
    }
    model_free(m->mtp->dec);
    free(m->mtp);
  }
  for (size_t i = 0; i < m->n_allocs; i++) free(m->allocs[i]);
  free(m->allocs);
  safetensors_close(m->st);
  gguf_close(m->gguf);
  free(m->path);
  free(m);
}
