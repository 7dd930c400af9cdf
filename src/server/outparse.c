/* outparse.c: incremental reasoning / tool-call splitter for the markup families of
 * outparse.h. */
#include "outparse.h"

#include "anna/anna.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { MODE_TEXT, MODE_REASON, MODE_TOOL };

/* A growable byte string. */
typedef struct sbuf {
  char *s;
  size_t len, cap;
} sbuf;

static int sb_put(sbuf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t nc = (b->len + n + 1) * 2;
    char *ns = realloc(b->s, nc);
    if (!ns) return ANNA_ENOMEM;
    b->s = ns;
    b->cap = nc;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = '\0';
  return 0;
}

struct outparse {
  int tools, reasoning, incremental, mode, n_calls;
  const char *r_open, *r_close, *t_open, *t_close; /* the family's tags */
  int skip_ws;     /* drop whitespace right after a reasoning block: templates put "\n\n" there */
  int bare;        /* 0: undecided whether the reply is one bare JSON call, 1: decided it is not */
  int strip_label; /* gemma4: the reasoning block may still start with its "thought\n" label */
  json_t *props;   /* qwen3_coder: {function name: its parameters' "properties"} (owned) */
  char *buf;       /* bytes not yet emitted; in MODE_TOOL the call body so far */
  size_t len, cap;
  /* qwen3_coder call in progress: header seen (name emitted), how far the body is consumed,
   * parameters emitted, their keys (first one wins), the arguments text so far */
  int q_hdr, q_bad, q_np;
  size_t q_pos;
  char *q_name;
  json_t *q_keys;
  sbuf q_args;
};

static const char TAG_THINK[] = "<think>", TAG_UNTHINK[] = "</think>";
static const char TAG_CHANNEL[] = "<|channel>", TAG_UNCHANNEL[] = "<channel|>";
static const char TAG_CALL[] = "<tool_call>", TAG_UNCALL[] = "</tool_call>";
static const char TAG_G4CALL[] = "<|tool_call>", TAG_G4UNCALL[] = "<tool_call|>";
static const char G4_QUOTE[] = "<|\"|>";
static const char G4_LABEL[] = "thought\n";

int outparse_tools_parse(const char *name) {
  if (!strcmp(name, "none")) return OUTPARSE_TOOLS_NONE;
  if (!strcmp(name, "hermes")) return OUTPARSE_TOOLS_HERMES;
  if (!strcmp(name, "qwen3_coder")) return OUTPARSE_TOOLS_QWEN3_CODER;
  if (!strcmp(name, "gemma4")) return OUTPARSE_TOOLS_GEMMA4;
  return -1;
}

int outparse_reasoning_parse(const char *name) {
  if (!strcmp(name, "none")) return OUTPARSE_REASONING_NONE;
  if (!strcmp(name, "qwen3")) return OUTPARSE_REASONING_QWEN3;
  if (!strcmp(name, "gemma4")) return OUTPARSE_REASONING_GEMMA4;
  return -1;
}

const char *outparse_tools_name(int tools) {
  return tools == OUTPARSE_TOOLS_HERMES        ? "hermes"
         : tools == OUTPARSE_TOOLS_QWEN3_CODER ? "qwen3_coder"
         : tools == OUTPARSE_TOOLS_GEMMA4      ? "gemma4"
                                               : "none";
}

const char *outparse_reasoning_name(int reasoning) {
  return reasoning == OUTPARSE_REASONING_QWEN3 ? "qwen3" : reasoning == OUTPARSE_REASONING_GEMMA4 ? "gemma4" : "none";
}

static int has(const char *s, size_t n, const char *needle) {
  const size_t k = strlen(needle);
  for (size_t i = 0; s && i + k <= n; i++)
    if (s[i] == needle[0] && !memcmp(s + i, needle, k)) return 1;
  return 0;
}

