/* test_fixtures.c: every model folder of shared/fixtures against transformers' outputs.
 *
 * Per model and case: (1) all-position logits from one prefill call, max |diff| <= 2e-3;
 * (2) the same logits when the prompt is fed in uneven pieces (prefill continued from
 * state: exercises KV append, conv state and the chunked/recurrent GDN switch);
 * (3) greedy ids via prefill then one-token decode, equal to the reference up to the first
 * step whose margin is < 1e-3; (4) both cases decoded together as two sequences of one
 * batch give the same ids as decoded alone.
 * Usage: test_fixtures FIXTURES_DIR [--gguf GGUF_DIR] [--device cpu|cuda|auto] [--exact] [--tol T]
 *                      [model ...]
 * With --gguf, the models are the llama.cpp-converted GGUF files of the same fixtures.
 * --exact runs the context with exact_matmul (f32 activations everywhere: the CUDA
 * backend's f32 path). --tol T replaces the 2e-3 logit bound and the 1e-3 greedy margin
 * (for the CUDA tensor-core path, whose bf16/TF32 inputs are not f32-exact).
 */
#include "anna/anna.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NGEN 24

static int g_fail;
static const char *g_gguf_dir; /* --gguf DIR: load DIR/<name>.gguf, compare with the same references */
static const char *g_device;   /* --device NAME: the context's device (default cpu) */
static int g_exact;            /* --exact: anna_context_options.exact_matmul */
static float g_tol = 2e-3f;      /* --tol: logit bound */
static float g_margin = 1e-3f; /* greedy steps are compared while the reference margin is >= this */

#define CHECK(cond, ...)                                                                                               \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      printf("  FAIL: " __VA_ARGS__);                                                                                  \
      printf("\n");                                                                                                    \
      g_fail++;                                                                                                        \
    }                                                                                                                  \
  } while (0)

typedef struct fcase {
  const char *tag;
  int32_t ids[512];
  int n;
  int32_t greedy[NGEN];
  double margin[NGEN];
  float *logits;
  float *hidden; /* HF last_hidden_state [n, hidden_h] (after the final norm) or NULL */
  int hidden_h;
} fcase;

static float *read_f32(const char *path, size_t n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  float *p = malloc(n * sizeof(float));
  if (p && fread(p, sizeof(float), n, f) != n) {
    free(p);
    p = NULL;
  }
  fclose(f);
  return p;
}

static int load_cases(const char *dir, fcase *cs, int *ncase, int vocab_check) {
  char path[2200];
  snprintf(path, sizeof path, "%.1024s/expected.json", dir);
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) return -1;
  json_t *cases = json_object_get(root, "cases");
  *ncase = 0;
  for (size_t i = 0; i < json_array_size(cases) && i < 2; i++) {
    json_t *c = json_array_get(cases, i);
    fcase *fc = &cs[(*ncase)++];
    fc->tag = strdup(json_string_value(json_object_get(c, "tag")));
    json_t *ids = json_object_get(c, "prompt_ids");
    fc->n = (int)json_array_size(ids);
    for (int j = 0; j < fc->n; j++) fc->ids[j] = (int32_t)json_integer_value(json_array_get(ids, j));
    json_t *g = json_object_get(c, "greedy_ids"), *mg = json_object_get(c, "greedy_margin");
    for (int j = 0; j < NGEN; j++) {
      fc->greedy[j] = (int32_t)json_integer_value(json_array_get(g, j));
      fc->margin[j] = json_number_value(json_array_get(mg, j));
    }
    snprintf(path, sizeof path, "%.1024s/%.1024s", dir, json_string_value(json_object_get(c, "logits_file")));
    fc->logits = read_f32(path, (size_t)fc->n * vocab_check);
    json_t *hf = json_object_get(c, "hidden_file"), *hs = json_object_get(c, "hidden_shape");
    if (json_is_string(hf) && json_array_size(hs) == 3) { /* [layers + 1, n, hidden]: keep the last entry */
      const size_t L1 = (size_t)json_integer_value(json_array_get(hs, 0)), H = (size_t)json_integer_value(json_array_get(hs, 2));
      snprintf(path, sizeof path, "%.1024s/%.1024s", dir, json_string_value(hf));
      float *all = read_f32(path, L1 * (size_t)fc->n * H);
      if (all && L1 > 0) {
        fc->hidden = malloc(sizeof(float) * (size_t)fc->n * H);
        if (fc->hidden) memcpy(fc->hidden, all + (L1 - 1) * (size_t)fc->n * H, sizeof(float) * (size_t)fc->n * H);
        fc->hidden_h = (int)H;
      }
      free(all);
    }
  }
  json_decref(root);
  return 0;
}

