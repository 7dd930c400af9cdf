/* codec_qwen3_tts.c: the Qwen3-TTS 12 Hz speech-tokenizer decoder (codes -> PCM) as a model
 * kind, with exact streaming. The header states the contract; the forward mirrors qwen-tts
 * 0.1.1's Qwen3TTSTokenizerV2Decoder.forward in time-major layout ([rows, channels]). */
#include "model/codec_qwen3_tts.h"

#include "base/error.h"
#include "formats/dtype.h"
#include "formats/quant.h"
#include "formats/safetensors.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CQ_MAX_Q 32     /* codebooks */
#define CQ_MAX_STAGES 8 /* upsampling_ratios, upsample_rates entries */
#define CQ_UNITS 3      /* residual units per decoder block (dilations 1, 3, 9) */
#define CQ_DEFAULT_BATCH 16
#define CQ_MAX_BATCH 256

enum { CQ_DENSE, CQ_DW, CQ_TCONV };

/* One causal conv: dense (w [cout, kw, cin]), depthwise (w [ch, kw]) or transposed
 * (w [stride, cout, m, cin]); ctx left-context rows kept per stream at tail_off. */
typedef struct cq_conv {
  int form, cin, cout, kw, dil, m, stride, ctx;
  float *w, *bias;
  int64_t tail_off;
} cq_conv;

typedef struct cq_snake {
  int ch;
  float *alpha, *inv_beta; /* exp(log alpha), 1 / (exp(log beta) + 1e-9) */
} cq_snake;

typedef struct cq_layer {
  float *in_norm, *post_norm, *ls_attn, *ls_mlp;
  float *bq, *bk, *bv, *bo; /* attention_bias only */
  ops_weight q, k, v, o, gate, up, down;
} cq_layer;

typedef struct cq_up {
  cq_conv tconv, dw;
  float *ln_w, *ln_b, *gamma, *pw1_b, *pw2_b;
  ops_weight pw1, pw2;
} cq_up;

typedef struct cq_block {
  cq_snake act;
  cq_conv tconv;
  cq_snake a1[CQ_UNITS], a2[CQ_UNITS];
  cq_conv c1[CQ_UNITS], c2[CQ_UNITS];
} cq_block;

typedef struct codec_model {
  /* decoder_config */
  int n_q, cb_size, cb_dim, q_dim, latent, hidden, n_heads, n_kv, head_dim, inter, n_layers, window;
  int n_up, up_ratio[CQ_MAX_STAGES], n_blocks, rate[CQ_MAX_STAGES], dec_dim, attn_bias;
  float eps, theta;
  int spf, sample_rate;
  /* weights */
  safetensors_set *st;
  ops_weight cb[CQ_MAX_Q]; /* f32 [cb_size, q_dim]: embedding_sum / max(cluster_usage, 1e-5) */
  ops_weight proj_first, proj_rest;
  cq_conv pre_conv;
  ops_weight in_proj, out_proj;
  float *in_proj_b, *out_proj_b, *norm, *inv_freq;
  cq_layer *layers;
  cq_up up[CQ_MAX_STAGES];
  cq_conv dec0;
  cq_block blocks[CQ_MAX_STAGES];
  cq_snake final_act;
  cq_conv final_conv;
  int64_t tail_floats; /* per stream: every conv's left context */
  int max_ctx;         /* largest ctx of any conv */
  void **allocs;       /* every host allocation above (freed with the model) */
  int n_allocs, cap_allocs;
  char describe[256];
} codec_model;

/* ---- loading ---- */

static void *cq_alloc(codec_model *m, size_t bytes) {
  if (m->n_allocs == m->cap_allocs) {
    int cap = m->cap_allocs ? 2 * m->cap_allocs : 64;
    void **a = realloc(m->allocs, sizeof *a * (size_t)cap);
    if (!a) return NULL;
    m->allocs = a, m->cap_allocs = cap;
  }
  void *p = calloc(1, bytes ? bytes : 1);
  if (p) m->allocs[m->n_allocs++] = p;
  return p;
}

typedef struct cq_load {
  codec_model *m;
  const char *file; /* for messages */
  char *err;
  size_t errlen;
} cq_load;

/* The tensor `name` with exactly the given shape (nd dims), else a message naming it. */
static int cq_find(cq_load *L, const safetensors_tensor **out, const char *name, int nd,
                   const int64_t *shape) {
  const safetensors_tensor *t = safetensors_find(L->m->st, name);
  *out = t;
  if (!t)
    return anna_err(L->err, L->errlen, ANNA_ENOTFOUND, "%s: missing tensor %s", L->file, name);
  int same = t->ndim == nd;
  for (int i = 0; same && i < nd; i++)
    same = t->shape[i] == shape[i];
  if (!same) {
    char want[128] = "", got[128] = "";
    for (int i = 0; i < nd; i++)
      snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? "," : "",
               (long long)shape[i]);
    for (int i = 0; i < t->ndim; i++)
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? "," : "",
               (long long)t->shape[i]);
    return anna_err(L->err, L->errlen, ANNA_EFORMAT,
                    "%s: tensor %s has shape [%s], the config implies [%s]", t->file, name, got,
                    want);
  }
  return 0;
}

static void cq_to_f32(const safetensors_tensor *t, float *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = safetensors_tensor_f32(t, i);
}

/* A tensor of the given shape as an f32 copy owned by the model. */
static int cq_f32(cq_load *L, float **out, const char *name, int nd, const int64_t *shape) {
  const safetensors_tensor *t;
  int rc = cq_find(L, &t, name, nd, shape);
  if (rc) return rc;
  int64_t n = 1;
  for (int i = 0; i < nd; i++)
    n *= shape[i];
  if (!(*out = cq_alloc(L->m, (size_t)n * 4)))
    return anna_err(L->err, L->errlen, ANNA_ENOMEM, "out of memory");
  cq_to_f32(t, *out, n);
  return 0;
}

static int cq_vec(cq_load *L, float **out, const char *name, int64_t n) {
  return cq_f32(L, out, name, 1, &n);
}

/* A matmul weight [rows, cols] (or [rows, cols, 1] when k1 is set: a kernel-1 Conv1d), borrowed
 * from the mapping in its file dtype. */
static int cq_lin(cq_load *L, ops_weight *w, const char *name, int64_t rows, int64_t cols, int k1) {
  const safetensors_tensor *t;
  const int64_t shape[3] = {rows, cols, 1};
  int rc = cq_find(L, &t, name, k1 ? 3 : 2, shape);
  if (rc) return rc;
  *w = (ops_weight){t->dtype, t->data, rows, cols};
  return 0;
}

