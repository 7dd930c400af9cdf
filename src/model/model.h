/* model.h: a loaded text decoder (text_model): config + weight views + the per-layer
 * constant tables. It is the implementation behind the text decoder kind
 * (model/text_decoder.c, model/kind.h); the runtime sees it only through that table.
 *
 * Weights are ops_weight views into the mapped files (safetensors or GGUF): no copies,
 * except small vectors (norm weights, gates, conv kernels, biases) which are converted to
 * f32 once at load into model-owned memory. Loaders fill the same structs from either file
 * format through a tensor_source, so forward.c never knows where weights came from.
 */
#ifndef ANNA_MODEL_MODEL_H
#define ANNA_MODEL_MODEL_H

#include "anna/anna.h"
#include "model/config.h"
#include "ops/ops.h"

typedef struct layer_weights {
  /* norms (f32, NULL when absent) */
  float *attn_norm, *post_attn_norm, *pre_ff_norm, *post_ff_norm;
  /* attention */
  ops_weight q, k, v, o;
  float *q_bias, *k_bias, *v_bias, *q_norm, *k_norm;
  float *inv_freq; /* [rope_dims / 2] */
  /* Gated DeltaNet */
  ops_weight qkv, z, b, a, out;
  float *conv_w; /* [conv_dim, K] */
  float *a_log, *dt_bias, *gdn_norm;
  /* dense MLP */
  ops_weight gate, up, down;
  /* MoE: arrays of n_experts weights (gate_up fused: up == NULL, gate has 2I rows) */
  ops_weight router;
  ops_weight *exp_gate, *exp_up, *exp_down;
  ops_weight sh_gate, sh_up, sh_down, sh_gate_inp;
  int has_shared;
  /* E + 1 experts: the routed ones, then the shared one, when it has their shape and types
   * and gate/up are separate (model_link_shared_experts); else NULL. A backend with
   * matmul_group_route runs the shared expert as the routed kernels' expert E. */
  ops_weight *sx_gate, *sx_up, *sx_down;
  /* Gemma4 MoE block */
  float *router_scale, *per_expert_scale, *post_ff_norm1, *pre_ff_norm2, *post_ff_norm2;
  /* Gemma4 per-layer input */
  ops_weight ple_gate, ple_proj;
  float *ple_post_norm;
  float layer_scalar;
} layer_weights;

typedef struct text_model text_model;

/* The checkpoint's multi-token-prediction head (Qwen3.5 `mtp.*`, GGUF `blk.N.nextn.*`):
 *   x = fc(concat(norm_e(embed(tok_{t+1})), norm_h(h_t)))   (h_t: the main model's final-norm
 *   hidden state), then `dec`, a one-layer full-attention decoder run over x as embedding rows,
 *   whose final norm is the head's norm and whose lm_head / embed are the main model's
 *   (borrowed views). Chained drafts feed dec's post-norm output back as h. Owned by the main
 *   model (model_free); dec borrows its file mapping. */
typedef struct mtp_head {
  text_model *dec;
  ops_weight fc;        /* [H, 2H] */
  float *norm_e, *norm_h; /* [H] */
} mtp_head;

struct text_model {
  model_config cfg;
  char *path;
  char describe[160];
  ops_weight embed, lm_head;
  float *final_norm;
  /* Gemma4 PLE */
  ops_weight ple_embed, ple_model_proj;
  float *ple_proj_norm;
  layer_weights layers[CONFIG_MAX_LAYERS];
  mtp_head *mtp; /* NULL: the checkpoint has none */
  /* ownership */
  void *st;            /* safetensors_set* */
  void *gguf;          /* gguf_file* */
  void **allocs;       /* f32 conversions owned by the model */
  size_t n_allocs, cap_allocs;
  int64_t max_cols;    /* widest weight row, for dequant scratch */
};

/* A name -> tensor lookup the weight builder reads through. */
typedef struct tensor_info {
  int dtype;
  int ndim;
  int64_t shape[4]; /* outermost first (PyTorch order) */
  const void *data;
} tensor_info;

typedef int (*tensor_lookup_fn)(void *src, const char *name, tensor_info *out);

/* Fills the sx_* arrays of every MoE layer whose shared expert can run as one more routed
 * expert (see layer_weights); 0 or ANNA_ENOMEM. Both loaders call it last. */
int model_link_shared_experts(text_model *m, char *err, size_t errlen);

/* After a loader filled m->mtp (model.c for HF, gguf_model.c for GGUF): widens m's dequant
 * scratch to the head's widest row (fc has 2H columns) and links the head's shared expert. */
int model_mtp_finish(text_model *m, char *err, size_t errlen);

/* The shape a backend sizes its scratch for (ops.h), for contexts of n_ctx positions. */
void model_shape_get(const text_model *m, int n_ctx, ops_model_shape *out);

/* Zeroed memory owned by m (freed by model_free); NULL when out of memory. */
void *model_alloc(text_model *m, size_t bytes);

/* Loads an HF folder. Caller frees with model_free. */
int model_load_hf(text_model **out, const char *dir, char *err, size_t errlen);
/* A decoder stored under other names in an HF folder (Qwen3-TTS's talker and code
 * predictor): cfg (copied) gives the shapes, layers are `{prefix}layers.N.*` in the usual
 * names, embed / norm / lm_head are full tensor names ([cfg->vocab, hidden], [hidden],
 * [cfg->vocab, hidden]). Caller frees with model_free. */
int model_load_hf_named(text_model **out, const char *dir, const model_config *cfg, const char *prefix,
                        const char *embed, const char *norm, const char *lm_head, char *err, size_t errlen);
void model_free(text_model *m);

#endif
