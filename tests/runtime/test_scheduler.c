/* test_scheduler: the continuous-batching policy (anna.h, "Scheduler") without a model or
 * sockets. A small simulator plays the engine: it executes plans against a pool of KV blocks,
 * "samples" a token at every wanted row, and finishes sequences at their length. Cases:
 * fairness, budgets, chunked prefill, the waiting limit (HTTP 429), cancellation, preemption
 * and resumption, prefill_interval_steps, request kinds, batch_wait_ms, and a randomized run
 * whose invariants are checked at every step. */
#include "anna/anna.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
#define CHECK(c)                                                                                   \
  do {                                                                                             \
    if (!(c)) {                                                                                    \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);                        \
      fails++;                                                                                     \
    }                                                                                              \
  } while (0)

/* ---- the simulated engine ---- */

#define MAXR 512
#define MAXS 16

typedef struct sreq {
  uint64_t id;
  int n_prompt, max_gen, gen;
  int kv;   /* tokens in this sequence's cache (0 while it waits) */
  int slot; /* -1: not running */
  int done, cancelled, preempted;
} sreq;

typedef struct sim {
  anna_sched *s;
  anna_sched_options o;
  int64_t n_blocks; /* < 0: unlimited */
  sreq r[MAXR];
  int n;
  int slot_req[MAXS]; /* request index per slot, -1 free */
  double now;
  int steps, finished;
} sim;

static void sim_init(sim *m, const anna_sched_options *o, int64_t n_blocks) {
  memset(m, 0, sizeof *m);
  m->o = *o;
  m->n_blocks = n_blocks;
  for (int i = 0; i < MAXS; i++)
    m->slot_req[i] = -1;
  char err[256];
  if (anna_sched_create(&m->s, o, err, sizeof err)) {
    fprintf(stderr, "anna_sched_create: %s\n", err);
    exit(1);
  }
}

static int64_t blocks_of(const sim *m, int tokens) {
  const int b = m->o.block_len;
  return b > 0 ? (tokens + b - 1) / b : 0;
}

static int64_t sim_free_blocks(const sim *m) {
  if (m->n_blocks < 0) return -1;
  int64_t used = 0;
  for (int i = 0; i < m->n; i++)
    if (m->r[i].slot >= 0) used += blocks_of(m, m->r[i].kv);
  return m->n_blocks - used;
}

/* Submits one request of n choices (each a sequence); returns the index of the first, or the
 * negative error. */
static int sim_submit(sim *m, int n_prompt, int max_gen, int n) {
  anna_sched_seq_desc d[8] = {{0}};
  for (int k = 0; k < n; k++) {
    d[k] = (anna_sched_seq_desc){ANNA_SCHED_KIND_TEXT, n_prompt, (void *)(intptr_t)(m->n + k)};
  }
  uint64_t id = 0;
  char err[256];
  int rc = anna_sched_submit(m->s, d, n, m->now, &id, err, sizeof err);
  if (rc) return rc;
  for (int k = 0; k < n; k++) {
    sreq *q = &m->r[m->n + k];
    memset(q, 0, sizeof *q);
    q->id = id + (uint64_t)k;
    q->n_prompt = n_prompt;
    q->max_gen = max_gen;
    q->slot = -1;
  }
  m->n += n;
  return m->n - n;
}

static int idx_of(const anna_sched_entry *e) {
  return (int)(intptr_t)e->user;
}

static void sim_finish(sim *m, int ri) {
  sreq *q = &m->r[ri];
  anna_sched_seq_finish(m->s, q->slot);
  m->slot_req[q->slot] = -1;
  q->slot = -1;
  q->kv = 0;
  q->done = 1;
  m->finished++;
}

