/* quantize.c: HF folder -> GGUF (see quantize.h). A plan of output tensors (name, source,
 * transform, type) is built first and written as GGUF metadata + tensor infos; the data of
 * each tensor is produced row by row when the writer asks for it. */
#include "model/quantize.h"

#include "base/error.h"
#include "base/threadpool.h"
#include "formats/dtype.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "formats/quant.h"
#include "formats/quant_encode.h"
#include "formats/safetensors.h"
#include "model/config.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bump when the output of a given source changes (layout, mix, metadata): old cache files
 * then miss instead of loading stale bytes. */
#define QUANTIZE_FORMAT_VERSION 1

enum xform {
  X_NONE = 0,
  X_PLUS1,      /* w + 1 (zero-centred norms) */
  X_NEGEXP,     /* -exp(w) (A_log -> ssm_a) */
  X_PERMUTE_QK, /* Llama: rows to GPT-J (interleaved) rope order, per head */
};

enum cat { C_OTHER, C_OUTPUT, C_EMBD, C_ATTN_V, C_FFN_DOWN };

typedef struct job {
  char name[96];
  const safetensors_tensor *src;
  int type; /* output anna_dtype */
  int64_t rows, cols;
  int xform;
  int n_head;               /* X_PERMUTE_QK */
  int64_t vrow0, vhd;       /* rows >= vrow0: V heads grouped -> tiled, blocks of vhd rows (vhd 0: none) */
  int64_t vcol_hd;          /* columns: V heads grouped -> tiled, blocks of vcol_hd (0: none) */
  int is_1d;
  const float *synth; /* data computed here (rope_freqs), cols floats; src NULL */
  int cat;            /* enum cat (int4 only) */
} job;

#define QUANTIZE_MAX_THREADS 256

typedef struct plan {
  job *j;
  int64_t n, cap;
  int hk, r; /* V reorder: k-heads and v-heads per k-head (r 1: identity) */
  int64_t max_cols;
  model_quantize_stats *stats;
  threadpool *tp; /* rows of a tensor are split over its workers */
  float *row[QUANTIZE_MAX_THREADS], *tmp[QUANTIZE_MAX_THREADS]; /* per worker */
  /* the tensor being filled */
  const job *cur;
  unsigned char *dst;
  int rc[QUANTIZE_MAX_THREADS];
} plan;

int model_quantize_type_known(const char *type) { return type && (!strcmp(type, "int4") || !strcmp(type, "bf16")); }

/* ---- source rows ---- */

static void src_row(const safetensors_tensor *t, int64_t r, int64_t cols, float *out) {
  const size_t es = t->dtype == ANNA_DTYPE_F32 ? 4 : 2;
  const unsigned char *p = (const unsigned char *)t->data + (size_t)r * (size_t)cols * es;
  if (t->dtype == ANNA_DTYPE_F32) memcpy(out, p, (size_t)cols * 4);
  else if (t->dtype == ANNA_DTYPE_BF16) {
    uint16_t h;
    for (int64_t i = 0; i < cols; i++) {
      memcpy(&h, p + 2 * i, 2);
      out[i] = quant_bf16_to_f32(h);
    }
  } else {
    uint16_t h;
    for (int64_t i = 0; i < cols; i++) {
      memcpy(&h, p + 2 * i, 2);
      out[i] = quant_f16_to_f32(h);
    }
  }
}

/* Grouped -> tiled: output head index t = m*hk + k holds source head g = k*r + m. */
static int64_t tiled_src(int64_t idx, int64_t hd, int hk, int r) {
  const int64_t h = idx / hd, d = idx % hd;
  const int64_t m = h / hk, k = h % hk;
  return (k * r + m) * hd + d;
}

static int64_t job_src_row(const plan *p, const job *j, int64_t r) {
  if (j->xform == X_PERMUTE_QK) {
    /* llama.cpp permute(): reshape(n_head, 2, D/2, cols).swapaxes(1, 2): out row h*D + 2i + s
     * is source row h*D + s*D/2 + i. */
    const int64_t D = j->rows / j->n_head, h = r / D, w = r % D;
    return h * D + (w % 2) * (D / 2) + w / 2;
  }
  if (j->vhd && r >= j->vrow0 && p->r > 1) return j->vrow0 + tiled_src(r - j->vrow0, j->vhd, p->hk, p->r);
  return r;
}

static void job_row(const plan *p, const job *j, int64_t r, float *out, float *tmp) {
  if (j->synth) {
    memcpy(out, j->synth + r * j->cols, (size_t)j->cols * sizeof(float));
    return;
  }
  const int64_t sr = job_src_row(p, j, r);
  if (j->vcol_hd && p->r > 1) {
    src_row(j->src, sr, j->cols, tmp);
    for (int64_t c = 0; c < j->cols; c++) out[c] = tmp[tiled_src(c, j->vcol_hd, p->hk, p->r)];
  } else {
    src_row(j->src, sr, j->cols, out);
  }
  if (j->xform == X_PLUS1)
    for (int64_t c = 0; c < j->cols; c++) out[c] += 1.0f;
  else if (j->xform == X_NEGEXP)
    for (int64_t c = 0; c < j->cols; c++) out[c] = -expf(out[c]);
}

