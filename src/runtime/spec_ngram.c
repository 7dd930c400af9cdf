/* spec_ngram.c: the n-gram (prompt lookup) drafter of anna.h (anna_ngram_*), as llama.cpp's
 * lookup and vLLM's "ngram" proposer: the last n tokens of the history (prompt + generated),
 * n from n_max down to n_min, are searched for an earlier occurrence, and the tokens that
 * followed it are the draft. The most recent occurrence wins (in code edits the copy being
 * written continues the latest match). The history is one buffer sized at creation, so
 * accepting and drafting allocate nothing; a draft is a backward scan of the history (a few
 * thousand compares per token, nothing next to a forward pass).
 */
#include "anna/anna.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct anna_ngram {
  anna_ngram_params p;
  int32_t cap, n; /* history capacity and length */
  int32_t *hist;  /* [cap] */
};

int anna_ngram_create(anna_ngram **out, const anna_ngram_params *p, int32_t capacity, char *err, size_t errlen) {
  *out = NULL;
  if (!p) return anna_err(err, errlen, ANNA_EINVAL, "ngram drafter: no parameters");
  if (p->n_min < 1 || p->n_max < p->n_min || p->n_max > ANNA_NGRAM_MAX_N)
    return anna_err(err, errlen, ANNA_EINVAL, "ngram drafter: need 1 <= n_min (%d) <= n_max (%d) <= %d", p->n_min,
                    p->n_max, ANNA_NGRAM_MAX_N);
  if (p->k_max < 1 || p->k_max > ANNA_SPEC_MAX_DRAFT)
    return anna_err(err, errlen, ANNA_EINVAL, "ngram drafter: draft length %d not in 1..%d", p->k_max,
                    ANNA_SPEC_MAX_DRAFT);
  if (capacity < 1) return anna_err(err, errlen, ANNA_EINVAL, "ngram drafter: capacity %d < 1", capacity);
  anna_ngram *d = calloc(1, sizeof *d);
  if (d) d->hist = malloc(sizeof(int32_t) * (size_t)capacity);
  if (!d || !d->hist) {
    free(d);
    return anna_err(err, errlen, ANNA_ENOMEM, "ngram drafter: out of memory for %d tokens", capacity);
  }
  d->p = *p;
  d->cap = capacity;
  *out = d;
  return 0;
}

void anna_ngram_free(anna_ngram *d) {
  if (!d) return;
  free(d->hist);
  free(d);
}

void anna_ngram_reset(anna_ngram *d) {
  d->n = 0;
}

int anna_ngram_accept(anna_ngram *d, const int32_t *tokens, int32_t n, char *err, size_t errlen) {
  if (n < 0 || (n > 0 && !tokens)) return anna_err(err, errlen, ANNA_EINVAL, "ngram drafter: bad token array");
  if (n > d->cap - d->n)
    return anna_err(err, errlen, ANNA_ERANGE, "ngram drafter: history of %d tokens full (%d + %d)", d->cap, d->n, n);
  memcpy(d->hist + d->n, tokens, sizeof(int32_t) * (size_t)n);
  d->n += n;
  return 0;
}

int anna_ngram_draft(const anna_ngram *d, int32_t *out, int k) {
  if (k > d->p.k_max) k = d->p.k_max;
  if (k <= 0 || !out) return 0;
  const int32_t *h = d->hist;
  const int32_t H = d->n;
  for (int n = d->p.n_max; n >= d->p.n_min; n--) {
    if (n >= H) continue; /* the suffix needs an earlier occurrence that is followed by something */
    const int32_t *suf = h + H - n;
    /* an occurrence starting at j (j + n < H, so at least one token follows it), latest first */
    for (int32_t j = H - n - 1; j >= 0; j--) {
      if (h[j + n - 1] != suf[n - 1] || memcmp(h + j, suf, sizeof(int32_t) * (size_t)n)) continue;
      int32_t m = H - (j + n);
      if (m > k) m = k;
      memcpy(out, h + j + n, sizeof(int32_t) * (size_t)m);
      return (int)m;
    }
  }
  return 0;
}

int32_t anna_ngram_len(const anna_ngram *d) {
  return d->n;
}

/* ---- adaptive draft length (anna_spec_adapt_*) ---- */

/* The counts decay by this much per window: about the last 10 windows speak, so a sequence
 * moving from boilerplate (long accepted runs) to new text (none) shortens K within a few
 * windows. */
#define SPEC_ADAPT_DECAY 0.9f

void anna_spec_adapt_init(anna_spec_adapt *a, int k_max, float p_min) {
  a->k_max = k_max < 1 ? 1 : k_max > ANNA_SPEC_MAX_DRAFT ? ANNA_SPEC_MAX_DRAFT : k_max;
  a->p_min = p_min;
  a->succ = 4.0f; /* prior: alpha = (4 + 1) / (4 + 2), K = k_max for the usual p_min */
  a->fail = 0.0f;
}

int anna_spec_adapt_next(const anna_spec_adapt *a) {
  if (a->p_min <= 0 || a->k_max <= 1) return a->k_max;
  const float alpha = (a->succ + 1.0f) / (a->succ + a->fail + 2.0f); /* Laplace: never 0 or 1 */
  if (a->p_min >= alpha) return 1;
  const int k = (int)floorf(logf(a->p_min) / logf(alpha));
  return k < 1 ? 1 : k > a->k_max ? a->k_max : k;
}

void anna_spec_adapt_update(anna_spec_adapt *a, int k, int accepted) {
  if (k <= 0) return;
  a->succ = a->succ * SPEC_ADAPT_DECAY + (float)accepted;
  a->fail = a->fail * SPEC_ADAPT_DECAY + (accepted < k ? 1.0f : 0.0f);
}
