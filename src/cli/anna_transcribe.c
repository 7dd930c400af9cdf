/* anna-transcribe: speech to text with a Qwen3-ASR folder (qwen-asr's layout), through the
 * public API (anna.h "Audio in prompts"), on the CPU.
 *   anna-transcribe --model-dir DIR [--context TEXT] [--language NAME] [--max-new N]
 *                   [--max-seconds S] [--threads N] [--format text|json|srt|vtt]
 *                   [--print-ids | --stream] FILE...
 * Each FILE (WAV, FLAC, OGG, MP3, ...) becomes an audio anna_media (decoded, resampled to
 * 16 kHz mono, log-mel: anna_media_audio_decode); its prompt is anna_asr_prompt's (the
 * context in the system turn, "language {NAME}<asr_text>" appended when forced; --language takes
 * a name of config.json's support_languages or an ISO code), prefilled with the encoder's rows
 * in place of the pads (anna_context_prefill), then greedy decoding until <|im_end|> /
 * <|endoftext|> or --max-new tokens (default 512). Files are transcribed one after another in
 * one context.
 * Output per file, in order: text (default): the text after <asr_text> (all of it when there is
 * none or the language was forced), one line; the detected language goes to stderr. json: one
 * JSON object per line {"file", "language", "duration", "text"}. srt / vtt: one cue spanning the
 * clip (the model emits no timestamps), a document per file. --print-ids first prints the
 * generated ids (through the stop id). --stream (text only) prints the transcript as it
 * decodes (the same bytes in the end; text before <asr_text> is held until the marker).
 * Not done: the wrapper's 1200-s splitting of long audio (longer files are refused, --max-seconds
 * default 300) and its collapsing of runs repeated more than 20 times. Exit 0, 1 (failure: an
 * "error: " line, after the files before it were printed), 2 (usage). */
#include "anna/anna.h"
#include "cli_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FMT_TEXT, FMT_JSON, FMT_SRT, FMT_VTT };

static void usage(FILE *f) {
  fprintf(
      f, "usage: anna-transcribe --model-dir DIR|--hf-repo ORG/NAME [--context TEXT] [--language NAME] [--max-new N]\n"
         "                       [--max-seconds S] [--threads N] [--format text|json|srt|vtt]\n"
         "                       [--print-ids | --stream] FILE...\n");
}

static unsigned char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? 2 * cap : 1 << 16;
      unsigned char *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        fclose(f);
        return NULL;
      }
      buf = nb;
    }
    size_t k = fread(buf + len, 1, cap - len, f);
    len += k;
    if (!k) break;
  }
  fclose(f);
  *n = len;
  return buf;
}

/* s as a JSON string literal (escapes quotes, backslashes and control bytes; UTF-8 as is). */
static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p == '\n')
      fputs("\\n", f);
    else if (*p < 0x20)
      fprintf(f, "\\u%04x", *p);
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

/* hh:mm:ss,mmm (srt) or hh:mm:ss.mmm (vtt) */
static void stamp(FILE *f, double s, char sep) {
  long long ms = llround(s * 1000.0);
  fprintf(f, "%02lld:%02lld:%02lld%c%03lld", ms / 3600000, ms / 60000 % 60, ms / 1000 % 60, sep,
          ms % 1000);
}

static int32_t argmax(const float *x, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[best]) best = i; /* first of equal maxima */
  return best;
}

/* --stream: the text as it decodes. Before <asr_text> (unforced) it is held back: the
 * "language X" prefix goes to stderr once the marker shows, as in the final print. */
typedef struct live {
  anna_text_stream *ts;
  char *acc; /* everything decoded so far */
  size_t len, cap, shown;
  int started, forced;
} live;

static int live_add(live *L, const char *p, size_t n, int final) {
  if (L->len + n + 1 > L->cap) {
    size_t nc = (L->len + n + 1) * 2 + 256;
    char *nb = realloc(L->acc, nc);
    if (!nb) return ANNA_ENOMEM;
    L->acc = nb, L->cap = nc;
  }
  memcpy(L->acc + L->len, p, n);
  L->len += n;
  L->acc[L->len] = 0;
  if (!L->started) {
    char lang[64];
    const size_t off = L->forced ? 0 : anna_asr_output_split(L->acc, L->len, lang, sizeof lang);
    if (off) fprintf(stderr, "language %s\n", lang);
    if (L->forced || off || final) L->started = 1, L->shown = off;
  }
  if (L->started && L->len > L->shown) {
    fwrite(L->acc + L->shown, 1, L->len - L->shown, stdout);
    fflush(stdout);
    L->shown = L->len;
  }
  return 0;
}