static int cq_snake_load(cq_load *L, cq_snake *s, const char *prefix, int ch) {
  char n[256];
  int rc;
  s->ch = ch;
  snprintf(n, sizeof n, "%s.alpha", prefix);
  if ((rc = cq_vec(L, &s->alpha, n, ch))) return rc;
  snprintf(n, sizeof n, "%s.beta", prefix);
  if ((rc = cq_vec(L, &s->inv_beta, n, ch))) return rc;
  for (int c = 0; c < ch; c++) {
    s->alpha[c] = expf(s->alpha[c]);
    s->inv_beta[c] = 1.0f / (expf(s->inv_beta[c]) + 1e-9f);
  }
  return 0;
}

/* prefix.conv.{weight,bias}: a dense or depthwise causal Conv1d, weights repacked tap-major. */
static int cq_conv_load(cq_load *L, cq_conv *c, const char *prefix, int form, int cin, int cout,
                        int kw, int dil) {
  char n[256];
  int rc;
  float *raw;
  *c = (cq_conv){
      .form = form, .cin = cin, .cout = cout, .kw = kw, .dil = dil, .ctx = (kw - 1) * dil};
  snprintf(n, sizeof n, "%s.conv.weight", prefix);
  const int64_t shape[3] = {cout, form == CQ_DW ? 1 : cin, kw};
  if ((rc = cq_f32(L, &raw, n, 3, shape))) return rc;
  if (form == CQ_DW) {
    c->w = raw; /* [ch, 1, kw] is already [ch, kw] */
  } else {
    if (!(c->w = cq_alloc(L->m, (size_t)cout * cin * kw * 4)))
      return anna_err(L->err, L->errlen, ANNA_ENOMEM, "out of memory");
    for (int64_t o = 0; o < cout; o++)
      for (int64_t i = 0; i < cin; i++)
        for (int64_t k = 0; k < kw; k++)
          c->w[(o * kw + k) * cin + i] = raw[(o * cin + i) * kw + k];
  }
  snprintf(n, sizeof n, "%s.conv.bias", prefix);
  return cq_vec(L, &c->bias, n, cout);
}

/* prefix.conv.{weight,bias}: ConvTranspose1d(cin, cout, kernel, stride) with its last
 * kernel - stride outputs dropped (CausalTransConvNet). */
static int cq_tconv_load(cq_load *L, cq_conv *c, const char *prefix, int cin, int cout, int kernel,
                         int stride) {
  char n[256];
  int rc;
  float *raw;
  if (stride <= 0 || kernel % stride)
    return anna_err(L->err, L->errlen, ANNA_EUNSUPPORTED,
                    "%s: %s: kernel %d is not a multiple of stride %d", L->file, prefix, kernel,
                    stride);
  const int m = kernel / stride;
  *c =
      (cq_conv){.form = CQ_TCONV, .cin = cin, .cout = cout, .m = m, .stride = stride, .ctx = m - 1};
  snprintf(n, sizeof n, "%s.conv.weight", prefix);
  const int64_t shape[3] = {cin, cout, kernel};
  if ((rc = cq_f32(L, &raw, n, 3, shape))) return rc;
  if (!(c->w = cq_alloc(L->m, (size_t)cin * cout * kernel * 4)))
    return anna_err(L->err, L->errlen, ANNA_ENOMEM, "out of memory");
  for (int64_t p = 0; p < stride; p++)
    for (int64_t o = 0; o < cout; o++)
      for (int64_t u = 0; u < m; u++)
        for (int64_t i = 0; i < cin; i++)
          c->w[((p * cout + o) * m + u) * cin + i] =
              raw[(i * cout + o) * kernel + (m - 1 - u) * stride + p];
  snprintf(n, sizeof n, "%s.conv.bias", prefix);
  return cq_vec(L, &c->bias, n, cout);
}

/* ---- config ---- */

static int cq_int(cq_load *L, json_t *o, const char *k, int def, int lo, int hi, int *out) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) {
    if (def == INT_MIN)
      return anna_err(L->err, L->errlen, ANNA_EFORMAT, "%s: decoder_config.%s is missing", L->file,
                      k);
    *out = def;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
    return anna_err(L->err, L->errlen, ANNA_EFORMAT,
                    "%s: decoder_config.%s must be an integer in [%d, %d]", L->file, k, lo, hi);
  *out = (int)json_integer_value(v);
  return 0;
}

static int cq_list(cq_load *L, json_t *o, const char *k, const int *def, int ndef, int *out,
                   int *n) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) {
    memcpy(out, def, sizeof *out * (size_t)ndef);
    *n = ndef;
    return 0;
  }
  if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > CQ_MAX_STAGES)
    return anna_err(L->err, L->errlen, ANNA_EFORMAT,
                    "%s: decoder_config.%s must be a list of 1..%d integers", L->file, k,
                    CQ_MAX_STAGES);
  *n = (int)json_array_size(v);
  for (int i = 0; i < *n; i++) {
    json_t *e = json_array_get(v, (size_t)i);
    if (!json_is_integer(e) || json_integer_value(e) < 1 || json_integer_value(e) > 64)
      return anna_err(L->err, L->errlen, ANNA_EFORMAT,
                      "%s: decoder_config.%s[%d] must be an integer in [1, 64]", L->file, k, i);
    out[i] = (int)json_integer_value(e);
  }
  return 0;
}

