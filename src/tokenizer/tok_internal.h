/* tok_internal.h: the tokenizer object shared by its constructors (tok_json.c,
 * tok_vocab.c), the text pipeline (tok_pipeline.c) and the encoder/decoder (tok_core.c).
 * Not for use outside src/tokenizer/. Everything here is owned by the tokenizer and freed by
 * tokenizer_free; after a constructor returns, nothing in it is written again.
 */
#ifndef ANNA_TOKENIZER_TOK_INTERNAL_H
#define ANNA_TOKENIZER_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* Ids above this are rejected as corrupt: no real vocabulary comes near it, and it keeps
 * id arithmetic far from int32 overflow. */
#define TOK_MAX_ID (1 << 24)

enum tok_model_kind {
  TOK_MODEL_BPE, /* merge ranks from an explicit merge list (tokenizer.json, GGUF gpt2) */
  TOK_MODEL_SPM, /* llama.cpp SentencePiece: merge the adjacent pair of highest score */
};

enum tok_flag {
  TOK_FLAG_ADDED = 1,   /* matched in raw text before the pipeline */
  TOK_FLAG_SPECIAL = 2, /* control token: skippable in decode, not parsed if asked */
  TOK_FLAG_LSTRIP = 4,
  TOK_FLAG_RSTRIP = 8,
  TOK_FLAG_SINGLE_WORD = 16,
};

enum tok_norm_kind {
  TOK_NORM_NFC,
  TOK_NORM_NFD,
  TOK_NORM_NFKC,
  TOK_NORM_NFKD,
  TOK_NORM_LOWERCASE,
  TOK_NORM_REPLACE, /* a (literal or regex) -> b */
  TOK_NORM_PREPEND, /* b before every non-empty segment */
  TOK_NORM_STRIP,   /* whitespace at left / right */
};

enum tok_split_behavior {
  TOK_SPLIT_ISOLATED,
  TOK_SPLIT_REMOVED,
  TOK_SPLIT_MERGED_PREV,
  TOK_SPLIT_MERGED_NEXT,
  TOK_SPLIT_CONTIGUOUS,
};

enum tok_pre_kind {
  TOK_PRE_SPLIT,     /* regex or literal, behavior, invert */
  TOK_PRE_BYTELEVEL, /* optional GPT-2 regex split, optional prefix space, byte -> char map */
  TOK_PRE_METASPACE, /* ' ' -> replacement, prepend scheme, optional split */
  TOK_PRE_DIGITS,    /* isolate digits (one each, or runs) */
  TOK_PRE_WSPLIT,    /* WhitespaceSplit: split on whitespace, drop it */
};

enum tok_prepend_scheme { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };

enum tok_dec_kind {
  TOK_DEC_BYTELEVEL,
  TOK_DEC_METASPACE,
  TOK_DEC_REPLACE,
  TOK_DEC_BYTEFALLBACK,
  TOK_DEC_FUSE,
  TOK_DEC_STRIP,
};

/* One step of a normalizer, pre-tokenizer or decoder. Strings are owned (malloc). */
typedef struct tok_step {
  int kind;
  pcre2_code *re; /* regex pattern, or NULL when lit is a literal pattern */
  char *lit;
  size_t lit_len;
  char *repl; /* Replace content, Prepend text, Metaspace replacement, Strip content */
  size_t repl_len;
  int behavior, invert;
  int add_prefix_space, use_regex;
  int prepend_scheme, split;
  int individual_digits;
  int strip_left, strip_right; /* counts for the Strip decoder, flags for the normalizer */
} tok_step;

typedef struct tok_pipe {
  tok_step *steps;
  size_t n, cap;
} tok_pipe;

/* String -> id, open addressing over the tokenizer's piece store (slots hold ids). */
typedef struct tok_strmap {
  int32_t *slots;
  size_t cap; /* power of two, 0 = empty map */
} tok_strmap;

/* (left id, right id) -> (rank, merged id). */
typedef struct tok_mergemap {
  uint64_t *keys; /* (left << 32 | right) + 1; 0 = empty slot */
  int32_t *rank, *result;
  size_t cap, count;
} tok_mergemap;

