/* mel.c: Whisper-style log-mel features over FFTW3 (double precision). See mel.h. */
#include "media/mel.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef ANNA_HAVE_FFTW3
#define ANNA_HAVE_FFTW3 0
#endif

#if ANNA_HAVE_FFTW3
#include <fftw3.h>
#include <pthread.h>
#endif

#define N_FFT MEDIA_MEL_N_FFT
#define N_BINS (N_FFT / 2 + 1)
#define HOP MEDIA_MEL_HOP
#define PAD (N_FFT / 2)

int media_mel_available(void) {
  return ANNA_HAVE_FFTW3;
}

int64_t media_mel_frames(int64_t n_samples) {
  return n_samples > 0 ? n_samples / HOP : 0;
}

#if ANNA_HAVE_FFTW3
struct media_mel {
  int n_mels;
  fftw_plan plan;
  double *frame;      /* fftw_malloc'd [N_FFT]: windowed samples, the plan's input */
  fftw_complex *spec; /* fftw_malloc'd [N_BINS]: the plan's output */
  double *power;      /* [N_BINS] */
  float window[N_FFT];
  float *filters; /* [n_mels][N_BINS], float32 like the reference's matrix */
  int *lo, *hi;   /* per mel: its nonzero bins are [lo, hi) */
};

/* FFTW's planner (and plan destruction) is not thread-safe; fftw_execute is. */
static pthread_mutex_t plan_lock = PTHREAD_MUTEX_INITIALIZER;

/* transformers.audio_utils, mel_scale="slaney". */
static double hz_to_mel(double f) {
  double logstep = 27.0 / log(6.4);
  return f >= 1000.0 ? 15.0 + log(f / 1000.0) * logstep : 3.0 * f / 200.0;
}
static double mel_to_hz(double m) {
  double logstep = log(6.4) / 27.0;
  return m >= 15.0 ? 1000.0 * exp(logstep * (m - 15.0)) : 200.0 * m / 3.0;
}

/* mel_filter_bank(num_frequency_bins=201, num_mel_filters=n_mels, min 0, max 8000,
 * sampling_rate 16000, norm="slaney", mel_scale="slaney"), in the same float64 steps
 * (np.linspace: i * step + start, last point set to stop), rounded to float32. */
static int filters_make(media_mel *m) {
  int nm = m->n_mels;
  double *ff = malloc((size_t)(nm + 2) * sizeof *ff);
  if (!ff) return ANNA_ENOMEM;
  double mel_lo = hz_to_mel(0.0), mel_hi = hz_to_mel(8000.0);
  double step = (mel_hi - mel_lo) / (double)(nm + 1);
  for (int i = 0; i < nm + 2; i++) {
    double mel = i == nm + 1 ? mel_hi : (double)i * step + mel_lo;
    ff[i] = mel_to_hz(mel);
  }
  double fstep = (double)(MEDIA_MEL_RATE / 2) / (double)(N_BINS - 1);
  for (int j = 0; j < nm; j++) {
    double enorm = 2.0 / (ff[j + 2] - ff[j]);
    int lo = N_BINS, hi = 0;
    for (int k = 0; k < N_BINS; k++) {
      double fk = k == N_BINS - 1 ? (double)(MEDIA_MEL_RATE / 2) : (double)k * fstep;
      double down = -(ff[j] - fk) / (ff[j + 1] - ff[j]);
      double up = (ff[j + 2] - fk) / (ff[j + 2] - ff[j + 1]);
      double w = down < up ? down : up;
      if (w < 0.0) w = 0.0;
      float wf = (float)(w * enorm);
      m->filters[(size_t)j * N_BINS + k] = wf;
      if (wf != 0.0f) {
        if (k < lo) lo = k;
        hi = k + 1;
      }
    }
    m->lo[j] = lo < hi ? lo : 0;
    m->hi[j] = lo < hi ? hi : 0;
  }
  free(ff);
  return 0;
}

