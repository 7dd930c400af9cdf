/* test_cuda_kv.c: quantized KV caches on the GPU (tuning key cuda_kv_quant) against the CPU.
 * - kv_store: the bytes the CUDA kv_store writes equal cpu_kv_store's, for every format
 *   (f16, q8, q4, turboquant 2/3/4) and head dims 64, 128, 256, 512, with rows scattered
 *   through a pointer array as the paged cache does, and inputs that reach the formats'
 *   edges (an all-zero block, values past the f16 range, tiny values that become f16
 *   subnormals, negative maxima for Q4). Also: a backend created without the key advertises
 *   f32 only, has no kv_store, and refuses a quantized attention with a clear error.
 * - attention_kv: attention over the same quantized bytes (encoded once on the CPU and
 *   uploaded, so both sides decode identical records) for every format, decode and prefill
 *   batches of two sequences, GQA groups 1..16, head dims 64..512, windows, softcap, with and
 *   without the f32 residual ring, through paged block tables whose blocks are scattered over
 *   one pool in a shuffled order (as the context hands them out). Both decode the same bytes
 *   in f32, so the CUDA result is the CPU's up to the order of additions: 1e-4 of the output
 *   scale (the f32 attention bound of test_cuda_attn.c). */
#include "cuda_test.h"

#include "backends/cpu/cpu_internal.h"
#include "base/error.h"

static const char *const kv_name[] = {"f32", "f16", "q8", "q4", "tq2", "tq3", "tq4"};

/* A CUDA backend with the quantized caches on (the tuning key); caller frees. */
static ops_backend *kq_backend(void) {
  anna_tuning t;
  tuning_defaults(&t);
  t.cuda_kv_quant = 1;
  ops_backend *be = NULL;
  char err[256];
  if (cuda_backend_create_tuned(&be, 1024, &t, err, sizeof err)) {
    printf("  FAIL cuda backend with cuda_kv_quant=1: %s\n", err);
    g_fail++;
    return NULL;
  }
  cuda_backend_set_exact(be, 1);
  return be;
}

static void kq_status(ops_backend *be, const char *what) {
  char err[256];
  if (cuda_backend_error(be, err, sizeof err)) {
    printf("  FAIL %s: cuda error: %s\n", what, err);
    g_fail++;
    exit(1);
  }
}

static void *kq_put(ops_backend *be, const void *h, size_t bytes) {
  void *d = be->alloc(be, bytes ? bytes : 1);
  if (d && bytes) be->upload(be, d, h, bytes);
  return d;
}

/* Random head vectors with the formats' edge cases in some rows. */
static float *kv_inputs(int64_t rows, int H, int D) {
  const int64_t n = rows * H * D;
  float *x = hrand(n, 1.0f);
  for (int64_t r = 0; r < rows; r++) {
    float *row = x + r * H * D;
    switch (r % 6) {
    case 1: memset(row, 0, sizeof(float) * 32); break;                         /* a zero block: d = 0 */
    case 2: for (int i = 0; i < D; i++) row[i] *= 1e5f; break;                 /* past 65504: f16 inf */
    case 3: for (int i = 0; i < D; i++) row[i] *= 1e-6f; break;                /* f16 subnormals */
    case 4: row[5] = -3.0f, row[40 % D] = 3.0f; break;                          /* ties of |max|, sign first */
    case 5: for (int i = 0; i < H * D; i++) row[i] = (float)((i * 7) % 13 - 6) * 0.25f; break; /* exact ties */
    default: break;
    }
  }
  return x;
}

