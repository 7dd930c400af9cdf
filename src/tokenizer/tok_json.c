/* tok_json.c: builds a tokenizer from a Hugging Face tokenizer.json (plus, from the same
 * folder, tokenizer_config.json for bos/eos/pad/unk and generation_config.json for the
 * end-of-generation ids). Every value read from the files is type- and range-checked; a
 * section kind this runtime does not implement is reported by name. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "tokenizer/tok_internal.h"

static int get_bool(const json_t *o, const char *key, int def) {
  const json_t *v = json_object_get(o, key);
  if (json_is_boolean(v)) return json_is_true(v);
  return def;
}

/* A string field, or NULL when absent / not a string. */
static const char *get_str(const json_t *o, const char *key, size_t *len) {
  const json_t *v = json_object_get(o, key);
  if (!json_is_string(v)) return NULL;
  if (len) *len = json_string_length(v);
  return json_string_value(v);
}

static int dup_str(char **dst, size_t *dlen, const char *s, size_t n) {
  *dst = malloc(n + 1);
  if (!*dst) return ANNA_ENOMEM;
  memcpy(*dst, s, n);
  (*dst)[n] = 0;
  *dlen = n;
  return 0;
}

/* pattern: {"String": "..."} or {"Regex": "..."}. */
static int parse_pattern(tok_step *st, const json_t *pat, const char *where, char *err,
                         size_t errlen) {
  const json_t *s = json_object_get(pat, "String");
  const json_t *r = json_object_get(pat, "Regex");
  if (json_is_string(s))
    return dup_str(&st->lit, &st->lit_len, json_string_value(s), json_string_length(s))
               ? anna_err(err, errlen, ANNA_ENOMEM, "out of memory")
               : 0;
  if (json_is_string(r)) {
    int rc = tok_regex_compile(&st->re, json_string_value(r), json_string_length(r), err, errlen);
    return rc ? anna_err_prefix(err, errlen, rc, "%s", where) : 0;
  }
  return anna_err(err, errlen, ANNA_EFORMAT, "%s: pattern must be {\"String\"} or {\"Regex\"}",
                  where);
}

static int parse_prepend_scheme(const json_t *o) {
  const char *ps = get_str(o, "prepend_scheme", NULL);
  if (ps) {
    if (!strcmp(ps, "first")) return TOK_PREPEND_FIRST;
    if (!strcmp(ps, "never")) return TOK_PREPEND_NEVER;
    return TOK_PREPEND_ALWAYS;
  }
  return get_bool(o, "add_prefix_space", 1) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
}

static int parse_replacement(tok_step *st, const json_t *o, char *err, size_t errlen) {
  size_t n = 0;
  const char *r = get_str(o, "replacement", &n);
  if (!r) {
    r = "\xe2\x96\x81";
    n = 3;
  }
  if (dup_str(&st->repl, &st->repl_len, r, n))
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  return 0;
}

#define NOMEM() anna_err(err, errlen, ANNA_ENOMEM, "out of memory")

