/* jinja_parse.c: lexer and recursive-descent parser for Jinja templates.
 *
 * The lexer reproduces jinja2's with trim_blocks=True, lstrip_blocks=True and
 * keep_trailing_newline=False, because chat templates depend on the exact whitespace those
 * settings leave. Each statement tag is parsed into an AST node of jinja_internal.h.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "template/jinja_internal.h"

typedef enum tok_kind {
  TK_EOF,
  TK_DATA,
  TK_VAR_BEGIN,
  TK_VAR_END,
  TK_BLOCK_BEGIN,
  TK_BLOCK_END,
  TK_NAME,
  TK_STRING,
  TK_INT,
  TK_FLOAT,
  TK_OP,
} tok_kind;

typedef struct tok {
  tok_kind k;
  int line;
  const char *s; /* name/op text, data or decoded string (arena) */
  size_t n;
  int64_t i;
  double f;
} tok;

typedef struct parser {
  jarena *a;
  tok *toks;
  size_t ntoks, cap, pos;
  char *err;
  size_t errlen;
  int failed;
  int depth;
} parser;

#define MAX_PARSE_DEPTH 200

static int perr(parser *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(parser *p, int line, const char *fmt, ...) {
  if (p->failed) return -1;
  p->failed = 1;
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  anna_err(p->err, p->errlen, ANNA_EFORMAT, "template line %d: %s", line, msg);
  return -1;
}

static int push_tok(parser *p, tok t) {
  if (p->ntoks == p->cap) {
    size_t nc = p->cap ? p->cap * 2 : 256;
    tok *nt = realloc(p->toks, nc * sizeof(tok));
    if (!nt) return perr(p, t.line, "out of memory");
    p->toks = nt;
    p->cap = nc;
  }
  p->toks[p->ntoks++] = t;
  return 0;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int count_nl(const char *s, size_t n) {
  int c = 0;
  for (size_t i = 0; i < n; i++) c += s[i] == '\n';
  return c;
}

/* Appends the UTF-8 encoding of cp. */
static size_t put_utf8(char *o, uint32_t cp) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | (cp >> 18));
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Decodes a quoted string literal starting at s[0] (the quote); Python escape rules. Returns
 * bytes consumed or 0 on error. */
static size_t lex_string(parser *p, const char *s, size_t n, int line, tok *t) {
  char q = s[0];
  size_t i = 1, end = 1;
  while (end < n && s[end] != q) end += s[end] == '\\' ? 2 : 1;
  if (end >= n) return perr(p, line, "unterminated string literal"), 0;
  n = end + 1; /* decoded text is never longer than its source */
  char *o = jarena_alloc(p->a, n + 1);
  if (!o) return perr(p, line, "out of memory"), 0;
  size_t on = 0;
  while (i < n && s[i] != q) {
    if (s[i] != '\\') {
      o[on++] = s[i++];
      continue;
    }
    if (i + 1 >= n) break;
    char c = s[i + 1];
    i += 2;
    switch (c) {
    case 'n': o[on++] = '\n'; break;
    case 't': o[on++] = '\t'; break;
    case 'r': o[on++] = '\r'; break;
    case '0': o[on++] = '\0'; break;
    case 'a': o[on++] = '\a'; break;
    case 'b': o[on++] = '\b'; break;
    case 'f': o[on++] = '\f'; break;
    case 'v': o[on++] = '\v'; break;
    case '\\': o[on++] = '\\'; break;
    case '\'': o[on++] = '\''; break;
    case '"': o[on++] = '"'; break;
    case '\n': break;
    case 'x':
    case 'u':
    case 'U': {
      int nd = c == 'x' ? 2 : c == 'u' ? 4 : 8;
      uint32_t cp = 0;
      for (int k = 0; k < nd; k++) {
        int h = i + (size_t)k < n ? hexval(s[i + (size_t)k]) : -1;
        if (h < 0) return perr(p, line, "bad \\%c escape in string literal", c), 0;
        cp = cp * 16 + (uint32_t)h;
      }
      if (cp > 0x10FFFF) return perr(p, line, "bad \\%c escape in string literal", c), 0;
      i += (size_t)nd;
      on += put_utf8(o + on, cp);
      break;
    }
    default:
      o[on++] = '\\';
      o[on++] = c;
    }
  }
  if (i >= n) return perr(p, line, "unterminated string literal"), 0;
  o[on] = 0;
  t->k = TK_STRING;
  t->s = o;
  t->n = on;
  return i + 1;
}

/* Lexes the inside of a {{ }} or {% %} tag starting at *pos; stops after the end tag. */
static int lex_tag(parser *p, const char *src, size_t len, size_t *pos, int *line, int is_block,
                   int *line_starting) {
  size_t i = *pos;
  int bal = 0;
  for (;;) {
    while (i < len && is_ws(src[i])) {
      if (src[i] == '\n') (*line)++;
      i++;
    }
    if (i >= len) return perr(p, *line, "missing end of %s tag", is_block ? "block" : "variable");
    const char *c = src + i;
    size_t rem = len - i;
    if (bal == 0) {
      if (is_block) {
        if (rem >= 3 && (c[0] == '-' || c[0] == '+') && c[1] == '%' && c[2] == '}') {
          i += 3;
          *line_starting = 0;
          if (c[0] == '-') {
            size_t s0 = i;
            while (i < len && is_ws(src[i])) i++;
            *line += count_nl(src + s0, i - s0);
            *line_starting = i > s0 && src[i - 1] == '\n';
          }
          break;
        }
        if (rem >= 2 && c[0] == '%' && c[1] == '}') {
          i += 2;
          *line_starting = 0;
          if (i < len && src[i] == '\n') { /* trim_blocks */
            i++;
            (*line)++;
            *line_starting = 1;
          }
          break;
        }
      } else {
        if (rem >= 3 && c[0] == '-' && c[1] == '}' && c[2] == '}') {
          i += 3;
          size_t s0 = i;
          while (i < len && is_ws(src[i])) i++;
          *line += count_nl(src + s0, i - s0);
          *line_starting = i > s0 && src[i - 1] == '\n';
          break;
        }
        if (rem >= 2 && c[0] == '}' && c[1] == '}') {
          i += 2;
          *line_starting = 0;
          break;
        }
      }
    }
    tok t = {.line = *line};
    if (is_name_start(c[0])) {
      size_t k = 1;
      while (k < rem && (is_name_start(c[k]) || is_digit(c[k]))) k++;
      t.k = TK_NAME;
      t.s = c;
      t.n = k;
      i += k;
    } else if (is_digit(c[0])) {
      size_t k = 0;
      int is_float = 0;
      char num[64];
      size_t nn = 0;
      while (k < rem && (is_digit(c[k]) || (c[k] == '_' && k + 1 < rem && is_digit(c[k + 1])))) {
        if (c[k] != '_' && nn < sizeof(num) - 1) num[nn++] = c[k];
        k++;
      }
      if (k + 1 < rem && c[k] == '.' && is_digit(c[k + 1])) {
        is_float = 1;
        num[nn < sizeof(num) - 1 ? nn++ : nn] = '.';
        k++;
        while (k < rem && (is_digit(c[k]) || c[k] == '_')) {
          if (c[k] != '_' && nn < sizeof(num) - 1) num[nn++] = c[k];
          k++;
        }
      }
      if (k < rem && (c[k] == 'e' || c[k] == 'E')) {
        size_t k2 = k + 1;
        if (k2 < rem && (c[k2] == '+' || c[k2] == '-')) k2++;
        if (k2 < rem && is_digit(c[k2])) {
          is_float = 1;
          for (size_t z = k; z < k2 && nn < sizeof(num) - 1; z++) num[nn++] = c[z];
          k = k2;
          while (k < rem && is_digit(c[k])) {
            if (nn < sizeof(num) - 1) num[nn++] = c[k];
            k++;
          }
        }
      }
      num[nn] = 0;
      if (is_float) {
        t.k = TK_FLOAT;
        t.f = strtod(num, NULL);
      } else {
        errno = 0;
        long long v = strtoll(num, NULL, 10);
        if (errno == ERANGE || nn >= sizeof(num) - 1)
          return perr(p, *line, "integer literal too large");
        t.k = TK_INT;
        t.i = v;
      }
      i += k;
    } else if (c[0] == '\'' || c[0] == '"') {
      size_t k = lex_string(p, c, rem, *line, &t);
      if (!k) return -1;
      *line += count_nl(c, k);
      i += k;
    } else {
      static const char *ops2[] = {"//", "**", "==", "!=", ">=", "<="};
      size_t k = 0;
      for (size_t z = 0; z < sizeof(ops2) / sizeof(ops2[0]); z++)
        if (rem >= 2 && c[0] == ops2[z][0] && c[1] == ops2[z][1]) k = 2;
      if (!k && strchr("+-/*%~[](){}<>=.:|,;!", c[0]) && c[0] != '!') k = 1;
      if (!k) return perr(p, *line, "unexpected character '%c' in tag", c[0]);
      if (k == 1) {
        if (c[0] == '(' || c[0] == '[' || c[0] == '{') bal++;
        if (c[0] == ')' || c[0] == ']' || c[0] == '}') {
          if (bal == 0) return perr(p, *line, "unexpected '%c'", c[0]);
          bal--;
        }
      }
      t.k = TK_OP;
      t.s = c;
      t.n = k;
      i += k;
    }
    if (push_tok(p, t)) return -1;
  }
  *pos = i;
  return push_tok(p, (tok){.k = is_block ? TK_BLOCK_END : TK_VAR_END, .line = *line});
}

/* Strips data before a tag as jinja2's OptionalLStrip does. */
static size_t lstrip_data(const char *text, size_t n, char sign, int is_var, int line_starting) {
  if (sign == '-') {
    while (n > 0 && is_ws(text[n - 1])) n--;
    return n;
  }
  if (sign == '+' || is_var) return n;
  size_t l = n;
  while (l > 0 && text[l - 1] != '\n') l--;
  if (l > 0 || line_starting) {
    size_t k = l;
    while (k < n && is_ws(text[k])) k++;
    if (k == n && n > l) return l;
  }
  return n;
}

static int push_data(parser *p, const char *s, size_t n, int line) {
  if (n == 0) return 0;
  return push_tok(p, (tok){.k = TK_DATA, .s = s, .n = n, .line = line});
}

/* Matches `{%[-+]? raw [-]?%}` at src[i]; returns its length or 0. */
static size_t match_raw(const char *src, size_t len, size_t i, const char *word, size_t *after_ws) {
  size_t k = i + 2;
  if (k < len && (src[k] == '-' || src[k] == '+')) k++;
  while (k < len && is_ws(src[k])) k++;
  size_t wl = strlen(word);
  if (len - k < wl || memcmp(src + k, word, wl) != 0) return 0;
  k += wl;
  if (k < len && (is_name_start(src[k]) || is_digit(src[k]))) return 0;
  while (k < len && is_ws(src[k])) k++;
  if (k + 2 < len && src[k] == '-' && src[k + 1] == '%' && src[k + 2] == '}') {
    k += 3;
    while (k < len && is_ws(src[k])) k++;
    *after_ws = 1;
    return k - i;
  }
  if (k + 1 < len && src[k] == '%' && src[k + 1] == '}') {
    *after_ws = 0;
    return k + 2 - i;
  }
  return 0;
}

static int lex_all(parser *p, const char *src, size_t len) {
  size_t i = 0;
  int line = 1, line_starting = 1;
  while (i < len) {
    size_t j = i;
    const char *tag = NULL;
    while (j + 1 < len) {
      if (src[j] == '{' && (src[j + 1] == '{' || src[j + 1] == '%' || src[j + 1] == '#')) {
        tag = src + j;
        break;
      }
      j++;
    }
    if (!tag) {
      if (push_data(p, src + i, len - i, line)) return -1;
      break;
    }
    char kind = tag[1];
    char sign = j + 2 < len && (src[j + 2] == '-' || src[j + 2] == '+') ? src[j + 2] : 0;
    size_t dn = lstrip_data(src + i, j - i, sign, kind == '{', line_starting);
    if (push_data(p, src + i, dn, line)) return -1;
    line += count_nl(src + i, j - i);
    size_t k = j + 2 + (sign ? 1 : 0);
    size_t raw_ws = 0;
    size_t rawlen = kind == '%' ? match_raw(src, len, j, "raw", &raw_ws) : 0;
    if (rawlen) {
      line += count_nl(src + j, rawlen);
      size_t body = j + rawlen, e = body;
      size_t endlen = 0, end_ws = 0;
      for (; e + 1 < len; e++)
        if (src[e] == '{' && src[e + 1] == '%' && (endlen = match_raw(src, len, e, "endraw", &end_ws)))
          break;
      if (!endlen) return perr(p, line, "missing end of raw directive");
      char esign = src[e + 2] == '-' || src[e + 2] == '+' ? src[e + 2] : 0;
      size_t bn = lstrip_data(src + body, e - body, esign, 0, 0);
      if (push_data(p, src + body, bn, line)) return -1;
      line += count_nl(src + body, e + endlen - body);
      i = e + endlen;
      line_starting = i > 0 && src[i - 1] == '\n';
      if (!end_ws && i < len && src[i] == '\n') { /* trim_blocks after endraw */
        i++;
        line++;
        line_starting = 1;
      }
      continue;
    }
    if (kind == '#') {
      size_t e = k;
      int found = 0;
      for (; e + 1 < len; e++) {
        if (src[e] == '#' && src[e + 1] == '}') {
          found = 1;
          break;
        }
      }
      if (!found) return perr(p, line, "missing end of comment tag");
      char esign = e > k && (src[e - 1] == '-' || src[e - 1] == '+') ? src[e - 1] : 0;
      line += count_nl(src + j, e + 2 - j);
      i = e + 2;
      line_starting = 0;
      if (esign == '-') {
        size_t s0 = i;
        while (i < len && is_ws(src[i])) i++;
        line += count_nl(src + s0, i - s0);
        line_starting = i > s0 && src[i - 1] == '\n';
      } else if (esign != '+' && i < len && src[i] == '\n') {
        i++;
        line++;
        line_starting = 1;
      }
      continue;
    }
    int is_block = kind == '%';
    if (push_tok(p, (tok){.k = is_block ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, .line = line})) return -1;
    i = k;
    if (lex_tag(p, src, len, &i, &line, is_block, &line_starting)) return -1;
  }
  return push_tok(p, (tok){.k = TK_EOF, .line = line});
}

/* ---- parser ---- */
static tok *peek(parser *p) { return &p->toks[p->pos]; }
static tok *peek2(parser *p) {
  return p->pos + 1 < p->ntoks ? &p->toks[p->pos + 1] : &p->toks[p->ntoks - 1];
}
static tok *next(parser *p) {
  tok *t = &p->toks[p->pos];
  if (t->k != TK_EOF) p->pos++;
  return t;
}
static int is_op(const tok *t, const char *op) {
  return t->k == TK_OP && t->n == strlen(op) && memcmp(t->s, op, t->n) == 0;
}
static int is_name(const tok *t, const char *nm) {
  return t->k == TK_NAME && t->n == strlen(nm) && memcmp(t->s, nm, t->n) == 0;
}
static int accept_op(parser *p, const char *op) {
  if (is_op(peek(p), op)) {
    p->pos++;
    return 1;
  }
  return 0;
}
static int accept_name(parser *p, const char *nm) {
  if (is_name(peek(p), nm)) {
    p->pos++;
    return 1;
  }
  return 0;
}
static const char *tok_desc(const tok *t, char *buf, size_t cap) {
  switch (t->k) {
  case TK_EOF: return "end of template";
  case TK_DATA: return "template data";
  case TK_VAR_END: return "end of print statement '}}'";
  case TK_BLOCK_END: return "end of statement block '%}'";
  case TK_STRING: return "string literal";
  case TK_INT:
  case TK_FLOAT: return "number";
  default: snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); return buf;
  }
}
static int expect_op(parser *p, const char *op) {
  if (accept_op(p, op)) return 0;
  char b[64];
  return perr(p, peek(p)->line, "expected '%s', got %s", op, tok_desc(peek(p), b, sizeof(b)));
}
static int expect_block_end(parser *p) {
  if (peek(p)->k == TK_BLOCK_END) {
    p->pos++;
    return 0;
  }
  char b[64];
  return perr(p, peek(p)->line, "expected end of statement block, got %s",
              tok_desc(peek(p), b, sizeof(b)));
}

