/* cuda_mmq.cu: decode batches of 9..CUDA_MMQ_MAX_TOK tokens on int8 tensor cores.
 *
 * A step of many sequences multiplies every weight by a few dozen activation rows. The
 * dp4a matvec (cuda_matvec.cuh) takes at most MV_MAX_TOK = 8 tokens per weight read, so 64
 * sequences read the weights 8 times; the prefill GEMM dequantizes every weight to bf16
 * (writes and re-reads 2 bytes per weight). Here each weight is read once for all tokens:
 *   k_mmq_quant_x  the activations to int8 once per call, per 32-element block: scale
 *                  d = max|x| / 127, q = rint(x / d) clamped to +-127 (k_matvec_q8's rule,
 *                  so a batch and a lone decode round the activations alike), and the
 *                  block's d * sum(q) (Q4_K / Q5_K mins). Into the backend's GEMM scratch
 *                  (unused by decode-sized batches), padded with zeros to whole tiles
 *                  (tokens to BN, columns to MMQ_KS):
 *                    xq [npad][colsp] int8, each 32-byte block's words in mmq_wpos order,
 *                    xd [colsp / 32][npad] f32 scales, xs [colsp / 32][npad] f32 sums
 *                    (form 3: both in xd's place as [colsp / 32][npad / 2][d, d, sum, sum]);
 *   k_mmq<TYPE,BN> tiles of MMQ_BM = 64 weight rows x BN (16, 32, 64) tokens, 4 warps of
 *                  32 rows x BN / 2 tokens, K in steps of MMQ_KS = 256 (eight 32-blocks, or
 *                  one K-quant super-block). Per step each thread decodes 4 pieces
 *                  (cuda_piece_load + cuda_q8_decode, the decode matvec's decoders) to int8
 *                  in shared memory, in the activations' word order, with the offsets of
 *                  Q4_0 (8) and Q6_K (32) subtracted and IQ4's pair words combined, so every
 *                  format is a plain int8 matrix with one f32 scale per 32-block (Q6_K: per
 *                  16-run) and row. Per 32-block one mma.sync m16n8k32 s8 (Q6_K: two
 *                  m16n8k16) starts at the bits of 1.5 * 2^23 (|dot| < 2^22) so its int32
 *                  result becomes a float with one subtraction, and acc += d_w d_x dot
 *                  (- mn_w * xs for Q4_K / Q5_K). Two stages: the next step's weight words
 *                  are in registers and its activations in flight (cp.async) while the
 *                  tensor cores work on this one.
 * The kernel is a revival of the int8 prefill GEMM retired in session 14 (bench/RESULTS.md,
 * "Variants retired": slower than bf16 cuBLAS at 512+ tokens); at decode sizes the bf16 path
 * pays a full dequantized copy of every weight per step, which this one does not.
 * Shared memory rows are MMQ_KS + 32 bytes: with the word order, a thread's two fragment
 * words of a 32-block (bytes 4t.. and 16 + 4t..) are one 8-byte load and the 16 lanes of a
 * half-warp hit distinct banks. Split K (tuning cuda_mmq_split_k, on since its session-18 H100 checks):
 * a decode-sized call has few row blocks (64 for a 4096-row weight against 132 SMs), so K is
 * cut into S slices (about two blocks per SM, S set by the weight's shape alone) whose partial
 * sums k_mmq_reduce adds in slice order (session 17 H100 without it: 11.8 ms for one token of the
 * 9B shape, 24.3 ms for 64, against 1.6 ms to read the weights; with it, session 18: 19.3 ms
 * for 64). Results do not depend on the other tokens of the batch: each
 * (row, token) sums its 32-blocks and its slices in the same order whatever n is.
 * Three forms of k_mmq (tuning cuda_mmq_v2, mmq_cfg). Form 0 has 4 warps per block, and
 * with ~94 KB of shared memory and 160-220 registers per thread at BN = 64 an SM holds two
 * blocks, 8 warps, too few to hide the shared-load -> MMA -> FMA chains and the decode's
 * global loads (a 64-token step of the 9B shape spent ~4x the time of a pass that decodes
 * the same weights). Form 1 runs the same 64 x BN tile on 8 warps (256 threads, at most 128
 * registers): 16 warps per SM, two pieces per thread per step instead of four, warps of
 * 32 rows x 16 tokens (BN = 64) or 16 rows x 8 NJ tokens, the 32-block loop unrolled twice.
 * Form 2 also steps K by 128 columns (four pieces per row per step, one per thread): half
 * the shared memory (51 KB at BN = 64), so three blocks per SM at most 80 registers (BN =
 * 64 spills 16-80 bytes there), and the 320-384-block grids of the 9B shape's weights at 64
 * tokens fit one wave of 132 x 3. Form 3 is form 2 with the scales packed (mmq_cfg PK): the
 * session-20 ncu of form 0 (H100, BN = 16) showed the L1 / shared-memory pipe at 78% with
 * issue slots at 49%, and per 32-block a warp loaded (scale, min) of its two row halves as
 * four 4-byte loads per m-tile and the x scale and sum as two 8-byte loads per n-tile: form 3
 * stores them so each is one 16-byte load (and k_mmq_quant_x writes the x pair interleaved).
 * Only the split of the work and the shared layout change: every (row, token) takes the same
 * dots, scales and additions in the same order and the K slices are the same, so the bits
 * are the same (test_cuda_ops mmq_v2 compares them). */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_async.cuh"
