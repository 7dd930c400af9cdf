/* cpu_backend.h: the reference backend: every op of ops.h on host memory, multithreaded
 * over a caller-owned threadpool.
 *
 * Scratch: each worker gets scratch_floats_per_thread floats, allocated once here; ops
 * never allocate. Weights of any dtype are read in place (bf16/f16/f32 converted on the
 * fly; quantized types through src/formats/quant.h).
 */
#ifndef ANNA_BACKENDS_CPU_H
#define ANNA_BACKENDS_CPU_H

#include "backends/registry.h"
#include "base/threadpool.h"
#include "ops/ops.h"

/* tp is borrowed and must outlive the backend. act_bytes: room for the quantized
 * activations of the largest matmul input (n_batch rows of the widest weight row; 4 bytes
 * per element always suffices). Caller frees with cpu_backend_free. */
int cpu_backend_create(ops_backend **out, threadpool *tp, int64_t scratch_floats_per_thread,
                       size_t act_bytes, char *err, size_t errlen);
void cpu_backend_free(ops_backend *be);

/* The registry's constructor (backends/registry.h): uses p->tp, or creates a pool of
 * p->n_threads workers that the backend owns; sizes the per-thread scratch for p->shape
 * (cpu_backend_scratch_floats) and the activation buffer for p->n_batch rows of its widest
 * weight; applies p->exact_matmul. Caller frees with (*out)->destroy (= cpu_backend_free). */
int cpu_backend_create_params(const backend_params *p, ops_backend **out, char *err, size_t errlen);

/* Per-thread scratch floats every op needs for a model of this shape: the prefill matmul
 * tiles, the chunked delta rule's 64-token chunk, attention of every layer. */
int64_t cpu_backend_scratch_floats(const ops_model_shape *s);

/* Per-thread scratch floats the prefill matmul tiles need for rows of max_cols. */
int64_t cpu_matmul_scratch_floats(int64_t max_cols);

/* Per-thread scratch floats attention needs for these head counts and head dim (v_dim <=
 * head_dim; with less scratch the op takes fewer query rows per work item). */
int64_t cpu_attention_scratch_floats(int n_heads, int n_kv_heads, int head_dim);

/* Matmul numerics for quantized weights. Default (off): llama.cpp's, activations quantized
 * to 8 bits exactly as ggml-cpu does (Q8_0/Q8_1/Q8_K, formats/quant.h) and integer block
 * dots. On: exact, weights dequantized and multiplied with f32 activations (slower; matches
 * a float64 evaluation of the file to f32 rounding). f32/f16/bf16 weights are f32 math
 * either way. */
void cpu_backend_set_exact_matmul(ops_backend *be, int on);

/* Which SIMD path matmul uses ("avx512", "avx2", "scalar"); for logs and tests. */
const char *cpu_backend_isa(void);
/* Forces a path for tests (0 scalar, 1 avx2, 2 avx512); clamped to what the CPU has. */
void cpu_backend_force_isa(int level);

#endif
