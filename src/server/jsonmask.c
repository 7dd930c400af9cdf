/* jsonmask.c: byte-at-a-time JSON prefix recognizer (see jsonmask.h). */
#include "jsonmask.h"

#include <string.h>

enum {
  ST_START,     /* before the top-level '{' */
  ST_VALUE,     /* a value must come */
  ST_ARR_FIRST, /* after '[': a value or ']' */
  ST_OBJ_FIRST, /* after '{': a key or '}' */
  ST_OBJ_KEY,   /* after ',' in an object: a key */
  ST_COLON,     /* after a key */
  ST_AFTER,     /* after a value: ',' or the closing bracket */
  ST_STRING,
  ST_ESCAPE,
  ST_UNICODE, /* sub = hex digits read */
  ST_NUMBER,  /* sub = number phase below */
  ST_LITERAL, /* sub = literal index * 8 + position */
  ST_DONE,
};

enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

/* surr bits: the escape being read is a high / low surrogate; a high one was read and the
 * next character must be the low one's \u escape. */
enum { SU_D = 1, SU_HI = 2, SU_LO = 4, SU_PEND = 8 };

static const char *const LITERALS[3] = {"true", "false", "null"};

void jsonmask_init(jsonmask *m) {
  memset(m, 0, sizeof *m);
  m->st = ST_START;
}

int jsonmask_done(const jsonmask *m) {
  return m->st == ST_DONE;
}

int jsonmask_in_string(const jsonmask *m) {
  return m->st == ST_STRING;
}

