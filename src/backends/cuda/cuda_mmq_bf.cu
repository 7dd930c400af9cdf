/* cuda_mmq_bf.cu: decode batches of up to CUDA_MMQ_MAX_TOK tokens on bf16 tensor cores, the
 * weights decoded in registers (tuning cuda_mmq_bf16; Q4_K and Q6_K, other types keep cuda_mmq).
 *
 * Why: cuda_mmq (int8 mma.sync m16n8k32) needs a float epilogue per 32-block (magic subtract,
 * weight scale x activation scale, min x sum: ~16 FP32 ops per thread per MMA) and decodes
 * every weight to an int8 shared matrix that it reads back; session 20 measured it shared-
 * memory bound at 14% of the H100's DRAM bandwidth. Here (the Marlin design):
 *   k_mbf_x      the activations to bf16 once per call (round to nearest even) into the GEMM
 *                scratch (decode-sized batches never run a GEMM), [npad][cols], padded with
 *                zero tokens to a whole tile, each 16-element run of K stored in the order
 *                mbf_perm16 so that ldmatrix hands a thread the activations of the weights
 *                it decodes (below);
 *   k_mbf<TYPE>  tiles of BM = 32 x WARPS weight rows x BN (16, 32, 64) tokens; every warp
 *                owns 32 rows (two m-tiles) x all BN tokens (BN / 8 n-tiles: each decoded
 *                weight serves BN / 8 MMAs, each B fragment two), K in steps of one
 *                256-element super-block. WARPS (tuning value): mode 1 8 at 32 and 64
 *                tokens (256-row blocks: the bf16 activation tile, 2 bytes per element, is
 *                read from L2 once per row block), 4 at 16; mode 2 4 everywhere (twice the
 *                blocks, two per SM where two stages fit). The raw quantized rows of a step
 *                (Q4_K: 144 bytes, Q6_K: the 16-byte window around its 210 bytes) and the
 *                step's activations are staged with cp.async in an NS-stage pipeline (2-4
 *                stages, as many as the shared memory holds); per step the block first
 *                turns each row's packed scales into f32 (d * sc, dmin * mn: cuda_deq32's
 *                expressions) in a small table, then each warp decodes its own A fragments
 *                from the raw bytes into registers and runs
 *                mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32, accumulating in f32 over all
 *                of K (no per-block epilogue, no int8 shared matrix). B fragments come from
 *                shared memory by ldmatrix.x4 and serve both of the warp's m-tiles.
 * The K permutation: a thread (g = lane / 4, t = lane % 4) of an m16n8k16 holds, for rows g
 * and g + 8, the A elements k = 2t, 2t + 1 (registers a0, a1) and 2t + 8, 2t + 9 (a2, a3). A
 * 32-bit word of quantized bytes at offset 4t of a 16-byte group gives a thread four
 * consecutive elements of one row from its low nibbles (Q4_K: sub-block 2c; Q6_K: with two
 * bits of qh, elements p) and four from its high nibbles (sub-block 2c + 1; Q6_K: p + 64), so
 * one word per row feeds two MMAs: bytes 0, 1 of the word are k = 2t, 2t + 1 and bytes 2, 3
 * are k = 2t + 8, 2t + 9. The dot product does not care about K order as long as weights and
 * activations agree: the activations of a 16-element run are stored so that memory position
 * 2t + i holds element 4t + i and 8 + 2t + i holds element 4t + 2 + i (mbf_perm16), which is
 * the order ldmatrix (8 consecutive b16 of a token row per lane quad) delivers as b0, b1.
 * Numerics: bf16 activations and bf16 weights, f32 accumulation: the class of the prefill
 * bf16 GEMM, not the int8 rounding of the matvec / cuda_mmq. Each weight is rounded to bf16
 * from exactly the f32 value the CPU dequantizer computes (Q4_K: d * sc * q - dmin * mn as an
 * f32 product then an f32 difference; Q6_K: (d * sc) * (q - 32)), the product q * (d * sc) by
 * one fma of the exponent-trick float 2^23 + q (no int-to-float conversions). Per (row,
 * token) the sum runs over K in a fixed order, and K slices (split K, a function of the
 * weight's shape and the SM count only, partial sums added in slice order by
 * cuda_mmq_reduce) do not depend on n: a token's result is the same whatever the batch around
 * it (not a batch-invariant-mode path all the same: that mode keeps cuda_mmq's int8
 * numerics for every size). Recordable in a step graph: launch arguments depend on shapes
 * and scratch addresses only, no allocation, no host wait. */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_async.cuh"
