/* speech_api.c: anna-serve's speech mode (speech_api.h). The connection thread validates the
 * request, queues a job and waits until the job has its first audio (or failed: then a 4xx /
 * 5xx is still possible); the answer is then a chunked response whose reader copies what the
 * worker produced, polling the socket so a vanished client cancels the job. The worker stages
 * the encoder's bytes and publishes them per PCM chunk, so header bytes alone never commit the
 * response before the synthesis has checked its input.
 */
#define _POSIX_C_SOURCE 200809L
#include "speech_api.h"

#include "anna/anna.h"
#include "metrics.h"
#include "oai.h"
#include "respond.h"

#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <strings.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPEECH_MAX_INPUT 4096      /* characters, as OpenAI */
#define SPEECH_MAX_QUEUE 32        /* jobs waiting */
#define SPEECH_FIRST_CHUNK 2       /* frames (160 ms of audio) before the first bytes leave */
#define SPEECH_MAX_BUFFERED (8 << 20) /* bytes produced and not yet read: the worker waits */
#define SPEECH_MAX_VOICES 256        /* registered voices (POST /v1/audio/voices) */
#define SPEECH_VOICE_NAME 64

typedef struct sjob {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;
  /* request (immutable once queued) */
  char *input, *voice, *language, *format, *instructions, rid[80];
  float *xvec; /* a registered voice's x-vector (owned copy), else NULL */
  double speed; /* 1: unchanged */
  int sse;
  uint64_t seed;
  int delay_ms; /* --debug-hooks: sleep after each 1-frame chunk (disconnect tests) */
  int max_frames; /* --debug-hooks: a frame cap (0: the speech object's), for benchmarks whose
                   * random-weight talkers would rarely sample codec eos */
  /* output, under mu */
  unsigned char *buf;
  size_t len, cap, off;
  int started, done, cancel, rc;
  char err[512];
  int n_text_tokens, n_frames;
  struct sjob *next;
} sjob;

struct speech_server {
  anna_speech *sp;
  char model_name[256];
  pthread_t th;
  int th_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  sjob *head, *tail;
  int n_waiting, running, stop;
  int debug_hooks;
  /* registered (cloned) voices: POST /v1/audio/voices; under vmu */
  pthread_mutex_t vmu;
  struct cvoice {
    char name[SPEECH_VOICE_NAME];
    float *xvec; /* [anna_speech_clone_dim], owned */
    char *transcript; /* owned, may be NULL: kept for the listing (cloning uses the x-vector) */
  } voices[SPEECH_MAX_VOICES];
  int n_voices;
};

static void job_release(sjob *j) {
  pthread_mutex_lock(&j->mu);
  int last = --j->refs == 0;
  pthread_mutex_unlock(&j->mu);
  if (!last) return;
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  free(j->input), free(j->voice), free(j->language), free(j->format), free(j->buf);
  free(j->instructions);
  free(j->xvec);
  free(j);
}

static void job_cancel(sjob *j) {
  pthread_mutex_lock(&j->mu);
  j->cancel = 1;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
}

