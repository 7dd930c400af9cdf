/* kv_cache_internal.h: the kv_cache struct and the helpers its files share (kv_cache.c:
 * creation, tables, sequences, plans; prefix_index.c: the hash index and block allocation;
 * state_snap.c: recurrent-state slots). Included by the .c files of src/cache only.
 */
#ifndef ANNA_CACHE_KV_CACHE_INTERNAL_H
#define ANNA_CACHE_KV_CACHE_INTERNAL_H

#include "cache/kv_cache.h"

/* One KV block: block_len positions of every attention layer that owns a cache. */
typedef struct kv_blk {
  int32_t ref;     /* sequences whose block table holds it */
  int32_t cached;  /* in the prefix index (full, tokens known); kept after ref drops to 0 */
  uint64_t hash;   /* chain hash: kv_block_hash(parent, its tokens) */
  uint64_t parent; /* chain hash of the block before it (0 for the first) */
  uint64_t tick;   /* when ref last dropped to 0: eviction is least recently used first */
  int32_t fill;    /* cached positions: block_len, or fewer for the partial last block a
                      finished sequence left (keyed by kv_partial_hash) */
} kv_blk;

/* A recurrent-state slot (conv + delta-rule state of every state layer). Tagged by (seq, pos)
 * for the checkpoint/rewind/copy API, and/or by the chain hash of the block ending at pos (a
 * prefix snapshot), which outlives the sequence. */
typedef struct kv_slot {
  int seq; /* -1: no sequence tag */
  int32_t pos;
  int hashed; /* 1: hash identifies the prefix whose state this is */
  uint64_t hash;
  uint64_t tick;
  float **conv, **ssm; /* [layer] (NULL for other layers) */
} kv_slot;

/* Most distinct backends one cache places layers on (pipeline stages). */
#define KV_MAX_BACKENDS 16

struct kv_cache {
  ops_backend *be; /* the default backend (layers without kv_cache_options.layer_be) */
  ops_backend **lbe; /* [layer] the backend holding that layer's pool, rings and state */
  ops_backend **obe; /* [oi] the backend of owner oi's pool and rings */
  ops_backend **alloc_be; /* [n_allocs] which backend each allocation came from */
  /* The block tables in each distinct backend's memory (kv_cache_attn_rows hands a layer
   * the copy on its own backend): tb_d[i] on tb_be[i]; ltb[layer] = i. */
  int n_tb;
  ops_backend *tb_be[KV_MAX_BACKENDS];
  void **tb_d[KV_MAX_BACKENDS];
  int *ltb;
  int n_seq, n_ctx, n_batch, n_layers;
  int32_t n_vocab;
  int kv_type;
  uint8_t *is_state;   /* [layer] 1: recurrent-state layer */
  int64_t conv_floats, ssm_floats;
  int has_state, n_state, n_ckpt;
  kv_slot *ckpt;       /* [n_ckpt] */
  int32_t *win_n;      /* [n_seq] kv_cache_window: the next plan saves the sequence's state
                          after each of its first win_n tokens (0: none) */
  int32_t win_slots;   /* checkpoint slots the pending windows were promised */
  const int32_t *next_keys; /* kv_cache_next_keys: borrowed for the next plan only (NULL: tokens) */
  uint64_t tick;
  /* Paged KV: one pool of n_blocks blocks per layer that owns a cache (own index oi), all
   * indexed by the same block ids. */
  int block_len, bshift, max_bps, n_own;
  int64_t n_blocks;
  int *own_idx;               /* [layer] -> oi of the layer whose cache it reads (-1: none) */
  uint8_t *owns;              /* [layer] 1: the layer writes pool own_idx[layer] */
  uint8_t **pool_k, **pool_v; /* [oi] */
  int64_t *blk_bytes;         /* [oi] bytes of one block */
  int64_t *row_bytes;         /* [oi] bytes of one position row */
  int64_t *row_floats;        /* [oi] floats of one f32 (ring) row: n_kv_heads * head_dim */
  kv_blk *blk;                /* [n_blocks] */
  int32_t *blk_tok;           /* [n_blocks][block_len] tokens of cached blocks (exact match) */
  int32_t *free_ids;          /* stack of free block ids */
  int64_t n_free;
  int32_t *hidx;              /* open-addressing index chain hash -> block id (-1 empty) */
  int64_t hcap;
  int32_t *tab_id;            /* [seq][max_bps] block ids, -1: none */
  int32_t *nblk;              /* [seq] entries of tab_id in use */
  void **tab_h;               /* host mirror of tb_d: [seq][oi][K, V][max_bps] block bases */
  uint8_t *tab_dirty;         /* [seq] */
  int32_t *stok;              /* [seq][n_ctx] tokens behind each sequence's positions */
  uint64_t *bhash;            /* [seq][max_bps] chain hash of each full block */
  uint8_t *share;             /* [seq] 0: private; 1: attached (reuses); 2: also registers */
  int32_t *cand;              /* [max_bps] attach scratch */
  int share_enabled;
  anna_kv_stats st;
  /* --kv-cache-residual-len: per (oi, seq) f32 ring of ring_len rows (quantized caches) */
  int resid, ring_len;
  float **ring_k, **ring_v;   /* [oi * n_seq + s] */
  float **conv, **ssm;        /* [layer * n_seq + s] live recurrent state */
  int32_t *len;               /* [n_seq] */
  /* plan and per-layer row arrays ([n_batch] each) */
  int32_t *run_start, *run_len, *run_seq, *run_cut0, *run_ncut, *cut_at, *cut_slot;
  int snap_every; /* tokens between snapshots inside a run (0: only the last boundary) */
  const void **kp, **vp;
  void **wk, **wv;
  float **wrk, **wrv;
  const float **rkp, **rvp;
  void **allocs, **hallocs;
  size_t n_allocs, n_hallocs;
};

/* prefix_index.c */
uint64_t kv_block_hash(uint64_t parent, const int32_t *t, int n);
uint64_t kv_partial_hash(uint64_t parent, const int32_t *t, int n);
int32_t kv_index_find(const kv_cache *c, uint64_t hash, uint64_t parent, const int32_t *tok, int n);
void kv_index_insert(kv_cache *c, int32_t b);
void kv_index_remove(kv_cache *c, int32_t b);
int32_t kv_blk_alloc(kv_cache *c);
void kv_blk_unref(kv_cache *c, int32_t b);

/* state_snap.c */
kv_slot *kv_slot_find(kv_cache *c, int seq, int32_t pos);
kv_slot *kv_snap_find(kv_cache *c, uint64_t hash);
kv_slot *kv_slot_pick(kv_cache *c);
void kv_slot_invalidate(kv_cache *c, int seq, int32_t n);
void kv_state_copy(kv_cache *c, float **dconv, float **dssm, int dstride, float **sconv, float **sssm, int sstride);
int kv_state_source(kv_cache *c, int src, int32_t n, float ***conv, float ***ssm, int *stride, char *err,
                    size_t errlen);

#endif