static int parse_normalizer(tokenizer *t, const json_t *o, int depth, char *err, size_t errlen) {
  if (json_is_null(o) || !o) return 0;
  const char *type = get_str(o, "type", NULL);
  if (!json_is_object(o) || !type || depth > 8)
    return anna_err(err, errlen, ANNA_EFORMAT, "normalizer: expected an object with a type");
  if (!strcmp(type, "Sequence")) {
    const json_t *a = json_object_get(o, "normalizers");
    if (!json_is_array(a))
      return anna_err(err, errlen, ANNA_EFORMAT, "normalizer Sequence: no normalizers array");
    for (size_t i = 0; i < json_array_size(a); i++) {
      int rc = parse_normalizer(t, json_array_get(a, i), depth + 1, err, errlen);
      if (rc) return rc;
    }
    return 0;
  }
  static const struct {
    const char *name;
    int kind;
  } simple[] = {{"NFC", TOK_NORM_NFC},
                {"NFD", TOK_NORM_NFD},
                {"NFKC", TOK_NORM_NFKC},
                {"NFKD", TOK_NORM_NFKD},
                {"Lowercase", TOK_NORM_LOWERCASE}};
  for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++)
    if (!strcmp(type, simple[i].name)) return tok_pipe_push(&t->norm, simple[i].kind) ? 0 : NOMEM();
  tok_step *st;
  if (!strcmp(type, "Replace")) {
    size_t n = 0;
    const char *c = get_str(o, "content", &n);
    if (!c) return anna_err(err, errlen, ANNA_EFORMAT, "normalizer Replace: no content string");
    if (!(st = tok_pipe_push(&t->norm, TOK_NORM_REPLACE))) return NOMEM();
    if (dup_str(&st->repl, &st->repl_len, c, n)) return NOMEM();
    return parse_pattern(st, json_object_get(o, "pattern"), "normalizer Replace", err, errlen);
  }
  if (!strcmp(type, "Prepend")) {
    size_t n = 0;
    const char *c = get_str(o, "prepend", &n);
    if (!c) return anna_err(err, errlen, ANNA_EFORMAT, "normalizer Prepend: no prepend string");
    if (!(st = tok_pipe_push(&t->norm, TOK_NORM_PREPEND))) return NOMEM();
    return dup_str(&st->repl, &st->repl_len, c, n) ? NOMEM() : 0;
  }
  if (!strcmp(type, "Strip")) {
    if (!(st = tok_pipe_push(&t->norm, TOK_NORM_STRIP))) return NOMEM();
    st->strip_left = get_bool(o, "strip_left", 1);
    st->strip_right = get_bool(o, "strip_right", 1);
    return 0;
  }
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "normalizer type \"%s\" is not supported", type);
}

static int parse_behavior(const char *b) {
  if (!b || !strcmp(b, "Isolated")) return TOK_SPLIT_ISOLATED;
  if (!strcmp(b, "Removed")) return TOK_SPLIT_REMOVED;
  if (!strcmp(b, "MergedWithPrevious")) return TOK_SPLIT_MERGED_PREV;
  if (!strcmp(b, "MergedWithNext")) return TOK_SPLIT_MERGED_NEXT;
  if (!strcmp(b, "Contiguous")) return TOK_SPLIT_CONTIGUOUS;
  return -1;
}

static int parse_pretok(tokenizer *t, const json_t *o, int depth, char *err, size_t errlen) {
  if (json_is_null(o) || !o) return 0;
  const char *type = get_str(o, "type", NULL);
  if (!json_is_object(o) || !type || depth > 8)
    return anna_err(err, errlen, ANNA_EFORMAT, "pre_tokenizer: expected an object with a type");
  tok_step *st;
  if (!strcmp(type, "Sequence")) {
    const json_t *a = json_object_get(o, "pretokenizers");
    if (!json_is_array(a))
      return anna_err(err, errlen, ANNA_EFORMAT, "pre_tokenizer Sequence: no pretokenizers array");
    for (size_t i = 0; i < json_array_size(a); i++) {
      int rc = parse_pretok(t, json_array_get(a, i), depth + 1, err, errlen);
      if (rc) return rc;
    }
    return 0;
  }
  if (!strcmp(type, "Split")) {
    if (!(st = tok_pipe_push(&t->pre, TOK_PRE_SPLIT))) return NOMEM();
    const char *b = get_str(o, "behavior", NULL);
    st->behavior = parse_behavior(b);
    if (st->behavior < 0)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED, "pre_tokenizer Split: behavior \"%s\"", b);
    st->invert = get_bool(o, "invert", 0);
    return parse_pattern(st, json_object_get(o, "pattern"), "pre_tokenizer Split", err, errlen);
  }
  if (!strcmp(type, "ByteLevel")) {
    if (!(st = tok_pipe_push(&t->pre, TOK_PRE_BYTELEVEL))) return NOMEM();
    st->add_prefix_space = get_bool(o, "add_prefix_space", 1);
    st->use_regex = get_bool(o, "use_regex", 1);
    return st->use_regex ? tok_gpt2_regex(&st->re, err, errlen) : 0;
  }
  if (!strcmp(type, "Metaspace")) {
    if (!(st = tok_pipe_push(&t->pre, TOK_PRE_METASPACE))) return NOMEM();
    st->prepend_scheme = parse_prepend_scheme(o);
    st->split = get_bool(o, "split", 1);
    return parse_replacement(st, o, err, errlen);
  }
  if (!strcmp(type, "Digits")) {
    if (!(st = tok_pipe_push(&t->pre, TOK_PRE_DIGITS))) return NOMEM();
    st->individual_digits = get_bool(o, "individual_digits", 0);
    return 0;
  }
  if (!strcmp(type, "WhitespaceSplit")) return tok_pipe_push(&t->pre, TOK_PRE_WSPLIT) ? 0 : NOMEM();
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "pre_tokenizer type \"%s\" is not supported",
                  type);
}

