/* cuda_fused.cu: fused decode ops (ops.h: gdn_step, add_rmsnorm, norm_rope). A decode step of a small
 * model is bound by the number of kernels, not by the work in them (bench/notes/gpu.md:
 * ~3 us per kernel even replayed as a graph), so these do in one kernel what the model
 * would otherwise run as a chain of small ones. Both compute the same math as the unfused
 * ops, in f32 in either numerics mode (they do no matrix products).
 *
 * gdn_step: one thread-block cluster of GS_CLUSTER (8) blocks per k-head group (k-head kh and
 * the r = hv/hk v-heads that read it), grid (8, hk): 128 blocks for the 16 k-heads of Qwen3.5,
 * where one block per group left 116 of 132 SMs idle. The delta rule is independent per state
 * column (v index), so the group's G = r * dv columns are split into 8 contiguous ranges, one
 * per block (a range may span v-heads). Each block:
 *   1. loads its state columns into registers (issued first: their latency overlaps the rest);
 *      recomputes the conv + SiLU and l2norm of the group's q and k for the n tokens (cheap:
 *      2 * dk channels) and convolves its own v columns (that conv state is written by its one
 *      owner); computes the gates of the v-heads it touches;
 *   2. runs the delta rule over the n tokens, P adjacent lanes per column (each holding every
 *      P-th row; dot products reduced over the P lanes by shuffles), output rows to shared;
 *   3. the gated RMSNorm (its z and weight loaded in step 1) needs each (token, v-head) row's
 *      sum of squares, which spans blocks: each block writes its partial sums to shared memory,
 *      the cluster synchronises, and every block adds the partials of the blocks covering its
 *      heads through distributed shared memory (in block order: deterministic), then writes its
 *      normalised columns of y.
 * Column ranges are contiguous so a v-head's state row segment [i, j0..j1) is one run of
 * memory per block; hk * 8 blocks, 128 / 256 threads for the Qwen3.5 shapes (P = 8 lanes per
 * column, 16 state rows each). Shapes: hv / hk <= 32, ceil(hv / hk * dv / 8) <= 256, dk <= 256,
 * conv width <= 8 (else ANNA_EUNSUPPORTED); wider blocks run their columns in passes.
 * The q/k conv state is read by all 8 blocks of the cluster, so only rank 0 rewrites it, after
 * the first cluster barrier (every block has read it by then). A second barrier, split into
 * its arrive (partials read) and wait (before exit, after the y stores), keeps each block's
 * partials alive until the other blocks have read them.
 * The cluster size is a compile-time attribute (__cluster_dims__), so the plain launch of
 * cuda_launch / cuda_launch_pdl (and a graph node made from its log) forms the clusters; sm_90
 * and newer only, which is every architecture this backend is built for. The state, the conv
 * windows and the model vectors are loaded before cuda_pdl_enter, so in a recorded step their
 * latency overlaps the projections' tail; the projections' outputs are then loaded in one
 * round (ncu, 35B-A3B shape: step 1's serial load rounds were over half of the kernel's
 * stall samples).
 * Tokens beyond STEP_TOK are handled by further launches (state carries over in memory).
 * Batched (ops_gdn_step_args.n_runs > 0): one launch covers every run of a decode batch, grid
 * z = the run (its table by value in the kernel's parameters, fz_runs, so a recorded graph
 * replays it); each z slice is exactly the single-run kernel on that run's rows and states.
 * The single-run form launches with a one-entry table it never reads (NR = 1): its code is
 * the kernel as it was before batching. */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_math.cuh"

#include "base/error.h"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define STEP_TOK 8       /* tokens per launch */
#define STEP_MAXKW 8     /* conv width */
#define STEP_MAXNC 256   /* state columns per block (shared rows of v and of the output) */
#define STEP_MAXR 32     /* v-heads per k-head (gates and partial sums in shared memory) */
#define STEP_THREADS 512 /* most threads per block: columns * P, or passes over the columns */
#define GS_CLUSTER 8     /* blocks per k-head group (the portable cluster size limit) */

