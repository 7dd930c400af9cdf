/* responses.c: the Responses API over the chat path (see responses.h). */
#include "responses.h"

#include "outparse.h"
#include "respstore.h"

#include <ctype.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- store ---- */

typedef struct resp_entry {
  char id[64];
  long long created; /* unix seconds: the TTL counts from here */
  json_t *response;    /* the response object as returned */
  json_t *input_items; /* this request's input items, ids filled in */
  json_t *ctx_msgs;    /* chat messages of the whole context (instructions excluded) + output */
  char *instructions;  /* NULL: none */
  json_t *tools;       /* nested chat tools or NULL */
  int no_think;
  int32_t *ids; /* prompt + generated ids ending in an end-of-turn token; NULL: not spliceable */
  size_t n_ids;
  struct resp_entry *prev, *next; /* most recently used first */
} resp_entry;

struct resp_store {
  pthread_mutex_t mu;
  int max, n;
  resp_entry *head, *tail;
  respstore *db; /* NULL: memory only */
  long long ttl; /* seconds; <= 0: no expiry */
};

int resp_store_create(resp_store **out, int max_entries, const char *db_path, long long ttl_s, char *err,
                      size_t errlen) {
  *out = NULL;
  resp_store *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  pthread_mutex_init(&s->mu, NULL);
  s->max = max_entries;
  s->ttl = ttl_s;
  if (db_path && *db_path) {
    int rc = respstore_open(&s->db, db_path, ttl_s, err, errlen);
    if (rc) {
      pthread_mutex_destroy(&s->mu);
      free(s);
      return rc;
    }
    if (s->max < 1) s->max = 1; /* the memory side is only a cache in front of the file */
  }
  *out = s;
  return 0;
}

static void entry_free(resp_entry *e) {
  if (!e) return;
  json_decref(e->response);
  json_decref(e->input_items);
  json_decref(e->ctx_msgs);
  json_decref(e->tools);
  free(e->instructions);
  free(e->ids);
  free(e);
}

static void unlink_entry(resp_store *s, resp_entry *e) {
  if (e->prev) e->prev->next = e->next;
  else s->head = e->next;
  if (e->next) e->next->prev = e->prev;
  else s->tail = e->prev;
  e->prev = e->next = NULL;
  s->n--;
}

static void push_front(resp_store *s, resp_entry *e) {
  e->prev = NULL;
  e->next = s->head;
  if (s->head) s->head->prev = e;
  s->head = e;
  if (!s->tail) s->tail = e;
  s->n++;
}

