/* tokapi.c: /tokenize and /detokenize (see tokapi.h). */
#include "tokapi.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static json_t *load_object(const char *body, size_t len, oai_error *e) {
  json_error_t je;
  json_t *root = json_loadb(body, len, JSON_ALLOW_NUL, &je); /* text may hold NUL: lengths are used */
  if (!root) {
    oai_fail(e, 400, NULL, "invalid_json", "the body is not valid JSON: %s (line %d, column %d)", je.text,
             je.line, je.column);
    return NULL;
  }
  if (!json_is_object(root)) {
    json_decref(root);
    oai_fail(e, 400, NULL, "invalid_type", "the body must be a JSON object");
    return NULL;
  }
  return root;
}

/* 0 and *dst set when key is absent (left as is) or a boolean; -1 with *e otherwise. */
static int get_bool(json_t *root, const char *key, int *dst, oai_error *e) {
  json_t *v = json_object_get(root, key);
  if (!v) return 0;
  if (!json_is_boolean(v)) return oai_fail(e, 400, key, "invalid_type", "'%s' must be a boolean", key);
  *dst = json_is_true(v);
  return 0;
}

/* Every key of root must be in allowed (NULL-terminated). */
static int check_keys(json_t *root, const char *const *allowed, oai_error *e) {
  const char *k;
  json_t *v;
  json_object_foreach(root, k, v) {
    int ok = 0;
    for (int i = 0; allowed[i] && !ok; i++)
      ok = !strcmp(k, allowed[i]);
    if (!ok) {
      if (!strcmp(k, "messages"))
        return oai_fail(e, 400, "messages", "unsupported_parameter",
                        "'messages' is not supported by /tokenize: send the text as 'prompt' or 'content'");
      return oai_fail(e, 400, k, "unknown_parameter", "unknown field '%.200s'", k);
    }
  }
  json_t *m = json_object_get(root, "model");
  if (m && !json_is_string(m)) return oai_fail(e, 400, "model", "invalid_type", "'model' must be a string");
  return 0;
}

static int dump(json_t *o, char **out, oai_error *e) {
  *out = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (!*out) return oai_fail(e, 500, NULL, "out_of_memory", "out of memory");
  return 0;
}

int tokapi_tokenize(const oai_config *cfg, const char *body, size_t len, char **out, oai_error *e) {
  *out = NULL;
  static const char *const allowed[] = {"content", "prompt", "add_special", "add_special_tokens",
                                        "parse_special", "with_pieces", "model", NULL};
  json_t *root = load_object(body, len, e);
  if (!root) return -1;
  int rc = -1, add_special = 0, add_special_tokens = -1, parse_special = 1, with_pieces = 0;
  int32_t *ids = NULL;
  size_t n = 0;
  json_t *c = json_object_get(root, "content"), *p = json_object_get(root, "prompt");
  const char *field = c ? "content" : "prompt";
  json_t *text = c ? c : p;
  if (check_keys(root, allowed, e)) goto done;
  if (c && p) {
    oai_fail(e, 400, "prompt", "invalid_value", "give 'content' or 'prompt', not both");
    goto done;
  }
  if (!text) {
    oai_fail(e, 400, "content", "missing_required_parameter", "'content' (or 'prompt') is required");
    goto done;
  }
  if (!json_is_string(text)) {
    oai_fail(e, 400, field, "invalid_type", "'%s' must be a string", field);
    goto done;
  }
  if (get_bool(root, "add_special", &add_special, e) || get_bool(root, "add_special_tokens", &add_special_tokens, e) ||
      get_bool(root, "parse_special", &parse_special, e) || get_bool(root, "with_pieces", &with_pieces, e))
    goto done;
  if (json_object_get(root, "add_special") && add_special_tokens >= 0 && add_special_tokens != add_special) {
    oai_fail(e, 400, "add_special_tokens", "invalid_value", "'add_special' and 'add_special_tokens' disagree");
    goto done;
  }
  if (add_special_tokens >= 0) add_special = add_special_tokens;
  char err[256] = "";
  int flags = (add_special ? ANNA_TOKENIZE_ADD_SPECIAL : 0) | (parse_special ? 0 : ANNA_TOKENIZE_NO_PARSE_SPECIAL);
  int trc = anna_text_tokenize(cfg->text, json_string_value(text), json_string_length(text), flags, &ids, &n, err,
                               sizeof err);
  if (trc) {
    oai_fail(e, trc == ANNA_ENOMEM ? 500 : 400, field, "invalid_value", "'%s': %s", field, err);
    goto done;
  }
  json_t *arr = json_array();
  for (size_t i = 0; arr && i < n; i++) {
    if (!with_pieces) {
      json_array_append_new(arr, json_integer(ids[i]));
      continue;
    }
    char piece[1024];
    size_t pl = 0;
    json_t *pv;
    if (!anna_text_token_text(cfg->text, ids[i], piece, sizeof piece, &pl, err, sizeof err))
      pv = json_stringn(piece, pl);
    else
      pv = json_null(); /* a piece over 1 KiB: none of the vocabularies we load has one */
    json_array_append_new(arr, json_pack("{s:i,s:o}", "id", (json_int_t)ids[i], "piece", pv ? pv : json_null()));
  }
  rc = dump(arr ? json_pack("{s:o,s:I,s:i}", "tokens", arr, "count", (json_int_t)n, "max_model_len", cfg->n_ctx)
                : NULL,
            out, e);
done:
  free(ids);
  json_decref(root);
  return rc;
}

int tokapi_detokenize(const oai_config *cfg, const char *body, size_t len, char **out, oai_error *e) {
  *out = NULL;
  static const char *const allowed[] = {"tokens", "model", NULL};
  json_t *root = load_object(body, len, e);
  if (!root) return -1;
  int rc = -1;
  int32_t *ids = NULL;
  char *text = NULL;
  json_t *t = json_object_get(root, "tokens");
  if (check_keys(root, allowed, e)) goto done;
  if (!t) {
    oai_fail(e, 400, "tokens", "missing_required_parameter", "'tokens' is required");
    goto done;
  }
  if (!json_is_array(t)) {
    oai_fail(e, 400, "tokens", "invalid_type", "'tokens' must be an array of token ids");
    goto done;
  }
  size_t n = json_array_size(t);
  ids = malloc((n ? n : 1) * sizeof *ids);
  if (!ids) {
    oai_fail(e, 500, NULL, "out_of_memory", "out of memory");
    goto done;
  }
  const int32_t vocab = anna_text_vocab(cfg->text);
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(t, i);
    if (!json_is_integer(v)) {
      oai_fail(e, 400, "tokens", "invalid_type", "'tokens[%zu]' must be an integer token id", i);
      goto done;
    }
    json_int_t id = json_integer_value(v);
    if (id < 0 || id >= vocab) {
      oai_fail(e, 400, "tokens", "invalid_value", "'tokens[%zu]' = %lld is not a token id (vocabulary: 0..%d)", i,
               (long long)id, vocab - 1);
      goto done;
    }
    ids[i] = (int32_t)id;
  }
  char err[256] = "";
  size_t tl = 0;
  int drc = anna_text_detokenize(cfg->text, ids, n, 0, &text, &tl, err, sizeof err);
  if (drc) {
    oai_fail(e, drc == ANNA_ENOMEM ? 500 : 400, "tokens", "invalid_value", "'tokens': %s", err);
    goto done;
  }
  rc = dump(json_pack("{s:s%,s:s%}", "content", text, tl, "prompt", text, tl), out, e);
done:
  free(text);
  free(ids);
  json_decref(root);
  return rc;
}
