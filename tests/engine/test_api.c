/* test_api.c: the public API (include/anna/anna.h) as the command-line tools and the server
 * use it, through anna.h alone: status names, tokenize / detokenize / streaming round trips
 * on the fixture tokenizer, chat rendering against the fixture's transformers renderings,
 * the sampler under its public names, GGUF inspection of a fixture GGUF, and bad inputs
 * (each an error code with a message, never a crash). argv[1]: the shared fixtures folder;
 * ANNA_SOURCE_DIR: the checkout (tests/fixtures/gguf). */
#include "anna/anna.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;
#define CHECK(cond, ...)                                                                                               \
  do {                                                                                                                 \
    g_checks++;                                                                                                        \
    if (!(cond)) {                                                                                                     \
      g_fail++;                                                                                                        \
      printf("  FAIL %s:%d: ", __FILE__, __LINE__);                                                                    \
      printf(__VA_ARGS__);                                                                                             \
      printf("\n");                                                                                                    \
    }                                                                                                                  \
  } while (0)

static char *dump(const json_t *j) { return j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL; }

static void test_status(void) {
  printf("status\n");
  CHECK(ANNA_API_VERSION == 11400, "ANNA_API_VERSION %d", ANNA_API_VERSION); /* 1.14: device-side tail draws and masked candidates (anna_context_sample_tail, anna_context_mask_topk, anna_sampler_sample_candidates_tail); 1.13: tensor_parallel / tp_comm, MTP and draft feeds and batched MTP windows (the server drafters); 1.12: model load progress; 1.11: anna_chat_template_source; 1.10: speculative sampling, adaptive K, draft model; 1.9: ASR chunks, TTS instructions / speed / cloning; 1.8: mmproj, mm_cache_bytes, vision stats, prefix_attach_media; 1.7: anna_sched_options.chunk_align; 1.6: device ordinals, layer_split and stage info; 1.5: MoE expert offload options; video in prompts (1.4 on its branch) */
  CHECK(!strcmp(anna_status_name(ANNA_OK), "ANNA_OK"), "ok");
  CHECK(!strcmp(anna_status_name(ANNA_EINVAL), "ANNA_EINVAL"), "einval");
  CHECK(!strcmp(anna_status_name(ANNA_ENOMEM), "ANNA_ENOMEM"), "enomem");
  CHECK(!strcmp(anna_status_name(ANNA_EIO), "ANNA_EIO"), "eio");
  CHECK(!strcmp(anna_status_name(ANNA_EFORMAT), "ANNA_EFORMAT"), "eformat");
  CHECK(!strcmp(anna_status_name(ANNA_ENOTFOUND), "ANNA_ENOTFOUND"), "enotfound");
  CHECK(!strcmp(anna_status_name(ANNA_EUNSUPPORTED), "ANNA_EUNSUPPORTED"), "eunsupported");
  CHECK(!strcmp(anna_status_name(ANNA_ERANGE), "ANNA_ERANGE"), "erange");
  CHECK(!strcmp(anna_status_name(ANNA_ESTATE), "ANNA_ESTATE"), "estate");
  CHECK(!strcmp(anna_status_name(-1000), "ANNA_E?") && !strcmp(anna_status_name(5), "ANNA_E?"), "unknown");
}

/* Encode cases of fixtures/tokenizer/expected.json (no special tokens added): ids, decoded
 * text, and the streaming detokenizer giving the same text piece by piece. */
