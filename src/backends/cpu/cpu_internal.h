/* cpu_internal.h: shared between the CPU backend's files; not a public interface. */
#ifndef ANNA_BACKENDS_CPU_INTERNAL_H
#define ANNA_BACKENDS_CPU_INTERNAL_H

#include "backends/cpu/cpu_backend.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef struct cpu_impl {
  threadpool *tp;
  threadpool *own_tp;        /* tp when this backend created it (freed with the backend) */
  float *scratch;            /* nth * per_thread floats */
  int64_t scratch_per_thread;
  void *act;                 /* quantized activations, or transposed panels (prefill) */
  size_t act_bytes;
  int exact_matmul;          /* quantized weights x f32 activations (default: 8-bit activations, as llama.cpp) */
} cpu_impl;

static inline float *cpu_scratch(ops_backend *be, int ith) {
  cpu_impl *c = be->impl;
  return c->scratch + (int64_t)ith * c->scratch_per_thread;
}

/* f32 dot product (AVX-512 when the build targets it; attention and GDN inner loops). */
static inline float cpu_dot_f32(const float *a, const float *b, int n) {
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  float s = _mm512_reduce_add_ps(acc);
  for (; i < n; i++) s += a[i] * b[i];
  return s;
#else
  float s = 0;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
#endif
}

static inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

void cpu_matmul(ops_backend *be, float *y, const float *x, int64_t n, const ops_weight *w,
                const float *bias);
void cpu_matmul_group(ops_backend *be, int count, float *const *ys, const float *x, int64_t n,
                      const ops_weight *const *ws, const float *const *biases);
void cpu_embed(ops_backend *be, float *out, const ops_weight *table, const int32_t *ids, int64_t n,
               float scale);
/* Converts row r of w into dst[cols] f32 (any supported dtype). */
void cpu_weight_row_f32(const ops_weight *w, int64_t r, float *dst);
/* KV-cache formats (cpu_kv.c). */
void cpu_kv_encode(int type, const float *x, int d, uint8_t *rec);
void cpu_kv_decode(int type, const uint8_t *rec, int d, float *y);
void cpu_kv_rotate(float *x, int d);
/* The 2^bits reconstruction levels of a TurboQuant type (unit scale). */
const float *cpu_kv_tq_levels(int type);
void cpu_kv_unrotate(float *x, int d);
void cpu_kv_store(ops_backend *be, void *const *dst, const float *src, int64_t rows, int n_heads, int head_dim,
                  int kv_type);
/* Sets the encoder ops (layer_norm, gelu, attention_seg, embed_bag: cpu_vision.c). */
void cpu_vision_ops_install(ops_backend *be);
/* Sets the audio encoder ops (im2col_3x3s2: cpu_audio.c). */
void cpu_audio_ops_install(ops_backend *be);
/* The attention op (cpu_attn.c). */
void cpu_attention(ops_backend *be, float *out, const float *q, const ops_attn_args *a);
void cpu_gdn_chunked(ops_backend *be, const ops_gdn_args *a);
void cpu_gdn_recurrent(ops_backend *be, const ops_gdn_args *a);
int cpu_isa_level(void);
/* AVX-512 VNNI paths may run: the CPU has them and the ISA level in use is AVX-512 (tests
 * force lower levels with cpu_backend_force_isa to cover every path). */
int cpu_vnni_usable(void);
/* Per-thread scratch floats the prefill matmul tile needs for rows of max_cols. */
int64_t cpu_matmul_scratch_floats(int64_t max_cols);
/* Tiled GEMM for quantized weights with 8-bit activations (cpu_qgemm.c: AVX-512 VNNI or
 * AVX2).
 * cpu_qgemm_usable: the CPU and ISA level allow it for this weight type. cpu_qgemm: runs
 * y = x W^T (+ bias) and returns 1, or returns 0 without touching y when the backend's
 * scratch or act buffer is too small for n x cols (the caller then uses the row dots). */
int cpu_qgemm_usable(int type);
int cpu_qgemm(ops_backend *be, float *y, const float *x, int64_t n, const ops_weight *w, const float *bias);
int64_t cpu_qgemm_scratch_floats(int64_t max_cols);
size_t cpu_qgemm_act_bytes(int64_t n, int64_t cols, int n_threads);

/* Fills the waveform decoder ops of the table (cpu_conv.c). */
void cpu_conv_fill(ops_backend *be);

#endif
