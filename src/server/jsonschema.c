/* jsonschema.c: schema compiler, pattern automaton and the byte recognizer (see jsonschema.h). */
#include "jsonschema.h"

#include <anna/anna.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- compiled form ---- */

enum { K_ANY, K_OBJECT, K_ARRAY, K_STRING, K_NUMBER, K_LITS, K_ANYOF, K_REF };

/* Built-in nodes every schema has. */
enum { N_ANY, N_FREESTR, N_FREENUM, N_FREELIT, N_BUILTIN };

#define RE_MAXPOS 128

typedef struct {
  uint64_t w[2];
} bits128;

typedef struct js_re {
  int npos;                  /* positions 1..npos; 0 is the start */
  bits128 follow[RE_MAXPOS]; /* positions that may come after position p */
  bits128 bychar[128];       /* positions whose class holds byte c */
  bits128 accept;
  uint8_t dist[RE_MAXPOS]; /* fewest characters from position p to a match; 255: none */
} js_re;

typedef struct js_node {
  uint8_t kind;
  uint8_t integer; /* K_NUMBER: no fraction or exponent */
  uint8_t is_free; /* K_OBJECT: any keys (no properties declared) */
  int32_t n;       /* properties, literals or alternatives */
  int32_t *child;  /* property value nodes or alternatives */
  char **name;     /* escaped property names, or literal texts */
  size_t *len;
  uint64_t required;
  int32_t items;     /* K_ARRAY */
  uint32_t min, max; /* items or characters */
  int32_t re;        /* K_STRING: pattern index or -1 */
  int32_t target;    /* K_REF: resolved node */
  char *ref;         /* K_REF: the pointer text until resolved */
} js_node;

struct jsonschema {
  int refs;    /* atomic */
  uint64_t id; /* unique per compile, never reused: the mask cache's key (not the address) */
  js_node *node;
  int n_node, cap_node;
  js_re **re;
  int n_re;
  int32_t root;
};

/* ---- small helpers ---- */

static inline int b_test(const bits128 *b, int p) {
  return (int)((b->w[p >> 6] >> (p & 63)) & 1);
}
static inline void b_set(bits128 *b, int p) {
  b->w[p >> 6] |= (uint64_t)1 << (p & 63);
}
static inline void b_or(bits128 *d, const bits128 *s) {
  d->w[0] |= s->w[0];
  d->w[1] |= s->w[1];
}

/* Bytes a pattern string may hold: printable ASCII without the two that need escapes. */
static int re_char_ok(int c) {
  return c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
}

/* ---- pattern compiler: a Glushkov automaton (positions = class occurrences) ---- */

enum { R_CLASS, R_CAT, R_ALT, R_STAR, R_PLUS, R_OPT, R_REP, R_EMPTY };

typedef struct {
  int type, a, b, min, max;
  bits128 cls;
} re_ast;

typedef struct {
  const char *p, *end;
  re_ast ast[512];
  int n;
  const char *err;
  js_re *re;
  int depth; /* open groups: bounded so a hostile pattern cannot exhaust the stack */
} re_parse;

typedef struct {
  bits128 first, last;
  int nullable;
} re_frag;

static int re_new(re_parse *P, int type, int a, int b) {
  if (P->n >= 512) {
    P->err = "pattern too long";
    return -1;
  }
  re_ast *x = &P->ast[P->n];
  memset(x, 0, sizeof *x);
  x->type = type;
  x->a = a;
  x->b = b;
  return P->n++;
}

static void cls_range(bits128 *c, int lo, int hi) {
  for (int i = lo; i <= hi && i < 128; i++)
    if (re_char_ok(i)) b_set(c, i);
}

static void cls_invert(bits128 *c) {
  bits128 o = {{0, 0}};
  for (int i = 0; i < 128; i++)
    if (re_char_ok(i) && !b_test(c, i)) b_set(&o, i);
  *c = o;
}

/* \d \w \s and their negations, or a literal escaped byte. */
static int re_escape(re_parse *P, bits128 *c) {
  if (P->p >= P->end) {
    P->err = "pattern ends with '\\'";
    return -1;
  }
  int e = (unsigned char)*P->p++;
  bits128 t = {{0, 0}};
  switch (e) {
  case 'd':
  case 'D': cls_range(&t, '0', '9'); break;
  case 'w':
  case 'W':
    cls_range(&t, '0', '9');
    cls_range(&t, 'a', 'z');
    cls_range(&t, 'A', 'Z');
    cls_range(&t, '_', '_');
    break;
  case 's':
  case 'S': cls_range(&t, ' ', ' '); break; /* tab and newline need escapes */
  case 'n':
  case 't':
  case 'r':
  case 'f':
  case 'v': break; /* never generated */
  default:
    if ((e >= '0' && e <= '9') || e == 'b' || e == 'B' || e == 'p' || e == 'P' || e == 'x' ||
        e == 'u' || e == 'k') {
      P->err = "pattern: escapes \\b, \\B, \\p, \\x, \\u and back-references are not supported";
      return -1;
    }
    cls_range(&t, e, e);
    break;
  }
  if (e == 'D' || e == 'W' || e == 'S') cls_invert(&t);
  b_or(c, &t);
  return 0;
}

static int re_alt(re_parse *P);

static int re_atom(re_parse *P) {
  int c = (unsigned char)*P->p++;
  int x;
  if (c == '(') {
    if (++P->depth > 32) {
      P->err = "pattern: groups nested deeper than 32";
      return -1;
    }
    if (P->p < P->end && *P->p == '?') {
      if (P->end - P->p >= 2 && P->p[1] == ':') {
        P->p += 2;
      } else {
        P->err = "pattern: lookaround and named groups are not supported";
        return -1;
      }
    }
    x = re_alt(P);
    if (x < 0) return -1;
    if (P->p >= P->end || *P->p != ')') {
      P->err = "pattern: unbalanced '('";
      return -1;
    }
    P->p++;
    P->depth--;
    return x;
  }
  if ((x = re_new(P, R_CLASS, 0, 0)) < 0) return -1;
  bits128 *cl = &P->ast[x].cls;
  if (c == '.') {
    cls_range(cl, 0, 127);
  } else if (c == '\\') {
    if (re_escape(P, cl)) return -1;
  } else if (c == '[') {
    int neg = P->p < P->end && *P->p == '^';
    if (neg) P->p++;
    int first = 1;
    while (P->p < P->end && (*P->p != ']' || first)) {
      first = 0;
      int lo = (unsigned char)*P->p++;
      if (lo == '\\') {
        if (P->p < P->end && (strchr("dwsDWS", *P->p))) {
          if (re_escape(P, cl)) return -1;
          continue;
        }
        if (P->p >= P->end) break;
        lo = (unsigned char)*P->p++;
        if (lo == 'n' || lo == 't' || lo == 'r') continue;
      }
      int hi = lo;
      if (P->end - P->p >= 2 && *P->p == '-' && P->p[1] != ']') {
        P->p++;
        hi = (unsigned char)*P->p++;
        if (hi == '\\' && P->p < P->end) hi = (unsigned char)*P->p++;
        if (hi < lo) {
          P->err = "pattern: bad class range";
          return -1;
        }
      }
      cls_range(cl, lo, hi);
    }
    if (P->p >= P->end) {
      P->err = "pattern: unbalanced '['";
      return -1;
    }
    P->p++;
    if (neg) cls_invert(cl);
  } else if (c == '^' || c == '$') {
    P->err = "pattern: '^' and '$' are supported only at the ends";
    return -1;
  } else if (c == ')' || c == '*' || c == '+' || c == '?' || c == '{' || c == '|') {
    P->err = "pattern: a quantifier or ')' with nothing before it";
    return -1;
  } else {
    cls_range(cl, c, c);
  }
  return x;
}

static int re_num(re_parse *P, int *v) {
  if (P->p >= P->end || *P->p < '0' || *P->p > '9') return -1;
  *v = 0;
  while (P->p < P->end && *P->p >= '0' && *P->p <= '9') {
    *v = *v * 10 + (*P->p++ - '0');
    if (*v > 64) return -1;
  }
  return 0;
}

static int re_rep(re_parse *P) {
  int x = re_atom(P);
  while (x >= 0 && P->p < P->end) {
    int c = *P->p;
    if (c == '*' || c == '+' || c == '?') {
      P->p++;
      x = re_new(P, c == '*' ? R_STAR : c == '+' ? R_PLUS : R_OPT, x, 0);
    } else if (c == '{') {
      P->p++;
      int mn, mx;
      if (re_num(P, &mn)) goto bad;
      mx = mn;
      if (P->p < P->end && *P->p == ',') {
        P->p++;
        if (P->p < P->end && *P->p == '}')
          mx = -1;
        else if (re_num(P, &mx) || mx < mn)
          goto bad;
      }
      if (P->p >= P->end || *P->p != '}') goto bad;
      P->p++;
      if ((x = re_new(P, R_REP, x, 0)) < 0) return -1;
      P->ast[x].min = mn;
      P->ast[x].max = mx;
    } else {
      break;
    }
    if (x >= 0 && P->p < P->end && *P->p == '?') P->p++; /* lazy: same language */
  }
  return x;
bad:
  P->err = "pattern: bad {m,n} repetition (bounds up to 64)";
  return -1;
}

static int re_cat(re_parse *P) {
  int x = -1;
  while (P->p < P->end && *P->p != '|' && *P->p != ')') {
    int y = re_rep(P);
    if (y < 0) return -1;
    x = x < 0 ? y : re_new(P, R_CAT, x, y);
    if (x < 0) return -1;
  }
  return x < 0 ? re_new(P, R_EMPTY, 0, 0) : x;
}

static int re_alt(re_parse *P) {
  int x = re_cat(P);
  while (x >= 0 && P->p < P->end && *P->p == '|') {
    P->p++;
    int y = re_cat(P);
    if (y < 0) return -1;
    x = re_new(P, R_ALT, x, y);
  }
  return x;
}

static re_frag fr_cat(js_re *R, re_frag a, re_frag b) {
  for (int p = 1; p <= R->npos; p++)
    if (b_test(&a.last, p)) b_or(&R->follow[p], &b.first);
  re_frag o = {a.first, b.last, a.nullable && b.nullable};
  if (a.nullable) b_or(&o.first, &b.first);
  if (b.nullable) b_or(&o.last, &a.last);
  return o;
}

static re_frag fr_loop(js_re *R, re_frag a) {
  for (int p = 1; p <= R->npos; p++)
    if (b_test(&a.last, p)) b_or(&R->follow[p], &a.first);
  return a;
}

