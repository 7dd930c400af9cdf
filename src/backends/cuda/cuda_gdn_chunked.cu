/* cuda_gdn_chunked.cu: the gated delta rule in chunked (C = 64) form for prefill.
 *
 * Contract: cuda_gdn_chunked_launch(be, a) queues the whole ops_gdn_args run (out and the
 * final state, same results as the recurrent kernel up to f32 rounding) and returns true,
 * or returns false without queueing anything when the recurrent kernel should run instead
 * (short runs, a step being captured, shapes outside dk <= 256). Failures set the sticky
 * error (and return true: the caller must not run the op a second time).
 *
 * The algorithm and its conventions are those of cpu_gdn.c (chunked_task). Per chunk of L
 * tokens, gam = cumsum(g) within the chunk, and
 *   A_ij = beta_i (k_i . k_j) e^(gam_i - gam_j) (j < i),  P_ij = (q_i . k_j) e^(gam_i - gam_j) (j <= i)
 *   (I + A) W = diag(beta e^gam) K,  (I + A) U = diag(beta) V        (forward substitution)
 *   V' = U - W S;  O = diag(e^gam) Q S + P V';  S = e^gam_last S + (diag(e^(gam_last - gam)) K)^T V'.
 * Everything except the last line depends only on the chunk's own tokens, so it runs in two
 * kernels:
 *   phase 1 (k_gdn_prep), one block per (chunk, v-head), all chunks in parallel: gam, A, P,
 *     the solve, W and U, written to scratch;
 *   phase 2 (k_gdn_scan), one block per (16 state columns, v-head), sequential over the
 *     chunks: the columns of S evolve independently (every product above is S times
 *     something from the left), so a block keeps its [dk, 16] slice of S in shared memory
 *     for the whole run and needs no communication with other blocks.
 * Chunk rows past L (the last, shorter chunk) are zero in W, U, P, K and Q, and gam is padded
 * with g = 0 so gam_last = gam[63]; the products then need no bounds.
 *
 * Numerics: every product is f32 on CUDA cores, register tiles over shared memory, in both
 * numerics modes (see the launcher for why not TF32).
 *
 * Scratch: one buffer of GDN_SCR_FLOATS, allocated at the first chunked call (never inside
 * graph capture: a captured step runs the recurrent kernel). A run whose W, U, P and gam do
 * not fit is processed in segments of whole chunks; the state carries between segments
 * through the state buffer, exactly as between chunks. */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_async.cuh"

#include "base/error.h"

#define GDN_C 64
#define GDN_NV 16 /* state columns per phase-2 block */
#define GDN_THREADS 256
/* 32 MiB: the 0.8B shape (hv 16, dk = dv = 128) fits 1600 tokens per segment, hv 64 fits 384;
 * both give phase 1 several hundred blocks. */
#define GDN_SCR_FLOATS ((size_t)8 << 20)
/* Below this many tokens the token-sequential kernel is as fast (two launches and the
 * solve cost about as much as 32 recurrent steps). */
#define GDN_MIN_TOKENS 32

/* ---- phase 1: grid (chunks, hv), GDN_THREADS threads ----
 * Shared: As [64][64], gs [64] (gam), bs [64] (beta), ws [64] (beta e^gam),
 * Qs, Ks [64][ld] (rows past L and columns past dk zero); ld = dk + 1 keeps the 16 rows a
 * warp reads in distinct banks. */