#include "backends/cuda/cuda_quant.cuh"

#include <cuda_bf16.h>

#include "base/error.h"

#define MBF_KT 256         /* K elements per pipeline step: one K-quant super-block */
#define MBF_XS 528         /* bytes per token row of a stage's activations: 256 bf16 + 16 (ldmatrix banks) */
#define MBF_SCS 20         /* floats per row of the scale table (16 used; 20: the 8 rows g hit distinct banks) */
#define MBF_SMEM_MAX 232448 /* sm_90's per-block opt-in shared memory (227 KB) */
#define MBF_SMEM_HALF 115712 /* each of two blocks on an sm_90 SM (228 KB, 1 KB reserved per block) */

/* Raw bytes of a row per step: RAW of the format, CH 16-byte chunks copied per row (Q6_K:
 * the aligned window that covers 210 bytes starting at any even offset), RS the row stride in
 * shared memory (a multiple of 16 whose word stride spreads the rows g of a fragment over
 * distinct 4-bank groups: 36 and 60 words). */
template <int TYPE> struct mbf_fmt;
template <> struct mbf_fmt<ANNA_DTYPE_Q4_K> { enum { RAW = 144, CH = 9, RS = 144 }; };
template <> struct mbf_fmt<ANNA_DTYPE_Q6_K> { enum { RAW = 210, CH = 14, RS = 240 }; };

/* BN tokens, WARPS warps of 32 rows each; stages of raw weights then activations, then one
 * scale table [BM][MBF_SCS] floats. NS stages: as many as fit (at most 4) with two blocks per
 * SM for 4 warps when two stages fit so, else (and for 8 warps) one block per SM. */
template <int TYPE, int BN, int WARPS> struct mbf_cfg {
  static constexpr int NT = 32 * WARPS, BM = 32 * WARPS, NJ = BN / 8;
  static constexpr int RS = mbf_fmt<TYPE>::RS, CH = mbf_fmt<TYPE>::CH;
  static constexpr int X = BM * RS, STAGE = X + BN * MBF_XS, SCB = BM * MBF_SCS * 4;
  static constexpr int FIT2 = WARPS == 4 ? (MBF_SMEM_HALF - SCB) / STAGE : 0, FIT1 = (MBF_SMEM_MAX - SCB) / STAGE;
  static constexpr int BLOCKS = FIT2 >= 2 ? 2 : 1, FIT = FIT2 >= 2 ? FIT2 : FIT1, NS = FIT > 4 ? 4 : FIT;
  static constexpr int SC = NS * STAGE, SMEM = SC + SCB;
  static_assert(NJ % 2 == 0 && NS >= 2 && SMEM <= MBF_SMEM_MAX && X % 16 == 0 && STAGE % 16 == 0, "tiling");
};

/* Element of a 16-element run stored at memory position p (see the header comment). */
static __host__ __device__ __forceinline__ int mbf_perm16(int p) {
  return 4 * ((p & 7) >> 1) + (p & 1) + 2 * (p >> 3);
}

