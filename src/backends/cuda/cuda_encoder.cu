/* cuda_encoder.cu: the encoder and waveform decoder ops of ops.h ("Encoder ops", "Waveform
 * decoder ops") on the device: LayerNorm, GELU (tanh and erf), segmented bidirectional
 * attention, the weighted row gather, dense / depthwise / transposed causal conv1d, SnakeBeta,
 * the channel-scaled add, clamp and the 3x3 stride-2 im2col. The CPU versions
 * (backends/cpu/cpu_vision.c, cpu_conv.c, cpu_audio.c) are the references; results agree
 * within f32 rounding (sums run in another order), not bit for bit.
 *
 * Every launch goes through cuda_launch and no op calls cuBLAS or waits on the host, so all of
 * them are recordable inside a step (the vision and ASR encoders bracket their pass with
 * step_begin: a small image is a recorded step). Model vectors (norm weights, conv weights and
 * biases, SnakeBeta parameters, layer scales) are host memory owned by the model and mirrored
 * by address on first use (cuda_mirror), as every weight. attention_seg copies its segment
 * offsets (host memory) through the pinned ring. */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_math.cuh"
#include "backends/cuda/cuda_quant.cuh"

#include "base/error.h"
#include "ops/ops.h"

#include <math.h>

#define EW_THREADS 256
#define MAX_GRID 0x7fffffffLL

static unsigned ew_grid(int64_t n) {
  int64_t b = (n + EW_THREADS - 1) / EW_THREADS;
  if (b < 1) b = 1;
  if (b > 65536 * 4) b = 65536 * 4; /* grid-stride loops take the rest */
  return (unsigned)b;
}

/* A mirrored model vector of `count` floats (NULL with a sticky error set when it fails or
 * host is NULL and required). */
static const float *vec_dev(ops_backend *be, const float *host, int64_t count) {
  return host ? (const float *)cuda_mirror(be, host, (size_t)count * sizeof(float)) : NULL;
}

/* ---- LayerNorm: one block per row; two passes in float (mean, then the centred variance,
 * as the CPU's two passes in double) so a row with a large offset keeps its spread. ---- */

static __global__ void k_layer_norm(float *y, const float *x, const float *w, const float *b, int d, float eps) {
  const int64_t row = blockIdx.x;
  const float *xr = x + row * d;
  float *yr = y + row * d;
  float s = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) s += xr[i];
  const float mean = cuda_block_sum(s) / (float)d;
  float v = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float c = xr[i] - mean;
    v += c * c;
  }
  const float inv = 1.0f / sqrtf(cuda_block_sum(v) / (float)d + eps);
  /* each element is read and written by the same thread after both sums: in place is safe */
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float t = (xr[i] - mean) * inv * w[i];
    yr[i] = b ? t + b[i] : t;
  }
}

static void cuda_op_layer_norm(ops_backend *be, float *y, const float *x, const float *w, const float *b,
                               int64_t rows, int d, float eps) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || rows <= 0) return;
  if (d <= 0 || !w) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: layer_norm of width %d %s", d, w ? "" : "without a weight");
    return;
  }
  const float *wd = vec_dev(be, w, d), *bd = vec_dev(be, b, d);
  if (!wd || (b && !bd)) return;
  int th = (d + 31) / 32 * 32;
  th = th > 512 ? 512 : th;
  for (int64_t r0 = 0; r0 < rows; r0 += MAX_GRID) {
    const int64_t cnt = rows - r0 < MAX_GRID ? rows - r0 : MAX_GRID;
    cuda_launch(ci, "layer_norm", k_layer_norm, (unsigned)cnt, th, 0, y + r0 * d, x + r0 * d, wd, bd, d, eps);
  }
}

/* ---- GELU, in place ---- */

static __global__ void k_gelu(float *y, int64_t n, int exact) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  if (exact) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
      y[i] = 0.5f * y[i] * (1.0f + erff(y[i] * 0.70710678118654752f));
  } else {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) y[i] = cuda_gelu_tanh(y[i]);
  }
}

