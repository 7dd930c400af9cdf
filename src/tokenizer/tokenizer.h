/* tokenizer.h: text <-> token ids for the models anna runs.
 *
 * One tokenizer object holds an immutable vocabulary, the merge table (or, for
 * SentencePiece vocabularies from GGUF, the piece scores), the added/special tokens, and
 * the normalizer / pre-tokenizer / decoder pipeline. Two constructors share all of it:
 *   - tokenizer_load_json: a Hugging Face tokenizer.json (or a model folder holding one,
 *     plus tokenizer_config.json / generation_config.json for bos/eos when present);
 *   - tokenizer_create_from_vocab: the vocabulary description a GGUF file carries, filled by
 *     the GGUF reader into a tokenizer_vocab_desc (all memory borrowed; copied on create).
 * After construction the object is read-only: any number of threads may call encode,
 * decode and the lookups on one tokenizer at once. A tokenizer_stream (streaming decoder)
 * is per-sequence mutable state owned by one thread and must not outlive its tokenizer.
 * Strings returned by lookups are borrowed and live as long as the tokenizer.
 */
#ifndef ANNA_TOKENIZER_TOKENIZER_H
#define ANNA_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer;
typedef struct tokenizer_stream tokenizer_stream;

/* Token types, numbered as GGUF's tokenizer.ggml.token_type (llama.cpp's enum). */
enum tokenizer_token_type {
  TOKENIZER_TOKEN_UNDEFINED = 0,
  TOKENIZER_TOKEN_NORMAL = 1,
  TOKENIZER_TOKEN_UNKNOWN = 2,
  TOKENIZER_TOKEN_CONTROL = 3,
  TOKENIZER_TOKEN_USER_DEFINED = 4,
  TOKENIZER_TOKEN_UNUSED = 5,
  TOKENIZER_TOKEN_BYTE = 6,
};

/* What GGUF metadata carries (tokenizer.ggml.*). Every pointer is borrowed for the duration
 * of tokenizer_create_from_vocab only; strings need not be NUL-terminated (lengths given).
 *   model:  "gpt2" (byte-level BPE: tokens + merges) or "llama" (SentencePiece: tokens +
 *           scores, merges implied by scores, <0xNN> byte fallback).
 *   pre:    tokenizer.ggml.pre for "gpt2": "qwen2", "qwen35", "llama-bpe", "smollm",
 *           "default"/"gpt2" (NULL = "default"). Ignored for "llama".
 *   merges: "left right" strings (one space between), rank = index. May be NULL for llama.
 *   scores, token_types: n_tokens entries each, or NULL (scores required for "llama").
 *   ids: -1 when absent. add_bos/add_eos: 1/0, or -1 for the model's default.
 *   add_space_prefix: llama only (tokenizer.ggml.add_space_prefix), -1 = default (1). */
typedef struct tokenizer_vocab_desc {
  const char *model;
  const char *pre;
  size_t n_tokens;
  const char *const *tokens;
  const size_t *token_lens;
  const float *scores;
  const int32_t *token_types;
  size_t n_merges;
  const char *const *merges;
  const size_t *merge_lens;
  int32_t bos_id, eos_id, pad_id, unk_id, eot_id;
  int add_bos, add_eos, add_space_prefix;
} tokenizer_vocab_desc;

/* Sets every field of d to "absent" (ids -1, flags -1, pointers NULL). */
void tokenizer_vocab_desc_init(tokenizer_vocab_desc *d);

/* path: a tokenizer.json file, or a folder that holds one. On success *out is owned by the
 * caller (tokenizer_free). Errors: ANNA_EIO, ANNA_EFORMAT, ANNA_EUNSUPPORTED, ANNA_ENOMEM. */
int tokenizer_load_json(tokenizer **out, const char *path, char *err, size_t errlen);

/* Same, from tokenizer.json text already in memory (borrowed). */
int tokenizer_load_json_text(tokenizer **out, const char *json, size_t len, char *err,
                             size_t errlen);

/* Builds from a GGUF vocabulary description (borrowed; copied). Caller frees *out. */
int tokenizer_create_from_vocab(tokenizer **out, const tokenizer_vocab_desc *d, char *err,
                                size_t errlen);

void tokenizer_free(tokenizer *tok);

