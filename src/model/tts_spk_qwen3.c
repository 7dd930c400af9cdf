/* tts_spk_qwen3.c: Qwen3-TTS's ECAPA-TDNN speaker encoder on the CPU (tts_spk_qwen3.h). */
#include "model/tts_spk_qwen3.h"

#include "anna/anna.h"
#include "base/error.h"
#include "formats/safetensors.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_FFT 1024
#define HOP 256
#define N_BINS (N_FFT / 2 + 1)
#define N_MELS 128
#define MAX_BLOCKS 16

typedef struct conv {
  float *w, *b; /* w [co][ci][k] */
  int co, ci, k, d;
} conv;

typedef struct seres2 {
  conv tdnn1, tdnn2, se1, se2;
  conv res[16];
  int scale;
} seres2;

struct tts_spk {
  int mel_dim, dim, n_ch, scale;
  int ch[MAX_BLOCKS], ks[MAX_BLOCKS], dil[MAX_BLOCKS];
  conv b0, mfa, asp_tdnn, asp_conv, fc;
  seres2 blk[MAX_BLOCKS];
};

static void conv_free(conv *c) {
  free(c->w), free(c->b);
}

void tts_spk_free(tts_spk *e) {
  if (!e) return;
  conv_free(&e->b0), conv_free(&e->mfa), conv_free(&e->asp_tdnn), conv_free(&e->asp_conv);
  conv_free(&e->fc);
  for (int i = 0; i < MAX_BLOCKS; i++) {
    seres2 *s = &e->blk[i];
    conv_free(&s->tdnn1), conv_free(&s->tdnn2), conv_free(&s->se1), conv_free(&s->se2);
    for (int j = 0; j < 16; j++) conv_free(&s->res[j]);
  }
  free(e);
}

int tts_spk_dim(const tts_spk *e) {
  return e->dim;
}

/* name.weight [co][ci][k] and name.bias [co] as f32 copies, shapes checked */
static int conv_load(conv *c, const safetensors_set *st, const char *name, int co, int ci, int k, int d,
                     char *err, size_t errlen) {
  char wn[256], bn[256];
  snprintf(wn, sizeof wn, "speaker_encoder.%s.weight", name);
  snprintf(bn, sizeof bn, "speaker_encoder.%s.bias", name);
  const safetensors_tensor *w = safetensors_find(st, wn), *b = safetensors_find(st, bn);
  if (!w || !b) return anna_err(err, errlen, ANNA_EFORMAT, "speaker encoder: missing %s", w ? bn : wn);
  if (w->ndim != 3 || w->shape[0] != co || w->shape[1] != ci || w->shape[2] != k || b->ndim != 1 ||
      b->shape[0] != co)
    return anna_err(err, errlen, ANNA_EFORMAT, "speaker encoder: %s is not [%d, %d, %d]", wn, co, ci, k);
  c->co = co, c->ci = ci, c->k = k, c->d = d;
  const int64_t nw = (int64_t)co * ci * k;
  if (!(c->w = malloc(sizeof(float) * (size_t)nw)) || !(c->b = malloc(sizeof(float) * (size_t)co)))
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  for (int64_t i = 0; i < nw; i++) c->w[i] = safetensors_tensor_f32(w, i);
  for (int i = 0; i < co; i++) c->b[i] = safetensors_tensor_f32(b, i);
  return 0;
}

/* an int list of the config, or (absent) Qwen3TTSSpeakerEncoderConfig's default def[0..nd) */
static int jints(const json_t *o, const char *key, int *out, int max, int *n, const int *def, int nd) {
  const json_t *a = json_object_get(o, key);
  if (!a) {
    memcpy(out, def, sizeof *out * (size_t)nd);
    *n = nd;
    return 0;
  }
  if (!json_is_array(a) || json_array_size(a) < 1 || (int)json_array_size(a) > max) return -1;
  for (size_t i = 0; i < json_array_size(a); i++) {
    if (!json_is_integer(json_array_get(a, i))) return -1;
    out[i] = (int)json_integer_value(json_array_get(a, i));
    if (out[i] < 1 || out[i] > 65536) return -1;
  }
  *n = (int)json_array_size(a);
  return 0;
}