static int parse_decoder(tokenizer *t, const json_t *o, int depth, char *err, size_t errlen) {
  if (json_is_null(o) || !o) return 0;
  const char *type = get_str(o, "type", NULL);
  if (!json_is_object(o) || !type || depth > 8)
    return anna_err(err, errlen, ANNA_EFORMAT, "decoder: expected an object with a type");
  tok_step *st;
  if (!strcmp(type, "Sequence")) {
    const json_t *a = json_object_get(o, "decoders");
    if (!json_is_array(a))
      return anna_err(err, errlen, ANNA_EFORMAT, "decoder Sequence: no decoders array");
    for (size_t i = 0; i < json_array_size(a); i++) {
      int rc = parse_decoder(t, json_array_get(a, i), depth + 1, err, errlen);
      if (rc) return rc;
    }
    return 0;
  }
  if (!strcmp(type, "ByteLevel")) return tok_pipe_push(&t->dec, TOK_DEC_BYTELEVEL) ? 0 : NOMEM();
  if (!strcmp(type, "ByteFallback"))
    return tok_pipe_push(&t->dec, TOK_DEC_BYTEFALLBACK) ? 0 : NOMEM();
  if (!strcmp(type, "Fuse")) return tok_pipe_push(&t->dec, TOK_DEC_FUSE) ? 0 : NOMEM();
  if (!strcmp(type, "Metaspace")) {
    if (!(st = tok_pipe_push(&t->dec, TOK_DEC_METASPACE))) return NOMEM();
    st->prepend_scheme = parse_prepend_scheme(o);
    return parse_replacement(st, o, err, errlen);
  }
  if (!strcmp(type, "Replace")) {
    size_t n = 0;
    const char *c = get_str(o, "content", &n);
    const char *p = get_str(json_object_get(o, "pattern"), "String", NULL);
    if (!c || !p)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "decoder Replace: only {\"String\"} patterns with a content string");
    if (!(st = tok_pipe_push(&t->dec, TOK_DEC_REPLACE))) return NOMEM();
    if (dup_str(&st->repl, &st->repl_len, c, n)) return NOMEM();
    return dup_str(&st->lit, &st->lit_len, p, strlen(p)) ? NOMEM() : 0;
  }
  if (!strcmp(type, "Strip")) {
    size_t n = 0;
    const char *c = get_str(o, "content", &n);
    const json_t *start = json_object_get(o, "start");
    if (!c || (start && !json_is_integer(start)))
      return anna_err(err, errlen, ANNA_EFORMAT, "decoder Strip: bad content/start");
    if (!(st = tok_pipe_push(&t->dec, TOK_DEC_STRIP))) return NOMEM();
    json_int_t s = start ? json_integer_value(start) : 0;
    st->strip_left = s < 0 ? 0 : s > 16 ? 16 : (int)s;
    return dup_str(&st->repl, &st->repl_len, c, n) ? NOMEM() : 0;
  }
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "decoder type \"%s\" is not supported", type);
}

