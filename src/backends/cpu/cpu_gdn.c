/* cpu_gdn.c: the gated delta rule, recurrent (reference, decode) and chunked (prefill).
 *
 * Both run one sequence; heads are independent and split across threads. The chunked form
 * (chunk C = 64) turns the token-sequential update into small dense products per chunk
 * (see docs of ops_gdn_args and shared/docs/MODELS.md); it needs no padding: the last chunk
 * is simply shorter. State S per v-head is [dk, dv], f32.
 */
#include "backends/cpu/cpu_internal.h"

#include <math.h>

#define GDN_CHUNK 64

struct gdn_ctx {
  ops_backend *be;
  const ops_gdn_args *a;
};

static void recurrent_task(void *p, int ith, int nth) {
  struct gdn_ctx *c = p;
  const ops_gdn_args *a = c->a;
  const int dk = a->dk, dv = a->dv, r = a->hv / a->hk;
  int64_t h0, h1;
  threadpool_range(a->hv, ith, nth, &h0, &h1);
  float *u = cpu_scratch(c->be, ith); /* [dv] */
  for (int64_t h = h0; h < h1; h++) {
    float *S = a->state + h * dk * dv;
    const int64_t kh = a->v_tiled ? h % a->hk : h / r;
    for (int64_t t = 0; t < a->n; t++) {
      const float *q = a->q + (t * a->hk + kh) * dk, *k = a->k + (t * a->hk + kh) * dk;
      const float *v = a->v + (t * a->hv + h) * dv;
      const float decay = expf(a->g[t * a->hv + h]), beta = a->beta[t * a->hv + h];
      for (int64_t i = 0; i < (int64_t)dk * dv; i++) S[i] *= decay;
      for (int j = 0; j < dv; j++) u[j] = 0;
      for (int i = 0; i < dk; i++) {
        const float ki = k[i];
        const float *Si = S + (int64_t)i * dv;
        for (int j = 0; j < dv; j++) u[j] += ki * Si[j];
      }
      for (int j = 0; j < dv; j++) u[j] = beta * (v[j] - u[j]);
      for (int i = 0; i < dk; i++) {
        const float ki = k[i];
        float *Si = S + (int64_t)i * dv;
        for (int j = 0; j < dv; j++) Si[j] += ki * u[j];
      }
      float *o = a->out + (t * a->hv + h) * dv;
      for (int j = 0; j < dv; j++) o[j] = 0;
      for (int i = 0; i < dk; i++) {
        const float qi = q[i];
        const float *Si = S + (int64_t)i * dv;
        for (int j = 0; j < dv; j++) o[j] += qi * Si[j];
      }
    }
  }
}

void cpu_gdn_recurrent(ops_backend *be, const ops_gdn_args *a) {
  cpu_impl *ci = be->impl;
  struct gdn_ctx c = {be, a};
  threadpool_run(ci->tp, recurrent_task, &c);
}

