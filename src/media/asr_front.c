/* asr_front.c: Qwen3-ASR conv front, CPU reference. See asr_front.h. */
#include "media/asr_front.h"

#include "base/error.h"

#include <math.h>
#include <string.h>

static int64_t half_up(int64_t x) {
  return x > 0 ? (x - 1) / 2 + 1 : 0;
}

int64_t media_asr_front_chunk_tokens(int64_t c) {
  return half_up(half_up(half_up(c)));
}

int64_t media_asr_front_tokens(int64_t L, int chunk) {
  if (L <= 0 || chunk <= 0) return 0;
  return (L / chunk) * media_asr_front_chunk_tokens(chunk) +
         media_asr_front_chunk_tokens(L % chunk);
}

/* Padded chunk width: the longest chunk of the utterance. */
static int64_t chunk_width(int64_t L, int chunk) {
  return L >= chunk ? chunk : L;
}

size_t media_asr_front_scratch_floats(const media_asr_front *w, int64_t L) {
  int64_t T = chunk_width(L, 2 * w->n_window);
  int64_t f1 = half_up(w->n_mels), f2 = half_up(f1), f3 = half_up(f2);
  int64_t t1 = half_up(T), t2 = half_up(t1), t3 = half_up(t2);
  return (size_t)(w->n_mels * T + w->hidden * (f1 * t1 + f2 * t2 + f3 * t3) + w->hidden * f3);
}

/* y[co][Ho][Wo] = GELU(b[co] + sum w[co][ci][ky][kx] x[ci][2y+ky-1][2x+kx-1]), zero padding. */
static void conv3x3_s2_gelu(float *y, const float *x, int ci_n, int64_t H, int64_t W,
                            const float *w, const float *b, int co_n) {
  int64_t Ho = half_up(H), Wo = half_up(W);
  for (int co = 0; co < co_n; co++) {
    float *yo = y + (size_t)co * (size_t)(Ho * Wo);
    for (int64_t i = 0; i < Ho * Wo; i++)
      yo[i] = 0.0f;
    for (int ci = 0; ci < ci_n; ci++) {
      const float *xi = x + (size_t)ci * (size_t)(H * W);
      const float *wk = w + ((size_t)co * (size_t)ci_n + (size_t)ci) * 9;
      for (int ky = 0; ky < 3; ky++) {
        for (int64_t oy = 0; oy < Ho; oy++) {
          int64_t iy = 2 * oy + ky - 1;
          if (iy < 0 || iy >= H) continue;
          const float *row = xi + iy * W;
          float *yr = yo + oy * Wo;
          for (int kx = 0; kx < 3; kx++) {
            float wv = wk[ky * 3 + kx];
            /* ox range with 0 <= 2*ox + kx - 1 < W */
            int64_t lo = kx == 0 ? 1 : 0;
            int64_t hi = W - kx >= 0 ? (W - kx) / 2 + 1 : 0; /* first ox with 2*ox+kx-1 >= W */
            if (hi > Wo) hi = Wo;
            for (int64_t ox = lo; ox < hi; ox++)
              yr[ox] += wv * row[2 * ox + kx - 1];
          }
        }
      }
    }
    for (int64_t i = 0; i < Ho * Wo; i++) {
      double v = (double)yo[i] + (double)b[co];
      yo[i] = (float)(0.5 * v * (1.0 + erf(v * M_SQRT1_2)));
    }
  }
}

int media_asr_front_run(const media_asr_front *w, const float *mel, int64_t L, float *out,
                        float *scratch, char *err, size_t errlen) {
  if (!w || !mel || !out || !scratch || !w->conv1_w || !w->conv1_b || !w->conv2_w || !w->conv2_b ||
      !w->conv3_w || !w->conv3_b || !w->conv_out_w)
    return anna_err(err, errlen, ANNA_EINVAL, "asr front: NULL argument or weight");
  if (L < 1 || w->n_mels < 1 || w->hidden < 1 || w->n_window < 1 || w->d_model < 4 ||
      w->d_model % 2)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "asr front: bad shape (L %lld, n_mels %d, hidden %d, n_window %d, d %d)",
                    (long long)L, w->n_mels, w->hidden, w->n_window, w->d_model);
  const int C = 2 * w->n_window, h = w->hidden, d = w->d_model, nm = w->n_mels;
  const int64_t T = chunk_width(L, C);
  const int64_t f1 = half_up(nm), f2 = half_up(f1), f3 = half_up(f2);
  const int64_t t1 = half_up(T), t2 = half_up(t1), t3 = half_up(t2);
  float *img = scratch, *a1 = img + nm * T, *a2 = a1 + h * f1 * t1, *a3 = a2 + h * f2 * t2;
  float *vec = a3 + h * f3 * t3;
  /* torch: inv_timescales = exp(float(-log(1e4)/(d/2-1)) * float(i)) in float32. */
  const float neg_inc = (float)(-log(10000.0) / (double)(d / 2 - 1));
  int64_t row = 0;
  for (int64_t s0 = 0; s0 < L; s0 += C) {
    int64_t c = L - s0 < C ? L - s0 : C;
    for (int m = 0; m < nm; m++) {
      const float *src = mel + (size_t)m * (size_t)L + (size_t)s0;
      float *dst = img + (size_t)m * (size_t)T;
      memcpy(dst, src, (size_t)c * sizeof *dst);
      for (int64_t t = c; t < T; t++)
        dst[t] = 0.0f;
    }
    conv3x3_s2_gelu(a1, img, 1, nm, T, w->conv1_w, w->conv1_b, h);
    conv3x3_s2_gelu(a2, a1, h, f1, t1, w->conv2_w, w->conv2_b, h);
    conv3x3_s2_gelu(a3, a2, h, f2, t2, w->conv3_w, w->conv3_b, h);
    int64_t keep = media_asr_front_chunk_tokens(c);
    for (int64_t s = 0; s < keep; s++) {
      for (int ch = 0; ch < h; ch++)
        for (int64_t f = 0; f < f3; f++)
          vec[ch * f3 + f] = a3[((size_t)ch * (size_t)f3 + (size_t)f) * (size_t)t3 + (size_t)s];
      float *o = out + (size_t)row * (size_t)d;
      const int64_t K = h * f3;
      for (int j = 0; j < d; j++) {
        const float *wr = w->conv_out_w + (size_t)j * (size_t)K;
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++)
          acc += wr[k] * vec[k];
        o[j] = acc;
      }
      for (int i = 0; i < d / 2; i++) {
        float ang = (float)s * expf(neg_inc * (float)i);
        o[i] += sinf(ang);
        o[d / 2 + i] += cosf(ang);
      }
      row++;
    }
  }
  return 0;
}
