/* cuda_sample.cu: the sampling ops of ops.h on the device. topk: sampling candidates, per logits
 * row the k best (value, index) pairs in the host sampler's order, the row's max and softmax
 * sum; sample_tail: the sampler's draw past its sorted head (below); mask_rows: rejection
 * bitsets applied as -inf.
 *
 * Each candidate is one 64-bit key, (order-preserving bits of the value) << 32 | (~index), so
 * that "larger key" is exactly "larger value, then lower index" and keys are distinct; NaN is
 * keyed as -inf and -0 as +0. Key 0 (below every real key: -inf's upper half is 0x007fffff)
 * pads. Two kinds of launches, both one block of TK_THREADS per (group, row), keys bitonic-
 * sorted in shared memory (at most TK_SORT keys, 32 KB):
 *   slice:  the row is cut into slices of TK_SORT logits; each block sorts its slice and keeps
 *           the first k keys (k = 1: a block max instead of the sort), plus the slice's max
 *           m_s and sum_s = sum exp((l - m_s) / temp) for the softmax sum (temp > 0 only);
 *   merge:  TK_SORT / k groups of k keys per block are sorted and the first k kept, level by
 *           level until one group is left; that last level writes idx / val and folds the
 *           slices' (m_s, sum_s) into the row's sum (double, scaled to the row's max).
 * At 248k logits that is 61 slice blocks and one merge for k <= 67 (two beyond). The key
 * levels live in the backend's topk scratch (allocated at creation); rows that do not fit run
 * in several passes, so nothing is allocated per call. Launch arguments depend only on the
 * shape (rows, vocab, k, temp), never on the logits: a decode step's graph replays unchanged. */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_math.cuh"

#include "base/error.h"

#define TK_THREADS 1024
#define TK_SORT 4096 /* keys sorted per block (a slice of logits, or merged groups); a power of two */

