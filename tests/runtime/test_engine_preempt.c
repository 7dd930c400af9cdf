/* test_engine_preempt: the engine executing the scheduler's preemptions on a real (tiny)
 * model. Two greedy requests run once with the default KV pool and once with a pool too
 * small for both: the second run must preempt (sequences recompute prompt + generated
 * tokens when re-admitted) and still produce the same text and finish reasons. With and
 * without the prefix pool (the resumed prompt can then reuse its own cached blocks). */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
#define CHECK(c)                                                                                   \
  do {                                                                                             \
    if (!(c)) {                                                                                    \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);                        \
      fails++;                                                                                     \
    }                                                                                              \
  } while (0)

#define NREQ 3
#define MAXT 60

typedef struct result {
  char text[NREQ][8192];
  const char *reason[NREQ];
  int n_gen[NREQ];
  int64_t preemptions;
} result;

static int run(anna_model *m, const anna_text *t, int64_t kv_blocks, int prompt_cache,
               result *out) {
  engine_options o = {0};
  o.n_seq = NREQ;
  o.n_ctx = 256;
  o.n_batch = 64;
  o.n_threads = 2;
  o.max_batch_size = NREQ;
  o.kv_block_len = 16;
  o.kv_blocks = (int)kv_blocks;
  o.prompt_cache = prompt_cache;
  o.prompt_cache_checkpoints = 8;
  metrics mx;
  metrics_init(&mx);
  engine *e;
  char err[512];
  if (engine_create(&e, m, t, &o, &mx, err, sizeof err)) {
    fprintf(stderr, "engine_create: %s\n", err);
    return -1;
  }
  gen_request *r[NREQ];
  for (int k = 0; k < NREQ; k++) {
    r[k] = gen_request_new();
    r[k]->n_prompts = 1;
    r[k]->prompts = malloc(sizeof *r[k]->prompts);
    r[k]->n_prompt = malloc(sizeof *r[k]->n_prompt);
    const size_t np = 20 + 7 * (size_t)k;
    r[k]->prompts[0] = malloc(np * sizeof(int32_t));
    for (size_t j = 0; j < np; j++)
      r[k]->prompts[0][j] = (int32_t)(100 + (j * 37 + (size_t)k * 11) % 800);
    r[k]->n_prompt[0] = np;
    r[k]->max_tokens = MAXT;
    r[k]->ignore_eos = 1;
    if (gen_request_prepare(r[k]) || engine_submit(e, r[k], err, sizeof err)) {
      fprintf(stderr, "submit: %s\n", err);
      return -1;
    }
  }
  for (int k = 0; k < NREQ; k++) {
    pthread_mutex_lock(&r[k]->mu);
    while (r[k]->n_done < r[k]->n_choices)
      gen_request_wait(r[k], 100);
    gen_choice *c = &r[k]->choices[0];
    snprintf(out->text[k], sizeof out->text[k], "%s", c->text ? c->text : "");
    out->reason[k] = c->finish_reason;
    out->n_gen[k] = c->n_gen;
    pthread_mutex_unlock(&r[k]->mu);
    gen_request_release(r[k]);
  }
  engine_stats st;
  engine_get_stats(e, &st);
  out->preemptions = st.preemptions;
  engine_free(e);
  metrics_destroy(&mx);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_engine_preempt FIXTURES\n");
    return 2;
  }
  char path[4096], err[512];
  snprintf(path, sizeof path, "%s/qwen3", argv[1]);
  anna_model *m;
  anna_text *t;
  if (anna_model_load(&m, path, NULL, err, sizeof err) ||
      anna_text_open(&t, path, 0, err, sizeof err)) {
    fprintf(stderr, "load %s: %s\n", path, err);
    return 1;
  }
  static result ref, small;
  for (int pc = 0; pc < 2; pc++) {
    if (run(m, t, 0, pc, &ref)) return 1;
    CHECK(ref.preemptions == 0);
    /* each sequence needs up to 6 blocks of 16 (prompt <= 34, + 60); 9 hold one and a half */
    if (run(m, t, 9, pc, &small)) return 1;
    printf("prompt cache %d: %lld preemptions\n", pc, (long long)small.preemptions);
    CHECK(small.preemptions > 0);
    for (int k = 0; k < NREQ; k++) {
      CHECK(ref.reason[k] && !strcmp(ref.reason[k], "length") && ref.n_gen[k] == MAXT);
      CHECK(small.reason[k] && !strcmp(small.reason[k], "length") && small.n_gen[k] == MAXT);
      CHECK(strlen(ref.text[k]) > 20); /* a real comparison: text came out */
      CHECK(!strcmp(ref.text[k], small.text[k]));
      if (strcmp(ref.text[k], small.text[k]))
        fprintf(stderr, "request %d:\n  ref   %s\n  small %s\n", k, ref.text[k], small.text[k]);
    }
  }
  anna_text_free(t);
  anna_model_free(m);
  if (fails) {
    fprintf(stderr, "test_engine_preempt: %d checks failed\n", fails);
    return 1;
  }
  printf("test_engine_preempt: ok\n");
  return 0;
}
