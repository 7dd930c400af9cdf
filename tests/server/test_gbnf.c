/* test_gbnf: the GBNF grammar compiler and recognizer behind the `grammar` request field.
 * Sentences of a grammar are read byte by byte (every prefix alive, "done" exactly at the end
 * where the grammar says so); non-sentences die at some byte or are not complete; bad grammars
 * are errors naming the line and column; recursion (balanced parentheses, arithmetic, a JSON
 * grammar in the style of llama.cpp's grammars/json.gbnf) works; the vocabulary mask agrees
 * with feeding every token one by one. */
#include "server/gbnf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

static gbnf *compile(const char *text) {
  gbnf *g = NULL;
  char err[256];
  if (gbnf_get(text, strlen(text), &g, err, sizeof err)) {
    printf("FAIL compile %s: %s\n", text, err);
    failures++;
    return NULL;
  }
  return g;
}

/* s is a sentence: every prefix is alive, done only at the end (unless mid_done). */
static void valid(const char *grammar, const char *s) {
  gbnf *g = compile(grammar);
  if (!g) return;
  static gbnf_state st;
  gbnf_start(g, &st);
  size_t n = strlen(s);
  for (size_t i = 0; i < n; i++) {
    if (gbnf_feed(&st, s + i, 1)) {
      printf("FAIL valid: '%s' rejected at byte %zu under %s\n", s, i, grammar);
      failures++;
      gbnf_release(g);
      return;
    }
  }
  if (!gbnf_done(&st)) {
    printf("FAIL valid: '%s' not complete under %s\n", s, grammar);
    failures++;
  }
  gbnf_release(g);
}

static void invalid(const char *grammar, const char *s) {
  gbnf *g = compile(grammar);
  if (!g) return;
  static gbnf_state st;
  gbnf_start(g, &st);
  if (gbnf_feed(&st, s, strlen(s)) == 0 && gbnf_done(&st)) {
    printf("FAIL invalid: '%s' accepted under %s\n", s, grammar);
    failures++;
  }
  gbnf_release(g);
}

/* A prefix that is alive but not complete. */
static void prefix(const char *grammar, const char *s) {
  gbnf *g = compile(grammar);
  if (!g) return;
  static gbnf_state st;
  gbnf_start(g, &st);
  if (gbnf_feed(&st, s, strlen(s)) || gbnf_done(&st)) {
    printf("FAIL prefix: '%s' under %s\n", s, grammar);
    failures++;
  }
  gbnf_release(g);
}

static void bad(const char *grammar, const char *want) {
  gbnf *g = NULL;
  char err[256];
  int rc = gbnf_compile(grammar, strlen(grammar), &g, err, sizeof err);
  if (rc != ANNA_EINVAL || !strstr(err, want)) {
    printf("FAIL bad grammar %s: rc %d, error '%s', wanted '%s'\n", grammar, rc, rc ? err : "",
           want);
    failures++;
  }
  gbnf_release(g);
}