static __global__ void __launch_bounds__(GDN_THREADS) k_gdn_prep(ops_gdn_args a, float *W, float *U, float *P,
                                                                  float *G, int nch) {
  extern __shared__ float4 sm4[];
  float *sm = (float *)sm4;
  const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int dk = a.dk, dv = a.dv, ld = dk + 1;
  const int kh = a.v_tiled ? h % a.hk : h / (a.hv / a.hk);
  const int64_t t0 = (int64_t)c * GDN_C;
  const int L = a.n - t0 < GDN_C ? (int)(a.n - t0) : GDN_C;
  const size_t hc = (size_t)h * nch + c;
  float *As = sm, *gs = As + GDN_C * GDN_C, *bs = gs + GDN_C, *ws = bs + GDN_C;
  float *Qs = ws + GDN_C, *Ks = Qs + GDN_C * ld;

  if (tid < GDN_C) {
    /* inclusive scan of g over each warp's 32 tokens; warp 1 adds warp 0's total below */
    float gv = 0.0f, bv = 0.0f;
    if (tid < L) {
      gv = a.g[(t0 + tid) * a.hv + h];
      bv = a.beta[(t0 + tid) * a.hv + h];
    }
    bs[tid] = bv;
    const int lane = tid & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, gv, o);
      if (lane >= o) gv += y;
    }
    gs[tid] = gv;
  }
  for (int idx = tid; idx < GDN_C * dk; idx += GDN_THREADS) {
    const int r = idx / dk, d = idx - r * dk;
    float qv = 0.0f, kv = 0.0f;
    if (r < L && d < dk) {
      const int64_t o = ((t0 + r) * a.hk + kh) * dk + d;
      qv = a.q[o];
      kv = a.k[o];
    }
    Qs[r * ld + d] = qv;
    Ks[r * ld + d] = kv;
  }
  __syncthreads();
  if (tid >= 32 && tid < GDN_C) gs[tid] += gs[31]; /* gs[31] is final; gs[32..] read after the next barrier */

  float *Pc = P + hc * GDN_C * GDN_C;
  /* K K^T and Q K^T: thread (ti, tj) owns rows ti + 16a, columns tj + 16b */
  const int ti = tid >> 4, tj = tid & 15;
  float kk[4][4], qk[4][4];
#pragma unroll
  for (int x = 0; x < 4; x++)
#pragma unroll
    for (int y = 0; y < 4; y++) kk[x][y] = qk[x][y] = 0.0f;
  for (int d = 0; d < dk; d++) {
    float qi[4], ki[4], kj[4];
#pragma unroll
    for (int x = 0; x < 4; x++) {
      qi[x] = Qs[(ti + 16 * x) * ld + d];
      ki[x] = Ks[(ti + 16 * x) * ld + d];
      kj[x] = Ks[(tj + 16 * x) * ld + d];
    }
#pragma unroll
    for (int x = 0; x < 4; x++)
#pragma unroll
      for (int y = 0; y < 4; y++) {
        kk[x][y] += ki[x] * kj[y];
        qk[x][y] += qi[x] * kj[y];
      }
  }
  __syncthreads(); /* gs complete */
  if (tid < GDN_C) ws[tid] = bs[tid] * expf(gs[tid]);
#pragma unroll
  for (int x = 0; x < 4; x++)
#pragma unroll
    for (int y = 0; y < 4; y++) {
      const int i = ti + 16 * x, j = tj + 16 * y;
      float av = 0.0f, pv = 0.0f;
      if (j <= i && i < L) { /* the exponent is <= 0 only on and below the diagonal */
        const float e = expf(gs[i] - gs[j]);
        if (j < i) av = bs[i] * kk[x][y] * e;
        pv = qk[x][y] * e;
      }
      As[i * GDN_C + j] = av;
      Pc[i * GDN_C + j] = pv;
    }
  __syncthreads(); /* As, ws complete */

  /* Forward substitution, one column of [W | U] per thread: x_i = b_i - sum_{m<i} A_im x_m
   * (same order as the CPU). Fully unrolled so x stays in registers; rows past L have
   * b = 0 and A = 0, so they stay 0. */
  float *Wc = W + hc * GDN_C * dk, *Uc = U + hc * GDN_C * dv;
  for (int col = tid; col < dk + dv; col += GDN_THREADS) {
    float x[GDN_C];
    if (col < dk) {
#pragma unroll
      for (int i = 0; i < GDN_C; i++) x[i] = ws[i] * Ks[i * ld + col];
    } else {
      const int jv = col - dk;
#pragma unroll
      for (int i = 0; i < GDN_C; i++) x[i] = i < L ? bs[i] * a.v[((t0 + i) * a.hv + h) * dv + jv] : 0.0f;
    }
#pragma unroll
    for (int i = 1; i < GDN_C; i++) {
      const float4 *Ar = (const float4 *)(As + i * GDN_C);
      float acc = x[i];
#pragma unroll
      for (int m4 = 0; m4 < GDN_C / 4; m4++)
        if (4 * m4 < i) {
          const float4 av = Ar[m4];
          acc -= av.x * x[4 * m4];
          if (4 * m4 + 1 < i) acc -= av.y * x[4 * m4 + 1];
          if (4 * m4 + 2 < i) acc -= av.z * x[4 * m4 + 2];
          if (4 * m4 + 3 < i) acc -= av.w * x[4 * m4 + 3];
        }
      x[i] = acc;
    }
    if (col < dk) {
#pragma unroll
      for (int i = 0; i < GDN_C; i++) Wc[(size_t)i * dk + col] = x[i];
    } else {
#pragma unroll
      for (int i = 0; i < GDN_C; i++) Uc[(size_t)i * dv + col - dk] = x[i];
    }
  }
  if (tid < GDN_C) G[hc * GDN_C + tid] = gs[tid];
}

