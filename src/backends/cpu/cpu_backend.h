/* cpu_backend.h: the reference backend: every op of ops.h on host memory, multithreaded
 * over a caller-owned threadpool.
 *
 * Scratch: each worker gets scratch_floats_per_thread floats, allocated once here; ops
 * never allocate. Weights of any dtype are read in place (bf16/f16/f32 converted on the
 * fly; quantized types through src/formats/quant.h).
 */
#ifndef ANNA_BACKENDS_CPU_H
#define ANNA_BACKENDS_CPU_H

#include "base/threadpool.h"
#include "ops/ops.h"

/* tp is borrowed and must outlive the backend. act_bytes: room for the quantized
 * activations of the largest matmul input (n_batch rows of the widest weight row; 4 bytes
 * per element always suffices). Caller frees with cpu_backend_free. */
int cpu_backend_create(ops_backend **out, threadpool *tp, int64_t scratch_floats_per_thread,
                       size_t act_bytes, char *err, size_t errlen);
void cpu_backend_free(ops_backend *be);

/* Per-thread scratch floats the prefill matmul tiles need for rows of max_cols. */
int64_t cpu_matmul_scratch_floats(int64_t max_cols);

/* Per-thread scratch floats attention needs for these head counts and head dim (v_dim <=
 * head_dim; with less scratch the op takes fewer query rows per work item). */
int64_t cpu_attention_scratch_floats(int n_heads, int n_kv_heads, int head_dim);

/* Opt-in: prefill matmuls of Q8_0/Q5_0/Q4_0 weights with 8-bit activations (llama.cpp's
 * numerics; ~2x faster prefill) instead of the exact f32 tiles. */
void cpu_backend_set_int8_prefill(ops_backend *be, int on);
int64_t cpu_matmul_i8_scratch_floats(int64_t max_cols);

/* Which SIMD path matmul uses ("avx512", "avx2", "scalar"); for logs and tests. */
const char *cpu_backend_isa(void);
/* Forces a path for tests (0 scalar, 1 avx2, 2 avx512); clamped to what the CPU has. */
void cpu_backend_force_isa(int level);

#endif