static int jint1(const json_t *o, const char *key, int def, int *out) {
  const json_t *v = json_object_get(o, key);
  if (!v) return *out = def, 0;
  if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65536) return -1;
  *out = (int)json_integer_value(v);
  return 0;
}

/* librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax) (slaney scale and norm, float32 rows) */
static double hz_to_mel(double f) {
  const double f_sp = 200.0 / 3, min_log_hz = 1000.0, min_log_mel = min_log_hz / f_sp, logstep = log(6.4) / 27.0;
  return f >= min_log_hz ? min_log_mel + log(f / min_log_hz) / logstep : f / f_sp;
}
static double mel_to_hz(double m) {
  const double f_sp = 200.0 / 3, min_log_hz = 1000.0, min_log_mel = min_log_hz / f_sp, logstep = log(6.4) / 27.0;
  return m >= min_log_mel ? min_log_hz * exp(logstep * (m - min_log_mel)) : f_sp * m;
}
static void mel_basis(float *out, double sr, double fmin, double fmax) {
  double mel_f[N_MELS + 2];
  const double m0 = hz_to_mel(fmin), m1 = hz_to_mel(fmax);
  for (int i = 0; i < N_MELS + 2; i++) mel_f[i] = mel_to_hz(m0 + (m1 - m0) * i / (N_MELS + 1));
  for (int i = 0; i < N_MELS; i++) {
    const double enorm = 2.0 / (mel_f[i + 2] - mel_f[i]);
    for (int k = 0; k < N_BINS; k++) {
      const double f = k * sr / N_FFT;
      const double lower = (f - mel_f[i]) / (mel_f[i + 1] - mel_f[i]);
      const double upper = (mel_f[i + 2] - f) / (mel_f[i + 2] - mel_f[i + 1]);
      double w = lower < upper ? lower : upper;
      if (w < 0) w = 0;
      out[i * N_BINS + k] = (float)((double)(float)w * enorm);
    }
  }
}

