/* sample_tail.h: the head walk of a draw that anna_sampler_sample_candidates_tail hands to
 * anna_context_sample_tail (runtime-internal; sampler.c and context.c). One definition so the
 * sampler and the context subtract the head's probabilities from u in the same order and
 * arithmetic as anna_sampler_sample does (C11 mode: no floating-point contraction). */
#ifndef ANNA_RUNTIME_SAMPLE_TAIL_H
#define ANNA_RUNTIME_SAMPLE_TAIL_H

#include "anna/anna.h"

/* u -= prob[i] over the kept head; the index where u reaches <= 0, or -1 with *u what is left. */
static inline int32_t sample_tail_head_walk(const anna_sample_tail *t, double *u) {
  double v = *u;
  for (int32_t i = 0; i < t->kept; i++) {
    v -= t->prob[i];
    if (v <= 0) {
      *u = v;
      return i;
    }
  }
  *u = v;
  return -1;
}

#endif