void resp_store_free(resp_store *s) {
  if (!s) return;
  while (s->head) {
    resp_entry *e = s->head;
    unlink_entry(s, e);
    entry_free(e);
  }
  respstore_close(s->db);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* Under mu. A linear walk: the store holds at most a few thousand entries. */
static resp_entry *find(resp_store *s, const char *id) {
  for (resp_entry *e = s->head; e; e = e->next)
    if (!strcmp(e->id, id)) return e;
  return NULL;
}

static int expired(const resp_store *s, const resp_entry *e, long long now) {
  return s->ttl > 0 && e->created + s->ttl <= now;
}

/* Under mu: makes room for one more entry (evicted entries stay in the file, if any). */
static void make_room(resp_store *s) {
  while (s->n >= s->max && s->tail) {
    resp_entry *old = s->tail;
    unlink_entry(s, old);
    entry_free(old);
  }
}

static char *dump_or_null(const json_t *v) {
  return v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
}

/* Stores e (taken: freed on every path). 0, or < 0 with err filled (the file failed). */
static int store_put(resp_store *s, resp_entry *e, char *err, size_t errlen) {
  int rc = 0;
  if (s->db) {
    respstore_row row = {.created = e->created,
                         .response = dump_or_null(e->response),
                         .input_items = dump_or_null(e->input_items),
                         .ctx_msgs = dump_or_null(e->ctx_msgs),
                         .instructions = e->instructions,
                         .tools = dump_or_null(e->tools),
                         .no_think = e->no_think,
                         .ids = e->ids,
                         .n_ids = e->n_ids};
    snprintf(row.id, sizeof row.id, "%s", e->id);
    if (!row.response || !row.input_items || !row.ctx_msgs || (e->tools && !row.tools))
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    else
      rc = respstore_put(s->db, &row, err, errlen);
    free(row.response), free(row.input_items), free(row.ctx_msgs), free(row.tools);
  }
  pthread_mutex_lock(&s->mu);
  if (s->max <= 0 || rc) {
    pthread_mutex_unlock(&s->mu);
    entry_free(e);
    return rc;
  }
  make_room(s);
  push_front(s, e);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

static json_t *load_json(const char *t) {
  return t ? json_loads(t, JSON_DECODE_ANY, NULL) : NULL;
}

/* A stored row -> a cache entry (NULL: out of memory or a row whose JSON does not parse). */
static resp_entry *entry_from_row(const respstore_row *row) {
  resp_entry *e = calloc(1, sizeof *e);
  if (!e) return NULL;
  snprintf(e->id, sizeof e->id, "%s", row->id);
  e->created = row->created;
  e->response = load_json(row->response);
  e->input_items = load_json(row->input_items);
  e->ctx_msgs = load_json(row->ctx_msgs);
  e->tools = load_json(row->tools);
  e->instructions = row->instructions ? strdup(row->instructions) : NULL;
  e->no_think = row->no_think;
  if (row->ids && (e->ids = malloc(sizeof *e->ids * row->n_ids))) {
    memcpy(e->ids, row->ids, sizeof *e->ids * row->n_ids);
    e->n_ids = row->n_ids;
  }
  if (!json_is_object(e->response) || !json_is_array(e->input_items) || !json_is_array(e->ctx_msgs) ||
      (row->tools && !e->tools) || (row->instructions && !e->instructions) || (row->ids && !e->ids)) {
    entry_free(e);
    return NULL;
  }
  return e;
}

/* Under mu: the live entry for id, most recently used now (a read is a use: eviction goes by
 * last use), loaded from the file on a cache miss; expired entries are dropped from both.
 * NULL with *status 404 (absent or expired) or 500 (the file failed; err says why). */
static resp_entry *acquire(resp_store *s, const char *id, int *status, char *err, size_t errlen) {
  const long long now = (long long)time(NULL);
  resp_entry *e = find(s, id);
  *status = 404;
  if (e && expired(s, e, now)) {
    unlink_entry(s, e);
    entry_free(e);
    e = NULL;
    if (s->db && respstore_delete(s->db, id, err, errlen) < 0) *status = 500;
    return NULL;
  }
  if (e) {
    unlink_entry(s, e);
    push_front(s, e);
    return e;
  }
  if (!s->db || s->max <= 0) return NULL;
  respstore_row row;
  const int got = respstore_get(s->db, id, now, &row, err, errlen);
  if (got < 0) *status = 500;
  if (got <= 0) return NULL;
  e = entry_from_row(&row);
  respstore_row_clear(&row);
  if (!e) {
    anna_err(err, errlen, ANNA_EFORMAT, "stored response '%.64s' could not be read back (out of memory or bad JSON)",
             id);
    *status = 500;
    return NULL;
  }
  make_room(s);
  push_front(s, e);
  return e;
}

int resp_store_sweep(resp_store *s, char *err, size_t errlen) {
  const long long now = (long long)time(NULL);
  int n = 0;
  pthread_mutex_lock(&s->mu);
  for (resp_entry *e = s->head, *next; e; e = next) {
    next = e->next;
    if (expired(s, e, now)) {
      unlink_entry(s, e);
      entry_free(e);
      n++;
    }
  }
  pthread_mutex_unlock(&s->mu);
  if (s->db) {
    const int d = respstore_sweep(s->db, now, err, errlen);
    if (d < 0) return d;
    n = d > n ? d : n;
  }
  return n;
}

/* ---- ids ---- */

static void make_id(char *out, size_t cap, const char *prefix) {
  static uint64_t seq;
  const uint64_t n = __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t x = ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^ (n * 0x9E3779B97F4A7C15ULL);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  snprintf(out, cap, "%s_%016llx%06llx", prefix, (unsigned long long)x, (unsigned long long)(n & 0xffffff));
}

/* ---- the job ---- */

struct resp_job {
  const oai_config *cfg;
  resp_store *st;
  oai_job chat;
  char id[64];
  long long created;
  int store, no_think, has_images;
  json_t *echo;        /* request settings echoed in the response (owned) */
  json_t *input_items; /* this request's items, ids filled in */
  json_t *ctx_msgs;    /* context messages before the output (instructions excluded) */
  char *instructions;
  json_t *tools; /* nested */
  char prev_id[64];
};

oai_job *resp_job_chat(resp_job *j) {
  return &j->chat;
}

void resp_job_free(resp_job *j) {
  if (!j) return;
  oai_job_clear(&j->chat);
  json_decref(j->echo);
  json_decref(j->input_items);
  json_decref(j->ctx_msgs);
  json_decref(j->tools);
  free(j->instructions);
  free(j);
}

static const char *jtype(const json_t *v) {
  if (!v) return "nothing (missing)";
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a number";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  default: return "null";
  }
}

static int is_set(const json_t *v) {
  return v && !json_is_null(v);
}

/* Message content of an input item -> chat content (string or parts). */
static int item_content(const json_t *c, const char *p, int *images, json_t **out, oai_error *e) {
  if (json_is_string(c)) {
    *out = json_incref((json_t *)c);
    return 0;
  }
  if (!json_is_array(c))
    return oai_fail(e, 400, p, "invalid_type", "'%s' must be a string or an array of content parts, got %s", p,
                    jtype(c));
  json_t *parts = json_array();
  for (size_t i = 0; i < json_array_size(c); i++) {
    json_t *part = json_array_get(c, i), *t = json_object_get(part, "type");
    const char *ts = json_is_string(t) ? json_string_value(t) : "";
    if (!strcmp(ts, "input_text") || !strcmp(ts, "output_text") || !strcmp(ts, "text")) {
      json_t *tx = json_object_get(part, "text");
      if (!json_is_string(tx)) {
        json_decref(parts);
        return oai_fail(e, 400, p, "invalid_type", "'%s[%zu].text' must be a string", p, i);
      }
      json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", tx));
    } else if (!strcmp(ts, "input_image")) {
      json_t *u = json_object_get(part, "image_url"), *d = json_object_get(part, "detail");
      if (!json_is_string(u)) {
        json_decref(parts);
        return oai_fail(e, 400, p, is_set(json_object_get(part, "file_id")) ? "unsupported_parameter" : "invalid_type",
                        "'%s[%zu]': input_image needs 'image_url' (a data: or http(s) URL); 'file_id' is not "
                        "supported (this server has no Files API)", p, i);
      }
      json_t *iu = json_pack("{s:O}", "url", u);
      if (json_is_string(d)) json_object_set(iu, "detail", d);
      json_array_append_new(parts, json_pack("{s:s,s:o}", "type", "image_url", "image_url", iu));
      (*images)++;
    } else {
      json_decref(parts);
      return oai_fail(e, 400, p, "unsupported_content",
                      "'%s[%zu].type' '%.40s' is not supported (input_text, output_text, input_image)", p, i, ts);
    }
  }
  *out = parts;
  return 0;
}

/* The assistant message the last chat message is, or a new one appended. */
static json_t *open_assistant(json_t *msgs, int *open) {
  if (*open) return json_array_get(msgs, json_array_size(msgs) - 1);
  json_t *m = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
  json_array_append_new(msgs, m);
  *open = 1;
  return m;
}

/* Input items -> chat messages appended to msgs; the items (ids filled in) to items. */
static int parse_input(json_t *input, json_t *msgs, json_t *items, int *images, oai_error *e) {
  char id[64];
  if (json_is_string(input)) {
    json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", input));
    make_id(id, sizeof id, "msg");
    json_array_append_new(items, json_pack("{s:s,s:s,s:s,s:s,s:[{s:s,s:O}]}", "type", "message", "id", id, "status",
                                           "completed", "role", "user", "content", "type", "input_text", "text",
                                           input));
    return 0;
  }
  if (!json_is_array(input))
    return oai_fail(e, 400, "input", "invalid_type", "'input' must be a string or an array of items, got %s",
                    jtype(input));
  int asst_open = 0; /* the last message is an assistant one that later items may extend */
  const char *reasoning = NULL;
  for (size_t i = 0; i < json_array_size(input); i++) {
    json_t *it = json_array_get(input, i);
    char p[48];
    snprintf(p, sizeof p, "input[%zu]", i);
    if (!json_is_object(it)) return oai_fail(e, 400, p, "invalid_type", "'%s' must be an object, got %s", p, jtype(it));
    json_t *ty = json_object_get(it, "type"), *role = json_object_get(it, "role");
    const char *ts = json_is_string(ty) ? json_string_value(ty) : (is_set(role) ? "message" : "");
    json_t *copy = json_deep_copy(it);
    if (!json_object_get(copy, "type")) json_object_set_new(copy, "type", json_string(ts));
    if (!json_is_string(json_object_get(copy, "id"))) {
      make_id(id, sizeof id, !strcmp(ts, "message") ? "msg" : !strcmp(ts, "function_call_output") ? "fco" : "item");
      json_object_set_new(copy, "id", json_string(id));
    }
    json_array_append_new(items, copy);
    if (!strcmp(ts, "message")) {
      const char *rs = json_is_string(role) ? json_string_value(role) : "";
      if (strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "system") && strcmp(rs, "developer"))
        return oai_fail(e, 400, p, "invalid_value", "'%s.role' must be user, assistant, system or developer", p);
      char cp[64];
      snprintf(cp, sizeof cp, "%s.content", p);
      json_t *content;
      if (item_content(json_object_get(it, "content"), cp, images, &content, e)) return -1;
      if (!strcmp(rs, "assistant")) {
        /* joins a turn that reasoning opened; after a turn with text, a new turn */
        json_t *cur = asst_open ? json_array_get(msgs, json_array_size(msgs) - 1) : NULL;
        json_t *cc = cur ? json_object_get(cur, "content") : NULL;
        if (cur && (json_object_get(cur, "tool_calls") || !json_is_string(cc) || json_string_length(cc))) asst_open = 0;
        json_t *m = open_assistant(msgs, &asst_open);
        json_object_set_new(m, "content", content);
      } else {
        json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", rs, "content", content));
        asst_open = 0;
      }
    } else if (!strcmp(ts, "function_call")) {
      json_t *name = json_object_get(it, "name"), *args = json_object_get(it, "arguments"),
             *cid = json_object_get(it, "call_id");
      if (!json_is_string(name) || !json_is_string(args) || !json_is_string(cid))
        return oai_fail(e, 400, p, "invalid_value", "'%s' (function_call) needs string 'call_id', 'name' and 'arguments'",
                        p);
      json_t *m = open_assistant(msgs, &asst_open);
      json_t *calls = json_object_get(m, "tool_calls");
      if (!calls) json_object_set_new(m, "tool_calls", calls = json_array());
      json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", cid, "type", "function", "function", "name",
                                             name, "arguments", args));
    } else if (!strcmp(ts, "function_call_output")) {
      json_t *cid = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
      if (!json_is_string(cid)) return oai_fail(e, 400, p, "invalid_value", "'%s.call_id' must be a string", p);
      json_t *content;
      char cp[64];
      snprintf(cp, sizeof cp, "%s.output", p);
      if (item_content(out, cp, images, &content, e)) return -1;
      json_array_append_new(msgs, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", cid, "content", content));
      asst_open = 0;
    } else if (!strcmp(ts, "reasoning")) {
      /* Its text goes with the assistant turn it precedes (reasoning_content). */
      json_t *c = json_object_get(it, "content");
      if (!json_is_array(c)) c = json_object_get(it, "summary");
      for (size_t k = 0; json_is_array(c) && k < json_array_size(c); k++) {
        json_t *tx = json_object_get(json_array_get(c, k), "text");
        if (json_is_string(tx)) reasoning = json_string_value(tx);
      }
      if (reasoning) {
        json_t *m = open_assistant(msgs, &asst_open);
        json_object_set_new(m, "reasoning_content", json_string(reasoning));
      }
    } else {
      return oai_fail(e, 400, p, "unsupported_value",
                      "input item type '%.40s' is not supported (message, function_call, function_call_output, "
                      "reasoning)", ts);
    }
  }
  return 0;
}

