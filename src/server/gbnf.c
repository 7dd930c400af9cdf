/* gbnf.c: GBNF parser, compiler and pushdown recognizer (see gbnf.h).
 *
 * Compiled form (as llama.cpp's): every alternative of every rule is a run of elements ended
 * by an END element; an element is a character class or a reference to a rule. Repetitions
 * and groups become generated rules (X* is R ::= X R | empty). A parse stack holds element
 * indices: the top is the next element to match, the ones below where to go on once the rule
 * the top belongs to is finished. Stacks are kept "expanded": their top is a character
 * class, or the stack is empty (the whole grammar matched). */
#include "gbnf.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { E_END, E_CHAR, E_REF };

typedef struct gel {
  uint8_t type;
  uint8_t neg; /* E_CHAR: a negated class */
  uint16_t nr; /* E_CHAR: ranges */
  uint32_t a;  /* E_CHAR: first range in rng; E_REF: the rule */
} gel;

struct gbnf {
  int refs;
  uint64_t id; /* unique per compile: the mask cache's key (an address may be reused) */
  pthread_mutex_t mu;
  gel *el; /* el[0] = REF root, el[1] = END: the start stack */
  int nel;
  uint32_t *rng; /* [lo, hi] pairs */
  int nrng;
  int nrules;
  int *rule_alt; /* [nrules + 1] rule r's alternatives are alt[rule_alt[r] .. rule_alt[r + 1]) */
  int *alt;      /* an alternative's first element */
  /* Every range's lo and hi + 1, sorted and unique: code points between two cuts are alike
   * for every class of the grammar (the mask memoizes transitions by that interval). */
  uint32_t *cuts;
  int ncuts;
};

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* The interval of code point c between the grammar's cuts. */
static uint32_t cp_interval(const gbnf *g, uint32_t c) {
  int lo = 0, hi = g->ncuts; /* the number of cuts <= c */
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (g->cuts[mid] <= c)
      lo = mid + 1;
    else
      hi = mid;
  }
  return (uint32_t)lo;
}

/* ---- parsing into a tree of rules ---- */

typedef struct pitem { /* an element while parsing */
  uint8_t type, neg;
  int rule;   /* E_REF */
  int r0, nr; /* E_CHAR: ranges in the parser's rng */
} pitem;

typedef struct pseq {
  pitem *it;
  int n, cap;
} pseq;

typedef struct prule {
  char *name; /* NULL: generated */
  int defined;
  const char *where; /* first reference or the definition, for errors */
  pseq *alts;
  int n, cap;
} prule;

typedef struct parser {
  const char *text, *end, *p;
  prule *rules;
  int nrules, caprules;
  uint32_t *rng;
  int nrng, caprng;
  char *err;
  size_t errlen;
  int failed, oom;
} parser;

static void where_of(const parser *ps, const char *at, int *line, int *col) {
  *line = 1;
  *col = 1;
  for (const char *q = ps->text; q < at && q < ps->end; q++) {
    if (*q == '\n') {
      (*line)++;
      *col = 1;
    } else if (((unsigned char)*q & 0xc0) != 0x80) {
      (*col)++;
    }
  }
}

static int fail_at(parser *ps, const char *at, const char *fmt, ...) {
  if (ps->failed) return -1;
  ps->failed = 1;
  int line, col;
  where_of(ps, at, &line, &col);
  int k = snprintf(ps->err, ps->errlen, "line %d, column %d: ", line, col);
  if (k >= 0 && (size_t)k < ps->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err + k, ps->errlen - (size_t)k, fmt, ap);
    va_end(ap);
  }
  return -1;
}

static int oom(parser *ps) {
  if (!ps->failed) snprintf(ps->err, ps->errlen, "out of memory");
  ps->failed = ps->oom = 1;
  return -1;
}

static int grow(void **p, int *cap, int need, size_t size) {
  if (need <= *cap) return 0;
  int nc = *cap ? *cap * 2 : 8;
  while (nc < need)
    nc *= 2;
  void *q = realloc(*p, (size_t)nc * size);
  if (!q) return -1;
  *p = q;
  *cap = nc;
  return 0;
}

static int new_rule(parser *ps, const char *name, size_t len, const char *where) {
  if (grow((void **)&ps->rules, &ps->caprules, ps->nrules + 1, sizeof *ps->rules)) return oom(ps);
  prule *r = &ps->rules[ps->nrules];
  memset(r, 0, sizeof *r);
  r->where = where;
  if (name) {
    r->name = malloc(len + 1);
    if (!r->name) return oom(ps);
    memcpy(r->name, name, len);
    r->name[len] = 0;
  }
  return ps->nrules++;
}

static int rule_by_name(parser *ps, const char *name, size_t len, const char *where) {
  for (int i = 0; i < ps->nrules; i++)
    if (ps->rules[i].name && strlen(ps->rules[i].name) == len &&
        !memcmp(ps->rules[i].name, name, len))
      return i;
  return new_rule(ps, name, len, where);
}

static int seq_push(parser *ps, pseq *s, pitem it) {
  if (grow((void **)&s->it, &s->cap, s->n + 1, sizeof *s->it)) return oom(ps);
  s->it[s->n++] = it;
  return 0;
}

/* Appends an alternative (taken over) to rule r. */
static int rule_add_alt(parser *ps, int r, pseq *s) {
  prule *R = &ps->rules[r];
  if (grow((void **)&R->alts, &R->cap, R->n + 1, sizeof *R->alts)) {
    free(s->it);
    return oom(ps);
  }
  R->alts[R->n++] = *s;
  memset(s, 0, sizeof *s);
  return 0;
}

static int add_range(parser *ps, uint32_t lo, uint32_t hi) {
  if (grow((void **)&ps->rng, &ps->caprng, 2 * (ps->nrng + 1), sizeof *ps->rng)) return oom(ps);
  ps->rng[2 * ps->nrng] = lo;
  ps->rng[2 * ps->nrng + 1] = hi;
  return ps->nrng++;
}