static void cuda_op_gelu(ops_backend *be, float *y, int64_t n, int exact) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  cuda_launch(ci, "gelu", k_gelu, ew_grid(n), EW_THREADS, 0, y, n, exact);
}

/* ---- Segmented bidirectional attention ----
 * Flash-style in f32 on the CUDA cores: a block takes SEG_BQ = 64 consecutive queries of one
 * head and walks the keys of their segments in tiles of SEG_BK = 64 (O(tile) memory whatever
 * the segment length). 256 threads as 16 x 16: thread (ty, tx) scores queries ty*4 .. +3
 * against keys tx*4 .. +3 of the tile (Q and K transposed in shared memory: one float4 of
 * each per head dim feeds 16 FMAs), keeps the online softmax of its 4 rows (running max m and
 * sum l, the 16 threads of a row agreeing through shuffles) and accumulates output columns
 * tx + 16 c (c < DC, DC = ceil(head_dim / 16)) of those rows from P (in shared memory) and
 * the V tile. A block whose queries straddle segments walks the union of their segments,
 * masking per row the keys outside its own (segments of one row: one tile, one key each).
 * Scores are dot * scale and tiles rescale only when the max rises, as the CPU reference. */
#define SEG_BQ 64
#define SEG_BK 64
#define SEG_FQ (SEG_BQ + 4) /* padded rows: float4-aligned, fewer bank conflicts on the stores */
#define SEG_FK (SEG_BK + 4)

/* Segment of token t: largest i with seg[i] <= t. */
static __device__ int seg_find(const int64_t *seg, int n_seg, int64_t t) {
  int lo = 0, hi = n_seg - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (seg[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* Shared floats of one block: Q^T [D][FQ], then one buffer for K^T [D][FK] or V [BK][16 DC],
 * then P^T [BK][FQ]. */
static __host__ __device__ int seg_kv_floats(int D, int DC) {
  return D * SEG_FK > SEG_BK * 16 * DC ? D * SEG_FK : SEG_BK * 16 * DC;
}
static size_t seg_smem_bytes(int D, int DC) {
  return sizeof(float) * ((size_t)D * SEG_FQ + (size_t)seg_kv_floats(D, DC) + (size_t)SEG_BK * SEG_FQ);
}

template <int DC>
static __global__ void __launch_bounds__(256)
    k_seg_attn(float *out, const float *q, const float *k, const float *v, int64_t qs, int64_t ks, int64_t vs,
               const int64_t *seg, int n_seg, int64_t n, int H, int D, float scale) {
  extern __shared__ float4 seg_sm4[];
  float *Qt = (float *)seg_sm4;
  float *KV = Qt + D * SEG_FQ;
  float *Pt = KV + seg_kv_floats(D, DC);
  __shared__ int64_t sq0[SEG_BQ], sq1[SEG_BQ];
  const int DP = 16 * DC;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4, h = blockIdx.y;
  const int64_t q0 = (int64_t)blockIdx.x * SEG_BQ;
  const int nq = (int)(n - q0 < SEG_BQ ? n - q0 : SEG_BQ);
  const int64_t hoff = (int64_t)h * D;
  for (int i = tid; i < SEG_BQ; i += 256) {
    int64_t a = 0, b = 0; /* a row past n: no keys */
    if (i < nq) {
      const int sg = seg_find(seg, n_seg, q0 + i);
      a = seg[sg], b = seg[sg + 1];
    }
    sq0[i] = a, sq1[i] = b;
  }
  for (int e = tid; e < SEG_BQ * D; e += 256) {
    const int i = e / D, d = e - i * D;
    Qt[d * SEG_FQ + i] = i < nq ? q[(q0 + i) * qs + hoff + d] : 0.0f;
  }
  __syncthreads();
  const int64_t lo = sq0[0], hi = sq1[nq - 1];
  int64_t r0[4], r1[4];
  float o[4][DC], m[4], l[4];
#pragma unroll
  for (int r = 0; r < 4; r++) {
    r0[r] = sq0[ty * 4 + r], r1[r] = sq1[ty * 4 + r];
    m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < DC; c++) o[r][c] = 0.0f;
  }
  for (int64_t j0 = lo; j0 < hi; j0 += SEG_BK) {
    const int nt = (int)(hi - j0 < SEG_BK ? hi - j0 : SEG_BK);
    for (int e = tid; e < SEG_BK * D; e += 256) {
      const int j = e / D, d = e - j * D;
      KV[d * SEG_FK + j] = j < nt ? k[(j0 + j) * ks + hoff + d] : 0.0f;
    }
    __syncthreads();
    float s[4][4];
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
      for (int c = 0; c < 4; c++) s[r][c] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < D; d++) {
      const float4 a = *(const float4 *)&Qt[d * SEG_FQ + ty * 4];
      const float4 b = *(const float4 *)&KV[d * SEG_FK + tx * 4];
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int r = 0; r < 4; r++)
#pragma unroll
        for (int c = 0; c < 4; c++) s[r][c] += av[r] * bv[c];
    }
    float p[4][4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int64_t key = j0 + tx * 4 + c;
        const bool valid = tx * 4 + c < nt && key >= r0[r] && key < r1[r];
        s[r][c] = valid ? s[r][c] * scale : -INFINITY;
        mx = fmaxf(mx, s[r][c]);
      }
      /* the row's 16 threads are one half of a warp: lanes differing in the low 4 bits */
      for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float mn = fmaxf(m[r], mx);
      const float rs = mn == -INFINITY ? 1.0f : expf(m[r] - mn); /* 0 when the first keys arrive */
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; c++) {
        p[r][c] = s[r][c] == -INFINITY ? 0.0f : expf(s[r][c] - mn);
        sum += p[r][c];
      }
      for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      l[r] = l[r] * rs + sum;
      m[r] = mn;
#pragma unroll
      for (int c = 0; c < DC; c++) o[r][c] *= rs;
    }
    __syncthreads(); /* K^T is read by all: V may now take its place */
