/* bench_structured: the per-step cost of structured-output masks for a batch of B sequences
 * (issue 30: "mask cost under 5% of a decode step at batch 64"), at a real vocabulary.
 * For each case (a JSON Schema or a GBNF grammar, and a sample reply that follows it) B
 * states are set at staggered positions of the tokenized reply (sequence b starts at token
 * b mod n, so the batch mixes structural and in-string positions as a real batch would);
 * each step computes all B full-vocabulary masks one after another (as the engine thread
 * does before sampling) and feeds each state its next token. Prints the mean and worst time
 * of one batch step's masks, and per mask.
 * THREADS > 0 also computes each step's masks on that many worker threads, each with its own
 * scratch (a jsonschema scratch, a gbnf masker), as the engine's mask pool does
 * (--mask-threads): the wall time of the compute phase (the rows masked, kept as bitsets of
 * rejected tokens) and of the apply phase (bitsets onto B logits rows, on the same threads),
 * and checks every pooled row equals the serial one bit for bit (exit 1 otherwise: ctest runs
 * it so on the fixture tokenizer).
 * JSON Schema cases also run through the mask cache (jsonschema_mask_bits_cached, CACHE_MIB
 * > 0; one cache per case, cold at its first step, as a server meets a new schema): serially
 * as the engine thread does (cached bitset applied onto the row) and, with THREADS > 0, on
 * the workers (the bitsets straight from the cache); every cached mask must equal the
 * uncached one bit for bit. "person varied" gives each sequence its own reply (names,
 * ages, emails, 0-5 tags, spacing drawn per sequence), so states differ across the batch as
 * they do with real requests; the other cases replay one reply at staggered positions.
 *   bench_structured MODEL.gguf|TOKENIZER_DIR [BATCH=64] [STEPS=32] [THREADS=0] [CACHE_MIB=64]
 */
#include "server/gbnf.h"
#include "server/jsonschema.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* the machine may be shared: CPU time, not wall */
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static double wall_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* The pooled masks: T workers behind two barriers per phase; job b is sequence b. */
typedef struct pool {
  int T, B, V, is_g, phase, quit;
  size_t words;
  pthread_barrier_t start, end;
  atomic_int next;
  jschema_vocab *voc;
  jschema_mcache *mc;
  uint64_t *cbits; /* [B * words] phase 2: the bitsets from the cache */
  jschema_scratch **jsc;
  gbnf_masker **gm;
  const jschema_state *js;
  const gbnf_state *gs;
  float *rows;    /* [B * V] phase 0: each sequence's masked zero row (checked after) */
  uint64_t *bits; /* [B * words] rejected tokens */
  float *logits;  /* [B * V] phase 1: the bitsets applied */
  int *allowed;
} pool;

static void *pool_worker(void *arg) {
  pool *p = ((pool **)arg)[0];
  const int w = (int)(intptr_t)((void **)arg)[1];
  for (;;) {
    pthread_barrier_wait(&p->start);
    if (p->quit) return NULL;
    for (int b; (b = atomic_fetch_add(&p->next, 1)) < p->B;) {
      float *row = p->rows + (size_t)b * p->V;
      uint64_t *bits = p->bits + (size_t)b * p->words;
      if (p->phase == 1) {
        jsonschema_bits_apply(bits, p->V, p->logits + (size_t)b * p->V);
        continue;
      }
      if (p->phase == 2) {
        p->allowed[b] = jsonschema_mask_bits_cached(p->voc, p->mc, p->jsc[w], &p->js[b], p->cbits + (size_t)b * p->words);
        continue;
      }
      memset(row, 0, (size_t)p->V * sizeof *row);
      p->allowed[b] = p->is_g ? gbnf_mask(p->gm[w], &p->gs[b], row)
                              : jsonschema_vocab_mask_with(p->voc, p->jsc[w], &p->js[b], row);
      jsonschema_mask_bits(row, p->V, bits);
    }
    pthread_barrier_wait(&p->end);
  }
}

static double pool_run(pool *p, int phase) {
  double a = wall_us();
  p->phase = phase;
  atomic_store(&p->next, 0);
  pthread_barrier_wait(&p->start);
  pthread_barrier_wait(&p->end);
  return wall_us() - a;
}