/* ---- device primitives ---- */
static __device__ __forceinline__ uint8_t *mbf_smem_base() {
  extern __shared__ __align__(16) uint8_t mbf_smem[];
  return mbf_smem;
}
static __device__ __forceinline__ uint32_t mbf_pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* .x (lo) in the low 16 bits */
  return *(const uint32_t *)&v;
}
/* D += A B, A 16x16 bf16 row-major (a0: row g, k 2t, 2t + 1; a1: row g + 8; a2: row g, k 2t + 8,
 * 2t + 9; a3: row g + 8), B 16x8 column-major (b0: k 2t, 2t + 1 of column g; b1: k 2t + 8, 2t + 9),
 * D (d0, d1: row g, columns 2t, 2t + 1; d2, d3: row g + 8). */
static __device__ __forceinline__ void mbf_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* Four 8x8 b16 matrices: lanes 8m..8m + 7 give the row addresses of matrix m, lane l gets
 * row l / 4, elements 2 (l % 4), 2 (l % 4) + 1 of each in r[m]. Volatile: stays between the
 * barriers that publish and retire the stage. */
static __device__ __forceinline__ void mbf_ldsm4(uint32_t *r, const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"((unsigned)__cvta_generic_to_shared(p)));
}
/* The 32-bit word at a 2-byte aligned shared address (Q6_K windows start at any even byte). */
static __device__ __forceinline__ uint32_t mbf_lds_u2(const uint8_t *p) {
  const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
  return __funnelshift_r(a[0], a[1], (unsigned)((uintptr_t)p & 2) * 8u);
}

/* x [n, cols] f32 -> xb [npad][cols] bf16 (raw bits), runs of 16 in mbf_perm16 order, tokens
 * n..npad zero. One thread per 16-element run. */
