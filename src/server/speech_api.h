/* speech_api.h: anna-serve's speech mode. When the --model-dir folder is a Qwen3-TTS
 * checkpoint (anna_speech_probe), the server loads it as an anna_speech instead of a text
 * model and answers:
 *   POST /v1/audio/speech   OpenAI's speech request (docs SERVING.md): JSON {model, input,
 *                           voice, instructions, response_format, speed, stream_format} plus
 *                           the extensions language (default auto) and seed (default 0);
 *                           the body is the encoded audio sent chunked as it is produced, or
 *                           with stream_format "sse" speech.audio.delta events (base64 of the
 *                           encoded bytes) and one speech.audio.done with usage (input_tokens:
 *                           the wrapped text's ids; output_tokens: codec frames).
 *   GET /v1/models[/name], /healthz, /health; every other route is 404 naming the mode.
 * Requests are serialized: one worker thread synthesizes one request at a time, FIFO; at most
 * max_queue wait (429 beyond). Refused with 400 naming the field: empty or > 4096-character
 * input, an unknown voice (the message lists the preset voices), instructions (not supported
 * by this runtime), response_format aac (no encoder) or unknown, speed other than 1.0,
 * unknown stream_format, unknown fields, an unknown language. A client that disconnects
 * (while queued or mid-stream) cancels its synthesis within one decoded chunk.
 *
 * Ownership: the speech server owns its anna_speech and thread; requests own their buffers,
 * shared by the worker and the connection thread through a reference count.
 */
#ifndef ANNA_SERVER_SPEECH_API_H
#define ANNA_SERVER_SPEECH_API_H

#include <microhttpd.h>
#include <stddef.h>

typedef struct speech_server speech_server;

/* Loads dir (anna_speech_load) and starts the worker. model_name is copied. debug_hooks
 * (--debug-hooks, tests only) accepts the field debug_delay_ms: 1-frame chunks with that
 * sleep after each, so a disconnect test can leave mid-stream deterministically. Caller frees
 * with speech_server_free (cancels what is queued, joins the worker). */
int speech_server_create(speech_server **out, const char *dir, const char *model_name, const char *device,
                         int n_threads, int debug_hooks, char *err, size_t errlen);
void speech_server_free(speech_server *s);
const char *speech_server_describe(const speech_server *s);
/* Requests queued or running. */
int speech_server_busy(speech_server *s);

/* Answers every request of speech mode (the routes above); *status gets the HTTP status
 * (499 when the client left before the answer began). body[0, len) borrowed; too_big: the
 * body exceeded max_body (413). */
enum MHD_Result speech_route(speech_server *s, struct MHD_Connection *c, const char *method, const char *url,
                             const char *rid, const char *body, size_t len, int too_big, size_t max_body,
                             int *status);

#endif