/* Instantiates the subtree with fresh positions (repetitions instantiate it again). */
static int re_inst(re_parse *P, int x, re_frag *out) {
  re_ast *n = &P->ast[x];
  js_re *R = P->re;
  re_frag a, b;
  memset(out, 0, sizeof *out);
  switch (n->type) {
  case R_EMPTY: out->nullable = 1; return 0;
  case R_CLASS: {
    if (R->npos + 1 >= RE_MAXPOS) {
      P->err = "pattern too large (more than 127 positions once repetitions are expanded)";
      return -1;
    }
    int p = ++R->npos;
    for (int c = 0; c < 128; c++)
      if (b_test(&n->cls, c)) b_set(&R->bychar[c], p);
    b_set(&out->first, p);
    b_set(&out->last, p);
    return 0;
  }
  case R_CAT:
    if (re_inst(P, n->a, &a) || re_inst(P, n->b, &b)) return -1;
    *out = fr_cat(R, a, b);
    return 0;
  case R_ALT:
    if (re_inst(P, n->a, &a) || re_inst(P, n->b, &b)) return -1;
    out->first = a.first;
    b_or(&out->first, &b.first);
    out->last = a.last;
    b_or(&out->last, &b.last);
    out->nullable = a.nullable || b.nullable;
    return 0;
  case R_STAR:
  case R_PLUS:
  case R_OPT:
    if (re_inst(P, n->a, &a)) return -1;
    if (n->type != R_OPT) a = fr_loop(R, a);
    if (n->type != R_PLUS) a.nullable = 1;
    *out = a;
    return 0;
  case R_REP: {
    /* x{m,n} = x..x (m times) then (x(x(x)?)?)? (n - m nested options, built from the
     * inside out), not m + (n - m) flat options: nested options keep the position sets
     * small (one live copy per character instead of every later one). x{m,} ends in x*. */
    re_frag acc = {{{0, 0}}, {{0, 0}}, 1};
    for (int i = 0; i < n->min; i++) {
      if (re_inst(P, n->a, &a)) return -1;
      acc = fr_cat(R, acc, a);
    }
    if (n->max < 0) {
      if (re_inst(P, n->a, &a)) return -1;
      a = fr_loop(R, a);
      a.nullable = 1;
      acc = fr_cat(R, acc, a);
    } else {
      re_frag tail = {{{0, 0}}, {{0, 0}}, 1};
      for (int i = n->min; i < n->max; i++) {
        if (re_inst(P, n->a, &a)) return -1;
        tail = fr_cat(R, a, tail);
        tail.nullable = 1;
      }
      acc = fr_cat(R, acc, tail);
    }
    *out = acc;
    return 0;
  }
  }
  return -1;
}

/* Compiles pattern (JSON Schema semantics: a search unless anchored) into *out. */
static int re_compile(const char *pat, js_re **out, const char **err) {
  int n = (int)strlen(pat);
  int head = n > 0 && pat[0] == '^',
      tail = n > head && pat[n - 1] == '$' && (n < 2 || pat[n - 2] != '\\');
  re_parse *P = calloc(1, sizeof *P);
  js_re *R = calloc(1, sizeof *R);
  if (!P || !R) {
    free(P);
    free(R);
    *err = "out of memory";
    return ANNA_ENOMEM;
  }
  P->p = pat + head;
  P->end = pat + n - tail;
  P->re = R;
  int x = re_alt(P);
  if (x >= 0 && P->p != P->end) {
    P->err = "pattern: unbalanced ')'";
    x = -1;
  }
  /* Unanchored ends: any text may come before and after the match. */
  if (x >= 0 && !head) {
    int any = re_new(P, R_CLASS, 0, 0);
    if (any >= 0) cls_range(&P->ast[any].cls, 0, 127);
    int st = any < 0 ? -1 : re_new(P, R_STAR, any, 0);
    x = st < 0 ? -1 : re_new(P, R_CAT, st, x);
  }
  if (x >= 0 && !tail) {
    int any = re_new(P, R_CLASS, 0, 0);
    if (any >= 0) cls_range(&P->ast[any].cls, 0, 127);
    int st = any < 0 ? -1 : re_new(P, R_STAR, any, 0);
    x = st < 0 ? -1 : re_new(P, R_CAT, x, st);
  }
  re_frag f;
  if (x < 0 || re_inst(P, x, &f)) {
    *err = P->err ? P->err : "bad pattern";
    free(P);
    free(R);
    return ANNA_EINVAL;
  }
  R->follow[0] = f.first;
  R->accept = f.last;
  if (f.nullable) b_set(&R->accept, 0);
  /* Distances to a match, so a length bound never strands a string that cannot end. */
  for (int p = 0; p <= R->npos; p++)
    R->dist[p] = b_test(&R->accept, p) ? 0 : 255;
  bits128 live = {{0, 0}};
  for (int c = 0; c < 128; c++)
    b_or(&live, &R->bychar[c]);
  for (int it = 0; it <= R->npos; it++)
    for (int p = 0; p <= R->npos; p++)
      for (int q = 1; q <= R->npos; q++)
        if (b_test(&R->follow[p], q) && b_test(&live, q) && R->dist[q] < 254 &&
            R->dist[q] + 1 < R->dist[p])
          R->dist[p] = (uint8_t)(R->dist[q] + 1);
  free(P);
  *out = R;
  return 0;
}

static bits128 re_step(const js_re *R, const uint64_t s[2], int c) {
  bits128 t = {{0, 0}};
  if (c < 0 || c >= 128) return t;
  for (int w = 0; w < 2; w++)
    for (uint64_t m = s[w]; m; m &= m - 1)
      b_or(&t, &R->follow[w * 64 + __builtin_ctzll(m)]);
  t.w[0] &= R->bychar[c].w[0];
  t.w[1] &= R->bychar[c].w[1];
  return t;
}

/* ---- schema compiler ---- */

typedef struct {
  jsonschema *s;
  json_t *doc;
  char *err;
  size_t errlen;
  char path[256];
  int depth; /* nested schemas: bounded so a hostile schema cannot exhaust the stack */
} comp;

static int cfail(comp *C, const char *fmt, ...) {
  char msg[320];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!C->path[0]) return anna_err(C->err, C->errlen, ANNA_EINVAL, "json_schema: %s", msg);
  return anna_err(C->err, C->errlen, ANNA_EINVAL, "json_schema: %s (at %s)", msg, C->path + 1);
}

static int node_new(comp *C, int kind) {
  jsonschema *s = C->s;
  if (s->n_node >= 65535) return cfail(C, "schema too large");
  if (s->n_node == s->cap_node) {
    int nc = s->cap_node ? s->cap_node * 2 : 16;
    js_node *nn = realloc(s->node, (size_t)nc * sizeof *nn);
    if (!nn) return anna_err(C->err, C->errlen, ANNA_ENOMEM, "out of memory");
    s->node = nn;
    s->cap_node = nc;
  }
  js_node *n = &s->node[s->n_node];
  memset(n, 0, sizeof *n);
  n->kind = (uint8_t)kind;
  n->re = -1;
  n->items = N_ANY;
  n->max = UINT32_MAX;
  return s->n_node++;
}

static int node_alloc_lists(comp *C, int id, int n) {
  js_node *x = &C->s->node[id];
  x->n = n;
  x->child = calloc((size_t)n + 1, sizeof *x->child);
  x->name = calloc((size_t)n + 1, sizeof *x->name);
  x->len = calloc((size_t)n + 1, sizeof *x->len);
  if (!x->child || !x->name || !x->len)
    return anna_err(C->err, C->errlen, ANNA_ENOMEM, "out of memory");
  return 0;
}

static int lits_node(comp *C, json_t **vals, size_t n) {
  if (n == 0) return cfail(C, "'enum' must not be empty");
  if (n > 64) return cfail(C, "'enum' has more than 64 values");
  int id = node_new(C, K_LITS);
  if (id < 0) return id;
  if (node_alloc_lists(C, id, (int)n)) return ANNA_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    char *t = json_dumps(vals[i], JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) return anna_err(C->err, C->errlen, ANNA_ENOMEM, "out of memory");
    C->s->node[id].name[i] = t;
    C->s->node[id].len[i] = strlen(t);
  }
  return id;
}

static const char *const ANNOTATIONS[] = {
    "title",      "description", "default",   "examples", "$schema",     "$id", "$comment",
    "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", NULL};
static const char *const KEYWORDS[] = {
    "type",      "properties", "required", "additionalProperties",
    "items",     "minItems",   "maxItems", "enum",
    "const",     "anyOf",      "$ref",     "minLength",
    "maxLength", "pattern",    "format",   NULL};

static int in_list(const char *const *l, const char *k) {
  for (; *l; l++)
    if (!strcmp(*l, k)) return 1;
  return 0;
}

static int get_count(comp *C, json_t *sch, const char *key, uint32_t *v) {
  json_t *x = json_object_get(sch, key);
  if (!x) return 0;
  if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 65535)
    return cfail(C, "'%s' must be an integer from 0 to 65535 (the counters are 16-bit)", key);
  *v = (uint32_t)json_integer_value(x);
  return 0;
}

static int comp_schema(comp *C, json_t *sch, int32_t *out);