/* Admission and drops; returns the number admitted. */
static int sim_admit(sim *m) {
  const anna_sched_entry *adm;
  int n_adm;
  anna_sched_admit(m->s, m->now, sim_free_blocks(m), &adm, &n_adm);
  for (int k = 0; k < n_adm; k++) {
    sreq *q = &m->r[idx_of(&adm[k])];
    CHECK(adm[k].id == q->id);
    CHECK(adm[k].slot >= 0 && adm[k].slot < m->o.n_slots);
    CHECK(m->slot_req[adm[k].slot] == -1); /* no slot used twice */
    CHECK(q->slot == -1 && !q->done);
    CHECK(adm[k].n == q->n_prompt + q->gen); /* a resumed sequence recomputes its tokens */
    CHECK(adm[k].pos == q->gen);
    m->slot_req[adm[k].slot] = idx_of(&adm[k]);
    q->slot = adm[k].slot;
    q->kv = 0;
  }
  anna_sched_entry d;
  while (anna_sched_drop_next(m->s, &d)) {
    sreq *q = &m->r[idx_of(&d)];
    CHECK(q->cancelled && !q->done);
    CHECK(d.slot == q->slot);
    if (q->slot >= 0) m->slot_req[q->slot] = -1;
    q->slot = -1;
    q->kv = 0;
    q->done = 1;
    m->finished++;
  }
  return n_adm;
}

/* Plans and executes one step, checking the plan; returns its token count. */
static int sim_step(sim *m, anna_sched_plan *out) {
  anna_sched_plan p;
  const int64_t free_before = sim_free_blocks(m);
  anna_sched_plan_step(m->s, free_before, &p);
  for (int k = 0; k < p.n_preempted; k++) {
    sreq *q = &m->r[idx_of(&p.preempted[k])];
    CHECK(q->slot == p.preempted[k].slot);
    m->slot_req[q->slot] = -1;
    q->slot = -1;
    q->kv = 0;
    q->preempted++;
  }
  int used_slot[MAXS] = {0}, ntok = 0, npre = 0;
  int64_t dec_cost = 0;
  for (int k = 0; k < p.n_decode; k++) {
    const anna_sched_entry *e = &p.decode[k];
    sreq *q = &m->r[idx_of(e)];
    CHECK(m->slot_req[e->slot] == idx_of(e) && q->slot == e->slot);
    CHECK(!used_slot[e->slot]);
    used_slot[e->slot] = 1;
    CHECK(e->n == 1 && e->want == 1);
    CHECK(e->pos == q->kv);
    CHECK(q->kv == q->n_prompt + q->gen - 1); /* the last generated token is fed */
    dec_cost += e->pos + 1;
    ntok += e->n;
  }
  if (m->o.max_decode_tokens > 0 && p.n_decode > 1) CHECK(dec_cost <= m->o.max_decode_tokens);
  for (int k = 0; k < p.n_prefill; k++) {
    const anna_sched_entry *e = &p.prefill[k];
    sreq *q = &m->r[idx_of(e)];
    CHECK(m->slot_req[e->slot] == idx_of(e) && q->slot == e->slot);
    CHECK(!used_slot[e->slot]);
    used_slot[e->slot] = 1;
    CHECK(e->n > 0 && e->pos == q->kv);
    CHECK(e->pos + e->n <= q->n_prompt + q->gen);
    CHECK(e->want == (e->pos + e->n == q->n_prompt + q->gen));
    ntok += e->n;
    npre += e->n;
  }
  CHECK(ntok == p.n_tokens);
  CHECK(ntok <= m->o.n_batch);
  if (m->o.max_prefill_tokens > 0) CHECK(npre <= m->o.max_prefill_tokens);
  /* execute: the cache grows */
  for (int k = 0; k < p.n_decode; k++)
    m->r[idx_of(&p.decode[k])].kv += p.decode[k].n;
  for (int k = 0; k < p.n_prefill; k++)
    m->r[idx_of(&p.prefill[k])].kv += p.prefill[k].n;
  if (m->n_blocks >= 0) CHECK(sim_free_blocks(m) >= 0); /* the pool was never overdrawn */
  anna_sched_commit(m->s, &p);
  /* sample wanted rows */
  const anna_sched_entry *all[2 * MAXS];
  int na = 0;
  for (int k = 0; k < p.n_decode; k++)
    all[na++] = &p.decode[k];
  for (int k = 0; k < p.n_prefill; k++)
    if (p.prefill[k].want) all[na++] = &p.prefill[k];
  for (int k = 0; k < na; k++) {
    const int ri = idx_of(all[k]);
    sreq *q = &m->r[ri];
    CHECK(anna_sched_slot_cached(m->s, q->slot) == q->kv);
    q->gen++;
    if (q->gen >= q->max_gen)
      sim_finish(m, ri);
    else
      anna_sched_seq_token(m->s, q->slot);
  }
  m->steps++;
  if (out) *out = p;
  return ntok;
}