static void fill_rows(void *ctx, int ith, int nth) {
  plan *p = ctx;
  const job *j = p->cur;
  const size_t rb = (size_t)dtype_row_bytes(j->type, j->cols);
  int64_t r0, r1;
  threadpool_range(j->rows, ith, nth, &r0, &r1);
  p->rc[ith] = 0;
  for (int64_t r = r0; r < r1; r++) {
    unsigned char *o = p->dst + rb * (size_t)r;
    if (!j->synth && j->type == ANNA_DTYPE_BF16 && j->src->dtype == ANNA_DTYPE_BF16 && j->xform == X_NONE && !j->vcol_hd) {
      /* bf16 -> bf16: the source bits, not a float round trip */
      memcpy(o, (const unsigned char *)j->src->data + (size_t)job_src_row(p, j, r) * (size_t)j->cols * 2, rb);
      continue;
    }
    job_row(p, j, r, p->row[ith], p->tmp[ith]);
    int rc = quant_encode_row(j->type, p->row[ith], o, j->cols);
    if (rc) {
      p->rc[ith] = rc;
      return;
    }
  }
}

static int fill(void *user, int64_t i, void *dst, size_t nbytes, char *err, size_t errlen) {
  plan *p = user;
  const job *j = &p->j[i];
  const size_t rb = (size_t)dtype_row_bytes(j->type, j->cols);
  if (rb * (size_t)j->rows != nbytes) return anna_err(err, errlen, ANNA_EFORMAT, "%s: size mismatch", j->name);
  p->cur = j;
  p->dst = dst;
  threadpool_run(p->tp, fill_rows, p);
  for (int t = 0; t < threadpool_size(p->tp); t++)
    if (p->rc[t]) return anna_err(err, errlen, p->rc[t], "%s: cannot encode as %s", j->name, dtype_name(j->type));
  if (p->stats) {
    p->stats->n_tensors++;
    p->stats->bytes_in += j->src ? (int64_t)j->src->nbytes : 0;
    p->stats->bytes_out += (int64_t)nbytes;
    if (j->type >= 0 && j->type < 64) p->stats->n_by_type[j->type]++;
  }
  return 0;
}

/* ---- plan ---- */



typedef struct ctx {
  plan *p;
  const safetensors_set *st;
  const model_config *c;
  const char *dir, *prefix, *type;
  int int4;
  char *err;
  size_t errlen;
  int rc; /* add()'s error */
} ctx;

static int use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* llama.cpp's tensor_type_fallback for a row length cols. */
static int fallback(int type, int64_t cols) {
  if (cols % dtype_block_size(type) == 0) return type;
  int t = type == ANNA_DTYPE_Q4_K ? ANNA_DTYPE_Q5_0 : type == ANNA_DTYPE_Q6_K ? ANNA_DTYPE_Q8_0 : type;
  return cols % dtype_block_size(t) == 0 ? t : ANNA_DTYPE_F16;
}