/* The node for one type name, with that type's keywords from sch. */
static int comp_type(comp *C, json_t *sch, const char *ty, int32_t *out) {
  int rc;
  if (!strcmp(ty, "null")) {
    json_t *v = json_null();
    rc = lits_node(C, &v, 1);
  } else if (!strcmp(ty, "boolean")) {
    json_t *v[2] = {json_true(), json_false()};
    rc = lits_node(C, v, 2);
  } else if (!strcmp(ty, "number") || !strcmp(ty, "integer")) {
    rc = node_new(C, K_NUMBER);
    if (rc >= 0) C->s->node[rc].integer = ty[0] == 'i';
  } else if (!strcmp(ty, "string")) {
    uint32_t mn = 0, mx = UINT32_MAX;
    if (get_count(C, sch, "minLength", &mn) || get_count(C, sch, "maxLength", &mx))
      return ANNA_EINVAL;
    if (mn > mx) return cfail(C, "'minLength' is above 'maxLength'");
    json_t *pat = json_object_get(sch, "pattern"), *fmt = json_object_get(sch, "format");
    const char *p = NULL;
    if (pat) {
      if (!json_is_string(pat)) return cfail(C, "'pattern' must be a string");
      p = json_string_value(pat);
    }
    if (fmt) {
      static const char *const FMT[][2] = {
          {"date", "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])$"},
          {"time", "^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-"
                   "3]):[0-5][0-9])$"},
          {"date-time", "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5]["
                        "0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
          {"uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
          {"email", "^[a-zA-Z0-9._+-]{1,32}@[a-zA-Z0-9-]{1,32}(\\.[a-zA-Z0-9-]{1,16}){1,3}$"},
          {"ipv4", "^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9]["
                   "0-9]|[1-9]?[0-9])){3}$"},
      };
      if (!json_is_string(fmt)) return cfail(C, "'format' must be a string");
      if (p) return cfail(C, "'pattern' together with 'format' is not supported");
      for (size_t i = 0; i < sizeof FMT / sizeof FMT[0]; i++)
        if (!strcmp(FMT[i][0], json_string_value(fmt))) p = FMT[i][1];
      if (!p)
        return cfail(
            C, "unsupported 'format' \"%s\" (supported: date, time, date-time, uuid, email, ipv4)",
            json_string_value(fmt));
    }
    rc = node_new(C, K_STRING);
    if (rc < 0) return rc;
    C->s->node[rc].min = mn;
    C->s->node[rc].max = mx;
    if (p) {
      js_re *re = NULL;
      const char *e = NULL;
      int r2 = re_compile(p, &re, &e);
      if (r2) return cfail(C, "%s (in \"%s\")", e, p);
      js_re **nr = realloc(C->s->re, (size_t)(C->s->n_re + 1) * sizeof *nr);
      if (!nr) {
        free(re);
        return anna_err(C->err, C->errlen, ANNA_ENOMEM, "out of memory");
      }
      C->s->re = nr;
      nr[C->s->n_re] = re;
      C->s->node[rc].re = C->s->n_re++;
    }
  } else if (!strcmp(ty, "array")) {
    uint32_t mn = 0, mx = UINT32_MAX;
    if (get_count(C, sch, "minItems", &mn) || get_count(C, sch, "maxItems", &mx))
      return ANNA_EINVAL;
    if (mn > mx) return cfail(C, "'minItems' is above 'maxItems'");
    if (mn > 1000) return cfail(C, "'minItems' above 1000 is not supported");
    int32_t items = N_ANY;
    json_t *it = json_object_get(sch, "items");
    if (it) {
      size_t pl = strlen(C->path);
      snprintf(C->path + pl, sizeof C->path - pl, ".items");
      rc = comp_schema(C, it, &items);
      C->path[pl] = 0;
      if (rc) return rc;
    }
    rc = node_new(C, K_ARRAY);
    if (rc < 0) return rc;
    C->s->node[rc].min = mn;
    C->s->node[rc].max = mx;
    C->s->node[rc].items = items;
  } else if (!strcmp(ty, "object")) {
    json_t *props = json_object_get(sch, "properties"), *req = json_object_get(sch, "required"),
           *add = json_object_get(sch, "additionalProperties");
    if (props && !json_is_object(props)) return cfail(C, "'properties' must be an object");
    if (req && !json_is_array(req)) return cfail(C, "'required' must be an array");
    if (add && !json_is_boolean(add))
      return cfail(C, "'additionalProperties' as a schema is not supported (use false)");
    size_t np = props ? json_object_size(props) : 0;
    if (np > 64) return cfail(C, "more than 64 'properties'");
    rc = node_new(C, K_OBJECT);
    if (rc < 0) return rc;
    int id = rc;
    if (np == 0) {
      /* additionalProperties false: only {}; otherwise any object. */
      C->s->node[id].is_free = !json_is_false(add);
      if (req && json_array_size(req))
        return cfail(C, "'required' names properties that 'properties' does not declare");
      *out = id;
      return 0;
    }
    if (json_is_true(add))
      return cfail(C, "'additionalProperties': true with 'properties' is not supported (only "
                      "declared properties are generated; omit it or use false)");
    if (node_alloc_lists(C, id, (int)np)) return ANNA_ENOMEM;
    const char *k;
    json_t *v;
    int i = 0;
    json_object_foreach(props, k, v) {
      json_t *ks = json_string(k);
      char *esc = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
      json_decref(ks);
      if (!esc) return anna_err(C->err, C->errlen, ANNA_ENOMEM, "out of memory");
      size_t el = strlen(esc);
      memmove(esc, esc + 1, el - 2); /* without the quotes */
      esc[el - 2] = 0;
      C->s->node[id].name[i] = esc;
      C->s->node[id].len[i] = el - 2;
      size_t pl = strlen(C->path);
      snprintf(C->path + pl, sizeof C->path - pl, ".properties.%s", k);
      int32_t ch;
      int r2 = comp_schema(C, v, &ch);
      C->path[pl] = 0;
      if (r2) return r2;
      C->s->node[id].child[i++] = ch;
    }
    for (size_t j = 0; req && j < json_array_size(req); j++) {
      json_t *r = json_array_get(req, j);
      if (!json_is_string(r)) return cfail(C, "'required' must hold strings");
      int found = -1, q = 0;
      json_object_foreach(props, k, v) {
        if (!strcmp(k, json_string_value(r))) found = q;
        q++;
      }
      if (found < 0)
        return cfail(C, "'required' names \"%s\", which 'properties' does not declare",
                     json_string_value(r));
      C->s->node[id].required |= (uint64_t)1 << found;
    }
    *out = id;
    return 0;
  } else {
    return cfail(C, "unknown 'type' \"%s\"", ty);
  }
  if (rc < 0) return rc;
  *out = rc;
  return 0;
}

static int comp_schema_in(comp *C, json_t *sch, int32_t *out);

static int comp_schema(comp *C, json_t *sch, int32_t *out) {
  if (C->depth >= 64) return cfail(C, "schemas nested deeper than 64");
  C->depth++;
  int rc = comp_schema_in(C, sch, out);
  C->depth--;
  return rc;
}

static int comp_schema_in(comp *C, json_t *sch, int32_t *out) {
  if (json_is_true(sch)) {
    *out = N_ANY;
    return 0;
  }
  if (!json_is_object(sch)) return cfail(C, "a schema must be an object (or true)");
  const char *k;
  json_t *v;
  int n_constraints = 0;
  json_object_foreach(sch, k, v) {
    if (in_list(ANNOTATIONS, k)) continue;
    if (!in_list(KEYWORDS, k)) return cfail(C, "unsupported keyword '%s'", k);
    n_constraints++;
  }
  json_t *ref = json_object_get(sch, "$ref"), *any = json_object_get(sch, "anyOf"),
         *en = json_object_get(sch, "enum"), *cn = json_object_get(sch, "const"),
         *ty = json_object_get(sch, "type");
  if (ref) {
    if (!json_is_string(ref)) return cfail(C, "'$ref' must be a string");
    if (n_constraints > 1) return cfail(C, "keywords beside '$ref' are not supported");
    int id = node_new(C, K_REF);
    if (id < 0) return id;
    C->s->node[id].ref = strdup(json_string_value(ref));
    C->s->node[id].target = -1;
    if (!C->s->node[id].ref) return anna_err(C->err, C->errlen, ANNA_ENOMEM, "out of memory");
    *out = id;
    return 0;
  }
  if (any) {
    if (!json_is_array(any) || json_array_size(any) == 0 || json_array_size(any) > 16)
      return cfail(C, "'anyOf' must be an array of 1 to 16 schemas");
    if (n_constraints > 1) return cfail(C, "keywords beside 'anyOf' are not supported");
    int id = node_new(C, K_ANYOF);
    if (id < 0) return id;
    if (node_alloc_lists(C, id, (int)json_array_size(any))) return ANNA_ENOMEM;
    for (size_t i = 0; i < json_array_size(any); i++) {
      size_t pl = strlen(C->path);
      snprintf(C->path + pl, sizeof C->path - pl, ".anyOf[%zu]", i);
      int32_t ch;
      int rc = comp_schema(C, json_array_get(any, i), &ch);
      C->path[pl] = 0;
      if (rc) return rc;
      C->s->node[id].child[i] = ch;
    }
    *out = id;
    return 0;
  }
  if (en || cn) {
    if (en && cn) return cfail(C, "'enum' together with 'const' is not supported");
    if (en && !json_is_array(en)) return cfail(C, "'enum' must be an array");
    size_t n = en ? json_array_size(en) : 1;
    json_t *vals[64];
    if (n > 64) return cfail(C, "'enum' has more than 64 values");
    for (size_t i = 0; i < n; i++)
      vals[i] = en ? json_array_get(en, i) : cn;
    int id = lits_node(C, vals, n);
    if (id < 0) return id;
    *out = id;
    return 0;
  }
  if (!ty) {
    /* No type: infer it from the keywords that only one type has. */
    const char *inf = NULL;
    if (json_object_get(sch, "properties") || json_object_get(sch, "required") ||
        json_object_get(sch, "additionalProperties"))
      inf = "object";
    else if (json_object_get(sch, "items") || json_object_get(sch, "minItems") ||
             json_object_get(sch, "maxItems"))
      inf = "array";
    else if (json_object_get(sch, "pattern") || json_object_get(sch, "format") ||
             json_object_get(sch, "minLength") || json_object_get(sch, "maxLength"))
      inf = "string";
    if (!inf) {
      *out = N_ANY;
      return 0;
    }
    return comp_type(C, sch, inf, out);
  }
  if (json_is_string(ty)) return comp_type(C, sch, json_string_value(ty), out);
  if (!json_is_array(ty) || json_array_size(ty) == 0 || json_array_size(ty) > 7)
    return cfail(C, "'type' must be a type name or an array of them");
  if (json_array_size(ty) == 1) {
    json_t *t0 = json_array_get(ty, 0);
    if (!json_is_string(t0)) return cfail(C, "'type' must hold strings");
    return comp_type(C, sch, json_string_value(t0), out);
  }
  int id = node_new(C, K_ANYOF);
  if (id < 0) return id;
  if (node_alloc_lists(C, id, (int)json_array_size(ty))) return ANNA_ENOMEM;
  for (size_t i = 0; i < json_array_size(ty); i++) {
    json_t *ti = json_array_get(ty, i);
    if (!json_is_string(ti)) return cfail(C, "'type' must hold strings");
    int32_t ch;
    int rc = comp_type(C, sch, json_string_value(ti), &ch);
    if (rc) return rc;
    C->s->node[id].child[i] = ch;
  }
  *out = id;
  return 0;
}

/* Resolves "#", "#/$defs/NAME" and "#/definitions/NAME" against the document. */
static int resolve_refs(comp *C) {
  typedef struct {
    char *ref;
    int32_t id;
  } seen;
  seen memo[256];
  int n_memo = 0, rc = 0;
  for (int i = 0; i < C->s->n_node && !rc; i++) {
    js_node *x = &C->s->node[i];
    if (x->kind != K_REF || x->target >= 0) continue;
    char *ref = x->ref;
    int32_t target = -1;
    for (int j = 0; j < n_memo; j++)
      if (!strcmp(memo[j].ref, ref)) target = memo[j].id;
    if (target < 0) {
      if (!strcmp(ref, "#")) {
        target = C->s->root;
      } else {
        json_t *defs = NULL;
        const char *name = NULL;
        if (!strncmp(ref, "#/$defs/", 8)) {
          defs = json_object_get(C->doc, "$defs");
          name = ref + 8;
        } else if (!strncmp(ref, "#/definitions/", 14)) {
          defs = json_object_get(C->doc, "definitions");
          name = ref + 14;
        }
        json_t *sub = name && !strchr(name, '/') && !strchr(name, '~') && !strchr(name, '%')
                          ? json_object_get(defs, name)
                          : NULL;
        if (!sub) {
          C->path[0] = 0;
          rc = cfail(
              C, "'$ref' \"%s\" does not resolve (supported: #, #/$defs/NAME, #/definitions/NAME)",
              ref);
          break;
        }
        if (n_memo == 256) {
          rc = cfail(C, "more than 256 distinct '$ref' targets");
          break;
        }
        snprintf(C->path, sizeof C->path, ".%s", ref + 2);
        rc = comp_schema(C, sub, &target);
        C->path[0] = 0;
        if (rc) break;
      }
      memo[n_memo].ref = C->s->node[i].ref;
      memo[n_memo++].id = target;
    }
    C->s->node[i].target = target; /* node array may have moved: index again */
  }
  return rc;
}

static void schema_free(jsonschema *s) {
  if (!s) return;
  for (int i = 0; i < s->n_node; i++) {
    js_node *x = &s->node[i];
    for (int j = 0; x->name && j < x->n; j++)
      free(x->name[j]);
    free(x->name);
    free(x->child);
    free(x->len);
    free(x->ref);
  }
  free(s->node);
  for (int i = 0; i < s->n_re; i++)
    free(s->re[i]);
  free(s->re);
  free(s);
}

int jsonschema_compile(json_t *schema, jsonschema **out, char *err, size_t errlen) {
  *out = NULL;
  jsonschema *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  static uint64_t next_id;
  s->refs = 1;
  s->id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
  comp C = {.s = s, .doc = schema, .err = err, .errlen = errlen};
  int rc = 0;
  /* Built-ins: any value, a free string, a free number, true/false/null. */
  json_t *lit[3] = {json_true(), json_false(), json_null()};
  if (node_new(&C, K_ANY) != N_ANY || node_new(&C, K_STRING) != N_FREESTR ||
      node_new(&C, K_NUMBER) != N_FREENUM || lits_node(&C, lit, 3) != N_FREELIT)
    rc = ANNA_ENOMEM;
  if (!rc) rc = comp_schema(&C, schema, &s->root);
  if (!rc) rc = resolve_refs(&C);
  if (rc) {
    schema_free(s);
    return rc;
  }
  *out = s;
  return 0;
}

void jsonschema_retain(jsonschema *s) {
  __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
}

void jsonschema_release(jsonschema *s) {
  if (s && __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0) schema_free(s);
}

/* Process-wide cache: compiled schemas by compact text, oldest evicted first. */
#define CACHE_N 64
static struct {
  uint64_t hash;
  char *text;
  jsonschema *s;
} cache[CACHE_N];
static int cache_next;
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;

int jsonschema_get(json_t *schema, jsonschema **out, char *err, size_t errlen) {
  *out = NULL;
  /* Key order kept: properties are generated in declaration order. */
  char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
  if (!text) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  uint64_t h = 1469598103934665603ull;
  for (const char *p = text; *p; p++)
    h = (h ^ (unsigned char)*p) * 1099511628211ull;
  pthread_mutex_lock(&cache_mu);
  for (int i = 0; i < CACHE_N; i++)
    if (cache[i].s && cache[i].hash == h && !strcmp(cache[i].text, text)) {
      jsonschema_retain(cache[i].s);
      *out = cache[i].s;
      pthread_mutex_unlock(&cache_mu);
      free(text);
      return 0;
    }
  pthread_mutex_unlock(&cache_mu);
  int rc = jsonschema_compile(schema, out, err, errlen);
  if (rc) {
    free(text);
    return rc;
  }
  pthread_mutex_lock(&cache_mu);
  int i = cache_next;
  cache_next = (cache_next + 1) % CACHE_N;
  if (cache[i].s) jsonschema_release(cache[i].s);
  free(cache[i].text);
  jsonschema_retain(*out);
  cache[i].s = *out;
  cache[i].text = text;
  cache[i].hash = h;
  pthread_mutex_unlock(&cache_mu);
  return 0;
}

/* ---- the recognizer ---- */

enum {
  P_START,
  /* objects */
  OB_FIRST,
  OB_KEYQ,
  OB_INKEY,
  OB_KEYSTR,
  OB_COLON,
  OB_VWS,
  OB_VALUE,
  OB_AFTER,
  /* arrays */
  AR_FIRST,
  AR_NEXT,
  AR_VALUE,
  AR_AFTER,
  /* strings */
  ST_IN,
  ST_ESC,
  ST_U,
  /* numbers (a = phase below) and literals */
  NU_IN,
  LI_IN,
};

enum { NM_MINUS, NM_ZERO, NM_INT, NM_DOT, NM_FRAC, NM_E, NM_ESIGN, NM_EXP };

/* ST_U bookkeeping in frame.b */
#define U_DIGITS 0x7
#define U_D 0x8     /* first hex digit was d */
#define U_HI 0x10   /* this escape is a high surrogate */
#define U_LO 0x20   /* this escape is a low surrogate */
#define U_PEND 0x40 /* a high surrogate was read: a low one must follow */

#define END_BYTE (-1)
#define MAX_WS 16
#define MAX_LEAD_WS 2

typedef struct {
  const jsonschema *s;
  jschema_state *out;
} run;

static size_t thread_size(const jschema_thread *t) {
  return offsetof(jschema_thread, f) + (size_t)t->depth * sizeof(jschema_frame);
}

static void emit(run *R, const jschema_thread *t) {
  jschema_state *o = R->out;
  size_t sz = thread_size(t);
  for (int i = 0; i < o->n; i++)
    if (o->t[i].depth == t->depth && !memcmp(&o->t[i], t, sz)) return;
  if (o->n < JSCHEMA_MAX_THREADS) memcpy(&o->t[o->n++], t, sz);
}

static int is_ws(int c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void step(run *R, jschema_thread *t, int c);

/* The allowed property indices from a on: up to and including the next required one. */
static uint64_t next_keys(const js_node *n, unsigned a) {
  uint64_t m = 0;
  for (int p = (int)a; p < n->n; p++) {
    m |= (uint64_t)1 << p;
    if ((n->required >> p) & 1) break;
  }
  return m;
}

static int required_left(const js_node *n, unsigned a) {
  return a < 64 && (n->required >> a) != 0;
}

/* Opens a value of node id whose first byte is c (never whitespace). */
static void push_value(run *R, jschema_thread *t, int32_t id, int c, int hops) {
  const js_node *n = &R->s->node[id];
  if (hops > 16) return;
  if (n->kind == K_REF) {
    push_value(R, t, n->target, c, hops + 1);
    return;
  }
  if (n->kind == K_ANYOF) {
    for (int i = 0; i < n->n; i++) {
      jschema_thread u;
      memcpy(&u, t, thread_size(t));
      push_value(R, &u, n->child[i], c, hops + 1);
    }
    return;
  }
  if (t->depth >= JSCHEMA_MAX_DEPTH) return;
  jschema_frame *f = &t->f[t->depth++];
  memset(f, 0, sizeof *f);
  f->node = (uint16_t)id;
  f->phase = P_START;
  step(R, t, c);
}

static void value_end(run *R, jschema_thread *t, int refeed) {
  t->depth--;
  if (t->depth == 0) {
    t->done = 1;
    t->ws = 0;
  } else {
    jschema_frame *p = &t->f[t->depth - 1];
    p->ws = 0;
    if (p->phase == OB_KEYSTR)
      p->phase = OB_COLON;
    else if (p->phase == OB_VALUE)
      p->phase = OB_AFTER;
    else if (p->phase == AR_VALUE) {
      p->phase = AR_AFTER;
      /* Canonical state (the mask cache keys on it): an array without maxItems counts its
       * items only up to minItems, the one bound left that reads the count. */
      const js_node *pn = &R->s->node[p->node];
      if (pn->kind == K_ARRAY && (pn->max != UINT32_MAX || p->a < pn->min)) p->a++;
    }
  }
  if (refeed == -2)
    emit(R, t);
  else
    step(R, t, refeed);
}

static int ws_ok(uint8_t *ws, int c) {
  return is_ws(c) && ++*ws <= MAX_WS;
}

static void step(run *R, jschema_thread *t, int c) {
  if (t->depth == 0) {
    if (t->done) {
      if (c == END_BYTE || (is_ws(c) && ++t->ws <= MAX_WS)) emit(R, t);
      return;
    }
    if (c == END_BYTE) return;
    if (is_ws(c)) {
      if (++t->ws <= MAX_LEAD_WS) emit(R, t);
      return;
    }
    push_value(R, t, R->s->root, c, 0);
    return;
  }
  jschema_frame *f = &t->f[t->depth - 1];
  const js_node *n = &R->s->node[f->node];
  if (c == END_BYTE && f->phase != NU_IN && f->phase != LI_IN) return;
  switch (f->phase) {
  case P_START:
    switch (n->kind) {
    case K_ANY:
      if (c == '{')
        f->node = N_ANY; /* a free object: K_ANY frames act as one */
      else if (c == '[')
        f->node = N_ANY;
      else if (c == '"')
        f->node = N_FREESTR;
      else if (c == '-' || (c >= '0' && c <= '9'))
        f->node = N_FREENUM;
      else if (c == 't' || c == 'f' || c == 'n')
        f->node = N_FREELIT;
      else
        return;
      if (c == '{' || c == '[') {
        f->phase = c == '{' ? OB_FIRST : AR_FIRST;
        f->pad = c == '{' ? 1 : 2; /* which container a K_ANY frame is */
        emit(R, t);
        return;
      }
      step(R, t, c);
      return;
    case K_OBJECT:
      if (c != '{') return;
      f->phase = OB_FIRST;
      emit(R, t);
      return;
    case K_ARRAY:
      if (c != '[') return;
      f->phase = AR_FIRST;
      emit(R, t);
      return;
    case K_STRING:
      if (c != '"') return;
      f->phase = ST_IN;
      if (n->re >= 0) t->re[0] = 1, t->re[1] = 0;
      emit(R, t);
      return;
    case K_NUMBER:
      if (c == '-')
        f->a = NM_MINUS;
      else if (c == '0')
        f->a = NM_ZERO;
      else if (c >= '1' && c <= '9')
        f->a = NM_INT;
      else
        return;
      f->phase = NU_IN;
      f->b = 1;
      emit(R, t);
      return;
    case K_LITS: {
      uint64_t m = 0;
      for (int i = 0; i < n->n; i++)
        if ((unsigned char)n->name[i][0] == c) m |= (uint64_t)1 << i;
      if (!m) return;
      f->phase = LI_IN;
      f->mask = m;
      f->a = 1;
      emit(R, t);
      return;
    }
    }
    return;
  case OB_FIRST:
  case OB_KEYQ:
    if (ws_ok(&f->ws, c)) {
      emit(R, t);
      return;
    }
    if (is_ws(c)) return;
    if (c == '}' && f->phase == OB_FIRST) {
      if (n->kind == K_OBJECT && !n->is_free && required_left(n, f->a)) return;
      value_end(R, t, -2);
      return;
    }
    if (c != '"') return;
    f->ws = 0;
    if (n->kind == K_ANY || n->is_free) {
      f->phase = OB_KEYSTR;
      if (t->depth >= JSCHEMA_MAX_DEPTH) return;
      jschema_frame *k = &t->f[t->depth++];
      memset(k, 0, sizeof *k);
      k->node = N_FREESTR;
      k->phase = ST_IN;
      emit(R, t);
      return;
    }
    f->mask = next_keys(n, f->a);
    if (!f->mask) return;
    f->phase = OB_INKEY;
    f->b = 0;
    emit(R, t);
    return;
  case OB_INKEY: {
    /* Continuing a name first: an escaped name holds '"' only after '\\'. */
    uint64_t m = 0;
    for (uint64_t mm = f->mask; mm; mm &= mm - 1) {
      int p = __builtin_ctzll(mm);
      if (f->b < n->len[p] && (unsigned char)n->name[p][f->b] == c) m |= (uint64_t)1 << p;
    }
    if (m) {
      f->mask = m;
      f->b++;
      emit(R, t);
      return;
    }
    if (c != '"') return;
    for (int p = 0; p < n->n; p++)
      if (((f->mask >> p) & 1) && n->len[p] == f->b) {
        f->a = (uint16_t)(p + 1);
        f->b = (uint16_t)p;
        f->mask = 0; /* not read again before OB_KEYQ sets it: canonical state */
        f->phase = OB_COLON;
        f->ws = 0;
        emit(R, t);
        return;
      }
    return;
  }
  case OB_COLON:
    if (ws_ok(&f->ws, c)) {
      emit(R, t);
      return;
    }
    if (c != ':') return;
    f->phase = OB_VWS;
    f->ws = 0;
    emit(R, t);
    return;
  case OB_VWS:
    if (ws_ok(&f->ws, c)) {
      emit(R, t);
      return;
    }
    if (is_ws(c)) return;
    f->phase = OB_VALUE;
    f->ws = 0;
    push_value(R, t, n->kind == K_ANY || n->is_free ? N_ANY : n->child[f->b], c, 0);
    return;
  case OB_AFTER:
    if (ws_ok(&f->ws, c)) {
      emit(R, t);
      return;
    }
    if (c == ',') {
      if (n->kind == K_OBJECT && !n->is_free && !next_keys(n, f->a)) return;
      f->phase = OB_KEYQ;
      f->ws = 0;
      emit(R, t);
      return;
    }
    if (c == '}') {
      if (n->kind == K_OBJECT && !n->is_free && required_left(n, f->a)) return;
      value_end(R, t, -2);
    }
    return;
  case AR_FIRST:
  case AR_NEXT: {
    if (ws_ok(&f->ws, c)) {
      emit(R, t);
      return;
    }
    if (is_ws(c)) return;
    uint32_t mn = n->kind == K_ARRAY ? n->min : 0, mx = n->kind == K_ARRAY ? n->max : UINT32_MAX;
    if (c == ']' && f->phase == AR_FIRST) {
      if (mn > 0) return;
      value_end(R, t, -2);
      return;
    }
    if (f->a >= mx) return; /* a bounded count stops at maxItems <= 65535 */
    f->phase = AR_VALUE;
    f->ws = 0;
    push_value(R, t, n->kind == K_ARRAY ? n->items : N_ANY, c, 0);
    return;
  }
  case AR_AFTER: {
    if (ws_ok(&f->ws, c)) {
      emit(R, t);
      return;
    }
    uint32_t mn = n->kind == K_ARRAY ? n->min : 0, mx = n->kind == K_ARRAY ? n->max : UINT32_MAX;
    if (c == ',') {
      if (f->a >= mx) return;
      f->phase = AR_NEXT;
      f->ws = 0;
      emit(R, t);
      return;
    }
    if (c == ']' && f->a >= mn) value_end(R, t, -2);
    return;
  }
  case ST_IN: {
    const js_re *re = n->re >= 0 ? R->s->re[n->re] : NULL;
    int bounded = re || n->min > 0 || n->max != UINT32_MAX;
    if (f->mask & 3) {
      int lo = (int)(f->mask >> 8) & 0xff, hi = (int)(f->mask >> 16) & 0xff;
      if (c < lo || c > hi) return;
      uint64_t rem = (f->mask & 3) - 1;
      f->mask = rem ? rem | (uint64_t)0x80 << 8 | (uint64_t)0xbf << 16 : 0;
      emit(R, t);
      return;
    }
    if (f->b & U_PEND) {
      if (c != '\\') return;
      f->phase = ST_ESC;
      emit(R, t);
      return;
    }
    if (c == '"') {
      if (f->a < n->min) return;
      if (re) {
        bits128 s = {{t->re[0], t->re[1]}};
        if (!((s.w[0] & re->accept.w[0]) | (s.w[1] & re->accept.w[1]))) return;
        t->re[0] = t->re[1] = 0; /* read only inside a patterned string: canonical state */
      }
      value_end(R, t, -2);
      return;
    }
    if (c < 0x20) return;
    if (c == '\\') {
      if (bounded) return;
      f->phase = ST_ESC;
      emit(R, t);
      return;
    }
    if (re) {
      if (!re_char_ok(c)) return;
      bits128 s = re_step(re, t->re, c);
      /* Keep only positions from which a match fits in what the length bound leaves. */
      uint32_t left = n->max == UINT32_MAX ? 253 : n->max - f->a - 1;
      for (int w = 0; w < 2; w++)
        for (uint64_t m = s.w[w]; m; m &= m - 1) {
          int p = w * 64 + __builtin_ctzll(m);
          if (re->dist[p] == 255 || re->dist[p] > left) s.w[w] &= ~((uint64_t)1 << (p & 63));
        }
      if (!(s.w[0] | s.w[1])) return;
      t->re[0] = s.w[0];
      t->re[1] = s.w[1];
    }
    if (c >= 0x80) {
      /* Well-formed UTF-8 only (lengths count characters, and the text must decode):
       * frame.mask holds the continuation bytes left and the next one's range. */
      int rem, lo = 0x80, hi = 0xbf;
      if (c < 0xc2 || c > 0xf4) return;
      rem = c < 0xe0 ? 1 : c < 0xf0 ? 2 : 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
      f->mask = (uint64_t)rem | (uint64_t)lo << 8 | (uint64_t)hi << 16;
    }
    if (f->a >= n->max) return;
    /* Without maxLength the count is read only against minLength: it stops there, so every
     * position of a free string is one state (canonical: the mask cache keys on it). */
    if (n->max != UINT32_MAX ? f->a < 65535 : f->a < n->min) f->a++;
    emit(R, t);
    return;
  }
  case ST_ESC:
    if (f->b & U_PEND) {
      if (c != 'u') return;
    } else if (c != 'u') {
      if (!strchr("\"\\/bfnrt", c) || c == 0) return;
      f->phase = ST_IN;
      emit(R, t);
      return;
    }
    f->phase = ST_U;
    f->b &= U_PEND;
    emit(R, t);
    return;
  case ST_U: {
    int v;
    if (c >= '0' && c <= '9')
      v = c - '0';
    else if (c >= 'a' && c <= 'f')
      v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      v = c - 'A' + 10;
    else
      return;
    int d = f->b & U_DIGITS;
    if (d == 0 && v == 0xd) f->b |= U_D;
    if (d == 1 && (f->b & U_D)) f->b |= v >= 0xc ? U_LO : v >= 0x8 ? U_HI : 0;
    if (d == 1) {
      /* After a high surrogate only a low one; a low one only there. */
      if ((f->b & U_PEND) && !(f->b & U_LO)) return;
      if (!(f->b & U_PEND) && (f->b & U_LO)) return;
    }
    f->b = (uint16_t)((f->b & ~U_DIGITS) | (d + 1));
    if (d + 1 == 4) {
      f->b = (f->b & U_HI) ? U_PEND : 0;
      f->phase = ST_IN;
    }
    emit(R, t);
    return;
  }
  case NU_IN: {
    int digit = c >= '0' && c <= '9';
    int more = f->b < JSCHEMA_MAX_NUMBER;
    int next = -1;
    switch (f->a) {
    case NM_MINUS:
      if (!digit || !more) return;
      next = c == '0' ? NM_ZERO : NM_INT;
      break;
    case NM_ZERO:
    case NM_INT:
      if (digit && f->a == NM_INT)
        next = NM_INT;
      else if (c == '.' && !n->integer)
        next = NM_DOT;
      else if ((c == 'e' || c == 'E') && !n->integer)
        next = NM_E;
      break;
    case NM_DOT:
      if (!digit || !more) return;
      next = NM_FRAC;
      break;
    case NM_FRAC:
      if (digit)
        next = NM_FRAC;
      else if (c == 'e' || c == 'E')
        next = NM_E;
      break;
    case NM_E:
      if (!more) return;
      if (c == '+' || c == '-')
        next = NM_ESIGN;
      else if (digit)
        next = NM_EXP;
      else
        return;
      break;
    case NM_ESIGN:
      if (!digit || !more) return;
      next = NM_EXP;
      break;
    case NM_EXP:
      if (digit) next = NM_EXP;
      break;
    }
    if (next >= 0 && more) {
      f->a = (uint16_t)next;
      f->b++;
      emit(R, t);
      return;
    }
    if (next >= 0 && (f->a == NM_DOT || f->a == NM_E || f->a == NM_ESIGN || f->a == NM_MINUS))
      return;
    /* The number ended (or hit its length cap): c belongs to what follows. */
    if (f->a != NM_ZERO && f->a != NM_INT && f->a != NM_FRAC && f->a != NM_EXP) return;
    value_end(R, t, c);
    return;
  }
  case LI_IN: {
    uint64_t m = 0;
    int complete = 0;
    for (uint64_t mm = f->mask; mm; mm &= mm - 1) {
      int i = __builtin_ctzll(mm);
      if (n->len[i] == f->a)
        complete = 1;
      else if (c >= 0 && (unsigned char)n->name[i][f->a] == c)
        m |= (uint64_t)1 << i;
    }
    if (m) {
      /* A complete literal that another one continues (1 and 12) stays open: prefer the
       * longer parse; the other thread of thought is the terminator path below. */
      f->mask = m;
      f->a++;
      emit(R, t);
      return;
    }
    if (complete) value_end(R, t, c);
    return;
  }
  }
}

void jsonschema_start(const jsonschema *s, jschema_state *st) {
  st->s = s;
  st->n = 1;
  memset(&st->t[0], 0, offsetof(jschema_thread, f));
}

void jsonschema_copy(jschema_state *dst, const jschema_state *src) {
  dst->s = src->s;
  dst->n = src->n;
  for (int i = 0; i < src->n; i++)
    memcpy(&dst->t[i], &src->t[i], thread_size(&src->t[i]));
}

/* in -> out on byte c (END_BYTE: end of text); returns out->n. */
static int state_step(const jschema_state *in, jschema_state *out, int c) {
  run R = {in->s, out};
  out->s = in->s;
  out->n = 0;
  for (int i = 0; i < in->n; i++) {
    jschema_thread t;
    memcpy(&t, &in->t[i], thread_size(&in->t[i]));
    step(&R, &t, c);
  }
  return out->n;
}

int jsonschema_feed(jschema_state *st, const char *b, size_t n) {
  jschema_state tmp;
  for (size_t i = 0; i < n; i++) {
    if (!state_step(st, &tmp, (unsigned char)b[i])) return -1;
    jsonschema_copy(st, &tmp);
  }
  return 0;
}

int jsonschema_done(const jschema_state *st) {
  jschema_state tmp;
  return state_step(st, &tmp, END_BYTE) > 0;
}

int jsonschema_free_string(const jschema_state *st) {
  for (int i = 0; i < st->n; i++) {
    const jschema_thread *t = &st->t[i];
    if (t->depth == 0) return 0;
    const jschema_frame *f = &t->f[t->depth - 1];
    const js_node *n = &st->s->node[f->node];
    if (f->phase != ST_IN || (f->b & U_PEND) || (f->mask & 3) || n->re >= 0 || n->max != UINT32_MAX)
      return 0;
  }
  return st->n > 0;
}

/* ---- vocabulary mask ---- */

/* Tokens in byte order, with what the walk needs in that order. */
typedef struct js_order {
  int n;
  int32_t *tok;           /* token ids */
  uint16_t *lcp;          /* common prefix with the previous entry */
  int32_t *skip1, *skip2; /* [n + 1] the next entry whose lcp is < 1 (< 2) */
  char *bytes;            /* the tokens' bytes, in this order: the walk reads them in sequence */
  uint32_t *boff;         /* [n + 1] entry i is bytes[boff[i], boff[i + 1]) */
} js_order;

struct jschema_vocab {
  int nv; /* vocabulary size */
  const char *bytes;
  const uint32_t *off;
  const uint8_t *cls;
  /* all: every feedable token; plain: those that are plain string content (complete UTF-8,
   * no control byte, quote or backslash); rest: the others. */
  js_order all, plain, rest;
  int16_t *nchars; /* [nv] characters of a plain token; -1 if not plain */
  int32_t *pure;   /* the plain tokens */
  int n_pure, max_nchars;
  int32_t *never; /* special, empty and absurdly long tokens */
  int n_never;
  int32_t *split; /* pieces of split characters whose bytes are unknown */
  int n_split;
  int maxlen;
  jschema_scratch *sc; /* jsonschema_vocab_mask's own scratch */
  char *own_bytes;     /* jsonschema_vocab_from_text's tables */
  uint32_t *own_off;
  uint8_t *own_cls;
};

/* What one mask computation writes: a caller per scratch, so several threads can mask over
 * one (read-only) vocab, each with its own (jsonschema_scratch_new). */
struct jschema_scratch {
  jschema_state *st; /* [maxlen + 1] scratch of the full pass */
  struct lite *lite; /* [maxlen + 1] scratch of the string pass */
  float *saved;      /* [nv] the row before masking */
  float *zrow;       /* [nv] jsonschema_mask_bits_cached: a miss masks a zero row */
  uint8_t *key;      /* [JSCHEMA_KEY_MAX] the state's cache key */
};

/* Inside strings, plain tokens never leave the string: the string pass steps only what a
 * string's characters change (count and pattern positions) of each thread. */
struct lite {
  int n;
  struct {
    uint32_t a, max;
    const js_re *re;
    uint64_t s[2];
  } th[JSCHEMA_MAX_THREADS];
};

static int lite_step(const struct lite *in, struct lite *out, int c) {
  out->n = 0;
  for (int i = 0; i < in->n; i++) {
    uint32_t a = in->th[i].a;
    if ((c < 0x80 || c >= 0xc0) && a++ >= in->th[i].max) continue;
    const js_re *re = in->th[i].re;
    bits128 s = {{0, 0}};
    if (re) {
      if (!re_char_ok(c)) continue;
      s = re_step(re, in->th[i].s, c);
      uint32_t left = in->th[i].max == UINT32_MAX ? 253 : in->th[i].max - a;
      for (int w = 0; w < 2; w++)
        for (uint64_t m = s.w[w]; m; m &= m - 1) {
          int p = w * 64 + __builtin_ctzll(m);
          if (re->dist[p] == 255 || re->dist[p] > left) s.w[w] &= ~((uint64_t)1 << (p & 63));
        }
      if (!(s.w[0] | s.w[1])) continue;
    }
    out->th[out->n] = in->th[i];
    out->th[out->n].a = a;
    out->th[out->n].s[0] = s.w[0];
    out->th[out->n].s[1] = s.w[1];
    out->n++;
  }
  return out->n;
}

static const char *sort_bytes;
static const uint32_t *sort_off;

static int cmp_tok(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  size_t lx = sort_off[x + 1] - sort_off[x], ly = sort_off[y + 1] - sort_off[y];
  int r = memcmp(sort_bytes + sort_off[x], sort_bytes + sort_off[y], lx < ly ? lx : ly);
  if (r) return r;
  return lx < ly ? -1 : lx > ly ? 1 : (x > y) - (x < y);
}

static int order_alloc(js_order *o, int n) {
  o->n = 0;
  o->tok = malloc(((size_t)n + 1) * sizeof *o->tok);
  o->lcp = malloc(((size_t)n + 1) * sizeof *o->lcp);
  o->skip1 = malloc(((size_t)n + 1) * sizeof *o->skip1);
  o->skip2 = malloc(((size_t)n + 1) * sizeof *o->skip2);
  return o->tok && o->lcp && o->skip1 && o->skip2 ? 0 : ANNA_ENOMEM;
}

static void order_free(js_order *o) {
  free(o->bytes);
  free(o->boff);
  free(o->tok);
  free(o->lcp);
  free(o->skip1);
  free(o->skip2);
}

/* Skip tables and the bytes in order. */
static int order_finish(js_order *o, const char *bytes, const uint32_t *off) {
  int n = o->n;
  size_t total = 0;
  for (int i = 0; i < n; i++)
    total += off[o->tok[i] + 1] - off[o->tok[i]];
  o->bytes = malloc(total + 1);
  o->boff = malloc(((size_t)n + 1) * sizeof *o->boff);
  if (!o->bytes || !o->boff) return ANNA_ENOMEM;
  total = 0;
  for (int i = 0; i < n; i++) {
    size_t l = off[o->tok[i] + 1] - off[o->tok[i]];
    o->boff[i] = (uint32_t)total;
    memcpy(o->bytes + total, bytes + off[o->tok[i]], l);
    total += l;
  }
  o->boff[n] = (uint32_t)total;
  o->skip1[n] = o->skip2[n] = n;
  for (int i = n - 1; i >= 0; i--) {
    o->skip1[i] = i + 1 < n && o->lcp[i + 1] < 1 ? i + 1 : o->skip1[i + 1];
    o->skip2[i] = i + 1 < n && o->lcp[i + 1] < 2 ? i + 1 : o->skip2[i + 1];
  }
  return 0;
}

/* Characters of a token that is plain string content, or -1. */
static int plain_chars(const unsigned char *b, size_t l) {
  int nc = 0;
  size_t k = 0;
  if (l == 0) return -1;
  while (k < l) {
    unsigned c = b[k];
    int len = c < 0x80                ? 1
              : c >= 0xc2 && c < 0xe0 ? 2
              : c >= 0xe0 && c < 0xf0 ? 3
              : c >= 0xf0 && c < 0xf5 ? 4
                                      : 0;
    if (!len || c < 0x20 || c == '"' || c == '\\' || k + (size_t)len > l) return -1;
    for (int q = 1; q < len; q++)
      if ((b[k + q] & 0xc0) != 0x80) return -1;
    /* the tighter second-byte ranges of E0, ED, F0, F4 */
    if (len > 1 && ((c == 0xe0 && b[k + 1] < 0xa0) || (c == 0xed && b[k + 1] > 0x9f) ||
                    (c == 0xf0 && b[k + 1] < 0x90) || (c == 0xf4 && b[k + 1] > 0x8f)))
      return -1;
    k += (size_t)len;
    nc++;
  }
  return nc > 32767 ? -1 : nc;
}

int jsonschema_vocab_build(jschema_vocab **out, const char *bytes, const uint32_t *off,
                           const uint8_t *cls, int V) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* qsort has no context argument */
  *out = NULL;
  jschema_vocab *v = calloc(1, sizeof *v);
  if (!v) return ANNA_ENOMEM;
  v->nv = V;
  v->bytes = bytes;
  v->off = off;
  v->cls = cls;
  v->nchars = malloc((size_t)V * sizeof *v->nchars);
  v->pure = malloc((size_t)V * sizeof *v->pure);
  v->never = malloc((size_t)V * sizeof *v->never);
  v->split = malloc((size_t)V * sizeof *v->split);
  if (!v->nchars || !v->pure || !v->never || !v->split || order_alloc(&v->all, V) ||
      order_alloc(&v->plain, V) || order_alloc(&v->rest, V))
    goto fail;
  js_order *A = &v->all;
  for (int32_t t = 0; t < V; t++) {
    size_t l = off[t + 1] - off[t];
    v->nchars[t] = -1;
    if (cls[t] == 2) {
      v->split[v->n_split++] = t;
      continue;
    }
    if (cls[t] != 0 || l == 0 || l > 1024) { /* no sane token is longer */
      v->never[v->n_never++] = t;
      continue;
    }
    A->tok[A->n++] = t;
    if ((int)l > v->maxlen) v->maxlen = (int)l;
    int nc = plain_chars((const unsigned char *)bytes + off[t], l);
    v->nchars[t] = (int16_t)nc;
    if (nc >= 0) {
      v->pure[v->n_pure++] = t;
      if (nc > v->max_nchars) v->max_nchars = nc;
    }
  }
  pthread_mutex_lock(&mu);
  sort_bytes = bytes;
  sort_off = off;
  qsort(A->tok, (size_t)A->n, sizeof *A->tok, cmp_tok);
  pthread_mutex_unlock(&mu);
  for (int i = 0; i < A->n; i++) {
    int32_t a = i ? A->tok[i - 1] : -1, b = A->tok[i];
    size_t k = 0;
    if (a >= 0) {
      size_t la = off[a + 1] - off[a], lb = off[b + 1] - off[b];
      while (k < la && k < lb && bytes[off[a] + k] == bytes[off[b] + k])
        k++;
    }
    A->lcp[i] = (uint16_t)k;
  }
  /* The two sub-orders: an entry's lcp is the least one since the previous entry. */
  int run_p = 0, run_r = 0;
  for (int i = 0; i < A->n; i++) {
    int l = A->lcp[i];
    run_p = i == 0 || l < run_p ? l : run_p;
    run_r = i == 0 || l < run_r ? l : run_r;
    js_order *o = v->nchars[A->tok[i]] >= 0 ? &v->plain : &v->rest;
    int *rp = o == &v->plain ? &run_p : &run_r;
    o->tok[o->n] = A->tok[i];
    o->lcp[o->n] = (uint16_t)(o->n == 0 ? 0 : *rp);
    o->n++;
    *rp = INT32_MAX;
  }
  if (order_finish(&v->all, bytes, off) || order_finish(&v->plain, bytes, off) ||
      order_finish(&v->rest, bytes, off))
    goto fail;
  if (jsonschema_scratch_new(&v->sc, v)) goto fail;
  *out = v;
  return 0;
fail:
  jsonschema_vocab_free(v);
  return ANNA_ENOMEM;
}

void jsonschema_vocab_free(jschema_vocab *v) {
  if (!v) return;
  order_free(&v->all);
  order_free(&v->plain);
  order_free(&v->rest);
  free(v->nchars);
  free(v->pure);
  free(v->never);
  free(v->split);
  jsonschema_scratch_free(v->sc);
  free(v->own_bytes);
  free(v->own_off);
  free(v->own_cls);
  free(v);
}

/* The raw bytes of a token whose text is a piece of a split UTF-8 character, from its
 * vocabulary piece: a byte-fallback piece <0xHH>, or a byte-level BPE piece (GPT-2's map of
 * bytes to printable code points). 0 and *n bytes in out[4*plen], or -1 when it is neither. */
static int piece_raw_bytes(const char *p, size_t plen, char *out, size_t *n) {
  *n = 0;
  if (plen == 6 && !memcmp(p, "<0x", 3) && p[5] == '>') {
    unsigned v;
    if (sscanf(p + 3, "%2x", &v) != 1) return -1;
    out[(*n)++] = (char)v;
    return 0;
  }
  for (size_t i = 0; i < plen;) {
    unsigned c = (unsigned char)p[i], cp;
    if (c < 0x80)
      cp = c, i += 1;
    else if ((c & 0xe0) == 0xc0 && i + 1 < plen)
      cp = ((c & 0x1f) << 6) | (p[i + 1] & 0x3f), i += 2;
    else
      return -1;
    /* GPT-2: bytes 33-126, 161-172, 174-255 stand for themselves; the others, in order,
     * for 256 + k. */
    int b = -1;
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) {
      b = (int)cp;
    } else if (cp >= 256 && cp < 256 + 68) {
      int k = (int)cp - 256;
      for (int x = 0; x < 256 && b < 0; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)) &&
            k-- == 0)
          b = x;
    }
    if (b < 0) return -1;
    out[(*n)++] = (char)b;
  }
  return 0;
}

