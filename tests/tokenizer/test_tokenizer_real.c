/* test_tokenizer_real: released tokenizers (Qwen2.5, Llama 3.2 tokenizer.json; Gemma 3 and
 * SmolLM2 GGUF vocabularies) against ids from the reference implementations, committed in
 * data/real_expected.json (see data/gen_real_expected.py). The tokenizer files themselves
 * are too large to commit: scripts/fetch_tokenizers.sh puts them in the cache, and this
 * test fails (does not skip) when they are missing. Also measures encode speed. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/error.h"
#include "tok_testutil.h"
#include "tokenizer/tokenizer.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ~1 MB of mixed text built from the test texts, then tokens/s of one encode call. */
static void bench(const tokenizer *tok, const json_t *texts, const char *name, int flags) {
  size_t cap = 1 << 20, n = 0;
  char *buf = malloc(cap + 4096);
  while (n < cap) {
    for (size_t i = 0; i < json_array_size(texts) && n < cap; i++) {
      const json_t *t = json_array_get(texts, i);
      size_t l = json_string_length(t);
      if (l > 4000) continue;
      memcpy(buf + n, json_string_value(t), l);
      n += l;
      buf[n++] = '\n';
    }
  }
  int32_t *ids = NULL;
  size_t nid = 0;
  char err[256];
  double t0 = now_s();
  int rc = tokenizer_encode(tok, buf, n, flags, &ids, &nid, err, sizeof err);
  double dt = now_s() - t0;
  CHECK(rc == 0, "%s bench encode: %s", name, err);
  if (!rc)
    printf("%-9s encode %zu bytes -> %zu tokens: %.3f s, %.0f tokens/s (%.1f MB/s)\n", name, n, nid,
           dt, (double)nid / dt, (double)n / dt / 1e6);
  free(ids);
  free(buf);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  const char *cache = getenv("ANNA_CACHE");
  char base[4096], path[4200], err[256];
  if (cache)
    snprintf(base, sizeof base, "%s/tokenizers", cache);
  else
    snprintf(base, sizeof base, "%s/.cache/anna/tokenizers", getenv("HOME") ? getenv("HOME") : ".");
  json_error_t je;
  json_t *exp = json_load_file(ANNA_TOK_TESTDATA "/real_expected.json", JSON_ALLOW_NUL, &je);
  CHECK(exp != NULL, "cannot read %s: %s", ANNA_TOK_TESTDATA "/real_expected.json", je.text);
  if (!exp) return 1;
  const json_t *texts = json_object_get(exp, "texts");
  const json_t *toks = json_object_get(exp, "tokenizers");
  size_t special_text = (size_t)json_integer_value(json_object_get(exp, "special_text"));
  for (size_t k = 0; k < json_array_size(toks); k++) {
    const json_t *e = json_array_get(toks, k);
    const char *name = json_string_value(json_object_get(e, "name"));
    const char *file = json_string_value(json_object_get(e, "file"));
    const char *pre = json_string_value(json_object_get(e, "pre"));
    int flags = json_is_true(json_object_get(e, "no_parse_special"))
                    ? TOKENIZER_ENCODE_NO_PARSE_SPECIAL
                    : 0;
    snprintf(path, sizeof path, "%s/%s/%s", base, name, file);
    struct stat sb;
    if (stat(path, &sb) != 0) {
      CHECK(0,
            "%s is missing: run scripts/fetch_tokenizers.sh (it fills "
            "${ANNA_CACHE:-$HOME/.cache/anna}/tokenizers)",
            path);
      continue;
    }
    tokenizer *tok = NULL;
    double t0 = now_s();
    if (!strcmp(file, "tokenizer.json")) {
      snprintf(path, sizeof path, "%s/%s", base, name);
      int rc = tokenizer_load_json(&tok, path, err, sizeof err);
      CHECK(rc == 0, "%s: %s", name, err);
    } else {
      tok = tt_vocab_from_dump(path);
    }
    if (!tok) continue;
    printf("%-9s loaded in %.3f s (%d ids)\n", name, now_s() - t0, tokenizer_n_vocab(tok));
    const json_t *cases = json_object_get(e, "cases");
    CHECK(json_array_size(cases) == json_array_size(texts), "%s: case count", name);
    int before = tt_failures;
    tt_check_cases(tok, cases, texts, flags, name);
    /* With special tokens added (bos for Llama 3 / Gemma, nothing for Qwen). */
    const json_t *sp = json_object_get(e, "special_ids");
    const json_t *st = json_array_get(texts, special_text);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenizer_encode(tok, json_string_value(st), json_string_length(st),
                              flags | TOKENIZER_ENCODE_ADD_SPECIAL, &ids, &n, err, sizeof err);
    int same = rc == 0 && n == json_array_size(sp);
    for (size_t i = 0; same && i < n; i++)
      same = ids[i] == (int32_t)json_integer_value(json_array_get(sp, i));
    CHECK(same, "%s: ids with special tokens added differ", name);
    if (!same && !rc) tt_print_ids("got", ids, n);
    free(ids);
    bench(tok, texts, name, flags);
    tokenizer_free(tok);
    /* The same vocabulary through the GGUF-style constructor. */
    if (pre) {
      snprintf(path, sizeof path, "%s/%s/%s", base, name, file);
      tok = tt_vocab_from_hf_json(path, pre);
      if (tok) {
        char label[64];
        snprintf(label, sizeof label, "%s(vocab %s)", name, pre);
        const json_t *vc = json_object_get(e, "vocab_cases");
        tt_check_cases(tok, vc ? vc : cases, texts, flags, label);
        tokenizer_free(tok);
      }
    }
    printf("%-9s %s\n", name, tt_failures == before ? "ok" : "FAILED");
  }
  json_decref(exp);
  printf("%d passed, %d failed\n", tt_checks - tt_failures, tt_failures);
  return tt_failures ? 1 : 0;
}