#pragma unroll
    for (int c = 0; c < 4; c++)
      *(float4 *)&Pt[(tx * 4 + c) * SEG_FQ + ty * 4] = make_float4(p[0][c], p[1][c], p[2][c], p[3][c]);
    for (int e = tid; e < SEG_BK * DP; e += 256) {
      const int j = e / DP, c = e - j * DP;
      KV[e] = j < nt && c < D ? v[(j0 + j) * vs + hoff + c] : 0.0f;
    }
    __syncthreads();
    for (int j = 0; j < nt; j++) {
      const float4 pj = *(const float4 *)&Pt[j * SEG_FQ + ty * 4];
      const float *vr = KV + j * DP + tx;
#pragma unroll
      for (int c = 0; c < DC; c++) {
        const float vv = vr[16 * c];
        o[0][c] += pj.x * vv, o[1][c] += pj.y * vv, o[2][c] += pj.z * vv, o[3][c] += pj.w * vv;
      }
    }
    __syncthreads(); /* before the next tile overwrites KV and P */
  }
#pragma unroll
  for (int r = 0; r < 4; r++) {
    const int i = ty * 4 + r;
    if (i >= nq) continue;
    const float inv = 1.0f / l[r];
    float *orow = out + (q0 + i) * (int64_t)H * D + hoff;
#pragma unroll
    for (int c = 0; c < DC; c++) {
      const int col = tx + 16 * c;
      if (col < D) orow[col] = o[r][c] * inv;
    }
  }
}

