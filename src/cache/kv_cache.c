/* kv_cache.c: creation, block tables, sequence operations (reset, rewind, copy, prefix
 * attach), plans and commits of the per-sequence model state (see kv_cache.h).
 */
#include "cache/kv_cache_internal.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

/* Backend memory (pools, tables, state) on be, tracked for kv_cache_free. */
static void *salloc_on(kv_cache *c, ops_backend *be, size_t bytes, int *fail) {
  if (*fail) return NULL;
  void *p = be->alloc(be, bytes ? bytes : 1);
  void **na = realloc(c->allocs, (c->n_allocs + 1) * sizeof *na);
  if (na) c->allocs = na;
  ops_backend **nb = na ? realloc(c->alloc_be, (c->n_allocs + 1) * sizeof *nb) : NULL;
  if (nb) c->alloc_be = nb;
  if (!p || !na || !nb) {
    if (p) be->free(be, p);
    *fail = 1;
    return NULL;
  }
  c->allocs[c->n_allocs] = p;
  c->alloc_be[c->n_allocs++] = be;
  return p;
}

/* Host memory (bookkeeping read on the CPU). */
static void *halloc(kv_cache *c, size_t bytes, int *fail) {
  void *p = calloc(1, bytes ? bytes : 1);
  void **na = realloc(c->hallocs, (c->n_hallocs + 1) * sizeof *na);
  if (!p || !na) {
    free(p);
    if (na) c->hallocs = na;
    *fail = 1;
    return NULL;
  }
  c->hallocs = na;
  c->hallocs[c->n_hallocs++] = p;
  return p;
}

int kv_cache_type_from_name(const char *q, int bits, int *type, char *err, size_t errlen) {
  if (!bits) bits = 4;
  if (!q || !strcmp(q, "none") || !strcmp(q, "auto")) *type = OPS_KV_F32;
  else if (!strcmp(q, "f16")) *type = OPS_KV_F16;
  else if (!strcmp(q, "q8")) *type = OPS_KV_Q8;
  else if (!strcmp(q, "q4")) *type = OPS_KV_Q4;
  else if (!strcmp(q, "turboquant") && bits >= 2 && bits <= 4) *type = OPS_KV_TQ2 + (bits - 2);
  else
    return anna_err(err, errlen, ANNA_EINVAL,
                    "KV-cache quantization '%s' (bits %d) is not one of none, f16, q8, q4, turboquant with 2-4 bits",
                    q, bits);
  return 0;
}

const char *kv_cache_type_name(int type) {
  static const char *const names[] = {"f32", "f16", "q8", "q4", "turboquant2", "turboquant3", "turboquant4"};
  return type >= OPS_KV_F32 && type <= OPS_KV_TQ4 ? names[type] : "unknown";
}

int kv_cache_auto_type(int64_t budget, const int64_t need[OPS_KV_TQ4 + 1]) {
  /* most bits per value first. q4 (4.5 bits) before turboquant 4 (4 + 32/d): on
   * Gaussian-like vectors q4's error is the lower (its scale per 32 values adapts), on
   * vectors with an outlier channel turboquant's is (test_kv_cache measures both); "least
   * lossy" is decided by the bits, not by a guess about the data. */
  static const int order[] = {OPS_KV_F32, OPS_KV_F16, OPS_KV_Q8, OPS_KV_Q4, OPS_KV_TQ4, OPS_KV_TQ3, OPS_KV_TQ2};
  const int n = (int)(sizeof order / sizeof order[0]);
  if (budget < 0) return OPS_KV_F32;
  int last = OPS_KV_F32;
  for (int i = 0; i < n; i++) {
    if (need[order[i]] <= 0) continue;
    if (need[order[i]] <= budget) return order[i];
    last = order[i];
  }
  return last;
}

/* Checks options that need no allocation; the messages are the ones anna_context_create
 * has always reported. */
static int options_check(ops_backend *be, const kv_cache_options *o, int block_len, char *err, size_t errlen) {
  if (o->n_seq < 1 || o->n_ctx < 1 || o->n_batch < 1 || o->n_seq > 4096 || o->n_batch > 1 << 20)
    return anna_err(err, errlen, ANNA_EINVAL, "bad context sizes (n_seq %d, n_ctx %d, n_batch %d)", o->n_seq,
                    o->n_ctx, o->n_batch);
  if (block_len < 16 || block_len > 4096 || (block_len & (block_len - 1)))
    return anna_err(err, errlen, ANNA_EINVAL, "KV block length %d is not a power of two in 16..4096", block_len);
  if (o->residual_len < 0 || o->residual_len > 1 << 20 || o->n_blocks < 0)
    return anna_err(err, errlen, ANNA_EINVAL, "bad KV options (residual %d, blocks %lld)", o->residual_len,
                    (long long)o->n_blocks);
  if (o->n_layers < 0 || (o->n_layers > 0 && !o->layers))
    return anna_err(err, errlen, ANNA_EINVAL, "bad KV layer layout (%d layers)", o->n_layers);
  for (int l = 0; l < o->n_layers; l++) {
    const kv_cache_layer *ly = &o->layers[l];
    if (ly->kind == KV_LAYER_ATTN && (ly->kv_source < 0 || ly->kv_source > l ||
                                      o->layers[ly->kv_source].kind != KV_LAYER_ATTN ||
                                      o->layers[ly->kv_source].kv_source != ly->kv_source))
      return anna_err(err, errlen, ANNA_EINVAL, "layer %d reads the KV cache of layer %d, which owns none", l,
                      ly->kv_source);
  }
  if (o->kv_type != OPS_KV_F32) {
    for (int l = 0; l < o->n_layers; l++) {
      const int d = o->layers[l].head_dim;
      if (o->layers[l].kind != KV_LAYER_ATTN) continue;
      if (d % 32 || (o->kv_type >= OPS_KV_TQ2 && ((d & (d - 1)) || d > 1024)))
        return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                        "KV-cache quantization needs head dims that are multiples of 32 (powers of two up to 1024 "
                        "for turboquant); layer %d has %d", l, d);
    }
    for (int l = -1; l < o->n_layers; l++) {
      const ops_backend *b = l >= 0 && o->layer_be && o->layer_be[l] ? o->layer_be[l] : be;
      if (!b->kv_store)
        return anna_err(err, errlen, ANNA_EUNSUPPORTED, "the %s backend has no quantized KV cache", b->name);
    }
  }
  return 0;
}

