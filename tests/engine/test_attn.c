/* test_attn.c: the CPU attention op over a paged KV cache against a plain double-precision
 * reference, and the KV-cache record formats.
 *
 * Each case builds sequences whose keys/values live in blocks allocated separately and
 * listed in shuffled order in a block table (so a kernel that ignores the table fails),
 * queries from several sequences in one batch starting mid-sequence, optionally a residual
 * f32 ring, and runs every ISA path (AVX-512, AVX2, scalar; clamped to what the CPU has).
 * The reference attends over exactly what the kernel may read: the decoded records (so a
 * quantized cache is checked to f32 rounding, not to its quantization error, which is
 * checked separately per format) and the f32 ring rows where the ring applies. */
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_internal.h"
#include "base/threadpool.h"
#include "formats/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"

static const char *type_name(int t) {
  static const char *n[] = {"f32", "f16", "q8", "q4", "tq2", "tq3", "tq4"};
  return n[t];
}

/* One sequence's cache: len positions in blocks of block_len, the block table in shuffled
 * order, the decoded (what the kernel sees, unrotated) and the original f32 rows, and a ring
 * of the last ring_len original rows. */
typedef struct seq_cache {
  int len, nblk;
  void **kblk, **vblk;        /* [nblk] table */
  float *kdec, *vdec;         /* [len][Hkv][D] */
  float *kraw, *vraw;         /* [len][Hkv][D] */
  float *kring, *vring;       /* [ring_len][Hkv][D] or NULL */
} seq_cache;

static void seq_build(ops_backend *be, seq_cache *s, int len, int Hkv, int D, int type, int block_len, int ring_len) {
  const int64_t hb = ops_kv_head_bytes(type, D), rowb = hb * Hkv, kvd = (int64_t)Hkv * D;
  s->len = len;
  s->nblk = (len + block_len - 1) / block_len;
  s->kblk = malloc(sizeof(void *) * (size_t)s->nblk), s->vblk = malloc(sizeof(void *) * (size_t)s->nblk);
  for (int b = 0; b < s->nblk; b++) {
    s->kblk[b] = malloc((size_t)(rowb * block_len));
    s->vblk[b] = malloc((size_t)(rowb * block_len));
  }
  for (int b = s->nblk - 1; b > 0; b--) { /* shuffle the table: blocks are not in address order */
    int o = (int)((frand() * 0.5f + 0.5f) * (float)(b + 1));
    if (o > b) o = b;
    void *t = s->kblk[b];
    s->kblk[b] = s->kblk[o], s->kblk[o] = t;
    t = s->vblk[b], s->vblk[b] = s->vblk[o], s->vblk[o] = t;
  }
  s->kraw = malloc(sizeof(float) * (size_t)(len * kvd)), s->vraw = malloc(sizeof(float) * (size_t)(len * kvd));
  s->kdec = malloc(sizeof(float) * (size_t)(len * kvd)), s->vdec = malloc(sizeof(float) * (size_t)(len * kvd));
  fill(s->kraw, len * kvd, 1.0f), fill(s->vraw, len * kvd, 1.0f);
  for (int64_t i = 0; i < len * Hkv; i++) s->kraw[i * D + 3] *= 4; /* an outlier channel, as real keys have */
  void **kd = malloc(sizeof(void *) * (size_t)len), **vd = malloc(sizeof(void *) * (size_t)len);
  for (int p = 0; p < len; p++) {
    kd[p] = (uint8_t *)s->kblk[p / block_len] + (int64_t)(p % block_len) * rowb;
    vd[p] = (uint8_t *)s->vblk[p / block_len] + (int64_t)(p % block_len) * rowb;
  }
  if (type == OPS_KV_F32) {
    be->scatter_rows(be, (float **)kd, s->kraw, len, (int)kvd);
    be->scatter_rows(be, (float **)vd, s->vraw, len, (int)kvd);
  } else {
    be->kv_store(be, kd, s->kraw, len, Hkv, D, type);
    be->kv_store(be, vd, s->vraw, len, Hkv, D, type);
  }
  for (int p = 0; p < len; p++)
    for (int h = 0; h < Hkv; h++) {
      float *kk = s->kdec + ((int64_t)p * Hkv + h) * D, *vv = s->vdec + ((int64_t)p * Hkv + h) * D;
      cpu_kv_decode(type, (const uint8_t *)kd[p] + h * hb, D, kk);
      cpu_kv_decode(type, (const uint8_t *)vd[p] + h * hb, D, vv);
      if (type >= OPS_KV_TQ2) cpu_kv_unrotate(kk, D), cpu_kv_unrotate(vv, D);
    }
  s->kring = s->vring = NULL;
  if (ring_len > 0) {
    s->kring = malloc(sizeof(float) * (size_t)(ring_len * kvd)), s->vring = malloc(sizeof(float) * (size_t)(ring_len * kvd));
    for (int64_t i = 0; i < ring_len * kvd; i++) s->kring[i] = s->vring[i] = NAN; /* unwritten rows must not be read */
    for (int p = 0; p < len; p++) {
      memcpy(s->kring + (int64_t)(p % ring_len) * kvd, s->kraw + p * kvd, sizeof(float) * (size_t)kvd);
      memcpy(s->vring + (int64_t)(p % ring_len) * kvd, s->vraw + p * kvd, sizeof(float) * (size_t)kvd);
    }
  }
  free(kd), free(vd);
}