template <int DC>
static void seg_launch(cuda_impl *ci, float *out, const ops_seg_attn_args *a, const int64_t *segd) {
  const size_t smem = seg_smem_bytes(a->head_dim, DC);
  static size_t opted = 48 * 1024; /* per instance: the dynamic shared memory opted into */
  if (smem > opted) {
    if (!cuda_check(ci, cudaFuncSetAttribute(k_seg_attn<DC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                    "attention_seg shared memory"))
      return;
    opted = smem;
  }
  const dim3 grid((unsigned)((a->n + SEG_BQ - 1) / SEG_BQ), (unsigned)a->n_heads);
  cuda_launch(ci, "attention_seg", k_seg_attn<DC>, grid, 256, smem, out, a->q, a->k, a->v, a->q_stride, a->k_stride,
              a->v_stride, segd, a->n_seg, a->n, a->n_heads, a->head_dim, a->scale);
}

static void cuda_op_attention_seg(ops_backend *be, float *out, const ops_seg_attn_args *a) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || a->n <= 0) return;
  if (a->head_dim < 1 || a->head_dim > OPS_SEG_ATTN_MAX_DIM || a->n_heads < 1 || a->n_heads > 65535 || a->n_seg < 1 ||
      !a->seg || a->seg[0] != 0 || a->seg[a->n_seg] != a->n || (a->n + SEG_BQ - 1) / SEG_BQ > MAX_GRID) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: attention_seg: bad arguments (n %lld, %d heads of %d, %d segments)",
              (long long)a->n, a->n_heads, a->head_dim, a->n_seg);
    return;
  }
  for (int i = 0; i < a->n_seg; i++)
    if (a->seg[i + 1] <= a->seg[i]) {
      cuda_fail(ci, ANNA_EINVAL, "cuda: attention_seg: segment %d is empty or offsets decrease", i);
      return;
    }
  const int64_t *segd = (const int64_t *)cuda_ring_put(be, a->seg, sizeof(int64_t) * (size_t)(a->n_seg + 1));
  if (!segd) return;
  switch ((a->head_dim + 15) / 16) {
  case 1: seg_launch<1>(ci, out, a, segd); break;
  case 2: seg_launch<2>(ci, out, a, segd); break;
  case 3: seg_launch<3>(ci, out, a, segd); break;
  case 4: seg_launch<4>(ci, out, a, segd); break;
  case 5: seg_launch<5>(ci, out, a, segd); break;
  case 6: seg_launch<6>(ci, out, a, segd); break;
  case 7: seg_launch<7>(ci, out, a, segd); break;
  case 8: seg_launch<8>(ci, out, a, segd); break;
  case 9: seg_launch<9>(ci, out, a, segd); break;
  case 10: seg_launch<10>(ci, out, a, segd); break;
  case 11: seg_launch<11>(ci, out, a, segd); break;
  case 12: seg_launch<12>(ci, out, a, segd); break;
  case 13: seg_launch<13>(ci, out, a, segd); break;
  case 14: seg_launch<14>(ci, out, a, segd); break;
  case 15: seg_launch<15>(ci, out, a, segd); break;
  default: seg_launch<16>(ci, out, a, segd); break;
  }
}

/* ---- Weighted gather (interpolated position tables): one block per token ---- */

static __global__ void k_embed_bag(float *y, const uint8_t *T, int64_t rows, int64_t cols, int64_t rb, int type,
                                   const int32_t *ids, const float *wts, int k) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    float s = 0.0f;
    for (int j = 0; j < k; j++) {
      const int32_t id = ids[t * k + j];
      /* the caller checks ids; an id out of range adds nothing rather than reading outside */
      const float r = id >= 0 && id < rows ? cuda_ldw(type, T + (int64_t)id * rb, i) : 0.0f;
      const float wt = wts[t * k + j];
      s = j == 0 ? wt * r : s + wt * r;
    }
    y[t * cols + i] += s;
  }
}

