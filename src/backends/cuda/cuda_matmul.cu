/* cuda_matmul.cu: y = x W^T and embedding lookups, for bf16/f16/f32 and the llama.cpp
 * quantized weight types.
 *
 * Decode (n <= MV_MAX_TOK tokens): weights are read once for all tokens of a launch (up to
 * 8) and dotted with f32 activations (f32 accumulation), or, with exact mode off, int8
 * activations (k_matvec_q8: dp4a, f32 scales; Q4_0, IQ4_NL, IQ4_XS, Q8_0, Q4_K-Q6_K, when
 * the quantized activations fit the shared-memory budget). Plain types: one warp per row,
 * 16-byte loads when rows and activations are aligned. Q4_0, IQ4_NL, Q8_0, Q4_K, Q5_K,
 * Q6_K and IQ4_XS: the piece kernel (k_matvec_piece: persistent warps of several rows,
 * wide loads, the next loads in flight during the decode). The other quantized types and
 * unaligned activations: k_matvec_quant, one lane per 32-element unit. Prefill: weights
 * are decoded to f32 in row tiles (f32 weights are used in place) and multiplied by cuBLAS
 * SGEMM, so results match the f32 CPU reference to rounding. */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_math.cuh"
#include "backends/cuda/cuda_q8act.cuh"
#include "backends/cuda/cuda_quant.cuh"
#include "backends/cuda/cuda_route.cuh"

#include "base/error.h"
#include "ops/ops.h"

#include <string.h>

#define MV_MAX_TOK 8
#define MV_WARPS 8

/* ---- Grouped launches (cuda_op_matmul_group) ----
 * Each decode kernel below has a single form (one weight; block index and grid size from
 * blockIdx / gridDim) and a grouped form, which takes a table of up to OPS_GROUP_MAX weights
 * of one type sharing the activations x: entry i owns blocks [first_i, first_{i+1}) of the
 * grid (the last up to gridDim.x), and a block runs the same body on its entry with its
 * index and block count inside that range. A row's arithmetic never depends on which block
 * or warp computes it, so both forms give the same bits; a grouped entry's bias is added
 * when its rows are written (the one f32 add k_add_bias does after a single launch). Every
 * field is 8 bytes: the table has no padding, whose bytes would differ between recorded
 * steps (launch arguments are compared byte for byte). */
typedef struct mv_ent {
  const uint8_t *W;
  float *y;
  const float *bias; /* NULL: none */
  int64_t rows, row_bytes;
  int64_t first; /* first block of the grid */
} mv_ent;
typedef struct mv_table {
  mv_ent e[OPS_GROUP_MAX];
  int64_t count;
} mv_table;

/* A block's entry: its weight, and its index and block count within the entry's range. */
struct mv_sel {
  const uint8_t *W;
  float *y;
  const float *bias;
  int64_t rows, row_bytes, bid, nblk;
};
static __device__ __forceinline__ mv_sel mv_pick(const mv_table &t) {
  const int64_t b = blockIdx.x;
  mv_sel s = {t.e[0].W, t.e[0].y, t.e[0].bias, t.e[0].rows, t.e[0].row_bytes, 0, 0};
  int64_t first = 0, end = gridDim.x;
  /* constant indices only (unrolled), so the table is read in place from the parameters */
#pragma unroll
  for (int i = 1; i < OPS_GROUP_MAX; i++) {
    if (i >= t.count) break;
    const int64_t f = t.e[i].first;
    if (b >= f) {
      s.W = t.e[i].W, s.y = t.e[i].y, s.bias = t.e[i].bias, s.rows = t.e[i].rows, s.row_bytes = t.e[i].row_bytes;
      first = f;
    } else if (f < end) {
      end = f;
    }
  }
  s.bid = b - first, s.nblk = end - first;
  return s;
}

/* The bodies take G (grouped): false reads the block index (and grid size) where the
 * single kernel always did and has no bias, so the single kernels keep their code (ptxas
 * reports the same registers for the plain and piece kernels as before the split). */
#define MV_BID(G, bid) ((G) ? (bid) : (int64_t)blockIdx.x)
#define MV_NBLK(G, nblk) ((G) ? (nblk) : (int64_t)gridDim.x)
#define MV_OUT(G, v, bias, r) ((G) && (bias) ? (v) + (bias)[r] : (v))

/* One warp per row: rows bid * MV_WARPS .. of the block. */
/* Warps (rows) per block of the grouped plain kernel: f32 weights (the MoE router: 257 x 2048
 * rows in the 35B-A3B shape) are spread over 4x the blocks, so more SMs stream their 8 KB
 * rows at once (with 8 rows per block, 33 SMs did all the work). */
template <int TYPE> __host__ __device__ static constexpr int mv_plain_warps() {
  return TYPE == ANNA_DTYPE_F32 ? 2 : MV_WARPS;
}

template <int TYPE, int NT, bool G, int PW = MV_WARPS>
static __device__ __forceinline__ void mv_plain(float *y, const float *x, const void *W, int64_t rows, int64_t cols,
                                                int vec, const float *bias, int64_t bid) {
  const int lane = threadIdx.x & 31;
  const int64_t r = MV_BID(G, bid) * PW + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int esz = TYPE == ANNA_DTYPE_F32 ? 4 : 2;
  const char *row = (const char *)W + r * cols * esz;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t] = 0.0f;
  int64_t i0 = 0;
  if (vec) {
    /* 8 elements per lane step: one 16-byte load of a 16-bit row, two of an f32 row. U
     * steps' loads are issued before any is used (a warp per row has few loads in flight);
     * the steps are added in the same order either way. The MoE router (256 x 2048 f32, 33
     * blocks): 5.0 -> 4.8 us (ncu) with U 4; f32 takes 8 (a 2048-wide row in one round). */
    constexpr int U = TYPE == ANNA_DTYPE_F32 ? 8 : 4;
    auto load = [&](int64_t i, uint4 *q) {
      if (TYPE == ANNA_DTYPE_F32) q[0] = *(const uint4 *)(row + i * 4), q[1] = *(const uint4 *)(row + i * 4 + 16);
      else q[0] = *(const uint4 *)(row + i * 2);
    };
    auto step = [&](int64_t i, const uint4 *q) {
      float w[8];
      if (TYPE == ANNA_DTYPE_F32) {
        const uint32_t p[8] = {q[0].x, q[0].y, q[0].z, q[0].w, q[1].x, q[1].y, q[1].z, q[1].w};
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = __uint_as_float(p[j]);
      } else {
        const uint32_t p[4] = {q[0].x, q[0].y, q[0].z, q[0].w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
          if (TYPE == ANNA_DTYPE_BF16) {
            w[2 * j] = __uint_as_float(p[j] << 16);
            w[2 * j + 1] = __uint_as_float(p[j] & 0xffff0000u);
          } else {
            w[2 * j] = __half2float(__ushort_as_half((unsigned short)(p[j] & 0xffff)));
            w[2 * j + 1] = __half2float(__ushort_as_half((unsigned short)(p[j] >> 16)));
          }
        }
      }
#pragma unroll
      for (int t = 0; t < NT; t++) {
        const float4 a = *(const float4 *)(x + t * cols + i), b = *(const float4 *)(x + t * cols + i + 4);
        acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z +
                  w[7] * b.w;
      }
    };
    int64_t i = (int64_t)lane * 8;
    for (; i + 256 * (U - 1) + 8 <= cols; i += 256 * U) {
      uint4 q[U][2];
#pragma unroll
      for (int u = 0; u < U; u++) load(i + 256 * u, q[u]);
#pragma unroll
      for (int u = 0; u < U; u++) step(i + 256 * u, q[u]);
    }
    for (; i + 8 <= cols; i += 256) {
      uint4 q[2];
      load(i, q);
      step(i, q);
    }
    i0 = cols & ~(int64_t)7;
  }
  for (int64_t i = i0 + lane; i < cols; i += 32) {
    const float w = cuda_ldw(TYPE, row, i);
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] += w * x[t * cols + i];
  }
#pragma unroll
  for (int t = 0; t < NT; t++) {
    float v = acc[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) y[t * rows + r] = MV_OUT(G, v, bias, r);
  }
}

template <int TYPE, int NT>
static __global__ void k_matvec_plain(float *y, const float *x, const void *W, int64_t rows, int64_t cols,
                                      int vec) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  mv_plain<TYPE, NT, false>(y, x, W, rows, cols, vec, nullptr, 0);
}

/* A deferred add_rmsnorm (cuda_pnorm) folded into a one-token prologue: when r is set, the
 * kernel's x is the residual stream and its activations are rmsnorm(x + r) * w. Each block
 * quantizes (x + r) * w (a block's int8 values do not change with a common factor), sums
 * the squares of x + r, and scales its block scales and run sums by 1 / rms; the last block
 * to finish reading x and r (an atomic count of the blocks, reset by that block) stores
 * x + r into x and the normalised row into y for the ops after this one. The routed plain
 * group takes it too (k_matvec_plain_g, NRM). No padding: the arguments are compared as
 * bytes. */
typedef struct mv_norm {
  const float *r; /* NULL: no norm */
  float *y;
  const float *w;
  int *count;
  float eps;
  int32_t one_plus;
} mv_norm;

/* A MoE route folded into a plain group launch (cuda_op_matmul_group_route): once every block
 * has written its rows, the last one to finish (an atomic count, reset by that block) routes
 * the ntok tokens' logits [ntok, E] (one warp each, cuda_route_token: E <= 256), then, with
 * sh (a shared expert's gate logits [ntok], written by the same launch), appends the shared
 * slot (rows of k + 1). Every field 8 bytes (no padding: launch arguments are compared as
 * bytes). */
typedef struct mv_route {
  const float *logits;
  int32_t *idx;
  float *wts;
  const float *per_expert; /* device, or NULL */
  const float *sh;         /* device, or NULL */
  int *count;
  int64_t E, k, renorm, ntok;
} mv_route;

/* NRM (one token, with ROUTE): x is the residual stream and the activations are the deferred
 * add_rmsnorm's rmsnorm(x + nrm.r) * nrm.w, which every block forms in shared memory (cols
 * floats, dynamic) by k_rmsnorm4's own steps (cuda_rn4_*: the same bits as that kernel); the
 * block that routes also stores x + r into x and the normalised row into nrm.y. */
