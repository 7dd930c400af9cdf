/* mel.h: Qwen3-ASR's log-mel features (transformers' WhisperFeatureExtractor, torch path, as
 * qwen-asr's processor calls it: no 30-s padding, no dither, one utterance).
 *
 * Contract, for n samples x at 16 kHz (docs: shared/docs/MODELS.md "Qwen3-ASR", Features):
 *   - reflect-pad 200 samples on each side (torch.stft center=True);
 *   - frames t = 0 .. L-1 with L = n / 160 (the STFT's last frame is dropped): 400 samples
 *     from 160*t, times the periodic Hann window 0.5 - 0.5 cos(2 pi i / 400);
 *   - power |X_k|^2 of the real FFT, bins k = 0..200;
 *   - 128 (n_mels) triangular filters, slaney mel scale, slaney area norm, 0..8000 Hz,
 *     computed as transformers' mel_filter_bank does (float64, then float32 like the
 *     reference's torch.from_numpy(...).to(float32));
 *   - v = log10(max(mel, 1e-10)); v = max(v, max over all (mel, frame) of v - 8);
 *     v = (v + 4) / 4.
 * Output is mel-major: out[m * L + t]. The global-max clamp makes a frame depend on the whole
 * utterance, so features are computed per utterance, not streamed.
 *
 * FFT: FFTW3 in double precision (fftw r2c of size 400 = 2^4 5^2, which FFTW handles with its
 * codelets). FFTW over pocketfft: Debian ships it as a maintained shared library with a
 * pkg-config file (libfftw3-dev), it is the standard C FFT, and a plan is a reusable object,
 * which makes "no allocation per frame" natural. Double, not single (fftwf), because the
 * reference's torch.stft runs MKL's float32 FFT, whose rounding (about 2e-7 of a frame's peak)
 * lands in the bins 8 decades below the utterance's maximum that the clamp keeps: there a
 * float FFT moves features by up to ~1e-4 whichever library computes it, and no C library
 * reproduces MKL's rounding. So this computes the reference's formula (almost) exactly: the
 * window is torch's float32 Hann, and the windowing, FFT, |X|^2, filter sums and log10 run in
 * double. Measured against the float32 reference, the worst feature error (7.3e-5 on an 8 kHz
 * sweep) stays within the reference's own distance from exact (8.5e-5); against the same
 * pipeline evaluated in float64 it is 3.9e-6, from 13 of the 400 window entries where glibc's
 * cosf and torch's differ by one ulp (bench/notes/audio.md). Plans use FFTW_ESTIMATE so
 * results do not depend on run-time timing (FFTW_MEASURE may pick another algorithm per run).
 * Planning is serialised by a mutex (FFTW's planner is not thread-safe); executing is
 * thread-safe.
 *
 * Memory: media_mel_create allocates everything (plan, window, filters, frame buffers);
 * media_mel_compute allocates nothing. A media_mel is not shared between threads: make one
 * per thread.
 */
#ifndef ANNA_MEDIA_MEL_H
#define ANNA_MEDIA_MEL_H

#include <stddef.h>
#include <stdint.h>

#define MEDIA_MEL_N_FFT 400
#define MEDIA_MEL_HOP 160
#define MEDIA_MEL_RATE 16000

typedef struct media_mel media_mel;

/* 1 when this build has the FFT library (FFTW3, double precision), else 0. */
int media_mel_available(void);

/* Makes the extractor for n_mels filters (1..256; Qwen3-ASR uses 128) at 16 kHz, 0..8000 Hz.
 * Returns 0 and *out (caller frees with media_mel_free), ANNA_EINVAL, ANNA_ENOMEM, or
 * ANNA_EUNSUPPORTED when built without FFTW (libfftw3-dev). */
int media_mel_create(int n_mels, media_mel **out, char *err, size_t errlen);

/* Releases m; accepts NULL. */
void media_mel_free(media_mel *m);

int media_mel_n_mels(const media_mel *m);

/* Frames the features of n samples have: n / 160. */
int64_t media_mel_frames(int64_t n_samples);

/* Writes the n_mels x L features of x[0..n) into out (caller-owned, n_mels * L floats,
 * L = media_mel_frames(n)). n must be at least 201 (reflect padding needs n > 200, as
 * torch.stft does). Returns 0 or ANNA_EINVAL (too short, NULL buffers). Allocates nothing. */
int media_mel_compute(media_mel *m, const float *x, int64_t n, float *out, char *err,
                      size_t errlen);

/* The float32 filter bank, [n_mels][201] (for tests against the reference's matrix). */
const float *media_mel_filters(const media_mel *m);

#endif