/* Transcribes one file: prints its output; 0 or an error code with err filled. */
static int transcribe(anna_model *m, const anna_text *t, anna_context **ctx, int *ctx_cap,
                      int threads, const char *file, const char *context, const char *language,
                      int max_new, int max_seconds, int fmt, int print_ids, int stream, char *err,
                      size_t errlen) {
  size_t n_bytes = 0;
  unsigned char *bytes = read_all(file, &n_bytes);
  if (!bytes) return anna_err(err, errlen, ANNA_EIO, "%s: cannot read the file", file);
  anna_media *md = NULL;
  int rc = anna_media_audio_decode(&md, m, bytes, n_bytes, (double)max_seconds, err, errlen);
  free(bytes);
  int32_t *ids = NULL, *gen = NULL, at = -1;
  size_t n = 0;
  float *logits = NULL;
  char *text = NULL;
  if (!rc) rc = anna_asr_prompt(m, t, md, context, language, &ids, &n, &at, err, errlen);
  const int V = anna_model_vocab(m);
  const int32_t eot = anna_text_token_id(t, "<|endoftext|>"); /* qwen-asr stops on it too */
  /* one sequence; the context is remade when a longer prompt comes */
  if (!rc) {
    const int need = (int)n + max_new + 1;
    if (!*ctx || need > *ctx_cap) {
      anna_context_free(*ctx);
      *ctx = NULL;
      const anna_context_options co = {.n_seq = 1, .n_ctx = need, .n_threads = threads};
      rc = anna_context_create(ctx, m, &co, err, errlen);
      *ctx_cap = rc ? 0 : need;
    } else {
      anna_context_seq_reset(*ctx, 0);
    }
  }
  if (!rc && (!(logits = malloc(sizeof(float) * (size_t)V)) ||
              !(gen = malloc(sizeof(int32_t) * (size_t)max_new))))
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  int n_gen = 0;
  if (!rc) {
    const anna_media_ref ref = {md, at};
    const anna_prompt p = {ids, (int32_t)n, &ref, 1};
    rc = anna_context_prefill(*ctx, 0, &p, logits, err, errlen);
  }
  int stopped = 0;
  live L = {.forced = language != NULL};
  if (!rc && stream) rc = anna_text_stream_new(&L.ts, t, 0, err, errlen);
  while (!rc && n_gen < max_new) {
    int32_t g = argmax(logits, V), gs = 0, gp = (int32_t)n + n_gen;
    gen[n_gen++] = g;
    if (anna_text_is_eog(t, g) || g == eot) {
      stopped = 1;
      break;
    }
    if (stream) {
      char piece[256];
      size_t pl = 0;
      rc = anna_text_stream_feed(L.ts, g, piece, sizeof piece, &pl, err, errlen);
      if (!rc && (rc = live_add(&L, piece, pl, 0))) anna_err(err, errlen, rc, "out of memory");
      if (rc) break;
    }
    if (n_gen == max_new) break;
    int8_t gw = 1;
    const anna_batch b = {1, &g, &gs, &gp, &gw};
    rc = anna_context_decode(*ctx, &b, logits, err, errlen);
  }
  if (!rc && stream) {
    char piece[256];
    size_t pl = 0;
    rc = anna_text_stream_flush(L.ts, piece, sizeof piece, &pl, err, errlen);
    if (!rc && (rc = live_add(&L, piece, pl, 1))) anna_err(err, errlen, rc, "out of memory");
    if (!rc) printf("\n");
  }
  anna_text_stream_free(L.ts);
  free(L.acc);
  size_t tlen = 0;
  if (!rc)
    rc = anna_text_detokenize(t, gen, (size_t)(n_gen - stopped), 0, &text, &tlen, err, errlen);
  if (!rc) {
    if (print_ids) {
      for (int i = 0; i < n_gen; i++)
        printf("%s%d", i ? "," : "", gen[i]);
      printf("\n");
    }
    char lang[64] = "";
    const size_t off = language ? 0 : anna_asr_output_split(text, tlen, lang, sizeof lang);
    const char *tr = text + off;
    const double secs = anna_media_audio_seconds(md);
    if (off && fmt == FMT_TEXT && !stream) fprintf(stderr, "language %s\n", lang);
    if (fmt == FMT_TEXT) {
      if (!stream) printf("%s\n", tr);
    } else if (fmt == FMT_JSON) {
      printf("{\"file\":");
      json_str(stdout, file);
      printf(",\"language\":");
      json_str(stdout, language ? language : lang);
      printf(",\"duration\":%.3f,\"text\":", secs);
      json_str(stdout, tr);
      printf("}\n");
    } else {
      const char sep = fmt == FMT_SRT ? ',' : '.';
      if (fmt == FMT_VTT) printf("WEBVTT\n\n");
      if (fmt == FMT_SRT) printf("1\n");
      stamp(stdout, 0, sep);
      printf(" --> ");
      stamp(stdout, secs, sep);
      printf("\n%s\n\n", tr);
    }
    fflush(stdout);
  }
  anna_media_free(md);
  free(ids), free(gen), free(logits), free(text);
  return rc;
}

