/* jinja_builtins.c: filters, tests, global functions and Python methods of str/dict/list.
 *
 * Behaviour mirrors jinja2 3.1 and CPython (what a chat template observes when transformers
 * renders it), including transformers' own tojson (json.dumps with ensure_ascii=False).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "base/error.h"
#include "template/jinja_internal.h"

enum {
  G_RANGE,
  G_NAMESPACE,
  G_DICT,
  G_RAISE,
  G_STRFTIME,
  G_LIST,
  G_COUNT,
};
static const char *const global_names[G_COUNT] = {"range", "namespace", "dict", "raise_exception",
                                                  "strftime_now", "list"};

int jinja_global_id(const char *name, size_t n) {
  for (int i = 0; i < G_COUNT; i++)
    if (strlen(global_names[i]) == n && memcmp(global_names[i], name, n) == 0) return i;
  return -1;
}

static const char *const filter_names[] = {
    "tojson", "trim", "upper", "lower", "length", "count", "join", "default", "d", "first",
    "last", "list", "items", "string", "replace", "safe", "map", "selectattr", "rejectattr",
    "select", "reject", "unique", "capitalize", "title", "int", "float", "abs", "round",
    "indent", "wordcount", "sort", "reverse", "dictsort", "e", "escape", "sum", "min", "max",
    "attr", "format", "batch", "center", "truncate", "bool", "forceescape", "striptags", NULL};
static const char *const test_names[] = {
    "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number",
    "integer", "float", "boolean", "true", "false", "odd", "even", "divisibleby", "equalto",
    "eq", "==", "ne", "!=", "lt", "<", "le", "<=", "gt", ">", "ge", ">=", "in", "callable",
    "lower", "upper", "sameas", "filter", "test", "escaped", NULL};

static int name_in(const char *const *list, const char *name, size_t n) {
  for (; *list; list++)
    if (strlen(*list) == n && memcmp(*list, name, n) == 0) return 1;
  return 0;
}
int jinja_filter_known(const char *name, size_t n) { return name_in(filter_names, name, n); }
int jinja_test_known(const char *name, size_t n) { return name_in(test_names, name, n); }

/* ---- helpers ---- */
static jv mkstr(jctx *c, const char *s, size_t n) {
  jv v = jv_str(&c->a, s, n);
  if (v.t != JV_STR) jctx_nomem(c);
  return v;
}
static int ret_str(jctx *c, const char *s, size_t n, jv *out) {
  *out = mkstr(c, s, n);
  return out->t == JV_STR ? 0 : ANNA_ENOMEM;
}
static int ret_buf(jctx *c, jbuf *b, jv *out) {
  int rc;
  if (b->failed == 2) rc = jctx_err(c, ANNA_ERANGE, "render output limit exceeded");
  else if (b->failed) rc = jctx_nomem(c);
  else rc = ret_str(c, b->p ? b->p : "", b->n, out);
  jbuf_free(b);
  return rc;
}
static jv mklist(jlist *l) { return (jv){.t = JV_LIST, .u.l = l}; }
static int is_intlike(jv v) { return v.t == JV_INT || v.t == JV_BOOL; }
static int64_t ival(jv v) { return v.t == JV_INT ? v.u.i : v.t == JV_BOOL ? v.u.b : (int64_t)v.u.f; }

/* Argument as a string or an error naming it. */
static int arg_str(jctx *c, const jargs *a, size_t idx, const char *name, const char *what,
                   jstr **out, int required) {
  int found;
  jv v = jargs_get(a, idx, name, &found);
  if (!found || v.t == JV_NONE) {
    *out = NULL;
    if (required) return jctx_err(c, ANNA_EINVAL, "%s: missing argument '%s'", what, name ? name : "?");
    return 0;
  }
  if (v.t != JV_STR) return jctx_err(c, ANNA_EINVAL, "%s: argument '%s' must be a string", what, name ? name : "?");
  *out = v.u.s;
  return 0;
}

static int cp_isspace(int32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85) return 1;
  if (cp < 0x80) return 0;
  utf8proc_category_t cat = utf8proc_category(cp);
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

/* Decodes one code point at s[i]; invalid bytes decode as themselves (length 1). */
static size_t dec(const char *s, size_t n, size_t i, int32_t *cp) {
  utf8proc_int32_t c;
  utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
  if (k <= 0) {
    *cp = (unsigned char)s[i];
    return 1;
  }
  *cp = c;
  return (size_t)k;
}

static void put_cp(jbuf *b, int32_t cp) {
  utf8proc_uint8_t t[4];
  utf8proc_ssize_t k = utf8proc_encode_char(cp, t);
  if (k > 0) jbuf_put(b, (const char *)t, (size_t)k);
}

/* Is cp in the strip set (NULL = whitespace)? */
static int in_set(int32_t cp, const jstr *chars) {
  if (!chars) return cp_isspace(cp);
  for (size_t i = 0; i < chars->len;) {
    int32_t x;
    i += dec(chars->s, chars->len, i, &x);
    if (x == cp) return 1;
  }
  return 0;
}

