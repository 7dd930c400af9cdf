/* cpu_vision.c: the CPU encoder ops (ops.h "Encoder ops"): LayerNorm with bias, GELU (tanh
 * and erf), bidirectional segmented attention and the weighted row gather of interpolated
 * position tables. Row-parallel over the backend's pool; each row's arithmetic is the same
 * whatever the thread count, so results do not depend on it. */
#include "backends/cpu/cpu_internal.h"

#include "formats/dtype.h"

#include <math.h>

/* ---- LayerNorm ---- */

struct ln_ctx {
  float *y;
  const float *x, *w, *b;
  int64_t rows;
  int d;
  float eps;
};

static void ln_task(void *p, int ith, int nth) {
  const struct ln_ctx *c = p;
  int64_t lo, hi;
  threadpool_range(c->rows, ith, nth, &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    const float *x = c->x + r * c->d;
    float *y = c->y + r * c->d;
    /* Two passes in double: the mean of a wide row and then the centred variance, so a row
     * with a large offset keeps its small spread (PyTorch's CPU LayerNorm is also two-pass). */
    double s = 0;
    for (int i = 0; i < c->d; i++) s += x[i];
    const double mean = s / c->d;
    double v = 0;
    for (int i = 0; i < c->d; i++) v += (x[i] - mean) * (x[i] - mean);
    const float m = (float)mean, inv = (float)(1.0 / sqrt(v / c->d + c->eps));
    for (int i = 0; i < c->d; i++) {
      const float t = (x[i] - m) * inv * c->w[i];
      y[i] = c->b ? t + c->b[i] : t;
    }
  }
}

static void cpu_layer_norm(ops_backend *be, float *y, const float *x, const float *w, const float *b, int64_t rows,
                           int d, float eps) {
  struct ln_ctx c = {y, x, w, b, rows, d, eps};
  if (rows * d < 16384)
    ln_task(&c, 0, 1);
  else
    threadpool_run(((cpu_impl *)be->impl)->tp, ln_task, &c);
}

/* ---- GELU ---- */

struct gelu_ctx {
  float *y;
  int64_t n;
  int exact;
};

static void gelu_task(void *p, int ith, int nth) {
  const struct gelu_ctx *c = p;
  int64_t lo, hi;
  threadpool_range(c->n, ith, nth, &lo, &hi);
  float *y = c->y;
  if (c->exact) {
    for (int64_t i = lo; i < hi; i++) y[i] = 0.5f * y[i] * (1.0f + erff(y[i] * 0.70710678118654752f));
  } else {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t i = lo; i < hi; i++) {
      const float x = y[i];
      y[i] = 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
    }
  }
}

static void cpu_gelu(ops_backend *be, float *y, int64_t n, int exact) {
  struct gelu_ctx c = {y, n, exact};
  if (n < 16384)
    gelu_task(&c, 0, 1);
  else
    threadpool_run(((cpu_impl *)be->impl)->tp, gelu_task, &c);
}

/* ---- segmented bidirectional attention ---- */

struct seg_ctx {
  float *out;
  const ops_seg_attn_args *a;
};

/* Keys per tile of the online softmax: scores for a tile live on the stack. */
#define SEG_TILE 64

/* One query row of one head against keys [k0, k1): online softmax (running max m, sum l,
 * unnormalised accumulator acc), rescaled only when a tile raises the max. */
