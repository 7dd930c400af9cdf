/* vision_qwen35.c: the Qwen3.5 vision tower (see vision_qwen35.h). Forward per run, over all
 * inputs at once (N patches):
 *   x = pixels W_patch^T + b                     (the Conv3d with stride = kernel is a matmul)
 *   x += bilinear(pos_embed, (h, w))             (embed_bag: 4 taps per patch, host-made)
 *   per block: q, k rotated by (row, col)        (two rope calls: freq_row / freq_col in vq_load)
 *              x += proj(attn_seg(LN1 x)); x += fc2(gelu_tanh(fc1(LN2 x)))
 *   merger: LN x, each M*M consecutive patches (one merge block) as one [M*M*H] row,
 *           fc2(gelu_erf(fc1 .)).
 * Everything goes through the ops_backend table; the host only computes the per-patch
 * positions, interpolation taps and attention segments of a run (plan) into state scratch. */
#include "model/vision_qwen35.h"

#include "base/error.h"
#include "formats/dtype.h"
#include "formats/gguf.h"
#include "formats/quant.h"
#include "formats/safetensors.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VQ_MAX_DEPTH 256
#define VQ_DEFAULT_PATCHES 4096
#define VQ_PREFIX "model.visual."

typedef struct vq_block {
  float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
  ops_weight qkv, proj, fc1, fc2;
  float *qkv_b, *proj_b, *fc1_b, *fc2_b;
} vq_block;

typedef struct vision_model {
  char path[PATH_MAX];
  char describe[192];
  safetensors_set *st; /* HF folder, or */
  gguf_file *gf;        /* llama.cpp mmproj GGUF */
  float ln_eps;         /* LayerNorm epsilon (1e-6; an mmproj names its own) */
  int depth, hidden, heads, head_dim, inter, out_hidden;
  int in_ch, patch, tpatch, merge, n_pos, side, patch_dim;
  float theta;
  ops_weight patch_w, pos;
  float *patch_b;
  vq_block blocks[VQ_MAX_DEPTH];
  float *mln_w, *mln_b, *mfc1_b, *mfc2_b;
  ops_weight mfc1, mfc2;
  /* rope frequencies of the two calls: rows use the first D/4, cols the next D/4 (the others 0) */
  float *freq_row, *freq_col;
  void **allocs;
  int n_allocs, cap_allocs;
} vision_model;

typedef struct vision_state {
  const vision_model *m;
  ops_backend *be; /* borrowed: frees the backend buffers */
  int64_t max_patches;
  int max_seg;
  /* backend memory (also listed in bufs for freeing) */
  float *pix, *x, *xn, *qkv, *att, *mlp, *out, *bag_w;
  int32_t *row, *col, *bag_ids;
  void *bufs[11];
  int n_bufs;
  /* host scratch for one run's positions, taps and segments */
  int32_t *h_row, *h_col, *h_ids;
  float *h_w;
  int64_t *h_seg;
} vision_state;

/* ---- loading ---- */

static void *vm_alloc(vision_model *m, size_t bytes) {
  if (m->n_allocs == m->cap_allocs) {
    int cap = m->cap_allocs ? 2 * m->cap_allocs : 64;
    void **na = realloc(m->allocs, (size_t)cap * sizeof *na);
    if (!na) return NULL;
    m->allocs = na;
    m->cap_allocs = cap;
  }
  void *p = calloc(1, bytes ? bytes : 1);
  if (p) m->allocs[m->n_allocs++] = p;
  return p;
}

static void vm_free(void *impl) {
  vision_model *m = impl;
  if (!m) return;
  for (int i = 0; i < m->n_allocs; i++) free(m->allocs[i]);
  free(m->allocs);
  safetensors_close(m->st);
  gguf_close(m->gf);
  free(m);
}

/* The tensor model.visual.<name> with exactly `want` elements arranged as rows x cols (any
 * leading shape whose product is rows and last dims cols), or a named error. */
static int get_tensor(vision_model *m, const char *name, int64_t rows, int64_t cols, const safetensors_tensor **out,
                      char *err, size_t errlen) {
  char full[256];
  snprintf(full, sizeof full, VQ_PREFIX "%s", name);
  const safetensors_tensor *t = safetensors_find(m->st, full);
  if (!t) return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s'", m->path, full);
  if (safetensors_tensor_numel(t) != rows * cols || t->shape[0] != rows)
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: tensor '%s' has %lld elements (first dim %lld), expected [%lld, %lld]",
                    t->file, full, (long long)safetensors_tensor_numel(t), (long long)t->shape[0], (long long)rows, (long long)cols);
  *out = t;
  return 0;
}