void test_kv_store(void) {
  printf("kv_store\n");
  /* without the key: f32 only, no kv_store, quantized attention refused */
  {
    ops_backend *def = NULL;
    char err[256] = "";
    if (cuda_backend_create_tuned(&def, 64, NULL, err, sizeof err)) {
      printf("  FAIL default backend: %s\n", err);
      g_fail++;
    } else {
      g_checks++;
      if (def->kv_types != (1u << OPS_KV_F32) || def->kv_store || def->residual_ring) {
        printf("  FAIL default CUDA backend advertises kv_types 0x%x, kv_store %p, ring %d\n", def->kv_types,
               (void *)def->kv_store, def->residual_ring);
        g_fail++;
      }
      int32_t pos = 0;
      int32_t *dp = kq_put(def, &pos, sizeof pos);
      float *dq = def->alloc(def, 64 * sizeof(float)), *dy = def->alloc(def, 64 * sizeof(float));
      uint8_t *blk = def->alloc(def, 16 * 68);
      const void *tab[1] = {blk};
      void *dtab = kq_put(def, tab, sizeof tab);
      const void *ptab[1] = {dtab};
      ops_attn_args a = {.n = 1, .n_heads = 1, .n_kv_heads = 1, .head_dim = 64, .v_dim = 64, .kv_type = OPS_KV_Q8,
                         .kv_row_bytes = 68, .block_len = 16, .scale = 0.125f, .pos = dp,
                         .k_blocks = (const void *const *const *)ptab, .v_blocks = (const void *const *const *)ptab};
      def->attention(def, dy, dq, &a);
      const int rc = cuda_backend_error(def, err, sizeof err);
      g_checks++;
      if (rc != ANNA_EUNSUPPORTED || !strstr(err, "type 2")) {
        printf("  FAIL default backend on a q8 cache: rc %d '%s' (want ANNA_EUNSUPPORTED naming the type)\n", rc, err);
        g_fail++;
      }
      def->free(def, dp), def->free(def, dq), def->free(def, dy), def->free(def, blk), def->free(def, dtab);
      cuda_backend_free(def);
    }
  }
  ops_backend *kq = kq_backend();
  if (!kq) return;
  g_checks++;
  if (kq->kv_types != 0x7fu || !kq->kv_store || !kq->residual_ring) {
    printf("  FAIL cuda_kv_quant=1 backend advertises kv_types 0x%x, ring %d\n", kq->kv_types, kq->residual_ring);
    g_fail++;
  }
  const int dims[] = {64, 128, 256, 512};
  const int64_t rows = 12;
  const int H = 3;
  for (int type = OPS_KV_F16; type <= OPS_KV_TQ4; type++)
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
      const int D = dims[di];
      const int64_t rb = H * ops_kv_head_bytes(type, D), pool = rows * rb;
      float *x = kv_inputs(rows, H, D);
      uint8_t *hc = calloc(1, (size_t)pool), *hg = calloc(1, (size_t)pool);
      uint8_t *dpool = kq->alloc(kq, (size_t)pool);
      float *dx = kq_put(kq, x, sizeof(float) * (size_t)(rows * H * D));
      void **ph = malloc(sizeof(void *) * rows), **pd = malloc(sizeof(void *) * rows);
      for (int64_t r = 0; r < rows; r++) { /* row r goes to slot (5 r + 3) mod rows: scattered */
        const int64_t slot = (5 * r + 3) % rows;
        ph[r] = hc + slot * rb, pd[r] = dpool + slot * rb;
      }
      g_cpu->kv_store(g_cpu, ph, x, rows, H, D, type);
      kq->kv_store(kq, pd, dx, rows, H, D, type);
      kq_status(kq, "kv_store");
      kq->download(kq, hg, dpool, (size_t)pool);
      g_checks++;
      int64_t bad = -1;
      for (int64_t i = 0; i < pool && bad < 0; i++)
        if (hc[i] != hg[i]) bad = i;
      if (bad >= 0) {
        printf("  FAIL kv_store %s D=%d: byte %lld (slot %lld, head byte %lld) cuda 0x%02x cpu 0x%02x\n", kv_name[type],
               D, (long long)bad, (long long)(bad / rb), (long long)(bad % rb), hg[bad], hc[bad]);
        g_fail++;
      }
      kq->free(kq, dpool), kq->free(kq, dx);
      free(x), free(hc), free(hg), free(ph), free(pd);
    }
  cuda_backend_free(kq);
}