static anna_sched_options opts(int n_slots, int n_batch) {
  anna_sched_options o = {0};
  o.n_slots = n_slots;
  o.n_batch = n_batch;
  o.max_batch_size = n_slots;
  return o;
}

/* ---- cases ---- */

static void test_fairness(void) {
  anna_sched_options o = opts(2, 64);
  o.max_batch_size = 1;
  o.max_queue_wait_ms = 100;
  sim m;
  sim_init(&m, &o, -1);
  int a = sim_submit(&m, 4, 50, 1), b = sim_submit(&m, 4, 5, 1);
  CHECK(sim_admit(&m) == 1 && m.r[a].slot >= 0 && m.r[b].slot < 0);
  m.now = 50;
  sim_step(&m, NULL);
  CHECK(sim_admit(&m) == 0); /* max_batch_size holds it back */
  m.now = 101;
  CHECK(sim_admit(&m) == 1 && m.r[b].slot >= 0); /* old enough: admitted beyond it */
  CHECK(anna_sched_n_running(m.s) == 2);
  anna_sched_free(m.s);
  /* without max_queue_wait_ms it waits for a slot under max_batch_size */
  o.max_queue_wait_ms = 0;
  sim_init(&m, &o, -1);
  a = sim_submit(&m, 4, 3, 1);
  b = sim_submit(&m, 4, 3, 1);
  sim_admit(&m);
  m.now = 1e6;
  while (!m.r[a].done) {
    CHECK(sim_admit(&m) == 0);
    sim_step(&m, NULL);
  }
  CHECK(sim_admit(&m) == 1 && m.r[b].slot >= 0);
  anna_sched_free(m.s);
}

static void test_budgets_and_chunks(void) {
  anna_sched_options o = opts(4, 64);
  o.max_prefill_tokens = 16;
  sim m;
  sim_init(&m, &o, -1);
  int a = sim_submit(&m, 40, 4, 1), b = sim_submit(&m, 10, 4, 1);
  CHECK(sim_admit(&m) == 2);
  anna_sched_plan p;
  /* step 1: a's first chunk (first come, first served), all of the budget */
  sim_step(&m, &p);
  CHECK(p.n_prefill == 1 && p.prefill[0].pos == 0 && p.prefill[0].n == 16 && !p.prefill[0].want);
  sim_step(&m, &p);
  CHECK(p.n_prefill == 1 && p.prefill[0].pos == 16 && p.prefill[0].n == 16);
  /* step 3: a's last 8, then 8 of b's 10 */
  sim_step(&m, &p);
  CHECK(p.n_prefill == 2 && p.prefill[0].n == 8 && p.prefill[0].want);
  CHECK(p.prefill[1].slot == m.r[b].slot && p.prefill[1].n == 8 && !p.prefill[1].want);
  /* step 4: a decodes, b finishes its prompt */
  sim_step(&m, &p);
  CHECK(p.n_decode == 1 && p.decode[0].slot == m.r[a].slot && p.decode[0].pos == 40);
  CHECK(p.n_prefill == 1 && p.prefill[0].pos == 8 && p.prefill[0].n == 2 && p.prefill[0].want);
  anna_sched_free(m.s);

  /* the step's token cap: decodes first, prefill gets what is left of n_batch */
  o = opts(4, 8);
  sim_init(&m, &o, -1);
  for (int k = 0; k < 3; k++)
    sim_submit(&m, 2, 100, 1);
  sim_admit(&m);
  sim_step(&m, &p); /* 6 prompt tokens */
  int big = sim_submit(&m, 30, 2, 1);
  sim_admit(&m);
  sim_step(&m, &p);
  CHECK(p.n_decode == 3 && p.n_prefill == 1 && p.prefill[0].n == 5 && p.n_tokens == 8);
  CHECK(p.prefill[0].slot == m.r[big].slot);
  anna_sched_free(m.s);

  /* max_decode_tokens: one decode per step when two do not fit, rotating */
  o = opts(2, 64);
  o.max_decode_tokens = 30;
  sim_init(&m, &o, -1);
  sim_submit(&m, 20, 100, 2);
  sim_admit(&m);
  sim_step(&m, &p);
  int seen[2] = {0, 0};
  for (int k = 0; k < 4; k++) {
    sim_step(&m, &p);
    CHECK(p.n_decode == 1);
    seen[p.decode[0].slot]++;
  }
  CHECK(seen[0] == 2 && seen[1] == 2);
  anna_sched_free(m.s);
}

