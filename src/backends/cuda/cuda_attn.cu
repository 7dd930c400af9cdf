/* cuda_attn.cu: causal / sliding-window attention with softcap and GQA over a paged f32
 * K/V cache (per-token block tables, see ops_attn_args), with an online softmax.
 *
 * One block per (token, head, key split). Keys are taken ATT_TILE at a time: each warp
 * scores ATT_KPW keys at once (lanes across head_dim, independent loads in flight), then
 * every thread accumulates its value dimensions over the tile, four keys per step. For
 * decode (few tokens) the key range is split over several blocks (split-K) whose partial
 * (max, sum, unnormalised output) are merged by a second kernel, so a long context keeps
 * the whole GPU busy instead of one block per head.
 *
 * Prefill (exact off, runs of >= 16 tokens of one sequence): flash attention on tensor
 * cores, see "flash prefill" below: k_flash_mma (mma.sync, scores in registers) for head
 * dims 32, 64, 128 and 256, the WMMA kernel k_flash for the others. */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_async.cuh"
#include "backends/cuda/cuda_kv.cuh"
#include "backends/cuda/cuda_math.cuh"

#include "base/error.h"

#include <cuda_fp16.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <mma.h>

#define ATT_THREADS 128
#define ATT_MAXC 4 /* v_dim <= ATT_THREADS * ATT_MAXC */
#define ATT_TILE 32
#define ATT_KPW 4 /* keys a warp scores together */

static __global__ void k_attention(float *out, float *part, int nsplit, const float *q, int n_heads, int n_kv_heads,
                                   int head_dim, int v_dim, int64_t row_floats, int bshift, float scale, int window,
                                   float softcap, const int32_t *pos, const void *const *const *kb,
                                   const void *const *const *vb) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
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
  /* Position p: row (p & bmask) of block p >> bshift of this token's sequence. */
  const float *const *KT = (const float *const *)kb[t], *const *VT = (const float *const *)vb[t];
  const int32_t bmask = (1 << bshift) - 1;
#define KROW(p) (KT[(p) >> bshift] + (int64_t)((p) & bmask) * row_floats + (int64_t)kh * head_dim)
#define VROW(p) (VT[(p) >> bshift] + (int64_t)((p) & bmask) * row_floats + (int64_t)kh * v_dim)
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
        kr[u] = KROW(k0 + (kk + u < cnt ? kk + u : kk));
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
        vr[u] = VROW(k0 + kk + u);
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
      const float *vr = VROW(k0 + kk);
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
#undef KROW
#undef VROW
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

/* Decode attention for grouped queries (2 <= G = n_heads / n_kv_heads <= GQ_MAXG, head_dim
 * <= 256): one block per (token, kv head, key split) serves the G query heads that read that
 * kv head, so each K and V row is loaded once per block instead of once per query head (the
 * per-head kernel above re-reads them G times: at 8k keys of the 9B shape, 4x the traffic).
 * A tile of GQ_TILE keys is staged in shared memory with 16-byte loads (K, then V in the same
 * buffer); warp g scores head g against the tile's keys (one key per lane) and keeps head g's
 * online softmax; every thread then accumulates its (head, column) outputs over the tile.
 * Same partials and scoring order (dot, then scale, then softcap) as k_attention. */
#define GQ_MAXG 8
#define GQ_TILE 32
#define GQ_THREADS 256
static __global__ void __launch_bounds__(GQ_THREADS)
    k_attention_gqa(float *out, float *part, int nsplit, const float *q, int n_heads, int n_kv_heads, int D,
                    int64_t row_floats, int bshift, float scale, int window, float softcap, const int32_t *pos,
                    const void *const *const *kb, const void *const *const *vb) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  extern __shared__ __align__(16) float gq_smem[];
  const int G = n_heads / n_kv_heads, DP = D + 4; /* +4: 16-byte rows that start on other banks */
  float *qs = gq_smem;                            /* [G][D] */
  float *kv = qs + GQ_MAXG * D;                   /* [GQ_TILE][DP] */
  float *ps = kv + GQ_TILE * DP;                  /* [G][GQ_TILE] */
  __shared__ float ms[GQ_MAXG], ls[GQ_MAXG], cs[GQ_MAXG];
  const int64_t t = blockIdx.x / n_kv_heads;
  const int kh = (int)(blockIdx.x % n_kv_heads), split = blockIdx.y, tid = threadIdx.x;
  const int lane = tid & 31, wid = tid >> 5;
  const int32_t p = pos[t];
  int32_t p0 = 0;
  if (window > 0 && p - window + 1 > 0) p0 = p - window + 1;
  /* Whole tiles per split: a short context uses the first splits and leaves the rest empty
   * (the launcher sizes the grid for long ones: it cannot see the positions). */
  const int32_t len = p - p0 + 1, chunk = ((len + nsplit - 1) / nsplit + GQ_TILE - 1) / GQ_TILE * GQ_TILE;
  const int32_t ks = p0 + split * chunk, ke = min(p, ks + chunk - 1);
  if (ks > ke) { /* empty: max -inf, sum 0 (the combine skips its values) */
    if (tid < G) {
      float *pp = part + ((t * n_heads + (int64_t)kh * G + tid) * nsplit + split) * (int64_t)(D + 2);
      pp[D] = -INFINITY, pp[D + 1] = 0.0f;
    }
    return;
  }
  for (int i = tid; i < G * D; i += GQ_THREADS) qs[i] = q[(t * n_heads + (int64_t)kh * G) * D + i];
  if (tid < GQ_MAXG) ms[tid] = -INFINITY, ls[tid] = 0.0f, cs[tid] = 0.0f;
  const float *const *KT = (const float *const *)kb[t], *const *VT = (const float *const *)vb[t];
  const int32_t bmask = (1 << bshift) - 1;
  const int D4 = D / 4, nout = G * D; /* outputs o = tid + c * GQ_THREADS: head o / D, column o % D */
  float acc[GQ_MAXG];
#pragma unroll
  for (int c = 0; c < GQ_MAXG; c++) acc[c] = 0.0f;
  __syncthreads();
  for (int32_t k0 = ks; k0 <= ke; k0 += GQ_TILE) {
    const int cnt = ke - k0 + 1 < GQ_TILE ? ke - k0 + 1 : GQ_TILE;
    for (int i = tid; i < cnt * D4; i += GQ_THREADS) {
      const int key = i / D4, c4 = i - key * D4, pk = k0 + key;
      const float *kr = KT[pk >> bshift] + (int64_t)(pk & bmask) * row_floats + (int64_t)kh * D;
      *(float4 *)(kv + key * DP + 4 * c4) = ((const float4 *)kr)[c4];
    }
    __syncthreads();
    if (wid < G) { /* warp wid: head wid, lane: key */
      float sv = -INFINITY;
      if (lane < cnt) {
        const float4 *qr = (const float4 *)(qs + wid * D), *kr = (const float4 *)(kv + lane * DP);
        float d = 0.0f;
        for (int c4 = 0; c4 < D4; c4++) {
          const float4 a = qr[c4], b = kr[c4];
          d += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
        sv = d * scale;
        if (softcap > 0.0f) sv = softcap * tanhf(sv / softcap);
      }
      float tmax = sv;
      for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      const float mold = ms[wid], mnew = fmaxf(mold, tmax);
      const float e = lane < cnt ? expf(sv - mnew) : 0.0f;
      const float esum = cuda_warp_sum(e);
      ps[wid * GQ_TILE + lane] = e;
      __syncwarp();
      if (lane == 0) {
        const float corr = expf(mold - mnew); /* mold = -inf on the first tile: 0 */
        cs[wid] = corr;
        ls[wid] = ls[wid] * corr + esum;
        ms[wid] = mnew;
      }
    }
    __syncthreads(); /* scores done: the buffer takes V */
    for (int i = tid; i < cnt * D4; i += GQ_THREADS) {
      const int key = i / D4, c4 = i - key * D4, pk = k0 + key;
      const float *vr = VT[pk >> bshift] + (int64_t)(pk & bmask) * row_floats + (int64_t)kh * D;
      *(float4 *)(kv + key * DP + 4 * c4) = ((const float4 *)vr)[c4];
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < GQ_MAXG; c++) {
      const int o = tid + c * GQ_THREADS;
      if (o >= nout) break;
      const int g = o / D, j = o - g * D;
      float sum = 0.0f;
      for (int key = 0; key < cnt; key++) sum += ps[g * GQ_TILE + key] * kv[key * DP + j];
      acc[c] = acc[c] * cs[g] + sum;
    }
    __syncthreads(); /* the next tile rewrites kv and ps */
  }
#pragma unroll
  for (int c = 0; c < GQ_MAXG; c++) {
    const int o = tid + c * GQ_THREADS;
    if (o >= nout) break;
    const int g = o / D, j = o - g * D;
    const int64_t bh = t * n_heads + (int64_t)kh * G + g;
    if (nsplit == 1) out[bh * D + j] = acc[c] / ls[g];
    else part[(bh * nsplit + split) * (int64_t)(D + 2) + j] = acc[c];
  }
  if (nsplit > 1 && tid < G) {
    float *pp = part + ((t * n_heads + (int64_t)kh * G + tid) * nsplit + split) * (int64_t)(D + 2);
    pp[D] = ms[tid], pp[D + 1] = ls[tid]; /* an empty split: -inf, 0 */
  }
}

