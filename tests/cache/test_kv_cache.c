/* test_kv_cache.c: the cache layer (src/cache) without a model. A host-memory ops_backend
 * stands in for a device; a "forward pass" writes rows whose value encodes (token,
 * position), so reading a sequence back through its block table shows whether sharing,
 * copy on write, prefix reuse and eviction kept every sequence's rows right. White-box:
 * reference counts and tables are read from kv_cache_internal.h.
 */
#include "cache/kv_cache_internal.h"

#include "backends/cpu/cpu_internal.h"
#include "base/error.h"

#include <math.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;
static uint64_t g_rng = 0x2545F4914F6CDD1Dull;

static uint64_t rnd(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return g_rng;
}

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    g_checks++;                                                                                    \
    if (!(cond)) {                                                                                 \
      g_fail++;                                                                                    \
      printf("  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                    \
      printf(__VA_ARGS__);                                                                         \
      printf("\n");                                                                                \
    }                                                                                              \
  } while (0)

/* ---- a host-memory backend: just the entries the cache uses ---- */

static void *h_alloc(ops_backend *be, size_t n) {
  (void)be;
  return calloc(1, n);
}
static void h_free(ops_backend *be, void *p) {
  (void)be;
  free(p);
}
static void h_memset0(ops_backend *be, void *p, size_t n) {
  (void)be;
  memset(p, 0, n);
}
static void h_copy(ops_backend *be, void *d, const void *s, size_t n) {
  (void)be;
  memmove(d, s, n);
}
static void h_copy_rows(ops_backend *be, float *d, int64_t ds, const float *s, int64_t ss, int64_t rows, int n) {
  (void)be;
  for (int64_t r = 0; r < rows; r++) memmove(d + r * ds, s + r * ss, sizeof(float) * (size_t)n);
}
/* Quantized stores are never run here: present so that quantized types (the ring) are accepted. */
static void h_kv_store(ops_backend *be, void *const *d, const float *s, int64_t rows, int nh, int hd, int t) {
  (void)be, (void)d, (void)s, (void)rows, (void)nh, (void)hd, (void)t;
}

static ops_backend g_be = {
    .name = "host", .alloc = h_alloc, .free = h_free, .memset0 = h_memset0, .upload = h_copy,
    .download = h_copy, .copy = h_copy, .copy_rows = h_copy_rows, .kv_store = h_kv_store,
};

/* ---- layouts ---- */

#define HEADS 2
#define HDIM 32
#define ROWF (HEADS * HDIM) /* floats of one f32 row */
#define VOCAB 1000

/* attention only: layer 0 owns a cache, layer 1 reads it (KV sharing) */
static const kv_cache_layer g_attn[2] = {{KV_LAYER_ATTN, 0, HEADS, HDIM}, {KV_LAYER_ATTN, 0, HEADS, HDIM}};
/* hybrid: attention, recurrent state, attention */
static const kv_cache_layer g_hyb[3] = {
    {KV_LAYER_ATTN, 0, HEADS, HDIM}, {KV_LAYER_STATE, 0, 0, 0}, {KV_LAYER_ATTN, 2, HEADS, HDIM}};

static kv_cache_options opts(int n_seq, int n_ctx, int n_batch, int64_t n_blocks, int hybrid) {
  kv_cache_options o = {.n_seq = n_seq, .n_ctx = n_ctx, .n_batch = n_batch, .n_vocab = VOCAB,
                        .n_layers = hybrid ? 3 : 2, .layers = hybrid ? g_hyb : g_attn,
                        .conv_floats = 4, .ssm_floats = 8, .kv_type = OPS_KV_F32, .block_len = 16,
                        .n_blocks = n_blocks, .prefix_share = 1, .n_ckpt = hybrid ? 2 : 0};
  return o;
}

static kv_cache *mk(const kv_cache_options *o) {
  char err[256];
  kv_cache *c = NULL;
  const int rc = kv_cache_create(&c, &g_be, o, err, sizeof err);
  CHECK(rc == 0, "create: %s", err);
  return c;
}

static float row_value(int32_t tok, int32_t pos) {
  return (float)tok * 4096.0f + (float)pos;
}

/* One forward pass over tokens[0, n) appended to seq (one run): what forward.c does with the
 * plan, minus the arithmetic. Every owner layer's K and V rows get row_value. Returns the
 * plan's rc. */
static int step_multi(kv_cache *c, int nseq, const int *seqs, const int32_t *const *toks, const int *ns,
                      kv_plan *pl, char *err) {
  int32_t tk[256], sq[256], ps[256];
  int n = 0;
  for (int i = 0; i < nseq; i++)
    for (int j = 0; j < ns[i]; j++) {
      tk[n] = toks[i][j], sq[n] = seqs[i], ps[n] = kv_cache_seq_len(c, seqs[i]) + j;
      n++;
    }
  const anna_batch b = {.n = n, .tokens = tk, .seq = sq, .pos = ps};
  kv_plan local;
  if (!pl) pl = &local;
  int rc = kv_cache_plan(c, &b, pl, err, 256);
  if (rc) return rc;
  /* the plan uploaded every changed table: what the op reads is the host mirror */
  const int64_t per = (int64_t)c->n_own * 2 * c->max_bps;
  for (int t = 0; t < n; t++)
    if (memcmp(c->tb_d[0] + sq[t] * per, c->tab_h + sq[t] * per, sizeof(void *) * (size_t)per)) {
      snprintf(err, 256, "table of sequence %d not uploaded", sq[t]);
      return -1000;
    }
  for (int l = 0; l < c->n_layers; l++) {
    if (c->own_idx[l] < 0 || !c->owns[l]) continue;
    kv_attn_rows r;
    kv_cache_attn_rows(c, &b, l, &r);
    if (r.kv_type != OPS_KV_F32) continue; /* quantized rows: bookkeeping only here */
    for (int t = 0; t < n; t++) {
      float *k = r.wk[t], *v = r.wv[t];
      for (int i = 0; i < ROWF; i++) k[i] = v[i] = row_value(tk[t], ps[t]) + (float)l;
    }
  }
  kv_cache_commit(c, pl);
  return 0;
}

static int step(kv_cache *c, int seq, const int32_t *tok, int n, char *err) {
  return step_multi(c, 1, &seq, &tok, &n, NULL, err);
}

/* Row p of seq's layer-l K cache, through the host mirror of its block table (what the
 * next plan uploads for the attention op; step_multi checks the upload). */
static float read_row(kv_cache *c, int seq, int l, int32_t p) {
  const int oi = c->own_idx[l];
  void *const *tab = c->tab_h + ((int64_t)seq * c->n_own + oi) * 2 * c->max_bps;
  const float *row = (const float *)((const uint8_t *)tab[p / c->block_len] + (p % c->block_len) * c->row_bytes[oi]);
  return row[ROWF - 1];
}

/* Every position of seq reads back what was written for its token. */
static int seq_rows_ok(kv_cache *c, int seq, const int32_t *tok) {
  for (int32_t p = 0; p < kv_cache_seq_len(c, seq); p++)
    if (read_row(c, seq, 0, p) != row_value(tok[p], p)) return 0;
  return 1;
}

/* Reference counts equal table entries; free + cached + referenced = n_blocks; the free list
 * holds exactly the unreferenced uncached blocks, once each. */
static int pool_consistent(kv_cache *c) {
  int ok = 1;
  int32_t *cnt = calloc((size_t)c->n_blocks, sizeof *cnt), *onfree = calloc((size_t)c->n_blocks, sizeof *onfree);
  for (int q = 0; q < c->n_seq; q++)
    for (int j = 0; j < c->nblk[q]; j++) cnt[c->tab_id[(int64_t)q * c->max_bps + j]]++;
  for (int64_t i = 0; i < c->n_free; i++) onfree[c->free_ids[i]]++;
  int64_t nref = 0, ncached = 0;
  for (int64_t b = 0; b < c->n_blocks; b++) {
    if (cnt[b] != c->blk[b].ref) ok = 0;
    if (onfree[b] != (c->blk[b].ref == 0 && !c->blk[b].cached)) ok = 0;
    nref += c->blk[b].ref > 0;
    ncached += c->blk[b].ref == 0 && c->blk[b].cached;
  }
  if (c->n_free + ncached + nref != c->n_blocks) ok = 0;
  anna_kv_stats st;
  kv_cache_stats(c, &st);
  if (st.free_blocks != c->n_free || st.cached_blocks != ncached) ok = 0;
  free(cnt);
  free(onfree);
  return ok;
}

static void seqtok(int32_t *t, int n, int base) {
  for (int i = 0; i < n; i++) t[i] = (base * 37 + i * 11) % VOCAB;
}

/* ---- tests ---- */

static void test_type_names(void) {
  char err[256];
  int t = -1;
  CHECK(!kv_cache_type_from_name(NULL, 0, &t, err, sizeof err) && t == OPS_KV_F32, "NULL");
  CHECK(!kv_cache_type_from_name("auto", 0, &t, err, sizeof err) && t == OPS_KV_F32, "auto");
  CHECK(!kv_cache_type_from_name("f16", 0, &t, err, sizeof err) && t == OPS_KV_F16, "f16");
  CHECK(!kv_cache_type_from_name("q8", 0, &t, err, sizeof err) && t == OPS_KV_Q8, "q8");
  CHECK(!kv_cache_type_from_name("q4", 0, &t, err, sizeof err) && t == OPS_KV_Q4, "q4");
  CHECK(!kv_cache_type_from_name("turboquant", 0, &t, err, sizeof err) && t == OPS_KV_TQ4, "tq default 4 bits");
  CHECK(!kv_cache_type_from_name("turboquant", 2, &t, err, sizeof err) && t == OPS_KV_TQ2, "tq2");
  CHECK(kv_cache_type_from_name("turboquant", 5, &t, err, sizeof err) == ANNA_EINVAL, "tq5");
  CHECK(kv_cache_type_from_name("q5", 0, &t, err, sizeof err) == ANNA_EINVAL && strstr(err, "'q5'"), "%s", err);
}

/* kv_cache_quantization "auto" (kv_cache_auto_type) on synthetic budgets: the first format
 * that fits in the order f32, f16, q8, q4, tq4, tq3, tq2 (bits per value); unusable formats (need 0)
 * skipped; nothing fits: the most compact usable; unknown budget (CPU): f32. */
static void test_auto_type(void) {
  /* bytes per position of a 128-dim head, times 1000 positions */
  int64_t need[OPS_KV_TQ4 + 1];
  for (int t = OPS_KV_F32; t <= OPS_KV_TQ4; t++) need[t] = 1000 * ops_kv_head_bytes(t, 128);
  CHECK(kv_cache_auto_type(-1, need) == OPS_KV_F32, "unknown budget: f32");
  CHECK(kv_cache_auto_type(INT64_MAX / 2, need) == OPS_KV_F32, "room: f32");
  CHECK(kv_cache_auto_type(need[OPS_KV_F32], need) == OPS_KV_F32, "exactly f32's need fits");
  CHECK(kv_cache_auto_type(need[OPS_KV_F32] - 1, need) == OPS_KV_F16, "one byte short: f16");
  CHECK(kv_cache_auto_type(need[OPS_KV_F16] - 1, need) == OPS_KV_Q8, "q8");
  CHECK(kv_cache_auto_type(need[OPS_KV_Q8] - 1, need) == OPS_KV_Q4, "below q8: q4");
  CHECK(kv_cache_auto_type(need[OPS_KV_Q4] - 1, need) == OPS_KV_TQ4, "below q4: tq4");
  CHECK(kv_cache_auto_type(need[OPS_KV_TQ4] - 1, need) == OPS_KV_TQ3, "tq3");
  CHECK(kv_cache_auto_type(need[OPS_KV_TQ3] - 1, need) == OPS_KV_TQ2, "tq2");
  CHECK(kv_cache_auto_type(1, need) == OPS_KV_TQ2, "nothing fits: the most compact");
  CHECK(kv_cache_auto_type(0, need) == OPS_KV_TQ2, "zero budget: the most compact");
  /* a backend / model without the quantized formats: f32 only, whatever the budget */
  int64_t only[OPS_KV_TQ4 + 1] = {need[OPS_KV_F32]};
  CHECK(kv_cache_auto_type(1, only) == OPS_KV_F32, "f32 only");
  /* no turboquant (head dims not powers of two): q8 is the most compact */
  int64_t notq[OPS_KV_TQ4 + 1] = {need[0], need[1], need[2], need[3]};
  CHECK(kv_cache_auto_type(need[OPS_KV_Q4] - 1, notq) == OPS_KV_Q4, "no tq: q4 when nothing fits");
  CHECK(!strcmp(kv_cache_type_name(OPS_KV_TQ3), "turboquant3") && !strcmp(kv_cache_type_name(OPS_KV_F32), "f32") &&
            !strcmp(kv_cache_type_name(99), "unknown"),
        "type names");
  /* why the order is by bits and not by a guess about the data: on near-Gaussian vectors q4
   * (4.5 bits) has the lower squared error, on vectors with one outlier channel turboquant
   * 4-bit (4.25 bits at d = 128) has, by far */
  for (int outlier = 0; outlier < 2; outlier++) {
    double e4 = 0, et = 0;
    for (int v = 0; v < 200; v++) {
      float x[128], y[128];
      uint8_t rec[128 * 4];
      for (int i = 0; i < 128; i++) { /* sum of uniforms: near-Gaussian */
        float g = 0;
        for (int k = 0; k < 4; k++) g += (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)) - 0.5f;
        x[i] = g;
      }
      if (outlier) x[v % 128] *= 20.0f;
      cpu_kv_encode(OPS_KV_Q4, x, 128, rec);
      cpu_kv_decode(OPS_KV_Q4, rec, 128, y);
      for (int i = 0; i < 128; i++) e4 += (double)(y[i] - x[i]) * (y[i] - x[i]);
      cpu_kv_encode(OPS_KV_TQ4, x, 128, rec);
      cpu_kv_decode(OPS_KV_TQ4, rec, 128, y);
      cpu_kv_unrotate(y, 128);
      for (int i = 0; i < 128; i++) et += (double)(y[i] - x[i]) * (y[i] - x[i]);
    }
    printf("  squared error over 200 vectors (%s): q4 %.4g, turboquant4 %.4g\n", outlier ? "one outlier" : "gaussian",
           e4, et);
    CHECK(outlier ? et < 0.5 * e4 : e4 < et, "q4 %.4g vs turboquant4 %.4g (%s)", e4, et,
          outlier ? "outlier" : "gaussian");
  }
}

static void test_create_errors(void) {
  char err[256];
  kv_cache *c = NULL;
  kv_cache_options o = opts(1, 64, 8, 0, 0);
  o.block_len = 24;
  CHECK(kv_cache_create(&c, &g_be, &o, err, sizeof err) == ANNA_EINVAL && !c, "block 24");
  o = opts(0, 64, 8, 0, 0);
  CHECK(kv_cache_create(&c, &g_be, &o, err, sizeof err) == ANNA_EINVAL && !c, "n_seq 0");
  static const kv_cache_layer odd[1] = {{KV_LAYER_ATTN, 0, 2, 48}};
  o = opts(1, 64, 8, 0, 0);
  o.layers = odd, o.n_layers = 1, o.kv_type = OPS_KV_Q8;
  CHECK(kv_cache_create(&c, &g_be, &o, err, sizeof err) == ANNA_EUNSUPPORTED && !c, "q8 head dim 48");
  o = opts(1, 64, 8, 0, 0);
  o.n_blocks = (int64_t)INT32_MAX;
  CHECK(kv_cache_create(&c, &g_be, &o, err, sizeof err) == ANNA_EINVAL && !c, "huge pool");
}

static void test_alloc_free(void) {
  kv_cache_options o = opts(2, 64, 32, 0, 0);
  kv_cache *c = mk(&o);
  char err[256];
  int32_t t[64];
  seqtok(t, 64, 1);
  CHECK(c->n_blocks == 8, "default pool %lld", (long long)c->n_blocks);
  CHECK(step(c, 0, t, 20, err) == 0, "%s", err);
  CHECK(kv_cache_seq_len(c, 0) == 20 && c->nblk[0] == 2 && c->n_free == 6, "two blocks for 20 positions");
  CHECK(step(c, 0, t + 20, 12, err) == 0, "%s", err);
  CHECK(c->nblk[0] == 2 && c->n_free == 6, "32 positions still two blocks");
  CHECK(seq_rows_ok(c, 0, t), "rows read back");
  CHECK(read_row(c, 0, 1, 5) == row_value(t[5], 5), "a KV-shared layer reads its source's cache");
  CHECK(kv_cache_bytes_per_token(c) == 2 * ROWF * 4, "bytes per token %lld", (long long)kv_cache_bytes_per_token(c));
  CHECK(pool_consistent(c), "pool");
  kv_cache_seq_reset(c, 0);
  CHECK(kv_cache_seq_len(c, 0) == 0 && c->n_free == 8 && pool_consistent(c), "reset frees");
  CHECK(kv_cache_seq_len(c, 2) == -1, "seq out of range");
  /* bad batches: wrong position, token id, sequence, non-consecutive runs, context */
  int32_t tk[2] = {1, 2}, sq[2] = {0, 0}, ps[2] = {1, 2};
  anna_batch b = {.n = 2, .tokens = tk, .seq = sq, .pos = ps};
  kv_plan p;
  CHECK(kv_cache_plan(c, &b, &p, err, sizeof err) == ANNA_EINVAL && strstr(err, "expected 0"), "%s", err);
  tk[0] = VOCAB, ps[0] = 0, ps[1] = 1;
  CHECK(kv_cache_plan(c, &b, &p, err, sizeof err) == ANNA_ERANGE && strstr(err, "token id"), "%s", err);
  tk[0] = 1, sq[1] = 5;
  CHECK(kv_cache_plan(c, &b, &p, err, sizeof err) == ANNA_ERANGE && strstr(err, "sequence 5"), "%s", err);
  int32_t sq3[3] = {0, 1, 0}, tk3[3] = {1, 2, 3}, ps3[3] = {0, 0, 1};
  anna_batch b3 = {.n = 3, .tokens = tk3, .seq = sq3, .pos = ps3};
  CHECK(kv_cache_plan(c, &b3, &p, err, sizeof err) == ANNA_EINVAL && strstr(err, "consecutive"), "%s", err);
  CHECK(step(c, 1, t, 64, err) == ANNA_EINVAL, "batch over n_batch");
  CHECK(step(c, 1, t, 32, err) == 0 && step(c, 1, t + 32, 32, err) == 0, "%s", err);
  CHECK(step(c, 1, t, 1, err) == ANNA_ERANGE && strstr(err, "is full"), "%s", err);
  CHECK(pool_consistent(c), "pool");
  kv_cache_free(c);
}

static void test_pool_full(void) {
  kv_cache_options o = opts(2, 64, 48, 3, 0);
  o.prefix_share = 0;
  kv_cache *c = mk(&o);
  char err[256];
  int32_t t[64];
  seqtok(t, 64, 2);
  CHECK(step(c, 0, t, 40, err) == 0, "%s", err);
  CHECK(c->n_free == 0, "pool used up");
  CHECK(step(c, 1, t, 1, err) == ANNA_ERANGE && strstr(err, "KV cache full"), "%s", err);
  CHECK(kv_cache_seq_len(c, 1) == 0 && c->nblk[1] == 0, "nothing taken for the failed sequence");
  CHECK(seq_rows_ok(c, 0, t) && kv_cache_seq_len(c, 0) == 40, "the other sequence is untouched");
  CHECK(step(c, 0, t + 40, 8, err) == 0, "appending inside the last block needs no block: %s", err);
  CHECK(step(c, 0, t + 48, 1, err) == ANNA_ERANGE && kv_cache_seq_len(c, 0) == 48, "no fourth block");
  CHECK(pool_consistent(c), "pool");
  kv_cache_free(c);
}

static void test_cow(void) {
  kv_cache_options o = opts(2, 64, 32, 0, 0);
  kv_cache *c = mk(&o);
  char err[256];
  int32_t t[64], u[64];
  seqtok(t, 64, 3);
  seqtok(u, 64, 4);
  CHECK(step(c, 0, t, 20, err) == 0, "%s", err);
  const int32_t b0 = c->tab_id[0], b1 = c->tab_id[1];
  CHECK(kv_cache_seq_copy(c, 1, 0, 20, err, sizeof err) == 0, "%s", err);
  CHECK(c->blk[b0].ref == 2 && c->blk[b1].ref == 2 && c->n_free == 6, "copy shares blocks");
  memcpy(u, t, sizeof(int32_t) * 20);
  CHECK(step(c, 1, u + 20, 1, err) == 0, "%s", err);
  const int32_t nb = c->tab_id[c->max_bps + 1];
  CHECK(nb != b1 && c->blk[b1].ref == 1 && c->blk[nb].ref == 1 && c->blk[b0].ref == 2, "copy on write");
  anna_kv_stats st;
  kv_cache_stats(c, &st);
  CHECK(st.cow_copies == 1, "cow counter %llu", (unsigned long long)st.cow_copies);
  CHECK(seq_rows_ok(c, 1, u) && seq_rows_ok(c, 0, t), "rows before the write were copied; the source is unchanged");
  CHECK(step(c, 0, t + 20, 1, err) == 0 && seq_rows_ok(c, 0, t) && seq_rows_ok(c, 1, u), "%s", err);
  /* copy at a shorter length, then rewind */
  CHECK(kv_cache_seq_copy(c, 1, 0, 10, err, sizeof err) == 0 && kv_cache_seq_len(c, 1) == 10 && c->nblk[1] == 1,
        "copy of 10 positions");
  CHECK(kv_cache_seq_copy(c, 1, 1, 5, err, sizeof err) == ANNA_ERANGE, "copy onto itself");
  CHECK(kv_cache_seq_copy(c, 1, 0, 30, err, sizeof err) == ANNA_ERANGE, "copy past the length");
  CHECK(kv_cache_seq_rewind(c, 0, 22, err, sizeof err) == ANNA_ERANGE, "rewind past the length");
  CHECK(kv_cache_seq_rewind(c, 0, 7, err, sizeof err) == 0 && kv_cache_seq_len(c, 0) == 7 && c->nblk[0] == 1,
        "attention-only: rewind anywhere");
  CHECK(pool_consistent(c), "pool");
  kv_cache_free(c);
}

static void test_prefix_attach(void) {
  kv_cache_options o = opts(2, 64, 48, 0, 0);
  kv_cache *c = mk(&o);
  char err[256];
  int32_t t[64], v[64];
  seqtok(t, 64, 5);
  CHECK(kv_cache_prefix_attach(c, 0, t, 40, 1) == 0, "empty pool");
  CHECK(step(c, 0, t, 40, err) == 0, "%s", err);
  const int32_t b0 = c->tab_id[0], b2 = c->tab_id[2];
  CHECK(c->blk[b0].cached && c->blk[c->tab_id[1]].cached && !c->blk[b2].cached, "full blocks registered");
  kv_cache_seq_reset(c, 0);
  CHECK(c->blk[b2].cached && c->blk[b2].fill == 8, "the partial last block registered at reset");
  CHECK(c->n_free == c->n_blocks - 3 && pool_consistent(c), "cached blocks stay out of the free list");
  CHECK(kv_cache_prefix_attach(c, 1, t, 40, 0) == 40, "full chain + partial block");
  CHECK(c->tab_id[c->max_bps] == b0 && c->blk[b0].ref == 1 && seq_rows_ok(c, 1, t), "reused rows");
  /* a prompt that differs at position 20: block 0 and the common prefix of block 1 */
  memcpy(v, t, sizeof v);
  v[20] = (v[20] + 1) % VOCAB;
  CHECK(kv_cache_prefix_attach(c, 0, v, 40, 1) == 20, "cut inside a block at the common prefix");
  CHECK(step(c, 0, v + 20, 5, err) == 0 && seq_rows_ok(c, 0, v) && seq_rows_ok(c, 1, t), "write past the cut copies");
  /* tokens are compared, not just hashes: a corrupted cached block is not taken whole */
  kv_cache_seq_reset(c, 0);
  kv_cache_seq_reset(c, 1);
  c->blk_tok[(int64_t)b0 * c->block_len + 3] ^= 1;
  CHECK(kv_cache_prefix_attach(c, 1, t, 40, 0) == 3, "a mismatching block gives its common prefix only");
  CHECK(seq_rows_ok(c, 1, t), "rows");
  anna_kv_stats st;
  kv_cache_stats(c, &st);
  CHECK(st.lookups == 4 && st.lookup_tokens == 160, "lookups %llu", (unsigned long long)st.lookups);
  CHECK(st.hit_blocks == 3 && st.hit_tokens == 63, "hits %llu blocks %llu tokens", (unsigned long long)st.hit_blocks,
        (unsigned long long)st.hit_tokens);
  CHECK(pool_consistent(c), "pool");
  /* ANNA_PREFIX_KV_SHARE=0: attach reuses nothing */
  kv_cache_free(c);
  o.prefix_share = 0;
  c = mk(&o);
  CHECK(step(c, 0, t, 40, err) == 0, "%s", err);
  kv_cache_seq_reset(c, 0);
  CHECK(kv_cache_prefix_attach(c, 1, t, 40, 1) == 0 && c->n_free == c->n_blocks, "sharing off");
  kv_cache_free(c);
}

static void test_lru_eviction(void) {
  kv_cache_options o = opts(2, 64, 48, 4, 0);
  kv_cache *c = mk(&o);
  char err[256];
  int32_t a[16], b[16], x[48];
  seqtok(a, 16, 6);
  seqtok(b, 16, 7);
  seqtok(x, 48, 8);
  kv_cache_prefix_attach(c, 0, a, 16, 1);
  CHECK(step(c, 0, a, 16, err) == 0, "%s", err);
  kv_cache_seq_reset(c, 0); /* a's block released first */
  kv_cache_prefix_attach(c, 0, b, 16, 1);
  CHECK(step(c, 0, b, 16, err) == 0, "%s", err);
  kv_cache_seq_reset(c, 0);
  CHECK(c->n_free == 2 && pool_consistent(c), "two cached, two free");
  CHECK(step(c, 1, x, 48, err) == 0, "%s", err);
  anna_kv_stats st;
  kv_cache_stats(c, &st);
  CHECK(st.evictions == 1 && st.cached_blocks == 1, "one eviction (%llu)", (unsigned long long)st.evictions);
  CHECK(kv_cache_prefix_attach(c, 0, a, 16, 0) == 0, "the least recently released block went");
  CHECK(kv_cache_prefix_attach(c, 0, b, 16, 0) == 16, "the other stayed");
  /* a block in use is never evicted: the pool is full now */
  CHECK(step(c, 1, x, 1, err) == ANNA_ERANGE && kv_cache_seq_len(c, 1) == 48, "full");
  CHECK(pool_consistent(c), "pool");
  kv_cache_free(c);
}

static void set_state(kv_cache *c, int seq, float v) {
  float *cv = kv_cache_conv(c, 1, seq), *ss = kv_cache_ssm(c, 1, seq);
  for (int i = 0; i < 4; i++) cv[i] = v;
  for (int i = 0; i < 8; i++) ss[i] = v;
}

static float state_of(kv_cache *c, int seq) {
  return kv_cache_ssm(c, 1, seq)[7];
}

static void test_snapshots(void) {
  kv_cache_options o = opts(2, 64, 48, 0, 1);
  kv_cache *c = mk(&o);
  char err[256];
  int32_t t[64];
  seqtok(t, 64, 9);
  /* checkpoints: two slots, least recently used replaced */
  kv_cache_seq_reset(c, 0);
  CHECK(step(c, 0, t, 5, err) == 0, "%s", err);
  set_state(c, 0, 1);
  CHECK(kv_cache_checkpoint(c, 0, err, sizeof err) == 0, "%s", err);
  CHECK(step(c, 0, t + 5, 5, err) == 0, "%s", err);
  set_state(c, 0, 2);
  CHECK(kv_cache_checkpoint(c, 0, err, sizeof err) == 0, "%s", err);
  CHECK(step(c, 0, t + 10, 5, err) == 0, "%s", err);
  set_state(c, 0, 3);
  CHECK(kv_cache_checkpoint(c, 0, err, sizeof err) == 0, "%s", err);
  CHECK(kv_cache_seq_rewind(c, 0, 5, err, sizeof err) == ANNA_ENOTFOUND, "the oldest checkpoint was reused");
  CHECK(kv_cache_seq_copy(c, 1, 0, 12, err, sizeof err) == ANNA_ENOTFOUND, "no state at 12");
  CHECK(kv_cache_seq_copy(c, 1, 0, 10, err, sizeof err) == 0 && state_of(c, 1) == 2, "copy restores the checkpoint");
  CHECK(kv_cache_seq_rewind(c, 0, 10, err, sizeof err) == 0 && state_of(c, 0) == 2, "rewind restores it");
  CHECK(kv_cache_seq_rewind(c, 0, 15, err, sizeof err) == ANNA_ERANGE, "rewound past 15");
  /* a fresh sequence starts from zero state */
  kv_cache_seq_reset(c, 1);
  set_state(c, 1, 9);
  CHECK(step(c, 1, t, 1, err) == 0 && state_of(c, 1) == 0, "zeroed by the plan");
  /* prefix snapshots: the plan cuts runs at the last block boundary they reach */
  kv_cache_seq_reset(c, 0);
  kv_cache_seq_reset(c, 1);
  CHECK(kv_cache_prefix_attach(c, 0, t, 40, 1) == 0, "empty");
  const int seq0 = 0;
  const int32_t *tp = t;
  const int n40 = 40;
  kv_plan p;
  CHECK(step_multi(c, 1, &seq0, &tp, &n40, &p, err) == 0, "%s", err);
  CHECK(p.n_runs == 1 && p.run_ncut[0] == 1 && p.cut_at[p.run_cut0[0]] == 32, "one cut at 32 (%d)",
        p.run_ncut[0] ? p.cut_at[0] : -1);
  /* what forward.c does at the cut: the state there into the slot */
  float *sv = kv_cache_slot_ssm(c, p.cut_slot[0], 1), *cv = kv_cache_slot_conv(c, p.cut_slot[0], 1);
  for (int i = 0; i < 8; i++) sv[i] = 32;
  for (int i = 0; i < 4; i++) cv[i] = 32;
  set_state(c, 0, 40);
  kv_cache_seq_reset(c, 0); /* end state at 40 saved with the partial block */
  anna_kv_stats st;
  kv_cache_stats(c, &st);
  CHECK(st.n_snapshots == 2, "snapshots %lld", (long long)st.n_snapshots);
  CHECK(kv_cache_prefix_attach(c, 1, t, 40, 0) == 40 && state_of(c, 1) == 40, "the end state restored");
  CHECK(kv_cache_prefix_attach(c, 1, t, 36, 0) == 32 && state_of(c, 1) == 32, "only where a snapshot exists");
  CHECK(seq_rows_ok(c, 1, t), "rows");
  CHECK(st.snapshot_bytes == 2 * 1 * (4 + 8) * 4, "snapshot bytes %lld", (long long)st.snapshot_bytes);
  CHECK(pool_consistent(c), "pool");
  kv_cache_free(c);
}

static void test_ring(void) {
  kv_cache_options o = opts(2, 64, 4, 0, 0);
  o.kv_type = OPS_KV_Q8, o.residual_len = 4;
  kv_cache *c = mk(&o);
  char err[256];
  int32_t t[64];
  seqtok(t, 64, 10);
  for (int i = 0; i < 5; i++) CHECK(step(c, 0, t + 4 * i, 4, err) == 0, "%s", err);
  int32_t tk = 1, sq = 0, ps = 20;
  const anna_batch b = {.n = 1, .tokens = &tk, .seq = &sq, .pos = &ps};
  kv_attn_rows r;
  kv_cache_attn_rows(c, &b, 0, &r);
  CHECK(r.residual_len == 4 && r.ring_len == 8 && r.wrk[0] == r.rkp[0] + (20 % 8) * ROWF, "ring rows");
  CHECK(kv_cache_seq_rewind(c, 0, 5, err, sizeof err) == ANNA_EUNSUPPORTED, "ring no longer holds 5");
  CHECK(kv_cache_seq_copy(c, 1, 0, 16, err, sizeof err) == 0, "%s", err);
  CHECK(kv_cache_prefix_attach(c, 1, t, 20, 1) == 0, "no reuse with a ring");
  anna_kv_stats st;
  kv_cache_stats(c, &st);
  CHECK(st.ring_bytes == 2 * ROWF * 4 * 8 * 2, "ring bytes %lld", (long long)st.ring_bytes);
  CHECK(st.pool_bytes == kv_cache_bytes_per_token(c) * 16 * c->n_blocks, "pool bytes");
  kv_cache_free(c);
}

/* Random steps, forks, rewinds, attaches and resets over a small pool, against a model of
 * each sequence's tokens: rows always read back right, reference counts match the tables,
 * no block leaks. */
/* Blocks a plan can take: free ones and cached ones nobody references (evicted on demand). */
static int64_t pool_avail(const kv_cache *c) {
  anna_kv_stats st;
  kv_cache_stats(c, &st);
  return st.free_blocks + st.cached_blocks;
}

/* n choices of one prompt (anna-serve's n, or the exact prompt cache): the copies share the
 * prompt's partial last block, and each first write into it copies it. The query counts that
 * copy; a reset of a copy gives back nothing it shares. */
static void test_blocks_accounting(void) {
  kv_cache_options o = opts(5, 64, 40, 6, 0);
  kv_cache *c = mk(&o);
  char err[256];
  int32_t tk[30], t1 = 7;
  seqtok(tk, 30, 3);
  CHECK(kv_cache_seq_blocks_needed(c, 0, 30) == 2 && kv_cache_seq_blocks_needed(c, 0, 0) == 0,
        "fresh");
  CHECK(kv_cache_seq_blocks_needed(c, 9, 1) == ANNA_ERANGE &&
            kv_cache_seq_blocks_held(c, -1) == ANNA_ERANGE,
        "range");
  CHECK(step(c, 0, tk, 30, err) == 0, "%s", err);
  CHECK(kv_cache_seq_blocks_held(c, 0) == 2 && kv_cache_seq_blocks_needed(c, 0, 1) == 0,
        "private partial block");
  CHECK(kv_cache_seq_blocks_needed(c, 0, 3) == 1, "crossing into a new block");
  for (int d = 1; d < 5; d++)
    CHECK(!kv_cache_seq_copy(c, d, 0, 30, err, sizeof err), "%s", err);
  for (int d = 0; d < 5; d++)
    CHECK(kv_cache_seq_blocks_needed(c, d, 1) == 1 && kv_cache_seq_blocks_held(c, d) == 0,
          "shared: seq %d", d);
  CHECK(pool_avail(c) == 4, "4 blocks left");
  /* four decodes: one copy each (the fifth sharer would find the block its own) */
  for (int d = 1; d < 5; d++)
    CHECK(step(c, d, &t1, 1, err) == 0, "decode %d: %s", d, err);
  CHECK(pool_avail(c) == 0 && kv_cache_seq_blocks_needed(c, 0, 1) == 0,
        "last holder writes in place");
  CHECK(kv_cache_seq_blocks_needed(c, 1, 1) == 0 && step(c, 1, tk, 1, err) == 0,
        "fills its block: %s", err);
  CHECK(kv_cache_seq_blocks_needed(c, 1, 1) == 1 && step(c, 1, tk, 1, err) == ANNA_ERANGE,
        "full: %s", err);
  CHECK(kv_cache_seq_blocks_held(c, 1) == 1, "seq 1 holds its copy");
  kv_cache_free(c);
}

static void test_stress(void) {
  enum { NS = 4, CTX = 96 };
  kv_cache_options o = opts(NS, CTX, 40, 14, 0);
  kv_cache *c = mk(&o);
  char err[256];
  int32_t mtok[NS][CTX];
  int bad = 0, full = 0, hits = 0, checked = 0;
  for (int it = 0; it < 4000 && !bad; it++) {
    const int q = (int)(rnd() % NS), op = (int)(rnd() % 10);
    const int32_t len = kv_cache_seq_len(c, q);
    if (op < 5) { /* append; prompts come from a few families so that prefixes repeat */
      int n = 1 + (int)(rnd() % (rnd() % 2 ? 4 : 40));
      if (len + n > CTX) n = CTX - len;
      if (n <= 0) continue;
      int32_t tk[40];
      const int fam = (int)(rnd() % 3);
      for (int i = 0; i < n; i++) tk[i] = rnd() % 4 ? (fam * 101 + (len + i) * 7) % VOCAB : (int32_t)(rnd() % VOCAB);
      /* The scheduler's query: the blocks this plan takes, copies on write included. */
      const int64_t need = kv_cache_seq_blocks_needed(c, q, n), avail = pool_avail(c);
      int32_t before[CTX / 16 + 1], nb0 = c->nblk[q];
      memcpy(before, c->tab_id + (int64_t)q * c->max_bps, sizeof(int32_t) * (size_t)nb0);
      int rc = step(c, q, tk, n, err);
      if (!rc) {
        int64_t took = c->nblk[q] - nb0;
        for (int32_t j = 0; j < nb0; j++)
          took += c->tab_id[(int64_t)q * c->max_bps + j] != before[j];
        if (took != need)
          bad = 1, printf("  iteration %d: needed %lld, the plan took %lld\n", it, (long long)need,
                          (long long)took);
        checked++;
      }
      if (rc == ANNA_ERANGE && need <= avail)
        bad = 1, printf("  iteration %d: %lld blocks needed, %lld available, but the plan failed\n",
                        it, (long long)need, (long long)avail);
      if (rc == ANNA_ERANGE) {
        full++;
        kv_cache_seq_reset(c, q); /* what the engine does with a failed sequence */
      } else if (rc) {
        bad = 1;
        printf("  step: %s\n", err);
      } else {
        memcpy(mtok[q] + len, tk, sizeof(int32_t) * (size_t)n);
      }
    } else if (op == 5) {
      const int64_t held = kv_cache_seq_blocks_held(c, q), avail = pool_avail(c);
      kv_cache_seq_reset(c, q);
      if (pool_avail(c) - avail != held)
        bad = 1, printf("  iteration %d: reset gave back %lld blocks, held said %lld\n", it,
                        (long long)(pool_avail(c) - avail), (long long)held);
    } else if (op == 6 && len > 0) {
      const int32_t n = (int32_t)(rnd() % (uint64_t)(len + 1));
      if (kv_cache_seq_rewind(c, q, n, err, sizeof err)) bad = 1, printf("  rewind: %s\n", err);
    } else if (op == 7) {
      const int d = (int)(rnd() % NS);
      if (d == q) continue;
      const int32_t n = (int32_t)(rnd() % (uint64_t)(len + 1));
      if (kv_cache_seq_copy(c, d, q, n, err, sizeof err)) bad = 1, printf("  copy: %s\n", err);
      else memcpy(mtok[d], mtok[q], sizeof(int32_t) * (size_t)n);
    } else {
      int32_t tk[CTX];
      const int n = 1 + (int)(rnd() % CTX), fam = (int)(rnd() % 3);
      for (int i = 0; i < n; i++) tk[i] = (fam * 101 + i * 7) % VOCAB;
      const int32_t got = kv_cache_prefix_attach(c, q, tk, n, (int)(rnd() % 2));
      if (got < 0 || got > n) bad = 1;
      hits += got > 0;
      memcpy(mtok[q], tk, sizeof(int32_t) * (size_t)(got > 0 ? got : 0));
    }
    for (int s = 0; s < NS && !bad; s++)
      if (!seq_rows_ok(c, s, mtok[s])) bad = 1, printf("  iteration %d: sequence %d rows wrong\n", it, s);
    if (!bad && !pool_consistent(c)) bad = 1, printf("  iteration %d: pool inconsistent\n", it);
  }
  CHECK(!bad, "stress");
  CHECK(full > 0 && hits > 0, "the stress reached a full pool (%d) and prefix hits (%d)", full, hits);
  CHECK(checked > 1000, "blocks_needed checked against %d plans", checked);
  for (int s = 0; s < NS; s++) kv_cache_seq_reset(c, s);
  anna_kv_stats st;
  kv_cache_stats(c, &st);
  CHECK(st.free_blocks + st.cached_blocks == st.n_blocks, "all blocks back: %lld + %lld", (long long)st.free_blocks,
        (long long)st.cached_blocks);
  kv_cache_free(c);
}

int main(int argc, char **argv) {
  (void)argc, (void)argv;
  test_type_names();
  test_auto_type();
  test_create_errors();
  test_alloc_free();
  test_pool_full();
  test_cow();
  test_prefix_attach();
  test_lru_eviction();
  test_snapshots();
  test_ring();
  test_blocks_accounting();
  test_stress();
  printf("%d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