int kv_cache_create(kv_cache **out, ops_backend *be, const kv_cache_options *o, char *err, size_t errlen) {
  *out = NULL;
  const int block_len = o->block_len ? o->block_len : 64;
  int rc = options_check(be, o, block_len, err, errlen);
  if (rc) return rc;
  const int n_seq = o->n_seq, n_ctx = o->n_ctx, n_batch = o->n_batch, L = o->n_layers;
  const int max_bps = (int)(((int64_t)n_ctx + block_len - 1) / block_len);
  const int64_t n_blocks = o->n_blocks ? o->n_blocks : (int64_t)n_seq * max_bps;
  if (n_blocks > INT32_MAX / 2)
    return anna_err(err, errlen, ANNA_EINVAL, "KV pool of %lld blocks is too large", (long long)n_blocks);
  kv_cache *c = calloc(1, sizeof *c);
  if (!c) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  int fail = 0;
  c->be = be;
  c->n_seq = n_seq;
  c->n_ctx = n_ctx;
  c->n_batch = n_batch;
  c->n_layers = L;
  c->n_vocab = o->n_vocab;
  c->kv_type = o->kv_type;
  c->block_len = block_len;
  while ((1 << c->bshift) < block_len) c->bshift++;
  c->max_bps = max_bps;
  c->n_blocks = n_blocks;
  c->share_enabled = o->prefix_share;
  /* Snapshot points are block boundaries. */
  c->snap_every = o->snapshot_interval > 0 ? (o->snapshot_interval + block_len - 1) / block_len * block_len : 0;
  /* The residual ring only means something for a quantized cache. */
  c->resid = o->kv_type != OPS_KV_F32 ? o->residual_len : 0;
  c->ring_len = c->resid ? c->resid + n_batch : 0;
  c->conv_floats = o->conv_floats;
  c->ssm_floats = o->ssm_floats;
  const size_t nl = (size_t)L * (size_t)n_seq;
  c->lbe = halloc(c, (size_t)(L > 0 ? L : 1) * sizeof(ops_backend *), &fail);
  c->ltb = halloc(c, (size_t)(L > 0 ? L : 1) * sizeof(int), &fail);
  c->tb_be[c->n_tb++] = be;
  for (int l = 0; !fail && l < L; l++) {
    ops_backend *lb = o->layer_be && o->layer_be[l] ? o->layer_be[l] : be;
    int i = 0;
    while (i < c->n_tb && c->tb_be[i] != lb) i++;
    if (i == c->n_tb) {
      if (c->n_tb == KV_MAX_BACKENDS) {
        kv_cache_free(c);
        return anna_err(err, errlen, ANNA_EINVAL, "KV cache: layers on more than %d backends", KV_MAX_BACKENDS);
      }
      c->tb_be[c->n_tb++] = lb;
    }
    c->lbe[l] = lb;
    c->ltb[l] = i;
  }
  c->own_idx = halloc(c, (size_t)L * sizeof(int), &fail);
  c->owns = halloc(c, (size_t)L, &fail);
  c->is_state = halloc(c, (size_t)L, &fail);
  c->conv = halloc(c, nl * sizeof(float *), &fail);
  c->ssm = halloc(c, nl * sizeof(float *), &fail);
  c->len = halloc(c, (size_t)n_seq * sizeof(int32_t), &fail);
  for (int l = 0; !fail && l < L; l++) {
    c->own_idx[l] = -1;
    c->is_state[l] = o->layers[l].kind == KV_LAYER_STATE;
    c->n_state += c->is_state[l];
    if (o->layers[l].kind == KV_LAYER_ATTN && o->layers[l].kv_source == l) {
      c->owns[l] = 1;
      c->own_idx[l] = c->n_own++;
    }
  }
  c->has_state = c->n_state > 0;
  /* KV-shared layers read the pool of their source layer. */
  for (int l = 0; !fail && l < L; l++)
    if (o->layers[l].kind == KV_LAYER_ATTN && !c->owns[l]) c->own_idx[l] = c->own_idx[o->layers[l].kv_source];
  const int no = c->n_own > 0 ? c->n_own : 1;
  c->pool_k = halloc(c, (size_t)no * sizeof(uint8_t *), &fail);
  c->pool_v = halloc(c, (size_t)no * sizeof(uint8_t *), &fail);
  c->blk_bytes = halloc(c, (size_t)no * sizeof(int64_t), &fail);
  c->row_bytes = halloc(c, (size_t)no * sizeof(int64_t), &fail);
  c->row_floats = halloc(c, (size_t)no * sizeof(int64_t), &fail);
  c->ring_k = halloc(c, (size_t)no * n_seq * sizeof(float *), &fail);
  c->ring_v = halloc(c, (size_t)no * n_seq * sizeof(float *), &fail);
  c->obe = halloc(c, (size_t)no * sizeof(ops_backend *), &fail);
  for (int l = 0; !fail && l < L; l++) {
    if (!c->owns[l]) continue;
    const kv_cache_layer *ly = &o->layers[l];
    const int oi = c->own_idx[l];
    c->obe[oi] = c->lbe[l];
    c->row_bytes[oi] = (int64_t)ly->n_kv_heads * ops_kv_head_bytes(c->kv_type, ly->head_dim);
    c->row_floats[oi] = (int64_t)ly->n_kv_heads * ly->head_dim;
    c->blk_bytes[oi] = c->row_bytes[oi] * block_len;
    c->pool_k[oi] = salloc_on(c, c->obe[oi], (size_t)(c->blk_bytes[oi] * n_blocks), &fail);
    c->pool_v[oi] = salloc_on(c, c->obe[oi], (size_t)(c->blk_bytes[oi] * n_blocks), &fail);
    for (int q = 0; !fail && q < n_seq && c->resid; q++) {
      const size_t rf = (size_t)c->ring_len * (size_t)c->row_floats[oi];
      c->ring_k[(size_t)oi * n_seq + q] = salloc_on(c, c->obe[oi], rf * sizeof(float), &fail);
      c->ring_v[(size_t)oi * n_seq + q] = salloc_on(c, c->obe[oi], rf * sizeof(float), &fail);
    }
  }
  c->blk = halloc(c, (size_t)n_blocks * sizeof *c->blk, &fail);
  c->blk_tok = halloc(c, (size_t)n_blocks * (size_t)block_len * sizeof(int32_t), &fail);
  c->free_ids = halloc(c, (size_t)n_blocks * sizeof(int32_t), &fail);
  for (c->hcap = 16; c->hcap < 2 * n_blocks;) c->hcap *= 2;
  c->hidx = halloc(c, (size_t)c->hcap * sizeof(int32_t), &fail);
  const size_t ntab = (size_t)n_seq * (size_t)max_bps;
  c->tab_id = halloc(c, ntab * sizeof(int32_t), &fail);
  c->nblk = halloc(c, (size_t)n_seq * sizeof(int32_t), &fail);
  c->tab_h = halloc(c, ntab * (size_t)no * 2 * sizeof(void *), &fail);
  for (int i = 0; i < c->n_tb; i++) c->tb_d[i] = salloc_on(c, c->tb_be[i], ntab * (size_t)no * 2 * sizeof(void *), &fail);
  c->tab_dirty = halloc(c, (size_t)n_seq, &fail);
  c->stok = halloc(c, (size_t)n_seq * (size_t)n_ctx * sizeof(int32_t), &fail);
  c->bhash = halloc(c, ntab * sizeof(uint64_t), &fail);
  c->share = halloc(c, (size_t)n_seq, &fail);
  c->cand = halloc(c, (size_t)max_bps * sizeof(int32_t), &fail);
  if (!fail) {
    for (int64_t i = 0; i < c->hcap; i++) c->hidx[i] = -1;
    for (size_t i = 0; i < ntab; i++) c->tab_id[i] = -1;
    /* Popped from the top: low ids first (a deterministic layout). */
    for (int64_t i = 0; i < n_blocks; i++) c->free_ids[i] = (int32_t)(n_blocks - 1 - i);
    c->n_free = n_blocks;
  }
  for (int l = 0; !fail && l < L; l++)
    for (int q = 0; !fail && q < n_seq && c->is_state[l]; q++) {
      const size_t at = (size_t)l * n_seq + q;
      c->conv[at] = salloc_on(c, c->lbe[l], (size_t)c->conv_floats * sizeof(float), &fail);
      c->ssm[at] = salloc_on(c, c->lbe[l], (size_t)c->ssm_floats * sizeof(float), &fail);
    }
  c->n_ckpt = c->has_state && o->n_ckpt > 0 ? o->n_ckpt : 0;
  c->win_n = halloc(c, (size_t)n_seq * sizeof(int32_t), &fail);
  if (!fail) memset(c->win_n, 0, (size_t)n_seq * sizeof(int32_t));
  c->ckpt = halloc(c, (size_t)(c->n_ckpt + 1) * sizeof *c->ckpt, &fail);
  for (int i = 0; !fail && i < c->n_ckpt; i++) {
    kv_slot *k = &c->ckpt[i];
    k->seq = -1;
    k->conv = halloc(c, (size_t)L * sizeof(float *), &fail);
    k->ssm = halloc(c, (size_t)L * sizeof(float *), &fail);
    for (int l = 0; !fail && l < L; l++)
      if (c->is_state[l]) {
        k->conv[l] = salloc_on(c, c->lbe[l], (size_t)c->conv_floats * sizeof(float), &fail);
        k->ssm[l] = salloc_on(c, c->lbe[l], (size_t)c->ssm_floats * sizeof(float), &fail);
      }
  }
  const size_t n = (size_t)n_batch;
  c->run_start = halloc(c, n * sizeof(int32_t), &fail);
  c->run_len = halloc(c, n * sizeof(int32_t), &fail);
  c->run_seq = halloc(c, n * sizeof(int32_t), &fail);
  c->run_cut0 = halloc(c, n * sizeof(int32_t), &fail);
  c->run_ncut = halloc(c, n * sizeof(int32_t), &fail);
  c->cut_at = halloc(c, (2 * n + 1) * sizeof(int32_t), &fail);
  c->cut_slot = halloc(c, (2 * n + 1) * sizeof(int32_t), &fail);
  c->kp = halloc(c, n * sizeof(void *), &fail);
  c->vp = halloc(c, n * sizeof(void *), &fail);
  c->wk = halloc(c, n * sizeof(void *), &fail);
  c->wv = halloc(c, n * sizeof(void *), &fail);
  c->wrk = halloc(c, n * sizeof(float *), &fail);
  c->wrv = halloc(c, n * sizeof(float *), &fail);
  c->rkp = halloc(c, n * sizeof(float *), &fail);
  c->rvp = halloc(c, n * sizeof(float *), &fail);
  if (fail) {
    kv_cache_free(c);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory for %d sequences x %d positions", n_seq, n_ctx);
  }
  *out = c;
  return 0;
}