int jsonschema_vocab_from_text(jschema_vocab **out, const anna_text *text) {
  *out = NULL;
  const int32_t V = anna_text_vocab(text);
  size_t cap = (size_t)V * 8, len = 0;
  char *bytes = malloc(cap);
  uint32_t *off = malloc(((size_t)V + 1) * sizeof *off);
  uint8_t *cls = malloc((size_t)V);
  if (!bytes || !off || !cls) goto fail;
  for (int32_t v = 0; v < V; v++) {
    char *t = NULL;
    size_t n = 0;
    off[v] = (uint32_t)len;
    cls[v] = 1;
    if (anna_text_token_is_special(text, v) ||
        anna_text_detokenize(text, &v, 1, 0, &t, &n, NULL, 0)) {
      free(t);
      continue;
    }
    if (len + n > cap || len + n > UINT32_MAX) {
      size_t nc = (len + n) * 2;
      char *nb = realloc(bytes, nc);
      if (!nb || nc > UINT32_MAX) {
        free(nb ? nb : bytes);
        bytes = NULL;
        free(t);
        goto fail;
      }
      bytes = nb;
      cap = nc;
    }
    memcpy(bytes + len, t, n);
    len += n;
    cls[v] = n == 0 ? 1 : memmem(t, n, "\xef\xbf\xbd", 3) ? 2 : 0;
    size_t pl = 0, rn = 0;
    const char *piece = cls[v] == 2 ? anna_text_token_piece(text, v, &pl) : NULL;
    if (piece && pl <= 64) {
      /* Its real bytes (a schema's literal or length bound needs them): fed like any token. */
      char raw[256];
      if (piece_raw_bytes(piece, pl, raw, &rn) == 0 && rn && rn <= n) {
        memcpy(bytes + len - n, raw, rn);
        len = len - n + rn;
        cls[v] = 0;
      }
    }
    /* A piece of a split character may only sit inside a string, and must not end it. */
    for (size_t k = 0; k < n && cls[v] == 2; k++)
      if ((unsigned char)t[k] < 0x20 || t[k] == '"' || t[k] == '\\') cls[v] = 1;
    free(t);
  }
  off[V] = (uint32_t)len;
  if (jsonschema_vocab_build(out, bytes, off, cls, V)) goto fail;
  (*out)->own_bytes = bytes;
  (*out)->own_off = off;
  (*out)->own_cls = cls;
  return 0;
fail:
  free(bytes);
  free(off);
  free(cls);
  return ANNA_ENOMEM;
}