static void test_queue_full(void) {
  anna_sched_options o = opts(1, 16);
  o.max_waiting = 2;
  sim m;
  sim_init(&m, &o, -1);
  CHECK(sim_submit(&m, 4, 2, 1) >= 0);
  CHECK(sim_submit(&m, 4, 2, 1) >= 0);
  CHECK(sim_submit(&m, 4, 2, 1) == ANNA_ERANGE); /* the 429 */
  CHECK(anna_sched_n_waiting(m.s) == 2);
  sim_admit(&m); /* one leaves the queue */
  CHECK(anna_sched_n_waiting(m.s) == 1);
  CHECK(sim_submit(&m, 4, 2, 2) >= 0); /* checked before queueing, as the server did */
  CHECK(anna_sched_n_waiting(m.s) == 3);
  CHECK(sim_submit(&m, 4, 2, 1) == ANNA_ERANGE);
  anna_sched_free(m.s);
}

static void test_cancel(void) {
  anna_sched_options o = opts(2, 32);
  sim m;
  sim_init(&m, &o, -1);
  int a = sim_submit(&m, 4, 100, 1), b = sim_submit(&m, 4, 100, 1), c = sim_submit(&m, 4, 3, 1);
  sim_admit(&m);
  CHECK(m.r[a].slot >= 0 && m.r[b].slot >= 0 && m.r[c].slot < 0);
  sim_step(&m, NULL);
  sim_step(&m, NULL);
  /* a waiting one: dropped at the next admission, never got a slot */
  int d = sim_submit(&m, 4, 3, 1);
  CHECK(anna_sched_cancel(m.s, m.r[d].id) == 0);
  m.r[d].cancelled = 1;
  /* a running one: its slot is free at the next admission, and c takes it */
  const int slot_a = m.r[a].slot;
  CHECK(anna_sched_cancel(m.s, m.r[a].id) == 0);
  m.r[a].cancelled = 1;
  CHECK(sim_admit(&m) == 0); /* the slots were counted before the drops */
  CHECK(m.r[a].done && m.r[d].done && m.r[c].slot < 0);
  CHECK(anna_sched_n_running(m.s) == 1 && anna_sched_n_waiting(m.s) == 1);
  CHECK(anna_sched_cancel(m.s, m.r[a].id) == ANNA_ENOTFOUND);
  anna_sched_plan p;
  sim_step(&m, &p);
  for (int k = 0; k < p.n_decode; k++)
    CHECK(p.decode[k].id != m.r[a].id);
  CHECK(sim_admit(&m) == 1 && m.r[c].slot == slot_a); /* the next plan uses the freed slot */
  CHECK(anna_sched_n_running(m.s) == 2 && anna_sched_n_waiting(m.s) == 0);
  /* shutdown */
  anna_sched_cancel_all(m.s);
  m.r[b].cancelled = m.r[c].cancelled = 1;
  sim_admit(&m);
  CHECK(anna_sched_n_running(m.s) == 0 && m.r[b].done && m.r[c].done);
  anna_sched_free(m.s);
}

