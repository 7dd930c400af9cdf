/* forward.c: decoder forward pass for all supported families.
 *
 * Shape of one layer (pre-norm residual):
 *   h = x + [post_attn_norm](mixer(attn_norm(x)))        mixer: attention or Gated DeltaNet
 *   x = h + [post_ff_norm](ffn(pre_ff_norm(h)))           ffn: MLP, MoE, or both (Gemma4)
 *   Gemma4 then adds the per-layer-input term and multiplies by layer_scalar.
 * Projections run over the whole batch at once; what is per sequence (KV cache writes,
 * the conv and delta-rule recurrences) runs per run of consecutive same-sequence tokens.
 */
#include "model/forward.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Runs of recurrent GDN tokens at least this long use the chunked kernel. */
#define GDN_CHUNKED_MIN 8

/* One KV block: block_len positions of every attention layer that owns a cache. */
typedef struct kv_blk {
  int32_t ref;     /* sequences whose block table holds it */
  int32_t cached;  /* in the prefix index (full, tokens known); kept after ref drops to 0 */
  uint64_t hash;   /* chain hash: block_hash(parent, its tokens) */
  uint64_t parent; /* chain hash of the block before it (0 for the first) */
  uint64_t tick;   /* when ref last dropped to 0: eviction is least recently used first */
  int32_t fill;    /* cached positions: block_len, or fewer for the partial last block a
                      finished sequence left (keyed by partial_hash) */
} kv_blk;

struct fwd_state {
  ops_backend *be;     /* owns the backend allocations below */
  int n_seq, n_ctx, n_batch, n_layers;
  const model_config *cfg;
  /* Recurrent-state checkpoints (GDN conv + recurrent state of every GDN layer), a fixed
   * pool reused least recently used first. A slot is tagged by (seq, pos) for the
   * checkpoint/rewind/copy API, and/or by the chain hash of the block ending at pos (a
   * prefix-pool snapshot), which outlives the sequence. */
  int has_gdn, n_ckpt;
  struct fwd_ckpt {
    int seq;        /* -1: no sequence tag */
    int32_t pos;
    int hashed;     /* 1: hash identifies the prefix whose state this is */
    uint64_t hash;
    uint64_t tick;
    float **conv, **ssm; /* [layer] (NULL for non-GDN layers) */
  } *ckpt;
  uint64_t tick;
  int64_t wmax;
  int kv_type;        /* ops_kv_type of every attention layer's cache */
  /* Paged KV: one pool of n_blocks blocks per layer that owns a cache (own index oi), all
   * indexed by the same block ids. */
  int block_len, bshift, max_bps, n_own;
  int64_t n_blocks;
  int *own_idx;          /* [layer] -> oi of the layer whose cache it reads (-1: GDN) */
  uint8_t **pool_k, **pool_v; /* [oi] */
  int64_t *blk_bytes;    /* [oi] bytes of one block */
  kv_blk *blk;           /* [n_blocks] */
  int32_t *blk_tok;      /* [n_blocks][block_len] tokens of cached blocks (exact match) */
  int32_t *free_ids;     /* stack of free block ids */
  int64_t n_free;
  int32_t *hidx;         /* open-addressing index chain hash -> block id (-1 empty) */
  int64_t hcap;
  int32_t *tab_id;       /* [seq][max_bps] block ids, -1: none */
  int32_t *nblk;         /* [seq] entries of tab_id in use */
  void **tab_h;          /* host mirror of tab_d: [seq][oi][K, V][max_bps] block base pointers */
  void **tab_d;          /* the same in backend memory (what ops_attn_args points into) */
  uint8_t *tab_dirty;    /* [seq] */
  int32_t *stok;         /* [seq][n_ctx] tokens behind each sequence's positions */
  uint64_t *bhash;       /* [seq][max_bps] chain hash of each full block */
  uint8_t *share;        /* [seq] 0: private; 1: attached (reuses); 2: also registers its blocks */
  int32_t *cand;         /* [max_bps] attach scratch */
  int share_enabled;
  fwd_kv_stats st;
  /* --kv-cache-residual-len: per (oi, seq) f32 ring of ring_len rows (quantized caches) */
  int resid, ring_len;
  float **ring_k, **ring_v; /* [oi * n_seq + s] */
  const float **rkp, **rvp; /* [n] per-token ring bases */
  float **conv, **ssm; /* [layer * n_seq + s] */
  int32_t *len;       /* [n_seq] */
  /* backend scratch */
  float *x, *xn, *res, *buf[5], *ple, *moe_scratch, *logits_in, *logits;
  int32_t *moe_idx, *tokens, *pos;
  float *moe_w;
  /* sampling candidates (fwd_topk): one backend buffer [stats rows*2 doubles | idx rows*k | val
   * rows*k] so one download brings a step's candidates, and its host staging copy */
  void *tk_dev, *tk_host;
  int64_t last_nl; /* logits rows the last call left in s->logits (fwd_state_logits_row) */
  /* host */
  const void **kp, **vp;       /* [n] per-token table bases (attention reads) */
  void **wk, **wv;             /* [n] per-token row pointers (cache writes) */
  float **wrk, **wrv;          /* [n] per-token ring rows (cache writes) */
  int32_t *run_start, *run_len, *run_seq;
  /* GDN snapshots of this call: run ri cuts at run_cut0[ri] .. + run_ncut[ri] entries of
   * cut_at (tokens into the run, ascending) / cut_slot (ckpt slot to save into). */
  int32_t *run_cut0, *run_ncut, *cut_at, *cut_slot;
  int snap_every; /* tokens between snapshots inside a run (0: only the last boundary) */
  void **allocs, **hallocs;
  size_t n_allocs, n_hallocs;
};

/* Bytes per logits row of the candidate buffers: stats (2 doubles), idx and val of OPS_TOPK_MAX. */
#define FWD_TOPK_ROW_BYTES (2 * sizeof(double) + (size_t)OPS_TOPK_MAX * (sizeof(int32_t) + sizeof(float)))

/* Backend memory (state, activations), tracked for fwd_state_free. */
static void *salloc(fwd_state *s, size_t bytes, int *fail) {
  void *p = s->be->alloc(s->be, bytes ? bytes : 1);
  void **na = realloc(s->allocs, (s->n_allocs + 1) * sizeof *na);
  if (!p || !na) {
    if (p) s->be->free(s->be, p);
    if (na) s->allocs = na;
    *fail = 1;
    return NULL;
  }
  s->allocs = na;
  s->allocs[s->n_allocs++] = p;
  return p;
}

/* Host memory (bookkeeping the forward pass reads on the CPU). */
static void *halloc(fwd_state *s, size_t bytes, int *fail) {
  void *p = calloc(1, bytes ? bytes : 1);
  void **na = realloc(s->hallocs, (s->n_hallocs + 1) * sizeof *na);
  if (!p || !na) {
    free(p);
    if (na) s->hallocs = na;
    *fail = 1;
    return NULL;
  }
  s->hallocs = na;
  s->hallocs[s->n_hallocs++] = p;
  return p;
}

static int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

/* Widest per-token activation any layer needs (floats). */
static int64_t widest(const model_config *c) {
  int64_t w = c->hidden;
  const int64_t conv_dim = 2 * (int64_t)c->gdn_hk * c->gdn_dk + (int64_t)c->gdn_hv * c->gdn_dv;
  w = max64(w, conv_dim);
  if (conv_dim) w = max64(w, conv_dim + 2 * (int64_t)c->gdn_hv); /* gdn_step's work (ops_gdn_step_work_floats) */
  w = max64(w, 2 * (int64_t)c->gdn_hv);
  w = max64(w, c->n_experts);
  w = max64(w, 2 * (int64_t)c->shared_ffn);
  w = max64(w, (int64_t)c->n_layers * c->ple_dim);
  for (int i = 0; i < c->n_layers; i++) {
    const layer_config *l = &c->layers[i];
    w = max64(w, (int64_t)c->n_heads * l->head_dim * 2);
    w = max64(w, (int64_t)l->n_kv_heads * l->head_dim);
    w = max64(w, 2 * (int64_t)l->ffn_dim);
  }
  return w;
}

static int64_t conv_floats(const model_config *c) {
  return (2 * (int64_t)c->gdn_hk * c->gdn_dk + (int64_t)c->gdn_hv * c->gdn_dv) * (c->gdn_conv - 1);
}

static int64_t ssm_floats(const model_config *c) {
  return (int64_t)c->gdn_hv * c->gdn_dk * c->gdn_dv;
}

/* Bytes of one position row of layer l's cache. */
static int64_t kv_row_bytes(const fwd_state *s, const layer_config *l) {
  return (int64_t)l->n_kv_heads * ops_kv_head_bytes(s->kv_type, l->head_dim);
}

/* ---- block pool ---- */

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* Chain hash of a block: its tokens and the hash of everything before it. */
static uint64_t block_hash(uint64_t parent, const int32_t *t, int n) {
  uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ULL);
  for (int i = 0; i < n; i++) h = mix64(h ^ (uint32_t)t[i] ^ ((uint64_t)(uint32_t)i << 32));
  return h;
}

/* Key of a partial block (its first n < block_len tokens): never equal to a full block's
 * key for the same tokens. */
static uint64_t partial_hash(uint64_t parent, const int32_t *t, int n) {
  return block_hash(parent ^ 0x5bd1e9955bd1e995ULL, t, n) ^ (uint64_t)n;
}

static int64_t hidx_home(const fwd_state *s, uint64_t h) {
  return (int64_t)(h & (uint64_t)(s->hcap - 1));
}

/* The cached block with this chain position and these tokens (-1: none). Tokens are
 * compared, so a hash collision cannot map a wrong block. */
