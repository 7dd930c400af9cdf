/* cpu_backend.c: the CPU op table, and the ops that are not matmul or GDN. */
#include "backends/cpu/cpu_internal.h"

#include "base/error.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

/* ---- norms and elementwise ---- */

static void cpu_rmsnorm(ops_backend *be, float *y, const float *x, const float *w, int64_t rows, int d,
                        float eps, int one_plus) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * d;
    float *yr = y + r * d;
    double ss = 0; /* double: the mean of squares of a 4096-wide row loses bits in f32 */
    for (int i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
    const float inv = 1.0f / sqrtf((float)(ss / d) + eps);
    if (!w)
      for (int i = 0; i < d; i++) yr[i] = xr[i] * inv;
    else if (one_plus)
      for (int i = 0; i < d; i++) yr[i] = xr[i] * inv * (1.0f + w[i]);
    else
      for (int i = 0; i < d; i++) yr[i] = xr[i] * inv * w[i];
  }
}

static void cpu_l2norm(ops_backend *be, float *x, int64_t rows, int d, float eps, float scale) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) {
    float *xr = x + r * d;
    double ss = 0;
    for (int i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
    const float inv = scale / sqrtf((float)ss + eps);
    for (int i = 0; i < d; i++) xr[i] *= inv;
  }
}

static inline float silu(float x) {
  return x / (1.0f + expf(-x));
}

static inline float gelu_tanh(float x) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

static void cpu_rmsnorm_gated(ops_backend *be, float *y, const float *x, const float *z, const float *w,
                              int64_t rows, int d, float eps) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * d, *zr = z + r * d;
    float *yr = y + r * d;
    double ss = 0;
    for (int i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
    const float inv = 1.0f / sqrtf((float)(ss / d) + eps);
    for (int i = 0; i < d; i++) yr[i] = w[i] * (xr[i] * inv) * silu(zr[i]);
  }
}

static void cpu_act_mul(ops_backend *be, float *y, const float *gate, const float *up, int64_t n, int d,
                        int64_t gs, int64_t us, int act) {
  (void)be;
  for (int64_t t = 0; t < n; t++) {
    const float *g = gate + t * gs, *u = up + t * us;
    float *o = y + t * d;
    if (act == ACT_KIND_GELU_TANH)
      for (int i = 0; i < d; i++) o[i] = gelu_tanh(g[i]) * u[i];
    else
      for (int i = 0; i < d; i++) o[i] = silu(g[i]) * u[i];
  }
}

static void cpu_add(ops_backend *be, float *y, const float *x, int64_t n) {
  (void)be;
  for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_scale(ops_backend *be, float *y, float s, int64_t n) {
  (void)be;
  for (int64_t i = 0; i < n; i++) y[i] *= s;
}

static void cpu_mul_sigmoid(ops_backend *be, float *y, const float *g, int64_t rows, int d, int64_t gs,
                            int bcast) {
  (void)be;
  for (int64_t r = 0; r < rows; r++)
    for (int i = 0; i < d; i++) y[r * d + i] *= 1.0f / (1.0f + expf(-g[r * gs + (bcast ? 0 : i)]));
}

static void cpu_copy_rows(ops_backend *be, float *dst, int64_t ds, const float *src, int64_t ss, int64_t rows,
                          int d) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) memcpy(dst + r * ds, src + r * ss, (size_t)d * sizeof(float));
}

static void cpu_scatter_rows(ops_backend *be, float *const *dst, const float *src, int64_t rows, int d) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) memcpy(dst[r], src + r * d, (size_t)d * sizeof(float));
}

static void cpu_softcap(ops_backend *be, float *y, int64_t n, float cap) {
  (void)be;
  for (int64_t i = 0; i < n; i++) y[i] = cap * tanhf(y[i] / cap);
}

/* ---- rope ---- */

static void cpu_rope(ops_backend *be, float *x, int64_t n, int n_heads, int head_dim, int64_t stride, int rot,
                     const float *inv_freq, const int32_t *pos, int interleaved) {
  (void)be;
  const int half = rot / 2;
  const int step = interleaved ? 2 : 1, off = interleaved ? 1 : half;
  for (int64_t t = 0; t < n; t++) {
    for (int i = 0; i < half; i++) {
      /* Angle in f32 as transformers computes it (inv_freq @ position in float). */
      const float ang = (float)pos[t] * inv_freq[i];
      const float c = cosf(ang), s = sinf(ang);
      for (int h = 0; h < n_heads; h++) {
        float *v = x + t * stride + (int64_t)h * head_dim;
        const float a = v[i * step], b = v[i * step + off];
        v[i * step] = a * c - b * s;
        v[i * step + off] = b * c + a * s;
      }
    }
  }
}

