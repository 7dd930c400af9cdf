/* jinja_value.c: arena, values, and their Python-compatible printing (str, repr, json.dumps). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "template/jinja_internal.h"

/* ---- arena ---- */
struct jarena_block {
  jarena_block *next;
  size_t cap, used;
  _Alignas(16) unsigned char mem[];
};

#define JARENA_BLOCK 65536

void *jarena_alloc(jarena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (n == 0) n = 16;
  if (a->failed) return NULL;
  if (a->limit && (n > a->limit || a->used_total > a->limit - n)) {
    a->failed = 2;
    return NULL;
  }
  jarena_block *b = a->head;
  if (!b || b->cap - b->used < n) {
    size_t cap = n > JARENA_BLOCK / 2 ? n : JARENA_BLOCK;
    b = malloc(sizeof(*b) + cap);
    if (!b) {
      a->failed = 1;
      return NULL;
    }
    b->cap = cap;
    b->used = 0;
    /* A big one-off allocation goes behind the current block so the current block's free
     * space stays usable. */
    if (a->head && cap != JARENA_BLOCK) {
      b->next = a->head->next;
      a->head->next = b;
    } else {
      b->next = a->head;
      a->head = b;
    }
  }
  void *p = b->mem + b->used;
  b->used += n;
  a->used_total += n;
  memset(p, 0, n);
  return p;
}

char *jarena_strndup(jarena *a, const char *s, size_t n) {
  char *p = jarena_alloc(a, n + 1);
  if (!p) return NULL;
  if (n) memcpy(p, s, n);
  p[n] = 0;
  return p;
}

void jarena_free_all(jarena *a) {
  jarena_block *b = a->head;
  while (b) {
    jarena_block *nx = b->next;
    free(b);
    b = nx;
  }
  a->head = NULL;
  a->used_total = 0;
}

/* ---- constructors ---- */
jstr *jstr_new(jarena *a, const char *s, size_t n) {
  jstr *r = jarena_alloc(a, sizeof(jstr) + n + 1);
  if (!r) return NULL;
  r->len = n;
  if (n) memcpy(r->s, s, n);
  r->s[n] = 0;
  return r;
}

jv jv_str(jarena *a, const char *s, size_t n) {
  jv v = {.t = JV_STR};
  v.u.s = jstr_new(a, s, n);
  if (!v.u.s) v.t = JV_UNDEF;
  return v;
}
jv jv_cstr(jarena *a, const char *s) { return jv_str(a, s, strlen(s)); }
jv jv_int(int64_t i) { return (jv){.t = JV_INT, .u.i = i}; }
jv jv_float(double f) { return (jv){.t = JV_FLOAT, .u.f = f}; }
jv jv_bool(int b) { return (jv){.t = JV_BOOL, .u.b = b ? 1 : 0}; }
jv jv_none(void) { return (jv){.t = JV_NONE}; }
jv jv_undef(void) { return (jv){.t = JV_UNDEF}; }

jlist *jlist_new(jarena *a, size_t cap) {
  jlist *l = jarena_alloc(a, sizeof(*l));
  if (!l) return NULL;
  if (cap) {
    l->items = jarena_alloc(a, cap * sizeof(jv));
    if (!l->items) return NULL;
    l->cap = cap;
  }
  return l;
}

int jlist_push(jarena *a, jlist *l, jv v) {
  if (l->n == l->cap) {
    size_t nc = l->cap ? l->cap * 2 : 4;
    jv *ni = jarena_alloc(a, nc * sizeof(jv));
    if (!ni) return -1;
    if (l->n) memcpy(ni, l->items, l->n * sizeof(jv));
    l->items = ni;
    l->cap = nc;
  }
  l->items[l->n++] = v;
  return 0;
}

jdict *jdict_new(jarena *a, size_t cap) {
  jdict *d = jarena_alloc(a, sizeof(*d));
  if (!d) return NULL;
  if (cap) {
    d->keys = jarena_alloc(a, cap * sizeof(jv));
    d->vals = jarena_alloc(a, cap * sizeof(jv));
    if (!d->keys || !d->vals) return NULL;
    d->cap = cap;
  }
  return d;
}

int jstr_eq(const jstr *a, const char *s, size_t n) {
  return a->len == n && (n == 0 || memcmp(a->s, s, n) == 0);
}

jv *jdict_get(const jdict *d, const char *key, size_t klen) {
  for (size_t i = 0; i < d->n; i++)
    if (d->keys[i].t == JV_STR && jstr_eq(d->keys[i].u.s, key, klen)) return &d->vals[i];
  return NULL;
}

