/* anna-transcribe: speech to text with a Qwen3-ASR folder (qwen-asr's layout), through the
 * public API (anna.h "Audio in prompts"), on the CPU or --device (cuda: encoder and decoder).
 *   anna-transcribe --model-dir DIR [--context TEXT] [--language NAME] [--max-new N]
 *                   [--max-seconds S] [--chunk-seconds S] [--batch N] [--progress|--no-progress]
 *                   [--threads N] [--device D] [--exact] [--format text|json|srt|vtt]
 *                   [--print-ids | --stream] FILE...
 * --device runs the encoder and the decoder there (cuda: the media benchmark's single stream);
 * --exact: f32 activations everywhere (anna_context_options.exact_matmul: with quantized weights
 * the default quantizes activations to 8 bits, as llama.cpp).
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
 * Long audio (qwen-asr's transcribe): a file longer than --chunk-seconds (default 1200, the
 * wrapper's MAX_ASR_INPUT_SECONDS) is cut at its quietest points near each multiple
 * (anna_media_audio_decode_chunks); the pieces decode together, --batch (8) sequences at a time,
 * and their outputs are joined as the wrapper joins them (anna_asr_transcript_join: each
 * stripped and de-repeated, concatenated; languages merged "English,Chinese"). --print-ids then
 * prints a line per piece; --stream prints each piece's text when its batch ends; srt / vtt
 * give a cue per piece (over its span of the source; pieces without text give none). A file of
 * one piece prints as before (its text unstripped). Files longer than --max-seconds (default
 * 3600) are refused. On a TTY (or with --progress) a bar on stderr shows the audio seconds done
 * of a file of several pieces.
 * Exit 0, 1 (failure: an "error: " line, after the files before it were printed), 2 (usage). */
#include "anna/anna.h"
#include "cli_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { FMT_TEXT, FMT_JSON, FMT_SRT, FMT_VTT };