/* appends under j->mu */
static int job_put(sjob *j, const void *p, size_t n) {
  if (j->len + n > j->cap) {
    size_t nc = j->cap ? j->cap : 16384;
    while (nc < j->len + n) nc *= 2;
    unsigned char *nb = realloc(j->buf, nc);
    if (!nb) return -1;
    j->buf = nb, j->cap = nc;
  }
  memcpy(j->buf + j->len, p, n);
  j->len += n;
  return 0;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* the staging area of one synthesis: encoder bytes not yet published */
typedef struct stage {
  sjob *j;
  anna_audio_encoder *enc;
  unsigned char *b;
  size_t n, cap;
  char *ev; /* SSE event scratch */
  size_t ev_cap;
  int oom;
  char err[512];
} stage;

static int stage_bytes(void *user, const void *p, size_t n) {
  stage *g = user;
  if (g->n + n > g->cap) {
    size_t nc = g->cap ? g->cap : 16384;
    while (nc < g->n + n) nc *= 2;
    unsigned char *nb = realloc(g->b, nc);
    if (!nb) return g->oom = 1;
    g->b = nb, g->cap = nc;
  }
  memcpy(g->b + g->n, p, n);
  g->n += n;
  return 0;
}

/* Moves the staged bytes to the job (raw, or one speech.audio.delta event). Returns nonzero
 * when the job is cancelled or memory ran out. */
static int stage_publish(stage *g) {
  sjob *j = g->j;
  int bad = g->oom;
  pthread_mutex_lock(&j->mu);
  while (!j->cancel && j->len - j->off > SPEECH_MAX_BUFFERED) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
  }
  if (!bad && !j->cancel && g->n) {
    if (j->off == j->len) j->off = j->len = 0;
    if (!j->sse) {
      bad = job_put(j, g->b, g->n);
    } else {
      static const char pre[] = "data: {\"type\":\"speech.audio.delta\",\"audio\":\"", post[] = "\"}\n\n";
      const size_t need = sizeof pre + (g->n + 2) / 3 * 4 + sizeof post;
      if (need > g->ev_cap) {
        char *ne = realloc(g->ev, need);
        if (!ne) bad = 1;
        else g->ev = ne, g->ev_cap = need;
      }
      if (!bad) {
        char *o = g->ev;
        memcpy(o, pre, sizeof pre - 1), o += sizeof pre - 1;
        for (size_t i = 0; i < g->n; i += 3) {
          const uint32_t v = (uint32_t)g->b[i] << 16 | (i + 1 < g->n ? (uint32_t)g->b[i + 1] << 8 : 0) |
                             (i + 2 < g->n ? g->b[i + 2] : 0);
          *o++ = B64[v >> 18 & 63], *o++ = B64[v >> 12 & 63];
          *o++ = i + 1 < g->n ? B64[v >> 6 & 63] : '=';
          *o++ = i + 2 < g->n ? B64[v & 63] : '=';
        }
        memcpy(o, post, sizeof post - 1), o += sizeof post - 1;
        bad = job_put(j, g->ev, (size_t)(o - g->ev));
      }
    }
    j->started = 1;
    pthread_cond_broadcast(&j->cv);
  }
  g->n = 0;
  if (bad) g->oom = 1;
  const int stop = bad || j->cancel;
  pthread_mutex_unlock(&j->mu);
  return stop;
}

static int on_chunk(void *user, const float *pcm, int64_t n) {
  stage *g = user;
  if (anna_audio_encoder_write(g->enc, pcm, n, g->err, sizeof g->err)) return 1;
  const int stop = stage_publish(g);
  if (!stop && g->j->delay_ms > 0) nanosleep(&(struct timespec){g->j->delay_ms / 1000, g->j->delay_ms % 1000 * 1000000L}, NULL);
  return stop;
}

static void job_run(speech_server *s, sjob *j) {
  stage g = {.j = j};
  anna_speech_stats st = {0};
  char err[512] = "";
  int rc = anna_audio_encoder_stream(&g.enc, j->format, anna_speech_sample_rate(s->sp), stage_bytes, &g, err,
                                     sizeof err);
  if (!rc) {
    /* a small first chunk for the time to first audio, then the codec's 16-frame steps */
    const anna_speech_request rq = {.text = j->input,
                                    .voice = j->voice,
                                    .language = j->language,
                                    .seed = j->seed,
                                    .instructions = j->instructions,
                                    .speed = j->speed,
                                    .voice_embed = j->xvec,
                                    .first_chunk_frames = j->delay_ms > 0 ? 1 : SPEECH_FIRST_CHUNK,
                                    .chunk_frames = j->delay_ms > 0 ? 1 : 16,
                                    .max_frames = j->max_frames};
    rc = anna_speech_synthesize(s->sp, &rq, on_chunk, &g, &st, err, sizeof err);
    if (!rc && st.stopped && g.err[0]) rc = ANNA_EIO, snprintf(err, sizeof err, "%s", g.err);
    if (!rc && g.oom) rc = ANNA_ENOMEM, snprintf(err, sizeof err, "out of memory staging the encoded audio");
    if (!rc && !st.stopped) {
      rc = anna_audio_encoder_finish(g.enc, err, sizeof err);
      if (!rc && (stage_publish(&g) || g.oom) && !j->cancel) rc = ANNA_ENOMEM, snprintf(err, sizeof err, "out of memory");
    }
  }
  anna_audio_encoder_free(g.enc);
  pthread_mutex_lock(&j->mu);
  j->n_text_tokens = st.n_text_tokens, j->n_frames = st.n_frames;
  if (!rc && j->sse && !j->cancel) {
    char done[256];
    int k = snprintf(done, sizeof done,
                     "data: {\"type\":\"speech.audio.done\",\"usage\":{\"input_tokens\":%d,\"output_tokens\":%d,"
                     "\"total_tokens\":%d}}\n\n",
                     st.n_text_tokens, st.n_frames, st.n_text_tokens + st.n_frames);
    if (j->off == j->len) j->off = j->len = 0;
    if (job_put(j, done, (size_t)k)) rc = ANNA_ENOMEM, snprintf(err, sizeof err, "out of memory");
  }
  j->rc = rc;
  snprintf(j->err, sizeof j->err, "%s", err);
  j->done = 1;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  slog(rc && !j->cancel ? SLOG_WARN : SLOG_INFO, j->rid,
       "speech: %d frames, %.2f s audio, first chunk %.3f s, total %.3f s%s%s%s", st.n_frames,
       (double)st.n_samples / anna_speech_sample_rate(s->sp), st.first_chunk_s, st.total_s,
       j->cancel ? " (cancelled: client gone)" : "", rc ? ": " : "", rc ? err : "");
  free(g.b);
  free(g.ev);
}

