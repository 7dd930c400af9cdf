/* test_tuning.c: the runtime switches (src/base/tuning.h) and the backend registry.
 * Tuning: defaults, every key set through tuning_parse and read back through tuning_format
 * (round trip), errors naming an unknown key or a bad value (and leaving the struct
 * unchanged), ANNA_TUNING then the options string (later wins), replaced variables refused,
 * the keys and variables of the retired A/B variants refused as retired, and the public
 * surface (anna_context_options.tuning, anna_context_tuning).
 * Registry: cpu is listed first and always available; "auto" and NULL resolve; an unknown
 * device is refused with the message the API has always given.
 * Usage: test_tuning FIXTURES_DIR */
#define _POSIX_C_SOURCE 200809L
#include "anna/anna.h"
#include "backends/registry.h"
#include "base/error.h"
#include "base/tuning.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;

#define CHECK(cond, ...)                                                                                              \
  do {                                                                                                                \
    g_checks++;                                                                                                       \
    if (!(cond)) {                                                                                                    \
      g_fail++;                                                                                                       \
      printf("  FAIL line %d: ", __LINE__);                                                                           \
      printf(__VA_ARGS__);                                                                                            \
      printf("\n");                                                                                                   \
    }                                                                                                                 \
  } while (0)

/* Two tunings hold the same switches (compared as text: the struct has padding). */
static int same(const anna_tuning *a, const anna_tuning *b) {
  char x[2048], y[2048];
  tuning_format(a, x, sizeof x);
  tuning_format(b, y, sizeof y);
  return !strcmp(x, y);
}

/* A value for key i other than its default, as text, and the check that it took. */
static const char *other_value(const char *key) {
  static const struct {
    const char *key, *val;
  } v[] = {{"prefix_kv_share", "0"}, {"cuda_moe_deq_mb", "512"}, {"cuda_decode_mmq", "0"},
           {"cuda_kv_quant", "0"}, {"cuda_batch_invariant", "1"}, {"cuda_mmq_split_k", "0"}, {"cuda_mmq_v2", "1"},
           {"cuda_mmq_bf16", "1"},
           {"spec_window_states", "0"}, {"encoder_cpu", "1"}, {"cuda_offload_prefill_stream", "0"}};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
    if (!strcmp(v[i].key, key)) return v[i].val;
  return NULL;
}

/* The keys retired with their variants (bench/RESULTS.md, "Variants retired") and the
 * variables they had replaced. */
static const char *const retired_keys[][2] = {
    {"moe_shared_slot", "ANNA_MOE_SHARED_SLOT"}, {"host_sampling", "ANNA_HOST_SAMPLING"}, {"cuda_gemm", "ANNA_CUDA_GEMM"},
    {"cuda_gemm_tile_mb", "ANNA_CUDA_GEMM_TILE_MB"}, {"cuda_moe", "ANNA_CUDA_MOE"},
    {"cuda_gdn", "ANNA_CUDA_GDN"}, {"cuda_gdn_scan", "ANNA_CUDA_GDN_SCAN"},
    {"cuda_attn", "ANNA_CUDA_ATTN"}, {"cuda_flash", "ANNA_CUDA_FLASH"},
    {"cuda_pdl", "ANNA_CUDA_PDL"}, {"cuda_fuse_norm", "ANNA_CUDA_FUSE_NORM"},
    {"cuda_graph_piece", "ANNA_CUDA_GRAPH_PIECE"}, {"cuda_route_fold", "ANNA_CUDA_ROUTE_FOLD"}};
#define N_RETIRED (sizeof retired_keys / sizeof retired_keys[0])