void outparse_detect(const char *src, size_t len, int *tools, int *reasoning) {
  *tools = has(src, len, TAG_G4CALL)                                      ? OUTPARSE_TOOLS_GEMMA4
           : has(src, len, "<function=") && has(src, len, "<parameter=") ? OUTPARSE_TOOLS_QWEN3_CODER
                                                                         : OUTPARSE_TOOLS_HERMES;
  *reasoning = has(src, len, TAG_CHANNEL) ? OUTPARSE_REASONING_GEMMA4 : OUTPARSE_REASONING_QWEN3;
}

void outparse_reasoning_tags(int reasoning, const char **open, const char **close) {
  *open = reasoning == OUTPARSE_REASONING_QWEN3 ? TAG_THINK : reasoning == OUTPARSE_REASONING_GEMMA4 ? TAG_CHANNEL : NULL;
  *close = reasoning == OUTPARSE_REASONING_QWEN3    ? TAG_UNTHINK
           : reasoning == OUTPARSE_REASONING_GEMMA4 ? TAG_UNCHANNEL
                                                    : NULL;
}

/* {name: parameters.properties} of a request's tools array (entries that are not function
 * tools with properties are skipped: their values stay strings). */
static json_t *tool_props(const char *tools_json) {
  json_t *out = json_object();
  json_error_t je;
  json_t *arr = tools_json ? json_loads(tools_json, 0, &je) : NULL;
  size_t i;
  json_t *t;
  json_array_foreach(arr, i, t) {
    json_t *f = json_object_get(t, "function");
    if (!f) f = t;
    json_t *nm = json_object_get(f, "name"), *pr = json_object_get(json_object_get(f, "parameters"), "properties");
    if (json_is_string(nm) && json_is_object(pr)) json_object_set(out, json_string_value(nm), pr);
  }
  json_decref(arr);
  return out;
}

outparse *outparse_new_opts(const outparse_options *o) {
  outparse *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->reasoning = o->reasoning;
  p->tools = o->tools;
  p->incremental = o->incremental;
  outparse_reasoning_tags(p->reasoning, &p->r_open, &p->r_close);
  p->t_open = p->tools == OUTPARSE_TOOLS_GEMMA4 ? TAG_G4CALL : TAG_CALL;
  p->t_close = p->tools == OUTPARSE_TOOLS_GEMMA4 ? TAG_G4UNCALL : TAG_UNCALL;
  p->mode = p->reasoning && o->start_in_reasoning ? MODE_REASON : MODE_TEXT;
  p->strip_label = p->mode == MODE_REASON && p->reasoning == OUTPARSE_REASONING_GEMMA4;
  /* Only Hermes-style models answer with a bare JSON call; the other families' replies that
   * start with '{' are content. */
  p->bare = p->tools != OUTPARSE_TOOLS_HERMES;
  if (p->tools == OUTPARSE_TOOLS_QWEN3_CODER && !(p->props = tool_props(o->tools_json))) {
    free(p);
    return NULL;
  }
  return p;
}

outparse *outparse_new(int reasoning, int start_in_reasoning, int tools) {
  outparse_options o = {.tools = tools ? OUTPARSE_TOOLS_HERMES : OUTPARSE_TOOLS_NONE,
                        .reasoning = reasoning ? OUTPARSE_REASONING_QWEN3 : OUTPARSE_REASONING_NONE,
                        .start_in_reasoning = start_in_reasoning};
  return outparse_new_opts(&o);
}

static void q_reset(outparse *p) {
  free(p->q_name);
  json_decref(p->q_keys);
  free(p->q_args.s);
  p->q_name = NULL;
  p->q_keys = NULL;
  memset(&p->q_args, 0, sizeof p->q_args);
  p->q_hdr = p->q_bad = p->q_np = 0;
  p->q_pos = 0;
}

