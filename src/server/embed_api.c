/* embed_api.c: POST /v1/embeddings (see embed_api.h). */
#include "embed_api.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EMBED_MAX_INPUTS 2048

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Standard base64 with padding of n bytes; caller frees. */
static char *b64_encode(const uint8_t *p, size_t n) {
  char *o = malloc((n + 2) / 3 * 4 + 1), *w = o;
  if (!o) return NULL;
  size_t i = 0;
  for (; i + 2 < n; i += 3) {
    const uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
    *w++ = B64[v >> 18], *w++ = B64[(v >> 12) & 63], *w++ = B64[(v >> 6) & 63], *w++ = B64[v & 63];
  }
  if (i < n) {
    const uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
    *w++ = B64[v >> 18], *w++ = B64[(v >> 12) & 63];
    *w++ = i + 1 < n ? B64[(v >> 6) & 63] : '=';
    *w++ = '=';
  }
  *w = '\0';
  return o;
}

/* One input as token ids (owned by *ids). */
static int input_ids(const oai_config *cfg, json_t *in, size_t k, int32_t **ids, size_t *n, oai_error *e) {
  char p[32], err[256];
  snprintf(p, sizeof p, "input[%zu]", k);
  if (json_is_string(in)) {
    if (json_string_length(in) == 0) return oai_fail(e, 400, p, "invalid_value", "'%s' must not be empty", p);
    if (anna_text_tokenize(cfg->text, json_string_value(in), json_string_length(in), ANNA_TOKENIZE_ADD_SPECIAL, ids, n,
                           err, sizeof err))
      return oai_fail(e, 400, p, "invalid_value", "cannot tokenize '%s': %s", p, err);
  } else if (json_is_array(in)) {
    const size_t m = json_array_size(in);
    if (m == 0) return oai_fail(e, 400, p, "invalid_value", "'%s' must not be empty", p);
    if (!(*ids = malloc(sizeof **ids * m))) return oai_fail(e, 500, NULL, NULL, "out of memory");
    const int32_t vocab = anna_text_vocab(cfg->text);
    for (size_t i = 0; i < m; i++) {
      json_t *v = json_array_get(in, i);
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
        return oai_fail(e, 400, p, "invalid_value", "'%s' token ids must be integers in [0, %d)", p, vocab);
      (*ids)[i] = (int32_t)json_integer_value(v);
    }
    *n = m;
  } else {
    return oai_fail(e, 400, "input", "invalid_type",
                    "'input' must be a string, an array of strings, an array of token ids or an array of those");
  }
  if (*n == 0) return oai_fail(e, 400, p, "invalid_value", "'%s' is empty after tokenization", p);
  if (*n > (size_t)cfg->n_ctx)
    return oai_fail(e, 400, p, "context_length_exceeded", "'%s' has %zu tokens; this server's context (--ctx-size) is %d",
                    p, *n, cfg->n_ctx);
  return 0;
}

