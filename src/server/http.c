/* http.c: libmicrohttpd glue, routes, health/metrics and the process lifecycle (see
 * server.h). Connection threads parse, validate, tokenize and queue; they then block on
 * their request's condition variable (non-stream) or inside the SSE content callback
 * (stream), polling the socket so a vanished client cancels its generation at once. */
#include "server.h"

#include "anna/anna.h"
#include "audio_api.h"
#include "metrics.h"
#include "oai.h"
#include "embed_api.h"
#include "responses.h"
#include "imgfetch.h"
#include "respond.h"
#include "speech_api.h"
#include "tokapi.h"
#include "webui.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct server {
  const server_options *o;
  anna_model *m;
  anna_text *text;
  engine *eng;
  metrics mx;
  oai_config cfg;
  auth_keys *keys; /* NULL: no auth */
  resp_store *rstore; /* stored /v1/responses */
  char *tls_cert, *tls_key; /* PEM texts for HTTPS (NULL: plain HTTP); the daemon reads them */
  int mhd_starting;         /* atomic: 1 while MHD_start_daemon runs, so mhd_log keeps its last message */
  char mhd_last[256];       /* that message: why the daemon did not start (TLS key errors, ...) */
  speech_server *speech; /* speech mode (a Qwen3-TTS folder): no text model, engine or text */
  char model_name[256];
  int active; /* requests between first callback and completion (atomic) */
  int n_conns; /* open connections (atomic): the accept policy refuses past --max-connections */
  uint64_t rid_seq;
  long long created;
} server;

typedef struct conn {
  server *srv;
  struct MHD_Connection *c;
  char rid[80];
  char method[16];
  char url[256];
  char *body;
  size_t len, cap;
  int too_big;
  double t0;
  gen_request *gr; /* a reference while generating: cancelled if the request ends early */
  int status;
  int n_prompt, n_gen;
} conn;

typedef struct sse {
  server *srv;
  oai_job job;
  oai_stream *st;
  resp_job *rj; /* /v1/responses: the job (owning the chat job) and its renderer instead */
  resp_stream *rs;
  char *buf;
  size_t len, cap, off;
  int finished;
  int fd;
} sse;

/* ---- helpers ---- */

static int peer_gone(int fd) {
  if (fd < 0) return 0;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return 0;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static int conn_fd(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  return ci ? ci->connect_fd : -1;
}

static void make_rid(server *srv, conn *cn) {
  const char *h = MHD_lookup_connection_value(cn->c, MHD_HEADER_KIND, "X-Request-Id");
  int ok = h && *h && strlen(h) <= 64;
  for (const char *p = h; ok && *p; p++)
    ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
         strchr("-_.:", *p);
  if (ok) {
    snprintf(cn->rid, sizeof cn->rid, "%s", h);
    return;
  }
  uint64_t n = __atomic_add_fetch(&srv->rid_seq, 1, __ATOMIC_RELAXED);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(cn->rid, sizeof cn->rid, "req-%08llx%06llx%04x",
           (unsigned long long)ts.tv_sec & 0xffffffffULL, (unsigned long long)n & 0xffffffULL,
           (unsigned)(ts.tv_nsec >> 10) & 0xffff);
}

enum MHD_Result http_send_text(struct MHD_Connection *c, const char *rid, int status, char *body, const char *ctype,
                               const char *allow, int *status_out) {
  if (!body) {
    status = 500;
    ctype = "application/json";
    body = strdup("{\"error\":{\"message\":\"out of "
                  "memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
    if (!body) return MHD_NO;
  }
  struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(resp, "Content-Type", ctype);
  MHD_add_response_header(resp, "X-Request-Id", rid);
  if (status == 429 || status == 503) MHD_add_response_header(resp, "Retry-After", "1");
  if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
  if (allow) MHD_add_response_header(resp, "Allow", allow);
  enum MHD_Result r = MHD_queue_response(c, (unsigned)status, resp);
  MHD_destroy_response(resp);
  *status_out = status;
  return r;
}

static enum MHD_Result send_body(conn *cn, int status, char *body, const char *ctype) {
  const char *allow = status != 405 ? NULL
                      : !strncmp(cn->url, "/v1/responses/", 14)
                          ? (strstr(cn->url + 14, "/") ? "GET" : "GET, DELETE")
                      : strncmp(cn->url, "/v1/models", 10) && strcmp(cn->url, "/healthz") && strcmp(cn->url, "/metrics")
                          ? "POST"
                          : "GET";
  return http_send_text(cn->c, cn->rid, status, body, ctype, allow, &cn->status);
}

static enum MHD_Result send_error(conn *cn, const oai_error *e) {
  return send_body(cn, e->status, oai_error_json(e), "application/json");
}

static enum MHD_Result send_fail(conn *cn, int status, const char *param, const char *code,
                                 const char *msg) {
  oai_error e;
  oai_fail(&e, status, param, code, "%s", msg);
  return send_error(cn, &e);
}

static long rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0, rss = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
    fclose(f);
  }
  return rss * sysconf(_SC_PAGESIZE);
}

/* KV blocks referenced by sequences: the pool minus its free and its cached (unreferenced,
 * evictable) blocks. */
static int64_t kv_blocks_used(const anna_kv_stats *kv) {
  const int64_t u = kv->n_blocks - kv->free_blocks - kv->cached_blocks;
  return u > 0 ? u : 0;
}

/* Blocks in use that neither the sequences nor the exact cache can be holding: leaked
 * (0 on a healthy server; see engine_stats). */
static int64_t kv_blocks_unaccounted(const engine_stats *st) {
  const int64_t u = kv_blocks_used(&st->kv) - st->kv_seq_blocks - st->kv_exact_blocks;
  return u > 0 ? u : 0;
}

/* ---- routes ---- */

