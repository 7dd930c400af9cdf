/* test_kinds.c: the model kind registry (src/model/kind.h). The text decoder is found for
 * an HF fixture folder and a GGUF fixture and declares tokens -> logits; an unknown
 * config.json model_type or GGUF architecture is refused with the message the loaders gave
 * before kinds existed (config_parse_hf's, and the same through anna_model_load); and a
 * batch run through the kind table (load, backend_shape, state_create, run) gives
 * anna_context_decode's logits and candidates bit for bit.
 * Usage: test_kinds FIXTURES_DIR */
#define _POSIX_C_SOURCE 200809L
#include "anna/anna.h"
#include "backends/registry.h"
#include "base/error.h"
#include "base/tuning.h"
#include "model/config.h"
#include "model/kind.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_fail, g_checks;

static void ok(const char *what, int cond) {
  g_checks++;
  printf("  %-64s %s\n", what, cond ? "ok" : "FAIL");
  if (!cond) g_fail++;
}

static void test_registry(void) {
  printf("registry\n");
  const model_kind *k = model_kind_get(0);
  ok("kind 0 is the text decoder", k && !strcmp(k->name, "text_decoder"));
  ok("found by name", model_kind_by_name("text_decoder") == k && !model_kind_by_name("nope"));
  ok("past the end is NULL", !model_kind_get(model_kind_count()) && !model_kind_get(-1));
  ok("text decoder: tokens (+ embedding rows) -> logits or final hidden states",
     k && k->inputs == (MODEL_IO_BIT(MODEL_IO_TOKENS) | MODEL_IO_BIT(MODEL_IO_EMBEDDINGS)) &&
         k->outputs == (MODEL_IO_BIT(MODEL_IO_LOGITS) | MODEL_IO_BIT(MODEL_IO_HIDDEN)));
  ok("text decoder has per-sequence state", k && k->seq && k->seq->seq_len && k->seq->logits_row);
  ok("io names", !strcmp(model_io_name(MODEL_IO_TOKENS), "tokens") &&
                     !strcmp(model_io_name(MODEL_IO_LOGITS), "logits") &&
                     !strcmp(model_io_name(MODEL_IO_PCM), "pcm") &&
                     !strcmp(model_io_name(MODEL_IO_COUNT), "?"));
}

static void test_find(const char *fixtures, const char *gguf_dir) {
  printf("probe\n");
  char path[1200], err[512] = "";
  model_source src;
  const model_kind *k = NULL;
  snprintf(path, sizeof path, "%s/qwen3", fixtures);
  int rc = model_kind_find(path, &src, &k, err, sizeof err);
  if (rc) printf("  %s\n", err);
  ok("HF folder (qwen3) -> text_decoder", !rc && k && !strcmp(k->name, "text_decoder") &&
                                              !src.is_gguf && !strcmp(src.model_type, "qwen3"));
  snprintf(path, sizeof path, "%s/qwen3_5", fixtures);
  rc = model_kind_find(path, &src, &k, err, sizeof err);
  ok("HF composite folder (qwen3_5) -> text_decoder", !rc && k && !strcmp(k->name, "text_decoder"));
  snprintf(path, sizeof path, "%s/qwen3.gguf", gguf_dir);
  rc = model_kind_find(path, &src, &k, err, sizeof err);
  if (rc) printf("  %s\n", err);
  ok("GGUF (qwen3.gguf) -> text_decoder", !rc && k && !strcmp(k->name, "text_decoder") &&
                                              src.is_gguf && !strcmp(src.gguf_arch, "qwen3"));
  rc = model_kind_find("/nonexistent/anna/model", &src, &k, err, sizeof err);
  ok("missing path: today's message",
     rc == ANNA_EIO && !k && !strcmp(err, "/nonexistent/anna/model: no such file or folder"));
}

/* Loads through the public API and through the registry; both must say exactly `want`. */
static void expect_refusal(const char *what, const char *path, int want_rc, const char *want) {
  char e1[512] = "", e2[512] = "";
  model_source src;
  const model_kind *k = NULL;
  anna_model *m = NULL;
  int r1 = model_kind_find(path, &src, &k, e1, sizeof e1);
  int r2 = anna_model_load(&m, path, NULL, e2, sizeof e2);
  printf("    %s\n", e1);
  ok(what, r1 == want_rc && r2 == want_rc && !k && !m && !strcmp(e1, want) && !strcmp(e2, want));
  anna_model_free(m);
}