int media_mel_create(int n_mels, media_mel **out, char *err, size_t errlen) {
  *out = NULL;
  if (n_mels < 1 || n_mels > 256)
    return anna_err(err, errlen, ANNA_EINVAL, "mel: n_mels %d outside 1..256", n_mels);
  media_mel *m = calloc(1, sizeof *m);
  if (!m) return anna_err(err, errlen, ANNA_ENOMEM, "mel: extractor");
  m->n_mels = n_mels;
  m->frame = fftw_malloc(N_FFT * sizeof *m->frame);
  m->spec = fftw_malloc(N_BINS * sizeof *m->spec);
  m->power = malloc(N_BINS * sizeof *m->power);
  m->filters = malloc((size_t)n_mels * N_BINS * sizeof *m->filters);
  m->lo = malloc((size_t)n_mels * sizeof *m->lo);
  m->hi = malloc((size_t)n_mels * sizeof *m->hi);
  if (!m->frame || !m->spec || !m->power || !m->filters || !m->lo || !m->hi ||
      filters_make(m) != 0) {
    media_mel_free(m);
    return anna_err(err, errlen, ANNA_ENOMEM, "mel: extractor buffers");
  }
  /* torch.hann_window(400) (periodic): arange in float32, times the float32 scalar 2 pi/400,
   * cos, times -0.5, plus 0.5, each step in float32. */
  float wstep = (float)(M_PI * 2.0 / (double)N_FFT);
  for (int i = 0; i < N_FFT; i++)
    m->window[i] = cosf((float)i * wstep) * -0.5f + 0.5f;
  pthread_mutex_lock(&plan_lock);
  m->plan = fftw_plan_dft_r2c_1d(N_FFT, m->frame, m->spec, FFTW_ESTIMATE);
  pthread_mutex_unlock(&plan_lock);
  if (!m->plan) {
    media_mel_free(m);
    return anna_err(err, errlen, ANNA_ENOMEM, "mel: FFTW could not plan a size-%d real FFT", N_FFT);
  }
  *out = m;
  return 0;
}

void media_mel_free(media_mel *m) {
  if (!m) return;
  if (m->plan) {
    pthread_mutex_lock(&plan_lock);
    fftw_destroy_plan(m->plan);
    pthread_mutex_unlock(&plan_lock);
  }
  fftw_free(m->frame);
  fftw_free(m->spec);
  free(m->power);
  free(m->filters);
  free(m->lo);
  free(m->hi);
  free(m);
}

int media_mel_n_mels(const media_mel *m) {
  return m->n_mels;
}

const float *media_mel_filters(const media_mel *m) {
  return m->filters;
}

int media_mel_compute(media_mel *m, const float *x, int64_t n, float *out, char *err,
                      size_t errlen) {
  if (!m || !x || !out) return anna_err(err, errlen, ANNA_EINVAL, "mel: NULL argument");
  if (n <= PAD)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "mel: %lld samples is too short (at least %d, 12.6 ms at 16 kHz, for the "
                    "reflect padding)",
                    (long long)n, PAD + 1);
  int64_t L = media_mel_frames(n);
  int nm = m->n_mels;
  float vmax = -INFINITY;
  for (int64_t t = 0; t < L; t++) {
    int64_t s0 = t * HOP - PAD;
    if (s0 >= 0 && s0 + N_FFT <= n) {
      for (int i = 0; i < N_FFT; i++)
        m->frame[i] = (double)x[s0 + i] * m->window[i];
    } else {
      for (int i = 0; i < N_FFT; i++) {
        int64_t j = s0 + i; /* reflect without repeating the edge; n > PAD keeps j in range */
        if (j < 0) j = -j;
        if (j >= n) j = 2 * (n - 1) - j;
        m->frame[i] = (double)x[j] * m->window[i];
      }
    }
    fftw_execute(m->plan);
    for (int k = 0; k < N_BINS; k++) {
      double re = m->spec[k][0], im = m->spec[k][1];
      m->power[k] = re * re + im * im;
    }
    for (int j = 0; j < nm; j++) {
      const float *f = m->filters + (size_t)j * N_BINS;
      double acc = 0.0;
      for (int k = m->lo[j]; k < m->hi[j]; k++)
        acc += (double)f[k] * m->power[k];
      if (!(acc >= 1e-10)) acc = 1e-10;
      float lv = (float)log10(acc);
      out[(size_t)j * (size_t)L + (size_t)t] = lv;
      if (lv > vmax) vmax = lv;
    }
  }
  float floor_v = vmax - 8.0f;
  size_t total = (size_t)nm * (size_t)L;
  for (size_t i = 0; i < total; i++) {
    float v = out[i] > floor_v ? out[i] : floor_v;
    out[i] = (v + 4.0f) / 4.0f;
  }
  return 0;
}

#else /* no FFTW */

struct media_mel {
  int n_mels;
};

int media_mel_create(int n_mels, media_mel **out, char *err, size_t errlen) {
  *out = NULL;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "mel: anna was built without FFTW3 (install libfftw3-dev and reconfigure)");
}
void media_mel_free(media_mel *m) {
  free(m);
}
int media_mel_n_mels(const media_mel *m) {
  return m->n_mels;
}
const float *media_mel_filters(const media_mel *m) {
  return NULL;
}
int media_mel_compute(media_mel *m, const float *x, int64_t n, float *out, char *err,
                      size_t errlen) {
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "mel: anna was built without FFTW3");
}
#endif
