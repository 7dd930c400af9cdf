/* quant.h: llama.cpp block quantization formats: dequantize, activation quantization,
 * quantized dot products and a row-range matmul core.
 *
 * Weights stay in their file format (rows of whole blocks, usually borrowed from a GGUF
 * mapping). Products are computed as llama.cpp does: the activation row is quantized once
 * to 8 bits in the format the weight type pairs with (quant_act_type: Q8_0 for 32-element
 * block types, Q8_1 for Q4_1/Q5_1, Q8_K for 256-element K- and i-quants, plain f32 for
 * F32/F16/BF16; the quantizers match ggml-cpu's x86 ones value for value), and each
 * weight row is dotted against it in integer arithmetic with one float scale per block.
 *
 * Kernels exist per instruction set (scalar reference, AVX2, AVX-512 VNNI); the best one the
 * CPU supports is chosen on first use. Types without a SIMD kernel use the next lower ISA.
 * Nothing here allocates except quant_matmul when called without scratch; all functions
 * are thread-safe (the ISA choice is a process-wide setting meant for tests and benches).
 */
#ifndef ANNA_FORMATS_QUANT_H
#define ANNA_FORMATS_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "formats/dtype.h"

enum quant_isa {
  QUANT_ISA_SCALAR = 0,
  QUANT_ISA_AVX2 = 1,   /* avx2 + fma + f16c */
  QUANT_ISA_AVX512 = 2, /* avx512f/bw/vl + vnni */
  QUANT_ISA_COUNT = 3,
};

/* True when quant_dequantize_row handles type. */
bool quant_can_dequantize(int type);
/* True when quant_vec_dot / quant_matmul handle type (dequantizable and not an activation
 * or integer type). */
bool quant_can_dot(int type);

/* Activation format paired with a weight type, as ggml's vec_dot_type: ANNA_DTYPE_Q8_0
 * (32-element block types), ANNA_DTYPE_Q8_1 (Q4_1, Q5_1), ANNA_DTYPE_Q8_K (K- and
 * i-quants) or ANNA_DTYPE_F32 (f32/f16/bf16 weights: anna keeps f32 activations); -1 when
 * the type cannot be dotted. */
int quant_act_type(int wtype);
/* Bytes of one quantized activation row of n elements for weight type wtype; -1 if n is
 * not a whole number of the weight's blocks or the type cannot be dotted. */
int64_t quant_act_row_bytes(int wtype, int64_t n);

/* src: n elements of type (n a multiple of its block size). dst: n floats (caller-owned).
 * Returns 0, ANNA_EINVAL (bad n) or ANNA_EUNSUPPORTED. */
int quant_dequantize_row(int type, const void *src, float *dst, int64_t n);

/* x: n floats; dst: n/32 blocks_q8_0 (34 bytes each) / n/256 blocks_q8_k (292 bytes).
 * n must be a multiple of 32 / 256 (checked by the callers that take untrusted n). */
void quant_quantize_row_q8_0(const float *x, void *dst, int64_t n);
void quant_quantize_row_q8_k(const float *x, void *dst, int64_t n);
/* Q8_1 (36-byte blocks: f16 d, f16 s = d * sum(q), 32 int8), paired with Q4_1/Q5_1. */
void quant_quantize_row_q8_1(const float *x, void *dst, int64_t n);
/* Quantizes x (n floats) into dst (quant_act_row_bytes(wtype, n) bytes) in the format
 * wtype pairs with (F32: a copy). Returns 0 or ANNA_EINVAL. */
int quant_quantize_act(int wtype, const float *x, void *dst, int64_t n);

/* Dot of one weight row (n elements of type, borrowed) with one activation row already in
 * quant_act_type(type) format. n must be a whole number of blocks (not re-checked here:
 * this is the inner loop). Uses the current ISA. */
float quant_vec_dot(int type, int64_t n, const void *w_row, const void *act);
/* Same with an explicit ISA (tests); falls back to a lower ISA for types without a kernel. */
float quant_vec_dot_isa(int isa, int type, int64_t n, const void *w_row, const void *act);

/* Best ISA this CPU supports, and the one currently used. */
int quant_isa_best(void);
int quant_isa_get(void);
/* Forces an ISA for subsequent calls; ANNA_EUNSUPPORTED if the CPU lacks it. */
int quant_isa_set(int isa, char *err, size_t errlen);
const char *quant_isa_name(int isa);

/* Single-threaded core: y[t*ldy + r] = dot(W row r, act row t) for r in [r0, r1), t in
 * [0, n_tok). W: rows of cols elements of type (row stride dtype_row_bytes(type, cols));
 * act: n_tok rows already quantized with quant_quantize_act (stride quant_act_row_bytes).
 * A caller's thread pool splits [0, rows) into disjoint ranges over the same act. */
void quant_matmul_rows(int type, const void *W, int64_t cols, int64_t r0, int64_t r1,
                       const void *act, int64_t n_tok, float *y, int64_t ldy);

/* y[n_tok, rows] = x[n_tok, cols] * W[rows, cols]^T. scratch: n_tok *
 * quant_act_row_bytes(type, cols) bytes (caller-owned) or NULL to allocate internally.
 * Returns 0, ANNA_EINVAL / ANNA_EUNSUPPORTED (message in err) or ANNA_ENOMEM. */
int quant_matmul(int type, const void *W, int64_t rows, int64_t cols, const float *x,
                 int64_t n_tok, float *y, void *scratch, char *err, size_t errlen);
/* quant_matmul with n_tok = 1. */
int quant_matvec(int type, const void *W, int64_t rows, int64_t cols, const float *x, float *y,
                 void *scratch, char *err, size_t errlen);

/* IEEE half / bfloat16 conversions used by the formats. */
float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f);
float quant_bf16_to_f32(uint16_t h);

#endif