/* One case: sequence A continues at len0 with n1 tokens, sequence B starts at 0 with nB. */
static void kv_attn_case(ops_backend *kq, int type, int Hq, int Hkv, int D, int win, int cap, int len0, int n1, int nB,
                         int resid) {
  const int BL = 16;
  const int64_t n = n1 + nB, kvd = (int64_t)Hkv * D, rb = Hkv * ops_kv_head_bytes(type, D);
  const int lenA = len0 + n1, lenB = nB, nbA = (lenA + BL - 1) / BL, nbB = (lenB + BL - 1) / BL, nb = nbA + nbB;
  /* f32 K/V of both sequences, then encoded into a pool of nb blocks in a shuffled order */
  float *kf = hrand((int64_t)(lenA + lenB) * kvd, 1.0f), *vf = hrand((int64_t)(lenA + lenB) * kvd, 1.0f);
  int *perm = malloc(sizeof(int) * (size_t)nb);
  for (int i = 0; i < nb; i++) perm[i] = i;
  for (int i = nb - 1; i > 0; i--) {
    const int j = (int)(rnd() % (uint64_t)(i + 1)), tmp = perm[i];
    perm[i] = perm[j], perm[j] = tmp;
  }
  const int64_t pool = (int64_t)nb * BL * rb;
  uint8_t *hk = calloc(1, (size_t)pool), *hv = calloc(1, (size_t)pool);
  void **rk = malloc(sizeof(void *) * (size_t)(lenA + lenB)), **rv = malloc(sizeof(void *) * (size_t)(lenA + lenB));
  for (int s = 0; s < 2; s++) {
    const int len = s ? lenB : lenA, b0 = s ? nbA : 0, r0 = s ? lenA : 0;
    for (int p = 0; p < len; p++) {
      const int64_t off = ((int64_t)perm[b0 + p / BL] * BL + (p % BL)) * rb;
      rk[r0 + p] = hk + off, rv[r0 + p] = hv + off;
    }
  }
  g_cpu->kv_store(g_cpu, rk, kf, lenA + lenB, Hkv, D, type);
  g_cpu->kv_store(g_cpu, rv, vf, lenA + lenB, Hkv, D, type);
  uint8_t *dk = kq_put(kq, hk, (size_t)pool), *dv = kq_put(kq, hv, (size_t)pool);
  /* block tables (host for the CPU, device for the GPU) */
  const void **tab_h[4], **tab_g[4];
  void *tab_d[4];
  for (int s = 0; s < 2; s++)
    for (int kvs = 0; kvs < 2; kvs++) {
      const int nbs = s ? nbB : nbA, b0 = s ? nbA : 0, i = 2 * s + kvs;
      const uint8_t *hp = kvs ? hv : hk, *dp = kvs ? dv : dk;
      tab_h[i] = malloc(sizeof(void *) * (size_t)(nbs + 1));
      tab_g[i] = malloc(sizeof(void *) * (size_t)(nbs + 1));
      for (int j = 0; j < nbs; j++) {
        tab_h[i][j] = hp + (int64_t)perm[b0 + j] * BL * rb;
        tab_g[i][j] = dp + (int64_t)perm[b0 + j] * BL * rb;
      }
      tab_d[i] = kq_put(kq, tab_g[i], sizeof(void *) * (size_t)(nbs > 0 ? nbs : 1));
    }
  /* residual rings: ring_len = resid + the sequence's batch rows; position p at row p % ring_len */
  const int ring_len = resid ? resid + (int)n : 0;
  float *ring_h[4] = {0}, *ring_d[4] = {0};
  if (resid)
    for (int s = 0; s < 2; s++)
      for (int kvs = 0; kvs < 2; kvs++) {
        const int len = s ? lenB : lenA, r0 = s ? lenA : 0, i = 2 * s + kvs;
        ring_h[i] = calloc((size_t)ring_len * (size_t)kvd, sizeof(float));
        for (int p = len - ring_len > 0 ? len - ring_len : 0; p < len; p++)
          memcpy(ring_h[i] + (int64_t)(p % ring_len) * kvd, (kvs ? vf : kf) + (int64_t)(r0 + p) * kvd,
                 sizeof(float) * (size_t)kvd);
        ring_d[i] = kq_put(kq, ring_h[i], sizeof(float) * (size_t)ring_len * (size_t)kvd);
      }
  float *q = hrand(n * Hq * D, 1.0f);
  float *dq = kq_put(kq, q, sizeof(float) * (size_t)(n * Hq * D));
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
  const void **hkp = malloc(sizeof(void *) * (size_t)n), **hvp = malloc(sizeof(void *) * (size_t)n);
  const void **gkp = malloc(sizeof(void *) * (size_t)n), **gvp = malloc(sizeof(void *) * (size_t)n);
  const float **hkr = malloc(sizeof(float *) * (size_t)n), **hvr = malloc(sizeof(float *) * (size_t)n);
  const float **gkr = malloc(sizeof(float *) * (size_t)n), **gvr = malloc(sizeof(float *) * (size_t)n);
  int32_t pmax = 0;
  for (int64_t t = 0; t < n; t++) {
    const int s = t < n1 ? 0 : 1;
    pos[t] = s ? (int32_t)(t - n1) : len0 + (int32_t)t;
    pmax = pos[t] + 1 > pmax ? pos[t] + 1 : pmax;
    hkp[t] = tab_h[2 * s], hvp[t] = tab_h[2 * s + 1], gkp[t] = tab_d[2 * s], gvp[t] = tab_d[2 * s + 1];
    hkr[t] = ring_h[2 * s], hvr[t] = ring_h[2 * s + 1], gkr[t] = ring_d[2 * s], gvr[t] = ring_d[2 * s + 1];
  }
  int32_t *dpos = kq_put(kq, pos, sizeof(int32_t) * (size_t)n);
  ops_attn_args ha = {.n = n, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .v_dim = D, .kv_type = type,
                      .kv_row_bytes = rb, .block_len = BL, .scale = 1.0f / sqrtf((float)D), .window = win,
                      .softcap = (float)cap, .pos = pos, .k_blocks = (const void *const *const *)hkp,
                      .v_blocks = (const void *const *const *)hvp, .residual_len = resid, .ring_len = ring_len,
                      .k_ring = resid ? hkr : NULL, .v_ring = resid ? hvr : NULL};
  ops_attn_args ga = ha;
  ga.pos = dpos, ga.k_blocks = (const void *const *const *)gkp, ga.v_blocks = (const void *const *const *)gvp;
  ga.k_ring = resid ? gkr : NULL, ga.v_ring = resid ? gvr : NULL;
  float *ref = malloc(sizeof(float) * (size_t)(n * Hq * D)), *got = malloc(sizeof(float) * (size_t)(n * Hq * D));
  g_cpu->attention(g_cpu, ref, q, &ha);
  /* exact and default numerics (the quantized path is f32 in both), and key hints: none,
   * the true bound, a wrong one */
  for (int mode = 0; mode < 4; mode++) {
    cuda_backend_set_exact(kq, mode == 0);
    ga.keys_hint = mode == 2 ? pmax : mode == 3 ? 1 : 0;
    float *dy = kq->alloc(kq, sizeof(float) * (size_t)(n * Hq * D));
    for (int64_t i = 0; i < n * Hq * D; i++) got[i] = NAN;
    kq->upload(kq, dy, got, sizeof(float) * (size_t)(n * Hq * D));
    kq->attention(kq, dy, dq, &ga);
    kq_status(kq, "attention_kv");
    kq->download(kq, got, dy, sizeof(float) * (size_t)(n * Hq * D));
    char what[160];
    snprintf(what, sizeof what, "attention_kv %s H=%d/%d D=%d win=%d cap=%d len=%d n=%d+%d resid=%d mode %d",
             kv_name[type], Hq, Hkv, D, win, cap, len0, n1, nB, resid, mode);
    cmp(what, got, ref, n * Hq * D, 1e-4);
    kq->free(kq, dy);
  }
  cuda_backend_set_exact(kq, 1);
  kq->free(kq, dk), kq->free(kq, dv), kq->free(kq, dq), kq->free(kq, dpos);
  for (int i = 0; i < 4; i++) {
    kq->free(kq, tab_d[i]);
    free(tab_h[i]), free(tab_g[i]), free(ring_h[i]);
    if (ring_d[i]) kq->free(kq, ring_d[i]);
  }
  free(kf), free(vf), free(perm), free(hk), free(hv), free(rk), free(rv), free(q), free(pos);
  free(hkp), free(hvp), free(gkp), free(gvp), free(hkr), free(hvr), free(gkr), free(gvr), free(ref), free(got);
}

