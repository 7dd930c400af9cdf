/* scheduler.c: the continuous-batching policy (contract: anna.h, "Scheduler"). */
#include "anna/anna.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

enum { SEQ_WAITING, SEQ_RUNNING, SEQ_DROPPED };

typedef struct sseq {
  uint64_t id;
  void *user;
  anna_sched_kind kind;
  int state, slot, cancelled, decoding;
  int cow;     /* the first chunk after a cached prefix may copy a shared, partly filled block */
  int planned; /* already has a prompt chunk in the step being planned */
  int kv_known; /* kv_next / kv_held are the cache's numbers (anna_sched_seq_blocks) until the
                   next commit; else the estimate (blocks started, cow) is used */
  int64_t kv_next, kv_held;
  int32_t n_prompt; /* the request's prompt */
  int32_t n_input;  /* what must be fed before decoding: prompt (+ generated after preemption) */
  int32_t n_fed;    /* tokens in the cache (prompt chunks and decode tokens) */
  int32_t n_gen;    /* tokens generated (kept across a preemption) */
  int64_t order;    /* admission order: prefill is first come, first served */
  double t_queued;
  struct sseq *prev, *next;
} sseq;

struct anna_sched {
  anna_sched_options o;
  sseq *head, *tail; /* waiting, oldest (or preempted) first */
  int n_waiting, n_running;
  sseq **run;          /* [n_slots]: the sequence in each slot, NULL: free */
  uint64_t *last_used; /* [n_slots]: release tick (a free slot is picked least recently used) */
  uint64_t tick, next_id;
  int64_t admitted;
  sseq *drop; /* cancelled, singly linked through next */
  int rr, steps_since_prefill;
  anna_sched_entry *adm, *dec, *pre, *pmt; /* [n_slots] each */
};

int anna_sched_kind_decode_tokens(anna_sched_kind k) {
  /* Only text generation decodes today; the "next" kinds get their costs with their code. */
  return k == ANNA_SCHED_KIND_TEXT ? 1 : 0;
}

int anna_sched_create(anna_sched **out, const anna_sched_options *o, char *err, size_t errlen) {
  *out = NULL;
  anna_sched *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory for the scheduler");
  s->o = *o;
  if (s->o.n_slots < 1) s->o.n_slots = 1;
  if (s->o.n_batch < s->o.n_slots + 1) s->o.n_batch = s->o.n_slots + 1;
  if (s->o.max_batch_size < 1 || s->o.max_batch_size > s->o.n_slots)
    s->o.max_batch_size = s->o.n_slots;
  const int A = s->o.chunk_align, room = s->o.n_batch - s->o.n_slots + 1;
  if (A < 0 || A > room || (s->o.max_prefill_tokens > 0 && A > s->o.max_prefill_tokens)) {
    const int pre = s->o.max_prefill_tokens, nb = s->o.n_batch;
    free(s);
    return anna_err(err, errlen, ANNA_EINVAL,
                    "scheduler: chunk_align %d must be 0 or 1..%d (the batch of %d tokens less a decode token per other "
                    "slot%s)",
                    A, pre > 0 && pre < room ? pre : room, nb, pre > 0 ? ", and the prefill budget" : "");
  }
  const size_t S = (size_t)s->o.n_slots;
  s->run = calloc(S, sizeof *s->run);
  s->last_used = calloc(S, sizeof *s->last_used);
  s->adm = calloc(S, sizeof *s->adm);
  s->dec = calloc(S, sizeof *s->dec);
  s->pre = calloc(S, sizeof *s->pre);
  s->pmt = calloc(S, sizeof *s->pmt);
  s->next_id = 1;
  if (!s->run || !s->last_used || !s->adm || !s->dec || !s->pre || !s->pmt) {
    anna_sched_free(s);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory for the scheduler");
  }
  *out = s;
  return 0;
}

void anna_sched_free(anna_sched *s) {
  if (!s) return;
  for (sseq *q = s->head, *nx; q; q = nx) {
    nx = q->next;
    free(q);
  }
  for (sseq *q = s->drop, *nx; q; q = nx) {
    nx = q->next;
    free(q);
  }
  for (int i = 0; s->run && i < s->o.n_slots; i++)
    free(s->run[i]);
  free(s->run);
  free(s->last_used);
  free(s->adm);
  free(s->dec);
  free(s->pre);
  free(s->pmt);
  free(s);
}

