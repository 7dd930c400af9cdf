/* forward.c: decoder forward pass for all supported families.
 *
 * Shape of one layer (pre-norm residual):
 *   h = x + [post_attn_norm](mixer(attn_norm(x)))        mixer: attention or Gated DeltaNet
 *   x = h + [post_ff_norm](ffn(pre_ff_norm(h)))           ffn: MLP, MoE, or both (Gemma4)
 *   Gemma4 then adds the per-layer-input term and multiplies by layer_scalar.
 * Projections run over the whole batch at once; what is per sequence (KV cache writes,
 * the conv and delta-rule recurrences) runs per run of consecutive same-sequence tokens.
 * The per-sequence state and its bookkeeping (blocks, prefix pool, snapshots, ring) are the
 * cache layer's (src/cache/kv_cache.h): each call asks it for a plan, then for the rows and
 * state pointers each layer reads and writes.
 */
#include "model/forward.h"

#include "base/error.h"
#include "cache/kv_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Runs of recurrent GDN tokens at least this long use the chunked kernel. */
#define GDN_CHUNKED_MIN 8

/* One stage's activation scratch, in its backend's memory. */
typedef struct fwd_bufs {
  float *x, *xn, *res, *buf[5], *ple, *moe_scratch;
  int32_t *moe_idx, *tokens, *pos;
  int32_t *rpos; /* mRoPE (fwd_mm.rope_pos): positions [3][n_batch] */
  float *moe_w;
  /* logits_in: the final norm's rows (and Gemma4's router input on every stage); the last
   * stage only (NULL on the others): the logits, and the sampling candidates (fwd_topk): one
   * buffer [stats rows*2 doubles | idx rows*k | val rows*k] so one download brings a step's
   * candidates */
  float *logits_in, *logits;
  void *tk_dev;
  void *smp_dev; /* last stage: sampling scratch (fwd_state_logits_rows), FWD_SAMPLE_ROW_BYTES a row */
} fwd_bufs;

/* A pipeline stage: layers [l0, l1) run on be (stage 0: the backend the forward call is
 * given, which is the state's be or a profiling wrapper of it). Stage 0 also embeds; the last
 * also runs the final norm, the lm_head and the candidates. */
typedef struct fwd_stage {
  ops_backend *be;
  int l0, l1;
  fwd_bufs b;
} fwd_stage;

struct fwd_state {
  ops_backend *be;     /* stage 0's backend */
  int n_seq, n_ctx, n_batch, n_layers;
  const model_config *cfg;
  kv_cache *kv;        /* per-sequence state: KV pool, recurrent state, prefix pool (each
                          layer's on its stage's backend) */
  kv_plan plan;        /* the current call's runs and snapshot cuts */
  int64_t wmax;
  int n_stages;
  fwd_stage *st;       /* [n_stages] */
  fwd_bufs *w;         /* the running stage's scratch (forward_batch_mm moves it along) */
  float *hand;         /* host staging of a stage hand-off: x, the pending residual, PLE inputs */
  /* mRoPE: per layer, three copies of its frequency table with the other axes' frequencies
   * zeroed (host, built at creation: a zero frequency is an exact identity rotation, so
   * three rope calls apply the 3-axis rotation) */
  float *mfreq;
  int mfreq_half;
  void *tk_host;   /* host staging copy of the last stage's tk_dev */
  void *smp_host;  /* host twin of the last stage's smp_dev */
  int64_t last_nl; /* logits rows the last call left in the last stage's logits (fwd_state_logits_row) */
  /* tensor parallelism (fwd_state_options): NULL tp_ar = none */
  int tp_rank;
  void (*tp_ar)(void *ctx, int rank, ops_backend *be, float *buf, int64_t count);
  void *tp_ctx;
  void **allocs, **hallocs;
  ops_backend **alloc_be; /* [n_allocs] the backend each allocation came from */
  size_t n_allocs, n_hallocs;
};

/* Bytes per logits row of the candidate buffers: stats (2 doubles), idx and val of OPS_TOPK_MAX. */
#define FWD_TOPK_ROW_BYTES (2 * sizeof(double) + (size_t)OPS_TOPK_MAX * (sizeof(int32_t) + sizeof(float)))

/* Backend memory (activations) on be, tracked for fwd_state_free. */
static void *salloc(fwd_state *s, ops_backend *be, size_t bytes, int *fail) {
  if (*fail) return NULL;
  void *p = be->alloc(be, bytes ? bytes : 1);
  void **na = realloc(s->allocs, (s->n_allocs + 1) * sizeof *na);
  if (na) s->allocs = na;
  ops_backend **nb = na ? realloc(s->alloc_be, (s->n_allocs + 1) * sizeof *nb) : NULL;
  if (nb) s->alloc_be = nb;
  if (!p || !na || !nb) {
    if (p) be->free(be, p);
    *fail = 1;
    return NULL;
  }
  s->allocs[s->n_allocs] = p;
  s->alloc_be[s->n_allocs++] = be;
  return p;
}

/* Host memory. */
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
  if (conv_dim) w = max64(w, conv_dim + 2 * (int64_t)c->gdn_hv); /* gdn_step's work (ops_gdn_step_work_floats) */
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

static int64_t conv_floats(const model_config *c) {
  return (2 * (int64_t)c->gdn_hk * c->gdn_dk + (int64_t)c->gdn_hv * c->gdn_dv) * (c->gdn_conv - 1);
}

static int64_t ssm_floats(const model_config *c) {
  return (int64_t)c->gdn_hv * c->gdn_dk * c->gdn_dv;
}


