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

/* Keys per tile of the online softmax, queries per block: a block's queries share each K and V
 * row load (the kernel is bound by those loads, not by arithmetic). */
#define SEG_TILE 64
#define SEG_QB 4

/* Queries [q0, q0 + nq) of head h against keys [k0, k1): online softmax per query (running max
 * m, sum l, unnormalised accumulator acc), rescaled only when a tile raises the max. Dots use 8
 * independent lanes so the compiler vectorises them at whatever ISA the caller is built for. */
static inline __attribute__((always_inline)) void seg_block_body(const ops_seg_attn_args *a, int h, int64_t q0,
                                                                 int nq, int64_t k0, int64_t k1, float *outp) {
  const int D = a->head_dim, D8 = D & ~7;
  float acc[SEG_QB][OPS_SEG_ATTN_MAX_DIM], s[SEG_QB][SEG_TILE], m[SEG_QB], l[SEG_QB];
  const float *q[SEG_QB];
  for (int qi = 0; qi < nq; qi++) {
    q[qi] = a->q + (q0 + qi) * a->q_stride + (int64_t)h * D;
    m[qi] = -INFINITY, l[qi] = 0;
    for (int i = 0; i < D; i++) acc[qi][i] = 0;
  }
  for (int64_t j0 = k0; j0 < k1; j0 += SEG_TILE) {
    const int nt = (int)(k1 - j0 < SEG_TILE ? k1 - j0 : SEG_TILE);
    for (int j = 0; j < nt; j++) {
      const float *kr = a->k + (j0 + j) * a->k_stride + (int64_t)h * D;
      for (int qi = 0; qi < nq; qi++) {
        float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int i = 0; i < D8; i += 8)
          for (int u = 0; u < 8; u++) lane[u] += q[qi][i + u] * kr[i + u];
        float d = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
        for (int i = D8; i < D; i++) d += q[qi][i] * kr[i];
        s[qi][j] = d * a->scale;
      }
    }
    for (int qi = 0; qi < nq; qi++) {
      float tm = -INFINITY;
      for (int j = 0; j < nt; j++) tm = s[qi][j] > tm ? s[qi][j] : tm;
      if (tm > m[qi]) {
        const float r = expf(m[qi] - tm); /* 0 on the first tile (m = -inf) */
        l[qi] *= r;
        for (int i = 0; i < D; i++) acc[qi][i] *= r;
        m[qi] = tm;
      }
      for (int j = 0; j < nt; j++) {
        s[qi][j] = expf(s[qi][j] - m[qi]);
        l[qi] += s[qi][j];
      }
    }
    for (int j = 0; j < nt; j++) {
      const float *vr = a->v + (j0 + j) * a->v_stride + (int64_t)h * D;
      for (int qi = 0; qi < nq; qi++) {
        const float pj = s[qi][j];
        for (int i = 0; i < D; i++) acc[qi][i] += pj * vr[i];
      }
    }
  }
  const int64_t ostride = (int64_t)a->n_heads * D;
  for (int qi = 0; qi < nq; qi++) {
    const float inv = 1.0f / l[qi];
    float *o = outp + (q0 + qi) * ostride + (int64_t)h * D;
    for (int i = 0; i < D; i++) o[i] = acc[qi][i] * inv;
  }
}

/* The same block with AVX2 intrinsics (head_dim a multiple of 8): the compiler does not
 * vectorise the lane loops above on its own. Summation order differs from the generic body
 * (8 lanes then a tree), within float rounding. */
__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

