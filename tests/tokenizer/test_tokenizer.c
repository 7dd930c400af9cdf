/* test_tokenizer: the fixture tokenizer (encode ids + decoded text for every case of
 * fixtures/tokenizer/expected.json, through tokenizer.json and through the GGUF-style vocab
 * description), the streaming decoder, a hand-made SentencePiece vocabulary, lookups, and
 * malformed tokenizer.json inputs (each must fail with a message, never crash). */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tok_testutil.h"
#include "tokenizer/tokenizer.h"

static void test_fixture(const char *fixtures) {
  char path[4096], err[256];
  snprintf(path, sizeof path, "%s/tokenizer/expected.json", fixtures);
  json_error_t je;
  json_t *exp = json_load_file(path, JSON_ALLOW_NUL, &je);
  CHECK(exp != NULL, "cannot read %s: %s", path, je.text);
  if (!exp) return;
  const json_t *cases = json_object_get(exp, "encode");
  CHECK(json_array_size(cases) > 0, "no encode cases");

  snprintf(path, sizeof path, "%s/tokenizer", fixtures);
  tokenizer *tok = NULL;
  int rc = tokenizer_load_json(&tok, path, err, sizeof err);
  CHECK(rc == 0, "load %s: %s", path, err);
  if (!rc) {
    tt_check_cases(tok, cases, NULL, 0, "json");
    CHECK(tokenizer_token_id(tok, "<|im_end|>") == 2, "im_end id");
    CHECK(tokenizer_eos_id(tok) == 2, "eos from tokenizer_config: %d", tokenizer_eos_id(tok));
    CHECK(tokenizer_pad_id(tok) == 0, "pad id");
    CHECK(tokenizer_is_eog(tok, 2) && tokenizer_is_eog(tok, 0), "eog list");
    size_t na = 0;
    const tokenizer_added_token *at = tokenizer_added_tokens(tok, &na);
    CHECK(na == 10 && at[1].id == 1 && at[1].special && strcmp(at[1].content, "<|im_start|>") == 0,
          "added tokens list");
    size_t l = 0;
    CHECK(tokenizer_token_str(tok, 1, &l) && l == 12, "token_str");
    CHECK(tokenizer_token_str(tok, 1000000, &l) == NULL, "token_str out of range");
    /* NO_PARSE_SPECIAL: the special text is tokenized as plain text. */
    int32_t *ids;
    size_t n;
    rc = tokenizer_encode(tok, "<|im_end|>", 10, TOKENIZER_ENCODE_NO_PARSE_SPECIAL, &ids, &n, err,
                          sizeof err);
    CHECK(rc == 0 && n > 1, "no-parse-special gave %zu ids", n);
    free(ids);
    rc = tokenizer_encode(tok, "a\xff", 2, 0, &ids, &n, err, sizeof err);
    CHECK(rc == ANNA_EINVAL, "invalid UTF-8 must be rejected");
    int32_t bad[] = {5, 99999};
    char *txt;
    size_t tl;
    rc = tokenizer_decode(tok, bad, 2, 0, &txt, &tl, err, sizeof err);
    CHECK(rc == ANNA_ERANGE, "decode of bad id must fail");
    /* A truncated character decodes to one U+FFFD; the stream holds it back until it is
     * known to be broken, and refuses a too-small buffer without losing bytes. */
    int32_t trunc[] = {170, 131, 81}; /* E4 BD (2 of 3 bytes of a CJK char), then 'h' */
    rc = tokenizer_decode(tok, trunc, 3, 0, &txt, &tl, err, sizeof err);
    CHECK(rc == 0 && strcmp(txt, "\xef\xbf\xbdh") == 0, "decode truncated (HF gives U+FFFD h)");
    if (!rc) free(txt);
    tokenizer_stream *st = NULL;
    if (tokenizer_stream_new(&st, tok, 0, err, sizeof err) == 0) {
      char o[8];
      size_t ol = 0;
      int32_t hello[] = {49, 357};
      rc = tokenizer_stream_feed(st, hello[0], o, 0, &ol, err, sizeof err);
      CHECK(rc == ANNA_ERANGE, "stream with cap 0 must refuse");
      rc = tokenizer_stream_feed(st, hello[1], o, sizeof o, &ol, err, sizeof err);
      size_t want_len = 0;
      const char *p0 = tokenizer_token_str(tok, 49, &want_len);
      CHECK(rc == 0 && ol >= 1 && p0 && o[0] == p0[0], "stream kept the refused bytes");
      tokenizer_stream_free(st);
    }
    int32_t sp[] = {1, 81, 2};
    rc = tokenizer_decode(tok, sp, 3, TOKENIZER_DECODE_SKIP_SPECIAL, &txt, &tl, err, sizeof err);
    CHECK(rc == 0 && tl == 1, "skip special");
    if (!rc) free(txt);
    tokenizer_free(tok);
  }

  snprintf(path, sizeof path, "%s/tokenizer/tokenizer.json", fixtures);
  tok = tt_vocab_from_hf_json(path, "qwen2");
  if (tok) {
    tt_check_cases(tok, cases, NULL, 0, "vocab-desc");
    CHECK(tokenizer_eos_id(tok) == 2, "desc eos");
    tokenizer_free(tok);
  }
  /* The other GGUF pre-types build and encode (their ids are checked in test_tokenizer_real
   * where a real vocabulary of that kind exists). */
  static const char *const pres[] = {"qwen35", "llama-bpe", "smollm", "default", "gpt2"};
  for (size_t p = 0; p < sizeof pres / sizeof *pres; p++) {
    tok = tt_vocab_from_hf_json(path, pres[p]);
    CHECK(tok != NULL, "pre %s", pres[p]);
    if (!tok) continue;
    int32_t *ids = NULL;
    size_t n = 0;
    const char *s = "Hello  world 123 e\xcc\x81 \xf0\x9f\x8f\xb3\xef\xb8\x8f x";
    int erc = tokenizer_encode(tok, s, strlen(s), 0, &ids, &n, err, sizeof err);
    char *out = NULL;
    size_t ol = 0;
    if (!erc) erc = tokenizer_decode(tok, ids, n, 0, &out, &ol, err, sizeof err);
    CHECK(erc == 0 && n > 0, "pre %s encode: %s", pres[p], err);
    /* Without NFC (all but qwen*), byte-level BPE round-trips exactly. */
    if (!erc && p > 0)
      CHECK(ol == strlen(s) && memcmp(out, s, ol) == 0, "pre %s round trip", pres[p]);
    free(ids);
    free(out);
    tokenizer_free(tok);
  }
  json_decref(exp);
}

