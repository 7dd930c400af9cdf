/* kind.h: model kinds: the one interface every kind of model implements, and the registry
 * of the kinds compiled in.
 *
 * A kind is a static table (model_kind): its name, what it consumes and produces (model_io
 * bits), a probe that says whether it reads an HF folder or GGUF file, load / free /
 * describe of the immutable model, create / free of the per-context state (n_seq, n_ctx,
 * n_batch, in an ops_backend's memory) and run (a batch of inputs -> outputs). Kinds that
 * keep per-sequence state across calls (decoders) also fill a model_seq_ops sub-table;
 * encoders leave it NULL and the runtime answers ANNA_EUNSUPPORTED for sequence calls.
 * The runtime (src/runtime/context.c) reaches a model only through this table, so a new
 * kind is a new file plus one registry line in kind.c, not a branch in forward.c.
 *
 * Implemented: the text decoder (model/text_decoder.c: tokens -> logits / top-k
 * candidates; Qwen3.5 also takes embedding rows over some tokens and 3-axis rope positions),
 * the Qwen3.5 vision tower (model/vision_qwen35.c: pixels -> embeddings), the Qwen3-ASR audio
 * encoder (model/audio_qwen3_asr.c: log-mel features -> embeddings) and the Qwen3-TTS codec
 * decoder (model/codec_qwen3_tts.c: codes -> pcm).
 *
 * Ownership: kind tables are static (never freed); a loaded model (impl) is freed with its
 * kind's free, a state with state_free; the probe source is plain data on the caller's
 * stack. Errors: 0 / negative ANNA_E* with the message in (err, errlen).
 */
#ifndef ANNA_MODEL_KIND_H
#define ANNA_MODEL_KIND_H

#include <stddef.h>
#include <stdint.h>

#include "anna/anna.h"
#include "base/tuning.h"
#include "ops/ops.h"

/* What flows into and out of a kind's run. A kind declares a bit set of each. */
enum model_io {
  MODEL_IO_TOKENS = 0, /* token ids of several sequences (anna_batch: token, seq, pos, flags) */
  MODEL_IO_EMBEDDINGS, /* float rows entering a decoder in place of token embeddings (next issues)
                        */
  MODEL_IO_LOGITS,     /* vocab logits of flagged rows, or their top-k candidates (model_topk) */
  MODEL_IO_HIDDEN,     /* final hidden states (after the final norm) of flagged rows (text decoder) */
  MODEL_IO_PIXELS,     /* image pixels, normalized float planes (vision encoder; next issues) */
  MODEL_IO_AUDIO,      /* audio features / samples (audio encoder; next issues) */
  MODEL_IO_CODES,      /* codec codes per frame and codebook (codec decoder; next issues) */
  MODEL_IO_PCM,        /* PCM samples (codec decoder output; next issues) */
  MODEL_IO_COUNT
};
#define MODEL_IO_BIT(io) (1u << (io))

/* Static name of an io kind ("tokens", "logits", ...); "?" out of range. */
const char *model_io_name(int io);

/* What a probe looks at: read once by model_kind_find, so kinds compare strings. */
typedef struct model_source {
  const char *path;       /* the HF folder or GGUF file */
  int is_gguf;            /* 0: HF folder (config.json), 1: GGUF file */
  char model_type[128];   /* HF: config.json model_type (top level, else text_config's) */
  char architecture[128]; /* HF: architectures[0] ("" when absent) */
  char gguf_arch[128];    /* GGUF: general.architecture */
} model_source;

/* Load-time settings the runtime resolved (anna_model_options). Borrowed for the call. */
typedef struct model_load_params {
  const anna_tuning *tuning; /* defaults, then ANNA_TUNING, then the options' string */
} model_load_params;

/* What the runtime reads of a loaded model. Strings borrowed from the model. */
typedef struct model_desc {
  const char *text; /* e.g. "qwen3_5: 8 layers, hidden 128, vocab 1000" */
  int vocab;        /* rows of MODEL_IO_LOGITS outputs (0: the kind produces none) */
  int n_embd;       /* width of MODEL_IO_EMBEDDINGS output rows (0: the kind produces none) */
  int n_layers;
  int hidden; /* width of MODEL_IO_HIDDEN output rows (0: the kind produces none) */
  int sample_rate;       /* MODEL_IO_PCM kinds: output rate in Hz (0: no PCM) */
  int samples_per_frame; /* MODEL_IO_PCM kinds: samples per input frame */
} model_desc;

