/* test_template: the Jinja interpreter against outputs of jinja2 as transformers runs it.
 *
 * 1. fixtures/tokenizer/expected.json chat cases (byte-identical render).
 * 2. data/cases.json: {template (inline text or "@file"), vars, expected | error} produced by
 *    data/gen_expected.py with jinja2 + transformers' environment: unit cases and real model
 *    templates over several conversations.
 * 3. malformed templates: an error naming the line, never a crash.
 * 4. limits: huge loops, deep recursion and huge output end in errors.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "template/chat_template.h"
#include "template/jinja.h"

static int failures, checks;

static void show_diff(const char *want, size_t wl, const char *got, size_t gl) {
  size_t i = 0;
  while (i < wl && i < gl && want[i] == got[i]) i++;
  size_t from = i > 60 ? i - 60 : 0;
  fprintf(stderr, "    first difference at byte %zu\n    want: ...%.*s\n    got:  ...%.*s\n", i,
          (int)((wl - from) > 160 ? 160 : wl - from), want + from, (int)((gl - from) > 160 ? 160 : gl - from),
          got + from);
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  char *b = malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  if (b) {
    b[n] = 0;
    *len = (size_t)n;
  }
  return b;
}

static void test_fixture_chat(const char *fixtures) {
  char path[1024], err[512];
  snprintf(path, sizeof(path), "%s/tokenizer/expected.json", fixtures);
  json_error_t je;
  json_t *exp = json_load_file(path, JSON_ALLOW_NUL, &je);
  if (!exp) {
    fprintf(stderr, "FAIL cannot load %s\n", path);
    failures++;
    return;
  }
  snprintf(path, sizeof(path), "%s/tokenizer", fixtures);
  chat_template *ct = NULL;
  if (chat_template_load(&ct, path, err, sizeof(err))) {
    fprintf(stderr, "FAIL load %s: %s\n", path, err);
    failures++;
    json_decref(exp);
    return;
  }
  size_t i;
  json_t *c;
  json_array_foreach(json_object_get(exp, "chat"), i, c) {
    json_t *kw = json_object();
    if (json_object_get(c, "enable_thinking"))
      json_object_set(kw, "enable_thinking", json_object_get(c, "enable_thinking"));
    char *out = NULL;
    size_t n = 0;
    checks++;
    int rc = chat_template_apply(ct, json_object_get(c, "messages"), json_object_get(c, "tools"),
                                 json_is_true(json_object_get(c, "add_generation_prompt")), kw, &out,
                                 &n, err, sizeof(err));
    const char *want = json_string_value(json_object_get(c, "rendered"));
    if (rc) {
      fprintf(stderr, "FAIL fixture chat %zu: %s\n", i, err);
      failures++;
    } else if (!want || strlen(want) != n || memcmp(want, out, n) != 0) {
      fprintf(stderr, "FAIL fixture chat %zu: output differs\n", i);
      show_diff(want ? want : "", want ? strlen(want) : 0, out, n);
      failures++;
    }
    free(out);
    json_decref(kw);
  }
  chat_template_free(ct);
  json_decref(exp);
}

static void test_cases(const char *data_dir, const char *file) {
  char path[1024], err[512];
  snprintf(path, sizeof(path), "%s/%s", data_dir, file);
  json_error_t je;
  json_t *cases = json_load_file(path, JSON_ALLOW_NUL, &je);
  if (!cases) {
    fprintf(stderr, "FAIL cannot load %s: line %d: %s\n", path, je.line, je.text);
    failures++;
    return;
  }
  json_t *vars_sets = NULL, *list = cases;
  if (json_is_object(cases)) { /* {vars_sets: {id: vars}, cases: [... vars_id ...]} */
    vars_sets = json_object_get(cases, "vars_sets");
    list = json_object_get(cases, "cases");
  }
  size_t i, nfail = 0, n = 0;
  json_t *c;
  json_array_foreach(list, i, c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    if (json_object_get(c, "pyerror")) continue; /* jinja2 itself failed: nothing to compare */
    const char *tsrc = json_string_value(json_object_get(c, "template"));
    size_t tlen = json_string_length(json_object_get(c, "template"));
    char *file_src = NULL;
    if (tsrc && tsrc[0] == '@') {
      snprintf(path, sizeof(path), "%s/%s", data_dir, tsrc + 1);
      file_src = slurp(path, &tlen);
      if (!file_src) {
        fprintf(stderr, "FAIL %s: cannot read %s\n", name, path);
        failures++;
        continue;
      }
      tsrc = file_src;
    }
    const char *want = json_string_value(json_object_get(c, "expected"));
    size_t want_len = json_string_length(json_object_get(c, "expected"));
    int want_err = json_is_string(json_object_get(c, "error"));
    jinja_template *t = NULL;
    char *out = NULL;
    size_t out_len = 0;
    checks++;
    n++;
    int rc = jinja_template_parse(&t, tsrc ? tsrc : "", tsrc ? tlen : 0, err, sizeof(err));
    json_t *vars = json_object_get(c, "vars");
    const char *vid = json_string_value(json_object_get(c, "vars_id"));
    if (vid && vars_sets) vars = json_object_get(vars_sets, vid);
    /* The references were rendered by jinja2 on 2026-11-30 (UTC); templates that print the
     * date (strftime_now) see that day. */
    const jinja_limits pin = {.now_unix = 1796040000}; /* 2026-11-30T12:00:00Z */
    if (!rc) rc = jinja_template_render_ex(t, vars, &pin, &out, &out_len, err, sizeof(err));
    int bad = 0;
    if (want_err) {
      if (!rc) {
        fprintf(stderr, "FAIL %s: expected an error (%s), got output\n", name,
                json_string_value(json_object_get(c, "error")));
        bad = 1;
      } else if (!strstr(err, "line ")) {
        fprintf(stderr, "FAIL %s: error without line number: %s\n", name, err);
        bad = 1;
      }
    } else if (rc) {
      fprintf(stderr, "FAIL %s: %s\n", name, err);
      bad = 1;
    } else if (!want || want_len != out_len || memcmp(want, out, out_len) != 0) {
      fprintf(stderr, "FAIL %s: output differs\n", name);
      show_diff(want ? want : "", want_len, out, out_len);
      bad = 1;
    }
    nfail += (size_t)bad;
    free(out);
    jinja_template_free(t);
    free(file_src);
  }
  failures += (int)nfail;
  printf("%s: %zu/%zu cases pass\n", file, n - nfail, n);
  json_decref(cases);
}

