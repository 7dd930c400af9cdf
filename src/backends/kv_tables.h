/* kv_tables.h: the constants of the quantized KV-cache formats (ops_kv_type, ops/ops.h),
 * one source for the CPU encoder/decoder (cpu_kv.c, cpu_attn.c) and the CUDA kernels
 * (cuda_kv.cu, cuda_attn.cu), which must produce and read the same bytes.
 *
 * Record layouts (one head vector of d values; d a multiple of 32, a power of two for TQ):
 *   F16:  d IEEE halves (round to nearest even; out of range: inf; NaN: quiet NaN with the
 *         sign, payload dropped; quant_f32_to_f16).
 *   Q8:   d/32 blocks of {f16 d = amax/127, 32 int8 round-half-even(x * 127/amax)} (Q8_0).
 *   Q4:   d/32 blocks of {f16 d = m / -8 (m: the first element of largest magnitude), 16
 *         bytes: element j < 16 in the low nibble of byte j, j + 16 in its high nibble, code
 *         = clamp(trunc(x / d + 8.5), 0, 15)} (llama.cpp's Q4_0 reference rounding).
 *   TQ<b>: f32 s = sqrt(mean(r^2)) (the sum in double, in index order), then d codes of b
 *         bits packed LSB first (code i at bit i*b, crossing byte boundaries), where r is x
 *         rotated: r = H(sign * x) / sqrt(d), H the unnormalised Walsh-Hadamard transform in
 *         the butterfly order of kv_fwht below; code = the nearest Lloyd-Max level of r/s
 *         (compared with the midpoints of adjacent levels, computed in f32).
 * Plain data and macros: the CUDA side places the levels in __constant__ memory from the
 * same initialisers. Nothing here allocates or fails. */
#ifndef ANNA_BACKENDS_KV_TABLES_H
#define ANNA_BACKENDS_KV_TABLES_H

#include "ops/ops.h"

#include <stdint.h>

#ifdef __CUDACC__
#define KV_HD __host__ __device__
#else
#define KV_HD
#endif

/* Lloyd-Max reconstruction levels of a unit Gaussian (Max, 1960), for 2, 3 and 4 bits,
 * ascending (the encoder's midpoint search depends on the order). */
#define KV_TQ2_LEVELS {-1.5104f, -0.4528f, 0.4528f, 1.5104f}
#define KV_TQ3_LEVELS {-2.1520f, -1.3440f, -0.7560f, -0.2451f, 0.2451f, 0.7560f, 1.3440f, 2.1520f}
#define KV_TQ4_LEVELS                                                                                                 \
  {-2.7326f, -2.0690f, -1.6181f, -1.2562f, -0.9424f, -0.6568f, -0.3881f, -0.1284f,                                    \
   0.1284f,  0.3881f,  0.6568f,  0.9424f,  1.2562f,  1.6181f,  2.0690f,  2.7326f}

/* Largest TurboQuant head dim (the encoders rotate in a stack buffer of this many floats). */
#define KV_TQ_MAX_DIM 1024

/* Bits per code of a TurboQuant type. */
static inline KV_HD int kv_tq_bits(int type) {
  return type == OPS_KV_TQ2 ? 2 : type == OPS_KV_TQ3 ? 3 : 4;
}

/* The random signs of the rotation: a fixed hash of the coordinate index, so every backend
 * and every run uses the same rotation. */
static inline KV_HD float kv_tq_sign(int i) {
  uint32_t h = (uint32_t)i * 0x9E3779B1u;
  h ^= h >> 15;
  h *= 0x85EBCA77u;
  h ^= h >> 13;
  return (h & 1) ? -1.0f : 1.0f;
}

/* Code i (b bits) of a TurboQuant record's code bytes. */
static inline KV_HD int kv_tq_code(const uint8_t *codes, int i, int bits) {
  const int bit = i * bits;
  int c = codes[bit >> 3] >> (bit & 7);
  if ((bit & 7) + bits > 8) c |= codes[(bit >> 3) + 1] << (8 - (bit & 7));
  return c & ((1 << bits) - 1);
}

#endif