/* Per-context state: the shape every kind gets, plus the cache layout decoders use
 * (encoders ignore those fields). Zeros mean the kind's defaults. */
typedef struct model_state_params {
  int n_seq, n_ctx, n_batch;
  int n_ckpt;            /* recurrent-state checkpoint / prefix-snapshot slots */
  int kv_type;           /* ops_kv_type of attention caches */
  int block_len;         /* positions per KV block */
  int64_t n_blocks;      /* KV blocks in the pool */
  int residual_len;      /* quantized caches: newest positions also kept in f32 */
  int prefix_share;      /* 1: prefix block pool on */
  int snapshot_interval; /* recurrent snapshots every N tokens inside a call (0: off) */
  /* Pipeline stages (fwd_state_options documents them; kinds with layer_split only):
   * stage_be[0] is the be state_create gets. n_stages 0 or 1: none. */
  int n_stages;
  ops_backend *const *stage_be;
  const int *stage_layers;
  /* Tensor parallelism (kinds with tp_shard only; not with stages): n_tp > 1 shards, shard r
   * tp_impl[r] (tp_shard's) on tp_be[r] (tp_be[0] is the be state_create gets); run fans out
   * with tp_exec (each shard on its own thread) and the forward pass sums partials with
   * tp_all_reduce (runtime/tp.h; ctx tp_ctx). Borrowed; they must outlive the state. */
  int n_tp;
  ops_backend *const *tp_be;
  void *const *tp_impl;
  void *tp_ctx;
  void (*tp_all_reduce)(void *ctx, int rank, ops_backend *be, float *buf, int64_t count);
  void (*tp_exec)(void *ctx, void (*fn)(void *arg, int rank), void *arg);
} model_state_params;

/* Top-k candidates instead of logits rows (anna_context_decode_topk): per flagged row r, the
 * k best logits idx/val[r * k + j] and stats[2r .. 2r + 1] (max, softmax sum at temp). */
typedef struct model_topk {
  int k;
  float temp;
  int32_t *idx;
  float *val;
  double *stats;
} model_topk;

/* One run's inputs: io names which member is set. Borrowed for the call. */
typedef struct model_input {
  int io;                  /* MODEL_IO_TOKENS, MODEL_IO_PIXELS or MODEL_IO_CODES */
  const anna_batch *batch; /* MODEL_IO_TOKENS: validated by the kind */
  /* MODEL_IO_PIXELS (host memory, validated by the kind): n_grids inputs (images or videos)
   * of grid_thw[3i .. 3i+2] = (t, h, w) patches, their n_patches = sum t*h*w rows of
   * patch_dim floats concatenated in the HF processor's order (pixel_values). */
  const float *pixels;
  int64_t n_patches;
  int patch_dim;
  int n_grids;
  const int32_t *grid_thw;
  /* MODEL_IO_TOKENS, optional (decoders that also take MODEL_IO_EMBEDDINGS): n_embd rows of
   * the model's hidden width replacing the token embeddings of batch rows embd_idx[i] (an
   * encoder's output over its pad tokens), and 3-axis rope positions rope_pos [3 * n] (T rows,
   * then H, then W; NULL: the batch positions on every axis). */
  const float *embd;
  const int32_t *embd_idx;
  int64_t n_embd;
  const int32_t *rope_pos;
  /* MODEL_IO_TOKENS, optional: the prefix cache's keys of the batch rows instead of their tokens
   * ([n]; image pads keyed by the image's content: fwd_mm.cache_keys). */
  const int32_t *cache_keys;
  /* MODEL_IO_CODES: the next n_frames frames of stream `seq`, frame-major
   * codes[n_frames * n_codebooks] (validated by the kind). */
  const int32_t *codes;
  int64_t n_frames; /* MODEL_IO_CODES: code frames; MODEL_IO_AUDIO: feature frames */
  int n_codebooks;
  int seq;
  /* MODEL_IO_AUDIO (host memory, validated by the kind): one clip's log-mel features
   * [n_mels, n_frames], mel-major as media/mel.h writes them. */
  const float *features;
  int n_mels;
} model_input;