/* Sum over groups of P adjacent lanes (P a power of two <= 32); all 32 lanes must call. */
template <int P>
static __device__ __forceinline__ float fz_group_sum(float v) {
#pragma unroll
  for (int o = P / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Channel c's causal depthwise conv window (the state row [c, kw-1]) and taps, held in
 * registers: loaded before the kernel waits for the projections (neither is written by
 * them), so only the inputs' loads follow the wait. Unrolled to STEP_MAXKW with guards, so
 * the window stays in registers (a runtime index would put it in local memory). */
struct fz_conv_win {
  float w[STEP_MAXKW], s[STEP_MAXKW];
};

static __device__ __forceinline__ void fz_conv_load(fz_conv_win &cw, int64_t c, const float *w, int kw,
                                                    const float *state) {
  const int ns = kw - 1;
#pragma unroll
  for (int j = 0; j < STEP_MAXKW; j++) {
    cw.w[j] = j < kw ? w[c * kw + j] : 0.0f;
    cw.s[j] = j < ns ? state[c * ns + j] : 0.0f;
  }
}

/* Channel c's n inputs (row stride xs), all loads issued together. */
static __device__ __forceinline__ void fz_conv_in(float (&xv)[STEP_TOK], const float *x, int64_t xs, int n,
                                                  int64_t c) {
#pragma unroll
  for (int t = 0; t < STEP_TOK; t++) xv[t] = t < n ? x[(int64_t)t * xs + c] : 0.0f;
}

/* Conv + SiLU of a loaded channel over its n inputs, as k_conv1d_silu: out[t * os] for t < n;
 * the advanced window written to state row c when write_state (its one owner). */
static __device__ __forceinline__ void fz_conv_run(fz_conv_win cw, const float (&xv)[STEP_TOK], int n, int kw,
                                                   float *out, int os, float *state, int64_t c, bool write_state) {
  const int ns = kw - 1;
#pragma unroll
  for (int t = 0; t < STEP_TOK; t++) {
    if (t >= n) break;
    const float xt = xv[t];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < STEP_MAXKW; j++) /* window j < ns, then the token itself at j == ns */
      if (j < ns) s += cw.w[j] * cw.s[j];
      else if (j == ns) s += cw.w[j] * xt;
    out[t * os] = cuda_silu(s);
#pragma unroll
    for (int j = 0; j + 1 < STEP_MAXKW; j++)
      if (j + 1 < ns) cw.s[j] = cw.s[j + 1];
      else if (j + 1 == ns) cw.s[j] = xt;
  }
  if (write_state)
#pragma unroll
    for (int j = 0; j < STEP_MAXKW; j++)
      if (j < ns) state[c * ns + j] = cw.s[j];
}

/* The new conv state of channel c after n tokens: the last kw-1 of (old state, x rows). Each
 * element is read before any is written, so the caller may be the only reader left. */
static __device__ void fz_conv_state_advance(const float *x, int64_t xs, int n, int64_t c, int kw, float *state) {
  const int ns = kw - 1;
  float win[STEP_MAXKW];
#pragma unroll
  for (int j = 0; j < STEP_MAXKW; j++)
    win[j] = j >= ns ? 0.0f : n + j < ns ? state[c * ns + n + j] : x[(int64_t)(n + j - ns) * xs + c];
#pragma unroll
  for (int j = 0; j < STEP_MAXKW; j++)
    if (j < ns) state[c * ns + j] = win[j];
}

/* First state column of block b of the group's G columns (8 near-equal contiguous ranges). */
static __device__ __forceinline__ int fz_col0(int b, int G) {
  return (int)((int64_t)b * G / GS_CLUSTER);
}

/* Conv + SiLU of q/k channel c (< 2 dk: q, then k) of k-head kh over the n tokens into qs or
 * ks, window, taps and inputs loaded together; the conv state is only read (its rows are
 * shared by the v-heads of the group). */
template <int MAXDK>
static __device__ __forceinline__ void fz_qk_conv(const ops_gdn_step_args &a, int kh, int c, float (*qs)[MAXDK],
                                                  float (*ks)[MAXDK]) {
  const int dk = a.dk, n = (int)a.n, isk = c >= dk, i = c - isk * dk;
  const int64_t Kd = (int64_t)a.hk * dk, cd = 2 * Kd + (int64_t)a.hv * a.dv;
  const int64_t ch = isk * Kd + (int64_t)kh * dk + i;
  fz_conv_win cw;
  float xv[STEP_TOK];
  fz_conv_load(cw, ch, a.conv_w, a.kw, a.conv_state);
  fz_conv_in(xv, a.qkv, cd, n, ch);
  fz_conv_run(cw, xv, n, a.kw, isk ? &ks[0][i] : &qs[0][i], MAXDK, a.conv_state, ch, false);
}

/* The gates of one (token, v-head): decay = exp(g) (the delta rule's factor), beta, from the
 * projections' a and b and the head's dt_bias and a_log, as gdn_gates. */
static __device__ __forceinline__ void fz_gate(float av, float dtb, float alog, float bv, float *decay, float *beta) {
  const float zb = av + dtb;
  const float sp = zb > 20.0f ? zb : log1pf(expf(zb));
  *decay = expf(-expf(alog) * sp);
  *beta = 1.0f / (1.0f + expf(-bv));
}

/* l2norm of the n tokens' q and k rows of dk in shared memory (q also scaled by 1/sqrt(dk)),
 * a warp per row; eps 1e-6 as the l2norm op. */
template <int MAXDK>
static __device__ __forceinline__ void fz_qk_l2norm(float (*qs)[MAXDK], float (*ks)[MAXDK], int n, int dk) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  for (int p = warp; p < 2 * n; p += nwarp) { /* row p: token p / 2, q (even) or k (odd) */
    float *row = (p & 1) ? ks[p >> 1] : qs[p >> 1];
    float ss = 0.0f;
    for (int i = lane; i < dk; i += 32) ss += row[i] * row[i];
    ss = cuda_warp_sum(ss);
    const float inv = ((p & 1) ? 1.0f : 1.0f / sqrtf((float)dk)) / sqrtf(ss + 1e-6f);
    for (int i = lane; i < dk; i += 32) row[i] *= inv;
  }
}

/* One token of the gated delta rule on a state column held by P adjacent lanes (lane part
 * holds rows part + P m in S): S *= decay; u = beta (v - k.S); S += k u; returns q.S (every
 * lane of the group). */
