/* test_cuda_attn.c: attention over paged caches against the CPU backend (split-K decode kernels
 * per head and per kv-head group, flash prefill with mma.sync and WMMA, windows, softcap, key
 * hints), and the prefill and decode attention benchmarks (--bench=attn, part of --bench=ops). */
#include "cuda_test.h"

/* One attention case: sequence A continues at len0 with n1 tokens, sequence B starts at 0
 * with nB tokens, in one batch (paged caches of 16-position blocks). The CPU result is the
 * reference for both CUDA modes:
 * - exact=1 (CUDA-core f32 kernel): 1e-4 of the output scale, f32 rounding only;
 * - exact=0 (flash prefill on tensor cores when a run has >= 16 tokens; else the same f32
 *   kernel): 1e-2. Q (pre-scaled), K, V and the softmax weights P are rounded to f16
 *   (relative 2^-11 = 4.9e-4 each); with inputs in [-1, 1] and scale 1/sqrt(D) the scores
 *   are O(1) and move by ~1e-3, so each softmax weight moves by ~1e-3 relative and the
 *   output (a convex combination of V rows) by ~1e-3 of its scale; 1e-2 leaves 10x margin
 *   while a wrong mask, a lost rescale or a missed tile moves it by O(1). */
static void attn_case(int Hq, int Hkv, int D, int win, int cap, int len0, int n1, int nB) {
  const int64_t n = n1 + nB, kvd = (int64_t)Hkv * D, ctx = len0 + n1 + nB + 4;
  float *kA = hrand(ctx * kvd, 1.0f), *vA = hrand(ctx * kvd, 1.0f), *kB = hrand(ctx * kvd, 1.0f),
        *vB = hrand(ctx * kvd, 1.0f), *q = hrand(n * Hq * D, 1.0f);
  float *dkA = dput(kA, sizeof(float) * (size_t)(ctx * kvd)), *dvA = dput(vA, sizeof(float) * (size_t)(ctx * kvd));
  float *dkB = dput(kB, sizeof(float) * (size_t)(ctx * kvd)), *dvB = dput(vB, sizeof(float) * (size_t)(ctx * kvd));
  float *dq = dput(q, sizeof(float) * (size_t)(n * Hq * D));
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
  /* Paged: each sequence's cache as blocks of 16 positions (contiguous here; the block
   * tables are what the kernels read). Host tables for the CPU, device ones for the GPU. */
  const int BL = 16, nbk = (int)((ctx + BL - 1) / BL);
  const void **tkA = malloc(sizeof(void *) * nbk), **tvA = malloc(sizeof(void *) * nbk),
             **tkB = malloc(sizeof(void *) * nbk), **tvB = malloc(sizeof(void *) * nbk);
  const void **ukA = malloc(sizeof(void *) * nbk), **uvA = malloc(sizeof(void *) * nbk),
             **ukB = malloc(sizeof(void *) * nbk), **uvB = malloc(sizeof(void *) * nbk);
  for (int j = 0; j < nbk; j++) {
    const int64_t o = (int64_t)j * BL * kvd;
    tkA[j] = kA + o, tvA[j] = vA + o, tkB[j] = kB + o, tvB[j] = vB + o;
    ukA[j] = dkA + o, uvA[j] = dvA + o, ukB[j] = dkB + o, uvB[j] = dvB + o;
  }
  void *dtkA = dput(ukA, sizeof(void *) * nbk), *dtvA = dput(uvA, sizeof(void *) * nbk),
       *dtkB = dput(ukB, sizeof(void *) * nbk), *dtvB = dput(uvB, sizeof(void *) * nbk);
  const void **hk = malloc(sizeof(void *) * (size_t)n), **hv = malloc(sizeof(void *) * (size_t)n);
  const void **gk = malloc(sizeof(void *) * (size_t)n), **gv = malloc(sizeof(void *) * (size_t)n);
  for (int64_t t = 0; t < n; t++) {
    const int a = t < n1;
    pos[t] = a ? len0 + (int32_t)t : (int32_t)(t - n1);
    hk[t] = a ? tkA : tkB, hv[t] = a ? tvA : tvB, gk[t] = a ? dtkA : dtkB, gv[t] = a ? dtvA : dtvB;
  }
  int32_t *dpos = dput(pos, sizeof(int32_t) * (size_t)n);
  ops_attn_args ha = {.n = n, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .v_dim = D, .kv_type = OPS_KV_F32,
                      .kv_row_bytes = kvd * 4, .block_len = BL, .scale = 1.0f / sqrtf((float)D), .window = win,
                      .softcap = (float)cap, .pos = pos, .k_blocks = (const void *const *const *)hk,
                      .v_blocks = (const void *const *const *)hv};
  ops_attn_args ga = ha;
  ga.pos = dpos, ga.k_blocks = (const void *const *const *)gk, ga.v_blocks = (const void *const *const *)gv;
  float *ref = malloc(sizeof(float) * (size_t)(n * Hq * D));
  g_cpu->attention(g_cpu, ref, q, &ha);
  /* modes: exact (f32 kernels); not exact (flash attention where it applies). Each with the
   * decode kernel for grouped queries (the default where 2 <= Hq / Hkv <= 8 and D <= 256) and
   * the per-head kernel (CUDA_ATTN_PER_HEAD): both f32, so both within 1e-4 in exact mode. */
  static const char *const mname[] = {"exact", "fast", "exact per-head", "fast per-head", "fast wmma"};
  for (int mode = 0; mode < 5; mode++) {
    const int exact = mode == 0 || mode == 2;
    cuda_backend_set_exact(g_gpu, exact);
    cuda_backend_set_attn_variant(g_gpu, mode == 2 || mode == 3 ? CUDA_ATTN_PER_HEAD : CUDA_ATTN_DEFAULT);
    cuda_backend_set_flash_variant(g_gpu, mode == 4 ? CUDA_FLASH_WMMA : CUDA_FLASH_MMA);
    float *dy = dnan(n * Hq * D);
    g_gpu->attention(g_gpu, dy, dq, &ga);
    char what[112];
    snprintf(what, sizeof what, "attention H=%d/%d D=%d win=%d cap=%d len=%d n=%d+%d %s", Hq, Hkv, D, win, cap, len0,
             n1, nB, mname[mode]);
    cmpd(what, dy, ref, n * Hq * D, exact ? 1e-4 : 1e-2);
    dfree(dy);
  }
  cuda_backend_set_attn_variant(g_gpu, CUDA_ATTN_DEFAULT);
  cuda_backend_set_flash_variant(g_gpu, CUDA_FLASH_MMA);
  /* Batch invariance (tuning cuda_batch_invariant, default numerics): each sequence's rows
   * attended inside the batch are bit for bit the rows it gets attended alone, whatever the
   * other sequence's run length (which picks flash or the split-K kernel for a batch
   * without it) and however many key splits the batch size would choose. */
  cuda_backend_set_exact(g_gpu, 0);
  cuda_backend_set_batch_invariant(g_gpu, 1);
  {
    float *dyb = dnan(n * Hq * D);
    g_gpu->attention(g_gpu, dyb, dq, &ga);
    float *gb = dget(dyb, n * Hq * D);
    for (int sq = 0; sq < 2; sq++) {
      const int64_t t0 = sq ? n1 : 0, m = sq ? nB : n1;
      if (m <= 0 || m == n) continue;
      ops_attn_args g1 = ga;
      g1.n = m, g1.pos = dpos + t0;
      g1.k_blocks = (const void *const *const *)(gk + t0), g1.v_blocks = (const void *const *const *)(gv + t0);
      float *dy1 = dnan(m * Hq * D);
      g_gpu->attention(g_gpu, dy1, dq + t0 * Hq * D, &g1);
      float *g1h = dget(dy1, m * Hq * D);
      char what[128];
      snprintf(what, sizeof what, "attention H=%d/%d D=%d len=%d n=%d+%d batch-invariant: sequence %c alone", Hq, Hkv,
               D, len0, n1, nB, sq ? 'B' : 'A');
      gpu_status(what);
      g_checks++;
      if (memcmp(g1h, gb + t0 * Hq * D, sizeof(float) * (size_t)(m * Hq * D))) {
        int64_t i = 0;
        while (g1h[i] == gb[t0 * Hq * D + i]) i++;
        printf("  FAIL %s: element %lld: %.9g alone vs %.9g batched\n", what, (long long)i, g1h[i],
               gb[t0 * Hq * D + i]);
        g_fail++;
      }
      free(g1h);
      dfree(dy1);
    }
    free(gb);
    dfree(dyb);
  }
  cuda_backend_set_batch_invariant(g_gpu, 0);
  cuda_backend_set_exact(g_gpu, 1); /* back to the tests' default (exact) */
  /* keys_hint (the host's bound on the keys, which the grouped decode kernel sizes its key
   * splits by): the batch's true bound, and a wrong one (1): results never depend on it */
  int32_t pmax = 0;
  for (int64_t t = 0; t < n; t++) pmax = pos[t] + 1 > pmax ? pos[t] + 1 : pmax;
  const int32_t hints[2] = {pmax, 1};
  for (int h = 0; h < 2; h++) {
    ops_attn_args gh = ga;
    gh.keys_hint = hints[h];
    float *dy = dnan(n * Hq * D);
    g_gpu->attention(g_gpu, dy, dq, &gh);
    char what[112];
    snprintf(what, sizeof what, "attention H=%d/%d D=%d win=%d cap=%d len=%d n=%d+%d keys_hint %d", Hq, Hkv, D, win,
             cap, len0, n1, nB, hints[h]);
    cmpd(what, dy, ref, n * Hq * D, 1e-4);
    dfree(dy);
  }
  dfree(dkA), dfree(dvA), dfree(dkB), dfree(dvB), dfree(dq), dfree(dpos);
  free(kA), free(vA), free(kB), free(vB), free(q), free(pos), free(hk), free(hv), free(gk), free(gv), free(ref);
  dfree(dtkA), dfree(dtvA), dfree(dtkB), dfree(dtvB);
  free(tkA), free(tvA), free(tkB), free(tvB), free(ukA), free(uvA), free(ukB), free(uvB);
}

