/* test_layer_split.c: pipeline stages (anna_context_options.layer_split, issue 31) give the
 * output of no split, bit for bit. For every fixture model kind (dense, GDN hybrid, MoE,
 * Gemma4 with per-layer inputs, Gemma4 with KV-shared layers, Gemma4 MoE): two and three
 * stages on the same device against one stage, two sequences prefilled in one batch, then
 * 20 greedy decode steps of both in one batch each: every logits row must be identical
 * (memcmp) and so the greedy ids; the last step also through the candidates path
 * (decode_topk). For the KV-sharing Gemma4 and the GDN hybrid, a two-stage split at every
 * layer boundary. The placement report (anna_context_stage_info) covers the layers once in
 * order and its weight and KV bytes add up to the unsplit context's. Bad splits and devices
 * are clear errors.
 * Usage: test_layer_split FIXTURES_DIR EXTRA_FIXTURES_DIR [--device cpu|cuda] [--two-gpus]
 * (--device cuda: the stages are cuda:0,cuda:0 against cuda:0; for the GPU script;
 * --two-gpus: the stages alternate cuda:0, cuda:1 against cuda:0, scripts/gpu/two_gpu.sh). */
#define _POSIX_C_SOURCE 200809L
#include "anna/anna.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define STEPS 20
#define MAXP 160

static const char *g_dev = "cpu"; /* one device: "cpu" or "cuda:0" */
static int g_two;                 /* --two-gpus: stages alternate cuda:0, cuda:1 (scripts/gpu/two_gpu.sh) */

/* The device of stage i in dev_list's lists. */
static const char *stage_dev(int i) {
  return g_two ? (i % 2 ? "cuda:1" : "cuda:0") : g_dev;
}