static int32_t hidx_find(const fwd_state *s, uint64_t hash, uint64_t parent, const int32_t *tok, int n) {
  for (int64_t i = hidx_home(s, hash);; i = (i + 1) & (s->hcap - 1)) {
    const int32_t b = s->hidx[i];
    if (b < 0) return -1;
    const kv_blk *k = &s->blk[b];
    if (k->hash == hash && k->parent == parent && k->fill == n &&
        !memcmp(s->blk_tok + (int64_t)b * s->block_len, tok, sizeof(int32_t) * (size_t)n))
      return b;
  }
}

static void hidx_insert(fwd_state *s, int32_t b) {
  int64_t i = hidx_home(s, s->blk[b].hash);
  while (s->hidx[i] >= 0) i = (i + 1) & (s->hcap - 1);
  s->hidx[i] = b;
}

/* Linear-probing delete by backward shift (no tombstones: the index never degrades). */
static void hidx_remove(fwd_state *s, int32_t b) {
  const int64_t mask = s->hcap - 1;
  int64_t i = hidx_home(s, s->blk[b].hash);
  while (s->hidx[i] != b) {
    if (s->hidx[i] < 0) return;
    i = (i + 1) & mask;
  }
  for (int64_t j = (i + 1) & mask; s->hidx[j] >= 0; j = (j + 1) & mask) {
    const int64_t k = hidx_home(s, s->blk[s->hidx[j]].hash);
    /* Move j's entry into the hole at i unless its home lies cyclically in (i, j]. */
    const int in_range = i <= j ? (k > i && k <= j) : (k > i || k <= j);
    if (!in_range) {
      s->hidx[i] = s->hidx[j];
      i = j;
    }
  }
  s->hidx[i] = -1;
}

/* A block for writing: the free list, else the least recently used cached block nobody
 * references (evicted from the index). -1: every block is in use. */
static int32_t blk_alloc(fwd_state *s) {
  int32_t b = -1;
  if (s->n_free > 0) {
    b = s->free_ids[--s->n_free];
  } else {
    for (int64_t i = 0; i < s->n_blocks; i++)
      if (s->blk[i].ref == 0 && s->blk[i].cached && (b < 0 || s->blk[i].tick < s->blk[b].tick)) b = (int32_t)i;
    if (b < 0) return -1;
    hidx_remove(s, b);
    s->blk[b].cached = 0;
    s->st.evictions++;
  }
  s->blk[b].ref = 1;
  return b;
}

static void blk_unref(fwd_state *s, int32_t b) {
  kv_blk *k = &s->blk[b];
  if (--k->ref > 0) return;
  k->tick = ++s->tick;
  if (!k->cached) s->free_ids[s->n_free++] = b;
}

/* Entry j of seq's table is block b (host mirror; uploaded before the next forward pass). */
static void tab_set(fwd_state *s, int seq, int j, int32_t b) {
  s->tab_id[(int64_t)seq * s->max_bps + j] = b;
  for (int oi = 0; oi < s->n_own; oi++) {
    void **t = s->tab_h + ((int64_t)seq * s->n_own + oi) * 2 * s->max_bps;
    t[j] = s->pool_k[oi] + (int64_t)b * s->blk_bytes[oi];
    t[s->max_bps + j] = s->pool_v[oi] + (int64_t)b * s->blk_bytes[oi];
  }
  s->tab_dirty[seq] = 1;
}

/* seq keeps its first `keep` table entries; the rest are released. */
static void seq_release(fwd_state *s, int seq, int32_t keep) {
  int32_t *t = s->tab_id + (int64_t)seq * s->max_bps;
  for (int32_t j = keep; j < s->nblk[seq]; j++) {
    blk_unref(s, t[j]);
    t[j] = -1;
  }
  if (s->nblk[seq] > keep) s->nblk[seq] = keep;
}

/* Makes positions [from, to) of seq writable: fresh blocks where the table ends, and a
 * private copy of any block it shares or that the prefix index holds (copy on write). */
static int seq_ensure(fwd_state *s, int seq, int32_t from, int32_t to, char *err, size_t errlen) {
  const int32_t j0 = from >> s->bshift, j1 = (to - 1) >> s->bshift;
  int32_t *t = s->tab_id + (int64_t)seq * s->max_bps;
  for (int32_t j = j0; j <= j1 && j < s->nblk[seq]; j++) {
    const int32_t b = t[j];
    if (s->blk[b].ref == 1 && !s->blk[b].cached) continue;
    const int32_t nb = blk_alloc(s);
    if (nb < 0) goto full;
    const int64_t rows = j == j0 ? (from & (s->block_len - 1)) : 0;
    for (int oi = 0; rows > 0 && oi < s->n_own; oi++) {
      const int64_t rb = s->blk_bytes[oi] / s->block_len, off_n = (int64_t)nb * s->blk_bytes[oi],
                    off_b = (int64_t)b * s->blk_bytes[oi];
      s->be->copy(s->be, s->pool_k[oi] + off_n, s->pool_k[oi] + off_b, (size_t)(rows * rb));
      s->be->copy(s->be, s->pool_v[oi] + off_n, s->pool_v[oi] + off_b, (size_t)(rows * rb));
    }
    blk_unref(s, b);
    tab_set(s, seq, j, nb);
    s->st.cow_copies++;
  }
  while (s->nblk[seq] <= j1) {
    const int32_t nb = blk_alloc(s);
    if (nb < 0) goto full;
    tab_set(s, seq, s->nblk[seq]++, nb);
  }
  return 0;
full:
  return anna_err(err, errlen, ANNA_ERANGE,
                  "KV cache full: no free block for sequence %d (pool of %lld blocks of %d positions, all in use)",
                  seq, (long long)s->n_blocks, s->block_len);
}

/* Registers seq's full blocks [j0, j1) in the prefix index (hashes already in bhash). */
static void seq_register(fwd_state *s, int seq, int32_t j0, int32_t j1) {
  const int32_t *t = s->tab_id + (int64_t)seq * s->max_bps;
  const uint64_t *bh = s->bhash + (int64_t)seq * s->max_bps;
  for (int32_t j = j0; j < j1; j++) {
    const int32_t b = t[j];
    const uint64_t parent = j ? bh[j - 1] : 0;
    const int32_t *tok = s->stok + (int64_t)seq * s->n_ctx + (int64_t)j * s->block_len;
    if (s->blk[b].cached || hidx_find(s, bh[j], parent, tok, s->block_len) >= 0) continue; /* already known */
    s->blk[b].cached = 1;
    s->blk[b].fill = s->block_len;
    s->blk[b].hash = bh[j];
    s->blk[b].parent = parent;
    memcpy(s->blk_tok + (int64_t)b * s->block_len, tok, sizeof(int32_t) * (size_t)s->block_len);
    hidx_insert(s, b);
  }
}

/* Pushes the host mirror of dirty block tables to the backend. */
static void tab_upload(fwd_state *s) {
  const int64_t per = (int64_t)s->n_own * 2 * s->max_bps;
  for (int q = 0; q < s->n_seq; q++)
    if (s->tab_dirty[q]) {
      s->be->upload(s->be, s->tab_d + q * per, s->tab_h + q * per, sizeof(void *) * (size_t)per);
      s->tab_dirty[q] = 0;
    }
}