template <int TYPE, int NT, bool ROUTE, bool NRM = false>
static __global__ void k_matvec_plain_g(const __grid_constant__ mv_table t, const float *x, int64_t cols, int vec,
                                        const __grid_constant__ mv_route rt, const __grid_constant__ mv_norm nrm) {
  static_assert(!NRM || (ROUTE && NT == 1), "the norm prologue is for one routed token");
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  constexpr int PW = mv_plain_warps<TYPE>();
  extern __shared__ __align__(16) float pn_x[];
  if constexpr (NRM) {
    __shared__ float part[32];
    const int d4 = (int)(cols / 4), th = cuda_rn4_threads(d4), lane = threadIdx.x & 31;
    const float4 *x4 = (const float4 *)x, *r4 = (const float4 *)nrm.r;
    float4 *s4 = (float4 *)pn_x;
    for (int vw = threadIdx.x >> 5; vw < th / 32; vw += PW) { /* k_rmsnorm4's warp vw, lane by lane */
      const int i0 = vw * 32 + lane;
      float ss = 0.0f;
#pragma unroll
      for (int j = 0; j < CUDA_RN4_V; j++) {
        const int i = i0 + j * th;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < d4) {
          const float4 a = r4[i];
          v = x4[i];
          v.x += a.x, v.y += a.y, v.z += a.z, v.w += a.w;
          s4[i] = v;
        }
        ss = cuda_rn4_ss(ss, v);
      }
      ss = cuda_warp_sum(ss);
      if (lane == 0) part[vw] = ss;
    }
    __syncthreads();
    float tot = lane < th / 32 ? part[lane] : 0.0f; /* cuda_block_sum's second level */
    tot = cuda_warp_sum(tot);
    const float inv = rsqrtf(tot / (float)(4 * d4) + nrm.eps);
    __syncthreads(); /* every warp has read part (no reuse below, but keep the order plain) */
    for (int i = threadIdx.x; i < d4; i += 32 * PW) {
      const float4 v = s4[i];
      float4 o = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
      if (nrm.w) {
        float4 g = ((const float4 *)nrm.w)[i];
        if (nrm.one_plus) g.x += 1.0f, g.y += 1.0f, g.z += 1.0f, g.w += 1.0f;
        o.x *= g.x, o.y *= g.y, o.z *= g.z, o.w *= g.w;
      }
      s4[i] = o;
    }
    __syncthreads();
  }
  const mv_sel s = mv_pick(t);
  mv_plain<TYPE, NT, true, PW>(s.y, NRM ? pn_x : x, s.W, s.rows, cols, vec, s.bias, s.bid);
  if (ROUTE) {
    __shared__ int last;
    __threadfence(); /* this thread's rows, visible to the block that routes */
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(rt.count, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int64_t kk = rt.sh ? rt.k + 1 : rt.k;
    for (int tk = threadIdx.x >> 5; tk < rt.ntok; tk += PW) {
      cuda_route_token<8>(rt.idx + tk * kk, rt.wts + tk * kk, rt.logits + tk * rt.E, (int)rt.E, (int)rt.k,
                          (int)rt.renorm, rt.per_expert, threadIdx.x & 31);
      if (rt.sh)
        cuda_route_shared_slot(rt.idx + tk * kk + rt.k, rt.wts + tk * kk + rt.k, rt.sh + tk, (int)rt.E,
                               threadIdx.x & 31);
    }
    if constexpr (NRM) { /* every block has read x and r: x + r and the normalised row out */
      const float4 *r4 = (const float4 *)nrm.r;
      float4 *x4 = (float4 *)x;
      for (int i = threadIdx.x; i < (int)(cols / 4); i += 32 * PW) {
        const float4 a = r4[i];
        float4 v = x4[i];
        v.x += a.x, v.y += a.y, v.z += a.z, v.w += a.w;
        x4[i] = v;
        ((float4 *)nrm.y)[i] = ((const float4 *)pn_x)[i];
      }
    }
    if (threadIdx.x == 0) *rt.count = 0; /* the next routed launch comes after this grid ends */
  }
}

/* TYPE is a template argument so the block decoder inlines with constant indices and the
 * 32 decoded weights stay in registers. xal: activations 16-byte aligned (float4 loads). */
template <int TYPE, int NT, bool G>
static __device__ __forceinline__ void mv_quant(float *y, const float *x, const uint8_t *W, int64_t rows,
                                                int64_t cols, int64_t row_bytes, int xal, const float *bias,
                                                int64_t bid) {
  const int lane = threadIdx.x & 31;
  const int64_t r = MV_BID(G, bid) * MV_WARPS + (threadIdx.x >> 5);
  if (r >= rows) return;
  const uint8_t *row = W + r * row_bytes;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t] = 0.0f;
  const int64_t units = cols / 32;
  for (int64_t u = lane; u < units; u += 32) {
    float w[32];
    if constexpr (TYPE == ANNA_DTYPE_Q4_K) cuda_deq32_q4k_wide(row, u, w);
    else cuda_deq32(TYPE, row, u, w);
#pragma unroll
    for (int t = 0; t < NT; t++) {
      const float *xv = x + t * cols + u * 32;
      float s = 0.0f;
      if (xal) {
#pragma unroll
        for (int j = 0; j < 32; j += 4) {
          const float4 a = *(const float4 *)(xv + j);
          s += w[j] * a.x + w[j + 1] * a.y + w[j + 2] * a.z + w[j + 3] * a.w;
        }
      } else {
#pragma unroll
        for (int j = 0; j < 32; j++) s += w[j] * xv[j];
      }
      acc[t] += s;
    }
  }
#pragma unroll
  for (int t = 0; t < NT; t++) {
    float v = acc[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) y[t * rows + r] = MV_OUT(G, v, bias, r);
  }
}

template <int TYPE, int NT>
static __global__ void k_matvec_quant(float *y, const float *x, const uint8_t *W, int64_t rows, int64_t cols,
                                      int64_t row_bytes, int xal) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  mv_quant<TYPE, NT, false>(y, x, W, rows, cols, row_bytes, xal, nullptr, 0);
}

template <int TYPE, int NT>
static __global__ void k_matvec_quant_g(const __grid_constant__ mv_table t, const float *x, int64_t cols, int xal) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const mv_sel s = mv_pick(t);
  mv_quant<TYPE, NT, true>(s.y, x, s.W, s.rows, cols, s.row_bytes, xal, s.bias, s.bid);
}

/* Decode matvec for the formats with a piece decoder (cuda_quant.cuh): each warp owns a
 * group of MVQ_R rows at a time; per step every lane decodes one 32-weight piece of each
 * of its rows (consecutive lanes read consecutive pieces, so a warp's loads cover
 * contiguous bytes) and dots the piece's small integers with the matching activations of
 * all NT tokens, loaded once per step for the MVQ_R rows; the block scales are applied
 * once per 16-element run. Weights are read once for all tokens; activations come from
 * L1/L2 (f32, as in the CPU reference). Rows past the end of the last group are clamped to
 * a valid row and not written. */
#define MVQ_WARPS 4

/* Rows per warp: more rows share each activation load but cost registers. Chosen from
 * H200 timings (bench/notes/gpu.md): 8 for one token of the 32-element-block formats,
 * whose pieces are cheap to decode, 4 otherwise. */
template <int TYPE, int NT> static constexpr int mvq_rows() {
  return NT == 1 && (TYPE == ANNA_DTYPE_Q4_0 || TYPE == ANNA_DTYPE_IQ4_NL || TYPE == ANNA_DTYPE_IQ4_XS) ? 8 : 4;
}

/* bid, nblk: the block's index and the blocks working on this weight (persistent warps). */
template <int TYPE, int NT, int MVQ_R, bool G>
static __device__ __forceinline__ void mv_piece(float *y, const float *x, const uint8_t *W, int64_t rows,
                                                int64_t cols, int64_t row_bytes, const float *bias, int64_t bid,
                                                int64_t nblk) {
  constexpr bool iq4 = TYPE == ANNA_DTYPE_IQ4_NL || TYPE == ANNA_DTYPE_IQ4_XS;
  constexpr int HI = cuda_piece<TYPE>::HI, RAW = cuda_piece<TYPE>::RAW;
  constexpr bool HAS_MIN = cuda_piece_has_min<TYPE>();
  __shared__ float tab[16];
  if (iq4) {
    if (threadIdx.x < 16) tab[threadIdx.x] = (float)c_kvalues_iq4nl[threadIdx.x];
    __syncthreads();
  }
  const int lane = threadIdx.x & 31;
  /* Persistent warps: warp gw takes row groups gw, gw + GW, ...; its steps (group, iteration
   * over the row's pieces) form one sequence, and the loads of the next step, in the same
   * or the next group, are in flight while the current step is decoded. */
  const int64_t groups = (rows + MVQ_R - 1) / MVQ_R, pieces = cols / 32, iters = (pieces + 31) / 32;
  const int64_t GW = MV_NBLK(G, nblk) * MVQ_WARPS;
  int64_t g = MV_BID(G, bid) * MVQ_WARPS + (threadIdx.x >> 5), it = 0;
  if (g >= groups || pieces == 0) return;
  const uint8_t *row[MVQ_R];
#pragma unroll
  for (int r = 0; r < MVQ_R; r++) row[r] = W + (g * MVQ_R + r < rows ? g * MVQ_R + r : rows - 1) * row_bytes;
  float acc[MVQ_R][NT];
#pragma unroll
  for (int r = 0; r < MVQ_R; r++)
#pragma unroll
    for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
  uint32_t raw[MVQ_R][RAW];
  if (lane < pieces) {
#pragma unroll
    for (int r = 0; r < MVQ_R; r++) cuda_piece_load<TYPE>(row[r], lane, lane == pieces - 1, raw[r]);
  }
  for (;;) {
    int64_t g2 = g, it2 = it + 1;
    if (it2 == iters) it2 = 0, g2 += GW;
    const bool more = g2 < groups;
    const uint8_t *row2[MVQ_R];
#pragma unroll
    for (int r = 0; r < MVQ_R; r++)
      row2[r] = g2 == g ? row[r] : W + (g2 * MVQ_R + r < rows ? g2 * MVQ_R + r : rows - 1) * row_bytes;
    const int64_t p = it * 32 + lane, pn = it2 * 32 + lane;
    uint32_t nxt[MVQ_R][RAW];
    if (more && pn < pieces) {
#pragma unroll
      for (int r = 0; r < MVQ_R; r++) cuda_piece_load<TYPE>(row2[r], pn, pn == pieces - 1, nxt[r]);
    }
    if (NT == 1 && p < pieces) {
      /* one token: its 32 activations stay in registers and the rows are decoded one
       * after the other, so registers do not grow with MVQ_R */
      float xv[32], xs0 = 0.0f, xs1 = 0.0f;
#pragma unroll
      for (int r = 0; r < MVQ_R; r++) {
        float w[32], sc[2], mn[2];
        const int64_t e0 = cuda_piece_decode<TYPE>(row[r], p, raw[r], w, iq4 ? tab : nullptr, sc, mn);
        if (r == 0) {
          const float4 *xa = (const float4 *)(x + e0), *xb = (const float4 *)(x + e0 + HI);
#pragma unroll
          for (int j = 0; j < 4; j++) {
            const float4 a = xa[j], b = xb[j];
            xv[4 * j] = a.x, xv[4 * j + 1] = a.y, xv[4 * j + 2] = a.z, xv[4 * j + 3] = a.w;
            xv[16 + 4 * j] = b.x, xv[17 + 4 * j] = b.y, xv[18 + 4 * j] = b.z, xv[19 + 4 * j] = b.w;
            if constexpr (HAS_MIN) xs0 += (a.x + a.y) + (a.z + a.w), xs1 += (b.x + b.y) + (b.z + b.w);
          }
        }
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i += 2) {
          s0 = fmaf(w[i], xv[i], s0), s1 = fmaf(w[i + 1], xv[i + 1], s1);
          s2 = fmaf(w[16 + i], xv[16 + i], s2), s3 = fmaf(w[17 + i], xv[17 + i], s3);
        }
        float v = fmaf(sc[0], s0 + s1, acc[r][0]);
        v = fmaf(sc[1], s2 + s3, v);
        if constexpr (HAS_MIN) v -= mn[0] * xs0 + mn[1] * xs1;
        acc[r][0] = v;
      }
    } else if (p < pieces) {
      float w[MVQ_R][32], sc[MVQ_R][2], mn[MVQ_R][2];
      int64_t e0 = 0;
#pragma unroll
      for (int r = 0; r < MVQ_R; r++)
        e0 = cuda_piece_decode<TYPE>(row[r], p, raw[r], w[r], iq4 ? tab : nullptr, sc[r], mn[r]);
#pragma unroll
      for (int t = 0; t < NT; t++) {
        const float4 *xa = (const float4 *)(x + t * cols + e0), *xb = (const float4 *)(x + t * cols + e0 + HI);
        /* two fma chains per run and row: the integers dot the activations, scales after */
        float s[MVQ_R][4], xs0 = 0.0f, xs1 = 0.0f;
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) s[r][0] = s[r][1] = s[r][2] = s[r][3] = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
          const float4 a = xa[j], b = xb[j];
          if constexpr (HAS_MIN) xs0 += (a.x + a.y) + (a.z + a.w), xs1 += (b.x + b.y) + (b.z + b.w);
#pragma unroll
          for (int r = 0; r < MVQ_R; r++) {
            const int h = j & 1;
            s[r][h] = fmaf(w[r][4 * j], a.x, s[r][h]);
            s[r][h] = fmaf(w[r][4 * j + 1], a.y, s[r][h]);
            s[r][h] = fmaf(w[r][4 * j + 2], a.z, s[r][h]);
            s[r][h] = fmaf(w[r][4 * j + 3], a.w, s[r][h]);
            s[r][2 + h] = fmaf(w[r][16 + 4 * j], b.x, s[r][2 + h]);
            s[r][2 + h] = fmaf(w[r][17 + 4 * j], b.y, s[r][2 + h]);
            s[r][2 + h] = fmaf(w[r][18 + 4 * j], b.z, s[r][2 + h]);
            s[r][2 + h] = fmaf(w[r][19 + 4 * j], b.w, s[r][2 + h]);
          }
        }
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
          float v = fmaf(sc[r][0], s[r][0] + s[r][1], acc[r][t]);
          v = fmaf(sc[r][1], s[r][2] + s[r][3], v);
          if constexpr (HAS_MIN) v -= mn[r][0] * xs0 + mn[r][1] * xs1;
          acc[r][t] = v;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < MVQ_R; r++)
