/* spec_draft.c: the draft-model drafter of anna.h (anna_draft_*): a second, smaller model with
 * the target's vocabulary drafts greedily from its own context, which follows the target
 * sequence's accepted tokens.
 *
 * Positions: after a window the draft context holds the tokens the target holds (prompt,
 * accepted ids) and `last` is pending in both. A draft runs last, d0, ..., d(k-2) one token at a
 * time (each row's argmax is the next draft), so the draft context then holds L + k positions.
 * anna_draft_commit brings it to the target's L + 1 + a: a rewind when a < k (the rejected
 * drafts' positions go), the last draft fed when a == k. A draft model with recurrent state
 * (GDN) can only rewind to a checkpoint: one is taken before each draft, and on rejection the
 * context goes back to it and runs last + the accepted drafts again in one batch. */
#include "anna/anna.h"

#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct anna_draft {
  anna_context *c; /* owned: the draft model's context (n_seq 1 per target sequence slot) */
  int k_max, n_seq, n_batch;
  int32_t *tok, *seq, *pos; /* [n_batch] */
  int8_t *want;
};

void anna_draft_free(anna_draft *d) {
  if (!d) return;
  anna_context_free(d->c);
  free(d->tok), free(d->seq), free(d->pos), free(d->want);
  free(d);
}

/* The vocabularies must agree id for id: sizes, then (when both folders have a tokenizer)
 * every token's piece; the first difference is named. */
static int vocab_check(const anna_model *dm, const anna_model *tm, char *err, size_t errlen) {
  const int vd = anna_model_vocab(dm), vt = anna_model_vocab(tm);
  if (vd != vt)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "draft model %s: vocabulary of %d tokens, the target %s has %d",
                    anna_model_path(dm), vd, anna_model_path(tm), vt);
  anna_text *a = NULL, *b = NULL;
  char e2[256];
  int rc = 0;
  if (anna_text_open(&a, anna_model_path(dm), 0, e2, sizeof e2) == 0 &&
      anna_text_open(&b, anna_model_path(tm), 0, e2, sizeof e2) == 0) {
    const int32_t n =
        anna_text_vocab(a) < anna_text_vocab(b) ? anna_text_vocab(a) : anna_text_vocab(b);
    if (anna_text_vocab(a) != anna_text_vocab(b))
      rc = anna_err(err, errlen, ANNA_EINVAL,
                    "draft model %s: tokenizer of %d tokens, the target's has %d",
                    anna_model_path(dm), anna_text_vocab(a), anna_text_vocab(b));
    for (int32_t id = 0; !rc && id < n; id++) {
      size_t la = 0, lb = 0;
      const char *pa = anna_text_token_piece(a, id, &la), *pb = anna_text_token_piece(b, id, &lb);
      if (la != lb || (la && memcmp(pa, pb, la)))
        rc = anna_err(err, errlen, ANNA_EINVAL,
                      "draft model %s: token %d is '%.*s', the target's is '%.*s'",
                      anna_model_path(dm), id, (int)(la > 40 ? 40 : la), pa ? pa : "",
                      (int)(lb > 40 ? 40 : lb), pb ? pb : "");
    }
  }
  anna_text_free(a);
  anna_text_free(b);
  return rc;
}