void test_attention_kv(void) {
  printf("attention_kv\n");
  ops_backend *kq = kq_backend();
  if (!kq) return;
  const int cfg[][8] = {/* heads, kv heads, head_dim, window, softcap, len0, n1, nB */
                        {16, 4, 256, 0, 0, 3000, 1, 0},  /* decode, 9B shape, many key splits */
                        {8, 1, 128, 0, 0, 500, 1, 1},    /* G = 8, two sequences */
                        {4, 4, 64, 32, 0, 200, 1, 1},    /* G = 1, window */
                        {2, 1, 512, 0, 30, 300, 2, 0},   /* head dim 512, softcap */
                        {32, 2, 128, 0, 0, 100, 1, 0},   /* G = 16: two head groups per kv head */
                        {12, 4, 64, 0, 0, 90, 3, 2},     /* G = 3 */
                        {8, 2, 128, 0, 0, 40, 70, 20},   /* prefill chunk after a prefix + a new prompt */
                        {16, 1, 64, 48, 0, 0, 64, 0}};   /* prefill, G = 16, window */
  for (int type = OPS_KV_F16; type <= OPS_KV_TQ4; type++)
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
      for (int r = 0; r < 2; r++)
        kv_attn_case(kq, type, cfg[c][0], cfg[c][1], cfg[c][2], cfg[c][3], cfg[c][4], cfg[c][5], cfg[c][6],
                     cfg[c][7], r ? 24 : 0);
  /* the ring over an f32 cache reads the same values either way */
  kv_attn_case(kq, OPS_KV_F32, 8, 2, 128, 0, 0, 100, 1, 1, 24);
  cuda_backend_free(kq);
}
