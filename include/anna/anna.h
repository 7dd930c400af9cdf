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
 * Errors: every call that can fail returns 0 (ANNA_OK) or a negative ANNA_E* code (below)
 * and writes a one-line message into (err, errlen); errlen may be 0 and err NULL when the
 * caller does not want the text. Nothing here exits or aborts on bad input.
 *
 * This header is the whole public contract: the command-line tools (src/cli/) and the server
 * (src/server/) include nothing else of anna (the build enforces it: they get include/ only).
 * Besides models and contexts it offers the text side of a model (anna_text: tokenizer,
 * streaming detokenizer, chat template), chat templates on their own (anna_chat_template),
 * the sampler (anna_sampler), the continuous-batching scheduler (anna_sched), the error
 * convention (anna_err), read-only GGUF inspection (anna_gguf) and the media input types
 * later model kinds accept (anna_image, anna_audio). JSON crosses this header as text, so it
 * does not depend on any JSON library.
 *
 * Ownership: "caller frees with X" on a prototype means the object or buffer is the caller's
 * and X releases it (plain buffers: free()); "borrowed" means it lives as long as the object
 * it came from. Every X_free / X_close accepts NULL.
 */
#ifndef ANNA_ANNA_H
#define ANNA_ANNA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this header's contract: major * 10000 + minor * 100 + patch. Minor: additions
 * only; major: anything a caller must change for. */
#define ANNA_API_VERSION_MAJOR 1
#define ANNA_API_VERSION_MINOR 14
#define ANNA_API_VERSION_PATCH 0
#define ANNA_API_VERSION                                                                      \
  (ANNA_API_VERSION_MAJOR * 10000 + ANNA_API_VERSION_MINOR * 100 + ANNA_API_VERSION_PATCH)

/* Status codes: every fallible call returns one of these. */
enum anna_status {
  ANNA_OK = 0,
  ANNA_EINVAL = -1,       /* bad argument, flag, or request */
  ANNA_ENOMEM = -2,       /* allocation failed */
  ANNA_EIO = -3,          /* open/read/mmap failed */
  ANNA_EFORMAT = -4,      /* malformed file or data */
  ANNA_ENOTFOUND = -5,    /* missing tensor, key, file */
  ANNA_EUNSUPPORTED = -6, /* valid but not implemented (model type, dtype, op) */
  ANNA_ERANGE = -7,       /* value out of range (context full, id too large) */
  ANNA_ESTATE = -8,       /* call not valid in the current state */
};

/* Static name of a status code: "ANNA_OK", "ANNA_EINVAL", ...; "ANNA_E?" for any other
 * value. Never NULL. */
const char *anna_status_name(int code);
/* The error convention of every call above, for front ends that report their own errors
 * the same way: formats a message into err (truncated to errlen, always NUL-terminated when
 * errlen > 0) and returns code, so `return anna_err(err, errlen, ANNA_EINVAL, ...)` works. */
int anna_err(char *err, size_t errlen, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

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
  /* Weight quantization at load: NULL/"none": weights as stored; "int4": a Hugging Face
   * folder (qwen2, qwen3, llama, qwen3_5 dense) is quantized to llama.cpp's Q4_K_M mix and
   * cached (anna_quantize_model), and that GGUF is loaded; "auto": same as "none" (a GGUF file
   * is always loaded as stored; a folder is quantized only when asked). With "int4" a GGUF
   * path is loaded as stored. Other values: ANNA_EINVAL. */
  const char *weight_quant;
  /* (API 1.8) The vision tower from a llama.cpp mmproj GGUF (convert_hf_to_gguf.py --mmproj of
   * a Qwen3.5 / Qwen3-VL checkpoint, projector type qwen3vl_merger) or an HF folder holding
   * model.visual.*, beside the text model (a GGUF or a folder, whose own tower it replaces).
   * Marker ids come from the text model (a GGUF's vocabulary: <|image_pad|>, <|vision_start|>,
   * <|vision_end|>, <|video_pad|>), processor settings from the text model's folder, else the
   * mmproj folder's, else the mmproj's metadata (mean / std / patch / merge; min / max pixels
   * when present, else the published 65536 / 16777216). A tower whose output width is not the
   * text model's hidden size, another projector type, a deepstack tower: load errors naming
   * the mismatch. NULL: a folder's own tower, if any. */
  const char *mmproj;
  /* (API 1.12) Load progress. When set, anna_model_load first reads the weight files once,
   * front to back (a GGUF file, or a folder's *.safetensors and its subfolders'), so the page
   * cache holds them before the mmap'd weights are used, and calls progress(progress_user,
   * bytes_read, bytes_total) on the loading thread: (0, total) first, then at most every
   * 64 MiB and at each file's end, and (total, total) last. The pass is advisory: an unreadable
   * file ends it early and the load reports the error. NULL: no such pass. */
  void (*progress)(void *progress_user, uint64_t bytes_read, uint64_t bytes_total);
  void *progress_user;
} anna_model_options;

/* Loads a Hugging Face model folder (config.json + *.safetensors) or a .gguf file.
 * Caller frees with anna_model_free. */
int anna_model_load(anna_model **out, const char *path, const anna_model_options *opt, char *err,
                    size_t errlen);
void anna_model_free(anna_model *m);

/* Converts a Hugging Face folder (config.json + bf16/f16/f32 safetensors + tokenizer.json)
 * to a GGUF with llama.cpp's names, metadata and embedded tokenizer, loadable by anna and
 * llama.cpp. type: "int4" (llama.cpp's Q4_K_M mix, byte-identical to ggml's quantizers without
 * an importance matrix) or "bf16" (as stored). out_path NULL: the cache,
 * ${ANNA_CACHE:-~/.cache/anna}/quant/<model_type>-<type>-<key>.gguf (key: a hash of the source
 * files' names, sizes, mtimes and the type); an existing cache file is reused, a new one is
 * written to a temporary name and renamed. out_path given: always written there. The path
 * used is copied into path_out[path_len] (may be NULL); *built (may be NULL) is 1 when it
 * quantized, 0 on a cache hit. Families other than qwen2, qwen3, llama, qwen3_5 dense:
 * ANNA_EUNSUPPORTED. */
int anna_quantize_model(const char *model_dir, const char *type, const char *out_path, char *path_out,
                        size_t path_len, int *built, char *err, size_t errlen);
int anna_model_vocab(const anna_model *m);
int anna_model_n_layers(const anna_model *m);
/* Width of the final hidden state (anna_context_decode_hidden rows); 0 for kinds without one. */
int anna_model_hidden_size(const anna_model *m);
/* Static description, e.g. "qwen3_5: 8 layers, hidden 128, vocab 1000". Borrowed. */
const char *anna_model_describe(const anna_model *m);
/* The folder or file it was loaded from. Borrowed. */
const char *anna_model_path(const anna_model *m);
/* The model kind that loaded it (src/model/kind.h), e.g. "text_decoder". Static string. */
const char *anna_model_kind_name(const anna_model *m);

typedef struct anna_context_options {
  int n_seq;      /* sequence slots (default 1) */
  int n_ctx;      /* max positions per sequence (default 4096) */
  int n_batch;    /* max tokens per anna_context_decode call (default 512) */
  int n_threads;  /* <= 0: one per core */
  /* NULL or "cpu": CPU; "cuda": the GPU (error if absent); "auto": GPU when present;
   * "cuda:N" (1.6): the N-th device CUDA_VISIBLE_DEVICES leaves visible (ANNA_EUNSUPPORTED
   * naming how many there are). With layer_split, one device per stage, comma-separated
   * ("cuda:0,cuda:1", "cuda:0,cuda:0", "cpu,cpu"), or one device that every stage shares. */
  const char *device;
  int n_checkpoints; /* recurrent-state checkpoint slots for prefix reuse (GDN models; 0: none) */
  /* KV cache format: NULL/"none" (f32, exact), "f16", "q8", "q4", "turboquant" (random
   * Hadamard rotation + Lloyd-Max codes of kv_cache_quant_bits = 2, 3 or 4 bits; default 4),
   * or "auto": the first of f32, f16, q8, q4, turboquant 4/3/2 (most bits first) whose cache (kv_blocks, or
   * n_seq x n_ctx, plus residual rings) fits 90% of the device's memory left after the model
   * is placed (backends that report memory: CUDA; the formats it advertises). On the CPU,
   * which reports no memory budget, auto is f32. anna_kv_stats.kv_type tells the choice. */
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
  /* Prefix block pool (anna_context_prefix_attach): 0 = on unless the tuning says
   * prefix_kv_share=0 (ANNA_TUNING or .tuning); -1 = off. */
  int prefix_share;
  /* GDN models: besides the last block boundary each decode call reaches, snapshot the
   * recurrent state every N tokens inside a call (rounded up to whole blocks; 0: off), so a
   * long prompt leaves reusable points behind (e.g. the end of a shared system prompt). */
  int prefix_snapshot_interval;
  const char *tuning; /* "k=v,..." applied after the environment's ANNA_TUNING */
  /* MoE expert offload (1.5; the cuda device): instead of mirroring every weight to the
   * device, the routed experts live in a per-layer expert cache in device memory, a host
   * mirror (pinned) of what host_memory_limit allows and the model file for the rest; the
   * routing counts move the hottest experts into the cache every expert_swap_every decode
   * steps. offload_mode: NULL/"none" (default: everything on the device), "experts" (on;
   * ANNA_EUNSUPPORTED on a model without routed experts or a device that cannot), "auto"
   * (on when the model has routed experts, the device can and one of the limits below is
   * set, else none).
   * Sizes in bytes. gpu_memory_limit: what this context may use on the device (0: its free
   * memory), below the dense weights plus one layer's staging an ANNA_EINVAL naming the bytes
   * needed; expert_cache_bytes: < 0 or 0 "auto" (what the limit leaves after the dense
   * weights, the KV cache, scratch and reserve_bytes), > 0 that much;
   * cached_experts_per_layer > 0 sets the cache per layer instead (the seed's flag);
   * host_memory_limit: bytes of pinned host mirror (0: every expert, < 0: none, read from
   * the file each time). */
  const char *offload_mode;
  int64_t gpu_memory_limit;
  int64_t expert_cache_bytes;
  int64_t host_memory_limit;
  int64_t reserve_bytes;
  int cached_experts_per_layer;
  int expert_swap_every; /* 0: 8 */
  /* Pipeline stages (1.6): NULL (none), "N,N,..." (consecutive layers per stage, in order:
   * each >= 1, summing to the model's layers) or "auto" (one stage per device of `device`,
   * layers split as evenly as they go). Stage s holds its layers' weights, KV blocks and
   * recurrent state on its device; the hidden state crosses to the next stage (through host
   * memory in this version); the embedding runs on the first stage, the final norm, lm_head
   * and sampling candidates on the last. Output is bit-identical to no split on the same
   * devices. Text decoders only; not with profile or offload_mode experts (ANNA_EUNSUPPORTED);
   * a bad list is ANNA_EINVAL naming what is wrong. anna_context_stage_info reports it. */
  const char *layer_split;
  /* (API 1.8) Vision models: the encoder output cache's budget in bytes (preprocessed pixels +
   * tower rows of each cached image or video; least recently used out first): 0 = 256 MiB,
   * < 0 = off (every media runs the tower). */
  int64_t mm_cache_bytes;
  /* (API 1.13) Tensor parallelism: N > 1 shards of every layer (attention by KV-head groups,
   * Gated DeltaNet by value-head groups, MLP and every MoE expert by intermediate columns;
   * embeddings, norms and lm_head replicated), one backend per shard over the device list
   * (one device per shard, e.g. "cuda:0,cuda:1", or one device all share: "cpu" gives N CPU
   * shards, "cuda:0" N shards on one GPU), their partial sums all-reduced after each output
   * projection. Logits match the unsplit context up to float summation order. 0 or 1: off.
   * A head count or intermediate size that does not divide by N is ANNA_EINVAL naming it;
   * with layer_split, profile, offload_mode experts, Gemma4 or image / video / audio prompts
   * ANNA_EUNSUPPORTED. Each shard runs on its own thread (CPU shards: n_threads workers
   * each). anna_context_stage_info reports one stage: the shards' devices ("cuda:0,cuda:1"),
   * shard 0's weight bytes, the KV bytes of all shards. */
  int tensor_parallel;
  /* (API 1.13) Its all-reduce: NULL or "auto" (NCCL when the build has it and every shard is
   * on its own device, else host), "host" (partials summed on the host in rank order:
   * deterministic, any devices), "nccl" (ANNA_EUNSUPPORTED without NCCL or with shards
   * sharing a device). Read only with tensor_parallel > 1. */
  const char *tp_comm;
} anna_context_options;

