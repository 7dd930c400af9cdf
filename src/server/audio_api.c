/* audio_api.c: POST /v1/audio/transcriptions (audio_api.h). Connection-thread side only: form
 * parsing, the audio media and prompt, the gen_request the engine runs, and the response. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* POLLRDHUP, asprintf */
#endif
#include "audio_api.h"

#include "oai.h"
#include "respond.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { AF_JSON, AF_TEXT, AF_SRT, AF_VTT, AF_VERBOSE };

#define FIELD_MAX 65536 /* text fields (prompt included) */

typedef struct form {
  unsigned char *file; /* the upload */
  size_t file_len, file_cap;
  int has_file, n_files;
  char *model, *language, *prompt, *format, *temperature, *stream, *chunking;
  int want_words;          /* timestamp_granularities[] = word */
  char bad_gran[64];       /* an unknown granularity */
  char unknown[64];        /* the first field we do not take */
  int unsupported_include; /* include[] given */
  int too_long;            /* a text field over FIELD_MAX */
  int oom;
} form;

typedef struct audio_job {
  gen_request *r;
  int fmt, stream, forced;
  double seconds;
  int n_prompt;  /* prompt tokens over all pieces */
  int n_audio;   /* audio pad tokens over all pieces */
  int n_pieces;  /* a long clip's pieces (anna_media_audio_decode_chunks), a choice each */
  double *offs;  /* owned: where each piece starts (s) */
  char lang[64]; /* forced name, else filled from the output */
} audio_job;

/* ---- form ---- */

static int append(char **dst, size_t *len, size_t *cap, const char *data, size_t n, size_t max) {
  if (*len + n > max) return -1;
  if (*len + n + 1 > *cap) {
    size_t nc = (*len + n + 1) * 2;
    char *nb = realloc(*dst, nc);
    if (!nb) return -2;
    *dst = nb;
    *cap = nc;
  }
  memcpy(*dst + *len, data, n);
  *len += n;
  (*dst)[*len] = 0;
  return 0;
}

/* Appends to a text field (a new value of a repeated name replaces the old one). */
static void text_field(form *f, char **slot, const char *data, uint64_t off, size_t size) {
  if (off == 0) {
    free(*slot);
    *slot = strdup("");
    if (!*slot) {
      f->oom = 1;
      return;
    }
  }
  size_t len = strlen(*slot), cap = len + 1;
  int rc = append(slot, &len, &cap, data, size, FIELD_MAX);
  if (rc == -1) f->too_long = 1;
  if (rc == -2) f->oom = 1;
}

static enum MHD_Result form_iter(void *cls, enum MHD_ValueKind kind, const char *key,
                                 const char *filename, const char *content_type,
                                 const char *transfer_encoding, const char *data, uint64_t off,
                                 size_t size) {
  (void)kind, (void)filename, (void)content_type, (void)transfer_encoding;
  form *f = cls;
  if (!key) return MHD_YES;
  if (!strcmp(key, "file")) {
    if (off == 0) f->n_files++;
    f->has_file = 1;
    char *p = (char *)f->file;
    if (append(&p, &f->file_len, &f->file_cap, data, size, (size_t)-2) == -2) f->oom = 1;
    f->file = (unsigned char *)p;
    return MHD_YES;
  }
  char **slot = !strcmp(key, "model")               ? &f->model
                : !strcmp(key, "language")          ? &f->language
                : !strcmp(key, "prompt")            ? &f->prompt
                : !strcmp(key, "response_format")   ? &f->format
                : !strcmp(key, "temperature")       ? &f->temperature
                : !strcmp(key, "stream")            ? &f->stream
                : !strcmp(key, "chunking_strategy") ? &f->chunking
                                                    : NULL;
  if (slot) {
    text_field(f, slot, data, off, size);
    return MHD_YES;
  }
  if (!strcmp(key, "timestamp_granularities[]") || !strcmp(key, "timestamp_granularities")) {
    if (off == 0 && size == 4 && !memcmp(data, "word", 4))
      f->want_words = 1;
    else if (off == 0 && !(size == 7 && !memcmp(data, "segment", 7)) && !f->bad_gran[0])
      snprintf(f->bad_gran, sizeof f->bad_gran, "%.*s", (int)(size < 40 ? size : 40), data);
    return MHD_YES;
  }
  if (!strcmp(key, "include[]") || !strcmp(key, "include")) {
    f->unsupported_include = 1;
    return MHD_YES;
  }
  if (!f->unknown[0]) snprintf(f->unknown, sizeof f->unknown, "%.48s", key);
  return MHD_YES;
}

