/* text_decoder.c: the text decoder as a model kind: thin adapters from the model_kind
 * table (kind.h) to the loaders, fwd_state and forward_batch, which stay as they were. */
#include "model/text_decoder.h"

#include "base/error.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "model/mtp.h"
#include "model/shard.h"

#include <stdlib.h>

static int td_probe(const model_source *src) {
  return src->is_gguf ? gguf_model_arch_known(src->gguf_arch)
                      : config_arch_from_name(src->model_type) >= 0;
}

static int td_load(void **impl, const model_source *src, const model_load_params *p, char *err,
                   size_t errlen) {
  *impl = NULL;
  text_model *m = NULL;
  int rc = src->is_gguf ? gguf_model_load(&m, src->path, err, errlen)
                        : model_load_hf(&m, src->path, err, errlen);
  if (rc) return rc;
  *impl = m;
  return 0;
}

static void td_free(void *impl) {
  model_free(impl);
}

static void td_describe(const void *impl, model_desc *out) {
  const text_model *m = impl;
  *out = (model_desc){.text = m->describe, .vocab = m->cfg.vocab, .n_layers = m->cfg.n_layers,
                     .hidden = (int)m->cfg.hidden};
}

static void td_backend_shape(const void *impl, int n_ctx, ops_model_shape *out) {
  model_shape_get(impl, n_ctx, out);
}

/* The kind's state: one fwd_state, or one per tensor-parallel shard (model_state_params.n_tp),
 * which run every batch together (td_run) and take every sequence operation alike, so their
 * caches hold the same blocks and lengths. */
typedef struct td_state {
  int n;
  fwd_state *s[SHARD_MAX];
  const text_model *m[SHARD_MAX];
  ops_backend *be[SHARD_MAX];
  void *tp_ctx;
  void (*tp_exec)(void *ctx, void (*fn)(void *arg, int rank), void *arg);
  /* the batch being fanned out (td_run), and each shard's result */
  const model_input *in;
  const fwd_mm *mm;
  const fwd_topk *tk;
  float *logits;
  int rc[SHARD_MAX];
  char err[SHARD_MAX][256];
} td_state;

static void td_state_free(void *state) {
  td_state *t = state;
  if (!t) return;
  for (int i = 0; i < t->n; i++) fwd_state_free(t->s[i]);
  free(t);
}

static int td_state_create(void **state, const void *impl, ops_backend *be,
                           const model_state_params *p, char *err, size_t errlen) {
  *state = NULL;
  const int n = p->n_tp > 1 ? p->n_tp : 1;
  if (n > SHARD_MAX || (n > 1 && (!p->tp_be || !p->tp_impl || !p->tp_all_reduce || !p->tp_exec)))
    return anna_err(err, errlen, ANNA_EINVAL, "tensor parallel: %d shards without their backends or hooks", n);
  if (n > 1 && p->n_stages > 1)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "--tensor-parallel with --layer-split is not supported yet");
  td_state *t = calloc(1, sizeof *t);
  if (!t) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  t->n = n;
  t->tp_ctx = p->tp_ctx;
  t->tp_exec = p->tp_exec;
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    fwd_state_options fo = {.n_ckpt = p->n_ckpt,
                            .kv_type = p->kv_type,
                            .block_len = p->block_len,
                            .n_blocks = p->n_blocks,
                            .residual_len = p->residual_len,
                            .prefix_share = p->prefix_share,
                            .snapshot_interval = p->snapshot_interval,
                            .n_stages = p->n_stages,
                            .stage_be = p->stage_be,
                            .stage_layers = p->stage_layers};
    t->m[i] = n > 1 ? p->tp_impl[i] : impl;
    t->be[i] = n > 1 && i ? p->tp_be[i] : be;
    if (n > 1) fo.tp_rank = i, fo.tp_all_reduce = p->tp_all_reduce, fo.tp_ctx = p->tp_ctx;
    rc = fwd_state_create(&t->s[i], t->m[i], t->be[i], p->n_seq, p->n_ctx, p->n_batch, &fo, err, errlen);
  }
  if (rc) {
    t->n = n;
    td_state_free(t);
    return rc;
  }
  *state = t;
  return 0;
}

