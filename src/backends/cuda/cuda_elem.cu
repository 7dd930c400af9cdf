/* cuda_elem.cu: norms, rope and the elementwise ops. Row ops use one block per row with
 * a shuffle reduction; elementwise ops one thread per element (grid-stride). */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_math.cuh"

#include "base/error.h"
#include "ops/ops.h"

#define ROW_THREADS 256

/* Rows go on grid.x up to 2^31-1; more rows than that are split into launches. */
#define FOR_ROW_CHUNKS(rows, r0, cnt)                                                                                 \
  for (int64_t r0 = 0, cnt = 0; r0 < (rows); r0 += cnt)                                                              \
    if ((cnt = ((rows)-r0 < 0x7fffffff ? (rows)-r0 : 0x7fffffff)), 1)

static int row_threads(int d) {
  int t = ((d + 31) / 32) * 32;
  return t < ROW_THREADS ? (t < 32 ? 32 : t) : ROW_THREADS;
}

/* Rows of any width: one block per row, a strided loop (with ADD, x += r is stored first and
 * read back by the same thread). */
template <bool ADD>
static __global__ void k_rmsnorm(float *x, const float *r, float *y, const float *w, int d, float eps, int one_plus) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const int64_t row = blockIdx.x;
  float *xr = x + row * d;
  float *yr = y + row * d;
  float ss = 0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float v = xr[i];
    if (ADD) {
      v += r[row * d + i];
      xr[i] = v;
    }
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

/* The decode-sized form: one block per row, each thread holding up to RN4_V float4 of the row
 * in registers, every load of the row issued before the first use (the strided loop above
 * waits on memory once per iteration: ~5-15 us for a 4096-wide row on the H200, the price
 * of 16 dependent round trips). With ADD, x += r is stored and normalised (add_rmsnorm). */
#define RN4_V CUDA_RN4_V
template <bool ADD>
static __global__ void __launch_bounds__(1024)
    k_rmsnorm4(float *x, const float *r, float *y, const float *w,
               int d4, float eps, int one_plus) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const int64_t row = blockIdx.x;
  float4 *xr = (float4 *)x + row * d4;
  const float4 *rr = (const float4 *)r + row * d4;
  float4 *yr = (float4 *)y + row * d4;
  float4 v[RN4_V], a[RN4_V];
#pragma unroll
  for (int j = 0; j < RN4_V; j++) {
    const int i = threadIdx.x + j * blockDim.x;
    v[j] = i < d4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    if (ADD) a[j] = i < d4 ? rr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < RN4_V; j++) {
    const int i = threadIdx.x + j * blockDim.x;
    if (ADD) {
      v[j].x += a[j].x, v[j].y += a[j].y, v[j].z += a[j].z, v[j].w += a[j].w;
      if (i < d4) xr[i] = v[j];
    }
    ss = cuda_rn4_ss(ss, v[j]);
  }
  ss = cuda_block_sum(ss);
  const float inv = rsqrtf(ss / (float)(4 * d4) + eps);
#pragma unroll
  for (int j = 0; j < RN4_V; j++) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i >= d4) continue;
    float4 o = make_float4(v[j].x * inv, v[j].y * inv, v[j].z * inv, v[j].w * inv);
    if (w) {
      float4 g = ((const float4 *)w)[i];
      if (one_plus) g.x += 1.0f, g.y += 1.0f, g.z += 1.0f, g.w += 1.0f;
      o.x *= g.x, o.y *= g.y, o.z *= g.z, o.w *= g.w;
    }
    yr[i] = o;
  }
}

