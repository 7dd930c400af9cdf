/* outparse.c: incremental <think>/<tool_call> splitter (see outparse.h). */
#include "outparse.h"

#include "anna/anna.h"

#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

enum { MODE_TEXT, MODE_REASON, MODE_TOOL };

struct outparse {
  int reasoning, tools, mode, n_calls;
  int skip_ws; /* drop whitespace right after </think>: templates put "\n\n" there */
  int bare;    /* 0: undecided whether the reply is one bare JSON call, 1: decided it is not */
  char *buf;   /* bytes not yet emitted */
  size_t len, cap;
};

static const char TAG_THINK[] = "<think>", TAG_UNTHINK[] = "</think>";
static const char TAG_CALL[] = "<tool_call>", TAG_UNCALL[] = "</tool_call>";

outparse *outparse_new(int reasoning, int start_in_reasoning, int tools) {
  outparse *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->reasoning = reasoning;
  p->tools = tools;
  p->mode = reasoning && start_in_reasoning ? MODE_REASON : MODE_TEXT;
  return p;
}

void outparse_free(outparse *p) {
  if (!p) return;
  free(p->buf);
  free(p);
}

int outparse_n_tool_calls(const outparse *p) {
  return p->n_calls;
}

static const char *mem_find(const char *h, size_t hl, const char *n, size_t nl) {
  if (nl == 0) return h;
  if (hl < nl) return NULL;
  for (size_t i = 0; i + nl <= hl; i++)
    if (h[i] == n[0] && !memcmp(h + i, n, nl)) return h + i;
  return NULL;
}

/* Length of the longest suffix of s that is a proper prefix of tag: those bytes may be the
 * start of a tag split across pieces, so they are held back. */
static size_t partial_tag(const char *s, size_t len, const char *tag) {
  size_t tl = strlen(tag);
  for (size_t k = tl - 1 < len ? tl - 1 : len; k > 0; k--)
    if (!memcmp(s + len - k, tag, k)) return k;
  return 0;
}

static char *trim_dup(const char *s, size_t len, size_t *out_len) {
  while (len && isspace((unsigned char)*s))
    s++, len--;
  while (len && isspace((unsigned char)s[len - 1]))
    len--;
  char *r = malloc(len + 1);
  if (!r) return NULL;
  memcpy(r, s, len);
  r[len] = '\0';
  *out_len = len;
  return r;
}

static int parse_json_body(const char *b, size_t len, char **name, char **args) {
  json_error_t je;
  json_t *o = json_loadb(b, len, 0, &je);
  if (!json_is_object(o)) {
    json_decref(o);
    return ANNA_EFORMAT;
  }
  json_t *n = json_object_get(o, "name"), *a = json_object_get(o, "arguments");
  if (!a) a = json_object_get(o, "parameters");
  int rc = ANNA_EFORMAT;
  if (json_is_string(n) && json_string_length(n) > 0) {
    char *as = NULL;
    if (!a || json_is_null(a))
      as = strdup("{}");
    else if (json_is_string(a)) {
      /* Some templates and models write the arguments as a string of JSON: only one that
       * parses to an object (jansson rejects lone surrogates, as clients' parsers do) is a
       * call; anything else leaves the text as content. Re-serialized so that what the
       * client gets is exactly the object that was checked. */
      json_t *ao = json_loads(json_string_value(a), 0, &je);
      if (json_is_object(ao)) as = json_dumps(ao, JSON_COMPACT);
      json_decref(ao);
    } else if (json_is_object(a))
      as = json_dumps(a, JSON_COMPACT);
    if (as) {
      *name = strdup(json_string_value(n));
      *args = as;
      rc = *name ? 0 : ANNA_ENOMEM;
      if (rc) free(as);
    }
  }
  json_decref(o);
  return rc;
}

/* <function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function> (Qwen3.5/Qwen3-Coder).
 * A value that parses as JSON (number, bool, object) keeps its type; anything else is a
 * string, which is what the template's tojson-or-string rendering of arguments implies. */