static jnode *mk(parser *p, jnode_kind k, int line) {
  jnode *n = jarena_alloc(p->a, sizeof(jnode));
  if (!n) {
    perr(p, line, "out of memory");
    return NULL;
  }
  n->kind = k;
  n->line = line;
  return n;
}

typedef struct nvec {
  jnode **v;
  size_t n, cap;
} nvec;
static int nvec_push(parser *p, nvec *v, jnode *n) {
  if (v->n == v->cap) {
    size_t nc = v->cap ? v->cap * 2 : 4;
    jnode **nv = jarena_alloc(p->a, nc * sizeof(jnode *));
    if (!nv) return perr(p, n ? n->line : 0, "out of memory");
    if (v->n) memcpy(nv, v->v, v->n * sizeof(jnode *));
    v->v = nv;
    v->cap = nc;
  }
  v->v[v->n++] = n;
  return 0;
}

static jstr *tok_str(parser *p, const tok *t) {
  jstr *s = jstr_new(p->a, t->s, t->n);
  if (!s) perr(p, t->line, "out of memory");
  return s;
}

static jnode *parse_expr(parser *p);
static jnode *parse_or(parser *p);
static jnode *parse_unary(parser *p, int with_filter);
static jnode *parse_primary(parser *p);
static jnode *parse_postfix(parser *p, jnode *n);

