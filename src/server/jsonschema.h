/* jsonschema.h: JSON Schema -> a byte-level pushdown recognizer for constrained decoding
 * (response_format json_schema, forced tool-call arguments).
 *
 * A schema is compiled once into an immutable graph of nodes (jsonschema, reference counted,
 * shared across requests and threads; jsonschema_get caches compiled schemas by the hash of
 * their compact text, key order kept). A jschema_state is a small value type over one
 * compiled schema: a set of at most JSCHEMA_MAX_THREADS alternative parses (anyOf and type arrays
 * fork them; a thread dies on a byte it cannot take), each a stack of frames. Copy it to probe.
 *
 * Supported (anything else is an error naming the keyword, never silently ignored):
 *   type (a name or an array of names: object, array, string, number, integer, boolean,
 *   null), properties, required, additionalProperties (false or absent: only declared
 *   properties are generated; true or a schema: an error when properties are declared),
 *   items, minItems, maxItems, enum, const, anyOf, $ref to #, #/$defs/NAME or
 *   #/definitions/NAME (recursion allowed), minLength, maxLength, pattern, format (date,
 *   time, date-time, uuid, email, ipv4), and annotations (title, description, default,
 *   examples, $schema, $id, $comment, deprecated, readOnly, writeOnly).
 * What is generated is a subset of what the schema accepts, chosen so that a sampler can
 * always finish it:
 *   - declared properties come in declaration order (optional ones may be skipped);
 *   - a string with a pattern, format or length bound uses no escapes; a pattern/format
 *     string is printable ASCII without '"' and '\' (patterns: literals, '.', classes with
 *     ranges and \d \w \s (and negations), groups, '|', * + ? {m} {m,} {m,n}; '^' and '$'
 *     only at the ends; unanchored patterns match anywhere, as JSON Schema says);
 *   - numbers have at most JSCHEMA_MAX_NUMBER bytes; whitespace runs at most 16 bytes;
 *   - format date's days stop at 28 (every generated date exists).
 * Lone UTF-16 surrogate escapes are rejected everywhere.
 */
#ifndef ANNA_SERVER_JSONSCHEMA_H
#define ANNA_SERVER_JSONSCHEMA_H

#include <anna/anna.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define JSCHEMA_MAX_THREADS 8
#define JSCHEMA_MAX_DEPTH 32
#define JSCHEMA_MAX_NUMBER 16

typedef struct jsonschema jsonschema;

typedef struct jschema_frame {
  uint16_t node; /* compiled node */
  uint8_t phase; /* where inside the value (jsonschema.c) */
  uint8_t ws;    /* whitespace run */
  uint16_t a, b; /* counters: items, characters, property index, literal position...; a count
                  * no bound reads stops (items without maxItems at minItems, characters
                  * without maxLength at minLength), so states stay canonical (the mask cache) */
  uint32_t pad;
  uint64_t mask; /* live property names or literals */
} jschema_frame;

typedef struct jschema_thread {
  uint8_t depth; /* open frames; 0 with done == 0: before the value */
  uint8_t done;  /* the whole value has been read */
  uint8_t ws;
  uint8_t pad[5];
  uint64_t re[2]; /* pattern positions of the open string */
  jschema_frame f[JSCHEMA_MAX_DEPTH];
} jschema_thread;

typedef struct jschema_state {
  const jsonschema *s; /* borrowed */
  int n;               /* live threads; 0: rejected */
  jschema_thread t[JSCHEMA_MAX_THREADS];
} jschema_state;

/* Compiles schema (borrowed). *out: a new reference (jsonschema_release). ANNA_EINVAL with a
 * message naming the unsupported keyword or bad value and where it is. */
int jsonschema_compile(json_t *schema, jsonschema **out, char *err, size_t errlen);
/* jsonschema_compile through a process-wide cache keyed by the schema's compact text
 * (thread-safe). *out: a new reference. */
int jsonschema_get(json_t *schema, jsonschema **out, char *err, size_t errlen);
void jsonschema_retain(jsonschema *s);
void jsonschema_release(jsonschema *s);

/* Sets st to "nothing read yet" (s borrowed: must outlive st). */
void jsonschema_start(const jsonschema *s, jschema_state *st);
/* Feeds n bytes; 0 while the output is still a prefix of an accepted text, -1 otherwise (st
 * is then unspecified). */
int jsonschema_feed(jschema_state *st, const char *b, size_t n);
/* 1 when the text read so far is complete (end of generation may come). */
int jsonschema_done(const jschema_state *st);
/* 1 when every thread is inside a string that takes any non-control byte (no pattern,
 * format or length bound): tokens that are pieces of a split UTF-8 character fit there. */
int jsonschema_free_string(const jschema_state *st);
/* Copies only the live part of src. */
void jsonschema_copy(jschema_state *dst, const jschema_state *src);

/* The vocabulary in byte order, for the per-step token mask. Built once per engine. */
typedef struct jschema_vocab jschema_vocab;
/* bytes/off: token v is bytes[off[v], off[v+1]); cls[v]: 0 plain, 1 never allowed (special
 * or empty), 2 a split UTF-8 piece (allowed in free strings only, not fed). All borrowed for
 * the vocab's life. *out: caller frees with jsonschema_vocab_free. */