static void seg_query(const ops_seg_attn_args *a, const float *q, int h, int64_t k0, int64_t k1, float *o) {
  const int D = a->head_dim;
  float acc[OPS_SEG_ATTN_MAX_DIM], s[SEG_TILE];
  for (int i = 0; i < D; i++) acc[i] = 0;
  float m = -INFINITY, l = 0;
  for (int64_t j0 = k0; j0 < k1; j0 += SEG_TILE) {
    const int nt = (int)(k1 - j0 < SEG_TILE ? k1 - j0 : SEG_TILE);
    float tm = -INFINITY;
    for (int j = 0; j < nt; j++) {
      s[j] = cpu_dot_f32(q, a->k + (j0 + j) * a->k_stride + (int64_t)h * D, D) * a->scale;
      tm = s[j] > tm ? s[j] : tm;
    }
    if (tm > m) {
      const float r = expf(m - tm); /* 0 on the first tile (m = -inf) */
      l *= r;
      for (int i = 0; i < D; i++) acc[i] *= r;
      m = tm;
    }
    for (int j = 0; j < nt; j++) {
      const float pj = expf(s[j] - m);
      l += pj;
      const float *v = a->v + (j0 + j) * a->v_stride + (int64_t)h * D;
      for (int i = 0; i < D; i++) acc[i] += pj * v[i];
    }
  }
  const float inv = 1.0f / l;
  for (int i = 0; i < D; i++) o[i] = acc[i] * inv;
}

static void seg_task(void *p, int ith, int nth) {
  const struct seg_ctx *c = p;
  const ops_seg_attn_args *a = c->a;
  /* Work items are (token, head) pairs in token-major order, split evenly. */
  int64_t lo, hi;
  threadpool_range(a->n * a->n_heads, ith, nth, &lo, &hi);
  if (lo >= hi) return;
  int s = 0;
  const int64_t t_lo = lo / a->n_heads;
  while (s + 1 < a->n_seg && a->seg[s + 1] <= t_lo) s++;
  for (int64_t it = lo; it < hi; it++) {
    const int64_t t = it / a->n_heads;
    const int h = (int)(it % a->n_heads);
    while (a->seg[s + 1] <= t) s++;
    seg_query(a, a->q + t * a->q_stride + (int64_t)h * a->head_dim, h, a->seg[s], a->seg[s + 1],
              c->out + t * (int64_t)a->n_heads * a->head_dim + (int64_t)h * a->head_dim);
  }
}

static void cpu_attention_seg(ops_backend *be, float *out, const ops_seg_attn_args *a) {
  struct seg_ctx c = {out, a};
  threadpool_run(((cpu_impl *)be->impl)->tp, seg_task, &c);
}

/* ---- weighted gather ---- */

struct bag_ctx {
  ops_backend *be;
  float *y;
  const ops_weight *table;
  const int32_t *ids;
  const float *wts;
  int64_t n;
  int k;
};

static void bag_task(void *p, int ith, int nth) {
  const struct bag_ctx *c = p;
  const int64_t cols = c->table->cols;
  /* scratch: the k-term sum, then one converted row (non-f32 tables) */
  float *sum = cpu_scratch(c->be, ith), *row = sum + cols;
  int64_t lo, hi;
  threadpool_range(c->n, ith, nth, &lo, &hi);
  for (int64_t t = lo; t < hi; t++) {
    for (int j = 0; j < c->k; j++) {
      const int64_t id = c->ids[t * c->k + j];
      const float wt = c->wts[t * c->k + j];
      const float *r;
      if (c->table->type == ANNA_DTYPE_F32) {
        r = (const float *)c->table->data + id * cols;
      } else {
        cpu_weight_row_f32(c->table, id, row);
        r = row;
      }
      if (j == 0)
        for (int64_t i = 0; i < cols; i++) sum[i] = wt * r[i];
      else
        for (int64_t i = 0; i < cols; i++) sum[i] += wt * r[i];
    }
    float *y = c->y + t * cols;
    for (int64_t i = 0; i < cols; i++) y[i] += sum[i];
  }
}

static void cpu_embed_bag(ops_backend *be, float *y, const ops_weight *table, const int32_t *ids, const float *wts,
                          int64_t n, int k) {
  struct bag_ctx c = {be, y, table, ids, wts, n, k};
  threadpool_run(((cpu_impl *)be->impl)->tp, bag_task, &c);
}

void cpu_vision_ops_install(ops_backend *be) {
  be->layer_norm = cpu_layer_norm;
  be->gelu = cpu_gelu;
  be->attention_seg = cpu_attention_seg;
  be->embed_bag = cpu_embed_bag;
}
