/* tok_testutil.h: helpers shared by the tokenizer tests: a check counter, comparison of
 * a tokenizer against expected ids/decoded text (including the streaming decoder), and
 * vocab descriptions built from a tokenizer.json or a dumped GGUF vocabulary (the way the
 * GGUF reader fills tokenizer_vocab_desc). */
#ifndef ANNA_TESTS_TOK_TESTUTIL_H
#define ANNA_TESTS_TOK_TESTUTIL_H

#include <jansson.h>
#include <stdio.h>

#include "tokenizer/tokenizer.h"

extern int tt_failures, tt_checks;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    tt_checks++;                                                                                   \
    if (!(cond)) {                                                                                 \
      tt_failures++;                                                                               \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                         \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
    }                                                                                              \
  } while (0)

void tt_print_ids(const char *what, const int32_t *ids, size_t n);
/* cases[i]: {"ids": [...], "decoded": "..."}; texts: parallel array of strings, or NULL
 * when each case carries its own "text". flags go to tokenizer_encode. */
void tt_check_cases(const tokenizer *tok, const json_t *cases, const json_t *texts, int flags,
                    const char *label);
/* gpt2 vocab description from a byte-level tokenizer.json; caller frees (NULL on error). */
tokenizer *tt_vocab_from_hf_json(const char *path, const char *pre);
/* Vocab description from fetch_tokenizers.sh's GGUF dump (vocab.json). */
tokenizer *tt_vocab_from_dump(const char *path);

#endif
