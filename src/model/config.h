/* config.h: the architecture description every loader produces and the forward pass reads.
 *
 * model_config is plain data, filled once by config_parse_hf (config.json) or by the GGUF
 * loader, then never changed. Everything the forward pass needs to know about a family is
 * resolved here into per-layer fields (kind, head dim, rope table parameters, KV source),
 * so the forward code has no `if (arch == ...)` beyond the few genuinely different blocks.
 */
#ifndef ANNA_MODEL_CONFIG_H
#define ANNA_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "ops/ops.h" /* enum act_kind: the activations the backends implement */

#define CONFIG_MAX_LAYERS 256

enum model_arch {
  MODEL_ARCH_QWEN3_5 = 0, /* dense hybrid GDN + gated attention */
  MODEL_ARCH_QWEN3_5_MOE,
  MODEL_ARCH_GEMMA4,
  MODEL_ARCH_GEMMA3,
  MODEL_ARCH_QWEN3,
  MODEL_ARCH_QWEN2,
  MODEL_ARCH_LLAMA,
  MODEL_ARCH_QWEN3_MOE,
};

enum layer_kind {
  LAYER_KIND_ATTN = 0,  /* full causal attention */
  LAYER_KIND_SLIDING,   /* causal attention over the last `window` positions */
  LAYER_KIND_GDN,       /* Gated DeltaNet (linear attention) */
};

enum rope_kind { ROPE_KIND_DEFAULT = 0, ROPE_KIND_LINEAR, ROPE_KIND_LLAMA3, ROPE_KIND_PROPORTIONAL, ROPE_KIND_YARN };

/* Where a layer's rope attention factor (YaRN's mscale: transformers multiplies cos and sin by
 * it, so the rotated dims of q and k) is applied, the rope ops taking only an inv_freq table. */
enum rope_fold {
  ROPE_FOLD_NONE = 0, /* factor 1 */
  ROPE_FOLD_SCALE,    /* full rotary, one factor for every layer: factor^2 is in attn_scale */
  ROPE_FOLD_NORM,     /* q_norm / k_norm weights of the rotated dims scaled at load (config_rope_fold_norm) */
};

enum norm_kind {
  NORM_KIND_W = 0,    /* x/rms * w */
  NORM_KIND_1PW,      /* x/rms * (1 + w): zero-centred weights (Qwen3.5, Gemma3) */
};

typedef struct layer_config {
  int kind;            /* layer_kind */
  int head_dim;        /* attention head dim of this layer */
  int n_kv_heads;
  int rope_dims;       /* rotated dims (pairs i, i + rope_dims/2) */
  double rope_theta;
  int rope_n_freq;     /* non-zero frequencies (rest are 0: identity rotation) */
  int rope_freq_denom; /* inv_freq_i = theta^(-2i/denom), then scaled per rope_type */
  int rope_type;       /* rope_kind */
  double rope_factor;  /* linear / llama3 factor (1 = none) */
  double rope_low_freq_factor, rope_high_freq_factor, rope_orig_max_pos; /* llama3 (orig: also yarn) */
  double rope_beta_fast, rope_beta_slow; /* yarn correction range, in rotations */
  int rope_truncate;                     /* yarn: floor/ceil the correction range */
  double rope_attn_factor;               /* yarn mscale on the rotated dims (1 = none; 0 reads as 1) */
  int rope_fold;                         /* rope_fold: how rope_attn_factor is applied */
  int rope_interleaved; /* pairs (2i, 2i+1) (llama.cpp's Llama GGUF layout) instead of NeoX */
  int kv_source;       /* layer whose K/V this layer reads (itself unless Gemma4 KV sharing) */
  int is_moe;          /* sparse MoE FFN in this layer */
  int ffn_dim;         /* dense MLP width (0 = none) */
  int window;          /* sliding window (0 = none) */
} layer_config;