static int ids_append(int32_t **v, size_t *n, int32_t id) {
  int32_t *nv = realloc(*v, (*n + 1) * sizeof *nv);
  if (!nv) return ANNA_ENOMEM;
  *v = nv;
  nv[(*n)++] = id;
  return 0;
}

static int check_id(const tokenizer *t, const json_t *v, int32_t *id) {
  if (!json_is_integer(v)) return 0;
  json_int_t x = json_integer_value(v);
  if (x < 0 || x >= t->n_vocab) return 0;
  *id = (int32_t)x;
  return 1;
}

static int parse_post(tokenizer *t, const json_t *o, int depth, char *err, size_t errlen) {
  if (json_is_null(o) || !o) return 0;
  const char *type = get_str(o, "type", NULL);
  if (!json_is_object(o) || !type || depth > 8)
    return anna_err(err, errlen, ANNA_EFORMAT, "post_processor: expected an object with a type");
  if (!strcmp(type, "ByteLevel")) return 0; /* only adjusts offsets */
  if (!strcmp(type, "Sequence")) {
    const json_t *a = json_object_get(o, "processors");
    if (!json_is_array(a))
      return anna_err(err, errlen, ANNA_EFORMAT, "post_processor Sequence: no processors array");
    for (size_t i = 0; i < json_array_size(a); i++) {
      int rc = parse_post(t, json_array_get(a, i), depth + 1, err, errlen);
      if (rc) return rc;
    }
    return 0;
  }
  if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
    int32_t cls, sep;
    const json_t *c = json_object_get(o, "cls"), *s = json_object_get(o, "sep");
    if (!check_id(t, json_array_get(c, 1), &cls) || !check_id(t, json_array_get(s, 1), &sep))
      return anna_err(err, errlen, ANNA_EFORMAT, "post_processor %s: bad cls/sep", type);
    if (ids_append(&t->post_pre, &t->n_post_pre, cls) ||
        ids_append(&t->post_post, &t->n_post_post, sep))
      return NOMEM();
    return 0;
  }
  if (!strcmp(type, "TemplateProcessing")) {
    const json_t *single = json_object_get(o, "single");
    const json_t *specials = json_object_get(o, "special_tokens");
    if (!json_is_array(single))
      return anna_err(err, errlen, ANNA_EFORMAT, "post_processor TemplateProcessing: no single");
    int seen_a = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
      const json_t *item = json_array_get(single, i);
      if (json_object_get(item, "Sequence")) {
        seen_a = 1;
        continue;
      }
      const char *name = get_str(json_object_get(item, "SpecialToken"), "id", NULL);
      const json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
      if (!name || !json_is_array(ids))
        return anna_err(err, errlen, ANNA_EFORMAT,
                        "post_processor TemplateProcessing: item %zu names no special token", i);
      for (size_t k = 0; k < json_array_size(ids); k++) {
        int32_t id;
        if (!check_id(t, json_array_get(ids, k), &id))
          return anna_err(err, errlen, ANNA_EFORMAT,
                          "post_processor TemplateProcessing: bad id for \"%s\"", name);
        if (seen_a ? ids_append(&t->post_post, &t->n_post_post, id)
                   : ids_append(&t->post_pre, &t->n_post_pre, id))
          return NOMEM();
      }
    }
    return 0;
  }
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "post_processor type \"%s\" is not supported",
                  type);
}