static int get_mat(vision_model *m, ops_weight *w, int64_t rows, int64_t cols, char *err, size_t errlen,
                   const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int get_mat(vision_model *m, ops_weight *w, int64_t rows, int64_t cols, char *err, size_t errlen,
                   const char *fmt, ...) {
  char name[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  const safetensors_tensor *t;
  int rc = get_tensor(m, name, rows, cols, &t, err, errlen);
  if (rc) return rc;
  *w = (ops_weight){.type = t->dtype, .data = t->data, .rows = rows, .cols = cols};
  return 0;
}

static int get_vec(vision_model *m, float **out, int64_t n, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int get_vec(vision_model *m, float **out, int64_t n, char *err, size_t errlen, const char *fmt, ...) {
  char name[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  const safetensors_tensor *t;
  int rc = get_tensor(m, name, n, 1, &t, err, errlen);
  if (rc) return rc;
  float *v = vm_alloc(m, (size_t)n * sizeof(float));
  if (!v) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  for (int64_t i = 0; i < n; i++) v[i] = safetensors_tensor_f32(t, i);
  *out = v;
  return 0;
}

/* An integer vision_config field: required, in [lo, hi]. */
static int cfg_int(const json_t *vc, const char *path, const char *key, int lo, int hi, int *out, char *err,
                   size_t errlen) {
  const json_t *v = json_object_get(vc, key);
  if (!v) return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: vision_config.%s is missing", path, key);
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: vision_config.%s must be an integer in [%d, %d]", path, key, lo, hi);
  *out = (int)json_integer_value(v);
  return 0;
}

/* vision_config keys read here; the others below are documented no-ops (bookkeeping); any
 * other key is refused so that a tower variant (windows, deepstack) is never run as this one. */
static const char *const k_noop_keys[] = {"dtype", "torch_dtype", "initializer_range", "model_type", "_name_or_path",
                                          "transformers_version", "architectures", "layer_norm_eps_note"};

static int parse_config(vision_model *m, const char *cfg_path, char *err, size_t errlen) {
  json_error_t je;
  json_t *root = json_load_file(cfg_path, 0, &je);
  if (!root) return anna_err(err, errlen, ANNA_EFORMAT, "%s: %s (line %d)", cfg_path, je.text, je.line);
  int rc = 0;
  const json_t *mt = json_object_get(root, "model_type"), *vc = json_object_get(root, "vision_config");
  const char *type = json_is_string(mt) ? json_string_value(mt) : "";
  if (strcmp(type, "qwen3_5") && strcmp(type, "qwen3_5_moe")) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: model_type '%s' has no Qwen3.5 vision tower", cfg_path, type);
    goto out;
  }
  if (!json_is_object(vc)) {
    rc = anna_err(err, errlen, ANNA_ENOTFOUND, "%s: no vision_config: this model has no vision tower", cfg_path);
    goto out;
  }
  static const char *const known[] = {"depth", "hidden_size", "num_heads", "intermediate_size", "out_hidden_size",
                                      "in_channels", "patch_size", "temporal_patch_size", "spatial_merge_size",
                                      "num_position_embeddings", "hidden_act", "rope_parameters",
                                      "deepstack_visual_indexes"};
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)vc, key, val) {
    int ok = 0;
    for (size_t i = 0; i < sizeof known / sizeof *known && !ok; i++) ok = !strcmp(key, known[i]);
    for (size_t i = 0; i < sizeof k_noop_keys / sizeof *k_noop_keys && !ok; i++) ok = !strcmp(key, k_noop_keys[i]);
    if (!ok) {
      rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: vision_config.%s is not supported", cfg_path, key);
      goto out;
    }
  }
  if ((rc = cfg_int(vc, cfg_path, "depth", 1, VQ_MAX_DEPTH, &m->depth, err, errlen)) ||
      (rc = cfg_int(vc, cfg_path, "hidden_size", 1, 1 << 16, &m->hidden, err, errlen)) ||
      (rc = cfg_int(vc, cfg_path, "num_heads", 1, 1 << 10, &m->heads, err, errlen)) ||
      (rc = cfg_int(vc, cfg_path, "intermediate_size", 1, 1 << 18, &m->inter, err, errlen)) ||
      (rc = cfg_int(vc, cfg_path, "out_hidden_size", 1, 1 << 18, &m->out_hidden, err, errlen)) ||
      (rc = cfg_int(vc, cfg_path, "in_channels", 1, 16, &m->in_ch, err, errlen)) ||
      (rc = cfg_int(vc, cfg_path, "patch_size", 1, 64, &m->patch, err, errlen)) ||
      (rc = cfg_int(vc, cfg_path, "temporal_patch_size", 1, 16, &m->tpatch, err, errlen)) ||
      (rc = cfg_int(vc, cfg_path, "spatial_merge_size", 1, 8, &m->merge, err, errlen)) ||
      (rc = cfg_int(vc, cfg_path, "num_position_embeddings", 1, 1 << 20, &m->n_pos, err, errlen)))
    goto out;
  const json_t *act = json_object_get(vc, "hidden_act");
  if (act && (!json_is_string(act) || strcmp(json_string_value(act), "gelu_pytorch_tanh"))) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: vision_config.hidden_act must be gelu_pytorch_tanh", cfg_path);
    goto out;
  }
  const json_t *ds = json_object_get(vc, "deepstack_visual_indexes");
  if (ds && (!json_is_array(ds) || json_array_size(ds))) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: vision_config.deepstack_visual_indexes (Qwen3-VL deepstack) is not supported",
                  cfg_path);
    goto out;
  }
  m->theta = 10000.0f;
  const json_t *rp = json_object_get(vc, "rope_parameters");
  if (rp) {
    const json_t *rt = json_object_get(rp, "rope_type"), *th = json_object_get(rp, "rope_theta");
    if (!json_is_object(rp) || (rt && (!json_is_string(rt) || strcmp(json_string_value(rt), "axial"))) ||
        (th && (!json_is_number(th) || json_number_value(th) <= 0))) {
      rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "%s: vision_config.rope_parameters must be {rope_type: axial, rope_theta > 0}", cfg_path);
      goto out;
    }
    json_object_foreach((json_t *)rp, key, val) if (strcmp(key, "rope_type") && strcmp(key, "rope_theta")) {
      rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: vision_config.rope_parameters.%s is not supported", cfg_path, key);
      goto out;
    }
    if (th) m->theta = (float)json_number_value(th);
  }
  m->side = (int)lround(sqrt((double)m->n_pos));
  m->head_dim = m->hidden / m->heads;
  if (m->side * m->side != m->n_pos || m->side < 2)
    rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: vision_config.num_position_embeddings %d is not a square >= 4", cfg_path,
                  m->n_pos);
  else if (m->hidden % m->heads || m->head_dim % 4 || m->head_dim > OPS_SEG_ATTN_MAX_DIM)
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "%s: vision head dim %d (hidden_size / num_heads) must be a multiple of 4 and <= %d", cfg_path,
                  m->hidden / m->heads, OPS_SEG_ATTN_MAX_DIM);