__attribute__((target("avx2,fma"))) static void seg_block_avx2(const ops_seg_attn_args *a, int h, int64_t q0, int nq,
                                                               int64_t k0, int64_t k1, float *outp) {
  const int D = a->head_dim;
  float acc[SEG_QB][OPS_SEG_ATTN_MAX_DIM] __attribute__((aligned(32))), s[SEG_QB][SEG_TILE], m[SEG_QB], l[SEG_QB];
  const float *q[SEG_QB];
  for (int qi = 0; qi < SEG_QB; qi++) {
    /* a short block repeats its last query (computed, not stored) so every loop runs SEG_QB wide */
    q[qi] = a->q + (q0 + (qi < nq ? qi : nq - 1)) * a->q_stride + (int64_t)h * D;
    m[qi] = -INFINITY, l[qi] = 0;
    for (int i = 0; i < D; i++) acc[qi][i] = 0;
  }
  for (int64_t j0 = k0; j0 < k1; j0 += SEG_TILE) {
    const int nt = (int)(k1 - j0 < SEG_TILE ? k1 - j0 : SEG_TILE);
    for (int j = 0; j < nt; j++) {
      const float *kr = a->k + (j0 + j) * a->k_stride + (int64_t)h * D;
      __m256 d0 = _mm256_setzero_ps(), d1 = d0, d2 = d0, d3 = d0;
      for (int i = 0; i < D; i += 8) {
        const __m256 kv = _mm256_loadu_ps(kr + i);
        d0 = _mm256_fmadd_ps(_mm256_loadu_ps(q[0] + i), kv, d0);
        d1 = _mm256_fmadd_ps(_mm256_loadu_ps(q[1] + i), kv, d1);
        d2 = _mm256_fmadd_ps(_mm256_loadu_ps(q[2] + i), kv, d2);
        d3 = _mm256_fmadd_ps(_mm256_loadu_ps(q[3] + i), kv, d3);
      }
      s[0][j] = hsum8(d0) * a->scale, s[1][j] = hsum8(d1) * a->scale;
      s[2][j] = hsum8(d2) * a->scale, s[3][j] = hsum8(d3) * a->scale;
    }
    for (int qi = 0; qi < SEG_QB; qi++) {
      float tm = -INFINITY;
      for (int j = 0; j < nt; j++) tm = s[qi][j] > tm ? s[qi][j] : tm;
      if (tm > m[qi]) {
        const __m256 r = _mm256_set1_ps(expf(m[qi] - tm)); /* 0 on the first tile (m = -inf) */
        l[qi] *= _mm256_cvtss_f32(r);
        for (int i = 0; i < D; i += 8) _mm256_store_ps(acc[qi] + i, _mm256_mul_ps(_mm256_load_ps(acc[qi] + i), r));
        m[qi] = tm;
      }
      for (int j = 0; j < nt; j++) {
        s[qi][j] = expf(s[qi][j] - m[qi]);
        l[qi] += s[qi][j];
      }
    }
    for (int j = 0; j < nt; j++) {
      const float *vr = a->v + (j0 + j) * a->v_stride + (int64_t)h * D;
      const __m256 p0 = _mm256_set1_ps(s[0][j]), p1 = _mm256_set1_ps(s[1][j]), p2 = _mm256_set1_ps(s[2][j]),
                   p3 = _mm256_set1_ps(s[3][j]);
      for (int i = 0; i < D; i += 8) {
        const __m256 vv = _mm256_loadu_ps(vr + i);
        _mm256_store_ps(acc[0] + i, _mm256_fmadd_ps(p0, vv, _mm256_load_ps(acc[0] + i)));
        _mm256_store_ps(acc[1] + i, _mm256_fmadd_ps(p1, vv, _mm256_load_ps(acc[1] + i)));
        _mm256_store_ps(acc[2] + i, _mm256_fmadd_ps(p2, vv, _mm256_load_ps(acc[2] + i)));
        _mm256_store_ps(acc[3] + i, _mm256_fmadd_ps(p3, vv, _mm256_load_ps(acc[3] + i)));
      }
    }
  }
  const int64_t ostride = (int64_t)a->n_heads * D;
  for (int qi = 0; qi < nq; qi++) {
    const float inv = 1.0f / l[qi];
    float *o = outp + (q0 + qi) * ostride + (int64_t)h * D;
    for (int i = 0; i < D; i++) o[i] = acc[qi][i] * inv;
  }
}

static void seg_block_generic(const ops_seg_attn_args *a, int h, int64_t q0, int nq, int64_t k0, int64_t k1,
                              float *out) {
  seg_block_body(a, h, q0, nq, k0, k1, out);
}

struct seg_ctx {
  float *out;
  const ops_seg_attn_args *a;
  int64_t n_items;
  int isa;
};

static void seg_task(void *p, int ith, int nth) {
  const struct seg_ctx *c = p;
  const ops_seg_attn_args *a = c->a;
  /* Items: (segment, query block, head), segments in order; an even split of the items. */
  int64_t lo, hi;
  threadpool_range(c->n_items, ith, nth, &lo, &hi);
  int64_t base = 0; /* items before segment sg */
  for (int sg = 0; sg < a->n_seg && lo < hi; sg++) {
    const int64_t s0 = a->seg[sg], s1 = a->seg[sg + 1];
    const int64_t nb = (s1 - s0 + SEG_QB - 1) / SEG_QB, items = nb * a->n_heads;
    for (int64_t it = lo; it < hi && it < base + items; it++) {
      const int64_t local = it - base, blk = local / a->n_heads;
      const int h = (int)(local % a->n_heads);
      const int64_t q0 = s0 + blk * SEG_QB;
      const int nq = (int)(s1 - q0 < SEG_QB ? s1 - q0 : SEG_QB);
      if (c->isa >= 1 && a->head_dim % 8 == 0) seg_block_avx2(a, h, q0, nq, s0, s1, c->out);
      else seg_block_generic(a, h, q0, nq, s0, s1, c->out);
      lo = it + 1;
    }
    base += items;
  }
}

static void cpu_attention_seg(ops_backend *be, float *out, const ops_seg_attn_args *a) {
  int64_t items = 0;
  for (int sg = 0; sg < a->n_seg; sg++) items += (a->seg[sg + 1] - a->seg[sg] + SEG_QB - 1) / SEG_QB * a->n_heads;
  struct seg_ctx c = {out, a, items, cpu_isa_level()};
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