template <int R, int P>
static __device__ __forceinline__ float fz_delta_token(float (&S)[R], const float *kt, const float *qt, int part, int dk,
                                                      float decay, float beta, float v) {
  float u = 0.0f;
#pragma unroll
  for (int m = 0; m < R; m++) {
    const int i = part + P * m;
    if (i < dk) {
      S[m] *= decay;
      u += kt[i] * S[m];
    }
  }
  u = fz_group_sum<P>(u);
  u = beta * (v - u);
  float o = 0.0f;
#pragma unroll
  for (int m = 0; m < R; m++) {
    const int i = part + P * m;
    if (i < dk) {
      S[m] += kt[i] * u;
      o += qt[i] * S[m];
    }
  }
  return fz_group_sum<P>(o);
}

/* A state column (rows at stride dv) to / from the registers of lane part of its group. */
template <int R, int P>
static __device__ __forceinline__ void fz_state_load(float (&S)[R], const float *Sc, int part, int dk, int dv) {
#pragma unroll
  for (int m = 0; m < R; m++) {
    const int i = part + P * m;
    S[m] = Sc && i < dk ? Sc[(int64_t)i * dv] : 0.0f;
  }
}
template <int R, int P>
static __device__ __forceinline__ void fz_state_store(const float (&S)[R], float *Sc, int part, int dk, int dv) {
#pragma unroll
  for (int m = 0; m < R; m++) {
    const int i = part + P * m;
    if (i < dk) Sc[(int64_t)i * dv] = S[m];
  }
}

/* A launch's run table: r[blockIdx.z] (start and n relative to the launch's rows, at most
 * STEP_TOK tokens). By value, zero-filled beyond the launched runs (graph logs compare bytes). */
template <int NR>
struct fz_runs {
  ops_gdn_step_run r[NR];
};

/* The args of this block's run: the single-run launch's own (NR = 1: the table is not read);
 * else the launch's with run blockIdx.z's token count, row offset and states. */
static __device__ __forceinline__ const ops_gdn_step_args &fz_run_args(const ops_gdn_step_args &p,
                                                                      const fz_runs<1> &) {
  return p;
}
template <int NR>
static __device__ __forceinline__ ops_gdn_step_args fz_run_args(const ops_gdn_step_args &p, const fz_runs<NR> &rt) {
  const ops_gdn_step_run &u = rt.r[blockIdx.z];
  const int64_t Vd = (int64_t)p.hv * p.dv, cd = 2 * (int64_t)p.hk * p.dk + Vd;
  ops_gdn_step_args a = p;
  a.n = u.n;
  a.conv_state = u.conv_state;
  a.state = u.state;
  a.qkv = p.qkv + u.start * cd;
  a.z = p.z + u.start * Vd;
  a.b = p.b + u.start * p.hv;
  a.a = p.a + u.start * p.hv;
  a.y = p.y + u.start * Vd;
  return a;
}

/* grid (GS_CLUSTER, hk, runs), clusters of GS_CLUSTER blocks along x; block dim a multiple of 32,
 * <= STEP_THREADS; a.n <= STEP_TOK; hv / hk <= STEP_MAXR; ceil(hv / hk * dv / 8) <= STEP_MAXNC;
 * dk <= MAXDK; the model vectors in a are device pointers. */
