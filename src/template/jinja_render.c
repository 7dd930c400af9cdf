/* jinja_render.c: evaluates a parsed template (expressions, statements, scopes, macros).
 *
 * Scoping follows jinja2: a for-loop body gets a fresh scope on every iteration (so a plain
 * `set` inside a loop never leaks out; namespaces exist for that), a macro call gets its own
 * scope whose parent is the scope the macro was defined in, if/else share the enclosing scope.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "template/jinja_internal.h"

#define DEFAULT_MAX_OUTPUT ((size_t)16 << 20)
#define DEFAULT_MAX_STEPS ((int64_t)10000000)
#define DEFAULT_MAX_DEPTH 200
#define DEFAULT_MAX_MEMORY ((size_t)256 << 20)

int jctx_err(jctx *c, int code, const char *fmt, ...) {
  if (c->failed) return code;
  c->failed = 1;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  anna_err(c->err, c->errlen, code, "template line %d: %s", c->line, msg);
  return code;
}

int jctx_nomem(jctx *c) {
  if (c->a.failed == 2) return jctx_err(c, ANNA_ERANGE, "render memory limit exceeded");
  return jctx_err(c, ANNA_ENOMEM, "out of memory");
}

jv jargs_get(const jargs *a, size_t idx, const char *name, int *found) {
  if (found) *found = 1;
  if (idx < a->npos) return a->pos[idx];
  if (name)
    for (size_t i = 0; i < a->nkw; i++)
      if (jstr_eq(a->kwn[i], name, strlen(name))) return a->kwv[i];
  if (found) *found = 0;
  return jv_undef();
}

int jctx_charge(jctx *c, jv v) {
  int64_t cost = 1;
  if (v.t == JV_STR) cost += (int64_t)(v.u.s->len >> 6);
  else if (v.t == JV_LIST) cost += (int64_t)(v.u.l->n >> 3);
  else if (v.t == JV_DICT) cost += (int64_t)(v.u.d->n >> 3);
  c->steps += cost;
  if (c->steps > c->lim.max_steps)
    return jctx_err(c, ANNA_ERANGE, "render step limit (%lld) exceeded", (long long)c->lim.max_steps);
  return 0;
}

static int step(jctx *c) {
  if (++c->steps > c->lim.max_steps)
    return jctx_err(c, ANNA_ERANGE, "render step limit (%lld) exceeded", (long long)c->lim.max_steps);
  return 0;
}

static int check_out(jctx *c, jbuf *b) {
  if (b->failed == 2) return jctx_err(c, ANNA_ERANGE, "render output limit exceeded");
  if (b->failed) return jctx_err(c, ANNA_ENOMEM, "out of memory");
  return 0;
}

jstr *jinja_to_str(jctx *c, jv v) {
  if (v.t == JV_STR) return v.u.s;
  jbuf b = {.limit = c->lim.max_output};
  jv_print(&b, v);
  if (check_out(c, &b)) {
    jbuf_free(&b);
    return NULL;
  }
  jstr *s = jstr_new(&c->a, b.p ? b.p : "", b.n);
  jbuf_free(&b);
  if (!s) jctx_nomem(c);
  return s;
}

/* ---- scopes ---- */
static jscope *scope_new(jctx *c, jscope *parent) {
  jscope *s = jarena_alloc(&c->a, sizeof(*s));
  if (!s) return NULL;
  s->parent = parent;
  s->vars = jdict_new(&c->a, 0);
  return s->vars ? s : NULL;
}

static jv scope_lookup(jscope *s, const jstr *name, int *found) {
  for (; s; s = s->parent) {
    jv *v = jdict_get(s->vars, name->s, name->len);
    if (v) {
      *found = 1;
      return *v;
    }
  }
  *found = 0;
  return jv_undef();
}

static int scope_set(jctx *c, jscope *s, jstr *name, jv v) {
  if (jdict_set(&c->a, s->vars, name, v)) return jctx_nomem(c);
  return 0;
}

/* ---- expressions ---- */
static int eval(jctx *c, jscope *s, const jnode *n, jv *out);
static int exec_body(jctx *c, jscope *s, const jnode *n);

int jinja_to_list(jctx *c, jv v, jlist **out) {
  switch (v.t) {
  case JV_LIST: *out = v.u.l; return 0;
  case JV_UNDEF: *out = jlist_new(&c->a, 0); return *out ? 0 : jctx_nomem(c);
  case JV_DICT: {
    jlist *l = jlist_new(&c->a, v.u.d->n);
    if (!l) return jctx_nomem(c);
    for (size_t i = 0; i < v.u.d->n; i++) l->items[l->n++] = v.u.d->keys[i];
    *out = l;
    return 0;
  }
  case JV_STR: {
    jstr *st = v.u.s;
    jlist *l = jlist_new(&c->a, st->len);
    if (!l) return jctx_nomem(c);
    size_t i = 0;
    while (i < st->len) {
      size_t k = 1;
      while (i + k < st->len && ((unsigned char)st->s[i + k] & 0xC0) == 0x80) k++;
      jv ch = jv_str(&c->a, st->s + i, k);
      if (ch.t != JV_STR) return jctx_nomem(c);
      l->items[l->n++] = ch;
      i += k;
    }
    *out = l;
    return 0;
  }
  default: return jctx_err(c, ANNA_EINVAL, "'%s' object is not iterable", jv_type_name(v));
  }
}