static const char *JSON_GBNF =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
    "[0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] "
    "[1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char *PERSON_REPLY =
    "{\"name\": \"Ada Lovelace, the first programmer\", \"age\": 36, \"email\": "
    "\"ada@analytical.org\", \"tags\": [\"math\", \"poetry\", \"engines\"]}";

#define PERSON_SCHEMA                                                                              \
  "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"            \
  "\"integer\"},\"email\":{\"type\":\"string\",\"format\":\"email\"},\"tags\":{\"type\":"              \
  "\"array\",\"items\":{\"type\":\"string\",\"maxLength\":20},\"maxItems\":5}},\"required\":"           \
  "[\"name\",\"age\",\"email\",\"tags\"],\"additionalProperties\":false}"

static int rnd_n(uint64_t *r, int n) {
  *r = *r * 6364136223846793005ull + 1442695040888963407ull;
  return (int)((*r >> 33) % (uint64_t)n);
}

/* Reply b of "person varied": the same schema, different content and spacing per sequence. */
static void person_varied(int b, char *out, size_t cap) {
  static const char *first[] = {"Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Margaret", "Ken",
                                "Dennis", "Frances", "John", "Radia", "Niklaus", "Sophie", "Tim", "Leslie"};
  static const char *last[] = {"Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Hamilton",
                               "Thompson", "Ritchie", "Allen", "Backus", "Perlman", "Wirth", "Wilson"};
  static const char *dom[] = {"example.org", "mail.com", "uni.edu", "lab.io", "acm.org"};
  static const char *tag[] = {"math", "poetry", "compilers", "graphs", "proofs", "networks", "c",
                              "structured programming", "unix", "lisp", "types", "ai"};
  uint64_t r = (uint64_t)b * 2654435761u + 12345;
  const char *f = first[rnd_n(&r, 16)];
  const char *l = last[rnd_n(&r, 14)];
  const char *sp = rnd_n(&r, 2) ? " " : "";
  const int num = rnd_n(&r, 100), age = 20 + rnd_n(&r, 60);
  const char *d = dom[rnd_n(&r, 5)];
  char email[128], tags[256] = "";
  snprintf(email, sizeof email, "%c%s%d@%s", f[0] | 0x20, l, num, d);
  for (int k = 0, nt = rnd_n(&r, 6); k < nt; k++) {
    const char *t = tag[rnd_n(&r, 12)];
    const char *sep = k ? (rnd_n(&r, 2) ? ", " : ",") : "";
    size_t o = strlen(tags);
    snprintf(tags + o, sizeof tags - o, "%s\"%s\"", sep, strlen(t) > 20 ? "long" : t);
  }
  snprintf(out, cap, "{\"name\":%s\"%s %s\",%s\"age\":%s%d,%s\"email\":%s\"%s\",%s\"tags\":%s[%s]}", sp, f, l,
           sp, sp, age, sp, sp, email, sp, sp, tags);
}

