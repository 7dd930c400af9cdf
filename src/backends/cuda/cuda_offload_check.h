/* cuda_offload_check.h: test-only hooks of the CUDA backend's expert offload and weight
 * mirror (cuda_offload.cu, cuda_backend.cu), kept out of cuda_backend.h so the engine never
 * sees them. Every call is for tests and diagnosis: each waits for queued work or walks
 * host tables, none belongs in a serving path. */
#ifndef ANNA_BACKENDS_CUDA_OFFLOAD_CHECK_H
#define ANNA_BACKENDS_CUDA_OFFLOAD_CHECK_H

#include "ops/ops.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Offloaded layer calls by the path they took (zeros when offload is off): zero-copy
 * kernels on the device table; routed ids read back and misses copied into staging slots
 * (decode batches of up to 8 tokens); prefill streamed; and calls above 8 tokens with
 * streaming on that did not stream (exact mode, a recorded zero-copy step, types the grouped
 * path refuses, no room for its workspace), counted besides the path they then took. */
typedef struct cuda_offload_paths {
  int64_t zero_copy, staged, streamed, stream_declined;
} cuda_offload_paths;
void cuda_backend_offload_paths(ops_backend *be, cuda_offload_paths *out);

/* Validates the offload's state (waits for all queued work; slow: reads every cache slot
 * back): the store's invariants (expert_store_check); every occupied cache slot's device
 * bytes equal its expert's bytes in the weights; every mirrored expert's host copy equals the
 * weights; with zero-copy, the device table points each expert at its cache slot or, when
 * not cached, at its mirror copy. 0 (also when offload is off or not sized yet), else
 * ANNA_ESTATE naming the first layer / expert / slot that is wrong, or the code of a CUDA or
 * read failure; the message goes to err. */
int cuda_backend_offload_check(ops_backend *be, char *err, size_t errlen);

/* 1 when host is a key of the backend's mirror map (a mirrored weight, or data kept under
 * that address, such as a layer's expert pointer table), else 0. Tests that free weights and
 * make new ones see with it whether a new host address would find a stale copy (why they
 * drop the mirrors between cases). */
int cuda_backend_mirror_has(ops_backend *be, const void *host);

#ifdef __cplusplus
}
#endif
#endif