static int eval_args(jctx *c, jscope *s, jnode **kids, size_t nkids, jargs *a) {
  memset(a, 0, sizeof(*a));
  if (!nkids) return 0;
  jv *vals = jarena_alloc(&c->a, nkids * sizeof(jv));
  if (!vals) return jctx_nomem(c);
  size_t npos = 0, nkw = 0;
  for (size_t i = 0; i < nkids; i++) {
    const jnode *k = kids[i];
    int rc = eval(c, s, k->kind == JN_KWARG || k->kind == JN_SPLAT ? k->a : k, &vals[i]);
    if (rc) return rc;
    if (k->kind == JN_SPLAT && k->op == 1) {
      jlist *l;
      if ((rc = jinja_to_list(c, vals[i], &l))) return rc;
      vals[i] = (jv){.t = JV_LIST, .u.l = l};
      npos += l->n;
    } else if (k->kind == JN_SPLAT) {
      if (vals[i].t != JV_DICT) return jctx_err(c, ANNA_EINVAL, "argument after ** must be a mapping");
      nkw += vals[i].u.d->n;
    } else if (k->kind == JN_KWARG)
      nkw++;
    else
      npos++;
  }
  a->pos = jarena_alloc(&c->a, (npos + 1) * sizeof(jv));
  a->kwv = jarena_alloc(&c->a, (nkw + 1) * sizeof(jv));
  a->kwn = jarena_alloc(&c->a, (nkw + 1) * sizeof(jstr *));
  if (!a->pos || !a->kwv || !a->kwn) return jctx_nomem(c);
  for (size_t i = 0; i < nkids; i++) {
    const jnode *k = kids[i];
    if (k->kind == JN_SPLAT && k->op == 1) {
      for (size_t j = 0; j < vals[i].u.l->n; j++) a->pos[a->npos++] = vals[i].u.l->items[j];
    } else if (k->kind == JN_SPLAT) {
      jdict *d = vals[i].u.d;
      for (size_t j = 0; j < d->n; j++) {
        if (d->keys[j].t != JV_STR) return jctx_err(c, ANNA_EINVAL, "keywords must be strings");
        a->kwn[a->nkw] = d->keys[j].u.s;
        a->kwv[a->nkw++] = d->vals[j];
      }
    } else if (k->kind == JN_KWARG) {
      a->kwn[a->nkw] = k->str;
      a->kwv[a->nkw++] = vals[i];
    } else
      a->pos[a->npos++] = vals[i];
  }
  return 0;
}

static int py_floordiv(int64_t a, int64_t b, int64_t *q) {
  if (b == -1 && a == INT64_MIN) return -1;
  int64_t d = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) d--;
  *q = d;
  return 0;
}

static int is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double num(jv v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : v.u.b; }
static int64_t inum(jv v) { return v.t == JV_INT ? v.u.i : v.u.b; }

static int repeat_seq(jctx *c, jv seq, int64_t times, jv *out) {
  if (times < 0) times = 0;
  if (seq.t == JV_STR) {
    size_t len = seq.u.s->len;
    if (len && (uint64_t)times > c->lim.max_output / len)
      return jctx_err(c, ANNA_ERANGE, "string repetition too large");
    jstr *r = jarena_alloc(&c->a, sizeof(jstr) + len * (size_t)times + 1);
    if (!r) return jctx_nomem(c);
    for (int64_t i = 0; i < times; i++) memcpy(r->s + len * (size_t)i, seq.u.s->s, len);
    r->len = len * (size_t)times;
    r->s[r->len] = 0;
    *out = (jv){.t = JV_STR, .u.s = r};
    return 0;
  }
  size_t n = seq.u.l->n;
  if (n && (uint64_t)times > (uint64_t)c->lim.max_steps / n)
    return jctx_err(c, ANNA_ERANGE, "list repetition too large");
  jlist *l = jlist_new(&c->a, n * (size_t)times);
  if (!l) return jctx_nomem(c);
  for (int64_t i = 0; i < times; i++)
    for (size_t k = 0; k < n; k++) l->items[l->n++] = seq.u.l->items[k];
  *out = (jv){.t = JV_LIST, .u.l = l};
  return 0;
}

