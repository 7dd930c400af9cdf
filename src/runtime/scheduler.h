/* scheduler.h: the continuous-batching policy, as a pure module.
 *
 * Contract: the scheduler decides which sequences run and what each feeds in a step; it never
 * touches a model context, a socket or a clock, and never sleeps. Times come in as numbers
 * (milliseconds on any monotonic clock), cache capacity as a count of free KV blocks. The
 * caller (anna-serve's engine, a test) executes what it is told and reports back:
 *
 *   sched_submit            queue sequences (all or nothing; ANNA_ERANGE: the queue is full)
 *   sched_wait_ms           an idle caller may wait this long for company (batch_wait_ms)
 *   sched_admit             waiting sequences -> free slots (context sequence ids 0..n_slots-1)
 *   sched_drop_next         cancelled sequences, one at a time (their slot is free again)
 *   sched_seq_cached        after admission: prompt tokens a cache already holds (not fed)
 *   sched_plan              one step: a decode token per running sequence, prompt chunks,
 *                           preemptions when a decode needs a KV block and none is free
 *   sched_commit            the step ran: its tokens are in the cache
 *   sched_seq_token         a running sequence produced a token (it decodes from now on)
 *   sched_seq_finish        a running sequence ended (any reason): its slot is free
 *
 * A preempted sequence loses its slot (the caller resets that context sequence) and goes back
 * to the front of the queue with its generated tokens counted: when admitted again, its
 * input is prompt + generated tokens, recomputed as a prompt, and the logits of the last one
 * give its next token. Not thread-safe: the caller serializes every call (the engine holds its
 * mutex). Nothing here allocates after sched_create except sched_submit (one record per
 * sequence, freed when it finishes or is dropped).
 */
#ifndef ANNA_RUNTIME_SCHEDULER_H
#define ANNA_RUNTIME_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

/* Request kinds. Only SCHED_KIND_TEXT is scheduled today; the others are the next kinds the
 * runtime serves and are refused by sched_submit (ANNA_EUNSUPPORTED) until they are implemented.
 * Each kind has a per-step decode token cost (sched_kind_decode_tokens). */
typedef enum sched_kind {
  SCHED_KIND_TEXT = 0, /* text generation: prompt prefill, then one token per decode step */
  SCHED_KIND_ENCODE, /* next: encode-only (embeddings, image/audio encoders): prefill, no decode */
  SCHED_KIND_ASR,    /* next: audio encoder prefill, then text decode */
  SCHED_KIND_TTS,    /* next: text prefill, then a stream of audio-codec tokens per step */
  SCHED_KIND_COUNT
} sched_kind;

/* Decode tokens one step feeds for a sequence of this kind (0: the kind does not decode or is
 * not implemented). */
int sched_kind_decode_tokens(sched_kind k);

typedef struct sched_options {
  int n_slots;                /* sequence slots (>= 1) */
  int n_batch;                /* tokens per step (>= n_slots + 1, as the context's n_batch) */
  int max_batch_size;         /* running sequences (<= n_slots; out of range: n_slots) */
  int max_prefill_tokens;     /* prompt tokens per step (0: what the step has room for) */
  int max_decode_tokens;      /* cached tokens over one step's decode sequences (0: off) */
  int max_waiting;            /* queued sequences before sched_submit refuses (0: off) */
  int max_queue_wait_ms;      /* a waiter older than this is admitted beyond max_batch_size */
  int prefill_interval_steps; /* while sequences decode, prompt chunks every N steps (<= 1: each) */
  int batch_wait_ms;          /* an idle scheduler waits this long for company (0: off) */
  int block_len;              /* KV block length (<= 0: no block accounting) */
} sched_options;

typedef struct sched_seq_desc {
  sched_kind kind;
  int32_t n_prompt; /* prompt tokens (>= 1) */
  void *user;       /* borrowed; handed back in every entry about this sequence */
} sched_seq_desc;