static job *add(ctx *x, const char *gname, const char *src, int cat, int layer, int xform) {
  const safetensors_tensor *t = safetensors_find(x->st, src);
  if (!t) {
    x->rc = anna_err(x->err, x->errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s'", x->dir, src);
    return NULL;
  }
  plan *p = x->p;
  if (p->n == p->cap) {
    int64_t cap = p->cap ? 2 * p->cap : 256;
    job *nj = realloc(p->j, (size_t)cap * sizeof *nj);
    if (!nj) {
      x->rc = anna_err(x->err, x->errlen, ANNA_ENOMEM, "out of memory");
      return NULL;
    }
    p->j = nj;
    p->cap = cap;
  }
  job *j = &p->j[p->n++];
  memset(j, 0, sizeof *j);
  snprintf(j->name, sizeof j->name, "%s", gname);
  j->src = t;
  j->xform = xform;
  int64_t nel = 1;
  for (int d = 0; d < t->ndim; d++) nel *= t->shape[d];
  int64_t nontrivial = 0;
  for (int d = 0; d < t->ndim; d++) nontrivial += t->shape[d] > 1;
  j->is_1d = nontrivial <= 1 && t->ndim <= 1;
  /* conv1d [C, 1, K] squeezes to [C, K]; everything else is 1-D or 2-D */
  j->cols = t->ndim >= 2 ? t->shape[t->ndim - 1] : nel;
  j->rows = nel / j->cols;
  if (t->ndim > 3 || (t->ndim == 3 && t->shape[1] != 1)) {
    x->rc = anna_err(x->err, x->errlen, ANNA_EUNSUPPORTED, "%s: tensor '%s' has %d dims", x->dir, src, t->ndim);
    return NULL;
  }
  if (j->cols > p->max_cols) p->max_cols = j->cols;
  const int is_conv = strstr(gname, "ssm_conv1d") != NULL;
  if (j->is_1d || t->ndim == 1 || is_conv) j->type = ANNA_DTYPE_F32;
  else if (!x->int4) j->type = ANNA_DTYPE_BF16;
  else {
    /* attn_v / ffn_down: decided by assign_more_bits once the order is final */
    int ty = ANNA_DTYPE_Q4_K;
    if (cat == C_OUTPUT || (cat == C_EMBD && x->c->tie_embeddings)) ty = j->cols % 256 ? ANNA_DTYPE_Q8_0 : ANNA_DTYPE_Q6_K;
    j->type = fallback(ty, j->cols);
    j->cat = cat;
  }
  (void)layer;
  return j;
}

/* The converter's tensor order: generated tensors (rope_freqs) first, then the safetensors
 * files in name order and each file's tensors in name order (gguf-py's SafetensorsLocal
 * sorts them), so the bf16 file matches convert_hf_to_gguf.py's tensor for tensor. */
static int job_order(const void *pa, const void *pb) {
  const job *a = pa, *b = pb;
  if (!a->src || !b->src) return (a->src != NULL) - (b->src != NULL);
  int c = strcmp(a->src->file, b->src->file);
  return c ? c : strcmp(a->src->name, b->src->name);
}

static int job_layer(const job *j) {
  int l = -1;
  return sscanf(j->name, "blk.%d.", &l) == 1 ? l : -1;
}

/* llama-quantize's order (llama_model_loader's weight_name_comparer: layer number, then name):
 * the i-th attn_v-like tensor (attn_v, attn_qkv) of n and the i-th ffn_down of n_layers get
 * Q6_K when use_more_bits(i, n). Older llama.cpp counted in file order instead, which for 11+
 * layers picks other layers (bench/notes/int4.md). */
static void assign_more_bits(plan *p, int n_layers) {
  int n_v = 0;
  for (int64_t i = 0; i < p->n; i++) n_v += p->j[i].cat == C_ATTN_V;
  for (int64_t i = 0; i < p->n; i++) {
    job *j = &p->j[i];
    if (j->cat != C_ATTN_V && j->cat != C_FFN_DOWN) continue;
    int rank = 0; /* one tensor of each category per layer: its rank is that of its layer */
    for (int64_t k = 0; k < p->n; k++)
      rank += p->j[k].cat == j->cat && (job_layer(&p->j[k]) < job_layer(j) ||
                                        (job_layer(&p->j[k]) == job_layer(j) && strcmp(p->j[k].name, j->name) < 0));
    if (use_more_bits(rank, j->cat == C_ATTN_V ? n_v : n_layers)) j->type = fallback(ANNA_DTYPE_Q6_K, j->cols);
  }
}

#define ADD(gname, src, cat, layer, xf)                                                                              \
  do {                                                                                                               \
    if (!(jp = add(x, gname, src, cat, layer, xf))) return x->rc;                                                                         \
  } while (0)

static int plan_layers(ctx *x) {
  const model_config *c = x->c;
  const char *P = x->prefix;
  const int q35 = c->arch == MODEL_ARCH_QWEN3_5;
  char g[96], s[160];
  job *jp;
  for (int i = 0; i < c->n_layers; i++) {
    const layer_config *l = &c->layers[i];
    const int norm_x = q35 ? X_PLUS1 : X_NONE;
#define L(gn, sn, cat, xf)                                                                                            \
  snprintf(g, sizeof g, "blk.%d.%s", i, gn);                                                                         \
  snprintf(s, sizeof s, "%slayers.%d.%s", P, i, sn);                                                                 \
  ADD(g, s, cat, i, xf)
    L("attn_norm.weight", "input_layernorm.weight", C_OTHER, norm_x);
    if (l->kind == LAYER_KIND_GDN) {
      const int64_t Kd = (int64_t)c->gdn_hk * c->gdn_dk;
      L("attn_qkv.weight", "linear_attn.in_proj_qkv.weight", C_ATTN_V, X_NONE);
      jp->vrow0 = 2 * Kd, jp->vhd = c->gdn_dv;
      L("attn_gate.weight", "linear_attn.in_proj_z.weight", C_OTHER, X_NONE);
      jp->vrow0 = 0, jp->vhd = c->gdn_dv;
      L("ssm_beta.weight", "linear_attn.in_proj_b.weight", C_OTHER, X_NONE);
      jp->vrow0 = 0, jp->vhd = 1;
      L("ssm_alpha.weight", "linear_attn.in_proj_a.weight", C_OTHER, X_NONE);
      jp->vrow0 = 0, jp->vhd = 1;
      L("ssm_a", "linear_attn.A_log", C_OTHER, X_NEGEXP);
      jp->vcol_hd = 1; /* 1-D: one row of Hv columns */
      L("ssm_dt.bias", "linear_attn.dt_bias", C_OTHER, X_NONE);
      jp->vcol_hd = 1;
      L("ssm_conv1d.weight", "linear_attn.conv1d.weight", C_OTHER, X_NONE);
      jp->vrow0 = 2 * Kd, jp->vhd = c->gdn_dv;
      L("ssm_norm.weight", "linear_attn.norm.weight", C_OTHER, X_NONE);
      L("ssm_out.weight", "linear_attn.out_proj.weight", C_OTHER, X_NONE);
      jp->vcol_hd = c->gdn_dv;
    } else {
      const int llama = c->arch == MODEL_ARCH_LLAMA;
      L("attn_q.weight", "self_attn.q_proj.weight", C_OTHER, llama ? X_PERMUTE_QK : X_NONE);
      jp->n_head = c->n_heads;
      L("attn_k.weight", "self_attn.k_proj.weight", C_OTHER, llama ? X_PERMUTE_QK : X_NONE);
      jp->n_head = l->n_kv_heads;
      L("attn_v.weight", "self_attn.v_proj.weight", C_ATTN_V, X_NONE);
      L("attn_output.weight", "self_attn.o_proj.weight", C_OTHER, X_NONE);
      if (c->attn_bias) {
        L("attn_q.bias", "self_attn.q_proj.bias", C_OTHER, X_NONE);
        L("attn_k.bias", "self_attn.k_proj.bias", C_OTHER, X_NONE);
        L("attn_v.bias", "self_attn.v_proj.bias", C_OTHER, X_NONE);
      }
      if (c->qk_norm) {
        L("attn_q_norm.weight", "self_attn.q_norm.weight", C_OTHER, norm_x);
        L("attn_k_norm.weight", "self_attn.k_norm.weight", C_OTHER, norm_x);
      }
    }
    if (q35) {
      L("post_attention_norm.weight", "post_attention_layernorm.weight", C_OTHER, norm_x);
    } else {
      L("ffn_norm.weight", "post_attention_layernorm.weight", C_OTHER, norm_x);
    }
    L("ffn_gate.weight", "mlp.gate_proj.weight", C_OTHER, X_NONE);
    L("ffn_up.weight", "mlp.up_proj.weight", C_OTHER, X_NONE);
    L("ffn_down.weight", "mlp.down_proj.weight", C_FFN_DOWN, X_NONE);
#undef L
  }
  return 0;
}

/* ---- metadata ---- */

static const char *json_str_or_content(json_t *v) {
  if (json_is_string(v)) return json_string_value(v);
  if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
  return NULL;
}

/* Pre-tokenizer names llama.cpp (and tokenizer/tok_vocab.c) know, by the Split regex of
 * tokenizer.json. */
static const struct {
  const char *pre, *re;
} k_pre[] = {
    {"qwen2", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {"llama-bpe", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
};

static int split_regex(json_t *pre, const char **out) {
  if (!json_is_object(pre)) return 0;
  const char *ty = json_string_value(json_object_get(pre, "type"));
  if (ty && !strcmp(ty, "Split")) {
    *out = json_string_value(json_object_get(json_object_get(pre, "pattern"), "Regex"));
    return *out != NULL;
  }
  json_t *seq = json_object_get(pre, "pretokenizers");
  size_t i;
  json_t *v;
  json_array_foreach(seq, i, v) if (split_regex(v, out)) return 1;
  return 0;
}

static json_t *load_json(const char *dir, const char *file, int required, size_t flags, char *err, size_t errlen, int *rc) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  json_error_t je;
  json_t *j = json_load_file(path, flags, &je);
  *rc = 0;
  if (!j && (required || access(path, F_OK) == 0))
    *rc = anna_err(err, errlen, access(path, F_OK) ? ANNA_ENOTFOUND : ANNA_EFORMAT, "%s: %s", path,
                   access(path, F_OK) ? "missing" : je.text);
  return j;
}

static int token_id(json_t *tok, const char *content, int32_t *out) {
  if (!content) return 0;
  json_t *v = json_object_get(json_object_get(json_object_get(tok, "model"), "vocab"), content);
  if (json_is_integer(v)) {
    *out = (int32_t)json_integer_value(v);
    return 1;
  }
  size_t i;
  json_t *a;
  json_array_foreach(json_object_get(tok, "added_tokens"), i, a) {
    const char *s = json_string_value(json_object_get(a, "content"));
    if (s && !strcmp(s, content)) {
      *out = (int32_t)json_integer_value(json_object_get(a, "id"));
      return 1;
    }
  }
  return 0;
}

static int ends_with(const char *s, const char *suf) {
  size_t n = strlen(s), m = strlen(suf);
  return n >= m && !memcmp(s + n - m, suf, m);
}

/* The converter's does_token_look_special: added tokens that are control tokens in practice
 * though not marked special (<|fim_prefix|>, deepseek's <｜...｜>, gemma's <unused..>). */
static int looks_special(const char *t) {
  return !strcmp(t, "<pad>") || !strcmp(t, "<mask>") || !strcmp(t, "<2mass>") || !strcmp(t, "[@BOS@]") ||
         (!strncmp(t, "<|", 2) && ends_with(t, "|>")) ||
         (!strncmp(t, "<\xef\xbd\x9c", 4) && ends_with(t, "\xef\xbd\x9c>")) ||
         (!strncmp(t, "<unused", 7) && ends_with(t, ">"));
}

static int write_tokenizer(ctx *x, gguf_writer *w, json_t *cfgj) {
  int rc;
  json_t *tok = load_json(x->dir, "tokenizer.json", 1, 0, x->err, x->errlen, &rc);
  if (!tok) return rc;
  json_t *tcfg = load_json(x->dir, "tokenizer_config.json", 0, JSON_DECODE_INT_AS_REAL /* model_max_length overflows */, x->err, x->errlen, &rc);
  char **toks = NULL;
  int32_t *types = NULL;
  const char **merges = NULL;
  char *merge_buf = NULL;
  char *tmpl_file = NULL;
  if (rc) goto out;
  json_t *model = json_object_get(tok, "model");
  const char *mtype = json_string_value(json_object_get(model, "type"));
  json_t *vocab = json_object_get(model, "vocab");
  if (!mtype || strcmp(mtype, "BPE") || !json_is_object(vocab)) {
    rc = anna_err(x->err, x->errlen, ANNA_EUNSUPPORTED, "%s/tokenizer.json: only byte-level BPE tokenizers are supported",
                  x->dir);
    goto out;
  }
  const char *re = NULL, *pre = NULL;
  split_regex(json_object_get(tok, "pre_tokenizer"), &re);
  for (size_t i = 0; re && i < sizeof k_pre / sizeof k_pre[0]; i++)
    if (!strcmp(re, k_pre[i].re)) pre = k_pre[i].pre;
  if (!pre) {
    rc = anna_err(x->err, x->errlen, ANNA_EUNSUPPORTED,
                  "%s/tokenizer.json: pre-tokenizer split regex not recognized (have: qwen2, llama-bpe)", x->dir);
    goto out;
  }
  /* vocabulary size: the embedding's rows (ids past the tokenizer are padding) */
  const int64_t n = x->c->vocab;
  toks = calloc((size_t)n, sizeof *toks);
  types = calloc((size_t)n, sizeof *types);
  if (!toks || !types) {
    rc = anna_err(x->err, x->errlen, ANNA_ENOMEM, "out of memory");
    goto out;
  }
  const char *key;
  json_t *v;
  json_object_foreach(vocab, key, v) {
    json_int_t id = json_integer_value(v);
    if (id >= 0 && id < n && !toks[id]) toks[id] = strdup(key), types[id] = 1;
  }
  size_t i;
  json_array_foreach(json_object_get(tok, "added_tokens"), i, v) {
    json_int_t id = json_integer_value(json_object_get(v, "id"));
    const char *s = json_string_value(json_object_get(v, "content"));
    if (!s || id < 0 || id >= n) continue;
    free(toks[id]);
    toks[id] = strdup(s);
    types[id] = json_is_true(json_object_get(v, "special")) || looks_special(s) ? 3 : 4; /* CONTROL : USER_DEFINED */
    if (types[id] == 4 && toks[id]) {
      /* the converter pre-normalizes user-defined tokens: U+2581 -> space */
      char *o = toks[id];
      for (const char *q = toks[id]; *q;)
        if (!strncmp(q, "\xe2\x96\x81", 3)) *o++ = ' ', q += 3;
        else *o++ = *q++;
      *o = 0;
    }
  }
  for (int64_t k = 0; k < n; k++)
    if (!toks[k]) {
      char pad[32];
      snprintf(pad, sizeof pad, "[PAD%lld]", (long long)k);
      toks[k] = strdup(pad);
      types[k] = 5; /* UNUSED */
    }
  for (int64_t k = 0; k < n; k++)
    if (!toks[k]) {
      rc = anna_err(x->err, x->errlen, ANNA_ENOMEM, "out of memory");
      goto out;
    }
  json_t *mj = json_object_get(model, "merges");
  const size_t nm = json_array_size(mj);
  merges = calloc(nm ? nm : 1, sizeof *merges);
  size_t mb = 0;
  json_array_foreach(mj, i, v) {
    if (json_is_string(v)) mb += strlen(json_string_value(v)) + 1;
    else mb += strlen(json_string_value(json_array_get(v, 0)) ? json_string_value(json_array_get(v, 0)) : "") +
               strlen(json_string_value(json_array_get(v, 1)) ? json_string_value(json_array_get(v, 1)) : "") + 2;
  }
  merge_buf = malloc(mb + 1);
  if (!merges || !merge_buf) {
    rc = anna_err(x->err, x->errlen, ANNA_ENOMEM, "out of memory");
    goto out;
  }
  size_t off = 0;
  json_array_foreach(mj, i, v) {
    merges[i] = merge_buf + off;
    if (json_is_string(v)) off += (size_t)sprintf(merge_buf + off, "%s", json_string_value(v)) + 1;
    else {
      const char *a = json_string_value(json_array_get(v, 0)), *b = json_string_value(json_array_get(v, 1));
      off += (size_t)sprintf(merge_buf + off, "%s %s", a ? a : "", b ? b : "") + 1;
    }
  }
  if ((rc = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2")) || (rc = gguf_writer_set_str(w, "tokenizer.ggml.pre", pre)) ||
      (rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, NULL, n)) ||
      (rc = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, n)) ||
      (rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, NULL, (int64_t)nm)))
    goto werr;
  /* special ids: tokenizer_config.json's tokens, else config.json's ids */
  static const char *const names[3] = {"bos", "eos", "pad"};
  for (int k = 0; k < 3; k++) {
    char tk[32], ck[48];
    snprintf(tk, sizeof tk, "%s_token", names[k]);
    snprintf(ck, sizeof ck, "tokenizer.ggml.%s_token_id", k == 2 ? "padding" : names[k]);
    int32_t id = -1;
    if (!token_id(tok, json_str_or_content(json_object_get(tcfg, tk)), &id)) {
      snprintf(tk, sizeof tk, "%s_token_id", names[k]);
      json_t *cv = json_object_get(cfgj, tk);
      if (json_is_array(cv)) cv = json_array_get(cv, 0);
      if (json_is_integer(cv)) id = (int32_t)json_integer_value(cv);
    }
    if (id >= 0 && id < n && (rc = gguf_writer_set_u32(w, ck, (uint32_t)id))) goto werr;
  }
  json_t *ab = json_object_get(tcfg, "add_bos_token");
  if ((rc = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", json_is_true(ab)))) goto werr;
  const char *tmpl = json_string_value(json_object_get(tcfg, "chat_template"));
  if (!tmpl) {
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", x->dir);
    FILE *f = fopen(path, "rb");
    if (f) {
      fseek(f, 0, SEEK_END);
      long sz = ftell(f);
      fseek(f, 0, SEEK_SET);
      if (sz >= 0 && (tmpl_file = malloc((size_t)sz + 1))) {
        size_t got = fread(tmpl_file, 1, (size_t)sz, f);
        tmpl_file[got] = 0;
        tmpl = tmpl_file;
      }
      fclose(f);
    }
  }
  if (tmpl && (rc = gguf_writer_set_str(w, "tokenizer.chat_template", tmpl))) goto werr;
  rc = 0;
  goto out;
werr:
  rc = anna_err(x->err, x->errlen, rc, "%s: writing tokenizer metadata failed", x->dir);
out:
  if (toks)
    for (int64_t k = 0; k < x->c->vocab; k++) free(toks[k]);
  free(toks);
  free(types);
  free(merges);
  free(merge_buf);
  free(tmpl_file);
  json_decref(tcfg);
  json_decref(tok);
  return rc;
}

static const char *gguf_arch(int arch) {
  switch (arch) {
  case MODEL_ARCH_QWEN2: return "qwen2";
  case MODEL_ARCH_QWEN3: return "qwen3";
  case MODEL_ARCH_LLAMA: return "llama";
  case MODEL_ARCH_QWEN3_5: return "qwen35";
  default: return NULL;
  }
}

static int write_meta(ctx *x, gguf_writer *w, json_t *cfgj) {
  const model_config *c = x->c;
  const char *A = gguf_arch(c->arch);
  char k[128];
  int rc = 0;
#define KU(name, v) (snprintf(k, sizeof k, "%s.%s", A, name), gguf_writer_set_u32(w, k, (uint32_t)(v)))
#define KF(name, v) (snprintf(k, sizeof k, "%s.%s", A, name), gguf_writer_set_f32(w, k, (float)(v)))
  json_t *tc = json_object_get(cfgj, "text_config");
  if (!json_is_object(tc)) tc = cfgj;
  json_int_t ctxlen = json_integer_value(json_object_get(tc, "max_position_embeddings"));
  const layer_config *l0 = &c->layers[0];
  int attn_layer = 0;
  for (int i = 0; i < c->n_layers; i++)
    if (c->layers[i].kind == LAYER_KIND_ATTN) {
      attn_layer = i;
      break;
    }
  const layer_config *la = &c->layers[attn_layer];
  if ((rc = gguf_writer_set_str(w, "general.architecture", A)) || (rc = gguf_writer_set_str(w, "general.type", "model")) ||
      (rc = gguf_writer_set_u32(w, "general.quantization_version", 2)) ||
      (rc = gguf_writer_set_u32(w, "general.file_type", x->int4 ? 15 /* MOSTLY_Q4_K_M */ : 32 /* MOSTLY_BF16 */)) ||
      (rc = gguf_writer_set_u32(w, "general.alignment", GGUF_DEFAULT_ALIGNMENT)) || (rc = KU("block_count", c->n_layers)) ||
      (rc = KU("context_length", ctxlen > 0 ? ctxlen : 4096)) || (rc = KU("embedding_length", c->hidden)) ||
      (rc = KU("feed_forward_length", l0->ffn_dim)) || (rc = KU("attention.head_count", c->n_heads)) ||
      (rc = KU("attention.head_count_kv", la->n_kv_heads)) || (rc = KU("attention.key_length", la->head_dim)) ||
      (rc = KU("attention.value_length", la->head_dim)) || (rc = KF("attention.layer_norm_rms_epsilon", c->eps)) ||
      (rc = KF("rope.freq_base", la->rope_theta)) || (rc = KU("rope.dimension_count", la->rope_dims)) ||
      (rc = KU("vocab_size", c->vocab)))
    return anna_err(x->err, x->errlen, rc ? rc : ANNA_EINVAL, "metadata write failed");
  if (c->arch == MODEL_ARCH_QWEN3_5) {
    int interval = 0;
    for (int i = 0; i < c->n_layers; i++)
      if (c->layers[i].kind == LAYER_KIND_ATTN) {
        interval = i + 1;
        break;
      }
    for (int i = 0; i < c->n_layers; i++)
      if (interval < 1 || (c->layers[i].kind == LAYER_KIND_ATTN) != ((i + 1) % interval == 0))
        return anna_err(x->err, x->errlen, ANNA_EUNSUPPORTED,
                        "%s: qwen3_5 layer pattern is not 'full attention every N-th layer' (llama.cpp's "
                        "full_attention_interval)", x->dir);
    int32_t sec[4] = {11, 11, 10, 0};
    json_t *rp = json_object_get(tc, "rope_parameters");
    if (!rp) rp = json_object_get(tc, "rope_scaling");
    json_t *ms = json_object_get(rp, "mrope_section");
    for (size_t i = 0; i < 4 && i < json_array_size(ms); i++) sec[i] = (int32_t)json_integer_value(json_array_get(ms, i));
    uint8_t *rec = malloc((size_t)c->n_layers);
    if (!rec) return anna_err(x->err, x->errlen, ANNA_ENOMEM, "out of memory");
    for (int i = 0; i < c->n_layers; i++) rec[i] = c->layers[i].kind == LAYER_KIND_GDN;
    snprintf(k, sizeof k, "%s.attention.recurrent_layers", A);
    rc = gguf_writer_set_arr(w, k, GGUF_TYPE_BOOL, rec, c->n_layers);
    free(rec);
    if (rc) return anna_err(x->err, x->errlen, rc, "metadata write failed");
    snprintf(k, sizeof k, "%s.rope.dimension_sections", A);
    if ((rc = gguf_writer_set_arr(w, k, GGUF_TYPE_INT32, sec, 4)) || (rc = KU("ssm.conv_kernel", c->gdn_conv)) ||
        (rc = KU("ssm.state_size", c->gdn_dk)) || (rc = KU("ssm.group_count", c->gdn_hk)) ||
        (rc = KU("ssm.time_step_rank", c->gdn_hv)) || (rc = KU("ssm.inner_size", c->gdn_hv * c->gdn_dv)) ||
        (rc = KU("full_attention_interval", interval)))
      return anna_err(x->err, x->errlen, rc, "metadata write failed");
  }
#undef KU
#undef KF
  return write_tokenizer(x, w, cfgj);
}

int model_quantize_hf(const char *dir, const char *out_path, const char *type, model_quantize_stats *stats, char *err,
                      size_t errlen) {
  if (!model_quantize_type_known(type))
    return anna_err(err, errlen, ANNA_EINVAL, "quantize type '%s' is not supported (have: int4, bf16)", type ? type : "(null)");
  model_config *c = calloc(1, sizeof *c);
  if (!c) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  safetensors_set *st = NULL;
  gguf_writer *w = NULL;
  json_t *cfgj = NULL;
  float *rope_freqs = NULL;
  static const plan zero_plan;
  plan p = zero_plan;
  p.stats = stats;
  if (stats) memset(stats, 0, sizeof *stats);
  char cpath[4096];
  snprintf(cpath, sizeof cpath, "%s/config.json", dir);
  int rc = config_parse_hf(c, cpath, err, errlen);
  if (rc) goto out;
  if (!gguf_arch(c->arch) || c->n_experts > 0) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "%s: quantizing model_type '%s' is not supported (have: qwen2, qwen3, llama, qwen3_5 dense)", dir,
                  c->model_type);
    goto out;
  }
  for (int i = 0; i < c->n_layers; i++)
    if (c->layers[i].rope_type != ROPE_KIND_DEFAULT && c->layers[i].kind != LAYER_KIND_GDN &&
        !(c->arch == MODEL_ARCH_LLAMA && c->layers[i].rope_type == ROPE_KIND_LLAMA3)) {
      rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: quantizing with rope scaling '%s' is not supported yet", dir,
                    config_rope_name(c->layers[i].rope_type));
      goto out;
    }
  json_error_t je;
  if (!(cfgj = json_load_file(cpath, 0, &je))) {
    rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: %s", cpath, je.text);
    goto out;
  }
  if ((rc = safetensors_open(&st, dir, err, errlen))) goto out;
  const char *prefix = safetensors_find(st, "model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  ctx x = {&p, st, c, dir, prefix, type, !strcmp(type, "int4"), err, errlen, 0};
  p.hk = c->gdn_hk > 0 ? c->gdn_hk : 1;
  p.r = c->gdn_hk > 0 ? c->gdn_hv / c->gdn_hk : 1;
  job *jp;
  char s[160];
  snprintf(s, sizeof s, "%sembed_tokens.weight", prefix);
  if (!(jp = add(&x, "token_embd.weight", s, C_EMBD, 0, X_NONE))) {
    rc = x.rc;
    goto out;
  }
  if ((rc = plan_layers(&x))) goto out;
  snprintf(s, sizeof s, "%snorm.weight", prefix);
  if (!(jp = add(&x, "output_norm.weight", s, C_OTHER, 0, c->arch == MODEL_ARCH_QWEN3_5 ? X_PLUS1 : X_NONE))) {
    rc = x.rc;
    goto out;
  }
  if (!c->tie_embeddings && !(jp = add(&x, "output.weight", "lm_head.weight", C_OUTPUT, 0, X_NONE))) {
    rc = x.rc;
    goto out;
  }
  if (c->layers[0].rope_type == ROPE_KIND_LLAMA3) {
    /* llama.cpp's converter: the llama3 frequency divisors as a rope_freqs tensor (float32
     * arithmetic, as its torch code) */
    const layer_config *l = &c->layers[0];
    const int half = l->rope_dims / 2;
    if (half < 1 || half > 4096 || !(rope_freqs = malloc(sizeof(float) * (size_t)half))) {
      rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: rope dims %d", dir, l->rope_dims);
      goto out;
    }
    const float factor = (float)l->rope_factor, lo = (float)l->rope_low_freq_factor, hi = (float)l->rope_high_freq_factor,
                old_ctx = (float)l->rope_orig_max_pos;
    const float lo_wl = old_ctx / lo, hi_wl = old_ctx / hi;
    for (int i = 0; i < half; i++) {
      const float freq = 1.0f / powf((float)l->rope_theta, (float)(2 * i) / (float)l->rope_dims);
      const float wl = (float)(2 * M_PI) / freq;
      if (wl < hi_wl) rope_freqs[i] = 1.0f;
      else if (wl > lo_wl) rope_freqs[i] = factor;
      else {
        const float smooth = (old_ctx / wl - lo) / (hi - lo);
        rope_freqs[i] = 1.0f / ((1.0f - smooth) / factor + smooth);
      }
    }
    if (p.n == p.cap) {
      job *nj = realloc(p.j, (size_t)(p.cap + 1) * sizeof *nj);
      if (!nj) {
        rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
        goto out;
      }
      p.j = nj, p.cap++;
    }
    job *j = &p.j[p.n++];
    memset(j, 0, sizeof *j);
    snprintf(j->name, sizeof j->name, "rope_freqs.weight");
    j->synth = rope_freqs, j->type = ANNA_DTYPE_F32, j->rows = 1, j->cols = half, j->is_1d = 1;
  }
  qsort(p.j, (size_t)p.n, sizeof *p.j, job_order);
  if (x.int4) assign_more_bits(&p, c->n_layers);
  if ((rc = threadpool_create(&p.tp, 0, err, errlen))) goto out;
  const int nth = threadpool_size(p.tp);
  if (nth > QUANTIZE_MAX_THREADS) {
    rc = anna_err(err, errlen, ANNA_ERANGE, "quantize: %d threads (at most %d)", nth, QUANTIZE_MAX_THREADS);
    goto out;
  }
  for (int t = 0; t < nth; t++) {
    p.row[t] = malloc((size_t)p.max_cols * sizeof(float));
    p.tmp[t] = malloc((size_t)p.max_cols * sizeof(float));
    if (!p.row[t] || !p.tmp[t]) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      goto out;
    }
  }
  if ((rc = gguf_writer_create(&w, err, errlen))) goto out;
  if ((rc = write_meta(&x, w, cfgj))) goto out;
  for (int64_t i = 0; i < p.n; i++) {
    const job *j = &p.j[i];
    int64_t dims[2] = {j->cols, j->rows};
    if ((rc = gguf_writer_add_tensor(w, j->name, j->type, j->rows > 1 || !j->is_1d ? 2 : 1, dims))) {
      rc = anna_err(err, errlen, rc, "%s: cannot add tensor %s", dir, j->name);
      goto out;
    }
  }
  rc = gguf_writer_write(w, out_path, fill, &p, err, errlen);
