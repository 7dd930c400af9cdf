/* shard.c: tensor-parallel shards of a text_model (shard.h). */
#include "model/shard.h"

#include "base/error.h"
#include "formats/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A range of units (heads, rows, columns): [at, at + len). */
typedef struct seg {
  int64_t at, len;
} seg;

/* Enough for GGUF's tiled GDN value heads: one range per key-head repeat (hv / hk). */
#define SEG_MAX 64

static int64_t seg_total(const seg *sg, int ns) {
  int64_t t = 0;
  for (int i = 0; i < ns; i++)
    t += sg[i].len;
  return t;
}

/* out[i] = (off + in[i].at * unit, in[i].len * unit) */
static void seg_scale(seg *out, const seg *in, int ns, int64_t unit, int64_t off) {
  for (int i = 0; i < ns; i++)
    out[i] = (seg){off + in[i].at * unit, in[i].len * unit};
}

/* The rows sg of w: a view for one range, else a copy owned by s. */
static int rows_take(text_model *s, const ops_weight *w, const seg *sg, int ns, ops_weight *out,
                     const char *what, char *err, size_t errlen) {
  if (!w->data) {
    *out = *w;
    return 0;
  }
  const int64_t rb = dtype_row_bytes(w->type, w->cols), total = seg_total(sg, ns);
  for (int i = 0; i < ns; i++)
    if (sg[i].at < 0 || sg[i].at + sg[i].len > w->rows)
      return anna_err(err, errlen, ANNA_EINVAL, "tensor parallel: %s rows %lld..%lld of %lld", what,
                      (long long)sg[i].at, (long long)(sg[i].at + sg[i].len), (long long)w->rows);
  if (rb <= 0)
    return anna_err(err, errlen, ANNA_EINVAL, "tensor parallel: %s has an unknown row size", what);
  *out = (ops_weight){.type = w->type, .rows = total, .cols = w->cols};
  if (ns == 1) {
    out->data = (const char *)w->data + sg[0].at * rb;
    return 0;
  }
  char *buf = model_alloc(s, (size_t)(total * rb));
  if (!buf) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  for (int i = 0, at = 0; i < ns; at += (int)sg[i].len, i++)
    memcpy(buf + (int64_t)at * rb, (const char *)w->data + sg[i].at * rb, (size_t)(sg[i].len * rb));
  out->data = buf;
  return 0;
}

/* Whether the column ranges sg fall on w's block boundaries (a quantized row is split only
 * between blocks). */
static int cols_aligned(const ops_weight *w, const seg *sg, int ns) {
  if (!w->data) return 1;
  const int64_t bs = dtype_block_size(w->type);
  if (bs <= 0) return 0;
  for (int i = 0; i < ns; i++)
    if (sg[i].at % bs || sg[i].len % bs) return 0;
  return 1;
}

/* The columns sg of every row of w, copied (owned by s). */
static int cols_take(text_model *s, const ops_weight *w, const seg *sg, int ns, ops_weight *out,
                     const char *what, char *err, size_t errlen) {
  if (!w->data) {
    *out = *w;
    return 0;
  }
  if (!cols_aligned(w, sg, ns))
    return anna_err(err, errlen, ANNA_EINVAL,
                    "tensor parallel: %s columns are not on its %s blocks", what,
                    dtype_name(w->type));
  const int64_t total = seg_total(sg, ns), rb = dtype_row_bytes(w->type, w->cols),
                nrb = dtype_row_bytes(w->type, total);
  for (int i = 0; i < ns; i++)
    if (sg[i].at < 0 || sg[i].at + sg[i].len > w->cols)
      return anna_err(err, errlen, ANNA_EINVAL, "tensor parallel: %s columns %lld..%lld of %lld",
                      what, (long long)sg[i].at, (long long)(sg[i].at + sg[i].len),
                      (long long)w->cols);
  char *buf = model_alloc(s, (size_t)(w->rows * nrb));
  if (!buf) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  for (int64_t r = 0; r < w->rows; r++) {
    const char *src = (const char *)w->data + r * rb;
    char *dst = buf + r * nrb;
    for (int i = 0; i < ns; i++) {
      const int64_t b = dtype_row_bytes(w->type, sg[i].len);
      memcpy(dst, src + dtype_row_bytes(w->type, sg[i].at), (size_t)b);
      dst += b;
    }
  }
  *out = (ops_weight){.type = w->type, .data = buf, .rows = w->rows, .cols = total};
  return 0;
}