static void seq_free(seq_cache *s) {
  for (int b = 0; b < s->nblk; b++) free(s->kblk[b]), free(s->vblk[b]);
  free(s->kblk), free(s->vblk), free(s->kdec), free(s->vdec), free(s->kraw), free(s->vraw), free(s->kring),
      free(s->vring);
}

typedef struct attn_case {
  int nseq;
  int qstart[3], qn[3]; /* per sequence: queries at positions qstart .. qstart + qn - 1 */
  int Hq, Hkv, D, window, type, block_len, residual;
  float softcap;
} attn_case;

static void test_case(ops_backend *be, const attn_case *c) {
  const int Hq = c->Hq, Hkv = c->Hkv, D = c->D, g = Hq / Hkv;
  int64_t n = 0;
  for (int s = 0; s < c->nseq; s++) n += c->qn[s];
  const int ring_len = c->residual > 0 ? c->residual + (int)n : 0;
  seq_cache seqs[3];
  for (int s = 0; s < c->nseq; s++) seq_build(be, &seqs[s], c->qstart[s] + c->qn[s], Hkv, D, c->type, c->block_len, ring_len);
  float *q = malloc(sizeof(float) * (size_t)(n * Hq * D)), *o = malloc(sizeof(float) * (size_t)(n * Hq * D));
  double *ref = malloc(sizeof(double) * (size_t)(n * Hq * D));
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
  const void *const **kt = malloc(sizeof(void *) * (size_t)n), *const **vt = malloc(sizeof(void *) * (size_t)n);
  const float **kr = malloc(sizeof(float *) * (size_t)n), **vr = malloc(sizeof(float *) * (size_t)n);
  int *seq_of = malloc(sizeof(int) * (size_t)n);
  fill(q, n * Hq * D, 1.0f);
  int64_t t = 0;
  for (int s = 0; s < c->nseq; s++)
    for (int i = 0; i < c->qn[s]; i++, t++) {
      pos[t] = c->qstart[s] + i, seq_of[t] = s;
      kt[t] = (const void *const *)seqs[s].kblk, vt[t] = (const void *const *)seqs[s].vblk;
      kr[t] = seqs[s].kring, vr[t] = seqs[s].vring;
    }
  const float scale = 1.0f / sqrtf((float)D);
  double *p = malloc(sizeof(double) * (size_t)(c->qstart[0] + c->qn[0] + c->qstart[1] + c->qn[1] + c->qstart[2] + c->qn[2] + 1));
  for (t = 0; t < n; t++) {
    const seq_cache *sc = &seqs[seq_of[t]];
    const int lo = c->window && pos[t] - c->window + 1 > 0 ? pos[t] - c->window + 1 : 0;
    for (int h = 0; h < Hq; h++) {
      const int kh = h / g;
      double mx = -1e300, sum = 0;
      for (int j = lo; j <= pos[t]; j++) {
        const int ring = c->residual > 0 && j > pos[t] - c->residual;
        const float *kk = (ring ? sc->kraw : sc->kdec) + ((int64_t)j * Hkv + kh) * D;
        double s = 0;
        for (int d = 0; d < D; d++) s += (double)q[(t * Hq + h) * D + d] * kk[d];
        s *= scale;
        if (c->softcap > 0) s = c->softcap * tanh(s / c->softcap);
        p[j] = s, mx = fmax(mx, s);
      }
      for (int j = lo; j <= pos[t]; j++) sum += p[j] = exp(p[j] - mx);
      double *rr = ref + (t * Hq + h) * D;
      for (int d = 0; d < D; d++) rr[d] = 0;
      for (int j = lo; j <= pos[t]; j++) {
        const int ring = c->residual > 0 && j > pos[t] - c->residual;
        const float *vv = (ring ? sc->vraw : sc->vdec) + ((int64_t)j * Hkv + kh) * D;
        for (int d = 0; d < D; d++) rr[d] += p[j] / sum * vv[d];
      }
    }
  }
  ops_attn_args a = {.n = n, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .v_dim = D, .kv_type = c->type,
                     .kv_row_bytes = ops_kv_head_bytes(c->type, D) * Hkv, .block_len = c->block_len, .scale = scale,
                     .window = c->window, .softcap = c->softcap, .pos = pos, .k_blocks = kt, .v_blocks = vt,
                     .residual_len = c->residual, .ring_len = ring_len, .k_ring = ring_len ? kr : NULL,
                     .v_ring = ring_len ? vr : NULL};
  /* f32 cache: 1e-5 of the output scale; others: the same, on the decoded values (TQ adds
   * the f32 rotation of q and of the output) */
  const double tol = c->type == OPS_KV_F32 || c->type == OPS_KV_F16 ? 1e-5 : 2e-5;
  for (int isa = 2; isa >= 0; isa--) {
    cpu_backend_force_isa(isa);
    if (isa == 0 && n * (int64_t)(c->qstart[0] + c->qn[0]) * Hq * D > (int64_t)40e6) continue; /* scalar: small cases */
    for (int64_t i = 0; i < n * Hq * D; i++) o[i] = NAN;
    be->attention(be, o, q, &a);
    char what[200];
    snprintf(what, sizeof what, "%s n=%lld seqs=%d q0=%d Hq/Hkv=%d/%d D=%d win=%d cap=%g bl=%d res=%d isa=%s",
             type_name(c->type), (long long)n, c->nseq, c->qstart[0], Hq, Hkv, D, c->window, c->softcap, c->block_len,
             c->residual, cpu_backend_isa());
    check(what, max_rel(o, ref, n * Hq * D), tol);
  }
  cpu_backend_force_isa(2);
  for (int s = 0; s < c->nseq; s++) seq_free(&seqs[s]);
  free(q), free(o), free(ref), free(pos), free(kt), free(vt), free(kr), free(vr), free(seq_of), free(p);
}

