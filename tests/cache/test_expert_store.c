/* test_expert_store: the expert residency policy (src/cache/expert_store.h) without a
 * model or device. A temporary "model file" holds every expert as a distinct byte pattern;
 * a host array stands for the device slot arena. Random skewed routing traces run 1,000
 * swap rounds (a plan every step), with some layers left in flight across a plan; after
 * every round the invariants are checked, every slot a route or the table points to must
 * hold exactly its expert's bytes, pinned slots must keep their owners, and the bytes
 * moved must match the copies made. Then bad budgets and bad calls. */
#include "cache/expert_store.h"

#include "anna/anna.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;
#define CHECK(c, ...)                                                                              \
  do {                                                                                             \
    if (!(c)) {                                                                                    \
      failures++;                                                                                  \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                         \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
    }                                                                                              \
  } while (0)

typedef struct model_file {
  int fd;
  char path[64];
  int L, E;
  int64_t eb;
  int64_t reads; /* calls of the read callback */
} model_file;

static unsigned char pattern(int l, int e, int64_t i) {
  return (unsigned char)((l * 131 + e * 31 + i * 7 + (i >> 8)) & 0xff);
}

static int file_read(void *user, int layer, int expert, void *dst, size_t bytes, char *err, size_t errlen) {
  model_file *f = (model_file *)user;
  f->reads++;
  return expert_store_pread(f->fd, dst, bytes, ((int64_t)layer * f->E + expert) * f->eb, f->path, err, errlen);
}

static int file_make(model_file *f, int L, int E, int64_t eb) {
  memset(f, 0, sizeof *f);
  snprintf(f->path, sizeof f->path, "/tmp/anna_expert_store_XXXXXX");
  f->fd = mkstemp(f->path);
  if (f->fd < 0) return -1;
  unlink(f->path);
  f->L = L, f->E = E, f->eb = eb;
  unsigned char *buf = (unsigned char *)malloc((size_t)eb);
  for (int l = 0; l < L; l++)
    for (int e = 0; e < E; e++) {
      for (int64_t i = 0; i < eb; i++) buf[i] = pattern(l, e, i);
      if (pwrite(f->fd, buf, (size_t)eb, ((int64_t)l * E + e) * eb) != (ssize_t)eb) return -1;
    }
  free(buf);
  return 0;
}

static int holds(const unsigned char *slot, int l, int e, int64_t eb) {
  for (int64_t i = 0; i < eb; i++)
    if (slot[i] != pattern(l, e, i)) return 0;
  return 1;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}

/* A skewed pick: a few hot experts per layer (which drift), a long uniform tail. */
static int pick(int l, int E, int round) {
  uint32_t r = rnd() % 100;
  if (r < 60) return (int)((l * 7 + round / 250 + rnd() % 3) % E + E - 1 - 2 * l) % E;
  return (int)(rnd() % (uint32_t)E);
}

static int chunk_allocs, chunk_limit = -1;
static void *limited_alloc(void *user, size_t bytes) {
  (void)user;
  if (chunk_limit >= 0 && chunk_allocs >= chunk_limit) return NULL;
  chunk_allocs++;
  return malloc(bytes);
}
static void limited_free(void *user, void *p) {
  (void)user;
  free(p);
}