template <int MAXDK, int P, int NR>
static __global__ void __cluster_dims__(GS_CLUSTER, 1, 1) __launch_bounds__(STEP_THREADS)
    k_gdn_step(ops_gdn_step_args p, fz_runs<NR> rt) {
  const ops_gdn_step_args &a = fz_run_args(p, rt);
  __shared__ float qs[STEP_TOK][MAXDK], ks[STEP_TOK][MAXDK];
  __shared__ float vs[STEP_TOK][STEP_MAXNC], os[STEP_TOK][STEP_MAXNC];
  __shared__ float sdecay[STEP_TOK][STEP_MAXR], sbeta[STEP_TOK][STEP_MAXR];
  __shared__ float pss[STEP_TOK][STEP_MAXR], sinv[STEP_TOK][STEP_MAXR];
  __shared__ float zs[STEP_TOK][STEP_MAXNC], ws[STEP_MAXNC]; /* silu(z) and norm_w of the block's outputs */
  cg::cluster_group cl = cg::this_cluster();
  const int rank = (int)cl.block_rank(), kh = blockIdx.y;
  const int tid = threadIdx.x, nth = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarp = nth >> 5;
  const int n = (int)a.n, dk = a.dk, dv = a.dv, hk = a.hk, hv = a.hv, r = hv / hk, G = r * dv;
  const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd;
  const int c0 = fz_col0(rank, G), nc = fz_col0(rank + 1, G) - c0; /* this block's columns; nc may be 0 */
  const int e_lo = c0 / dv, nh = nc > 0 ? (c0 + nc - 1) / dv - e_lo + 1 : 0; /* v-heads touched (group index) */
#define FZ_HEAD(e) (a.v_tiled ? kh + (e) * hk : kh * r + (e))

  /* This thread's state column in pass `pass` (columns cpp at a time) and its row phase. */
  constexpr int R = MAXDK / P; /* state rows per thread: part, part + P, ... */
  const int cpp = nth / P, part = tid % P, npass = (nc + cpp - 1) / cpp;
  float S[R];
  auto state_col = [&](int pass) -> float * { /* NULL when the thread has no column this pass */
    const int lc = pass * cpp + tid / P;
    if (lc >= nc) return NULL;
    const int gc = c0 + lc, h = FZ_HEAD(gc / dv);
    return a.state + (int64_t)h * dk * dv + gc % dv;
  };
  if (npass > 0) fz_state_load<R, P>(S, state_col(0), part, dk, dv);
  /* Everything else this thread reads that the projections do not write, loaded with the
   * state: the conv windows and taps of its first q/k channel (tid) and of its v column (tid
   * < nc: nth >= nc for every launch), that column's norm weight, and the decay parameters
   * of its first gate. */
  const int nqk = 2 * dk;
  const bool has_qk = tid < nqk, has_v = tid < nc, has_g = tid < n * nh;
  const int64_t ch_qk = has_qk ? (tid >= dk) * Kd + (int64_t)kh * dk + tid % dk : 0;
  const int gcv = c0 + tid;
  const int64_t ch_v = has_v ? 2 * Kd + (int64_t)FZ_HEAD(gcv / dv) * dv + gcv % dv : 0;
  const int hg = has_g ? FZ_HEAD(e_lo + tid % nh) : 0;
  fz_conv_win cw_qk, cw_v;
  if (has_qk) fz_conv_load(cw_qk, ch_qk, a.conv_w, a.kw, a.conv_state);
  if (has_v) fz_conv_load(cw_v, ch_v, a.conv_w, a.kw, a.conv_state);
  const float nw = has_v ? a.norm_w[gcv % dv] : 0.0f;
  const float alog = has_g ? a.a_log[hg] : 0.0f, dtb = has_g ? a.dt_bias[hg] : 0.0f;
  /* Launched by cuda_launch_pdl (the first launch of a run): the loads above read memory no
   * kernel of this step writes before this one (its run's earlier launches, which do, are
   * ordinary launches), so they overlap the tail of the projections before; q, k, v, z and
   * the gates they wrote are read below, all issued before any is used. */
  cuda_pdl_enter();

  /* 1. the inputs: q/k and v channel rows, z of the v column, the gate's a and b */
  float x_qk[STEP_TOK], x_v[STEP_TOK], zr[STEP_TOK];
  if (has_qk) fz_conv_in(x_qk, a.qkv, cd, n, ch_qk);
  if (has_v) {
    fz_conv_in(x_v, a.qkv, cd, n, ch_v);
    fz_conv_in(zr, a.z, Vd, n, (int64_t)FZ_HEAD(gcv / dv) * dv + gcv % dv);
  }
  const int tg = has_g ? tid / nh : 0;
  const float ga = has_g ? a.a[(int64_t)tg * hv + hg] : 0.0f, gb = has_g ? a.b[(int64_t)tg * hv + hg] : 0.0f;
  /* then, to shared memory: the gates of the touched v-heads (the delta rule uses exp(g));
   * silu(z) and the norm weight of this block's columns; the conv + SiLU of q and k (state
   * only read here) and of this block's v columns (their one owner: state written); the
   * l2norm of q (also scaled by 1/sqrt(dk)) and k below. */
  if (has_g) fz_gate(ga, dtb, alog, gb, &sdecay[tg][e_lo + tid % nh], &sbeta[tg][e_lo + tid % nh]);
  for (int p = tid + nth; p < n * nh; p += nth) { /* more gates than threads */
    const int t = p / nh, e = e_lo + p % nh, h = FZ_HEAD(e);
    fz_gate(a.a[(int64_t)t * hv + h], a.dt_bias[h], a.a_log[h], a.b[(int64_t)t * hv + h], &sdecay[t][e], &sbeta[t][e]);
  }
  if (has_v) {
    ws[tid] = nw;
#pragma unroll
    for (int t = 0; t < STEP_TOK; t++)
      if (t < n) zs[t][tid] = cuda_silu(zr[t]);
  }
  if (has_qk)
    fz_conv_run(cw_qk, x_qk, n, a.kw, tid >= dk ? &ks[0][tid - dk] : &qs[0][tid], MAXDK, a.conv_state, ch_qk, false);
  for (int c = tid + nth; c < nqk; c += nth) { /* more q/k channels than threads */
    fz_qk_conv<MAXDK>(a, kh, c, qs, ks);
  }
  if (has_v) fz_conv_run(cw_v, x_v, n, a.kw, &vs[0][tid], STEP_MAXNC, a.conv_state, ch_v, true);
  __syncthreads();
  fz_qk_l2norm<MAXDK>(qs, ks, n, dk);
  __syncthreads();

  /* 2. the delta rule, per pass over the block's columns. */
  for (int pass = 0; pass < npass; pass++) {
    float *Sc = state_col(pass);
    const int lc = pass * cpp + tid / P, e = Sc ? (c0 + lc) / dv : 0;
    for (int t = 0; t < n; t++) {
      const float o = fz_delta_token<R, P>(S, ks[t], qs[t], part, dk, Sc ? sdecay[t][e] : 0.0f,
                                           Sc ? sbeta[t][e] : 0.0f, Sc ? vs[t][lc] : 0.0f);
      if (Sc && part == 0) os[t][lc] = o;
    }
    if (Sc) fz_state_store<R, P>(S, Sc, part, dk, dv);
    if (pass + 1 < npass) fz_state_load<R, P>(S, state_col(pass + 1), part, dk, dv);
  }
  __syncthreads();

  /* 3. partial sums of squares of each (token, touched v-head) row over this block's columns. */
  for (int p = warp; p < n * nh; p += nwarp) {
    const int t = p / nh, e = e_lo + p % nh;
    const int l0 = max(e * dv, c0) - c0, l1 = min((e + 1) * dv, c0 + nc) - c0;
    float ss = 0.0f;
    for (int l = l0 + lane; l < l1; l += 32) ss += os[t][l] * os[t][l];
    ss = cuda_warp_sum(ss);
    if (lane == 0) pss[t][e] = ss;
  }
  cl.sync(); /* every block's partials are written, and every block has read the q/k conv state */
  if (rank == 0)
    for (int c = tid; c < 2 * dk; c += nth)
      fz_conv_state_advance(a.qkv, cd, n, (c >= dk) * Kd + (int64_t)kh * dk + c % dk, a.kw, a.conv_state);
  for (int p = tid; p < n * nh; p += nth) {
    const int t = p / nh, e = e_lo + p % nh;
    float ss = 0.0f;
    for (int b = 0; b < GS_CLUSTER; b++) { /* the blocks whose columns meet head e, in order */
      const int b0 = fz_col0(b, G), b1 = fz_col0(b + 1, G);
      if (b0 < (e + 1) * dv && b1 > e * dv && b1 > b0) ss += cl.map_shared_rank(&pss[0][0], b)[t * STEP_MAXR + e];
    }
    sinv[t][e] = 1.0f / sqrtf(ss / (float)dv + a.eps);
  }
  /* This block is done with the others' partials; it waits for them to be done with its own
   * (a block's shared memory goes when it exits) only after writing y, so that wait mostly
   * overlaps the stores instead of adding a second full barrier. */
  cl.barrier_arrive();
  __syncthreads(); /* sinv visible in the block */
  for (int p = tid; p < n * nc; p += nth) {
    const int t = p / nc, lc = p % nc, gc = c0 + lc, e = gc / dv, j = gc % dv;
    const int64_t off = (int64_t)t * Vd + (int64_t)FZ_HEAD(e) * dv + j;
    a.y[off] = ws[lc] * (os[t][lc] * sinv[t][e]) * zs[t][lc];
  }
  cl.barrier_wait();
#undef FZ_HEAD
}

