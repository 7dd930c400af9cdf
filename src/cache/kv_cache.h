/* kv_cache.h: the state a model keeps per sequence between forward passes, and its
 * bookkeeping. The forward pass asks it for a plan and for pointers; it knows nothing of
 * hashing, sharing or eviction.
 *
 * What a kv_cache owns (all allocated once by kv_cache_create, in the backend's memory
 * through the ops_backend table, plus host bookkeeping):
 * - the paged KV pool: one pool of n_blocks blocks (block_len positions each) per attention
 *   layer that owns a cache, all indexed by the same block ids; layers that read another
 *   layer's cache (KV sharing) use that layer's pool;
 * - per-sequence block tables: a host mirror and a copy in backend memory that the
 *   attention op reads (ops_attn_args.k_blocks), uploaded by kv_cache_plan when it changed;
 * - the prefix index: full blocks keyed by a hash chain of their tokens (tokens compared on
 *   lookup, so a collision never maps a wrong block), reference counts, copy on write, and
 *   least-recently-released eviction of cached blocks nobody references;
 * - recurrent state (conv + delta-rule state per (state layer, sequence)) and a bounded
 *   LRU pool of n_ckpt slots holding checkpoints (seq, pos) and prefix snapshots (hash);
 * - the residual f32 ring per (owner layer, sequence) of quantized caches.
 *
 * A decode step is: kv_cache_plan (validates the batch, makes every written position
 * writable, hashes completed blocks, picks snapshot slots, uploads dirty tables, zeroes
 * the recurrent state of fresh sequences: the only step that can fail, and it fails before
 * any KV row is written), the forward pass (kv_cache_attn_rows per attention layer,
 * kv_cache_conv/ssm and the plan's cuts per state layer), then kv_cache_commit (advances
 * the lengths, registers full blocks). Nothing here allocates after creation.
 *
 * Included by src/model (forward.c) and tests only. Not thread-safe: one owner thread.
 */
#ifndef ANNA_CACHE_KV_CACHE_H
#define ANNA_CACHE_KV_CACHE_H

#include "anna/anna.h"
#include "ops/ops.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kv_cache kv_cache;

/* What a layer keeps per sequence. */
enum kv_layer_kind {
  KV_LAYER_NONE = 0, /* nothing */
  KV_LAYER_ATTN,     /* attention: KV rows in the pool of layer kv_source */
  KV_LAYER_STATE,    /* recurrent (Gated DeltaNet): conv + delta-rule state */
};

typedef struct kv_cache_layer {
  int kind;       /* kv_layer_kind */
  int kv_source;  /* KV_LAYER_ATTN: the layer whose cache it reads (itself: it owns one;
                     else an earlier owner) */
  int n_kv_heads; /* owners: shape of one position row */
  int head_dim;
} kv_cache_layer;

typedef struct kv_cache_options {
  int n_seq, n_ctx, n_batch; /* sequences, positions per sequence, most tokens per plan */
  int32_t n_vocab;           /* token ids in a batch must lie in [0, n_vocab) */
  int n_layers;
  const kv_cache_layer *layers;    /* [n_layers], read during create only */
  int64_t conv_floats, ssm_floats; /* recurrent state of one state layer and sequence */
  int kv_type;                     /* ops_kv_type of every attention cache */
  int block_len;    /* positions per block (power of two in 16..4096; 0: 64 = the GDN chunk) */
  int64_t n_blocks; /* blocks in the pool (0: n_seq * ceil(n_ctx / block_len)) */
  int residual_len; /* quantized caches: newest positions also kept in f32 (0: none) */
  int prefix_share; /* 1: prefix pool on (attach reuses, registers); 0: attach reuses nothing */
  int snapshot_interval; /* state snapshots every N tokens inside a run (rounded up to blocks;
                            0: only at the last block boundary each run reaches) */
  int n_ckpt;       /* checkpoint / snapshot slots (used only with state layers) */
  /* Pipeline stages: [n_layers] the backend that holds each layer's pool, residual rings and
   * recurrent state (its stage's); NULL (or a NULL entry): the cache's be. Block tables are
   * kept on each distinct backend (at most 16). A layer that reads another layer's cache (KV
   * sharing) reads the pool where its owner placed it: the same memory on the CPU or one
   * device; across devices that needs peer access. Borrowed for the create call; the
   * backends must outlive the cache. */
  ops_backend *const *layer_be;
} kv_cache_options;