out:
  json_decref(root);
  return rc;
}

/* ---- llama.cpp mmproj GGUF (tools/mtmd/clip.cpp, projector type qwen3vl_merger) ---- */

/* Matrix [rows, cols] = GGUF dims {cols, rows}, used in place (any type the matmul takes). */
static int gg_mat(vision_model *m, ops_weight *w, int64_t rows, int64_t cols, const char *name, char *err,
                  size_t errlen) {
  const gguf_tensor *t = gguf_tensor_find(m->gf, name);
  if (!t) return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s'", m->path, name);
  if (t->ndim > 2 || t->dims[0] != cols || t->dims[1] != rows)
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: tensor '%s' has dims {%lld, %lld}, expected {%lld, %lld}", m->path,
                    name, (long long)t->dims[0], (long long)t->dims[1], (long long)cols, (long long)rows);
  if (t->type != ANNA_DTYPE_F32 && t->type != ANNA_DTYPE_F16 && t->type != ANNA_DTYPE_BF16 && !quant_can_dot(t->type))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: tensor '%s' has unsupported type %s", m->path, name,
                    dtype_name(t->type));
  *w = (ops_weight){.type = t->type, .data = t->data, .rows = rows, .cols = cols};
  return 0;
}

/* Any tensor of n elements, dequantized to a new f32 array (vectors, and the tensors the
 * loader rearranges or the embed_bag op reads as f32). */
static int gg_f32(vision_model *m, float **out, int64_t n, const char *name, char *err, size_t errlen) {
  const gguf_tensor *t = gguf_tensor_find(m->gf, name);
  if (!t) return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: missing tensor '%s'", m->path, name);
  if (t->nelem != n)
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: tensor '%s' has %lld elements, expected %lld", m->path, name,
                    (long long)t->nelem, (long long)n);
  float *v = vm_alloc(m, (size_t)n * sizeof(float));
  if (!v) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (quant_dequantize_row(t->type, t->data, v, n) != 0)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: tensor '%s': cannot read type %s", m->path, name,
                    dtype_name(t->type));
  *out = v;
  return 0;
}

static int gg_u32(vision_model *m, const char *key, int lo, int hi, int *out, char *err, size_t errlen) {
  uint32_t v;
  char e2[160];
  int rc = gguf_get_u32(m->gf, key, &v, e2, sizeof e2);
  if (rc) return anna_err(err, errlen, rc, "%s: metadata %s: %s", m->path, key, e2);
  if ((int64_t)v < lo || (int64_t)v > hi)
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: metadata %s = %u is out of range [%d, %d]", m->path, key, v, lo, hi);
  *out = (int)v;
  return 0;
}

/* The tower from an mmproj GGUF as llama.cpp's convert_hf_to_gguf.py --mmproj writes it for
 * Qwen3-VL / Qwen3.5 (Qwen3VLVisionModel): names v.* / mm.*, the Conv3d weight split into one
 * tensor per temporal slot (v.patch_embd.weight, .weight.1), the merger's fc1 / fc2 as mm.0 /
 * mm.2, hyperparameters under clip.vision.*. Refused: another projector type, deepstack
 * layers (Qwen3-VL proper), a temporal patch other than 2 (what the converter writes). */
