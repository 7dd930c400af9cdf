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
#include <unistd.h>

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
  int spec_rec;    /* slot_sample's token was drawn by a sampled verify window, which recorded it */
  int32_t media_reused; /* a prompt with media: tokens the prefix pool gave (slot_media_prefill) */
  int wake;        /* its choice has news the connection has not been woken for (wake_flush) */
  int pre_masked;  /* slot_sample's pre-drawn token came from masked candidates: feed the grammar / JSON state */
} slot;

/* Exact prompt cache entry: a context sequence (beyond the n_seq slots) holding a whole
 * prompt's KV blocks (shared with whoever copies them) and recurrent state, and the logits
 * of its last token, so an identical prompt starts sampling at once. */
/* Speculative decoding: a step's verify-window rows at most (the host buffer of sampled
 * windows' logits rows), and the adaptive draft length's p_min (anna_spec_adapt: the longest
 * K whose K-th draft is still accepted with at least this probability). A drafted row costs a
 * fraction of a plain step (0.82 on 1 CPU thread with the default model, bench/notes/spec.md;
 * less on a GPU), so drafts a sequence rejects about as often as not are cut first. */
#define SPEC_MAX_ROWS 64
#define SPEC_ADAPT_P_MIN 0.3f

typedef struct exact_entry {
  int32_t *tok; /* [n_ctx] */
  int32_t n;    /* 0: empty */
  float *logits;
  uint64_t last_used;
} exact_entry;

/* --engine-profile: the sums over one log interval (engine_options.profile_interval_s). */
typedef struct eng_prof {
  double t0;                                    /* interval start */
  double ph[ENG_PH_COUNT], fwd[ENG_STEP_KINDS]; /* seconds */
  int64_t steps[ENG_STEP_KINDS], decode_rows, prefill_rows, calls, graphs, tokens, full_rows;
  double capture_s, update_s, gpu_s; /* CUDA graph host recording / updating, replay device time */
} eng_prof;

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
  /* JSON Schema masks by state (o.json_mask_cache_mib > 0; shared with the mask pool's
   * workers), the engine thread's scratch and bitset for masking through it */
  jschema_mcache *jcache;
  jschema_scratch *jsc;
  uint64_t *jbits;
  struct mask_pool *mp; /* mask workers (engine_options.mask_threads); NULL: masks inline */
  int32_t *eog_ids; /* end-of-generation tokens (min_tokens masks them) */
  int n_eog;
  /* Draws finished where the logits are (issues 29, 30): dev_tail / dev_mask, the context
   * offers anna_context_sample_tail / anna_context_mask_topk. c_mask [n_seq] per slot index:
   * the mask its row draws under this step (CMASK_*); eog_bits the min_tokens mask [words].
   * Per flagged row [n_seq]: c_bits the mask handed to anna_context_mask_topk, c_how what the
   * row's draw came to (CHOW_*), c_tok its token, c_tj its pending tail draw; the step's tail
   * draws tl / tl_row / tl_tok [n_seq] (one anna_context_sample_tail call). */
  int dev_tail, dev_mask;
  int8_t *c_mask, *c_how, *c_done;
  uint64_t *eog_bits, *zero_bits; /* [words]: the min_tokens mask; no mask (another temperature) */
  const uint64_t **c_bits, **c_gb; /* c_gb: one anna_context_mask_topk call's share of c_bits */
  float *c_temp;                   /* [n_seq] per flagged row: the temperature of its softmax sum (0: none) */
  int32_t *c_tok, *c_tj;
  anna_sample_tail *tl;
  int *tl_row;
  int32_t *tl_tok;
  int64_t pool_blocks; /* KV pool size (0: no block pool) and block length, fixed at creation */
  int block_len;
  /* speculative decoding (o.spec_draft_max > 0): per slot index (not per slot struct, which a
   * preemption parks and restores elsewhere) the n-gram drafter over prompt + generated ids,
   * its draft buffer [ANNA_SPEC_MAX_DRAFT] and the window's output [ANNA_SPEC_MAX_DRAFT + 1];
   * one window per slot at most */
  anna_ngram **ng; /* ENGINE_DRAFTER_NGRAM only */
  /* model drafters: the MTP head (borrows ctx) or a draft model (owned) and its drafter, and
   * per slot index whether the drafter holds what the slot's sequence holds (0: it catches
   * up at the slot's next window: the head restarts, the draft context is prefilled) */
  anna_mtp *mtp;
  anna_model *dmodel;
  anna_draft *dm;
  int8_t *spec_ready;
  int *mtp_pf; /* [n_seq] a step's prompt chunks fed through the MTP head (indexes of plan.prefill) */
  /* a step's MTP drafts, run together (anna_mtp_draft_batch): per drafting slot its sequence,
   * requested / drafted length, pending token, window index, and drafts [n * ANNA_SPEC_MAX_DRAFT] */
  int *mtp_bs, *mtp_bk, *mtp_bw;
  int32_t *mtp_bl, *mtp_bd;
  size_t *spec_fed; /* [n_seq] prompt positions the draft model holds while the slot prefills */
  int32_t *spec_draft, *spec_out;
  anna_spec_window *wins;
  int *win_slot;
  anna_spec_stats spec; /* as of the last step (under mu) */
  /* a step's sampled windows (anna_context_verify_sampled): their samplers [n_seq] and the
   * windows' logits rows [spec_rows * V] (spec_rows caps a step's window rows); per slot
   * index the adaptive draft length [n_seq] */
  anna_sampler **win_smp;
  float *spec_logits;
  int spec_rows;
  anna_spec_adapt *spec_k;
  anna_vision_stats vis; /* as of the last step (under mu) */
  /* engine_embed: jobs queued under mu, run by the engine thread on sequence embed_seq
   * (-1: embeddings off); embed_cv wakes their callers. */
  struct embed_job *embed_q;
  int embed_seq, hidden;
  pthread_cond_t embed_cv;
  /* Step profile (engine thread only): the current step's record, the time of the last phase
   * mark (ph_mark), the context's cumulative graph statistics as of the last step, and the
   * --engine-profile interval's sums. */
  metrics_step st;
  double ph_t;
  anna_step_stats gs;
  eng_prof prof;
  /* Per-token latency observations and generated tokens since the last tokens_flush: merged
   * into mx once per step (or when a choice ends), not locked per token. */
  metrics_histo p_ttft, p_itl;
  uint64_t p_tokens;
  /* engine_options.split_prefill (step_forward): the decode rows of the last step drawn
   * between its two calls, [n_seq]; n_split of them (0: the step made one call) */
  int32_t *split_tok;
  int n_split;
  /* Connection wake-ups (wake_flush) go to the notifier thread, which broadcasts: a woken
   * connection thread tends to run on the waker's core at once, so the engine thread would
   * otherwise stall behind its wakees every step. wk_q (retained requests, [wk_cap]) and the
   * flags under wk_mu; wk_mine is the notifier's own copy. Without the thread (it did not
   * start) or with the queue full, the engine broadcasts itself. */
  pthread_t wk_th;
  int wk_started, wk_stop, wk_waiting, wk_n, wk_cap;
  pthread_mutex_t wk_mu;
  pthread_cond_t wk_cv;
  gen_request **wk_q, **wk_mine;
};

/* The time since the last mark goes to phase ph (metrics.h, ENG_PH_*). A clock read (vDSO,
 * tens of ns): a handful per token, against a step of milliseconds. */
static void ph_mark(engine *e, int ph) {
  const double now = engine_now();
  e->st.ph[ph] += now - e->ph_t;
  e->ph_t = now;
}

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

/* The per-token observations since the last call, into the server's metrics. */
static void tokens_flush(engine *e) {
  if (e->p_ttft.n) metrics_histo_merge(e->mx, &e->mx->ttft, &e->p_ttft, NULL, NULL);
  if (e->p_itl.n || e->p_tokens) metrics_histo_merge(e->mx, &e->mx->itl, &e->p_itl, &e->mx->completion_tokens, &e->p_tokens);
}

/* Wakes the connections of the choices that got tokens or text since the last call: once per
 * step, after every sequence was sampled, rather than once per token and update. A woken
 * connection then finds the engine done with its request's mutex (no wake-then-block), and
 * its thread does not compete with the engine's sampling for the CPU. Broadcasting after the
 * unlock loses nothing: a waiter either saw the news under the mutex or is waiting now. */
static void wake_flush(engine *e) {
  pthread_mutex_lock(&e->wk_mu);
  for (int i = 0; i < e->o.n_seq; i++) {
    slot *s = &e->slots[i];
    if (!s->wake) continue;
    s->wake = 0;
    if (!s->r) continue;
    if (e->wk_started && e->wk_n < e->wk_cap) {
      gen_request_retain(s->r); /* the notifier releases it */
      e->wk_q[e->wk_n++] = s->r;
    } else {
      pthread_cond_broadcast(&s->r->cv);
    }
  }
  const int signal = e->wk_n > 0 && e->wk_waiting;
  pthread_mutex_unlock(&e->wk_mu);
  if (signal) pthread_cond_signal(&e->wk_cv);
  tokens_flush(e);
}

/* The notifier thread: broadcasts what wake_flush queued, until engine_free stops it (after
 * the engine thread, so nothing is queued afterwards; what is left is sent first). */
static void *notifier_main(void *arg) {
  engine *e = arg;
  pthread_mutex_lock(&e->wk_mu);
  for (;;) {
    while (e->wk_n == 0 && !e->wk_stop) {
      e->wk_waiting = 1;
      pthread_cond_wait(&e->wk_cv, &e->wk_mu);
      e->wk_waiting = 0;
    }
    if (e->wk_n == 0) break;
    const int n = e->wk_n;
    memcpy(e->wk_mine, e->wk_q, (size_t)n * sizeof *e->wk_q);
    e->wk_n = 0;
    pthread_mutex_unlock(&e->wk_mu);
    for (int k = 0; k < n; k++) {
      pthread_cond_broadcast(&e->wk_mine[k]->cv);
      gen_request_release(e->wk_mine[k]);
    }
    pthread_mutex_lock(&e->wk_mu);
  }
  pthread_mutex_unlock(&e->wk_mu);
  return NULL;
}

/* Moves text from the slot to the choice: everything up to the first stop string, minus a
 * tail that could still become a stop string. Returns 1 when a stop string was hit. */
