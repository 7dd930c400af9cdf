/* test_cuda_decode.cu: the CUDA weight decoders (backends/cuda/cuda_quant.cuh) run on the host
 * against the CPU dequantizer (quant_dequantize_row), on random well-formed rows (random bytes,
 * every f16 field a random finite half) of every type the CUDA backend decodes. The decoders
 * are __host__ __device__ with host twins of their intrinsics, and this test makes no CUDA
 * runtime call: it needs no GPU and no driver, so CI runs it wherever nvcc compiled it.
 * Checks, bit for bit (the host build has no fp contraction, like the CPU reference):
 *  - cuda_deq32 per 32-element unit, rows at every byte offset mod 16; cuda_deq32_q4k_wide on
 *    16-byte aligned rows;
 *  - cuda_piece_load + cuda_piece_decode for every piece: sc * w - mn at the piece's element
 *    positions, which must cover the row exactly once; rows at every offset the piece kernels
 *    accept (cuda_matmul.cu piece_ok: 2-byte aligned, 8 for IQ4_XS, 16 for Q4_K/Q5_K; the 2- and
 *    3-bit i-quants 2-byte aligned);
 *  - cuda_piece_load + cuda_q8_decode: the int8 words, read as dp4a reads them (signed
 *    bytes), rebuild each weight with the kernel's offsets (Q4_0: q - 8, Q6_K: q - 32, IQ4:
 *    lo + hi of the two words) at the element cuda_q8_e0 and the activation order
 *    (cuda_q8_interleaved) give, and cover the row exactly once;
 *  - no piece load leaves the row: loads are seen through CUDA_QUANT_HOST_LOAD and must lie in
 *    [row & ~3, row end) (the last piece's `last` flag), and every row ends at most 15 bytes
 *    before a PROT_NONE page, so a byte-wise or wide read past it crashes the test.
 * Also pc_h2f / ldh against quant_f16_to_f32 on all 65536 halves, and cuda_ldw on F32/F16/BF16.
 * Usage: test_cuda_decode [FIXTURES_DIR] (unused). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

extern "C" {
#include "formats/quant.h"
}

/* Piece loads of the row under test must lie in [g_lo, g_hi). */
static const uint8_t *g_lo, *g_hi;
static int64_t g_loads, g_oob;
__attribute__((unused)) static void test_load_seen(const void *p, size_t n) {
  const uint8_t *b = (const uint8_t *)p;
  g_loads++;
  if (b < g_lo || b + n > g_hi) g_oob++;
}
#define CUDA_QUANT_HOST_LOAD(p, bytes) test_load_seen((p), (bytes))
#include "backends/cuda/cuda_quant.cuh"

static int g_fail;
static int64_t g_checks;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return g_rng;
}

