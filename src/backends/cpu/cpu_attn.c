/* cpu_attn.c: the attention op on the CPU, over a paged KV cache (ops_attn_args).
 *
 * Work item = (a run of query rows of ONE sequence, one KV head). A row is one (query
 * token, query head of the KV head's group) pair; an item takes up to ATTN_ROWS of them
 * (e.g. 9 tokens x 7 heads), so every key and value is fetched (and, for F16 / quantized
 * caches, decoded) once per item and shared by all its rows. Keys go in tiles of ATTN_T:
 *
 *   S^T[key][row] = K Q^T     (Q is stored transposed, [dim][row]; register tile of 4 row
 *                              vectors x 6 keys: per dim 4 loads, 6 broadcasts, 24 FMAs)
 *   mask, online softmax      (vectorised across rows: each row keeps its running max/sum)
 *   O^T[dim][row] += V^T P^T  (register tile of 4 row vectors of P x 4 value dims)
 *
 * Everything is vectorised across rows, so no horizontal sums are needed. Masks (causal,
 * sliding window, residual ring vs blocks) are one interval of key positions per row.
 * The residual ring (quantized caches) is handled as a second pass over the same tile
 * with the complementary interval: the online softmax does not care which source a key
 * came from. TurboQuant caches are attended in the rotated space: the queries are rotated
 * once per item (and f32 ring rows when loaded), the output rotated back once per row.
 *
 * Decode: one token per sequence gives items of g rows; with fewer items than threads the
 * key range of each item is split across threads and the partial (max, sum, out) of the
 * parts are combined afterwards. Such items have little compute per key, so the next
 * tile's records are prefetched.
 *
 * Tokens are grouped into items when they share the block-table pointer (k_blocks[i]):
 * callers should pass one table pointer per sequence; distinct pointers only cost speed.
 *
 * exp: a degree-7 Taylor polynomial on |r| <= ln2/2 after range reduction x = n ln2 + r
 * (ln2 split in two constants); truncation error <= 0.35^8/8! = 5e-9 relative; measured
 * max relative error vs exp() 7.9e-8 (x in [-87, 0] step 1e-6 and [-20, 20] step 1e-5);
 * inputs below -87.3 give exactly 0.
 *
 * Runtime dispatch (cpu_isa_level): AVX-512 (16 rows per vector), AVX2 (8 rows; also used
 * on AVX-512 machines when an item has at most 8 rows, as in decode of GQA groups <= 8),
 * and a scalar path. The ISA-specific part of this file is written once below and
 * included three times with different vector definitions.
 */
#ifndef ATTN_ISA

#include "backends/cpu/cpu_deq_avx512.h"
#include "backends/cpu/cpu_internal.h"

#include "formats/quant.h"

#include <limits.h>
#include <math.h>

#define ATTN_T 64    /* keys per tile */
#define ATTN_ROWS 64 /* target rows per work item */

typedef struct attn_job {
  ops_backend *be;
  float *out;
  const float *q;
  const ops_attn_args *a;
  int g, isa;
  int64_t max_rows; /* rows per item that fit the scratch */
  /* split mode (decode): unit u = (item u / nsplit, part u % nsplit) runs on worker u */
  int nsplit;
  int64_t n_items;
} attn_job;

/* An item: rows [r0, r0 + nr) of the flattened (token - t0) * g + head rows of tokens
 * [t0, t1) (one sequence), KV head kh; keys [kb, ke) are looked at. */
typedef struct attn_item {
  int64_t t0, r0;
  int nr, kh;
  int32_t kb, ke;
} attn_item;

static int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

/* Floats of scratch an item of rp (padded) rows needs, including 16 for alignment. */
static int64_t attn_need(int64_t rp, int d, int vd) {
  return rp * ((int64_t)d + ATTN_T + vd + 6) + (int64_t)ATTN_T * (d + vd) + 2 * (int64_t)(d > vd ? d : vd) + 32;
}

int64_t cpu_attention_scratch_floats(int n_heads, int n_kv_heads, int head_dim) {
  (void)n_heads, (void)n_kv_heads; /* rows per item adapt to the scratch; ATTN_ROWS is the target */
  return attn_need(ATTN_ROWS, head_dim, head_dim);
}

static inline int same_seq(const ops_attn_args *a, int64_t s, int64_t t) {
  return a->k_blocks[s] == a->k_blocks[t] && a->v_blocks[s] == a->v_blocks[t] &&
         (!a->k_ring || (a->k_ring[s] == a->k_ring[t] && a->v_ring[s] == a->v_ring[t]));
}

static inline int32_t key_lo(const ops_attn_args *a, int32_t pos) {
  return a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
}

/* End of the run of same-sequence tokens starting at t0. */
static int64_t run_end(const ops_attn_args *a, int64_t t0) {
  int64_t t = t0 + 1;
  while (t < a->n && same_seq(a, t0, t)) t++;
  return t;
}

/* Fills it from the chunk of rows [r0, r0 + nr) of the run starting at t0. */
static void item_keys(const ops_attn_args *a, int g, attn_item *it) {
  const int64_t ta = it->t0 + it->r0 / g, tb = it->t0 + (it->r0 + it->nr - 1) / g;
  int32_t kb = INT32_MAX, ke = 0;
  for (int64_t t = ta; t <= tb; t++) {
    const int32_t lo = key_lo(a, a->pos[t]);
    kb = lo < kb ? lo : kb;
    ke = a->pos[t] + 1 > ke ? a->pos[t] + 1 : ke;
  }
  it->kb = kb, it->ke = ke;
}