#include "backends/cuda/cuda_quant.cuh"

#include "base/error.h"

#define MMQ_BM 64         /* weight rows per block */
#define MMQ_KS 256        /* K elements per pipeline step (the first kernel); K slices count in these */
#define MMQ_THREADS 128 /* the first kernel (tuning cuda_mmq_v2=0); v2 has 256 */
#define MMQ_MAGIC 0x4B400000 /* 12582912.0f = 1.5 * 2^23 */

/* A block's shape: BN tokens, NT threads (128: the first kernel, 256: v2), K steps of KS
 * columns (256; v2 mode 2: 128, half the shared memory). Warps WM along the 64 rows (MI
 * m-tiles of 16 each) by WN along the tokens (NJ n-tiles of 8 each); each thread decodes
 * PPT pieces per step: piece tid % PPS of the step's PPS = KS / 32 per row, rows tid / PPS +
 * RSTEP i. One stage of shared memory: weights, activations (rows of ST = KS + 32 bytes),
 * weight scales (2U units: Q6_K's 16-runs), mins, x scales, x sums (U = KS / 32 units);
 * two stages per block. Only the split of the work differs between the forms: every
 * (row, token) sums the same dots in the same order. */
template <int BN, int NT, int KS, bool PK = false> struct mmq_cfg {
  static constexpr int WARPS = NT / 32, WN = NT == MMQ_THREADS ? 2 : BN == 64 ? 4 : 2, WM = WARPS / WN;
  static constexpr int LWM = WM == 1 ? 0 : WM == 2 ? 1 : 2; /* log2 WM: warp = wm + WM wn */
  static constexpr int MI = MMQ_BM / 16 / WM, NJ = BN / 8 / WN;
  static constexpr int U = KS / 32, PPS = U, LPPS = KS == 256 ? 3 : 2, PPT = MMQ_BM * PPS / NT, RSTEP = NT / PPS;
  static constexpr int ST = KS + 32;
  static constexpr int W = 0, X = MMQ_BM * ST, SW = X + BN * ST, MN = SW + 2 * U * MMQ_BM * 4, XD = MN + U * MMQ_BM * 4,
                       XS = XD + U * BN * 4, STAGE = XS + U * BN * 4, SMEM = 2 * STAGE;
  static_assert(WM * WN == WARPS && (1 << LWM) == WM && MI >= 1 && NJ >= 1 && MI * 16 * WM == MMQ_BM && NJ * 8 * WN == BN,
                "tiling");
  static_assert((KS == 256 || KS == 128) && (1 << LPPS) == PPS && PPT >= 1 && PPT * NT == MMQ_BM * PPS, "pieces");
  /* PK (form 3): the same regions hold the scales packed for one 16-byte load each: SW as
   * [U][4 m-tiles][8 g][4] = per 32-block b and rows 16 m + g, 16 m + 8 + g: (scale, scale,
   * min, min) (Q6_K: runs 2b and 2b + 1: scale(g), scale(g + 8) of each; plain types: scale,
   * scale, -, -), XD..XS as [U][BN / 2][4] = d(2p), d(2p + 1), sum(2p), sum(2p + 1) */
  static_assert(2 * U * MMQ_BM * 4 == U * 4 * 8 * 16 && XS - XD + U * BN * 4 == U * (BN / 2) * 16, "packed sizes");
};

/* ---- device primitives ---- */
static __device__ __forceinline__ uint8_t *mmq_smem_base() {
  extern __shared__ __align__(16) uint8_t mmq_smem[];
  return mmq_smem;
}
static __device__ __forceinline__ uint2 mmq_lds64(const uint8_t *p) {
  return *(const uint2 *)p;
}
/* D = A B + MMQ_MAGIC, D as floats: 1.5 * 2^23 + dot. A 16x32 row-major (a0: row g, bytes
 * 4t..; a1: row g + 8, bytes 4t..; a2, a3: the same rows, bytes 16 + 4t..), B 32x8 column-major
 * (b0: column g, bytes 4t..; b1: bytes 16 + 4t..), D (d0, d1: row g, columns 2t, 2t + 1; d2, d3:
 * row g + 8), g = lane / 4, t = lane % 4 (PTX ISA, mma.m16n8k32 .s8 fragments). */
static __device__ __forceinline__ void mmq_mma32(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint32_t b0, uint32_t b1) {
  int r0, r1, r2, r3;
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(MMQ_MAGIC));
  d[0] = __int_as_float(r0), d[1] = __int_as_float(r1), d[2] = __int_as_float(r2), d[3] = __int_as_float(r3);
}
/* m16n8k16 .s8: a0 row g, bytes 4t..; a1 row g + 8; b0 column g, bytes 4t..; D as above. */
static __device__ __forceinline__ void mmq_mma16(float *d, uint32_t a0, uint32_t a1, uint32_t b0) {
  int r0, r1, r2, r3;
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
      : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
      : "r"(a0), "r"(a1), "r"(b0), "r"(MMQ_MAGIC));
  d[0] = __int_as_float(r0), d[1] = __int_as_float(r1), d[2] = __int_as_float(r2), d[3] = __int_as_float(r3);
}

/* ---- tile code ---- */

/* Byte offset of logical word w (bytes 4w..4w+3) in a 32-byte block: words 0-3 to even
 * slots, 4-7 to odd ones, so words t and 4 + t (one thread's fragment pair) are adjacent. */
