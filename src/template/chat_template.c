/* chat_template.c: finding a model's chat template and rendering conversations with it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "template/chat_template.h"

#define MAX_TEMPLATE_FILE ((long)64 << 20)

/* Reads a whole file; ANNA_ENOTFOUND when it does not exist. *out: caller frees. */
static int read_file(const char *path, char **out, size_t *len, char *err, size_t errlen) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (errno == ENOENT) return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: not found", path);
    return anna_err(err, errlen, ANNA_EIO, "%s: %s", path, strerror(errno));
  }
  if (fseek(f, 0, SEEK_END) != 0) {
    fclose(f);
    return anna_err(err, errlen, ANNA_EIO, "%s: cannot seek", path);
  }
  long sz = ftell(f);
  if (sz < 0 || sz > MAX_TEMPLATE_FILE) {
    fclose(f);
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: unexpected size", path);
  }
  rewind(f);
  char *buf = malloc((size_t)sz + 1);
  if (!buf) {
    fclose(f);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  size_t got = fread(buf, 1, (size_t)sz, f);
  fclose(f);
  if (got != (size_t)sz) {
    free(buf);
    return anna_err(err, errlen, ANNA_EIO, "%s: short read", path);
  }
  buf[got] = 0;
  *out = buf;
  *len = got;
  return 0;
}

static char *dup_str(const char *s, size_t n) {
  char *r = malloc(n + 1);
  if (!r) return NULL;
  memcpy(r, s, n);
  r[n] = 0;
  return r;
}

/* bos/eos entries may be "text" or {"content": "text", ...}. */
static const char *token_text(const json_t *v) {
  if (json_is_string(v)) return json_string_value(v);
  if (json_is_object(v)) {
    const json_t *c = json_object_get(v, "content");
    if (json_is_string(c)) return json_string_value(c);
  }
  return NULL;
}

/* Picks the template out of a `chat_template` JSON value. Borrowed result. */
static const json_t *pick_template(const json_t *ct) {
  if (json_is_string(ct)) return ct;
  if (!json_is_array(ct)) return NULL;
  size_t i;
  json_t *e;
  json_array_foreach(ct, i, e) {
    const json_t *name = json_object_get(e, "name");
    const json_t *tpl = json_object_get(e, "template");
    if (json_is_string(name) && strcmp(json_string_value(name), "default") == 0 && json_is_string(tpl))
      return tpl;
  }
  return NULL;
}

