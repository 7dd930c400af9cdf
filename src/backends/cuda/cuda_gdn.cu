/* cuda_gdn.cu: Gated DeltaNet pieces: the causal depthwise conv + SiLU, the gates, and the
 * gated delta rule.
 *
 * The delta rule keeps the state on chip within a call: one warp owns 32 columns of a
 * v-head's state S [dk, dv], each lane one column held in registers, so every product of
 * the step (k^T S, the rank-1 update, q^T S) is lane-local with no reductions; q and k of
 * the token are staged in shared memory. The chunked entry (prefill) runs the chunk-64
 * form of cuda_gdn_chunked.cu. */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_math.cuh"

#include "base/error.h"

#define CONV_MAXKW 8

/* The causal depthwise conv + SiLU, one thread per output (token t, channel c): its window is
 * the kw - 1 inputs before t (from the carried state where they precede this call) and x_t.
 * Every output is independent, so prefill runs n * ch threads (a thread per channel walking
 * the tokens in order took ~1 ms per 2048-token call at the 9B shape, 64 blocks on 132 SMs,
 * one dependent load per token). The state is read here and replaced by k_conv_state after
 * (a separate launch: threads of this one still read the old state). Same products in the
 * same order as the CPU's sequential loop. */
static __global__ void k_conv1d_silu(float *y, const float *x, int64_t n, int ch, const float *w, int kw,
                                     const float *state) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const int ns = kw - 1;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * ch; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = i / ch;
    const int c = (int)(i - t * ch);
    float s = 0.0f;
    for (int j = 0; j < ns; j++) {
      const int64_t u = t - ns + j; /* input position; < 0: state slot ns + u */
      const float v = u >= 0 ? x[u * ch + c] : state[(int64_t)c * ns + ns + u];
      s += w[(int64_t)c * kw + j] * v;
    }
    s += w[(int64_t)c * kw + ns] * x[i];
    y[i] = s / (1.0f + expf(-s));
  }
}

/* state <- the last kw - 1 inputs of (state, x), one thread per channel (it reads its old
 * slots before writing any: with n < kw - 1 some stay, shifted). */
static __global__ void k_conv_state(float *state, const float *x, int64_t n, int ch, int kw) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl, after k_conv1d_silu read the old state */
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int ns = kw - 1;
  if (c >= ch || ns <= 0) return;
  float win[CONV_MAXKW];
  for (int j = 0; j < ns; j++) {
    const int64_t u = n - ns + j;
    win[j] = u >= 0 ? x[u * ch + c] : state[(int64_t)c * ns + ns + u];
  }
  for (int j = 0; j < ns; j++) state[(int64_t)c * ns + j] = win[j];
}

void cuda_op_conv1d_silu(ops_backend *be, float *y, const float *x, int64_t n, int ch, const float *w, int kw,
                         float *state) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0 || ch <= 0) return;
  if (kw < 1 || kw > CONV_MAXKW) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: conv width %d not supported (1..%d)", kw, CONV_MAXKW);
    return;
  }
  const float *wd = (const float *)cuda_mirror(be, w, (size_t)ch * kw * sizeof(float));
  if (!wd) return;
  const int64_t blocks = (n * ch + 255) / 256;
  cuda_launch_pdl(ci, "conv1d_silu", k_conv1d_silu, (unsigned)(blocks > 65536 ? 65536 : blocks), 256, 0, y, x, n, ch,
                  wd, kw, (const float *)state);
  if (kw > 1) cuda_launch_pdl(ci, "conv state", k_conv_state, cuda_blocks(ch, 128), 128, 0, state, x, n, ch, kw);
}

static __global__ void k_gdn_gates(float *beta, float *g, const float *b, int64_t bs, const float *a, int64_t as,
                                   const float *a_log, const float *dt_bias, int64_t n, int h) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * h; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = i / h;
    const int j = (int)(i % h);
    beta[i] = 1.0f / (1.0f + expf(-b[t * bs + j]));
    const float z = a[t * as + j] + dt_bias[j];
    const float sp = z > 20.0f ? z : log1pf(expf(z));
    g[i] = -expf(a_log[j]) * sp;
  }
}