static int is_name_char(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

/* Skips blanks and comments; newlines too when nl. */
static void skip_space(parser *ps, int nl) {
  while (ps->p < ps->end) {
    char c = *ps->p;
    if (c == ' ' || c == '\t' || ((c == '\n' || c == '\r') && nl)) {
      ps->p++;
    } else if (c == '#') {
      while (ps->p < ps->end && *ps->p != '\n' && *ps->p != '\r')
        ps->p++;
    } else {
      break;
    }
  }
}

static int hexval(int c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* Decodes one UTF-8 character at p (in [p, end)); its length in *len, or -1. */
static long utf8_at(const char *p, const char *end, int *len) {
  unsigned c = (unsigned char)p[0];
  int n = c < 0x80                ? 1
          : c >= 0xc2 && c < 0xe0 ? 2
          : c >= 0xe0 && c < 0xf0 ? 3
          : c >= 0xf0 && c < 0xf5 ? 4
                                  : 0;
  if (!n || p + n > end) return -1;
  long v = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
  for (int k = 1; k < n; k++) {
    if (((unsigned char)p[k] & 0xc0) != 0x80) return -1;
    v = (v << 6) | (p[k] & 0x3f);
  }
  *len = n;
  return v;
}

/* One character of a literal or class, escapes decoded. */
static long parse_char(parser *ps) {
  const char *at = ps->p;
  if (ps->p >= ps->end) return fail_at(ps, at, "unexpected end of the grammar"), -1;
  if (*ps->p == '\\') {
    ps->p++;
    if (ps->p >= ps->end) return fail_at(ps, at, "unterminated escape"), -1;
    char c = *ps->p++;
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits) {
      long v = 0;
      for (int k = 0; k < digits; k++) {
        int h = ps->p < ps->end ? hexval((unsigned char)*ps->p) : -1;
        if (h < 0) return fail_at(ps, at, "'\\%c' needs %d hex digits", c, digits), -1;
        v = v * 16 + h;
        ps->p++;
      }
      if (v > 0x10ffff) return fail_at(ps, at, "escape beyond U+10FFFF"), -1;
      return v;
    }
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\\':
    case '"':
    case '\'':
    case '[':
    case ']':
    case '-':
    case '/':
    case '^':
    case '.': return (unsigned char)c;
    }
    return fail_at(ps, at, "unknown escape '\\%c'", c), -1;
  }
  int len;
  long v = utf8_at(ps->p, ps->end, &len);
  if (v < 0) return fail_at(ps, at, "invalid UTF-8"), -1;
  ps->p += len;
  return v;
}

static int parse_alternatives(parser *ps, int rule, int nested);

/* Replaces the last item of seq by its repetition m to n times (n < 0: unbounded): m copies,
 * then generated rules for the optional rest. */
static int repeat_item(parser *ps, pseq *seq, const char *at, long m, long n) {
  /* m copies, then (n - m) nested optional copies, or X* when n < 0 (unbounded). */
  pitem x = seq->it[--seq->n];
  for (long k = 0; k < m; k++)
    if (seq_push(ps, seq, x)) return -1;
  if (n >= 0 && n == m) return 0;
  /* tail: n < 0: R ::= X R | empty; else R1 ::= X | empty, Rk ::= X R(k-1) | empty */
  int prev = -1;
  long count = n < 0 ? 1 : n - m;
  for (long k = 0; k < count; k++) {
    int r = new_rule(ps, NULL, 0, at);
    if (r < 0) return -1;
    pseq a = {0}, b = {0};
    if (seq_push(ps, &a, x)) return -1;
    int tail = n < 0 ? r : prev;
    if (tail >= 0 && seq_push(ps, &a, (pitem){.type = E_REF, .rule = tail})) return -1;
    if (rule_add_alt(ps, r, &a) || rule_add_alt(ps, r, &b)) return -1;
    ps->rules[r].defined = 1;
    prev = r;
  }
  return seq_push(ps, seq, (pitem){.type = E_REF, .rule = prev});
}

static int parse_count(parser *ps, long *v) {
  const char *at = ps->p;
  *v = 0;
  if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail_at(ps, at, "expected a number");
  while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
    *v = *v * 10 + (*ps->p++ - '0');
    if (*v > GBNF_MAX_REPEAT) return fail_at(ps, at, "repetition count above %d", GBNF_MAX_REPEAT);
  }
  return 0;
}