out:
  gguf_writer_free(w);
  safetensors_close(st);
  json_decref(cfgj);
  free(p.j);
  free(rope_freqs);
  for (int t = 0; t < QUANTIZE_MAX_THREADS; t++) free(p.row[t]), free(p.tmp[t]);
  threadpool_free(p.tp);
  free(c);
  return rc;
}

/* ---- cache ---- */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static int cache_file(const char *name) {
  size_t n = strlen(name);
  return !strcmp(name, "config.json") || !strcmp(name, "tokenizer.json") || !strcmp(name, "tokenizer_config.json") ||
         !strcmp(name, "chat_template.jinja") || !strcmp(name, "model.safetensors.index.json") ||
         (n > 12 && !strcmp(name + n - 12, ".safetensors"));
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int model_quantize_cache_path(const char *dir, const char *type, char *out, size_t outlen, char *err, size_t errlen) {
  char mt[64] = "", arch[64];
  char cpath[4096];
  snprintf(cpath, sizeof cpath, "%s/config.json", dir);
  int rc = config_probe_hf(cpath, mt, sizeof mt, arch, sizeof arch, err, errlen);
  if (rc) return rc;
  DIR *d = opendir(dir);
  if (!d) return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: cannot open folder", dir);
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!cache_file(e->d_name)) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      char **nn = realloc(names, cap * sizeof *nn);
      if (!nn) break;
      names = nn;
    }
    if (!(names[n] = strdup(e->d_name))) break;
    n++;
  }
  closedir(d);
  qsort(names, n, sizeof *names, cmp_str);
  uint64_t h = 1469598103934665603ull;
  const int ver = QUANTIZE_FORMAT_VERSION;
  h = fnv(h, &ver, sizeof ver);
  h = fnv(h, type, strlen(type) + 1);
  for (size_t i = 0; i < n; i++) {
    char p[4096];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    h = fnv(h, names[i], strlen(names[i]) + 1);
    if (stat(p, &sb) == 0) {
      const int64_t v[3] = {(int64_t)sb.st_size, (int64_t)sb.st_mtim.tv_sec, (int64_t)sb.st_mtim.tv_nsec};
      h = fnv(h, v, sizeof v);
    }
    free(names[i]);
  }
  free(names);
  const char *cache = getenv("ANNA_CACHE"), *home = getenv("HOME");
  int len = cache && *cache ? snprintf(out, outlen, "%s/quant/%s-%s-%016llx.gguf", cache, mt, type, (unsigned long long)h)
                            : snprintf(out, outlen, "%s/.cache/anna/quant/%s-%s-%016llx.gguf", home ? home : ".", mt, type,
                                       (unsigned long long)h);
  if (len < 0 || (size_t)len >= outlen) return anna_err(err, errlen, ANNA_ERANGE, "cache path too long");
  return 0;
}