static int mmproj_load(vision_model *m, char *err, size_t errlen) {
  int rc = gguf_open(&m->gf, m->path, err, errlen);
  if (rc) return rc;
  const char *s = NULL;
  char e2[160];
  if (gguf_get_str(m->gf, "general.architecture", &s, e2, sizeof e2) || strcmp(s, "clip"))
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: not an mmproj file (general.architecture '%s', expected 'clip')",
                    m->path, s ? s : "(none)");
  s = NULL;
  if (gguf_get_str(m->gf, "clip.projector_type", &s, e2, sizeof e2) || strcmp(s, "qwen3vl_merger"))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "%s: mmproj projector type '%s' is not supported (have: qwen3vl_merger, the Qwen3.5 / Qwen3-VL tower)",
                    m->path, s ? s : "(none)");
  bool has_v = false;
  if (gguf_get_bool(m->gf, "clip.has_vision_encoder", &has_v, e2, sizeof e2) || !has_v)
    return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: the mmproj has no vision encoder", m->path);
  const gguf_array *ds = NULL;
  if (!gguf_get_arr(m->gf, "clip.vision.is_deepstack_layers", &ds, e2, sizeof e2))
    for (int64_t i = 0; i < ds->count; i++)
      if (gguf_array_get_i64(ds, i))
        return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                        "%s: mmproj layer %lld is a deepstack layer (Qwen3-VL deepstack is not supported)", m->path,
                        (long long)i);
  int image_size = 0;
  m->merge = 2;
  if ((rc = gg_u32(m, "clip.vision.block_count", 1, VQ_MAX_DEPTH, &m->depth, err, errlen)) ||
      (rc = gg_u32(m, "clip.vision.embedding_length", 1, 1 << 16, &m->hidden, err, errlen)) ||
      (rc = gg_u32(m, "clip.vision.attention.head_count", 1, 1 << 10, &m->heads, err, errlen)) ||
      (rc = gg_u32(m, "clip.vision.feed_forward_length", 1, 1 << 18, &m->inter, err, errlen)) ||
      (rc = gg_u32(m, "clip.vision.projection_dim", 1, 1 << 18, &m->out_hidden, err, errlen)) ||
      (rc = gg_u32(m, "clip.vision.patch_size", 1, 64, &m->patch, err, errlen)) ||
      (rc = gg_u32(m, "clip.vision.image_size", 1, 1 << 20, &image_size, err, errlen)))
    return rc;
  if (gguf_kv_find(m->gf, "clip.vision.spatial_merge_size") &&
      (rc = gg_u32(m, "clip.vision.spatial_merge_size", 1, 8, &m->merge, err, errlen)))
    return rc;
  m->ln_eps = 1e-6f;
  if (gguf_kv_find(m->gf, "clip.vision.attention.layer_norm_epsilon") &&
      (rc = gguf_get_f32(m->gf, "clip.vision.attention.layer_norm_epsilon", &m->ln_eps, e2, sizeof e2)))
    return anna_err(err, errlen, rc, "%s: %s", m->path, e2);
  m->in_ch = 3;
  m->tpatch = 2;
  m->theta = 10000.0f; /* transformers' Qwen3.5 / Qwen3-VL vision rope; the converter keeps no theta */
  m->side = image_size / m->patch;
  m->n_pos = m->side * m->side;
  m->head_dim = m->hidden / m->heads;
  if (m->side < 2 || m->side * m->patch != image_size)
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: clip.vision.image_size %d is not a multiple >= 2 of the patch size %d",
                    m->path, image_size, m->patch);
  if (m->hidden % m->heads || m->head_dim % 4 || m->head_dim > OPS_SEG_ATTN_MAX_DIM)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "%s: vision head dim %d (embedding_length / head_count) must be a multiple of 4 and <= %d", m->path,
                    m->hidden / m->heads, OPS_SEG_ATTN_MAX_DIM);
  const int H = m->hidden, I = m->inter, H4 = H * m->merge * m->merge, PP = m->patch * m->patch;
  m->patch_dim = m->in_ch * m->tpatch * PP;
  /* The Conv3d weight [H, C, T, P, P] comes back from its two slots [H, C, P, P]: one f32
   * matrix whose rows are ordered (c, t, y, x), as the processor lays out a patch vector. */
  float *w0, *w1, *pw;
  if ((rc = gg_f32(m, &w0, (int64_t)H * 3 * PP, "v.patch_embd.weight", err, errlen)) ||
      (rc = gg_f32(m, &w1, (int64_t)H * 3 * PP, "v.patch_embd.weight.1", err, errlen)))
    return rc;
  if (!(pw = vm_alloc(m, sizeof(float) * (size_t)H * (size_t)m->patch_dim)))
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  for (int h = 0; h < H; h++)
    for (int c = 0; c < 3; c++) {
      memcpy(pw + ((size_t)h * m->patch_dim + (size_t)(2 * c) * PP), w0 + ((size_t)h * 3 + c) * PP, sizeof(float) * PP);
      memcpy(pw + ((size_t)h * m->patch_dim + (size_t)(2 * c + 1) * PP), w1 + ((size_t)h * 3 + c) * PP,
             sizeof(float) * PP);
    }
  m->patch_w = (ops_weight){.type = ANNA_DTYPE_F32, .data = pw, .rows = H, .cols = m->patch_dim};
  float *pos;
  if ((rc = gg_f32(m, &m->patch_b, H, "v.patch_embd.bias", err, errlen)) ||
      (rc = gg_f32(m, &pos, (int64_t)m->n_pos * H, "v.position_embd.weight", err, errlen)))
    return rc;
  m->pos = (ops_weight){.type = ANNA_DTYPE_F32, .data = pos, .rows = m->n_pos, .cols = H};
  char n[96];
  for (int l = 0; l < m->depth; l++) {
    vq_block *b = &m->blocks[l];
#define GN(suffix) (snprintf(n, sizeof n, "v.blk.%d." suffix, l), n)
    if ((rc = gg_f32(m, &b->ln1_w, H, GN("ln1.weight"), err, errlen)) ||
        (rc = gg_f32(m, &b->ln1_b, H, GN("ln1.bias"), err, errlen)) ||
        (rc = gg_f32(m, &b->ln2_w, H, GN("ln2.weight"), err, errlen)) ||
        (rc = gg_f32(m, &b->ln2_b, H, GN("ln2.bias"), err, errlen)) ||
        (rc = gg_mat(m, &b->qkv, 3 * (int64_t)H, H, GN("attn_qkv.weight"), err, errlen)) ||
        (rc = gg_f32(m, &b->qkv_b, 3 * (int64_t)H, GN("attn_qkv.bias"), err, errlen)) ||
        (rc = gg_mat(m, &b->proj, H, H, GN("attn_out.weight"), err, errlen)) ||
        (rc = gg_f32(m, &b->proj_b, H, GN("attn_out.bias"), err, errlen)) ||
        (rc = gg_mat(m, &b->fc1, I, H, GN("ffn_up.weight"), err, errlen)) ||
        (rc = gg_f32(m, &b->fc1_b, I, GN("ffn_up.bias"), err, errlen)) ||
        (rc = gg_mat(m, &b->fc2, H, I, GN("ffn_down.weight"), err, errlen)) ||
        (rc = gg_f32(m, &b->fc2_b, H, GN("ffn_down.bias"), err, errlen)))
      return rc;
#undef GN
  }
  if ((rc = gg_f32(m, &m->mln_w, H, "v.post_ln.weight", err, errlen)) ||
      (rc = gg_f32(m, &m->mln_b, H, "v.post_ln.bias", err, errlen)) ||
      (rc = gg_mat(m, &m->mfc1, H4, H4, "mm.0.weight", err, errlen)) ||
      (rc = gg_f32(m, &m->mfc1_b, H4, "mm.0.bias", err, errlen)) ||
      (rc = gg_mat(m, &m->mfc2, m->out_hidden, H4, "mm.2.weight", err, errlen)) ||
      (rc = gg_f32(m, &m->mfc2_b, m->out_hidden, "mm.2.bias", err, errlen)))
    return rc;
  return 0;
}