/* Call arguments after '(' up to ')': positional then name=value. */
static int parse_args(parser *p, nvec *args) {
  while (!accept_op(p, ")")) {
    if (args->n && expect_op(p, ",")) return -1;
    if (accept_op(p, ")")) break; /* trailing comma */
    tok *t = peek(p);
    if (is_op(t, "*") || is_op(t, "**")) {
      jnode *sp = mk(p, JN_SPLAT, t->line);
      if (!sp) return -1;
      sp->op = is_op(t, "**") ? 2 : 1;
      p->pos++;
      sp->a = parse_expr(p);
      if (!sp->a || nvec_push(p, args, sp)) return -1;
    } else if (t->k == TK_NAME && is_op(peek2(p), "=")) {
      jnode *kw = mk(p, JN_KWARG, t->line);
      if (!kw) return -1;
      kw->str = tok_str(p, t);
      p->pos += 2;
      kw->a = parse_expr(p);
      if (!kw->a || nvec_push(p, args, kw)) return -1;
    } else {
      jnode *e = parse_expr(p);
      if (!e || nvec_push(p, args, e)) return -1;
    }
  }
  return 0;
}

static jnode *parse_filter(parser *p, jnode *operand) {
  /* after '|' */
  tok *t = next(p);
  if (t->k != TK_NAME) return perr(p, t->line, "expected filter name"), NULL;
  jnode *f = mk(p, JN_FILTER, t->line);
  if (!f) return NULL;
  size_t nlen = t->n;
  const char *ns = t->s;
  while (is_op(peek(p), ".") && peek2(p)->k == TK_NAME) { /* dotted filter names */
    p->pos++;
    tok *t2 = next(p);
    nlen = (size_t)(t2->s + t2->n - ns);
  }
  f->str = jstr_new(p->a, ns, nlen);
  if (!f->str) return perr(p, t->line, "out of memory"), NULL;
  f->a = operand;
  if (accept_op(p, "(")) {
    nvec args = {0};
    if (parse_args(p, &args)) return NULL;
    f->kids = args.v;
    f->nkids = args.n;
  }
  return f;
}

