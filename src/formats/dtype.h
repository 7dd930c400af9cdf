/* dtype.h: element types of tensors, numbered exactly as GGUF numbers them.
 *
 * The enum values are the on-disk GGUF type ids (ggml_type), so a type read from a file is
 * converted by a range check plus dtype_block_size(t) > 0, never by a lookup table. Ids that
 * llama.cpp retired (4, 5, 31-33, 36-38) are not enum values; dtype_block_size returns 0 for
 * them and for anything >= ANNA_DTYPE_COUNT, which is how callers reject unknown types.
 *
 * Quantized types store blocks of dtype_block_size(t) elements in dtype_block_bytes(t)
 * bytes; a row of n elements must hold whole blocks. All helpers are pure, header-only and
 * thread-safe; dtype_name returns a static string (borrowed, never NULL).
 */
#ifndef ANNA_FORMATS_DTYPE_H
#define ANNA_FORMATS_DTYPE_H

#include <stdint.h>

enum anna_dtype {
  ANNA_DTYPE_F32 = 0,
  ANNA_DTYPE_F16 = 1,
  ANNA_DTYPE_Q4_0 = 2,
  ANNA_DTYPE_Q4_1 = 3,
  ANNA_DTYPE_Q5_0 = 6,
  ANNA_DTYPE_Q5_1 = 7,
  ANNA_DTYPE_Q8_0 = 8,
  ANNA_DTYPE_Q8_1 = 9,
  ANNA_DTYPE_Q2_K = 10,
  ANNA_DTYPE_Q3_K = 11,
  ANNA_DTYPE_Q4_K = 12,
  ANNA_DTYPE_Q5_K = 13,
  ANNA_DTYPE_Q6_K = 14,
  ANNA_DTYPE_Q8_K = 15,
  ANNA_DTYPE_IQ2_XXS = 16,
  ANNA_DTYPE_IQ2_XS = 17,
  ANNA_DTYPE_IQ3_XXS = 18,
  ANNA_DTYPE_IQ1_S = 19,
  ANNA_DTYPE_IQ4_NL = 20,
  ANNA_DTYPE_IQ3_S = 21,
  ANNA_DTYPE_IQ2_S = 22,
  ANNA_DTYPE_IQ4_XS = 23,
  ANNA_DTYPE_I8 = 24,
  ANNA_DTYPE_I16 = 25,
  ANNA_DTYPE_I32 = 26,
  ANNA_DTYPE_I64 = 27,
  ANNA_DTYPE_F64 = 28,
  ANNA_DTYPE_IQ1_M = 29,
  ANNA_DTYPE_BF16 = 30,
  ANNA_DTYPE_TQ1_0 = 34,
  ANNA_DTYPE_TQ2_0 = 35,
  ANNA_DTYPE_MXFP4 = 39,
  ANNA_DTYPE_COUNT = 40, /* one past the largest id; not a type */
};

/* Static name as llama.cpp prints it ("Q4_K", "F16"); "?" for an unknown id. */
static inline const char *dtype_name(int t) {
  switch (t) {
  case ANNA_DTYPE_F32: return "F32";
  case ANNA_DTYPE_F16: return "F16";
  case ANNA_DTYPE_Q4_0: return "Q4_0";
  case ANNA_DTYPE_Q4_1: return "Q4_1";
  case ANNA_DTYPE_Q5_0: return "Q5_0";
  case ANNA_DTYPE_Q5_1: return "Q5_1";
  case ANNA_DTYPE_Q8_0: return "Q8_0";
  case ANNA_DTYPE_Q8_1: return "Q8_1";
  case ANNA_DTYPE_Q2_K: return "Q2_K";
  case ANNA_DTYPE_Q3_K: return "Q3_K";
  case ANNA_DTYPE_Q4_K: return "Q4_K";
  case ANNA_DTYPE_Q5_K: return "Q5_K";
  case ANNA_DTYPE_Q6_K: return "Q6_K";
  case ANNA_DTYPE_Q8_K: return "Q8_K";
  case ANNA_DTYPE_IQ2_XXS: return "IQ2_XXS";
  case ANNA_DTYPE_IQ2_XS: return "IQ2_XS";
  case ANNA_DTYPE_IQ3_XXS: return "IQ3_XXS";
  case ANNA_DTYPE_IQ1_S: return "IQ1_S";
  case ANNA_DTYPE_IQ4_NL: return "IQ4_NL";
  case ANNA_DTYPE_IQ3_S: return "IQ3_S";
  case ANNA_DTYPE_IQ2_S: return "IQ2_S";
  case ANNA_DTYPE_IQ4_XS: return "IQ4_XS";
  case ANNA_DTYPE_I8: return "I8";
  case ANNA_DTYPE_I16: return "I16";
  case ANNA_DTYPE_I32: return "I32";
  case ANNA_DTYPE_I64: return "I64";
  case ANNA_DTYPE_F64: return "F64";
  case ANNA_DTYPE_IQ1_M: return "IQ1_M";
  case ANNA_DTYPE_BF16: return "BF16";
  case ANNA_DTYPE_TQ1_0: return "TQ1_0";
  case ANNA_DTYPE_TQ2_0: return "TQ2_0";
  case ANNA_DTYPE_MXFP4: return "MXFP4";
  default: return "?";
  }
}

