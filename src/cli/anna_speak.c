/* anna_speak.c: text -> speech with a Qwen3-TTS CustomVoice folder through the library's
 * speech API (anna.h anna_speech): the talker's codec frames are decoded chunk by chunk by the
 * codec's streaming decoder and written as they arrive.
 *
 *   anna-speak --model-dir DIR --text T --speaker S [--language L] --out out.wav
 *              [--format wav|pcm|flac|mp3|opus] [--stream] [--codec-dir DIR/speech_tokenizer]
 *              [--tokenizer DIR/tokenizer.json] [--text-ids a,b,...] [--max-frames N] [--greedy]
 *              [--seed N] [--threads N] [--chunk-frames N] [--first-chunk-frames N] [--print-codes]
 *              [--device cpu|cuda|cuda:N|auto] [--tuning k=v,...]
 *
 * The text is wrapped as `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n`
 * (the chat specials parsed, the text itself not); --text-ids gives those ids directly.
 * The tokenizer must be a tokenizer.json (a released folder ships vocab.json + merges.txt:
 * convert it once, or pass --tokenizer). Sampling follows generation_config.json unless
 * --greedy. --format picks the file's encoding (default: from the --out extension, else wav);
 * --stream writes raw 16-bit little-endian 24 kHz mono PCM to stdout as each chunk is decoded
 * (no --out needed). The default chunking (16 frames, the codec's step) gives the same samples
 * as one whole-utterance decode. Exit codes: 0, 1 (model / run error), 2 (bad flag); errors
 * are one "error:" line.
 */
#define _POSIX_C_SOURCE 200809L
#include "anna/anna.h"
#include "cli_common.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_ids(const char *v, int32_t **out, int *n) {
  int cap = 1;
  for (const char *p = v; *p; p++) cap += *p == ',';
  int32_t *ids = malloc((size_t)cap * sizeof *ids);
  if (!ids) return -1;
  int k = 0;
  const char *p = v;
  while (*p) {
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
      free(ids);
      return -1;
    }
    ids[k++] = (int32_t)x;
    p = *end ? end + 1 : end;
  }
  *out = ids, *n = k;
  return 0;
}

typedef struct speak {
  anna_audio_encoder *file, *stream;
  int print_codes;
  char err[512];
  int rc;
} speak;

static void on_frame(void *user, const int32_t *codes, int n, int f) {
  speak *sp = user;
  (void)f;
  if (!sp->print_codes) return;
  for (int k = 0; k < n; k++)
    printf("%d%s", codes[k], k + 1 < n ? "," : "\n");
}

static int on_chunk(void *user, const float *pcm, int64_t n) {
  speak *sp = user;
  if (sp->file && (sp->rc = anna_audio_encoder_write(sp->file, pcm, n, sp->err, sizeof sp->err))) return 1;
  if (sp->stream && (sp->rc = anna_audio_encoder_write(sp->stream, pcm, n, sp->err, sizeof sp->err))) return 1;
  return 0;
}

static int to_stdout(void *user, const void *b, size_t n) {
  (void)user;
  return fwrite(b, 1, n, stdout) != n || fflush(stdout) != 0;
}

static const char *format_of(const char *path) {
  const char *dot = strrchr(path, '.');
  if (!dot) return "wav";
  static const char *const ext[][2] = {{".wav", "wav"}, {".pcm", "pcm"}, {".raw", "pcm"}, {".flac", "flac"},
                                       {".mp3", "mp3"},  {".opus", "opus"}, {".ogg", "opus"}};
  for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++)
    if (!strcmp(dot, ext[i][0])) return ext[i][1];
  return "wav";
}

static void usage(FILE *f) {
  fprintf(f, "usage: anna-speak --model-dir DIR|--hf-repo ORG/NAME (--text T | --text-ids a,b,..) --speaker S [--language L]\n"
             "                  (--out FILE | --stream) [options]\n"
             "  --format F         wav, pcm, flac, mp3, opus (default: from --out's extension, else wav)\n"
             "  --stream           raw 16-bit LE 24 kHz mono PCM to stdout, chunk by chunk\n"
             "  --instructions T   voice instructions (refused: not supported by this runtime yet)\n"
             "  --codec-dir DIR    speech tokenizer folder (default DIR/speech_tokenizer)\n"
             "  --tokenizer FILE   tokenizer.json (default DIR/tokenizer.json)\n"
             "  --greedy           greedy codes (default: sampling as generation_config.json says)\n"
             "  --seed N           sampling seed (default 0)\n"
             "  --max-frames N     at most N codec frames, 12.5 per second (default 1024)\n"
             "  --chunk-frames N   frames per decoded chunk (default 16)\n"
             "  --first-chunk-frames N  frames of the first chunk (default: --chunk-frames)\n"
             "  --threads N        CPU threads (default 2)\n"
             "  --device D         cpu (default), cuda, cuda:N, auto: where the talker and codec run\n"
             "  --tuning k=v,...   runtime switches (encoder_cpu=1: the CPU whatever --device)\n"
             "  --print-codes      print the codes of every frame\n");
}