static const char *JSON_GBNF =
    "# JSON, after llama.cpp's grammars/json.gbnf\n"
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] "
    "[1-9]{0,15})? ws\n"
    "\n"
    "# Optional space: by convention, applied in this grammar after literal chars when allowed\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static void test_mask(void) {
  /* a toy vocabulary: tokens that fit or break the arithmetic grammar at various points */
  const char *toks[] = {"1",  "12", "+",  "(",   ")", "(1",   "1)",   "+(", "*",   " ",    "a", "x",
                        "))", "((", "2*", "3+4", "é", "\xc3", "\xa9", "",   "<s>", "9)*(", "0"};
  const int V = (int)(sizeof toks / sizeof *toks);
  char bytes[256];
  uint32_t off[64];
  uint8_t cls[64];
  size_t len = 0;
  for (int v = 0; v < V; v++) {
    off[v] = (uint32_t)len;
    memcpy(bytes + len, toks[v], strlen(toks[v]));
    len += strlen(toks[v]);
    cls[v] = toks[v][0] == 0 || !strcmp(toks[v], "<s>") ? 1 : 0;
  }
  off[V] = (uint32_t)len;
  jschema_vocab *voc = NULL;
  gbnf_masker *mk = NULL;
  if (jsonschema_vocab_build(&voc, bytes, off, cls, V) || gbnf_masker_new(&mk, voc)) {
    printf("FAIL mask setup\n");
    failures++;
    return;
  }
  const char *grammar =
      "root ::= expr\nexpr ::= term (\"+\" term)*\nterm ::= factor (\"*\" factor)*\n"
      "factor ::= [0-9]+ | \"(\" expr \")\" | [\\u00e0-\\u00ff]\n";
  const char *prefixes[] = {"", "1", "(", "(1+", "((2", "1*", "\xc3"};
  gbnf *g = compile(grammar);
  for (size_t p = 0; g && p < sizeof prefixes / sizeof *prefixes; p++) {
    static gbnf_state st, probe;
    gbnf_start(g, &st);
    if (gbnf_feed(&st, prefixes[p], strlen(prefixes[p]))) {
      printf("FAIL mask prefix '%s' rejected\n", prefixes[p]);
      failures++;
      continue;
    }
    float row[64];
    for (int v = 0; v < V; v++)
      row[v] = (float)v;
    int allowed = gbnf_mask(mk, &st, row), count = 0;
    for (int v = 0; v < V; v++) {
      int want = 0;
      if (cls[v] == 0) {
        gbnf_copy(&probe, &st);
        want = gbnf_feed(&probe, toks[v], strlen(toks[v])) == 0;
      }
      int got = row[v] == (float)v;
      if (got != want || (!got && !isinf(row[v]))) {
        printf("FAIL mask after '%s': token '%s' got %d want %d\n", prefixes[p], toks[v], got,
               want);
        failures++;
      }
      count += want;
    }
    if (allowed != count) {
      printf("FAIL mask after '%s': %d allowed, %d expected\n", prefixes[p], allowed, count);
      failures++;
    }
  }
  /* sanity: the mask is not trivially all-or-nothing */
  if (g) {
    static gbnf_state st;
    gbnf_start(g, &st);
    float row[64] = {0};
    int a = gbnf_mask(mk, &st, row);
    if (a <= 0 || a >= V) {
      printf("FAIL mask at the start allows %d of %d\n", a, V);
      failures++;
    }
  }
  gbnf_release(g);
  gbnf_masker_free(mk);
  jsonschema_vocab_free(voc);
}

/* The mask at a real vocabulary (the fixture's Qwen tokenizer, 151k tokens with byte-level
 * pieces of split characters) agrees with feeding every token, twice in a row (the second time
 * from the mask cache), for grammars whose walks take the interned-state, code-point-interval
 * and split-character paths. */
static void test_real_vocab(const char *path) {
  char err[256];
  anna_text *text = NULL;
  if (anna_text_open(&text, path, ANNA_TEXT_NO_TEMPLATE, err, sizeof err)) {
    printf("FAIL cannot open the fixture tokenizer %s: %s\n", path, err);
    failures++;
    return;
  }
  jschema_vocab *voc = NULL;
  gbnf_masker *mk = NULL;
  if (jsonschema_vocab_from_text(&voc, text) || gbnf_masker_new(&mk, voc)) {
    printf("FAIL real vocab setup\n");
    failures++;
    anna_text_free(text);
    return;
  }
  const char *bytes;
  const uint32_t *off;
  const uint8_t *cls;
  jsonschema_vocab_tables(voc, &bytes, &off, &cls);
  int V = anna_text_vocab(text);
  float *row = malloc((size_t)V * sizeof *row);
  printf("vocabulary %s: %d tokens\n", path, V);
  static const char *const cases[][2] = {
      {"root ::= \"Answer: \" [^\\n]{1,40} \"\\n\"\n", "Answer: ab"},
      {"root ::= \"Answer: \" [^\\n]{1,40} \"\\n\"\n", "Answer: \xe6\x97"},
      {"root ::= [\\u4e00-\\u9fff]+ \"。\"\n", "\xe4\xb8\xad"},
      {"root ::= [\\u4e00-\\u9fff]+ \"。\"\n", "\xe4"},
      {"root ::= [a-z ]* \"!\"\n", "hello wor"},
      {NULL, "{\"key\": \"va"},
      {NULL, "{\"key\": [1, "},
  };
  static gbnf_state st, probe;
  for (size_t c = 0; c < sizeof cases / sizeof *cases && row; c++) {
    const char *gt = cases[c][0] ? cases[c][0] : JSON_GBNF;
    gbnf *g = compile(gt);
    if (!g) continue;
    gbnf_start(g, &st);
    if (gbnf_feed(&st, cases[c][1], strlen(cases[c][1]))) {
      printf("FAIL real vocab: prefix '%s' rejected\n", cases[c][1]);
      failures++;
      gbnf_release(g);
      continue;
    }
    for (int round = 0; round < 2; round++) {
      for (int v = 0; v < V; v++)
        row[v] = 1.0f;
      int allowed = gbnf_mask(mk, &st, row), want_n = 0, bad = 0;
      for (int v = 0; v < V; v++) {
        int want = 0;
        if (cls[v] == 0) {
          gbnf_copy(&probe, &st);
          want = gbnf_feed(&probe, bytes + off[v], off[v + 1] - off[v]) == 0;
        }
        want_n += want;
        if (want != (row[v] == 1.0f) && bad++ < 3)
          printf("FAIL real vocab '%s' round %d: token %d '%.*s' got %d want %d\n", cases[c][1],
                 round, v, (int)(off[v + 1] - off[v]), bytes + off[v], !want, want);
      }
      if (bad || allowed != want_n) {
        printf("FAIL real vocab '%s' round %d: %d wrong, %d allowed, %d expected\n", cases[c][1],
               round, bad, allowed, want_n);
        failures++;
      }
      if (want_n == 0) {
        printf("FAIL real vocab '%s': nothing allowed (a useless case)\n", cases[c][1]);
        failures++;
      }
    }
    gbnf_release(g);
  }
  uint64_t hits, misses;
  gbnf_masker_stats(mk, &hits, &misses);
  if (hits < 7) {
    printf("FAIL real vocab: %llu mask cache hits, expected the second rounds to hit\n",
           (unsigned long long)hits);
    failures++;
  }
  free(row);
  gbnf_masker_free(mk);
  jsonschema_vocab_free(voc);
  anna_text_free(text);
}