int tts_spk_load(tts_spk **out, const char *dir, char *err, size_t errlen) {
  *out = NULL;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) return anna_err(err, errlen, ANNA_EFORMAT, "%s: line %d: %s", path, je.line, je.text);
  tts_spk *e = calloc(1, sizeof *e);
  safetensors_set *st = NULL;
  int rc = e ? 0 : anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  const json_t *sc = json_object_get(root, "speaker_encoder_config");
  /* the config class's defaults (the released Base checkpoints) for absent keys */
  static const int def_ch[5] = {512, 512, 512, 512, 1536}, def_ks[5] = {5, 3, 3, 3, 1}, def_dil[5] = {1, 2, 3, 4, 1};
  int n2 = 0, n3 = 0, att = 0, se = 0;
  if (!rc && (!json_is_object(sc) || jint1(sc, "mel_dim", 128, &e->mel_dim) || jint1(sc, "enc_dim", 1024, &e->dim) ||
              jints(sc, "enc_channels", e->ch, MAX_BLOCKS, &e->n_ch, def_ch, 5) ||
              jints(sc, "enc_kernel_sizes", e->ks, MAX_BLOCKS, &n2, def_ks, 5) ||
              jints(sc, "enc_dilations", e->dil, MAX_BLOCKS, &n3, def_dil, 5) ||
              jint1(sc, "enc_attention_channels", 128, &att) || jint1(sc, "enc_res2net_scale", 8, &e->scale) ||
              jint1(sc, "enc_se_channels", 128, &se) || n2 != e->n_ch || n3 != e->n_ch || e->n_ch < 3 ||
              e->mel_dim != N_MELS || e->scale > 16))
    rc = anna_err(err, errlen, ANNA_EFORMAT,
                  "%s: speaker_encoder_config is missing or malformed (enc_channels / kernel sizes / dilations "
                  "of one length >= 3, mel_dim 128, res2net scale <= 16)",
                  path);
  const json_t *sr = sc ? json_object_get(sc, "sample_rate") : NULL;
  if (!rc && sr && (!json_is_integer(sr) || json_integer_value(sr) != TTS_SPK_RATE))
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: speaker encoder sample_rate must be 24000", path);
  json_decref(root);
  if (!rc) rc = safetensors_open(&st, dir, err, errlen);
  if (!rc && !safetensors_find(st, "speaker_encoder.fc.weight"))
    rc = anna_err(err, errlen, ANNA_ENOTFOUND, "%s: no speaker_encoder tensors (not a Qwen3-TTS Base checkpoint)", dir);
  const int L = e ? e->n_ch : 0;
  if (!rc) rc = conv_load(&e->b0, st, "blocks.0.conv", e->ch[0], e->mel_dim, e->ks[0], e->dil[0], err, errlen);
  for (int i = 1; !rc && i < L - 1; i++) {
    seres2 *s = &e->blk[i];
    char n[128];
    const int C = e->ch[i];
    if (C % e->scale || e->ch[i - 1] != C)
      rc = anna_err(err, errlen, ANNA_EFORMAT, "speaker encoder: block %d: %d channels (in %d, scale %d)", i, C,
                    e->ch[i - 1], e->scale);
    s->scale = e->scale;
    snprintf(n, sizeof n, "blocks.%d.tdnn1.conv", i);
    if (!rc) rc = conv_load(&s->tdnn1, st, n, C, e->ch[i - 1], 1, 1, err, errlen);
    for (int j = 0; !rc && j < e->scale - 1; j++) {
      snprintf(n, sizeof n, "blocks.%d.res2net_block.blocks.%d.conv", i, j);
      rc = conv_load(&s->res[j], st, n, C / e->scale, C / e->scale, e->ks[i], e->dil[i], err, errlen);
    }
    snprintf(n, sizeof n, "blocks.%d.tdnn2.conv", i);
    if (!rc) rc = conv_load(&s->tdnn2, st, n, C, C, 1, 1, err, errlen);
    snprintf(n, sizeof n, "blocks.%d.se_block.conv1", i);
    if (!rc) rc = conv_load(&s->se1, st, n, se, C, 1, 1, err, errlen);
    snprintf(n, sizeof n, "blocks.%d.se_block.conv2", i);
    if (!rc) rc = conv_load(&s->se2, st, n, C, se, 1, 1, err, errlen);
  }
  int cat = 0;
  for (int i = 1; i < L - 1; i++) cat += e ? e->ch[i] : 0;
  const int CL = e ? e->ch[L - 1] : 0;
  if (!rc) rc = conv_load(&e->mfa, st, "mfa.conv", CL, cat, e->ks[L - 1], e->dil[L - 1], err, errlen);
  if (!rc) rc = conv_load(&e->asp_tdnn, st, "asp.tdnn.conv", att, 3 * CL, 1, 1, err, errlen);
  if (!rc) rc = conv_load(&e->asp_conv, st, "asp.conv", CL, att, 1, 1, err, errlen);
  if (!rc) rc = conv_load(&e->fc, st, "fc", e->dim, 2 * CL, 1, 1, err, errlen);
  safetensors_close(st);
  if (rc) {
    tts_spk_free(e);
    return rc;
  }
  *out = e;
  return 0;
}

/* ---- forward ---- */

/* y[co][L] = conv(x[ci][L]) with 'same' reflect padding (PyTorch: left = total / 2), + bias,
 * then ReLU when relu. As a matrix product: the input's k shifted (reflected) copies stacked
 * into rows j = i * k + kk (im2col; the input itself when k = 1), then each output row is the
 * bias plus a weighted sum of those rows, 8 output rows per pass over an input row, summed in
 * double along contiguous time (vectorized). Float sums were 1.8x faster but 3.7e-3 off a
 * float64 run on the released shape (the float32 reference itself is 1.1e-3 off; double
 * sums: 6.4e-4). Returns -1 when out of memory. */