static int slot_release(engine *e, slot *s, int final) {
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
  ph_mark(e, ENG_PH_DETOK);
  if (end > s->released) {
    pthread_mutex_lock(&r->mu);
    gen_choice *c = &r->choices[s->ci];
    if (txt_append(&c->text, &c->text_len, &c->text_cap, s->txt + s->released, end - s->released) ==
        0)
      s->released = end;
    pthread_mutex_unlock(&r->mu);
    s->wake = 1;
    ph_mark(e, ENG_PH_PUBLISH);
  }
  return hit;
}

const char *const engine_drafter_names[3] = {"ngram", "mtp", "draft"};

/* A model drafter forgets slot i's sequence (it ended, was preempted or restarts). */
static void spec_drop(engine *e, int i) {
  if (!e->spec_ready) return;
  e->spec_ready[i] = 0;
  e->spec_fed[i] = 0;
  if (e->mtp) anna_mtp_reset(e->mtp, i);
  if (e->dm) anna_draft_reset(e->dm, i);
}

static void slot_free(engine *e, int i, const char *reason, int code, const char *msg, int flush) {
  slot *s = &e->slots[i];
  gen_request *r = s->r;
  char piece[256];
  size_t plen = 0;
  if (s->ts) anna_text_stream_flush(s->ts, piece, sizeof piece, &plen, NULL, 0);
  if (flush) {
    if (plen) txt_append(&s->txt, &s->len, &s->cap, piece, plen);
    slot_release(e, s, 1);
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
  tokens_flush(e); /* counted before its connection can answer */
  s->wake = 0;     /* choice_finish wakes it */
  choice_finish(r, s->ci, reason, code, msg);
  if (!strcmp(reason, "cancelled"))
    metrics_add(e->mx, &e->mx->cancelled, 1);
  else
    metrics_observe(e->mx, &e->mx->e2e, (engine_now() - r->t_arrival) * 1000.0);
  /* Its blocks go back to the pool; the registered ones stay cached for the next prompt. */
  anna_context_seq_reset(e->ctx, i);
  spec_drop(e, i);
  sc_finish(e, i); /* a no-op for a dropped sequence: the scheduler freed its slot already */
  anna_sampler_free(s->smp);
  s->smp = NULL;
  s->r = NULL;
  free(s->u);
  s->u = NULL;
  s->len = s->released = 0;
  s->decoding = 0;
  unit_done(r);
  ph_mark(e, ENG_PH_FINISH);
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
  spec_drop(e, i);
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

/* The most positions of an n-token prompt a cached prefix may supply: all but the last token
 * (its logits start the reply), and all but the last prefix_min_tail tokens, so the part
 * computed is one chunk as long as a cold prefill's last chunk would be (engine_options). A
 * prompt no longer than the tail is computed whole, as it is cold. */
static int32_t reuse_limit(const engine *e, size_t n) {
  const int64_t tail = e->o.prefix_min_tail > 1 ? e->o.prefix_min_tail : 1;
  return (int64_t)n > tail ? (int32_t)((int64_t)n - tail) : 0;
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
    int32_t r = anna_context_prefix_attach(e->ctx, i, s->feed, reuse_limit(e, s->n_feed), ANNA_PREFIX_REGISTER);
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
    int32_t r = anna_context_prefix_attach(e->ctx, i, s->prompt, reuse_limit(e, s->n_prompt),
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
  if (!e->spec_draft) return;
  spec_drop(e, i);
  char err[128];
  const slot *s = &e->slots[i];
  if (e->ng) {
    anna_ngram_reset(e->ng[i]);
    if (anna_ngram_accept(e->ng[i], s->feed, (int32_t)s->n_feed, err, sizeof err)) anna_ngram_reset(e->ng[i]);
  }
  anna_spec_adapt_init(&e->spec_k[i], e->o.spec_draft_max, e->o.spec_fixed ? 0.0f : SPEC_ADAPT_P_MIN);
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
  if (e->jvoc && (e->jcache || e->o.json_mask_cache_mib <= 0)) return 0;
  if (!e->jvoc) {
    int rc = jsonschema_vocab_from_text(&e->jvoc, e->text);
    if (rc) return rc;
    jsonschema_vocab_tables(e->jvoc, &e->tok_bytes, &e->tok_off, &e->tok_cls);
  }
  if (e->o.json_mask_cache_mib > 0) {
    if (!e->jsc && jsonschema_scratch_new(&e->jsc, e->jvoc)) return ANNA_ENOMEM;
    if (!e->jbits && !(e->jbits = malloc(((size_t)e->V + 63) / 64 * sizeof *e->jbits))) return ANNA_ENOMEM;
    jschema_mcache *jc = NULL;
    if (jsonschema_mcache_new(&jc, e->jvoc, (size_t)e->o.json_mask_cache_mib << 20)) return ANNA_ENOMEM;
    __atomic_store_n(&e->jcache, jc, __ATOMIC_RELEASE); /* engine_get_stats reads it */
  }
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

/* A schema slot's mask through the cache: bits := the tokens json_mask rejects (the same set
 * as the uncached path below), sc the caller's scratch. Returns what json_mask returns. */
static int json_schema_bits(const engine *e, const slot *s, uint64_t *bits, jschema_scratch *sc) {
  int more, allowed = 0, done = slot_json_done(s, &more);
  const size_t words = ((size_t)e->V + 63) / 64;
  if (!done || more) {
    allowed = jsonschema_mask_bits_cached(e->jvoc, e->jcache, sc, &s->js, bits);
  } else {
    memset(bits, 0xff, words * sizeof *bits);
    if (e->V & 63) bits[words - 1] = ((uint64_t)1 << (e->V & 63)) - 1;
  }
  for (int k = 0; k < e->n_eog && k < 8 && done; k++) { /* json_mask's kept end tokens */
    bits[e->eog_ids[k] >> 6] &= ~((uint64_t)1 << (e->eog_ids[k] & 63));
    allowed++;
  }
  return allowed;
}

/* Masks every token that would break the JSON prefix (-inf logit); end of generation only
 * once the object is complete. Returns the number of tokens left. sc / bits: a worker's
 * scratch and a bitset of V bits to use, or NULL: the engine thread's. */
static int json_mask(const engine *e, const slot *s, float *row, jschema_scratch *sc, uint64_t *bits) {
  int allowed = 0, more;
  if (s->r->schema && e->jcache) {
    allowed = json_schema_bits(e, s, bits ? bits : e->jbits, sc ? sc : e->jsc);
    jsonschema_bits_apply(bits ? bits : e->jbits, e->V, row);
    return allowed;
  }
  if (s->r->schema) {
    /* Complete but extendable (a top-level number): end of generation or more digits. */
    int done = slot_json_done(s, &more);
    float keep[8];
    int n_keep = e->n_eog < 8 ? e->n_eog : 8;
    for (int k = 0; k < n_keep; k++)
      keep[k] = row[e->eog_ids[k]];
    if (!done || more)
      allowed = sc ? jsonschema_vocab_mask_with(e->jvoc, sc, &s->js, row)
                   : jsonschema_vocab_mask(e->jvoc, &s->js, row);
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
static int grammar_mask(const engine *e, const slot *s, float *row, gbnf_masker *gm) {
  float keep[8];
  int n_keep = e->n_eog < 8 ? e->n_eog : 8, done = gbnf_done(&s->gs), allowed = 0;
  for (int k = 0; k < n_keep; k++)
    keep[k] = row[e->eog_ids[k]];
  if (gbnf_more(&s->gs)) {
    allowed = gbnf_mask(gm, &s->gs, row);
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

/* ---- mask workers (issue 30) ----
 * A sequence's mask for this step depends only on what it sampled before it, so the masks of
 * the step's constrained rows are computed while the forward pass runs (mask_pool_start
 * before anna_context_decode, mask_pool_apply after it), each worker with its own scratch
 * (a jsonschema scratch, a gbnf masker with its own cache) over the engine's read-only token
 * tables. A mask is kept as a bitset of rejected tokens per slot index, tagged with the
 * request, choice and n_gen it was computed for: slot_sample uses it only while they still
 * hold (a speculative window's tokens, a preemption, a slot that started since all fall back
 * to the inline mask). The engine thread is the only one that changes slot states, and it
 * does not while jobs run (it waits in the forward pass or joins). */
typedef struct mask_pool {
  engine *e;
  int n; /* worker threads */
  pthread_t *th;
  int n_created, n_started;
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  int phase; /* 0: compute the masks of job[]; 1: apply them to rows[] */
  int n_jobs, next, n_done, stop;
  int *job;     /* [n_seq] slot indices */
  float **rows; /* [n_seq] phase 1: the logits row of job k */
  /* per worker, built on the first constrained step: scratch row [V], schema scratch, masker */
  float **wrow;
  jschema_scratch **jsc;
  gbnf_masker **gm;
  /* per slot index: the rejected tokens [words] and for whom they hold */
  size_t words;
  uint64_t *bits;
  const gen_request **m_req;
  int *m_ci, *m_gen, *m_ok, *m_applied, *m_allow_g, *m_allow_j;
} mask_pool;

/* Whether slot s samples a masked row at its next position (slot_sample's branches). */
static int slot_mask_wanted(const slot *s) {
  const gen_request *r = s->r;
  int more = 0;
  if (!r || (!r->grammar && !r->json_mode) || r->forced || (size_t)s->n_gen < r->n_prefix) return 0;
  if (r->json_mode && r->n_suffix && slot_json_done(s, &more) && !more) return 0;
  return 1;
}

static void mask_job_compute(mask_pool *p, int w, int i) {
  const engine *e = p->e;
  const slot *s = &e->slots[i];
  float *row = p->wrow[w];
  uint64_t *b = p->bits + (size_t)i * p->words;
  if (!s->r->grammar && s->r->json_mode && s->r->schema && e->jcache) {
    /* the bitset straight from the cache: no zero row to fill and read back */
    p->m_allow_g[i] = 1;
    p->m_allow_j[i] = json_schema_bits(e, s, b, p->jsc[w]);
  } else {
    memset(row, 0, (size_t)e->V * sizeof *row);
    /* the serial path's order: grammar, then JSON; a zero row keeps what either rejects */
    p->m_allow_g[i] = s->r->grammar ? grammar_mask(e, s, row, p->gm[w]) : 1;
    p->m_allow_j[i] = s->r->json_mode ? json_mask(e, s, row, p->jsc[w], b) : 1;
    jsonschema_mask_bits(row, e->V, b);
  }
  p->m_req[i] = s->r;
  p->m_ci[i] = s->ci;
  p->m_gen[i] = s->n_gen;
  p->m_ok[i] = 1;
}

/* -inf where slot i's bitset rejects. */
static void mask_bits_apply(const mask_pool *p, int i, float *row, int V) {
  jsonschema_bits_apply(p->bits + (size_t)i * p->words, V, row);
}

static void mask_job_run(mask_pool *p, int w, int phase, int k) {
  const int i = p->job[k];
  if (phase == 0) {
    mask_job_compute(p, w, i);
  } else {
    mask_bits_apply(p, i, p->rows[k], p->e->V);
    p->m_applied[i] = 1;
  }
}

static void *mask_worker(void *arg) {
  mask_pool *p = arg;
  pthread_mutex_lock(&p->mu);
  const int w = p->n_started++;
  for (;;) {
    while (!p->stop && p->next >= p->n_jobs)
      pthread_cond_wait(&p->go, &p->mu);
    if (p->stop) break;
    const int k = p->next++, phase = p->phase;
    pthread_mutex_unlock(&p->mu);
    mask_job_run(p, w, phase, k);
    pthread_mutex_lock(&p->mu);
    if (++p->n_done == p->n_jobs) pthread_cond_signal(&p->done);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static void mask_pool_free(mask_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
  for (int w = 0; w < p->n_created; w++)
    pthread_join(p->th[w], NULL);
  for (int w = 0; w < p->n; w++) {
    if (p->wrow) free(p->wrow[w]);
    if (p->jsc) jsonschema_scratch_free(p->jsc[w]);
    if (p->gm) gbnf_masker_free(p->gm[w]);
  }
  free(p->th), free(p->wrow), free(p->jsc), free(p->gm), free(p->job), free(p->rows), free(p->bits);
  free(p->m_req), free(p->m_ci), free(p->m_gen), free(p->m_ok), free(p->m_applied), free(p->m_allow_g);
  free(p->m_allow_j);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->go);
  pthread_cond_destroy(&p->done);
  free(p);
}

/* n threads; the per-worker scratch and the bitsets wait for the first constrained step. */
static int mask_pool_new(mask_pool **out, engine *e, int n) {
  *out = NULL;
  const int S = e->o.n_seq;
  mask_pool *p = calloc(1, sizeof *p);
  if (!p) return ANNA_ENOMEM;
  p->e = e;
  p->n = n;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->go, NULL);
  pthread_cond_init(&p->done, NULL);
  p->th = calloc((size_t)n, sizeof *p->th);
  p->wrow = calloc((size_t)n, sizeof *p->wrow);
  p->jsc = calloc((size_t)n, sizeof *p->jsc);
  p->gm = calloc((size_t)n, sizeof *p->gm);
  p->job = malloc((size_t)S * sizeof *p->job);
  p->rows = malloc((size_t)S * sizeof *p->rows);
  p->m_req = calloc((size_t)S, sizeof *p->m_req);
  p->m_ci = calloc((size_t)S, sizeof *p->m_ci);
  p->m_gen = calloc((size_t)S, sizeof *p->m_gen);
  p->m_ok = calloc((size_t)S, sizeof *p->m_ok);
  p->m_applied = calloc((size_t)S, sizeof *p->m_applied);
  p->m_allow_g = calloc((size_t)S, sizeof *p->m_allow_g);
  p->m_allow_j = calloc((size_t)S, sizeof *p->m_allow_j);
  if (!p->th || !p->wrow || !p->jsc || !p->gm || !p->job || !p->rows || !p->m_req || !p->m_ci || !p->m_gen ||
      !p->m_ok || !p->m_applied || !p->m_allow_g || !p->m_allow_j) {
    mask_pool_free(p);
    return ANNA_ENOMEM;
  }
  for (int w = 0; w < n; w++, p->n_created++)
    if (pthread_create(&p->th[w], NULL, mask_worker, p)) {
      mask_pool_free(p);
      return ANNA_ENOMEM;
    }
  *out = p;
  return 0;
}

/* The scratch the step's jobs need (0), or nonzero: leave them to the inline path. */
static int mask_pool_ready(mask_pool *p, int schema, int grammar) {
  const engine *e = p->e;
  if (!p->bits) {
    p->words = ((size_t)e->V + 63) / 64;
    p->bits = malloc((size_t)e->o.n_seq * p->words * sizeof *p->bits);
    if (!p->bits) return ANNA_ENOMEM;
  }
  for (int w = 0; w < p->n; w++) {
    if (!p->wrow[w] && !(p->wrow[w] = malloc((size_t)e->V * sizeof(float)))) return ANNA_ENOMEM;
    if (schema && !p->jsc[w] && jsonschema_scratch_new(&p->jsc[w], e->jvoc)) return ANNA_ENOMEM;
    if (grammar && !p->gm[w] && gbnf_masker_new(&p->gm[w], e->jvoc)) return ANNA_ENOMEM;
  }
  return 0;
}

/* Before the forward pass: compute the masks of the step's sampled rows out_slot[0, nflag)
 * that take one, on the workers. mask_pool_apply joins them. */
static void mask_pool_start(engine *e, int nflag) {
  mask_pool *p = e->mp;
  int n = 0, schema = 0, grammar = 0;
  for (int i = 0; i < e->o.n_seq; i++)
    p->m_ok[i] = p->m_applied[i] = 0;
  for (int k = 0; k < nflag; k++) {
    const slot *s = &e->slots[e->out_slot[k]];
    if (!slot_mask_wanted(s)) continue;
    /* the tables the inline path would build on its first sample */
    if (json_tables(e) || (s->r->grammar && !e->gmask && gbnf_masker_new(&e->gmask, e->jvoc))) return;
    schema |= s->r->json_mode && s->r->schema != NULL;
    grammar |= s->r->grammar != NULL;
    p->job[n++] = e->out_slot[k];
  }
  if (!n || mask_pool_ready(p, schema, grammar)) return;
  pthread_mutex_lock(&p->mu);
  p->phase = 0;
  p->n_done = p->next = 0;
  p->n_jobs = n;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
}

/* Waits for the current jobs (the engine thread takes its share of an apply phase). */
static void mask_pool_join(mask_pool *p, int help) {
  pthread_mutex_lock(&p->mu);
  while (help && p->next < p->n_jobs) {
    const int k = p->next++;
    pthread_mutex_unlock(&p->mu);
    mask_job_run(p, p->n, 1, k); /* the apply phase needs no worker scratch */
    pthread_mutex_lock(&p->mu);
    if (++p->n_done == p->n_jobs) pthread_cond_signal(&p->done);
  }
  while (p->n_done < p->n_jobs)
    pthread_cond_wait(&p->done, &p->mu);
  p->n_jobs = p->next = p->n_done = 0;
  pthread_mutex_unlock(&p->mu);
}

/* After the forward pass: joins the masks and applies them to the rows slot_sample will read
 * (logits row k of out_slot[k]; not a row the exact cache stores first or whose logprobs are
 * reported, which must be read as the model gave it: slot_sample applies those). */
static void mask_pool_apply(engine *e, int nflag, int have_rows) {
  mask_pool *p = e->mp;
  mask_pool_join(p, 0);
  if (!have_rows) return;
  int n = 0;
  for (int k = 0; k < nflag; k++) {
    const int i = e->out_slot[k];
    const slot *s = &e->slots[i];
    if (!p->m_ok[i] || (s->exact_store && !s->decoding) || s->r->logprobs) continue;
    p->job[n] = i;
    p->rows[n++] = e->logits + (size_t)k * (size_t)e->V;
  }
  if (!n) return;
  pthread_mutex_lock(&p->mu);
  p->phase = 1;
  p->n_done = p->next = 0;
  p->n_jobs = n;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
  mask_pool_join(p, 1);
}

/* slot_sample's mask step: from the pool when it holds slot i's mask for this position, else
 * computed here. Returns 0 to go on, 1 when the grammar / JSON leaves no token (stop). */
static int slot_mask(engine *e, int i, float *row) {
  slot *s = &e->slots[i];
  const gen_request *r = s->r;
  mask_pool *p = e->mp;
  if (p && p->m_ok[i] && p->m_req[i] == r && p->m_ci[i] == s->ci && p->m_gen[i] == s->n_gen) {
    p->m_ok[i] = 0;
    if (!p->m_applied[i]) mask_bits_apply(p, i, row, e->V);
    return p->m_allow_g[i] == 0 || p->m_allow_j[i] == 0;
  }
  if (r->grammar && grammar_mask(e, s, row, e->gmask) == 0) return 1;
  if (r->json_mode && json_mask(e, s, row, NULL, NULL) == 0) return 1;
  return 0;
}

/* The mask a row draws under (engine.c_mask): none, the end-of-generation ids (min_tokens
 * with a temperature: the softmax sum must be the masked row's), or the mask pool's bitset
 * (JSON mode, JSON schema, grammar). */
enum { CMASK_NONE, CMASK_EOG, CMASK_POOL };
/* What a flagged row's draw came to (engine.c_how). */
enum { CHOW_DRAWN, CHOW_FULL, CHOW_TAIL, CHOW_STOP };

/* Whether slot i's next row can be sampled from the backend's candidates (see
 * anna_context_decode_topk): no logprobs, forced or prefix token, or exact-cache store (those
 * read the full row); *k and *temp as anna_sampler_candidates_(tail_)k, *mask the mask its
 * candidates need (CMASK_*: applied where the logits are, anna_context_mask_topk). split: the
 * step makes two forward calls (step_forward), whose masks would have to be joined between
 * them: masked rows take the full row then. */
static int slot_cand_ok(const engine *e, int i, int split, int *k, float *temp, int *mask) {
  const slot *s = &e->slots[i];
  const gen_request *r = s->r;
  *mask = CMASK_NONE;
  if (!r || r->logprobs || r->forced || (size_t)s->n_gen < r->n_prefix) return 0;
  if (s->exact_store && !s->decoding) return 0;
  if (r->json_mode || r->grammar) {
    /* the pool computes the mask during the forward pass; a row whose mask is computed inline
     * (no pool, a forced suffix) reads the full row */
    if (!e->dev_mask || split || !e->mp || !slot_mask_wanted(s)) return 0;
    *mask = CMASK_POOL;
  }
  int kk = e->dev_tail ? anna_sampler_candidates_tail_k(s->smp, temp) : anna_sampler_candidates_k(s->smp, temp);
  if (kk <= 0) return 0;
  /* min_tokens masks the end-of-generation tokens (not in JSON / grammar rows: slot_sample).
   * Without a softmax sum (greedy, top-k) n_eog more candidates do: the masked row's best kk
   * are the candidates without them (slot_draw). With one, the row is masked where it is.
   * (Benchmarks send min_tokens = max_tokens: without this every row of their steps left the
   * device.) */
  if (s->n_gen < r->min_tokens && *mask == CMASK_NONE) {
    if (*temp > 0) {
      if (!e->dev_mask || split) return 0;
      *mask = CMASK_EOG;
    } else {
      if (kk + e->n_eog > ANNA_TOPK_MAX) return 0;
      kk += e->n_eog;
    }
  }
  *k = kk;
  return 1;
}

/* Slot i's draw from its row's candidates (flagged row `row` of the last call): 0 with the
 * token in *t; 1 when the full row is needed; 2 when the draw waits for the tail: it is
 * e->tl[*nt] (then ++*nt), finished by tails_resolve. The end-of-generation tokens are dropped
 * from unmasked candidates while min_tokens holds (slot_cand_ok asked for that many more). */
static int slot_draw(engine *e, int i, int row, const int32_t *idx, const float *val, int kc, const double *st,
                     int32_t *t, int *nt) {
  slot *s = &e->slots[i];
  int32_t fi[ANNA_TOPK_MAX];
  float fv[ANNA_TOPK_MAX];
  if (s->n_gen < s->r->min_tokens && e->c_mask[i] == CMASK_NONE) {
    int n = 0;
    for (int j = 0; j < kc && j < ANNA_TOPK_MAX; j++)
      if (!anna_text_is_eog(e->text, idx[j])) fi[n] = idx[j], fv[n++] = val[j];
    idx = fi, val = fv, kc = n;
  }
  if (!e->dev_tail) return anna_sampler_sample_candidates(s->smp, idx, val, kc, st, t);
  const int rc = anna_sampler_sample_candidates_tail(s->smp, idx, val, kc, st, &e->tl[*nt], t);
  if (rc == 2) e->tl_row[(*nt)++] = row;
  return rc;
}

/* The step's pending tail draws (slot_draw returned 2) in one call: their tokens to e->tl_tok. */
static int tails_resolve(engine *e, int nt, char *err, size_t errlen) {
  return nt > 0 ? anna_context_sample_tail(e->ctx, e->tl_row, e->tl, nt, e->tl_tok, err, errlen) : 0;
}

/* The pool's mask for slot i's current position, if it holds one; *stop: it leaves no token.
 * (Once anna_context_mask_topk has applied it, m_applied tells slot_mask that a full row
 * fetched afterwards is masked already.) */
static const uint64_t *pool_mask_get(const engine *e, int i, int *stop) {
  const mask_pool *p = e->mp;
  const slot *s = &e->slots[i];
  *stop = 0;
  if (!p || !p->bits || !p->m_ok[i] || p->m_req[i] != s->r || p->m_ci[i] != s->ci || p->m_gen[i] != s->n_gen)
    return NULL;
  *stop = p->m_allow_g[i] == 0 || p->m_allow_j[i] == 0;
  return p->bits + (size_t)i * p->words;
}

/* After a grammar / JSON row's draw: the token advances the row's grammar / JSON state. */
static void slot_feed(engine *e, slot *s, int32_t t) {
  const gen_request *r = s->r;
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
    if (s->pre_masked) slot_feed(e, s, t); /* drawn from masked candidates (grammar / JSON) */
    s->pre_masked = 0;
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
    if (r->grammar && (json_tables(e) || (!e->gmask && gbnf_masker_new(&e->gmask, e->jvoc)))) {
      slot_free(e, i, "error", ANNA_ENOMEM, "out of memory for the grammar token tables", 0);
      return;
    }
    if (r->json_mode && json_tables(e)) {
      slot_free(e, i, "error", ANNA_ENOMEM, "out of memory for the JSON token tables", 0);
      return;
    }
    if ((r->grammar || r->json_mode) && slot_mask(e, i, row)) {
      slot_free(e, i, "stop", 0, NULL, 1);
      return;
    }
    /* min_tokens (vLLM): no end of generation yet. JSON mode already keeps special tokens out
     * until the object is complete, and then allows nothing else: it wins. */
    if (s->n_gen < r->min_tokens && !r->json_mode && !r->grammar)
      for (int k = 0; k < e->n_eog; k++)
        row[e->eog_ids[k]] = -INFINITY;
    t = anna_sampler_sample(s->smp, row);
    slot_feed(e, s, t);
  }
  s->forced_ended = forced_end;
  if (!forced_end) {
    s->toks[s->n_prompt + idx] = t; /* idx < max_gen <= n_ctx - n_prompt */
    if (!s->spec_rec) anna_sampler_accept(s->smp, t);
    if (e->ng && anna_ngram_accept(e->ng[i], &t, 1, NULL, 0)) anna_ngram_reset(e->ng[i]);
    if (want_lp) token_logprobs(e->lp_row, e->V, t, r->top_logprobs, &g);
  }
  s->n_gen++;
  e->prof.tokens++;
  ph_mark(e, ENG_PH_SAMPLE);
  double now = e->ph_t;
  if (s->n_gen == 1)
    metrics_histo_note(&e->p_ttft, (now - r->t_arrival) * 1000.0);
  else
    metrics_histo_note(&e->p_itl, (now - s->t_last) * 1000.0);
  s->t_last = now;
  e->p_tokens++;
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
  pthread_mutex_unlock(&r->mu);
  s->wake = 1;
  ph_mark(e, ENG_PH_PUBLISH);
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
  if (slot_release(e, s, 0)) {
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
  ph_mark(e, ENG_PH_SCHED);
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

/* How many tokens slot i may draft this step (-1: decode it plainly): speculation on for the
 * request (its "speculative", else the server's default), nothing that needs the full row
 * outside the sampler (logprobs, JSON, forced ids, min_tokens), no images (their positions
 * carry a rotary delta), room before max_gen and the context, and no KV block beyond the one
 * plain step's (the plan counted only those). Sampled requests and penalties take windows
 * too (anna_context_verify_sampled); the length is the slot's adaptive K. */
static int spec_room(engine *e, int i) {
  const slot *s = &e->slots[i];
  const gen_request *r = s->r;
  if (!e->spec_draft || !r || !s->decoding || r->logprobs || r->json_mode || r->grammar || r->forced ||
      r->n_media ||
      (size_t)s->n_gen < r->n_prefix || s->n_gen < r->min_tokens)
    return -1;
  if (r->speculative != GEN_SPEC_ON) return -1; /* resolved at engine_submit */
  int k = anna_spec_adapt_next(&e->spec_k[i]);
  const int64_t len = anna_context_seq_len(e->ctx, i);
  if (k > s->max_gen - s->n_gen - 1) k = s->max_gen - s->n_gen - 1;
  if (k > e->o.n_ctx - 1 - len) k = (int)(e->o.n_ctx - 1 - len);
  while (k > 0 && anna_context_seq_blocks_needed(e->ctx, i, k + 1) > anna_context_seq_blocks_needed(e->ctx, i, 1)) k--;
  return k > 0 ? k : 0;
}

/* Slot i's draft for this step given its room (spec_room, capped by the step's window rows):
 * the number of drafted tokens for a window, or -1 for a plain step. The n-gram drafter
 * windows only what it drafted. A model drafter windows every step it may (k = 0: the
 * pending token alone), so it sees every position of the sequence: the MTP head takes the
 * window's hidden rows (anna_mtp_verify_batch), the draft model the accepted tokens
 * (anna_draft_commit). A drafter that is not in step first catches up: the head restarts
 * with a k = 0 window (spec_verify marks it ready), the draft context is prefilled with what
 * the slot's sequence holds. A drafter's failure costs its drafts, never the request: the
 * slot decodes plainly and the drafter catches up later. */
/* Slot i's prompt goes through the MTP head (anna_mtp_feed) rather than the step's batch: the
 * request may speculate with it later (the conditions of spec_room that hold for the whole
 * request). */
static int spec_follows(const engine *e, int i) {
  const gen_request *r = e->slots[i].r;
  return r && r->speculative == GEN_SPEC_ON && !r->logprobs && !r->json_mode && !r->grammar && !r->forced &&
         !r->n_media;
}

static int mtp_follows(const engine *e, int i) {
  return e->mtp && spec_follows(e, i);
}

/* The draft model takes slot i's tokens [spec_fed, upto), at most budget of them this step:
 * 1 when it then holds upto tokens, 0 when it still lags, -1 when it failed (dropped: it
 * starts over). Catching up a cached prefix or a prompt the exact cache answered is spread
 * over steps (the slot decodes plainly meanwhile), so it never stalls the engine for long. */
#define SPEC_DRAFT_CATCHUP 256
static int draft_catch_up(engine *e, int i, size_t upto, size_t budget) {
  const slot *s = &e->slots[i];
  size_t from = e->spec_fed[i];
  if (from > upto) from = 0; /* cannot happen: start over rather than trust it */
  const size_t n = upto - from < budget ? upto - from : budget;
  if (n) {
    char err[256];
    /* from 0 the draft sequence is emptied first (prefill) */
    const int rc = from ? anna_draft_feed(e->dm, i, s->toks + from, (int32_t)n, err, sizeof err)
                        : anna_draft_prefill(e->dm, i, s->toks, (int32_t)n, err, sizeof err);
    if (rc) {
      slog(SLOG_WARN, NULL, "draft model prefill failed (slot %d starts over): %s", i, err);
      spec_drop(e, i);
      return -1;
    }
    e->spec_fed[i] = from + n;
  }
  return e->spec_fed[i] == upto;
}

/* The draft model takes slot i's prompt chunk [pos, pos + n) in the step that runs it, so its
 * prefill is spread as the target's is (a prefix the target reused from its cache within the
 * catch-up budget); the last chunk leaves it in step when it has caught up. */
static void draft_prompt_chunk(engine *e, int i, size_t pos, size_t n) {
  if (!e->dm || !e->slots[i].r || !spec_follows(e, i)) return;
  if (draft_catch_up(e, i, pos + n, n + SPEC_DRAFT_CATCHUP) == 1 && pos + n == e->slots[i].n_feed)
    e->spec_ready[i] = 1;
}

/* After a step's tokens went out (so the draft model never delays them): the draft model
 * takes the step's prompt chunks of speculating slots, and decoding slots it lags behind (a
 * prompt the exact cache answered, a plain step) catch up a piece; spec_draft_slot finds them
 * in step at the next window. */
static void spec_draft_follow(engine *e, const anna_sched_plan *p) {
  for (int k = 0; k < p->n_prefill; k++)
    draft_prompt_chunk(e, p->prefill[k].slot, (size_t)p->prefill[k].pos, (size_t)p->prefill[k].n);
  for (int k = 0; k < p->n_decode; k++) {
    const int i = p->decode[k].slot;
    if (!e->slots[i].r || !e->slots[i].decoding || e->spec_ready[i] || !spec_follows(e, i)) continue;
    const int32_t n = anna_context_seq_len(e->ctx, i);
    if (n > 0) draft_catch_up(e, i, (size_t)n, SPEC_DRAFT_CATCHUP);
  }
}

static int spec_draft_slot(engine *e, int i, int room) {
  slot *s = &e->slots[i];
  int32_t *out = e->spec_draft + (size_t)i * ANNA_SPEC_MAX_DRAFT;
  char err[256];
  int kd;
  switch (e->o.spec_drafter) {
  case ENGINE_DRAFTER_MTP:
    if (room < 0) return -1;
    if (!e->spec_ready[i]) {
      anna_mtp_reset(e->mtp, i);
      return 0;
    }
    return room; /* drafted with the step's other MTP slots (spec_mtp_drafts) */
  case ENGINE_DRAFTER_DRAFT:
    if (room < 0) return -1;
    if (!e->spec_ready[i]) { /* behind: spec_draft_follow catches up after the step */
      if (e->spec_fed[i] != (size_t)anna_context_seq_len(e->ctx, i)) return -1;
      e->spec_ready[i] = 1;
    }
    if (room == 0) return 0;
    if ((kd = anna_draft_draft(e->dm, i, s->next_tok, out, room, err, sizeof err)) >= 0) return kd;
    slog(SLOG_WARN, NULL, "draft model draft failed (slot %d decodes plainly): %s", i, err);
    spec_drop(e, i);
    return -1;
  default:
    return room > 0 ? anna_ngram_draft(e->ng[i], out, room) : -1;
  }
}

/* The step's MTP windows with room get their drafts from one anna_mtp_draft_batch (each chain
 * step one head run over every drafting slot). On failure those windows verify no draft: the
 * head restarts from them (spec_verify marks it in step again). */
static void spec_mtp_drafts(engine *e, int n) {
  if (n == 0) return;
  char err[256];
  const int rc = anna_mtp_draft_batch(e->mtp, n, e->mtp_bs, e->mtp_bl, e->mtp_bk, e->mtp_bd, err, sizeof err);
  if (rc) slog(SLOG_WARN, NULL, "MTP draft failed (%d slots verify without drafts): %s", n, err);
  for (int j = 0; j < n; j++) {
    anna_spec_window *w = &e->wins[e->mtp_bw[j]];
    w->draft = e->mtp_bd + (size_t)j * ANNA_SPEC_MAX_DRAFT;
    w->k = rc ? 0 : e->mtp_bk[j];
    if (rc) spec_drop(e, e->mtp_bs[j]);
  }
}

/* The step's verify windows, one forward pass of their own: greedy ones take the argmax
 * (anna_context_verify); when any window's request samples (temperature, penalties) they all
 * draw with their samplers over full logits rows (a greedy sampler draws the argmax), which
 * record the tokens. Counts go to each choice's usage and to the metrics. 0 or the failing
 * code (the windows are then finished by the caller). */
static int spec_verify(engine *e, int nw, int *sampled, char *err, size_t errlen) {
  *sampled = 0;
  for (int w = 0; w < nw; w++) {
    const anna_sampler_params *sp = &e->slots[e->win_slot[w]].r->sp;
    *sampled |= sp->temperature > 0 || sp->repetition_penalty != 1.0f || sp->presence_penalty != 0.0f ||
                sp->frequency_penalty != 0.0f;
    e->win_smp[w] = e->slots[e->win_slot[w]].smp;
  }
  const int rc =
      e->mtp ? anna_mtp_verify_batch(e->mtp, e->wins, nw, *sampled ? e->win_smp : NULL, e->spec_logits, err, errlen)
      : *sampled ? anna_context_verify_sampled(e->ctx, e->wins, e->win_smp, nw, e->spec_logits, err, errlen)
                 : anna_context_verify(e->ctx, e->wins, nw, err, errlen);
  if (rc) return rc;
  uint64_t drafted = 0, accepted = 0;
  for (int w = 0; w < nw; w++) {
    const int i = e->win_slot[w], k = e->wins[w].k, a = e->wins[w].n_out - 1;
    if (e->mtp) e->spec_ready[i] = 1; /* the head holds the window's rows */
    if (e->dm) { /* the draft context keeps what the target kept */
      const anna_spec_window *x = &e->wins[w];
      char e2[256];
      if (anna_draft_commit(e->dm, i, x->last, x->draft, x->k, x->out, x->n_out, e2, sizeof e2)) {
        slog(SLOG_WARN, NULL, "draft model commit failed (slot %d catches up later): %s", i, e2);
        spec_drop(e, i);
      }
    }
    anna_spec_adapt_update(&e->spec_k[i], k, a);
    drafted += (uint64_t)k;
    accepted += (uint64_t)a;
    gen_request *r = e->slots[i].r;
    pthread_mutex_lock(&r->mu);
    gen_choice *c = &r->choices[e->slots[i].ci];
    c->spec_accepted += a;
    c->spec_rejected += k - a;
    pthread_mutex_unlock(&r->mu);
  }
  metrics_add(e->mx, &e->mx->spec_draft_tokens[e->o.spec_drafter], drafted);
  metrics_add(e->mx, &e->mx->spec_accepted_tokens[e->o.spec_drafter], accepted);
  return 0;
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

/* The step's model call over b (its first nb_dec rows decode, nflag_dec of the flagged rows
 * theirs): candidates (kc > 0) or full logits rows, one per flagged row, in row order.
 * engine_options.split_prefill with both decode and prompt rows: two calls, the decode rows
 * alone first (a decode-sized call: the CUDA graph path, as anna-bench's batched decode), then
 * the prompt rows; e->n_split = nflag_dec then (0 otherwise). The second call replaces the
 * first's device rows (anna_context_logits_row), so the decode rows' candidates are drawn in
 * between, into e->split_tok (-1: the full row was needed and is in e->logits). Each slot's
 * sampler draws once either way, so outputs are those of one call, up to the arithmetic of
 * the smaller batches. */
static int step_forward(engine *e, const anna_batch *b, int nb_dec, int nflag_dec, int kc, float ktemp, char *err,
                        size_t errlen) {
  e->n_split = 0;
  if (!e->o.split_prefill || nb_dec == 0 || nb_dec == b->n)
    return kc > 0 ? anna_context_decode_topk(e->ctx, b, kc, ktemp, e->c_idx, e->c_val, e->c_st, err, errlen)
                  : anna_context_decode(e->ctx, b, e->logits, err, errlen);
  const anna_batch b1 = {nb_dec, b->tokens, b->seq, b->pos, b->logits};
  const anna_batch b2 = {b->n - nb_dec, b->tokens + nb_dec, b->seq + nb_dec, b->pos + nb_dec, b->logits + nb_dec};
  const size_t k0 = (size_t)nflag_dec;
  if (kc <= 0) {
    int rc = anna_context_decode(e->ctx, &b1, e->logits, err, errlen);
    if (!rc) rc = anna_context_decode(e->ctx, &b2, e->logits + k0 * (size_t)e->V, err, errlen);
    e->n_split = rc ? 0 : nflag_dec; /* counted as two calls; the rows are in place already */
    return rc;
  }
  int rc = anna_context_decode_topk(e->ctx, &b1, kc, ktemp, e->c_idx, e->c_val, e->c_st, err, errlen);
  int nt = 0;
  for (int k = 0; k < nflag_dec && !rc; k++) {
    slot *s = &e->slots[e->out_slot[k]];
    e->split_tok[k] = -1;
    e->c_tj[k] = -1;
    if (!s->r) continue;
    int32_t t;
    const int how = slot_draw(e, e->out_slot[k], k, e->c_idx + (size_t)k * (size_t)kc,
                              e->c_val + (size_t)k * (size_t)kc, kc, e->c_st + 2 * (size_t)k, &t, &nt);
    if (how == 0)
      e->split_tok[k] = t;
    else if (how == 2)
      e->c_tj[k] = nt - 1;
    else
      rc = anna_context_logits_row(e->ctx, k, e->logits + (size_t)k * (size_t)e->V, err, errlen), e->st.full_rows++;
  }
  if (!rc) rc = tails_resolve(e, nt, err, errlen); /* before the second call replaces the rows */
  for (int k = 0; k < nflag_dec && !rc; k++)
    if (e->c_tj[k] >= 0) e->split_tok[k] = e->tl_tok[e->c_tj[k]];
  if (!rc)
    rc = anna_context_decode_topk(e->ctx, &b2, kc, ktemp, e->c_idx + k0 * (size_t)kc, e->c_val + k0 * (size_t)kc,
                                  e->c_st + 2 * k0, err, errlen);
  e->n_split = rc ? 0 : nflag_dec;
  return rc;
}

/* --engine-profile: one line over the interval's steps (see eng_prof), then a new interval. */
static void prof_log(engine *e, double now) {
  eng_prof *f = &e->prof;
  int64_t n = 0;
  for (int k = 0; k < ENG_STEP_KINDS; k++) n += f->steps[k];
  const double span = now - f->t0, dn = n > 0 ? (double)n : 1.0, ms = 1000.0 / dn;
  char ph[512];
  size_t at = 0;
  for (int p = 0; p < ENG_PH_COUNT && at < sizeof ph; p++)
    at += (size_t)snprintf(ph + at, sizeof ph - at, "%s%s %.3f", p ? ", " : "", metrics_engine_phase_names[p],
                           f->ph[p] * ms);
  const double host = f->ph[ENG_PH_STEP] - f->ph[ENG_PH_FORWARD];
  json_t *fl = json_object();
  json_t *phj = json_object();
  for (int p = 0; p < ENG_PH_COUNT; p++) json_object_set_new(phj, metrics_engine_phase_names[p], json_real(f->ph[p] * ms));
  json_object_set_new(fl, "engine_profile_s", json_real(span));
  json_object_set_new(fl, "steps", json_integer(n));
  json_object_set_new(fl, "ms_per_step", phj);
  for (int k = 0; k < ENG_STEP_KINDS; k++) {
    char key[48];
    snprintf(key, sizeof key, "steps_%s", metrics_engine_kind_names[k]);
    json_object_set_new(fl, key, json_integer(f->steps[k]));
    snprintf(key, sizeof key, "forward_ms_%s", metrics_engine_kind_names[k]);
    json_object_set_new(fl, key, json_real(f->steps[k] ? 1000.0 * f->fwd[k] / (double)f->steps[k] : 0.0));
  }
  json_object_set_new(fl, "decode_rows_per_step", json_real((double)f->decode_rows / dn));
  json_object_set_new(fl, "prefill_rows_per_step", json_real((double)f->prefill_rows / dn));
  json_object_set_new(fl, "forward_calls", json_integer(f->calls));
  json_object_set_new(fl, "graph_steps", json_integer(f->graphs));
  json_object_set_new(fl, "full_rows", json_integer(f->full_rows));
  json_object_set_new(fl, "tokens", json_integer(f->tokens));
  json_object_set_new(fl, "host_us_per_token", json_real(f->tokens ? 1e6 * host / (double)f->tokens : 0.0));
  slog_fields(SLOG_INFO, NULL, fl,
              "engine profile %.1f s: %lld steps (decode %lld, mixed %lld, prefill %lld), %lld model calls, %lld as "
              "CUDA graphs (capture %.3f, update %.3f, replay %.3f ms/step); rows/step decode %.1f prefill %.1f, "
              "%lld rows sampled whole; "
              "forward ms/step decode %.3f mixed %.3f prefill %.3f; ms/step: %s; host (step - forward) %.3f ms/step, "
              "%.1f us/token; %lld tokens, %.1f tok/s, busy %.0f%%",
              span, (long long)n, (long long)f->steps[0], (long long)f->steps[1], (long long)f->steps[2],
              (long long)f->calls, (long long)f->graphs, f->capture_s * ms, f->update_s * ms, f->gpu_s * ms,
              (double)f->decode_rows / dn, (double)f->prefill_rows / dn, (long long)f->full_rows,
              f->steps[0] ? 1000.0 * f->fwd[0] / (double)f->steps[0] : 0.0,
              f->steps[1] ? 1000.0 * f->fwd[1] / (double)f->steps[1] : 0.0,
              f->steps[2] ? 1000.0 * f->fwd[2] / (double)f->steps[2] : 0.0, ph, host * ms,
              f->tokens ? 1e6 * host / (double)f->tokens : 0.0, (long long)f->tokens,
              span > 0 ? (double)f->tokens / span : 0.0, span > 0 ? 100.0 * f->ph[ENG_PH_STEP] / span : 0.0);
  memset(f, 0, sizeof *f);
  f->t0 = now;
}

/* The step that just ran (e->st): into /metrics and the profile interval. */
static void step_record(engine *e) {
  metrics_step *st = &e->st;
  st->ph[ENG_PH_STEP] = 0;
  for (int p = 0; p < ENG_PH_COUNT; p++)
    if (p != ENG_PH_IDLE && p != ENG_PH_STEP) st->ph[ENG_PH_STEP] += st->ph[p];
  metrics_engine_step(e->mx, st);
  eng_prof *f = &e->prof;
  for (int p = 0; p < ENG_PH_COUNT; p++) f->ph[p] += st->ph[p];
  f->fwd[st->kind] += st->ph[ENG_PH_FORWARD];
  f->steps[st->kind]++;
  f->decode_rows += st->decode_rows;
  f->prefill_rows += st->prefill_rows;
  f->calls += st->forward_calls;
  f->graphs += st->graph_steps;
  f->full_rows += st->full_rows;
  if (e->o.profile_interval_s > 0 && e->ph_t - f->t0 >= e->o.profile_interval_s) prof_log(e, e->ph_t);
}

static void *engine_main(void *arg) {
  engine *e = arg;
  const int S = e->o.n_seq;
  char err[512];
  int kv_replan = 0; /* the last step planned nothing after preemptions (see below) */
  e->prof.t0 = e->ph_t = engine_now();
  anna_context_step_stats(e->ctx, &e->gs);
  for (;;) {
    /* A step that runs nothing (see below) leaves its time to the next one. */
    if (e->st.kind >= 0) memset(&e->st, 0, sizeof e->st);
    e->st.kind = -1;
    wake_flush(e);
    ph_mark(e, ENG_PH_WAKE);
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
    ph_mark(e, ENG_PH_IDLE);
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
    ph_mark(e, ENG_PH_SCHED);
    embed_run_all(e, jobs, stop);
    if (jobs) ph_mark(e, ENG_PH_FORWARD);

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
    ph_mark(e, ENG_PH_ADMIT);
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
    ph_mark(e, ENG_PH_FINISH);
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
    ph_mark(e, ENG_PH_SCHED);
    int nb = 0, nflag = 0, nw = 0, wrows = 0, n_mtpd = 0;
    const int nseqs = p.n_decode + p.n_prefill;
    for (int k = 0; k < p.n_decode; k++) {
      const int i = p.decode[k].slot;
      /* the windows run as one forward pass of their own: their rows must fit n_batch */
      int room = spec_room(e, i);
      if (room > e->spec_rows - wrows - 1) room = e->spec_rows - wrows - 1;
      const int kd = room >= 0 ? spec_draft_slot(e, i, room) : -1;
      if (kd >= 0) { /* a verify window instead of one plain token */
        e->wins[nw] = (anna_spec_window){.seq = i,
                                         .last = e->slots[i].next_tok,
                                         .draft = e->spec_draft + (size_t)i * ANNA_SPEC_MAX_DRAFT,
                                         .k = kd,
                                         .out = e->spec_out + (size_t)i * (ANNA_SPEC_MAX_DRAFT + 1)};
        if (e->mtp && kd > 0) { /* drafted below, with the step's other MTP slots */
          e->mtp_bs[n_mtpd] = i, e->mtp_bk[n_mtpd] = kd, e->mtp_bl[n_mtpd] = e->slots[i].next_tok;
          e->mtp_bw[n_mtpd++] = nw;
        }
        e->win_slot[nw++] = i;
        wrows += kd + 1;
        continue;
      }
      if (e->spec_ready && e->spec_ready[i]) { /* the model drafter falls behind */
        if (e->dm) { /* by this step's token only: it holds what the sequence holds now */
          e->spec_ready[i] = 0;
          e->spec_fed[i] = (size_t)anna_context_seq_len(e->ctx, i);
        } else {
          spec_drop(e, i);
        }
      }
      e->b_tok[nb] = e->slots[i].next_tok;
      e->b_seq[nb] = i;
      e->b_pos[nb] = anna_context_seq_len(e->ctx, i);
      e->b_want[nb] = 1;
      e->out_slot[nflag++] = i;
      nb++;
    }
    spec_mtp_drafts(e, n_mtpd);
    const int nb_dec = nb, nflag_dec = nflag; /* the decode rows come first */
    int64_t prompt_fed = 0;
    int n_mpf = 0;
    for (int k = 0; k < p.n_prefill; k++) {
      const int i = p.prefill[k].slot;
      const slot *s = &e->slots[i];
      if (mtp_follows(e, i)) { /* a forward call of its own that keeps the hidden rows (below) */
        e->mtp_pf[n_mpf++] = k;
        prompt_fed += p.prefill[k].n;
        continue;
      }
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
    if (nb == 0 && nw == 0 && n_mpf == 0) {
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
     * needs (a row's own top-k is a prefix of them) at the temperature whose softmax sum the
     * first row that needs one (top-p, min-p, pure temperature) needs. Rows that need another
     * temperature's sum, or a mask, get their candidates again where the logits are
     * (anna_context_mask_topk, per temperature); without that op (or in a split step) a
     * second temperature takes the full rows. */
    int kc = 0, n_cmask = 0;
    float ktemp = 0.0f;
    const int split = e->o.split_prefill && nb_dec > 0 && nb_dec < nb;
    for (int k = 0; k < nflag && !e->host_sampling; k++) {
      int kk = 0, cm = CMASK_NONE;
      float tt = 0.0f;
      if (!slot_cand_ok(e, e->out_slot[k], split, &kk, &tt, &cm) ||
          (tt > 0 && ktemp > 0 && tt != ktemp && (split || !e->dev_mask))) {
        kc = 0;
        break;
      }
      e->c_mask[e->out_slot[k]] = (int8_t)cm;
      e->c_temp[k] = tt;
      if (tt > 0 && ktemp <= 0) ktemp = tt;
      n_cmask += cm != CMASK_NONE || (tt > 0 && tt != ktemp);
      kc = kk > kc ? kk : kc;
    }
    ph_mark(e, ENG_PH_ASSEMBLE);
    /* The verify windows first (one forward pass of their own), then the plain batch. */
    int wsampled = 0;
    if (nw > 0) {
      const int vrc = spec_verify(e, nw, &wsampled, err, sizeof err);
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
    if (e->mp) mask_pool_start(e, nflag); /* masks overlap the forward pass */
    /* When every row's candidates are computed again after the forward pass (masks, other
     * temperatures), the pass itself needs only the cheapest candidates (k 1, no softmax sum). */
    const int again = kc > 0 && n_cmask == nflag;
    const int drc =
        nb == 0 ? 0 : step_forward(e, &b, nb_dec, nflag_dec, again ? 1 : kc, again ? 0.0f : ktemp, err, sizeof err);
    ph_mark(e, ENG_PH_FORWARD);
    if (e->mp) mask_pool_apply(e, nflag, !drc && nb > 0 && kc == 0);
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
    /* prompt chunks of sequences the MTP head follows: the head takes every row's hidden
     * state; a prompt's last chunk leaves its last row's logits after the flagged rows' */
    for (int m = 0; m < n_mpf; m++) {
      const anna_sched_entry *pf = &p.prefill[e->mtp_pf[m]];
      slot *s = &e->slots[pf->slot];
      const int last = (size_t)pf->pos + (size_t)pf->n == s->n_feed;
      const int frc = anna_mtp_feed(e->mtp, pf->slot, s->feed + pf->pos, pf->n,
                                    last ? e->logits + (size_t)(nflag + m) * (size_t)e->V : NULL, err, sizeof err);
      if (frc) {
        slog(SLOG_ERROR, NULL, "prefill (MTP) failed: %s", err);
        slot_free(e, pf->slot, "error", frc == ANNA_ERANGE || frc == ANNA_ENOMEM ? ANNA_ENOMEM : frc, err, 0);
      }
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
    {
      anna_step_stats gs;
      anna_context_step_stats(e->ctx, &gs);
      e->st.graph_steps = (int)(gs.steps - e->gs.steps);
      e->prof.capture_s += gs.capture_s - e->gs.capture_s;
      e->prof.update_s += gs.update_s - e->gs.update_s;
      e->prof.gpu_s += gs.gpu_s - e->gs.gpu_s;
      e->gs = gs;
    }
    e->st.kind = nb - (int)prompt_fed > 0 || nw > 0 ? (prompt_fed > 0 ? ENG_STEP_MIXED : ENG_STEP_DECODE)
                                                     : ENG_STEP_PREFILL;
    e->st.decode_rows = nb - (int)prompt_fed + wrows;
    e->st.prefill_rows = (int)prompt_fed;
    e->st.forward_calls = (nw > 0) + (nb > 0) + (e->n_split > 0);
    ph_mark(e, ENG_PH_SCHED);
    /* a window's accepted drafts are in the cache, its last id is the new pending token: each
     * goes through slot_sample as a drawn token would (stop strings, limits, streaming) */
    for (int w = 0; w < nw; w++) {
      const int i = e->win_slot[w];
      e->slots[i].spec_rec = wsampled; /* the sampled window recorded its tokens in the sampler */
      for (int j = 0; j < e->wins[w].n_out && e->slots[i].r; j++) slot_sample(e, i, NULL, e->wins[w].out[j]);
      e->slots[i].spec_rec = 0;
    }
    if (kc > 0) { /* the candidates' draws first: masked rows, then one call for the tails */
      int nt = 0;
      if (n_cmask > 0) { /* (never in a split step: slot_cand_ok) */
        for (int k = 0; k < nflag; k++) {
          const int i = e->out_slot[k];
          int none = 0;
          e->c_how[k] = CHOW_DRAWN;
          e->c_bits[k] = NULL;
          if (!e->slots[i].r) continue;
          if (e->c_mask[i] == CMASK_EOG) e->c_bits[k] = e->eog_bits;
          if (e->c_mask[i] == CMASK_POOL) {
            e->c_bits[k] = pool_mask_get(e, i, &none);
            /* no pool mask after all (its tables failed): the full row, masked inline */
            e->c_how[k] = none ? CHOW_STOP : e->c_bits[k] ? CHOW_DRAWN : CHOW_FULL;
            if (none) e->c_bits[k] = NULL;
          }
        }
        /* rows at another temperature: an empty mask, candidates again at theirs */
        for (int k = 0; k < nflag; k++)
          if (e->slots[e->out_slot[k]].r && !e->c_bits[k] && e->c_how[k] == CHOW_DRAWN && e->c_temp[k] > 0 &&
              e->c_temp[k] != ktemp)
            e->c_bits[k] = e->zero_bits;
        /* one call per temperature (rows without a softmax sum go with ktemp's) */
        for (int k = 0; k < nflag; k++) e->c_done[k] = e->c_bits[k] == NULL;
        for (int k0 = 0; k0 < nflag; k0++) {
          if (e->c_done[k0]) continue;
          const float T = e->c_temp[k0] > 0 ? e->c_temp[k0] : ktemp;
          for (int k = k0; k < nflag; k++) {
            const int here = !e->c_done[k] && (e->c_temp[k] > 0 ? e->c_temp[k] : ktemp) == T;
            e->c_gb[k] = here ? e->c_bits[k] : NULL;
            e->c_done[k] |= (int8_t)here;
          }
          for (int k = 0; k < k0; k++) e->c_gb[k] = NULL;
          const int mrc = anna_context_mask_topk(e->ctx, e->c_gb, nflag, kc, T, e->c_idx, e->c_val, e->c_st, err,
                                                 sizeof err);
          for (int k = k0; k < nflag; k++) {
            const int i = e->out_slot[k];
            if (!e->c_gb[k]) continue;
            if (mrc) e->c_how[k] = CHOW_FULL; /* the rows as the host path masks them */
            if (!mrc && e->c_mask[i] == CMASK_POOL) e->mp->m_applied[i] = 1;
          }
          if (mrc) slog(SLOG_WARN, NULL, "masked candidates failed, sampling the full rows: %s", err);
        }
      } else {
        for (int k = 0; k < nflag; k++) e->c_how[k] = CHOW_DRAWN;
      }
      for (int k = e->n_split; k < nflag; k++) {
        const int i = e->out_slot[k];
        e->c_tj[k] = -1;
        if (!e->slots[i].r || e->c_how[k] != CHOW_DRAWN) continue;
        const int how = slot_draw(e, i, k - e->n_split, e->c_idx + (size_t)k * (size_t)kc,
                                  e->c_val + (size_t)k * (size_t)kc, kc, e->c_st + 2 * (size_t)k, &e->c_tok[k], &nt);
        e->c_how[k] = how == 0 ? CHOW_DRAWN : how == 2 ? CHOW_TAIL : CHOW_FULL;
        if (how == 2) e->c_tj[k] = nt - 1;
      }
      const int trc = tails_resolve(e, nt, err, sizeof err);
      if (trc) { /* a device error: those draws are lost */
        slog(SLOG_ERROR, NULL, "tail draws failed: %s", err);
        for (int k = e->n_split; k < nflag; k++)
          if (e->c_how[k] == CHOW_TAIL) {
            slot_free(e, e->out_slot[k], "error", trc, err, 0);
            e->c_how[k] = CHOW_DRAWN; /* freed: nothing more to do */
          }
      }
    }
    for (int k = 0; k < nflag; k++) {
      int i = e->out_slot[k];
      slot *s = &e->slots[i];
      if (kc > 0 && k < e->n_split) { /* drawn between the split step's two calls */
        if (s->r) slot_sample(e, i, e->split_tok[k] >= 0 ? NULL : e->logits + (size_t)k * (size_t)e->V, e->split_tok[k]);
        continue;
      }
      if (kc > 0) { /* from the candidates; a row they do not decide is fetched in full */
        if (!s->r) continue;
        const int how = e->c_how[k];
        if (how == CHOW_STOP) { /* the grammar / JSON leaves no token */
          slot_free(e, i, "stop", 0, NULL, 1);
        } else if (how == CHOW_DRAWN || how == CHOW_TAIL) {
          s->pre_masked = e->c_mask[i] == CMASK_POOL;
          slot_sample(e, i, NULL, how == CHOW_TAIL ? e->tl_tok[e->c_tj[k]] : e->c_tok[k]);
        } else {
          const int lrc = anna_context_logits_row(e->ctx, k - e->n_split, e->row_tmp, err, sizeof err);
          e->st.full_rows++;
          ph_mark(e, ENG_PH_SAMPLE);
          if (lrc) {
            slot_free(e, i, "error", lrc, err, 0);
            continue;
          }
          slot_sample(e, i, e->row_tmp, -1);
        }
        continue;
      }
      e->st.full_rows += s->r != NULL;
      if (s->r && s->exact_store && !s->decoding) exact_store(e, i, e->logits + (size_t)k * (size_t)e->V);
      if (s->r) slot_sample(e, i, e->logits + (size_t)k * (size_t)e->V, -1);
    }
    for (int m = 0; m < n_mpf; m++) { /* the MTP-fed prompts that ended: their first token */
      const anna_sched_entry *pf = &p.prefill[e->mtp_pf[m]];
      const int i = pf->slot;
      slot *s = &e->slots[i];
      if (!s->r || s->decoding || (size_t)pf->pos + (size_t)pf->n != s->n_feed) continue;
      float *row = e->logits + (size_t)(nflag + m) * (size_t)e->V;
      e->st.full_rows++;
      e->spec_ready[i] = 1; /* the head holds the prompt and drafts from its last position */
      if (s->exact_store) exact_store(e, i, row);
      slot_sample(e, i, row, -1);
    }
    ph_mark(e, ENG_PH_SAMPLE);
    wake_flush(e);
    ph_mark(e, ENG_PH_WAKE);
    if (e->dm) spec_draft_follow(e, &p);
    if (e->o.debug_step_delay_ms > 0) {
      struct timespec d = {e->o.debug_step_delay_ms / 1000,
                           (long)(e->o.debug_step_delay_ms % 1000) * 1000000L};
      nanosleep(&d, NULL);
      ph_mark(e, ENG_PH_IDLE); /* a testing hook, not the engine's work */
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
    if (e->spec_draft) anna_context_spec_stats(e->ctx, &sps); /* the engine thread's counters, published under mu */
    anna_vision_stats vst;
    anna_context_vision_stats(e->ctx, &vst);
    pthread_mutex_lock(&e->mu);
    if (e->spec_draft) e->spec = sps;
    e->vis = vst;
    e->running = anna_sched_n_running(e->sc);
    e->kv_tokens = kv;
    e->kv_cached = cached;
    e->kvs = ks;
    kv_refs(e);
    pthread_mutex_unlock(&e->mu);
    ph_mark(e, ENG_PH_STATS);
    step_record(e);
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

/* Context checkpoint slots: the prompt cache's, and at least one window's per-position states
 * when speculation is on (without them a hybrid model's rejected window cannot roll back). */
static int spec_checkpoints(const engine_options *o) {
  const int n = o->prompt_cache ? o->prompt_cache_checkpoints : 0;
  const int k = o->spec_draft_max > ANNA_SPEC_MAX_DRAFT ? ANNA_SPEC_MAX_DRAFT : o->spec_draft_max;
  return k > 0 && n < k + 3 ? k + 3 : n;
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
  pthread_mutex_init(&e->wk_mu, NULL);
  pthread_cond_init(&e->wk_cv, NULL);
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
                             /* hybrid models roll verify windows back through checkpoints
                              * (anna.h): a window's per-position states need k + 3 */
                             .n_checkpoints = spec_checkpoints(&e->o),
                             .device = e->o.device,
                             .layer_split = e->o.layer_split,
                             .tensor_parallel = e->o.tensor_parallel,
                             .tp_comm = e->o.tp_comm,
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
  e->split_tok = malloc((size_t)S * sizeof *e->split_tok);
  e->host_sampling = e->o.host_sampling;
  if (!e->row_tmp || !e->ex || !e->c_idx || !e->c_val || !e->c_st || !e->split_tok) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory for the prompt cache");
    goto fail;
  }
  /* Draws where the logits are, when the backend has the ops (an n = 0 call asks). */
  {
    const uint64_t *none = NULL;
    int32_t pi;
    float pv;
    double ps[2];
    e->dev_tail = anna_context_sample_tail(e->ctx, NULL, NULL, 0, NULL, NULL, 0) == 0;
    e->dev_mask = anna_context_mask_topk(e->ctx, &none, 0, 1, 0.0f, &pi, &pv, ps, NULL, 0) == 0;
  }
  e->c_mask = calloc((size_t)S, 1);
  e->c_how = calloc((size_t)S, 1);
  e->eog_bits = calloc(((size_t)e->V + 63) / 64, sizeof *e->eog_bits);
  e->c_bits = calloc((size_t)S, sizeof *e->c_bits);
  e->c_gb = calloc((size_t)S, sizeof *e->c_gb);
  e->c_done = calloc((size_t)S, 1);
  e->c_temp = calloc((size_t)S, sizeof *e->c_temp);
  e->zero_bits = calloc(((size_t)e->V + 63) / 64, sizeof *e->zero_bits);
  e->c_tok = calloc((size_t)S, sizeof *e->c_tok);
  e->c_tj = calloc((size_t)S, sizeof *e->c_tj);
  e->tl = calloc((size_t)S, sizeof *e->tl);
  e->tl_row = calloc((size_t)S, sizeof *e->tl_row);
  e->tl_tok = calloc((size_t)S, sizeof *e->tl_tok);
  if (!e->c_mask || !e->c_how || !e->eog_bits || !e->c_bits || !e->c_tok || !e->c_tj || !e->tl || !e->tl_row ||
      !e->tl_tok || !e->c_gb || !e->c_done || !e->c_temp || !e->zero_bits) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory for the sampling buffers");
    goto fail;
  }
  for (int k = 0; k < e->n_eog; k++) e->eog_bits[e->eog_ids[k] >> 6] |= (uint64_t)1 << (e->eog_ids[k] & 63);
  int mt = e->o.mask_threads;
  if (mt < 0) {
    const long nc = sysconf(_SC_NPROCESSORS_ONLN);
    mt = nc >= 2 ? (int)(nc / 2) : 0;
    mt = mt > 8 ? 8 : mt;
  }
  if (mt > 0 && mask_pool_new(&e->mp, e, mt)) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "cannot start %d structured-output mask threads", mt);
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
    e->win_smp = malloc((size_t)S * sizeof *e->win_smp);
    e->spec_k = malloc((size_t)S * sizeof *e->spec_k);
    /* sampled windows need their rows' logits on the host: a step's window rows are capped
     * at SPEC_MAX_ROWS (or what n_batch and the slots' windows allow) to bound that buffer */
    e->spec_rows = S * (e->o.spec_draft_max + 1);
    if (e->spec_rows > B) e->spec_rows = B;
    if (e->spec_rows > SPEC_MAX_ROWS) e->spec_rows = SPEC_MAX_ROWS;
    e->spec_logits = malloc((size_t)e->spec_rows * (size_t)e->V * sizeof(float));
    e->spec_ready = calloc((size_t)S, 1);
    e->mtp_pf = malloc((size_t)S * sizeof *e->mtp_pf);
    e->spec_fed = calloc((size_t)S, sizeof *e->spec_fed);
    e->mtp_bs = malloc((size_t)S * sizeof *e->mtp_bs);
    e->mtp_bk = malloc((size_t)S * sizeof *e->mtp_bk);
    e->mtp_bw = malloc((size_t)S * sizeof *e->mtp_bw);
    e->mtp_bl = malloc((size_t)S * sizeof *e->mtp_bl);
    e->mtp_bd = malloc((size_t)S * ANNA_SPEC_MAX_DRAFT * sizeof *e->mtp_bd);
    if (!e->ng || !e->spec_draft || !e->spec_out || !e->wins || !e->win_slot || !e->win_smp || !e->spec_k ||
        !e->spec_logits || !e->spec_ready || !e->mtp_pf || !e->spec_fed || !e->mtp_bs || !e->mtp_bk || !e->mtp_bw ||
        !e->mtp_bl || !e->mtp_bd) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory for the speculative drafters");
      goto fail;
    }
    switch (e->o.spec_drafter) {
    case ENGINE_DRAFTER_NGRAM:
      for (int i = 0; i < S; i++)
        if ((rc = anna_ngram_create(&e->ng[i], &np, (int32_t)e->o.n_ctx + 1, err, errlen))) goto fail;
      break;
    case ENGINE_DRAFTER_MTP: /* ANNA_EUNSUPPORTED naming the model when it has no head */
      free(e->ng), e->ng = NULL;
      if ((rc = anna_mtp_create(&e->mtp, e->ctx, e->o.spec_draft_max, err, errlen))) goto fail;
      break;
    case ENGINE_DRAFTER_DRAFT: {
      free(e->ng), e->ng = NULL;
      if (!e->o.spec_draft_model) {
        rc = anna_err(err, errlen, ANNA_EINVAL, "speculative drafter 'draft' without a draft model (--draft-model)");
        goto fail;
      }
      const anna_model_options dmo = {.device = e->o.device, .tuning = e->o.tuning};
      char e2[512];
      if ((rc = anna_model_load(&e->dmodel, e->o.spec_draft_model, &dmo, e2, sizeof e2))) {
        anna_err(err, errlen, rc, "--draft-model %s: %s", e->o.spec_draft_model, e2);
        goto fail;
      }
      /* one draft sequence per slot, as long as the target's; no prefix sharing or caches */
      const anna_context_options dco = {.n_seq = S,
                                        .n_ctx = e->o.n_ctx,
                                        .n_batch = B,
                                        .n_threads = e->o.n_threads,
                                        .device = e->o.device,
                                        .tuning = e->o.tuning,
                                        .exact_matmul = e->o.exact_matmul};
      if ((rc = anna_draft_create(&e->dm, e->dmodel, m, &dco, e->o.spec_draft_max, e2, sizeof e2))) {
        anna_err(err, errlen, rc, "--draft-model %s: %s", e->o.spec_draft_model, e2);
        goto fail;
      }
      break;
    }
    default:
      rc = anna_err(err, errlen, ANNA_EINVAL, "unknown speculative drafter %d", e->o.spec_drafter);
      goto fail;
    }
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
  e->wk_cap = 2 * S; /* the notifier may be a step behind */
  e->wk_q = malloc((size_t)e->wk_cap * sizeof *e->wk_q);
  e->wk_mine = malloc((size_t)e->wk_cap * sizeof *e->wk_mine);
  /* without it (no memory, no thread) the engine thread broadcasts itself */
  e->wk_started = e->wk_q && e->wk_mine && pthread_create(&e->wk_th, NULL, notifier_main, e) == 0;
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
  if (e->wk_started) { /* after the engine thread: it queues no more */
    pthread_mutex_lock(&e->wk_mu);
    e->wk_stop = 1;
    pthread_cond_signal(&e->wk_cv);
    pthread_mutex_unlock(&e->wk_mu);
    pthread_join(e->wk_th, NULL);
  }
  free(e->wk_q);
  free(e->wk_mine);
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
  free(e->split_tok);
  free(e->c_mask), free(e->c_how), free(e->eog_bits), free(e->c_bits), free(e->c_tok), free(e->c_tj);
  free(e->c_gb), free(e->c_done), free(e->c_temp), free(e->zero_bits);
  free(e->tl), free(e->tl_row), free(e->tl_tok);
  if (e->ng)
    for (int i = 0; i < e->o.n_seq; i++) anna_ngram_free(e->ng[i]);
  free(e->ng), free(e->spec_draft), free(e->spec_out), free(e->wins), free(e->win_slot);
  free(e->win_smp), free(e->spec_logits), free(e->spec_k), free(e->spec_ready), free(e->mtp_pf), free(e->spec_fed);
  free(e->mtp_bs), free(e->mtp_bk), free(e->mtp_bw), free(e->mtp_bl), free(e->mtp_bd);
  anna_mtp_free(e->mtp); /* before the context it borrows */
  anna_draft_free(e->dm);
  anna_model_free(e->dmodel);
  free(e->b_tok);
  free(e->b_seq);
  free(e->b_pos);
  free(e->b_want);
  free(e->out_slot);
  free(e->logits);
  free(e->lp_row);
  mask_pool_free(e->mp); /* its maskers read jvoc */
  gbnf_masker_free(e->gmask);
  jsonschema_mcache_free(e->jcache);
  jsonschema_scratch_free(e->jsc);
  free(e->jbits);
  jsonschema_vocab_free(e->jvoc);
  free(e->eog_ids);
  anna_context_free(e->ctx);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  pthread_cond_destroy(&e->idle_cv);
  pthread_cond_destroy(&e->embed_cv);
  pthread_mutex_destroy(&e->wk_mu);
  pthread_cond_destroy(&e->wk_cv);
  free(e);
}

int engine_submit(engine *e, gen_request *r, char *err, size_t errlen) {
  if (!r->choices) return anna_err(err, errlen, ANNA_EINVAL, "request not prepared");
  /* the server's speculative default, resolved once: usage reports drafts whenever it is on */
  if (r->speculative == GEN_SPEC_DEFAULT) r->speculative = e->spec_draft && e->o.spec_default ? GEN_SPEC_ON : GEN_SPEC_OFF;
  if (!e->spec_draft) r->speculative = GEN_SPEC_OFF;
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
  jschema_mcache *jc = __atomic_load_n(&e->jcache, __ATOMIC_ACQUIRE); /* set by the engine thread */
  jschema_mcache_stats js = {0};
  if (jc) jsonschema_mcache_get_stats(jc, &js);
  st->jmc_hits = js.hits;
  st->jmc_misses = js.misses;
  st->jmc_evictions = js.evictions;
  st->jmc_entries = js.entries;
  st->jmc_bytes = js.bytes;
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