/* Caller frees with kv_cache_free. be is borrowed and must outlive the cache. Errors:
 * ANNA_EINVAL (sizes), ANNA_EUNSUPPORTED (head dims or backend unfit for kv_type),
 * ANNA_ENOMEM. */
int kv_cache_create(kv_cache **out, ops_backend *be, const kv_cache_options *o, char *err, size_t errlen);
void kv_cache_free(kv_cache *c);

/* kv_cache_quantization option string (NULL, "none", "auto", "f16", "q8", "q4",
 * "turboquant" with bits 2..4; bits 0 means 4) -> ops_kv_type. ANNA_EINVAL otherwise. */
int kv_cache_type_from_name(const char *name, int bits, int *type, char *err, size_t errlen);

/* Short name of an ops_kv_type ("f32", "f16", "q8", "q4", "turboquant2".."turboquant4";
 * "unknown" otherwise): static storage. */
const char *kv_cache_type_name(int type);

/* The rule of kv_cache_quantization "auto": the least lossy format whose cache fits `budget`
 * bytes, in the order of bits per value: f32, f16, q8, q4, turboquant 4, 3, 2 bits. need[t]: the bytes the cache
 * (pool + residual rings) takes in format t, <= 0 where t cannot be used (backend, head
 * dims). When none fits, the most compact usable one (its allocation then reports what
 * does not fit); budget < 0 (unknown: the CPU) gives f32. A pure function. */
int kv_cache_auto_type(int64_t budget, const int64_t need[OPS_KV_TQ4 + 1]);

/* Bytes of KV cache per token of one sequence (all owner layers, K and V). */
int64_t kv_cache_bytes_per_token(const kv_cache *c);
/* Backend bytes placed for layer l: its pool and rings when it owns a cache, its recurrent
 * state (live and checkpoint slots) when it is a state layer; 0 otherwise or out of range. */
int64_t kv_cache_layer_bytes(const kv_cache *c, int l);
/* Pool accounting and prefix-pool counters. */
void kv_cache_stats(const kv_cache *c, anna_kv_stats *st);

int32_t kv_cache_seq_len(const kv_cache *c, int seq); /* -1: seq out of range */
/* Empties seq: its blocks go back to the pool (registered ones stay cached until evicted);
 * a registering sequence's partial last block (and, with state layers, its end state) is
 * kept for the next turn. */
void kv_cache_seq_reset(kv_cache *c, int seq);
/* Saves seq's recurrent state at its current length (LRU slot); no-op without state layers. */
int kv_cache_checkpoint(kv_cache *c, int seq, char *err, size_t errlen);
/* seq keeps its first n positions (n: its length, or a checkpointed position). */
int kv_cache_seq_rewind(kv_cache *c, int seq, int32_t n, char *err, size_t errlen);
/* Verify windows: the next kv_cache_plan (only that one) also saves seq's recurrent state
 * after each of the first n tokens of its run (positions len + 1 .. len + n) into checkpoint
 * slots tagged (seq, position), so kv_cache_seq_rewind to any of them restores it without
 * recomputing. Several sequences may ask before one plan. Returns n when it will, 0 when it
 * need not or cannot: no state layers, or the slots run short: each window is promised
 * n + 3 (its own, a checkpoint the caller took before it, and up to two block-boundary
 * snapshots its run may take, so none evicts another). */
int32_t kv_cache_window(kv_cache *c, int seq, int32_t n);
/* dst becomes the first n positions of src: blocks shared (copy on write), state and ring
 * copied. */
int kv_cache_seq_copy(kv_cache *c, int dst, int src, int32_t n, char *err, size_t errlen);
/* Empties seq, then maps the longest cached prefix of tokens[0, n) into it: whole blocks of
 * the hash chain (shared, ref counted); with state layers only up to the longest prefix
 * with a snapshot, which is restored (a partial block a finished sequence left counts, at
 * exactly its length); attention-only, then also the longest common token prefix of any
 * cached block that follows the matched chain. Nothing with prefix_share off or a residual
 * ring. register_blocks: seq's full blocks enter the index as they fill. Returns the reused
 * length (>= 0), or ANNA_ERANGE for a bad seq. */