struct tokenizer {
  int kind;
  int32_t n_vocab;
  /* Piece store: piece of id i is arena + off[i], len[i] bytes, NUL-terminated;
   * len[i] == UINT32_MAX marks a hole. */
  char *arena;
  size_t arena_len, arena_cap;
  size_t *off;
  uint32_t *len;
  uint8_t *flags;
  float *scores; /* SPM only */
  tok_strmap map;
  tok_mergemap merges;

  int byte_fallback, fuse_unk, ignore_merges;
  int32_t byte_ids[256]; /* <0xNN> tokens, -1 if missing */
  int32_t unk_id, bos_id, eos_id, pad_id, eot_id;

  /* ADD_SPECIAL: ids before and after each encoded text (post-processor or add_bos/eos). */
  int32_t *post_pre, *post_post;
  size_t n_post_pre, n_post_post;

  tok_pipe norm, pre, dec;

  /* Added-token matcher: ids sorted by id; per first byte, the distinct lengths of added
   * tokens that start with it, longest first, so matching is leftmost-longest. */
  tokenizer_added_token *added;
  size_t n_added;
  tok_strmap added_map;
  uint32_t *len_lists[256];
  size_t n_len_lists[256];

  int32_t *eog;
  size_t n_eog;

  /* Byte-level tables: byte -> UTF-8 of its printable stand-in, and back. */
  char bl_enc[256][3];
  uint8_t bl_enc_len[256];
  int16_t bl_dec[512];
};

/* --- tok_core.c: construction helpers used by both constructors --- */
int tok_alloc(tokenizer **out, int32_t n_vocab, char *err, size_t errlen);
/* Stores the piece for id (copied). Replaces an existing one. */
int tok_set_piece(tokenizer *t, int32_t id, const char *s, size_t n, char *err, size_t errlen);
/* After all pieces are set: builds the lookup map, byte tables, added-token matcher, eog. */
int tok_finish(tokenizer *t, char *err, size_t errlen);
int tok_merge_add(tokenizer *t, int32_t left, int32_t right, int32_t result, int32_t rank,
                  char *err, size_t errlen);
int32_t tok_map_find(const tokenizer *t, const tok_strmap *m, const char *s, size_t n);
void tok_eog_add(tokenizer *t, int32_t id);

/* --- tok_pipeline.c --- */
tok_step *tok_pipe_push(tok_pipe *p, int kind);
void tok_pipe_free(tok_pipe *p);
/* Compiles a regex for Split / Replace (UTF + UCP, JIT when available). */
int tok_regex_compile(pcre2_code **out, const char *pat, size_t len, char *err, size_t errlen);
void tok_bytelevel_init(tokenizer *t);

/* A growable byte buffer. */
typedef struct tok_buf {
  char *p;
  size_t n, cap;
} tok_buf;
int tok_buf_put(tok_buf *b, const void *s, size_t n);

/* Pieces of one pre-tokenized segment: spans into buf. */
typedef struct tok_pieces {
  tok_buf buf;
  size_t *off, *len;
  size_t n, cap;
} tok_pieces;
void tok_pieces_free(tok_pieces *p);

/* Runs the normalizer on one segment: out receives the normalized bytes (replacing its
 * content). seg_first: the segment starts the input (Prepend scheme "first"). */
int tok_normalize(const tokenizer *t, const char *s, size_t n, tok_buf *out, pcre2_match_data *md,
                  char *err, size_t errlen);
/* Runs the pre-tokenizer: out receives the pieces (cleared first). */
int tok_pretokenize(const tokenizer *t, const char *s, size_t n, int seg_first, tok_pieces *out,
                    tok_pieces *tmp, pcre2_match_data *md, char *err, size_t errlen);
/* Decodes one token's piece to bytes (appended to out; s1, s2 are reusable scratch). first: the
 * token is the first one output (Metaspace / Strip decoders drop a leading space there). */
int tok_decode_piece(const tokenizer *t, int32_t id, int first, tok_buf *out, tok_buf *s1,
                     tok_buf *s2);
/* Unicode White_Space (what Rust's char::is_whitespace accepts). */
int tok_is_ws(int32_t c);
int tok_gpt2_regex(pcre2_code **out, char *err, size_t errlen);

#endif