static __device__ __forceinline__ uint64_t tk_key(float x, int64_t i) {
  if (isnan(x)) x = -INFINITY;
  if (x == 0.0f) x = 0.0f; /* -0 ranks as +0 */
  uint32_t b = __float_as_uint(x);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ((uint64_t)b << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
}

static __device__ __forceinline__ float tk_val(uint64_t key) {
  uint32_t b = (uint32_t)(key >> 32);
  b = (b & 0x80000000u) ? (b & 0x7fffffffu) : ~b;
  return __uint_as_float(b);
}

static __device__ __forceinline__ int32_t tk_idx(uint64_t key) {
  return (int32_t)(0xffffffffu - (uint32_t)key);
}

/* Largest key over the block; every thread gets it. Also a barrier. */
static __device__ __forceinline__ uint64_t tk_block_max(uint64_t v) {
  __shared__ uint64_t part[32];
  __shared__ uint64_t total;
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  if (lane == 0) part[wid] = v;
  __syncthreads();
  if (wid == 0) {
    uint64_t s = lane < (int)(blockDim.x >> 5) ? part[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) {
      const uint64_t w = __shfl_xor_sync(0xffffffffu, s, o);
      s = w > s ? w : s;
    }
    if (lane == 0) total = s;
  }
  __syncthreads();
  const uint64_t r = total;
  __syncthreads();
  return r;
}

/* Sum over the block in double; every thread gets it. Also a barrier. */
static __device__ __forceinline__ double tk_block_sum(double v) {
  __shared__ double part[32];
  __shared__ double total;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  if (lane == 0) part[wid] = v;
  __syncthreads();
  if (wid == 0) {
    double s = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const double r = total;
  __syncthreads();
  return r;
}

/* Sorts a[0, P) descending (P a power of two; P <= 1 is sorted). Bitonic: for block size
 * `size`, pairs (i, i + stride) inside a block whose `size` bit of i is clear are ordered
 * descending, the others ascending; the last block (size = P) leaves all descending. Ends
 * with a barrier. */
static __device__ void tk_sort_desc(uint64_t *a, int P) {
  for (int size = 2; size <= P; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int t = threadIdx.x; t < P / 2; t += blockDim.x) {
        const int i = ((t & ~(stride - 1)) << 1) | (t & (stride - 1)), j = i + stride; /* stride: a power of two */
        const bool desc = (i & size) == 0;
        const uint64_t x = a[i], y = a[j];
        if ((x < y) == desc) a[i] = y, a[j] = x;
      }
    }
  __syncthreads();
}

/* Slice s = blockIdx.x of row blockIdx.y: logits [s * TK_SORT, + n) of the row; the k best
 * keys (padded with 0 when the slice is shorter) to keys[(row * S + s) * k ..], and
 * part[(row * S + s) * 2 ..] = (m_s, sum_s). P: the sort size (a power of two >= the slice
 * length, <= TK_SORT), the dynamic shared memory in keys. */
static __global__ void k_topk_slice(uint64_t *keys, double *part, const float *logits, int64_t vocab, int S, int k,
                                    int P, float inv_t) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  extern __shared__ uint64_t tk_a[];
  const int64_t row = blockIdx.y, s = blockIdx.x;
  const float *l = logits + row * vocab;
  const int64_t beg = s * (int64_t)TK_SORT;
  const int n = (int)(vocab - beg < TK_SORT ? vocab - beg : TK_SORT);
  uint64_t *ko = keys + (row * S + s) * k;
  uint64_t best;
  if (k == 1) { /* greedy: the largest key, no sort */
    uint64_t m = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const uint64_t q = tk_key(l[beg + i], beg + i);
      m = q > m ? q : m;
    }
    best = tk_block_max(m);
    if (threadIdx.x == 0) ko[0] = best;
  } else {
    for (int i = threadIdx.x; i < P; i += blockDim.x) tk_a[i] = i < n ? tk_key(l[beg + i], beg + i) : 0;
    tk_sort_desc(tk_a, P);
    best = tk_a[0];
    for (int j = threadIdx.x; j < k; j += blockDim.x) ko[j] = j < P ? tk_a[j] : 0;
  }
  /* The slice's softmax terms relative to its own max (an all -inf slice adds nothing). */
  const float ms = tk_val(best);
  float acc = 0.0f;
  if (ms > -INFINITY && inv_t > 0) /* inv_t 0: no sum wanted (temp <= 0) */
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float d = (l[beg + i] - ms) * inv_t;
      if (d <= 0.0f) acc += expf(d); /* NaN (a NaN logit, or inf - inf) adds 0, as on the CPU */
    }
  const double sum = tk_block_sum((double)acc);
  if (threadIdx.x == 0) {
    part[(row * S + s) * 2] = ms;
    part[(row * S + s) * 2 + 1] = sum;
  }
}

/* Merge level: block (g, row) sorts groups [g * G, + G) (of n_groups per row, k keys each) and
 * keeps the first k: to out[(row * gridDim.x + g) * k ..], or, on the last level (idx != NULL,
 * gridDim.x == 1), to idx / val[row * k ..] with stats[row * 2 ..] from the S slices' part. */
static __global__ void k_topk_merge(uint64_t *out, const uint64_t *in, int64_t n_groups, int k, int G, int P,
                                    int32_t *idx, float *val, double *stats, const double *part, int S,
                                    float inv_t) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  extern __shared__ uint64_t tk_a[];
  const int64_t row = blockIdx.y, g0 = (int64_t)blockIdx.x * G;
  const int64_t ng = n_groups - g0 < G ? n_groups - g0 : G;
  const int n = (int)(ng * k);
  const uint64_t *src = in + (row * n_groups + g0) * k;
  for (int i = threadIdx.x; i < P; i += blockDim.x) tk_a[i] = i < n ? src[i] : 0;
  tk_sort_desc(tk_a, P);
  if (!idx) {
    uint64_t *o = out + (row * gridDim.x + blockIdx.x) * k;
    for (int j = threadIdx.x; j < k; j += blockDim.x) o[j] = tk_a[j];
    return;
  }
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    idx[row * k + j] = tk_idx(tk_a[j]);
    val[row * k + j] = tk_val(tk_a[j]);
  }
  /* z = sum_s sum_s * exp((m_s - M) / temp), M the row's max (= the best key's value). */
  const double M = tk_val(tk_a[0]);
  const double *pr = part + row * (int64_t)S * 2;
  double z = 0;
  if (M > -INFINITY && inv_t > 0)
    for (int s = threadIdx.x; s < S; s += blockDim.x)
      if (pr[2 * s + 1] > 0 && pr[2 * s] - M <= 0) z += pr[2 * s + 1] * exp((pr[2 * s] - M) * (double)inv_t);
  z = tk_block_sum(z);
  if (threadIdx.x == 0) {
    stats[row * 2] = M;
    stats[row * 2 + 1] = z;
  }
}