static void cuda_op_embed_bag(ops_backend *be, float *y, const ops_weight *table, const int32_t *ids,
                              const float *wts, int64_t n, int k) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  if (!cuda_float_type(table->type)) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: embed_bag of a %s table (F32, F16, BF16 only)", dtype_name(table->type));
    return;
  }
  if (k < 1 || table->rows <= 0 || table->cols <= 0) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: embed_bag of k %d over a [%lld, %lld] table", k, (long long)table->rows,
              (long long)table->cols);
    return;
  }
  const int64_t rb = dtype_row_bytes(table->type, table->cols);
  const uint8_t *T = (const uint8_t *)cuda_mirror(be, table->data, (size_t)(rb * table->rows));
  if (!T) return;
  const int th = table->cols >= 256 ? 256 : (int)((table->cols + 31) / 32 * 32);
  for (int64_t t0 = 0; t0 < n; t0 += MAX_GRID) {
    const int64_t cnt = n - t0 < MAX_GRID ? n - t0 : MAX_GRID;
    cuda_launch(ci, "embed_bag", k_embed_bag, (unsigned)cnt, th, 0, y + t0 * table->cols, T, table->rows,
                table->cols, rb, table->type, ids + t0 * k, wts + t0 * k, k);
  }
}

/* ---- Dense causal convs as an implicit GEMM ----
 * y[t * yrs + co] = bias[co] + sum_kk W[co * K + kk] * X(t, kk), kk < K = kw * cin, where
 * X(t, k * cin + ci) = x[t * cin + k * dcin + ci] (dcin = dil * cin; dil 1 makes the kw
 * input rows one contiguous span). The transposed conv is one such product per output
 * phase p (blockIdx.z): W + p * cout * K, y + p * cout, row stride stride * cout. Tiles of
 * 64 outputs by 64 rows with K in steps of 16; each thread keeps 4 x 4 sums in f32. */
#define CG_T 64
#define CG_K 16

static __global__ void __launch_bounds__(256)
    k_conv_gemm(float *y, int64_t yrs, const float *x, const float *W, const float *bias, int64_t n, int cin,
                int cout, int K, int64_t dcin, int64_t w_phase, int64_t y_phase) {
  __shared__ __align__(16) float As[CG_K][CG_T + 4]; /* [kk][co]; rows of 68 floats keep float4 reads aligned */
  __shared__ __align__(16) float Bs[CG_K][CG_T + 4]; /* [kk][t] */
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int co0 = blockIdx.x * CG_T;
  const int64_t t0 = (int64_t)blockIdx.y * CG_T;
  W += (int64_t)blockIdx.z * w_phase;
  y += (int64_t)blockIdx.z * y_phase;
  const bool dense = dcin == cin;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += CG_K) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int idx = tid + e * 256, r = idx >> 4, c = idx & 15; /* r: co or t in the tile; c: kk */
      const int kk = k0 + c;
      const int co = co0 + r;
      As[c][r] = co < cout && kk < K ? W[(int64_t)co * K + kk] : 0.0f;
      const int64_t t = t0 + r;
      float xv = 0.0f;
      if (t < n && kk < K) {
        const int64_t off = dense ? kk : (int64_t)(kk / cin) * dcin + kk % cin;
        xv = x[t * cin + off];
      }
      Bs[c][r] = xv;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < CG_K; c++) {
      const float4 a4 = *(const float4 *)&As[c][tx * 4], b4 = *(const float4 *)&Bs[c][ty * 4];
      const float a[4] = {a4.x, a4.y, a4.z, a4.w}, b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] += b[i] * a[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int64_t t = t0 + ty * 4 + i;
    if (t >= n) continue;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int co = co0 + tx * 4 + j;
      if (co < cout) y[t * yrs + co] = acc[i][j] + (bias ? bias[co] : 0.0f);
    }
  }
}

/* Rows of one launch: grid.y stays under 65536. */
#define CG_ROWS ((int64_t)65535 * CG_T)