static void test_tokenize(const anna_text *t, const json_t *cases) {
  printf("tokenize (%zu cases)\n", json_array_size(cases));
  CHECK(json_array_size(cases) > 0, "no encode cases");
  char err[256];
  anna_text_stream *st = NULL;
  int rc = anna_text_stream_new(&st, t, 0, err, sizeof err);
  CHECK(rc == 0 && st, "stream_new: %s", err);
  size_t i;
  json_t *c;
  json_array_foreach(cases, i, c) {
    const char *text = json_string_value(json_object_get(c, "text"));
    size_t tlen = json_string_length(json_object_get(c, "text"));
    const json_t *want = json_object_get(c, "ids");
    const char *dec = json_string_value(json_object_get(c, "decoded"));
    size_t dlen = json_string_length(json_object_get(c, "decoded")); /* may hold NUL bytes */
    int32_t *ids = NULL;
    size_t n = 0;
    rc = anna_text_tokenize(t, text, tlen, 0, &ids, &n, err, sizeof err);
    CHECK(rc == 0, "case %zu: tokenize: %s", i, err);
    if (rc) continue;
    int same = n == json_array_size(want);
    for (size_t k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, k));
    CHECK(same, "case %zu: ids differ", i);
    char *out = NULL;
    size_t olen = 0;
    rc = anna_text_detokenize(t, ids, n, 0, &out, &olen, err, sizeof err);
    CHECK(rc == 0 && (!dec || (olen == dlen && !memcmp(out, dec, olen))), "case %zu: detokenize", i);
    /* The stream's pieces add up to the same text. */
    if (st && out) {
      char *acc = malloc(olen + 64 * (n + 1) + 1);
      size_t alen = 0, plen = 0;
      for (size_t k = 0; acc && k < n; k++) {
        if (anna_text_stream_feed(st, ids[k], acc + alen, 64, &plen, err, sizeof err)) break;
        alen += plen;
      }
      if (acc && !anna_text_stream_flush(st, acc + alen, 64, &plen, err, sizeof err)) alen += plen;
      CHECK(acc && alen == olen && !memcmp(acc, out, olen), "case %zu: stream text differs", i);
      free(acc);
    }
    /* token_text: each id on its own is what detokenize gives for it. */
    for (size_t k = 0; k < n; k++) {
      char one[256], *ref = NULL;
      size_t l1 = 0, l2 = 0;
      int r1 = anna_text_token_text(t, ids[k], one, sizeof one, &l1, err, sizeof err);
      int r2 = anna_text_detokenize(t, &ids[k], 1, 0, &ref, &l2, err, sizeof err);
      CHECK(r1 == 0 && r2 == 0 && l1 == l2 && !memcmp(one, ref, l1) && one[l1] == '\0', "case %zu: token_text",
            i);
      free(ref);
    }
    free(out);
    free(ids);
  }
  anna_text_stream_free(st);
}

static void test_lookups(const anna_text *t) {
  printf("lookups\n");
  char err[256];
  int32_t V = anna_text_vocab(t);
  CHECK(V > 0, "vocab %d", V);
  int32_t im_end = anna_text_token_id(t, "<|im_end|>");
  CHECK(im_end >= 0, "<|im_end|> id");
  size_t len = 0;
  const char *piece = anna_text_token_piece(t, im_end, &len);
  CHECK(piece && len == 10 && !strcmp(piece, "<|im_end|>"), "piece of <|im_end|>");
  CHECK(anna_text_token_is_special(t, im_end) == 1, "<|im_end|> is special");
  CHECK(anna_text_is_eog(t, im_end) == 1, "<|im_end|> ends a turn");
  size_t n_eog = 0;
  const int32_t *eog = anna_text_eog_ids(t, &n_eog);
  int found = 0;
  for (size_t k = 0; eog && k < n_eog; k++) found |= eog[k] == im_end;
  CHECK(n_eog > 0 && found, "eog list holds <|im_end|>");
  CHECK(anna_text_token_piece(t, -1, &len) == NULL && len == 0, "piece(-1)");
  CHECK(anna_text_token_piece(t, V + 5, NULL) == NULL, "piece(V + 5)");
  CHECK(anna_text_token_id(t, "no such piece \x01") == -1, "token_id of nothing");
  CHECK(anna_text_token_is_special(t, -3) == 0 && anna_text_token_is_special(t, V) == 0, "is_special out of range");
  CHECK(anna_text_bos(t) >= -1 && anna_text_eos(t) >= -1 && anna_text_pad(t) >= -1, "special ids");
  /* Skipping specials drops <|im_end|> from the text. */
  int32_t two[2] = {im_end, anna_text_token_id(t, "a")};
  char *out = NULL;
  size_t olen = 0;
  if (two[1] >= 0) {
    int rc = anna_text_detokenize(t, two, 2, ANNA_DETOKENIZE_SKIP_SPECIAL, &out, &olen, err, sizeof err);
    CHECK(rc == 0 && olen == 1 && out[0] == 'a', "skip special");
    free(out);
  }
  /* Parsing special tokens, or not. */
  int32_t *ids = NULL;
  size_t n = 0;
  int rc = anna_text_tokenize(t, "<|im_end|>", 10, 0, &ids, &n, err, sizeof err);
  CHECK(rc == 0 && n == 1 && ids[0] == im_end, "special text parsed");
  free(ids);
  rc = anna_text_tokenize(t, "<|im_end|>", 10, ANNA_TOKENIZE_NO_PARSE_SPECIAL, &ids, &n, err, sizeof err);
  CHECK(rc == 0 && n > 1, "special text as plain text");
  free(ids);
  /* Bad inputs. */
  int32_t bad = V + 7;
  out = NULL;
  rc = anna_text_detokenize(t, &bad, 1, 0, &out, &olen, err, sizeof err);
  CHECK(rc == ANNA_ERANGE && err[0] && !out, "detokenize a bad id: %d", rc);
  rc = anna_text_tokenize(t, "\xff\xfe", 2, 0, &ids, &n, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && err[0] && n == 0, "invalid UTF-8: %d", rc);
  free(ids);
  char small[2];
  size_t need = 0;
  int32_t hello = anna_text_token_id(t, "Hello");
  if (hello >= 0) {
    rc = anna_text_token_text(t, hello, small, sizeof small, &need, err, sizeof err);
    CHECK(rc == ANNA_ERANGE && need == 5, "token_text into a small buffer: %d need %zu", rc, need);
  }
  rc = anna_text_token_text(t, -1, small, sizeof small, &need, err, sizeof err);
  CHECK(rc == ANNA_ERANGE, "token_text of a bad id");
  anna_text_stream *st = NULL;
  if (!anna_text_stream_new(&st, t, 0, err, sizeof err)) {
    char buf[64];
    size_t pl = 0;
    rc = anna_text_stream_feed(st, bad, buf, sizeof buf, &pl, err, sizeof err);
    CHECK(rc == ANNA_ERANGE, "stream a bad id: %d", rc);
    anna_text_stream_free(st);
  }
}

