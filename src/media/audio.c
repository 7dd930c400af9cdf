/* audio.c: libsndfile (virtual I/O over the caller's buffer) -> mono -> libsoxr -> 16 kHz.
 * See audio.h for the reference this reproduces step by step. */
#include "media/audio.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef ANNA_HAVE_SNDFILE
#define ANNA_HAVE_SNDFILE 0
#endif
#ifndef ANNA_HAVE_SOXR
#define ANNA_HAVE_SOXR 0
#endif

#if ANNA_HAVE_SNDFILE
#include <sndfile.h>
#endif
#if ANNA_HAVE_SOXR
#include <soxr.h>
#endif

#define RATE_MIN 1000
#define RATE_MAX 768000
#define CHANNELS_MAX 64     /* more is not speech; libsndfile itself allows 1024 */
#define READ_FRAMES 4096    /* frames per sf_readf_float call */
#define MAJOR_MPEG 0x230000 /* SF_FORMAT_MPEG: an enum (libsndfile >= 1.1), not a macro */

int media_audio_available(void) {
  return ANNA_HAVE_SNDFILE && ANNA_HAVE_SOXR;
}

void media_audio_free(media_audio *a) {
  if (!a) return;
  free(a->samples);
  memset(a, 0, sizeof *a);
}

void media_audio_peak_normalise(float *x, int64_t n) {
  float peak = 0.0f;
  for (int64_t i = 0; i < n; i++) {
    float v = fabsf(x[i]);
    if (v > peak) peak = v;
  }
  if (!(peak > 1.0f)) return; /* also leaves silence (and NaN peaks) alone, as the wrapper */
  for (int64_t i = 0; i < n; i++) {
    float v = x[i] / peak; /* a division, not a reciprocal multiply: numpy's rounding */
    x[i] = v > 1.0f ? 1.0f : v < -1.0f ? -1.0f : v;
  }
}

int media_audio_resample(const float *in, int64_t n, int32_t in_rate, int32_t out_rate, float **out,
                         int64_t *n_out, char *err, size_t errlen) {
  *out = NULL;
  *n_out = 0;
  if (n < 0 || (n > 0 && !in))
    return anna_err(err, errlen, ANNA_EINVAL, "audio resample: bad input (n=%lld)", (long long)n);
  if (in_rate < RATE_MIN || in_rate > RATE_MAX || out_rate < RATE_MIN || out_rate > RATE_MAX)
    return anna_err(err, errlen, ANNA_EINVAL, "audio resample: rates %d -> %d Hz outside [%d, %d]",
                    (int)in_rate, (int)out_rate, RATE_MIN, RATE_MAX);
  /* librosa: ratio = float(target_sr) / orig_sr; n_samples = int(np.ceil(n * ratio)). */
  double ratio = (double)out_rate / (double)in_rate;
  int64_t want = in_rate == out_rate ? n : (int64_t)ceil((double)n * ratio);
  float *y = calloc((size_t)(want > 0 ? want : 1), sizeof *y);
  if (!y)
    return anna_err(err, errlen, ANNA_ENOMEM, "audio resample: %lld samples", (long long)want);
  if (in_rate == out_rate || n == 0) {
    if (n) memcpy(y, in, (size_t)n * sizeof *y);
    *out = y;
    *n_out = want;
    return 0;
  }
#if ANNA_HAVE_SOXR
  soxr_error_t se = NULL;
  soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
  soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
  soxr_t s = soxr_create((double)in_rate, (double)out_rate, 1, &se, &io, &q, NULL);
  if (se || !s) {
    free(y);
    return anna_err(err, errlen, ANNA_EINVAL, "audio resample: soxr_create %d -> %d Hz: %s",
                    (int)in_rate, (int)out_rate, se ? se : "failed");
  }
  /* python-soxr's resample(): input in chunks of (size_t)(48000 * in / out) frames into an
   * output buffer of (size_t)(n * out / in + 1) frames, then a flush; librosa then keeps the
   * first `want` samples (zero-padding a short result). Output beyond `want` is discarded. */
  size_t olen = (size_t)((double)n * (double)out_rate / (double)in_rate + 1.0);
  size_t chunk = (size_t)(48000.0 * (double)in_rate / (double)out_rate);
  if ((int64_t)olen < want) olen = (size_t)want; /* cannot happen; keeps the copy below safe */
  float *buf = malloc(olen * sizeof *buf);
  if (!buf) {
    soxr_delete(s);
    free(y);
    return anna_err(err, errlen, ANNA_ENOMEM, "audio resample: %zu samples", olen);
  }
  size_t pos = 0, done = 0;
  for (size_t i = 0; i < (size_t)n && !se; i += chunk) {
    size_t len = (size_t)n - i < chunk ? (size_t)n - i : chunk;
    done = 0;
    se = soxr_process(s, in + i, len, NULL, buf + pos, olen - pos, &done);
    pos += done;
  }
  if (!se) {
    done = 0;
    se = soxr_process(s, NULL, 0, NULL, buf + pos, olen - pos, &done);
    pos += done;
  }
  soxr_delete(s);
  if (se) {
    free(buf);
    free(y);
    return anna_err(err, errlen, ANNA_EINVAL, "audio resample: soxr_process: %s", se);
  }
  size_t keep = pos < (size_t)want ? pos : (size_t)want;
  memcpy(y, buf, keep * sizeof *y);
  free(buf);
  *out = y;
  *n_out = want;
  return 0;
#else
  free(y);
  return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "audio resample: anna was built without libsoxr (install libsoxr-dev and "
                  "reconfigure)");