/* A sequence of items into seq, up to '|', ')' or the end of the rule. */
static int parse_sequence(parser *ps, pseq *seq, int nested) {
  for (;;) {
    skip_space(ps, nested);
    if (ps->p >= ps->end) return 0;
    const char *at = ps->p;
    char c = *ps->p;
    int before = seq->n;
    if (c == '"') {
      ps->p++;
      while (ps->p < ps->end && *ps->p != '"') {
        if (*ps->p == '\n') return fail_at(ps, at, "unterminated string literal");
        long ch = parse_char(ps);
        if (ch < 0) return -1;
        int r = add_range(ps, (uint32_t)ch, (uint32_t)ch);
        if (r < 0 || seq_push(ps, seq, (pitem){.type = E_CHAR, .r0 = r, .nr = 1})) return -1;
      }
      if (ps->p >= ps->end) return fail_at(ps, at, "unterminated string literal");
      ps->p++;
      /* An empty literal is the empty sequence: nothing to repeat. */
      if (ps->p - at == 2) {
        skip_space(ps, nested);
        if (ps->p < ps->end && strchr("*+?{", *ps->p))
          return fail_at(ps, ps->p, "repetition of an empty literal");
        continue;
      }
    } else if (c == '[') {
      ps->p++;
      int neg = 0, r0 = ps->nrng, nr = 0;
      if (ps->p < ps->end && *ps->p == '^') neg = 1, ps->p++;
      while (ps->p < ps->end && *ps->p != ']') {
        long lo = parse_char(ps), hi;
        if (lo < 0) return -1;
        hi = lo;
        if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
          ps->p++;
          hi = parse_char(ps);
          if (hi < 0) return -1;
          if (hi < lo) return fail_at(ps, at, "character range out of order");
        }
        if (add_range(ps, (uint32_t)lo, (uint32_t)hi) < 0) return -1;
        nr++;
      }
      if (ps->p >= ps->end) return fail_at(ps, at, "unterminated character class");
      ps->p++;
      if (!nr && !neg) return fail_at(ps, at, "empty character class");
      if (seq_push(ps, seq, (pitem){.type = E_CHAR, .neg = (uint8_t)neg, .r0 = r0, .nr = nr}))
        return -1;
    } else if (c == '.') {
      ps->p++;
      if (seq_push(ps, seq, (pitem){.type = E_CHAR, .neg = 1, .r0 = ps->nrng, .nr = 0})) return -1;
    } else if (c == '(') {
      ps->p++;
      int r = new_rule(ps, NULL, 0, at);
      if (r < 0) return -1;
      ps->rules[r].defined = 1;
      if (parse_alternatives(ps, r, 1)) return -1;
      skip_space(ps, 1);
      if (ps->p >= ps->end || *ps->p != ')') return fail_at(ps, at, "unclosed '('");
      ps->p++;
      if (seq_push(ps, seq, (pitem){.type = E_REF, .rule = r})) return -1;
    } else if (is_name_char((unsigned char)c)) {
      const char *s = ps->p;
      while (ps->p < ps->end && is_name_char((unsigned char)*ps->p))
        ps->p++;
      const char *q = ps->p;
      skip_space(ps, 0);
      if (ps->end - ps->p >= 3 && !strncmp(ps->p, "::=", 3)) {
        /* the next rule's head: this sequence is over */
        if (nested) return fail_at(ps, at, "missing ')' before the rule '%.*s'", (int)(q - s), s);
        ps->p = s;
        return 0;
      }
      ps->p = q;
      int r = rule_by_name(ps, s, (size_t)(q - s), s);
      if (r < 0 || seq_push(ps, seq, (pitem){.type = E_REF, .rule = r})) return -1;
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
      return fail_at(ps, at, "'%c' with nothing to repeat", c);
    } else if (c == '|' || c == ')') {
      return 0;
    } else if (c == '\n' || c == '\r') {
      return 0; /* end of a top-level rule */
    } else {
      return fail_at(ps, at, "unexpected character '%c'", c);
    }
    /* repetition operators */
    if (ps->p >= ps->end) return 0;
    c = *ps->p;
    if (c != '*' && c != '+' && c != '?' && c != '{') continue;
    /* A literal's repetition applies to the whole literal (as in llama.cpp, which repeats the
     * last item: a literal is one item there). */
    int lit_len = seq->n - before;
    if (*at == '"' && lit_len > 1) {
      int r = new_rule(ps, NULL, 0, at);
      if (r < 0) return -1;
      pseq g = {0};
      for (int k = before; k < seq->n; k++)
        if (seq_push(ps, &g, seq->it[k])) return -1;
      seq->n = before;
      if (rule_add_alt(ps, r, &g)) return -1;
      ps->rules[r].defined = 1;
      if (seq_push(ps, seq, (pitem){.type = E_REF, .rule = r})) return -1;
    }
    const char *op = ps->p++;
    long m = 0, n = -1;
    if (c == '+') m = 1;
    if (c == '?') n = 1;
    if (c == '{') {
      skip_space(ps, nested);
      if (ps->p < ps->end && *ps->p == ',') {
        m = 0;
      } else if (parse_count(ps, &m)) {
        return -1;
      }
      skip_space(ps, nested);
      if (ps->p < ps->end && *ps->p == ',') {
        ps->p++;
        skip_space(ps, nested);
        if (ps->p < ps->end && *ps->p != '}') {
          if (parse_count(ps, &n)) return -1;
          if (n < m) return fail_at(ps, op, "{%ld,%ld}: the maximum is below the minimum", m, n);
        }
      } else {
        n = m;
      }
      skip_space(ps, nested);
      if (ps->p >= ps->end || *ps->p != '}') return fail_at(ps, op, "expected '}'");
      ps->p++;
    }
    if (repeat_item(ps, seq, op, m, n)) return -1;
    if (ps->p < ps->end && strchr("*+?{", *ps->p))
      return fail_at(ps, ps->p, "'%c' after a repetition: group the item first", *ps->p);
  }
}

static int parse_alternatives(parser *ps, int rule, int nested) {
  for (;;) {
    pseq s = {0};
    if (parse_sequence(ps, &s, nested)) {
      free(s.it);
      return -1;
    }
    if (rule_add_alt(ps, rule, &s)) return -1;
    skip_space(ps, nested);
    if (ps->p < ps->end && *ps->p == '|') {
      ps->p++;
      skip_space(ps, 1);
      continue;
    }
    return 0;
  }
}

static int parse_grammar(parser *ps) {
  for (;;) {
    skip_space(ps, 1);
    if (ps->p >= ps->end) return 0;
    const char *at = ps->p;
    if (!is_name_char((unsigned char)*ps->p)) return fail_at(ps, at, "expected a rule name");
    while (ps->p < ps->end && is_name_char((unsigned char)*ps->p))
      ps->p++;
    const char *q = ps->p;
    skip_space(ps, 0);
    if (ps->end - ps->p < 3 || strncmp(ps->p, "::=", 3))
      return fail_at(ps, ps->p, "expected '::=' after the rule name '%.*s'", (int)(q - at), at);
    ps->p += 3;
    int r = rule_by_name(ps, at, (size_t)(q - at), at);
    if (r < 0) return -1;
    if (ps->rules[r].defined)
      return fail_at(ps, at, "rule '%.*s' is defined twice", (int)(q - at), at);
    ps->rules[r].defined = 1;
    ps->rules[r].where = at;
    skip_space(ps, 1);
    if (parse_alternatives(ps, r, 0)) return -1;
    skip_space(ps, 0);
    if (ps->p < ps->end && *ps->p != '\n' && *ps->p != '\r') {
      if (*ps->p == ')') return fail_at(ps, ps->p, "unmatched ')'");
      return fail_at(ps, ps->p, "unexpected character '%c'", *ps->p);
    }
  }
}

static void parser_free(parser *ps) {
  for (int i = 0; i < ps->nrules; i++) {
    free(ps->rules[i].name);
    for (int k = 0; k < ps->rules[i].n; k++)
      free(ps->rules[i].alts[k].it);
    free(ps->rules[i].alts);
  }
  free(ps->rules);
  free(ps->rng);
}

/* ---- checks: nullable rules and left recursion ---- */

static int seq_nullable_upto(const parser *ps, const uint8_t *nullable, const pseq *s, int upto) {
  for (int k = 0; k < upto; k++)
    if (s->it[k].type == E_CHAR || !nullable[s->it[k].rule]) return 0;
  return 1;
}

