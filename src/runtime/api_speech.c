/* api_speech.c: anna_speech (anna.h, "Speech synthesis"): a Qwen3-TTS talker
 * (model/tts_qwen3.h) whose frames feed the 12 Hz codec's streaming decoder
 * (model/codec_qwen3_tts.h) chunk by chunk, and anna_audio_encoder: PCM -> wav / pcm / flac /
 * opus / mp3 through libsndfile (a file, or a byte stream through virtual I/O).
 *
 * The talker calls back per frame (tts_qwen3_request.on_frame); frames are buffered until a
 * chunk is due, then decoded on the codec's one stream and handed to the caller. A chunk that
 * is a multiple of the codec's n_batch (16) steps exactly as a one-pass decode does, so the
 * default schedule reproduces anna-speak's former whole-file output bit for bit.
 */
#define _POSIX_C_SOURCE 200809L
#include "anna/anna.h"
#include "backends/registry.h"
#include "base/error.h"
#include "base/tuning.h"
#include "media/audio.h"
#include "media/tempo.h"
#include "model/kind.h"
#include "model/tts_qwen3.h"
#include "model/tts_spk_qwen3.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef ANNA_HAVE_SNDFILE
#include <sndfile.h>
#endif

#define CODEC_STEP 16 /* the codec state's n_batch: frames per internal decode step */

