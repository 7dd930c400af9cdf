/* jinja.h: a Jinja2 interpreter for model chat templates.
 *
 * Covers the subset of Jinja2 that released chat templates use, rendered the way Hugging Face
 * transformers renders them (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False,
 * loopcontrols, a `generation` block tag, transformers' tojson/raise_exception/strftime_now,
 * Python-compatible printing of values). A parsed template is immutable and may be rendered
 * many times, from several threads at once. Every render owns its own memory and is bounded
 * (output size, loop iterations, call depth): a hostile template yields an error, never a hang
 * or a crash. Errors carry the template line number ("line N: ...").
 */
#ifndef ANNA_TEMPLATE_JINJA_H
#define ANNA_TEMPLATE_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct jinja_template jinja_template;

/* Limits (and the clock) of one render; zero fields take the defaults below. */
typedef struct jinja_limits {
  size_t max_output;    /* bytes of rendered text (default 16 MiB) */
  int64_t max_steps;    /* loop iterations + calls + statements (default 10 million) */
  int max_depth;        /* nesting of macro calls / expression recursion (default 200) */
  size_t max_memory;    /* bytes of values a render may allocate (default 256 MiB) */
  int64_t now_unix;     /* what strftime_now() reads: seconds since the epoch, formatted in UTC
                         * (default 0: the system clock in local time); tests pin it */
} jinja_limits;

/* Parses src[0..len) (UTF-8). On success *out owns the template (free with
 * jinja_template_free). On error returns ANNA_EFORMAT (or ANNA_ENOMEM) and a message with the
 * line number in err; *out is NULL. */
int jinja_template_parse(jinja_template **out, const char *src, size_t len, char *err,
                         size_t errlen);

/* Renders with the variables of the JSON object vars (borrowed; NULL = none), e.g. messages,
 * tools, add_generation_prompt, bos_token, eos_token, enable_thinking. On success *out is a
 * NUL-terminated string (caller frees) of *out_len bytes. raise_exception(msg) in the template
 * returns ANNA_EINVAL with msg in err; limits exceeded return ANNA_ERANGE. */
int jinja_template_render(const jinja_template *tpl, const json_t *vars, char **out,
                          size_t *out_len, char *err, size_t errlen);

/* As jinja_template_render with explicit limits (borrowed; NULL = defaults). */
int jinja_template_render_ex(const jinja_template *tpl, const json_t *vars,
                             const jinja_limits *limits, char **out, size_t *out_len, char *err,
                             size_t errlen);

void jinja_template_free(jinja_template *tpl);

#endif