/* Elements per block (1 for plain types); 0 for an unknown id. */
static inline int64_t dtype_block_size(int t) {
  switch (t) {
  case ANNA_DTYPE_F32: case ANNA_DTYPE_F16: case ANNA_DTYPE_BF16: case ANNA_DTYPE_F64:
  case ANNA_DTYPE_I8: case ANNA_DTYPE_I16: case ANNA_DTYPE_I32: case ANNA_DTYPE_I64:
    return 1;
  case ANNA_DTYPE_Q4_0: case ANNA_DTYPE_Q4_1: case ANNA_DTYPE_Q5_0: case ANNA_DTYPE_Q5_1:
  case ANNA_DTYPE_Q8_0: case ANNA_DTYPE_Q8_1: case ANNA_DTYPE_IQ4_NL: case ANNA_DTYPE_MXFP4:
    return 32;
  case ANNA_DTYPE_Q2_K: case ANNA_DTYPE_Q3_K: case ANNA_DTYPE_Q4_K: case ANNA_DTYPE_Q5_K:
  case ANNA_DTYPE_Q6_K: case ANNA_DTYPE_Q8_K: case ANNA_DTYPE_IQ2_XXS: case ANNA_DTYPE_IQ2_XS:
  case ANNA_DTYPE_IQ3_XXS: case ANNA_DTYPE_IQ1_S: case ANNA_DTYPE_IQ3_S: case ANNA_DTYPE_IQ2_S:
  case ANNA_DTYPE_IQ4_XS: case ANNA_DTYPE_IQ1_M: case ANNA_DTYPE_TQ1_0: case ANNA_DTYPE_TQ2_0:
    return 256;
  default: return 0;
  }
}