/* Depth-first search over "rule A can start with rule B" edges; colour 1: on the path. */
static int left_cycle(const parser *ps, const uint8_t *nullable, uint8_t *colour, int r) {
  colour[r] = 1;
  const prule *R = &ps->rules[r];
  for (int a = 0; a < R->n; a++) {
    const pseq *s = &R->alts[a];
    for (int k = 0; k < s->n; k++) {
      if (s->it[k].type == E_CHAR) break;
      int t = s->it[k].rule;
      if (colour[t] == 1) return t;
      if (colour[t] == 0) {
        int c = left_cycle(ps, nullable, colour, t);
        if (c >= 0) return c;
      }
      if (!nullable[t]) break;
    }
  }
  colour[r] = 2;
  return -1;
}

/* ---- compile ---- */

int gbnf_compile(const char *text, size_t n, gbnf **out, char *err, size_t errlen) {
  *out = NULL;
  parser ps = {.text = text, .end = text + n, .p = text, .err = err, .errlen = errlen};
  if (errlen) err[0] = 0;
  gbnf *g = NULL;
  uint8_t *nullable = NULL, *colour = NULL;
  int rc = ANNA_EINVAL;
  if (memchr(text, 0, n)) {
    fail_at(&ps, (const char *)memchr(text, 0, n), "NUL byte in the grammar");
    goto done;
  }
  if (parse_grammar(&ps)) goto done;
  int root = -1;
  for (int i = 0; i < ps.nrules; i++) {
    if (ps.rules[i].name && !ps.rules[i].defined) {
      fail_at(&ps, ps.rules[i].where, "undefined rule '%s'", ps.rules[i].name);
      goto done;
    }
    if (ps.rules[i].name && !strcmp(ps.rules[i].name, "root")) root = i;
  }
  if (root < 0) {
    fail_at(&ps, ps.end, "no 'root' rule");
    goto done;
  }
  nullable = calloc((size_t)ps.nrules, 1);
  colour = calloc((size_t)ps.nrules, 1);
  if (!nullable || !colour) {
    oom(&ps);
    goto done;
  }
  for (int changed = 1; changed;) {
    changed = 0;
    for (int i = 0; i < ps.nrules; i++)
      for (int a = 0; a < ps.rules[i].n && !nullable[i]; a++)
        if (seq_nullable_upto(&ps, nullable, &ps.rules[i].alts[a], ps.rules[i].alts[a].n))
          nullable[i] = 1, changed = 1;
  }
  for (int i = 0; i < ps.nrules; i++) {
    int c = colour[i] ? -1 : left_cycle(&ps, nullable, colour, i);
    if (c >= 0) {
      /* name the nearest named rule on the cycle (a generated one has its source place) */
      if (ps.rules[c].name)
        fail_at(&ps, ps.rules[c].where, "left recursion through rule '%s' (unsupported)",
                ps.rules[c].name);
      else
        fail_at(&ps, ps.rules[c].where,
                "left recursion (unsupported): a repeated item can match nothing");
      goto done;
    }
  }
  /* flatten */
  g = calloc(1, sizeof *g);
  if (!g) {
    oom(&ps);
    goto done;
  }
  g->refs = 1;
  static uint64_t next_id;
  g->id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
  pthread_mutex_init(&g->mu, NULL);
  int nel = 2, nalt = 0;
  for (int i = 0; i < ps.nrules; i++) {
    nalt += ps.rules[i].n;
    for (int a = 0; a < ps.rules[i].n; a++)
      nel += ps.rules[i].alts[a].n + 1;
  }
  g->el = calloc((size_t)nel, sizeof *g->el);
  g->rng = malloc(((size_t)ps.nrng * 2 + 1) * sizeof *g->rng);
  g->rule_alt = malloc(((size_t)ps.nrules + 1) * sizeof *g->rule_alt);
  g->alt = malloc(((size_t)nalt + 1) * sizeof *g->alt);
  if (!g->el || !g->rng || !g->rule_alt || !g->alt) {
    oom(&ps);
    goto done;
  }
  if (ps.nrng) memcpy(g->rng, ps.rng, (size_t)ps.nrng * 2 * sizeof *g->rng);
  g->nrng = ps.nrng;
  g->nrules = ps.nrules;
  g->el[0] = (gel){.type = E_REF, .a = (uint32_t)root};
  g->el[1] = (gel){.type = E_END};
  int e = 2, al = 0;
  for (int i = 0; i < ps.nrules; i++) {
    g->rule_alt[i] = al;
    for (int a = 0; a < ps.rules[i].n; a++) {
      g->alt[al++] = e;
      const pseq *s = &ps.rules[i].alts[a];
      for (int k = 0; k < s->n; k++) {
        const pitem *it = &s->it[k];
        if (it->type == E_CHAR)
          g->el[e++] =
              (gel){.type = E_CHAR, .neg = it->neg, .nr = (uint16_t)it->nr, .a = (uint32_t)it->r0};
        else
          g->el[e++] = (gel){.type = E_REF, .a = (uint32_t)it->rule};
      }
      g->el[e++] = (gel){.type = E_END};
    }
  }
  g->rule_alt[ps.nrules] = al;
  g->nel = e;
  g->cuts = malloc(((size_t)ps.nrng * 2 + 1) * sizeof *g->cuts);
  if (!g->cuts) {
    oom(&ps);
    goto done;
  }
  for (int r = 0; r < ps.nrng; r++) {
    g->cuts[2 * r] = ps.rng[2 * r];
    g->cuts[2 * r + 1] = ps.rng[2 * r + 1] + 1;
  }
  qsort(g->cuts, (size_t)ps.nrng * 2, sizeof *g->cuts, cmp_u32);
  for (int r = 0; r < 2 * ps.nrng; r++)
    if (g->ncuts == 0 || g->cuts[g->ncuts - 1] != g->cuts[r]) g->cuts[g->ncuts++] = g->cuts[r];
  *out = g;
  g = NULL;
  rc = 0;
done:
  if (ps.oom) rc = ANNA_ENOMEM;
  gbnf_release(g);
  free(nullable);
  free(colour);
  parser_free(&ps);
  return rc;
}

void gbnf_retain(gbnf *g) {
  pthread_mutex_lock(&g->mu);
  g->refs++;
  pthread_mutex_unlock(&g->mu);
}