/* One pipeline stage of a context (anna_context_stage_info). A context without layer_split
 * has one stage of every layer. */
typedef struct anna_stage_info {
  char device[32];           /* "cpu", "cuda:0", ... */
  int layer_begin, layer_end; /* layers [begin, end) */
  int64_t weight_bytes;      /* the matrices it reads: its layers', plus the embedding on the
                                first stage and the lm_head on the last */
  int64_t kv_bytes;          /* its layers' KV pool, rings and recurrent state */
} anna_stage_info;

/* Number of stages (>= 1), and stage i's placement into *out (0, or ANNA_ERANGE). */
int anna_context_stage_count(const anna_context *c);
int anna_context_stage_info(const anna_context *c, int i, anna_stage_info *out, char *err, size_t errlen);

/* The devices this build can use on this host, one line each ("cpu", "cuda:0  NVIDIA H100
 * 80GB HBM3  79.1 GiB"), into buf (always NUL-terminated); returns the device count. */
int anna_devices_list(char *buf, size_t len);

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

/* As anna_context_decode, but out[r * H + j] (H = anna_model_hidden_size) receives the final
 * hidden state of flagged row r (in batch order): the output of the last layer after the
 * final norm, the row the lm_head would read (HF's last_hidden_state). The lm_head is not
 * run and no logits are kept (anna_context_logits_row: ANNA_ERANGE afterwards). For pooled
 * embeddings (e.g. Qwen3-Embedding's last-token pooling) flag the last token of each input.
 * ANNA_EUNSUPPORTED for kinds without hidden states. Same backends as anna_context_decode. */
int anna_context_decode_hidden(anna_context *c, const anna_batch *b, float *out, char *err, size_t errlen);

/* As anna_context_decode, but instead of the logits of each flagged token (in batch order,
 * row r) it returns that row's k best candidates, computed where the logits are (on a GPU
 * only these few KB cross to the host): idx[r * k + j] / val[r * k + j], j < k, the k largest
 * logits in descending order (ties: lower id first; NaN ranks as -inf), and stats[2r] = the
 * row's largest logit, stats[2r + 1] = the sum over the whole row of exp((logit - max) / temp)
 * (temp <= 0: 0, not computed), so the candidates' softmax probabilities are exact. 1 <= k <=
 * ANNA_TOPK_MAX and k <= the vocabulary. The sampler (anna_sampler_candidates_k /
 * anna_sampler_sample_candidates) says which k a request needs and when a row must be sampled
 * in full: anna_context_logits_row then fetches it. ANNA_EUNSUPPORTED when the backend cannot
 * (callers fall back to anna_context_decode). */
#define ANNA_TOPK_MAX 256
int anna_context_decode_topk(anna_context *c, const anna_batch *b, int k, float temp, int32_t *idx, float *val,
                             double *stats, char *err, size_t errlen);
/* Logits row `row` (flagged order) of the last anna_context_decode(_topk) call to out[vocab],
 * valid until the next decode call. ANNA_ERANGE when that call had no such row. */
int anna_context_logits_row(anna_context *c, int row, float *out, char *err, size_t errlen);
/* (API 1.14) Sampling on the rows the last anna_context_decode(_topk) call keeps where its
 * logits are (device memory on a GPU). Those rows stay valid until the next decode, verify or
 * prefill call of the context (any sequence), so these calls go between that call and the
 * next one; anna_context_mask_topk changes them in place, which anna_context_logits_row and
 * anna_context_sample_tail then see.
 *
 * anna_context_sample_tail: finishes the draws anna_sampler_sample_candidates_tail returned 2
 * for: out[i] = the token of draw t[i] on row rows[i] (flagged order), i < n. One upload of the
 * draws, one op call and one download of n results (twice when some t[i] have a min-p floor:
 * their tail's kept mass first). On the CPU backend out[i] is exactly anna_sampler_sample's
 * token; a GPU sums the tail in another order, so a draw within about 1e-12 of the kept mass
 * of a boundary between two tokens may give the neighbouring one.
 * n = 0 only asks whether the backend can (0, or ANNA_EUNSUPPORTED: it has no sampling ops;
 * then ask anna_sampler_sample_candidates for 1 instead, before the RNG is consumed). At most
 * as many rows as the context's batch. ANNA_ERANGE for a row the last call did not leave. */
typedef struct anna_sample_tail anna_sample_tail; /* the sampler section below */
int anna_context_sample_tail(anna_context *c, const int *rows, const anna_sample_tail *t, int n, int32_t *out,
                             char *err, size_t errlen);
/* anna_context_mask_topk: for each row r < n_rows (flagged order) whose bits[r] is not NULL,
 * the tokens it rejects become -inf (bits[r]: (vocab + 63) / 64 words, bit t % 64 of word
 * t / 64 set = token t rejected; borrowed for the call), then that row's candidates are
 * computed again as anna_context_decode_topk computes them, into idx/val[r * k ..] and
 * stats[2r ..] (k and temp as there; the softmax sum is the masked row's). Rows with a NULL
 * mask keep their outputs untouched. So constrained rows (JSON schema, grammar, min_tokens)
 * are drawn from candidates too. ANNA_EUNSUPPORTED: the backend has no mask op (the full rows
 * then). */
int anna_context_mask_topk(anna_context *c, const uint64_t *const *bits, int n_rows, int k, float temp, int32_t *idx,
                           float *val, double *stats, char *err, size_t errlen);

/* Per-op-family seconds since creation or the last reset (families: matmul, lm_head,
 * attention, gdn, moe, other), when created with .profile = 1 on the CPU; returns how many
 * were written (0: not profiling). Names are static strings. */
int anna_context_profile(const anna_context *c, double *seconds, const char **names, int cap);
void anna_context_profile_reset(anna_context *c);

/* KV-cache bytes one token of one sequence occupies (all attention layers, K and V). */
int64_t anna_context_kv_bytes_per_token(const anna_context *c);

/* The context's device memory now, in bytes: *free_bytes free (what every process on the
 * device leaves; this context's model mirror, scratch and KV pool are already placed) and
 * *total_bytes in all, for sizing a KV pool from a memory budget (anna-serve's
 * --gpu-memory-utilization: anna_kv_stats.pool_bytes / n_blocks is the size of a block).
 * Returns 0, or ANNA_EUNSUPPORTED where the backend cannot tell (the CPU), leaving both 0. */
int anna_context_memory(const anna_context *c, int64_t *free_bytes, int64_t *total_bytes);

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
  /* The cache's element format (what "auto" resolved to): 0 f32, 1 f16, 2 q8, 3 q4, 4..6
   * turboquant 2..4 bits; anna_kv_type_name gives its name. */
  int kv_type;
} anna_kv_stats;
void anna_context_kv_stats(const anna_context *c, anna_kv_stats *st);
/* "f32", "f16", "q8", "q4", "turboquant2".."turboquant4" for anna_kv_stats.kv_type ("unknown"
 * otherwise); static storage. */
const char *anna_kv_type_name(int kv_type);
/* KV-block accounting of one sequence, for a scheduler (anna_sched_seq_blocks), computed by
 * the cache itself so a plan never counts on blocks it will not get:
 *   needed: the blocks the next decode takes from the pool (free or evictable) when it feeds
 *           n more tokens of seq alone: blocks its positions start, plus a copy of each block
 *           they write that another sequence or the prefix pool also holds (copy on write;
 *           e.g. the shared partial last block of a prompt several choices copied). Sequences
 *           sharing one block may together need one copy fewer than the sum.
 *   held:   the blocks only seq holds: what anna_context_seq_reset gives back (free or
 *           evictable); blocks it shares stay with their other holders.
 * ANNA_ERANGE for a bad seq; ANNA_EUNSUPPORTED for kinds without per-sequence state. */
int64_t anna_context_seq_blocks_needed(const anna_context *c, int seq, int32_t n);
int64_t anna_context_seq_blocks_held(const anna_context *c, int seq);

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

/* MoE expert offload (1.5; anna_context_options.offload_mode): on = 0 when off. Cache slots
 * per MoE layer and staging slots; experts in the pinned host mirror; routed experts
 * (distinct per layer and step) and how many were in the cache; adaptive swaps made; bytes
 * copied to the device from the host mirror and from the model's file mapping; the device
 * bytes of the slots. summary: one line saying what went where (borrowed, valid until the
 * context is freed; NULL before the first MoE layer ran). */
typedef struct anna_offload_stats {
  int on, cache_per_layer, staging_slots;
  int64_t mirrored, routed, hits, swaps, bytes_mirror, bytes_file, device_bytes;
  const char *summary;
} anna_offload_stats;
void anna_context_offload_stats(const anna_context *c, anna_offload_stats *st);

/* The context's resolved runtime switches (src/base/tuning.h: defaults, then ANNA_TUNING,
 * then anna_context_options.tuning), one
 * "key=value" line each, into buf (NUL-terminated, truncated to len). Returns the length
 * the whole text needs (truncated when >= len). */
int anna_context_tuning(const anna_context *c, char *buf, size_t len);

/* ---- Speculative decoding (greedy) -----------------------------------------------------
 * A drafter proposes the next k tokens of a sequence; one verify window runs the model over
 * them and keeps the longest prefix the model itself would have chosen greedily, plus the
 * model's own next token, so the output is that of plain greedy decoding (up to batched vs
 * single-token arithmetic, which the tests check token for token).
 *
 * verify: seq holds positions [0, L); `last` is its pending token (the greedy choice of the
 * previous logits, not yet in the cache); draft[0, k) the proposal (0 <= k <=
 * ANNA_SPEC_MAX_DRAFT; k = 0 is a plain greedy step). The model runs over [last, draft...] at
 * positions L..L+k in one batch and picks argmax g[i] of every row (ties: lowest id, as
 * anna_sampler's greedy). a = the longest prefix with draft[i] == g[i]; out[0, a) = draft[0,
 * a), out[a] = g[a] (the bonus token); *n_out = a + 1 <= k + 1 (out holds k + 1 ids,
 * caller-owned). Afterwards seq holds positions [0, L + 1 + a) (last and the accepted drafts)
 * and out[a] is the new pending token. Rejected positions are rolled back: attention KV is
 * rewound; the recurrent (Gated DeltaNet conv + delta-rule) state of hybrid models is either
 * copied back from the state the window saved after each drafted token (tuning
 * spec_window_states = 1, the default, when n_checkpoints >= k + 3) or restored from a
 * checkpoint taken before the window, the accepted tokens then run again; such models need
 * anna_context_options.n_checkpoints >= 1 (ANNA_ESTATE names it otherwise). The window's
 * slots share the LRU pool of prefix snapshots. k + 1 <= n_batch. Penalties and
 * temperature > 0: anna_context_verify_sampled below. On error seq is in
 * an unspecified state: reset it. The logits of the window are not kept
 * (anna_context_logits_row: unspecified afterwards). */
#define ANNA_SPEC_MAX_DRAFT 16
int anna_context_seq_verify(anna_context *c, int seq, int32_t last, const int32_t *draft, int k, int32_t *out,
                            int *n_out, char *err, size_t errlen);