/* Bytes per block (per element for plain types); 0 for an unknown id. */
static inline int64_t dtype_block_bytes(int t) {
  switch (t) {
  case ANNA_DTYPE_F32: return 4;
  case ANNA_DTYPE_F16: return 2;
  case ANNA_DTYPE_BF16: return 2;
  case ANNA_DTYPE_F64: return 8;
  case ANNA_DTYPE_I8: return 1;
  case ANNA_DTYPE_I16: return 2;
  case ANNA_DTYPE_I32: return 4;
  case ANNA_DTYPE_I64: return 8;
  case ANNA_DTYPE_Q4_0: return 18;    /* f16 d, 16 nibble bytes */
  case ANNA_DTYPE_Q4_1: return 20;    /* f16 d, f16 m, 16 */
  case ANNA_DTYPE_Q5_0: return 22;    /* f16 d, u32 qh, 16 */
  case ANNA_DTYPE_Q5_1: return 24;    /* f16 d, f16 m, u32 qh, 16 */
  case ANNA_DTYPE_Q8_0: return 34;    /* f16 d, 32 int8 */
  case ANNA_DTYPE_Q8_1: return 36;    /* f16 d, f16 s, 32 int8 */
  case ANNA_DTYPE_IQ4_NL: return 18;  /* f16 d, 16 nibble bytes */
  case ANNA_DTYPE_MXFP4: return 17;   /* e8m0 e, 16 nibble bytes */
  case ANNA_DTYPE_Q2_K: return 84;    /* 16 scales, 64 qs, f16 d, f16 dmin */
  case ANNA_DTYPE_Q3_K: return 110;   /* 32 hmask, 64 qs, 12 scales, f16 d */
  case ANNA_DTYPE_Q4_K: return 144;   /* f16 d, f16 dmin, 12 scales, 128 qs */
  case ANNA_DTYPE_Q5_K: return 176;   /* f16 d, f16 dmin, 12 scales, 32 qh, 128 qs */
  case ANNA_DTYPE_Q6_K: return 210;   /* 128 ql, 64 qh, 16 scales, f16 d */
  case ANNA_DTYPE_Q8_K: return 292;   /* f32 d, 256 int8, 16 int16 sums */
  case ANNA_DTYPE_IQ2_XXS: return 66; /* f16 d, 32 u16 */
  case ANNA_DTYPE_IQ2_XS: return 74;  /* f16 d, 32 u16, 8 scales */
  case ANNA_DTYPE_IQ3_XXS: return 98; /* f16 d, 96 */
  case ANNA_DTYPE_IQ1_S: return 50;   /* f16 d, 32 qs, 8 u16 qh */
  case ANNA_DTYPE_IQ3_S: return 110;  /* f16 d, 64 qs, 8 qh, 32 signs, 4 scales */
  case ANNA_DTYPE_IQ2_S: return 82;   /* f16 d, 64 qs, 8 qh, 8 scales */
  case ANNA_DTYPE_IQ4_XS: return 136; /* f16 d, u16 scales_h, 4 scales_l, 128 qs */
  case ANNA_DTYPE_IQ1_M: return 56;   /* 32 qs, 16 qh, 8 scales (d inside scales) */
  case ANNA_DTYPE_TQ1_0: return 54;   /* 48 qs, 4 qh, f16 d */
  case ANNA_DTYPE_TQ2_0: return 66;   /* 64 qs, f16 d */
  default: return 0;
  }
}

/* Byte offsets of the f16 scale fields (d first, then dmin / m / s) inside one block of a
 * block type: their count (0..2) in off[0..count). 0 for blocks without one (MXFP4's e8m0,
 * Q8_K's f32 d, IQ1_M's d packed into its scales); -1 for plain and unknown types. For tests
 * and tools that build well-formed blocks from random bytes. */
static inline int dtype_f16_fields(int t, int off[2]) {
  switch (t) {
  case ANNA_DTYPE_Q4_1: case ANNA_DTYPE_Q5_1: case ANNA_DTYPE_Q8_1: case ANNA_DTYPE_Q4_K: case ANNA_DTYPE_Q5_K:
    off[0] = 0, off[1] = 2;
    return 2;
  case ANNA_DTYPE_Q2_K: off[0] = 80, off[1] = 82; return 2;
  case ANNA_DTYPE_Q3_K: off[0] = 108; return 1;
  case ANNA_DTYPE_Q6_K: off[0] = 208; return 1;
  case ANNA_DTYPE_TQ1_0: off[0] = 52; return 1;
  case ANNA_DTYPE_TQ2_0: off[0] = 64; return 1;
  case ANNA_DTYPE_MXFP4: case ANNA_DTYPE_Q8_K: case ANNA_DTYPE_IQ1_M: return 0;
  case ANNA_DTYPE_Q4_0: case ANNA_DTYPE_Q5_0: case ANNA_DTYPE_Q8_0: case ANNA_DTYPE_IQ4_NL: case ANNA_DTYPE_IQ4_XS:
  case ANNA_DTYPE_IQ2_XXS: case ANNA_DTYPE_IQ2_XS: case ANNA_DTYPE_IQ3_XXS: case ANNA_DTYPE_IQ1_S:
  case ANNA_DTYPE_IQ3_S: case ANNA_DTYPE_IQ2_S:
    off[0] = 0;
    return 1;
  default: return -1;
  }
}

/* Bytes of a row of n elements; -1 when the type is unknown, n < 0, or n is not a whole
 * number of blocks. n is bounded by the caller's data, so the product cannot overflow for
 * any n that fits a file (n / block * bytes <= n * 4.5). */
static inline int64_t dtype_row_bytes(int t, int64_t n) {
  int64_t bs = dtype_block_size(t);
  if (bs <= 0 || n < 0 || n % bs != 0) return -1;
  if (n / bs > INT64_MAX / 300) return -1;
  return n / bs * dtype_block_bytes(t);
}

#endif