static enum MHD_Result route_health(server *srv, conn *cn) {
  engine_stats st;
  engine_get_stats(srv->eng, &st);
  const engine_options *eo = engine_get_options(srv->eng);
  json_t *o = json_pack(
      "{s:s,s:{s:s,s:s,s:s,s:i,s:i},s:{s:I,s:I,s:I,s:f},s:{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,"
      "s:i,s:i},s:o}",
      "status", st.draining ? "draining" : "ok", "model", "id", srv->model_name, "path",
      anna_model_path(srv->m), "describe", anna_model_describe(srv->m), "vocab",
      anna_model_vocab(srv->m), "layers", anna_model_n_layers(srv->m), "memory", "rss_bytes",
      (json_int_t)rss_bytes(), "kv_tokens_used", (json_int_t)st.kv_tokens, "kv_tokens_capacity",
      (json_int_t)st.kv_capacity, "kv_usage",
      st.kv_capacity ? (double)st.kv_tokens / (double)st.kv_capacity : 0.0, "scheduler", "profile",
      srv->o->profile_name ? srv->o->profile_name : "none", "running", st.running, "waiting",
      st.waiting, "slots", st.n_seq, "ctx_size", st.n_ctx, "max_batch_size", eo->max_batch_size,
      "batch_wait_ms", eo->batch_wait_ms, "max_prefill_tokens", eo->max_prefill_tokens,
      "max_decode_tokens", eo->max_decode_tokens, "max_waiting_requests", eo->max_waiting,
      "max_queue_wait_ms", eo->max_queue_wait_ms, "prefill_interval_steps",
      eo->prefill_interval_steps, "service", metrics_json(&srv->mx));
  if (o) {
    pthread_mutex_lock(&srv->mx.mu);
    metrics c = srv->mx;
    pthread_mutex_unlock(&srv->mx.mu);
    const uint64_t reused = c.cache_reused_tokens, fed = c.prompt_tokens;
    anna_stage_info sti[16];
    const int ns = engine_stages(srv->eng, sti, 16);
    json_t *pl = json_array();
    for (int i = 0; pl && i < ns && i < 16; i++)
      json_array_append_new(pl, json_pack("{s:s,s:i,s:i,s:I,s:I}", "device", sti[i].device, "layer_begin",
                                          sti[i].layer_begin, "layer_end", sti[i].layer_end, "weight_bytes",
                                          (json_int_t)sti[i].weight_bytes, "kv_bytes", (json_int_t)sti[i].kv_bytes));
    json_object_set_new(o, "placement", pl ? pl : json_null());
    json_object_set_new(o, "prompt_cache",
                        json_pack("{s:b,s:i,s:I,s:I,s:I,s:f}", "enabled", eo->prompt_cache, "block",
                                  eo->prompt_cache_block, "lookups", (json_int_t)c.cache_lookups, "hits",
                                  (json_int_t)c.cache_hits, "reused_tokens", (json_int_t)reused, "hit_rate",
                                  reused + fed ? (double)reused / (double)(reused + fed) : 0.0));
    const uint64_t hb = c.prefix_hit_blocks, mb = c.prefix_miss_blocks, ht = c.prefix_hit_tokens,
                   mt = c.prefix_miss_tokens;
    json_object_set_new(
        o, "prefix_cache",
        json_pack("{s:b,s:i,s:I,s:I,s:I,s:I,s:f,s:f,s:I,s:I,s:I,s:I,s:I,s:I}", "enabled",
                  st.kv.prefix_share, "block_len", st.kv.block_len, "hit_blocks",
                  (json_int_t)hb, "miss_blocks", (json_int_t)mb, "hit_tokens", (json_int_t)ht, "miss_tokens",
                  (json_int_t)mt, "block_hit_rate", hb + mb ? (double)hb / (double)(hb + mb) : 0.0,
                  "token_hit_rate", ht + mt ? (double)ht / (double)(ht + mt) : 0.0, "blocks",
                  (json_int_t)st.kv.n_blocks, "free_blocks", (json_int_t)st.kv.free_blocks, "cached_blocks",
                  (json_int_t)st.kv.cached_blocks, "snapshots", (json_int_t)st.kv.n_snapshots, "evictions",
                  (json_int_t)st.kv.evictions, "cow_copies", (json_int_t)st.kv.cow_copies));
    json_object_set_new(o, "exact_prompt_cache",
                        json_pack("{s:i,s:i,s:I,s:I}", "size", eo->prompt_cache_size, "entries", st.exact_entries,
                                  "lookups", (json_int_t)c.exact_lookups, "hits", (json_int_t)c.exact_hits));
    json_t *mem = json_object_get(o, "memory");
    json_object_set_new(mem, "kv_pool_bytes", json_integer((json_int_t)st.kv.pool_bytes));
    json_object_set_new(mem, "kv_snapshot_bytes", json_integer((json_int_t)st.kv.snapshot_bytes));
    json_object_set_new(mem, "kv_residual_bytes", json_integer((json_int_t)st.kv.ring_bytes));
    json_object_set_new(mem, "kv_cache_type", json_string(anna_kv_type_name(st.kv.kv_type)));
    json_object_set_new(json_object_get(o, "memory"), "kv_tokens_cached",
                        json_integer((json_int_t)st.kv_cached));
    json_object_set_new(json_object_get(o, "scheduler"), "preemptions",
                        json_integer((json_int_t)st.preemptions));
    json_object_set_new(o, "speculative",
                        json_pack("{s:s,s:b,s:b,s:i,s:I,s:I,s:I,s:I}", "drafter",
                                  eo->spec_draft_max > 0 ? engine_drafter_names[eo->spec_drafter] : "none",
                                  "default", eo->spec_default, "adaptive", !eo->spec_fixed, "draft_max",
                                  eo->spec_draft_max, "windows", (json_int_t)st.spec.windows, "drafted",
                                  (json_int_t)st.spec.drafted, "accepted", (json_int_t)st.spec.accepted,
                                  "rollbacks", (json_int_t)st.spec.rollbacks));
    json_object_set_new(
        o, "kv_blocks",
        json_pack("{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "block_len", st.kv.block_len, "total",
                  (json_int_t)st.kv.n_blocks, "used", (json_int_t)kv_blocks_used(&st.kv), "free",
                  (json_int_t)st.kv.free_blocks, "cached", (json_int_t)st.kv.cached_blocks,
                  "held_by_sequences", (json_int_t)st.kv_seq_blocks, "held_by_exact_cache",
                  (json_int_t)st.kv_exact_blocks, "unaccounted", (json_int_t)kv_blocks_unaccounted(&st)));
    json_object_set_new(o, "active_http_requests",
                        json_integer(__atomic_load_n(&srv->active, __ATOMIC_RELAXED)));
  }
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  return send_body(cn, st.draining ? 503 : 200, s, "application/json");
}

