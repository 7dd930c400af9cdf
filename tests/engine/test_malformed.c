/* test_malformed.c: broken model files and bad inputs are errors with a one-line message
 * naming what was wrong, never a crash (run under ASan/UBSan by scripts/test.sh).
 * Each case copies a fixture into a temp folder, damages one thing, and loads it. */
#include "anna/anna.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_fail, g_cases;
static char g_src[1024], g_tmp[256];

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *p = malloc((size_t)sz + 1);
  if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) {
    free(p);
    p = NULL;
  }
  fclose(f);
  *n = (size_t)sz;
  return p;
}

static void spit(const char *name, const void *p, size_t n) {
  char path[1400];
  snprintf(path, sizeof path, "%s/%s", g_tmp, name);
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(2);
  }
  fwrite(p, 1, n, f);
  fclose(f);
}

/* Writes the fixture's config and weights into the temp folder, letting the caller edit
 * the bytes of each first. */
static void stage(void (*edit_cfg)(char **cfg, size_t *n), void (*edit_st)(unsigned char **st, size_t *n)) {
  char path[1400];
  size_t nc, ns;
  snprintf(path, sizeof path, "%s/config.json", g_src);
  char *cfg = (char *)slurp(path, &nc);
  snprintf(path, sizeof path, "%s/model.safetensors", g_src);
  unsigned char *st = slurp(path, &ns);
  if (!cfg || !st) {
    fprintf(stderr, "cannot read fixture %s\n", g_src);
    exit(2);
  }
  cfg[nc] = 0;
  if (edit_cfg) edit_cfg(&cfg, &nc);
  if (edit_st) edit_st(&st, &ns);
  spit("config.json", cfg, nc);
  spit("model.safetensors", st, ns);
  free(cfg);
  free(st);
}

static void expect_fail(const char *what, const char *path, const char *needle) {
  char err[512] = "";
  anna_model *m = NULL;
  g_cases++;
  int rc = anna_model_load(&m, path, NULL, err, sizeof err);
  int ok = rc < 0 && m == NULL && err[0] && !strchr(err, '\n') && (!needle || strstr(err, needle));
  printf("  %-44s rc=%d  %s\n", what, rc, err);
  if (!ok) {
    printf("  FAIL: %s: expected an error mentioning '%s'\n", what, needle ? needle : "");
    g_fail++;
  }
  anna_model_free(m);
}