/* Calls fn for every item, in order, with its cost (rows x keys plus a fixed part). */
typedef void (*item_fn)(void *ctx, const attn_item *it, int64_t cost);

static void items_each(const attn_job *j, item_fn fn, void *ctx) {
  const ops_attn_args *a = j->a;
  for (int64_t t0 = 0; t0 < a->n;) {
    const int64_t t1 = run_end(a, t0), rows = (t1 - t0) * j->g;
    for (int64_t r0 = 0; r0 < rows; r0 += j->max_rows) {
      attn_item it = {.t0 = t0, .r0 = r0, .nr = (int)(rows - r0 < j->max_rows ? rows - r0 : j->max_rows)};
      item_keys(a, j->g, &it);
      const int64_t cost = (int64_t)it.nr * (it.ke - it.kb + ATTN_T);
      for (int kh = 0; kh < a->n_kv_heads; kh++) {
        it.kh = kh;
        fn(ctx, &it, cost);
      }
    }
    t0 = t1;
  }
}

static inline const uint8_t *kv_rec(const void *const *tbl, const ops_attn_args *a, int32_t p, int64_t off) {
  const int lb = __builtin_ctz((unsigned)a->block_len);
  return (const uint8_t *)tbl[p >> lb] + (int64_t)(p & (a->block_len - 1)) * a->kv_row_bytes + off;
}

/* ---- the ISA-specific kernel, three times ---- */
#define ATTN_ISA 2
#include "backends/cpu/cpu_attn.c"
#undef ATTN_ISA
#define ATTN_ISA 1
#include "backends/cpu/cpu_attn.c"
#undef ATTN_ISA
#define ATTN_ISA 0
#include "backends/cpu/cpu_attn.c"
#undef ATTN_ISA

static float *scratch_aligned(ops_backend *be, int ith) {
  uintptr_t p = (uintptr_t)cpu_scratch(be, ith);
  return (float *)((p + 63) & ~(uintptr_t)63);
}

static void run_item(const attn_job *j, float *scr, const attn_item *it, int32_t kb, int32_t ke, int partial) {
  const int rp8 = (int)round_up(it->nr, 8);
  if (j->isa == 2 && rp8 < round_up(it->nr, 16)) attn_item_avx2(j, scr, it, kb, ke, partial); /* <= 8 rows */
  else if (j->isa == 2) attn_item_avx512(j, scr, it, kb, ke, partial);
  else if (j->isa == 1) attn_item_avx2(j, scr, it, kb, ke, partial);
  else attn_item_scalar(j, scr, it, kb, ke, partial);
}

/* Rows padded as the kernel that runs an item pads them (the partial layout depends on it). */
static int64_t item_rp(const attn_job *j, int nr) {
  if (j->isa == 2) return round_up(nr, 8) < round_up(nr, 16) ? round_up(nr, 8) : round_up(nr, 16);
  return j->isa == 1 ? round_up(nr, 8) : nr;
}

/* Cost-balanced split of the item sequence: worker ith runs the items whose cost midpoint
 * falls in its share (causal prefill makes late items dearer than early ones). */
struct pick_ctx {
  const attn_job *j;
  float *scr;
  int64_t total, acc, lo, hi;
};

static void cost_sum(void *ctx, const attn_item *it, int64_t cost) {
  (void)it;
  ((struct pick_ctx *)ctx)->total += cost;
}

static void pick_run(void *ctx, const attn_item *it, int64_t cost) {
  struct pick_ctx *p = ctx;
  const int64_t mid2 = 2 * p->acc + cost; /* twice the midpoint */
  p->acc += cost;
  if (mid2 >= 2 * p->lo && mid2 < 2 * p->hi) run_item(p->j, p->scr, it, it->kb, it->ke, 0);
}

struct nth_ctx {
  int64_t want, at;
  attn_item it;
};

static void nth_item(void *ctx, const attn_item *it, int64_t cost) {
  (void)cost;
  struct nth_ctx *c = ctx;
  if (c->at++ == c->want) c->it = *it;
}

static attn_item item_at(const attn_job *j, int64_t idx) {
  struct nth_ctx c = {.want = idx};
  items_each(j, nth_item, &c);
  return c.it;
}

/* Key range of part s of nsplit, in whole tiles. */
static void part_range(const attn_item *it, int s, int nsplit, int32_t *kb, int32_t *ke) {
  const int64_t tiles = (it->ke - it->kb + ATTN_T - 1) / ATTN_T;
  const int64_t a = tiles * s / nsplit, b = tiles * (s + 1) / nsplit;
  *kb = (int32_t)(it->kb + a * ATTN_T);
  *ke = (int32_t)(it->kb + b * ATTN_T < it->ke ? it->kb + b * ATTN_T : it->ke);
}

static void attn_task(void *p, int ith, int nth) {
  const attn_job *j = p;
  float *scr = scratch_aligned(j->be, ith);
  if (j->nsplit > 1) {
    if (ith >= j->n_items * j->nsplit) return;
    const attn_item it = item_at(j, ith / j->nsplit);
    int32_t kb, ke;
    part_range(&it, ith % j->nsplit, j->nsplit, &kb, &ke);
    run_item(j, scr, &it, kb, ke, 1);
    return;
  }
  struct pick_ctx c = {.j = j, .scr = scr};
  items_each(j, cost_sum, &c);
  c.lo = c.total * ith / nth, c.hi = c.total * (ith + 1) / nth;
  if (ith == nth - 1) c.hi = INT64_MAX / 4;
  items_each(j, pick_run, &c);
}

/* Split mode: the parts of item i sit in the scratch of workers i * nsplit + s as
 * m[rp], l[rp] and O^T[vd][rp] (unnormalised); merge them into out. */