static enum MHD_Result route_metrics(server *srv, conn *cn) {
  engine_stats st;
  engine_get_stats(srv->eng, &st);
  char g[8192];
  snprintf(
      g, sizeof g,
      "# HELP anna_requests_running sequences in the running batch\n# TYPE anna_requests_running "
      "gauge\n"
      "anna_requests_running %d\n"
      "# HELP anna_requests_waiting sequences waiting for a slot\n# TYPE anna_requests_waiting "
      "gauge\n"
      "anna_requests_waiting %d\n"
      "# HELP anna_kv_tokens_used cached positions over all slots\n# TYPE anna_kv_tokens_used "
      "gauge\n"
      "anna_kv_tokens_used %lld\n"
      "# HELP anna_kv_tokens_capacity slots x context\n# TYPE anna_kv_tokens_capacity gauge\n"
      "anna_kv_tokens_capacity %lld\n"
      "# HELP anna_resident_memory_bytes process RSS\n# TYPE anna_resident_memory_bytes gauge\n"
      "anna_resident_memory_bytes %ld\n"
      "# HELP anna_draining 1 while shutting down\n# TYPE anna_draining gauge\nanna_draining %d\n"
      "# HELP anna_kv_blocks_total KV pool blocks\n# TYPE anna_kv_blocks_total gauge\n"
      "anna_kv_blocks_total %lld\n"
      "# HELP anna_kv_blocks_used KV blocks held by sequences\n# TYPE anna_kv_blocks_used gauge\n"
      "anna_kv_blocks_used %lld\n"
      "# HELP anna_kv_blocks_free KV blocks free (cached prefix blocks not counted)\n"
      "# TYPE anna_kv_blocks_free gauge\n"
      "anna_kv_blocks_free %lld\n"
      "# HELP anna_kv_blocks_cached KV blocks holding a cached prefix, evictable\n"
      "# TYPE anna_kv_blocks_cached gauge\n"
      "anna_kv_blocks_cached %lld\n"
      "# HELP anna_kv_blocks_held_sequences KV blocks the running sequences can reference (upper bound)\n"
      "# TYPE anna_kv_blocks_held_sequences gauge\n"
      "anna_kv_blocks_held_sequences %lld\n"
      "# HELP anna_kv_blocks_held_exact_cache KV blocks the exact prompt cache can reference (upper bound)\n"
      "# TYPE anna_kv_blocks_held_exact_cache gauge\n"
      "anna_kv_blocks_held_exact_cache %lld\n"
      "# HELP anna_kv_blocks_unaccounted KV blocks in use that no sequence or cache holds (a leak)\n"
      "# TYPE anna_kv_blocks_unaccounted gauge\n"
      "anna_kv_blocks_unaccounted %lld\n"
      "# HELP anna_preemptions_total sequences preempted for KV blocks (recomputed later)\n"
      "# TYPE anna_preemptions_total counter\n"
      "anna_preemptions_total %lld\n",
      st.running, st.waiting, (long long)st.kv_tokens, (long long)st.kv_capacity, rss_bytes(),
      st.draining, (long long)st.kv.n_blocks, (long long)kv_blocks_used(&st.kv),
      (long long)st.kv.free_blocks, (long long)st.kv.cached_blocks, (long long)st.kv_seq_blocks,
      (long long)st.kv_exact_blocks, (long long)kv_blocks_unaccounted(&st), (long long)st.preemptions);
  /* the encoder output cache (vision models; zeros otherwise) */
  const size_t gl = strlen(g);
  snprintf(g + gl, sizeof g - gl,
           "# HELP anna_mm_cache_hits_total media whose tower rows came from the encoder cache\n"
           "# TYPE anna_mm_cache_hits_total counter\nanna_mm_cache_hits_total %lld\n"
           "# HELP anna_mm_cache_misses_total media the encoder cache did not hold (the tower ran)\n"
           "# TYPE anna_mm_cache_misses_total counter\nanna_mm_cache_misses_total %lld\n"
           "# HELP anna_mm_cache_evictions_total encoder cache entries dropped for room\n"
           "# TYPE anna_mm_cache_evictions_total counter\nanna_mm_cache_evictions_total %lld\n"
           "# HELP anna_mm_cache_bytes pixels and tower rows held by the encoder cache\n"
           "# TYPE anna_mm_cache_bytes gauge\nanna_mm_cache_bytes %lld\n"
           "# HELP anna_mm_cache_entries media held by the encoder cache\n"
           "# TYPE anna_mm_cache_entries gauge\nanna_mm_cache_entries %lld\n"
           "# HELP anna_mm_cache_budget_bytes the encoder cache's budget (--mm-cache-mib; 0: off)\n"
           "# TYPE anna_mm_cache_budget_bytes gauge\nanna_mm_cache_budget_bytes %lld\n"
           "# HELP anna_mm_tower_runs_total media encoded by the vision tower\n"
           "# TYPE anna_mm_tower_runs_total counter\nanna_mm_tower_runs_total %lld\n",
           (long long)st.vis.cache_hits, (long long)st.vis.cache_misses, (long long)st.vis.cache_evictions,
           (long long)st.vis.cache_bytes, (long long)st.vis.cache_entries, (long long)st.vis.cache_budget,
           (long long)st.vis.tower_runs);
  /* the JSON Schema mask cache (--json-mask-cache-mib) */
  const size_t gl2 = strlen(g);
  snprintf(g + gl2, sizeof g - gl2,
           "# HELP anna_json_mask_cache_hits_total JSON Schema token masks taken from the mask cache\n"
           "# TYPE anna_json_mask_cache_hits_total counter\nanna_json_mask_cache_hits_total %llu\n"
           "# HELP anna_json_mask_cache_misses_total JSON Schema token masks computed (then kept)\n"
           "# TYPE anna_json_mask_cache_misses_total counter\nanna_json_mask_cache_misses_total %llu\n"
           "# HELP anna_json_mask_cache_evictions_total mask cache entries dropped for room\n"
           "# TYPE anna_json_mask_cache_evictions_total counter\nanna_json_mask_cache_evictions_total %llu\n"
           "# HELP anna_json_mask_cache_entries parser states whose mask is kept\n"
           "# TYPE anna_json_mask_cache_entries gauge\nanna_json_mask_cache_entries %llu\n"
           "# HELP anna_json_mask_cache_bytes bytes held by the mask cache\n"
           "# TYPE anna_json_mask_cache_bytes gauge\nanna_json_mask_cache_bytes %llu\n",
           (unsigned long long)st.jmc_hits, (unsigned long long)st.jmc_misses,
           (unsigned long long)st.jmc_evictions, (unsigned long long)st.jmc_entries,
           (unsigned long long)st.jmc_bytes);
  return send_body(cn, 200, metrics_prometheus(&srv->mx, g), "text/plain; version=0.0.4");
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
  sse *s = cls;
  gen_request *r = s->rj ? resp_job_chat(s->rj)->r : s->job.r;
  for (;;) {
    if (s->off < s->len) {
      size_t n = s->len - s->off < max ? s->len - s->off : max;
      memcpy(buf, s->buf + s->off, n);
      s->off += n;
      if (s->off == s->len) s->off = s->len = 0;
      return (ssize_t)n;
    }
    if (s->finished) return MHD_CONTENT_READER_END_OF_STREAM;
    pthread_mutex_lock(&r->mu);
    while (!(s->rs ? resp_stream_has_news(s->rs) : oai_stream_has_news(s->st))) {
      gen_request_wait(r, 50);
      if (peer_gone(s->fd)) {
        pthread_mutex_unlock(&r->mu);
        engine_cancel(s->srv->eng, r);
        return MHD_CONTENT_READER_END_WITH_ERROR;
      }
    }
    pthread_mutex_unlock(&r->mu);
    if (s->rs ? resp_stream_step(s->rs, &s->buf, &s->len, &s->cap, &s->finished)
              : oai_stream_step(s->st, &s->buf, &s->len, &s->cap, &s->finished)) {
      engine_cancel(s->srv->eng, r);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
  }
}

static void sse_free(void *cls) {
  sse *s = cls;
  if (s->job.r) engine_cancel(s->srv->eng, s->job.r);
  if (s->rj) engine_cancel(s->srv->eng, resp_job_chat(s->rj)->r);
  oai_stream_free(s->st);
  oai_job_clear(&s->job);
  resp_stream_free(s->rs);
  resp_job_free(s->rj);
  free(s->buf);
  free(s);
}

static enum MHD_Result route_tokens(server *srv, conn *cn, int detok) {
  if (cn->too_big) {
    char msg[128];
    snprintf(msg, sizeof msg, "the request body is larger than %zu bytes (--max-body-bytes)",
             srv->o->max_body_bytes);
    return send_fail(cn, 413, NULL, "request_too_large", msg);
  }
  char *out = NULL;
  oai_error e;
  const char *b = cn->body ? cn->body : "";
  if (detok ? tokapi_detokenize(&srv->cfg, b, cn->len, &out, &e) : tokapi_tokenize(&srv->cfg, b, cn->len, &out, &e)) {
    slog(SLOG_INFO, cn->rid, "rejected %d: %s", e.status, e.message);
    return send_error(cn, &e);
  }
  return send_body(cn, 200, out, "application/json");
}

static enum MHD_Result route_generate(server *srv, conn *cn, int kind) {
  if (cn->too_big) {
    char msg[128];
    snprintf(msg, sizeof msg, "the request body is larger than %zu bytes (--max-body-bytes)",
             srv->o->max_body_bytes);
    return send_fail(cn, 413, NULL, "request_too_large", msg);
  }
  oai_job job;
  oai_error e;
  if (oai_parse(&srv->cfg, kind, cn->body ? cn->body : "", cn->len, cn->rid, &job, &e)) {
    oai_job_clear(&job);
    slog(SLOG_INFO, cn->rid, "rejected %d: %s", e.status, e.message);
    return send_error(cn, &e);
  }
  char err[512];
  int rc = engine_submit(srv->eng, job.r, err, sizeof err);
  if (rc) {
    oai_job_clear(&job);
    /* Out of memory or KV blocks: 503 + Retry-After, as a full queue is 429. */
    int status = rc == ANNA_ERANGE                        ? 429
                 : rc == ANNA_ESTATE || rc == ANNA_ENOMEM ? 503
                 : rc == ANNA_EINVAL                      ? 400
                                                          : 500;
    return send_fail(cn, status, NULL,
                     rc == ANNA_ERANGE   ? "queue_full"
                     : rc == ANNA_ESTATE ? "shutting_down"
                     : rc == ANNA_ENOMEM ? "resources_exhausted"
                                         : NULL,
                     err);
  }
  gen_request *r = job.r;
  gen_request_retain(r);
  cn->gr = r;
  for (int p = 0; p < r->n_prompts; p++)
    cn->n_prompt += (int)r->n_prompt[p];
  int fd = conn_fd(cn->c);
  if (job.stream) {
    sse *s = calloc(1, sizeof *s);
    if (!s) {
      engine_cancel(srv->eng, r);
      oai_job_clear(&job);
      return send_fail(cn, 500, NULL, NULL, "out of memory");
    }
    s->srv = srv;
    s->job = job; /* the stream owns the job from here on */
    s->fd = fd;
    if (!(s->st = oai_stream_new(&srv->cfg, &s->job))) {
      sse_free(s);
      return send_fail(cn, 500, NULL, NULL, "out of memory");
    }
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, s, sse_free);
    if (!resp) {
      sse_free(s);
      return send_fail(cn, 500, NULL, NULL, "out of memory");
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Request-Id", cn->rid);
    enum MHD_Result ret = MHD_queue_response(cn->c, 200, resp);
    MHD_destroy_response(resp);
    cn->status = 200;
    return ret;
  }
  pthread_mutex_lock(&r->mu);
  while (r->n_done < r->n_choices) {
    gen_request_wait(r, 50);
    if (peer_gone(fd)) {
      pthread_mutex_unlock(&r->mu);
      engine_cancel(srv->eng, r);
      oai_job_clear(&job);
      cn->status = 499; /* client closed request */
      return MHD_NO;
    }
  }
  int failed = r->error[0] != 0, busy = r->error_code == ANNA_ENOMEM;
  pthread_mutex_unlock(&r->mu);
  enum MHD_Result ret;
  if (failed) {
    char msg[400];
    snprintf(msg, sizeof msg, "generation failed: %s", r->error);
    /* Memory or KV blocks ran out (nothing left to preempt): worth a retry, so 503. */
    ret = send_fail(cn, busy ? 503 : 500, NULL, busy ? "resources_exhausted" : "generation_failed", msg);
  } else {
    ret = send_body(cn, 200, oai_response_json(&srv->cfg, &job), "application/json");
  }
  oai_job_clear(&job);
  return ret;
}

/* The engine's refusal of a submit as an HTTP answer (as route_generate's). */
static enum MHD_Result submit_failed(conn *cn, int rc, const char *err) {
  const int status = rc == ANNA_ERANGE                        ? 429
                     : rc == ANNA_ESTATE || rc == ANNA_ENOMEM ? 503
                     : rc == ANNA_EINVAL                      ? 400
                                                              : 500;
  return send_fail(cn, status, NULL,
                   rc == ANNA_ERANGE   ? "queue_full"
                   : rc == ANNA_ESTATE ? "shutting_down"
                   : rc == ANNA_ENOMEM ? "resources_exhausted"
                                       : NULL,
                   err);
}

static enum MHD_Result body_too_big(server *srv, conn *cn) {
  char msg[128];
  snprintf(msg, sizeof msg, "the request body is larger than %zu bytes (--max-body-bytes)", srv->o->max_body_bytes);
  return send_fail(cn, 413, NULL, "request_too_large", msg);
}

/* POST /v1/responses: the chat path's engine request, rendered as a Responses object or
 * event stream (responses.h). */
static enum MHD_Result route_responses(server *srv, conn *cn) {
  if (cn->too_big) return body_too_big(srv, cn);
  resp_job *rj = NULL;
  oai_error e;
  if (resp_parse(&srv->cfg, srv->rstore, cn->body ? cn->body : "", cn->len, cn->rid, &rj, &e)) {
    slog(SLOG_INFO, cn->rid, "rejected %d: %s", e.status, e.message);
    return send_error(cn, &e);
  }
  gen_request *r = resp_job_chat(rj)->r;
  char err[512];
  int rc = engine_submit(srv->eng, r, err, sizeof err);
  if (rc) {
    resp_job_free(rj);
    return submit_failed(cn, rc, err);
  }
  gen_request_retain(r);
  cn->gr = r;
  cn->n_prompt += (int)r->n_prompt[0];
  int fd = conn_fd(cn->c);
  if (resp_job_chat(rj)->stream) {
    sse *s = calloc(1, sizeof *s);
    if (!s) {
      engine_cancel(srv->eng, r);
      resp_job_free(rj);
      return send_fail(cn, 500, NULL, NULL, "out of memory");
    }
    s->srv = srv;
    s->rj = rj;
    s->fd = fd;
    if (!(s->rs = resp_stream_new(rj))) {
      sse_free(s);
      return send_fail(cn, 500, NULL, NULL, "out of memory");
    }
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, s, sse_free);
    if (!resp) {
      sse_free(s);
      return send_fail(cn, 500, NULL, NULL, "out of memory");
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Request-Id", cn->rid);
    enum MHD_Result ret = MHD_queue_response(cn->c, 200, resp);
    MHD_destroy_response(resp);
    cn->status = 200;
    return ret;
  }
  pthread_mutex_lock(&r->mu);
  while (r->n_done < r->n_choices) {
    gen_request_wait(r, 50);
    if (peer_gone(fd)) {
      pthread_mutex_unlock(&r->mu);
      engine_cancel(srv->eng, r);
      resp_job_free(rj);
      cn->status = 499;
      return MHD_NO;
    }
  }
  const int failed = r->error[0] != 0, busy = r->error_code == ANNA_ENOMEM;
  pthread_mutex_unlock(&r->mu);
  enum MHD_Result ret;
  if (failed) {
    char msg[400];
    snprintf(msg, sizeof msg, "generation failed: %s", r->error);
    ret = send_fail(cn, busy ? 503 : 500, NULL, busy ? "resources_exhausted" : "generation_failed", msg);
  } else {
    oai_error fe;
    char *body = resp_finish_json(rj, &fe);
    if (!body) slog(SLOG_ERROR, cn->rid, "%s", fe.message);
    ret = body ? send_body(cn, 200, body, "application/json") : send_error(cn, &fe);
  }
  resp_job_free(rj);
  return ret;
}

/* GET / DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items. */
static enum MHD_Result route_response_id(server *srv, conn *cn, const char *rest, int get, int del) {
  char id[128];
  const char *slash = strchr(rest, '/');
  const size_t il = slash ? (size_t)(slash - rest) : strlen(rest);
  const int items = slash && !strcmp(slash, "/input_items");
  if (il == 0 || il >= sizeof id || (slash && !items))
    return send_fail(cn, 404, NULL, "not_found", "no such route under /v1/responses");
  memcpy(id, rest, il);
  id[il] = '\0';
  if (!(get || (del && !items))) return send_fail(cn, 405, NULL, "method_not_allowed", items ? "this route takes GET" : "this route takes GET or DELETE");
  if (get && !items && MHD_lookup_connection_value(cn->c, MHD_GET_ARGUMENT_KIND, "stream"))
    return send_fail(cn, 400, "stream", "unsupported_parameter", "replaying a stored response as a stream is not supported");
  char *body = NULL;
  oai_error e;
  int st = items ? resp_input_items(srv->rstore, id, MHD_lookup_connection_value(cn->c, MHD_GET_ARGUMENT_KIND, "order"),
                                    MHD_lookup_connection_value(cn->c, MHD_GET_ARGUMENT_KIND, "limit"),
                                    MHD_lookup_connection_value(cn->c, MHD_GET_ARGUMENT_KIND, "after"), &body, &e)
           : del ? resp_delete(srv->rstore, id, &body, &e)
                 : resp_get(srv->rstore, id, &body, &e);
  if (st != 200) return send_error(cn, &e);
  return send_body(cn, 200, body, "application/json");
}

static enum MHD_Result route_embeddings(server *srv, conn *cn) {
  if (cn->too_big) return body_too_big(srv, cn);
  char *out = NULL;
  oai_error e;
  if (embed_api_handle(&srv->cfg, srv->eng, cn->body ? cn->body : "", cn->len, &out, &e)) {
    slog(SLOG_INFO, cn->rid, "rejected %d: %s", e.status, e.message);
    return send_error(cn, &e);
  }
  return send_body(cn, 200, out, "application/json");
}

/* /v1/audio/transcriptions and /translations (audio_api.h). */
static enum MHD_Result route_audio(server *srv, conn *cn, int translate) {
  const audio_api_env env = {.m = srv->m,
                             .text = srv->text,
                             .eng = srv->eng,
                             .model_name = srv->model_name,
                             .defaults = srv->cfg.defaults,
                             .max_audio_seconds = srv->o->max_audio_seconds > 0 ? srv->o->max_audio_seconds : 300,
                             .audio_chunk_seconds = srv->o->audio_chunk_seconds,
                             .max_body_bytes = srv->o->max_body_bytes,
                             .max_tokens = srv->o->default_max_tokens,
                             .n_ctx = srv->cfg.n_ctx};
  return audio_api_handle(&env, cn->c, cn->rid, translate, cn->body ? cn->body : "", cn->len, cn->too_big,
                          conn_fd(cn->c), &cn->status, &cn->gr);
}

/* A timeout t (header or keep-alive) that is shorter than the idle timeout and so applies. */
static int short_timeout(int t, const server_options *o) {
  return t > 0 && t < o->http_timeout_s;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
  server *srv = cls;
  conn *cn = *con_cls;
  if (!cn) {
    cn = calloc(1, sizeof *cn);
    if (!cn) return MHD_NO;
    cn->srv = srv;
    cn->c = c;
    cn->t0 = engine_now();
    snprintf(cn->method, sizeof cn->method, "%s", method);
    snprintf(cn->url, sizeof cn->url, "%s", url);
    for (char *p = cn->url; *p; p++) /* the path goes into log lines: keep them one line of ASCII */
      if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) *p = '?';
    make_rid(srv, cn);
    *con_cls = cn;
    /* The header or keep-alive timeout was in force until now: a request in progress gets the
     * full idle timeout. */
    if (short_timeout(srv->o->http_header_timeout_s, srv->o) || short_timeout(srv->o->http_keepalive_timeout_s, srv->o))
      MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)srv->o->http_timeout_s);
    __atomic_add_fetch(&srv->active, 1, __ATOMIC_RELAXED);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
    if (declared > srv->o->max_body_bytes) {
      cn->too_big = 1;
      /* A body up to a few times the limit is read and dropped, so the client (which
       * is still sending) gets the 413 instead of a reset; a larger one is refused
       * before reading a byte of it. */
      if (declared / 4 > srv->o->max_body_bytes) {
        if (!auth_check(srv->keys, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization")))
          return send_fail(cn, 401, NULL, "invalid_api_key",
                           "invalid or missing API key: send it as 'Authorization: Bearer KEY'");
        return route_generate(srv, cn, OAI_CHAT);
      }
    }
    return MHD_YES;
  }
  if (*upload_size) {
    /* The idle timeout alone lets a client trickle a body forever: the whole upload must
     * fit in the same window. */
    if (engine_now() - cn->t0 > srv->o->http_timeout_s) {
      slog(SLOG_INFO, cn->rid, "body upload exceeded %d s: closing", srv->o->http_timeout_s);
      cn->status = 408;
      return MHD_NO;
    }
    if (!cn->too_big) {
      if (cn->len + *upload_size > srv->o->max_body_bytes) {
        cn->too_big = 1;
        free(cn->body);
        cn->body = NULL;
        cn->len = cn->cap = 0;
      } else {
        if (cn->len + *upload_size + 1 > cn->cap) {
          size_t nc = (cn->len + *upload_size + 1) * 2;
          char *nb = realloc(cn->body, nc);
          if (!nb) return MHD_NO;
          cn->body = nb;
          cn->cap = nc;
        }
        memcpy(cn->body + cn->len, upload_data, *upload_size);
        cn->len += *upload_size;
      }
    }
    *upload_size = 0;
    return MHD_YES;
  }
  if (cn->status) return MHD_YES; /* already answered (oversized body refused up front) */
  int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
  /* A request line that parsed but is not HTTP (binary noise up to a line end, a NUL inside the
   * method) is a 400, not a 404 or 405 that would suggest a real route or method. */
  static const char *const methods[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", NULL};
  int known = 0;
  for (int i = 0; methods[i] && !known; i++)
    known = !strcmp(method, methods[i]);
  if (!known || (url[0] != '/' && strcmp(url, "*")))
    return send_fail(cn, 400, NULL, "bad_request", "not an HTTP request line this server understands");
  /* The chat page (webui.h) holds no secret: served without a key; its API calls carry one. */
  enum MHD_Result wr;
  if (!srv->o->no_webui && !srv->speech && webui_route(c, method, url, cn->rid, &wr, &cn->status)) return wr;
  /* With API keys every route needs one, unknown routes included (a 404 would tell a
   * stranger which routes exist); health and metrics stay open for probes unless
   * --auth-health. */
  int open_route = !strcmp(url, "/healthz") || !strcmp(url, "/health") || !strcmp(url, "/metrics");
  if (srv->keys && (!open_route || srv->o->auth_health) &&
      !auth_check(srv->keys, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"))) {
    slog(SLOG_INFO, cn->rid, "rejected 401: missing or invalid API key");
    return send_fail(cn, 401, NULL, "invalid_api_key",
                     "invalid or missing API key: send it as 'Authorization: Bearer KEY'");
  }
  if (srv->speech)
    return speech_route(srv->speech, c, method, url, cn->rid, cn->body, cn->len, cn->too_big, srv->o->max_body_bytes,
                        &cn->status);
  if (!strcmp(url, "/v1/audio/speech"))
    return send_fail(cn, 400, "model", "model_not_speech",
                     "the loaded model is not a speech model: start anna-serve with a Qwen3-TTS folder for "
                     "/v1/audio/speech");
  if (!strcmp(url, "/tokenize") || !strcmp(url, "/detokenize")) {
    if (!post) return send_fail(cn, 405, NULL, "method_not_allowed", "this route takes POST");
    return route_tokens(srv, cn, !strcmp(url, "/detokenize"));
  }
  if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/completions")) {
    if (!post) return send_fail(cn, 405, NULL, "method_not_allowed", "this route takes POST");
    return route_generate(srv, cn,
                          !strcmp(url, "/v1/chat/completions") ? OAI_CHAT : OAI_COMPLETION);
  }
  if (!strcmp(url, "/v1/responses")) {
    if (!post) return send_fail(cn, 405, NULL, "method_not_allowed", "this route takes POST");
    return route_responses(srv, cn);
  }
  if (!strncmp(url, "/v1/responses/", 14))
    return route_response_id(srv, cn, url + 14, get, !strcmp(method, "DELETE"));
  if (!strcmp(url, "/v1/embeddings")) {
    if (!post) return send_fail(cn, 405, NULL, "method_not_allowed", "this route takes POST");
    return route_embeddings(srv, cn);
  }
  if (!strcmp(url, "/v1/audio/transcriptions") || !strcmp(url, "/v1/audio/translations")) {
    if (!post) return send_fail(cn, 405, NULL, "method_not_allowed", "this route takes POST");
    return route_audio(srv, cn, !strcmp(url, "/v1/audio/translations"));
  }
  if (!strcmp(url, "/healthz") || !strcmp(url, "/health")) {
    if (!get) return send_fail(cn, 405, NULL, "method_not_allowed", "this route takes GET");
    return route_health(srv, cn);
  }
  if (!strcmp(url, "/metrics")) {
    if (!get) return send_fail(cn, 405, NULL, "method_not_allowed", "this route takes GET");
    return route_metrics(srv, cn);
  }
  if (!strcmp(url, "/v1/models")) {
    if (!get) return send_fail(cn, 405, NULL, "method_not_allowed", "this route takes GET");
    return send_body(cn, 200, oai_models_json(&srv->cfg, srv->created), "application/json");
  }
  if (!strncmp(url, "/v1/models/", 11)) {
    if (!get) return send_fail(cn, 405, NULL, "method_not_allowed", "this route takes GET");
    if (strcmp(url + 11, srv->model_name))
      return send_fail(cn, 404, "model", "model_not_found", "no such model");
    json_t *o = json_pack("{s:s,s:s,s:I,s:s}", "id", srv->model_name, "object", "model", "created",
                          (json_int_t)srv->created, "owned_by", "anna");
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return send_body(cn, 200, s, "application/json");
  }
  char msg[320];
  snprintf(msg, sizeof msg, "no route for %s %.200s", method, url);
  return send_fail(cn, 404, NULL, "not_found", msg);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  server *srv = cls;
  conn *cn = *con_cls;
  if (!cn) return;
  /* Between requests a keep-alive connection only holds a thread and a slot: a pool of idle
   * clients must not keep new ones out for the whole idle timeout (issue 30). */
  if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && short_timeout(srv->o->http_keepalive_timeout_s, srv->o))
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)srv->o->http_keepalive_timeout_s);
  int n_gen = 0;
  if (cn->gr) {
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) engine_cancel(srv->eng, cn->gr);
    pthread_mutex_lock(&cn->gr->mu);
    for (int i = 0; i < cn->gr->n_choices; i++)
      n_gen += cn->gr->choices[i].n_gen;
    pthread_mutex_unlock(&cn->gr->mu);
    gen_request_release(cn->gr);
  }
  /* Nothing answered yet: a client that went away (mid-upload, say) is 499 "client closed
   * request" and an idle one 408, not server errors; 500 stays for a request the server
   * dropped itself. A client gone after the answer began is 499 below. */
  int status = cn->status                                            ? cn->status
               : toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT ||
                         toe == MHD_REQUEST_TERMINATED_READ_ERROR    ? 499
               : toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED       ? 408
                                                                     : 500;
  if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && status == 200) status = 499;
  metrics_count_response(&srv->mx, status);
  double ms = (engine_now() - cn->t0) * 1000.0;
  int gone = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK;
  json_t *f = json_pack("{s:s,s:s,s:i,s:f,s:i,s:i,s:b}", "method", cn->method, "path", cn->url,
                        "status", status, "duration_ms", ms, "prompt_tokens", cn->n_prompt,
                        "completion_tokens", n_gen, "client_gone", gone);
  slog_fields(SLOG_INFO, cn->rid, f, "%s %s %d %.1f ms prompt=%d completion=%d%s", cn->method,
              cn->url, status, ms, cn->n_prompt, n_gen, gone ? " (client gone)" : "");
  free(cn->body);
  free(cn);
  *con_cls = NULL;
  __atomic_sub_fetch(&srv->active, 1, __ATOMIC_RELAXED);
}