void cuda_rmsnorm_rows(cuda_impl *ci, float *x, const float *r, float *y, const float *w, int64_t rows, int d, float eps,
                       int one_plus) {
  const int d4 = d / 4;
  if (d % 4 == 0 && d4 <= RN4_V * 1024 && rows <= 0x7fffffff &&
      !(((uintptr_t)x | (uintptr_t)y | (uintptr_t)r | (uintptr_t)w) & 15)) {
    const int th = cuda_rn4_threads(d4);
    if (r) cuda_launch_pdl(ci, "add_rmsnorm", k_rmsnorm4<true>, (unsigned)rows, th, 0, x, r, y, w, d4, eps, one_plus);
    else cuda_launch_pdl(ci, "rmsnorm", k_rmsnorm4<false>, (unsigned)rows, th, 0, x, r, y, w, d4, eps, one_plus);
    return;
  }
  const int th = row_threads(d);
  FOR_ROW_CHUNKS(rows, r0, cnt) {
    if (r)
      cuda_launch_pdl(ci, "add_rmsnorm", k_rmsnorm<true>, (unsigned)cnt, th, 0, x + r0 * d, r + r0 * d, y + r0 * d, w,
                      d, eps, one_plus);
    else
      cuda_launch_pdl(ci, "rmsnorm", k_rmsnorm<false>, (unsigned)cnt, th, 0, x + r0 * d, r, y + r0 * d, w, d, eps,
                      one_plus);
  }
}

static __global__ void k_l2norm(float *x, int d, float eps, float scale) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  float *xr = x + (int64_t)blockIdx.x * d;
  float ss = 0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  ss = cuda_block_sum(ss);
  const float inv = scale / sqrtf(ss + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) xr[i] *= inv;
}

static __global__ void k_rmsnorm_gated(float *y, const float *x, const float *z, const float *w, int d, float eps) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const int64_t r = blockIdx.x;
  const float *xr = x + r * d, *zr = z + r * d;
  float *yr = y + r * d;
  float ss = 0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  ss = cuda_block_sum(ss);
  const float inv = rsqrtf(ss / (float)d + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv) * cuda_silu(zr[i]);
}


void cuda_op_rmsnorm(ops_backend *be, float *y, const float *x, const float *w, int64_t rows, int d, float eps,
                     int one_plus) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || rows <= 0 || d <= 0) return;
  const float *wd = w ? (const float *)cuda_mirror(be, w, (size_t)d * sizeof(float)) : NULL;
  if (w && !wd) return;
  /* In place (y == x) is fine: each element is read before it is written, by its thread. */
  cuda_rmsnorm_rows(ci, (float *)x, NULL, y, wd, rows, d, eps, one_plus);
}

/* Narrow rows (the GDN heads: d = 64..512, n * heads rows in prefill): one warp per row, a
 * float4 per lane per step, 8 rows per block. A block per 128-wide row spent most of its time
 * in the block reduction's barriers (~1.5 ms per 9B-shape GDN layer at 8192 tokens for these
 * two norms with the l2norms). */
#define WROW_WARPS 8
#define WROW_MAX4 4 /* float4 per lane: d <= 512 */

/* A warp's row xr of d4 float4 into v (zeros past d4); returns the row's sum of squares. */
static __device__ __forceinline__ float wrow_load(const float4 *xr, int d4, int lane, float4 *v) {
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < WROW_MAX4; j++) {
    const int i = lane + 32 * j;
    v[j] = i < d4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  return cuda_warp_sum(ss);
}

static __global__ void k_l2norm_w(float *x, int64_t rows, int d4, float eps, float scale) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const int lane = threadIdx.x & 31;
  const int64_t r = (int64_t)blockIdx.x * WROW_WARPS + (threadIdx.x >> 5);
  if (r >= rows) return;
  float4 *xr = (float4 *)x + r * d4;
  float4 v[WROW_MAX4];
  const float ss = wrow_load(xr, d4, lane, v);
  const float inv = scale / sqrtf(ss + eps);
#pragma unroll
  for (int j = 0; j < WROW_MAX4; j++) {
    const int i = lane + 32 * j;
    if (i < d4) xr[i] = make_float4(v[j].x * inv, v[j].y * inv, v[j].z * inv, v[j].w * inv);
  }
}

static __global__ void k_rmsnorm_gated_w(float *y, const float *x, const float *z, const float *w, int64_t rows, int d4,
                                         float eps) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const int lane = threadIdx.x & 31;
  const int64_t r = (int64_t)blockIdx.x * WROW_WARPS + (threadIdx.x >> 5);
  if (r >= rows) return;
  const float4 *xr = (const float4 *)x + r * d4, *zr = (const float4 *)z + r * d4, *wr = (const float4 *)w;
  float4 v[WROW_MAX4];
  const float ss = wrow_load(xr, d4, lane, v);
  const float inv = rsqrtf(ss / (float)(4 * d4) + eps);
  float4 *yr = (float4 *)y + r * d4;