#pragma unroll
      for (int i = 0; i < RAW; i++) raw[r][i] = nxt[r][i];
    if (it2 == 0) { /* the group is done: reduce over the lanes and write its rows */
#pragma unroll
      for (int r = 0; r < MVQ_R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
          float v = acc[r][t];
          for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
          if (lane == 0 && g * MVQ_R + r < rows) y[t * rows + g * MVQ_R + r] = MV_OUT(G, v, bias, g * MVQ_R + r);
          acc[r][t] = 0.0f;
        }
    }
    if (!more) break;
    g = g2, it = it2;
#pragma unroll
    for (int r = 0; r < MVQ_R; r++) row[r] = row2[r];
  }
}

template <int TYPE, int NT, int MVQ_R>
static __global__ void __launch_bounds__(32 * MVQ_WARPS)
    k_matvec_piece(float *y, const float *x, const uint8_t *W, int64_t rows, int64_t cols, int64_t row_bytes) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  mv_piece<TYPE, NT, MVQ_R, false>(y, x, W, rows, cols, row_bytes, nullptr, 0, 0);
}

template <int TYPE, int NT, int MVQ_R>
static __global__ void __launch_bounds__(32 * MVQ_WARPS)
    k_matvec_piece_g(const __grid_constant__ mv_table t, const float *x, int64_t cols) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const mv_sel s = mv_pick(t);
  mv_piece<TYPE, NT, MVQ_R, true>(s.y, x, s.W, s.rows, cols, s.row_bytes, s.bias, s.bid, s.nblk);
}

/* ---- Decode matvec against int8 activations (exact off) ----
 * k_matvec_q8: the piece kernel's structure (warps of R rows, consecutive lanes on
 * consecutive pieces, persistent warps, next loads in flight) with the activations
 * quantized to int8 once per block into shared memory, and dp4a dots (cuda_q8_decode).
 * Per 32-element activation block: one f32 scale (max|x| / 127), and per 16-element run
 * the f32 sum scale * sum(q), which applies the Q4_K/Q5_K mins and the offsets of Q4_0 (8)
 * and Q6_K (32); the quantizer, the activation fetch and the dot are cuda_q8act.cuh's
 * (shared with the MoE expert kernels). Shared memory, for NT tokens of cols activations:
 * one span of NT * cols (cuda_q8act_smem; the tokens' rows are contiguous): up to the
 * device's opt-in limit (cuda_matmul_setup; 227 KB on sm_90, so 8 tokens of up to 21000
 * columns), beyond it the f32 kernel. Past 48 KB fewer blocks fit
 * per SM, but each still streams weights for 8 warps. */
/* Warps per block: 16 for one token of a K-quant with 2 rows per warp, else 8. Those
 * instances take ~90-100 registers, so an SM holds 16 of their warps either way, but each
 * block quantizes the whole activation span into its shared memory first: one block of 16
 * does that once per SM instead of twice, in half the time (a down projection's 12288
 * activations, with the FFN activation folded in, are a fifth of its instructions at 8
 * warps). The other instances keep 8 (not measured with 16). */
template <int TYPE, int NT, int R> __host__ __device__ static constexpr int mvq8_warps() {
  return NT == 1 && R == 2 && (TYPE == ANNA_DTYPE_Q4_K || TYPE == ANNA_DTYPE_Q5_K || TYPE == ANNA_DTYPE_Q6_K) ? 16
                                                                                                              : 8;
}
#define MVQ8_SMEM_DEFAULT (48 * 1024) /* without the opt-in of cuda_matmul_setup */

/* Rows per warp: 2 (55-120 registers, 2-4 blocks per SM for 1-4 tokens: many warps, and
 * a 12288-row weight is ~2 groups per resident warp, so the last round keeps the memory
 * busy). The alternative (CUDA_MV_INT8_R4, for the bench) takes 4 rows for 1-2 tokens:
 * each activation load then serves 4 rows, at 88-143 registers; Q5_K and Q6_K stay at 2
 * (their 12- and 13-word pieces, prefetched, would need ~150). Measured (H200, 12288 x 4096,
 * 1 token): no better: Q8_0 17.7 vs 20.0 us, Q4_K 13.5 vs 13.9, Q4_0 12.9 vs 13.4. */
template <int TYPE, int NT> static constexpr int mvq8_rows_r4() {
  return NT <= 2 && TYPE != ANNA_DTYPE_Q5_K && TYPE != ANNA_DTYPE_Q6_K ? 4 : 2;
}

static size_t mvq8_smem(int64_t nt, int64_t cols) {
  return cuda_q8act_smem(nt * cols);
}

/* Pieces per lane per step. Q4_K: two pieces of one super-block (PL 2), its 16-byte header
 * loaded once for both: 12 words hold 32 weight bytes instead of 8 words holding 16 (a lane's
 * header is the same 16 bytes its 7 neighbours load), so the registers that keep loads in
 * flight carry more of the weights: 1 token 1852 -> 2083 GB/s (12288 x 4096 on the H200; Q8_0:
 * ~3000). With 4 and 8 tokens the pair lost (23.9 -> 24.4 and 36.5 -> 40.7 us: the decoded
 * words of two pieces for every token), so it is for 1-2 tokens only. */
template <int TYPE, int NT> struct mvq8_unit {
  enum {
    PL = TYPE == ANNA_DTYPE_Q4_K && NT <= 2 ? 2 : 1,
    LW = PL == 2 ? cuda_piece<TYPE>::RAW + 4 : cuda_piece<TYPE>::RAW
  };
};

/* Loads unit u (pieces u * PL ...) of a row: cuda_piece_load's words, or for Q4_K the header
 * then the 16 quant bytes of pieces 2u and 2u + 1 (super-block u / 4: 8 pieces). */
template <int TYPE, int NT>
__device__ __forceinline__ void mvq8_load(const uint8_t *row, int64_t u, int64_t units, uint32_t *raw) {
  if constexpr (mvq8_unit<TYPE, NT>::PL == 1) {
    cuda_piece_load<TYPE>(row, u, u == units - 1, raw);
  } else {
    const uint8_t *b = row + (u >> 2) * 144 + 16;
    const uint4 h = pc_ld((const uint4 *)(b - 16));
    const uint4 q0 = pc_ld((const uint4 *)(b + 32 * (u & 3))), q1 = pc_ld((const uint4 *)(b + 32 * (u & 3) + 16));
    raw[0] = h.x, raw[1] = h.y, raw[2] = h.z, raw[3] = h.w;
    raw[4] = q0.x, raw[5] = q0.y, raw[6] = q0.z, raw[7] = q0.w;
    raw[8] = q1.x, raw[9] = q1.y, raw[10] = q1.z, raw[11] = q1.w;
  }
}

/* Piece j of a loaded unit as cuda_piece_load would have loaded it (registers: no copy). */
template <int TYPE, int NT>
__device__ __forceinline__ void mvq8_piece(const uint32_t *raw, int j, uint32_t *pr) {
  if constexpr (mvq8_unit<TYPE, NT>::PL == 1) {
#pragma unroll
    for (int i = 0; i < cuda_piece<TYPE>::RAW; i++) pr[i] = raw[i];
  } else {
#pragma unroll
    for (int i = 0; i < 4; i++) pr[i] = raw[i], pr[4 + i] = raw[4 + 4 * j + i];
  }
}

/* Single (G false: tab unused, all zero) or grouped (G: the weights in tab; y_, W_, rows_,
 * row_bytes_ unused). Unlike the other kernels both forms are instances of this one kernel,
 * not two kernels around a shared device function: inlined from one, the body compiled to
 * other register counts for the single instances (Q8_0 one token: 71 instead of 64, one
 * block less per SM). The table is the last parameter so the single form's others keep
 * their places. */
/* The FFN activation folded into a down projection's int8 prologue (cuda_op_act_matmul): when
 * gate is set, the kernel's activations are act(gate) * x, token t's gate row at gate + t * gs
 * and up row (x) at x + t * us, computed as k_act_mul does. With og set as well (only the
 * gated instances, O: cuda_op_act_matmul_gated_add) the epilogue adds the product times
 * sigmoid(og[t * ogs]) into y instead of storing it: y = y + v * s, two rounded operations
 * as mul_sigmoid then add. 8-byte fields (compared bytes). */
typedef struct mv_glu {
  const float *gate; /* NULL: x as is */
  int64_t gs, us, act;
  const float *og; /* NULL: plain store */
  int64_t ogs;
} mv_glu;