static int mkdirs(char *path) {
  for (char *p = path + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      int bad = mkdir(path, 0755) && errno != EEXIST;
      *p = '/';
      if (bad) return -1;
    }
  return mkdir(path, 0755) && errno != EEXIST ? -1 : 0;
}

int model_quantize_cached(const char *dir, const char *type, char *out, size_t outlen, int *built, char *err,
                          size_t errlen) {
  if (built) *built = 0;
  if (!model_quantize_type_known(type))
    return anna_err(err, errlen, ANNA_EINVAL, "quantize type '%s' is not supported (have: int4, bf16)", type ? type : "(null)");
  int rc = model_quantize_cache_path(dir, type, out, outlen, err, errlen);
  if (rc) return rc;
  if (access(out, R_OK) == 0) return 0;
  char d[4096], tmp[4200];
  snprintf(d, sizeof d, "%s", out);
  char *slash = strrchr(d, '/');
  if (slash) *slash = 0;
  if (mkdirs(d)) return anna_err(err, errlen, ANNA_EIO, "%s: cannot create cache folder: %s", d, strerror(errno));
  /* unique per process and call: concurrent builders of one file each write their own
   * temporary and the last rename wins (same bytes) */
  static _Atomic unsigned seq;
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", out, (long)getpid(), seq++);
  if ((rc = model_quantize_hf(dir, tmp, type, NULL, err, errlen))) {
    unlink(tmp);
    return rc;
  }
  if (rename(tmp, out)) {
    rc = anna_err(err, errlen, ANNA_EIO, "%s: rename failed: %s", out, strerror(errno));
    unlink(tmp);
    return rc;
  }
  if (built) *built = 1;
  return 0;
}
