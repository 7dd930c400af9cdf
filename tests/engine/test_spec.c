/* test_spec.c: greedy speculative decoding (anna_context_seq_verify + the n-gram drafter)
 * gives exactly the ids of plain greedy decoding (issue 28).
 * - The drafter alone: matches, longest n first, latest occurrence, k and history limits,
 *   parameter refusals.
 * - Every fixture architecture (dense, MoE, Gemma sliding / KV-shared, hybrid GDN Qwen3.5
 *   dense and MoE): a prompt that repeats a snippet is decoded greedily one token at a time
 *   (the reference, as anna-generate does), then with verify windows of k = 1..8 drafted
 *   (a) by the n-gram drafter and (b) by an oracle that knows the reference but corrupts one
 *   position per window (a different position every window, sometimes none), so windows are
 *   fully accepted, rejected at every index and rolled back. GDN models run three ways:
 *   per-position states saved by the window (no token re-run), spec_window_states=0
 *   (checkpoint + re-run) and too few slots for states (falls back to the re-run). The ids
 *   must match the reference token for token, both accepted and rolled-back windows must
 *   have happened, and the re-run count must say which rollback ran
 *   (anna_context_spec_stats).
 * - Three sequences verified in one pass (anna_context_verify), k = 0, 3, 8, per-position
 *   states and re-run: each sequence's ids equal its own plain greedy run.
 * - A GDN model without checkpoint slots: a rejected window is ANNA_ESTATE, not wrong ids.
 * Usage: test_spec FIXTURES_DIR */
#define _POSIX_C_SOURCE 200809L
#include "anna/anna.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;

#define CHECK(cond, ...)                                                                                 \
  do {                                                                                                   \
    g_checks++;                                                                                          \
    if (!(cond)) {                                                                                       \
      printf("  FAIL %s:%d: ", __FILE__, __LINE__);                                                      \
      printf(__VA_ARGS__);                                                                               \
      printf("\n");                                                                                      \
      g_fail++;                                                                                          \
    }                                                                                                    \
  } while (0)

#define N_GEN 40
#define MAX_PROMPT 96
static int32_t out0_scratch[ANNA_SPEC_MAX_DRAFT + 1];

static void test_drafter(void) {
  char err[256];
  anna_ngram *d = NULL;
  anna_ngram_params p = {.n_min = 1, .n_max = 3, .k_max = 4};
  CHECK(anna_ngram_create(&d, &p, 16, err, sizeof err) == 0, "create: %s", err);
  if (!d) return;
  int32_t out[8];
  CHECK(anna_ngram_draft(d, out, 4) == 0, "empty history drafts nothing");
  /* history 1 2 3 4 5 9 2 3: suffix "2 3" (n=2) last occurred at 1 -> 4 5 9 2 (k 4) */
  const int32_t h[] = {1, 2, 3, 4, 5, 9, 2, 3};
  CHECK(anna_ngram_accept(d, h, 8, err, sizeof err) == 0, "accept: %s", err);
  int n = anna_ngram_draft(d, out, 8);
  CHECK(n == 4 && out[0] == 4 && out[1] == 5 && out[2] == 9 && out[3] == 2, "draft 2-gram: n %d [%d %d %d %d]", n,
        out[0], out[1], out[2], out[3]);
  n = anna_ngram_draft(d, out, 2);
  CHECK(n == 2 && out[0] == 4 && out[1] == 5, "k caps the draft: n %d", n);
  /* the 3-gram "9 2 3" has no earlier occurrence; append 7 3: 1-gram "3" latest at 7 -> 7 3 */
  const int32_t h2[] = {7, 3};
  anna_ngram_accept(d, h2, 2, err, sizeof err);
  n = anna_ngram_draft(d, out, 4);
  CHECK(n == 2 && out[0] == 7 && out[1] == 3, "latest 1-gram, cut at the history's end: n %d [%d %d]", n, out[0],
        out[1]);
  /* longest n first: history ... 5 6 8 | 4 6 9 | 5 6 -> the 2-gram "5 6" wins over the later 1-gram "6" */
  anna_ngram_reset(d);
  const int32_t h3[] = {5, 6, 8, 4, 6, 9, 5, 6};
  anna_ngram_accept(d, h3, 8, err, sizeof err);
  n = anna_ngram_draft(d, out, 1);
  CHECK(n == 1 && out[0] == 8, "longest suffix first: n %d out %d", n, out[0]);
  /* capacity */
  CHECK(anna_ngram_accept(d, h3, 9, err, sizeof err) == ANNA_ERANGE && anna_ngram_len(d) == 8,
        "accept past capacity is ANNA_ERANGE and appends nothing");
  anna_ngram_free(d);
  anna_ngram *bad = NULL;
  anna_ngram_params bp = {.n_min = 0, .n_max = 3, .k_max = 4};
  CHECK(anna_ngram_create(&bad, &bp, 16, err, sizeof err) == ANNA_EINVAL && !bad, "n_min 0 refused");
  bp = (anna_ngram_params){.n_min = 3, .n_max = 2, .k_max = 4};
  CHECK(anna_ngram_create(&bad, &bp, 16, err, sizeof err) == ANNA_EINVAL, "n_max < n_min refused");
  bp = (anna_ngram_params){.n_min = 1, .n_max = 2, .k_max = ANNA_SPEC_MAX_DRAFT + 1};
  CHECK(anna_ngram_create(&bad, &bp, 16, err, sizeof err) == ANNA_EINVAL, "k_max too large refused");
  printf("  drafter: ok\n");
}