/* Elements c .. c + 3 of x + r and of the norm weight (1 + w with one_plus). */
static __device__ __forceinline__ void mv_norm_in(const mv_norm &nrm, const float *x, int64_t c, float4 *e, float4 *g) {
  const float4 a = *(const float4 *)(x + c), b = *(const float4 *)(nrm.r + c);
  *g = *(const float4 *)(nrm.w + c);
  if (nrm.one_plus) g->x += 1.0f, g->y += 1.0f, g->z += 1.0f, g->w += 1.0f;
  *e = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

template <int TYPE, int NT, int R, bool G, bool O = false>
static __global__ void __launch_bounds__(32 * mvq8_warps<TYPE, NT, R>())
    k_matvec_q8(float *y_, const float *x, const uint8_t *W_, int64_t rows_, int64_t cols, int64_t row_bytes_,
                const __grid_constant__ mv_table tab, const mv_glu glu, const mv_norm nrm) {
  mv_sel sel;
  if constexpr (G) sel = mv_pick(tab);
  else sel = mv_sel{W_, y_, nullptr, rows_, row_bytes_, 0, 0};
  float *const y = sel.y;
  const uint8_t *const W = sel.W;
  const float *const bias = sel.bias;
  const int64_t rows = sel.rows, row_bytes = sel.row_bytes, bid = sel.bid, nblk = sel.nblk;
  constexpr int RAW = cuda_piece<TYPE>::RAW, NW = cuda_q8p<TYPE>::NW, PL = mvq8_unit<TYPE, NT>::PL,
                LW = mvq8_unit<TYPE, NT>::LW, SW = PL == 2 ? 1 : 0;
  constexpr int WARPS = mvq8_warps<TYPE, NT, R>();
  extern __shared__ __align__(16) uint8_t q8_smem[];
  const int ncol = (int)cols, nb = NT * ncol / 32; /* cols * NT fits: the launcher checks */
  uint8_t *xq = q8_smem;
  float *xd = (float *)(q8_smem + NT * ncol), *xs = xd + ((nb + 1) & ~1); /* 8-byte aligned: float2 loads */
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  /* units of PL pieces (Q4_K: 8 pieces per super-block, so units never straddle one) */
  const int64_t groups = (rows + R - 1) / R, units = cols / 32 / PL, iters = (units + 31) / 32;
  const int64_t GW = MV_NBLK(G, nblk) * WARPS;
  int64_t g = MV_BID(G, bid) * WARPS + warp, it = 0;
  const bool active = g < groups;
  const uint8_t *row[R];
#pragma unroll
  for (int r = 0; r < R; r++) row[r] = W + (active && g * R + r < rows ? g * R + r : rows - 1) * row_bytes;
  uint32_t raw[R][LW];
  /* the first weight loads are in flight while the block quantizes the activations */
  if (active && lane < units) {
#pragma unroll
    for (int r = 0; r < R; r++) mvq8_load<TYPE, NT>(row[r], lane, units, raw[r]);
  }
  /* launched by cuda_launch_pdl: the weight loads above need nothing from earlier ops and
   * overlap the tail of the kernel before; the activations below do */
  cuda_pdl_enter();
  /* O: the gate of token lane % NT, the one this lane adds with in the epilogue */
  const float osg = O ? cuda_sigmoid(glu.og[(lane % NT) * glu.ogs]) : 0.0f;
  {
    /* 8 lanes per 32-block (4 elements each, one float4), 4 blocks per warp step, U steps'
     * loads issued together (the loop is bound by their L2 latency: one token of 4096
     * columns is one round). The tokens' activations are contiguous (stride cols), so
     * blocks are numbered flat. Every lane takes part in the shuffles; only blocks < nb are
     * stored. */
    constexpr int U = NT >= 4 ? 8 : 4;
    const int m = lane & 7;
    float ss = 0.0f; /* nrm: this thread's sum of squares of x + r */
    for (int b0 = warp * 4; b0 < nb; b0 += 4 * WARPS * U) {
      float4 v[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int blk = b0 + u * 4 * WARPS + (lane >> 3);
        if (blk >= nb) {
          v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        } else if (NT == 1 && nrm.r) {
          float4 e, g;
          mv_norm_in(nrm, x, (int64_t)blk * 32 + 4 * m, &e, &g);
          ss += e.x * e.x + e.y * e.y + e.z * e.z + e.w * e.w;
          v[u] = make_float4(e.x * g.x, e.y * g.y, e.z * g.z, e.w * g.w);
        } else if (!glu.gate) {
          v[u] = *(const float4 *)(x + (int64_t)blk * 32 + 4 * m);
        } else {
          const int64_t t = (int64_t)blk * 32 / ncol, c = (int64_t)blk * 32 - t * ncol + 4 * m;
          const float4 g = *(const float4 *)(glu.gate + t * glu.gs + c), up = *(const float4 *)(x + t * glu.us + c);
          const bool gl = glu.act == ACT_KIND_GELU_TANH;
          v[u].x = (gl ? cuda_gelu_tanh(g.x) : cuda_silu(g.x)) * up.x;
          v[u].y = (gl ? cuda_gelu_tanh(g.y) : cuda_silu(g.y)) * up.y;
          v[u].z = (gl ? cuda_gelu_tanh(g.z) : cuda_silu(g.z)) * up.z;
          v[u].w = (gl ? cuda_gelu_tanh(g.w) : cuda_silu(g.w)) * up.w;
        }
      }
      cuda_q8act_store<TYPE, U, WARPS, SW>(v, b0, nb, xq, xd, xs, lane);
    }
    if (NT == 1 && nrm.r) {
      __shared__ float part[WARPS];
      __shared__ int last;
      ss = cuda_warp_sum(ss);
      if (lane == 0) part[warp] = ss;
      __syncthreads(); /* the span and the partial sums are complete; this block is done with x and r */
      if (threadIdx.x == 0) last = atomicAdd(nrm.count, 1) == (int)gridDim.x - 1;
      float tot = 0.0f;
#pragma unroll
      for (int i = 0; i < WARPS; i++) tot += part[i]; /* the same order in every block */
      const float inv = rsqrtf(tot / (float)ncol + nrm.eps);
      for (int i = threadIdx.x; i < nb; i += 32 * WARPS) xd[i] *= inv;
      for (int i = threadIdx.x; i < 2 * nb; i += 32 * WARPS) xs[i] *= inv;
      __syncthreads();
      if (last) { /* every other block has read x and r: x and y may be written */
        for (int c = 4 * threadIdx.x; c < ncol; c += 4 * 32 * WARPS) {
          float4 e, g;
          mv_norm_in(nrm, x, c, &e, &g);
          *(float4 *)(const_cast<float *>(x) + c) = e;
          *(float4 *)(nrm.y + c) = make_float4(e.x * inv * g.x, e.y * inv * g.y, e.z * inv * g.z, e.w * inv * g.w);
        }
        if (threadIdx.x == 0) *nrm.count = 0; /* the next fused launch comes after this grid ends */
      }
    }
  }
  if (!(NT == 1 && nrm.r)) __syncthreads();
  if (!active) return;
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
  for (;;) {
    int64_t g2 = g, it2 = it + 1;
    if (it2 == iters) it2 = 0, g2 += GW;
    const bool more = g2 < groups;
    const uint8_t *row2[R];
#pragma unroll
    for (int r = 0; r < R; r++) row2[r] = g2 == g ? row[r] : W + (g2 * R + r < rows ? g2 * R + r : rows - 1) * row_bytes;
    const int64_t u = it * 32 + lane, un = it2 * 32 + lane;
    uint32_t nxt[R][LW];
    if (more && un < units) {
#pragma unroll
      for (int r = 0; r < R; r++) mvq8_load<TYPE, NT>(row2[r], un, units, nxt[r]);
    }
    if constexpr (NT == 1 && PL == 2) {
      /* one token, Q4_K: the unit is one 32-byte quant group, decoded as a whole (its two
       * pieces share their scales and activation blocks; cuda_q4k_group_dot) */
      if (u < units) {
        int a[16];
        float dx[2], sx[2];
        cuda_q8act_fetch64(xq, xd, xs, (int)u, a, dx, sx);
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][0] += cuda_q4k_group_dot(raw[r], raw[r] + 4, (int)(u & 3), a, dx, sx);
      }
    } else {
#pragma unroll
      for (int j = 0; j < PL; j++) {
        if (u >= units) break;
        const int64_t p = u * PL + j;
        const int e0 = (int)cuda_q8_e0<TYPE>(p);
        /* activation words, scales and run sums of token t for this piece */
        auto act = [&](int t, int *a, float *dx, float *sx) {
          cuda_q8act_fetch<TYPE, SW>(xq, xd, xs, t * ncol + e0, a, dx, sx);
        };
        /* one row's contribution for one token */
        auto dot = [&](const int *wq, const float *sc, const float *mn, const int *a, const float *dx,
                       const float *sx) -> float { return cuda_q8act_dot<TYPE>(wq, sc, mn, a, dx, sx); };
        if constexpr (NT == 1) {
          /* one token: activations first, then the rows one after the other, so the
           * decoded words of only one row are live */
          int a[8];
          float dx[2], sx[2];
          act(0, a, dx, sx);
#pragma unroll
          for (int r = 0; r < R; r++) {
            int wq[NW];
            float sc[2], mn[2];
            uint32_t pr[RAW];
            mvq8_piece<TYPE, NT>(raw[r], j, pr);
            cuda_q8_decode<TYPE>(row[r], p, pr, wq, sc, mn);
            acc[r][0] += dot(wq, sc, mn, a, dx, sx);
          }
        } else {
          int wq[R][NW];
          float sc[R][2], mn[R][2];
#pragma unroll
          for (int r = 0; r < R; r++) {
            uint32_t pr[RAW];
            mvq8_piece<TYPE, NT>(raw[r], j, pr);
            cuda_q8_decode<TYPE>(row[r], p, pr, wq[r], sc[r], mn[r]);
          }
#pragma unroll
          for (int t = 0; t < NT; t++) {
            int a[8];
            float dx[2], sx[2];
            act(t, a, dx, sx);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r][t] += dot(wq[r], sc[r], mn[r], a, dx, sx);
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
      for (int i = 0; i < LW; i++) raw[r][i] = nxt[r][i];
    if (it2 == 0 && O) { /* the group is done, gated: lane r * NT + t adds row r of token t
                          * (the butterfly leaves every lane the same sums), so the reads of
                          * y are in flight together */
      float mine = 0.0f;
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
          const float v = cuda_warp_sum(acc[r][t]);
          if (lane == r * NT + t) mine = v;
          acc[r][t] = 0.0f;
        }
      const int64_t orow = g * R + lane / NT;
      if (lane < R * NT && orow < rows) {
        float *const yo = y + (lane % NT) * rows + orow;
        *yo = __fadd_rn(*yo, __fmul_rn(mine, osg)); /* rounded apart: no contraction */
      }
    } else if (it2 == 0) { /* the group is done: reduce over the lanes and write its rows */
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
          float v = acc[r][t];
          for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
          if (lane == 0 && g * R + r < rows) y[t * rows + g * R + r] = MV_OUT(G, v, bias, g * R + r);
          acc[r][t] = 0.0f;
        }
    }
    if (!more) break;
    g = g2, it = it2;
#pragma unroll
    for (int r = 0; r < R; r++) row[r] = row2[r];
  }
}


/* Rows [0, m) of W (any supported type) to f32 dst[m, cols]. */
static __global__ void k_dequant_rows(float *dst, const uint8_t *W, int64_t m, int64_t cols, int64_t row_bytes,
                                      int type) {
  if (cuda_float_type(type)) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m * cols; i += (int64_t)gridDim.x * blockDim.x)
      dst[i] = cuda_ldw(type, W + (i / cols) * row_bytes, i % cols);
    return;
  }
  const int64_t units = cols / 32;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m * units; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / units, u = i % units;
    float w[32];
    cuda_deq32(type, W + r * row_bytes, u, w);
    float *o = dst + r * cols + u * 32;
#pragma unroll
    for (int j = 0; j < 32; j++) o[j] = w[j];
  }
}

static __global__ void k_add_bias(float *y, const float *bias, int64_t n, int64_t rows) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * rows; i += (int64_t)gridDim.x * blockDim.x)
    y[i] += bias[i % rows];
}

static unsigned grid_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

/* Checks the weight and returns its device copy (NULL with a sticky error otherwise). */
static const uint8_t *weight_dev(ops_backend *be, const ops_weight *w, int64_t *row_bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  if (!cuda_float_type(w->type) && !cuda_quant_supported(w->type)) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: weight type %s is not supported", dtype_name(w->type));
    return NULL;
  }
  const int64_t rb = dtype_row_bytes(w->type, w->cols);
  if (rb <= 0 || w->rows <= 0) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: bad weight shape [%lld, %lld] for %s", (long long)w->rows,
              (long long)w->cols, dtype_name(w->type));
    return NULL;
  }
  *row_bytes = rb;
  return (const uint8_t *)cuda_mirror(be, w->data, (size_t)(rb * w->rows));
}

/* True when the piece kernel reads this weight: its format has a piece decoder, the rows
 * meet that decoder's load alignment and the activations are 16-byte aligned. */
