/* test_audio: audio decoding + resampling and the Qwen3-ASR log-mel against qwen-asr 0.0.6.
 *
 * Fixtures: tests/fixtures/audio (tools/mkfix_audio.py; README there). Per clip:
 *   - decode + resample + peak (media_audio_decode) vs the reference loader's 16 kHz samples
 *     where stored (bit-exact for lossless formats; lossy ones get 1e-4 of slack);
 *   - features of our decode vs the reference's (float32, MKL FFT) features: max |diff| 1e-4;
 *   - the mel alone on the reference's samples: 1e-4 vs the float32 reference, and 1e-5 vs
 *     the same extractor evaluated in float64 (mel64 files), which is what mel.c computes.
 * Bad input: not audio, empty, truncated, zero-length, over the seconds limit, too short for
 * the mel: each a clear ANNA_EINVAL whose message names the problem.
 */
#include "base/error.h"
#include "media/asr_front.h"
#include "media/audio.h"
#include "media/mel.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef ANNA_AUDIO_FIXTURES
#error "ANNA_AUDIO_FIXTURES must name tests/fixtures/audio"
#endif

static int failures;
#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      failures++;                                                                                  \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                         \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fputc('\n', stderr);                                                                         \
    }                                                                                              \
  } while (0)

static void *slurp(const char *dir, const char *name, size_t *n) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *p = malloc(len > 0 ? (size_t)len : 1);
  if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
    free(p);
    p = NULL;
  }
  fclose(f);
  *n = (size_t)len;
  return p;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= m)) m = d; /* NaN propagates as a failure */
  }
  return m;
}

static int is_lossy(const char *format) {
  return strcmp(format, "MP3") == 0 || strcmp(format, "OGG Opus") == 0 ||
         strcmp(format, "OGG Vorbis") == 0;
}

/* Features of x[0..n) vs ref[128 * L]; returns the max |diff| or -1 on an error. */
static double mel_err(media_mel *mel, const float *x, int64_t n, const float *ref, int64_t L) {
  int64_t l = media_mel_frames(n);
  if (l != L) return -1.0;
  float *out = malloc((size_t)128 * (size_t)L * sizeof *out);
  char err[256];
  if (!out || media_mel_compute(mel, x, n, out, err, sizeof err) != 0) {
    fprintf(stderr, "mel_compute: %s\n", err);
    free(out);
    return -1.0;
  }
  double e = max_abs_diff(out, ref, (size_t)128 * (size_t)L);
  free(out);
  return e;
}