static int binop(jctx *c, int op, jv a, jv b, jv *out) {
  int crc = jctx_charge(c, a);
  if (!crc) crc = jctx_charge(c, b);
  if (crc) return crc;
  if (is_num(a) && is_num(b)) {
    int fl = a.t == JV_FLOAT || b.t == JV_FLOAT;
    int64_t x = inum(a), y = inum(b), r;
    double fx = num(a), fy = num(b);
    switch (op) {
    case JOP_ADD:
      if (!fl && !__builtin_add_overflow(x, y, &r)) *out = jv_int(r);
      else *out = jv_float(fx + fy);
      return 0;
    case JOP_SUB:
      if (!fl && !__builtin_sub_overflow(x, y, &r)) *out = jv_int(r);
      else *out = jv_float(fx - fy);
      return 0;
    case JOP_MUL:
      if (!fl && !__builtin_mul_overflow(x, y, &r)) *out = jv_int(r);
      else *out = jv_float(fx * fy);
      return 0;
    case JOP_DIV:
      if (fy == 0) return jctx_err(c, ANNA_EINVAL, "division by zero");
      *out = jv_float(fx / fy);
      return 0;
    case JOP_FLOORDIV:
    case JOP_MOD:
      if (fy == 0) return jctx_err(c, ANNA_EINVAL, "integer division or modulo by zero");
      if (!fl) {
        int64_t q;
        if (py_floordiv(x, y, &q)) {
          *out = jv_float(op == JOP_MOD ? 0.0 : -(double)x);
          return 0;
        }
        *out = jv_int(op == JOP_FLOORDIV ? q : x - q * y);
      } else {
        double q = floor(fx / fy);
        if (op == JOP_FLOORDIV) *out = jv_float(q);
        else {
          double m = fmod(fx, fy);
          if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
          *out = jv_float(m);
        }
      }
      return 0;
    case JOP_POW:
      if (!fl && y >= 0) {
        int64_t acc = 1, base = x;
        int64_t e = y;
        int ovf = 0;
        while (e > 0 && !ovf) {
          if (e & 1) ovf |= __builtin_mul_overflow(acc, base, &acc);
          e >>= 1;
          if (e) ovf |= __builtin_mul_overflow(base, base, &base);
        }
        if (!ovf) {
          *out = jv_int(acc);
          return 0;
        }
      }
      *out = jv_float(pow(fx, fy));
      return 0;
    }
  }
  if (op == JOP_ADD && a.t == JV_STR && b.t == JV_STR && (a.u.s->markup || b.u.s->markup)) {
    /* Markup.__add__/__radd__ escape the plain side, as jinja2 does for `x|safe + y` */
    jv ea = a, eb = b;
    jargs none = {0};
    int rc = 0;
    if (!a.u.s->markup) rc = jinja_apply_filter(c, "escape", a, &none, &ea);
    if (!rc && !b.u.s->markup) rc = jinja_apply_filter(c, "escape", b, &none, &eb);
    if (rc) return rc;
    size_t n = ea.u.s->len + eb.u.s->len;
    jstr *r = jarena_alloc(&c->a, sizeof(jstr) + n + 1);
    if (!r) return jctx_nomem(c);
    memcpy(r->s, ea.u.s->s, ea.u.s->len);
    memcpy(r->s + ea.u.s->len, eb.u.s->s, eb.u.s->len);
    r->len = n;
    r->s[n] = 0;
    r->markup = 1;
    *out = (jv){.t = JV_STR, .u.s = r};
    return 0;
  }
  if (op == JOP_ADD && a.t == JV_STR && b.t == JV_STR) {
    size_t n = a.u.s->len + b.u.s->len;
    jstr *r = jarena_alloc(&c->a, sizeof(jstr) + n + 1);
    if (!r) return jctx_nomem(c);
    memcpy(r->s, a.u.s->s, a.u.s->len);
    memcpy(r->s + a.u.s->len, b.u.s->s, b.u.s->len);
    r->len = n;
    r->s[n] = 0;
    *out = (jv){.t = JV_STR, .u.s = r};
    return 0;
  }
  if (op == JOP_ADD && a.t == JV_LIST && b.t == JV_LIST) {
    jlist *l = jlist_new(&c->a, a.u.l->n + b.u.l->n);
    if (!l) return jctx_nomem(c);
    for (size_t i = 0; i < a.u.l->n; i++) l->items[l->n++] = a.u.l->items[i];
    for (size_t i = 0; i < b.u.l->n; i++) l->items[l->n++] = b.u.l->items[i];
    l->is_tuple = a.u.l->is_tuple;
    *out = (jv){.t = JV_LIST, .u.l = l};
    return 0;
  }
  if (op == JOP_MOD && a.t == JV_STR) { /* printf-style 'fmt' % args */
    jargs fa = {0};
    if (b.t == JV_LIST && b.u.l->is_tuple) {
      fa.pos = b.u.l->items;
      fa.npos = b.u.l->n;
    } else {
      fa.pos = &b;
      fa.npos = 1;
    }
    return jinja_apply_filter(c, "format", a, &fa, out);
  }
  if (op == JOP_MUL && (a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL))
    return repeat_seq(c, a, inum(b), out);
  if (op == JOP_MUL && (b.t == JV_STR || b.t == JV_LIST) && (a.t == JV_INT || a.t == JV_BOOL))
    return repeat_seq(c, b, inum(a), out);
  static const char *names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
  return jctx_err(c, ANNA_EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'",
                  op >= 1 && op <= 7 ? names[op] : "?", jv_type_name(a), jv_type_name(b));
}

static int contains(jctx *c, jv container, jv item, int *res) {
  int rc = jctx_charge(c, container);
  if (rc) return rc;
  switch (container.t) {
  case JV_STR:
    if (item.t != JV_STR)
      return jctx_err(c, ANNA_EINVAL, "'in <string>' requires string as left operand, not %s",
                      jv_type_name(item));
    *res = item.u.s->len == 0 ||
           memmem(container.u.s->s, container.u.s->len, item.u.s->s, item.u.s->len) != NULL;
    return 0;
  case JV_LIST:
    *res = 0;
    for (size_t i = 0; i < container.u.l->n && !*res; i++) *res = jv_equal(container.u.l->items[i], item);
    return 0;
  case JV_DICT:
    *res = jdict_getv(container.u.d, item) != NULL;
    return 0;
  case JV_UNDEF: *res = 0; return 0;
  default:
    return jctx_err(c, ANNA_EINVAL, "argument of type '%s' is not iterable", jv_type_name(container));
  }
}