static jnode *parse_test(parser *p, jnode *operand) {
  /* after 'is' */
  int line = peek(p)->line;
  jnode *t = mk(p, JN_TEST, line);
  if (!t) return NULL;
  t->a = operand;
  if (accept_name(p, "not")) t->op = 1;
  tok *nt = next(p);
  if (nt->k != TK_NAME) return perr(p, nt->line, "expected test name"), NULL;
  t->str = tok_str(p, nt);
  if (!t->str) return NULL;
  if (accept_op(p, "(")) {
    nvec args = {0};
    if (parse_args(p, &args)) return NULL;
    t->kids = args.v;
    t->nkids = args.n;
  } else {
    tok *q = peek(p);
    int arg = (q->k == TK_NAME || q->k == TK_STRING || q->k == TK_INT || q->k == TK_FLOAT ||
               is_op(q, "[") || is_op(q, "{")) &&
              !is_name(q, "else") && !is_name(q, "or") && !is_name(q, "and") &&
              !is_name(q, "if") && !is_name(q, "is") && !is_name(q, "in") && !is_name(q, "not");
    if (arg) {
      jnode *e = parse_primary(p);
      if (!e) return NULL;
      e = parse_postfix(p, e);
      if (!e) return NULL;
      t->kids = jarena_alloc(p->a, sizeof(jnode *));
      if (!t->kids) return perr(p, line, "out of memory"), NULL;
      t->kids[0] = e;
      t->nkids = 1;
    }
  }
  return t;
}

static jnode *parse_filter_expr(parser *p, jnode *n) {
  for (;;) {
    if (!n) return NULL;
    if (accept_op(p, "|")) n = parse_filter(p, n);
    else if (accept_name(p, "is")) n = parse_test(p, n);
    else if (is_op(peek(p), "(")) {
      p->pos++;
      jnode *c = mk(p, JN_CALL, n->line);
      if (!c) return NULL;
      nvec args = {0};
      if (parse_args(p, &args)) return NULL;
      c->a = n;
      c->kids = args.v;
      c->nkids = args.n;
      n = c;
    } else
      return n;
  }
}

static jnode *parse_subscript(parser *p, jnode *obj) {
  int line = peek(p)->line;
  if (accept_op(p, ".")) {
    tok *t = next(p);
    if (t->k == TK_NAME) {
      jnode *g = mk(p, JN_GETATTR, t->line);
      if (!g) return NULL;
      g->a = obj;
      g->str = tok_str(p, t);
      return g;
    }
    if (t->k == TK_INT) {
      jnode *g = mk(p, JN_GETITEM, t->line);
      jnode *k = mk(p, JN_LIT, t->line);
      if (!g || !k) return NULL;
      k->lit = jv_int(t->i);
      g->a = obj;
      g->b = k;
      return g;
    }
    return perr(p, t->line, "expected attribute name after '.'"), NULL;
  }
  /* '[' */
  p->pos++;
  jnode *parts[3] = {NULL, NULL, NULL};
  int is_slice = 0, idx = 0;
  for (;;) {
    if (is_op(peek(p), "]")) break;
    if (accept_op(p, ":")) {
      is_slice = 1;
      if (++idx > 2) return perr(p, line, "too many ':' in slice"), NULL;
      continue;
    }
    if (parts[idx]) return perr(p, line, "expected ':' or ']' in subscript"), NULL;
    parts[idx] = parse_expr(p);
    if (!parts[idx]) return NULL;
    if (!is_slice && is_op(peek(p), ",")) { /* x[a, b] tuple key: rare, reject clearly */
      return perr(p, line, "tuple subscripts are not supported"), NULL;
    }
  }
  if (expect_op(p, "]")) return NULL;
  if (!is_slice) {
    if (!parts[0]) return perr(p, line, "empty subscript"), NULL;
    jnode *g = mk(p, JN_GETITEM, line);
    if (!g) return NULL;
    g->a = obj;
    g->b = parts[0];
    return g;
  }
  jnode *s = mk(p, JN_SLICE, line);
  if (!s) return NULL;
  s->a = obj;
  s->kids = jarena_alloc(p->a, 3 * sizeof(jnode *));
  if (!s->kids) return perr(p, line, "out of memory"), NULL;
  memcpy(s->kids, parts, sizeof(parts));
  s->nkids = 3;
  return s;
}

static jnode *parse_postfix(parser *p, jnode *n) {
  for (;;) {
    if (!n) return NULL;
    if (is_op(peek(p), ".") || is_op(peek(p), "[")) n = parse_subscript(p, n);
    else if (is_op(peek(p), "(")) {
      p->pos++;
      jnode *c = mk(p, JN_CALL, n->line);
      if (!c) return NULL;
      nvec args = {0};
      if (parse_args(p, &args)) return NULL;
      c->a = n;
      c->kids = args.v;
      c->nkids = args.n;
      n = c;
    } else
      return n;
  }
}

