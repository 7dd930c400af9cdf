/* cuda_kv.cu: the kv_store op on the GPU, KV-cache writes in every ops_kv_type, producing
 * the bytes cpu_kv_store writes (tests/cuda test_cuda_kv.c compares them for every format
 * and head dims 64..512). One block per (row, head) record; the record's values are staged
 * in shared memory, where the TurboQuant rotation runs (kv_rotate_rows, the CPU's
 * butterflies). Reductions that decide bytes keep the CPU's order: the Q8/Q4 block maxima
 * are taken by one thread per 32-value block in index order, and the TurboQuant sum of
 * squares by one thread in double in index order (a tree would round differently); at
 * head dims up to 1024 that serial part is small next to a layer's other work. Exposed to
 * the backend table only when the tuning key cuda_kv_quant is on (cuda_backend.cu). */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_kv.cuh"
#include "backends/cuda/cuda_math.cuh"

#include "base/error.h"

#define KVS_THREADS 128

static __global__ void __launch_bounds__(KVS_THREADS)
    k_kv_store(uint8_t *const *dst, const float *__restrict__ src, int n_heads, int D, int kvt, int64_t hb) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  extern __shared__ float kvs_r[]; /* [D] values, then [D] codes (TurboQuant) */
  const int64_t rec = blockIdx.x, row = rec / n_heads;
  const int h = (int)(rec - row * n_heads), tid = threadIdx.x;
  const float *x = src + rec * (int64_t)D;
  uint8_t *out = dst[row] + (int64_t)h * hb;
  if (kvt == OPS_KV_F32) {
    for (int i = tid; i < D; i += KVS_THREADS) ((float *)out)[i] = x[i];
    return;
  }
  if (kvt == OPS_KV_F16) {
    for (int i = tid; i < D; i += KVS_THREADS) ((uint16_t *)out)[i] = kv_f32_to_f16(x[i]);
    return;
  }
  if (kvt == OPS_KV_Q8) { /* quant_quantize_row_q8_0: d = amax / 127, codes lrintf(x * 127 / amax) */
    for (int b = tid; b < D / 32; b += KVS_THREADS) {
      const float *v = x + 32 * b;
      float amax = 0.0f;
      for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
      const float d = __fdiv_rn(amax, 127.0f), id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
      uint8_t *blk = out + 34 * b;
      const uint16_t hd = kv_f32_to_f16(d);
      blk[0] = (uint8_t)(hd & 0xff), blk[1] = (uint8_t)(hd >> 8);
      for (int j = 0; j < 32; j++) {
        int q = __float2int_rn(__fmul_rn(v[j], id));
        q = q < -128 ? -128 : q > 127 ? 127 : q; /* the AVX-512 writer saturates; |q| <= 127 anyway */
        blk[2 + j] = (uint8_t)(int8_t)q;
      }
    }
    return;
  }
  if (kvt == OPS_KV_Q4) { /* cpu_kv.c quantize_q4_0: d = (first largest-magnitude value) / -8 */
    for (int b = tid; b < D / 32; b += KVS_THREADS) {
      const float *v = x + 32 * b;
      float amax = 0.0f, mx = 0.0f;
      for (int j = 0; j < 32; j++)
        if (fabsf(v[j]) > amax) amax = fabsf(v[j]), mx = v[j];
      const float d = __fdiv_rn(mx, -8.0f), id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
      uint8_t *blk = out + 18 * b;
      const uint16_t hd = kv_f32_to_f16(d);
      blk[0] = (uint8_t)(hd & 0xff), blk[1] = (uint8_t)(hd >> 8);
      for (int j = 0; j < 16; j++) {
        int q0 = __float2int_rz(__fadd_rn(__fmul_rn(v[j], id), 8.5f));
        int q1 = __float2int_rz(__fadd_rn(__fmul_rn(v[j + 16], id), 8.5f));
        q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
        q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
        blk[2 + j] = (uint8_t)(q0 | (q1 << 4));
      }
    }
    return;
  }
  /* TurboQuant: rotate, s = rms of the rotated values, nearest Lloyd-Max level of r / s. */
  float *r = kvs_r;
  int *code = (int *)(kvs_r + D);
  for (int i = tid; i < D; i += KVS_THREADS) r[i] = x[i];
  __syncthreads();
  kv_rotate_rows(r, 1, D, D, 1);
  __shared__ float s_sh;
  if (tid == 0) {
    double ss = 0.0;
    for (int i = 0; i < D; i++) ss = __dadd_rn(ss, __dmul_rn((double)r[i], (double)r[i]));
    s_sh = __double2float_rn(__dsqrt_rn(__ddiv_rn(ss, (double)D)));
  }
  __syncthreads();
  const float s = s_sh, inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
  const int bits = kv_tq_bits(kvt), nl = 1 << bits;
  for (int i = tid; i < D; i += KVS_THREADS) {
    const float z = __fmul_rn(r[i], inv);
    int c = 0; /* levels ascend: step past every midpoint below z */
    while (c + 1 < nl && z > __fmul_rn(0.5f, __fadd_rn(kv_tq_level(bits, c), kv_tq_level(bits, c + 1)))) c++;
    code[i] = c;
  }
  __syncthreads();
  if (tid == 0) *(float *)out = s;
  const int nbytes = (D * bits + 7) / 8;
  for (int k = tid; k < nbytes; k += KVS_THREADS) { /* byte k: the codes whose bits overlap it */
    int v = 0;
    for (int i = 8 * k / bits; i < D && i * bits < 8 * k + 8; i++) {
      const int sh = i * bits - 8 * k;
      v |= sh >= 0 ? code[i] << sh : code[i] >> -sh;
    }
    out[4 + k] = (uint8_t)(v & 0xff);
  }
}

void cuda_op_kv_store(ops_backend *be, void *const *dst, const float *src, int64_t rows, int n_heads, int head_dim,
                      int kv_type) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || rows <= 0) return;
  if (kv_type < OPS_KV_F32 || kv_type > OPS_KV_TQ4 || n_heads <= 0 || head_dim <= 0 ||
      (kv_type != OPS_KV_F32 && head_dim % 32) ||
      (kv_type >= OPS_KV_TQ2 && (head_dim > KV_TQ_MAX_DIM || (head_dim & (head_dim - 1))))) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: kv_store of type %d, head dim %d not supported", kv_type, head_dim);
    return;
  }
  const int64_t recs = rows * n_heads;
  if (recs > 0x7fffffff) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: kv_store of %lld records", (long long)recs);
    return;
  }
  uint8_t *const *dd = (uint8_t *const *)cuda_ring_put(be, dst, (size_t)rows * sizeof(void *));
  if (!dd) return;
  const size_t smem = kv_type >= OPS_KV_TQ2 ? (size_t)head_dim * (sizeof(float) + sizeof(int)) : 0;
  cuda_launch_pdl(ci, "kv_store", k_kv_store, (unsigned)recs, KVS_THREADS, smem, dd, src, n_heads, head_dim, kv_type,
                  ops_kv_head_bytes(kv_type, head_dim));
}