/* Flat Responses tools -> nested chat tools (NULL when none). */
static int parse_tools(json_t *tools, json_t **out, oai_error *e) {
  *out = NULL;
  if (!is_set(tools)) return 0;
  if (!json_is_array(tools)) return oai_fail(e, 400, "tools", "invalid_type", "'tools' must be an array, got %s", jtype(tools));
  json_t *nested = json_array();
  for (size_t i = 0; i < json_array_size(tools); i++) {
    json_t *t = json_array_get(tools, i), *ty = json_object_get(t, "type");
    char p[32];
    snprintf(p, sizeof p, "tools[%zu]", i);
    if (!json_is_object(t) || !json_is_string(ty)) {
      json_decref(nested);
      return oai_fail(e, 400, p, "invalid_value", "'%s' must be {\"type\": \"function\", \"name\": ...}", p);
    }
    if (strcmp(json_string_value(ty), "function")) {
      json_decref(nested);
      return oai_fail(e, 400, p, "unsupported_value",
                      "tool type '%.40s' is not supported: this server runs function tools only", json_string_value(ty));
    }
    json_t *fn = json_object();
    const char *keys[] = {"name", "description", "parameters"};
    for (int k = 0; k < 3; k++) {
      json_t *v = json_object_get(t, keys[k]);
      if (is_set(v)) json_object_set(fn, keys[k], v);
    }
    json_t *strict = json_object_get(t, "strict");
    if (is_set(strict) && !json_is_boolean(strict)) {
      json_decref(fn);
      json_decref(nested);
      return oai_fail(e, 400, p, "invalid_type", "'%s.strict' must be a boolean", p);
    }
    json_array_append_new(nested, json_pack("{s:s,s:o}", "type", "function", "function", fn));
  }
  *out = nested;
  return 0;
}

static int parse_tool_choice(json_t *tc, json_t **out, oai_error *e) {
  *out = NULL;
  if (!is_set(tc)) return 0;
  if (json_is_string(tc)) {
    *out = json_incref(tc);
    return 0;
  }
  json_t *ty = json_object_get(tc, "type"), *name = json_object_get(tc, "name");
  if (json_is_object(tc) && json_is_string(ty) && !strcmp(json_string_value(ty), "function") && json_is_string(name)) {
    *out = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name);
    return 0;
  }
  return oai_fail(e, 400, "tool_choice", "invalid_value",
                  "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}");
}

/* text.format -> chat response_format (NULL: plain text). */
static int parse_text(json_t *text, json_t **out, oai_error *e) {
  *out = NULL;
  if (!is_set(text)) return 0;
  if (!json_is_object(text)) return oai_fail(e, 400, "text", "invalid_type", "'text' must be an object");
  json_t *verb = json_object_get(text, "verbosity");
  if (is_set(verb) && !(json_is_string(verb) && !strcmp(json_string_value(verb), "medium")))
    return oai_fail(e, 400, "text.verbosity", "unsupported_value",
                    "'text.verbosity' other than 'medium' is not supported (the model has no verbosity control)");
  json_t *f = json_object_get(text, "format");
  if (!is_set(f)) return 0;
  json_t *ty = json_object_get(f, "type");
  if (!json_is_object(f) || !json_is_string(ty))
    return oai_fail(e, 400, "text.format", "invalid_value", "'text.format' must be an object with a 'type'");
  const char *ts = json_string_value(ty);
  if (!strcmp(ts, "text")) return 0;
  if (!strcmp(ts, "json_object")) {
    *out = json_pack("{s:s}", "type", "json_object");
    return 0;
  }
  if (strcmp(ts, "json_schema"))
    return oai_fail(e, 400, "text.format.type", "invalid_value", "'text.format.type' must be text, json_object or json_schema");
  json_t *js = json_object();
  const char *k;
  json_t *v;
  json_object_foreach(f, k, v) {
    if (!strcmp(k, "type")) continue;
    if (strcmp(k, "name") && strcmp(k, "schema") && strcmp(k, "strict") && strcmp(k, "description")) {
      json_decref(js);
      return oai_fail(e, 400, "text.format", "invalid_value", "unknown field 'text.format.%.40s'", k);
    }
    json_object_set(js, k, v);
  }
  if (!json_is_object(json_object_get(js, "schema"))) {
    json_decref(js);
    return oai_fail(e, 400, "text.format.schema", "missing_required_parameter",
                    "'text.format.schema' (a JSON Schema object) is required for json_schema");
  }
  *out = json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js);
  return 0;
}

/* Fields this server takes; anything else is a 400 naming it (responses.md lists them). */
static const char *const KNOWN[] = {
    "model", "input", "instructions", "previous_response_id", "store", "stream", "stream_options",
    "max_output_tokens", "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls", "text",
    "reasoning", "truncation", "include", "metadata", "user", "safety_identifier", "prompt_cache_key",
    "service_tier", "background", "top_logprobs", "max_tool_calls", "conversation", "prompt",
    /* anna extensions, as on the chat route */
    "seed", "top_k", "min_p", "ignore_eos", "anna_debug_output", NULL};

