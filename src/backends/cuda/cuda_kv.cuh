/* cuda_kv.cuh: device side of the quantized KV-cache formats (ops_kv_type; layouts and
 * constants in backends/kv_tables.h), shared by cuda_kv.cu (kv_store: encoding, byte for
 * byte what cpu_kv_encode writes) and cuda_attn.cu (decoding inside the attention kernels,
 * value for value what cpu_kv_decode returns). Every operation that rounds is spelled with
 * an explicit _rn intrinsic so that nvcc cannot contract it into an FMA (the CPU reference
 * is compiled as ISO C11, which does not contract either). Included by .cu files only;
 * the levels are per-translation-unit __constant__ copies of the shared initialisers. */
#ifndef ANNA_BACKENDS_CUDA_KV_CUH
#define ANNA_BACKENDS_CUDA_KV_CUH

#include "backends/kv_tables.h"

#include <cuda_fp16.h>
#include <stdint.h>

static __constant__ float kv_c_tq2[4] = KV_TQ2_LEVELS;
static __constant__ float kv_c_tq3[8] = KV_TQ3_LEVELS;
static __constant__ float kv_c_tq4[16] = KV_TQ4_LEVELS;

static __device__ __forceinline__ float kv_tq_level(int bits, int c) {
  return bits == 2 ? kv_c_tq2[c] : bits == 3 ? kv_c_tq3[c] : kv_c_tq4[c];
}

/* quant_f32_to_f16 (formats/quant.c), bit for bit: round to nearest even, >= 65520 -> inf,
 * NaN -> quiet NaN with the sign (payload dropped; __float2half_rn would keep a canonical
 * NaN instead), subnormal halves rounded in units of 2^-24. */
static __device__ __forceinline__ uint16_t kv_f32_to_f16(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (ax < 0x38800000u) return (uint16_t)(sign | (uint16_t)__float2int_rn(__fmul_rn(__uint_as_float(ax), 16777216.0f)));
  const uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
  return (uint16_t)(sign | ((r - (112u << 23)) >> 13));
}

static __device__ __forceinline__ float kv_f16_to_f32(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

/* Values 4*c4 .. 4*c4 + 3 of a record of type kvt (not F32: the callers read f32 records
 * with vector loads), as cpu_kv_decode gives them (TurboQuant: in the rotated space). The
 * record is 4-byte aligned (record sizes are multiples of 4 for head dims that are
 * multiples of 32); Q8/Q4 blocks are 2-byte aligned, so their codes are read bytewise. */
static __device__ __forceinline__ float4 kv_ld4(int kvt, const uint8_t *__restrict__ rec, int c4) {
  float v[4];
  if (kvt == OPS_KV_F16) {
    const uint2 u = *(const uint2 *)(rec + 8 * c4);
    v[0] = kv_f16_to_f32((uint16_t)(u.x & 0xffffu)), v[1] = kv_f16_to_f32((uint16_t)(u.x >> 16));
    v[2] = kv_f16_to_f32((uint16_t)(u.y & 0xffffu)), v[3] = kv_f16_to_f32((uint16_t)(u.y >> 16));
  } else if (kvt == OPS_KV_Q8) {
    const uint8_t *b = rec + 34 * (c4 >> 3);
    const float d = kv_f16_to_f32((uint16_t)(b[0] | (b[1] << 8)));
    const int8_t *q = (const int8_t *)(b + 2 + 4 * (c4 & 7));
#pragma unroll
    for (int e = 0; e < 4; e++) v[e] = __fmul_rn(d, (float)q[e]);
  } else if (kvt == OPS_KV_Q4) {
    const uint8_t *b = rec + 18 * (c4 >> 3);
    const float d = kv_f16_to_f32((uint16_t)(b[0] | (b[1] << 8)));
    const int j0 = 4 * (c4 & 7); /* elements j0..j0+3 of the block: low nibbles below 16, high above */
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int j = j0 + e, byte = b[2 + (j & 15)];
      v[e] = __fmul_rn(d, (float)((j < 16 ? byte & 15 : byte >> 4) - 8));
    }
  } else { /* TQ2..4 */
    const int bits = kv_tq_bits(kvt);
    const float s = *(const float *)rec;
#pragma unroll
    for (int e = 0; e < 4; e++) v[e] = __fmul_rn(s, kv_tq_level(bits, kv_tq_code(rec + 4, 4 * c4 + e, bits)));
  }
  return make_float4(v[0], v[1], v[2], v[3]);
}

/* In-place rotation of rows of shared memory, as cpu_kv_rotate (dir = 1: sign, H, 1/sqrt(d))
 * or cpu_kv_unrotate (dir = -1: H, then 1/sqrt(d) * sign), with the same butterflies in the
 * same stage order, so the results are bit for bit the CPU's. rows x d floats at x with row
 * stride ld; d a power of two. All threads of the block call it (it synchronises); the
 * data must be visible (a barrier before the call). */
static __device__ void kv_rotate_rows(float *x, int rows, int d, int ld, int dir) {
  const int nt = blockDim.x, tid = threadIdx.x;
  const float s = __fdiv_rn(1.0f, __fsqrt_rn((float)d));
  if (dir > 0) {
    for (int i = tid; i < rows * d; i += nt) {
      const int r = i / d, j = i - r * d;
      x[r * ld + j] = __fmul_rn(x[r * ld + j], kv_tq_sign(j));
    }
    __syncthreads();
  }
  const int half = d >> 1;
  for (int len = 1; len < d; len <<= 1) {
    for (int i = tid; i < rows * half; i += nt) {
      const int r = i / half, p = i - r * half, j = (p / len) * 2 * len + p % len;
      float *row = x + r * ld;
      const float a = row[j], b = row[j + len];
      row[j] = __fadd_rn(a, b);
      row[j + len] = __fsub_rn(a, b);
    }
    __syncthreads();
  }
  for (int i = tid; i < rows * d; i += nt) {
    const int r = i / d, j = i - r * d;
    x[r * ld + j] = dir > 0 ? __fmul_rn(x[r * ld + j], s) : __fmul_rn(x[r * ld + j], __fmul_rn(s, kv_tq_sign(j)));
  }
  __syncthreads();
}

#endif