/* The elements sg of an f32 vector (NULL stays NULL), copied. */
static int vec_take(text_model *s, const float *v, const seg *sg, int ns, float **out, char *err,
                    size_t errlen) {
  *out = NULL;
  if (!v) return 0;
  float *d = model_alloc(s, sizeof(float) * (size_t)seg_total(sg, ns));
  if (!d) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  for (int i = 0, at = 0; i < ns; at += (int)sg[i].len, i++)
    memcpy(d + at, v + sg[i].at, sizeof(float) * (size_t)sg[i].len);
  *out = d;
  return 0;
}

/* The value heads of GDN shard rank of n, as ranges (see shard.h). */
static int gdn_vheads(const model_config *c, int rank, int n, seg *sg) {
  const int hk = c->gdn_hk, hv = c->gdn_hv;
  if (!c->gdn_v_tiled) {
    sg[0] = (seg){(int64_t)rank * hv / n, hv / n};
    return 1;
  }
  const int rep = hv / hk, kn = hk / n;
  for (int t = 0; t < rep; t++)
    sg[t] = (seg){(int64_t)t * hk + (int64_t)rank * kn, kn};
  return rep;
}

int model_shard_check(const text_model *m, int n, char *err, size_t errlen) {
  const model_config *c = &m->cfg;
  if (n == 1) return 0;
  if (n < 1 || n > SHARD_MAX)
    return anna_err(err, errlen, ANNA_EINVAL, "--tensor-parallel %d: expected 1..%d", n, SHARD_MAX);
  if (c->arch == MODEL_ARCH_GEMMA4 || c->ple_dim > 0 || c->n_kv_shared > 0)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "--tensor-parallel: %s models are not split yet (per-layer inputs, "
                    "KV sharing, the Gemma4 MoE block)",
                    c->model_type);
  if (c->n_heads % n)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "--tensor-parallel %d: %d attention heads do not divide by %d", n, c->n_heads,
                    n);
  for (int l = 0; l < c->n_layers; l++) {
    const layer_config *lc = &c->layers[l];
    const layer_weights *w = &m->layers[l];
    seg sg[SEG_MAX];
    if (lc->kind == LAYER_KIND_GDN) {
      if (c->gdn_hk % n || c->gdn_hv % n)
        return anna_err(err, errlen, ANNA_EINVAL,
                        "--tensor-parallel %d: layer %d has %d key heads and %d value heads (GDN); "
                        "both must divide "
                        "by %d",
                        n, l, c->gdn_hk, c->gdn_hv, n);
      seg cs[SEG_MAX];
      const int ns = gdn_vheads(c, 0, n, sg);
      if (ns > SEG_MAX)
        return anna_err(err, errlen, ANNA_EUNSUPPORTED, "--tensor-parallel: GDN head ratio %d", ns);
      seg_scale(cs, sg, ns, c->gdn_dv, 0);
      if (!cols_aligned(&w->out, cs, ns))
        return anna_err(err, errlen, ANNA_EINVAL,
                        "--tensor-parallel %d: layer %d out_proj (%s) cannot be split "
                        "between its blocks at %d value heads of %d",
                        n, l, dtype_name(w->out.type), c->gdn_hv / n, c->gdn_dv);
    } else {
      if (lc->n_kv_heads % n)
        return anna_err(err, errlen, ANNA_EINVAL,
                        "--tensor-parallel %d: layer %d has %d KV heads, which do not "
                        "divide by %d",
                        n, l, lc->n_kv_heads, n);
      sg[0] = (seg){0, (int64_t)c->n_heads / n * lc->head_dim};
      if (!cols_aligned(&w->o, sg, 1))
        return anna_err(err, errlen, ANNA_EINVAL,
                        "--tensor-parallel %d: layer %d o_proj (%s) cannot be split "
                        "between its blocks at %lld columns",
                        n, l, dtype_name(w->o.type), (long long)sg[0].len);
    }
    if (w->gate.data) {
      if (w->gate.rows % n)
        return anna_err(err, errlen, ANNA_EINVAL,
                        "--tensor-parallel %d: layer %d intermediate size %lld does not "
                        "divide by %d",
                        n, l, (long long)w->gate.rows, n);
      sg[0] = (seg){0, w->gate.rows / n};
      if (!cols_aligned(&w->down, sg, 1))
        return anna_err(err, errlen, ANNA_EINVAL,
                        "--tensor-parallel %d: layer %d down_proj (%s) cannot be split "
                        "between its blocks at %lld columns",
                        n, l, dtype_name(w->down.type), (long long)sg[0].len);
    }
    if (lc->is_moe && w->exp_down) {
      const int64_t I = w->exp_down[0].cols;
      sg[0] = (seg){0, I / n};
      if (I % n || !cols_aligned(&w->exp_down[0], sg, 1))
        return anna_err(err, errlen, ANNA_EINVAL,
                        "--tensor-parallel %d: layer %d expert intermediate size %lld "
                        "does not split by %d (on %s blocks)",
                        n, l, (long long)I, n, dtype_name(w->exp_down[0].type));
    }
    if (lc->is_moe && w->has_shared) {
      const int64_t I = w->sh_down.cols;
      sg[0] = (seg){0, I / n};
      if (I % n || !cols_aligned(&w->sh_down, sg, 1))
        return anna_err(err, errlen, ANNA_EINVAL,
                        "--tensor-parallel %d: layer %d shared expert intermediate size "
                        "%lld does not split by %d (on %s blocks)",
                        n, l, (long long)I, n, dtype_name(w->sh_down.type));
    }
  }
  return 0;
}

