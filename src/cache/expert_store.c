/* expert_store.c: the expert residency policy (expert_store.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* pread; the CUDA library that also compiles this file clears the project's -D */
#endif
#include "cache/expert_store.h"

#include "anna/anna.h" /* ANNA_E* codes */

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The message convention of base/error.h, written out here: the CUDA backend's library
 * compiles this file and links nothing from anna's objects (backends/cuda/CMakeLists.txt). */
static int es_err(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int es_err(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}
/* "prefix: " before the message already in err. */
static int es_prefix(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int es_prefix(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (!err || !errlen) return code;
  char old[512], pre[256];
  snprintf(old, sizeof old, "%s", err);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pre, sizeof pre, fmt, ap);
  va_end(ap);
  snprintf(err, errlen, "%s: %s", pre, old);
  return code;
}

struct expert_store {
  expert_store_params p;
  int L, E, C, S, n_slots; /* layers, experts, cache slots per layer, staging slots, all slots */
  int64_t eb;
  int32_t *table;                  /* [L * E] cache slot or -1 */
  int32_t *slot_layer, *slot_expert; /* [n_slots] owner or -1 */
  int32_t *pin;                    /* [n_slots] pinned by an unreleased route */
  int32_t *layer_pins;             /* [L * (C + S)] slots pinned by the layer's route */
  int32_t *layer_npin;             /* [L]; -1: no route outstanding */
  float *count;                    /* [L * E] decayed routing counts */
  int32_t *seen;                   /* [E] scratch: place index + 1 of an expert in this route */
  int32_t *order, *order_tmp;      /* [E] scratch: ranking */
  uint8_t *top;                    /* [E] scratch: in the layer's top C */
  int32_t *victims;                /* [C] scratch */
  unsigned char **mirror;          /* [L * E] host copy or NULL */
  void **chunks;
  int n_chunks;
  int64_t steps;
  expert_store_stats st;
};

static void *default_alloc(void *user, size_t bytes) {
  (void)user;
  return malloc(bytes);
}
static void default_free(void *user, void *p) {
  (void)user;
  free(p);
}

void expert_store_free(expert_store *st) {
  if (!st) return;
  for (int i = 0; i < st->n_chunks; i++) st->p.host_free(st->p.alloc_user, st->chunks[i]);
  free(st->chunks);
  free(st->mirror);
  free(st->table);
  free(st->slot_layer);
  free(st->slot_expert);
  free(st->pin);
  free(st->layer_pins);
  free(st->layer_npin);
  free(st->count);
  free(st->seen);
  free(st->order);
  free(st->order_tmp);
  free(st->top);
  free(st->victims);
  free(st);
}

/* Sizes the device side: cache slots per layer from the budget (expert_store.h). */
static int size_device(expert_store *st, char *err, size_t errlen) {
  const expert_store_params *p = &st->p;
  const int64_t staging = (int64_t)st->S * st->eb;
  const int64_t need = p->dense_bytes + staging;
  const int64_t per_slot_row = (int64_t)st->L * st->eb; /* one cache slot in every layer */
  int64_t room = -1;
  if (p->device_budget > 0) {
    if (p->device_budget < need)
      return es_err(err, errlen, ANNA_EINVAL,
                      "gpu memory limit of %lld bytes is below the %lld bytes needed: dense weights, KV cache and "
                      "scratch %lld + %d expert staging slots x %lld",
                      (long long)p->device_budget, (long long)need, (long long)p->dense_bytes, st->S,
                      (long long)st->eb);
    room = p->device_budget - need;
  }
  int64_t c;
  if (p->slots_per_layer > 0) {
    c = p->slots_per_layer < st->E ? p->slots_per_layer : st->E;
    if (room >= 0 && c * per_slot_row > room)
      return es_err(err, errlen, ANNA_EINVAL,
                      "%lld cached experts per layer need %lld bytes of device memory (%lld with the dense weights "
                      "and staging); the gpu memory limit is %lld bytes",
                      (long long)c, (long long)(c * per_slot_row), (long long)(c * per_slot_row + need),
                      (long long)p->device_budget);
  } else if (p->cache_bytes >= 0) {
    int64_t b = p->cache_bytes;
    if (room >= 0 && b > room) b = room;
    c = b / per_slot_row;
  } else {
    if (room < 0)
      return es_err(err, errlen, ANNA_EINVAL, "expert cache 'auto' needs a gpu memory limit (or a free-memory query)");
    c = room / per_slot_row;
  }
  if (c > st->E) c = st->E;
  st->C = (int)c;
  return 0;
}

/* Mirrors up to host_budget bytes of experts in host chunks: the experts that start outside
 * the cache first (they are the misses), then the initial residents (so a victim is a
 * memory copy away rather than a file read). A chunk that cannot be allocated ends the
 * mirror there: the rest stay on disk, which is slower but reachable. */
static int build_mirror(expert_store *st, char *err, size_t errlen) {
  const expert_store_params *p = &st->p;
  const int64_t total = (int64_t)st->L * st->E;
  int64_t want = p->host_budget < 0 ? total : p->host_budget / st->eb;
  if (want > total) want = total;
  if (want <= 0) return 0;
  const int64_t chunk = p->chunk_bytes > 0 ? p->chunk_bytes : (int64_t)1 << 30;
  int64_t per_chunk = chunk / st->eb;
  if (per_chunk < 1) per_chunk = 1;
  const int64_t max_chunks = (want + per_chunk - 1) / per_chunk;
  st->chunks = (void **)calloc((size_t)max_chunks, sizeof *st->chunks);
  if (!st->chunks) return es_err(err, errlen, ANNA_ENOMEM, "expert store: out of memory");
  unsigned char *cur = NULL;
  int64_t left = 0, done = 0;
  for (int pass = 0; pass < 2 && done < want; pass++)
    for (int l = 0; l < st->L && done < want; l++)
      for (int e = 0; e < st->E && done < want; e++) {
        if ((pass == 0) != (e >= st->C)) continue;
        if (!left) {
          int64_t n = want - done < per_chunk ? want - done : per_chunk;
          cur = (unsigned char *)p->host_alloc(p->alloc_user, (size_t)(n * st->eb));
          if (!cur) return 0; /* partial mirror: the rest read from the file */
          st->chunks[st->n_chunks++] = cur;
          st->st.mirror_bytes += n * st->eb;
          left = n;
        }
        int rc = p->read(p->read_user, l, e, cur, (size_t)st->eb, err, errlen);
        if (rc) return es_prefix(err, errlen, rc, "expert store: mirroring layer %d expert %d", l, e);
        st->mirror[(int64_t)l * st->E + e] = cur;
        cur += st->eb;
        left--;
        done++;
        st->st.mirrored++;
      }
  return 0;
}

int expert_store_open(expert_store **out, const expert_store_params *p, char *err, size_t errlen) {
  *out = NULL;
  if (!p || p->n_layers < 1 || p->n_experts < 1 || p->expert_bytes <= 0 || p->staging_slots < 1 ||
      p->dense_bytes < 0 || p->swap_every < 0 || !(p->decay >= 0.0f && p->decay <= 1.0f) || !p->read)
    return es_err(err, errlen, ANNA_EINVAL,
                    "expert store: bad parameters (layers, experts, expert bytes and staging slots must be >= 1, "
                    "dense bytes and swap interval >= 0, decay in [0, 1], a read callback)");
  if ((int64_t)p->n_layers * p->n_experts > INT32_MAX / 2)
    return es_err(err, errlen, ANNA_EINVAL, "expert store: %d layers x %d experts is too many", p->n_layers,
                    p->n_experts);
  expert_store *st = (expert_store *)calloc(1, sizeof *st);
  if (!st) return es_err(err, errlen, ANNA_ENOMEM, "expert store: out of memory");
  st->p = *p;
  if (!st->p.host_alloc || !st->p.host_free) {
    st->p.host_alloc = default_alloc;
    st->p.host_free = default_free;
  }
  if (st->p.decay == 0.0f) st->p.decay = 0.5f;
  st->L = p->n_layers;
  st->E = p->n_experts;
  st->eb = p->expert_bytes;
  st->S = p->staging_slots < p->n_experts ? p->staging_slots : p->n_experts;
  int rc = size_device(st, err, errlen);
  if (rc) {
    expert_store_free(st);
    return rc;
  }
  if ((int64_t)st->C * st->L + st->S > INT32_MAX / 2) {
    expert_store_free(st);
    return es_err(err, errlen, ANNA_EINVAL, "expert store: too many slots");
  }
  st->n_slots = st->C * st->L + st->S;
  const size_t LE = (size_t)st->L * st->E;
  st->table = (int32_t *)malloc(LE * sizeof *st->table);
  st->slot_layer = (int32_t *)malloc((size_t)st->n_slots * sizeof(int32_t));
  st->slot_expert = (int32_t *)malloc((size_t)st->n_slots * sizeof(int32_t));
  st->pin = (int32_t *)calloc((size_t)st->n_slots, sizeof(int32_t));
  st->layer_pins = (int32_t *)malloc((size_t)st->L * (size_t)(st->C + st->S) * sizeof(int32_t));
  st->layer_npin = (int32_t *)malloc((size_t)st->L * sizeof(int32_t));
  st->count = (float *)calloc(LE, sizeof(float));
  st->seen = (int32_t *)calloc((size_t)st->E, sizeof(int32_t));
  st->order = (int32_t *)malloc((size_t)st->E * sizeof(int32_t));
  st->order_tmp = (int32_t *)malloc((size_t)st->E * sizeof(int32_t));
  st->top = (uint8_t *)calloc((size_t)st->E, 1);
  st->victims = (int32_t *)malloc((size_t)(st->C + 1) * sizeof(int32_t));
  st->mirror = (unsigned char **)calloc(LE, sizeof *st->mirror);
  if (!st->table || !st->slot_layer || !st->slot_expert || !st->pin || !st->layer_pins || !st->layer_npin ||
      !st->count || !st->seen || !st->order || !st->order_tmp || !st->top || !st->victims || !st->mirror) {
    expert_store_free(st);
    return es_err(err, errlen, ANNA_ENOMEM, "expert store: out of memory");
  }
  for (size_t i = 0; i < LE; i++) st->table[i] = -1;
  for (int s = 0; s < st->n_slots; s++) st->slot_layer[s] = st->slot_expert[s] = -1;
  for (int l = 0; l < st->L; l++) {
    st->layer_npin[l] = -1;
    for (int j = 0; j < st->C; j++) { /* initial contents: experts 0 .. C-1 */
      const int s = l * st->C + j;
      st->table[(int64_t)l * st->E + j] = s;
      st->slot_layer[s] = l;
      st->slot_expert[s] = j;
    }
  }
  st->st.cache_per_layer = st->C;
  st->st.staging_slots = st->S;
  st->st.n_slots = st->n_slots;
  rc = build_mirror(st, err, errlen);
  if (rc) {
    expert_store_free(st);
    return rc;
  }
  *out = st;
  return 0;
}

int expert_store_cache_per_layer(const expert_store *st) {
  return st->C;
}
int expert_store_n_slots(const expert_store *st) {
  return st->n_slots;
}
int64_t expert_store_device_bytes(const expert_store *st) {
  return (int64_t)st->n_slots * st->eb;
}
const int32_t *expert_store_table(const expert_store *st) {
  return st->table;
}
void expert_store_slot_owner(const expert_store *st, int slot, int *layer, int *expert) {
  *layer = *expert = -1;
  if (slot < 0 || slot >= st->n_slots) return;
  *layer = st->slot_layer[slot];
  *expert = st->slot_expert[slot];
}

int expert_store_route(expert_store *st, int layer, const int32_t *ids, int n_ids, expert_store_place *places,
                       int *n_places, char *err, size_t errlen) {
  *n_places = 0;
  if (layer < 0 || layer >= st->L)
    return es_err(err, errlen, ANNA_ERANGE, "expert store: layer %d outside [0, %d)", layer, st->L);
  if (st->layer_npin[layer] >= 0)
    return es_err(err, errlen, ANNA_ESTATE, "expert store: layer %d routed again before its release", layer);
  for (int i = 0; i < n_ids; i++)
    if (ids[i] < -1 || ids[i] >= st->E)
      return es_err(err, errlen, ANNA_ERANGE, "expert store: expert id %d outside [0, %d) in layer %d", ids[i],
                      st->E, layer);
  /* distinct experts and their misses, before changing anything */
  int n = 0, misses = 0;
  for (int i = 0; i < n_ids; i++) {
    const int e = ids[i];
    if (e < 0 || st->seen[e]) continue;
    st->seen[e] = ++n;
    places[n - 1] = (expert_store_place){layer, e, st->table[(int64_t)layer * st->E + e], 0, -1};
    if (places[n - 1].slot < 0) misses++;
  }
  int free_staging = 0;
  for (int s = st->C * st->L; s < st->n_slots; s++) free_staging += st->pin[s] == 0;
  for (int j = 0; j < n; j++) st->seen[places[j].expert] = 0;
  if (misses > free_staging)
    return es_err(err, errlen, ANNA_ESTATE,
                    "expert store: layer %d routes %d experts outside the cache but %d of %d staging slots are free",
                    layer, misses, free_staging, st->S);
  int32_t *pins = st->layer_pins + (int64_t)layer * (st->C + st->S);
  int np = 0, s = st->C * st->L;
  for (int j = 0; j < n; j++) {
    expert_store_place *pl = &places[j];
    if (pl->slot < 0) {
      while (st->pin[s]) s++;
      pl->slot = s;
      pl->copy = 1;
      st->slot_layer[s] = layer;
      st->slot_expert[s] = pl->expert;
      st->st.misses++;
    } else {
      st->st.hits++;
    }
    st->pin[pl->slot]++;
    pins[np++] = pl->slot;
  }
  for (int i = 0; i < n_ids; i++)
    if (ids[i] >= 0) st->count[(int64_t)layer * st->E + ids[i]] += 1.0f;
  st->layer_npin[layer] = np;
  st->st.routed += n;
  *n_places = n;
  return 0;
}

int expert_store_note_chunk(expert_store *st, int layer, const int32_t *ids, int64_t n_ids, char *err,
                            size_t errlen) {
  if (layer < 0 || layer >= st->L)
    return es_err(err, errlen, ANNA_ERANGE, "expert store: layer %d outside [0, %d)", layer, st->L);
  for (int64_t i = 0; i < n_ids; i++)
    if (ids[i] < -1 || ids[i] >= st->E)
      return es_err(err, errlen, ANNA_ERANGE, "expert store: expert id %d outside [0, %d) in layer %d", ids[i],
                    st->E, layer);
  int n = 0, hits = 0;
  for (int64_t i = 0; i < n_ids; i++) {
    const int e = ids[i];
    if (e < 0) continue;
    st->count[(int64_t)layer * st->E + e] += 1.0f;
    if (st->seen[e]) continue;
    st->seen[e] = 1;
    n++;
    hits += st->table[(int64_t)layer * st->E + e] >= 0;
  }
  for (int64_t i = 0; i < n_ids; i++)
    if (ids[i] >= 0) st->seen[ids[i]] = 0;
  st->st.routed += n;
  st->st.hits += hits;
  st->st.misses += n - hits;
  return 0;
}

void expert_store_release(expert_store *st, int layer) {
  if (layer < 0 || layer >= st->L || st->layer_npin[layer] < 0) return;
  const int32_t *pins = st->layer_pins + (int64_t)layer * (st->C + st->S);
  for (int i = 0; i < st->layer_npin[layer]; i++) {
    const int s = pins[i];
    if (--st->pin[s] == 0 && s >= st->C * st->L) st->slot_layer[s] = st->slot_expert[s] = -1;
  }
  st->layer_npin[layer] = -1;
}

int expert_store_step(expert_store *st) {
  st->steps++;
  return st->p.swap_every > 0 && st->steps % st->p.swap_every == 0;
}

/* Experts of one layer by count, hottest first (ties: lower id), by a stable merge sort of
 * the ids (already in id order). */
static void rank_layer(expert_store *st, const float *c) {
  int32_t *a = st->order, *b = st->order_tmp;
  for (int e = 0; e < st->E; e++) a[e] = e;
  for (int w = 1; w < st->E; w *= 2) {
    for (int lo = 0; lo < st->E; lo += 2 * w) {
      int mid = lo + w < st->E ? lo + w : st->E, hi = lo + 2 * w < st->E ? lo + 2 * w : st->E;
      int i = lo, j = mid, k = lo;
      while (i < mid && j < hi) b[k++] = c[a[j]] > c[a[i]] ? a[j++] : a[i++];
      while (i < mid) b[k++] = a[i++];
      while (j < hi) b[k++] = a[j++];
    }
    int32_t *t = a;
    a = b;
    b = t;
  }
  if (a != st->order) memcpy(st->order, a, (size_t)st->E * sizeof *a);
}

int expert_store_plan_swaps(expert_store *st, expert_store_place *swaps, int cap) {
  int n = 0;
  if (st->C > 0 && st->C < st->E)
    for (int l = 0; l < st->L && n < cap; l++) {
      const float *c = st->count + (int64_t)l * st->E;
      int32_t *tab = st->table + (int64_t)l * st->E;
      rank_layer(st, c);
      memset(st->top, 0, (size_t)st->E);
      for (int r = 0; r < st->C; r++) st->top[st->order[r]] = 1;
      /* victims: free slots, then unpinned residents outside the top set, coldest first */
      int nv = 0;
      for (int j = 0; j < st->C; j++)
        if (st->slot_expert[l * st->C + j] < 0) st->victims[nv++] = l * st->C + j;
      for (int r = st->E - 1; r >= 0 && nv < st->C; r--) {
        const int e = st->order[r];
        if (!st->top[e] && tab[e] >= 0 && !st->pin[tab[e]]) st->victims[nv++] = tab[e];
      }
      int v = 0;
      for (int r = 0; r < st->C && v < nv && n < cap; r++) {
        const int e = st->order[r];
        if (tab[e] >= 0 || c[e] <= 0.0f) continue;
        const int s = st->victims[v];
        const int old = st->slot_expert[s];
        if (old >= 0 && !(c[e] > c[old])) break; /* victims only get hotter from here */
        v++;
        if (old >= 0) tab[old] = -1;
        tab[e] = s;
        st->slot_layer[s] = l;
        st->slot_expert[s] = e;
        swaps[n++] = (expert_store_place){l, e, s, 1, old};
      }
    }
  const int64_t LE = (int64_t)st->L * st->E;
  for (int64_t i = 0; i < LE; i++) st->count[i] *= st->p.decay;
  st->st.swaps += n;
  st->st.swap_rounds++;
  return n;
}

const void *expert_store_host_ptr(const expert_store *st, int layer, int expert) {
  if (layer < 0 || layer >= st->L || expert < 0 || expert >= st->E) return NULL;
  return st->mirror[(int64_t)layer * st->E + expert];
}

int expert_store_fetch(expert_store *st, int layer, int expert, void *dst, char *err, size_t errlen) {
  if (layer < 0 || layer >= st->L || expert < 0 || expert >= st->E)
    return es_err(err, errlen, ANNA_ERANGE, "expert store: no expert %d in layer %d", expert, layer);
  const unsigned char *m = st->mirror[(int64_t)layer * st->E + expert];
  if (m) {
    memcpy(dst, m, (size_t)st->eb);
    st->st.bytes_from_mirror += st->eb;
    return 0;
  }
  int rc = st->p.read(st->p.read_user, layer, expert, dst, (size_t)st->eb, err, errlen);
  if (rc) return es_prefix(err, errlen, rc, "expert store: reading layer %d expert %d", layer, expert);
  st->st.bytes_from_disk += st->eb;
  return 0;
}

void expert_store_add_counts(expert_store *st, int layer, const float *counts) {
  if (layer < 0 || layer >= st->L) return;
  for (int e = 0; e < st->E; e++) {
    if (!(counts[e] > 0.0f)) continue;
    st->count[(int64_t)layer * st->E + e] += counts[e];
    const int64_t uses = (int64_t)(counts[e] + 0.5f);
    st->st.routed += uses;
    if (st->table[(int64_t)layer * st->E + e] >= 0) st->st.hits += uses;
    else st->st.misses += uses;
  }
}

void expert_store_count_dma(expert_store *st, int64_t bytes) {
  st->st.bytes_from_mirror += bytes;
}

void expert_store_get_stats(const expert_store *st, expert_store_stats *out) {
  *out = st->st;
}

int expert_store_check(const expert_store *st, char *err, size_t errlen) {
  const int64_t LE = (int64_t)st->L * st->E;
  for (int64_t i = 0; i < LE; i++) {
    const int s = st->table[i], l = (int)(i / st->E), e = (int)(i % st->E);
    if (s < -1 || s >= st->C * st->L)
      return es_err(err, errlen, ANNA_ESTATE, "expert store: layer %d expert %d in slot %d, not a cache slot", l, e,
                      s);
    if (s >= 0 && (st->slot_layer[s] != l || st->slot_expert[s] != e))
      return es_err(err, errlen, ANNA_ESTATE, "expert store: table puts layer %d expert %d in slot %d, which holds %d/%d",
                      l, e, s, st->slot_layer[s], st->slot_expert[s]);
  }
  for (int s = 0; s < st->C * st->L; s++) {
    const int l = st->slot_layer[s], e = st->slot_expert[s];
    if (l < 0 && e < 0) continue;
    if (l != s / st->C)
      return es_err(err, errlen, ANNA_ESTATE, "expert store: cache slot %d of layer %d holds layer %d", s, s / st->C, l);
    if (e < 0 || e >= st->E || st->table[(int64_t)l * st->E + e] != s)
      return es_err(err, errlen, ANNA_ESTATE, "expert store: cache slot %d holds expert %d the table does not place there",
                      s, e);
  }
  for (int s = 0; s < st->n_slots; s++)
    if (st->pin[s] < 0) return es_err(err, errlen, ANNA_ESTATE, "expert store: slot %d pinned %d times", s, st->pin[s]);
  int64_t mirrored = 0;
  for (int64_t i = 0; i < LE; i++) {
    if (!st->mirror[i]) continue;
    mirrored++;
    int in = 0;
    for (int c = 0; c < st->n_chunks && !in; c++) {
      const unsigned char *b = (const unsigned char *)st->chunks[c];
      in = st->mirror[i] >= b && st->mirror[i] + st->eb <= b + st->st.mirror_bytes;
    }
    if (!in)
      return es_err(err, errlen, ANNA_ESTATE, "expert store: layer %lld expert %lld mirrored outside its chunks",
                      (long long)(i / st->E), (long long)(i % st->E));
  }
  if (mirrored != st->st.mirrored || mirrored * st->eb > st->st.mirror_bytes)
    return es_err(err, errlen, ANNA_ESTATE, "expert store: %lld experts mirrored, %lld counted, %lld bytes allocated",
                    (long long)mirrored, (long long)st->st.mirrored, (long long)st->st.mirror_bytes);
  /* every expert is reachable: mirrored, or read through p.read (always set: open checks) */
  if (!st->p.read && mirrored < LE)
    return es_err(err, errlen, ANNA_ESTATE, "expert store: %lld experts unreachable", (long long)(LE - mirrored));
  return 0;
}

int expert_store_pread(int fd, void *dst, size_t bytes, int64_t off, const char *path, char *err, size_t errlen) {
  unsigned char *d = (unsigned char *)dst;
  size_t done = 0;
  while (done < bytes) {
    ssize_t r = pread(fd, d + done, bytes - done, (off_t)(off + (int64_t)done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return es_err(err, errlen, ANNA_EIO, "%s: read of %zu bytes at %lld failed: %s", path ? path : "model file",
                      bytes, (long long)off, strerror(errno));
    if (r == 0)
      return es_err(err, errlen, ANNA_EIO, "%s: file ends before %zu bytes at %lld", path ? path : "model file",
                      bytes, (long long)off);
    done += (size_t)r;
  }
  return 0;
}