void gbnf_release(gbnf *g) {
  if (!g) return;
  pthread_mutex_lock(&g->mu);
  int left = --g->refs;
  pthread_mutex_unlock(&g->mu);
  if (left) return;
  pthread_mutex_destroy(&g->mu);
  free(g->el);
  free(g->rng);
  free(g->rule_alt);
  free(g->alt);
  free(g->cuts);
  free(g);
}

#define CACHE_N 32
static struct {
  gbnf *g;
  char *text;
  size_t n;
  uint64_t hash;
} cache[CACHE_N];
static int cache_next;
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;

int gbnf_get(const char *text, size_t n, gbnf **out, char *err, size_t errlen) {
  *out = NULL;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
  pthread_mutex_lock(&cache_mu);
  for (int i = 0; i < CACHE_N; i++)
    if (cache[i].g && cache[i].hash == h && cache[i].n == n && !memcmp(cache[i].text, text, n)) {
      gbnf_retain(cache[i].g);
      *out = cache[i].g;
      pthread_mutex_unlock(&cache_mu);
      return 0;
    }
  pthread_mutex_unlock(&cache_mu);
  int rc = gbnf_compile(text, n, out, err, errlen);
  if (rc) return rc;
  char *copy = malloc(n + 1);
  if (!copy) return 0; /* compiled, just not cached */
  memcpy(copy, text, n);
  pthread_mutex_lock(&cache_mu);
  int i = cache_next;
  cache_next = (cache_next + 1) % CACHE_N;
  gbnf_release(cache[i].g);
  free(cache[i].text);
  gbnf_retain(*out);
  cache[i].g = *out;
  cache[i].text = copy;
  cache[i].n = n;
  cache[i].hash = h;
  pthread_mutex_unlock(&cache_mu);
  return 0;
}

/* ---- the recognizer ---- */

/* Commits the stack s[0..len) as a new one of o unless o has it already. */
static void commit(gbnf_state *o, const uint32_t *s, int len) {
  for (int i = 0; i < o->n; i++)
    if (o->off[i + 1] - o->off[i] == len && !memcmp(&o->el[o->off[i]], s, (size_t)len * sizeof *s))
      return;
  if (o->n >= GBNF_MAX_STACKS) return;
  memmove(&o->el[o->used], s, (size_t)len * sizeof *s);
  o->used = (uint16_t)(o->used + len);
  o->n++;
  o->off[o->n] = o->used;
}

/* Expands the tentative stack o->el[at, at + len) (kept above the committed entries: the
 * tentative ones grow down from the end of el, the committed ones up from 0) until its top is
 * a character class, committing each result. */
static void expand(const gbnf *g, gbnf_state *o, int at, int len, int depth) {
  if (len == 0 || g->el[o->el[at + len - 1]].type == E_CHAR) {
    if (o->used + len <= at) commit(o, &o->el[at], len);
    return;
  }
  if (depth > 4 * GBNF_MAX_DEPTH) return; /* cannot happen without left recursion */
  uint32_t top = o->el[at + len - 1];
  const gel *e = &g->el[top];
  int has_next = g->el[top + 1].type != E_END; /* a tail call pushes nothing */
  int keep = len - 1 + has_next;
  for (int a = g->rule_alt[e->a]; a < g->rule_alt[e->a + 1]; a++) {
    uint32_t a0 = (uint32_t)g->alt[a];
    int nl = keep + (g->el[a0].type != E_END);
    int child = at - nl;
    if (nl > GBNF_MAX_DEPTH || child < o->used) continue; /* dropped: documented bound */
    memmove(&o->el[child], &o->el[at], (size_t)(len - 1) * sizeof *o->el);
    int k = child + len - 1;
    if (has_next) o->el[k++] = top + 1;
    if (g->el[a0].type != E_END) o->el[k++] = a0;
    expand(g, o, child, nl, depth + 1);
  }
}

static void state_clear(gbnf_state *o, const gbnf_state *in) {
  o->g = in->g;
  o->n = 0;
  o->used = 0;
  o->off[0] = 0;
  o->part_left = 0;
  o->part_len = 0;
  o->part = 0;
}

static int class_has(const gbnf *g, const gel *e, uint32_t c) {
  int in = 0;
  for (int r = 0; r < e->nr && !in; r++)
    in = c >= g->rng[2 * (e->a + r)] && c <= g->rng[2 * (e->a + r) + 1];
  return in != e->neg;
}

/* Whether class e may hold some character in [lo, hi]. */
static int class_meets(const gbnf *g, const gel *e, uint32_t lo, uint32_t hi) {
  for (int r = 0; r < e->nr; r++) {
    uint32_t a = g->rng[2 * (e->a + r)], b = g->rng[2 * (e->a + r) + 1];
    if (!e->neg && a <= hi && b >= lo) return 1;
    if (e->neg && a <= lo && b >= hi) return 0;
  }
  return e->neg;
}

/* Steps in by code point c into o. */
static int cp_step(const gbnf_state *in, gbnf_state *o, uint32_t c) {
  const gbnf *g = in->g;
  state_clear(o, in);
  for (int i = 0; i < in->n; i++) {
    int len = in->off[i + 1] - in->off[i];
    if (len == 0) continue;
    const uint32_t *s = &in->el[in->off[i]];
    uint32_t top = s[len - 1];
    if (!class_has(g, &g->el[top], c)) continue;
    int has_next = g->el[top + 1].type != E_END;
    int nl = len - 1 + has_next;
    int at = GBNF_MAX_ELEMS - nl;
    if (at < o->used) continue;
    memcpy(&o->el[at], s, (size_t)(len - 1) * sizeof *s);
    if (has_next) o->el[at + len - 1] = top + 1;
    expand(g, o, at, nl, 0);
  }
  return o->n;
}

/* Keeps the stacks of in whose top may take a character in [lo, hi] (a split one). */
static int filter(const gbnf_state *in, gbnf_state *o, uint32_t lo, uint32_t hi) {
  const gbnf *g = in->g;
  state_clear(o, in);
  for (int i = 0; i < in->n; i++) {
    int len = in->off[i + 1] - in->off[i];
    const uint32_t *s = &in->el[in->off[i]];
    if (len && class_meets(g, &g->el[s[len - 1]], lo, hi)) commit(o, s, len);
  }
  return o->n;
}

