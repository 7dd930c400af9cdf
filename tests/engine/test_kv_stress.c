/* test_kv_stress.c: the paged KV pool under memory pressure never corrupts a running
 * sequence (issue: paged KV / prefix sharing).
 *
 * Several sequences run plans (one of a few shared prefixes, cut at a random length, plus a
 * random tail) fed in random chunks, several sequences per decode call, through a block pool
 * far smaller than n_seq * n_ctx (16-position blocks), with prefix reuse on: finished
 * sequences leave cached blocks behind, new ones attach them, allocation evicts them, and
 * calls that find no free block fail with ANNA_ERANGE (their sequences are reset and
 * restarted, as a server would); a quarter of the plans fork a running sequence instead
 * (seq_copy: shared blocks, copy on write). Every logit row a call returns is compared (1e-3) with a
 * fresh, unshared computation of the same tokens in a second context. Run for a dense model
 * and a hybrid GDN model; the run must see hits, evictions and copy-free reuse.
 * Usage: test_kv_stress FIXTURES_DIR [DEVICE [exact]]   (DEVICE: cpu (default), cuda; exact:
 * f32 activations everywhere, --exact) */
#include "anna/anna.h"
#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NSEQ 4
#define MAXT 200
/* Corruption (a row read from a block another sequence owns) shows as errors of order 1;
 * the reference runs the same tokens in different chunks, and this GDN fixture alone shows
 * up to 3e-4 between chunkings at an unlucky position (measured with sharing off). */
#define TOL 1e-3f
/* CUDA's default numerics (bf16 tensor-core prefill GEMMs, f16 flash attention for prefill
 * chunks) move logits between chunkings by more: the bound its fixtures are held to. Exact
 * mode keeps TOL; corruption is still orders of magnitude above either. */
#define TOL_CUDA_DEFAULT 5e-3f
static float g_tol = TOL;
static int g_exact;

static int g_fail;

static uint64_t g_rng = 0x1234567887654321ULL;
static int rnd(int n) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return (int)(g_rng % (uint64_t)n);
}

typedef struct plan {
  int32_t tok[MAXT];
  int n, fed, active;
  float *ref; /* [n][V] logits of a fresh computation */
} plan;

static const char *g_device;