/* The same for several sequences in one forward pass: window i verifies draft[0, k) of
 * sequence seq after its pending token last, exactly as anna_context_seq_verify, and sets
 * n_out. Sequences are distinct; the windows' rows (sum of k + 1) fit n_batch; n_checkpoints
 * is shared (per-position states need k + 3 slots per window, else that window re-runs).
 * Every window is checked before anything runs (ANNA_EINVAL / ANNA_ERANGE name the window);
 * on a later error the windows' sequences are in an unspecified state. */
typedef struct anna_spec_window {
  int seq;
  int32_t last;
  const int32_t *draft; /* [k], borrowed for the call */
  int k;
  int32_t *out; /* [k + 1], caller-owned */
  int n_out;    /* set by the call: accepted drafts + 1 */
} anna_spec_window;
int anna_context_verify(anna_context *c, anna_spec_window *w, int n, char *err, size_t errlen);

/* Cumulative counters of anna_context_seq_verify / anna_context_verify since creation: windows run, drafted and
 * accepted tokens, windows that rolled back, tokens run again to restore recurrent state. */
typedef struct anna_spec_stats {
  int64_t windows, drafted, accepted, rollbacks, rerun_tokens;
} anna_spec_stats;
void anna_context_spec_stats(const anna_context *c, anna_spec_stats *st);

/* (API 1.10) Speculative sampling: anna_context_verify whose window i draws its tokens with
 * samplers[i] (any parameters: temperature, top-k/p, min-p, penalties; NULL: greedy as
 * anna_context_verify) instead of taking the argmax. Row j of a window is drawn exactly as
 * plain decoding would draw it after the tokens before it; draft[j] is accepted when the draw
 * equals it, else the draw is the window's last token (out[a]). For a deterministic drafter
 * (the n-gram and MTP drafters: the draft is a point mass) this is speculative sampling's
 * accept rule: d is accepted with probability p(d), the target probability after all the
 * sampler's transforms, and a rejection yields a draw from p with d removed, renormalized; so
 * the output follows the target distribution exactly, and with one seed it is the token
 * sequence plain sampling gives (one random draw per emitted token, as plain decoding). The
 * sampler records each emitted token (anna_sampler_accept on out[0, n_out)): callers do not
 * accept them again. logits: caller-owned scratch of [sum of (k + 1)] * vocab floats (the
 * windows' rows; unspecified afterwards). Errors and rollback as anna_context_verify. */
typedef struct anna_sampler anna_sampler; /* the sampler section below */
int anna_context_verify_sampled(anna_context *c, anna_spec_window *w, anna_sampler *const *samplers, int n,
                                float *logits, char *err, size_t errlen);

/* The n-gram (prompt lookup) drafter: keeps the sequence's history (prompt + generated,
 * fed by accept) and drafts the tokens that followed the latest earlier occurrence of the
 * history's last n tokens, n from n_max down to n_min (llama.cpp's lookup, vLLM's ngram).
 * Needs no model. The history buffer (capacity tokens) is allocated at creation: accept and
 * draft allocate nothing. One thread uses a drafter at a time. Caller frees with
 * anna_ngram_free. Errors: ANNA_EINVAL for parameters out of range, ANNA_ENOMEM. */
#define ANNA_NGRAM_MAX_N 64
typedef struct anna_ngram_params {
  int n_min, n_max; /* suffix lengths tried, longest first: 1 <= n_min <= n_max <= ANNA_NGRAM_MAX_N */
  int k_max;        /* most tokens drafted: 1..ANNA_SPEC_MAX_DRAFT */
} anna_ngram_params;
typedef struct anna_ngram anna_ngram;
int anna_ngram_create(anna_ngram **out, const anna_ngram_params *p, int32_t capacity, char *err, size_t errlen);
void anna_ngram_free(anna_ngram *d);
/* Appends n tokens to the history; ANNA_ERANGE past the capacity (nothing appended). */
int anna_ngram_accept(anna_ngram *d, const int32_t *tokens, int32_t n, char *err, size_t errlen);
/* Writes up to min(k, k_max) drafted tokens to out and returns how many (0: no match). */
int anna_ngram_draft(const anna_ngram *d, int32_t *out, int k);
/* Tokens in the history; reset empties it. */
int32_t anna_ngram_len(const anna_ngram *d);
void anna_ngram_reset(anna_ngram *d);

/* (API 1.10) Adaptive draft length: a per-sequence estimate of the probability that a drafted
 * token is accepted (alpha), as decayed counts of accepted drafts and of rejections (a window
 * gives a successes, and one failure when a < k: the first rejection ends it, so a/drafted
 * would be biased low). next: the longest K with alpha^K >= p_min (the probability the K-th
 * draft is still accepted; below it a drafted row costs more than it is likely to give),
 * clamped to 1..k_max; a new sequence starts at k_max (optimistic: drafts are cheap to drop).
 * p_min <= 0 or k_max == 1: always k_max (anna-generate / anna-serve --draft-fixed). Plain
 * struct, no allocation. */
typedef struct anna_spec_adapt {
  float succ, fail; /* decayed counts */
  int k_max;
  float p_min;
} anna_spec_adapt;
void anna_spec_adapt_init(anna_spec_adapt *a, int k_max, float p_min);
int anna_spec_adapt_next(const anna_spec_adapt *a);
/* Records a window of k drafts of which `accepted` were accepted (k = 0: nothing). */
void anna_spec_adapt_update(anna_spec_adapt *a, int k, int accepted);

/* (API 1.10) The draft-model drafter: a second (smaller) model with the target's vocabulary
 * (sizes and, where both have a tokenizer, every token's piece: ANNA_EINVAL naming the first
 * difference) drafts greedily from its own context, created from opt (n_seq, n_ctx as the
 * target's; n_batch raised to k_max + 1, n_checkpoints to 1). The context follows one target
 * sequence per seq: prefill what the target holds, then per window: anna_draft_draft (k greedy tokens after `last`), the target's verify, and
 * anna_draft_commit with the window's draft and output so the draft context holds what the
 * target holds (a rewind on rejection; a recurrent draft model goes back to the checkpoint
 * taken before the draft and runs the accepted tokens again). The drafter borrows draft_model
 * (which must outlive it); everything is allocated at creation. One thread at a time. Caller
 * frees with anna_draft_free. */
typedef struct anna_draft anna_draft;
int anna_draft_create(anna_draft **out, anna_model *draft_model, const anna_model *target,
                      const anna_context_options *opt, int k_max, char *err, size_t errlen);
void anna_draft_free(anna_draft *d);
/* tokens[0, n) into seq (emptied first): what the target's sequence holds (not its pending token). */
int anna_draft_prefill(anna_draft *d, int seq, const int32_t *tokens, int32_t n, char *err, size_t errlen);
/* (API 1.13) tokens[0, n) appended to seq (a prompt in chunks, as the target runs it). */
int anna_draft_feed(anna_draft *d, int seq, const int32_t *tokens, int32_t n, char *err, size_t errlen);
/* Drafts min(k, k_max) greedy tokens after `last` into draft; returns their number or a
 * negative ANNA_E*. */
int anna_draft_draft(anna_draft *d, int seq, int32_t last, int32_t *draft, int k, char *err, size_t errlen);
/* After the target verified [last, draft[0, k)] with output out[0, n_out): the draft context
 * keeps last and the accepted drafts; out[n_out - 1] is pending in both. */
int anna_draft_commit(anna_draft *d, int seq, int32_t last, const int32_t *draft, int k, const int32_t *out,
                      int n_out, char *err, size_t errlen);
void anna_draft_reset(anna_draft *d, int seq);

/* (API 1.4) The MTP drafter: the checkpoint's multi-token-prediction head (Qwen3.5 `mtp.*`), chained k
 * times from the main model's last final-norm hidden state, its drafts checked by the verify
 * window. The head keeps its own KV cache (one attention layer; the context's n_seq, n_ctx and
 * n_batch) holding one entry per position of the main model, built from that position's hidden
 * state; so a sequence the drafter follows takes its prompt through anna_mtp_prefill and its
 * windows through anna_mtp_verify (tokens fed with anna_context_decode would leave the head
 * behind). Greedy windows only, as anna_context_seq_verify. The drafter borrows c (which must
 * outlive it); everything is allocated at creation. One thread at a time.
 * anna_model_has_mtp: 1 when the loaded model has a head. anna_mtp_create: ANNA_EUNSUPPORTED
 * without one, ANNA_EINVAL for k_max outside 1..ANNA_SPEC_MAX_DRAFT or an n_batch < k_max + 1.
 * Caller frees with anna_mtp_free. */
typedef struct anna_mtp anna_mtp;
int anna_model_has_mtp(const anna_model *m);
int anna_mtp_create(anna_mtp **out, anna_context *c, int k_max, char *err, size_t errlen);
void anna_mtp_free(anna_mtp *d);
/* tokens[0, n) as the prompt of seq, which must be empty (ANNA_EINVAL otherwise): the context
 * runs them (chunks of n_batch) and the head takes every position but the last; the last
 * token's logits to logits [vocab]. */
int anna_mtp_prefill(anna_mtp *d, int seq, const int32_t *tokens, int32_t n, float *logits, char *err,
                     size_t errlen);
/* Drafts min(k, k_max) tokens to follow `last` (the newest token, not yet run by the context)
 * into draft and returns their number (0 when k <= 0), or a negative ANNA_E*. */
int anna_mtp_draft(anna_mtp *d, int seq, int32_t last, int32_t *draft, int k, char *err, size_t errlen);
/* anna_context_seq_verify(c, seq, last, draft, k, out, n_out) that also keeps the accepted
 * positions' hidden states for the head's next draft. */
int anna_mtp_verify(anna_mtp *d, int seq, int32_t last, const int32_t *draft, int k, int32_t *out, int *n_out,
                    char *err, size_t errlen);
/* (API 1.10) anna_mtp_verify drawing with sampler s as anna_context_verify_sampled (the MTP
 * head drafts its argmax: a point mass, so the rule there is exact). logits: [(k + 1) * vocab]
 * caller-owned scratch. */
int anna_mtp_verify_sampled(anna_mtp *d, int seq, int32_t last, const int32_t *draft, int k, anna_sampler *s,
                            float *logits, int32_t *out, int *n_out, char *err, size_t errlen);
/* (API 1.13) A prompt in pieces: tokens[0, n) continue seq at its current length (a prompt
 * chunk; the context runs them in batches of n_batch, hidden rows only) and the head takes
 * them. Positions the context held before the head followed seq (a prefix reused from a
 * cache) are not in the head: its entries start at the first token fed here. logits non-NULL
 * (the prompt's last chunk): the last token's logits [vocab] are written there and its
 * position is the one the next draft starts from; NULL: more of the prompt follows. */
int anna_mtp_feed(anna_mtp *d, int seq, const int32_t *tokens, int32_t n, float *logits, char *err,
                  size_t errlen);
/* (API 1.13) anna_mtp_draft for n distinct sequences at once, each chain step one head run
 * over all of them: sequence seq[i] drafts min(k[i], k_max) tokens after last[i] into
 * draft + i * ANNA_SPEC_MAX_DRAFT, and k[i] is set to their number (k[i] <= 0: nothing, and
 * its pending positions stay for its window). The drafts are anna_mtp_draft's. */
int anna_mtp_draft_batch(anna_mtp *d, int n, const int *seq, const int32_t *last, int *k, int32_t *draft, char *err,
                         size_t errlen);
/* (API 1.13) anna_mtp_verify(_sampled) for several sequences in one forward pass, as
 * anna_context_verify(_sampled): window i verifies w[i].draft[0, k) of its sequence after
 * w[i].last (k = 0: a plain step that still gives the head the new position), drawing with
 * samplers[i] when samplers is non-NULL (logits: [sum of (k + 1)] * vocab scratch then; NULL
 * samplers: greedy, logits unused). Every window's accepted rows become its sequence's next
 * pending positions, so the head stays in step with each sequence (anna-serve drives its
 * speculating slots through this). The windows' rows fit the context's n_batch. */
int anna_mtp_verify_batch(anna_mtp *d, anna_spec_window *w, int n, anna_sampler *const *samplers, float *logits,
                          char *err, size_t errlen);