static bool piece_ok(int type, const uint8_t *W, int64_t rb, const float *x) {
  if (((uintptr_t)x & 15) != 0) return false;
  switch (type) {
  case ANNA_DTYPE_Q4_0: case ANNA_DTYPE_IQ4_NL: case ANNA_DTYPE_Q8_0: case ANNA_DTYPE_Q6_K:
    return ((uintptr_t)W & 1) == 0;
  case ANNA_DTYPE_Q4_K: case ANNA_DTYPE_Q5_K: return ((uintptr_t)W & 15) == 0 && rb % 16 == 0;
  case ANNA_DTYPE_IQ4_XS: return ((uintptr_t)W & 7) == 0 && rb % 8 == 0;
  default: return false;
  }
}

/* The decode kernel a weight takes for nt tokens at x. One decision for single and grouped
 * launches, so a weight in a group gets the arithmetic of its own matmul. q8: int8
 * activations allowed (exact off): 1, or 2 for the 4-row variant; smem_max: the q8 kernels'
 * dynamic shared memory limit. piece_ok holds for exactly the seven types that both the
 * piece and the q8 kernels take. */
enum mv_path { MV_PATH_Q8, MV_PATH_Q8R4, MV_PATH_PIECE, MV_PATH_PLAIN, MV_PATH_QUANT };
static mv_path mv_choose(int type, const uint8_t *W, int64_t rb, const float *x, int64_t cols, int nt, int q8,
                         size_t smem_max) {
  const bool piece = piece_ok(type, W, rb, x);
  if (q8 && piece && cols % 32 == 0 && mvq8_smem(nt, cols) <= smem_max) return q8 == 2 ? MV_PATH_Q8R4 : MV_PATH_Q8;
  if (piece) return MV_PATH_PIECE;
  return cuda_float_type(type) ? MV_PATH_PLAIN : MV_PATH_QUANT;
}

/* The plain kernel's 16-byte loads: whole 8-element steps, rows and activations aligned. */
static int mv_vec(const uint8_t *W, const float *x, int64_t cols) {
  return cols % 8 == 0 && ((uintptr_t)W & 15) == 0 && ((uintptr_t)x & 15) == 0;
}

/* Blocks for a persistent piece kernel (G: the grouped one): what fits on the device at
 * once, or fewer when there is less work. Measured once per instance (the process uses one
 * device kind); any grid size is correct. */
template <int TYPE, int NT, int R, bool G = false>
static unsigned piece_grid(int64_t blocks) {
  static int64_t resident = 0;
  if (!resident) {
    const void *k;
    if constexpr (G) k = (const void *)k_matvec_piece_g<TYPE, NT, R>;
    else k = (const void *)k_matvec_piece<TYPE, NT, R>;
    int dev = 0, sms = 0, per = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, 32 * MVQ_WARPS, 0) != cudaSuccess)
      (void)cudaGetLastError(); /* clear it; the guesses below still give a correct grid */
    resident = (int64_t)(sms > 0 ? sms : 128) * (per > 0 ? per : 1);
  }
  return (unsigned)(blocks < resident ? blocks : resident);
}

/* Blocks for a persistent k_matvec_q8 (G: the grouped instance, 2 rows per warp): SMs
 * times the blocks that fit one SM, the smaller of the register limit (the occupancy API
 * without shared memory, queried once per instance) and the shared-memory limit for this
 * launch's smem (computed, so weights of different widths do not re-query: 1 KB per block
 * is reserved by the system). */
template <int TYPE, int NT, int R, bool G = false, bool O = false>
static unsigned q8_grid(int64_t blocks, size_t smem) {
  static int sms = 0, per_regs = 0, smem_sm = 0;
  if (!sms) {
    const void *k;
    if constexpr (G) k = (const void *)k_matvec_q8<TYPE, NT, 2, true>;
    else k = (const void *)k_matvec_q8<TYPE, NT, R, false, O>;
    int dev = 0, n = 0, per = 0, sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, 32 * mvq8_warps<TYPE, NT, G ? 2 : R>(), 0) != cudaSuccess)
      (void)cudaGetLastError(); /* clear it; the guesses below still give a correct grid */
    per_regs = per > 0 ? per : 1, smem_sm = sm > 0 ? sm : 0;
    sms = n > 0 ? n : 128;
  }
  int64_t per = smem_sm ? (int64_t)smem_sm / (int64_t)(smem + 1024) : 1;
  if (per > per_regs) per = per_regs;
  if (per < 1) per = 1;
  const int64_t resident = (int64_t)sms * per;
  return (unsigned)(blocks < resident ? blocks : resident);
}

template <int TYPE, int NT, int R>
static void launch_q8(cuda_impl *ci, float *y, const float *x, const uint8_t *W, const ops_weight *w, int64_t rb,
                      const mv_glu *glu, const mv_norm *nrm) {
  const size_t sm = mvq8_smem(NT, w->cols);
  constexpr int WARPS = mvq8_warps<TYPE, NT, R>();
  const unsigned g = q8_grid<TYPE, NT, R>((w->rows + WARPS * R - 1) / (WARPS * R), sm);
  static const mv_table none = {}; /* zero bytes: the same arguments every step */
  static const mv_glu plain = {};
  static const mv_norm nonorm = {};
  if constexpr (R == 2) { /* the gated instances: act_matmul's path only (launch_matvec checks) */
    if (glu && glu->og) {
      const unsigned go = q8_grid<TYPE, NT, 2, false, true>((w->rows + WARPS * 2 - 1) / (WARPS * 2), sm);
      cuda_launch_pdl(ci, "matvec q8 gated", k_matvec_q8<TYPE, NT, 2, false, true>, go, 32 * WARPS, sm, y, x, W,
                      w->rows, w->cols, rb, none, *glu, nonorm);
      return;
    }
  } else if (glu && glu->og) { /* no gated instance: never a plain store in its place */
    cuda_fail(ci, ANNA_ESTATE, "cuda: gated matvec with %d rows per warp", R);
    return;
  }
  cuda_launch_pdl(ci, "matvec q8", k_matvec_q8<TYPE, NT, R, false>, g, 32 * WARPS, sm, y, x, W, w->rows, w->cols,
                  rb, none, glu ? *glu : plain, nrm ? *nrm : nonorm);
}

/* The dynamic shared memory one kernel may use under the device's opt-in limit: the limit
 * less its static shared memory (asking for the whole limit is refused for a kernel that has
 * any). -1 when the query fails. */
template <typename K> static int q8_room(K k, int optin) {
  cudaFuncAttributes at;
  if (cudaFuncGetAttributes(&at, k) != cudaSuccess) return -1;
  return optin - (int)at.sharedSizeBytes;
}

/* The smallest room of the q8 instances for TYPE, NT (single with 2 and with 4 rows per warp,
 * grouped, gated), or with set, raises each one's dynamic limit to bytes. */
template <int TYPE, int NT> static int q8_optin(int optin, int set) {
  auto a = k_matvec_q8<TYPE, NT, 2, false>;
  auto b = k_matvec_q8<TYPE, NT, 2, false, true>;
  auto c = k_matvec_q8<TYPE, NT, mvq8_rows_r4<TYPE, NT>(), false>;
  auto d = k_matvec_q8<TYPE, NT, 2, true>;
  if (set > 0) {
    const cudaFuncAttribute A = cudaFuncAttributeMaxDynamicSharedMemorySize;
    return cudaFuncSetAttribute(a, A, set) == cudaSuccess && cudaFuncSetAttribute(b, A, set) == cudaSuccess &&
                   cudaFuncSetAttribute(c, A, set) == cudaSuccess && cudaFuncSetAttribute(d, A, set) == cudaSuccess
               ? set
               : -1;
  }
  const int r[4] = {q8_room(a, optin), q8_room(b, optin), q8_room(c, optin), q8_room(d, optin)};
  int m = r[0];
  for (int i = 1; i < 4; i++) m = r[i] < m ? r[i] : m;
  return m;
}
template <int NT> static int q8_optin_all(int optin, int set) {
  const int r[7] = {q8_optin<ANNA_DTYPE_Q4_0, NT>(optin, set), q8_optin<ANNA_DTYPE_IQ4_NL, NT>(optin, set),
                    q8_optin<ANNA_DTYPE_Q8_0, NT>(optin, set), q8_optin<ANNA_DTYPE_Q4_K, NT>(optin, set),
                    q8_optin<ANNA_DTYPE_Q5_K, NT>(optin, set), q8_optin<ANNA_DTYPE_Q6_K, NT>(optin, set),
                    q8_optin<ANNA_DTYPE_IQ4_XS, NT>(optin, set)};
  int m = r[0];
  for (int i = 1; i < 7; i++) m = r[i] < m ? r[i] : m;
  return m;
}

/* The int8 matvec's dynamic shared memory limit: the room every instance has under the
 * device's opt-in limit (each instance raised to it), else the default 48 KB. */
size_t cuda_matmul_setup(void) {
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      optin <= MVQ8_SMEM_DEFAULT) {
    (void)cudaGetLastError();
    return MVQ8_SMEM_DEFAULT;
  }
  int room = optin;
  const int rs[4] = {q8_optin_all<1>(optin, 0), q8_optin_all<2>(optin, 0), q8_optin_all<4>(optin, 0),
                     q8_optin_all<8>(optin, 0)};
  for (int i = 0; i < 4; i++) room = rs[i] < room ? rs[i] : room;
  room &= ~15; /* whole 16-byte pieces */
  if (room <= MVQ8_SMEM_DEFAULT || q8_optin_all<1>(optin, room) < 0 || q8_optin_all<2>(optin, room) < 0 ||
      q8_optin_all<4>(optin, room) < 0 || q8_optin_all<8>(optin, room) < 0) {
    (void)cudaGetLastError(); /* not fatal: the default limit still holds for every instance */
    return MVQ8_SMEM_DEFAULT;
  }
  return (size_t)room;
}

#define QCASE(T)                                                                                                      \
  case T:                                                                                                             \
    cuda_launch_pdl(ci, "matvec quant", k_matvec_quant<T, NT>, grid, th, 0, y, x, W, w->rows, w->cols, rb, xal);          \
    break;
#define PCASE(T)                                                                                \
  case T: {                                                                                     \
    constexpr int R = mvq_rows<T, NT>();                                                        \
    const unsigned g = piece_grid<T, NT, R>((w->rows + MVQ_WARPS * R - 1) / (MVQ_WARPS * R)); \
    cuda_launch_pdl(ci, "matvec piece", k_matvec_piece<T, NT, R>, g, 32 * MVQ_WARPS, 0, y, x, W, w->rows, w->cols, rb); \
    return;                                                                                     \
  }
#define Q8CASE(T)                                                                       \
  case T:                                                                               \
    if (q8 == 2) launch_q8<T, NT, mvq8_rows_r4<T, NT>()>(ci, y, x, W, w, rb, glu, nrm);  \
    else launch_q8<T, NT, 2>(ci, y, x, W, w, rb, glu, nrm);                             \
    return;

/* One weight, NT tokens (q8, smem_max: as mv_choose). glu: the q8 kernels' folded
 * activation, only where mv_choose picks them (NULL otherwise). */
