/* text.h: the text side of a model (tokenizer + chat template), from the same path the
 * weights come from: a Hugging Face folder (tokenizer.json, chat_template.jinja /
 * tokenizer_config.json) or a GGUF file (tokenizer.ggml.* and tokenizer.chat_template).
 *
 * A model_text is immutable once opened and may be used from several threads.
 */
#ifndef ANNA_RUNTIME_TEXT_H
#define ANNA_RUNTIME_TEXT_H

#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>

typedef struct model_text {
  tokenizer *tok;    /* owned */
  chat_template *ct; /* owned; NULL when the model ships no template */
} model_text;

/* Caller frees with model_text_free. A missing chat template is not an error. */
int model_text_open(model_text **out, const char *path, char *err, size_t errlen);
void model_text_free(model_text *t);

/* Renders messages with the chat template (kwargs may be NULL) and tokenizes the result.
 * Without a template, the concatenated contents are tokenized. *ids: caller frees. */
int model_text_encode_chat(const model_text *t, const json_t *messages, const json_t *tools,
                           const json_t *kwargs, int32_t **ids, size_t *n, char *err, size_t errlen);

/* The prompt of the command-line tools: a user message (after an optional system message)
 * rendered with the chat template, or, with raw set or no template, the text itself with the
 * tokenizer's special tokens. no_think passes enable_thinking=false. An empty result is an
 * error. *ids: caller frees. */
int model_text_encode_prompt(const model_text *t, const char *prompt, const char *system, int raw, int no_think,
                             int32_t **ids, size_t *n, char *err, size_t errlen);

#endif