/* A tiny SentencePiece vocabulary: merges come from scores, unknown chars fall back to
 * <0xNN> bytes, a space prefix is added, specials are matched. */
static void test_spm(void) {
  const char *toks[300];
  float scores[300];
  int32_t types[300];
  char bytes[256][7];
  int n = 0;
  toks[n] = "<unk>", scores[n] = 0, types[n++] = TOKENIZER_TOKEN_UNKNOWN;
  toks[n] = "<s>", scores[n] = 0, types[n++] = TOKENIZER_TOKEN_CONTROL;
  toks[n] = "</s>", scores[n] = 0, types[n++] = TOKENIZER_TOKEN_CONTROL;
  for (int b = 0; b < 256; b++) {
    snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
    toks[n] = bytes[b], scores[n] = 0, types[n++] = TOKENIZER_TOKEN_BYTE;
  }
  const char *pieces[] = {"\xe2\x96\x81",
                          "h",
                          "e",
                          "l",
                          "o",
                          "w",
                          "r",
                          "d",
                          "he",
                          "ll",
                          "hell",
                          "hello",
                          "\xe2\x96\x81hello",
                          "wo",
                          "rl",
                          "\xe2\x96\x81w"};
  float sc[] = {-1, -2, -2, -2, -2, -2, -2, -2, -3, -4, -5, -6, -7, -8, -9, -10};
  int first = n;
  for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++)
    toks[n] = pieces[i], scores[n] = sc[i], types[n++] = TOKENIZER_TOKEN_NORMAL;
  tokenizer_vocab_desc d;
  tokenizer_vocab_desc_init(&d);
  d.model = "llama";
  d.n_tokens = (size_t)n;
  d.tokens = toks;
  d.scores = scores;
  d.token_types = types;
  d.bos_id = 1;
  d.eos_id = 2;
  d.unk_id = 0;
  tokenizer *tok = NULL;
  char err[256];
  int rc = tokenizer_create_from_vocab(&tok, &d, err, sizeof err);
  CHECK(rc == 0, "spm create: %s", err);
  if (rc) return;
  int32_t *ids;
  size_t cnt;
  const char *text = "hello world\xc3\xa9</s>";
  rc = tokenizer_encode(tok, text, strlen(text), TOKENIZER_ENCODE_ADD_SPECIAL, &ids, &cnt, err,
                        sizeof err);
  /* <s> ▁hello ▁ wo rl d <0xC3> <0xA9> </s>: "wo" (-8) outscores "▁w" (-10) */
  int32_t want[] = {1,         first + 12, first + 0, first + 13, first + 14,
                    first + 7, 3 + 0xc3,   3 + 0xa9,  2};
  int same = rc == 0 && cnt == sizeof want / sizeof *want;
  for (size_t i = 0; same && i < cnt; i++)
    same = ids[i] == want[i];
  CHECK(same, "spm encode");
  if (!same && rc == 0) tt_print_ids("got", ids, cnt);
  char *out;
  size_t ol;
  rc = tokenizer_decode(tok, ids, cnt, TOKENIZER_DECODE_SKIP_SPECIAL, &out, &ol, err, sizeof err);
  CHECK(rc == 0 && strcmp(out, "hello world\xc3\xa9") == 0, "spm decode: \"%s\"", rc ? err : out);
  if (!rc) free(out);
  free(ids);
  tokenizer_free(tok);

  d.model = "bert";
  rc = tokenizer_create_from_vocab(&tok, &d, err, sizeof err);
  CHECK(rc == ANNA_EUNSUPPORTED, "unknown model kind must be refused");
  d.model = "gpt2";
  d.pre = "no-such-pre";
  rc = tokenizer_create_from_vocab(&tok, &d, err, sizeof err);
  CHECK(rc == ANNA_EUNSUPPORTED, "unknown pre must be refused");
  d.model = "llama";
  d.scores = NULL;
  rc = tokenizer_create_from_vocab(&tok, &d, err, sizeof err);
  CHECK(rc == ANNA_EFORMAT, "llama without scores must be refused");
  d.scores = scores;
  toks[5] = NULL;
  rc = tokenizer_create_from_vocab(&tok, &d, err, sizeof err);
  CHECK(rc == ANNA_EFORMAT, "NULL token must be refused");
  toks[5] = bytes[2];
  d.n_tokens = 0;
  rc = tokenizer_create_from_vocab(&tok, &d, err, sizeof err);
  CHECK(rc == ANNA_EFORMAT, "empty vocab must be refused");
  d.n_tokens = (size_t)n;
  d.model = "gpt2";
  const char *bad_merge[] = {"h zz"};
  d.pre = "gpt2";
  d.merges = bad_merge;
  d.n_merges = 1;
  rc = tokenizer_create_from_vocab(&tok, &d, err, sizeof err);
  CHECK(rc == ANNA_EFORMAT, "bad merge must be refused");
}