static void *worker(void *arg) {
  speech_server *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop)
      pthread_cond_wait(&s->cv, &s->mu);
    if (!s->head) break;
    sjob *j = s->head;
    s->head = j->next;
    if (!s->head) s->tail = NULL;
    s->n_waiting--;
    s->running = 1;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&j->mu);
    const int skip = j->cancel || s->stop;
    if (skip) {
      j->rc = ANNA_ESTATE, j->done = 1;
      snprintf(j->err, sizeof j->err, "cancelled before it started");
      pthread_cond_broadcast(&j->cv);
    }
    pthread_mutex_unlock(&j->mu);
    if (!skip) job_run(s, j);
    job_release(j);
    pthread_mutex_lock(&s->mu);
    s->running = 0;
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

int speech_server_create(speech_server **out, const char *dir, const char *model_name, const char *device,
                         int n_threads, int debug_hooks, char *err, size_t errlen) {
  *out = NULL;
  speech_server *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->vmu, NULL);
  pthread_cond_init(&s->cv, NULL);
  snprintf(s->model_name, sizeof s->model_name, "%s", model_name);
  s->debug_hooks = debug_hooks;
  const anna_speech_options o = {.device = device, .n_threads = n_threads};
  int rc = anna_speech_load(&s->sp, dir, &o, err, errlen);
  if (!rc && pthread_create(&s->th, NULL, worker, s)) rc = anna_err(err, errlen, ANNA_ENOMEM, "cannot start the speech worker");
  if (rc) {
    speech_server_free(s);
    return rc;
  }
  s->th_started = 1;
  *out = s;
  return 0;
}

void speech_server_free(speech_server *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  for (sjob *j = s->head; j; j = j->next) job_cancel(j);
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  if (s->th_started) pthread_join(s->th, NULL);
  anna_speech_free(s->sp);
  for (int i = 0; i < s->n_voices; i++) free(s->voices[i].xvec), free(s->voices[i].transcript);
  pthread_mutex_destroy(&s->vmu);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}

const char *speech_server_describe(const speech_server *s) {
  return anna_speech_describe(s->sp);
}

int speech_server_busy(speech_server *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->n_waiting + s->running;
  pthread_mutex_unlock(&s->mu);
  return n;
}

/* ---- HTTP ---- */

static int conn_fd(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  return ci ? ci->connect_fd : -1;
}

