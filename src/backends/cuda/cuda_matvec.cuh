/* cuda_matvec.cuh: the decode matvec kernels of cuda_matmul.cu (device code and the launch
 * tables they take; the launchers, which pick a kernel per weight type, token count and path,
 * stay in cuda_matmul.cu, its only includer). cuda_matmul.cu's header comment describes the
 * paths: f32 plain and unit kernels, the piece kernel, the int8-activation kernel
 * (k_matvec_q8), each in a single and a grouped form. Include after cuda_internal.h,
 * cuda_math.cuh, cuda_q8act.cuh, cuda_quant.cuh, cuda_route.cuh and model/config.h. */
#ifndef ANNA_BACKENDS_CUDA_MATVEC_CUH
#define ANNA_BACKENDS_CUDA_MATVEC_CUH

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

#endif