static int parse_xml_body(const char *b, size_t len, char **name, char **args) {
  static const char FN[] = "<function=", PA[] = "<parameter=", UNPA[] = "</parameter>";
  if (len < sizeof FN - 1 || memcmp(b, FN, sizeof FN - 1)) return ANNA_EFORMAT;
  const char *p = b + sizeof FN - 1, *end = b + len;
  const char *gt = memchr(p, '>', (size_t)(end - p));
  if (!gt || gt == p) return ANNA_EFORMAT;
  json_t *obj = json_object();
  char *nm = strndup(p, (size_t)(gt - p));
  if (!obj || !nm) goto fail;
  p = gt + 1;
  for (;;) {
    const char *pa = mem_find(p, (size_t)(end - p), PA, sizeof PA - 1);
    if (!pa) break;
    const char *ks = pa + sizeof PA - 1;
    const char *kg = memchr(ks, '>', (size_t)(end - ks));
    if (!kg || kg == ks) goto fail;
    const char *vs = kg + 1;
    const char *ve = mem_find(vs, (size_t)(end - vs), UNPA, sizeof UNPA - 1);
    if (!ve) goto fail;
    const char *next = ve + sizeof UNPA - 1;
    if (vs < ve && *vs == '\n') vs++;
    if (ve > vs && ve[-1] == '\n') ve--;
    char *key = strndup(ks, (size_t)(kg - ks));
    if (!key) goto fail;
    json_error_t je;
    json_t *v = json_loadb(vs, (size_t)(ve - vs), JSON_DECODE_ANY, &je);
    if (!v) v = json_stringn(vs, (size_t)(ve - vs));
    int bad = !v || json_object_set_new(obj, key, v);
    free(key);
    if (bad) goto fail;
    p = next;
  }
  char *as = json_dumps(obj, JSON_COMPACT);
  json_decref(obj);
  if (!as) {
    free(nm);
    return ANNA_ENOMEM;
  }
  *name = nm;
  *args = as;
  return 0;
fail:
  json_decref(obj);
  free(nm);
  return ANNA_EFORMAT;
}

int outparse_tool_body(const char *body, size_t len, char **name, char **args) {
  *name = *args = NULL;
  size_t tl;
  char *t = trim_dup(body, len, &tl);
  if (!t) return ANNA_ENOMEM;
  int rc = ANNA_EFORMAT;
  if (tl && t[0] == '{')
    rc = parse_json_body(t, tl, name, args);
  else if (tl && t[0] == '<')
    rc = parse_xml_body(t, tl, name, args);
  free(t);
  return rc;
}

static int bare_call(const char *s, size_t n) {
  json_error_t je;
  json_t *o = json_loadb(s, n, 0, &je);
  int ok = json_is_object(o) && json_object_size(o) == 2 &&
           json_is_string(json_object_get(o, "name")) &&
           json_is_object(json_object_get(o, "arguments"));
  json_decref(o);
  return ok;
}

/* A reply that opens with a Markdown fence around a bare call: "```", an optional "json",
 * whitespace, then '{' (small Qwen coders write their calls so about as often as bare).
 * Returns the offset of the '{' in s[0..n), 0 while s is a proper prefix of such an
 * opening (undecided), -1 when s cannot open one. */
static long fence_open(const char *s, size_t n) {
  static const char FENCE[] = "```json";
  size_t i = 0;
  for (; i < sizeof FENCE - 1 && i < n; i++)
    if (s[i] != FENCE[i]) break;
  if (i < 3) return i == n ? 0 : -1;               /* the three backticks are required */
  if (i < sizeof FENCE - 1 && i == n) return 0;    /* "```js" so far */
  if (i < sizeof FENCE - 1 && i != 3) return -1;   /* "```jx": another language */
  while (i < n && isspace((unsigned char)s[i]))
    i++;
  if (i == n) return 0;
  return s[i] == '{' ? (long)i : -1;
}

/* The call object of a fenced reply s[0..n) whose '{' is at `at`: the text up to the closing
 * fence (only whitespace after it). *len = 0 when the reply is not fenced that way. */
static const char *fence_body(const char *s, size_t n, size_t at, size_t *len) {
  *len = 0;
  while (n > at && isspace((unsigned char)s[n - 1]))
    n--;
  if (n < at + 3 || memcmp(s + n - 3, "```", 3)) return NULL;
  *len = n - 3 - at;
  return s + at;
}

static int emit_text(outparse *p, const char *s, size_t n, outparse_sink sink, void *ud) {
  int kind = p->mode == MODE_REASON ? OUTPARSE_REASONING : OUTPARSE_CONTENT;
  if (kind == OUTPARSE_CONTENT && p->skip_ws) {
    while (n && isspace((unsigned char)*s))
      s++, n--;
    if (n) p->skip_ws = 0;
  }
  if (!n) return 0;
  if (kind == OUTPARSE_CONTENT) p->bare = 1;
  return sink(ud, kind, s, n, NULL, 0);
}

/* Consumes the first k bytes of the buffer. */
static void drop(outparse *p, size_t k) {
  memmove(p->buf, p->buf + k, p->len - k);
  p->len -= k;
}