int32_t kv_cache_prefix_attach(kv_cache *c, int seq, const int32_t *tokens, int32_t n, int register_blocks);

/* Block accounting for a scheduler (anna_context_seq_blocks_needed / _held):
 * needed: the blocks kv_cache_plan takes from the pool (free or evicted) for seq's next n
 *   positions, planned alone: fresh blocks past its table, plus a copy of each block those
 *   positions write that another sequence or the prefix index also holds (copy on write).
 *   In one batch, sequences sharing a block may need one copy fewer than the sum (the last
 *   writer finds the block its own).
 * held: the blocks only seq references: what kv_cache_seq_reset returns to the pool as
 *   free or evictable (blocks it shares stay with their other holders).
 * ANNA_ERANGE for a bad seq. */
int64_t kv_cache_seq_blocks_needed(const kv_cache *c, int seq, int32_t n);
int64_t kv_cache_seq_blocks_held(const kv_cache *c, int seq);

/* A batch split into runs of consecutive tokens of one sequence. Arrays belong to the cache
 * and stay valid until the next kv_cache_plan. */
typedef struct kv_plan {
  int n_runs;
  const int32_t *run_start, *run_len, *run_seq; /* [n_runs] batch tokens [start, start + len)
                                                   are seq's next positions */
  /* Recurrent-state snapshots: run ri stops at run_ncut[ri] points, cut_at[run_cut0[ri] + i]
   * tokens into the run (ascending), and the state there is saved into slot
   * cut_slot[run_cut0[ri] + i] (kv_cache_slot_conv / _ssm). */
  const int32_t *run_cut0, *run_ncut;
  const int32_t *cut_at, *cut_slot;
} kv_plan;

/* The next kv_cache_plan (only that one) keys the prefix index with keys[b->n] instead of the
 * batch's tokens: what the hash chain hashes and a lookup compares for those positions. A
 * prompt with images passes its pad rows as image-content keys (negative: never a token id), so
 * blocks holding two different images never match, and the same image + text does (the caller
 * attaches with the same keys). keys borrowed until that plan returns; NULL: the tokens. */
void kv_cache_next_keys(kv_cache *c, const int32_t *keys);
/* Plans batch b (see anna_batch; logits flags unused). Checks sizes, token ids, sequences
 * (runs consecutive) and positions (each continues its sequence, < n_ctx); ANNA_ERANGE "KV
 * cache full" when no block is left. On success the written positions are writable. */
int kv_cache_plan(kv_cache *c, const anna_batch *b, kv_plan *p, char *err, size_t errlen);
/* After the forward pass of the planned batch: lengths advance, full blocks of registering
 * sequences enter the prefix index. */
void kv_cache_commit(kv_cache *c, const kv_plan *p);

/* What one attention layer's op needs for the planned batch. Host arrays of backend
 * pointers, owned by the cache, valid until the next call. */
typedef struct kv_attn_rows {
  int kv_type, block_len, residual_len, ring_len;
  int64_t row_bytes;         /* bytes of one position (ops_attn_args.kv_row_bytes) */
  int owns;                  /* 1: the layer writes (wk/wv and the rings set) */
  void **wk, **wv;           /* [n] pool rows the tokens write */
  float **wrk, **wrv;        /* [n] ring rows the tokens write (residual_len > 0) */
  const void **kp, **vp;     /* [n] the token's sequence's block table (k_blocks/v_blocks) */
  const float **rkp, **rvp;  /* [n] the sequence's ring (residual_len > 0) */
} kv_attn_rows;
void kv_cache_attn_rows(kv_cache *c, const anna_batch *b, int layer, kv_attn_rows *out);

/* Live recurrent state of (state layer, seq), and of a snapshot slot; backend memory,
 * borrowed. */
float *kv_cache_conv(const kv_cache *c, int layer, int seq);
float *kv_cache_ssm(const kv_cache *c, int layer, int seq);
float *kv_cache_slot_conv(const kv_cache *c, int slot, int layer);
float *kv_cache_slot_ssm(const kv_cache *c, int slot, int layer);

#endif