static void stress(const char *root, const char *name) {
  char dir[1200], err[256];
  snprintf(dir, sizeof dir, "%.1000s/%.100s", root, name);
  anna_model *m = NULL;
  anna_context *c = NULL, *rc = NULL;
  if (anna_model_load(&m, dir, NULL, err, sizeof err)) {
    printf("FAIL %s: %s\n", name, err);
    g_fail++;
    return;
  }
  anna_context_options o = {.n_seq = NSEQ, .n_ctx = 256, .n_batch = 256, .n_threads = 2, .n_checkpoints = 6,
                            .kv_block_len = 16, .kv_blocks = 20,
                            .prefix_snapshot_interval = 32, .device = g_device,
                            .exact_matmul = g_exact};
  anna_context_options ro = {.n_seq = 1, .n_ctx = 256, .n_batch = 256, .n_threads = 2, .prefix_share = -1,
                             .device = g_device, .exact_matmul = g_exact};
  if (anna_context_create(&c, m, &o, err, sizeof err) || anna_context_create(&rc, m, &ro, err, sizeof err)) {
    printf("FAIL %s: %s\n", name, err);
    g_fail++;
    anna_context_free(c);
    anna_model_free(m);
    return;
  }
  const int V = anna_model_vocab(m);
  int32_t base[3][120];
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < 120; i++) base[k][i] = 1 + rnd(V - 1);
  plan pl[NSEQ];
  memset(pl, 0, sizeof pl);
  float *out = malloc(sizeof(float) * (size_t)V * 256);
  int32_t bt[256], bs[256], bp[256];
  int8_t bw[256];
  int owner[256], n_forks = 0, n_calls = 0, n_full = 0, n_rows = 0, n_done = 0;
  float worst = 0;
  for (int step = 0; step < 120; step++) {
    /* Start plans on idle sequences: prefix k cut at a random length + a random tail. */
    for (int q = 0; q < NSEQ; q++) {
      plan *p = &pl[q];
      if (p->active) continue;
      /* A quarter of the plans fork a running sequence at its current length (blocks
       * shared, the partial one copied on write by whichever writes first). */
      int from = -1;
      if (rnd(4) == 0)
        for (int o2 = 0; o2 < NSEQ; o2++)
          if (o2 != q && pl[o2].active && pl[o2].fed > 0 && pl[o2].fed < 140) from = o2;
      const int k = rnd(3), cut = from >= 0 ? pl[from].fed : 20 + rnd(100), tail = 1 + rnd(60);
      memcpy(p->tok, from >= 0 ? pl[from].tok : base[k], sizeof(int32_t) * (size_t)cut);
      for (int i = 0; i < tail; i++) p->tok[cut + i] = 1 + rnd(V - 1);
      p->n = cut + tail;
      free(p->ref);
      p->ref = malloc(sizeof(float) * (size_t)V * (size_t)p->n);
      int32_t sq[MAXT], pos[MAXT];
      for (int i = 0; i < p->n; i++) sq[i] = 0, pos[i] = i;
      anna_batch rb = {p->n, p->tok, sq, pos, NULL};
      anna_context_seq_reset(rc, 0);
      if (anna_context_decode(rc, &rb, p->ref, err, sizeof err)) {
        printf("FAIL %s: reference: %s\n", name, err);
        g_fail++;
        goto done;
      }
      if (from >= 0) {
        if (anna_context_seq_copy(c, q, from, cut, err, sizeof err)) {
          printf("FAIL %s: fork: %s\n", name, err);
          g_fail++;
          goto done;
        }
        p->fed = cut;
        n_forks++;
      } else {
        p->fed = anna_context_prefix_attach(c, q, p->tok, p->n - 1, ANNA_PREFIX_REGISTER);
      }
      if (p->fed < 0 || anna_context_seq_len(c, q) != p->fed) {
        printf("FAIL %s: attach returned %d\n", name, p->fed);
        g_fail++;
        goto done;
      }
      p->active = 1;
    }
    /* One call: a random chunk of 1..40 tokens from a random subset of the sequences. */
    int nb = 0, nflag = 0;
    for (int q = 0; q < NSEQ; q++) {
      plan *p = &pl[q];
      if (rnd(3) == 0) continue;
      int take = 1 + rnd(40);
      if (take > p->n - p->fed) take = p->n - p->fed;
      for (int i = 0; i < take; i++) {
        bt[nb] = p->tok[p->fed + i], bs[nb] = q, bp[nb] = p->fed + i;
        bw[nb] = i == take - 1 || rnd(8) == 0;
        if (bw[nb]) owner[nflag++] = nb;
        nb++;
      }
    }
    if (nb == 0) continue;
    anna_batch b = {nb, bt, bs, bp, bw};
    n_calls++;
    int r = anna_context_decode(c, &b, out, err, sizeof err);
    if (r == ANNA_ERANGE) { /* pool exhausted: those sequences start over */
      n_full++;
      for (int q = 0; q < NSEQ; q++)
        for (int i = 0; i < nb; i++)
          if (bs[i] == q) {
            anna_context_seq_reset(c, q);
            pl[q].active = 0;
            break;
          }
      continue;
    }
    if (r) {
      printf("FAIL %s: decode: %s\n", name, err);
      g_fail++;
      goto done;
    }
    for (int f = 0; f < nflag; f++) {
      const int i = owner[f], q = bs[i];
      const float *want = pl[q].ref + (size_t)bp[i] * V, *got = out + (size_t)f * V;
      float d = 0;
      for (int v = 0; v < V; v++) {
        const float e = fabsf(want[v] - got[v]);
        if (!(e <= d)) d = e;
      }
      if (!(d <= worst)) worst = d;
      n_rows++;
      if (!(d <= g_tol)) {
        printf("FAIL %s: step %d seq %d position %d differs from recomputation by %.2e\n", name, step, q, bp[i], d);
        g_fail++;
        goto done;
      }
    }
    for (int q = 0; q < NSEQ; q++)
      for (int i = 0; i < nb; i++)
        if (bs[i] == q) pl[q].fed = bp[i] + 1;
    for (int q = 0; q < NSEQ; q++)
      if (pl[q].active && pl[q].fed == pl[q].n) {
        anna_context_seq_reset(c, q); /* registered blocks stay cached */
        pl[q].active = 0;
        n_done++;
      }
  }
  anna_kv_stats st;
  anna_context_kv_stats(c, &st);
  printf("%-12s %d calls (%d found the pool full), %d plans done (%d forks), %d logit rows max|d| %.2e; hits %llu "
         "blocks / %llu tokens, %llu evictions, %llu copies on write\n",
         name, n_calls, n_full, n_done, n_forks, n_rows, worst, (unsigned long long)st.hit_blocks,
         (unsigned long long)st.hit_tokens, (unsigned long long)st.evictions, (unsigned long long)st.cow_copies);
  if (st.hit_blocks == 0 || st.evictions == 0 || n_full == 0 || st.cow_copies == 0 || n_rows < 50) {
    printf("FAIL %s: the run did not exercise reuse and eviction\n", name);
    g_fail++;
  }
done:
  for (int q = 0; q < NSEQ; q++) free(pl[q].ref);
  free(out);
  anna_context_free(c);
  anna_context_free(rc);
  anna_model_free(m);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FIXTURES_DIR [DEVICE [exact]]\n", argv[0]);
    return 2;
  }
  g_device = argc > 2 ? argv[2] : NULL;
  g_exact = argc > 3 && !strcmp(argv[3], "exact");
  if (g_device && !strcmp(g_device, "cuda") && !g_exact) g_tol = TOL_CUDA_DEFAULT;
  stress(argv[1], "qwen3");
  stress(argv[1], "qwen3_5");
  printf(g_fail ? "FAILED\n" : "ok\n");
  return g_fail ? 1 : 0;
}