void jsonschema_vocab_tables(const jschema_vocab *v, const char **bytes, const uint32_t **off,
                             const uint8_t **cls) {
  *bytes = v->bytes;
  *off = v->off;
  *cls = v->cls;
}

void jsonschema_vocab_order(const jschema_vocab *v, jschema_order *o, int *nv) {
  const js_order *a = &v->all;
  *o = (jschema_order){.n = a->n, .maxlen = v->maxlen, .tok = a->tok, .lcp = a->lcp,
                       .skip1 = a->skip1, .skip2 = a->skip2, .bytes = a->bytes, .boff = a->boff};
  *nv = v->nv;
}

/* Whether every thread is inside a string with nothing pending (no escape, no split
 * character): then a plain token only adds characters. *room: the most characters a thread
 * without a pattern may still take; *patterned: some thread has a pattern. */
static int in_strings(const jschema_state *st, long *room, int *patterned) {
  *room = -1;
  *patterned = 0;
  for (int i = 0; i < st->n; i++) {
    const jschema_thread *t = &st->t[i];
    if (t->depth == 0) return 0;
    const jschema_frame *f = &t->f[t->depth - 1];
    const js_node *n = &st->s->node[f->node];
    if (f->phase != ST_IN || (f->b & U_PEND) || (f->mask & 3)) return 0;
    *patterned |= n->re >= 0;
    long r = n->max == UINT32_MAX ? 1L << 30 : (long)n->max - f->a;
    *room = r > *room ? r : *room;
  }
  return st->n > 0;
}

