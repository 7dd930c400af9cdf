/* ops_profile.c: timing shims over an op table (see ops_profile.h). */
#include "ops/ops_profile.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct prof {
  ops_backend be;    /* must stay first: the ops receive &prof->be */
  ops_backend inner; /* copy of the wrapped table (same impl) */
  int64_t lm_rows;
  double t[OPS_FAMILY_COUNT];
} prof;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define P(be) ((prof *)(be))
/* Device backends: sync before (earlier untimed work is not charged to this op) and after. */
#define TIMED(fam, call)                                                                                               \
  do {                                                                                                                 \
    if (P(be)->inner.sync) P(be)->inner.sync(be);                                                                      \
    const double t0_ = now();                                                                                          \
    call;                                                                                                              \
    if (P(be)->inner.sync) P(be)->inner.sync(be);                                                                      \
    P(be)->t[fam] += now() - t0_;                                                                                      \
  } while (0)

static void p_matmul(ops_backend *be, float *y, const float *x, int64_t n, const ops_weight *w, const float *bias) {
  TIMED(w->rows == P(be)->lm_rows ? OPS_FAMILY_LM_HEAD : OPS_FAMILY_MATMUL, P(be)->inner.matmul(be, y, x, n, w, bias));
}
static void p_act_matmul(ops_backend *be, float *y, float *h, const float *gate, const float *up, int64_t n,
                         int64_t gs, int64_t us, int act, const ops_weight *w) {
  TIMED(OPS_FAMILY_MATMUL, P(be)->inner.act_matmul(be, y, h, gate, up, n, gs, us, act, w));
}
static void p_act_matmul_gated_add(ops_backend *be, float *y, float *tmp, float *h, const float *gate, const float *up,
                                   int64_t n, int64_t gs, int64_t us, int act, const float *g, int64_t g_stride,
                                   const ops_weight *w) {
  TIMED(OPS_FAMILY_MATMUL, P(be)->inner.act_matmul_gated_add(be, y, tmp, h, gate, up, n, gs, us, act, g, g_stride, w));
}
static void p_matmul_group(ops_backend *be, int count, float *const *ys, const float *x, int64_t n,
                           const ops_weight *const *ws, const float *const *biases) {
  TIMED(OPS_FAMILY_MATMUL, P(be)->inner.matmul_group(be, count, ys, x, n, ws, biases));
}
static void p_matmul_group_route(ops_backend *be, int count, float *const *ys, const float *x, int64_t n,
                                 const ops_weight *const *ws, const float *const *biases, int route, int32_t *idx,
                                 float *wts, int k, int renorm, const float *per_expert, int shared) {
  TIMED(OPS_FAMILY_MATMUL, P(be)->inner.matmul_group_route(be, count, ys, x, n, ws, biases, route, idx, wts, k, renorm,
                                                           per_expert, shared));
}
static void p_attention(ops_backend *be, float *out, const float *q, const ops_attn_args *a) {
  TIMED(OPS_FAMILY_ATTENTION, P(be)->inner.attention(be, out, q, a));
}
static void p_rope(ops_backend *be, float *x, int64_t n, int h, int d, int64_t s, int rot, const float *f,
                   const int32_t *pos, int il) {
  TIMED(OPS_FAMILY_ATTENTION, P(be)->inner.rope(be, x, n, h, d, s, rot, f, pos, il));
}
static void p_scatter(ops_backend *be, float *const *dst, const float *src, int64_t rows, int d) {
  TIMED(OPS_FAMILY_ATTENTION, P(be)->inner.scatter_rows(be, dst, src, rows, d));
}
static void p_kv_store(ops_backend *be, void *const *dst, const float *src, int64_t rows, int nh, int hd, int t) {
  TIMED(OPS_FAMILY_ATTENTION, P(be)->inner.kv_store(be, dst, src, rows, nh, hd, t));
}
static void p_conv(ops_backend *be, float *y, const float *x, int64_t n, int ch, const float *w, int kw, float *st) {
  TIMED(OPS_FAMILY_GDN, P(be)->inner.conv1d_silu(be, y, x, n, ch, w, kw, st));
}
static void p_gdn_chunked(ops_backend *be, const ops_gdn_args *a) {
  TIMED(OPS_FAMILY_GDN, P(be)->inner.gdn_chunked(be, a));
}
static void p_gdn_recurrent(ops_backend *be, const ops_gdn_args *a) {
  TIMED(OPS_FAMILY_GDN, P(be)->inner.gdn_recurrent(be, a));
}
static void p_gdn_gates(ops_backend *be, float *beta, float *g, const float *b, int64_t bs, const float *a, int64_t as,
                        const float *al, const float *dt, int64_t n, int h) {
  TIMED(OPS_FAMILY_GDN, P(be)->inner.gdn_gates(be, beta, g, b, bs, a, as, al, dt, n, h));
}
static void p_gdn_step(ops_backend *be, const ops_gdn_step_args *a) {
  TIMED(OPS_FAMILY_GDN, P(be)->inner.gdn_step(be, a));
}
static void p_add_rmsnorm(ops_backend *be, float *x, const float *r, float *y, const float *w, int64_t rows, int d,
                          float eps, int op) {
  TIMED(OPS_FAMILY_OTHER, P(be)->inner.add_rmsnorm(be, x, r, y, w, rows, d, eps, op));
}
static void p_norm_rope(ops_backend *be, float *y, const float *x, int64_t n, int h, int d, int64_t xs, int64_t xhs,
                        const float *w, float eps, int op, int rot, const float *f, const int32_t *pos, int il) {
  TIMED(OPS_FAMILY_ATTENTION, P(be)->inner.norm_rope(be, y, x, n, h, d, xs, xhs, w, eps, op, rot, f, pos, il));
}
static void p_moe_ffn(ops_backend *be, float *out, const float *x, int64_t n, int hidden, const int32_t *idx,
                      const float *wts, int k, int ne, const ops_weight *gate, const ops_weight *up,
                      const ops_weight *down, int act, float *scratch) {
  TIMED(OPS_FAMILY_MOE, P(be)->inner.moe_ffn(be, out, x, n, hidden, idx, wts, k, ne, gate, up, down, act, scratch));
}
static void p_moe_route(ops_backend *be, int32_t *idx, float *wts, const float *logits, int64_t n, int e, int k,
                        int renorm, const float *per) {
  TIMED(OPS_FAMILY_MOE, P(be)->inner.moe_route(be, idx, wts, logits, n, e, k, renorm, per));
}
static void p_topk(ops_backend *be, int32_t *idx, float *val, double *st, const float *l, int64_t rows, int64_t v, int k,
                   float temp) {
  TIMED(OPS_FAMILY_OTHER, P(be)->inner.topk(be, idx, val, st, l, rows, v, k, temp));
}
static void p_rmsnorm(ops_backend *be, float *y, const float *x, const float *w, int64_t rows, int d, float eps, int op) {
  TIMED(OPS_FAMILY_OTHER, P(be)->inner.rmsnorm(be, y, x, w, rows, d, eps, op));
}
static void p_act_mul(ops_backend *be, float *y, const float *g, const float *u, int64_t n, int d, int64_t gs, int64_t us,
                      int act) {
  TIMED(OPS_FAMILY_OTHER, P(be)->inner.act_mul(be, y, g, u, n, d, gs, us, act));
}