/* Prefill ids[0, n) into seq 0 and return the greedy next token (or a negative code). */
static int32_t prefill(anna_context *c, const int32_t *ids, int n, char *err, size_t errlen) {
  int32_t sq[MAX_PROMPT], pos[MAX_PROMPT], idx;
  int8_t want[MAX_PROMPT];
  float val;
  double st[2];
  for (int i = 0; i < n; i++) sq[i] = 0, pos[i] = i, want[i] = i == n - 1;
  anna_batch b = {n, ids, sq, pos, want};
  int rc = anna_context_decode_topk(c, &b, 1, 0.0f, &idx, &val, st, err, errlen);
  return rc ? rc : idx;
}

/* Plain greedy: one token per decode, as anna-generate. */
static int greedy_ref(anna_context *c, const int32_t *ids, int n, int32_t *gen) {
  char err[256];
  anna_context_seq_reset(c, 0);
  int32_t t = prefill(c, ids, n, err, sizeof err);
  if (t < 0) {
    printf("  prefill: %s\n", err);
    return -1;
  }
  for (int i = 0; i < N_GEN; i++) {
    gen[i] = t;
    int32_t s0 = 0, p0 = n + i, idx;
    int8_t w = 1;
    float val;
    double st[2];
    anna_batch b = {1, &t, &s0, &p0, &w};
    if (anna_context_decode_topk(c, &b, 1, 0.0f, &idx, &val, st, err, sizeof err)) {
      printf("  decode: %s\n", err);
      return -1;
    }
    t = idx;
  }
  return 0;
}

/* Speculative greedy with windows of up to kmax drafts. oracle: drafts are the reference's
 * next tokens with one position corrupted (window w corrupts index w % (kmax + 1), none when
 * that is kmax); else the n-gram drafter. Returns 0 and the ids in gen, or the verify code. */
