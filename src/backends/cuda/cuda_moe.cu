/* cuda_moe.cu: router top-k on the device, and the sparse expert FFN.
 *
 * moe_ffn reads the chosen expert ids back to the host (n * k int32, one sync) to group
 * the (token, slot) pairs by expert; then, per selected expert only, it gathers that
 * expert's input rows, runs gate/up/act/down through the matmul entry and adds the
 * weighted rows into out. Experts run one after another on the stream, so the
 * scatter-adds never race. Grouped GEMMs without the readback are future work. */
#include "backends/cuda/cuda_internal.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

static __global__ void k_moe_route(int32_t *idx, float *wts, const float *logits, int64_t n, int E, int k, int renorm,
                                   const float *per_expert) {
  const int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (t >= n) return;
  const float *l = logits + t * E;
  float mx = -INFINITY;
  for (int e = 0; e < E; e++) mx = fmaxf(mx, l[e]);
  double sum = 0;
  for (int e = 0; e < E; e++) sum += exp((double)l[e] - mx);
  int32_t *ti = idx + t * k;
  float *tw = wts + t * k;
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      bool used = false;
      for (int q = 0; q < j; q++) used |= ti[q] == e;
      if (!used && (best < 0 || l[e] > l[best])) best = e;
    }
    ti[j] = best;
    tw[j] = (float)(exp((double)l[best] - mx) / sum);
  }
  if (renorm) {
    float s = 0;
    for (int j = 0; j < k; j++) s += tw[j];
    for (int j = 0; j < k; j++) tw[j] /= s;
  }
  if (per_expert)
    for (int j = 0; j < k; j++) tw[j] *= per_expert[ti[j]];
}

void cuda_op_moe_route(ops_backend *be, int32_t *idx, float *wts, const float *logits, int64_t n, int n_experts, int k,
                       int renorm, const float *per_expert) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  if (k < 1 || k > n_experts) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: top-%d of %d experts", k, n_experts);
    return;
  }
  const float *pe = per_expert ? (const float *)cuda_mirror(be, per_expert, (size_t)n_experts * sizeof(float)) : NULL;
  if (per_expert && !pe) return;
  k_moe_route<<<cuda_blocks(n, 64), 64, 0, ci->stream>>>(idx, wts, logits, n, n_experts, k, renorm, pe);
  cuda_check_launch(ci, "moe_route");
}

/* xs[r] = x[order[r] / k] */
static __global__ void k_gather(float *xs, const float *x, const int32_t *order, int64_t m, int H, int k) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m * H; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / H;
    xs[i] = x[(int64_t)(order[r] / k) * H + i % H];
  }
}

/* out[order[r] / k] += wts[order[r]] * ys[r]; one expert per launch, so rows are distinct. */
static __global__ void k_scatter_add(float *out, const float *ys, const int32_t *order, const float *wts, int64_t m,
                                     int H, int k) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m * H; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / H;
    const int32_t pair = order[r];
    out[(int64_t)(pair / k) * H + i % H] += wts[pair] * ys[i];
  }
}

static unsigned grid_of(int64_t n) {
  int64_t b = (n + 255) / 256;
  return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

void cuda_op_moe_ffn(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                     const float *wts, int k, const ops_weight *gate, const ops_weight *up, const ops_weight *down,
                     int act, float *scratch) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  if (ci->capturing) { /* the expert ids are read back mid-op: not capturable */
    cuda_fail(ci, ANNA_ESTATE, "cuda: moe_ffn inside a captured step (graphs must be off for MoE models)");
    return;
  }
  const int64_t I = up ? up[0].rows : gate[0].rows / 2;
  const int64_t nk = n * k;
  int32_t *hidx = (int32_t *)malloc((size_t)nk * 2 * sizeof(int32_t));
  if (!hidx) {
    cuda_fail(ci, ANNA_ENOMEM, "cuda: out of host memory in moe_ffn");
    return;
  }
  int32_t *order = hidx + nk;
  if (!cuda_check(ci, cudaMemcpyAsync(hidx, idx, (size_t)nk * sizeof(int32_t), cudaMemcpyDeviceToHost, ci->stream),
                  "moe ids") ||
      !cuda_check(ci, cudaStreamSynchronize(ci->stream), "moe ids sync")) {
    free(hidx);
    return;
  }
  int32_t emax = -1;
  for (int64_t i = 0; i < nk; i++) {
    if (hidx[i] < 0) {
      free(hidx);
      cuda_fail(ci, ANNA_ERANGE, "cuda: expert id %d out of range", hidx[i]);
      return;
    }
    emax = hidx[i] > emax ? hidx[i] : emax;
  }
  /* Counting sort of the pairs by expert. */
  int64_t *start = (int64_t *)calloc((size_t)emax + 2, sizeof(int64_t));
  if (!start) {
    free(hidx);
    cuda_fail(ci, ANNA_ENOMEM, "cuda: out of host memory in moe_ffn");
    return;
  }
  for (int64_t i = 0; i < nk; i++) start[hidx[i] + 1]++;
  for (int32_t e = 0; e <= emax; e++) start[e + 1] += start[e];
  {
    int64_t *fill = (int64_t *)malloc(((size_t)emax + 1) * sizeof(int64_t));
    if (!fill) {
      free(hidx);
      free(start);
      cuda_fail(ci, ANNA_ENOMEM, "cuda: out of host memory in moe_ffn");
      return;
    }
    memcpy(fill, start, ((size_t)emax + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < nk; i++) order[fill[hidx[i]]++] = (int32_t)i;
    free(fill);
  }
  const int32_t *dorder = (const int32_t *)cuda_ring_put(be, order, (size_t)nk * sizeof(int32_t));
  float *xs = scratch, *gu = xs + nk * H, *hbuf = gu + nk * 2 * I, *ys = hbuf + nk * I;
  if (dorder) cuda_check(ci, cudaMemsetAsync(out, 0, (size_t)(n * H) * sizeof(float), ci->stream), "moe memset");
  for (int32_t e = 0; dorder && !ci->err && e <= emax; e++) {
    const int64_t m = start[e + 1] - start[e];
    if (!m) continue;
    const int32_t *ord = dorder + start[e];
    k_gather<<<grid_of(m * H), 256, 0, ci->stream>>>(xs, x, ord, m, H, k);
    if (!cuda_check_launch(ci, "moe gather")) break;
    if (up) {
      cuda_op_matmul(be, gu, xs, m, &gate[e], NULL);
      cuda_op_matmul(be, gu + m * I, xs, m, &up[e], NULL);
      cuda_op_act_mul(be, hbuf, gu, gu + m * I, m, (int)I, I, I, act);
    } else {
      cuda_op_matmul(be, gu, xs, m, &gate[e], NULL);
      cuda_op_act_mul(be, hbuf, gu, gu + I, m, (int)I, 2 * I, 2 * I, act);
    }
    cuda_op_matmul(be, ys, hbuf, m, &down[e], NULL);
    if (ci->err) break;
    k_scatter_add<<<grid_of(m * H), 256, 0, ci->stream>>>(out, ys, ord, wts, m, H, k);
    cuda_check_launch(ci, "moe scatter");
  }
  free(start);
  free(hidx);
}