static int peer_gone(int fd) {
  if (fd < 0) return 0;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return 0;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static enum MHD_Result send_text(struct MHD_Connection *c, const char *rid, int status, char *body,
                                 const char *ctype, int *st) {
  return http_send_text(c, rid, status, body, ctype, NULL, st);
}

static enum MHD_Result fail(struct MHD_Connection *c, const char *rid, int *st, int status, const char *param,
                            const char *code, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static enum MHD_Result fail(struct MHD_Connection *c, const char *rid, int *st, int status, const char *param,
                            const char *code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  oai_error e;
  oai_fail(&e, status, param, code, "%s", msg);
  if (status < 500) slog(SLOG_INFO, rid, "rejected %d: %s", status, msg);
  return send_text(c, rid, status, oai_error_json(&e), "application/json", st);
}

typedef struct reader {
  speech_server *s;
  sjob *j;
  int fd;
} reader;

static ssize_t job_read(void *cls, uint64_t pos, char *buf, size_t max) {
  reader *rd = cls;
  sjob *j = rd->j;
  (void)pos;
  pthread_mutex_lock(&j->mu);
  for (;;) {
    if (j->off < j->len) {
      size_t n = j->len - j->off < max ? j->len - j->off : max;
      memcpy(buf, j->buf + j->off, n);
      j->off += n;
      pthread_cond_broadcast(&j->cv); /* room for a worker held back by SPEECH_MAX_BUFFERED */
      pthread_mutex_unlock(&j->mu);
      return (ssize_t)n;
    }
    if (j->done) {
      const int rc = j->rc;
      pthread_mutex_unlock(&j->mu);
      /* failed after audio began: the status is sent, so the stream is cut short */
      return rc ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    if (peer_gone(rd->fd)) {
      j->cancel = 1;
      pthread_cond_broadcast(&j->cv);
      pthread_mutex_unlock(&j->mu);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
  }
}

static void job_read_free(void *cls) {
  reader *rd = cls;
  job_cancel(rd->j); /* a no-op when it finished; stops it when the client went away */
  job_release(rd->j);
  free(rd);
}

static const char *type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a number";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  default: return "null";
  }
}

/* Parses and checks the body into j; returns 0 or the HTTP status with msg/param/code set. */
static int parse_request(speech_server *s, const char *body, size_t len, sjob *j, char *msg, size_t cap,
                         char param[64], const char **code) {
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  int st = 0;
  param[0] = '\0', *code = "invalid_request";
#define BAD(p, ...) \
  do { \
    snprintf(param, 64, "%s", (p) ? (const char *)(p) : ""); /* a copy: keys die with root */ \
    snprintf(msg, cap, __VA_ARGS__); \
    st = 400; \
    goto out; \
  } while (0)
  if (!root) {
    *code = "invalid_json";
    BAD(NULL, "the body is not valid JSON: %s (line %d)", je.text, je.line);
  }
  if (!json_is_object(root)) BAD(NULL, "the body must be a JSON object");
  static const char *const known[] = {"model", "input",         "voice",    "instructions", "response_format",
                                      "speed", "stream_format", "language", "seed",         NULL};
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    int ok = s->debug_hooks && (!strcmp(key, "debug_delay_ms") || !strcmp(key, "debug_max_frames"));
    for (int i = 0; known[i] && !ok; i++) ok = !strcmp(key, known[i]);
    if (!ok) {
      *code = "unknown_parameter";
      BAD(key, "unknown field '%.64s' (this server reads: model, input, voice, instructions, response_format, speed, "
               "stream_format, language, seed)", key);
    }
  }
  v = json_object_get(root, "model");
  if (!json_is_string(v)) BAD("model", "'model' is required and must be a string%s", v ? "" : " (missing)");
  if (*json_string_value(v) && strcmp(json_string_value(v), s->model_name)) {
    *code = "model_not_found";
    snprintf(param, 64, "model");
    snprintf(msg, cap, "The model '%.200s' does not exist; this server serves '%s'", json_string_value(v),
             s->model_name);
    st = 404;
    goto out;
  }
  v = json_object_get(root, "input");
  if (!json_is_string(v)) BAD("input", "'input' is required and must be a string, got %s", v ? type_name(v) : "nothing");
  const char *in = json_string_value(v);
  size_t nchar = 0;
  for (const unsigned char *p = (const unsigned char *)in; *p; p++) nchar += (*p & 0xC0) != 0x80;
  if (!nchar) BAD("input", "'input' is empty");
  if (nchar > SPEECH_MAX_INPUT)
    BAD("input", "'input' has %zu characters; the limit is %d", nchar, SPEECH_MAX_INPUT);
  j->input = strdup(in);
  v = json_object_get(root, "voice");
  const char *voice = NULL;
  if (json_is_object(v)) {
    json_t *id = json_object_get(v, "id");
    if (!json_is_string(id)) BAD("voice", "'voice' as an object needs a string 'id'");
    voice = json_string_value(id);
  } else if (json_is_string(v)) {
    voice = json_string_value(v);
  } else if (anna_speech_voice(s->sp, 0) || (v && !json_is_null(v))) {
    BAD("voice", "'voice' is required: a preset voice name, got %s", v ? type_name(v) : "nothing");
  }
  /* a VoiceDesign model has no preset voices: the voice comes from the instructions, and the
   * `voice` OpenAI's clients must send is not used */
  const int design = !anna_speech_voice(s->sp, 0) && !anna_speech_clone_dim(s->sp);
  if (!voice) voice = "";
  int found = design;
  char have[512] = "";
  pthread_mutex_lock(&s->vmu);
  for (int i = 0; i < s->n_voices && !found; i++)
    if (!strcmp(s->voices[i].name, voice)) {
      const int D = anna_speech_clone_dim(s->sp);
      if ((j->xvec = malloc(sizeof *j->xvec * (size_t)D))) memcpy(j->xvec, s->voices[i].xvec, sizeof *j->xvec * (size_t)D);
      found = 1;
    }
  for (int i = 0; i < s->n_voices; i++) {
    size_t hl = strlen(have);
    snprintf(have + hl, sizeof have - hl, "%s%s", hl ? ", " : "", s->voices[i].name);
  }
  pthread_mutex_unlock(&s->vmu);
  if (found && !design && anna_speech_clone_dim(s->sp) && !j->xvec) BAD(NULL, "out of memory");
  for (int i = 0; anna_speech_voice(s->sp, i); i++) {
    const char *name = anna_speech_voice(s->sp, i);
    found |= !strcasecmp(name, voice);
    size_t hl = strlen(have);
    snprintf(have + hl, sizeof have - hl, "%s%s", hl ? ", " : "", name);
  }
  if (!found) {
    *code = "unknown_voice";
    BAD("voice", "unknown voice '%.64s': this model's voices are %s (OpenAI's voice names are not Qwen3-TTS speakers)",
        voice, have);
  }
  j->voice = strdup(design || j->xvec ? "" : voice);
  v = json_object_get(root, "instructions");
  if (v && !json_is_null(v)) {
    if (!json_is_string(v)) BAD("instructions", "'instructions' must be a string, got %s", type_name(v));
    if (*json_string_value(v)) {
      if (!anna_speech_takes_instructions(s->sp)) {
        *code = "unsupported_parameter";
        BAD("instructions", "'instructions' is not supported by this model: a 0.6B CustomVoice checkpoint takes none "
                            "(use a 1.7B CustomVoice or a VoiceDesign checkpoint)");
      }
      if (!(j->instructions = strdup(json_string_value(v)))) BAD(NULL, "out of memory");
    }
  }
  if (design && !j->instructions)
    BAD("instructions", "'instructions' is required: this VoiceDesign model has no preset voices, the instructions "
                        "describe the voice");
  v = json_object_get(root, "response_format");
  const char *fmt = "mp3"; /* OpenAI's default */
  if (v && !json_is_null(v)) {
    if (!json_is_string(v)) BAD("response_format", "'response_format' must be a string, got %s", type_name(v));
    fmt = json_string_value(v);
  }
  if (strcmp(fmt, "mp3") && strcmp(fmt, "opus") && strcmp(fmt, "aac") && strcmp(fmt, "flac") && strcmp(fmt, "wav") &&
      strcmp(fmt, "pcm"))
    BAD("response_format", "'response_format' must be one of mp3, opus, aac, flac, wav, pcm; got '%.32s'", fmt);
  char ferr[256];
  if (anna_audio_format_check(fmt, ferr, sizeof ferr)) {
    *code = "unsupported_format";
    BAD("response_format", "response_format '%s' is not available on this server: %s", fmt,
        !strcmp(fmt, "aac") ? "no AAC encoder is built in (use mp3, opus, flac, wav or pcm)" : ferr);
  }
  j->format = strdup(fmt);
  v = json_object_get(root, "speed");
  if (v && !json_is_null(v)) {
    if (!json_is_number(v)) BAD("speed", "'speed' must be a number, got %s", type_name(v));
    const double sp = json_number_value(v);
    if (!(sp >= 0.25 && sp <= 4.0)) BAD("speed", "'speed' must be in [0.25, 4.0], got %g", sp);
    char serr[256];
    if (anna_speech_speed_check(sp, serr, sizeof serr)) {
      *code = "unsupported_parameter";
      BAD("speed", "'speed' %g is not available on this server: %s", sp, serr);
    }
    j->speed = sp; /* time-stretched by the speech API (libavfilter's atempo) */
  }
  v = json_object_get(root, "stream_format");
  if (v && !json_is_null(v)) {
    if (!json_is_string(v) || (strcmp(json_string_value(v), "audio") && strcmp(json_string_value(v), "sse")))
      BAD("stream_format", "'stream_format' must be \"audio\" or \"sse\"");
    j->sse = !strcmp(json_string_value(v), "sse");
  }
  v = json_object_get(root, "language");
  if (v && !json_is_null(v) && !json_is_string(v)) BAD("language", "'language' must be a string, got %s", type_name(v));
  j->language = strdup(json_is_string(v) ? json_string_value(v) : "auto");
  for (char *p = j->language; p && *p; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
  v = json_object_get(root, "seed");
  if (v && !json_is_null(v)) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) BAD("seed", "'seed' must be a non-negative integer");
    j->seed = (uint64_t)json_integer_value(v);
  }
  v = json_object_get(root, "debug_delay_ms");
  if (v) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 10000)
      BAD("debug_delay_ms", "'debug_delay_ms' must be an integer in [0, 10000]");
    j->delay_ms = (int)json_integer_value(v);
  }
  v = json_object_get(root, "debug_max_frames");
  if (v) {
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65536)
      BAD("debug_max_frames", "'debug_max_frames' must be an integer in [1, 65536]");
    j->max_frames = (int)json_integer_value(v);
  }
  if (!j->input || !j->voice || !j->format || !j->language) {
    snprintf(msg, cap, "out of memory");
    st = 500;
  }