struct anna_speech {
  tts_qwen3 *talker;
  tts_spk *spk; /* a Base checkpoint's speaker encoder (NULL otherwise) */
  tokenizer *tok; /* NULL: no tokenizer.json (text_ids requests only) */
  char tok_path[PATH_MAX];
  const model_kind *ck;
  void *codec, *cst;
  ops_backend *cbe;
  model_desc cd;
  ops_model_shape cshape; /* the codec backend keeps a pointer to it */
  /* The device both decoders run on (tuning encoder_cpu: the CPU), and the talker's backend:
   * created at the first request and kept (a device mirrors the weights once), recreated only
   * when a request needs more prefill rows or positions than it was sized for. */
  const backend_info *bi;
  int dev_index;
  ops_backend *tbe;
  int tbe_batch, tbe_ctx;
  ops_model_shape tshape; /* the talker backend keeps a pointer to it */
  anna_tuning tuning;
  int n_threads, max_frames;
  char describe[400];
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int anna_speech_probe(const char *path) {
  if (!path) return 0;
  char p[PATH_MAX];
  if (snprintf(p, sizeof p, "%s/config.json", path) >= (int)sizeof p) return 0;
  json_t *j = json_load_file(p, 0, NULL);
  const char *mt = j ? json_string_value(json_object_get(j, "model_type")) : NULL;
  int yes = mt && !strcmp(mt, "qwen3_tts");
  json_decref(j);
  return yes;
}

void anna_speech_free(anna_speech *s) {
  if (!s) return;
  if (s->cst) s->ck->state_free(s->cst);
  if (s->cbe) s->cbe->destroy(s->cbe);
  if (s->tbe) s->tbe->destroy(s->tbe);
  if (s->codec) s->ck->free(s->codec);
  tokenizer_free(s->tok);
  tts_qwen3_free(s->talker);
  tts_spk_free(s->spk);
  free(s);
}

int anna_speech_load(anna_speech **out, const char *dir, const anna_speech_options *opt, char *err, size_t errlen) {
  *out = NULL;
  if (!dir) return anna_err(err, errlen, ANNA_EINVAL, "no model folder given");
  const anna_speech_options o = opt ? *opt : (anna_speech_options){0};
  anna_speech *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  s->n_threads = o.n_threads > 0 ? o.n_threads : 2;
  s->max_frames = o.max_frames > 0 ? o.max_frames : 2048;
  int rc = tuning_from_env(&s->tuning, o.tuning, err, errlen);
  backend_device dev = {0};
  int n_dev = 0;
  if (!rc) rc = backend_registry_pick_list(o.device, &dev, 1, &n_dev, err, errlen);
  if (!rc) {
    /* encoder_cpu: the comparison path, whatever the device asked for */
    s->bi = s->tuning.encoder_cpu ? backend_registry_get(0) : dev.bi;
    s->dev_index = s->tuning.encoder_cpu ? 0 : dev.index;
    rc = tts_qwen3_load(&s->talker, dir, err, errlen);
  }
  if (!rc && tts_qwen3_is_base(s->talker)) rc = tts_spk_load(&s->spk, dir, err, errlen);
  if (rc) goto fail;
  /* the tokenizer: optional at load, so fixtures without one still serve text_ids */
  if (o.tokenizer)
    snprintf(s->tok_path, sizeof s->tok_path, "%s", o.tokenizer);
  else
    snprintf(s->tok_path, sizeof s->tok_path, "%s/tokenizer.json", dir);
  FILE *tf = fopen(s->tok_path, "rb");
  if (tf) {
    fclose(tf);
    if ((rc = tokenizer_load_json(&s->tok, s->tok_path, err, errlen))) goto fail;
  } else if (o.tokenizer) {
    rc = anna_err(err, errlen, ANNA_EIO, "%s: cannot open the tokenizer", o.tokenizer);
    goto fail;
  }
  /* the codec: one stream, persistent across utterances (reset per request) */
  if (!(s->ck = model_kind_by_name("qwen3_tts_codec"))) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "the qwen3_tts_codec kind is not compiled in");
    goto fail;
  }
  char cpath[PATH_MAX];
  if (o.codec_dir)
    snprintf(cpath, sizeof cpath, "%s", o.codec_dir);
  else
    snprintf(cpath, sizeof cpath, "%s/speech_tokenizer", dir);
  model_source src = {.path = cpath};
  snprintf(src.model_type, sizeof src.model_type, "qwen3_tts_tokenizer_12hz");
  const model_load_params lp = {.tuning = &s->tuning};
  if ((rc = s->ck->load(&s->codec, &src, &lp, err, errlen))) goto fail;
  s->ck->describe(s->codec, &s->cd);
  s->ck->backend_shape(s->codec, 1024, &s->cshape);
  const backend_params cbp = {.n_threads = s->n_threads,
                              .device_index = s->dev_index,
                              .n_batch = CODEC_STEP,
                              .shape = &s->cshape,
                              .tuning = &s->tuning};
  const model_state_params sp = {.n_seq = 1, .n_ctx = 1024, .n_batch = CODEC_STEP};
  if ((rc = s->bi->create(&cbp, &s->cbe, err, errlen)) ||
      (rc = s->ck->state_create(&s->cst, s->codec, s->cbe, &sp, err, errlen)))
    goto fail;
  if (s->cd.sample_rate <= 0 || s->cd.samples_per_frame <= 0) {
    rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: the codec reports no PCM output", cpath);
    goto fail;
  }
  model_desc td;
  tts_qwen3_kind.describe(s->talker, &td);
  snprintf(s->describe, sizeof s->describe, "%s; codec %d Hz, %d samples per frame%s", td.text ? td.text : "qwen3_tts",
           s->cd.sample_rate, s->cd.samples_per_frame, s->tok ? "" : "; no tokenizer.json (token ids only)");
  *out = s;
  return 0;
fail:
  anna_speech_free(s);
  return rc;
}

int anna_speech_sample_rate(const anna_speech *s) {
  return s->cd.sample_rate;
}

int anna_speech_frame_samples(const anna_speech *s) {
  return s->cd.samples_per_frame;
}

const char *anna_speech_describe(const anna_speech *s) {
  return s->describe;
}

int anna_speech_speed_check(double speed, char *err, size_t errlen) {
  if (speed == 0 || speed == 1) return 0;
  if (!(speed >= MEDIA_TEMPO_MIN && speed <= MEDIA_TEMPO_MAX))
    return anna_err(err, errlen, ANNA_EINVAL, "speed %g is not in [%g, %g]", speed, MEDIA_TEMPO_MIN,
                    MEDIA_TEMPO_MAX);
  if (!media_tempo_available())
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "speed %g: anna was built without libavfilter (install libavfilter-dev and reconfigure)", speed);
  return 0;
}

