/* test_jsonschema: the JSON Schema compiler and byte recognizer behind json_schema output.
 * Texts the schema accepts (in the generated subset) are read byte by byte with "done"
 * exactly at the end; texts it rejects die at some byte or are not complete; unsupported
 * keywords are compile errors naming the keyword; the vocabulary mask agrees with feeding
 * every token one by one. */
#include "server/jsonschema.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

static jsonschema *compile(const char *text) {
  json_error_t je;
  json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
  if (!j) {
    printf("FAIL bad test schema %s\n", text);
    failures++;
    return NULL;
  }
  jsonschema *s = NULL;
  char err[256];
  if (jsonschema_get(j, &s, err, sizeof err)) {
    printf("FAIL compile %s: %s\n", text, err);
    failures++;
  }
  json_decref(j);
  return s;
}

static void valid(const char *schema, const char *s) {
  jsonschema *js = compile(schema);
  if (!js) return;
  jschema_state st;
  jsonschema_start(js, &st);
  size_t n = strlen(s);
  for (size_t i = 0; i < n; i++) {
    if (jsonschema_feed(&st, s + i, 1)) {
      printf("FAIL %s rejected valid at byte %zu ('%c'): %s\n", schema, i, s[i], s);
      failures++;
      jsonschema_release(js);
      return;
    }
  }
  if (!jsonschema_done(&st)) {
    printf("FAIL %s: not done at the end: %s\n", schema, s);
    failures++;
  } else {
    printf("ok   valid   %s  %s\n", schema, s);
  }
  jsonschema_release(js);
}

static void invalid(const char *schema, const char *s) {
  jsonschema *js = compile(schema);
  if (!js) return;
  jschema_state st;
  jsonschema_start(js, &st);
  if (jsonschema_feed(&st, s, strlen(s)) == 0 && jsonschema_done(&st)) {
    printf("FAIL %s accepted invalid: %s\n", schema, s);
    failures++;
  } else {
    printf("ok   invalid %s  %s\n", schema, s);
  }
  jsonschema_release(js);
}

static void bad_schema(const char *schema, const char *needle) {
  json_error_t je;
  json_t *j = json_loads(schema, JSON_DECODE_ANY, &je);
  jsonschema *s = NULL;
  char err[256] = "";
  int rc = jsonschema_compile(j, &s, err, sizeof err);
  if (rc == 0 || !strstr(err, needle)) {
    printf("FAIL bad schema %s: rc %d, message '%s' lacks '%s'\n", schema, rc, err, needle);
    failures++;
    jsonschema_release(s);
  } else {
    printf("ok   error   %s: %s\n", schema, err);
  }
  json_decref(j);
}

/* The vocabulary mask must allow exactly the tokens that feeding allows. */
static void mask_agrees(const char *schema, const char *prefix) {
  static const char *toks[] = {"{",     "}",    "\"",    "\"name", "\":", " \"", "a",  "ab",
                               "abc",   "1",    "12",    "-",      ".",   "5",   "e",  "true",
                               "false", "null", "nul",   ",",      ", ",  "[",   "]",  "\"}",
                               "\\",    "\\u",  "d83d",  "ude00",  "x",   " ",   "\n", "\":\"",
                               "age",   "\":1", "2024-", "01",     "-1",  "T",   "Z",  ":"};
  int V = (int)(sizeof toks / sizeof toks[0]) + 2;
  char bytes[512];
  uint32_t off[64];
  uint8_t cls[64];
  size_t len = 0;
  for (int v = 0; v < V; v++) {
    off[v] = (uint32_t)len;
    cls[v] = v >= V - 2 ? (uint8_t)(v - (V - 2) + 1) : 0; /* a special and a split piece */
    const char *t = v < V - 2 ? toks[v] : v == V - 2 ? "" : "\xef\xbf\xbd";
    memcpy(bytes + len, t, strlen(t));
    len += strlen(t);
  }
  off[V] = (uint32_t)len;
  jsonschema *js = compile(schema);
  jschema_vocab *voc = NULL;
  if (!js || jsonschema_vocab_build(&voc, bytes, off, cls, V)) {
    failures++;
    jsonschema_release(js);
    return;
  }
  jschema_state st;
  jsonschema_start(js, &st);
  if (jsonschema_feed(&st, prefix, strlen(prefix))) {
    printf("FAIL mask prefix rejected: %s\n", prefix);
    failures++;
  }
  float row[64];
  for (int v = 0; v < V; v++)
    row[v] = 0;
  int allowed = jsonschema_vocab_mask(voc, &st, row), count = 0, bad = 0;
  for (int v = 0; v < V; v++) {
    int want;
    if (cls[v] == 1)
      want = 0;
    else if (cls[v] == 2)
      want = jsonschema_free_string(&st);
    else {
      jschema_state p;
      jsonschema_copy(&p, &st);
      want = jsonschema_feed(&p, bytes + off[v], off[v + 1] - off[v]) == 0;
    }
    int got = !isinf(row[v]);
    count += got;
    if (want != got) {
      printf("FAIL mask %s after '%s': token '%.*s' got %d want %d\n", schema, prefix,
             (int)(off[v + 1] - off[v]), bytes + off[v], got, want);
      bad = 1;
    }
  }
  if (count != allowed) bad = 1;
  if (bad)
    failures++;
  else
    printf("ok   mask    %s after '%s': %d allowed\n", schema, prefix, allowed);
  jsonschema_vocab_free(voc);
  jsonschema_release(js);
}