static void queue_unlink(anna_sched *s, sseq *q) {
  if (q->prev)
    q->prev->next = q->next;
  else
    s->head = q->next;
  if (q->next)
    q->next->prev = q->prev;
  else
    s->tail = q->prev;
  q->prev = q->next = NULL;
  s->n_waiting--;
}

static void queue_push_front(anna_sched *s, sseq *q) {
  q->prev = NULL;
  q->next = s->head;
  if (s->head)
    s->head->prev = q;
  else
    s->tail = q;
  s->head = q;
  s->n_waiting++;
}

int anna_sched_submit(anna_sched *s, const anna_sched_seq_desc *d, int n, double now_ms,
                      uint64_t *first_id, char *err, size_t errlen) {
  if (n < 1) return anna_err(err, errlen, ANNA_EINVAL, "no sequences to schedule");
  for (int k = 0; k < n; k++) {
    if (d[k].kind < 0 || d[k].kind >= ANNA_SCHED_KIND_COUNT)
      return anna_err(err, errlen, ANNA_EINVAL, "unknown request kind %d", (int)d[k].kind);
    if (anna_sched_kind_decode_tokens(d[k].kind) == 0)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED, "request kind %d is not implemented yet",
                      (int)d[k].kind);
    if (d[k].n_prompt < 1) return anna_err(err, errlen, ANNA_EINVAL, "the prompt is empty");
  }
  if (s->o.max_waiting > 0 && s->n_waiting >= s->o.max_waiting)
    return anna_err(err, errlen, ANNA_ERANGE, "%d sequences are waiting", s->n_waiting);
  sseq *first = NULL, *last = NULL;
  for (int k = 0; k < n; k++) {
    sseq *q = calloc(1, sizeof *q);
    if (!q) {
      while (first) {
        sseq *nx = first->next;
        free(first);
        first = nx;
      }
      return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    }
    q->id = s->next_id + (uint64_t)k;
    q->user = d[k].user;
    q->kind = d[k].kind;
    q->state = SEQ_WAITING;
    q->slot = -1;
    q->n_prompt = q->n_input = d[k].n_prompt;
    q->t_queued = now_ms;
    q->prev = last;
    if (last)
      last->next = q;
    else
      first = q;
    last = q;
  }
  first->prev = s->tail;
  if (s->tail)
    s->tail->next = first;
  else
    s->head = first;
  s->tail = last;
  s->n_waiting += n;
  *first_id = s->next_id;
  s->next_id += (uint64_t)n;
  return 0;
}

int anna_sched_cancel(anna_sched *s, uint64_t id) {
  for (int i = 0; i < s->o.n_slots; i++)
    if (s->run[i] && s->run[i]->id == id) return s->run[i]->cancelled = 1, 0;
  for (sseq *q = s->head; q; q = q->next)
    if (q->id == id) return q->cancelled = 1, 0;
  return ANNA_ENOTFOUND;
}

void anna_sched_cancel_all(anna_sched *s) {
  for (int i = 0; i < s->o.n_slots; i++)
    if (s->run[i]) s->run[i]->cancelled = 1;
  for (sseq *q = s->head; q; q = q->next)
    q->cancelled = 1;
}

int anna_sched_n_waiting(const anna_sched *s) {
  return s->n_waiting;
}

int anna_sched_n_running(const anna_sched *s) {
  return s->n_running;
}

double anna_sched_wait_ms(const anna_sched *s, double now_ms) {
  if (!s->head) return -1;
  /* An idle engine may wait a little for company, so the first step is shared. */
  const double age = now_ms - s->head->t_queued;
  if (s->o.batch_wait_ms > 0 && s->n_waiting < s->o.max_batch_size && age < s->o.batch_wait_ms)
    return s->o.batch_wait_ms - age;
  return 0;
}

static int32_t ceil_div(int64_t a, int64_t b) {
  return (int32_t)((a + b - 1) / b);
}

/* Blocks a chunk of n >= 1 tokens from position p allocates: the blocks it starts, plus
 * `extra` (seq_extra). */
static int64_t chunk_blocks(const anna_sched *s, int32_t p, int32_t n, int64_t extra) {
  const int b = s->o.block_len;
  return ceil_div((int64_t)p + n, b) - ceil_div(p, b) + extra;
}