static int cq_config(cq_load *L, const char *path) {
  codec_model *m = L->m;
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root)
    return anna_err(L->err, L->errlen, ANNA_EFORMAT, "%s: line %d: %s", path, je.line, je.text);
  const char *save = L->file;
  L->file = path;
  int rc = 0;
  json_t *d = json_object_get(root, "decoder_config");
  if (!json_is_object(d)) {
    rc = anna_err(L->err, L->errlen, ANNA_EFORMAT, "%s: decoder_config is missing", path);
    goto out;
  }
  static const int k_rates[] = {8, 5, 4, 3}, k_ratios[] = {2, 2};
  const int big = 1 << 20;
  if ((rc = cq_int(L, d, "codebook_size", 2048, 1, big, &m->cb_size)) ||
      (rc = cq_int(L, d, "codebook_dim", INT_MIN, 2, big, &m->cb_dim)) ||
      (rc = cq_int(L, d, "hidden_size", 1024, 1, big, &m->hidden)) ||
      (rc = cq_int(L, d, "latent_dim", 1024, 1, big, &m->latent)) ||
      (rc = cq_int(L, d, "num_attention_heads", 16, 1, 1024, &m->n_heads)) ||
      (rc = cq_int(L, d, "num_key_value_heads", 16, 1, 1024, &m->n_kv)) ||
      (rc = cq_int(L, d, "head_dim", m->n_heads ? m->hidden / m->n_heads : 0, 2, 4096,
                   &m->head_dim)) ||
      (rc = cq_int(L, d, "sliding_window", 72, 1, big, &m->window)) ||
      (rc = cq_int(L, d, "intermediate_size", 3072, 1, big, &m->inter)) ||
      (rc = cq_int(L, d, "num_hidden_layers", 8, 0, OPS_MAX_LAYERS, &m->n_layers)) ||
      (rc = cq_int(L, d, "num_quantizers", 16, 2, CQ_MAX_Q, &m->n_q)) ||
      (rc = cq_int(L, d, "decoder_dim", 1536, 1, big, &m->dec_dim)) ||
      (rc = cq_list(L, d, "upsample_rates", k_rates, 4, m->rate, &m->n_blocks)) ||
      (rc = cq_list(L, d, "upsampling_ratios", k_ratios, 2, m->up_ratio, &m->n_up)))
    goto out;
  json_t *v;
  double x = 1e-5;
  if ((v = json_object_get(d, "rms_norm_eps")) && json_is_number(v)) x = json_number_value(v);
  m->eps = (float)x;
  x = 10000;
  if ((v = json_object_get(d, "rope_theta")) && json_is_number(v)) x = json_number_value(v);
  m->theta = (float)x;
  m->attn_bias = json_is_true(json_object_get(d, "attention_bias"));
  if ((v = json_object_get(d, "rope_scaling")) && !json_is_null(v)) {
    rc = anna_err(L->err, L->errlen, ANNA_EUNSUPPORTED,
                  "%s: decoder_config.rope_scaling is not supported", path);
    goto out;
  }
  if ((v = json_object_get(d, "hidden_act")) &&
      !(json_is_string(v) && !strcmp(json_string_value(v), "silu"))) {
    rc = anna_err(L->err, L->errlen, ANNA_EUNSUPPORTED,
                  "%s: decoder_config.hidden_act must be \"silu\"", path);
    goto out;
  }
  if (m->cb_dim % 2 || m->head_dim % 2 || m->n_heads % m->n_kv || m->dec_dim % (1 << m->n_blocks) ||
      (m->dec_dim >> m->n_blocks) < 1) {
    rc = anna_err(L->err, L->errlen, ANNA_EFORMAT,
                  "%s: decoder_config: codebook_dim and head_dim must be even, heads a multiple of "
                  "KV heads and "
                  "decoder_dim divisible by 2^%d",
                  path, m->n_blocks);
    goto out;
  }
  m->q_dim = m->cb_dim / 2;
  m->spf = 1;
  for (int i = 0; i < m->n_up; i++)
    m->spf *= m->up_ratio[i];
  for (int i = 0; i < m->n_blocks; i++)
    m->spf *= m->rate[i];
  int dur = m->spf, sr = 24000;
  if ((v = json_object_get(root, "decode_upsample_rate")) && json_is_integer(v))
    dur = (int)json_integer_value(v);
  if ((v = json_object_get(root, "output_sample_rate")) && json_is_integer(v))
    sr = (int)json_integer_value(v);
  if (dur != m->spf) {
    rc =
        anna_err(L->err, L->errlen, ANNA_EFORMAT,
                 "%s: decode_upsample_rate %d differs from the product of the decoder's rates (%d)",
                 path, dur, m->spf);
    goto out;
  }
  m->sample_rate = sr;
out:
  L->file = save;
  json_decref(root);
  return rc;
}

/* ---- the kind table ---- */

static int file_exists(const char *dir, const char *name) {
  char p[PATH_MAX];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return stat(p, &st) == 0;
}

static int cq_probe(const model_source *src) {
  if (src->is_gguf) return 0;
  if (!strcmp(src->model_type, "qwen3_tts_tokenizer_12hz")) return 1;
  return !strcmp(src->model_type, "qwen3_tts") &&
         file_exists(src->path, "speech_tokenizer/config.json");
}

static void cq_free(void *impl) {
  codec_model *m = impl;
  if (!m) return;
  for (int i = 0; i < m->n_allocs; i++)
    free(m->allocs[i]);
  free(m->allocs);
  safetensors_close(m->st);
  free(m);
}

