/* engine.c: the engine thread (see engine.h). What runs in each step is decided by the
 * scheduler (anna.h, "Scheduler"); this file executes the plans: prompt caches, decode calls,
 * sampling, stop strings, streaming text to the requests. */
#include "engine.h"

#include "anna/anna.h"
#include "gbnf.h"
#include "jsonmask.h"
#include "jsonschema.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ENGINE_DETERMINISTIC_CHUNK 64 /* engine_options.deterministic */

double engine_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- requests ---- */

gen_request *gen_request_new(void) {
  gen_request *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  pthread_mutex_init(&r->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&r->cv, &ca);
  pthread_condattr_destroy(&ca);
  r->refs = 1;
  r->n = 1;
  r->sp = anna_sampler_params_default();
  r->t_arrival = engine_now();
  return r;
}

int gen_request_prepare(gen_request *r) {
  if (r->n_prompts <= 0 || r->n <= 0) return ANNA_EINVAL;
  r->n_choices = r->n_prompts * r->n;
  r->choices = calloc((size_t)r->n_choices, sizeof *r->choices);
  if (!r->choices) return ANNA_ENOMEM;
  for (int i = 0; i < r->n_choices; i++)
    r->choices[i].n_prompt = (int)r->n_prompt[i / r->n];
  return 0;
}

void gen_request_retain(gen_request *r) {
  __atomic_add_fetch(&r->refs, 1, __ATOMIC_ACQ_REL);
}

void gen_request_release(gen_request *r) {
  if (!r || __atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  for (int i = 0; i < r->n_prompts; i++)
    free(r->prompts ? r->prompts[i] : NULL);
  free(r->prompts);
  free(r->n_prompt);
  for (int i = 0; i < r->n_stop; i++)
    free(r->stop[i]);
  free(r->forced);
  for (int i = 0; i < r->n_media; i++)
    anna_media_free(r->media[i]);
  free(r->media);
  free(r->media_at);
  free(r->media_prompt);
  jsonschema_release(r->schema);
  gbnf_release(r->grammar);
  free(r->prefix);
  free(r->suffix);
  for (int i = 0; r->choices && i < r->n_choices; i++) {
    free(r->choices[i].text);
    free(r->choices[i].toks);
    free(r->choices[i].gen_ids);
  }
  free(r->choices);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
}

void gen_request_wait(gen_request *r, int timeout_ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += timeout_ms / 1000;
  ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

/* ---- engine ---- */

struct slot;

/* One sequence (a choice of a request) from submission to its end: the scheduler's user
 * pointer. While it waits after a preemption, parked holds its slot state. */
typedef struct wunit {
  gen_request *r;
  int ci; /* choice index */
  double t_queued;
  struct slot *parked; /* owned */
  int failed;          /* parking ran out of memory: finish with "error" when dropped */
} wunit;

typedef struct slot {
  gen_request *r; /* NULL: free */
  wunit *u;       /* owned while running */
  int ci;
  const int32_t *prompt;
  size_t n_prompt, n_fed;
  const int32_t *feed; /* what is fed before decoding: prompt, or toks after a preemption */
  size_t n_feed;
  int32_t *toks; /* [n_ctx]: prompt + generated ids, to recompute after a preemption */
  int32_t next_tok;
  int decoding;
  int n_gen, max_gen;
  anna_sampler *smp;
  anna_text_stream *ts;
  jsonmask jm;       /* JSON mode: what has been generated so far */
  jschema_state js;  /* the same with a schema (gen_request.schema) */
  gbnf_state gs;     /* the same with a grammar (gen_request.grammar) */
  size_t suffix_pos; /* forced suffix tokens emitted */
  int forced_ended;  /* the last n_gen step wrote no token (a forced output's end) */
  char *txt;         /* all generated text; [0, released) has gone to the choice */
  size_t len, cap, released;
  double t_last;
  int exact_store; /* keep this prompt's state + logits in the exact cache once prefilled */
  int32_t media_reused; /* a prompt with media: tokens the prefix pool gave (slot_media_prefill) */
} slot;

/* Exact prompt cache entry: a context sequence (beyond the n_seq slots) holding a whole
 * prompt's KV blocks (shared with whoever copies them) and recurrent state, and the logits
 * of its last token, so an identical prompt starts sampling at once. */
typedef struct exact_entry {
  int32_t *tok; /* [n_ctx] */
  int32_t n;    /* 0: empty */
  float *logits;
  uint64_t last_used;
} exact_entry;

struct engine {
  anna_model *m;
  const anna_text *text;
  anna_context *ctx;
  metrics *mx;
  engine_options o;
  int V;
  pthread_t th;
  int th_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;      /* engine waits for work */
  pthread_cond_t idle_cv; /* drain waits for idle */
  anna_sched *sc;         /* the batching policy; every call under mu */
  int running, stop, draining, cancel_all;
  int64_t kv_tokens, kv_cached, preemptions;
  anna_kv_stats kvs; /* the context's pool, as of the last step or going idle (under mu) */
  int64_t kv_seq_blocks, kv_exact_blocks; /* with kvs: blocks by holder (see kv_refs) */
  slot *slots;
  exact_entry *ex; /* [prompt_cache_size]; entry k is context sequence n_seq + k */
  float *row_tmp;
  /* sampling candidates of a step's rows (anna_context_decode_topk): [n_seq * ANNA_TOPK_MAX]
   * ids and logits, [n_seq * 2] max and softmax sum; host_sampling (engine_options):
   * always the full logits */
  int32_t *c_idx;
  float *c_val;
  double *c_st;
  int host_sampling;
  int32_t *b_tok, *b_seq, *b_pos;
  int8_t *b_want;
  int *out_slot;
  float *logits, *lp_row;
  uint64_t use_tick;
  int32_t keep_ids[4]; /* special tokens whose text the output parser needs */
  /* JSON mode, built on first use: every token's bytes, its class (0 plain text, 1 never
   * inside JSON (special), 2 part of a split UTF-8 character whose bytes are unknown: only
   * inside free strings), and the vocabulary in byte order for the schema mask; the three
   * arrays belong to jvoc. */
  const char *tok_bytes;
  const uint32_t *tok_off;
  const uint8_t *tok_cls;
  jschema_vocab *jvoc;
  gbnf_masker *gmask; /* grammar masks over jvoc, built on first use */
  int32_t *eog_ids; /* end-of-generation tokens (min_tokens masks them) */
  int n_eog;
  int64_t pool_blocks; /* KV pool size (0: no block pool) and block length, fixed at creation */
  int block_len;
  /* speculative decoding (o.spec_draft_max > 0): per slot index (not per slot struct, which a
   * preemption parks and restores elsewhere) the n-gram drafter over prompt + generated ids,
   * its draft buffer [ANNA_SPEC_MAX_DRAFT] and the window's output [ANNA_SPEC_MAX_DRAFT + 1];
   * one window per slot at most */
  anna_ngram **ng;
  int32_t *spec_draft, *spec_out;
  anna_spec_window *wins;
  int *win_slot;
  anna_spec_stats spec; /* as of the last step (under mu) */
  anna_vision_stats vis; /* as of the last step (under mu) */
  /* engine_embed: jobs queued under mu, run by the engine thread on sequence embed_seq
   * (-1: embeddings off); embed_cv wakes their callers. */
  struct embed_job *embed_q;
  int embed_seq, hidden;
  pthread_cond_t embed_cv;
};

typedef struct embed_job {
  const int32_t *ids;
  size_t n;
  float *out;
  int rc, done;
  char err[256];
  struct embed_job *next;
} embed_job;

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, double seconds) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + seconds;
  ts.tv_sec = (time_t)t;
  ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
  pthread_cond_timedwait(cv, mu, &ts);
}

static int is_cancelled(const gen_request *r) {
  return __atomic_load_n(&r->cancelled, __ATOMIC_ACQUIRE);
}

/* Reports to the scheduler from the engine thread (connection threads share it: under mu). */
static void sc_cached(engine *e, int i, size_t n) {
  pthread_mutex_lock(&e->mu);
  anna_sched_seq_cached(e->sc, i, (int32_t)n);
  pthread_mutex_unlock(&e->mu);
}

static void sc_token(engine *e, int i) {
  pthread_mutex_lock(&e->mu);
  anna_sched_seq_token(e->sc, i);
  pthread_mutex_unlock(&e->mu);
}

static void sc_finish(engine *e, int i) {
  pthread_mutex_lock(&e->mu);
  anna_sched_seq_finish(e->sc, i);
  pthread_mutex_unlock(&e->mu);
}

/* The engine's reference goes when its last sequence of r leaves. */
static void unit_done(gen_request *r) {
  if (--r->eng_units == 0) gen_request_release(r);
}

static int txt_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
  if (*len + n + 1 > *cap) {
    size_t nc = (*len + n + 1) * 2 < 256 ? 256 : (*len + n + 1) * 2;
    char *nb = realloc(*buf, nc);
    if (!nb) return ANNA_ENOMEM;
    *buf = nb;
    *cap = nc;
  }
  memcpy(*buf + *len, s, n);
  *len += n;
  (*buf)[*len] = '\0';
  return 0;
}

/* Finishes one choice (under r->mu) and wakes its connection. msg / code: the first error
 * (code ANNA_ENOMEM answers 503: memory or KV blocks ran out, worth a retry). */
