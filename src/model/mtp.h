/* mtp.h: running a model's multi-token-prediction head (text_model.mtp, model.h).
 *
 * An mtp_state is the head's per-context state: its own KV cache (one full-attention layer,
 * a fwd_state of the head's one-layer decoder, n_seq sequences of n_ctx positions) and the
 * scratch of the input projection, all allocated once at creation in the backend's memory;
 * mtp_run allocates nothing. Row t of a sequence is the pair (h_t, tok_{t+1}) at position t:
 * the head's cache holds one entry per main-model position, rewound like any attention cache.
 * The state borrows the model and the backend, which must outlive it.
 */
#ifndef ANNA_MODEL_MTP_H
#define ANNA_MODEL_MTP_H

#include "model/forward.h"
#include "model/model.h"

typedef struct mtp_state mtp_state;

/* m must have a head (m->mtp); ANNA_EINVAL otherwise. Caller frees with mtp_state_free. */
int mtp_state_create(mtp_state **out, const text_model *m, ops_backend *be, int n_seq, int n_ctx, int n_batch,
                     char *err, size_t errlen);
void mtp_state_free(mtp_state *s);

/* The b->n rows (b->tokens: tok_{t+1}; b->pos: t; b->seq) through the head, h_in [b->n, H] host
 * memory (the main model's final-norm hidden states h_t, or a previous step's h_out). For the
 * flagged rows: logits to out [n_flagged, vocab] or candidates to tk (both NULL: neither), and
 * the head's post-norm outputs to h_out [n_flagged, H] (NULL: not wanted). */
int mtp_run(const text_model *m, ops_backend *be, mtp_state *s, const anna_batch *b, const float *h_in, float *h_out,
            float *out, const fwd_topk *tk, char *err, size_t errlen);

/* The head's cache per sequence (fwd_state's rules; attention only, so any n <= len). */
int32_t mtp_seq_len(const mtp_state *s, int seq);
void mtp_seq_reset(mtp_state *s, int seq);
int mtp_seq_rewind(mtp_state *s, int seq, int32_t n, char *err, size_t errlen);

#endif