#endif
}

#if ANNA_HAVE_SNDFILE
/* libsndfile virtual I/O over a read-only memory buffer. */
typedef struct membuf {
  const uint8_t *p;
  sf_count_t n, pos;
} membuf;

static sf_count_t vio_len(void *u) {
  return ((membuf *)u)->n;
}
static sf_count_t vio_tell(void *u) {
  return ((membuf *)u)->pos;
}
static sf_count_t vio_seek(sf_count_t off, int whence, void *u) {
  membuf *m = u;
  sf_count_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->pos : m->n;
  sf_count_t to = base + off;
  if (to < 0 || to > m->n) return -1;
  m->pos = to;
  return to;
}
static sf_count_t vio_read(void *dst, sf_count_t count, void *u) {
  membuf *m = u;
  if (count <= 0 || m->pos >= m->n) return 0;
  sf_count_t k = m->n - m->pos < count ? m->n - m->pos : count;
  memcpy(dst, m->p + m->pos, (size_t)k);
  m->pos += k;
  return k;
}
static sf_count_t vio_write(const void *src, sf_count_t count, void *u) {
  return 0;
}

static void format_name(const SF_INFO *in, char *dst, size_t cap) {
  int major = in->format & SF_FORMAT_TYPEMASK, sub = in->format & SF_FORMAT_SUBMASK;
  const char *name = NULL;
  switch (major) {
  case SF_FORMAT_WAV: name = "WAV"; break;
  case SF_FORMAT_WAVEX: name = "WAV (extensible)"; break;
  case SF_FORMAT_RF64: name = "RF64"; break;
  case SF_FORMAT_AIFF: name = "AIFF"; break;
  case SF_FORMAT_AU: name = "AU"; break;
  case SF_FORMAT_CAF: name = "CAF"; break;
  case SF_FORMAT_W64: name = "W64"; break;
  case SF_FORMAT_FLAC: name = "FLAC"; break;
  case SF_FORMAT_OGG:
    name = sub == SF_FORMAT_OPUS ? "OGG Opus" : sub == SF_FORMAT_VORBIS ? "OGG Vorbis" : "OGG";
    break;
  case MAJOR_MPEG: name = "MP3"; break;
  default: break;
  }
  SF_FORMAT_INFO fi = {.format = major};
  if (!name && sf_command(NULL, SFC_GET_FORMAT_MAJOR, &fi, sizeof fi) == 0 && fi.name)
    name = fi.name;
  snprintf(dst, cap, "%s", name ? name : "audio");
}

/* libsndfile clamps a WAV's data chunk to the bytes present (and logs it), so a truncated WAV
 * would decode as a shorter valid one; the declared length is read here from the RIFF chunks.
 * Returns 1 with the data chunk's declared and present byte counts and the fmt byte rate
 * (0 if not seen before it), or 0 when data is not RIFF/WAVE or has no data chunk header. */