/* Chat cases of expected.json: rendered by transformers; the model's template through
 * anna_text_template, the folder's through anna_chat_template_load, and anna_text_encode_chat
 * = tokenize(render) for generation prompts. */
static void test_chat(const anna_text *t, const char *dir, const json_t *cases) {
  printf("chat (%zu cases)\n", json_array_size(cases));
  char err[512];
  const anna_chat_template *ct = anna_text_template(t);
  CHECK(ct != NULL, "the fixture has a template");
  anna_chat_template *own = NULL;
  int rc = anna_chat_template_load(&own, dir, err, sizeof err);
  CHECK(rc == 0 && own, "chat_template_load: %s", err);
  if (!ct || !own) return;
  size_t i;
  json_t *c;
  json_array_foreach(cases, i, c) {
    json_t *kw = json_object();
    if (json_object_get(c, "enable_thinking"))
      json_object_set(kw, "enable_thinking", json_object_get(c, "enable_thinking"));
    char *mj = dump(json_object_get(c, "messages")), *tj = dump(json_object_get(c, "tools")), *kj = dump(kw);
    int add_gen = json_is_true(json_object_get(c, "add_generation_prompt"));
    const char *want = json_string_value(json_object_get(c, "rendered"));
    for (int which = 0; which < 2; which++) {
      char *out = NULL;
      size_t n = 0;
      rc = anna_chat_template_render(which ? own : ct, mj, tj, add_gen, kj, &out, &n, err, sizeof err);
      CHECK(rc == 0 && want && n == strlen(want) && !memcmp(out, want, n), "case %zu (%s): %s", i,
            which ? "loaded" : "model", rc ? err : "output differs");
      if (which == 0 && rc == 0 && add_gen) {
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        int r1 = anna_text_encode_chat(t, mj, tj, kj, &a, &na, err, sizeof err);
        int r2 = anna_text_tokenize(t, out, n, 0, &b, &nb, err, sizeof err);
        CHECK(r1 == 0 && r2 == 0 && na == nb && na > 0 && !memcmp(a, b, na * sizeof *a), "case %zu: encode_chat",
              i);
        free(a);
        free(b);
      }
      free(out);
    }
    free(mj);
    free(tj);
    free(kj);
    json_decref(kw);
  }
  /* Bad inputs: not JSON, no messages, a template that raises. */
  char *out = NULL;
  size_t n = 0;
  int32_t *ids = NULL;
  rc = anna_chat_template_render(ct, "[{\"role\": ", NULL, 1, NULL, &out, &n, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && !out && strstr(err, "messages"), "messages not JSON: %d %s", rc, err);
  rc = anna_chat_template_render(ct, "[]", "{", 1, NULL, &out, &n, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "tools"), "tools not JSON: %d %s", rc, err);
  rc = anna_chat_template_render(ct, NULL, NULL, 1, NULL, &out, &n, err, sizeof err);
  CHECK(rc == ANNA_EINVAL, "no messages: %d", rc);
  rc = anna_text_encode_chat(t, "nope", NULL, NULL, &ids, &n, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && !ids && n == 0, "encode_chat of not JSON: %d", rc);
  anna_chat_template_free(own);

  own = NULL;
  const char *src = "{% if x is defined %}{{ raise_exception('x is ' ~ x) }}{% endif %}{{ a }}+{{ b }}";
  rc = anna_chat_template_from_source(&own, src, strlen(src), "<s>", NULL, err, sizeof err);
  CHECK(rc == 0 && own, "from_source: %s", err);
  if (own) {
    rc = anna_chat_template_render_vars(own, "{\"a\": 1, \"b\": \"\\u00e9\"}", &out, &n, err, sizeof err);
    CHECK(rc == 0 && n == 4 && !strcmp(out, "1+\xc3\xa9"), "render_vars: %d %s", rc, rc ? err : out);
    free(out);
    out = NULL;
    rc = anna_chat_template_render_vars(own, "{\"x\": 3}", &out, &n, err, sizeof err);
    CHECK(rc < 0 && !out && strstr(err, "x is 3"), "raise_exception: %d %s", rc, err);
    rc = anna_chat_template_render_vars(own, "{\"a\":", &out, &n, err, sizeof err);
    CHECK(rc == ANNA_EINVAL && strstr(err, "vars"), "vars not JSON: %d", rc);
    anna_chat_template_free(own);
  }
  own = NULL;
  rc = anna_chat_template_from_source(&own, "{% if %}", 8, NULL, NULL, err, sizeof err);
  CHECK(rc < 0 && !own && err[0], "a template that does not parse: %d", rc);
  rc = anna_chat_template_load(&own, "/nonexistent/anna", err, sizeof err);
  CHECK(rc < 0 && !own, "load from nowhere: %d", rc);
}