/* One shard's part of td_run (tp_exec calls it on the shard's thread; rank 0 makes the
 * outputs, the others stop after the layers). */
static void td_run_shard(void *arg, int r) {
  td_state *t = arg;
  const model_input *in = t->in;
  /* the prefix keys reach every shard's cache; the outputs only rank 0 */
  const fwd_mm keys = {.cache_keys = t->mm ? t->mm->cache_keys : NULL};
  const fwd_mm *mm = r ? (keys.cache_keys ? &keys : NULL) : t->mm;
  t->rc[r] = forward_batch_mm(t->m[r], t->be[r], t->s[r], in->batch, mm, r ? NULL : t->logits, r ? NULL : t->tk,
                              t->err[r], sizeof t->err[r]);
}

static int td_forward(const void *impl, td_state *t, ops_backend *be, const model_input *in, const fwd_mm *mm,
                      float *logits, const fwd_topk *tk, char *err, size_t errlen) {
  if (t->n == 1) return forward_batch_mm(impl, be, t->s[0], in->batch, mm, logits, tk, err, errlen);
  /* rank 0 runs on the backend the caller gives (the context's, as with one shard) */
  t->be[0] = be;
  t->in = in, t->mm = mm, t->logits = logits, t->tk = tk;
  if (mm && (mm->n_embd || mm->rope_pos)) /* the other shards need the embedding rows too */
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "--tensor-parallel: image, video and audio rows are not split yet");
  /* What only rank 0's call would refuse is refused here: a shard that returned early would
   * leave the others waiting at their first all-reduce. */
  const text_model *m0 = t->m[0];
  if (tk && (tk->k < 1 || tk->k > OPS_TOPK_MAX || tk->k > m0->cfg.vocab || !be->topk))
    return anna_err(err, errlen, tk->k < 1 || tk->k > OPS_TOPK_MAX ? ANNA_EINVAL : ANNA_EUNSUPPORTED,
                    "top-%d candidates: %s", tk->k,
                    !be->topk ? "the backend has no topk op" : "k must be 1..256 and at most the vocabulary");
  t->tp_exec(t->tp_ctx, td_run_shard, t);
  for (int r = 0; r < t->n; r++)
    if (t->rc[r]) return anna_err(err, errlen, t->rc[r], "shard %d: %s", r, t->err[r]);
  return 0;
}

static int td_run(const void *impl, void *state, ops_backend *be, const model_input *in,
                  const model_output *out, char *err, size_t errlen) {
  if (in->io != MODEL_IO_TOKENS || (out->io != MODEL_IO_LOGITS && out->io != MODEL_IO_HIDDEN))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "the text decoder maps tokens to logits or hidden states, not %s to %s",
                    model_io_name(in->io), model_io_name(out->io));
  td_state *t = state;
  /* embedding rows and 3-axis positions (multimodal Qwen3.5) ride along with the tokens */
  const fwd_mm mm = {in->rope_pos, in->embd, in->embd_idx, in->n_embd, out->hidden, in->cache_keys};
  const fwd_mm *mmp = in->n_embd || in->rope_pos || out->hidden || in->cache_keys ? &mm : NULL;
  if (out->io == MODEL_IO_HIDDEN) /* the final-norm rows; the forward stops before lm_head */
    return td_forward(impl, t, be, in, &mm, NULL, NULL, err, errlen);
  if (out->topk) {
    const model_topk *k = out->topk;
    const fwd_topk tk = {k->k, k->temp, k->idx, k->val, k->stats};
    return td_forward(impl, t, be, in, mmp, NULL, &tk, err, errlen);
  }
  return td_forward(impl, t, be, in, mmp, out->logits, NULL, err, errlen);
}

