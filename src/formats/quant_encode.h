/* quant_encode.h: f32 / bf16 rows -> llama.cpp block formats (Q4_K, Q5_0, Q6_K, Q8_0).
 *
 * The encoders are ports of ggml's reference quantizers (quantize_row_<type>_ref in
 * ggml-quants.c, what ggml_quantize_chunk runs without an importance matrix) and produce the
 * same bytes for the same input: same search, same float operation order, same f16 rounding.
 * That identity needs the translation unit compiled without floating-point contraction
 * (the build passes -ffp-contract=off for it), as ggml-base is built for baseline x86-64.
 * bench/ggml_quant_check.sh compares against the real ggml; tests/formats/test_quant_encode.c
 * against a golden of its output.
 *
 * Thread-safe, no allocation, no global state. n is the number of elements of the row and
 * must be a whole number of the type's blocks (quant_encode_row checks; the per-type
 * functions assume it). Non-finite inputs give whatever ggml gives (garbage in, garbage out).
 */
#ifndef ANNA_FORMATS_QUANT_ENCODE_H
#define ANNA_FORMATS_QUANT_ENCODE_H

#include <stddef.h>
#include <stdint.h>

/* dst: n/32 * 34 bytes. */
void quant_encode_q8_0(const float *x, void *dst, int64_t n);
/* dst: n/32 * 22 bytes. */
void quant_encode_q5_0(const float *x, void *dst, int64_t n);
/* dst: n/256 * 144 bytes. */
void quant_encode_q4_k(const float *x, void *dst, int64_t n);
/* dst: n/256 * 210 bytes. */
void quant_encode_q6_k(const float *x, void *dst, int64_t n);

/* True when quant_encode_row can produce type (the four above plus F32, F16, BF16). */
int quant_encode_supported(int type);

/* Encodes one row of n floats as type into dst (dtype_row_bytes(type, n) bytes, caller-owned).
 * 0, ANNA_EINVAL (n not a whole number of blocks) or ANNA_EUNSUPPORTED. */
int quant_encode_row(int type, const float *x, void *dst, int64_t n);

/* bf16 -> f32 for a row (exact). */
void quant_encode_bf16_to_f32(const uint16_t *src, float *dst, int64_t n);

/* ggml's GGML_FP32_TO_FP16 (round to nearest even; NaN -> 0x7e00). */
uint16_t quant_encode_f16(float f);

#endif