int fwd_state_create(fwd_state **out, const anna_model *m, ops_backend *be, int n_seq, int n_ctx, int n_batch,
                     const fwd_state_options *opt, char *err, size_t errlen) {
  *out = NULL;
  const model_config *c = &m->cfg;
  fwd_state_options o = {0};
  if (opt) o = *opt;
  const int kv_type = o.kv_type;
  if (!o.block_len) o.block_len = 64;
  if (n_seq < 1 || n_ctx < 1 || n_batch < 1 || n_seq > 4096 || n_batch > 1 << 20)
    return anna_err(err, errlen, ANNA_EINVAL, "bad context sizes (n_seq %d, n_ctx %d, n_batch %d)", n_seq, n_ctx,
                    n_batch);
  if (o.block_len < 16 || o.block_len > 4096 || (o.block_len & (o.block_len - 1)))
    return anna_err(err, errlen, ANNA_EINVAL, "KV block length %d is not a power of two in 16..4096", o.block_len);
  if (o.residual_len < 0 || o.residual_len > 1 << 20 || o.n_blocks < 0)
    return anna_err(err, errlen, ANNA_EINVAL, "bad KV options (residual %d, blocks %lld)", o.residual_len,
                    (long long)o.n_blocks);
  fwd_state *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  int fail = 0;
  s->be = be;
  s->cfg = c;
  s->kv_type = kv_type;
  if (kv_type != OPS_KV_F32) {
    for (int l = 0; l < c->n_layers; l++) {
      const int d = c->layers[l].head_dim;
      if (c->layers[l].kind == LAYER_KIND_GDN) continue;
      if (d % 32 || (kv_type >= OPS_KV_TQ2 && ((d & (d - 1)) || d > 1024))) {
        free(s);
        return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                        "KV-cache quantization needs head dims that are multiples of 32 (powers of two up to 1024 "
                        "for turboquant); layer %d has %d", l, d);
      }
    }
    if (!be->kv_store) {
      free(s);
      return anna_err(err, errlen, ANNA_EUNSUPPORTED, "the %s backend has no quantized KV cache", be->name);
    }
  }
  s->n_seq = n_seq;
  s->n_ctx = n_ctx;
  s->n_batch = n_batch;
  s->n_layers = c->n_layers;
  s->block_len = o.block_len;
  while ((1 << s->bshift) < s->block_len) s->bshift++;
  s->max_bps = (int)(((int64_t)n_ctx + s->block_len - 1) / s->block_len);
  s->n_blocks = o.n_blocks ? o.n_blocks : (int64_t)n_seq * s->max_bps;
  s->share_enabled = o.prefix_share;
  /* Snapshot points are block boundaries. */
  s->snap_every = o.snapshot_interval > 0 ? (o.snapshot_interval + o.block_len - 1) / o.block_len * o.block_len : 0;
  /* The residual ring only means something for a quantized cache. */
  s->resid = kv_type != OPS_KV_F32 ? o.residual_len : 0;
  s->ring_len = s->resid ? s->resid + n_batch : 0;
  if (s->n_blocks > INT32_MAX / 2) {
    const long long nbl = (long long)s->n_blocks;
    free(s);
    return anna_err(err, errlen, ANNA_EINVAL, "KV pool of %lld blocks is too large", nbl);
  }
  const size_t nl = (size_t)c->n_layers * (size_t)n_seq;
  s->own_idx = halloc(s, (size_t)c->n_layers * sizeof(int), &fail);
  s->conv = halloc(s, nl * sizeof(float *), &fail);
  s->ssm = halloc(s, nl * sizeof(float *), &fail);
  s->len = halloc(s, (size_t)n_seq * sizeof(int32_t), &fail);
  for (int l = 0; !fail && l < c->n_layers; l++) {
    s->own_idx[l] = -1;
    if (c->layers[l].kind != LAYER_KIND_GDN && c->layers[l].kv_source == l) s->own_idx[l] = s->n_own++;
  }
  /* KV-shared layers read the pool of their source layer. */
  for (int l = 0; !fail && l < c->n_layers; l++)
    if (c->layers[l].kind != LAYER_KIND_GDN && c->layers[l].kv_source != l)
      s->own_idx[l] = s->own_idx[c->layers[l].kv_source];
  const int no = s->n_own > 0 ? s->n_own : 1;
  s->pool_k = halloc(s, (size_t)no * sizeof(uint8_t *), &fail);
  s->pool_v = halloc(s, (size_t)no * sizeof(uint8_t *), &fail);
  s->blk_bytes = halloc(s, (size_t)no * sizeof(int64_t), &fail);
  s->ring_k = halloc(s, (size_t)no * n_seq * sizeof(float *), &fail);
  s->ring_v = halloc(s, (size_t)no * n_seq * sizeof(float *), &fail);
  for (int l = 0; !fail && l < c->n_layers; l++) {
    const layer_config *lc = &c->layers[l];
    if (lc->kind == LAYER_KIND_GDN || lc->kv_source != l) continue;
    const int oi = s->own_idx[l];
    s->blk_bytes[oi] = kv_row_bytes(s, lc) * s->block_len;
    s->pool_k[oi] = salloc(s, (size_t)(s->blk_bytes[oi] * s->n_blocks), &fail);
    s->pool_v[oi] = salloc(s, (size_t)(s->blk_bytes[oi] * s->n_blocks), &fail);
    for (int q = 0; !fail && q < n_seq && s->resid; q++) {
      const size_t rf = (size_t)s->ring_len * (size_t)lc->n_kv_heads * (size_t)lc->head_dim;
      s->ring_k[(size_t)oi * n_seq + q] = salloc(s, rf * sizeof(float), &fail);
      s->ring_v[(size_t)oi * n_seq + q] = salloc(s, rf * sizeof(float), &fail);
    }
  }
  s->blk = halloc(s, (size_t)s->n_blocks * sizeof *s->blk, &fail);
  s->blk_tok = halloc(s, (size_t)s->n_blocks * (size_t)s->block_len * sizeof(int32_t), &fail);
  s->free_ids = halloc(s, (size_t)s->n_blocks * sizeof(int32_t), &fail);
  for (s->hcap = 16; s->hcap < 2 * s->n_blocks;) s->hcap *= 2;
  s->hidx = halloc(s, (size_t)s->hcap * sizeof(int32_t), &fail);
  const size_t ntab = (size_t)n_seq * (size_t)s->max_bps;
  s->tab_id = halloc(s, ntab * sizeof(int32_t), &fail);
  s->nblk = halloc(s, (size_t)n_seq * sizeof(int32_t), &fail);
  s->tab_h = halloc(s, ntab * (size_t)no * 2 * sizeof(void *), &fail);
  s->tab_d = salloc(s, ntab * (size_t)no * 2 * sizeof(void *), &fail);
  s->tab_dirty = halloc(s, (size_t)n_seq, &fail);
  s->stok = halloc(s, (size_t)n_seq * (size_t)n_ctx * sizeof(int32_t), &fail);
  s->bhash = halloc(s, ntab * sizeof(uint64_t), &fail);
  s->share = halloc(s, (size_t)n_seq, &fail);
  s->cand = halloc(s, (size_t)s->max_bps * sizeof(int32_t), &fail);
  if (!fail) {
    for (int64_t i = 0; i < s->hcap; i++) s->hidx[i] = -1;
    for (size_t i = 0; i < ntab; i++) s->tab_id[i] = -1;
    /* Popped from the top: low ids first (a deterministic layout). */
    for (int64_t i = 0; i < s->n_blocks; i++) s->free_ids[i] = (int32_t)(s->n_blocks - 1 - i);
    s->n_free = s->n_blocks;
  }
  const int64_t conv_dim = 2 * (int64_t)c->gdn_hk * c->gdn_dk + (int64_t)c->gdn_hv * c->gdn_dv;
  for (int l = 0; !fail && l < c->n_layers; l++) {
    const layer_config *lc = &c->layers[l];
    for (int q = 0; !fail && q < n_seq; q++) {
      size_t at = (size_t)l * n_seq + q;
      if (lc->kind == LAYER_KIND_GDN) {
        s->conv[at] = salloc(s, (size_t)conv_dim * (c->gdn_conv - 1) * sizeof(float), &fail);
        s->ssm[at] = salloc(s, (size_t)c->gdn_hv * c->gdn_dk * c->gdn_dv * sizeof(float), &fail);
      }
    }
  }
  const int64_t H = c->hidden, n = n_batch;
  s->wmax = widest(c);
  s->x = salloc(s, (size_t)(n * H) * sizeof(float), &fail);
  s->xn = salloc(s, (size_t)(n * H) * sizeof(float), &fail);
  s->res = salloc(s, (size_t)(n * H) * sizeof(float), &fail);
  s->logits_in = salloc(s, (size_t)(n * H) * sizeof(float), &fail);
  s->logits = salloc(s, (size_t)(n * c->vocab) * sizeof(float), &fail);
  s->tk_dev = salloc(s, (size_t)n * FWD_TOPK_ROW_BYTES, &fail);
  s->tk_host = halloc(s, (size_t)n * FWD_TOPK_ROW_BYTES, &fail);
  s->tokens = salloc(s, (size_t)n * sizeof(int32_t), &fail);
  s->pos = salloc(s, (size_t)n * sizeof(int32_t), &fail);
  for (int i = 0; i < 5; i++) s->buf[i] = salloc(s, (size_t)(n * s->wmax) * sizeof(float), &fail);
  if (c->ple_dim > 0) s->ple = salloc(s, (size_t)(n * c->n_layers * c->ple_dim) * sizeof(float), &fail);
  if (c->n_experts > 0) {
    const int kx = c->top_k + (c->shared_ffn > 0); /* a shared expert may run as slot k (sx_*) */
    s->moe_scratch = salloc(s, (size_t)ops_moe_scratch_floats(n, kx, c->hidden, c->expert_ffn) * sizeof(float), &fail);
    s->moe_idx = salloc(s, (size_t)(n * kx) * sizeof(int32_t), &fail);
    s->moe_w = salloc(s, (size_t)(n * kx) * sizeof(float), &fail);
  }
  int has_gdn = 0;
  for (int l = 0; l < c->n_layers; l++) has_gdn |= c->layers[l].kind == LAYER_KIND_GDN;
  s->has_gdn = has_gdn;
  s->n_ckpt = has_gdn && o.n_ckpt > 0 ? o.n_ckpt : 0;
  s->ckpt = halloc(s, (size_t)(s->n_ckpt + 1) * sizeof *s->ckpt, &fail);
  for (int i = 0; !fail && i < s->n_ckpt; i++) {
    struct fwd_ckpt *k = &s->ckpt[i];
    k->seq = -1;
    k->conv = halloc(s, (size_t)c->n_layers * sizeof(float *), &fail);
    k->ssm = halloc(s, (size_t)c->n_layers * sizeof(float *), &fail);
    for (int l = 0; !fail && l < c->n_layers; l++)
      if (c->layers[l].kind == LAYER_KIND_GDN) {
        k->conv[l] = salloc(s, (size_t)conv_floats(c) * sizeof(float), &fail);
        k->ssm[l] = salloc(s, (size_t)ssm_floats(c) * sizeof(float), &fail);
      }
  }
  s->kp = halloc(s, (size_t)n * sizeof(void *), &fail);
  s->vp = halloc(s, (size_t)n * sizeof(void *), &fail);
  s->wk = halloc(s, (size_t)n * sizeof(void *), &fail);
  s->wv = halloc(s, (size_t)n * sizeof(void *), &fail);
  s->wrk = halloc(s, (size_t)n * sizeof(float *), &fail);
  s->wrv = halloc(s, (size_t)n * sizeof(float *), &fail);
  s->rkp = halloc(s, (size_t)n * sizeof(float *), &fail);
  s->rvp = halloc(s, (size_t)n * sizeof(float *), &fail);
  s->run_start = halloc(s, (size_t)n * sizeof(int32_t), &fail);
  s->run_len = halloc(s, (size_t)n * sizeof(int32_t), &fail);
  s->run_seq = halloc(s, (size_t)n * sizeof(int32_t), &fail);
  s->run_cut0 = halloc(s, (size_t)n * sizeof(int32_t), &fail);
  s->run_ncut = halloc(s, (size_t)n * sizeof(int32_t), &fail);
  s->cut_at = halloc(s, (size_t)(2 * n + 1) * sizeof(int32_t), &fail);
  s->cut_slot = halloc(s, (size_t)(2 * n + 1) * sizeof(int32_t), &fail);
  if (fail) {
    fwd_state_free(s);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory for %d sequences x %d positions", n_seq, n_ctx);
  }
  *out = s;
  return 0;
}

