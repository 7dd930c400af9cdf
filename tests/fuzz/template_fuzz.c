/* template_fuzz: libFuzzer target for the Jinja parser and renderer (not built by default).
 *
 *   clang -fsanitize=fuzzer,address,undefined -Isrc -Iinclude tests/fuzz/template_fuzz.c \
 *         src/template/jinja_*.c src/base/error.c -ljansson -lutf8proc -lm -o template_fuzz
 *   ./template_fuzz -max_total_time=300 -max_len=8192 CORPUS_DIR tests/template/data/templates
 *
 * The input is a template; it is rendered with a fixed conversation (system, user, assistant
 * with tool calls, tool result) and tools, under small limits so that each run stays fast. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "template/jinja.h"

static json_t *vars;

static const char *VARS_JSON =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are helpful.\"},"
    "{\"role\": \"user\", \"content\": \"Hi \\u00e9\\u2603 <b>\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>\\nhm\\n</think>\\n\\nOK\", \"reasoning_content\": \"hm\","
    " \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\","
    " \"arguments\": {\"a\": 1, \"b\": [1.5, null, true]}}}]},"
    "{\"role\": \"tool\", \"content\": \"42\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"part\"}]}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}],"
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    "\"enable_thinking\": false, \"documents\": null}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!vars) vars = json_loads(VARS_JSON, 0, NULL);
  jinja_template *t = NULL;
  char err[256];
  if (jinja_template_parse(&t, (const char *)data, size, err, sizeof(err)) == 0) {
    jinja_limits lim = {.max_output = 1 << 20, .max_steps = 200000, .max_depth = 100,
                        .max_memory = 64 << 20};
    char *out = NULL;
    size_t n = 0;
    jinja_template_render_ex(t, vars, &lim, &out, &n, err, sizeof(err));
    free(out);
    jinja_template_free(t);
  }
  return 0;
}