/* One pass over an order. lite: states are struct lite (the string pass, plain tokens
 * only); else full states. Accepted tokens get their saved logit back, or with negative set,
 * rejected ones get -inf instead (the row was left as it was). Returns how many tokens it
 * accepted (negative: rejected). A token shares its first bytes with the last one fed
 * (chain: the least lcp since then), whose states after those bytes are reused; a rejected
 * prefix rejects every token that starts with it, and a rejected first or second byte skips
 * to the next entry that differs there. */
static int walk(const jschema_vocab *v, jschema_scratch *sc, const js_order *o,
                const jschema_state *st, float *row, int lite, int negative) {
  int count = 0;
  int valid = 0;         /* states [0..valid] hold those after that many bytes */
  int rej = INT32_MAX;   /* the last fed token's bytes [0, rej] were rejected */
  int chain = INT32_MAX; /* common prefix of this token and the last fed one */
  if (lite) {
    struct lite *l0 = &sc->lite[0];
    l0->n = st->n;
    for (int i = 0; i < st->n; i++) {
      const jschema_thread *t = &st->t[i];
      const jschema_frame *f = &t->f[t->depth - 1];
      const js_node *n = &st->s->node[f->node];
      l0->th[i].a = f->a;
      l0->th[i].max = n->max;
      l0->th[i].re = n->re >= 0 ? st->s->re[n->re] : NULL;
      l0->th[i].s[0] = t->re[0];
      l0->th[i].s[1] = t->re[1];
    }
  } else {
    jsonschema_copy(&sc->st[0], st);
  }
  for (int i = 0; i < o->n; i++) {
    if (o->lcp[i] < chain) chain = o->lcp[i];
    if (rej < chain) {
      int j = rej == 0 ? o->skip1[i] : rej == 1 ? o->skip2[i] : i + 1;
      /* entries i..j-1 share the rejected prefix; lcp[j] resets chain */
      if (negative)
        for (int q = i; q < j; q++)
          row[o->tok[q]] = -INFINITY;
      if (negative) count += j - i;
      i = j - 1;
      continue;
    }
    int32_t t = o->tok[i];
    const char *b = o->bytes + o->boff[i];
    int n = (int)(o->boff[i + 1] - o->boff[i]);
    int k = chain < valid ? chain : valid;
    if (lite) {
      for (; k < n; k++)
        if (!lite_step(&sc->lite[k], &sc->lite[k + 1], (unsigned char)b[k])) break;
    } else {
      for (; k < n; k++)
        if (!state_step(&sc->st[k], &sc->st[k + 1], (unsigned char)b[k])) break;
    }
    if (k == n) {
      valid = n;
      rej = INT32_MAX;
      if (!negative) {
        row[t] = sc->saved[t];
        count++;
      }
    } else {
      valid = rej = k;
      if (negative) {
        row[t] = -INFINITY;
        count++;
      }
    }
    chain = INT32_MAX;
  }
  return count;
}