static int vq_load(void **impl, const model_source *src, const model_load_params *p, char *err, size_t errlen) {
  (void)p;
  *impl = NULL;
  vision_model *m = calloc(1, sizeof *m);
  if (!m) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  snprintf(m->path, sizeof m->path, "%s", src->path);
  m->ln_eps = 1e-6f;
  int rc;
  if (src->is_gguf) {
    rc = mmproj_load(m, err, errlen);
    goto finish;
  }
  char cfg[PATH_MAX + 16];
  snprintf(cfg, sizeof cfg, "%s/config.json", src->path);
  rc = parse_config(m, cfg, err, errlen);
  if (!rc) rc = safetensors_open(&m->st, src->path, err, errlen);
  if (rc) {
    vm_free(m);
    return rc;
  }
  {
  const int H = m->hidden, I = m->inter, H4 = H * m->merge * m->merge;
  m->patch_dim = m->in_ch * m->tpatch * m->patch * m->patch;
  rc = get_mat(m, &m->patch_w, H, m->patch_dim, err, errlen, "patch_embed.proj.weight");
  if (!rc) rc = get_vec(m, &m->patch_b, H, err, errlen, "patch_embed.proj.bias");
  if (!rc) rc = get_mat(m, &m->pos, m->n_pos, H, err, errlen, "pos_embed.weight");
  for (int l = 0; !rc && l < m->depth; l++) {
    vq_block *b = &m->blocks[l];
    if ((rc = get_vec(m, &b->ln1_w, H, err, errlen, "blocks.%d.norm1.weight", l)) ||
        (rc = get_vec(m, &b->ln1_b, H, err, errlen, "blocks.%d.norm1.bias", l)) ||
        (rc = get_vec(m, &b->ln2_w, H, err, errlen, "blocks.%d.norm2.weight", l)) ||
        (rc = get_vec(m, &b->ln2_b, H, err, errlen, "blocks.%d.norm2.bias", l)) ||
        (rc = get_mat(m, &b->qkv, 3 * (int64_t)H, H, err, errlen, "blocks.%d.attn.qkv.weight", l)) ||
        (rc = get_vec(m, &b->qkv_b, 3 * (int64_t)H, err, errlen, "blocks.%d.attn.qkv.bias", l)) ||
        (rc = get_mat(m, &b->proj, H, H, err, errlen, "blocks.%d.attn.proj.weight", l)) ||
        (rc = get_vec(m, &b->proj_b, H, err, errlen, "blocks.%d.attn.proj.bias", l)) ||
        (rc = get_mat(m, &b->fc1, I, H, err, errlen, "blocks.%d.mlp.linear_fc1.weight", l)) ||
        (rc = get_vec(m, &b->fc1_b, I, err, errlen, "blocks.%d.mlp.linear_fc1.bias", l)) ||
        (rc = get_mat(m, &b->fc2, H, I, err, errlen, "blocks.%d.mlp.linear_fc2.weight", l)))
      break;
    rc = get_vec(m, &b->fc2_b, H, err, errlen, "blocks.%d.mlp.linear_fc2.bias", l);
  }
  if (!rc) rc = get_vec(m, &m->mln_w, H, err, errlen, "merger.norm.weight");
  if (!rc) rc = get_vec(m, &m->mln_b, H, err, errlen, "merger.norm.bias");
  if (!rc) rc = get_mat(m, &m->mfc1, H4, H4, err, errlen, "merger.linear_fc1.weight");
  if (!rc) rc = get_vec(m, &m->mfc1_b, H4, err, errlen, "merger.linear_fc1.bias");
  if (!rc) rc = get_mat(m, &m->mfc2, m->out_hidden, H4, err, errlen, "merger.linear_fc2.weight");
  if (!rc) rc = get_vec(m, &m->mfc2_b, m->out_hidden, err, errlen, "merger.linear_fc2.bias");
  }
finish:
  if (!rc) {
    const int D = m->head_dim;
    /* Axial rope: f_j = theta^(-4j/D) for j < D/4 (transformers: 1 / theta^(arange(0, D/2, 2) /
     * (D/2)) in f32). Rows rotate pairs (j, j + D/2) for j < D/4 by row * f_j, cols the pairs
     * j + D/4 by col * f_j. A zero frequency is an exact identity rotation (cos 1, sin 0), so
     * two calls of the plain rope op, each with the other axis' frequencies zeroed, apply it. */
    m->freq_row = vm_alloc(m, sizeof(float) * (size_t)D / 2);
    m->freq_col = vm_alloc(m, sizeof(float) * (size_t)D / 2);
    if (!m->freq_row || !m->freq_col) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    } else {
      for (int j = 0; j < D / 4; j++) {
        const float f = 1.0f / powf(m->theta, (float)(2 * j) / (float)(D / 2));
        m->freq_row[j] = f;
        m->freq_col[D / 4 + j] = f;
      }
    }
  }
  if (rc) {
    vm_free(m);
    return rc;
  }
  snprintf(m->describe, sizeof m->describe,
           "qwen3_5_vision%s: depth %d, hidden %d, heads %d, intermediate %d, out %d, patch %d x %d, merge %d",
           m->gf ? " (mmproj)" : "", m->depth, m->hidden, m->heads, m->inter, m->out_hidden, m->tpatch, m->patch, m->merge);
  *impl = m;
  return 0;
}

