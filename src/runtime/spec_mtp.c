/* spec_mtp.c: the MTP drafter (anna.h anna_mtp_*): the model kind's draft head (model_kind.draft)
 * chained for k drafts, fed with the main model's final-norm hidden states.
 *
 * Positions: the head's entry t is the pair (h_t, tok_{t+1}). After the main model has run
 * positions 0 .. M-1 and `last` = tok_M is pending, the head holds entries 0 .. P-1 and the
 * sequence's `pending` rows h_P .. h_{M-1} (with tok_{P+1} .. tok_{M-1}, then `last`) still to
 * feed: a draft feeds them in one batch, whose last row gives the first draft, then chains
 * (previous head output, previous draft) one row at a time, and finally rewinds the head to M
 * (the chained entries were built from draft states, not the main model's). A verify window
 * [last, drafts] returns the hidden states of its rows; the accepted a + 1 of them become the
 * next pending rows, so every kept entry of the head comes from a true hidden state. */
#include "anna/anna.h"

#include "base/error.h"
#include "model/kind.h"
#include "runtime/model_handle.h"

#include <stdlib.h>
#include <string.h>

#define MTP_PEND (ANNA_SPEC_MAX_DRAFT + 1)

struct anna_mtp {
  anna_context *c;
  const model_kind *kind;
  const void *impl;
  const model_draft_ops *ops;
  void *st; /* the head's state */
  ops_backend *be;
  int H, n_seq, n_batch, k_max;
  float *hb;   /* [n_batch, H]: hidden rows of a context run */
  float *hc;   /* [H]: the chain's hidden state */
  int32_t *tok, *seqv, *pos; /* [n_batch] */
  int8_t *want;
  int32_t ci;
  float cv;
  double cs[2];
  float *hcb;    /* [n_batch, H]: batched drafts' chain states (anna_mtp_draft_batch) */
  int32_t *bci;  /* [n_batch] their top-1 ids, with bcv / bcs for the candidates' values and sums */
  float *bcv;
  double *bcs;
  int32_t *bpos; /* [n_seq]: a batched draft's head length per sequence after its pending rows */
  float *ph;     /* [n_seq][MTP_PEND * H] pending hidden rows */
  int32_t *ptok; /* [n_seq][MTP_PEND]: tokens after the pending rows but the last */
  int *np;       /* [n_seq] */
};

int anna_model_has_mtp(const anna_model *m) {
  return m && m->kind->draft && m->kind->draft->available(m->impl);
}

void anna_mtp_free(anna_mtp *d) {
  if (!d) return;
  if (d->st) d->ops->state_free(d->st);
  free(d->hb), free(d->hc), free(d->tok), free(d->seqv), free(d->pos), free(d->want);
  free(d->ph), free(d->ptok), free(d->np);
  free(d->hcb), free(d->bci), free(d->bcv), free(d->bcs), free(d->bpos);
  free(d);
}