int anna_speech_clone_dim(const anna_speech *s) {
  return s && s->spk ? tts_spk_dim(s->spk) : 0;
}

int anna_speech_clone_embed(const anna_speech *s, const void *audio, size_t n, float *out, char *err,
                            size_t errlen) {
  if (!s || !s->spk)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "voice cloning needs a Qwen3-TTS Base checkpoint (this one has no speaker encoder)");
  if (!out) return anna_err(err, errlen, ANNA_EINVAL, "anna_speech_clone_embed: NULL output");
  media_audio au;
  /* as qwen-tts: decoded, channels averaged, resampled (soxr HQ) to 24 kHz, not normalised */
  int rc = media_audio_decode_rate(audio, n, ANNA_SPEECH_CLONE_MAX_SECONDS, TTS_SPK_RATE, &au, err, errlen);
  if (rc) return rc;
  rc = tts_spk_embed(s->spk, au.samples, au.n, out, err, errlen);
  media_audio_free(&au);
  return rc;
}

int anna_speech_takes_instructions(const anna_speech *s) {
  return s && tts_qwen3_takes_instructions(s->talker);
}

const char *anna_speech_voice(const anna_speech *s, int i) {
  return tts_qwen3_speaker(s->talker, i);
}

/* ids of the assistant wrapping: specials parsed in the frame, not in the user's text */
/* parts[0] + parts[1] + parts[2] tokenized, the middle one (user text) without special-token
 * parsing, the wrappings with it. */
static int encode_parts(const tokenizer *tok, const char *const parts[3], int32_t **out, int *n, char *err,
                        size_t errlen) {
  int32_t *all = NULL;
  size_t total = 0;
  int rc = 0;
  for (int i = 0; i < 3 && !rc; i++) {
    int32_t *ids = NULL;
    size_t k = 0;
    rc = tokenizer_encode(tok, parts[i], strlen(parts[i]), i == 1 ? TOKENIZER_ENCODE_NO_PARSE_SPECIAL : 0, &ids, &k,
                          err, errlen);
    if (rc) break;
    int32_t *na = realloc(all, (total + k + 1) * sizeof *na);
    if (!na) {
      free(ids);
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      break;
    }
    all = na;
    if (k) memcpy(all + total, ids, k * sizeof *ids);
    total += k;
    free(ids);
  }
  if (rc || total > INT_MAX) {
    free(all);
    return rc ? rc : anna_err(err, errlen, ANNA_ERANGE, "the text is too long");
  }
  *out = all, *n = (int)total;
  return 0;
}

static int encode_text(const tokenizer *tok, const char *text, int32_t **out, int *n, char *err, size_t errlen) {
  const char *parts[3] = {"<|im_start|>assistant\n", text, "<|im_end|>\n<|im_start|>assistant\n"};
  return encode_parts(tok, parts, out, n, err, errlen);
}

/* the per-request streaming state the talker's frame callback drives */
typedef struct synth {
  anna_speech *s;
  const anna_speech_request *rq;
  anna_speech_chunk_fn fn;
  void *user;
  int32_t *codes; /* pending frames [cap * 16] */
  int pending, first, later, sent_chunks, decoded;
  float *pcm; /* [max(first, later) * samples_per_frame] */
  anna_speech_stats st;
  double t0, codec_s;
  int rc;
  char *err;
  size_t errlen;
  media_tempo *tempo; /* speed != 1: the PCM passes through atempo first (owned) */
} synth;

/* The caller's callback for PCM that is ready to leave (after the tempo filter, if any). */
static int deliver(void *user, const float *pcm, int64_t n) {
  synth *y = user;
  if (!y->sent_chunks++) y->st.first_chunk_s = now_s() - y->t0;
  y->st.n_samples += n;
  if (y->fn(y->user, pcm, n)) y->st.stopped = 1;
  return y->st.stopped;
}