static int is_ws(int c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int is_digit(int c) {
  return c >= '0' && c <= '9';
}

/* A value (string, number, literal or container) ended: what may follow. */
static void value_end(jsonmask *m) {
  m->st = m->depth == 0 ? ST_DONE : ST_AFTER;
  m->ws = 0;
}

static int open_container(jsonmask *m, char c) {
  if (m->depth >= JSONMASK_MAX_DEPTH) return -1;
  m->stack[m->depth++] = c;
  m->st = c == '{' ? ST_OBJ_FIRST : ST_ARR_FIRST;
  m->ws = 0;
  return 0;
}

static int close_container(jsonmask *m, char c) {
  if (m->depth == 0 || m->stack[m->depth - 1] != (c == '}' ? '{' : '[')) return -1;
  m->depth--;
  value_end(m);
  return 0;
}

static int skip_ws(jsonmask *m, int c) {
  if (!is_ws(c)) return 0;
  return ++m->ws <= JSONMASK_MAX_WS ? 1 : -1;
}

/* Starts a value with byte c (state VALUE or ARR_FIRST). */
static int value_start(jsonmask *m, int c) {
  m->ws = 0;
  if (c == '{' || c == '[') return open_container(m, (char)c);
  if (c == '"') {
    m->st = ST_STRING;
    m->key = 0;
    return 0;
  }
  if (c == '-' || is_digit(c)) {
    m->st = ST_NUMBER;
    m->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
    return 0;
  }
  for (int i = 0; i < 3; i++)
    if (c == LITERALS[i][0]) {
      m->st = ST_LITERAL;
      m->sub = (uint8_t)(i * 8 + 1);
      return 0;
    }
  return -1;
}

static int byte(jsonmask *m, int c) {
  int w;
  switch (m->st) {
  case ST_START:
    /* A reply has no reason to open with whitespace; allowing 16 bytes here let a weak
     * model spend a whole short budget before its '{'. */
    if (is_ws(c)) return ++m->ws <= JSONMASK_MAX_LEAD_WS ? 0 : -1;
    if (c != '{') return -1;
    return open_container(m, '{');
  case ST_VALUE:
    if ((w = skip_ws(m, c))) return w < 0 ? -1 : 0;
    return value_start(m, c);
  case ST_ARR_FIRST:
    if ((w = skip_ws(m, c))) return w < 0 ? -1 : 0;
    if (c == ']') return close_container(m, ']');
    return value_start(m, c);
  case ST_OBJ_FIRST:
  case ST_OBJ_KEY:
    if ((w = skip_ws(m, c))) return w < 0 ? -1 : 0;
    if (c == '}' && m->st == ST_OBJ_FIRST) return close_container(m, '}');
    if (c != '"') return -1;
    m->st = ST_STRING;
    m->key = 1;
    m->ws = 0;
    return 0;
  case ST_COLON:
    if ((w = skip_ws(m, c))) return w < 0 ? -1 : 0;
    if (c != ':') return -1;
    m->st = ST_VALUE;
    m->ws = 0;
    return 0;
  case ST_AFTER:
    if ((w = skip_ws(m, c))) return w < 0 ? -1 : 0;
    if (c == ',') {
      m->st = m->stack[m->depth - 1] == '{' ? ST_OBJ_KEY : ST_VALUE;
      m->ws = 0;
      return 0;
    }
    if (c == '}' || c == ']') return close_container(m, (char)c);
    return -1;
  case ST_STRING:
    if ((m->surr & SU_PEND) && c != '\\') return -1;
    if (c == '"') {
      if (m->key) {
        m->st = ST_COLON;
        m->ws = 0;
      } else {
        value_end(m);
      }
      return 0;
    }
    if (c == '\\') {
      m->st = ST_ESCAPE;
      return 0;
    }
    return c < 0x20 ? -1 : 0;
  case ST_ESCAPE:
    if (c == 'u') {
      m->st = ST_UNICODE;
      m->sub = 0;
      m->surr &= SU_PEND;
      return 0;
    }
    if (m->surr & SU_PEND) return -1;
    if (!strchr("\"\\/bfnrt", c) || c == 0) return -1;
    m->st = ST_STRING;
    return 0;
  case ST_UNICODE:
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return -1;
    if (m->sub == 0 && (c == 'd' || c == 'D')) m->surr |= SU_D;
    if (m->sub == 1) {
      int v = c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
      if (m->surr & SU_D) m->surr |= v >= 0xc ? SU_LO : v >= 0x8 ? SU_HI : 0;
      /* After a high surrogate only a low one; a low one only there. */
      if (!(m->surr & SU_PEND) != !(m->surr & SU_LO)) return -1;
    }
    if (++m->sub == 4) {
      m->st = ST_STRING;
      m->surr = (m->surr & SU_HI) ? SU_PEND : 0;
    }
    return 0;
  case ST_NUMBER:
    switch (m->sub) {
    case N_MINUS:
      if (!is_digit(c)) return -1;
      m->sub = c == '0' ? N_ZERO : N_INT;
      return 0;
    case N_ZERO:
    case N_INT:
      if (is_digit(c) && m->sub == N_INT) return 0;
      if (c == '.') {
        m->sub = N_DOT;
        return 0;
      }
      if (c == 'e' || c == 'E') {
        m->sub = N_E;
        return 0;
      }
      break; /* the number ended: c belongs to what follows */
    case N_DOT:
      if (!is_digit(c)) return -1;
      m->sub = N_FRAC;
      return 0;
    case N_FRAC:
      if (is_digit(c)) return 0;
      if (c == 'e' || c == 'E') {
        m->sub = N_E;
        return 0;
      }
      break;
    case N_E:
      if (c == '+' || c == '-') {
        m->sub = N_ESIGN;
        return 0;
      }
      if (!is_digit(c)) return -1;
      m->sub = N_EXP;
      return 0;
    case N_ESIGN:
      if (!is_digit(c)) return -1;
      m->sub = N_EXP;
      return 0;
    case N_EXP:
      if (is_digit(c)) return 0;
      break;
    }
    value_end(m);
    return byte(m, c);
  case ST_LITERAL: {
    const char *lit = LITERALS[m->sub / 8];
    int pos = m->sub % 8;
    if (c != lit[pos]) return -1;
    if (lit[pos + 1] == '\0')
      value_end(m);
    else
      m->sub++;
    return 0;
  }
  case ST_DONE:
    if ((w = skip_ws(m, c))) return w < 0 ? -1 : 0;
    return -1;
  }
  return -1;
}

int jsonmask_feed(jsonmask *m, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (byte(m, (unsigned char)s[i])) return -1;
  return 0;
}