void fwd_state_free(fwd_state *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n_allocs; i++) s->be->free(s->be, s->allocs[i]);
  for (size_t i = 0; i < s->n_hallocs; i++) free(s->hallocs[i]);
  free(s->allocs);
  free(s->hallocs);
  free(s);
}

int64_t fwd_state_kv_bytes_per_token(const fwd_state *s) {
  int64_t b = 0;
  for (int l = 0; l < s->cfg->n_layers; l++)
    if (s->cfg->layers[l].kind != LAYER_KIND_GDN && s->cfg->layers[l].kv_source == l) b += 2 * kv_row_bytes(s, &s->cfg->layers[l]);
  return b;
}

void fwd_state_kv_stats(const fwd_state *s, fwd_kv_stats *st) {
  *st = s->st;
  st->block_len = s->block_len;
  st->prefix_share = s->share_enabled;
  st->n_blocks = s->n_blocks;
  st->free_blocks = s->n_free;
  st->cached_blocks = 0;
  for (int64_t i = 0; i < s->n_blocks; i++) st->cached_blocks += s->blk[i].ref == 0 && s->blk[i].cached;
  st->pool_bytes = fwd_state_kv_bytes_per_token(s) * s->block_len * s->n_blocks;
  const model_config *c = s->cfg;
  int n_gdn = 0;
  int64_t ring_row = 0;
  for (int l = 0; l < c->n_layers; l++) {
    n_gdn += c->layers[l].kind == LAYER_KIND_GDN;
    if (c->layers[l].kind != LAYER_KIND_GDN && c->layers[l].kv_source == l)
      ring_row += 2 * (int64_t)c->layers[l].n_kv_heads * c->layers[l].head_dim * 4;
  }
  st->snapshot_bytes = (int64_t)s->n_ckpt * n_gdn * (conv_floats(c) + ssm_floats(c)) * 4;
  st->ring_bytes = ring_row * s->ring_len * s->n_seq;
  st->n_snapshots = 0;
  for (int i = 0; i < s->n_ckpt; i++) st->n_snapshots += s->ckpt[i].hashed;
}

int32_t fwd_state_seq_len(const fwd_state *s, int seq) {
  return seq >= 0 && seq < s->n_seq ? s->len[seq] : -1;
}

/* Checkpoints of seq past position n no longer describe its tokens (prefix snapshots,
 * keyed by content, stay valid). */
static void ckpt_invalidate(fwd_state *s, int seq, int32_t n) {
  for (int i = 0; i < s->n_ckpt; i++)
    if (s->ckpt[i].seq == seq && s->ckpt[i].pos > n) s->ckpt[i].seq = -1;
}

static void seq_register_tail(fwd_state *s, int seq);

void fwd_state_seq_reset(fwd_state *s, int seq) {
  if (seq < 0 || seq >= s->n_seq) return;
  seq_register_tail(s, seq);
  /* GDN state is zeroed when the sequence restarts. */
  s->len[seq] = 0;
  seq_release(s, seq, 0);
  s->share[seq] = 0;
  ckpt_invalidate(s, seq, 0);
}

static struct fwd_ckpt *ckpt_find(fwd_state *s, int seq, int32_t pos) {
  for (int i = 0; i < s->n_ckpt; i++)
    if (s->ckpt[i].seq == seq && s->ckpt[i].pos == pos) return &s->ckpt[i];
  return NULL;
}

static struct fwd_ckpt *snap_find(fwd_state *s, uint64_t hash) {
  for (int i = 0; i < s->n_ckpt; i++)
    if (s->ckpt[i].hashed && s->ckpt[i].hash == hash) return &s->ckpt[i];
  return NULL;
}

/* The slot for a new checkpoint: an untagged one, else the least recently used. */
static struct fwd_ckpt *ckpt_pick(fwd_state *s) {
  struct fwd_ckpt *k = &s->ckpt[0];
  for (int i = 0; i < s->n_ckpt; i++) {
    if (s->ckpt[i].seq < 0 && !s->ckpt[i].hashed) return &s->ckpt[i];
    if (s->ckpt[i].tick < k->tick) k = &s->ckpt[i];
  }
  return k;
}

/* Recurrent state of every GDN layer: from (conv, ssm) arrays to those of dst. */
static void gdn_state_copy(fwd_state *s, float **dconv, float **dssm, int dseq_stride, float **sconv, float **sssm,
                           int sseq_stride) {
  const model_config *c = s->cfg;
  for (int l = 0; l < c->n_layers; l++) {
    if (c->layers[l].kind != LAYER_KIND_GDN) continue;
    float *dc = dconv[(size_t)l * dseq_stride], *ds = dssm[(size_t)l * dseq_stride];
    const float *sc = sconv[(size_t)l * sseq_stride], *ss = sssm[(size_t)l * sseq_stride];
    s->be->copy_rows(s->be, dc, 0, sc, 0, 1, (int)conv_floats(c));
    s->be->copy_rows(s->be, ds, 0, ss, 0, 1, (int)ssm_floats(c));
  }
}

int fwd_state_checkpoint(fwd_state *s, int seq, char *err, size_t errlen) {
  if (seq < 0 || seq >= s->n_seq) return anna_err(err, errlen, ANNA_ERANGE, "sequence %d out of range", seq);
  if (s->n_ckpt == 0) return 0; /* no recurrent state: positions alone describe the state */
  struct fwd_ckpt *k = ckpt_find(s, seq, s->len[seq]);
  if (!k) k = ckpt_pick(s);
  k->seq = seq;
  k->pos = s->len[seq];
  k->hashed = 0;
  k->tick = ++s->tick;
  gdn_state_copy(s, k->conv, k->ssm, 1, s->conv + seq, s->ssm + seq, s->n_seq);
  return 0;
}

/* A registering sequence that ends mid-block leaves that block in the index as a partial
 * block (its first len % block_len positions), and for GDN models its final state as a
 * snapshot: the next turn of a conversation reuses everything up to where this one ended. */
static void seq_register_tail(fwd_state *s, int seq) {
  const int32_t len = s->len[seq], p = len & (s->block_len - 1), j = len >> s->bshift;
  if (s->share[seq] != 2 || p == 0 || j >= s->nblk[seq] || (s->has_gdn && !s->n_ckpt)) return;
  const int32_t b = s->tab_id[(int64_t)seq * s->max_bps + j];
  const uint64_t parent = j ? s->bhash[(int64_t)seq * s->max_bps + j - 1] : 0;
  const int32_t *tok = s->stok + (int64_t)seq * s->n_ctx + ((int64_t)j << s->bshift);
  const uint64_t h = partial_hash(parent, tok, p);
  if (s->has_gdn && !snap_find(s, h)) {
    struct fwd_ckpt *k = ckpt_pick(s);
    k->seq = -1;
    k->hashed = 1;
    k->hash = h;
    k->tick = ++s->tick;
    gdn_state_copy(s, k->conv, k->ssm, 1, s->conv + seq, s->ssm + seq, s->n_seq);
  }
  kv_blk *k = &s->blk[b];
  if (k->ref != 1 || k->cached || hidx_find(s, h, parent, tok, p) >= 0) return;
  k->cached = 1;
  k->fill = p;
  k->hash = h;
  k->parent = parent;
  memcpy(s->blk_tok + (int64_t)b * s->block_len, tok, sizeof(int32_t) * (size_t)p);
  hidx_insert(s, b);
}

/* The recurrent state of src at position n: its live state or a checkpoint. */
static int state_source(fwd_state *s, int src, int32_t n, float ***conv, float ***ssm, int *stride, char *err,
                        size_t errlen) {
  if (!s->has_gdn) {
    *conv = *ssm = NULL;
    return 0;
  }
  if (n == s->len[src]) {
    *conv = s->conv + src, *ssm = s->ssm + src, *stride = s->n_seq;
    return 0;
  }
  struct fwd_ckpt *k = ckpt_find(s, src, n);
  if (!k)
    return anna_err(err, errlen, ANNA_ENOTFOUND,
                    "sequence %d has no recurrent-state checkpoint at position %d (its length is %d)", src, n,
                    s->len[src]);
  k->tick = ++s->tick;
  *conv = k->conv, *ssm = k->ssm, *stride = 1;
  return 0;
}

/* With a residual ring, positions (n - resid, n] must still be in src's ring (it holds
 * the newest ring_len positions of src's length len). */
static int ring_check(const fwd_state *s, int src, int32_t n, char *err, size_t errlen) {
  if (!s->resid || n - s->resid <= 0 || n - s->resid >= s->len[src] - s->ring_len) return 0;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "sequence %d no longer holds f32 rows for positions before %d (--kv-cache-residual-len %d)", src,
                  n, s->resid);
}

int fwd_state_seq_rewind(fwd_state *s, int seq, int32_t n, char *err, size_t errlen) {
  if (seq < 0 || seq >= s->n_seq) return anna_err(err, errlen, ANNA_ERANGE, "sequence %d out of range", seq);
  if (n < 0 || n > s->len[seq])
    return anna_err(err, errlen, ANNA_ERANGE, "cannot rewind sequence %d of length %d to %d", seq, s->len[seq], n);
  if (n == 0) {
    const int share = s->share[seq];
    fwd_state_seq_reset(s, seq);
    s->share[seq] = (uint8_t)share;
    return 0;
  }
  float **conv, **ssm;
  int stride = 1;
  int rc = ring_check(s, seq, n, err, errlen);
  if (!rc) rc = state_source(s, seq, n, &conv, &ssm, &stride, err, errlen);
  if (rc) return rc;
  if (conv && conv != s->conv + seq) gdn_state_copy(s, s->conv + seq, s->ssm + seq, s->n_seq, conv, ssm, stride);
  s->len[seq] = n;
  seq_release(s, seq, (n + s->block_len - 1) >> s->bshift);
  ckpt_invalidate(s, seq, n);
  return 0;
}