static void choice_finish(gen_request *r, int ci, const char *reason, int code, const char *msg) {
  pthread_mutex_lock(&r->mu);
  gen_choice *c = &r->choices[ci];
  if (!c->done) {
    c->done = 1;
    c->finish_reason = reason;
    r->n_done++;
    if (msg && !r->error[0]) {
      snprintf(r->error, sizeof r->error, "%s", msg);
      r->error_code = code;
    }
  }
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* Moves text from the slot to the choice: everything up to the first stop string, minus a
 * tail that could still become a stop string. Returns 1 when a stop string was hit. */
static int slot_release(slot *s, int final) {
  gen_request *r = s->r;
  size_t end = s->len;
  int hit = 0;
  if (r->n_stop) {
    const char *from = s->txt + s->released;
    size_t avail = s->len - s->released, best = (size_t)-1;
    /* min_tokens: stop strings count only after that many tokens (vLLM); the tail that could
     * start one is still held back, so one that straddles the boundary is found. */
    const int honour = r->min_tokens == 0 || s->n_gen > r->min_tokens;
    for (int k = 0; k < r->n_stop && honour; k++) {
      const char *f = avail ? memmem(from, avail, r->stop[k], strlen(r->stop[k])) : NULL;
      if (f && (size_t)(f - from) < best) best = (size_t)(f - from);
    }
    if (best != (size_t)-1) {
      end = s->released + best;
      hit = 1;
    } else if (!final) {
      size_t hold = 0;
      for (int k = 0; k < r->n_stop; k++) {
        size_t sl = strlen(r->stop[k]);
        for (size_t h = sl - 1 < avail ? sl - 1 : avail; h > hold; h--)
          if (!memcmp(s->txt + s->len - h, r->stop[k], h)) {
            hold = h;
            break;
          }
      }
      end = s->len - hold;
    }
  }
  if (end > s->released) {
    pthread_mutex_lock(&r->mu);
    gen_choice *c = &r->choices[s->ci];
    if (txt_append(&c->text, &c->text_len, &c->text_cap, s->txt + s->released, end - s->released) ==
        0)
      s->released = end;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
  }
  return hit;
}

static void slot_free(engine *e, int i, const char *reason, int code, const char *msg, int flush) {
  slot *s = &e->slots[i];
  gen_request *r = s->r;
  char piece[256];
  size_t plen = 0;
  if (s->ts) anna_text_stream_flush(s->ts, piece, sizeof piece, &plen, NULL, 0);
  if (flush) {
    if (plen) txt_append(&s->txt, &s->len, &s->cap, piece, plen);
    slot_release(s, 1);
  }
  const int n_ids = s->n_gen - s->forced_ended;
  if (r->keep_ids && n_ids > 0) { /* once per choice, not per token */
    int32_t *ids = malloc(sizeof *ids * (size_t)n_ids);
    pthread_mutex_lock(&r->mu);
    gen_choice *c = &r->choices[s->ci];
    if (ids && !c->gen_ids) {
      memcpy(ids, s->toks + s->n_prompt, sizeof *ids * (size_t)n_ids);
      c->gen_ids = ids;
      c->n_gen_ids = (size_t)n_ids;
      ids = NULL;
    }
    pthread_mutex_unlock(&r->mu);
    free(ids);
  }
  choice_finish(r, s->ci, reason, code, msg);
  if (!strcmp(reason, "cancelled"))
    metrics_add(e->mx, &e->mx->cancelled, 1);
  else
    metrics_observe(e->mx, &e->mx->e2e, (engine_now() - r->t_arrival) * 1000.0);
  /* Its blocks go back to the pool; the registered ones stay cached for the next prompt. */
  anna_context_seq_reset(e->ctx, i);
  sc_finish(e, i); /* a no-op for a dropped sequence: the scheduler freed its slot already */
  anna_sampler_free(s->smp);
  s->smp = NULL;
  s->r = NULL;
  free(s->u);
  s->u = NULL;
  s->len = s->released = 0;
  s->decoding = 0;
  unit_done(r);
}

/* Frees a parked slot state (a preempted sequence that ends while it waits). */
static void parked_free(slot *p) {
  if (!p) return;
  anna_sampler_free(p->smp);
  anna_text_stream_free(p->ts);
  free(p->txt);
  free(p->toks);
  free(p);
}

/* Slot i's sequence was preempted: its cache is dropped (recomputed from prompt + generated
 * tokens when it is admitted again) and its state parked in its unit, with fresh buffers
 * left in the slot. Out of memory: the sequence is cancelled and ends with "error". */
static void slot_preempt(engine *e, int i, wunit *u) {
  slot *s = &e->slots[i];
  anna_context_seq_reset(e->ctx, i);
  slot *p = malloc(sizeof *p);
  anna_text_stream *ts = NULL;
  int32_t *toks = malloc((size_t)e->o.n_ctx * sizeof *toks);
  if (!p || !toks || anna_text_stream_new(&ts, e->text, 0, NULL, 0)) {
    free(p);
    free(toks);
    u->failed = 1;
    pthread_mutex_lock(&e->mu);
    anna_sched_cancel(e->sc, u->r->eng_sched_id + (uint64_t)u->ci);
    pthread_mutex_unlock(&e->mu);
    anna_sampler_free(s->smp);
    s->smp = NULL;
    s->r = NULL;
    s->u = NULL;
    s->len = s->released = 0;
    s->decoding = 0;
    return;
  }
  *p = *s;
  u->parked = p;
  memset(s, 0, sizeof *s);
  s->ts = ts;
  s->toks = toks;
}

/* The exact-cache entry holding this prompt (-1: none). */
static int exact_find(engine *e, const int32_t *p, size_t n) {
  for (int k = 0; k < e->o.prompt_cache_size; k++)
    if (e->ex[k].n == (int32_t)n && !memcmp(e->ex[k].tok, p, n * sizeof *p)) return k;
  return -1;
}

/* Where slot i's prompt starts: an exact-cache hit (the whole prompt, logits in hand: returns
 * the entry), else the longest prefix the block pool holds (the tokens before s->n_fed).
 * Prompts the exact cache will keep read the pool but do not register their blocks, so
 * nothing is resident twice. */
static int cache_reuse(engine *e, int i) {
  slot *s = &e->slots[i];
  s->n_fed = 0;
  s->exact_store = 0;
  anna_context_seq_reset(e->ctx, i);
  if (!e->o.prompt_cache) return -1;
  if (s->feed != s->prompt) { /* resumed after a preemption: the block pool only */
    int32_t r = anna_context_prefix_attach(e->ctx, i, s->feed, (int32_t)s->n_feed - 1,
                                           ANNA_PREFIX_REGISTER);
    s->n_fed = r > 0 ? (size_t)r : 0;
    return -1;
  }
  metrics_add(e->mx, &e->mx->cache_lookups, 1);
  const int eligible = e->o.prompt_cache_size > 0 &&
                       (e->o.prompt_cache_max_tokens <= 0 || s->n_prompt <= (size_t)e->o.prompt_cache_max_tokens);
  int hit = -1;
  if (eligible) {
    metrics_add(e->mx, &e->mx->exact_lookups, 1);
    hit = exact_find(e, s->prompt, s->n_prompt);
    if (hit >= 0 && anna_context_seq_copy(e->ctx, i, e->o.n_seq + hit, (int32_t)s->n_prompt, NULL, 0) == 0) {
      e->ex[hit].last_used = ++e->use_tick;
      s->n_fed = s->n_prompt;
      metrics_add(e->mx, &e->mx->exact_hits, 1);
    } else {
      hit = -1;
      s->exact_store = 1;
    }
  }
  anna_kv_stats before, after;
  if (hit < 0) {
    anna_context_kv_stats(e->ctx, &before);
    int32_t r = anna_context_prefix_attach(e->ctx, i, s->prompt, (int32_t)s->n_prompt - 1,
                                           eligible ? 0 : ANNA_PREFIX_REGISTER);
    anna_context_kv_stats(e->ctx, &after);
    s->n_fed = r > 0 ? (size_t)r : 0;
    pthread_mutex_lock(&e->mx->mu);
    e->mx->prefix_hit_blocks += after.hit_blocks - before.hit_blocks;
    e->mx->prefix_miss_blocks += after.miss_blocks - before.miss_blocks;
    e->mx->prefix_hit_tokens += (uint64_t)s->n_fed;
    e->mx->prefix_miss_tokens += (uint64_t)(s->n_prompt - s->n_fed);
    pthread_mutex_unlock(&e->mx->mu);
  }
  if (s->n_fed > 0) {
    pthread_mutex_lock(&e->mx->mu);
    e->mx->cache_hits++;
    e->mx->cache_reused_tokens += s->n_fed;
    pthread_mutex_unlock(&e->mx->mu);
  }
  return hit;
}

/* Slot i has just computed its prompt's last logits (row): keep the prompt in the exact
 * cache, replacing the least recently used entry. */
static void exact_store(engine *e, int i, const float *row) {
  slot *s = &e->slots[i];
  s->exact_store = 0;
  int k = 0;
  for (int j = 0; j < e->o.prompt_cache_size; j++) {
    if (e->ex[j].n == 0) {
      k = j;
      break;
    }
    if (e->ex[j].last_used < e->ex[k].last_used) k = j;
  }
  exact_entry *x = &e->ex[k];
  x->n = 0;
  if (anna_context_seq_copy(e->ctx, e->o.n_seq + k, i, (int32_t)s->n_prompt, NULL, 0)) {
    anna_context_seq_reset(e->ctx, e->o.n_seq + k);
    return;
  }
  memcpy(x->tok, s->prompt, s->n_prompt * sizeof *s->prompt);
  memcpy(x->logits, row, sizeof(float) * (size_t)e->V);
  x->n = (int32_t)s->n_prompt;
  x->last_used = ++e->use_tick;
}

static void slot_sample(engine *e, int i, float *row, int32_t pre);

/* A prompt with images (gen_request.media): the tower and the prompt but its last token run
 * here, alone, at slot start (anna_context_prefill); after a preemption the generated tokens
 * follow as text. The last token is left to the scheduler's batched steps, which sample from
 * it as from any prompt. With the prompt cache on, the prefix pool is read and fed with pads
 * keyed by their image's content (anna_context_prefix_attach_media): the same image + text
 * reuses KV (and skips the tower), another image never matches. No exact cache. */
static int slot_media_prefill(engine *e, int i, char *err, size_t errlen) {
  slot *s = &e->slots[i];
  const gen_request *r = s->r;
  anna_media_ref refs[64];
  s->exact_store = 0;
  s->n_fed = 0;
  s->media_reused = 0;
  anna_context_seq_reset(e->ctx, i);
  /* a request of several prompts (long audio cut into pieces) gives each choice its own media */
  const int pi = s->ci / r->n;
  int nr = 0;
  for (int k = 0; k < r->n_media; k++) {
    if ((r->media_prompt ? r->media_prompt[k] : 0) != pi) continue;
    if (nr == 64) return anna_err(err, errlen, ANNA_EINVAL, "more than 64 images");
    refs[nr++] = (anna_media_ref){r->media[k], r->media_at[k]};
  }
  const anna_prompt p = {s->feed, (int32_t)s->n_prompt - 1, refs, nr};
  int32_t got = 0;
  int rc = 0;
  /* images and video only: audio prompts (no vision tower) are not keyed for the prefix pool */
  if (e->o.prompt_cache && anna_model_has_vision(e->m)) {
    anna_kv_stats before, after;
    anna_context_kv_stats(e->ctx, &before);
    got = anna_context_prefix_attach_media(e->ctx, i, &p, ANNA_PREFIX_REGISTER, err, errlen);
    anna_context_kv_stats(e->ctx, &after);
    if (got < 0) {
      rc = got;
      got = 0;
    }
    pthread_mutex_lock(&e->mx->mu);
    e->mx->cache_lookups++;
    e->mx->prefix_hit_blocks += after.hit_blocks - before.hit_blocks;
    e->mx->prefix_miss_blocks += after.miss_blocks - before.miss_blocks;
    e->mx->prefix_hit_tokens += (uint64_t)got;
    e->mx->prefix_miss_tokens += (uint64_t)(s->n_prompt - (size_t)got);
    if (got > 0) {
      e->mx->cache_hits++;
      e->mx->cache_reused_tokens += (uint64_t)got;
    }
    pthread_mutex_unlock(&e->mx->mu);
  }
  /* the rest of the prompt: the media at or after the reused prefix, from there */
  int nk = 0;
  for (int k = 0; k < nr; k++)
    if (refs[k].at >= got) refs[nk++] = (anna_media_ref){refs[k].media, refs[k].at - got};
  const anna_prompt q = {s->feed + got, p.n - got, refs, nk};
  if (!rc && q.n > 0) rc = anna_context_prefill(e->ctx, i, &q, NULL, err, errlen);
  if (!rc && s->n_feed > s->n_prompt) {
    const anna_prompt q2 = {s->feed + s->n_prompt - 1, (int32_t)(s->n_feed - s->n_prompt), NULL, 0};
    rc = anna_context_prefill(e->ctx, i, &q2, NULL, err, errlen);
  }
  if (rc) {
    anna_context_seq_reset(e->ctx, i);
    return rc;
  }
  s->media_reused = got;
  s->n_fed = s->n_feed - 1;
  return 0;
}

/* The drafter of slot i restarts from what the slot feeds (prompt, or prompt + generated after
 * a preemption); a history that does not fit turns drafting off for this sequence. */
static void spec_history(engine *e, int i) {
  if (!e->ng) return;
  char err[128];
  anna_ngram_reset(e->ng[i]);
  const slot *s = &e->slots[i];
  if (anna_ngram_accept(e->ng[i], s->feed, (int32_t)s->n_feed, err, sizeof err)) anna_ngram_reset(e->ng[i]);
}

static int slot_start(engine *e, int i, wunit *u, char *err, size_t errlen) {
  slot *s = &e->slots[i];
  gen_request *r = u->r;
  if (u->parked && r->n_media) { /* resumed: the tower and prompt again, then the tokens so far */
    slot *p = u->parked;
    u->parked = NULL;
    anna_text_stream_free(s->ts);
    free(s->txt);
    free(s->toks);
    *s = *p;
    free(p);
    s->feed = s->toks;
    s->n_feed = s->n_prompt + (size_t)s->n_gen;
    s->decoding = 0;
    int rc = slot_media_prefill(e, i, err, errlen);
    if (rc) {
      anna_sampler_free(s->smp);
      s->smp = NULL;
      s->r = NULL;
      s->u = NULL;
      return rc;
    }
    sc_cached(e, i, s->n_fed);
    return 0;
  }
  if (u->parked) { /* resumed: its state comes back; prompt + generated tokens are recomputed */
    slot *p = u->parked;
    u->parked = NULL;
    anna_text_stream_free(s->ts);
    free(s->txt);
    free(s->toks);
    *s = *p;
    free(p);
    s->feed = s->toks;
    s->n_feed = s->n_prompt + (size_t)s->n_gen;
    s->decoding = 0;
    cache_reuse(e, i);
    sc_cached(e, i, s->n_fed);
    spec_history(e, i);
    return 0;
  }
  int pi = u->ci / r->n;
  anna_sampler_params sp = r->sp;
  sp.seed = r->sp.seed + (uint64_t)(u->ci % r->n);
  int rc = anna_sampler_create(&s->smp, e->V, &sp, err, errlen);
  if (rc) return rc;
  s->r = r;
  s->u = u;
  s->ci = u->ci;
  s->prompt = r->prompts[pi];
  s->n_prompt = r->n_prompt[pi];
  s->feed = s->prompt;
  s->n_feed = s->n_prompt;
  memcpy(s->toks, s->prompt, s->n_prompt * sizeof *s->toks);
  if (r->n_media && ((!r->media_prompt && pi != 0) ||
                     (rc = slot_media_prefill(e, i, err, errlen)) != 0)) {
    if (!rc) rc = anna_err(err, errlen, ANNA_EINVAL, "images belong to the first prompt");
    anna_sampler_free(s->smp);
    s->smp = NULL;
    s->r = NULL;
    s->u = NULL;
    return rc;
  }
  const int hit = r->n_media ? -1 : cache_reuse(e, i);
  sc_cached(e, i, s->n_fed);
  pthread_mutex_lock(&r->mu);
  r->choices[s->ci].n_cached = r->n_media ? (int)s->media_reused : (int)s->n_fed;
  pthread_mutex_unlock(&r->mu);
  s->decoding = 0;
  s->n_gen = 0;
  int room = e->o.n_ctx - (int)s->n_prompt;
  s->max_gen = r->max_tokens > 0 && r->max_tokens < room ? r->max_tokens : room;
  s->len = s->released = 0;
  for (size_t k = 0; k < s->n_prompt; k++)
    anna_sampler_accept(s->smp, s->prompt[k]);
  jsonmask_init(&s->jm);
  if (r->schema) jsonschema_start(r->schema, &s->js);
  if (r->grammar) gbnf_start(r->grammar, &s->gs);
  s->suffix_pos = 0;
  spec_history(e, i);
  s->forced_ended = 0;
  metrics_observe(e->mx, &e->mx->queue, (engine_now() - u->t_queued) * 1000.0);
  if (hit >= 0) { /* the whole prompt was cached: its first token comes from the stored logits */
    memcpy(e->row_tmp, e->ex[hit].logits, sizeof(float) * (size_t)e->V);
    slot_sample(e, i, e->row_tmp, -1);
  }
  return 0;
}

/* log-softmax of the raw logits (before penalties and temperature, as OpenAI reports). */
static void token_logprobs(const float *row, int V, int32_t t, int ntop, gen_token *g) {
  float mx = row[0];
  for (int j = 1; j < V; j++)
    mx = row[j] > mx ? row[j] : mx;
  double sum = 0;
  for (int j = 0; j < V; j++)
    sum += exp((double)(row[j] - mx));
  float lse = mx + (float)log(sum);
  g->id = t;
  g->logprob = row[t] - lse;
  g->n_top = 0;
  for (int j = 0; j < V && ntop > 0; j++) {
    float v = row[j];
    if (g->n_top == ntop && v <= row[g->top_id[ntop - 1]]) continue;
    int k = g->n_top < ntop ? g->n_top++ : ntop - 1;
    while (k > 0 && row[g->top_id[k - 1]] < v) {
      g->top_id[k] = g->top_id[k - 1];
      k--;
    }
    g->top_id[k] = j;
  }
  for (int k = 0; k < g->n_top; k++)
    g->top_lp[k] = row[g->top_id[k]] - lse;
}

static int json_tables(engine *e) {
  if (e->jvoc) return 0;
  int rc = jsonschema_vocab_from_text(&e->jvoc, e->text);
  if (rc) return rc;
  jsonschema_vocab_tables(e->jvoc, &e->tok_bytes, &e->tok_off, &e->tok_cls);
  return 0;
}

/* Whether the JSON (or schema) value is complete; *more: it may also go on (a number). */
static int slot_json_done(const slot *s, int *more) {
  *more = 0;
  if (!s->r->schema) return jsonmask_done(&s->jm);
  if (!jsonschema_done(&s->js)) return 0;
  for (int i = 0; i < s->js.n; i++)
    *more |= s->js.t[i].depth > 0;
  return 1;
}

/* Masks every token that would break the JSON prefix (-inf logit); end of generation only
 * once the object is complete. Returns the number of tokens left. */
static int json_mask(engine *e, slot *s, float *row) {
  int allowed = 0, more;
  if (s->r->schema) {
    /* Complete but extendable (a top-level number): end of generation or more digits. */
    int done = slot_json_done(s, &more);
    float keep[8];
    int n_keep = e->n_eog < 8 ? e->n_eog : 8;
    for (int k = 0; k < n_keep; k++)
      keep[k] = row[e->eog_ids[k]];
    if (!done || more) allowed = jsonschema_vocab_mask(e->jvoc, &s->js, row);
    else
      for (int v = 0; v < e->V; v++)
        row[v] = -INFINITY;
    for (int k = 0; k < n_keep && done; k++) {
      row[e->eog_ids[k]] = keep[k];
      allowed++;
    }
    return allowed;
  }
  if (jsonmask_done(&s->jm)) {
    for (int v = 0; v < e->V; v++)
      if (!anna_text_is_eog(e->text, v))
        row[v] = -INFINITY;
      else
        allowed++;
    return allowed;
  }
  int in_str = jsonmask_in_string(&s->jm);
  for (int v = 0; v < e->V; v++) {
    int ok;
    if (e->tok_cls[v] == 1)
      ok = 0;
    else if (e->tok_cls[v] == 2)
      ok = in_str;
    else {
      jsonmask probe = s->jm;
      ok = jsonmask_feed(&probe, e->tok_bytes + e->tok_off[v], e->tok_off[v + 1] - e->tok_off[v]) ==
           0;
    }
    if (!ok) row[v] = -INFINITY;
    allowed += ok;
  }
  return allowed;
}

/* Masks every token the grammar does not allow next; end of generation only where the text
 * is a whole sentence. Returns the number of tokens left. */
static int grammar_mask(engine *e, slot *s, float *row) {
  float keep[8];
  int n_keep = e->n_eog < 8 ? e->n_eog : 8, done = gbnf_done(&s->gs), allowed = 0;
  for (int k = 0; k < n_keep; k++)
    keep[k] = row[e->eog_ids[k]];
  if (gbnf_more(&s->gs)) {
    allowed = gbnf_mask(e->gmask, &s->gs, row);
  } else {
    for (int v = 0; v < e->V; v++)
      row[v] = -INFINITY;
  }
  for (int k = 0; k < n_keep && done; k++) {
    row[e->eog_ids[k]] = keep[k];
    allowed++;
  }
  return allowed;
}

/* Whether slot i's next row can be sampled from the backend's candidates (see
 * anna_context_decode_topk): a plain sample, no logprobs, JSON mask, forced or prefix token, or
 * exact-cache store (those read the full row); *k and *temp as anna_sampler_candidates_k. */
static int slot_cand_ok(const engine *e, int i, int *k, float *temp) {
  const slot *s = &e->slots[i];
  const gen_request *r = s->r;
  if (!r || r->logprobs || r->json_mode || r->grammar || r->forced || (size_t)s->n_gen < r->n_prefix)
    return 0;
  if (s->n_gen < r->min_tokens) return 0; /* the end-of-generation mask needs the full row */
  if (s->exact_store && !s->decoding) return 0;
  return (*k = anna_sampler_candidates_k(s->smp, temp)) > 0;
}

/* One sampled position of slot i: record, stream text, decide whether it goes on. pre >= 0:
 * the token, already drawn from candidates (slot_cand_ok held; row unused). */
static void slot_sample(engine *e, int i, float *row, int32_t pre) {
  slot *s = &e->slots[i];
  gen_request *r = s->r;
  gen_token g;
  int want_lp = pre < 0 && r->logprobs;
  if (want_lp) memcpy(e->lp_row, row, sizeof(float) * (size_t)e->V);
  /* Which token: a forced one (debug output, a forced tool-call prefix or its closing
   * suffix once the JSON arguments are complete), or a sample, masked in JSON mode. */
  size_t idx = (size_t)s->n_gen;
  int32_t t = 0;
  int forced_end = 0, json_more = 0;
  if (pre >= 0) {
    t = pre;
  } else if (r->forced) {
    if (idx < r->n_forced)
      t = r->forced[idx];
    else
      forced_end = 1;
  } else if (idx < r->n_prefix) {
    t = r->prefix[idx];
  } else if (r->json_mode && r->n_suffix && slot_json_done(s, &json_more) && !json_more) {
    if (s->suffix_pos < r->n_suffix)
      t = r->suffix[s->suffix_pos++];
    else
      forced_end = 1;
  } else {
    if (r->grammar) {
      if (json_tables(e) || (!e->gmask && gbnf_masker_new(&e->gmask, e->jvoc))) {
        slot_free(e, i, "error", ANNA_ENOMEM, "out of memory for the grammar token tables", 0);
        return;
      }
      if (grammar_mask(e, s, row) == 0) {
        slot_free(e, i, "stop", 0, NULL, 1);
        return;
      }
    }
    if (r->json_mode) {
      if (json_tables(e)) {
        slot_free(e, i, "error", ANNA_ENOMEM, "out of memory for the JSON token tables", 0);
        return;
      }
      if (json_mask(e, s, row) == 0) {
        slot_free(e, i, "stop", 0, NULL, 1);
        return;
      }
    }
    /* min_tokens (vLLM): no end of generation yet. JSON mode already keeps special tokens out
     * until the object is complete, and then allows nothing else: it wins. */
    if (s->n_gen < r->min_tokens && !r->json_mode && !r->grammar)
      for (int k = 0; k < e->n_eog; k++)
        row[e->eog_ids[k]] = -INFINITY;
    t = anna_sampler_sample(s->smp, row);
    if (r->grammar && e->tok_cls[t] == 0 && !anna_text_is_eog(e->text, t))
      gbnf_feed(&s->gs, e->tok_bytes + e->tok_off[t], e->tok_off[t + 1] - e->tok_off[t]);
    if (r->json_mode && e->tok_cls[t] == 0) {
      const char *tb = e->tok_bytes + e->tok_off[t];
      size_t tn = e->tok_off[t + 1] - e->tok_off[t];
      if (r->schema)
        jsonschema_feed(&s->js, tb, tn);
      else
        jsonmask_feed(&s->jm, tb, tn);
    }
  }
  s->forced_ended = forced_end;
  if (!forced_end) {
    s->toks[s->n_prompt + idx] = t; /* idx < max_gen <= n_ctx - n_prompt */
    anna_sampler_accept(s->smp, t);
    if (e->ng && anna_ngram_accept(e->ng[i], &t, 1, NULL, 0)) anna_ngram_reset(e->ng[i]);
    if (want_lp) token_logprobs(e->lp_row, e->V, t, r->top_logprobs, &g);
  }
  s->n_gen++;
  double now = engine_now();
  if (s->n_gen == 1)
    metrics_observe(e->mx, &e->mx->ttft, (now - r->t_arrival) * 1000.0);
  else
    metrics_observe(e->mx, &e->mx->itl, (now - s->t_last) * 1000.0);
  s->t_last = now;
  metrics_add(e->mx, &e->mx->completion_tokens, 1);
  int eog = forced_end || (!r->ignore_eos && anna_text_is_eog(e->text, t));
  pthread_mutex_lock(&r->mu);
  gen_choice *c = &r->choices[s->ci];
  c->n_gen = s->n_gen;
  if (want_lp && !eog) {
    if (c->n_toks == c->cap_toks) {
      size_t nc = c->cap_toks ? c->cap_toks * 2 : 16;
      gen_token *nt = realloc(c->toks, nc * sizeof *nt);
      if (nt) c->toks = nt, c->cap_toks = nc;
    }
    if (c->n_toks < c->cap_toks) c->toks[c->n_toks++] = g;
  }
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  if (eog) {
    slot_free(e, i, "stop", 0, NULL, 1);
    return;
  }
  char piece[256];
  size_t plen = 0;
  /* Control tokens stay out of the text, except the reasoning / tool-call tags, which some
   * vocabularies mark special but which the response parser has to see. */
  int keep = !anna_text_token_is_special(e->text, t);
  for (int k = 0; k < 4 && !keep; k++)
    keep = t == e->keep_ids[k];
  if (keep && anna_text_stream_feed(s->ts, t, piece, sizeof piece, &plen, NULL, 0) == 0 && plen &&
      txt_append(&s->txt, &s->len, &s->cap, piece, plen)) {
    slot_free(e, i, "error", ANNA_ENOMEM, "out of memory", 0);
    return;
  }
  if (slot_release(s, 0)) {
    slot_free(e, i, "stop", 0, NULL, 0);
    return;
  }
  if (s->n_gen >= s->max_gen || (int64_t)s->n_prompt + s->n_gen >= e->o.n_ctx) {
    slot_free(e, i, "length", 0, NULL, 1);
    return;
  }
  s->next_tok = t;
  s->decoding = 1;
  sc_token(e, i);
}

/* A sequence the scheduler dropped (cancelled, or parking it failed). */
static void unit_drop(engine *e, const anna_sched_entry *d) {
  wunit *u = d->user;
  if (d->slot >= 0 && e->slots[d->slot].r) {
    slot_free(e, d->slot, "cancelled", 0, NULL, 0); /* frees u */
    return;
  }
  if (u->failed) {
    choice_finish(u->r, u->ci, "error", ANNA_ENOMEM, "out of memory preempting a sequence");
  } else {
    metrics_add(e->mx, &e->mx->cancelled, 1);
    choice_finish(u->r, u->ci, "cancelled", 0, NULL);
  }
  parked_free(u->parked);
  unit_done(u->r);
  free(u);
}

/* Blocks the scheduler may plan with: free ones and cached ones (evicted on demand). */
static int64_t kv_available(const anna_kv_stats *ks) {
  return ks->n_blocks > 0 ? ks->free_blocks + ks->cached_blocks : -1;
}

/* Call with mu held, on the engine thread, right after e->kvs was taken: the blocks the slots'
 * sequences and the exact-cache entries can reference, ceil(length / block_len) each. An upper
 * bound (blocks two holders share count twice), so a pool block in use beyond both sums is held
 * by nothing: a leak (/healthz kv_blocks.unaccounted); at idle with no exact entries it is exact. */
static void kv_refs(engine *e) {
  const int64_t bl = e->kvs.block_len > 0 ? e->kvs.block_len : 1;
  int64_t sq = 0, ex = 0;
  for (int i = 0; i < e->o.n_seq; i++)
    sq += ((int64_t)anna_context_seq_len(e->ctx, i) + bl - 1) / bl;
  for (int k = 0; k < e->o.prompt_cache_size; k++)
    ex += ((int64_t)anna_context_seq_len(e->ctx, e->o.n_seq + k) + bl - 1) / bl;
  e->kv_seq_blocks = e->kvs.n_blocks > 0 ? sq : 0;
  e->kv_exact_blocks = e->kvs.n_blocks > 0 ? ex : 0;
}

/* The running sequences cannot proceed for want of KV blocks (see engine_main). Exact-cache
 * entries hold blocks the pool cannot evict: they go first. When there are none, every running
 * sequence ends with "error" / ANNA_ENOMEM (HTTP 503 + Retry-After, or an error event on a
 * stream); the server goes on with the next request. */
static void kv_exhausted(engine *e) {
  int dropped = 0;
  for (int k = 0; k < e->o.prompt_cache_size; k++)
    if (e->ex[k].n) {
      e->ex[k].n = 0;
      anna_context_seq_reset(e->ctx, e->o.n_seq + k);
      dropped = 1;
    }
  anna_kv_stats ks;
  anna_context_kv_stats(e->ctx, &ks);
  if (!dropped)
    for (int i = 0; i < e->o.n_seq; i++) {
      slot *s = &e->slots[i];
      if (!s->r) continue;
      char msg[256];
      snprintf(msg, sizeof msg,
               "the KV cache is exhausted: this sequence needs more than the whole pool of %lld blocks of "
               "%d positions (%zu tokens cached, %zu to go); retry later, or with a shorter prompt or "
               "max_tokens",
               (long long)ks.n_blocks, ks.block_len, s->n_fed, s->n_feed > s->n_fed ? s->n_feed - s->n_fed : 1);
      slog(SLOG_WARN, s->r->id, "%s", msg);
      slot_free(e, i, "error", ANNA_ENOMEM, msg, 0);
    }
  if (!dropped) anna_context_kv_stats(e->ctx, &ks);
  pthread_mutex_lock(&e->mu);
  e->kvs = ks;
  kv_refs(e);
  pthread_mutex_unlock(&e->mu);
}

/* How many tokens slot i may draft this step (0: decode it plainly): greedy without
 * penalties, nothing that needs the full row (logprobs, JSON, forced ids, min_tokens), no
 * images (their positions carry a rotary delta), room before max_gen and the context, and
 * no KV block beyond the one plain step's (the plan counted only those). */
static int spec_room(engine *e, int i) {
  const slot *s = &e->slots[i];
  const gen_request *r = s->r;
  if (!e->ng || !r || !s->decoding || r->logprobs || r->json_mode || r->grammar || r->forced ||
      r->n_media ||
      (size_t)s->n_gen < r->n_prefix || s->n_gen < r->min_tokens)
    return 0;
  const anna_sampler_params *sp = &r->sp;
  if (sp->temperature > 0 || sp->repetition_penalty != 1.0f || sp->presence_penalty != 0.0f ||
      sp->frequency_penalty != 0.0f)
    return 0;
  int k = e->o.spec_draft_max;
  const int64_t len = anna_context_seq_len(e->ctx, i);
  if (k > s->max_gen - s->n_gen - 1) k = s->max_gen - s->n_gen - 1;
  if (k > e->o.n_ctx - 1 - len) k = (int)(e->o.n_ctx - 1 - len);
  while (k > 0 && anna_context_seq_blocks_needed(e->ctx, i, k + 1) > anna_context_seq_blocks_needed(e->ctx, i, 1)) k--;
  return k > 0 ? k : 0;
}

/* One embedding input on the reserved sequence: prompt chunks of n_batch, only the last
 * token flagged, so only its hidden row is computed past the last layer. */
static int embed_run(engine *e, embed_job *j) {
  const int seq = e->embed_seq, B = e->o.n_batch;
  anna_context_seq_reset(e->ctx, seq);
  int rc = 0;
  for (size_t at = 0; at < j->n && !rc; at += (size_t)B) {
    const int nb = j->n - at < (size_t)B ? (int)(j->n - at) : B;
    for (int k = 0; k < nb; k++) {
      e->b_tok[k] = j->ids[at + (size_t)k];
      e->b_seq[k] = seq;
      e->b_pos[k] = (int32_t)(at + (size_t)k);
      e->b_want[k] = at + (size_t)k + 1 == j->n;
    }
    const anna_batch b = {nb, e->b_tok, e->b_seq, e->b_pos, e->b_want};
    rc = anna_context_decode_hidden(e->ctx, &b, j->out, j->err, sizeof j->err);
  }
  anna_context_seq_reset(e->ctx, seq);
  return rc;
}

static void embed_run_all(engine *e, embed_job *jobs, int stop) {
  for (embed_job *j = jobs, *next; j; j = next) {
    next = j->next;
    const int rc = stop ? anna_err(j->err, sizeof j->err, ANNA_ESTATE, "shutting down") : embed_run(e, j);
    if (!stop) metrics_add(e->mx, &e->mx->prompt_tokens, (uint64_t)j->n);
    pthread_mutex_lock(&e->mu);
    j->rc = rc;
    j->done = 1;
    pthread_cond_broadcast(&e->embed_cv);
    pthread_mutex_unlock(&e->mu);
  }
}

int engine_hidden_size(const engine *e) {
  return e->hidden;
}

int engine_embed(engine *e, const int32_t *ids, size_t n, float *out, char *err, size_t errlen) {
  if (e->embed_seq < 0 || e->hidden <= 0)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    e->hidden <= 0 ? "this model gives no hidden states"
                                   : "embeddings are off: start the server with --embeddings");
  if (n == 0) return anna_err(err, errlen, ANNA_EINVAL, "the input is empty");
  if (n > (size_t)e->o.n_ctx)
    return anna_err(err, errlen, ANNA_EINVAL, "the input has %zu tokens; this server's context (--ctx-size) is %d",
                    n, e->o.n_ctx);
  embed_job j = {.ids = ids, .n = n, .out = out};
  pthread_mutex_lock(&e->mu);
  if (e->draining || e->stop) {
    pthread_mutex_unlock(&e->mu);
    return anna_err(err, errlen, ANNA_ESTATE, "the server is shutting down");
  }
  embed_job **tail = &e->embed_q;
  while (*tail) tail = &(*tail)->next;
  *tail = &j;
  pthread_cond_signal(&e->cv);
  while (!j.done) pthread_cond_wait(&e->embed_cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
  if (j.rc) return anna_err(err, errlen, j.rc, "%s", j.err);
  return 0;
}

static void *engine_main(void *arg) {
  engine *e = arg;
  const int S = e->o.n_seq;
  char err[512];
  int kv_replan = 0; /* the last step planned nothing after preemptions (see below) */
  for (;;) {
    pthread_mutex_lock(&e->mu);
    for (;;) {
      if (e->stop || anna_sched_n_running(e->sc) > 0 || e->embed_q) break;
      double w = anna_sched_wait_ms(e->sc, engine_now() * 1000.0);
      if (w >= 0) {
        /* An idle engine may wait a little for company, so the first step is shared. */
        if (w > 0 && !e->cancel_all) {
          timed_wait(&e->cv, &e->mu, w / 1000.0);
          continue;
        }
        break;
      }
      e->running = 0;
      e->kv_tokens = 0;
      /* Sequences cancelled since the last step gave their blocks back without a step to
       * refresh the counts: an idle /healthz shows the pool as it is. */
      anna_context_kv_stats(e->ctx, &e->kvs);
      kv_refs(e);
      pthread_cond_broadcast(&e->idle_cv);
      pthread_cond_wait(&e->cv, &e->mu);
    }
    int stop = e->stop;
    embed_job *jobs = e->embed_q;
    e->embed_q = NULL;
    /* Shutdown or a drain that timed out: nothing queued or running survives. */
    if (e->cancel_all || e->stop) anna_sched_cancel_all(e->sc);
    const anna_sched_entry *adm;
    int n_adm = 0;
    anna_sched_admit(e->sc, engine_now() * 1000.0, kv_available(&e->kvs), &adm, &n_adm);
    /* Counted as running from now on, so a drain never sees the handover as idle. */
    e->running = anna_sched_n_running(e->sc);
    pthread_mutex_unlock(&e->mu);
    embed_run_all(e, jobs, stop);

    int kv_dirty = n_adm > 0;
    for (int k = 0; k < n_adm; k++) {
      wunit *u = adm[k].user;
      const int i = adm[k].slot;
      const int src = slot_start(e, i, u, err, sizeof err);
      if (src) {
        sc_finish(e, i);
        choice_finish(u->r, u->ci, "error", src, err);
        parked_free(u->parked);
        unit_done(u->r);
        free(u);
      }
    }
    /* Cancelled or shut down: finish those sequences, free their slots. */
    for (;;) {
      anna_sched_entry d;
      pthread_mutex_lock(&e->mu);
      int got = anna_sched_drop_next(e->sc, &d);
      pthread_mutex_unlock(&e->mu);
      if (!got) break;
      kv_dirty |= d.slot >= 0;
      unit_drop(e, &d);
    }
    if (stop) break;

    /* The step: decodes first (in the scheduler's rotating order), then prompt chunks in
     * admission order; preempted sequences leave their slots before it runs. */
    anna_kv_stats pk = e->kvs; /* the engine thread is its only writer */
    if (kv_dirty) anna_context_kv_stats(e->ctx, &pk);
    anna_sched_plan p;
    pthread_mutex_lock(&e->mu);
    /* The cache's own block counts (copies of shared blocks, blocks a preemption would not
     * free), so the plan never needs a block the pool cannot give. */
    if (kv_available(&pk) >= 0)
      for (int i = 0; i < S; i++)
        if (anna_sched_slot_id(e->sc, i))
          anna_sched_seq_blocks(e->sc, i, anna_context_seq_blocks_needed(e->ctx, i, 1),
                                anna_context_seq_blocks_held(e->ctx, i));
    anna_sched_plan_step(e->sc, kv_available(&pk), &p);
    pthread_mutex_unlock(&e->mu);
    for (int k = 0; k < p.n_preempted; k++)
      slot_preempt(e, p.preempted[k].slot, p.preempted[k].user);
    if (p.n_preempted) {
      pthread_mutex_lock(&e->mu);
      e->preemptions += p.n_preempted;
      pthread_mutex_unlock(&e->mu);
    }
    int nb = 0, nflag = 0, nw = 0, wrows = 0;
    const int nseqs = p.n_decode + p.n_prefill;
    for (int k = 0; k < p.n_decode; k++) {
      const int i = p.decode[k].slot;
      /* the windows run as one forward pass of their own: their rows must fit n_batch */
      int room = spec_room(e, i);
      if (room > e->o.n_batch - wrows - 1) room = e->o.n_batch - wrows - 1;
      const int kd = room > 0 ? anna_ngram_draft(e->ng[i], e->spec_draft + (size_t)i * ANNA_SPEC_MAX_DRAFT, room) : 0;
      if (kd > 0) { /* a verify window instead of one plain token */
        e->wins[nw] = (anna_spec_window){.seq = i,
                                         .last = e->slots[i].next_tok,
                                         .draft = e->spec_draft + (size_t)i * ANNA_SPEC_MAX_DRAFT,
                                         .k = kd,
                                         .out = e->spec_out + (size_t)i * (ANNA_SPEC_MAX_DRAFT + 1)};
        e->win_slot[nw++] = i;
        wrows += kd + 1;
        continue;
      }
      e->b_tok[nb] = e->slots[i].next_tok;
      e->b_seq[nb] = i;
      e->b_pos[nb] = anna_context_seq_len(e->ctx, i);
      e->b_want[nb] = 1;
      e->out_slot[nflag++] = i;
      nb++;
    }
    int64_t prompt_fed = 0;
    for (int k = 0; k < p.n_prefill; k++) {
      const int i = p.prefill[k].slot;
      const slot *s = &e->slots[i];
      for (int32_t j = 0; j < p.prefill[k].n; j++) {
        const size_t at = (size_t)p.prefill[k].pos + (size_t)j;
        e->b_tok[nb] = s->feed[at];
        e->b_seq[nb] = i;
        e->b_pos[nb] = (int32_t)at;
        e->b_want[nb] = at + 1 == s->n_feed;
        if (e->b_want[nb]) e->out_slot[nflag++] = i;
        nb++;
      }
      prompt_fed += p.prefill[k].n;
    }
    if (nb == 0 && nw == 0) {
      pthread_mutex_lock(&e->mu);
      const int blocked = anna_sched_n_running(e->sc) > 0;
      pthread_mutex_unlock(&e->mu);
      /* Sequences running but nothing planned: the one left cannot get a KV block even alone
       * (the scheduler preempted everything else already); waiting would spin forever. After
       * preemptions, though, the pool may hold more than the scheduler counted back (it counts
       * only blocks the cache said a reset frees): plan again with the pool as it is. */
      if (blocked && kv_available(&pk) >= 0 && p.n_preempted > 0 && !kv_replan) {
        kv_replan = 1; /* once: a sequence that cannot fit even then is exhausted */
        anna_kv_stats ks;
        anna_context_kv_stats(e->ctx, &ks);
        pthread_mutex_lock(&e->mu);
        e->kvs = ks;
        kv_refs(e);
        pthread_mutex_unlock(&e->mu);
      } else if (blocked && kv_available(&pk) >= 0) {
        kv_exhausted(e);
      }
      continue;
    }
    kv_replan = 0;
    anna_batch b = {nb, e->b_tok, e->b_seq, e->b_pos, e->b_want};
    /* Candidates instead of logits when every sampled row allows it: the largest k any row
     * needs (a row's own top-k is a prefix of them) at the one temperature whose softmax sum
     * the top-p / min-p rows need; rows of different such temperatures take the full rows. */
    int kc = 0;
    float ktemp = 0.0f;
    for (int k = 0; k < nflag && !e->host_sampling; k++) {
      int kk = 0;
      float tt = 0.0f;
      if (!slot_cand_ok(e, e->out_slot[k], &kk, &tt) || (tt > 0 && ktemp > 0 && tt != ktemp)) {
        kc = 0;
        break;
      }
      if (tt > 0) ktemp = tt;
      kc = kk > kc ? kk : kc;
    }
    /* The verify windows first (one forward pass of their own), then the plain batch. */
    if (nw > 0) {
      const int vrc = anna_context_verify(e->ctx, e->wins, nw, err, sizeof err);
      if (vrc) {
        slog(SLOG_ERROR, NULL, "speculative verify failed: %s", err);
        const int code = vrc == ANNA_ERANGE || vrc == ANNA_ENOMEM ? ANNA_ENOMEM : vrc;
        for (int w = 0; w < nw; w++) {
          const int i = e->win_slot[w];
          if (e->slots[i].r) slot_free(e, i, "error", code, err, 0);
          else anna_context_seq_reset(e->ctx, i);
          e->wins[w].n_out = 0;
        }
      }
    }
    const int drc = nb == 0 ? 0
                    : kc > 0 ? anna_context_decode_topk(e->ctx, &b, kc, ktemp, e->c_idx, e->c_val, e->c_st, err,
                                                        sizeof err)
                             : anna_context_decode(e->ctx, &b, e->logits, err, sizeof err);
    if (drc) {
      slog(SLOG_ERROR, NULL, "decode failed: %s", err);
      /* No free KV block (ANNA_ERANGE) or no memory: a retry may succeed (HTTP 503). */
      const int code = drc == ANNA_ERANGE || drc == ANNA_ENOMEM ? ANNA_ENOMEM : drc;
      for (int i = 0; i < S; i++) {
        int touched = 0;
        for (int k = 0; k < nb; k++)
          touched |= e->b_seq[k] == i;
        if (touched && e->slots[i].r)
          slot_free(e, i, "error", code, err, 0);
        else if (touched)
          anna_context_seq_reset(e->ctx, i);
      }
      continue;
    }
    pthread_mutex_lock(&e->mx->mu);
    e->mx->decode_steps++;
    e->mx->batch_tokens += (uint64_t)(nb + wrows);
    e->mx->batch_seqs += (uint64_t)nseqs;
    e->mx->prompt_tokens += (uint64_t)prompt_fed;
    pthread_mutex_unlock(&e->mx->mu);
    pthread_mutex_lock(&e->mu);
    anna_sched_commit(e->sc, &p);
    pthread_mutex_unlock(&e->mu);
    for (int k = 0; k < p.n_prefill; k++)
      e->slots[p.prefill[k].slot].n_fed += (size_t)p.prefill[k].n;
    /* a window's accepted drafts are in the cache, its last id is the new pending token: each
     * goes through slot_sample as a drawn token would (stop strings, limits, streaming) */
    for (int w = 0; w < nw; w++) {
      const int i = e->win_slot[w];
      for (int j = 0; j < e->wins[w].n_out && e->slots[i].r; j++) slot_sample(e, i, NULL, e->wins[w].out[j]);
    }
    for (int k = 0; k < nflag; k++) {
      int i = e->out_slot[k];
      slot *s = &e->slots[i];
      if (kc > 0) { /* from the candidates; a row they do not decide is fetched in full */
        int32_t t;
        if (!s->r) continue;
        if (!anna_sampler_sample_candidates(s->smp, e->c_idx + (size_t)k * (size_t)kc,
                                            e->c_val + (size_t)k * (size_t)kc, kc,
                                            e->c_st + 2 * (size_t)k, &t)) {
          slot_sample(e, i, NULL, t);
        } else {
          const int lrc = anna_context_logits_row(e->ctx, k, e->row_tmp, err, sizeof err);
          if (lrc) {
            slot_free(e, i, "error", lrc, err, 0);
            continue;
          }
          slot_sample(e, i, e->row_tmp, -1);
        }
        continue;
      }
      if (s->r && s->exact_store && !s->decoding) exact_store(e, i, e->logits + (size_t)k * (size_t)e->V);
      if (s->r) slot_sample(e, i, e->logits + (size_t)k * (size_t)e->V, -1);
    }
    if (e->o.debug_step_delay_ms > 0) {
      struct timespec d = {e->o.debug_step_delay_ms / 1000,
                           (long)(e->o.debug_step_delay_ms % 1000) * 1000000L};
      nanosleep(&d, NULL);
    }
    int64_t kv = 0, cached = 0;
    for (int i = 0; i < S; i++)
      if (e->slots[i].r) kv += anna_context_seq_len(e->ctx, i);
    anna_kv_stats ks;
    anna_context_kv_stats(e->ctx, &ks);
    /* Cached: what idle blocks and exact entries hold for later prompts. */
    cached = ks.cached_blocks * ks.block_len;
    for (int k = 0; k < e->o.prompt_cache_size; k++) cached += e->ex[k].n;
    anna_spec_stats sps = {0};
    if (e->ng) anna_context_spec_stats(e->ctx, &sps); /* the engine thread's counters, published under mu */
    anna_vision_stats vst;
    anna_context_vision_stats(e->ctx, &vst);
    pthread_mutex_lock(&e->mu);
    if (e->ng) e->spec = sps;
    e->vis = vst;
    e->running = anna_sched_n_running(e->sc);
    e->kv_tokens = kv;
    e->kv_cached = cached;
    e->kvs = ks;
    kv_refs(e);
    pthread_mutex_unlock(&e->mu);
  }
  pthread_mutex_lock(&e->mu);
  e->running = 0;
  pthread_cond_broadcast(&e->idle_cv);
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

/* --gpu-memory-utilization F: sets co->kv_blocks so that anna's share of the device stays
 * within F * total. The pool is allocated at context creation, after which the model's
 * weights are mirrored (warm-up), so a probe context of the same shape with the smallest pool
 * (one block per sequence) measures what everything but the pool leaves free; the pool gets
 * free + probe pool - (1 - F) * total, in whole blocks of the probe's bytes per block. Other
 * processes' memory counts against F, as everything the device reports in use does. */
static int kv_blocks_for_memory(anna_model *m, anna_context_options *co, float frac, char *err, size_t errlen) {
  if (co->kv_blocks > 0)
    return anna_err(err, errlen, ANNA_EINVAL, "--gpu-memory-utilization and --kv-blocks contradict each other");
  if (!(frac > 0.0f && frac <= 1.0f))
    return anna_err(err, errlen, ANNA_EINVAL, "--gpu-memory-utilization %g is not in (0, 1]", (double)frac);
  anna_context_options po = *co;
  po.kv_blocks = po.n_seq;
  anna_context *probe = NULL;
  int rc = anna_context_create(&probe, m, &po, err, errlen);
  if (rc) return rc;
  int64_t free_b = 0, total_b = 0;
  rc = anna_context_memory(probe, &free_b, &total_b);
  anna_kv_stats ks;
  anna_context_kv_stats(probe, &ks);
  anna_context_free(probe);
  if (rc == ANNA_EUNSUPPORTED)
    return anna_err(err, errlen, ANNA_EINVAL,
                      "--gpu-memory-utilization needs a GPU device (this backend cannot report its memory)");
  if (rc) return anna_err(err, errlen, rc, "--gpu-memory-utilization: cannot read the device's memory");
  if (ks.n_blocks <= 0 || ks.pool_bytes <= 0)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "--gpu-memory-utilization: this model has no KV block pool");
  const double per_block = (double)ks.pool_bytes / (double)ks.n_blocks;
  const double avail = (double)free_b + (double)ks.pool_bytes - (1.0 - (double)frac) * (double)total_b;
  const int64_t blocks = avail > 0 ? (int64_t)(avail / per_block) : 0;
  const int64_t one_seq = ((int64_t)co->n_ctx + ks.block_len - 1) / ks.block_len;
  if (blocks < one_seq)
    return anna_err(err, errlen, ANNA_ENOMEM,
                      "--gpu-memory-utilization %.3g leaves %.1f MiB for the KV cache (%lld blocks of %d "
                      "positions), less than one sequence of --ctx-size %d needs (%lld blocks; device: %.1f of "
                      "%.1f GiB free with the model placed)",
                      (double)frac, avail > 0 ? avail / 1048576.0 : 0.0, (long long)blocks, ks.block_len, co->n_ctx,
                      (long long)one_seq, (double)(free_b + ks.pool_bytes) / 1073741824.0,
                      (double)total_b / 1073741824.0);
  if (blocks > INT32_MAX / 2)
    return anna_err(err, errlen, ANNA_ERANGE, "--gpu-memory-utilization: %lld KV blocks is too many",
                      (long long)blocks);
  co->kv_blocks = blocks;
  slog(SLOG_INFO, NULL,
       "--gpu-memory-utilization %.3g: KV pool of %lld blocks of %d positions (%.2f GiB; %.2f of %.2f GiB free with "
       "the model placed)",
       (double)frac, (long long)blocks, ks.block_len, (double)blocks * per_block / 1073741824.0,
       (double)(free_b + ks.pool_bytes) / 1073741824.0, (double)total_b / 1073741824.0);
  return 0;
}

int engine_create(engine **out, anna_model *m, const anna_text *text, const engine_options *o,
                  metrics *mx, char *err, size_t errlen) {
  *out = NULL;
  if (!text) return anna_err(err, errlen, ANNA_EINVAL, "the engine needs a tokenizer");
  engine *e = calloc(1, sizeof *e);
  if (!e) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  e->m = m;
  e->text = text;
  e->mx = mx;
  e->o = *o;
  if (e->o.n_seq < 1) e->o.n_seq = 1;
  if (e->o.n_ctx < 8) e->o.n_ctx = 8;
  /* Every running sequence must fit one decode token in a step, with room left for prefill. */
  if (e->o.n_batch < e->o.n_seq + 1) e->o.n_batch = e->o.n_seq + 1;
  if (e->o.max_batch_size < 1 || e->o.max_batch_size > e->o.n_seq) e->o.max_batch_size = e->o.n_seq;
  e->V = anna_model_vocab(m);
  pthread_mutex_init(&e->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&e->cv, &ca);
  pthread_cond_init(&e->idle_cv, &ca);
  pthread_cond_init(&e->embed_cv, &ca);
  pthread_condattr_destroy(&ca);
  const int S = e->o.n_seq, B = e->o.n_batch;
  if (e->o.prompt_cache_size < 0 || !e->o.prompt_cache) e->o.prompt_cache_size = 0;
  /* KV blocks of 64 positions (the GDN chunk), smaller when snapshots are asked for more
   * often; GDN state snapshots every prompt_cache_block tokens inside a prefill chunk. */
  int blk = e->o.kv_block_len > 0 ? e->o.kv_block_len : 64;
  while (e->o.prompt_cache_block > 0 && blk > 16 && e->o.prompt_cache_block % blk) blk /= 2;
  e->embed_seq = e->o.embeddings ? S + e->o.prompt_cache_size : -1;
  e->hidden = anna_model_hidden_size(m);
  anna_context_options co = {.n_seq = S + e->o.prompt_cache_size + (e->o.embeddings != 0),
                             .kv_block_len = blk,
                             .kv_blocks = e->o.kv_blocks,
                             .kv_cache_residual_len = e->o.kv_cache_residual_len,
                             .mm_cache_bytes = e->o.mm_cache_bytes,
                             .prefix_share = e->o.prompt_cache ? 0 : -1,
                             .prefix_snapshot_interval =
                                 e->o.prompt_cache ? e->o.prompt_cache_block : 0,
                             .n_ctx = e->o.n_ctx,
                             .n_batch = B,
                             .n_threads = e->o.n_threads,
                             .n_checkpoints = e->o.prompt_cache ? e->o.prompt_cache_checkpoints : 0,
                             .device = e->o.device,
                             .layer_split = e->o.layer_split,
                             .kv_cache_quantization = e->o.kv_cache_quantization,
                             .kv_cache_quant_bits = e->o.kv_cache_quant_bits,
                             .exact_matmul = e->o.exact_matmul,
                             .tuning = e->o.tuning,
                             .offload_mode = e->o.offload_mode,
                             .gpu_memory_limit = e->o.gpu_memory_limit,
                             .expert_cache_bytes = e->o.expert_cache_bytes,
                             .host_memory_limit = e->o.host_memory_limit,
                             .reserve_bytes = e->o.reserve_bytes,
                             .cached_experts_per_layer = e->o.cached_experts_per_layer,
                             .expert_swap_every = e->o.expert_swap_every};
  int rc = 0;
  if (e->o.gpu_memory_utilization > 0 && (rc = kv_blocks_for_memory(m, &co, e->o.gpu_memory_utilization, err, errlen)))
    goto fail;
  rc = anna_context_create(&e->ctx, m, &co, err, errlen);
  if (rc) goto fail;
  anna_context_kv_stats(e->ctx, &e->kvs);
  e->pool_blocks = e->kvs.n_blocks;
  e->block_len = e->kvs.block_len > 0 ? e->kvs.block_len : 1;
  for (int32_t v = 0; v < e->V; v++) e->n_eog += anna_text_is_eog(text, v) != 0;
  if (!(e->eog_ids = malloc(((size_t)e->n_eog + 1) * sizeof *e->eog_ids))) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    goto fail;
  }
  e->n_eog = 0;
  for (int32_t v = 0; v < e->V; v++)
    if (anna_text_is_eog(text, v)) e->eog_ids[e->n_eog++] = v;
  e->slots = calloc((size_t)S, sizeof *e->slots);
  e->b_tok = malloc((size_t)B * sizeof *e->b_tok);
  e->b_seq = malloc((size_t)B * sizeof *e->b_seq);
  e->b_pos = malloc((size_t)B * sizeof *e->b_pos);
  e->b_want = malloc((size_t)B);
  e->out_slot = malloc((size_t)S * sizeof *e->out_slot);
  e->logits = malloc((size_t)S * (size_t)e->V * sizeof(float));
  e->lp_row = malloc((size_t)e->V * sizeof(float));
  if (!e->slots || !e->b_tok || !e->b_seq || !e->b_pos || !e->b_want || !e->out_slot ||
      !e->logits || !e->lp_row) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory for %d sequence slots", S);
    goto fail;
  }
  e->row_tmp = malloc((size_t)e->V * sizeof(float));
  e->ex = calloc((size_t)e->o.prompt_cache_size + 1, sizeof *e->ex);
  e->c_idx = malloc((size_t)S * ANNA_TOPK_MAX * sizeof *e->c_idx);
  e->c_val = malloc((size_t)S * ANNA_TOPK_MAX * sizeof *e->c_val);
  e->c_st = malloc((size_t)S * 2 * sizeof *e->c_st);
  e->host_sampling = e->o.host_sampling;
  if (!e->row_tmp || !e->ex || !e->c_idx || !e->c_val || !e->c_st) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory for the prompt cache");
    goto fail;
  }
  for (int k = 0; k < e->o.prompt_cache_size; k++)
    if (!(e->ex[k].tok = malloc((size_t)e->o.n_ctx * sizeof(int32_t))) ||
        !(e->ex[k].logits = malloc((size_t)e->V * sizeof(float)))) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory for the prompt cache");
      goto fail;
    }
  for (int i = 0; i < S; i++) {
    if ((rc = anna_text_stream_new(&e->slots[i].ts, text, 0, err, errlen))) goto fail;
    if (!(e->slots[i].toks = malloc((size_t)e->o.n_ctx * sizeof(int32_t)))) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory for %d sequence slots", S);
      goto fail;
    }
  }
  if (e->o.spec_draft_max > 0) {
    if (e->o.spec_draft_max > ANNA_SPEC_MAX_DRAFT) e->o.spec_draft_max = ANNA_SPEC_MAX_DRAFT;
    const anna_ngram_params np = {.n_min = e->o.spec_ngram_min > 0 ? e->o.spec_ngram_min : 1,
                                  .n_max = e->o.spec_ngram_max > 0 ? e->o.spec_ngram_max : 4,
                                  .k_max = e->o.spec_draft_max};
    e->ng = calloc((size_t)S, sizeof *e->ng);
    e->spec_draft = malloc((size_t)S * ANNA_SPEC_MAX_DRAFT * sizeof *e->spec_draft);
    e->spec_out = malloc((size_t)S * (ANNA_SPEC_MAX_DRAFT + 1) * sizeof *e->spec_out);
    e->wins = malloc((size_t)S * sizeof *e->wins);
    e->win_slot = malloc((size_t)S * sizeof *e->win_slot);
    if (!e->ng || !e->spec_draft || !e->spec_out || !e->wins || !e->win_slot) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory for the speculative drafters");
      goto fail;
    }
    for (int i = 0; i < S; i++)
      if ((rc = anna_ngram_create(&e->ng[i], &np, (int32_t)e->o.n_ctx + 1, err, errlen))) goto fail;
  }
  const anna_sched_options so = {.n_slots = S,
                                 .n_batch = B,
                                 .max_batch_size = e->o.max_batch_size,
                                 .max_prefill_tokens = e->o.max_prefill_tokens,
                                 .max_decode_tokens = e->o.max_decode_tokens,
                                 .max_waiting = e->o.max_waiting,
                                 .max_queue_wait_ms = e->o.max_queue_wait_ms,
                                 .prefill_interval_steps = e->o.prefill_interval_steps,
                                 .batch_wait_ms = e->o.batch_wait_ms,
                                 .block_len = e->kvs.block_len,
                                 .chunk_align = e->o.deterministic ? ENGINE_DETERMINISTIC_CHUNK : 0};
  if (e->o.deterministic && (B - S + 1 < ENGINE_DETERMINISTIC_CHUNK ||
                             (e->o.max_prefill_tokens > 0 && e->o.max_prefill_tokens < ENGINE_DETERMINISTIC_CHUNK))) {
    rc = anna_err(err, errlen, ANNA_EINVAL,
                  "--deterministic cuts prompts into %d-token chunks: it needs --batch-size >= --parallel + %d (have "
                  "%d and %d) and a prefill budget of at least %d",
                  ENGINE_DETERMINISTIC_CHUNK, ENGINE_DETERMINISTIC_CHUNK - 1, B, S, ENGINE_DETERMINISTIC_CHUNK);
    goto fail;
  }
  if ((rc = anna_sched_create(&e->sc, &so, err, errlen))) goto fail;
  const char *keep[4] = {"<think>", "</think>", "<tool_call>", "</tool_call>"};
  for (int k = 0; k < 4; k++)
    e->keep_ids[k] = anna_text_token_id(text, keep[k]);
  if (pthread_create(&e->th, NULL, engine_main, e)) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "cannot start the engine thread");
    goto fail;
  }
  e->th_started = 1;
  *out = e;
  return 0;
