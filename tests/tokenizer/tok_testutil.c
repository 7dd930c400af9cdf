/* tok_testutil.c: see tok_testutil.h. */
#include "tok_testutil.h"

#include <stdlib.h>
#include <string.h>

int tt_failures, tt_checks;

void tt_print_ids(const char *what, const int32_t *ids, size_t n) {
  fprintf(stderr, "  %s:", what);
  for (size_t i = 0; i < n; i++)
    fprintf(stderr, " %d", ids[i]);
  fprintf(stderr, "\n");
}

/* Encodes every expected.json case with tok and compares ids, decode and stream decode. */
void tt_check_cases(const tokenizer *tok, const json_t *cases, const json_t *texts, int flags,
                    const char *label) {
  char err[256];
  for (size_t i = 0; i < json_array_size(cases); i++) {
    const json_t *c = json_array_get(cases, i);
    const json_t *tj = texts ? json_array_get(texts, i) : json_object_get(c, "text");
    const char *text = json_string_value(tj);
    size_t tlen = json_string_length(tj);
    const json_t *exp = json_object_get(c, "ids");
    const json_t *dec = json_object_get(c, "decoded");
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenizer_encode(tok, text, tlen, flags, &ids, &n, err, sizeof err);
    CHECK(rc == 0, "%s case %zu: encode failed: %s", label, i, err);
    if (rc) continue;
    int same = n == json_array_size(exp);
    for (size_t k = 0; same && k < n; k++)
      same = ids[k] == (int32_t)json_integer_value(json_array_get(exp, k));
    CHECK(same, "%s case %zu (%.40s): ids differ", label, i, text);
    if (!same) {
      tt_print_ids("got", ids, n);
      fprintf(stderr, "  want:");
      for (size_t k = 0; k < json_array_size(exp); k++)
        fprintf(stderr, " %d", (int)json_integer_value(json_array_get(exp, k)));
      fprintf(stderr, "\n");
    }
    if (json_is_string(dec)) {
      char *out = NULL;
      size_t olen = 0;
      rc = tokenizer_decode(tok, ids, n, 0, &out, &olen, err, sizeof err);
      CHECK(rc == 0 && olen == json_string_length(dec) &&
                memcmp(out, json_string_value(dec), olen) == 0,
            "%s case %zu: decoded \"%s\" want \"%s\"", label, i, out ? out : "(null)",
            json_string_value(dec));
      /* The stream must give the same bytes, and each piece must be whole UTF-8. */
      tokenizer_stream *s = NULL;
      rc = tokenizer_stream_new(&s, tok, 0, err, sizeof err);
      CHECK(rc == 0, "stream_new: %s", err);
      char acc[4096];
      size_t alen = 0;
      int whole = 1;
      for (size_t k = 0; s && k <= n; k++) {
        char piece[256];
        size_t pl = 0;
        rc = k < n ? tokenizer_stream_feed(s, ids[k], piece, sizeof piece, &pl, err, sizeof err)
                   : tokenizer_stream_flush(s, piece, sizeof piece, &pl, err, sizeof err);
        CHECK(rc == 0, "stream feed: %s", err);
        if (pl && ((unsigned char)piece[0] & 0xc0) == 0x80) whole = 0;
        if (alen + pl < sizeof acc) {
          memcpy(acc + alen, piece, pl);
          alen += pl;
        }
      }
      CHECK(whole, "%s case %zu: stream emitted a split character", label, i);
      CHECK(alen == olen && out && memcmp(acc, out, olen) == 0,
            "%s case %zu: stream output differs from decode", label, i);
      tokenizer_stream_free(s);
      free(out);
    }
    free(ids);
  }
}

/* Builds a vocab description out of a byte-level tokenizer.json (what a GGUF converter
 * writes) so both constructors can be checked against the same expected ids. */
