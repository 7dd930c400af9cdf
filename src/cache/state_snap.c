/* state_snap.c: the recurrent-state slots: checkpoints tagged (seq, pos) and prefix
 * snapshots tagged by chain hash, one fixed pool reused least recently used first.
 */
#include "cache/kv_cache_internal.h"

#include "base/error.h"

kv_slot *kv_slot_find(kv_cache *c, int seq, int32_t pos) {
  for (int i = 0; i < c->n_ckpt; i++)
    if (c->ckpt[i].seq == seq && c->ckpt[i].pos == pos) return &c->ckpt[i];
  return NULL;
}

kv_slot *kv_snap_find(kv_cache *c, uint64_t hash) {
  for (int i = 0; i < c->n_ckpt; i++)
    if (c->ckpt[i].hashed && c->ckpt[i].hash == hash) return &c->ckpt[i];
  return NULL;
}

/* The slot for a new checkpoint: an untagged one, else the least recently used. */
kv_slot *kv_slot_pick(kv_cache *c) {
  kv_slot *k = &c->ckpt[0];
  for (int i = 0; i < c->n_ckpt; i++) {
    if (c->ckpt[i].seq < 0 && !c->ckpt[i].hashed) return &c->ckpt[i];
    if (c->ckpt[i].tick < k->tick) k = &c->ckpt[i];
  }
  return k;
}

/* Checkpoints of seq past position n no longer describe its tokens (prefix snapshots,
 * keyed by content, stay valid). */
void kv_slot_invalidate(kv_cache *c, int seq, int32_t n) {
  for (int i = 0; i < c->n_ckpt; i++)
    if (c->ckpt[i].seq == seq && c->ckpt[i].pos > n) c->ckpt[i].seq = -1;
}

/* Recurrent state of every state layer: from (sconv, sssm)[layer * sstride] to
 * (dconv, dssm)[layer * dstride]. */
void kv_state_copy(kv_cache *c, float **dconv, float **dssm, int dstride, float **sconv, float **sssm,
                   int sstride) {
  for (int l = 0; l < c->n_layers; l++) {
    if (!c->is_state[l]) continue;
    float *dc = dconv[(size_t)l * dstride], *ds = dssm[(size_t)l * dstride];
    const float *sc = sconv[(size_t)l * sstride], *ss = sssm[(size_t)l * sstride];
    ops_backend *lb = c->lbe[l];
    if (lb->bind) lb->bind(lb); /* an op, not a memory entry: it runs on the current device */
    lb->copy_rows(lb, dc, 0, sc, 0, 1, (int)c->conv_floats);
    lb->copy_rows(lb, ds, 0, ss, 0, 1, (int)c->ssm_floats);
  }
}

int kv_cache_checkpoint(kv_cache *c, int seq, char *err, size_t errlen) {
  if (seq < 0 || seq >= c->n_seq) return anna_err(err, errlen, ANNA_ERANGE, "sequence %d out of range", seq);
  if (c->n_ckpt == 0) return 0; /* no recurrent state: positions alone describe the state */
  kv_slot *k = kv_slot_find(c, seq, c->len[seq]);
  if (!k) k = kv_slot_pick(c);
  k->seq = seq;
  k->pos = c->len[seq];
  k->hashed = 0;
  k->tick = ++c->tick;
  kv_state_copy(c, k->conv, k->ssm, 1, c->conv + seq, c->ssm + seq, c->n_seq);
  return 0;
}

/* The recurrent state of src at position n: its live state or a checkpoint (NULL arrays:
 * the model has no recurrent state). */
int kv_state_source(kv_cache *c, int src, int32_t n, float ***conv, float ***ssm, int *stride, char *err,
                    size_t errlen) {
  if (!c->has_state) {
    *conv = *ssm = NULL;
    return 0;
  }
  if (n == c->len[src]) {
    *conv = c->conv + src, *ssm = c->ssm + src, *stride = c->n_seq;
    return 0;
  }
  kv_slot *k = kv_slot_find(c, src, n);
  if (!k)
    return anna_err(err, errlen, ANNA_ENOTFOUND,
                    "sequence %d has no recurrent-state checkpoint at position %d (its length is %d)", src, n,
                    c->len[src]);
  k->tick = ++c->tick;
  *conv = k->conv, *ssm = k->ssm, *stride = 1;
  return 0;
}

float *kv_cache_conv(const kv_cache *c, int layer, int seq) {
  return c->conv[(size_t)layer * c->n_seq + seq];
}

float *kv_cache_ssm(const kv_cache *c, int layer, int seq) {
  return c->ssm[(size_t)layer * c->n_seq + seq];
}

float *kv_cache_slot_conv(const kv_cache *c, int slot, int layer) {
  return c->ckpt[slot].conv[layer];
}

float *kv_cache_slot_ssm(const kv_cache *c, int slot, int layer) {
  return c->ckpt[slot].ssm[layer];
}