int chat_template_from_source(chat_template **out, const char *src, size_t len,
                              const char *bos_token, const char *eos_token, char *err,
                              size_t errlen) {
  if (!out) return anna_err(err, errlen, ANNA_EINVAL, "chat_template_from_source: out is NULL");
  *out = NULL;
  chat_template *ct = calloc(1, sizeof(*ct));
  if (!ct) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  ct->source = dup_str(src ? src : "", src ? len : 0);
  ct->source_len = src ? len : 0;
  ct->bos_token = bos_token ? dup_str(bos_token, strlen(bos_token)) : NULL;
  ct->eos_token = eos_token ? dup_str(eos_token, strlen(eos_token)) : NULL;
  if (!ct->source || (bos_token && !ct->bos_token) || (eos_token && !ct->eos_token)) {
    chat_template_free(ct);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  int rc = jinja_template_parse(&ct->tpl, ct->source, ct->source_len, err, errlen);
  if (rc) {
    chat_template_free(ct);
    return rc;
  }
  *out = ct;
  return 0;
}

int chat_template_load(chat_template **out, const char *model_dir, char *err, size_t errlen) {
  if (!out || !model_dir) return anna_err(err, errlen, ANNA_EINVAL, "chat_template_load: bad arguments");
  *out = NULL;
  char path[4096];
  char *src = NULL;
  size_t src_len = 0;
  const char *bos = NULL, *eos = NULL;
  json_t *cfg = NULL, *ctj = NULL;
  int rc;

  snprintf(path, sizeof(path), "%s/tokenizer_config.json", model_dir);
  char *cfg_text = NULL;
  size_t cfg_len = 0;
  rc = read_file(path, &cfg_text, &cfg_len, err, errlen);
  if (rc && rc != ANNA_ENOTFOUND) return rc;
  if (cfg_text) {
    json_error_t je;
    /* model_max_length is often 1e30 written as an integer: too big for json_int_t */
    cfg = json_loadb(cfg_text, cfg_len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &je);
    free(cfg_text);
    if (!cfg || !json_is_object(cfg)) {
      json_decref(cfg);
      return anna_err(err, errlen, ANNA_EFORMAT, "%s: invalid JSON (line %d: %s)", path, je.line, je.text);
    }
    bos = token_text(json_object_get(cfg, "bos_token"));
    eos = token_text(json_object_get(cfg, "eos_token"));
  }

  snprintf(path, sizeof(path), "%s/chat_template.jinja", model_dir);
  rc = read_file(path, &src, &src_len, err, errlen);
  if (rc && rc != ANNA_ENOTFOUND) {
    json_decref(cfg);
    return rc;
  }
  const json_t *tpl = NULL;
  if (!src && cfg) tpl = pick_template(json_object_get(cfg, "chat_template"));
  if (!src && !tpl) { /* processor-style chat_template.json */
    snprintf(path, sizeof(path), "%s/chat_template.json", model_dir);
    char *t = NULL;
    size_t tl = 0;
    if (read_file(path, &t, &tl, err, errlen) == 0) {
      ctj = json_loadb(t, tl, 0, NULL);
      free(t);
      if (ctj) tpl = pick_template(json_object_get(ctj, "chat_template"));
    }
  }
  if (!src && !tpl) {
    json_decref(cfg);
    json_decref(ctj);
    return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: no chat template (chat_template.jinja or "
                    "tokenizer_config.json chat_template)", model_dir);
  }
  if (src)
    rc = chat_template_from_source(out, src, src_len, bos, eos, err, errlen);
  else
    rc = chat_template_from_source(out, json_string_value(tpl), json_string_length(tpl), bos, eos,
                                   err, errlen);
  free(src);
  json_decref(cfg);
  json_decref(ctj);
  if (rc) anna_err_prefix(err, errlen, rc, "%s", model_dir);
  return rc;
}

void chat_template_free(chat_template *ct) {
  if (!ct) return;
  jinja_template_free(ct->tpl);
  free(ct->source);
  free(ct->bos_token);
  free(ct->eos_token);
  free(ct);
}

int chat_template_apply(const chat_template *ct, const json_t *messages, const json_t *tools,
                        int add_generation_prompt, const json_t *kwargs, char **out,
                        size_t *out_len, char *err, size_t errlen) {
  if (!ct || !out) return anna_err(err, errlen, ANNA_EINVAL, "chat_template_apply: bad arguments");
  if (kwargs && !json_is_object(kwargs))
    return anna_err(err, errlen, ANNA_EINVAL, "chat_template_apply: kwargs must be a JSON object");
  json_t *vars = json_object();
  if (!vars) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  int bad = 0;
  bad |= messages ? json_object_set(vars, "messages", (json_t *)messages)
                  : json_object_set_new(vars, "messages", json_array());
  bad |= tools ? json_object_set(vars, "tools", (json_t *)tools)
               : json_object_set_new(vars, "tools", json_null());
  bad |= json_object_set_new(vars, "documents", json_null());
  bad |= json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
  if (ct->bos_token) bad |= json_object_set_new(vars, "bos_token", json_string(ct->bos_token));
  if (ct->eos_token) bad |= json_object_set_new(vars, "eos_token", json_string(ct->eos_token));
  if (kwargs) bad |= json_object_update(vars, (json_t *)kwargs);
  if (bad) {
    json_decref(vars);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory building template variables");
  }
  int rc = jinja_template_render(ct->tpl, vars, out, out_len, err, errlen);
  json_decref(vars);
  return rc;
}