static void form_clear(form *f) {
  free(f->file);
  free(f->model), free(f->language), free(f->prompt), free(f->format);
  free(f->temperature), free(f->stream), free(f->chunking);
  memset(f, 0, sizeof *f);
}

/* ---- responses ---- */

static enum MHD_Result send_text(struct MHD_Connection *c, const char *rid, int status, char *body,
                                 const char *ctype, int *st) {
  return http_send_text(c, rid, status, body, ctype, NULL, st);
}

static enum MHD_Result send_err(struct MHD_Connection *c, const char *rid, const oai_error *e,
                                int *st) {
  return send_text(c, rid, e->status, oai_error_json(e), "application/json", st);
}

static void lower_copy(char *dst, size_t cap, const char *s) {
  size_t i = 0;
  for (; s[i] && i + 1 < cap; i++)
    dst[i] = (char)tolower((unsigned char)s[i]);
  dst[i] = 0;
}

static void stamp(char *out, size_t cap, double s, char sep) {
  long long ms = llround(s * 1000.0);
  snprintf(out, cap, "%02lld:%02lld:%02lld%c%03lld", ms / 3600000, ms / 60000 % 60, ms / 1000 % 60,
           sep, ms % 1000);
}

/* The transcript of the choice (r->mu held or the request finished): offset into text. */
static size_t transcript_at(const audio_job *j, const gen_choice *ch, char *lang, size_t cap) {
  if (j->forced) return 0;
  return anna_asr_output_split(ch->text ? ch->text : "", ch->text_len, lang, cap);
}

/* Piece i's transcript as qwen-asr parses it (caller frees), or the joined transcript of all
 * pieces (i < 0), with the merged languages in *lang (caller frees) when lang is not NULL. */
static char *pieces_text(const audio_job *j, int i, char **lang) {
  const gen_request *r = j->r;
  const int a = i < 0 ? 0 : i, n = i < 0 ? j->n_pieces : 1;
  const char **raws = malloc(sizeof *raws * (size_t)n);
  if (!raws) return NULL;
  for (int k = 0; k < n; k++)
    raws[k] = r->choices[a + k].text ? r->choices[a + k].text : "";
  char *t = NULL, *l = NULL, err[64];
  if (anna_asr_transcript_join(raws, n, j->forced, &t, &l, err, sizeof err)) t = l = NULL;
  free(raws);
  if (lang)
    *lang = l;
  else
    free(l);
  return t;
}

/* body_of for a clip of several pieces: the joined text; srt / vtt a cue per piece with text
 * (over its span); verbose_json a segment per piece. */