static jnode *parse_primary(parser *p) {
  tok *t = next(p);
  if (++p->depth > MAX_PARSE_DEPTH) return perr(p, t->line, "expression nested too deeply"), NULL;
  jnode *n = NULL;
  switch (t->k) {
  case TK_NAME:
    n = mk(p, JN_LIT, t->line);
    if (!n) break;
    if (is_name(t, "true") || is_name(t, "True")) n->lit = jv_bool(1);
    else if (is_name(t, "false") || is_name(t, "False")) n->lit = jv_bool(0);
    else if (is_name(t, "none") || is_name(t, "None")) n->lit = jv_none();
    else {
      n->kind = JN_NAME;
      n->str = tok_str(p, t);
    }
    break;
  case TK_STRING: {
    /* adjacent literals concatenate */
    size_t total = t->n, k = p->pos;
    while (p->toks[k].k == TK_STRING) total += p->toks[k++].n;
    char *buf = jarena_alloc(p->a, total + 1);
    n = mk(p, JN_LIT, t->line);
    if (!buf || !n) break;
    memcpy(buf, t->s, t->n);
    size_t o = t->n;
    while (peek(p)->k == TK_STRING) {
      tok *u = next(p);
      memcpy(buf + o, u->s, u->n);
      o += u->n;
    }
    n->lit = jv_str(p->a, buf, o);
    break;
  }
  case TK_INT:
    n = mk(p, JN_LIT, t->line);
    if (n) n->lit = jv_int(t->i);
    break;
  case TK_FLOAT:
    n = mk(p, JN_LIT, t->line);
    if (n) n->lit = jv_float(t->f);
    break;
  case TK_OP:
    if (is_op(t, "(")) {
      if (accept_op(p, ")")) {
        n = mk(p, JN_TUPLE, t->line);
        break;
      }
      jnode *e = parse_expr(p);
      if (!e) break;
      if (is_op(peek(p), ",")) {
        nvec v = {0};
        if (nvec_push(p, &v, e)) break;
        while (accept_op(p, ",")) {
          if (is_op(peek(p), ")")) break;
          jnode *x = parse_expr(p);
          if (!x || nvec_push(p, &v, x)) {
            v.n = 0;
            break;
          }
        }
        if (p->failed) break;
        n = mk(p, JN_TUPLE, t->line);
        if (n) {
          n->kids = v.v;
          n->nkids = v.n;
        }
      } else
        n = e;
      if (n && expect_op(p, ")")) n = NULL;
    } else if (is_op(t, "[")) {
      nvec v = {0};
      while (!accept_op(p, "]")) {
        if (v.n && expect_op(p, ",")) break;
        if (accept_op(p, "]")) break;
        jnode *x = parse_expr(p);
        if (!x || nvec_push(p, &v, x)) break;
      }
      if (p->failed) break;
      n = mk(p, JN_LIST, t->line);
      if (n) {
        n->kids = v.v;
        n->nkids = v.n;
      }
    } else if (is_op(t, "{")) {
      nvec v = {0};
      while (!accept_op(p, "}")) {
        if (v.n && expect_op(p, ",")) break;
        if (accept_op(p, "}")) break;
        jnode *k = parse_expr(p);
        if (!k || expect_op(p, ":")) break;
        jnode *x = parse_expr(p);
        if (!x || nvec_push(p, &v, k) || nvec_push(p, &v, x)) break;
      }
      if (p->failed) break;
      n = mk(p, JN_DICT, t->line);
      if (n) {
        n->kids = v.v;
        n->nkids = v.n;
      }
    } else {
      char b[64];
      perr(p, t->line, "unexpected %s", tok_desc(t, b, sizeof(b)));
    }
    break;
  default: {
    char b[64];
    perr(p, t->line, "unexpected %s in expression", tok_desc(t, b, sizeof(b)));
  }
  }
  p->depth--;
  return p->failed ? NULL : n;
}

static jnode *parse_unary(parser *p, int with_filter) {
  tok *t = peek(p);
  jnode *n;
  if (++p->depth > MAX_PARSE_DEPTH) return perr(p, t->line, "expression nested too deeply"), NULL;
  if (is_op(t, "-") || is_op(t, "+")) {
    p->pos++;
    n = mk(p, is_op(t, "-") ? JN_NEG : JN_POS, t->line);
    if (n) n->a = parse_unary(p, 0);
    if (n && !n->a) n = NULL;
  } else {
    n = parse_postfix(p, parse_primary(p));
  }
  p->depth--;
  if (with_filter) n = parse_filter_expr(p, n);
  return n;
}

static jnode *binop(parser *p, int op, jnode *l, jnode *r, int line) {
  if (!l || !r) return NULL;
  jnode *n = mk(p, JN_BINOP, line);
  if (!n) return NULL;
  n->op = op;
  n->a = l;
  n->b = r;
  return n;
}

static jnode *parse_pow(parser *p) {
  jnode *l = parse_unary(p, 1);
  while (l && is_op(peek(p), "**")) {
    int line = next(p)->line;
    l = binop(p, JOP_POW, l, parse_unary(p, 1), line);
  }
  return l;
}

static jnode *parse_math2(parser *p) {
  jnode *l = parse_pow(p);
  for (;;) {
    if (!l) return NULL;
    tok *t = peek(p);
    int op = is_op(t, "*") ? JOP_MUL : is_op(t, "/") ? JOP_DIV : is_op(t, "//") ? JOP_FLOORDIV
             : is_op(t, "%") ? JOP_MOD : 0;
    if (!op) return l;
    p->pos++;
    l = binop(p, op, l, parse_pow(p), t->line);
  }
}

static jnode *parse_concat(parser *p) {
  jnode *l = parse_math2(p);
  if (!l || !is_op(peek(p), "~")) return l;
  nvec v = {0};
  if (nvec_push(p, &v, l)) return NULL;
  while (accept_op(p, "~")) {
    jnode *r = parse_math2(p);
    if (!r || nvec_push(p, &v, r)) return NULL;
  }
  jnode *n = mk(p, JN_CONCAT, l->line);
  if (!n) return NULL;
  n->kids = v.v;
  n->nkids = v.n;
  return n;
}

static jnode *parse_math1(parser *p) {
  jnode *l = parse_concat(p);
  for (;;) {
    if (!l) return NULL;
    tok *t = peek(p);
    int op = is_op(t, "+") ? JOP_ADD : is_op(t, "-") ? JOP_SUB : 0;
    if (!op) return l;
    p->pos++;
    l = binop(p, op, l, parse_concat(p), t->line);
  }
}