#undef BAD
out:
  json_decref(root);
  return st;
}

static enum MHD_Result route_speech(speech_server *s, struct MHD_Connection *c, const char *rid, const char *body,
                                    size_t len, int *status) {
  sjob *j = calloc(1, sizeof *j);
  if (!j) return fail(c, rid, status, 500, NULL, NULL, "out of memory");
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, NULL);
  j->refs = 1;
  snprintf(j->rid, sizeof j->rid, "%s", rid);
  char msg[512];
  char param[64];
  const char *code;
  int st = parse_request(s, body ? body : "", len, j, msg, sizeof msg, param, &code);
  if (st) {
    job_release(j);
    return fail(c, rid, status, st, param[0] ? param : NULL, st >= 500 ? NULL : code, "%s", msg);
  }
  pthread_mutex_lock(&s->mu);
  if (s->stop || s->n_waiting >= SPEECH_MAX_QUEUE) {
    const int stopping = s->stop;
    pthread_mutex_unlock(&s->mu);
    job_release(j);
    return stopping ? fail(c, rid, status, 503, NULL, "shutting_down", "the server is shutting down")
                    : fail(c, rid, status, 429, NULL, "queue_full",
                           "%d speech requests are already waiting (requests run one at a time)", SPEECH_MAX_QUEUE);
  }
  j->refs = 2; /* the worker's */
  if (s->tail)
    s->tail->next = j;
  else
    s->head = j;
  s->tail = j;
  s->n_waiting++;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  /* wait for the first audio, or the failure, while watching the client */
  const int fd = conn_fd(c);
  pthread_mutex_lock(&j->mu);
  while (!j->started && !j->done) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    if (!j->started && !j->done && peer_gone(fd)) {
      j->cancel = 1;
      pthread_cond_broadcast(&j->cv);
      pthread_mutex_unlock(&j->mu);
      job_release(j);
      *status = 499;
      return MHD_NO;
    }
  }
  if (!j->started) { /* failed before any audio: still free to answer with an error */
    const int rc = j->rc;
    snprintf(msg, sizeof msg, "%s", j->err);
    pthread_mutex_unlock(&j->mu);
    job_release(j);
    const int http = rc == ANNA_EINVAL || rc == ANNA_EUNSUPPORTED || rc == ANNA_ERANGE ? 400
                     : rc == ANNA_ENOMEM                                              ? 503
                                                                                      : 500;
    return fail(c, rid, status, http, NULL, http == 400 ? "invalid_request" : "synthesis_failed", "%s", msg);
  }
  pthread_mutex_unlock(&j->mu);
  reader *rd = calloc(1, sizeof *rd);
  if (!rd) {
    job_cancel(j);
    job_release(j);
    return fail(c, rid, status, 500, NULL, NULL, "out of memory");
  }
  rd->s = s, rd->j = j, rd->fd = fd;
  struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, job_read, rd, job_read_free);
  if (!r) {
    job_read_free(rd);
    return fail(c, rid, status, 500, NULL, NULL, "out of memory");
  }
  MHD_add_response_header(r, "Content-Type", j->sse ? "text/event-stream" : anna_audio_format_mime(j->format));
  if (j->sse) MHD_add_response_header(r, "Cache-Control", "no-cache");
  MHD_add_response_header(r, "X-Request-Id", rid);
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  *status = 200;
  return ret;
}