static void test_defaults_and_format(void) {
  anna_tuning t;
  tuning_defaults(&t);
  CHECK(t.prefix_kv_share == 1, "bool defaults");
  CHECK(t.cuda_moe_deq_mb == 2048, "numeric defaults");
  CHECK(t.cuda_kv_quant == 1 && t.cuda_decode_mmq == 1, "cuda_kv_quant and cuda_decode_mmq are on since their device checks passed");
  char buf[2048];
  size_t n = tuning_format(&t, buf, sizeof buf);
  CHECK(n == strlen(buf), "format length %zu vs %zu", n, strlen(buf));
  CHECK(!strcmp(buf, "prefix_kv_share=1\ncuda_moe_deq_mb=2048\ncuda_decode_mmq=1\ncuda_kv_quant=1\ncuda_batch_invariant=0\ncuda_mmq_split_k=1\ncuda_mmq_v2=0\ncuda_mmq_bf16=0\nspec_window_states=1\nencoder_cpu=0\ncuda_offload_prefill_stream=1\n"), "format text:\n%s", buf);
  /* truncation: snprintf's convention, always terminated */
  char small[10];
  size_t m = tuning_format(&t, small, sizeof small);
  CHECK(m == n && strlen(small) == sizeof small - 1, "truncated format");
  int keys = 0, lines = 0;
  while (tuning_key(keys)) keys++;
  for (const char *p = buf; *p; p++) lines += *p == '\n';
  CHECK(keys == 11 && lines == keys, "%d keys, %d lines", keys, lines);
  for (size_t i = 0; i < N_RETIRED; i++)
    for (int j = 0; j < keys; j++) CHECK(strcmp(tuning_key(j), retired_keys[i][0]), "%s is a key", tuning_key(j));
}

static void test_every_key(void) {
  char err[256], spec[1024] = "", buf[2048], buf2[2048];
  for (int i = 0; tuning_key(i); i++) {
    const char *k = tuning_key(i), *v = other_value(k);
    CHECK(v != NULL, "test has no value for key %s", k);
    if (!v) continue;
    /* one key alone: exactly that line changes */
    anna_tuning d, t;
    tuning_defaults(&d);
    t = d;
    char one[128], line[128];
    snprintf(one, sizeof one, " %s = %s ", k, v);
    int rc = tuning_parse(&t, one, err, sizeof err);
    CHECK(rc == 0, "%s: %s", one, err);
    CHECK(!same(&t, &d), "%s changed nothing", k);
    tuning_format(&t, buf, sizeof buf);
    snprintf(line, sizeof line, "%s=%s\n", k, v);
    CHECK(strstr(buf, line) != NULL, "%s not in\n%s", line, buf);
    size_t l = strlen(spec);
    snprintf(spec + l, sizeof spec - l, "%s%s=%s", l ? "," : "", k, v);
  }
  /* all keys at once; format, parse the text back (newlines separate too): same struct */
  anna_tuning a, b;
  tuning_defaults(&a);
  CHECK(tuning_parse(&a, spec, err, sizeof err) == 0, "%s: %s", spec, err);
  tuning_format(&a, buf, sizeof buf);
  tuning_defaults(&b);
  CHECK(tuning_parse(&b, buf, err, sizeof err) == 0, "reparse: %s", err);
  CHECK(same(&a, &b), "round trip differs");
  tuning_format(&b, buf2, sizeof buf2);
  CHECK(!strcmp(buf, buf2), "round trip text differs");
  anna_tuning t;
  tuning_defaults(&t);
  CHECK(tuning_parse(&t, "cuda_moe_deq_mb=1", err, sizeof err) == 0 && t.cuda_moe_deq_mb == 1, "deq 1");
  CHECK(tuning_parse(&t, "", err, sizeof err) == 0 && tuning_parse(&t, NULL, err, sizeof err) == 0 &&
            tuning_parse(&t, ",, ,", err, sizeof err) == 0,
        "empty specs");
}

static void expect_err(const char *spec, const char *needle) {
  anna_tuning t, d;
  tuning_defaults(&t);
  t.cuda_moe_deq_mb = 16; /* a non-default value that must survive the failed call */
  d = t;
  char err[256] = "";
  int rc = tuning_parse(&t, spec, err, sizeof err);
  CHECK(rc == ANNA_EINVAL, "'%s' accepted (rc %d)", spec, rc);
  CHECK(strstr(err, needle) != NULL, "'%s': message '%s' lacks '%s'", spec, err, needle);
  CHECK(same(&t, &d), "'%s' changed the struct", spec);
}