static char *body_pieces(const audio_job *j, const char **ctype) {
  const gen_request *r = j->r;
  char *lang = NULL, *text = pieces_text(j, -1, &lang);
  if (!text) return NULL;
  *ctype = "application/json";
  if (j->fmt == AF_TEXT) {
    free(lang);
    *ctype = "text/plain; charset=utf-8";
    return text;
  }
  if (j->fmt == AF_SRT || j->fmt == AF_VTT) {
    free(lang), free(text);
    *ctype = j->fmt == AF_VTT ? "text/vtt; charset=utf-8" : "text/plain; charset=utf-8";
    const char sep = j->fmt == AF_SRT ? ',' : '.';
    char *out = strdup(j->fmt == AF_VTT ? "WEBVTT\n\n" : "");
    size_t len = out ? strlen(out) : 0, cap = len + 1;
    for (int i = 0, cue = 0; out && i < j->n_pieces; i++) {
      char *pt = pieces_text(j, i, NULL), a[32], b[32], num[16] = "", *cue_s = NULL;
      if (!pt) {
        free(out);
        return NULL;
      }
      if (pt[0]) {
        stamp(a, sizeof a, j->offs[i], sep);
        stamp(b, sizeof b, i + 1 < j->n_pieces ? j->offs[i + 1] : j->seconds, sep);
        if (j->fmt == AF_SRT) snprintf(num, sizeof num, "%d\n", ++cue);
        if (asprintf(&cue_s, "%s%s --> %s\n%s\n\n", num, a, b, pt) < 0) cue_s = NULL;
        if (!cue_s || append(&out, &len, &cap, cue_s, strlen(cue_s), (size_t)-2)) {
          free(out);
          out = NULL;
        }
        free(cue_s);
      }
      free(pt);
    }
    return out;
  }
  json_t *o = json_object();
  json_object_set_new(o, "text", json_string(text));
  json_t *usage = json_pack("{s:s,s:f}", "type", "duration", "seconds", j->seconds);
  if (j->fmt == AF_VERBOSE) {
    char ll[64];
    lower_copy(ll, sizeof ll, j->forced ? j->lang : lang);
    json_t *segs = json_array();
    for (int i = 0; i < j->n_pieces; i++) {
      const gen_choice *ch = &r->choices[i];
      char *pt = pieces_text(j, i, NULL);
      json_t *toks = json_array();
      double lp = 0;
      for (size_t k = 0; k < ch->n_toks; k++) {
        json_array_append_new(toks, json_integer(ch->toks[k].id));
        lp += ch->toks[k].logprob;
      }
      json_array_append_new(
          segs, json_pack("{s:i,s:i,s:f,s:f,s:s,s:o,s:f,s:f}", "id", i, "seek", 0, "start",
                          j->offs[i], "end", i + 1 < j->n_pieces ? j->offs[i + 1] : j->seconds,
                          "text", pt ? pt : "", "tokens", toks, "temperature",
                          (double)r->sp.temperature, "avg_logprob",
                          ch->n_toks ? lp / (double)ch->n_toks : 0.0));
      free(pt);
    }
    json_object_set_new(o, "task", json_string("transcribe"));
    json_object_set_new(o, "language", json_string(ll));
    json_object_set_new(o, "duration", json_real(j->seconds));
    json_object_set_new(o, "segments", segs);
  }
  json_object_set_new(o, "usage", usage);
  free(lang), free(text);
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return s;
}

static char *body_of(const audio_job *j, const char **ctype) {
  if (j->n_pieces > 1) return body_pieces(j, ctype);
  const gen_request *r = j->r;
  const gen_choice *ch = &r->choices[0];
  char lang[64] = "";
  const size_t off = transcript_at(j, ch, lang, sizeof lang);
  const char *text = ch->text ? ch->text + off : "";
  *ctype = "application/json";
  if (j->fmt == AF_TEXT || j->fmt == AF_SRT || j->fmt == AF_VTT) {
    *ctype = j->fmt == AF_VTT ? "text/vtt; charset=utf-8" : "text/plain; charset=utf-8";
    if (j->fmt == AF_TEXT) return strdup(text);
    char a[32], b[32];
    const char sep = j->fmt == AF_SRT ? ',' : '.';
    stamp(a, sizeof a, 0, sep);
    stamp(b, sizeof b, j->seconds, sep);
    char *out = NULL;
    if (asprintf(&out, "%s%s --> %s\n%s\n\n", j->fmt == AF_SRT ? "1\n" : "WEBVTT\n\n", a, b, text) <
        0)
      return NULL;
    return out;
  }
  json_t *o = json_object();
  json_object_set_new(o, "text", json_string(text));
  json_t *usage = json_pack("{s:s,s:f}", "type", "duration", "seconds", j->seconds);
  if (j->fmt == AF_VERBOSE) {
    char ll[64];
    lower_copy(ll, sizeof ll, j->forced ? j->lang : lang);
    json_t *toks = json_array();
    double lp = 0;
    for (size_t i = 0; i < ch->n_toks; i++) {
      json_array_append_new(toks, json_integer(ch->toks[i].id));
      lp += ch->toks[i].logprob;
    }
    json_t *seg = json_pack("{s:i,s:i,s:f,s:f,s:s,s:o,s:f,s:f}", "id", 0, "seek", 0, "start", 0.0,
                            "end", j->seconds, "text", text, "tokens", toks, "temperature",
                            (double)r->sp.temperature, "avg_logprob",
                            ch->n_toks ? lp / (double)ch->n_toks : 0.0);
    json_object_set_new(o, "task", json_string("transcribe"));
    json_object_set_new(o, "language", json_string(ll));
    json_object_set_new(o, "duration", json_real(j->seconds));
    json_object_set_new(o, "segments", json_pack("[o]", seg));
  }
  json_object_set_new(o, "usage", usage);
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return s;
}

