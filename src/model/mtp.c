/* mtp.c: the MTP head's forward: the input projection here, written against ops.h, then the
 * head's one-layer decoder through forward_batch_mm with every row an embedding row. */
#include "model/mtp.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

struct mtp_state {
  ops_backend *be;
  fwd_state *fs; /* the head's decoder: its KV cache and activations */
  int n_batch;
  int64_t H;
  int32_t *d_tok;          /* backend [n_batch] */
  float *d_e, *d_h, *d_cat; /* backend [n_batch, H], [n_batch, H], [n_batch, 2H] */
  float *d_x;               /* backend [n_batch, H]: fc output */
  float *x;                 /* host [n_batch, H]: the decoder's embedding rows */
  int32_t *idx;             /* host [n_batch]: 0 .. n_batch-1 */
};

int mtp_state_create(mtp_state **out, const text_model *m, ops_backend *be, int n_seq, int n_ctx, int n_batch,
                     char *err, size_t errlen) {
  *out = NULL;
  if (!m->mtp) return anna_err(err, errlen, ANNA_EINVAL, "%s: the model has no MTP head", m->path);
  if (n_batch < 1) return anna_err(err, errlen, ANNA_EINVAL, "MTP state: n_batch %d", n_batch);
  mtp_state *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  s->be = be;
  s->n_batch = n_batch;
  s->H = m->cfg.hidden;
  const fwd_state_options fo = {.prefix_share = 0};
  int rc = fwd_state_create(&s->fs, m->mtp->dec, be, n_seq, n_ctx, n_batch, &fo, err, errlen);
  if (rc) {
    mtp_state_free(s);
    return rc;
  }
  const size_t nb = (size_t)n_batch, H = (size_t)s->H;
  s->d_tok = be->alloc(be, nb * sizeof(int32_t));
  s->d_e = be->alloc(be, nb * H * sizeof(float));
  s->d_h = be->alloc(be, nb * H * sizeof(float));
  s->d_cat = be->alloc(be, 2 * nb * H * sizeof(float));
  s->d_x = be->alloc(be, nb * H * sizeof(float));
  s->x = malloc(nb * H * sizeof(float));
  s->idx = malloc(nb * sizeof(int32_t));
  if (!s->d_tok || !s->d_e || !s->d_h || !s->d_cat || !s->d_x || !s->x || !s->idx) {
    mtp_state_free(s);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory (MTP state)");
  }
  for (int i = 0; i < n_batch; i++) s->idx[i] = i;
  *out = s;
  return 0;
}

void mtp_state_free(mtp_state *s) {
  if (!s) return;
  ops_backend *be = s->be;
  void *d[] = {s->d_tok, s->d_e, s->d_h, s->d_cat, s->d_x};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
    if (d[i]) be->free(be, d[i]);
  fwd_state_free(s->fs);
  free(s->x);
  free(s->idx);
  free(s);
}

int mtp_run(const text_model *m, ops_backend *be, mtp_state *s, const anna_batch *b, const float *h_in, float *h_out,
            float *out, const fwd_topk *tk, char *err, size_t errlen) {
  const mtp_head *h = m->mtp;
  if (!h) return anna_err(err, errlen, ANNA_EINVAL, "%s: the model has no MTP head", m->path);
  if (!b || b->n < 1 || b->n > s->n_batch || !b->tokens || !b->seq || !b->pos || !h_in)
    return anna_err(err, errlen, ANNA_EINVAL, "MTP: %d rows (1..%d, with tokens, sequences, positions and hidden states)",
                    b ? b->n : 0, s->n_batch);
  const model_config *c = &m->cfg;
  const int64_t n = b->n, H = s->H;
  for (int64_t i = 0; i < n; i++)
    if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab)
      return anna_err(err, errlen, ANNA_EINVAL, "MTP: token %d of row %lld is not in the vocabulary (%d)", b->tokens[i],
                      (long long)i, c->vocab);
  const int one_plus = c->norm == NORM_KIND_1PW;
  /* x = fc([norm_e(embed(tok)) | norm_h(h)]): the concatenation is two strided row copies, so
   * fc stays one matmul over 2H columns (its weight as stored) */
  be->upload(be, s->d_tok, b->tokens, sizeof(int32_t) * (size_t)n);
  be->embed(be, s->d_e, &m->embed, s->d_tok, n, c->embed_scale);
  be->rmsnorm(be, s->d_e, s->d_e, h->norm_e, n, (int)H, (float)c->eps, one_plus);
  be->upload(be, s->d_h, h_in, sizeof(float) * (size_t)(n * H));
  be->rmsnorm(be, s->d_h, s->d_h, h->norm_h, n, (int)H, (float)c->eps, one_plus);
  be->copy_rows(be, s->d_cat, 2 * H, s->d_e, H, n, (int)H);
  be->copy_rows(be, s->d_cat + H, 2 * H, s->d_h, H, n, (int)H);
  be->matmul(be, s->d_x, s->d_cat, n, &h->fc, NULL);
  /* the decoder takes embedding rows from host memory (a few KB per draft step) */
  be->download(be, s->x, s->d_x, sizeof(float) * (size_t)(n * H));
  const fwd_mm mm = {.embd = s->x, .embd_idx = s->idx, .n_embd = n, .hidden = h_out};
  return forward_batch_mm(h->dec, be, s->fs, b, &mm, out, tk, err, errlen);
}

int32_t mtp_seq_len(const mtp_state *s, int seq) {
  return fwd_state_seq_len(s->fs, seq);
}

void mtp_seq_reset(mtp_state *s, int seq) {
  fwd_state_seq_reset(s->fs, seq);
}

int mtp_seq_rewind(mtp_state *s, int seq, int32_t n, char *err, size_t errlen) {
  return fwd_state_seq_rewind(s->fs, seq, n, err, errlen);
}