/* Forgets seq in the head (the caller resets the context's sequence). */
void anna_mtp_reset(anna_mtp *d, int seq);

/* ---- Sampler ---------------------------------------------------------------------------
 * Next-token selection from logits, one sampler per sequence. Pipeline (the order llama.cpp
 * and HF agree on): penalties (repetition on every token seen, presence/frequency on counts)
 * -> greedy if temperature <= 0 -> temperature -> top-k -> top-p -> min-p -> draw with a
 * seeded xoshiro256** RNG, so a seed reproduces a run. A sampler owns vocab-sized scratch
 * allocated at creation: sampling allocates nothing. One thread uses a sampler at a time. */
typedef struct anna_sampler_params {
  float temperature;        /* <= 0: greedy */
  int top_k;                /* <= 0: off */
  float top_p;              /* >= 1: off */
  float min_p;              /* <= 0: off */
  float repetition_penalty; /* 1: off (HF semantics: divide positive, multiply negative logits) */
  float presence_penalty;   /* 0: off (OpenAI semantics) */
  float frequency_penalty;  /* 0: off */
  uint64_t seed;
} anna_sampler_params;

/* Defaults: greedy, no penalties. */
anna_sampler_params anna_sampler_params_default(void);

typedef struct anna_sampler anna_sampler;

/* vocab >= 1; p is copied. ANNA_EINVAL for a bad vocab or parameters (temperature < 0,
 * top_p < 0, min_p outside [0, 1], repetition_penalty <= 0). Caller frees with
 * anna_sampler_free. */
int anna_sampler_create(anna_sampler **out, int vocab, const anna_sampler_params *p, char *err, size_t errlen);
void anna_sampler_free(anna_sampler *s);
/* Records a token as seen (prompt or generated) for the penalties. */
void anna_sampler_accept(anna_sampler *s, int32_t token);
/* Forgets the seen tokens (new sequence); keeps the RNG stream. */
void anna_sampler_reset(anna_sampler *s);
/* Picks the next token. logits[vocab] is modified (penalties, scaling). */
int32_t anna_sampler_sample(anna_sampler *s, float *logits);

/* Sampling from candidates (anna_context_decode_topk: the k best logits of a row, sorted, plus
 * the row's max and softmax sum) instead of the full row, so that the logits need not leave
 * the device. anna_sampler_candidates_k: the k the parameters need (1 for greedy, top_k, or the
 * sorted head of 256 for top-p / min-p without top-k), 0 when only the full row will do
 * (penalties, pure temperature sampling, top_k above ANNA_TOPK_MAX). *temp (may be NULL): the
 * temperature the softmax sum must be taken at, 0 when the sum is not used.
 * anna_sampler_sample_candidates: with k >= anna_sampler_candidates_k candidates of a row
 * (idx/val[k], stats[2] as anna_context_decode_topk), draws exactly the token
 * anna_sampler_sample would draw from that row (same RNG consumption), writes it to *out and
 * returns 0; or returns 1 having consumed nothing when the candidates do not decide it (the
 * top-p nucleus or the min-p survivors reach past them, or k too small): the caller samples the
 * full row with anna_sampler_sample instead. With a device's softmax sum (not summed as the CPU
 * reference does) a draw can differ only where the probabilities' last-bit rounding decides
 * it. A row without a finite logit (all -inf / NaN) is garbage either way. */
int anna_sampler_candidates_k(const anna_sampler *s, float *temp);
int anna_sampler_sample_candidates(anna_sampler *s, const int32_t *idx, const float *val, int k,
                                   const double *stats, int32_t *out);

/* (API 1.14) Draws past the candidates, where the logits are. A draw without top-k (pure
 * temperature, or min-p keeping the whole sorted head) walks the head, then every other token
 * in vocabulary order (anna_sampler_sample); anna_sampler_sample_candidates_tail walks the head
 * on the host and leaves the rest to anna_context_sample_tail, which walks the tail on the
 * decode call's kept logits row: no row crosses to the host. anna_sample_tail carries the
 * draw between the two (filled by the sampler, read by the context; the caller only keeps it). */
typedef struct anna_sample_tail {
  float inv_t, mx, floor_p; /* 1 / temperature, row max / temperature, min-p floor (0: none) */
  double z;                 /* the row's softmax sum */
  double sum;               /* the kept mass known so far (floor_p > 0: the head's only) */
  double r;                 /* the draw in [0, 1): u = r * the whole kept mass */
  double u;                 /* floor_p == 0: what is left of u after the head (> 0) */
  int32_t nh, kept;         /* sorted head length; head entries kept */
  int32_t fallback;         /* the token when nothing past the head is kept */
  int32_t head[ANNA_TOPK_MAX];
  float prob[ANNA_TOPK_MAX]; /* the head's probabilities, as anna_sampler_sample computes them */
} anna_sample_tail;
/* (API 1.14) anna_sampler_candidates_k for anna_sampler_sample_candidates_tail: the same, except
 * that pure temperature sampling (no top-k, top_p 1, min_p 0) also takes the sorted head of
 * 256 and the softmax sum at its temperature. */
int anna_sampler_candidates_tail_k(const anna_sampler *s, float *temp);
/* (API 1.14) anna_sampler_sample_candidates that can also finish past the candidates. Returns
 * 0 with the token in *out; 1 having consumed nothing when only the full row will do (the top-p
 * nucleus reaches past the head, k too small, penalties): anna_sampler_sample on the row; or 2
 * when the draw needs the tail (it lands past the head, or min-p needs the tail's kept mass
 * before it can be placed): the RNG draw is consumed exactly as anna_sampler_sample consumes it,
 * *t holds the rest, and anna_context_sample_tail on that row gives the token (the same token
 * anna_sampler_sample draws on the CPU backend). t: caller-owned, may not be NULL. */
int anna_sampler_sample_candidates_tail(anna_sampler *s, const int32_t *idx, const float *val, int k,
                                        const double *stats, anna_sample_tail *t, int32_t *out);

/* ---- Scheduler -------------------------------------------------------------------------
 * The continuous-batching policy (anna-serve's engine drives it), as a pure module: it
 * decides which sequences run and what each feeds in a step; it never touches a model
 * context, a socket or a clock, and never sleeps. Times come in as numbers (milliseconds on
 * any monotonic clock), cache capacity as a count of free KV blocks. The caller executes what
 * it is told and reports back:
 *
 *   anna_sched_submit      queue sequences (all or nothing; ANNA_ERANGE: the queue is full)
 *   anna_sched_wait_ms     an idle caller may wait this long for company (batch_wait_ms)
 *   anna_sched_admit       waiting sequences -> free slots (context sequence ids 0..n_slots-1)
 *   anna_sched_drop_next   cancelled sequences, one at a time (their slot is free again)
 *   anna_sched_seq_cached  after admission: prompt tokens a cache already holds (not fed)
 *   anna_sched_seq_blocks  before a step: the cache's exact block counts for a sequence
 *   anna_sched_plan_step   one step: a decode token per running sequence, prompt chunks,
 *                          preemptions when a decode needs a KV block and none is free
 *   anna_sched_commit      the step ran: its tokens are in the cache
 *   anna_sched_seq_token   a running sequence produced a token (it decodes from now on)
 *   anna_sched_seq_finish  a running sequence ended (any reason): its slot is free
 *
 * A preempted sequence loses its slot (the caller resets that context sequence) and goes back
 * to the front of the queue with its generated tokens counted: when admitted again, its input
 * is prompt + generated tokens, recomputed as a prompt, and the logits of the last one give
 * its next token. Not thread-safe: the caller serializes every call (the engine holds its
 * mutex). Nothing here allocates after anna_sched_create except anna_sched_submit (one record
 * per sequence, freed when it finishes or is dropped). */

/* Request kinds. Only ANNA_SCHED_KIND_TEXT is scheduled today; the others are the next kinds
 * the runtime serves and are refused by anna_sched_submit (ANNA_EUNSUPPORTED) until they are
 * implemented. Each kind has a per-step decode token cost (anna_sched_kind_decode_tokens). */
typedef enum anna_sched_kind {
  ANNA_SCHED_KIND_TEXT = 0, /* text generation: prompt prefill, then one token per decode step */
  ANNA_SCHED_KIND_ENCODE,   /* next: encode-only (embeddings, media encoders): prefill only */
  ANNA_SCHED_KIND_ASR,      /* next: audio encoder prefill, then text decode */
  ANNA_SCHED_KIND_TTS,      /* next: text prefill, then a stream of audio-codec tokens per step */
  ANNA_SCHED_KIND_COUNT
} anna_sched_kind;

/* Decode tokens one step feeds for a sequence of this kind (0: the kind does not decode or is
 * not implemented). */
int anna_sched_kind_decode_tokens(anna_sched_kind k);

typedef struct anna_sched_options {
  int n_slots;                /* sequence slots (>= 1) */
  int n_batch;                /* tokens per step (>= n_slots + 1, as the context's n_batch) */
  int max_batch_size;         /* running sequences (<= n_slots; out of range: n_slots) */
  int max_prefill_tokens;     /* prompt tokens per step (0: what the step has room for) */
  int max_decode_tokens;      /* cached tokens over one step's decode sequences (0: off) */
  int max_waiting;            /* queued sequences before anna_sched_submit refuses (0: off) */
  int max_queue_wait_ms;      /* a waiter older than this is admitted beyond max_batch_size */
  int prefill_interval_steps; /* while sequences decode, prompt chunks every N steps (<= 1: each) */
  int batch_wait_ms;          /* an idle scheduler waits this long for company (0: off) */
  int block_len;              /* KV block length (<= 0: no block accounting) */
  /* > 0 (API 1.7): every prompt chunk is [k*A, min((k+1)*A, input)) for A = chunk_align, one
   * per sequence per step, never cut shorter by the budget or the free blocks (the sequence
   * waits for the next step instead), so where a prompt is cut does not depend on the load:
   * with batch-invariant kernels, a request's output then does not depend on the others
   * (anna-serve --deterministic). 1 <= A <= n_batch - n_slots + 1 and <= max_prefill_tokens
   * when that is set, else ANNA_EINVAL. 0: chunks as large as the budget allows. */
  int chunk_align;
} anna_sched_options;

typedef struct anna_sched_seq_desc {
  anna_sched_kind kind;
  int32_t n_prompt; /* prompt tokens (>= 1) */
  void *user;       /* borrowed; handed back in every entry about this sequence */
} anna_sched_seq_desc;

/* One sequence's part of an admission, a drop, a step or a preemption. */
typedef struct anna_sched_entry {
  uint64_t id;
  void *user;
  int slot;    /* context sequence; -1: a dropped sequence that never ran */
  int32_t pos; /* first position this step feeds (admission: tokens generated so far) */
  int32_t n;   /* tokens this step feeds (admission: input length: prompt [+ generated]) */
  int want;    /* the logits of this entry's last token are needed */
} anna_sched_entry;

/* A step. Arrays are owned by the scheduler and valid until the next anna_sched_plan_step.
 * Decodes come first (in rotating slot order), then prompt chunks (in admission order); the
 * caller lays the batch out in that order. */
typedef struct anna_sched_plan {
  const anna_sched_entry *decode;
  int n_decode;
  const anna_sched_entry *prefill;
  int n_prefill;
  const anna_sched_entry *preempted; /* reset these slots before running the step */
  int n_preempted;
  int n_tokens; /* decode + prefill tokens */
} anna_sched_plan;

typedef struct anna_sched anna_sched;

/* Caller frees with anna_sched_free. */
int anna_sched_create(anna_sched **out, const anna_sched_options *o, char *err, size_t errlen);
void anna_sched_free(anna_sched *s);

/* Queues n sequences arriving at now_ms; their ids are *first_id .. *first_id + n - 1.
 * ANNA_ERANGE: max_waiting sequences are already waiting (nothing queued); ANNA_EUNSUPPORTED: a
 * kind that is not implemented yet; ANNA_EINVAL: an empty prompt; ANNA_ENOMEM. */
