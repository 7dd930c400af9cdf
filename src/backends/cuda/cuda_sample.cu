/* cuda_sample.cu: the topk op (ops.h), sampling candidates on the device: per logits row the k
 * best (value, index) pairs in the host sampler's order, the row's max and softmax sum.
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