tokenizer *tt_vocab_from_hf_json(const char *path, const char *pre) {
  json_error_t je;
  json_t *root = json_load_file(path, JSON_ALLOW_NUL, &je);
  if (!root) return NULL;
  const json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
  const json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
  const json_t *added = json_object_get(root, "added_tokens");
  size_t nv = 0;
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)vocab, key, val) if ((size_t)json_integer_value(val) + 1 > nv) nv =
      (size_t)json_integer_value(val) + 1;
  for (size_t i = 0; i < json_array_size(added); i++) {
    size_t id = (size_t)json_integer_value(json_object_get(json_array_get(added, i), "id"));
    if (id + 1 > nv) nv = id + 1;
  }
  const char **toks = calloc(nv, sizeof *toks);
  int32_t *types = calloc(nv, sizeof *types);
  json_object_foreach((json_t *)vocab, key, val) {
    toks[json_integer_value(val)] = key;
    types[json_integer_value(val)] = TOKENIZER_TOKEN_NORMAL;
  }
  for (size_t i = 0; i < json_array_size(added); i++) {
    const json_t *a = json_array_get(added, i);
    size_t id = (size_t)json_integer_value(json_object_get(a, "id"));
    toks[id] = json_string_value(json_object_get(a, "content"));
    types[id] = json_is_true(json_object_get(a, "special")) ? TOKENIZER_TOKEN_CONTROL
                                                            : TOKENIZER_TOKEN_USER_DEFINED;
  }
  size_t nm = json_array_size(merges);
  char **ms = calloc(nm, sizeof *ms);
  for (size_t i = 0; i < nm; i++) {
    const json_t *m = json_array_get(merges, i);
    if (json_is_string(m)) {
      ms[i] = strdup(json_string_value(m));
    } else {
      const char *a = json_string_value(json_array_get(m, 0));
      const char *b = json_string_value(json_array_get(m, 1));
      ms[i] = malloc(strlen(a) + strlen(b) + 2);
      sprintf(ms[i], "%s %s", a, b);
    }
  }
  tokenizer_vocab_desc d;
  tokenizer_vocab_desc_init(&d);
  d.model = "gpt2";
  d.pre = pre;
  d.n_tokens = nv;
  d.tokens = toks;
  d.token_types = types;
  d.n_merges = nm;
  d.merges = (const char *const *)ms;
  d.eos_id = 2;
  tokenizer *tok = NULL;
  char err[256];
  int rc = tokenizer_create_from_vocab(&tok, &d, err, sizeof err);
  CHECK(rc == 0, "create_from_vocab: %s", err);
  for (size_t i = 0; i < nm; i++)
    free(ms[i]);
  free(ms);
  free(toks);
  free(types);
  json_decref(root);
  return tok;
}

tokenizer *tt_vocab_from_dump(const char *path) {
  json_error_t je;
  json_t *v = json_load_file(path, JSON_ALLOW_NUL, &je);
  if (!v) {
    fprintf(stderr, "  %s: %s\n", path, je.text);
    return NULL;
  }
  const json_t *toks = json_object_get(v, "tokens"), *scores = json_object_get(v, "scores");
  const json_t *types = json_object_get(v, "token_type"), *merges = json_object_get(v, "merges");
  size_t n = json_array_size(toks), nm = json_array_size(merges);
  const char **tp = calloc(n, sizeof *tp);
  size_t *tl = calloc(n, sizeof *tl);
  float *sc = scores ? calloc(n, sizeof *sc) : NULL;
  int32_t *ty = calloc(n, sizeof *ty);
  const char **mp = calloc(nm + 1, sizeof *mp);
  for (size_t i = 0; i < n; i++) {
    tp[i] = json_string_value(json_array_get(toks, i));
    tl[i] = json_string_length(json_array_get(toks, i));
    if (sc) sc[i] = (float)json_number_value(json_array_get(scores, i));
    ty[i] = (int32_t)json_integer_value(json_array_get(types, i));
  }
  for (size_t i = 0; i < nm; i++)
    mp[i] = json_string_value(json_array_get(merges, i));
  tokenizer_vocab_desc d;
  tokenizer_vocab_desc_init(&d);
  d.model = json_string_value(json_object_get(v, "model"));
  d.pre = json_string_value(json_object_get(v, "pre"));
  d.n_tokens = n;
  d.tokens = tp;
  d.token_lens = tl;
  d.scores = sc;
  d.token_types = ty;
  d.n_merges = nm;
  d.merges = mp;
  const json_t *x;
  if ((x = json_object_get(v, "bos_token_id"))) d.bos_id = (int32_t)json_integer_value(x);
  if ((x = json_object_get(v, "eos_token_id"))) d.eos_id = (int32_t)json_integer_value(x);
  if ((x = json_object_get(v, "padding_token_id"))) d.pad_id = (int32_t)json_integer_value(x);
  if ((x = json_object_get(v, "unknown_token_id"))) d.unk_id = (int32_t)json_integer_value(x);
  if ((x = json_object_get(v, "add_bos_token"))) d.add_bos = json_is_true(x);
  if ((x = json_object_get(v, "add_eos_token"))) d.add_eos = json_is_true(x);
  if ((x = json_object_get(v, "add_space_prefix"))) d.add_space_prefix = json_is_true(x);
  tokenizer *tok = NULL;
  char err[256];
  int rc = tokenizer_create_from_vocab(&tok, &d, err, sizeof err);
  CHECK(rc == 0, "create_from_vocab(%s): %s", path, err);
  free(tp);
  free(tl);
  free(sc);
  free(ty);
  free(mp);
  json_decref(v);
  return tok;
}