void test_attention(void) {
  printf("attention\n");
  /* decode-like and mixed batches (the split-K kernel in both modes unless a run has >= 16
   * tokens), then prefill shapes for the flash kernel: GQA groups 1..8 and 3 (rows of a
   * tile not a multiple of the group), head dims 64..512 incl. 80 and 96, windows, softcap,
   * long cached prefixes (several key splits) and two long sequences in one batch */
  const int cfg[][8] = {/* heads, kv heads, head_dim, window, softcap, len0, n1, nB */
                        {4, 2, 64, 0, 0, 23, 23, 3},       {8, 1, 256, 0, 0, 0, 40, 3},
                        {6, 3, 32, 16, 0, 100, 7, 3},      {4, 4, 128, 0, 30, 5, 1, 3},
                        {16, 2, 128, 0, 0, 2000, 3, 3},    {2, 1, 512, 512, 50, 700, 2, 3},
                        {5, 5, 80, 64, 0, 0, 130, 3},      {8, 2, 256, 0, 0, 0, 512, 0},
                        {8, 2, 256, 0, 0, 1500, 512, 0},   {8, 1, 512, 512, 0, 700, 300, 0},
                        {4, 4, 128, 0, 30, 0, 130, 0},     {16, 2, 64, 0, 0, 0, 77, 0},
                        {6, 2, 96, 0, 0, 50, 45, 37},      {8, 2, 256, 100, 0, 300, 70, 20},
                        {2, 2, 512, 0, 0, 33, 17, 16},     {4, 1, 128, 1024, 20, 2000, 200, 40},
                        /* decode of the grouped-query kernel: the 9B shape at 8k (every split
                         * full), a group of 3 and odd dims, one token at position 0, a window
                         * shorter than a split, G = 8 at D = 256 (its largest shared memory) */
                        {16, 4, 256, 0, 0, 8000, 1, 0},    {12, 4, 40, 0, 0, 3000, 2, 1},
                        {4, 2, 64, 0, 0, 0, 0, 1},         {8, 4, 128, 40, 0, 900, 3, 0},
                        {8, 1, 256, 0, 30, 300, 2, 0}};
  for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
    attn_case(cfg[c][0], cfg[c][1], cfg[c][2], cfg[c][3], cfg[c][4], cfg[c][5], cfg[c][6], cfg[c][7]);
}