static void test_prompt(const anna_text *t) {
  printf("prompt\n");
  char err[256];
  int32_t *ids = NULL, *raw = NULL;
  size_t n = 0, nr = 0;
  int rc = anna_text_encode_prompt(t, "Hi there", NULL, 0, 0, &ids, &n, err, sizeof err);
  CHECK(rc == 0 && n > 0, "templated prompt: %s", err);
  rc = anna_text_encode_prompt(t, "Hi there", NULL, 1, 0, &raw, &nr, err, sizeof err);
  CHECK(rc == 0 && nr > 0 && nr < n, "raw prompt: %s", err);
  /* The template wraps the message: the same ids as rendering it by hand. */
  int32_t *chat = NULL;
  size_t nc = 0;
  rc = anna_text_encode_chat(t, "[{\"role\":\"user\",\"content\":\"Hi there\"}]", NULL, NULL, &chat, &nc, err,
                             sizeof err);
  CHECK(rc == 0 && nc == n && !memcmp(chat, ids, n * sizeof *ids), "prompt = encode_chat");
  free(ids);
  free(raw);
  free(chat);
  ids = NULL;
  rc = anna_text_encode_prompt(t, "", NULL, 1, 0, &ids, &n, err, sizeof err);
  CHECK(rc == ANNA_EINVAL ? !ids : (rc == 0 && n > 0), "empty raw prompt: %d", rc);
  free(ids);
}

static void test_open(const char *fixtures, const char *gguf_dir) {
  printf("open\n");
  char path[1024], err[256];
  anna_text *t = NULL;
  int rc = anna_text_open(&t, "/nonexistent/anna-model", 0, err, sizeof err);
  CHECK(rc == ANNA_EIO && !t && err[0], "open nowhere: %d", rc);
  snprintf(path, sizeof path, "%s/tokenizer", fixtures);
  rc = anna_text_open(&t, path, ANNA_TEXT_NO_TEMPLATE, err, sizeof err);
  CHECK(rc == 0 && t && !anna_text_template(t), "no template: %s", err);
  anna_text_free(t);
  anna_text_free(NULL);
  /* A GGUF file carries both sides. */
  t = NULL;
  snprintf(path, sizeof path, "%s/qwen3.gguf", gguf_dir);
  rc = anna_text_open(&t, path, 0, err, sizeof err);
  CHECK(rc == 0 && t && anna_text_vocab(t) > 0 && anna_text_template(t), "gguf text: %s", err);
  if (t) {
    int32_t *ids = NULL;
    size_t n = 0;
    char *out = NULL, *s = "Hello world";
    rc = anna_text_tokenize(t, s, strlen(s), 0, &ids, &n, err, sizeof err);
    if (!rc) rc = anna_text_detokenize(t, ids, n, 0, &out, &n, err, sizeof err);
    CHECK(rc == 0 && out && !strcmp(out, s), "gguf round trip: %s", err);
    free(ids);
    free(out);
  }
  anna_text_free(t);
}

