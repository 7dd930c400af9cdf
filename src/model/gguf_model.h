/* gguf_model.h: models and their text side from a llama.cpp GGUF file.
 *
 * gguf_model_load maps the GGUF's architecture keys and tensor names (qwen35, qwen35moe,
 * gemma4, gemma3, qwen3, qwen2, llama, qwen3moe) onto the same model_config and
 * layer_weights the HF loader builds, undoing the converter's conventions where they differ
 * (zero-centred norms stored with the +1 baked in, ssm_a = -exp(A_log), V heads in tiled
 * order, Llama's q/k rows permuted for interleaved rope). Tensors stay in the mapping in
 * their quantized form; only small vectors are converted to f32.
 */
#ifndef ANNA_MODEL_GGUF_MODEL_H
#define ANNA_MODEL_GGUF_MODEL_H

#include "model/model.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

/* 1 when gguf_model_load maps this general.architecture, else 0. */
int gguf_model_arch_known(const char *arch);

/* Caller frees with model_free. */
int gguf_model_load(text_model **out, const char *path, char *err, size_t errlen);

/* Tokenizer from tokenizer.ggml.* and chat template from tokenizer.chat_template (*ct NULL
 * when the file has none). Caller frees both. */
int gguf_model_text(const char *path, tokenizer **tok, chat_template **ct, char *err, size_t errlen);

#endif