static int cq_weights(cq_load *L) {
  codec_model *m = L->m;
  char n[256], p[256];
  int rc;
  /* quantizer */
  for (int k = 0; k < m->n_q; k++) {
    const char *half = k ? "rest" : "first";
    const int j = k ? k - 1 : 0;
    float *sum, *usage;
    const int64_t sh[2] = {m->cb_size, m->q_dim};
    snprintf(n, sizeof n, "decoder.quantizer.rvq_%s.vq.layers.%d._codebook.embedding_sum", half, j);
    if ((rc = cq_f32(L, &sum, n, 2, sh))) return rc;
    snprintf(n, sizeof n, "decoder.quantizer.rvq_%s.vq.layers.%d._codebook.cluster_usage", half, j);
    if ((rc = cq_vec(L, &usage, n, m->cb_size))) return rc;
    for (int64_t r = 0; r < m->cb_size; r++) {
      const float u =
          usage[r] < 1e-5f ? 1e-5f : usage[r]; /* clamp(min=eps); NaN kept as torch does */
      for (int i = 0; i < m->q_dim; i++)
        sum[r * m->q_dim + i] /= (usage[r] != usage[r] ? usage[r] : u);
    }
    m->cb[k] = (ops_weight){ANNA_DTYPE_F32, sum, m->cb_size, m->q_dim};
  }
  if ((rc = cq_lin(L, &m->proj_first, "decoder.quantizer.rvq_first.output_proj.weight", m->cb_dim,
                   m->q_dim, 1)) ||
      (rc = cq_lin(L, &m->proj_rest, "decoder.quantizer.rvq_rest.output_proj.weight", m->cb_dim,
                   m->q_dim, 1)) ||
      (rc =
           cq_conv_load(L, &m->pre_conv, "decoder.pre_conv", CQ_DENSE, m->cb_dim, m->latent, 3, 1)))
    return rc;
  /* pre_transformer */
  const char *T = "decoder.pre_transformer";
  const int qd = m->n_heads * m->head_dim, kvd = m->n_kv * m->head_dim, H = m->hidden;
  snprintf(n, sizeof n, "%s.input_proj.weight", T);
  if ((rc = cq_lin(L, &m->in_proj, n, H, m->latent, 0))) return rc;
  snprintf(n, sizeof n, "%s.input_proj.bias", T);
  if ((rc = cq_vec(L, &m->in_proj_b, n, H))) return rc;
  snprintf(n, sizeof n, "%s.output_proj.weight", T);
  if ((rc = cq_lin(L, &m->out_proj, n, m->latent, H, 0))) return rc;
  snprintf(n, sizeof n, "%s.output_proj.bias", T);
  if ((rc = cq_vec(L, &m->out_proj_b, n, m->latent))) return rc;
  snprintf(n, sizeof n, "%s.norm.weight", T);
  if ((rc = cq_vec(L, &m->norm, n, H))) return rc;
  if (!(m->layers = cq_alloc(m, sizeof *m->layers * (size_t)(m->n_layers + 1))) ||
      !(m->inv_freq = cq_alloc(m, sizeof(float) * (size_t)m->head_dim)))
    return anna_err(L->err, L->errlen, ANNA_ENOMEM, "out of memory");
  /* transformers' default rope: 1 / theta^(2i / d), in f32 */
  for (int i = 0; i < m->head_dim / 2; i++)
    m->inv_freq[i] = 1.0f / powf(m->theta, (float)(2 * i) / (float)m->head_dim);
  for (int l = 0; l < m->n_layers; l++) {
    cq_layer *y = &m->layers[l];
    struct {
      ops_weight *w;
      float **b;
      const char *name;
      int rows, cols;
    } lin[] = {
        {&y->q, &y->bq, "self_attn.q_proj", qd, H},     {&y->k, &y->bk, "self_attn.k_proj", kvd, H},
        {&y->v, &y->bv, "self_attn.v_proj", kvd, H},    {&y->o, &y->bo, "self_attn.o_proj", H, qd},
        {&y->gate, NULL, "mlp.gate_proj", m->inter, H}, {&y->up, NULL, "mlp.up_proj", m->inter, H},
        {&y->down, NULL, "mlp.down_proj", H, m->inter}};
    for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
      snprintf(n, sizeof n, "%s.layers.%d.%s.weight", T, l, lin[i].name);
      if ((rc = cq_lin(L, lin[i].w, n, lin[i].rows, lin[i].cols, 0))) return rc;
      if (lin[i].b && m->attn_bias) {
        snprintf(n, sizeof n, "%s.layers.%d.%s.bias", T, l, lin[i].name);
        if ((rc = cq_vec(L, lin[i].b, n, lin[i].rows))) return rc;
      }
    }
    struct {
      float **v;
      const char *name;
    } vec[] = {{&y->in_norm, "input_layernorm.weight"},
               {&y->post_norm, "post_attention_layernorm.weight"},
               {&y->ls_attn, "self_attn_layer_scale.scale"},
               {&y->ls_mlp, "mlp_layer_scale.scale"}};
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
      snprintf(n, sizeof n, "%s.layers.%d.%s", T, l, vec[i].name);
      if ((rc = cq_vec(L, vec[i].v, n, H))) return rc;
    }
  }
  /* upsample stages */
  for (int i = 0; i < m->n_up; i++) {
    cq_up *u = &m->up[i];
    const int D = m->latent;
    snprintf(p, sizeof p, "decoder.upsample.%d.0", i);
    if ((rc = cq_tconv_load(L, &u->tconv, p, D, D, m->up_ratio[i], m->up_ratio[i]))) return rc;
    snprintf(p, sizeof p, "decoder.upsample.%d.1.dwconv", i);
    if ((rc = cq_conv_load(L, &u->dw, p, CQ_DW, D, D, 7, 1))) return rc;
    struct {
      float **v;
      const char *name;
      int n;
    } vec[] = {{&u->ln_w, "norm.weight", D},
               {&u->ln_b, "norm.bias", D},
               {&u->gamma, "gamma", D},
               {&u->pw1_b, "pwconv1.bias", 4 * D},
               {&u->pw2_b, "pwconv2.bias", D}};
    for (size_t j = 0; j < sizeof vec / sizeof vec[0]; j++) {
      snprintf(n, sizeof n, "decoder.upsample.%d.1.%s", i, vec[j].name);
      if ((rc = cq_vec(L, vec[j].v, n, vec[j].n))) return rc;
    }
    snprintf(n, sizeof n, "decoder.upsample.%d.1.pwconv1.weight", i);
    if ((rc = cq_lin(L, &u->pw1, n, 4 * D, D, 0))) return rc;
    snprintf(n, sizeof n, "decoder.upsample.%d.1.pwconv2.weight", i);
    if ((rc = cq_lin(L, &u->pw2, n, D, 4 * D, 0))) return rc;
  }
  /* decoder */
  if ((rc = cq_conv_load(L, &m->dec0, "decoder.decoder.0", CQ_DENSE, m->latent, m->dec_dim, 7, 1)))
    return rc;
  static const int k_dil[CQ_UNITS] = {1, 3, 9};
  for (int i = 0; i < m->n_blocks; i++) {
    cq_block *b = &m->blocks[i];
    const int cin = m->dec_dim >> i, cout = m->dec_dim >> (i + 1);
    snprintf(p, sizeof p, "decoder.decoder.%d.block.0", i + 1);
    if ((rc = cq_snake_load(L, &b->act, p, cin))) return rc;
    snprintf(p, sizeof p, "decoder.decoder.%d.block.1", i + 1);
    if ((rc = cq_tconv_load(L, &b->tconv, p, cin, cout, 2 * m->rate[i], m->rate[i]))) return rc;
    for (int u = 0; u < CQ_UNITS; u++) {
      snprintf(p, sizeof p, "decoder.decoder.%d.block.%d.act1", i + 1, u + 2);
      if ((rc = cq_snake_load(L, &b->a1[u], p, cout))) return rc;
      snprintf(p, sizeof p, "decoder.decoder.%d.block.%d.act2", i + 1, u + 2);
      if ((rc = cq_snake_load(L, &b->a2[u], p, cout))) return rc;
      snprintf(p, sizeof p, "decoder.decoder.%d.block.%d.conv1", i + 1, u + 2);
      if ((rc = cq_conv_load(L, &b->c1[u], p, CQ_DENSE, cout, cout, 7, k_dil[u]))) return rc;
      snprintf(p, sizeof p, "decoder.decoder.%d.block.%d.conv2", i + 1, u + 2);
      if ((rc = cq_conv_load(L, &b->c2[u], p, CQ_DENSE, cout, cout, 1, 1))) return rc;
    }
  }
  const int out_ch = m->dec_dim >> m->n_blocks;
  snprintf(p, sizeof p, "decoder.decoder.%d", m->n_blocks + 1);
  if ((rc = cq_snake_load(L, &m->final_act, p, out_ch))) return rc;
  snprintf(p, sizeof p, "decoder.decoder.%d", m->n_blocks + 2);
  return cq_conv_load(L, &m->final_conv, p, CQ_DENSE, out_ch, 1, 7, 1);
}

