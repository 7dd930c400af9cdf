/* api_text.c: the public text API of anna.h over the internal tokenizer (tokenizer/),
 * chat template (template/) and model_text (text.h): thin wrappers, no behaviour of their
 * own beyond turning JSON text into values. The public opaque types are the internal objects
 * under another name: anna_text is model_text (the same struct), anna_text_stream a
 * tokenizer_stream and anna_chat_template a chat_template (pointer casts both ways only).
 */
#include "anna/anna.h"

#include "base/error.h"
#include "runtime/text.h"

#include <stdlib.h>
#include <string.h>

static const chat_template *ct_in(const anna_chat_template *ct) { return (const chat_template *)(const void *)ct; }
static tokenizer_stream *ts_in(anna_text_stream *s) { return (tokenizer_stream *)(void *)s; }

/* Parses an optional JSON argument (NULL stays NULL). Any JSON value is accepted: the
 * template decides what it can render, as it did when callers passed values. */
static int json_arg(const char *txt, const char *what, json_t **out, char *err, size_t errlen) {
  *out = NULL;
  if (!txt) return 0;
  json_error_t je;
  *out = json_loads(txt, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
  if (!*out) return anna_err(err, errlen, ANNA_EINVAL, "%s: not JSON: line %d: %s", what, je.line, je.text);
  return 0;
}

/* ---- chat templates ---- */

int anna_chat_template_load(anna_chat_template **out, const char *model_dir, char *err, size_t errlen) {
  chat_template *ct = NULL;
  *out = NULL;
  if (!model_dir) return anna_err(err, errlen, ANNA_EINVAL, "chat template: no folder");
  int rc = chat_template_load(&ct, model_dir, err, errlen);
  if (!rc) *out = (anna_chat_template *)(void *)ct;
  return rc;
}

int anna_chat_template_from_source(anna_chat_template **out, const char *src, size_t len, const char *bos_token,
                                   const char *eos_token, char *err, size_t errlen) {
  chat_template *ct = NULL;
  *out = NULL;
  if (!src) return anna_err(err, errlen, ANNA_EINVAL, "chat template: no source");
  int rc = chat_template_from_source(&ct, src, len, bos_token, eos_token, err, errlen);
  if (!rc) *out = (anna_chat_template *)(void *)ct;
  return rc;
}

void anna_chat_template_free(anna_chat_template *ct) { chat_template_free((chat_template *)(void *)ct); }

const char *anna_chat_template_source(const anna_chat_template *ct, size_t *len) {
  if (len) *len = ct ? ct_in(ct)->source_len : 0;
  return ct ? ct_in(ct)->source : NULL;
}

int anna_chat_template_render(const anna_chat_template *ct, const char *messages_json, const char *tools_json,
                              int add_generation_prompt, const char *kwargs_json, char **out, size_t *out_len,
                              char *err, size_t errlen) {
  *out = NULL;
  *out_len = 0;
  if (!ct) return anna_err(err, errlen, ANNA_EINVAL, "chat template: none");
  json_t *msgs = NULL, *tools = NULL, *kw = NULL;
  int rc;
  if (!messages_json) return anna_err(err, errlen, ANNA_EINVAL, "messages: missing");
  if (!(rc = json_arg(messages_json, "messages", &msgs, err, errlen)) &&
      !(rc = json_arg(tools_json, "tools", &tools, err, errlen)) &&
      !(rc = json_arg(kwargs_json, "kwargs", &kw, err, errlen)))
    rc = chat_template_apply(ct_in(ct), msgs, tools, add_generation_prompt, kw, out, out_len, err, errlen);
  json_decref(msgs);
  json_decref(tools);
  json_decref(kw);
  return rc;
}

int anna_chat_template_render_vars(const anna_chat_template *ct, const char *vars_json, char **out,
                                   size_t *out_len, char *err, size_t errlen) {
  *out = NULL;
  *out_len = 0;
  if (!ct) return anna_err(err, errlen, ANNA_EINVAL, "chat template: none");
  if (!vars_json) return anna_err(err, errlen, ANNA_EINVAL, "vars: missing");
  json_t *vars = NULL;
  int rc = json_arg(vars_json, "vars", &vars, err, errlen);
  if (!rc) rc = jinja_template_render(ct_in(ct)->tpl, vars, out, out_len, err, errlen);
  json_decref(vars);
  return rc;
}

/* ---- text: tokenizer ---- */

int anna_text_tokenize(const anna_text *t, const char *text, size_t len, int flags, int32_t **ids, size_t *n,
                       char *err, size_t errlen) {
  *ids = NULL;
  *n = 0;
  if (!text && len) return anna_err(err, errlen, ANNA_EINVAL, "tokenize: no text");
  /* The public flag bits are the tokenizer's (ANNA_TOKENIZE_* == TOKENIZER_ENCODE_*). */
  return tokenizer_encode(t->tok, text ? text : "", len, flags, ids, n, err, errlen);
}

int anna_text_detokenize(const anna_text *t, const int32_t *ids, size_t n, int flags, char **text, size_t *len,
                         char *err, size_t errlen) {
  *text = NULL;
  *len = 0;
  if (!ids && n) return anna_err(err, errlen, ANNA_EINVAL, "detokenize: no ids");
  return tokenizer_decode(t->tok, ids, n, flags, text, len, err, errlen);
}

int32_t anna_text_vocab(const anna_text *t) { return tokenizer_n_vocab(t->tok); }

const char *anna_text_token_piece(const anna_text *t, int32_t id, size_t *len) {
  size_t l = 0;
  const char *s = tokenizer_token_str(t->tok, id, &l);
  if (len) *len = s ? l : 0;
  return s;
}

int anna_text_token_text(const anna_text *t, int32_t id, char *out, size_t cap, size_t *len, char *err,
                         size_t errlen) {
  char *s = NULL;
  size_t l = 0;
  *len = 0;
  int rc = tokenizer_decode(t->tok, &id, 1, 0, &s, &l, err, errlen);
  if (rc) return rc;
  *len = l;
  if (!out || l >= cap) rc = anna_err(err, errlen, ANNA_ERANGE, "token %d: %zu bytes do not fit %zu", id, l, cap);
  else memcpy(out, s, l + 1);
  free(s);
  return rc;
}

int32_t anna_text_token_id(const anna_text *t, const char *piece) {
  return piece ? tokenizer_token_id(t->tok, piece) : -1;
}

int anna_text_token_is_special(const anna_text *t, int32_t id) {
  return id >= 0 && id < tokenizer_n_vocab(t->tok) && tokenizer_token_is_special(t->tok, id);
}

int32_t anna_text_bos(const anna_text *t) { return tokenizer_bos_id(t->tok); }
int32_t anna_text_eos(const anna_text *t) { return tokenizer_eos_id(t->tok); }
int32_t anna_text_pad(const anna_text *t) { return tokenizer_pad_id(t->tok); }

const int32_t *anna_text_eog_ids(const anna_text *t, size_t *n) {
  size_t k = 0;
  const int32_t *ids = tokenizer_eog_ids(t->tok, &k);
  if (n) *n = k;
  return ids;
}

int anna_text_is_eog(const anna_text *t, int32_t id) { return tokenizer_is_eog(t->tok, id); }

/* ---- text: streaming detokenizer ---- */

int anna_text_stream_new(anna_text_stream **out, const anna_text *t, int flags, char *err, size_t errlen) {
  tokenizer_stream *s = NULL;
  *out = NULL;
  int rc = tokenizer_stream_new(&s, t->tok, flags, err, errlen);
  if (!rc) *out = (anna_text_stream *)(void *)s;
  return rc;
}

void anna_text_stream_free(anna_text_stream *s) { tokenizer_stream_free(ts_in(s)); }

int anna_text_stream_feed(anna_text_stream *s, int32_t id, char *out, size_t cap, size_t *out_len, char *err,
                          size_t errlen) {
  return tokenizer_stream_feed(ts_in(s), id, out, cap, out_len, err, errlen);
}

int anna_text_stream_flush(anna_text_stream *s, char *out, size_t cap, size_t *out_len, char *err,
                           size_t errlen) {
  return tokenizer_stream_flush(ts_in(s), out, cap, out_len, err, errlen);
}

/* ---- text: chat ---- */

const anna_chat_template *anna_text_template(const anna_text *t) {
  return (const anna_chat_template *)(const void *)t->ct;
}

int anna_text_encode_chat(const anna_text *t, const char *messages_json, const char *tools_json,
                          const char *kwargs_json, int32_t **ids, size_t *n, char *err, size_t errlen) {
  *ids = NULL;
  *n = 0;
  if (!messages_json) return anna_err(err, errlen, ANNA_EINVAL, "messages: missing");
  json_t *msgs = NULL, *tools = NULL, *kw = NULL;
  int rc;
  if (!(rc = json_arg(messages_json, "messages", &msgs, err, errlen)) &&
      !(rc = json_arg(tools_json, "tools", &tools, err, errlen)) &&
      !(rc = json_arg(kwargs_json, "kwargs", &kw, err, errlen)))
    rc = model_text_encode_chat(t, msgs, tools, kw, ids, n, err, errlen);
  json_decref(msgs);
  json_decref(tools);
  json_decref(kw);
  return rc;
}

/* The public flag values are the internal ones, so they pass through unchanged. */
_Static_assert(ANNA_TOKENIZE_ADD_SPECIAL == TOKENIZER_ENCODE_ADD_SPECIAL &&
                   ANNA_TOKENIZE_NO_PARSE_SPECIAL == TOKENIZER_ENCODE_NO_PARSE_SPECIAL &&
                   ANNA_DETOKENIZE_SKIP_SPECIAL == TOKENIZER_DECODE_SKIP_SPECIAL,
               "anna.h text flags must equal tokenizer.h's");
