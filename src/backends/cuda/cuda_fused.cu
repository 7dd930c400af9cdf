/* cuda_fused.cu: fused decode ops (ops.h: gdn_step, add_rmsnorm, norm_rope). A decode step of a small
 * model is bound by the number of kernels, not by the work in them (bench/notes/gpu.md:
 * ~3 us per kernel even replayed as a graph), so these do in one kernel what the model
 * would otherwise run as a chain of small ones. Both compute the same math as the unfused
 * ops, in f32 in either numerics mode (they do no matrix products).
 *
 * gdn_step: one block per k-head group (k-head kh and the hv/hk v-heads that read it), so
 * every conv channel and every v-head's state has exactly one owner and the block needs no
 * cross-block synchronisation:
 *   1. conv + SiLU of the group's q and k channels for all n tokens (state updated), into
 *      shared memory; l2norm of each q/k row by one warp;
 *   2. per v-head of the group, in turn: its gates and the conv of its v channels, the delta
 *      rule over the n tokens with the state [dk, dv] in registers (P adjacent lanes share a
 *      column, each holding every P-th row; dot products are reduced over the P lanes by
 *      shuffles), then the gated RMSNorm of each token's output row by one warp.
 * Tokens beyond STEP_TOK are handled by further launches (state carries over in memory). */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_math.cuh"

#include "base/error.h"

#define STEP_TOK 8       /* tokens per launch */
#define STEP_MAXKW 8     /* conv width */
#define STEP_MAXDV 256   /* v-head width (shared rows) */
#define STEP_THREADS 512 /* most threads per block: dv * P */