static void combine_parts(const attn_job *j, int64_t item) {
  const ops_attn_args *a = j->a;
  const attn_item it = item_at(j, item);
  const int g = j->g, vd = a->v_dim, D = a->head_dim;
  const int64_t rp = item_rp(j, it.nr);
  for (int r = 0; r < it.nr; r++) {
    float mx = -INFINITY;
    for (int s = 0; s < j->nsplit; s++) {
      const float *m = scratch_aligned(j->be, (int)(item * j->nsplit + s)) + rp * D;
      mx = m[r] > mx ? m[r] : mx;
    }
    const int64_t row = it.r0 + r, t = it.t0 + row / g;
    float *o = j->out + (t * a->n_heads + (int64_t)it.kh * g + row % g) * vd;
    float l = 0;
    for (int x = 0; x < vd; x++) o[x] = 0;
    for (int s = 0; s < j->nsplit; s++) {
      const float *base = scratch_aligned(j->be, (int)(item * j->nsplit + s)) + rp * D;
      const float *m = base, *ls = m + rp, *ot = ls + rp;
      if (m[r] == -INFINITY) continue;
      const float w = expf(m[r] - mx);
      l += ls[r] * w;
      for (int x = 0; x < vd; x++) o[x] += ot[(int64_t)x * rp + r] * w;
    }
    const float inv = l > 0 ? 1.0f / l : 0.0f;
    for (int x = 0; x < vd; x++) o[x] *= inv;
    if (a->kv_type >= OPS_KV_TQ2) cpu_kv_unrotate(o, vd);
  }
}

struct count_ctx {
  int64_t n, max_keys;
};

static void count_item(void *ctx, const attn_item *it, int64_t cost) {
  (void)cost;
  struct count_ctx *c = ctx;
  c->n++;
  if (it->ke - it->kb > c->max_keys) c->max_keys = it->ke - it->kb;
}

void cpu_attention(ops_backend *be, float *out, const float *q, const ops_attn_args *a) {
  cpu_impl *ci = be->impl;
  if (a->n <= 0) return;
  attn_job j = {.be = be, .out = out, .q = q, .a = a, .g = a->n_heads / a->n_kv_heads, .isa = cpu_isa_level()};
  /* Rows per item: ATTN_ROWS rounded down to whole GQA groups where possible, then shrunk
   * until the item fits the scratch. */
  int64_t rows = j.g <= ATTN_ROWS ? ATTN_ROWS / j.g * j.g : ATTN_ROWS;
  while (rows > 1 && attn_need(round_up(rows, 16), a->head_dim, a->v_dim) > ci->scratch_per_thread - 16) rows--;
  if (attn_need(round_up(rows, 16), a->head_dim, a->v_dim) > ci->scratch_per_thread - 16) {
    /* The scratch was sized for smaller heads (cpu_attention_scratch_floats): ops cannot
     * fail, so make the result visibly wrong rather than overrun the arena. */
    for (int64_t i = 0; i < a->n * a->n_heads * a->v_dim; i++) out[i] = NAN;
    return;
  }
  j.max_rows = rows;
  const int nth = threadpool_size(ci->tp);
  struct count_ctx cc = {0, 0};
  items_each(&j, count_item, &cc);
  j.n_items = cc.n;
  j.nsplit = 1;
  if (cc.n < nth) {
    int s = (int)(nth / cc.n);
    const int64_t tiles = (cc.max_keys + ATTN_T - 1) / ATTN_T;
    if (s > tiles / 2) s = (int)(tiles / 2); /* at least two tiles per part */
    if (s > 1) j.nsplit = s;
  }
  threadpool_run(ci->tp, attn_task, &j);
  if (j.nsplit > 1)
    for (int64_t i = 0; i < j.n_items; i++) combine_parts(&j, i);
}

#else /* ATTN_ISA: the kernel */

#if ATTN_ISA == 2
#define FN(x) x##_avx512
#elif ATTN_ISA == 1
#define FN(x) x##_avx2
#else
#define FN(x) x##_scalar
#endif
/* per-ISA names for the helpers below */
#define vld FN(vld)
#define vst FN(vst)
#define vset FN(vset)
#define vfma FN(vfma)
#define vmul FN(vmul)
#define vadd FN(vadd)
#define vsub FN(vsub)
#define vmax FN(vmax)
#define vild FN(vild)
#define viset FN(viset)
#define vsel_range FN(vsel_range)
#define vfinite0 FN(vfinite0)
#define vexp FN(vexp)
#define f16_row FN(f16_row)
#define q8_row FN(q8_row)
#define q4_row FN(q4_row)
#define tq_row FN(tq_row)