static void test_preemption(void) {
  anna_sched_options o = opts(2, 64);
  o.block_len = 4;
  sim m;
  sim_init(&m, &o, 6); /* 24 positions for two sequences */
  int a = sim_submit(&m, 8, 10, 1);
  int b = sim_submit(&m, 6, 10, 1);
  CHECK(sim_admit(&m) == 2);
  anna_sched_plan p;
  int preempted = 0;
  while (!m.r[a].done && m.steps < 100) {
    sim_admit(&m);
    sim_step(&m, &p);
    for (int k = 0; k < p.n_preempted; k++) {
      CHECK(p.preempted[k].id == m.r[b].id); /* the most recently admitted goes */
      preempted++;
    }
  }
  CHECK(preempted >= 1 && m.r[b].preempted >= 1);
  CHECK(anna_sched_n_waiting(m.s) + anna_sched_n_running(m.s) == 1);
  /* b comes back with its generated tokens and finishes */
  const int gen_before = m.r[b].gen;
  CHECK(gen_before > 0);
  while (!m.r[b].done && m.steps < 200) {
    sim_admit(&m);
    sim_step(&m, &p);
  }
  CHECK(m.r[b].done && m.r[b].gen == 10);
  anna_sched_free(m.s);

  /* a cached prefix: chunks start after it; with a partly filled block the first chunk may
   * copy it, so it is counted */
  o = opts(1, 64);
  o.block_len = 4;
  sim_init(&m, &o, -1);
  sim_submit(&m, 12, 2, 1);
  sim_admit(&m);
  anna_sched_seq_cached(m.s, 0, 6);
  m.r[0].kv = 6;
  sim_step(&m, &p);
  CHECK(p.n_prefill == 1 && p.prefill[0].pos == 6 && p.prefill[0].n == 6 && p.prefill[0].want);
  anna_sched_free(m.s);
  /* admission waits for the blocks of the first chunk while others run */
  o = opts(2, 64);
  o.block_len = 4;
  o.max_prefill_tokens = 8;
  sim_init(&m, &o, 4);
  sim_submit(&m, 8, 30, 1);
  sim_admit(&m);
  sim_step(&m, &p); /* 2 blocks used, 2 free */
  sim_step(&m, &p); /* decoding at 9: 3 used */
  int late = sim_submit(&m, 8, 2, 1);
  CHECK(sim_admit(&m) == 0 && m.r[late].slot < 0); /* needs 2, 1 free */
  anna_sched_free(m.s);
}

/* Two choices of one 6-token prompt sharing its blocks (block_len 4), both decoding: with the
 * cache's counts (anna_sched_seq_blocks) each decode copies the shared partial block, and a
 * preemption frees only what the victim alone held; the estimate knew neither. */
static anna_sched *two_decoding(int32_t cached) {
  anna_sched_options o = opts(2, 64);
  o.block_len = 4;
  anna_sched *s = NULL;
  char err[128];
  CHECK(!anna_sched_create(&s, &o, err, sizeof err));
  anna_sched_seq_desc d[2] = {{ANNA_SCHED_KIND_TEXT, cached, NULL},
                              {ANNA_SCHED_KIND_TEXT, cached, NULL}};
  uint64_t id;
  CHECK(!anna_sched_submit(s, d, 2, 0, &id, err, sizeof err));
  const anna_sched_entry *adm;
  int n_adm;
  anna_sched_admit(s, 0, -1, &adm, &n_adm);
  CHECK(n_adm == 2);
  for (int i = 0; i < 2; i++) {
    anna_sched_seq_cached(s, adm[i].slot, cached);
    anna_sched_seq_token(s, adm[i].slot);
  }
  return s;
}