/* ---- registered voices (voice cloning with a Base model) ---- */

typedef struct vform {
  char *name, *transcript, *audio;
  size_t name_len, name_cap, tr_len, tr_cap, audio_len, audio_cap;
  int n_audio, oom;
  char unknown[64];
} vform;

static int vappend(char **dst, size_t *len, size_t *cap, const char *data, size_t n) {
  if (*len + n + 1 > *cap) {
    size_t nc = (*len + n + 1) * 2;
    char *nb = realloc(*dst, nc);
    if (!nb) return -1;
    *dst = nb, *cap = nc;
  }
  memcpy(*dst + *len, data, n);
  *len += n;
  (*dst)[*len] = 0;
  return 0;
}

static enum MHD_Result vform_iter(void *cls, enum MHD_ValueKind kind, const char *key, const char *filename,
                                  const char *content_type, const char *transfer_encoding, const char *data,
                                  uint64_t off, size_t size) {
  (void)kind, (void)filename, (void)content_type, (void)transfer_encoding;
  vform *f = cls;
  if (!key) return MHD_YES;
  int rc = 0;
  if (!strcmp(key, "file") || !strcmp(key, "audio") || !strcmp(key, "audio_sample")) {
    if (off == 0) f->n_audio++;
    rc = vappend(&f->audio, &f->audio_len, &f->audio_cap, data, size);
  } else if (!strcmp(key, "name")) {
    rc = f->name_len + size > 4096 ? 0 : vappend(&f->name, &f->name_len, &f->name_cap, data, size);
  } else if (!strcmp(key, "transcript") || !strcmp(key, "ref_text")) {
    rc = f->tr_len + size > 65536 ? 0 : vappend(&f->transcript, &f->tr_len, &f->tr_cap, data, size);
  } else if (!f->unknown[0]) {
    snprintf(f->unknown, sizeof f->unknown, "%.48s", key);
  }
  if (rc) f->oom = 1;
  return MHD_YES;
}

