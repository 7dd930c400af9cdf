/* model_handle.h: what the public opaque anna_model is: a loaded model of some kind
 * (model/kind.h) plus what the runtime resolved at load. The runtime reaches the model
 * only through kind's table; impl is the kind's own struct (a text_model for the text
 * decoder), owned by the handle and freed with kind->free by anna_model_free. Immutable
 * after anna_model_load, so several contexts may share it.
 */
#ifndef ANNA_RUNTIME_MODEL_HANDLE_H
#define ANNA_RUNTIME_MODEL_HANDLE_H

#include "anna/anna.h"
#include "base/tuning.h"
#include "model/kind.h"

/* Where a context's media encoders (vision tower, audio encoder) run: the context's first
 * device with its numerics, or the CPU when tuning encoder_cpu is set (context.c resolves
 * it at context creation). Plain data, copied into the per-context encoder state. */
typedef struct ctx_encoder_device {
  const struct backend_info *bi; /* registry entry (static) */
  int index;                     /* device ordinal ("cuda:N") */
  int n_threads;                 /* CPU backend workers */
  int exact_matmul;              /* --exact: f32 matmuls on the device too */
  anna_tuning tuning;            /* the context's resolved switches */
} ctx_encoder_device;

struct anna_model {
  const model_kind *kind; /* static table */
  void *impl;             /* owned: kind->free */
  char *path;             /* owned: the folder or file it was loaded from */
  model_desc desc;        /* kind->describe(impl), read once (strings borrowed from impl) */
  int compute_bf16;   /* anna_model_options.dtype "bf16": contexts on cuda round GEMM inputs to bf16
                       */
  anna_tuning tuning; /* resolved at load (ANNA_TUNING, then anna_model_options.tuning) */
  struct model_vision *vis; /* owned, NULL without a vision tower (api_vision.c) */
  struct model_audio *aud;  /* owned, NULL without an audio encoder (api_audio.c) */
};

/* api_vision.c: the optional vision tower of a model and the per-context vision state. */
typedef struct ctx_vision ctx_vision;
/* After the text kind loaded src: loads the tower when the folder has one, or from mmproj (a
 * GGUF or folder; anna_model_options.mmproj) when given (m->vis). */
int model_vision_attach(anna_model *m, const model_source *src, const model_load_params *lp, const char *mmproj,
                        char *err, size_t errlen);
void model_vision_detach(anna_model *m);
/* Per-context: rotary deltas of n_seq sequences, positions scratch for n_batch rows, an
 * encoder output cache of cache_bytes (anna_context_options.mm_cache_bytes: 0 the default
 * 256 MiB, < 0 off); the tower runs on dev. NULL *out (and 0) when m has no tower. Caller
 * frees with ctx_vision_free. */
int ctx_vision_create(ctx_vision **out, const anna_model *m, int n_seq, int n_batch, const ctx_encoder_device *dev,
                      int64_t cache_bytes, char *err, size_t errlen);
void ctx_vision_free(ctx_vision *v);
/* Rotary positions for a batch whose sequences carry deltas: *rope = NULL when none does,
 * else [3 * b->n] in v's scratch. ANNA_ERANGE when b->n exceeds n_batch. */
int ctx_vision_rope(ctx_vision *v, const anna_batch *b, const int32_t **rope, char *err, size_t errlen);
void ctx_vision_seq_reset(ctx_vision *v, int seq);
/* dst takes src's first n positions: the delta those positions end with. */
void ctx_vision_seq_copy(ctx_vision *v, int dst, int src, int32_t n);
/* seq keeps its first n positions (rewind): the delta they end with. */
void ctx_vision_seq_truncate(ctx_vision *v, int seq, int32_t n);
/* context.c: one decoder run with multimodal extras (embd / embd_idx / n_embd / rope_pos of
 * model_input; NULL: none, the sequences' deltas apply). */
int context_run_mm(anna_context *c, const anna_batch *b, const model_input *mm, float *out, char *err,
                   size_t errlen);
ctx_vision *context_vision(anna_context *c);
/* context.c, for the drafters (spec_mtp.c): a decode that also writes the flagged rows'
 * final-norm hidden states to hidden [n_flagged, H] (out NULL: no logits, no lm_head); the
 * verify windows of anna_context_verify with the rows' hidden states (window order, k + 1 rows
 * each) to hidden (NULL: none); the context's backend table and shape. */
int context_run_hidden(anna_context *c, const anna_batch *b, float *out, float *hidden, char *err, size_t errlen);
int context_verify_hidden(anna_context *c, anna_spec_window *w, int n, float *hidden, char *err, size_t errlen);
/* Both: the windows of anna_context_verify_sampled (smp NULL: greedy) with hidden rows. */
int context_verify_any(anna_context *c, anna_spec_window *w, int n, anna_sampler *const *smp, float *logits,
                       float *hidden, char *err, size_t errlen);
ops_backend *context_backend(anna_context *c);
void context_shape(const anna_context *c, int *n_seq, int *n_ctx, int *n_batch);
const anna_model *context_model(const anna_context *c);

/* api_vision.c, for tests: md's preprocessed pixels [*n_patches, *patch_dim] (borrowed; NULL for
 * audio), and the tower's rows of md alone [anna_media_n_tokens(md), n_embd] into rows (the
 * encoder cache is used as at prefill). */
const float *media_pixels(const anna_media *md, int64_t *n_patches, int32_t *patch_dim);
int ctx_vision_encode(anna_context *c, const anna_media *md, float *rows, char *err, size_t errlen);

/* api_audio.c: the optional audio encoder of a model (Qwen3-ASR) and its per-context state. */
typedef struct ctx_audio ctx_audio;
typedef struct audio_clip audio_clip; /* an audio media item's features */
/* After the text kind loaded src: loads the encoder when src is a qwen3_asr folder (m->aud). */
int model_audio_attach(anna_model *m, const model_source *src, const model_load_params *lp, char *err,
                       size_t errlen);
void model_audio_detach(anna_model *m);
/* NULL *out (and 0) when m has no audio encoder. Caller frees with ctx_audio_free. */
int ctx_audio_create(ctx_audio **out, const anna_model *m, int n_batch, const ctx_encoder_device *dev, char *err,
                     size_t errlen);
void ctx_audio_free(ctx_audio *a);
/* anna_context_prefill for a context with an audio encoder. */
int ctx_audio_prefill(anna_context *c, int seq, const anna_prompt *p, float *logits, char *err, size_t errlen);
ctx_audio *context_audio(anna_context *c);
void audio_clip_free(audio_clip *a);
/* api_vision.c: wraps clip as a media item of n_tokens pads lasting `seconds` (ownership of clip
 * passes, also on error). */
int media_wrap_audio(anna_media **out, audio_clip *clip, int32_t n_tokens, double seconds, uint64_t hash,
                     char *err, size_t errlen);
/* The clip of an audio media item; NULL for an image. */
const audio_clip *media_audio_clip(const anna_media *md);

/* A media encoder kind (the vision tower, the audio encoder) beside the text model: its own
 * backend on dev (the kind's weights are mirrored by the backend on first use, once per
 * open) and one-sequence state for runs of up to cap rows (what = the encoder's name in
 * messages). *be and *st are the caller's, freed with ctx_encoder_close (also on failure:
 * both NULL afterwards). */
int ctx_encoder_open(const model_kind *k, const void *impl, const ctx_encoder_device *dev, int64_t cap,
                     const char *what, ops_backend **be, void **st, char *err, size_t errlen);
void ctx_encoder_close(const model_kind *k, ops_backend **be, void **st);

#endif