/* What q's next chunk takes beyond the blocks it starts. From the cache's count for one token
 * (kv_next: copies of shared blocks included): that count less the block a token at a block
 * boundary starts. Without it, the estimate: one copy when a prompt chunk continues a cached
 * prefix inside a block (cow), nothing for a decode. */
static int64_t seq_extra(const anna_sched *s, const sseq *q, int decode) {
  const int b = s->o.block_len;
  if (q->kv_known) return q->kv_next - (q->n_fed % b == 0 ? 1 : 0);
  return !decode && q->cow && q->n_fed % b ? 1 : 0;
}

static void slot_release(anna_sched *s, int i) {
  s->run[i] = NULL;
  s->last_used[i] = ++s->tick;
  s->n_running--;
}

static void entry_of(const sseq *q, anna_sched_entry *e, int32_t pos, int32_t n, int want) {
  e->id = q->id;
  e->user = q->user;
  e->slot = q->slot;
  e->pos = pos;
  e->n = n;
  e->want = want;
}

static void drop_push(anna_sched *s, sseq *q) {
  q->state = SEQ_DROPPED;
  q->prev = NULL;
  q->next = s->drop;
  s->drop = q;
}

int anna_sched_admit(anna_sched *s, double now_ms, int64_t kv_free_blocks,
                     const anna_sched_entry **adm, int *n_adm) {
  const int S = s->o.n_slots;
  const int n_free = S - s->n_running;
  const int chunk_cap = s->o.max_prefill_tokens > 0 ? s->o.max_prefill_tokens : s->o.n_batch;
  int64_t kv = kv_free_blocks;
  int n = 0;
  sseq *q = s->head;
  while (q && n < n_free) {
    sseq *nx = q->next;
    if (!q->cancelled) {
      const int force = s->o.max_queue_wait_ms > 0 && now_ms - q->t_queued > s->o.max_queue_wait_ms;
      if (s->n_running + n >= s->o.max_batch_size && !force) break;
      /* Only when the first chunk's blocks are there; with nothing running, take it anyway:
       * nothing will free blocks by waiting. */
      if (s->o.block_len > 0 && kv >= 0 && s->n_running + n > 0) {
        const int32_t chunk = q->n_input < chunk_cap ? q->n_input : chunk_cap;
        const int64_t need = chunk_blocks(s, 0, chunk, 0); /* estimate: not attached yet */
        if (need > kv) break;
        kv -= need;
      }
    }
    queue_unlink(s, q);
    if (q->cancelled) {
      drop_push(s, q);
    } else {
      int best = -1;
      for (int i = 0; i < S; i++)
        if (!s->run[i] && (best < 0 || s->last_used[i] < s->last_used[best])) best = i;
      q->state = SEQ_RUNNING;
      q->slot = best;
      q->n_fed = 0;
      q->decoding = 0;
      q->cow = 0;
      q->kv_known = 0;
      q->order = s->admitted++;
      s->run[best] = q;
      entry_of(q, &s->adm[n], q->n_gen, q->n_input, 0);
      n++;
    }
    q = nx;
  }
  s->n_running += n;
  /* Cancelled waiters anywhere in the queue, then cancelled running sequences. */
  for (q = s->head; q;) {
    sseq *nx = q->next;
    if (q->cancelled) {
      queue_unlink(s, q);
      drop_push(s, q);
    }
    q = nx;
  }
  for (int i = 0; i < S; i++)
    if (s->run[i] && s->run[i]->cancelled) {
      sseq *r = s->run[i];
      slot_release(s, i);
      drop_push(s, r);
    }
  *adm = s->adm;
  *n_adm = n;
  return n;
}

int anna_sched_drop_next(anna_sched *s, anna_sched_entry *out) {
  sseq *q = s->drop;
  if (!q) return 0;
  s->drop = q->next;
  entry_of(q, out, q->n_fed, 0, 0);
  free(q);
  return 1;
}

void anna_sched_seq_cached(anna_sched *s, int slot, int32_t n) {
  sseq *q = slot >= 0 && slot < s->o.n_slots ? s->run[slot] : NULL;
  if (!q || n < 0) return;
  q->n_fed = n < q->n_input ? n : q->n_input;
  q->cow = s->o.block_len > 0 && q->n_fed % s->o.block_len != 0;
  q->kv_known = 0;
}

