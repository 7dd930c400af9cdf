/* text_decoder.h: the text decoder kind (tokens -> logits / top-k candidates): the
 * model_kind table over the HF and GGUF loaders (model.c, gguf_model.c), fwd_state and
 * forward_batch (forward.c). Its impl is a text_model, its state a fwd_state. Static. */
#ifndef ANNA_MODEL_TEXT_DECODER_H
#define ANNA_MODEL_TEXT_DECODER_H

#include "model/kind.h"

extern const model_kind text_decoder_kind;

#endif
