/* anna-template: renders a model's chat template for a conversation (like transformers'
 * apply_chat_template(tokenize=False)) and prints the text exactly, without a newline. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anna/anna.h"
#include "cli_common.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: anna-template (--model-dir DIR | --hf-repo ORG/NAME | --template FILE) --messages FILE.json\n"
          "                     [--tools FILE.json] [--add-generation-prompt]\n"
          "                     [--kwargs '{\"enable_thinking\":false}']\n"
          "                     [--bos-token TEXT] [--eos-token TEXT]\n"
          "   or: anna-template --template FILE --vars FILE.json   (all template variables)\n");
}

static json_t *load_json(const char *path, const char *what) {
  json_error_t je;
  json_t *j = json_load_file(path, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
  if (!j) fprintf(stderr, "anna-template: %s %s: line %d: %s\n", what, path, je.line, je.text);
  return j;
}

/* JSON text for anna.h: 17-digit reals and key order kept, so the template sees the file's
 * values exactly. Caller frees; NULL when out of memory. */
static char *dump(const json_t *j) { return json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY); }

static int oom(char *err, size_t errlen) {
  snprintf(err, errlen, "out of memory");
  return ANNA_ENOMEM;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (n < cap) break;
    char *nb = realloc(buf, cap * 2);
    if (!nb) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = nb;
    cap *= 2;
  }
  fclose(f);
  if (buf) *len = n;
  return buf;
}

int main(int argc, char **argv) {
  const char *model_dir = NULL, *tpl_path = NULL, *msgs_path = NULL, *tools_path = NULL;
  const char *kwargs_text = NULL, *vars_path = NULL, *bos = NULL, *eos = NULL, *hf = NULL;
  int add_gen = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--add-generation-prompt")) add_gen = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (v && !strcmp(a, "--model-dir")) model_dir = argv[++i];
    else if (v && !strcmp(a, "--hf-repo")) hf = argv[++i];
    else if (v && !strcmp(a, "--template")) tpl_path = argv[++i];
    else if (v && !strcmp(a, "--messages")) msgs_path = argv[++i];
    else if (v && !strcmp(a, "--tools")) tools_path = argv[++i];
    else if (v && !strcmp(a, "--kwargs")) kwargs_text = argv[++i];
    else if (v && !strcmp(a, "--vars")) vars_path = argv[++i];
    else if (v && !strcmp(a, "--bos-token")) bos = argv[++i];
    else if (v && !strcmp(a, "--eos-token")) eos = argv[++i];
    else {
      fprintf(stderr, "anna-template: unknown or incomplete argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (cli_hf_model(hf, &model_dir)) return 1;
  if ((!model_dir) == (!tpl_path) || (!msgs_path && !vars_path)) {
    usage(stderr);
    return 2;
  }
  char err[512] = {0};
  anna_chat_template *ct = NULL;
  int rc;
  if (model_dir) rc = anna_chat_template_load(&ct, model_dir, err, sizeof(err));
  else {
    size_t len = 0;
    char *src = slurp(tpl_path, &len);
    if (!src) {
      fprintf(stderr, "anna-template: cannot read %s\n", tpl_path);
      return 1;
    }
    rc = anna_chat_template_from_source(&ct, src, len, bos, eos, err, sizeof(err));
    free(src);
  }
  if (rc) {
    fprintf(stderr, "anna-template: %s\n", err);
    return 1;
  }
  char *out = NULL;
  size_t out_len = 0;
  if (vars_path) {
    json_t *vars = load_json(vars_path, "vars");
    if (!vars) return anna_chat_template_free(ct), 1;
    char *vj = dump(vars);
    rc = vj ? anna_chat_template_render_vars(ct, vj, &out, &out_len, err, sizeof(err)) : oom(err, sizeof err);
    free(vj);
    json_decref(vars);
  } else {
    json_t *msgs = load_json(msgs_path, "messages");
    json_t *tools = tools_path ? load_json(tools_path, "tools") : NULL;
    json_t *kw = NULL;
    if (kwargs_text) {
      json_error_t je;
      kw = json_loads(kwargs_text, 0, &je);
      if (!kw || !json_is_object(kw)) fprintf(stderr, "anna-template: --kwargs: not a JSON object\n");
    }
    if (!msgs || (tools_path && !tools) || (kwargs_text && (!kw || !json_is_object(kw)))) rc = ANNA_EINVAL;
    else {
      char *mj = dump(msgs), *tj = tools ? dump(tools) : NULL, *kj = kw ? dump(kw) : NULL;
      rc = !mj || (tools && !tj) || (kw && !kj)
               ? oom(err, sizeof err)
               : anna_chat_template_render(ct, mj, tj, add_gen, kj, &out, &out_len, err, sizeof(err));
      free(mj);
      free(tj);
      free(kj);
    }
    json_decref(msgs);
    json_decref(tools);
    json_decref(kw);
  }
  anna_chat_template_free(ct);
  if (rc) {
    if (err[0]) fprintf(stderr, "anna-template: %s\n", err);
    return 1;
  }
  fwrite(out, 1, out_len, stdout);
  free(out);
  return 0;
}