int64_t kv_cache_layer_bytes(const kv_cache *c, int l) {
  if (l < 0 || l >= c->n_layers) return 0;
  int64_t b = 0;
  if (c->owns[l]) {
    const int oi = c->own_idx[l];
    b += 2 * c->blk_bytes[oi] * c->n_blocks;
    b += 2 * (int64_t)c->ring_len * c->row_floats[oi] * (int64_t)sizeof(float) * c->n_seq;
  }
  if (c->is_state[l]) b += (c->conv_floats + c->ssm_floats) * (int64_t)sizeof(float) * (c->n_seq + c->n_ckpt);
  return b;
}

void kv_cache_free(kv_cache *c) {
  if (!c) return;
  for (size_t i = 0; i < c->n_allocs; i++) c->alloc_be[i]->free(c->alloc_be[i], c->allocs[i]);
  free(c->alloc_be);
  for (size_t i = 0; i < c->n_hallocs; i++) free(c->hallocs[i]);
  free(c->allocs);
  free(c->hallocs);
  free(c);
}

int64_t kv_cache_bytes_per_token(const kv_cache *c) {
  int64_t b = 0;
  for (int oi = 0; oi < c->n_own; oi++) b += 2 * c->row_bytes[oi];
  return b;
}

void kv_cache_stats(const kv_cache *c, anna_kv_stats *st) {
  *st = c->st;
  st->kv_type = c->kv_type;
  st->block_len = c->block_len;
  st->prefix_share = c->share_enabled;
  st->n_blocks = c->n_blocks;
  st->free_blocks = c->n_free;
  st->cached_blocks = 0;
  for (int64_t i = 0; i < c->n_blocks; i++) st->cached_blocks += c->blk[i].ref == 0 && c->blk[i].cached;
  st->pool_bytes = kv_cache_bytes_per_token(c) * c->block_len * c->n_blocks;
  int64_t ring_row = 0;
  for (int oi = 0; oi < c->n_own; oi++) ring_row += 2 * c->row_floats[oi] * 4;
  st->snapshot_bytes = (int64_t)c->n_ckpt * c->n_state * (c->conv_floats + c->ssm_floats) * 4;
  st->ring_bytes = ring_row * c->ring_len * c->n_seq;
  st->n_snapshots = 0;
  for (int i = 0; i < c->n_ckpt; i++) st->n_snapshots += c->ckpt[i].hashed;
}