static void p_embed(ops_backend *be, float *out, const ops_weight *t, const int32_t *ids, int64_t n, float sc) {
  TIMED(OPS_FAMILY_OTHER, P(be)->inner.embed(be, out, t, ids, n, sc));
}
static void p_l2norm(ops_backend *be, float *x, int64_t rows, int d, float eps, float sc) {
  TIMED(OPS_FAMILY_GDN, P(be)->inner.l2norm(be, x, rows, d, eps, sc));
}
static void p_rmsnorm_gated(ops_backend *be, float *y, const float *x, const float *z, const float *w, int64_t rows,
                            int d, float eps) {
  TIMED(OPS_FAMILY_GDN, P(be)->inner.rmsnorm_gated(be, y, x, z, w, rows, d, eps));
}
static void p_add(ops_backend *be, float *y, const float *x, int64_t n) {
  TIMED(OPS_FAMILY_OTHER, P(be)->inner.add(be, y, x, n));
}
static void p_scale(ops_backend *be, float *y, float s, int64_t n) {
  TIMED(OPS_FAMILY_OTHER, P(be)->inner.scale(be, y, s, n));
}
static void p_mul_sigmoid(ops_backend *be, float *y, const float *g, int64_t rows, int d, int64_t gs, int gb) {
  TIMED(OPS_FAMILY_OTHER, P(be)->inner.mul_sigmoid(be, y, g, rows, d, gs, gb));
}
static void p_copy_rows(ops_backend *be, float *dst, int64_t ds, const float *src, int64_t ss, int64_t rows, int d) {
  TIMED(OPS_FAMILY_OTHER, P(be)->inner.copy_rows(be, dst, ds, src, ss, rows, d));
}
static void p_softcap(ops_backend *be, float *y, int64_t n, float cap) {
  TIMED(OPS_FAMILY_LM_HEAD, P(be)->inner.softcap(be, y, n, cap));
}