static void conv_gemm(cuda_impl *ci, const char *what, float *y, int64_t yrs, const float *x, const float *W,
                      const float *bias, int64_t n, int cin, int cout, int K, int64_t dcin, int phases) {
  for (int64_t r0 = 0; r0 < n; r0 += CG_ROWS) {
    const int64_t cnt = n - r0 < CG_ROWS ? n - r0 : CG_ROWS;
    const dim3 grid((unsigned)((cout + CG_T - 1) / CG_T), (unsigned)((cnt + CG_T - 1) / CG_T), (unsigned)phases);
    cuda_launch(ci, what, k_conv_gemm, grid, 256, 0, y + r0 * yrs, yrs, x + r0 * cin, W, bias, cnt, cin, cout, K, dcin,
                (int64_t)cout * K, (int64_t)cout);
  }
}

static void cuda_op_conv1d(ops_backend *be, float *y, const float *x, int64_t n, int cin, int cout, const float *w,
                           int kw, int dil, const float *bias) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  if (cin < 1 || cout < 1 || kw < 1 || dil < 1 || (int64_t)kw * cin > 0x7fffffff) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: conv1d of cin %d, cout %d, kw %d, dil %d", cin, cout, kw, dil);
    return;
  }
  const float *wd = vec_dev(be, w, (int64_t)cout * kw * cin), *bd = vec_dev(be, bias, cout);
  if (!wd || (bias && !bd)) return;
  conv_gemm(ci, "conv1d", y, cout, x, wd, bd, n, cin, cout, kw * cin, (int64_t)dil * cin, 1);
}

static void cuda_op_conv_transpose1d(ops_backend *be, float *y, const float *x, int64_t n, int cin, int cout,
                                     const float *w, int m, int stride, const float *bias) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  if (cin < 1 || cout < 1 || m < 1 || stride < 1 || stride > 65535 || (int64_t)m * cin > 0x7fffffff) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: conv_transpose1d of cin %d, cout %d, m %d, stride %d", cin, cout, m, stride);
    return;
  }
  const float *wd = vec_dev(be, w, (int64_t)stride * cout * m * cin), *bd = vec_dev(be, bias, cout);
  if (!wd || (bias && !bd)) return;
  conv_gemm(ci, "conv_transpose1d", y, (int64_t)stride * cout, x, wd, bd, n, cin, cout, m * cin, cin, stride);
}

/* ---- Depthwise causal conv: one thread per output ---- */

static __global__ void k_conv1d_dw(float *y, const float *x, int64_t n, int ch, const float *w, int kw, int dil,
                                   const float *bias) {
  const int64_t total = n * ch, step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t t = e / ch;
    const int c = (int)(e - t * ch);
    float s = 0.0f;
    for (int k = 0; k < kw; k++) s += w[(int64_t)c * kw + k] * x[(t + (int64_t)k * dil) * ch + c];
    y[e] = s + (bias ? bias[c] : 0.0f);
  }
}

static void cuda_op_conv1d_dw(ops_backend *be, float *y, const float *x, int64_t n, int ch, const float *w, int kw,
                              int dil, const float *bias) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  if (ch < 1 || kw < 1 || dil < 1) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: conv1d_dw of %d channels, kw %d, dil %d", ch, kw, dil);
    return;
  }
  const float *wd = vec_dev(be, w, (int64_t)ch * kw), *bd = vec_dev(be, bias, ch);
  if (!wd || (bias && !bd)) return;
  cuda_launch(ci, "conv1d_dw", k_conv1d_dw, ew_grid(n * ch), EW_THREADS, 0, y, x, n, ch, wd, kw, dil, bd);
}

/* ---- Per-channel elementwise ops ---- */

static __global__ void k_snake_beta(float *y, const float *x, int64_t total, int ch, const float *alpha,
                                    const float *inv_beta) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    const int c = (int)(e % ch);
    const float v = x[e];
    const float s = sinf(v * alpha[c]);
    y[e] = v + inv_beta[c] * (s * s);
  }
}

