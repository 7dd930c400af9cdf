/* forward.c: decoder forward pass for all supported families.
 *
 * Shape of one layer (pre-norm residual):
 *   h = x + [post_attn_norm](mixer(attn_norm(x)))        mixer: attention or Gated DeltaNet
 *   x = h + [post_ff_norm](ffn(pre_ff_norm(h)))           ffn: MLP, MoE, or both (Gemma4)
 *   Gemma4 then adds the per-layer-input term and multiplies by layer_scalar.
 * Projections run over the whole batch at once; what is per sequence (KV cache writes,
 * the conv and delta-rule recurrences) runs per run of consecutive same-sequence tokens.
 */
#include "model/forward.h"

#include "backends/cpu/cpu_backend.h"
#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Runs of recurrent GDN tokens at least this long use the chunked kernel. */
#define GDN_CHUNKED_MIN 8

struct fwd_state {
  ops_backend *be;     /* owns the backend allocations below */
  int n_seq, n_ctx, n_batch, n_layers;
  const model_config *cfg;
  /* Recurrent-state checkpoints (GDN conv + recurrent state of every GDN layer at one
   * position of one sequence), a fixed pool reused least-recently-saved first. */
  int has_gdn, n_ckpt;
  struct fwd_ckpt {
    int seq;        /* -1: free */
    int32_t pos;
    uint64_t tick;
    float **conv, **ssm; /* [layer] (NULL for non-GDN layers) */
  } *ckpt;
  uint64_t tick;
  int64_t wmax;
  int kv_type;        /* ops_kv_type of every attention layer's cache */
  uint8_t **k, **v;   /* [layer * n_seq + s] -> n_ctx rows of kv_row_bytes(layer); NULL: no own cache */
  float **conv, **ssm; /* [layer * n_seq + s] */
  int32_t *len;       /* [n_seq] */
  /* backend scratch */
  float *x, *xn, *res, *buf[5], *ple, *moe_scratch, *logits_in, *logits;
  int32_t *moe_idx, *tokens, *pos;
  float *moe_w;
  /* host */
  const float **kp, **vp;
  int32_t *run_start, *run_len, *run_seq;
  void **allocs, **hallocs;
  size_t n_allocs, n_hallocs;
};

/* Backend memory (state, activations), tracked for fwd_state_free. */
static void *salloc(fwd_state *s, size_t bytes, int *fail) {
  void *p = s->be->alloc(s->be, bytes ? bytes : 1);
  void **na = realloc(s->allocs, (s->n_allocs + 1) * sizeof *na);
  if (!p || !na) {
    if (p) s->be->free(s->be, p);
    if (na) s->allocs = na;
    *fail = 1;
    return NULL;
  }
  s->allocs = na;
  s->allocs[s->n_allocs++] = p;
  return p;
}

/* Host memory (bookkeeping the forward pass reads on the CPU). */
static void *halloc(fwd_state *s, size_t bytes, int *fail) {
  void *p = calloc(1, bytes ? bytes : 1);
  void **na = realloc(s->hallocs, (s->n_hallocs + 1) * sizeof *na);
  if (!p || !na) {
    free(p);
    if (na) s->hallocs = na;
    *fail = 1;
    return NULL;
  }
  s->hallocs = na;
  s->hallocs[s->n_hallocs++] = p;
  return p;
}

static int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

/* Widest per-token activation any layer needs (floats). */
static int64_t widest(const model_config *c) {
  int64_t w = c->hidden;
  const int64_t conv_dim = 2 * (int64_t)c->gdn_hk * c->gdn_dk + (int64_t)c->gdn_hv * c->gdn_dv;
  w = max64(w, conv_dim);
  w = max64(w, 2 * (int64_t)c->gdn_hv);
  w = max64(w, c->n_experts);
  w = max64(w, 2 * (int64_t)c->shared_ffn);
  w = max64(w, (int64_t)c->n_layers * c->ple_dim);
  for (int i = 0; i < c->n_layers; i++) {
    const layer_config *l = &c->layers[i];
    w = max64(w, (int64_t)c->n_heads * l->head_dim * 2);
    w = max64(w, (int64_t)l->n_kv_heads * l->head_dim);
    w = max64(w, 2 * (int64_t)l->ffn_dim);
  }
  return w;
}

