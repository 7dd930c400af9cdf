/* metrics.c: counters, histograms and log lines (see metrics.h). */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const double BOUNDS_MS[METRICS_NBUCKETS] = {
    1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000};

/* Engine steps: 10 us (host phases) to 1 s (a long prefill); rows: powers of two. */
static const double STEP_BOUNDS_MS[METRICS_NBUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,   2.5,
                                                        5,    10,    25,   50,  100,  250, 500, 1000};
static const double ROW_BOUNDS[METRICS_NBUCKETS] = {1,   2,   4,    8,    16,   32,   64,    128,
                                                    256, 512, 1024, 2048, 4096, 8192, 16384, 32768};

const char *const metrics_engine_phase_names[ENG_PH_COUNT] = {
    "idle", "sched", "admit", "assemble", "forward", "sample", "detok", "publish", "wake", "finish", "stats", "step"};
const char *const metrics_engine_kind_names[ENG_STEP_KINDS] = {"decode", "mixed", "prefill"};

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

/* Call with the lock held. */
static void histo_add(metrics_histo *h, const double *bounds, double v) {
  if (!(v >= 0)) v = 0;
  int b = 0;
  while (b < METRICS_NBUCKETS && v > bounds[b])
    b++;
  h->counts[b]++;
  h->n++;
  h->sum_ms += v;
}

void metrics_observe(metrics *m, metrics_histo *h, double ms) {
  pthread_mutex_lock(&m->mu);
  histo_add(h, BOUNDS_MS, ms);
  pthread_mutex_unlock(&m->mu);
}

void metrics_histo_note(metrics_histo *h, double ms) {
  histo_add(h, BOUNDS_MS, ms);
}

void metrics_histo_merge(metrics *m, metrics_histo *dst, metrics_histo *src, uint64_t *counter, uint64_t *add) {
  pthread_mutex_lock(&m->mu);
  if (dst && src) {
    for (int b = 0; b <= METRICS_NBUCKETS; b++) dst->counts[b] += src->counts[b];
    dst->n += src->n;
    dst->sum_ms += src->sum_ms;
  }
  if (counter && add) *counter += *add;
  pthread_mutex_unlock(&m->mu);
  if (src) memset(src, 0, sizeof *src);
  if (add) *add = 0;
}

void metrics_engine_step(metrics *m, const metrics_step *st) {
  if (st->kind < 0 || st->kind >= ENG_STEP_KINDS) return;
  pthread_mutex_lock(&m->mu);
  for (int p = 0; p < ENG_PH_COUNT; p++) histo_add(&m->eng_phase[p], STEP_BOUNDS_MS, st->ph[p] * 1000.0);
  histo_add(&m->eng_fwd[st->kind], STEP_BOUNDS_MS, st->ph[ENG_PH_FORWARD] * 1000.0);
  histo_add(&m->eng_rows_decode, ROW_BOUNDS, st->decode_rows);
  histo_add(&m->eng_rows_prefill, ROW_BOUNDS, st->prefill_rows);
  m->eng_steps[st->kind]++;
  m->eng_forward_calls += (uint64_t)st->forward_calls;
  m->eng_graph_steps += (uint64_t)st->graph_steps;
  m->eng_full_rows += (uint64_t)st->full_rows;
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

/* One histogram's series. label: `key="value",` (with the comma) or ""; scale: what a bucket
 * bound and the sum are divided by (1000: ms to seconds). */
static void prom_series(sbuf *b, const char *name, const char *label, const double *bounds, double scale,
                        const metrics_histo *h) {
  uint64_t acc = 0;
  for (int i = 0; i < METRICS_NBUCKETS; i++) {
    acc += h->counts[i];
    sb_printf(b, "%s_bucket{%sle=\"%g\"} %llu\n", name, label, bounds[i] / scale, (unsigned long long)acc);
  }
  acc += h->counts[METRICS_NBUCKETS];
  const size_t ll = strlen(label);
  /* the label without its trailing comma, in braces, for _sum and _count */
  sb_printf(b, "%s_bucket{%sle=\"+Inf\"} %llu\n%s_sum%s%.*s%s %.6f\n%s_count%s%.*s%s %llu\n", name, label,
            (unsigned long long)acc, name, ll ? "{" : "", (int)(ll ? ll - 1 : 0), label, ll ? "}" : "",
            h->sum_ms / scale, name, ll ? "{" : "", (int)(ll ? ll - 1 : 0), label, ll ? "}" : "",
            (unsigned long long)h->n);
}

static void prom_histo(sbuf *b, const char *name, const char *help, const metrics_histo *h) {
  sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  prom_series(b, name, "", BOUNDS_MS, 1000.0, h);
}

/* The engine step families (metrics_engine_step). */
static void prom_engine(sbuf *b, const metrics *c) {
  char lab[64];
  sb_printf(b, "# HELP anna_engine_step_seconds engine thread time per step, by phase (step: all but idle)\n"
               "# TYPE anna_engine_step_seconds histogram\n");
  for (int p = 0; p < ENG_PH_COUNT; p++) {
    snprintf(lab, sizeof lab, "phase=\"%s\",", metrics_engine_phase_names[p]);
    prom_series(b, "anna_engine_step_seconds", lab, STEP_BOUNDS_MS, 1000.0, &c->eng_phase[p]);
  }
  sb_printf(b, "# HELP anna_engine_forward_seconds model call time per step, by step kind\n"
               "# TYPE anna_engine_forward_seconds histogram\n");
  for (int k = 0; k < ENG_STEP_KINDS; k++) {
    snprintf(lab, sizeof lab, "kind=\"%s\",", metrics_engine_kind_names[k]);
    prom_series(b, "anna_engine_forward_seconds", lab, STEP_BOUNDS_MS, 1000.0, &c->eng_fwd[k]);
  }
  sb_printf(b, "# HELP anna_engine_step_rows batch rows per step: decode tokens, prompt tokens\n"
               "# TYPE anna_engine_step_rows histogram\n");
  prom_series(b, "anna_engine_step_rows", "kind=\"decode\",", ROW_BOUNDS, 1.0, &c->eng_rows_decode);
  prom_series(b, "anna_engine_step_rows", "kind=\"prefill\",", ROW_BOUNDS, 1.0, &c->eng_rows_prefill);
  sb_printf(b, "# HELP anna_engine_steps_total engine steps that ran the model, by kind\n"
               "# TYPE anna_engine_steps_total counter\n");
  for (int k = 0; k < ENG_STEP_KINDS; k++)
    sb_printf(b, "anna_engine_steps_total{kind=\"%s\"} %llu\n", metrics_engine_kind_names[k],
              (unsigned long long)c->eng_steps[k]);
  sb_printf(b,
            "# HELP anna_engine_forward_calls_total model calls (a step with verify windows makes two)\n"
            "# TYPE anna_engine_forward_calls_total counter\nanna_engine_forward_calls_total %llu\n"
            "# HELP anna_engine_graph_steps_total model calls replayed as CUDA graphs\n"
            "# TYPE anna_engine_graph_steps_total counter\nanna_engine_graph_steps_total %llu\n"
            "# HELP anna_engine_full_rows_total logits rows downloaded whole and sampled on the host\n"
            "# TYPE anna_engine_full_rows_total counter\nanna_engine_full_rows_total %llu\n",
            (unsigned long long)c->eng_forward_calls, (unsigned long long)c->eng_graph_steps,
            (unsigned long long)c->eng_full_rows);
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
  static const char *const drafter[METRICS_N_DRAFTERS] = {"ngram", "mtp", "draft"};
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
  prom_engine(&b, &c);
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
