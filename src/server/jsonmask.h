/* jsonmask.h: an incremental JSON recognizer for constrained decoding
 * (response_format json_object / json_schema): which next tokens keep the output a
 * prefix of one valid JSON object.
 *
 * The state is a small value type (copy it to try a token), fed raw bytes. It accepts
 * exactly the prefixes of RFC 8259 texts whose top-level value is an object, with at most
 * JSONMASK_MAX_WS consecutive whitespace bytes between tokens and JSONMASK_MAX_LEAD_WS
 * before the opening '{' (so a model cannot idle on whitespace) and nesting up to
 * JSONMASK_MAX_DEPTH. Bytes >= 0x80 are accepted inside strings only; UTF-8 validity is the
 * tokenizer's business. A \u escape of a UTF-16 surrogate is accepted only as a high one
 * directly followed by a low one (lone ones are what JSON parsers reject).
 */
#ifndef ANNA_SERVER_JSONMASK_H
#define ANNA_SERVER_JSONMASK_H

#include <stddef.h>
#include <stdint.h>

#define JSONMASK_MAX_DEPTH 48
#define JSONMASK_MAX_WS 16
#define JSONMASK_MAX_LEAD_WS 2

typedef struct jsonmask {
  uint8_t st;                     /* parser state (jsonmask.c) */
  uint8_t sub;                    /* position inside a literal, escape or number */
  uint8_t key;                    /* the current string is an object key */
  uint8_t ws;                     /* consecutive whitespace so far */
  uint8_t surr;                   /* \u escape surrogate bookkeeping (jsonmask.c) */
  int16_t depth;                  /* open containers */
  char stack[JSONMASK_MAX_DEPTH]; /* '{' or '[' */
} jsonmask;

void jsonmask_init(jsonmask *m);
/* Feeds n bytes; returns 0 when the output is still a valid prefix, -1 otherwise (the
 * state is then unspecified: feed copies when probing). */
int jsonmask_feed(jsonmask *m, const char *s, size_t n);
/* 1 when a complete object has been read (only end of generation may follow). */
int jsonmask_done(const jsonmask *m);
/* 1 when the next byte is inside a string (where any non-control byte is fine). */
int jsonmask_in_string(const jsonmask *m);

#endif