static void test_sampler(void) {
  printf("sampler\n");
  enum { V = 300 };
  char err[256];
  float l[V], row[V];
  for (int i = 0; i < V; i++) l[i] = sinf((float)i * 0.37f) * 3.0f;
  l[123] = 9.0f;
  anna_sampler_params p = anna_sampler_params_default();
  CHECK(p.temperature <= 0 && p.top_p >= 1 && p.repetition_penalty == 1 && p.top_k <= 0, "defaults");
  anna_sampler *s = NULL;
  CHECK(anna_sampler_create(&s, 0, &p, err, sizeof err) == ANNA_EINVAL && !s && err[0], "vocab 0");
  anna_sampler_params bad = p;
  bad.temperature = -1;
  CHECK(anna_sampler_create(&s, V, &bad, err, sizeof err) == ANNA_EINVAL && !s, "negative temperature");
  CHECK(anna_sampler_create(&s, V, &p, err, sizeof err) == 0 && s, "create: %s", err);
  if (!s) return;
  memcpy(row, l, sizeof l);
  CHECK(anna_sampler_sample(s, row) == 123, "greedy = argmax");
  float temp = -1;
  CHECK(anna_sampler_candidates_k(s, &temp) == 1 && temp == 0, "greedy needs 1 candidate");
  int32_t idx = 123, got = -1;
  float val = 9.0f;
  double st[2] = {9.0, 0.0};
  CHECK(anna_sampler_sample_candidates(s, &idx, &val, 1, st, &got) == 0 && got == 123, "greedy from candidates");
  anna_sampler_free(s);
  anna_sampler_free(NULL);
  /* Seeded draws repeat; a repetition penalty steers away from a seen token. */
  anna_sampler_params q = p;
  q.temperature = 1.5f;
  q.seed = 42;
  anna_sampler *a = NULL, *b = NULL;
  anna_sampler_create(&a, V, &q, err, sizeof err);
  anna_sampler_create(&b, V, &q, err, sizeof err);
  int same = a && b;
  for (int k = 0; same && k < 50; k++) {
    float ra[V], rb[V];
    memcpy(ra, l, sizeof l);
    memcpy(rb, l, sizeof l);
    same = anna_sampler_sample(a, ra) == anna_sampler_sample(b, rb);
  }
  CHECK(same, "same seed, same draws");
  CHECK(anna_sampler_candidates_k(a, NULL) == 0, "pure temperature needs the full row");
  anna_sampler_free(a);
  anna_sampler_free(b);
  q = p;
  q.repetition_penalty = 100.0f;
  a = NULL;
  anna_sampler_create(&a, V, &q, err, sizeof err);
  if (a) {
    anna_sampler_accept(a, 123);
    memcpy(row, l, sizeof l);
    CHECK(anna_sampler_sample(a, row) != 123, "penalised token avoided");
    anna_sampler_reset(a);
    memcpy(row, l, sizeof l);
    CHECK(anna_sampler_sample(a, row) == 123, "reset forgets");
    anna_sampler_free(a);
  }
}

/* Issue 29 / 30 through the public API, on the CPU backend: rows of one decode_topk call drawn
 * from candidates, with the tail walked where the rows are kept (anna_context_sample_tail, all
 * pending draws in one call) and masks applied there (anna_context_mask_topk), give the tokens
 * anna_sampler_sample draws from the same rows downloaded whole (anna_context_decode) and,
 * for masked rows, masked on the host. */
