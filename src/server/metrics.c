/* metrics.c: counters, histograms and log lines (see metrics.h). */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const double BOUNDS_MS[METRICS_NBUCKETS] = {
    1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void metrics_init(metrics *m) {
  memset(m, 0, sizeof *m);
  pthread_mutex_init(&m->mu, NULL);
  m->t_start = now_s();
}

void metrics_destroy(metrics *m) {
  pthread_mutex_destroy(&m->mu);
}

void metrics_observe(metrics *m, metrics_histo *h, double ms) {
  if (!(ms >= 0)) ms = 0;
  int b = 0;
  while (b < METRICS_NBUCKETS && ms > BOUNDS_MS[b])
    b++;
  pthread_mutex_lock(&m->mu);
  h->counts[b]++;
  h->n++;
  h->sum_ms += ms;
  pthread_mutex_unlock(&m->mu);
}

void metrics_add(metrics *m, uint64_t *counter, uint64_t v) {
  pthread_mutex_lock(&m->mu);
  *counter += v;
  pthread_mutex_unlock(&m->mu);
}

void metrics_count_response(metrics *m, int status) {
  pthread_mutex_lock(&m->mu);
  m->requests++;
  if (status == 499) /* the client went away: no response to class */
    m->client_closed++;
  else if (status < 300)
    m->responses_2xx++;
  else if (status < 500)
    m->responses_4xx++;
  else
    m->responses_5xx++;
  if (status == 429) m->rejected_busy++;
  if (status == 503) m->responses_503++;
  pthread_mutex_unlock(&m->mu);
}

double metrics_quantile(const metrics_histo *h, double q) {
  if (!h->n) return 0;
  double target = q * (double)h->n, acc = 0;
  for (int b = 0; b <= METRICS_NBUCKETS; b++) {
    double c = (double)h->counts[b];
    if (c > 0 && acc + c >= target) {
      double lo = b ? BOUNDS_MS[b - 1] : 0;
      double hi = b < METRICS_NBUCKETS ? BOUNDS_MS[b] : BOUNDS_MS[METRICS_NBUCKETS - 1] * 2;
      return lo + (hi - lo) * ((target - acc) / c);
    }
    acc += c;
  }
  return BOUNDS_MS[METRICS_NBUCKETS - 1];
}

static json_t *histo_json(const metrics_histo *h) {
  json_t *buckets = json_array();
  for (int b = 0; b <= METRICS_NBUCKETS; b++) {
    json_t *e = json_object();
    if (b < METRICS_NBUCKETS)
      json_object_set_new(e, "le_ms", json_real(BOUNDS_MS[b]));
    else
      json_object_set_new(e, "le_ms", json_string("+Inf"));
    json_object_set_new(e, "count", json_integer((json_int_t)h->counts[b]));
    json_array_append_new(buckets, e);
  }
  return json_pack("{s:I,s:f,s:f,s:f,s:f,s:o}", "count", (json_int_t)h->n, "mean_ms",
                   h->n ? h->sum_ms / (double)h->n : 0.0, "p50_ms", metrics_quantile(h, 0.5),
                   "p90_ms", metrics_quantile(h, 0.9), "p99_ms", metrics_quantile(h, 0.99),
                   "buckets", buckets);
}

json_t *metrics_json(metrics *m) {
  pthread_mutex_lock(&m->mu);
  metrics c = *m;
  pthread_mutex_unlock(&m->mu);
  return json_pack(
      "{s:f,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:o,s:o,s:o,s:o}", "uptime_s",
      now_s() - c.t_start, "requests", (json_int_t)c.requests, "responses_2xx",
      (json_int_t)c.responses_2xx, "responses_4xx", (json_int_t)c.responses_4xx, "responses_5xx",
      (json_int_t)c.responses_5xx, "responses_503", (json_int_t)c.responses_503, "client_closed",
      (json_int_t)c.client_closed, "rejected_busy", (json_int_t)c.rejected_busy, "cancelled",
      (json_int_t)c.cancelled, "prompt_tokens", (json_int_t)c.prompt_tokens, "completion_tokens",
      (json_int_t)c.completion_tokens, "decode_steps", (json_int_t)c.decode_steps,
      "mean_batch_seqs", c.decode_steps ? (double)c.batch_seqs / (double)c.decode_steps : 0.0,
      "ttft", histo_json(&c.ttft), "itl", histo_json(&c.itl), "e2e", histo_json(&c.e2e),
      "queue_wait", histo_json(&c.queue));
}

typedef struct sbuf {
  char *s;
  size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    size_t room = b->cap - b->len;
    int k = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? room : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (b->s && (size_t)k < room) {
      b->len += (size_t)k;
      return;
    }
    size_t nc = (b->cap + (size_t)k + 1) * 2;
    char *ns = realloc(b->s, nc);
    if (!ns) return;
    b->s = ns;
    b->cap = nc;
  }
}