static __host__ __device__ __forceinline__ int mmq_wpos(int w) {
  return 4 * (2 * (w & 3) + (w >> 2));
}

template <int TYPE> __host__ __device__ constexpr bool mmq_has_min() {
  return TYPE == ANNA_DTYPE_Q4_K || TYPE == ANNA_DTYPE_Q5_K;
}

/* x [n, cols] -> xq, xd, xs (layout in the header comment); 8 lanes per 32-block (4
 * elements each), blocks numbered token-major over the padded [npad][nbp]. Lanes past the
 * end take part in the shuffles with zeros. */
static __global__ void __launch_bounds__(256)
    k_mmq_quant_x(int8_t *xq, float *xd, float *xs, const float *x, int64_t n, int64_t cols, int64_t npad,
                  int64_t colsp, int packed) {
  const int lane = threadIdx.x & 31, m = lane & 7;
  const int64_t nbp = colsp / 32, nb = cols / 32, total = npad * nbp;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t u0 = ((int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * 4; u0 < total; u0 += warps * 4) {
    const int64_t u = u0 + (lane >> 3), t = u / nbp, b = u - t * nbp;
    const bool live = u < total && t < n && b < nb;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
      const float *p = x + t * cols + b * 32 + 4 * m;
#pragma unroll
      for (int e = 0; e < 4; e++) v[e] = p[e];
    }
    float am = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    const float d = am * (1.0f / 127.0f), inv = am > 0.0f ? 127.0f / am : 0.0f;
    int q[4];
#pragma unroll
    for (int e = 0; e < 4; e++) q[e] = max(-127, min(127, __float2int_rn(v[e] * inv)));
    int s = q[0] + q[1] + q[2] + q[3];
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (u < total) {
      const uint32_t wv = __byte_perm(__byte_perm(q[0], q[1], 0x0040), __byte_perm(q[2], q[3], 0x0040), 0x5410);
      *(uint32_t *)(xq + t * colsp + b * 32 + mmq_wpos(m)) = wv;
      if (m == 0 && packed) { /* form 3: xd [colsp / 32][npad / 2][4] = d(2p), d(2p + 1), sum(2p), sum(2p + 1) */
        float *q = xd + 2 * (b * npad + (t & ~(int64_t)1)) + (t & 1);
        q[0] = d, q[2] = d * (float)s;
      } else if (m == 0) {
        xd[b * npad + t] = d, xs[b * npad + t] = d * (float)s;
      }
    }
  }
}

/* Issues the cp.async copies of step s's activation tile (tokens t0..t0 + BN) into a stage. */
template <int TYPE, int BN, int NT, int KS, bool PK>
static __device__ __forceinline__ void mmq_load_x(uint8_t *st, const int8_t *xq, const float *xd, const float *xs,
                                                  int64_t t0, int64_t npad, int64_t colsp, int s, int tid) {
  typedef mmq_cfg<BN, NT, KS, PK> L;
  constexpr int CH = BN * (KS / 16); /* 16-byte chunks; BN = 16, KS = 128: half the threads copy one */
  static_assert(CH % NT == 0 || CH < NT, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < (CH + NT - 1) / NT; i++) {
    const int c = tid + NT * i, tok = c / (KS / 16), ch = c % (KS / 16);
    if (CH % NT == 0 || c < CH)
      cuda_cp16(st + L::X + tok * L::ST + 16 * ch, xq + (t0 + tok) * colsp + (int64_t)s * KS + 16 * ch);
  }
  if constexpr (PK) { /* U units x BN / 2 token pairs of (d, d, sum, sum): one chunk each */
    static_assert(L::U * BN / 2 <= NT, "one scale chunk per thread at most");
    if (tid < L::U * BN / 2) {
      const int u = tid / (BN / 2), j = tid % (BN / 2);
      cuda_cp16(st + L::XD + 16 * tid, xd + 2 * (((int64_t)s * L::U + u) * npad + t0) + 4 * j);
    }
    cuda_cp_commit();
    return;
  }
  /* U units x BN floats: U BN / 4 chunks of 4 floats */
  static_assert(L::U * BN / 4 <= NT, "one scale chunk per thread at most");
  if (tid < L::U * BN / 4) {
    const int u = tid / (BN / 4), j = tid % (BN / 4);
    const int64_t src = ((int64_t)s * L::U + u) * npad + t0 + 4 * j;
    cuda_cp16(st + L::XD + 4 * (u * BN + 4 * j), xd + src);
    if constexpr (mmq_has_min<TYPE>()) cuda_cp16(st + L::XS + 4 * (u * BN + 4 * j), xs + src);
  }
  cuda_cp_commit();
}

/* Pieces of this thread in a step: rows tid / PPS + RSTEP i (i < PPT), piece tid % PPS of the step. */
template <int TYPE, int NT, int KS>
static __device__ __forceinline__ void mmq_load_w(uint32_t (*raw)[cuda_piece<TYPE>::RAW], const uint8_t *W,
                                                  int64_t r0, int64_t rows, int64_t rb, int64_t pieces, int s,
                                                  int tid) {
  typedef mmq_cfg<16, NT, KS> C; /* PPS, PPT and RSTEP do not depend on BN */
  const int64_t p = (int64_t)s * C::PPS + (tid & (C::PPS - 1));
  if (p >= pieces) return;
#pragma unroll
  for (int i = 0; i < C::PPT; i++) {
    const int64_t r = r0 + (tid >> C::LPPS) + C::RSTEP * i;
    cuda_piece_load<TYPE>(W + (r < rows ? r : rows - 1) * rb, p, p == pieces - 1, raw[i]);
  }
}

