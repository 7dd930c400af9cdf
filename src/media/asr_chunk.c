/* asr_chunk.c: qwen-asr's long-audio splitting and transcript joining (asr_chunk.h). */
#include "media/asr_chunk.h"

#include "anna/anna.h"
#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- splitting ---- */

/* The boundary in [left, right) (right - left > win): the quietest sample of the first window
 * of least sum |x|. Sums slide in double, resummed from scratch every win steps; a window with
 * no nonzero sample is exactly 0. */
static int64_t quiet_point(const float *x, int64_t left, int64_t right, int64_t win) {
  double sum = 0, best = INFINITY;
  int64_t nz = 0, best_at = 0;
  for (int64_t i = left; i < left + win; i++) {
    sum += fabs((double)x[i]);
    nz += x[i] != 0;
  }
  for (int64_t k = left;; k++) {
    const double v = nz ? sum : 0.0;
    if (v < best) best = v, best_at = k;
    if (k + win >= right) break;
    nz += (x[k + win] != 0) - (x[k] != 0);
    if (!nz) {
      sum = 0; /* exact again after silence */
    } else if ((k + 1 - left) % win == 0) {
      /* resummed every window length: a running sum keeps the rounding of loud windows it
       * passed (1e-14 after sums near 1e2), which would outweigh a quiet window's true sum */
      sum = 0;
      for (int64_t i = k + 1; i < k + 1 + win; i++)
        sum += fabs((double)x[i]);
    } else {
      sum += fabs((double)x[k + win]) - fabs((double)x[k]);
    }
  }
  int64_t q = best_at;
  for (int64_t i = best_at + 1; i < best_at + win; i++)
    if (fabsf(x[i]) < fabsf(x[q])) q = i;
  return q;
}

int asr_chunk_split(const float *x, int64_t n, int32_t rate, double max_seconds, asr_chunk **out,
                    int32_t *n_out, char *err, size_t errlen) {
  *out = NULL;
  *n_out = 0;
  if (!x || n < 1 || rate < 1 || !(max_seconds > 0) || max_seconds > 1e7)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "asr chunks: need samples, a rate and a chunk length in (0, 1e7] s (got %lld "
                    "samples, rate %d, %g s)",
                    (long long)n, (int)rate, max_seconds);
  const int64_t max_len = (int64_t)(max_seconds * rate);
  const int64_t expand = (int64_t)(ASR_CHUNK_SEARCH_SECONDS * rate);
  int64_t win = (int64_t)((ASR_CHUNK_WINDOW_MS / 1000.0) * rate);
  if (win < 4) win = 4;
  const int64_t min_len = (int64_t)(ASR_CHUNK_MIN_SECONDS * rate);
  if (max_len < 1)
    return anna_err(err, errlen, ANNA_EINVAL, "asr chunks: %g s is under one sample", max_seconds);
  /* at most one piece per max_len samples (each but the last is >= 1 sample past... bounded
   * below by 1 sample, so count as we go) */
  int32_t cap = 8, k = 0;
  asr_chunk *c = malloc(sizeof *c * (size_t)cap);
  if (!c) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if ((double)n / (double)rate <= max_seconds) {
    c[0] = (asr_chunk){0, n, n};
    *out = c;
    *n_out = 1;
    return 0;
  }
  int64_t start = 0;
  for (;;) {
    const int last = !(n - start > max_len);
    int64_t boundary = n;
    if (!last) {
      const int64_t cut = start + max_len;
      const int64_t left = cut - expand > start ? cut - expand : start;
      const int64_t right = cut + expand < n ? cut + expand : n;
      boundary = right - left <= win ? cut : quiet_point(x, left, right, win);
      if (boundary < start + 1) boundary = start + 1;
      if (boundary > n) boundary = n;
    }
    if (k == cap) {
      if (cap > INT32_MAX / 2) {
        free(c);
        return anna_err(err, errlen, ANNA_EINVAL, "asr chunks: too many pieces");
      }
      asr_chunk *nc = realloc(c, sizeof *c * (size_t)(cap *= 2));
      if (!nc) {
        free(c);
        return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      }
      c = nc;
    }
    const int64_t len = boundary - start;
    c[k++] = (asr_chunk){start, len, len < min_len ? min_len : len};
    start = boundary;
    if (last) break;
  }
  *out = c;
  *n_out = k;
  return 0;
}