static int do_strip(jctx *c, const jstr *s, const jstr *chars, int left, int right, jv *out) {
  size_t b = 0, e = s->len;
  if (left)
    while (b < e) {
      int32_t cp;
      size_t k = dec(s->s, e, b, &cp);
      if (!in_set(cp, chars)) break;
      b += k;
    }
  if (right)
    while (e > b) {
      size_t st = e - 1;
      while (st > b && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
      int32_t cp;
      dec(s->s, e, st, &cp);
      if (!in_set(cp, chars)) break;
      e = st;
    }
  return ret_str(c, s->s + b, e - b, out);
}

/* mode 0 lower, 1 upper, 2 title (Python str.title), 3 capitalize, 4 jinja's title filter
 * (words start after '-', whitespace or an opening bracket, not after any non-letter). */
static int do_case(jctx *c, const jstr *s, int mode, jv *out) {
  jbuf b = {.limit = c->lim.max_output};
  int prev_cased = 0, first = 1;
  for (size_t i = 0; i < s->len;) {
    int32_t cp;
    i += dec(s->s, s->len, i, &cp);
    int32_t r = cp;
    if (mode == 0) r = utf8proc_tolower(cp);
    else if (mode == 1) r = utf8proc_toupper(cp);
    else if (mode == 4) {
      r = prev_cased ? utf8proc_tolower(cp) : utf8proc_toupper(cp);
      prev_cased = !(cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || cp_isspace(cp));
    } else if (mode == 2) {
      r = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
      utf8proc_category_t cat = utf8proc_category(cp);
      prev_cased = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
    } else
      r = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
    first = 0;
    put_cp(&b, r);
  }
  return ret_buf(c, &b, out);
}

static int do_replace(jctx *c, const jstr *s, const jstr *old, const jstr *nw, int64_t count, jv *out) {
  jbuf b = {.limit = c->lim.max_output};
  if (old->len == 0) { /* Python inserts between every character */
    int64_t done = 0;
    for (size_t i = 0; i <= s->len;) {
      if (count < 0 || done < count) {
        jbuf_put(&b, nw->s, nw->len);
        done++;
      }
      if (i == s->len) break;
      int32_t cp;
      size_t k = dec(s->s, s->len, i, &cp);
      jbuf_put(&b, s->s + i, k);
      i += k;
    }
    return ret_buf(c, &b, out);
  }
  size_t i = 0;
  int64_t done = 0;
  while (i < s->len) {
    const char *f = (count < 0 || done < count) ? memmem(s->s + i, s->len - i, old->s, old->len) : NULL;
    if (!f) break;
    size_t at = (size_t)(f - s->s);
    jbuf_put(&b, s->s + i, at - i);
    jbuf_put(&b, nw->s, nw->len);
    i = at + old->len;
    done++;
  }
  jbuf_put(&b, s->s + i, s->len - i);
  return ret_buf(c, &b, out);
}

static int push(jctx *c, jlist *l, jv v) { return jlist_push(&c->a, l, v) ? jctx_nomem(c) : 0; }

static int do_split(jctx *c, const jstr *s, const jstr *sep, int64_t maxsplit, jv *out) {
  jlist *l = jlist_new(&c->a, 0);
  if (!l) return jctx_nomem(c);
  int rc = 0;
  if (!sep) {
    size_t i = 0;
    int64_t splits = 0;
    while (i < s->len && !rc) {
      int32_t cp;
      size_t k;
      while (i < s->len && (k = dec(s->s, s->len, i, &cp), cp_isspace(cp))) i += k;
      if (i >= s->len) break;
      size_t st = i;
      if (maxsplit >= 0 && splits >= maxsplit) {
        size_t e = s->len; /* rest, right-stripped */
        while (e > st) {
          size_t p0 = e - 1;
          while (p0 > st && ((unsigned char)s->s[p0] & 0xC0) == 0x80) p0--;
          dec(s->s, e, p0, &cp);
          if (!cp_isspace(cp)) break;
          e = p0;
        }
        jv v = mkstr(c, s->s + st, e - st);
        rc = v.t == JV_STR ? push(c, l, v) : ANNA_ENOMEM;
        break;
      }
      while (i < s->len && (k = dec(s->s, s->len, i, &cp), !cp_isspace(cp))) i += k;
      jv v = mkstr(c, s->s + st, i - st);
      rc = v.t == JV_STR ? push(c, l, v) : ANNA_ENOMEM;
      splits++;
    }
  } else {
    if (sep->len == 0) return jctx_err(c, ANNA_EINVAL, "empty separator");
    size_t i = 0;
    int64_t splits = 0;
    for (;;) {
      const char *f = (maxsplit < 0 || splits < maxsplit) ? memmem(s->s + i, s->len - i, sep->s, sep->len) : NULL;
      size_t e = f ? (size_t)(f - s->s) : s->len;
      jv v = mkstr(c, s->s + i, e - i);
      if (v.t != JV_STR || (rc = push(c, l, v))) return rc ? rc : ANNA_ENOMEM;
      if (!f) break;
      i = e + sep->len;
      splits++;
    }
  }
  if (rc) return rc;
  *out = mklist(l);
  return 0;
}

static int do_rsplit(jctx *c, const jstr *s, const jstr *sep, int64_t maxsplit, jv *out) {
  if (!sep || maxsplit < 0) return do_split(c, s, sep, maxsplit, out);
  if (sep->len == 0) return jctx_err(c, ANNA_EINVAL, "empty separator");
  /* collect from the right, then reverse */
  jlist *l = jlist_new(&c->a, 0);
  if (!l) return jctx_nomem(c);
  size_t e = s->len;
  int64_t splits = 0;
  for (;;) {
    size_t found = (size_t)-1;
    if (splits < maxsplit && e >= sep->len)
      for (size_t k = e - sep->len + 1; k-- > 0;)
        if (memcmp(s->s + k, sep->s, sep->len) == 0) {
          found = k;
          break;
        }
    size_t st = found == (size_t)-1 ? 0 : found + sep->len;
    jv v = mkstr(c, s->s + st, e - st);
    if (v.t != JV_STR) return ANNA_ENOMEM;
    int rc = push(c, l, v);
    if (rc) return rc;
    if (found == (size_t)-1) break;
    e = found;
    splits++;
  }
  for (size_t i = 0; i < l->n / 2; i++) {
    jv t = l->items[i];
    l->items[i] = l->items[l->n - 1 - i];
    l->items[l->n - 1 - i] = t;
  }
  *out = mklist(l);
  return 0;
}

static int prefix_match(const jstr *s, jv p, int suffix, int *res) {
  if (p.t == JV_STR) {
    const jstr *x = p.u.s;
    *res = x->len <= s->len && memcmp(suffix ? s->s + s->len - x->len : s->s, x->s, x->len) == 0;
    return 0;
  }
  if (p.t == JV_LIST && p.u.l->is_tuple) {
    *res = 0;
    for (size_t i = 0; i < p.u.l->n && !*res; i++)
      if (prefix_match(s, p.u.l->items[i], suffix, res)) return -1;
    return 0;
  }
  return -1;
}

/* Python str.format with {} / {0} / {name} fields (no format specs beyond plain text). */
static int do_format_braces(jctx *c, const jstr *f, const jargs *a, jv *out) {
  jbuf b = {.limit = c->lim.max_output};
  size_t auto_idx = 0;
  for (size_t i = 0; i < f->len; i++) {
    char ch = f->s[i];
    if (ch == '{' && i + 1 < f->len && f->s[i + 1] == '{') {
      jbuf_put(&b, "{", 1);
      i++;
      continue;
    }
    if (ch == '}' && i + 1 < f->len && f->s[i + 1] == '}') {
      jbuf_put(&b, "}", 1);
      i++;
      continue;
    }
    if (ch != '{') {
      jbuf_put(&b, &ch, 1);
      continue;
    }
    const char *close = memchr(f->s + i, '}', f->len - i);
    if (!close) {
      jbuf_free(&b);
      return jctx_err(c, ANNA_EINVAL, "format: single '{' encountered in format string");
    }
    size_t fl = (size_t)(close - (f->s + i + 1));
    const char *field = f->s + i + 1;
    size_t nl = 0;
    while (nl < fl && field[nl] != ':' && field[nl] != '!') nl++;
    jv v;
    int found = 0;
    if (nl == 0) v = jargs_get(a, auto_idx++, NULL, &found);
    else if (field[0] >= '0' && field[0] <= '9') v = jargs_get(a, (size_t)atoi(field), NULL, &found);
    else {
      for (size_t k = 0; k < a->nkw && !found; k++)
        if (jstr_eq(a->kwn[k], field, nl)) {
          v = a->kwv[k];
          found = 1;
        }
    }
    if (!found) {
      jbuf_free(&b);
      return jctx_err(c, ANNA_EINVAL, "format: missing argument for field '%.*s'", (int)fl, field);
    }
    if (nl < fl && field[nl] == '!' && nl + 1 < fl && field[nl + 1] == 'r') jv_repr(&b, v);
    else jv_print(&b, v);
    i += fl + 1;
  }
  return ret_buf(c, &b, out);
}

/* printf-style formatting for the `format` filter and `%`: %s %d %i %f %r %% (with flags). */
static int do_format_percent(jctx *c, const jstr *f, const jargs *a, jv *out) {
  jbuf b = {.limit = c->lim.max_output};
  size_t ai = 0;
  for (size_t i = 0; i < f->len; i++) {
    if (f->s[i] != '%') {
      jbuf_put(&b, f->s + i, 1);
      continue;
    }
    size_t st = i++;
    while (i < f->len && strchr("-+ #0123456789.", f->s[i])) i++;
    if (i >= f->len) break;
    char conv = f->s[i];
    if (conv == '%') {
      jbuf_put(&b, "%", 1);
      continue;
    }
    int found;
    jv v = jargs_get(a, ai++, NULL, &found);
    if (!found) {
      jbuf_free(&b);
      return jctx_err(c, ANNA_EINVAL, "not enough arguments for format string");
    }
    /* Rebuild the spec from parsed parts so that a template cannot hand snprintf an
     * unbounded width or precision. */
    char flags[8];
    size_t nf = 0;
    const char *q0 = f->s + st + 1;
    while (*q0 == '-' || *q0 == '+' || *q0 == ' ' || *q0 == '#' || *q0 == '0') {
      if (nf < sizeof(flags) - 1 && !memchr(flags, *q0, nf)) flags[nf++] = *q0;
      q0++;
    }
    flags[nf] = 0;
    long w0 = 0, p0 = -1;
    while (*q0 >= '0' && *q0 <= '9') w0 = w0 < 1000 ? w0 * 10 + (*q0++ - '0') : (q0++, w0);
    if (*q0 == '.') {
      p0 = 0;
      q0++;
      while (*q0 >= '0' && *q0 <= '9') p0 = p0 < 1000 ? p0 * 10 + (*q0++ - '0') : (q0++, p0);
    }
    if (w0 > 256) w0 = 256;
    if (p0 > 100) p0 = 100;
    char spec[48];
    char tmp[512];
    if (conv == 'd' || conv == 'i') {
      if (p0 >= 0) snprintf(spec, sizeof(spec), "%%%s%ld.%ldlld", flags, w0, p0);
      else snprintf(spec, sizeof(spec), "%%%s%ldlld", flags, w0);
      snprintf(tmp, sizeof(tmp), spec, (long long)(v.t == JV_FLOAT ? (int64_t)v.u.f : ival(v)));
      jbuf_puts(&b, tmp);
    } else if (conv == 'f' || conv == 'e' || conv == 'g' || conv == 'F' || conv == 'E' || conv == 'G') {
      if (p0 >= 0) snprintf(spec, sizeof(spec), "%%%s%ld.%ld%c", flags, w0, p0, conv);
      else snprintf(spec, sizeof(spec), "%%%s%ld%c", flags, w0, conv);
      double d = v.t == JV_FLOAT ? v.u.f : (double)ival(v);
      snprintf(tmp, sizeof(tmp), spec, d);
      jbuf_puts(&b, tmp);
    } else { /* %s / %r with optional '-', width and .precision (code points) */
      jbuf t = {.limit = c->lim.max_output};
      if (conv == 'r') jv_repr(&t, v);
      else jv_print(&t, v);
      const char *q = f->s + st + 1;
      int left = 0;
      while (*q == '-' || *q == '+' || *q == ' ' || *q == '#' || *q == '0') left |= *q++ == '-';
      long width = strtol(q, (char **)&q, 10);
      long prec = *q == '.' ? strtol(q + 1, NULL, 10) : -1;
      size_t tl = t.n;
      if (prec >= 0 && (size_t)prec < jutf8_len(t.p ? t.p : "", t.n)) tl = jutf8_offset(t.p, t.n, (size_t)prec);
      long pad = width - (long)jutf8_len(t.p ? t.p : "", tl);
      if (width > 4096) pad = 0;
      for (long k = 0; !left && k < pad; k++) jbuf_put(&b, " ", 1);
      jbuf_put(&b, t.p ? t.p : "", tl);
      for (long k = 0; left && k < pad; k++) jbuf_put(&b, " ", 1);
      jbuf_free(&t);
    }
  }
  return ret_buf(c, &b, out);
}

jv jinja_getattr(jctx *c, jv obj, const char *name, size_t n) {
  static const char *const dict_methods[] = {"items", "keys", "values", "get", "copy", NULL};
  static const char *const str_methods[] = {
      "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper",
      "lower", "replace", "title", "capitalize", "format", "join", "find", "rfind", "count",
      "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper",
      "removeprefix", "removesuffix", "index", NULL};
  static const char *const list_methods[] = {"append", "index", "count", "pop", "copy", NULL};
  const char *const *methods = NULL;
  switch (obj.t) {
  case JV_DICT:
    if (!obj.u.d->is_ns && name_in(dict_methods, name, n)) methods = dict_methods;
    else {
      jv *v = jdict_get(obj.u.d, name, n);
      return v ? *v : jv_undef();
    }
    break;
  case JV_STR: methods = str_methods; break;
  case JV_LIST: methods = obj.u.l->is_tuple ? NULL : list_methods; break;
  default: return jv_undef();
  }
  for (const char *const *m = methods; m && *m; m++)
    if (strlen(*m) == n && memcmp(*m, name, n) == 0) {
      jmethod *jm = jarena_alloc(&c->a, sizeof(*jm));
      if (!jm) {
        jctx_nomem(c);
        return jv_undef();
      }
      jm->self = obj;
      jm->name = *m;
      return (jv){.t = JV_METHOD, .u.m = jm};
    }
  return jv_undef();
}

jv jinja_getitem(jctx *c, jv obj, jv key) {
  switch (obj.t) {
  case JV_DICT: {
    jv *v = jdict_getv(obj.u.d, key);
    return v ? *v : jv_undef();
  }
  case JV_LIST:
    if (is_intlike(key)) {
      int64_t i = ival(key), n = (int64_t)obj.u.l->n;
      if (i < 0) i += n;
      return i >= 0 && i < n ? obj.u.l->items[i] : jv_undef();
    }
    return jv_undef();
  case JV_STR:
    if (is_intlike(key)) {
      int64_t i = ival(key), n = (int64_t)jutf8_len(obj.u.s->s, obj.u.s->len);
      if (i < 0) i += n;
      if (i < 0 || i >= n) return jv_undef();
      size_t off = jutf8_offset(obj.u.s->s, obj.u.s->len, (size_t)i);
      size_t end = jutf8_offset(obj.u.s->s, obj.u.s->len, (size_t)i + 1);
      return mkstr(c, obj.u.s->s + off, end - off);
    }
    return jv_undef();
  default: return jv_undef();
  }
}

/* ---- methods ---- */
int jinja_call_method(jctx *c, jv self, const char *name, const jargs *a, jv *out) {
  int rc, found;
  if ((rc = jctx_charge(c, self))) return rc;
  if (self.t == JV_DICT) {
    jdict *d = self.u.d;
    if (!strcmp(name, "items") || !strcmp(name, "keys") || !strcmp(name, "values")) {
      jlist *l = jlist_new(&c->a, d->n);
      if (!l) return jctx_nomem(c);
      for (size_t i = 0; i < d->n; i++) {
        jv k = d->keys[i];
        if (name[0] == 'k') l->items[l->n++] = k;
        else if (name[0] == 'v') l->items[l->n++] = d->vals[i];
        else {
          jlist *t = jlist_new(&c->a, 2);
          if (!t) return jctx_nomem(c);
          t->is_tuple = 1;
          t->items[0] = k;
          t->items[1] = d->vals[i];
          t->n = 2;
          l->items[l->n++] = mklist(t);
        }
      }
      *out = mklist(l);
      return 0;
    }
    if (!strcmp(name, "get")) {
      jv k = jargs_get(a, 0, NULL, &found);
      if (!found) return jctx_err(c, ANNA_EINVAL, "get expected at least 1 argument");
      jv def = jargs_get(a, 1, NULL, &found);
      if (!found) def = jv_none();
      jv *v = jdict_getv(d, k);
      *out = v ? *v : def;
      return 0;
    }
    if (!strcmp(name, "cycle")) { /* loop.cycle(a, b, ...) */
      jv *i0 = jdict_get(d, "index0", 6);
      if (!a->npos || !i0 || i0->t != JV_INT) return jctx_err(c, ANNA_EINVAL, "cycle: no items");
      *out = a->pos[(size_t)i0->u.i % a->npos];
      return 0;
    }
    if (!strcmp(name, "copy")) {
      jdict *nd = jdict_new(&c->a, d->n);
      if (!nd) return jctx_nomem(c);
      for (size_t i = 0; i < d->n; i++)
        if (jdict_setv(&c->a, nd, d->keys[i], d->vals[i])) return jctx_nomem(c);
      *out = (jv){.t = JV_DICT, .u.d = nd};
      return 0;
    }
  }
  if (self.t == JV_LIST) {
    jlist *l = self.u.l;
    if (!strcmp(name, "append")) {
      jv v = jargs_get(a, 0, NULL, &found);
      if (!found) return jctx_err(c, ANNA_EINVAL, "append() takes exactly one argument");
      if ((rc = push(c, l, v))) return rc;
      *out = jv_none();
      return 0;
    }
    if (!strcmp(name, "pop")) {
      if (!l->n) return jctx_err(c, ANNA_EINVAL, "pop from empty list");
      jv iv = jargs_get(a, 0, NULL, &found);
      int64_t i = found ? ival(iv) : (int64_t)l->n - 1;
      if (i < 0) i += (int64_t)l->n;
      if (i < 0 || i >= (int64_t)l->n) return jctx_err(c, ANNA_EINVAL, "pop index out of range");
      *out = l->items[i];
      memmove(l->items + i, l->items + i + 1, (l->n - (size_t)i - 1) * sizeof(jv));
      l->n--;
      return 0;
    }
    if (!strcmp(name, "index") || !strcmp(name, "count")) {
      jv v = jargs_get(a, 0, NULL, &found);
      int64_t cnt = 0;
      for (size_t i = 0; i < l->n; i++)
        if (jv_equal(l->items[i], v)) {
          if (name[0] == 'i') {
            *out = jv_int((int64_t)i);
            return 0;
          }
          cnt++;
        }
      if (name[0] == 'i') return jctx_err(c, ANNA_EINVAL, "value is not in list");
      *out = jv_int(cnt);
      return 0;
    }
    if (!strcmp(name, "copy")) {
      jlist *nl = jlist_new(&c->a, l->n);
      if (!nl) return jctx_nomem(c);
      memcpy(nl->items, l->items, l->n * sizeof(jv));
      nl->n = l->n;
      *out = mklist(nl);
      return 0;
    }
  }
  if (self.t == JV_STR) {
    const jstr *s = self.u.s;
    jstr *x = NULL, *y = NULL;
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
      if ((rc = arg_str(c, a, 0, "chars", name, &x, 0))) return rc;
      return do_strip(c, s, x, name[0] != 'r', name[0] != 'l', out);
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
      if ((rc = arg_str(c, a, 0, "sep", name, &x, 0))) return rc;
      jv ms = jargs_get(a, 1, "maxsplit", &found);
      int64_t maxsplit = found && is_intlike(ms) ? ival(ms) : -1;
      return name[0] == 'r' ? do_rsplit(c, s, x, maxsplit, out) : do_split(c, s, x, maxsplit, out);
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
      jv p = jargs_get(a, 0, NULL, &found);
      int r;
      if (!found || prefix_match(s, p, name[0] == 'e', &r))
        return jctx_err(c, ANNA_EINVAL, "%s first arg must be str or a tuple of str", name);
      *out = jv_bool(r);
      return 0;
    }
    if (!strcmp(name, "upper")) return do_case(c, s, 1, out);
    if (!strcmp(name, "lower")) return do_case(c, s, 0, out);
    if (!strcmp(name, "title")) return do_case(c, s, 2, out);
    if (!strcmp(name, "capitalize")) return do_case(c, s, 3, out);
    if (!strcmp(name, "replace")) {
      if ((rc = arg_str(c, a, 0, "old", name, &x, 1)) || (rc = arg_str(c, a, 1, "new", name, &y, 1))) return rc;
      jv cnt = jargs_get(a, 2, "count", &found);
      return do_replace(c, s, x, y, found && is_intlike(cnt) ? ival(cnt) : -1, out);
    }
    if (!strcmp(name, "format")) return do_format_braces(c, s, a, out);
    if (!strcmp(name, "join")) {
      jv it = jargs_get(a, 0, NULL, &found);
      jlist *l;
      if ((rc = jinja_to_list(c, it, &l))) return rc;
      jbuf b = {.limit = c->lim.max_output};
      for (size_t i = 0; i < l->n; i++) {
        if (i) jbuf_put(&b, s->s, s->len);
        if (l->items[i].t != JV_STR) {
          jbuf_free(&b);
          return jctx_err(c, ANNA_EINVAL, "sequence item %zu: expected str instance", i);
        }
        jv_print(&b, l->items[i]);
      }
      return ret_buf(c, &b, out);
    }
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") || !strcmp(name, "count")) {
      if ((rc = arg_str(c, a, 0, "sub", name, &x, 1))) return rc;
      if (!strcmp(name, "count")) {
        int64_t cnt = 0;
        if (x->len == 0) cnt = (int64_t)jutf8_len(s->s, s->len) + 1;
        else
          for (size_t i = 0; i + x->len <= s->len;) {
            const char *f = memmem(s->s + i, s->len - i, x->s, x->len);
            if (!f) break;
            cnt++;
            i = (size_t)(f - s->s) + x->len;
          }
        *out = jv_int(cnt);
        return 0;
      }
      int64_t pos = -1;
      if (name[0] == 'r') {
        for (size_t k = s->len >= x->len ? s->len - x->len + 1 : 0; k-- > 0;)
          if (memcmp(s->s + k, x->s, x->len) == 0) {
            pos = (int64_t)jutf8_len(s->s, k);
            break;
          }
      } else {
        const char *f = x->len ? memmem(s->s, s->len, x->s, x->len) : s->s;
        if (f) pos = (int64_t)jutf8_len(s->s, (size_t)(f - s->s));
      }
      if (pos < 0 && name[0] == 'i') return jctx_err(c, ANNA_EINVAL, "substring not found");
      *out = jv_int(pos);
      return 0;
    }
    if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
      if ((rc = arg_str(c, a, 0, "prefix", name, &x, 1))) return rc;
      int r;
      int suf = name[6] == 's';
      prefix_match(s, (jv){.t = JV_STR, .u.s = x}, suf, &r);
      if (!r) return ret_str(c, s->s, s->len, out);
      return ret_str(c, suf ? s->s : s->s + x->len, s->len - x->len, out);
    }
    if (!strcmp(name, "splitlines")) {
      jlist *l = jlist_new(&c->a, 0);
      if (!l) return jctx_nomem(c);
      size_t st = 0;
      for (size_t i = 0; i < s->len; i++) {
        if (s->s[i] == '\n' || s->s[i] == '\r') {
          jv v = mkstr(c, s->s + st, i - st);
          if (v.t != JV_STR || (rc = push(c, l, v))) return ANNA_ENOMEM;
          if (s->s[i] == '\r' && i + 1 < s->len && s->s[i + 1] == '\n') i++;
          st = i + 1;
        }
      }
      if (st < s->len) {
        jv v = mkstr(c, s->s + st, s->len - st);
        if (v.t != JV_STR || (rc = push(c, l, v))) return ANNA_ENOMEM;
      }
      *out = mklist(l);
      return 0;
    }
    if (!strncmp(name, "is", 2)) {
      int r = s->len > 0, any_cased = 0;
      for (size_t i = 0; i < s->len && r;) {
        int32_t cp;
        i += dec(s->s, s->len, i, &cp);
        utf8proc_category_t cat = utf8proc_category(cp);
        int alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
        int digit = cat == UTF8PROC_CATEGORY_ND;
        if (!strcmp(name, "isdigit")) r = digit;
        else if (!strcmp(name, "isalpha")) r = alpha;
        else if (!strcmp(name, "isalnum")) r = alpha || digit;
        else if (!strcmp(name, "isspace")) r = cp_isspace(cp);
        else if (!strcmp(name, "islower")) {
          if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) r = 0;
          if (cat == UTF8PROC_CATEGORY_LL) any_cased = 1;
        } else if (!strcmp(name, "isupper")) {
          if (cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT) r = 0;
          if (cat == UTF8PROC_CATEGORY_LU) any_cased = 1;
        }
      }
      if (!strcmp(name, "islower") || !strcmp(name, "isupper")) r = r && any_cased;
      *out = jv_bool(r);
      return 0;
    }
  }
  return jctx_err(c, ANNA_EINVAL, "'%s' object has no method '%s'", jv_type_name(self), name);
}