/* Counts a failure; prints the first few (a broken decoder fails thousands of elements). */
static void fail(const char *fmt, ...) {
  if (g_fail++ < 30) {
    va_list ap;
    va_start(ap, fmt);
    printf("  FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
  }
}

static bool same_bits(float a, float b) {
  uint32_t x, y;
  memcpy(&x, &a, 4);
  memcpy(&y, &b, 4);
  return x == y;
}

static uint16_t rand_half(void) {
  for (;;) {
    const uint16_t h = (uint16_t)rnd();
    if ((h & 0x7c00) != 0x7c00) return h;
  }
}

/* A random well-formed row of nb blocks of type t at row. */
static void rand_row(int t, uint8_t *row, int64_t nb) {
  const int64_t bb = dtype_block_bytes(t);
  for (int64_t i = 0; i < nb * bb; i++) row[i] = (uint8_t)rnd();
  int off[2];
  const int nh = dtype_f16_fields(t, off);
  for (int64_t b = 0; b < nb; b++)
    for (int k = 0; k < nh; k++) {
      const uint16_t h = rand_half();
      row[b * bb + off[k]] = (uint8_t)h, row[b * bb + off[k] + 1] = (uint8_t)(h >> 8);
    }
}

/* Rows live at the end of a buffer followed by a PROT_NONE page. */
#define GUARD_CAP 16384
static uint8_t *g_guard;

static int guard_init(void) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void *m = mmap(NULL, GUARD_CAP + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return -1;
  g_guard = (uint8_t *)m;
  return mprotect(g_guard + GUARD_CAP, page, PROT_NONE);
}

/* Start of a row of rb bytes at an address = off (mod 16) that ends at most 15 bytes before
 * the guard page (at it, when rb and off agree). */
static uint8_t *guard_place(int64_t rb, int off) {
  const uintptr_t end = (uintptr_t)(g_guard + GUARD_CAP);
  uintptr_t s = ((end - (uintptr_t)rb) & ~(uintptr_t)15) + (uintptr_t)off;
  if (s + (uintptr_t)rb > end) s -= 16;
  return (uint8_t *)s;
}

#define MAX_N 8192 /* elements of the longest test row */
static float g_ref[MAX_N];

/* A random row of type t (nb blocks, at offset off mod 16) with its CPU reference in g_ref.
 * Returns the row, or NULL after a failure. */
static uint8_t *make_row(int t, int64_t nb, int off, int64_t *n_out) {
  const int64_t n = nb * dtype_block_size(t), rb = nb * dtype_block_bytes(t);
  uint8_t *row = guard_place(rb, off);
  rand_row(t, row, nb);
  if (quant_dequantize_row(t, row, g_ref, n) != 0) {
    fail("%s: quant_dequantize_row refused %lld elements", dtype_name(t), (long long)n);
    return NULL;
  }
  *n_out = n;
  return row;
}

static void check_deq32(int t, int64_t nb, int off) {
  int64_t n;
  const uint8_t *row = make_row(t, nb, off, &n);
  if (!row) return;
  for (int64_t u = 0; u < n / 32; u++) {
    float y[32];
    cuda_deq32(t, row, u, y);
    for (int j = 0; j < 32; j++) {
      g_checks++;
      if (!same_bits(y[j], g_ref[32 * u + j]))
        fail("cuda_deq32 %s nb %lld off %d unit %lld elem %d: %.9g, cpu %.9g", dtype_name(t), (long long)nb, off,
             (long long)u, j, y[j], g_ref[32 * u + j]);
    }
    if (t == ANNA_DTYPE_Q4_K && off == 0) {
      cuda_deq32_q4k_wide(row, u, y);
      for (int j = 0; j < 32; j++) {
        g_checks++;
        if (!same_bits(y[j], g_ref[32 * u + j]))
          fail("cuda_deq32_q4k_wide nb %lld unit %lld elem %d: %.9g, cpu %.9g", (long long)nb, (long long)u, j, y[j],
               g_ref[32 * u + j]);
      }
    }
  }
}

/* One row through the piece decoders (f32 and int8). */
template <int TYPE> static void check_pieces(int64_t nb, int off) {
  constexpr int HI = cuda_piece<TYPE>::HI, RAW = cuda_piece<TYPE>::RAW, NW = cuda_q8p<TYPE>::NW;
  constexpr bool KQ = TYPE == ANNA_DTYPE_Q4_K || TYPE == ANNA_DTYPE_Q5_K;
  const char *name = dtype_name(TYPE);
  int64_t n;
  const uint8_t *row = make_row(TYPE, nb, off, &n);
  if (!row) return;
  float tab[16];
  for (int i = 0; i < 16; i++) tab[i] = (float)cuda_hd_iq4nl(i);
  static uint8_t cover[MAX_N], cover8[MAX_N];
  memset(cover, 0, (size_t)n);
  memset(cover8, 0, (size_t)n);
  const int64_t pieces = n / 32;
  g_lo = (const uint8_t *)((uintptr_t)row & ~(uintptr_t)3);
  g_hi = row + nb * dtype_block_bytes(TYPE);
  for (int64_t p = 0; p < pieces; p++) {
    uint32_t raw[RAW];
    memset(raw, 0xa5, sizeof raw); /* a word the load skips shows as garbage */
    const int64_t oob = g_oob;
    cuda_piece_load<TYPE>(row, p, p == pieces - 1, raw);
    g_checks++;
    if (g_oob != oob)
      fail("cuda_piece_load %s nb %lld off %d piece %lld: reads outside the row [%p, %p)", name, (long long)nb, off,
           (long long)p, (const void *)g_lo, (const void *)g_hi);

    float w[32], sc[2] = {0, 0}, mn[2] = {0, 0};
    const int64_t e0 = cuda_piece_decode<TYPE>(row, p, raw, w, tab, sc, mn);
    g_checks++;
    if (e0 != cuda_q8_e0<TYPE>(p))
      fail("%s piece %lld: cuda_piece_decode e0 %lld, cuda_q8_e0 %lld", name, (long long)p, (long long)e0,
           (long long)cuda_q8_e0<TYPE>(p));
    for (int i = 0; i < 32; i++) {
      const int k = i / 16;
      const int64_t e = e0 + (k ? HI + i - 16 : i);
      g_checks++;
      if (e < 0 || e >= n) {
        fail("cuda_piece_decode %s piece %lld weight %d: element %lld outside the row", name, (long long)p, i,
             (long long)e);
        continue;
      }
      cover[e]++;
      float v = sc[k] * w[i];
      if constexpr (cuda_piece_has_min<TYPE>()) v = v - mn[k];
      if (!same_bits(v, g_ref[e]))
        fail("cuda_piece_decode %s nb %lld off %d piece %lld weight %d (elem %lld): %.9g (sc %g w %g mn %g), cpu %.9g",
             name, (long long)nb, off, (long long)p, i, (long long)e, v, sc[k], w[i], mn[k], g_ref[e]);
    }

    int wq[NW];
    float qs[2] = {0, 0}, qm[2] = {0, 0};
    cuda_q8_decode<TYPE>(row, p, raw, wq, qs, qm);
    for (int m = 0; m < 8; m++)
      for (int j = 0; j < 4; j++) {
        const int b = (int)(int8_t)(uint8_t)((uint32_t)wq[m] >> (8 * j)); /* dp4a: signed bytes */
        int run = m / 4;
        int64_t e;
        float v;
        if constexpr (cuda_q8_interleaved<TYPE>()) {
          /* activation byte 4m + j of the block is element (4m + j) / 2 + 16 ((4m + j) % 2) */
          const int pos = 4 * m + j;
          e = e0 + pos / 2 + 16 * (pos % 2), run = 0;
          v = qs[0] * (float)(b + (int)(int8_t)(uint8_t)((uint32_t)wq[8 + m] >> (8 * j)));
        } else {
          e = e0 + run * HI + 4 * (m % 4) + j;
          if constexpr (KQ) v = qs[run] * (float)b - qm[run];
          else if constexpr (TYPE == ANNA_DTYPE_Q6_K) v = qs[run] * (float)(b - 32);
          else if constexpr (TYPE == ANNA_DTYPE_Q4_0) v = qs[0] * (float)(b - 8);
          else if constexpr (cuda_iq_grid_type(TYPE)) v = qs[run] * (float)b;
          else v = qs[0] * (float)b;
        }
        g_checks++;
        if (e < 0 || e >= n) {
          fail("cuda_q8_decode %s piece %lld word %d byte %d: element %lld outside the row", name, (long long)p, m, j,
               (long long)e);
          continue;
        }
        cover8[e]++;
        if (!same_bits(v, g_ref[e]))
          fail("cuda_q8_decode %s nb %lld off %d piece %lld word %d byte %d (elem %lld): %.9g (sc %g q %d), cpu %.9g",
               name, (long long)nb, off, (long long)p, m, j, (long long)e, v, qs[run], b, g_ref[e]);
      }
    g_checks++;
    const bool mins = !KQ || (same_bits(mn[0], qm[0]) && same_bits(mn[1], qm[1]));
    if (!same_bits(sc[0], qs[0]) || !same_bits(sc[1], qs[1]) || !mins) /* one scale in both paths */
      fail("%s piece %lld: cuda_q8_decode scales %g %g, cuda_piece_decode %g %g", name, (long long)p, qs[0], qs[1],
           sc[0], sc[1]);
  }
  for (int64_t e = 0; e < n; e++) {
    g_checks++;
    if (cover[e] != 1 || cover8[e] != 1)
      fail("%s nb %lld: element %lld decoded %d times by the f32 pieces, %d by the int8 ones", name, (long long)nb,
           (long long)e, cover[e], cover8[e]);
  }
}

/* Rows of random length at each accepted offset: off_step apart, from 0 to 15. */
template <int TYPE> static void run_pieces(int off_step, int rows) {
  const int fail0 = g_fail;
  const int64_t bs = dtype_block_size(TYPE), max_nb = bs == 32 ? 64 : 12;
  for (int off = 0; off < 16; off += off_step)
    for (int r = 0; r < rows; r++) check_pieces<TYPE>(1 + (int64_t)(rnd() % (uint64_t)max_nb), off);
  printf("  pieces %-7s offsets %%%-2d %s\n", dtype_name(TYPE), off_step, g_fail == fail0 ? "ok" : "FAILED");
}

static void check_halves(void) {
  for (uint32_t h = 0; h < 65536; h++) {
    const float a = pc_h2f(h), c = quant_f16_to_f32((uint16_t)h);
    const uint8_t b2[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
    const float l = ldh(b2);
    g_checks++;
    const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
    if (is_nan ? !(a != a && l != l && c != c) : !(same_bits(a, c) && same_bits(l, c)))
      fail("half 0x%04x: pc_h2f %.9g, ldh %.9g, cpu %.9g", h, a, l, c);
  }
}

static void check_ldw(void) {
  static const int types[3] = {ANNA_DTYPE_F32, ANNA_DTYPE_F16, ANNA_DTYPE_BF16};
  for (int k = 0; k < 3; k++) {
    const int t = types[k], n = 1000;
    const int64_t rb = dtype_row_bytes(t, n);
    uint8_t *row = guard_place(rb, 0);
    for (int64_t i = 0; i < rb; i++) row[i] = (uint8_t)rnd();
    if (t == ANNA_DTYPE_F32) /* finite: exponent field below all ones */
      for (int i = 0; i < n; i++) row[4 * i + 3] &= 0xbf;
    else if (t == ANNA_DTYPE_BF16)
      for (int i = 0; i < n; i++) row[2 * i + 1] &= 0xbf;
    else
      for (int i = 0; i < n; i++) row[2 * i + 1] &= 0xbb;
    if (quant_dequantize_row(t, row, g_ref, n) != 0) {
      fail("%s: quant_dequantize_row refused the row", dtype_name(t));
      continue;
    }
    for (int i = 0; i < n; i++) {
      const float v = cuda_ldw(t, row, i);
      g_checks++;
      if (!same_bits(v, g_ref[i])) fail("cuda_ldw %s elem %d: %.9g, cpu %.9g", dtype_name(t), i, v, g_ref[i]);
    }
  }
}

int main(int argc, char **argv) {
  (void)argc, (void)argv;
  setvbuf(stdout, NULL, _IOLBF, 0); /* what passed is on the log if a guard page read kills the test */
  if (guard_init() != 0) {
    printf("FAIL: cannot map the guarded buffer\n");
    return 1;
  }
  check_halves();
  check_ldw();
  printf("  halves, cuda_ldw %s\n", g_fail ? "FAILED" : "ok");

  /* cuda_deq32: every type cuda_quant_supported names, at every byte offset. */
  int ntypes = 0;
  for (int t = 0; t < ANNA_DTYPE_COUNT; t++) {
    if (!cuda_quant_supported(t)) continue;
    ntypes++;
    int off[2];
    if (dtype_f16_fields(t, off) < 0 || !quant_can_dequantize(t)) {
      fail("%s: cuda_quant_supported, but this test cannot build its blocks", dtype_name(t));
      continue;
    }
    const int fail0 = g_fail;
    const int64_t max_nb = dtype_block_size(t) == 32 ? 64 : 12;
    for (int o = 0; o < 16; o++)
      for (int r = 0; r < 64; r++) check_deq32(t, 1 + (int64_t)(rnd() % (uint64_t)max_nb), o);
    printf("  cuda_deq32 %-7s %s\n", dtype_name(t), g_fail == fail0 ? "ok" : "FAILED");
  }
  if (ntypes != 17) fail("cuda_quant_supported names %d types, this test expects 17", ntypes);

  /* Piece decoders at the alignments cuda_matmul.cu's piece_ok accepts. */
  run_pieces<ANNA_DTYPE_Q4_0>(2, 128);
  run_pieces<ANNA_DTYPE_IQ4_NL>(2, 128);
  run_pieces<ANNA_DTYPE_Q8_0>(2, 128);
  run_pieces<ANNA_DTYPE_Q6_K>(2, 128);
  run_pieces<ANNA_DTYPE_Q4_K>(16, 400);
  run_pieces<ANNA_DTYPE_Q5_K>(16, 400);
  run_pieces<ANNA_DTYPE_IQ4_XS>(8, 300);
  run_pieces<ANNA_DTYPE_IQ2_XXS>(2, 200);
  run_pieces<ANNA_DTYPE_IQ2_XS>(2, 200);
  run_pieces<ANNA_DTYPE_IQ2_S>(2, 200);
  run_pieces<ANNA_DTYPE_IQ3_XXS>(2, 200);
  run_pieces<ANNA_DTYPE_IQ3_S>(2, 200);
  if (g_loads == 0) fail("no piece load was seen: CUDA_QUANT_HOST_LOAD is not wired");

  printf("test_cuda_decode: %lld checks, %lld piece loads, %d failures\n", (long long)g_checks, (long long)g_loads,
         g_fail);
  return g_fail ? 1 : 0;
}