/* ---- joining ---- */

typedef struct buf {
  char *p;
  size_t n, cap;
} buf;

static int buf_add(buf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t nc = (b->n + n + 1) * 2 + 64;
    char *np = realloc(b->p, nc);
    if (!np) return -1;
    b->p = np, b->cap = nc;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
  return 0;
}

/* One UTF-8 code point at s[0..n) (n >= 1): its value (a lone byte for invalid sequences, so
 * every byte is taken once) and *len. */
static uint32_t cp_at(const unsigned char *s, size_t n, size_t *len) {
  const unsigned c = s[0];
  int k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if ((size_t)k > n) k = 1;
  for (int i = 1; i < k; i++)
    if ((s[i] & 0xC0) != 0x80) k = 1;
  *len = (size_t)k;
  if (k == 1) return c < 0x80 ? c : 0xDC00 + c; /* invalid bytes map to lone surrogates */
  uint32_t v = c & (0x7F >> k);
  for (int i = 1; i < k; i++)
    v = v << 6 | (s[i] & 0x3F);
  return v;
}

/* Python's str.isspace for the code points a transcript may hold. */
static int py_space(uint32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

/* s[0..*n) stripped as str.strip(): returns the new start, *n the new length. */
static const char *strip(const char *s, size_t *n) {
  size_t a = 0, e = *n;
  while (a < e) {
    size_t l;
    if (!py_space(cp_at((const unsigned char *)s + a, e - a, &l))) break;
    a += l;
  }
  /* from the end: find the last non-space code point by a forward scan */
  size_t keep = a;
  for (size_t i = a; i < e;) {
    size_t l;
    const uint32_t c = cp_at((const unsigned char *)s + i, e - i, &l);
    i += l;
    if (!py_space(c)) keep = i;
  }
  *n = keep - a;
  return s + a;
}

/* detect_and_fix_repetitions(s, 20) on code points: cps[0..n) -> the fixed text in *o. The
 * code points keep their byte spans (off[i]..off[i+1]) so output copies the original bytes. */
#define REP_T 20
#define REP_MAXLEN 20
static int fix_repetitions(const char *s, size_t len, buf *o) {
  size_t n = 0;
  for (size_t i = 0, l; i < len; i += l, n++)
    cp_at((const unsigned char *)s + i, len - i, &l);
  uint32_t *cp = malloc(sizeof *cp * (n + 1));
  size_t *off = malloc(sizeof *off * (n + 1));
  uint32_t *a = malloc(sizeof *a * (n + 1));
  size_t *aoff = malloc(sizeof *aoff * (n + 1)); /* a[i]'s source code point */
  int rc = 0;
  if (!cp || !off || !a || !aoff) {
    rc = -1;
    goto done;
  }
  n = 0;
  for (size_t i = 0, l; i < len; i += l, n++) {
    off[n] = i;
    cp[n] = cp_at((const unsigned char *)s + i, len - i, &l);
  }
  off[n] = len;
  /* fix_char_repeats: a run longer than REP_T becomes one character */
  size_t m = 0;
  for (size_t i = 0; i < n;) {
    size_t cnt = 1;
    while (i + cnt < n && cp[i + cnt] == cp[i])
      cnt++;
    const size_t keep = cnt > REP_T ? 1 : cnt;
    for (size_t j = 0; j < keep; j++)
      a[m] = cp[i + j], aoff[m++] = i + j;
    i += cnt;
  }
  /* fix_pattern_repeats: at each position the shortest pattern (1..REP_MAXLEN) repeated
   * REP_T times is kept once (its further repeats dropped); the rest is processed anew (the
   * reference recurses on it) */
#define EMIT(idx) rc = rc ? rc : buf_add(o, s + off[aoff[idx]], off[aoff[idx] + 1] - off[aoff[idx]])
  size_t base = 0; /* the current (sub)string is a[base..m) */
  for (;;) {
    const size_t len2 = m - base;
    if (len2 < 2 * REP_T) {
      for (size_t i = base; i < m; i++)
        EMIT(i);
      break;
    }
    size_t i = 0, next = 0;
    int found = 0;
    while (i + 2 * REP_T <= len2 && !found) {
      for (size_t k = 1; k <= REP_MAXLEN; k++) {
        if (i + k * REP_T > len2) break;
        int valid = 1;
        for (size_t rep = 1; rep < REP_T && valid; rep++)
          for (size_t q = 0; q < k && valid; q++)
            if (a[base + i + rep * k + q] != a[base + i + q]) valid = 0;
        if (!valid) continue;
        size_t end = i + REP_T * k;
        for (;;) {
          int same = end + k <= len2;
          for (size_t q = 0; q < k && same; q++)
            if (a[base + end + q] != a[base + i + q]) same = 0;
          if (!same) break;
          end += k;
        }
        for (size_t q = 0; q < k; q++)
          EMIT(base + i + q);
        next = base + end;
        found = 1;
        break;
      }
      if (!found) {
        EMIT(base + i);
        i++;
      }
    }
    if (!found) {
      for (size_t q = base + i; q < m; q++)
        EMIT(q);
      break;
    }
    base = next;
  }
#undef EMIT
done:
  free(cp), free(off), free(a), free(aoff);
  return rc;
}

/* 0 when a[0..n) equals b[0..n) ignoring ASCII case (Python's lower() on the ASCII we match) */
static int strncasecmp_ascii(const char *a, const char *b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = (char)(x + 32);
    if (y >= 'A' && y <= 'Z') y = (char)(y + 32);
    if (x != y) return 1;
  }
  return 0;
}