jv *jdict_getv(const jdict *d, jv key) {
  if (key.t == JV_STR) return jdict_get(d, key.u.s->s, key.u.s->len);
  for (size_t i = 0; i < d->n; i++)
    if (jv_equal(d->keys[i], key)) return &d->vals[i];
  return NULL;
}

int jdict_set(jarena *a, jdict *d, jstr *key, jv v) {
  return jdict_setv(a, d, (jv){.t = JV_STR, .u.s = key}, v);
}

int jdict_setv(jarena *a, jdict *d, jv key, jv v) {
  jv *old = jdict_getv(d, key);
  if (old) {
    *old = v;
    return 0;
  }
  if (d->n == d->cap) {
    size_t nc = d->cap ? d->cap * 2 : 4;
    jv *nk = jarena_alloc(a, nc * sizeof(jv));
    jv *nv = jarena_alloc(a, nc * sizeof(jv));
    if (!nk || !nv) return -1;
    if (d->n) {
      memcpy(nk, d->keys, d->n * sizeof(jv));
      memcpy(nv, d->vals, d->n * sizeof(jv));
    }
    d->keys = nk;
    d->vals = nv;
    d->cap = nc;
  }
  d->keys[d->n] = key;
  d->vals[d->n] = v;
  d->n++;
  return 0;
}

/* ---- semantics ---- */
int jv_truthy(jv v) {
  switch (v.t) {
  case JV_UNDEF:
  case JV_NONE: return 0;
  case JV_BOOL: return v.u.b;
  case JV_INT: return v.u.i != 0;
  case JV_FLOAT: return v.u.f != 0.0;
  case JV_STR: return v.u.s->len != 0;
  case JV_LIST: return v.u.l->n != 0;
  case JV_DICT: return v.u.d->is_ns || v.u.d->n != 0;
  default: return 1;
  }
}

static int jv_is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double jv_num(jv v) {
  return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b;
}
static int64_t jv_inum(jv v) { return v.t == JV_INT ? v.u.i : v.u.b; }

static int equal_rec(jv a, jv b, int depth);
int jv_equal(jv a, jv b) { return equal_rec(a, b, 0); }

/* Depth-bounded: a list that contains itself (via append) must not recurse forever. */
static int equal_rec(jv a, jv b, int depth) {
  if (depth > 100) return 0;
  if (jv_is_num(a) && jv_is_num(b)) {
    if (a.t != JV_FLOAT && b.t != JV_FLOAT) return jv_inum(a) == jv_inum(b);
    return jv_num(a) == jv_num(b);
  }
  if (a.t != b.t) return 0;
  switch (a.t) {
  case JV_UNDEF:
  case JV_NONE: return 1;
  case JV_STR: return jstr_eq(a.u.s, b.u.s->s, b.u.s->len);
  case JV_LIST:
    if (a.u.l == b.u.l) return 1; /* identity first, as CPython does */
    if (a.u.l->is_tuple != b.u.l->is_tuple || a.u.l->n != b.u.l->n) return 0;
    for (size_t i = 0; i < a.u.l->n; i++)
      if (!equal_rec(a.u.l->items[i], b.u.l->items[i], depth + 1)) return 0;
    return 1;
  case JV_DICT:
    if (a.u.d == b.u.d) return 1;
    if (a.u.d->is_ns || b.u.d->is_ns || a.u.d->n != b.u.d->n) return 0;
    for (size_t i = 0; i < a.u.d->n; i++) {
      jv *o = jdict_getv(b.u.d, a.u.d->keys[i]);
      if (!o || !equal_rec(a.u.d->vals[i], *o, depth + 1)) return 0;
    }
    return 1;
  case JV_MACRO: return a.u.mac == b.u.mac;
  case JV_BUILTIN: return a.u.fn == b.u.fn;
  default: return 0;
  }
}

static int compare_rec(jv a, jv b, int *cmp, int depth);
int jv_compare(jv a, jv b, int *cmp) { return compare_rec(a, b, cmp, 0); }