/* Feeds ids[0..n) to seq in pieces of the given sizes (cycled); all logits to out. */
static int prefill(anna_context *ctx, int seq, const int32_t *ids, int n, const int *pieces, int npieces, float *out,
                   int vocab, char *err) {
  int32_t sq[512], pos[512];
  int8_t want[512];
  int at = 0, pi = 0;
  while (at < n) {
    int len = pieces[pi++ % npieces];
    if (len > n - at) len = n - at;
    for (int i = 0; i < len; i++) {
      sq[i] = seq;
      pos[i] = at + i;
      want[i] = 1;
    }
    anna_batch b = {len, ids + at, sq, pos, want};
    int rc = anna_context_decode(ctx, &b, out + (size_t)at * vocab, err, 256);
    if (rc) return rc;
    at += len;
  }
  return 0;
}

static float max_diff(const float *a, const float *b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; i++) {
    float d = fabsf(a[i] - b[i]);
    if (!(d <= m)) m = d; /* NaN propagates as a failure */
  }
  return m;
}

static int argmax(const float *l, int v) {
  int b = 0;
  for (int i = 1; i < v; i++)
    if (l[i] > l[b]) b = i;
  return b;
}

/* Number of leading greedy steps that must match (stop at the first tiny margin). */
static int comparable(const fcase *fc) {
  int k = 0;
  while (k < NGEN && fc->margin[k] >= g_margin) k++;
  return k;
}