/* ---- globals ---- */
int jinja_call_builtin(jctx *c, int fn, const jargs *a, jv *out) {
  int found;
  switch (fn) {
  case G_RANGE: {
    int64_t st = 0, en, sp = 1;
    for (size_t i = 0; i < a->npos; i++)
      if (!is_intlike(a->pos[i])) return jctx_err(c, ANNA_EINVAL, "range() arguments must be integers");
    if (a->npos == 1) en = ival(a->pos[0]);
    else if (a->npos >= 2) {
      st = ival(a->pos[0]);
      en = ival(a->pos[1]);
      if (a->npos >= 3) sp = ival(a->pos[2]);
    } else
      return jctx_err(c, ANNA_EINVAL, "range expected at least 1 argument");
    if (sp == 0) return jctx_err(c, ANNA_EINVAL, "range() arg 3 must not be zero");
    double cnt = sp > 0 ? ceil(((double)en - (double)st) / (double)sp) : ceil(((double)st - (double)en) / (double)-sp);
    if (cnt < 0) cnt = 0;
    if (cnt > (double)c->lim.max_steps)
      return jctx_err(c, ANNA_ERANGE, "range of %.0f items exceeds the render step limit", cnt);
    jlist *l = jlist_new(&c->a, (size_t)cnt);
    if (!l) return jctx_nomem(c);
    for (int64_t v = st; sp > 0 ? v < en : v > en; v += sp) {
      l->items[l->n++] = jv_int(v);
      if (l->n >= (size_t)cnt) break;
    }
    *out = mklist(l);
    return 0;
  }
  case G_NAMESPACE:
  case G_DICT: {
    jdict *d = jdict_new(&c->a, a->nkw);
    if (!d) return jctx_nomem(c);
    d->is_ns = fn == G_NAMESPACE;
    for (size_t i = 0; i < a->npos; i++) { /* namespace(dict) / dict(dict) copy a mapping */
      if (a->pos[i].t != JV_DICT)
        return jctx_err(c, ANNA_EINVAL, "%s() positional argument must be a mapping", global_names[fn]);
      jdict *src = a->pos[i].u.d;
      for (size_t k = 0; k < src->n; k++)
        if (jdict_setv(&c->a, d, src->keys[k], src->vals[k])) return jctx_nomem(c);
    }
    for (size_t i = 0; i < a->nkw; i++)
      if (jdict_set(&c->a, d, a->kwn[i], a->kwv[i])) return jctx_nomem(c);
    *out = (jv){.t = JV_DICT, .u.d = d};
    return 0;
  }
  case G_RAISE: {
    jv m = jargs_get(a, 0, "message", &found);
    jstr *s = jinja_to_str(c, m);
    if (!s) return ANNA_ENOMEM;
    return jctx_err(c, ANNA_EINVAL, "raise_exception: %s", s->s);
  }
  case G_STRFTIME: {
    jv f = jargs_get(a, 0, "format", &found);
    if (f.t != JV_STR) return jctx_err(c, ANNA_EINVAL, "strftime_now: format must be a string");
    struct tm tm;
    if (c->lim.now_unix > 0) {
      const time_t pinned = (time_t)c->lim.now_unix;
      gmtime_r(&pinned, &tm);
    } else {
      const time_t now = time(NULL);
      localtime_r(&now, &tm);
    }
    char buf[512];
    size_t n = f.u.s->len ? strftime(buf, sizeof(buf), f.u.s->s, &tm) : 0;
    return ret_str(c, buf, n, out);
  }
  case G_LIST: {
    jv v = jargs_get(a, 0, NULL, &found);
    jlist *l;
    int rc = found ? jinja_to_list(c, v, &l) : ((l = jlist_new(&c->a, 0)) ? 0 : jctx_nomem(c));
    if (rc) return rc;
    jlist *copy = jlist_new(&c->a, l->n);
    if (!copy) return jctx_nomem(c);
    memcpy(copy->items, l->items, l->n * sizeof(jv));
    copy->n = l->n;
    *out = mklist(copy);
    return 0;
  }
  }
  return jctx_err(c, ANNA_EINVAL, "unknown builtin");
}