static int conv_run(const conv *c, const float *x, int64_t L, float *y, int relu) {
  const int K = c->k, J = c->ci * K, total = c->d * (K - 1), left = total / 2;
  const float *X = x;
  float *col = NULL;
  if (K > 1) {
    if (!(col = malloc(sizeof(float) * (size_t)J * (size_t)L))) return -1;
    for (int i = 0; i < c->ci; i++)
      for (int kk = 0; kk < K; kk++) {
        float *row = col + ((int64_t)i * K + kk) * L;
        const float *xi = x + (int64_t)i * L;
        for (int64_t t = 0; t < L; t++) {
          int64_t j = t - left + (int64_t)kk * c->d;
          if (j < 0) j = -j;
          if (j >= L) j = 2 * (L - 1) - j;
          row[t] = xi[j];
        }
      }
    X = col;
  }
  double *acc = malloc(sizeof(double) * 8 * (size_t)L);
  if (!acc) {
    free(col);
    return -1;
  }
  for (int o0 = 0; o0 < c->co; o0 += 8) {
    const int nb = c->co - o0 < 8 ? c->co - o0 : 8;
    for (int r = 0; r < nb; r++)
      for (int64_t t = 0; t < L; t++) acc[r * L + t] = c->b[o0 + r];
    for (int j = 0; j < J; j++) {
      const float *xr = X + (int64_t)j * L;
      for (int r = 0; r < nb; r++) {
        const double w = c->w[(int64_t)(o0 + r) * J + j];
        double *ar = acc + r * L;
        for (int64_t t = 0; t < L; t++) ar[t] += w * xr[t];
      }
    }
    for (int r = 0; r < nb; r++) {
      float *yr = y + (int64_t)(o0 + r) * L;
      for (int64_t t = 0; t < L; t++) {
        const float v = (float)acc[r * L + t];
        yr[t] = relu && v < 0 ? 0 : v;
      }
    }
  }
  free(acc);
  free(col);
  return 0;
}

static int se_res2(const seres2 *s, const float *x, int64_t L, float *y, float *t1, float *t2) {
  const int C = s->tdnn1.co, W = C / s->scale;
  if (conv_run(&s->tdnn1, x, L, t1, 1)) return -1;
  /* Res2Net: chunk 0 as is; chunk i = tdnn(chunk i (+ out i-1)) */
  memcpy(t2, t1, sizeof(float) * (size_t)W * (size_t)L);
  float *tmp = malloc(sizeof(float) * (size_t)W * (size_t)L);
  if (!tmp) return -1;
  for (int i = 1; i < s->scale; i++) {
    const float *in = t1 + (int64_t)i * W * L;
    int bad;
    if (i == 1) {
      bad = conv_run(&s->res[0], in, L, t2 + (int64_t)W * L, 1);
    } else {
      const float *prev = t2 + (int64_t)(i - 1) * W * L;
      for (int64_t q = 0; q < (int64_t)W * L; q++) tmp[q] = in[q] + prev[q];
      bad = conv_run(&s->res[i - 1], tmp, L, t2 + (int64_t)i * W * L, 1);
    }
    if (bad) {
      free(tmp);
      return -1;
    }
  }
  free(tmp);
  if (conv_run(&s->tdnn2, t2, L, y, 1)) return -1;
  /* squeeze-excitation on the time mean */
  const int S = s->se1.co;
  float *m = malloc(sizeof(float) * (size_t)(C + S + C));
  if (!m) return -1;
  float *h = m + C, *g = h + S;
  for (int c = 0; c < C; c++) {
    double acc = 0;
    for (int64_t t = 0; t < L; t++) acc += y[(int64_t)c * L + t];
    m[c] = (float)(acc / (double)L);
  }
  if (conv_run(&s->se1, m, 1, h, 1) || conv_run(&s->se2, h, 1, g, 0)) {
    free(m);
    return -1;
  }
  for (int c = 0; c < C; c++) {
    const float sg = (float)(1.0 / (1.0 + exp(-(double)g[c])));
    for (int64_t t = 0; t < L; t++) y[(int64_t)c * L + t] = y[(int64_t)c * L + t] * sg + x[(int64_t)c * L + t];
  }
  free(m);
  return 0;
}