static void put_le(FILE *f, uint64_t v, int n) {
  for (int i = 0; i < n; i++)
    fputc((int)(v >> (8 * i)) & 0xff, f);
}

static void test_unknown(void) {
  printf("unknown model types\n");
  char dir[] = "/tmp/anna-kinds-XXXXXX", path[256], want[512], err[512];
  if (!mkdtemp(dir)) {
    ok("temp folder", 0);
    return;
  }
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (f) {
    fputs("{\"model_type\": \"xwen9\", \"architectures\": [\"Xwen9ForCausalLM\"]}\n", f);
    fclose(f);
  }
  /* The message config_parse_hf gave (and gives) for this file. */
  model_config *cfg = malloc(sizeof *cfg);
  int rc = cfg ? config_parse_hf(cfg, path, err, sizeof err) : ANNA_ENOMEM;
  free(cfg);
  snprintf(want, sizeof want, "%s: model_type 'xwen9' is not supported", path);
  ok("config_parse_hf's message", rc == ANNA_EUNSUPPORTED && !strcmp(err, want));
  expect_refusal("unknown model_type refused with that message", dir, ANNA_EUNSUPPORTED, want);
  /* missing model_type: the config reader's message, unchanged */
  if ((f = fopen(path, "w"))) {
    fputs("{\"hidden_size\": 8}\n", f);
    fclose(f);
  }
  snprintf(want, sizeof want, "%s: missing model_type", path);
  expect_refusal("missing model_type refused with today's message", dir, ANNA_EFORMAT, want);
  /* A GGUF whose general.architecture no kind reads: version 3, no tensors, one key. */
  snprintf(path, sizeof path, "%s/x.gguf", dir);
  if ((f = fopen(path, "wb"))) {
    const char *key = "general.architecture", *val = "xwen9";
    fwrite("GGUF", 1, 4, f);
    put_le(f, 3, 4);
    put_le(f, 0, 8);
    put_le(f, 1, 8);
    put_le(f, strlen(key), 8);
    fwrite(key, 1, strlen(key), f);
    put_le(f, 8, 4); /* GGUF_TYPE_STRING */
    put_le(f, strlen(val), 8);
    fwrite(val, 1, strlen(val), f);
    fclose(f);
  }
  snprintf(want, sizeof want, "%s: GGUF architecture 'xwen9' is not supported", path);
  expect_refusal("unknown GGUF architecture refused with today's message", path, ANNA_EUNSUPPORTED,
                 want);
  unlink(path);
  snprintf(path, sizeof path, "%s/config.json", dir);
  unlink(path);
  rmdir(dir);
}

enum { N_SEQ = 2, N_CTX = 256, N_BATCH = 64, N_THREADS = 2, N_TOK = 40, TOPK = 8 };