static void test_errors(void) {
  expect_err("bogus=1", "unknown tuning key 'bogus'");
  expect_err("prefix_kv_share=1,bogus_key=3", "bogus_key");
  expect_err("prefix_kv_share=2", "tuning key 'prefix_kv_share': bad value '2' (have: 0, 1)");
  expect_err("prefix_kv_share=yes", "prefix_kv_share");
  expect_err("cuda_moe_deq_mb=0", "tuning key 'cuda_moe_deq_mb': bad value '0' (an integer in 1..1048576)");
  expect_err("cuda_moe_deq_mb=12x", "cuda_moe_deq_mb");
  expect_err("prefix_kv_share=", "prefix_kv_share");
  expect_err("prefix_kv_share", "expected key=value");
  expect_err("PREFIX_KV_SHARE=0", "unknown tuning key");
  /* every retired key: refused as retired, whatever its old value */
  for (size_t i = 0; i < N_RETIRED; i++) {
    char spec[96], needle[96];
    snprintf(spec, sizeof spec, "prefix_kv_share=0,%s=1", retired_keys[i][0]);
    snprintf(needle, sizeof needle, "tuning key '%s' was retired", retired_keys[i][0]);
    expect_err(spec, needle);
  }
  expect_err("cuda_gemm=bf16x1", "--dtype bf16");
}

static void test_env(void) {
  char err[256] = "";
  anna_tuning t;
  unsetenv("ANNA_TUNING");
  CHECK(tuning_from_env(&t, NULL, err, sizeof err) == 0 && t.prefix_kv_share && t.cuda_moe_deq_mb == 2048,
        "no env: %s", err);
  setenv("ANNA_TUNING", "cuda_moe_deq_mb=64,prefix_kv_share=0", 1);
  CHECK(tuning_from_env(&t, NULL, err, sizeof err) == 0 && t.cuda_moe_deq_mb == 64 && !t.prefix_kv_share, "env: %s",
        err);
  /* the options string comes after the environment: it wins where both set a key */
  CHECK(tuning_from_env(&t, "cuda_moe_deq_mb=128", err, sizeof err) == 0 && t.cuda_moe_deq_mb == 128 &&
            !t.prefix_kv_share,
        "env + override: %s", err);
  setenv("ANNA_TUNING", "cuda_moe_deq_mb=nope", 1);
  int rc = tuning_from_env(&t, NULL, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "ANNA_TUNING") && strstr(err, "cuda_moe_deq_mb"), "bad env: %d %s", rc, err);
  setenv("ANNA_TUNING", "cuda_gemm=split", 1);
  rc = tuning_from_env(&t, NULL, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "ANNA_TUNING") && strstr(err, "'cuda_gemm' was retired"), "retired key: %s",
        err);
  unsetenv("ANNA_TUNING");
  CHECK(tuning_from_env(&t, "nokey=1", err, sizeof err) == ANNA_EINVAL && strstr(err, "nokey"), "bad extra: %s", err);
  /* a replaced variable is refused, naming its key */
  setenv("ANNA_PREFIX_KV_SHARE", "0", 1);
  rc = tuning_from_env(&t, NULL, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "ANNA_PREFIX_KV_SHARE") && strstr(err, "ANNA_TUNING=prefix_kv_share="),
        "replaced: %s", err);
  unsetenv("ANNA_PREFIX_KV_SHARE");
  /* a retired variant's variable is refused as retired */
  for (size_t i = 0; i < N_RETIRED; i++) {
    setenv(retired_keys[i][1], "0", 1);
    rc = tuning_from_env(&t, NULL, err, sizeof err);
    CHECK(rc == ANNA_EINVAL && strstr(err, retired_keys[i][1]) && strstr(err, "retired"), "%s: %s",
          retired_keys[i][1], err);
    unsetenv(retired_keys[i][1]);
  }
}