template <int NT>
static void launch_matvec(cuda_impl *ci, float *y, const float *x, const uint8_t *W, const ops_weight *w,
                          int64_t rb, int vec, int q8, size_t smem_max, const mv_glu *glu = NULL,
                          const mv_norm *nrm = NULL) {
  const unsigned grid = (unsigned)((w->rows + MV_WARPS - 1) / MV_WARPS);
  const int th = 32 * MV_WARPS;
  const int xal = ((uintptr_t)x & 15) == 0;
  const mv_path path = mv_choose(w->type, W, rb, x, w->cols, NT, q8, smem_max);
  if (glu && path != MV_PATH_Q8) { /* the caller checked: only the int8 kernel folds the activation (and the gate) */
    cuda_fail(ci, ANNA_ESTATE, "cuda: act_matmul took a matvec path without the folded activation");
    return;
  }
  if (path == MV_PATH_Q8 || path == MV_PATH_Q8R4) {
    switch (w->type) {
      Q8CASE(ANNA_DTYPE_Q4_0)
      Q8CASE(ANNA_DTYPE_IQ4_NL)
      Q8CASE(ANNA_DTYPE_Q8_0)
      Q8CASE(ANNA_DTYPE_Q4_K)
      Q8CASE(ANNA_DTYPE_Q5_K)
      Q8CASE(ANNA_DTYPE_Q6_K)
      Q8CASE(ANNA_DTYPE_IQ4_XS)
    default: break;
    }
  }
  if (path == MV_PATH_PIECE) {
    switch (w->type) {
      PCASE(ANNA_DTYPE_Q4_0)
      PCASE(ANNA_DTYPE_IQ4_NL)
      PCASE(ANNA_DTYPE_Q8_0)
      PCASE(ANNA_DTYPE_Q4_K)
      PCASE(ANNA_DTYPE_Q5_K)
      PCASE(ANNA_DTYPE_Q6_K)
      PCASE(ANNA_DTYPE_IQ4_XS)
    default: break;
    }
  }
  switch (w->type) {
  case ANNA_DTYPE_F32:
    cuda_launch_pdl(ci, "matvec plain", k_matvec_plain<ANNA_DTYPE_F32, NT>, grid, th, 0, y, x, W, w->rows, w->cols,
                    vec);
    break;
  case ANNA_DTYPE_F16:
    cuda_launch_pdl(ci, "matvec plain", k_matvec_plain<ANNA_DTYPE_F16, NT>, grid, th, 0, y, x, W, w->rows, w->cols,
                    vec);
    break;
  case ANNA_DTYPE_BF16:
    cuda_launch_pdl(ci, "matvec plain", k_matvec_plain<ANNA_DTYPE_BF16, NT>, grid, th, 0, y, x, W, w->rows, w->cols,
                    vec);
    break;
    QCASE(ANNA_DTYPE_Q4_0)
    QCASE(ANNA_DTYPE_Q4_1)
    QCASE(ANNA_DTYPE_Q5_0)
    QCASE(ANNA_DTYPE_Q5_1)
    QCASE(ANNA_DTYPE_Q8_0)
    QCASE(ANNA_DTYPE_IQ4_NL)
    QCASE(ANNA_DTYPE_Q2_K)
    QCASE(ANNA_DTYPE_Q3_K)
    QCASE(ANNA_DTYPE_Q4_K)
    QCASE(ANNA_DTYPE_Q5_K)
    QCASE(ANNA_DTYPE_Q6_K)
    QCASE(ANNA_DTYPE_IQ4_XS)
  default: break; /* weight_dev rejected other types */
  }
}
#undef QCASE
#undef PCASE
#undef Q8CASE

/* ---- grouped launches (the kernels' contract is at mv_table) ---- */

/* Blocks of each entry of a grouped persistent launch: what its rows need, scaled down in
 * proportion when together they exceed `resident` (what the device holds at once), at least
 * one each. So every block is resident from the start (no second wave of a few blocks) and
 * the entries finish about together; each block's warps walk their entry's row groups. */
static void mv_split(int m, const int64_t *need, int64_t resident, int64_t *blocks) {
  int64_t total = 0;
  for (int i = 0; i < m; i++) total += need[i];
  for (int i = 0; i < m; i++) {
    const int64_t b = total <= resident ? need[i] : need[i] * resident / total;
    blocks[i] = b < 1 ? 1 : b;
  }
}

/* Sets the entries' first blocks from their block counts; returns the grid size. */
static unsigned mv_firsts(mv_table *t, int m, const int64_t *blocks) {
  int64_t at = 0;
  for (int i = 0; i < m; i++) t->e[i].first = at, at += blocks[i];
  t->count = m;
  return (unsigned)at;
}

template <int TYPE, int NT>
static void group_q8(cuda_impl *ci, mv_table *t, int m, const float *x, int64_t cols, const mv_norm *nrm) {
  const size_t sm = mvq8_smem(NT, cols);
  int64_t need[OPS_GROUP_MAX], blocks[OPS_GROUP_MAX];
  constexpr int WARPS = mvq8_warps<TYPE, NT, 2>();
  for (int i = 0; i < m; i++) need[i] = (t->e[i].rows + WARPS * 2 - 1) / (WARPS * 2);
  mv_split(m, need, q8_grid<TYPE, NT, 2, true>((int64_t)1 << 40, sm), blocks);
  const unsigned g = mv_firsts(t, m, blocks);
  static const mv_glu plain = {};
  static const mv_norm nonorm = {};
  cuda_launch_pdl(ci, "matvec q8 group", k_matvec_q8<TYPE, NT, 2, true>, g, 32 * WARPS, sm, (float *)NULL, x,
                  (const uint8_t *)NULL, (int64_t)0, cols, (int64_t)0, *t, plain, nrm ? *nrm : nonorm);
}

template <int TYPE, int NT>
static void group_piece(cuda_impl *ci, mv_table *t, int m, const float *x, int64_t cols) {
  constexpr int R = mvq_rows<TYPE, NT>();
  int64_t need[OPS_GROUP_MAX], blocks[OPS_GROUP_MAX];
  for (int i = 0; i < m; i++) need[i] = (t->e[i].rows + MVQ_WARPS * R - 1) / (MVQ_WARPS * R);
  mv_split(m, need, piece_grid<TYPE, NT, R, true>((int64_t)1 << 40), blocks);
  const unsigned g = mv_firsts(t, m, blocks);
  cuda_launch_pdl(ci, "matvec piece group", k_matvec_piece_g<TYPE, NT, R>, g, 32 * MVQ_WARPS, 0, *t, x, cols);
}

/* Plain and unit kernels: one warp per row, every block resident or not (not persistent). */
static unsigned group_rows(mv_table *t, int m, int pw = MV_WARPS) {
  int64_t blocks[OPS_GROUP_MAX];
  for (int i = 0; i < m; i++) blocks[i] = (t->e[i].rows + pw - 1) / pw;
  return mv_firsts(t, m, blocks);
}

#define GQ8(T)                                                                                                        \
  case T: group_q8<T, NT>(ci, t, m, x, cols, nrm); return;
#define GPIECE(T)                                                                                                     \
  case T: group_piece<T, NT>(ci, t, m, x, cols); return;
#define GPLAIN(T)                                                                                                     \
  case T:                                                                                                             \
    g = group_rows(t, m, mv_plain_warps<T>());                                                                \
    if (NT == 1 && rt && nrm && nrm->r)                                                                               \
      cuda_launch_pdl(ci, "matvec plain group + norm + route", k_matvec_plain_g<T, 1, true, true>, g,                \
                      32 * mv_plain_warps<T>(), (size_t)cols * sizeof(float), *t, x, cols, vec, *rt, *nrm);          \
    else if (rt) cuda_launch_pdl(ci, "matvec plain group + route", k_matvec_plain_g<T, NT, true>, g,                 \
                                 32 * mv_plain_warps<T>(), 0, *t, x, cols, vec, *rt, mv_norm{});                      \
    else cuda_launch_pdl(ci, "matvec plain group", k_matvec_plain_g<T, NT, false>, g, 32 * mv_plain_warps<T>(), 0,    \
                         *t, x, cols, vec, mv_route{}, mv_norm{});                                                    \
    return;
#define GQUANT(T)                                                                                                     \
  case T: cuda_launch_pdl(ci, "matvec quant group", k_matvec_quant_g<T, NT>, g, 32 * MV_WARPS, 0, *t, x, cols, xal); return;

/* One grouped launch of the m entries of t, all of this type and path (vec: the plain
 * kernel's flag, the same for all); rt: a route for the plain path to fold in. */
template <int NT>
static void group_launch(cuda_impl *ci, mv_path path, int type, int vec, mv_table *t, int m, const float *x,
                         int64_t cols, const mv_norm *nrm = NULL, const mv_route *rt = NULL) {
  if (path == MV_PATH_Q8) {
    switch (type) {
      GQ8(ANNA_DTYPE_Q4_0) GQ8(ANNA_DTYPE_IQ4_NL) GQ8(ANNA_DTYPE_Q8_0) GQ8(ANNA_DTYPE_Q4_K) GQ8(ANNA_DTYPE_Q5_K)
      GQ8(ANNA_DTYPE_Q6_K) GQ8(ANNA_DTYPE_IQ4_XS)
    default: break;
    }
  } else if (path == MV_PATH_PIECE) {
    switch (type) {
      GPIECE(ANNA_DTYPE_Q4_0) GPIECE(ANNA_DTYPE_IQ4_NL) GPIECE(ANNA_DTYPE_Q8_0) GPIECE(ANNA_DTYPE_Q4_K)
      GPIECE(ANNA_DTYPE_Q5_K) GPIECE(ANNA_DTYPE_Q6_K) GPIECE(ANNA_DTYPE_IQ4_XS)
    default: break;
    }
  } else if (path == MV_PATH_PLAIN) {
    unsigned g; /* by the type's warps per block */
    switch (type) {
      GPLAIN(ANNA_DTYPE_F32) GPLAIN(ANNA_DTYPE_F16) GPLAIN(ANNA_DTYPE_BF16)
    default: break;
    }
  } else if (path == MV_PATH_QUANT) {
    const unsigned g = group_rows(t, m);
    const int xal = ((uintptr_t)x & 15) == 0;
    switch (type) {
      GQUANT(ANNA_DTYPE_Q4_0) GQUANT(ANNA_DTYPE_Q4_1) GQUANT(ANNA_DTYPE_Q5_0) GQUANT(ANNA_DTYPE_Q5_1)
      GQUANT(ANNA_DTYPE_Q8_0) GQUANT(ANNA_DTYPE_IQ4_NL) GQUANT(ANNA_DTYPE_Q2_K) GQUANT(ANNA_DTYPE_Q3_K)
      GQUANT(ANNA_DTYPE_Q4_K) GQUANT(ANNA_DTYPE_Q5_K) GQUANT(ANNA_DTYPE_Q6_K) GQUANT(ANNA_DTYPE_IQ4_XS)
    default: break;
    }
  }
  /* every (path, type) pair mv_choose returns has a case above */
  cuda_fail(ci, ANNA_EINVAL, "cuda: no grouped matvec for %s (path %d)", dtype_name(type), (int)path);
}
#undef GQ8
#undef GPIECE
#undef GPLAIN
#undef GQUANT

/* NT tokens (at x; y[i] their rows of output i) of a group: the weights that take the same
 * kernel (path, type and, for plain weights, the vector flag) run as one grouped launch. A
 * weight alone without a bias, or on the 4-row bench variant (no grouped instance), keeps
 * its single launch and, with a bias, the bias kernel for these NT tokens. skip: weights
 * the caller runs elsewhere. rt (route_i its entry): a route to fold into the plain grouped
 * launch that holds entry route_i; returns whether one did (else the caller routes). */
