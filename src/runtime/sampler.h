/* sampler.h: internal names of the public sampler (anna.h: anna_sampler_*, implemented in
 * sampler.c; the pipeline and the candidate contract are documented there).
 *
 * Transitional: src/server/engine.c and tests/engine/test_ops.c still spell the sampler
 * sampler_* / sampler_params; these aliases keep them compiling unchanged. New code uses the
 * anna_sampler_* names. TODO(lead): delete this header once engine.c and test_ops.c do.
 */
#ifndef ANNA_RUNTIME_SAMPLER_H
#define ANNA_RUNTIME_SAMPLER_H

#include "anna/anna.h"

typedef anna_sampler_params sampler_params;
typedef anna_sampler sampler;

#define sampler_params_default anna_sampler_params_default
#define sampler_create anna_sampler_create
#define sampler_free anna_sampler_free
#define sampler_accept anna_sampler_accept
#define sampler_reset anna_sampler_reset
#define sampler_sample anna_sampler_sample
#define sampler_candidates_k anna_sampler_candidates_k
#define sampler_sample_candidates anna_sampler_sample_candidates

#endif