/* One run's outputs (caller-owned memory). */
typedef struct model_output {
  int io;                 /* MODEL_IO_LOGITS, MODEL_IO_HIDDEN or MODEL_IO_EMBEDDINGS */
  float *logits;          /* MODEL_IO_LOGITS: [n_flagged * vocab], unused when topk is set */
  const model_topk *topk; /* MODEL_IO_LOGITS: candidates instead of rows (NULL: rows) */
  float *embd;            /* MODEL_IO_EMBEDDINGS: [rows, model_desc.n_embd] */
  int64_t embd_rows;      /* MODEL_IO_EMBEDDINGS: rows embd holds; the kind says how many it wrote */
  int64_t *embd_written;  /* MODEL_IO_EMBEDDINGS: receives the rows written (may be NULL) */
  float *pcm;             /* MODEL_IO_PCM: [n_frames * model_desc.samples_per_frame] */
  /* Final-norm hidden states of the flagged rows [n_flagged, model_desc.hidden]: with
   * MODEL_IO_HIDDEN only these (the forward stops before the lm_head); with MODEL_IO_LOGITS
   * optional beside the logits (kinds with a draft sub-table: the MTP head reads them), and
   * with logits and topk both NULL only these are computed. */
  float *hidden;
} model_output;

/* A draft head that ships with the model (Qwen3.5's MTP layer): rows (h_t, tok_{t+1}) at
 * position t in, the next-next token's logits / candidates and the head's own hidden state
 * out, over its own per-sequence cache. model_kind.draft is NULL for kinds that have none;
 * `available` says whether this loaded model has one. `state` is what state_create made. */
typedef struct model_draft_ops {
  int (*available)(const void *impl);
  int (*width)(const void *impl); /* H of the hidden rows in and out */
  int (*state_create)(void **state, const void *impl, ops_backend *be, const model_state_params *p, char *err,
                      size_t errlen);
  void (*state_free)(void *state);
  /* b: tokens tok_{t+1}, seq, pos t, flags; h_in [b->n, width] host; flagged rows' h_out
   * [n_flagged, width] (may be NULL) and candidates tk (may be NULL). Allocates nothing. */
  int (*run)(const void *impl, void *state, ops_backend *be, const anna_batch *b, const float *h_in, float *h_out,
             const model_topk *tk, char *err, size_t errlen);
  int32_t (*seq_len)(const void *state, int seq);
  void (*reset)(void *state, int seq);
  int (*rewind)(void *state, int seq, int32_t n, char *err, size_t errlen);
} model_draft_ops;

/* Per-sequence state of decoders: the entries behind anna_context_seq_* and the prefix
 * pool (anna.h documents each). `state` is what the kind's state_create made. */
/* The last run's logits rows where they are kept (model_seq_ops.logits_rows), with scratch in
 * that memory for the calls that sample there. Valid until the next run of the state; the
 * scratch is the state's, free between runs (the caller serialises, as for every state call). */
typedef struct model_rows {
  ops_backend *be; /* the backend whose memory holds them */
  float *logits;   /* [n][vocab] (backend memory); n = 0: the last run left none */
  int64_t n, vocab;
  void *tk_dev, *tk_host; /* the topk op's output block and its host twin, tk_bytes each */
  size_t tk_bytes;
  void *scr_dev, *scr_host; /* sampling scratch and its host twin, scr_bytes each */
  size_t scr_bytes;
} model_rows;

