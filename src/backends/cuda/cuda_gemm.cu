/* cuda_gemm.cu: prefill GEMMs on tensor cores (the default, non-exact numerics).
 *
 * y[n, rows] = x[n, cols] W^T for batches above the matvec range, by cuBLAS on bf16 tensor
 * cores with f32 accumulation and f32 output:
 *   activations   for bf16 weights split once into two bf16 matrices, hi = bf16(x) and
 *                 lo = bf16(x - hi), and multiplied twice (y = W hi + W lo): 16 significant
 *                 bits instead of bf16's 8. Rounding x to plain bf16 moved the fixtures'
 *                 logits by up to 2.2 (on a logit spread of 0.9: tiny random models amplify
 *                 it); the split keeps them within f32 summation-order noise, for twice the
 *                 tensor-core work. For quantized weights rounded once (hi only, one
 *                 product): their dequantized tiles are rounded to bf16 anyway (below), so
 *                 the activations' rounding is an error of the same size (cuda_gemm_split);
 *   bf16 weights  used in place (the device mirror): exact;
 *   quantized     dequantized tile by tile (as many rows as the 64 MiB scratch holds) to
 *                 bf16: q * d keeps 8 of its up to 15 significant bits (2^-9 relative, far
 *                 below the format's own quantization error);
 *   f32 and f16 weights stay on the exact f32 SGEMM (cuda_matmul.cu): rare in matmuls.
  *   CUDA_GEMM_BF16_SINGLE (--dtype bf16) multiplies the hi half only for bf16 weights too
 *                 (an opt-in for speed); CUDA_GEMM_BF16_SPLIT (a test hook) the split for
 *                 every type.
 * --exact (cuda_impl.exact) sends everything to the f32 SGEMM. */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_quant.cuh"

#include "base/error.h"

#include <cuda_bf16.h>

/* x -> hi = bf16(x), lo = bf16(x - hi) (lo NULL: hi only, for the one-product GEMMs); four at
 * a time when x is 16-byte aligned (vec). */
static __global__ void k_split_act(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *x, int64_t count, int vec) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x, t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    const int64_t n4 = count / 4;
    for (int64_t i = t; i < n4; i += stride) {
      const float4 v = ((const float4 *)x)[i];
      const __nv_bfloat162 h0 = __floats2bfloat162_rn(v.x, v.y), h1 = __floats2bfloat162_rn(v.z, v.w);
      ((__nv_bfloat162 *)hi)[2 * i] = h0;
      ((__nv_bfloat162 *)hi)[2 * i + 1] = h1;
      if (!lo) continue;
      const float2 f0 = __bfloat1622float2(h0), f1 = __bfloat1622float2(h1);
      ((__nv_bfloat162 *)lo)[2 * i] = __floats2bfloat162_rn(v.x - f0.x, v.y - f0.y);
      ((__nv_bfloat162 *)lo)[2 * i + 1] = __floats2bfloat162_rn(v.z - f1.x, v.w - f1.y);
    }
    done = n4 * 4;
  }
  for (int64_t j = done + t; j < count; j += stride) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x[j]);
    hi[j] = h;
    if (lo) lo[j] = __float2bfloat16_rn(x[j] - __bfloat162float(h));
  }
}

/* Rows [0, m) of a quantized W to bf16 dst[m, cols]; one thread per 32-element unit, the
 * units of a row on consecutive threads so a warp's stores are contiguous. */
static __global__ void k_dequant_bf16(__nv_bfloat16 *dst, const uint8_t *W, int64_t m, int64_t cols,
                                      int64_t row_bytes, int type) {
  const int64_t units = cols / 32;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m * units; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / units, u = i % units;
    float w[32];
    cuda_deq32(type, W + r * row_bytes, u, w);
    uint4 *o = (uint4 *)(dst + r * cols + u * 32); /* 64-byte aligned: cols % 32 == 0 */
#pragma unroll
    for (int q = 0; q < 4; q++) {
      __nv_bfloat162 h[4];
#pragma unroll
      for (int e = 0; e < 4; e++) h[e] = __floats2bfloat162_rn(w[q * 8 + 2 * e], w[q * 8 + 2 * e + 1]);
      o[q] = *(const uint4 *)h;
    }
  }
}

