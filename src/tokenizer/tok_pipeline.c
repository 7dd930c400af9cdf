/* tok_pipeline.c: normalizers, pre-tokenizers and per-token decoders, interpreted from the
 * step lists a constructor filled. Every function here only reads the tokenizer; scratch
 * lives in the caller's buffers, which is what keeps concurrent encodes safe. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/error.h"
#include "tokenizer/tok_internal.h"

tok_step *tok_pipe_push(tok_pipe *p, int kind) {
  if (p->n == p->cap) {
    size_t nc = p->cap ? p->cap * 2 : 4;
    tok_step *ns = realloc(p->steps, nc * sizeof *ns);
    if (!ns) return NULL;
    p->steps = ns;
    p->cap = nc;
  }
  tok_step *s = &p->steps[p->n++];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  return s;
}

void tok_pipe_free(tok_pipe *p) {
  for (size_t i = 0; i < p->n; i++) {
    pcre2_code_free(p->steps[i].re);
    free(p->steps[i].lit);
    free(p->steps[i].repl);
  }
  free(p->steps);
  memset(p, 0, sizeof *p);
}

int tok_regex_compile(pcre2_code **out, const char *pat, size_t len, char *err, size_t errlen) {
  int ecode = 0;
  PCRE2_SIZE eoff = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP;
#ifdef PCRE2_MATCH_INVALID_UTF
  opts |= PCRE2_MATCH_INVALID_UTF;
#endif
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &ecode, &eoff, NULL);
  if (!re) {
    char msg[160];
    pcre2_get_error_message(ecode, (PCRE2_UCHAR *)msg, sizeof msg);
    return anna_err(err, errlen, ANNA_EFORMAT, "regex /%.*s/ at offset %zu: %s",
                    (int)(len > 80 ? 80 : len), pat, (size_t)eoff, msg);
  }
  /* JIT is an optimisation only; a build without it still matches (slower). */
  (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
  *out = re;
  return 0;
}

void tok_bytelevel_init(tokenizer *t) {
  /* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
   * bytes get code points from 256 up, in byte order. */
  int next = 256;
  for (int i = 0; i < 512; i++)
    t->bl_dec[i] = -1;
  for (int b = 0; b < 256; b++) {
    int keep = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    int cp = keep ? b : next++;
    t->bl_enc_len[b] = (uint8_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)t->bl_enc[b]);
    t->bl_dec[cp] = (int16_t)b;
  }
}

int tok_buf_put(tok_buf *b, const void *s, size_t n) {
  if (n > SIZE_MAX / 2 - b->n) return ANNA_ENOMEM;
  if (b->n + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 64;
    while (nc < b->n + n + 1)
      nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) return ANNA_ENOMEM;
    b->p = np;
    b->cap = nc;
  }
  if (n) memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
  return 0;
}

void tok_pieces_free(tok_pieces *p) {
  free(p->buf.p);
  free(p->off);
  free(p->len);
  memset(p, 0, sizeof *p);
}

static void pieces_clear(tok_pieces *p) {
  p->n = 0;
  p->buf.n = 0;
}

/* Appends a piece made of the concatenation of a and b (either may be empty). */
static int pieces_add2(tok_pieces *p, const char *a, size_t an, const char *b, size_t bn) {
  if (an + bn == 0) return 0; /* HF drops empty splits */
  if (p->n == p->cap) {
    size_t nc = p->cap ? p->cap * 2 : 64;
    size_t *no = realloc(p->off, nc * sizeof *no);
    if (!no) return ANNA_ENOMEM;
    p->off = no;
    size_t *nl = realloc(p->len, nc * sizeof *nl);
    if (!nl) return ANNA_ENOMEM;
    p->len = nl;
    p->cap = nc;
  }
  size_t o = p->buf.n;
  if (tok_buf_put(&p->buf, a, an) || tok_buf_put(&p->buf, b, bn)) return ANNA_ENOMEM;
  p->off[p->n] = o;
  p->len[p->n] = an + bn;
  p->n++;
  return 0;
}