typedef struct model_seq_ops {
  int32_t (*seq_len)(const void *state, int seq);
  void (*reset)(void *state, int seq);
  int (*checkpoint)(void *state, int seq, char *err, size_t errlen);
  int (*rewind)(void *state, int seq, int32_t n, char *err, size_t errlen);
  /* Optional (NULL: none): the next run saves seq's recurrent state after each of its first
   * n tokens, so rewind reaches those positions directly (kv_cache_window); returns n when
   * it will, 0 when not (no recurrent state, too few checkpoint slots). */
  int32_t (*window)(void *state, int seq, int32_t n);
  int (*copy)(void *state, int dst, int src, int32_t n, char *err, size_t errlen);
  int32_t (*prefix_attach)(void *state, int seq, const int32_t *tokens, int32_t n,
                           int register_blocks);
  void (*kv_stats)(const void *state, anna_kv_stats *st);
  int64_t (*blocks_needed)(const void *state, int seq, int32_t n);
  int64_t (*blocks_held)(const void *state, int seq);
  int64_t (*kv_bytes_per_token)(const void *state);
  /* Optional: backend bytes of layer l's per-sequence state (KV pool and rings, recurrent
   * state), for placement reports. */
  int64_t (*layer_bytes)(const void *state, int l);
  /* Row `row` (flagged order) of the last run's logits to out[vocab]; ANNA_ERANGE if none. */
  int (*logits_row)(const void *state, int64_t row, float *out, char *err, size_t errlen);
  /* Optional (NULL: the kind keeps no rows there): where the last run's logits rows are kept,
   * for sampling them where they are (anna_context_sample_tail, anna_context_mask_topk). */
  void (*logits_rows)(void *state, model_rows *out);
} model_seq_ops;

typedef struct model_kind {
  const char *name; /* "text_decoder", ... */
  unsigned inputs;  /* MODEL_IO_BIT set it consumes */
  unsigned outputs; /* MODEL_IO_BIT set it produces */
  /* 1 when this kind reads src (by model_type / architectures / general.architecture), else 0.
   * Must not fail: model_kind_find has read and checked the source. */
  int (*probe)(const model_source *src);
  /* Loads src->path. Caller frees *impl with free. */
  int (*load)(void **impl, const model_source *src, const model_load_params *p, char *err,
              size_t errlen);
  void (*free)(void *impl);
  void (*describe)(const void *impl, model_desc *out);
  /* The shape a backend sizes its scratch for (ops.h), for states of n_ctx positions. */
  void (*backend_shape)(const void *impl, int n_ctx, ops_model_shape *out);
  /* Per-context state in be's memory (be borrowed: it must outlive the state; impl too).
   * Caller frees *state with state_free. */
  int (*state_create)(void **state, const void *impl, ops_backend *be, const model_state_params *p,
                      char *err, size_t errlen);
  void (*state_free)(void *state);
  /* Runs one batch; allocates nothing. An io the kind does not declare: ANNA_EUNSUPPORTED. */
  int (*run)(const void *impl, void *state, ops_backend *be, const model_input *in,
             const model_output *out, char *err, size_t errlen);
  /* Optional (NULL: none): one throwaway run that makes a backend copying weights on first
   * use (ops_backend.warmup) copy them now, leaving the state as it was. */
  int (*warmup)(const void *impl, void *state, ops_backend *be, char *err, size_t errlen);
  const model_seq_ops *seq; /* NULL for kinds without per-sequence state (encoders) */
  const model_draft_ops *draft; /* NULL: the kind never has a draft head */
  int layer_split; /* 1: state_create places model_state_params' pipeline stages */
  /* Optional (NULL: the kind is not split): shard rank of n of impl for tensor parallelism
   * (model/shard.h: a head count or size that does not divide is ANNA_EINVAL naming it),
   * freed with tp_shard_free; backend_shape and describe take a shard as they take impl. */
  int (*tp_shard)(void **out, const void *impl, int rank, int n, char *err, size_t errlen);
  void (*tp_shard_free)(void *shard);
} model_kind;

/* Number of compiled kinds and the i-th (0 is the text decoder); NULL past the end. */
int model_kind_count(void);
const model_kind *model_kind_get(int i);
/* The compiled kind of that name, or NULL. */
const model_kind *model_kind_by_name(const char *name);

/* Reads path (an HF folder's config.json, or a GGUF file's header) into *src and picks the
 * first registered kind whose probe accepts it. A missing path is ANNA_EIO ("<path>: no
 * such file or folder"); unreadable sources keep the config / GGUF readers' messages; a
 * source no kind reads is ANNA_EUNSUPPORTED: "<path>/config.json: model_type 'x' is not
 * supported" or "<path>: GGUF architecture 'x' is not supported". src->path borrows path. */
int model_kind_find(const char *path, model_source *src, const model_kind **out, char *err,
                    size_t errlen);

#endif