static int compare_rec(jv a, jv b, int *cmp, int depth) {
  if (depth > 100) return -1;
  if (jv_is_num(a) && jv_is_num(b)) {
    if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
      int64_t x = jv_inum(a), y = jv_inum(b);
      *cmp = x < y ? -1 : x > y;
    } else {
      double x = jv_num(a), y = jv_num(b);
      *cmp = x < y ? -1 : x > y;
    }
    return 0;
  }
  if (a.t == JV_STR && b.t == JV_STR) {
    size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
    int c = n ? memcmp(a.u.s->s, b.u.s->s, n) : 0;
    if (c == 0) c = a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
    *cmp = c < 0 ? -1 : c > 0;
    return 0;
  }
  if (a.t == JV_LIST && b.t == JV_LIST) {
    size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
    for (size_t i = 0; i < n; i++) {
      if (jv_equal(a.u.l->items[i], b.u.l->items[i])) continue;
      return compare_rec(a.u.l->items[i], b.u.l->items[i], cmp, depth + 1);
    }
    *cmp = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    return 0;
  }
  return -1;
}

const char *jv_type_name(jv v) {
  switch (v.t) {
  case JV_UNDEF: return "Undefined";
  case JV_NONE: return "NoneType";
  case JV_BOOL: return "bool";
  case JV_INT: return "int";
  case JV_FLOAT: return "float";
  case JV_STR: return "str";
  case JV_LIST: return v.u.l->is_tuple ? "tuple" : "list";
  case JV_DICT: return v.u.d->is_ns ? "Namespace" : "dict";
  case JV_MACRO: return "Macro";
  default: return "function";
  }
}

/* ---- JSON input ---- */
jv jv_from_json(jarena *a, const json_t *j, int depth) {
  if (!j || depth > 512) return jv_none();
  switch (json_typeof(j)) {
  case JSON_OBJECT: {
    jdict *d = jdict_new(a, json_object_size(j));
    if (!d) return jv_undef();
    const char *k;
    json_t *v;
    /* jansson keeps insertion order when iterating with json_object_foreach (>= 2.8... order of
     * json_object_iter is insertion order in jansson >= 2.13 with ordered hashtable). */
    json_object_foreach((json_t *)j, k, v) {
      jstr *ks = jstr_new(a, k, strlen(k));
      if (!ks || jdict_set(a, d, ks, jv_from_json(a, v, depth + 1)) != 0) return jv_undef();
    }
    return (jv){.t = JV_DICT, .u.d = d};
  }
  case JSON_ARRAY: {
    jlist *l = jlist_new(a, json_array_size(j));
    if (!l) return jv_undef();
    for (size_t i = 0; i < json_array_size(j); i++)
      if (jlist_push(a, l, jv_from_json(a, json_array_get(j, i), depth + 1)) != 0) return jv_undef();
    return (jv){.t = JV_LIST, .u.l = l};
  }
  case JSON_STRING: return jv_str(a, json_string_value(j), json_string_length(j));
  case JSON_INTEGER: return jv_int(json_integer_value(j));
  case JSON_REAL: return jv_float(json_real_value(j));
  case JSON_TRUE: return jv_bool(1);
  case JSON_FALSE: return jv_bool(0);
  default: return jv_none();
  }
}