static __global__ void __launch_bounds__(256)
    k_mbf_x(uint16_t *xb, const float *x, int64_t n, int64_t cols, int64_t npad) {
  const int64_t runs = cols / 16, total = npad * runs;
  for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < total; u += (int64_t)gridDim.x * blockDim.x) {
    const int64_t tok = u / runs, r = u - tok * runs;
    float v[16];
#pragma unroll
    for (int e = 0; e < 16; e++) v[e] = tok < n ? x[tok * cols + 16 * r + e] : 0.0f;
    uint32_t o[8];
#pragma unroll
    for (int p = 0; p < 16; p += 2) o[p / 2] = mbf_pack(v[mbf_perm16(p)], v[mbf_perm16(p + 1)]);
    uint4 *d = (uint4 *)(xb + tok * cols + 16 * r);
    d[0] = make_uint4(o[0], o[1], o[2], o[3]);
    d[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

/* Issues the copies of step s (rows r0.., tokens t0..) into stage st and commits them as one
 * group. Rows past the weight repeat its last row (their results are not stored). Q6_K: the
 * 16-byte aligned window around the step's 210 bytes, the part past the weight's end (wend)
 * zero-filled. */
template <int TYPE, int BN, int WARPS>
static __device__ __forceinline__ void mbf_load(uint8_t *st, const uint8_t *W, int64_t r0, int64_t rows, int64_t rb,
                                                const uint8_t *wend, const uint16_t *xb, int64_t t0, int64_t cols,
                                                int s, int tid) {
  typedef mbf_cfg<TYPE, BN, WARPS> C;
  for (int c = tid; c < C::BM * C::CH; c += C::NT) {
    const int row = c / C::CH, ch = c - row * C::CH;
    const int64_t r = r0 + row < rows ? r0 + row : rows - 1;
    const uint8_t *src = W + r * rb + (int64_t)s * mbf_fmt<TYPE>::RAW;
    uint8_t *dst = st + row * C::RS + 16 * ch;
    if constexpr (TYPE == ANNA_DTYPE_Q4_K) {
      cuda_cp16(dst, src + 16 * ch); /* rows and blocks are 16-byte aligned (cuda_mmq_bf16 checks) */
    } else {
      const uint8_t *a = (const uint8_t *)((uintptr_t)src & ~(uintptr_t)15) + 16 * ch;
      const int64_t left = wend - a;
      const int bytes = left >= 16 ? 16 : left > 0 ? (int)left : 0;
      cuda_cp16_zfill(dst, bytes > 0 ? a : W, bytes);
    }
  }
  constexpr int XCH = BN * (MBF_KT * 2 / 16); /* 16-byte chunks of the activation tile */
  static_assert(XCH % C::NT == 0, "whole activation chunks per thread");
#pragma unroll
  for (int i = 0; i < XCH / C::NT; i++) {
    const int c = tid + C::NT * i, tok = c >> 5, ch = c & 31;
    cuda_cp16(st + C::X + tok * MBF_XS + 16 * ch, xb + (t0 + tok) * cols + (int64_t)s * MBF_KT + 8 * ch);
  }
  cuda_cp_commit();
}

/* Byte offset of row (block row `row`) step s's data in its shared window: 0 for Q4_K, the
 * address's low 4 bits for Q6_K (even: the format's blocks are 2-byte aligned). */
template <int TYPE>
static __device__ __forceinline__ int mbf_off(const uint8_t *W, int64_t r0, int row, int64_t rows, int64_t rb, int s) {
  if constexpr (TYPE == ANNA_DTYPE_Q4_K) return 0;
  const int64_t r = r0 + row < rows ? r0 + row : rows - 1;
  return (int)((uintptr_t)(W + r * rb + (int64_t)s * mbf_fmt<TYPE>::RAW) & 15);
}

/* The scale table of a stage: Q4_K sc[row][4c + 0..3] = d sc(2c), dmin mn(2c), d sc(2c + 1),
 * dmin mn(2c + 1); Q6_K sc[row][i] = d * scales[i] (16-element group i). */
template <int TYPE, int BN, int WARPS>
static __device__ __forceinline__ void mbf_scales(float *sc, const uint8_t *st, const uint8_t *W, int64_t r0,
                                                  int64_t rows, int64_t rb, int s, int tid) {
  typedef mbf_cfg<TYPE, BN, WARPS> C;
  if constexpr (TYPE == ANNA_DTYPE_Q4_K) {
    for (int c = tid; c < C::BM * 8; c += C::NT) {
      const int row = c >> 3, j = c & 7;
      const uint8_t *b = st + row * C::RS;
      int scv, mnv;
      k4_scale_min(b + 4, j, &scv, &mnv);
      sc[row * MBF_SCS + 2 * j] = ldh(b) * (float)scv;
      sc[row * MBF_SCS + 2 * j + 1] = ldh(b + 2) * (float)mnv;
    }
  } else {
    for (int c = tid; c < C::BM * 16; c += C::NT) {
      const int row = c >> 4, i = c & 15;
      const uint8_t *b = st + row * C::RS + mbf_off<TYPE>(W, r0, row, rows, rb, s);
      sc[row * MBF_SCS + i] = ldh(b + 208) * (float)(int8_t)b[192 + i];
    }
  }
}

/* The A fragment of one 16-element run for rows g (word w0) and g + 8 (w1): bytes 0, 1 -> a0 /
 * a1, bytes 2, 3 -> a2 / a3. q: the words' bytes as small unsigned integers. Q4_K: w = ds * q -
 * ms (ds * q as fma(2^23 + q, ds, -2^23 ds), exact to the product's rounding); Q6_K: w = ds *
 * (q - 32). */
template <int TYPE>
static __device__ __forceinline__ void mbf_frag(uint32_t *a, uint32_t q0, uint32_t q1, float ds0, float ms0,
                                                float ds1, float ms1) {
  float f0[4], f1[4];
#pragma unroll
  for (int j = 0; j < 4; j++) {
    if constexpr (TYPE == ANNA_DTYPE_Q4_K) {
      f0[j] = __fsub_rn(__fmaf_rn(pc_bf(q0, j), ds0, -8388608.0f * ds0), ms0);
      f1[j] = __fsub_rn(__fmaf_rn(pc_bf(q1, j), ds1, -8388608.0f * ds1), ms1);
    } else {
      f0[j] = __fmul_rn(pc_bf(q0, j) - 8388640.0f, ds0);
      f1[j] = __fmul_rn(pc_bf(q1, j) - 8388640.0f, ds1);
    }
  }
  a[0] = mbf_pack(f0[0], f0[1]), a[1] = mbf_pack(f1[0], f1[1]);
  a[2] = mbf_pack(f0[2], f0[3]), a[3] = mbf_pack(f1[2], f1[3]);
}

/* Two MMAs' worth of one 16-byte group, for the warp's two m-tiles and all n-tiles: runs at
 * elements EL (low nibbles) and EH (high nibbles) of the step. */
template <int NJ>
static __device__ __forceinline__ void mbf_group_mma(float (*acc)[NJ][4], const uint8_t *xs, int EL, int EH,
                                                     const uint32_t (*aL)[4], const uint32_t (*aH)[4], int lane) {
  const int tok = (lane & 7) + 8 * (lane >> 4), half = 16 * ((lane >> 3) & 1);
#pragma unroll
  for (int jj = 0; jj < NJ / 2; jj++) {
    uint32_t bl[4], bh[4];
    const uint8_t *p = xs + (16 * jj + tok) * MBF_XS + half;
    mbf_ldsm4(bl, p + 2 * EL);
    mbf_ldsm4(bh, p + 2 * EH);
#pragma unroll
    for (int i = 0; i < 2; i++) {
      mbf_mma(acc[i][2 * jj], aL[i], bl[0], bl[1]);
      mbf_mma(acc[i][2 * jj + 1], aL[i], bl[2], bl[3]);
      mbf_mma(acc[i][2 * jj], aH[i], bh[0], bh[1]);
      mbf_mma(acc[i][2 * jj + 1], aH[i], bh[2], bh[3]);
    }
  }
}

/* One step on a stage: warp w owns block rows 32 w .. 32 w + 31 (m-tiles i = 0, 1: rows 16 i +
 * g, 16 i + g + 8). */
template <int TYPE, int BN, int WARPS>
static __device__ __forceinline__ void mbf_step(float (*acc)[BN / 8][4], const uint8_t *st, const float *sc,
                                                const uint8_t *W, int64_t r0, int64_t rows, int64_t rb, int s,
                                                int warp, int lane) {
  typedef mbf_cfg<TYPE, BN, WARPS> C;
  constexpr int NJ = C::NJ;
  const int g = lane >> 2, t = lane & 3;
  const uint8_t *xs = st + C::X;
  int rr[2][2];
  const uint8_t *wr[2][2];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      rr[i][h] = 32 * warp + 16 * i + g + 8 * h;
      wr[i][h] = st + rr[i][h] * C::RS + mbf_off<TYPE>(W, r0, rr[i][h], rows, rb, s);
    }
  if constexpr (TYPE == ANNA_DTYPE_Q4_K) {
    /* chunk c (64 elements, qs bytes 32c..32c + 31), 16-byte half h: low nibbles are elements
     * 64c + 16h + (0..15) of sub-block 2c, high nibbles 64c + 32 + 16h + (0..15) of 2c + 1 */
#pragma unroll 1
    for (int c = 0; c < 4; c++) {
      float4 sv[2][2];
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) sv[i][h] = *(const float4 *)(sc + rr[i][h] * MBF_SCS + 4 * c);
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        uint32_t aL[2][4], aH[2][4];
#pragma unroll
        for (int i = 0; i < 2; i++) {
          const int o = 16 + 32 * c + 16 * hf + 4 * t;
          const uint32_t w0 = *(const uint32_t *)(wr[i][0] + o), w1 = *(const uint32_t *)(wr[i][1] + o);
          mbf_frag<TYPE>(aL[i], w0 & 0x0f0f0f0fu, w1 & 0x0f0f0f0fu, sv[i][0].x, sv[i][0].y, sv[i][1].x, sv[i][1].y);
          mbf_frag<TYPE>(aH[i], (w0 >> 4) & 0x0f0f0f0fu, (w1 >> 4) & 0x0f0f0f0fu, sv[i][0].z, sv[i][0].w, sv[i][1].z,
                         sv[i][1].w);
        }
        mbf_group_mma<NJ>(acc, xs, 64 * c + 16 * hf, 64 * c + 32 + 16 * hf, aL, aH, lane);
      }
    }
  } else {
    /* half hh, 16-byte group G of its 64 ql bytes: low nibbles (+ qh bits 2 (G / 2)) are
     * elements 128 hh + 16G + (0..15), group 8 hh + G; high nibbles (+ bits 2 (G / 2) + 4)
     * 128 hh + 64 + 16G + (0..15), group 8 hh + 4 + G; qh bytes 128 + 32 hh + 16 (G % 2) + .. */
#pragma unroll 1
    for (int hh = 0; hh < 2; hh++) {
#pragma unroll
      for (int G = 0; G < 4; G++) {
        const int s0 = 2 * (G >> 1);
        uint32_t aL[2][4], aH[2][4];
#pragma unroll
        for (int i = 0; i < 2; i++) {
          uint32_t lo[2], hi[2];
          float dl[2], dh[2];
#pragma unroll
          for (int h = 0; h < 2; h++) {
            const uint32_t ql = mbf_lds_u2(wr[i][h] + 64 * hh + 16 * G + 4 * t);
            const uint32_t qh = mbf_lds_u2(wr[i][h] + 128 + 32 * hh + 16 * (G & 1) + 4 * t);
            lo[h] = (ql & 0x0f0f0f0fu) | (((qh >> s0) & 0x03030303u) << 4);
            hi[h] = ((ql >> 4) & 0x0f0f0f0fu) | (((qh >> (s0 + 4)) & 0x03030303u) << 4);
            dl[h] = sc[rr[i][h] * MBF_SCS + 8 * hh + G];
            dh[h] = sc[rr[i][h] * MBF_SCS + 8 * hh + 4 + G];
          }
          mbf_frag<TYPE>(aL[i], lo[0], lo[1], dl[0], 0.0f, dl[1], 0.0f);
          mbf_frag<TYPE>(aH[i], hi[0], hi[1], dh[0], 0.0f, dh[1], 0.0f);
        }
        mbf_group_mma<NJ>(acc, xs, 128 * hh + 16 * G, 128 * hh + 64 + 16 * G, aL, aH, lane);
      }
    }
  }
}

