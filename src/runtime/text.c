/* text.c: opening the text side of a model (anna_text_open), chat prompts (text.h). */
#include "runtime/text.h"

#include "base/error.h"
#include "model/gguf_model.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int anna_text_open(anna_text **out, const char *path, int flags, char *err, size_t errlen) {
  *out = NULL;
  model_text *t = calloc(1, sizeof *t);
  if (!t) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  struct stat st;
  int rc;
  if (stat(path, &st) != 0) {
    rc = anna_err(err, errlen, ANNA_EIO, "%s: no such file or folder", path);
    goto fail;
  }
  if (S_ISDIR(st.st_mode)) {
    if ((rc = tokenizer_load_json(&t->tok, path, err, errlen))) goto fail;
    if (!(flags & ANNA_TEXT_NO_TEMPLATE)) {
      rc = chat_template_load(&t->ct, path, err, errlen);
      if (rc == ANNA_ENOTFOUND) rc = 0;
      if (rc) goto fail;
    }
  } else {
    if ((rc = gguf_model_text(path, &t->tok, &t->ct, err, errlen))) goto fail;
    /* The GGUF reader parses both; a caller that asked for no template does not see it. */
    if (flags & ANNA_TEXT_NO_TEMPLATE) {
      chat_template_free(t->ct);
      t->ct = NULL;
    }
  }
  *out = t;
  return 0;
fail:
  anna_text_free(t);
  return rc;
}

void anna_text_free(anna_text *t) {
  if (!t) return;
  tokenizer_free(t->tok);
  chat_template_free(t->ct);
  free(t);
}

int model_text_encode_chat(const model_text *t, const json_t *messages, const json_t *tools, const json_t *kwargs,
                           int32_t **ids, size_t *n, char *err, size_t errlen) {
  *ids = NULL;
  *n = 0;
  char *txt = NULL;
  size_t len = 0;
  int rc;
  if (t->ct) {
    rc = chat_template_apply(t->ct, messages, tools, 1, kwargs, &txt, &len, err, errlen);
    if (rc) return rc;
    /* The template already wrote any BOS; special tokens in it are real control tokens. */
    rc = tokenizer_encode(t->tok, txt, len, 0, ids, n, err, errlen);
  } else {
    size_t cap = 1;
    for (size_t i = 0; i < json_array_size(messages); i++)
    {
      const char *c = json_string_value(json_object_get(json_array_get(messages, i), "content"));
      cap += (c ? strlen(c) : 0) + 1;
    }
    txt = malloc(cap);
    if (!txt) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    txt[0] = '\0';
    for (size_t i = 0; i < json_array_size(messages); i++) {
      const char *c = json_string_value(json_object_get(json_array_get(messages, i), "content"));
      if (c) strcat(strcat(txt, c), "\n");
    }
    rc = tokenizer_encode(t->tok, txt, strlen(txt), TOKENIZER_ENCODE_ADD_SPECIAL, ids, n, err, errlen);
  }
  free(txt);
  return rc;
}

int anna_text_encode_prompt(const anna_text *t, const char *prompt, const char *system, int raw, int no_think,
                            int32_t **ids, size_t *n, char *err, size_t errlen) {
  int rc;
  if (raw || !t->ct) {
    rc = tokenizer_encode(t->tok, prompt, strlen(prompt), TOKENIZER_ENCODE_ADD_SPECIAL, ids, n, err, errlen);
  } else {
    json_t *msgs = json_array();
    if (system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", prompt));
    json_t *kw = no_think ? json_pack("{s:b}", "enable_thinking", 0) : NULL;
    rc = model_text_encode_chat(t, msgs, NULL, kw, ids, n, err, errlen);
    json_decref(msgs);
    json_decref(kw);
  }
  if (!rc && *n == 0) {
    free(*ids);
    *ids = NULL;
    rc = anna_err(err, errlen, ANNA_EINVAL, "the prompt is empty after tokenization");
  }
  return rc;
}