static void check_case(const char *dir, json_t *c, media_mel *mel) {
  const char *name = json_string_value(json_object_get(c, "name"));
  const char *file = json_string_value(json_object_get(c, "file"));
  int64_t n_ref = json_integer_value(json_object_get(c, "n"));
  int64_t L = json_integer_value(json_object_get(c, "frames"));
  int stored = json_is_true(json_object_get(c, "samples_stored"));
  int stored64 = json_is_true(json_object_get(c, "mel64_stored"));
  char fn[256], err[512];
  size_t nbytes = 0, nref = 0, nwav = 0, nref64 = 0;
  uint8_t *bytes = slurp(dir, file, &nbytes);
  snprintf(fn, sizeof fn, "%s.mel.f32", name);
  float *ref = slurp(dir, fn, &nref);
  snprintf(fn, sizeof fn, "%s.wav16k.f32", name);
  float *wav = stored ? slurp(dir, fn, &nwav) : NULL;
  snprintf(fn, sizeof fn, "%s.mel64.f32", name);
  float *ref64 = stored64 ? slurp(dir, fn, &nref64) : NULL;
  CHECK(bytes && ref && (!stored || wav) && (!stored64 || ref64), "%s: fixture files missing",
        name);
  CHECK(nref == (size_t)128 * (size_t)L * 4, "%s: mel.f32 size %zu", name, nref);
  if (!bytes || !ref || (stored && !wav) || (stored64 && (!ref64 || !wav))) goto out;

  media_audio a;
  int rc = media_audio_decode(bytes, nbytes, 60.0, &a, err, sizeof err);
  CHECK(rc == 0, "%s: decode: %s", name, err);
  if (rc) goto out;
  CHECK(a.n == n_ref, "%s: %lld samples at 16 kHz, reference %lld", name, (long long)a.n,
        (long long)n_ref);
  CHECK(a.src_rate == json_integer_value(json_object_get(c, "src_rate")), "%s: rate %d", name,
        a.src_rate);
  CHECK(a.src_channels == json_integer_value(json_object_get(c, "src_channels")), "%s: channels %d",
        name, a.src_channels);
  int lossy = is_lossy(a.format);
  double e_wav = -1.0, e_mel_wav = -1.0, e_mel64 = -1.0;
  if (a.n == n_ref) {
    if (wav) {
      CHECK(nwav == (size_t)n_ref * 4, "%s: wav16k.f32 size %zu", name, nwav);
      e_wav = max_abs_diff(a.samples, wav, (size_t)n_ref);
      e_mel_wav = mel_err(mel, wav, n_ref, ref, L);
      CHECK(e_mel_wav >= 0.0 && e_mel_wav <= 1e-4,
            "%s: mel on the reference's samples: max err %.3g > 1e-4", name, e_mel_wav);
      if (ref64) {
        CHECK(nref64 == nref, "%s: mel64.f32 size %zu", name, nref64);
        e_mel64 = mel_err(mel, wav, n_ref, ref64, L);
        CHECK(e_mel64 >= 0.0 && e_mel64 <= 1e-5,
              "%s: mel on the reference's samples vs its float64 evaluation: max err %.3g > 1e-5",
              name, e_mel64);
      }
    }
    double e_feat = mel_err(mel, a.samples, a.n, ref, L);
    CHECK(e_feat >= 0.0, "%s: features failed", name);
    CHECK(e_feat <= 1e-4, "%s: features of our decode: max err %.3g > 1e-4", name, e_feat);
    /* Lossless decoding and libsoxr are bit-exact against the reference; the lossy decoders
     * (mpg123, libopus) were too between Debian bookworm's and soundfile 0.14's builds, but are
     * allowed a little slack in case another build rounds differently. */
    if (wav) CHECK(e_wav <= (lossy ? 1e-4 : 1e-6), "%s: 16 kHz samples: max err %.3g", name, e_wav);
    printf("%-18s %-10s %5d Hz %d ch  n=%-6lld L=%-4lld samples %-8.3g features %-8.3g", name,
           a.format, a.src_rate, a.src_channels, (long long)a.n, (long long)L, e_wav, e_feat);
    if (wav) printf("  mel(ref samples) %-8.3g", e_mel_wav);
    if (ref64) printf("  vs float64 %.3g", e_mel64);
    if (lossy) printf("  [lossy]");
    printf("\n");
  }
  media_audio_free(&a);
out:
  free(bytes);
  free(ref);
  free(wav);
  free(ref64);
}

/* A 44-byte PCM16 WAV header for `frames` mono frames at 16 kHz; data_bytes may lie. */
static void wav_header(uint8_t *h, uint32_t data_bytes) {
  memcpy(h, "RIFF", 4);
  uint32_t v = 36 + data_bytes;
  memcpy(h + 4, &v, 4);
  memcpy(h + 8, "WAVEfmt ", 8);
  v = 16;
  memcpy(h + 16, &v, 4);
  uint16_t s = 1;
  memcpy(h + 20, &s, 2); /* PCM */
  memcpy(h + 22, &s, 2); /* mono */
  v = 16000;
  memcpy(h + 24, &v, 4);
  v = 32000;
  memcpy(h + 28, &v, 4);
  s = 2;
  memcpy(h + 32, &s, 2);
  s = 16;
  memcpy(h + 34, &s, 2);
  memcpy(h + 36, "data", 4);
  memcpy(h + 40, &data_bytes, 4);
}

