/* bench_jsonschema: the per-step cost of the structured-output token mask at a real
 * vocabulary. For each schema, a sample reply is tokenized and replayed: at every step the
 * full-vocabulary mask is computed (as the engine does before sampling), then the token is
 * fed. Prints microseconds per step (mean and worst) and, for reference, the plain JSON-object
 * mask (jsonmask, one probe per token) on the same replay.
 *   bench_jsonschema MODEL.gguf|TOKENIZER_DIR [ROUNDS]   (not a ctest: it needs a model) */
#include "server/jsonmask.h"
#include "server/jsonschema.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static const char *const CASES[][3] = {
    {"person",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
     "\"integer\"},\"email\":{\"type\":\"string\",\"format\":\"email\"},\"tags\":{\"type\":"
     "\"array\","
     "\"items\":{\"type\":\"string\",\"maxLength\":20},\"maxItems\":5}},\"required\":[\"name\","
     "\"age\",\"email\",\"tags\"],\"additionalProperties\":false}",
     "{\"name\": \"Ada Lovelace, the first programmer\", \"age\": 36, \"email\": "
     "\"ada@analytical.org\", \"tags\": [\"math\", \"poetry\", \"engines\"]}"},
    {"nested-anyof",
     "{\"$defs\":{\"item\":{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":\"string\","
     "\"pattern\":\"^[A-Z]{3}-[0-9]{4}$\"},\"qty\":{\"type\":\"integer\"},\"note\":{\"anyOf\":[{"
     "\"type\":\"null\"},{\"type\":\"string\"}]}},\"required\":[\"sku\",\"qty\",\"note\"]}},"
     "\"type\":\"object\",\"properties\":{\"order\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/"
     "$defs/"
     "item\"}},\"when\":{\"type\":\"string\",\"format\":\"date-time\"}},\"required\":[\"order\","
     "\"when\"]}",
     "{\n  \"order\": [\n    {\"sku\": \"ABC-1234\", \"qty\": 2, \"note\": null},\n    {\"sku\": "
     "\"XYZ-0001\", \"qty\": 10, \"note\": \"leave at the door, please\"}\n  ],\n  \"when\": "
     "\"2024-05-01T10:30:00Z\"\n}"},
    {"free-text",
     "{\"type\":\"object\",\"properties\":{\"summary\":{\"type\":\"string\"}},\"required\":"
     "[\"summary\"]}",
     "{\"summary\": \"The quick brown fox jumps over the lazy dog while the committee debates "
     "whether structured output should cost more than a few percent of a decode step.\"}"},
};

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.gguf|TOKENIZER_DIR [ROUNDS]\n", argv[0]);
    return 2;
  }
  int rounds = argc > 2 ? atoi(argv[2]) : 3;
  char err[256];
  anna_text *text = NULL;
  if (anna_text_open(&text, argv[1], ANNA_TEXT_NO_TEMPLATE, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  int V = anna_text_vocab(text);
  double t0 = now_us();
  jschema_vocab *voc = NULL;
  if (jsonschema_vocab_from_text(&voc, text)) return 1;
  printf("vocab %d tokens; tables + byte order built in %.1f ms (once per engine)\n", V,
         (now_us() - t0) / 1e3);
  const char *bytes;
  const uint32_t *off;
  const uint8_t *cls;
  jsonschema_vocab_tables(voc, &bytes, &off, &cls);
  float *row = malloc((size_t)V * sizeof *row);
  for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
    json_error_t je;
    json_t *j = json_loads(CASES[c][1], 0, &je);
    jsonschema *s = NULL;
    t0 = now_us();
    if (!j || jsonschema_compile(j, &s, err, sizeof err)) {
      fprintf(stderr, "%s: %s\n", CASES[c][0], err);
      return 1;
    }
    double tc = now_us() - t0;
    int32_t *ids = NULL;
    size_t n = 0;
    anna_text_tokenize(text, CASES[c][2], strlen(CASES[c][2]), 0, &ids, &n, NULL, 0);
    double sum = 0, worst = 0, jsum = 0;
    int steps = 0, min_allowed = V;
    for (int r = 0; r < rounds; r++) {
      jschema_state st;
      jsonschema_start(s, &st);
      jsonmask jm;
      jsonmask_init(&jm);
      for (size_t i = 0; i < n; i++) {
        for (int v = 0; v < V; v++)
          row[v] = 0;
        double a = now_us();
        int allowed = jsonschema_vocab_mask(voc, &st, row);
        double b = now_us() - a;
        sum += b;
        worst = b > worst ? b : worst;
        if (getenv("BENCH_VERBOSE") && r == rounds - 1)
          printf("  step %zu: %.0f us, %d allowed, then '%.*s'\n", i, b, allowed,
                 (int)(off[ids[i] + 1] - off[ids[i]]), bytes + off[ids[i]]);
        min_allowed = allowed < min_allowed ? allowed : min_allowed;
        if (isinf(row[ids[i]])) {
          fprintf(stderr, "%s: the mask rejects the sample's token %zu\n", CASES[c][0], i);
          return 1;
        }
        /* jsonmask for reference: what JSON-object mode costs (probe every token). */
        a = now_us();
        int in_str = jsonmask_in_string(&jm);
        int ok_n = 0;
        for (int v = 0; v < V; v++) {
          if (cls[v] == 1) continue;
          if (cls[v] == 2) {
            ok_n += in_str;
            continue;
          }
          jsonmask p = jm;
          ok_n += jsonmask_feed(&p, bytes + off[v], off[v + 1] - off[v]) == 0;
        }
        jsum += now_us() - a;
        (void)ok_n;
        const char *tb = bytes + off[ids[i]];
        size_t tn = off[ids[i] + 1] - off[ids[i]];
        jsonschema_feed(&st, tb, tn);
        jsonmask_feed(&jm, tb, tn);
        steps++;
      }
      if (!jsonschema_done(&st)) {
        fprintf(stderr, "%s: sample not complete\n", CASES[c][0]);
        return 1;
      }
    }
    printf("%-13s compile %.0f us; %zu tokens; schema mask %.1f us/step (worst %.1f, fewest "
           "allowed %d); json_object mask %.1f us/step\n",
           CASES[c][0], tc, n, sum / steps, worst, min_allowed, jsum / steps);
    free(ids);
    jsonschema_release(s);
    json_decref(j);
  }
  free(row);
  jsonschema_vocab_free(voc);
  anna_text_free(text);
  return 0;
}