template <int TYPE, int BN, int WARPS>
static __global__ void __launch_bounds__(32 * WARPS, (mbf_cfg<TYPE, BN, WARPS>::BLOCKS))
    k_mbf(float *y, const uint8_t *W, int64_t rows, int64_t rb, const uint8_t *wend, const uint16_t *xb,
          int64_t cols, int64_t n, int64_t npad) {
  typedef mbf_cfg<TYPE, BN, WARPS> C;
  constexpr int NJ = C::NJ, NS = C::NS;
  uint8_t *sm = mbf_smem_base();
  float *sc = (float *)(sm + C::SC);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t r0 = (int64_t)blockIdx.x * C::BM, t0 = (int64_t)blockIdx.y * BN;
  /* split K: slice z of gridDim.z takes steps [s0, s1), its partial sums to plane z of y */
  const int all = (int)(cols / MBF_KT), z = (int)blockIdx.z, S = (int)gridDim.z;
  const int s0 = all * z / S, s1 = all * (z + 1) / S;
  y += (int64_t)z * npad * rows;
  float acc[2][NJ][4];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
  /* NS - 1 steps in flight ahead of the one computed; one commit group per step, empty ones
   * past the slice's end, so cp_wait<NS - 2> always means "step s has landed" */
#pragma unroll
  for (int p = 0; p < NS - 1; p++) {
    if (s0 + p < s1) mbf_load<TYPE, BN, WARPS>(sm + p * C::STAGE, W, r0, rows, rb, wend, xb, t0, cols, s0 + p, tid);
    else cuda_cp_commit();
  }
  for (int s = s0; s < s1; s++) {
    cuda_cp_wait<NS - 2>();
    __syncthreads(); /* step s landed for all; every warp finished step s - 1 (its stage, the table) */
    const int nx = s + NS - 1;
    if (nx < s1)
      mbf_load<TYPE, BN, WARPS>(sm + ((nx - s0) % NS) * C::STAGE, W, r0, rows, rb, wend, xb, t0, cols, nx, tid);
    else cuda_cp_commit();
    const uint8_t *st = sm + ((s - s0) % NS) * C::STAGE;
    mbf_scales<TYPE, BN, WARPS>(sc, st, W, r0, rows, rb, s, tid);
    __syncthreads();
    mbf_step<TYPE, BN, WARPS>(acc, st, sc, W, r0, rows, rb, s, warp, lane);
  }
  cuda_cp_wait<0>();
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int64_t r = r0 + 32 * warp + 16 * i + g + 8 * (e >> 1), tok = t0 + 8 * j + 2 * t + (e & 1);
        if (r < rows && tok < n) y[tok * rows + r] = acc[i][j][e];
      }
}