static void test_cache_block_counts(void) {
  anna_sched_plan p;
  /* the estimate: a decode inside a block needs nothing */
  anna_sched *s = two_decoding(6);
  anna_sched_plan_step(s, 1, &p);
  CHECK(p.n_decode == 2 && p.n_preempted == 0);
  anna_sched_commit(s, &p);
  anna_sched_free(s);
  /* the cache's counts: one copy each, 1 block free: the later one is preempted (it frees
   * nothing: its blocks are shared), the earlier one decodes */
  s = two_decoding(6);
  for (int i = 0; i < 2; i++)
    anna_sched_seq_blocks(s, i, 1, 0);
  anna_sched_plan_step(s, 1, &p);
  CHECK(p.n_decode == 1 && p.n_preempted == 1 && p.decode[0].slot != p.preempted[0].slot);
  anna_sched_commit(s, &p);
  anna_sched_free(s);
  /* at a block boundary: both need a fresh block, none is free; the estimate expects the
   * victim's 2 blocks back, the cache says it holds none of its own */
  s = two_decoding(8);
  anna_sched_plan_step(s, 0, &p);
  CHECK(p.n_decode == 1 && p.n_preempted == 1);
  anna_sched_free(s);
  s = two_decoding(8);
  for (int i = 0; i < 2; i++)
    anna_sched_seq_blocks(s, i, 1, 0);
  anna_sched_plan_step(s, 0, &p);
  CHECK(p.n_decode == 0 && p.n_preempted == 2);
  anna_sched_free(s);
  /* counts hold until the step is committed: afterwards the estimate is back */
  s = two_decoding(6);
  for (int i = 0; i < 2; i++)
    anna_sched_seq_blocks(s, i, 1, 0);
  anna_sched_plan_step(s, 2, &p);
  CHECK(p.n_decode == 2 && p.n_preempted == 0);
  anna_sched_commit(s, &p);
  anna_sched_plan_step(s, 0, &p);
  CHECK(p.n_decode == 2 && p.n_preempted == 0);
  anna_sched_free(s);
  /* a prompt chunk after a cached prefix: kv_next 0 (its partial block is its own) lets the
   * chunk fill that block without a copy */
  anna_sched_options o = opts(1, 64);
  o.block_len = 4;
  char err[128];
  CHECK(!anna_sched_create(&s, &o, err, sizeof err));
  anna_sched_seq_desc d = {ANNA_SCHED_KIND_TEXT, 12, NULL};
  uint64_t id;
  CHECK(!anna_sched_submit(s, &d, 1, 0, &id, err, sizeof err));
  const anna_sched_entry *adm;
  int n_adm;
  anna_sched_admit(s, 0, -1, &adm, &n_adm);
  anna_sched_seq_cached(s, 0, 6);
  anna_sched_plan_step(s, 1, &p); /* estimate: the copy takes the block */
  CHECK(p.n_prefill == 1 && p.prefill[0].n == 2);
  anna_sched_seq_blocks(s, 0, 0, 2);
  anna_sched_plan_step(s, 1, &p); /* the block is private: fill it and one more */
  CHECK(p.n_prefill == 1 && p.prefill[0].n == 6);
  anna_sched_free(s);
}

static void test_prefill_interval(void) {
  anna_sched_options o = opts(2, 64);
  o.prefill_interval_steps = 3;
  o.max_prefill_tokens = 4;
  sim m;
  sim_init(&m, &o, -1);
  int a = sim_submit(&m, 4, 100, 1);
  sim_admit(&m);
  anna_sched_plan p;
  sim_step(&m, &p); /* nothing decodes yet: a's prompt */
  sim_submit(&m, 20, 100, 1);
  sim_admit(&m);
  int with_prefill = 0;
  for (int k = 0; k < 9; k++) {
    sim_step(&m, &p);
    CHECK(p.n_decode >= 1 && p.decode[0].slot == m.r[a].slot); /* decodes are never starved */
    with_prefill += p.n_prefill > 0;
  }
  CHECK(with_prefill == 3);
  anna_sched_free(m.s);
}

