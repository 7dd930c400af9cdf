/* test_spec_sample.c: speculative sampling (anna_context_verify_sampled) keeps the target
 * distribution exactly (issue 28).
 * On the hybrid GDN fixture (qwen3_5: rejected windows roll recurrent state back), with
 * temperature 1, top-k 3 and a repetition penalty (so a row's distribution depends on the
 * tokens drawn before it inside the window), the joint distribution of the next 3 tokens after
 * a prompt is drawn N times, 32 sequences at a time:
 *   A  plain sampling: one decode per token, samplers seeded 1000 + slot;
 *   B  speculative: verify windows drafting the greedy continuation (so drafts are accepted
 *      and rejected at every index), the same seeds as A;
 *   C  speculative with other seeds (5000 + slot): an independent sample.
 * Checks: (1) first-token frequencies of A and C fit the analytic top-3 softmax of the prompt's
 * logits (chi-square, p > 1e-4); (2) the 27-cell joint histograms of A and C are homogeneous
 * (two-sample chi-square, p > 1e-4); (3) B gives A's tokens draw for draw (one random draw per
 * emitted token: the same seed gives the same tokens); (4) drafts were both accepted and
 * rejected, and rolled back. A wrong accept rule fails (1)-(3): redrawing from p after a
 * rejection (instead of from p without the draft) put chi-square at thousands (see the
 * commit message / bench/notes/spec.md).
 * Usage: test_spec_sample FIXTURES_DIR [N_DRAWS] */
#define _POSIX_C_SOURCE 200809L
#include "anna/anna.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NSEQ 32
#define NTOK 3 /* tokens per draw */
#define TOPK 3
#define NP 8 /* prompt length */
#define MAXCELL 4096

static int g_fail;
#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      printf("  FAIL %s:%d: ", __FILE__, __LINE__);                                                \
      printf(__VA_ARGS__);                                                                         \
      printf("\n");                                                                                \
      g_fail++;                                                                                    \
    }                                                                                              \
  } while (0)

static anna_context *g_c;
static int g_V;
static float *g_logits; /* [NSEQ * NP * V] */
static const int32_t g_prompt[NP] = {11, 42, 7, 99, 311, 5, 64, 250};
static int32_t g_draft[NTOK]; /* greedy continuation: the drafts */
static anna_sampler *g_smp[NSEQ];
static anna_sampler_params g_sp;

/* Prompt into every slot: all but the last token, or (want_last) all of them with the last
 * row's logits of each slot to g_logits[s * V]. */
static int prefill(int want_last, char *err, size_t errlen) {
  static int32_t tok[NSEQ * NP], sq[NSEQ * NP], pos[NSEQ * NP];
  static int8_t want[NSEQ * NP];
  const int n = want_last ? NP : NP - 1;
  int r = 0;
  for (int s = 0; s < NSEQ; s++) {
    anna_context_seq_reset(g_c, s);
    for (int i = 0; i < n; i++, r++)
      tok[r] = g_prompt[i], sq[r] = s, pos[r] = i, want[r] = want_last && i == n - 1;
  }
  anna_batch b = {r, tok, sq, pos, want};
  return anna_context_decode(g_c, &b, g_logits, err, errlen);
}

static void samplers_new(uint64_t seed0) {
  char err[256];
  for (int s = 0; s < NSEQ; s++) {
    anna_sampler_free(g_smp[s]);
    g_smp[s] = NULL;
    anna_sampler_params p = g_sp;
    p.seed = seed0 + (uint64_t)s;
    if (anna_sampler_create(&g_smp[s], g_V, &p, err, sizeof err)) printf("  sampler: %s\n", err);
  }
}

/* One round of plain sampling: NSEQ draws of NTOK tokens into out[NSEQ][NTOK]. */
static int round_plain(int32_t (*out)[NTOK], char *err, size_t errlen) {
  int rc = prefill(1, err, errlen);
  if (rc) return rc;
  for (int j = 0; j < NTOK; j++) {
    int32_t tok[NSEQ], sq[NSEQ], pos[NSEQ];
    int8_t want[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
      out[s][j] = anna_sampler_sample(g_smp[s], g_logits + (size_t)s * (size_t)g_V);
      anna_sampler_accept(g_smp[s], out[s][j]);
      tok[s] = out[s][j], sq[s] = s, pos[s] = NP + j, want[s] = 1;
    }
    if (j == NTOK - 1) break;
    anna_batch b = {NSEQ, tok, sq, pos, want};
    if ((rc = anna_context_decode(g_c, &b, g_logits, err, errlen))) return rc;
  }
  return 0;
}

/* One round of speculative sampling: the prompt's last token is every slot's pending token;
 * windows draft the greedy continuation for the positions still to draw. */