static void prom_histo(sbuf *b, const char *name, const char *help, const metrics_histo *h) {
  sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  uint64_t acc = 0;
  for (int i = 0; i < METRICS_NBUCKETS; i++) {
    acc += h->counts[i];
    sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, BOUNDS_MS[i] / 1000.0,
              (unsigned long long)acc);
  }
  acc += h->counts[METRICS_NBUCKETS];
  sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
            (unsigned long long)acc, name, h->sum_ms / 1000.0, name, (unsigned long long)h->n);
}

char *metrics_prometheus(metrics *m, const char *gauges) {
  pthread_mutex_lock(&m->mu);
  metrics c = *m;
  pthread_mutex_unlock(&m->mu);
  sbuf b = {0};
  sb_printf(&b, "%s", gauges ? gauges : "");
  struct {
    const char *name, *help;
    uint64_t v;
  } ctr[] = {
      {"anna_requests_total", "HTTP requests answered", c.requests},
      {"anna_responses_2xx_total", "responses with a 2xx status", c.responses_2xx},
      {"anna_responses_4xx_total", "responses with a 4xx status", c.responses_4xx},
      {"anna_responses_5xx_total", "responses with a 5xx status", c.responses_5xx},
      {"anna_rejected_busy_total", "requests rejected with 429 (queue full)", c.rejected_busy},
      {"anna_responses_503_total", "responses with 503 (not ready, draining, memory or KV blocks exhausted)",
       c.responses_503},
      {"anna_client_closed_total", "requests whose client went away before the answer ended (499)",
       c.client_closed},
      {"anna_cancelled_total", "generations cancelled (client gone or shutdown)", c.cancelled},
      {"anna_prompt_tokens_total", "prompt tokens prefilled", c.prompt_tokens},
      {"anna_completion_tokens_total", "tokens generated", c.completion_tokens},
      {"anna_decode_steps_total", "engine steps (one model call each)", c.decode_steps},
      {"anna_batch_tokens_total", "tokens over all engine steps", c.batch_tokens},
      {"anna_prompt_cache_lookups_total", "admissions that looked for a cached prefix",
       c.cache_lookups},
      {"anna_prompt_cache_hits_total", "admissions that reused a cached prefix", c.cache_hits},
      {"anna_prompt_cache_reused_tokens_total",
       "prompt tokens taken from the cache instead of prefilled", c.cache_reused_tokens},
      {"anna_exact_prompt_cache_lookups_total", "admissions eligible for the exact prompt cache",
       c.exact_lookups},
      {"anna_exact_prompt_cache_hits_total", "admissions whose whole prompt was cached", c.exact_hits},
      {"anna_prefix_cache_hit_blocks_total", "full prompt blocks found in the prefix pool",
       c.prefix_hit_blocks},
      {"anna_prefix_cache_miss_blocks_total", "full prompt blocks not in the prefix pool",
       c.prefix_miss_blocks},
      {"anna_prefix_cache_hit_tokens_total", "prompt tokens reused from the prefix pool",
       c.prefix_hit_tokens},
      {"anna_prefix_cache_miss_tokens_total", "prompt tokens the prefix pool did not have",
       c.prefix_miss_tokens},
  };
  for (size_t i = 0; i < sizeof ctr / sizeof ctr[0]; i++)
    sb_printf(&b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", ctr[i].name, ctr[i].help,
              ctr[i].name, ctr[i].name, (unsigned long long)ctr[i].v);
  static const char *const drafter[METRICS_N_DRAFTERS] = {"ngram", "mtp"};
  sb_printf(&b, "# HELP anna_spec_decode_draft_tokens_total tokens drafted into speculative verify windows\n"
                "# TYPE anna_spec_decode_draft_tokens_total counter\n");
  for (int d = 0; d < METRICS_N_DRAFTERS; d++)
    sb_printf(&b, "anna_spec_decode_draft_tokens_total{drafter=\"%s\"} %llu\n", drafter[d],
              (unsigned long long)c.spec_draft_tokens[d]);
  sb_printf(&b, "# HELP anna_spec_decode_accepted_tokens_total drafted tokens the verify windows accepted\n"
                "# TYPE anna_spec_decode_accepted_tokens_total counter\n");
  for (int d = 0; d < METRICS_N_DRAFTERS; d++)
    sb_printf(&b, "anna_spec_decode_accepted_tokens_total{drafter=\"%s\"} %llu\n", drafter[d],
              (unsigned long long)c.spec_accepted_tokens[d]);
  prom_histo(&b, "anna_time_to_first_token_seconds", "request arrival to first generated token",
             &c.ttft);
  prom_histo(&b, "anna_inter_token_latency_seconds", "gap between consecutive tokens of a sequence",
             &c.itl);
  prom_histo(&b, "anna_request_duration_seconds", "request arrival to last token", &c.e2e);
  prom_histo(&b, "anna_queue_wait_seconds", "arrival to admission into a sequence slot", &c.queue);
  return b.s;
}