int32_t kv_cache_seq_len(const kv_cache *c, int seq) {
  return seq >= 0 && seq < c->n_seq ? c->len[seq] : -1;
}

/* ---- block tables ---- */

/* Entry j of seq's table is block b (host mirror; uploaded by the next plan). */
static void tab_set(kv_cache *c, int seq, int j, int32_t b) {
  c->tab_id[(int64_t)seq * c->max_bps + j] = b;
  for (int oi = 0; oi < c->n_own; oi++) {
    void **t = c->tab_h + ((int64_t)seq * c->n_own + oi) * 2 * c->max_bps;
    t[j] = c->pool_k[oi] + (int64_t)b * c->blk_bytes[oi];
    t[c->max_bps + j] = c->pool_v[oi] + (int64_t)b * c->blk_bytes[oi];
  }
  c->tab_dirty[seq] = 1;
}

/* seq keeps its first `keep` table entries; the rest are released. */
static void seq_release(kv_cache *c, int seq, int32_t keep) {
  int32_t *t = c->tab_id + (int64_t)seq * c->max_bps;
  for (int32_t j = keep; j < c->nblk[seq]; j++) {
    kv_blk_unref(c, t[j]);
    t[j] = -1;
  }
  if (c->nblk[seq] > keep) c->nblk[seq] = keep;
}

/* Makes positions [from, to) of seq writable: fresh blocks where the table ends, and a
 * private copy of any block it shares or that the prefix index holds (copy on write). */
static int seq_ensure(kv_cache *c, int seq, int32_t from, int32_t to, char *err, size_t errlen) {
  const int32_t j0 = from >> c->bshift, j1 = (to - 1) >> c->bshift;
  int32_t *t = c->tab_id + (int64_t)seq * c->max_bps;
  for (int32_t j = j0; j <= j1 && j < c->nblk[seq]; j++) {
    const int32_t b = t[j];
    if (c->blk[b].ref == 1 && !c->blk[b].cached) continue;
    const int32_t nb = kv_blk_alloc(c);
    if (nb < 0) goto full;
    const int64_t rows = j == j0 ? (from & (c->block_len - 1)) : 0;
    for (int oi = 0; rows > 0 && oi < c->n_own; oi++) {
      const int64_t rb = c->row_bytes[oi], off_n = (int64_t)nb * c->blk_bytes[oi],
                    off_b = (int64_t)b * c->blk_bytes[oi];
      ops_backend *ob = c->obe[oi];
      ob->copy(ob, c->pool_k[oi] + off_n, c->pool_k[oi] + off_b, (size_t)(rows * rb));
      ob->copy(ob, c->pool_v[oi] + off_n, c->pool_v[oi] + off_b, (size_t)(rows * rb));
    }
    kv_blk_unref(c, b);
    tab_set(c, seq, j, nb);
    c->st.cow_copies++;
  }
  while (c->nblk[seq] <= j1) {
    const int32_t nb = kv_blk_alloc(c);
    if (nb < 0) goto full;
    tab_set(c, seq, c->nblk[seq]++, nb);
  }
  return 0;
full:
  return anna_err(err, errlen, ANNA_ERANGE,
                  "KV cache full: no free block for sequence %d (pool of %lld blocks of %d positions, all in use)",
                  seq, (long long)c->n_blocks, c->block_len);
}

int64_t kv_cache_seq_blocks_needed(const kv_cache *c, int seq, int32_t n) {
  if (seq < 0 || seq >= c->n_seq) return ANNA_ERANGE;
  if (n <= 0) return 0;
  /* seq_ensure's walk, counting instead of allocating. */
  const int32_t from = c->len[seq], j0 = from >> c->bshift, j1 = (from + n - 1) >> c->bshift;
  const int32_t *t = c->tab_id + (int64_t)seq * c->max_bps;
  int64_t need = 0;
  for (int32_t j = j0; j <= j1 && j < c->nblk[seq]; j++)
    need += !(c->blk[t[j]].ref == 1 && !c->blk[t[j]].cached);
  if (j1 >= c->nblk[seq]) need += j1 + 1 - c->nblk[seq];
  return need;
}