/* ---- tests ---- */
int jinja_apply_test(jctx *c, const char *name, jv v, const jargs *a, int *r) {
  int found;
  jv x = jargs_get(a, 0, NULL, &found);
#define IS(n) (strcmp(name, n) == 0)
  if (IS("defined")) *r = v.t != JV_UNDEF;
  else if (IS("undefined")) *r = v.t == JV_UNDEF;
  else if (IS("none")) *r = v.t == JV_NONE;
  else if (IS("string")) *r = v.t == JV_STR;
  else if (IS("mapping")) *r = v.t == JV_DICT && !v.u.d->is_ns;
  else if (IS("iterable")) *r = v.t == JV_STR || v.t == JV_LIST || (v.t == JV_DICT && !v.u.d->is_ns) || v.t == JV_UNDEF;
  else if (IS("sequence")) *r = v.t == JV_STR || v.t == JV_LIST || (v.t == JV_DICT && !v.u.d->is_ns);
  else if (IS("number")) *r = v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
  else if (IS("integer")) *r = v.t == JV_INT;
  else if (IS("float")) *r = v.t == JV_FLOAT;
  else if (IS("boolean")) *r = v.t == JV_BOOL;
  else if (IS("true")) *r = v.t == JV_BOOL && v.u.b;
  else if (IS("false")) *r = v.t == JV_BOOL && !v.u.b;
  else if (IS("callable")) *r = v.t == JV_MACRO || v.t == JV_BUILTIN || v.t == JV_METHOD;
  else if (IS("odd") || IS("even") || IS("divisibleby")) {
    if (!is_intlike(v) && v.t != JV_FLOAT) return jctx_err(c, ANNA_EINVAL, "test '%s' needs a number", name);
    if (IS("divisibleby")) {
      if (!found || !is_intlike(x) || ival(x) == 0) return jctx_err(c, ANNA_EINVAL, "divisibleby needs a non-zero integer");
      *r = v.t == JV_FLOAT ? fmod(v.u.f, (double)ival(x)) == 0 : ival(v) % ival(x) == 0;
    } else {
      int64_t i = v.t == JV_FLOAT ? (int64_t)v.u.f : ival(v);
      *r = (i % 2 != 0) == IS("odd");
    }
  } else if (IS("equalto") || IS("eq") || IS("==")) *r = jv_equal(v, x);
  else if (IS("ne") || IS("!=")) *r = !jv_equal(v, x);
  else if (IS("sameas")) *r = v.t == x.t && (v.t == JV_NONE || v.t == JV_UNDEF || jv_equal(v, x)) &&
                           (v.t != JV_LIST || v.u.l == x.u.l) && (v.t != JV_DICT || v.u.d == x.u.d);
  else if (IS("lt") || IS("<") || IS("le") || IS("<=") || IS("gt") || IS(">") || IS("ge") || IS(">=")) {
    int cmp;
    if (jv_compare(v, x, &cmp)) return jctx_err(c, ANNA_EINVAL, "cannot compare '%s' and '%s'", jv_type_name(v), jv_type_name(x));
    *r = name[0] == 'l' || name[0] == '<' ? (strchr(name, 'e') || strchr(name, '=') ? cmp <= 0 : cmp < 0)
                                          : (strchr(name, 'e') || strchr(name, '=') ? cmp >= 0 : cmp > 0);
    if (IS("le") || IS("ge")) *r = name[0] == 'l' ? cmp <= 0 : cmp >= 0;
    if (IS("lt")) *r = cmp < 0;
    if (IS("gt")) *r = cmp > 0;
  } else if (IS("in")) {
    *r = 0;
    if (x.t == JV_STR && v.t == JV_STR) *r = memmem(x.u.s->s, x.u.s->len, v.u.s->s, v.u.s->len) != NULL || v.u.s->len == 0;
    else if (x.t == JV_LIST)
      for (size_t i = 0; i < x.u.l->n && !*r; i++) *r = jv_equal(x.u.l->items[i], v);
    else if (x.t == JV_DICT) *r = jdict_getv(x.u.d, v) != NULL;
  } else if (IS("lower") || IS("upper")) {
    if (v.t != JV_STR) *r = 0;
    else {
      jv res;
      int rc = jinja_call_method(c, v, IS("lower") ? "islower" : "isupper", a, &res);
      if (rc) return rc;
      *r = res.u.b;
    }
  } else if (IS("filter")) *r = x.t == JV_STR && jinja_filter_known(x.u.s->s, x.u.s->len);
  else if (IS("test")) *r = x.t == JV_STR && jinja_test_known(x.u.s->s, x.u.s->len);
  else if (IS("escaped")) *r = 0;
  else return jctx_err(c, ANNA_EINVAL, "no test named '%s'", name);
#undef IS
  return 0;
}