void outparse_free(outparse *p) {
  if (!p) return;
  q_reset(p);
  json_decref(p->props);
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

/* A function name as XML-style markup carries it: non-empty, no NUL, no markup or line break
 * (a NUL would cut the name in every C string it passes through). */
static int name_ok(const char *s, size_t n) {
  if (!n) return 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] == '\0' || s[i] == '<' || s[i] == '>' || s[i] == '\n' || s[i] == '\r') return 0;
  return 1;
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
  /* A name with a NUL would be cut by every C string the name passes through: not a call. */
  if (json_is_string(n) && json_string_length(n) > 0 && strlen(json_string_value(n)) == json_string_length(n)) {
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
  if (!gt || !name_ok(p, (size_t)(gt - p))) return ANNA_EFORMAT;
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


/* ---- qwen3_coder values ---- */

static int type_is(const char *t, const char *const *names) {
  for (; *names; names++)
    if (!strcasecmp(t, *names)) return 1;
  return 0;
}

static int type_starts(const char *t, const char *const *prefixes) {
  for (; *prefixes; prefixes++)
    if (!strncasecmp(t, *prefixes, strlen(*prefixes))) return 1;
  return 0;
}

/* The declared type of a parameter schema (lower case as written; "string" when there is
 * none) and whether it admits null: "type" as a string or a list, or the first non-null
 * type of "anyOf" (vLLM's reading). */
static const char *param_type(const json_t *sch, int *nullable) {
  *nullable = 0;
  const json_t *t = json_object_get(sch, "type");
  const char *pick = NULL;
  if (json_is_string(t)) {
    pick = json_string_value(t);
    *nullable = !strcasecmp(pick, "null");
  } else if (json_is_array(t) || json_is_array(json_object_get(sch, "anyOf"))) {
    const json_t *arr = json_is_array(t) ? t : json_object_get(sch, "anyOf");
    size_t i;
    const json_t *e;
    json_array_foreach(arr, i, e) {
      const json_t *et = json_is_string(e) ? e : json_object_get(e, "type");
      if (!json_is_string(et)) continue;
      if (!strcasecmp(json_string_value(et), "null")) *nullable = 1;
      else if (!pick) pick = json_string_value(et);
    }
  }
  return pick ? pick : "string";
}

static int lower_is(const char *v, size_t n, const char *w) {
  return strlen(w) == n && !strncasecmp(v, w, n);
}

/* A parameter's text as the JSON value its schema asks for, as vLLM's qwen3_coder parser
 * converts it; a value that does not convert stays the string as written. sch NULL (no such
 * parameter, no schema): a string. */
static json_t *q3_value(const char *v, size_t n, const json_t *sch) {
  if (!sch) return json_stringn(v, n);
  int nullable;
  const char *t = param_type(sch, &nullable);
  static const char *const STR[] = {"string", "str", "text", "varchar", "char", "enum", NULL};
  static const char *const INT[] = {"int", "uint", "long", "short", "unsigned", NULL};
  static const char *const NUM[] = {"num", "float", NULL};
  static const char *const BOOL[] = {"boolean", "bool", "binary", NULL};
  static const char *const CONT[] = {"object", "array", "arr", "dict", "list", NULL};
  const int is_null = lower_is(v, n, "null") || lower_is(v, n, "none");
  if (nullable && is_null) return json_null();
  if (type_is(t, STR)) return json_stringn(v, n);
  if (is_null) return json_null();
  char tmp[64];
  if (type_starts(t, INT) || type_starts(t, NUM)) {
    if (n == 0 || n >= sizeof tmp) return json_stringn(v, n);
    memcpy(tmp, v, n);
    tmp[n] = '\0';
    char *end;
    if (type_starts(t, INT)) {
      long long x = strtoll(tmp, &end, 10);
      while (isspace((unsigned char)*end))
        end++;
      return *end || end == tmp ? json_stringn(v, n) : json_integer(x);
    }
    double d = strtod(tmp, &end);
    while (isspace((unsigned char)*end))
      end++;
    if (*end || end == tmp || !isfinite(d)) return json_stringn(v, n);
    /* a whole number comes out as an integer (vLLM: float - int == 0 -> int) */
    if (d == floor(d) && fabs(d) < 9.2e18) return json_integer((json_int_t)d);
    return json_real(d);
  }
  if (type_is(t, BOOL)) return json_boolean(lower_is(v, n, "true"));
  json_error_t je;
  json_t *j = json_loadb(v, n, JSON_DECODE_ANY, &je);
  if (j && type_starts(t, CONT) && json_is_string(j)) { /* a JSON string holding the JSON text */
    json_t *k = json_loads(json_string_value(j), JSON_DECODE_ANY, &je);
    if (k) json_decref(j), j = k;
  }
  return j ? j : json_stringn(v, n);
}

/* ---- gemma4 call bodies: call:NAME{key:VALUE,...} ---- */

typedef struct g4 {
  const char *p, *end;
} g4;

static void g4_ws(g4 *g) {
  while (g->p < g->end && isspace((unsigned char)*g->p))
    g->p++;
}

static int g4_at(const g4 *g, const char *s) {
  size_t n = strlen(s);
  return (size_t)(g->end - g->p) >= n && !memcmp(g->p, s, n);
}

static json_t *g4_value(g4 *g, int depth, const char *stops);

/* <|"|>...<|"|>: the text between, as written. */
static json_t *g4_qstring(g4 *g) {
  g->p += sizeof G4_QUOTE - 1;
  const char *e = mem_find(g->p, (size_t)(g->end - g->p), G4_QUOTE, sizeof G4_QUOTE - 1);
  if (!e) return NULL;
  json_t *s = json_stringn(g->p, (size_t)(e - g->p));
  g->p = e + sizeof G4_QUOTE - 1;
  return s;
}

static json_t *g4_object(g4 *g, int depth) { /* at '{' */
  g->p++;
  json_t *o = json_object();
  for (;;) {
    g4_ws(g);
    if (g->p < g->end && *g->p == '}') {
      g->p++;
      return o;
    }
    json_t *key = NULL;
    if (g4_at(g, G4_QUOTE)) key = g4_qstring(g);
    else {
      const char *k = g->p;
      while (g->p < g->end && *g->p != ':' && *g->p != '}' && *g->p != ',')
        g->p++;
      const char *ke = g->p;
      while (ke > k && isspace((unsigned char)ke[-1]))
        ke--;
      if (ke > k) key = json_stringn(k, (size_t)(ke - k));
    }
    g4_ws(g);
    /* a NUL in a key would not read back (see q3_param): not a call */
    if (!key || memchr(json_string_value(key), '\0', json_string_length(key)) || g->p >= g->end || *g->p != ':')
      goto fail_key;
    g->p++;
    json_t *v = g4_value(g, depth + 1, ",}");
    if (!v) goto fail_key;
    /* keys are compared as bytes (a NUL inside is a byte like any other) */
    json_object_setn_new(o, json_string_value(key), json_string_length(key), v);
    json_decref(key);
    g4_ws(g);
    if (g->p < g->end && *g->p == ',') g->p++;
    else if (!(g->p < g->end && *g->p == '}')) goto fail;
    continue;
  fail_key:
    json_decref(key);
    goto fail;
  }
fail:
  json_decref(o);
  return NULL;
}

static json_t *g4_array(g4 *g, int depth) { /* at '[' */
  g->p++;
  json_t *a = json_array();
  for (;;) {
    g4_ws(g);
    if (g->p < g->end && *g->p == ']') {
      g->p++;
      return a;
    }
    json_t *v = g4_value(g, depth + 1, ",]");
    if (!v) break;
    json_array_append_new(a, v);
    g4_ws(g);
    if (g->p < g->end && *g->p == ',') g->p++;
    else if (!(g->p < g->end && *g->p == ']')) break;
  }
  json_decref(a);
  return NULL;
}

static json_t *g4_value(g4 *g, int depth, const char *stops) {
  if (depth > 64) return NULL; /* nesting that deep is not a call */
  g4_ws(g);
  if (g->p >= g->end) return NULL;
  if (g4_at(g, G4_QUOTE)) return g4_qstring(g);
  if (*g->p == '{') return g4_object(g, depth);
  if (*g->p == '[') return g4_array(g, depth);
  json_error_t je;
  if (*g->p == '"') { /* a JSON string, escapes and all */
    const char *q = g->p + 1;
    while (q < g->end && *q != '"')
      q += *q == '\\' ? 2 : 1;
    if (q >= g->end) return NULL;
    json_t *s = json_loadb(g->p, (size_t)(q + 1 - g->p), JSON_DECODE_ANY, &je);
    g->p = q + 1;
    return s;
  }
  const char *v = g->p;
  while (g->p < g->end && !strchr(stops, *g->p))
    g->p++;
  const char *ve = g->p;
  while (ve > v && isspace((unsigned char)ve[-1]))
    ve--;
  if (ve == v) return NULL;
  const size_t n = (size_t)(ve - v);
  if (lower_is(v, n, "none") || lower_is(v, n, "nil")) return json_null();
  json_t *j = json_loadb(v, n, JSON_DECODE_ANY, &je); /* numbers, true, false, null */
  if (j && (json_is_number(j) || json_is_boolean(j) || json_is_null(j))) return j;
  json_decref(j);
  return json_stringn(v, n); /* a bare word: the model meant a string */
}

/* Name and compact arguments text of a gemma4 call body. */
static int parse_g4_body(const char *b, size_t len, char **name, char **args) {
  g4 g = {b, b + len};
  g4_ws(&g);
  if (!g4_at(&g, "call:")) return ANNA_EFORMAT;
  g.p += 5;
  const char *n0 = g.p;
  while (g.p < g.end && (isalnum((unsigned char)*g.p) || strchr("_-.:", *g.p)))
    g.p++;
  if (g.p == n0 || g.p >= g.end || *g.p != '{') return ANNA_EFORMAT;
  const char *n1 = g.p;
  json_t *o = g4_object(&g, 0);
  g4_ws(&g);
  if (!o || g.p != g.end) {
    json_decref(o);
    return ANNA_EFORMAT;
  }
  *args = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  *name = strndup(n0, (size_t)(n1 - n0));
  if (!*args || !*name) {
    free(*args), free(*name);
    *args = *name = NULL;
    return ANNA_ENOMEM;
  }
  return 0;
}

/* ---- emitting ---- */

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

/* One whole call: as one TOOL_CALL, or incrementally as its name and one arguments piece. */
static int emit_call(outparse *p, const char *name, const char *args, outparse_sink sink, void *ud) {
  p->n_calls++;
  if (!p->incremental) return sink(ud, OUTPARSE_TOOL_CALL, name, strlen(name), args, strlen(args));
  int rc = sink(ud, OUTPARSE_TOOL_NAME, name, strlen(name), NULL, 0);
  return rc ? rc : sink(ud, OUTPARSE_TOOL_ARGS, args, strlen(args), NULL, 0);
}

/* The call body was not a call: it goes out as content, as it was written. */
static int call_as_text(outparse *p, const char *body, size_t blen, int closed, outparse_sink sink, void *ud) {
  int mode = p->mode, rc;
  p->mode = MODE_TEXT;
  if ((rc = emit_text(p, p->t_open, strlen(p->t_open), sink, ud)) || (rc = emit_text(p, body, blen, sink, ud)))
    return rc;
  if (closed) rc = emit_text(p, p->t_close, strlen(p->t_close), sink, ud);
  p->mode = mode;
  return rc;
}

/* qwen3_coder: one parameter's key and raw value -> the next arguments piece. */
static int q3_param(outparse *p, const char *k, size_t kn, const char *v, size_t vn, outparse_sink sink, void *ud) {
  if (vn && *v == '\n') v++, vn--;
  if (vn && v[vn - 1] == '\n') vn--;
  /* A key with a NUL: jansson (and other parsers) refuse it in an object key, so the
   * arguments would not read back: that parameter is dropped. */
  if (memchr(k, '\0', kn)) return 0;
  if (!p->q_keys && !(p->q_keys = json_object())) return ANNA_ENOMEM;
  if (json_object_getn(p->q_keys, k, kn)) return 0; /* a repeated parameter: the first one stands */
  json_object_setn_new(p->q_keys, k, kn, json_true());
  const json_t *fp = p->props ? json_object_get(p->props, p->q_name) : NULL;
  const json_t *sch = fp ? json_object_getn(fp, k, kn) : NULL;
  json_t *val = q3_value(v, vn, sch), *key = json_stringn(k, kn);
  char *vs = val ? json_dumps(val, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
  char *ks = key ? json_dumps(key, JSON_ENCODE_ANY) : NULL;
  json_decref(val);
  json_decref(key);
  int rc = ANNA_ENOMEM;
  const size_t at = p->q_args.len;
  if (vs && ks && !sb_put(&p->q_args, p->q_np ? "," : "{", 1) && !sb_put(&p->q_args, ks, strlen(ks)) &&
      !sb_put(&p->q_args, ":", 1) && !sb_put(&p->q_args, vs, strlen(vs))) {
    p->q_np++;
    rc = p->incremental ? sink(ud, OUTPARSE_TOOL_ARGS, p->q_args.s + at, p->q_args.len - at, NULL, 0) : 0;
  }
  free(vs);
  free(ks);
  return rc;
}

/* qwen3_coder: consumes what is complete of the call body b[0..n) (the buffer up to the
 * closing tag, or all of it while that has not come): the <function=NAME> header (the name
 * goes out), then each <parameter=K>V</parameter>. closing: the body is whole; a parameter
 * missing its </parameter> ends at the next parameter, </function> or the end. */
static int q3_progress(outparse *p, const char *b, size_t n, int closing, outparse_sink sink, void *ud) {
  static const char FN[] = "<function=", UNFN[] = "</function>", PA[] = "<parameter=", UNPA[] = "</parameter>";
  if (p->q_bad) return 0;
  size_t i = p->q_pos;
  if (!p->q_hdr) {
    while (i < n && isspace((unsigned char)b[i]))
      i++;
    const size_t k = n - i < sizeof FN - 1 ? n - i : sizeof FN - 1;
    if (memcmp(b + i, FN, k)) { /* not the XML form: decided at the close (a JSON body?) */
      p->q_bad = 1;
      return 0;
    }
    const char *gt = k == sizeof FN - 1 ? memchr(b + i + k, '>', n - i - k) : NULL;
    if (!gt) return 0;
    const char *nm = b + i + k;
    if (!name_ok(nm, (size_t)(gt - nm)) || !(p->q_name = strndup(nm, (size_t)(gt - nm)))) {
      p->q_bad = 1;
      return p->q_name || !name_ok(nm, (size_t)(gt - nm)) ? 0 : ANNA_ENOMEM;
    }
    p->q_hdr = 1;
    p->n_calls++;
    int rc = p->incremental ? sink(ud, OUTPARSE_TOOL_NAME, p->q_name, strlen(p->q_name), NULL, 0) : 0;
    if (rc) return rc;
    i = (size_t)(gt + 1 - b);
    p->q_pos = i;
  }
  for (;;) {
    const char *pa = mem_find(b + i, n - i, PA, sizeof PA - 1);
    const char *fe = mem_find(b + i, n - i, UNFN, sizeof UNFN - 1);
    if (!pa || (fe && fe < pa)) break; /* no more parameters (or not yet) */
    const char *ks = pa + sizeof PA - 1;
    const char *kg = memchr(ks, '>', (size_t)(b + n - ks));
    if (!kg) break;
    const char *vs = kg + 1;
    const char *ve = mem_find(vs, (size_t)(b + n - vs), UNPA, sizeof UNPA - 1), *next;
    if (ve)
      next = ve + sizeof UNPA - 1;
    else if (!closing)
      break;
    else { /* unterminated: up to the next parameter or the function's end */
      const char *np = mem_find(vs, (size_t)(b + n - vs), PA, sizeof PA - 1);
      const char *nf = mem_find(vs, (size_t)(b + n - vs), UNFN, sizeof UNFN - 1);
      ve = np && (!nf || np < nf) ? np : nf ? nf : b + n;
      next = ve;
    }
    int rc = q3_param(p, ks, (size_t)(kg - ks), vs, (size_t)(ve - vs), sink, ud);
    if (rc) return rc;
    i = (size_t)(next - b);
    p->q_pos = i;
  }
  return 0;
}

/* A call's body is complete (closed: its closing tag came; else the reply ended inside it). */
static int finish_call(outparse *p, const char *body, size_t blen, int closed, outparse_sink sink, void *ud) {
  int rc;
  if (p->tools == OUTPARSE_TOOLS_QWEN3_CODER) {
    if ((rc = q3_progress(p, body, blen, 1, sink, ud))) return rc;
    if (p->q_hdr) {
      rc = sb_put(&p->q_args, p->q_np ? "}" : "{}", p->q_np ? 1 : 2);
      if (!rc && p->incremental)
        rc = sink(ud, OUTPARSE_TOOL_ARGS, p->q_np ? "}" : "{}", p->q_np ? 1 : 2, NULL, 0);
      else if (!rc)
        rc = sink(ud, OUTPARSE_TOOL_CALL, p->q_name, strlen(p->q_name), p->q_args.s, p->q_args.len);
      q_reset(p);
      return rc;
    }
    q_reset(p);
  }
  char *name = NULL, *args = NULL;
  rc = p->tools == OUTPARSE_TOOLS_GEMMA4 ? parse_g4_body(body, blen, &name, &args)
                                         : outparse_tool_body(body, blen, &name, &args);
  if (rc == ANNA_ENOMEM) return rc;
  if (rc == 0) {
    rc = emit_call(p, name, args, sink, ud);
    free(name);
    free(args);
    return rc;
  }
  return call_as_text(p, body, blen, closed, sink, ud);
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
  while (p->len || (final && p->mode == MODE_TOOL)) {
    if (p->mode == MODE_TOOL) {
      const size_t cl = strlen(p->t_close);
      const char *e = mem_find(p->buf, p->len, p->t_close, cl);
      if (!e) {
        if (!final) /* qwen3_coder streams the name and each parameter as they complete */
          return p->tools == OUTPARSE_TOOLS_QWEN3_CODER ? q3_progress(p, p->buf, p->len, 0, sink, ud) : 0;
        p->mode = MODE_TEXT;
        rc = finish_call(p, p->buf, p->len, 0, sink, ud);
        p->len = 0;
        return rc;
      }
      size_t blen = (size_t)(e - p->buf);
      p->mode = MODE_TEXT;
      if ((rc = finish_call(p, p->buf, blen, 1, sink, ud))) return rc;
      drop(p, blen + cl);
      continue;
    }
    /* gemma4 reasoning opens with the channel's "thought\n" label: held until it is clear
     * whether the block starts with it. */
    if (p->mode == MODE_REASON && p->strip_label) {
      const size_t ln = sizeof G4_LABEL - 1, k = p->len < ln ? p->len : ln;
      if (!memcmp(p->buf, G4_LABEL, k)) {
        if (k < ln && !final) return 0;
        if (k == ln) drop(p, ln);
      }
      p->strip_label = 0;
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
      tags[nt++] = p->r_close;
    else {
      if (p->reasoning) tags[nt++] = p->r_open;
      if (p->tools) tags[nt++] = p->t_open;
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
    if (tag == p->r_close)
      p->mode = MODE_TEXT, p->skip_ws = 1;
    else if (tag == p->r_open) {
      p->mode = MODE_REASON;
      p->strip_label = p->reasoning == OUTPARSE_REASONING_GEMMA4;
    } else
      p->mode = MODE_TOOL;
  }
  return 0;
}