int jsonschema_scratch_new(jschema_scratch **out, const jschema_vocab *v) {
  jschema_scratch *sc = calloc(1, sizeof *sc);
  *out = NULL;
  if (!sc) return ANNA_ENOMEM;
  sc->st = malloc(((size_t)v->maxlen + 1) * sizeof *sc->st);
  sc->lite = malloc(((size_t)v->maxlen + 1) * sizeof *sc->lite);
  sc->saved = malloc((size_t)v->nv * sizeof *sc->saved);
  sc->zrow = malloc((size_t)v->nv * sizeof *sc->zrow);
  sc->key = malloc(JSCHEMA_KEY_MAX);
  if (!sc->st || !sc->lite || !sc->saved || !sc->zrow || !sc->key) {
    jsonschema_scratch_free(sc);
    return ANNA_ENOMEM;
  }
  *out = sc;
  return 0;
}

void jsonschema_scratch_free(jschema_scratch *sc) {
  if (!sc) return;
  free(sc->st);
  free(sc->lite);
  free(sc->saved);
  free(sc->zrow);
  free(sc->key);
  free(sc);
}

int jsonschema_vocab_mask(jschema_vocab *v, const jschema_state *st, float *row) {
  return jsonschema_vocab_mask_with(v, v->sc, st, row);
}

int jsonschema_vocab_mask_with(const jschema_vocab *v, jschema_scratch *sc, const jschema_state *st,
                               float *row) {
  long room;
  int patterned;
  int str = in_strings(st, &room, &patterned), free_str = jsonschema_free_string(st);
  if (str && !patterned) {
    /* Inside a string without a pattern nearly everything is allowed: mask what is not.
     * Plain tokens are decided by their length alone, the rest by walking them. */
    int rejected = 0;
    for (int k = 0; k < v->n_never; k++)
      row[v->never[k]] = -INFINITY;
    rejected += v->n_never;
    if (!free_str) {
      for (int k = 0; k < v->n_split; k++)
        row[v->split[k]] = -INFINITY;
      rejected += v->n_split;
    }
    if (room < v->max_nchars)
      for (int k = 0; k < v->n_pure; k++) {
        int32_t t = v->pure[k];
        if (v->nchars[t] > room) row[t] = -INFINITY, rejected++;
      }
    rejected += walk(v, sc, &v->rest, st, row, 0, 1);
    return v->nv - rejected;
  }
  /* Elsewhere few tokens fit: everything starts masked and allowed ones get their logit
   * back. */
  memcpy(sc->saved, row, (size_t)v->nv * sizeof *row);
  for (int t = 0; t < v->nv; t++)
    row[t] = -INFINITY;
  int allowed = 0;
  if (free_str)
    for (int k = 0; k < v->n_split; k++)
      row[v->split[k]] = sc->saved[v->split[k]], allowed++;
  if (str) /* a patterned string: plain tokens through the string pass */
    return allowed + walk(v, sc, &v->plain, st, row, 1, 0) + walk(v, sc, &v->rest, st, row, 0, 0);
  return allowed + walk(v, sc, &v->all, st, row, 0, 0);
}

/* Most 64-token words are all allowed or all rejected: those are told by memcmp (vectorized
 * in the C library) against a block of zeros / -infs; the rest bit by bit. */
static const float zero_block[64];
static float ninf_block[64];
static pthread_once_t ninf_once = PTHREAD_ONCE_INIT;

static void ninf_init(void) {
  for (int j = 0; j < 64; j++)
    ninf_block[j] = -INFINITY;
}