int64_t fwd_backend_scratch_floats(const anna_model *m, int n_ctx) {
  const model_config *c = &m->cfg;
  int64_t s = max64(cpu_matmul_scratch_floats(m->max_cols), 1024);
  /* chunked GDN: gam, A, P, U, W, Qs, KsT, O for a 64-token chunk */
  s = max64(s, 64 + 2 * 64 * 64 + 64 * (int64_t)(3 * c->gdn_dk + 2 * c->gdn_dv) + 64);
  for (int i = 0; i < c->n_layers; i++)
    s = max64(s, cpu_attention_scratch_floats(c->n_heads, c->layers[i].n_kv_heads, c->layers[i].head_dim));
  (void)n_ctx;
  return s + 64;
}

static int64_t conv_floats(const model_config *c) {
  return (2 * (int64_t)c->gdn_hk * c->gdn_dk + (int64_t)c->gdn_hv * c->gdn_dv) * (c->gdn_conv - 1);
}

static int64_t ssm_floats(const model_config *c) {
  return (int64_t)c->gdn_hv * c->gdn_dk * c->gdn_dv;
}

/* Bytes of one position row of layer l's cache. */
static int64_t kv_row_bytes(const fwd_state *s, const layer_config *l) {
  return (int64_t)l->n_kv_heads * ops_kv_head_bytes(s->kv_type, l->head_dim);
}

int fwd_state_create(fwd_state **out, const anna_model *m, ops_backend *be, int n_seq, int n_ctx, int n_batch,
                     int n_ckpt, int kv_type, char *err, size_t errlen) {
  *out = NULL;
  const model_config *c = &m->cfg;
  if (n_seq < 1 || n_ctx < 1 || n_batch < 1 || n_seq > 4096 || n_batch > 1 << 20)
    return anna_err(err, errlen, ANNA_EINVAL, "bad context sizes (n_seq %d, n_ctx %d, n_batch %d)", n_seq, n_ctx,
                    n_batch);
  fwd_state *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  int fail = 0;
  s->be = be;
  s->cfg = c;
  s->kv_type = kv_type;
  if (kv_type != OPS_KV_F32) {
    for (int l = 0; l < c->n_layers; l++) {
      const int d = c->layers[l].head_dim;
      if (c->layers[l].kind == LAYER_KIND_GDN) continue;
      if (d % 32 || (kv_type >= OPS_KV_TQ2 && ((d & (d - 1)) || d > 1024))) {
        free(s);
        return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                        "KV-cache quantization needs head dims that are multiples of 32 (powers of two up to 1024 "
                        "for turboquant); layer %d has %d", l, d);
      }
    }
    if (!be->kv_store) {
      free(s);
      return anna_err(err, errlen, ANNA_EUNSUPPORTED, "the %s backend has no quantized KV cache", be->name);
    }
  }
  s->n_seq = n_seq;
  s->n_ctx = n_ctx;
  s->n_batch = n_batch;
  s->n_layers = c->n_layers;
  const size_t nl = (size_t)c->n_layers * (size_t)n_seq;
  s->k = halloc(s, nl * sizeof(float *), &fail);
  s->v = halloc(s, nl * sizeof(float *), &fail);
  s->conv = halloc(s, nl * sizeof(float *), &fail);
  s->ssm = halloc(s, nl * sizeof(float *), &fail);
  s->len = halloc(s, (size_t)n_seq * sizeof(int32_t), &fail);
  const int64_t conv_dim = 2 * (int64_t)c->gdn_hk * c->gdn_dk + (int64_t)c->gdn_hv * c->gdn_dv;
  for (int l = 0; !fail && l < c->n_layers; l++) {
    const layer_config *lc = &c->layers[l];
    for (int q = 0; !fail && q < n_seq; q++) {
      size_t at = (size_t)l * n_seq + q;
      if (lc->kind == LAYER_KIND_GDN) {
        s->conv[at] = salloc(s, (size_t)conv_dim * (c->gdn_conv - 1) * sizeof(float), &fail);
        s->ssm[at] = salloc(s, (size_t)c->gdn_hv * c->gdn_dk * c->gdn_dv * sizeof(float), &fail);
      } else if (lc->kv_source == l) {
        size_t kv = (size_t)kv_row_bytes(s, lc) * (size_t)n_ctx;
        s->k[at] = salloc(s, kv, &fail);
        s->v[at] = salloc(s, kv, &fail);
      }
    }
  }
  const int64_t H = c->hidden, n = n_batch;
  s->wmax = widest(c);
  s->x = salloc(s, (size_t)(n * H) * sizeof(float), &fail);
  s->xn = salloc(s, (size_t)(n * H) * sizeof(float), &fail);
  s->res = salloc(s, (size_t)(n * H) * sizeof(float), &fail);
  s->logits_in = salloc(s, (size_t)(n * H) * sizeof(float), &fail);
  s->logits = salloc(s, (size_t)(n * c->vocab) * sizeof(float), &fail);
  s->tokens = salloc(s, (size_t)n * sizeof(int32_t), &fail);
  s->pos = salloc(s, (size_t)n * sizeof(int32_t), &fail);
  for (int i = 0; i < 5; i++) s->buf[i] = salloc(s, (size_t)(n * s->wmax) * sizeof(float), &fail);
  if (c->ple_dim > 0) s->ple = salloc(s, (size_t)(n * c->n_layers * c->ple_dim) * sizeof(float), &fail);
  if (c->n_experts > 0) {
    s->moe_scratch = salloc(s, (size_t)ops_moe_scratch_floats(n, c->top_k, c->hidden, c->expert_ffn) * sizeof(float), &fail);
    s->moe_idx = salloc(s, (size_t)(n * c->top_k) * sizeof(int32_t), &fail);
    s->moe_w = salloc(s, (size_t)(n * c->top_k) * sizeof(float), &fail);
  }
  int has_gdn = 0;
  for (int l = 0; l < c->n_layers; l++) has_gdn |= c->layers[l].kind == LAYER_KIND_GDN;
  s->has_gdn = has_gdn;
  s->n_ckpt = has_gdn && n_ckpt > 0 ? n_ckpt : 0;
  s->ckpt = halloc(s, (size_t)(s->n_ckpt + 1) * sizeof *s->ckpt, &fail);
  for (int i = 0; !fail && i < s->n_ckpt; i++) {
    struct fwd_ckpt *k = &s->ckpt[i];
    k->seq = -1;
    k->conv = halloc(s, (size_t)c->n_layers * sizeof(float *), &fail);
    k->ssm = halloc(s, (size_t)c->n_layers * sizeof(float *), &fail);
    for (int l = 0; !fail && l < c->n_layers; l++)
      if (c->layers[l].kind == LAYER_KIND_GDN) {
        k->conv[l] = salloc(s, (size_t)conv_floats(c) * sizeof(float), &fail);
        k->ssm[l] = salloc(s, (size_t)ssm_floats(c) * sizeof(float), &fail);
      }
  }
  s->kp = halloc(s, (size_t)n * sizeof(float *), &fail);
  s->vp = halloc(s, (size_t)n * sizeof(float *), &fail);
  s->run_start = halloc(s, (size_t)n * sizeof(int32_t), &fail);
  s->run_len = halloc(s, (size_t)n * sizeof(int32_t), &fail);
  s->run_seq = halloc(s, (size_t)n * sizeof(int32_t), &fail);
  if (fail) {
    fwd_state_free(s);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory for %d sequences x %d positions", n_seq, n_ctx);
  }
  *out = s;
  return 0;
}

