/* test_prefix.c: prefix reuse gives the logits of recomputation (issue: paged KV / prefix
 * sharing). For a hybrid GDN model, sliding-window and KV-sharing Gemma4, and dense models:
 * the long fixture prompt is prefilled in 64-token blocks with a checkpoint after each;
 * then (a) a copy at a block boundary continued with the rest, (b) a prefix ending
 * mid-block restored from the last boundary and recomputed, (c) a conversation that
 * branches after the shared prefix, (d) a rewind — each must match a fresh computation to
 * 1e-4 (f32 CPU). Also: copying at a position with no checkpoint is an error for GDN
 * models and fine for attention-only ones.
 * Prefix block pool (anna_context_prefix_attach): a prompt prefilled in unaligned chunks
 * registers its blocks and GDN snapshots; after its sequence is reset, a second sequence
 * attaches the cached prefix and must continue to the logits of a fresh prefill; a branch
 * attaches the shared part; two sequences sharing a block that ends mid-block both write
 * into it (copy on write) and both stay exact; ANNA_TUNING=prefix_kv_share=0 disables reuse.
 * Residual f32 ring of a quantized cache: see test_residual.
 * Usage: test_prefix FIXTURES_DIR EXTRA_FIXTURES_DIR */
#define _POSIX_C_SOURCE 200809L
#include "anna/anna.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-4f
static int g_fail, g_checks;

static void check(const char *model, const char *what, float d) {
  g_checks++;
  int ok = d <= TOL;
  printf("  %-18s %-46s max|d| %.2e %s\n", model, what, d, ok ? "" : "FAIL");
  if (!ok) g_fail++;
}

static int read_ids(const char *dir, int which, int32_t *ids) {
  char path[1200];
  snprintf(path, sizeof path, "%.1100s/expected.json", dir);
  json_t *root = json_load_file(path, 0, NULL);
  if (!root) return -1;
  json_t *a = json_object_get(json_array_get(json_object_get(root, "cases"), (size_t)which), "prompt_ids");
  int n = (int)json_array_size(a);
  for (int i = 0; i < n && i < 512; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
  json_decref(root);
  return n;
}

/* Feeds ids[from..to) to seq (positions from..to), logits of all of them to out (if any). */
static int feed(anna_context *c, int seq, const int32_t *ids, int from, int to, float *out, int V) {
  int32_t sq[512], pos[512];
  int8_t want[512];
  for (int i = from; i < to; i++) sq[i - from] = seq, pos[i - from] = i, want[i - from] = out != NULL;
  anna_batch b = {to - from, ids + from, sq, pos, want};
  char err[256];
  int rc = anna_context_decode(c, &b, out ? out : NULL, err, sizeof err);
  if (rc) printf("  decode: %s\n", err);
  (void)V;
  return rc;
}

static float maxdiff(const float *a, const float *b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; i++) {
    float d = fabsf(a[i] - b[i]);
    if (!(d <= m)) m = d;
  }
  return m;
}