fail:
  engine_free(e);
  return rc;
}

void engine_free(engine *e) {
  if (!e) return;
  if (e->th_started) {
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL);
  }
  for (int i = 0; e->slots && i < e->o.n_seq; i++) {
    anna_text_stream_free(e->slots[i].ts);
    anna_sampler_free(e->slots[i].smp);
    free(e->slots[i].txt);
    free(e->slots[i].toks);
  }
  anna_sched_free(e->sc);
  free(e->slots);
  for (int k = 0; e->ex && k < e->o.prompt_cache_size; k++) {
    free(e->ex[k].tok);
    free(e->ex[k].logits);
  }
  free(e->ex);
  free(e->row_tmp);
  free(e->c_idx);
  free(e->c_val);
  free(e->c_st);
  if (e->ng)
    for (int i = 0; i < e->o.n_seq; i++) anna_ngram_free(e->ng[i]);
  free(e->ng), free(e->spec_draft), free(e->spec_out), free(e->wins), free(e->win_slot);
  free(e->b_tok);
  free(e->b_seq);
  free(e->b_pos);
  free(e->b_want);
  free(e->out_slot);
  free(e->logits);
  free(e->lp_row);
  gbnf_masker_free(e->gmask);
  jsonschema_vocab_free(e->jvoc);
  free(e->eog_ids);
  anna_context_free(e->ctx);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  pthread_cond_destroy(&e->idle_cv);
  pthread_cond_destroy(&e->embed_cv);
  free(e);
}