template <int NT>
static bool group_tokens(cuda_impl *ci, int count, const int *skip, float *const *y, const float *x,
                         const uint8_t *const *W, const int64_t *rb, const ops_weight *const *ws,
                         const float *const *bd, int q8, size_t smem_max, const cuda_pnorm *pn = NULL,
                         const mv_route *rt = NULL, int route_i = -1, int shared_i = -1) {
  bool routed = false;
  const int64_t cols = ws[0]->cols;
  int key[OPS_GROUP_MAX] = {0}, done[OPS_GROUP_MAX] = {0}; /* zeroed: gcc cannot see count bounds them */
  for (int i = 0; i < count; i++) {
    done[i] = skip[i];
    const mv_path p = mv_choose(ws[i]->type, W[i], rb[i], x, cols, NT, q8, smem_max);
    key[i] = p == MV_PATH_Q8R4 ? -1 - i /* matches no other */
                               : (int)p | ws[i]->type << 4 | (p == MV_PATH_PLAIN ? mv_vec(W[i], x, cols) : 0) << 12;
  }
  /* A deferred norm of x (pn, one token): the first int8 launch takes it, first of all, as it
   * stores x's normalised row for the launches after it; without one it runs on its own. */
  int first = -1;
  mv_norm nrm = {};
  if (pn) {
    for (int i = 0; i < count && first < 0; i++)
      if (!done[i] && key[i] >= 0 && (key[i] & 15) == MV_PATH_Q8) first = i;
    /* No int8 launch: a routed group that is one plain launch takes the norm in its blocks
     * (k_matvec_plain_g, NRM), when the norm alone would be k_rmsnorm4 (whose steps it
     * reproduces) and the row fits the default shared memory. */
    if (first < 0 && NT == 1 && rt && route_i >= 0 && route_i < count && !done[route_i] && key[route_i] >= 0 &&
        (key[route_i] & 15) == MV_PATH_PLAIN && pn->d == cols && cols % 4 == 0 && cols / 4 <= CUDA_RN4_V * 1024 &&
        cols * (int64_t)sizeof(float) <= 48 * 1024 &&
        !(((uintptr_t)pn->x | (uintptr_t)pn->r | (uintptr_t)pn->y | (uintptr_t)pn->w) & 15)) {
      bool one = true;
      int members = 0; /* a lone weight takes the single-matvec kernel: no route, no norm */
      for (int i = 0; i < count; i++) one &= done[i] || key[i] == key[route_i], members += !done[i];
      if (one && members >= 2) first = route_i; /* the shared logit, if any, is in it too (same key) */
    }
    if (first < 0) {
      ci->pnorm = *pn;
      cuda_norm_flush(ci);
    } else {
      nrm = mv_norm{pn->r, pn->y, pn->w, ci->pnorm_count, pn->eps, pn->one_plus};
    }
  }
  for (int k = -1; k < count; k++) {
    const int i = k < 0 ? first : k; /* the fused launch first */
    if (i < 0 || done[i]) continue;
    mv_table t;
    memset(&t, 0, sizeof t); /* unused entries too: launch arguments are compared as bytes */
    int m = 0;
    bool has_route = false, has_shared = shared_i < 0;
    for (int j = i; j < count; j++)
      if (!done[j] && key[j] == key[i]) {
        t.e[m++] = mv_ent{W[j], y[j], bd[j], ws[j]->rows, rb[j], 0};
        done[j] = 1;
        has_route |= j == route_i;
        has_shared |= j == shared_i;
      }
    const bool fuse = i == first;
    const float *xi = fuse ? pn->x : x;
    if (key[i] < 0 || (m == 1 && !bd[i])) {
      launch_matvec<NT>(ci, y[i], xi, W[i], ws[i], rb[i], mv_vec(W[i], x, cols), q8, smem_max, NULL,
                        fuse ? &nrm : NULL);
      if (bd[i]) cuda_launch_pdl(ci, "bias", k_add_bias, grid_for(NT * ws[i]->rows), 256, 0, y[i], bd[i], (int64_t)NT,
                             ws[i]->rows);
      continue;
    }
    /* the shared logit, if any, must come from this launch too */
    const bool fold = rt && has_route && has_shared && (key[i] & 15) == MV_PATH_PLAIN;
    group_launch<NT>(ci, (mv_path)(key[i] & 15), ws[i]->type, key[i] >> 12 & 1, &t, m, xi, cols, fuse ? &nrm : NULL,
                     fold ? rt : NULL);
    routed |= fold;
  }
  return routed;
}

void cuda_op_matmul(ops_backend *be, float *y, const float *x, int64_t n, const ops_weight *w, const float *bias) {
  const cuda_pnorm pn = cuda_norm_take(be, x, n); /* before cuda_impl_of, which would launch it */
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  int64_t rb = 0;
  const uint8_t *W = weight_dev(be, w, &rb);
  if (!W) return;
  const float *bd = bias ? (const float *)cuda_mirror(be, bias, (size_t)w->rows * sizeof(float)) : NULL;
  if (bias && !bd) return;
  if (pn.x) { /* a deferred norm of x: fused into an int8 launch, else on its own first */
    const size_t smem_max = ci->mv_smem > MVQ8_SMEM_DEFAULT ? ci->mv_smem : MVQ8_SMEM_DEFAULT;
    if (mv_choose(w->type, W, rb, x, w->cols, 1, ci->mv_variant == CUDA_MV_DEFAULT && !ci->exact, smem_max) ==
        MV_PATH_Q8) {
      const mv_norm nrm = {pn.r, pn.y, pn.w, ci->pnorm_count, pn.eps, pn.one_plus};
      launch_matvec<1>(ci, y, pn.x, W, w, rb, 0, 1, smem_max, NULL, &nrm);
      if (bd && !ci->err) cuda_launch_pdl(ci, "bias", k_add_bias, grid_for(w->rows), 256, 0, y, bd, (int64_t)1, w->rows);
      cuda_check_launch(ci, "matvec");
      return;
    }
    ci->pnorm = pn;
    cuda_norm_flush(ci);
  }
  /* Q4_K's wide loads need 16-byte aligned rows (a mirror copy always is: cudaMalloc). */
  const bool wide_ok = w->type != ANNA_DTYPE_Q4_K || ((uintptr_t)W & 15) == 0;
  if (!(n <= MV_MAX_TOK && wide_ok)) cuda_flush(ci); /* cuBLAS calls are not recorded: the step goes on eagerly */
  if (n <= MV_MAX_TOK && wide_ok) {
    const int vec = mv_vec(W, x, w->cols);
    const int q8 = ci->exact || ci->mv_variant == CUDA_MV_F32 ? 0 : ci->mv_variant == CUDA_MV_INT8_R4 ? 2 : 1;
    const size_t smem_max = ci->mv_smem > MVQ8_SMEM_DEFAULT ? ci->mv_smem : MVQ8_SMEM_DEFAULT;
    /* Token groups of 4/2/1 (8 at most in one pass): few template instances. */
    for (int64_t t0 = 0; t0 < n;) {
      const int64_t left = n - t0;
      const float *xt = x + t0 * w->cols;
      float *yt = y + t0 * w->rows;
      if (left >= 8) launch_matvec<8>(ci, yt, xt, W, w, rb, vec, q8, smem_max), t0 += 8;
      else if (left >= 4) launch_matvec<4>(ci, yt, xt, W, w, rb, vec, q8, smem_max), t0 += 4;
      else if (left >= 2) launch_matvec<2>(ci, yt, xt, W, w, rb, vec, q8, smem_max), t0 += 2;
      else launch_matvec<1>(ci, yt, xt, W, w, rb, vec, q8, smem_max), t0 += 1;
    }
    if (!cuda_check_launch(ci, "matvec")) return;
  } else if (!cuda_gemm_tc(be, y, x, n, w, W, rb)) {
    const float one = 1.0f, zero = 0.0f;
    if (w->cols > (int64_t)ci->deq_floats || w->cols > 0x7fffffff || n > 0x7fffffff) {
      cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: matmul of %lld columns exceeds the GEMM tile", (long long)w->cols);
      return;
    }
    int64_t tile = (int64_t)ci->deq_floats / w->cols;
    if (tile > w->rows) tile = w->rows;
    for (int64_t r0 = 0; r0 < w->rows; r0 += tile) {
      const int64_t m = w->rows - r0 < tile ? w->rows - r0 : tile;
      const float *A;
      if (w->type == ANNA_DTYPE_F32) {
        A = (const float *)(W + r0 * rb);
      } else {
        cuda_launch(ci, "dequant", k_dequant_rows, grid_for(m * w->cols / (cuda_float_type(w->type) ? 1 : 32)), 256, 0,
                    ci->deq, W + r0 * rb, m, w->cols, rb, w->type);
        if (ci->err) return;
        A = ci->deq;
      }
      /* Column-major view: Y^T[m, n] = A^T... i.e. C(m x n, ld rows) = A(cols x m)^T B(cols x n). */
      cublasStatus_t s = cublasSgemm(ci->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)w->cols, &one, A,
                                     (int)w->cols, x, (int)w->cols, &zero, y + r0, (int)w->rows);
      if (s != CUBLAS_STATUS_SUCCESS) {
        cuda_fail(ci, ANNA_EIO, "cuda: cublasSgemm failed (status %d)", (int)s);
        return;
      }
    }
  }
  if (bd && !ci->err) {
    cuda_launch_pdl(ci, "bias", k_add_bias, grid_for(n * w->rows), 256, 0, y, bd, n, w->rows);
  }
}

/* The device copy of w when act_matmul at these sizes folds the activation into the int8
 * kernel's prologue (decode, exact off, default variant, aligned rows and pointers, the int8
 * path for the largest token chunk), with its row bytes and the shared memory limit; NULL
 * when the ops must form h first. */
static const uint8_t *act_fold_weight(ops_backend *be, cuda_impl *ci, const float *gate, const float *up, int64_t n,
                                      int64_t gs, int64_t us, const ops_weight *w, int64_t *rb, size_t *smem_max) {
  if (ci->exact || ci->mv_variant != CUDA_MV_DEFAULT || n > MV_MAX_TOK) return NULL;
  *smem_max = ci->mv_smem > MVQ8_SMEM_DEFAULT ? ci->mv_smem : MVQ8_SMEM_DEFAULT;
  const uint8_t *W = weight_dev(be, w, rb);
  const int first = n >= 8 ? 8 : n >= 4 ? 4 : n >= 2 ? 2 : 1; /* the largest chunk needs the most shared memory */
  if (W && gs % 4 == 0 && us % 4 == 0 && (((uintptr_t)gate | (uintptr_t)up | (uintptr_t)W) & 15) == 0 &&
      mv_choose(w->type, W, *rb, up, w->cols, first, 1, *smem_max) == MV_PATH_Q8)
    return W;
  return NULL;
}

/* The folded launches for n tokens in chunks of 8/4/2/1 (W from act_fold_weight); og: the
 * gated add's gates (NULL: plain act_matmul). */
static void act_fold_launch(cuda_impl *ci, float *y, const float *gate, const float *up, int64_t n, int64_t gs,
                            int64_t us, int act, const float *og, int64_t ogs, const uint8_t *W, const ops_weight *w,
                            int64_t rb, size_t smem_max) {
  for (int64_t t0 = 0; t0 < n;) {
    const int64_t left = n - t0;
    const mv_glu glu = {gate + t0 * gs, gs, us, act, og ? og + t0 * ogs : NULL, ogs};
    const float *xt = up + t0 * us;
    float *yt = y + t0 * w->rows;
    if (left >= 8) launch_matvec<8>(ci, yt, xt, W, w, rb, 0, 1, smem_max, &glu), t0 += 8;
    else if (left >= 4) launch_matvec<4>(ci, yt, xt, W, w, rb, 0, 1, smem_max, &glu), t0 += 4;
    else if (left >= 2) launch_matvec<2>(ci, yt, xt, W, w, rb, 0, 1, smem_max, &glu), t0 += 2;
    else launch_matvec<1>(ci, yt, xt, W, w, rb, 0, 1, smem_max, &glu), t0 += 1;
  }
}