/* ---- GDN helpers ---- */

static void cpu_conv1d_silu(ops_backend *be, float *y, const float *x, int64_t n, int ch, const float *w, int kw,
                            float *state) {
  (void)be;
  const int ns = kw - 1;
  for (int c = 0; c < ch; c++) {
    const float *wc = w + (int64_t)c * kw;
    float *st = state + (int64_t)c * ns;
    for (int64_t t = 0; t < n; t++) {
      /* window = [state..., x_0..x_t] last kw inputs */
      float s = 0;
      for (int j = 0; j < kw; j++) {
        int64_t src = t - (kw - 1) + j; /* index into x; negative -> state */
        float v = src >= 0 ? x[src * ch + c] : st[ns + src];
        s += wc[j] * v;
      }
      y[t * ch + c] = silu(s);
    }
    /* New state: the last ns inputs (from state and x). */
    if (n >= ns) {
      for (int j = 0; j < ns; j++) st[j] = x[(n - ns + j) * ch + c];
    } else {
      int keep = ns - (int)n;
      for (int j = 0; j < keep; j++) st[j] = st[j + n];
      for (int64_t j = 0; j < n; j++) st[keep + j] = x[j * ch + c];
    }
  }
}

static inline float softplus(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}

static void cpu_gdn_gates(ops_backend *be, float *beta, float *g, const float *b, int64_t bs, const float *a,
                          int64_t as, const float *a_log, const float *dt_bias, int64_t n, int h) {
  (void)be;
  for (int64_t t = 0; t < n; t++)
    for (int i = 0; i < h; i++) {
      beta[t * h + i] = 1.0f / (1.0f + expf(-b[t * bs + i]));
      g[t * h + i] = -expf(a_log[i]) * softplus(a[t * as + i] + dt_bias[i]);
    }
}

/* ---- MoE ---- */

/* ---- fused ops: the reference is the composition of the ops above, so the fused path
 * computes bit for bit what the unfused sequence does (the fixtures rely on it) ---- */

static void cpu_gdn_step(ops_backend *be, const ops_gdn_step_args *a) {
  if (a->n_runs > 0) { /* batched: one single-run call per run, in order (hence bit for bit the same) */
    const int64_t Vd = (int64_t)a->hv * a->dv, cd = 2 * (int64_t)a->hk * a->dk + Vd;
    for (int i = 0; i < a->n_runs; i++) {
      const ops_gdn_step_run *u = &a->runs[i];
      ops_gdn_step_args r = *a;
      r.n_runs = 0;
      r.runs = NULL;
      r.n = u->n;
      r.conv_state = u->conv_state;
      r.state = u->state;
      r.qkv = a->qkv + u->start * cd;
      r.z = a->z + u->start * Vd;
      r.b = a->b + u->start * a->hv;
      r.a = a->a + u->start * a->hv;
      r.y = a->y + u->start * Vd;
      cpu_gdn_step(be, &r);
    }
    return;
  }
  const int64_t n = a->n, Kd = (int64_t)a->hk * a->dk, Vd = (int64_t)a->hv * a->dv, cd = 2 * Kd + Vd;
  if (n <= 0) return;
  float *conv = a->work, *beta = conv + n * cd, *g = beta + n * a->hv;
  cpu_conv1d_silu(be, conv, a->qkv, n, (int)cd, a->conv_w, a->kw, a->conv_state);
  /* q, k and v stay in the conv rows: per token they are contiguous [hk, dk] / [hv, dv]. */
  for (int64_t t = 0; t < n; t++) {
    cpu_l2norm(be, conv + t * cd, a->hk, a->dk, 1e-6f, 1.0f / sqrtf((float)a->dk));
    cpu_l2norm(be, conv + t * cd + Kd, a->hk, a->dk, 1e-6f, 1.0f);
  }
  cpu_gdn_gates(be, beta, g, a->b, a->hv, a->a, a->hv, a->a_log, a->dt_bias, n, a->hv);
  for (int64_t t = 0; t < n; t++) { /* one token per call: the same per-token arithmetic */
    const ops_gdn_args r = {
        .n = 1, .hk = a->hk, .hv = a->hv, .dk = a->dk, .dv = a->dv, .v_tiled = a->v_tiled,
        .q = conv + t * cd, .k = conv + t * cd + Kd, .v = conv + t * cd + 2 * Kd,
        .g = g + t * a->hv, .beta = beta + t * a->hv, .state = a->state, .out = a->y + t * Vd,
    };
    cpu_gdn_recurrent(be, &r);
  }
  cpu_rmsnorm_gated(be, a->y, a->y, a->z, a->norm_w, n * a->hv, a->dv, a->eps); /* row-wise: in place is safe */
}