int64_t kv_cache_seq_blocks_held(const kv_cache *c, int seq) {
  if (seq < 0 || seq >= c->n_seq) return ANNA_ERANGE;
  const int32_t *t = c->tab_id + (int64_t)seq * c->max_bps;
  int64_t held = 0;
  for (int32_t j = 0; j < c->nblk[seq]; j++)
    held += c->blk[t[j]].ref == 1;
  return held;
}

/* Registers seq's full blocks [j0, j1) in the prefix index (hashes already in bhash). */
static void seq_register(kv_cache *c, int seq, int32_t j0, int32_t j1) {
  const int32_t *t = c->tab_id + (int64_t)seq * c->max_bps;
  const uint64_t *bh = c->bhash + (int64_t)seq * c->max_bps;
  for (int32_t j = j0; j < j1; j++) {
    const int32_t b = t[j];
    const uint64_t parent = j ? bh[j - 1] : 0;
    const int32_t *tok = c->stok + (int64_t)seq * c->n_ctx + (int64_t)j * c->block_len;
    if (c->blk[b].cached || kv_index_find(c, bh[j], parent, tok, c->block_len) >= 0) continue; /* already known */
    c->blk[b].cached = 1;
    c->blk[b].fill = c->block_len;
    c->blk[b].hash = bh[j];
    c->blk[b].parent = parent;
    memcpy(c->blk_tok + (int64_t)b * c->block_len, tok, sizeof(int32_t) * (size_t)c->block_len);
    kv_index_insert(c, b);
  }
}

/* Pushes the host mirror of dirty block tables to the backend. */
static void tab_upload(kv_cache *c) {
  const int64_t per = (int64_t)c->n_own * 2 * c->max_bps;
  for (int q = 0; q < c->n_seq; q++)
    if (c->tab_dirty[q]) {
      for (int i = 0; i < c->n_tb; i++)
        c->tb_be[i]->upload(c->tb_be[i], c->tb_d[i] + q * per, c->tab_h + q * per, sizeof(void *) * (size_t)per);
      c->tab_dirty[q] = 0;
    }
}

/* ---- sequences ---- */

/* A registering sequence that ends mid-block leaves that block in the index as a partial
 * block (its first len % block_len positions), and with state layers its final state as a
 * snapshot: the next turn of a conversation reuses everything up to where this one ended. */
static void seq_register_tail(kv_cache *c, int seq) {
  const int32_t len = c->len[seq], p = len & (c->block_len - 1), j = len >> c->bshift;
  if (c->share[seq] != 2 || p == 0 || j >= c->nblk[seq] || (c->has_state && !c->n_ckpt)) return;
  const int32_t b = c->tab_id[(int64_t)seq * c->max_bps + j];
  const uint64_t parent = j ? c->bhash[(int64_t)seq * c->max_bps + j - 1] : 0;
  const int32_t *tok = c->stok + (int64_t)seq * c->n_ctx + ((int64_t)j << c->bshift);
  const uint64_t h = kv_partial_hash(parent, tok, p);
  if (c->has_state && !kv_snap_find(c, h)) {
    kv_slot *k = kv_slot_pick(c);
    k->seq = -1;
    k->hashed = 1;
    k->hash = h;
    k->tick = ++c->tick;
    kv_state_copy(c, k->conv, k->ssm, 1, c->conv + seq, c->ssm + seq, c->n_seq);
  }
  kv_blk *k = &c->blk[b];
  if (k->ref != 1 || k->cached || kv_index_find(c, h, parent, tok, p) >= 0) return;
  k->cached = 1;
  k->fill = p;
  k->hash = h;
  k->parent = parent;
  memcpy(c->blk_tok + (int64_t)b * c->block_len, tok, sizeof(int32_t) * (size_t)p);
  kv_index_insert(c, b);
}

void kv_cache_seq_reset(kv_cache *c, int seq) {
  if (seq < 0 || seq >= c->n_seq) return;
  seq_register_tail(c, seq);
  /* Recurrent state is zeroed when the sequence restarts (kv_cache_plan). */
  c->len[seq] = 0;
  seq_release(c, seq, 0);
  c->share[seq] = 0;
  kv_slot_invalidate(c, seq, 0);
}

/* With a residual ring, positions (n - resid, n] must still be in src's ring (it holds
 * the newest ring_len positions of src's length len). */
static int ring_check(const kv_cache *c, int src, int32_t n, char *err, size_t errlen) {
  if (!c->resid || n - c->resid <= 0 || n - c->resid >= c->len[src] - c->ring_len) return 0;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "sequence %d no longer holds f32 rows for positions before %d (--kv-cache-residual-len %d)", src,
                  n, c->resid);
}

int kv_cache_seq_rewind(kv_cache *c, int seq, int32_t n, char *err, size_t errlen) {
  if (seq < 0 || seq >= c->n_seq) return anna_err(err, errlen, ANNA_ERANGE, "sequence %d out of range", seq);
  if (n < 0 || n > c->len[seq])
    return anna_err(err, errlen, ANNA_ERANGE, "cannot rewind sequence %d of length %d to %d", seq, c->len[seq], n);
  if (n == 0) {
    const int share = c->share[seq];
    kv_cache_seq_reset(c, seq);
    c->share[seq] = (uint8_t)share;
    return 0;
  }
  float **conv, **ssm;
  int stride = 1;
  int rc = ring_check(c, seq, n, err, errlen);
  if (!rc) rc = kv_state_source(c, seq, n, &conv, &ssm, &stride, err, errlen);
  if (rc) return rc;
  if (conv && conv != c->conv + seq) kv_state_copy(c, c->conv + seq, c->ssm + seq, c->n_seq, conv, ssm, stride);
  c->len[seq] = n;
  seq_release(c, seq, (n + c->block_len - 1) >> c->bshift);
  kv_slot_invalidate(c, seq, n);
  return 0;
}

