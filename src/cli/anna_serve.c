/* anna-serve: the OpenAI-compatible HTTP server (flags -> server_options -> server_run). */
#include "cli_common.h"
#include "server.h"
#include "outparse.h"
#include <sys/stat.h>

/* Model-load progress: the bar on a terminal (cli_load_progress); otherwise one line through
 * the server's logger when the read is done, so --log-format json keeps every line JSON. */
static void serve_load_progress(void *user, uint64_t done, uint64_t total) {
  cli_progress *p = user;
  if (done == 0 || p->t0 == 0) {
    p->t0 = cli_now();
    p->tty = isatty(2);
  }
  if (p->tty) {
    cli_load_progress(user, done, total);
    return;
  }
  if (done < total) return;
  const double mib = 1024.0 * 1024.0, dt = cli_now() - p->t0;
  slog(SLOG_INFO, NULL, "read %.1f MiB of weights in %.2f s (%.0f MiB/s)", (double)total / mib, dt,
       dt > 0 ? (double)total / mib / dt : 0.0);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: anna-serve --model-dir DIR|--model FILE.gguf [options]\n"
          "  --hf-repo ORG/NAME[:FILE|:TAG]  a Hugging Face Hub model (API id: the name; downloaded into the\n"
          "                           huggingface_hub cache; HF_ENDPOINT, HF_TOKEN; anna-pull --help)\n"
          "  --model-name NAME        id in the API (default: from the path)\n"
          "  --host HOST --port PORT  bind address (default 127.0.0.1:8000; port 0 = any free port)\n"
          "  --ctx-size N             positions per sequence (default 4096)\n"
          "  --parallel N             sequence slots (default: max(4, scheduler batch size))\n"
          "  --batch-size N           max tokens per engine step (default 512)\n"
          "  --threads N              compute threads (default: one per core)\n"
          CLI_DEVICE_USAGE
          "  --mmproj FILE            vision tower from a llama.cpp mmproj GGUF (or an HF folder with\n"
          "                           model.visual.*) beside a GGUF text model (replaces a folder's tower)\n"
          "  --weight-quant none|auto|int4  int4: quantize an HF folder to Q4_K_M at load (cached\n"
          "                           under ${ANNA_CACHE:-~/.cache/anna}/quant; see anna-quantize);\n"
          "                           auto = none (GGUF files load as stored)\n"
          "  --dtype f32|bf16         compute dtype (default f32; bf16, cuda only: prefill GEMMs on\n"
          "                           activations rounded to bf16, as llama.cpp; faster, less exact)\n"
          "  --scheduler-profile none|interactive|throughput\n"
          "  --scheduler-max-batch-size N  --scheduler-batch-wait-ms MS\n"
          "  --scheduler-max-prefill-tokens N  --scheduler-max-decode-tokens N\n"
          "  --scheduler-max-waiting-requests N (429 beyond; 0 = unlimited)\n"
          "  --scheduler-max-queue-wait-ms MS  --scheduler-prefill-interval-steps N\n"
          "  --log-format text|json  --log-level debug|info|warn|error\n"
          "  --metrics-log-interval-seconds S (0 = off)\n"
          "  --engine-profile S       every S seconds log where the engine thread's time went: phases per\n"
          "                           step (scheduling, batch, model calls, sampling, text, publishing),\n"
          "                           rows per step, CUDA graph steps (also in /metrics: anna_engine_*)\n"
          "  --split-prefill-decode   run a step's decode rows and prompt chunks as two model calls (decode\n"
          "                           alone: CUDA graphs) instead of one mixed call; same outputs\n"
          "  --reasoning-format none|deepseek  deepseek: reasoning goes to reasoning_content (the parser's family\n"
          "                           from --reasoning-parser, auto by default)\n"
          "  --tool-parser hermes|qwen3_coder|gemma4|none|auto  tool-call markup of the model (default auto:\n"
          "                           from the chat template; none: calls stay text)\n"
          "  --reasoning-parser qwen3|gemma4|none|auto  reasoning markup (<think> / <|channel>); naming one\n"
          "                           turns the split on as --reasoning-format deepseek does (auto: from the\n"
          "                           template); none turns it off\n"
          "  --no-prompt-cache        no prefix block pool and no exact prompt cache (also: ANNA_TUNING=prefix_kv_share=0\n"
          "                           turns the prefix pool off)\n"
          "  --prompt-cache-block N   snapshot hybrid (GDN) state every N prompt tokens (default 256)\n"
          "  --prompt-cache-checkpoints N  GDN state snapshot slots (default max(8, 2 x --parallel))\n"
          "  --prompt-cache-size N    exact prompt cache entries: identical prompts skip prefill (default 0)\n"
          "  --prompt-cache-max-tokens N  only prompts up to N tokens enter the exact cache (0 = no limit)\n"
          "  --prefix-min-tail N      a prompt reusing cached blocks still computes its last N tokens\n"
          "                           (default: 32 for GGUF files on the CPU, else 0), so warm and cold runs\n"
          "                           give the same logits (0 = reuse all but the last token)\n"
          "  --kv-block-len N         KV cache block length, a power of two >= 16 (default 64)\n"
          "  --kv-cache-residual-len N  quantized KV: newest N positions kept and attended in f32\n"
          CLI_OFFLOAD_USAGE
          "  --kv-cache-quantization none|auto|f16|q8|q4|turboquant  --kv-cache-quant-bits 2|3|4\n"
          "  --kv-blocks N            KV pool size in blocks (default 0: every slot can reach --ctx-size);\n"
          "                           a smaller pool preempts sequences (recomputed later) when it runs out\n"
          "  --gpu-memory-utilization F  size the KV pool so anna uses at most F (0 < F <= 1) of the GPU's\n"
          "                           memory (vLLM's flag; instead of --kv-blocks; needs --device cuda|auto)\n"
          "  --exact                  quantized weights x f32 activations (exact, slower;\n"
          "                           default: 8-bit activations, llama.cpp's numerics)\n"
          "  --mask-threads N         threads computing structured-output token masks while the forward\n"
          "                           pass runs (default: cores / 2, at most 8; 0: after it, on the engine thread)\n"
          "  --json-mask-cache-mib N  JSON Schema token masks kept by parser state, shared by all requests\n"
          "                           (default 64 MiB; 0: every mask computed; same tokens either way)\n"
          "  --host-sampling          download every logits row and sample it on the host, the reference\n"
          "                           path (default: sample from the candidates the backend returns)\n"
          "  --tuning K=V,...         runtime switches (after the environment's ANNA_TUNING; keys:\n"
          "                           src/base/tuning.h)\n"
          "  --speculative ngram|mtp|draft|none  requests verify drafts in windows by default: prompt-lookup\n"
          "                           (ngram), the checkpoint's MTP head (mtp: Qwen3.5 mtp.*; an error for a\n"
          "                           model without one) or --draft-model (draft). none (also off, the\n"
          "                           default): only requests whose body says \"speculative\": true, with the\n"
          "                           n-gram drafter (or --draft-model's); false opts out. Greedy: the plain\n"
          "                           output; sampled / penalised: the same distribution (and a seed's plain\n"
          "                           tokens). Not with logprobs, JSON or images\n"
          "  --draft-model PATH       a smaller model with the same vocabulary drafts (HF folder or GGUF;\n"
          "                           implies --speculative draft unless --speculative none)\n"
          "  --draft-max K            most drafted tokens per window (1..16, default 6)\n"
          "  --draft-fixed            always draft --draft-max tokens (default: adapt K per sequence to its\n"
          "                           acceptance rate)\n"
          "  --ngram-min N  --ngram-max N  suffix lengths the drafter matches (default 1 and 4)\n"
          "  --deterministic          batched == alone: each request's greedy output does not depend on the\n"
          "                           others decoded with it (prompts cut at fixed 64-token boundaries; CUDA:\n"
          "                           batch-invariant kernels, tuning cuda_batch_invariant; slower prefill;\n"
          "                           dense models)\n"
          "  --verbose                print the resolved runtime switches on stderr at start\n"
          "  --max-completion-tokens N  --temperature T  --top-p P  --top-k K  --min-p P\n"
          "  --presence-penalty P  --frequency-penalty P  --repetition-penalty R  --seed S\n"
          "  --enable-thinking | --disable-thinking\n"
          "                           (--max-completion-tokens also caps transcripts: default 512)\n"
          "  --max-body-bytes N (default 8 MiB)  --http-timeout-seconds S (default 60)\n"
          "  --http-header-timeout-seconds S  a new connection's request line and headers must come\n"
          "                           with no pause longer than S (default 10; 0 = the idle timeout):\n"
          "                           bytes that are not HTTP are cut then, not after the idle timeout\n"
          "  --mm-cache-mib N         vision: encoder output cache budget in MiB (default 256; 0: off;\n"
          "                           LRU over preprocessed pixels + tower rows, keyed by content)\n"
          "  --max-image-pixels N     images (vision models): width * height of one image (default 16777216)\n"
          "  --max-images-per-request N  (default 8, at most 64)  --max-image-bytes N  one image (default 20 MiB)\n"
          "  --allowed-image-domains H,*.D  fetch http(s) image URLs from these hosts only (default: none,\n"
          "                           data: URLs only; no redirects)  --image-fetch-timeout-seconds S (default 10)\n"
          "  video (vision models, chat parts video_url: data:video/...;base64 or http(s) from\n"
          "  --allowed-image-domains): --max-videos-per-request N (default 2)  --max-video-bytes N (default\n"
          "  32 MiB; --max-body-bytes applies too)  --max-video-frames N sampled (default 256, at most 768)\n"
          "  --max-video-seconds S (default 600)  --max-video-pixels N per frame (default 3840 x 2160)\n"
          "  --max-audio-seconds S    speech recognition: longest clip accepted (default 300)\n"
          "  --audio-chunk-seconds S  speech recognition: longer clips are cut at their quietest points\n"
          "                           into pieces decoded side by side, as qwen-asr cuts them (default 1200)\n"
          "  --max-connections N      open connections at once (default 1024); one more is closed at once\n"
          "  --max-connections-per-ip N  the same cap per client address (default 0 = none)\n"
          "  --http-keepalive-timeout-seconds S  an idle keep-alive connection is closed S seconds after\n"
          "                           its last response (default 15; 0 = --http-timeout-seconds)\n"
          "  --shutdown-timeout-seconds S (default 30)\n"
          "  --api-key KEY            require 'Authorization: Bearer KEY' (repeatable: any of them)\n"
          "  --api-key-file FILE      keys, one per line (blank lines and '#' lines skipped)\n"
          "  --auth-health            /healthz and /metrics need a key too (default: open)\n"
          "  --responses-store-max N  /v1/responses kept in memory for previous_response_id and GET\n"
          "                           (default 1024; least recently used evicted; 0 = none kept; with\n"
          "                           --responses-db: the in-memory cache in front of the file)\n"
          "  --responses-db PATH      also store them in this SQLite file (created if absent): they\n"
          "                           survive restarts (needs a build with libsqlite3-dev)\n"
          "  --responses-ttl SECONDS  stored responses expire this long after creation (default 0: never)\n"
          "  --ssl-cert-file PEM --ssl-key-file PEM  serve HTTPS (libmicrohttpd with GnuTLS)\n"
          "  --embeddings             serve /v1/embeddings (last-token pooled, normalized hidden states;\n"
          "                           reserves one more KV sequence)\n"
          "  --no-webui               no chat page at / (default: served, open without a key)\n"
          "testing hooks:\n"
          "  --debug-hooks            requests may carry \"anna_debug_output\": TEXT, emitted instead of sampling;\n"
          "                           speech requests \"debug_delay_ms\" and \"debug_max_frames\" (a frame cap)\n"
          "  --debug-step-delay-ms MS sleep after every engine step (slow generation on tiny models)\n");
}

