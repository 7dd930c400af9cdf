/* audio_api.h: POST /v1/audio/transcriptions (and the refusal of /v1/audio/translations) of
 * anna-serve, for a speech-recognition model (Qwen3-ASR; anna.h "Audio in prompts").
 *
 * The request is multipart/form-data (parsed with libmicrohttpd's post processor over the
 * buffered body): `file` (required), `model`, `language` (a name or ISO code the model
 * supports: forces "language X<asr_text>"), `prompt` (the system-turn context), `response_format`
 * json | text | srt | vtt | verbose_json, `temperature` [0, 1], `stream` true|false,
 * `timestamp_granularities[]` segment (word: 400), `chunking_strategy` auto (a no-op: clips are
 * transcribed whole). Any other field is a 400 naming it. The clip becomes an audio anna_media
 * on the connection thread (decode, resample, log-mel); the engine runs the encoder at the
 * sequence's prefill and decodes it in the same continuous batches as every other request.
 * Output: the text after <asr_text> (all of it when the model wrote none). stream=true: SSE
 * `transcript.text.delta` events, then one `transcript.text.done` with the whole text and token
 * usage, then `data: [DONE]` (text before <asr_text> is held back until the marker is seen).
 * verbose_json: one segment spanning the clip (the model emits no timestamps), its token ids and
 * mean log-probability; compression_ratio and no_speech_prob are not computed (absent).
 * Errors: 400 (bad form, bad audio, unknown field, a text-only model), 404 (another model's
 * name), 413 (over --max-body-bytes), 429/503 as generation requests; the process stays up.
 */
#ifndef ANNA_SERVER_AUDIO_API_H
#define ANNA_SERVER_AUDIO_API_H

#include "anna/anna.h"
#include "engine.h"

#include <microhttpd.h>
#include <stddef.h>

typedef struct audio_api_env {
  const anna_model *m;    /* borrowed: the served model */
  const anna_text *text;  /* borrowed */
  engine *eng;            /* borrowed */
  const char *model_name; /* what `model` must be (or empty) */
  anna_sampler_params defaults;
  double max_audio_seconds; /* --max-audio-seconds (> 0) */
  double audio_chunk_seconds; /* --audio-chunk-seconds: longer clips are cut (<= 0: 1200) */
  size_t max_body_bytes;    /* --max-body-bytes, for the 413 message */
  int max_tokens;           /* --max-completion-tokens: the transcript's token cap (<= 0: 512) */
  int n_ctx;
} audio_api_env;

/* Answers one request whose whole body is body[len] (too_big: it exceeded max_body_bytes and
 * was dropped). translate: the /v1/audio/translations route (always a 400). Queues the
 * response on c and returns MHD's result; *status gets the HTTP status, *gr (NULL when none) a
 * reference to the request the engine runs, which the caller cancels if the connection ends
 * early and releases when it completes. fd: the connection's socket (a vanished client cancels
 * the request), -1 when unknown. */
enum MHD_Result audio_api_handle(const audio_api_env *env, struct MHD_Connection *c,
                                 const char *rid, int translate, const char *body, size_t len,
                                 int too_big, int fd, int *status, gen_request **gr);

#endif