/* The per-head variant (CUDA_GDN_HEAD, cuda_backend_set_gdn_variant): one block per v-head,
 * its dv columns and all dk state rows (P lanes per column, R = MAXDK / P rows each in
 * registers), grid (r, hk, runs) in clusters of the r = hv / hk blocks that share a k-head. The
 * output norm's row is then the block's own, so the cluster only orders the q/k conv state:
 * every block reads it, arrives on the cluster barrier once it has, and rank 0 waits on it at
 * the very end before rewriting the state (the other ranks wait there too), where the cluster
 * variant above needs two full cluster barriers and a DSMEM exchange per step. Fewer, wider
 * blocks (32 of 512 threads for the 35B-A3B shape, 64 KB of state each). Shapes: dk <= 128,
 * dv <= 128, r in {1, 2, 4} (cuda_op_gdn_step falls back to the cluster variant). */
#define HEAD_MAXV 128
template <int MAXDK, int P, int RC, int NR>
static __global__ void __cluster_dims__(RC, 1, 1) __launch_bounds__(STEP_THREADS)
    k_gdn_step_head(ops_gdn_step_args p, fz_runs<NR> rt) {
  const ops_gdn_step_args &a = fz_run_args(p, rt);
  __shared__ float qs[STEP_TOK][MAXDK], ks[STEP_TOK][MAXDK];
  __shared__ float vs[STEP_TOK][HEAD_MAXV], os[STEP_TOK][HEAD_MAXV], zs[STEP_TOK][HEAD_MAXV], ws[HEAD_MAXV];
  __shared__ float sdecay[STEP_TOK], sbeta[STEP_TOK], sinv[STEP_TOK], sred[STEP_TOK][STEP_THREADS / 32];
  cg::cluster_group cl = cg::this_cluster();
  const int e = blockIdx.x, kh = blockIdx.y; /* v-head e of k-head kh's group (cluster rank e) */
  const int tid = threadIdx.x, nth = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarp = nth >> 5;
  const int n = (int)a.n, dk = a.dk, dv = a.dv, hk = a.hk, hv = a.hv, r = hv / hk;
  const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd;
  const int h = a.v_tiled ? kh + e * hk : kh * r + e;
  constexpr int R = MAXDK / P;
  const int col = tid / P, part = tid % P;
  float *const Sc = col < dv ? a.state + (int64_t)h * dk * dv + col : NULL;
  float S[R];
  fz_state_load<R, P>(S, Sc, part, dk, dv);
  /* as k_gdn_step: the state load overlaps the projections' tail (first launch of a run) */
  cuda_pdl_enter();

  /* 1. q/k channels (conv + SiLU; the state only read), this head's v channels (their one
   * owner: state written), silu(z) and the norm weight, the gates. With enough threads each
   * role has its own threads, so all their loads are in flight at once; each channel's window,
   * taps and inputs are loaded together (one round). */
  const int offv = nth >= 2 * dk + dv + n ? 2 * dk : 0, offg = offv ? 2 * dk + dv : 0;
  for (int c = tid; c < 2 * dk; c += nth) {
    fz_qk_conv<MAXDK>(a, kh, c, qs, ks);
  }
  for (int j = tid - offv; j < dv; j += nth) {
    if (j < 0) continue;
    const int64_t ch = 2 * Kd + (int64_t)h * dv + j;
    fz_conv_win cw;
    float xv[STEP_TOK], zr[STEP_TOK];
    fz_conv_load(cw, ch, a.conv_w, a.kw, a.conv_state);
    fz_conv_in(xv, a.qkv, cd, n, ch);
    fz_conv_in(zr, a.z, Vd, n, (int64_t)h * dv + j);
    const float nw = a.norm_w[j];
    fz_conv_run(cw, xv, n, a.kw, &vs[0][j], HEAD_MAXV, a.conv_state, ch, true);
#pragma unroll
    for (int t = 0; t < STEP_TOK; t++)
      if (t < n) zs[t][j] = cuda_silu(zr[t]);
    ws[j] = nw;
  }
  for (int t = tid - offg; t < n; t += nth)
    if (t >= 0)
      fz_gate(a.a[(int64_t)t * hv + h], a.dt_bias[h], a.a_log[h], a.b[(int64_t)t * hv + h], &sdecay[t], &sbeta[t]);
  cl.barrier_arrive(); /* this block has read the q/k conv state (rank 0 rewrites it at the end) */
  __syncthreads();
  fz_qk_l2norm<MAXDK>(qs, ks, n, dk);
  __syncthreads();

  /* 2. the delta rule over the n tokens, as k_gdn_step */
  for (int t = 0; t < n; t++) {
    const float o = fz_delta_token<R, P>(S, ks[t], qs[t], part, dk, sdecay[t], sbeta[t], Sc ? vs[t][col] : 0.0f);
    if (Sc && part == 0) os[t][col] = o;
  }
  if (Sc) fz_state_store<R, P>(S, Sc, part, dk, dv);
  __syncthreads();

  /* 3. the gated RMSNorm of each token's row (this block's dv outputs): warp partial sums,
   * added in warp order */
  for (int t = 0; t < n; t++) {
    float ss = 0.0f;
    for (int j = tid; j < dv; j += nth) ss += os[t][j] * os[t][j];
    ss = cuda_warp_sum(ss);
    if (lane == 0) sred[t][warp] = ss;
  }
  __syncthreads();
  if (tid < n) {
    float ss = 0.0f;
    for (int w = 0; w < nwarp; w++) ss += sred[tid][w];
    sinv[tid] = 1.0f / sqrtf(ss / (float)dv + a.eps);
  }
  __syncthreads();
  for (int p = tid; p < n * dv; p += nth) {
    const int t = p / dv, j = p % dv;
    a.y[(int64_t)t * Vd + (int64_t)h * dv + j] = ws[j] * (os[t][j] * sinv[t]) * zs[t][j];
  }
  cl.barrier_wait(); /* every block of the group has read the q/k conv state */
  if (e == 0)
    for (int c = tid; c < 2 * dk; c += nth)
      fz_conv_state_advance(a.qkv, cd, n, (c >= dk) * Kd + (int64_t)kh * dk + c % dk, a.kw, a.conv_state);
}

