/* cuda_attn.cu: causal / sliding-window attention with softcap and GQA over per-token
 * K/V cache bases, with an online softmax.
 *
 * One block per (token, head, key split). Keys are taken ATT_TILE at a time: each warp
 * scores ATT_KPW keys at once (lanes across head_dim, independent loads in flight), then
 * every thread accumulates its value dimensions over the tile, four keys per step. For
 * decode (few tokens) the key range is split over several blocks (split-K) whose partial
 * (max, sum, unnormalised output) are merged by a second kernel, so a long context keeps
 * the whole GPU busy instead of one block per head. */
#include "backends/cuda/cuda_internal.h"

#include "base/error.h"

#define ATT_THREADS 128
#define ATT_MAXC 4 /* v_dim <= ATT_THREADS * ATT_MAXC */
#define ATT_TILE 32
#define ATT_KPW 4 /* keys a warp scores together */

static __global__ void k_attention(float *out, float *part, int nsplit, const float *q, int n_heads, int n_kv_heads,
                                   int head_dim, int v_dim, int64_t kv_stride, float scale, int window,
                                   float softcap, const int32_t *pos, const float *const *kb, const float *const *vb) {
  extern __shared__ float qs[]; /* [head_dim] */
  __shared__ float sc[ATT_TILE];
  const int64_t bh = blockIdx.x, t = bh / n_heads;
  const int h = (int)(bh % n_heads), kh = h / (n_heads / n_kv_heads), split = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = blockDim.x >> 5;
  const float *qr = q + bh * (int64_t)head_dim;
  for (int j = tid; j < head_dim; j += blockDim.x) qs[j] = qr[j];
  const int32_t p = pos[t];
  int32_t p0 = 0;
  if (window > 0 && p - window + 1 > 0) p0 = p - window + 1;
  const int32_t len = p - p0 + 1, chunk = (len + nsplit - 1) / nsplit;
  const int32_t ks = p0 + split * chunk, ke = min(p, ks + chunk - 1);
  const float *K = kb[t] + (int64_t)kh * head_dim, *V = vb[t] + (int64_t)kh * v_dim;
  float m = -INFINITY, l = 0.0f, acc[ATT_MAXC];
#pragma unroll
  for (int c = 0; c < ATT_MAXC; c++) acc[c] = 0.0f;
  __syncthreads();
  for (int32_t k0 = ks; k0 <= ke; k0 += ATT_TILE) {
    const int cnt = ke - k0 + 1 < ATT_TILE ? ke - k0 + 1 : ATT_TILE;
    for (int kk = wid * ATT_KPW; kk < cnt; kk += nw * ATT_KPW) {
      float s[ATT_KPW];
      const float *kr[ATT_KPW];
#pragma unroll
      for (int u = 0; u < ATT_KPW; u++) {
        s[u] = 0.0f;
        kr[u] = K + (int64_t)(k0 + (kk + u < cnt ? kk + u : kk)) * kv_stride;
      }
      for (int j = lane; j < head_dim; j += 32) {
        const float qj = qs[j];
#pragma unroll
        for (int u = 0; u < ATT_KPW; u++) s[u] += qj * kr[u][j];
      }
#pragma unroll
      for (int u = 0; u < ATT_KPW; u++) {
        float v = s[u];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        v *= scale;
        if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
        if (lane == 0 && kk + u < cnt) sc[kk + u] = v;
      }
    }
    __syncthreads();
    float tmax = -INFINITY;
    for (int kk = 0; kk < cnt; kk++) tmax = fmaxf(tmax, sc[kk]);
    const float mnew = fmaxf(m, tmax);
    const float corr = expf(m - mnew); /* m = -inf on the first tile: corr = 0 */
    float psum = 0.0f, pv[ATT_MAXC];
#pragma unroll
    for (int c = 0; c < ATT_MAXC; c++) pv[c] = 0.0f;
    int kk = 0;
    for (; kk + 4 <= cnt; kk += 4) {
      float e[4];
      const float *vr[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        e[u] = expf(sc[kk + u] - mnew);
        vr[u] = V + (int64_t)(k0 + kk + u) * kv_stride;
      }
      psum += (e[0] + e[1]) + (e[2] + e[3]);
#pragma unroll
      for (int c = 0; c < ATT_MAXC; c++) {
        const int j = tid + c * ATT_THREADS;
        if (j < v_dim) pv[c] += e[0] * vr[0][j] + e[1] * vr[1][j] + e[2] * vr[2][j] + e[3] * vr[3][j];
      }
    }
    for (; kk < cnt; kk++) {
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
  if (nsplit == 1) {
    float *o = out + bh * (int64_t)v_dim;
    const float inv = 1.0f / l;
#pragma unroll
    for (int c = 0; c < ATT_MAXC; c++) {
      const int j = tid + c * ATT_THREADS;
      if (j < v_dim) o[j] = acc[c] * inv;
    }
    return;
  }
  /* Partial of this split: [v_dim] unnormalised output, then max and sum. An empty split
   * (ks > ke) leaves m = -inf, l = 0. */
  float *pp = part + (bh * nsplit + split) * (int64_t)(v_dim + 2);
#pragma unroll
  for (int c = 0; c < ATT_MAXC; c++) {
    const int j = tid + c * ATT_THREADS;
    if (j < v_dim) pp[j] = acc[c];
  }
  if (tid == 0) pp[v_dim] = m, pp[v_dim + 1] = l;
}

static __global__ void k_attn_combine(float *out, const float *part, int nsplit, int v_dim) {
  const int64_t bh = blockIdx.x;
  const float *pb = part + bh * nsplit * (int64_t)(v_dim + 2);
  float M = -INFINITY;
  for (int s = 0; s < nsplit; s++) M = fmaxf(M, pb[s * (int64_t)(v_dim + 2) + v_dim]);
  float L = 0.0f;
  for (int s = 0; s < nsplit; s++) {
    const float *ps = pb + s * (int64_t)(v_dim + 2);
    if (ps[v_dim + 1] > 0.0f) L += ps[v_dim + 1] * expf(ps[v_dim] - M);
  }
  const float inv = 1.0f / L;
  for (int j = threadIdx.x; j < v_dim; j += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < nsplit; s++) {
      const float *ps = pb + s * (int64_t)(v_dim + 2);
      if (ps[v_dim + 1] > 0.0f) o += ps[j] * expf(ps[v_dim] - M);
    }
    out[bh * (int64_t)v_dim + j] = o * inv;
  }
}

void cuda_op_attention(ops_backend *be, float *out, const float *q, const ops_attn_args *a) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || a->n <= 0) return;
  if (a->v_dim > ATT_THREADS * ATT_MAXC || a->v_dim <= 0 || a->head_dim <= 0 || a->n_kv_heads <= 0 ||
      a->n_heads % a->n_kv_heads != 0 || a->head_dim > 8192) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: attention shape (heads %d/%d, dims %d/%d) not supported", a->n_heads,
              a->n_kv_heads, a->head_dim, a->v_dim);
    return;
  }
  const int64_t nbh = a->n * a->n_heads;
  if (nbh > 0x7fffffff) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: attention batch too large");
    return;
  }
  const float *const *kd = (const float *const *)cuda_ring_put(be, a->k, (size_t)a->n * sizeof(float *));
  const float *const *vd = (const float *const *)cuda_ring_put(be, a->v, (size_t)a->n * sizeof(float *));
  if (!kd || !vd) return;
  /* Split the keys when (token, head) pairs alone cannot fill the GPU: about two blocks
   * per multiprocessor, bounded by the partials scratch. Splits past a sequence's length
   * are empty and cost one block each. */
  int nsplit = 1;
  if (nbh < 256) {
    nsplit = (int)(264 / nbh);
    if (nsplit > 32) nsplit = 32;
    const int64_t fit = (int64_t)ci->att_part_floats / (nbh * (a->v_dim + 2));
    if (nsplit > fit) nsplit = (int)fit;
    if (nsplit < 2) nsplit = 1;
  }
  dim3 grid((unsigned)nbh, (unsigned)nsplit);
  k_attention<<<grid, ATT_THREADS, (size_t)a->head_dim * sizeof(float), ci->stream>>>(
      out, ci->att_part, nsplit, q, a->n_heads, a->n_kv_heads, a->head_dim, a->v_dim, a->kv_stride, a->scale,
      a->window, a->softcap, a->pos, kd, vd);
  if (!cuda_check_launch(ci, "attention")) return;
  if (nsplit > 1) {
    k_attn_combine<<<(unsigned)nbh, ATT_THREADS, 0, ci->stream>>>(out, ci->att_part, nsplit, a->v_dim);
    cuda_check_launch(ci, "attention combine");
  }
}