int fwd_state_seq_copy(fwd_state *s, int dst, int src, int32_t n, char *err, size_t errlen) {
  if (dst < 0 || dst >= s->n_seq || src < 0 || src >= s->n_seq || dst == src)
    return anna_err(err, errlen, ANNA_ERANGE, "bad sequence pair %d <- %d", dst, src);
  if (n < 0 || n > s->len[src])
    return anna_err(err, errlen, ANNA_ERANGE, "cannot copy %d positions of sequence %d (length %d)", n, src, s->len[src]);
  float **conv = NULL, **ssm = NULL;
  int stride = 1;
  if (n > 0) {
    int rc = ring_check(s, src, n, err, errlen);
    if (!rc) rc = state_source(s, src, n, &conv, &ssm, &stride, err, errlen);
    if (rc) return rc;
  }
  ckpt_invalidate(s, dst, 0);
  seq_release(s, dst, 0);
  /* The blocks are shared, not copied: whoever writes into a shared block first copies it. */
  const int32_t nb = (n + s->block_len - 1) >> s->bshift;
  const int32_t *st = s->tab_id + (int64_t)src * s->max_bps;
  for (int32_t j = 0; j < nb; j++) {
    s->blk[st[j]].ref++;
    tab_set(s, dst, j, st[j]);
  }
  s->nblk[dst] = nb;
  memcpy(s->stok + (int64_t)dst * s->n_ctx, s->stok + (int64_t)src * s->n_ctx, sizeof(int32_t) * (size_t)n);
  memcpy(s->bhash + (int64_t)dst * s->max_bps, s->bhash + (int64_t)src * s->max_bps, sizeof(uint64_t) * (size_t)nb);
  s->share[dst] = s->share[src];
  for (int oi = 0; s->resid && oi < s->n_own; oi++) {
    const layer_config *lc = NULL;
    for (int l = 0; l < s->cfg->n_layers && !lc; l++)
      if (s->own_idx[l] == oi && s->cfg->layers[l].kv_source == l) lc = &s->cfg->layers[l];
    const size_t bytes = (size_t)s->ring_len * (size_t)lc->n_kv_heads * (size_t)lc->head_dim * sizeof(float);
    s->be->copy(s->be, s->ring_k[(size_t)oi * s->n_seq + dst], s->ring_k[(size_t)oi * s->n_seq + src], bytes);
    s->be->copy(s->be, s->ring_v[(size_t)oi * s->n_seq + dst], s->ring_v[(size_t)oi * s->n_seq + src], bytes);
  }
  if (conv) gdn_state_copy(s, s->conv + dst, s->ssm + dst, s->n_seq, conv, ssm, stride);
  s->len[dst] = n;
  return 0;
}

int32_t fwd_state_prefix_attach(fwd_state *s, int seq, const int32_t *tokens, int32_t n, int register_blocks) {
  if (seq < 0 || seq >= s->n_seq) return ANNA_ERANGE;
  fwd_state_seq_reset(s, seq);
  if (!s->share_enabled || n <= 0 || !tokens) return 0;
  if (n > s->n_ctx) n = s->n_ctx;
  s->share[seq] = register_blocks ? 2 : 1;
  s->st.lookups++;
  s->st.lookup_tokens += (uint64_t)n;
  /* Rows reused from blocks were never written to this sequence's f32 residual ring (and
   * the quantized rows cannot refill it), so with a ring nothing is reused. */
  if (s->resid) return 0;
  const int32_t full = n >> s->bshift;
  uint64_t h = 0, *bh = s->bhash + (int64_t)seq * s->max_bps;
  int32_t best = 0, found = 0;
  struct fwd_ckpt *snap = NULL;
  for (int32_t j = 0; j < full; j++) {
    const int32_t *tok = tokens + (int64_t)j * s->block_len;
    const uint64_t hj = block_hash(h, tok, s->block_len);
    const int32_t b = hidx_find(s, hj, h, tok, s->block_len);
    if (b < 0) break;
    s->cand[j] = b;
    bh[j] = hj;
    h = hj;
    found = j + 1;
    if (!s->has_gdn) {
      best = j + 1;
    } else {
      struct fwd_ckpt *k = snap_find(s, hj);
      if (k) best = j + 1, snap = k;
    }
  }
  /* Then the block after the matched ones, cut short. GDN models: a partial block that a
   * finished sequence left, at exactly its length, and only with the end state saved for it
   * (the recurrent state exists only where a snapshot was taken). Attention-only models cut
   * any cached block that follows the matched chain at the longest common token prefix (the
   * partial blocks included, and e.g. the shared chat-template header of two different
   * prompts); writing past the cut copies the block first (seq_ensure: it is cached). The
   * scan of the pool runs once per request: cheap next to any prefill. */
  int32_t pfill = 0, pb = -1;
  const int32_t rest = n - (found << s->bshift);
  const int32_t lim = rest < s->block_len - 1 ? rest : s->block_len - 1;
  const int32_t *tok = tokens + ((int64_t)found << s->bshift);
  if (s->has_gdn) {
    for (int32_t p = lim; p > 0 && pb < 0; p--) {
      const uint64_t hp = partial_hash(h, tok, p);
      const int32_t b = hidx_find(s, hp, h, tok, p);
      struct fwd_ckpt *k = b >= 0 ? snap_find(s, hp) : NULL;
      if (!k) continue;
      pb = b, pfill = p, best = found, snap = k;
    }
  } else {
    for (int64_t b = 0; b < s->n_blocks; b++) {
      const kv_blk *k = &s->blk[b];
      if (!k->cached || k->parent != h || k->fill <= pfill) continue;
      const int32_t *bt = s->blk_tok + b * s->block_len, m = lim < k->fill ? lim : k->fill;
      int32_t cp = 0;
      while (cp < m && bt[cp] == tok[cp]) cp++;
      if (cp > pfill) pfill = cp, pb = (int32_t)b;
    }
  }
  for (int32_t j = 0; j < best; j++) {
    s->blk[s->cand[j]].ref++;
    tab_set(s, seq, j, s->cand[j]);
  }
  s->nblk[seq] = best;
  if (pb >= 0) {
    s->blk[pb].ref++;
    tab_set(s, seq, best, pb);
    s->nblk[seq] = best + 1;
  }
  const int32_t len = (best << s->bshift) + pfill;
  memcpy(s->stok + (int64_t)seq * s->n_ctx, tokens, sizeof(int32_t) * (size_t)len);
  if (snap) {
    snap->tick = ++s->tick;
    gdn_state_copy(s, s->conv + seq, s->ssm + seq, s->n_seq, snap->conv, snap->ssm, 1);
  }
  s->len[seq] = len;
  s->st.hit_blocks += (uint64_t)best;
  s->st.miss_blocks += (uint64_t)(full - best - (pfill && best < full ? 1 : 0));
  s->st.hit_tokens += (uint64_t)len;
  return len;
}

/* ---- layers ---- */

typedef struct fwd_run {
  const anna_model *m;
  ops_backend *be;
  fwd_state *s;
  const anna_batch *b;
  int64_t n;
  int n_runs;
  int32_t keys_hint; /* 1 + the batch's largest position (ops_attn_args.keys_hint) */
} fwd_run;

static void norm(fwd_run *r, float *y, const float *x, const float *w, int64_t rows, int d) {
  const model_config *c = &r->m->cfg;
  r->be->rmsnorm(r->be, y, x, w, rows, d, (float)c->eps, c->norm == NORM_KIND_1PW);
}

/* x += res, then y = norm(x): one kernel instead of two where the backend fuses them (the
 * CPU's fused op is the same two loops, so results do not change). */
static void add_norm(fwd_run *r, float *x, const float *res, float *y, const float *w, int64_t rows, int d) {
  const model_config *c = &r->m->cfg;
  if (r->be->add_rmsnorm) {
    r->be->add_rmsnorm(r->be, x, res, y, w, rows, d, (float)c->eps, c->norm == NORM_KIND_1PW);
  } else {
    r->be->add(r->be, x, res, rows * d);
    norm(r, y, x, w, rows, d);
  }
}

/* ys[i][n, ws[i]->rows] = x ws[i]^T (+ biases[i]) for count projections of the same input
 * x: one matmul_group (on a device, fewer launches per decode step), or matmul per weight
 * where the backend lacks it. biases may be NULL. */
static void project(fwd_run *r, int count, float *const *ys, const float *x, const ops_weight *const *ws,
                    const float *const *biases) {
  ops_backend *be = r->be;
  if (be->matmul_group && count > 1) {
    be->matmul_group(be, count, ys, x, r->n, ws, biases);
    return;
  }
  for (int i = 0; i < count; i++) be->matmul(be, ys[i], x, r->n, ws[i], biases ? biases[i] : NULL);
}