static int pieces_add(tok_pieces *p, const char *a, size_t an) {
  return pieces_add2(p, a, an, NULL, 0);
}

static size_t utf8_len1(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0) return 2;
  if ((c & 0xf0) == 0xe0) return 3;
  if ((c & 0xf8) == 0xf0) return 4;
  return 1;
}

/* Decodes one code point at s (n > 0 bytes left); returns its byte length. */
static size_t utf8_next(const char *s, size_t n, int32_t *cp) {
  utf8proc_int32_t c = 0;
  utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c);
  if (k <= 0) {
    *cp = 0xfffd;
    return 1;
  }
  *cp = c;
  return (size_t)k;
}

int tok_is_ws(int32_t c) {
  if (c == ' ' || (c >= 9 && c <= 13) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
      (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
      c == 0x3000)
    return 1;
  return 0;
}

static int is_numeric(int32_t c) {
  utf8proc_category_t k = utf8proc_category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* One regex search from start; returns 1 and the match span, 0 for no match, <0 error.
 * Falls back from JIT to the interpreter when the JIT stack runs out (long space runs). */
static int re_find(const pcre2_code *re, const char *s, size_t n, size_t start,
                   pcre2_match_data *md, size_t *ms, size_t *me) {
  int rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, 0, md, NULL);
  if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
    rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, PCRE2_NO_JIT, md, NULL);
  if (rc == PCRE2_ERROR_NOMATCH) return 0;
  if (rc < 0) return ANNA_EFORMAT;
  PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
  *ms = ov[0];
  *me = ov[1];
  return 1;
}

/* Finds the next occurrence of the step's pattern in s[start..n). */
static int step_find(const tok_step *st, const char *s, size_t n, size_t start,
                     pcre2_match_data *md, size_t *ms, size_t *me) {
  if (st->re) return re_find(st->re, s, n, start, md, ms, me);
  if (st->lit_len == 0 || start >= n) return 0;
  const char *f = memmem(s + start, n - start, st->lit, st->lit_len);
  if (!f) return 0;
  *ms = (size_t)(f - s);
  *me = *ms + st->lit_len;
  return 1;
}

/* ---------------------------------------------------------------- normalizers */

static int norm_utf8proc(const char *s, size_t n, tok_buf *out, utf8proc_option_t opt) {
  out->n = 0;
  if (n == 0) return tok_buf_put(out, "", 0);
  utf8proc_uint8_t *dst = NULL;
  utf8proc_ssize_t k =
      utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opt | UTF8PROC_STABLE);
  if (k < 0) return ANNA_EINVAL;
  int rc = tok_buf_put(out, dst, (size_t)k);
  free(dst);
  return rc;
}

