/* forward.h: the one forward pass, for every architecture, over a batch of tokens from
 * several sequences, written against ops.h.
 *
 * fwd_state holds the per-sequence state (a kv_cache, src/cache/kv_cache.h: KV blocks of
 * attention layers, conv and recurrent state of GDN layers, lengths, the prefix pool) and
 * the activation scratch, all allocated once by fwd_state_create for (n_seq, n_ctx,
 * n_batch): forward_batch allocates nothing. The fwd_state_* state functions below are
 * delegations to the cache, kept for the text decoder kind (text_decoder.c).
 */
#ifndef ANNA_MODEL_FORWARD_H
#define ANNA_MODEL_FORWARD_H

#include "anna/anna.h"
#include "model/kind.h"
#include "model/model.h"
#include "ops/ops.h"

typedef struct fwd_state fwd_state;

/* Shape of the state beyond (n_seq, n_ctx, n_batch). Zeros mean defaults. */
typedef struct fwd_state_options {
  int n_ckpt;       /* recurrent-state checkpoint / prefix-snapshot slots (GDN models only) */
  int kv_type;      /* ops_kv_type of the attention caches */
  int block_len;    /* positions per KV block (power of two >= 16; default 64 = the GDN chunk) */
  int64_t n_blocks; /* KV blocks in the pool (default n_seq * ceil(n_ctx / block_len)) */
  int residual_len; /* quantized caches: newest positions also kept in f32 (0: none) */
  int prefix_share; /* 1: prefix pool on (attach reuses, registers); 0: attach reuses nothing */
  int snapshot_interval; /* GDN snapshots every N tokens inside a call (rounded up to blocks;
                            0: only at the last block boundary each call reaches) */
  /* Pipeline stages (layer split): stage i runs stage_layers[i] consecutive layers on
   * stage_be[i] and holds their KV / recurrent state and activation scratch there; stage 0
   * (stage_be[0] must be the be given to fwd_state_create) also embeds, the last stage runs
   * the final norm, lm_head and candidates. The hidden state (and a pending residual, and
   * Gemma4's per-layer inputs) crosses each boundary through host memory. n_stages 0 or 1:
   * every layer on be. Arrays borrowed for the create call; the backends must outlive the
   * state. Counts must be >= 1 and sum to the model's layers (ANNA_EINVAL). */
  int n_stages;
  ops_backend *const *stage_be;
  const int *stage_layers;
  /* Tensor parallelism (model/shard.h): this state runs shard tp_rank of a model split over
   * several states that run the same batch concurrently; tp_all_reduce (NULL: no split) sums
   * buf [count floats, in be's memory] over every shard in place, blocking until all have
   * called it (runtime/tp.h), after each o_proj / GDN out_proj and each MLP / MoE down_proj.
   * A shard of rank > 0 stops after the layers (no final norm, logits or candidates: rank 0
   * returns them). Not with pipeline stages. */
  int tp_rank;
  void (*tp_all_reduce)(void *ctx, int rank, ops_backend *be, float *buf, int64_t count);
  void *tp_ctx;
} fwd_state_options;

/* KV pool accounting and prefix-pool counters: the public struct. */
typedef anna_kv_stats fwd_kv_stats;

/* Caller frees with fwd_state_free. */
/* be is borrowed: state and scratch live in its memory; it must outlive the state. */
int fwd_state_create(fwd_state **out, const text_model *m, ops_backend *be, int n_seq, int n_ctx, int n_batch,
                     const fwd_state_options *o, char *err, size_t errlen);
/* Bytes of KV cache per token of one sequence (all attention layers, K and V). */
int64_t fwd_state_kv_bytes_per_token(const fwd_state *s);
void fwd_state_kv_stats(const fwd_state *s, fwd_kv_stats *st);
/* Backend bytes of layer l's KV pool / recurrent state (kv_cache_layer_bytes). */
int64_t fwd_state_layer_bytes(const fwd_state *s, int l);
void fwd_state_free(fwd_state *s);

int32_t fwd_state_seq_len(const fwd_state *s, int seq);
/* Empties seq: its blocks go back to the pool (registered ones stay cached until evicted). */
void fwd_state_seq_reset(fwd_state *s, int seq);

/* Prefix reuse. Attention KV can be cut at any position; recurrent (GDN) state only where
 * it was saved: fwd_state_checkpoint saves seq's state at its current length (into the
 * least recently used slot when the pool is full); rewind and copy then accept that
 * position, or the source's current length. Models without GDN layers need no checkpoint.
 *   rewind: seq keeps its first n positions.
 *   copy:   dst becomes the first n positions of src: KV blocks are shared (copy on write),
 *           recurrent state copied. */