int main(int argc, char **argv) {
  server_options o = {0};
  o.eng.mask_threads = -1; /* --mask-threads: automatic unless given */
  o.eng.json_mask_cache_mib = 64;
  const char *hf = NULL;
  o.host = "127.0.0.1";
  o.responses_store_max = 1024;
  o.port = 8000;
  o.defaults = anna_sampler_params_default();
  o.defaults.temperature = 1.0f; /* OpenAI's default when a request names none */
  o.default_enable_thinking = -1;
  o.tool_parser = OUTPARSE_AUTO;
  o.reasoning_parser = OUTPARSE_UNSET;
  o.log_level = SLOG_INFO;
  o.max_body_bytes = 8u << 20;
  o.http_timeout_s = 60;
  o.http_header_timeout_s = 10;
  o.max_connections = 1024;
  o.http_keepalive_timeout_s = 15;
  o.shutdown_timeout_s = 30;
  o.eng.n_ctx = 4096;
  o.eng.n_batch = 512;
  int parallel = 0, max_body = 8 << 20, no_cache = 0, ckpts = -1, resp_ttl = 0;
  int mm_cache_mib = -1;
  int max_img_px = 0, max_imgs = 0, max_img_bytes = 0, deterministic = 0;
  const char *spec_name = NULL;
  int max_vid_bytes = 0, max_vid_px = 0;
  o.eng.prompt_cache_block = 256;
  o.eng.prefix_min_tail = -1; /* auto, below */
  /* Explicit knobs override the profile: -2 = not given. */
  int k_batch = -2, k_wait = -2, k_pre = -2, k_dec = -2, k_waiting = -2, k_qwait = -2, k_interval = -2;
  const char *profile = "none";
  const char *api_keys[64];
  int n_api_keys = 0;
  cli_offload off = {0};
  int off_rc = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV() CLI_NEEDV()
#define INTF(name, lo, hi, dst)                                                                                        \
  else if (!strcmp(a, name)) {                                                                                         \
    NEEDV();                                                                                                           \
    if (cli_int(a, v, lo, hi, &(dst))) return 2;                                                                       \
  }
#define FLTF(name, lo, hi, dst)                                                                                        \
  else if (!strcmp(a, name)) {                                                                                         \
    NEEDV();                                                                                                           \
    if (cli_float(a, v, lo, hi, &(dst))) return 2;                                                                     \
  }
    if (!strcmp(a, "--model-dir") || !strcmp(a, "--model")) { NEEDV(); o.model_path = v; }
    else if (!strcmp(a, "--hf-repo")) { NEEDV(); hf = v; }
    else if (!strcmp(a, "--model-name")) { NEEDV(); o.model_name = v; }
    else if (!strcmp(a, "--host")) { NEEDV(); o.host = v; }
    else if (!strcmp(a, "--exact")) o.eng.exact_matmul = 1;
    else if (!strcmp(a, "--host-sampling")) o.eng.host_sampling = 1;
    else if (!strcmp(a, "--split-prefill-decode")) o.eng.split_prefill = 1;
    else if (!strcmp(a, "--tuning")) { NEEDV(); o.eng.tuning = v; }
    else if ((off_rc = cli_offload_arg(&off, argc, argv, &i)) != 0) { if (off_rc < 0) return 2; }
    else if (!strcmp(a, "--deterministic")) deterministic = 1;
    else if (!strcmp(a, "--speculative")) {
      NEEDV();
      if (strcmp(v, "ngram") && strcmp(v, "mtp") && strcmp(v, "draft") && strcmp(v, "none") && strcmp(v, "off")) {
        fprintf(stderr, "error: --speculative '%s' is not supported (have: ngram, mtp, draft, none)\n", v);
        return 2;
      }
      spec_name = v;
    }
    else if (!strcmp(a, "--draft-model")) { NEEDV(); o.eng.spec_draft_model = v; }
    INTF("--mask-threads", 0, 64, o.eng.mask_threads)
    INTF("--json-mask-cache-mib", 0, 65536, o.eng.json_mask_cache_mib)
    else if (!strcmp(a, "--draft-fixed")) o.eng.spec_fixed = 1;
    INTF("--draft-max", 1, ANNA_SPEC_MAX_DRAFT, o.eng.spec_draft_max)
    INTF("--ngram-min", 1, ANNA_NGRAM_MAX_N, o.eng.spec_ngram_min)
    INTF("--ngram-max", 1, ANNA_NGRAM_MAX_N, o.eng.spec_ngram_max)
    else if (!strcmp(a, "--verbose")) o.verbose = 1;
    else if (!strcmp(a, "--int8-prefill")) o.eng.exact_matmul = 0; /* old flag: now the default */
    /* --device: both the model loader's check and the engine's context */
    else if (!strcmp(a, "--device")) { NEEDV(); o.device = o.eng.device = v; }
    else if (!strcmp(a, "--layer-split")) { NEEDV(); o.eng.layer_split = v; }
    else if (!strcmp(a, "--tensor-parallel")) { NEEDV(); if (cli_int(a, v, 1, 8, &o.eng.tensor_parallel)) return 2; }
    else if (!strcmp(a, "--tp-comm")) { NEEDV(); o.eng.tp_comm = v; }
    else if (!strcmp(a, "--list-devices")) return cli_list_devices();
    else if (!strcmp(a, "--dtype")) { NEEDV(); o.dtype = v; }
    else if (!strcmp(a, "--weight-quant")) { NEEDV(); if (cli_weight_quant(a, v)) return 2; o.weight_quant = v; }
    else if (!strcmp(a, "--mmproj")) { NEEDV(); o.mmproj = v; }
    else if (!strcmp(a, "--scheduler-profile")) {
      NEEDV();
      if (strcmp(v, "none") && strcmp(v, "interactive") && strcmp(v, "throughput")) {
        fprintf(stderr, "error: --scheduler-profile expects none, interactive or throughput, got '%s'\n", v);
        return 2;
      }
      profile = v;
    } else if (!strcmp(a, "--log-format")) {
      NEEDV();
      if (strcmp(v, "text") && strcmp(v, "json")) {
        fprintf(stderr, "error: --log-format expects text or json, got '%s'\n", v);
        return 2;
      }
      o.log_json = !strcmp(v, "json");
    } else if (!strcmp(a, "--log-level")) {
      NEEDV();
      if (!strcmp(v, "debug")) o.log_level = SLOG_DEBUG;
      else if (!strcmp(v, "info")) o.log_level = SLOG_INFO;
      else if (!strcmp(v, "warn") || !strcmp(v, "warning")) o.log_level = SLOG_WARN;
      else if (!strcmp(v, "error")) o.log_level = SLOG_ERROR;
      else {
        fprintf(stderr, "error: --log-level expects debug, info, warn or error, got '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--reasoning-format")) {
      NEEDV();
      if (strcmp(v, "none") && strcmp(v, "deepseek")) {
        fprintf(stderr, "error: --reasoning-format expects none or deepseek, got '%s'\n", v);
        return 2;
      }
      o.reasoning_deepseek = !strcmp(v, "deepseek");
    } else if (!strcmp(a, "--tool-parser") || !strcmp(a, "--reasoning-parser")) {
      NEEDV();
      const int tool = a[2] == 't';
      const int f = !strcmp(v, "auto") ? OUTPARSE_AUTO : tool ? outparse_tools_parse(v) : outparse_reasoning_parse(v);
      if (f == -1) {
        fprintf(stderr, "error: %s expects %s or auto, got '%s'\n", a,
                tool ? "hermes, qwen3_coder, gemma4, none" : "qwen3, gemma4, none", v);
        return 2;
      }
      if (tool) o.tool_parser = f;
      else o.reasoning_parser = f;
    } else if (!strcmp(a, "--enable-thinking")) o.default_enable_thinking = 1;
    else if (!strcmp(a, "--disable-thinking")) o.default_enable_thinking = 0;
    else if (!strcmp(a, "--debug-hooks")) o.debug_hooks = 1;
    else if (!strcmp(a, "--api-key")) {
      NEEDV();
      if (n_api_keys == (int)(sizeof api_keys / sizeof *api_keys)) {
        fprintf(stderr, "error: more than %d --api-key flags (use --api-key-file)\n", n_api_keys);
        return 2;
      }
      api_keys[n_api_keys++] = v;
    } else if (!strcmp(a, "--api-key-file")) {
      NEEDV();
      o.api_key_file = v;
    } else if (!strcmp(a, "--auth-health")) o.auth_health = 1;
    else if (!strcmp(a, "--embeddings")) o.eng.embeddings = 1;
    else if (!strcmp(a, "--no-webui")) o.no_webui = 1;
    else if (!strcmp(a, "--no-prompt-cache")) no_cache = 1;
    else if (!strcmp(a, "--kv-cache-quantization")) {
      NEEDV();
      o.eng.kv_cache_quantization = v;
    }
    else if (!strcmp(a, "--seed")) {
      NEEDV();
      int s;
      if (cli_int(a, v, 0, INT32_MAX, &s)) return 2;
      o.defaults.seed = (uint64_t)s;
    }
    INTF("--port", 0, 65535, o.port)
    INTF("--ctx-size", 8, 1 << 24, o.eng.n_ctx)
    INTF("--parallel", 1, 1024, parallel)
    INTF("--batch-size", 1, 1 << 20, o.eng.n_batch)
    INTF("--threads", 0, 1024, o.eng.n_threads)
    INTF("--scheduler-max-batch-size", 1, 1024, k_batch)
    INTF("--scheduler-batch-wait-ms", 0, 60000, k_wait)
    INTF("--scheduler-max-prefill-tokens", 0, 1 << 24, k_pre)
    INTF("--scheduler-max-decode-tokens", 0, 1 << 30, k_dec)
    INTF("--scheduler-max-waiting-requests", 0, 1 << 20, k_waiting)
    INTF("--scheduler-max-queue-wait-ms", 0, 3600000, k_qwait)
    INTF("--scheduler-prefill-interval-steps", 1, 1000, k_interval)
    INTF("--metrics-log-interval-seconds", 0, 86400, o.metrics_log_interval_s)
    INTF("--engine-profile", 0, 86400, o.eng.profile_interval_s)
    INTF("--debug-step-delay-ms", 0, 10000, o.eng.debug_step_delay_ms)
    INTF("--prompt-cache-block", 0, 1 << 20, o.eng.prompt_cache_block)
    INTF("--prompt-cache-checkpoints", 0, 4096, ckpts)
    INTF("--prompt-cache-size", 0, 4096, o.eng.prompt_cache_size)
    INTF("--prompt-cache-max-tokens", 0, 1 << 24, o.eng.prompt_cache_max_tokens)
    INTF("--prefix-min-tail", 0, 1 << 20, o.eng.prefix_min_tail)
    INTF("--kv-block-len", 16, 4096, o.eng.kv_block_len)
    INTF("--kv-blocks", 0, 1 << 30, o.eng.kv_blocks)
    INTF("--kv-cache-residual-len", 0, 1 << 20, o.eng.kv_cache_residual_len)
    INTF("--kv-cache-quant-bits", 2, 4, o.eng.kv_cache_quant_bits)
    INTF("--max-completion-tokens", 1, 1 << 24, o.default_max_tokens)
    INTF("--top-k", 0, 1 << 24, o.defaults.top_k)
    INTF("--max-body-bytes", 1024, 1 << 30, max_body)
    INTF("--max-image-pixels", 1, 1 << 30, max_img_px)
    INTF("--mm-cache-mib", 0, 1 << 20, mm_cache_mib)
    INTF("--max-images-per-request", 1, 64, max_imgs)
    INTF("--max-image-bytes", 1, 1 << 30, max_img_bytes)
    INTF("--max-audio-seconds", 1, 86400, o.max_audio_seconds)
    INTF("--audio-chunk-seconds", 1, 86400, o.audio_chunk_seconds)
    INTF("--image-fetch-timeout-seconds", 1, 3600, o.image_fetch_timeout_s)
    INTF("--max-videos-per-request", 1, 64, o.max_videos)
    INTF("--max-video-bytes", 1, 1 << 30, max_vid_bytes)
    INTF("--max-video-frames", 1, 768, o.max_video_frames)
    INTF("--max-video-seconds", 1, 86400, o.max_video_seconds)
    INTF("--max-video-pixels", 1, 1 << 30, max_vid_px)
    else if (!strcmp(a, "--allowed-image-domains")) {
      NEEDV();
      o.allowed_image_domains = v;
    }
    INTF("--http-timeout-seconds", 1, 86400, o.http_timeout_s)
    INTF("--http-header-timeout-seconds", 0, 86400, o.http_header_timeout_s)
    INTF("--max-connections", 1, 65536, o.max_connections)
    INTF("--max-connections-per-ip", 0, 65536, o.max_connections_per_ip)
    INTF("--http-keepalive-timeout-seconds", 0, 86400, o.http_keepalive_timeout_s)
    INTF("--responses-store-max", 0, 1 << 20, o.responses_store_max)
    INTF("--responses-ttl", 0, 1 << 30, resp_ttl)
    else if (!strcmp(a, "--responses-db")) {
      NEEDV();
      o.responses_db = v;
    } else if (!strcmp(a, "--ssl-cert-file")) {
      NEEDV();
      o.ssl_cert_file = v;
    } else if (!strcmp(a, "--ssl-key-file")) {
      NEEDV();
      o.ssl_key_file = v;
    }
    FLTF("--temperature", 0, 2, o.defaults.temperature)
    FLTF("--top-p", 0, 1, o.defaults.top_p)
    FLTF("--min-p", 0, 1, o.defaults.min_p)
    FLTF("--presence-penalty", -2, 2, o.defaults.presence_penalty)
    FLTF("--frequency-penalty", -2, 2, o.defaults.frequency_penalty)
    FLTF("--repetition-penalty", 0.01, 10, o.defaults.repetition_penalty)
    else if (!strcmp(a, "--gpu-memory-utilization")) {
      NEEDV();
      if (cli_float(a, v, 0, 1, &o.eng.gpu_memory_utilization)) return 2;
      if (!(o.eng.gpu_memory_utilization > 0)) {
        fprintf(stderr, "error: --gpu-memory-utilization expects a fraction in (0, 1], got '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--shutdown-timeout-seconds")) {
      NEEDV();
      float t;
      if (cli_float(a, v, 0, 86400, &t)) return 2;
      o.shutdown_timeout_s = t;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "error: unknown flag '%s'\n", a);
      usage(stderr);
      return 2;
    }
#undef NEEDV
#undef INTF
#undef FLTF
  }
  {
    anna_context_options oc;
    memset(&oc, 0, sizeof oc);
    cli_offload_apply(&off, &oc);
    o.eng.offload_mode = oc.offload_mode;
    o.eng.gpu_memory_limit = oc.gpu_memory_limit;
    o.eng.expert_cache_bytes = oc.expert_cache_bytes;
    o.eng.host_memory_limit = oc.host_memory_limit;
    o.eng.reserve_bytes = oc.reserve_bytes;
    o.eng.cached_experts_per_layer = oc.cached_experts_per_layer;
    o.eng.expert_swap_every = oc.expert_swap_every;
  }
  /* the drafters always exist (a request may opt in); --speculative ngram|mtp|draft makes
   * speculation the default, with that drafter; --draft-model alone means draft */
  const int spec_off = spec_name && (!strcmp(spec_name, "none") || !strcmp(spec_name, "off"));
  if (!spec_name && o.eng.spec_draft_model) spec_name = "draft";
  if (o.eng.spec_draft_model && !spec_off && strcmp(spec_name, "draft")) {
    fprintf(stderr, "error: --draft-model goes with --speculative draft (or none), not --speculative %s\n", spec_name);
    return 2;
  }
  if (spec_name && !strcmp(spec_name, "draft") && !o.eng.spec_draft_model) {
    fprintf(stderr, "error: --speculative draft needs --draft-model PATH\n");
    return 2;
  }
  o.eng.spec_default = spec_name && !spec_off;
  o.eng.spec_drafter = o.eng.spec_draft_model             ? ENGINE_DRAFTER_DRAFT
                       : spec_name && !strcmp(spec_name, "mtp") ? ENGINE_DRAFTER_MTP
                                                                : ENGINE_DRAFTER_NGRAM;
  if (!o.eng.spec_draft_max) o.eng.spec_draft_max = 6;
  if (!o.eng.spec_ngram_min) o.eng.spec_ngram_min = 1;
  if (!o.eng.spec_ngram_max) o.eng.spec_ngram_max = 4;
  if (o.eng.spec_ngram_min > o.eng.spec_ngram_max) {
    fprintf(stderr, "error: --ngram-min %d exceeds --ngram-max %d\n", o.eng.spec_ngram_min, o.eng.spec_ngram_max);
    return 2;
  }
  char tuning[1024]; /* --deterministic: the tuning key after the user's --tuning */
  o.eng.deterministic = deterministic;
  if (deterministic) {
    if (o.eng.exact_matmul) {
      fprintf(stderr, "error: --deterministic and --exact: the exact mode's f32 paths are not batch-invariant\n");
      return 2;
    }
    const char *t = o.eng.tuning ? o.eng.tuning : "";
    if ((size_t)snprintf(tuning, sizeof tuning, "%s%scuda_batch_invariant=1", t, *t ? "," : "") >= sizeof tuning) {
      fprintf(stderr, "error: --tuning is too long\n");
      return 2;
    }
    o.eng.tuning = tuning;
  }
  if (cli_hf_model(hf, &o.model_path)) return 1;
  if (hf && !o.model_name) o.model_name = hf;
  if (!o.model_path) {
    fprintf(stderr, "error: --model-dir (or --model) is required\n");
    usage(stderr);
    return 2;
  }
  o.max_body_bytes = (size_t)max_body;
  o.responses_ttl_s = resp_ttl;
  cli_progress load_prog = {0};
  o.load_progress = serve_load_progress;
  o.load_progress_user = &load_prog;
  if (!o.ssl_cert_file != !o.ssl_key_file) {
    fprintf(stderr, "error: --ssl-cert-file and --ssl-key-file go together (got only %s)\n",
            o.ssl_cert_file ? "--ssl-cert-file" : "--ssl-key-file");
    return 2;
  }
  o.api_keys = api_keys;
  o.n_api_keys = n_api_keys;
  if (o.auth_health && !n_api_keys && !o.api_key_file) {
    fprintf(stderr, "error: --auth-health needs --api-key or --api-key-file\n");
    return 2;
  }
  o.max_image_pixels = max_img_px;
  /* 0 turns the encoder cache off (the context's < 0); unset keeps the context's default */
  if (mm_cache_mib >= 0) o.eng.mm_cache_bytes = mm_cache_mib ? (int64_t)mm_cache_mib << 20 : -1;
  o.max_images = max_imgs;
  o.max_image_bytes = (size_t)max_img_bytes;
  o.max_video_bytes = (size_t)max_vid_bytes;
  o.max_video_pixels = max_vid_px;
  /* Profiles (the seed's presets); 0 budgets mean "no budget". */
  int p_batch = 0, p_wait = 0, p_pre = 0, p_dec = 0, p_waiting = 0, p_qwait = 0, p_interval = 1;
  if (!strcmp(profile, "interactive")) p_batch = 2, p_wait = 0, p_pre = 1024, p_dec = 2048, p_waiting = 32, p_qwait = 100;
  else if (!strcmp(profile, "throughput"))
    p_batch = 8, p_wait = 8, p_pre = 2048, p_dec = 4096, p_waiting = 128, p_qwait = 500, p_interval = 4;
  int batch = k_batch != -2 ? k_batch : p_batch;
  o.eng.n_seq = parallel ? parallel : (batch > 4 ? batch : 4);
  o.eng.max_batch_size = batch > 0 ? batch : o.eng.n_seq;
  o.eng.batch_wait_ms = k_wait != -2 ? k_wait : p_wait;
  o.eng.max_prefill_tokens = k_pre != -2 ? k_pre : p_pre;
  o.eng.max_decode_tokens = k_dec != -2 ? k_dec : p_dec;
  o.eng.max_waiting = k_waiting != -2 ? k_waiting : p_waiting;
  o.eng.max_queue_wait_ms = k_qwait != -2 ? k_qwait : p_qwait;
  o.eng.prefill_interval_steps = k_interval != -2 ? k_interval : p_interval;
  o.profile_name = profile;
  o.eng.prompt_cache = !no_cache;
  o.eng.prompt_cache_checkpoints = ckpts >= 0 ? ckpts : (2 * o.eng.n_seq > 8 ? 2 * o.eng.n_seq : 8);
  if (o.eng.kv_block_len & (o.eng.kv_block_len - 1)) {
    fprintf(stderr, "error: --kv-block-len %d is not a power of two\n", o.eng.kv_block_len);
    return 2;
  }
  /* The CPU cannot report its memory; "auto" without a GPU fails in the engine instead. */
  /* auto: quantized weights (GGUF files) on the CPU take another matmul path below 32 tokens
   * (cpu_matmul.c); f32/bf16 weights and CUDA (--deterministic) need no tail. */
  if (o.eng.prefix_min_tail < 0) {
    struct stat mst;
    const int is_file = stat(o.model_path, &mst) == 0 && S_ISREG(mst.st_mode);
    o.eng.prefix_min_tail = is_file && (!o.eng.device || !strstr(o.eng.device, "cuda")) ? 32 : 0;
  }
  if (o.eng.gpu_memory_utilization > 0 && (!o.eng.device || !strcmp(o.eng.device, "cpu"))) {
    fprintf(stderr, "error: --gpu-memory-utilization needs a GPU device (--device cuda or auto)\n");
    return 2;
  }
  if (o.eng.gpu_memory_utilization > 0 && o.eng.kv_blocks > 0) {
    fprintf(stderr, "error: --gpu-memory-utilization and --kv-blocks contradict each other\n");
    return 2;
  }
  char err[512] = "";
  const int run_rc = server_run(&o, err, sizeof err);
  if (run_rc) {
    fprintf(stderr, "error: %s\n", err);
    return 1;
  }
  return 0;
}