#if ATTN_ISA == 2
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define VW 16
#define S_MC 4
#define P_MC 4
#define V __m512
#define VI __m512i
TGT static inline V vld(const float *p) { return _mm512_loadu_ps(p); }
TGT static inline void vst(float *p, V v) { _mm512_storeu_ps(p, v); }
TGT static inline V vset(float x) { return _mm512_set1_ps(x); }
TGT static inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
TGT static inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
TGT static inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
TGT static inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
TGT static inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
TGT static inline VI vild(const int32_t *p) { return _mm512_loadu_si512((const void *)p); }
TGT static inline VI viset(int32_t x) { return _mm512_set1_epi32(x); }
/* s where lo <= p <= hi, else -inf */
TGT static inline V vsel_range(V s, VI p, VI lo, VI hi) {
  const __mmask16 k = _mm512_cmp_epi32_mask(lo, p, _MM_CMPINT_LE) & _mm512_cmp_epi32_mask(p, hi, _MM_CMPINT_LE);
  return _mm512_mask_blend_ps(k, _mm512_set1_ps(-INFINITY), s);
}
/* -inf lanes -> 0 */
TGT static inline V vfinite0(V m) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), m, _mm512_setzero_ps());
}
TGT static inline V vexp(V x) {
  const V xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
  const V n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504089f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  V p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const V e = _mm512_scalef_ps(p, n);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ), e, _mm512_setzero_ps());
}
TGT static inline void f16_row(const uint16_t *s, float *y, int d) {
  int i = 0;
  for (; i + 16 <= d; i += 16) _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
  for (; i < d; i++) y[i] = quant_f16_to_f32(s[i]);
}
/* Q8_0 / Q4_0 records (d a multiple of 32): blocks of an f16 scale and 32 codes. */
TGT static inline void q8_row(const uint8_t *rec, float *y, int d) {
  for (int b = 0; b < d / 32; b++) cpu_deq_q8_0_block_avx512(rec + 34 * b, y + 32 * b);
}
TGT static inline void q4_row(const uint8_t *rec, float *y, int d) {
  for (int b = 0; b < d / 32; b++) cpu_deq_q4_0_block_avx512(rec + 18 * b, y + 32 * b);
}
/* TurboQuant record (d a multiple of 16): 16 codes of b bits are 2b bytes; broadcast them as
 * one 64-bit word, shift each lane's code down, and look the levels up with a permute. Same
 * products s * level as cpu_kv_decode. */
TGT static inline void tq_row(int type, const uint8_t *rec, float *y, int d) {
  const int bits = type == OPS_KV_TQ2 ? 2 : type == OPS_KV_TQ3 ? 3 : 4;
  float s, lut[16] = {0};
  memcpy(&s, rec, 4);
  memcpy(lut, cpu_kv_tq_levels(type), sizeof(float) * (size_t)(1 << bits));
  for (int i = 0; i < 16; i++) lut[i] *= s;
  const __m512 L = _mm512_loadu_ps(lut);
  const __m512i mask = _mm512_set1_epi64((1 << bits) - 1);
  const int b = bits;
  const __m512i sh0 = _mm512_set_epi64(7 * b, 6 * b, 5 * b, 4 * b, 3 * b, 2 * b, b, 0);
  const __m512i sh1 = _mm512_add_epi64(sh0, _mm512_set1_epi64(8 * b));
  const uint8_t *codes = rec + 4;
  for (int k = 0; k < d / 16; k++) {
    uint64_t w = 0;
    memcpy(&w, codes + (int64_t)2 * bits * k, (size_t)(2 * bits));
    const __m512i wv = _mm512_set1_epi64((long long)w);
    const __m256i c0 = _mm512_cvtepi64_epi32(_mm512_and_si512(_mm512_srlv_epi64(wv, sh0), mask));
    const __m256i c1 = _mm512_cvtepi64_epi32(_mm512_and_si512(_mm512_srlv_epi64(wv, sh1), mask));
    const __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1);
    _mm512_storeu_ps(y + 16 * k, _mm512_permutexvar_ps(idx, L));
  }
}
#elif ATTN_ISA == 1
#define TGT __attribute__((target("avx2,fma,f16c")))
#define VW 8
#define S_MC 2
#define P_MC 2
#define V __m256
#define VI __m256i
TGT static inline V vld(const float *p) { return _mm256_loadu_ps(p); }
TGT static inline void vst(float *p, V v) { _mm256_storeu_ps(p, v); }
TGT static inline V vset(float x) { return _mm256_set1_ps(x); }
TGT static inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
TGT static inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
TGT static inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
TGT static inline V vsub(V a, V b) { return _mm256_sub_ps(a, b); }
TGT static inline V vmax(V a, V b) { return _mm256_max_ps(a, b); }
TGT static inline VI vild(const int32_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
TGT static inline VI viset(int32_t x) { return _mm256_set1_epi32(x); }
TGT static inline V vsel_range(V s, VI p, VI lo, VI hi) {
  const __m256i bad = _mm256_or_si256(_mm256_cmpgt_epi32(lo, p), _mm256_cmpgt_epi32(p, hi));
  return _mm256_blendv_ps(s, _mm256_set1_ps(-INFINITY), _mm256_castsi256_ps(bad));
}
TGT static inline V vfinite0(V m) {
  return _mm256_blendv_ps(m, _mm256_setzero_ps(), _mm256_cmp_ps(m, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
}
TGT static inline V vexp(V x) {
  const V xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const V n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504089f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  V r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  V p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  /* 2^n by building the exponent field: n is in [-126, 127] after the clamp */
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const V y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ));
}
TGT static inline void f16_row(const uint16_t *s, float *y, int d) {
  int i = 0;
  for (; i + 8 <= d; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
  for (; i < d; i++) y[i] = quant_f16_to_f32(s[i]);
}
TGT static inline void q8_row(const uint8_t *rec, float *y, int d) {
  for (int b = 0; b < d / 32; b++, rec += 34, y += 32) {
    uint16_t h;
    memcpy(&h, rec, 2);
    const __m256 sc = _mm256_set1_ps(quant_f16_to_f32(h));
    for (int k = 0; k < 4; k++) {
      const __m128i q = _mm_loadl_epi64((const __m128i *)(rec + 2 + 8 * k));
      _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
    }
  }
}
/* Decode items (<= 8 rows) run this AVX2 kernel on AVX-512 machines too: use the AVX-512
 * unpacking there (a call, not inlined: different target). */
TGT static inline void tq_row(int type, const uint8_t *rec, float *y, int d) {
  if (cpu_isa_level() == 2) tq_row_avx512(type, rec, y, d);
  else cpu_kv_decode(type, rec, d, y);
}
TGT static inline void q4_row(const uint8_t *rec, float *y, int d) {
  for (int b = 0; b < d / 32; b++, rec += 18, y += 32) {
    uint16_t h;
    memcpy(&h, rec, 2);
    const __m256 sc = _mm256_set1_ps(quant_f16_to_f32(h));
    for (int k = 0; k < 2; k++) {
      const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rec + 2 + 8 * k)));
      const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(q, _mm256_set1_epi32(15)), _mm256_set1_epi32(8));
      const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(q, 4), _mm256_set1_epi32(8));
      _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(sc, _mm256_cvtepi32_ps(lo)));
      _mm256_storeu_ps(y + 16 + 8 * k, _mm256_mul_ps(sc, _mm256_cvtepi32_ps(hi)));
    }
  }
}
#else
#define TGT
#define VW 1
#define S_MC 1
#define P_MC 1
#define V float
#define VI int32_t
static inline V vld(const float *p) { return *p; }
static inline void vst(float *p, V v) { *p = v; }
static inline V vset(float x) { return x; }
static inline V vfma(V a, V b, V c) { return a * b + c; }
static inline V vmul(V a, V b) { return a * b; }
static inline V vadd(V a, V b) { return a + b; }
static inline V vsub(V a, V b) { return a - b; }
static inline V vmax(V a, V b) { return a > b ? a : b; }
static inline VI vild(const int32_t *p) { return *p; }
static inline VI viset(int32_t x) { return x; }
static inline V vsel_range(V s, VI p, VI lo, VI hi) { return lo <= p && p <= hi ? s : -INFINITY; }
static inline V vfinite0(V m) { return m == -INFINITY ? 0.0f : m; }
static inline V vexp(V x) { return x < -87.3f ? 0.0f : expf(x); }
static inline void f16_row(const uint16_t *s, float *y, int d) {
  for (int i = 0; i < d; i++) y[i] = quant_f16_to_f32(s[i]);
}
static inline void q8_row(const uint8_t *rec, float *y, int d) { cpu_kv_decode(OPS_KV_Q8, rec, d, y); }
static inline void q4_row(const uint8_t *rec, float *y, int d) { cpu_kv_decode(OPS_KV_Q4, rec, d, y); }
static inline void tq_row(int type, const uint8_t *rec, float *y, int d) { cpu_kv_decode(type, rec, d, y); }
#endif