/* out[n, H] = attention mixer of xn. */
static void layer_attention(fwd_run *r, int li, const float *xn, float *out) {
  const anna_model *m = r->m;
  const model_config *c = &m->cfg;
  const layer_config *lc = &c->layers[li];
  const layer_weights *w = &m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n;
  const int D = lc->head_dim, Hq = c->n_heads, Hkv = lc->n_kv_heads;
  const int64_t qd = (int64_t)Hq * D, kvd = (int64_t)Hkv * D;
  float *qf = s->buf[0], *q = s->buf[1], *k = s->buf[3], *v = s->buf[4];

  const float eps = (float)c->eps;
  const int one_plus = c->norm == NORM_KIND_1PW;
  /* q, and k and v where this layer owns its cache (k alone with attention_k_eq_v), from the
   * same xn; k and v stay untouched until their norms below. */
  const int own = lc->kv_source == li;
  {
    float *ys[3] = {qf, k, v};
    const ops_weight *ws[3] = {&w->q, &w->k, &w->v};
    const float *bs[3] = {w->q_bias, w->k_bias, w->v_bias};
    project(r, own ? (w->v.data ? 3 : 2) : 1, ys, xn, ws, bs);
  }
  /* q_proj rows are [head][query D | gate D] with the output gate: the queries are copied
   * out; the gate is read in place (strided) by mul_sigmoid below, qf staying untouched
   * until then. */
  const int qhs = c->attn_out_gate ? 2 * D : D; /* query head stride in qf */
  if (!c->attn_out_gate) q = qf;
  if (w->q_norm && be->norm_rope) { /* copy, norm and rope in one kernel */
    be->norm_rope(be, q, qf, n, Hq, D, (int64_t)Hq * qhs, qhs, w->q_norm, eps, one_plus, lc->rope_dims,
                  w->inv_freq, r->s->pos, lc->rope_interleaved);
  } else {
    if (c->attn_out_gate) be->copy_rows(be, q, D, qf, 2 * D, n * Hq, D);
    if (w->q_norm) norm(r, q, q, w->q_norm, n * Hq, D);
    be->rope(be, q, n, Hq, D, qd, lc->rope_dims, w->inv_freq, r->s->pos, lc->rope_interleaved);
  }

  if (own) {
    if (!w->v.data) be->copy_rows(be, v, kvd, k, kvd, n, (int)kvd); /* attention_k_eq_v: V is the raw K */
    if (w->k_norm && be->norm_rope) {
      be->norm_rope(be, k, k, n, Hkv, D, kvd, D, w->k_norm, eps, one_plus, lc->rope_dims, w->inv_freq, r->s->pos,
                    lc->rope_interleaved);
      if (c->v_norm) be->rmsnorm(be, v, v, NULL, n * Hkv, D, eps, 0);
    } else {
      if (w->k_norm) norm(r, k, k, w->k_norm, n * Hkv, D);
      if (c->v_norm) be->rmsnorm(be, v, v, NULL, n * Hkv, D, eps, 0);
      be->rope(be, k, n, Hkv, D, kvd, lc->rope_dims, w->inv_freq, r->s->pos, lc->rope_interleaved);
    }
    const int64_t rb = kv_row_bytes(s, lc), mask = s->block_len - 1;
    const int oi = s->own_idx[li];
    for (int64_t t = 0; t < n; t++) {
      const int sq = r->b->seq[t];
      const int32_t p = r->b->pos[t];
      const int64_t blk = s->tab_id[(int64_t)sq * s->max_bps + (p >> s->bshift)];
      const int64_t off = blk * s->blk_bytes[oi] + (p & mask) * rb;
      s->wk[t] = s->pool_k[oi] + off;
      s->wv[t] = s->pool_v[oi] + off;
    }
    if (s->kv_type == OPS_KV_F32) {
      be->scatter_rows(be, (float *const *)s->wk, k, n, (int)kvd);
      be->scatter_rows(be, (float *const *)s->wv, v, n, (int)kvd);
    } else {
      be->kv_store(be, s->wk, k, n, Hkv, D, s->kv_type);
      be->kv_store(be, s->wv, v, n, Hkv, D, s->kv_type);
    }
    if (s->resid) { /* the newest positions also in f32 */
      for (int64_t t = 0; t < n; t++) {
        const size_t at = (size_t)oi * s->n_seq + r->b->seq[t];
        const int64_t row = (int64_t)(r->b->pos[t] % s->ring_len) * kvd;
        s->wrk[t] = s->ring_k[at] + row;
        s->wrv[t] = s->ring_v[at] + row;
      }
      be->scatter_rows(be, s->wrk, k, n, (int)kvd);
      be->scatter_rows(be, s->wrv, v, n, (int)kvd);
    }
  }
  const int oi = s->own_idx[li];
  for (int64_t t = 0; t < n; t++) {
    const int sq = r->b->seq[t];
    void **tab = s->tab_d + ((int64_t)sq * s->n_own + oi) * 2 * s->max_bps;
    s->kp[t] = (const void *)tab;
    s->vp[t] = (const void *)(tab + s->max_bps);
    if (s->resid) {
      s->rkp[t] = s->ring_k[(size_t)oi * s->n_seq + sq];
      s->rvp[t] = s->ring_v[(size_t)oi * s->n_seq + sq];
    }
  }
  ops_attn_args a = {
      .n = n, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .v_dim = D,
      .kv_type = s->kv_type, .kv_row_bytes = kv_row_bytes(s, lc), .block_len = s->block_len,
      .scale = c->attn_scale, .window = lc->window, .softcap = c->attn_softcap, .pos = s->pos,
      .k_blocks = (const void *const *const *)s->kp, .v_blocks = (const void *const *const *)s->vp,
      .residual_len = s->resid, .ring_len = s->ring_len,
      .k_ring = s->resid ? s->rkp : NULL, .v_ring = s->resid ? s->rvp : NULL, .keys_hint = r->keys_hint,
  };
  float *ao = s->buf[4] == v && own ? s->buf[3] : s->buf[4];
  be->attention(be, ao, q, &a);
  if (c->attn_out_gate) be->mul_sigmoid(be, ao, qf + D, n * Hq, D, 2 * D, 0);
  be->matmul(be, out, ao, n, &w->o, NULL);
}

/* out[n, H] = Gated DeltaNet mixer of xn. */
static void layer_gdn(fwd_run *r, int li, const float *xn, float *out) {
  const anna_model *m = r->m;
  const model_config *c = &m->cfg;
  const layer_weights *w = &m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n;
  const int hk = c->gdn_hk, hv = c->gdn_hv, dk = c->gdn_dk, dv = c->gdn_dv;
  const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd;
  float *qkv = s->buf[0], *z = s->buf[1], *ba = s->buf[2], *conv = s->buf[3], *gates = s->buf[4];

  {
    float *ys[4] = {qkv, z, ba, ba + n * hv};
    const ops_weight *ws[4] = {&w->qkv, &w->z, &w->b, &w->a};
    project(r, 4, ys, xn, ws, NULL);
  }
  /* Decode: when every run is short (the recurrent kernel's range) and uncut, one fused
   * gdn_step per run replaces conv, copies, norms, gates, delta rule and output norm. */
  int fused = be->gdn_step != NULL;
  for (int ri = 0; ri < r->n_runs; ri++)
    if (s->run_ncut[ri] || s->run_len[ri] >= GDN_CHUNKED_MIN) fused = 0;
  if (fused) {
    float *y = s->buf[3];
    for (int ri = 0; ri < r->n_runs; ri++) {
      const int64_t t0 = s->run_start[ri];
      const size_t at = (size_t)li * s->n_seq + s->run_seq[ri];
      const ops_gdn_step_args a = {
          .n = s->run_len[ri], .hk = hk, .hv = hv, .dk = dk, .dv = dv, .kw = c->gdn_conv,
          .v_tiled = c->gdn_v_tiled, .eps = (float)c->eps, .qkv = qkv + t0 * cd, .z = z + t0 * Vd,
          .b = ba + t0 * hv, .a = ba + n * hv + t0 * hv, .conv_w = w->conv_w, .a_log = w->a_log,
          .dt_bias = w->dt_bias, .norm_w = w->gdn_norm, .conv_state = s->conv[at], .state = s->ssm[at],
          .y = y + t0 * Vd, .work = s->buf[4],
      };
      be->gdn_step(be, &a);
    }
    be->matmul(be, out, y, n, &w->out, NULL);
    return;
  }
  /* A run that reaches snapshot points (block boundaries, planned by forward_batch) is cut
   * there and the state at each saved. */
  for (int ri = 0; ri < r->n_runs; ri++) {
    const int64_t t0 = s->run_start[ri], len = s->run_len[ri];
    size_t at = (size_t)li * s->n_seq + s->run_seq[ri];
    int64_t done = 0;
    for (int ci = 0; ci <= s->run_ncut[ri]; ci++) {
      const int last = ci == s->run_ncut[ri];
      const int64_t upto = last ? len : s->cut_at[s->run_cut0[ri] + ci];
      if (upto > done)
        be->conv1d_silu(be, conv + (t0 + done) * cd, qkv + (t0 + done) * cd, upto - done, (int)cd, w->conv_w,
                        c->gdn_conv, s->conv[at]);
      done = upto;
      if (!last)
        be->copy(be, s->ckpt[s->cut_slot[s->run_cut0[ri] + ci]].conv[li], s->conv[at],
                 sizeof(float) * (size_t)conv_floats(c));
    }
  }
  float *q = qkv, *k = qkv + n * Kd, *v = qkv + 2 * n * Kd;
  be->copy_rows(be, q, Kd, conv, cd, n, (int)Kd);
  be->copy_rows(be, k, Kd, conv + Kd, cd, n, (int)Kd);
  be->copy_rows(be, v, Vd, conv + 2 * Kd, cd, n, (int)Vd);
  be->l2norm(be, q, n * hk, dk, 1e-6f, 1.0f / sqrtf((float)dk));
  be->l2norm(be, k, n * hk, dk, 1e-6f, 1.0f);
  float *beta = gates, *g = gates + n * hv;
  be->gdn_gates(be, beta, g, ba, hv, ba + n * hv, hv, w->a_log, w->dt_bias, n, hv);
  float *o = conv; /* conv output no longer needed */
  for (int ri = 0; ri < r->n_runs; ri++) {
    const int64_t t0 = s->run_start[ri], len = s->run_len[ri];
    size_t at = (size_t)li * s->n_seq + s->run_seq[ri];
    int64_t done = 0;
    for (int ci = 0; ci <= s->run_ncut[ri]; ci++) {
      const int last = ci == s->run_ncut[ri];
      const int64_t upto = last ? len : s->cut_at[s->run_cut0[ri] + ci], pn = upto - done, u = t0 + done;
      if (pn > 0) {
        ops_gdn_args a = {
            .n = pn, .hk = hk, .hv = hv, .dk = dk, .dv = dv, .v_tiled = c->gdn_v_tiled, .q = q + u * Kd,
            .k = k + u * Kd, .v = v + u * Vd, .g = g + u * hv, .beta = beta + u * hv, .state = s->ssm[at],
            .out = o + u * Vd,
        };
        if (pn >= GDN_CHUNKED_MIN) be->gdn_chunked(be, &a);
        else be->gdn_recurrent(be, &a);
      }
      done = upto;
      if (!last)
        be->copy(be, s->ckpt[s->cut_slot[s->run_cut0[ri] + ci]].ssm[li], s->ssm[at],
                 sizeof(float) * (size_t)ssm_floats(c));
    }
  }
  float *y = ba; /* [n, Vd] fits: buffers are wmax wide */
  be->rmsnorm_gated(be, y, o, z, w->gdn_norm, n * hv, dv, (float)c->eps);
  be->matmul(be, out, y, n, &w->out, NULL);
}