int kv_cache_seq_copy(kv_cache *c, int dst, int src, int32_t n, char *err, size_t errlen) {
  if (dst < 0 || dst >= c->n_seq || src < 0 || src >= c->n_seq || dst == src)
    return anna_err(err, errlen, ANNA_ERANGE, "bad sequence pair %d <- %d", dst, src);
  if (n < 0 || n > c->len[src])
    return anna_err(err, errlen, ANNA_ERANGE, "cannot copy %d positions of sequence %d (length %d)", n, src,
                    c->len[src]);
  float **conv = NULL, **ssm = NULL;
  int stride = 1;
  if (n > 0) {
    int rc = ring_check(c, src, n, err, errlen);
    if (!rc) rc = kv_state_source(c, src, n, &conv, &ssm, &stride, err, errlen);
    if (rc) return rc;
  }
  kv_slot_invalidate(c, dst, 0);
  seq_release(c, dst, 0);
  /* The blocks are shared, not copied: whoever writes into a shared block first copies it. */
  const int32_t nb = (n + c->block_len - 1) >> c->bshift;
  const int32_t *st = c->tab_id + (int64_t)src * c->max_bps;
  for (int32_t j = 0; j < nb; j++) {
    c->blk[st[j]].ref++;
    tab_set(c, dst, j, st[j]);
  }
  c->nblk[dst] = nb;
  memcpy(c->stok + (int64_t)dst * c->n_ctx, c->stok + (int64_t)src * c->n_ctx, sizeof(int32_t) * (size_t)n);
  memcpy(c->bhash + (int64_t)dst * c->max_bps, c->bhash + (int64_t)src * c->max_bps, sizeof(uint64_t) * (size_t)nb);
  c->share[dst] = c->share[src];
  for (int oi = 0; c->resid && oi < c->n_own; oi++) {
    const size_t bytes = (size_t)c->ring_len * (size_t)c->row_floats[oi] * sizeof(float);
    ops_backend *ob = c->obe[oi];
    ob->copy(ob, c->ring_k[(size_t)oi * c->n_seq + dst], c->ring_k[(size_t)oi * c->n_seq + src], bytes);
    ob->copy(ob, c->ring_v[(size_t)oi * c->n_seq + dst], c->ring_v[(size_t)oi * c->n_seq + src], bytes);
  }
  if (conv) kv_state_copy(c, c->conv + dst, c->ssm + dst, c->n_seq, conv, ssm, stride);
  c->len[dst] = n;
  return 0;
}

int32_t kv_cache_prefix_attach(kv_cache *c, int seq, const int32_t *tokens, int32_t n, int register_blocks) {
  if (seq < 0 || seq >= c->n_seq) return ANNA_ERANGE;
  kv_cache_seq_reset(c, seq);
  if (!c->share_enabled || n <= 0 || !tokens) return 0;
  if (n > c->n_ctx) n = c->n_ctx;
  c->share[seq] = register_blocks ? 2 : 1;
  c->st.lookups++;
  c->st.lookup_tokens += (uint64_t)n;
  /* Rows reused from blocks were never written to this sequence's f32 residual ring (and
   * the quantized rows cannot refill it), so with a ring nothing is reused. */
  if (c->resid) return 0;
  const int32_t full = n >> c->bshift;
  uint64_t h = 0, *bh = c->bhash + (int64_t)seq * c->max_bps;
  int32_t best = 0, found = 0;
  kv_slot *snap = NULL;
  for (int32_t j = 0; j < full; j++) {
    const int32_t *tok = tokens + (int64_t)j * c->block_len;
    const uint64_t hj = kv_block_hash(h, tok, c->block_len);
    const int32_t b = kv_index_find(c, hj, h, tok, c->block_len);
    if (b < 0) break;
    c->cand[j] = b;
    bh[j] = hj;
    h = hj;
    found = j + 1;
    if (!c->has_state) {
      best = j + 1;
    } else {
      kv_slot *k = kv_snap_find(c, hj);
      if (k) best = j + 1, snap = k;
    }
  }
  /* Then the block after the matched ones, cut short. With state layers: a partial block
   * that a finished sequence left, at exactly its length, and only with the end state saved
   * for it (the recurrent state exists only where a snapshot was taken). Attention-only
   * models cut any cached block that follows the matched chain at the longest common token
   * prefix (the partial blocks included, and e.g. the shared chat-template header of two
   * different prompts); writing past the cut copies the block first (seq_ensure: it is
   * cached). The scan of the pool runs once per request: cheap next to any prefill. */
  int32_t pfill = 0, pb = -1;
  const int32_t rest = n - (found << c->bshift);
  const int32_t lim = rest < c->block_len - 1 ? rest : c->block_len - 1;
  const int32_t *tok = tokens + ((int64_t)found << c->bshift);
  if (c->has_state) {
    for (int32_t p = lim; p > 0 && pb < 0; p--) {
      const uint64_t hp = kv_partial_hash(h, tok, p);
      const int32_t b = kv_index_find(c, hp, h, tok, p);
      kv_slot *k = b >= 0 ? kv_snap_find(c, hp) : NULL;
      if (!k) continue;
      pb = b, pfill = p, best = found, snap = k;
    }
  } else {
    for (int64_t b = 0; b < c->n_blocks; b++) {
      const kv_blk *k = &c->blk[b];
      if (!k->cached || k->parent != h || k->fill <= pfill) continue;
      const int32_t *bt = c->blk_tok + b * c->block_len, m = lim < k->fill ? lim : k->fill;
      int32_t cp = 0;
      while (cp < m && bt[cp] == tok[cp]) cp++;
      if (cp > pfill) pfill = cp, pb = (int32_t)b;
    }
  }
  for (int32_t j = 0; j < best; j++) {
    c->blk[c->cand[j]].ref++;
    tab_set(c, seq, j, c->cand[j]);
  }
  c->nblk[seq] = best;
  if (pb >= 0) {
    c->blk[pb].ref++;
    tab_set(c, seq, best, pb);
    c->nblk[seq] = best + 1;
  }
  const int32_t len = (best << c->bshift) + pfill;
  memcpy(c->stok + (int64_t)seq * c->n_ctx, tokens, sizeof(int32_t) * (size_t)len);
  if (snap) {
    snap->tick = ++c->tick;
    kv_state_copy(c, c->conv + seq, c->ssm + seq, c->n_seq, snap->conv, snap->ssm, 1);
  }
  c->len[seq] = len;
  c->st.hit_blocks += (uint64_t)best;
  c->st.miss_blocks += (uint64_t)(full - best - (pfill && best < full ? 1 : 0));
  c->st.hit_tokens += (uint64_t)len;
  return len;
}

