/* test_outparse: the <think>/<tool_call> splitter behind chat responses. Every case is fed
 * whole, byte by byte, and in 3-byte pieces: the results must be identical, since the
 * stream renderer sees arbitrary token boundaries. */
#include "server/outparse.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct out {
  char content[4096], reasoning[4096], calls[4096];
  int n_calls;
  char args[4096]; /* incremental: the current call's argument pieces so far */
  int in_call, bad_args;
} out;

/* Arguments must be one JSON object text that a standard parser reads back (issue 30). */
static int args_ok(const char *b, size_t blen) {
  json_error_t je;
  json_t *o = json_loadb(b, blen, JSON_ALLOW_NUL, &je);
  int ok = json_is_object(o);
  json_decref(o);
  return ok;
}

static void close_call(out *o) {
  if (!o->in_call) return;
  size_t cur = strlen(o->calls);
  if (!args_ok(o->args, strlen(o->args))) o->bad_args++;
  snprintf(o->calls + cur, 4096 - cur, "(%s);", o->args);
  o->in_call = 0;
}

static int sink(void *ud, int kind, const char *a, size_t alen, const char *b, size_t blen) {
  out *o = ud;
  if (kind == OUTPARSE_TOOL_NAME) {
    close_call(o);
    size_t cur = strlen(o->calls);
    snprintf(o->calls + cur, 4096 - cur, "%.*s", (int)alen, a);
    o->args[0] = '\0';
    o->in_call = 1;
    o->n_calls++;
    return 0;
  }
  if (kind == OUTPARSE_TOOL_ARGS) {
    size_t cur = strlen(o->args);
    snprintf(o->args + cur, 4096 - cur, "%.*s", (int)alen, a);
    return 0;
  }
  close_call(o);
  if (kind == OUTPARSE_TOOL_CALL && !args_ok(b, blen)) o->bad_args++;
  char *dst = kind == OUTPARSE_CONTENT     ? o->content
              : kind == OUTPARSE_REASONING ? o->reasoning
                                           : o->calls;
  size_t cur = strlen(dst);
  if (kind == OUTPARSE_TOOL_CALL) {
    o->n_calls++;
    snprintf(dst + cur, 4096 - cur, "%.*s(%.*s);", (int)alen, a, (int)blen, b);
  } else {
    snprintf(dst + cur, 4096 - cur, "%.*s", (int)alen, a);
  }
  return 0;
}

static int run(const char *text, int reasoning, int start, int tools, size_t piece, out *o) {
  memset(o, 0, sizeof *o);
  outparse *p = outparse_new(reasoning, start, tools);
  if (!p) return -1;
  size_t n = strlen(text);
  int rc = 0;
  if (piece == 0) piece = n ? n : 1;
  for (size_t at = 0; at < n && !rc; at += piece) {
    size_t k = n - at < piece ? n - at : piece;
    rc = outparse_feed(p, text + at, k, 0, sink, o);
  }
  if (!rc) rc = outparse_feed(p, NULL, 0, 1, sink, o);
  outparse_free(p);
  return rc;
}

static int failures = 0;

/* A family parser over text in pieces of `piece` bytes (0: whole). */
static int run_opts(const char *text, size_t n, const outparse_options *opt, size_t piece, out *o) {
  memset(o, 0, sizeof *o);
  outparse *p = outparse_new_opts(opt);
  if (!p) return -1;
  int rc = 0;
  if (piece == 0) piece = n ? n : 1;
  for (size_t at = 0; at < n && !rc; at += piece) {
    size_t k = n - at < piece ? n - at : piece;
    rc = outparse_feed(p, text + at, k, 0, sink, o);
  }
  if (!rc) rc = outparse_feed(p, NULL, 0, 1, sink, o);
  close_call(o);
  outparse_free(p);
  return rc;
}

/* Every piece size, whole calls and incremental ones: the same split, and arguments that
 * parse as a JSON object. tools_json: the request's tools (qwen3_coder typing). */
