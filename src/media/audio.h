/* audio.h: untrusted audio bytes (WAV, FLAC, OGG Vorbis, OGG Opus, MP3, and the other
 * containers libsndfile reads) -> 16 kHz mono float samples, as Qwen3-ASR's loader makes them.
 *
 * Contract: media_audio_decode reproduces qwen-asr 0.0.6's normalize_audio_input on a file:
 *   1. decode with libsndfile to float (libsndfile's own int -> float scaling, 1/32768 for
 *      16-bit), which is what librosa.load(path, sr=None, mono=False) does through soundfile;
 *   2. average the channels (sum in channel order in float, then divide by the count, as
 *      numpy's float32 mean does);
 *   3. resample to 16 kHz with libsoxr exactly as librosa.resample(res_type="soxr_hq") does
 *      through python-soxr: SOXR_HQ quality spec (flags 0), float32 in and out, one channel,
 *      input fed in chunks of (size_t)(48000 * in / out) frames then flushed, and the result
 *      cut or zero-padded to ceil(n * (16000.0 / rate)) samples (librosa's fix_length).
 *      A 16 kHz source is not resampled;
 *   4. if the peak |x| exceeds 1, divide every sample by it, then clip to [-1, 1].
 * The same libsoxr version gives the same samples; libsndfile's PCM/FLAC/Vorbis decoding is
 * exact across builds, while MP3 (mpg123) and Opus (libopus) decoders may differ in the last
 * bits between the builds soundfile ships and the system's.
 *
 * Limits: max_seconds > 0 bounds the duration. The header's frame count is checked before any
 * sample buffer is allocated, and decoding stops (with an error) if a stream whose header
 * understated its length runs past the limit, so a huge or lying file costs bounded memory.
 * Empty input, unknown formats, zero-length audio, truncated files (fewer frames than the
 * header declares, or a decoder error mid-stream), absurd sample rates or channel counts are
 * ANNA_EINVAL with a message naming the problem. A build without libsndfile or libsoxr
 * returns ANNA_EUNSUPPORTED naming the missing package. Every error path frees what it
 * allocated. Thread-safe, with one caveat: libsndfile keeps the reason a stream failed to open
 * in a global, so under concurrent failures a message may quote another call's reason (the
 * return code is always this call's). mpg123 may print warnings to stderr on odd MP3 headers.
 */
#ifndef ANNA_MEDIA_AUDIO_H
#define ANNA_MEDIA_AUDIO_H

#include <stddef.h>
#include <stdint.h>

#define MEDIA_AUDIO_RATE 16000 /* the rate every decoded result has */

/* Decoded audio: n mono samples at MEDIA_AUDIO_RATE in [-1, 1]. */
typedef struct media_audio {
  float *samples;       /* owned: media_audio_free releases it */
  int64_t n;            /* samples at 16 kHz (>= 1 on success) */
  int32_t src_rate;     /* the file's sample rate */
  int32_t src_channels; /* the file's channel count (averaged into one) */
  int64_t src_frames;   /* frames decoded at src_rate */
  char format[24];      /* "WAV", "FLAC", "OGG Vorbis", "OGG Opus", "MP3", ... */
} media_audio;

/* 1 when this build can decode and resample audio (libsndfile and libsoxr were found at
 * configure time), else 0. */
int media_audio_available(void);

/* Decodes data[0..n) into *out (zeroed first; on error it holds nothing to free).
 * max_seconds > 0 bounds the source duration (checked on the header before decoding).
 * Returns 0, ANNA_EINVAL (empty, unknown, corrupt or truncated data, limit exceeded),
 * ANNA_EUNSUPPORTED (built without libsndfile/libsoxr) or ANNA_ENOMEM.
 * Caller frees with media_audio_free. */
int media_audio_decode(const uint8_t *data, size_t n, double max_seconds, media_audio *out,
                       char *err, size_t errlen);

/* Steps 1-3 at another rate, without step 4 (qwen-tts loads a voice-clone reference this way:
 * librosa.load(sr=None, mono=True), then librosa.resample to the speaker encoder's rate when
 * it differs): out->samples at `rate`. Errors as media_audio_decode. */
int media_audio_decode_rate(const uint8_t *data, size_t n, double max_seconds, int32_t rate,
                            media_audio *out, char *err, size_t errlen);

/* Releases a->samples and zeroes *a. Accepts NULL and zeroed structs. */
void media_audio_free(media_audio *a);

/* Step 3 alone: resamples in[0..n) from in_rate to out_rate as librosa.resample(soxr_hq)
 * does. *out (caller frees with free()) gets *n_out = ceil(n * (out_rate / in_rate)) samples;
 * equal rates copy. Rates must lie in [1000, 768000]. Returns 0, ANNA_EINVAL, ANNA_ENOMEM or
 * ANNA_EUNSUPPORTED (no libsoxr). */
int media_audio_resample(const float *in, int64_t n, int32_t in_rate, int32_t out_rate, float **out,
                         int64_t *n_out, char *err, size_t errlen);

/* Step 4 alone, in place: divide by the peak if it exceeds 1, clip to [-1, 1]. */
void media_audio_peak_normalise(float *x, int64_t n);

#endif
