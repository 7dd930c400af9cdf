/* sampler.c: the sampler of anna.h (anna_sampler_*): penalties, greedy / temperature, top-k,
 * top-p, min-p, seeded draw; and the same draw from a row's top-k candidates. */
#include "anna/anna.h"

#include "base/error.h"
#include "ops/ops.h"
#include "runtime/sample_tail.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The public bound is the op's. */
_Static_assert(ANNA_TOPK_MAX == OPS_TOPK_MAX, "anna.h ANNA_TOPK_MAX must equal ops.h OPS_TOPK_MAX");

typedef struct cand {
  float logit;
  int32_t id;
} cand;

struct anna_sampler {
  int vocab;
  anna_sampler_params p;
  uint64_t rng[4];
  int32_t *counts;  /* [vocab] occurrences seen */
  int32_t *seen;    /* list of distinct seen ids */
  int32_t n_seen;
  cand *cand; /* [vocab] candidates */
  float *prob;      /* [vocab] */
  uint8_t *mark;    /* [vocab] head members during one sample (all zero between calls) */
};

anna_sampler_params anna_sampler_params_default(void) {
  anna_sampler_params p = {0};
  p.top_p = 1.0f;
  p.repetition_penalty = 1.0f;
  return p;
}

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

static uint64_t next_u64(uint64_t *s) {
  uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return r;
}