int anna_sched_submit(anna_sched *s, const anna_sched_seq_desc *d, int n, double now_ms,
                      uint64_t *first_id, char *err, size_t errlen);
/* Marks a waiting or running sequence cancelled; it comes out of anna_sched_drop_next after the
 * next anna_sched_admit. Returns 0, or ANNA_ENOTFOUND for an id neither queued nor running. */
int anna_sched_cancel(anna_sched *s, uint64_t id);
/* Cancels everything queued or running (shutdown). */
void anna_sched_cancel_all(anna_sched *s);

int anna_sched_n_waiting(const anna_sched *s); /* queued, cancelled ones included until dropped */
int anna_sched_n_running(const anna_sched *s);

/* With nothing running: -1 nothing waits; > 0 the milliseconds an idle caller may still wait
 * for more requests before the first step (batch_wait_ms); 0 plan now. */
double anna_sched_wait_ms(const anna_sched *s, double now_ms);

/* Moves waiting sequences into free slots (least recently used first): up to max_batch_size
 * running, more only for a waiter older than max_queue_wait_ms, in queue order, each only
 * when kv_free_blocks (< 0: unlimited) covers its first prompt chunk. Cancelled sequences
 * (waiting or running) move to the drop list. *adm / *n_adm: the admitted entries (slot, n =
 * input length, pos = tokens generated before a preemption), valid until the next call. */
int anna_sched_admit(anna_sched *s, double now_ms, int64_t kv_free_blocks,
                     const anna_sched_entry **adm, int *n_adm);
/* Pops one cancelled sequence into *out (slot >= 0: it was running, that slot is free now).
 * Returns 1 while there was one, else 0. */
int anna_sched_drop_next(anna_sched *s, anna_sched_entry *out);
/* After admission: the first n input tokens of slot's sequence are already cached. */
void anna_sched_seq_cached(anna_sched *s, int slot, int32_t n);
/* Before anna_sched_plan_step: the cache's block counts for slot's running sequence as it
 * stands, next_blocks = anna_context_seq_blocks_needed(ctx, slot, 1) and held_blocks =
 * anna_context_seq_blocks_held(ctx, slot). The next plan uses them instead of its estimate
 * (which misses copies of shared blocks and counts shared blocks as freed by a preemption);
 * they hold until anna_sched_commit. Negative counts are ignored. */
void anna_sched_seq_blocks(anna_sched *s, int slot, int64_t next_blocks, int64_t held_blocks);

/* Plans one step under the token budgets. kv_free_blocks (free + evictable; < 0: unlimited):
 * a decode that starts a new block needs one; if they run out, the most recently admitted
 * running sequence is preempted (repeatedly) until the rest fit; prompt chunks are cut to
 * the blocks left. The plan may be empty. */
void anna_sched_plan_step(anna_sched *s, int64_t kv_free_blocks, anna_sched_plan *p);
/* The step ran: prompt chunks and decode tokens are in the cache. */
void anna_sched_commit(anna_sched *s, const anna_sched_plan *p);
/* Slot's sequence produced a token (from its last prompt chunk's or a decode's logits). */
void anna_sched_seq_token(anna_sched *s, int slot);
/* Slot's sequence ended (stop, length, error, cancel): its record is freed, the slot is free. */
void anna_sched_seq_finish(anna_sched *s, int slot);

/* Introspection for tests and stats: slot's sequence id (0: free), its tokens in the cache,
 * and its generated token count. */
uint64_t anna_sched_slot_id(const anna_sched *s, int slot);
int32_t anna_sched_slot_cached(const anna_sched *s, int slot);
int32_t anna_sched_slot_generated(const anna_sched *s, int slot);

/* ---- Chat templates --------------------------------------------------------------------
 * A model's Jinja2 chat template, rendered as transformers' apply_chat_template(tokenize=False)
 * does. Found the way transformers finds it: chat_template.jinja in the folder, else
 * chat_template in tokenizer_config.json (a string, or the "default" of a list of {name,
 * template}), else chat_template.json; bos_token / eos_token from tokenizer_config.json.
 * Immutable once built: render it from any number of threads. JSON arguments are UTF-8 JSON
 * texts (NUL-terminated; "\u0000" inside strings is allowed); NULL stands for "none". */
typedef struct anna_chat_template anna_chat_template;

/* Loads and parses the template of a model folder. ANNA_ENOTFOUND when the folder has none,
 * ANNA_EFORMAT when it does not parse. Caller frees with anna_chat_template_free. */
int anna_chat_template_load(anna_chat_template **out, const char *model_dir, char *err, size_t errlen);
/* From template text (len bytes, copied) and optional bos/eos token texts (copied; NULL =
 * none). Caller frees with anna_chat_template_free. */
int anna_chat_template_from_source(anna_chat_template **out, const char *src, size_t len, const char *bos_token,
                                   const char *eos_token, char *err, size_t errlen);
void anna_chat_template_free(anna_chat_template *ct);
/* (API 1.11) The template's text (borrowed: lives as long as ct; NUL-terminated) and its
 * length in *len (may be NULL); NULL for ct NULL. Servers read markup families from it. */
const char *anna_chat_template_source(const anna_chat_template *ct, size_t *len);

/* Renders a conversation: the template sees messages (a JSON array of message objects), tools
 * (a JSON array, or NULL: None), documents (None), add_generation_prompt, bos_token,
 * eos_token, and every key of kwargs (a JSON object or NULL; its keys override the others).
 * ANNA_EINVAL (naming the argument) when one is not valid JSON; a template error
 * (raise_exception, a type error, limits) is a negative code with the template's message.
 * *out: NUL-terminated, *out_len excludes the NUL; caller frees with free(). */
int anna_chat_template_render(const anna_chat_template *ct, const char *messages_json, const char *tools_json,
                              int add_generation_prompt, const char *kwargs_json, char **out, size_t *out_len,
                              char *err, size_t errlen);
/* Renders with exactly the variables of vars_json (a JSON object: every top-level key is a
 * template variable; nothing is added). *out as anna_chat_template_render. */
int anna_chat_template_render_vars(const anna_chat_template *ct, const char *vars_json, char **out,
                                   size_t *out_len, char *err, size_t errlen);

/* ---- Text: tokenizer + chat template of a model ----------------------------------------
 * From the path the weights come from: a Hugging Face folder (tokenizer.json,
 * tokenizer_config.json / generation_config.json for bos/eos, the chat template as above) or
 * a GGUF file (tokenizer.ggml.* and tokenizer.chat_template). An anna_text is immutable once
 * opened: any number of threads may tokenize, detokenize, look up and render at once. Token
 * ids are int32_t in [0, anna_text_vocab). */
typedef struct anna_text anna_text;

/* Flags of anna_text_open. */
#define ANNA_TEXT_NO_TEMPLATE 1 /* folders: do not load (or parse) the chat template */

/* A missing chat template is not an error (anna_text_template then returns NULL). Errors:
 * ANNA_EIO (no such path), ANNA_EFORMAT / ANNA_EUNSUPPORTED (tokenizer or template file),
 * ANNA_ENOMEM. Caller frees with anna_text_free. */
int anna_text_open(anna_text **out, const char *path, int flags, char *err, size_t errlen);
void anna_text_free(anna_text *t);

/* Flags of anna_text_tokenize. */
#define ANNA_TOKENIZE_ADD_SPECIAL 1       /* add what the model adds (BOS, ...) around the text */
#define ANNA_TOKENIZE_NO_PARSE_SPECIAL 2 /* special-token texts are plain text (untrusted input) */

/* Encodes len bytes of UTF-8 (need not be NUL-terminated). *ids (caller frees with free();
 * may be NULL when *n == 0) holds *n ids. ANNA_EINVAL for invalid UTF-8. */
int anna_text_tokenize(const anna_text *t, const char *text, size_t len, int flags, int32_t **ids, size_t *n,
                       char *err, size_t errlen);

/* Flags of anna_text_detokenize and anna_text_stream_new. */
#define ANNA_DETOKENIZE_SKIP_SPECIAL 1 /* drop special (control) tokens from the output */

/* Decodes n ids. *text (caller frees with free()) is NUL-terminated, *len excludes the NUL.
 * Bytes that are not valid UTF-8 come out as U+FFFD. ANNA_ERANGE for an id out of range. */
int anna_text_detokenize(const anna_text *t, const int32_t *ids, size_t n, int flags, char **text, size_t *len,
                         char *err, size_t errlen);

/* Vocabulary size (ids are below it). */
int32_t anna_text_vocab(const anna_text *t);
/* The stored vocabulary piece of id as written in the vocabulary ("Ġthe", "▁the",
 * "<|im_end|>"), borrowed and NUL-terminated, *len (may be NULL) its length; NULL for an id out
 * of range or a hole in the id space. */
const char *anna_text_token_piece(const anna_text *t, int32_t id, size_t *len);
/* The text id decodes to on its own (what anna_text_detokenize gives for {id}), into
 * out[cap] NUL-terminated, *len its length. ANNA_ERANGE for a bad id, or when cap <= the
 * length (then *len is the length needed and out is untouched). */
int anna_text_token_text(const anna_text *t, int32_t id, char *out, size_t cap, size_t *len, char *err,
                         size_t errlen);
/* Id of a vocabulary piece or added token as written in the vocabulary, NUL-terminated; -1 if
 * none. */
int32_t anna_text_token_id(const anna_text *t, const char *piece);
/* 1 when id is a special (control) token, 0 otherwise (or out of range). */
int anna_text_token_is_special(const anna_text *t, int32_t id);
/* Special ids; -1 when the model has none. */
int32_t anna_text_bos(const anna_text *t);
int32_t anna_text_eos(const anna_text *t);
int32_t anna_text_pad(const anna_text *t);
/* End-of-generation ids: eos, eot, generation_config.json's eos_token_id list, and added
 * special tokens that end a turn (<|im_end|>, <|eot_id|>, <end_of_turn>, ...). Borrowed; *n
 * their count. anna_text_is_eog: 1 when id is one of them. */
const int32_t *anna_text_eog_ids(const anna_text *t, size_t *n);
int anna_text_is_eog(const anna_text *t, int32_t id);

/* Streaming detokenizer: feed one id at a time; only complete UTF-8 characters come out, so
 * a character split across tokens appears once whole. Per-sequence mutable state owned by
 * one thread; it must not outlive its anna_text. Feeding allocates nothing. flags:
 * ANNA_DETOKENIZE_*. Caller frees with anna_text_stream_free. */
typedef struct anna_text_stream anna_text_stream;
int anna_text_stream_new(anna_text_stream **out, const anna_text *t, int flags, char *err, size_t errlen);
void anna_text_stream_free(anna_text_stream *s);
/* Writes the newly completed bytes of id to out[cap] (not NUL-terminated; 64 bytes always
 * suffice for one token of a real vocabulary, ANNA_ERANGE if not) and their count to *out_len
 * (may be 0). ANNA_ERANGE for an id out of range. */
int anna_text_stream_feed(anna_text_stream *s, int32_t id, char *out, size_t cap, size_t *out_len, char *err,
                          size_t errlen);
/* Emits what is still held (an incomplete character becomes U+FFFD) and resets the stream for
 * a new sequence. */
int anna_text_stream_flush(anna_text_stream *s, char *out, size_t cap, size_t *out_len, char *err,
                           size_t errlen);

/* The model's chat template, borrowed (lives as long as t); NULL when it ships none or t was
 * opened with ANNA_TEXT_NO_TEMPLATE. */
const anna_chat_template *anna_text_template(const anna_text *t);

/* The prompt ids of a chat request: messages rendered with the chat template
 * (add_generation_prompt on; tools_json, kwargs_json may be NULL; JSON as
 * anna_chat_template_render), tokenized with special-token texts parsed and nothing added (the
 * template wrote any BOS). Without a template: the messages' "content" strings, each followed
 * by "\n", tokenized with ANNA_TOKENIZE_ADD_SPECIAL. *ids: caller frees with free(). */