/* out = (act(g) * u) down^T over [n, d] rows; g may become the product. One op where the
 * backend folds the activation into the product (CUDA decode), else act_mul + matmul. */
static void act_down(fwd_run *r, float *out, float *g, const float *u, int64_t d, const ops_weight *down) {
  ops_backend *be = r->be;
  if (be->act_matmul) {
    be->act_matmul(be, out, g, g, u, r->n, d, d, r->m->cfg.act, down);
    return;
  }
  be->act_mul(be, g, g, u, r->n, (int)d, d, d, r->m->cfg.act);
  be->matmul(be, out, g, r->n, down, NULL);
}

/* y += sigmoid(sg[t]) * ((act(g) * u) down^T) over [n, d] rows (the shared expert's gated
 * output into the residual); tmp [n, down.rows] and g are scratch. One op where the backend
 * fuses the three (CUDA decode: the gate and the add in the down projection's epilogue),
 * else act_down, mul_sigmoid and add. */
static void act_down_gated_add(fwd_run *r, float *y, float *tmp, float *g, const float *u, int64_t d, const float *sg,
                               const ops_weight *down) {
  ops_backend *be = r->be;
  if (be->act_matmul_gated_add) {
    be->act_matmul_gated_add(be, y, tmp, g, g, u, r->n, d, d, r->m->cfg.act, sg, 1, down);
    return;
  }
  act_down(r, tmp, g, u, d, down);
  be->mul_sigmoid(be, tmp, sg, r->n, (int)down->rows, 1, 1);
  be->add(be, y, tmp, r->n * down->rows);
}

static void mlp(fwd_run *r, const ops_weight *gate, const ops_weight *up, const ops_weight *down,
                const float *xn, float *out) {
  const int64_t I = gate->rows;
  float *g = r->s->buf[0], *u = r->s->buf[1];
  float *ys[2] = {g, u};
  const ops_weight *ws[2] = {gate, up};
  project(r, 2, ys, xn, ws, NULL);
  act_down(r, out, g, u, I, down);
}

/* Sparse experts of layer li on xn, routed by logits [n, E], into out. */
static void moe_routed(fwd_run *r, int li, const float *logits, const float *xn, float *out) {
  const model_config *c = &r->m->cfg;
  const layer_weights *w = &r->m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n;
  be->moe_route(be, s->moe_idx, s->moe_w, logits, n, c->n_experts, c->top_k, c->norm_topk, w->per_expert_scale);
  be->moe_ffn(be, out, xn, n, c->hidden, s->moe_idx, s->moe_w, c->top_k, c->n_experts, w->exp_gate, w->exp_up, w->exp_down,
              c->act, s->moe_scratch);
}

/* Sparse experts of layer li on xn (router input rin) into out. */
static void moe(fwd_run *r, int li, const float *rin, const float *xn, float *out) {
  float *logits = r->s->buf[2];
  r->be->matmul(r->be, logits, rin, r->n, &r->m->layers[li].router, NULL);
  moe_routed(r, li, logits, xn, out);
}

/* x += s->res (the mixer's output), then the FFN block. With defer, the FFN's own residual
 * add is left to the caller (returns 1: s->res must still be added into x), who fuses it
 * with the next norm. */
static int layer_ffn(fwd_run *r, int li, float *x, int defer) {
  const anna_model *m = r->m;
  const model_config *c = &m->cfg;
  const layer_config *lc = &c->layers[li];
  const layer_weights *w = &m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n, H = c->hidden;
  float *xn = s->xn, *res = s->res;
  add_norm(r, x, res, xn, w->pre_ff_norm, n, (int)H);
  if (c->arch == MODEL_ARCH_GEMMA4 && lc->is_moe) {
    /* Dense MLP and experts side by side, each with its own post-norm. */
    mlp(r, &w->gate, &w->up, &w->down, xn, res);
    norm(r, res, res, w->post_ff_norm1, n, (int)H);
    float *rin = s->logits_in; /* router input: rmsnorm(x) * scale / sqrt(H) */
    be->rmsnorm(be, rin, x, w->router_scale, n, (int)H, (float)c->eps, 0);
    be->scale(be, rin, 1.0f / sqrtf((float)H), n * H);
    norm(r, xn, x, w->pre_ff_norm2, n, (int)H);
    float *e = s->buf[3];
    moe(r, li, rin, xn, e);
    norm(r, e, e, w->post_ff_norm2, n, (int)H);
    be->add(be, res, e, n * H);
  } else if (lc->is_moe && w->sx_gate && be->matmul_group_route && w->router.rows == c->n_experts) {
    /* The shared expert as expert E of the routed ones (one gate/up and one down launch for
     * all k + 1 on a device backend): the router and the shared gate logit in one group,
     * whose route appends slot (E, sigmoid(logit)) to each token's k. */
    float *logits = s->buf[2], *sg = s->buf[4];
    float *ys[2] = {logits, sg};
    const ops_weight *ws[2] = {&w->router, &w->sh_gate_inp};
    be->matmul_group_route(be, 2, ys, xn, n, ws, NULL, 0, s->moe_idx, s->moe_w, c->top_k, c->norm_topk,
                           w->per_expert_scale, 1);
    be->moe_ffn(be, res, xn, n, c->hidden, s->moe_idx, s->moe_w, c->top_k + 1, c->n_experts + 1, w->sx_gate, w->sx_up,
                w->sx_down, c->act, s->moe_scratch);
  } else if (lc->is_moe && w->has_shared) {
    /* The router and the shared expert's gate, up and gate logit all read xn: one group
     * first (buf[0], [1], [4] are left alone by the routed experts, which use their own
     * scratch), then the experts into res, then the rest of the shared expert. */
    float *g = s->buf[0], *u = s->buf[1], *logits = s->buf[2], *sh = s->buf[3], *sg = s->buf[4];
    const int64_t S = w->sh_gate.rows;
    float *ys[4] = {logits, g, u, sg};
    const ops_weight *ws[4] = {&w->router, &w->sh_gate, &w->sh_up, &w->sh_gate_inp};
    if (be->matmul_group_route && w->router.rows == c->n_experts) { /* the route folded into the group */
      be->matmul_group_route(be, 4, ys, xn, n, ws, NULL, 0, s->moe_idx, s->moe_w, c->top_k, c->norm_topk,
                             w->per_expert_scale, -1);
      be->moe_ffn(be, res, xn, n, c->hidden, s->moe_idx, s->moe_w, c->top_k, c->n_experts, w->exp_gate, w->exp_up,
                  w->exp_down, c->act, s->moe_scratch);
    } else {
      project(r, 4, ys, xn, ws, NULL);
      moe_routed(r, li, logits, xn, res);
    }
    act_down_gated_add(r, res, sh, g, u, S, sg, &w->sh_down);
  } else if (lc->is_moe) {
    moe(r, li, xn, xn, res);
  } else {
    mlp(r, &w->gate, &w->up, &w->down, xn, res);
  }
  if (c->post_norms) norm(r, res, res, w->post_ff_norm, n, (int)H);
  if (defer) return 1;
  be->add(be, x, res, n * H);
  return 0;
}

/* Gemma4 per-layer inputs for the batch: ple[n, L, P]. */
static void ple_inputs(fwd_run *r, const float *emb) {
  const anna_model *m = r->m;
  const model_config *c = &m->cfg;
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n, LP = (int64_t)c->n_layers * c->ple_dim;
  float *tok = s->buf[0];
  be->embed(be, tok, &m->ple_embed, s->tokens, n, sqrtf((float)c->ple_dim));
  be->matmul(be, s->ple, emb, n, &m->ple_model_proj, NULL);
  be->scale(be, s->ple, 1.0f / sqrtf((float)c->hidden), n * LP);
  norm(r, s->ple, s->ple, m->ple_proj_norm, n * c->n_layers, c->ple_dim);
  be->add(be, s->ple, tok, n * LP);
  be->scale(be, s->ple, 1.0f / sqrtf(2.0f), n * LP);
}

static void layer_ple(fwd_run *r, int li, float *x) {
  const anna_model *m = r->m;
  const model_config *c = &m->cfg;
  const layer_weights *w = &m->layers[li];
  ops_backend *be = r->be;
  fwd_state *s = r->s;
  const int64_t n = r->n, P = c->ple_dim, LP = (int64_t)c->n_layers * P;
  float *g = s->buf[0], *o = s->res;
  be->matmul(be, g, x, n, &w->ple_gate, NULL);
  be->act_mul(be, g, g, s->ple + li * P, n, (int)P, P, LP, ACT_KIND_GELU_TANH);
  be->matmul(be, o, g, n, &w->ple_proj, NULL);
  norm(r, o, o, w->ple_post_norm, n, c->hidden);
  be->add(be, x, o, n * c->hidden);
}