void fwd_state_free(fwd_state *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n_allocs; i++) s->be->free(s->be, s->allocs[i]);
  for (size_t i = 0; i < s->n_hallocs; i++) free(s->hallocs[i]);
  free(s->allocs);
  free(s->hallocs);
  free(s);
}

int64_t fwd_state_kv_bytes_per_token(const fwd_state *s) {
  int64_t b = 0;
  for (int l = 0; l < s->cfg->n_layers; l++)
    if (s->cfg->layers[l].kind != LAYER_KIND_GDN && s->cfg->layers[l].kv_source == l) b += 2 * kv_row_bytes(s, &s->cfg->layers[l]);
  return b;
}

int32_t fwd_state_seq_len(const fwd_state *s, int seq) {
  return seq >= 0 && seq < s->n_seq ? s->len[seq] : -1;
}

/* Checkpoints of seq past position n no longer describe its tokens. */
static void ckpt_invalidate(fwd_state *s, int seq, int32_t n) {
  for (int i = 0; i < s->n_ckpt; i++)
    if (s->ckpt[i].seq == seq && s->ckpt[i].pos > n) s->ckpt[i].seq = -1;
}

void fwd_state_seq_reset(fwd_state *s, int seq) {
  if (seq < 0 || seq >= s->n_seq) return;
  /* KV entries past len are never read; GDN state is zeroed when the sequence restarts. */
  s->len[seq] = 0;
  ckpt_invalidate(s, seq, 0);
}

static struct fwd_ckpt *ckpt_find(fwd_state *s, int seq, int32_t pos) {
  for (int i = 0; i < s->n_ckpt; i++)
    if (s->ckpt[i].seq == seq && s->ckpt[i].pos == pos) return &s->ckpt[i];
  return NULL;
}