static int compare(jctx *c, int op, jv a, jv b, int *res) {
  switch (op) {
  case JOP_EQ:
  case JOP_NE: {
    int rc = jctx_charge(c, a);
    if (rc) return rc;
    *res = jv_equal(a, b) == (op == JOP_EQ);
    return 0;
  }
  case JOP_IN: return contains(c, b, a, res);
  case JOP_NOTIN: {
    int rc = contains(c, b, a, res);
    *res = !*res;
    return rc;
  }
  default: {
    int cmp;
    if (jv_compare(a, b, &cmp))
      return jctx_err(c, ANNA_EINVAL, "'%s' not supported between instances of '%s' and '%s'",
                      op == JOP_LT ? "<" : op == JOP_LE ? "<=" : op == JOP_GT ? ">" : ">=",
                      jv_type_name(a), jv_type_name(b));
    *res = op == JOP_LT ? cmp < 0 : op == JOP_LE ? cmp <= 0 : op == JOP_GT ? cmp > 0 : cmp >= 0;
    return 0;
  }
  }
}

/* Python slice index normalisation. */
static int64_t slice_idx(jv v, int64_t len, int64_t def, int step_neg) {
  if (v.t == JV_UNDEF || v.t == JV_NONE) return def;
  int64_t i = inum(v);
  if (i < 0) {
    i += len;
    if (i < 0) i = step_neg ? -1 : 0;
  } else if (i >= len)
    i = step_neg ? len - 1 : len;
  return i;
}

static int eval_slice(jctx *c, jscope *s, const jnode *n, jv *out) {
  jv obj, parts[3];
  int rc = eval(c, s, n->a, &obj);
  if (rc) return rc;
  for (int i = 0; i < 3; i++) {
    parts[i] = jv_none();
    if (n->kids[i] && (rc = eval(c, s, n->kids[i], &parts[i]))) return rc;
    if (parts[i].t != JV_NONE && parts[i].t != JV_INT && parts[i].t != JV_BOOL)
      return jctx_err(c, ANNA_EINVAL, "slice indices must be integers or None");
  }
  int64_t stp = parts[2].t == JV_NONE ? 1 : inum(parts[2]);
  if (stp == 0) return jctx_err(c, ANNA_EINVAL, "slice step cannot be zero");
  jlist *items = NULL;
  int is_str = obj.t == JV_STR;
  if (obj.t == JV_UNDEF) {
    *out = jv_undef();
    return 0;
  }
  if (obj.t != JV_STR && obj.t != JV_LIST)
    return jctx_err(c, ANNA_EINVAL, "'%s' object is not subscriptable", jv_type_name(obj));
  if ((rc = jinja_to_list(c, obj, &items))) return rc;
  int64_t len = (int64_t)items->n;
  int64_t start = slice_idx(parts[0], len, stp > 0 ? 0 : len - 1, stp < 0);
  int64_t stop = slice_idx(parts[1], len, stp > 0 ? len : -1, stp < 0);
  jlist *r = jlist_new(&c->a, 0);
  if (!r) return jctx_nomem(c);
  for (int64_t i = start; stp > 0 ? i < stop : i > stop; i += stp)
    if (jlist_push(&c->a, r, items->items[i])) return jctx_nomem(c);
  if (is_str) {
    jbuf b = {0};
    for (size_t i = 0; i < r->n; i++) jbuf_put(&b, r->items[i].u.s->s, r->items[i].u.s->len);
    if (check_out(c, &b)) return jbuf_free(&b), -1;
    *out = jv_str(&c->a, b.p ? b.p : "", b.n);
    jbuf_free(&b);
    return out->t == JV_STR ? 0 : jctx_nomem(c);
  }
  r->is_tuple = obj.u.l->is_tuple;
  *out = (jv){.t = JV_LIST, .u.l = r};
  return 0;
}

static int call_value(jctx *c, jv callee, const jargs *a, jv *out) {
  switch (callee.t) {
  case JV_MACRO: return jinja_call_macro(c, callee, a, out);
  case JV_BUILTIN: return jinja_call_builtin(c, callee.u.fn, a, out);
  case JV_METHOD: return jinja_call_method(c, callee.u.m->self, callee.u.m->name, a, out);
  default: return jctx_err(c, ANNA_EINVAL, "'%s' object is not callable", jv_type_name(callee));
  }
}