/* Decodes the loaded pieces into a stage: int8 words at their elements (mmq_wpos order),
 * scales per unit (32-block; Q6_K 16-run) in sw[unit][row], Q4_K / Q5_K mins in mn[block][row].
 * A piece past the row's end (32-element formats, last step) stores zeros. */
template <int TYPE, int BN, int NT, int KS, bool PK>
static __device__ __forceinline__ void mmq_decode_w(uint8_t *st, const uint32_t (*raw)[cuda_piece<TYPE>::RAW],
                                                    const uint8_t *W, int64_t r0, int64_t rows, int64_t rb,
                                                    int64_t pieces, int s, int tid) {
  typedef mmq_cfg<BN, NT, KS, PK> C, L;
  constexpr int HI = cuda_piece<TYPE>::HI;
  constexpr bool Q6 = TYPE == ANNA_DTYPE_Q6_K;
  constexpr bool R16 = Q6 || cuda_iq_run_scales(TYPE); /* a scale per 16-run (IQ2_XS / IQ2_S: runs of one block) */
  const int k = tid & (C::PPS - 1); /* piece of the step; its parity is that of the super-block's piece p & 7 */
  const int64_t p = (int64_t)s * C::PPS + k;
  const int el = (int)(cuda_q8_e0<TYPE>(p) - (int64_t)s * KS); /* run 0's first element in the step */
  float *sw = (float *)(st + L::SW), *smn = (float *)(st + L::MN);
#pragma unroll
  for (int i = 0; i < C::PPT; i++) {
    const int lr = (tid >> C::LPPS) + C::RSTEP * i;
    const int64_t r = r0 + lr;
    uint32_t v[8];
    float sc[2] = {0.0f, 0.0f}, mn[2] = {0.0f, 0.0f};
    if (p < pieces) {
      int wq[cuda_q8p<TYPE>::NW];
      cuda_q8_decode<TYPE>(W + (r < rows ? r : rows - 1) * rb, p, raw[i], wq, sc, mn);
      if constexpr (TYPE == ANNA_DTYPE_IQ4_NL || TYPE == ANNA_DTYPE_IQ4_XS) {
        /* word pairs (2j, 2j + 1) + (8 + 2j, 9 + 2j) are T[] of elements 4j, 4j + 16, 4j + 1,
         * 4j + 17 | 4j + 2, 4j + 18, 4j + 3, 4j + 19 (byte-wise sums, exact): regroup */
#pragma unroll
        for (int j = 0; j < 4; j++) {
          const uint32_t v0 = __vadd4((uint32_t)wq[2 * j], (uint32_t)wq[8 + 2 * j]);
          const uint32_t v1 = __vadd4((uint32_t)wq[2 * j + 1], (uint32_t)wq[9 + 2 * j]);
          v[j] = __byte_perm(v0, v1, 0x6420), v[4 + j] = __byte_perm(v0, v1, 0x7531);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; j++) {
          const uint32_t q = (uint32_t)wq[j];
          v[j] = TYPE == ANNA_DTYPE_Q4_0 ? __vsub4(q, 0x08080808u) : Q6 ? __vsub4(q, 0x20202020u) : q;
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; j++) v[j] = 0;
    }
    uint8_t *wr = st + L::W + lr * L::ST;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const int e = el + (j < 4 ? 4 * j : HI + 4 * (j - 4));
      *(uint32_t *)(wr + (e >> 5) * 32 + mmq_wpos((e & 31) >> 2)) = v[j];
    }
    if constexpr (PK) {
      /* row lr = 16 m + 8 h + g: float slot h of (b, m, g) for scales, 2 + h for mins / Q6_K's odd run */
      float *q = sw + 4 * (8 * (lr >> 4) + (lr & 7)) + ((lr >> 3) & 1);
      if constexpr (R16) {
        const int u0 = el >> 4, u1 = (el + HI) >> 4; /* 16-runs: block u / 2, slot 2 (u % 2) + h */
        q[128 * (u0 >> 1) + 2 * (u0 & 1)] = sc[0], q[128 * (u1 >> 1) + 2 * (u1 & 1)] = sc[1];
      } else if constexpr (HI == 32) {
        if ((k & 1) == 0) {
          const int u = el >> 5;
          q[128 * u] = sc[0], q[128 * u + 2] = mn[0], q[128 * (u + 1)] = sc[1], q[128 * (u + 1) + 2] = mn[1];
        }
      } else {
        q[128 * k] = sc[0];
      }
    } else if constexpr (R16) {
      sw[(el >> 4) * MMQ_BM + lr] = sc[0], sw[((el + HI) >> 4) * MMQ_BM + lr] = sc[1];
    } else if constexpr (HI == 32) { /* Q4_K / Q5_K: the pieces 2c, 2c + 1 carry sub-blocks 2c, 2c + 1 */
      if ((k & 1) == 0) {
        const int u = el >> 5;
        sw[u * MMQ_BM + lr] = sc[0], sw[(u + 1) * MMQ_BM + lr] = sc[1];
        smn[u * MMQ_BM + lr] = mn[0], smn[(u + 1) * MMQ_BM + lr] = mn[1];
      }
    } else {
      sw[k * MMQ_BM + lr] = sc[0];
    }
  }
}