/* The model's layers as the cache sees them; then the cache. */
static int state_cache_create(fwd_state *s, const model_config *c, int n_seq, int n_ctx, int n_batch,
                              const fwd_state_options *o, char *err, size_t errlen) {
  kv_cache_layer *ly = calloc((size_t)(c->n_layers > 0 ? c->n_layers : 1), sizeof *ly);
  ops_backend **lbe = calloc((size_t)(c->n_layers > 0 ? c->n_layers : 1), sizeof *lbe);
  if (!ly || !lbe) {
    free(ly);
    free(lbe);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  for (int i = 0; i < s->n_stages; i++) /* each layer's state on its stage's backend */
    for (int l = s->st[i].l0; l < s->st[i].l1; l++) lbe[l] = s->st[i].be;
  for (int l = 0; l < c->n_layers; l++) {
    const layer_config *lc = &c->layers[l];
    ly[l].kind = lc->kind == LAYER_KIND_GDN ? KV_LAYER_STATE : KV_LAYER_ATTN;
    ly[l].kv_source = lc->kv_source;
    ly[l].n_kv_heads = lc->n_kv_heads;
    ly[l].head_dim = lc->head_dim;
  }
  const kv_cache_options ko = {
      .n_seq = n_seq, .n_ctx = n_ctx, .n_batch = n_batch, .n_vocab = c->vocab, .n_layers = c->n_layers,
      .layers = ly, .conv_floats = conv_floats(c), .ssm_floats = ssm_floats(c), .kv_type = o->kv_type,
      .block_len = o->block_len, .n_blocks = o->n_blocks, .residual_len = o->residual_len,
      .prefix_share = o->prefix_share, .snapshot_interval = o->snapshot_interval, .n_ckpt = o->n_ckpt,
      .layer_be = lbe,
  };
  const int rc = kv_cache_create(&s->kv, s->be, &ko, err, errlen);
  free(ly);
  free(lbe);
  return rc;
}

/* The stages of fwd_state_options (one stage of every layer on be without them). */
static int stages_setup(fwd_state *s, ops_backend *be, const fwd_state_options *o, char *err, size_t errlen) {
  const int S = o->n_stages > 1 ? o->n_stages : 1, L = s->n_layers;
  if (S > 1 && (!o->stage_be || !o->stage_layers))
    return anna_err(err, errlen, ANNA_EINVAL, "%d pipeline stages without their backends or layer counts", S);
  if (S > L && L > 0)
    return anna_err(err, errlen, ANNA_EINVAL, "%d pipeline stages for a model of %d layers", S, L);
  if (!(s->st = calloc((size_t)S, sizeof *s->st))) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  s->n_stages = S;
  int at = 0;
  for (int i = 0; i < S; i++) {
    const int k = S > 1 ? o->stage_layers[i] : L;
    if (S > 1 && (k < 1 || k > L - at))
      return anna_err(err, errlen, ANNA_EINVAL, "pipeline stage %d: %d layers (stages need >= 1 and %d in all)", i, k,
                      L);
    if (S > 1 && (i ? !o->stage_be[i] : o->stage_be[0] != be))
      return anna_err(err, errlen, ANNA_EINVAL, "pipeline stage %d: %s", i,
                      i ? "no backend" : "stage 0 must be the state's backend");
    s->st[i] = (fwd_stage){.be = i ? o->stage_be[i] : be, .l0 = at, .l1 = at + k};
    at += k;
  }
  if (at != L)
    return anna_err(err, errlen, ANNA_EINVAL, "pipeline stages hold %d layers; the model has %d", at, L);
  return 0;
}

int fwd_state_create(fwd_state **out, const text_model *m, ops_backend *be, int n_seq, int n_ctx, int n_batch,
                     const fwd_state_options *opt, char *err, size_t errlen) {
  *out = NULL;
  const model_config *c = &m->cfg;
  fwd_state_options o = {0};
  if (opt) o = *opt;
  fwd_state *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  int fail = 0;
  s->be = be;
  s->cfg = c;
  s->n_seq = n_seq;
  s->n_ctx = n_ctx;
  s->n_batch = n_batch;
  s->n_layers = c->n_layers;
  s->tp_rank = o.tp_rank;
  s->tp_ar = o.tp_all_reduce;
  s->tp_ctx = o.tp_ctx;
  int rc = s->tp_ar && o.n_stages > 1
               ? anna_err(err, errlen, ANNA_EUNSUPPORTED, "tensor parallelism with pipeline stages is not supported")
               : stages_setup(s, be, &o, err, errlen);
  /* The cache checks every size first (its messages are the context's). */
  if (!rc) rc = state_cache_create(s, c, n_seq, n_ctx, n_batch, &o, err, errlen);
  if (rc) {
    free(s->st);
    free(s);
    return rc;
  }
  const int64_t H = c->hidden, n = n_batch;
  s->wmax = widest(c);
  for (int i = 0; i < s->n_stages; i++) {
    fwd_bufs *b = &s->st[i].b;
    ops_backend *sb = s->st[i].be;
    const int last = i == s->n_stages - 1;
    b->x = salloc(s, sb, (size_t)(n * H) * sizeof(float), &fail);
    b->xn = salloc(s, sb, (size_t)(n * H) * sizeof(float), &fail);
    b->res = salloc(s, sb, (size_t)(n * H) * sizeof(float), &fail);
    b->logits_in = salloc(s, sb, (size_t)(n * H) * sizeof(float), &fail); /* also Gemma4's router input */
    if (last) {
      b->logits = salloc(s, sb, (size_t)(n * c->vocab) * sizeof(float), &fail);
      b->tk_dev = salloc(s, sb, (size_t)n * FWD_TOPK_ROW_BYTES, &fail);
      b->smp_dev = salloc(s, sb, (size_t)n * FWD_SAMPLE_ROW_BYTES(c->vocab), &fail);
    }
    b->tokens = salloc(s, sb, (size_t)n * sizeof(int32_t), &fail);
    b->pos = salloc(s, sb, (size_t)n * sizeof(int32_t), &fail);
    for (int j = 0; j < 5; j++) b->buf[j] = salloc(s, sb, (size_t)(n * s->wmax) * sizeof(float), &fail);
    if (c->ple_dim > 0) b->ple = salloc(s, sb, (size_t)(n * c->n_layers * c->ple_dim) * sizeof(float), &fail);
    if (c->n_experts > 0) {
      const int kx = c->top_k + (c->shared_ffn > 0); /* a shared expert may run as slot k (sx_*) */
      b->moe_scratch =
          salloc(s, sb, (size_t)ops_moe_scratch_floats(n, kx, c->hidden, c->expert_ffn) * sizeof(float), &fail);
      b->moe_idx = salloc(s, sb, (size_t)(n * kx) * sizeof(int32_t), &fail);
      b->moe_w = salloc(s, sb, (size_t)(n * kx) * sizeof(float), &fail);
    }
    if (c->mrope_section[0] + c->mrope_section[1] + c->mrope_section[2] > 0)
      b->rpos = salloc(s, sb, (size_t)(3 * n) * sizeof(int32_t), &fail);
  }
  s->w = &s->st[0].b;
  s->tk_host = halloc(s, (size_t)n * FWD_TOPK_ROW_BYTES, &fail);
  s->smp_host = halloc(s, (size_t)n * FWD_SAMPLE_ROW_BYTES(c->vocab), &fail);
  if (s->n_stages > 1)
    s->hand = halloc(s, (size_t)(n * (2 * H + (int64_t)c->n_layers * c->ple_dim)) * sizeof(float), &fail);
  if (c->mrope_section[0] + c->mrope_section[1] + c->mrope_section[2] > 0) {
    int half = 1;
    for (int l = 0; l < c->n_layers; l++) half = (int)max64(half, c->layers[l].rope_dims / 2);
    s->mfreq_half = half;
    s->mfreq = halloc(s, (size_t)(c->n_layers * 3 * half) * sizeof(float), &fail);
    for (int l = 0; !fail && l < c->n_layers; l++) {
      const layer_config *lc = &c->layers[l];
      if (lc->kind == LAYER_KIND_GDN) continue;
      float *f = s->mfreq + (size_t)l * 3 * half;
      float *inv = calloc((size_t)lc->rope_dims / 2 + 1, sizeof(float));
      if (!inv) {
        fail = 1;
        break;
      }
      config_rope_inv_freq(lc, inv);
      for (int j = 0; j < lc->rope_dims / 2; j++) {
        const int axis = j % 3 == 1 && j < 3 * c->mrope_section[1]   ? 1
                         : j % 3 == 2 && j < 3 * c->mrope_section[2] ? 2
                                                                      : 0;
        f[axis * half + j] = inv[j];
      }
      free(inv);
    }
  }
  if (fail) {
    fwd_state_free(s);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory for %d sequences x %d positions", n_seq, n_ctx);
  }
  *out = s;
  return 0;
}

void fwd_state_free(fwd_state *s) {
  if (!s) return;
  kv_cache_free(s->kv);
  for (size_t i = 0; i < s->n_allocs; i++) s->alloc_be[i]->free(s->alloc_be[i], s->allocs[i]);
  for (size_t i = 0; i < s->n_hallocs; i++) free(s->hallocs[i]);
  free(s->alloc_be);
  free(s->st);
  free(s->allocs);
  free(s->hallocs);
  free(s);
}

/* The state API: delegations to the cache (the text decoder kind, text_decoder.c, calls these). */

int64_t fwd_state_layer_bytes(const fwd_state *s, int l) {
  return kv_cache_layer_bytes(s->kv, l);
}

int64_t fwd_state_kv_bytes_per_token(const fwd_state *s) {
  return kv_cache_bytes_per_token(s->kv);
}

void fwd_state_kv_stats(const fwd_state *s, fwd_kv_stats *st) {
  kv_cache_stats(s->kv, st);
}

int32_t fwd_state_seq_len(const fwd_state *s, int seq) {
  return kv_cache_seq_len(s->kv, seq);
}

void fwd_state_seq_reset(fwd_state *s, int seq) {
  kv_cache_seq_reset(s->kv, seq);
}

int fwd_state_checkpoint(fwd_state *s, int seq, char *err, size_t errlen) {
  return kv_cache_checkpoint(s->kv, seq, err, errlen);
}

int fwd_state_seq_rewind(fwd_state *s, int seq, int32_t n, char *err, size_t errlen) {
  return kv_cache_seq_rewind(s->kv, seq, n, err, errlen);
}

int32_t fwd_state_window(fwd_state *s, int seq, int32_t n) {
  return kv_cache_window(s->kv, seq, n);
}

int fwd_state_seq_copy(fwd_state *s, int dst, int src, int32_t n, char *err, size_t errlen) {
  return kv_cache_seq_copy(s->kv, dst, src, n, err, errlen);
}

int64_t fwd_state_seq_blocks_needed(const fwd_state *s, int seq, int32_t n) {
  return kv_cache_seq_blocks_needed(s->kv, seq, n);
}

int64_t fwd_state_seq_blocks_held(const fwd_state *s, int seq) {
  return kv_cache_seq_blocks_held(s->kv, seq);
}

int32_t fwd_state_prefix_attach(fwd_state *s, int seq, const int32_t *tokens, int32_t n, int register_blocks) {
  return kv_cache_prefix_attach(s->kv, seq, tokens, n, register_blocks);
}

/* ---- layers ---- */

typedef struct fwd_run {
  const text_model *m;
  ops_backend *be;
  fwd_state *s;
  const anna_batch *b;
  int64_t n;
  const kv_plan *p;   /* runs of one sequence each, snapshot cuts (kv_cache_plan) */
  int mrope;          /* this call rotates by the stage's rpos (fwd_mm.rope_pos) */
  int32_t keys_hint; /* 1 + the batch's largest position (ops_attn_args.keys_hint) */
} fwd_run;

/* Tensor parallelism: a shard's partial projection output [n, H] becomes the sum over every
 * shard (fwd_state_options.tp_all_reduce); nothing without a split. */
static void tp_reduce(fwd_run *r, float *buf) {
  fwd_state *s = r->s;
  if (s->tp_ar) s->tp_ar(s->tp_ctx, s->tp_rank, r->be, buf, r->n * r->m->cfg.hidden);
}

static void norm(fwd_run *r, float *y, const float *x, const float *w, int64_t rows, int d) {
  const model_config *c = &r->m->cfg;
  r->be->rmsnorm(r->be, y, x, w, rows, d, (float)c->eps, c->norm == NORM_KIND_1PW);
}

/* x += res, then y = norm(x): one kernel instead of two where the backend fuses them (the
 * CPU's fused op is the same two loops, so results do not change). */
static void add_norm(fwd_run *r, float *x, const float *res, float *y, const float *w, int64_t rows, int d) {
  const model_config *c = &r->m->cfg;
  if (r->be->add_rmsnorm) {
    r->be->add_rmsnorm(r->be, x, res, y, w, rows, d, (float)c->eps, c->norm == NORM_KIND_1PW);
  } else {
    r->be->add(r->be, x, res, rows * d);
    norm(r, y, x, w, rows, d);
  }
}

/* ys[i][n, ws[i]->rows] = x ws[i]^T (+ biases[i]) for count projections of the same input
 * x: one matmul_group (on a device, fewer launches per decode step), or matmul per weight
 * where the backend lacks it. biases may be NULL. */
static void project(fwd_run *r, int count, float *const *ys, const float *x, const ops_weight *const *ws,
                    const float *const *biases) {
  ops_backend *be = r->be;
  if (be->matmul_group && count > 1) {
    be->matmul_group(be, count, ys, x, r->n, ws, biases);
    return;
  }
  for (int i = 0; i < count; i++) be->matmul(be, ys[i], x, r->n, ws[i], biases ? biases[i] : NULL);
}

/* out[n, H] = attention mixer of xn. */
static void layer_attention(fwd_run *r, int li, const float *xn, float *out) {
  const text_model *m = r->m;
  const model_config *c = &m->cfg;
  const layer_config *lc = &c->layers[li];
  const layer_weights *w = &m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n;
  const int D = lc->head_dim, Hq = c->n_heads, Hkv = lc->n_kv_heads;
  const int64_t qd = (int64_t)Hq * D, kvd = (int64_t)Hkv * D;
  float *qf = s->w->buf[0], *q = s->w->buf[1], *k = s->w->buf[3], *v = s->w->buf[4];

  const float eps = (float)c->eps;
  const int one_plus = c->norm == NORM_KIND_1PW;
  /* q, and k and v where this layer owns its cache (k alone with attention_k_eq_v), from the
   * same xn; k and v stay untouched until their norms below. */
  const int own = lc->kv_source == li;
  /* Where the batch's K/V rows go and which block tables the op reads (host pointers). */
  kv_attn_rows kr;
  kv_cache_attn_rows(s->kv, r->b, li, &kr);
  {
    float *ys[3] = {qf, k, v};
    const ops_weight *ws[3] = {&w->q, &w->k, &w->v};
    const float *bs[3] = {w->q_bias, w->k_bias, w->v_bias};
    project(r, own ? (w->v.data ? 3 : 2) : 1, ys, xn, ws, bs);
  }
  /* q_proj rows are [head][query D | gate D] with the output gate: the queries are copied
   * out; the gate is read in place (strided) by mul_sigmoid below, qf staying untouched
   * until then. */
  const int qhs = c->attn_out_gate ? 2 * D : D; /* query head stride in qf */
  if (!c->attn_out_gate) q = qf;
  /* mRoPE: the T axis rides the usual rope (T frequencies, T positions), H and W follow */
  const float *freq = r->mrope ? s->mfreq + (size_t)li * 3 * s->mfreq_half : w->inv_freq;
  const int32_t *rp = r->mrope ? s->w->rpos : s->w->pos;
  if (w->q_norm && be->norm_rope) { /* copy, norm and rope in one kernel */
    be->norm_rope(be, q, qf, n, Hq, D, (int64_t)Hq * qhs, qhs, w->q_norm, eps, one_plus, lc->rope_dims,
                  freq, rp, lc->rope_interleaved);
  } else {
    if (c->attn_out_gate) be->copy_rows(be, q, D, qf, 2 * D, n * Hq, D);
    if (w->q_norm) norm(r, q, q, w->q_norm, n * Hq, D);
    be->rope(be, q, n, Hq, D, qd, lc->rope_dims, freq, rp, lc->rope_interleaved);
  }
  for (int ax = 1; r->mrope && ax < 3; ax++)
    be->rope(be, q, n, Hq, D, qd, lc->rope_dims, freq + ax * s->mfreq_half, s->w->rpos + ax * s->n_batch,
             lc->rope_interleaved);

  if (own) {
    if (!w->v.data) be->copy_rows(be, v, kvd, k, kvd, n, (int)kvd); /* attention_k_eq_v: V is the raw K */
    if (w->k_norm && be->norm_rope) {
      be->norm_rope(be, k, k, n, Hkv, D, kvd, D, w->k_norm, eps, one_plus, lc->rope_dims, freq, rp,
                    lc->rope_interleaved);
      if (c->v_norm) be->rmsnorm(be, v, v, NULL, n * Hkv, D, eps, 0);
    } else {
      if (w->k_norm) norm(r, k, k, w->k_norm, n * Hkv, D);
      if (c->v_norm) be->rmsnorm(be, v, v, NULL, n * Hkv, D, eps, 0);
      be->rope(be, k, n, Hkv, D, kvd, lc->rope_dims, freq, rp, lc->rope_interleaved);
    }
    for (int ax = 1; r->mrope && ax < 3; ax++)
      be->rope(be, k, n, Hkv, D, kvd, lc->rope_dims, freq + ax * s->mfreq_half, s->w->rpos + ax * s->n_batch,
               lc->rope_interleaved);
    if (kr.kv_type == OPS_KV_F32) {
      be->scatter_rows(be, (float *const *)kr.wk, k, n, (int)kvd);
      be->scatter_rows(be, (float *const *)kr.wv, v, n, (int)kvd);
    } else {
      be->kv_store(be, kr.wk, k, n, Hkv, D, kr.kv_type);
      be->kv_store(be, kr.wv, v, n, Hkv, D, kr.kv_type);
    }
    if (kr.residual_len) { /* the newest positions also in f32 */
      be->scatter_rows(be, kr.wrk, k, n, (int)kvd);
      be->scatter_rows(be, kr.wrv, v, n, (int)kvd);
    }
  }
  ops_attn_args a = {
      .n = n, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .v_dim = D,
      .kv_type = kr.kv_type, .kv_row_bytes = kr.row_bytes, .block_len = kr.block_len,
      .scale = c->attn_scale, .window = lc->window, .softcap = c->attn_softcap, .pos = s->w->pos,
      .k_blocks = (const void *const *const *)kr.kp, .v_blocks = (const void *const *const *)kr.vp,
      .residual_len = kr.residual_len, .ring_len = kr.ring_len,
      .k_ring = kr.residual_len ? kr.rkp : NULL, .v_ring = kr.residual_len ? kr.rvp : NULL,
      .keys_hint = r->keys_hint,
  };
  float *ao = s->w->buf[4] == v && own ? s->w->buf[3] : s->w->buf[4];
  be->attention(be, ao, q, &a);
  if (c->attn_out_gate) be->mul_sigmoid(be, ao, qf + D, n * Hq, D, 2 * D, 0);
  be->matmul(be, out, ao, n, &w->o, NULL);
}

/* out[n, H] = Gated DeltaNet mixer of xn. */
static void layer_gdn(fwd_run *r, int li, const float *xn, float *out) {
  const text_model *m = r->m;
  const model_config *c = &m->cfg;
  const layer_weights *w = &m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const kv_plan *p = r->p;
  const int64_t n = r->n;
  const int hk = c->gdn_hk, hv = c->gdn_hv, dk = c->gdn_dk, dv = c->gdn_dv;
  const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd;
  float *qkv = s->w->buf[0], *z = s->w->buf[1], *ba = s->w->buf[2], *conv = s->w->buf[3], *gates = s->w->buf[4];

  {
    float *ys[4] = {qkv, z, ba, ba + n * hv};
    const ops_weight *ws[4] = {&w->qkv, &w->z, &w->b, &w->a};
    project(r, 4, ys, xn, ws, NULL);
  }
  /* Decode: when every run is short (the recurrent kernel's range) and uncut, one fused
   * gdn_step replaces conv, copies, norms, gates, delta rule and output norm: for one run its
   * single-run form; for several, the batched form (a run table), one op per
   * OPS_GDN_STEP_MAX_RUNS runs instead of one per sequence (a launch each on a GPU). */
  int fused = be->gdn_step != NULL;
  for (int ri = 0; ri < p->n_runs; ri++)
    if (p->run_ncut[ri] || p->run_len[ri] >= GDN_CHUNKED_MIN) fused = 0;
  if (fused) {
    float *y = s->w->buf[3];
    if (p->n_runs == 1) {
      const int64_t t0 = p->run_start[0];
      const int sq = p->run_seq[0];
      const ops_gdn_step_args a = {
          .n = p->run_len[0], .hk = hk, .hv = hv, .dk = dk, .dv = dv, .kw = c->gdn_conv,
          .v_tiled = c->gdn_v_tiled, .eps = (float)c->eps, .qkv = qkv + t0 * cd, .z = z + t0 * Vd,
          .b = ba + t0 * hv, .a = ba + n * hv + t0 * hv, .conv_w = w->conv_w, .a_log = w->a_log,
          .dt_bias = w->dt_bias, .norm_w = w->gdn_norm, .conv_state = kv_cache_conv(s->kv, li, sq),
          .state = kv_cache_ssm(s->kv, li, sq),
          .y = y + t0 * Vd, .work = s->w->buf[4],
      };
      be->gdn_step(be, &a);
    } else {
      /* the plan's runs are disjoint row ranges of distinct sequences, as the table needs */
      ops_gdn_step_run runs[OPS_GDN_STEP_MAX_RUNS];
      for (int r0 = 0; r0 < p->n_runs; r0 += OPS_GDN_STEP_MAX_RUNS) {
        const int nr = p->n_runs - r0 < OPS_GDN_STEP_MAX_RUNS ? p->n_runs - r0 : OPS_GDN_STEP_MAX_RUNS;
        for (int i = 0; i < nr; i++) {
          const int sq = p->run_seq[r0 + i];
          runs[i] = (ops_gdn_step_run){.start = p->run_start[r0 + i], .n = p->run_len[r0 + i],
                                       .conv_state = kv_cache_conv(s->kv, li, sq),
                                       .state = kv_cache_ssm(s->kv, li, sq)};
        }
        const ops_gdn_step_args a = {
            .n = 0, .hk = hk, .hv = hv, .dk = dk, .dv = dv, .kw = c->gdn_conv, .v_tiled = c->gdn_v_tiled,
            .eps = (float)c->eps, .qkv = qkv, .z = z, .b = ba, .a = ba + n * hv, .conv_w = w->conv_w,
            .a_log = w->a_log, .dt_bias = w->dt_bias, .norm_w = w->gdn_norm, .y = y, .work = s->w->buf[4],
            .n_runs = nr, .runs = runs,
        };
        be->gdn_step(be, &a);
      }
    }
    be->matmul(be, out, y, n, &w->out, NULL);
    return;
  }
  /* A run that reaches snapshot points (block boundaries, planned by kv_cache_plan) is cut
   * there and the state at each saved. */
  for (int ri = 0; ri < p->n_runs; ri++) {
    const int64_t t0 = p->run_start[ri], len = p->run_len[ri];
    const int sq = p->run_seq[ri];
    int64_t done = 0;
    for (int ci = 0; ci <= p->run_ncut[ri]; ci++) {
      const int last = ci == p->run_ncut[ri];
      const int64_t upto = last ? len : p->cut_at[p->run_cut0[ri] + ci];
      if (upto > done)
        be->conv1d_silu(be, conv + (t0 + done) * cd, qkv + (t0 + done) * cd, upto - done, (int)cd, w->conv_w,
                        c->gdn_conv, kv_cache_conv(s->kv, li, sq));
      done = upto;
      if (!last)
        be->copy(be, kv_cache_slot_conv(s->kv, p->cut_slot[p->run_cut0[ri] + ci], li),
                 kv_cache_conv(s->kv, li, sq), sizeof(float) * (size_t)conv_floats(c));
    }
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
  for (int ri = 0; ri < p->n_runs; ri++) {
    const int64_t t0 = p->run_start[ri], len = p->run_len[ri];
    const int sq = p->run_seq[ri];
    int64_t done = 0;
    for (int ci = 0; ci <= p->run_ncut[ri]; ci++) {
      const int last = ci == p->run_ncut[ri];
      const int64_t upto = last ? len : p->cut_at[p->run_cut0[ri] + ci], pn = upto - done, u = t0 + done;
      if (pn > 0) {
        ops_gdn_args a = {
            .n = pn, .hk = hk, .hv = hv, .dk = dk, .dv = dv, .v_tiled = c->gdn_v_tiled, .q = q + u * Kd,
            .k = k + u * Kd, .v = v + u * Vd, .g = g + u * hv, .beta = beta + u * hv,
            .state = kv_cache_ssm(s->kv, li, sq), .out = o + u * Vd,
        };
        if (pn >= GDN_CHUNKED_MIN) be->gdn_chunked(be, &a);
        else be->gdn_recurrent(be, &a);
      }
      done = upto;
      if (!last)
        be->copy(be, kv_cache_slot_ssm(s->kv, p->cut_slot[p->run_cut0[ri] + ci], li),
                 kv_cache_ssm(s->kv, li, sq), sizeof(float) * (size_t)ssm_floats(c));
    }
  }
  float *y = ba; /* [n, Vd] fits: buffers are wmax wide */
  be->rmsnorm_gated(be, y, o, z, w->gdn_norm, n * hv, dv, (float)c->eps);
  be->matmul(be, out, y, n, &w->out, NULL);
}

/* out = (act(g) * u) down^T over [n, d] rows; g may become the product. One op where the
 * backend folds the activation into the product (CUDA decode), else act_mul + matmul. */
static void act_down(fwd_run *r, float *out, float *g, const float *u, int64_t d, const ops_weight *down) {
  ops_backend *be = r->be;
  if (be->act_matmul) {
    be->act_matmul(be, out, g, g, u, r->n, d, d, r->m->cfg.act, down);
    return;
  }
  be->act_mul(be, g, g, u, r->n, (int)d, d, d, r->m->cfg.act);
  be->matmul(be, out, g, r->n, down, NULL);
}

/* y += sigmoid(sg[t]) * ((act(g) * u) down^T) over [n, d] rows (the shared expert's gated
 * output into the residual); tmp [n, down.rows] and g are scratch. One op where the backend
 * fuses the three (CUDA decode: the gate and the add in the down projection's epilogue),
 * else act_down, mul_sigmoid and add. */
static void act_down_gated_add(fwd_run *r, float *y, float *tmp, float *g, const float *u, int64_t d, const float *sg,
                               const ops_weight *down) {
  ops_backend *be = r->be;
  if (be->act_matmul_gated_add) {
    be->act_matmul_gated_add(be, y, tmp, g, g, u, r->n, d, d, r->m->cfg.act, sg, 1, down);
    return;
  }
  act_down(r, tmp, g, u, d, down);
  be->mul_sigmoid(be, tmp, sg, r->n, (int)down->rows, 1, 1);
  be->add(be, y, tmp, r->n * down->rows);
}

static void mlp(fwd_run *r, const ops_weight *gate, const ops_weight *up, const ops_weight *down,
                const float *xn, float *out) {
  const int64_t I = gate->rows;
  float *g = r->s->w->buf[0], *u = r->s->w->buf[1];
  float *ys[2] = {g, u};
  const ops_weight *ws[2] = {gate, up};
  project(r, 2, ys, xn, ws, NULL);
  act_down(r, out, g, u, I, down);
}

/* Sparse experts of layer li on xn, routed by logits [n, E], into out. */
static void moe_routed(fwd_run *r, int li, const float *logits, const float *xn, float *out) {
  const model_config *c = &r->m->cfg;
  const layer_weights *w = &r->m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n;
  be->moe_route(be, s->w->moe_idx, s->w->moe_w, logits, n, c->n_experts, c->top_k, c->norm_topk, w->per_expert_scale);
  be->moe_ffn(be, out, xn, n, c->hidden, s->w->moe_idx, s->w->moe_w, c->top_k, c->n_experts, w->exp_gate, w->exp_up, w->exp_down,
              c->act, s->w->moe_scratch);
}

/* Sparse experts of layer li on xn (router input rin) into out. */
static void moe(fwd_run *r, int li, const float *rin, const float *xn, float *out) {
  float *logits = r->s->w->buf[2];
  r->be->matmul(r->be, logits, rin, r->n, &r->m->layers[li].router, NULL);
  moe_routed(r, li, logits, xn, out);
}

/* x += res (the mixer's output), then the FFN block. With defer, the FFN's own residual
 * add is left to the caller (returns 1: res must still be added into x), who fuses it
 * with the next norm. */
static int layer_ffn(fwd_run *r, int li, float *x, int defer) {
  const text_model *m = r->m;
  const model_config *c = &m->cfg;
  const layer_config *lc = &c->layers[li];
  const layer_weights *w = &m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n, H = c->hidden;
  float *xn = s->w->xn, *res = s->w->res;
  add_norm(r, x, res, xn, w->pre_ff_norm, n, (int)H);
  if (c->arch == MODEL_ARCH_GEMMA4 && lc->is_moe) {
    /* Dense MLP and experts side by side, each with its own post-norm. */
    mlp(r, &w->gate, &w->up, &w->down, xn, res);
    norm(r, res, res, w->post_ff_norm1, n, (int)H);
    float *rin = s->w->logits_in; /* router input: rmsnorm(x) * scale / sqrt(H) */
    be->rmsnorm(be, rin, x, w->router_scale, n, (int)H, (float)c->eps, 0);
    be->scale(be, rin, 1.0f / sqrtf((float)H), n * H);
    norm(r, xn, x, w->pre_ff_norm2, n, (int)H);
    float *e = s->w->buf[3];
    moe(r, li, rin, xn, e);
    norm(r, e, e, w->post_ff_norm2, n, (int)H);
    be->add(be, res, e, n * H);
  } else if (lc->is_moe && w->sx_gate && be->matmul_group_route && w->router.rows == c->n_experts) {
    /* The shared expert as expert E of the routed ones (one gate/up and one down launch for
     * all k + 1 on a device backend): the router and the shared gate logit in one group,
     * whose route appends slot (E, sigmoid(logit)) to each token's k. */
    float *logits = s->w->buf[2], *sg = s->w->buf[4];
    float *ys[2] = {logits, sg};
    const ops_weight *ws[2] = {&w->router, &w->sh_gate_inp};
    be->matmul_group_route(be, 2, ys, xn, n, ws, NULL, 0, s->w->moe_idx, s->w->moe_w, c->top_k, c->norm_topk,
                           w->per_expert_scale, 1);
    be->moe_ffn(be, res, xn, n, c->hidden, s->w->moe_idx, s->w->moe_w, c->top_k + 1, c->n_experts + 1, w->sx_gate, w->sx_up,
                w->sx_down, c->act, s->w->moe_scratch);
  } else if (lc->is_moe && w->has_shared) {
    /* The router and the shared expert's gate, up and gate logit all read xn: one group
     * first (buf[0], [1], [4] are left alone by the routed experts, which use their own
     * scratch), then the experts into res, then the rest of the shared expert. */
    float *g = s->w->buf[0], *u = s->w->buf[1], *logits = s->w->buf[2], *sh = s->w->buf[3], *sg = s->w->buf[4];
    const int64_t S = w->sh_gate.rows;
    float *ys[4] = {logits, g, u, sg};
    const ops_weight *ws[4] = {&w->router, &w->sh_gate, &w->sh_up, &w->sh_gate_inp};
    if (be->matmul_group_route && w->router.rows == c->n_experts) { /* the route folded into the group */
      be->matmul_group_route(be, 4, ys, xn, n, ws, NULL, 0, s->w->moe_idx, s->w->moe_w, c->top_k, c->norm_topk,
                             w->per_expert_scale, -1);
      be->moe_ffn(be, res, xn, n, c->hidden, s->w->moe_idx, s->w->moe_w, c->top_k, c->n_experts, w->exp_gate, w->exp_up,
                  w->exp_down, c->act, s->w->moe_scratch);
    } else {
      project(r, 4, ys, xn, ws, NULL);
      moe_routed(r, li, logits, xn, res);
    }
    act_down_gated_add(r, res, sh, g, u, S, sg, &w->sh_down);
  } else if (lc->is_moe) {
    moe(r, li, xn, xn, res);
  } else {
    mlp(r, &w->gate, &w->up, &w->down, xn, res);
  }
  tp_reduce(r, res);
  if (c->post_norms) norm(r, res, res, w->post_ff_norm, n, (int)H);
  if (defer) return 1;
  be->add(be, x, res, n * H);
  return 0;
}

/* Gemma4 per-layer inputs for the batch: ple[n, L, P]. */
static void ple_inputs(fwd_run *r, const float *emb) {
  const text_model *m = r->m;
  const model_config *c = &m->cfg;
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n, LP = (int64_t)c->n_layers * c->ple_dim;
  float *tok = s->w->buf[0];
  be->embed(be, tok, &m->ple_embed, s->w->tokens, n, sqrtf((float)c->ple_dim));
  be->matmul(be, s->w->ple, emb, n, &m->ple_model_proj, NULL);
  be->scale(be, s->w->ple, 1.0f / sqrtf((float)c->hidden), n * LP);
  norm(r, s->w->ple, s->w->ple, m->ple_proj_norm, n * c->n_layers, c->ple_dim);
  be->add(be, s->w->ple, tok, n * LP);
  be->scale(be, s->w->ple, 1.0f / sqrtf(2.0f), n * LP);
}

static void layer_ple(fwd_run *r, int li, float *x) {
  const text_model *m = r->m;
  const model_config *c = &m->cfg;
  const layer_weights *w = &m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n, P = c->ple_dim, LP = (int64_t)c->n_layers * P;
  float *g = s->w->buf[0], *o = s->w->res;
  be->matmul(be, g, x, n, &w->ple_gate, NULL);
  be->act_mul(be, g, g, s->w->ple + li * P, n, (int)P, P, LP, ACT_KIND_GELU_TANH);
  be->matmul(be, o, g, n, &w->ple_proj, NULL);
  norm(r, o, o, w->ple_post_norm, n, c->hidden);
  be->add(be, x, o, n * c->hidden);
}

/* Moves the running pass from stage si - 1 to stage si: the hidden state x [n, H], the
 * pending residual when the last layer deferred its add, and Gemma4's per-layer inputs
 * cross by the backend's copy_to (device to device: CUDA) or else through host memory; both
 * are synchronous, so the previous stage's work has ended. Positions are uploaded again from
 * the batch. Afterwards r->be and s->w are stage si's. */
static void stage_handoff(fwd_state *s, fwd_run *r, int si, const anna_batch *b, const fwd_mm *mm, int pend) {
  const model_config *c = &r->m->cfg;
  const int64_t n = b->n, H = c->hidden, LP = (int64_t)c->n_layers * c->ple_dim;
  ops_backend *from = r->be, *to = s->st[si].be;
  const fwd_bufs *pb = s->w;
  fwd_bufs *nb = &s->st[si].b;
  const size_t xb = sizeof(float) * (size_t)(n * H), pb_bytes = sizeof(float) * (size_t)(n * LP);
  if (from->copy_to && from->copy_to == to->copy_to) { /* device to device (ops.h copy_to) */
    from->copy_to(from, to, nb->x, pb->x, xb);
    if (pend) from->copy_to(from, to, nb->res, pb->res, xb);
    if (LP > 0) from->copy_to(from, to, nb->ple, pb->ple, pb_bytes);
    if (to->bind) to->bind(to);
  } else {
    float *hx = s->hand, *hres = s->hand + n * H, *hple = s->hand + 2 * n * H;
    from->download(from, hx, pb->x, xb);
    if (pend) from->download(from, hres, pb->res, xb);
    if (LP > 0) from->download(from, hple, pb->ple, pb_bytes);
    if (to->bind) to->bind(to);
    to->upload(to, nb->x, hx, xb);
    if (pend) to->upload(to, nb->res, hres, xb);
    if (LP > 0) to->upload(to, nb->ple, hple, pb_bytes);
  }
  to->upload(to, nb->pos, b->pos, sizeof(int32_t) * (size_t)n);
  for (int ax = 0; r->mrope && ax < 3; ax++)
    to->upload(to, nb->rpos + (int64_t)ax * s->n_batch, mm->rope_pos + ax * n, sizeof(int32_t) * (size_t)n);
  r->be = to;
  s->w = nb;
}

int forward_batch(const text_model *m, ops_backend *be, fwd_state *s, const anna_batch *b, float *out,
                  const fwd_topk *tk, char *err, size_t errlen) {
  return forward_batch_mm(m, be, s, b, NULL, out, tk, err, errlen);
}

/* Checks fwd_mm against the batch before anything runs. */
static int mm_check(const text_model *m, const fwd_state *s, const anna_batch *b, const fwd_mm *mm, char *err,
                    size_t errlen) {
  if (mm->rope_pos && !s->w->rpos)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "3-axis rope positions: model_type '%s' has no mRoPE sections",
                    m->cfg.model_type);
  if (mm->n_embd < 0 || mm->n_embd > b->n || (mm->n_embd && (!mm->embd || !mm->embd_idx)))
    return anna_err(err, errlen, ANNA_EINVAL, "%lld embedding rows for a batch of %d tokens", (long long)mm->n_embd,
                    b->n);
  for (int64_t i = 0; i < mm->n_embd; i++)
    if (mm->embd_idx[i] < 0 || mm->embd_idx[i] >= b->n)
      return anna_err(err, errlen, ANNA_EINVAL, "embedding row %lld replaces batch row %d of %d", (long long)i,
                      mm->embd_idx[i], b->n);
  return 0;
}

int forward_batch_mm(const text_model *m, ops_backend *be, fwd_state *s, const anna_batch *b, const fwd_mm *mm,
                     float *out, const fwd_topk *tk, char *err, size_t errlen) {
  fwd_run r = {m, be, s, b, b->n, NULL, 0, 0};
  if (mm) {
    int rc = mm_check(m, s, b, mm, err, errlen);
    if (rc) return rc;
    r.mrope = mm->rope_pos != NULL;
  }
  for (int32_t i = 0; i < b->n; i++)
    if (b->pos[i] + 1 > r.keys_hint) r.keys_hint = b->pos[i] + 1;
  if (tk && (tk->k < 1 || tk->k > OPS_TOPK_MAX || tk->k > m->cfg.vocab || !be->topk))
    return anna_err(err, errlen, tk->k < 1 || tk->k > OPS_TOPK_MAX ? ANNA_EINVAL : ANNA_EUNSUPPORTED,
                    "top-%d candidates: %s", tk->k,
                    !be->topk ? "the backend has no topk op" : "k must be 1..256 and at most the vocabulary");
  s->last_nl = 0;
  /* The cache checks the batch, makes every written position writable (the only step that
   * can run out: nothing is written before it succeeds), picks snapshot slots and uploads
   * changed block tables. */
  if (mm && mm->cache_keys) kv_cache_next_keys(s->kv, mm->cache_keys);
  int rc = kv_cache_plan(s->kv, b, &s->plan, err, errlen);
  if (rc) return rc;
  r.p = &s->plan;
  const model_config *c = &m->cfg;
  const int64_t n = b->n, H = c->hidden;
  s->w = &s->st[0].b;
  if (be->bind) be->bind(be);
  be->upload(be, s->w->tokens, b->tokens, sizeof(int32_t) * (size_t)n);
  be->upload(be, s->w->pos, b->pos, sizeof(int32_t) * (size_t)n);
  float *x = s->w->x;
  be->embed(be, x, &m->embed, s->w->tokens, n, c->embed_scale);
  if (mm) {
    /* one copy per run of consecutive rows (an image's pads are one run) */
    for (int64_t i = 0, j; i < mm->n_embd; i = j) {
      for (j = i + 1; j < mm->n_embd && mm->embd_idx[j] == mm->embd_idx[j - 1] + 1; j++) {
      }
      be->upload(be, x + (int64_t)mm->embd_idx[i] * H, mm->embd + i * H, sizeof(float) * (size_t)((j - i) * H));
    }
    for (int ax = 0; r.mrope && ax < 3; ax++)
      be->upload(be, s->w->rpos + (int64_t)ax * s->n_batch, mm->rope_pos + ax * n, sizeof(int32_t) * (size_t)n);
  }
  if (c->ple_dim > 0) ple_inputs(&r, x);
  /* pend: s->w->res still has to be added into x (a layer's last residual add, fused with the
   * next norm; only where nothing else (PLE, layer scalar) comes between). */
  int pend = 0;
  for (int si = 0; si < s->n_stages; si++) {
    if (si > 0) {
      stage_handoff(s, &r, si, b, mm, pend);
      x = s->w->x;
    }
    for (int li = s->st[si].l0; li < s->st[si].l1; li++) {
      const layer_config *lc = &c->layers[li];
      const layer_weights *w = &m->layers[li];
      if (pend) add_norm(&r, x, s->w->res, s->w->xn, w->attn_norm, n, (int)H);
      else norm(&r, s->w->xn, x, w->attn_norm, n, (int)H);
      if (lc->kind == LAYER_KIND_GDN) layer_gdn(&r, li, s->w->xn, s->w->res);
      else layer_attention(&r, li, s->w->xn, s->w->res);
      tp_reduce(&r, s->w->res);
      if (w->post_attn_norm) norm(&r, s->w->res, s->w->res, w->post_attn_norm, n, (int)H);
      pend = layer_ffn(&r, li, x, c->ple_dim == 0 && w->layer_scalar == 1.0f);
      if (c->ple_dim > 0) layer_ple(&r, li, x);
      if (w->layer_scalar != 1.0f) r.be->scale(r.be, x, w->layer_scalar, n * H);
    }
  }
  kv_cache_commit(s->kv, &s->plan);
  if (s->tp_ar && s->tp_rank > 0) return 0; /* rank 0 makes the outputs */
  be = r.be; /* the last stage: final norm, lm_head, candidates */
  /* Logits only for the flagged tokens. */
  int64_t nl = 0;
  for (int64_t t = 0; t < n; t++) nl += !b->logits || b->logits[t];
  if (nl == n && pend) { /* every row: the last residual add and the final norm in one */
    add_norm(&r, x, s->w->res, s->w->logits_in, m->final_norm, n, (int)H);
  } else {
    if (pend) be->add(be, x, s->w->res, n * H);
    nl = 0;
    for (int64_t t = 0; t < n; t++)
      if (!b->logits || b->logits[t]) be->copy_rows(be, s->w->logits_in + (nl++) * H, H, x + t * H, H, 1, (int)H);
    if (nl == 0) return 0;
    norm(&r, s->w->logits_in, s->w->logits_in, m->final_norm, nl, (int)H);
  }
  if (mm && mm->hidden) {
    be->download(be, mm->hidden, s->w->logits_in, sizeof(float) * (size_t)(nl * H));
    if (!out && !tk) return 0;
  }
  be->matmul(be, s->w->logits, s->w->logits_in, nl, &m->lm_head, NULL);
  if (c->final_softcap > 0) be->softcap(be, s->w->logits, nl * c->vocab, c->final_softcap);
  s->last_nl = nl;
  if (!tk) {
    be->download(be, out, s->w->logits, sizeof(float) * (size_t)(nl * c->vocab));
    return 0;
  }
  /* Candidates instead of the logits: the op runs inside the step (a graph node on CUDA),
   * then one download of a few KB. The logits stay for fwd_state_logits_row. */
  const int k = tk->k;
  double *st = s->w->tk_dev;
  int32_t *ti = (int32_t *)(st + 2 * nl);
  float *tv = (float *)(ti + nl * k);
  be->topk(be, ti, tv, st, s->w->logits, nl, c->vocab, k, tk->temp);
  const size_t bytes = (size_t)nl * (2 * sizeof(double) + (size_t)k * (sizeof(int32_t) + sizeof(float)));
  be->download(be, s->tk_host, s->w->tk_dev, bytes);
  const double *hs = s->tk_host;
  const int32_t *hi = (const int32_t *)(hs + 2 * nl);
  memcpy(tk->stats, hs, sizeof(double) * 2 * (size_t)nl);
  memcpy(tk->idx, hi, sizeof(int32_t) * (size_t)(nl * k));
  memcpy(tk->val, hi + nl * k, sizeof(float) * (size_t)(nl * k));
  return 0;
}

void fwd_state_logits_rows(fwd_state *s, model_rows *out) {
  const fwd_stage *ls = &s->st[s->n_stages - 1];
  const size_t n = (size_t)s->n_batch;
  *out = (model_rows){.be = ls->be,
                      .logits = ls->b.logits,
                      .n = s->last_nl,
                      .vocab = s->cfg->vocab,
                      .tk_dev = ls->b.tk_dev,
                      .tk_host = s->tk_host,
                      .tk_bytes = n * FWD_TOPK_ROW_BYTES,
                      .scr_dev = ls->b.smp_dev,
                      .scr_host = s->smp_host,
                      .scr_bytes = n * FWD_SAMPLE_ROW_BYTES(s->cfg->vocab)};
}

int fwd_state_logits_row(const fwd_state *s, int64_t row, float *out, char *err, size_t errlen) {
  if (row < 0 || row >= s->last_nl)
    return anna_err(err, errlen, ANNA_ERANGE, "logits row %lld: the last decode left %lld rows", (long long)row,
                    (long long)s->last_nl);
  const int64_t V = s->cfg->vocab;
  const fwd_stage *ls = &s->st[s->n_stages - 1];
  ls->be->download(ls->be, out, ls->b.logits + row * V, sizeof(float) * (size_t)V);
  return 0;
}