/* ---- filters ---- */
/* Sub-arguments a[from..] as a new jargs (for select/map passing extra args on). */
static jargs args_from(const jargs *a, size_t from) {
  jargs r = *a;
  if (from >= a->npos) {
    r.pos = NULL;
    r.npos = 0;
  } else {
    r.pos = a->pos + from;
    r.npos = a->npos - from;
  }
  return r;
}

/* Dotted attribute path lookup (`map(attribute='function.name')`), integer parts index. */
static jv attr_path(jctx *c, jv v, const jstr *path) {
  size_t i = 0;
  while (i <= path->len) {
    const char *dot = memchr(path->s + i, '.', path->len - i);
    size_t e = dot ? (size_t)(dot - path->s) : path->len;
    const char *part = path->s + i;
    size_t pl = e - i;
    int numeric = pl > 0;
    for (size_t k = 0; k < pl; k++) numeric &= part[k] >= '0' && part[k] <= '9';
    if (numeric && v.t == JV_LIST) v = jinja_getitem(c, v, jv_int(atoll(part)));
    else {
      jv key = {.t = JV_STR};
      jstr *ks = jstr_new(&c->a, part, pl);
      if (!ks) {
        jctx_nomem(c);
        return jv_undef();
      }
      key.u.s = ks;
      jv g = jinja_getitem(c, v, key);
      v = g.t != JV_UNDEF ? g : jinja_getattr(c, v, part, pl);
    }
    if (!dot) break;
    i = e + 1;
  }
  return v;
}

