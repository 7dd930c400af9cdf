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

enum { METRICS_DRAFTER_NGRAM, METRICS_DRAFTER_MTP, METRICS_N_DRAFTERS };

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
  /* speculative decoding per drafter (METRICS_DRAFTER_*): tokens drafted into verify
   * windows, and of them accepted */
  uint64_t spec_draft_tokens[METRICS_N_DRAFTERS], spec_accepted_tokens[METRICS_N_DRAFTERS];
} metrics;

void metrics_init(metrics *m);
void metrics_destroy(metrics *m);
void metrics_observe(metrics *m, metrics_histo *h, double ms);
/* Counts one finished request by status; 499 (client gone) counts as client_closed only. */
void metrics_count_response(metrics *m, int status);
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