static int flush_frames(synth *y) {
  if (!y->pending) return 0;
  anna_speech *s = y->s;
  const double t = now_s();
  const model_input in = {.io = MODEL_IO_CODES, .codes = y->codes, .n_frames = y->pending, .n_codebooks = TTS_QWEN3_GROUPS};
  const model_output out = {.io = MODEL_IO_PCM, .pcm = y->pcm};
  int rc = s->ck->run(s->codec, s->cst, s->cbe, &in, &out, y->err, y->errlen);
  y->codec_s += now_s() - t;
  if (rc) return y->rc = rc;
  const int64_t n = (int64_t)y->pending * s->cd.samples_per_frame;
  y->pending = 0;
  y->decoded++;
  if (!y->tempo) return deliver(y, y->pcm, n);
  rc = media_tempo_push(y->tempo, y->pcm, n, 0, deliver, y, y->err, y->errlen);
  if (rc && !y->st.stopped) return y->rc = rc;
  return y->st.stopped;
}

static int on_talker_frame(void *user, const int32_t *codes, int f) {
  synth *y = user;
  y->st.n_frames = f + 1;
  if (y->rq->on_frame) y->rq->on_frame(y->user, codes, TTS_QWEN3_GROUPS, f);
  memcpy(y->codes + (int64_t)y->pending * TTS_QWEN3_GROUPS, codes, TTS_QWEN3_GROUPS * sizeof *codes);
  y->pending++;
  const int due = y->decoded ? y->later : y->first;
  if (y->pending < due) return 0;
  return flush_frames(y);
}

/* The talker's backend on s's device for prefills of n_batch rows and n_ctx positions: the
 * kept one when it is large enough, else a new one sized in steps (256 rows, 1024 positions),
 * so a few request sizes share one backend and its weight mirror. */
static int talker_backend(anna_speech *s, int n_batch, int n_ctx, char *err, size_t errlen) {
  if (s->tbe && n_batch <= s->tbe_batch && n_ctx <= s->tbe_ctx) return 0;
  if (s->tbe) s->tbe->destroy(s->tbe);
  s->tbe = NULL;
  const int nb = (n_batch + 255) / 256 * 256, nc = (n_ctx + 1023) / 1024 * 1024;
  tts_qwen3_backend_shape(s->talker, nc, &s->tshape);
  const backend_params bp = {
      .n_threads = s->n_threads, .device_index = s->dev_index, .n_batch = nb, .shape = &s->tshape, .tuning = &s->tuning};
  const int rc = s->bi->create(&bp, &s->tbe, err, errlen);
  if (rc) return rc;
  s->tbe_batch = nb, s->tbe_ctx = nc;
  return 0;
}