static void test_model(const char *root, const char *name, int gdn) {
  char dir[1200], err[256];
  snprintf(dir, sizeof dir, "%.1000s/%.100s", root, name);
  anna_model *m = NULL;
  anna_context *c = NULL;
  if (anna_model_load(&m, dir, NULL, err, sizeof err)) {
    printf("  FAIL %s: %s\n", name, err);
    g_fail++;
    return;
  }
  anna_context_options o = {.n_seq = 4, .n_ctx = 640, .n_batch = 512, .n_threads = 2, .n_checkpoints = 8};
  if (anna_context_create(&c, m, &o, err, sizeof err)) {
    printf("  FAIL %s: %s\n", name, err);
    g_fail++;
    anna_model_free(m);
    return;
  }
  const int V = anna_model_vocab(m);
  int32_t P[512], B[512];
  const int n = read_ids(dir, 1, P), nb = read_ids(dir, 0, B);
  float *ref = malloc(sizeof(float) * (size_t)V * 512), *got = malloc(sizeof(float) * (size_t)V * 512);
  float *lg = malloc(sizeof(float) * (size_t)V * 512);
  const int cut = (n / 64) * 64 == n ? n - 64 : (n / 64) * 64; /* last block boundary before the end */
  /* reference: one full prefill in seq 3 */
  feed(c, 3, P, 0, n, ref, V);
  /* seq 0: blocks of 64 with checkpoints */
  for (int at = 0; at < n; at += 64) {
    int to = at + 64 < n ? at + 64 : n;
    feed(c, 0, P, at, to, NULL, V);
    if (anna_context_seq_checkpoint(c, 0, err, sizeof err)) printf("  checkpoint: %s\n", err);
  }
  /* (a) copy at the last boundary, continue */
  if (anna_context_seq_copy(c, 1, 0, cut, err, sizeof err) == 0 && feed(c, 1, P, cut, n, got, V) == 0)
    check(name, "copy at a block boundary, continue", maxdiff(got, ref + (size_t)cut * V, (size_t)(n - cut) * V));
  else {
    printf("  FAIL copy: %s\n", err);
    g_fail++;
  }
  /* (b) a prefix ending mid-block (cut - 20): restore the boundary before it, recompute */
  const int mid = cut - 20, boundary = (mid / 64) * 64;
  if (anna_context_seq_copy(c, 2, 0, boundary, err, sizeof err) == 0 && feed(c, 2, P, boundary, n, got, V) == 0)
    check(name, "prefix ending mid-block (restore + recompute)",
          maxdiff(got, ref + (size_t)boundary * V, (size_t)(n - boundary) * V));
  else {
    printf("  FAIL mid-block: %s\n", err);
    g_fail++;
  }
  /* (c) branch: shared prefix [0, cut) then the short case's ids, vs a fresh prefill */
  int32_t BR[512];
  memcpy(BR, P, sizeof(int32_t) * (size_t)cut);
  memcpy(BR + cut, B, sizeof(int32_t) * (size_t)nb);
  anna_context_seq_reset(c, 3);
  feed(c, 3, BR, 0, cut + nb, lg, V);
  if (anna_context_seq_copy(c, 1, 0, cut, err, sizeof err) == 0 && feed(c, 1, BR, cut, cut + nb, got, V) == 0)
    check(name, "branching conversation after a shared prefix",
          maxdiff(got, lg + (size_t)cut * V, (size_t)nb * V));
  else {
    printf("  FAIL branch: %s\n", err);
    g_fail++;
  }
  /* (d) rewind seq 0 to a boundary and redo the tail */
  if (anna_context_seq_rewind(c, 0, 64, err, sizeof err) == 0 && feed(c, 0, P, 64, n, got, V) == 0)
    check(name, "rewind to a checkpoint, redo the tail", maxdiff(got, ref + (size_t)64 * V, (size_t)(n - 64) * V));
  else {
    printf("  FAIL rewind: %s\n", err);
    g_fail++;
  }
  /* (e) a position without a checkpoint */
  int rc = anna_context_seq_copy(c, 2, 0, 37, err, sizeof err);
  g_checks++;
  if (gdn ? rc == 0 : rc != 0) {
    printf("  FAIL %s: copy at 37 returned %d (%s)\n", name, rc, err);
    g_fail++;
  } else {
    printf("  %-18s copy at an unsaved position: %s\n", name, gdn ? err : "fine without recurrent state");
  }
  free(ref), free(got), free(lg);
  anna_context_free(c);
  anna_model_free(m);
}

