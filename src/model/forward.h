/* forward.h: the one forward pass, for every architecture, over a batch of tokens from
 * several sequences, written against ops.h.
 *
 * fwd_state owns the per-sequence state (KV caches of attention layers, conv and recurrent
 * state of GDN layers, lengths) and the activation scratch, all allocated once by
 * fwd_state_create for (n_seq, n_ctx, n_batch): forward_batch allocates nothing.
 */
#ifndef ANNA_MODEL_FORWARD_H
#define ANNA_MODEL_FORWARD_H

#include "anna/anna.h"
#include "model/model.h"
#include "ops/ops.h"

typedef struct fwd_state fwd_state;

/* Caller frees with fwd_state_free. */
/* be is borrowed: state and scratch live in its memory; it must outlive the state.
 * n_ckpt: recurrent-state checkpoint slots (used only by models with GDN layers). */
int fwd_state_create(fwd_state **out, const anna_model *m, ops_backend *be, int n_seq, int n_ctx, int n_batch,
                     int n_ckpt, int kv_type, char *err, size_t errlen);
/* Bytes of KV cache per token of one sequence (all attention layers, K and V). */
int64_t fwd_state_kv_bytes_per_token(const fwd_state *s);
void fwd_state_free(fwd_state *s);
/* Floats of per-thread scratch the CPU backend needs for this model. */
int64_t fwd_backend_scratch_floats(const anna_model *m, int n_ctx);

int32_t fwd_state_seq_len(const fwd_state *s, int seq);
void fwd_state_seq_reset(fwd_state *s, int seq);

/* Prefix reuse. Attention KV can be cut at any position; recurrent (GDN) state only where
 * it was saved: fwd_state_checkpoint saves seq's state at its current length (into the
 * least recently saved slot when the pool is full); rewind and copy then accept that
 * position, or the source's current length. Models without GDN layers need no checkpoint.
 *   rewind: seq keeps its first n positions.
 *   copy:   dst becomes a copy of the first n positions of src (KV rows and state). */
int fwd_state_checkpoint(fwd_state *s, int seq, char *err, size_t errlen);
int fwd_state_seq_rewind(fwd_state *s, int seq, int32_t n, char *err, size_t errlen);
int fwd_state_seq_copy(fwd_state *s, int dst, int src, int32_t n, char *err, size_t errlen);

/* Runs the batch (see anna_batch) and writes logits of flagged tokens to out. */
int forward_batch(const anna_model *m, ops_backend *be, fwd_state *s, const anna_batch *b, float *out,
                  char *err, size_t errlen);

#endif