/* Prefill attention: a 512-token chunk of one sequence at positions len0.. (Qwen3.5-0.8B
 * shape: 8 q heads, 2 kv heads, head dim 256), split-K f32 kernel (exact) vs flash (not
 * exact). Effective TFLOP/s counts 4 * D * heads flops per visible (query, key) pair. */
void bench_attention(int len0) {
  const int Hq = 8, Hkv = 2, D = 256, BL = 16;
  const int64_t n = 512, kvd = (int64_t)Hkv * D, ctx = len0 + n, nbk = (ctx + BL - 1) / BL;
  float *k = hrand(ctx * kvd, 1.0f), *v = hrand(ctx * kvd, 1.0f), *q = hrand(n * Hq * D, 1.0f);
  float *dk = dput(k, sizeof(float) * (size_t)(ctx * kvd)), *dv = dput(v, sizeof(float) * (size_t)(ctx * kvd));
  float *dq = dput(q, sizeof(float) * (size_t)(n * Hq * D)), *dy = dnan(n * Hq * D);
  const void **tk = malloc(sizeof(void *) * (size_t)nbk), **tv = malloc(sizeof(void *) * (size_t)nbk);
  for (int64_t j = 0; j < nbk; j++) tk[j] = dk + j * BL * kvd, tv[j] = dv + j * BL * kvd;
  void *dtk = dput(tk, sizeof(void *) * (size_t)nbk), *dtv = dput(tv, sizeof(void *) * (size_t)nbk);
  const void **gk = malloc(sizeof(void *) * (size_t)n), **gv = malloc(sizeof(void *) * (size_t)n);
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
  double pairs = 0;
  for (int64_t t = 0; t < n; t++) gk[t] = dtk, gv[t] = dtv, pos[t] = len0 + (int32_t)t, pairs += pos[t] + 1;
  int32_t *dpos = dput(pos, sizeof(int32_t) * (size_t)n);
  ops_attn_args ga = {.n = n, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .v_dim = D, .kv_type = OPS_KV_F32,
                      .kv_row_bytes = kvd * 4, .block_len = BL, .scale = 1.0f / sqrtf((float)D), .pos = dpos,
                      .k_blocks = (const void *const *const *)gk, .v_blocks = (const void *const *const *)gv};
  static const char *const mname[] = {"f32 split-K", "flash wmma", "flash mma"};
  for (int mode = 0; mode < 3; mode++) {
    cuda_backend_set_exact(g_gpu, mode == 0);
    cuda_backend_set_flash_variant(g_gpu, mode == 1 ? CUDA_FLASH_WMMA : CUDA_FLASH_MMA);
    g_gpu->attention(g_gpu, dy, dq, &ga);
    gpu_status("attention warmup");
    const int reps = 20;
    double t0 = now_s();
    for (int r = 0; r < reps; r++) g_gpu->attention(g_gpu, dy, dq, &ga);
    gpu_status("attention bench");
    const double dt = (now_s() - t0) / reps;
    printf("  attention %-12s n=%lld after %d (H=%d/%d D=%d): %8.1f us, %6.1f TFLOP/s\n", mname[mode], (long long)n,
           len0, Hq, Hkv, D, dt * 1e6, 4.0 * D * Hq * pairs / dt / 1e12);
  }
  cuda_backend_set_exact(g_gpu, 0);
  cuda_backend_set_flash_variant(g_gpu, CUDA_FLASH_MMA);
  dfree(dk), dfree(dv), dfree(dq), dfree(dy), dfree(dtk), dfree(dtv), dfree(dpos);
  free(k), free(v), free(q), free(tk), free(tv), free(gk), free(gv), free(pos);
}

