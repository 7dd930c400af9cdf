/* gbnf.h: GBNF grammars (llama.cpp's syntax, the `grammar` request field) -> an incremental
 * pushdown recognizer for constrained decoding, with the same token-mask interface as the
 * JSON Schema one (jsonschema.h) and over the same byte-ordered vocabulary.
 *
 * Syntax (as llama.cpp's grammars/README.md describes it):
 *   rule      ::= NAME "::=" alternatives     (a rule ends at a newline outside parentheses)
 *   alternatives: sequences separated by '|'; a sequence of items, each optionally followed
 *   by * + ? {m} {m,} {m,n} {,n}; items: "literal" (escapes \n \r \t \\ \" \' \[ \] \- \/
 *   \xHH \uHHHH \UHHHHHHHH), [char class] ([^...] negated, a-z ranges, the same escapes),
 *   '.' (any character), a rule NAME ([a-zA-Z0-9_-]+), ( group ). '#' starts a comment to
 *   the end of the line. The start rule is `root`.
 * Not supported (a compile error): llama.cpp's token references (<token>, <[id]>, !<...>).
 * Characters are Unicode code points; the text is UTF-8 and fed as bytes (a code point split
 * across tokens is checked as far as its first bytes allow).
 * Compile-time errors (ANNA_EINVAL, "line L, column C: problem"): syntax errors, undefined
 * rules, a missing root, a rule defined twice, left recursion (directly or through rules
 * that can match the empty string: the matcher would loop), repetition counts > 1000.
 *
 * A grammar is compiled once into an immutable, reference-counted gbnf (gbnf_get caches by
 * the text). A gbnf_state is a value type: the set of parse stacks (at most GBNF_MAX_STACKS
 * alternatives, GBNF_MAX_ELEMS stack entries in all, GBNF_MAX_DEPTH per stack; parses that
 * would exceed these bounds are dropped, so a very ambiguous or deeply nested grammar may
 * reject a text it describes: documented bound, like JSCHEMA_MAX_THREADS).
 */
#ifndef ANNA_SERVER_GBNF_H
#define ANNA_SERVER_GBNF_H

#include "jsonschema.h"

#include <stddef.h>
#include <stdint.h>

#define GBNF_MAX_STACKS 512
#define GBNF_MAX_ELEMS 4096
#define GBNF_MAX_DEPTH 256
#define GBNF_MAX_REPEAT 1000
#define GBNF_MASK_CACHE 16

typedef struct gbnf gbnf;

typedef struct gbnf_state {
  const gbnf *g;     /* borrowed */
  uint16_t n;        /* live stacks; 0: rejected */
  uint16_t used;     /* entries of el in use */
  uint8_t part_left; /* continuation bytes still due of a split UTF-8 character */
  uint8_t part_len;  /* that character's length in bytes */
  uint8_t pad[2];
  uint32_t part;                     /* the bits read so far of that character */
  uint16_t off[GBNF_MAX_STACKS + 1]; /* stack i is el[off[i], off[i + 1]), top last */
  uint32_t el[GBNF_MAX_ELEMS];       /* grammar positions; the top is the next to match */
} gbnf_state;

/* Compiles text (n bytes, borrowed). *out: a new reference (gbnf_release). ANNA_EINVAL with
 * "line L, column C: problem" in err; ANNA_ENOMEM. */
int gbnf_compile(const char *text, size_t n, gbnf **out, char *err, size_t errlen);
/* gbnf_compile through a process-wide cache keyed by the text (thread-safe). */
int gbnf_get(const char *text, size_t n, gbnf **out, char *err, size_t errlen);
void gbnf_retain(gbnf *g);
void gbnf_release(gbnf *g);

/* Sets st to "nothing read yet" (g borrowed: must outlive st). */
void gbnf_start(const gbnf *g, gbnf_state *st);
/* Feeds n bytes; 0 while the text is still a prefix of one the grammar accepts, -1 otherwise
 * (st unchanged then). */
int gbnf_feed(gbnf_state *st, const char *b, size_t n);
/* 1 when the text read so far is a whole sentence of the grammar (end may come). */
int gbnf_done(const gbnf_state *st);
/* 1 when the text may also go on (some parse wants more). */
int gbnf_more(const gbnf_state *st);
void gbnf_copy(gbnf_state *dst, const gbnf_state *src);

/* The per-step token mask over a jsonschema vocabulary (borrowed: must outlive the masker).
 * Scratch for one caller at a time; *out: gbnf_masker_free. ANNA_ENOMEM. */
typedef struct gbnf_masker gbnf_masker;
int gbnf_masker_new(gbnf_masker **out, const jschema_vocab *v);
void gbnf_masker_free(gbnf_masker *m);
/* Sets row[v] = -INFINITY for every token whose bytes st does not accept (and every token the
 * vocabulary cannot feed: special, empty, unknown split pieces); returns how many are left.
 * End of generation is the caller's business (gbnf_done). No allocation. The masks of the
 * last GBNF_MASK_CACHE states (any request's; keyed by the grammar's compile and the whole
 * state) are kept: a state met again (a loop such as a string's characters, or the same
 * grammar in several sequences of a batch) costs a list copy instead of a vocabulary walk. */
int gbnf_mask(gbnf_masker *m, const gbnf_state *st, float *row);
/* Mask cache hits and misses so far (for benchmarks). */
void gbnf_masker_stats(const gbnf_masker *m, uint64_t *hits, uint64_t *misses);

#endif