/* The 1,000-round trace over one configuration. */
static void run_trace(const char *name, int L, int E, int64_t eb, int64_t host_budget, int chunk_lim, int rounds) {
  model_file f;
  if (file_make(&f, L, E, eb)) {
    CHECK(0, "%s: cannot make the model file", name);
    return;
  }
  const int C = 4, S = 16, tokens = 4, k = 4;
  const int64_t dense = 100000;
  expert_store_params p = {
      .n_layers = L, .n_experts = E, .expert_bytes = eb,
      .device_budget = dense + (int64_t)(S + C * L) * eb + eb / 2, /* exactly C slots per layer fit */
      .dense_bytes = dense, .cache_bytes = -1, .staging_slots = S,
      .host_budget = host_budget, .chunk_bytes = 5 * eb, .swap_every = 1, .decay = 0.75f,
      .read = file_read, .read_user = &f,
      .host_alloc = limited_alloc, .host_free = limited_free,
  };
  chunk_allocs = 0;
  chunk_limit = chunk_lim;
  char err[512] = "";
  expert_store *st = NULL;
  int rc = expert_store_open(&st, &p, err, sizeof err);
  CHECK(rc == 0, "%s: open: %s", name, err);
  if (rc) {
    close(f.fd);
    return;
  }
  expert_store_stats s0;
  expert_store_get_stats(st, &s0);
  CHECK(s0.cache_per_layer == C, "%s: %d cache slots per layer, want %d", name, s0.cache_per_layer, C);
  CHECK(s0.n_slots == C * L + S, "%s: %d slots", name, s0.n_slots);
  CHECK(f.reads == s0.mirrored, "%s: %lld reads to mirror %lld experts", name, (long long)f.reads,
        (long long)s0.mirrored);
  const int64_t want_mirror = host_budget < 0 ? (int64_t)L * E : host_budget / eb;
  if (chunk_lim < 0)
    CHECK(s0.mirrored == (want_mirror < (int64_t)L * E ? want_mirror : (int64_t)L * E), "%s: %lld mirrored", name,
          (long long)s0.mirrored);
  else
    CHECK(s0.mirrored == (int64_t)chunk_lim * 5, "%s: partial mirror of %lld experts", name, (long long)s0.mirrored);
  const int64_t reads0 = f.reads;
  /* the device arena, filled with the initial residents */
  const int n_slots = expert_store_n_slots(st);
  unsigned char *arena = (unsigned char *)calloc((size_t)n_slots, (size_t)eb);
  int64_t copies = 0;
  for (int s = 0; s < n_slots; s++) {
    int l, e;
    expert_store_slot_owner(st, s, &l, &e);
    if (l >= 0) {
      CHECK(expert_store_fetch(st, l, e, arena + (int64_t)s * eb, err, sizeof err) == 0, "%s: %s", name, err);
      copies++;
    }
  }
  expert_store_place *places = (expert_store_place *)malloc(sizeof *places * (size_t)(tokens * k));
  expert_store_place *swaps = (expert_store_place *)malloc(sizeof *swaps * (size_t)(C * L));
  int32_t *pin_owner = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_slots * 2);
  int32_t ids[64];
  expert_store_place flight[64];
  int n_flight = 0;
  int64_t total_swaps = 0;
  int hot_resident = 0;
  const int failures0 = failures;
  for (int round = 0; round < rounds && failures == failures0; round++) {
    /* the last layer's work may still run when the step's plan is made: its slots stay pinned */
    const int in_flight = rnd() % 2 ? L - 1 : -1;
    for (int l = 0; l < L; l++) {
      const int n_tok = 1 + (int)(rnd() % tokens);
      for (int t = 0; t < n_tok; t++)
        for (int j = 0; j < k; j++) ids[t * k + j] = pick(l, E, round);
      if (rnd() % 8 == 0) ids[0] = -1; /* a padding slot */
      int np = 0;
      rc = expert_store_route(st, l, ids, n_tok * k, places, &np, err, sizeof err);
      CHECK(rc == 0, "%s round %d layer %d: route: %s", name, round, l, err);
      if (rc) break;
      for (int i = 0; i < np; i++) {
        CHECK(places[i].layer == l && places[i].slot >= 0 && places[i].slot < n_slots, "%s: bad place", name);
        if (places[i].copy) {
          CHECK(expert_store_fetch(st, l, places[i].expert, arena + (int64_t)places[i].slot * eb, err, sizeof err) == 0,
                "%s: fetch: %s", name, err);
          copies++;
        }
      }
      /* the "kernel": every routed id finds its expert's bytes */
      for (int i = 0; i < n_tok * k; i++) {
        if (ids[i] < 0) continue;
        int found = 0;
        for (int j = 0; j < np; j++)
          if (places[j].expert == ids[i]) {
            found = 1;
            CHECK(holds(arena + (int64_t)places[j].slot * eb, l, ids[i], eb),
                  "%s round %d: layer %d expert %d: slot %d holds other bytes", name, round, l, ids[i], places[j].slot);
          }
        CHECK(found, "%s round %d: layer %d expert %d not placed", name, round, l, ids[i]);
      }
      if (l != in_flight) expert_store_release(st, l);
      else {
        memcpy(flight, places, sizeof *places * (size_t)np);
        n_flight = np;
      }
    }
    if (failures != failures0) break;
    for (int s = 0; s < n_slots; s++) expert_store_slot_owner(st, s, &pin_owner[2 * s], &pin_owner[2 * s + 1]);
    CHECK(expert_store_step(st) == 1, "%s: swap_every 1 plans every step", name);
    const int ns = expert_store_plan_swaps(st, swaps, C * L);
    total_swaps += ns;
    for (int i = 0; i < ns; i++) {
      CHECK(swaps[i].slot < C * L && swaps[i].slot / C == swaps[i].layer, "%s: swap into slot %d of another layer",
            name, swaps[i].slot);
      CHECK(swaps[i].victim == pin_owner[2 * swaps[i].slot + 1], "%s: swap victim %d, slot held %d", name,
            swaps[i].victim, pin_owner[2 * swaps[i].slot + 1]);
      CHECK(expert_store_fetch(st, swaps[i].layer, swaps[i].expert, arena + (int64_t)swaps[i].slot * eb, err,
                               sizeof err) == 0,
            "%s: swap fetch: %s", name, err);
      copies++;
    }
    /* the layer in flight: none of its slots was a swap target, each kept its owner */
    if (in_flight >= 0) {
      for (int i = 0; i < n_flight; i++) {
        int l, e;
        expert_store_slot_owner(st, flight[i].slot, &l, &e);
        CHECK(l == in_flight && e == flight[i].expert, "%s round %d: pinned slot %d of layer %d now holds %d/%d", name,
              round, flight[i].slot, in_flight, l, e);
        for (int j = 0; j < ns; j++)
          CHECK(swaps[j].slot != flight[i].slot, "%s round %d: pinned slot %d swapped", name, round, flight[i].slot);
      }
      expert_store_release(st, in_flight);
    }
    rc = expert_store_check(st, err, sizeof err);
    CHECK(rc == 0, "%s round %d: %s", name, round, err);
    const int32_t *tab = expert_store_table(st);
    for (int l = 0; l < L; l++)
      for (int e = 0; e < E; e++) {
        const int s = tab[l * E + e];
        if (s >= 0)
          CHECK(holds(arena + (int64_t)s * eb, l, e, eb), "%s round %d: resident layer %d expert %d: slot %d stale",
                name, round, l, e, s);
      }
    /* every expert reachable from the host tiers, whatever the device holds */
    for (int l = 0; l < L && round % 100 == 0; l++)
      for (int e = 0; e < E; e++) {
        unsigned char *tmp = (unsigned char *)malloc((size_t)eb);
        CHECK(expert_store_fetch(st, l, e, tmp, err, sizeof err) == 0 && holds(tmp, l, e, eb),
              "%s: layer %d expert %d unreachable", name, l, e);
        copies++;
        free(tmp);
      }
    if (round == rounds - 1) {
      /* the hottest expert of each layer (its current favourite) ended in the cache */
      for (int l = 0; l < L; l++) hot_resident += tab[l * E + (int)((l * 7 + round / 250 + 1) % E + E - 1 - 2 * l) % E] >= 0;
    }
  }
  expert_store_stats s1;
  expert_store_get_stats(st, &s1);
  CHECK(s1.bytes_from_mirror + s1.bytes_from_disk == copies * eb, "%s: %lld + %lld bytes moved, %lld copies of %lld",
        name, (long long)s1.bytes_from_mirror, (long long)s1.bytes_from_disk, (long long)copies, (long long)eb);
  CHECK((f.reads - reads0) * eb == s1.bytes_from_disk, "%s: %lld file reads after open, %lld disk bytes", name,
        (long long)(f.reads - reads0), (long long)s1.bytes_from_disk);
  CHECK(s1.swap_rounds == rounds, "%s: %lld swap rounds", name, (long long)s1.swap_rounds);
  CHECK(s1.swaps == total_swaps && total_swaps > 0, "%s: %lld swaps", name, (long long)total_swaps);
  CHECK(s1.hits + s1.misses == s1.routed, "%s: hits %lld + misses %lld != routed %lld", name, (long long)s1.hits,
        (long long)s1.misses, (long long)s1.routed);
  CHECK(hot_resident == L, "%s: the hot expert is resident in %d of %d layers", name, hot_resident, L);
  const double hit = (double)s1.hits / (double)(s1.routed ? s1.routed : 1);
  CHECK(hit > 0.3, "%s: hit rate %.3f with a skewed trace", name, hit);
  printf("%s: %d rounds, %lld swaps, hit rate %.3f, %lld mirrored, %lld B from mirror, %lld B from disk\n", name,
         rounds, (long long)total_swaps, hit, (long long)s1.mirrored, (long long)s1.bytes_from_mirror,
         (long long)s1.bytes_from_disk);
  free(arena);
  free(places);
  free(swaps);
  free(pin_owner);
  expert_store_free(st);
  close(f.fd);
}