enum tokenizer_encode_flags {
  /* Add what the post-processor / add_bos / add_eos says (e.g. <s> or <|begin_of_text|>). */
  TOKENIZER_ENCODE_ADD_SPECIAL = 1,
  /* Treat the text of special tokens as plain text (for untrusted user input). Non-special
   * added tokens are still matched. */
  TOKENIZER_ENCODE_NO_PARSE_SPECIAL = 2,
};

/* Encodes len bytes of UTF-8 text (need not be NUL-terminated). On success *ids (caller
 * frees with free()) holds *n ids; *ids may be NULL when *n == 0. flags: the bits above
 * (passing 1 means "add special tokens"). Errors: ANNA_EINVAL for invalid UTF-8. */
int tokenizer_encode(const tokenizer *tok, const char *text, size_t len, int flags, int32_t **ids,
                     size_t *n, char *err, size_t errlen);

enum tokenizer_decode_flags {
  TOKENIZER_DECODE_SKIP_SPECIAL = 1, /* drop special (control) tokens from the output */
};

/* Decodes n ids to text. *text (caller frees) is NUL-terminated, *len excludes the NUL.
 * Byte sequences that are not valid UTF-8 come out as U+FFFD. ANNA_ERANGE for a bad id. */
int tokenizer_decode(const tokenizer *tok, const int32_t *ids, size_t n, int flags, char **text,
                     size_t *len, char *err, size_t errlen);

/* Streaming decoder: feed one id at a time; only complete UTF-8 characters come out, so a
 * character split across tokens (byte fallback, byte-level pieces) appears once whole.
 * Caller frees with tokenizer_stream_free. */
int tokenizer_stream_new(tokenizer_stream **out, const tokenizer *tok, int flags, char *err,
                         size_t errlen);
void tokenizer_stream_free(tokenizer_stream *s);
/* Writes the newly completed bytes to out (cap bytes; 64 always suffices for one token of
 * a real vocabulary, ANNA_ERANGE if not) and their count to *out_len (may be 0). */
int tokenizer_stream_feed(tokenizer_stream *s, int32_t id, char *out, size_t cap, size_t *out_len,
                          char *err, size_t errlen);
/* Emits what is still held (an incomplete character becomes U+FFFD) and resets the stream
 * for a new sequence. */
int tokenizer_stream_flush(tokenizer_stream *s, char *out, size_t cap, size_t *out_len, char *err,
                           size_t errlen);

/* Lookups. */
int32_t tokenizer_n_vocab(const tokenizer *tok);
/* Id of a vocabulary piece or added token as written in the vocabulary ("Ġthe", "▁the",
 * "<|im_end|>"), NUL-terminated; -1 if none. */
int32_t tokenizer_token_id(const tokenizer *tok, const char *piece);
int32_t tokenizer_token_id_n(const tokenizer *tok, const char *piece, size_t len);
/* The stored piece for id (borrowed, NUL-terminated), *len its length; NULL for an id out of
 * range or a hole in the id space. */
const char *tokenizer_token_str(const tokenizer *tok, int32_t id, size_t *len);
int tokenizer_token_is_special(const tokenizer *tok, int32_t id);

int32_t tokenizer_bos_id(const tokenizer *tok); /* -1 if none */
int32_t tokenizer_eos_id(const tokenizer *tok); /* -1 if none */
int32_t tokenizer_pad_id(const tokenizer *tok); /* -1 if none */
int32_t tokenizer_unk_id(const tokenizer *tok); /* -1 if none */

/* End-of-generation ids: eos, eot, generation_config.json's eos_token_id list, and added
 * special tokens that end a turn (<|im_end|>, <|eot_id|>, <end_of_turn>, ...). Borrowed. */
const int32_t *tokenizer_eog_ids(const tokenizer *tok, size_t *n);
int tokenizer_is_eog(const tokenizer *tok, int32_t id);

/* Added tokens (tokenizer.json added_tokens, or CONTROL/USER_DEFINED types from GGUF), in
 * id order. Borrowed. */
typedef struct tokenizer_added_token {
  int32_t id;
  const char *content;
  size_t len;
  int special;
} tokenizer_added_token;
const tokenizer_added_token *tokenizer_added_tokens(const tokenizer *tok, size_t *n);

#endif