/* gate / up rows and down columns [rank*I/n, ...) of one MLP (fused gate_up: up NULL, gate
 * holds 2I rows, both halves taken). */
static int mlp_take(text_model *s, const ops_weight *gate, const ops_weight *up,
                    const ops_weight *down, int rank, int n, ops_weight *og, ops_weight *ou,
                    ops_weight *od, char *err, size_t errlen) {
  const int64_t I = down->cols, k = I / n;
  seg sg[2] = {{rank * k, k}, {I + rank * k, k}};
  int rc = rows_take(s, gate, sg, up && up->data ? 1 : 2, og, "gate_proj", err, errlen);
  if (!rc && up) rc = rows_take(s, up, sg, 1, ou, "up_proj", err, errlen);
  if (!rc) rc = cols_take(s, down, sg, 1, od, "down_proj", err, errlen);
  return rc;
}

static int layer_take(text_model *s, const text_model *m, int l, int rank, int n, char *err,
                      size_t errlen) {
  const model_config *c = &m->cfg;
  const layer_config *lc = &c->layers[l];
  const layer_weights *w = &m->layers[l];
  layer_weights *o = &s->layers[l];
  int rc = 0;
  seg sg[SEG_MAX], t[SEG_MAX];
  if (lc->kind == LAYER_KIND_GDN) {
    const int64_t hk = c->gdn_hk, dk = c->gdn_dk, dv = c->gdn_dv, Kd = hk * dk, kn = hk / n;
    const int nv = gdn_vheads(c, rank, n, sg);
    /* qkv rows and conv channels: q heads, k heads, then the value heads' rows */
    seg q[SEG_MAX + 2];
    q[0] = (seg){rank * kn * dk, kn * dk};
    q[1] = (seg){Kd + rank * kn * dk, kn * dk};
    seg_scale(q + 2, sg, nv, dv, 2 * Kd);
    if ((rc = rows_take(s, &w->qkv, q, nv + 2, &o->qkv, "GDN in_proj_qkv", err, errlen))) return rc;
    /* conv_w [conv_dim, K]: the same channels, K floats each */
    seg qc[SEG_MAX + 2];
    seg_scale(qc, q, nv + 2, c->gdn_conv, 0);
    if ((rc = vec_take(s, w->conv_w, qc, nv + 2, &o->conv_w, err, errlen))) return rc;
    seg_scale(t, sg, nv, dv, 0);
    if ((rc = rows_take(s, &w->z, t, nv, &o->z, "GDN in_proj_z", err, errlen)) ||
        (rc = cols_take(s, &w->out, t, nv, &o->out, "GDN out_proj", err, errlen)) ||
        (rc = rows_take(s, &w->b, sg, nv, &o->b, "GDN in_proj_b", err, errlen)) ||
        (rc = rows_take(s, &w->a, sg, nv, &o->a, "GDN in_proj_a", err, errlen)) ||
        (rc = vec_take(s, w->a_log, sg, nv, &o->a_log, err, errlen)) ||
        (rc = vec_take(s, w->dt_bias, sg, nv, &o->dt_bias, err, errlen)))
      return rc;
  } else {
    const int64_t D = lc->head_dim, hq = c->n_heads / n, hkv = lc->n_kv_heads / n;
    const int64_t qhs = c->attn_out_gate ? 2 * D : D; /* q_proj rows per head ([query | gate]) */
    seg qs = {rank * hq * qhs, hq * qhs}, ks = {rank * hkv * D, hkv * D},
        os = {rank * hq * D, hq * D};
    if ((rc = rows_take(s, &w->q, &qs, 1, &o->q, "q_proj", err, errlen)) ||
        (rc = rows_take(s, &w->k, &ks, 1, &o->k, "k_proj", err, errlen)) ||
        (rc = rows_take(s, &w->v, &ks, 1, &o->v, "v_proj", err, errlen)) ||
        (rc = cols_take(s, &w->o, &os, 1, &o->o, "o_proj", err, errlen)) ||
        (rc = vec_take(s, w->q_bias, &qs, 1, &o->q_bias, err, errlen)) ||
        (rc = vec_take(s, w->k_bias, &ks, 1, &o->k_bias, err, errlen)) ||
        (rc = vec_take(s, w->v_bias, &ks, 1, &o->v_bias, err, errlen)))
      return rc;
  }
  if (w->gate.data && (rc = mlp_take(s, &w->gate, &w->up, &w->down, rank, n, &o->gate, &o->up,
                                     &o->down, err, errlen)))
    return rc;
  if (lc->is_moe && w->exp_gate) {
    const int E = c->n_experts;
    o->exp_gate = model_alloc(s, sizeof(ops_weight) * (size_t)E);
    o->exp_down = model_alloc(s, sizeof(ops_weight) * (size_t)E);
    o->exp_up = w->exp_up ? model_alloc(s, sizeof(ops_weight) * (size_t)E) : NULL;
    if (!o->exp_gate || !o->exp_down || (w->exp_up && !o->exp_up))
      return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    for (int e = 0; e < E; e++)
      if ((rc = mlp_take(s, &w->exp_gate[e], w->exp_up ? &w->exp_up[e] : NULL, &w->exp_down[e],
                         rank, n, &o->exp_gate[e], w->exp_up ? &o->exp_up[e] : NULL,
                         &o->exp_down[e], err, errlen)))
        return rc;
  }
  if (lc->is_moe && w->has_shared &&
      (rc = mlp_take(s, &w->sh_gate, &w->sh_up, &w->sh_down, rank, n, &o->sh_gate, &o->sh_up,
                     &o->sh_down, err, errlen)))
    return rc;
  o->sx_gate = o->sx_up = o->sx_down = NULL; /* relinked over the shard's experts */
  return 0;
}