/* A new connection gets the short header timeout until its first request line and headers
 * are in (on_request restores --http-timeout-seconds): bytes that are not HTTP and never end a
 * line (a TLS ClientHello, noise) are cut after that, not after the idle timeout. MHD calls
 * this on its accepting thread, before the connection's own thread starts. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
  server *srv = cls;
  (void)socket_context;
  if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
    __atomic_sub_fetch(&srv->n_conns, 1, __ATOMIC_RELAXED);
    return;
  }
  __atomic_add_fetch(&srv->n_conns, 1, __ATOMIC_RELAXED);
  if (short_timeout(srv->o->http_header_timeout_s, srv->o))
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)srv->o->http_header_timeout_s);
}

/* Past --max-connections a new connection is accepted and closed at once: left in the listen
 * backlog (what MHD's own limit does) the client would wait until some connection times out. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen) {
  server *srv = cls;
  (void)addr;
  (void)addrlen;
  if (__atomic_load_n(&srv->n_conns, __ATOMIC_RELAXED) < srv->o->max_connections) return MHD_YES;
  slog(SLOG_WARN, NULL, "connection refused: %d open (--max-connections)", srv->o->max_connections);
  return MHD_NO;
}

/* The tool-call and reasoning families: the flags, else what the chat template's text shows
 * (outparse_detect); the reasoning split is on when a family is named or --reasoning-format
 * deepseek asks for it. */