static int vq_probe(const model_source *src) {
  return !src->is_gguf && (!strcmp(src->model_type, "qwen3_5") || !strcmp(src->model_type, "qwen3_5_moe"));
}

static void vq_describe(const void *impl, model_desc *out) {
  const vision_model *m = impl;
  *out = (model_desc){.text = m->describe, .vocab = 0, .n_embd = m->out_hidden, .n_layers = m->depth};
}

static int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

static void vq_backend_shape(const void *impl, int n_ctx, ops_model_shape *out) {
  const vision_model *m = impl;
  memset(out, 0, sizeof *out);
  const int64_t H4 = (int64_t)m->hidden * m->merge * m->merge;
  out->max_cols = max64(max64(m->patch_dim, H4), max64(m->inter, 2 * (int64_t)m->hidden));
  out->n_ctx = n_ctx;
  out->n_heads = m->heads;
}

/* ---- state ---- */

static void vq_state_free(void *state) {
  vision_state *s = state;
  if (!s) return;
  for (int i = 0; i < s->n_bufs; i++) s->be->free(s->be, s->bufs[i]);
  free(s->h_row);
  free(s->h_col);
  free(s->h_ids);
  free(s->h_w);
  free(s->h_seg);
  free(s);
}

static void *be_buf(vision_state *s, size_t bytes) {
  void *p = s->be->alloc(s->be, bytes ? bytes : 4);
  if (p) s->bufs[s->n_bufs++] = p;
  return p;
}

static int vq_state_create(void **state, const void *impl, ops_backend *be, const model_state_params *p, char *err,
                           size_t errlen) {
  *state = NULL;
  const vision_model *m = impl;
  /* Ops this kind calls: a backend without one is refused here, before anything runs. */
  const struct {
    const char *name;
    int have;
  } need[] = {{"matmul", be->matmul != NULL},         {"rope", be->rope != NULL},
              {"add", be->add != NULL},               {"layer_norm", be->layer_norm != NULL},
              {"gelu", be->gelu != NULL},             {"attention_seg", be->attention_seg != NULL},
              {"embed_bag", be->embed_bag != NULL},   {"alloc", be->alloc && be->free && be->upload && be->download}};
  for (size_t i = 0; i < sizeof need / sizeof *need; i++)
    if (!need[i].have)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "vision tower: %s ops not implemented yet (the %s backend has no %s op)",
                      !strcmp(be->name, "cuda") ? "CUDA" : be->name, be->name, need[i].name);
  const int64_t N = p->n_batch > 0 ? p->n_batch : VQ_DEFAULT_PATCHES;
  const int64_t MM = (int64_t)m->merge * m->merge;
  if (N < MM || N > (INT32_MAX / 8))
    return anna_err(err, errlen, ANNA_ERANGE, "vision tower: n_batch %lld patches out of range [%lld, %d]",
                    (long long)N, (long long)MM, INT32_MAX / 8);
  vision_state *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  s->be = be;
  s->m = m;
  s->max_patches = N;
  s->max_seg = (int)(N / MM);
  const int64_t H = m->hidden, rows_out = N / MM;
  const size_t F = sizeof(float);
  s->pix = be_buf(s, (size_t)(N * m->patch_dim) * F);
  s->x = be_buf(s, (size_t)(N * H) * F);
  s->xn = be_buf(s, (size_t)(N * H) * F);
  s->qkv = be_buf(s, (size_t)(N * 3 * H) * F);
  s->att = be_buf(s, (size_t)(N * H) * F);
  s->mlp = be_buf(s, (size_t)(N * max64(m->inter, H)) * F); /* fc1 of blocks; merger fc1 [N/4, 4H] */
  s->out = be_buf(s, (size_t)(rows_out * m->out_hidden) * F);
  s->bag_w = be_buf(s, (size_t)(N * 4) * F);
  s->row = be_buf(s, (size_t)N * sizeof(int32_t));
  s->col = be_buf(s, (size_t)N * sizeof(int32_t));
  s->bag_ids = be_buf(s, (size_t)(N * 4) * sizeof(int32_t));
  s->h_row = malloc((size_t)N * sizeof(int32_t));
  s->h_col = malloc((size_t)N * sizeof(int32_t));
  s->h_ids = malloc((size_t)(N * 4) * sizeof(int32_t));
  s->h_w = malloc((size_t)(N * 4) * F);
  s->h_seg = malloc((size_t)(s->max_seg + 1) * sizeof(int64_t));
  if (s->n_bufs != 11 || !s->h_row || !s->h_col || !s->h_ids || !s->h_w || !s->h_seg) {
    vq_state_free(s);
    return anna_err(err, errlen, ANNA_ENOMEM, "vision tower: cannot allocate buffers for %lld patches", (long long)N);
  }
  *state = s;
  return 0;
}

