/* test_jsonmask: the JSON prefix recognizer behind response_format. Valid objects are
 * accepted byte by byte with every prefix valid and "done" exactly at the end; invalid
 * texts are rejected at some byte. */
#include "server/jsonmask.h"

#include <stdio.h>
#include <string.h>

static int failures = 0;

static void valid(const char *s) {
  jsonmask m;
  jsonmask_init(&m);
  size_t n = strlen(s);
  for (size_t i = 0; i < n; i++) {
    if (jsonmask_done(&m) && s[i] != ' ' && s[i] != '\n') {
      printf("FAIL done too early at %zu: %s\n", i, s);
      failures++;
      return;
    }
    if (jsonmask_feed(&m, s + i, 1)) {
      printf("FAIL rejected valid at byte %zu ('%c'): %s\n", i, s[i], s);
      failures++;
      return;
    }
  }
  if (!jsonmask_done(&m)) {
    printf("FAIL not done at the end: %s\n", s);
    failures++;
    return;
  }
  printf("ok   valid   %s\n", s);
}

static void invalid(const char *s) {
  jsonmask m;
  jsonmask_init(&m);
  if (jsonmask_feed(&m, s, strlen(s)) == 0) {
    printf("FAIL accepted invalid: %s\n", s);
    failures++;
    return;
  }
  printf("ok   invalid %s\n", s);
}

int main(void) {
  valid("{}");
  valid(" {\"a\": 1}");
  valid("{\"a\":[1,2.5,-3e+2,0,0.0,1E5,true,false,null,\"x\"]}");
  valid("{\"nested\": {\"deep\": [[{}], [], {\"k\": \"v\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\"}]}}");
  valid("{\"utf8\": \"\xc3\xa9\xe2\x82\xac\"}\n");
  valid("{\"n\": -0.5}");
  valid("{\"a\":1 , \"b\" :2}");
  invalid("[]");
  invalid("\"str\"");
  invalid("42");
  invalid("{'a': 1}");
  invalid("{\"a\" 1}");
  invalid("{\"a\": 01}");
  invalid("{\"a\": 1.}");
  invalid("{\"a\": -}");
  invalid("{\"a\": tru}");
  invalid("{\"a\": nul1}");
  invalid("{\"a\": [1,]}");
  invalid("{\"a\": 1,}");
  invalid("{,}");
  invalid("{\"a\": \"x\ny\"}");
  invalid("{\"a\": \"\\x\"}");
  invalid("{\"a\": \"\\u12G4\"}");
  /* UTF-16 surrogates (issue 30 item 5): only a high one followed by a low one decodes;
   * json.loads and jansson reject the lone ones the mask used to let through. */
  valid("{\"a\": \"\\ud83d\\ude00 \\uD83D\\uDE00 \\ud7ff\\ue000\"}");
  invalid("{\"a\": \"\\ud800\"}");
  invalid("{\"a\": \"\\udc00\"}");
  invalid("{\"a\": \"\\uDFFF x\"}");
  invalid("{\"a\": \"\\ud83dx\"}");
  invalid("{\"a\": \"\\ud83d\\n\"}");
  invalid("{\"a\": \"\\ud83d\\ud83d\"}");
  invalid("{\"a\": \"\\ud83d\\u0041\"}");
  invalid("{\"a\": [1}");
  invalid("{}}");
  invalid("{} x");
  invalid("{\"a\": 1]");
  invalid("                  {}"); /* more whitespace than allowed */
  invalid("   {}");                 /* more leading whitespace than allowed */
  valid("\n {}");
  /* nesting limit */
  char deep[256] = "{\"a\":";
  for (int i = 0; i < 60; i++)
    strcat(deep, "[");
  invalid(deep);
  /* prefixes are fine and not done */
  jsonmask m;
  jsonmask_init(&m);
  if (jsonmask_feed(&m, "{\"a\": [1, {\"b\": \"par", 20) || jsonmask_done(&m) ||
      !jsonmask_in_string(&m)) {
    printf("FAIL prefix\n");
    failures++;
  } else {
    printf("ok   prefix in string\n");
  }
  if (failures) printf("%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