static int tk_pow2_at_least(int64_t n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

void cuda_op_topk(ops_backend *be, int32_t *idx, float *val, double *stats, const float *logits, int64_t rows,
                  int64_t vocab, int k, float temp) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || rows <= 0) return;
  if (k < 1 || k > OPS_TOPK_MAX || k > vocab || vocab >= INT32_MAX) {
    cuda_fail(ci, ANNA_EINVAL, "cuda topk: k %d of vocabulary %lld (need 1 <= k <= %d, k <= vocabulary)", k,
              (long long)vocab, OPS_TOPK_MAX);
    return;
  }
  const float inv_t = temp > 0 ? 1.0f / temp : 0.0f; /* 0: the softmax sum is not wanted */
  const int64_t S = (vocab + TK_SORT - 1) / TK_SORT; /* slices per row */
  const int G = TK_SORT / k;                         /* groups per merge block */
  const int64_t S1 = (S + G - 1) / G;                /* groups after the first merge */
  /* Per row: level keys ping-pong between A (S groups) and B (S1 groups; later levels are
   * smaller still and alternate), plus the slices' (m_s, sum_s). */
  const size_t row_bytes = (size_t)(S + S1) * (size_t)k * sizeof(uint64_t) + (size_t)S * 2 * sizeof(double);
  int64_t R = (int64_t)(ci->topk_scr_bytes / row_bytes);
  if (R > 65535) R = 65535; /* grid.y */
  if (R < 1) {
    cuda_fail(ci, ANNA_EINVAL, "cuda topk: a vocabulary of %lld does not fit the %zu-byte scratch", (long long)vocab,
              ci->topk_scr_bytes);
    return;
  }
  const int P1 = tk_pow2_at_least(vocab < TK_SORT ? vocab : TK_SORT);
  for (int64_t r0 = 0; r0 < rows; r0 += R) {
    const int64_t nr = rows - r0 < R ? rows - r0 : R;
    uint64_t *A = (uint64_t *)ci->topk_scr, *B = A + nr * S * k;
    double *part = (double *)(B + nr * S1 * k);
    cuda_launch_pdl(ci, "topk slice", k_topk_slice, dim3((unsigned)S, (unsigned)nr), TK_THREADS,
                    k == 1 ? 0 : (size_t)P1 * sizeof(uint64_t), A, part, logits + r0 * vocab, vocab, (int)S, k, P1,
                    inv_t);
    uint64_t *cur = A;
    int64_t ng = S;
    for (;;) {
      const int64_t nout = (ng + G - 1) / G;
      const int P = tk_pow2_at_least((ng < G ? ng : G) * k);
      if (nout == 1) {
        cuda_launch_pdl(ci, "topk merge", k_topk_merge, dim3(1, (unsigned)nr), TK_THREADS, (size_t)P * sizeof(uint64_t),
                        (uint64_t *)NULL, cur, ng, k, G, P, idx + r0 * k, val + r0 * k, stats + r0 * 2, part, (int)S,
                        inv_t);
        break;
      }
      uint64_t *nxt = cur == A ? B : A;
      cuda_launch_pdl(ci, "topk merge", k_topk_merge, dim3((unsigned)nout, (unsigned)nr), TK_THREADS,
                      (size_t)P * sizeof(uint64_t), nxt, cur, ng, k, G, P, (int32_t *)NULL, (float *)NULL,
                      (double *)NULL, part, (int)S, inv_t);
      cur = nxt;
      ng = nout;
    }
  }
}

