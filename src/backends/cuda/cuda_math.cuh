/* cuda_math.cuh: small device helpers shared by the CUDA op files (static inline device
 * code only): warp and block sums, the sigmoid and the activation functions of the FFNs. */
#ifndef ANNA_BACKENDS_CUDA_MATH_CUH
#define ANNA_BACKENDS_CUDA_MATH_CUH

/* Sum over the 32 lanes of a warp; every lane gets the result (all lanes must call). */
static __device__ __forceinline__ float cuda_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* The decode-sized RMSNorm (k_rmsnorm4, cuda_elem.cu): CUDA_RN4_V float4 of the row per
 * thread, cuda_rn4_threads(d4) threads (a multiple of 32), each summing the squares of its
 * float4 i, i + threads, ... with cuda_rn4_ss, then cuda_block_sum. A kernel that folds the
 * norm in (the routed plain matvec group) reproduces these steps for the same bits. */
#define CUDA_RN4_V 4
static __host__ __device__ __forceinline__ int cuda_rn4_threads(int d4) {
  const int th = (d4 + CUDA_RN4_V - 1) / CUDA_RN4_V;
  return th < 32 ? 32 : (th + 31) / 32 * 32;
}
static __device__ __forceinline__ float cuda_rn4_ss(float ss, float4 v) {
  return ss + (v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
}

/* Sum over the block (blockDim a multiple of 32, <= 1024); every thread gets the result.
 * Also a block barrier: writes to shared memory before the call are visible after it. Safe
 * to call repeatedly (its scratch is released by the last barrier). */
static __device__ __forceinline__ float cuda_block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  v = cuda_warp_sum(v);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  if (lane == 0) part[wid] = v;
  __syncthreads();
  if (wid == 0) {
    float s = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0f;
    s = cuda_warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const float r = total;
  __syncthreads();
  return r;
}

/* Entry of a kernel launched by cuda_launch_pdl: waits until the kernel before it in the
 * graph has finished and its writes are visible (griddepcontrol.wait), then lets the next
 * one launch (launch_dependents), so at most one kernel waits ahead. No-ops for an ordinary
 * launch and before sm_90. */
static __device__ __forceinline__ void cuda_pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* The logistic function of mul_sigmoid, shared with the gated epilogue of the int8 matvec
 * (cuda_op_act_matmul_gated_add), which must give the same bits. */
static __device__ __forceinline__ float cuda_sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

static __device__ __forceinline__ float cuda_silu(float x) {
  return x / (1.0f + expf(-x));
}

static __device__ __forceinline__ float cuda_gelu_tanh(float x) {
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

#endif