static const uint32_t CP_MIN[5] = {0, 0, 0x80, 0x800, 0x10000}; /* by UTF-8 length */

static int byte_step(const gbnf_state *in, gbnf_state *o, int c) {
  uint32_t v;
  int left, len;
  if (in->part_left == 0) {
    if (c < 0x80) return cp_step(in, o, (uint32_t)c);
    left = c >= 0xc2 && c < 0xe0 ? 1 : c >= 0xe0 && c < 0xf0 ? 2 : c >= 0xf0 && c < 0xf5 ? 3 : 0;
    if (!left) return o->n = 0;
    v = (uint32_t)c & (left == 1 ? 0x1f : left == 2 ? 0x0f : 0x07);
    len = left + 1;
  } else {
    if ((c & 0xc0) != 0x80) return o->n = 0;
    v = (in->part << 6) | ((uint32_t)c & 0x3f);
    left = in->part_left - 1;
    len = in->part_len;
    if (left == 0) {
      if (v < CP_MIN[len] || (v >= 0xd800 && v < 0xe000) || v > 0x10ffff) return o->n = 0;
      return cp_step(in, o, v);
    }
  }
  /* the characters these bytes may still become */
  uint32_t lo = v << (6 * left), hi = lo | ((1u << (6 * left)) - 1);
  if (lo < CP_MIN[len]) lo = CP_MIN[len];
  if (hi > 0x10ffff) hi = 0x10ffff;
  if (lo > hi || !filter(in, o, lo, hi)) return o->n = 0;
  o->part = v;
  o->part_left = (uint8_t)left;
  o->part_len = (uint8_t)len;
  return o->n;
}

void gbnf_copy(gbnf_state *dst, const gbnf_state *src) {
  dst->g = src->g;
  dst->n = src->n;
  dst->used = src->used;
  dst->part_left = src->part_left;
  dst->part = src->part;
  dst->part_len = src->part_len;
  memcpy(dst->off, src->off, ((size_t)src->n + 1) * sizeof *src->off);
  memcpy(dst->el, src->el, (size_t)src->used * sizeof *src->el);
}

void gbnf_start(const gbnf *g, gbnf_state *st) {
  st->g = g;
  st->n = 0;
  st->used = 0;
  st->off[0] = 0;
  st->part_left = 0;
  st->part_len = 0;
  st->part = 0;
  st->el[GBNF_MAX_ELEMS - 1] = 0; /* el[0]: REF root */
  expand(g, st, GBNF_MAX_ELEMS - 1, 1, 0);
}

int gbnf_feed(gbnf_state *st, const char *b, size_t n) {
  gbnf_state tmp[2];
  const gbnf_state *cur = st;
  for (size_t i = 0; i < n; i++) {
    gbnf_state *o = &tmp[i & 1];
    if (!byte_step(cur, o, (unsigned char)b[i])) return -1;
    cur = o;
  }
  if (cur != st) gbnf_copy(st, cur);
  return 0;
}

int gbnf_done(const gbnf_state *st) {
  if (st->part_left) return 0;
  for (int i = 0; i < st->n; i++)
    if (st->off[i + 1] == st->off[i]) return 1;
  return 0;
}

int gbnf_more(const gbnf_state *st) {
  for (int i = 0; i < st->n; i++)
    if (st->off[i + 1] != st->off[i]) return 1;
  return 0;
}

/* ---- the token mask ---- */

/* Masks of recent states, whatever their request: a state inside a loop (a string's
 * characters, free text) comes back at every step and in every sequence of a batch that
 * uses the same grammar, and its mask is the same. Stored as the allowed or the rejected
 * tokens, whichever list is shorter. */
#define MASK_CACHE_N GBNF_MASK_CACHE

typedef struct mask_entry {
  uint64_t gid, hash, last;
  int valid;
  int rejected; /* toks lists the rejected tokens (else the allowed ones) */
  int ntoks, allowed;
  int32_t *toks; /* [nv] */
  gbnf_state *st;
} mask_entry;

/* Within one walk the states met are few (a loop comes back to the same state after each
 * character; a bounded repetition's state depends only on how many characters it took), so
 * they are interned in a pool with their transitions: most trie nodes then cost a table
 * look-up instead of a step. Transitions are by code point (ASCII in a table per state, the
 * rest in a hash map); the bytes of a multi-byte character only accumulate its bits, and a
 * token that ends inside one is checked against the range of characters it may become (what
 * byte_step's filter does, with the same result). Past POOL_N states, the rest of the walk
 * steps without memo in per-depth slots after the pool. */
#define POOL_N 512
#define POOL_HASH 2048 /* power of two, > 2 * POOL_N */
#define CP_HASH 16384  /* power of two: non-ASCII transitions memoized per walk */
#define TR_UNKNOWN (-1)
#define TR_REJECT (-2)

typedef struct walk_pos {
  int32_t idx;   /* the state after the last whole character (pool index, or a depth slot) */
  uint32_t part; /* a character being read: its bits so far */
  uint8_t left;  /* its continuation bytes still due (0: none) */
  uint8_t len;   /* its whole length in bytes */
} walk_pos;

typedef struct cp_memo {
  uint32_t key_lo; /* the code point's interval (cp_interval) */
  int32_t from;    /* -1: empty */
  int32_t to;      /* pool index or TR_REJECT */
} cp_memo;

struct gbnf_masker {
  const jschema_vocab *v;
  jschema_order o;
  gbnf_state *st;     /* [POOL_N + maxlen + 1] the pool, then the unmemoized per-depth slots */
  int32_t (*tr)[128]; /* [POOL_N] ASCII transitions of pooled states */
  uint64_t *ph;       /* [POOL_N] pooled states' hashes */
  int32_t *slot;      /* [POOL_HASH] pool index + 1; 0 empty */
  cp_memo *cpm;       /* [CP_HASH] */
  int npool;
  walk_pos *cur; /* [maxlen + 1] where the walk is after k bytes of the token */
  float *saved;
  uint8_t *mark; /* [nv] */
  int32_t *acc;  /* [nv] accepted tokens of a walk */
  int nv;
  uint64_t tick, hits, misses;
  mask_entry cache[MASK_CACHE_N];
};