#pragma unroll
  for (int j = 0; j < WROW_MAX4; j++) {
    const int i = lane + 32 * j;
    if (i >= d4) continue;
    const float4 g = zr[i], a = wr[i];
    yr[i] = make_float4(a.x * (v[j].x * inv) * cuda_silu(g.x), a.y * (v[j].y * inv) * cuda_silu(g.y),
                        a.z * (v[j].z * inv) * cuda_silu(g.z), a.w * (v[j].w * inv) * cuda_silu(g.w));
  }
}

static bool wrow_ok(int d, const void *a, const void *b, const void *c, const void *e) {
  return d % 4 == 0 && d / 4 <= 32 * WROW_MAX4 && d <= 512 &&
         !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)e) & 15);
}

void cuda_op_l2norm(ops_backend *be, float *x, int64_t rows, int d, float eps, float scale) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || rows <= 0 || d <= 0) return;
  if (wrow_ok(d, x, NULL, NULL, NULL) && rows < ((int64_t)1 << 34)) {
    cuda_launch_pdl(ci, "l2norm", k_l2norm_w, (unsigned)((rows + WROW_WARPS - 1) / WROW_WARPS), 32 * WROW_WARPS, 0, x,
                    rows, d / 4, eps, scale);
    return;
  }
  FOR_ROW_CHUNKS(rows, r0, cnt)
  cuda_launch_pdl(ci, "l2norm", k_l2norm, (unsigned)cnt, row_threads(d), 0, x + r0 * d, d, eps, scale);
}

void cuda_op_rmsnorm_gated(ops_backend *be, float *y, const float *x, const float *z, const float *w, int64_t rows,
                           int d, float eps) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || rows <= 0 || d <= 0) return;
  const float *wd = (const float *)cuda_mirror(be, w, (size_t)d * sizeof(float));
  if (!wd) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: rmsnorm_gated without a weight");
    return;
  }
  if (wrow_ok(d, y, x, z, wd) && rows < ((int64_t)1 << 34)) {
    cuda_launch_pdl(ci, "rmsnorm_gated", k_rmsnorm_gated_w, (unsigned)((rows + WROW_WARPS - 1) / WROW_WARPS),
                    32 * WROW_WARPS, 0, y, x, z, wd, rows, d / 4, eps);
    return;
  }
  FOR_ROW_CHUNKS(rows, r0, cnt)
  cuda_launch_pdl(ci, "rmsnorm_gated", k_rmsnorm_gated, (unsigned)cnt, row_threads(d), 0, y + r0 * d, x + r0 * d,
              z + r0 * d, wd, d, eps);
}

/* ---- elementwise ---- */

#define GRID_STRIDE(i, n) for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); \
                               i += (int64_t)gridDim.x * blockDim.x)

static unsigned ew_blocks(int64_t n) {
  int64_t b = (n + 255) / 256;
  return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

static __global__ void k_act_mul(float *y, const float *gate, const float *up, int64_t n, int d, int64_t gs,
                                 int64_t us, int act) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  GRID_STRIDE(i, n * d) {
    const int64_t t = i / d, j = i % d;
    const float g = gate[t * gs + j], u = up[t * us + j];
    y[i] = (act == ACT_KIND_GELU_TANH ? cuda_gelu_tanh(g) : cuda_silu(g)) * u;
  }
}

void cuda_op_act_mul(ops_backend *be, float *y, const float *gate, const float *up, int64_t n, int d,
                     int64_t gate_stride, int64_t up_stride, int act) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0 || d <= 0) return;
  cuda_launch_pdl(ci, "act_mul", k_act_mul, ew_blocks(n * d), 256, 0, y, gate, up, n, d, gate_stride, up_stride, act);
}

static __global__ void k_add(float *y, const float *x, int64_t n) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  GRID_STRIDE(i, n) y[i] += x[i];
}

void cuda_op_add(ops_backend *be, float *y, const float *x, int64_t n) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  cuda_launch_pdl(ci, "add", k_add, ew_blocks(n), 256, 0, y, x, n);
}

static __global__ void k_scale(float *y, float s, int64_t n) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  GRID_STRIDE(i, n) y[i] *= s;
}