static void expect_error(const char *name, const char *src, int want_line, int want_code) {
  jinja_template *t = NULL;
  char err[512] = {0};
  char *out = NULL;
  size_t n;
  checks++;
  int rc = jinja_template_parse(&t, src, strlen(src), err, sizeof(err));
  if (!rc) {
    json_t *vars = json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", "hi");
    rc = jinja_template_render(t, vars, &out, &n, err, sizeof(err));
    json_decref(vars);
  }
  char needle[32];
  snprintf(needle, sizeof(needle), "line %d:", want_line);
  if (!rc) {
    fprintf(stderr, "FAIL %s: no error\n", name);
    failures++;
  } else if (want_line > 0 && !strstr(err, needle)) {
    fprintf(stderr, "FAIL %s: wanted '%s' in: %s\n", name, needle, err);
    failures++;
  } else if (want_code && rc != want_code) {
    fprintf(stderr, "FAIL %s: code %d, wanted %d (%s)\n", name, rc, want_code, err);
    failures++;
  }
  free(out);
  jinja_template_free(t);
}

static void test_errors(void) {
  expect_error("unclosed if", "a\n{% if x %}\nb", 3, ANNA_EFORMAT);
  expect_error("unclosed for", "{% for x in y %}", 1, ANNA_EFORMAT);
  expect_error("bad endfor", "line1\n{% if x %}{% endfor %}", 2, ANNA_EFORMAT);
  expect_error("unclosed var", "\n\n{{ x ", 3, ANNA_EFORMAT);
  expect_error("unclosed comment", "{# never", 1, ANNA_EFORMAT);
  expect_error("unknown filter", "\n{{ x | nosuchfilter }}", 2, ANNA_EINVAL);
  expect_error("unknown test", "{{ x is nosuchtest }}", 1, ANNA_EINVAL);
  expect_error("bad token", "{{ x $ y }}", 1, ANNA_EFORMAT);
  expect_error("unbalanced", "{{ (x }}", 1, ANNA_EFORMAT);
  expect_error("stray close", "{{ x) }}", 1, ANNA_EFORMAT);
  expect_error("unterminated string", "{{ 'abc }}", 1, ANNA_EFORMAT);
  expect_error("break outside loop", "{% break %}", 1, ANNA_EFORMAT);
  expect_error("unknown tag", "\n\n\n{% frobnicate %}", 4, ANNA_EFORMAT);
  expect_error("raise_exception", "ok\n{{ raise_exception('Only user and assistant roles') }}", 2, ANNA_EINVAL);
  expect_error("type error", "{{ 1 + 'a' }}", 1, ANNA_EINVAL);
  expect_error("div zero", "{{ 1 // 0 }}", 1, ANNA_EINVAL);
  expect_error("huge loop", "{% for i in range(10**9) %}{% endfor %}", 1, ANNA_ERANGE);
  expect_error("huge loop 2", "{% for i in range(9999999) %}{% for j in range(100) %}{% endfor %}{% endfor %}", 1,
               ANNA_ERANGE);
  expect_error("recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", 1, ANNA_ERANGE);
  expect_error("output blowup", "{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}", 1,
               ANNA_ERANGE);
  expect_error("string blowup", "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(64) %}"
               "{% set ns.s = ns.s ~ ns.s %}{% endfor %}", 1, ANNA_ERANGE);
  expect_error("scan blowup", "{% set s = 'x' * 16000000 %}{% for i in range(9000000) %}{% if 'y' in s %}{% endif %}"
               "{% endfor %}", 1, ANNA_ERANGE);
  expect_error("unique blowup", "{{ range(1000000) | unique | list | length }}", 1, ANNA_ERANGE);
  expect_error("deep nesting", "{{ ((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
               "((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
               "((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
               "1 }}", 1, ANNA_EFORMAT);
}