/* One step of MMAs on a stage: warp (wm, wn) = (warp % WM, warp / WM) owns rows 16 MI wm..
 * and tokens 8 NJ wn..; acc[i][j][e]: m-tile i, n-tile j, fragment element e. Each
 * accumulator takes its 32-blocks in order b = 0..7 whatever the unrolling (UNR: v2 unrolls
 * twice so one block's shared loads overlap the other's MMAs and FMAs). */
template <int TYPE, int BN, int NT, int KS, bool PK>
static __device__ __forceinline__ void mmq_mma_step(const uint8_t *st, float (*acc)[mmq_cfg<BN, NT, KS, PK>::NJ][4],
                                                    int warp, int lane) {
  typedef mmq_cfg<BN, NT, KS, PK> C, L;
  constexpr int ST = C::ST;
  constexpr bool Q6 = TYPE == ANNA_DTYPE_Q6_K || cuda_iq_run_scales(TYPE), MIN = mmq_has_min<TYPE>(); /* 16-runs */
  constexpr int NJ = C::NJ, MI = C::MI, UNR = NT == MMQ_THREADS ? 1 : 2;
  const int g = lane >> 2, t = lane & 3, wm = warp & (C::WM - 1), wn = warp >> C::LWM;
  const uint8_t *wt = st + L::W + (wm * 16 * MI + g) * ST + 8 * t;
  const uint8_t *xt = st + L::X + (wn * 8 * NJ + g) * ST + 8 * t;
  const float *sw = (const float *)(st + L::SW) + wm * 16 * MI + g;
  const float *smn = (const float *)(st + L::MN) + wm * 16 * MI + g;
  const float *sxd = (const float *)(st + L::XD) + wn * 8 * NJ + 2 * t;
  const float *sxs = (const float *)(st + L::XS) + wn * 8 * NJ + 2 * t;
  const float *swp = (const float *)(st + L::SW) + 4 * g + 32 * wm * MI; /* PK: + 128 b + 32 i */
  const float *sxp = (const float *)(st + L::XD) + 4 * (wn * 4 * NJ + t); /* PK: + 4 (b BN / 2 + 4 j) */
#pragma unroll UNR
  for (int b = 0; b < KS / 32; b++) {
    uint2 A[MI][2], B[NJ];
#pragma unroll
    for (int i = 0; i < MI; i++) {
      A[i][0] = mmq_lds64(wt + (16 * i) * ST + 32 * b);
      A[i][1] = mmq_lds64(wt + (16 * i + 8) * ST + 32 * b);
    }
#pragma unroll
    for (int j = 0; j < NJ; j++) B[j] = mmq_lds64(xt + (8 * j) * ST + 32 * b);
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      float2 dx, sx = make_float2(0.0f, 0.0f);
      if constexpr (PK) {
        const float4 xv = *(const float4 *)(sxp + 4 * (b * (BN / 2) + 4 * j));
        dx = make_float2(xv.x, xv.y), sx = make_float2(xv.z, xv.w);
      } else {
        dx = *(const float2 *)(sxd + b * BN + 8 * j);
        if constexpr (MIN) sx = *(const float2 *)(sxs + b * BN + 8 * j);
      }
#pragma unroll
      for (int i = 0; i < MI; i++) {
        float *a = acc[i][j];
        if constexpr (Q6) {
          /* runs 2b (words .x) and 2b + 1 (.y), scale units of 16 elements */
          float d0[4], d1[4];
          mmq_mma16(d0, A[i][0].x, A[i][1].x, B[j].x);
          mmq_mma16(d1, A[i][0].y, A[i][1].y, B[j].y);
          float w0g, w0h, w1g, w1h;
          if constexpr (PK) {
            const float4 wv = *(const float4 *)(swp + 128 * b + 32 * i);
            w0g = wv.x, w0h = wv.y, w1g = wv.z, w1h = wv.w;
          } else {
            w0g = sw[(2 * b) * MMQ_BM + 16 * i], w0h = sw[(2 * b) * MMQ_BM + 16 * i + 8];
            w1g = sw[(2 * b + 1) * MMQ_BM + 16 * i], w1h = sw[(2 * b + 1) * MMQ_BM + 16 * i + 8];
          }
          a[0] = fmaf(dx.x, fmaf(w0g, d0[0] - 12582912.0f, w1g * (d1[0] - 12582912.0f)), a[0]);
          a[1] = fmaf(dx.y, fmaf(w0g, d0[1] - 12582912.0f, w1g * (d1[1] - 12582912.0f)), a[1]);
          a[2] = fmaf(dx.x, fmaf(w0h, d0[2] - 12582912.0f, w1h * (d1[2] - 12582912.0f)), a[2]);
          a[3] = fmaf(dx.y, fmaf(w0h, d0[3] - 12582912.0f, w1h * (d1[3] - 12582912.0f)), a[3]);
        } else {
          float d[4];
          mmq_mma32(d, A[i][0].x, A[i][1].x, A[i][0].y, A[i][1].y, B[j].x, B[j].y);
          float wg, wh, mg = 0.0f, mh = 0.0f;
          if constexpr (PK) {
            const float4 wv = *(const float4 *)(swp + 128 * b + 32 * i);
            wg = wv.x, wh = wv.y, mg = wv.z, mh = wv.w;
          } else {
            wg = sw[b * MMQ_BM + 16 * i], wh = sw[b * MMQ_BM + 16 * i + 8];
            if constexpr (MIN) mg = smn[b * MMQ_BM + 16 * i], mh = smn[b * MMQ_BM + 16 * i + 8];
          }
          a[0] = fmaf(wg * dx.x, d[0] - 12582912.0f, a[0]);
          a[1] = fmaf(wg * dx.y, d[1] - 12582912.0f, a[1]);
          a[2] = fmaf(wh * dx.x, d[2] - 12582912.0f, a[2]);
          a[3] = fmaf(wh * dx.y, d[3] - 12582912.0f, a[3]);
          if constexpr (MIN) {
            a[0] = fmaf(-mg, sx.x, a[0]), a[1] = fmaf(-mg, sx.y, a[1]);
            a[2] = fmaf(-mh, sx.x, a[2]), a[3] = fmaf(-mh, sx.y, a[3]);
          }
        }
      }
    }
  }
}