/* Recurrent state of every GDN layer: from (conv, ssm) arrays to those of dst. */
static void gdn_state_copy(fwd_state *s, float **dconv, float **dssm, int dseq_stride, float **sconv, float **sssm,
                           int sseq_stride) {
  const model_config *c = s->cfg;
  for (int l = 0; l < c->n_layers; l++) {
    if (c->layers[l].kind != LAYER_KIND_GDN) continue;
    float *dc = dconv[(size_t)l * dseq_stride], *ds = dssm[(size_t)l * dseq_stride];
    const float *sc = sconv[(size_t)l * sseq_stride], *ss = sssm[(size_t)l * sseq_stride];
    s->be->copy_rows(s->be, dc, 0, sc, 0, 1, (int)conv_floats(c));
    s->be->copy_rows(s->be, ds, 0, ss, 0, 1, (int)ssm_floats(c));
  }
}

int fwd_state_checkpoint(fwd_state *s, int seq, char *err, size_t errlen) {
  if (seq < 0 || seq >= s->n_seq) return anna_err(err, errlen, ANNA_ERANGE, "sequence %d out of range", seq);
  if (s->n_ckpt == 0) return 0; /* no recurrent state: positions alone describe the state */
  struct fwd_ckpt *k = ckpt_find(s, seq, s->len[seq]);
  if (!k) {
    k = &s->ckpt[0];
    for (int i = 0; i < s->n_ckpt; i++) {
      if (s->ckpt[i].seq < 0) {
        k = &s->ckpt[i];
        break;
      }
      if (s->ckpt[i].tick < k->tick) k = &s->ckpt[i];
    }
  }
  k->seq = seq;
  k->pos = s->len[seq];
  k->tick = ++s->tick;
  gdn_state_copy(s, k->conv, k->ssm, 1, s->conv + seq, s->ssm + seq, s->n_seq);
  return 0;
}

/* The recurrent state of src at position n: its live state or a checkpoint. */
static int state_source(fwd_state *s, int src, int32_t n, float ***conv, float ***ssm, int *stride, char *err,
                        size_t errlen) {
  if (!s->has_gdn) {
    *conv = *ssm = NULL;
    return 0;
  }
  if (n == s->len[src]) {
    *conv = s->conv + src, *ssm = s->ssm + src, *stride = s->n_seq;
    return 0;
  }
  struct fwd_ckpt *k = ckpt_find(s, src, n);
  if (!k)
    return anna_err(err, errlen, ANNA_ENOTFOUND,
                    "sequence %d has no recurrent-state checkpoint at position %d (its length is %d)", src, n,
                    s->len[src]);
  k->tick = ++s->tick;
  *conv = k->conv, *ssm = k->ssm, *stride = 1;
  return 0;
}

int fwd_state_seq_rewind(fwd_state *s, int seq, int32_t n, char *err, size_t errlen) {
  if (seq < 0 || seq >= s->n_seq) return anna_err(err, errlen, ANNA_ERANGE, "sequence %d out of range", seq);
  if (n < 0 || n > s->len[seq])
    return anna_err(err, errlen, ANNA_ERANGE, "cannot rewind sequence %d of length %d to %d", seq, s->len[seq], n);
  if (n == 0) {
    fwd_state_seq_reset(s, seq);
    return 0;
  }
  float **conv, **ssm;
  int stride = 1;
  int rc = state_source(s, seq, n, &conv, &ssm, &stride, err, errlen);
  if (rc) return rc;
  if (conv && conv != s->conv + seq) gdn_state_copy(s, s->conv + seq, s->ssm + seq, s->n_seq, conv, ssm, stride);
  s->len[seq] = n;
  ckpt_invalidate(s, seq, n);
  return 0;
}

int fwd_state_seq_copy(fwd_state *s, int dst, int src, int32_t n, char *err, size_t errlen) {
  if (dst < 0 || dst >= s->n_seq || src < 0 || src >= s->n_seq || dst == src)
    return anna_err(err, errlen, ANNA_ERANGE, "bad sequence pair %d <- %d", dst, src);
  if (n < 0 || n > s->len[src])
    return anna_err(err, errlen, ANNA_ERANGE, "cannot copy %d positions of sequence %d (length %d)", n, src, s->len[src]);
  const model_config *c = s->cfg;
  float **conv = NULL, **ssm = NULL;
  int stride = 1;
  if (n > 0) {
    int rc = state_source(s, src, n, &conv, &ssm, &stride, err, errlen);
    if (rc) return rc;
  }
  ckpt_invalidate(s, dst, 0);
  for (int l = 0; l < c->n_layers; l++) {
    const size_t a = (size_t)l * s->n_seq;
    if (s->k[a + dst] && n > 0) {
      const size_t bytes = (size_t)kv_row_bytes(s, &c->layers[l]) * (size_t)n;
      s->be->copy(s->be, s->k[a + dst], s->k[a + src], bytes);
      s->be->copy(s->be, s->v[a + dst], s->v[a + src], bytes);
    }
  }
  if (conv) gdn_state_copy(s, s->conv + dst, s->ssm + dst, s->n_seq, conv, ssm, stride);
  s->len[dst] = n;
  return 0;
}