template <int MAXDK, int P, int RC, int NR>
static void launch_step_head(cuda_impl *ci, unsigned hk, unsigned nz, unsigned threads, const ops_gdn_step_args &a,
                             const fz_runs<NR> &rt, bool pdl) {
  const dim3 grid(RC, hk, nz);
  if (pdl) cuda_launch_pdl(ci, "gdn step head", k_gdn_step_head<MAXDK, P, RC, NR>, grid, threads, 0, a, rt);
  else cuda_launch(ci, "gdn step head", k_gdn_step_head<MAXDK, P, RC, NR>, grid, threads, 0, a, rt);
}

/* The per-head launch for these sizes; false when the variant does not take them. */
template <int NR>
static bool step_head(cuda_impl *ci, const ops_gdn_step_args &d, const fz_runs<NR> &rt, unsigned nz, bool pdl) {
  const int r = d.hv / d.hk;
  if (d.dk > 128 || d.dv > HEAD_MAXV || (r != 1 && r != 2 && r != 4)) return false;
  const int P = d.dv > 64 ? 4 : 8; /* dv * P <= 512 threads; R = 128 / P rows per lane */
  const unsigned threads = (unsigned)((d.dv * P + 31) / 32 * 32);
#define HEAD(PP, RR) launch_step_head<128, PP, RR, NR>(ci, (unsigned)d.hk, nz, threads, d, rt, pdl)
  if (P == 4) {
    if (r == 1) HEAD(4, 1);
    else if (r == 2) HEAD(4, 2);
    else HEAD(4, 4);
  } else {
    if (r == 1) HEAD(8, 1);
    else if (r == 2) HEAD(8, 2);
    else HEAD(8, 4);
  }
#undef HEAD
  return true;
}

/* pdl: programmatic launch (cuda_launch_pdl); only for the first launch of a run, since a
 * later one reads the state its predecessor writes before it waits for it. */
template <int MAXDK, int P, int NR>
static void launch_step(cuda_impl *ci, unsigned hk, unsigned nz, unsigned threads, const ops_gdn_step_args &a,
                        const fz_runs<NR> &rt, bool pdl) {
  const dim3 grid(GS_CLUSTER, hk, nz);
  if (pdl) cuda_launch_pdl(ci, "gdn step", k_gdn_step<MAXDK, P, NR>, grid, threads, 0, a, rt);
  else cuda_launch(ci, "gdn step", k_gdn_step<MAXDK, P, NR>, grid, threads, 0, a, rt);
}