/* The same batch through the kind table and through anna_context_decode(_topk). */
static void test_run(const char *model_path) {
  printf("run through the kind table: %s\n", model_path);
  char err[512] = "";
  int32_t tok[N_TOK], seq[N_TOK], pos[N_TOK];
  int8_t want[N_TOK];
  for (int i = 0; i < N_TOK; i++)
    tok[i] = (int32_t)((i * 37 + 11) % 500), seq[i] = i < 24 ? 0 : 1, want[i] = 1;
  for (int i = 0; i < N_TOK; i++)
    pos[i] = i < 24 ? i : i - 24;
  const anna_batch b = {N_TOK, tok, seq, pos, want};
  /* the public API */
  anna_model *m = NULL;
  anna_context *c = NULL;
  const anna_context_options co = {
      .n_seq = N_SEQ, .n_ctx = N_CTX, .n_batch = N_BATCH, .n_threads = N_THREADS};
  if (anna_model_load(&m, model_path, NULL, err, sizeof err) ||
      anna_context_create(&c, m, &co, err, sizeof err)) {
    printf("  %s\n", err);
    ok("public load", 0);
    anna_model_free(m);
    return;
  }
  ok("anna_model_kind_name", !strcmp(anna_model_kind_name(m), "text_decoder"));
  const int V = anna_model_vocab(m);
  float *ref = malloc(sizeof(float) * (size_t)N_TOK * V),
        *got = calloc((size_t)N_TOK * V, sizeof(float));
  int32_t ridx[N_TOK * TOPK], gidx[N_TOK * TOPK];
  float rval[N_TOK * TOPK], gval[N_TOK * TOPK];
  double rst[2 * N_TOK], gst[2 * N_TOK];
  int rc = anna_context_decode(c, &b, ref, err, sizeof err);
  anna_context_seq_reset(c, 0);
  anna_context_seq_reset(c, 1);
  if (!rc) rc = anna_context_decode_topk(c, &b, TOPK, 0.7f, ridx, rval, rst, err, sizeof err);
  if (rc) printf("  %s\n", err);
  ok("anna_context_decode", !rc);
  /* the kind table */
  model_source src;
  const model_kind *k = NULL;
  void *impl = NULL, *st = NULL;
  ops_backend *be = NULL;
  anna_tuning t;
  ops_model_shape *shape = malloc(sizeof *shape);
  const backend_info *bi = backend_registry_find("cpu");
  const model_load_params lp = {.tuning = &t};
  rc = tuning_from_env(&t, NULL, err, sizeof err);
  if (!rc) rc = model_kind_find(model_path, &src, &k, err, sizeof err);
  if (!rc) rc = k->load(&impl, &src, &lp, err, sizeof err);
  if (!rc) {
    model_desc d;
    k->describe(impl, &d);
    ok("describe: the public model's", d.vocab == V && !strcmp(d.text, anna_model_describe(m)) &&
                                           d.n_layers == anna_model_n_layers(m));
    k->backend_shape(impl, N_CTX, shape);
    const backend_params bp = {
        .n_threads = N_THREADS, .n_batch = N_BATCH, .shape = shape, .tuning = &t};
    rc = bi->create(&bp, &be, err, sizeof err);
  }
  const model_state_params sp = {.n_seq = N_SEQ,
                                 .n_ctx = N_CTX,
                                 .n_batch = N_BATCH,
                                 .kv_type = OPS_KV_F32,
                                 .prefix_share = t.prefix_kv_share};
  if (!rc) rc = k->state_create(&st, impl, be, &sp, err, sizeof err);
  const model_input in = {.io = MODEL_IO_TOKENS, .batch = &b};
  if (!rc)
    rc = k->run(impl, st, be, &in, &(model_output){.io = MODEL_IO_LOGITS, .logits = got}, err,
                sizeof err);
  if (rc) printf("  %s\n", err);
  ok("logits through the kind table == anna_context_decode's (bit for bit)",
     !rc && !memcmp(got, ref, sizeof(float) * (size_t)N_TOK * V));
  if (!rc) {
    k->seq->reset(st, 0);
    k->seq->reset(st, 1);
    const model_topk tk = {TOPK, 0.7f, gidx, gval, gst};
    rc = k->run(impl, st, be, &in, &(model_output){.io = MODEL_IO_LOGITS, .topk = &tk}, err,
                sizeof err);
    if (rc) printf("  %s\n", err);
    ok("candidates through the kind table == anna_context_decode_topk's",
       !rc && !memcmp(gidx, ridx, sizeof ridx) && !memcmp(gval, rval, sizeof rval) &&
           !memcmp(gst, rst, sizeof rst));
    ok("seq_len after the run",
       k->seq->seq_len(st, 0) == 24 && k->seq->seq_len(st, 1) == N_TOK - 24);
    /* an io the text decoder does not declare */
    const model_input px = {.io = MODEL_IO_PIXELS};
    int r2 = k->run(impl, st, be, &px, &(model_output){.io = MODEL_IO_LOGITS, .logits = got}, err,
                    sizeof err);
    printf("    %s\n", err);
    ok("pixels in: ANNA_EUNSUPPORTED", r2 == ANNA_EUNSUPPORTED);
  }
  if (st) k->state_free(st);
  if (be) be->destroy(be);
  if (impl) k->free(impl);
  free(shape);
  free(ref);
  free(got);
  anna_context_free(c);
  anna_model_free(m);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FIXTURES_DIR\n", argv[0]);
    return 2;
  }
  const char *gguf_dir = ANNA_SOURCE_DIR "/tests/fixtures/gguf";
  char path[1200];
  test_registry();
  test_find(argv[1], gguf_dir);
  test_unknown();
  snprintf(path, sizeof path, "%s/qwen3", argv[1]);
  test_run(path);
  snprintf(path, sizeof path, "%s/qwen3_5", argv[1]); /* GDN layers: recurrent state in the run */
  test_run(path);
  snprintf(path, sizeof path, "%s/qwen3_5.gguf", gguf_dir);
  test_run(path);
  printf("%d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