int main(int argc, char **argv) {
  /* literals, alternation, sequences, comments */
  const char *yn = "root ::= \"yes\" | \"no\" # a comment\n";
  valid(yn, "yes");
  valid(yn, "no");
  invalid(yn, "yesno");
  invalid(yn, "ye");
  invalid(yn, "maybe");
  prefix(yn, "n");
  /* repetition */
  valid("root ::= \"a\"* \"b\"", "b");
  valid("root ::= \"a\"* \"b\"", "aaab");
  valid("root ::= \"a\"+ \"b\"", "ab");
  invalid("root ::= \"a\"+ \"b\"", "b");
  valid("root ::= \"a\"? \"b\"", "ab");
  invalid("root ::= \"a\"? \"b\"", "aab");
  valid("root ::= \"ab\"{2}", "abab");
  invalid("root ::= \"ab\"{2}", "ab");
  invalid("root ::= \"ab\"{2}", "ababab");
  valid("root ::= [0-9]{2,4}", "12");
  valid("root ::= [0-9]{2,4}", "1234");
  invalid("root ::= [0-9]{2,4}", "1");
  invalid("root ::= [0-9]{2,4}", "12345");
  valid("root ::= [0-9]{3,}", "123456789");
  invalid("root ::= [0-9]{3,}", "12");
  valid("root ::= [0-9]{,2} \"x\"", "x");
  valid("root ::= [0-9]{,2} \"x\"", "12x");
  invalid("root ::= [0-9]{,2} \"x\"", "123x");
  valid("root ::= (\"a\" | \"b\")* \"c\"", "abbac");
  /* classes: ranges, negation, escapes, any character */
  valid("root ::= [a-zA-Z_] [a-zA-Z_0-9]*", "_id42");
  invalid("root ::= [a-zA-Z_] [a-zA-Z_0-9]*", "4id");
  valid("root ::= [^\\n\"]+", "no quotes here");
  invalid("root ::= [^\\n\"]+", "a\"b");
  invalid("root ::= [^\\n\"]+", "a\nb");
  valid("root ::= \"\\x41\\u00e9\\U0001F600\\t\\\"\"", "A\xc3\xa9\xf0\x9f\x98\x80\t\"");
  valid("root ::= [\\u0400-\\u04FF]+", "\xd0\x9f\xd1\x80\xd0\xb8"); /* Cyrillic */
  invalid("root ::= [\\u0400-\\u04FF]+", "\xc3\xa9");
  valid("root ::= . . .", "a\xc3\xa9z");
  invalid("root ::= . . .", "ab");
  valid("root ::= [\\]\\[-]+", "[]-");
  /* a split UTF-8 character: its first bytes must fit some class */
  prefix("root ::= [\\u00e9]", "\xc3");
  invalid("root ::= [\\u00e9]", "\xd0");
  /* multi-line rules, groups spanning lines, rule order does not matter */
  valid(
      "root ::= greeting \" \" name\nname ::= (\n  \"Ada\" |\n  \"Alan\"\n)\ngreeting ::= \"hi\"\n",
      "hi Alan");
  /* recursion: balanced parentheses and arithmetic */
  const char *parens = "root ::= p\np ::= (\"(\" p \")\")*\n";
  valid(parens, "");
  valid(parens, "()(())");
  valid(parens, "((()()))()");
  invalid(parens, "(()");
  invalid(parens, "())");
  prefix(parens, "((((");
  const char *arith = "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\n"
                      "term ::= factor ((\"*\" | \"/\") factor)*\n"
                      "factor ::= \"-\"? ([0-9]+ | \"(\" expr \")\")\n";
  valid(arith, "1+2*3");
  valid(arith, "(1+2)*-(3/(4-5))");
  invalid(arith, "1+*2");
  invalid(arith, "(1+2");
  invalid(arith, "1+2)");
  /* JSON */
  valid(JSON_GBNF, "{}");
  valid(JSON_GBNF,
        "{\"a\": [1, 2.5, -3e9, 0.25E+7, true, null, {\"b\": \"x\\\"y\\u00e9\"}], \"c\": {}}");
  valid(JSON_GBNF, "{\n  \"k\": \"v\"\n}");
  invalid(JSON_GBNF, "{\"a\": 01}");
  invalid(JSON_GBNF, "{\"a\" 1}");
  invalid(JSON_GBNF, "{\"a\": [1,]}");
  invalid(JSON_GBNF, "[1]");
  invalid(JSON_GBNF, "{\"a\": \"\x01\"}");
  prefix(JSON_GBNF, "{\"a\": [1, {\"b\": ");
  /* errors name the line and column and the problem */
  bad("root ::= foo\n", "line 1, column 10: undefined rule 'foo'");
  bad("a ::= \"x\"\n", "no 'root' rule");
  bad("root ::= \"x\"\nroot ::= \"y\"\n", "line 2, column 1: rule 'root' is defined twice");
  bad("root ::= \"abc\n", "line 1, column 10: unterminated string literal");
  bad("root ::= [a-z\n", "unterminated character class");
  bad("root ::= (\"a\" | \"b\"\n", "unclosed '('");
  bad("root ::= \"a\" )\n", "unmatched ')'");
  bad("root ::= * \"a\"\n", "'*' with nothing to repeat");
  bad("root ::= [z-a]\n", "character range out of order");
  bad("root ::= \"\\q\"\n", "unknown escape '\\q'");
  bad("root ::= \"\\x4\"\n", "'\\x' needs 2 hex digits");
  bad("root ::= \"a\"{3,2}\n", "the maximum is below the minimum");
  bad("root ::= \"a\"{2000}\n", "repetition count above 1000");
  bad("root\n", "expected '::='");
  bad("root ::= \"x\"\n\n  expr ::= expr \"+\" \"1\" | \"1\"\n",
      "line 3, column 3: left recursion through rule 'expr'");
  bad("root ::= a\na ::= b? \"x\" | \"y\"\nb ::= a\n", "left recursion");
  bad("root ::= (\"a\"?)* \"b\"\n", "left recursion");
  bad("root ::= \"a\" ! \"b\"\n", "line 1, column 14: unexpected character '!'");
  /* many alternatives: 300 words, every one a sentence (no parse dropped at the start) */
  {
    static char words[300][8], big[300 * 12 + 64];
    size_t n = (size_t)snprintf(big, sizeof big, "root ::= ");
    unsigned x = 12345;
    for (int w = 0; w < 300; w++) {
      for (int k = 0; k < 6; k++) {
        x = x * 1103515245u + 12345u;
        words[w][k] = (char)('a' + (x >> 16) % 26);
      }
      words[w][6] = 0;
      n += (size_t)snprintf(big + n, sizeof big - n, "%s\"%s\"", w ? " | " : "", words[w]);
    }
    snprintf(big + n, sizeof big - n, "\n");
    for (int w = 0; w < 300; w += 7)
      valid(big, words[w]);
    valid(big, words[299]);
    invalid(big, "zzzzzz!");
  }
  test_mask();
  char path[1024];
  snprintf(path, sizeof path, "%s/qwen3", argc > 1 ? argv[1] : "../shared/fixtures");
  test_real_vocab(path); /* a 1000-token tokenizer */
  /* and the default model's 151,936 tokens when it is downloaded (scripts/setup.sh) */
  const char *home = getenv("HOME");
  snprintf(path, sizeof path, "%s/.cache/anna/models/qwen2.5-coder-0.5b-instruct.gguf",
           home ? home : "/");
  FILE *f = fopen(path, "rb");
  if (f) {
    fclose(f);
    test_real_vocab(path);
  }
  if (failures) {
    printf("%d failures\n", failures);
    return 1;
  }
  printf("test_gbnf: all passed\n");
  return 0;
}