static void test_device_sampling(const char *fixtures) {
  printf("sampling where the logits are (issue 29)\n");
  enum { R = 4, K = ANNA_TOPK_MAX };
  char path[1024], err[256] = "";
  snprintf(path, sizeof path, "%s/qwen3", fixtures);
  anna_model *m = NULL;
  anna_context *c = NULL;
  const anna_context_options co = {.n_seq = R, .n_ctx = 64, .n_batch = 32, .n_threads = 2};
  if (anna_model_load(&m, path, NULL, err, sizeof err) || anna_context_create(&c, m, &co, err, sizeof err)) {
    CHECK(0, "load %s: %s", path, err);
    anna_model_free(m);
    return;
  }
  const int V = anna_model_vocab(m);
  const int64_t words = (V + 63) / 64;
  CHECK(anna_context_sample_tail(c, NULL, NULL, 0, NULL, err, sizeof err) == 0, "the CPU backend offers the tail");
  float *ref = malloc(sizeof(float) * (size_t)(R * V)), *row = malloc(sizeof(float) * (size_t)V);
  int32_t *idx = malloc(sizeof(int32_t) * R * K);
  float *val = malloc(sizeof(float) * R * K);
  double st[2 * R];
  uint64_t *bits = calloc((size_t)(2 * words), sizeof(uint64_t));
  anna_sample_tail *tl = calloc(R, sizeof *tl);
  typedef struct {
    float temp, min_p;
  } ps;
  static const ps sets[] = {{1.0f, 0.0f}, {2.5f, 0.0f}, {4.0f, 0.0f}, {3.0f, 0.001f}};
  int diff = 0, tails = 0, draws = 0, mdiff = 0, kept_same = 1;
  for (size_t si = 0; si < sizeof sets / sizeof *sets; si++)
    for (int it = 0; it < 6; it++) {
      int32_t tok[R], seq[R], pos[R];
      int8_t want[R];
      for (int r = 0; r < R; r++) tok[r] = (int32_t)(11 + 97 * r + 31 * it + 7 * (int)si), seq[r] = r, pos[r] = 0, want[r] = 1;
      const anna_batch b = {R, tok, seq, pos, want};
      anna_sampler *full[R], *cand[R];
      for (int r = 0; r < R; r++) {
        anna_sampler_params p = anna_sampler_params_default();
        p.temperature = sets[si].temp, p.min_p = sets[si].min_p, p.seed = (uint64_t)(100 * it + r);
        anna_sampler_create(&full[r], V, &p, NULL, 0);
        anna_sampler_create(&cand[r], V, &p, NULL, 0);
      }
      float temp = 0.0f;
      const int k = anna_sampler_candidates_tail_k(cand[0], &temp);
      int rc = anna_context_decode(c, &b, ref, err, sizeof err);
      for (int r = 0; r < R; r++) anna_context_seq_reset(c, r);
      if (!rc) rc = anna_context_decode_topk(c, &b, k, temp, idx, val, st, err, sizeof err);
      CHECK(rc == 0 && k == K, "decode: %s (k %d)", err, k);
      if (rc) break;
      /* masks on rows 0 and 2: a few ids (row 0) and most of the vocabulary (row 2) */
      memset(bits, 0, sizeof(uint64_t) * (size_t)(2 * words));
      for (int j = 0; j < 3; j++) {
        const int t = (it * 131 + j * 337) % V;
        bits[t / 64] |= 1ull << (t % 64);
      }
      for (int64_t w = 0; w < words; w++) bits[words + w] = ~(0x0101010101010101ull << (w % 8));
      const uint64_t *mk[R] = {it % 2 ? bits : NULL, NULL, it % 2 ? bits + words : NULL, NULL};
      int32_t keep_idx[K];
      memcpy(keep_idx, idx + K, sizeof keep_idx);
      if (it % 2) {
        rc = anna_context_mask_topk(c, mk, R, k, temp, idx, val, st, err, sizeof err);
        CHECK(rc == 0, "mask_topk: %s", err);
        kept_same &= !memcmp(keep_idx, idx + K, sizeof keep_idx); /* an unmasked row untouched */
      }
      int rows[R], n = 0, which[R];
      int32_t got[R], want_tok[R], out[R];
      for (int r = 0; r < R; r++) {
        memcpy(row, ref + (size_t)r * V, sizeof(float) * (size_t)V);
        if (mk[r])
          for (int t = 0; t < V; t++)
            if (mk[r][t / 64] >> (t % 64) & 1) row[t] = -INFINITY;
        want_tok[r] = anna_sampler_sample(full[r], row);
        got[r] = -1;
        const int h = anna_sampler_sample_candidates_tail(cand[r], idx + r * K, val + r * K, K, st + 2 * r, &tl[n],
                                                          &got[r]);
        CHECK(h != 1, "no full row without top-p (set %zu row %d)", si, r);
        if (h == 2) rows[n] = r, which[n++] = r;
      }
      rc = anna_context_sample_tail(c, rows, tl, n, out, err, sizeof err);
      CHECK(rc == 0, "sample_tail: %s", err);
      for (int j = 0; j < n; j++) got[which[j]] = out[j];
      tails += n;
      for (int r = 0; r < R; r++) {
        draws++;
        diff += got[r] != want_tok[r];
        mdiff += mk[r] && got[r] != want_tok[r];
      }
      if (it == 1) { /* the kept rows are the masked ones now */
        rc = anna_context_logits_row(c, 0, row, err, sizeof err);
        int masked_ok = rc == 0;
        for (int t = 0; t < V && masked_ok; t++)
          masked_ok = (bits[t / 64] >> (t % 64) & 1) ? row[t] == -INFINITY : row[t] == ref[t];
        CHECK(masked_ok, "logits_row after mask_topk: the masked row");
        const int bad_row = R;
        CHECK(anna_context_sample_tail(c, &bad_row, tl, 1, out, err, sizeof err) == ANNA_ERANGE,
              "sample_tail: a row the last call did not leave");
      }
      for (int r = 0; r < R; r++) {
        anna_context_seq_reset(c, r);
        anna_sampler_free(full[r]);
        anna_sampler_free(cand[r]);
      }
    }
  CHECK(diff == 0, "candidates + tail == the full-row sampler: %d of %d draws differ (%d masked)", diff, draws, mdiff);
  CHECK(tails > 0, "some draws took the tail (%d of %d)", tails, draws);
  CHECK(kept_same, "mask_topk leaves unmasked rows' candidates");
  printf("  %d of %d draws walked the tail where the logits are\n", tails, draws);
  free(ref), free(row), free(idx), free(val), free(bits), free(tl);
  anna_context_free(c);
  anna_model_free(m);
}