void cuda_op_scale(ops_backend *be, float *y, float s, int64_t n) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  cuda_launch_pdl(ci, "scale", k_scale, ew_blocks(n), 256, 0, y, s, n);
}

static __global__ void k_mul_sigmoid(float *y, const float *g, int64_t rows, int d, int64_t gs, int bcast) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  GRID_STRIDE(i, rows * d) {
    const int64_t r = i / d, j = i % d;
    y[i] *= cuda_sigmoid(g[r * gs + (bcast ? 0 : j)]);
  }
}

void cuda_op_mul_sigmoid(ops_backend *be, float *y, const float *g, int64_t rows, int d, int64_t g_stride,
                         int g_bcast) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || rows <= 0 || d <= 0) return;
  cuda_launch_pdl(ci, "mul_sigmoid", k_mul_sigmoid, ew_blocks(rows * d), 256, 0, y, g, rows, d, g_stride, g_bcast);
}

static __global__ void k_copy_rows(float *dst, int64_t ds, const float *src, int64_t ss, int64_t rows, int d) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  GRID_STRIDE(i, rows * d) {
    const int64_t r = i / d, j = i % d;
    dst[r * ds + j] = src[r * ss + j];
  }
}

void cuda_op_copy_rows(ops_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                       int64_t rows, int d) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || rows <= 0 || d <= 0) return;
  cuda_launch_pdl(ci, "copy_rows", k_copy_rows, ew_blocks(rows * d), 256, 0, dst, dst_stride, src, src_stride, rows, d);
}

static __global__ void k_scatter_rows(float *const *dst, const float *src, int64_t rows, int d) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  GRID_STRIDE(i, rows * d) {
    const int64_t r = i / d, j = i % d;
    dst[r][j] = src[i];
  }
}

void cuda_op_scatter_rows(ops_backend *be, float *const *dst, const float *src, int64_t rows, int d) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || rows <= 0 || d <= 0) return;
  float *const *dd = (float *const *)cuda_ring_put(be, dst, (size_t)rows * sizeof(float *));
  if (!dd) return;
  cuda_launch_pdl(ci, "scatter_rows", k_scatter_rows, ew_blocks(rows * d), 256, 0, dd, src, rows, d);
}

static __global__ void k_softcap(float *y, int64_t n, float cap) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  GRID_STRIDE(i, n) y[i] = cap * tanhf(y[i] / cap);
}

void cuda_op_softcap(ops_backend *be, float *y, int64_t n, float cap) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  cuda_launch_pdl(ci, "softcap", k_softcap, ew_blocks(n), 256, 0, y, n, cap);
}

/* ---- rope: one thread per (token, head, pair) ---- */

static __global__ void k_rope(float *x, int64_t n, int n_heads, int head_dim, int64_t stride, int hr,
                              const float *inv_freq, const int32_t *pos, int interleaved) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  GRID_STRIDE(it, n * n_heads * hr) {
    const int i = (int)(it % hr);
    const int64_t th = it / hr;
    const int h = (int)(th % n_heads);
    const int64_t t = th / n_heads;
    /* Angle rounded to f32 first, as the reference computes it. */
    const float ang = (float)pos[t] * inv_freq[i];
    float s, c;
    sincosf(ang, &s, &c);
    const int step = interleaved ? 2 : 1, off = interleaved ? 1 : hr;
    float *v = x + t * stride + (int64_t)h * head_dim;
    const float a = v[i * step], b = v[i * step + off];
    v[i * step] = a * c - b * s;
    v[i * step + off] = b * c + a * s;
  }
}

void cuda_op_rope(ops_backend *be, float *x, int64_t n, int n_heads, int head_dim, int64_t stride, int rot,
                  const float *inv_freq, const int32_t *pos, int interleaved) {
  cuda_impl *ci = cuda_impl_of(be);
  const int hr = rot / 2;
  if (ci->err || n <= 0 || n_heads <= 0 || hr <= 0) return;
  const float *fd = (const float *)cuda_mirror(be, inv_freq, (size_t)hr * sizeof(float));
  if (!fd) return;
  cuda_launch_pdl(ci, "rope", k_rope, ew_blocks(n * n_heads * hr), 256, 0, x, n, n_heads, head_dim, stride, hr, fd, pos,
              interleaved);
}