/* parse_asr_output(raw, forced): the text appended to *t, the language (or "") to lang. */
static int parse_one(const char *raw, int forced, buf *t, char *lang, size_t cap) {
  lang[0] = 0;
  size_t n = raw ? strlen(raw) : 0;
  const char *s = raw ? strip(raw, &n) : raw;
  if (!n) return 0;
  buf f = {0};
  if (fix_repetitions(s, n, &f)) {
    free(f.p);
    return -1;
  }
  int rc = 0;
  const char *tag = f.p ? strstr(f.p, "<asr_text>") : NULL;
  if (forced || !tag) { /* all text (strip again: the fix may leave edges) */
    size_t k = f.n;
    const char *p = forced ? f.p : strip(f.p, &k);
    rc = buf_add(t, p, forced ? f.n : k);
    free(f.p);
    return rc;
  }
  const size_t meta_n = (size_t)(tag - f.p);
  const char *txt = tag + 10;
  size_t tn = f.n - meta_n - 10;
  txt = strip(txt, &tn);
  int none = 0;
  for (size_t i = 0; i + 13 <= meta_n && !none; i++)
    none = !strncasecmp_ascii(f.p + i, "language none", 13);
  if (!none) {
    /* the first non-empty line starting with "language " (any case) names it */
    for (size_t i = 0; i < meta_n;) {
      size_t e = i;
      while (e < meta_n && f.p[e] != '\n' && f.p[e] != '\r')
        e++;
      size_t ln = e - i;
      const char *line = strip(f.p + i, &ln);
      i = e + 1;
      if (!ln) continue;
      if (ln >= 9 && !strncasecmp_ascii(line, "language ", 9)) {
        size_t vn = ln - 9;
        const char *v = strip(line + 9, &vn);
        if (vn) {
          size_t k = vn < cap - 1 ? vn : cap - 1;
          for (size_t q = 0; q < k; q++) {
            const char ch = v[q];
            lang[q] = (char)(q == 0 ? (ch >= 'a' && ch <= 'z' ? ch - 32 : ch)
                                    : (ch >= 'A' && ch <= 'Z' ? ch + 32 : ch));
          }
          lang[k] = 0;
        }
        break;
      }
    }
  }
  rc = buf_add(t, txt, tn);
  free(f.p);
  return rc;
}

int asr_chunk_join(const char *const *raw, int32_t n, int forced, char **text, char **language,
                   char *err, size_t errlen) {
  *text = *language = NULL;
  buf t = {0}, l = {0};
  char prev[64] = "";
  int rc = buf_add(&t, "", 0) || buf_add(&l, "", 0);
  for (int32_t i = 0; i < n && !rc; i++) {
    char lang[64];
    rc = parse_one(raw[i], forced, &t, lang, sizeof lang);
    if (rc || !lang[0] || !strcmp(lang, prev)) continue;
    rc = (l.n && buf_add(&l, ",", 1)) || buf_add(&l, lang, strlen(lang));
    snprintf(prev, sizeof prev, "%s", lang);
  }
  if (rc) {
    free(t.p), free(l.p);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  *text = t.p;
  *language = l.p;
  return 0;
}
