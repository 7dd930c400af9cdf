/* cpu_deq_avx512.h: AVX-512 decoding of one 32-element Q8_0 or Q4_0 block (an f16 scale d,
 * then 32 int8 codes / 16 bytes of nibble pairs) to 32 floats, d * small integer: exact in
 * f32, the same values as quant_dequantize_row.
 *
 * Shared by the weight dequantizer (cpu_matmul.c, the --exact path) and the KV-cache record
 * decoder (cpu_attn.c: q8/q4 cache records are these blocks). Callers compile the call site
 * with at least CPU_DEQ_AVX512_TARGET and run it only when cpu_isa_level() == 2. */
#ifndef ANNA_BACKENDS_CPU_DEQ_AVX512_H
#define ANNA_BACKENDS_CPU_DEQ_AVX512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define CPU_DEQ_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

CPU_DEQ_AVX512_TARGET static inline void cpu_deq_q8_0_block_avx512(const uint8_t *b, float *y) {
  uint16_t hd;
  memcpy(&hd, b, 2);
  const __m512 d = _mm512_set1_ps(_cvtsh_ss(hd));
  const __m128i *qs = (const __m128i *)(b + 2);
  _mm512_storeu_ps(y, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(qs)))));
  _mm512_storeu_ps(y + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(qs + 1)))));
}

/* Q4_0: element i < 16 is the low nibble of byte i, element 16 + i its high nibble; minus 8. */
CPU_DEQ_AVX512_TARGET static inline void cpu_deq_q4_0_block_avx512(const uint8_t *b, float *y) {
  uint16_t hd;
  memcpy(&hd, b, 2);
  const __m512 d = _mm512_set1_ps(_cvtsh_ss(hd));
  const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2))), eight = _mm512_set1_epi32(8);
  const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(q, _mm512_set1_epi32(15)), eight);
  const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(q, 4), eight);
  _mm512_storeu_ps(y, _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo)));
  _mm512_storeu_ps(y + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi)));
}

#endif