static void test_gguf(const char *gguf_dir, const char *fixtures) {
  printf("gguf\n");
  char path[1024], err[256];
  anna_gguf *g = NULL;
  snprintf(path, sizeof path, "%s/qwen3.gguf", gguf_dir);
  int rc = anna_gguf_open(&g, path, err, sizeof err);
  CHECK(rc == 0 && g, "open %s: %s", path, err);
  if (!g) return;
  CHECK(anna_gguf_version(g) >= 2 && anna_gguf_file_size(g) > anna_gguf_data_offset(g) &&
            anna_gguf_alignment(g) > 0,
        "header");
  int64_t nkv = anna_gguf_kv_count(g);
  CHECK(nkv > 0, "kv count");
  int64_t arch = anna_gguf_kv_find(g, "general.architecture");
  CHECK(arch >= 0 && !strcmp(anna_gguf_kv_key(g, arch), "general.architecture"), "find architecture");
  const char *s = NULL;
  size_t len = 0;
  CHECK(anna_gguf_kv_str(g, arch, &s, &len) == 0 && len == 5 && !strcmp(s, "qwen3"), "architecture value");
  int elem = 0;
  int64_t count = 0;
  CHECK(anna_gguf_kv_type(g, arch, &elem, &count) == ANNA_GGUF_STRING && elem == -1 && count == 1, "string type");
  char txt[64];
  int64_t tl = anna_gguf_kv_text(g, arch, txt, sizeof txt);
  CHECK(tl == 7 && !strcmp(txt, "\"qwen3\""), "architecture text");
  CHECK(anna_gguf_kv_text(g, arch, NULL, 0) == 7, "text length alone");
  CHECK(anna_gguf_kv_text(g, arch, txt, 4) == 7 && !strcmp(txt, "\"qw"), "text truncated");
  int64_t ctx = anna_gguf_kv_find(g, "qwen3.context_length");
  int64_t v = 0;
  double f = 0;
  CHECK(ctx >= 0 && anna_gguf_kv_int(g, ctx, &v) == 0 && v > 0 && anna_gguf_kv_float(g, ctx, &f) == 0 &&
            f == (double)v,
        "context length");
  CHECK(anna_gguf_kv_str(g, ctx, &s, &len) == ANNA_EINVAL, "a number is not a string");
  int64_t toks = anna_gguf_kv_find(g, "tokenizer.ggml.tokens");
  CHECK(toks >= 0 && anna_gguf_kv_type(g, toks, &elem, &count) == ANNA_GGUF_ARRAY && elem == ANNA_GGUF_STRING &&
            count > 8,
        "token array");
  tl = anna_gguf_kv_text(g, toks, NULL, 0);
  char *at = malloc((size_t)tl + 1);
  CHECK(at && anna_gguf_kv_text(g, toks, at, (size_t)tl + 1) == tl && at[0] == '[' && strstr(at, " total)]"),
        "array text");
  free(at);
  CHECK(anna_gguf_kv_find(g, "no.such.key") == -1 && anna_gguf_kv_key(g, nkv) == NULL &&
            anna_gguf_kv_type(g, -1, NULL, NULL) == -1 && anna_gguf_kv_text(g, nkv, txt, sizeof txt) == -1 &&
            anna_gguf_kv_int(g, nkv, &v) == ANNA_ERANGE,
        "keys out of range");
  int64_t nt = anna_gguf_tensor_count(g);
  CHECK(nt > 0, "tensor count");
  int64_t total = 0;
  for (int64_t k = 0; k < nt; k++) {
    anna_gguf_tensor t;
    rc = anna_gguf_tensor_info(g, k, &t);
    int64_t ne = 1;
    for (int d = 0; d < t.ndim; d++) ne *= t.dims[d];
    CHECK(rc == 0 && t.name && t.type_name && t.ndim >= 1 && t.ndim <= ANNA_GGUF_MAX_DIMS && ne == t.n_elements &&
              t.n_bytes > 0 && t.offset + (uint64_t)t.n_bytes <= anna_gguf_file_size(g) - anna_gguf_data_offset(g),
          "tensor %lld", (long long)k);
    total += t.n_bytes;
  }
  CHECK(total > 0, "tensor bytes");
  anna_gguf_tensor t;
  CHECK(anna_gguf_tensor_info(g, nt, &t) == ANNA_ERANGE && anna_gguf_tensor_info(g, -1, &t) == ANNA_ERANGE,
        "tensor out of range");
  CHECK(!strcmp(anna_gguf_type_name(ANNA_GGUF_UINT32), "u32") && !strcmp(anna_gguf_type_name(99), "?"),
        "type names");
  anna_gguf_close(g);
  anna_gguf_close(NULL);
  g = NULL;
  rc = anna_gguf_open(&g, "/nonexistent/x.gguf", err, sizeof err);
  CHECK(rc == ANNA_EIO && !g && err[0], "open nowhere: %d", rc);
  snprintf(path, sizeof path, "%s/qwen3/config.json", fixtures);
  rc = anna_gguf_open(&g, path, err, sizeof err);
  CHECK(rc == ANNA_EFORMAT && !g && err[0], "not a GGUF: %d %s", rc, err);
}