static void test_kinds_and_wait(void) {
  anna_sched_options o = opts(4, 64);
  o.batch_wait_ms = 20;
  sim m;
  sim_init(&m, &o, -1);
  CHECK(anna_sched_wait_ms(m.s, 0) < 0);
  anna_sched_seq_desc d = {ANNA_SCHED_KIND_ENCODE, 4, NULL};
  uint64_t id;
  char err[128];
  CHECK(anna_sched_submit(m.s, &d, 1, 0, &id, err, sizeof err) == ANNA_EUNSUPPORTED);
  d.kind = ANNA_SCHED_KIND_TEXT;
  d.n_prompt = 0;
  CHECK(anna_sched_submit(m.s, &d, 1, 0, &id, err, sizeof err) == ANNA_EINVAL);
  CHECK(anna_sched_kind_decode_tokens(ANNA_SCHED_KIND_TEXT) == 1);
  CHECK(anna_sched_kind_decode_tokens(ANNA_SCHED_KIND_TTS) == 0);
  m.now = 100;
  sim_submit(&m, 4, 2, 1);
  CHECK(anna_sched_wait_ms(m.s, 105) == 15);
  CHECK(anna_sched_wait_ms(m.s, 121) == 0);
  sim_submit(&m, 4, 2, 3); /* max_batch_size waiting: no reason to wait */
  CHECK(anna_sched_wait_ms(m.s, 105) == 0);
  anna_sched_free(m.s);
}

static uint64_t rng = 88172645463325252ull;
static int rnd(int n) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (int)(rng % (uint64_t)n);
}

static void test_random(void) {
  int64_t preemptions = 0, cancels = 0, steps = 0;
  for (int round = 0; round < 40; round++) {
    anna_sched_options o = opts(1 + rnd(6), 0);
    o.n_batch = o.n_slots + 1 + rnd(64);
    o.max_batch_size = 1 + rnd(o.n_slots);
    o.max_prefill_tokens = rnd(3) ? rnd(40) : 0;
    o.max_decode_tokens = rnd(2) ? 20 + rnd(200) : 0;
    o.max_queue_wait_ms = rnd(2) ? rnd(50) : 0;
    o.prefill_interval_steps = rnd(4);
    o.block_len = rnd(3) ? 1 << rnd(5) : 0;
    const int max_len = 80;
    int64_t blocks = -1;
    if (o.block_len > 0 && rnd(3)) /* a tight pool: one full sequence and a bit */
      blocks = (max_len + o.block_len - 1) / o.block_len + rnd(3 * o.n_slots + 1);
    sim m;
    sim_init(&m, &o, blocks);
    const int n_req = 20 + rnd(60);
    int submitted = 0;
    while ((submitted < n_req || m.finished < m.n) && m.steps < 20000) {
      m.now += 1 + rnd(5);
      if (submitted < n_req && rnd(3) == 0) {
        int n = 1 + rnd(2), np = 1 + rnd(40);
        if (sim_submit(&m, np, 1 + rnd(max_len - np), n) >= 0) submitted++;
      }
      if (rnd(25) == 0 && m.n > 0) { /* cancel something still going */
        int k = rnd(m.n);
        if (!m.r[k].done && !m.r[k].cancelled) {
          CHECK(anna_sched_cancel(m.s, m.r[k].id) == 0);
          m.r[k].cancelled = 1;
        }
      }
      sim_admit(&m);
      for (int i = 0; i < o.n_slots; i++) /* the scheduler and the simulator agree */
        CHECK(anna_sched_slot_id(m.s, i) == (m.slot_req[i] < 0 ? 0 : m.r[m.slot_req[i]].id));
      CHECK(anna_sched_n_running(m.s) <= o.n_slots);
      sim_step(&m, NULL);
    }
    CHECK(m.finished == m.n); /* every request finishes */
    CHECK(anna_sched_n_running(m.s) == 0 && anna_sched_n_waiting(m.s) == 0);
    for (int k = 0; k < m.n; k++) {
      CHECK(m.r[k].done && (m.r[k].cancelled || m.r[k].gen == m.r[k].max_gen));
      preemptions += m.r[k].preempted;
      cancels += m.r[k].cancelled;
    }
    steps += m.steps;
    if (fails) {
      fprintf(stderr, "random round %d failed (slots %d batch %d blk %d pool %lld)\n", round,
              o.n_slots, o.n_batch, o.block_len, (long long)blocks);
      break;
    }
    anna_sched_free(m.s);
  }
  printf("random: %lld steps, %lld preemptions, %lld cancellations\n", (long long)steps,
         (long long)preemptions, (long long)cancels);
  CHECK(preemptions > 0 && cancels > 0); /* the runs did exercise both */
}