static void cpu_norm_rope(ops_backend *be, float *y, const float *x, int64_t n, int n_heads, int head_dim,
                          int64_t x_stride, int64_t x_head_stride, const float *w, float eps, int one_plus, int rot,
                          const float *inv_freq, const int32_t *pos, int interleaved) {
  const int64_t row = (int64_t)n_heads * head_dim;
  if (y != x)
    for (int64_t t = 0; t < n; t++)
      cpu_copy_rows(be, y + t * row, head_dim, x + t * x_stride, x_head_stride, n_heads, head_dim);
  cpu_rmsnorm(be, y, y, w, n * n_heads, head_dim, eps, one_plus);
  cpu_rope(be, y, n, n_heads, head_dim, row, rot, inv_freq, pos, interleaved);
}

static void cpu_add_rmsnorm(ops_backend *be, float *x, const float *r, float *y, const float *w, int64_t rows, int d,
                            float eps, int one_plus) {
  cpu_add(be, x, r, rows * d);
  cpu_rmsnorm(be, y, x, w, rows, d, eps, one_plus);
}

/* ---- sampling candidates (ops.h topk) ---- */

/* (value, index) a before b: larger value, then smaller index (a strict total order). */
static inline int topk_before(float av, int32_t ai, float bv, int32_t bi) {
  return av > bv || (av == bv && ai < bi);
}

/* ops_argmax_f32 with -0 reported as +0 (topk's value convention). */
static int64_t topk_argmax(const float *x, int64_t n, float *best) {
  const int64_t i = ops_argmax_f32(x, n, best);
  if (*best == 0.0f) *best = 0.0f;
  return i;
}

/* The reference: per row a min-heap of the k best seen (root = the worst of them) in one
 * pass, then an insertion sort of those k (k = 1: the vectorisable argmax); the softmax
 * denominator exactly as the sampler sums it (vocabulary order, double accumulation of
 * ops_exp_nonpos), only when temp > 0. */
static void cpu_topk(ops_backend *be, int32_t *idx, float *val, double *stats, const float *logits, int64_t rows,
                     int64_t vocab, int k, float temp) {
  (void)be;
  const float inv_t = temp > 0 ? 1.0f / temp : 0.0f;
  for (int64_t r = 0; r < rows; r++) {
    const float *l = logits + r * vocab;
    int32_t *hi = idx + r * k;
    float *hv = val + r * k;
    int m = 0;
    float mx = -INFINITY;
    if (k == 1) {
      hi[0] = (int32_t)topk_argmax(l, vocab, &hv[0]);
      mx = hv[0];
      if (!(mx > -INFINITY)) hi[0] = 0, hv[0] = mx = -INFINITY; /* every entry -inf or NaN: all tie, the first */
    }
    for (int64_t t = 0; t < vocab && k > 1; t++) {
      float x = l[t];
      if (isnan(x)) x = -INFINITY;
      if (x == 0.0f) x = 0.0f; /* -0 ranks as +0 */
      mx = x > mx ? x : mx;
      int i;
      if (m < k) { /* sift up */
        i = m++;
        while (i > 0 && topk_before(hv[(i - 1) / 2], hi[(i - 1) / 2], x, (int32_t)t)) {
          hv[i] = hv[(i - 1) / 2], hi[i] = hi[(i - 1) / 2];
          i = (i - 1) / 2;
        }
        hv[i] = x, hi[i] = (int32_t)t;
        continue;
      }
      if (!topk_before(x, (int32_t)t, hv[0], hi[0])) continue;
      i = 0; /* replace the root, sift down */
      for (;;) {
        int w = 2 * i + 1;
        if (w >= m) break;
        if (w + 1 < m && topk_before(hv[w], hi[w], hv[w + 1], hi[w + 1])) w++;
        if (!topk_before(x, (int32_t)t, hv[w], hi[w])) break;
        hv[i] = hv[w], hi[i] = hi[w];
        i = w;
      }
      hv[i] = x, hi[i] = (int32_t)t;
    }
    /* heapsort, best first: the root (the worst of the heap) goes to the end, the heap shrinks
     * (k log k; an insertion sort of k = 256 took 37 us of a 1000-token row's 40) */
    for (int n = m - 1; n > 0; n--) {
      const float v = hv[n];
      const int32_t id = hi[n];
      hv[n] = hv[0], hi[n] = hi[0];
      int i = 0; /* sift (v, id) down from the root of heap [0, n) */
      for (;;) {
        int w = 2 * i + 1;
        if (w >= n) break;
        if (w + 1 < n && topk_before(hv[w], hi[w], hv[w + 1], hi[w + 1])) w++;
        if (!topk_before(v, id, hv[w], hi[w])) break;
        hv[i] = hv[w], hi[i] = hi[w];
        i = w;
      }
      hv[i] = v, hi[i] = id;
    }
    const float mt = mx * inv_t;
    double z = 0;
    if (inv_t > 0)
      for (int64_t t = 0; t < vocab; t++) z += ops_exp_nonpos(l[t] * inv_t - mt);
    stats[2 * r] = mx;
    stats[2 * r + 1] = z;
  }
}