int jsonschema_vocab_build(jschema_vocab **out, const char *bytes, const uint32_t *off,
                           const uint8_t *cls, int V);
/* The same from a tokenizer (borrowed; only used here): each token's text, or for a piece of
 * a split UTF-8 character its raw bytes when its vocabulary piece gives them (byte fallback
 * <0xHH>, GPT-2 byte-level BPE); special and empty tokens are class 1. The vocab owns the
 * tables. ANNA_ENOMEM. */
int jsonschema_vocab_from_text(jschema_vocab **out, const anna_text *text);
/* The tables the vocab reads (borrowed, valid while it lives). */
void jsonschema_vocab_tables(const jschema_vocab *v, const char **bytes, const uint32_t **off,
                             const uint8_t **cls);
void jsonschema_vocab_free(jschema_vocab *v);
/* The feedable tokens (class 0, 1 to 1024 bytes) in byte order, for other recognizers' masks
 * (gbnf.c): tok[i] is entry i, its bytes bytes[boff[i], boff[i + 1]), lcp[i] the common prefix
 * with entry i - 1, skip1[i] / skip2[i] the next entry whose lcp is < 1 / < 2; maxlen the
 * longest entry. All borrowed from v. *nv: the vocabulary size. */
typedef struct jschema_order {
  int n, maxlen;
  const int32_t *tok;
  const uint16_t *lcp;
  const int32_t *skip1, *skip2;
  const char *bytes;
  const uint32_t *boff;
} jschema_order;
void jsonschema_vocab_order(const jschema_vocab *v, jschema_order *o, int *nv);
/* Sets row[v] = -INFINITY for every token whose bytes st does not accept (and every cls 1
 * token); returns how many tokens are left. End of generation is the caller's business
 * (jsonschema_done). Uses the vocab's scratch: one caller at a time. No allocation. */
int jsonschema_vocab_mask(jschema_vocab *v, const jschema_state *st, float *row);
/* Scratch for masking from several threads over one vocab (the vocab is only read): the
 * same mask as jsonschema_vocab_mask, bit for bit, writing only sc and row. One thread per
 * scratch at a time. *out: caller frees with jsonschema_scratch_free (before the vocab).
 * ANNA_ENOMEM. */
typedef struct jschema_scratch jschema_scratch;
int jsonschema_scratch_new(jschema_scratch **out, const jschema_vocab *v);
void jsonschema_scratch_free(jschema_scratch *sc);
int jsonschema_vocab_mask_with(const jschema_vocab *v, jschema_scratch *sc, const jschema_state *st,
                               float *row);
/* A mask kept apart from the logits (the engine's mask pool): row[V] was all 0.0f before the
 * masks ran, so each entry is 0 or -inf; bits[(V + 63) / 64] gets bit v set where row[v] is
 * -inf. jsonschema_bits_apply sets row[v] = -INFINITY where bit v is set, leaving the rest as
 * they are (the same row as masking in place). No allocation. */
void jsonschema_mask_bits(const float *row, int V, uint64_t *bits);
void jsonschema_bits_apply(const uint64_t *bits, int V, float *row);

/* Mask cache (issue 30: masks at batch 64): the rejected-token bitset of a state, kept by the
 * state's key (the compiled schema's compile id and the bytes of the state's live threads and
 * frames, so equal keys are equal states and have the same mask) and shared by every sequence and thread
 * masking over one vocab: 64 requests with one schema compute each state's mask once. The
 * recognizer keeps states canonical (a free string's character count, an unbounded array's
 * item count and stale fields do not split states), so a free string's characters or an
 * array's items reuse one entry. Least recently used entries are dropped to stay within
 * budget_bytes (each entry: its key and the shortest of the allowed ids, the rejected ids or
 * the bitset). Thread-safe (one mutex, held for a look-up and the copy of a hit). A hit
 * allocates nothing; a miss computes the mask and allocates its entry (freeing evicted ones).
 * *out: caller frees with jsonschema_mcache_free (v must outlive it). ANNA_ENOMEM. */
#define JSCHEMA_KEY_MAX (9 + JSCHEMA_MAX_THREADS * sizeof(jschema_thread))
typedef struct jschema_mcache jschema_mcache;
typedef struct jschema_mcache_stats {
  uint64_t hits, misses, inserts, evictions, entries;
  size_t bytes;
} jschema_mcache_stats;
int jsonschema_mcache_new(jschema_mcache **out, const jschema_vocab *v, size_t budget_bytes);
void jsonschema_mcache_free(jschema_mcache *c);
void jsonschema_mcache_get_stats(jschema_mcache *c, jschema_mcache_stats *st);
/* bits[(nv + 63) / 64] := the tokens jsonschema_vocab_mask_with(v, sc, st, row) sets to -inf
 * (bit v set: token v rejected; no bit past nv); returns what that returns. Through c when
 * not NULL (a hit copies the kept mask; a miss masks a zero row in sc and keeps the result),
 * else computed. One thread per scratch at a time; c may be shared. */
int jsonschema_mask_bits_cached(const jschema_vocab *v, jschema_mcache *c, jschema_scratch *sc,
                                const jschema_state *st, uint64_t *bits);

#endif