/* Blocks per SM the register budget must allow: the first kernel assumes one; v2 two (2 x 94
 * KB of shared memory at BN = 64, KS = 256 fit 228 KB: at most 128 registers), three with
 * 128-column steps (51 KB at BN = 64: at most 80 registers). */
template <int NT, int KS> constexpr int mmq_min_blocks() {
  return NT == MMQ_THREADS ? 1 : KS == MMQ_KS ? 2 : 3;
}

template <int TYPE, int BN, int NT, int KS, bool PK>
static __global__ void __launch_bounds__(NT, mmq_min_blocks<NT, KS>())
    k_mmq(float *y, const uint8_t *W, int64_t rows, int64_t cols, int64_t rb, const int8_t *xq, const float *xd,
          const float *xs, int64_t n, int64_t npad, int64_t colsp) {
  typedef mmq_cfg<BN, NT, KS, PK> C, L;
  constexpr int NJ = C::NJ, MI = C::MI;
  uint8_t *sm = mmq_smem_base();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t r0 = (int64_t)blockIdx.x * MMQ_BM, t0 = (int64_t)blockIdx.y * BN;
  const int64_t pieces = cols / 32;
  /* split K: slice z of gridDim.z takes steps [s0, s1) and writes its partial sums to its own
   * plane of y (k_mmq_reduce adds the planes in order); the split depends on the weight's
   * shape only, so a token's result does not depend on n; slices are cut in 256-column units
   * whatever the step (the same slices, hence the same bits, with 128-column steps) */
  const int all = (int)(colsp / MMQ_KS), z = (int)blockIdx.z, S = (int)gridDim.z;
  const int s0 = all * z / S * (MMQ_KS / KS), s1 = all * (z + 1) / S * (MMQ_KS / KS);
  y += (int64_t)z * npad * rows;
  float acc[MI][NJ][4];
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
  uint32_t raw[C::PPT][cuda_piece<TYPE>::RAW];
  mmq_load_x<TYPE, BN, NT, KS, PK>(sm, xq, xd, xs, t0, npad, colsp, s0, tid);
  mmq_load_w<TYPE, NT, KS>(raw, W, r0, rows, rb, pieces, s0, tid);
  mmq_decode_w<TYPE, BN, NT, KS, PK>(sm, raw, W, r0, rows, rb, pieces, s0, tid);
  cuda_cp_wait<0>();
  __syncthreads();
  for (int s = s0; s < s1; s++) {
    uint8_t *cur = sm + ((s - s0) & 1) * L::STAGE, *nxt = sm + ((s - s0 + 1) & 1) * L::STAGE;
    /* nxt was last read by step s - 1's MMAs, which every thread finished before the barrier */
    if (s + 1 < s1) {
      mmq_load_x<TYPE, BN, NT, KS, PK>(nxt, xq, xd, xs, t0, npad, colsp, s + 1, tid);
      mmq_load_w<TYPE, NT, KS>(raw, W, r0, rows, rb, pieces, s + 1, tid);
    }
    mmq_mma_step<TYPE, BN, NT, KS, PK>(cur, acc, warp, lane);
    if (s + 1 < s1) mmq_decode_w<TYPE, BN, NT, KS, PK>(nxt, raw, W, r0, rows, rb, pieces, s + 1, tid);
    cuda_cp_wait<0>();
    __syncthreads();
  }
  const int g = lane >> 2, t = lane & 3, wm = warp & (C::WM - 1), wn = warp >> C::LWM;
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int64_t r = r0 + wm * 16 * MI + 16 * i + g + 8 * (e >> 1), tok = t0 + wn * 8 * NJ + 8 * j + 2 * t + (e & 1);
        if (r < rows && tok < n) y[tok * rows + r] = acc[i][j][e];
      }
}

/* y[i] = sum of the S partial planes (stride floats apart) in slice order. */
static __global__ void k_mmq_reduce(float *y, const float *part, int64_t count, int64_t stride, int S) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  float a = part[i];
  for (int z = 1; z < S; z++) a += part[z * stride + i];
  y[i] = a;
}

void cuda_mmq_reduce(cuda_impl *ci, float *y, const float *part, int64_t count, int64_t stride, int S) {
  cuda_launch(ci, "mmq reduce", k_mmq_reduce, (unsigned)((count + 255) / 256), 256, 0, y, part, count, stride, S);
}