const char *ops_family_name(int f) {
  static const char *names[] = {"matmul", "lm_head", "attention", "gdn", "moe", "other"};
  return f >= 0 && f < OPS_FAMILY_COUNT ? names[f] : "?";
}

ops_backend *ops_profile_wrap(ops_backend *inner, int64_t lm_rows) {
  prof *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->inner = *inner;
  p->be = *inner; /* every entry not overridden forwards as is (same impl) */
  p->lm_rows = lm_rows;
#define WRAP(field, fn)                                                                                                \
  if (inner->field) p->be.field = fn
  WRAP(matmul, p_matmul);
  WRAP(matmul_group, p_matmul_group);
  WRAP(matmul_group_route, p_matmul_group_route);
  WRAP(act_matmul, p_act_matmul);
  WRAP(act_matmul_gated_add, p_act_matmul_gated_add);
  WRAP(attention, p_attention);
  WRAP(rope, p_rope);
  WRAP(scatter_rows, p_scatter);
  WRAP(kv_store, p_kv_store);
  WRAP(conv1d_silu, p_conv);
  WRAP(gdn_chunked, p_gdn_chunked);
  WRAP(gdn_recurrent, p_gdn_recurrent);
  WRAP(gdn_gates, p_gdn_gates);
  WRAP(gdn_step, p_gdn_step);
  WRAP(add_rmsnorm, p_add_rmsnorm);
  WRAP(norm_rope, p_norm_rope);
  WRAP(moe_ffn, p_moe_ffn);
  WRAP(moe_route, p_moe_route);
  WRAP(topk, p_topk);
  WRAP(rmsnorm, p_rmsnorm);
  WRAP(act_mul, p_act_mul);
  WRAP(embed, p_embed);
  WRAP(l2norm, p_l2norm);
  WRAP(rmsnorm_gated, p_rmsnorm_gated);
  WRAP(add, p_add);
  WRAP(scale, p_scale);
  WRAP(mul_sigmoid, p_mul_sigmoid);
  WRAP(copy_rows, p_copy_rows);
  WRAP(softcap, p_softcap);
#undef WRAP
  return &p->be;
}

void ops_profile_free(ops_backend *wrapped) {
  free(wrapped);
}

void ops_profile_read(const ops_backend *wrapped, double *out) {
  memcpy(out, ((const prof *)wrapped)->t, sizeof(double) * OPS_FAMILY_COUNT);
}

void ops_profile_reset(ops_backend *wrapped) {
  memset(P(wrapped)->t, 0, sizeof P(wrapped)->t);
}
