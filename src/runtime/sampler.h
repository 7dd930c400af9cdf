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

/* Sampling from candidates (the backend's topk op, ops.h: the k best logits of a row, sorted,
 * plus the row's max and softmax sum) instead of the full row, so that the logits need not
 * leave the device. sampler_candidates_k: the k the parameters need (1 for greedy, top_k, or
 * the sorted head of 256 for top-p / min-p without top-k), 0 when only the full row will do
 * (penalties, pure temperature sampling, top_k above OPS_TOPK_MAX). *temp (may be NULL): the
 * temperature the op's softmax sum must be taken at, 0 when the sum is not used.
 * sampler_sample_candidates: with k >= sampler_candidates_k candidates of a row
 * (idx/val[k], stats[2] as ops.h), draws exactly the token sampler_sample would draw from that
 * row (same RNG consumption) and returns 0; or returns 1 having consumed nothing when the
 * candidates do not decide it (the top-p nucleus or the min-p survivors reach past them, or
 * k too small): the caller samples the full row with sampler_sample instead. With a device's
 * softmax sum (not summed as the CPU reference does) a draw can differ only where the
 * probabilities' last-bit rounding decides it. A row without a finite logit (all -inf / NaN)
 * is garbage either way: there the two paths may name different tokens. */
int sampler_candidates_k(const sampler *s, float *temp);
int sampler_sample_candidates(sampler *s, const int32_t *idx, const float *val, int k, const double *stats,
                              int32_t *out);

#endif