static int check_fields(json_t *root, oai_error *e) {
  const char *k;
  json_t *v;
  json_object_foreach(root, k, v) {
    int ok = 0;
    for (int i = 0; KNOWN[i] && !ok; i++) ok = !strcmp(k, KNOWN[i]);
    if (!ok) return oai_fail(e, 400, k, "unsupported_parameter", "unknown or unsupported field '%.60s'", k);
  }
  json_t *bg = json_object_get(root, "background");
  if (is_set(bg) && !json_is_false(bg))
    return oai_fail(e, 400, "background", "unsupported_parameter", "'background': true is not supported");
  json_t *tr = json_object_get(root, "truncation");
  if (is_set(tr) && !(json_is_string(tr) && !strcmp(json_string_value(tr), "disabled")))
    return oai_fail(e, 400, "truncation", "unsupported_value",
                    "'truncation' must be \"disabled\": an input over the context is a 400, never cut");
  json_t *inc = json_object_get(root, "include");
  if (is_set(inc) && (!json_is_array(inc) || json_array_size(inc) > 0)) {
    json_t *first = json_is_array(inc) ? json_array_get(inc, 0) : inc;
    return oai_fail(e, 400, "include", "unsupported_value", "'include' entry %s%.60s%s is not produced by this server",
                    json_is_string(first) ? "'" : "", json_is_string(first) ? json_string_value(first) : "(not a string)",
                    json_is_string(first) ? "'" : "");
  }
  json_t *tl = json_object_get(root, "top_logprobs");
  if (is_set(tl) && !(json_is_integer(tl) && json_integer_value(tl) == 0))
    return oai_fail(e, 400, "top_logprobs", "unsupported_parameter", "'top_logprobs' is not supported on /v1/responses");
  const char *no[] = {"max_tool_calls", "conversation", "prompt"};
  for (int i = 0; i < 3; i++)
    if (is_set(json_object_get(root, no[i])))
      return oai_fail(e, 400, no[i], "unsupported_parameter", "'%s' is not supported", no[i]);
  json_t *svc = json_object_get(root, "service_tier");
  if (is_set(svc) && !(json_is_string(svc) && (!strcmp(json_string_value(svc), "auto") ||
                                                !strcmp(json_string_value(svc), "default"))))
    return oai_fail(e, 400, "service_tier", "unsupported_value", "'service_tier' must be auto or default");
  const char *strs[] = {"user", "safety_identifier", "prompt_cache_key", "instructions", "previous_response_id"};
  for (int i = 0; i < 5; i++) {
    json_t *s = json_object_get(root, strs[i]);
    if (is_set(s) && !json_is_string(s))
      return oai_fail(e, 400, strs[i], "invalid_type", "'%s' must be a string, got %s", strs[i], jtype(s));
  }
  json_t *md = json_object_get(root, "metadata");
  if (is_set(md)) {
    if (!json_is_object(md) || json_object_size(md) > 16)
      return oai_fail(e, 400, "metadata", "invalid_value", "'metadata' must be an object of at most 16 string values");
    json_object_foreach(md, k, v) if (!json_is_string(v) || strlen(k) > 64 || json_string_length(v) > 512) return oai_fail(
        e, 400, "metadata", "invalid_value", "'metadata' values must be strings (keys <= 64, values <= 512 characters)");
  }
  json_t *so = json_object_get(root, "stream_options");
  if (is_set(so)) {
    json_t *ob = json_object_get(so, "include_obfuscation");
    if (!json_is_object(so) || json_object_size(so) > (ob ? 1u : 0u) || (is_set(ob) && !json_is_boolean(ob)))
      return oai_fail(e, 400, "stream_options", "invalid_value",
                      "'stream_options' takes only 'include_obfuscation' (a boolean; no obfuscation is added either way)");
  }
  return 0;
}

static char *dup_or_null(json_t *s) {
  return json_is_string(s) ? strdup(json_string_value(s)) : NULL;
}

static int same_str(const char *a, const char *b) {
  return (!a && !b) || (a && b && !strcmp(a, b));
}

static int same_json(json_t *a, json_t *b) {
  return (!a && !b) || (a && b && json_equal(a, b));
}

/* The splice marker stands for the previous reply in a rendering of the chain: the text
 * before it is replaced by the previous prompt + reply ids, the text after it up to its
 * end-of-turn token by that token. */
#define SPLICE_MARK "\x1f" "anna-previous-reply" "\x1f"