/* ---- buffer ---- */
void jbuf_put(jbuf *b, const char *s, size_t n) {
  if (b->failed || n == 0) return;
  if (b->limit && (n > b->limit || b->n > b->limit - n)) {
    b->failed = 2;
    return;
  }
  if (b->cap - b->n < n + 1) {
    size_t nc = b->cap ? b->cap : 256;
    while (nc - b->n < n + 1) nc *= 2;
    char *p = realloc(b->p, nc);
    if (!p) {
      b->failed = 1;
      return;
    }
    b->p = p;
    b->cap = nc;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}
void jbuf_puts(jbuf *b, const char *s) { jbuf_put(b, s, strlen(s)); }
void jbuf_free(jbuf *b) {
  free(b->p);
  b->p = NULL;
  b->n = b->cap = 0;
}

/* ---- printing ---- */
void jfloat_repr(char *out, size_t cap, double f) {
  if (isnan(f)) {
    snprintf(out, cap, "nan");
    return;
  }
  if (isinf(f)) {
    snprintf(out, cap, f < 0 ? "-inf" : "inf");
    return;
  }
  if (f == 0) {
    snprintf(out, cap, signbit(f) ? "-0.0" : "0.0");
    return;
  }
  /* Shortest digit string that round-trips, as Python's repr does. */
  char tmp[40];
  for (int p = 1; p <= 17; p++) {
    snprintf(tmp, sizeof(tmp), "%.*e", p - 1, f);
    if (strtod(tmp, NULL) == f) break;
  }
  /* tmp = [-]d[.ddd]e[+-]XX */
  char digits[24];
  size_t nd = 0;
  const char *q = tmp;
  int neg = 0;
  if (*q == '-') {
    neg = 1;
    q++;
  }
  for (; *q && *q != 'e'; q++)
    if (*q >= '0' && *q <= '9' && nd < sizeof(digits) - 1) digits[nd++] = *q;
  digits[nd] = 0;
  int exp10 = *q == 'e' ? atoi(q + 1) : 0;
  while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
  char res[64];
  size_t r = 0;
  if (neg) res[r++] = '-';
  if (exp10 >= -5 + 1 && exp10 < 16) {
    if (exp10 < 0) {
      res[r++] = '0';
      res[r++] = '.';
      for (int i = 0; i < -exp10 - 1; i++) res[r++] = '0';
      for (size_t i = 0; i < nd; i++) res[r++] = digits[i];
    } else {
      for (int i = 0; i <= exp10; i++) res[r++] = (size_t)i < nd ? digits[i] : '0';
      res[r++] = '.';
      if ((size_t)exp10 + 1 < nd)
        for (size_t i = (size_t)exp10 + 1; i < nd; i++) res[r++] = digits[i];
      else
        res[r++] = '0';
    }
    res[r] = 0;
  } else {
    res[r++] = digits[0];
    if (nd > 1) {
      res[r++] = '.';
      for (size_t i = 1; i < nd; i++) res[r++] = digits[i];
    }
    res[r] = 0;
    snprintf(res + r, sizeof(res) - r, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
  }
  snprintf(out, cap, "%s", res);
}

static void put_int(jbuf *b, int64_t i) {
  char t[32];
  snprintf(t, sizeof(t), "%lld", (long long)i);
  jbuf_puts(b, t);
}

static void put_float(jbuf *b, double f) {
  char t[64];
  jfloat_repr(t, sizeof(t), f);
  jbuf_puts(b, t);
}

static void put_hex_escape(jbuf *b, int32_t cp) {
  char t[16];
  if (cp <= 0xff)
    snprintf(t, sizeof(t), "\\x%02x", (unsigned)cp);
  else if (cp <= 0xffff)
    snprintf(t, sizeof(t), "\\u%04x", (unsigned)cp);
  else
    snprintf(t, sizeof(t), "\\U%08x", (unsigned)cp);
  jbuf_puts(b, t);
}

/* Python's str.isprintable for one code point (space counts as printable). */
static int cp_printable(int32_t cp) {
  if (cp == ' ') return 1;
  switch (utf8proc_category(cp)) {
  case UTF8PROC_CATEGORY_CC:
  case UTF8PROC_CATEGORY_CF:
  case UTF8PROC_CATEGORY_CS:
  case UTF8PROC_CATEGORY_CO:
  case UTF8PROC_CATEGORY_CN:
  case UTF8PROC_CATEGORY_ZL:
  case UTF8PROC_CATEGORY_ZP:
  case UTF8PROC_CATEGORY_ZS: return 0;
  default: return 1;
  }
}

static void repr_str(jbuf *b, const jstr *s) {
  int has_sq = memchr(s->s, '\'', s->len) != NULL, has_dq = memchr(s->s, '"', s->len) != NULL;
  char q = has_sq && !has_dq ? '"' : '\'';
  jbuf_put(b, &q, 1);
  size_t i = 0;
  while (i < s->len) {
    unsigned char c = (unsigned char)s->s[i];
    if (c < 0x80) {
      if (c == '\\') jbuf_puts(b, "\\\\");
      else if (c == (unsigned char)q) {
        jbuf_puts(b, q == '\'' ? "\\'" : "\\\"");
      } else if (c == '\n') jbuf_puts(b, "\\n");
      else if (c == '\r') jbuf_puts(b, "\\r");
      else if (c == '\t') jbuf_puts(b, "\\t");
      else if (c < 0x20 || c == 0x7f) put_hex_escape(b, c);
      else jbuf_put(b, (const char *)&c, 1);
      i++;
      continue;
    }
    utf8proc_int32_t cp;
    utf8proc_ssize_t k =
        utf8proc_iterate((const utf8proc_uint8_t *)s->s + i, (utf8proc_ssize_t)(s->len - i), &cp);
    if (k <= 0) {
      put_hex_escape(b, c); /* invalid byte: show it rather than stop */
      i++;
      continue;
    }
    if (cp_printable(cp))
      jbuf_put(b, s->s + i, (size_t)k);
    else
      put_hex_escape(b, cp);
    i += (size_t)k;
  }
  jbuf_put(b, &q, 1);
}

static void repr_rec(jbuf *b, jv v, int depth);
void jv_repr(jbuf *b, jv v) { repr_rec(b, v, 0); }

static void repr_rec(jbuf *b, jv v, int depth) {
  if (depth > 100 && (v.t == JV_LIST || v.t == JV_DICT)) { /* Python prints cycles as [...] */
    jbuf_puts(b, v.t == JV_LIST ? "[...]" : "{...}");
    return;
  }
  switch (v.t) {
  case JV_STR: repr_str(b, v.u.s); return;
  case JV_LIST: {
    jbuf_puts(b, v.u.l->is_tuple ? "(" : "[");
    for (size_t i = 0; i < v.u.l->n; i++) {
      if (i) jbuf_puts(b, ", ");
      repr_rec(b, v.u.l->items[i], depth + 1);
    }
    if (v.u.l->is_tuple && v.u.l->n == 1) jbuf_puts(b, ",");
    jbuf_puts(b, v.u.l->is_tuple ? ")" : "]");
    return;
  }
  case JV_DICT: {
    if (v.u.d->is_ns) jbuf_puts(b, "<Namespace ");
    jbuf_puts(b, "{");
    for (size_t i = 0; i < v.u.d->n; i++) {
      if (i) jbuf_puts(b, ", ");
      repr_rec(b, v.u.d->keys[i], depth + 1);
      jbuf_puts(b, ": ");
      repr_rec(b, v.u.d->vals[i], depth + 1);
    }
    jbuf_puts(b, "}");
    if (v.u.d->is_ns) jbuf_puts(b, ">");
    return;
  }
  case JV_UNDEF: jbuf_puts(b, "Undefined"); return;
  default: jv_print(b, v); return;
  }
}

void jv_print(jbuf *b, jv v) {
  switch (v.t) {
  case JV_UNDEF: return;
  case JV_NONE: jbuf_puts(b, "None"); return;
  case JV_BOOL: jbuf_puts(b, v.u.b ? "True" : "False"); return;
  case JV_INT: put_int(b, v.u.i); return;
  case JV_FLOAT: put_float(b, v.u.f); return;
  case JV_STR: jbuf_put(b, v.u.s->s, v.u.s->len); return;
  case JV_LIST:
  case JV_DICT: jv_repr(b, v); return;
  case JV_MACRO: jbuf_puts(b, "<Macro>"); return;
  case JV_BUILTIN: jbuf_puts(b, "<built-in function>"); return;
  case JV_METHOD: jbuf_puts(b, "<built-in method>"); return;
  }
}

static void json_str(jbuf *b, const char *s, size_t n, int ascii) {
  jbuf_puts(b, "\"");
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    const char *esc = NULL;
    char t[8];
    switch (c) {
    case '"': esc = "\\\""; break;
    case '\\': esc = "\\\\"; break;
    case '\n': esc = "\\n"; break;
    case '\r': esc = "\\r"; break;
    case '\t': esc = "\\t"; break;
    case '\b': esc = "\\b"; break;
    case '\f': esc = "\\f"; break;
    default:
      if (c < 0x20) {
        snprintf(t, sizeof(t), "\\u%04x", c);
        esc = t;
      } else if (c >= 0x80 && ascii) { /* ensure_ascii: \uXXXX, surrogate pairs above BMP */
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) {
          cp = 0xFFFD;
          k = 1;
        }
        jbuf_put(b, s + run, i - run);
        char u[16];
        if (cp >= 0x10000) {
          snprintf(u, sizeof(u), "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
        } else
          snprintf(u, sizeof(u), "\\u%04x", (unsigned)cp);
        jbuf_puts(b, u);
        i += (size_t)k - 1;
        run = i + 1;
        continue;
      }
    }
    if (esc) {
      jbuf_put(b, s + run, i - run);
      jbuf_puts(b, esc);
      run = i + 1;
    }
  }
  jbuf_put(b, s + run, n - run);
  jbuf_puts(b, "\"");
}

static void json_newline(jbuf *b, int indent, int level) {
  jbuf_puts(b, "\n");
  for (int i = 0; i < indent * level; i++) jbuf_puts(b, " ");
}

static int tojson_rec(jbuf *b, jv v, int indent, const char *isep, const char *ksep, int sort,
                      int level, const char **msg) {
  if (level > 256) {
    *msg = "nesting too deep for tojson";
    return -1;
  }
  switch (v.t) {
  case JV_NONE: jbuf_puts(b, "null"); return 0;
  case JV_BOOL: jbuf_puts(b, v.u.b ? "true" : "false"); return 0;
  case JV_INT: put_int(b, v.u.i); return 0;
  case JV_FLOAT:
    if (isnan(v.u.f)) jbuf_puts(b, "NaN");
    else if (isinf(v.u.f)) jbuf_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
    else put_float(b, v.u.f);
    return 0;
  case JV_STR: json_str(b, v.u.s->s, v.u.s->len, sort & JTOJSON_ASCII); return 0;
  case JV_LIST: {
    if (v.u.l->n == 0) {
      jbuf_puts(b, "[]");
      return 0;
    }
    jbuf_puts(b, "[");
    for (size_t i = 0; i < v.u.l->n; i++) {
      if (i) jbuf_puts(b, isep);
      if (indent >= 0) json_newline(b, indent, level + 1);
      if (tojson_rec(b, v.u.l->items[i], indent, isep, ksep, sort, level + 1, msg)) return -1;
    }
    if (indent >= 0) json_newline(b, indent, level);
    jbuf_puts(b, "]");
    return 0;
  }
  case JV_DICT: {
    jdict *d = v.u.d;
    if (d->is_ns) {
      *msg = "Object of type Namespace is not JSON serializable";
      return -1;
    }
    if (d->n == 0) {
      jbuf_puts(b, "{}");
      return 0;
    }
    size_t order_stack[64];
    size_t *order = d->n <= 64 ? order_stack : malloc(d->n * sizeof(size_t));
    if (!order) {
      *msg = "out of memory";
      return -1;
    }
    for (size_t i = 0; i < d->n; i++) order[i] = i;
    if (sort & JTOJSON_SORT_KEYS) /* insertion sort: dicts in templates are small */
      for (size_t i = 1; i < d->n; i++) {
        size_t k = order[i], j = i;
        while (j > 0) {
          int c;
          if (jv_compare(d->keys[order[j - 1]], d->keys[k], &c)) c = 0;
          if (c <= 0) break;
          order[j] = order[j - 1];
          j--;
        }
        order[j] = k;
      }
    jbuf_puts(b, "{");
    int rc = 0;
    for (size_t i = 0; i < d->n && rc == 0; i++) {
      if (i) jbuf_puts(b, isep);
      if (indent >= 0) json_newline(b, indent, level + 1);
      jv key = d->keys[order[i]];
      if (key.t == JV_STR) json_str(b, key.u.s->s, key.u.s->len, sort & JTOJSON_ASCII);
      else if (key.t == JV_NONE) jbuf_puts(b, "\"null\"");
      else if (key.t == JV_BOOL) jbuf_puts(b, key.u.b ? "\"true\"" : "\"false\"");
      else if (key.t == JV_INT || key.t == JV_FLOAT) {
        jbuf_puts(b, "\"");
        jv_print(b, key);
        jbuf_puts(b, "\"");
      } else {
        rc = -1;
        *msg = "keys must be str, int, float, bool or None";
        break;
      }
      jbuf_puts(b, ksep);
      rc = tojson_rec(b, d->vals[order[i]], indent, isep, ksep, sort, level + 1, msg);
    }
    if (order != order_stack) free(order);
    if (rc) return rc;
    if (indent >= 0) json_newline(b, indent, level);
    jbuf_puts(b, "}");
    return 0;
  }
  case JV_UNDEF: *msg = "Object of type Undefined is not JSON serializable"; return -1;
  default: *msg = "Object of this type is not JSON serializable"; return -1;
  }
}

int jv_tojson(jbuf *b, jv v, int indent, const char *item_sep, const char *key_sep, int flags,
              int depth, const char **msg) {
  if (!item_sep) item_sep = indent >= 0 ? "," : ", ";
  if (!key_sep) key_sep = ": ";
  return tojson_rec(b, v, indent, item_sep, key_sep, flags, depth, msg);
}

/* ---- UTF-8 ---- */
size_t jutf8_len(const char *s, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++)
    if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
  return c;
}

size_t jutf8_offset(const char *s, size_t n, size_t cp) {
  size_t c = 0, i = 0;
  for (; i < n; i++) {
    if (((unsigned char)s[i] & 0xC0) != 0x80) {
      if (c == cp) return i;
      c++;
    }
  }
  return n;
}