/* Plans never evict a pinned slot: every resident of a layer is routed and left pinned
 * while a cold layer's counts make all of them victims. */
static void test_pinned(void) {
  model_file f;
  if (file_make(&f, 2, 16, 64)) {
    CHECK(0, "pinned: model file");
    return;
  }
  expert_store_params p = {.n_layers = 2, .n_experts = 16, .expert_bytes = 64, .slots_per_layer = 4,
                           .cache_bytes = -1, .staging_slots = 8, .host_budget = 0, .swap_every = 1,
                           .decay = 1.0f, .read = file_read, .read_user = &f};
  char err[512];
  expert_store *st = NULL;
  int rc = expert_store_open(&st, &p, err, sizeof err);
  CHECK(rc == 0, "pinned: open: %s", err);
  if (rc) return;
  expert_store_place pl[16], sw[8];
  int np;
  int32_t cold[4] = {0, 1, 2, 3};  /* the residents, routed once and pinned */
  int32_t hot[8] = {8, 9, 10, 11, 8, 9, 10, 11};
  CHECK(expert_store_route(st, 0, cold, 4, pl, &np, err, sizeof err) == 0 && np == 4, "pinned: route: %s", err);
  for (int r = 0; r < 4; r++) {
    CHECK(expert_store_route(st, 1, hot, 8, pl, &np, err, sizeof err) == 0, "pinned: hot route: %s", err);
    expert_store_release(st, 1);
  }
  /* layer 0: make 8..11 hot too, but through a second call it cannot make while pinned */
  CHECK(expert_store_route(st, 0, hot, 8, pl, &np, err, sizeof err) == ANNA_ESTATE, "pinned: second route allowed");
  int n = expert_store_plan_swaps(st, sw, 8);
  for (int i = 0; i < n; i++) CHECK(sw[i].layer != 0, "pinned: swapped slot %d of the pinned layer", sw[i].slot);
  CHECK(n == 4, "pinned: %d swaps in the free layer, want 4", n);
  expert_store_release(st, 0);
  /* now the same counts in layer 0 do move it */
  for (int r = 0; r < 4; r++) {
    CHECK(expert_store_route(st, 0, hot, 8, pl, &np, err, sizeof err) == 0, "pinned: route: %s", err);
    expert_store_release(st, 0);
  }
  n = expert_store_plan_swaps(st, sw, 8);
  CHECK(n == 4, "pinned: %d swaps after release, want 4", n);
  CHECK(expert_store_check(st, err, sizeof err) == 0, "pinned: %s", err);
  /* counts gathered elsewhere (the device counters of the zero-copy path) drive the plan the
   * same way, and count as hits for residents, misses otherwise */
  {
    expert_store_stats a, b;
    expert_store_get_stats(st, &a);
    float c[16] = {0};
    c[13] = 50.0f, c[14] = 40.0f, c[8] = 3.0f; /* 8 is resident (moved in above) */
    expert_store_add_counts(st, 1, c);
    expert_store_get_stats(st, &b);
    CHECK(b.routed - a.routed == 93 && b.hits - a.hits == 3 && b.misses - a.misses == 90,
          "add_counts: routed %lld hits %lld misses %lld", (long long)(b.routed - a.routed),
          (long long)(b.hits - a.hits), (long long)(b.misses - a.misses));
    n = expert_store_plan_swaps(st, sw, 8);
    const int32_t *tab = expert_store_table(st);
    CHECK(tab[16 + 13] >= 0 && tab[16 + 14] >= 0, "add_counts: the counted experts did not move in (%d swaps)", n);
    CHECK(expert_store_check(st, err, sizeof err) == 0, "add_counts: %s", err);
  }
  /* a prefill chunk noted without placing (the backend streams it): distinct experts per
   * call as route counts them, every occurrence in the swap counts, nothing pinned */
  {
    expert_store_stats a, b;
    expert_store_get_stats(st, &a);
    const int32_t *tab = expert_store_table(st);
    int32_t ids[12] = {5, 6, 5, -1, 7, 6, 5, 8, 8, 5, 6, 7};
    int want_hits = 0;
    const int32_t d[4] = {5, 6, 7, 8};
    for (int i = 0; i < 4; i++) want_hits += tab[d[i]] >= 0;
    CHECK(expert_store_note_chunk(st, 0, ids, 12, err, sizeof err) == 0, "note_chunk: %s", err);
    expert_store_get_stats(st, &b);
    CHECK(b.routed - a.routed == 4 && b.hits - a.hits == want_hits && b.misses - a.misses == 4 - want_hits,
          "note_chunk: routed %lld hits %lld (want %d) misses %lld", (long long)(b.routed - a.routed),
          (long long)(b.hits - a.hits), want_hits, (long long)(b.misses - a.misses));
    int32_t bad[2] = {3, 16};
    CHECK(expert_store_note_chunk(st, 0, bad, 2, err, sizeof err) == ANNA_ERANGE && strstr(err, "16"),
          "note_chunk: id 16 of 16 accepted");
    CHECK(expert_store_note_chunk(st, 2, ids, 12, err, sizeof err) == ANNA_ERANGE, "note_chunk: layer 2 of 2 accepted");
    /* nothing pinned: a route of the same layer is allowed, and 5 (4 uses a chunk) moves in */
    for (int r = 0; r < 20; r++) CHECK(expert_store_note_chunk(st, 0, ids, 12, err, sizeof err) == 0, "note_chunk: %s", err);
    CHECK(expert_store_route(st, 0, ids, 3, pl, &np, err, sizeof err) == 0, "note_chunk then route: %s", err);
    expert_store_release(st, 0);
    n = expert_store_plan_swaps(st, sw, 8);
    CHECK(tab[5] >= 0 && tab[6] >= 0, "note_chunk: the noted experts did not move in (%d swaps)", n);
    CHECK(expert_store_check(st, err, sizeof err) == 0, "note_chunk: %s", err);
  }
  expert_store_free(st);
  close(f.fd);
}