/* The media types are plain borrowed views: build one of each. */
static void test_media(void) {
  printf("media\n");
  uint8_t px[2 * 3 * 3] = {0};
  float pcm[4] = {0, 0.5f, -0.5f, 0};
  anna_image im = {.width = 3, .height = 2, .channels = 3, .row_stride = 9, .pixels = px};
  anna_audio au = {.sample_rate = 16000, .channels = 1, .n_samples = 4, .pcm = pcm};
  CHECK(im.row_stride >= (size_t)im.width * (size_t)im.channels && au.n_samples * au.channels == 4, "media views");
}

/* The expert offload options through anna.h (1.3): bad values are errors naming them, the CPU
 * refuses "experts" and runs "auto" as none, whose counters say off. */
static void test_offload_options(const char *fixtures) {
  printf("offload options\n");
  char path[1024], err[256] = "";
  snprintf(path, sizeof path, "%s/qwen3_moe", fixtures);
  anna_model *m = NULL;
  int rc = anna_model_load(&m, path, NULL, err, sizeof err);
  CHECK(rc == 0, "load %s: %s", path, err);
  if (rc) return;
  anna_context *c = NULL;
  anna_context_options o = {.n_ctx = 64, .n_batch = 8, .offload_mode = "sometimes"};
  rc = anna_context_create(&c, m, &o, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "sometimes"), "offload_mode sometimes: %d %s", rc, err);
  o.offload_mode = "experts";
  rc = anna_context_create(&c, m, &o, err, sizeof err);
  CHECK(rc == ANNA_EUNSUPPORTED && strstr(err, "cpu"), "experts on the cpu: %d %s", rc, err);
  o.offload_mode = "none", o.cached_experts_per_layer = 2;
  rc = anna_context_create(&c, m, &o, err, sizeof err);
  CHECK(rc == ANNA_EINVAL, "a cache size with mode none: %d %s", rc, err);
  o.offload_mode = "auto", o.gpu_memory_limit = -5, o.cached_experts_per_layer = 0;
  rc = anna_context_create(&c, m, &o, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "negative"), "negative limit: %d %s", rc, err);
  o.gpu_memory_limit = (int64_t)8 << 30;
  rc = anna_context_create(&c, m, &o, err, sizeof err);
  CHECK(rc == 0, "auto on the cpu: %d %s", rc, err);
  if (!rc) {
    anna_offload_stats st;
    memset(&st, 0xff, sizeof st);
    anna_context_offload_stats(c, &st);
    CHECK(st.on == 0 && st.routed == 0 && st.summary == NULL, "cpu offload stats not zero");
    anna_context_free(c);
  }
  anna_model_free(m);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_api FIXTURES\n");
    return 2;
  }
  const char *fixtures = argv[1];
  char path[1024], err[256];
  const char *gguf_dir = ANNA_SOURCE_DIR "/tests/fixtures/gguf";
  test_status();
  snprintf(path, sizeof path, "%s/tokenizer/expected.json", fixtures);
  json_error_t je;
  json_t *exp = json_load_file(path, JSON_ALLOW_NUL, &je);
  CHECK(exp != NULL, "cannot read %s: %s", path, je.text);
  snprintf(path, sizeof path, "%s/tokenizer", fixtures);
  anna_text *t = NULL;
  int rc = anna_text_open(&t, path, 0, err, sizeof err);
  CHECK(rc == 0 && t, "open %s: %s", path, err);
  if (t && exp) {
    test_tokenize(t, json_object_get(exp, "encode"));
    test_lookups(t);
    test_chat(t, path, json_object_get(exp, "chat"));
    test_prompt(t);
  }
  anna_text_free(t);
  json_decref(exp);
  test_open(fixtures, gguf_dir);
  test_offload_options(fixtures);
  test_sampler();
  test_device_sampling(fixtures);
  test_gguf(gguf_dir, fixtures);
  test_media();
  printf("%d checks, %d failures\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