static void expect_output(const char *name, const char *src, const char *want) {
  jinja_template *t = NULL;
  char err[512] = {0};
  char *out = NULL;
  size_t n = 0;
  checks++;
  int rc = jinja_template_parse(&t, src, strlen(src), err, sizeof(err));
  if (!rc) rc = jinja_template_render(t, NULL, &out, &n, err, sizeof(err));
  if (rc) {
    fprintf(stderr, "FAIL %s: %s\n", name, err);
    failures++;
  } else if (strlen(want) != n || memcmp(want, out, n) != 0) {
    fprintf(stderr, "FAIL %s: got '%s', want '%s'\n", name, out, want);
    failures++;
  }
  free(out);
  jinja_template_free(t);
}

/* Things jinja2 under transformers cannot render (its sandbox forbids list.append) but that
 * must work or at least not crash here. */
static void test_extras(void) {
  expect_output("append", "{% set l = [] %}{% set _ = l.append(1) %}{{ l.append(2) }}{{ l }}", "None[1, 2]");
  expect_output("self cycle", "{% set l = [1] %}{% set _ = l.append(l) %}{{ (l | string)[:12] }}|{{ l == l }}",
                "[1, [1, [1, |True");
  expect_output("loop.cycle", "{% for i in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}", "ababa");
  expect_output("call block",
                "{% macro box(t) %}[{{ t }}:{{ caller('x') }}]{% endmacro %}{% call(v) box('T') %}in-{{ v }}{% endcall %}",
                "[T:in-x]");
  expect_output("splat", "{% macro f(a, b, c=3) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ f(*[1, 2]) }}{{ f(**{'a': 4, 'b': 5, 'c': 6}) }}",
                "123456");
  /* a 20000-branch elif chain must neither overflow the parser's nor the renderer's stack */
  size_t n = 20000, cap = n * 24 + 64;
  char *src = malloc(cap);
  size_t o = (size_t)snprintf(src, cap, "{%% if false %%}");
  for (size_t i = 0; i < n; i++) o += (size_t)snprintf(src + o, cap - o, "{%% elif %s %%}%zu", i + 1 == n ? "true" : "false", i);
  snprintf(src + o, cap - o, "{%% endif %%}");
  char want[16];
  snprintf(want, sizeof(want), "%zu", n - 1);
  expect_output("long elif chain", src, want);
  free(src);
}