int engine_submit(engine *e, gen_request *r, char *err, size_t errlen) {
  if (!r->choices) return anna_err(err, errlen, ANNA_EINVAL, "request not prepared");
  for (int p = 0; p < r->n_prompts; p++) {
    if (r->n_prompt[p] == 0) return anna_err(err, errlen, ANNA_EINVAL, "the prompt is empty");
    if (r->n_prompt[p] >= (size_t)e->o.n_ctx)
      return anna_err(err, errlen, ANNA_EINVAL,
                        "the prompt has %zu tokens; this server's context (--ctx-size) holds %d, "
                        "with room for at "
                        "least one generated token",
                        r->n_prompt[p], e->o.n_ctx);
    const int64_t need = e->pool_blocks > 0 ? ((int64_t)r->n_prompt[p] + e->block_len - 1) / e->block_len : 0;
    if (need > e->pool_blocks)
      return anna_err(err, errlen, ANNA_ENOMEM,
                        "the prompt has %zu tokens, %lld KV blocks of %d positions; the whole pool holds %lld "
                        "(--kv-blocks, --gpu-memory-utilization)",
                        r->n_prompt[p], (long long)need, e->block_len, (long long)e->pool_blocks);
    for (size_t k = 0; k < r->n_prompt[p]; k++)
      if (r->prompts[p][k] < 0 || r->prompts[p][k] >= e->V)
        return anna_err(err, errlen, ANNA_EINVAL,
                          "prompt token id %d is out of range (vocabulary %d)", r->prompts[p][k],
                          e->V);
  }
  wunit **units = calloc((size_t)r->n_choices, sizeof *units);
  anna_sched_seq_desc *d = calloc((size_t)r->n_choices, sizeof *d);
  int rc = units && d ? 0 : ANNA_ENOMEM;
  double now = engine_now();
  for (int i = 0; i < r->n_choices && !rc; i++) {
    wunit *u = calloc(1, sizeof *u);
    if (!u) {
      rc = ANNA_ENOMEM;
      break;
    }
    u->r = r;
    u->ci = i;
    u->t_queued = now;
    units[i] = u;
    d[i] = (anna_sched_seq_desc){ANNA_SCHED_KIND_TEXT, (int32_t)r->n_prompt[i / r->n], u};
  }
  if (rc) {
    for (int i = 0; units && i < r->n_choices; i++)
      free(units[i]);
    free(units);
    free(d);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  pthread_mutex_lock(&e->mu);
  uint64_t id0 = 0;
  if (e->draining || e->stop) {
    rc = anna_err(err, errlen, ANNA_ESTATE, "the server is shutting down");
  } else {
    const int n_waiting = anna_sched_n_waiting(e->sc);
    rc = anna_sched_submit(e->sc, d, r->n_choices, now * 1000.0, &id0, err, errlen);
    if (rc == ANNA_ERANGE)
      anna_err(err, errlen, ANNA_ERANGE,
                 "the server is busy: %d requests are waiting (--scheduler-max-waiting-requests)",
                 n_waiting);
  }
  free(d);
  if (rc) {
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < r->n_choices; i++)
      free(units[i]);
    free(units);
    return rc;
  }
  free(units); /* the scheduler holds them now */
  r->eng_units = r->n_choices;
  r->eng_sched_id = id0;
  r->eng_submitted = 1;
  gen_request_retain(r);
  /* Cancelled before it was queued: the scheduler drops it at the next step. */
  if (is_cancelled(r))
    for (int i = 0; i < r->n_choices; i++)
      anna_sched_cancel(e->sc, id0 + (uint64_t)i);
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
  return 0;
}