static int g_json, g_level = SLOG_INFO;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;

void slog_configure(int json, int min_level) {
  g_json = json;
  g_level = min_level;
}

static void slog_v(int level, const char *rid, json_t *fields, const char *fmt, va_list ap) {
  if (level < g_level) {
    json_decref(fields);
    return;
  }
  static const char *names[] = {"debug", "info", "warn", "error"};
  char msg[2048];
  vsnprintf(msg, sizeof msg, fmt, ap);
  /* One line each, whatever the message quotes. */
  for (char *p = msg; *p; p++)
    if ((unsigned char)*p < 0x20) *p = ' ';
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char tbuf[64];
  snprintf(tbuf, sizeof tbuf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
           tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
  pthread_mutex_lock(&g_log_mu);
  if (g_json) {
    json_t *m = json_string(msg);
    if (!m) { /* not UTF-8: keep the ASCII */
      for (char *p = msg; *p; p++)
        if ((unsigned char)*p >= 0x80) *p = '?';
      m = json_string(msg);
    }
    json_t *o = json_pack("{s:s,s:s,s:o}", "ts", tbuf, "level", names[level], "msg",
                          m ? m : json_string(""));
    if (o && rid) json_object_set_new(o, "request_id", json_string(rid));
    if (o && fields) json_object_update_missing(o, fields);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (s) fprintf(stderr, "%s\n", s);
    free(s);
    json_decref(o);
  } else {
    fprintf(stderr, "%s %-5s %s%s%s%s\n", tbuf, names[level], rid ? "[" : "", rid ? rid : "",
            rid ? "] " : "", msg);
  }
  fflush(stderr);
  pthread_mutex_unlock(&g_log_mu);
  json_decref(fields);
}

void slog(int level, const char *rid, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  slog_v(level, rid, NULL, fmt, ap);
  va_end(ap);
}

void slog_fields(int level, const char *rid, json_t *fields, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  slog_v(level, rid, fields, fmt, ap);
  va_end(ap);
}