/* Merges the splits of one (token, head): the first warp reads every split's (max, sum)
 * (lane s: splits s, s + 32, ...) and turns them into weights exp(m_s - M) / L in shared
 * memory, then each thread sums its value columns over the splits (independent loads, not
 * a chain of round trips). nsplit <= ATT_MAX_SPLIT; the per-head and flash launchers keep
 * to ATT_SPLIT_CAP, the grouped decode kernel (fewer blocks per token) goes up to the max. */
#define ATT_MAX_SPLIT 128
#define ATT_SPLIT_CAP 32
static __global__ void k_attn_combine(float *out, const float *part, int nsplit, int v_dim) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  __shared__ float wsh[ATT_MAX_SPLIT];
  const int64_t bh = blockIdx.x;
  const int64_t stride = v_dim + 2;
  const float *pb = part + bh * nsplit * stride;
  __shared__ int nact;
  if (threadIdx.x < 32) {
    /* every split's (max, sum) loaded at once: one round trip, not one per 32 splits */
    constexpr int PER = ATT_MAX_SPLIT / 32;
    float m[PER], l[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const int s = threadIdx.x + 32 * i;
      m[i] = s < nsplit ? pb[s * stride + v_dim] : -INFINITY;
      l[i] = s < nsplit ? pb[s * stride + v_dim + 1] : 0.0f;
    }
    float M = m[0];
#pragma unroll
    for (int i = 1; i < PER; i++) M = fmaxf(M, m[i]);
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float e[PER], L = 0.0f;
    int last = -1; /* the last split with keys: the grouped kernel's empty splits are the trailing ones */
#pragma unroll
    for (int i = 0; i < PER; i++) {
      e[i] = l[i] > 0.0f ? expf(m[i] - M) : 0.0f; /* an empty split (l == 0) adds nothing */
      L += l[i] * e[i];
      if (l[i] > 0.0f) last = threadIdx.x + 32 * i;
    }
    L = cuda_warp_sum(L);
    for (int o = 16; o > 0; o >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
#pragma unroll
    for (int i = 0; i < PER; i++)
      if (threadIdx.x + 32 * i < nsplit) wsh[threadIdx.x + 32 * i] = e[i] / L;
    if (threadIdx.x == 0) nact = last + 1;
  }
  __syncthreads();
  const int ns = nact;
  for (int j = threadIdx.x; j < v_dim; j += blockDim.x) {
    float o = 0.0f;
#pragma unroll 16
    for (int s = 0; s < ns; s++)
      if (wsh[s] != 0.0f) o += pb[s * stride + j] * wsh[s]; /* an empty split's values may be unwritten */
    out[bh * (int64_t)v_dim + j] = o;
  }
}


/* ---- quantized caches and the residual ring (tuning key cuda_kv_quant) ----
 *
 * One kernel for every KV format (F16, Q8, Q4, TurboQuant 2-4 bit; F32 too when the
 * residual ring is on), decode and prefill, any group size and head dims up to 1024: one
 * block per (token, kv head, group of HB query heads of that kv head, key split). It is the
 * grouped decode kernel above with the tile loader decoding records on load (kv_ld4: the
 * values cpu_kv_decode gives), so a K/V record is read and decoded once per HB heads. Keys
 * p > pos - residual_len come from the sequence's f32 ring (as cpu_attn.c: the newest
 * positions, so a suffix of a tile). TurboQuant is attended in the rotated space as on the
 * CPU: the queries are rotated once in shared memory, ring rows (f32, unrotated) are rotated
 * after loading, and each block rotates its (partial) output back before writing it (the
 * rotation is linear, so partials merge the same). Queries are scaled before the dot, as
 * cpu_attn.c does. f32 arithmetic throughout: the result is the CPU's up to the order of
 * additions (tests/cuda test_cuda_kv.c: 1e-4 of the output scale). */
#define KQ_THREADS 256
#define KQ_TILE 32
#define KQ_MAXHB 8
#define KQ_MAXC 8 /* HB * D <= KQ_THREADS * KQ_MAXC */

static __device__ __forceinline__ void kq_load_tile(float *kv, int DP, int cnt, int D, int32_t k0, int32_t thr,
                                                    int kvt, const void *const *T, int bshift, int64_t row_bytes,
                                                    int64_t roff, const float *ring, int ring_len, int64_t ring_row,
                                                    int64_t ring_off) {
  const int D4 = D / 4;
  const int32_t bmask = (1 << bshift) - 1;
  for (int i = threadIdx.x; i < cnt * D4; i += KQ_THREADS) {
    const int key = i / D4, c4 = i - key * D4;
    const int32_t pk = k0 + key;
    float4 v;
    if (pk > thr) {
      v = ((const float4 *)(ring + (int64_t)(pk % ring_len) * ring_row + ring_off))[c4];
    } else {
      const uint8_t *rec = (const uint8_t *)T[pk >> bshift] + (int64_t)(pk & bmask) * row_bytes + roff;
      v = kvt == OPS_KV_F32 ? ((const float4 *)rec)[c4] : kv_ld4(kvt, rec, c4);
    }
    *(float4 *)(kv + key * DP + 4 * c4) = v;
  }
}

static __global__ void __launch_bounds__(KQ_THREADS)
    k_attn_kv(float *out, float *part, int nsplit, const float *q, int n_heads, int n_kv_heads, int HB, int D, int kvt,
              int64_t row_bytes, int64_t head_bytes, int bshift, float scale, int window, float softcap,
              const int32_t *pos, const void *const *const *kb, const void *const *const *vb, int resid, int ring_len,
              const float *const *kring, const float *const *vring) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  extern __shared__ __align__(16) float kq_smem[];
  const int G = n_heads / n_kv_heads, NG = G / HB, DP = D + 4;
  float *qs = kq_smem;           /* [HB][D] */
  float *kv = qs + HB * D;       /* [KQ_TILE][DP] */
  float *ps = kv + KQ_TILE * DP; /* [HB][KQ_TILE] */
  __shared__ float ms[KQ_MAXHB], ls[KQ_MAXHB], cs[KQ_MAXHB];
  const int64_t t = blockIdx.x / ((int64_t)n_kv_heads * NG);
  const int rem = (int)(blockIdx.x - t * n_kv_heads * NG), kh = rem / NG, h0 = kh * G + (rem % NG) * HB;
  const int split = blockIdx.y, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int rotated = kvt >= OPS_KV_TQ2;
  const int32_t p = pos[t];
  int32_t p0 = 0;
  if (window > 0 && p - window + 1 > 0) p0 = p - window + 1;
  const int32_t len = p - p0 + 1, chunk = ((len + nsplit - 1) / nsplit + KQ_TILE - 1) / KQ_TILE * KQ_TILE;
  const int32_t ks = p0 + split * chunk, ke = min(p, ks + chunk - 1);
  if (ks > ke) { /* empty split: max -inf, sum 0 */
    if (tid < HB) {
      float *pp = part + ((t * n_heads + h0 + tid) * nsplit + split) * (int64_t)(D + 2);
      pp[D] = -INFINITY, pp[D + 1] = 0.0f;
    }
    return;
  }
  const int ring_on = resid > 0 && kring != NULL;
  const int32_t thr = ring_on ? p - resid : INT_MAX; /* keys above come from the ring */
  const float *kr = ring_on ? kring[t] : NULL, *vr = ring_on ? vring[t] : NULL;
  const int64_t ring_row = (int64_t)n_kv_heads * D, ring_off = (int64_t)kh * D, roff = (int64_t)kh * head_bytes;
  for (int i = tid; i < HB * D; i += KQ_THREADS) qs[i] = q[(t * n_heads + h0) * (int64_t)D + i];
  if (tid < KQ_MAXHB) ms[tid] = -INFINITY, ls[tid] = 0.0f, cs[tid] = 0.0f;
  __syncthreads();
  if (rotated) kv_rotate_rows(qs, HB, D, D, 1);
  for (int i = tid; i < HB * D; i += KQ_THREADS) qs[i] = __fmul_rn(qs[i], scale);
  const void *const *KT = kb[t], *const *VT = vb[t];
  const int nout = HB * D;
  float acc[KQ_MAXC];