static int norm_step(const tok_step *st, const char *s, size_t n, tok_buf *out,
                     pcre2_match_data *md) {
  out->n = 0;
  switch (st->kind) {
  case TOK_NORM_NFC: return norm_utf8proc(s, n, out, UTF8PROC_COMPOSE);
  case TOK_NORM_NFD: return norm_utf8proc(s, n, out, UTF8PROC_DECOMPOSE);
  case TOK_NORM_NFKC: return norm_utf8proc(s, n, out, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  case TOK_NORM_NFKD: return norm_utf8proc(s, n, out, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  case TOK_NORM_LOWERCASE:
    for (size_t i = 0; i < n;) {
      int32_t c;
      i += utf8_next(s + i, n - i, &c);
      utf8proc_uint8_t enc[4];
      utf8proc_ssize_t k = utf8proc_encode_char(utf8proc_tolower(c), enc);
      if (tok_buf_put(out, enc, (size_t)k)) return ANNA_ENOMEM;
    }
    return tok_buf_put(out, "", 0);
  case TOK_NORM_REPLACE: {
    size_t pos = 0, ms, me;
    for (;;) {
      int r = step_find(st, s, n, pos, md, &ms, &me);
      if (r < 0) return r;
      if (r == 0) break;
      if (me == ms) { /* empty match: keep one char and move on */
        if (ms >= n) break;
        me = ms + utf8_len1((unsigned char)s[ms]);
        if (me > n) me = n;
        if (tok_buf_put(out, s + pos, me - pos)) return ANNA_ENOMEM;
        pos = me;
        continue;
      }
      if (tok_buf_put(out, s + pos, ms - pos) || tok_buf_put(out, st->repl, st->repl_len))
        return ANNA_ENOMEM;
      pos = me;
    }
    return tok_buf_put(out, s + pos, n - pos);
  }
  case TOK_NORM_PREPEND:
    if (n == 0) return tok_buf_put(out, "", 0);
    if (tok_buf_put(out, st->repl, st->repl_len)) return ANNA_ENOMEM;
    return tok_buf_put(out, s, n);
  case TOK_NORM_STRIP: {
    size_t a = 0, b = n;
    while (st->strip_left && a < b) {
      int32_t c;
      size_t k = utf8_next(s + a, b - a, &c);
      if (!tok_is_ws(c)) break;
      a += k;
    }
    while (st->strip_right && b > a) {
      size_t k = 1;
      while (k < b - a && ((unsigned char)s[b - k] & 0xc0) == 0x80)
        k++;
      int32_t c;
      utf8_next(s + b - k, k, &c);
      if (!tok_is_ws(c)) break;
      b -= k;
    }
    return tok_buf_put(out, s + a, b - a);
  }
  }
  return ANNA_EINVAL;
}

int tok_normalize(const tokenizer *t, const char *s, size_t n, tok_buf *out, pcre2_match_data *md,
                  char *err, size_t errlen) {
  out->n = 0;
  if (tok_buf_put(out, s, n)) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (t->norm.n == 0) return 0;
  tok_buf tmp = {0};
  int rc = 0;
  for (size_t i = 0; i < t->norm.n; i++) {
    rc = norm_step(&t->norm.steps[i], out->p, out->n, &tmp, md);
    if (rc) break;
    tok_buf sw = *out;
    *out = tmp;
    tmp = sw;
  }
  free(tmp.p);
  if (rc == ANNA_ENOMEM) return anna_err(err, errlen, rc, "out of memory");
  if (rc) return anna_err(err, errlen, rc, "normalizer failed on the input text");
  return 0;
}

/* ---------------------------------------------------------------- pre-tokenizers */

typedef struct span {
  size_t a, b;
  int match;
} span;

typedef struct span_vec {
  span *v;
  size_t n, cap;
} span_vec;

static int spans_push(span_vec *sv, size_t a, size_t b, int match) {
  if (a == b) return 0;
  if (sv->n == sv->cap) {
    size_t nc = sv->cap ? sv->cap * 2 : 32;
    span *nv = realloc(sv->v, nc * sizeof *nv);
    if (!nv) return ANNA_ENOMEM;
    sv->v = nv;
    sv->cap = nc;
  }
  sv->v[sv->n++] = (span){a, b, match};
  return 0;
}

/* Splits s into alternating match / gap spans of the step's pattern (or of digits /
 * whitespace for the built-in kinds). */
static int find_spans(const tok_step *st, const pcre2_code *re, const char *s, size_t n,
                      pcre2_match_data *md, span_vec *sv) {
  sv->n = 0;
  size_t last = 0, pos = 0;
  if (st->kind == TOK_PRE_DIGITS || st->kind == TOK_PRE_WSPLIT) {
    for (size_t i = 0; i < n;) {
      int32_t c;
      size_t k = utf8_next(s + i, n - i, &c);
      int m = st->kind == TOK_PRE_DIGITS ? is_numeric(c) : tok_is_ws(c);
      if (m) {
        if (spans_push(sv, last, i, 0) || spans_push(sv, i, i + k, 1)) return ANNA_ENOMEM;
        last = i + k;
      }
      i += k;
    }
    return spans_push(sv, last, n, 0);
  }
  while (pos <= n) {
    size_t ms, me;
    int r = re ? re_find(re, s, n, pos, md, &ms, &me) : step_find(st, s, n, pos, md, &ms, &me);
    if (r < 0) return r;
    if (r == 0) break;
    if (me == ms) {
      if (ms >= n) break;
      pos = ms + utf8_len1((unsigned char)s[ms]);
      continue;
    }
    if (spans_push(sv, last, ms, 0) || spans_push(sv, ms, me, 1)) return ANNA_ENOMEM;
    last = pos = me;
  }
  return spans_push(sv, last, n, 0);
}

/* Applies a split behavior (HF semantics) to the spans and adds the pieces to out. */
static int emit_spans(const char *s, span_vec *sv, int behavior, int invert, tok_pieces *out) {
  span *v = sv->v;
  size_t m = 0;
  if (invert)
    for (size_t i = 0; i < sv->n; i++)
      v[i].match = !v[i].match;
  switch (behavior) {
  case TOK_SPLIT_ISOLATED: m = sv->n; break;
  case TOK_SPLIT_REMOVED:
    for (size_t i = 0; i < sv->n; i++)
      if (!v[i].match) v[m++] = v[i];
    break;
  case TOK_SPLIT_MERGED_PREV: {
    int prev = 0;
    for (size_t i = 0; i < sv->n; i++) {
      if (v[i].match && !prev && m > 0)
        v[m - 1].b = v[i].b;
      else
        v[m++] = v[i];
      prev = v[i].match;
    }
    break;
  }
  case TOK_SPLIT_MERGED_NEXT: {
    /* Walk backwards, merging each match into the piece after it. */
    int prev = 0;
    size_t w = sv->n;
    for (size_t i = sv->n; i-- > 0;) {
      span cur = v[i];
      if (cur.match && !prev && w < sv->n)
        v[w].a = cur.a;
      else
        v[--w] = cur;
      prev = cur.match;
    }
    memmove(v, v + w, (sv->n - w) * sizeof *v);
    m = sv->n - w;
    break;
  }
  case TOK_SPLIT_CONTIGUOUS: {
    int prev = 0;
    for (size_t i = 0; i < sv->n; i++) {
      if (v[i].match && prev && m > 0)
        v[m - 1].b = v[i].b;
      else
        v[m++] = v[i];
      prev = v[i].match;
    }
    break;
  }
  }
  for (size_t i = 0; i < m; i++)
    if (pieces_add(out, s + v[i].a, v[i].b - v[i].a)) return ANNA_ENOMEM;
  return 0;
}

static const char gpt2_re_src[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int pre_step(const tokenizer *t, const tok_step *st, const tok_pieces *in, int seg_first,
                    tok_pieces *out, span_vec *sv, pcre2_match_data *md) {
  pieces_clear(out);
  for (size_t pi = 0; pi < in->n; pi++) {
    const char *s = in->buf.p + in->off[pi];
    size_t n = in->len[pi];
    int rc = 0;
    switch (st->kind) {
    case TOK_PRE_SPLIT:
      rc = find_spans(st, st->re, s, n, md, sv);
      if (!rc) rc = emit_spans(s, sv, st->behavior, st->invert, out);
      break;
    case TOK_PRE_DIGITS:
      rc = find_spans(st, NULL, s, n, md, sv);
      if (!rc)
        rc = emit_spans(s, sv, st->individual_digits ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, 0,
                        out);
      break;
    case TOK_PRE_WSPLIT:
      rc = find_spans(st, NULL, s, n, md, sv);
      if (!rc) rc = emit_spans(s, sv, TOK_SPLIT_REMOVED, 0, out);
      break;
    case TOK_PRE_BYTELEVEL: {
      tok_buf tmp = {0};
      if (st->add_prefix_space && (n == 0 || s[0] != ' ')) {
        if (tok_buf_put(&tmp, " ", 1) || tok_buf_put(&tmp, s, n)) rc = ANNA_ENOMEM;
        s = tmp.p;
        n = tmp.n;
      }
      size_t first = out->n;
      if (!rc && st->use_regex) {
        rc = find_spans(st, st->re, s, n, md, sv);
        if (!rc) rc = emit_spans(s, sv, TOK_SPLIT_ISOLATED, 0, out);
      } else if (!rc) {
        rc = pieces_add(out, s, n);
      }
      free(tmp.p);
      if (rc) break;
      /* Map the new pieces byte -> stand-in char, rebuilding them at the buffer's end. */
      for (size_t k = first; k < out->n && !rc; k++) {
        size_t o = out->off[k], l = out->len[k], no = out->buf.n;
        for (size_t j = 0; j < l; j++) {
          unsigned char b = (unsigned char)out->buf.p[o + j];
          if (tok_buf_put(&out->buf, t->bl_enc[b], t->bl_enc_len[b])) {
            rc = ANNA_ENOMEM;
            break;
          }
        }
        out->off[k] = no;
        out->len[k] = out->buf.n - no;
      }
      break;
    }
    case TOK_PRE_METASPACE: {
      tok_buf tmp = {0};
      int prepend = st->prepend_scheme == TOK_PREPEND_ALWAYS ||
                    (st->prepend_scheme == TOK_PREPEND_FIRST && seg_first && pi == 0);
      /* HF checks for a leading marker after replacing spaces, so a leading ' ' counts. */
      if (prepend && n > 0 && s[0] != ' ' &&
          !(n >= st->repl_len && memcmp(s, st->repl, st->repl_len) == 0))
        rc = tok_buf_put(&tmp, st->repl, st->repl_len);
      for (size_t j = 0; j < n && !rc; j++)
        rc = s[j] == ' ' ? tok_buf_put(&tmp, st->repl, st->repl_len) : tok_buf_put(&tmp, s + j, 1);
      if (!rc && tmp.n) {
        if (st->split) {
          tok_step lit = *st;
          lit.re = NULL;
          lit.lit = st->repl;
          lit.lit_len = st->repl_len;
          rc = find_spans(&lit, NULL, tmp.p, tmp.n, md, sv);
          if (!rc) rc = emit_spans(tmp.p, sv, TOK_SPLIT_MERGED_NEXT, 0, out);
        } else {
          rc = pieces_add(out, tmp.p, tmp.n);
        }
      }
      free(tmp.p);
      break;
    }
    default: rc = ANNA_EINVAL;
    }
    if (rc) return rc;
  }
  return 0;
}

int tok_pretokenize(const tokenizer *t, const char *s, size_t n, int seg_first, tok_pieces *out,
                    tok_pieces *tmp, pcre2_match_data *md, char *err, size_t errlen) {
  pieces_clear(out);
  int rc = pieces_add(out, s, n);
  span_vec sv = {0};
  for (size_t i = 0; i < t->pre.n && !rc; i++) {
    rc = pre_step(t, &t->pre.steps[i], out, seg_first, tmp, &sv, md);
    if (!rc) {
      tok_pieces sw = *out;
      *out = *tmp;
      *tmp = sw;
    }
  }
  free(sv.v);
  if (rc == ANNA_ENOMEM) return anna_err(err, errlen, rc, "out of memory");
  if (rc) return anna_err(err, errlen, rc, "pre-tokenizer regex failed on the input text");
  return 0;
}

/* The GPT-2 regex used by ByteLevel(use_regex), compiled into that step's re field. */
int tok_gpt2_regex(pcre2_code **out, char *err, size_t errlen) {
  return tok_regex_compile(out, gpt2_re_src, sizeof gpt2_re_src - 1, err, errlen);
}

/* ---------------------------------------------------------------- decoders */

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int dec_step(const tokenizer *t, const tok_step *st, const char *s, size_t n, int first,
                    tok_buf *out) {
  out->n = 0;
  switch (st->kind) {
  case TOK_DEC_BYTEFALLBACK:
    if (n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>' && hexval(s[3]) >= 0 &&
        hexval(s[4]) >= 0) {
      unsigned char b = (unsigned char)(hexval(s[3]) * 16 + hexval(s[4]));
      return tok_buf_put(out, &b, 1);
    }
    return tok_buf_put(out, s, n);
  case TOK_DEC_BYTELEVEL:
    for (size_t i = 0; i < n;) {
      int32_t c;
      size_t k = utf8_next(s + i, n - i, &c);
      if (c >= 0 && c < 512 && t->bl_dec[c] >= 0) {
        unsigned char b = (unsigned char)t->bl_dec[c];
        if (tok_buf_put(out, &b, 1)) return ANNA_ENOMEM;
      } else if (tok_buf_put(out, s + i, k)) {
        return ANNA_ENOMEM;
      }
      i += k;
    }
    return tok_buf_put(out, "", 0);
  case TOK_DEC_REPLACE:
  case TOK_DEC_METASPACE: {
    const char *pat = st->kind == TOK_DEC_REPLACE ? st->lit : st->repl;
    size_t pl = st->kind == TOK_DEC_REPLACE ? st->lit_len : st->repl_len;
    const char *rep = st->kind == TOK_DEC_REPLACE ? st->repl : " ";
    size_t rl = st->kind == TOK_DEC_REPLACE ? st->repl_len : 1;
    /* HF's Metaspace decoder drops every marker of the first token, not only a leading
     * one ("▁hello▁" -> "hello"); kept for identical output. */
    if (st->kind == TOK_DEC_METASPACE && first && st->prepend_scheme != TOK_PREPEND_NEVER) rl = 0;
    for (size_t i = 0; i < n;) {
      if (pl && i + pl <= n && memcmp(s + i, pat, pl) == 0) {
        if (tok_buf_put(out, rep, rl)) return ANNA_ENOMEM;
        i += pl;
      } else {
        if (tok_buf_put(out, s + i, 1)) return ANNA_ENOMEM;
        i++;
      }
    }
    return tok_buf_put(out, "", 0);
  }
  case TOK_DEC_STRIP: {
    size_t a = 0;
    if (first && st->repl_len)
      for (int k = 0; k < st->strip_left && a + st->repl_len <= n &&
                      memcmp(s + a, st->repl, st->repl_len) == 0;
           k++)
        a += st->repl_len;
    return tok_buf_put(out, s + a, n - a);
  }
  case TOK_DEC_FUSE:
  default: return tok_buf_put(out, s, n);
  }
}

int tok_decode_piece(const tokenizer *t, int32_t id, int first, tok_buf *out, tok_buf *s1,
                     tok_buf *s2) {
  const char *s = t->arena + t->off[id];
  size_t n = t->len[id] == UINT32_MAX ? 0 : t->len[id];
  /* Added tokens go through the decoders too, as in HF (a Replace of the space marker
   * applies to them); ByteLevel leaves chars outside its table as they are. */
  if (t->dec.n == 0) return tok_buf_put(out, s, n);
  s1->n = 0;
  int rc = tok_buf_put(s1, s, n);
  tok_buf *a = s1, *b = s2;
  for (size_t i = 0; i < t->dec.n && !rc; i++) {
    rc = dec_step(t, &t->dec.steps[i], a->p, a->n, first, b);
    tok_buf *sw = a;
    a = b;
    b = sw;
  }
  if (!rc) rc = tok_buf_put(out, a->p, a->n);
  return rc;
}