int anna_mtp_create(anna_mtp **out, anna_context *c, int k_max, char *err, size_t errlen) {
  *out = NULL;
  const anna_model *m = context_model(c);
  if (!anna_model_has_mtp(m))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s has no MTP head (mtp.* tensors)", anna_model_path(m));
  int n_seq, n_ctx, nb;
  context_shape(c, &n_seq, &n_ctx, &nb);
  if (k_max < 1 || k_max > ANNA_SPEC_MAX_DRAFT || nb < k_max + 1)
    return anna_err(err, errlen, ANNA_EINVAL, "MTP drafter: k_max %d not in 1..%d or above n_batch %d - 1", k_max,
                    ANNA_SPEC_MAX_DRAFT, nb);
  anna_mtp *d = calloc(1, sizeof *d);
  if (!d) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  d->c = c;
  d->kind = m->kind;
  d->impl = m->impl;
  d->ops = m->kind->draft;
  d->be = context_backend(c);
  d->H = d->ops->width(m->impl);
  d->n_batch = nb;
  d->k_max = k_max;
  d->n_seq = n_seq;
  const size_t H = (size_t)d->H, B = (size_t)nb, S = (size_t)n_seq;
  d->hb = malloc(B * H * sizeof(float));
  d->hc = malloc(H * sizeof(float));
  d->tok = malloc(B * sizeof(int32_t)), d->seqv = malloc(B * sizeof(int32_t)), d->pos = malloc(B * sizeof(int32_t));
  d->want = malloc(B);
  d->ph = malloc(S * MTP_PEND * H * sizeof(float));
  d->ptok = malloc(S * MTP_PEND * sizeof(int32_t));
  d->np = calloc(S ? S : 1, sizeof(int));
  d->hcb = malloc(B * H * sizeof(float));
  d->bci = malloc(B * sizeof(int32_t)), d->bcv = malloc(B * sizeof(float)), d->bcs = malloc(2 * B * sizeof(double));
  d->bpos = malloc((S ? S : 1) * sizeof(int32_t));
  if (!d->hb || !d->hc || !d->tok || !d->seqv || !d->pos || !d->want || !d->ph || !d->ptok || !d->np || !d->hcb ||
      !d->bci || !d->bcv || !d->bcs || !d->bpos) {
    anna_mtp_free(d);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  const model_state_params sp = {.n_seq = n_seq, .n_ctx = n_ctx, .n_batch = nb};
  int rc = d->ops->state_create(&d->st, d->impl, d->be, &sp, err, errlen);
  if (rc) {
    anna_mtp_free(d);
    return rc;
  }
  *out = d;
  return 0;
}

static int check_seq(const anna_mtp *d, int seq, char *err, size_t errlen) {
  if (seq < 0 || seq >= d->n_seq)
    return anna_err(err, errlen, ANNA_ERANGE, "MTP: sequence %d out of range (%d)", seq, d->n_seq);
  return 0;
}

void anna_mtp_reset(anna_mtp *d, int seq) {
  if (seq < 0 || seq >= d->n_seq) return;
  d->ops->reset(d->st, seq);
  d->np[seq] = 0;
}

/* n rows of h (host [n, H]) with the next tokens toks through the head at its next positions;
 * want: the last row's top-1 to d->ci and its output to d->hc. */
static int head_run(anna_mtp *d, int seq, const float *h, const int32_t *toks, int n, int want, char *err,
                    size_t errlen) {
  const int32_t P = d->ops->seq_len(d->st, seq);
  for (int i = 0; i < n; i++) {
    d->tok[i] = toks[i];
    d->seqv[i] = seq;
    d->pos[i] = P + i;
    d->want[i] = want && i == n - 1;
  }
  const anna_batch b = {n, d->tok, d->seqv, d->pos, d->want};
  const model_topk tk = {1, 0.0f, &d->ci, &d->cv, d->cs};
  return d->ops->run(d->impl, d->st, d->be, &b, h, want ? d->hc : NULL, want ? &tk : NULL, err, errlen);
}

/* The pending rows of seq, the last one followed by `last`. */
static int feed_pending(anna_mtp *d, int seq, int32_t last, int want, char *err, size_t errlen) {
  const int n = d->np[seq];
  if (!n) return anna_err(err, errlen, ANNA_ESTATE, "MTP: sequence %d has no new position to draft from", seq);
  int32_t *pt = d->ptok + (size_t)seq * MTP_PEND;
  pt[n - 1] = last;
  int rc = head_run(d, seq, d->ph + (size_t)seq * MTP_PEND * (size_t)d->H, pt, n, want, err, errlen);
  if (!rc) d->np[seq] = 0;
  return rc;
}

int anna_mtp_prefill(anna_mtp *d, int seq, const int32_t *tokens, int32_t n, float *logits, char *err,
                     size_t errlen) {
  int rc = check_seq(d, seq, err, errlen);
  if (rc) return rc;
  if (!tokens || n < 1 || !logits) return anna_err(err, errlen, ANNA_EINVAL, "MTP prefill: no tokens or no logits");
  if (anna_context_seq_len(d->c, seq) != 0)
    return anna_err(err, errlen, ANNA_EINVAL, "MTP prefill: sequence %d is not empty", seq);
  anna_mtp_reset(d, seq);
  /* every position but the last: the context's hidden rows only (no lm_head), then the head
   * over (h_t, tokens[t + 1]) */
  for (int32_t i = 0; i < n - 1;) {
    const int32_t j = n - 1 - i < d->n_batch ? n - 1 : i + d->n_batch;
    for (int32_t t = i; t < j; t++) {
      d->tok[t - i] = tokens[t];
      d->seqv[t - i] = seq;
      d->pos[t - i] = t;
      d->want[t - i] = 1;
    }
    const anna_batch b = {j - i, d->tok, d->seqv, d->pos, d->want};
    if ((rc = context_run_hidden(d->c, &b, NULL, d->hb, err, errlen)) ||
        (rc = head_run(d, seq, d->hb, tokens + i + 1, j - i, 0, err, errlen)))
      return rc;
    i = j;
  }
  d->tok[0] = tokens[n - 1], d->seqv[0] = seq, d->pos[0] = n - 1, d->want[0] = 1;
  const anna_batch b = {1, d->tok, d->seqv, d->pos, d->want};
  if ((rc = context_run_hidden(d->c, &b, logits, d->ph + (size_t)seq * MTP_PEND * (size_t)d->H, err, errlen)))
    return rc;
  d->np[seq] = 1;
  return 0;
}

int anna_mtp_draft(anna_mtp *d, int seq, int32_t last, int32_t *draft, int k, char *err, size_t errlen) {
  int rc = check_seq(d, seq, err, errlen);
  if (rc) return rc;
  if (k > d->k_max) k = d->k_max;
  if (k <= 0) return 0;
  if (!draft) return anna_err(err, errlen, ANNA_EINVAL, "MTP draft: NULL output");
  if ((rc = feed_pending(d, seq, last, 1, err, errlen))) return rc;
  const int32_t M = d->ops->seq_len(d->st, seq);
  draft[0] = d->ci;
  for (int j = 1; j < k; j++) {
    if ((rc = head_run(d, seq, d->hc, &draft[j - 1], 1, 1, err, errlen))) return rc;
    draft[j] = d->ci;
  }
  /* the chained entries came from draft states: the next draft rebuilds them from the main
   * model's hidden states of the accepted positions */
  if (k > 1 && (rc = d->ops->rewind(d->st, seq, M, err, errlen))) return rc;
  return k;
}

static int mtp_verify_any(anna_mtp *d, int seq, int32_t last, const int32_t *draft, int k, anna_sampler *smp,
                          float *logits, int32_t *out, int *n_out, char *err, size_t errlen) {
  int rc = check_seq(d, seq, err, errlen);
  if (rc) return rc;
  if (!n_out) return anna_err(err, errlen, ANNA_EINVAL, "verify: NULL argument");
  if (k + 1 > d->n_batch) return anna_err(err, errlen, ANNA_ERANGE, "verify: %d rows exceed n_batch %d", k + 1, d->n_batch);
  /* a window without a draft before it: the head still takes the pending positions */
  if (d->np[seq] && (rc = feed_pending(d, seq, last, 0, err, errlen))) return rc;
  anna_spec_window w = {.seq = seq, .last = last, .draft = draft, .k = k, .out = out};
  if ((rc = context_verify_any(d->c, &w, 1, smp ? &smp : NULL, logits, d->hb, err, errlen))) return rc;
  *n_out = w.n_out;
  const int a = w.n_out - 1;
  memcpy(d->ph + (size_t)seq * MTP_PEND * (size_t)d->H, d->hb, sizeof(float) * (size_t)(a + 1) * (size_t)d->H);
  if (a) memcpy(d->ptok + (size_t)seq * MTP_PEND, draft, sizeof(int32_t) * (size_t)a);
  d->np[seq] = a + 1;
  return 0;
}

int anna_mtp_verify(anna_mtp *d, int seq, int32_t last, const int32_t *draft, int k, int32_t *out, int *n_out,
                    char *err, size_t errlen) {
  return mtp_verify_any(d, seq, last, draft, k, NULL, NULL, out, n_out, err, errlen);
}

int anna_mtp_verify_sampled(anna_mtp *d, int seq, int32_t last, const int32_t *draft, int k, anna_sampler *s,
                            float *logits, int32_t *out, int *n_out, char *err, size_t errlen) {
  if (!s || !logits) return anna_err(err, errlen, ANNA_EINVAL, "verify_sampled: NULL sampler or logits");
  return mtp_verify_any(d, seq, last, draft, k, s, logits, out, n_out, err, errlen);
}

int anna_mtp_verify_batch(anna_mtp *d, anna_spec_window *w, int n, anna_sampler *const *samplers, float *logits,
                          char *err, size_t errlen) {
  if (n < 0 || (n > 0 && !w)) return anna_err(err, errlen, ANNA_EINVAL, "MTP verify: bad window array");
  if (samplers && !logits) return anna_err(err, errlen, ANNA_EINVAL, "MTP verify: sampled windows need a logits scratch");
  int rc, rows = 0;
  for (int i = 0; i < n; i++) {
    if ((rc = check_seq(d, w[i].seq, err, errlen))) return rc;
    rows += w[i].k + 1;
  }
  /* the context's own check would come after the head took the pending rows */
  if (rows > d->n_batch) return anna_err(err, errlen, ANNA_ERANGE, "MTP verify: %d rows exceed n_batch %d", rows, d->n_batch);
  /* windows without a draft before them: the head still takes their pending positions */
  for (int i = 0; i < n; i++)
    if (d->np[w[i].seq] && (rc = feed_pending(d, w[i].seq, w[i].last, 0, err, errlen))) return rc;
  if ((rc = context_verify_any(d->c, w, n, samplers, samplers ? logits : NULL, d->hb, err, errlen))) return rc;
  const size_t H = (size_t)d->H;
  int r0 = 0;
  for (int i = 0; i < n; i++) { /* hidden rows come in window order, k + 1 per window */
    const int seq = w[i].seq, a = w[i].n_out - 1;
    memcpy(d->ph + (size_t)seq * MTP_PEND * H, d->hb + (size_t)r0 * H, sizeof(float) * (size_t)(a + 1) * H);
    if (a) memcpy(d->ptok + (size_t)seq * MTP_PEND, w[i].draft, sizeof(int32_t) * (size_t)a);
    d->np[seq] = a + 1;
    r0 += w[i].k + 1;
  }
  return 0;
}

int anna_mtp_feed(anna_mtp *d, int seq, const int32_t *tokens, int32_t n, float *logits, char *err,
                  size_t errlen) {
  int rc = check_seq(d, seq, err, errlen);
  if (rc) return rc;
  if (!tokens || n < 1) return anna_err(err, errlen, ANNA_EINVAL, "MTP feed: no tokens");
  const size_t H = (size_t)d->H;
  float *ph = d->ph + (size_t)seq * MTP_PEND * H;
  /* the previous chunk's last row waited for its next token: tokens[0] */
  if (d->np[seq] && (rc = feed_pending(d, seq, tokens[0], 0, err, errlen))) return rc;
  const int32_t L = anna_context_seq_len(d->c, seq);
  if (L < 0) return anna_err(err, errlen, ANNA_ERANGE, "MTP feed: sequence %d out of range", seq);
  /* rows [0, m) hidden only (no lm_head); with logits the last row runs alone with them */
  const int32_t m = logits ? n - 1 : n;
  for (int32_t i = 0; i < m;) {
    const int32_t j = m - i < d->n_batch ? m : i + d->n_batch;
    for (int32_t t = i; t < j; t++) {
      d->tok[t - i] = tokens[t];
      d->seqv[t - i] = seq;
      d->pos[t - i] = L + t;
      d->want[t - i] = 1;
    }
    const anna_batch b = {j - i, d->tok, d->seqv, d->pos, d->want};
    if ((rc = context_run_hidden(d->c, &b, NULL, d->hb, err, errlen))) return rc;
    /* row t pairs with tokens[t + 1]; a last row without one (j == n) waits as pending */
    const int32_t full = j < n ? j - i : j - i - 1;
    if (full > 0 && (rc = head_run(d, seq, d->hb, tokens + i + 1, full, 0, err, errlen))) return rc;
    if (full < j - i) {
      memcpy(ph, d->hb + (size_t)full * H, sizeof(float) * H);
      d->np[seq] = 1;
    }
    i = j;
  }
  if (!logits) return 0;
  d->tok[0] = tokens[n - 1], d->seqv[0] = seq, d->pos[0] = L + n - 1, d->want[0] = 1;
  const anna_batch b = {1, d->tok, d->seqv, d->pos, d->want};
  if ((rc = context_run_hidden(d->c, &b, logits, ph, err, errlen))) return rc;
  d->np[seq] = 1;
  return 0;
}

int anna_mtp_draft_batch(anna_mtp *d, int n, const int *seq, const int32_t *last, int *k, int32_t *draft, char *err,
                         size_t errlen) {
  if (n < 0 || (n > 0 && (!seq || !last || !k || !draft)))
    return anna_err(err, errlen, ANNA_EINVAL, "MTP draft batch: NULL argument");
  const size_t H = (size_t)d->H;
  int rc, rows = 0, kmax = 0;
  for (int i = 0; i < n; i++) {
    if ((rc = check_seq(d, seq[i], err, errlen))) return rc;
    for (int j = 0; j < i; j++)
      if (seq[j] == seq[i]) return anna_err(err, errlen, ANNA_EINVAL, "MTP draft batch: sequence %d twice", seq[i]);
    if (k[i] > d->k_max) k[i] = d->k_max;
    if (k[i] <= 0) {
      k[i] = 0;
      continue;
    }
    if (!d->np[seq[i]])
      return anna_err(err, errlen, ANNA_ESTATE, "MTP: sequence %d has no new position to draft from", seq[i]);
    rows += d->np[seq[i]];
    kmax = k[i] > kmax ? k[i] : kmax;
  }
  if (!kmax) return 0;
  if (rows > d->n_batch) /* more pending rows than a batch: one sequence at a time */
    for (int i = 0; i < n; i++) {
      if (!k[i]) continue;
      const int r = anna_mtp_draft(d, seq[i], last[i], draft + (size_t)i * ANNA_SPEC_MAX_DRAFT, k[i], err, errlen);
      if (r < 0) return r;
      k[i] = r;
    }
  if (rows > d->n_batch) return 0;
  /* step 0: every sequence's pending rows (their last row followed by last[i]), the last row
   * of each flagged: its output is the chain's state, its top-1 the first draft */
  int at = 0;
  for (int i = 0; i < n; i++) {
    if (!k[i]) continue;
    const int s = seq[i], np = d->np[s];
    const int32_t P = d->ops->seq_len(d->st, s);
    const int32_t *pt = d->ptok + (size_t)s * MTP_PEND;
    memcpy(d->hb + (size_t)at * H, d->ph + (size_t)s * MTP_PEND * H, sizeof(float) * (size_t)np * H);
    for (int r = 0; r < np; r++, at++) {
      d->tok[at] = r == np - 1 ? last[i] : pt[r];
      d->seqv[at] = s;
      d->pos[at] = P + r;
      d->want[at] = r == np - 1;
    }
    d->bpos[s] = P + np; /* the head's length once its pending rows are in: the rewind point */
  }
  anna_batch b = {at, d->tok, d->seqv, d->pos, d->want};
  model_topk tk = {1, 0.0f, d->bci, d->bcv, d->bcs};
  if ((rc = d->ops->run(d->impl, d->st, d->be, &b, d->hb, d->hcb, &tk, err, errlen))) return rc;
  for (int i = 0, w = 0; i < n; i++)
    if (k[i]) {
      d->np[seq[i]] = 0;
      draft[(size_t)i * ANNA_SPEC_MAX_DRAFT] = d->bci[w++];
    }
  /* chain steps: one row per sequence still drafting, (its previous output, its last draft) */
  for (int j = 1; j < kmax; j++) {
    int m = 0, w = 0;
    for (int i = 0; i < n; i++) {
      if (!k[i]) continue;
      if (k[i] > j) { /* its state is row w of the previous run's flagged outputs */
        memcpy(d->hb + (size_t)m * H, d->hcb + (size_t)w * H, sizeof(float) * H);
        d->tok[m] = draft[(size_t)i * ANNA_SPEC_MAX_DRAFT + (size_t)j - 1];
        d->seqv[m] = seq[i];
        d->pos[m] = d->ops->seq_len(d->st, seq[i]);
        d->want[m] = 1;
        m++;
      }
      if (k[i] >= j) w++; /* it ran in the previous step */
    }
    b.n = m;
    if ((rc = d->ops->run(d->impl, d->st, d->be, &b, d->hb, d->hcb, &tk, err, errlen))) return rc;
    for (int i = 0, r = 0; i < n; i++)
      if (k[i] > j) draft[(size_t)i * ANNA_SPEC_MAX_DRAFT + (size_t)j] = d->bci[r++];
  }
  /* the chained entries came from draft states: back to the true positions */
  for (int i = 0; i < n; i++)
    if (k[i] > 1 && (rc = d->ops->rewind(d->st, seq[i], d->bpos[seq[i]], err, errlen))) return rc;
  return 0;
}
