/* bench_structured: the per-step cost of structured-output masks for a batch of B sequences
 * (issue 30: "mask cost under 5% of a decode step at batch 64"), at a real vocabulary.
 * For each case (a JSON Schema or a GBNF grammar, and a sample reply that follows it) B
 * states are set at staggered positions of the tokenized reply (sequence b starts at token
 * b mod n, so the batch mixes structural and in-string positions as a real batch would);
 * each step computes all B full-vocabulary masks one after another (as the engine thread
 * does before sampling) and feeds each state its next token. Prints the mean and worst time
 * of one batch step's masks, and per mask.
 *   bench_structured MODEL.gguf|TOKENIZER_DIR [BATCH=64] [STEPS=32]   (needs a model) */
#include "server/gbnf.h"
#include "server/jsonschema.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* the machine may be shared: CPU time, not wall */
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static const char *JSON_GBNF =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
    "[0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] "
    "[1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char *PERSON_REPLY =
    "{\"name\": \"Ada Lovelace, the first programmer\", \"age\": 36, \"email\": "
    "\"ada@analytical.org\", \"tags\": [\"math\", \"poetry\", \"engines\"]}";

/* kind 's': JSON Schema, 'g': GBNF */
static const char *const CASES[][4] = {
    {"s", "schema person",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
     "\"integer\"},\"email\":{\"type\":\"string\",\"format\":\"email\"},\"tags\":{\"type\":"
     "\"array\",\"items\":{\"type\":\"string\",\"maxLength\":20},\"maxItems\":5}},\"required\":"
     "[\"name\",\"age\",\"email\",\"tags\"],\"additionalProperties\":false}",
     NULL},
    {"g", "gbnf json", NULL, NULL},
    {"g", "gbnf arith",
     "root ::= expr\nexpr ::= term (ws (\"+\" | \"-\") ws term)*\n"
     "term ::= factor (ws (\"*\" | \"/\") ws factor)*\n"
     "factor ::= [0-9]+ | \"(\" ws expr ws \")\"\nws ::= \" \"?\n",
     "(12 + 7) * (3 - 1) / 4 + 100 * (2 + (5 - 3) * 8) - 42 / (6 + 1)"},
    {"g", "gbnf line", "root ::= \"Answer: \" [^\\n]{1,300} \"\\n\"\n",
     "Answer: The quick brown fox jumps over the lazy dog while the committee debates whether "
     "structured output should cost more than a few percent of a decode step.\n"},
};

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf|TOKENIZER_DIR [BATCH] [STEPS]\n", argv[0]);
    return 2;
  }
  int B = argc > 2 ? atoi(argv[2]) : 64, steps = argc > 3 ? atoi(argv[3]) : 32;
  if (B < 1 || steps < 1) return 2;
  char err[400];
  anna_text *text = NULL;
  if (anna_text_open(&text, argv[1], ANNA_TEXT_NO_TEMPLATE, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  int V = anna_text_vocab(text);
  jschema_vocab *voc = NULL;
  gbnf_masker *gm = NULL;
  if (jsonschema_vocab_from_text(&voc, text) || gbnf_masker_new(&gm, voc)) return 1;
  const char *bytes;
  const uint32_t *off;
  const uint8_t *cls;
  jsonschema_vocab_tables(voc, &bytes, &off, &cls);
  float *row = malloc((size_t)V * sizeof *row);
  jschema_state *js = malloc((size_t)B * sizeof *js);
  gbnf_state *gs = malloc((size_t)B * sizeof *gs);
  int *pos = malloc((size_t)B * sizeof *pos);
  printf("vocab %d tokens, batch %d, %d steps\n", V, B, steps);
  for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
    int is_g = CASES[c][0][0] == 'g';
    const char *src = CASES[c][2] ? CASES[c][2] : JSON_GBNF;
    const char *reply = CASES[c][3] ? CASES[c][3] : PERSON_REPLY;
    jsonschema *s = NULL;
    gbnf *g = NULL;
    double t0 = now_us();
    if (is_g) {
      if (gbnf_compile(src, strlen(src), &g, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", CASES[c][1], err);
        return 1;
      }
    } else {
      json_error_t je;
      json_t *j = json_loads(src, 0, &je);
      if (!j || jsonschema_compile(j, &s, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", CASES[c][1], err);
        return 1;
      }
      json_decref(j);
    }
    double tc = now_us() - t0;
    int32_t *ids = NULL;
    size_t n = 0;
    anna_text_tokenize(text, reply, strlen(reply), 0, &ids, &n, NULL, 0);
    /* sequence b: fed the reply's first (b mod n) tokens */
    for (int b = 0; b < B; b++) {
      pos[b] = (int)((size_t)b % n);
      if (is_g)
        gbnf_start(g, &gs[b]);
      else
        jsonschema_start(s, &js[b]);
      for (int k = 0; k < pos[b]; k++) {
        const char *tb = bytes + off[ids[k]];
        size_t tn = off[ids[k] + 1] - off[ids[k]];
        if (is_g ? gbnf_feed(&gs[b], tb, tn) : jsonschema_feed(&js[b], tb, tn)) {
          fprintf(stderr, "%s: the sample's token %d is rejected\n", CASES[c][1], k);
          return 1;
        }
      }
    }
    double sum = 0, worst = 0;
    long allowed_sum = 0;
    for (int st = 0; st < steps; st++) {
      double a = now_us();
      for (int b = 0; b < B; b++) {
        for (int v = 0; v < V; v++)
          row[v] = 0;
        int allowed = is_g ? gbnf_mask(gm, &gs[b], row) : jsonschema_vocab_mask(voc, &js[b], row);
        allowed_sum += allowed;
        if (isinf(row[ids[pos[b]]])) {
          fprintf(stderr, "%s: the mask rejects the sample's token %d\n", CASES[c][1], pos[b]);
          return 1;
        }
      }
      double t = now_us() - a;
      sum += t;
      worst = t > worst ? t : worst;
      /* advance every sequence one token; one that reached the end starts over */
      for (int b = 0; b < B; b++) {
        const char *tb = bytes + off[ids[pos[b]]];
        size_t tn = off[ids[pos[b]] + 1] - off[ids[pos[b]]];
        if (is_g)
          gbnf_feed(&gs[b], tb, tn);
        else
          jsonschema_feed(&js[b], tb, tn);
        if (++pos[b] == (int)n) {
          pos[b] = 0;
          if (is_g)
            gbnf_start(g, &gs[b]);
          else
            jsonschema_start(s, &js[b]);
        }
      }
    }
    printf("%-14s compile %6.0f us; reply %3zu tokens; batch-%d masks %8.2f ms/step (worst %8.2f), "
           "%.3f ms per mask, %ld allowed on average\n",
           CASES[c][1], tc, n, B, sum / steps / 1e3, worst / 1e3, sum / steps / B / 1e3,
           allowed_sum / ((long)steps * B));
    free(ids);
    gbnf_release(g);
    jsonschema_release(s);
  }
  free(row);
  free(js);
  free(gs);
  free(pos);
  gbnf_masker_free(gm);
  jsonschema_vocab_free(voc);
  anna_text_free(text);
  return 0;
}