/* mean / std of x[C][L] under weights a[C][L] (each row summing to 1) */
static void stats(const float *x, const float *a, int C, int64_t L, float *mean, float *sd) {
  for (int c = 0; c < C; c++) {
    const float *xc = x + (int64_t)c * L;
    double mu = 0, v = 0;
    for (int64_t t = 0; t < L; t++) mu += (double)(a ? a[(int64_t)c * L + t] : 1.0f / (float)L) * xc[t];
    for (int64_t t = 0; t < L; t++) {
      const double dv = xc[t] - mu;
      v += (double)(a ? a[(int64_t)c * L + t] : 1.0f / (float)L) * dv * dv;
    }
    mean[c] = (float)mu;
    sd[c] = (float)sqrt(v > 1e-12 ? v : 1e-12);
  }
}

int tts_spk_embed(const tts_spk *e, const float *x, int64_t n, float *out, char *err, size_t errlen) {
  float *mel = NULL;
  int64_t L = 0;
  int rc = tts_spk_mel(x, n, &mel, &L, err, errlen);
  if (rc) return rc;
  int maxc = e->mel_dim;
  for (int i = 0; i < e->n_ch; i++) maxc = e->ch[i] > maxc ? e->ch[i] : maxc;
  int cat = 0;
  for (int i = 1; i < e->n_ch - 1; i++) cat += e->ch[i];
  const int CL = e->ch[e->n_ch - 1];
  const int big = (cat > 3 * CL ? cat : 3 * CL) > maxc ? (cat > 3 * CL ? cat : 3 * CL) : maxc;
  float *xin = malloc(sizeof(float) * (size_t)e->mel_dim * (size_t)L);
  float *hs = malloc(sizeof(float) * (size_t)cat * (size_t)L); /* the SE blocks' outputs, stacked */
  float *a = malloc(sizeof(float) * (size_t)big * (size_t)L), *b = malloc(sizeof(float) * (size_t)big * (size_t)L);
  float *t1 = malloc(sizeof(float) * (size_t)maxc * (size_t)L), *t2 = malloc(sizeof(float) * (size_t)maxc * (size_t)L);
  float *pool = malloc(sizeof(float) * (size_t)(4 * CL));
  if (!xin || !hs || !a || !b || !t1 || !t2 || !pool) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    goto done;
  }
  for (int m = 0; m < e->mel_dim; m++) /* [L][128] -> [128][L] */
    for (int64_t t = 0; t < L; t++) xin[(int64_t)m * L + t] = mel[t * e->mel_dim + m];
  if (conv_run(&e->b0, xin, L, a, 1)) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    goto done;
  }
  int64_t off = 0;
  for (int i = 1; i < e->n_ch - 1; i++) {
    if (se_res2(&e->blk[i], a, L, b, t1, t2)) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      goto done;
    }
    memcpy(hs + off, b, sizeof(float) * (size_t)e->ch[i] * (size_t)L);
    off += (int64_t)e->ch[i] * L;
    float *sw = a;
    a = b, b = sw;
  }
  if (conv_run(&e->mfa, hs, L, a, 1)) { /* a: [CL][L] */
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    goto done;
  }
  /* attentive statistics pooling */
  float *mean = pool, *sd = pool + CL;
  stats(a, NULL, CL, L, mean, sd);
  memcpy(b, a, sizeof(float) * (size_t)CL * (size_t)L);
  for (int c = 0; c < CL; c++)
    for (int64_t t = 0; t < L; t++) {
      b[(int64_t)(CL + c) * L + t] = mean[c];
      b[(int64_t)(2 * CL + c) * L + t] = sd[c];
    }
  if (conv_run(&e->asp_tdnn, b, L, t1, 1)) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    goto done;
  }
  for (int64_t q = 0; q < (int64_t)e->asp_tdnn.co * L; q++) t1[q] = tanhf(t1[q]);
  if (conv_run(&e->asp_conv, t1, L, t2, 0)) { /* [CL][L] attention logits */
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    goto done;
  }
  for (int c = 0; c < CL; c++) {         /* softmax over time */
    float *r = t2 + (int64_t)c * L, mx = -INFINITY;
    for (int64_t t = 0; t < L; t++) mx = r[t] > mx ? r[t] : mx;
    double s = 0;
    for (int64_t t = 0; t < L; t++) s += exp((double)r[t] - mx);
    for (int64_t t = 0; t < L; t++) r[t] = (float)(exp((double)r[t] - mx) / s);
  }
  stats(a, t2, CL, L, pool + 2 * CL, pool + 3 * CL);
  if (conv_run(&e->fc, pool + 2 * CL, 1, out, 0)) rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