static size_t gdn_prep_smem(int dk) {
  return sizeof(float) * ((size_t)GDN_C * GDN_C + 3 * GDN_C + 2 * (size_t)GDN_C * (dk + 1));
}

/* Phase 2's chunk inputs as asynchronous copies (cp.async): every load of the chunk is in
 * flight at once, instead of a few per thread at a time, on the sequential path. W -> Ab,
 * Q -> Bb, P -> Pb, U -> Vs; elements past L, dk or dv are stored as 0 directly (stale
 * shared memory could hold NaN, and NaN * 0 is not 0). The caller commits, waits and
 * synchronises. P goes in 16-byte pieces: its rows are 64 floats and its scratch offset a
 * multiple of 64 floats, Pb's row stride a multiple of 4. */
template <int DK, int NV>
static __device__ __forceinline__ void gdn_scan_load(const ops_gdn_args &a, const float *Wc, const float *Pc,
                                                     const float *Uc, float *Ab, float *Bb, float *Pb, float *Vs,
                                                     int64_t t0, int L, int kh, int j0, int tid) {
  constexpr int LB = DK + 4, LP = GDN_C + 4, T = 16 * NV;
  const int dk = a.dk, dv = a.dv;
#pragma unroll 4
  for (int idx = tid; idx < GDN_C * DK; idx += T) {
    const int r = idx / DK, d = idx % DK;
    float *wd = Ab + r * LB + d, *qd = Bb + r * LB + d;
    if (d < dk) cuda_cp4(wd, Wc + (size_t)r * dk + d);
    else *wd = 0.0f;
    if (r < L && d < dk) cuda_cp4(qd, a.q + ((t0 + r) * a.hk + kh) * dk + d);
    else *qd = 0.0f;
  }
  for (int idx = tid; idx < GDN_C * GDN_C / 4; idx += T)
    cuda_cp16(Pb + (idx >> 4) * LP + (idx & 15) * 4, Pc + (size_t)idx * 4);
  for (int idx = tid; idx < GDN_C * NV; idx += T) {
    const int jj = j0 + idx % NV;
    if (jj < dv) cuda_cp4(Vs + idx, Uc + (size_t)(idx / NV) * dv + jj);
    else Vs[idx] = 0.0f;
  }
}

/* The chunk's K rows -> Ab (asynchronous, as above; rows past L and columns past dk 0). */
template <int DK, int NV>
static __device__ __forceinline__ void gdn_scan_load_k(const ops_gdn_args &a, float *Ab, int64_t t0, int L, int kh,
                                                       int tid) {
  constexpr int LB = DK + 4;
  const int dk = a.dk;
#pragma unroll 4
  for (int idx = tid; idx < GDN_C * DK; idx += 16 * NV) {
    const int r = idx / DK, d = idx % DK;
    float *kd = Ab + r * LB + d;
    if (r < L && d < dk) cuda_cp4(kd, a.k + ((t0 + r) * a.hk + kh) * dk + d);
    else *kd = 0.0f;
  }
}