static void checkf(const char *name, const char *text, size_t n, int tools, int reasoning, int start,
                   const char *tools_json, const char *want_content, const char *want_reasoning,
                   const char *want_calls) {
  size_t pieces[] = {0, 1, 3, 7};
  for (int inc = 0; inc < 2; inc++)
    for (int k = 0; k < 4; k++) {
      outparse_options opt = {.tools = tools, .reasoning = reasoning, .start_in_reasoning = start,
                              .incremental = inc, .tools_json = tools_json};
      out o;
      int rc = run_opts(text, n, &opt, pieces[k], &o);
      if (rc || o.bad_args || strcmp(o.content, want_content) || strcmp(o.reasoning, want_reasoning) ||
          strcmp(o.calls, want_calls)) {
        printf("FAIL %s (piece %zu, incremental %d): rc=%d bad_args=%d\n  content   [%s] want [%s]\n"
               "  reasoning [%s] want [%s]\n  calls     [%s] want [%s]\n",
               name, pieces[k], inc, rc, o.bad_args, o.content, want_content, o.reasoning, want_reasoning, o.calls,
               want_calls);
        failures++;
        return;
      }
    }
  printf("ok   %s\n", name);
}
#define CHECKF(name, text, ...) checkf(name, text, sizeof text - 1, __VA_ARGS__)

/* The qwen3_coder parser streams: the name as soon as <function=NAME> is in, each parameter
 * as its </parameter> comes, before the call closes. */
static void check_q3_streams(void) {
  static const char part[] = "Sure.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<param";
  outparse_options opt = {.tools = OUTPARSE_TOOLS_QWEN3_CODER, .incremental = 1};
  outparse *p = outparse_new_opts(&opt);
  out o;
  memset(&o, 0, sizeof o);
  int rc = outparse_feed(p, part, sizeof part - 1, 0, sink, &o);
  int ok = !rc && !strcmp(o.content, "Sure.") && !strcmp(o.calls, "get_weather") && !strcmp(o.args, "{\"city\":\"Paris\"");
  rc = outparse_feed(p, "eter=days>\n3\n</parameter>\n</function>\n</tool_call>", 50, 1, sink, &o);
  close_call(&o);
  ok = ok && !rc && !strcmp(o.calls, "get_weather({\"city\":\"Paris\",\"days\":\"3\"});");
  outparse_free(p);
  if (!ok) {
    printf("FAIL qwen3_coder streams name and parameters early: calls [%s] args [%s]\n", o.calls, o.args);
    failures++;
  } else
    printf("ok   qwen3_coder streams name and parameters early\n");
}

static void check(const char *name, const char *text, int reasoning, int start, int tools,
                  const char *want_content, const char *want_reasoning, const char *want_calls) {
  size_t pieces[] = {0, 1, 3};
  for (int k = 0; k < 3; k++) {
    out o;
    int rc = run(text, reasoning, start, tools, pieces[k], &o);
    if (rc || strcmp(o.content, want_content) || strcmp(o.reasoning, want_reasoning) ||
        strcmp(o.calls, want_calls)) {
      printf("FAIL %s (piece %zu): rc=%d\n  content   [%s] want [%s]\n  reasoning [%s] want [%s]\n "
             " calls     [%s] want [%s]\n",
             name, pieces[k], rc, o.content, want_content, o.reasoning, want_reasoning, o.calls,
             want_calls);
      failures++;
      return;
    }
  }
  printf("ok   %s\n", name);
}