static int build_chat(resp_job *j, json_t *root, json_t *msgs, json_t *rf, json_t *tc, char **body) {
  json_t *b = json_object();
  json_object_set_new(b, "messages", json_deep_copy(msgs));
  json_t *v;
  if ((v = json_object_get(root, "model"))) json_object_set(b, "model", v);
  const char *pass[] = {"temperature", "top_p", "seed", "top_k", "min_p", "ignore_eos", "anna_debug_output"};
  for (int i = 0; i < 7; i++)
    if ((v = json_object_get(root, pass[i]))) json_object_set(b, pass[i], v);
  if ((v = json_object_get(root, "max_output_tokens"))) json_object_set(b, "max_completion_tokens", v);
  if (j->tools) json_object_set(b, "tools", j->tools);
  if (tc) json_object_set(b, "tool_choice", tc);
  if (rf) json_object_set(b, "response_format", rf);
  if (j->no_think) json_object_set_new(b, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", 0));
  *body = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  return *body ? 0 : ANNA_ENOMEM;
}

/* Replaces the marked rendering's prompt by prev_ids + the tokens after the previous turn.
 * Returns 1 when spliced, 0 when the rendering does not allow it (the caller re-renders). */
static int splice(resp_job *j, const int32_t *prev_ids, size_t n_prev, oai_error *e) {
  const anna_text *t = j->cfg->text;
  gen_request *r = j->chat.r;
  char *text = NULL, *eog = NULL;
  size_t tl = 0, el = 0;
  int ok = 0;
  if (anna_text_detokenize(t, r->prompts[0], r->n_prompt[0], 0, &text, &tl, NULL, 0) ||
      anna_text_detokenize(t, &prev_ids[n_prev - 1], 1, 0, &eog, &el, NULL, 0) || el == 0)
    goto done;
  const char *m = strstr(text, SPLICE_MARK);
  if (!m || strstr(m + 1, SPLICE_MARK)) goto done;
  const char *q = strstr(m + strlen(SPLICE_MARK), eog);
  if (!q) goto done;
  q += el;
  int32_t *tail = NULL;
  size_t nt = 0;
  if (anna_text_tokenize(t, q, tl - (size_t)(q - text), 0, &tail, &nt, NULL, 0)) goto done;
  if (n_prev + nt >= (size_t)j->cfg->n_ctx) {
    free(tail);
    free(text);
    free(eog);
    return oai_fail(e, 400, "input", "context_length_exceeded",
                    "the conversation has %zu tokens; this server's context (--ctx-size) is %d tokens", n_prev + nt,
                    j->cfg->n_ctx);
  }
  int32_t *ids = malloc(sizeof *ids * (n_prev + nt + 1));
  if (ids) {
    memcpy(ids, prev_ids, sizeof *ids * n_prev);
    if (nt) memcpy(ids + n_prev, tail, sizeof *ids * nt);
    free(r->prompts[0]);
    r->prompts[0] = ids;
    r->n_prompt[0] = n_prev + nt;
    ok = 1;
  }
  free(tail);
done:
  free(text);
  free(eog);
  return ok;
}

int resp_parse(const oai_config *cfg, resp_store *st, const char *body, size_t len, const char *rid,
               resp_job **out, oai_error *e) {
  *out = NULL;
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root)
    return oai_fail(e, 400, NULL, "invalid_json", "the body is not valid JSON: %s (line %d, column %d)", je.text,
                    je.line, je.column);
  resp_job *j = calloc(1, sizeof *j);
  json_t *msgs = json_array(), *rf = NULL, *tc = NULL, *prev_msgs = NULL;
  int32_t *prev_ids = NULL;
  size_t n_prev = 0;
  char *cbody = NULL;
  int rc = -1, can_splice = 0;
  if (!j || !msgs) {
    oai_fail(e, 500, NULL, NULL, "out of memory");
    goto done;
  }
  j->cfg = cfg;
  j->st = st;
  j->created = (long long)time(NULL);
  make_id(j->id, sizeof j->id, "resp");
  if (!json_is_object(root)) {
    oai_fail(e, 400, NULL, "invalid_type", "the body must be a JSON object, got %s", jtype(root));
    goto done;
  }
  if (check_fields(root, e)) goto done;
  j->store = 1;
  json_t *v = json_object_get(root, "store");
  if (is_set(v) && !json_is_boolean(v)) {
    oai_fail(e, 400, "store", "invalid_type", "'store' must be a boolean");
    goto done;
  }
  if (json_is_false(v)) j->store = 0;
  json_t *reasoning = json_object_get(root, "reasoning");
  if (is_set(reasoning)) {
    json_t *eff = json_object_get(reasoning, "effort"), *sum = json_object_get(reasoning, "summary");
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max", NULL};
    int ok = json_is_object(reasoning) && (!is_set(eff) || json_is_string(eff));
    for (int i = 0; ok && is_set(eff) && efforts[i]; i++)
      if (!strcmp(json_string_value(eff), efforts[i])) ok = 2;
    if (!ok || (is_set(eff) && ok != 2)) {
      oai_fail(e, 400, "reasoning.effort", "invalid_value",
               "'reasoning.effort' must be none, minimal, low, medium, high, xhigh or max");
      goto done;
    }
    if (is_set(sum) && (!json_is_string(sum) || (strcmp(json_string_value(sum), "auto") &&
                                                 strcmp(json_string_value(sum), "concise") &&
                                                 strcmp(json_string_value(sum), "detailed")))) {
      oai_fail(e, 400, "reasoning.summary", "invalid_value", "'reasoning.summary' must be auto, concise or detailed");
      goto done;
    }
    /* none switches the template's thinking off; the other efforts leave it on (no budget). */
    j->no_think = is_set(eff) && !strcmp(json_string_value(eff), "none");
  }
  j->instructions = dup_or_null(json_object_get(root, "instructions"));
  if (parse_tools(json_object_get(root, "tools"), &j->tools, e) ||
      parse_tool_choice(json_object_get(root, "tool_choice"), &tc, e) ||
      parse_text(json_object_get(root, "text"), &rf, e))
    goto done;
  json_t *pid = json_object_get(root, "previous_response_id");
  if (is_set(pid)) {
    char serr[400] = "";
    int status;
    pthread_mutex_lock(&st->mu);
    /* most recently used: a live chain stays in the store */
    resp_entry *pe = acquire(st, json_string_value(pid), &status, serr, sizeof serr);
    if (pe) {
      prev_msgs = json_deep_copy(pe->ctx_msgs);
      can_splice = pe->ids && same_str(pe->instructions, j->instructions) && same_json(pe->tools, j->tools) &&
                   pe->no_think == j->no_think;
      if (can_splice && (prev_ids = malloc(sizeof *prev_ids * pe->n_ids))) {
        memcpy(prev_ids, pe->ids, sizeof *prev_ids * pe->n_ids);
        n_prev = pe->n_ids;
      }
    }
    pthread_mutex_unlock(&st->mu);
    if (!pe && status == 500) {
      oai_fail(e, 500, "previous_response_id", "store_failed", "previous response '%.64s' could not be read: %s",
               json_string_value(pid), serr);
      goto done;
    }
    if (!pe) {
      oai_fail(e, 404, "previous_response_id", "previous_response_not_found",
               "Previous response with id '%.64s' not found.", json_string_value(pid));
      goto done;
    }
    snprintf(j->prev_id, sizeof j->prev_id, "%s", json_string_value(pid));
  }
  json_t *input = json_object_get(root, "input");
  if (!is_set(input)) {
    oai_fail(e, 400, "input", "missing_required_parameter", "'input' is required");
    goto done;
  }
  j->input_items = json_array();
  j->ctx_msgs = prev_msgs ? prev_msgs : json_array();
  prev_msgs = NULL;
  json_t *new_msgs = json_array();
  if (parse_input(input, new_msgs, j->input_items, &j->has_images, e)) {
    json_decref(new_msgs);
    goto done;
  }
  if (j->instructions) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", j->instructions));
  json_array_extend(msgs, j->ctx_msgs);
  json_array_extend(j->ctx_msgs, new_msgs);
  json_array_extend(msgs, new_msgs);
  json_decref(new_msgs);
  /* Mark the previous reply (the last assistant message of the stored context). */
  size_t last_asst = (size_t)-1;
  if (prev_ids && !j->has_images) {
    const size_t base = j->instructions ? 1 : 0;
    for (size_t i = base; i < json_array_size(msgs); i++) {
      json_t *m = json_array_get(msgs, i);
      if (!strcmp(json_string_value(json_object_get(m, "role")), "assistant") && json_object_get(m, "anna_prev"))
        last_asst = i;
    }
  }
  for (size_t i = 0; i < json_array_size(msgs); i++) json_object_del(json_array_get(msgs, i), "anna_prev");
  for (size_t i = 0; i < json_array_size(j->ctx_msgs); i++) json_object_del(json_array_get(j->ctx_msgs, i), "anna_prev");
  int spliced = 0;
  if (last_asst != (size_t)-1) {
    json_t *marked = json_deep_copy(msgs), *m = json_array_get(marked, last_asst);
    json_object_set_new(m, "content", json_string(SPLICE_MARK));
    json_object_del(m, "reasoning_content");
    json_object_del(m, "tool_calls");
    int brc = build_chat(j, root, marked, rf, tc, &cbody);
    json_decref(marked);
    if (brc) {
      oai_fail(e, 500, NULL, NULL, "out of memory");
      goto done;
    }
    if (oai_parse(cfg, OAI_CHAT, cbody, strlen(cbody), rid, &j->chat, e)) goto done;
    spliced = splice(j, prev_ids, n_prev, e);
    if (spliced < 0) goto done;
    if (!spliced) oai_job_clear(&j->chat);
    free(cbody);
    cbody = NULL;
  }
  if (!spliced) {
    if (build_chat(j, root, msgs, rf, tc, &cbody)) {
      oai_fail(e, 500, NULL, NULL, "out of memory");
      goto done;
    }
    if (oai_parse(cfg, OAI_CHAT, cbody, strlen(cbody), rid, &j->chat, e)) {
      if (!strcmp(e->param, "messages")) snprintf(e->param, sizeof e->param, "input");
      goto done;
    }
  }
  v = json_object_get(root, "stream");
  if (is_set(v) && !json_is_boolean(v)) {
    oai_fail(e, 400, "stream", "invalid_type", "'stream' must be a boolean");
    goto done;
  }
  j->chat.stream = json_is_true(v);
  j->chat.r->keep_ids = 1;
  /* Echoed request settings. */
  j->echo = json_object();
  json_object_set_new(j->echo, "instructions", j->instructions ? json_string(j->instructions) : json_null());
  json_object_set_new(j->echo, "previous_response_id", j->prev_id[0] ? json_string(j->prev_id) : json_null());
  json_t *tools_echo = json_object_get(root, "tools");
  json_object_set_new(j->echo, "tools", json_is_array(tools_echo) ? json_deep_copy(tools_echo) : json_array());
  json_t *tce = json_object_get(root, "tool_choice");
  json_object_set_new(j->echo, "tool_choice", is_set(tce) ? json_deep_copy(tce) : json_string("auto"));
  json_t *ptc = json_object_get(root, "parallel_tool_calls");
  json_object_set_new(j->echo, "parallel_tool_calls", json_boolean(!json_is_false(ptc)));
  json_object_set_new(j->echo, "temperature", json_real(j->chat.r->sp.temperature));
  json_object_set_new(j->echo, "top_p", json_real(j->chat.r->sp.top_p));
  json_t *mot = json_object_get(root, "max_output_tokens");
  json_object_set_new(j->echo, "max_output_tokens", is_set(mot) ? json_deep_copy(mot) : json_null());
  json_t *txt = json_object_get(root, "text");
  json_object_set_new(j->echo, "text", is_set(txt) ? json_deep_copy(txt) : json_pack("{s:{s:s}}", "format", "type", "text"));
  json_object_set_new(j->echo, "reasoning", is_set(reasoning) ? json_deep_copy(reasoning)
                                                              : json_pack("{s:n,s:n}", "effort", "summary"));
  json_object_set_new(j->echo, "store", json_boolean(j->store));
  json_object_set_new(j->echo, "truncation", json_string("disabled"));
  json_t *md = json_object_get(root, "metadata");
  json_object_set_new(j->echo, "metadata", is_set(md) ? json_deep_copy(md) : json_object());
  json_object_set_new(j->echo, "background", json_false());
  json_t *user = json_object_get(root, "user");
  json_object_set_new(j->echo, "user", is_set(user) ? json_deep_copy(user) : json_null());
  rc = 0;
done:
  free(cbody);
  free(prev_ids);
  json_decref(prev_msgs);
  json_decref(msgs);
  json_decref(rf);
  json_decref(tc);
  json_decref(root);
  if (rc) resp_job_free(j);
  else *out = j;
  return rc;
}