/* ---- the sampler's tail (ops.h sample_tail) ----
 * Two launches for all the draws: k_tail_chunks, one block per (chunk of TL_CHUNK tokens,
 * draw), sums the chunk's kept q_t (double; head ids marked in a shared bitmap) and notes its
 * last kept token; k_tail_walk, one block per draw, adds the chunk sums to `sum` in chunk
 * order, finds the chunk where the remaining u crosses zero, recomputes that chunk's q_t into
 * shared memory, sums them in segments of TL_SEG and walks the crossing segment's q_t in
 * vocabulary order on one thread, as the sampler does. q_t is computed with the CPU's
 * arithmetic (ops_exp_nonpos in round-to-nearest steps, no contraction, an IEEE double
 * division), so every q_t has the CPU's bits; only the order of the additions differs. */
#define TL_CHUNK 2048
#define TL_THREADS 256
#define TL_SEG (TL_CHUNK / TL_THREADS) /* tokens per segment of the crossing chunk's walk */

/* ops_exp_nonpos (ops.h) step by step: each operation rounded as the C code's (no FMA). */
static __device__ __forceinline__ float tl_exp_nonpos(float x) {
  const bool under = !(x >= -87.0f); /* also NaN */
  x = under ? -87.0f : x;
  const float k = rintf(__fmul_rn(x, 1.44269504f));
  const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(k, 0.693145752f)), __fmul_rn(k, 1.42860677e-6f));
  float y = 1.0f / 720;
  y = __fadd_rn(__fmul_rn(y, r), 1.0f / 120);
  y = __fadd_rn(__fmul_rn(y, r), 1.0f / 24);
  y = __fadd_rn(__fmul_rn(y, r), 1.0f / 6);
  y = __fadd_rn(__fmul_rn(y, r), 0.5f);
  y = __fadd_rn(__fmul_rn(y, r), 1.0f);
  y = __fadd_rn(__fmul_rn(y, r), 1.0f);
  const float sc = __int_as_float(((int)k + 127) << 23);
  return under ? 0.0f : __fmul_rn(y, sc);
}

/* q_t of the sampler: (float)(exp / z), 0 where not kept (a kept q is > 0). */
static __device__ __forceinline__ float tl_q(float l, float inv_t, float mx, double z, float floor) {
  const float e = tl_exp_nonpos(__fsub_rn(__fmul_rn(l, inv_t), mx));
  const float q = (float)__ddiv_rn((double)e, z);
  return q > 0.0f && q >= floor ? q : 0.0f;
}

/* Marks the head ids that fall in [beg, beg + TL_CHUNK) in bm (TL_CHUNK bits). Ends with a barrier. */
static __device__ void tl_mark_head(unsigned *bm, const int32_t *head, int nh, int64_t beg) {
  for (int i = threadIdx.x; i < TL_CHUNK / 32; i += blockDim.x) bm[i] = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < nh; j += blockDim.x) {
    const int64_t o = (int64_t)head[j] - beg;
    if (o >= 0 && o < TL_CHUNK) atomicOr(&bm[o >> 5], 1u << (o & 31));
  }
  __syncthreads();
}

/* Block (c, i): draw i's chunk c: part[i * C + c] = the chunk's kept mass, last[..] = its last
 * kept token (-1: none). */