/* ---- streaming ---- */

typedef struct audio_sse {
  engine *eng;
  audio_job job;
  int fd;
  int started, finished;
  size_t start, sent; /* transcript offset; bytes of text sent as deltas */
  size_t seen;        /* text length at the last step (held-back text included) */
  int piece;          /* several pieces: the next piece to send */
  char *buf;
  size_t len, cap, off;
} audio_sse;

static int peer_gone(int fd) {
  if (fd < 0) return 0;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return 0;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static int sse_event(audio_sse *s, json_t *o) {
  char *j = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (!j) return -1;
  const size_t n = strlen(j) + 8;
  char *line = malloc(n + 1);
  if (!line) {
    free(j);
    return -1;
  }
  snprintf(line, n + 1, "data: %s\n\n", j);
  free(j);
  int rc = append(&s->buf, &s->len, &s->cap, line, strlen(line), (size_t)-2);
  free(line);
  return rc ? -1 : 0;
}

/* sse_step for several pieces: each piece's parsed text goes as one delta once it and the
 * pieces before it are done, so the deltas add up to the joined text of the done event. */
static int sse_step_pieces(audio_sse *s) {
  gen_request *r = s->job.r;
  const audio_job *j = &s->job;
  while (s->piece < j->n_pieces && r->choices[s->piece].done && !r->error[0]) {
    char *pt = pieces_text(j, s->piece, NULL);
    if (!pt) return -1;
    int rc = 0;
    if (pt[0])
      rc = sse_event(s, json_pack("{s:s,s:s}", "type", "transcript.text.delta", "delta", pt));
    free(pt);
    if (rc) return -1;
    s->piece++;
  }
  int all = 1, n_gen = 0;
  for (int i = 0; i < j->n_pieces; i++)
    all &= r->choices[i].done, n_gen += r->choices[i].n_gen;
  if (!all) return 0;
  if (r->error[0]) {
    json_t *o = json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "message", r->error,
                          "type", "server_error");
    if (sse_event(s, o)) return -1;
  } else {
    char *text = pieces_text(j, -1, NULL);
    if (!text) return -1;
    json_t *o = json_pack("{s:s,s:s,s:{s:s,s:i,s:i,s:i,s:{s:i,s:i}}}", "type",
                          "transcript.text.done", "text", text, "usage", "type", "tokens",
                          "input_tokens", j->n_prompt, "output_tokens", n_gen, "total_tokens",
                          j->n_prompt + n_gen, "input_token_details", "text_tokens",
                          j->n_prompt - j->n_audio, "audio_tokens", j->n_audio);
    free(text);
    if (sse_event(s, o)) return -1;
  }
  if (append(&s->buf, &s->len, &s->cap, "data: [DONE]\n\n", 14, (size_t)-2)) return -1;
  s->finished = 1;
  return 0;
}