int anna_speech_synthesize(anna_speech *s, const anna_speech_request *rq, anna_speech_chunk_fn fn, void *user,
                           anna_speech_stats *st, char *err, size_t errlen) {
  if (st) memset(st, 0, sizeof *st);
  if (!s || !rq || !fn) return anna_err(err, errlen, ANNA_EINVAL, "anna_speech_synthesize: NULL argument");
  const int speed_on = rq->speed != 0 && rq->speed != 1;
  int src = anna_speech_speed_check(rq->speed, err, errlen);
  if (src) return src;
  const double t0 = now_s();
  int32_t *own_ids = NULL, *own_ins = NULL;
  const int32_t *ids = rq->text_ids, *ins = rq->instruct_ids;
  int n_ids = rq->n_text_ids, n_ins = rq->n_instruct_ids, rc = 0;
  if (!ids) {
    if (!rq->text || !*rq->text) return anna_err(err, errlen, ANNA_EINVAL, "the text is empty");
    if (!s->tok)
      return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: no tokenizer (pass text ids, or a tokenizer.json)",
                      s->tok_path);
    if ((rc = encode_text(s->tok, rq->text, &own_ids, &n_ids, err, errlen))) return rc;
    ids = own_ids;
  }
  if (!ins && rq->instructions && *rq->instructions) {
    const char *parts[3] = {"<|im_start|>user\n", rq->instructions, "<|im_end|>\n"};
    rc = s->tok ? encode_parts(s->tok, parts, &own_ins, &n_ins, err, errlen)
                : anna_err(err, errlen, ANNA_ENOTFOUND, "%s: no tokenizer (pass instruction ids, or a tokenizer.json)",
                           s->tok_path);
    if (rc) {
      free(own_ids);
      return rc;
    }
    ins = own_ins;
  }
  const int max_frames = rq->max_frames > 0 && rq->max_frames < s->max_frames ? rq->max_frames : s->max_frames;
  synth y = {.s = s, .rq = rq, .fn = fn, .user = user, .t0 = t0, .err = err, .errlen = errlen};
  y.later = rq->chunk_frames > 0 ? rq->chunk_frames : CODEC_STEP;
  y.first = rq->first_chunk_frames > 0 ? rq->first_chunk_frames : y.later;
  if (y.later > max_frames) y.later = max_frames;
  if (y.first > max_frames) y.first = max_frames;
  y.st.n_text_tokens = n_ids;
  if (speed_on && (rc = media_tempo_create(&y.tempo, anna_speech_sample_rate(s), rq->speed, err, errlen))) {
    free(own_ids);
    free(own_ins);
    return rc;
  }
  tts_qwen3_request tr = {.ids = ids,
                          .n_ids = n_ids,
                          .speaker = rq->voice,
                          .instruct_ids = ins,
                          .n_instruct_ids = ins ? n_ins : 0,
                          .language = rq->language && *rq->language ? rq->language : "auto",
                          .max_frames = max_frames,
                          .greedy = rq->greedy,
                          .seed = rq->seed,
                          .on_frame = on_talker_frame,
                          .user = &y,
                          .speaker_embed = rq->voice_embed};
  tts_qwen3_state *ts = NULL;
  const int P = tts_qwen3_prefill_len(s->talker, &tr, err, errlen);
  if (P < 0) {
    rc = P;
    goto done;
  }
  const int n_ctx = P + max_frames + 1 > 16 ? P + max_frames + 1 : 16;
  const int cap = y.first > y.later ? y.first : y.later;
  if (!(y.codes = malloc((size_t)cap * TTS_QWEN3_GROUPS * sizeof *y.codes)) ||
      !(y.pcm = malloc((size_t)cap * (size_t)s->cd.samples_per_frame * sizeof *y.pcm))) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    goto done;
  }
  if ((rc = talker_backend(s, P > 16 ? P : 16, n_ctx, err, errlen)) ||
      (rc = tts_qwen3_state_create(&ts, s->talker, s->tbe, n_ctx, err, errlen)))
    goto done;
  s->ck->seq->reset(s->cst, 0); /* a new utterance on the codec's stream */
  /* generate's scratch for all frames: the callback consumed them, the array only satisfies
   * its contract (codes[max_frames * 16]) */
  int32_t *all = malloc((size_t)max_frames * TTS_QWEN3_GROUPS * sizeof *all);
  if (!all) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    goto done;
  }
  int nf = 0;
  rc = tts_qwen3_generate(s->talker, ts, &tr, all, &nf, NULL, err, errlen);
  free(all);
  if (!rc) rc = y.rc; /* a codec failure inside the callback */
  if (!rc && !y.st.stopped) flush_frames(&y);
  if (!rc) rc = y.rc;
  if (!rc && y.tempo && !y.st.stopped) { /* the filter's tail */
    rc = media_tempo_push(y.tempo, NULL, 0, 1, deliver, &y, err, errlen);
    if (y.st.stopped) rc = 0;
  }
  if (!rc && y.st.n_frames == 0)
    rc = anna_err(err, errlen, ANNA_ERANGE, "the talker produced no frames (codec eos first)");