/* The sampler's tail (ops.h sample_tail) in anna_sampler_sample's own arithmetic and order:
 * the same q_t, added to sum and subtracted from u one by one in vocabulary order. The head
 * ids are skipped by walking a sorted copy of them (on the stack: no allocation) beside t. */
static int cpu_tail_cmp(const void *a, const void *b) {
  const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

_Static_assert(sizeof(((ops_tail_req *)0)->head) == OPS_TOPK_MAX * sizeof(int32_t), "ops_tail_req.head");

static void cpu_sample_tail(ops_backend *be, ops_tail_out *out, const float *logits, int64_t vocab,
                            const ops_tail_req *req, int n) {
  (void)be;
  for (int r = 0; r < n; r++) {
    const ops_tail_req *q = &req[r];
    const float *l = logits + q->row * vocab;
    const float inv_t = q->inv_t, mx = q->mx, floor = q->floor;
    const double z = q->z;
    const int nh = q->nh < 0 ? 0 : q->nh > OPS_TOPK_MAX ? OPS_TOPK_MAX : q->nh;
    int32_t h[OPS_TOPK_MAX];
    memcpy(h, q->head, sizeof(int32_t) * (size_t)nh);
    qsort(h, (size_t)nh, sizeof *h, cpu_tail_cmp);
    int hn = 0; /* the next head id at or after t */
    int32_t tok = -1;
    double sum = q->sum, u = q->u;
    const int walk = u > 0;
    for (int64_t t = 0; t < vocab; t++) {
      while (hn < nh && h[hn] < t) hn++;
      if (hn < nh && h[hn] == t) continue;
      const float p = (float)(ops_exp_nonpos(l[t] * inv_t - mx) / z);
      if (!(p > 0.0f && p >= floor)) continue;
      if (!walk) {
        sum += p;
        continue;
      }
      tok = (int32_t)t;
      u -= p;
      if (u <= 0) break; /* the walk stops at its token (out->sum is the sum mode's only) */
    }
    out[r].sum = sum;
    out[r].tok = walk ? tok : -1;
    out[r].pad_ = 0;
  }
}

/* ops.h mask_rows: -inf where a row's rejection bitset has its bit. */
static void cpu_mask_rows(ops_backend *be, float *logits, int64_t vocab, const int32_t *rows, const uint64_t *bits,
                          int64_t n) {
  (void)be;
  const int64_t words = (vocab + 63) / 64;
  for (int64_t i = 0; i < n; i++) {
    float *l = logits + (int64_t)rows[i] * vocab;
    const uint64_t *b = bits + i * words;
    for (int64_t w = 0; w < words; w++) {
      uint64_t m = b[w];
      while (m) {
        const int64_t t = w * 64 + __builtin_ctzll(m);
        m &= m - 1;
        if (t < vocab) l[t] = -INFINITY;
      }
    }
  }
}

static void cpu_moe_route(ops_backend *be, int32_t *idx, float *wts, const float *logits, int64_t n, int E, int k,
                          int renorm, const float *per_expert) {
  (void)be;
  for (int64_t t = 0; t < n; t++) {
    const float *l = logits + t * E;
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    double sum = 0;
    for (int e = 0; e < E; e++) sum += exp((double)l[e] - mx);
    int32_t *ti = idx + t * k;
    float *tw = wts + t * k;
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        int used = 0;
        for (int q = 0; q < j; q++) used |= ti[q] == e;
        if (!used && (best < 0 || l[e] > l[best])) best = e;
      }
      ti[j] = best;
      tw[j] = (float)(exp((double)l[best] - mx) / sum);
    }
    if (renorm) {
      float s = 0;
      for (int j = 0; j < k; j++) s += tw[j];
      for (int j = 0; j < k; j++) tw[j] /= s;
    }
    if (per_expert)
      for (int j = 0; j < k; j++) tw[j] *= per_expert[ti[j]];
  }
}

