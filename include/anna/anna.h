/* anna.h: the public API of the anna inference runtime.
 *
 * Boundary: an anna_model is a loaded, immutable model (config + weights, mmap'd where
 * possible); it may be shared by several contexts. An anna_context owns everything that
 * changes while generating: per-sequence state (attention KV caches, Gated DeltaNet conv
 * and recurrent state) for up to n_seq sequence slots, the backend and its scratch. One
 * thread drives a context at a time. Callers (CLI, server) never see tensors: they pass
 * token batches and read logits.
 *
 * Errors: every call that can fail returns 0 or a negative ANNA_E* code (see
 * src/base/error.h) and writes a one-line message into (err, errlen).
 */
#ifndef ANNA_ANNA_H
#define ANNA_ANNA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct anna_model anna_model;
typedef struct anna_context anna_context;

typedef struct anna_model_options {
  const char *device; /* "cpu" (default), "cuda", "auto" */
  const char *dtype;  /* compute dtype: "f32" (default) */
} anna_model_options;

/* Loads a Hugging Face model folder (config.json + *.safetensors) or a .gguf file.
 * Caller frees with anna_model_free. */
int anna_model_load(anna_model **out, const char *path, const anna_model_options *opt, char *err,
                    size_t errlen);
void anna_model_free(anna_model *m);
int anna_model_vocab(const anna_model *m);
int anna_model_n_layers(const anna_model *m);
/* Static description, e.g. "qwen3_5: 8 layers, hidden 128, vocab 1000". Borrowed. */
const char *anna_model_describe(const anna_model *m);
/* The folder or file it was loaded from. Borrowed. */
const char *anna_model_path(const anna_model *m);

typedef struct anna_context_options {
  int n_seq;      /* sequence slots (default 1) */
  int n_ctx;      /* max positions per sequence (default 4096) */
  int n_batch;    /* max tokens per anna_context_decode call (default 512) */
  int n_threads;  /* <= 0: one per core */
  const char *device; /* NULL or "cpu": CPU; "cuda": the GPU (error if absent); "auto": GPU when present */
  int n_checkpoints; /* recurrent-state checkpoint slots for prefix reuse (GDN models; 0: none) */
  /* KV cache format: NULL/"none"/"auto" (f32, exact), "q8", "q4", "turboquant" (random
   * Hadamard rotation + Lloyd-Max codes of kv_cache_quant_bits = 2, 3 or 4 bits; default 4). */
  const char *kv_cache_quantization;
  int kv_cache_quant_bits;
  /* CPU matmuls of quantized weights with float32 activations (weights dequantized: exact,
   * slower) instead of the default, llama.cpp's numerics (activations quantized to 8 bits
   * as ggml does, integer block dots). f32/f16/bf16 weights are float32 math either way. */
  int exact_matmul;
  /* CPU: time every op family (anna_context_profile); costs a clock read per op. */
  int profile;
} anna_context_options;

/* The model is borrowed and must outlive the context. Caller frees with anna_context_free. */
int anna_context_create(anna_context **out, anna_model *m, const anna_context_options *opt, char *err,
                        size_t errlen);
void anna_context_free(anna_context *c);

/* A batch of tokens from one or more sequences. Tokens of one sequence must be consecutive
 * in the batch and continue that sequence: pos[i] == its current length (+ earlier tokens
 * of the same sequence in this batch). logits[i] != 0 asks for that token's logits. */
typedef struct anna_batch {
  int32_t n;
  const int32_t *tokens;
  const int32_t *seq;
  const int32_t *pos;
  const int8_t *logits;
} anna_batch;

/* Runs the model over the batch, appending to each sequence's state. Writes the logits of
 * the flagged tokens, in batch order, to out[n_flagged * vocab] (caller-owned). On error
 * the sequences touched by the batch are in an unspecified state: reset them. */
int anna_context_decode(anna_context *c, const anna_batch *b, float *out, char *err, size_t errlen);

/* Per-op-family seconds since creation or the last reset (families: matmul, lm_head,
 * attention, gdn, moe, other), when created with .profile = 1 on the CPU; returns how many
 * were written (0: not profiling). Names are static strings. */
int anna_context_profile(const anna_context *c, double *seconds, const char **names, int cap);
void anna_context_profile_reset(anna_context *c);

/* KV-cache bytes one token of one sequence occupies (all attention layers, K and V). */
int64_t anna_context_kv_bytes_per_token(const anna_context *c);

/* Current length of a sequence slot, and clearing it. */
int32_t anna_context_seq_len(const anna_context *c, int seq);
void anna_context_seq_reset(anna_context *c, int seq);

/* Prefix reuse (prompt caches, branching conversations). Attention KV can be cut at any
 * position; the recurrent state of Gated DeltaNet layers only where it was saved, so:
 *   checkpoint: save seq's recurrent state at its current length (needs n_checkpoints > 0 on
 *               models with GDN layers; a no-op for attention-only models);
 *   rewind:     seq keeps its first n positions (n = its length or a checkpointed position);
 *   copy:       dst becomes a copy of src's first n positions (same rule for n).
 * Callers checkpoint at block boundaries while prefilling (split the prompt there) and
 * recompute the tokens from the last boundary when a prefix ends mid-block. */
int anna_context_seq_checkpoint(anna_context *c, int seq, char *err, size_t errlen);
int anna_context_seq_rewind(anna_context *c, int seq, int32_t n, char *err, size_t errlen);
int anna_context_seq_copy(anna_context *c, int dst, int src, int32_t n, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