/* Checks the batch against the state and splits it into per-sequence runs. */
static int plan_batch(fwd_run *r, char *err, size_t errlen) {
  const anna_batch *b = r->b;
  fwd_state *s = r->s;
  const model_config *c = &r->m->cfg;
  if (b->n < 1 || b->n > s->n_batch)
    return anna_err(err, errlen, ANNA_EINVAL, "batch of %d tokens (allowed 1..%d)", b->n, s->n_batch);
  r->n_runs = 0;
  for (int32_t i = 0; i < b->n; i++) {
    if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab)
      return anna_err(err, errlen, ANNA_ERANGE, "token id %d out of range (vocab %d)", b->tokens[i], c->vocab);
    if (b->seq[i] < 0 || b->seq[i] >= s->n_seq)
      return anna_err(err, errlen, ANNA_ERANGE, "sequence %d out of range (0..%d)", b->seq[i], s->n_seq - 1);
    if (i == 0 || b->seq[i] != b->seq[i - 1]) {
      for (int q = 0; q < r->n_runs; q++)
        if (s->run_seq[q] == b->seq[i])
          return anna_err(err, errlen, ANNA_EINVAL, "tokens of sequence %d are not consecutive in the batch", b->seq[i]);
      s->run_start[r->n_runs] = i;
      s->run_len[r->n_runs] = 0;
      s->run_seq[r->n_runs] = b->seq[i];
      r->n_runs++;
    }
    int32_t expect = s->len[b->seq[i]] + s->run_len[r->n_runs - 1];
    if (b->pos[i] != expect)
      return anna_err(err, errlen, ANNA_EINVAL, "token %d of sequence %d has position %d, expected %d", i, b->seq[i],
                      b->pos[i], expect);
    if (b->pos[i] >= s->n_ctx)
      return anna_err(err, errlen, ANNA_ERANGE, "sequence %d is full (context %d)", b->seq[i], s->n_ctx);
    s->run_len[r->n_runs - 1]++;
  }
  return 0;
}

int forward_batch(const anna_model *m, ops_backend *be, fwd_state *s, const anna_batch *b, float *out,
                  const fwd_topk *tk, char *err, size_t errlen) {
  fwd_run r = {m, be, s, b, b->n, 0, 0};
  for (int32_t i = 0; i < b->n; i++)
    if (b->pos[i] + 1 > r.keys_hint) r.keys_hint = b->pos[i] + 1;
  if (tk && (tk->k < 1 || tk->k > OPS_TOPK_MAX || tk->k > m->cfg.vocab || !be->topk))
    return anna_err(err, errlen, tk->k < 1 || tk->k > OPS_TOPK_MAX ? ANNA_EINVAL : ANNA_EUNSUPPORTED,
                    "top-%d candidates: %s", tk->k,
                    !be->topk ? "the backend has no topk op" : "k must be 1..256 and at most the vocabulary");
  s->last_nl = 0;
  int rc = plan_batch(&r, err, errlen);
  if (rc) return rc;
  const model_config *c = &m->cfg;
  const int64_t n = b->n, H = c->hidden;
  /* KV blocks for every position the batch writes (the only step that can run out). */
  for (int ri = 0; ri < r.n_runs; ri++) {
    const int q = s->run_seq[ri];
    if ((rc = seq_ensure(s, q, s->len[q], s->len[q] + s->run_len[ri], err, errlen))) return rc;
  }
  for (int32_t i = 0; i < b->n; i++) s->stok[(int64_t)b->seq[i] * s->n_ctx + b->pos[i]] = b->tokens[i];
  int32_t ncut = 0;
  for (int ri = 0; ri < r.n_runs; ri++) {
    const int q = s->run_seq[ri];
    const int32_t from = s->len[q], to = from + s->run_len[ri];
    s->run_ncut[ri] = 0;
    s->run_cut0[ri] = ncut;
    if (!s->share[q]) continue;
    /* Chain hashes of the blocks this run completes. */
    uint64_t *bh = s->bhash + (int64_t)q * s->max_bps;
    for (int32_t j = from >> s->bshift; (j + 1) << s->bshift <= to; j++)
      bh[j] = block_hash(j ? bh[j - 1] : 0, s->stok + (int64_t)q * s->n_ctx + ((int64_t)j << s->bshift),
                         s->block_len);
    /* GDN: snapshot the state at every snap_every-th boundary the run passes and at the
     * last boundary it reaches (the end of a prompt chunk, or a decode step filling a block). */
    const int32_t edge = to & ~(s->block_len - 1);
    if (!s->n_ckpt || edge <= from) continue;
    for (int32_t bnd = ((from >> s->bshift) + 1) << s->bshift; bnd <= edge; bnd += s->block_len) {
      if (bnd != edge && (!s->snap_every || bnd % s->snap_every)) continue;
      const uint64_t hj = bh[(bnd >> s->bshift) - 1];
      struct fwd_ckpt *k = snap_find(s, hj);
      if (k) {
        k->tick = ++s->tick;
        continue;
      }
      k = ckpt_pick(s);
      k->seq = q;
      k->pos = bnd;
      k->hashed = 1;
      k->hash = hj;
      k->tick = ++s->tick;
      s->cut_at[ncut] = bnd - from;
      s->cut_slot[ncut] = (int32_t)(k - s->ckpt);
      ncut++;
      s->run_ncut[ri]++;
    }
  }
  tab_upload(s);
  /* A fresh sequence starts with zero recurrent state. */
  for (int ri = 0; ri < r.n_runs; ri++) {
    int q = s->run_seq[ri];
    if (s->len[q] != 0) continue;
    for (int l = 0; l < c->n_layers; l++) {
      size_t at = (size_t)l * s->n_seq + q;
      if (s->conv[at])
        be->memset0(be, s->conv[at], sizeof(float) * (size_t)(2 * c->gdn_hk * c->gdn_dk + c->gdn_hv * c->gdn_dv) *
                                         (size_t)(c->gdn_conv - 1));
      if (s->ssm[at]) be->memset0(be, s->ssm[at], sizeof(float) * (size_t)c->gdn_hv * c->gdn_dk * c->gdn_dv);
    }
  }
  be->upload(be, s->tokens, b->tokens, sizeof(int32_t) * (size_t)n);
  be->upload(be, s->pos, b->pos, sizeof(int32_t) * (size_t)n);
  float *x = s->x;
  be->embed(be, x, &m->embed, s->tokens, n, c->embed_scale);
  if (c->ple_dim > 0) ple_inputs(&r, x);
  /* pend: s->res still has to be added into x (a layer's last residual add, fused with the
   * next norm; only where nothing else (PLE, layer scalar) comes between). */
  int pend = 0;
  for (int li = 0; li < c->n_layers; li++) {
    const layer_config *lc = &c->layers[li];
    const layer_weights *w = &m->layers[li];
    if (pend) add_norm(&r, x, s->res, s->xn, w->attn_norm, n, (int)H);
    else norm(&r, s->xn, x, w->attn_norm, n, (int)H);
    if (lc->kind == LAYER_KIND_GDN) layer_gdn(&r, li, s->xn, s->res);
    else layer_attention(&r, li, s->xn, s->res);
    if (w->post_attn_norm) norm(&r, s->res, s->res, w->post_attn_norm, n, (int)H);
    pend = layer_ffn(&r, li, x, c->ple_dim == 0 && w->layer_scalar == 1.0f);
    if (c->ple_dim > 0) layer_ple(&r, li, x);
    if (w->layer_scalar != 1.0f) be->scale(be, x, w->layer_scalar, n * H);
  }
  for (int ri = 0; ri < r.n_runs; ri++) {
    const int q = s->run_seq[ri];
    const int32_t from = s->len[q];
    s->len[q] += s->run_len[ri];
    if (s->share[q] == 2) seq_register(s, q, from >> s->bshift, s->len[q] >> s->bshift);
  }
  /* Logits only for the flagged tokens. */
  int64_t nl = 0;
  for (int64_t t = 0; t < n; t++) nl += !b->logits || b->logits[t];
  if (nl == n && pend) { /* every row: the last residual add and the final norm in one */
    add_norm(&r, x, s->res, s->logits_in, m->final_norm, n, (int)H);
  } else {
    if (pend) be->add(be, x, s->res, n * H);
    nl = 0;
    for (int64_t t = 0; t < n; t++)
      if (!b->logits || b->logits[t]) be->copy_rows(be, s->logits_in + (nl++) * H, H, x + t * H, H, 1, (int)H);
    if (nl == 0) return 0;
    norm(&r, s->logits_in, s->logits_in, m->final_norm, nl, (int)H);
  }
  be->matmul(be, s->logits, s->logits_in, nl, &m->lm_head, NULL);
  if (c->final_softcap > 0) be->softcap(be, s->logits, nl * c->vocab, c->final_softcap);
  s->last_nl = nl;
  if (!tk) {
    be->download(be, out, s->logits, sizeof(float) * (size_t)(nl * c->vocab));
    return 0;
  }
  /* Candidates instead of the logits: the op runs inside the step (a graph node on CUDA),
   * then one download of a few KB. The logits stay for fwd_state_logits_row. */
  const int k = tk->k;
  double *st = s->tk_dev;
  int32_t *ti = (int32_t *)(st + 2 * nl);
  float *tv = (float *)(ti + nl * k);
  be->topk(be, ti, tv, st, s->logits, nl, c->vocab, k, tk->temp);
  const size_t bytes = (size_t)nl * (2 * sizeof(double) + (size_t)k * (sizeof(int32_t) + sizeof(float)));
  be->download(be, s->tk_host, s->tk_dev, bytes);
  const double *hs = s->tk_host;
  const int32_t *hi = (const int32_t *)(hs + 2 * nl);
  memcpy(tk->stats, hs, sizeof(double) * 2 * (size_t)nl);
  memcpy(tk->idx, hi, sizeof(int32_t) * (size_t)(nl * k));
  memcpy(tk->val, hi + nl * k, sizeof(float) * (size_t)(nl * k));
  return 0;
}

int fwd_state_logits_row(const fwd_state *s, int64_t row, float *out, char *err, size_t errlen) {
  if (row < 0 || row >= s->last_nl)
    return anna_err(err, errlen, ANNA_ERANGE, "logits row %lld: the last decode left %lld rows", (long long)row,
                    (long long)s->last_nl);
  const int64_t V = s->cfg->vocab;
  s->be->download(s->be, out, s->logits + row * V, sizeof(float) * (size_t)V);
  return 0;
}
