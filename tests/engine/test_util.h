/* test_util.h: the helpers the engine tests share (one test program per translation unit:
 * the counters and the generator are per program). A test may define TEST_RNG_SEED before
 * including this header to keep its own random stream. */
#ifndef ANNA_TESTS_ENGINE_TEST_UTIL_H
#define ANNA_TESTS_ENGINE_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0x9E3779B97F4A7C15ull
#endif

static int g_fail, g_checks;
static uint64_t g_rng = TEST_RNG_SEED;

/* xorshift64: deterministic, so a failure reproduces. */
static inline uint64_t rnd(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return g_rng;
}

/* Uniform in [-1, 1). */
static inline float frand(void) {
  return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static inline void fill(float *x, int64_t n, float scale) {
  for (int64_t i = 0; i < n; i++) x[i] = frand() * scale;
}

/* Counts a check; fails it when err > tol (or err is NaN). */
static inline void check(const char *what, double err, double tol) {
  g_checks++;
  if (!(err <= tol)) {
    printf("  FAIL %-60s err %.3g > %.3g\n", what, err, tol);
    g_fail++;
  }
}

/* max |a - ref| / max |ref| (NaN anywhere: infinity). */
static inline double max_rel(const float *a, const double *ref, int64_t n) {
  double m = 0, scale = 1e-6;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
  for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - ref[i]) / scale);
  return isnan(m) ? INFINITY : m;
}

#endif