/* ---- edits ---- */
static uint64_t hlen(const unsigned char *st) {
  uint64_t h = 0;
  for (int i = 7; i >= 0; i--) h = (h << 8) | st[i];
  return h;
}
static void truncate_half(unsigned char **st, size_t *n) {
  *n /= 2;
  (void)st;
}
static void truncate_header(unsigned char **st, size_t *n) {
  *n = 8 + hlen(*st) / 2;
}
static void huge_header_len(unsigned char **st, size_t *n) {
  (void)n;
  memset(*st, 0xff, 7);
}
static void garbage_header(unsigned char **st, size_t *n) {
  (void)n;
  memcpy(*st + 8, "{\"x\":[[[", 8);
}
static void replace_in_header(unsigned char **st, const char *from, const char *to) {
  size_t h = (size_t)hlen(*st), fl = strlen(from);
  for (size_t i = 8; i + fl <= 8 + h; i++)
    if (!memcmp(*st + i, from, fl)) {
      memcpy(*st + i, to, fl); /* same length keeps every offset valid */
      return;
    }
}
static void rename_norm(unsigned char **st, size_t *n) {
  (void)n;
  replace_in_header(st, "\"model.norm.weight\"", "\"model.norX.weight\"");
}
static void lie_offsets(unsigned char **st, size_t *n) {
  /* The first tensor's end offset: make its first digit a 9, far past the file. */
  (void)n;
  size_t h = (size_t)hlen(*st);
  for (size_t i = 8; i + 16 < 8 + h; i++)
    if (!memcmp(*st + i, "\"data_offsets\":[", 16)) {
      unsigned char *p = *st + i + 16;
      while (*p != ',') p++;
      p++;
      *p = '9';
      return;
    }
}
static void wrong_dtype(unsigned char **st, size_t *n) {
  (void)n;
  replace_in_header(st, "\"BF16\"", "\"I8\"  ");
}
static void cfg_not_json(char **c, size_t *n) {
  (void)c;
  *n = 5;
}
static void cfg_unknown_type(char **c, size_t *n) {
  char *p = strstr(*c, "\"model_type\": \"qwen3\"");
  if (p) memcpy(p, "\"model_type\": \"xwen9\"", 21);
  (void)n;
}
static void cfg_bad_hidden(char **c, size_t *n) {
  char *p = strstr(*c, "\"hidden_size\": 128");
  if (p) memcpy(p, "\"hidden_size\": 136", 18);
  (void)n;
}
static void cfg_negative_layers(char **c, size_t *n) {
  char *p = strstr(*c, "\"num_hidden_layers\": 3");
  if (p) memcpy(p, "\"num_hidden_layers\":-3", 22);
  (void)n;
}
static void cfg_missing_heads(char **c, size_t *n) {
  char *p = strstr(*c, "\"num_attention_heads\"");
  if (p) memcpy(p, "\"num_attention_headZ\"", 21);
  (void)n;
}
static void cfg_string_vocab(char **c, size_t *n) {
  char *p = strstr(*c, "\"vocab_size\": 1000");
  if (p) memcpy(p, "\"vocab_size\":\"100\"", 18);
  (void)n;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FIXTURES_DIR\n", argv[0]);
    return 2;
  }
  snprintf(g_src, sizeof g_src, "%s/qwen3", argv[1]);
  snprintf(g_tmp, sizeof g_tmp, "/tmp/anna-malformed-XXXXXX");
  if (!mkdtemp(g_tmp)) return 2;
  printf("safetensors\n");
  stage(NULL, truncate_half), expect_fail("truncated file", g_tmp, "model.safetensors");
  stage(NULL, truncate_header), expect_fail("truncated inside the header", g_tmp, "header");
  stage(NULL, huge_header_len), expect_fail("header length larger than the file", g_tmp, "header length");
  stage(NULL, garbage_header), expect_fail("header not JSON", g_tmp, "header");
  stage(NULL, lie_offsets), expect_fail("data_offsets past the end", g_tmp, "model.embed_tokens.weight");
  stage(NULL, wrong_dtype), expect_fail("unsupported dtype", g_tmp, "dtype");
  stage(NULL, rename_norm), expect_fail("missing tensor", g_tmp, "model.norm.weight");
  printf("config.json\n");
  stage(cfg_not_json, NULL), expect_fail("config not JSON", g_tmp, "config.json");
  stage(cfg_unknown_type, NULL), expect_fail("unknown model_type", g_tmp, "xwen9");
  stage(cfg_bad_hidden, NULL), expect_fail("wrong shape vs config", g_tmp, "shape");
  stage(cfg_negative_layers, NULL), expect_fail("negative layer count", g_tmp, "num_hidden_layers");
  stage(cfg_missing_heads, NULL), expect_fail("missing field", g_tmp, "num_attention_heads");
  stage(cfg_string_vocab, NULL), expect_fail("wrong field type", g_tmp, "vocab_size");
  printf("paths\n");
  expect_fail("no such folder", "/nonexistent/anna/model", "/nonexistent");
  char p[1400];
  snprintf(p, sizeof p, "%s/config.json", g_tmp);
  expect_fail("a JSON file is not a GGUF", p, "GGUF");
  /* A GGUF cut short. */
  {
    size_t n;
    const char *src = ANNA_SOURCE_DIR "/tests/fixtures/gguf/qwen3.gguf";
    unsigned char *g = slurp(src, &n);
    if (g) {
      spit("cut.gguf", g, n / 3);
      snprintf(p, sizeof p, "%s/cut.gguf", g_tmp);
      expect_fail("truncated GGUF", p, "cut.gguf");
      free(g);
    } else {
      printf("  FAIL: cannot read %s\n", src);
      g_fail++;
    }
  }
  printf("bad batches\n");
  {
    char err[256] = "";
    anna_model *m = NULL;
    anna_context *ctx = NULL;
    g_cases++;
    if (anna_model_load(&m, g_src, NULL, err, sizeof err) || anna_context_create(&ctx, m, NULL, err, sizeof err)) {
      printf("  FAIL: %s\n", err);
      g_fail++;
    } else {
      int32_t tok[2] = {5, 100000}, ok_tok[2] = {5, 6}, seq[2] = {0, 0}, pos[2] = {0, 1}, bad_pos[2] = {3, 4}, bad_seq[2] = {0, 7};
      anna_batch b1 = {2, tok, seq, pos, NULL}, b2 = {1, tok, seq, bad_pos, NULL}, b3 = {2, ok_tok, bad_seq, pos, NULL};
      float *lg = malloc(sizeof(float) * 2000);
      int r1 = anna_context_decode(ctx, &b1, lg, err, sizeof err);
      printf("  %-44s rc=%d  %s\n", "token id out of range", r1, err);
      int r2 = anna_context_decode(ctx, &b2, lg, err, sizeof err);
      printf("  %-44s rc=%d  %s\n", "position that skips ahead", r2, err);
      int r3 = anna_context_decode(ctx, &b3, lg, err, sizeof err);
      printf("  %-44s rc=%d  %s\n", "sequence slot out of range", r3, err);
      if (!(r1 < 0 && r2 < 0 && r3 < 0)) {
        printf("  FAIL: bad batches must be rejected\n");
        g_fail++;
      }
      /* The candidate path (anna_context_decode_topk) and the row fetch after it: k outside
       * 1..OPS_TOPK_MAX, missing outputs, a row the last decode did not leave. */
      int32_t idx[4];
      float val[4];
      double st[2];
      anna_batch b4 = {1, ok_tok, seq, pos, NULL};
      int r4 = anna_context_decode_topk(ctx, &b4, 0, 0.0f, idx, val, st, err, sizeof err);
      printf("  %-44s rc=%d  %s\n", "top-0 candidates", r4, err);
      int r5 = anna_context_decode_topk(ctx, &b4, 257, 0.0f, idx, val, st, err, sizeof err);
      printf("  %-44s rc=%d  %s\n", "top-257 candidates", r5, err);
      int r6 = anna_context_decode_topk(ctx, &b4, 1, 0.0f, NULL, val, st, err, sizeof err);
      printf("  %-44s rc=%d  %s\n", "candidates without an output", r6, err);
      int r7 = anna_context_decode_topk(ctx, &b4, 4, 0.0f, idx, val, st, err, sizeof err);
      printf("  %-44s rc=%d  %s\n", "top-4 candidates (valid)", r7, r7 ? err : "");
      int r8 = anna_context_logits_row(ctx, 1, lg, err, sizeof err);
      printf("  %-44s rc=%d  %s\n", "logits row past the last decode", r8, err);
      int r9 = anna_context_logits_row(ctx, -1, lg, err, sizeof err);
      printf("  %-44s rc=%d  %s\n", "negative logits row", r9, err);
      if (!(r4 < 0 && r5 < 0 && r6 < 0 && r7 == 0 && r8 < 0 && r9 < 0)) {
        printf("  FAIL: bad candidate requests must be rejected (and the valid one taken)\n");
        g_fail++;
      }
      free(lg);
    }
    anna_context_free(ctx);
    anna_model_free(m);
  }
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", g_tmp);
  printf("%d passed, %d failed\n", g_cases - g_fail, g_fail);
  return g_fail ? 1 : 0;
}