static int greedy_spec(anna_context *c, const int32_t *ids, int n, int kmax, const int32_t *ref, int oracle,
                       int32_t *gen, char *err, size_t errlen) {
  anna_context_seq_reset(c, 0);
  anna_ngram *d = NULL;
  anna_ngram_params np = {.n_min = 1, .n_max = 4, .k_max = kmax};
  int rc = anna_ngram_create(&d, &np, MAX_PROMPT + N_GEN + ANNA_SPEC_MAX_DRAFT + 1, err, errlen);
  if (rc) return rc;
  anna_ngram_accept(d, ids, n, err, errlen);
  int32_t t = prefill(c, ids, n, err, errlen);
  if (t < 0) {
    anna_ngram_free(d);
    return t;
  }
  int have = 0, w = 0;
  while (have < N_GEN) {
    gen[have++] = t;
    if (have == N_GEN) break;
    anna_ngram_accept(d, &t, 1, err, errlen);
    int32_t draft[ANNA_SPEC_MAX_DRAFT], out[ANNA_SPEC_MAX_DRAFT + 1];
    int k;
    if (oracle) {
      k = kmax < N_GEN - have ? kmax : N_GEN - have;
      for (int i = 0; i < k; i++) draft[i] = ref[have + i];
      const int bad = w % (kmax + 1);
      if (bad < k) draft[bad] = (draft[bad] + 1) % 1000;
    } else {
      k = anna_ngram_draft(d, draft, N_GEN - have < kmax ? N_GEN - have : kmax);
    }
    w++;
    int no;
    if ((rc = anna_context_seq_verify(c, 0, t, draft, k, out, &no, err, errlen))) break;
    for (int i = 0; i + 1 < no && have < N_GEN; i++) gen[have++] = out[i];
    anna_ngram_accept(d, out, no - 1, err, errlen);
    t = out[no - 1];
    /* the cache holds the prompt and every id emitted but the pending one */
    if (anna_context_seq_len(c, 0) != n + have) {
      rc = anna_err(err, errlen, ANNA_ESTATE, "sequence length %d, expected %d", anna_context_seq_len(c, 0),
                    n + have);
      break;
    }
  }
  anna_ngram_free(d);
  return rc;
}

/* Rollback modes of GDN models (attention-only models have one: a KV rewind). */
enum { MODE_STATES, MODE_RERUN, MODE_FEW_SLOTS, MODE_KV };
static const char *const mode_name[] = {"per-position states", "checkpoint + re-run", "re-run (2 slots)", "kv rewind"};

static void test_mode(anna_model *m, const char *name, int mode) {
  char err[512];
  anna_context *c = NULL;
  /* states: 8 drafts + the checkpoint + 2 boundary snapshots need 11 slots */
  anna_context_options o = {.n_seq = 1, .n_ctx = 256, .n_batch = 64, .n_threads = 2,
                            .n_checkpoints = mode == MODE_FEW_SLOTS || mode == MODE_KV ? 2 : 11,
                            .tuning = mode == MODE_RERUN ? "spec_window_states=0" : NULL};
  if (anna_context_create(&c, m, &o, err, sizeof err)) {
    CHECK(0, "%s: %s", name, err);
    return;
  }
  /* a 12-token snippet, an edit, the snippet again (prompt lookup finds it) */
  int32_t ids[MAX_PROMPT];
  int n = 0;
  const int32_t snip[12] = {825, 779, 304, 268, 303, 733, 671, 641, 279, 212, 948, 509};
  for (int r = 0; r < 3; r++) {
    for (int i = 0; i < 12; i++) ids[n++] = snip[i];
    ids[n++] = 100 + r;
  }
  int32_t ref[N_GEN], gen[N_GEN];
  if (greedy_ref(c, ids, n, ref)) {
    CHECK(0, "%s: reference decode failed", name);
    goto done;
  }
  anna_spec_stats s0;
  anna_context_spec_stats(c, &s0);
  int ok = 1;
  for (int oracle = 0; oracle < 2; oracle++)
    for (int k = 1; k <= 8; k++) {
      int rc = greedy_spec(c, ids, n, k, ref, oracle, gen, err, sizeof err);
      CHECK(rc == 0, "%s: %s k=%d: %s", name, oracle ? "oracle" : "ngram", k, err);
      int first = -1;
      for (int i = 0; !rc && i < N_GEN && first < 0; i++)
        if (gen[i] != ref[i]) first = i;
      CHECK(rc || first < 0, "%s: %s k=%d: id %d differs (%d vs plain %d)", name, oracle ? "oracle" : "ngram", k,
            first, first >= 0 ? gen[first] : 0, first >= 0 ? ref[first] : 0);
      ok &= rc == 0 && first < 0;
    }
  anna_spec_stats s;
  anna_context_spec_stats(c, &s);
  const long long win = s.windows - s0.windows, acc = s.accepted - s0.accepted, rb = s.rollbacks - s0.rollbacks;
  CHECK(acc > 0 && rb > 0 && rb < win, "%s: windows %lld, accepted %lld, rollbacks %lld: need both", name, win, acc,
        rb);
  const long long rerun = s.rerun_tokens - s0.rerun_tokens;
  CHECK(mode == MODE_STATES || mode == MODE_KV ? rerun == 0 : rerun > 0, "%s %s: %lld tokens re-run", name,
        mode_name[mode], rerun);
  printf("  %-18s %-20s %s windows %lld, drafted %lld, accepted %lld, rollbacks %lld, re-run %lld\n", name,
         mode_name[mode], ok ? "ids == plain greedy," : "MISMATCH,", win, (long long)(s.drafted - s0.drafted), acc,
         rb, rerun);
  if (mode == MODE_FEW_SLOTS) { /* no checkpoint slot: a rollback cannot restore the recurrent state */
    anna_context *c0 = NULL;
    o.n_checkpoints = 0;
    if (anna_context_create(&c0, m, &o, err, sizeof err) == 0) {
      int rc = greedy_spec(c0, ids, n, 4, ref, 1, gen, err, sizeof err);
      CHECK(rc == ANNA_ESTATE && strstr(err, "n_checkpoints"), "%s: no checkpoints: rc %d (%s)", name, rc, err);
      anna_context_free(c0);
    } else {
      CHECK(0, "%s: %s", name, err);
    }
  }
done:
  anna_context_free(c);
}

