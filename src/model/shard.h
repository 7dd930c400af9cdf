/* shard.h: one tensor-parallel shard of a text_model (Megatron-style column / row split), the
 * model side of --tensor-parallel N (runtime/tp.h is the communication side).
 *
 * Shard r of N holds:
 *   attention: query heads [r*Hq/N, (r+1)*Hq/N) (q rows with their output-gate rows, q bias),
 *              KV heads [r*Hkv/N, ...) (k, v rows and biases; its KV cache holds only these),
 *              the matching input columns of o_proj; q/k norms and rope tables replicated;
 *   GDN:       key heads [r*hk/N, ...) and the value heads that read them (grouped order: the
 *              contiguous range [r*hv/N, ...); GGUF's tiled order: heads t*hk + r*hk/N + i for
 *              every t < hv/hk), i.e. their rows of qkv / z / b / a, conv1d channels, a_log,
 *              dt_bias and out_proj input columns; the gated norm's weight replicated;
 *   MLP:       intermediate columns [r*I/N, ...) of gate / up (rows) and down (input columns);
 *   MoE:       the same split inside every routed expert and the shared expert; router,
 *              shared-expert gate and per-expert scales replicated;
 *   the rest (embeddings, norms, lm_head) borrowed from the full model, unchanged.
 * Every shard's o_proj / out_proj / down_proj output is a partial sum: the forward pass
 * all-reduces it (fwd_state_options.tp_all_reduce) before the residual add, so the sum of the
 * shards equals the unsplit layer up to float summation order.
 *
 * Row slices are views into the full model's weights when contiguous, else copies; column
 * slices are always copies (rows * slice bytes), and a quantized weight's slice must start and
 * end on its block boundaries. The shard borrows the full model's file mappings and small
 * vectors: the full model must outlive it. */
#ifndef ANNA_MODEL_SHARD_H
#define ANNA_MODEL_SHARD_H

#include "model/model.h"

#include <stddef.h>

/* Most shards of one context. */
#define SHARD_MAX 8

/* Whether m can be split into n shards: ANNA_EINVAL naming the head count, intermediate size
 * or block alignment that does not divide by n; ANNA_EUNSUPPORTED for families the split
 * does not cover (Gemma4: per-layer inputs, KV sharing, its MoE block). n = 1 is always fine. */
int model_shard_check(const text_model *m, int n, char *err, size_t errlen);

/* Shard rank of n (0 <= rank < n, 2 <= n <= SHARD_MAX) of m: a new text_model whose config
 * counts only its heads and intermediate columns. Caller frees with model_free. */
int model_shard_create(text_model **out, const text_model *m, int rank, int n, char *err,
                       size_t errlen);

#endif