static int finish_call(outparse *p, const char *body, size_t blen, int closed, outparse_sink sink,
                       void *ud) {
  char *name, *args;
  int rc = outparse_tool_body(body, blen, &name, &args);
  if (rc == ANNA_ENOMEM) return rc;
  if (rc == 0) {
    p->n_calls++;
    rc = sink(ud, OUTPARSE_TOOL_CALL, name, strlen(name), args, strlen(args));
    free(name);
    free(args);
    return rc;
  }
  /* Not a call after all: the text goes out as it was written. */
  int mode = p->mode;
  p->mode = MODE_TEXT;
  if ((rc = emit_text(p, TAG_CALL, sizeof TAG_CALL - 1, sink, ud)) ||
      (rc = emit_text(p, body, blen, sink, ud)))
    return rc;
  if (closed) rc = emit_text(p, TAG_UNCALL, sizeof TAG_UNCALL - 1, sink, ud);
  p->mode = mode;
  return rc;
}

int outparse_feed(outparse *p, const char *s, size_t len, int final, outparse_sink sink, void *ud) {
  if (len) {
    if (p->len + len + 1 > p->cap) {
      size_t nc = (p->len + len + 1) * 2;
      char *nb = realloc(p->buf, nc);
      if (!nb) return ANNA_ENOMEM;
      p->buf = nb;
      p->cap = nc;
    }
    memcpy(p->buf + p->len, s, len);
    p->len += len;
  }
  int rc = 0;
  while (p->len) {
    if (p->mode == MODE_TOOL) {
      const char *e = mem_find(p->buf, p->len, TAG_UNCALL, sizeof TAG_UNCALL - 1);
      if (!e) {
        if (!final) return 0;
        p->mode = MODE_TEXT;
        rc = finish_call(p, p->buf, p->len, 0, sink, ud);
        p->len = 0;
        return rc;
      }
      size_t blen = (size_t)(e - p->buf);
      p->mode = MODE_TEXT;
      if ((rc = finish_call(p, p->buf, blen, 1, sink, ud))) return rc;
      drop(p, blen + sizeof TAG_UNCALL - 1);
      continue;
    }
    /* Small models often answer a tool prompt with the bare call object, no tags: a reply
     * that starts with '{' is held to the end and becomes a call if it is exactly
     * {"name": ..., "arguments": {...}}. */
    if (p->tools && p->mode == MODE_TEXT && !p->bare) {
      size_t k = 0;
      while (k < p->len && isspace((unsigned char)p->buf[k]))
        k++;
      if (k == p->len && !final) return 0;
      if (k < p->len && p->buf[k] == '{') {
        if (!final) return 0;
        if (bare_call(p->buf + k, p->len - k)) {
          p->mode = MODE_TOOL;
          rc = finish_call(p, p->buf + k, p->len - k, 1, sink, ud);
          p->mode = MODE_TEXT;
          p->len = 0;
          return rc;
        }
      }
      /* The same object inside a ```json fence: held while the opening can still be one
       * (any other fenced block streams at once), then to the end. */
      const long fo = k < p->len && p->buf[k] == '`' ? fence_open(p->buf + k, p->len - k) : -1;
      if (fo >= 0) {
        if (!final) return 0;
        size_t blen = 0;
        const char *body = fo > 0 ? fence_body(p->buf + k, p->len - k, (size_t)fo, &blen) : NULL;
        if (blen && bare_call(body, blen)) {
          p->mode = MODE_TOOL;
          rc = finish_call(p, body, blen, 1, sink, ud);
          p->mode = MODE_TEXT;
          p->len = 0;
          return rc;
        }
      }
      p->bare = 1;
    }
    /* Text or reasoning: find the earliest tag that matters in this mode. */
    const char *tags[2];
    int nt = 0;
    if (p->mode == MODE_REASON)
      tags[nt++] = TAG_UNTHINK;
    else {
      if (p->reasoning) tags[nt++] = TAG_THINK;
      if (p->tools) tags[nt++] = TAG_CALL;
    }
    const char *best = NULL;
    int bi = -1;
    for (int i = 0; i < nt; i++) {
      const char *f = mem_find(p->buf, p->len, tags[i], strlen(tags[i]));
      if (f && (!best || f < best)) best = f, bi = i;
    }
    if (!best) {
      size_t hold = 0;
      if (!final)
        for (int i = 0; i < nt; i++) {
          size_t h = partial_tag(p->buf, p->len, tags[i]);
          if (h > hold) hold = h;
        }
      size_t out = p->len - hold;
      if (out && (rc = emit_text(p, p->buf, out, sink, ud))) return rc;
      drop(p, out);
      return 0;
    }
    size_t pre = (size_t)(best - p->buf);
    if (pre && (rc = emit_text(p, p->buf, pre, sink, ud))) return rc;
    const char *tag = tags[bi];
    drop(p, pre + strlen(tag));
    if (tag == TAG_UNTHINK)
      p->mode = MODE_TEXT, p->skip_ws = 1;
    else if (tag == TAG_THINK)
      p->mode = MODE_REASON;
    else
      p->mode = MODE_TOOL;
  }
  return 0;
}