#pragma unroll
  for (int c = 0; c < KQ_MAXC; c++) acc[c] = 0.0f;
  __syncthreads();
  for (int32_t k0 = ks; k0 <= ke; k0 += KQ_TILE) {
    const int cnt = ke - k0 + 1 < KQ_TILE ? ke - k0 + 1 : KQ_TILE;
    /* ring keys of this tile: rows [rk, cnt) (the newest positions) */
    const int rk = thr >= k0 + cnt - 1 ? cnt : thr < k0 ? 0 : thr - k0 + 1;
    kq_load_tile(kv, DP, cnt, D, k0, thr, kvt, KT, bshift, row_bytes, roff, kr, ring_len, ring_row, ring_off);
    __syncthreads();
    if (rotated && rk < cnt) kv_rotate_rows(kv + rk * DP, cnt - rk, D, DP, 1);
    for (int g = wid; g < HB; g += KQ_THREADS / 32) { /* warp: one head; lane: one key */
      float sv = -INFINITY;
      if (lane < cnt) {
        const float4 *qr = (const float4 *)(qs + g * D), *kr4 = (const float4 *)(kv + lane * DP);
        float d = 0.0f;
        for (int c4 = 0; c4 < D / 4; c4++) {
          const float4 a = qr[c4], b = kr4[c4];
          d += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
        sv = d;
        if (softcap > 0.0f) sv = softcap * tanhf(sv / softcap);
      }
      float tmax = sv;
      for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      const float mold = ms[g], mnew = fmaxf(mold, tmax);
      const float e = lane < cnt ? expf(sv - mnew) : 0.0f;
      const float esum = cuda_warp_sum(e);
      ps[g * KQ_TILE + lane] = e;
      __syncwarp();
      if (lane == 0) {
        const float corr = expf(mold - mnew); /* mold = -inf on the first tile: 0 */
        cs[g] = corr;
        ls[g] = ls[g] * corr + esum;
        ms[g] = mnew;
      }
    }
    __syncthreads(); /* scores done: the buffer takes V */
    kq_load_tile(kv, DP, cnt, D, k0, thr, kvt, VT, bshift, row_bytes, roff, vr, ring_len, ring_row, ring_off);
    __syncthreads();
    if (rotated && rk < cnt) kv_rotate_rows(kv + rk * DP, cnt - rk, D, DP, 1);
#pragma unroll
    for (int c = 0; c < KQ_MAXC; c++) {
      const int o = tid + c * KQ_THREADS;
      if (o >= nout) break;
      const int g = o / D, j = o - g * D;
      float sum = 0.0f;
      for (int key = 0; key < cnt; key++) sum += ps[g * KQ_TILE + key] * kv[key * DP + j];
      acc[c] = acc[c] * cs[g] + sum;
    }
    __syncthreads(); /* the next tile rewrites kv and ps */
  }
  if (rotated) { /* back from the rotated space, in the tile buffer (HB * D <= KQ_TILE * DP) */
#pragma unroll
    for (int c = 0; c < KQ_MAXC; c++) {
      const int o = tid + c * KQ_THREADS;
      if (o < nout) kv[o] = acc[c];
    }
    __syncthreads();
    kv_rotate_rows(kv, HB, D, D, -1);
#pragma unroll
    for (int c = 0; c < KQ_MAXC; c++) {
      const int o = tid + c * KQ_THREADS;
      if (o < nout) acc[c] = kv[o];
    }
  }
#pragma unroll
  for (int c = 0; c < KQ_MAXC; c++) {
    const int o = tid + c * KQ_THREADS;
    if (o >= nout) break;
    const int g = o / D, j = o - g * D;
    const int64_t bh = t * n_heads + h0 + g;
    if (nsplit == 1) out[bh * D + j] = ls[g] > 0.0f ? acc[c] / ls[g] : 0.0f;
    else part[(bh * nsplit + split) * (int64_t)(D + 2) + j] = acc[c];
  }
  if (nsplit > 1 && tid < HB) {
    float *pp = part + ((t * n_heads + h0 + tid) * nsplit + split) * (int64_t)(D + 2);
    pp[D] = ms[tid], pp[D + 1] = ls[tid];
  }
}

/* The launcher of k_attn_kv (shape checked by the caller; the block tables and rings are
 * device arrays). HB: the largest divisor of the group size <= KQ_MAXHB whose outputs fit
 * the threads' accumulators. Splits as the grouped decode kernel's. */
static void attn_kv_launch(cuda_impl *ci, float *out, const float *q, const ops_attn_args *a, int bshift,
                           const void *const *const *kd, const void *const *const *vd, const float *const *krd,
                           const float *const *vrd) {
  const int D = a->head_dim, G = a->n_heads / a->n_kv_heads;
  int HB = 1;
  for (int h = 1; h <= KQ_MAXHB && h <= G; h++)
    if (G % h == 0 && h * D <= KQ_THREADS * KQ_MAXC) HB = h;
  const int64_t nbh = a->n * a->n_heads, nbk = a->n * a->n_kv_heads * (G / HB);
  if (nbk > 0x7fffffff) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: attention batch too large");
    return;
  }
  const int64_t target = 4 * (int64_t)(ci->n_sm > 0 ? ci->n_sm : 132);
  int ns = 1;
  if (2 * nbk <= target && !ci->batch_inv) { /* batch-invariant: one split, whatever n is */
    ns = (int)(target / nbk);
    if (ns > ATT_MAX_SPLIT) ns = ATT_MAX_SPLIT;
    if (a->keys_hint > 0) {
      int64_t keys = a->keys_hint;
      if (a->window > 0 && a->window < keys) keys = a->window;
      const int64_t tiles = (keys + KQ_TILE - 1) / KQ_TILE;
      int p2 = 1;
      while (p2 < tiles && p2 < ns) p2 <<= 1;
      if (p2 < ns) ns = p2;
    }
    const int64_t fit = (int64_t)ci->att_part_floats / (nbh * (D + 2));
    if (ns > fit) ns = (int)fit;
    if (ns < 2) ns = 1;
  }
  const size_t smem = sizeof(float) * ((size_t)HB * D + (size_t)KQ_TILE * (D + 4) + (size_t)HB * KQ_TILE);
  if (smem > 48 * 1024 &&
      !cuda_check(ci, cudaFuncSetAttribute(k_attn_kv, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                  "quantized attention smem"))
    return;
  const int resid = a->k_ring && a->v_ring ? a->residual_len : 0;
  cuda_launch_pdl(ci, "attention kv", k_attn_kv, dim3((unsigned)nbk, (unsigned)ns), KQ_THREADS, smem, out,
                  ci->att_part, ns, q, a->n_heads, a->n_kv_heads, HB, D, a->kv_type, a->kv_row_bytes,
                  ops_kv_head_bytes(a->kv_type, D), bshift, a->scale, a->window, a->softcap, a->pos, kd, vd, resid,
                  a->ring_len, resid ? krd : NULL, resid ? vrd : NULL);
  if (ci->err || ns == 1) return;
  cuda_launch_pdl(ci, "attention combine", k_attn_combine, (unsigned)nbh, ATT_THREADS, 0, out, ci->att_part, ns, D);
}