/* One launch of d (its rows at most STEP_TOK tokens) over nz runs of rt (NR = 1: d's own
 * single run), in the selected variant. */
template <int NR>
static void step_launch(cuda_impl *ci, const ops_gdn_step_args &d, const fz_runs<NR> &rt, unsigned nz,
                        unsigned threads, bool pdl) {
  if (ci->gdn_variant == CUDA_GDN_HEAD && step_head<NR>(ci, d, rt, nz, pdl)) return;
  const unsigned hk = (unsigned)d.hk;
  if (d.dk <= 32) launch_step<32, 4, NR>(ci, hk, nz, threads, d, rt, pdl);
  else if (d.dk <= 64) launch_step<64, 8, NR>(ci, hk, nz, threads, d, rt, pdl);
  else if (d.dk <= 128) launch_step<128, 8, NR>(ci, hk, nz, threads, d, rt, pdl);
  else launch_step<256, 16, NR>(ci, hk, nz, threads, d, rt, pdl);
}

void cuda_op_gdn_step(ops_backend *be, const ops_gdn_step_args *a) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || (a->n_runs == 0 && a->n <= 0)) return;
  const int hk = a->hk, hv = a->hv, dk = a->dk, dv = a->dv;
  const int64_t G = hk > 0 && hv % hk == 0 ? (int64_t)(hv / hk) * dv : 0;
  if (hk <= 0 || hk > 65535 || hv <= 0 || hv % hk != 0 || hv / hk > STEP_MAXR || dk <= 0 || dk > 256 || dv <= 0 ||
      (G + GS_CLUSTER - 1) / GS_CLUSTER > STEP_MAXNC || a->kw < 1 || a->kw > STEP_MAXKW) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: gdn_step shape (hk %d, hv %d, dk %d, dv %d, conv %d) not supported", hk,
              hv, dk, dv, a->kw);
    return;
  }
  if (a->n_runs < 0 || a->n_runs > OPS_GDN_STEP_MAX_RUNS || (a->n_runs > 0 && !a->runs)) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: gdn_step with %d runs (at most %d)", a->n_runs, OPS_GDN_STEP_MAX_RUNS);
    return;
  }
  const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd;
  ops_gdn_step_args d = *a;
  d.conv_w = (const float *)cuda_mirror(be, a->conv_w, (size_t)cd * a->kw * sizeof(float));
  d.a_log = (const float *)cuda_mirror(be, a->a_log, (size_t)hv * sizeof(float));
  d.dt_bias = (const float *)cuda_mirror(be, a->dt_bias, (size_t)hv * sizeof(float));
  d.norm_w = (const float *)cuda_mirror(be, a->norm_w, (size_t)dv * sizeof(float));
  if (!d.conv_w || !d.a_log || !d.dt_bias || !d.norm_w) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: gdn_step without its model vectors");
    return;
  }
  d.n_runs = 0; /* the table travels in fz_runs; no host pointer in the kernel's arguments */
  d.runs = NULL;
  /* P lanes per column (R = dk / P state rows each in registers): 16 rows per thread keeps the
   * state in registers and each dot product a short chain; threads = the widest block's columns
   * times P, capped (more columns run in passes). */
  const int64_t nc = (G + GS_CLUSTER - 1) / GS_CLUSTER;
  const int P = dk <= 32 ? 4 : dk <= 128 ? 8 : 16;
  int64_t th = (nc * P + 31) / 32 * 32;
  if (th > STEP_THREADS) th = STEP_THREADS;
  const unsigned threads = (unsigned)th;
  if (a->n_runs == 0) {
    fz_runs<1> one;
    memset(&one, 0, sizeof one);
    for (int64_t t0 = 0; t0 < a->n; t0 += STEP_TOK) {
      const int64_t m = a->n - t0 < STEP_TOK ? a->n - t0 : STEP_TOK;
      d.n = m;
      d.qkv = a->qkv + t0 * cd;
      d.z = a->z + t0 * Vd;
      d.b = a->b + t0 * hv;
      d.a = a->a + t0 * hv;
      d.y = a->y + t0 * Vd;
      step_launch<1>(ci, d, one, 1, threads, t0 == 0);
      if (ci->err) return;
    }
    return;
  }
  /* Batched: launch k takes tokens [k STEP_TOK, (k + 1) STEP_TOK) of every run that has them
   * (one launch for decode runs); the first is programmatic, as a run's first launch above. */
  int64_t nmax = 0;
  for (int i = 0; i < a->n_runs; i++) {
    const ops_gdn_step_run *u = &a->runs[i];
    if (u->n > 0 && (u->start < 0 || !u->conv_state || !u->state)) {
      cuda_fail(ci, ANNA_EINVAL, "cuda: gdn_step run %d without its rows or states", i);
      return;
    }
    if (u->n > nmax) nmax = u->n;
  }
  d.n = 0;
  d.conv_state = d.state = NULL;
  fz_runs<OPS_GDN_STEP_MAX_RUNS> rt;
  for (int64_t t0 = 0; t0 < nmax; t0 += STEP_TOK) {
    memset(&rt, 0, sizeof rt);
    unsigned nz = 0;
    for (int i = 0; i < a->n_runs; i++) {
      const ops_gdn_step_run *u = &a->runs[i];
      if (u->n <= t0) continue;
      ops_gdn_step_run *e = &rt.r[nz++];
      e->start = u->start + t0;
      e->n = u->n - t0 < STEP_TOK ? u->n - t0 : STEP_TOK;
      e->conv_state = u->conv_state;
      e->state = u->state;
    }
    step_launch<OPS_GDN_STEP_MAX_RUNS>(ci, d, rt, nz, threads, t0 == 0);
    if (ci->err) return;
  }
}