/* Decode sizes whose weight takes the int8 kernel fold the activation into its prologue (one
 * launch instead of act_mul + matvec, h left alone); everything else forms h first. */
void cuda_op_act_matmul(ops_backend *be, float *y, float *h, const float *gate, const float *up, int64_t n, int64_t gs,
                        int64_t us, int act, const ops_weight *w) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  int64_t rb = 0;
  size_t smem_max = 0;
  const uint8_t *W = act_fold_weight(be, ci, gate, up, n, gs, us, w, &rb, &smem_max);
  if (W) {
    act_fold_launch(ci, y, gate, up, n, gs, us, act, NULL, 0, W, w, rb, smem_max);
    return;
  }
  if (ci->err) return; /* weight_dev failed */
  cuda_op_act_mul(be, h, gate, up, n, (int)w->cols, gs, us, act);
  cuda_op_matmul(be, y, h, n, w, NULL);
}

/* Where act_matmul folds the activation, the gate and the add go into the same kernel's
 * epilogue (one launch instead of three ops, tmp left alone); elsewhere the three ops run
 * as the model would compose them, so the bits are the same by construction. */
void cuda_op_act_matmul_gated_add(ops_backend *be, float *y, float *tmp, float *h, const float *gate, const float *up,
                                  int64_t n, int64_t gs, int64_t us, int act, const float *g, int64_t g_stride,
                                  const ops_weight *w) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  int64_t rb = 0;
  size_t smem_max = 0;
  const uint8_t *W = act_fold_weight(be, ci, gate, up, n, gs, us, w, &rb, &smem_max);
  if (W) {
    act_fold_launch(ci, y, gate, up, n, gs, us, act, g, g_stride, W, w, rb, smem_max);
    return;
  }
  if (ci->err) return;
  cuda_op_act_matmul(be, tmp, h, gate, up, n, gs, us, act, w);
  cuda_op_mul_sigmoid(be, tmp, g, n, (int)w->rows, g_stride, 1);
  cuda_op_add(be, y, tmp, n * w->rows);
}

/* The group's weights and biases on the device (W, rb, bd) and the weights the grouped
 * launches leave to cuda_op_matmul (skip); false (error set) when a mirror fails. */
static bool group_weights(ops_backend *be, int count, const ops_weight *const *ws, const float *const *biases,
                          const uint8_t **W, int64_t *rb, const float **bd, int *skip) {
  for (int i = 0; i < count; i++) {
    W[i] = weight_dev(be, ws[i], &rb[i]);
    if (!W[i]) return false;
    const float *b = biases ? biases[i] : NULL;
    bd[i] = b ? (const float *)cuda_mirror(be, b, (size_t)ws[i]->rows * sizeof(float)) : NULL;
    if (b && !bd[i]) return false;
    /* Q4_K rows off 16-byte alignment (a weight given as a device pointer) take
     * cuda_op_matmul's GEMM path, as they would alone */
    skip[i] = ws[i]->type == ANNA_DTYPE_Q4_K && ((uintptr_t)W[i] & 15) != 0;
  }
  return true;
}

void cuda_op_matmul_group(ops_backend *be, int count, float *const *ys, const float *x, int64_t n,
                          const ops_weight *const *ws, const float *const *biases) {
  const cuda_pnorm pn = cuda_norm_take(be, x, n); /* before cuda_impl_of, which would launch it */
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  if (count < 1 || count > OPS_GROUP_MAX) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: matmul group of %d weights (1..%d)", count, OPS_GROUP_MAX);
    return;
  }
  if (pn.x && count == 1) { /* a group of one, as cuda_op_matmul */
    ci->pnorm = pn;
    cuda_op_matmul(be, ys[0], x, n, ws[0], biases ? biases[0] : NULL);
    return;
  }
  const int64_t cols = ws[0]->cols;
  for (int i = 1; i < count; i++)
    if (ws[i]->cols != cols) {
      cuda_fail(ci, ANNA_EINVAL, "cuda: matmul group of %lld- and %lld-column weights", (long long)cols,
                (long long)ws[i]->cols);
      return;
    }
  if (n > MV_MAX_TOK) { /* prefill: one GEMM per weight, nothing to share */
    for (int i = 0; i < count; i++) cuda_op_matmul(be, ys[i], x, n, ws[i], biases ? biases[i] : NULL);
    return;
  }
  const uint8_t *W[OPS_GROUP_MAX];
  const float *bd[OPS_GROUP_MAX];
  int64_t rb[OPS_GROUP_MAX];
  int skip[OPS_GROUP_MAX];
  if (!group_weights(be, count, ws, biases, W, rb, bd, skip)) return;
  const int q8 = ci->exact || ci->mv_variant == CUDA_MV_F32 ? 0 : ci->mv_variant == CUDA_MV_INT8_R4 ? 2 : 1;
  const size_t smem_max = ci->mv_smem > MVQ8_SMEM_DEFAULT ? ci->mv_smem : MVQ8_SMEM_DEFAULT;
  /* the token groups of cuda_op_matmul (8/4/2/1), each with all the weights */
  for (int64_t t0 = 0; t0 < n;) {
    const int64_t left = n - t0;
    const float *xt = x + t0 * cols;
    float *yt[OPS_GROUP_MAX];
    for (int i = 0; i < count; i++) yt[i] = ys[i] + t0 * ws[i]->rows;
    if (left >= 8) group_tokens<8>(ci, count, skip, yt, xt, W, rb, ws, bd, q8, smem_max), t0 += 8;
    else if (left >= 4) group_tokens<4>(ci, count, skip, yt, xt, W, rb, ws, bd, q8, smem_max), t0 += 4;
    else if (left >= 2) group_tokens<2>(ci, count, skip, yt, xt, W, rb, ws, bd, q8, smem_max), t0 += 2;
    else group_tokens<1>(ci, count, skip, yt, xt, W, rb, ws, bd, q8, smem_max, pn.x ? &pn : NULL), t0 += 1;
  }
  if (!cuda_check_launch(ci, "matvec group")) return;
  for (int i = 0; i < count; i++)
    if (skip[i]) cuda_op_matmul(be, ys[i], x, n, ws[i], biases ? biases[i] : NULL);
}

void cuda_op_matmul_group_route(ops_backend *be, int count, float *const *ys, const float *x, int64_t n,
                                const ops_weight *const *ws, const float *const *biases, int route, int32_t *idx,
                                float *wts, int k, int renorm, const float *per_expert, int shared) {
  cuda_impl *ci = (cuda_impl *)be->impl; /* no cuda_impl_of yet: a deferred norm of x is the group's */
  if (shared >= count || (shared >= 0 && (shared == route || ws[shared]->rows != 1))) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: matmul_group_route: shared entry %d is not a one-row weight of the group",
              shared);
    return;
  }
  const bool ok = route >= 0 && route < count && count <= OPS_GROUP_MAX && ws[route]->rows <= 256 && k >= 1 &&
                  k <= 32 && k <= ws[route]->rows && ci->route_count;
  /* one token chunk (the route runs once, after every row of it), 16-byte aligned rows */
  const bool one = n == 1 || n == 2 || n == 4 || n == 8;
  const float *sh = shared >= 0 ? ys[shared] : NULL;
  if (!ok || !one || ws[0]->cols % 8 != 0) {
    cuda_op_matmul_group(be, count, ys, x, n, ws, biases);
    if (route >= 0 && route < count)
      cuda_moe_route_shared(be, idx, wts, ys[route], n, (int)ws[route]->rows, k, renorm, per_expert, sh);
    return;
  }
  const cuda_pnorm pn = cuda_norm_take(be, x, n);
  ci = cuda_impl_of(be);
  if (ci->err) return;
  const int64_t cols = ws[0]->cols, E = ws[route]->rows;
  const uint8_t *W[OPS_GROUP_MAX];
  const float *bd[OPS_GROUP_MAX];
  int64_t rb[OPS_GROUP_MAX];
  int skip[OPS_GROUP_MAX];
  for (int i = 0; i < count; i++)
    if (ws[i]->cols != cols) {
      cuda_fail(ci, ANNA_EINVAL, "cuda: matmul group of %lld- and %lld-column weights", (long long)cols,
                (long long)ws[i]->cols);
      return;
    }
  if (!group_weights(be, count, ws, biases, W, rb, bd, skip)) return;
  const float *pe = per_expert ? (const float *)cuda_mirror(be, per_expert, (size_t)E * sizeof(float)) : NULL;
  if (per_expert && !pe) return;
  const int q8 = ci->exact || ci->mv_variant == CUDA_MV_F32 ? 0 : ci->mv_variant == CUDA_MV_INT8_R4 ? 2 : 1;
  const size_t smem_max = ci->mv_smem > MVQ8_SMEM_DEFAULT ? ci->mv_smem : MVQ8_SMEM_DEFAULT;
  const mv_route rt = {ys[route], idx, wts, pe, sh, ci->route_count, E, k, renorm, n};
  /* a weight run elsewhere (skip) cannot take part: its rows come after the launch */
  const int ri = skip[route] || (shared >= 0 && skip[shared]) ? -1 : route;
  bool routed;
  if (n == 8) routed = group_tokens<8>(ci, count, skip, ys, x, W, rb, ws, bd, q8, smem_max, NULL, &rt, ri, shared);
  else if (n == 4) routed = group_tokens<4>(ci, count, skip, ys, x, W, rb, ws, bd, q8, smem_max, NULL, &rt, ri, shared);
  else if (n == 2) routed = group_tokens<2>(ci, count, skip, ys, x, W, rb, ws, bd, q8, smem_max, NULL, &rt, ri, shared);
  else
    routed = group_tokens<1>(ci, count, skip, ys, x, W, rb, ws, bd, q8, smem_max, pn.x ? &pn : NULL, &rt, ri, shared);
  if (!cuda_check_launch(ci, "matvec group")) return;
  for (int i = 0; i < count; i++)
    if (skip[i]) cuda_op_matmul(be, ys[i], x, n, ws[i], biases ? biases[i] : NULL);
  if (!routed) cuda_moe_route_shared(be, idx, wts, ys[route], n, (int)E, k, renorm, per_expert, sh);
}

static __global__ void k_embed(float *out, const uint8_t *T, int64_t rows, int64_t cols, int64_t row_bytes, int type,
                               const int32_t *ids, float scale) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float *o = out + t * cols;
  if (id < 0 || id >= rows) { /* the forward pass rejects such ids first; stay in bounds anyway */
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) o[i] = 0.0f;
    return;
  }
  const uint8_t *row = T + (int64_t)id * row_bytes;
  if (cuda_float_type(type)) {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) o[i] = cuda_ldw(type, row, i) * scale;
    return;
  }
  for (int64_t u = threadIdx.x; u < cols / 32; u += blockDim.x) {
    float w[32];
    cuda_deq32(type, row, u, w);
    for (int j = 0; j < 32; j++) o[u * 32 + j] = w[j] * scale;
  }
}

void cuda_op_embed(ops_backend *be, float *out, const ops_weight *table, const int32_t *ids, int64_t n, float scale) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  int64_t rb = 0;
  const uint8_t *T = weight_dev(be, table, &rb);
  if (!T) return;
  for (int64_t t0 = 0; t0 < n; t0 += 65535) {
    const int64_t cnt = n - t0 < 65535 ? n - t0 : 65535;
    cuda_launch_pdl(ci, "embed", k_embed, (unsigned)cnt, 128, 0,
                out + t0 * table->cols, T, table->rows, table->cols, rb, table->type, ids + t0, scale);
  }
  cuda_check_launch(ci, "embed");
}