/* ---- flash prefill ----
 *
 * One block per (query tile, kv head, key split). A tile holds up to BM = 16*RB rows:
 * TQ = BM / G consecutive tokens of ONE sequence times the G query heads that share the
 * kv head (row r = token r / G, head kh*G + r % G), so every K/V tile loaded serves all of
 * them. K/V tiles of BK keys are read through the block table in f32, converted to f16 in
 * shared memory, and S = Q K^T, O += P V run on tensor cores (WMMA 16x16x16, f16 inputs,
 * f32 accumulators). The softmax is online and in f32; masking (causal, sliding window)
 * uses each row's own position, so any positions are handled; the tile's key range is
 * [min over rows of the window start, max over rows of pos], and key tiles no row sees are
 * skipped. Q is pre-multiplied by the score scale before the f16 conversion (equivalent,
 * and keeps |q| small). Splits of the key range write (max, sum, unnormalised output)
 * partials that k_attn_combine merges, as the decode path does.
 *
 * Warps: warp w owns S/O rows 16*(w % RB).. and, for S, key columns 16*(w / RB).., for O
 * the value column blocks f*WC + w / RB (f < NF). O stays in accumulator fragments; the
 * element -> row map of a fragment is unspecified by WMMA, so it is read once at start by
 * loading a fragment from a matrix whose entries are their row numbers (same fragment type,
 * same map), which lets each thread rescale its O elements by its rows' softmax factors.
 *
 * Shared memory (halves unless noted; +8 / +4 padding against bank conflicts, keeps
 * every WMMA pointer 32-byte aligned): Q [BM][D+8], K, V [BK][D+8], S [BM][BK+4] f32,
 * P [BM][BK+8], per-row max / sum / correction (f32) and pos / window start (int), and the
 * tile's key range. Contract from the host: D % 16 == 0, D <= 16*NF*WC, G <= BM, q and the
 * K/V rows 16-byte aligned (rows are n_kv_heads*D floats inside blocks allocated at
 * multiples of block_len rows), and every position from the tile's key range start to its
 * max pos is cached (a sequence's cache holds 0..pos). f16 holds K, V and the scaled Q
 * up to 65504 in magnitude (bf16 would trade that range for 3 mantissa bits).
 *
 * Configs (host): D <= 128: 128 rows, 32 keys, 16 warps; D <= 256: the same with 8 value
 * column blocks per warp (130 KiB of shared memory, one block per multiprocessor); D <= 512:
 * 64 rows, 64 keys, 16 warps (222 KiB of the 227 KiB per-block opt-in of H100/H200; a
 * device with less falls back to the f32 kernel). */
#define FA_U 2 /* float4 loads of K and of V each thread keeps in flight */

typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> fa_acc;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, half, nvcuda::wmma::row_major> fa_a;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, half, nvcuda::wmma::col_major> fa_bc;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, half, nvcuda::wmma::row_major> fa_br;

static size_t fa_smem_bytes(int bm, int bk, int d) {
  return (size_t)(bm + 2 * bk) * (d + 8) * 2 + (size_t)bm * (bk + 4) * 4 + (size_t)bm * (bk + 8) * 2 +
         (size_t)bm * 5 * 4 + 16;
}

/* Four floats times s as four halves at dst (8-byte aligned). */
static __device__ __forceinline__ void fa_st4(half *dst, float4 v, float s) {
  union {
    __half2 h[2];
    uint2 u;
  } c;
  c.h[0] = __floats2half2_rn(v.x * s, v.y * s);
  c.h[1] = __floats2half2_rn(v.z * s, v.w * s);
  *(uint2 *)dst = c.u;
}

/* The prologue of both flash kernels. fa_rows_load (all NT threads): the Q tile, scaled and
 * rounded to f16 at row stride ldq (rows past the tile's tokens zero), and each row's
 * position and window start (padding rows -1 / INT_MAX: they see no key). fa_key_range
 * (warp 0, after a barrier): the tile's key range [min window start, max position]. */
static __device__ __forceinline__ void fa_rows_load(half *Qs, int ldq, int *rp, int *rp0, int bm, int nt,
                                                    const float *__restrict__ q, int t0, int nrows, int G, int kh,
                                                    int n_heads, int D, float scale, int window, const int32_t *pos) {
  const int D4 = D >> 2;
  for (int i = threadIdx.x; i < bm * D4; i += nt) {
    const int r = i / D4, c = i - r * D4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < nrows) {
      const int64_t t = t0 + r / G;
      const int h = kh * G + r % G;
      v = __ldg((const float4 *)(q + (t * n_heads + h) * (int64_t)D) + c);
    }
    fa_st4(Qs + r * ldq + c * 4, v, scale);
  }
  for (int r = threadIdx.x; r < bm; r += nt) {
    int p = -1, p0 = INT_MAX;
    if (r < nrows) {
      p = pos[t0 + r / G];
      p0 = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    }
    rp[r] = p, rp0[r] = p0;
  }
}

static __device__ __forceinline__ void fa_key_range(int *krange, const int *rp, const int *rp0, int nrows, int lane) {
  int lo = INT_MAX, hi = -1;
  for (int r = lane; r < nrows; r += 32) lo = min(lo, rp0[r]), hi = max(hi, rp[r]);
  for (int o = 16; o > 0; o >>= 1) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  if (lane == 0) krange[0] = lo, krange[1] = hi;
}

template <int RB, int WC, int NF, int BK>
static __global__ void __launch_bounds__(32 * RB * WC, 512 / (32 * RB * WC))
    k_flash(float *out, float *part, int nsplit, const float *__restrict__ q, int n_heads, int G, int D,
            int64_t row_floats, int bshift, float scale, int window, float softcap, const int32_t *pos,
            const void *const *const *kb, const void *const *const *vb, const int2 *tiles) {
  using namespace nvcuda;
  constexpr int NT = 32 * RB * WC, BM = 16 * RB, SFW = BK / 16 / WC, TPR = NT / BM, CPT = BK / TPR;
  constexpr int LDS = BK + 4, LDP = BK + 8, NE = fa_acc::num_elements;
  static_assert(SFW >= 1 && SFW * WC * 16 == BK, "S column blocks must divide over the column warps");
  static_assert(TPR * BM == NT && TPR <= 32 && (32 % TPR) == 0 && CPT * TPR == BK, "softmax thread map");
  static_assert(BM * LDS >= 256 * RB * WC, "epilogue staging lives in S");
  extern __shared__ __align__(128) unsigned char fa_sm[];
  const int LDQ = D + 8, D4 = D >> 2, DF = D >> 4;
  half *Qs = (half *)fa_sm, *Ks = Qs + BM * LDQ, *Vs = Ks + BK * LDQ;
  float *Ss = (float *)(Vs + BK * LDQ);
  half *Ps = (half *)(Ss + BM * LDS);
  float *rm = (float *)(Ps + BM * LDP), *rl = rm + BM, *rc = rl + BM;
  int *rp = (int *)(rc + BM), *rp0 = rp + BM, *krange = rp0 + BM;

  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, rb = w % RB, wc = w / RB;
  const int kh = blockIdx.y, split = blockIdx.z;
  const int2 tl = tiles[blockIdx.x];
  const int t0 = tl.x, nrows = G * tl.y;

  /* Q tile, row positions, row state. */
  fa_rows_load(Qs, LDQ, rp, rp0, BM, NT, q, t0, nrows, G, kh, n_heads, D, scale, window, pos);
  for (int r = tid; r < BM; r += NT) rm[r] = -INFINITY, rl[r] = 0.0f;
  if (tid < 256) Ss[tid] = (float)(tid >> 4); /* 16x16 matrix of row numbers */
  __syncthreads();
  if (w == 0) fa_key_range(krange, rp, rp0, nrows, lane);
  fa_acc rowf;
  wmma::load_matrix_sync(rowf, Ss, 16, wmma::mem_row_major);
  int rof[NE];
#pragma unroll
  for (int i = 0; i < NE; i++) rof[i] = rb * 16 + (int)rowf.x[i];
  __syncthreads(); /* krange written; the row-number matrix read before S overwrites it */
  const int kmin = krange[0], kmax = krange[1];
  /* kmax >= kmin >= 0: every tile has a row and each row sees its own position. */
  const int ntile = (kmax - kmin) / BK + 1, per = (ntile + nsplit - 1) / nsplit;
  const int jt0 = split * per, jt1 = min(ntile, jt0 + per);

  fa_acc o[NF];
#pragma unroll
  for (int f = 0; f < NF; f++) wmma::fill_fragment(o[f], 0.0f);
  const float *const *KT = (const float *const *)kb[t0], *const *VT = (const float *const *)vb[t0];
  const int bmask = (1 << bshift) - 1;
  const int64_t khoff = (int64_t)kh * D;

  for (int j = jt0; j < jt1; j++) {
    const int ka = kmin + j * BK, kz = ka + BK - 1;
    int vis = 0;
    for (int r = tid; r < BM; r += NT) vis |= rp[r] >= ka && rp0[r] <= kz;
    /* also the barrier before K, V, P of the previous tile are overwritten */
    if (!__syncthreads_or(vis)) continue;

    /* K, V tile: f32 rows through the block table -> f16; keys past kmax are zero. */
    const int total = BK * D4;
    for (int i0 = tid; i0 < total; i0 += NT * FA_U) {
      float4 kv[FA_U], vv[FA_U];
#pragma unroll
      for (int u = 0; u < FA_U; u++) {
        const int i = i0 + u * NT;
        kv[u] = vv[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < total) {
          const int r = i / D4, c = i - r * D4, kp = ka + r;
          if (kp <= kmax) {
            const int64_t off = (int64_t)(kp & bmask) * row_floats + khoff + 4 * c;
            kv[u] = __ldg((const float4 *)(KT[kp >> bshift] + off));
            vv[u] = __ldg((const float4 *)(VT[kp >> bshift] + off));
          }
        }
      }
#pragma unroll
      for (int u = 0; u < FA_U; u++) {
        const int i = i0 + u * NT;
        if (i < total) {
          const int r = i / D4, c = i - r * D4;
          fa_st4(Ks + r * LDQ + c * 4, kv[u], 1.0f);
          fa_st4(Vs + r * LDQ + c * 4, vv[u], 1.0f);
        }
      }
    }
    __syncthreads();

    /* S = Q K^T for this warp's 16 rows and SFW column blocks. */
#pragma unroll
    for (int s = 0; s < SFW; s++) {
      const int cb = wc * SFW + s;
      fa_acc sf;
      wmma::fill_fragment(sf, 0.0f);
      for (int k = 0; k < DF; k++) {
        fa_a qa;
        fa_bc kf;
        wmma::load_matrix_sync(qa, Qs + rb * 16 * LDQ + k * 16, LDQ);
        wmma::load_matrix_sync(kf, Ks + cb * 16 * LDQ + k * 16, LDQ);
        wmma::mma_sync(sf, qa, kf, sf);
      }
      wmma::store_matrix_sync(Ss + rb * 16 * LDS + cb * 16, sf, LDS, wmma::mem_row_major);
    }
    __syncthreads();

    /* Online softmax: TPR adjacent lanes per row, columns interleaved. */
    {
      const int r = tid / TPR, g = tid % TPR, p = rp[r], p0 = rp0[r];
      float sv[CPT], mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < CPT; c++) {
        const int col = g + c * TPR, kp = ka + col;
        float s = Ss[r * LDS + col];
        if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
        if (kp < p0 || kp > p) s = -INFINITY;
        sv[c] = s;
        mx = fmaxf(mx, s);
      }
#pragma unroll
      for (int o2 = TPR / 2; o2 > 0; o2 >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
      const float mold = rm[r], mnew = fmaxf(mold, mx);
      const float ms = mnew == -INFINITY ? 0.0f : mnew; /* a row with nothing visible yet */
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < CPT; c++) {
        const half e = __float2half_rn(__expf(sv[c] - ms));
        Ps[r * LDP + g + c * TPR] = e;
        sum += __half2float(e); /* the sum of what P V will add */
      }
#pragma unroll
      for (int o2 = TPR / 2; o2 > 0; o2 >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o2);
      if (g == 0) {
        const float corr = __expf(mold - ms); /* 0 while mold = -inf */
        rc[r] = corr, rl[r] = rl[r] * corr + sum, rm[r] = mnew;
      }
    }
    __syncthreads();

    /* O = O * corr + P V */
    float cf[NE];
#pragma unroll
    for (int i = 0; i < NE; i++) cf[i] = rc[rof[i]];
#pragma unroll
    for (int f = 0; f < NF; f++)
      if (f * WC + wc < DF) {
#pragma unroll
        for (int i = 0; i < NE; i++) o[f].x[i] *= cf[i];
      }
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
      fa_a pa;
      wmma::load_matrix_sync(pa, Ps + rb * 16 * LDP + kk * 16, LDP);
#pragma unroll
      for (int f = 0; f < NF; f++) {
        const int cbk = f * WC + wc;
        if (cbk < DF) {
          fa_br vf;
          wmma::load_matrix_sync(vf, Vs + kk * 16 * LDQ + cbk * 16, LDQ);
          wmma::mma_sync(o[f], pa, vf, o[f]);
        }
      }
    }
  }
  __syncthreads(); /* S becomes the per-warp staging area */

  /* Output rows: normalised (one split) or partials (unnormalised, then max and sum). */
  float *stg = Ss + w * 256;
  float lf[NE];