void jsonschema_mask_bits(const float *row, int V, uint64_t *bits) {
  pthread_once(&ninf_once, ninf_init);
  for (size_t k = 0, words = ((size_t)V + 63) / 64; k < words; k++) {
    const float *r = row + k * 64;
    const size_t n = (size_t)V - k * 64 < 64 ? (size_t)V - k * 64 : 64;
    if (!memcmp(r, zero_block, n * sizeof *r)) {
      bits[k] = 0;
    } else if (!memcmp(r, ninf_block, n * sizeof *r)) {
      bits[k] = n == 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;
    } else {
      uint64_t m = 0;
      for (size_t j = 0; j < n; j++)
        m |= (uint64_t)(r[j] == -INFINITY) << j;
      bits[k] = m;
    }
  }
}

void jsonschema_bits_apply(const uint64_t *bits, int V, float *row) {
  pthread_once(&ninf_once, ninf_init);
  for (size_t k = 0, words = ((size_t)V + 63) / 64; k < words; k++) {
    uint64_t m = bits[k];
    if (!m) continue;
    float *r = row + k * 64;
    if (m == ~(uint64_t)0) { /* a full word: the last one, if partial, never is */
      memcpy(r, ninf_block, sizeof ninf_block);
      continue;
    }
    for (; m; m &= m - 1)
      r[__builtin_ctzll(m)] = -INFINITY;
  }
}

/* ---- mask cache ----
 * A state's mask is a function of the compiled schema, the vocabulary and the state's live
 * bytes (what step() and the walk read: the threads in order, each thread's depth, done, ws
 * and pattern positions, and its open frames). The key is exactly those bytes behind the
 * schema's compile id; equal keys are equal states, so their masks are equal. The recognizer
 * keeps its state canonical (counts that no bound reads stop, stale fields are cleared), so
 * the states a sequence passes through recur: every character of a free string, every item
 * of an unbounded array is one key. */

/* Writes the key of st into key[JSCHEMA_KEY_MAX]; returns its length. Each live thread's bytes
 * as they are (header and open frames, the bytes emit() compares to merge threads; padding is
 * always zero: threads start from jsonschema_start's memset and frames from memset, and are
 * only copied with memcpy), so equal keys are byte-equal states. */
static size_t state_key(const jschema_state *st, uint8_t *key) {
  size_t k = 0;
  memcpy(key, &st->s->id, 8);
  k += 8;
  key[k++] = (uint8_t)st->n;
  for (int i = 0; i < st->n; i++) {
    const size_t sz = thread_size(&st->t[i]);
    memcpy(key + k, &st->t[i], sz);
    k += sz;
  }
  return k;
}

enum { MC_BITS, MC_ALLOWED, MC_REJECTED }; /* how an entry's payload lists the mask */

typedef struct mc_entry {
  struct mc_entry *hnext;       /* hash chain */
  struct mc_entry *prev, *next; /* LRU list, most recent first */
  uint64_t hash;
  size_t bytes;    /* accounted: the whole block */
  uint32_t klen;   /* key bytes */
  uint32_t npay;   /* payload words (MC_BITS) or token ids */
  int32_t allowed; /* jsonschema_vocab_mask_with's return value */
  uint8_t form;
  uint64_t data[]; /* the payload (uint64_t words or int32_t ids), then the key */
} mc_entry;

struct jschema_mcache {
  pthread_mutex_t mu;
  int nv;
  size_t words, budget, bytes, nbucket;
  mc_entry **bucket;
  mc_entry *head, *tail;
  jschema_mcache_stats st;
};

int jsonschema_mcache_new(jschema_mcache **out, const jschema_vocab *v, size_t budget_bytes) {
  *out = NULL;
  jschema_mcache *c = calloc(1, sizeof *c);
  if (!c) return ANNA_ENOMEM;
  c->nv = v->nv;
  c->words = ((size_t)v->nv + 63) / 64;
  c->budget = budget_bytes;
  /* about one bucket per 2 KiB of budget (entries are 0.1-20 KB), 1024 .. 65536 */
  c->nbucket = 1024;
  while (c->nbucket < 65536 && c->nbucket * 2048 < budget_bytes)
    c->nbucket *= 2;
  c->bucket = calloc(c->nbucket, sizeof *c->bucket);
  if (!c->bucket) {
    free(c);
    return ANNA_ENOMEM;
  }
  pthread_mutex_init(&c->mu, NULL);
  *out = c;
  return 0;
}

void jsonschema_mcache_free(jschema_mcache *c) {
  if (!c) return;
  for (mc_entry *e = c->head, *n; e; e = n) {
    n = e->next;
    free(e);
  }
  free(c->bucket);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

void jsonschema_mcache_get_stats(jschema_mcache *c, jschema_mcache_stats *st) {
  pthread_mutex_lock(&c->mu);
  *st = c->st;
  st->bytes = c->bytes;
  pthread_mutex_unlock(&c->mu);
}

static uint64_t key_hash(const uint8_t *k, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ k[i]) * 1099511628211ull;
  return h ^ (h >> 29);
}

static const uint8_t *entry_key(const mc_entry *e) {
  return (const uint8_t *)e->data + (e->form == MC_BITS ? (size_t)e->npay * 8 : (size_t)e->npay * 4);
}

static void lru_unlink(jschema_mcache *c, mc_entry *e) {
  if (e->prev)
    e->prev->next = e->next;
  else
    c->head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    c->tail = e->prev;
}

static void lru_push(jschema_mcache *c, mc_entry *e) {
  e->prev = NULL;
  e->next = c->head;
  if (c->head) c->head->prev = e;
  c->head = e;
  if (!c->tail) c->tail = e;
}

/* The entry with this key, or NULL. Under mu. */
static mc_entry *mc_find(jschema_mcache *c, uint64_t h, const uint8_t *key, size_t klen) {
  for (mc_entry *e = c->bucket[h & (c->nbucket - 1)]; e; e = e->hnext)
    if (e->hash == h && e->klen == klen && !memcmp(entry_key(e), key, klen)) return e;
  return NULL;
}

static void mc_evict_tail(jschema_mcache *c) {
  mc_entry *e = c->tail;
  mc_entry **pp = &c->bucket[e->hash & (c->nbucket - 1)];
  while (*pp != e)
    pp = &(*pp)->hnext;
  *pp = e->hnext;
  lru_unlink(c, e);
  c->bytes -= e->bytes;
  c->st.entries--;
  c->st.evictions++;
  free(e);
}

/* bits := the entry's rejected tokens. */
static void mc_expand(const jschema_mcache *c, const mc_entry *e, uint64_t *bits) {
  const size_t W = c->words;
  if (e->form == MC_BITS) {
    memcpy(bits, e->data, W * 8);
    return;
  }
  const int32_t *ids = (const int32_t *)e->data;
  if (e->form == MC_REJECTED) {
    memset(bits, 0, W * 8);
    for (uint32_t k = 0; k < e->npay; k++)
      bits[ids[k] >> 6] |= (uint64_t)1 << (ids[k] & 63);
    return;
  }
  memset(bits, 0xff, W * 8);
  if (c->nv & 63) bits[W - 1] = ((uint64_t)1 << (c->nv & 63)) - 1;
  for (uint32_t k = 0; k < e->npay; k++)
    bits[ids[k] >> 6] &= ~((uint64_t)1 << (ids[k] & 63));
}

/* A new entry for bits (the shortest of the three forms), or NULL without memory. */
static mc_entry *mc_make(const jschema_mcache *c, const uint64_t *bits, int allowed, const uint8_t *key,
                         size_t klen, uint64_t h) {
  const size_t W = c->words;
  size_t nrej = 0;
  for (size_t k = 0; k < W; k++)
    nrej += (size_t)__builtin_popcountll(bits[k]);
  const size_t nacc = (size_t)c->nv - nrej;
  int form = MC_BITS;
  size_t npay = W, pbytes = W * 8;
  if (nacc * 4 < pbytes) form = MC_ALLOWED, npay = nacc, pbytes = nacc * 4;
  if (nrej * 4 < pbytes) form = MC_REJECTED, npay = nrej, pbytes = nrej * 4;
  const size_t bytes = sizeof(mc_entry) + pbytes + klen;
  mc_entry *e = malloc(bytes);
  if (!e) return NULL;
  e->hash = h;
  e->bytes = bytes;
  e->klen = (uint32_t)klen;
  e->npay = (uint32_t)npay;
  e->allowed = allowed;
  e->form = (uint8_t)form;
  if (form == MC_BITS) {
    memcpy(e->data, bits, W * 8);
  } else {
    int32_t *ids = (int32_t *)e->data;
    size_t n = 0;
    for (size_t k = 0; k < W; k++) {
      uint64_t m = form == MC_REJECTED ? bits[k] : ~bits[k];
      if (k == W - 1 && (c->nv & 63)) m &= ((uint64_t)1 << (c->nv & 63)) - 1;
      for (; m; m &= m - 1)
        ids[n++] = (int32_t)(k * 64 + (size_t)__builtin_ctzll(m));
    }
  }
  memcpy((uint8_t *)e->data + pbytes, key, klen);
  return e;
}

int jsonschema_mask_bits_cached(const jschema_vocab *v, jschema_mcache *c, jschema_scratch *sc,
                                const jschema_state *st, uint64_t *bits) {
  size_t klen = 0;
  uint64_t h = 0;
  if (c) {
    klen = state_key(st, sc->key);
    h = key_hash(sc->key, klen);
    pthread_mutex_lock(&c->mu);
    mc_entry *e = mc_find(c, h, sc->key, klen);
    if (e) {
      if (e != c->head) {
        lru_unlink(c, e);
        lru_push(c, e);
      }
      c->st.hits++;
      mc_expand(c, e, bits);
      const int allowed = e->allowed;
      pthread_mutex_unlock(&c->mu);
      return allowed;
    }
    c->st.misses++;
    pthread_mutex_unlock(&c->mu);
  }
  memset(sc->zrow, 0, (size_t)v->nv * sizeof *sc->zrow);
  const int allowed = jsonschema_vocab_mask_with(v, sc, st, sc->zrow);
  jsonschema_mask_bits(sc->zrow, v->nv, bits);
  if (!c) return allowed;
  /* Insert (built outside the lock); another thread may have put the same key in meanwhile:
   * its mask is the same, keep that one. An entry larger than the whole budget is not kept. */
  mc_entry *e = mc_make(c, bits, allowed, sc->key, klen, h);
  if (!e) return allowed; /* no memory: the mask is right, only not kept */
  pthread_mutex_lock(&c->mu);
  if (e->bytes > c->budget || mc_find(c, h, sc->key, klen)) {
    pthread_mutex_unlock(&c->mu);
    free(e);
    return allowed;
  }
  while (c->tail && c->bytes + e->bytes > c->budget)
    mc_evict_tail(c);
  mc_entry **b = &c->bucket[h & (c->nbucket - 1)];
  e->hnext = *b;
  *b = e;
  lru_push(c, e);
  c->bytes += e->bytes;
  c->st.entries++;
  c->st.inserts++;
  pthread_mutex_unlock(&c->mu);
  return allowed;
}