static void test_malformed(const char *fixtures) {
  char path[4096], err[256];
  snprintf(path, sizeof path, "%s/tokenizer/tokenizer.json", fixtures);
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL, "open %s", path);
  if (!f) return;
  static char good[1 << 20];
  size_t n = fread(good, 1, sizeof good - 1, f);
  fclose(f);
  tokenizer *tok = NULL;
  /* Truncated at many points. */
  for (size_t cut = 0; cut < n; cut += n / 37 + 1) {
    int rc = tokenizer_load_json_text(&tok, good, cut, err, sizeof err);
    CHECK(rc < 0 && tok == NULL && err[0], "truncated at %zu must fail", cut);
    tokenizer_free(tok);
    tok = NULL;
  }
  static const char *bad[] = {
      "[]",
      "{\"model\": 3}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": [1,2], \"merges\": []}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999999}, \"merges\": []}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -4}, \"merges\": []}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"ab\"]}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\"]]}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": "
      "[\"a b\"]}}",
      "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
      "\"added_tokens\": [{\"id\": 123456789012, \"content\": \"x\"}]}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
      "\"added_tokens\": [{\"id\": 1}]}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
      "\"normalizer\": {\"type\": \"Precompiled\"}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
      "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
      "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": 7}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
      "\"decoder\": {\"type\": \"CTC\"}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
      "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
      "[{\"SpecialToken\": {\"id\": \"<s>\"}}], \"special_tokens\": {}}}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    err[0] = 0;
    int rc = tokenizer_load_json_text(&tok, bad[i], strlen(bad[i]), err, sizeof err);
    int want_ok = i == 10; /* the one valid file in the list */
    if (want_ok) {
      CHECK(rc == 0, "bad[%zu] should load: %s", i, err);
    } else {
      CHECK(rc < 0 && tok == NULL && err[0], "bad[%zu] must fail with a message", i);
      if (getenv("ANNA_TEST_VERBOSE")) fprintf(stderr, "  bad[%zu]: %s\n", i, err);
    }
    tokenizer_free(tok);
    tok = NULL;
  }
  int rc = tokenizer_load_json(&tok, "/nonexistent/dir", err, sizeof err);
  CHECK(rc == ANNA_EIO, "missing file");
}