int main(void) {
  check("plain text", "Hello, world <b>bold</b>", 1, 0, 1, "Hello, world <b>bold</b>", "", "");
  check("json tool call",
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
        "\"Paris\"}}\n</tool_call>",
        0, 0, 1, "Let me check.\n", "", "get_weather({\"city\":\"Paris\"});");
  check("two json calls",
        "<tool_call>{\"name\":\"a\",\"arguments\":{}}</"
        "tool_call>\n<tool_call>{\"name\":\"b\",\"arguments\":{\"x\":1}}</tool_call>",
        0, 0, 1, "\n", "", "a({});b({\"x\":1});");
  check("arguments as a string",
        "<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"q\\\": 2}\"}</tool_call>", 0, 0, 1, "", "",
        "f({\"q\":2});");
  /* issue 30 item 5: string-valued arguments reach the client only as JSON object text. */
  check("string arguments that are not json stay content",
        "<tool_call>{\"name\":\"f\",\"arguments\":\"not json\"}</tool_call>", 0, 0, 1,
        "<tool_call>{\"name\":\"f\",\"arguments\":\"not json\"}</tool_call>", "", "");
  check("string arguments holding an array stay content",
        "<tool_call>{\"name\":\"f\",\"arguments\":\"[1]\"}</tool_call>", 0, 0, 1,
        "<tool_call>{\"name\":\"f\",\"arguments\":\"[1]\"}</tool_call>", "", "");
  check("string arguments with a lone surrogate stay content",
        "<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"q\\\": \\\"\\\\ud800\\\"}\"}</tool_call>", 0, 0, 1,
        "<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"q\\\": \\\"\\\\ud800\\\"}\"}</tool_call>", "", "");
  check("parameters key", "<tool_call>{\"name\":\"f\",\"parameters\":{\"q\":true}}</tool_call>", 0,
        0, 1, "", "", "f({\"q\":true});");
  check("qwen3.5 xml call",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, "
        "France\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "<parameter=opts>\n{\"metric\": true}\n</parameter>\n</function>\n</tool_call>",
        0, 0, 1, "", "",
        "get_weather({\"city\":\"Paris, France\",\"days\":3,\"opts\":{\"metric\":true}});");
  check("xml multi-line string value",
        "<tool_call><function=write><parameter=text>\nline1\nline2\n</parameter></function></"
        "tool_call>",
        0, 0, 1, "", "", "write({\"text\":\"line1\\nline2\"});");
  check("unterminated call that parses", "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":\"b\"}}",
        0, 0, 1, "", "", "f({\"a\":\"b\"});");
  check("garbage call stays content", "x<tool_call>not json</tool_call>y", 0, 0, 1,
        "x<tool_call>not json</tool_call>y", "", "");
  check("no name stays content", "<tool_call>{\"arguments\":{}}</tool_call>", 0, 0, 1,
        "<tool_call>{\"arguments\":{}}</tool_call>", "", "");
  check("tools off", "<tool_call>{\"name\":\"f\"}</tool_call>", 0, 0, 0,
        "<tool_call>{\"name\":\"f\"}</tool_call>", "", "");
  check("reasoning", "<think>\nLet me think.\n</think>\n\nThe answer is 4.", 1, 0, 0,
        "The answer is 4.", "\nLet me think.\n", "");
  check("reasoning opened by the prompt", "step 1, step 2</think>\n\nDone", 1, 1, 0, "Done",
        "step 1, step 2", "");
  check("reasoning off keeps tags", "<think>x</think>y", 0, 0, 0, "<think>x</think>y", "", "");
  check("reasoning then call",
        "<think>need weather</think>\n<tool_call>{\"name\":\"w\",\"arguments\":{}}</tool_call>", 1,
        0, 1, "", "need weather", "w({});");
  check("unclosed reasoning", "<think>still going", 1, 0, 0, "", "still going", "");
  check("partial tag at the end", "value <tool_ca", 0, 0, 1, "value <tool_ca", "", "");
  check("less-than that is no tag", "a < b and <to be>", 1, 0, 1, "a < b and <to be>", "", "");
  check("utf-8 around tags",
        "\xc3\xa9t\xc3\xa9 "
        "<tool_call>{\"name\":\"f\",\"arguments\":{\"v\":\"\xe2\x82\xac\"}}</tool_call>",
        0, 0, 1, "\xc3\xa9t\xc3\xa9 ", "", "f({\"v\":\"\xe2\x82\xac\"});");
  check("bare json call", "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", 0,
        0, 1, "", "", "get_weather({\"city\":\"Paris\"});");
  check("bare json, tools off", "{\"name\": \"f\", \"arguments\": {}}", 0, 0, 0,
        "{\"name\": \"f\", \"arguments\": {}}", "", "");
  check("json with other keys is content", "{\"name\": \"f\", \"arguments\": {}, \"x\": 1}", 0, 0,
        1, "{\"name\": \"f\", \"arguments\": {}, \"x\": 1}", "", "");
  check("json after text is content", "Use {\"name\": \"f\", \"arguments\": {}}", 0, 0, 1,
        "Use {\"name\": \"f\", \"arguments\": {}}", "", "");
  check("fenced json call", "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": "
        "\"Paris\"}\n}\n```\n", 0, 0, 1, "", "", "get_weather({\"city\":\"Paris\"});");
  check("fenced call without a language", "  ```\n{\"name\":\"f\",\"arguments\":{}}```", 0, 0, 1, "", "",
        "f({});");
  check("fenced call, tools off", "```json\n{\"name\":\"f\",\"arguments\":{}}\n```", 0, 0, 0,
        "```json\n{\"name\":\"f\",\"arguments\":{}}\n```", "", "");
  check("fenced other language is content", "```python\nprint(1)\n```", 0, 0, 1,
        "```python\nprint(1)\n```", "", "");
  check("fenced json that is no call", "```json\n{\"a\": 1}\n```", 0, 0, 1,
        "```json\n{\"a\": 1}\n```", "", "");
  check("fenced call with text after it", "```json\n{\"name\":\"f\",\"arguments\":{}}\n```\nDone.", 0, 0,
        1, "```json\n{\"name\":\"f\",\"arguments\":{}}\n```\nDone.", "", "");
  check("unclosed fence is content", "```json\n{\"name\":\"f\",\"arguments\":{}}", 0, 0, 1,
        "```json\n{\"name\":\"f\",\"arguments\":{}}", "", "");
  check("short backtick reply", "``", 0, 0, 1, "``", "", "");
  check("json object then tag call",
        "{\"a\":1}<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>", 0, 0, 1, "{\"a\":1}",
        "", "f({});");
  /* ---- families (issue 30 item 2) ---- */
  const int H = OUTPARSE_TOOLS_HERMES, Q = OUTPARSE_TOOLS_QWEN3_CODER, G = OUTPARSE_TOOLS_GEMMA4;
  const int RQ = OUTPARSE_REASONING_QWEN3, RG = OUTPARSE_REASONING_GEMMA4;
  static const char TOOLS[] =
      "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{"
      "\"s\":{\"type\":\"string\"},\"i\":{\"type\":\"integer\"},\"n\":{\"type\":\"number\"},"
      "\"b\":{\"type\":\"boolean\"},\"o\":{\"type\":\"object\"},\"a\":{\"type\":\"array\"},"
      "\"ns\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]},\"ni\":{\"type\":[\"integer\",\"null\"]}}}}}]";
  CHECKF("qwen3_coder typed by schema",
         "<tool_call>\n<function=f>\n<parameter=s>\n42\n</parameter>\n<parameter=i>\n7\n</parameter>\n"
         "<parameter=n>\n2.50\n</parameter>\n<parameter=b>\nTrue\n</parameter>\n<parameter=o>\n{\"k\": [1, 2]}\n"
         "</parameter>\n<parameter=a>\n[\"x\"]\n</parameter>\n<parameter=ns>\nNone\n</parameter>\n"
         "<parameter=ni>\nnull\n</parameter>\n<parameter=extra>\n5\n</parameter>\n</function>\n</tool_call>",
         Q, 0, 0, TOOLS, "", "",
         "f({\"s\":\"42\",\"i\":7,\"n\":2.5,\"b\":true,\"o\":{\"k\":[1,2]},\"a\":[\"x\"],\"ns\":null,\"ni\":null,"
         "\"extra\":\"5\"});");
  CHECKF("qwen3_coder values that do not convert stay strings",
         "<tool_call><function=f><parameter=i>seven</parameter><parameter=n>1e400</parameter>"
         "<parameter=o>{not json</parameter><parameter=n2>3.0</parameter></function></tool_call>",
         Q, 0, 0, TOOLS, "", "", "f({\"i\":\"seven\",\"n\":\"1e400\",\"o\":\"{not json\",\"n2\":\"3.0\"});");
  CHECKF("qwen3_coder whole number as number is an integer",
         "<tool_call><function=f><parameter=n>3.0</parameter></function></tool_call>", Q, 0, 0, TOOLS, "", "",
         "f({\"n\":3});");
  CHECKF("qwen3_coder without a schema: strings",
         "<tool_call>\n<function=g>\n<parameter=x>\n3\n</parameter>\n</function>\n</tool_call>", Q, 0, 0, TOOLS, "", "",
         "g({\"x\":\"3\"});");
  CHECKF("qwen3_coder two calls, text and reasoning",
         "<think>\nplan\n</think>\n\nOk.\n<tool_call>\n<function=a>\n</function>\n</tool_call>\n<tool_call>\n<function=b>\n"
         "<parameter=s>\nhi <b>there</b>\n</parameter>\n</function>\n</tool_call>",
         Q, RQ, 0, NULL, "Ok.\n\n", "\nplan\n", "a({});b({\"s\":\"hi <b>there</b>\"});");
  CHECKF("qwen3_coder repeated parameter: the first stands",
         "<tool_call><function=f><parameter=s>1</parameter><parameter=s>2</parameter></function></tool_call>", Q, 0, 0,
         TOOLS, "", "", "f({\"s\":\"1\"});");
  CHECKF("qwen3_coder missing </parameter>",
         "<tool_call><function=f><parameter=s>\nab\n<parameter=i>\n4\n</function></tool_call>", Q, 0, 0, TOOLS, "", "",
         "f({\"s\":\"ab\",\"i\":4});");
  CHECKF("qwen3_coder unterminated call at the end",
         "<tool_call>\n<function=f>\n<parameter=s>\nx\n</parameter>\n", Q, 0, 0, TOOLS, "", "", "f({\"s\":\"x\"});");
  CHECKF("qwen3_coder json body still a call", "<tool_call>{\"name\":\"f\",\"arguments\":{\"i\":1}}</tool_call>", Q, 0,
         0, TOOLS, "", "", "f({\"i\":1});");
  CHECKF("qwen3_coder garbage stays content", "a<tool_call>nothing</tool_call>b", Q, 0, 0, NULL,
         "a<tool_call>nothing</tool_call>b", "", "");
  CHECKF("qwen3_coder NUL in a name stays content", "<tool_call><function=a\0b></function></tool_call>", Q, 0, 0, NULL,
         "<tool_call><function=a</tool_call>", "", ""); /* the sink's copy stops at the NUL */
  CHECKF("qwen3_coder NUL in a key drops it", "<tool_call><function=f><parameter=k\0>v\0w</parameter></function></tool_call>",
         Q, 0, 0, NULL, "", "", "f({});");
  CHECKF("qwen3_coder NUL in a value", "<tool_call><function=f><parameter=k>v\0w</parameter></function></tool_call>", Q, 0, 0,
         NULL, "", "", "f({\"k\":\"v\\u0000w\"});");
  CHECKF("qwen3_coder bare json reply is content", "{\"name\": \"f\", \"arguments\": {}}", Q, 0, 0, NULL,
         "{\"name\": \"f\", \"arguments\": {}}", "", "");
  CHECKF("hermes NUL in a json name stays content", "<tool_call>{\"name\":\"a\\u0000b\",\"arguments\":{}}</tool_call>", H,
         0, 0, NULL, "<tool_call>{\"name\":\"a\\u0000b\",\"arguments\":{}}</tool_call>", "", "");
  CHECKF("hermes family", "Hi <tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"P\"}}\n</tool_call>", H, RQ, 0,
         NULL, "Hi ", "", "w({\"c\":\"P\"});");
  CHECKF("gemma4 call",
         "Checking.<|tool_call>call:get_weather{location:<|\"|>Paris, FR<|\"|>,days:3,metric:true,ratio:0.5,"
         "opt:null,tags:[<|\"|>a<|\"|>,<|\"|>b,c<|\"|>],nested:{k:<|\"|>{x}<|\"|>,z:[1,{q:false}]},word:sunny}<tool_call|>",
         G, RG, 0, NULL, "Checking.", "",
         "get_weather({\"location\":\"Paris, FR\",\"days\":3,\"metric\":true,\"ratio\":0.5,\"opt\":null,"
         "\"tags\":[\"a\",\"b,c\"],\"nested\":{\"k\":\"{x}\",\"z\":[1,{\"q\":false}]},\"word\":\"sunny\"});");
  CHECKF("gemma4 two calls, no arguments",
         "<|tool_call>call:a{}<tool_call|><|tool_call>call:b{x:<|\"|>\"quoted\" <b><|\"|>}<tool_call|>", G, RG, 0, NULL, "",
         "", "a({});b({\"x\":\"\\\"quoted\\\" <b>\"});");
  CHECKF("gemma4 reasoning channel",
         "<|channel>thought\nThe user wants weather.<channel|>It is sunny.", G, RG, 0, NULL, "It is sunny.",
         "The user wants weather.", "");
  CHECKF("gemma4 reasoning without the label", "<|channel>just thinking<channel|>x", G, RG, 0, NULL, "x",
         "just thinking", "");
  CHECKF("gemma4 reasoning opened by the prompt", "thought\nhmm<channel|>done", 0, RG, 1, NULL, "done", "hmm", "");
  CHECKF("gemma4 malformed call stays content", "<|tool_call>call:f{a:<|\"|>x}<tool_call|>", G, RG, 0, NULL,
         "<|tool_call>call:f{a:<|\"|>x}<tool_call|>", "", "");
  CHECKF("gemma4 leaves qwen markup alone", "<think>x</think><tool_call>{}</tool_call>", G, RG, 0, NULL,
         "<think>x</think><tool_call>{}</tool_call>", "", "");
  CHECKF("tools none", "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>", OUTPARSE_TOOLS_NONE, RQ, 0, NULL,
         "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>", "", "");
  check_q3_streams();
  /* Detection from template text. */
  {
    int t, r;
    const char *g4 = "{{ '<|tool_call>call:' }} <|channel>", *q3 = "<tool_call>\n<function=x>\n<parameter=y>";
    outparse_detect(g4, strlen(g4), &t, &r);
    int ok = t == G && r == RG;
    outparse_detect(q3, strlen(q3), &t, &r);
    ok = ok && t == Q && r == RQ;
    outparse_detect("<tool_call>{\"name\"", 18, &t, &r);
    ok = ok && t == H && r == RQ;
    ok = ok && outparse_tools_parse("qwen3_coder") == Q && outparse_tools_parse("bogus") == -1 &&
         outparse_reasoning_parse("gemma4") == RG && outparse_reasoning_parse("none") == 0;
    printf("%s detection and names\n", ok ? "ok  " : "FAIL");
    failures += !ok;
  }
  /* Direct body parser errors. */
  char *n, *a;
  const char *bad[] = {"",
                       "{",
                       "[1,2]",
                       "{\"name\": 5}",
                       "<function=>",
                       "<function=f><parameter=>x</parameter>",
                       "<function=f><parameter=p>x",
                       "plain"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (outparse_tool_body(bad[i], strlen(bad[i]), &n, &a) == 0) {
      printf("FAIL body '%s' parsed as %s(%s)\n", bad[i], n, a);
      free(n);
      free(a);
      failures++;
    }
  }
  printf("ok   malformed bodies rejected\n");
  if (failures) printf("%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