static int eval(jctx *c, jscope *s, const jnode *n, jv *out) {
  int rc = 0;
  int saved_line = c->line;
  c->line = n->line;
  if (++c->depth > c->lim.max_depth) {
    c->depth--;
    return jctx_err(c, ANNA_ERANGE, "expression or call nesting too deep");
  }
  switch (n->kind) {
  case JN_LIT: *out = n->lit; break;
  case JN_NAME: {
    int found;
    *out = scope_lookup(s, n->str, &found);
    if (!found) {
      int id = jinja_global_id(n->str->s, n->str->len);
      *out = id >= 0 ? (jv){.t = JV_BUILTIN, .u.fn = id} : jv_undef();
    }
    break;
  }
  case JN_GETATTR: {
    jv obj;
    if (!(rc = eval(c, s, n->a, &obj))) *out = jinja_getattr(c, obj, n->str->s, n->str->len);
    if (!rc && c->failed) rc = ANNA_ENOMEM;
    break;
  }
  case JN_GETITEM: {
    jv obj, key;
    if (!(rc = eval(c, s, n->a, &obj)) && !(rc = eval(c, s, n->b, &key)))
      *out = jinja_getitem(c, obj, key);
    if (!rc && c->failed) rc = ANNA_ENOMEM;
    break;
  }
  case JN_SLICE: rc = eval_slice(c, s, n, out); break;
  case JN_CALL: {
    jv callee;
    jargs a;
    if ((rc = eval(c, s, n->a, &callee))) break;
    if (callee.t == JV_UNDEF) {
      c->line = n->line;
      if (n->a->kind == JN_GETATTR) {
        jv obj;
        if ((rc = eval(c, s, n->a->a, &obj))) break;
        rc = jctx_err(c, ANNA_EINVAL, "'%s' object has no attribute '%s'", jv_type_name(obj), n->a->str->s);
      } else if (n->a->kind == JN_NAME)
        rc = jctx_err(c, ANNA_EINVAL, "'%s' is undefined", n->a->str->s);
      else
        rc = jctx_err(c, ANNA_EINVAL, "'Undefined' object is not callable");
      break;
    }
    if ((rc = eval_args(c, s, n->kids, n->nkids, &a))) break;
    c->line = n->line;
    if ((rc = step(c))) break;
    rc = call_value(c, callee, &a, out);
    break;
  }
  case JN_FILTER: {
    jv v;
    jargs a;
    if ((rc = eval(c, s, n->a, &v))) break;
    if ((rc = eval_args(c, s, n->kids, n->nkids, &a))) break;
    c->line = n->line;
    rc = jinja_apply_filter(c, n->str->s, v, &a, out);
    break;
  }
  case JN_TEST: {
    jv v;
    jargs a;
    int r = 0;
    if ((rc = eval(c, s, n->a, &v))) break;
    if ((rc = eval_args(c, s, n->kids, n->nkids, &a))) break;
    c->line = n->line;
    if ((rc = jinja_apply_test(c, n->str->s, v, &a, &r))) break;
    *out = jv_bool(n->op ? !r : r);
    break;
  }
  case JN_BINOP: {
    jv a, b;
    if (!(rc = eval(c, s, n->a, &a)) && !(rc = eval(c, s, n->b, &b))) {
      c->line = n->line;
      rc = binop(c, n->op, a, b, out);
    }
    break;
  }
  case JN_CMP: {
    jv left, right;
    int r = 1;
    if ((rc = eval(c, s, n->a, &left))) break;
    for (size_t i = 0; i < n->nkids && r; i++) {
      if ((rc = eval(c, s, n->kids[i], &right))) break;
      c->line = n->line;
      if ((rc = compare(c, n->cmpops[i], left, right, &r))) break;
      left = right;
    }
    if (!rc) *out = jv_bool(r);
    break;
  }
  case JN_NOT: {
    jv v;
    if (!(rc = eval(c, s, n->a, &v))) *out = jv_bool(!jv_truthy(v));
    break;
  }
  case JN_NEG:
  case JN_POS: {
    jv v;
    if ((rc = eval(c, s, n->a, &v))) break;
    if (!is_num(v)) {
      rc = jctx_err(c, ANNA_EINVAL, "bad operand type for unary %s: '%s'",
                    n->kind == JN_NEG ? "-" : "+", jv_type_name(v));
      break;
    }
    if (n->kind == JN_POS) *out = v.t == JV_BOOL ? jv_int(v.u.b) : v;
    else if (v.t == JV_FLOAT) *out = jv_float(-v.u.f);
    else if (inum(v) == INT64_MIN) *out = jv_float(-(double)INT64_MIN);
    else *out = jv_int(-inum(v));
    break;
  }
  case JN_AND:
  case JN_OR: {
    jv a;
    if ((rc = eval(c, s, n->a, &a))) break;
    int t = jv_truthy(a);
    if ((n->kind == JN_AND && !t) || (n->kind == JN_OR && t)) *out = a;
    else rc = eval(c, s, n->b, out);
    break;
  }
  case JN_COND: {
    jv cond;
    if ((rc = eval(c, s, n->a, &cond))) break;
    if (jv_truthy(cond)) rc = eval(c, s, n->b, out);
    else if (n->c) rc = eval(c, s, n->c, out);
    else *out = jv_undef();
    break;
  }
  case JN_LIST:
  case JN_TUPLE: {
    jlist *l = jlist_new(&c->a, n->nkids);
    if (!l) {
      rc = jctx_nomem(c);
      break;
    }
    l->is_tuple = n->kind == JN_TUPLE;
    for (size_t i = 0; i < n->nkids && !rc; i++) rc = eval(c, s, n->kids[i], &l->items[l->n++]);
    *out = (jv){.t = JV_LIST, .u.l = l};
    break;
  }
  case JN_DICT: {
    jdict *d = jdict_new(&c->a, n->nkids / 2);
    if (!d) {
      rc = jctx_nomem(c);
      break;
    }
    for (size_t i = 0; i + 1 < n->nkids && !rc; i += 2) {
      jv k, v;
      if ((rc = eval(c, s, n->kids[i], &k)) || (rc = eval(c, s, n->kids[i + 1], &v))) break;
      if (k.t != JV_STR && k.t != JV_INT && k.t != JV_FLOAT && k.t != JV_BOOL && k.t != JV_NONE &&
          !(k.t == JV_LIST && k.u.l->is_tuple))
        rc = jctx_err(c, ANNA_EINVAL, "unhashable type: '%s'", jv_type_name(k));
      else if (jdict_setv(&c->a, d, k, v))
        rc = jctx_nomem(c);
    }
    *out = (jv){.t = JV_DICT, .u.d = d};
    break;
  }
  case JN_CONCAT: {
    jbuf b = {.limit = c->lim.max_output};
    for (size_t i = 0; i < n->nkids && !rc; i++) {
      jv v;
      if (!(rc = eval(c, s, n->kids[i], &v)) && !(rc = jctx_charge(c, v))) jv_print(&b, v);
    }
    if (!rc) rc = check_out(c, &b);
    if (!rc) {
      *out = jv_str(&c->a, b.p ? b.p : "", b.n);
      if (out->t != JV_STR) rc = jctx_nomem(c);
    }
    jbuf_free(&b);
    break;
  }
  default: rc = jctx_err(c, ANNA_EINVAL, "statement used as an expression");
  }
  c->depth--;
  if (!rc) c->line = saved_line;
  return rc;
}

