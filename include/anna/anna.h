/* anna.h: the public API of the anna inference runtime.
 *
 * Boundary: an anna_model is a loaded, immutable model (config + weights, mmap'd where
 * possible); it may be shared by several contexts. An anna_context owns everything that
 * changes while generating: per-sequence state (attention KV in one paged block pool shared
 * by all sequences, Gated DeltaNet conv and recurrent state) for up to n_seq sequence slots,
 * the prefix block pool, the backend and its scratch. One
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
  /* compute dtype: "f32" (default; also "float32", "auto"): the default numerics of the
   * device; "bf16" ("bfloat16", cuda only): prefill GEMMs multiply activations rounded once
   * to bf16 (llama.cpp's precision: 1.4-1.5x faster bf16 prefill, logits move by ~1e-2 of
   * their spread on real models, more on tiny random ones). Others: ANNA_EUNSUPPORTED. */
  const char *dtype;
  const char *tuning; /* "k=v,..." applied after the environment's ANNA_TUNING */
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
  /* Paged KV cache: every attention layer's cache is one pool of blocks of kv_block_len
   * positions (a power of two >= 16; default 64, the GDN chunk), shared by all sequences
   * through per-sequence block tables. kv_blocks: pool size (default n_seq *
   * ceil(n_ctx / kv_block_len), so every sequence can reach n_ctx). A decode that needs a
   * block when none is free (and no cached prefix block can be evicted) fails with
   * ANNA_ERANGE. */
  int kv_block_len;
  int64_t kv_blocks;
  /* Quantized caches: the newest N positions of each sequence are also kept, and attended,
   * in f32 (a per-sequence ring). 0: off. Prefix reuse across sequences is off with it. */
  int kv_cache_residual_len;
  /* Prefix block pool (anna_context_prefix_attach): 0 = on unless the environment sets
   * ANNA_PREFIX_KV_SHARE=0; -1 = off. */
  int prefix_share;
  /* GDN models: besides the last block boundary each decode call reaches, snapshot the
   * recurrent state every N tokens inside a call (rounded up to whole blocks; 0: off), so a
   * long prompt leaves reusable points behind (e.g. the end of a shared system prompt). */
  int prefix_snapshot_interval;
  const char *tuning; /* "k=v,..." applied after the environment's ANNA_TUNING */
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

/* As anna_context_decode, but instead of the logits of each flagged token (in batch order,
 * row r) it returns that row's k best candidates, computed where the logits are (on a GPU
 * only these few KB cross to the host): idx[r * k + j] / val[r * k + j], j < k, the k largest
 * logits in descending order (ties: lower id first; NaN ranks as -inf), and stats[2r] = the
 * row's largest logit, stats[2r + 1] = the sum over the whole row of exp((logit - max) / temp)
 * (temp <= 0: 0, not computed), so the candidates' softmax probabilities are exact. 1 <= k <= 256 and k <= the
 * vocabulary. The sampler (sampler_candidates_k / sampler_sample_candidates) says which k a
 * request needs and when a row must be sampled in full: anna_context_logits_row then fetches
 * it. ANNA_EUNSUPPORTED when the backend cannot (callers fall back to anna_context_decode). */
int anna_context_decode_topk(anna_context *c, const anna_batch *b, int k, float temp, int32_t *idx, float *val,
                             double *stats, char *err, size_t errlen);
/* Logits row `row` (flagged order) of the last anna_context_decode(_topk) call to out[vocab],
 * valid until the next decode call. ANNA_ERANGE when that call had no such row. */
int anna_context_logits_row(anna_context *c, int row, float *out, char *err, size_t errlen);

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

/* Prefix reuse by hand (branching conversations). Attention KV can be cut at any
 * position; the recurrent state of Gated DeltaNet layers only where it was saved, so:
 *   checkpoint: save seq's recurrent state at its current length (needs n_checkpoints > 0 on
 *               models with GDN layers; a no-op for attention-only models);
 *   rewind:     seq keeps its first n positions (n = its length or a checkpointed position);
 *   copy:       dst becomes src's first n positions (same rule for n); KV blocks are
 *               shared, and copied only when one of the sequences writes into a shared one.
 * Callers checkpoint at block boundaries while prefilling (split the prompt there) and
 * recompute the tokens from the last boundary when a prefix ends mid-block. */