/* ---- layers ---- */

typedef struct fwd_run {
  const anna_model *m;
  ops_backend *be;
  fwd_state *s;
  const anna_batch *b;
  int64_t n;
  int n_runs;
} fwd_run;

static void norm(fwd_run *r, float *y, const float *x, const float *w, int64_t rows, int d) {
  const model_config *c = &r->m->cfg;
  r->be->rmsnorm(r->be, y, x, w, rows, d, (float)c->eps, c->norm == NORM_KIND_1PW);
}

/* out[n, H] = attention mixer of xn. */
static void layer_attention(fwd_run *r, int li, const float *xn, float *out) {
  const anna_model *m = r->m;
  const model_config *c = &m->cfg;
  const layer_config *lc = &c->layers[li];
  const layer_weights *w = &m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n;
  const int D = lc->head_dim, Hq = c->n_heads, Hkv = lc->n_kv_heads;
  const int64_t qd = (int64_t)Hq * D, kvd = (int64_t)Hkv * D;
  float *qf = s->buf[0], *q = s->buf[1], *gate = s->buf[2], *k = s->buf[3], *v = s->buf[4];

  be->matmul(be, qf, xn, n, &w->q, w->q_bias);
  if (c->attn_out_gate) {
    /* q_proj rows are [head][query D | gate D]: split them. */
    be->copy_rows(be, q, D, qf, 2 * D, n * Hq, D);
    be->copy_rows(be, gate, D, qf + D, 2 * D, n * Hq, D);
  } else {
    q = qf;
  }
  if (w->q_norm) norm(r, q, q, w->q_norm, n * Hq, D);
  be->rope(be, q, n, Hq, D, qd, lc->rope_dims, w->inv_freq, r->s->pos, lc->rope_interleaved);

  const int own = lc->kv_source == li;
  if (own) {
    be->matmul(be, k, xn, n, &w->k, w->k_bias);
    if (w->v.data) be->matmul(be, v, xn, n, &w->v, w->v_bias);
    else be->copy_rows(be, v, kvd, k, kvd, n, (int)kvd); /* attention_k_eq_v: V is the raw K */
    if (w->k_norm) norm(r, k, k, w->k_norm, n * Hkv, D);
    if (c->v_norm) be->rmsnorm(be, v, v, NULL, n * Hkv, D, (float)c->eps, 0);
    be->rope(be, k, n, Hkv, D, kvd, lc->rope_dims, w->inv_freq, r->s->pos, lc->rope_interleaved);
    const int64_t rb = kv_row_bytes(s, lc);
    void **kd = (void **)s->kp, **vd = (void **)s->vp; /* reused below for reading */
    for (int64_t t = 0; t < n; t++) {
      size_t at = (size_t)li * s->n_seq + r->b->seq[t];
      kd[t] = s->k[at] + (int64_t)r->b->pos[t] * rb;
      vd[t] = s->v[at] + (int64_t)r->b->pos[t] * rb;
    }
    if (s->kv_type == OPS_KV_F32) {
      be->scatter_rows(be, (float **)kd, k, n, (int)kvd);
      be->scatter_rows(be, (float **)vd, v, n, (int)kvd);
    } else {
      be->kv_store(be, kd, k, n, Hkv, D, s->kv_type);
      be->kv_store(be, vd, v, n, Hkv, D, s->kv_type);
    }
  }
  for (int64_t t = 0; t < n; t++) {
    size_t at = (size_t)lc->kv_source * s->n_seq + r->b->seq[t];
    s->kp[t] = (const float *)s->k[at];
    s->vp[t] = (const float *)s->v[at];
  }
  ops_attn_args a = {
      .n = n, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .v_dim = D, .kv_stride = kvd,
      .kv_type = s->kv_type, .kv_row_bytes = kv_row_bytes(s, lc),
      .scale = c->attn_scale, .window = lc->window, .softcap = c->attn_softcap, .pos = s->pos,
      .k = s->kp, .v = s->vp,
  };
  float *ao = s->buf[4] == v && own ? s->buf[3] : s->buf[4];
  be->attention(be, ao, q, &a);
  if (c->attn_out_gate) be->mul_sigmoid(be, ao, gate, n, (int)qd, qd, 0);
  be->matmul(be, out, ao, n, &w->o, NULL);
}