static int riff_data_chunk(const uint8_t *p, size_t n, uint64_t *declared, uint64_t *present,
                           uint32_t *byte_rate) {
  if (n < 12 || memcmp(p, "RIFF", 4) != 0 || memcmp(p + 8, "WAVE", 4) != 0) return 0;
  *byte_rate = 0;
  size_t off = 12;
  while (off + 8 <= n) {
    uint32_t size = (uint32_t)p[off + 4] | (uint32_t)p[off + 5] << 8 | (uint32_t)p[off + 6] << 16 |
                    (uint32_t)p[off + 7] << 24;
    if (memcmp(p + off, "fmt ", 4) == 0 && size >= 16 && off + 8 + 12 <= n) {
      const uint8_t *b = p + off + 8 + 8;
      *byte_rate =
          (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    }
    if (memcmp(p + off, "data", 4) == 0) {
      *declared = size;
      *present = n - (off + 8);
      return 1;
    }
    uint64_t next = (uint64_t)off + 8 + size + (size & 1);
    if (next > n) return 0;
    off = (size_t)next;
  }
  return 0;
}

/* Reads the whole stream averaged to mono into *mono (caller frees), at most cap frames. */
static int decode_mono(SNDFILE *sf, const SF_INFO *info, int64_t cap, double max_seconds,
                       const char *fmt, float **mono, int64_t *frames, char *err, size_t errlen) {
  int ch = info->channels;
  int known = info->frames > 0 && info->frames != SF_COUNT_MAX;
  size_t have = known ? (size_t)info->frames : 16384;
  float *blk = malloc((size_t)READ_FRAMES * (size_t)ch * sizeof *blk);
  float *y = malloc(have * sizeof *y);
  if (!blk || !y) {
    free(blk);
    free(y);
    return anna_err(err, errlen, ANNA_ENOMEM, "audio: %s: %zu frames", fmt, have);
  }
  int64_t n = 0;
  for (;;) {
    /* A known length is read and no further, as soundfile's read(frames=-1) does (for MP3 the
     * header's count can be an estimate, and the reference keeps exactly that many). */
    sf_count_t want_now = READ_FRAMES;
    if (known && info->frames - n < want_now) want_now = info->frames - n;
    if (want_now <= 0) break;
    sf_count_t got = sf_readf_float(sf, blk, want_now);
    if (got <= 0) break;
    if (n + got > cap) {
      free(blk);
      free(y);
      return anna_err(err, errlen, ANNA_EINVAL,
                      "audio: %s decodes to more than the %g-second limit (its header gave no "
                      "length)",
                      fmt, max_seconds);
    }
    if ((size_t)(n + got) > have) {
      size_t want = have * 2 > (size_t)(n + got) ? have * 2 : (size_t)(n + got);
      if (want > (size_t)cap) want = (size_t)cap;
      float *t = realloc(y, want * sizeof *y);
      if (!t) {
        free(blk);
        free(y);
        return anna_err(err, errlen, ANNA_ENOMEM, "audio: %s: %zu frames", fmt, want);
      }
      y = t;
      have = want;
    }
    for (sf_count_t f = 0; f < got; f++) {
      const float *fr = blk + (size_t)f * (size_t)ch;
      float s = fr[0];
      for (int c = 1; c < ch; c++)
        s += fr[c];
      y[n + f] = ch == 1 ? s : s / (float)ch;
    }
    n += got;
  }
  free(blk);
  int e = sf_error(sf);
  if (e != SF_ERR_NO_ERROR) {
    free(y);
    return anna_err(err, errlen, ANNA_EINVAL,
                    "audio: %s is corrupt or truncated after %lld frames: %s", fmt, (long long)n,
                    sf_error_number(e));
  }
  /* MP3 without a Xing/Info header has an estimated length: a short tail (one or two MPEG
   * frames, or 1%) is tolerated there, as soundfile silently returns what decoded. */
  int64_t slack = 0;
  if ((info->format & SF_FORMAT_TYPEMASK) == MAJOR_MPEG)
    slack = info->frames / 100 > 2304 ? info->frames / 100 : 2304;
  if (known && n + slack < info->frames) {
    free(y);
    return anna_err(err, errlen, ANNA_EINVAL,
                    "audio: %s is truncated: the header declares %lld frames, only %lld decode",
                    fmt, (long long)info->frames, (long long)n);
  }
  if (n == 0) {
    free(y);
    return anna_err(err, errlen, ANNA_EINVAL, "audio: %s holds no samples (zero-length audio)",
                    fmt);
  }
  *mono = y;
  *frames = n;
  return 0;
}
#endif

static int decode_at(const uint8_t *data, size_t n, double max_seconds, int32_t rate, int normalise,
                     media_audio *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (!data || n == 0) return anna_err(err, errlen, ANNA_EINVAL, "audio: empty input (0 bytes)");
  if (!(max_seconds > 0.0) || max_seconds > 1e7)
    return anna_err(err, errlen, ANNA_EINVAL, "audio: max_seconds %g must be in (0, 1e7]",
                    max_seconds);
#if ANNA_HAVE_SNDFILE && ANNA_HAVE_SOXR
  membuf mb = {.p = data, .n = (sf_count_t)n, .pos = 0};
  SF_VIRTUAL_IO vio = {vio_len, vio_seek, vio_read, vio_write, vio_tell};
  SF_INFO info;
  memset(&info, 0, sizeof info);
  SNDFILE *sf = sf_open_virtual(&vio, SFM_READ, &info, &mb);
  if (!sf)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "audio: not a readable audio file (%zu bytes: unknown format, or a corrupt "
                    "or truncated file): %s",
                    n, sf_strerror(NULL));
  char fmt[sizeof out->format];
  format_name(&info, fmt, sizeof fmt);
  int rc = 0;
  if (info.channels < 1 || info.channels > CHANNELS_MAX) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "audio: %s has %d channels (1..%d accepted)", fmt,
                  info.channels, CHANNELS_MAX);
    goto done;
  }
  if (info.samplerate < RATE_MIN || info.samplerate > RATE_MAX) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "audio: %s sample rate %d Hz outside [%d, %d]", fmt,
                  info.samplerate, RATE_MIN, RATE_MAX);
    goto done;
  }
  if (info.frames == 0) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "audio: %s holds no samples (zero-length audio)", fmt);
    goto done;
  }
  /* The limit, in source frames; checked on the header first, enforced while decoding. */
  int64_t cap = (int64_t)floor(max_seconds * (double)info.samplerate);
  uint64_t declared = 0, present = 0;
  uint32_t byte_rate = 0;
  /* 0 and 0xFFFFFFFF are what streaming writers put when the length was unknown. */
  if (riff_data_chunk(data, n, &declared, &present, &byte_rate) && declared != 0 &&
      declared != 0xFFFFFFFFu) {
    if (byte_rate > 0 && (double)declared / byte_rate > max_seconds) {
      rc = anna_err(err, errlen, ANNA_EINVAL, "audio: %s declares %.1f s, over the %g-second limit",
                    fmt, (double)declared / byte_rate, max_seconds);
      goto done;
    }
    if (declared > present) {
      rc = anna_err(err, errlen, ANNA_EINVAL,
                    "audio: %s is truncated: its data chunk declares %llu bytes, %llu are present",
                    fmt, (unsigned long long)declared, (unsigned long long)present);
      goto done;
    }
  }
  if (info.frames > 0 && info.frames != SF_COUNT_MAX && info.frames > cap) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "audio: %s lasts %.1f s, over the %g-second limit", fmt,
                  (double)info.frames / info.samplerate, max_seconds);
    goto done;
  }
  /* Float reads are scaled to [-1, 1) from integer formats (libsndfile's default, which
   * soundfile keeps). */
  float *mono = NULL;
  int64_t frames = 0;
  rc = decode_mono(sf, &info, cap, max_seconds, fmt, &mono, &frames, err, errlen);
  if (rc) goto done;
  float *y = NULL;
  int64_t ny = 0;
  rc = media_audio_resample(mono, frames, info.samplerate, rate, &y, &ny, err, errlen);
  free(mono);
  if (rc) goto done;
  if (ny < 1) { /* a few source frames can round to nothing */
    free(y);
    rc = anna_err(err, errlen, ANNA_EINVAL, "audio: %s is too short (%lld frames at %d Hz)", fmt,
                  (long long)frames, info.samplerate);
    goto done;
  }
  if (normalise) media_audio_peak_normalise(y, ny);
  out->samples = y;
  out->n = ny;
  out->src_rate = info.samplerate;
  out->src_channels = info.channels;
  out->src_frames = frames;
  memcpy(out->format, fmt, sizeof out->format);
done:
  sf_close(sf);
  return rc;
#else
  (void)n;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "audio: anna was built without %s (install %s and reconfigure)",
                  ANNA_HAVE_SNDFILE ? "libsoxr" : "libsndfile",
                  ANNA_HAVE_SNDFILE ? "libsoxr-dev" : "libsndfile1-dev");
#endif
}

int media_audio_decode(const uint8_t *data, size_t n, double max_seconds, media_audio *out,
                       char *err, size_t errlen) {
  return decode_at(data, n, max_seconds, MEDIA_AUDIO_RATE, 1, out, err, errlen);
}

int media_audio_decode_rate(const uint8_t *data, size_t n, double max_seconds, int32_t rate,
                            media_audio *out, char *err, size_t errlen) {
  if (rate < 1000 || rate > 768000) {
    memset(out, 0, sizeof *out);
    return anna_err(err, errlen, ANNA_EINVAL, "audio: target rate %d outside [1000, 768000]", (int)rate);
  }
  return decode_at(data, n, max_seconds, rate, 0, out, err, errlen);
}