static unsigned grid_of(int64_t items) {
  int64_t b = (items + 255) / 256;
  return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

/* The activation scratch, grown on demand. Only batches above the matvec range come here
 * and those are never recorded into a graph, so a (rare) cudaMalloc is allowed. */
static void *act_scratch(cuda_impl *ci, size_t bytes) {
  if (bytes <= ci->act16_bytes) return ci->act16;
  if (ci->recording) {
    cuda_fail(ci, ANNA_ESTATE, "cuda: GEMM scratch cannot grow inside a recorded step");
    return NULL;
  }
  if (ci->act16) cudaFree(ci->act16);
  ci->act16 = NULL;
  ci->act16_bytes = 0;
  size_t want = bytes < ((size_t)8 << 20) ? ((size_t)8 << 20) : bytes;
  cudaError_t e = cudaMalloc(&ci->act16, want);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    ci->act16 = NULL;
    cuda_fail(ci, e == cudaErrorMemoryAllocation ? ANNA_ENOMEM : ANNA_EIO,
              "cuda: GEMM activation scratch (%zu bytes): %s", want, cudaGetErrorString(e));
    return NULL;
  }
  ci->act16_bytes = want;
  return ci->act16;
}

bool cuda_gemm_tc(ops_backend *be, float *y, const float *x, int64_t n, const ops_weight *w, const uint8_t *W,
                  int64_t rb) {
  cuda_impl *ci = cuda_impl_of(be);
  const bool quant = cuda_quant_supported(w->type);
  /* cuBLAS's bf16 kernels want 16-byte aligned rows (cols % 8; an odd width failed with
   * CUBLAS_STATUS_INTERNAL_ERROR on the H200): other widths take the f32 path. */
  if (ci->exact || w->cols % 8 != 0 || (w->type != ANNA_DTYPE_BF16 && !(quant && w->cols % 32 == 0))) return false;
  if (w->type == ANNA_DTYPE_BF16 && ((uintptr_t)W & 15) != 0) return false;
  if (w->cols > 0x7fffffff || n > 0x7fffffff || w->rows > 0x7fffffff) return false;
  const int64_t count = n * w->cols, lo_at = (count + 127) / 128 * 128; /* lo 256-byte aligned */
  __nv_bfloat16 *hi = (__nv_bfloat16 *)act_scratch(ci, (size_t)(lo_at + count) * sizeof(__nv_bfloat16));
  if (!hi) return true; /* sticky error set */
  const bool split = cuda_gemm_split(ci, w->type);
  __nv_bfloat16 *lo = split ? hi + lo_at : NULL;
  const int vec = ((uintptr_t)x & 15) == 0;
  cuda_launch(ci, "split activations", k_split_act, grid_of(vec ? count / 4 + 1 : count), 256, 0, hi, lo, x, count,
              vec);
  if (ci->err) return true;
  const float one = 1.0f, zero = 0.0f;
  const int k = (int)w->cols;
  int64_t tile = w->rows;
  if (quant) {
    tile = (int64_t)(ci->gemm_tile_bytes / 2) / w->cols; /* bf16 rows within the tile bytes (<= the scratch) */
    tile = tile > 128 ? tile / 128 * 128 : 128;
    if ((size_t)tile * (size_t)w->cols > ci->deq_floats * 2) tile = (int64_t)(ci->deq_floats * 2) / w->cols;
    if (tile < 1) {
      cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: matmul of %lld columns exceeds the GEMM tile", (long long)w->cols);
      return true;
    }
    if (tile > w->rows) tile = w->rows;
  }
  for (int64_t r0 = 0; r0 < w->rows; r0 += tile) {
    const int64_t m = w->rows - r0 < tile ? w->rows - r0 : tile;
    const void *A = W + r0 * rb;
    if (quant) {
      cuda_launch(ci, "dequant bf16", k_dequant_bf16,
                  grid_of(m * (w->cols / 32)), 256, 0, (__nv_bfloat16 *)ci->deq, W + r0 * rb, m, w->cols, rb, w->type);
      if (ci->err) return true;
      A = ci->deq;
    }
    /* Column-major view, as the f32 path: C(m x n, ldc rows) = A(k x m)^T B(k x n); the lo
     * product accumulates onto the hi one (beta 1); hi only when cuda_gemm_split says so. */
    const int parts = split ? 2 : 1;
    for (int part = 0; part < parts; part++) {
      cublasStatus_t s = cublasGemmEx(ci->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, k, &one, A, CUDA_R_16BF, k,
                                      part ? lo : hi, CUDA_R_16BF, k, part ? &one : &zero, y + r0, CUDA_R_32F,
                                      (int)w->rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (s != CUBLAS_STATUS_SUCCESS) {
        cuda_fail(ci, ANNA_EIO, "cuda: cublasGemmEx (bf16) failed (status %d)", (int)s);
        return true;
      }
    }
  }
  return true;
}