static enum MHD_Result voices_list(speech_server *s, struct MHD_Connection *c, const char *rid, int *status) {
  json_t *data = json_array();
  for (int i = 0; anna_speech_voice(s->sp, i); i++)
    json_array_append_new(data, json_pack("{s:s,s:s,s:s}", "id", anna_speech_voice(s->sp, i), "object", "voice",
                                          "type", "preset"));
  pthread_mutex_lock(&s->vmu);
  for (int i = 0; i < s->n_voices; i++) {
    json_t *v = json_pack("{s:s,s:s,s:s}", "id", s->voices[i].name, "object", "voice", "type", "cloned");
    if (v && s->voices[i].transcript) json_object_set_new(v, "transcript", json_string(s->voices[i].transcript));
    json_array_append_new(data, v);
  }
  pthread_mutex_unlock(&s->vmu);
  json_t *o = json_pack("{s:s,s:o}", "object", "list", "data", data);
  char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  return send_text(c, rid, 200, t, "application/json", status);
}

/* POST /v1/audio/voices: multipart name + audio file (file / audio / audio_sample) + optional
 * transcript: the clip's x-vector is registered under name for /v1/audio/speech's voice. */
static enum MHD_Result voices_create(speech_server *s, struct MHD_Connection *c, const char *rid, const char *body,
                                     size_t len, int *status) {
  const int D = anna_speech_clone_dim(s->sp);
  if (!D)
    return fail(c, rid, status, 400, NULL, "unsupported_model",
                "voice cloning needs a Qwen3-TTS Base model (this one, '%s', has no speaker encoder)", s->model_name);
  vform f;
  memset(&f, 0, sizeof f);
  struct MHD_PostProcessor *pp = MHD_create_post_processor(c, 64 * 1024, vform_iter, &f);
  if (!pp)
    return fail(c, rid, status, 400, NULL, "invalid_request",
                "the body must be multipart/form-data (name, an audio file, optional transcript)");
  enum MHD_Result pr = len ? MHD_post_process(pp, body, len) : MHD_YES;
  enum MHD_Result dr = MHD_destroy_post_processor(pp);
  int st = 0;
  char msg[640] = "", param[64] = "";
  const char *code = "invalid_request";
  float *xv = NULL;
  char *name = f.name;
  size_t nl = name ? strlen(name) : 0;
#define VBAD(p, ...) \
  do { \
    snprintf(param, sizeof param, "%s", p); \
    snprintf(msg, sizeof msg, __VA_ARGS__); \
    st = 400; \
    goto out; \
  } while (0)
  if (f.oom) {
    snprintf(msg, sizeof msg, "out of memory");
    st = 500;
    goto out;
  }
  if (pr != MHD_YES || dr != MHD_YES) VBAD("", "malformed multipart/form-data body");
  if (f.unknown[0]) VBAD(f.unknown, "unknown form field '%s' (this route takes name, file, transcript)", f.unknown);
  if (!nl || nl >= SPEECH_VOICE_NAME) VBAD("name", "'name' is required: 1 to %d characters", SPEECH_VOICE_NAME - 1);
  for (size_t i = 0; i < nl; i++) {
    const char ch = name[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' ||
          ch == '.'))
      VBAD("name", "'name' may hold letters, digits, '-', '_' and '.' only");
  }
  if (f.n_audio != 1 || !f.audio_len)
    VBAD("file", "one audio file part ('file') is required, with the reference clip");
  if ((xv = malloc(sizeof *xv * (size_t)D)) == NULL) {
    snprintf(msg, sizeof msg, "out of memory");
    st = 500;
    goto out;
  }
  char err[400];
  int rc = anna_speech_clone_embed(s->sp, f.audio, f.audio_len, xv, err, sizeof err);
  if (rc) {
    code = rc == ANNA_ENOMEM ? "resources_exhausted" : "invalid_audio";
    snprintf(param, sizeof param, "file");
    snprintf(msg, sizeof msg, "the reference clip: %s", err);
    st = rc == ANNA_ENOMEM ? 503 : 400;
    goto out;
  }
  for (int i = 0; anna_speech_voice(s->sp, i); i++)
    if (!strcasecmp(anna_speech_voice(s->sp, i), name)) VBAD("name", "'%s' is a preset voice of this model", name);
  pthread_mutex_lock(&s->vmu);
  int at = -1;
  for (int i = 0; i < s->n_voices && at < 0; i++)
    if (!strcmp(s->voices[i].name, name)) at = i;
  if (at < 0 && s->n_voices == SPEECH_MAX_VOICES) {
    pthread_mutex_unlock(&s->vmu);
    VBAD("name", "this server holds %d registered voices already", SPEECH_MAX_VOICES);
  }
  if (at < 0) at = s->n_voices++;
  else free(s->voices[at].xvec), free(s->voices[at].transcript); /* the same name again: replaced */
  snprintf(s->voices[at].name, sizeof s->voices[at].name, "%s", name);
  s->voices[at].xvec = xv, xv = NULL;
  s->voices[at].transcript = f.transcript && *f.transcript ? strdup(f.transcript) : NULL;
  pthread_mutex_unlock(&s->vmu);