/* Sum over groups of P adjacent lanes (P a power of two <= 32); all 32 lanes must call. */
template <int P>
static __device__ __forceinline__ float fz_group_sum(float v) {
#pragma unroll
  for (int o = P / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}


/* Causal depthwise conv + SiLU of channel c over n tokens (x row stride xs), as
 * k_conv1d_silu: out[t * os] for t < n; state [ch, kw-1] row c updated. */
static __device__ void fz_conv_channel(const float *x, int64_t xs, int n, int64_t c, const float *w, int kw,
                                       float *state, float *out, int os) {
  const int ns = kw - 1;
  float win[STEP_MAXKW], wc[STEP_MAXKW];
  for (int j = 0; j < kw; j++) wc[j] = w[c * kw + j];
  for (int j = 0; j < ns; j++) win[j] = state[c * ns + j];
  for (int t = 0; t < n; t++) {
    const float xt = x[(int64_t)t * xs + c];
    float s = 0.0f;
    for (int j = 0; j < ns; j++) s += wc[j] * win[j];
    s += wc[ns] * xt;
    out[t * os] = cuda_silu(s);
    for (int j = 0; j + 1 < ns; j++) win[j] = win[j + 1];
    if (ns > 0) win[ns - 1] = xt;
  }
  for (int j = 0; j < ns; j++) state[c * ns + j] = win[j];
}

/* grid hk, block dv * P rounded up to a warp (<= STEP_THREADS); a.n <= STEP_TOK; the
 * model vectors in a are device pointers. */
template <int MAXDK, int P>
static __global__ void __launch_bounds__(STEP_THREADS) k_gdn_step(ops_gdn_step_args a) {
  __shared__ float qs[STEP_TOK][MAXDK], ks[STEP_TOK][MAXDK];
  __shared__ float vs[STEP_TOK][STEP_MAXDV], os[STEP_TOK][STEP_MAXDV];
  __shared__ float sdecay[STEP_TOK], sbeta[STEP_TOK];
  const int kh = blockIdx.x, tid = threadIdx.x, nth = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nwarp = nth >> 5;
  const int n = (int)a.n, dk = a.dk, dv = a.dv, hk = a.hk, hv = a.hv, r = hv / hk;
  const int64_t Kd = (int64_t)hk * dk, Vd = (int64_t)hv * dv, cd = 2 * Kd + Vd;

  /* 1. q and k of this k-head: conv + SiLU, then l2norm (q also scaled by 1/sqrt(dk)). */
  for (int c = tid; c < 2 * dk; c += nth) {
    const int isk = c >= dk, i = c - isk * dk;
    fz_conv_channel(a.qkv, cd, n, isk * Kd + (int64_t)kh * dk + i, a.conv_w, a.kw, a.conv_state,
                    isk ? &ks[0][i] : &qs[0][i], MAXDK);
  }
  __syncthreads();
  for (int p = warp; p < 2 * n; p += nwarp) { /* row p: token p / 2, q (even) or k (odd) */
    float *row = (p & 1) ? ks[p >> 1] : qs[p >> 1];
    float ss = 0.0f;
    for (int i = lane; i < dk; i += 32) ss += row[i] * row[i];
    ss = cuda_warp_sum(ss);
    const float inv = ((p & 1) ? 1.0f : 1.0f / sqrtf((float)dk)) / sqrtf(ss + 1e-6f);
    for (int i = lane; i < dk; i += 32) row[i] *= inv;
  }
  __syncthreads();

  /* 2. each v-head that reads this k-head. */
  const int j = tid / P, part = tid % P; /* this thread's state column and row phase */
  const bool live = j < dv;
  for (int e = 0; e < r; e++) {
    const int h = a.v_tiled ? kh + e * hk : kh * r + e;
    if (tid < n) { /* gates, as gdn_gates; the delta rule uses exp(g) */
      const int t = tid;
      const float zb = a.a[(int64_t)t * hv + h] + a.dt_bias[h];
      const float sp = zb > 20.0f ? zb : log1pf(expf(zb));
      sdecay[t] = expf(-expf(a.a_log[h]) * sp);
      sbeta[t] = 1.0f / (1.0f + expf(-a.b[(int64_t)t * hv + h]));
    }
    for (int c = tid; c < dv; c += nth)
      fz_conv_channel(a.qkv, cd, n, 2 * Kd + (int64_t)h * dv + c, a.conv_w, a.kw, a.conv_state, &vs[0][c],
                      STEP_MAXDV);
    __syncthreads();

    constexpr int R = MAXDK / P; /* state rows per thread: part, part + P, ... */
    float S[R];
    float *Sg = a.state + (int64_t)h * dk * dv;
#pragma unroll
    for (int m = 0; m < R; m++) {
      const int i = part + P * m;
      S[m] = live && i < dk ? Sg[(int64_t)i * dv + j] : 0.0f;
    }
    for (int t = 0; t < n; t++) {
      const float decay = sdecay[t], beta = sbeta[t];
      float u = 0.0f;
#pragma unroll
      for (int m = 0; m < R; m++) {
        const int i = part + P * m;
        if (i < dk) {
          S[m] *= decay;
          u += ks[t][i] * S[m];
        }
      }
      u = fz_group_sum<P>(u);
      u = beta * ((live ? vs[t][j] : 0.0f) - u);
      float o = 0.0f;
#pragma unroll
      for (int m = 0; m < R; m++) {
        const int i = part + P * m;
        if (i < dk) {
          S[m] += ks[t][i] * u;
          o += qs[t][i] * S[m];
        }
      }
      o = fz_group_sum<P>(o);
      if (live && part == 0) os[t][j] = o;
    }
    if (live)
#pragma unroll
      for (int m = 0; m < R; m++) {
        const int i = part + P * m;
        if (i < dk) Sg[(int64_t)i * dv + j] = S[m];
      }
    __syncthreads();

    /* Gated RMSNorm of each token's output row, as rmsnorm_gated. */
    for (int t = warp; t < n; t += nwarp) {
      float ss = 0.0f;
      for (int c = lane; c < dv; c += 32) ss += os[t][c] * os[t][c];
      ss = cuda_warp_sum(ss);
      const float inv = rsqrtf(ss / (float)dv + a.eps);
      const float *zr = a.z + (int64_t)t * Vd + (int64_t)h * dv;
      float *yr = a.y + (int64_t)t * Vd + (int64_t)h * dv;
      for (int c = lane; c < dv; c += 32) yr[c] = a.norm_w[c] * (os[t][c] * inv) * cuda_silu(zr[c]);
    }
    __syncthreads(); /* vs, os and the gates are rewritten for the next v-head */
  }
}

template <int MAXDK>
static void launch_step(cuda_impl *ci, int P, unsigned grid, unsigned threads, const ops_gdn_step_args &a) {
  switch (P) {
  case 8: cuda_launch(ci, "gdn step", k_gdn_step<MAXDK, 8>, grid, threads, 0, a); break;
  case 4: cuda_launch(ci, "gdn step", k_gdn_step<MAXDK, 4>, grid, threads, 0, a); break;
  default: cuda_launch(ci, "gdn step", k_gdn_step<MAXDK, 2>, grid, threads, 0, a); break;
  }
}

void cuda_op_gdn_step(ops_backend *be, const ops_gdn_step_args *a) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || a->n <= 0) return;
  const int hk = a->hk, hv = a->hv, dk = a->dk, dv = a->dv;
  if (hk <= 0 || hv <= 0 || hv % hk != 0 || dk <= 0 || dk > 256 || dv <= 0 || dv > STEP_MAXDV || a->kw < 1 ||
      a->kw > STEP_MAXKW) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: gdn_step shape (hk %d, hv %d, dk %d, dv %d, conv %d) not supported", hk,
              hv, dk, dv, a->kw);
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
  /* P lanes per state column: as many as fit in STEP_THREADS (more lanes, fewer registers). */
  const int P = dv * 8 <= STEP_THREADS ? 8 : dv * 4 <= STEP_THREADS ? 4 : 2;
  const unsigned threads = (unsigned)((dv * P + 31) / 32 * 32);
  for (int64_t t0 = 0; t0 < a->n; t0 += STEP_TOK) {
    const int64_t m = a->n - t0 < STEP_TOK ? a->n - t0 : STEP_TOK;
    d.n = m;
    d.qkv = a->qkv + t0 * cd;
    d.z = a->z + t0 * Vd;
    d.b = a->b + t0 * hv;
    d.a = a->a + t0 * hv;
    d.y = a->y + t0 * Vd;
    if (dk <= 32) launch_step<32>(ci, P, (unsigned)hk, threads, d);
    else if (dk <= 64) launch_step<64>(ci, P, (unsigned)hk, threads, d);
    else if (dk <= 128) launch_step<128>(ci, P, (unsigned)hk, threads, d);
    else launch_step<256>(ci, P, (unsigned)hk, threads, d);
    if (!cuda_check_launch(ci, "gdn_step")) return;
  }
}

