/* embed_api.h: POST /v1/embeddings over engine_embed (engine.h).
 *
 * input: a string, an array of strings, an array of token ids, or an array of such arrays
 * (at most 2048 inputs, none empty, each within the context). Each vector is the final hidden
 * state (after the final norm) of the input's last token, L2-normalized: Qwen3-Embedding's
 * last-token pooling. Strings are tokenized as the model's tokenizer does by default (with
 * its added special tokens, e.g. Qwen3-Embedding's trailing <|endoftext|>); token arrays are
 * taken as they are. encoding_format float (default) | base64 (little-endian float32);
 * dimensions must equal the hidden size (no Matryoshka truncation); user is a documented
 * no-op; other fields are a 400 naming them. Runs on a connection thread.
 */
#ifndef ANNA_SERVER_EMBED_API_H
#define ANNA_SERVER_EMBED_API_H

#include "engine.h"
#include "oai.h"

#include <stddef.h>

/* 0 with *out (caller frees) the response body, or -1 with e filled. */
int embed_api_handle(const oai_config *cfg, engine *eng, const char *body, size_t len, char **out, oai_error *e);

#endif