/* Concurrent encodes on one tokenizer must agree with a single-threaded run. */
typedef struct thread_arg {
  const tokenizer *tok;
  const char *text;
  size_t len;
  const int32_t *want;
  size_t nwant;
  int bad;
} thread_arg;

static void *encode_loop(void *p) {
  thread_arg *a = p;
  char err[128];
  for (int it = 0; it < 40; it++) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokenizer_encode(a->tok, a->text, a->len, 0, &ids, &n, err, sizeof err) || n != a->nwant ||
        memcmp(ids, a->want, n * sizeof *ids) != 0)
      a->bad++;
    free(ids);
  }
  return NULL;
}

static void test_threads(const char *fixtures) {
  char path[4096], err[256];
  snprintf(path, sizeof path, "%s/tokenizer", fixtures);
  tokenizer *tok = NULL;
  if (tokenizer_load_json(&tok, path, err, sizeof err)) return;
  static const char text[] =
      "Hello world! 你好 😀 line1\r\n  x = 12345 <|im_start|>user\nhi<|im_end|> "
      "café naïve   trailing   ";
  int32_t *want = NULL;
  size_t nwant = 0;
  int rc = tokenizer_encode(tok, text, sizeof text - 1, 0, &want, &nwant, err, sizeof err);
  CHECK(rc == 0, "threads: %s", err);
  pthread_t th[4];
  thread_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (thread_arg){tok, text, sizeof text - 1, want, nwant, 0};
    pthread_create(&th[i], NULL, encode_loop, &args[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK(args[i].bad == 0, "thread %d got different ids", i);
  }
  free(want);
  tokenizer_free(tok);
}

/* Random valid UTF-8 (and ASCII round trips): no crash, decode(encode(x)) == x for ASCII. */
static void test_random(const char *fixtures) {
  char path[4096], err[256];
  snprintf(path, sizeof path, "%s/tokenizer", fixtures);
  tokenizer *tok = NULL;
  if (tokenizer_load_json(&tok, path, err, sizeof err)) return;
  unsigned seed = 12345;
  int ok = 1;
  for (int it = 0; it < 300 && ok; it++) {
    char buf[512];
    size_t n = 0;
    int ascii = it % 2;
    while (n < 400) {
      seed = seed * 1103515245u + 12345u;
      unsigned r = seed >> 8;
      unsigned cp = ascii ? 1 + r % 127 : (r % 4 == 0 ? 1 + r % 127 : r % 0x2ffff);
      if (cp == 0 || (cp >= 0xd800 && cp < 0xe000)) continue;
      if (cp < 0x80)
        buf[n++] = (char)cp;
      else if (cp < 0x800)
        buf[n++] = (char)(0xc0 | cp >> 6), buf[n++] = (char)(0x80 | (cp & 63));
      else if (cp < 0x10000)
        buf[n++] = (char)(0xe0 | cp >> 12), buf[n++] = (char)(0x80 | ((cp >> 6) & 63)),
        buf[n++] = (char)(0x80 | (cp & 63));
      else
        buf[n++] = (char)(0xf0 | cp >> 18), buf[n++] = (char)(0x80 | ((cp >> 12) & 63)),
        buf[n++] = (char)(0x80 | ((cp >> 6) & 63)), buf[n++] = (char)(0x80 | (cp & 63));
    }
    int32_t *ids = NULL;
    size_t nid = 0;
    char *out = NULL;
    size_t olen = 0;
    ok = tokenizer_encode(tok, buf, n, 0, &ids, &nid, err, sizeof err) == 0 &&
         tokenizer_decode(tok, ids, nid, 0, &out, &olen, err, sizeof err) == 0;
    if (ok && ascii) ok = olen == n && memcmp(out, buf, n) == 0;
    free(ids);
    free(out);
  }
  CHECK(ok, "random text round trip: %s", err);
  tokenizer_free(tok);
}

/* SentencePiece-style tokenizer.json files (Llama-2 legacy normalizer + Strip decoder, and
 * Metaspace), made by data/gen_spm_json.py, against HF tokenizers' ids. */
static void test_spm_json(void) {
  json_error_t je;
  json_t *exp = json_load_file(ANNA_TOK_TESTDATA "/spm_expected.json", 0, &je);
  CHECK(exp != NULL, "spm_expected.json: %s", je.text);
  if (!exp) return;
  const json_t *texts = json_object_get(exp, "texts"), *toks = json_object_get(exp, "tokenizers");
  for (size_t k = 0; k < json_array_size(toks); k++) {
    const json_t *e = json_array_get(toks, k);
    const char *name = json_string_value(json_object_get(e, "name"));
    char path[4096], err[256];
    snprintf(path, sizeof path, "%s/%s", ANNA_TOK_TESTDATA, name);
    tokenizer *tok = NULL;
    int rc = tokenizer_load_json(&tok, path, err, sizeof err);
    CHECK(rc == 0, "%s: %s", name, err);
    if (rc) continue;
    tt_check_cases(tok, json_object_get(e, "cases"), texts, 0, name);
    const json_t *sp = json_object_get(e, "special_ids");
    const json_t *t0 = json_array_get(texts, 0);
    int32_t *ids = NULL;
    size_t n = 0;
    rc = tokenizer_encode(tok, json_string_value(t0), json_string_length(t0),
                          TOKENIZER_ENCODE_ADD_SPECIAL, &ids, &n, err, sizeof err);
    int same = rc == 0 && n == json_array_size(sp);
    for (size_t i = 0; same && i < n; i++)
      same = ids[i] == (int32_t)json_integer_value(json_array_get(sp, i));
    CHECK(same, "%s: add-special ids", name);
    CHECK(tokenizer_bos_id(tok) == 1, "%s: bos from the template", name);
    free(ids);
    tokenizer_free(tok);
  }
  json_decref(exp);
}

int main(int argc, char **argv) {
  const char *fixtures = argc > 1 ? argv[1] : "../shared/fixtures";
  test_fixture(fixtures);
  test_spm();
  test_spm_json();
  test_threads(fixtures);
  test_random(fixtures);
  test_malformed(fixtures);
  printf("%d passed, %d failed\n", tt_checks - tt_failures, tt_failures);
  return tt_failures ? 1 : 0;
}