static void expect_einval(const uint8_t *p, size_t n, double max_s, const char *what,
                          const char *needle) {
  media_audio a;
  char err[512] = "";
  int rc = media_audio_decode(p, n, max_s, &a, err, sizeof err);
  CHECK(rc == ANNA_EINVAL, "%s: rc %d (%s), want ANNA_EINVAL", what, rc, err);
  CHECK(strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", what, err, needle);
  CHECK(a.samples == NULL && a.n == 0, "%s: output not cleared", what);
  printf("bad input %-28s -> %s\n", what, err);
  if (rc == 0) media_audio_free(&a);
}

static void check_truncated(const char *dir, const char *file, const char *needle) {
  size_t n = 0;
  uint8_t *b = slurp(dir, file, &n);
  CHECK(b != NULL, "%s missing", file);
  if (!b) return;
  char what[96];
  snprintf(what, sizeof what, "truncated %s", file);
  expect_einval(b, n / 2, 60.0, what, needle);
  free(b);
}

static void check_bad_input(const char *dir, media_mel *mel) {
  const char *text = "this is not audio, just some text that a client uploaded by mistake\n";
  expect_einval((const uint8_t *)text, strlen(text), 60.0, "not audio", "not a readable audio");
  expect_einval((const uint8_t *)text, 0, 60.0, "empty upload", "empty input");
  uint8_t h[44 + 64];
  wav_header(h, 0);
  expect_einval(h, 44, 60.0, "zero-length WAV", "zero-length");
  /* a WAV whose fmt chunk names an unknown codec (format tag 0x1234) */
  wav_header(h, 64);
  h[20] = 0x34;
  h[21] = 0x12;
  memset(h + 44, 0, 64);
  expect_einval(h, sizeof h, 60.0, "WAV with unknown codec", "not a readable audio");
  /* a header claiming 1 s of data with 32 bytes present */
  wav_header(h, 32000);
  memset(h + 44, 0, 64);
  expect_einval(h, sizeof h, 60.0, "WAV header longer than data", "truncated");
  check_truncated(dir, "bursts_16k.wav", "truncated");
  check_truncated(dir, "bursts_48k_stereo.flac", "truncated");
  check_truncated(dir, "mix_48k.opus", "malformed");
  check_truncated(dir, "bursts_44k.mp3", "truncated");
  size_t n = 0;
  uint8_t *b = slurp(dir, "sweep_8k_mono.wav", &n);
  if (b) {
    expect_einval(b, n, 1.5, "2-s file, 1.5-s limit", "limit");
    media_audio a;
    char err[256];
    CHECK(media_audio_decode(b, n, 2.0, &a, err, sizeof err) == 0, "2-s limit: %s", err);
    media_audio_free(&a);
  }
  free(b);
  /* A 10-hour WAV header (1.15 GB of declared data) over 64 bytes: refused from the header. */
  wav_header(h, 10u * 3600u * 32000u);
  expect_einval(h, sizeof h, 3600.0, "10-hour header, 1-h limit", "limit");
  /* The mel refuses what reflect padding cannot handle. */
  float x[200] = {0};
  float out[128];
  char err[256] = "";
  int rc = media_mel_compute(mel, x, 200, out, err, sizeof err);
  CHECK(rc == ANNA_EINVAL && strstr(err, "too short"), "mel of 200 samples: rc %d %s", rc, err);
  printf("bad input %-28s -> %s\n", "mel of 200 samples", err);
}

/* The encoder's conv front (asr_front.c) on reference features vs Qwen3ASRAudioEncoder with
 * random weights (front/, shrunk config): the hidden states entering layer 0. */
static void check_front(const char *dir) {
  char path[1024], err[256];
  snprintf(path, sizeof path, "%s/front/front.json", dir);
  json_error_t je;
  json_t *meta = json_load_file(path, 0, &je);
  CHECK(meta != NULL, "front.json: %s", je.text);
  if (!meta) return;
  json_t *cfg = json_object_get(meta, "config");
  media_asr_front w = {
      .n_mels = (int)json_integer_value(json_object_get(cfg, "num_mel_bins")),
      .hidden = (int)json_integer_value(json_object_get(cfg, "downsample_hidden_size")),
      .d_model = (int)json_integer_value(json_object_get(cfg, "d_model")),
      .n_window = (int)json_integer_value(json_object_get(cfg, "n_window")),
  };
  size_t nw = 0;
  float *wts = slurp(dir, "front/weights.f32", &nw);
  const float **slots[] = {&w.conv1_w, &w.conv1_b, &w.conv2_w,   &w.conv2_b,
                           &w.conv3_w, &w.conv3_b, &w.conv_out_w};
  json_t *tensors = json_object_get(meta, "tensors");
  size_t off = 0, i;
  json_t *t;
  CHECK(wts && json_array_size(tensors) == 7, "front weights missing");
  if (!wts || json_array_size(tensors) != 7) goto out;
  json_array_foreach(tensors, i, t) {
    size_t count = 1, j;
    json_t *dim;
    json_array_foreach(json_object_get(t, "shape"), j, dim) count *=
        (size_t)json_integer_value(dim);
    *slots[i] = wts + off;
    off += count;
  }
  CHECK(off * 4 == nw, "front weights: %zu floats declared, %zu bytes present", off, nw);
  if (off * 4 != nw) goto out;
  json_t *c;
  json_array_foreach(json_object_get(meta, "cases"), i, c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    int64_t L = json_integer_value(json_object_get(c, "frames"));
    int64_t N = json_integer_value(json_object_get(c, "tokens"));
    size_t nmel = 0, nref = 0;
    float *mel_full = slurp(dir, json_string_value(json_object_get(c, "mel")), &nmel);
    snprintf(path, sizeof path, "front/%s.out.f32", name);
    float *ref = slurp(dir, path, &nref);
    int64_t Lfull = (int64_t)(nmel / 4 / (size_t)w.n_mels);
    float *mel = malloc((size_t)w.n_mels * (size_t)L * sizeof *mel);
    float *out = malloc((size_t)(N > 0 ? N : 1) * (size_t)w.d_model * sizeof *out);
    float *scratch = malloc(media_asr_front_scratch_floats(&w, L) * sizeof *scratch);
    CHECK(mel_full && ref && mel && out && scratch && L <= Lfull, "front %s: inputs", name);
    CHECK(media_asr_front_tokens(L, 2 * w.n_window) == N, "front %s: %lld tokens, reference %lld",
          name, (long long)media_asr_front_tokens(L, 2 * w.n_window), (long long)N);
    CHECK(nref == (size_t)N * (size_t)w.d_model * 4, "front %s: out.f32 size %zu", name, nref);
    if (mel_full && ref && mel && out && scratch && L <= Lfull &&
        nref == (size_t)N * (size_t)w.d_model * 4) {
      for (int m = 0; m < w.n_mels; m++)
        memcpy(mel + (size_t)m * (size_t)L, mel_full + (size_t)m * (size_t)Lfull, (size_t)L * 4);
      int rc = media_asr_front_run(&w, mel, L, out, scratch, err, sizeof err);
      CHECK(rc == 0, "front %s: %s", name, err);
      double e = rc ? 1e9 : max_abs_diff(out, ref, (size_t)N * (size_t)w.d_model), peak = 0.0;
      for (size_t k = 0; k < (size_t)N * (size_t)w.d_model; k++)
        if (fabs(ref[k]) > peak) peak = fabs(ref[k]);
      CHECK(e <= 1e-4, "front %s: max err %.3g > 1e-4", name, e);
      printf("asr front %-10s L=%-4lld tokens=%-3lld max err %.3g (max |ref| %.3g)\n", name,
             (long long)L, (long long)N, e, peak);
    }
    free(mel_full);
    free(ref);
    free(mel);
    free(out);
    free(scratch);
  }
out:
  free(wts);
  json_decref(meta);
}

int main(int argc, char **argv) {
  const char *dir = ANNA_AUDIO_FIXTURES;
  if (!media_audio_available() || !media_mel_available()) {
    fprintf(stderr, "test_audio: built without libsndfile/libsoxr/FFTW3: skipped\n");
    return 77; /* ctest SKIP_RETURN_CODE */
  }
  char path[1024], err[256];
  snprintf(path, sizeof path, "%s/expected.json", dir);
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) {
    fprintf(stderr, "test_audio: %s: %s\n", path, je.text);
    return 1;
  }
  media_mel *mel = NULL;
  if (media_mel_create(128, &mel, err, sizeof err) != 0) {
    fprintf(stderr, "test_audio: %s\n", err);
    json_decref(root);
    return 1;
  }
  json_t *cases = json_object_get(root, "cases");
  CHECK(json_array_size(cases) >= 7, "expected.json lists %zu cases", json_array_size(cases));
  size_t i;
  json_t *c;
  json_array_foreach(cases, i, c) check_case(dir, c, mel);
  check_bad_input(dir, mel);
  check_front(dir);
  media_mel_free(mel);
  json_decref(root);
  if (failures) {
    fprintf(stderr, "test_audio: %d failures\n", failures);
    return 1;
  }
  printf("test_audio: ok\n");
  return 0;
}
