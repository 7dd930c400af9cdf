/* cuda_attention.cu: causal / sliding-window attention with softcap and GQA over per-token
 * K/V cache bases. One block per (token, head); keys are taken 32 at a time (a warp per
 * key for the score, lanes across head_dim) with an online softmax; each thread owns up to
 * ATT_MAXC value dimensions. Split-K over long contexts is future work. */
#include "backends/cuda/cuda_internal.h"

#include "base/error.h"

#define ATT_THREADS 128
#define ATT_MAXC 4 /* v_dim <= ATT_THREADS * ATT_MAXC */
#define ATT_TILE 32

static __global__ void k_attention(float *out, const float *q, int n_heads, int n_kv_heads, int head_dim, int v_dim,
                                   int64_t kv_stride, float scale, int window, float softcap, const int32_t *pos,
                                   const float *const *kb, const float *const *vb) {
  extern __shared__ float qs[]; /* [head_dim] */
  __shared__ float sc[ATT_TILE];
  const int64_t t = blockIdx.x / n_heads;
  const int h = (int)(blockIdx.x % n_heads), kh = h / (n_heads / n_kv_heads);
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = blockDim.x >> 5;
  const float *qr = q + (t * n_heads + h) * (int64_t)head_dim;
  for (int j = tid; j < head_dim; j += blockDim.x) qs[j] = qr[j];
  const int32_t p = pos[t];
  int32_t p0 = 0;
  if (window > 0 && p - window + 1 > 0) p0 = p - window + 1;
  const float *K = kb[t] + (int64_t)kh * head_dim, *V = vb[t] + (int64_t)kh * v_dim;
  float m = -INFINITY, l = 0.0f, acc[ATT_MAXC];
#pragma unroll
  for (int c = 0; c < ATT_MAXC; c++) acc[c] = 0.0f;
  __syncthreads();
  for (int32_t k0 = p0; k0 <= p; k0 += ATT_TILE) {
    const int cnt = p - k0 + 1 < ATT_TILE ? p - k0 + 1 : ATT_TILE;
    for (int kk = wid; kk < cnt; kk += nw) {
      const float *kr = K + (int64_t)(k0 + kk) * kv_stride;
      float s = 0.0f;
      for (int j = lane; j < head_dim; j += 32) s += qs[j] * kr[j];
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      s *= scale;
      if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
      if (lane == 0) sc[kk] = s;
    }
    __syncthreads();
    float tmax = -INFINITY;
    for (int kk = 0; kk < cnt; kk++) tmax = fmaxf(tmax, sc[kk]);
    const float mnew = fmaxf(m, tmax);
    const float corr = expf(m - mnew); /* m = -inf on the first tile: corr = 0 */
    float psum = 0.0f;
    float pv[ATT_MAXC];
#pragma unroll
    for (int c = 0; c < ATT_MAXC; c++) pv[c] = 0.0f;
    for (int kk = 0; kk < cnt; kk++) {
      const float e = expf(sc[kk] - mnew);
      psum += e;
      const float *vr = V + (int64_t)(k0 + kk) * kv_stride;
#pragma unroll
      for (int c = 0; c < ATT_MAXC; c++) {
        const int j = tid + c * ATT_THREADS;
        if (j < v_dim) pv[c] += e * vr[j];
      }
    }
    l = l * corr + psum;
#pragma unroll
    for (int c = 0; c < ATT_MAXC; c++) acc[c] = acc[c] * corr + pv[c];
    m = mnew;
    __syncthreads(); /* sc is rewritten by the next tile */
  }
  float *o = out + (t * n_heads + h) * (int64_t)v_dim;
  const float inv = 1.0f / l;
#pragma unroll
  for (int c = 0; c < ATT_MAXC; c++) {
    const int j = tid + c * ATT_THREADS;
    if (j < v_dim) o[j] = acc[c] * inv;
  }
}

void cuda_op_attention(ops_backend *be, float *out, const float *q, const ops_attn_args *a) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || a->n <= 0) return;
  if (a->v_dim > ATT_THREADS * ATT_MAXC || a->head_dim <= 0 || a->n_kv_heads <= 0 ||
      a->n_heads % a->n_kv_heads != 0 || a->head_dim > 8192) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: attention shape (heads %d/%d, dims %d/%d) not supported", a->n_heads,
              a->n_kv_heads, a->head_dim, a->v_dim);
    return;
  }
  if (a->n * a->n_heads > 0x7fffffff) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: attention batch too large");
    return;
  }
  const float *const *kd = (const float *const *)cuda_ring_put(be, a->k, (size_t)a->n * sizeof(float *));
  const float *const *vd = (const float *const *)cuda_ring_put(be, a->v, (size_t)a->n * sizeof(float *));
  if (!kd || !vd) return;
  k_attention<<<(unsigned)(a->n * a->n_heads), ATT_THREADS, (size_t)a->head_dim * sizeof(float), ci->stream>>>(
      out, q, a->n_heads, a->n_kv_heads, a->head_dim, a->v_dim, a->kv_stride, a->scale, a->window, a->softcap, a->pos,
      kd, vd);
  cuda_check_launch(ci, "attention");
}
