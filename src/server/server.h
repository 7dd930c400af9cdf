/* server.h: anna-serve's HTTP front end (libmicrohttpd, one thread per connection) over
 * one engine thread (engine.h) and the OpenAI wire format (oai.h).
 *
 * server_run owns everything it creates: model, text side, engine, HTTP daemon. It blocks
 * until SIGTERM/SIGINT, then drains: the listening socket closes, new requests get 503,
 * in-flight requests finish (or are cut after shutdown_timeout_s), their responses are
 * flushed, and it returns 0.
 */
#ifndef ANNA_SERVER_SERVER_H
#define ANNA_SERVER_SERVER_H

#include "anna/anna.h"
#include "auth.h"
#include "engine.h"

#include <stddef.h>

typedef struct server_options {
  const char *model_path; /* HF folder or .gguf */
  const char *model_name; /* id in the API; NULL: derived from the path */
  const char *host;       /* default 127.0.0.1 */
  int port;               /* 0: any free port (the log line says which) */
  const char *device, *dtype;
  const char *weight_quant; /* anna_model_options.weight_quant */
  const char *mmproj;       /* anna_model_options.mmproj (--mmproj) */
  engine_options eng;           /* eng.tuning also goes to anna_model_options.tuning */
  anna_sampler_params defaults; /* generation defaults for fields a request omits */
  int default_max_tokens;      /* chat; <= 0: up to the context; transcriptions: their cap (<= 0: 512) */
  int default_enable_thinking; /* -1: template default, 0/1: chat_template_kwargs default */
  int reasoning_deepseek;
  /* --tool-parser / --reasoning-parser: an enum outparse_tools / outparse_reasoning value,
   * OUTPARSE_AUTO (from the chat template) or, reasoning only, OUTPARSE_UNSET (auto when
   * --reasoning-format deepseek, else none) */
  int tool_parser, reasoning_parser;
  int log_json, log_level;
  int metrics_log_interval_s; /* 0: off */
  size_t max_body_bytes;
  int http_timeout_s; /* idle connection timeout (slow clients) */
  int http_header_timeout_s; /* idle timeout until a connection's first request line and headers
                                are in (non-HTTP bytes); 0 or >= http_timeout_s: off */
  int max_connections; /* open connections at once; more are accepted and closed at once */
  int max_connections_per_ip; /* 0: no per-address cap */
  int http_keepalive_timeout_s; /* idle time allowed between requests on a keep-alive connection
                                   (after a response, until the next request's headers are in);
                                   0 or >= http_timeout_s: http_timeout_s */
  double shutdown_timeout_s;
  const char *profile_name; /* for /healthz */
  int debug_hooks;          /* testing: forced outputs per request */
  int verbose;              /* print the context's tuning (anna_context_tuning) at start */
  int64_t max_image_pixels; /* images: --max-image-pixels (0: the default below) */
  int max_images;           /* --max-images-per-request (0: default) */
  size_t max_image_bytes;   /* --max-image-bytes (0: default) */
  const char *allowed_image_domains; /* --allowed-image-domains (NULL: no remote images) */
  int image_fetch_timeout_s;         /* --image-fetch-timeout-seconds (0: 10) */
  int max_audio_seconds;             /* --max-audio-seconds: one clip (0: 300) */
  int audio_chunk_seconds;           /* --audio-chunk-seconds: longer clips are cut (0: 1200) */
  /* video (chat content parts "video_url"): 0 = the defaults in http.c */
  int max_videos;           /* --max-videos-per-request (0: 2) */
  size_t max_video_bytes;   /* --max-video-bytes (0: 32 MiB) */
  int max_video_frames;     /* --max-video-frames: sampled frames (0: 256) */
  int max_video_seconds;    /* --max-video-seconds (0: 600) */
  int64_t max_video_pixels; /* --max-video-pixels: one frame (0: 3840 x 2160) */
  /* API keys: --api-key (repeatable, borrowed) and --api-key-file; none: no auth. With keys,
   * every route but /healthz, /health and /metrics needs "Authorization: Bearer KEY" (401
   * otherwise); auth_health: those too. */
  const char *const *api_keys;
  int n_api_keys;
  const char *api_key_file;
  int auth_health;
  /* /v1/responses kept for previous_response_id and GET (--responses-store-max; least
   * recently used evicted; 0: none kept). eng.embeddings turns /v1/embeddings on. */
  int responses_store_max;
  const char *responses_db;   /* --responses-db PATH: SQLite persistence (respstore.h); NULL: memory only */
  long long responses_ttl_s;  /* --responses-ttl: seconds a stored response lives; 0: forever */
  /* --ssl-cert-file / --ssl-key-file (PEM): HTTPS through libmicrohttpd's GnuTLS; both or
   * neither; a libmicrohttpd without TLS is a startup error saying so. */
  const char *ssl_cert_file, *ssl_key_file;
  /* anna_model_options.progress / progress_user for the model load (NULL: no progress) */
  void (*load_progress)(void *user, uint64_t bytes_read, uint64_t bytes_total);
  void *load_progress_user;
  int no_webui; /* --no-webui: no chat page at "/" (webui.h; then "/" is a 404) */
} server_options;

/* Runs until a termination signal. Returns 0, or a negative ANNA_E* code with err filled
 * when startup fails (model, port). */
int server_run(const server_options *o, char *err, size_t errlen);

#endif