static void resolve_parsers(server *srv) {
  const server_options *o = srv->o;
  size_t len = 0;
  const char *src = anna_chat_template_source(anna_text_template(srv->text), &len);
  int dt, dr;
  outparse_detect(src, len, &dt, &dr);
  srv->cfg.tool_parser = o->tool_parser == OUTPARSE_AUTO ? dt : o->tool_parser;
  srv->cfg.reasoning_parser = o->reasoning_parser == OUTPARSE_AUTO ? dr
                              : o->reasoning_parser == OUTPARSE_UNSET ? (o->reasoning_deepseek ? dr : OUTPARSE_REASONING_NONE)
                                                                      : o->reasoning_parser;
  slog(SLOG_INFO, NULL, "tool parser %s, reasoning parser %s%s", outparse_tools_name(srv->cfg.tool_parser),
       outparse_reasoning_name(srv->cfg.reasoning_parser), src ? "" : " (no chat template)");
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  server *srv = cls;
  char buf[512];
  vsnprintf(buf, sizeof buf, fmt, ap);
  size_t n = strlen(buf);
  while (n && buf[n - 1] == '\n')
    buf[--n] = '\0';
  /* Only the starting thread logs while mhd_starting is set: no other thread writes mhd_last. */
  if (__atomic_load_n(&srv->mhd_starting, __ATOMIC_ACQUIRE)) snprintf(srv->mhd_last, sizeof srv->mhd_last, "%s", buf);
  slog(SLOG_DEBUG, NULL, "http: %s", buf);
}