/* out[n, H] = Gated DeltaNet mixer of xn. */
static void layer_gdn(fwd_run *r, int li, const float *xn, float *out) {
  const anna_model *m = r->m;
  const model_config *c = &m->cfg;
  const layer_weights *w = &m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n;
  const int hk = c->gdn_hk, hv = c->gdn_hv, dk = c->gdn_dk, dv = c->gdn_dv;
  const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd;
  float *qkv = s->buf[0], *z = s->buf[1], *ba = s->buf[2], *conv = s->buf[3], *gates = s->buf[4];

  be->matmul(be, qkv, xn, n, &w->qkv, NULL);
  be->matmul(be, z, xn, n, &w->z, NULL);
  be->matmul(be, ba, xn, n, &w->b, NULL);
  be->matmul(be, ba + n * hv, xn, n, &w->a, NULL);
  for (int ri = 0; ri < r->n_runs; ri++) {
    const int64_t t0 = s->run_start[ri], len = s->run_len[ri];
    size_t at = (size_t)li * s->n_seq + s->run_seq[ri];
    be->conv1d_silu(be, conv + t0 * cd, qkv + t0 * cd, len, (int)cd, w->conv_w, c->gdn_conv, s->conv[at]);
  }
  float *q = qkv, *k = qkv + n * Kd, *v = qkv + 2 * n * Kd;
  be->copy_rows(be, q, Kd, conv, cd, n, (int)Kd);
  be->copy_rows(be, k, Kd, conv + Kd, cd, n, (int)Kd);
  be->copy_rows(be, v, Vd, conv + 2 * Kd, cd, n, (int)Vd);
  be->l2norm(be, q, n * hk, dk, 1e-6f, 1.0f / sqrtf((float)dk));
  be->l2norm(be, k, n * hk, dk, 1e-6f, 1.0f);
  float *beta = gates, *g = gates + n * hv;
  be->gdn_gates(be, beta, g, ba, hv, ba + n * hv, hv, w->a_log, w->dt_bias, n, hv);
  float *o = conv; /* conv output no longer needed */
  for (int ri = 0; ri < r->n_runs; ri++) {
    const int64_t t0 = s->run_start[ri], len = s->run_len[ri];
    size_t at = (size_t)li * s->n_seq + s->run_seq[ri];
    ops_gdn_args a = {
        .n = len, .hk = hk, .hv = hv, .dk = dk, .dv = dv, .v_tiled = c->gdn_v_tiled, .q = q + t0 * Kd, .k = k + t0 * Kd,
        .v = v + t0 * Vd, .g = g + t0 * hv, .beta = beta + t0 * hv, .state = s->ssm[at], .out = o + t0 * Vd,
    };
    if (len >= GDN_CHUNKED_MIN) be->gdn_chunked(be, &a);
    else be->gdn_recurrent(be, &a);
  }
  float *y = ba; /* [n, Vd] fits: buffers are wmax wide */
  be->rmsnorm_gated(be, y, o, z, w->gdn_norm, n * hv, dv, (float)c->eps);
  be->matmul(be, out, y, n, &w->out, NULL);
}

static void mlp(fwd_run *r, const ops_weight *gate, const ops_weight *up, const ops_weight *down,
                const float *xn, float *out) {
  ops_backend *be = r->be;
  const int64_t n = r->n, I = gate->rows;
  float *g = r->s->buf[0], *u = r->s->buf[1];
  be->matmul(be, g, xn, n, gate, NULL);
  be->matmul(be, u, xn, n, up, NULL);
  be->act_mul(be, g, g, u, n, (int)I, I, I, r->m->cfg.act);
  be->matmul(be, out, g, n, down, NULL);
}

/* Sparse experts of layer li on xn (router input rin) added into out. */
static void moe(fwd_run *r, int li, const float *rin, const float *xn, float *out) {
  const model_config *c = &r->m->cfg;
  const layer_weights *w = &r->m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n;
  float *logits = s->buf[2];
  be->matmul(be, logits, rin, n, &w->router, NULL);
  be->moe_route(be, s->moe_idx, s->moe_w, logits, n, c->n_experts, c->top_k, c->norm_topk, w->per_expert_scale);
  be->moe_ffn(be, out, xn, n, c->hidden, s->moe_idx, s->moe_w, c->top_k, w->exp_gate, w->exp_up, w->exp_down,
              c->act, s->moe_scratch);
}

