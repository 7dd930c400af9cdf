/* test_jsonmcache: the JSON Schema mask cache (jsonschema_mask_bits_cached) gives the masks
 * of the uncached path bit for bit. Random walks over the conformance suite's schemas
 * (data/structured_schemas.json: test_structured.py's 57 + its 3 default-model schemas +
 * the bench's "person" + a free-array one) on a real tokenizer's vocabulary (ctest: the qwen3
 * fixture's 1,000 tokens; also run by hand on the default model's 151,936): at every step
 * the uncached mask (a zero row through jsonschema_vocab_mask_with, read back as a bitset)
 * and the cached one must have the same bits and the same return value; then a random
 * allowed token is fed (biased toward structural tokens so walks leave strings). Passes:
 *   1. one cache for all schemas, room for everything: hits must happen (a free string's
 *      characters are one state), and a second walk over the same seeds hits every step;
 *   2. a 256 KiB budget: entries are evicted all the time and masks still agree;
 *   3. 4 threads walking at once over one shared cache (the engine's mask pool);
 *   4. a schema compiled twice (same text, two compile ids) never reuses the other's masks
 *      (keys differ), and freeing the cache with entries in it.
 *   test_jsonmcache TOKENIZER_DIR SCHEMAS.jsonl */
#include "server/jsonschema.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int V;
static size_t W;
static jschema_vocab *voc;
static const char *tbytes;
static const uint32_t *toff;
static const uint8_t *tcls;
static jsonschema *schemas[128];
static int n_schemas;
static int failures;
static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char *what, int si, int step) {
  pthread_mutex_lock(&fail_mu);
  if (failures++ < 20) printf("FAIL %s (schema %d, step %d)\n", what, si, step);
  pthread_mutex_unlock(&fail_mu);
}

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Structural tokens: short, or holding a byte that ends or opens something. */
static int structural(int t) {
  uint32_t n = toff[t + 1] - toff[t];
  if (n <= 2) return 1;
  for (uint32_t i = 0; i < n; i++)
    if (strchr("\"{}[],:", tbytes[toff[t] + i])) return 1;
  return 0;
}

typedef struct walker {
  jschema_scratch *ref, *sc;
  float *row;
  uint64_t *bits_ref, *bits;
  int32_t *allowed, *pref;
  long steps, hits_seen;
} walker;

static int walker_init(walker *w) {
  memset(w, 0, sizeof *w);
  w->row = malloc((size_t)V * sizeof *w->row);
  w->bits_ref = malloc(W * 8);
  w->bits = malloc(W * 8);
  w->allowed = malloc((size_t)V * sizeof *w->allowed);
  w->pref = malloc((size_t)V * sizeof *w->pref);
  return !w->row || !w->bits_ref || !w->bits || !w->allowed || !w->pref ||
         jsonschema_scratch_new(&w->ref, voc) || jsonschema_scratch_new(&w->sc, voc);
}

static void walker_free(walker *w) {
  free(w->row), free(w->bits_ref), free(w->bits), free(w->allowed), free(w->pref);
  jsonschema_scratch_free(w->ref);
  jsonschema_scratch_free(w->sc);
}

/* One random walk of up to `steps` tokens over schema si; every step compared. */
static void walk(walker *w, jschema_mcache *c, jsonschema *s, int si, uint64_t seed, int steps) {
  jschema_state st;
  jsonschema_start(s, &st);
  uint64_t r = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int k = 0; k < steps; k++) {
    memset(w->row, 0, (size_t)V * sizeof *w->row);
    int a_ref = jsonschema_vocab_mask_with(voc, w->ref, &st, w->row);
    jsonschema_mask_bits(w->row, V, w->bits_ref);
    memset(w->bits, 0x5a, W * 8); /* garbage: every word must be written */
    int a = jsonschema_mask_bits_cached(voc, c, w->sc, &st, w->bits);
    if (a != a_ref) fail("return value differs", si, k);
    if (memcmp(w->bits, w->bits_ref, W * 8)) fail("bits differ", si, k);
    w->steps++;
    int n = 0, np = 0;
    for (int t = 0; t < V; t++)
      if (!((w->bits_ref[t >> 6] >> (t & 63)) & 1) && tcls[t] == 0) {
        w->allowed[n++] = t;
        if (structural(t)) w->pref[np++] = t;
      }
    if (!n) break;
    int t = np && rnd(&r) % 10 < 7 ? w->pref[rnd(&r) % (uint64_t)np] : w->allowed[rnd(&r) % (uint64_t)n];
    if (jsonschema_feed(&st, tbytes + toff[t], toff[t + 1] - toff[t])) {
      fail("an allowed token is rejected by the recognizer", si, k);
      break;
    }
    if (jsonschema_done(&st) && rnd(&r) % 4 == 0) break;
  }
}