int anna_sampler_create(anna_sampler **out, int vocab, const anna_sampler_params *p, char *err, size_t errlen) {
  *out = NULL;
  if (vocab < 1) return anna_err(err, errlen, ANNA_EINVAL, "sampler: vocab %d", vocab);
  if (p && (p->temperature < 0 || p->top_p < 0 || p->min_p < 0 || p->min_p > 1 || p->repetition_penalty <= 0 ||
            isnan(p->temperature) || isnan(p->top_p)))
    return anna_err(err, errlen, ANNA_EINVAL,
                    "sampler: bad parameters (temperature >= 0, 0 <= top_p, 0 <= min_p <= 1, repetition_penalty > 0)");
  anna_sampler *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  s->vocab = vocab;
  s->p = p ? *p : anna_sampler_params_default();
  s->counts = calloc((size_t)vocab, sizeof *s->counts);
  s->seen = calloc((size_t)vocab, sizeof *s->seen);
  s->cand = calloc((size_t)vocab, sizeof *s->cand);
  s->prob = calloc((size_t)vocab, sizeof *s->prob);
  s->mark = calloc((size_t)vocab, 1);
  if (!s->counts || !s->seen || !s->cand || !s->prob || !s->mark) {
    anna_sampler_free(s);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  uint64_t x = s->p.seed;
  for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
  *out = s;
  return 0;
}

void anna_sampler_free(anna_sampler *s) {
  if (!s) return;
  free(s->counts);
  free(s->seen);
  free(s->cand);
  free(s->prob);
  free(s->mark);
  free(s);
}

void anna_sampler_accept(anna_sampler *s, int32_t t) {
  if (t < 0 || t >= s->vocab) return;
  if (s->counts[t]++ == 0) s->seen[s->n_seen++] = t;
}

void anna_sampler_reset(anna_sampler *s) {
  for (int32_t i = 0; i < s->n_seen; i++) s->counts[s->seen[i]] = 0;
  s->n_seen = 0;
}

#define exp_nonpos ops_exp_nonpos

/* Candidates beyond this many are sorted only when top-p needs them (anna_sampler_sample). */
#define SAMPLER_HEAD 256

/* a before b: larger logit, then smaller id (a strict total order: ids are distinct). */
static inline int cand_before(cand a, cand b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

/* The k first candidates of logits[0..n) in cand_before order into c[0..k) (unordered): a
 * min-heap of the best k seen, its root the worst of them, in one pass. */
static void cand_top(cand *c, const float *logits, int32_t n, int32_t k) {
  int32_t m = 0;
  for (int32_t t = 0; t < n; t++) {
    const cand x = {logits[t], t};
    int32_t i;
    if (m < k) { /* sift up */
      i = m++;
      while (i > 0 && cand_before(c[(i - 1) / 2], x)) {
        c[i] = c[(i - 1) / 2];
        i = (i - 1) / 2;
      }
      c[i] = x;
      continue;
    }
    if (!cand_before(x, c[0])) continue;
    i = 0; /* replace the root, sift down */
    for (;;) {
      int32_t w = 2 * i + 1;
      if (w >= m) break;
      if (w + 1 < m && cand_before(c[w], c[w + 1])) w++;
      if (!cand_before(x, c[w])) break;
      c[i] = c[w];
      i = w;
    }
    c[i] = x;
  }
}

static int by_logit_desc(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
  return x->id - y->id;
}

/* Greedy: the first index of the largest logit (ops_argmax_f32). */
static int32_t argmax_f32(const float *x, int32_t n) {
  float best;
  return (int32_t)ops_argmax_f32(x, n, &best);
}

/* Top-p over sorted probabilities prob[from, to): adds them to *cum and returns the first i
 * where *cum reaches top_p, or to. Shared by the full-row and candidate samplers, so both
 * cut the nucleus with the same additions. */
static int32_t nucleus_scan(const float *prob, int32_t from, int32_t to, double *cum, float top_p) {
  int32_t i = from;
  for (; i < to; i++) {
    *cum += prob[i];
    if (*cum >= top_p) break;
  }
  return i;
}

/* Min-p: how many of the first ns sorted candidates stay (the first always does). */
static int32_t min_p_prefix(const float *prob, int32_t ns, float floor_p) {
  int32_t k = 1;
  while (k < ns && prob[k] >= floor_p) k++;
  return k;
}

int32_t anna_sampler_sample(anna_sampler *s, float *logits) {
  const anna_sampler_params *p = &s->p;
  for (int32_t i = 0; i < s->n_seen; i++) {
    int32_t t = s->seen[i];
    float l = logits[t];
    if (p->repetition_penalty != 1.0f) l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
    l -= p->presence_penalty + p->frequency_penalty * (float)s->counts[t];
    logits[t] = l;
  }
  if (p->temperature <= 0) return argmax_f32(logits, s->vocab);

  /* Only the head of the distribution is sorted: a full sort of a 248k vocabulary took
   * 31 ms per token, fifteen times a small model's GPU decode step. With top-k the k best
   * are kept by a bounded heap in one pass and sorted (the same candidates, in the same
   * order, as a full sort); without it the SAMPLER_HEAD best are, and the other tokens stay
   * in vocabulary order behind them. The draw is the same as with a full sort whenever it
   * lands in the sorted head; past it the rest is walked in vocabulary order, which keeps
   * every token's probability (and a seed's run) but maps that draw to another token than a
   * full sort would. When top-p needs to cut past the head, the head grows eightfold until
   * the nucleus fits (everything sorted at worst, as before). */
  const int32_t V = s->vocab;
  const float inv_t = 1.0f / p->temperature, mx = logits[argmax_f32(logits, V)] * inv_t;
  for (int32_t i = 0; i < V; i++)
    if (isnan(logits[i])) logits[i] = -INFINITY;
  const int32_t nk = p->top_k > 0 && p->top_k < V ? p->top_k : V;
  int32_t nh = nk < V ? nk : (V < SAMPLER_HEAD ? V : SAMPLER_HEAD); /* sorted head */
  cand_top(s->cand, logits, V, nh);
  qsort(s->cand, (size_t)nh, sizeof *s->cand, by_logit_desc);
  double z = 0;
  if (nh == nk) {
    for (int32_t i = 0; i < nh; i++) z += exp_nonpos(s->cand[i].logit * inv_t - mx);
  } else {
    for (int32_t i = 0; i < V; i++) z += exp_nonpos(logits[i] * inv_t - mx);
  }
  for (int32_t i = 0; i < nh; i++) s->prob[i] = (float)(exp_nonpos(s->cand[i].logit * inv_t - mx) / z);
  int32_t n = nk; /* candidates kept; the first nh sorted */
  if (p->top_p < 1.0f) {
    double cum = 0;
    int32_t i = nucleus_scan(s->prob, 0, nh, &cum, p->top_p);
    while (i == nh && nh < nk) { /* the nucleus reaches past the head: a head 8x as long */
      const int32_t grow = nh > nk / 8 ? nk : 8 * nh;
      if (grow == nk) {
        for (int32_t q = 0; q < V; q++) s->cand[q] = (cand){logits[q], q};
      } else {
        cand_top(s->cand, logits, V, grow);
      }
      qsort(s->cand, (size_t)grow, sizeof *s->cand, by_logit_desc);
      for (int32_t q = nh; q < grow; q++) s->prob[q] = (float)(exp_nonpos(s->cand[q].logit * inv_t - mx) / z);
      /* the first nh are unchanged: the same best candidates, sorted */
      i = nucleus_scan(s->prob, i, grow, &cum, p->top_p);
      nh = grow;
    }
    if (i < nh) n = i + 1;
  }
  /* min-p keeps a prefix of the sorted head and, past it, every token above the floor */
  const float floor_p = p->min_p > 0 ? p->min_p * s->prob[0] : 0.0f;
  const int32_t ns = n < nh ? n : nh; /* kept sorted candidates */
  int32_t kept = ns;
  if (p->min_p > 0) kept = min_p_prefix(s->prob, ns, floor_p);
  const int tail = kept == ns && n > nh; /* tokens past the head still take part */
  double sum = 0;
  for (int32_t i = 0; i < kept; i++) sum += s->prob[i];
  if (tail) {
    for (int32_t i = 0; i < nh; i++) s->mark[s->cand[i].id] = 1;
    if (floor_p > 0.0f) {
      for (int32_t t = 0; t < V; t++) {
        const float q = s->mark[t] ? 0.0f : (float)(exp_nonpos(logits[t] * inv_t - mx) / z);
        if (q > 0.0f && q >= floor_p) sum += q;
      }
    } else { /* every token past the head: the mass z leaves to them (no third pass) */
      double zh = 0;
      for (int32_t i = 0; i < nh; i++) zh += exp_nonpos(s->cand[i].logit * inv_t - mx);
      sum += (z - zh) / z;
    }
  }
  double u = (double)(next_u64(s->rng) >> 11) * (1.0 / 9007199254740992.0) * sum;
  int32_t pick = s->cand[kept - 1].id;
  for (int32_t i = 0; i < kept; i++) {
    u -= s->prob[i];
    if (u <= 0) {
      pick = s->cand[i].id;
      goto done;
    }
  }
  if (tail)
    for (int32_t t = 0; t < V; t++) {
      if (s->mark[t]) continue;
      const float q = (float)(exp_nonpos(logits[t] * inv_t - mx) / z);
      if (!(q > 0.0f && q >= floor_p)) continue;
      pick = t;
      u -= q;
      if (u <= 0) break;
    }
done:
  if (tail)
    for (int32_t i = 0; i < nh; i++) s->mark[s->cand[i].id] = 0;
  return pick;
}

/* tail: 1 for anna_sampler_candidates_tail_k (pure temperature takes the head too). */
static int candidates_k(const anna_sampler *s, float *temp, int tail) {
  const anna_sampler_params *p = &s->p;
  if (temp) *temp = 0.0f;
  if (p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) return 0;
  if (p->temperature <= 0) return 1;
  const int32_t V = s->vocab;
  if (p->top_k > 0 && p->top_k < V) return p->top_k <= OPS_TOPK_MAX ? p->top_k : 0; /* the whole kept set */
  if (V <= SAMPLER_HEAD && V <= OPS_TOPK_MAX) return V;                              /* every token */
  if (!tail && p->top_p >= 1.0f && p->min_p <= 0) return 0; /* pure temperature: every token can be drawn */
  /* the sorted head, whose probabilities divide by the whole row's softmax sum */
  if (temp) *temp = p->temperature;
  return SAMPLER_HEAD <= OPS_TOPK_MAX ? SAMPLER_HEAD : 0;
}

int anna_sampler_candidates_k(const anna_sampler *s, float *temp) {
  return candidates_k(s, temp, 0);
}

int anna_sampler_candidates_tail_k(const anna_sampler *s, float *temp) {
  return candidates_k(s, temp, 1);
}

/* anna_sampler_sample's steps on the candidates, in the same order and arithmetic (see there);
 * the head is the first nh candidates, already sorted by the op. t == NULL: a draw that needs
 * the tail returns 1 before consuming anything; else it is prepared in *t and returns 2. */
static int sample_candidates(anna_sampler *s, const int32_t *idx, const float *val, int k, const double *stats,
                             anna_sample_tail *t, int32_t *out) {
  const anna_sampler_params *p = &s->p;
  const int need = candidates_k(s, NULL, t != NULL);
  if (need <= 0 || k < need) return 1;
  if (p->temperature <= 0) {
    *out = idx[0];
    return 0;
  }
  const int32_t V = s->vocab;
  const float inv_t = 1.0f / p->temperature, mx = val[0] * inv_t;
  const int32_t nk = p->top_k > 0 && p->top_k < V ? p->top_k : V;
  const int32_t nh = nk < V ? nk : (V < SAMPLER_HEAD ? V : SAMPLER_HEAD);
  double z = 0;
  if (nh == nk) {
    for (int32_t i = 0; i < nh; i++) z += exp_nonpos(val[i] * inv_t - mx);
  } else {
    z = stats[1];
  }
  for (int32_t i = 0; i < nh; i++) s->prob[i] = (float)(exp_nonpos(val[i] * inv_t - mx) / z);
  int32_t n = nk;
  if (p->top_p < 1.0f) {
    double cum = 0;
    const int32_t i = nucleus_scan(s->prob, 0, nh, &cum, p->top_p);
    if (i == nh && nh < nk) return 1; /* the nucleus reaches past the head */
    if (i < nh) n = i + 1;
  }
  const float floor_p = p->min_p > 0 ? p->min_p * s->prob[0] : 0.0f;
  const int32_t ns = n < nh ? n : nh;
  int32_t kept = ns;
  if (p->min_p > 0) kept = min_p_prefix(s->prob, ns, floor_p);
  const int tail = kept == ns && n > nh; /* tokens past the head take part */
  if (tail && !t) return 1;
  double sum = 0;
  for (int32_t i = 0; i < kept; i++) sum += s->prob[i];
  if (tail) {
    /* anna_sampler_sample's tail: the head as there, the rest left to anna_context_sample_tail */
    t->inv_t = inv_t, t->mx = mx, t->floor_p = floor_p, t->z = z;
    t->nh = nh, t->kept = kept, t->fallback = idx[kept - 1];
    memcpy(t->head, idx, sizeof(int32_t) * (size_t)nh);
    memcpy(t->prob, s->prob, sizeof(float) * (size_t)nh);
    t->r = (double)(next_u64(s->rng) >> 11) * (1.0 / 9007199254740992.0);
    t->u = 0;
    if (floor_p > 0.0f) { /* the kept mass needs the tail's floor pass first */
      t->sum = sum;
      return 2;
    }
    double zh = 0; /* every token past the head: the mass z leaves to them */
    for (int32_t i = 0; i < nh; i++) zh += exp_nonpos(val[i] * inv_t - mx);
    sum += (z - zh) / z;
    t->sum = sum;
    double u = t->r * sum;
    const int32_t i = sample_tail_head_walk(t, &u);
    if (i >= 0) {
      *out = idx[i];
      return 0;
    }
    t->u = u;
    return 2;
  }
  double u = (double)(next_u64(s->rng) >> 11) * (1.0 / 9007199254740992.0) * sum;
  int32_t pick = idx[kept - 1];
  for (int32_t i = 0; i < kept; i++) {
    u -= s->prob[i];
    if (u <= 0) {
      pick = idx[i];
      break;
    }
  }
  *out = pick;
  return 0;
}

int anna_sampler_sample_candidates(anna_sampler *s, const int32_t *idx, const float *val, int k, const double *stats,
                                   int32_t *out) {
  return sample_candidates(s, idx, val, k, stats, NULL, out);
}

int anna_sampler_sample_candidates_tail(anna_sampler *s, const int32_t *idx, const float *val, int k,
                                        const double *stats, anna_sample_tail *t, int32_t *out) {
  return sample_candidates(s, idx, val, k, stats, t, out);
}