/* ---- run ---- */

/* Checks the grids against the pixels and the state; fills positions, taps and segments. */
static int plan(const vision_model *m, vision_state *s, const model_input *in, int *n_seg, char *err, size_t errlen) {
  if (!in->pixels || !in->grid_thw || in->n_grids < 1)
    return anna_err(err, errlen, ANNA_EINVAL, "vision tower: no pixels or no grids given");
  if (in->patch_dim != m->patch_dim)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "vision tower: pixel rows have %d values, this tower takes %d (3 x %d x %d x %d)", in->patch_dim,
                    m->patch_dim, m->tpatch, m->patch, m->patch);
  const int M = m->merge, S = m->side;
  int64_t total = 0;
  for (int g = 0; g < in->n_grids; g++) {
    const int32_t t = in->grid_thw[3 * g], h = in->grid_thw[3 * g + 1], w = in->grid_thw[3 * g + 2];
    if (t < 1 || h < M || w < M || h % M || w % M || t > (1 << 16) || h > (1 << 16) || w > (1 << 16))
      return anna_err(err, errlen, ANNA_EINVAL,
                      "vision tower: input %d has grid (t %d, h %d, w %d): h and w must be positive multiples of the "
                      "merge size %d, t >= 1, each at most 65536",
                      g, t, h, w, M);
    total += (int64_t)t * h * w;
    if (total > s->max_patches)
      return anna_err(err, errlen, ANNA_ERANGE, "vision tower: the grids hold more than the state's %lld patches (n_batch)",
                      (long long)s->max_patches);
  }
  if (total != in->n_patches)
    return anna_err(err, errlen, ANNA_EINVAL, "vision tower: %lld pixel rows given, the grids need %lld (sum of t*h*w)",
                    (long long)in->n_patches, (long long)total);
  int64_t i = 0;
  int ns = 0;
  s->h_seg[0] = 0;
  for (int g = 0; g < in->n_grids; g++) {
    const int32_t t = in->grid_thw[3 * g], h = in->grid_thw[3 * g + 1], w = in->grid_thw[3 * g + 2];
    for (int32_t tt = 0; tt < t; tt++) {
      /* merge-block order: blocks in raster order, inside a block its M x M patches in raster */
      for (int32_t br = 0; br < h / M; br++)
        for (int32_t bc = 0; bc < w / M; bc++)
          for (int ir = 0; ir < M; ir++)
            for (int ic = 0; ic < M; ic++, i++) {
              const int32_t r = br * M + ir, c = bc * M + ic;
              s->h_row[i] = r;
              s->h_col[i] = c;
              /* align_corners bilinear taps as transformers computes them in f32:
               * src = idx * (S-1) / max(size-1, 1), taps floor and floor+1 (clamped), weights
               * 1 - |src - tap| */
              const float sr = (float)(r * (S - 1)) / (float)(h > 1 ? h - 1 : 1);
              const float sc = (float)(c * (S - 1)) / (float)(w > 1 ? w - 1 : 1);
              const float fr = floorf(sr), fc = floorf(sc);
              const int r0 = (int)fr, c0 = (int)fc;
              const int r1 = r0 + 1 < S ? r0 + 1 : S - 1, c1 = c0 + 1 < S ? c0 + 1 : S - 1;
              const float wr0 = fmaxf(1.0f - fabsf(sr - fr), 0.0f), wr1 = fmaxf(1.0f - fabsf(sr - fr - 1.0f), 0.0f);
              const float wc0 = fmaxf(1.0f - fabsf(sc - fc), 0.0f), wc1 = fmaxf(1.0f - fabsf(sc - fc - 1.0f), 0.0f);
              int32_t *id = s->h_ids + 4 * i;
              float *wt = s->h_w + 4 * i;
              id[0] = r0 * S + c0, wt[0] = wr0 * wc0;
              id[1] = r0 * S + c1, wt[1] = wr0 * wc1;
              id[2] = r1 * S + c0, wt[2] = wr1 * wc0;
              id[3] = r1 * S + c1, wt[3] = wr1 * wc1;
            }
      s->h_seg[++ns] = i;
    }
  }
  *n_seg = ns;
  return 0;
}