/* ---- statements ---- */
static int assign(jctx *c, jscope *s, const jnode *target, jv v) {
  if (target->kind == JN_NAME) return scope_set(c, s, target->str, v);
  if (target->kind == JN_GETATTR) {
    jv ns;
    int rc = eval(c, s, target->a, &ns);
    if (rc) return rc;
    if (ns.t != JV_DICT || !ns.u.d->is_ns)
      return jctx_err(c, ANNA_EINVAL, "cannot assign attribute on non-namespace object");
    if (jdict_set(&c->a, ns.u.d, target->str, v)) return jctx_nomem(c);
    return 0;
  }
  /* tuple unpacking */
  if (v.t != JV_LIST) {
    jlist *l;
    int rc = jinja_to_list(c, v, &l);
    if (rc) return rc;
    v = (jv){.t = JV_LIST, .u.l = l};
  }
  if (v.u.l->n != target->nkids)
    return jctx_err(c, ANNA_EINVAL, "cannot unpack %zu values into %zu names", v.u.l->n, target->nkids);
  for (size_t i = 0; i < target->nkids; i++) {
    int rc = assign(c, s, target->kids[i], v.u.l->items[i]);
    if (rc) return rc;
  }
  return 0;
}

/* Renders body into a fresh buffer and returns it as a string value. */
static int capture(jctx *c, jscope *s, const jnode *body, jv *out) {
  jbuf b = {.limit = c->lim.max_output};
  jbuf *saved = c->out;
  c->out = &b;
  int rc = exec_body(c, s, body);
  c->out = saved;
  if (!rc) rc = check_out(c, &b);
  if (!rc) {
    *out = jv_str(&c->a, b.p ? b.p : "", b.n);
    if (out->t != JV_STR) rc = jctx_nomem(c);
  }
  jbuf_free(&b);
  return rc;
}

/* Applies a filter chain whose innermost operand is JN_BLOCKVAL to v. */
static int apply_chain(jctx *c, jscope *s, const jnode *f, jv v, jv *out) {
  if (f->kind == JN_BLOCKVAL) {
    *out = v;
    return 0;
  }
  jv inner;
  int rc = apply_chain(c, s, f->a, v, &inner);
  if (rc) return rc;
  jargs a;
  if ((rc = eval_args(c, s, f->kids, f->nkids, &a))) return rc;
  c->line = f->line;
  return jinja_apply_filter(c, f->str->s, inner, &a, out);
}

static int set_loop_vars(jctx *c, jdict *loop, jlist *items, size_t i) {
  size_t n = items->n;
  jv vals[10] = {
      jv_int((int64_t)i + 1),
      jv_int((int64_t)i),
      jv_int((int64_t)(n - i)),
      jv_int((int64_t)(n - i - 1)),
      jv_bool(i == 0),
      jv_bool(i + 1 == n),
      jv_int((int64_t)n),
      i > 0 ? items->items[i - 1] : jv_undef(),
      i + 1 < n ? items->items[i + 1] : jv_undef(),
      jv_int(1),
  };
  static const char *names[10] = {"index", "index0", "revindex", "revindex0", "first",
                                  "last", "length", "previtem", "nextitem", "depth"};
  if (loop->n == 0) {
    for (int k = 0; k < 10; k++) {
      jstr *ks = jstr_new(&c->a, names[k], strlen(names[k]));
      if (!ks || jdict_set(&c->a, loop, ks, vals[k])) return jctx_nomem(c);
    }
    jstr *ks = jstr_new(&c->a, "depth0", 6);
    if (!ks || jdict_set(&c->a, loop, ks, jv_int(0))) return jctx_nomem(c);
    jmethod *cyc = jarena_alloc(&c->a, sizeof(*cyc));
    ks = jstr_new(&c->a, "cycle", 5);
    if (!cyc || !ks) return jctx_nomem(c);
    cyc->self = (jv){.t = JV_DICT, .u.d = loop};
    cyc->name = "cycle";
    if (jdict_set(&c->a, loop, ks, (jv){.t = JV_METHOD, .u.m = cyc})) return jctx_nomem(c);
  } else {
    for (int k = 0; k < 10; k++) loop->vals[k] = vals[k];
  }
  return 0;
}