/* ---- phase 2: grid (ceil(dv / 16), hv), GDN_THREADS threads, DK >= dk (padded with 0) ----
 * Shared: Ab [64][DK + 4] (W, then K), Bb [64][DK + 4] (Q), Pb [64][68],
 * Ss [DK][16] (this block's state columns), Vs [64][16] (U, then V'), Ob [64][16] (used by
 * the tensor-core kernel), Vk [64][16] (V' rows times the decay to the chunk's end, so K
 * enters the state update unscaled, straight from its asynchronous copy), eq/ek [64].
 * Row strides are multiples of 4 (float4 reads) and offset by 4 banks per row, so the two
 * rows a warp reads at once never share banks. */
template <int DK, int NV>
static __global__ void __launch_bounds__(16 * NV) k_gdn_scan(ops_gdn_args a, const float *W, const float *U,
                                                                  const float *P, const float *G, int nch) {
  constexpr int LB = DK + 4, LP = GDN_C + 4, RPT = DK / 16, T = 16 * NV;
  extern __shared__ float4 sm4[];
  float *sm = (float *)sm4;
  float *Ab = sm, *Bb = Ab + GDN_C * LB, *Pb = Bb + GDN_C * LB, *Ss = Pb + GDN_C * LP, *Vs = Ss + DK * NV;
  float *Ob = Vs + GDN_C * NV, *Vk = Ob + GDN_C * NV, *eq = Vk + GDN_C * NV, *ek = eq + GDN_C;
  (void)Ob;
  const int h = blockIdx.y, j0 = blockIdx.x * NV, tid = threadIdx.x, ti = tid / NV, tj = tid % NV;
  const int dk = a.dk, dv = a.dv;
  const int kh = a.v_tiled ? h % a.hk : h / (a.hv / a.hk);
  const int j = j0 + tj;
  float *Sg = a.state + (size_t)h * dk * dv;
  for (int idx = tid; idx < DK * NV; idx += T) {
    const int i = idx / NV, jj = j0 + idx % NV;
    Ss[idx] = i < dk && jj < dv ? Sg[(size_t)i * dv + jj] : 0.0f;
  }
  for (int c = 0; c < nch; c++) {
    const int64_t t0 = (int64_t)c * GDN_C;
    const int L = a.n - t0 < GDN_C ? (int)(a.n - t0) : GDN_C;
    const size_t hc = (size_t)h * nch + c;
    __syncthreads(); /* the previous chunk is done with every buffer (and Ss is loaded) */
    gdn_scan_load<DK, NV>(a, W + hc * GDN_C * dk, P + hc * GDN_C * GDN_C, U + hc * GDN_C * dv, Ab, Bb, Pb, Vs, t0, L, kh,
                      j0, tid);
    cuda_cp_commit();
    if (tid < GDN_C) {
      const float gi = G[hc * GDN_C + tid], gl = G[hc * GDN_C + GDN_C - 1];
      eq[tid] = expf(gi);
      ek[tid] = expf(gl - gi);
    }
    cuda_cp_wait<0>();
    __syncthreads();

    /* W S and Q S for rows ti + 16x, column tj */
    float wsa[4] = {0.0f, 0.0f, 0.0f, 0.0f}, qsa[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
    for (int d = 0; d < DK; d += 4) {
      const float s0 = Ss[d * NV + tj], s1 = Ss[(d + 1) * NV + tj], s2 = Ss[(d + 2) * NV + tj],
                  s3 = Ss[(d + 3) * NV + tj];
#pragma unroll
      for (int x = 0; x < 4; x++) {
        const float4 w = *(const float4 *)(Ab + (ti + 16 * x) * LB + d);
        const float4 q = *(const float4 *)(Bb + (ti + 16 * x) * LB + d);
        wsa[x] += w.x * s0 + w.y * s1 + w.z * s2 + w.w * s3;
        qsa[x] += q.x * s0 + q.y * s1 + q.z * s2 + q.w * s3;
      }
    }
    float o[4];
#pragma unroll
    for (int x = 0; x < 4; x++) {
      const int r = ti + 16 * x;
      Vs[r * NV + tj] -= wsa[x]; /* only this thread touches this element until the barrier */
      o[x] = eq[r] * qsa[x];
    }
    __syncthreads(); /* V' complete; Ab (W) and Bb (Q) are free */

    gdn_scan_load_k<DK, NV>(a, Ab, t0, L, kh, tid);
    cuda_cp_commit();
    for (int idx = tid; idx < GDN_C * NV; idx += T) Vk[idx] = ek[idx / NV] * Vs[idx];
    /* O += P V': P is zero above the diagonal, so row ti + 48 (the last this thread owns)
     * needs m <= ti + 48 only */
    const int mend = ((ti + 48) | 3) + 1;
    for (int m = 0; m < mend; m += 4) {
      const float v0 = Vs[m * NV + tj], v1 = Vs[(m + 1) * NV + tj], v2 = Vs[(m + 2) * NV + tj],
                  v3 = Vs[(m + 3) * NV + tj];
#pragma unroll
      for (int x = 0; x < 4; x++) {
        const float4 p = *(const float4 *)(Pb + (ti + 16 * x) * LP + m);
        o[x] += p.x * v0 + p.y * v1 + p.z * v2 + p.w * v3;
      }
    }
    if (j < dv)
#pragma unroll
      for (int x = 0; x < 4; x++) {
        const int r = ti + 16 * x;
        if (r < L) a.out[((t0 + r) * a.hv + h) * dv + j] = o[x];
      }
    cuda_cp_wait<0>();
    __syncthreads(); /* Ab holds K, Vk the decayed V' */

    /* S rows ti * RPT + r, column tj: S = e^gam_last S + K^T diag(e^(gam_last - gam)) V' */
    float sacc[RPT];
#pragma unroll
    for (int r = 0; r < RPT; r++) sacc[r] = 0.0f;
    for (int m = 0; m < L; m++) {
      const float vm = Vk[m * NV + tj];
      const float *kr = Ab + m * LB + ti * RPT;
      if constexpr (RPT % 4 == 0) {
#pragma unroll
        for (int r = 0; r < RPT; r += 4) {
          const float4 kv = *(const float4 *)(kr + r);
          sacc[r] += kv.x * vm;
          sacc[r + 1] += kv.y * vm;
          sacc[r + 2] += kv.z * vm;
          sacc[r + 3] += kv.w * vm;
        }
      } else {
#pragma unroll
        for (int r = 0; r < RPT; r++) sacc[r] += kr[r] * vm;
      }
    }
    const float el = expf(G[hc * GDN_C + GDN_C - 1]);
#pragma unroll
    for (int r = 0; r < RPT; r++) {
      float *s = Ss + (ti * RPT + r) * NV + tj;
      *s = el * *s + sacc[r];
    }
  }
  __syncthreads();
  for (int idx = tid; idx < DK * NV; idx += T) {
    const int i = idx / NV, jj = j0 + idx % NV;
    if (i < dk && jj < dv) Sg[(size_t)i * dv + jj] = Ss[idx];
  }
}

template <int DK, int NV>
static size_t gdn_scan_smem(void) {
  return sizeof(float) * (2 * (size_t)GDN_C * (DK + 4) + GDN_C * (GDN_C + 4) + DK * NV + 3 * GDN_C * NV +
                          2 * GDN_C);
}

template <int DK, int NV>
static bool gdn_scan_launch(cuda_impl *ci, const ops_gdn_args *s, const float *W, const float *U, const float *P,
                            const float *G, int nch) {
  const size_t smem = gdn_scan_smem<DK, NV>();
  auto kern = k_gdn_scan<DK, NV>;
  if (!cuda_check(ci, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                  "gdn scan smem"))
    return false;
  dim3 grid((unsigned)((s->dv + NV - 1) / NV), (unsigned)s->hv);
  cuda_launch(ci, "gdn scan", kern, grid, 16 * NV, smem, *s, W, U, P, G, nch);
  return !ci->err;
}

bool cuda_gdn_chunked_launch(ops_backend *be, const ops_gdn_args *a) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err) return true;
  /* batch-invariant mode: always the token-sequential kernel, since whether a step is recorded
   * (and so whether a prompt chunk could take this path) depends on the whole batch's size:
   * H100 session 20, a 40-token prompt's state rounded differently alone and batched */
  if (ci->recording || ci->batch_inv || a->n < GDN_MIN_TOKENS) return false;
  const int dk = a->dk, dv = a->dv, hv = a->hv, hk = a->hk;
  if (dk <= 0 || dk > 256 || dv <= 0 || hk <= 0 || hv <= 0 || hv % hk != 0 || hv > 65535) return false;
  const size_t per_chunk = (size_t)hv * GDN_C * ((size_t)dk + dv + GDN_C + 1);
  const int64_t seg_max = (int64_t)(GDN_SCR_FLOATS / per_chunk);
  if (seg_max < 1) return false;
  if (!ci->gdn_scr && !cuda_check(ci, cudaMalloc((void **)&ci->gdn_scr, GDN_SCR_FLOATS * sizeof(float)),
                                  "gdn scratch alloc")) {
    ci->gdn_scr = NULL;
    return true;
  }
  /* f32 in both numerics modes: a TF32 tensor-core variant of both phases measured no
   * faster on the H200 (127 vs 129 us for 512 tokens of the 0.8B shape: phase 2 is bound by
   * its loads and the sequential chunk loop, not by the products) and moved the Qwen3.5
   * fixtures' logits by up to 2.2e-2 (f32: 2e-4), so it was removed. */
  const size_t prep_smem = gdn_prep_smem(dk);
  if (!cuda_check(ci, cudaFuncSetAttribute(k_gdn_prep, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prep_smem),
                  "gdn prep smem"))
    return true;
  /* Phase 2 reads each chunk's W, Q, K and P once per block: 32 state columns per block halve
   * that traffic but halve the blocks, so 32 only while they still cover most SMs (dk <= 128:
   * 512 threads hold DK / 16 state rows each in registers). */
  const int64_t wide_blocks = (int64_t)hv * ((dv + 31) / 32), sms = ci->n_sm > 0 ? ci->n_sm : 132;
  const bool wide = dk <= 128 && (ci->gdn_scan_cols == 32 || (ci->gdn_scan_cols == 0 && 4 * wide_blocks >= 3 * sms));
  const int64_t nc = (a->n + GDN_C - 1) / GDN_C;
  for (int64_t c0 = 0; c0 < nc && !ci->err; c0 += seg_max) {
    const int nch = (int)(nc - c0 < seg_max ? nc - c0 : seg_max);
    const int64_t t0 = c0 * GDN_C;
    ops_gdn_args s = *a;
    s.n = a->n - t0 < (int64_t)nch * GDN_C ? a->n - t0 : (int64_t)nch * GDN_C;
    s.q += t0 * hk * dk;
    s.k += t0 * hk * dk;
    s.v += t0 * hv * dv;
    s.g += t0 * hv;
    s.beta += t0 * hv;
    s.out += t0 * hv * dv;
    float *W = ci->gdn_scr, *U = W + (size_t)hv * nch * GDN_C * dk, *P = U + (size_t)hv * nch * GDN_C * dv;
    float *G = P + (size_t)hv * nch * GDN_C * GDN_C;
    cuda_launch(ci, "gdn prep", k_gdn_prep, dim3((unsigned)nch, (unsigned)hv), GDN_THREADS, prep_smem, s, W, U, P, G,
                nch);
    if (ci->err) break;
    if (dk <= 32) wide ? gdn_scan_launch<32, 32>(ci, &s, W, U, P, G, nch) : gdn_scan_launch<32, 16>(ci, &s, W, U, P, G, nch);
    else if (dk <= 64) wide ? gdn_scan_launch<64, 32>(ci, &s, W, U, P, G, nch) : gdn_scan_launch<64, 16>(ci, &s, W, U, P, G, nch);
    else if (dk <= 128) wide ? gdn_scan_launch<128, 32>(ci, &s, W, U, P, G, nch) : gdn_scan_launch<128, 16>(ci, &s, W, U, P, G, nch);
    else gdn_scan_launch<256, 16>(ci, &s, W, U, P, G, nch);
  }
  return true;
}