static void layer_ffn(fwd_run *r, int li, float *x) {
  const anna_model *m = r->m;
  const model_config *c = &m->cfg;
  const layer_config *lc = &c->layers[li];
  const layer_weights *w = &m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n, H = c->hidden;
  float *xn = s->xn, *res = s->res;
  norm(r, xn, x, w->pre_ff_norm, n, (int)H);
  if (c->arch == MODEL_ARCH_GEMMA4 && lc->is_moe) {
    /* Dense MLP and experts side by side, each with its own post-norm. */
    mlp(r, &w->gate, &w->up, &w->down, xn, res);
    norm(r, res, res, w->post_ff_norm1, n, (int)H);
    float *rin = s->logits_in; /* router input: rmsnorm(x) * scale / sqrt(H) */
    be->rmsnorm(be, rin, x, w->router_scale, n, (int)H, (float)c->eps, 0);
    be->scale(be, rin, 1.0f / sqrtf((float)H), n * H);
    norm(r, xn, x, w->pre_ff_norm2, n, (int)H);
    float *e = s->buf[3];
    moe(r, li, rin, xn, e);
    norm(r, e, e, w->post_ff_norm2, n, (int)H);
    be->add(be, res, e, n * H);
  } else if (lc->is_moe) {
    moe(r, li, xn, xn, res);
    if (w->has_shared) {
      float *sh = s->buf[3], *sg = s->buf[4];
      mlp(r, &w->sh_gate, &w->sh_up, &w->sh_down, xn, sh);
      be->matmul(be, sg, xn, n, &w->sh_gate_inp, NULL);
      be->mul_sigmoid(be, sh, sg, n, (int)H, 1, 1);
      be->add(be, res, sh, n * H);
    }
  } else {
    mlp(r, &w->gate, &w->up, &w->down, xn, res);
  }
  if (c->post_norms) norm(r, res, res, w->post_ff_norm, n, (int)H);
  be->add(be, x, res, n * H);
}

/* Gemma4 per-layer inputs for the batch: ple[n, L, P]. */
static void ple_inputs(fwd_run *r, const float *emb) {
  const anna_model *m = r->m;
  const model_config *c = &m->cfg;
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n, LP = (int64_t)c->n_layers * c->ple_dim;
  float *tok = s->buf[0];
  be->embed(be, tok, &m->ple_embed, s->tokens, n, sqrtf((float)c->ple_dim));
  be->matmul(be, s->ple, emb, n, &m->ple_model_proj, NULL);
  be->scale(be, s->ple, 1.0f / sqrtf((float)c->hidden), n * LP);
  norm(r, s->ple, s->ple, m->ple_proj_norm, n * c->n_layers, c->ple_dim);
  be->add(be, s->ple, tok, n * LP);
  be->scale(be, s->ple, 1.0f / sqrtf(2.0f), n * LP);
}

static void layer_ple(fwd_run *r, int li, float *x) {
  const anna_model *m = r->m;
  const model_config *c = &m->cfg;
  const layer_weights *w = &m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n, P = c->ple_dim, LP = (int64_t)c->n_layers * P;
  float *g = s->buf[0], *o = s->res;
  be->matmul(be, g, x, n, &w->ple_gate, NULL);
  be->act_mul(be, g, g, s->ple + li * P, n, (int)P, P, LP, ACT_KIND_GELU_TANH);
  be->matmul(be, o, g, n, &w->ple_proj, NULL);
  norm(r, o, o, w->ple_post_norm, n, c->hidden);
  be->add(be, x, o, n * c->hidden);
}