/* Several pieces (r->mu held): 1 when the next piece is done (and nothing failed) or all are. */
static int pieces_news(const audio_sse *s) {
  const gen_request *r = s->job.r;
  if (s->piece < s->job.n_pieces && r->choices[s->piece].done && !r->error[0]) return 1;
  for (int i = 0; i < s->job.n_pieces; i++)
    if (!r->choices[i].done) return 0;
  return 1;
}

/* Renders what is new (r->mu held). */
static int sse_step(audio_sse *s) {
  if (s->job.n_pieces > 1) return sse_step_pieces(s);
  gen_request *r = s->job.r;
  const gen_choice *ch = &r->choices[0];
  const char *text = ch->text ? ch->text : "";
  s->seen = ch->text_len;
  if (!s->started) {
    const size_t at = transcript_at(&s->job, ch, NULL, 0);
    if (s->job.forced || at || ch->done) {
      s->started = 1;
      s->start = s->sent = at;
    }
  }
  if (s->started && ch->text_len > s->sent) {
    json_t *o = json_pack("{s:s,s:s%}", "type", "transcript.text.delta", "delta", text + s->sent,
                          ch->text_len - s->sent);
    if (sse_event(s, o)) return -1;
    s->sent = ch->text_len;
  }
  if (ch->done) {
    if (r->error[0]) {
      json_t *o = json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "message", r->error,
                            "type", "server_error");
      if (sse_event(s, o)) return -1;
    } else {
      json_t *o = json_pack(
          "{s:s,s:s%,s:{s:s,s:i,s:i,s:i,s:{s:i,s:i}}}", "type", "transcript.text.done", "text",
          text + s->start, ch->text_len - s->start, "usage", "type", "tokens", "input_tokens",
          s->job.n_prompt, "output_tokens", ch->n_gen, "total_tokens", s->job.n_prompt + ch->n_gen,
          "input_token_details", "text_tokens", s->job.n_prompt - anna_media_n_tokens(r->media[0]),
          "audio_tokens", anna_media_n_tokens(r->media[0]));
      if (sse_event(s, o)) return -1;
    }
    if (append(&s->buf, &s->len, &s->cap, "data: [DONE]\n\n", 14, (size_t)-2)) return -1;
    s->finished = 1;
  }
  return 0;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  audio_sse *s = cls;
  gen_request *r = s->job.r;
  for (;;) {
    if (s->off < s->len) {
      size_t n = s->len - s->off < max ? s->len - s->off : max;
      memcpy(buf, s->buf + s->off, n);
      s->off += n;
      if (s->off == s->len) s->off = s->len = 0;
      return (ssize_t)n;
    }
    if (s->finished) return MHD_CONTENT_READER_END_OF_STREAM;
    pthread_mutex_lock(&r->mu);
    /* wait for news: text held back before <asr_text> is news too, or this would spin */
    while (s->job.n_pieces > 1 ? !pieces_news(s)
                               : !r->choices[0].done && r->choices[0].text_len == s->seen) {
      gen_request_wait(r, 50);
      if (peer_gone(s->fd)) {
        pthread_mutex_unlock(&r->mu);
        engine_cancel(s->eng, r);
        return MHD_CONTENT_READER_END_WITH_ERROR;
      }
    }
    int rc = sse_step(s);
    pthread_mutex_unlock(&r->mu);
    if (rc) {
      engine_cancel(s->eng, r);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
  }
}

static void sse_free(void *cls) {
  audio_sse *s = cls;
  engine_cancel(s->eng, s->job.r);
  gen_request_release(s->job.r);
  free(s->job.offs);
  free(s->buf);
  free(s);
}

/* ---- the route ---- */