/* Backends that copy weights on first use (ops_backend.warmup): one throwaway token on
 * sequence 0 (then reset) copies the weights it touches now rather than inside the caller's
 * first, timed, decode. Experts a MoE router did not pick are still copied on first use. */
static int td_warmup(const void *impl, void *state, ops_backend *be, char *err, size_t errlen) {
  const text_model *m = impl;
  td_state *t = state;
  float *lg = malloc(sizeof(float) * (size_t)m->cfg.vocab);
  if (!lg) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  int32_t tok = 0, seq = 0, pos = 0;
  int8_t want = 1;
  anna_batch b = {1, &tok, &seq, &pos, &want};
  const model_input in = {.io = MODEL_IO_TOKENS, .batch = &b};
  int rc = td_forward(impl, t, be, &in, NULL, lg, NULL, err, errlen);
  for (int i = 0; i < t->n; i++) fwd_state_seq_reset(t->s[i], 0);
  free(lg);
  return rc;
}

/* ---- per-sequence state: fwd_state's delegations to the cache, to every shard alike ---- */

#define TD(s) ((const td_state *)(s))

static int32_t td_seq_len(const void *s, int seq) {
  return fwd_state_seq_len(TD(s)->s[0], seq);
}
static void td_seq_reset(void *s, int seq) {
  for (int i = 0; i < TD(s)->n; i++) fwd_state_seq_reset(TD(s)->s[i], seq);
}
static int td_checkpoint(void *s, int seq, char *err, size_t errlen) {
  int rc = 0;
  for (int i = 0; i < TD(s)->n && !rc; i++) rc = fwd_state_checkpoint(TD(s)->s[i], seq, err, errlen);
  return rc;
}
static int td_rewind(void *s, int seq, int32_t n, char *err, size_t errlen) {
  int rc = 0;
  for (int i = 0; i < TD(s)->n && !rc; i++) rc = fwd_state_seq_rewind(TD(s)->s[i], seq, n, err, errlen);
  return rc;
}
static int32_t td_window(void *s, int seq, int32_t n) {
  int32_t r = 0;
  for (int i = 0; i < TD(s)->n; i++) r = fwd_state_window(TD(s)->s[i], seq, n);
  return r;
}
static int td_copy(void *s, int dst, int src, int32_t n, char *err, size_t errlen) {
  int rc = 0;
  for (int i = 0; i < TD(s)->n && !rc; i++) rc = fwd_state_seq_copy(TD(s)->s[i], dst, src, n, err, errlen);
  return rc;
}
static int32_t td_prefix_attach(void *s, int seq, const int32_t *tokens, int32_t n,
                                int register_blocks) {
  /* the shards' pools saw the same tokens and blocks, so they reuse the same prefix */
  int32_t r = 0;
  for (int i = 0; i < TD(s)->n; i++) {
    const int32_t k = fwd_state_prefix_attach(TD(s)->s[i], seq, tokens, n, register_blocks);
    if (i == 0 || k < r) r = k;
  }
  for (int i = 0; i < TD(s)->n; i++) /* never the case, kept exact should a pool ever differ */
    if (fwd_state_seq_len(TD(s)->s[i], seq) != r) fwd_state_seq_rewind(TD(s)->s[i], seq, r, NULL, 0);
  return r;
}
static int64_t td_blocks_needed(const void *s, int seq, int32_t n) {
  return fwd_state_seq_blocks_needed(TD(s)->s[0], seq, n);
}
static int64_t td_blocks_held(const void *s, int seq) {
  return fwd_state_seq_blocks_held(TD(s)->s[0], seq);
}
static void td_kv_stats(const void *s, anna_kv_stats *st) {
  fwd_state_kv_stats(TD(s)->s[0], st);
}
static int64_t td_kv_bytes_per_token(const void *s) {
  int64_t b = 0;
  for (int i = 0; i < TD(s)->n; i++) b += fwd_state_kv_bytes_per_token(TD(s)->s[i]);
  return b;
}
static int td_logits_row(const void *s, int64_t row, float *out, char *err, size_t errlen) {
  return fwd_state_logits_row(TD(s)->s[0], row, out, err, errlen);
}
static void td_logits_rows(void *s, model_rows *out) {
  fwd_state_logits_rows(TD(s)->s[0], out);
}