void anna_sched_seq_blocks(anna_sched *s, int slot, int64_t next_blocks, int64_t held_blocks) {
  sseq *q = slot >= 0 && slot < s->o.n_slots ? s->run[slot] : NULL;
  if (!q || next_blocks < 0 || held_blocks < 0) return;
  q->kv_known = 1;
  q->kv_next = next_blocks;
  q->kv_held = held_blocks;
}

/* Preempts the most recently admitted running sequence: its slot is released, and it returns
 * to the front of the queue to recompute prompt + generated tokens. Returns the blocks its
 * cache held (they come back, as free or evictable, when the caller resets the slot). */
static int64_t preempt_one(anna_sched *s, int *n_pmt) {
  sseq *v = NULL;
  for (int i = 0; i < s->o.n_slots; i++)
    if (s->run[i] && (!v || s->run[i]->order > v->order)) v = s->run[i];
  if (!v) return -1;
  /* The cache's count leaves out blocks other sequences (other choices, the exact prompt
   * cache) still hold after the reset; the estimate assumes all come back. */
  const int64_t held = s->o.block_len <= 0 ? 0
                       : v->kv_known       ? v->kv_held
                                           : ceil_div(v->n_fed, s->o.block_len);
  entry_of(v, &s->pmt[(*n_pmt)++], v->n_fed, 0, 0);
  slot_release(s, v->slot);
  v->state = SEQ_WAITING;
  v->slot = -1;
  v->n_input = v->n_prompt + v->n_gen;
  v->n_fed = 0;
  v->decoding = 0;
  v->cow = 0;
  v->kv_known = 0;
  queue_push_front(s, v);
  return held;
}

/* One attempt at a step from the current running set; see anna_sched_plan_step. */
static int plan_once(anna_sched *s, int64_t kv, int *nd_out, int *np_out, int *npm,
                     int64_t *kv_back) {
  const int S = s->o.n_slots, blk = s->o.block_len;
  int nd = 0, np = 0, ntok = 0;
  const int64_t dec_budget = s->o.max_decode_tokens > 0 ? s->o.max_decode_tokens : INT64_MAX;
  /* Decodes first (one token each, under the decode budget, rotating the start so a tight
   * budget still serves everyone). When the blocks they start are not there, preempt the
   * most recently admitted sequence and try again. */
  for (;;) {
    int64_t used = 0, need = 0;
    nd = ntok = 0;
    for (int k = 0; k < S; k++) {
      const int i = (s->rr + k) % S;
      sseq *q = s->run[i];
      if (!q || !q->decoding) continue;
      const int c = anna_sched_kind_decode_tokens(q->kind);
      const int64_t L = (int64_t)q->n_fed + c; /* cached tokens with this step's */
      if (used > 0 && used + L > dec_budget) continue;
      used += L;
      entry_of(q, &s->dec[nd++], q->n_fed, c, 1);
      ntok += c;
      if (blk > 0) need += chunk_blocks(s, q->n_fed, c, seq_extra(s, q, 1));
    }
    if (kv < 0 || need <= kv) {
      if (kv >= 0) kv -= need;
      break;
    }
    const int64_t back = preempt_one(s, npm);
    if (back < 0) break;
    kv += back;
    *kv_back += back;
  }
  s->rr = (s->rr + 1) % S;
  int budget = s->o.max_prefill_tokens > 0 ? s->o.max_prefill_tokens : s->o.n_batch;
  if (budget > s->o.n_batch - ntok) budget = s->o.n_batch - ntok;
  /* Prompt chunks every N-th step only, so running decodes keep a steady pace; with nothing
   * decoding there is nothing to protect. */
  if (nd > 0 && s->o.prefill_interval_steps > 1 &&
      ++s->steps_since_prefill < s->o.prefill_interval_steps)
    budget = 0;
  for (int i = 0; i < S; i++)
    if (s->run[i]) s->run[i]->planned = 0;
  while (budget > 0) {
    sseq *best = NULL;
    for (int i = 0; i < S; i++) {
      sseq *q = s->run[i];
      if (!q || q->decoding || q->planned || q->n_fed >= q->n_input) continue;
      if (!best || q->order < best->order) best = q;
    }
    if (!best) break;
    int32_t take = best->n_input - best->n_fed;
    const int32_t A = s->o.chunk_align;
    if (A > 0) { /* the aligned chunk whole, or nothing this step */
      const int32_t end = (best->n_fed / A + 1) * A;
      if (end < best->n_input) take = end - best->n_fed;
      if (take > budget) {
        best->planned = 1;
        continue;
      }
    }
    if (take > budget) take = budget;
    if (kv >= 0) { /* cut the chunk to the blocks left */
      const int32_t pos = best->n_fed;
      const int64_t x = seq_extra(s, best, 0), extra = kv - x;
      const int64_t room = extra < 0 ? 0 : ((int64_t)ceil_div(pos, blk) + extra) * blk - pos;
      if (A > 0 && take > room) {
        best->planned = 1;
        continue;
      }
      if (take > room) take = (int32_t)room;
      if (take <= 0) break;
      kv -= chunk_blocks(s, pos, take, x);
    }
    best->planned = 1;
    entry_of(best, &s->pre[np++], best->n_fed, take, best->n_fed + take == best->n_input);
    s->steps_since_prefill = 0;
    budget -= take;
    ntok += take;
  }
  *nd_out = nd;
  *np_out = np;
  return ntok;
}