/* Calls fn on every conv, in forward order. */
static void cq_each_conv(codec_model *m, void (*fn)(codec_model *, cq_conv *)) {
  fn(m, &m->pre_conv);
  for (int i = 0; i < m->n_up; i++)
    fn(m, &m->up[i].tconv), fn(m, &m->up[i].dw);
  fn(m, &m->dec0);
  for (int i = 0; i < m->n_blocks; i++) {
    fn(m, &m->blocks[i].tconv);
    for (int u = 0; u < CQ_UNITS; u++)
      fn(m, &m->blocks[i].c1[u]), fn(m, &m->blocks[i].c2[u]);
  }
  fn(m, &m->final_conv);
}

static void cq_place_tail(codec_model *m, cq_conv *c) {
  c->tail_off = m->tail_floats;
  m->tail_floats += (int64_t)c->ctx * c->cin;
  if (c->ctx > m->max_ctx) m->max_ctx = c->ctx;
}

static int cq_load_model(void **impl, const model_source *src, const model_load_params *lp,
                         char *err, size_t errlen) {
  (void)lp;
  *impl = NULL;
  codec_model *m = calloc(1, sizeof *m);
  if (!m) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  char dir[PATH_MAX], cfg[PATH_MAX + 16];
  if (!strcmp(src->model_type, "qwen3_tts"))
    snprintf(dir, sizeof dir, "%s/speech_tokenizer", src->path);
  else
    snprintf(dir, sizeof dir, "%s", src->path);
  snprintf(cfg, sizeof cfg, "%s/config.json", dir);
  cq_load L = {m, cfg, err, errlen};
  int rc = cq_config(&L, cfg);
  if (!rc) rc = safetensors_open(&m->st, dir, err, errlen);
  if (!rc) {
    L.file = dir;
    rc = cq_weights(&L);
  }
  if (rc) {
    cq_free(m);
    return rc;
  }
  cq_each_conv(m, cq_place_tail);
  snprintf(
      m->describe, sizeof m->describe,
      "qwen3_tts_codec: %d codebooks x %d, %d layers (window %d), %d samples per frame at %d Hz",
      m->n_q, m->cb_size, m->n_layers, m->window, m->spf, m->sample_rate);
  *impl = m;
  return 0;
}

static void cq_describe(const void *impl, model_desc *out) {
  const codec_model *m = impl;
  *out = (model_desc){.text = m->describe,
                      .n_layers = m->n_layers,
                      .sample_rate = m->sample_rate,
                      .samples_per_frame = m->spf};
}

static int imax(int a, int b) {
  return a > b ? a : b;
}

static void cq_backend_shape(const void *impl, int n_ctx, ops_model_shape *out) {
  const codec_model *m = impl;
  memset(out, 0, sizeof *out);
  out->max_cols = imax(imax(imax(m->q_dim, m->latent), imax(m->hidden, m->n_heads * m->head_dim)),
                       imax(m->inter, 4 * m->latent));
  out->n_ctx = n_ctx;
  out->n_heads = m->n_heads;
  out->n_layers = m->n_layers;
  for (int l = 0; l < m->n_layers; l++)
    out->layers[l] = (ops_layer_shape){.n_kv_heads = m->n_kv, .head_dim = m->head_dim};
}

/* ---- state ---- */

typedef struct cq_stream {
  int64_t frames;      /* decoded so far (RoPE position of the next frame) */
  int hist;            /* frames of keys/values kept (<= window - 1) */
  int par;             /* which of the two KV blocks per layer holds them */
  float *tails;        /* [tail_floats] every conv's left context */
  float **k, **v;      /* [n_layers * 2] KV blocks of kv_cap rows */
  void **ktab, **vtab; /* [n_layers * 2] one-entry block tables (backend memory) */
} cq_stream;

typedef struct cq_state {
  const codec_model *m;
  ops_backend *be;
  int n_seq, nb, kv_cap;
  cq_stream *s;
  /* scratch (backend memory) */
  float *a, *b, *r, *xp;                /* waveform path: [big] each */
  float *tx, *th, *tq, *tatt, *tg, *tu; /* transformer rows */
  float *e0, *er, *et;                  /* quantizer: [nb, q_dim] */
  int32_t *ids, *pos_rope, *pos_attn;
  /* host */
  int32_t *h_ids, *h_pos;
  const void *const **h_ktab, *const **h_vtab; /* [nb] attention block-table arrays */
  void **mem;                                  /* every backend allocation */
  int n_mem, cap_mem;
} cq_state;

static void *st_alloc(cq_state *s, size_t bytes) {
  if (s->n_mem == s->cap_mem) {
    int cap = s->cap_mem ? 2 * s->cap_mem : 64;
    void **a = realloc(s->mem, sizeof *a * (size_t)cap);
    if (!a) return NULL;
    s->mem = a, s->cap_mem = cap;
  }
  void *p = s->be->alloc(s->be, bytes ? bytes : 4);
  if (p) s->mem[s->n_mem++] = p;
  return p;
}

static void cq_state_free(void *state) {
  cq_state *s = state;
  if (!s) return;
  for (int i = 0; i < s->n_mem; i++)
    s->be->free(s->be, s->mem[i]);
  free(s->mem);
  if (s->s)
    for (int i = 0; i < s->n_seq; i++) {
      free(s->s[i].k), free(s->s[i].v), free(s->s[i].ktab), free(s->s[i].vtab);
    }
  free(s->s);
  free(s->h_ids), free(s->h_pos), free((void *)s->h_ktab), free((void *)s->h_vtab);
  free(s);
}

static int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

/* Floats of the largest waveform-path activation (rows x channels, left context included) of
 * an nb-frame step: every a / b / r / xp buffer is that big. Walks the forward's stages. */
