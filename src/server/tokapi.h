/* tokapi.h: POST /tokenize and POST /detokenize, as llama.cpp's server and vLLM offer them.
 *
 * /tokenize takes {"content": TEXT} (llama.cpp) or {"prompt": TEXT} (vLLM), exactly one of
 * them, plus optional booleans "add_special" (llama.cpp; alias "add_special_tokens", vLLM;
 * default false), "parse_special" (default true: special-token texts such as "<|im_end|>"
 * become their ids) and "with_pieces" (tokens as {"id", "piece"} objects, the piece the
 * text the id decodes to). "model" (a string) is accepted and not checked, as vLLM does.
 * The answer is {"tokens": [...], "count": N, "max_model_len": n_ctx}.
 * /detokenize takes {"tokens": [ids]} and answers {"content": TEXT, "prompt": TEXT} (the
 * first llama.cpp's name, the second vLLM's).
 * Any other field (vLLM's "messages" included), a wrong type or an id outside the
 * vocabulary is a 400 naming the field. Thread-safe: only the immutable anna_text is used.
 */
#ifndef ANNA_SERVER_TOKAPI_H
#define ANNA_SERVER_TOKAPI_H

#include "oai.h"

#include <stddef.h>

/* Answers one request body: 0 with *out the JSON answer (caller frees), or -1 with *e filled
 * (400 for bad input, 500 when out of memory). */
int tokapi_tokenize(const oai_config *cfg, const char *body, size_t len, char **out, oai_error *e);
int tokapi_detokenize(const oai_config *cfg, const char *body, size_t len, char **out, oai_error *e);

#endif