/* "a b" or ["a", "b"] -> the two strings. */
static int merge_parts(const json_t *m, const char **a, size_t *al, const char **b, size_t *bl) {
  if (json_is_string(m)) {
    const char *s = json_string_value(m);
    size_t n = json_string_length(m);
    const char *sp = memchr(s, ' ', n);
    if (!sp || sp == s || sp + 1 == s + n) return 0;
    *a = s;
    *al = (size_t)(sp - s);
    *b = sp + 1;
    *bl = n - *al - 1;
    return memchr(*b, ' ', *bl) == NULL;
  }
  if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
      json_is_string(json_array_get(m, 1))) {
    *a = json_string_value(json_array_get(m, 0));
    *al = json_string_length(json_array_get(m, 0));
    *b = json_string_value(json_array_get(m, 1));
    *bl = json_string_length(json_array_get(m, 1));
    return 1;
  }
  return 0;
}

static int build_from_root(tokenizer **out, const json_t *root, char *err, size_t errlen) {
  *out = NULL;
  if (!json_is_object(root))
    return anna_err(err, errlen, ANNA_EFORMAT, "tokenizer.json: top level is not an object");
  const json_t *model = json_object_get(root, "model");
  if (!json_is_object(model))
    return anna_err(err, errlen, ANNA_EFORMAT, "tokenizer.json: no model object");
  const char *mtype = get_str(model, "type", NULL);
  if (mtype && strcmp(mtype, "BPE"))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "tokenizer.json: model type \"%s\" is not "
                    "supported (BPE only)",
                    mtype);
  const json_t *vocab = json_object_get(model, "vocab");
  const json_t *merges = json_object_get(model, "merges");
  const json_t *added = json_object_get(root, "added_tokens");
  if (!json_is_object(vocab))
    return anna_err(err, errlen, ANNA_EFORMAT, "tokenizer.json: model.vocab is not an object");
  if (merges && !json_is_array(merges))
    return anna_err(err, errlen, ANNA_EFORMAT, "tokenizer.json: model.merges is not an array");
  if (added && !json_is_null(added) && !json_is_array(added))
    return anna_err(err, errlen, ANNA_EFORMAT, "tokenizer.json: added_tokens is not an array");
  size_t pl = 0;
  const char *pref = get_str(model, "continuing_subword_prefix", &pl);
  const char *suf = get_str(model, "end_of_word_suffix", NULL);
  if ((pref && pl) || (suf && *suf))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "tokenizer.json: BPE subword prefix/suffix is not supported");

  /* Size the id space first: the largest id in vocab and added tokens. */
  json_int_t maxid = -1;
  const char *key;
  const json_t *val;
  json_object_foreach((json_t *)vocab, key, val) {
    json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
    if (id < 0 || id >= TOK_MAX_ID)
      return anna_err(err, errlen, ANNA_EFORMAT,
                      "tokenizer.json: vocab entry \"%.40s\" has a "
                      "bad id",
                      key);
    if (id > maxid) maxid = id;
  }
  for (size_t i = 0; i < json_array_size(added); i++) {
    const json_t *a = json_array_get(added, i);
    const json_t *id = json_object_get(a, "id");
    json_int_t x = json_is_integer(id) ? json_integer_value(id) : -1;
    if (!json_is_object(a) || !json_is_string(json_object_get(a, "content")) || x < 0 ||
        x >= TOK_MAX_ID)
      return anna_err(err, errlen, ANNA_EFORMAT,
                      "tokenizer.json: added_tokens[%zu] needs an id in range and a content", i);
    if (x > maxid) maxid = x;
  }
  if (maxid < 0) return anna_err(err, errlen, ANNA_EFORMAT, "tokenizer.json: empty vocabulary");

  tokenizer *t;
  int rc = tok_alloc(&t, (int32_t)(maxid + 1), err, errlen);
  if (rc) return rc;
  t->kind = TOK_MODEL_BPE;
  json_object_foreach((json_t *)vocab, key, val) {
    int32_t id = (int32_t)json_integer_value(val);
    if (t->len[id] != UINT32_MAX) {
      rc = anna_err(err, errlen, ANNA_EFORMAT, "tokenizer.json: vocab id %ld used twice", (long)id);
      goto fail;
    }
    if ((rc = tok_set_piece(t, id, key, strlen(key), err, errlen))) goto fail;
  }
  for (size_t i = 0; i < json_array_size(added); i++) {
    const json_t *a = json_array_get(added, i);
    int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
    const json_t *c = json_object_get(a, "content");
    if ((rc = tok_set_piece(t, id, json_string_value(c), json_string_length(c), err, errlen)))
      goto fail;
    t->flags[id] = TOK_FLAG_ADDED | (get_bool(a, "special", 0) ? TOK_FLAG_SPECIAL : 0) |
                   (get_bool(a, "lstrip", 0) ? TOK_FLAG_LSTRIP : 0) |
                   (get_bool(a, "rstrip", 0) ? TOK_FLAG_RSTRIP : 0) |
                   (get_bool(a, "single_word", 0) ? TOK_FLAG_SINGLE_WORD : 0);
  }
  t->byte_fallback = get_bool(model, "byte_fallback", 0);
  t->fuse_unk = get_bool(model, "fuse_unk", 0);
  t->ignore_merges = get_bool(model, "ignore_merges", 0);
  if ((rc = tok_finish(t, err, errlen))) goto fail;
  size_t ul = 0;
  const char *unk = get_str(model, "unk_token", &ul);
  if (unk) t->unk_id = tok_map_find(t, &t->map, unk, ul);

  for (size_t i = 0; i < json_array_size(merges); i++) {
    const char *a, *b;
    size_t al, bl;
    if (!merge_parts(json_array_get(merges, i), &a, &al, &b, &bl)) {
      rc = anna_err(err, errlen, ANNA_EFORMAT,
                    "tokenizer.json: merges[%zu] is not \"a b\" or "
                    "[a, b]",
                    i);
      goto fail;
    }
    int32_t ia = tok_map_find(t, &t->map, a, al), ib = tok_map_find(t, &t->map, b, bl);
    char *cat = malloc(al + bl + 1);
    if (!cat) {
      rc = NOMEM();
      goto fail;
    }
    memcpy(cat, a, al);
    memcpy(cat + al, b, bl);
    int32_t ir = tok_map_find(t, &t->map, cat, al + bl);
    free(cat);
    if (ia < 0 || ib < 0 || ir < 0) {
      rc = anna_err(err, errlen, ANNA_EFORMAT,
                    "tokenizer.json: merges[%zu] (\"%.*s\" + \"%.*s\") uses a token not in the "
                    "vocabulary",
                    i, (int)(al > 40 ? 40 : al), a, (int)(bl > 40 ? 40 : bl), b);
      goto fail;
    }
    if ((rc = tok_merge_add(t, ia, ib, ir, (int32_t)i, err, errlen))) goto fail;
  }
  if ((rc = parse_normalizer(t, json_object_get(root, "normalizer"), 0, err, errlen)) ||
      (rc = parse_pretok(t, json_object_get(root, "pre_tokenizer"), 0, err, errlen)) ||
      (rc = parse_decoder(t, json_object_get(root, "decoder"), 0, err, errlen)) ||
      (rc = parse_post(t, json_object_get(root, "post_processor"), 0, err, errlen)))
    goto fail;
  *out = t;
  return 0;