static int64_t cq_big(const codec_model *m, int64_t nb) {
  const int64_t ctx = m->max_ctx;
  int64_t r = nb, big = (nb + ctx) * max64(m->cb_dim, m->latent);
  for (int i = 0; i < m->n_up; i++) {
    r *= m->up_ratio[i];
    big = max64(big, (r + ctx) * 4 * (int64_t)m->latent);
  }
  big = max64(big, (r + ctx) * max64(m->latent, m->dec_dim));
  for (int i = 0; i < m->n_blocks; i++) {
    big = max64(big, (r + ctx) * (int64_t)(m->dec_dim >> i));
    r *= m->rate[i];
    big = max64(big, (r + ctx) * (int64_t)(m->dec_dim >> (i + 1)));
  }
  return big;
}

static int cq_state_create(void **state, const void *impl, ops_backend *be,
                           const model_state_params *p, char *err, size_t errlen) {
  const codec_model *m = impl;
  *state = NULL;
  /* every op the forward calls, by name: a backend without one is refused here */
  struct {
    const void *fn;
    const char *name;
  } need[] = {{(const void *)be->matmul, "matmul"},
              {(const void *)be->embed, "embed"},
              {(const void *)be->rmsnorm, "rmsnorm"},
              {(const void *)be->rope, "rope"},
              {(const void *)be->attention, "attention"},
              {(const void *)be->act_mul, "act_mul"},
              {(const void *)be->add, "add"},
              {(const void *)be->copy_rows, "copy_rows"},
              {(const void *)be->copy, "copy"},
              {(const void *)be->conv1d, "conv1d"},
              {(const void *)be->conv1d_dw, "conv1d_dw"},
              {(const void *)be->conv_transpose1d, "conv_transpose1d"},
              {(const void *)be->snake_beta, "snake_beta"},
              {(const void *)be->layer_norm, "layer_norm"},
              {(const void *)be->gelu, "gelu"},
              {(const void *)be->add_scaled, "add_scaled"},
              {(const void *)be->clamp, "clamp"}};
  for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
    if (!need[i].fn)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "qwen3_tts_codec: the %s backend has no %s op", be->name, need[i].name);
  if (be->kv_types && !(be->kv_types & (1u << OPS_KV_F32)))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "qwen3_tts_codec: the %s backend has no f32 attention", be->name);
  const int n_seq = p->n_seq > 0 ? p->n_seq : 1;
  const int nb =
      p->n_batch > 0 ? (p->n_batch < CQ_MAX_BATCH ? p->n_batch : CQ_MAX_BATCH) : CQ_DEFAULT_BATCH;
  cq_state *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  s->m = m, s->be = be, s->n_seq = n_seq, s->nb = nb;
  int cap = 16;
  while (cap < m->window - 1 + nb)
    cap *= 2;
  s->kv_cap = cap;
  const int64_t big = cq_big(m, nb), qd = (int64_t)m->n_heads * m->head_dim,
                kvd = (int64_t)m->n_kv * m->head_dim;
  const int64_t trow = max64(max64(m->hidden, qd), m->latent);
  const int L = m->n_layers;
  int ok =
      (s->s = calloc((size_t)n_seq, sizeof *s->s)) && (s->a = st_alloc(s, (size_t)big * 4)) &&
      (s->b = st_alloc(s, (size_t)big * 4)) && (s->r = st_alloc(s, (size_t)big * 4)) &&
      (s->xp = st_alloc(s, (size_t)big * 4)) && (s->tx = st_alloc(s, (size_t)(nb * trow) * 4)) &&
      (s->th = st_alloc(s, (size_t)(nb * trow) * 4)) &&
      (s->tq = st_alloc(s, (size_t)(nb * qd) * 4)) &&
      (s->tatt = st_alloc(s, (size_t)(nb * qd) * 4)) &&
      (s->tg = st_alloc(s, (size_t)nb * m->inter * 4)) &&
      (s->tu = st_alloc(s, (size_t)nb * m->inter * 4)) &&
      (s->e0 = st_alloc(s, (size_t)nb * m->q_dim * 4)) &&
      (s->er = st_alloc(s, (size_t)nb * m->q_dim * 4)) &&
      (s->et = st_alloc(s, (size_t)nb * m->q_dim * 4)) &&
      (s->ids = st_alloc(s, (size_t)nb * m->n_q * 4)) &&
      (s->pos_rope = st_alloc(s, (size_t)nb * 4)) && (s->pos_attn = st_alloc(s, (size_t)nb * 4)) &&
      (s->h_ids = malloc(sizeof(int32_t) * (size_t)nb * m->n_q)) &&
      (s->h_pos = malloc(sizeof(int32_t) * (size_t)nb)) &&
      (s->h_ktab = malloc(sizeof *s->h_ktab * (size_t)nb)) &&
      (s->h_vtab = malloc(sizeof *s->h_vtab * (size_t)nb));
  for (int q = 0; ok && q < n_seq; q++) {
    cq_stream *st = &s->s[q];
    ok = (st->tails = st_alloc(s, (size_t)m->tail_floats * 4)) &&
         (st->k = calloc((size_t)L * 2 + 1, sizeof *st->k)) &&
         (st->v = calloc((size_t)L * 2 + 1, sizeof *st->v)) &&
         (st->ktab = calloc((size_t)L * 2 + 1, sizeof *st->ktab)) &&
         (st->vtab = calloc((size_t)L * 2 + 1, sizeof *st->vtab));
    for (int i = 0; ok && i < 2 * L; i++) {
      ok = (st->k[i] = st_alloc(s, (size_t)(cap * kvd) * 4)) &&
           (st->v[i] = st_alloc(s, (size_t)(cap * kvd) * 4)) &&
           (st->ktab[i] = st_alloc(s, sizeof(void *))) &&
           (st->vtab[i] = st_alloc(s, sizeof(void *)));
      if (ok) {
        be->upload(be, st->ktab[i], &st->k[i], sizeof(void *));
        be->upload(be, st->vtab[i], &st->v[i], sizeof(void *));
      }
    }
  }
  if (!ok) {
    cq_state_free(s);
    return anna_err(err, errlen, ANNA_ENOMEM,
                    "qwen3_tts_codec: out of memory for %d streams of %d frames", n_seq, nb);
  }
  *state = s;
  return 0;
}

static void cq_seq_reset(void *state, int seq) {
  cq_state *s = state;
  if (seq < 0 || seq >= s->n_seq) return;
  cq_stream *st = &s->s[seq];
  st->frames = 0, st->hist = 0, st->par = 0;
  if (s->m->tail_floats) s->be->memset0(s->be, st->tails, (size_t)s->m->tail_floats * 4);
}