done:
  y.st.codec_s = y.codec_s;
  y.st.total_s = now_s() - t0;
  y.st.talker_s = y.st.total_s - y.codec_s;
  if (st) *st = y.st;
  tts_qwen3_state_free(ts);
  free(y.codes);
  free(y.pcm);
  media_tempo_free(y.tempo);
  free(own_ids);
  free(own_ins);
  return rc;
}

/* ---- audio encoding ---- */

struct anna_audio_encoder {
  int raw_stream; /* "pcm" / streamed "wav": our own s16le bytes, no libsndfile state */
  anna_bytes_fn fn;
  void *user;
#ifdef ANNA_HAVE_SNDFILE
  SNDFILE *sf;
#endif
  /* virtual file of a stream encoder: bytes before `sent` already left through fn */
  unsigned char *buf; /* bytes [sent, len) */
  size_t cap;
  int64_t sent, len, pos;
  int failed, finished;
  short *s16; /* conversion scratch of the raw path */
  size_t s16_cap;
};

typedef struct fmt_info {
  const char *name, *mime;
  int sf_format;
} fmt_info;

static const fmt_info *fmt_find(const char *format) {
#ifdef ANNA_HAVE_SNDFILE
  static const fmt_info fmts[] = {
      {"wav", "audio/wav", SF_FORMAT_WAV | SF_FORMAT_PCM_16},
      {"pcm", "audio/pcm", SF_FORMAT_RAW | SF_FORMAT_PCM_16 | SF_ENDIAN_LITTLE},
      {"flac", "audio/flac", SF_FORMAT_FLAC | SF_FORMAT_PCM_16},
      {"opus", "audio/ogg", SF_FORMAT_OGG | SF_FORMAT_OPUS},
      {"mp3", "audio/mpeg", SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III},
  };
#else
  static const fmt_info fmts[] = {{"wav", "audio/wav", 0}, {"pcm", "audio/pcm", 0}, {"flac", "audio/flac", 0},
                                  {"opus", "audio/ogg", 0}, {"mp3", "audio/mpeg", 0}};
#endif
  for (size_t i = 0; format && i < sizeof fmts / sizeof fmts[0]; i++)
    if (!strcmp(format, fmts[i].name)) return &fmts[i];
  return NULL;
}

const char *anna_audio_format_mime(const char *format) {
  const fmt_info *f = fmt_find(format);
  return f ? f->mime : NULL;
}

int anna_audio_format_check(const char *format, char *err, size_t errlen) {
  const fmt_info *f = fmt_find(format);
  if (!f)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "audio format '%s' is not supported (have: wav, pcm, flac, opus, mp3)",
                    format ? format : "(null)");
#ifdef ANNA_HAVE_SNDFILE
  SF_INFO info = {.samplerate = 24000, .channels = 1, .format = f->sf_format};
  if (!sf_format_check(&info))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "audio format '%s': this build's libsndfile (%s) cannot write it",
                    format, sf_version_string());
  return 0;
#else
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "audio format '%s' needs libsndfile (libsndfile1-dev) at build time",
                  format);
#endif
}

static int enc_emit(anna_audio_encoder *e, const void *p, size_t n) {
  if (!n || e->failed) return e->failed;
  if (e->fn(e->user, p, n)) e->failed = 1;
  return e->failed;
}

/* hands the settled bytes [sent, len) to the stream */
static int enc_flush(anna_audio_encoder *e) {
  if (e->len > e->sent) {
    enc_emit(e, e->buf, (size_t)(e->len - e->sent));
    e->sent = e->len;
  }
  return e->failed;
}