/* ---- plans ---- */

/* Checks the batch against the state and splits it into per-sequence runs. */
static int plan_runs(kv_cache *c, const anna_batch *b, kv_plan *p, char *err, size_t errlen) {
  if (b->n < 1 || b->n > c->n_batch)
    return anna_err(err, errlen, ANNA_EINVAL, "batch of %d tokens (allowed 1..%d)", b->n, c->n_batch);
  p->n_runs = 0;
  for (int32_t i = 0; i < b->n; i++) {
    if (b->tokens[i] < 0 || b->tokens[i] >= c->n_vocab)
      return anna_err(err, errlen, ANNA_ERANGE, "token id %d out of range (vocab %d)", b->tokens[i], c->n_vocab);
    if (b->seq[i] < 0 || b->seq[i] >= c->n_seq)
      return anna_err(err, errlen, ANNA_ERANGE, "sequence %d out of range (0..%d)", b->seq[i], c->n_seq - 1);
    if (i == 0 || b->seq[i] != b->seq[i - 1]) {
      for (int q = 0; q < p->n_runs; q++)
        if (c->run_seq[q] == b->seq[i])
          return anna_err(err, errlen, ANNA_EINVAL, "tokens of sequence %d are not consecutive in the batch",
                          b->seq[i]);
      c->run_start[p->n_runs] = i;
      c->run_len[p->n_runs] = 0;
      c->run_seq[p->n_runs] = b->seq[i];
      p->n_runs++;
    }
    const int32_t expect = c->len[b->seq[i]] + c->run_len[p->n_runs - 1];
    if (b->pos[i] != expect)
      return anna_err(err, errlen, ANNA_EINVAL, "token %d of sequence %d has position %d, expected %d", i, b->seq[i],
                      b->pos[i], expect);
    if (b->pos[i] >= c->n_ctx)
      return anna_err(err, errlen, ANNA_ERANGE, "sequence %d is full (context %d)", b->seq[i], c->n_ctx);
    c->run_len[p->n_runs - 1]++;
  }
  return 0;
}

int32_t kv_cache_window(kv_cache *c, int seq, int32_t n) {
  if (!c->has_state || seq < 0 || seq >= c->n_seq || n <= 0) return 0;
  const int32_t had = c->win_n[seq] ? c->win_n[seq] + 3 : 0;
  if (c->win_slots - had + n + 3 > c->n_ckpt) return 0;
  c->win_slots += n + 3 - had;
  c->win_n[seq] = n;
  return n;
}

/* Window cuts (kv_cache_window) of run ri: after each of its first win_n tokens but the
 * last (the state after the last is the live one), merged in order with the run's
 * block-boundary cuts. */
static void plan_window_cuts(kv_cache *c, int ri, int32_t win_n, int32_t *ncut) {
  const int q = c->run_seq[ri];
  const int32_t from = c->len[q], m = win_n < c->run_len[ri] - 1 ? win_n : c->run_len[ri] - 1;
  for (int32_t i = 1; i <= m; i++) {
    kv_slot *k = kv_slot_find(c, q, from + i);
    if (!k) k = kv_slot_pick(c);
    k->seq = q;
    k->pos = from + i;
    k->hashed = 0;
    k->tick = ++c->tick;
    c->cut_at[*ncut] = i;
    c->cut_slot[*ncut] = (int32_t)(k - c->ckpt);
    (*ncut)++;
    c->run_ncut[ri]++;
  }
  /* insertion sort of the run's few cuts by position (a boundary and a window cut may
   * coincide: both slots get the same state) */
  int32_t *at = c->cut_at + c->run_cut0[ri], *sl = c->cut_slot + c->run_cut0[ri];
  for (int32_t i = 1; i < c->run_ncut[ri]; i++)
    for (int32_t j = i; j > 0 && at[j - 1] > at[j]; j--) {
      int32_t t = at[j];
      at[j] = at[j - 1], at[j - 1] = t;
      t = sl[j];
      sl[j] = sl[j - 1], sl[j - 1] = t;
    }
}