/* Three sequences verified in one pass per step (anna_context_verify): oracle drafts of
 * k = 0, 3, 8 corrupted at rotating indices; each sequence's ids must equal its own plain
 * greedy run. rerun: spec_window_states=0. */
#define N_MULTI 3
static void test_multi(anna_model *m, const char *name, int rerun) {
  char err[512];
  anna_context *c = NULL;
  anna_context_options o = {.n_seq = N_MULTI, .n_ctx = 256, .n_batch = 64, .n_threads = 2, .n_checkpoints = 24,
                            .tuning = rerun ? "spec_window_states=0" : NULL};
  if (anna_context_create(&c, m, &o, err, sizeof err)) {
    CHECK(0, "%s multi: %s", name, err);
    return;
  }
  static const int kk[N_MULTI] = {0, 3, 8};
  int32_t ids[N_MULTI][MAX_PROMPT], ref[N_MULTI][N_GEN], gen[N_MULTI][N_GEN], t[N_MULTI];
  int n = 0, have[N_MULTI] = {0}, ok = 1;
  for (int q = 0; q < N_MULTI; q++) { /* prompt q: the snippet rotated by 5q, three times */
    const int32_t snip[12] = {825, 779, 304, 268, 303, 733, 671, 641, 279, 212, 948, 509};
    n = 0;
    for (int r = 0; r < 3; r++)
      for (int i = 0; i < 12; i++) ids[q][n++] = snip[(i + 5 * q) % 12];
    if (greedy_ref(c, ids[q], n, ref[q])) {
      CHECK(0, "%s multi: reference failed", name);
      goto done;
    }
  }
  for (int q = 0; q < N_MULTI; q++) {
    anna_context_seq_reset(c, q);
    int32_t sq[MAX_PROMPT], pos[MAX_PROMPT], idx;
    int8_t want[MAX_PROMPT];
    float val;
    double st[2];
    for (int i = 0; i < n; i++) sq[i] = q, pos[i] = i, want[i] = i == n - 1;
    anna_batch b = {n, ids[q], sq, pos, want};
    if (anna_context_decode_topk(c, &b, 1, 0.0f, &idx, &val, st, err, sizeof err)) {
      CHECK(0, "%s multi: prefill: %s", name, err);
      goto done;
    }
    t[q] = idx;
  }
  for (int step = 0;; step++) {
    anna_spec_window w[N_MULTI];
    int32_t draft[N_MULTI][ANNA_SPEC_MAX_DRAFT], out[N_MULTI][ANNA_SPEC_MAX_DRAFT + 1];
    int nw = 0;
    for (int q = 0; q < N_MULTI; q++) {
      if (have[q] == N_GEN) continue;
      gen[q][have[q]++] = t[q];
      if (have[q] == N_GEN) continue;
      int k = kk[q] < N_GEN - have[q] ? kk[q] : N_GEN - have[q];
      for (int i = 0; i < k; i++) draft[q][i] = ref[q][have[q] + i];
      const int bad = (step + q) % (kk[q] + 1);
      if (bad < k) draft[q][bad] = (draft[q][bad] + 1) % 1000;
      w[nw++] = (anna_spec_window){.seq = q, .last = t[q], .draft = draft[q], .k = k, .out = out[q]};
    }
    if (!nw) break;
    if (anna_context_verify(c, w, nw, err, sizeof err)) {
      CHECK(0, "%s multi: %s", name, err);
      goto done;
    }
    for (int i = 0; i < nw; i++) {
      const int q = w[i].seq;
      for (int j = 0; j + 1 < w[i].n_out && have[q] < N_GEN; j++) gen[q][have[q]++] = out[q][j];
      t[q] = out[q][w[i].n_out - 1];
    }
  }
  for (int q = 0; q < N_MULTI; q++)
    for (int i = 0; i < N_GEN; i++)
      if (gen[q][i] != ref[q][i]) {
        CHECK(0, "%s multi%s: sequence %d id %d differs (%d vs plain %d)", name, rerun ? " rerun" : "", q, i,
              gen[q][i], ref[q][i]);
        ok = 0;
        break;
      }
  anna_spec_stats ss;
  anna_context_spec_stats(c, &ss);
  CHECK(ss.accepted > 0 && ss.rollbacks > 0 && (rerun ? ss.rerun_tokens > 0 : ss.rerun_tokens == 0),
        "%s multi: accepted %lld, rollbacks %lld, re-run %lld", name, (long long)ss.accepted,
        (long long)ss.rollbacks, (long long)ss.rerun_tokens);
  printf("  %-18s %-20s %s %lld windows, %lld accepted, %lld rollbacks, re-run %lld\n", name,
         rerun ? "3 seqs, re-run" : "3 seqs, states", ok ? "ids == plain greedy," : "MISMATCH,",
         (long long)ss.windows, (long long)ss.accepted, (long long)ss.rollbacks, (long long)ss.rerun_tokens);
  /* refusals: a repeated sequence, too many rows */
  anna_spec_window bad[2] = {{.seq = 0, .last = 1, .k = 0, .out = out0_scratch},
                             {.seq = 0, .last = 1, .k = 0, .out = out0_scratch}};
  CHECK(anna_context_verify(c, bad, 2, err, sizeof err) == ANNA_EINVAL, "%s: a sequence twice is refused", name);
done:
  anna_context_free(c);
}

static void test_model(const char *root, const char *name, int gdn) {
  char dir[1200], err[512];
  snprintf(dir, sizeof dir, "%.1000s/%.100s", root, name);
  anna_model *m = NULL;
  if (anna_model_load(&m, dir, NULL, err, sizeof err)) {
    CHECK(0, "%s: %s", name, err);
    return;
  }
  if (gdn)
    for (int mode = MODE_STATES; mode <= MODE_FEW_SLOTS; mode++) test_mode(m, name, mode);
  else
    test_mode(m, name, MODE_KV);
  test_multi(m, name, 0);
  if (gdn) test_multi(m, name, 1);
  anna_model_free(m);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_spec FIXTURES_DIR\n");
    return 2;
  }
  test_drafter();
  static const struct {
    const char *name;
    int gdn;
  } models[] = {{"qwen3", 0},      {"qwen2", 0},     {"llama", 0},           {"qwen3_moe", 0},
                {"gemma3_text", 0}, {"gemma4_text", 0}, {"qwen3_5", 1}, {"qwen3_5_text", 1},
                {"qwen3_5_moe_text", 1}};
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) test_model(argv[1], models[i].name, models[i].gdn);
  printf("test_spec: %d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