/* The prefix block pool on one model (block length 64, the default). */
static void test_pool(const char *root, const char *name, int gdn) {
  char dir[1200], err[256];
  snprintf(dir, sizeof dir, "%.1000s/%.100s", root, name);
  anna_model *m = NULL;
  anna_context *c = NULL;
  if (anna_model_load(&m, dir, NULL, err, sizeof err)) {
    printf("  FAIL %s: %s\n", name, err);
    g_fail++;
    return;
  }
  anna_context_options o = {.n_seq = 4, .n_ctx = 640, .n_batch = 512, .n_threads = 2, .n_checkpoints = 6};
  if (anna_context_create(&c, m, &o, err, sizeof err)) {
    printf("  FAIL %s: %s\n", name, err);
    g_fail++;
    anna_model_free(m);
    return;
  }
  const int V = anna_model_vocab(m);
  int32_t P[512], B[512], BR[1024];
  const int n = read_ids(dir, 1, P), nb = read_ids(dir, 0, B);
  float *ref = malloc(sizeof(float) * (size_t)V * 512), *got = malloc(sizeof(float) * (size_t)V * 512);
  float *lg = malloc(sizeof(float) * (size_t)V * 1024);
  feed(c, 3, P, 0, n, ref, V);
  /* seq 0 registers P, fed in chunks of 100 (not block-aligned), then ends */
  int32_t r0 = anna_context_prefix_attach(c, 0, P, n - 1, ANNA_PREFIX_REGISTER);
  for (int at = 0; at < n; at += 100) feed(c, 0, P, at, at + 100 < n ? at + 100 : n, NULL, V);
  anna_context_seq_reset(c, 0);
  /* (f) seq 1 attaches P: reuses a block-aligned prefix, computes the rest */
  int32_t r = anna_context_prefix_attach(c, 1, P, n - 1, ANNA_PREFIX_REGISTER);
  g_checks++;
  /* GDN models reuse up to a block boundary with a snapshot; attention-only models cut the
   * partial block seq 0 left at any token (all n - 1). The steps below start from the block
   * boundary either way (rewinding an attention-only sequence is exact). */
  if (r0 != 0 || r <= 0 || (gdn ? r % 64 != 0 : r != n - 1) || anna_context_seq_len(c, 1) != r) {
    printf("  FAIL %s: attach reused %d (first attach %d), length %d\n", name, r, r0, anna_context_seq_len(c, 1));
    g_fail++;
    goto done;
  }
  if (!gdn && (r = r & ~63) > 0 && anna_context_seq_rewind(c, 1, r, err, sizeof err)) {
    printf("  FAIL %s: %s\n", name, err);
    g_fail++;
    goto done;
  }
  const int mid = r + (n - r) / 2; /* inside the block after the reused prefix */
  if (feed(c, 1, P, r, mid, got, V) || anna_context_seq_checkpoint(c, 1, err, sizeof err) ||
      feed(c, 1, P, mid, n, got + (size_t)(mid - r) * V, V)) {
    g_fail++;
    goto done;
  }
  char what[96];
  snprintf(what, sizeof what, "pool: attach reuses %d of %d, continue", r, n);
  check(name, what, maxdiff(got, ref + (size_t)r * V, (size_t)(n - r) * V));
  /* (g) branch: the shared part [0, r + 10) then the short case's ids, vs a fresh prefill */
  memcpy(BR, P, sizeof(int32_t) * (size_t)(r + 10));
  memcpy(BR + r + 10, B, sizeof(int32_t) * (size_t)nb);
  const int nbr = r + 10 + nb;
  anna_context_seq_reset(c, 3);
  feed(c, 3, BR, 0, nbr, lg, V);
  int32_t r2 = anna_context_prefix_attach(c, 2, BR, nbr - 1, ANNA_PREFIX_REGISTER);
  if (r2 < 0 || feed(c, 2, BR, r2, nbr, got, V)) {
    g_fail++;
    goto done;
  }
  snprintf(what, sizeof what, "pool: branch attaches %d, continue", r2);
  check(name, what, maxdiff(got, lg + (size_t)r2 * V, (size_t)(nbr - r2) * V));
  /* (h) copy on write: seq 0 = seq 1's first `mid` positions (the block holding mid is
   * shared, half full); seq 0 continues P, seq 1 rewinds to mid and takes the branch. */
  anna_kv_stats st0, st1;
  anna_context_kv_stats(c, &st0);
  if (anna_context_seq_copy(c, 0, 1, mid, err, sizeof err) || anna_context_seq_rewind(c, 1, mid, err, sizeof err)) {
    printf("  FAIL %s: %s\n", name, err);
    g_fail++;
    goto done;
  }
  feed(c, 0, P, mid, n, got, V);
  check(name, "pool: copy on write, writer", maxdiff(got, ref + (size_t)mid * V, (size_t)(n - mid) * V));
  memcpy(BR, P, sizeof(int32_t) * (size_t)mid);
  memcpy(BR + mid, B, sizeof(int32_t) * (size_t)nb);
  anna_context_seq_reset(c, 3);
  feed(c, 3, BR, 0, mid + nb, lg, V);
  feed(c, 1, BR, mid, mid + nb, got, V);
  check(name, "pool: copy on write, the other sharer", maxdiff(got, lg + (size_t)mid * V, (size_t)nb * V));
  /* (j) seq 0 ends mid-block at n: its partial last block (and, for GDN, its end state)
   * stays in the pool, so the next turn P + B reuses exactly n positions. */
  {
    memcpy(BR, P, sizeof(int32_t) * (size_t)n);
    memcpy(BR + n, B, sizeof(int32_t) * (size_t)nb);
    anna_context_seq_reset(c, 3);
    feed(c, 3, BR, 0, n + nb, lg, V);
    anna_context_seq_reset(c, 0);
    const int32_t rj = anna_context_prefix_attach(c, 2, BR, n + nb - 1, ANNA_PREFIX_REGISTER);
    g_checks++;
    if (rj != n) {
      printf("  FAIL %s: the next turn reused %d positions, expected %d\n", name, rj, n);
      g_fail++;
    } else if (feed(c, 2, BR, n, n + nb, got, V) == 0) {
      check(name, "pool: next turn reuses a partial last block", maxdiff(got, lg + (size_t)n * V, (size_t)nb * V));
    }
  }
  /* (k) attention-only models: a prompt that shares P's first 64 + 10 tokens, then goes
   * elsewhere, reuses exactly those (the cached block after the first is cut mid-block). */
  if (!gdn && n > 80) {
    const int x = 64 + 10;
    memcpy(BR, P, sizeof(int32_t) * (size_t)x);
    /* ids no earlier prompt continued P with (the branch of (g) may share 64 + 10 too) */
    for (int i = 0; i < nb; i++) BR[x + i] = (B[i] + 7) % V;
    if (BR[x] == P[x]) BR[x] = (BR[x] + 1) % V;
    anna_context_seq_reset(c, 3);
    feed(c, 3, BR, 0, x + nb, lg, V);
    anna_context_seq_reset(c, 2);
    const int32_t rk = anna_context_prefix_attach(c, 2, BR, x + nb - 1, ANNA_PREFIX_REGISTER);
    g_checks++;
    if (rk != x) {
      printf("  FAIL %s: a prompt sharing %d tokens reused %d\n", name, x, rk);
      g_fail++;
    } else if (feed(c, 2, BR, x, x + nb, got, V) == 0) {
      check(name, "pool: token-granular reuse of a cached block", maxdiff(got, lg + (size_t)x * V, (size_t)nb * V));
    }
  }
  anna_context_kv_stats(c, &st1);
  g_checks++;
  if (st1.cow_copies <= st0.cow_copies || st1.hit_tokens == 0) {
    printf("  FAIL %s: copy on write did not happen (%llu -> %llu) or no hits\n", name,
           (unsigned long long)st0.cow_copies, (unsigned long long)st1.cow_copies);
    g_fail++;
  }
  printf("  %-18s pool: %lld blocks x %d, %lld free, %lld cached, %lld snapshots, hits %llu blocks / %llu tokens\n",
         name, (long long)st1.n_blocks, st1.block_len, (long long)st1.free_blocks, (long long)st1.cached_blocks,
         (long long)st1.n_snapshots, (unsigned long long)st1.hit_blocks, (unsigned long long)st1.hit_tokens);
  /* (i) ANNA_TUNING=prefix_kv_share=0: a new context reuses nothing */
  {
    anna_context *c2 = NULL;
    setenv("ANNA_TUNING", "prefix_kv_share=0", 1);
    int rc = anna_context_create(&c2, m, &o, err, sizeof err);
    unsetenv("ANNA_TUNING");
    g_checks++;
    if (rc) {
      g_fail++;
    } else {
      anna_context_prefix_attach(c2, 0, P, n - 1, ANNA_PREFIX_REGISTER);
      feed(c2, 0, P, 0, n, NULL, V);
      anna_context_seq_reset(c2, 0);
      int32_t z = anna_context_prefix_attach(c2, 1, P, n - 1, ANNA_PREFIX_REGISTER);
      if (z != 0) {
        printf("  FAIL %s: prefix_kv_share=0 still reused %d\n", name, z);
        g_fail++;
      }
      anna_context_free(c2);
    }
  }
done:
  free(ref), free(got), free(lg);
  anna_context_free(c);
  anna_model_free(m);
}