typedef struct job {
  jschema_mcache *c;
  int first, stride, walks, steps;
  walker w;
} job;

static void *run_job(void *arg) {
  job *j = arg;
  for (int si = j->first; si < n_schemas; si += j->stride)
    for (int q = 0; q < j->walks; q++)
      walk(&j->w, j->c, schemas[si], si, (uint64_t)si * 1000 + (uint64_t)q + 7, j->steps);
  return NULL;
}

static void stats(jschema_mcache *c, const char *name, jschema_mcache_stats *st) {
  jsonschema_mcache_get_stats(c, st);
  printf("%-28s hits %llu misses %llu inserts %llu evictions %llu entries %llu bytes %zu\n", name,
         (unsigned long long)st->hits, (unsigned long long)st->misses, (unsigned long long)st->inserts,
         (unsigned long long)st->evictions, (unsigned long long)st->entries, st->bytes);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s TOKENIZER_DIR SCHEMAS.jsonl\n", argv[0]);
    return 2;
  }
  char err[400];
  anna_text *text = NULL;
  if (anna_text_open(&text, argv[1], ANNA_TEXT_NO_TEMPLATE, err, sizeof err)) {
    printf("FAIL %s\n", err);
    return 1;
  }
  V = anna_text_vocab(text);
  W = ((size_t)V + 63) / 64;
  if (jsonschema_vocab_from_text(&voc, text)) return 1;
  jsonschema_vocab_tables(voc, &tbytes, &toff, &tcls);
  FILE *f = fopen(argv[2], "r");
  if (!f) {
    printf("FAIL cannot open %s\n", argv[2]);
    return 1;
  }
  char line[8192];
  while (fgets(line, sizeof line, f) && n_schemas < 128) {
    json_error_t je;
    json_t *j = json_loads(line, 0, &je);
    if (!j || jsonschema_compile(j, &schemas[n_schemas], err, sizeof err)) {
      printf("FAIL schema %d: %s\n", n_schemas, j ? err : je.text);
      return 1;
    }
    json_decref(j);
    n_schemas++;
  }
  fclose(f);
  printf("vocab %d, %d schemas\n", V, n_schemas);
  if (n_schemas < 50) {
    printf("FAIL fewer than 50 schemas\n");
    return 1;
  }

  walker w;
  if (walker_init(&w)) return 1;
  jschema_mcache_stats st, st2;

  /* 1. room for everything */
  jschema_mcache *c = NULL;
  if (jsonschema_mcache_new(&c, voc, (size_t)256 << 20)) return 1;
  job j1 = {.c = c, .first = 0, .stride = 1, .walks = 3, .steps = 40, .w = w};
  run_job(&j1);
  stats(c, "1. large budget", &st);
  if (st.hits == 0 || st.evictions != 0 || st.inserts != st.misses || st.entries != st.inserts)
    fail("pass 1: expected hits, no evictions, one insert per miss", -1, -1);
  /* the same walks again: every state is known */
  run_job(&j1);
  stats(c, "1b. same walks again", &st2);
  if (st2.misses != st.misses) fail("pass 1b: a repeated walk missed", -1, -1);
  /* a free string's characters are one state: "...":"abc and "...":"abcdef share a key */
  {
    json_t *js = json_loads("{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"},"
                            "\"l\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}},"
                            "\"required\":[\"s\",\"l\"]}",
                            0, NULL);
    jsonschema *s = NULL;
    if (!js || jsonschema_compile(js, &s, err, sizeof err)) return 1;
    json_decref(js);
    const char *pre[][2] = {{"{\"s\":\"abc", "{\"s\":\"abcdef gh"},
                            {"{\"s\":\"x\",\"l\":[1", "{\"s\":\"x\",\"l\":[1,22,333,4"}};
    for (int q = 0; q < 2; q++) {
      jschema_state a, b;
      jsonschema_start(s, &a);
      jsonschema_start(s, &b);
      if (jsonschema_feed(&a, pre[q][0], strlen(pre[q][0])) || jsonschema_feed(&b, pre[q][1], strlen(pre[q][1])))
        return 1;
      jsonschema_mcache_get_stats(c, &st);
      jsonschema_mask_bits_cached(voc, c, w.sc, &a, w.bits);
      jsonschema_mask_bits_cached(voc, c, w.sc, &b, w.bits_ref);
      jsonschema_mcache_get_stats(c, &st2);
      if (st2.hits != st.hits + 1 || memcmp(w.bits, w.bits_ref, W * 8))
        fail(q ? "an unbounded array's items are not one state" : "a free string's characters are not one state",
             -1, q);
    }
    /* 4. the same text compiled again: another id, so no hit on the first one's entries */
    jsonschema *s2 = NULL;
    js = json_loads("{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"},"
                    "\"l\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}},\"required\":[\"s\",\"l\"]}",
                    0, NULL);
    if (!js || jsonschema_compile(js, &s2, err, sizeof err)) return 1;
    json_decref(js);
    jschema_state a;
    jsonschema_start(s2, &a);
    jsonschema_feed(&a, pre[0][0], strlen(pre[0][0]));
    jsonschema_mcache_get_stats(c, &st);
    jsonschema_mask_bits_cached(voc, c, w.sc, &a, w.bits);
    jsonschema_mcache_get_stats(c, &st2);
    if (st2.hits != st.hits || st2.misses != st.misses + 1)
      fail("a second compile of the same schema hit the first one's entry", -1, -1);
    jsonschema_release(s);
    jsonschema_release(s2);
  }
  jsonschema_mcache_free(c); /* with entries in it */

  /* 2. a tiny budget: constant eviction */
  if (jsonschema_mcache_new(&c, voc, (size_t)256 << 10)) return 1;
  job j2 = {.c = c, .first = 0, .stride = 1, .walks = 2, .steps = 40, .w = w};
  run_job(&j2);
  stats(c, "2. 256 KiB budget", &st);
  if (st.evictions == 0 || st.bytes > ((size_t)256 << 10)) fail("pass 2: expected evictions within budget", -1, -1);
  jsonschema_mcache_free(c);

  /* 3. four threads, one cache (small enough to evict too) */
  if (jsonschema_mcache_new(&c, voc, (size_t)2 << 20)) return 1;
  job jt[4];
  pthread_t th[4];
  for (int t = 0; t < 4; t++) {
    /* every thread walks the same seeds: they race on the same keys (a miss inserted by
     * another thread meanwhile is dropped) */
    jt[t] = (job){.c = c, .first = 0, .stride = 1, .walks = 1, .steps = 30};
    if (walker_init(&jt[t].w)) return 1;
  }
  for (int t = 0; t < 4; t++)
    pthread_create(&th[t], NULL, run_job, &jt[t]);
  for (int t = 0; t < 4; t++) {
    pthread_join(th[t], NULL);
  }
  stats(c, "3. 4 threads, 2 MiB", &st);
  for (int t = 0; t < 4; t++)
    walker_free(&jt[t].w);
  if (st.hits == 0) fail("pass 3: no hits", -1, -1);
  jsonschema_mcache_free(c);

  printf("%ld single-thread steps compared (and 4 x %ld threaded)\n", j1.w.steps + j2.w.steps, jt[0].w.steps);
  walker_free(&w);
  for (int i = 0; i < n_schemas; i++)
    jsonschema_release(schemas[i]);
  jsonschema_vocab_free(voc);
  anna_text_free(text);
  if (failures) {
    printf("%d failures\n", failures);
    return 1;
  }
  printf("all cached masks equal the uncached ones\n");
  return 0;
}