int gbnf_masker_new(gbnf_masker **out, const jschema_vocab *v) {
  *out = NULL;
  gbnf_masker *m = calloc(1, sizeof *m);
  if (!m) return ANNA_ENOMEM;
  m->v = v;
  jsonschema_vocab_order(v, &m->o, &m->nv);
  m->st = malloc(((size_t)POOL_N + m->o.maxlen + 1) * sizeof *m->st);
  m->tr = malloc((size_t)POOL_N * sizeof *m->tr);
  m->cpm = malloc((size_t)CP_HASH * sizeof *m->cpm);
  m->ph = malloc((size_t)POOL_N * sizeof *m->ph);
  m->slot = malloc((size_t)POOL_HASH * sizeof *m->slot);
  m->cur = malloc(((size_t)m->o.maxlen + 1) * sizeof *m->cur);
  m->saved = malloc((size_t)m->nv * sizeof *m->saved);
  m->mark = malloc((size_t)m->nv);
  m->acc = malloc((size_t)m->nv * sizeof *m->acc);
  int ok = m->st && m->saved && m->mark && m->acc && m->tr && m->ph && m->slot && m->cur && m->cpm;
  for (int i = 0; i < MASK_CACHE_N && ok; i++) {
    m->cache[i].toks = malloc(((size_t)m->nv / 2 + 1) * sizeof *m->cache[i].toks);
    m->cache[i].st = malloc(sizeof *m->cache[i].st);
    ok = m->cache[i].toks && m->cache[i].st;
  }
  if (!ok) {
    gbnf_masker_free(m);
    return ANNA_ENOMEM;
  }
  *out = m;
  return 0;
}

void gbnf_masker_free(gbnf_masker *m) {
  if (!m) return;
  for (int i = 0; i < MASK_CACHE_N; i++) {
    free(m->cache[i].toks);
    free(m->cache[i].st);
  }
  free(m->st);
  free(m->tr);
  free(m->cpm);
  free(m->ph);
  free(m->slot);
  free(m->cur);
  free(m->saved);
  free(m->mark);
  free(m->acc);
  free(m);
}

void gbnf_masker_stats(const gbnf_masker *m, uint64_t *hits, uint64_t *misses) {
  *hits = m->hits;
  *misses = m->misses;
}

static uint64_t state_hash(const gbnf_state *st) {
  uint64_t h = 1469598103934665603ull ^ st->g->id;
  h = (h ^ st->n) * 1099511628211ull;
  h = (h ^ ((uint64_t)st->part_len << 40 | (uint64_t)st->part_left << 32 | st->part)) *
      1099511628211ull;
  for (int i = 0; i <= st->n; i++)
    h = (h ^ st->off[i]) * 1099511628211ull;
  for (int i = 0; i < st->used; i++)
    h = (h ^ st->el[i]) * 1099511628211ull;
  return h;
}

static int state_equal(const gbnf_state *a, const gbnf_state *b) {
  return a->g == b->g && a->n == b->n && a->used == b->used && a->part_left == b->part_left &&
         a->part_len == b->part_len && a->part == b->part &&
         !memcmp(a->off, b->off, ((size_t)a->n + 1) * sizeof *a->off) &&
         !memcmp(a->el, b->el, (size_t)a->used * sizeof *a->el);
}

/* The pool index of the state in slot src (just computed), interning it; -1 when the pool is
 * full. */
static int intern(gbnf_masker *m, int src) {
  const gbnf_state *st = &m->st[src];
  uint64_t h = state_hash(st);
  for (uint32_t k = (uint32_t)h & (POOL_HASH - 1);; k = (k + 1) & (POOL_HASH - 1)) {
    int32_t i = m->slot[k] - 1;
    if (i < 0) break;
    if (m->ph[i] == h && state_equal(&m->st[i], st)) return i;
  }
  if (m->npool == POOL_N) return -1;
  int i = m->npool++;
  if (i != src) gbnf_copy(&m->st[i], st);
  m->ph[i] = h;
  for (int b = 0; b < 128; b++)
    m->tr[i][b] = TR_UNKNOWN;
  uint32_t k = (uint32_t)h & (POOL_HASH - 1);
  while (m->slot[k])
    k = (k + 1) & (POOL_HASH - 1);
  m->slot[k] = i + 1;
  return i;
}

/* The state after code point c from state `from` (pool index or depth slot), computed into
 * depth slot `to` and interned when it can be; TR_REJECT when c is not allowed. */
static int32_t cp_next(gbnf_masker *m, int32_t from, uint32_t c, int to) {
  cp_memo *e = NULL;
  uint32_t c_iv = 0;
  if (from < POOL_N) {
    if (c < 128) {
      int32_t t = m->tr[from][c];
      if (t != TR_UNKNOWN) return t;
    } else {
      c_iv = cp_interval(m->st[from].g, c);
      uint32_t h = (c_iv * 2654435761u) ^ ((uint32_t)from * 40503u);
      for (uint32_t k = h & (CP_HASH - 1), probes = 0; probes < 8;
           k = (k + 1) & (CP_HASH - 1), probes++) {
        if (m->cpm[k].from < 0) {
          e = &m->cpm[k];
          break;
        }
        if (m->cpm[k].from == from && m->cpm[k].key_lo == c_iv) return m->cpm[k].to;
      }
    }
  }
  int32_t r;
  if (!cp_step(&m->st[from], &m->st[POOL_N + to], c)) {
    r = TR_REJECT;
  } else {
    int i = intern(m, POOL_N + to);
    r = i >= 0 ? i : POOL_N + to;
  }
  if (from < POOL_N && (r < POOL_N)) { /* memoize only transitions between pooled states */
    if (c < 128)
      m->tr[from][c] = r;
    else if (e)
      *e = (cp_memo){.key_lo = c_iv, .from = from, .to = r};
  }
  return r;
}

/* Whether state s has a stack whose top may take a character in [lo, hi]. */
static int meets_any(const gbnf_state *s, uint32_t lo, uint32_t hi) {
  const gbnf *g = s->g;
  for (int i = 0; i < s->n; i++) {
    int len = s->off[i + 1] - s->off[i];
    if (len && class_meets(g, &g->el[s->el[s->off[i] + len - 1]], lo, hi)) return 1;
  }
  return 0;
}