int anna_draft_create(anna_draft **out, anna_model *draft_model, const anna_model *target,
                      const anna_context_options *opt, int k_max, char *err, size_t errlen) {
  *out = NULL;
  if (!draft_model || !target || !opt)
    return anna_err(err, errlen, ANNA_EINVAL, "draft: NULL argument");
  if (k_max < 1 || k_max > ANNA_SPEC_MAX_DRAFT)
    return anna_err(err, errlen, ANNA_EINVAL, "draft: k_max %d not in 1..%d", k_max,
                    ANNA_SPEC_MAX_DRAFT);
  int rc = vocab_check(draft_model, target, err, errlen);
  if (rc) return rc;
  anna_draft *d = calloc(1, sizeof *d);
  if (!d) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  anna_context_options o = *opt;
  if (o.n_batch < k_max + 1) o.n_batch = k_max + 1;
  if (o.n_checkpoints < 1) o.n_checkpoints = 1; /* a GDN draft model's rollback point */
  d->k_max = k_max;
  d->n_seq = o.n_seq > 0 ? o.n_seq : 1;
  d->n_batch = o.n_batch > 0 ? o.n_batch : 512;
  d->tok = malloc(sizeof(int32_t) * (size_t)d->n_batch);
  d->seq = malloc(sizeof(int32_t) * (size_t)d->n_batch);
  d->pos = malloc(sizeof(int32_t) * (size_t)d->n_batch);
  d->want = malloc((size_t)d->n_batch);
  if (!d->tok || !d->seq || !d->pos || !d->want) {
    anna_draft_free(d);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  if ((rc = anna_context_create(&d->c, draft_model, &o, err, errlen))) {
    anna_draft_free(d);
    return rc;
  }
  *out = d;
  return 0;
}

/* tokens[0, n) at positions from..from+n of seq in batches of n_batch, no logits. */
static int feed(anna_draft *d, int seq, const int32_t *tokens, int32_t n, int32_t from, char *err,
                size_t errlen) {
  for (int32_t i = 0; i < n;) {
    const int32_t m = n - i < d->n_batch ? n - i : d->n_batch;
    for (int32_t j = 0; j < m; j++)
      d->tok[j] = tokens[i + j], d->seq[j] = seq, d->pos[j] = from + i + j, d->want[j] = 0;
    const anna_batch b = {m, d->tok, d->seq, d->pos, d->want};
    int rc = anna_context_decode(d->c, &b, NULL, err, errlen);
    if (rc) return rc;
    i += m;
  }
  return 0;
}

int anna_draft_prefill(anna_draft *d, int seq, const int32_t *tokens, int32_t n, char *err,
                       size_t errlen) {
  if (seq < 0 || seq >= d->n_seq)
    return anna_err(err, errlen, ANNA_ERANGE, "draft: sequence %d out of range", seq);
  if (n < 0 || (n > 0 && !tokens))
    return anna_err(err, errlen, ANNA_EINVAL, "draft prefill: no tokens");
  anna_context_seq_reset(d->c, seq);
  return feed(d, seq, tokens, n, 0, err, errlen);
}

int anna_draft_feed(anna_draft *d, int seq, const int32_t *tokens, int32_t n, char *err, size_t errlen) {
  if (seq < 0 || seq >= d->n_seq)
    return anna_err(err, errlen, ANNA_ERANGE, "draft: sequence %d out of range", seq);
  if (n < 0 || (n > 0 && !tokens)) return anna_err(err, errlen, ANNA_EINVAL, "draft feed: no tokens");
  return feed(d, seq, tokens, n, anna_context_seq_len(d->c, seq), err, errlen);
}

int anna_draft_draft(anna_draft *d, int seq, int32_t last, int32_t *draft, int k, char *err,
                     size_t errlen) {
  if (seq < 0 || seq >= d->n_seq)
    return anna_err(err, errlen, ANNA_ERANGE, "draft: sequence %d out of range", seq);
  if (k > d->k_max) k = d->k_max;
  if (k <= 0) return 0;
  if (!draft) return anna_err(err, errlen, ANNA_EINVAL, "draft: NULL output");
  const int32_t L = anna_context_seq_len(d->c, seq);
  int rc = anna_context_seq_checkpoint(d->c, seq, err, errlen);
  if (rc) return rc;
  int32_t t = last;
  for (int j = 0; j < k; j++) {
    int32_t s0 = seq, p0 = L + j, idx;
    int8_t w = 1;
    float val;
    double st[2];
    const anna_batch b = {1, &t, &s0, &p0, &w};
    if ((rc = anna_context_decode_topk(d->c, &b, 1, 0.0f, &idx, &val, st, err, errlen))) return rc;
    draft[j] = t = idx;
  }
  return k;
}

int anna_draft_commit(anna_draft *d, int seq, int32_t last, const int32_t *draft, int k,
                      const int32_t *out, int n_out, char *err, size_t errlen) {
  if (seq < 0 || seq >= d->n_seq)
    return anna_err(err, errlen, ANNA_ERANGE, "draft: sequence %d out of range", seq);
  const int a = n_out - 1;
  if (k < 0 || a < 0 || a > k)
    return anna_err(err, errlen, ANNA_EINVAL, "draft commit: %d of %d accepted", a, k);
  const int32_t now = anna_context_seq_len(d->c, seq),
                L = now - k; /* k == 0: nothing was drafted */
  if (k == 0) return feed(d, seq, &last, 1, now, err, errlen);
  if (a == k)
    return feed(d, seq, &draft[k - 1], 1, now, err, errlen); /* every draft but the last was run */
  char e2[256];
  if (anna_context_seq_rewind(d->c, seq, L + 1 + a, e2, sizeof e2) == 0) return 0;
  /* no state there (recurrent layers): back to the checkpoint before the draft, run again */
  int rc = anna_context_seq_rewind(d->c, seq, L, err, errlen);
  if (rc) return rc;
  int32_t re[ANNA_SPEC_MAX_DRAFT + 1];
  re[0] = last;
  if (a) memcpy(re + 1, out, sizeof(int32_t) * (size_t)a);
  return feed(d, seq, re, a + 1, L, err, errlen);
}

void anna_draft_reset(anna_draft *d, int seq) {
  if (seq >= 0 && seq < d->n_seq) anna_context_seq_reset(d->c, seq);
}