static void test_registry(void) {
  char err[256] = "";
  CHECK(backend_registry_count() >= 1, "no backends");
  const backend_info *cpu = backend_registry_get(0);
  CHECK(cpu && !strcmp(cpu->name, "cpu") && cpu->available() && cpu->create, "first entry is cpu");
  CHECK(backend_registry_find("cpu") == cpu, "find cpu");
  CHECK(backend_registry_find("tpu") == NULL && backend_registry_get(backend_registry_count()) == NULL, "past the end");
  const backend_info *b = NULL;
  CHECK(backend_registry_pick(NULL, &b, err, sizeof err) == 0 && b == cpu, "NULL is cpu");
  CHECK(backend_registry_pick("cpu", &b, err, sizeof err) == 0 && b == cpu, "cpu");
  CHECK(backend_registry_pick("auto", &b, err, sizeof err) == 0 && b && b->available(), "auto");
  int rc = backend_registry_pick("tpu", &b, err, sizeof err);
  CHECK(rc == ANNA_EUNSUPPORTED, "tpu accepted");
  if (backend_registry_count() == 1)
    CHECK(!strcmp(err, "device 'tpu' is not available in this build (have: cpu)"), "message '%s'", err);
  else
    CHECK(!strcmp(err, "device 'tpu' is not available (have: cpu, cuda, auto)"), "message '%s'", err);
  if (!backend_registry_find("cuda")) {
    rc = backend_registry_pick("cuda", &b, err, sizeof err);
    CHECK(rc == ANNA_EUNSUPPORTED && !strcmp(err, "device 'cuda' is not available in this build (have: cpu)"),
          "cuda in a cpu build: '%s'", err);
  } else if (!backend_registry_find("cuda")->available()) {
    rc = backend_registry_pick("cuda", &b, err, sizeof err);
    CHECK(rc == ANNA_EUNSUPPORTED && !strcmp(err, "device 'cuda': no CUDA device found"), "'%s'", err);
  }
}

/* The public surface on a real model: the options string reaches the context. */
static void test_context(const char *fixtures) {
  char path[1024], err[512] = "";
  snprintf(path, sizeof path, "%s/qwen3", fixtures);
  anna_model *m = NULL;
  if (anna_model_load(&m, path, NULL, err, sizeof err)) {
    printf("  FAIL load %s: %s\n", path, err);
    g_fail++;
    return;
  }
  anna_context_options o = {.n_threads = 2, .n_ctx = 64, .tuning = "prefix_kv_share=0,cuda_moe_deq_mb=512"};
  anna_context *c = NULL;
  int rc = anna_context_create(&c, m, &o, err, sizeof err);
  CHECK(rc == 0, "create: %s", err);
  if (!rc) {
    char buf[2048];
    int n = anna_context_tuning(c, buf, sizeof buf);
    CHECK(n > 0 && strstr(buf, "prefix_kv_share=0\n") && strstr(buf, "cuda_moe_deq_mb=512\n") &&
              !strstr(buf, "moe_shared_slot"),
          "anna_context_tuning:\n%s", buf);
    anna_context_free(c);
  }
  o.tuning = "prefix_kv_share=maybe";
  rc = anna_context_create(&c, m, &o, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "prefix_kv_share"), "bad options string: %d %s", rc, err);
  o.tuning = "moe_shared_slot=0"; /* retired */
  rc = anna_context_create(&c, m, &o, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "retired"), "retired key on a context: %d %s", rc, err);
  o.tuning = NULL;
  o.device = "tpu";
  rc = anna_context_create(&c, m, &o, err, sizeof err);
  CHECK(rc == ANNA_EUNSUPPORTED && strstr(err, "device 'tpu' is not available"), "device: %s", err);
  anna_model_free(m);
  anna_model_options mo = {.tuning = "prefix_kv_share=0"};
  rc = anna_model_load(&m, path, &mo, err, sizeof err);
  CHECK(rc == 0, "load with tuning: %s", err);
  if (!rc) anna_model_free(m);
  mo.tuning = "moe_shared_slot=0";
  rc = anna_model_load(&m, path, &mo, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "moe_shared_slot") && strstr(err, "retired"), "retired model key: %s", err);
}

int main(int argc, char **argv) {
  unsetenv("ANNA_TUNING");
  test_defaults_and_format();
  test_every_key();
  test_errors();
  test_env();
  test_registry();
  if (argc > 1) test_context(argv[1]);
  printf("test_tuning: %d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