int main(void) {
  const char *obj = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
                    "{\"type\":\"string\",\"maxLength\":3},\"minItems\":1,\"maxItems\":2}},"
                    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";
  valid(obj, "{\"name\": \"Bob\", \"age\": 42}");
  valid(obj, "{\"name\":\"\\u00e9\\ud83d\\ude00\",\"age\":-7,\"tags\":[\"a\",\"xyz\"]}");
  valid(obj, " {\n  \"name\": \"\",\n  \"age\": 0\n}\n");
  invalid(obj, "{\"age\": 42, \"name\": \"Bob\"}");          /* declaration order */
  invalid(obj, "{\"name\": \"Bob\"}");                       /* age required */
  invalid(obj, "{\"name\": \"Bob\", \"age\": 4.2}");         /* integer */
  invalid(obj, "{\"name\": \"Bob\", \"age\": 1, \"x\": 1}"); /* no other keys */
  invalid(obj, "{\"name\": \"Bob\", \"age\": 1, \"tags\": []}");
  invalid(obj, "{\"name\": \"Bob\", \"age\": 1, \"tags\": [\"a\",\"b\",\"c\"]}");
  invalid(obj, "{\"name\": \"Bob\", \"age\": 1, \"tags\": [\"abcd\"]}");
  invalid(obj, "{\"name\": \"\\ud800\", \"age\": 1}"); /* lone surrogate */
  invalid(obj, "{\"name\": 5, \"age\": 1}");
  invalid(obj, "[]");
  /* scalars at the top, numbers ending at the end of text */
  valid("{\"type\":\"number\"}", "-12.5e+3");
  valid("{\"type\":\"integer\"}", "0");
  invalid("{\"type\":\"integer\"}", "01");
  invalid("{\"type\":\"number\"}", "1.");
  invalid("{\"type\":\"number\"}", "12345678901234567890"); /* over the length cap */
  valid("{\"type\":\"boolean\"}", "false");
  valid("{\"type\":\"null\"}", "null");
  valid("{\"type\":[\"string\",\"null\"]}", "null");
  valid("{\"type\":[\"string\",\"null\"]}", "\"x\"");
  invalid("{\"type\":[\"string\",\"null\"]}", "1");
  /* enum and const, including literals that are prefixes of others */
  const char *en = "{\"enum\":[\"red\",\"green\",1,12,null,{\"a\":[1]}]}";
  valid(en, "\"red\"");
  valid(en, "1");
  valid(en, "12");
  valid(en, "{\"a\":[1]}");
  invalid(en, "\"blue\"");
  invalid(en, "123");
  invalid(en, "\"re\"");
  valid("{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"v\"}},\"required\":[\"k\"]}",
        "{\"k\": \"v\"}");
  /* anyOf over objects that share a prefix */
  const char *any =
      "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
      "\"required\":[\"a\"]},{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
      "\"string\"},\"b\":{\"type\":\"boolean\"}},\"required\":[\"a\",\"b\"]}]}";
  valid(any, "{\"a\": 1}");
  valid(any, "{\"a\": \"s\", \"b\": true}");
  invalid(any, "{\"a\": \"s\"}");
  invalid(any, "{\"a\": 1, \"b\": true}");
  /* $ref, $defs, definitions, recursion */
  const char *tree =
      "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
      "\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
      "\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}";
  valid(tree, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}");
  invalid(tree, "{\"v\":1,\"kids\":[{\"w\":2}]}");
  valid("{\"definitions\":{\"x\":{\"type\":\"string\",\"enum\":[\"a\"]}},\"type\":\"object\","
        "\"properties\":{\"p\":{\"$ref\":\"#/definitions/x\"}}}",
        "{\"p\":\"a\"}");
  /* strings: bounds, patterns, formats */
  const char *len = "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}";
  valid(len, "\"ab\"");
  valid(len, "\"\xc3\xa9\xc3\xa9\xc3\xa9\""); /* characters, not bytes */
  invalid(len, "\"a\"");
  invalid(len, "\"abcd\"");
  invalid(len, "\"a\\nb\"");         /* bounded strings take no escapes */
  invalid(len, "\"ab\x80\"");        /* a stray continuation byte */
  invalid(len, "\"ab\xc3\"");        /* a character cut short */
  invalid("{}", "\"\xed\xa0\x80\""); /* an encoded surrogate */
  valid("{}", "\"\xf0\x9f\x98\x80\"");
  const char *pat = "{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3,}(x|yz)?$\"}";
  valid(pat, "\"AB-123\"");
  valid(pat, "\"AB-12345yz\"");
  invalid(pat, "\"AB-12\"");
  invalid(pat, "\"ab-123\"");
  invalid(pat, "\"AB-123y\"");
  valid("{\"type\":\"string\",\"pattern\":\"cat\"}", "\"a cat!\""); /* unanchored: a search */
  invalid("{\"type\":\"string\",\"pattern\":\"cat\"}", "\"a dog\"");
  valid("{\"type\":\"string\",\"pattern\":\"^[^0-9]+$\"}", "\"abc def\"");
  /* a length bound and a pattern: no byte may leave the match out of reach */
  invalid("{\"type\":\"string\",\"pattern\":\"ab\",\"maxLength\":4}", "\"xxx");
  valid("{\"type\":\"string\",\"pattern\":\"ab\",\"maxLength\":4}", "\"xxab\"");
  invalid("{\"type\":\"string\",\"pattern\":\"^[^0-9]+$\"}", "\"ab1\"");
  valid("{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-28\"");
  invalid("{\"type\":\"string\",\"format\":\"date\"}", "\"2024-13-01\"");
  valid("{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-01-05T12:30:00.5Z\"");
  valid("{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-01-05T23:59:59+02:00\"");
  invalid("{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-01-05 12:30:00Z\"");
  valid("{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-426614174000\"");
  invalid("{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-42661417400\"");
  valid("{\"type\":\"string\",\"format\":\"email\"}", "\"a.b+c@example.co.uk\"");
  invalid("{\"type\":\"string\",\"format\":\"email\"}", "\"no-at-sign\"");
  valid("{\"type\":\"string\",\"format\":\"ipv4\"}", "\"192.168.0.255\"");
  invalid("{\"type\":\"string\",\"format\":\"ipv4\"}", "\"256.1.1.1\"");
  /* free values */
  valid("{}", "[1, {\"x\": [true, null, \"s\\\"\"]}, -0.5]");
  valid("{\"type\":\"object\"}", "{\"any\": {\"thing\": [1]}}");
  valid("{\"type\":\"object\",\"additionalProperties\":false}", "{}");
  invalid("{\"type\":\"object\",\"additionalProperties\":false}", "{\"a\":1}");
  valid("{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":2}", "[1, 2.5]");
  invalid("{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":2}", "[1]");
  /* property names that need escapes */
  valid("{\"type\":\"object\",\"properties\":{\"a\\\"b\":{\"type\":\"null\"}},\"required\":["
        "\"a\\\"b\"]}",
        "{\"a\\\"b\": null}");
  /* errors name the keyword */
  bad_schema("{\"type\":\"string\",\"minimum\":1}", "'minimum'");
  bad_schema("{\"oneOf\":[{}]}", "'oneOf'");
  bad_schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"multipleOf\":2}}}",
             "unsupported keyword 'multipleOf' (at properties.a)");
  bad_schema("{\"type\":\"string\",\"format\":\"hostname\"}", "'format' \"hostname\"");
  bad_schema("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "lookaround");
  bad_schema("{\"type\":\"string\",\"pattern\":\"a^b\"}", "'^'");
  bad_schema("{\"$ref\":\"#/$defs/missing\"}", "does not resolve");
  bad_schema("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "\"b\"");
  bad_schema("{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":{}}",
             "'additionalProperties'");
  bad_schema("{\"type\":\"strin\"}", "unknown 'type'");
  bad_schema("{\"type\":\"string\",\"maxLength\":70000}", "'maxLength'");
  bad_schema("{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":true}",
             "'additionalProperties'");
  /* hostile depth is an error, not a stack overflow */
  char deep[8192] = "";
  for (int i = 0; i < 200; i++)
    strcat(deep, "{\"type\":\"array\",\"items\":");
  strcat(deep, "{}");
  for (int i = 0; i < 200; i++)
    strcat(deep, "}");
  bad_schema(deep, "nested deeper than 64");
  char nest[1024] = "{\"type\":\"string\",\"pattern\":\"";
  for (int i = 0; i < 100; i++)
    strcat(nest, "(");
  strcat(nest, "a");
  for (int i = 0; i < 100; i++)
    strcat(nest, ")");
  strcat(nest, "\"}");
  bad_schema(nest, "nested deeper than 32");
  /* the vocabulary mask */
  mask_agrees(obj, "");
  mask_agrees(obj, "{");
  mask_agrees(obj, "{\"name\": \"a");
  mask_agrees(obj, "{\"name\": \"a\", \"age\": 1");
  mask_agrees(obj, "{\"name\": \"\\ud83d");
  mask_agrees(en, "");
  mask_agrees("{\"type\":\"string\",\"format\":\"date\"}", "\"2024-");
  mask_agrees("{}", "[1");
  /* the cache hands out the same compiled schema */
  jsonschema *a = compile(obj), *b = compile(obj);
  if (!a || a != b) {
    printf("FAIL cache\n");
    failures++;
  }
  jsonschema_release(a);
  jsonschema_release(b);
  if (failures) printf("%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