/* ---- launch ---- */

/* What the kernel reads: whole super-blocks; Q4_K rows and blocks 16-byte aligned (plain
 * cp.async of 144-byte rows), Q6_K 2-byte aligned (the windows cover any even start). */
static bool mbf_supported(int type, const uint8_t *W, int64_t rb, int64_t cols) {
  if (cols % MBF_KT != 0 || cols <= 0) return false;
  switch (type) {
  case ANNA_DTYPE_Q4_K: return ((uintptr_t)W & 15) == 0 && rb % 16 == 0;
  case ANNA_DTYPE_Q6_K: return ((uintptr_t)W & 1) == 0 && rb % 2 == 0;
  default: return false;
  }
}

/* K slices for a weight: from its shape and the SM count only (so a token's result does not
 * depend on n), counted for 256-row blocks at one block per SM: the S (at most 16, each slice
 * at least two steps) that minimises waves / S plus a small cost per extra slice (the partial
 * planes' traffic and the reduction). */
static int mbf_split(int64_t rows, int64_t cols, int64_t sms) {
  const int64_t rblocks = (rows + 255) / 256, steps = cols / MBF_KT;
  int best = 1;
  double cost = 1e30;
  for (int S = 1; S <= 16 && (S == 1 || 2 * S <= steps); S++) {
    const double c = (double)((rblocks * S + sms - 1) / sms) / S + 0.04 * (S - 1);
    if (c < cost - 1e-9) cost = c, best = S;
  }
  return best;
}