/* kind 's': JSON Schema, 'v': JSON Schema with per-sequence replies, 'g': GBNF */
static const char *const CASES[][4] = {
    {"s", "schema person", PERSON_SCHEMA, NULL},
    {"v", "person varied", PERSON_SCHEMA, NULL},
    {"g", "gbnf json", NULL, NULL},
    {"g", "gbnf arith",
     "root ::= expr\nexpr ::= term (ws (\"+\" | \"-\") ws term)*\n"
     "term ::= factor (ws (\"*\" | \"/\") ws factor)*\n"
     "factor ::= [0-9]+ | \"(\" ws expr ws \")\"\nws ::= \" \"?\n",
     "(12 + 7) * (3 - 1) / 4 + 100 * (2 + (5 - 3) * 8) - 42 / (6 + 1)"},
    {"g", "gbnf line", "root ::= \"Answer: \" [^\\n]{1,300} \"\\n\"\n",
     "Answer: The quick brown fox jumps over the lazy dog while the committee debates whether "
     "structured output should cost more than a few percent of a decode step.\n"},
};

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf|TOKENIZER_DIR [BATCH] [STEPS]\n", argv[0]);
    return 2;
  }
  int B = argc > 2 ? atoi(argv[2]) : 64, steps = argc > 3 ? atoi(argv[3]) : 32;
  int T = argc > 4 ? atoi(argv[4]) : 0, cache_mib = argc > 5 ? atoi(argv[5]) : 64;
  if (B < 1 || steps < 1 || T < 0 || T > 64) return 2;
  char err[400];
  anna_text *text = NULL;
  if (anna_text_open(&text, argv[1], ANNA_TEXT_NO_TEMPLATE, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  int V = anna_text_vocab(text);
  jschema_vocab *voc = NULL;
  gbnf_masker *gm = NULL;
  if (jsonschema_vocab_from_text(&voc, text) || gbnf_masker_new(&gm, voc)) return 1;
  const char *bytes;
  const uint32_t *off;
  const uint8_t *cls;
  jsonschema_vocab_tables(voc, &bytes, &off, &cls);
  float *row = malloc((size_t)V * sizeof *row);
  jschema_state *js = malloc((size_t)B * sizeof *js);
  gbnf_state *gs = malloc((size_t)B * sizeof *gs);
  int *pos = malloc((size_t)B * sizeof *pos);
  printf("vocab %d tokens, batch %d, %d steps, %d mask threads\n", V, B, steps, T);
  pool P = {.T = T, .B = B, .V = V, .voc = voc, .js = js, .gs = gs};
  pthread_t *th = NULL;
  void *(*targ)[2] = NULL;
  float *serial = malloc((size_t)B * V * sizeof *serial);
  if (T > 0) {
    P.words = ((size_t)V + 63) / 64;
    P.jsc = calloc((size_t)T, sizeof *P.jsc);
    P.gm = calloc((size_t)T, sizeof *P.gm);
    P.rows = malloc((size_t)B * V * sizeof *P.rows);
    P.logits = malloc((size_t)B * V * sizeof *P.logits);
    P.bits = malloc((size_t)B * P.words * sizeof *P.bits);
    P.allowed = malloc((size_t)B * sizeof *P.allowed);
    th = malloc((size_t)T * sizeof *th);
    targ = malloc((size_t)T * sizeof *targ);
    if (!P.jsc || !P.gm || !P.rows || !P.logits || !serial || !P.bits || !P.allowed || !th || !targ)
      return 1;
    pthread_barrier_init(&P.start, NULL, (unsigned)T + 1);
    pthread_barrier_init(&P.end, NULL, (unsigned)T + 1);
    for (int w = 0; w < T; w++) {
      if (jsonschema_scratch_new(&P.jsc[w], voc) || gbnf_masker_new(&P.gm[w], voc)) return 1;
      targ[w][0] = &P;
      targ[w][1] = (void *)(intptr_t)w;
      pthread_create(&th[w], NULL, pool_worker, targ[w]);
    }
  }
  jschema_scratch *csc = NULL; /* the serial cached path's scratch (the engine thread's) */
  uint64_t *cbits = malloc(((size_t)V + 63) / 64 * sizeof *cbits);
  float *crow = malloc((size_t)V * sizeof *crow);
  int32_t **sids = calloc((size_t)B, sizeof *sids);
  size_t *sn = calloc((size_t)B, sizeof *sn);
  if (!cbits || !crow || !sids || !sn || jsonschema_scratch_new(&csc, voc)) return 1;
  if (T > 0 && !(P.cbits = malloc((size_t)B * P.words * sizeof *P.cbits))) return 1;
  for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
    int is_g = CASES[c][0][0] == 'g', varied = CASES[c][0][0] == 'v';
    const char *src = CASES[c][2] ? CASES[c][2] : JSON_GBNF;
    const char *reply = CASES[c][3] ? CASES[c][3] : PERSON_REPLY;
    jsonschema *s = NULL;
    gbnf *g = NULL;
    double t0 = now_us();
    if (is_g) {
      if (gbnf_compile(src, strlen(src), &g, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", CASES[c][1], err);
        return 1;
      }
    } else {
      json_error_t je;
      json_t *j = json_loads(src, 0, &je);
      if (!j || jsonschema_compile(j, &s, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", CASES[c][1], err);
        return 1;
      }
      json_decref(j);
    }
    double tc = now_us() - t0;
    jschema_mcache *mc = NULL, *pmc = NULL;
    if (!is_g && cache_mib > 0 &&
        (jsonschema_mcache_new(&mc, voc, (size_t)cache_mib << 20) ||
         (T > 0 && jsonschema_mcache_new(&pmc, voc, (size_t)cache_mib << 20))))
      return 1;
    P.mc = pmc;
    size_t n = 0, ntot = 0;
    /* sequence b: its reply (one for all but "varied"), fed its first (b mod n) tokens */
    for (int b = 0; b < B; b++) {
      char buf[1024];
      if (varied) person_varied(b, buf, sizeof buf);
      const char *rp = varied ? buf : reply;
      if (b == 0 || varied) {
        sids[b] = NULL;
        anna_text_tokenize(text, rp, strlen(rp), 0, &sids[b], &sn[b], NULL, 0);
      } else {
        sids[b] = sids[0];
        sn[b] = sn[0];
      }
      ntot += sn[b];
      n = sn[b];
      pos[b] = (int)((size_t)b % sn[b]);
      if (is_g)
        gbnf_start(g, &gs[b]);
      else
        jsonschema_start(s, &js[b]);
      for (int k = 0; k < pos[b]; k++) {
        const char *tb = bytes + off[sids[b][k]];
        size_t tn = off[sids[b][k] + 1] - off[sids[b][k]];
        if (is_g ? gbnf_feed(&gs[b], tb, tn) : jsonschema_feed(&js[b], tb, tn)) {
          fprintf(stderr, "%s: sequence %d's token %d is rejected\n", CASES[c][1], b, k);
          return 1;
        }
      }
    }
    double sum = 0, worst = 0, psum = 0, pworst = 0, asum = 0, wsum = 0;
    double csum = 0, cfirst = 0, cworst = 0, pcsum = 0, pcfirst = 0, clsum = 0;
    long allowed_sum = 0;
    P.is_g = is_g;
    for (int st = 0; st < steps; st++) {
      double a = now_us(), aw = wall_us();
      for (int b = 0; b < B; b++) {
        for (int v = 0; v < V; v++)
          row[v] = 0;
        int allowed = is_g ? gbnf_mask(gm, &gs[b], row) : jsonschema_vocab_mask(voc, &js[b], row);
        allowed_sum += allowed;
        if (T > 0 || mc) memcpy(serial + (size_t)b * V, row, (size_t)V * sizeof *row);
        if (isinf(row[sids[b][pos[b]]])) {
          fprintf(stderr, "%s: the mask rejects sequence %d's token %d\n", CASES[c][1], b, pos[b]);
          return 1;
        }
      }
      double t = now_us() - a;
      wsum += wall_us() - aw;
      sum += t;
      worst = t > worst ? t : worst;
      if (mc) {
        /* the engine thread's cached path: bitset from the cache, applied onto the row */
        double ca = now_us(), lk = 0;
        for (int b = 0; b < B; b++) {
          for (int v = 0; v < V; v++)
            crow[v] = 0;
          double l0 = now_us();
          jsonschema_mask_bits_cached(voc, mc, csc, &js[b], cbits);
          lk += now_us() - l0;
          jsonschema_bits_apply(cbits, V, crow);
          if (memcmp(crow, serial + (size_t)b * V, (size_t)V * sizeof *crow)) {
            fprintf(stderr, "%s: step %d sequence %d: the cached mask differs\n", CASES[c][1], st, b);
            return 1;
          }
        }
        double ct = now_us() - ca;
        /* the zero-row fill above is the test's, not the engine's: take it out again */
        double fz = now_us();
        for (int b = 0; b < B; b++)
          for (int v = 0; v < V; v++)
            crow[v] = 0;
        ct -= now_us() - fz;
        if (st == 0) cfirst = ct;
        else csum += ct, clsum += lk;
        cworst = ct > cworst ? ct : cworst;
      }
      if (T > 0) {
        /* pooled: the same masks on T threads, then applied onto B logits rows (all 1.0) */
        double pt = pool_run(&P, 0);
        psum += pt;
        pworst = pt > pworst ? pt : pworst;
        for (size_t q = 0; q < (size_t)B * V; q++)
          P.logits[q] = 1.0f;
        asum += pool_run(&P, 1);
        for (int b = 0; b < B; b++) {
          const float *sr = serial + (size_t)b * V, *pr = P.rows + (size_t)b * V,
                      *lr = P.logits + (size_t)b * V;
          int bad = memcmp(sr, pr, (size_t)V * sizeof *sr) != 0;
          for (int v = 0; v < V && !bad; v++)
            bad = (sr[v] == -INFINITY) != (lr[v] == -INFINITY);
          if (bad) {
            fprintf(stderr,
                    "%s: step %d sequence %d: the pooled mask differs from the serial one\n",
                    CASES[c][1], st, b);
            return 1;
          }
        }
        if (pmc) {
          double pc = pool_run(&P, 2);
          if (st == 0) pcfirst = pc;
          else pcsum += pc;
          if (memcmp(P.cbits, P.bits, (size_t)B * P.words * sizeof *P.bits)) {
            fprintf(stderr, "%s: step %d: the pooled cached bitsets differ\n", CASES[c][1], st);
            return 1;
          }
        }
      }
      /* advance every sequence one token; one that reached the end starts over */
      for (int b = 0; b < B; b++) {
        const char *tb = bytes + off[sids[b][pos[b]]];
        size_t tn = off[sids[b][pos[b]] + 1] - off[sids[b][pos[b]]];
        if (is_g)
          gbnf_feed(&gs[b], tb, tn);
        else
          jsonschema_feed(&js[b], tb, tn);
        if (++pos[b] == (int)sn[b]) {
          pos[b] = 0;
          if (is_g)
            gbnf_start(g, &gs[b]);
          else
            jsonschema_start(s, &js[b]);
        }
      }
    }
    printf("%-14s compile %6.0f us; reply %3zu tokens%s; batch-%d masks %8.2f ms/step (worst %8.2f), "
           "%.3f ms per mask, %ld allowed on average\n",
           CASES[c][1], tc, varied ? (ntot + B / 2) / B : n, varied ? " (mean)" : "", B, sum / steps / 1e3,
           worst / 1e3, sum / steps / B / 1e3, allowed_sum / ((long)steps * B));
    if (mc) {
      jschema_mcache_stats cs;
      jsonschema_mcache_get_stats(mc, &cs);
      printf("%-14s cached: first step %8.2f ms, then %8.3f ms/step (worst %8.2f), %.4f ms per mask "
             "(look-up %.4f, apply to the row %.4f); "
             "%llu hits, %llu misses (%.1f%% hits), %llu entries, %.2f MiB; equal to uncached\n",
             CASES[c][1], cfirst / 1e3, steps > 1 ? csum / (steps - 1) / 1e3 : 0.0, cworst / 1e3,
             steps > 1 ? csum / (steps - 1) / B / 1e3 : 0.0, steps > 1 ? clsum / (steps - 1) / B / 1e3 : 0.0,
             steps > 1 ? (csum - clsum) / (steps - 1) / B / 1e3 : 0.0, (unsigned long long)cs.hits,
             (unsigned long long)cs.misses, 100.0 * (double)cs.hits / (double)(cs.hits + cs.misses),
             (unsigned long long)cs.entries, (double)cs.bytes / 1048576.0);
    }
    if (T > 0)
      printf("%-14s serial %8.2f ms/step wall; %d threads: compute %8.2f ms/step wall (worst "
             "%8.2f), apply %6.2f ms/step wall; "
             "equal to serial\n",
             CASES[c][1], wsum / steps / 1e3, T, psum / steps / 1e3, pworst / 1e3,
             asum / steps / 1e3);
    if (pmc)
      printf("%-14s %d threads cached: compute first step %8.2f ms wall, then %8.3f ms/step wall; "
             "equal to uncached\n",
             CASES[c][1], T, pcfirst / 1e3, steps > 1 ? pcsum / (steps - 1) / 1e3 : 0.0);
    for (int b = 0; b < B; b++)
      if (b == 0 || varied) free(sids[b]);
    jsonschema_mcache_free(mc);
    jsonschema_mcache_free(pmc);
    P.mc = NULL;
    gbnf_release(g);
    jsonschema_release(s);
  }
  free(cbits), free(crow), free(sids), free(sn), free(P.cbits);
  jsonschema_scratch_free(csc);
  if (T > 0) {
    P.quit = 1;
    pthread_barrier_wait(&P.start);
    for (int w = 0; w < T; w++) {
      pthread_join(th[w], NULL);
      jsonschema_scratch_free(P.jsc[w]);
      gbnf_masker_free(P.gm[w]);
    }
    pthread_barrier_destroy(&P.start);
    pthread_barrier_destroy(&P.end);
    free(P.jsc), free(P.gm), free(P.rows), free(P.logits), free(serial), free(P.bits),
        free(P.allowed);
    free(th), free(targ);
  }
  free(row);
  free(js);
  free(gs);
  free(pos);
  gbnf_masker_free(gm);
  jsonschema_vocab_free(voc);
  anna_text_free(text);
  return 0;
}