/* A PEM file -> a NUL-terminated text (caller frees); what went wrong names the flag and path. */
static int read_pem(const char *flag, const char *path, char **out, char *err, size_t errlen) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return anna_err(err, errlen, ANNA_EIO, "%s %s: %s", flag, path, strerror(errno));
  const size_t cap = 1 << 20; /* a certificate chain is kilobytes; more is not a PEM file */
  char *buf = malloc(cap + 1);
  size_t n = buf ? fread(buf, 1, cap + 1, f) : 0;
  const int rerr = ferror(f);
  fclose(f);
  if (!buf) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (rerr || n > cap || !n || !memmem(buf, n, "-----BEGIN ", 11)) {
    free(buf);
    return anna_err(err, errlen, ANNA_EFORMAT, "%s %s: %s", flag, path,
                    rerr ? "read error" : n > cap ? "larger than 1 MiB" : "not a PEM file (no -----BEGIN line)");
  }
  buf[n] = '\0';
  *out = buf;
  return 0;
}

/* ---- lifecycle ---- */

static void log_metrics(server *srv) {
  if (!srv->eng) return; /* speech mode */
  engine_stats st;
  engine_get_stats(srv->eng, &st);
  pthread_mutex_lock(&srv->mx.mu);
  metrics c = srv->mx;
  pthread_mutex_unlock(&srv->mx.mu);
  slog(SLOG_INFO, NULL,
       "metrics: running=%d waiting=%d kv=%lld/%lld requests=%llu 4xx=%llu 5xx=%llu rejected=%llu "
       "cancelled=%llu "
       "prompt_tok=%llu gen_tok=%llu steps=%llu batch=%.2f ttft_p50=%.1fms ttft_p99=%.1fms "
       "itl_p50=%.1fms "
       "itl_p99=%.1fms rss=%ldMiB prompt_cache_hit_rate=%.3f prefix_block_hits=%llu "
       "prefix_block_misses=%llu "
       "prefix_token_hit_rate=%.3f exact_hits=%llu/%llu kv_blocks_free=%lld/%lld preemptions=%lld",
       st.running, st.waiting, (long long)st.kv_tokens, (long long)st.kv_capacity,
       (unsigned long long)c.requests, (unsigned long long)c.responses_4xx,
       (unsigned long long)c.responses_5xx, (unsigned long long)c.rejected_busy,
       (unsigned long long)c.cancelled, (unsigned long long)c.prompt_tokens,
       (unsigned long long)c.completion_tokens, (unsigned long long)c.decode_steps,
       c.decode_steps ? (double)c.batch_seqs / (double)c.decode_steps : 0.0,
       metrics_quantile(&c.ttft, 0.5), metrics_quantile(&c.ttft, 0.99),
       metrics_quantile(&c.itl, 0.5), metrics_quantile(&c.itl, 0.99), rss_bytes() >> 20,
       c.cache_reused_tokens + c.prompt_tokens
           ? (double)c.cache_reused_tokens / (double)(c.cache_reused_tokens + c.prompt_tokens)
           : 0.0,
       (unsigned long long)c.prefix_hit_blocks, (unsigned long long)c.prefix_miss_blocks,
       c.prefix_hit_tokens + c.prefix_miss_tokens
           ? (double)c.prefix_hit_tokens / (double)(c.prefix_hit_tokens + c.prefix_miss_tokens)
           : 0.0,
       (unsigned long long)c.exact_hits, (unsigned long long)c.exact_lookups,
       (long long)st.kv.free_blocks, (long long)st.kv.n_blocks, (long long)st.preemptions);
}