/* ---- launch ---- */

/* The decoders' load alignment (as the decode matvec's piece_ok). */
static bool mmq_supported(int type, const uint8_t *W, int64_t rb, int64_t cols) {
  if (cols % 32 != 0) return false;
  switch (type) {
  case ANNA_DTYPE_Q4_0: case ANNA_DTYPE_IQ4_NL: case ANNA_DTYPE_Q8_0: case ANNA_DTYPE_Q6_K:
    return ((uintptr_t)W & 1) == 0 && rb % 2 == 0;
  case ANNA_DTYPE_Q4_K: case ANNA_DTYPE_Q5_K: return ((uintptr_t)W & 15) == 0 && rb % 16 == 0;
  case ANNA_DTYPE_IQ4_XS: return ((uintptr_t)W & 7) == 0 && rb % 8 == 0;
  case ANNA_DTYPE_IQ2_XXS: case ANNA_DTYPE_IQ2_XS: case ANNA_DTYPE_IQ2_S: case ANNA_DTYPE_IQ3_XXS:
  case ANNA_DTYPE_IQ3_S:
    return ((uintptr_t)W & 1) == 0;
  default: return false;
  }
}

template <int TYPE, int BN, int NT, int KS, bool PK>
static void mmq_launch_bn(cuda_impl *ci, float *y, const uint8_t *W, int64_t rows, int64_t cols, int64_t rb,
                          const int8_t *xq, const float *xd, const float *xs, int64_t n, int64_t npad, int64_t colsp) {
  static int ready = 0; /* the shared-memory opt-in, once per instance (the process uses one device kind) */
  if (!ready) {
    if (!cuda_check(ci, cudaFuncSetAttribute(k_mmq<TYPE, BN, NT, KS, PK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             mmq_cfg<BN, NT, KS, PK>::SMEM),
                    "mmq shared memory"))
      return;
    /* v2 counts on several resident blocks: ask for the largest shared-memory carveout so
     * the driver does not pick one that holds fewer */
    if (NT != MMQ_THREADS &&
        !cuda_check(ci, cudaFuncSetAttribute(k_mmq<TYPE, BN, NT, KS, PK>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             (int)cudaSharedmemCarveoutMaxShared),
                    "mmq shared memory carveout"))
      return;
    ready = 1;
  }
  /* K slices so that a decode-sized call fills the device: about two blocks per SM. The
   * count depends on the weight's shape only (batch invariance); partial planes go to the
   * scratch after the activations when there is room, else one slice. */
  const int64_t rblocks = (rows + MMQ_BM - 1) / MMQ_BM, all = colsp / MMQ_KS;
  const int64_t sms = ci->n_sm > 0 ? ci->n_sm : 132;
  int S = ci->mmq_split ? (int)((2 * sms + rblocks - 1) / rblocks) : 1;
  if (S > all) S = (int)all;
  if (S > 16) S = 16;
  if (S < 1) S = 1;
  float *part = NULL;
  if (S > 1) {
    const size_t used = (size_t)(npad * colsp) + (size_t)(2 * (colsp / 32) * npad) * sizeof(float);
    const size_t at = (used + 255) / 256 * 256, need = (size_t)S * (size_t)(npad * rows) * sizeof(float);
    if (at + need <= ci->deq_floats * sizeof(float)) part = (float *)((uint8_t *)ci->deq + at);
    else S = 1;
  }
  const dim3 grid((unsigned)rblocks, (unsigned)(npad / BN), (unsigned)S);
  cuda_launch(ci, "mmq", k_mmq<TYPE, BN, NT, KS, PK>, grid, NT, mmq_cfg<BN, NT, KS, PK>::SMEM, S > 1 ? part : y, W, rows, cols,
              rb, xq, xd, xs, n, npad, colsp);
  if (S > 1) {
    /* the planes hold npad token rows of `rows` floats; the first n are y */
    const int64_t count = n * rows;
    cuda_mmq_reduce(ci, y, part, count, npad * rows, S);
  }
}

template <int TYPE>
static void mmq_launch(cuda_impl *ci, float *y, const uint8_t *W, int64_t rows, int64_t cols, int64_t rb,
                       const int8_t *xq, const float *xd, const float *xs, int64_t n, int bn, int64_t npad,
                       int64_t colsp) {
  /* the forms give the same bits (mmq_cfg): the tuning key picks the faster */
#define MMQ_BN(NT, KS, PK)                                                                                             \
  do {                                                                                                                 \
    if (bn == 16) mmq_launch_bn<TYPE, 16, NT, KS, PK>(ci, y, W, rows, cols, rb, xq, xd, xs, n, npad, colsp);           \
    else if (bn == 32) mmq_launch_bn<TYPE, 32, NT, KS, PK>(ci, y, W, rows, cols, rb, xq, xd, xs, n, npad, colsp);      \
    else mmq_launch_bn<TYPE, 64, NT, KS, PK>(ci, y, W, rows, cols, rb, xq, xd, xs, n, npad, colsp);                    \
  } while (0)
  if (ci->mmq_v2 == 3) MMQ_BN(256, 128, true);
  else if (ci->mmq_v2 == 2) MMQ_BN(256, 128, false);
  else if (ci->mmq_v2) MMQ_BN(256, MMQ_KS, false);
  else MMQ_BN(MMQ_THREADS, MMQ_KS, false);
#undef MMQ_BN
}

