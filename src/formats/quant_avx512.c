/* quant_avx512.c: AVX-512 (F/BW/VL + VNNI) dot kernels; see quant_avx2.c. */
#include "formats/quant_impl.h"

void quant_avx512_fill(quant_dot_fn t[ANNA_DTYPE_COUNT]) { (void)t; }