int fwd_state_checkpoint(fwd_state *s, int seq, char *err, size_t errlen);
int fwd_state_seq_rewind(fwd_state *s, int seq, int32_t n, char *err, size_t errlen);
int fwd_state_seq_copy(fwd_state *s, int dst, int src, int32_t n, char *err, size_t errlen);
/* The next forward pass saves seq's recurrent state after each of its first n tokens
 * (kv_cache_window: verify windows); returns n when it will, else 0. */
int32_t fwd_state_window(fwd_state *s, int seq, int32_t n);

/* Block accounting (anna_context_seq_blocks_needed / _held; kv_cache.h documents them). */
int64_t fwd_state_seq_blocks_needed(const fwd_state *s, int seq, int32_t n);
int64_t fwd_state_seq_blocks_held(const fwd_state *s, int seq);

/* Prefix pool (anna_context_prefix_attach): empties seq, then maps the longest cached
 * block-aligned prefix of tokens[0, n) into it (blocks shared; for GDN models only up to
 * the longest prefix with a state snapshot, which is restored). register_blocks: seq's
 * full blocks enter the pool as they fill. Returns the reused length (>= 0). */
int32_t fwd_state_prefix_attach(fwd_state *s, int seq, const int32_t *tokens, int32_t n, int register_blocks);

/* Sampling candidates instead of logits: per flagged row r, the backend's topk op (ops.h) at k
 * and temp, written to host arrays idx/val[r * k + j] and stats[2r .. 2r+1]. */
typedef struct fwd_topk {
  int k; /* 1 .. OPS_TOPK_MAX, <= vocab */
  float temp;
  int32_t *idx;
  float *val;
  double *stats;
} fwd_topk;

/* Runs the batch (see anna_batch) and writes logits of flagged tokens to out, or (tk not
 * NULL; out unused) their candidates to tk's arrays. */
int forward_batch(const text_model *m, ops_backend *be, fwd_state *s, const anna_batch *b, float *out,
                  const fwd_topk *tk, char *err, size_t errlen);
/* Multimodal extras of one call (Qwen3.5 images and video), host memory read during the call:
 * embedding rows that replace the token embeddings of some batch rows (the vision tower's
 * output over the image / video pad tokens), and 3-axis rotary positions. Positions in the
 * anna_batch stay the cache positions (causal order, KV slots); rope_pos only rotates q and k
 * (full-attention layers; GDN layers use no positions). */
typedef struct fwd_mm {
  const int32_t *rope_pos; /* [3 * n]: T positions of the n batch rows, then H, then W (NULL: pos) */
  const float *embd;       /* [n_embd, hidden] */
  const int32_t *embd_idx; /* [n_embd] the batch row each replaces (distinct, < n) */
  int64_t n_embd;
  /* Optional host [n_flagged, hidden]: receives the flagged rows' hidden states after the
   * final norm (what the lm_head reads). With out and tk both NULL the lm_head is skipped. */
  float *hidden;
  /* Optional [n]: the prefix index's keys of the batch rows instead of the tokens
   * (kv_cache_next_keys: image pads keyed by their image's content). */
  const int32_t *cache_keys;
} fwd_mm;

/* forward_batch with mm (NULL: forward_batch). rope_pos needs a model with mRoPE sections
 * (model_config.mrope_section; ANNA_EUNSUPPORTED otherwise); bad rows are ANNA_EINVAL. */
int forward_batch_mm(const text_model *m, ops_backend *be, fwd_state *s, const anna_batch *b, const fwd_mm *mm,
                     float *out, const fwd_topk *tk, char *err, size_t errlen);
/* Row `row` (in flagged order) of the logits the last forward_batch computed, to out[vocab]:
 * the full-row fallback after a candidates call. ANNA_ERANGE when that call left no such row. */
int fwd_state_logits_row(const fwd_state *s, int64_t row, float *out, char *err, size_t errlen);
/* Where the last forward_batch left its logits rows (model_rows in model/kind.h): the last
 * stage's backend and buffers, with scratch of FWD_SAMPLE_ROW_BYTES(vocab) per batch row. */
#define FWD_SAMPLE_ROW_BYTES(vocab) \
  ((size_t)(((vocab) + 63) / 64) * 8u + sizeof(ops_tail_req) + sizeof(ops_tail_out) + 16u)
void fwd_state_logits_rows(fwd_state *s, model_rows *out);

#endif