/* --kv-cache-residual-len on a q8 cache: with the ring covering every position the logits
 * are those of the f32 cache; without it they are not (so the check can fail); with a
 * 32-position ring fed in 16-token calls (the ring wraps) they equal one whole prefill
 * with the same ring (which keys come from the ring depends only on the position). */
static void test_residual(const char *root, const char *name, int chunk_exact) {
  char dir[1200], err[256];
  snprintf(dir, sizeof dir, "%.1000s/%.100s", root, name);
  anna_model *m = NULL;
  if (anna_model_load(&m, dir, NULL, err, sizeof err)) {
    printf("  FAIL %s: %s\n", name, err);
    g_fail++;
    return;
  }
  const int V = anna_model_vocab(m);
  int32_t P[512];
  const int n = read_ids(dir, 1, P);
  float *out[5];
  const struct {
    const char *q;
    int resid, batch;
  } cf[5] = {{NULL, 0, 512}, {"q8", 1024, 512}, {"q8", 0, 512}, {"q8", 32, 512}, {"q8", 32, 16}};
  for (int k = 0; k < 5; k++) {
    out[k] = malloc(sizeof(float) * (size_t)V * (size_t)n);
    anna_context *c = NULL;
    anna_context_options o = {.n_seq = 1, .n_ctx = 640, .n_batch = cf[k].batch, .n_threads = 2,
                              .kv_cache_quantization = cf[k].q, .kv_cache_residual_len = cf[k].resid};
    if (anna_context_create(&c, m, &o, err, sizeof err)) {
      printf("  FAIL %s: %s\n", name, err);
      g_fail++;
      for (int j = 0; j <= k; j++) free(out[j]);
      anna_model_free(m);
      return;
    }
    for (int at = 0; at < n; at += cf[k].batch)
      feed(c, 0, P, at, at + cf[k].batch < n ? at + cf[k].batch : n, out[k] + (size_t)at * V, V);
    anna_context_free(c);
  }
  const size_t all = (size_t)V * (size_t)n;
  check(name, "q8 + residual ring over everything = f32", maxdiff(out[1], out[0], all));
  const float dq = maxdiff(out[2], out[0], all);
  g_checks++;
  printf("  %-18s q8 without the ring differs from f32 by %.2e %s\n", name, dq, dq > 1e-4f ? "" : "FAIL");
  if (!(dq > 1e-4f)) g_fail++;
  /* Only where chunked prefill is bit-exact (no GDN): elsewhere a tiny chunking difference
   * can flip a q8 rounding step. */
  if (chunk_exact) check(name, "residual 32: 16-token calls (ring wraps) = one call", maxdiff(out[4], out[3], all));
  for (int k = 0; k < 5; k++) free(out[k]);
  anna_model_free(m);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s FIXTURES_DIR EXTRA_FIXTURES_DIR\n", argv[0]);
    return 2;
  }
  test_model(argv[1], "qwen3_5", 1);
  test_model(argv[1], "qwen3_5_moe_text", 1);
  test_model(argv[2], "qwen3_5_x", 1);
  test_model(argv[1], "gemma4_text", 0);
  test_model(argv[2], "gemma4_kv", 0);
  test_model(argv[1], "qwen3", 0);
  test_model(argv[1], "gemma3_text", 0);
  test_pool(argv[1], "qwen3_5", 1);
  test_pool(argv[2], "qwen3_5_x", 1);
  test_pool(argv[1], "gemma4_text", 0);
  test_pool(argv[2], "gemma4_kv", 0);
  test_pool(argv[1], "qwen3", 0);
  test_residual(argv[1], "qwen3", 1);
  test_residual(argv[1], "qwen3_5", 0);
  printf("%d passed, %d failed\n", g_checks - g_fail, g_fail);
  return g_fail ? 1 : 0;
}