void anna_sched_plan_step(anna_sched *s, int64_t kv_free_blocks, anna_sched_plan *p) {
  int64_t kv = s->o.block_len > 0 ? kv_free_blocks : -1;
  int nd = 0, np = 0, npm = 0, ntok = 0;
  const int rr = s->rr, since = s->steps_since_prefill;
  for (;;) {
    int64_t back = 0;
    ntok = plan_once(s, kv, &nd, &np, &npm, &back);
    kv = kv >= 0 ? kv + back : kv;
    /* Running sequences that all wait for blocks (prompts cut to nothing) would wait for
     * each other forever: the most recently admitted one makes room. */
    if (ntok > 0 || kv < 0 || s->n_running <= 1) break;
    s->rr = rr;
    s->steps_since_prefill = since;
    const int64_t b = preempt_one(s, &npm);
    if (b < 0) break;
    kv += b;
  }
  p->decode = s->dec;
  p->n_decode = nd;
  p->prefill = s->pre;
  p->n_prefill = np;
  p->preempted = s->pmt;
  p->n_preempted = npm;
  p->n_tokens = ntok;
}

static sseq *slot_seq(const anna_sched *s, int slot, uint64_t id) {
  if (slot < 0 || slot >= s->o.n_slots || !s->run[slot]) return NULL;
  return id == 0 || s->run[slot]->id == id ? s->run[slot] : NULL;
}

void anna_sched_commit(anna_sched *s, const anna_sched_plan *p) {
  /* The step changed the cache: the caller's block counts are stale. */
  for (int i = 0; i < s->o.n_slots; i++)
    if (s->run[i]) s->run[i]->kv_known = 0;
  for (int k = 0; k < p->n_decode; k++) {
    sseq *q = slot_seq(s, p->decode[k].slot, p->decode[k].id);
    if (q) q->n_fed += p->decode[k].n;
  }
  for (int k = 0; k < p->n_prefill; k++) {
    sseq *q = slot_seq(s, p->prefill[k].slot, p->prefill[k].id);
    if (q) q->n_fed += p->prefill[k].n, q->cow = 0;
  }
}

void anna_sched_seq_token(anna_sched *s, int slot) {
  sseq *q = slot_seq(s, slot, 0);
  if (!q) return;
  q->n_gen++;
  q->decoding = 1;
}

void anna_sched_seq_finish(anna_sched *s, int slot) {
  sseq *q = slot_seq(s, slot, 0);
  if (!q) return;
  slot_release(s, slot);
  free(q);
}

uint64_t anna_sched_slot_id(const anna_sched *s, int slot) {
  const sseq *q = slot_seq(s, slot, 0);
  return q ? q->id : 0;
}

int32_t anna_sched_slot_cached(const anna_sched *s, int slot) {
  const sseq *q = slot_seq(s, slot, 0);
  return q ? q->n_fed : 0;
}

int32_t anna_sched_slot_generated(const anna_sched *s, int slot) {
  const sseq *q = slot_seq(s, slot, 0);
  return q ? q->n_gen : 0;
}