/* Checks the batch against the state and splits it into per-sequence runs. */
static int plan_batch(fwd_run *r, char *err, size_t errlen) {
  const anna_batch *b = r->b;
  fwd_state *s = r->s;
  const model_config *c = &r->m->cfg;
  if (b->n < 1 || b->n > s->n_batch)
    return anna_err(err, errlen, ANNA_EINVAL, "batch of %d tokens (allowed 1..%d)", b->n, s->n_batch);
  r->n_runs = 0;
  for (int32_t i = 0; i < b->n; i++) {
    if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab)
      return anna_err(err, errlen, ANNA_ERANGE, "token id %d out of range (vocab %d)", b->tokens[i], c->vocab);
    if (b->seq[i] < 0 || b->seq[i] >= s->n_seq)
      return anna_err(err, errlen, ANNA_ERANGE, "sequence %d out of range (0..%d)", b->seq[i], s->n_seq - 1);
    if (i == 0 || b->seq[i] != b->seq[i - 1]) {
      for (int q = 0; q < r->n_runs; q++)
        if (s->run_seq[q] == b->seq[i])
          return anna_err(err, errlen, ANNA_EINVAL, "tokens of sequence %d are not consecutive in the batch", b->seq[i]);
      s->run_start[r->n_runs] = i;
      s->run_len[r->n_runs] = 0;
      s->run_seq[r->n_runs] = b->seq[i];
      r->n_runs++;
    }
    int32_t expect = s->len[b->seq[i]] + s->run_len[r->n_runs - 1];
    if (b->pos[i] != expect)
      return anna_err(err, errlen, ANNA_EINVAL, "token %d of sequence %d has position %d, expected %d", i, b->seq[i],
                      b->pos[i], expect);
    if (b->pos[i] >= s->n_ctx)
      return anna_err(err, errlen, ANNA_ERANGE, "sequence %d is full (context %d)", b->seq[i], s->n_ctx);
    s->run_len[r->n_runs - 1]++;
  }
  return 0;
}

int forward_batch(const anna_model *m, ops_backend *be, fwd_state *s, const anna_batch *b, float *out, char *err,
                  size_t errlen) {
  fwd_run r = {m, be, s, b, b->n, 0};
  int rc = plan_batch(&r, err, errlen);
  if (rc) return rc;
  const model_config *c = &m->cfg;
  const int64_t n = b->n, H = c->hidden;
  /* A fresh sequence starts with zero recurrent state. */
  for (int ri = 0; ri < r.n_runs; ri++) {
    int q = s->run_seq[ri];
    if (s->len[q] != 0) continue;
    for (int l = 0; l < c->n_layers; l++) {
      size_t at = (size_t)l * s->n_seq + q;
      if (s->conv[at])
        be->memset0(be, s->conv[at], sizeof(float) * (size_t)(2 * c->gdn_hk * c->gdn_dk + c->gdn_hv * c->gdn_dv) *
                                         (size_t)(c->gdn_conv - 1));
      if (s->ssm[at]) be->memset0(be, s->ssm[at], sizeof(float) * (size_t)c->gdn_hv * c->gdn_dk * c->gdn_dv);
    }
  }
  be->upload(be, s->tokens, b->tokens, sizeof(int32_t) * (size_t)n);
  be->upload(be, s->pos, b->pos, sizeof(int32_t) * (size_t)n);
  float *x = s->x;
  be->embed(be, x, &m->embed, s->tokens, n, c->embed_scale);
  if (c->ple_dim > 0) ple_inputs(&r, x);
  for (int li = 0; li < c->n_layers; li++) {
    const layer_config *lc = &c->layers[li];
    const layer_weights *w = &m->layers[li];
    norm(&r, s->xn, x, w->attn_norm, n, (int)H);
    if (lc->kind == LAYER_KIND_GDN) layer_gdn(&r, li, s->xn, s->res);
    else layer_attention(&r, li, s->xn, s->res);
    if (w->post_attn_norm) norm(&r, s->res, s->res, w->post_attn_norm, n, (int)H);
    be->add(be, x, s->res, n * H);
    layer_ffn(&r, li, x);
    if (c->ple_dim > 0) layer_ple(&r, li, x);
    if (w->layer_scalar != 1.0f) be->scale(be, x, w->layer_scalar, n * H);
  }
  for (int ri = 0; ri < r.n_runs; ri++) s->len[s->run_seq[ri]] += s->run_len[ri];
  /* Logits only for the flagged tokens. */
  int64_t nl = 0;
  for (int64_t t = 0; t < n; t++)
    if (!b->logits || b->logits[t]) be->copy_rows(be, s->logits_in + (nl++) * H, H, x + t * H, H, 1, (int)H);
  if (nl == 0) return 0;
  norm(&r, s->logits_in, s->logits_in, m->final_norm, nl, (int)H);
  be->matmul(be, s->logits, s->logits_in, nl, &m->lm_head, NULL);
  if (c->final_softcap > 0) be->softcap(be, s->logits, nl * c->vocab, c->final_softcap);
  be->download(be, out, s->logits, sizeof(float) * (size_t)(nl * c->vocab));
  return 0;
}