static int round_spec(int32_t (*out)[NTOK], char *err, size_t errlen) {
  int rc = prefill(0, err, errlen);
  if (rc) return rc;
  int got[NSEQ] = {0};
  int32_t last[NSEQ], wout[NSEQ][NTOK + 1];
  for (int s = 0; s < NSEQ; s++)
    last[s] = g_prompt[NP - 1];
  for (;;) {
    anna_spec_window w[NSEQ];
    anna_sampler *ws[NSEQ];
    int nw = 0;
    for (int s = 0; s < NSEQ; s++) {
      if (got[s] >= NTOK) continue;
      const int k = NTOK - got[s] - 1; /* a fully accepted window ends the draw */
      w[nw] = (anna_spec_window){
          .seq = s, .last = last[s], .draft = g_draft + got[s], .k = k, .out = wout[s]};
      ws[nw++] = g_smp[s];
    }
    if (!nw) return 0;
    if ((rc = anna_context_verify_sampled(g_c, w, ws, nw, g_logits, err, errlen))) return rc;
    for (int i = 0; i < nw; i++) {
      const int s = w[i].seq;
      for (int j = 0; j < w[i].n_out && got[s] < NTOK; j++)
        out[s][got[s]++] = w[i].out[j];
      last[s] = w[i].out[w[i].n_out - 1];
    }
  }
}