static int32_t cq_seq_len(const void *state, int seq) {
  const cq_state *s = state;
  if (seq < 0 || seq >= s->n_seq) return 0;
  return s->s[seq].frames > INT32_MAX ? INT32_MAX : (int32_t)s->s[seq].frames;
}

/* ---- forward ---- */

/* One causal conv over rows input rows: out = conv([left context; in]); the context then
 * becomes the last ctx rows of that concatenation. */
static void cq_conv_run(cq_state *s, cq_stream *st, const cq_conv *c, const float *in, float *out,
                        int64_t rows) {
  ops_backend *be = s->be;
  const int cin = c->cin, ctx = c->ctx;
  float *tail = st->tails + c->tail_off;
  if (ctx) be->copy_rows(be, s->xp, cin, tail, cin, ctx, cin);
  be->copy_rows(be, s->xp + (int64_t)ctx * cin, cin, in, cin, rows, cin);
  switch (c->form) {
  case CQ_DENSE:
    be->conv1d(be, out, s->xp, rows, cin, c->cout, c->w, c->kw, c->dil, c->bias);
    break;
  case CQ_DW: be->conv1d_dw(be, out, s->xp, rows, cin, c->w, c->kw, c->dil, c->bias); break;
  default:
    be->conv_transpose1d(be, out, s->xp, rows, cin, c->cout, c->w, c->m, c->stride, c->bias);
    break;
  }
  if (ctx) be->copy_rows(be, tail, cin, s->xp + rows * cin, cin, ctx, cin);
}

/* pre_transformer over n frames: in [n, latent] -> out [n, latent]; appends to the KV. */
static void cq_transformer(cq_state *s, cq_stream *st, const float *in, float *out, int64_t n) {
  const codec_model *m = s->m;
  ops_backend *be = s->be;
  const int H = m->hidden, hd = m->head_dim, qd = m->n_heads * hd, kvd = m->n_kv * hd;
  float *x = s->tx, *h = s->th;
  be->matmul(be, x, in, n, &m->in_proj, m->in_proj_b);
  for (int64_t i = 0; i < n; i++)
    s->h_ktab[i] = NULL; /* set per layer below */
  ops_attn_args a = {.n = n,
                     .n_heads = m->n_heads,
                     .n_kv_heads = m->n_kv,
                     .head_dim = hd,
                     .v_dim = hd,
                     .kv_type = OPS_KV_F32,
                     .kv_row_bytes = (int64_t)kvd * 4,
                     .block_len = s->kv_cap,
                     .scale = 1.0f / sqrtf((float)hd),
                     .window = m->window,
                     .pos = s->pos_attn,
                     .k_blocks = s->h_ktab,
                     .v_blocks = s->h_vtab,
                     .keys_hint = st->hist + (int32_t)n};
  for (int l = 0; l < m->n_layers; l++) {
    const cq_layer *y = &m->layers[l];
    const int slot = 2 * l + st->par;
    float *kb = st->k[slot] + (int64_t)st->hist * kvd, *vb = st->v[slot] + (int64_t)st->hist * kvd;
    for (int64_t i = 0; i < n; i++) {
      s->h_ktab[i] = (const void *const *)st->ktab[slot];
      s->h_vtab[i] = (const void *const *)st->vtab[slot];
    }
    be->rmsnorm(be, h, x, y->in_norm, n, H, m->eps, 0);
    be->matmul(be, s->tq, h, n, &y->q, y->bq);
    be->matmul(be, kb, h, n, &y->k, y->bk);
    be->matmul(be, vb, h, n, &y->v, y->bv);
    be->rope(be, s->tq, n, m->n_heads, hd, qd, hd, m->inv_freq, s->pos_rope, 0);
    be->rope(be, kb, n, m->n_kv, hd, kvd, hd, m->inv_freq, s->pos_rope, 0);
    be->attention(be, s->tatt, s->tq, &a);
    be->matmul(be, h, s->tatt, n, &y->o, y->bo);
    be->add_scaled(be, x, h, y->ls_attn, n, H);
    be->rmsnorm(be, h, x, y->post_norm, n, H, m->eps, 0);
    be->matmul(be, s->tg, h, n, &y->gate, NULL);
    be->matmul(be, s->tu, h, n, &y->up, NULL);
    be->act_mul(be, s->tg, s->tg, s->tu, n, m->inter, m->inter, m->inter, ACT_KIND_SILU);
    be->matmul(be, h, s->tg, n, &y->down, NULL);
    be->add_scaled(be, x, h, y->ls_mlp, n, H);
  }
  be->rmsnorm(be, h, x, m->norm, n, H, m->eps, 0);
  be->matmul(be, out, h, n, &m->out_proj, m->out_proj_b);
  /* keep the last window - 1 frames' keys/values, moved to the front of the other block */
  const int64_t total = st->hist + n, keep = total < m->window - 1 ? total : m->window - 1;
  for (int l = 0; l < m->n_layers && keep > 0; l++) {
    const int from = 2 * l + st->par, to = 2 * l + !st->par;
    be->copy(be, st->k[to], st->k[from] + (total - keep) * kvd, (size_t)(keep * kvd) * 4);
    be->copy(be, st->v[to], st->v[from] + (total - keep) * kvd, (size_t)(keep * kvd) * 4);
  }
  st->par = !st->par;
  st->hist = (int)keep;
}

