/* expert_store.h: where the routed experts of a MoE model live when they do not all fit on
 * the device (issue #27), as a policy independent of any backend.
 *
 * The model has n_layers MoE layers of n_experts experts each; an expert is one blob of
 * expert_bytes (its gate, up and down rows, laid out by the caller). Three tiers:
 * - device slots: per layer, a fixed number of cache slots (the same for every layer, from
 *   a byte budget or forced), plus staging slots shared by all layers that hold the misses
 *   of the layer being computed. The residency table (expert -> cache slot or -1) is what a
 *   backend turns into the pointers its kernels read; slot s lives at s * expert_bytes of the
 *   backend's slot arena (cache slots first: layer l's j-th is l * cache_per_layer + j; the
 *   staging slots follow).
 * - a host mirror of the experts that fit under host_budget, in chunks of whole experts
 *   (allocated through the caller's host_alloc: pinned memory on CUDA, malloc elsewhere);
 * - the model file: every expert not mirrored is read by its source callback (pread of the
 *   GGUF, or a copy from the mapped weights) into the caller's staging memory.
 * Nothing is ever dropped from the host tiers, so whatever a swap evicts from the device
 * stays reachable (the seed's adaptive-swap corruption came from a victim that was not).
 *
 * A step of one layer is expert_store_route (count the routed ids, place each distinct
 * expert: its cache slot, or a staging slot to fill; those slots are pinned) and, once the
 * work reading them can no longer be affected by a later copy, expert_store_release.
 * Every swap_every steps (expert_store_step), expert_store_plan_swaps ranks each layer's
 * experts by their decayed routing counts and moves the hottest into cache slots, taking
 * the coldest unpinned residents as victims: a pinned slot is never a victim. The table
 * changes at once; the caller copies each arrival into its slot before any work that reads
 * the table again.
 *
 * Not thread-safe: one owner (the backend's stream thread). No allocation after open.
 */
#ifndef ANNA_CACHE_EXPERT_STORE_H
#define ANNA_CACHE_EXPERT_STORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct expert_store expert_store;

/* Fills dst[0 .. bytes) with expert (layer, expert)'s blob from the model; 0 or a negative
 * ANNA_E* with a message. */
typedef int (*expert_store_read_fn)(void *user, int layer, int expert, void *dst, size_t bytes, char *err,
                                    size_t errlen);
/* Host mirror chunks: pinned memory on a device backend, malloc on the CPU. NULL on failure
 * (the mirror then stops there: what is not mirrored is read from the file). */
typedef void *(*expert_store_alloc_fn)(void *user, size_t bytes);
typedef void (*expert_store_free_fn)(void *user, void *p);

typedef struct expert_store_params {
  int n_layers, n_experts; /* MoE layers, experts per layer (>= 1 each) */
  int64_t expert_bytes;    /* one expert's blob (> 0) */
  /* Device: budget (bytes the backend may use in all; <= 0: no limit, needs cache_bytes or
   * slots_per_layer), what must be there besides experts (dense weights, KV pool,
   * scratch), and the cache: cache_bytes < 0 ("auto") takes what is left after dense_bytes
   * and the staging slots; >= 0 asks for that many bytes (capped by the budget).
   * slots_per_layer > 0 forces the per-layer cache (tests; the seed's
   * --cached-experts-per-layer) and overrides cache_bytes. */
  int64_t device_budget, dense_bytes, cache_bytes;
  int slots_per_layer;
  int staging_slots;   /* most distinct misses of one layer step (>= 1; e.g. tokens x top-k) */
  int64_t host_budget; /* bytes of host mirror: < 0 all experts, 0 none */
  int64_t chunk_bytes; /* largest mirror allocation (0: 1 GiB); holds whole experts */
  int swap_every;      /* steps between swap plans (>= 1; 0: never swap) */
  float decay;         /* counts are multiplied by this at each plan, in [0, 1] (0: 0.5) */
  expert_store_read_fn read;
  void *read_user;
  expert_store_alloc_fn host_alloc; /* NULL: malloc / free */
  expert_store_free_fn host_free;
  void *alloc_user;
} expert_store_params;

/* Creates the store: sizes the cache, mirrors what fits (reading each mirrored expert
 * through read), places the first cache_per_layer experts of each layer (the initial
 * contents the caller must copy in: expert_store_slot_owner). ANNA_EINVAL when the device
 * budget cannot hold dense_bytes plus the staging slots (the message names the bytes
 * needed and each part), or a parameter is out of range. Caller frees with expert_store_free. */
int expert_store_open(expert_store **out, const expert_store_params *p, char *err, size_t errlen);
void expert_store_free(expert_store *st);