/* Builds the job from the form: 0, or -1 with *e filled. */
static int job_build(const audio_api_env *env, form *f, const char *rid, audio_job *j,
                     oai_error *e) {
  if (f->oom) return oai_fail(e, 500, NULL, NULL, "out of memory");
  if (f->too_long)
    return oai_fail(e, 400, NULL, "invalid_value", "a form field is longer than %d bytes",
                    FIELD_MAX);
  if (f->unknown[0])
    return oai_fail(e, 400, f->unknown, "unknown_parameter",
                    "unknown form field '%s' (this route takes file, model, language, prompt, "
                    "response_format, temperature, stream, timestamp_granularities[], "
                    "chunking_strategy)",
                    f->unknown);
  if (f->unsupported_include)
    return oai_fail(e, 400, "include[]", "unsupported_value",
                    "include[] (logprobs) is not supported by this server");
  if (!f->has_file || !f->file_len)
    return oai_fail(e, 400, "file", "missing_required_parameter",
                    f->has_file ? "the 'file' part is empty"
                                : "the form has no 'file' part (the audio)");
  if (f->n_files > 1)
    return oai_fail(e, 400, "file", "invalid_value", "one 'file' part per request");
  if (f->model && *f->model && strcmp(f->model, env->model_name))
    return oai_fail(e, 404, "model", "model_not_found",
                    "The model '%.200s' does not exist; this server serves '%s'", f->model,
                    env->model_name);
  j->fmt = AF_JSON;
  if (f->format) {
    static const char *const names[] = {"json", "text", "srt", "vtt", "verbose_json"};
    int k = -1;
    for (int i = 0; i < 5 && k < 0; i++)
      if (!strcmp(f->format, names[i])) k = i;
    if (k < 0)
      return oai_fail(e, 400, "response_format", "invalid_value",
                      "response_format '%.64s' is not supported (have: json, text, srt, vtt, "
                      "verbose_json)",
                      f->format);
    j->fmt = k;
  }
  if (f->want_words)
    return oai_fail(e, 400, "timestamp_granularities[]", "unsupported_value",
                    "word timestamps are not supported (the model emits none; have: segment)");
  if (f->bad_gran[0])
    return oai_fail(e, 400, "timestamp_granularities[]", "invalid_value",
                    "timestamp granularity '%s' is not one of word, segment", f->bad_gran);
  if (f->chunking && strcmp(f->chunking, "auto"))
    return oai_fail(e, 400, "chunking_strategy", "unsupported_value",
                    "chunking_strategy must be \"auto\" (long clips are cut at their quietest points "
                    "every --audio-chunk-seconds, as qwen-asr cuts them)");
  if (f->stream) {
    if (!strcmp(f->stream, "true") || !strcmp(f->stream, "True") || !strcmp(f->stream, "1"))
      j->stream = 1;
    else if (strcmp(f->stream, "false") && strcmp(f->stream, "False") && strcmp(f->stream, "0"))
      return oai_fail(e, 400, "stream", "invalid_value",
                      "stream must be true or false, got '%.32s'", f->stream);
  }
  if (j->stream && j->fmt != AF_JSON && j->fmt != AF_TEXT)
    return oai_fail(e, 400, "stream", "unsupported_value",
                    "stream=true takes response_format json or text");
  float temp = 0;
  if (f->temperature) {
    char *end;
    temp = strtof(f->temperature, &end);
    if (end == f->temperature || *end || !(temp >= 0 && temp <= 1))
      return oai_fail(e, 400, "temperature", "invalid_value",
                      "temperature must be a number in [0, 1], got '%.32s'", f->temperature);
  }
  const char *lang = NULL;
  if (f->language && *f->language) {
    if (!(lang = anna_model_audio_language_find(env->m, f->language))) {
      char have[512] = "";
      for (int i = 0; anna_model_audio_language(env->m, i); i++)
        snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", i ? ", " : "",
                 anna_model_audio_language(env->m, i));
      return oai_fail(e, 400, "language", "unsupported_value",
                      "language '%.40s' is not supported by this model (have: %s)", f->language,
                      have[0] ? have : "Qwen3-ASR's 30 languages, by name or ISO-639-1 code");
    }
    j->forced = 1;
    snprintf(j->lang, sizeof j->lang, "%s", lang);
  }
  char err[512];
  anna_media **mds = NULL;
  int32_t np = 0;
  int rc = anna_media_audio_decode_chunks(&mds, &j->offs, &np, env->m, f->file, f->file_len,
                                          env->max_audio_seconds, env->audio_chunk_seconds, err,
                                          sizeof err);
  if (rc)
    return oai_fail(e, rc == ANNA_ENOMEM ? 503 : 400, "file",
                    rc == ANNA_ENOMEM ? "resources_exhausted" : "invalid_audio", "%s", err);
  /* a piece per prompt (one for a clip within --audio-chunk-seconds); the request owns them */
  gen_request *r = j->r = gen_request_new();
  if (r) {
    r->prompts = calloc((size_t)np, sizeof *r->prompts);
    r->n_prompt = calloc((size_t)np, sizeof *r->n_prompt);
    r->media = calloc((size_t)np, sizeof *r->media);
    r->media_at = calloc((size_t)np, sizeof *r->media_at);
    r->media_prompt = np > 1 ? calloc((size_t)np, sizeof *r->media_prompt) : NULL;
  }
  if (!r || !r->prompts || !r->n_prompt || !r->media || !r->media_at ||
      (np > 1 && !r->media_prompt)) {
    for (int32_t i = 0; i < np; i++)
      anna_media_free(mds[i]);
    free(mds);
    return oai_fail(e, 500, NULL, NULL, "out of memory");
  }
  snprintf(r->id, sizeof r->id, "%s", rid);
  for (int32_t i = 0; i < np; i++) {
    r->media[i] = mds[i];
    if (r->media_prompt) r->media_prompt[i] = i;
  }
  free(mds);
  r->n_media = r->n_prompts = j->n_pieces = np;
  size_t longest = 0;
  for (int32_t i = 0; i < np; i++) {
    int32_t *ids = NULL, at = -1;
    size_t n = 0;
    rc = anna_asr_prompt(env->m, env->text, r->media[i], f->prompt, lang, &ids, &n, &at, err,
                         sizeof err);
    if (rc) return oai_fail(e, 400, "prompt", "invalid_value", "%s", err);
    r->prompts[i] = ids;
    r->n_prompt[i] = n;
    r->media_at[i] = at;
    j->n_prompt += (int)n;
    j->n_audio += anna_media_n_tokens(r->media[i]);
    if (n > longest) longest = n;
  }
  j->seconds = np == 1 ? anna_media_audio_seconds(r->media[0])
                       : j->offs[np - 1] + anna_media_audio_seconds(r->media[np - 1]);
  if (longest + 1 >= (size_t)env->n_ctx)
    return oai_fail(e, 400, "file", "context_length_exceeded",
                    "the %.1f-s clip makes a %zu-token prompt%s; this server's context "
                    "(--ctx-size) is %d tokens",
                    np == 1 ? j->seconds : 0.0, longest,
                    np == 1 ? "" : " (its longest piece)", env->n_ctx);
  r->n = 1;
  /* qwen-asr's transformers wrapper stops at 512 new tokens (--max-completion-tokens: another cap,
   * as the request cannot name one); the context bounds it too */
  const int room = env->n_ctx - (int)longest - 1, cap = env->max_tokens > 0 ? env->max_tokens : 512;
  r->max_tokens = room < cap ? room : cap;
  r->sp = env->defaults;
  r->sp.temperature = temp;
  r->logprobs = j->fmt == AF_VERBOSE; /* segment tokens and avg_logprob */
  if (gen_request_prepare(r)) return oai_fail(e, 500, NULL, NULL, "out of memory");
  return 0;
}