static void usage(FILE *f) {
  fprintf(
      f, "usage: anna-transcribe --model-dir DIR|--hf-repo ORG/NAME [--context TEXT] [--language NAME] [--max-new N]\n"
         "                       [--max-seconds S] [--chunk-seconds S] [--batch N]\n"
         "                       [--progress | --no-progress] [--threads N] [--device cpu|cuda|cuda:N|auto] [--exact]\n"
         "                       [--format text|json|srt|vtt]\n"
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

/* Progress on stderr for long files on a TTY: audio seconds done of the file's total (a piece
 * counts half when encoded, whole when its transcript ends). */
typedef struct progress {
  int on;
  double total, done;
} progress;

static void progress_show(const progress *pg, const char *file) {
  if (!pg->on) return;
  const int W = 30, k = pg->total > 0 ? (int)(W * pg->done / pg->total) : W;
  fprintf(stderr, "\r%.40s [", file);
  for (int i = 0; i < W; i++)
    fputc(i < k ? '#' : ' ', stderr);
  fprintf(stderr, "] %.0f/%.0f s", pg->done, pg->total);
  fflush(stderr);
}

static void progress_end(progress *pg) {
  if (pg->on) fprintf(stderr, "\r\033[K"); /* erase the bar: the transcript follows cleanly */
  pg->on = 0;
}

/* One piece of a file: its media, prompt and generated ids. */
typedef struct piece {
  anna_media *md;
  int32_t *ids, at, *gen;
  size_t n;
  int n_gen, stopped, done;
  char *raw; /* detokenized (special tokens kept, the stop id dropped) */
} piece;

/* Transcribes one file: prints its output; 0 or an error code with err filled. A file longer
 * than chunk_s is cut as qwen-asr cuts it (anna_media_audio_decode_chunks); its pieces decode
 * together, batch at a time, in one context of `batch` sequences, and their transcripts are
 * joined as qwen-asr joins them (anna_asr_transcript_join). */
static int transcribe(anna_model *m, const anna_text *t, anna_context **ctx, int *ctx_cap,
                      int *ctx_seq, int threads, const char *device, int exact, const char *file, const char *context,
                      const char *language, int max_new, int max_seconds, double chunk_s,
                      int batch, int fmt, int print_ids, int stream, int bar, char *err,
                      size_t errlen) {
  size_t n_bytes = 0;
  unsigned char *bytes = read_all(file, &n_bytes);
  if (!bytes) return anna_err(err, errlen, ANNA_EIO, "%s: cannot read the file", file);
  anna_media **mds = NULL;
  double *offs = NULL;
  int32_t np = 0;
  int rc = anna_media_audio_decode_chunks(&mds, &offs, &np, m, bytes, n_bytes,
                                          (double)max_seconds, chunk_s, err, errlen);
  free(bytes);
  piece *P = rc ? NULL : calloc((size_t)np, sizeof *P);
  if (!rc && !P) rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  double secs = 0;
  for (int32_t i = 0; i < np; i++) {
    if (P) P[i].md = mds[i];
    else anna_media_free(mds[i]);
  }
  free(mds);
  size_t max_n = 0;
  for (int32_t i = 0; !rc && i < np; i++) {
    rc = anna_asr_prompt(m, t, P[i].md, context, language, &P[i].ids, &P[i].n, &P[i].at, err,
                         errlen);
    if (!rc && !(P[i].gen = malloc(sizeof(int32_t) * (size_t)max_new)))
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    if (P[i].n > max_n) max_n = P[i].n;
  }
  /* the duration: the source's (the last piece may be padded to 0.5 s) */
  if (!rc && np) secs = np == 1 ? anna_media_audio_seconds(P[0].md) : offs[np - 1] + anna_media_audio_seconds(P[np - 1].md);
  const int V = anna_model_vocab(m);
  const int32_t eot = anna_text_token_id(t, "<|endoftext|>"); /* qwen-asr stops on it too */
  const int B = np < batch ? np : batch;
  /* one context, remade when a longer prompt or more sequences come */
  if (!rc) {
    const int need = (int)max_n + max_new + 1;
    if (!*ctx || need > *ctx_cap || B > *ctx_seq) {
      anna_context_free(*ctx);
      *ctx = NULL;
      const int ns = B > *ctx_seq ? B : *ctx_seq, nc = need > *ctx_cap ? need : *ctx_cap;
      const anna_context_options co = {.n_seq = ns, .n_ctx = nc, .n_threads = threads, .device = device,
                                       .exact_matmul = exact};
      rc = anna_context_create(ctx, m, &co, err, errlen);
      *ctx_cap = rc ? 0 : nc;
      *ctx_seq = rc ? 0 : ns;
    }
  }
  float *logits = NULL;
  int32_t *tok = NULL, *seq = NULL, *pos = NULL, *who = NULL;
  int8_t *want = NULL;
  if (!rc && (!(logits = malloc(sizeof(float) * (size_t)V * (size_t)B)) ||
              !(tok = malloc(sizeof *tok * (size_t)B)) || !(seq = malloc(sizeof *seq * (size_t)B)) ||
              !(pos = malloc(sizeof *pos * (size_t)B)) || !(who = malloc(sizeof *who * (size_t)B)) ||
              !(want = malloc((size_t)B))))
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  progress pg = {.on = bar && np > 1, .total = secs};
  live L = {.forced = language != NULL};
  const int live_one = stream && np == 1; /* one piece: text as it decodes */
  if (!rc && live_one) rc = anna_text_stream_new(&L.ts, t, 0, err, errlen);
  int32_t shown = 0; /* --stream with pieces: pieces printed so far */
  for (int32_t g0 = 0; !rc && g0 < np; g0 += B) {
    const int nb = np - g0 < B ? np - g0 : B;
    /* prefill each piece of the group: its logits row is the first step's */
    for (int k = 0; !rc && k < nb; k++) {
      piece *p = &P[g0 + k];
      anna_context_seq_reset(*ctx, k);
      const anna_media_ref ref = {p->md, p->at};
      const anna_prompt pr = {p->ids, (int32_t)p->n, &ref, 1};
      rc = anna_context_prefill(*ctx, k, &pr, logits + (size_t)k * (size_t)V, err, errlen);
      pg.done += anna_media_audio_seconds(p->md) / 2;
      progress_show(&pg, file);
    }
    int n_live = nb;
    for (int k = 0; k < nb; k++)
      who[k] = k;
    /* each step: sample every live piece from its row, then decode them together */
    while (!rc && n_live) {
      int nn = 0;
      for (int r = 0; r < n_live && !rc; r++) {
        const int k = who[r];
        piece *p = &P[g0 + k];
        const int32_t g = argmax(logits + (size_t)r * (size_t)V, V);
        p->gen[p->n_gen++] = g;
        const int stop = anna_text_is_eog(t, g) || g == eot;
        if (stop) p->stopped = 1;
        if (live_one && !stop) {
          char piece_s[256];
          size_t pl = 0;
          rc = anna_text_stream_feed(L.ts, g, piece_s, sizeof piece_s, &pl, err, errlen);
          if (!rc && (rc = live_add(&L, piece_s, pl, 0))) anna_err(err, errlen, rc, "out of memory");
        }
        if (stop || p->n_gen == max_new) {
          p->done = 1;
          pg.done += anna_media_audio_seconds(p->md) / 2;
          progress_show(&pg, file);
          continue;
        }
        tok[nn] = g, seq[nn] = k, pos[nn] = (int32_t)p->n + p->n_gen - 1, want[nn] = 1;
        who[nn++] = k;
      }
      n_live = nn;
      if (!rc && nn) {
        const anna_batch b = {nn, tok, seq, pos, want};
        rc = anna_context_decode(*ctx, &b, logits, err, errlen);
      }
    }
    for (int k = 0; !rc && k < nb; k++) {
      piece *p = &P[g0 + k];
      size_t tl = 0;
      rc = anna_text_detokenize(t, p->gen, (size_t)(p->n_gen - p->stopped), 0, &p->raw, &tl, err,
                                errlen);
    }
    if (!rc && stream && !live_one) { /* pieces in order, each as qwen-asr parses it */
      progress_end(&pg);
      for (; shown < g0 + nb && !rc; shown++) {
        char *jt = NULL, *jl = NULL;
        const char *r1[1] = {P[shown].raw};
        rc = anna_asr_transcript_join(r1, 1, language != NULL, &jt, &jl, err, errlen);
        if (!rc) fputs(jt, stdout), fflush(stdout);
        free(jt), free(jl);
      }
      pg.on = bar && g0 + nb < np;
    }
  }
  progress_end(&pg);
  if (!rc && live_one) {
    char piece_s[256];
    size_t pl = 0;
    rc = anna_text_stream_flush(L.ts, piece_s, sizeof piece_s, &pl, err, errlen);
    if (!rc && (rc = live_add(&L, piece_s, pl, 1))) anna_err(err, errlen, rc, "out of memory");
  }
  if (!rc && stream) printf("\n");
  anna_text_stream_free(L.ts);
  free(L.acc);
  char *text = NULL, *jlang = NULL;
  const char *tr = NULL;
  char lang[64] = "";
  if (!rc && np == 1) { /* one piece: the text after <asr_text>, as before chunking */
    const size_t off = language ? 0 : anna_asr_output_split(P[0].raw, strlen(P[0].raw), lang, sizeof lang);
    tr = P[0].raw + off;
    if (off && fmt == FMT_TEXT && !stream) fprintf(stderr, "language %s\n", lang);
  } else if (!rc) {
    const char **raws = malloc(sizeof *raws * (size_t)np);
    if (!raws) rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    for (int32_t i = 0; !rc && i < np; i++)
      raws[i] = P[i].raw;
    if (!rc) rc = anna_asr_transcript_join(raws, np, language != NULL, &text, &jlang, err, errlen);
    free(raws);
    if (!rc) {
      tr = text;
      snprintf(lang, sizeof lang, "%s", jlang);
      if (lang[0] && fmt == FMT_TEXT && !stream) fprintf(stderr, "language %s\n", lang);
    }
  }
  if (!rc) {
    if (print_ids)
      for (int32_t i = 0; i < np; i++) {
        for (int k = 0; k < P[i].n_gen; k++)
          printf("%s%d", k ? "," : "", P[i].gen[k]);
        printf("\n");
      }
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
    } else if (np == 1) {
      const char sep = fmt == FMT_SRT ? ',' : '.';
      if (fmt == FMT_VTT) printf("WEBVTT\n\n");
      if (fmt == FMT_SRT) printf("1\n");
      stamp(stdout, 0, sep);
      printf(" --> ");
      stamp(stdout, secs, sep);
      printf("\n%s\n\n", tr);
    } else { /* a cue per piece with text, over the piece's span of the source */
      const char sep = fmt == FMT_SRT ? ',' : '.';
      if (fmt == FMT_VTT) printf("WEBVTT\n\n");
      for (int32_t i = 0, cue = 0; !rc && i < np; i++) {
        char *pt = NULL, *pl = NULL;
        const char *r1[1] = {P[i].raw};
        rc = anna_asr_transcript_join(r1, 1, language != NULL, &pt, &pl, err, errlen);
        if (!rc && pt[0]) {
          if (fmt == FMT_SRT) printf("%d\n", ++cue);
          stamp(stdout, offs[i], sep);
          printf(" --> ");
          stamp(stdout, i + 1 < np ? offs[i + 1] : secs, sep);
          printf("\n%s\n\n", pt);
        }
        free(pt), free(pl);
      }
    }
    fflush(stdout);
  }
  for (int32_t i = 0; P && i < np; i++) {
    anna_media_free(P[i].md);
    free(P[i].ids), free(P[i].gen), free(P[i].raw);
  }
  free(P), free(offs);
  free(logits), free(tok), free(seq), free(pos), free(who), free(want);
  free(text), free(jlang);
  return rc;
}

int main(int argc, char **argv) {
  const char *dir = NULL, *context = "", *language = NULL, *hf = NULL;
  int max_new = 512, threads = 0, print_ids = 0, max_seconds = 3600, fmt = FMT_TEXT, stream = 0;
  int batch = 8, bar = -1;
  const char *device = NULL; /* --device: where the encoder and decoder run (default cpu) */
  int exact = 0;             /* --exact: f32 activations (anna_context_options.exact_matmul) */
  float chunk_s = 1200.0f; /* qwen-asr's MAX_ASR_INPUT_SECONDS */
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
      if (cli_int(a, v, 1, 86400, &max_seconds)) return 2;
    } else if (!strcmp(a, "--chunk-seconds")) {
      CLI_NEEDV();
      if (cli_float(a, v, 1, 1e6, &chunk_s)) return 2;
    } else if (!strcmp(a, "--batch")) {
      CLI_NEEDV();
      if (cli_int(a, v, 1, 256, &batch)) return 2;
    } else if (!strcmp(a, "--progress")) {
      bar = 1;
    } else if (!strcmp(a, "--no-progress")) {
      bar = 0;
    } else if (!strcmp(a, "--threads")) {
      CLI_NEEDV();
      if (cli_int(a, v, 0, 1024, &threads)) return 2;
    } else if (!strcmp(a, "--device")) {
      CLI_NEEDV();
      device = v;
    } else if (!strcmp(a, "--exact")) {
      exact = 1;
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
  int ctx_cap = 0, ctx_seq = 0;
  if (bar < 0) bar = isatty(2);
  const anna_model_options mo = {.device = device ? device : "cpu"};
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
    rc = transcribe(m, t, &ctx, &ctx_cap, &ctx_seq, threads, device, exact, files[i], context, lang, max_new,
                    max_seconds, chunk_s, batch, fmt, print_ids, stream, bar, err, sizeof err);
  if (rc) fprintf(stderr, "error: %s\n", err[0] ? err : "failed");
  anna_context_free(ctx);
  anna_text_free(t);
  anna_model_free(m);
  free(files);
  return rc ? 1 : 0;
}