static void test_errors(void) {
  model_file f;
  if (file_make(&f, 3, 8, 1000)) {
    CHECK(0, "errors: model file");
    return;
  }
  char err[512] = "";
  expert_store *st = NULL;
  expert_store_params p = {.n_layers = 3, .n_experts = 8, .expert_bytes = 1000, .device_budget = 5000,
                           .dense_bytes = 4500, .cache_bytes = -1, .staging_slots = 2, .host_budget = -1,
                           .swap_every = 1, .read = file_read, .read_user = &f};
  /* below the dense weights + staging: the message names the bytes needed */
  int rc = expert_store_open(&st, &p, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "6500 bytes needed") && strstr(err, "5000"), "errors: budget: %d %s", rc,
        err);
  p.device_budget = 1000, p.dense_bytes = 2000;
  rc = expert_store_open(&st, &p, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "4000 bytes needed"), "errors: below dense: %d %s", rc, err);
  /* forced slots that do not fit */
  p.device_budget = 10000, p.dense_bytes = 1000, p.slots_per_layer = 4;
  rc = expert_store_open(&st, &p, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "12000 bytes"), "errors: forced slots: %d %s", rc, err);
  /* auto without any budget */
  p.device_budget = 0, p.slots_per_layer = 0;
  rc = expert_store_open(&st, &p, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "auto"), "errors: auto without a limit: %d %s", rc, err);
  /* bad parameters */
  p.device_budget = 100000, p.staging_slots = 0;
  CHECK(expert_store_open(&st, &p, err, sizeof err) == ANNA_EINVAL, "errors: zero staging accepted");
  p.staging_slots = 2, p.read = NULL;
  CHECK(expert_store_open(&st, &p, err, sizeof err) == ANNA_EINVAL, "errors: no reader accepted");
  p.read = file_read, p.decay = 2.0f;
  CHECK(expert_store_open(&st, &p, err, sizeof err) == ANNA_EINVAL, "errors: decay 2 accepted");
  p.decay = 0.5f;
  /* a working store: budget 100000 - 1000 - 2 staging x 1000 leaves room for all 8 */
  rc = expert_store_open(&st, &p, err, sizeof err);
  CHECK(rc == 0 && expert_store_cache_per_layer(st) == 8, "errors: open: %d %s", rc, err);
  if (rc) return;
  expert_store_place pl[8];
  int np;
  int32_t bad[2] = {1, 8};
  CHECK(expert_store_route(st, 0, bad, 2, pl, &np, err, sizeof err) == ANNA_ERANGE && strstr(err, "expert id 8"),
        "errors: id 8 accepted: %s", err);
  CHECK(expert_store_route(st, 3, bad, 1, pl, &np, err, sizeof err) == ANNA_ERANGE, "errors: layer 3 accepted");
  expert_store_free(st);
  /* more misses than staging slots */
  p.cache_bytes = 0;
  rc = expert_store_open(&st, &p, err, sizeof err);
  CHECK(rc == 0 && expert_store_cache_per_layer(st) == 0, "errors: no-cache open: %d %s", rc, err);
  if (rc) return;
  int32_t three[3] = {0, 1, 2};
  CHECK(expert_store_route(st, 0, three, 3, pl, &np, err, sizeof err) == ANNA_ESTATE && strstr(err, "staging"),
        "errors: 3 misses in 2 staging slots: %s", err);
  CHECK(expert_store_route(st, 0, three, 2, pl, &np, err, sizeof err) == 0 && np == 2, "errors: 2 misses: %s", err);
  CHECK(expert_store_route(st, 1, three + 2, 1, pl, &np, err, sizeof err) == ANNA_ESTATE,
        "errors: staging taken by an unreleased layer was reused");
  expert_store_release(st, 0);
  CHECK(expert_store_route(st, 1, three + 2, 1, pl, &np, err, sizeof err) == 0, "errors: after release: %s", err);
  expert_store_release(st, 1);
  CHECK(expert_store_check(st, err, sizeof err) == 0, "errors: %s", err);
  expert_store_free(st);
  /* a file too short is an I/O error naming it */
  unsigned char buf[16];
  CHECK(expert_store_pread(f.fd, buf, sizeof buf, (int64_t)1 << 40, "m.gguf", err, sizeof err) == ANNA_EIO &&
            strstr(err, "m.gguf"),
        "errors: short read: %s", err);
  close(f.fd);
}

int main(void) {
  test_errors();
  test_pinned();
  run_trace("half mirrored", 6, 32, 256, 96 * 256, -1, 1000);
  run_trace("all mirrored", 4, 64, 128, -1, -1, 1000);
  run_trace("disk only", 4, 32, 96, 0, -1, 1000);
  run_trace("chunk allocation fails", 4, 32, 128, -1, 3, 1000);
  if (failures) {
    fprintf(stderr, "test_expert_store: %d failures\n", failures);
    return 1;
  }
  printf("test_expert_store: ok\n");
  return 0;
}