static int exec_for(jctx *c, jscope *s, const jnode *n) {
  jv it;
  int rc = eval(c, s, n->a, &it);
  if (rc) return rc;
  c->line = n->line;
  if (it.t == JV_NONE) return jctx_err(c, ANNA_EINVAL, "'NoneType' object is not iterable");
  jlist *items;
  if ((rc = jinja_to_list(c, it, &items))) return rc;
  jscope *body_scope = scope_new(c, s);
  if (!body_scope) return jctx_nomem(c);
  jnode target = {.kind = JN_TUPLE, .line = n->line, .kids = n->kids, .nkids = n->nkids};
  const jnode *tg = n->nkids == 1 ? n->kids[0] : &target;
  if (n->d) { /* `for x in y if cond`: filter first, so loop.* counts only kept items */
    jlist *kept = jlist_new(&c->a, items->n);
    if (!kept) return jctx_nomem(c);
    for (size_t i = 0; i < items->n; i++) {
      if ((rc = step(c))) return rc;
      body_scope->vars->n = 0;
      jv cond;
      if ((rc = assign(c, body_scope, tg, items->items[i])) || (rc = eval(c, body_scope, n->d, &cond)))
        return rc;
      if (jv_truthy(cond)) kept->items[kept->n++] = items->items[i];
    }
    items = kept;
  }
  if (items->n == 0) return n->c ? exec_body(c, s, n->c) : 0;
  jdict *loop = jdict_new(&c->a, 12);
  jstr *loop_name = jstr_new(&c->a, "loop", 4);
  if (!loop || !loop_name) return jctx_nomem(c);
  /* Snapshot: a body that appends to the list being iterated must not loop forever. */
  size_t count = items->n;
  jlist snap = *items;
  snap.n = count;
  for (size_t i = 0; i < count; i++) {
    c->line = n->line;
    if ((rc = step(c))) return rc;
    body_scope->vars->n = 0; /* fresh scope per iteration, storage reused */
    if ((rc = set_loop_vars(c, loop, &snap, i))) return rc;
    if ((rc = scope_set(c, body_scope, loop_name, (jv){.t = JV_DICT, .u.d = loop}))) return rc;
    if ((rc = assign(c, body_scope, tg, snap.items[i]))) return rc;
    if ((rc = exec_body(c, body_scope, n->b))) return rc;
    if (c->flow == JFLOW_BREAK) {
      c->flow = JFLOW_NONE;
      break;
    }
    c->flow = JFLOW_NONE;
  }
  return 0;
}

static int exec_stmt(jctx *c, jscope *s, const jnode *n) {
  c->line = n->line;
  int rc = step(c);
  if (rc) return rc;
  switch (n->kind) {
  case JN_TEXT: jbuf_put(c->out, n->str->s, n->str->len); return check_out(c, c->out);
  case JN_OUTPUT: {
    jv v;
    if ((rc = eval(c, s, n->a, &v))) return rc;
    jv_print(c->out, v);
    return check_out(c, c->out);
  }
  case JN_BODY: return exec_body(c, s, n);
  case JN_IF:
    for (; n && n->kind == JN_IF; n = n->c) { /* elif chain, iteratively */
      jv cond;
      c->line = n->line;
      if ((rc = eval(c, s, n->a, &cond))) return rc;
      if (jv_truthy(cond)) return exec_body(c, s, n->b);
    }
    return n ? exec_body(c, s, n) : 0;
  case JN_FOR: return exec_for(c, s, n);
  case JN_SET: {
    jv v;
    if ((rc = eval(c, s, n->b, &v))) return rc;
    c->line = n->line;
    return assign(c, s, n->a, v);
  }
  case JN_SET_BLOCK: {
    jv v;
    if ((rc = capture(c, s, n->b, &v))) return rc;
    if (n->d && (rc = apply_chain(c, s, n->d, v, &v))) return rc;
    return assign(c, s, n->a, v);
  }
  case JN_FILTER_BLOCK: {
    jv v, r;
    if ((rc = capture(c, s, n->b, &v)) || (rc = apply_chain(c, s, n->a, v, &r))) return rc;
    jv_print(c->out, r);
    return check_out(c, c->out);
  }
  case JN_MACRO: {
    jmacro *m = jarena_alloc(&c->a, sizeof(*m));
    if (!m) return jctx_nomem(c);
    m->def = n;
    m->closure = s;
    return scope_set(c, s, n->str, (jv){.t = JV_MACRO, .u.mac = m});
  }
  case JN_CALL_BLOCK: {
    jmacro *m = jarena_alloc(&c->a, sizeof(*m));
    if (!m) return jctx_nomem(c);
    m->def = n->d;
    m->closure = s;
    jv callee, r;
    jargs a;
    if ((rc = eval(c, s, n->a->a, &callee)) || (rc = eval_args(c, s, n->a->kids, n->a->nkids, &a))) return rc;
    if (callee.t != JV_MACRO) return jctx_err(c, ANNA_EINVAL, "call block needs a macro");
    c->next_caller = (jv){.t = JV_MACRO, .u.mac = m};
    if ((rc = jinja_call_macro(c, callee, &a, &r))) return rc;
    jv_print(c->out, r);
    return check_out(c, c->out);
  }
  case JN_BREAK: c->flow = JFLOW_BREAK; return 0;
  case JN_CONTINUE: c->flow = JFLOW_CONTINUE; return 0;
  default: return jctx_err(c, ANNA_EINVAL, "unexpected node in statement position");
  }
}