#ifdef ANNA_HAVE_SNDFILE
static sf_count_t vio_len(void *u) {
  return ((anna_audio_encoder *)u)->len;
}
static sf_count_t vio_seek(sf_count_t off, int whence, void *u) {
  anna_audio_encoder *e = u;
  sf_count_t p = whence == SEEK_SET ? off : whence == SEEK_CUR ? e->pos + off : e->len + off;
  if (p < 0) return -1;
  e->pos = p;
  return p;
}
static sf_count_t vio_read(void *ptr, sf_count_t n, void *u) {
  (void)ptr, (void)n, (void)u;
  return 0; /* write-only */
}
/* Bytes before `sent` are on the wire: a rewrite there (a header patched at close) is dropped. */
static sf_count_t vio_write(const void *ptr, sf_count_t n, void *u) {
  anna_audio_encoder *e = u;
  const unsigned char *p = ptr;
  int64_t at = e->pos, end = e->pos + n;
  e->pos = end;
  if (end <= e->sent) return n;
  if (at < e->sent) p += e->sent - at, at = e->sent;
  const size_t need = (size_t)(end - e->sent);
  if (need > e->cap) {
    size_t nc = e->cap ? e->cap : 4096;
    while (nc < need) nc *= 2;
    unsigned char *nb = realloc(e->buf, nc);
    if (!nb) {
      e->failed = 1;
      return 0;
    }
    e->buf = nb, e->cap = nc;
  }
  if (at > e->len) memset(e->buf + (e->len - e->sent), 0, (size_t)(at - e->len)); /* a hole past the end */
  memcpy(e->buf + (at - e->sent), p, (size_t)(end - at));
  if (end > e->len) e->len = end;
  return n;
}
static sf_count_t vio_tell(void *u) {
  return ((anna_audio_encoder *)u)->pos;
}
#endif

static void put32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8), p[2] = (unsigned char)(v >> 16), p[3] = (unsigned char)(v >> 24);
}

static int enc_open(anna_audio_encoder **out, const char *format, int rate, const char *path, anna_bytes_fn fn,
                    void *user, char *err, size_t errlen) {
  *out = NULL;
  int rc = anna_audio_format_check(format, err, errlen);
  if (rc) return rc;
  if (rate <= 0) return anna_err(err, errlen, ANNA_EINVAL, "sample rate %d", rate);
#ifdef ANNA_HAVE_SNDFILE
  const fmt_info *f = fmt_find(format);
  anna_audio_encoder *e = calloc(1, sizeof *e);
  if (!e) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  e->fn = fn, e->user = user;
  SF_INFO info = {.samplerate = rate, .channels = 1, .format = f->sf_format};
  if (path) {
    e->sf = sf_open(path, SFM_WRITE, &info);
    if (!e->sf) {
      rc = anna_err(err, errlen, ANNA_EIO, "%s: %s", path, sf_strerror(NULL));
      free(e);
      return rc;
    }
  } else if (!strcmp(format, "pcm") || !strcmp(format, "wav")) {
    /* libsndfile's WAV writer patches sizes at close; a stream cannot, so our own header with
     * the "unknown" sizes, and the samples converted as libsndfile converts them */
    e->raw_stream = 1;
    if (!strcmp(format, "wav")) {
      unsigned char h[44];
      memcpy(h, "RIFF", 4), put32(h + 4, 0xFFFFFFFFu), memcpy(h + 8, "WAVEfmt ", 8);
      put32(h + 16, 16), h[20] = 1, h[21] = 0, h[22] = 1, h[23] = 0; /* PCM, mono */
      put32(h + 24, (uint32_t)rate), put32(h + 28, (uint32_t)rate * 2), h[32] = 2, h[33] = 0, h[34] = 16, h[35] = 0;
      memcpy(h + 36, "data", 4), put32(h + 40, 0xFFFFFFFFu);
      if (enc_emit(e, h, sizeof h)) {
        free(e);
        return anna_err(err, errlen, ANNA_EIO, "the output stream refused the header");
      }
    }
  } else {
    static SF_VIRTUAL_IO vio = {vio_len, vio_seek, vio_read, vio_write, vio_tell};
    e->sf = sf_open_virtual(&vio, SFM_WRITE, &info, e);
    if (!e->sf) {
      rc = anna_err(err, errlen, ANNA_EIO, "%s encoder: %s", format, sf_strerror(NULL));
      free(e->buf);
      free(e);
      return rc;
    }
    if (enc_flush(e)) {
      sf_close(e->sf);
      free(e->buf);
      free(e);
      return anna_err(err, errlen, ANNA_EIO, "the output stream refused the header");
    }
  }
  if (e->sf && f->sf_format == (SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III)) {
    /* constant 128 kbit/s: a streamed mp3 cannot get the VBR seek table written at the end */
    int mode = SF_BITRATE_MODE_CONSTANT;
    double q = 0.5;
    sf_command(e->sf, SFC_SET_BITRATE_MODE, &mode, sizeof mode);
    sf_command(e->sf, SFC_SET_COMPRESSION_LEVEL, &q, sizeof q);
  }
  *out = e;
  return 0;
#else
  (void)path, (void)fn, (void)user;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "audio encoding needs libsndfile");
