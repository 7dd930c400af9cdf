/* cpu_audio.c: the CPU ops of audio encoders (ops.h): the im2col of a 3x3 stride-2 convolution.
 * Parallel over output pixels; a pure copy, so results do not depend on the thread count. */
#include "backends/cpu/cpu_internal.h"

struct im2col_ctx {
  float *cols;
  const float *x;
  int64_t n_img;
  int h, w, c;
};

static void im2col_task(void *p, int ith, int nth) {
  const struct im2col_ctx *a = p;
  const int64_t ho = (a->h + 1) / 2, wo = (a->w + 1) / 2, row = (int64_t)a->c * 9;
  int64_t lo, hi;
  threadpool_range(a->n_img * ho * wo, ith, nth, &lo, &hi);
  for (int64_t r = lo; r < hi; r++) {
    const int64_t img = r / (ho * wo), oy = (r / wo) % ho, ox = r % wo;
    const float *xi = a->x + img * a->h * a->w * a->c;
    float *o = a->cols + r * row;
    for (int ky = 0; ky < 3; ky++)
      for (int kx = 0; kx < 3; kx++) {
        const int64_t iy = 2 * oy + ky - 1, ix = 2 * ox + kx - 1;
        const int inside = iy >= 0 && iy < a->h && ix >= 0 && ix < a->w;
        const float *src = xi + (iy * a->w + ix) * a->c;
        for (int ci = 0; ci < a->c; ci++)
          o[ci * 9 + ky * 3 + kx] = inside ? src[ci] : 0.0f;
      }
  }
}

static void cpu_im2col_3x3s2(ops_backend *be, float *cols, const float *x, int64_t n_img, int h,
                             int w, int c) {
  struct im2col_ctx a = {cols, x, n_img, h, w, c};
  threadpool_run(((cpu_impl *)be->impl)->tp, im2col_task, &a);
}

void cpu_audio_ops_install(ops_backend *be) {
  be->im2col_3x3s2 = cpu_im2col_3x3s2;
}