static int plan_batch(kv_cache *c, const anna_batch *b, kv_plan *p, char *err, size_t errlen) {
  p->run_start = c->run_start, p->run_len = c->run_len, p->run_seq = c->run_seq;
  p->run_cut0 = c->run_cut0, p->run_ncut = c->run_ncut, p->cut_at = c->cut_at, p->cut_slot = c->cut_slot;
  int rc = plan_runs(c, b, p, err, errlen);
  if (rc) return rc;
  /* KV blocks for every position the batch writes (the only step that can run out). */
  for (int ri = 0; ri < p->n_runs; ri++) {
    const int q = c->run_seq[ri];
    if ((rc = seq_ensure(c, q, c->len[q], c->len[q] + c->run_len[ri], err, errlen))) return rc;
  }
  /* the prefix index keys what the caller asked (kv_cache_next_keys), else the tokens */
  const int32_t *keys = c->next_keys ? c->next_keys : b->tokens;
  for (int32_t i = 0; i < b->n; i++) c->stok[(int64_t)b->seq[i] * c->n_ctx + b->pos[i]] = keys[i];
  int32_t ncut = 0;
  for (int ri = 0; ri < p->n_runs; ri++) {
    const int q = c->run_seq[ri];
    const int32_t from = c->len[q], to = from + c->run_len[ri];
    c->run_ncut[ri] = 0;
    c->run_cut0[ri] = ncut;
    if (!c->share[q]) {
      if (c->win_n[q]) plan_window_cuts(c, ri, c->win_n[q], &ncut);
      continue;
    }
    /* Chain hashes of the blocks this run completes. */
    uint64_t *bh = c->bhash + (int64_t)q * c->max_bps;
    for (int32_t j = from >> c->bshift; (j + 1) << c->bshift <= to; j++)
      bh[j] = kv_block_hash(j ? bh[j - 1] : 0, c->stok + (int64_t)q * c->n_ctx + ((int64_t)j << c->bshift),
                            c->block_len);
    /* Snapshot the state at every snap_every-th boundary the run passes and at the last
     * boundary it reaches (the end of a prompt chunk, or a decode step filling a block). */
    const int32_t edge = to & ~(c->block_len - 1);
    for (int32_t bnd = ((from >> c->bshift) + 1) << c->bshift; c->n_ckpt && bnd <= edge; bnd += c->block_len) {
      if (bnd != edge && (!c->snap_every || bnd % c->snap_every)) continue;
      const uint64_t hj = bh[(bnd >> c->bshift) - 1];
      kv_slot *k = kv_snap_find(c, hj);
      if (k) {
        k->tick = ++c->tick;
        continue;
      }
      k = kv_slot_pick(c);
      k->seq = q;
      k->pos = bnd;
      k->hashed = 1;
      k->hash = hj;
      k->tick = ++c->tick;
      c->cut_at[ncut] = bnd - from;
      c->cut_slot[ncut] = (int32_t)(k - c->ckpt);
      ncut++;
      c->run_ncut[ri]++;
    }
    if (c->win_n[q]) plan_window_cuts(c, ri, c->win_n[q], &ncut);
  }
  tab_upload(c);
  /* A fresh sequence starts with zero recurrent state. */
  for (int ri = 0; ri < p->n_runs; ri++) {
    const int q = c->run_seq[ri];
    if (c->len[q] != 0) continue;
    for (int l = 0; l < c->n_layers; l++) {
      const size_t at = (size_t)l * c->n_seq + q;
      if (c->conv[at]) c->lbe[l]->memset0(c->lbe[l], c->conv[at], sizeof(float) * (size_t)c->conv_floats);
      if (c->ssm[at]) c->lbe[l]->memset0(c->lbe[l], c->ssm[at], sizeof(float) * (size_t)c->ssm_floats);
    }
  }
  return 0;
}

void kv_cache_next_keys(kv_cache *c, const int32_t *keys) {
  c->next_keys = keys;
}

int kv_cache_plan(kv_cache *c, const anna_batch *b, kv_plan *p, char *err, size_t errlen) {
  const int rc = plan_batch(c, b, p, err, errlen);
  c->next_keys = NULL; /* for one plan only, also when it failed */
  if (c->win_slots) { /* windows are for one plan only, also when it failed */
    memset(c->win_n, 0, (size_t)c->n_seq * sizeof(int32_t));
    c->win_slots = 0;
  }
  return rc;
}

void kv_cache_commit(kv_cache *c, const kv_plan *p) {
  for (int ri = 0; ri < p->n_runs; ri++) {
    const int q = p->run_seq[ri];
    const int32_t from = c->len[q];
    c->len[q] += p->run_len[ri];
    if (c->share[q] == 2) seq_register(c, q, from >> c->bshift, c->len[q] >> c->bshift);
  }
}

void kv_cache_attn_rows(kv_cache *c, const anna_batch *b, int layer, kv_attn_rows *r) {
  const int oi = c->own_idx[layer];
  const int64_t n = b->n, rb = c->row_bytes[oi], mask = c->block_len - 1;
  r->kv_type = c->kv_type;
  r->block_len = c->block_len;
  r->residual_len = c->resid;
  r->ring_len = c->ring_len;
  r->row_bytes = rb;
  r->owns = c->owns[layer];
  r->wk = c->wk, r->wv = c->wv, r->wrk = c->wrk, r->wrv = c->wrv;
  r->kp = c->kp, r->vp = c->vp, r->rkp = c->rkp, r->rvp = c->rvp;
  if (r->owns) {
    const int64_t rf = c->row_floats[oi];
    for (int64_t t = 0; t < n; t++) {
      const int sq = b->seq[t];
      const int32_t p = b->pos[t];
      const int64_t blk = c->tab_id[(int64_t)sq * c->max_bps + (p >> c->bshift)];
      const int64_t off = blk * c->blk_bytes[oi] + (p & mask) * rb;
      c->wk[t] = c->pool_k[oi] + off;
      c->wv[t] = c->pool_v[oi] + off;
      if (c->resid) { /* the newest positions also in f32 */
        const size_t at = (size_t)oi * c->n_seq + sq;
        const int64_t row = (int64_t)(p % c->ring_len) * rf;
        c->wrk[t] = c->ring_k[at] + row;
        c->wrv[t] = c->ring_v[at] + row;
      }
    }
  }
  for (int64_t t = 0; t < n; t++) {
    const int sq = b->seq[t];
    void **tab = c->tb_d[c->ltb[layer]] + ((int64_t)sq * c->n_own + oi) * 2 * c->max_bps;
    c->kp[t] = (const void *)tab;
    c->vp[t] = (const void *)(tab + c->max_bps);
    if (c->resid) {
      c->rkp[t] = c->ring_k[(size_t)oi * c->n_seq + sq];
      c->rvp[t] = c->ring_v[(size_t)oi * c->n_seq + sq];
    }
  }
}