static int read_ids(const char *dir, int which, int32_t *ids) {
  char path[1200];
  snprintf(path, sizeof path, "%.1100s/expected.json", dir);
  json_t *root = json_load_file(path, 0, NULL);
  if (!root) return -1;
  json_t *a = json_object_get(json_array_get(json_object_get(root, "cases"), (size_t)which), "prompt_ids");
  int n = (int)json_array_size(a);
  for (int i = 0; i < n && i < MAXP; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
  json_decref(root);
  return n < MAXP ? n : MAXP;
}

/* What one context computed: every logits row of the prefill and of each decode step. */
typedef struct trace {
  float *logits; /* [(n0 + n1) + 2 * STEPS, V] */
  int32_t ids[2][STEPS + 1];
  int32_t top1[2]; /* the last step's candidates (decode_topk k = 1) */
  float top1v[2];
  int rows;
} trace;

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

/* Runs the scenario on a context made with (devices, split); 0 or the failing code. */
static int run_trace(anna_model *m, const char *devices, const char *split, const int32_t *p0, int n0,
                     const int32_t *p1, int n1, trace *t, anna_stage_info *info, int *n_info) {
  const int V = anna_model_vocab(m);
  anna_context_options o = {.n_seq = 2, .n_ctx = 256, .n_batch = 256, .n_threads = 2, .device = devices,
                            .layer_split = split};
  anna_context *c = NULL;
  char err[256];
  int rc = anna_context_create(&c, m, &o, err, sizeof err);
  if (rc) {
    printf("  create (%s, %s): %s\n", devices, split ? split : "none", err);
    return rc;
  }
  *n_info = anna_context_stage_count(c);
  for (int i = 0; i < *n_info && i < 16; i++) anna_context_stage_info(c, i, &info[i], err, sizeof err);
  int32_t tok[2 * MAXP], seq[2 * MAXP], pos[2 * MAXP];
  int8_t want[2 * MAXP];
  int n = 0;
  for (int i = 0; i < n0; i++, n++) tok[n] = p0[i], seq[n] = 0, pos[n] = i, want[n] = 1;
  for (int i = 0; i < n1; i++, n++) tok[n] = p1[i], seq[n] = 1, pos[n] = i, want[n] = 1;
  anna_batch b = {n, tok, seq, pos, want};
  float *out = t->logits;
  if ((rc = anna_context_decode(c, &b, out, err, sizeof err))) goto fail;
  t->ids[0][0] = argmax(out + (size_t)(n0 - 1) * V, V);
  t->ids[1][0] = argmax(out + (size_t)(n - 1) * V, V);
  out += (size_t)n * V;
  for (int s = 0; s < STEPS; s++) {
    int32_t dt[2] = {t->ids[0][s], t->ids[1][s]}, ds[2] = {0, 1}, dp[2] = {n0 + s, n1 + s};
    int8_t dw[2] = {1, 1};
    anna_batch d = {2, dt, ds, dp, dw};
    if (s == STEPS - 1) { /* the candidates path as well: the last stage's topk */
      double st[4];
      if ((rc = anna_context_decode_topk(c, &d, 1, 0.0f, t->top1, t->top1v, st, err, sizeof err))) goto fail;
      for (int r = 0; r < 2 && !rc; r++) rc = anna_context_logits_row(c, r, out + (size_t)r * V, err, sizeof err);
      if (rc) goto fail;
    } else if ((rc = anna_context_decode(c, &d, out, err, sizeof err))) {
      goto fail;
    }
    t->ids[0][s + 1] = argmax(out, V);
    t->ids[1][s + 1] = argmax(out + V, V);
    out += (size_t)2 * V;
  }
  t->rows = n + 2 * STEPS;
  anna_context_free(c);
  return 0;
fail:
  printf("  run (%s, %s): %s\n", devices, split ? split : "none", err);
  anna_context_free(c);
  return rc;
}

static void same(const char *model, const char *split, const trace *a, const trace *b, int V) {
  char what[200];
  snprintf(what, sizeof what, "%s split %s: logits rows identical", model, split);
  size_t diff_rows = 0;
  for (int r = 0; r < a->rows; r++)
    diff_rows += memcmp(a->logits + (size_t)r * V, b->logits + (size_t)r * V, sizeof(float) * (size_t)V) != 0;
  check(what, (double)diff_rows, 0);
  snprintf(what, sizeof what, "%s split %s: greedy ids identical", model, split);
  check(what, memcmp(a->ids, b->ids, sizeof a->ids) ? 1 : 0, 0);
  snprintf(what, sizeof what, "%s split %s: top-1 candidates identical", model, split);
  check(what, memcmp(a->top1, b->top1, sizeof a->top1) || memcmp(a->top1v, b->top1v, sizeof a->top1v) ? 1 : 0, 0);
}

/* The stages cover [0, L) once, in order; bytes add up to the one-stage report. */
static void placement(const char *model, const char *split, const anna_stage_info *ref, const anna_stage_info *st,
                      int n, int S, int L) {
  char what[200];
  snprintf(what, sizeof what, "%s split %s: %d stages reported", model, split, S);
  check(what, n == S ? 0 : 1, 0);
  int at = 0, bad = 0;
  int64_t wb = 0, kb = 0;
  for (int i = 0; i < n; i++) {
    bad += st[i].layer_begin != at || st[i].layer_end <= st[i].layer_begin ||
           strcmp(st[i].device, g_two && n > 1 ? stage_dev(i) : ref[0].device);
    at = st[i].layer_end;
    wb += st[i].weight_bytes;
    kb += st[i].kv_bytes;
  }
  snprintf(what, sizeof what, "%s split %s: stages cover the %d layers in order", model, split, L);
  check(what, bad || at != L ? 1 : 0, 0);
  snprintf(what, sizeof what, "%s split %s: weight bytes add up (%lld)", model, split, (long long)wb);
  check(what, wb == ref[0].weight_bytes && wb > 0 ? 0 : 1, 0);
  snprintf(what, sizeof what, "%s split %s: KV bytes add up (%lld)", model, split, (long long)kb);
  check(what, kb == ref[0].kv_bytes && kb > 0 ? 0 : 1, 0);
}

static char *dev_list(int S, char *buf, size_t len) {
  buf[0] = 0;
  for (int i = 0; i < S; i++) {
    size_t l = strlen(buf);
    snprintf(buf + l, len - l, "%s%s", i ? "," : "", stage_dev(i));
  }
  return buf;
}

/* splits: NULL-terminated list of layer_split strings to try against no split. */
static void test_model(const char *root, const char *name, const char *const *splits) {
  char dir[1200], err[256];
  snprintf(dir, sizeof dir, "%.1000s/%.100s", root, name);
  printf("%s\n", name);
  anna_model *m = NULL;
  anna_model_options mo = {.device = g_dev};
  if (anna_model_load(&m, dir, &mo, err, sizeof err)) {
    check(err, 1, 0);
    return;
  }
  int32_t p0[MAXP], p1[MAXP];
  const int n0 = read_ids(dir, 0, p0), nl = read_ids(dir, 1, p1);
  if (n0 < 2 || nl < 40) {
    check("prompt ids from expected.json", 1, 0);
    anna_model_free(m);
    return;
  }
  const int n1 = 37; /* the second sequence: a different prompt and length */
  const int V = anna_model_vocab(m), L = anna_model_n_layers(m);
  const size_t rows = (size_t)(n0 + n1) + 2 * STEPS;
  trace ref = {0}, got = {0};
  ref.logits = malloc(rows * (size_t)V * sizeof(float));
  got.logits = malloc(rows * (size_t)V * sizeof(float));
  anna_stage_info ri[16], gi[16];
  int nri = 0, ngi = 0;
  if (!ref.logits || !got.logits || run_trace(m, g_dev, NULL, p0, n0, p1 + 3, n1, &ref, ri, &nri)) {
    check("reference run", 1, 0);
  } else {
    check("one stage without layer_split", nri == 1 && ri[0].layer_begin == 0 && ri[0].layer_end == L ? 0 : 1, 0);
    for (int k = 0; splits[k]; k++) {
      const char *sp = splits[k];
      int S = 1;
      for (const char *q = sp; *q; q++) S += *q == ',';
      char devs[256];
      memset(got.logits, 0, rows * (size_t)V * sizeof(float));
      if (run_trace(m, dev_list(S, devs, sizeof devs), sp, p0, n0, p1 + 3, n1, &got, gi, &ngi)) {
        char what[200];
        snprintf(what, sizeof what, "%s split %s: runs", name, sp);
        check(what, 1, 0);
        continue;
      }
      same(name, sp, &ref, &got, V);
      placement(name, sp, ri, gi, ngi, S, L);
    }
    /* one device named once, shared by every stage */
    char sp[32];
    snprintf(sp, sizeof sp, "1,%d", L - 1);
    const int two = g_two;
    g_two = 0; /* both stages on g_dev here */
    if (run_trace(m, g_dev, sp, p0, n0, p1 + 3, n1, &got, gi, &ngi)) {
      check("two stages on one device named once: runs", 1, 0);
    } else {
      same(name, "one device named once", &ref, &got, V);
      placement(name, sp, ri, gi, ngi, 2, L);
    }
    g_two = two;
  }
  free(ref.logits);
  free(got.logits);
  anna_model_free(m);
}

/* A rejected configuration: the call fails with code and its message names `needle`. */
static void bad(anna_model *m, const char *devices, const char *split, int code, const char *needle) {
  anna_context_options o = {.n_seq = 1, .n_ctx = 64, .n_batch = 16, .n_threads = 1, .device = devices,
                            .layer_split = split};
  anna_context *c = NULL;
  char err[256] = "", what[300];
  const int rc = anna_context_create(&c, m, &o, err, sizeof err);
  snprintf(what, sizeof what, "devices %s split %s -> %d '%s'", devices ? devices : "(null)", split ? split : "(null)",
           rc, err);
  check(what, rc == code && strstr(err, needle) ? 0 : 1, 0);
  printf("  %s\n", what);
  anna_context_free(c);
}

static void test_errors(const char *root) {
  char dir[1200], err[256], d2[128], d3[128], d4[128];
  snprintf(dir, sizeof dir, "%.1000s/qwen3", root);
  printf("errors\n");
  anna_model *m = NULL;
  anna_model_options mo = {.device = g_dev};
  if (anna_model_load(&m, dir, &mo, err, sizeof err)) {
    check(err, 1, 0);
    return;
  }
  dev_list(2, d2, sizeof d2), dev_list(3, d3, sizeof d3), dev_list(4, d4, sizeof d4);
  bad(m, d2, "2,2", ANNA_EINVAL, "the stages hold 4 layers; the model has 3");
  bad(m, d2, "3,0", ANNA_EINVAL, "stage 1 has no layers");
  bad(m, d4, "1,1,1,1", ANNA_EINVAL, "4 stages for a model of 3 layers");
  bad(m, d4, "auto", ANNA_EINVAL, "4 devices for a model of 3 layers");
  bad(m, d2, "1,x", ANNA_EINVAL, "stage 1 is not a count");
  bad(m, d2, "1,,2", ANNA_EINVAL, "stage 1 is not a count");
  bad(m, d3, "1,2", ANNA_EINVAL, "2 stages but 3 devices");
  bad(m, d2, NULL, ANNA_EINVAL, "without --layer-split");
  bad(m, "cpu,tpu", "1,2", ANNA_EUNSUPPORTED, "device 'tpu'");
  bad(m, "cpu:1", NULL, ANNA_EUNSUPPORTED, "one cpu device");
  bad(m, "cpu:x", NULL, ANNA_EINVAL, "ordinal");
  bad(m, ",cpu", "1,2", ANNA_EINVAL, "empty entry");
  bad(m, "cuda:99", NULL, ANNA_EUNSUPPORTED, "cuda");
  anna_model_free(m);
  char list[2048];
  const int n = anna_devices_list(list, sizeof list);
  printf("  devices:\n%s", list);
  check("anna_devices_list lists the cpu first", n >= 1 && !strncmp(list, "cpu", 3) ? 0 : 1, 0);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: test_layer_split FIXTURES_DIR EXTRA_FIXTURES_DIR [--device cpu|cuda] [--two-gpus]\n");
    return 2;
  }
  for (int i = 3; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--device")) g_dev = !strcmp(argv[i + 1], "cuda") ? "cuda:0" : argv[i + 1];
  for (int i = 3; i < argc; i++) g_two |= !strcmp(argv[i], "--two-gpus");
  if (g_two) g_dev = "cuda:0";
  const char *dense[] = {"1,2", "2,1", "1,1,1", "auto", NULL};
  const char *hybrid[] = {"1,3", "2,2", "3,1", "1,2,1", "auto", NULL}; /* GDN x3 + attention: every boundary */
  const char *gemma4[] = {"3,3", "2,2,2", "auto", NULL};
  /* KV-shared layers 4..6 read layers 2 and 3: every boundary, some inside the shared part */
  const char *gemma4kv[] = {"1,6", "2,5", "3,4", "4,3", "5,2", "6,1", "2,3,2", "4,1,2", NULL};
  const char *moe4[] = {"2,2", "1,2,1", NULL};
  test_model(argv[1], "qwen3", dense);
  test_model(argv[1], "llama", dense);
  test_model(argv[1], "qwen3_5_text", hybrid);
  test_model(argv[1], "qwen3_5_moe_text", moe4);
  test_model(argv[1], "qwen3_moe", dense);
  test_model(argv[1], "gemma4_text", gemma4);
  test_model(argv[2], "gemma4_kv", gemma4kv);
  test_model(argv[2], "gemma4_moe", moe4);
  test_errors(argv[1]);
  printf("%d checks, %d failures\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