static void test_attention(ops_backend *be) {
  printf("attention (paged)\n");
  const attn_case cases[] = {
      /* n = 1 decode, GQA 7 (qwen2.5-0.5b shape), long context: split across threads */
      {1, {0}, {1}, 14, 2, 64, 0, OPS_KV_F32, 16, 0, 0},
      {1, {599}, {1}, 14, 2, 64, 0, OPS_KV_F32, 64, 0, 0},
      {1, {599}, {1}, 7, 1, 64, 0, OPS_KV_F32, 16, 0, 0},
      {1, {1000}, {1}, 2, 1, 128, 0, OPS_KV_F16, 64, 0, 0},
      /* n = 7, mid-sequence, not at a block boundary */
      {1, {37}, {7}, 14, 2, 64, 0, OPS_KV_F32, 16, 0, 0},
      {1, {37}, {7}, 4, 2, 128, 0, OPS_KV_F16, 16, 0, 0},
      /* prefill from 0 */
      {1, {0}, {64}, 14, 2, 64, 0, OPS_KV_F32, 64, 0, 0},
      {1, {0}, {130}, 4, 4, 64, 0, OPS_KV_F32, 16, 0, 0},
      {1, {0}, {600}, 14, 2, 64, 0, OPS_KV_F32, 64, 0, 0},
      {1, {0}, {600}, 14, 2, 64, 0, OPS_KV_F16, 16, 0, 0},
      /* head dims 256 / 512, GQA 2 */
      {1, {5}, {40}, 4, 2, 256, 0, OPS_KV_F32, 16, 0, 0},
      {1, {3}, {20}, 4, 2, 512, 0, OPS_KV_F32, 64, 0, 0},
      {1, {100}, {1}, 8, 1, 512, 0, OPS_KV_F16, 64, 0, 0},
      /* sliding window, softcap */
      {1, {0}, {130}, 8, 4, 64, 32, OPS_KV_F32, 16, 0, 0},
      {1, {200}, {70}, 14, 2, 128, 48, OPS_KV_F16, 64, 0, 0},
      {1, {0}, {90}, 4, 2, 64, 0, OPS_KV_F32, 16, 0, 30.0f},
      {1, {10}, {50}, 4, 1, 256, 20, OPS_KV_F32, 16, 0, 50.0f},
      /* several sequences in one batch: prefill + decode + continuation */
      {3, {0, 300, 45}, {70, 1, 9}, 14, 2, 64, 0, OPS_KV_F32, 16, 0, 0},
      {3, {17, 0, 250}, {1, 130, 1}, 7, 7, 64, 24, OPS_KV_F16, 64, 0, 0},
      {2, {500, 501}, {1, 1}, 14, 2, 64, 0, OPS_KV_F32, 64, 0, 0},
      /* every quantized type, with and without the residual ring */
      {1, {20}, {64}, 14, 2, 64, 0, OPS_KV_Q8, 16, 0, 0},
      {1, {20}, {64}, 14, 2, 64, 0, OPS_KV_Q4, 16, 0, 0},
      {1, {20}, {64}, 14, 2, 64, 0, OPS_KV_TQ2, 16, 0, 0},
      {1, {20}, {64}, 14, 2, 64, 0, OPS_KV_TQ3, 64, 0, 0},
      {1, {20}, {64}, 14, 2, 64, 0, OPS_KV_TQ4, 16, 0, 0},
      {2, {150, 0}, {7, 100}, 4, 2, 64, 0, OPS_KV_Q8, 16, 32, 0},
      {2, {150, 0}, {7, 100}, 4, 2, 64, 0, OPS_KV_Q4, 64, 100, 0},
      {1, {300}, {1}, 14, 2, 64, 0, OPS_KV_TQ3, 16, 64, 0},
      {2, {90, 3}, {40, 30}, 4, 1, 128, 0, OPS_KV_TQ4, 16, 16, 0},
      {1, {0}, {130}, 4, 2, 64, 40, OPS_KV_TQ2, 64, 50, 0},
      {1, {700}, {1}, 7, 1, 256, 0, OPS_KV_Q8, 64, 128, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_case(be, &cases[i]);
}

/* The record formats: rotation is orthonormal, F16 rounds to nearest even, and each
 * format's reconstruction error is within its budget. */
static void test_kv_formats(ops_backend *be) {
  printf("kv-cache formats\n");
  const int D = 64, Hkv = 2, L = 80;
  float x[64], y[64];
  fill(x, D, 1);
  memcpy(y, x, sizeof x);
  cpu_kv_rotate(y, D);
  cpu_kv_unrotate(y, D);
  double rd = 0;
  for (int i = 0; i < D; i++) rd = fmax(rd, fabs(x[i] - y[i]));
  check("rotation then inverse = identity", rd, 1e-5);
  {
    /* ties go to even: 1 + 2^-11 -> 1, 1 + 3 * 2^-11 -> 1 + 2^-9; 65520 and up -> inf */
    const float in[4] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -2.5f, 65520.0f};
    const float want[4] = {1.0f, 1.0f + 0x1p-9f, -2.5f, INFINITY};
    uint8_t rec[8];
    float out[4];
    cpu_kv_encode(OPS_KV_F16, in, 4, rec);
    cpu_kv_decode(OPS_KV_F16, rec, 4, out);
    double bad = 0;
    for (int i = 0; i < 4; i++) bad += out[i] != want[i];
    check("f16 records round to nearest even", bad, 0);
  }
  const int types[] = {OPS_KV_F16, OPS_KV_Q8, OPS_KV_Q4, OPS_KV_TQ4, OPS_KV_TQ3, OPS_KV_TQ2};
  /* relative RMS reconstruction error budgets (Q4 suffers most from the outlier channel) */
  const double budget[] = {4e-4, 0.01, 0.15, 0.12, 0.22, 0.40};
  for (int ti = 0; ti < 6; ti++) {
    const int type = types[ti];
    const int64_t hb = ops_kv_head_bytes(type, D), rowb = hb * Hkv;
    uint8_t *K = malloc((size_t)(rowb * L));
    float *src = malloc(sizeof(float) * L * Hkv * D);
    void **dst = malloc(sizeof(void *) * L);
    fill(src, (int64_t)L * Hkv * D, 1);
    for (int i = 0; i < L * Hkv; i++) src[i * D + 3] *= 6;
    for (int r = 0; r < L; r++) dst[r] = K + r * rowb;
    be->kv_store(be, dst, src, L, Hkv, D, type);
    double err2 = 0, n2 = 0;
    for (int r = 0; r < L * Hkv; r++) {
      float rec[64];
      cpu_kv_decode(type, K + (int64_t)r * hb, D, rec);
      if (type >= OPS_KV_TQ2) cpu_kv_unrotate(rec, D);
      for (int i = 0; i < D; i++) err2 += (rec[i] - src[r * D + i]) * (rec[i] - src[r * D + i]), n2 += src[r * D + i] * src[r * D + i];
    }
    char what[96];
    snprintf(what, sizeof what, "%s reconstruction rel. RMS %.2g", type_name(type), sqrt(err2 / n2));
    check(what, sqrt(err2 / n2), budget[ti]);
    printf("  %s\n", what);
    free(K), free(src), free(dst);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *x, const void *y) {
  const double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

/* test_attn DIR --bench: one layer of qwen2.5-0.5b attention (14/2 heads, D 64): prefill of n
 * tokens from position 0, and one decode token at depth `depth`; median ms of several (and the minimum: the machine may be shared). */
static void bench(ops_backend *be, int type, int n, int depth) {
  const int Hq = 14, Hkv = 2, D = 64, bl = 64;
  seq_cache sc;
  const int len = n > depth ? n : depth;
  seq_build(be, &sc, len, Hkv, D, type, bl, 0);
  float *q = malloc(sizeof(float) * (size_t)n * Hq * D), *o = malloc(sizeof(float) * (size_t)n * Hq * D);
  fill(q, (int64_t)n * Hq * D, 1.0f);
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
  const void *const **kt = malloc(sizeof(void *) * (size_t)n), *const **vt = malloc(sizeof(void *) * (size_t)n);
  for (int t = 0; t < n; t++) pos[t] = t, kt[t] = (const void *const *)sc.kblk, vt[t] = (const void *const *)sc.vblk;
  ops_attn_args a = {.n = n, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .v_dim = D, .kv_type = type,
                     .kv_row_bytes = ops_kv_head_bytes(type, D) * Hkv, .block_len = bl, .scale = 0.125f,
                     .pos = pos, .k_blocks = kt, .v_blocks = vt};
  double tp[7], td[41];
  for (int r = 0; r < 7; r++) {
    const double t0 = now_s();
    be->attention(be, o, q, &a);
    tp[r] = now_s() - t0;
  }
  a.n = 1, pos[0] = depth - 1;
  for (int r = 0; r < 41; r++) {
    const double t0 = now_s();
    be->attention(be, o, q, &a);
    td[r] = now_s() - t0;
  }
  /* decode over 24 caches in turn (a 24-layer model's cache does not stay in L2/L3) */
  seq_cache lay[24];
  for (int l = 0; l < 24; l++) seq_build(be, &lay[l], depth, Hkv, D, type, bl, 0);
  double tl[9];
  for (int r = 0; r < 9; r++) {
    const double t0 = now_s();
    for (int l = 0; l < 24; l++) {
      kt[0] = (const void *const *)lay[l].kblk, vt[0] = (const void *const *)lay[l].vblk;
      be->attention(be, o, q, &a);
    }
    tl[r] = (now_s() - t0) / 24;
  }
  for (int l = 0; l < 24; l++) seq_free(&lay[l]);
  qsort(tl, 9, sizeof(double), cmp_d);
  qsort(tp, 7, sizeof(double), cmp_d), qsort(td, 41, sizeof(double), cmp_d);
  printf("  %-4s %-6s prefill %d: %7.3f ms (min %7.3f)   decode at %d: %6.4f ms (min %6.4f), 24 caches %6.4f  per layer\n",
         type_name(type), cpu_backend_isa(), n, tp[3] * 1e3, tp[0] * 1e3, depth, td[20] * 1e3, td[0] * 1e3, tl[4] * 1e3);
  seq_free(&sc);
  free(q), free(o), free(pos), free(kt), free(vt);
}

int main(int argc, char **argv) {
  threadpool *tp = NULL;
  ops_backend *be = NULL;
  char err[256];
  const int64_t scratch = cpu_attention_scratch_floats(14, 2, 512) + 64;
  if (threadpool_create(&tp, 2, err, sizeof err) || cpu_backend_create(&be, tp, scratch, 4096, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  if (argc > 2 && !strcmp(argv[2], "--bench")) {
    const int types[] = {OPS_KV_F32, OPS_KV_F16, OPS_KV_Q8, OPS_KV_TQ4};
    for (int i = 0; i < 4; i++) bench(be, types[i], 512, 4096);
    cpu_backend_force_isa(1);
    bench(be, OPS_KV_F32, 512, 4096);
    cpu_backend_free(be);
    threadpool_free(tp);
    return 0;
  }
  test_kv_formats(be);
  test_attention(be);
  cpu_backend_free(be);
  threadpool_free(tp);
  printf("%d passed, %d failed\n", g_checks - g_fail, g_fail);
  return g_fail ? 1 : 0;
}