int embed_api_handle(const oai_config *cfg, engine *eng, const char *body, size_t len, char **out, oai_error *e) {
  *out = NULL;
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root)
    return oai_fail(e, 400, NULL, "invalid_json", "the body is not valid JSON: %s (line %d, column %d)", je.text,
                    je.line, je.column);
  int rc = -1;
  float *vec = NULL;
  int32_t *ids = NULL;
  json_t *data = json_array();
  const int H = engine_hidden_size(eng);
  if (!json_is_object(root)) {
    oai_fail(e, 400, NULL, "invalid_type", "the body must be a JSON object");
    goto done;
  }
  const char *k;
  json_t *v;
  json_object_foreach(root, k, v) {
    if (strcmp(k, "input") && strcmp(k, "model") && strcmp(k, "encoding_format") && strcmp(k, "dimensions") &&
        strcmp(k, "user")) {
      oai_fail(e, 400, k, "unsupported_parameter", "unknown or unsupported field '%.60s'", k);
      goto done;
    }
  }
  v = json_object_get(root, "model");
  if (v && !json_is_null(v) && (!json_is_string(v) || (json_string_length(v) && strcmp(json_string_value(v), cfg->model_name)))) {
    oai_fail(e, 404, "model", "model_not_found", "The model '%.200s' does not exist; this server serves '%s'",
             json_is_string(v) ? json_string_value(v) : "?", cfg->model_name);
    goto done;
  }
  int b64 = 0;
  v = json_object_get(root, "encoding_format");
  if (v && !json_is_null(v)) {
    if (!json_is_string(v) || (strcmp(json_string_value(v), "float") && strcmp(json_string_value(v), "base64"))) {
      oai_fail(e, 400, "encoding_format", "invalid_value", "'encoding_format' must be float or base64");
      goto done;
    }
    b64 = !strcmp(json_string_value(v), "base64");
  }
  v = json_object_get(root, "dimensions");
  if (v && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) != H)) {
    oai_fail(e, 400, "dimensions", "unsupported_value",
             "'dimensions' must be %d, this model's embedding size (no truncated embeddings)", H);
    goto done;
  }
  json_t *in = json_object_get(root, "input");
  if (!in || json_is_null(in)) {
    oai_fail(e, 400, "input", "missing_required_parameter", "'input' is required");
    goto done;
  }
  /* One input: a string or a flat id array; otherwise an array of those. */
  const int single = json_is_string(in) || (json_is_array(in) && json_array_size(in) > 0 &&
                                            json_is_integer(json_array_get(in, 0)));
  if (!single && !json_is_array(in)) {
    oai_fail(e, 400, "input", "invalid_type",
             "'input' must be a string, an array of strings, an array of token ids or an array of those");
    goto done;
  }
  const size_t n_in = single ? 1 : json_array_size(in);
  if (n_in == 0 || n_in > EMBED_MAX_INPUTS) {
    oai_fail(e, 400, "input", "invalid_value", "'input' must hold 1 to %d inputs", EMBED_MAX_INPUTS);
    goto done;
  }
  if (H <= 0 || !(vec = malloc(sizeof *vec * (size_t)H))) {
    oai_fail(e, H <= 0 ? 400 : 500, NULL, NULL, H <= 0 ? "this model gives no hidden states" : "out of memory");
    goto done;
  }
  long long total = 0;
  for (size_t i = 0; i < n_in; i++) {
    size_t n = 0;
    free(ids);
    ids = NULL;
    if (input_ids(cfg, single ? in : json_array_get(in, i), i, &ids, &n, e)) goto done;
    char err[300];
    const int erc = engine_embed(eng, ids, n, vec, err, sizeof err);
    if (erc) {
      const int st = erc == ANNA_EUNSUPPORTED || erc == ANNA_EINVAL ? 400
                     : erc == ANNA_ESTATE || erc == ANNA_ENOMEM || erc == ANNA_ERANGE ? 503
                                                                                   : 500;
      oai_fail(e, st, erc == ANNA_EUNSUPPORTED ? "model" : NULL,
               st == 503 ? "resources_exhausted" : erc == ANNA_EUNSUPPORTED ? "unsupported_model" : NULL, "%s", err);
      goto done;
    }
    total += (long long)n;
    double ss = 0;
    for (int d = 0; d < H; d++) ss += (double)vec[d] * vec[d];
    const float inv = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
    for (int d = 0; d < H; d++) vec[d] *= inv;
    json_t *emb;
    if (b64) {
      char *s = b64_encode((const uint8_t *)vec, sizeof *vec * (size_t)H); /* hosts are little-endian */
      emb = s ? json_string(s) : NULL;
      free(s);
    } else {
      emb = json_array();
      for (int d = 0; d < H; d++) json_array_append_new(emb, json_real(vec[d]));
    }
    if (!emb) {
      oai_fail(e, 500, NULL, NULL, "out of memory");
      goto done;
    }
    json_array_append_new(data, json_pack("{s:s,s:I,s:o}", "object", "embedding", "index", (json_int_t)i, "embedding", emb));
  }
  json_t *o = json_pack("{s:s,s:O,s:s,s:{s:I,s:I}}", "object", "list", "data", data, "model", cfg->model_name, "usage",
                        "prompt_tokens", (json_int_t)total, "total_tokens", (json_int_t)total);
  *out = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  rc = *out ? 0 : oai_fail(e, 500, NULL, NULL, "out of memory");
done:
  free(ids);
  free(vec);
  json_decref(data);
  json_decref(root);
  return rc;
}
