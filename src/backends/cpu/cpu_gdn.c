/* cpu_gdn.c: the gated delta rule, recurrent (reference, decode) and chunked (prefill).
 *
 * Both run one sequence; heads are independent and split across threads. The chunked form
 * (chunk C = 64) turns the token-sequential update into small dense products per chunk
 * (see docs of ops_gdn_args and shared/docs/MODELS.md); it needs no padding: the last chunk
 * is simply shorter. State S per v-head is [dk, dv], f32.
 */
#include "backends/cpu/cpu_internal.h"

#include <immintrin.h>
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


/* Per chunk of L tokens with carried state S [dk, dv]:
 *   gam = cumsum(g); A_ij = beta_i (k_i . k_j) exp(gam_i - gam_j) for j < i;
 *   (I + A) U = diag(beta) V;  (I + A) W = diag(beta exp(gam)) K   (forward substitution)
 *   V' = U - W S;  O_i = exp(gam_i) q_i S + sum_{j<=i} (q_i . k_j) exp(gam_i - gam_j) V'_j
 *   S = exp(gam_last) S + sum_j exp(gam_last - gam_j) k_j V'_j^T. */
/* C[M][N] += alpha * A[M][K] B[K][N] (row-major, leading dims given). The chunk's products
 * (W S, Q S, P V', K^T V') are small GEMMs whose B operand (the 128x128 state) does not fit
 * in L1: a 4-row register tile reuses every loaded B vector four times and keeps C in
 * registers across K, instead of streaming C through memory once per k. */
static void gemm_acc(float *C, int64_t ldc, const float *A, int64_t lda, const float *B, int64_t ldb, int M, int N,
                     int K, float alpha) {
#if defined(__AVX512F__)
  int i = 0;
  const int N16 = N & ~15;
  for (; i + 4 <= M; i += 4)
    for (int j = 0; j < N16; j += 16) {
      __m512 c0 = _mm512_loadu_ps(C + (int64_t)i * ldc + j), c1 = _mm512_loadu_ps(C + (int64_t)(i + 1) * ldc + j),
             c2 = _mm512_loadu_ps(C + (int64_t)(i + 2) * ldc + j), c3 = _mm512_loadu_ps(C + (int64_t)(i + 3) * ldc + j);
      for (int k = 0; k < K; k++) {
        const __m512 bv = _mm512_loadu_ps(B + (int64_t)k * ldb + j);
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(alpha * A[(int64_t)i * lda + k]), bv, c0);
        c1 = _mm512_fmadd_ps(_mm512_set1_ps(alpha * A[(int64_t)(i + 1) * lda + k]), bv, c1);
        c2 = _mm512_fmadd_ps(_mm512_set1_ps(alpha * A[(int64_t)(i + 2) * lda + k]), bv, c2);
        c3 = _mm512_fmadd_ps(_mm512_set1_ps(alpha * A[(int64_t)(i + 3) * lda + k]), bv, c3);
      }
      _mm512_storeu_ps(C + (int64_t)i * ldc + j, c0), _mm512_storeu_ps(C + (int64_t)(i + 1) * ldc + j, c1);
      _mm512_storeu_ps(C + (int64_t)(i + 2) * ldc + j, c2), _mm512_storeu_ps(C + (int64_t)(i + 3) * ldc + j, c3);
    }
  /* leftover rows and columns */
  for (int r = 0; r < M; r++)
    for (int j = (r < i ? N16 : 0); j < N; j++) {
      float acc = 0;
      for (int k = 0; k < K; k++) acc += A[(int64_t)r * lda + k] * B[(int64_t)k * ldb + j];
      C[(int64_t)r * ldc + j] += alpha * acc;
    }
#else
  for (int r = 0; r < M; r++)
    for (int k = 0; k < K; k++) {
      const float av = alpha * A[(int64_t)r * lda + k];
      for (int j = 0; j < N; j++) C[(int64_t)r * ldc + j] += av * B[(int64_t)k * ldb + j];
    }
#endif
}