static int sort_list(jctx *c, jlist *l, const jstr *attr, int reverse, int case_sensitive, int by_value) {
  /* Stable insertion-merge: lists in templates are short; use a simple stable merge sort. */
  size_t n = l->n;
  if (n < 2) return 0;
  jv *keys = jarena_alloc(&c->a, n * sizeof(jv));
  jv *tmpv = jarena_alloc(&c->a, n * sizeof(jv));
  jv *tmpk = jarena_alloc(&c->a, n * sizeof(jv));
  if (!keys || !tmpv || !tmpk) return jctx_nomem(c);
  for (size_t i = 0; i < n; i++) {
    jv k = l->items[i];
    if (by_value >= 0 && k.t == JV_LIST && k.u.l->n == 2) k = k.u.l->items[by_value];
    if (attr) k = attr_path(c, k, attr);
    if (!case_sensitive && k.t == JV_STR) {
      jv low;
      int rc = do_case(c, k.u.s, 0, &low);
      if (rc) return rc;
      k = low;
    }
    keys[i] = k;
  }
  for (size_t w = 1; w < n; w *= 2) {
    for (size_t lo = 0; lo < n; lo += 2 * w) {
      size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
      size_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi) {
        int cmp;
        if (jv_compare(keys[i], keys[j], &cmp))
          return jctx_err(c, ANNA_EINVAL, "'<' not supported between instances of '%s' and '%s'",
                          jv_type_name(keys[i]), jv_type_name(keys[j]));
        if (reverse ? cmp < 0 : cmp > 0) {
          tmpv[k] = l->items[j];
          tmpk[k++] = keys[j++];
        } else {
          tmpv[k] = l->items[i];
          tmpk[k++] = keys[i++];
        }
      }
      while (i < mid) {
        tmpv[k] = l->items[i];
        tmpk[k++] = keys[i++];
      }
      while (j < hi) {
        tmpv[k] = l->items[j];
        tmpk[k++] = keys[j++];
      }
    }
    memcpy(l->items, tmpv, n * sizeof(jv));
    memcpy(keys, tmpk, n * sizeof(jv));
  }
  return 0;
}

static jlist *copy_list(jctx *c, jlist *l) {
  jlist *r = jlist_new(&c->a, l->n);
  if (!r) {
    jctx_nomem(c);
    return NULL;
  }
  if (l->n) memcpy(r->items, l->items, l->n * sizeof(jv));
  r->n = l->n;
  return r;
}

static int do_indent(jctx *c, const jstr *s, jv width, int first, int blank, jv *out) {
  jbuf pad = {0};
  if (width.t == JV_STR) jbuf_put(&pad, width.u.s->s, width.u.s->len);
  else {
    int64_t w = width.t == JV_UNDEF ? 4 : ival(width);
    for (int64_t i = 0; i < w && i < 4096; i++) jbuf_put(&pad, " ", 1);
  }
  jbuf b = {.limit = c->lim.max_output};
  size_t i = 0;
  int line_no = 0;
  while (i <= s->len) {
    const char *nl = memchr(s->s + i, '\n', s->len - i);
    size_t e = nl ? (size_t)(nl - s->s) : s->len;
    int empty = e == i;
    int want = (line_no > 0 || first) && (blank || !empty);
    /* jinja2 never indents a trailing empty line after the final newline */
    if (!nl && empty && line_no > 0) want = 0;
    if (want && pad.n) jbuf_put(&b, pad.p, pad.n);
    jbuf_put(&b, s->s + i, e - i);
    if (!nl) break;
    jbuf_put(&b, "\n", 1);
    i = e + 1;
    line_no++;
  }
  jbuf_free(&pad);
  return ret_buf(c, &b, out);
}