/* Decode attention of one token after len keys, Qwen3.5-9B shape (16 q heads, 4 kv heads,
 * head dim 256, f32 cache): the grouped-query kernel against the per-head one. GB/s counts
 * the K and V bytes once (what a kernel that reads each row once must move). */
void bench_attention_decode(int len) {
  const int Hq = 16, Hkv = 4, D = 256, BL = 64;
  const int64_t kvd = (int64_t)Hkv * D, ctx = len + 1, nbk = (ctx + BL - 1) / BL;
  float *k = hrand(ctx * kvd, 1.0f), *v = hrand(ctx * kvd, 1.0f), *q = hrand(Hq * D, 1.0f);
  float *dk = dput(k, sizeof(float) * (size_t)(ctx * kvd)), *dv = dput(v, sizeof(float) * (size_t)(ctx * kvd));
  float *dq = dput(q, sizeof(float) * (size_t)(Hq * D)), *dy = dnan(Hq * D);
  const void **tk = malloc(sizeof(void *) * (size_t)nbk), **tv = malloc(sizeof(void *) * (size_t)nbk);
  for (int64_t j = 0; j < nbk; j++) tk[j] = dk + j * BL * kvd, tv[j] = dv + j * BL * kvd;
  void *dtk = dput(tk, sizeof(void *) * (size_t)nbk), *dtv = dput(tv, sizeof(void *) * (size_t)nbk);
  const void *gk[1] = {dtk}, *gv[1] = {dtv};
  int32_t pos = len, *dpos = dput(&pos, sizeof(int32_t));
  ops_attn_args ga = {.n = 1, .n_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .v_dim = D, .kv_type = OPS_KV_F32,
                      .kv_row_bytes = kvd * 4, .block_len = BL, .scale = 1.0f / sqrtf((float)D), .pos = dpos,
                      .k_blocks = (const void *const *const *)gk, .v_blocks = (const void *const *const *)gv};
  static const char *const vname[] = {"grouped", "per-head"};
  for (int var = 0; var < 2; var++) {
    cuda_backend_set_attn_variant(g_gpu, var ? CUDA_ATTN_PER_HEAD : CUDA_ATTN_DEFAULT);
    g_gpu->attention(g_gpu, dy, dq, &ga);
    gpu_status("decode attention warmup");
    const int reps = 50;
    double t0 = now_s();
    for (int r = 0; r < reps; r++) g_gpu->attention(g_gpu, dy, dq, &ga);
    gpu_status("decode attention bench");
    const double dt = (now_s() - t0) / reps;
    printf("  attention decode %-8s n=1 after %d (H=%d/%d D=%d): %8.1f us, %6.0f GB/s of K+V\n", vname[var], len, Hq,
           Hkv, D, dt * 1e6, 2.0 * ctx * kvd * 4 / dt / 1e9);
  }
  cuda_backend_set_attn_variant(g_gpu, CUDA_ATTN_DEFAULT);
  dfree(dk), dfree(dv), dfree(dq), dfree(dy), dfree(dtk), dfree(dtv), dfree(dpos);
  free(k), free(v), free(q), free(tk), free(tv);
}