int anna_context_seq_checkpoint(anna_context *c, int seq, char *err, size_t errlen);
int anna_context_seq_rewind(anna_context *c, int seq, int32_t n, char *err, size_t errlen);
int anna_context_seq_copy(anna_context *c, int dst, int src, int32_t n, char *err, size_t errlen);

/* Prefix block pool. Full KV blocks are keyed by a hash chain of their tokens (block j's
 * key covers tokens [0, (j+1) * block_len)), reference-counted, shared between sequences,
 * copied on write, and kept after their sequences end until the pool needs them (least
 * recently used first). For models with Gated DeltaNet layers, the recurrent + conv state
 * is snapshotted at the last block boundary each decode call reaches for an attached
 * sequence (into the n_checkpoints slots, least recently used first); a prefix is reused
 * only up to the longest boundary with a snapshot, which is restored exactly.
 *
 * attach: empties seq, maps the longest cached prefix of tokens[0, n) into it and returns
 * its length r (<= n; 0 when nothing matches or sharing is off). Attention-only models
 * reuse up to any token (a cached block is cut where the tokens part); GDN models up to a
 * block boundary with a snapshot, or the exact end of a turn a finished sequence left. The caller then feeds tokens[r, ...) at positions r, ...; pass n = prompt
 * length - 1 to keep the last prompt token (whose logits start the reply) to compute.
 * flags & ANNA_PREFIX_REGISTER: seq's own full blocks (and GDN snapshots) enter the pool
 * as decode fills them; without it seq only reads the pool (e.g. a prompt that an exact
 * prompt cache keeps instead). Returns a negative ANNA_E* code on a bad seq. */
#define ANNA_PREFIX_REGISTER 1
int32_t anna_context_prefix_attach(anna_context *c, int seq, const int32_t *tokens, int32_t n, int flags);

/* KV pool accounting and prefix-pool counters (cumulative since creation). */
typedef struct anna_kv_stats {
  int block_len;
  int prefix_share; /* the prefix pool is on */
  int64_t n_blocks, free_blocks, cached_blocks; /* cached: holding a prefix, unreferenced */
  int64_t pool_bytes;     /* KV blocks of all attention layers, K and V */
  int64_t snapshot_bytes; /* recurrent-state checkpoint / snapshot slots */
  int64_t ring_bytes;     /* residual f32 rings */
  int64_t n_snapshots;    /* slots holding a prefix snapshot */
  uint64_t lookups, lookup_tokens; /* attach calls and the tokens they asked about */
  uint64_t hit_blocks, miss_blocks, hit_tokens; /* full blocks found / not found; tokens reused */
  uint64_t evictions, cow_copies;
} anna_kv_stats;
void anna_context_kv_stats(const anna_context *c, anna_kv_stats *st);

/* Decode steps run as CUDA graphs (cumulative since creation; all zero on the CPU): steps,
 * graphs built (instantiated), steps that updated a cached graph's arguments in place (the
 * rest relaunched one unchanged); host seconds spent recording the steps' ops (capture) and
 * updating / instantiating graphs, and device seconds the replays took (CUDA events around
 * each launch). */
typedef struct anna_step_stats {
  int64_t steps, builds, updates;
  double capture_s, update_s, gpu_s;
} anna_step_stats;
void anna_context_step_stats(const anna_context *c, anna_step_stats *st);

/* The context's resolved runtime switches (src/base/tuning.h: defaults, then ANNA_TUNING,
 * then anna_context_options.tuning; moe_shared_slot as the model was loaded), one
 * "key=value" line each, into buf (NUL-terminated, truncated to len). Returns the length
 * the whole text needs (truncated when >= len). */
int anna_context_tuning(const anna_context *c, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