int jinja_apply_filter(jctx *c, const char *name, jv v, const jargs *a, jv *out) {
  int found, rc;
  if ((rc = jctx_charge(c, v))) return rc;
#define IS(n) (strcmp(name, n) == 0)
  if (IS("safe")) {
    if (v.t == JV_STR && v.u.s->markup) {
      *out = v;
      return 0;
    }
    jstr *t = jinja_to_str(c, v);
    if (!t) return ANNA_ENOMEM;
    if ((rc = ret_str(c, t->s, t->len, out))) return rc;
    out->u.s->markup = 1;
    return 0;
  }
  if ((IS("e") || IS("escape")) && v.t == JV_STR && v.u.s->markup) {
    *out = v;
    return 0;
  }
  if (IS("tojson")) {
    jv ind = jargs_get(a, 0, "indent", &found);
    int indent = -1;
    if (found && ind.t != JV_NONE) {
      if (!is_intlike(ind)) return jctx_err(c, ANNA_EINVAL, "tojson: indent must be an integer");
      indent = (int)(ival(ind) < 0 ? 0 : ival(ind) > 64 ? 64 : ival(ind));
    }
    const char *isep = NULL, *ksep = NULL;
    jv seps = jargs_get(a, 99, "separators", &found);
    if (found && seps.t == JV_LIST && seps.u.l->n == 2 && seps.u.l->items[0].t == JV_STR &&
        seps.u.l->items[1].t == JV_STR) {
      isep = seps.u.l->items[0].u.s->s;
      ksep = seps.u.l->items[1].u.s->s;
    }
    jv sk = jargs_get(a, 99, "sort_keys", &found);
    jv ea = jargs_get(a, 99, "ensure_ascii", &found);
    int flags = (jv_truthy(sk) ? JTOJSON_SORT_KEYS : 0) | (jv_truthy(ea) ? JTOJSON_ASCII : 0);
    jbuf b = {.limit = c->lim.max_output};
    const char *msg = NULL;
    if (jv_tojson(&b, v, indent, isep, ksep, flags, 0, &msg)) {
      jbuf_free(&b);
      return jctx_err(c, ANNA_EINVAL, "tojson: %s", msg ? msg : "cannot encode");
    }
    return ret_buf(c, &b, out);
  }
  if (IS("string")) {
    jstr *s = jinja_to_str(c, v);
    if (!s) return ANNA_ENOMEM;
    *out = (jv){.t = JV_STR, .u.s = s};
    return 0;
  }
  if (IS("default") || IS("d")) {
    jv def = jargs_get(a, 0, "default_value", &found);
    if (!found) def = mkstr(c, "", 0);
    jv bo = jargs_get(a, 1, "boolean", &found);
    int use = jv_truthy(bo) ? !jv_truthy(v) : v.t == JV_UNDEF;
    *out = use ? def : v;
    return 0;
  }
  if (IS("length") || IS("count")) {
    switch (v.t) {
    case JV_STR: *out = jv_int((int64_t)jutf8_len(v.u.s->s, v.u.s->len)); return 0;
    case JV_LIST: *out = jv_int((int64_t)v.u.l->n); return 0;
    case JV_DICT: *out = jv_int((int64_t)v.u.d->n); return 0;
    case JV_UNDEF: *out = jv_int(0); return 0;
    default: return jctx_err(c, ANNA_EINVAL, "object of type '%s' has no len()", jv_type_name(v));
    }
  }
  if (IS("bool")) {
    *out = jv_bool(jv_truthy(v));
    return 0;
  }
  if (IS("int")) {
    jv def = jargs_get(a, 0, "default", &found);
    if (!found) def = jv_int(0);
    if (v.t == JV_INT) *out = v;
    else if (v.t == JV_BOOL) *out = jv_int(v.u.b);
    else if (v.t == JV_FLOAT) *out = isfinite(v.u.f) && fabs(v.u.f) < 9.2e18 ? jv_int((int64_t)v.u.f) : def;
    else if (v.t == JV_STR) {
      char *end;
      const char *s = v.u.s->s;
      long long x = strtoll(s, &end, 10);
      while (*end == ' ' || *end == '\t' || *end == '\n') end++;
      if (end != s && *end == 0) *out = jv_int(x);
      else {
        double d = strtod(s, &end);
        while (*end == ' ' || *end == '\t' || *end == '\n') end++;
        *out = end != s && *end == 0 && isfinite(d) && fabs(d) < 9.2e18 ? jv_int((int64_t)d) : def;
      }
    } else
      *out = def;
    return 0;
  }
  if (IS("float")) {
    jv def = jargs_get(a, 0, "default", &found);
    if (!found) def = jv_float(0.0);
    if (v.t == JV_FLOAT) *out = v;
    else if (is_intlike(v)) *out = jv_float((double)ival(v));
    else if (v.t == JV_STR) {
      char *end;
      double d = strtod(v.u.s->s, &end);
      while (*end == ' ' || *end == '\t' || *end == '\n') end++;
      *out = end != v.u.s->s && *end == 0 ? jv_float(d) : def;
    } else
      *out = def;
    return 0;
  }
  if (IS("abs")) {
    if (v.t == JV_FLOAT) *out = jv_float(fabs(v.u.f));
    else if (is_intlike(v)) *out = ival(v) == INT64_MIN ? jv_float(9.223372036854775808e18) : jv_int(llabs(ival(v)));
    else return jctx_err(c, ANNA_EINVAL, "bad operand type for abs(): '%s'", jv_type_name(v));
    return 0;
  }
  if (IS("round")) {
    jv pr = jargs_get(a, 0, "precision", &found);
    int64_t prec = found ? ival(pr) : 0;
    jstr *method = NULL;
    if ((rc = arg_str(c, a, 1, "method", "round", &method, 0))) return rc;
    if (!is_intlike(v) && v.t != JV_FLOAT) return jctx_err(c, ANNA_EINVAL, "round: not a number");
    if (prec > 300) prec = 300;
    if (prec < -300) prec = -300;
    double x = v.t == JV_FLOAT ? v.u.f : (double)ival(v);
    double m = pow(10.0, (double)prec);
    double r;
    if (method && !strcmp(method->s, "ceil")) r = ceil(x * m) / m;
    else if (method && !strcmp(method->s, "floor")) r = floor(x * m) / m;
    else {
      /* Python round(): half to even on the exact decimal value; snprintf rounds the exact
       * binary value the same way. */
      if (prec >= 0) {
        char t[400];
        snprintf(t, sizeof(t), "%.*f", (int)prec, x);
        r = strtod(t, NULL);
      } else
        r = nearbyint(x * m) / m;
    }
    if (v.t != JV_FLOAT && !method) *out = v.t == JV_BOOL ? jv_int(v.u.b) : v; /* int stays int */
    else *out = jv_float(r);
    return 0;
  }
  if (IS("first") || IS("last")) {
    if (v.t == JV_UNDEF) {
      *out = jv_undef();
      return 0;
    }
    jlist *l;
    if ((rc = jinja_to_list(c, v, &l))) return rc;
    *out = l->n ? l->items[IS("first") ? 0 : l->n - 1] : jv_undef();
    return 0;
  }
  if (IS("list")) {
    jlist *l;
    if ((rc = jinja_to_list(c, v, &l))) return rc;
    jlist *r = copy_list(c, l);
    if (!r) return ANNA_ENOMEM;
    *out = mklist(r);
    return 0;
  }
  if (IS("items")) {
    if (v.t == JV_UNDEF) {
      jlist *l = jlist_new(&c->a, 0);
      if (!l) return jctx_nomem(c);
      *out = mklist(l);
      return 0;
    }
    if (v.t != JV_DICT) return jctx_err(c, ANNA_EINVAL, "items: can only get item pairs from a mapping");
    return jinja_call_method(c, v, "items", a, out);
  }
  if (IS("dictsort")) {
    if (v.t != JV_DICT) return jctx_err(c, ANNA_EINVAL, "dictsort: can only sort a mapping");
    jv items;
    jargs none = {0};
    if ((rc = jinja_call_method(c, v, "items", &none, &items))) return rc;
    jv cs = jargs_get(a, 0, "case_sensitive", &found);
    jstr *by = NULL;
    if ((rc = arg_str(c, a, 1, "by", "dictsort", &by, 0))) return rc;
    jv rev = jargs_get(a, 2, "reverse", &found);
    if ((rc = sort_list(c, items.u.l, NULL, jv_truthy(rev), jv_truthy(cs), by && !strcmp(by->s, "value") ? 1 : 0)))
      return rc;
    *out = items;
    return 0;
  }
  if (IS("sort")) {
    jlist *l;
    if ((rc = jinja_to_list(c, v, &l))) return rc;
    jlist *r = copy_list(c, l);
    if (!r) return ANNA_ENOMEM;
    jv rev = jargs_get(a, 0, "reverse", &found);
    jv cs = jargs_get(a, 1, "case_sensitive", &found);
    jstr *attr = NULL;
    if ((rc = arg_str(c, a, 2, "attribute", "sort", &attr, 0))) return rc;
    if ((rc = sort_list(c, r, attr, jv_truthy(rev), jv_truthy(cs), -1))) return rc;
    *out = mklist(r);
    return 0;
  }
  if (IS("reverse")) {
    if (v.t == JV_STR) {
      jlist *l;
      if ((rc = jinja_to_list(c, v, &l))) return rc;
      jbuf b = {.limit = c->lim.max_output};
      for (size_t i = l->n; i-- > 0;) jbuf_put(&b, l->items[i].u.s->s, l->items[i].u.s->len);
      return ret_buf(c, &b, out);
    }
    jlist *l;
    if ((rc = jinja_to_list(c, v, &l))) return rc;
    jlist *r = jlist_new(&c->a, l->n);
    if (!r) return jctx_nomem(c);
    for (size_t i = l->n; i-- > 0;) r->items[r->n++] = l->items[i];
    *out = mklist(r);
    return 0;
  }
  if (IS("join")) {
    jstr *sep = NULL, *attr = NULL;
    if ((rc = arg_str(c, a, 0, "d", "join", &sep, 0)) || (rc = arg_str(c, a, 1, "attribute", "join", &attr, 0)))
      return rc;
    jlist *l;
    if ((rc = jinja_to_list(c, v, &l))) return rc;
    jbuf b = {.limit = c->lim.max_output};
    for (size_t i = 0; i < l->n; i++) {
      if (i && sep) jbuf_put(&b, sep->s, sep->len);
      jv_print(&b, attr ? attr_path(c, l->items[i], attr) : l->items[i]);
    }
    return ret_buf(c, &b, out);
  }
  if (IS("unique")) {
    jlist *l;
    if ((rc = jinja_to_list(c, v, &l))) return rc;
    jv cs = jargs_get(a, 0, "case_sensitive", &found);
    jstr *attr = NULL;
    if ((rc = arg_str(c, a, 1, "attribute", "unique", &attr, 0))) return rc;
    jlist *r = jlist_new(&c->a, l->n), *seen = jlist_new(&c->a, l->n);
    if (!r || !seen) return jctx_nomem(c);
    for (size_t i = 0; i < l->n; i++) {
      jv k = attr ? attr_path(c, l->items[i], attr) : l->items[i];
      if (!jv_truthy(cs) && k.t == JV_STR && (rc = do_case(c, k.u.s, 0, &k))) return rc;
      c->steps += (int64_t)seen->n; /* quadratic: charge the comparisons */
      if ((rc = jctx_charge(c, jv_none()))) return rc;
      int dup = 0;
      for (size_t j = 0; j < seen->n && !dup; j++) dup = jv_equal(seen->items[j], k);
      if (dup) continue;
      seen->items[seen->n++] = k;
      r->items[r->n++] = l->items[i];
    }
    *out = mklist(r);
    return 0;
  }
  if ((IS("map") || IS("select") || IS("reject") || IS("selectattr") || IS("rejectattr")) && !jv_truthy(v)) {
    jlist *l = jlist_new(&c->a, 0);
    if (!l) return jctx_nomem(c);
    *out = mklist(l);
    return 0;
  }
  if (IS("map")) {
    jlist *l;
    if ((rc = jinja_to_list(c, v, &l))) return rc;
    jlist *r = jlist_new(&c->a, l->n);
    if (!r) return jctx_nomem(c);
    jstr *attr = NULL;
    jv at = jargs_get(a, 99, "attribute", &found);
    if (found) {
      if (at.t != JV_STR) return jctx_err(c, ANNA_EINVAL, "map: attribute must be a string");
      attr = at.u.s;
      jv def = jargs_get(a, 99, "default", &found);
      for (size_t i = 0; i < l->n; i++) {
        jv x = attr_path(c, l->items[i], attr);
        r->items[r->n++] = x.t == JV_UNDEF && found ? def : x;
      }
    } else {
      jv fname = jargs_get(a, 0, NULL, &found);
      if (!found || fname.t != JV_STR) return jctx_err(c, ANNA_EINVAL, "map: expected a filter name or attribute=");
      if (!jinja_filter_known(fname.u.s->s, fname.u.s->len))
        return jctx_err(c, ANNA_EINVAL, "map: no filter named '%s'", fname.u.s->s);
      jargs rest = args_from(a, 1);
      for (size_t i = 0; i < l->n; i++)
        if ((rc = jinja_apply_filter(c, fname.u.s->s, l->items[i], &rest, &r->items[r->n++]))) return rc;
    }
    *out = mklist(r);
    return 0;
  }
  if (IS("select") || IS("reject") || IS("selectattr") || IS("rejectattr")) {
    int is_attr = IS("selectattr") || IS("rejectattr");
    int want = name[0] == 's';
    jlist *l;
    if ((rc = jinja_to_list(c, v, &l))) return rc;
    jstr *attr = NULL;
    size_t ti = 0;
    if (is_attr) {
      if ((rc = arg_str(c, a, 0, "attribute", name, &attr, 1))) return rc;
      ti = 1;
    }
    jv tname = jargs_get(a, ti, NULL, &found);
    if (found && tname.t != JV_STR) return jctx_err(c, ANNA_EINVAL, "%s: test name must be a string", name);
    if (found && !jinja_test_known(tname.u.s->s, tname.u.s->len))
      return jctx_err(c, ANNA_EINVAL, "%s: no test named '%s'", name, tname.u.s->s);
    jargs rest = args_from(a, ti + 1);
    rest.nkw = 0;
    jlist *r = jlist_new(&c->a, l->n);
    if (!r) return jctx_nomem(c);
    for (size_t i = 0; i < l->n; i++) {
      jv x = attr ? attr_path(c, l->items[i], attr) : l->items[i];
      int t;
      if (found) {
        if ((rc = jinja_apply_test(c, tname.u.s->s, x, &rest, &t))) return rc;
      } else
        t = jv_truthy(x);
      if (t == want) r->items[r->n++] = l->items[i];
    }
    *out = mklist(r);
    return 0;
  }
  if (IS("sum")) {
    jlist *l;
    if ((rc = jinja_to_list(c, v, &l))) return rc;
    jstr *attr = NULL;
    if ((rc = arg_str(c, a, 0, "attribute", "sum", &attr, 0))) return rc;
    jv acc = jargs_get(a, 1, "start", &found);
    if (!found) acc = jv_int(0);
    for (size_t i = 0; i < l->n; i++) {
      jv x = attr ? attr_path(c, l->items[i], attr) : l->items[i];
      if ((!is_intlike(x) && x.t != JV_FLOAT) || (!is_intlike(acc) && acc.t != JV_FLOAT))
        return jctx_err(c, ANNA_EINVAL, "sum: unsupported operand types");
      if (x.t == JV_FLOAT || acc.t == JV_FLOAT)
        acc = jv_float((acc.t == JV_FLOAT ? acc.u.f : (double)ival(acc)) + (x.t == JV_FLOAT ? x.u.f : (double)ival(x)));
      else
        acc = jv_int(ival(acc) + ival(x));
    }
    *out = acc;
    return 0;
  }
  if (IS("min") || IS("max")) {
    jlist *l;
    if ((rc = jinja_to_list(c, v, &l))) return rc;
    if (!l->n) {
      *out = jv_undef();
      return 0;
    }
    jv best = l->items[0];
    for (size_t i = 1; i < l->n; i++) {
      int cmp;
      if (jv_compare(l->items[i], best, &cmp)) return jctx_err(c, ANNA_EINVAL, "%s: values are not comparable", name);
      if (IS("min") ? cmp < 0 : cmp > 0) best = l->items[i];
    }
    *out = best;
    return 0;
  }
  if (IS("attr")) {
    jstr *an = NULL;
    if ((rc = arg_str(c, a, 0, "name", "attr", &an, 1))) return rc;
    *out = jinja_getattr(c, v, an->s, an->len);
    return 0;
  }
  if (IS("batch")) {
    jlist *l;
    if ((rc = jinja_to_list(c, v, &l))) return rc;
    jv sz = jargs_get(a, 0, "linecount", &found);
    if (!is_intlike(sz) || ival(sz) <= 0) return jctx_err(c, ANNA_EINVAL, "batch: size must be positive");
    jlist *r = jlist_new(&c->a, 0);
    if (!r) return jctx_nomem(c);
    for (size_t i = 0; i < l->n; i += (size_t)ival(sz)) {
      jlist *chunk = jlist_new(&c->a, 0);
      if (!chunk) return jctx_nomem(c);
      for (size_t k = i; k < l->n && k < i + (size_t)ival(sz); k++)
        if ((rc = push(c, chunk, l->items[k]))) return rc;
      if ((rc = push(c, r, mklist(chunk)))) return rc;
    }
    *out = mklist(r);
    return 0;
  }
  /* string filters: operand printed as text first, as jinja2 does via soft_str */
  jstr *s = jinja_to_str(c, v);
  if (!s) return ANNA_ENOMEM;
  if (IS("trim")) {
    jstr *chars = NULL;
    if ((rc = arg_str(c, a, 0, "chars", "trim", &chars, 0))) return rc;
    return do_strip(c, s, chars, 1, 1, out);
  }
  if (IS("upper")) return do_case(c, s, 1, out);
  if (IS("lower")) return do_case(c, s, 0, out);
  if (IS("title")) return do_case(c, s, 4, out);
  if (IS("capitalize")) return do_case(c, s, 3, out);
  if (IS("replace")) {
    jstr *x = NULL, *y = NULL;
    if ((rc = arg_str(c, a, 0, "old", "replace", &x, 1)) || (rc = arg_str(c, a, 1, "new", "replace", &y, 1)))
      return rc;
    jv cnt = jargs_get(a, 2, "count", &found);
    return do_replace(c, s, x, y, found && is_intlike(cnt) ? ival(cnt) : -1, out);
  }
  if (IS("indent")) {
    jv w = jargs_get(a, 0, "width", &found);
    jv first = jargs_get(a, 1, "first", &found);
    jv blank = jargs_get(a, 2, "blank", &found);
    return do_indent(c, s, w, jv_truthy(first), jv_truthy(blank), out);
  }
  if (IS("wordcount")) {
    int64_t cnt = 0;
    int in_word = 0;
    for (size_t i = 0; i < s->len;) {
      int32_t cp;
      i += dec(s->s, s->len, i, &cp);
      utf8proc_category_t cat = utf8proc_category(cp);
      int w = (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_NO) || cp == '_';
      if (w && !in_word) cnt++;
      in_word = w;
    }
    *out = jv_int(cnt);
    return 0;
  }
  if (IS("e") || IS("escape") || IS("forceescape")) {
    jbuf b = {.limit = c->lim.max_output};
    for (size_t i = 0; i < s->len; i++) {
      switch (s->s[i]) {
      case '&': jbuf_puts(&b, "&amp;"); break;
      case '<': jbuf_puts(&b, "&lt;"); break;
      case '>': jbuf_puts(&b, "&gt;"); break;
      case '"': jbuf_puts(&b, "&#34;"); break;
      case '\'': jbuf_puts(&b, "&#39;"); break;
      default: jbuf_put(&b, s->s + i, 1);
      }
    }
    if ((rc = ret_buf(c, &b, out))) return rc;
    out->u.s->markup = 1;
    return 0;
  }
  if (IS("format")) return do_format_percent(c, s, a, out);
  if (IS("center")) {
    jv w = jargs_get(a, 0, "width", &found);
    int64_t width = found ? ival(w) : 80, len = (int64_t)jutf8_len(s->s, s->len);
    if (width > 4096) width = 4096;
    jbuf b = {.limit = c->lim.max_output};
    int64_t pad = width - len, left = pad > 0 ? pad / 2 + (pad & width & 1) : 0;
    for (int64_t i = 0; i < left; i++) jbuf_put(&b, " ", 1);
    jbuf_put(&b, s->s, s->len);
    for (int64_t i = 0; i < pad - left; i++) jbuf_put(&b, " ", 1);
    return ret_buf(c, &b, out);
  }
  if (IS("truncate")) {
    jv ln = jargs_get(a, 0, "length", &found);
    int64_t length = found ? ival(ln) : 255;
    size_t cps = jutf8_len(s->s, s->len);
    if ((int64_t)cps <= length + 5) return ret_str(c, s->s, s->len, out);
    jbuf b = {.limit = c->lim.max_output};
    size_t cut = jutf8_offset(s->s, s->len, (size_t)(length > 3 ? length - 3 : 0));
    jbuf_put(&b, s->s, cut);
    jbuf_puts(&b, "...");
    return ret_buf(c, &b, out);
  }
  if (IS("striptags")) return ret_str(c, s->s, s->len, out);
#undef IS
  return jctx_err(c, ANNA_EINVAL, "no filter named '%s'", name);
}
