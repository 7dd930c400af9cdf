/* cpu_conv.c: the CPU backend's waveform decoder ops (ops.h, "Waveform decoder ops"): causal
 * conv1d (dense and depthwise, dilated), causal ConvTranspose1d, SnakeBeta, LayerNorm, erf GELU,
 * channel-scaled add, clamp. These are the CPU references of those ops.
 *
 * Each output value is one fixed-order sum (dense convs: one f32 dot per tap, or one dot over
 * the whole window when dil == 1, since the kw input rows then sit next to each other and
 * match the [cout, kw, cin] weight row), independent of n and of the thread split: a stream
 * decoded in pieces gets the same conv outputs bit for bit as in one pass.
 * Dense convs split output channels across the pool's threads; the rest is elementwise and
 * runs on the caller's thread (small next to the convs).
 */
#include "backends/cpu/cpu_internal.h"

#include <math.h>

typedef struct conv_job {
  float *y;
  const float *x, *w, *bias;
  int64_t n;
  int cin, cout, kw, dil, m, stride;
} conv_job;

static void range_of(int64_t total, int ith, int nth, int64_t *lo, int64_t *hi) {
  *lo = total * ith / nth;
  *hi = total * (ith + 1) / nth;
}

static void conv1d_task(void *p, int ith, int nth) {
  const conv_job *j = p;
  int64_t lo, hi;
  range_of(j->cout, ith, nth, &lo, &hi);
  const int64_t wrow = (int64_t)j->kw * j->cin;
  for (int64_t co = lo; co < hi; co++) {
    const float *wr = j->w + co * wrow;
    const float b = j->bias ? j->bias[co] : 0.0f;
    for (int64_t t = 0; t < j->n; t++) {
      float s;
      if (j->dil == 1) {
        s = cpu_dot_f32(j->x + t * j->cin, wr, (int)wrow);
      } else {
        s = 0;
        for (int k = 0; k < j->kw; k++)
          s += cpu_dot_f32(j->x + (t + (int64_t)k * j->dil) * j->cin, wr + (int64_t)k * j->cin,
                           j->cin);
      }
      j->y[t * j->cout + co] = s + b;
    }
  }
}

static void cpu_conv1d(ops_backend *be, float *y, const float *x, int64_t n, int cin, int cout,
                       const float *w, int kw, int dil, const float *bias) {
  cpu_impl *c = be->impl;
  conv_job j = {
      .y = y, .x = x, .w = w, .bias = bias, .n = n, .cin = cin, .cout = cout, .kw = kw, .dil = dil};
  if (n <= 0) return;
  threadpool_run(c->tp, conv1d_task, &j);
}

static void cpu_conv1d_dw(ops_backend *be, float *y, const float *x, int64_t n, int ch,
                          const float *w, int kw, int dil, const float *bias) {
  (void)be;
  for (int64_t t = 0; t < n; t++) {
    float *yr = y + t * ch;
    for (int c = 0; c < ch; c++) {
      float s = 0;
      for (int k = 0; k < kw; k++)
        s += w[(int64_t)c * kw + k] * x[(t + (int64_t)k * dil) * ch + c];
      yr[c] = s + (bias ? bias[c] : 0.0f);
    }
  }
}

static void tconv_task(void *p, int ith, int nth) {
  const conv_job *j = p;
  int64_t lo, hi;
  range_of((int64_t)j->stride * j->cout, ith, nth, &lo, &hi);
  const int64_t wrow = (int64_t)j->m * j->cin;
  for (int64_t pc = lo; pc < hi; pc++) {
    const int64_t ph = pc / j->cout, co = pc % j->cout;
    const float *wr = j->w + pc * wrow; /* [stride][cout] rows in that order */
    const float b = j->bias ? j->bias[co] : 0.0f;
    for (int64_t t = 0; t < j->n; t++)
      j->y[(t * j->stride + ph) * j->cout + co] = cpu_dot_f32(j->x + t * j->cin, wr, (int)wrow) + b;
  }
}

static void cpu_conv_transpose1d(ops_backend *be, float *y, const float *x, int64_t n, int cin,
                                 int cout, const float *w, int m, int stride, const float *bias) {
  cpu_impl *c = be->impl;
  conv_job j = {.y = y,
                .x = x,
                .w = w,
                .bias = bias,
                .n = n,
                .cin = cin,
                .cout = cout,
                .m = m,
                .stride = stride};
  if (n <= 0) return;
  threadpool_run(c->tp, tconv_task, &j);
}

static void cpu_snake_beta(ops_backend *be, float *y, const float *x, int64_t rows, int ch,
                           const float *alpha, const float *inv_beta) {
  (void)be;
  for (int64_t r = 0; r < rows; r++)
    for (int c = 0; c < ch; c++) {
      const float v = x[r * ch + c];
      const float s = sinf(v * alpha[c]);
      y[r * ch + c] = v + inv_beta[c] * (s * s);
    }
}

static void cpu_add_scaled(ops_backend *be, float *y, const float *x, const float *s, int64_t rows,
                           int d) {
  (void)be;
  for (int64_t r = 0; r < rows; r++)
    for (int i = 0; i < d; i++)
      y[r * d + i] += s[i] * x[r * d + i];
}

static void cpu_clamp(ops_backend *be, float *y, int64_t n, float lo, float hi) {
  (void)be;
  for (int64_t i = 0; i < n; i++)
    y[i] = y[i] < lo ? lo : y[i] > hi ? hi : y[i];
}

void cpu_conv_fill(ops_backend *be) {
  be->conv1d = cpu_conv1d;
  be->conv1d_dw = cpu_conv1d_dw;
  be->conv_transpose1d = cpu_conv_transpose1d;
  be->snake_beta = cpu_snake_beta;
  be->add_scaled = cpu_add_scaled;
  be->clamp = cpu_clamp;
}