int anna_text_encode_chat(const anna_text *t, const char *messages_json, const char *tools_json,
                          const char *kwargs_json, int32_t **ids, size_t *n, char *err, size_t errlen);

/* The prompt of the command-line tools: a user message (after an optional system message,
 * NULL: none) rendered with the chat template, or, with raw set or no template, the text
 * itself tokenized with ANNA_TOKENIZE_ADD_SPECIAL. no_think passes enable_thinking=false. An
 * empty result is ANNA_EINVAL. *ids: caller frees with free(). */
int anna_text_encode_prompt(const anna_text *t, const char *prompt, const char *system, int raw, int no_think,
                            int32_t **ids, size_t *n, char *err, size_t errlen);

/* ---- GGUF inspection -------------------------------------------------------------------
 * Read-only view of a GGUF (v2/v3) file's metadata and tensor table (anna-gguf). The file is
 * mapped and fully validated by anna_gguf_open, so the accessors cannot fail on its content;
 * index arguments out of range give NULL / -1 / ANNA_ERANGE as stated. Everything returned is
 * borrowed and valid until anna_gguf_close. One anna_gguf may be read from many threads. */
typedef struct anna_gguf anna_gguf;

/* Metadata value types, numbered as in the file. */
enum anna_gguf_type {
  ANNA_GGUF_UINT8 = 0,
  ANNA_GGUF_INT8 = 1,
  ANNA_GGUF_UINT16 = 2,
  ANNA_GGUF_INT16 = 3,
  ANNA_GGUF_UINT32 = 4,
  ANNA_GGUF_INT32 = 5,
  ANNA_GGUF_FLOAT32 = 6,
  ANNA_GGUF_BOOL = 7,
  ANNA_GGUF_STRING = 8,
  ANNA_GGUF_ARRAY = 9,
  ANNA_GGUF_UINT64 = 10,
  ANNA_GGUF_INT64 = 11,
  ANNA_GGUF_FLOAT64 = 12,
};

/* Errors: ANNA_EIO (cannot open/map), ANNA_EFORMAT (malformed: the message says where),
 * ANNA_ENOMEM. Caller frees with anna_gguf_close. */
int anna_gguf_open(anna_gguf **out, const char *path, char *err, size_t errlen);
void anna_gguf_close(anna_gguf *g);

uint32_t anna_gguf_version(const anna_gguf *g);
size_t anna_gguf_file_size(const anna_gguf *g);
size_t anna_gguf_alignment(const anna_gguf *g);
size_t anna_gguf_data_offset(const anna_gguf *g); /* file offset of the tensor data section */
/* Static name of a value type ("u32", "str", ...; "?" when unknown). */
const char *anna_gguf_type_name(int type);

int64_t anna_gguf_kv_count(const anna_gguf *g);
/* Key i (NUL-terminated); NULL when i is out of range. */
const char *anna_gguf_kv_key(const anna_gguf *g, int64_t i);
/* Index of a key, -1 when absent. */
int64_t anna_gguf_kv_find(const anna_gguf *g, const char *key);
/* Value type of key i (enum anna_gguf_type), -1 when out of range. For ANNA_GGUF_ARRAY,
 * *elem_type and *count (each may be NULL) get the element type and count; otherwise they
 * are set to -1 and 1. */
int anna_gguf_kv_type(const anna_gguf *g, int64_t i, int *elem_type, int64_t *count);
/* Value i as text, as anna-gguf prints it: numbers in decimal (floats %.9g), true/false,
 * strings quoted with " \\ newline and control bytes escaped and cut after 200 bytes
 * (`...(N bytes)`), arrays as [a, b, ...] showing 8 elements (strings cut after 40 bytes,
 * floats %.6g) and `, ... (N total)`. snprintf semantics: writes at most cap bytes including
 * the NUL (out may be NULL when cap is 0) and returns the full length; -1 when i is out of
 * range. */
int64_t anna_gguf_kv_text(const anna_gguf *g, int64_t i, char *out, size_t cap);
/* Scalar values. _int: any integer or bool value (unsigned 64-bit above INT64_MAX: ERANGE);
 * _float: any number; _str: a string (borrowed, NUL-terminated; *len may be NULL; strings may
 * hold NUL bytes). ANNA_ERANGE for i out of range, ANNA_EINVAL for another type. */
int anna_gguf_kv_int(const anna_gguf *g, int64_t i, int64_t *out);
int anna_gguf_kv_float(const anna_gguf *g, int64_t i, double *out);
int anna_gguf_kv_str(const anna_gguf *g, int64_t i, const char **out, size_t *len);

#define ANNA_GGUF_MAX_DIMS 4
/* One tensor's entry. name and type_name are borrowed. */
typedef struct anna_gguf_tensor {
  const char *name;
  int type;              /* the file's ggml type id */
  const char *type_name; /* "f32", "q4_K", ... */
  int ndim;
  int64_t dims[ANNA_GGUF_MAX_DIMS]; /* dims[0]: the contiguous (row) dimension; unused = 1 */
  int64_t n_elements;
  int64_t n_bytes;
  uint64_t offset; /* from the start of the data section */
} anna_gguf_tensor;

int64_t anna_gguf_tensor_count(const anna_gguf *g);
/* Fills *out with tensor i. ANNA_ERANGE when i is out of range. */
int anna_gguf_tensor_info(const anna_gguf *g, int64_t i, anna_gguf_tensor *out);

/* ---- Media inputs ----------------------------------------------------------------------
 * Types only: the inputs vision, speech-recognition and speech-synthesis models will accept
 * (nothing in this version takes or produces them). Both are borrowed views: the caller owns
 * the memory and keeps it alive for the call that receives the view. */

/* An image: height rows of width pixels, channels interleaved uint8 samples per pixel (1 gray,
 * 3 RGB, 4 RGBA), rows row_stride bytes apart (>= width * channels), top row first. */
typedef struct anna_image {
  int32_t width, height;
  int32_t channels;
  size_t row_stride;
  const uint8_t *pixels;
} anna_image;

/* Audio: n_samples frames of channels interleaved float PCM samples in [-1, 1] at
 * sample_rate Hz. */
typedef struct anna_audio {
  int32_t sample_rate;
  int32_t channels;
  int64_t n_samples;
  const float *pcm;
} anna_audio;

/* ---- Images in prompts (vision-language models; API 1.2) -------------------------------
 * A model loaded from an HF folder whose config.json has `vision_config` and whose weights
 * hold `model.visual.*` (Qwen3.5) also loads its vision tower; anna_model_has_vision says so.
 * An image becomes an anna_media (decoded and preprocessed as the model's HF processor does,
 * preprocessor_config.json of the folder or the published defaults); a prompt is token ids
 * plus media references, each naming where its run of pad tokens (image_token_id repeated
 * anna_media_n_tokens times) starts. anna_context_prefill runs the tower over the prompt's
 * media, puts its rows in place of the pad tokens' embeddings and gives every token its
 * 3-axis rotary position; the sequence then remembers its rotary delta, so later
 * anna_context_decode calls on it (decode steps, batched with other sequences) need nothing
 * else. The tower runs on the context's device (API 1.12; the first stage's with layer_split;
 * before: always the CPU) with the context's numerics (exact), on a backend of its own sized at
 * the first prefill that needs it and regrown for a larger image; tuning encoder_cpu=1 keeps it
 * on the CPU.
 * Prefix cache: anna_context_prefill neither attaches nor registers prefix blocks; callers
 * must not register a sequence holding an image (pad ids alone do not identify the image);
 * anna_media_hash is there for callers that key caches on content. Video and audio will add
 * constructors for anna_media, not new prefill calls. */

typedef struct anna_vision_info {
  int32_t image_token_id;    /* the pad token an image's rows replace */
  int32_t vision_start_id;   /* -1 when the config names none */
  int32_t vision_end_id;     /* -1 when the config names none */
  int32_t patch_size;        /* pixels per patch side (16) */
  int32_t merge_size;        /* patches per token side (2): one token per merge^2 patches */
  int64_t min_pixels, max_pixels; /* the processor's resize bounds (preprocessor_config.json) */
  int32_t n_embd;            /* width of the tower's output rows (the text model's hidden size) */
} anna_vision_info;

/* 1 when m loaded a vision tower, else 0. */
int anna_model_has_vision(const anna_model *m);
/* Fills *out. ANNA_EUNSUPPORTED (message names the model) when m has no vision tower. */
int anna_model_vision_info(const anna_model *m, anna_vision_info *out, char *err, size_t errlen);

typedef struct anna_media anna_media;

/* Decodes an encoded image (JPEG, PNG, WebP, GIF first frame; data[0..n) borrowed for the
 * call) and preprocesses it for m's tower. max_pixels > 0 refuses a larger image from its
 * header, before decoding (ANNA_EINVAL "... exceeds the limit of N pixels"). Corrupt or
 * unknown data: ANNA_EINVAL naming the format and the problem; a format not compiled in:
 * ANNA_EUNSUPPORTED; m without a tower: ANNA_EUNSUPPORTED. Caller frees *out with
 * anna_media_free. */
int anna_media_image_decode(anna_media **out, const anna_model *m, const void *data, size_t n, int64_t max_pixels,
                            char *err, size_t errlen);
/* As anna_media_image_decode from pixels (img borrowed for the call; channels 1, 3 or 4; RGBA
 * is composited onto white as the HF processor does). */
int anna_media_image_from_pixels(anna_media **out, const anna_model *m, const anna_image *img, char *err,
                                 size_t errlen);
/* Pad tokens the media takes in a prompt (grid t * h * w / merge^2). */
int32_t anna_media_n_tokens(const anna_media *md);
/* The patch grid (t, h, w) and the source image's size (width, height, may be NULL). */
void anna_media_grid(const anna_media *md, int32_t thw[3], int32_t *width, int32_t *height);
/* 64-bit FNV-1a of the preprocessed pixels, grid and processor settings: equal content, equal hash. Not collision
 * resistant: a cache keyed on it must confirm a hit on the content (as the context's encoder
 * cache does) before sharing results between clients. */
uint64_t anna_media_hash(const anna_media *md);
void anna_media_free(anna_media *md);

/* One media item of a prompt: its pad run starts at tokens[at] (borrowed). */
typedef struct anna_media_ref {
  const anna_media *media;
  int32_t at;
} anna_media_ref;

/* Token ids and the media their pad runs stand for (all borrowed for the call). Refs come in
 * increasing `at`, each run exactly anna_media_n_tokens pad ids (a video: one run per temporal
 * group, see "Video in prompts"), runs not adjacent (Qwen
 * prompts put vision start / end ids around each); a pad id outside every run is an error. */
typedef struct anna_prompt {
  const int32_t *tokens;
  int32_t n;
  const anna_media_ref *media;
  int32_t n_media;
} anna_prompt;

/* Appends the prompt to sequence seq (at its current length; the prompt may follow earlier
 * text or images) in chunks of the context's n_batch, after running the tower over its media.
 * logits (may be NULL) receives the last token's logits [vocab]. ANNA_EINVAL names the bad
 * argument (a run that does not match its media, a pad id without media, seq out of range);
 * ANNA_EUNSUPPORTED: the model has no tower or media comes from another model's shape;
 * ANNA_ERANGE: the context is full. Allocates per call (not a per-token path). On error the
 * sequence is in an unspecified state: reset it. */
int anna_context_prefill(anna_context *c, int seq, const anna_prompt *p, float *logits, char *err, size_t errlen);
/* The rotary delta sequence seq carries (0 without images): decode position pos rotates as
 * pos + delta on every axis. */
int32_t anna_context_seq_rope_delta(const anna_context *c, int seq);

