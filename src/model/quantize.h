/* quantize.h: Hugging Face folder (config.json + bf16/f16/f32 safetensors + tokenizer.json)
 * -> a GGUF file with llama.cpp's tensor names, metadata and embedded tokenizer, so that
 * anna's GGUF loader (model/gguf_model.c) and llama.cpp both load it.
 *
 * Families: qwen2, qwen3, llama (default or llama3 rope: the rope_freqs tensor as the
 * converter computes it; other rope scaling is ANNA_EUNSUPPORTED), qwen3_5 dense (text or multimodal
 * checkpoint naming; the vision tower is not written). Anything else, MoE and Gemma
 * included, is ANNA_EUNSUPPORTED naming the model_type. The tensor transforms are those of
 * llama.cpp's convert_hf_to_gguf.py (Llama q/k row permutation; Qwen3.5: +1 baked into the
 * zero-centred norms, ssm_a = -exp(A_log), V heads reordered from grouped to tiled order).
 *
 * Types:
 *   "bf16": 2-D weights bf16 (copied bit for bit from a bf16 source; an f16 / f32 source is
 *           rounded to nearest even), 1-D tensors f32: a converter check and a llama-quantize input.
 *   "int4": llama.cpp's Q4_K_M mix without an importance matrix: Q4_K by default, Q6_K for
 *           the output matrix (the embedding when tied), attn_v / attn_qkv and ffn_down where
 *           llama.cpp's use_more_bits picks them (counted in the file's tensor order, which is
 *           the converter's: safetensors files, then names, in sorted order); a row length that is not a multiple of
 *           256 falls back as llama.cpp does (Q4_K -> Q5_0, Q6_K -> Q8_0, then F16); norms,
 *           biases, ssm_conv1d and other 1-D tensors f32. The encoders are byte-identical to
 *           ggml's (formats/quant_encode.h).
 *
 * Memory: one tensor's output plus a row of floats per thread; the source stays mmap'd. Rows
 * are encoded on a thread pool of one worker per core (the bytes do not depend on it).
 */
#ifndef ANNA_MODEL_QUANTIZE_H
#define ANNA_MODEL_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

typedef struct model_quantize_stats {
  int64_t n_tensors;
  int64_t bytes_in, bytes_out; /* source tensor bytes read, tensor bytes written */
  int64_t n_by_type[64];       /* tensors written per anna_dtype */
} model_quantize_stats;

/* True for the type names model_quantize_hf takes ("int4", "bf16"). */
int model_quantize_type_known(const char *type);

/* Converts the HF folder dir into out_path (written in place: callers wanting atomicity pass
 * a temporary name and rename). stats may be NULL. 0 or ANNA_E* with a message. */
int model_quantize_hf(const char *dir, const char *out_path, const char *type, model_quantize_stats *stats, char *err,
                      size_t errlen);

/* The cache file for (dir, type): ${ANNA_CACHE:-$HOME/.cache/anna}/quant/<model_type>-<type>-<key>.gguf,
 * key a 64-bit FNV-1a hash (hex) of the format version, type, and the name, size and mtime of
 * config.json, tokenizer files and every *.safetensors / index file in dir. Writes the path
 * into out[outlen]. 0, ANNA_ENOTFOUND (no config.json), ANNA_ERANGE (path too long). */
int model_quantize_cache_path(const char *dir, const char *type, char *out, size_t outlen, char *err, size_t errlen);

/* Cache lookup or build: when the cache file exists, its path; else quantizes into a
 * temporary file beside it, renames it into place (atomic) and returns the path.
 * *built is set to 1 when it quantized (NULL allowed). */
int model_quantize_cached(const char *dir, const char *type, char *out, size_t outlen, int *built, char *err,
                          size_t errlen);

#endif