/* One sequence's part of an admission, a drop, a step or a preemption. */
typedef struct sched_entry {
  uint64_t id;
  void *user;
  int slot;    /* context sequence; -1: a dropped sequence that never ran */
  int32_t pos; /* first position this step feeds (admission: tokens generated so far) */
  int32_t n;   /* tokens this step feeds (admission: input length: prompt [+ generated]) */
  int want;    /* the logits of this entry's last token are needed */
} sched_entry;

/* A step. Arrays are owned by the scheduler and valid until the next sched_plan. Decodes come
 * first (in rotating slot order), then prompt chunks (in admission order); the caller lays
 * the batch out in that order. */
typedef struct sched_plan {
  const sched_entry *decode;
  int n_decode;
  const sched_entry *prefill;
  int n_prefill;
  const sched_entry *preempted; /* reset these slots before running the step */
  int n_preempted;
  int n_tokens; /* decode + prefill tokens */
} sched_plan;

typedef struct sched sched;

/* Caller frees with sched_free. */
int sched_create(sched **out, const sched_options *o, char *err, size_t errlen);
void sched_free(sched *s);

/* Queues n sequences arriving at now_ms; their ids are *first_id .. *first_id + n - 1.
 * ANNA_ERANGE: max_waiting sequences are already waiting (nothing queued); ANNA_EUNSUPPORTED: a
 * kind that is not implemented yet; ANNA_EINVAL: an empty prompt; ANNA_ENOMEM. */
int sched_submit(sched *s, const sched_seq_desc *d, int n, double now_ms, uint64_t *first_id,
                 char *err, size_t errlen);
/* Marks a waiting or running sequence cancelled; it comes out of sched_drop_next after the
 * next sched_admit. Returns 0, or ANNA_ENOTFOUND for an id neither queued nor running. */
int sched_cancel(sched *s, uint64_t id);
/* Cancels everything queued or running (shutdown). */
void sched_cancel_all(sched *s);

int sched_n_waiting(const sched *s); /* queued, cancelled ones included until dropped */
int sched_n_running(const sched *s);

/* With nothing running: -1 nothing waits; > 0 the milliseconds an idle caller may still wait
 * for more requests before the first step (batch_wait_ms); 0 plan now. */
double sched_wait_ms(const sched *s, double now_ms);

/* Moves waiting sequences into free slots (least recently used first): up to max_batch_size
 * running, more only for a waiter older than max_queue_wait_ms, in queue order, each only
 * when kv_free_blocks (< 0: unlimited) covers its first prompt chunk. Cancelled sequences
 * (waiting or running) move to the drop list. *adm / *n_adm: the admitted entries (slot, n =
 * input length, pos = tokens generated before a preemption), valid until the next call. */
int sched_admit(sched *s, double now_ms, int64_t kv_free_blocks, const sched_entry **adm,
                int *n_adm);
/* Pops one cancelled sequence into *out (slot >= 0: it was running, that slot is free now).
 * Returns 1 while there was one, else 0. */
int sched_drop_next(sched *s, sched_entry *out);
/* After admission: the first n input tokens of slot's sequence are already cached. */
void sched_seq_cached(sched *s, int slot, int32_t n);

/* Plans one step under the token budgets. kv_free_blocks (free + evictable; < 0: unlimited):
 * a decode that starts a new block needs one; if they run out, the most recently admitted
 * running sequence is preempted (repeatedly) until the rest fit; prompt chunks are cut to
 * the blocks left. The plan may be empty. */
void sched_plan_step(sched *s, int64_t kv_free_blocks, sched_plan *p);
/* The step ran: prompt chunks and decode tokens are in the cache. */
void sched_commit(sched *s, const sched_plan *p);
/* Slot's sequence produced a token (from its last prompt chunk's or a decode's logits). */
void sched_seq_token(sched *s, int slot);
/* Slot's sequence ended (stop, length, error, cancel): its record is freed, the slot is free. */
void sched_seq_finish(sched *s, int slot);

/* Introspection for tests and stats: slot's sequence id (0: free), its tokens in the cache,
 * and its generated token count. */
uint64_t sched_slot_id(const sched *s, int slot);
int32_t sched_slot_cached(const sched *s, int slot);
int32_t sched_slot_generated(const sched *s, int slot);

#endif