int main(int argc, char **argv) {
  const char *dir = NULL, *context = "", *language = NULL, *hf = NULL;
  int max_new = 512, threads = 0, print_ids = 0, max_seconds = 300, fmt = FMT_TEXT, stream = 0;
  const char **files = calloc((size_t)argc, sizeof *files);
  int n_files = 0;
  if (!files) return 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--model-dir")) {
      CLI_NEEDV();
      dir = v;
    } else if (!strcmp(a, "--hf-repo")) {
      CLI_NEEDV();
      hf = v;
    } else if (!strcmp(a, "--context")) {
      CLI_NEEDV();
      context = v;
    } else if (!strcmp(a, "--language")) {
      CLI_NEEDV();
      language = v;
    } else if (!strcmp(a, "--format")) {
      CLI_NEEDV();
      if (!strcmp(v, "text"))
        fmt = FMT_TEXT;
      else if (!strcmp(v, "json"))
        fmt = FMT_JSON;
      else if (!strcmp(v, "srt"))
        fmt = FMT_SRT;
      else if (!strcmp(v, "vtt"))
        fmt = FMT_VTT;
      else {
        fprintf(stderr, "error: --format expects text, json, srt or vtt, got '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--max-new")) {
      CLI_NEEDV();
      if (cli_int(a, v, 1, 1 << 16, &max_new)) return 2;
    } else if (!strcmp(a, "--max-seconds")) {
      CLI_NEEDV();
      if (cli_int(a, v, 1, 3600, &max_seconds)) return 2;
    } else if (!strcmp(a, "--threads")) {
      CLI_NEEDV();
      if (cli_int(a, v, 0, 1024, &threads)) return 2;
    } else if (!strcmp(a, "--print-ids")) {
      print_ids = 1;
    } else if (!strcmp(a, "--stream")) {
      stream = 1;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "error: unknown flag %s\n", a);
      usage(stderr);
      return 2;
    } else {
      files[n_files++] = a;
    }
  }
  if (stream && (fmt != FMT_TEXT || print_ids)) {
    fprintf(stderr,
            "error: --stream prints text as it decodes: not with --format %s or --print-ids\n",
            fmt == FMT_TEXT   ? "text"
            : fmt == FMT_JSON ? "json"
            : fmt == FMT_SRT  ? "srt"
                              : "vtt");
    free(files);
    return 2;
  }
  if (cli_hf_model(hf, &dir)) {
    free(files);
    return 1;
  }
  if (!dir || !n_files) {
    fprintf(stderr, "error: %s\n", !dir ? "--model-dir is required" : "no audio file given");
    usage(stderr);
    free(files);
    return 2;
  }
  char err[1024] = "";
  anna_model *m = NULL;
  anna_text *t = NULL;
  anna_context *ctx = NULL;
  int ctx_cap = 0;
  const anna_model_options mo = {.device = "cpu"};
  int rc = anna_model_load(&m, dir, &mo, err, sizeof err);
  if (!rc && !anna_model_has_audio(m)) { /* describe: "qwen3: 2 layers, ..." */
    const char *d = anna_model_describe(m), *colon = strchr(d, ':');
    rc = anna_err(err, sizeof err, ANNA_EUNSUPPORTED,
                  "%s: model_type '%.*s' is not a Qwen3-ASR model (no audio encoder)", dir,
                  (int)(colon ? colon - d : (long)strlen(d)), d);
  }
  if (!rc) rc = anna_text_open(&t, dir, ANNA_TEXT_NO_TEMPLATE, err, sizeof err);
  const char *lang = NULL;
  if (!rc && language && !(lang = anna_model_audio_language_find(m, language))) {
    char have[512] = "";
    for (int i = 0; anna_model_audio_language(m, i); i++)
      snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", i ? ", " : "",
               anna_model_audio_language(m, i));
    rc = anna_err(err, sizeof err, ANNA_EINVAL, "--language '%s' is not supported (have: %s)",
                  language, have[0] ? have : "the 30 Qwen3-ASR languages");
  }
  for (int i = 0; !rc && i < n_files; i++)
    rc = transcribe(m, t, &ctx, &ctx_cap, threads, files[i], context, lang, max_new, max_seconds,
                    fmt, print_ids, stream, err, sizeof err);
  if (rc) fprintf(stderr, "error: %s\n", err[0] ? err : "failed");
  anna_context_free(ctx);
  anna_text_free(t);
  anna_model_free(m);
  free(files);
  return rc ? 1 : 0;
}
