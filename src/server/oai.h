/* oai.h: the OpenAI wire format of anna-serve: request bodies in (validated, rendered with
 * the chat template, tokenized into a gen_request), responses out (one JSON object, or SSE
 * chunks rendered incrementally from what the engine has released so far).
 *
 * Everything here runs on connection threads and never touches the model: only the
 * immutable anna_text (tokenizer + template). Errors carry the HTTP status and the
 * OpenAI error object fields.
 */
#ifndef ANNA_SERVER_OAI_H
#define ANNA_SERVER_OAI_H

#include "anna/anna.h"
#include "engine.h"
#include "outparse.h"

#include <stddef.h>

typedef struct oai_error {
  int status;       /* HTTP status */
  const char *type; /* "invalid_request_error", ... (static) */
  const char *code; /* static or NULL */
  char param[64];   /* offending field, "" for none */
  char message[512];
} oai_error;

/* Server-wide settings the parser applies (borrowed). */
typedef struct oai_config {
  const char *model_name;
  const anna_text *text;
  int n_ctx;
  int reasoning_deepseek;  /* --reasoning-format deepseek */
  /* Output markup families (outparse.h), resolved at start from --tool-parser /
   * --reasoning-parser or the chat template: enum outparse_tools (NONE: calls are never
   * parsed) and enum outparse_reasoning (NONE: no reasoning split). */
  int tool_parser, reasoning_parser;
  anna_sampler_params defaults; /* generation-default flags */
  int default_max_tokens;  /* chat; <= 0: up to the context */
  int max_n;
  int default_enable_thinking; /* -1: leave to the template */
  int debug_hooks;             /* accept "anna_debug_output" (forced output text) */
  /* Images (chat content parts "image_url" with data: URLs): the model they are prepared for
   * (NULL or no vision tower: every image part is a 400) and the limits, each refusal a 400
   * naming its flag. */
  const anna_model *model;
  int64_t max_image_pixels; /* --max-image-pixels: width * height of one image (<= 0: none) */
  int max_images;           /* --max-images-per-request */
  size_t max_image_bytes;   /* --max-image-bytes: one image's encoded bytes */
  const char *allowed_image_domains; /* --allowed-image-domains: http(s) image URLs from these hosts
                                        are fetched (imgfetch.h); NULL: none */
  long image_fetch_timeout_s;        /* --image-fetch-timeout-seconds */
  /* Video (chat content parts "video_url", as vLLM takes them): data:video/...;base64 URLs, or
   * http(s) from --allowed-image-domains (the one remote-media policy); each limit's refusal is
   * a 400 naming its flag. Videos count towards max_images too (one media list). */
  int max_videos;           /* --max-videos-per-request */
  size_t max_video_bytes;   /* --max-video-bytes: one video's encoded bytes */
  int max_video_frames;     /* --max-video-frames: frames the processor samples */
  double max_video_seconds; /* --max-video-seconds: the stream's duration */
  int64_t max_video_pixels; /* --max-video-pixels: width * height of one frame */
} oai_config;

enum { OAI_CHAT = 0, OAI_COMPLETION = 1 };

typedef struct oai_job {
  int kind;
  int stream, include_usage;
  int tools; /* parse tool calls from the output: enum outparse_tools (0: no) */
  int reasoning, start_in_reasoning; /* reasoning: enum outparse_reasoning (0: no split) */
  char *tools_json; /* the request's tools as JSON text (qwen3_coder types values by them); owned */
  gen_request *r; /* owned: one reference */
  char *model;    /* model name echoed back; owned */
  long long created;
} oai_job;

/* Parses a body into job (job->r prepared, not yet submitted). 0, or -1 with *e filled. */
int oai_parse(const oai_config *cfg, int kind, const char *body, size_t len, const char *rid,
              oai_job *job, oai_error *e);
void oai_job_clear(oai_job *job);

/* The output parser for one choice of job (incremental: tool calls as name + argument
 * pieces, for streams). Caller frees with outparse_free; NULL when out of memory. */
outparse *oai_outparse_new(const oai_job *job, int incremental);

/* The error object as JSON text (caller frees). */
char *oai_error_json(const oai_error *e);
/* Fills e; returns -1. */
int oai_fail(oai_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Non-stream response body for a finished request (caller frees); NULL when out of memory. */
char *oai_response_json(const oai_config *cfg, const oai_job *job);

/* Incremental SSE rendering. Caller frees with oai_stream_free. */
typedef struct oai_stream oai_stream;
oai_stream *oai_stream_new(const oai_config *cfg, const oai_job *job);
void oai_stream_free(oai_stream *s);
/* Renders everything new in job->r as SSE events appended to *out (growing the buffer out, len,
 * cap; caller frees *out). Sets *finished once "data: [DONE]" has been written. Takes r->mu itself.
 * Returns 0 or ANNA_ENOMEM. */
int oai_stream_step(oai_stream *s, char **out, size_t *len, size_t *cap, int *finished);
/* 1 when the request has something the stream has not rendered yet (call with r->mu held). */
int oai_stream_has_news(const oai_stream *s);

/* GET /v1/models body (caller frees). */
char *oai_models_json(const oai_config *cfg, long long created);

#endif