#pragma unroll
  for (int i = 0; i < NE; i++) {
    const float l = rl[rof[i]];
    lf[i] = nsplit > 1 ? 1.0f : l > 0.0f ? 1.0f / l : 0.0f;
  }
  const int rr = lane >> 1, half8 = (lane & 1) * 8, r = rb * 16 + rr;
  float *dst = NULL;
  if (r < nrows) {
    const int64_t bh = (int64_t)(t0 + r / G) * n_heads + kh * G + r % G;
    dst = nsplit > 1 ? part + (bh * nsplit + split) * (int64_t)(D + 2) : out + bh * (int64_t)D;
  }
#pragma unroll
  for (int f = 0; f < NF; f++) {
    const int cbk = f * WC + wc;
    if (cbk < DF) {
#pragma unroll
      for (int i = 0; i < NE; i++) o[f].x[i] *= lf[i];
      wmma::store_matrix_sync(stg, o[f], 16, wmma::mem_row_major);
      __syncwarp();
      if (dst)
#pragma unroll
        for (int e = 0; e < 8; e++) dst[cbk * 16 + half8 + e] = stg[rr * 16 + half8 + e];
      __syncwarp();
    }
  }
  if (nsplit > 1)
    for (int r2 = tid; r2 < nrows; r2 += NT) {
      const int64_t bh = (int64_t)(t0 + r2 / G) * n_heads + kh * G + r2 % G;
      float *pp = part + (bh * nsplit + split) * (int64_t)(D + 2);
      pp[D] = rm[r2], pp[D + 1] = rl[r2];
    }
}

/* ---- flash prefill, mma.sync (the default for head dims 32, 64, 128, 256) ----
 *
 * The same tiles, splits, masking, numerics (f16 Q pre-scaled, K, V and P; f32 scores,
 * softmax and accumulators) and outputs as k_flash above, but the scores never leave the
 * registers: FM_WARPS warps, each owning 16 rows of a BM = 16 * FM_WARPS row tile, run
 * S = Q K^T with mma.sync m16n8k16 (Q and K fragments by ldmatrix), the online softmax on
 * the accumulator fragments (a thread holds two rows, lanes 4g..4g+3 share them), reuse the
 * rounded probabilities as the A fragments of O += P V (V by ldmatrix.trans), and keep O
 * in registers. Per key tile the block meets twice: K and V of the tile arrive as f32 by
 * cp.async into a staging area while the previous tile is multiplied, then are converted
 * once to f16 (the cache is f32; converting in shared memory costs less than every warp
 * converting its fragments). The row sums l stay per thread (each of a quad's threads sums
 * its columns) and are reduced across the quad once at the end.
 *
 * Shared memory: Q [BM][D+8] and K, V [BK][D+8] halves (16-byte row padding keeps
 * ldmatrix's 8 row addresses in distinct banks), K, V staging [BK][D+4] floats, row
 * positions and the tile's key range. D = 256: 165 KiB, one block per multiprocessor with
 * up to 255 registers a thread (the O fragments alone are 128). */
#define FM_WARPS 8
#define FM_BM (16 * FM_WARPS)

static size_t fm_smem_bytes(int bk, int d) {
  return (size_t)(FM_BM + 2 * bk) * (d + 8) * 2 + (size_t)2 * bk * (d + 4) * 4 + (size_t)FM_BM * 2 * 4 + 16;
}

static __device__ __forceinline__ void fm_ldsm4(uint32_t r[4], const half *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"((unsigned)__cvta_generic_to_shared(p)));
}

static __device__ __forceinline__ void fm_ldsm4t(uint32_t r[4], const half *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"((unsigned)__cvta_generic_to_shared(p)));
}