/* ---- output items ---- */

enum { IT_NONE = 0, IT_REASONING, IT_MESSAGE, IT_CALL };

typedef struct out_item {
  int kind;
  char id[64], call_id[64];
  char *text; /* reasoning / message text, or the call's arguments */
  size_t len, cap;
  char *name;
} out_item;

/* The output split into items, with the stream's events when ev is set. */
typedef struct resp_out {
  resp_job *j;
  outparse *op;
  out_item *items;
  int n, cap;
  int open;  /* index of the item still receiving text, -1: none */
  char *ws;  /* whitespace before any message (dropped when only calls follow) */
  size_t wlen, wcap;
  /* streaming */
  char **ev;
  size_t *evlen, *evcap;
  long long seq;
  int err;
  int cut; /* the reply was cut (max_output_tokens): items close as 2 (item_json) */
} resp_out;

static int buf_add(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
  if (*len + n + 1 > *cap) {
    size_t nc = (*len + n + 1) * 2;
    char *nb = realloc(*b, nc);
    if (!nb) return ANNA_ENOMEM;
    *b = nb;
    *cap = nc;
  }
  memcpy(*b + *len, s, n);
  *len += n;
  (*b)[*len] = '\0';
  return 0;
}

/* done: 0 in progress, 1 completed, 2 cut by max_output_tokens (messages say "incomplete") */
static json_t *item_json(const out_item *it, int done) {
  const char *status = done == 2 && it->kind == IT_MESSAGE ? "incomplete" : done ? "completed" : "in_progress";
  const char *t = it->text ? it->text : "";
  if (it->kind == IT_REASONING)
    return json_pack("{s:s,s:s,s:[],s:o}", "type", "reasoning", "id", it->id, "summary", "content",
                     done ? json_pack("[{s:s,s:s%}]", "type", "reasoning_text", "text", t, it->len) : json_array());
  if (it->kind == IT_MESSAGE)
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "type", "message", "id", it->id, "status", status, "role", "assistant",
                     "content",
                     done ? json_pack("[{s:s,s:s%,s:[],s:[]}]", "type", "output_text", "text", t, it->len,
                                      "annotations", "logprobs")
                          : json_array());
  return json_pack("{s:s,s:s,s:s,s:s,s:s%,s:s}", "type", "function_call", "id", it->id, "call_id", it->call_id, "name",
                   it->name ? it->name : "", "arguments", done ? t : "", done ? it->len : 0, "status", status);
}

/* One SSE event (type + payload fields in o); nothing without a stream. */
static void emit(resp_out *o, const char *type, json_t *ev) {
  if (!o->ev || o->err) {
    json_decref(ev);
    return;
  }
  json_object_set_new(ev, "type", json_string(type));
  json_object_set_new(ev, "sequence_number", json_integer(o->seq++));
  char *js = json_dumps(ev, JSON_COMPACT);
  json_decref(ev);
  if (!js) {
    o->err = ANNA_ENOMEM;
    return;
  }
  char head[96];
  int hl = snprintf(head, sizeof head, "event: %s\ndata: ", type);
  o->err = buf_add(o->ev, o->evlen, o->evcap, head, (size_t)hl);
  if (!o->err) o->err = buf_add(o->ev, o->evlen, o->evcap, js, strlen(js));
  if (!o->err) o->err = buf_add(o->ev, o->evlen, o->evcap, "\n\n", 2);
  free(js);
}

static out_item *new_item(resp_out *o, int kind) {
  if (o->n == o->cap) {
    int nc = o->cap ? o->cap * 2 : 4;
    out_item *ni = realloc(o->items, sizeof *ni * (size_t)nc);
    if (!ni) {
      o->err = ANNA_ENOMEM;
      return NULL;
    }
    o->items = ni;
    o->cap = nc;
  }
  out_item *it = &o->items[o->n++];
  memset(it, 0, sizeof *it);
  it->kind = kind;
  make_id(it->id, sizeof it->id, kind == IT_REASONING ? "rs" : kind == IT_MESSAGE ? "msg" : "fc");
  if (kind == IT_CALL) make_id(it->call_id, sizeof it->call_id, "call");
  emit(o, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", o->n - 1, "item", item_json(it, 0)));
  if (kind == IT_MESSAGE)
    emit(o, "response.content_part.added",
         json_pack("{s:s,s:i,s:i,s:{s:s,s:s,s:[],s:[]}}", "item_id", it->id, "output_index", o->n - 1, "content_index", 0,
                   "part", "type", "output_text", "text", "", "annotations", "logprobs"));
  return it;
}

static void close_open(resp_out *o) {
  if (o->open < 0) return;
  out_item *it = &o->items[o->open];
  const int idx = o->open;
  const char *t = it->text ? it->text : "";
  if (it->kind == IT_REASONING) {
    emit(o, "response.reasoning_text.done",
         json_pack("{s:s,s:i,s:i,s:s%}", "item_id", it->id, "output_index", idx, "content_index", 0, "text", t, it->len));
  } else if (it->kind == IT_MESSAGE) {
    emit(o, "response.output_text.done",
         json_pack("{s:s,s:i,s:i,s:s%,s:[]}", "item_id", it->id, "output_index", idx, "content_index", 0, "text", t,
                   it->len, "logprobs"));
    emit(o, "response.content_part.done",
         json_pack("{s:s,s:i,s:i,s:{s:s,s:s%,s:[],s:[]}}", "item_id", it->id, "output_index", idx, "content_index", 0,
                   "part", "type", "output_text", "text", t, it->len, "annotations", "logprobs"));
  }
  emit(o, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", idx, "item", item_json(it, 1 + o->cut)));
  o->open = -1;
}

static void text_to(resp_out *o, int kind, const char *s, size_t n) {
  if (o->open < 0 || o->items[o->open].kind != kind) {
    close_open(o);
    if (!new_item(o, kind)) return;
    o->open = o->n - 1;
  }
  out_item *it = &o->items[o->open];
  if (buf_add(&it->text, &it->len, &it->cap, s, n)) {
    o->err = ANNA_ENOMEM;
    return;
  }
  if (kind == IT_REASONING)
    emit(o, "response.reasoning_text.delta",
         json_pack("{s:s,s:i,s:i,s:s%}", "item_id", it->id, "output_index", o->open, "content_index", 0, "delta", s, n));
  else
    emit(o, "response.output_text.delta", json_pack("{s:s,s:i,s:i,s:s%,s:[]}", "item_id", it->id, "output_index",
                                                    o->open, "content_index", 0, "delta", s, n, "logprobs"));
}

static int all_space(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isspace((unsigned char)s[i])) return 0;
  return 1;
}

static int out_sink(void *ud, int kind, const char *a, size_t alen, const char *b, size_t blen) {
  resp_out *o = ud;
  if (kind == OUTPARSE_REASONING) {
    text_to(o, IT_REASONING, a, alen);
  } else if (kind == OUTPARSE_CONTENT) {
    const int in_msg = o->open >= 0 && o->items[o->open].kind == IT_MESSAGE;
    if (!in_msg && all_space(a, alen)) { /* held: it may only separate calls */
      if (buf_add(&o->ws, &o->wlen, &o->wcap, a, alen)) o->err = ANNA_ENOMEM;
      return o->err;
    }
    if (!in_msg && o->wlen) {
      text_to(o, IT_MESSAGE, o->ws, o->wlen);
      o->wlen = 0;
    }
    text_to(o, IT_MESSAGE, a, alen);
  } else {
    close_open(o);
    o->wlen = 0;
    out_item *it = new_item(o, IT_CALL);
    if (!it) return o->err;
    it->name = strndup(a, alen);
    if (buf_add(&it->text, &it->len, &it->cap, b, blen)) o->err = ANNA_ENOMEM;
    const int idx = o->n - 1;
    emit(o, "response.function_call_arguments.delta",
         json_pack("{s:s,s:i,s:s%}", "item_id", it->id, "output_index", idx, "delta", b, blen));
    emit(o, "response.function_call_arguments.done",
         json_pack("{s:s,s:i,s:s,s:s%}", "item_id", it->id, "output_index", idx, "name", it->name ? it->name : "",
                   "arguments", b, blen));
    emit(o, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", idx, "item", item_json(it, 1 + o->cut)));
  }
  return o->err;
}

static void out_finish(resp_out *o) {
  int has_call = 0, has_msg = 0;
  for (int i = 0; i < o->n; i++) has_call |= o->items[i].kind == IT_CALL, has_msg |= o->items[i].kind == IT_MESSAGE;
  if (!has_call && !has_msg) text_to(o, IT_MESSAGE, o->ws ? o->ws : "", o->wlen); /* always one message */
  close_open(o);
}

static int out_init(resp_out *o, resp_job *j) {
  memset(o, 0, sizeof *o);
  o->j = j;
  o->open = -1;
  o->op = oai_outparse_new(&j->chat, 0);
  return o->op ? 0 : ANNA_ENOMEM;
}

static void out_clear(resp_out *o) {
  outparse_free(o->op);
  for (int i = 0; i < o->n; i++) free(o->items[i].text), free(o->items[i].name);
  free(o->items);
  free(o->ws);
  memset(o, 0, sizeof *o);
}

/* The response object; status from the finished request (NULL output: still running). */
static json_t *response_json(resp_job *j, const resp_out *o, const char *status, json_t *usage, json_t *error) {
  json_t *out = json_array();
  for (int i = 0; o && i < o->n; i++) json_array_append_new(out, item_json(&o->items[i], 1 + o->cut));
  json_t *r = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:o,s:o}", "id", j->id, "object", "response", "created_at",
                        (json_int_t)j->created, "status", status, "model", j->chat.model ? j->chat.model : "", "output",
                        out, "usage", usage ? usage : json_null(), "error", error ? error : json_null());
  json_object_set_new(r, "incomplete_details", !strcmp(status, "incomplete")
                                                    ? json_pack("{s:s}", "reason", "max_output_tokens")
                                                    : json_null());
  json_object_update(r, j->echo);
  return r;
}