int main(int argc, char **argv) {
  const char *model_dir = NULL, *text = NULL, *speaker = NULL, *language = "auto", *out_path = NULL;
  const char *codec_dir = NULL, *tok_path = NULL, *ids_arg = NULL, *format = NULL, *instructions = NULL;
  const char *hf = NULL, *device = NULL, *tuning = NULL;
  int max_frames = 1024, greedy = 0, threads = 2, print_codes = 0, seed = 0, stream = 0, chunk = 0, first = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--model-dir")) {
      CLI_NEEDV();
      model_dir = v;
    } else if (!strcmp(a, "--hf-repo")) {
      CLI_NEEDV();
      hf = v;
    } else if (!strcmp(a, "--text")) {
      CLI_NEEDV();
      text = v;
    } else if (!strcmp(a, "--text-ids")) {
      CLI_NEEDV();
      ids_arg = v;
    } else if (!strcmp(a, "--speaker") || !strcmp(a, "--voice")) {
      CLI_NEEDV();
      speaker = v;
    } else if (!strcmp(a, "--language")) {
      CLI_NEEDV();
      language = v;
    } else if (!strcmp(a, "--instructions")) {
      CLI_NEEDV();
      instructions = v;
    } else if (!strcmp(a, "--out")) {
      CLI_NEEDV();
      out_path = v;
    } else if (!strcmp(a, "--format")) {
      CLI_NEEDV();
      format = v;
    } else if (!strcmp(a, "--codec-dir")) {
      CLI_NEEDV();
      codec_dir = v;
    } else if (!strcmp(a, "--tokenizer")) {
      CLI_NEEDV();
      tok_path = v;
    } else if (!strcmp(a, "--greedy"))
      greedy = 1;
    else if (!strcmp(a, "--stream"))
      stream = 1;
    else if (!strcmp(a, "--print-codes"))
      print_codes = 1;
    else if (!strcmp(a, "--max-frames")) {
      CLI_NEEDV();
      if (cli_int(a, v, 1, 1 << 16, &max_frames)) return 2;
    } else if (!strcmp(a, "--chunk-frames")) {
      CLI_NEEDV();
      if (cli_int(a, v, 1, 1 << 16, &chunk)) return 2;
    } else if (!strcmp(a, "--first-chunk-frames")) {
      CLI_NEEDV();
      if (cli_int(a, v, 1, 1 << 16, &first)) return 2;
    } else if (!strcmp(a, "--seed")) {
      CLI_NEEDV();
      if (cli_int(a, v, 0, INT_MAX, &seed)) return 2;
    } else if (!strcmp(a, "--threads")) {
      CLI_NEEDV();
      if (cli_int(a, v, 1, 1024, &threads)) return 2;
    } else if (!strcmp(a, "--device")) {
      CLI_NEEDV();
      device = v;
    } else if (!strcmp(a, "--tuning")) {
      CLI_NEEDV();
      tuning = v;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "error: unknown flag '%s'\n", a);
      return 2;
    }
  }
  if (cli_hf_model(hf, &model_dir)) return 1;
  if (!model_dir || (!text && !ids_arg) || (!out_path && !stream)) {
    fprintf(stderr, "error: need --model-dir, --text or --text-ids, and --out or --stream\n");
    usage(stderr);
    return 2;
  }
  if (stream && print_codes) {
    fprintf(stderr, "error: --print-codes writes to stdout, which --stream uses for audio\n");
    return 2;
  }
  speak sp = {.print_codes = print_codes};
  char err[512] = "";
  if (format && !out_path) {
    fprintf(stderr, "error: --format is the --out file's encoding (--stream is always raw pcm)\n");
    return 2;
  }
  if (out_path && !format) format = format_of(out_path);
  if (format && anna_audio_format_check(format, err, sizeof err)) {
    fprintf(stderr, "error: --format: %s\n", err);
    return 2;
  }
  int32_t *ids = NULL;
  int n_ids = 0;
  if (ids_arg && parse_ids(ids_arg, &ids, &n_ids)) {
    fprintf(stderr, "error: --text-ids expects comma-separated non-negative integers\n");
    return 2;
  }
  anna_speech *s = NULL;
  anna_speech_stats st;
  const anna_speech_options so = {.device = device,
                                  .n_threads = threads,
                                  .codec_dir = codec_dir,
                                  .tokenizer = tok_path,
                                  .max_frames = max_frames,
                                  .tuning = tuning};
  int rc = anna_speech_load(&s, model_dir, &so, err, sizeof err);
  if (!rc && out_path) rc = anna_audio_encoder_file(&sp.file, format, anna_speech_sample_rate(s), out_path, err, sizeof err);
  if (!rc && stream)
    rc = anna_audio_encoder_stream(&sp.stream, "pcm", anna_speech_sample_rate(s), to_stdout, NULL, err, sizeof err);
  if (rc) goto done;
  const anna_speech_request rq = {.text = text,
                                  .text_ids = ids,
                                  .n_text_ids = n_ids,
                                  .voice = speaker,
                                  .language = language,
                                  .instructions = instructions,
                                  .max_frames = max_frames,
                                  .greedy = greedy,
                                  .seed = (uint64_t)seed,
                                  .first_chunk_frames = first,
                                  .chunk_frames = chunk,
                                  .on_frame = on_frame};
  rc = anna_speech_synthesize(s, &rq, on_chunk, &sp, &st, err, sizeof err);
  if (!rc && sp.rc) rc = sp.rc, snprintf(err, sizeof err, "%s", sp.err);
  if (!rc && sp.file) rc = anna_audio_encoder_finish(sp.file, err, sizeof err);
  if (!rc && sp.stream) rc = anna_audio_encoder_finish(sp.stream, err, sizeof err);
  if (rc) goto done;
  const double audio_s = (double)st.n_samples / anna_speech_sample_rate(s);
  fprintf(stderr, "%d frames, %.2f s of audio: first chunk %.3f s, talker %.2f s, codec %.2f s (RTF %.2f)\n",
          st.n_frames, audio_s, st.first_chunk_s, st.talker_s, st.codec_s, audio_s / st.total_s);
done:
  if (rc) fprintf(stderr, "error: %s\n", err);
  anna_audio_encoder_free(sp.file);
  anna_audio_encoder_free(sp.stream);
  anna_speech_free(s);
  free(ids);
  return rc ? 1 : 0;
}