/* ---- add_rmsnorm: one block per row ---- */

#define AN_THREADS 256

static __global__ void k_add_rmsnorm(float *x, const float *r, float *y, const float *w, int d, float eps,
                                     int one_plus) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const int64_t row = blockIdx.x;
  float *xr = x + row * d;
  const float *rr = r + row * d;
  float *yr = y + row * d;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = xr[i] + rr[i];
    xr[i] = v; /* read back below by this same thread */
    ss += v * v;
  }
  ss = cuda_block_sum(ss);
  const float inv = rsqrtf(ss / (float)d + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float v = xr[i] * inv;
    if (w) v *= one_plus ? 1.0f + w[i] : w[i];
    yr[i] = v;
  }
}

void cuda_op_add_rmsnorm(ops_backend *be, float *x, const float *r, float *y, const float *w, int64_t rows, int d,
                         float eps, int one_plus) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || rows <= 0 || d <= 0) return;
  const float *wd = w ? (const float *)cuda_mirror(be, w, (size_t)d * sizeof(float)) : NULL;
  if (w && !wd) return;
  if (cuda_rmsnorm_rows(ci, x, r, y, wd, rows, d, eps, one_plus)) return; /* the register-resident form */
  int th = (d + 31) / 32 * 32;
  if (th > AN_THREADS) th = AN_THREADS;
  for (int64_t r0 = 0; r0 < rows; r0 += 0x7fffffff) { /* grid.x limit */
    const int64_t cnt = rows - r0 < 0x7fffffff ? rows - r0 : 0x7fffffff;
    cuda_launch_pdl(ci, "add_rmsnorm", k_add_rmsnorm, (unsigned)cnt, th, 0, x + r0 * d, r + r0 * d, y + r0 * d, wd, d,
                    eps, one_plus);
    if (ci->err) return;
  }
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