static json_t *usage_json(resp_job *j, const resp_out *o) {
  gen_request *r = j->chat.r;
  pthread_mutex_lock(&r->mu);
  const gen_choice *c = &r->choices[0];
  const long long in = (long long)r->n_prompt[0], outn = c->n_gen, cached = c->n_cached;
  pthread_mutex_unlock(&r->mu);
  /* reasoning_tokens: the reasoning text as tokens (its tags not counted). */
  long long rt = 0;
  for (int i = 0; i < o->n; i++) {
    if (o->items[i].kind != IT_REASONING || !o->items[i].len) continue;
    int32_t *ids = NULL;
    size_t n = 0;
    if (!anna_text_tokenize(j->cfg->text, o->items[i].text, o->items[i].len, 0, &ids, &n, NULL, 0)) rt += (long long)n;
    free(ids);
  }
  if (rt > outn) rt = outn;
  return json_pack("{s:I,s:{s:I},s:I,s:{s:I},s:I}", "input_tokens", (json_int_t)in, "input_tokens_details",
                   "cached_tokens", (json_int_t)cached, "output_tokens", (json_int_t)outn, "output_tokens_details",
                   "reasoning_tokens", (json_int_t)rt, "total_tokens", (json_int_t)(in + outn));
}

static const char *final_status(resp_job *j, json_t **error) {
  gen_request *r = j->chat.r;
  pthread_mutex_lock(&r->mu);
  const char *fr = r->choices[0].finish_reason;
  const int failed = r->error[0] != 0;
  char msg[300];
  snprintf(msg, sizeof msg, "generation failed: %s", r->error);
  pthread_mutex_unlock(&r->mu);
  if (failed) {
    *error = json_pack("{s:s,s:s}", "code", "server_error", "message", msg);
    return "failed";
  }
  return fr && (!strcmp(fr, "length") || !strcmp(fr, "cancelled")) ? "incomplete" : "completed";
}

/* Stores j's finished response (store = true and a completed or incomplete status).
 * 0, or < 0 with err filled (out of memory, or the database failed). */
static int store_response(resp_job *j, const resp_out *o, json_t *resp, const char *status, char *err, size_t errlen) {
  if (!j->store || !strcmp(status, "failed")) return 0;
  resp_entry *e = calloc(1, sizeof *e);
  if (!e) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  snprintf(e->id, sizeof e->id, "%s", j->id);
  e->created = j->created;
  e->response = json_incref(resp);
  e->input_items = json_incref(j->input_items);
  e->ctx_msgs = json_deep_copy(j->ctx_msgs);
  e->instructions = j->instructions ? strdup(j->instructions) : NULL;
  e->tools = j->tools ? json_incref(j->tools) : NULL;
  e->no_think = j->no_think;
  /* The reply as one assistant message: what the next turn's template renders. */
  json_t *m = json_pack("{s:s,s:s,s:b}", "role", "assistant", "content", "", "anna_prev", 1);
  json_t *calls = json_array();
  for (int i = 0; i < o->n; i++) {
    const out_item *it = &o->items[i];
    if (it->kind == IT_MESSAGE) json_object_set_new(m, "content", json_stringn(it->text ? it->text : "", it->len));
    else if (it->kind == IT_REASONING)
      json_object_set_new(m, "reasoning_content", json_stringn(it->text ? it->text : "", it->len));
    else
      json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s%}}", "id", it->call_id, "type", "function", "function",
                                             "name", it->name ? it->name : "", "arguments", it->text ? it->text : "{}",
                                             it->text ? it->len : 2));
  }
  if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
  json_decref(calls);
  json_array_append_new(e->ctx_msgs, m);
  /* prompt + reply ids, spliceable only when the reply ended its turn. */
  gen_request *r = j->chat.r;
  pthread_mutex_lock(&r->mu);
  const gen_choice *c = &r->choices[0];
  if (!j->has_images && c->gen_ids && c->n_gen_ids && anna_text_is_eog(j->cfg->text, c->gen_ids[c->n_gen_ids - 1]) &&
      !strcmp(status, "completed") && (e->ids = malloc(sizeof *e->ids * (r->n_prompt[0] + c->n_gen_ids)))) {
    memcpy(e->ids, r->prompts[0], sizeof *e->ids * r->n_prompt[0]);
    memcpy(e->ids + r->n_prompt[0], c->gen_ids, sizeof *e->ids * c->n_gen_ids);
    e->n_ids = r->n_prompt[0] + c->n_gen_ids;
  }
  pthread_mutex_unlock(&r->mu);
  return store_put(j->st, e, err, errlen);
}