/* chunk_align (anna-serve --deterministic): a prompt is cut at the same places whatever else
 * runs: alone with a roomy batch, and beside other prompts and decodes in a tight one with a
 * small KV pool, request X gets the chunks [0,64) [64,128) [128,150); bad values are refused. */
static int chunks_of(int n_batch, int64_t n_blocks, int others, int32_t *pos, int32_t *len) {
  anna_sched_options o = opts(4, n_batch);
  o.chunk_align = 64;
  o.block_len = 16;
  sim m;
  sim_init(&m, &o, n_blocks);
  for (int k = 0; k < others; k++)
    sim_submit(&m, 37 + 29 * k, 40, 1);
  const int x = sim_submit(&m, 150, 3, 1);
  int n = 0;
  for (int step = 0; step < 400 && !m.r[x].done; step++) {
    sim_admit(&m);
    anna_sched_plan p;
    sim_step(&m, &p);
    for (int k = 0; k < p.n_prefill; k++) {
      CHECK(p.prefill[k].pos % 64 == 0);
      if (idx_of(&p.prefill[k]) == x && n < 8) pos[n] = p.prefill[k].pos, len[n++] = p.prefill[k].n;
    }
  }
  CHECK(m.r[x].done);
  anna_sched_free(m.s);
  return n;
}

static void test_chunk_align(void) {
  int32_t pa[8], la[8], pb[8], lb[8], pc[8], lc[8];
  const int na = chunks_of(512, -1, 0, pa, la);
  const int nb = chunks_of(68, -1, 3, pb, lb); /* 68 - 4 + 1 = 65: one aligned chunk per step at most */
  const int nc = chunks_of(100, 30, 3, pc, lc); /* 30 blocks of 16: chunks wait for blocks */
  CHECK(na == 3 && pa[0] == 0 && la[0] == 64 && pa[1] == 64 && la[1] == 64 && pa[2] == 128 && la[2] == 22);
  CHECK(nb == na && !memcmp(pa, pb, sizeof(int32_t) * 3) && !memcmp(la, lb, sizeof(int32_t) * 3));
  CHECK(nc == na && !memcmp(pa, pc, sizeof(int32_t) * 3) && !memcmp(la, lc, sizeof(int32_t) * 3));
  anna_sched_options o = opts(4, 66);
  anna_sched *s = NULL;
  char err[256] = "";
  o.chunk_align = 64;
  CHECK(anna_sched_create(&s, &o, err, sizeof err) == ANNA_EINVAL && !s && strstr(err, "chunk_align"));
  o = opts(4, 512);
  o.chunk_align = 64, o.max_prefill_tokens = 32;
  CHECK(anna_sched_create(&s, &o, err, sizeof err) == ANNA_EINVAL && !s);
  o.chunk_align = -1, o.max_prefill_tokens = 0;
  CHECK(anna_sched_create(&s, &o, err, sizeof err) == ANNA_EINVAL && !s);
}

int main(void) {
  test_fairness();
  test_budgets_and_chunks();
  test_queue_full();
  test_cancel();
  test_preemption();
  test_cache_block_counts();
  test_prefill_interval();
  test_kinds_and_wait();
  test_random();
  test_chunk_align();
  if (fails) {
    fprintf(stderr, "test_scheduler: %d checks failed\n", fails);
    return 1;
  }
  printf("test_scheduler: ok\n");
  return 0;
}