/* c += a b, m16n8k16, f16 inputs, f32 accumulators */
static __device__ __forceinline__ void fm_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int D, int BK>
static __global__ void __launch_bounds__(32 * FM_WARPS, 1)
    k_flash_mma(float *out, float *part, int nsplit, const float *__restrict__ q, int n_heads, int G,
                int64_t row_floats, int bshift, float scale, int window, float softcap, const int32_t *pos,
                const void *const *const *kb, const void *const *const *vb, const int2 *tiles) {
  constexpr int NT = 32 * FM_WARPS, BM = FM_BM, LDH = D + 8, LDF = D + 4, D4 = D / 4;
  constexpr int SN = BK / 8, ON = D / 8; /* n-tiles of S (keys) and of O (value columns) */
  static_assert(D % 16 == 0 && BK % 16 == 0 && (BK * D4) % NT == 0, "tile shapes");
  extern __shared__ __align__(128) unsigned char fm_sm[];
  half *Qs = (half *)fm_sm, *Ks = Qs + BM * LDH, *Vs = Ks + BK * LDH;
  float *Kf = (float *)(Vs + BK * LDH), *Vf = Kf + BK * LDF;
  int *rp = (int *)(Vf + BK * LDF), *rp0 = rp + BM, *krange = rp0 + BM;

  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int kh = blockIdx.y, split = blockIdx.z;
  const int2 tl = tiles[blockIdx.x];
  const int t0 = tl.x, nrows = G * tl.y;

  fa_rows_load(Qs, LDH, rp, rp0, BM, NT, q, t0, nrows, G, kh, n_heads, D, scale, window, pos);
  __syncthreads();
  if (w == 0) fa_key_range(krange, rp, rp0, nrows, lane);
  __syncthreads();
  const int kmin = krange[0], kmax = krange[1];
  const int ntile = (kmax - kmin) / BK + 1, per = (ntile + nsplit - 1) / nsplit;
  const int jt0 = split * per, jt1 = min(ntile, jt0 + per);
  /* this thread's two rows: 16 w + g and 16 w + g + 8 */
  const int ra = 16 * w + g;
  const int pa = rp[ra], pa0 = rp0[ra], pb = rp[ra + 8], pb0 = rp0[ra + 8];

  const float *const *KT = (const float *const *)kb[t0], *const *VT = (const float *const *)vb[t0];
  const int bmask = (1 << bshift) - 1;
  const int64_t khoff = (int64_t)kh * D;
  /* K and V rows of tile j into the staging area (keys past kmax: zeros) */
  auto stage = [&](int j) {
    const int ka = kmin + j * BK;
#pragma unroll 4
    for (int i = tid; i < BK * D4; i += NT) {
      const int r = i / D4, c = i - r * D4, kp = ka + r;
      float *dk = Kf + r * LDF + 4 * c, *dv = Vf + r * LDF + 4 * c;
      if (kp <= kmax) {
        const int64_t off = (int64_t)(kp & bmask) * row_floats + khoff + 4 * c;
        cuda_cp16(dk, KT[kp >> bshift] + off);
        cuda_cp16(dv, VT[kp >> bshift] + off);
      } else {
        *(float4 *)dk = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        *(float4 *)dv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    cuda_cp_commit();
  };

  float o[ON][4];
#pragma unroll
  for (int n = 0; n < ON; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;
  if (jt0 < jt1) stage(jt0);
  for (int j = jt0; j < jt1; j++) {
    const int ka = kmin + j * BK;
    cuda_cp_wait<0>();
    __syncthreads(); /* staging holds tile j; every warp is done with the f16 K, V of tile j - 1 */
#pragma unroll 4
    for (int i = tid; i < BK * D4; i += NT) {
      const int r = i / D4, c = i - r * D4;
      fa_st4(Ks + r * LDH + 4 * c, *(const float4 *)(Kf + r * LDF + 4 * c), 1.0f);
      fa_st4(Vs + r * LDH + 4 * c, *(const float4 *)(Vf + r * LDF + 4 * c), 1.0f);
    }
    __syncthreads(); /* f16 tile ready; the staging area is free */
    if (j + 1 < jt1) stage(j + 1);
    /* rows of this warp that see some key of the tile (a window or the causal edge can
     * leave a warp's rows nothing here; their softmax then changes nothing) */
    const int kz = ka + BK - 1;
    if (!__any_sync(0xffffffffu, (pa >= ka && pa0 <= kz) || (pb >= ka && pb0 <= kz))) continue;

    float s[SN][4];
#pragma unroll
    for (int n = 0; n < SN; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      uint32_t a[4];
      fm_ldsm4(a, Qs + (16 * w + (lane & 15)) * LDH + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int n = 0; n < SN; n += 2) {
        uint32_t b[4]; /* keys 8n.. (k lo, k hi), keys 8n + 8.. (k lo, k hi) */
        fm_ldsm4(b, Ks + (8 * n + (lane & 7) + (lane >> 4) * 8) * LDH + kk * 16 + ((lane >> 3) & 1) * 8);
        fm_mma(s[n], a, b[0], b[1]);
        fm_mma(s[n + 1], a, b[2], b[3]);
      }
    }
    /* online softmax on the fragments: s[n][0..1] row a, s[n][2..3] row b, key 8n + 2 tq + e */
    float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
    for (int n = 0; n < SN; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int kp = ka + 8 * n + 2 * tq + e;
        float va = s[n][e], vb2 = s[n][2 + e];
        if (softcap > 0.0f) va = softcap * tanhf(va / softcap), vb2 = softcap * tanhf(vb2 / softcap);
        if (kp < pa0 || kp > pa) va = -INFINITY;
        if (kp < pb0 || kp > pb) vb2 = -INFINITY;
        s[n][e] = va, s[n][2 + e] = vb2;
        xa = fmaxf(xa, va), xb = fmaxf(xb, vb2);
      }
    xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
    xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
    xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
    xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
    const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
    const float sa = na == -INFINITY ? 0.0f : na, sb = nb == -INFINITY ? 0.0f : nb; /* nothing visible yet */
    const float ca = __expf(ma - sa), cb = __expf(mb - sb);                           /* 0 while m = -inf */
    ma = na, mb = nb;
    uint32_t pf[SN][2]; /* rounded probabilities, packed as the A fragments of P V */
    float suma = 0.0f, sumb = 0.0f;
#pragma unroll
    for (int n = 0; n < SN; n++) {
      const __half2 ha = __floats2half2_rn(__expf(s[n][0] - sa), __expf(s[n][1] - sa));
      const __half2 hb = __floats2half2_rn(__expf(s[n][2] - sb), __expf(s[n][3] - sb));
      const float2 fa = __half22float2(ha), fb = __half22float2(hb);
      suma += fa.x + fa.y, sumb += fb.x + fb.y; /* the sum of what P V adds */
      pf[n][0] = *(const uint32_t *)&ha, pf[n][1] = *(const uint32_t *)&hb;
    }
    la = la * ca + suma, lb = lb * cb + sumb;
#pragma unroll
    for (int n = 0; n < ON; n++) o[n][0] *= ca, o[n][1] *= ca, o[n][2] *= cb, o[n][3] *= cb;
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
      const uint32_t a[4] = {pf[2 * kk][0], pf[2 * kk][1], pf[2 * kk + 1][0], pf[2 * kk + 1][1]};
#pragma unroll
      for (int n = 0; n < ON; n += 2) {
        uint32_t b[4]; /* keys (lo, hi) of value columns 8n.., then of 8n + 8.. */
        fm_ldsm4t(b, Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDH + 8 * n + (lane >> 4) * 8);
        fm_mma(o[n], a, b[0], b[1]);
        fm_mma(o[n + 1], a, b[2], b[3]);
      }
    }
  }

  /* rows' sums over the quad; outputs normalised (one split) or partials (unnormalised,
   * then max and sum) */
  la += __shfl_xor_sync(0xffffffffu, la, 1);
  la += __shfl_xor_sync(0xffffffffu, la, 2);
  lb += __shfl_xor_sync(0xffffffffu, lb, 1);
  lb += __shfl_xor_sync(0xffffffffu, lb, 2);
#pragma unroll
  for (int half_row = 0; half_row < 2; half_row++) {
    const int r = ra + 8 * half_row;
    if (r >= nrows) continue;
    const float l = half_row ? lb : la, m = half_row ? mb : ma;
    const float f = nsplit > 1 ? 1.0f : l > 0.0f ? 1.0f / l : 0.0f;
    const int64_t bh = (int64_t)(t0 + r / G) * n_heads + kh * G + r % G;
    float *dst = nsplit > 1 ? part + (bh * nsplit + split) * (int64_t)(D + 2) : out + bh * (int64_t)D;
#pragma unroll
    for (int n = 0; n < ON; n++)
      *(float2 *)(dst + 8 * n + 2 * tq) = make_float2(o[n][2 * half_row] * f, o[n][2 * half_row + 1] * f);
    if (nsplit > 1 && tq == 0) dst[D] = m, dst[D + 1] = l;
  }
}

template <int D, int BK>
static void fm_launch(cuda_impl *ci, dim3 grid, size_t smem, float *out, int nsplit, const float *q,
                      const ops_attn_args *a, int bshift, const void *const *const *kd, const void *const *const *vd,
                      const int2 *tiles) {
  const cudaError_t e =
      cudaFuncSetAttribute(k_flash_mma<D, BK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (!cuda_check(ci, e, "flash attention smem")) return;
  cuda_launch(ci, "flash attention", k_flash_mma<D, BK>, grid, 32 * FM_WARPS, smem, out, ci->att_part, nsplit, q,
              a->n_heads, a->n_heads / a->n_kv_heads, a->kv_row_bytes / 4, bshift, a->scale, a->window, a->softcap,
              a->pos, kd, vd, tiles);
}

/* Key tile of the mma.sync kernel by head dim (0: that dim takes the WMMA kernel). */
static int fm_key_tile(int d) { return d == 256 ? 32 : d == 128 || d == 64 || d == 32 ? 64 : 0; }

template <int RB, int WC, int NF, int BK>
static void fa_launch(cuda_impl *ci, dim3 grid, size_t smem, float *out, int nsplit, const float *q,
                      const ops_attn_args *a, int bshift, const void *const *const *kd, const void *const *const *vd,
                      const int2 *tiles) {
  const cudaError_t e =
      cudaFuncSetAttribute(k_flash<RB, WC, NF, BK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (!cuda_check(ci, e, "flash attention smem"))
    return;
  cuda_launch(ci, "flash attention", k_flash<RB, WC, NF, BK>, grid, 32 * RB * WC, smem, out, ci->att_part, nsplit, q,
              a->n_heads, a->n_heads / a->n_kv_heads, a->head_dim, a->kv_row_bytes / 4, bshift, a->scale, a->window,
              a->softcap, a->pos, kd, vd, tiles);
}

/* The flash path when it applies (see the kernel's contract; exact off; at least half of
 * the batch in runs of >= 16 tokens of one sequence, since a short run fills few of a
 * tile's rows and the split-K kernel serves decode better). Returns false to fall back
 * (nothing queued, no error set); true when launched or on a (sticky) error. */
static bool flash_attention(ops_backend *be, float *out, const float *q, const ops_attn_args *a, int bshift,
                            const void *const *const *kd, const void *const *const *vd) {
  cuda_impl *ci = cuda_impl_of(be);
  const int D = a->head_dim, G = a->n_heads / a->n_kv_heads;
  if (ci->exact || a->n < 16 || D % 16 || D < 16 || D > 512 || G > 64 || ((uintptr_t)q & 15)) return false;
  /* f16 Q and K carry 2^-11 relative rounding, so a score's error grows with its size,
   * scale * |q| |k|; exp turns that into a relative error of the attention weight. With the
   * usual 1/sqrt(D) scaling scores stay O(1) (fixtures: <= 3.6e-3 on the logits); models that
   * normalise q and k and use scale 1 (Gemma4) have scores sqrt(D) times larger, and f16 moved
   * their fixtures' logits by up to 1.56. Those keep the f32 kernel. */
  if (a->scale * sqrtf((float)D) > 1.5f) return false;
  int64_t long_tok = 0;
  for (int64_t t0 = 0, t1; t0 < a->n; t0 = t1) {
    for (t1 = t0 + 1; t1 < a->n && a->k_blocks[t1] == a->k_blocks[t0] && a->v_blocks[t1] == a->v_blocks[t0]; t1++) {
    }
    if (t1 - t0 >= 16) long_tok += t1 - t0;
  }
  if (2 * long_tok < a->n) return false;
  /* Config by head dim: rows per tile (16*RB), key tile BK, value column blocks per warp.
   * Two other tilings for head dims <= 256 were measured on the H200 (512 queries over 8k
   * keys, 0.8B shape): 64-row tiles 52.5 TFLOP/s, 64-key tiles 63.0, this one 61.4; within
   * noise of each other or slower, so only this one is built. */
  const int RB = D <= 256 ? 8 : 4, BK = D <= 256 ? 32 : 64;
  /* the mma.sync kernel where it is built (the test hook CUDA_FLASH_WMMA: the WMMA one) */
  const int fbk = ci->flash_variant == CUDA_FLASH_WMMA ? 0 : fm_key_tile(D);
  const int BM = fbk ? FM_BM : 16 * RB, TQ = BM / G;
  const size_t smem = fbk ? fm_smem_bytes(fbk, D) : fa_smem_bytes(BM, BK, D);
  int optin = 0;
  if (!cuda_check(ci, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ci->device),
                  "device attribute"))
    return true;
  const int nsm = ci->n_sm;
  if (smem > (size_t)optin) return false;
  /* Tiles: runs of equal block tables cut into TQ tokens, written straight into the ring. */
  char *th, *tdev;
  if (!cuda_ring_reserve(be, (size_t)a->n * sizeof(int2), &th, &tdev)) return true;
  int2 *tiles = (int2 *)th;
  int ntiles = 0;
  for (int64_t t0 = 0, t1; t0 < a->n; t0 = t1) {
    for (t1 = t0 + 1; t1 < a->n && a->k_blocks[t1] == a->k_blocks[t0] && a->v_blocks[t1] == a->v_blocks[t0]; t1++) {
    }
    for (int64_t s = t0; s < t1; s += TQ) tiles[ntiles++] = make_int2((int)s, (int)(t1 - s < TQ ? t1 - s : TQ));
  }
  cuda_copy_async(ci, tdev, th, (size_t)ntiles * sizeof(int2), cudaMemcpyHostToDevice, "ring copy");
  if (ci->err) return true;
  /* Key splits: the most that keep the grid within two waves of the blocks that fit on the
   * multiprocessors at once (one block of 512 threads: shared memory and registers),
   * so that equal blocks fill whole waves; bounded by the partials scratch. The host cannot
   * see the positions: a short context leaves some splits empty, which cost a block and a
   * partial each. */
  const int64_t base = (int64_t)ntiles * a->n_kv_heads;
  const int64_t target = 2 * (int64_t)(nsm > 0 ? nsm : 132);
  int nsplit = 1;
  if (2 * base <= target && !ci->batch_inv) {
    int64_t ns = target / base;
    if (ns > ATT_SPLIT_CAP) ns = ATT_SPLIT_CAP;
    const int64_t fit = (int64_t)ci->att_part_floats / (a->n * a->n_heads * (int64_t)(D + 2));
    if (ns > fit) ns = fit;
    nsplit = ns < 2 ? 1 : (int)ns;
  }
  dim3 grid((unsigned)ntiles, (unsigned)a->n_kv_heads, (unsigned)nsplit);
  const int2 *td = (const int2 *)tdev;
  if (fbk == 32)
    fm_launch<256, 32>(ci, grid, smem, out, nsplit, q, a, bshift, kd, vd, td);
  else if (fbk)
    D == 128  ? fm_launch<128, 64>(ci, grid, smem, out, nsplit, q, a, bshift, kd, vd, td)
    : D == 64 ? fm_launch<64, 64>(ci, grid, smem, out, nsplit, q, a, bshift, kd, vd, td)
              : fm_launch<32, 64>(ci, grid, smem, out, nsplit, q, a, bshift, kd, vd, td);
  else if (D > 256)
    fa_launch<4, 4, 8, 64>(ci, grid, smem, out, nsplit, q, a, bshift, kd, vd, td);
  else
    D <= 128 ? fa_launch<8, 2, 4, 32>(ci, grid, smem, out, nsplit, q, a, bshift, kd, vd, td)
             : fa_launch<8, 2, 8, 32>(ci, grid, smem, out, nsplit, q, a, bshift, kd, vd, td);
  if (!cuda_check_launch(ci, "flash attention")) return true;
  if (nsplit > 1) {
    cuda_launch_pdl(ci, "attention combine", k_attn_combine,
                (unsigned)(a->n * a->n_heads), ATT_THREADS, 0, out, ci->att_part, nsplit, D);
  }
  return true;
}

/* Batch-invariant mode: which kernel serves a token must not depend on the other tokens of
 * the call. The flash kernel (f16 Q and K) is chosen for a batch whose tokens mostly sit in
 * runs of >= 16 of one sequence, so a prefill chunk mixed with many decode rows would switch
 * kernels with the load. Here the batch is cut into maximal segments of tokens whose runs are
 * all long or all short, and each is attended on its own: a token's kernel then depends only
 * on the length of its own run (the scheduler's chunking, which --deterministic fixes), and
 * every split count above is 1. Returns true when it has launched the segments. */
static bool attention_by_run_class(ops_backend *be, float *out, const float *q, const ops_attn_args *a) {
  int64_t seg0 = 0;
  int seg_long = -1, cut = 0;
  for (int64_t t0 = 0, t1; t0 < a->n; t0 = t1) {
    for (t1 = t0 + 1; t1 < a->n && a->k_blocks[t1] == a->k_blocks[t0] && a->v_blocks[t1] == a->v_blocks[t0]; t1++) {
    }
    const int lng = t1 - t0 >= 16;
    if (seg_long >= 0 && lng != seg_long) cut = 1;
    seg_long = lng;
  }
  if (!cut) return false;
  seg_long = -1;
  for (int64_t t0 = 0, t1; t0 <= a->n; t0 = t1) {
    int lng = -1;
    t1 = t0 + 1;
    if (t0 < a->n) {
      for (; t1 < a->n && a->k_blocks[t1] == a->k_blocks[t0] && a->v_blocks[t1] == a->v_blocks[t0]; t1++) {
      }
      lng = t1 - t0 >= 16;
    }
    if (seg_long >= 0 && lng != seg_long) { /* attend [seg0, t0) */
      ops_attn_args s = *a;
      s.n = t0 - seg0;
      s.pos = a->pos + seg0;
      s.k_blocks = a->k_blocks + seg0;
      s.v_blocks = a->v_blocks + seg0;
      if (a->k_ring) s.k_ring = a->k_ring + seg0;
      if (a->v_ring) s.v_ring = a->v_ring + seg0;
      cuda_op_attention(be, out + seg0 * a->n_heads * a->v_dim, q + seg0 * a->n_heads * a->head_dim, &s);
      seg0 = t0;
    }
    seg_long = lng;
    if (t0 == a->n) break;
  }
  return true;
}

void cuda_op_attention(ops_backend *be, float *out, const float *q, const ops_attn_args *a) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || a->n <= 0) return;
  if (ci->batch_inv && attention_by_run_class(be, out, q, a)) return;
  if (a->v_dim > ATT_THREADS * ATT_MAXC || a->v_dim <= 0 || a->head_dim <= 0 || a->n_kv_heads <= 0 ||
      a->n_heads % a->n_kv_heads != 0 || a->head_dim > 8192) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: attention shape (heads %d/%d, dims %d/%d) not supported", a->n_heads,
              a->n_kv_heads, a->head_dim, a->v_dim);
    return;
  }
  /* Quantized caches and the residual ring only with the tuning key cuda_kv_quant (off:
   * the f32-only behaviour from before those kernels, until they have run on a device). */
  const int quant = a->kv_type != OPS_KV_F32 || (a->residual_len > 0 && a->k_ring);
  const int D = a->head_dim;
  if ((quant && !ci->kv_quant) || a->kv_type < OPS_KV_F32 || a->kv_type > OPS_KV_TQ4 || a->block_len < 1 ||
      (a->block_len & (a->block_len - 1)) || a->kv_row_bytes < (int64_t)a->n_kv_heads * ops_kv_head_bytes(a->kv_type, D) ||
      (!quant && a->kv_row_bytes != (int64_t)a->n_kv_heads * D * 4) || D != a->v_dim ||
      (quant && (D % 32 || D > KQ_THREADS * KQ_MAXC || a->kv_row_bytes % 4 ||
                 (a->kv_type >= OPS_KV_TQ2 && (D & (D - 1))) || (a->residual_len > 0 && a->ring_len <= 0)))) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: attention over a KV cache of type %d (block %d, head dim %d%s) not supported",
              a->kv_type, a->block_len, D, a->residual_len > 0 ? ", residual ring" : "");
    return;
  }
  int bshift = 0;
  while ((1 << bshift) < a->block_len) bshift++;
  const int64_t nbh = a->n * a->n_heads;
  if (nbh > 0x7fffffff) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: attention batch too large");
    return;
  }
  const void *const *const *kd =
      (const void *const *const *)cuda_ring_put(be, a->k_blocks, (size_t)a->n * sizeof(void *));
  const void *const *const *vd =
      (const void *const *const *)cuda_ring_put(be, a->v_blocks, (size_t)a->n * sizeof(void *));
  if (!kd || !vd) return;
  if (quant) {
    const float *const *krd = NULL, *const *vrd = NULL;
    if (a->residual_len > 0) {
      krd = (const float *const *)cuda_ring_put(be, a->k_ring, (size_t)a->n * sizeof(float *));
      vrd = (const float *const *)cuda_ring_put(be, a->v_ring, (size_t)a->n * sizeof(float *));
      if (!krd || !vrd) return;
    }
    attn_kv_launch(ci, out, q, a, bshift, kd, vd, krd, vrd);
    return;
  }
  if (flash_attention(be, out, q, a, bshift, kd, vd)) return;
  const int G = a->n_heads / a->n_kv_heads;
  if (ci->attn_variant != CUDA_ATTN_PER_HEAD && G >= 2 && G <= GQ_MAXG && a->head_dim <= 256 &&
      a->head_dim % 4 == 0 && a->kv_row_bytes % 16 == 0 && a->n * a->n_kv_heads <= 0x7fffffff) {
    /* Grouped queries: blocks of (token, kv head, split). G times fewer blocks per token
     * than the per-head kernel, so more splits: about four blocks per multiprocessor (one
     * block keeps few loads in flight between its barriers; 4 fit by shared memory at
     * D 256), up to ATT_MAX_SPLIT. The kernel gives each split whole tiles of keys, so a
     * short context runs on the first splits and the rest exit at once. */
    const int64_t nbk = a->n * a->n_kv_heads;
    const int64_t target = 4 * (int64_t)(ci->n_sm > 0 ? ci->n_sm : 132);
    int ns = 1;
    if (2 * nbk <= target && !ci->batch_inv) {
      ns = (int)(target / nbk);
      if (ns > ATT_MAX_SPLIT) ns = ATT_MAX_SPLIT;
      if (a->keys_hint > 0) {
        /* no more splits than whole tiles of the keys the batch can see (the rest would be
         * empty blocks and a longer combine), rounded up to a power of two so that a
         * recorded step's grid changes only when the context doubles */
        int64_t keys = a->keys_hint;
        if (a->window > 0 && a->window < keys) keys = a->window;
        const int64_t tiles = (keys + GQ_TILE - 1) / GQ_TILE;
        int p2 = 1;
        while (p2 < tiles && p2 < ns) p2 <<= 1;
        if (p2 < ns) ns = p2;
      }
      const int64_t fit = (int64_t)ci->att_part_floats / (nbh * (a->v_dim + 2));
      if (ns > fit) ns = (int)fit;
      if (ns < 2) ns = 1;
    }
    const size_t smem = sizeof(float) * ((size_t)GQ_MAXG * a->head_dim + (size_t)GQ_TILE * (a->head_dim + 4) +
                                         (size_t)GQ_MAXG * GQ_TILE);
    cuda_launch_pdl(ci, "attention gqa", k_attention_gqa, dim3((unsigned)nbk, (unsigned)ns), GQ_THREADS, smem, out,
                    ci->att_part, ns, q, a->n_heads, a->n_kv_heads, a->head_dim, a->kv_row_bytes / 4, bshift,
                    a->scale, a->window, a->softcap, a->pos, kd, vd);
    if (ci->err || ns == 1) return;
    cuda_launch_pdl(ci, "attention combine", k_attn_combine, (unsigned)nbh, ATT_THREADS, 0, out, ci->att_part, ns,
                    a->v_dim);
    return;
  }
  /* Split the keys when (token, head) pairs alone cannot fill the GPU: about two blocks
   * per multiprocessor, bounded by the partials scratch. Splits past a sequence's length
   * are empty and cost one block each. */
  int nsplit = 1;
  if (nbh < 256 && !ci->batch_inv) {
    nsplit = (int)(264 / nbh);
    if (nsplit > ATT_SPLIT_CAP) nsplit = ATT_SPLIT_CAP;
    const int64_t fit = (int64_t)ci->att_part_floats / (nbh * (a->v_dim + 2));
    if (nsplit > fit) nsplit = (int)fit;
    if (nsplit < 2) nsplit = 1;
  }
  dim3 grid((unsigned)nbh, (unsigned)nsplit);
  cuda_launch_pdl(ci, "attention", k_attention, grid, ATT_THREADS, (size_t)a->head_dim * sizeof(float), out,
                  ci->att_part, nsplit, q, a->n_heads, a->n_kv_heads, a->head_dim, a->v_dim, a->kv_row_bytes / 4,
                  bshift, a->scale, a->window, a->softcap, a->pos, kd, vd);
  if (ci->err) return;
  if (nsplit > 1) {
    cuda_launch_pdl(ci, "attention combine", k_attn_combine, (unsigned)nbh, ATT_THREADS, 0, out,
                ci->att_part, nsplit, a->v_dim);
  }
}