static __global__ void k_tail_chunks(double *part, int32_t *last, const float *logits, int64_t vocab,
                                     const ops_tail_req *req, int C) {
  __shared__ unsigned bm[TL_CHUNK / 32];
  __shared__ int lastk[TL_THREADS / 32];
  const ops_tail_req *q = req + blockIdx.y;
  const float *l = logits + q->row * vocab;
  const float inv_t = q->inv_t, mx = q->mx, floor = q->floor;
  const double z = q->z;
  const int64_t beg = (int64_t)blockIdx.x * TL_CHUNK;
  const int n = (int)(vocab - beg < TL_CHUNK ? vocab - beg : TL_CHUNK);
  tl_mark_head(bm, q->head, q->nh, beg);
  double acc = 0;
  int lk = -1;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (bm[i >> 5] >> (i & 31) & 1u) continue;
    const float p = tl_q(l[beg + i], inv_t, mx, z, floor);
    if (p > 0.0f) acc += (double)p, lk = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const int w = __shfl_xor_sync(0xffffffffu, lk, o);
    lk = w > lk ? w : lk;
  }
  if ((threadIdx.x & 31) == 0) lastk[threadIdx.x >> 5] = lk;
  const double s = tk_block_sum(acc); /* a barrier: lastk is complete */
  if (threadIdx.x == 0) {
    int m = -1;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) m = lastk[w] > m ? lastk[w] : m;
    part[(int64_t)blockIdx.y * C + blockIdx.x] = s;
    last[(int64_t)blockIdx.y * C + blockIdx.x] = m < 0 ? -1 : (int32_t)(beg + m);
  }
}

/* Block i: draw i's out->sum, and out->tok by the walk (u > 0). */
static __global__ void k_tail_walk(ops_tail_out *outs, const double *parts, const int32_t *lasts, int C,
                                   const float *logits, int64_t vocab, const ops_tail_req *req) {
  __shared__ unsigned bm[TL_CHUNK / 32];
  __shared__ float qs[TL_CHUNK];
  __shared__ double seg[TL_THREADS];
  __shared__ int32_t lst[TL_THREADS];
  __shared__ int cross;
  __shared__ double ucross;
  const ops_tail_req *q = req + blockIdx.x;
  ops_tail_out *out = outs + blockIdx.x;
  const double *part = parts + (int64_t)blockIdx.x * C;
  const int32_t *last = lasts + (int64_t)blockIdx.x * C;
  const float *l = logits + q->row * vocab;
  const double u = q->u;
  /* The chunk sums in chunk order on thread 0, staged through shared memory a tile of
   * TL_THREADS at a time (one coalesced load each, not C dependent global loads). */
  double tot = q->sum, uw = u;
  int cx = -1;
  int32_t lastk = -1;
  for (int t0 = 0; t0 < C; t0 += TL_THREADS) {
    const int nt = C - t0 < TL_THREADS ? C - t0 : TL_THREADS;
    if (threadIdx.x < nt) seg[threadIdx.x] = part[t0 + threadIdx.x], lst[threadIdx.x] = last[t0 + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0)
      for (int c = 0; c < nt; c++) {
        tot += seg[c];
        lastk = lst[c] >= 0 ? lst[c] : lastk;
        if (u > 0 && cx < 0) {
          if (seg[c] > 0 && __dsub_rn(uw, seg[c]) <= 0) {
            cx = t0 + c;
          } else {
            uw = __dsub_rn(uw, seg[c]);
          }
        }
      }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out->sum = tot;
    out->pad_ = 0;
    /* u outlasts the kept mass (rounding): the last kept token */
    out->tok = u > 0 && cx < 0 ? lastk : -1;
    cross = cx;
    ucross = uw;
  }
  __syncthreads();
  const int c0 = cross;
  if (c0 < 0) return;
  const int64_t beg = (int64_t)c0 * TL_CHUNK;
  const int n = (int)(vocab - beg < TL_CHUNK ? vocab - beg : TL_CHUNK);
  tl_mark_head(bm, q->head, q->nh, beg);
  for (int i = threadIdx.x; i < TL_CHUNK; i += blockDim.x)
    qs[i] = i >= n || (bm[i >> 5] >> (i & 31) & 1u) ? 0.0f : tl_q(l[beg + i], q->inv_t, q->mx, q->z, q->floor);
  __syncthreads();
  /* The chunk in TL_THREADS segments of TL_SEG tokens: each thread sums its segment in order,
   * thread 0 finds the segment where u crosses and walks its tokens one by one (a sequential
   * walk over the whole chunk cost 2048 dependent double subtractions). */
  const int g = threadIdx.x;
  double a = 0;
  for (int j = 0; j < TL_SEG; j++) a += (double)qs[g * TL_SEG + j];
  seg[g] = a;
  __syncthreads();
  if (threadIdx.x == 0) {
    double uu = ucross;
    int s0 = -1;
    for (int w = 0; w < TL_THREADS; w++) {
      if (seg[w] > 0 && __dsub_rn(uu, seg[w]) <= 0) {
        s0 = w;
        break;
      }
      uu = __dsub_rn(uu, seg[w]);
    }
    int32_t tok = -1;
    if (s0 < 0) { /* the chunk's own order falls short of its sum (rounding): its last kept token */
      for (int i = n - 1; i >= 0 && tok < 0; i--)
        if (qs[i] > 0.0f) tok = (int32_t)(beg + i);
    } else {
      for (int i = s0 * TL_SEG; i < (s0 + 1) * TL_SEG; i++) {
        if (!(qs[i] > 0.0f)) continue;
        tok = (int32_t)(beg + i);
        uu = __dsub_rn(uu, (double)qs[i]);
        if (uu <= 0) break;
      }
    }
    out->tok = tok; /* a segment's last kept token when its order falls short (rounding) */
  }
}