static jnode *parse_compare(parser *p) {
  jnode *first = parse_math1(p);
  if (!first) return NULL;
  nvec v = {0};
  int ops[64];
  size_t nops = 0;
  for (;;) {
    tok *t = peek(p);
    int op = is_op(t, "==") ? JOP_EQ : is_op(t, "!=") ? JOP_NE : is_op(t, "<") ? JOP_LT
             : is_op(t, "<=") ? JOP_LE : is_op(t, ">") ? JOP_GT : is_op(t, ">=") ? JOP_GE
             : is_name(t, "in") ? JOP_IN : 0;
    if (!op && is_name(t, "not") && is_name(peek2(p), "in")) {
      op = JOP_NOTIN;
      p->pos++;
    }
    if (!op) break;
    p->pos++;
    if (nops == 64) return perr(p, t->line, "comparison chain too long"), NULL;
    jnode *r = parse_math1(p);
    if (!r || nvec_push(p, &v, r)) return NULL;
    ops[nops++] = op;
  }
  if (!nops) return first;
  jnode *n = mk(p, JN_CMP, first->line);
  if (!n) return NULL;
  n->a = first;
  n->kids = v.v;
  n->nkids = v.n;
  n->cmpops = jarena_alloc(p->a, nops * sizeof(int));
  if (!n->cmpops) return perr(p, first->line, "out of memory"), NULL;
  memcpy(n->cmpops, ops, nops * sizeof(int));
  return n;
}

static jnode *parse_not(parser *p) {
  if (is_name(peek(p), "not")) {
    int line = next(p)->line;
    if (++p->depth > MAX_PARSE_DEPTH) return perr(p, line, "expression nested too deeply"), NULL;
    jnode *n = mk(p, JN_NOT, line);
    if (n) n->a = parse_not(p);
    p->depth--;
    return n && n->a ? n : NULL;
  }
  return parse_compare(p);
}

static jnode *parse_and(parser *p) {
  jnode *l = parse_not(p);
  while (l && is_name(peek(p), "and")) {
    int line = next(p)->line;
    jnode *r = parse_not(p);
    if (!r) return NULL;
    jnode *n = mk(p, JN_AND, line);
    if (!n) return NULL;
    n->a = l;
    n->b = r;
    l = n;
  }
  return l;
}

static jnode *parse_or(parser *p) {
  jnode *l = parse_and(p);
  while (l && is_name(peek(p), "or")) {
    int line = next(p)->line;
    jnode *r = parse_and(p);
    if (!r) return NULL;
    jnode *n = mk(p, JN_OR, line);
    if (!n) return NULL;
    n->a = l;
    n->b = r;
    l = n;
  }
  return l;
}

static jnode *parse_expr(parser *p) {
  if (++p->depth > MAX_PARSE_DEPTH) return perr(p, peek(p)->line, "expression nested too deeply"), NULL;
  jnode *e = parse_or(p);
  while (e && is_name(peek(p), "if")) {
    int line = next(p)->line;
    jnode *c = mk(p, JN_COND, line);
    if (!c) return NULL;
    c->b = e;
    c->a = parse_or(p);
    if (!c->a) return NULL;
    if (accept_name(p, "else")) {
      c->c = parse_or(p);
      if (!c->c) return NULL;
    }
    e = c;
  }
  p->depth--;
  return e;
}

/* Expression that may be an unparenthesised tuple (`a, b` in set/for/print). */
static jnode *parse_tuple_expr(parser *p) {
  jnode *e = parse_expr(p);
  if (!e || !is_op(peek(p), ",")) return e;
  nvec v = {0};
  if (nvec_push(p, &v, e)) return NULL;
  while (accept_op(p, ",")) {
    tok *t = peek(p);
    if (t->k == TK_BLOCK_END || t->k == TK_VAR_END) break;
    jnode *x = parse_expr(p);
    if (!x || nvec_push(p, &v, x)) return NULL;
  }
  jnode *n = mk(p, JN_TUPLE, e->line);
  if (!n) return NULL;
  n->kids = v.v;
  n->nkids = v.n;
  return n;
}

/* ---- statements ---- */
static jnode *parse_body(parser *p, const char *const *ends, const char **which);
static jnode *parse_stmt(parser *p);


/* Parses statements until one of `ends` (block names); consumes `{% end`'s name but not the
 * rest of the tag. *which receives the matched end name. */
static jnode *parse_body(parser *p, const char *const *ends, const char **which) {
  jnode *body = mk(p, JN_BODY, peek(p)->line);
  if (!body) return NULL;
  nvec v = {0};
  if (++p->depth > MAX_PARSE_DEPTH) return perr(p, peek(p)->line, "blocks nested too deeply"), NULL;
  for (;;) {
    tok *t = peek(p);
    if (t->k == TK_EOF) {
      if (ends) {
        perr(p, t->line, "unexpected end of template, expected '%s'", ends[0]);
        return NULL;
      }
      break;
    }
    if (t->k == TK_DATA) {
      p->pos++;
      jnode *n = mk(p, JN_TEXT, t->line);
      if (!n) return NULL;
      n->str = jstr_new(p->a, t->s, t->n);
      if (!n->str || nvec_push(p, &v, n)) return NULL;
      continue;
    }
    if (t->k == TK_VAR_BEGIN) {
      p->pos++;
      jnode *n = mk(p, JN_OUTPUT, t->line);
      if (!n) return NULL;
      n->a = parse_tuple_expr(p);
      if (!n->a) return NULL;
      if (peek(p)->k != TK_VAR_END) {
        char b[64];
        perr(p, peek(p)->line, "expected '}}', got %s", tok_desc(peek(p), b, sizeof(b)));
        return NULL;
      }
      p->pos++;
      if (nvec_push(p, &v, n)) return NULL;
      continue;
    }
    if (t->k != TK_BLOCK_BEGIN) {
      perr(p, t->line, "unexpected token");
      return NULL;
    }
    tok *nm = peek2(p);
    if (ends) {
      for (const char *const *e = ends; *e; e++)
        if (is_name(nm, *e)) {
          p->pos += 2;
          *which = *e;
          body->kids = v.v;
          body->nkids = v.n;
          p->depth--;
          return body;
        }
    }
    p->pos++;
    jnode *st = parse_stmt(p);
    if (!st) return NULL;
    if (nvec_push(p, &v, st)) return NULL;
  }
  body->kids = v.v;
  body->nkids = v.n;
  p->depth--;
  return body;
}