/* n <= nb frames of stream st (codes already validated) -> pcm [n * spf] (host). */
static void cq_step(cq_state *s, cq_stream *st, const int32_t *codes, int64_t n, float *pcm) {
  const codec_model *m = s->m;
  ops_backend *be = s->be;
  /* codebook-major ids, RoPE positions (absolute, as one pass numbers them) and attention
   * positions (relative to the kept keys) */
  for (int k = 0; k < m->n_q; k++)
    for (int64_t t = 0; t < n; t++)
      s->h_ids[k * n + t] = codes[t * m->n_q + k];
  be->upload(be, s->ids, s->h_ids, sizeof(int32_t) * (size_t)(n * m->n_q));
  for (int64_t t = 0; t < n; t++)
    s->h_pos[t] = (int32_t)(st->frames + t);
  be->upload(be, s->pos_rope, s->h_pos, sizeof(int32_t) * (size_t)n);
  for (int64_t t = 0; t < n; t++)
    s->h_pos[t] = (int32_t)(st->hist + t);
  be->upload(be, s->pos_attn, s->h_pos, sizeof(int32_t) * (size_t)n);

  /* quantizer: rvq_first(c0) + rvq_rest(c1 + ... ), each through its output projection */
  float *a = s->a, *b = s->b, *r = s->r;
  be->embed(be, s->e0, &m->cb[0], s->ids, n, 1.0f);
  be->embed(be, s->er, &m->cb[1], s->ids + n, n, 1.0f);
  for (int k = 2; k < m->n_q; k++) {
    be->embed(be, s->et, &m->cb[k], s->ids + k * n, n, 1.0f);
    be->add(be, s->er, s->et, n * m->q_dim);
  }
  be->matmul(be, a, s->e0, n, &m->proj_first, NULL);
  be->matmul(be, b, s->er, n, &m->proj_rest, NULL);
  be->add(be, a, b, n * m->cb_dim);
  cq_conv_run(s, st, &m->pre_conv, a, b, n);
  cq_transformer(s, st, b, a, n);

  /* upsample: ConvTranspose then ConvNeXt (dwconv, LayerNorm, pw1, GELU, pw2, x gamma, + input) */
  int64_t rows = n;
  const int D = m->latent;
  for (int i = 0; i < m->n_up; i++) {
    const cq_up *u = &m->up[i];
    cq_conv_run(s, st, &u->tconv, a, b, rows);
    rows *= m->up_ratio[i];
    cq_conv_run(s, st, &u->dw, b, a, rows);
    be->layer_norm(be, a, a, u->ln_w, u->ln_b, rows, D, 1e-6f);
    be->matmul(be, r, a, rows, &u->pw1, u->pw1_b);
    be->gelu(be, r, rows * 4 * D, 1);
    be->matmul(be, a, r, rows, &u->pw2, u->pw2_b);
    be->add_scaled(be, b, a, u->gamma, rows, D);
    float *t = a;
    a = b, b = t;
  }
  /* decoder: conv, blocks (SnakeBeta, ConvTranspose, residual units), SnakeBeta, conv, clamp */
  cq_conv_run(s, st, &m->dec0, a, b, rows);
  for (int i = 0; i < m->n_blocks; i++) {
    const cq_block *k = &m->blocks[i];
    be->snake_beta(be, b, b, rows, k->act.ch, k->act.alpha, k->act.inv_beta);
    cq_conv_run(s, st, &k->tconv, b, a, rows);
    rows *= m->rate[i];
    const int ch = k->tconv.cout;
    for (int u = 0; u < CQ_UNITS; u++) { /* a: the unit's input and residual */
      be->snake_beta(be, b, a, rows, ch, k->a1[u].alpha, k->a1[u].inv_beta);
      cq_conv_run(s, st, &k->c1[u], b, r, rows);
      be->snake_beta(be, r, r, rows, ch, k->a2[u].alpha, k->a2[u].inv_beta);
      cq_conv_run(s, st, &k->c2[u], r, b, rows);
      be->add(be, a, b, rows * ch);
    }
    float *t = a;
    a = b, b = t;
  }
  /* the block output is in b after the swap */
  be->snake_beta(be, b, b, rows, m->final_act.ch, m->final_act.alpha, m->final_act.inv_beta);
  cq_conv_run(s, st, &m->final_conv, b, a, rows);
  be->clamp(be, a, rows, -1.0f, 1.0f);
  be->download(be, pcm, a, sizeof(float) * (size_t)rows);
  st->frames += n;
}

static int cq_run(const void *impl, void *state, ops_backend *be, const model_input *in,
                  const model_output *out, char *err, size_t errlen) {
  const codec_model *m = impl;
  cq_state *s = state;
  if (in->io != MODEL_IO_CODES || out->io != MODEL_IO_PCM)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "the codec decoder maps codes to pcm, not %s to %s", model_io_name(in->io),
                    model_io_name(out->io));
  if (be != s->be)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "qwen3_tts_codec: run on another backend than the state's");
  if (in->n_codebooks != m->n_q)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "qwen3_tts_codec: frames have %d codebooks, the decoder needs %d",
                    in->n_codebooks, m->n_q);
  if (in->n_frames <= 0)
    return anna_err(err, errlen, ANNA_EINVAL, "qwen3_tts_codec: %lld frames (at least 1 needed)",
                    (long long)in->n_frames);
  if (!in->codes || !out->pcm)
    return anna_err(err, errlen, ANNA_EINVAL, "qwen3_tts_codec: no codes or pcm buffer");
  if (in->seq < 0 || in->seq >= s->n_seq)
    return anna_err(err, errlen, ANNA_ERANGE, "qwen3_tts_codec: stream %d out of range [0, %d)",
                    in->seq, s->n_seq);
  cq_stream *st = &s->s[in->seq];
  if (in->n_frames > INT32_MAX - st->frames)
    return anna_err(err, errlen, ANNA_ERANGE, "qwen3_tts_codec: stream %d would pass %d frames",
                    in->seq, INT32_MAX);
  /* every code first, so that a refused run leaves the stream as it was */
  for (int64_t t = 0; t < in->n_frames; t++)
    for (int k = 0; k < m->n_q; k++) {
      const int32_t c = in->codes[t * m->n_q + k];
      if (c < 0 || c >= m->cb_size)
        return anna_err(
            err, errlen, ANNA_ERANGE,
            "qwen3_tts_codec: code %d (frame %lld, codebook %d) is out of range [0, %d)", (int)c,
            (long long)t, k, m->cb_size);
    }
  if (be->bind) be->bind(be); /* a device backend: this thread's work goes to its device */
  for (int64_t t = 0; t < in->n_frames; t += s->nb) {
    const int64_t n = in->n_frames - t < s->nb ? in->n_frames - t : s->nb;
    cq_step(s, st, in->codes + t * m->n_q, n, out->pcm + t * m->spf);
  }
  /* a device's failures are sticky: report one rather than return its pcm */
  return be->error ? be->error(be, err, errlen) : 0;
}

static const model_seq_ops cq_seq = {
    .seq_len = cq_seq_len,
    .reset = cq_seq_reset,
};

const model_kind codec_qwen3_tts_kind = {
    .name = "qwen3_tts_codec",
    .inputs = MODEL_IO_BIT(MODEL_IO_CODES),
    .outputs = MODEL_IO_BIT(MODEL_IO_PCM),
    .probe = cq_probe,
    .load = cq_load_model,
    .free = cq_free,
    .describe = cq_describe,
    .backend_shape = cq_backend_shape,
    .state_create = cq_state_create,
    .state_free = cq_state_free,
    .run = cq_run,
    .seq = &cq_seq,
};
