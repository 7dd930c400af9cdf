/* prefix_index.c: the block pool's free list, reference counts and LRU eviction, and the
 * prefix index (open addressing, chain hash -> block id, tokens compared on lookup).
 */
#include "cache/kv_cache_internal.h"

#include <string.h>

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* Chain hash of a block: its tokens and the hash of everything before it. */
uint64_t kv_block_hash(uint64_t parent, const int32_t *t, int n) {
  uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ULL);
  for (int i = 0; i < n; i++) h = mix64(h ^ (uint32_t)t[i] ^ ((uint64_t)(uint32_t)i << 32));
  return h;
}

/* Key of a partial block (its first n < block_len tokens): never equal to a full block's
 * key for the same tokens. */
uint64_t kv_partial_hash(uint64_t parent, const int32_t *t, int n) {
  return kv_block_hash(parent ^ 0x5bd1e9955bd1e995ULL, t, n) ^ (uint64_t)n;
}

static int64_t index_home(const kv_cache *c, uint64_t h) {
  return (int64_t)(h & (uint64_t)(c->hcap - 1));
}

/* The cached block with this chain position and these tokens (-1: none). Tokens are
 * compared, so a hash collision cannot map a wrong block. */
int32_t kv_index_find(const kv_cache *c, uint64_t hash, uint64_t parent, const int32_t *tok, int n) {
  for (int64_t i = index_home(c, hash);; i = (i + 1) & (c->hcap - 1)) {
    const int32_t b = c->hidx[i];
    if (b < 0) return -1;
    const kv_blk *k = &c->blk[b];
    if (k->hash == hash && k->parent == parent && k->fill == n &&
        !memcmp(c->blk_tok + (int64_t)b * c->block_len, tok, sizeof(int32_t) * (size_t)n))
      return b;
  }
}

/* The index holds at most n_blocks entries in hcap >= 2 * n_blocks cells: never full. */
void kv_index_insert(kv_cache *c, int32_t b) {
  int64_t i = index_home(c, c->blk[b].hash);
  while (c->hidx[i] >= 0) i = (i + 1) & (c->hcap - 1);
  c->hidx[i] = b;
}

/* Linear-probing delete by backward shift (no tombstones: the index never degrades). */
void kv_index_remove(kv_cache *c, int32_t b) {
  const int64_t mask = c->hcap - 1;
  int64_t i = index_home(c, c->blk[b].hash);
  while (c->hidx[i] != b) {
    if (c->hidx[i] < 0) return;
    i = (i + 1) & mask;
  }
  for (int64_t j = (i + 1) & mask; c->hidx[j] >= 0; j = (j + 1) & mask) {
    const int64_t k = index_home(c, c->blk[c->hidx[j]].hash);
    /* Move j's entry into the hole at i unless its home lies cyclically in (i, j]. */
    const int in_range = i <= j ? (k > i && k <= j) : (k > i || k <= j);
    if (!in_range) {
      c->hidx[i] = c->hidx[j];
      i = j;
    }
  }
  c->hidx[i] = -1;
}

/* A block for writing (ref 1): the free list, else the least recently released cached
 * block nobody references (evicted from the index). -1: every block is in use. */
int32_t kv_blk_alloc(kv_cache *c) {
  int32_t b = -1;
  if (c->n_free > 0) {
    b = c->free_ids[--c->n_free];
  } else {
    for (int64_t i = 0; i < c->n_blocks; i++)
      if (c->blk[i].ref == 0 && c->blk[i].cached && (b < 0 || c->blk[i].tick < c->blk[b].tick)) b = (int32_t)i;
    if (b < 0) return -1;
    kv_index_remove(c, b);
    c->blk[b].cached = 0;
    c->st.evictions++;
  }
  c->blk[b].ref = 1;
  return b;
}

/* Drops one reference; an unreferenced block returns to the free list unless the index
 * holds it (then it waits, stamped for LRU eviction). */
void kv_blk_unref(kv_cache *c, int32_t b) {
  kv_blk *k = &c->blk[b];
  if (--k->ref > 0) return;
  k->tick = ++c->tick;
  if (!k->cached) c->free_ids[c->n_free++] = b;
}