char *resp_finish_json(resp_job *j, oai_error *e) {
  resp_out o;
  oai_fail(e, 500, NULL, NULL, "out of memory");
  if (out_init(&o, j)) return NULL;
  gen_request *r = j->chat.r;
  pthread_mutex_lock(&r->mu);
  char *text = strndup(r->choices[0].text ? r->choices[0].text : "", r->choices[0].text_len);
  pthread_mutex_unlock(&r->mu);
  if (!text || outparse_feed(o.op, text, strlen(text), 1, out_sink, &o) || o.err) {
    free(text);
    out_clear(&o);
    return NULL;
  }
  free(text);
  json_t *error = NULL;
  const char *status = final_status(j, &error);
  o.cut = !strcmp(status, "incomplete");
  out_finish(&o);
  json_t *resp = response_json(j, &o, status, usage_json(j, &o), error);
  char err[400];
  if (store_response(j, &o, resp, status, err, sizeof err)) {
    oai_fail(e, 500, "store", "store_failed", "the response could not be stored: %s", err);
    json_decref(resp);
    out_clear(&o);
    return NULL;
  }
  char *s = json_dumps(resp, JSON_COMPACT);
  json_decref(resp);
  out_clear(&o);
  return s;
}

/* ---- streaming ---- */

struct resp_stream {
  resp_job *j;
  resp_out o;
  size_t text_off;
  int started, done_sent;
};

resp_stream *resp_stream_new(resp_job *j) {
  resp_stream *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->j = j;
  if (out_init(&s->o, j)) {
    free(s);
    return NULL;
  }
  return s;
}

void resp_stream_free(resp_stream *s) {
  if (!s) return;
  out_clear(&s->o);
  free(s);
}

int resp_stream_has_news(const resp_stream *s) {
  const gen_request *r = s->j->chat.r;
  return !s->started || r->choices[0].text_len > s->text_off || (r->choices[0].done && !s->done_sent);
}

int resp_stream_step(resp_stream *s, char **out, size_t *len, size_t *cap, int *finished) {
  resp_job *j = s->j;
  resp_out *o = &s->o;
  *finished = s->done_sent;
  if (s->done_sent) return 0;
  o->ev = out;
  o->evlen = len;
  o->evcap = cap;
  if (!s->started) {
    s->started = 1;
    json_t *base = response_json(j, NULL, "in_progress", NULL, NULL);
    emit(o, "response.created", json_pack("{s:O}", "response", base));
    emit(o, "response.in_progress", json_pack("{s:o}", "response", base));
  }
  gen_request *r = j->chat.r;
  pthread_mutex_lock(&r->mu);
  const gen_choice *c = &r->choices[0];
  size_t tl = c->text_len - s->text_off;
  char *txt = tl ? strndup(c->text + s->text_off, tl) : NULL;
  const int done = c->done;
  pthread_mutex_unlock(&r->mu);
  if (tl && !txt) return ANNA_ENOMEM;
  s->text_off += tl;
  if ((tl || done) && !o->err) {
    int rc = outparse_feed(o->op, txt ? txt : "", tl, done, out_sink, o);
    if (rc && !o->err) o->err = rc;
  }
  free(txt);
  if (done && !o->err) {
    json_t *error = NULL;
    const char *status = final_status(j, &error);
    o->cut = !strcmp(status, "incomplete");
    out_finish(o);
    json_t *resp = response_json(j, o, status, usage_json(j, o), error);
    /* Stored before the terminal event, so a client that reads it can chain on the id; a
     * store that fails turns the event into response.failed naming the cause. */
    char err[400];
    if (store_response(j, o, resp, status, err, sizeof err)) {
      status = "failed";
      json_object_set_new(resp, "status", json_string("failed"));
      json_object_set_new(resp, "error", json_pack("{s:s,s:s+}", "code", "server_error", "message",
                                                   "the response could not be stored: ", err));
    }
    emit(o, !strcmp(status, "completed") ? "response.completed"
            : !strcmp(status, "incomplete") ? "response.incomplete"
                                            : "response.failed",
         json_pack("{s:O}", "response", resp));
    json_decref(resp);
    s->done_sent = 1;
  }
  o->ev = NULL;
  *finished = s->done_sent;
  return o->err;
}

/* ---- stored responses ---- */

static int not_found(const char *id, int status, const char *err, oai_error *e) {
  if (status == 500) {
    oai_fail(e, 500, "response_id", "store_failed", "stored response '%.64s' could not be read: %s", id, err);
    return 500;
  }
  oai_fail(e, 404, "response_id", "not_found", "Response with id '%.64s' not found.", id);
  return 404;
}

int resp_get(resp_store *st, const char *id, char **body, oai_error *e) {
  char err[400] = "";
  int status;
  pthread_mutex_lock(&st->mu);
  resp_entry *en = acquire(st, id, &status, err, sizeof err);
  *body = en ? json_dumps(en->response, JSON_COMPACT) : NULL;
  pthread_mutex_unlock(&st->mu);
  return en ? 200 : not_found(id, status, err, e);
}

int resp_delete(resp_store *st, const char *id, char **body, oai_error *e) {
  char err[400] = "";
  int status;
  pthread_mutex_lock(&st->mu);
  /* acquire first: an expired row is gone (404) even if the sweep has not deleted it yet */
  resp_entry *en = acquire(st, id, &status, err, sizeof err);
  if (en) unlink_entry(st, en);
  const int in_db = en && st->db ? respstore_delete(st->db, id, err, sizeof err) : 0;
  pthread_mutex_unlock(&st->mu);
  if (!en) return not_found(id, status, err, e);
  entry_free(en);
  if (in_db < 0) return not_found(id, 500, err, e);
  json_t *o = json_pack("{s:s,s:s,s:b}", "id", id, "object", "response.deleted", "deleted", 1);
  *body = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return 200;
}

int resp_input_items(resp_store *st, const char *id, const char *order, const char *limit, const char *after,
                     char **body, oai_error *e) {
  long lim = 20;
  if (limit) {
    char *end;
    lim = strtol(limit, &end, 10);
    if (*end || lim < 1 || lim > 100) {
      oai_fail(e, 400, "limit", "invalid_value", "'limit' must be an integer in [1, 100]");
      return 400;
    }
  }
  const int asc = order && !strcmp(order, "asc");
  if (order && !asc && strcmp(order, "desc")) {
    oai_fail(e, 400, "order", "invalid_value", "'order' must be asc or desc");
    return 400;
  }
  char err[400] = "";
  int status;
  pthread_mutex_lock(&st->mu);
  resp_entry *en = acquire(st, id, &status, err, sizeof err);
  json_t *items = en ? json_deep_copy(en->input_items) : NULL;
  pthread_mutex_unlock(&st->mu);
  if (!en) return not_found(id, status, err, e);
  const size_t n = json_array_size(items);
  json_t *data = json_array();
  int started = after == NULL, more = 0;
  for (size_t k = 0; k < n; k++) {
    json_t *it = json_array_get(items, asc ? k : n - 1 - k);
    if (!started) {
      started = !strcmp(json_string_value(json_object_get(it, "id")) ? json_string_value(json_object_get(it, "id")) : "",
                        after);
      continue;
    }
    if ((long)json_array_size(data) == lim) {
      more = 1;
      break;
    }
    json_array_append(data, it);
  }
  json_decref(items);
  json_t *first = json_object_get(json_array_get(data, 0), "id"),
         *last = json_object_get(json_array_get(data, json_array_size(data) ? json_array_size(data) - 1 : 0), "id");
  json_t *o = json_pack("{s:s,s:o,s:O,s:O,s:b}", "object", "list", "data", data, "first_id", first ? first : json_null(),
                        "last_id", last ? last : json_null(), "has_more", more);
  *body = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return 200;
}
