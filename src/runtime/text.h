/* text.h: the inside of anna_text (anna.h): the tokenizer + chat template of a model path (a
 * Hugging Face folder: tokenizer.json, chat_template.jinja / tokenizer_config.json; or a GGUF
 * file: tokenizer.ggml.* and tokenizer.chat_template).
 *
 * model_text is the same struct as the public, opaque anna_text, so library code reaches the
 * tokenizer directly (front ends go through anna.h). Immutable once opened and
 * usable from several threads. anna_text_open / anna_text_free / anna_text_encode_prompt are
 * implemented in text.c, the rest of the public text API in api_text.c.
 */
#ifndef ANNA_RUNTIME_TEXT_H
#define ANNA_RUNTIME_TEXT_H

#include "anna/anna.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>

typedef struct anna_text model_text;
struct anna_text {
  tokenizer *tok;    /* owned */
  chat_template *ct; /* owned; NULL when the model ships no template */
};

/* Renders messages with the chat template (kwargs may be NULL) and tokenizes the result.
 * Without a template, the concatenated contents are tokenized. The JSON values are
 * borrowed. *ids: caller frees. (anna_text_encode_chat, from JSON text.) */
int model_text_encode_chat(const model_text *t, const json_t *messages, const json_t *tools,
                           const json_t *kwargs, int32_t **ids, size_t *n, char *err, size_t errlen);

#endif