void engine_cancel(engine *e, gen_request *r) {
  if (__atomic_exchange_n(&r->cancelled, 1, __ATOMIC_ACQ_REL)) return;
  pthread_mutex_lock(&e->mu);
  /* Sequences already finished are no longer known to the scheduler: ANNA_ENOTFOUND. */
  if (r->eng_submitted)
    for (int i = 0; i < r->n_choices; i++)
      anna_sched_cancel(e->sc, r->eng_sched_id + (uint64_t)i);
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

void engine_drain(engine *e, double timeout_s) {
  double until = engine_now() + timeout_s;
  pthread_mutex_lock(&e->mu);
  e->draining = 1;
  pthread_cond_signal(&e->cv);
  while ((e->running > 0 || anna_sched_n_waiting(e->sc) > 0) && engine_now() < until)
    timed_wait(&e->idle_cv, &e->mu, 0.1);
  if (e->running > 0 || anna_sched_n_waiting(e->sc) > 0) {
    e->cancel_all = 1;
    pthread_cond_signal(&e->cv);
    while (e->running > 0 || anna_sched_n_waiting(e->sc) > 0)
      timed_wait(&e->idle_cv, &e->mu, 0.1);
  }
  pthread_mutex_unlock(&e->mu);
}

void engine_get_stats(engine *e, engine_stats *st) {
  pthread_mutex_lock(&e->mu);
  st->n_seq = e->o.n_seq;
  st->n_ctx = e->o.n_ctx;
  st->running = e->running;
  st->waiting = anna_sched_n_waiting(e->sc);
  st->kv_tokens = e->kv_tokens;
  st->kv_cached = e->kv_cached;
  st->kv_capacity = (int64_t)e->o.n_seq * e->o.n_ctx;
  st->kv = e->kvs;
  st->kv_seq_blocks = e->kv_seq_blocks;
  st->kv_exact_blocks = e->kv_exact_blocks;
  st->exact_entries = 0;
  for (int k = 0; k < e->o.prompt_cache_size; k++) st->exact_entries += e->ex[k].n > 0;
  st->draining = e->draining;
  st->preemptions = e->preemptions;
  st->spec = e->spec;
  st->vis = e->vis;
  pthread_mutex_unlock(&e->mu);
}

int engine_tuning(const engine *e, char *buf, size_t len) {
  return anna_context_tuning(e->ctx, buf, len);
}

int engine_stages(const engine *e, anna_stage_info *out, int cap) {
  const int n = anna_context_stage_count(e->ctx);
  for (int i = 0; i < n && i < cap; i++) anna_context_stage_info(e->ctx, i, &out[i], NULL, 0);
  return n;
}

const engine_options *engine_get_options(const engine *e) {
  return &e->o;
}