/* ---- add_rmsnorm: the shared RMSNorm rows (cuda_elem.cu) with the residual add ---- */

#define AN_THREADS 256 /* norm_rope's most threads per row */

/* One row with a residual, in the int8 numerics, with its pointers as the fused matvec
 * prologue reads them (float4, whole 32-blocks): deferred (cuda_pnorm), else launched now. */
void cuda_op_add_rmsnorm(ops_backend *be, float *x, const float *r, float *y, const float *w, int64_t rows, int d,
                         float eps, int one_plus) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || rows <= 0 || d <= 0) return;
  const float *wd = w ? (const float *)cuda_mirror(be, w, (size_t)d * sizeof(float)) : NULL;
  if (w && !wd) return;
  if (rows == 1 && r && wd && ci->pnorm_count && !ci->exact && !ci->batch_inv && ci->mv_variant == CUDA_MV_DEFAULT &&
      d % 32 == 0 &&
      y != x && y != r && !(((uintptr_t)x | (uintptr_t)r | (uintptr_t)y | (uintptr_t)wd) & 15)) {
    ci->pnorm = cuda_pnorm{x, r, wd, y, d, one_plus, eps};
    return;
  }
  cuda_rmsnorm_rows(ci, x, r, y, wd, rows, d, eps, one_plus);
}

void cuda_norm_flush(cuda_impl *ci) {
  const cuda_pnorm p = ci->pnorm;
  memset(&ci->pnorm, 0, sizeof ci->pnorm);
  if (!ci->err) cuda_rmsnorm_rows(ci, p.x, p.r, p.y, p.w, 1, p.d, p.eps, p.one_plus);
}

/* ---- norm_rope: one block per (token, head) row; the row is staged in shared memory, so
 * in place (y == x) is safe: every read of x precedes the block's first barrier. ---- */

static __global__ void k_norm_rope(float *y, const float *x, int n_heads, int D, int64_t xs, int64_t xhs,
                                   const float *w, float eps, int one_plus, int hr, const float *inv_freq,
                                   const int32_t *pos, int interleaved) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  extern __shared__ float row[]; /* [D] */
  const int64_t r = blockIdx.x, t = r / n_heads;
  const int h = (int)(r % n_heads);
  const float *xr = x + t * xs + (int64_t)h * xhs;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = xr[i];
    row[i] = v;
    ss += v * v;
  }
  ss = cuda_block_sum(ss); /* also the barrier after the staging */
  const float inv = rsqrtf(ss / (float)D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) row[i] = row[i] * inv * (one_plus ? 1.0f + w[i] : w[i]);
  __syncthreads();
  float *yr = y + r * D;
  const float p = (float)pos[t];
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float v = row[i]; /* dims past the rotated ones pass */
    if (i < 2 * hr) { /* element i of pair pi = (ia, ib), rotated as rope does */
      int pi, ia, ib;
      if (interleaved) pi = i >> 1, ia = 2 * pi, ib = ia + 1;
      else pi = i < hr ? i : i - hr, ia = pi, ib = pi + hr;
      float s, c;
      sincosf(p * inv_freq[pi], &s, &c); /* angle rounded to f32 first, as the reference */
      const float a = row[ia], b = row[ib];
      v = i == ia ? a * c - b * s : b * c + a * s;
    }
    yr[i] = v;
  }
}

void cuda_op_norm_rope(ops_backend *be, float *y, const float *x, int64_t n, int n_heads, int head_dim,
                       int64_t x_stride, int64_t x_head_stride, const float *w, float eps, int one_plus, int rot,
                       const float *inv_freq, const int32_t *pos, int interleaved) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0 || n_heads <= 0 || head_dim <= 0) return;
  const int hr = rot > 0 ? rot / 2 : 0;
  if (2 * hr > head_dim || head_dim > 12288) { /* the row must fit 48 KiB of shared memory */
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: norm_rope of head_dim %d, rot %d not supported", head_dim, rot);
    return;
  }
  const int64_t rows = n * n_heads;
  if (rows > 0x7fffffff) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: norm_rope of %lld rows", (long long)rows);
    return;
  }
  const float *wd = (const float *)cuda_mirror(be, w, (size_t)head_dim * sizeof(float));
  const float *fd = hr ? (const float *)cuda_mirror(be, inv_freq, (size_t)hr * sizeof(float)) : NULL;
  if (!wd || (hr && !fd)) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: norm_rope without its weight or frequencies");
    return;
  }
  int th = (head_dim + 31) / 32 * 32;
  if (th > AN_THREADS) th = AN_THREADS;
  cuda_launch_pdl(ci, "norm_rope", k_norm_rope, (unsigned)rows, th, (size_t)head_dim * sizeof(float), y, x, n_heads,
              head_dim, x_stride, x_head_stride, wd, eps, one_plus, hr, fd, pos, interleaved);
}