/* An elif chain becomes nested JN_IF nodes in c, built iteratively so a long chain cannot
 * exhaust the stack. */
static jnode *parse_if(parser *p, int line) {
  jnode *first = NULL, **slot = &first;
  static const char *const ends[] = {"elif", "else", "endif", NULL};
  static const char *const ends2[] = {"endif", NULL};
  for (;;) {
    jnode *n = mk(p, JN_IF, line);
    if (!n) return NULL;
    *slot = n;
    n->a = parse_tuple_expr(p);
    if (!n->a || expect_block_end(p)) return NULL;
    const char *which = NULL;
    n->b = parse_body(p, ends, &which);
    if (!n->b) return NULL;
    if (strcmp(which, "elif") == 0) {
      line = p->toks[p->pos - 1].line;
      slot = &n->c;
      continue;
    }
    if (strcmp(which, "else") == 0) {
      if (expect_block_end(p)) return NULL;
      n->c = parse_body(p, ends2, &which);
      if (!n->c) return NULL;
    }
    return expect_block_end(p) ? NULL : first;
  }
}

static jnode *parse_assign_target(parser *p, int allow_attr) {
  tok *t = next(p);
  if (t->k != TK_NAME) return perr(p, t->line, "expected a variable name"), NULL;
  jnode *n = mk(p, JN_NAME, t->line);
  if (!n) return NULL;
  n->str = tok_str(p, t);
  if (allow_attr && is_op(peek(p), ".")) {
    p->pos++;
    tok *a = next(p);
    if (a->k != TK_NAME) return perr(p, a->line, "expected attribute name"), NULL;
    jnode *g = mk(p, JN_GETATTR, a->line);
    if (!g) return NULL;
    g->a = n;
    g->str = tok_str(p, a);
    return g;
  }
  return n;
}

static jnode *parse_targets(parser *p, int allow_attr, int line) {
  jnode *first = parse_assign_target(p, allow_attr);
  if (!first || !is_op(peek(p), ",")) return first;
  nvec v = {0};
  if (nvec_push(p, &v, first)) return NULL;
  while (accept_op(p, ",")) {
    jnode *x = parse_assign_target(p, 0);
    if (!x || nvec_push(p, &v, x)) return NULL;
  }
  jnode *t = mk(p, JN_TUPLE, line);
  if (!t) return NULL;
  t->kids = v.v;
  t->nkids = v.n;
  return t;
}

/* Parses a filter chain `| f(args) | g` applied to a JN_BLOCKVAL placeholder. */
static jnode *parse_filter_chain(parser *p, int line, int need_bar) {
  jnode *n = mk(p, JN_BLOCKVAL, line);
  if (!n) return NULL;
  if (!need_bar) n = parse_filter(p, n);
  while (n && accept_op(p, "|")) n = parse_filter(p, n);
  return n;
}