void cuda_op_gdn_gates(ops_backend *be, float *beta, float *g, const float *b, int64_t b_stride, const float *a,
                       int64_t a_stride, const float *a_log, const float *dt_bias, int64_t n, int h) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0 || h <= 0) return;
  const float *al = (const float *)cuda_mirror(be, a_log, (size_t)h * sizeof(float));
  const float *db = (const float *)cuda_mirror(be, dt_bias, (size_t)h * sizeof(float));
  if (!al || !db) return;
  int64_t blocks = (n * h + 255) / 256;
  cuda_launch_pdl(ci, "gdn_gates", k_gdn_gates,
              (unsigned)(blocks > 65536 ? 65536 : blocks), 256, 0, beta, g, b, b_stride, a, a_stride, al, db, n, h);
}

/* grid (hv, ceil(dv / 32)), one warp per block. */
template <int MAXDK>
static __global__ void k_gdn_recurrent(ops_gdn_args a) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  __shared__ float qs[MAXDK], ks[MAXDK];
  const int h = blockIdx.x, lane = threadIdx.x;
  const int j = blockIdx.y * 32 + lane;
  const int dk = a.dk, dv = a.dv;
  const int kh = a.v_tiled ? h % a.hk : h / (a.hv / a.hk);
  const bool live = j < dv;
  float S[MAXDK];
  float *Sg = a.state + (int64_t)h * dk * dv;
#pragma unroll
  for (int i = 0; i < MAXDK; i++) S[i] = live && i < dk ? Sg[(int64_t)i * dv + j] : 0.0f;
  for (int64_t t = 0; t < a.n; t++) {
    const float *q = a.q + (t * a.hk + kh) * dk, *k = a.k + (t * a.hk + kh) * dk;
    for (int i = lane; i < dk; i += 32) {
      qs[i] = q[i];
      ks[i] = k[i];
    }
    __syncwarp();
    const float decay = expf(a.g[t * a.hv + h]), beta = a.beta[t * a.hv + h];
    const float vj = live ? a.v[(t * a.hv + h) * dv + j] : 0.0f;
    float u = 0.0f;
#pragma unroll
    for (int i = 0; i < MAXDK; i++)
      if (i < dk) {
        S[i] *= decay;
        u += ks[i] * S[i];
      }
    u = beta * (vj - u);
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < MAXDK; i++)
      if (i < dk) {
        S[i] += ks[i] * u;
        o += qs[i] * S[i];
      }
    if (live) a.out[(t * a.hv + h) * dv + j] = o;
    __syncwarp(); /* qs/ks are overwritten by the next token */
  }
  if (live)
#pragma unroll
    for (int i = 0; i < MAXDK; i++)
      if (i < dk) Sg[(int64_t)i * dv + j] = S[i];
}

void cuda_op_gdn_recurrent(ops_backend *be, const ops_gdn_args *a) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || a->n <= 0) return;
  if (a->dk <= 0 || a->dk > 256 || a->dv <= 0 || a->hk <= 0 || a->hv <= 0 || a->hv % a->hk != 0) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: GDN shape (hk %d, hv %d, dk %d, dv %d) not supported", a->hk, a->hv,
              a->dk, a->dv);
    return;
  }
  dim3 grid((unsigned)a->hv, (unsigned)((a->dv + 31) / 32));
  if (a->dk <= 32) cuda_launch_pdl(ci, "gdn recurrent", k_gdn_recurrent<32>, grid, 32, 0, *a);
  else if (a->dk <= 64) cuda_launch_pdl(ci, "gdn recurrent", k_gdn_recurrent<64>, grid, 32, 0, *a);
  else if (a->dk <= 128) cuda_launch_pdl(ci, "gdn recurrent", k_gdn_recurrent<128>, grid, 32, 0, *a);
  else cuda_launch_pdl(ci, "gdn_recurrent", k_gdn_recurrent<256>, grid, 32, 0, *a);
}

/* Chunk-64 form (cuda_gdn_chunked.cu) for prefill runs; short runs, captured steps and
 * shapes it does not cover take the token-sequential kernel. */
void cuda_op_gdn_chunked(ops_backend *be, const ops_gdn_args *a) {
  if (!cuda_gdn_chunked_launch(be, a)) cuda_op_gdn_recurrent(be, a);
}