static void test_model(const char *root, const char *name) {
  char dir[1024], err[256] = "";
  snprintf(dir, sizeof dir, "%s/%s", root, name);
  printf("%s\n", name);
  anna_model *m = NULL;
  char mpath[1024];
  if (g_gguf_dir) snprintf(mpath, sizeof mpath, "%.900s/%.100s.gguf", g_gguf_dir, name);
  else snprintf(mpath, sizeof mpath, "%s", dir);
  if (anna_model_load(&m, mpath, NULL, err, sizeof err)) {
    CHECK(0, "load: %s", err);
    return;
  }
  const int V = anna_model_vocab(m);
  fcase cs[2];
  int nc = 0;
  memset(cs, 0, sizeof cs);
  if (load_cases(dir, cs, &nc, V) || nc == 0) {
    CHECK(0, "cannot read %s/expected.json", dir);
    anna_model_free(m);
    return;
  }
  anna_context *ctx = NULL;
  anna_context_options o = {.n_seq = 2, .n_ctx = 1024, .n_batch = 640, .n_threads = 2, .device = g_device,
                           .exact_matmul = g_exact};
  if (anna_context_create(&ctx, m, &o, err, sizeof err)) {
    CHECK(0, "context: %s", err);
    for (int c = 0; c < nc; c++) {
      free(cs[c].logits);
      free(cs[c].hidden);
      free((char *)cs[c].tag);
    }
    anna_model_free(m);
    return;
  }
  float *lg = malloc(sizeof(float) * (size_t)V * 640);
  for (int c = 0; c < nc; c++) {
    fcase *fc = &cs[c];
    CHECK(fc->logits != NULL, "%s: missing logits file", fc->tag);
    if (!fc->logits) continue;
    /* (1) one call */
    anna_context_seq_reset(ctx, 0);
    int whole[] = {fc->n};
    if (prefill(ctx, 0, fc->ids, fc->n, whole, 1, lg, V, err)) {
      CHECK(0, "%s: decode: %s", fc->tag, err);
      continue;
    }
    float d1 = max_diff(lg, fc->logits, (size_t)fc->n * V);
    CHECK(d1 <= g_tol, "%s: prefill logits max diff %.3g > %.1g", fc->tag, d1, g_tol);
    /* (2) uneven pieces: 1, 5, 13, 64, 3 ... */
    anna_context_seq_reset(ctx, 0);
    int pieces[] = {1, 5, 13, 64, 3, 9};
    if (prefill(ctx, 0, fc->ids, fc->n, pieces, 6, lg, V, err)) {
      CHECK(0, "%s: decode: %s", fc->tag, err);
      continue;
    }
    float d2 = max_diff(lg, fc->logits, (size_t)fc->n * V);
    CHECK(d2 <= g_tol, "%s: piecewise prefill logits max diff %.3g > %.1g", fc->tag, d2, g_tol);
    /* (3) greedy: prefill, then one token at a time */
    anna_context_seq_reset(ctx, 0);
    int32_t sq[512], pos[512];
    int8_t want[512];
    for (int i = 0; i < fc->n; i++) sq[i] = 0, pos[i] = i, want[i] = i == fc->n - 1;
    anna_batch b = {fc->n, fc->ids, sq, pos, want};
    int rc = anna_context_decode(ctx, &b, lg, err, sizeof err);
    CHECK(rc == 0, "%s: decode: %s", fc->tag, err);
    int k = comparable(fc), ok = 0;
    for (int step = 0; step < NGEN && rc == 0; step++) {
      int32_t t = argmax(lg, V);
      if (step < k) {
        if (t != fc->greedy[step]) break;
        ok++;
      }
      t = fc->greedy[step]; /* teacher-force past any divergence so later checks stay meaningful */
      int32_t s0 = 0, p0 = fc->n + step;
      int8_t w = 1;
      anna_batch d = {1, &t, &s0, &p0, &w};
      rc = anna_context_decode(ctx, &d, lg, err, sizeof err);
    }
    CHECK(ok == k, "%s: greedy ids match for %d of %d comparable steps", fc->tag, ok, k);
    printf("  %-5s n=%3d prefill max|d|=%.2e pieces max|d|=%.2e greedy %d/%d\n", fc->tag, fc->n, d1, d2, ok, k);
    /* (4) anna_context_decode_hidden: every row, then only the last (embeddings' pooling) */
    if (fc->hidden) {
      const int H = anna_model_hidden_size(m);
      CHECK(H == fc->hidden_h, "%s: hidden size %d, reference %d", fc->tag, H, fc->hidden_h);
      float *hv = H == fc->hidden_h ? malloc(sizeof(float) * (size_t)fc->n * (size_t)H) : NULL;
      int32_t hsq[512], hpos[512];
      int8_t hwant[512];
      for (int pass = 0; hv && pass < 2; pass++) {
        for (int i = 0; i < fc->n; i++) hsq[i] = 0, hpos[i] = i, hwant[i] = pass == 0 || i == fc->n - 1;
        anna_context_seq_reset(ctx, 0);
        anna_batch hb = {fc->n, fc->ids, hsq, hpos, hwant};
        int hrc = anna_context_decode_hidden(ctx, &hb, hv, err, sizeof err);
        CHECK(hrc == 0, "%s: decode_hidden: %s", fc->tag, err);
        if (hrc) break;
        const float *ref = fc->hidden + (pass == 0 ? 0 : (size_t)(fc->n - 1) * (size_t)H);
        const float dh = max_diff(hv, ref, (size_t)(pass == 0 ? fc->n : 1) * (size_t)H);
        CHECK(dh <= g_tol, "%s: final hidden states (%s) max diff %.3g > %.1g", fc->tag, pass ? "last row" : "all rows",
              dh, g_tol);
        if (pass) printf("  %-5s final hidden max|d|=%.2e\n", fc->tag, dh);
      }
      free(hv);
      anna_context_seq_reset(ctx, 0);
    }
  }
  /* (4) both cases as two sequences decoded together */
  if (nc == 2 && cs[0].logits && cs[1].logits) {
    anna_context_seq_reset(ctx, 0);
    anna_context_seq_reset(ctx, 1);
    int32_t tok[1024], sq[1024], pos[1024];
    int8_t want[1024];
    int n = 0;
    for (int c = 0; c < 2; c++)
      for (int i = 0; i < cs[c].n && n < 640; i++) {
        tok[n] = cs[c].ids[i], sq[n] = c, pos[n] = i, want[n] = i == cs[c].n - 1;
        n++;
      }
    int rc = n == cs[0].n + cs[1].n ? 0 : -1;
    if (rc == 0) {
      anna_batch b = {n, tok, sq, pos, want};
      rc = anna_context_decode(ctx, &b, lg, err, sizeof err);
    }
    int k0 = comparable(&cs[0]), k1 = comparable(&cs[1]), ok0 = 0, ok1 = 0, live0 = 1, live1 = 1;
    for (int step = 0; step < NGEN && rc == 0; step++) {
      int32_t a0 = argmax(lg, V), a1 = argmax(lg + V, V);
      if (step < k0 && live0 && a0 == cs[0].greedy[step]) ok0++;
      else live0 = 0;
      if (step < k1 && live1 && a1 == cs[1].greedy[step]) ok1++;
      else live1 = 0;
      int32_t t2[2] = {cs[0].greedy[step], cs[1].greedy[step]}, s2[2] = {0, 1},
              p2[2] = {cs[0].n + step, cs[1].n + step};
      int8_t w2[2] = {1, 1};
      anna_batch d = {2, t2, s2, p2, w2};
      rc = anna_context_decode(ctx, &d, lg, err, sizeof err);
    }
    CHECK(rc == 0, "batched: %s", err);
    CHECK(ok0 == k0 && ok1 == k1, "batched greedy: %d/%d and %d/%d", ok0, k0, ok1, k1);
    printf("  batched two sequences: greedy %d/%d, %d/%d\n", ok0, k0, ok1, k1);
  }
  for (int c = 0; c < nc; c++) {
    free(cs[c].logits);
    free(cs[c].hidden);
    free((char *)cs[c].tag);
  }
  free(lg);
  anna_context_free(ctx);
  anna_model_free(m);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FIXTURES_DIR [model ...]\n", argv[0]);
    return 2;
  }
  static const char *all[] = {"qwen3_5",     "qwen3_5_text", "qwen3_5_moe_text", "gemma4_text", "gemma3_text",
                              "qwen3",       "qwen2",        "llama",            "qwen3_moe"};
  int first = 2;
  for (;;) {
    if (argc > first + 1 && !strcmp(argv[first], "--gguf")) g_gguf_dir = argv[first + 1];
    else if (argc > first + 1 && !strcmp(argv[first], "--device")) g_device = argv[first + 1];
    else if (argc > first + 1 && !strcmp(argv[first], "--tol")) {
      g_tol = g_margin = strtof(argv[first + 1], NULL);
      if (!(g_tol > 0.0f)) {
        fprintf(stderr, "--tol %s: not a positive number\n", argv[first + 1]);
        return 2;
      }
    } else if (argc > first && !strcmp(argv[first], "--exact")) {
      g_exact = 1;
      first += 1;
      continue;
    } else break;
    first += 2;
  }
  if (argc > first)
    for (int i = first; i < argc; i++) test_model(argv[1], argv[i]);
  else
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) test_model(argv[1], all[i]);
  printf("%s: %d failure(s)\n", g_fail ? "FAILED" : "OK", g_fail);
  return g_fail ? 1 : 0;
}