bool cuda_mmq(cuda_impl *ci, float *y, const float *x, int64_t n, const ops_weight *w, const uint8_t *W, int64_t rb) {
  /* int8 activations are the matvec's default numerics: exact mode and the f32-activation
   * variant keep the f32 / bf16 GEMM */
  if (!(ci->decode_mmq || ci->batch_inv) || ci->exact || ci->mv_variant == CUDA_MV_F32 || n < 1 ||
      (n > CUDA_MMQ_MAX_TOK && !ci->batch_inv) || !mmq_supported(w->type, W, rb, w->cols))
    return false;
  if (ci->err) return true;
  if (n > CUDA_MMQ_MAX_TOK) { /* batch-invariant prefill: 64-token calls, each token's result as alone */
    for (int64_t t0 = 0; t0 < n && !ci->err; t0 += CUDA_MMQ_MAX_TOK) {
      const int64_t m = n - t0 < CUDA_MMQ_MAX_TOK ? n - t0 : CUDA_MMQ_MAX_TOK;
      /* only the first chunk, the largest, can be refused (scratch size): then nothing ran */
      if (!cuda_mmq(ci, y + t0 * w->rows, x + t0 * w->cols, m, w, W, rb)) return false;
    }
    return true;
  }
  const int bn = n <= 16 ? 16 : n <= 32 ? 32 : 64;
  const int64_t npad = (n + bn - 1) / bn * bn, colsp = (w->cols + MMQ_KS - 1) / MMQ_KS * MMQ_KS, nbp = colsp / 32;
  /* the GEMM tile scratch: decode-sized batches never run a GEMM, and it is allocated once */
  const size_t need = (size_t)(npad * colsp) + (size_t)(2 * nbp * npad) * sizeof(float);
  if (need > ci->deq_floats * sizeof(float)) return false;
  int8_t *xq = (int8_t *)ci->deq;
  float *xd = (float *)(xq + npad * colsp), *xs = xd + nbp * npad;
  const int64_t units = npad * nbp;
  const int64_t blocks = (units + 31) / 32; /* 32 units per 256-thread block; far below the grid limit */
  cuda_launch(ci, "mmq quantize", k_mmq_quant_x, (unsigned)blocks, 256, 0, xq, xd, xs, x, n, w->cols, npad, colsp,
              ci->mmq_v2 == 3 ? 1 : 0);
  switch (w->type) {
  case ANNA_DTYPE_Q4_0: mmq_launch<ANNA_DTYPE_Q4_0>(ci, y, W, w->rows, w->cols, rb, xq, xd, xs, n, bn, npad, colsp); break;
  case ANNA_DTYPE_IQ4_NL:
    mmq_launch<ANNA_DTYPE_IQ4_NL>(ci, y, W, w->rows, w->cols, rb, xq, xd, xs, n, bn, npad, colsp);
    break;
  case ANNA_DTYPE_Q8_0: mmq_launch<ANNA_DTYPE_Q8_0>(ci, y, W, w->rows, w->cols, rb, xq, xd, xs, n, bn, npad, colsp); break;
  case ANNA_DTYPE_Q4_K: mmq_launch<ANNA_DTYPE_Q4_K>(ci, y, W, w->rows, w->cols, rb, xq, xd, xs, n, bn, npad, colsp); break;
  case ANNA_DTYPE_Q5_K: mmq_launch<ANNA_DTYPE_Q5_K>(ci, y, W, w->rows, w->cols, rb, xq, xd, xs, n, bn, npad, colsp); break;
  case ANNA_DTYPE_Q6_K: mmq_launch<ANNA_DTYPE_Q6_K>(ci, y, W, w->rows, w->cols, rb, xq, xd, xs, n, bn, npad, colsp); break;
  case ANNA_DTYPE_IQ4_XS:
    mmq_launch<ANNA_DTYPE_IQ4_XS>(ci, y, W, w->rows, w->cols, rb, xq, xd, xs, n, bn, npad, colsp);
    break;
  case ANNA_DTYPE_IQ2_XXS:
    mmq_launch<ANNA_DTYPE_IQ2_XXS>(ci, y, W, w->rows, w->cols, rb, xq, xd, xs, n, bn, npad, colsp);
    break;
  case ANNA_DTYPE_IQ2_XS:
    mmq_launch<ANNA_DTYPE_IQ2_XS>(ci, y, W, w->rows, w->cols, rb, xq, xd, xs, n, bn, npad, colsp);
    break;
  case ANNA_DTYPE_IQ2_S: mmq_launch<ANNA_DTYPE_IQ2_S>(ci, y, W, w->rows, w->cols, rb, xq, xd, xs, n, bn, npad, colsp); break;
  case ANNA_DTYPE_IQ3_XXS:
    mmq_launch<ANNA_DTYPE_IQ3_XXS>(ci, y, W, w->rows, w->cols, rb, xq, xd, xs, n, bn, npad, colsp);
    break;
  case ANNA_DTYPE_IQ3_S: mmq_launch<ANNA_DTYPE_IQ3_S>(ci, y, W, w->rows, w->cols, rb, xq, xd, xs, n, bn, npad, colsp); break;
  default: break; /* mmq_supported took none else */
  }
  return true;
}