/* Groups the (token, slot) pairs by expert, runs each expert's FFN on its gathered rows,
 * and scatters back weighted. Only the selected experts' weights are read. */
/* The reference: act_mul into h, then matmul. */
static void cpu_act_matmul(ops_backend *be, float *y, float *h, const float *gate, const float *up, int64_t n, int64_t gs,
                    int64_t us, int act, const ops_weight *w) {
  cpu_act_mul(be, h, gate, up, n, (int)w->cols, gs, us, act);
  cpu_matmul(be, y, h, n, w, NULL);
}

static void cpu_moe_ffn(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                        const float *wts, int k, int n_experts, const ops_weight *gate, const ops_weight *up,
                        const ops_weight *down, int act, float *scratch) {
  (void)n_experts; /* ids come from moe_route: always < n_experts */
  const int64_t I = up ? up[0].rows : gate[0].rows / 2;
  const int64_t nk = n * k;
  float *xs = scratch;              /* [nk, H] gathered inputs */
  float *gu = xs + nk * H;          /* [nk, 2I] gate|up */
  float *hbuf = gu + nk * 2 * I;    /* [nk, I] */
  float *ys = hbuf + nk * I;        /* [nk, H] */
  int32_t *order = (int32_t *)(ys + nk * H); /* [nk] pair ids sorted by expert */
  int64_t cnt = 0;
  memset(out, 0, (size_t)(n * H) * sizeof(float));
  /* Expert ids are bounded by the router's E; find the max to loop experts in order. */
  int32_t emax = -1;
  for (int64_t i = 0; i < nk; i++) emax = idx[i] > emax ? idx[i] : emax;
  for (int32_t e = 0; e <= emax; e++) {
    int64_t start = cnt;
    for (int64_t i = 0; i < nk; i++)
      if (idx[i] == e) order[cnt++] = (int32_t)i;
    int64_t m = cnt - start;
    if (!m) continue;
    for (int64_t r = 0; r < m; r++) memcpy(xs + r * H, x + (order[start + r] / k) * H, (size_t)H * sizeof(float));
    if (up) {
      cpu_matmul(be, gu, xs, m, &gate[e], NULL);
      cpu_matmul(be, gu + m * I, xs, m, &up[e], NULL);
      cpu_act_mul(be, hbuf, gu, gu + m * I, m, (int)I, I, I, act);
    } else {
      cpu_matmul(be, gu, xs, m, &gate[e], NULL); /* [m, 2I]: gate rows then up rows */
      cpu_act_mul(be, hbuf, gu, gu + I, m, (int)I, 2 * I, 2 * I, act);
    }
    cpu_matmul(be, ys, hbuf, m, &down[e], NULL);
    for (int64_t r = 0; r < m; r++) {
      int32_t pair = order[start + r];
      float w = wts[pair];
      float *o = out + (pair / k) * H;
      for (int j = 0; j < H; j++) o[j] += w * ys[r * H + j];
    }
  }
}

/* ---- memory: plain host memory ---- */

static void *cpu_alloc(ops_backend *be, size_t bytes) {
  (void)be;
  return calloc(1, bytes ? bytes : 1);
}

static void cpu_free(ops_backend *be, void *p) {
  (void)be;
  free(p);
}

static void cpu_memset0(ops_backend *be, void *p, size_t bytes) {
  (void)be;
  memset(p, 0, bytes);
}

static void cpu_copy(ops_backend *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  if (dst != src) memcpy(dst, src, bytes);
}

/* ---- table ---- */