enum MHD_Result audio_api_handle(const audio_api_env *env, struct MHD_Connection *c,
                                 const char *rid, int translate, const char *body, size_t len,
                                 int too_big, int fd, int *status, gen_request **gr) {
  *gr = NULL;
  oai_error e;
  if (!anna_model_has_audio(env->m)) {
    oai_fail(&e, 400, "model", "model_not_supported",
             "the served model '%s' is not a speech-recognition model (it has no audio encoder): "
             "/v1/audio/%s needs a Qwen3-ASR model",
             env->model_name, translate ? "translations" : "transcriptions");
    return send_err(c, rid, &e, status);
  }
  if (translate) {
    oai_fail(&e, 400, NULL, "unsupported_endpoint",
             "translations are not supported: Qwen3-ASR transcribes in the spoken language only "
             "(use /v1/audio/transcriptions)");
    return send_err(c, rid, &e, status);
  }
  if (too_big) {
    oai_fail(&e, 413, "file", "request_too_large",
             "the upload is larger than %zu bytes (--max-body-bytes)", env->max_body_bytes);
    return send_err(c, rid, &e, status);
  }
  form f;
  memset(&f, 0, sizeof f);
  struct MHD_PostProcessor *pp = MHD_create_post_processor(c, 64 * 1024, form_iter, &f);
  if (!pp) {
    oai_fail(&e, 400, NULL, "invalid_request",
             "the body must be multipart/form-data (a 'file' part with the audio)");
    return send_err(c, rid, &e, status);
  }
  enum MHD_Result pr = len ? MHD_post_process(pp, body, len) : MHD_YES;
  enum MHD_Result dr = MHD_destroy_post_processor(pp);
  audio_job j;
  memset(&j, 0, sizeof j);
  e.status = 0;
  if (pr != MHD_YES || dr != MHD_YES)
    oai_fail(&e, 400, NULL, "invalid_request", "malformed multipart/form-data body");
  else if (!job_build(env, &f, rid, &j, &e))
    e.status = 0;
  form_clear(&f);
  if (e.status) {
    if (j.r) gen_request_release(j.r);
    free(j.offs);
    return send_err(c, rid, &e, status);
  }
  char err[512];
  int rc = engine_submit(env->eng, j.r, err, sizeof err);
  if (rc) {
    gen_request_release(j.r);
    free(j.offs);
    oai_fail(&e,
             rc == ANNA_ERANGE                        ? 429
             : rc == ANNA_ESTATE || rc == ANNA_ENOMEM ? 503
             : rc == ANNA_EINVAL                      ? 400
                                                      : 500,
             NULL,
             rc == ANNA_ERANGE   ? "queue_full"
             : rc == ANNA_ESTATE ? "shutting_down"
             : rc == ANNA_ENOMEM ? "resources_exhausted"
                                 : NULL,
             "%s", err);
    return send_err(c, rid, &e, status);
  }
  gen_request *r = j.r;
  gen_request_retain(r);
  *gr = r;
  if (j.stream) {
    audio_sse *s = calloc(1, sizeof *s);
    if (!s) {
      engine_cancel(env->eng, r);
      gen_request_release(r);
      free(j.offs);
      return send_text(c, rid, 500, NULL, NULL, status);
    }
    s->eng = env->eng;
    s->job = j; /* the stream owns the job's reference */
    s->fd = fd;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, s, sse_free);
    if (!resp) {
      sse_free(s);
      return send_text(c, rid, 500, NULL, NULL, status);
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Request-Id", rid);
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    *status = 200;
    return ret;
  }
  pthread_mutex_lock(&r->mu);
  while (r->n_done < r->n_choices) {
    gen_request_wait(r, 50);
    if (peer_gone(fd)) {
      pthread_mutex_unlock(&r->mu);
      engine_cancel(env->eng, r);
      gen_request_release(r);
      free(j.offs);
      *status = 499;
      return MHD_NO;
    }
  }
  int failed = r->error[0] != 0, busy = r->error_code == ANNA_ENOMEM;
  pthread_mutex_unlock(&r->mu);
  enum MHD_Result ret;
  if (failed) {
    oai_fail(&e, busy ? 503 : 500, NULL, busy ? "resources_exhausted" : "generation_failed",
             "transcription failed: %s", r->error);
    ret = send_err(c, rid, &e, status);
  } else {
    const char *ctype = "application/json";
    char *b = body_of(&j, &ctype);
    ret = send_text(c, rid, 200, b, ctype, status);
  }
  gen_request_release(r);
  free(j.offs);
  return ret;
}