int expert_store_cache_per_layer(const expert_store *st);
int expert_store_n_slots(const expert_store *st); /* cache + staging */
/* Bytes of the device slot arena (n_slots * expert_bytes). */
int64_t expert_store_device_bytes(const expert_store *st);
/* Residency table [n_layers * n_experts]: cache slot or -1. Borrowed; changes with
 * plan_swaps only. */
const int32_t *expert_store_table(const expert_store *st);
/* The expert in a cache or staging slot, (-1, -1) for an empty one. */
void expert_store_slot_owner(const expert_store *st, int slot, int *layer, int *expert);

/* One expert of a layer step or a swap: put (layer, expert) into slot; copy: its bytes must
 * be copied in (a miss or an arrival), 0 when already there (a hit). */
typedef struct expert_store_place {
  int layer, expert, slot, copy;
  int victim; /* swaps: the expert that left the slot (-1: it was empty) */
} expert_store_place;

/* Counts the routed ids ([n_ids], -1 ignored, duplicates counted once per occurrence) of a
 * layer and places each distinct expert: places[0 .. *n_places) (places has room for
 * n_ids). Hits are their cache slots; misses take free staging slots. All placed slots are
 * pinned until expert_store_release(layer). ANNA_ERANGE for an id outside [0, n_experts),
 * ANNA_ESTATE when the layer is still pinned or the misses outnumber the free staging
 * slots (the message says how many). */
int expert_store_route(expert_store *st, int layer, const int32_t *ids, int n_ids, expert_store_place *places,
                       int *n_places, char *err, size_t errlen);
/* A chunk (prefill) of a layer that the caller streams itself: counts the routed ids
 * ([n_ids], -1 ignored) for the swap plans and the hit / miss statistics as
 * expert_store_route does, but places and pins nothing: the caller computes the cached
 * experts from their cache slots (expert_store_table) and copies the others through the
 * staging slots on its own schedule (legal only while no route of any layer pins a staging
 * slot). ANNA_ERANGE for a layer or an id out of range (nothing counted). */
int expert_store_note_chunk(expert_store *st, int layer, const int32_t *ids, int64_t n_ids, char *err,
                            size_t errlen);
/* Unpins the slots of the layer's last route (no-op when none). */
void expert_store_release(expert_store *st, int layer);

/* Ends a step; returns 1 when a swap plan is due (every swap_every steps). */
int expert_store_step(expert_store *st);
/* Plans swaps for every layer: arrivals are the hottest non-resident experts that rank in
 * the layer's top cache_per_layer by decayed count (ties: the lower id), victims the
 * coldest unpinned residents outside that top set (free slots first). Writes at most cap
 * swaps (copy = 1, victim set) and returns how many; the table already shows them. Decays
 * the counts. */
int expert_store_plan_swaps(expert_store *st, expert_store_place *swaps, int cap);

/* Where an expert's bytes come from: the mirror pointer (host memory, the caller may DMA
 * from it directly), else NULL: expert_store_fetch reads it from the file. */
const void *expert_store_host_ptr(const expert_store *st, int layer, int expert);
/* Copies the expert's blob to dst (expert_bytes): from the mirror, or through read. Counts
 * the bytes per tier. */
int expert_store_fetch(expert_store *st, int layer, int expert, void *dst, char *err, size_t errlen);

typedef struct expert_store_stats {
  int cache_per_layer, staging_slots, n_slots;
  int64_t mirrored;              /* experts in the host mirror (the rest are on disk) */
  int64_t mirror_bytes;          /* host bytes allocated for it */
  int64_t routed, hits, misses;  /* routed expert uses (distinct per layer step) */
  int64_t swaps, swap_rounds;
  int64_t bytes_from_mirror, bytes_from_disk; /* by expert_store_fetch, plus host_ptr uses the caller reports */
} expert_store_stats;
void expert_store_get_stats(const expert_store *st, expert_store_stats *out);
/* The caller copied `bytes` straight from a host_ptr (no fetch): counted as mirror bytes. */
void expert_store_count_dma(expert_store *st, int64_t bytes);
/* Routing counts gathered elsewhere (a device counter per expert) for a layer: counts[e]
 * uses of expert e (e < n_experts) added to its decayed count, and to the routed / hit
 * statistics (hits: those resident now; call before the plan that may move them). Nothing
 * is placed or pinned. */
void expert_store_add_counts(expert_store *st, int layer, const float *counts);

/* Checks the invariants (a debugging and test aid, O(slots + layers * experts)): the table
 * and the slot owners agree both ways; no expert is in two cache slots; a layer's cache
 * slots hold only its experts; every expert is reachable (mirrored or readable); the
 * mirror's chunks account for its bytes. 0 or ANNA_ESTATE naming the first violation. */
int expert_store_check(const expert_store *st, char *err, size_t errlen);

/* pread of exactly bytes at off (retries short reads; EINTR); 0 or ANNA_EIO naming path. */
int expert_store_pread(int fd, void *dst, size_t bytes, int64_t off, const char *path, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