/* Where the walk is after byte c from depth k: m->cur[k + 1]; 0 when c is rejected. */
static int walk_step(gbnf_masker *m, int k, int c) {
  walk_pos p = m->cur[k], *q = &m->cur[k + 1];
  if (p.left == 0) {
    if (c < 0x80) {
      int32_t t = cp_next(m, p.idx, (uint32_t)c, k + 1);
      if (t == TR_REJECT) return 0;
      *q = (walk_pos){.idx = t};
      return 1;
    }
    int left = c >= 0xc2 && c < 0xe0   ? 1
               : c >= 0xe0 && c < 0xf0 ? 2
               : c >= 0xf0 && c < 0xf5 ? 3
                                       : 0;
    if (!left) return 0;
    *q = (walk_pos){.idx = p.idx,
                    .part = (uint32_t)c & (left == 1   ? 0x1f
                                           : left == 2 ? 0x0f
                                                       : 0x07),
                    .left = (uint8_t)left,
                    .len = (uint8_t)(left + 1)};
    return 1;
  }
  if ((c & 0xc0) != 0x80) return 0;
  uint32_t v = (p.part << 6) | ((uint32_t)c & 0x3f);
  if (p.left > 1) {
    *q = (walk_pos){.idx = p.idx, .part = v, .left = (uint8_t)(p.left - 1), .len = p.len};
    return 1;
  }
  if (v < CP_MIN[p.len] || (v >= 0xd800 && v < 0xe000) || v > 0x10ffff) return 0;
  int32_t t = cp_next(m, p.idx, v, k + 1);
  if (t == TR_REJECT) return 0;
  *q = (walk_pos){.idx = t};
  return 1;
}

/* A token that ends inside a character: whether some character its bytes begin may come. */
static int partial_ok(const gbnf_masker *m, walk_pos p) {
  uint32_t lo = p.part << (6 * p.left), hi = lo | ((1u << (6 * p.left)) - 1);
  if (lo < CP_MIN[p.len]) lo = CP_MIN[p.len];
  if (hi > 0x10ffff) hi = 0x10ffff;
  return lo <= hi && meets_any(&m->st[p.idx], lo, hi);
}

/* One pass over the byte-ordered vocabulary: a token shares its first bytes with the last one
 * walked, whose positions after those bytes are reused; a rejected prefix rejects every token
 * that starts with it (and a rejected first or second byte skips to the next entry that
 * differs there). The accepted tokens go to m->acc; returns how many. */
static int walk(gbnf_masker *m, const gbnf_state *st) {
  const jschema_order *o = &m->o;
  int count = 0, valid = 0, rej = INT32_MAX, chain = INT32_MAX;
  m->npool = 0;
  memset(m->slot, 0, (size_t)POOL_HASH * sizeof *m->slot);
  for (int k = 0; k < CP_HASH; k++)
    m->cpm[k].from = -1;
  gbnf_copy(&m->st[POOL_N], st);
  int r0 = intern(m, POOL_N);
  /* a character split by the previous token: its bits go on here */
  m->cur[0] = (walk_pos){
      .idx = r0 >= 0 ? r0 : POOL_N, .part = st->part, .left = st->part_left, .len = st->part_len};
  for (int i = 0; i < o->n; i++) {
    if (o->lcp[i] < chain) chain = o->lcp[i];
    if (rej < chain) {
      int j = rej == 0 ? o->skip1[i] : rej == 1 ? o->skip2[i] : i + 1;
      i = j - 1;
      continue;
    }
    const char *b = o->bytes + o->boff[i];
    int n = (int)(o->boff[i + 1] - o->boff[i]);
    int k = chain < valid ? chain : valid;
    for (; k < n; k++)
      if (!walk_step(m, k, (unsigned char)b[k])) break;
    if (k == n && m->cur[n].left && !partial_ok(m, m->cur[n]))
      k = n - 1; /* the last byte is the one to blame */
    if (k == n) {
      valid = n;
      rej = INT32_MAX;
      m->acc[count++] = o->tok[i];
    } else {
      valid = rej = k;
    }
    chain = INT32_MAX;
  }
  return count;
}

/* Applies a list: rejected ones to -inf, or everything but the allowed ones. */
static void apply(gbnf_masker *m, float *row, int rejected, const int32_t *toks, int n) {
  if (rejected) {
    for (int k = 0; k < n; k++)
      row[toks[k]] = -INFINITY;
    return;
  }
  for (int k = 0; k < n; k++)
    m->saved[k] = row[toks[k]];
  for (int t = 0; t < m->nv; t++)
    row[t] = -INFINITY;
  for (int k = 0; k < n; k++)
    row[toks[k]] = m->saved[k];
}

int gbnf_mask(gbnf_masker *m, const gbnf_state *st, float *row) {
  uint64_t h = state_hash(st);
  m->tick++;
  for (int i = 0; i < MASK_CACHE_N; i++) {
    mask_entry *c = &m->cache[i];
    if (c->valid && c->hash == h && c->gid == st->g->id && state_equal(c->st, st)) {
      c->last = m->tick;
      m->hits++;
      apply(m, row, c->rejected, c->toks, c->ntoks);
      return c->allowed;
    }
  }
  m->misses++;
  int count = walk(m, st);
  /* into the least recently used entry */
  mask_entry *c = &m->cache[0];
  for (int i = 1; i < MASK_CACHE_N; i++)
    if (!m->cache[i].valid || (c->valid && m->cache[i].last < c->last)) c = &m->cache[i];
  c->valid = 1;
  c->gid = st->g->id;
  c->hash = h;
  c->last = m->tick;
  c->allowed = count;
  gbnf_copy(c->st, st);
  if (count <= m->nv / 2) {
    c->rejected = 0;
    c->ntoks = count;
    memcpy(c->toks, m->acc, (size_t)count * sizeof *c->toks);
  } else {
    memset(m->mark, 0, (size_t)m->nv);
    for (int k = 0; k < count; k++)
      m->mark[m->acc[k]] = 1;
    c->rejected = 1;
    c->ntoks = 0;
    for (int t = 0; t < m->nv; t++)
      if (!m->mark[t]) c->toks[c->ntoks++] = t;
  }
  apply(m, row, c->rejected, c->toks, c->ntoks);
  return count;
}