static void derive_name(const char *path, char *out, size_t cap) {
  size_t n = strlen(path);
  while (n > 1 && path[n - 1] == '/')
    n--;
  const char *b = path;
  for (size_t i = 0; i < n; i++)
    if (path[i] == '/') b = path + i + 1;
  size_t bl = (size_t)(path + n - b);
  if (bl > 5 && !memcmp(b + bl - 5, ".gguf", 5)) bl -= 5;
  if (bl >= cap) bl = cap - 1;
  memcpy(out, b, bl);
  out[bl] = '\0';
}

int server_run(const server_options *o, char *err, size_t errlen) {
  slog_configure(o->log_json, o->log_level);
  /* Signals go to the main thread only: every thread created below inherits this mask. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);

  server *srv = calloc(1, sizeof *srv);
  if (!srv) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  srv->o = o;
  srv->created = (long long)time(NULL);
  metrics_init(&srv->mx);
  int rc = 0;
  struct MHD_Daemon *d = NULL;
  struct addrinfo *ai = NULL;
  double t0 = engine_now();
  /* The responses store first: a bad --responses-db fails before the model loads. */
  if ((rc = resp_store_create(&srv->rstore, o->responses_store_max, o->responses_db, o->responses_ttl_s, err, errlen)))
    goto done;
  if (o->responses_db)
    slog(SLOG_INFO, NULL, "responses db %s (ttl %s%lld s)", o->responses_db, o->responses_ttl_s > 0 ? "" : "off, ",
         o->responses_ttl_s);
  /* HTTPS: checked before the model loads, so a wrong path fails at once. */
  if (o->ssl_cert_file || o->ssl_key_file) {
    if (!o->ssl_cert_file || !o->ssl_key_file) {
      rc = anna_err(err, errlen, ANNA_EINVAL, "--ssl-cert-file and --ssl-key-file go together");
      goto done;
    }
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
      rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "--ssl-cert-file: this libmicrohttpd was built without TLS (GnuTLS); install a build with "
                    "HTTPS support (Debian's libmicrohttpd12 has it) or put a TLS proxy in front");
      goto done;
    }
    if ((rc = read_pem("--ssl-cert-file", o->ssl_cert_file, &srv->tls_cert, err, errlen)) ||
        (rc = read_pem("--ssl-key-file", o->ssl_key_file, &srv->tls_key, err, errlen)))
      goto done;
  }
  anna_model_options mo = {.device = o->device,
                           .dtype = o->dtype,
                           .tuning = o->eng.tuning,
                           .weight_quant = o->weight_quant,
                           .mmproj = o->mmproj,
                           .progress = o->load_progress,
                           .progress_user = o->load_progress_user};
  if (anna_speech_probe(o->model_path)) {
    derive_name(o->model_path, srv->model_name, sizeof srv->model_name);
    if (o->model_name && *o->model_name) snprintf(srv->model_name, sizeof srv->model_name, "%s", o->model_name);
    if ((rc = speech_server_create(&srv->speech, o->model_path, srv->model_name, o->device, o->eng.n_threads,
                                   o->debug_hooks, err, errlen)))
      goto done;
    goto listen;
  }
  if ((rc = anna_model_load(&srv->m, o->model_path, &mo, err, errlen))) goto done;
  if ((rc = anna_text_open(&srv->text, o->model_path, 0, err, errlen))) goto done;
  if (o->model_name && *o->model_name)
    snprintf(srv->model_name, sizeof srv->model_name, "%s", o->model_name);
  else
    derive_name(o->model_path, srv->model_name, sizeof srv->model_name);
  if ((rc = engine_create(&srv->eng, srv->m, srv->text, &o->eng, &srv->mx, err, errlen))) goto done;
  const engine_options *eo = engine_get_options(srv->eng);
  {
    anna_stage_info st[16];
    const int ns = engine_stages(srv->eng, st, 16);
    for (int i = 0; ns > 1 && i < ns && i < 16; i++) /* the placement of a layer split */
      fprintf(stderr, "[anna-serve] stage %d: %s, layers %d..%d, weights %.1f MiB, kv %.1f MiB\n", i, st[i].device,
              st[i].layer_begin, st[i].layer_end - 1, (double)st[i].weight_bytes / 1048576.0,
              (double)st[i].kv_bytes / 1048576.0);
  }
  if (o->verbose) {
    char tb[2048];
    engine_tuning(srv->eng, tb, sizeof tb);
    fprintf(stderr, "[anna-serve] tuning:\n%s", tb);
    engine_stats est;
    engine_get_stats(srv->eng, &est);
    fprintf(stderr, "[anna-serve] kv cache: %s\n", anna_kv_type_name(est.kv.kv_type));
  }
  srv->cfg = (oai_config){.model_name = srv->model_name,
                          .text = srv->text,
                          .n_ctx = eo->n_ctx,
                          .reasoning_deepseek = o->reasoning_deepseek,
                          .tool_parser = OUTPARSE_TOOLS_NONE,
                          .reasoning_parser = OUTPARSE_REASONING_NONE,
                          .defaults = o->defaults,
                          .default_max_tokens = o->default_max_tokens,
                          .max_n = 16,
                          .default_enable_thinking = o->default_enable_thinking,
                          .debug_hooks = o->debug_hooks,
                          /* images: 4096 x 4096 pixels, 8 images, 20 MB each unless the flags say */
                          .model = srv->m,
                          .max_image_pixels = o->max_image_pixels > 0 ? o->max_image_pixels : 4096 * 4096,
                          .max_images = o->max_images > 0 ? o->max_images : 8,
                          .max_image_bytes = o->max_image_bytes > 0 ? o->max_image_bytes : 20u << 20,
                          .allowed_image_domains = o->allowed_image_domains,
                          .image_fetch_timeout_s = o->image_fetch_timeout_s > 0 ? o->image_fetch_timeout_s : 10,
                          /* video: 2 per request, 32 MiB, 256 sampled frames, 600 s, 4K frames */
                          .max_videos = o->max_videos > 0 ? o->max_videos : 2,
                          .max_video_bytes = o->max_video_bytes > 0 ? o->max_video_bytes : 32u << 20,
                          .max_video_frames = o->max_video_frames > 0 ? o->max_video_frames : 256,
                          .max_video_seconds = o->max_video_seconds > 0 ? o->max_video_seconds : 600,
                          .max_video_pixels = o->max_video_pixels > 0 ? o->max_video_pixels : 3840 * 2160};
  resolve_parsers(srv);
  imgfetch_global_init();