#undef VBAD
out:;
  char *resp = NULL;
  if (!st) {
    json_t *o = json_pack("{s:s,s:s,s:s}", "id", name, "object", "voice", "type", "cloned");
    resp = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
  }
  free(f.name), free(f.transcript), free(f.audio), free(xv);
  if (st) return fail(c, rid, status, st, param[0] ? param : NULL, st >= 500 ? NULL : code, "%s", msg);
  return send_text(c, rid, 200, resp, "application/json", status);
}

enum MHD_Result speech_route(speech_server *s, struct MHD_Connection *c, const char *method, const char *url,
                             const char *rid, const char *body, size_t len, int too_big, size_t max_body,
                             int *status) {
  const int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
  if (!strcmp(url, "/v1/audio/speech")) {
    if (!post) return fail(c, rid, status, 405, NULL, "method_not_allowed", "this route takes POST");
    if (too_big)
      return fail(c, rid, status, 413, NULL, "request_too_large",
                  "the request body is larger than %zu bytes (--max-body-bytes)", max_body);
    return route_speech(s, c, rid, body, len, status);
  }
  if (!strcmp(url, "/v1/audio/voices")) {
    if (get) return voices_list(s, c, rid, status);
    if (!post) return fail(c, rid, status, 405, NULL, "method_not_allowed", "this route takes GET or POST");
    if (too_big)
      return fail(c, rid, status, 413, NULL, "request_too_large",
                  "the request body is larger than %zu bytes (--max-body-bytes)", max_body);
    return voices_create(s, c, rid, body, len, status);
  }
  if (!strcmp(url, "/healthz") || !strcmp(url, "/health")) {
    if (!get) return fail(c, rid, status, 405, NULL, "method_not_allowed", "this route takes GET");
    json_t *o = json_pack("{s:s,s:s,s:s,s:i}", "status", "ok", "model", s->model_name, "mode", "speech", "busy",
                          speech_server_busy(s));
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return send_text(c, rid, 200, t, "application/json", status);
  }
  if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11)) {
    if (!get) return fail(c, rid, status, 405, NULL, "method_not_allowed", "this route takes GET");
    if (url[10] == '/' && strcmp(url + 11, s->model_name))
      return fail(c, rid, status, 404, "model", "model_not_found", "no such model");
    json_t *m = json_pack("{s:s,s:s,s:I,s:s}", "id", s->model_name, "object", "model", "created", (json_int_t)0,
                          "owned_by", "anna");
    json_t *o = url[10] == '/' ? m : json_pack("{s:s,s:[o]}", "object", "list", "data", m);
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return send_text(c, rid, 200, t, "application/json", status);
  }
  return fail(c, rid, status, 404, NULL, "not_found",
              "no route for %s %.200s: the loaded model '%s' is a speech model (POST /v1/audio/speech)", method, url,
              s->model_name);
}