void cuda_op_sample_tail(ops_backend *be, ops_tail_out *out, const float *logits, int64_t vocab,
                         const ops_tail_req *req, int n) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  const int64_t C = (vocab + TL_CHUNK - 1) / TL_CHUNK;
  const size_t row_bytes = (size_t)C * (sizeof(double) + sizeof(int32_t));
  if (vocab < 1 || vocab >= INT32_MAX || row_bytes > ci->topk_scr_bytes) {
    cuda_fail(ci, ANNA_EINVAL, "cuda sample_tail: vocabulary %lld", (long long)vocab);
    return;
  }
  /* topk's scratch (the same stream, never at once): draws in groups that fit it */
  int64_t G = (int64_t)(ci->topk_scr_bytes / row_bytes);
  if (G > 65535) G = 65535; /* grid.y */
  for (int64_t i0 = 0; i0 < n; i0 += G) {
    const int64_t m = n - i0 < G ? n - i0 : G;
    double *part = (double *)ci->topk_scr;
    int32_t *last = (int32_t *)(part + m * C);
    cuda_launch(ci, "sample_tail chunks", k_tail_chunks, dim3((unsigned)C, (unsigned)m), TL_THREADS, 0, part, last,
                logits, vocab, req + i0, (int)C);
    cuda_launch(ci, "sample_tail walk", k_tail_walk, dim3((unsigned)m), TL_THREADS, 0, out + i0, (const double *)part,
                (const int32_t *)last, (int)C, logits, vocab, req + i0);
  }
}

/* ---- ops.h mask_rows: one thread per bitset word ---- */
static __global__ void k_mask_rows(float *logits, int64_t vocab, const int32_t *rows, const uint64_t *bits,
                                   int64_t words) {
  const int64_t w = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (w >= words) return;
  uint64_t m = bits[(int64_t)blockIdx.y * words + w];
  float *r = logits + (int64_t)rows[blockIdx.y] * vocab;
  while (m) {
    const int64_t t = w * 64 + __ffsll((long long)m) - 1;
    m &= m - 1;
    if (t < vocab) r[t] = -INFINITY;
  }
}

void cuda_op_mask_rows(ops_backend *be, float *logits, int64_t vocab, const int32_t *rows, const uint64_t *bits,
                       int64_t n) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  if (n > 65535) {
    cuda_fail(ci, ANNA_EINVAL, "cuda mask_rows: %lld rows (at most 65535)", (long long)n);
    return;
  }
  const int64_t words = (vocab + 63) / 64;
  cuda_launch(ci, "mask_rows", k_mask_rows, dim3((unsigned)((words + 255) / 256), (unsigned)n), 256, 0, logits, vocab,
              rows, bits, words);
}