int model_shard_create(text_model **out, const text_model *m, int rank, int n, char *err,
                       size_t errlen) {
  *out = NULL;
  int rc = model_shard_check(m, n, err, errlen);
  if (rc) return rc;
  if (n < 2 || rank < 0 || rank >= n)
    return anna_err(err, errlen, ANNA_EINVAL, "tensor parallel: shard %d of %d", rank, n);
  text_model *s = malloc(sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  memcpy(s, m, sizeof *s);
  /* borrowed from m: the mappings, the small vectors and the unsplit matrices */
  s->st = NULL, s->gguf = NULL, s->mtp = NULL, s->allocs = NULL, s->n_allocs = 0, s->cap_allocs = 0;
  s->path = m->path ? strdup(m->path) : NULL;
  model_config *c = &s->cfg;
  c->n_heads /= n;
  c->n_kv_heads /= n;
  c->ffn_dim /= n;
  c->gdn_hk /= n;
  c->gdn_hv /= n;
  c->expert_ffn /= n;
  c->shared_ffn /= n;
  for (int l = 0; l < c->n_layers; l++) {
    layer_config *lc = &c->layers[l];
    if (lc->kind != LAYER_KIND_GDN) lc->n_kv_heads /= n;
    lc->ffn_dim /= n;
  }
  for (int l = 0; !rc && l < m->cfg.n_layers; l++)
    rc = layer_take(s, m, l, rank, n, err, errlen);
  if (!rc) rc = model_link_shared_experts(s, err, errlen);
  if (rc) {
    model_free(s);
    return rc;
  }
  snprintf(s->describe, sizeof s->describe, "%.120s (shard %d/%d)", m->describe, rank, n);
  *out = s;
  return 0;
}