/* Upper 1e-4 point of chi-square with df degrees of freedom (Wilson-Hilferty). */
static double chi2_crit(int df) {
  const double z = 3.719, a = 2.0 / (9.0 * df);
  return df * pow(1.0 - a + z * sqrt(a), 3.0);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_spec_sample FIXTURES_DIR [N_DRAWS]\n");
    return 2;
  }
  const int n_draws = argc > 2 ? atoi(argv[2]) : 20000;
  const int rounds = (n_draws + NSEQ - 1) / NSEQ, N = rounds * NSEQ;
  char path[4096], err[512];
  snprintf(path, sizeof path, "%s/qwen3_5", argv[1]);
  anna_model *m = NULL;
  if (anna_model_load(&m, path, NULL, err, sizeof err)) {
    printf("load %s: %s\n", path, err);
    return 1;
  }
  g_V = anna_model_vocab(m);
  anna_context_options o = {.n_seq = NSEQ,
                            .n_ctx = 64,
                            .n_batch = NSEQ * NP,
                            .n_threads = 2,
                            .n_checkpoints = NSEQ * (NTOK + 2)};
  if (anna_context_create(&g_c, m, &o, err, sizeof err)) {
    printf("context: %s\n", err);
    return 1;
  }
  g_logits = malloc(sizeof(float) * (size_t)g_V * NSEQ * NP);
  g_sp = anna_sampler_params_default();
  g_sp.temperature = 1.0f;
  g_sp.top_k = TOPK;
  g_sp.repetition_penalty = 1.5f;

  /* The analytic first-token distribution (top-3 softmax at T = 1) and the greedy drafts. */
  if (prefill(1, err, sizeof err)) {
    printf("prefill: %s\n", err);
    return 1;
  }
  int32_t top[TOPK];
  double p1[TOPK], z = 0;
  {
    const float *row = g_logits;
    for (int q = 0; q < TOPK; q++) {
      int32_t best = -1;
      for (int32_t t = 0; t < g_V; t++) {
        int used = 0;
        for (int u = 0; u < q; u++)
          used |= top[u] == t;
        if (!used && (best < 0 || row[t] > row[best])) best = t;
      }
      top[q] = best;
    }
    for (int q = 0; q < TOPK; q++)
      z += exp((double)row[top[q]] - row[top[0]]);
    for (int q = 0; q < TOPK; q++)
      p1[q] = exp((double)row[top[q]] - row[top[0]]) / z;
    g_draft[0] = top[0];
    int32_t tok = top[0], sq = 0, pos = NP;
    int8_t want = 1;
    anna_batch b = {1, &tok, &sq, &pos, &want};
    if (anna_context_decode(g_c, &b, g_logits, err, sizeof err)) {
      printf("decode: %s\n", err);
      return 1;
    }
    int32_t g1 = 0;
    for (int32_t t = 1; t < g_V; t++)
      if (g_logits[t] > g_logits[g1]) g1 = t;
    g_draft[1] = g1;
    g_draft[2] = g1;
  }
  printf("  first token: top-3 ids %d %d %d, p %.3f %.3f %.3f; drafts %d %d\n", top[0], top[1],
         top[2], p1[0], p1[1], p1[2], g_draft[0], g_draft[1]);
  /* later positions' top 3 depend on the tokens before them: the joint histogram's cells are
   * keyed by the 3 ids themselves */
  int32_t(*A)[NTOK] = malloc(sizeof *A * (size_t)N), (*B)[NTOK] = malloc(sizeof *B * (size_t)N),
  (*C)[NTOK] = malloc(sizeof *C * (size_t)N);
  struct {
    int32_t (*x)[NTOK];
    uint64_t seed;
    int spec;
  } runs[3] = {{A, 1000, 0}, {B, 1000, 1}, {C, 5000, 1}};
  for (int r = 0; r < 3; r++) {
    samplers_new(runs[r].seed);
    for (int i = 0; i < rounds; i++) {
      for (int s = 0; s < NSEQ; s++)
        anna_sampler_reset(g_smp[s]);
      int rc = runs[r].spec ? round_spec(runs[r].x + (size_t)i * NSEQ, err, sizeof err)
                            : round_plain(runs[r].x + (size_t)i * NSEQ, err, sizeof err);
      if (rc) {
        printf("  run %d round %d: %s\n", r, i, err);
        return 1;
      }
    }
  }
  anna_spec_stats st;
  anna_context_spec_stats(g_c, &st);
  printf("  %d draws x 3 runs; speculative: %lld windows, %lld drafted, %lld accepted, %lld "
         "rollbacks\n",
         N, (long long)st.windows, (long long)st.drafted, (long long)st.accepted,
         (long long)st.rollbacks);
  CHECK(st.accepted > 0 && st.accepted < st.drafted && st.rollbacks > 0,
        "drafts both accepted and rejected");

  /* (1) first token vs the analytic distribution */
  for (int r = 0; r < 3; r += 2) {
    double cnt[TOPK] = {0}, chi = 0;
    int other = 0;
    for (int i = 0; i < N; i++) {
      int q = -1;
      for (int u = 0; u < TOPK; u++)
        if (runs[r].x[i][0] == top[u]) q = u;
      if (q < 0)
        other++;
      else
        cnt[q]++;
    }
    for (int q = 0; q < TOPK; q++)
      chi += (cnt[q] - N * p1[q]) * (cnt[q] - N * p1[q]) / (N * p1[q]);
    printf(
        "  run %c first token: %.0f %.0f %.0f (expected %.0f %.0f %.0f), chi2 %.2f (crit %.2f)\n",
        "ABC"[r], cnt[0], cnt[1], cnt[2], N * p1[0], N * p1[1], N * p1[2], chi,
        chi2_crit(TOPK - 1));
    CHECK(other == 0, "run %c drew %d first tokens outside the top %d", "ABC"[r], other, TOPK);
    CHECK(chi < chi2_crit(TOPK - 1), "run %c: first-token chi2 %.2f", "ABC"[r], chi);
  }
  /* (2) joint histograms of A and C: cells keyed by the 3 ids */
  static int32_t key[MAXCELL][NTOK];
  static double ca[MAXCELL], cc[MAXCELL];
  int nc = 0;
  for (int r = 0; r < 3; r += 2)
    for (int i = 0; i < N; i++) {
      int f = -1;
      for (int q = 0; q < nc && f < 0; q++)
        if (!memcmp(key[q], runs[r].x[i], sizeof key[q])) f = q;
      if (f < 0 && nc < MAXCELL) memcpy(key[f = nc++], runs[r].x[i], sizeof key[0]);
      if (f >= 0) (r ? cc : ca)[f]++;
    }
  double chi = 0, sa = 0, sc = 0;
  int df = -1;
  for (int q = 0; q < nc; q++) {
    if (ca[q] + cc[q] < 10) { /* sparse cells pooled */
      sa += ca[q], sc += cc[q];
      continue;
    }
    chi += (ca[q] - cc[q]) * (ca[q] - cc[q]) / (ca[q] + cc[q]);
    df++;
  }
  if (sa + sc >= 10) chi += (sa - sc) * (sa - sc) / (sa + sc), df++;
  printf("  joint of %d tokens: %d cells (%d dof), two-sample chi2 A vs C %.2f (crit %.2f)\n", NTOK,
         nc, df, chi, chi2_crit(df));
  CHECK(df >= 8, "too few joint cells (%d) for the test to mean something", df);
  CHECK(chi < chi2_crit(df), "joint chi2 %.2f over %d dof", chi, df);
  /* (3) same seeds: the same tokens */
  int same = 0;
  for (int i = 0; i < N; i++)
    same += !memcmp(A[i], B[i], sizeof A[i]);
  printf("  same seed: %d of %d draws identical with and without speculation\n", same, N);
  CHECK(same >= N - N / 200, "only %d of %d same-seed draws identical", same, N);

  free(A), free(B), free(C), free(g_logits);
  for (int s = 0; s < NSEQ; s++)
    anna_sampler_free(g_smp[s]);
  anna_context_free(g_c);
  anna_model_free(m);
  printf(g_fail ? "test_spec_sample: %d FAILED\n" : "test_spec_sample: ok\n", g_fail);
  return g_fail ? 1 : 0;
}