fail:
  tokenizer_free(t);
  return rc;
}

/* bos_token etc.: a string or {"content": "..."}; returns its id or -1. */
static int32_t config_token(const tokenizer *t, const json_t *cfg, const char *key) {
  const json_t *v = json_object_get(cfg, key);
  if (json_is_object(v)) v = json_object_get(v, "content");
  if (!json_is_string(v)) return -1;
  return tok_map_find(t, &t->map, json_string_value(v), json_string_length(v));
}

static void apply_configs(tokenizer *t, const char *dir) {
  char path[4096 + 64];
  json_error_t je;
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  /* model_max_length is often 1e30 written as an integer, which overflows json_int_t. */
  json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
  if (json_is_object(cfg)) {
    int32_t id;
    if ((id = config_token(t, cfg, "bos_token")) >= 0) t->bos_id = id;
    if ((id = config_token(t, cfg, "eos_token")) >= 0) t->eos_id = id;
    if ((id = config_token(t, cfg, "pad_token")) >= 0) t->pad_id = id;
    if ((id = config_token(t, cfg, "unk_token")) >= 0 && t->unk_id < 0) t->unk_id = id;
    /* Without a post-processor, add_bos/eos_token say what ADD_SPECIAL adds. */
    if (!t->n_post_pre && !t->n_post_post) {
      if (get_bool(cfg, "add_bos_token", 0) && t->bos_id >= 0)
        (void)ids_append(&t->post_pre, &t->n_post_pre, t->bos_id);
      if (get_bool(cfg, "add_eos_token", 0) && t->eos_id >= 0)
        (void)ids_append(&t->post_post, &t->n_post_post, t->eos_id);
    }
  }
  json_decref(cfg);
  if (t->bos_id < 0 && t->n_post_pre) t->bos_id = t->post_pre[0];
  tok_eog_add(t, t->eos_id);
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  json_t *gen = json_load_file(path, 0, &je);
  const json_t *e = json_object_get(gen, "eos_token_id");
  int32_t id;
  if (check_id(t, e, &id)) tok_eog_add(t, id);
  for (size_t i = 0; json_is_array(e) && i < json_array_size(e); i++)
    if (check_id(t, json_array_get(e, i), &id)) tok_eog_add(t, id);
  json_decref(gen);
}