template <int TYPE, int BN, int WARPS>
static void mbf_launch(cuda_impl *ci, float *y, const uint8_t *W, int64_t rows, int64_t rb, const uint16_t *xb,
                       int64_t cols, int64_t n, int64_t npad, float *part, int S) {
  typedef mbf_cfg<TYPE, BN, WARPS> C;
  static int ready = 0; /* the shared-memory opt-in, once per instance (the process uses one device kind) */
  if (!ready) {
    if (!cuda_check(ci,
                    cudaFuncSetAttribute(k_mbf<TYPE, BN, WARPS>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM),
                    "mmq bf16 shared memory") ||
        !cuda_check(ci, cudaFuncSetAttribute(k_mbf<TYPE, BN, WARPS>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             (int)cudaSharedmemCarveoutMaxShared),
                    "mmq bf16 shared memory carveout"))
      return;
    ready = 1;
  }
  const dim3 grid((unsigned)((rows + C::BM - 1) / C::BM), (unsigned)(npad / BN), (unsigned)S);
  cuda_launch(ci, "mmq bf16", k_mbf<TYPE, BN, WARPS>, grid, C::NT, (size_t)C::SMEM, S > 1 ? part : y, W, rows, rb,
              W + rows * rb, xb, cols, n, npad);
}

bool cuda_mmq_bf16(cuda_impl *ci, float *y, const float *x, int64_t n, const ops_weight *w, const uint8_t *W,
                   int64_t rb) {
  /* bf16 numerics are a default-numerics choice: exact mode, the f32-activation variant and
   * batch-invariant mode (int8 cuda_mmq at every size) keep their paths */
  if (!ci->mmq_bf16 || !ci->decode_mmq || ci->exact || ci->batch_inv || ci->mv_variant == CUDA_MV_F32 || n < 1 ||
      n > CUDA_MMQ_MAX_TOK || w->rows < 1 || !mbf_supported(w->type, W, rb, w->cols))
    return false;
  if (ci->err) return true;
  const int bn = n <= 16 ? 16 : n <= 32 ? 32 : 64;
  const int64_t npad = (n + bn - 1) / bn * bn, cols = w->cols, rows = w->rows;
  const size_t xbytes = (size_t)(npad * cols) * 2;
  if (xbytes > ci->deq_floats * sizeof(float)) return false;
  uint16_t *xb = (uint16_t *)ci->deq;
  int S = mbf_split(rows, cols, ci->n_sm > 0 ? ci->n_sm : 132);
  float *part = NULL;
  if (S > 1) { /* partial planes after the activations when they fit, else one slice */
    const size_t at = (xbytes + 255) / 256 * 256, need = (size_t)S * (size_t)(npad * rows) * sizeof(float);
    if (at + need <= ci->deq_floats * sizeof(float)) part = (float *)((uint8_t *)ci->deq + at);
    else S = 1;
  }
  const int64_t runs = npad * (cols / 16);
  const int64_t xblocks = (runs + 255) / 256 < 4096 ? (runs + 255) / 256 : 4096;
  cuda_launch(ci, "mmq bf16 activations", k_mbf_x, (unsigned)xblocks, 256, 0, xb, x, n, cols, npad);
  /* warps per block (rows / 32): mode 1 8 at 32 and 64 tokens (the activation tile, 2 bytes per
   * element, is re-read from L2 by every row block: 256-row blocks halve that), 4 at 16; mode 2
   * 4 at every size (twice the blocks, two per SM where the stages fit). The same bits. */
  const bool w8 = ci->mmq_bf16 == 1 && bn > 16;
#define MBF_BN(TYPE)                                                                                                   \
  do {                                                                                                                 \
    if (bn == 16) mbf_launch<TYPE, 16, 4>(ci, y, W, rows, rb, xb, cols, n, npad, part, S);                             \
    else if (bn == 32 && w8) mbf_launch<TYPE, 32, 8>(ci, y, W, rows, rb, xb, cols, n, npad, part, S);                  \
    else if (bn == 32) mbf_launch<TYPE, 32, 4>(ci, y, W, rows, rb, xb, cols, n, npad, part, S);                        \
    else if (w8) mbf_launch<TYPE, 64, 8>(ci, y, W, rows, rb, xb, cols, n, npad, part, S);                              \
    else mbf_launch<TYPE, 64, 4>(ci, y, W, rows, rb, xb, cols, n, npad, part, S);                                      \
  } while (0)
  if (w->type == ANNA_DTYPE_Q4_K) MBF_BN(ANNA_DTYPE_Q4_K);
  else MBF_BN(ANNA_DTYPE_Q6_K);
#undef MBF_BN
  if (S > 1) {
    const int64_t count = n * rows; /* planes of npad token rows; the first n are y */
    cuda_mmq_reduce(ci, y, (const float *)part, count, npad * rows, S); /* cuda_mmq.cu's second pass */
  }
  return true;
}