done:
  free(mel), free(xin), free(hs), free(a), free(b), free(t1), free(t2), free(pool);
  return rc;
}

#ifdef ANNA_HAVE_FFTW3
#include <fftw3.h>
#include <pthread.h>

static pthread_mutex_t g_plan_mu = PTHREAD_MUTEX_INITIALIZER; /* FFTW's planner is not thread-safe */

int tts_spk_mel(const float *x, int64_t n, float **out, int64_t *Lout, char *err, size_t errlen) {
  *out = NULL;
  const int pad = (N_FFT - HOP) / 2;
  if (!x || n <= pad || n + 2 * pad < N_FFT)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "reference audio: %lld samples at 24 kHz is too short (at least %d, about 32 ms)", (long long)n,
                    N_FFT - 2 * pad > pad + 1 ? N_FFT - 2 * pad : pad + 1);
  const int64_t L = 1 + (n + 2 * pad - N_FFT) / HOP;
  static float basis[N_MELS * N_BINS], window[N_FFT];
  static int ready;
  pthread_mutex_lock(&g_plan_mu);
  if (!ready) {
    mel_basis(basis, TTS_SPK_RATE, 0.0, 12000.0);
    for (int i = 0; i < N_FFT; i++) window[i] = (float)(0.5 - 0.5 * cos(2.0 * M_PI * i / N_FFT));
    ready = 1;
  }
  double *frame = fftw_alloc_real(N_FFT);
  fftw_complex *spec = fftw_alloc_complex(N_BINS);
  fftw_plan plan = frame && spec ? fftw_plan_dft_r2c_1d(N_FFT, frame, spec, FFTW_ESTIMATE) : NULL;
  pthread_mutex_unlock(&g_plan_mu);
  float *o = malloc(sizeof(float) * (size_t)L * N_MELS), mag[N_BINS];
  if (!plan || !o) {
    fftw_free(frame), fftw_free(spec), free(o);
    if (plan) fftw_destroy_plan(plan);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  for (int64_t t = 0; t < L; t++) {
    for (int i = 0; i < N_FFT; i++) {
      int64_t j = t * HOP + i - pad; /* reflect padding */
      if (j < 0) j = -j;
      if (j >= n) j = 2 * (n - 1) - j;
      frame[i] = (double)x[j] * window[i];
    }
    fftw_execute(plan);
    for (int k = 0; k < N_BINS; k++)
      mag[k] = (float)sqrt((double)(float)(spec[k][0] * spec[k][0] + spec[k][1] * spec[k][1]) + 1e-9);
    for (int m = 0; m < N_MELS; m++) {
      double acc = 0;
      const float *w = basis + m * N_BINS;
      for (int k = 0; k < N_BINS; k++) acc += (double)w[k] * mag[k];
      o[t * N_MELS + m] = (float)log(acc > 1e-5 ? acc : 1e-5);
    }
  }
  pthread_mutex_lock(&g_plan_mu);
  fftw_destroy_plan(plan);
  pthread_mutex_unlock(&g_plan_mu);
  fftw_free(frame), fftw_free(spec);
  *out = o;
  *Lout = L;
  return 0;
}
#else
int tts_spk_mel(const float *x, int64_t n, float **out, int64_t *Lout, char *err, size_t errlen) {
  *out = NULL;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "speaker encoder: anna was built without FFTW3 (install libfftw3-dev and reconfigure)");
}
#endif