static int vq_run(const void *impl, void *state, ops_backend *be, const model_input *in, const model_output *out,
                  char *err, size_t errlen) {
  const vision_model *m = impl;
  vision_state *s = state;
  if (in->io != MODEL_IO_PIXELS || out->io != MODEL_IO_EMBEDDINGS)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "the vision tower maps pixels to embeddings, not %s to %s",
                    model_io_name(in->io), model_io_name(out->io));
  int n_seg = 0;
  int rc = plan(m, s, in, &n_seg, err, errlen);
  if (rc) return rc;
  const int64_t N = in->n_patches, MM = (int64_t)m->merge * m->merge, R = N / MM;
  if (!out->embd || out->embd_rows < R)
    return anna_err(err, errlen, ANNA_EINVAL, "vision tower: the output holds %lld rows, the grids make %lld",
                    (long long)(out->embd ? out->embd_rows : 0), (long long)R);
  const int H = m->hidden, D = m->head_dim;
  if (be->bind) be->bind(be); /* a device backend: this thread's work goes to its device */
  be->upload(be, s->pix, in->pixels, (size_t)(N * m->patch_dim) * sizeof(float));
  be->upload(be, s->row, s->h_row, (size_t)N * sizeof(int32_t));
  be->upload(be, s->col, s->h_col, (size_t)N * sizeof(int32_t));
  be->upload(be, s->bag_ids, s->h_ids, (size_t)(4 * N) * sizeof(int32_t));
  be->upload(be, s->bag_w, s->h_w, (size_t)(4 * N) * sizeof(float));
  if (be->step_begin) be->step_begin(be, N);

  be->matmul(be, s->x, s->pix, N, &m->patch_w, m->patch_b);
  be->embed_bag(be, s->x, &m->pos, s->bag_ids, s->bag_w, N, 4);
  const ops_seg_attn_args sa = {.n = N,
                                .n_heads = m->heads,
                                .head_dim = D,
                                .scale = 1.0f / sqrtf((float)D),
                                .q = s->qkv,
                                .k = s->qkv + H,
                                .v = s->qkv + 2 * H,
                                .q_stride = 3 * (int64_t)H,
                                .k_stride = 3 * (int64_t)H,
                                .v_stride = 3 * (int64_t)H,
                                .n_seg = n_seg,
                                .seg = s->h_seg};
  for (int l = 0; l < m->depth; l++) {
    const vq_block *b = &m->blocks[l];
    be->layer_norm(be, s->xn, s->x, b->ln1_w, b->ln1_b, N, H, m->ln_eps);
    be->matmul(be, s->qkv, s->xn, N, &b->qkv, b->qkv_b);
    /* q and k heads are adjacent in each qkv row: one call rotates both (2 * heads heads) */
    be->rope(be, s->qkv, N, 2 * m->heads, D, 3 * (int64_t)H, D, m->freq_row, s->row, 0);
    be->rope(be, s->qkv, N, 2 * m->heads, D, 3 * (int64_t)H, D, m->freq_col, s->col, 0);
    be->attention_seg(be, s->att, &sa);
    be->matmul(be, s->xn, s->att, N, &b->proj, b->proj_b);
    be->add(be, s->x, s->xn, N * H);
    be->layer_norm(be, s->xn, s->x, b->ln2_w, b->ln2_b, N, H, m->ln_eps);
    be->matmul(be, s->mlp, s->xn, N, &b->fc1, b->fc1_b);
    be->gelu(be, s->mlp, N * m->inter, 0);
    be->matmul(be, s->xn, s->mlp, N, &b->fc2, b->fc2_b);
    be->add(be, s->x, s->xn, N * H);
  }
  /* merger: per-token LN, then each M*M consecutive tokens (one block) are one [M*M*H] row */
  be->layer_norm(be, s->xn, s->x, m->mln_w, m->mln_b, N, H, m->ln_eps);
  be->matmul(be, s->mlp, s->xn, R, &m->mfc1, m->mfc1_b);
  be->gelu(be, s->mlp, R * MM * H, 1);
  be->matmul(be, s->out, s->mlp, R, &m->mfc2, m->mfc2_b);
  if (be->step_end) be->step_end(be);
  be->download(be, out->embd, s->out, (size_t)(R * m->out_hidden) * sizeof(float));
  if (out->embd_written) *out->embd_written = R;
  if (be->error) return be->error(be, err, errlen);
  return 0;
}

int vision_qwen35_rope_positions(const uint8_t *is_vision, int32_t n, const int32_t *run_hw, int n_runs, int merge,
                                 int32_t *pos3, int32_t *next, char *err, size_t errlen) {
  int32_t p = 0;
  int run = 0;
  for (int32_t i = 0; i < n;) {
    if (!is_vision[i]) {
      pos3[i] = pos3[n + i] = pos3[2 * n + i] = p++;
      i++;
      continue;
    }
    int32_t len = 0;
    while (i + len < n && is_vision[i + len]) len++;
    if (run >= n_runs)
      return anna_err(err, errlen, ANNA_EINVAL, "vision run %d (at token %d) has no grid: %d grids given", run, i,
                      n_runs);
    const int32_t h = run_hw[2 * run], w = run_hw[2 * run + 1];
    if (merge < 1 || h < merge || w < merge || h % merge || w % merge || (int64_t)(h / merge) * (w / merge) != len)
      return anna_err(err, errlen, ANNA_EINVAL,
                      "vision run %d (at token %d) has %d tokens, its grid %d x %d makes %lld (merge %d)", run, i, len,
                      h, w, (long long)(merge > 0 ? (int64_t)(h / merge) * (w / merge) : 0), merge);
    const int32_t gw = w / merge, gh = h / merge;
    for (int32_t j = 0; j < len; j++) {
      pos3[i + j] = p;
      pos3[n + i + j] = p + j / gw;
      pos3[2 * n + i + j] = p + j % gw;
    }
    p += gh > gw ? gh : gw;
    i += len;
    run++;
  }
  if (run != n_runs)
    return anna_err(err, errlen, ANNA_EINVAL, "%d grids given for %d vision runs", n_runs, run);
  *next = p;
  return 0;
}

const model_kind vision_qwen35_kind = {
    .name = "qwen3_5_vision",
    .inputs = MODEL_IO_BIT(MODEL_IO_PIXELS),
    .outputs = MODEL_IO_BIT(MODEL_IO_EMBEDDINGS),
    .probe = vq_probe,
    .load = vq_load,
    .free = vm_free,
    .describe = vq_describe,
    .backend_shape = vq_backend_shape,
    .state_create = vq_state_create,
    .state_free = vq_state_free,
    .run = vq_run,
    .warmup = NULL,
    .seq = NULL,
};
