/* sampler.h: next-token selection from logits, one sampler per sequence.
 *
 * Pipeline (the order llama.cpp and HF agree on): penalties (repetition on every token seen,
 * presence/frequency on counts) -> greedy if temperature <= 0 -> temperature -> top-k ->
 * top-p -> min-p -> draw with a seeded xoshiro256** RNG, so a seed reproduces a run. The
 * sampler owns vocab-sized scratch allocated at creation: sampling allocates nothing.
 */
#ifndef ANNA_RUNTIME_SAMPLER_H
#define ANNA_RUNTIME_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct sampler_params {
  float temperature;        /* <= 0: greedy */
  int top_k;                /* <= 0: off */
  float top_p;              /* >= 1: off */
  float min_p;              /* <= 0: off */
  float repetition_penalty; /* 1: off (HF semantics: divide positive, multiply negative logits) */
  float presence_penalty;   /* 0: off (OpenAI semantics) */
  float frequency_penalty;  /* 0: off */
  uint64_t seed;
} sampler_params;

/* Defaults: greedy, no penalties. */
sampler_params sampler_params_default(void);

typedef struct sampler sampler;

/* Caller frees with sampler_free. */
int sampler_create(sampler **out, int vocab, const sampler_params *p, char *err, size_t errlen);
void sampler_free(sampler *s);
/* Records a token as seen (prompt or generated) for the penalties. */
void sampler_accept(sampler *s, int32_t token);
/* Forgets the seen tokens (new sequence); keeps the RNG stream. */
void sampler_reset(sampler *s);
/* Picks the next token. logits[vocab] is modified (penalties, scaling). */
int32_t sampler_sample(sampler *s, float *logits);

#endif