/* Micro-kernels. Accumulators are named variables (an array of 24 vectors is not kept in
 * registers by GCC). s_*: so[u * rp + lanes] = sum_d kr[u][d] qc[d * rp + lanes] for keys
 * u < nk (pointers past nk repeat key 0); pv_*: o[u * rp + lanes] = corr * o + sum_jj
 * vrow[jj][x + u] p[jj * rp + lanes]. */
#define K6(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define K8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define K4(X) X(0) X(1) X(2) X(3)

TGT static inline void FN(s_tile_1)(const float *qc, int64_t rp, int D, const float *const *krow, int nk, float *so) {
#define KP(u) const float *k##u = krow[u < nk ? u : 0];
#define AC(u) V a##u = vset(0);
  K8(KP) K8(AC)
#undef KP
#undef AC
  for (int d = 0; d < D; d++) {
    const V q = vld(qc + (int64_t)d * rp);
#define ST(u) a##u = vfma(vset(k##u[d]), q, a##u);
    K8(ST)
#undef ST
  }
#define SO(u) if (u < nk) vst(so + u * rp, a##u);
  K8(SO)
#undef SO
}

TGT static inline void FN(pv_col)(float *o, int64_t rp, const float *corr, const float *p, const float *const *vrow, int x,
                                   int jb, int je) {
  V acc = vmul(vld(o), vld(corr));
  for (int jj = jb; jj < je; jj++) acc = vfma(vset(vrow[jj][x]), vld(p + (int64_t)jj * rp), acc);
  vst(o, acc);
}

TGT static inline void FN(pv_tile_1)(float *o, int64_t rp, const float *corr, const float *p, const float *const *vrow,
                                      int x, int jb, int je) {
  const V cr = vld(corr);
#define AC(u) V a##u = vmul(vld(o + u * rp), cr);
  K8(AC)
#undef AC
  for (int jj = jb; jj < je; jj++) {
    const V pv = vld(p + (int64_t)jj * rp);
    const float *vr = vrow[jj] + x;
#define ST(u) a##u = vfma(vset(vr[u]), pv, a##u);
    K8(ST)
#undef ST
  }
#define SO(u) vst(o + u * rp, a##u);
  K8(SO)
#undef SO
}

