/* metrics.h: service counters and latency histograms of anna-serve, and its log lines.
 *
 * One metrics object per server, shared by the engine thread (token timings, batch sizes)
 * and the connection threads (request outcomes); every update takes its mutex, which is
 * cheap next to a decode step. Readers render snapshots: Prometheus text for /metrics, a
 * JSON object for /healthz. Histogram buckets are fixed (milliseconds), so quantiles are
 * bucket-interpolated estimates.
 */
#ifndef ANNA_SERVER_METRICS_H
#define ANNA_SERVER_METRICS_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

#define METRICS_NBUCKETS 16

/* Engine step phases (anna_engine_step_seconds{phase=...}): where the engine thread's time
 * goes, per step. idle: waiting for work before the step; sched: scheduler calls (admit,
 * drops, plan, commit) under the engine mutex; admit: starting admitted sequences (prompt
 * caches); assemble: building the batch; forward: the model calls (verify windows and
 * decode); sample: drawing tokens (candidates or full rows); detok: text pieces and stop
 * strings; publish: handing tokens and text to the requests (under their mutex) and the
 * per-token metrics; wake: waking their connections (once per step); finish: ending sequences; stats: the step's KV / cache bookkeeping; step: all but idle. */
enum {
  ENG_PH_IDLE,
  ENG_PH_SCHED,
  ENG_PH_ADMIT,
  ENG_PH_ASSEMBLE,
  ENG_PH_FORWARD,
  ENG_PH_SAMPLE,
  ENG_PH_DETOK,
  ENG_PH_PUBLISH,
  ENG_PH_WAKE,
  ENG_PH_FINISH,
  ENG_PH_STATS,
  ENG_PH_STEP,
  ENG_PH_COUNT
};
extern const char *const metrics_engine_phase_names[ENG_PH_COUNT];
/* Step kinds: only decode rows, decode rows and prompt rows, only prompt rows. */
enum { ENG_STEP_DECODE, ENG_STEP_MIXED, ENG_STEP_PREFILL, ENG_STEP_KINDS };
extern const char *const metrics_engine_kind_names[ENG_STEP_KINDS];
enum { METRICS_DRAFTER_NGRAM, METRICS_DRAFTER_MTP, METRICS_DRAFTER_DRAFT, METRICS_N_DRAFTERS };

typedef struct metrics_histo {
  uint64_t counts[METRICS_NBUCKETS + 1]; /* last: above the largest bound */
  uint64_t n;
  double sum_ms;
} metrics_histo;

typedef struct metrics {
  pthread_mutex_t mu;
  double t_start;
  metrics_histo ttft, itl, e2e, queue;
  uint64_t requests, responses_2xx, responses_4xx, responses_5xx, rejected_busy, cancelled;
  uint64_t responses_503; /* of responses_5xx: retry-worthy (Retry-After) */
  uint64_t client_closed; /* 499: the client left before the answer ended (not in 2xx/4xx/5xx) */
  uint64_t prompt_tokens, completion_tokens, decode_steps, batch_tokens, batch_seqs;
  uint64_t cache_lookups, cache_hits, cache_reused_tokens; /* any reuse (prefix or exact) */
  uint64_t exact_lookups, exact_hits;                      /* exact prompt cache */
  uint64_t prefix_hit_blocks, prefix_miss_blocks;          /* prefix pool: full prompt blocks */
  uint64_t prefix_hit_tokens, prefix_miss_tokens;          /* prompt tokens reused / computed */
  /* Engine steps (metrics_engine_step): phase times in ms over step-sized buckets (10 us to
   * 1 s), the forward time per step kind, decode / prompt rows per step (1 to 32768). */
  metrics_histo eng_phase[ENG_PH_COUNT], eng_fwd[ENG_STEP_KINDS], eng_rows_decode, eng_rows_prefill;
  uint64_t eng_steps[ENG_STEP_KINDS];
  uint64_t eng_forward_calls; /* model calls (a step with verify windows makes two) */
  uint64_t eng_graph_steps;   /* model calls replayed as CUDA graphs (0 on the CPU) */
  uint64_t eng_full_rows;     /* logits rows sampled whole on the host (not from candidates) */
  /* speculative decoding per drafter (METRICS_DRAFTER_*): tokens drafted into verify
   * windows, and of them accepted */
  uint64_t spec_draft_tokens[METRICS_N_DRAFTERS], spec_accepted_tokens[METRICS_N_DRAFTERS];
} metrics;

/* One engine step's record (metrics_engine_step). ph: seconds per phase (ENG_PH_STEP is
 * filled in by the engine as the sum of the non-idle phases). */
typedef struct metrics_step {
  double ph[ENG_PH_COUNT];
  int kind; /* ENG_STEP_*; -1: nothing ran (not counted) */
  int decode_rows, prefill_rows, forward_calls, graph_steps;
  int full_rows; /* sampled rows that came down whole (the rest: from the device's candidates) */
} metrics_step;
/* Records one step under one lock acquisition. */
void metrics_engine_step(metrics *m, const metrics_step *st);

void metrics_init(metrics *m);
void metrics_destroy(metrics *m);
void metrics_observe(metrics *m, metrics_histo *h, double ms);
/* Counts one finished request by status; 499 (client gone) counts as client_closed only. */
void metrics_count_response(metrics *m, int status);
/* A private histogram (no lock: the caller's own), merged later with metrics_histo_merge. */
void metrics_histo_note(metrics_histo *h, double ms);
/* Adds src into dst under the lock and empties src; counter += *add, then *add = 0 (both
 * optional: NULL). The engine batches its per-token observations this way: one lock per step
 * instead of two per token. */
void metrics_histo_merge(metrics *m, metrics_histo *dst, metrics_histo *src, uint64_t *counter, uint64_t *add);
/* Adds to a counter under the lock. */
void metrics_add(metrics *m, uint64_t *counter, uint64_t v);
/* A bucket-interpolated quantile (q in [0,1]) of a histogram, in ms; 0 when empty. Call
 * with m->mu held or on a copy. */
double metrics_quantile(const metrics_histo *h, double q);
/* Snapshot as JSON (caller decrefs). */
json_t *metrics_json(metrics *m);
/* Prometheus text exposition of the counters and histograms; appended to the gauges the
 * caller writes. Caller frees. */
char *metrics_prometheus(metrics *m, const char *gauges);

/* Logging: one line per event, text or JSON (--log-format). rid may be NULL. */
enum slog_level { SLOG_DEBUG, SLOG_INFO, SLOG_WARN, SLOG_ERROR };
void slog_configure(int json, int min_level);
void slog(int level, const char *rid, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Same, with structured fields (an object, stolen; may be NULL) that JSON lines carry as
 * top-level keys; text lines show only the message. */
void slog_fields(int level, const char *rid, json_t *fields, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