listen:
  if ((rc = auth_keys_create(&srv->keys, o->api_keys, o->n_api_keys, o->api_key_file, err, errlen))) goto done;
  if (srv->keys)
    slog(SLOG_INFO, NULL, "API keys: %d (health and metrics %s)", auth_count(srv->keys),
         o->auth_health ? "need one too" : "open");

  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
  char port[16];
  snprintf(port, sizeof port, "%d", o->port);
  int gai = getaddrinfo(o->host ? o->host : "127.0.0.1", port, &hints, &ai);
  if (gai) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "--host %s: %s", o->host, gai_strerror(gai));
    goto done;
  }
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                   MHD_USE_ERROR_LOG | MHD_USE_ITC;
  if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  struct MHD_OptionItem tls_opts[] = {{MHD_OPTION_HTTPS_MEM_KEY, 0, srv->tls_key},
                                      {MHD_OPTION_HTTPS_MEM_CERT, 0, srv->tls_cert},
                                      {MHD_OPTION_END, 0, NULL}};
  if (srv->tls_cert) flags |= MHD_USE_TLS;
  else tls_opts[0].option = MHD_OPTION_END;
  __atomic_store_n(&srv->mhd_starting, 1, __ATOMIC_RELEASE);
  d = MHD_start_daemon(
      flags, (uint16_t)o->port, on_accept, srv, on_request, srv, MHD_OPTION_NOTIFY_COMPLETED,
      on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->http_timeout_s,
      /* MHD's own cap only backs ours up (on_accept refuses first) */
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections + 16u, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      (unsigned)o->max_connections_per_ip, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
      MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
      (size_t)256 * 1024, MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)256, MHD_OPTION_ARRAY, tls_opts, MHD_OPTION_END);
  const int start_errno = errno;
  __atomic_store_n(&srv->mhd_starting, 0, __ATOMIC_RELEASE);
  if (!d) {
    if (srv->tls_cert && srv->mhd_last[0]) /* a key or certificate GnuTLS refused */
      rc = anna_err(err, errlen, ANNA_EFORMAT,
                    "cannot start HTTPS on %s:%d (--ssl-cert-file %s, --ssl-key-file %s): %s (the key must be the "
                    "certificate's, both PEM)",
                    o->host, o->port, o->ssl_cert_file, o->ssl_key_file, srv->mhd_last);
    else
      rc = anna_err(err, errlen, ANNA_EIO, "cannot listen on %s:%d: %s", o->host, o->port,
                    srv->mhd_last[0] ? srv->mhd_last : strerror(start_errno));
    goto done;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  int bound = di ? di->port : o->port;
  if (srv->speech)
    slog(SLOG_INFO, NULL, "speech model %s (%s) loaded in %.2f s; requests run one at a time", srv->model_name,
         speech_server_describe(srv->speech), engine_now() - t0);
  else {
    eo = engine_get_options(srv->eng); /* set again: the speech path jumps over its declaration */
    slog(SLOG_INFO, NULL, "model %s (%s) loaded in %.2f s; slots=%d ctx=%d batch=%d max_batch=%d",
         srv->model_name, anna_model_describe(srv->m), engine_now() - t0, eo->n_seq, eo->n_ctx,
         eo->n_batch, eo->max_batch_size);
  }
  slog(SLOG_INFO, NULL, "listening on %s://%s:%d", srv->tls_cert ? "https" : "http", o->host ? o->host : "127.0.0.1",
       bound);

  double next_log = engine_now() + o->metrics_log_interval_s;
  /* Expired responses: deleted on read, and by this sweep at least once a minute (more often
   * for a short TTL) so the file does not grow with responses nobody reads again. */
  const double sweep_every =
      o->responses_ttl_s > 0 ? (o->responses_ttl_s < 120 ? (double)o->responses_ttl_s / 2 : 60) : 0;
  double next_sweep = engine_now() + sweep_every;
  for (;;) {
    struct timespec ts = {0, 250 * 1000 * 1000};
    int sig = sigtimedwait(&set, NULL, &ts);
    if (sig == SIGTERM || sig == SIGINT) {
      slog(SLOG_INFO, NULL, "signal %d: draining (up to %.0f s)", sig, o->shutdown_timeout_s);
      break;
    }
    if (sweep_every > 0 && engine_now() >= next_sweep) {
      char serr[400];
      const int n = resp_store_sweep(srv->rstore, serr, sizeof serr);
      if (n < 0) slog(SLOG_ERROR, NULL, "expired responses sweep: %s", serr);
      else if (n > 0) slog(SLOG_DEBUG, NULL, "expired responses: %d deleted", n);
      next_sweep = engine_now() + sweep_every;
    }
    if (o->metrics_log_interval_s > 0 && engine_now() >= next_log) {
      log_metrics(srv);
      next_log = engine_now() + o->metrics_log_interval_s;
    }
  }
  /* Drain: stop accepting, let the engine finish (or cut) what it has, then give the
   * connection threads time to write their last bytes before the daemon goes. */
  MHD_socket ls = MHD_quiesce_daemon(d);
  if (ls != MHD_INVALID_SOCKET) close(ls);
  if (srv->eng) engine_drain(srv->eng, o->shutdown_timeout_s);
  double until = engine_now() + 10;
  while (__atomic_load_n(&srv->active, __ATOMIC_RELAXED) > 0 && engine_now() < until)
    usleep(10 * 1000);
  log_metrics(srv);
  slog(SLOG_INFO, NULL, "shut down cleanly");
done:
  if (d) MHD_stop_daemon(d);
  speech_server_free(srv->speech);
  if (ai) freeaddrinfo(ai);
  engine_free(srv->eng);
  anna_text_free(srv->text);
  anna_model_free(srv->m);
  metrics_destroy(&srv->mx);
  auth_free(srv->keys);
  resp_store_free(srv->rstore);
  free(srv->tls_cert);
  free(srv->tls_key);
  free(srv);
  return rc;
}
