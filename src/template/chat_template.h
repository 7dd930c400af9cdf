/* chat_template.h: the chat template of a model folder, ready to render conversations.
 *
 * Loads the template the way transformers finds it: `chat_template.jinja` in the folder, else
 * `chat_template` in tokenizer_config.json (a string, or a list of {name, template} from
 * which "default" is taken), else chat_template.json. bos_token / eos_token come from
 * tokenizer_config.json (plain strings or {"content": ...} objects). A loaded chat_template
 * is immutable: render it from any number of threads.
 */
#ifndef ANNA_TEMPLATE_CHAT_TEMPLATE_H
#define ANNA_TEMPLATE_CHAT_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>

#include "template/jinja.h"

typedef struct chat_template {
  jinja_template *tpl; /* parsed template (owned) */
  char *source;        /* template text, NUL-terminated (owned) */
  size_t source_len;
  char *bos_token; /* NULL when the config has none (owned) */
  char *eos_token; /* NULL when the config has none (owned) */
} chat_template;

/* Loads and parses the chat template of model_dir. *out: caller frees with
 * chat_template_free. ANNA_ENOTFOUND when the folder has no template. */
int chat_template_load(chat_template **out, const char *model_dir, char *err, size_t errlen);

/* Builds a chat_template from template text (copied) and optional tokens (copied; NULL =
 * none). *out: caller frees with chat_template_free. */
int chat_template_from_source(chat_template **out, const char *src, size_t len,
                              const char *bos_token, const char *eos_token, char *err,
                              size_t errlen);

void chat_template_free(chat_template *ct);

/* Renders a conversation as transformers' apply_chat_template(tokenize=False) does: the
 * template sees messages, tools (None when NULL), documents (None), add_generation_prompt,
 * bos_token, eos_token, and every key of kwargs (a JSON object or NULL; its keys override
 * the others). messages/tools/kwargs are borrowed. *out: NUL-terminated, caller frees. */
int chat_template_apply(const chat_template *ct, const json_t *messages, const json_t *tools,
                        int add_generation_prompt, const json_t *kwargs, char **out,
                        size_t *out_len, char *err, size_t errlen);

#endif