static inline float dotf(const float *a, const float *b, int n) {
  float s = 0;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* Per chunk of L tokens with carried state S [dk, dv]:
 *   gam = cumsum(g); A_ij = beta_i (k_i . k_j) exp(gam_i - gam_j) for j < i;
 *   (I + A) U = diag(beta) V;  (I + A) W = diag(beta exp(gam)) K   (forward substitution)
 *   V' = U - W S;  O_i = exp(gam_i) q_i S + sum_{j<=i} (q_i . k_j) exp(gam_i - gam_j) V'_j
 *   S = exp(gam_last) S + sum_j exp(gam_last - gam_j) k_j V'_j^T. */
static void chunked_task(void *p, int ith, int nth) {
  struct gdn_ctx *c = p;
  const ops_gdn_args *a = c->a;
  const int dk = a->dk, dv = a->dv, r = a->hv / a->hk, C = GDN_CHUNK;
  int64_t h0, h1;
  threadpool_range(a->hv, ith, nth, &h0, &h1);
  float *sc = cpu_scratch(c->be, ith);
  float *gam = sc;              /* [C] */
  float *A = gam + C;           /* [C, C] */
  float *U = A + C * C;         /* [C, dv] */
  float *W = U + C * dv;        /* [C, dk] */
  for (int64_t h = h0; h < h1; h++) {
    float *S = a->state + h * dk * dv;
    const int64_t kh = a->v_tiled ? h % a->hk : h / r;
    for (int64_t c0 = 0; c0 < a->n; c0 += C) {
      const int L = a->n - c0 < C ? (int)(a->n - c0) : C;
#define QROW(i) (a->q + ((c0 + (i)) * a->hk + kh) * dk)
#define KROW(i) (a->k + ((c0 + (i)) * a->hk + kh) * dk)
#define VROW(i) (a->v + ((c0 + (i)) * a->hv + h) * dv)
#define ORow(i) (a->out + ((c0 + (i)) * a->hv + h) * dv)
      float acc = 0;
      for (int i = 0; i < L; i++) {
        acc += a->g[(c0 + i) * a->hv + h];
        gam[i] = acc;
      }
      for (int i = 0; i < L; i++) {
        const float bi = a->beta[(c0 + i) * a->hv + h];
        for (int j = 0; j < i; j++) A[i * C + j] = bi * dotf(KROW(i), KROW(j), dk) * expf(gam[i] - gam[j]);
      }
      /* U and W by forward substitution. */
      for (int i = 0; i < L; i++) {
        const float bi = a->beta[(c0 + i) * a->hv + h], ei = expf(gam[i]);
        float *Ui = U + i * dv, *Wi = W + i * dk;
        const float *vi = VROW(i), *ki = KROW(i);
        for (int j = 0; j < dv; j++) Ui[j] = bi * vi[j];
        for (int j = 0; j < dk; j++) Wi[j] = bi * ei * ki[j];
        for (int m = 0; m < i; m++) {
          const float aim = A[i * C + m];
          const float *Um = U + m * dv, *Wm = W + m * dk;
          for (int j = 0; j < dv; j++) Ui[j] -= aim * Um[j];
          for (int j = 0; j < dk; j++) Wi[j] -= aim * Wm[j];
        }
      }
      /* V' = U - W S (in U). */
      for (int i = 0; i < L; i++) {
        float *Ui = U + i * dv;
        const float *Wi = W + i * dk;
        for (int m = 0; m < dk; m++) {
          const float wm = Wi[m];
          const float *Sm = S + (int64_t)m * dv;
          for (int j = 0; j < dv; j++) Ui[j] -= wm * Sm[j];
        }
      }
      /* Outputs. */
      for (int i = 0; i < L; i++) {
        float *o = ORow(i);
        const float *qi = QROW(i);
        const float ei = expf(gam[i]);
        for (int j = 0; j < dv; j++) o[j] = 0;
        for (int m = 0; m < dk; m++) {
          const float qm = qi[m] * ei;
          const float *Sm = S + (int64_t)m * dv;
          for (int j = 0; j < dv; j++) o[j] += qm * Sm[j];
        }
        for (int m = 0; m <= i; m++) {
          const float pim = dotf(qi, KROW(m), dk) * expf(gam[i] - gam[m]);
          const float *Um = U + m * dv;
          for (int j = 0; j < dv; j++) o[j] += pim * Um[j];
        }
      }
      /* State. */
      const float glast = gam[L - 1], el = expf(glast);
      for (int64_t i = 0; i < (int64_t)dk * dv; i++) S[i] *= el;
      for (int m = 0; m < L; m++) {
        const float em = expf(glast - gam[m]);
        const float *km = KROW(m), *Um = U + m * dv;
        for (int i = 0; i < dk; i++) {
          const float f = em * km[i];
          float *Si = S + (int64_t)i * dv;
          for (int j = 0; j < dv; j++) Si[j] += f * Um[j];
        }
      }
#undef QROW
#undef KROW
#undef VROW
#undef ORow
    }
  }
}

void cpu_gdn_chunked(ops_backend *be, const ops_gdn_args *a) {
  cpu_impl *ci = be->impl;
  struct gdn_ctx c = {be, a};
  threadpool_run(ci->tp, chunked_task, &c);
}