/* (API 1.8) anna_context_prefix_attach for a prompt with images or videos: the prefix pool
 * keys each pad token by its media's content (hash of the preprocessed pixels, grid and
 * processor settings, and of that token's own merge block), so the same media + text reuses
 * cached KV and a different media at the same positions never matches; anna_context_prefill
 * registers blocks with the same keys. A media is reused whole or not at all: a match ending
 * inside one is cut back to its first pad. seq then carries the rotary delta of the media the
 * reused prefix holds; the caller prefills p's tokens [r, n) with the media at or after r (their
 * `at` minus r). Pass p with n = prompt length - 1 as for anna_context_prefix_attach. The keys
 * are 31-bit FNV digests per pad: they separate images, but do not resist a client who crafts a
 * collision with another client's exact image and prompt. Returns r
 * (>= 0), or a negative ANNA_E* code with err set (a prompt whose runs do not match its media:
 * ANNA_EINVAL as anna_context_prefill; seq is then empty). */
int32_t anna_context_prefix_attach_media(anna_context *c, int seq, const anna_prompt *p, int flags, char *err,
                                         size_t errlen);

/* The context's tower work since creation. A context keeps the tower's rows of its recent
 * images and videos within a byte budget (anna_context_options.mm_cache_bytes, default 256 MiB,
 * pixels included; least recently used out first): a media met again (same preprocessed pixels,
 * grid and processor settings, compared in full) reuses them instead of running the tower. */
typedef struct anna_vision_stats {
  int64_t images;     /* media prefilled */
  int64_t tower_runs; /* of them, encoded by the tower */
  int64_t cache_hits; /* of them, rows from the encoder cache */
  double tower_s;     /* seconds in the tower */
  /* (API 1.8) the encoder cache (anna_context_options.mm_cache_bytes): lookups that missed
   * (0 while the cache is off), entries evicted for room, and its contents now */
  int64_t cache_misses, cache_evictions;
  int64_t cache_bytes, cache_entries, cache_budget;
} anna_vision_stats;
/* Zeros for a context without a vision tower. */
void anna_context_vision_stats(const anna_context *c, anna_vision_stats *st);
/* Empties the encoder cache (benchmarks time the tower on every run). */
void anna_context_vision_cache_clear(anna_context *c);

/* ---- Video in prompts (vision-language models; API 1.4) --------------------------------
 * A video becomes an anna_media too: decoded with FFmpeg (MP4 / MOV, WebM, MKV, from memory
 * only), frames sampled and preprocessed as transformers' Qwen3VLVideoProcessor does with the
 * model's video_preprocessor_config.json (the published values when the folder has none: 2
 * frames per second, 4 to 768 frames, torchcodec's frame choice and RGB conversion), so its
 * pixels form grid_t = ceil(frames / 2) temporal groups. In a prompt a video is grid_t runs of
 * <|video_pad|> ids (h * w / merge^2 each), every run after the first separated from the
 * previous by the processor's "<t seconds>" text and the vision end / start ids; its
 * anna_media_ref's `at` is the first run's start, and anna_context_prefill takes every next run
 * of video pads as the next group. The tower encodes each group on its own; each group's rotary
 * positions are an image's (time enters as the timestamp text, not the rotary T axis), so decode
 * steps after a video need nothing else. anna_text_encode_chat_media builds such prompts. */

/* Refusal limits of anna_media_video_decode; 0 = no limit. Each refusal is ANNA_EINVAL with a
 * message naming the limit. */
typedef struct anna_video_limits {
  int64_t max_bytes;  /* the encoded size, checked before opening */
  int64_t max_pixels; /* width * height of a frame, checked on the stream header */
  double max_seconds; /* the stream's duration, checked before any frame is decoded */
  int32_t max_frames; /* sampled frames, checked before decoding them */
  int32_t threads;    /* decoder threads (not a limit): 0 = FFmpeg decides */
} anna_video_limits;

/* Decodes an encoded video (data[0..n) borrowed for the call), samples its frames and
 * preprocesses them for m's tower. lim may be NULL (no limits). Corrupt, truncated, audio-only or
 * unknown data: ANNA_EINVAL naming the problem; a build without FFmpeg, or m without a tower or
 * a video_token_id: ANNA_EUNSUPPORTED. Thread-safe (m is only read). Caller frees *out with
 * anna_media_free. anna_media_n_tokens counts the pads of all groups. */
int anna_media_video_decode(anna_media **out, const anna_model *m, const void *data, size_t n,
                            const anna_video_limits *lim, char *err, size_t errlen);
/* 1 when md is a video. */
int anna_media_is_video(const anna_media *md);

typedef struct anna_video_info {
  int32_t n_frames;         /* frames sampled (before padding to the temporal patch) */
  int32_t n_groups;         /* temporal groups: pad runs in a prompt */
  int32_t tokens_per_group; /* pads per run */
  int32_t width, height;    /* a decoded frame (after the stream's rotation) */
  double fps;               /* the stream's average frame rate */
  double seconds;           /* the stream's duration */
} anna_video_info;
/* Fills *out; ANNA_EINVAL (out zeroed) when md is not a video. */
int anna_media_video_info(const anna_media *md, anna_video_info *out);
/* Seconds of temporal group g (the processor's timestamp: mean time of its frames); -1 when md
 * is not a video or g is out of range. */
double anna_media_video_group_time(const anna_media *md, int32_t g);

/* The prompt of a chat request whose messages hold images and videos (m's vision model; t its
 * tokenizer with a chat template): the messages rendered as anna_text_encode_chat does, where the
 * template writes <|vision_start|><|image_pad|><|vision_end|> for each image part and
 * <|vision_start|><|video_pad|><|vision_end|> for each video part (Qwen's templates: parts
 * {"type": "image"} and {"type": "video"}); media[0..n_media) are those images and videos in the
 * order their placeholders appear (borrowed). Each video's placeholder becomes the processor's
 * per-group text before tokenization (so the timestamp text tokenizes as in transformers), and
 * each pad is expanded to its run. *ids (caller frees with free()) holds *n ids; *media_at
 * (caller frees) the `at` of each media for its anna_media_ref. ANNA_EINVAL when the
 * placeholders do not match the media in number or kind (e.g. a pad token typed in a message);
 * ANNA_EUNSUPPORTED without a tower or a chat template. */
int anna_text_encode_chat_media(const anna_text *t, const anna_model *m, const char *messages_json,
                                const char *tools_json, const char *kwargs_json,
                                anna_media *const *media, int32_t n_media, int32_t **ids,
                                size_t *n, int32_t **media_at, char *err, size_t errlen);


/* ---- Audio in prompts (speech recognition; API 1.3) ------------------------------------
 * A Qwen3-ASR folder (config.json model_type "qwen3_asr", qwen-asr's `thinker.*` layout) loads
 * as its thinker (the text decoder: anna_context_decode and the rest work as for any text
 * model) plus its audio encoder; anna_model_has_audio says so. An audio file becomes an
 * anna_media with anna_media_audio_decode: decoded (WAV, FLAC, OGG Vorbis/Opus, MP3),
 * down-mixed, resampled to 16 kHz, peak-normalised and turned into the 128-bin log-mel
 * features exactly as qwen-asr's processor does; anna_media_n_tokens is the number of
 * <|audio_pad|> ids its run takes in a prompt (about 13 per second). anna_context_prefill runs
 * the encoder over the prompt's audio media (on the context's own encoder backend on the
 * context's device, as an image's tower (API 1.12; tuning encoder_cpu=1: the CPU), created
 * at the first prefill with audio and regrown for a longer clip) and puts
 * its rows in place of the pads' embeddings. Positions stay 1-D: the thinker's mRoPE sections
 * always see three equal positions, so an audio run leaves no rotary delta and later decode
 * steps need nothing else. Encoding at prefill rather than in anna_media_audio_decode keeps the
 * model immutable and shareable (the encoder needs a backend and scratch, which belong to a
 * context) and puts the encoder in the thread that owns the context; the features are made
 * eagerly (they need only the clip). Image media given to an audio model, or audio media to
 * a vision model, are ANNA_EUNSUPPORTED at prefill. */

typedef struct anna_audio_info {
  int32_t audio_token_id; /* <|audio_pad|>: the pad id an audio run consists of */
  int32_t audio_start_id; /* <|audio_start|> */
  int32_t audio_end_id;   /* <|audio_end|> */
  int32_t sample_rate;    /* the rate clips are resampled to (16000) */
  int32_t n_mels;         /* feature bins (128) */
  int32_t n_embd;         /* width of the encoder's output rows (the thinker's hidden size) */
  int32_t n_languages;    /* config.json support_languages (0: the file lists none) */
} anna_audio_info;

/* 1 when m loaded an audio encoder, else 0. */
int anna_model_has_audio(const anna_model *m);
/* Fills *out. ANNA_EUNSUPPORTED (message names the model) when m has no audio encoder. */
int anna_model_audio_info(const anna_model *m, anna_audio_info *out, char *err, size_t errlen);
/* Language i of config.json's support_languages (English names, e.g. "English"); NULL when i
 * is out of range. Borrowed from m. */
const char *anna_model_audio_language(const anna_model *m, int i);
/* The forced-language name of a user's language: a supported name in any case ("english") or
 * an ISO-639-1/-3 code ("en", "zh", "yue", ...) of one of Qwen3-ASR's 30 languages, resolved
 * against the model's support_languages (any name when it lists none). Returns the model's own
 * spelling (borrowed from m, or static), or NULL when the language is unknown or unsupported. */
const char *anna_model_audio_language_find(const anna_model *m, const char *lang);

/* Decodes an encoded audio file (data[0..n) borrowed for the call) and computes its features
 * for m's encoder. max_seconds > 0 refuses longer audio from the header, before decoding
 * (ANNA_EINVAL naming the limit; <= 0: no limit but the decoder's own, 1e7 s). Corrupt, truncated, empty or unknown data, zero
 * or too little audio (under 201 samples at 16 kHz): ANNA_EINVAL naming the problem; a build
 * without libsndfile / libsoxr / FFTW: ANNA_EUNSUPPORTED naming the package; m without an
 * audio encoder: ANNA_EUNSUPPORTED. Caller frees *out with anna_media_free. Thread-safe (m is
 * only read). */
int anna_media_audio_decode(anna_media **out, const anna_model *m, const void *data, size_t n,
                            double max_seconds, char *err, size_t errlen);
/* Seconds of audio an audio media holds (its 16 kHz samples / 16000); 0 for an image. */
double anna_media_audio_seconds(const anna_media *md);
/* 1 when md is an audio clip, 0 for an image. */
int anna_media_is_audio(const anna_media *md);

/* The Qwen3-ASR prompt for one clip (MODELS.md "Qwen3-ASR"): <|im_start|>system\n{context}
 * <|im_end|>\n<|im_start|>user\n<|audio_start|> + anna_media_n_tokens(md) x <|audio_pad|> +
 * <|audio_end|><|im_end|>\n<|im_start|>assistant\n, then "language {language}<asr_text>" when
 * language is not NULL (a name as anna_model_audio_language_find returns). context (NULL: "")
 * and language are user text: special-token spellings in them stay plain text. *ids: caller
 * frees with free(); *n their count; *audio_at where the pad run starts (for anna_media_ref).
 * ANNA_EFORMAT when t's <|audio_pad|> is not the model's audio_token_id; ANNA_EUNSUPPORTED
 * when m has no audio encoder or md is not audio. */
int anna_asr_prompt(const anna_model *m, const anna_text *t, const anna_media *md, const char *context,
                    const char *language, int32_t **ids, size_t *n, int32_t *audio_at, char *err,
                    size_t errlen);
/* Splits the generated text (special tokens kept, end-of-generation ids dropped) of an
 * unforced prompt: "language English<asr_text>hello" -> *transcript_at = offset of "hello",
 * language "English" copied into lang[cap] (may be NULL). Text without <asr_text> (no speech:
 * "language None", or a model that did not follow the format) is all transcript: offset 0 and
 * lang "". Returns the offset. */
size_t anna_asr_output_split(const char *text, size_t len, char *lang, size_t cap);