static void chunked_task(void *p, int ith, int nth) {
  struct gdn_ctx *c = p;
  const ops_gdn_args *a = c->a;
  const int dk = a->dk, dv = a->dv, r = a->hv / a->hk, C = GDN_CHUNK;
  int64_t h0, h1;
  threadpool_range(a->hv, ith, nth, &h0, &h1);
  float *sc = cpu_scratch(c->be, ith);
  float *gam = sc;              /* [C] */
  float *A = gam + C;           /* [C, C] strictly lower: beta_i k_i.k_j e^(gam_i-gam_j) */
  float *P = A + C * C;         /* [C, C] lower incl. diagonal: q_i.k_j e^(gam_i-gam_j) */
  float *U = P + C * C;         /* [C, dv] -> V' */
  float *W = U + C * dv;        /* [C, dk] */
  float *Qs = W + C * dk;       /* [C, dk] e^gam_i q_i */
  float *KsT = Qs + C * dk;     /* [dk, C] e^(gam_last-gam_j) k_j, transposed */
  float *O = KsT + dk * C;      /* [C, dv] */
  for (int64_t h = h0; h < h1; h++) {
    float *S = a->state + h * dk * dv;
    const int64_t kh = a->v_tiled ? h % a->hk : h / r;
    for (int64_t c0 = 0; c0 < a->n; c0 += C) {
      const int L = a->n - c0 < C ? (int)(a->n - c0) : C;
#define QROW(i) (a->q + ((c0 + (i)) * a->hk + kh) * dk)
#define KROW(i) (a->k + ((c0 + (i)) * a->hk + kh) * dk)
#define VROW(i) (a->v + ((c0 + (i)) * a->hv + h) * dv)
      float acc = 0;
      for (int i = 0; i < L; i++) {
        acc += a->g[(c0 + i) * a->hv + h];
        gam[i] = acc;
      }
      for (int i = 0; i < L; i++) {
        const float bi = a->beta[(c0 + i) * a->hv + h];
        const float *qi = QROW(i), *ki = KROW(i);
        for (int j = 0; j < i; j++) {
          const float e = expf(gam[i] - gam[j]);
          A[i * C + j] = bi * cpu_dot_f32(ki, KROW(j), dk) * e;
          P[i * C + j] = cpu_dot_f32(qi, KROW(j), dk) * e;
        }
        for (int j = i; j < L; j++) A[i * C + j] = P[i * C + j] = 0;
        P[i * C + i] = cpu_dot_f32(qi, ki, dk);
      }
      /* U and W by forward substitution (row i needs rows < i). */
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
      /* V' = U - W S */
      gemm_acc(U, dv, W, dk, S, dv, L, dv, dk, -1.0f);
      /* O = diag(e^gam) Q S + P V' */
      for (int i = 0; i < L; i++) {
        const float ei = expf(gam[i]);
        const float *qi = QROW(i);
        for (int j = 0; j < dk; j++) Qs[i * dk + j] = ei * qi[j];
      }
      memset(O, 0, sizeof(float) * (size_t)L * dv);
      gemm_acc(O, dv, Qs, dk, S, dv, L, dv, dk, 1.0f);
      gemm_acc(O, dv, P, C, U, dv, L, dv, L, 1.0f);
      for (int i = 0; i < L; i++) memcpy(a->out + ((c0 + i) * a->hv + h) * dv, O + i * dv, sizeof(float) * (size_t)dv);
      /* S = e^gam_last S + Ks^T V' */
      const float glast = gam[L - 1], el = expf(glast);
      for (int64_t i = 0; i < (int64_t)dk * dv; i++) S[i] *= el;
      for (int m = 0; m < L; m++) {
        const float em = expf(glast - gam[m]);
        const float *km = KROW(m);
        for (int i = 0; i < dk; i++) KsT[i * C + m] = em * km[i];
      }
      gemm_acc(S, dv, KsT, C, U, dv, dk, dv, L, 1.0f);
#undef QROW
#undef KROW
#undef VROW
    }
  }
}

void cpu_gdn_chunked(ops_backend *be, const ops_gdn_args *a) {
  cpu_impl *ci = be->impl;
  struct gdn_ctx c = {be, a};
  threadpool_run(ci->tp, chunked_task, &c);
}