static void cuda_op_snake_beta(ops_backend *be, float *y, const float *x, int64_t rows, int ch, const float *alpha,
                               const float *inv_beta) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || rows <= 0) return;
  if (ch < 1 || !alpha || !inv_beta) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: snake_beta of %d channels or without its parameters", ch);
    return;
  }
  const float *ad = vec_dev(be, alpha, ch), *bd = vec_dev(be, inv_beta, ch);
  if (!ad || !bd) return;
  cuda_launch(ci, "snake_beta", k_snake_beta, ew_grid(rows * ch), EW_THREADS, 0, y, x, rows * ch, ch, ad, bd);
}

static __global__ void k_add_scaled(float *y, const float *x, const float *s, int64_t total, int d) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) y[e] += s[e % d] * x[e];
}

static void cuda_op_add_scaled(ops_backend *be, float *y, const float *x, const float *s, int64_t rows, int d) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || rows <= 0) return;
  if (d < 1 || !s) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: add_scaled of width %d or without scales", d);
    return;
  }
  const float *sd = vec_dev(be, s, d);
  if (!sd) return;
  cuda_launch(ci, "add_scaled", k_add_scaled, ew_grid(rows * d), EW_THREADS, 0, y, x, sd, rows * d, d);
}

static __global__ void k_clamp(float *y, int64_t n, float lo, float hi) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    const float v = y[i];
    y[i] = v < lo ? lo : v > hi ? hi : v; /* NaN fails both tests and stays */
  }
}

static void cuda_op_clamp(ops_backend *be, float *y, int64_t n, float lo, float hi) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  cuda_launch(ci, "clamp", k_clamp, ew_grid(n), EW_THREADS, 0, y, n, lo, hi);
}

/* ---- im2col of a 3x3 stride-2 convolution with zero padding 1: one thread per value of
 * cols, written in order (coalesced stores; the reads repeat each input 9 / 4 times). ---- */

static __global__ void k_im2col_3x3s2(float *cols, const float *x, int64_t total, int h, int w, int c) {
  const int64_t ho = (h + 1) / 2, wo = (w + 1) / 2, row = (int64_t)c * 9;
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t r = e / row;
    const int rem = (int)(e - r * row), ci = rem / 9, kk = rem - ci * 9, ky = kk / 3, kx = kk - ky * 3;
    const int64_t img = r / (ho * wo), oy = (r / wo) % ho, ox = r % wo;
    const int64_t iy = 2 * oy + ky - 1, ix = 2 * ox + kx - 1;
    cols[e] = iy >= 0 && iy < h && ix >= 0 && ix < w ? x[((img * h + iy) * w + ix) * c + ci] : 0.0f;
  }
}

static void cuda_op_im2col_3x3s2(ops_backend *be, float *cols, const float *x, int64_t n_img, int h, int w, int c) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n_img <= 0) return;
  if (h < 1 || w < 1 || c < 1) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: im2col_3x3s2 of [%d, %d, %d] images", h, w, c);
    return;
  }
  const int64_t total = n_img * ((h + 1) / 2) * ((w + 1) / 2) * (int64_t)c * 9;
  cuda_launch(ci, "im2col_3x3s2", k_im2col_3x3s2, ew_grid(total), EW_THREADS, 0, cols, x, total, h, w, c);
}

void cuda_encoder_ops_install(ops_backend *be) {
  be->layer_norm = cuda_op_layer_norm;
  be->gelu = cuda_op_gelu;
  be->attention_seg = cuda_op_attention_seg;
  be->embed_bag = cuda_op_embed_bag;
  be->conv1d = cuda_op_conv1d;
  be->conv1d_dw = cuda_op_conv1d_dw;
  be->conv_transpose1d = cuda_op_conv_transpose1d;
  be->snake_beta = cuda_op_snake_beta;
  be->add_scaled = cuda_op_add_scaled;
  be->clamp = cuda_op_clamp;
  be->im2col_3x3s2 = cuda_op_im2col_3x3s2;
}
