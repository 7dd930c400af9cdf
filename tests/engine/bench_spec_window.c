/* bench_spec_window.c: cost of one greedy verify window of k drafted tokens (k + 1 rows,
 * argmax of every row) against one plain decode step, after a prompt of --prompt-len
 * synthetic ids (bench/notes/spec.md). Each window is measured as the runtime runs it
 * (anna_context_seq_verify with a draft the model rejects at its first token, so every
 * window also pays its rollback: a KV rewind, or for GDN models the checkpoint restore and
 * one re-run token) and as the bare forward pass (decode of the k + 1 rows, then a rewind
 * that keeps nothing of it). Times are wall and process CPU seconds: on a shared machine
 * the CPU time of a 1-thread run is the steadier figure.
 * GDN rollback: "states" (default; 12 checkpoint slots, tuning spec_window_states=1) or
 * "rerun" (spec_window_states=0: checkpoint restore + the accepted token run again).
 * Usage: bench_spec_window MODEL [threads=1] [runs=5] [prompt_len=256] [states|rerun] */
#define _POSIX_C_SOURCE 200809L
#include "anna/anna.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_spec_window MODEL [threads] [runs] [prompt_len]\n");
    return 2;
  }
  const int threads = argc > 2 ? atoi(argv[2]) : 1, runs = argc > 3 ? atoi(argv[3]) : 5;
  const int plen = argc > 4 ? atoi(argv[4]) : 256;
  const int rerun = argc > 5 && !strcmp(argv[5], "rerun");
  if (threads < 1 || runs < 1 || plen < 2 || plen > 4096 || (argc > 5 && !rerun && strcmp(argv[5], "states")))
    return 2;
  char err[512];
  anna_model *m = NULL;
  anna_context *c = NULL;
  if (anna_model_load(&m, argv[1], NULL, err, sizeof err)) {
    fprintf(stderr, "error: %s\n", err);
    return 1;
  }
  const int V = anna_model_vocab(m);
  anna_context_options o = {.n_seq = 1, .n_ctx = plen + 64, .n_batch = plen, .n_threads = threads,
                            .n_checkpoints = 12, .tuning = rerun ? "spec_window_states=0" : NULL};
  if (anna_context_create(&c, m, &o, err, sizeof err)) {
    fprintf(stderr, "error: %s\n", err);
    return 1;
  }
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)plen), *sq = calloc((size_t)plen, sizeof(int32_t)),
          *pos = malloc(sizeof(int32_t) * (size_t)plen);
  int8_t *want = calloc((size_t)plen, 1);
  if (!ids || !sq || !pos || !want) return 1;
  uint64_t r = 88172645463325252ull;
  for (int i = 0; i < plen; i++) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    ids[i] = (int32_t)(100 + r % (uint64_t)(V > 2000 ? 1900 : V - 100));
    pos[i] = i;
  }
  want[plen - 1] = 1;
  int32_t idx[ANNA_SPEC_MAX_DRAFT + 1];
  float val[ANNA_SPEC_MAX_DRAFT + 1];
  double st[2 * (ANNA_SPEC_MAX_DRAFT + 1)];
  anna_batch pb = {plen, ids, sq, pos, want};
  if (anna_context_decode_topk(c, &pb, 1, 0.0f, idx, val, st, err, sizeof err)) {
    fprintf(stderr, "error: %s\n", err);
    return 1;
  }
  const int32_t last = idx[0];
  if (anna_context_seq_checkpoint(c, 0, err, sizeof err)) return 1; /* GDN: the point every run rewinds to */
  printf("# %s, prompt %d, threads %d, runs %d (median), rollback %s\n", anna_model_describe(m), plen, threads, runs,
         rerun ? "rerun" : "states");
  printf("%3s %12s %12s %12s %12s %10s\n", "k", "verify_ms", "verify_cpu", "fwd_ms", "fwd_cpu", "x_plain");
  double base = 0;
  for (int k = 0; k <= 8; k++) {
    double tw[64], tc[64], fw[64], fc[64];
    const int R = runs < 64 ? runs : 64;
    for (int rr = 0; rr < R; rr++) {
      /* a draft the model rejects at once (its own choice + 1), so the rollback is paid */
      int32_t draft[ANNA_SPEC_MAX_DRAFT], out[ANNA_SPEC_MAX_DRAFT + 1], tok[ANNA_SPEC_MAX_DRAFT + 1];
      int n_out;
      double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
      for (int i = 0; i < k; i++) draft[i] = (i ? draft[i - 1] : last) % (V - 1) + 1;
      if (anna_context_seq_verify(c, 0, last, draft, k, out, &n_out, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
      }
      tw[rr] = now(CLOCK_MONOTONIC) - w0, tc[rr] = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
      if (anna_context_seq_rewind(c, 0, plen, err, sizeof err)) {
        /* GDN: the verify left plen + 1 positions and no state at plen but its checkpoint */
        fprintf(stderr, "error: %s\n", err);
        return 1;
      }
      if (anna_context_seq_checkpoint(c, 0, err, sizeof err)) return 1;
      for (int i = 0; i <= k; i++) tok[i] = i ? draft[i - 1] : last, sq[i] = 0, pos[i] = plen + i, want[i] = 1;
      anna_batch b = {k + 1, tok, sq, pos, want};
      w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
      if (anna_context_decode_topk(c, &b, 1, 0.0f, idx, val, st, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
      }
      fw[rr] = now(CLOCK_MONOTONIC) - w0, fc[rr] = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
      if (anna_context_seq_rewind(c, 0, plen, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
      }
    }
    double *arr[4] = {tw, tc, fw, fc};
    for (int a = 0; a < 4; a++) /* insertion sort: R is small */
      for (int i = 1; i < R; i++)
        for (int j = i; j > 0 && arr[a][j - 1] > arr[a][j]; j--) {
          double t = arr[a][j];
          arr[a][j] = arr[a][j - 1], arr[a][j - 1] = t;
        }
    if (k == 0) base = fc[R / 2];
    printf("%3d %12.2f %12.2f %12.2f %12.2f %10.2f\n", k, 1e3 * tw[R / 2], 1e3 * tc[R / 2], 1e3 * fw[R / 2],
           1e3 * fc[R / 2], fc[R / 2] / base);
  }
  anna_context_free(c);
  anna_model_free(m);
  free(ids), free(sq), free(pos), free(want);
  return 0;
}