#endif
}

int anna_audio_encoder_file(anna_audio_encoder **out, const char *format, int sample_rate, const char *path,
                            char *err, size_t errlen) {
  if (!path) return anna_err(err, errlen, ANNA_EINVAL, "no output path");
  return enc_open(out, format, sample_rate, path, NULL, NULL, err, errlen);
}

int anna_audio_encoder_stream(anna_audio_encoder **out, const char *format, int sample_rate, anna_bytes_fn fn,
                              void *user, char *err, size_t errlen) {
  if (!fn) return anna_err(err, errlen, ANNA_EINVAL, "no byte callback");
  return enc_open(out, format, sample_rate, NULL, fn, user, err, errlen);
}

int anna_audio_encoder_write(anna_audio_encoder *e, const float *pcm, int64_t n, char *err, size_t errlen) {
  if (e->finished) return anna_err(err, errlen, ANNA_ESTATE, "the encoder is finished");
  if (n <= 0) return 0;
  if (e->raw_stream) {
    if ((size_t)n > e->s16_cap) {
      short *ns = realloc(e->s16, (size_t)n * sizeof *ns);
      if (!ns) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      e->s16 = ns, e->s16_cap = (size_t)n;
    }
    /* libsndfile's float -> 16-bit conversion (normalized: x 0x7FFF, rounded), little endian */
    for (int64_t i = 0; i < n; i++) {
      float x = pcm[i] * (float)0x7FFF;
      x = x > 32767.0f ? 32767.0f : x < -32768.0f ? -32768.0f : x;
      const uint16_t v = (uint16_t)(int16_t)lrintf(x);
      unsigned char *b = (unsigned char *)&e->s16[i];
      b[0] = (unsigned char)v, b[1] = (unsigned char)(v >> 8);
    }
    if (enc_emit(e, e->s16, (size_t)n * sizeof *e->s16)) return anna_err(err, errlen, ANNA_EIO, "the output stream closed");
    return 0;
  }
#ifdef ANNA_HAVE_SNDFILE
  if (sf_writef_float(e->sf, pcm, n) != n) return anna_err(err, errlen, ANNA_EIO, "encoder: %s", sf_strerror(e->sf));
  if (!e->fn) return 0;
  if (e->failed || enc_flush(e)) return anna_err(err, errlen, ANNA_EIO, "the output stream closed");
  return 0;
#else
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "audio encoding needs libsndfile");
#endif
}

int anna_audio_encoder_finish(anna_audio_encoder *e, char *err, size_t errlen) {
  if (e->finished) return 0;
  e->finished = 1;
  if (e->raw_stream) return 0;
#ifdef ANNA_HAVE_SNDFILE
  int rc = sf_close(e->sf);
  e->sf = NULL;
  if (rc) return anna_err(err, errlen, ANNA_EIO, "encoder close: %s", sf_error_number(rc));
  if (e->fn && (e->failed || enc_flush(e))) return anna_err(err, errlen, ANNA_EIO, "the output stream closed");
  return 0;
#else
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "audio encoding needs libsndfile");
#endif
}

void anna_audio_encoder_free(anna_audio_encoder *e) {
  if (!e) return;
#ifdef ANNA_HAVE_SNDFILE
  if (e->sf) sf_close(e->sf);
#endif
  free(e->buf);
  free(e->s16);
  free(e);
}