int cpu_backend_create(ops_backend **out, threadpool *tp, int64_t scratch_floats_per_thread, size_t act_bytes,
                       char *err, size_t errlen) {
  *out = NULL;
  ops_backend *be = calloc(1, sizeof *be);
  cpu_impl *c = calloc(1, sizeof *c);
  int nth = threadpool_size(tp);
  float *scratch = NULL;
  if (be && c && scratch_floats_per_thread > 0)
    scratch = aligned_alloc(64, (((size_t)nth * (size_t)scratch_floats_per_thread * sizeof(float)) + 63) & ~(size_t)63);
  void *act = c ? aligned_alloc(64, (act_bytes + 64) & ~(size_t)63) : NULL;
  if (!be || !c || !scratch || !act) {
    free(act);
    free(be);
    free(c);
    free(scratch);
    return anna_err(err, errlen, ANNA_ENOMEM, "cpu backend: cannot allocate %lld scratch floats per thread",
                    (long long)scratch_floats_per_thread);
  }
  c->tp = tp;
  c->scratch = scratch;
  c->scratch_per_thread = scratch_floats_per_thread;
  c->act = act;
  c->act_bytes = act_bytes;
  *be = (ops_backend){
      .name = "cpu",
      .impl = c,
      .alloc = cpu_alloc,
      .free = cpu_free,
      .memset0 = cpu_memset0,
      .upload = cpu_copy,
      .download = cpu_copy,
      .matmul = cpu_matmul,
      .matmul_group = cpu_matmul_group,
      .act_matmul = cpu_act_matmul,
      .embed = cpu_embed,
      .rmsnorm = cpu_rmsnorm,
      .rope = cpu_rope,
      .attention = cpu_attention,
      .act_mul = cpu_act_mul,
      .conv1d_silu = cpu_conv1d_silu,
      .gdn_chunked = cpu_gdn_chunked,
      .gdn_recurrent = cpu_gdn_recurrent,
      .gdn_gates = cpu_gdn_gates,
      .l2norm = cpu_l2norm,
      .rmsnorm_gated = cpu_rmsnorm_gated,
      .gdn_step = cpu_gdn_step,
      .add_rmsnorm = cpu_add_rmsnorm,
      .norm_rope = cpu_norm_rope,
      .add = cpu_add,
      .scale = cpu_scale,
      .mul_sigmoid = cpu_mul_sigmoid,
      .copy_rows = cpu_copy_rows,
      .softcap = cpu_softcap,
      .scatter_rows = cpu_scatter_rows,
      .kv_store = cpu_kv_store,
      .copy = cpu_copy,
      .moe_ffn = cpu_moe_ffn,
      .moe_route = cpu_moe_route,
      .topk = cpu_topk,
      .sample_tail = cpu_sample_tail,
      .mask_rows = cpu_mask_rows,
      .destroy = cpu_backend_free,
      .kv_types = 0, /* every ops_kv_type (cpu_kv.c) */
      .residual_ring = 1,
  };
  cpu_vision_ops_install(be);
  cpu_conv_fill(be); /* waveform decoder ops (cpu_conv.c) */
  cpu_audio_ops_install(be);
  *out = be;
  return 0;
}


static int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

int64_t cpu_backend_scratch_floats(const ops_model_shape *sh) {
  int64_t s = max64(cpu_matmul_scratch_floats(sh->max_cols), 1024);
  /* chunked GDN: gam, A, P, U, W, Qs, KsT, O for a 64-token chunk */
  s = max64(s, 64 + 2 * 64 * 64 + 64 * (int64_t)(3 * sh->gdn_dk + 2 * sh->gdn_dv) + 64);
  for (int i = 0; i < sh->n_layers; i++)
    s = max64(s, cpu_attention_scratch_floats(sh->n_heads, sh->layers[i].n_kv_heads, sh->layers[i].head_dim));
  return s + 64;
}

int cpu_backend_create_params(const backend_params *p, ops_backend **out, char *err, size_t errlen) {
  *out = NULL;
  threadpool *own = NULL, *tp = p->tp;
  int rc;
  if (!tp && (rc = threadpool_create(&own, p->n_threads, err, errlen))) return rc;
  if (!tp) tp = own;
  /* room for the quantized activations of n_batch (+ a tile's slack) rows of the widest weight */
  const size_t act_bytes = ((size_t)p->n_batch + 32) * (size_t)p->shape->max_cols * 4;
  if ((rc = cpu_backend_create(out, tp, cpu_backend_scratch_floats(p->shape), act_bytes, err, errlen))) {
    threadpool_free(own);
    return rc;
  }
  ((cpu_impl *)(*out)->impl)->own_tp = own;
  cpu_backend_set_exact_matmul(*out, p->exact_matmul);
  return 0;
}

void cpu_backend_free(ops_backend *be) {
  if (!be) return;
  cpu_impl *c = be->impl;
  if (c) {
    free(c->scratch);
    free(c->act);
    threadpool_free(c->own_tp);
  }
  free(c);
  free(be);
}