/* ---- the MTP head (model/mtp.h) ---- */

static int td_draft_available(const void *impl) {
  return ((const text_model *)impl)->mtp != NULL;
}
static int td_draft_width(const void *impl) {
  return ((const text_model *)impl)->cfg.hidden;
}
static int td_draft_state_create(void **state, const void *impl, ops_backend *be, const model_state_params *p,
                                 char *err, size_t errlen) {
  mtp_state *s = NULL;
  int rc = mtp_state_create(&s, impl, be, p->n_seq, p->n_ctx, p->n_batch, err, errlen);
  *state = s;
  return rc;
}
static void td_draft_state_free(void *state) {
  mtp_state_free(state);
}
static int td_draft_run(const void *impl, void *state, ops_backend *be, const anna_batch *b, const float *h_in,
                        float *h_out, const model_topk *t, char *err, size_t errlen) {
  if (!t) return mtp_run(impl, be, state, b, h_in, h_out, NULL, NULL, err, errlen);
  const fwd_topk tk = {t->k, t->temp, t->idx, t->val, t->stats};
  return mtp_run(impl, be, state, b, h_in, h_out, NULL, &tk, err, errlen);
}
static int32_t td_draft_seq_len(const void *state, int seq) {
  return mtp_seq_len(state, seq);
}
static void td_draft_reset(void *state, int seq) {
  mtp_seq_reset(state, seq);
}
static int td_draft_rewind(void *state, int seq, int32_t n, char *err, size_t errlen) {
  return mtp_seq_rewind(state, seq, n, err, errlen);
}

static const model_draft_ops td_draft = {
    .available = td_draft_available,
    .width = td_draft_width,
    .state_create = td_draft_state_create,
    .state_free = td_draft_state_free,
    .run = td_draft_run,
    .seq_len = td_draft_seq_len,
    .reset = td_draft_reset,
    .rewind = td_draft_rewind,
};

static int64_t td_layer_bytes(const void *state, int l) {
  int64_t b = 0;
  for (int i = 0; i < TD(state)->n; i++) b += fwd_state_layer_bytes(TD(state)->s[i], l);
  return b;
}

static int td_tp_shard(void **out, const void *impl, int rank, int n, char *err, size_t errlen) {
  text_model *s = NULL;
  int rc = model_shard_create(&s, impl, rank, n, err, errlen);
  *out = s;
  return rc;
}

static const model_seq_ops td_seq = {
    .seq_len = td_seq_len,
    .reset = td_seq_reset,
    .checkpoint = td_checkpoint,
    .rewind = td_rewind,
    .window = td_window,
    .copy = td_copy,
    .prefix_attach = td_prefix_attach,
    .kv_stats = td_kv_stats,
    .blocks_needed = td_blocks_needed,
    .blocks_held = td_blocks_held,
    .kv_bytes_per_token = td_kv_bytes_per_token,
    .logits_row = td_logits_row,
    .logits_rows = td_logits_rows,
    .layer_bytes = td_layer_bytes,
};

const model_kind text_decoder_kind = {
    .name = "text_decoder",
    .inputs = MODEL_IO_BIT(MODEL_IO_TOKENS) | MODEL_IO_BIT(MODEL_IO_EMBEDDINGS),
    .outputs = MODEL_IO_BIT(MODEL_IO_LOGITS) | MODEL_IO_BIT(MODEL_IO_HIDDEN),
    .probe = td_probe,
    .load = td_load,
    .free = td_free,
    .describe = td_describe,
    .backend_shape = td_backend_shape,
    .state_create = td_state_create,
    .state_free = td_state_free,
    .run = td_run,
    .warmup = td_warmup,
    .seq = &td_seq,
    .draft = &td_draft,
    .layer_split = 1,
    .tp_shard = td_tp_shard,
    .tp_shard_free = td_free,
};