static jnode *parse_stmt(parser *p) {
  tok *kw = next(p);
  int line = kw->line;
  if (kw->k != TK_NAME) return perr(p, line, "expected statement name after '{%%'"), NULL;
  const char *which = NULL;
  if (is_name(kw, "if")) return parse_if(p, line);
  if (is_name(kw, "for")) {
    jnode *n = mk(p, JN_FOR, line);
    if (!n) return NULL;
    jnode *tg = parse_targets(p, 0, line);
    if (!tg) return NULL;
    if (tg->kind == JN_TUPLE) {
      n->kids = tg->kids;
      n->nkids = tg->nkids;
    } else {
      n->kids = jarena_alloc(p->a, sizeof(jnode *));
      if (!n->kids) return perr(p, line, "out of memory"), NULL;
      n->kids[0] = tg;
      n->nkids = 1;
    }
    if (!accept_name(p, "in")) return perr(p, peek(p)->line, "expected 'in' in for loop"), NULL;
    n->a = parse_or(p);
    if (!n->a) return NULL;
    if (accept_name(p, "if")) {
      n->d = parse_or(p);
      if (!n->d) return NULL;
    }
    if (accept_name(p, "recursive")) return perr(p, line, "recursive loops are not supported"), NULL;
    if (expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endfor", "else", NULL};
    n->b = parse_body(p, ends, &which);
    if (!n->b) return NULL;
    if (strcmp(which, "else") == 0) {
      if (expect_block_end(p)) return NULL;
      static const char *const ends2[] = {"endfor", NULL};
      n->c = parse_body(p, ends2, &which);
      if (!n->c) return NULL;
    }
    return expect_block_end(p) ? NULL : n;
  }
  if (is_name(kw, "set")) {
    jnode *tg = parse_targets(p, 1, line);
    if (!tg) return NULL;
    if (accept_op(p, "=")) {
      jnode *n = mk(p, JN_SET, line);
      if (!n) return NULL;
      n->a = tg;
      n->b = parse_tuple_expr(p);
      if (!n->b || expect_block_end(p)) return NULL;
      return n;
    }
    if (tg->kind != JN_NAME) return perr(p, line, "block set needs a plain variable name"), NULL;
    jnode *n = mk(p, JN_SET_BLOCK, line);
    if (!n) return NULL;
    n->a = tg;
    if (is_op(peek(p), "|")) {
      n->d = parse_filter_chain(p, line, 1);
      if (!n->d) return NULL;
    }
    if (expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endset", NULL};
    n->b = parse_body(p, ends, &which);
    if (!n->b || expect_block_end(p)) return NULL;
    return n;
  }
  if (is_name(kw, "macro")) {
    tok *nm = next(p);
    if (nm->k != TK_NAME) return perr(p, nm->line, "expected macro name"), NULL;
    jnode *n = mk(p, JN_MACRO, line);
    if (!n) return NULL;
    n->str = tok_str(p, nm);
    if (expect_op(p, "(")) return NULL;
    nvec params = {0};
    while (!accept_op(p, ")")) {
      if (params.n && expect_op(p, ",")) return NULL;
      if (accept_op(p, ")")) break;
      tok *pn = next(p);
      if (pn->k != TK_NAME) return perr(p, pn->line, "expected parameter name"), NULL;
      jnode *pr = mk(p, JN_NAME, pn->line);
      if (!pr) return NULL;
      pr->str = tok_str(p, pn);
      if (accept_op(p, "=")) {
        pr->a = parse_expr(p);
        if (!pr->a) return NULL;
      }
      if (nvec_push(p, &params, pr)) return NULL;
    }
    n->kids = params.v;
    n->nkids = params.n;
    if (expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    n->b = parse_body(p, ends, &which);
    if (!n->b) return NULL;
    if (peek(p)->k == TK_NAME) p->pos++; /* {% endmacro name %} */
    return expect_block_end(p) ? NULL : n;
  }
  if (is_name(kw, "call")) {
    jnode *n = mk(p, JN_CALL_BLOCK, line);
    jnode *caller = mk(p, JN_MACRO, line);
    if (!n || !caller) return NULL;
    caller->str = jstr_new(p->a, "caller", 6);
    if (!caller->str) return perr(p, line, "out of memory"), NULL;
    if (accept_op(p, "(")) {
      nvec params = {0};
      while (!accept_op(p, ")")) {
        if (params.n && expect_op(p, ",")) return NULL;
        if (accept_op(p, ")")) break;
        tok *pn = next(p);
        if (pn->k != TK_NAME) return perr(p, pn->line, "expected parameter name"), NULL;
        jnode *pr = mk(p, JN_NAME, pn->line);
        if (!pr) return NULL;
        pr->str = tok_str(p, pn);
        if (accept_op(p, "=")) {
          pr->a = parse_expr(p);
          if (!pr->a) return NULL;
        }
        if (nvec_push(p, &params, pr)) return NULL;
      }
      caller->kids = params.v;
      caller->nkids = params.n;
    }
    n->a = parse_expr(p);
    if (!n->a) return NULL;
    if (n->a->kind != JN_CALL) return perr(p, line, "expected a call after 'call'"), NULL;
    if (expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endcall", NULL};
    caller->b = parse_body(p, ends, &which);
    if (!caller->b || expect_block_end(p)) return NULL;
    n->d = caller;
    return n;
  }
  if (is_name(kw, "generation")) {
    if (expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endgeneration", NULL};
    jnode *b = parse_body(p, ends, &which);
    if (!b || expect_block_end(p)) return NULL;
    return b;
  }
  if (is_name(kw, "filter")) {
    jnode *n = mk(p, JN_FILTER_BLOCK, line);
    if (!n) return NULL;
    n->a = parse_filter_chain(p, line, 0);
    if (!n->a || expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endfilter", NULL};
    n->b = parse_body(p, ends, &which);
    if (!n->b || expect_block_end(p)) return NULL;
    return n;
  }
  if (is_name(kw, "break") || is_name(kw, "continue")) {
    jnode *n = mk(p, is_name(kw, "break") ? JN_BREAK : JN_CONTINUE, line);
    if (!n || expect_block_end(p)) return NULL;
    return n;
  }
  char b[64];
  return perr(p, line, "unknown or unexpected statement %s", tok_desc(kw, b, sizeof(b))), NULL;
}

/* Validates that break/continue only appear inside loops (jinja2 rejects them at compile
 * time). */
static int check_loops(parser *p, const jnode *n, int in_loop, int depth) {
  if (!n || depth > 4 * MAX_PARSE_DEPTH) return 0;
  switch (n->kind) {
  case JN_BREAK:
  case JN_CONTINUE:
    if (!in_loop) return perr(p, n->line, "'%s' outside of a loop", n->kind == JN_BREAK ? "break" : "continue");
    return 0;
  case JN_BODY:
    for (size_t i = 0; i < n->nkids; i++)
      if (check_loops(p, n->kids[i], in_loop, depth + 1)) return -1;
    return 0;
  case JN_IF:
    for (; n && n->kind == JN_IF; n = n->c)
      if (check_loops(p, n->b, in_loop, depth + 1)) return -1;
    return check_loops(p, n, in_loop, depth + 1);
  case JN_FOR: return check_loops(p, n->b, 1, depth + 1) || check_loops(p, n->c, in_loop, depth + 1) ? -1 : 0;
  case JN_MACRO: return check_loops(p, n->b, 0, depth + 1);
  case JN_CALL_BLOCK: return check_loops(p, n->d->b, 0, depth + 1);
  case JN_SET_BLOCK:
  case JN_FILTER_BLOCK: return check_loops(p, n->b, in_loop, depth + 1);
  default: return 0;
  }
}

int jinja_template_parse(jinja_template **out, const char *src, size_t len, char *err,
                         size_t errlen) {
  if (!out) return anna_err(err, errlen, ANNA_EINVAL, "jinja_template_parse: out is NULL");
  *out = NULL;
  if (!src && len) return anna_err(err, errlen, ANNA_EINVAL, "jinja_template_parse: src is NULL");
  jinja_template *t = calloc(1, sizeof(*t));
  if (!t) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  /* jinja2 normalises newlines to \n and drops one trailing newline
   * (keep_trailing_newline=False). */
  char *norm = jarena_alloc(&t->arena, len + 1);
  if (!norm) {
    jinja_template_free(t);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    if (src[i] == '\r') {
      norm[n++] = '\n';
      if (i + 1 < len && src[i + 1] == '\n') i++;
    } else
      norm[n++] = src[i];
  }
  if (n > 0 && norm[n - 1] == '\n') n--;
  norm[n] = 0;
  parser p = {.a = &t->arena, .err = err, .errlen = errlen};
  int rc = lex_all(&p, norm, n);
  if (rc == 0) {
    t->root = parse_body(&p, NULL, NULL);
    if (!t->root) rc = -1;
  }
  if (rc == 0 && check_loops(&p, t->root, 0, 0)) rc = -1;
  free(p.toks);
  if (rc) {
    if (!p.failed) anna_err(err, errlen, ANNA_EFORMAT, "template parse failed");
    jinja_template_free(t);
    return ANNA_EFORMAT;
  }
  *out = t;
  return 0;
}

void jinja_template_free(jinja_template *t) {
  if (!t) return;
  jarena_free_all(&t->arena);
  free(t);
}