int tokenizer_load_json_text(tokenizer **out, const char *text, size_t len, char *err,
                             size_t errlen) {
  *out = NULL;
  json_error_t je;
  json_t *root = json_loadb(text, len, JSON_ALLOW_NUL, &je);
  if (!root)
    return anna_err(err, errlen, ANNA_EFORMAT, "tokenizer.json: line %d col %d: %s", je.line,
                    je.column, je.text);
  int rc = build_from_root(out, root, err, errlen);
  json_decref(root);
  if (!rc) {
    tok_eog_add(*out, (*out)->eos_id);
    if ((*out)->bos_id < 0 && (*out)->n_post_pre) (*out)->bos_id = (*out)->post_pre[0];
  }
  return rc;
}

int tokenizer_load_json(tokenizer **out, const char *path, char *err, size_t errlen) {
  *out = NULL;
  struct stat sb;
  char file[4096], dir[4096];
  if (!path || stat(path, &sb) != 0)
    return anna_err(err, errlen, ANNA_EIO, "cannot open %s", path ? path : "(null)");
  if (S_ISDIR(sb.st_mode)) {
    snprintf(dir, sizeof dir, "%s", path);
    snprintf(file, sizeof file, "%s/tokenizer.json", path);
  } else {
    snprintf(file, sizeof file, "%s", path);
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
      *slash = 0;
    else
      snprintf(dir, sizeof dir, ".");
  }
  FILE *f = fopen(file, "rb");
  if (!f) return anna_err(err, errlen, ANNA_EIO, "cannot open %s", file);
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap) {
      cap = cap ? cap * 2 : 1 << 20;
      char *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        fclose(f);
        return anna_err(err, errlen, ANNA_ENOMEM, "out of memory reading %s", file);
      }
      buf = nb;
    }
    size_t k = fread(buf + n, 1, cap - n, f);
    n += k;
    if (k == 0) break;
  }
  int ioerr = ferror(f);
  fclose(f);
  if (ioerr) {
    free(buf);
    return anna_err(err, errlen, ANNA_EIO, "read error on %s", file);
  }
  int rc = tokenizer_load_json_text(out, buf, n, err, errlen);
  free(buf);
  if (rc) return anna_err_prefix(err, errlen, rc, "%s", file);
  apply_configs(*out, dir);
  return 0;
}