static int exec_body(jctx *c, jscope *s, const jnode *n) {
  if (++c->depth > c->lim.max_depth) {
    c->depth--;
    return jctx_err(c, ANNA_ERANGE, "template nesting too deep");
  }
  int rc = 0;
  for (size_t i = 0; i < n->nkids && !rc && c->flow == JFLOW_NONE; i++) rc = exec_stmt(c, s, n->kids[i]);
  c->depth--;
  return rc;
}

int jinja_call_macro(jctx *c, jv mac, const jargs *a, jv *out) {
  const jnode *def = mac.u.mac->def;
  jv caller = c->next_caller;
  c->next_caller = jv_undef();
  if (a->npos > def->nkids)
    return jctx_err(c, ANNA_EINVAL, "macro '%s' takes not more than %zu argument(s)", def->str->s,
                    def->nkids);
  jscope *ms = scope_new(c, mac.u.mac->closure);
  if (!ms) return jctx_nomem(c);
  for (size_t k = 0; k < a->nkw; k++) {
    int ok = 0;
    for (size_t i = 0; i < def->nkids && !ok; i++)
      ok = jstr_eq(def->kids[i]->str, a->kwn[k]->s, a->kwn[k]->len);
    if (!ok)
      return jctx_err(c, ANNA_EINVAL, "macro '%s' has no parameter named '%s'", def->str->s,
                      a->kwn[k]->s);
  }
  int call_line = c->line;
  for (size_t i = 0; i < def->nkids; i++) {
    const jnode *prm = def->kids[i];
    int found;
    jv v = jargs_get(a, i, prm->str->s, &found);
    if (!found && prm->a) {
      int rc = eval(c, ms, prm->a, &v);
      if (rc) return rc;
    }
    int rc = scope_set(c, ms, prm->str, v);
    if (rc) return rc;
  }
  if (caller.t == JV_MACRO) {
    jstr *cn = jstr_new(&c->a, "caller", 6);
    if (!cn) return jctx_nomem(c);
    int rc = scope_set(c, ms, cn, caller);
    if (rc) return rc;
  }
  if (++c->depth > c->lim.max_depth) {
    c->depth--;
    return jctx_err(c, ANNA_ERANGE, "macro recursion too deep");
  }
  int saved_flow = c->flow;
  c->flow = JFLOW_NONE;
  int rc = capture(c, ms, def->b, out);
  c->flow = saved_flow;
  c->depth--;
  if (!rc) c->line = call_line;
  return rc;
}

int jinja_template_render_ex(const jinja_template *tpl, const json_t *vars,
                             const jinja_limits *limits, char **out, size_t *out_len, char *err,
                             size_t errlen) {
  if (!out) return anna_err(err, errlen, ANNA_EINVAL, "jinja_template_render: out is NULL");
  *out = NULL;
  if (out_len) *out_len = 0;
  if (!tpl || !tpl->root) return anna_err(err, errlen, ANNA_EINVAL, "jinja_template_render: no template");
  if (vars && !json_is_object(vars))
    return anna_err(err, errlen, ANNA_EINVAL, "jinja_template_render: vars must be a JSON object");
  jctx c = {.err = err, .errlen = errlen, .line = 1};
  if (limits) c.lim = *limits;
  if (!c.lim.max_output) c.lim.max_output = DEFAULT_MAX_OUTPUT;
  if (!c.lim.max_steps) c.lim.max_steps = DEFAULT_MAX_STEPS;
  if (!c.lim.max_depth) c.lim.max_depth = DEFAULT_MAX_DEPTH;
  if (!c.lim.max_memory) c.lim.max_memory = DEFAULT_MAX_MEMORY;
  c.a.limit = c.lim.max_memory;
  jbuf b = {.limit = c.lim.max_output};
  c.out = &b;
  int rc = 0;
  c.globals = scope_new(&c, NULL);
  jscope *root = c.globals ? scope_new(&c, c.globals) : NULL;
  if (!root) rc = jctx_nomem(&c);
  if (!rc && vars) {
    jv v = jv_from_json(&c.a, vars, 0);
    if (v.t != JV_DICT) rc = jctx_nomem(&c);
    else c.globals->vars = v.u.d;
  }
  if (!rc) rc = exec_body(&c, root, tpl->root);
  if (!rc) rc = check_out(&c, &b);
  if (rc && !c.failed) anna_err(err, errlen, rc, "template render failed");
  jarena_free_all(&c.a);
  if (rc) {
    jbuf_free(&b);
    return rc < 0 ? rc : ANNA_EINVAL;
  }
  if (!b.p) {
    b.p = calloc(1, 1);
    if (!b.p) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  *out = b.p;
  if (out_len) *out_len = b.n;
  return 0;
}

int jinja_template_render(const jinja_template *tpl, const json_t *vars, char **out,
                          size_t *out_len, char *err, size_t errlen) {
  return jinja_template_render_ex(tpl, vars, NULL, out, out_len, err, errlen);
}