/* (API 1.9) Long audio as qwen-asr's transcribe cuts it (its split_audio_into_chunks): data
 * is decoded as by anna_media_audio_decode, and the 16 kHz clip, when longer than
 * chunk_seconds (<= 0: qwen-asr's 1200 s), is cut into pieces of at most chunk_seconds, each
 * cut at the quietest sample of the quietest 100-ms window within 5 s of it; pieces under
 * 0.5 s are zero-padded to 0.5 s. A clip within the length is one piece, the same media
 * anna_media_audio_decode makes. The pieces tile the clip (no overlap, no gap), so their
 * transcripts join without repeated words (anna_asr_transcript_join). *out: *n_out media
 * (caller frees each with anna_media_free, then the array with free()); *offsets (may be NULL;
 * else caller frees with free()): where each piece starts, in seconds. Errors as
 * anna_media_audio_decode; chunk_seconds above 1e7: ANNA_EINVAL. */
int anna_media_audio_decode_chunks(anna_media ***out, double **offsets, int32_t *n_out,
                                   const anna_model *m, const void *data, size_t n,
                                   double max_seconds, double chunk_seconds, char *err,
                                   size_t errlen);
/* (API 1.9) One clip's transcript from its pieces' raw outputs raw[0..n) (the generated text
 * with special tokens kept and end-of-generation ids dropped, in piece order), as qwen-asr's
 * parse_asr_output and join do: each stripped of white space, runs repeated more than 20
 * times collapsed, split at <asr_text> (unless forced: a forced language makes it all text),
 * then concatenated with nothing between; the detected languages merged in order without
 * consecutive repeats, comma-separated ("" when none, or forced). *text and *language: caller
 * frees with free(). Returns 0 or ANNA_ENOMEM. */
int anna_asr_transcript_join(const char *const *raw, int32_t n, int forced, char **text,
                             char **language, char *err, size_t errlen);

/* ---- Speech synthesis (text to speech; API 1.3) ----------------------------------------
 * A Qwen3-TTS CustomVoice folder (config.json model_type "qwen3_tts", its speech_tokenizer/
 * and a tokenizer.json) opened as an anna_speech: the talker makes codec frames (12.5 per
 * second, 16 codes each) and the codec's exact streaming decoder turns them into 24 kHz mono
 * float PCM, which reaches the caller in chunks while the talker still runs: the first chunk
 * leaves after first_chunk_frames frames, not after the utterance. Chunks concatenated are the
 * one-pass decode of the same frames: bit-identical when every chunk is a multiple of the
 * codec's 16-frame step (the defaults), otherwise within the codec's streaming bound (1e-3 with
 * SIMD kernels whose rounding depends on the row count; 1.8e-4 measured for 1 + 3 + 3 ... frames).
 * Device (API 1.12; before: CPU only): the talker, its code predictor and the codec run on
 * anna_speech_options.device (one device; tuning encoder_cpu=1 keeps them on the CPU); the
 * talker's backend is made at the first request and kept. One thread drives an anna_speech at a time (callers
 * serialize synthesize calls); the model is read-only while it runs.
 * Instructions (API 1.9): a VoiceDesign folder (tts_model_type "voice_design", no preset
 * voices) or a 1.7B CustomVoice folder takes a natural-language description of the voice and
 * style, prepended to the prompt as qwen-tts does; a 0.6B CustomVoice refuses them
 * (ANNA_EINVAL: qwen-tts silently drops them). Speed (API 1.9): the PCM is time-stretched
 * without a pitch change by FFmpeg's atempo filter (libavfilter), chunk by chunk.
 * Voice cloning (API 1.9): a Base folder speaks with the x-vector of a reference clip
 * (anna_speech_clone_embed) in place of a preset voice, as qwen-tts' x_vector_only_mode does.
 * Not supported: in-context cloning (the clip's codes and transcript in the prompt). */
typedef struct anna_speech anna_speech;

typedef struct anna_speech_options {
  const char *device;    /* NULL / "cpu", "cuda", "cuda:N", "auto" (API 1.12: devices other than cpu) */
  int n_threads;         /* <= 0: 2 */
  const char *codec_dir; /* NULL: <dir>/speech_tokenizer */
  const char *tokenizer; /* NULL: <dir>/tokenizer.json; absent file: only text_ids requests work */
  int max_frames;        /* most frames one utterance may have (<= 0: 2048, 164 s) */
  const char *tuning;    /* "k=v,..." applied after the environment's ANNA_TUNING */
} anna_speech_options;

/* 1 when path is a folder whose config.json says model_type "qwen3_tts", else 0 (never fails). */
int anna_speech_probe(const char *path);
/* Loads the talker, the codec decoder and the tokenizer. Caller frees with anna_speech_free. */
int anna_speech_load(anna_speech **out, const char *dir, const anna_speech_options *opt, char *err,
                     size_t errlen);
void anna_speech_free(anna_speech *s);
int anna_speech_sample_rate(const anna_speech *s);   /* 24000 */
int anna_speech_frame_samples(const anna_speech *s); /* PCM samples per codec frame (1920) */
/* e.g. "qwen3_tts: talker 28 layers, ...; codec ...". Borrowed. */
const char *anna_speech_describe(const anna_speech *s);
/* Preset voice i (the checkpoint's speakers, lower case; borrowed), NULL past the last (at
 * once for a VoiceDesign folder, which has none). */
const char *anna_speech_voice(const anna_speech *s, int i);
/* (API 1.9) 0 when anna_speech_request.speed = speed can be served: 0 or 1, or in [0.25, 4.0]
 * (else ANNA_EINVAL naming the range) with libavfilter built in (else ANNA_EUNSUPPORTED naming
 * libavfilter-dev). */
int anna_speech_speed_check(double speed, char *err, size_t errlen);
/* (API 1.9) 1 when the checkpoint takes instructions (VoiceDesign; CustomVoice but the 0.6B). */
int anna_speech_takes_instructions(const anna_speech *s);
/* (API 1.9) Voice cloning with a Base folder (tts_model_type "base", its speaker encoder): the
 * width of a voice's x-vector (the talker's hidden size), 0 for other folders. */
int anna_speech_clone_dim(const anna_speech *s);
#define ANNA_SPEECH_CLONE_MAX_SECONDS 60.0 /* a longer reference clip is refused */
/* (API 1.9) The x-vector of a reference clip (an encoded file data[0..n): WAV, FLAC, OGG,
 * MP3 as anna_media_audio_decode reads; channels averaged and resampled to 24 kHz as qwen-tts
 * loads it) into out[anna_speech_clone_dim(s)], for anna_speech_request.voice_embed (qwen-tts'
 * x_vector_only_mode; in-context cloning with the clip's transcript is not implemented).
 * ANNA_EUNSUPPORTED without a speaker encoder; ANNA_EINVAL for bad, empty, too short or over
 * 60-s audio (named). Thread-safe with synthesis (the encoder is read-only). */
int anna_speech_clone_embed(const anna_speech *s, const void *data, size_t n, float *out, char *err,
                            size_t errlen);

typedef struct anna_speech_request {
  const char *text;         /* UTF-8, non-empty; ignored when text_ids is given */
  const int32_t *text_ids;  /* ids of `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n` */
  int n_text_ids;
  const char *voice;        /* a preset voice (case-insensitive); NULL or "": none */
  const char *language;     /* a language the checkpoint names, or NULL / "auto" */
  const char *instructions; /* NULL or "": none; else the voice / style description (see above) */
  int max_frames;           /* <= 0 or above the options' max_frames: the options' */
  int greedy;               /* 1: argmax codes; 0: sampling as generation_config.json says */
  uint64_t seed;            /* sampling seed */
  int first_chunk_frames;   /* frames decoded for the first chunk (<= 0: chunk_frames) */
  int chunk_frames;         /* frames per later chunk (<= 0: 16) */
  /* Optional: each frame's 16 codes as the talker picks them (borrowed for the call). */
  void (*on_frame)(void *user, const int32_t *codes, int n_codes, int frame);
  /* (API 1.9) ids of `<|im_start|>user\n{instructions}<|im_end|>\n`, used instead of
   * tokenizing `instructions` (NULL / 0: none) */
  const int32_t *instruct_ids;
  int n_instruct_ids;
  /* (API 1.9) playback speed: 0 or 1: unchanged; else in [0.25, 4.0] (ANNA_EINVAL naming the
   * range), applied with libavfilter's atempo (ANNA_EUNSUPPORTED in a build without it). The
   * chunks then carry about n / speed samples; stats.n_samples counts what was delivered. */
  double speed;
  /* (API 1.9) a cloned voice: anna_speech_clone_embed's x-vector (borrowed; a Base folder
   * needs it, others refuse it; not with `voice`) */
  const float *voice_embed;
} anna_speech_request;

/* Receives pcm[0, n) (borrowed for the call: copy what you keep). A nonzero return stops the
 * synthesis: anna_speech_synthesize then returns 0 with stats.stopped = 1. */
typedef int (*anna_speech_chunk_fn)(void *user, const float *pcm, int64_t n);

typedef struct anna_speech_stats {
  int n_text_tokens;   /* ids of the wrapped text */
  int n_frames;        /* codec frames made */
  int64_t n_samples;   /* PCM samples delivered */
  int stopped;         /* 1 when the callback stopped it */
  double first_chunk_s; /* call start -> first chunk handed over */
  double talker_s, codec_s, total_s;
} anna_speech_stats;

/* Synthesizes rq, calling fn(user, ...) per chunk in order; st (may be NULL) gets the
 * counters. ANNA_EINVAL names a bad field (empty text, unknown voice or language: the message
 * lists the valid ones); ANNA_EUNSUPPORTED: instructions; ANNA_ERANGE: the text needs more
 * positions than max_frames leaves. Allocates per call (the talker's state is sized to the
 * text), nothing per frame. */
int anna_speech_synthesize(anna_speech *s, const anna_speech_request *rq, anna_speech_chunk_fn fn, void *user,
                           anna_speech_stats *st, char *err, size_t errlen);

/* ---- Audio encoding (API 1.3) -----------------------------------------------------------
 * Mono float PCM in [-1, 1] -> an audio format, with libsndfile: "wav" (16-bit PCM), "pcm"
 * (raw 16-bit signed little-endian), "flac" (16-bit), "opus" (Ogg Opus), "mp3" (MPEG layer
 * III, libsndfile's LAME support). Others ("aac", ...): ANNA_EUNSUPPORTED. A file encoder
 * writes exact headers; a stream encoder hands bytes to fn as they are produced and never
 * revisits them, so fields only known at the end stay "unknown": a streamed wav says
 * 0xFFFFFFFF for the RIFF and data sizes (read to end of stream), a streamed flac has 0 total
 * samples and no MD5 (both mean unknown in FLAC), a streamed mp3 has no Xing/LAME tag. */
typedef struct anna_audio_encoder anna_audio_encoder;
/* Receives bytes[0, n) (borrowed for the call); nonzero return: the write fails (ANNA_EIO). */
typedef int (*anna_bytes_fn)(void *user, const void *bytes, size_t n);

/* 0 when format can be encoded in this build, else ANNA_EUNSUPPORTED naming what is missing. */
int anna_audio_format_check(const char *format, char *err, size_t errlen);
/* The HTTP Content-Type of a format ("audio/wav", ...), NULL for an unknown one. Static. */
const char *anna_audio_format_mime(const char *format);
/* Caller frees with anna_audio_encoder_free (after anna_audio_encoder_finish, or to abandon). */
int anna_audio_encoder_file(anna_audio_encoder **out, const char *format, int sample_rate, const char *path,
                            char *err, size_t errlen);
int anna_audio_encoder_stream(anna_audio_encoder **out, const char *format, int sample_rate, anna_bytes_fn fn,
                              void *user, char *err, size_t errlen);
int anna_audio_encoder_write(anna_audio_encoder *e, const float *pcm, int64_t n, char *err, size_t errlen);
/* Flushes the encoder's tail (and, for a file, rewrites its header); call once. */
int anna_audio_encoder_finish(anna_audio_encoder *e, char *err, size_t errlen);
void anna_audio_encoder_free(anna_audio_encoder *e);

#ifdef __cplusplus
}
#endif
#endif