typedef struct model_config {
  int arch;            /* model_arch */
  char model_type[64];
  int n_layers, hidden, vocab, n_heads, n_kv_heads, head_dim, ffn_dim;
  double eps;
  int tie_embeddings;
  int norm;            /* norm_kind of the block/final norms and q/k norms */
  int act;             /* act_kind of the MLP */
  float embed_scale;   /* embeddings multiplied by this (1 or sqrt(H)) */
  float attn_scale;    /* score scale */
  float attn_softcap;  /* 0 = none */
  float final_softcap; /* 0 = none */
  int qk_norm;         /* per-head q/k RMSNorm */
  int attn_bias;       /* q/k/v biases (Qwen2) */
  int attn_out_gate;   /* Qwen3.5: q_proj also yields a sigmoid output gate */
  /* Qwen3.5 multimodal rotary (text_config.rope_parameters.mrope_section, default 11 11 10):
   * rotary frequency j follows the H position when j % 3 == 1 and j < 3 * s[1], W when
   * j % 3 == 2 and j < 3 * s[2], else T (interleaved). All 0: the model has no mRoPE. */
  int mrope_section[3];
  int v_norm;          /* Gemma4: V = rmsnorm_noweight(v) */
  int k_eq_v;          /* Gemma4 attention_k_eq_v on full layers: V is the raw K projection */
  int post_norms;      /* Gemma: post-attention and post-FFN norms (4 norms per layer) */
  /* Gated DeltaNet */
  int gdn_hk, gdn_hv, gdn_dk, gdn_dv, gdn_conv;
  int gdn_v_tiled; /* V heads in tiled order (GGUF) */
  /* MoE */
  int n_experts, top_k, expert_ffn, shared_ffn, norm_topk;
  /* Gemma4 */
  int ple_dim, ple_vocab, n_kv_shared, double_wide, moe_block;
  layer_config layers[CONFIG_MAX_LAYERS];
} model_config;

/* Parses a Hugging Face config.json (composite configs: the text_config is used) into cfg.
 * Unknown model_type or an inconsistent field is ANNA_EUNSUPPORTED / ANNA_EFORMAT with a
 * message naming the file and field. */
int config_parse_hf(model_config *cfg, const char *path, char *err, size_t errlen);
/* A decoder described by a nested object of config.json (Qwen3-TTS: talker_config and its
 * code_predictor_config): the object at root[keys[0]][keys[1]]... parsed as model_type
 * as_type, which must be one of the classic families (qwen3, qwen2, llama). Messages name
 * path. */
int config_parse_hf_nested(model_config *cfg, const char *path, const char *const *keys, int n_keys,
                           const char *as_type, char *err, size_t errlen);

/* Gemma4 KV sharing: points each of the last n_kv_shared layers at the last earlier layer
 * of the same kind (kv_source) and copies its KV head count. 0 or ANNA_EFORMAT. */
int config_link_shared_kv(model_config *c, char *err, size_t errlen);

/* Fills inv_freq[0 .. rope_dims/2) for layer l (zeros past rope_n_freq). */
void config_rope_inv_freq(const layer_config *l, float *inv_freq);

/* Decides where each layer's rope attention factor goes (enum rope_fold), after a loader has
 * filled the layers: factor^2 into c->attn_scale when every attention layer is fully rotary
 * with the same factor, else into the q/k norm weights (qk_norm models). A factor that can go
 * nowhere is ANNA_EUNSUPPORTED naming path, the layer and why. Factor 1 everywhere: no-op. */
int config_rope_fold(model_config *c, const char *path, char *err, size_t errlen);

/* Scales the rotated dims [0, rope_dims) of a q_norm or k_norm weight vector w (the norm kind
 * c->norm) by l's attention factor when l->rope_fold is ROPE_FOLD_NORM; otherwise, or w NULL,
 * nothing. Loaders call it once on the f32 copies they own. */
void config_rope_fold_norm(const model_config *c, const layer_config *l, float *w);

/* Static name of a rope_kind ("yarn", ...). */
const char *config_rope_name(int rope_type);

/* Static name of an arch ("qwen3_5", ...). */
const char *config_arch_name(int arch);
/* The model_arch a config.json model_type names, or -1 when the text decoder has none. */
int config_arch_from_name(const char *model_type);

/* What a model kind's probe reads (model/kind.h), without parsing the rest: config.json's
 * model_type (top level, else text_config's) into model_type[mt_len] and the first entry of
 * its "architectures" ("" when absent) into architecture[arch_len], both truncated to fit.
 * A file that is not JSON, not an object or has no model_type is ANNA_EFORMAT with the
 * message config_parse_hf gives. */
int config_probe_hf(const char *path, char *model_type, size_t mt_len, char *architecture, size_t arch_len, char *err,
                    size_t errlen);

#endif