static void write_file(const char *dir, const char *name, const char *text) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

/* chat_template_load: list-form chat_template, AddedToken-style bos/eos, huge
 * model_max_length, and chat_template.jinja taking precedence. */
static void test_loader(void) {
  char dir[] = "/tmp/anna_tpl_XXXXXX";
  char err[512];
  checks++;
  if (!mkdtemp(dir)) {
    fprintf(stderr, "FAIL loader: mkdtemp\n");
    failures++;
    return;
  }
  write_file(dir, "tokenizer_config.json",
             "{\"model_max_length\": 1000000000000000019884624838656,"
             " \"bos_token\": {\"content\": \"<B>\", \"lstrip\": false},"
             " \"eos_token\": \"<E>\","
             " \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
             "                     {\"name\": \"default\", \"template\": \"{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ add_generation_prompt }}\"}]}");
  chat_template *ct = NULL;
  char *out = NULL;
  size_t n;
  json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", "hey");
  int rc = chat_template_load(&ct, dir, err, sizeof(err));
  if (!rc) rc = chat_template_apply(ct, msgs, NULL, 1, NULL, &out, &n, err, sizeof(err));
  if (rc || strcmp(out, "<B>hey<E>True") != 0) {
    fprintf(stderr, "FAIL loader (config list): %s\n", rc ? err : out);
    failures++;
  }
  free(out);
  out = NULL;
  chat_template_free(ct);
  ct = NULL;
  checks++;
  write_file(dir, "chat_template.jinja", "J:{{ messages | length }}{{ extra }}\n");
  json_t *kw = json_pack("{s:s}", "extra", "!");
  rc = chat_template_load(&ct, dir, err, sizeof(err));
  if (!rc) rc = chat_template_apply(ct, msgs, NULL, 0, kw, &out, &n, err, sizeof(err));
  if (rc || strcmp(out, "J:1!") != 0) {
    fprintf(stderr, "FAIL loader (jinja file): %s\n", rc ? err : out);
    failures++;
  }
  free(out);
  chat_template_free(ct);
  checks++;
  char path[512];
  snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
  remove(path);
  snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
  remove(path);
  if (chat_template_load(&ct, dir, err, sizeof(err)) != ANNA_ENOTFOUND) {
    fprintf(stderr, "FAIL loader: empty folder should be ANNA_ENOTFOUND (%s)\n", err);
    failures++;
  }
  rmdir(dir);
  json_decref(kw);
  json_decref(msgs);
}

/* Rendering the same template concurrently would race if the AST were mutated; this only
 * checks that repeated renders are identical. */
static void test_repeat(void) {
  const char *src = "{% for m in messages %}{{ loop.index }}:{{ m.content }};{% endfor %}";
  jinja_template *t = NULL;
  char err[256];
  checks++;
  if (jinja_template_parse(&t, src, strlen(src), err, sizeof(err))) {
    fprintf(stderr, "FAIL repeat parse: %s\n", err);
    failures++;
    return;
  }
  json_t *vars = json_pack("{s:[{s:s},{s:s}]}", "messages", "content", "a", "content", "b");
  for (int k = 0; k < 3; k++) {
    char *out = NULL;
    size_t n;
    if (jinja_template_render(t, vars, &out, &n, err, sizeof(err)) || strcmp(out, "1:a;2:b;") != 0) {
      fprintf(stderr, "FAIL repeat render %d: %s\n", k, out ? out : err);
      failures++;
    }
    free(out);
  }
  json_decref(vars);
  jinja_template_free(t);
}

int main(int argc, char **argv) {
  const char *fixtures = argc > 1 ? argv[1] : "../shared/fixtures";
  if (argc > 2) { /* extra sweep: test_template FIXTURES CASES.json (template paths absolute) */
    test_cases("", argv[2]);
    printf("test_template: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
  }
  test_fixture_chat(fixtures);
  test_cases(ANNA_TEMPLATE_DATA, "unit_cases.json");
  test_cases(ANNA_TEMPLATE_DATA, "model_cases.json");
  test_errors();
  test_extras();
  test_loader();
  test_repeat();
  printf("test_template: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