#if S_MC == 4
/* 4 row vectors x 6 keys: 24 accumulators + 4 + 1 of 32 zmm */
TGT static inline void FN(s_tile_mc)(const float *qc, int64_t rp, int D, const float *const *krow, int nk, float *so) {
#define KP(u) const float *k##u = krow[u < nk ? u : 0];
#define AC(u) V a0_##u = vset(0), a1_##u = vset(0), a2_##u = vset(0), a3_##u = vset(0);
  K6(KP) K6(AC)
#undef KP
#undef AC
  for (int d = 0; d < D; d++) {
    const float *qd = qc + (int64_t)d * rp;
    const V q0 = vld(qd), q1 = vld(qd + VW), q2 = vld(qd + 2 * VW), q3 = vld(qd + 3 * VW);
#define ST(u)                                                                                                          \
  {                                                                                                                    \
    const V b = vset(k##u[d]);                                                                                         \
    a0_##u = vfma(b, q0, a0_##u), a1_##u = vfma(b, q1, a1_##u), a2_##u = vfma(b, q2, a2_##u), a3_##u = vfma(b, q3, a3_##u); \
  }
    K6(ST)
#undef ST
  }
#define SO(u)                                                                                                          \
  if (u < nk) {                                                                                                        \
    vst(so + u * rp, a0_##u), vst(so + u * rp + VW, a1_##u), vst(so + u * rp + 2 * VW, a2_##u);                         \
    vst(so + u * rp + 3 * VW, a3_##u);                                                                                 \
  }
  K6(SO)
#undef SO
}

/* 4 row vectors x 4 value dims: 16 accumulators; per key 4 loads + 4 broadcasts */
TGT static inline void FN(pv_tile_mc)(float *o, int64_t rp, const float *corr, const float *p, const float *const *vrow,
                                       int x, int jb, int je) {
  const V c0 = vld(corr), c1 = vld(corr + VW), c2 = vld(corr + 2 * VW), c3 = vld(corr + 3 * VW);
#define AC(u)                                                                                                          \
  V a0_##u = vmul(vld(o + u * rp), c0), a1_##u = vmul(vld(o + u * rp + VW), c1);                                        \
  V a2_##u = vmul(vld(o + u * rp + 2 * VW), c2), a3_##u = vmul(vld(o + u * rp + 3 * VW), c3);
  K4(AC)
#undef AC
  for (int jj = jb; jj < je; jj++) {
    const float *pj = p + (int64_t)jj * rp;
    const V p0 = vld(pj), p1 = vld(pj + VW), p2 = vld(pj + 2 * VW), p3 = vld(pj + 3 * VW);
    const float *vr = vrow[jj] + x;
#define ST(u)                                                                                                          \
  {                                                                                                                    \
    const V b = vset(vr[u]);                                                                                           \
    a0_##u = vfma(b, p0, a0_##u), a1_##u = vfma(b, p1, a1_##u), a2_##u = vfma(b, p2, a2_##u), a3_##u = vfma(b, p3, a3_##u); \
  }
    K4(ST)
#undef ST
  }
#define SO(u)                                                                                                          \
  vst(o + u * rp, a0_##u), vst(o + u * rp + VW, a1_##u), vst(o + u * rp + 2 * VW, a2_##u), vst(o + u * rp + 3 * VW, a3_##u);
  K4(SO)
#undef SO
}
#elif S_MC == 2
/* 2 row vectors x 6 keys: 12 accumulators + 2 + 1 of 16 ymm */
TGT static inline void FN(s_tile_mc)(const float *qc, int64_t rp, int D, const float *const *krow, int nk, float *so) {
#define KP(u) const float *k##u = krow[u < nk ? u : 0];
#define AC(u) V a0_##u = vset(0), a1_##u = vset(0);
  K6(KP) K6(AC)
#undef KP
#undef AC
  for (int d = 0; d < D; d++) {
    const float *qd = qc + (int64_t)d * rp;
    const V q0 = vld(qd), q1 = vld(qd + VW);
#define ST(u)                                                                                                          \
  {                                                                                                                    \
    const V b = vset(k##u[d]);                                                                                         \
    a0_##u = vfma(b, q0, a0_##u), a1_##u = vfma(b, q1, a1_##u);                                                        \
  }
    K6(ST)
#undef ST
  }
#define SO(u)                                                                                                          \
  if (u < nk) vst(so + u * rp, a0_##u), vst(so + u * rp + VW, a1_##u);
  K6(SO)
#undef SO
}

TGT static inline void FN(pv_tile_mc)(float *o, int64_t rp, const float *corr, const float *p, const float *const *vrow,
                                       int x, int jb, int je) {
  const V c0 = vld(corr), c1 = vld(corr + VW);
#define AC(u) V a0_##u = vmul(vld(o + u * rp), c0), a1_##u = vmul(vld(o + u * rp + VW), c1);
  K4(AC)
#undef AC
  for (int jj = jb; jj < je; jj++) {
    const float *pj = p + (int64_t)jj * rp;
    const V p0 = vld(pj), p1 = vld(pj + VW);
    const float *vr = vrow[jj] + x;
#define ST(u)                                                                                                          \
  {                                                                                                                    \
    const V b = vset(vr[u]);                                                                                           \
    a0_##u = vfma(b, p0, a0_##u), a1_##u = vfma(b, p1, a1_##u);                                                        \
  }
    K4(ST)
#undef ST
  }
#define SO(u) vst(o + u * rp, a0_##u), vst(o + u * rp + VW, a1_##u);
  K4(SO)
#undef SO
}
#endif
#undef K4
#undef K6
#undef K8

/* Pointer to the f32 values of key/value p of head kh (decoded into buf when the cache is
 * not f32, rotated when the cache is TurboQuant and the row came from the f32 ring). */
TGT static const float *FN(load_row)(const ops_attn_args *a, const void *const *tbl, const float *ring, int ring_src,
                                      int32_t p, int kh, int d, float *buf) {
  if (ring_src) {
    const float *src = ring + (int64_t)(p % a->ring_len) * a->n_kv_heads * d + (int64_t)kh * d;
    if (a->kv_type < OPS_KV_TQ2) return src;
    memcpy(buf, src, (size_t)d * sizeof(float));
    cpu_kv_rotate(buf, d);
    return buf;
  }
  const uint8_t *rec = kv_rec(tbl, a, p, kh * ops_kv_head_bytes(a->kv_type, d));
  switch (a->kv_type) {
  case OPS_KV_F32: return (const float *)rec;
  case OPS_KV_F16: f16_row((const uint16_t *)rec, buf, d); return buf;
  case OPS_KV_Q8: q8_row(rec, buf, d); return buf;
  case OPS_KV_Q4: q4_row(rec, buf, d); return buf;
  case OPS_KV_TQ2: case OPS_KV_TQ3: case OPS_KV_TQ4: tq_row(a->kv_type, rec, buf, d); return buf;
  default: cpu_kv_decode(a->kv_type, rec, d, buf); return buf;
  }
}

/* Runs item it over keys [kb, ke). partial = 0: writes the normalised rows to out; 1:
 * leaves m[rp], l[rp], O^T[vd][rp] at scr + rp * D for combine_parts. */
TGT static void FN(attn_item)(const attn_job *j, float *scr, const attn_item *it, int32_t kb, int32_t ke,
                              int partial) {
  const ops_attn_args *a = j->a;
  const int g = j->g, D = a->head_dim, vd = a->v_dim, R = it->nr;
  const int64_t rp = (R + VW - 1) / VW * VW, nc = rp / VW;
  const int rotated = a->kv_type >= OPS_KV_TQ2;
  float *qt = scr;              /* [D][rp] queries (scaled, rotated for TQ), transposed */
  float *mrow = qt + D * rp;    /* [rp] running max */
  float *lrow = mrow + rp;      /* [rp] running sum */
  float *ot = lrow + rp;        /* [vd][rp] output accumulators, transposed */
  float *st = ot + vd * rp;     /* [ATTN_T][rp] scores, then probabilities */
  int32_t *lo = (int32_t *)(st + ATTN_T * rp), *hi = lo + rp, *thr = hi + rp; /* [rp] each */
  float *kbuf = (float *)(thr + rp);         /* [ATTN_T][D] decoded keys */
  float *vbuf = kbuf + (int64_t)ATTN_T * D;  /* [ATTN_T][vd] decoded values */
  float *tmp = vbuf + (int64_t)ATTN_T * vd;  /* [max(D, vd)] */
  float *cbuf = tmp + (D > vd ? D : vd);      /* [rp] per-row rescale of the tile */
  const int ring_on = a->residual_len > 0 && a->k_ring;
  const int64_t hbk = ops_kv_head_bytes(a->kv_type, D), hbv = ops_kv_head_bytes(a->kv_type, vd);
  const void *const *ktbl = a->k_blocks[it->t0], *const *vtbl = a->v_blocks[it->t0];
  const float *kring = ring_on ? a->k_ring[it->t0] : NULL, *vring = ring_on ? a->v_ring[it->t0] : NULL;

  for (int64_t r = 0; r < rp; r++) {
    if (r < R) {
      const int64_t row = it->r0 + r, t = it->t0 + row / g;
      const int h = it->kh * g + (int)(row % g);
      const float *qr = j->q + (t * a->n_heads + h) * D;
      memcpy(tmp, qr, (size_t)D * sizeof(float));
      if (rotated) cpu_kv_rotate(tmp, D);
      for (int d = 0; d < D; d++) qt[d * rp + r] = tmp[d] * a->scale;
      const int32_t pos = a->pos[t];
      lo[r] = key_lo(a, pos), hi[r] = pos;
      thr[r] = ring_on ? pos - a->residual_len : INT32_MAX; /* keys p > thr come from the ring */
    } else {
      for (int d = 0; d < D; d++) qt[d * rp + r] = 0;
      lo[r] = 1, hi[r] = 0, thr[r] = INT32_MAX; /* padding: sees nothing */
    }
    mrow[r] = -INFINITY, lrow[r] = 0;
  }
  memset(ot, 0, (size_t)(vd * rp) * sizeof(float));

  const float *krow[ATTN_T], *vrow[ATTN_T];
  for (int32_t k0 = kb; k0 < ke; k0 += ATTN_T) {
    const int32_t k1 = k0 + ATTN_T < ke ? k0 + ATTN_T : ke; /* keys [k0, k1) */
    for (int src = 0; src < 1 + ring_on; src++) {
      /* Per-row key interval of this pass, and its union over rows. */
      int32_t ulo = INT32_MAX, uhi = INT32_MIN;
      for (int r = 0; r < R; r++) {
        int32_t l = lo[r] > k0 ? lo[r] : k0, h = hi[r] < k1 - 1 ? hi[r] : k1 - 1;
        if (src == 0) h = thr[r] < h ? thr[r] : h;
        else l = thr[r] + 1 > l ? thr[r] + 1 : l;
        if (l <= h) {
          ulo = l < ulo ? l : ulo;
          uhi = h > uhi ? h : uhi;
        }
      }
      if (ulo > uhi) continue;
      const int jb = ulo - k0, je = uhi - k0 + 1;
      for (int jj = jb; jj < je; jj++) {
        krow[jj] = FN(load_row)(a, ktbl, kring, src, k0 + jj, it->kh, D, kbuf + (int64_t)jj * D);
        vrow[jj] = FN(load_row)(a, vtbl, vring, src, k0 + jj, it->kh, vd, vbuf + (int64_t)jj * vd);
      }
      /* Few rows (decode) leave little compute per key to hide memory latency behind, and a
       * record is only a few cache lines, too short for the hardware stream prefetchers:
       * ask for the next tile's records now. */
      if (src == 0 && nc == 1 && k1 < ke)
        for (int32_t p = k1; p < ke && p < k1 + ATTN_T; p++) {
          const uint8_t *kr = kv_rec(ktbl, a, p, it->kh * hbk), *vr = kv_rec(vtbl, a, p, it->kh * hbv);
          for (int64_t o = 0; o < hbk; o += 64) __builtin_prefetch(kr + o);
          for (int64_t o = 0; o < hbv; o += 64) __builtin_prefetch(vr + o);
        }
      /* S^T[jj][r] = sum_d K[jj][d] Qt[d][r]: S_MC row vectors x S_NK keys of accumulators
       * (per dim: S_MC loads, S_NK broadcasts, S_MC * S_NK FMAs); leftover row vectors one
       * at a time. */
      int64_t c = 0;
#if S_MC > 1
      for (; c + S_MC <= nc; c += S_MC)
        for (int jj = jb; jj < je; jj += 6) {
          const int nk = je - jj < 6 ? je - jj : 6;
          FN(s_tile_mc)(qt + c * VW, rp, D, krow + jj, nk, st + (int64_t)jj * rp + c * VW);
        }
#endif
      for (; c < nc; c++)
        for (int jj = jb; jj < je; jj += 8) {
          const int nk = je - jj < 8 ? je - jj : 8;
          FN(s_tile_1)(qt + c * VW, rp, D, krow + jj, nk, st + (int64_t)jj * rp + c * VW);
        }
      if (a->softcap > 0)
        for (int jj = jb; jj < je; jj++)
          for (int64_t r = 0; r < rp; r++) {
            float *sp = st + (int64_t)jj * rp + r;
            *sp = a->softcap * tanhf(*sp / a->softcap);
          }
      /* mask and online softmax per vector of rows; corr = how much the old sums shrink */
      for (c = 0; c < nc; c++) {
        const int64_t r0 = c * VW;
        VI vlo = vild(lo + r0), vhi = vild(hi + r0);
        if (ring_on) {
          /* blocks: p <= thr; ring: p > thr. Rows of padding have thr = INT32_MAX. */
          int32_t l2[VW], h2[VW];
          for (int u = 0; u < VW; u++) {
            l2[u] = lo[r0 + u], h2[u] = hi[r0 + u];
            if (src == 0) h2[u] = thr[r0 + u] < h2[u] ? thr[r0 + u] : h2[u];
            else l2[u] = thr[r0 + u] == INT32_MAX ? 1 : (thr[r0 + u] + 1 > l2[u] ? thr[r0 + u] + 1 : l2[u]);
            if (src == 1 && thr[r0 + u] == INT32_MAX) h2[u] = 0;
          }
          vlo = vild(l2), vhi = vild(h2);
        }
        const V mold = vld(mrow + r0);
        V mx = mold;
        for (int jj = jb; jj < je; jj++) {
          float *sp = st + (int64_t)jj * rp + r0;
          const V sv = vsel_range(vld(sp), viset(k0 + jj), vlo, vhi);
          vst(sp, sv);
          mx = vmax(mx, sv);
        }
        const V muse = vfinite0(mx);
        const V corr = vexp(vsub(mold, muse));
        V sum = vset(0);
        for (int jj = jb; jj < je; jj++) {
          float *sp = st + (int64_t)jj * rp + r0;
          const V e = vexp(vsub(vld(sp), muse));
          vst(sp, e);
          sum = vadd(sum, e);
        }
        vst(lrow + r0, vadd(vmul(vld(lrow + r0), corr), sum));
        vst(mrow + r0, mx);
        vst(cbuf + r0, corr);
      }
      /* O^T[x][r] = corr[r] O^T[x][r] + sum_jj V[jj][x] P^T[jj][r]: P_MC row vectors x P_NX
       * value dims of accumulators; leftovers one row vector / one dim at a time. */
      c = 0;
#if P_MC > 1
      for (; c + P_MC <= nc; c += P_MC) {
        int x = 0;
        for (; x + 4 <= vd; x += 4) FN(pv_tile_mc)(ot + (int64_t)x * rp + c * VW, rp, cbuf + c * VW, st + c * VW, vrow, x, jb, je);
        for (; x < vd; x++)
          for (int m = 0; m < P_MC; m++) FN(pv_col)(ot + (int64_t)x * rp + (c + m) * VW, rp, cbuf + (c + m) * VW, st + (c + m) * VW, vrow, x, jb, je);
      }
#endif
      for (; c < nc; c++) {
        int x = 0;
        for (; x + 8 <= vd; x += 8) FN(pv_tile_1)(ot + (int64_t)x * rp + c * VW, rp, cbuf + c * VW, st + c * VW, vrow, x, jb, je);
        for (; x < vd; x++) FN(pv_col)(ot + (int64_t)x * rp + c * VW, rp, cbuf + c * VW, st + c * VW, vrow, x, jb, je);
      }
    }
  }
  if (partial) return;
  for (int r = 0; r < R; r++) {
    const int64_t row = it->r0 + r, t = it->t0 + row / g;
    float *o = j->out + (t * a->n_heads + (int64_t)it->kh * g + row % g) * vd;
    const float inv = lrow[r] > 0 ? 1.0f / lrow[r] : 0.0f;
    for (int x = 0; x < vd; x++) o[x] = ot[(int64_t)x * rp + r] * inv;
    if (rotated) cpu_kv_unrotate(o, vd);
  }
}

#undef TGT
#undef VW
#undef S_MC
#undef P_MC
#undef FN
#undef V
#undef VI
#undef vld
#undef vst
#undef vset
#undef vfma
#undef vmul
#undef vadd
#undef vsub
#undef vmax
#undef vild
#undef viset
#undef vsel_range
#undef vfinite0
#undef vexp
#undef f16_row
#undef q8_row
#undef q4_row
#undef tq_row

#endif /* ATTN_ISA */
