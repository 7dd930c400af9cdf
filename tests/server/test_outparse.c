/* test_outparse: the <think>/<tool_call> splitter behind chat responses. Every case is fed
 * whole, byte by byte, and in 3-byte pieces: the results must be identical, since the
 * stream renderer sees arbitrary token boundaries. */
#include "server/outparse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct out {
  char content[4096], reasoning[4096], calls[4096];
  int n_calls;
} out;

static int sink(void *ud, int kind, const char *a, size_t alen, const char *b, size_t blen) {
  out *o = ud;
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
