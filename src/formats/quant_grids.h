/* quant_grids.h: lookup tables of the llama.cpp i-quant formats, generated into
 * quant_grids.c by scripts/gen_quant_testdata.py from the gguf Python package. Read-only
 * globals; each row of a grid is the decoded (unsigned or ternary) values of one index. */
#ifndef ANNA_FORMATS_QUANT_GRIDS_H
#define ANNA_FORMATS_QUANT_GRIDS_H

#include <stdint.h>

extern const uint8_t quant_grid_iq2xxs[256][8]; /* values 8, 25, 43 */
extern const uint8_t quant_grid_iq2xs[512][8];
extern const uint8_t quant_grid_iq2s[1024][8];
extern const uint8_t quant_grid_iq3xxs[256][4]; /* values 4..62 */
extern const uint8_t quant_grid_iq3s[512][4];   /* values 1..15 */
extern const int8_t quant_grid_iq1s[2048][8];   /* values -1, 0, 1 (IQ1_S and IQ1_M) */
extern const uint8_t quant_ksigns[128]; /* 7 sign bits -> 8 with even parity (bit 7) */
extern const int8_t quant_kvalues_iq4nl[16];

#endif
