/* cuda_async.cuh: asynchronous global -> shared copies (cp.async, sm_80+) as inline PTX, for
 * the kernels that stage tiles through shared memory (flash attention, the chunked delta
 * rule, the int8 and MoE GEMMs). Static inline device code only.
 *
 * Contract: a thread's copies become visible to itself once a cuda_cp_wait retires their
 * group, and to the block after a __syncthreads that follows the wait. Groups are what
 * cuda_cp_commit closes; cuda_cp_wait<N> waits until at most the N newest remain in flight.
 * Written as PTX because <cuda_pipeline.h> drags in headers that fail the host compiler's
 * -Wshadow -Werror. Devices before sm_80 (PTX JIT of the f32 kernels) copy synchronously and
 * commit / wait do nothing. */
#ifndef ANNA_BACKENDS_CUDA_ASYNC_CUH
#define ANNA_BACKENDS_CUDA_ASYNC_CUH

/* 4 bytes, through L1 (.ca): the scalar copies of rows that are not 16-byte aligned. */
static __device__ __forceinline__ void cuda_cp4(void *dst, const void *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)
               : "memory");
#else
  *(float *)dst = *(const float *)src;
#endif
}

/* 16 bytes (both addresses 16-byte aligned), bypassing L1 (.cg). */
static __device__ __forceinline__ void cuda_cp16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)
               : "memory");
#else
  *(float4 *)dst = *(const float4 *)src;
#endif
}

/* 16 bytes of which the first src_bytes come from src and the rest are zeros (src_bytes 0:
 * src is not read, but must still be a valid global address). */
static __device__ __forceinline__ void cuda_cp16_zfill(void *dst, const void *src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(src_bytes)
               : "memory");
#else
  for (int i = 0; i < 16; i++) ((unsigned char *)dst)[i] = i < src_bytes ? ((const unsigned char *)src)[i] : 0;
#endif
}

static __device__ __forceinline__ void cuda_cp_commit(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N> static __device__ __forceinline__ void cuda_cp_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

#endif
