/* anna_speak.c: text -> speech with a Qwen3-TTS CustomVoice folder through the library's
 * speech API (anna.h anna_speech): the talker's codec frames are decoded chunk by chunk by the
 * codec's streaming decoder and written as they arrive.
 *
 *   anna-speak --model-dir DIR --text T --speaker S [--language L] --out out.wav
 *              [--format wav|pcm|flac|mp3|opus] [--stream] [--codec-dir DIR/speech_tokenizer]
 *              [--tokenizer DIR/tokenizer.json] [--text-ids a,b,...] [--max-frames N] [--greedy]
 *              [--seed N] [--threads N] [--chunk-frames N] [--first-chunk-frames N] [--print-codes]
 *              [--instructions T | --instruct-ids a,b,...] [--speed X] [--progress | --no-progress]
 *              [--ref-audio FILE]
 *              [--device cpu|cuda|cuda:N|auto] [--tuning k=v,...]
 *
 * --ref-audio clones the voice of a clip with a Base folder: its x-vector (the speaker encoder)
 * takes the place of a preset voice (qwen-tts' x_vector_only_mode); --ref-text (in-context
 * cloning) is refused as not implemented.
 *
 * Without --text / --text-ids the text is read from stdin (a long document): cut into sentences
 * (after . ! ? ; or the CJK 。！？； followed by white space, at blank lines, and at a space
 * before 600 bytes) and synthesized one after another into the one output, each sentence as
 * --text would speak it; on a TTY (or with --progress) a bar on stderr counts the sentences.
 * --instructions describes the voice (a VoiceDesign folder, which has no preset voices) or the
 * style (a 1.7B CustomVoice), wrapped as qwen-tts wraps it; --speed stretches the audio in time
 * without a pitch change (FFmpeg's atempo), [0.25, 4.0].
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
#include <unistd.h>

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

/* All of stdin (caller frees); NULL when unreadable or out of memory. */
static char *read_stdin(size_t *n) {
  size_t len = 0, cap = 1 << 16;
  char *b = malloc(cap);
  for (size_t k; b && (k = fread(b + len, 1, cap - len - 1, stdin)) > 0;) {
    len += k;
    if (cap - len < 2) {
      char *nb = realloc(b, cap * 2);
      if (!nb) free(b);
      b = nb, cap *= 2;
    }
  }
  if (b) b[len] = 0;
  *n = len;
  return b;
}

/* 1 when s[i..] starts a sentence end: . ! ? ; (ASCII) or the CJK 。！？； */
static size_t stop_len(const unsigned char *s) {
  if (*s == '.' || *s == '!' || *s == '?' || *s == ';') return 1;
  static const char *const cjk[] = {"\xe3\x80\x82", "\xef\xbc\x81", "\xef\xbc\x9f", "\xef\xbc\x9b"};
  for (int k = 0; k < 4; k++)
    if (!strncmp((const char *)s, cjk[k], 3)) return 3;
  return 0;
}

/* The text cut into sentences, for synthesis one by one: a sentence ends after a run of
 * terminators (and closing quotes / brackets) followed by white space or the end, or at a blank
 * line; a sentence longer than SENT_MAX bytes is cut at its last space before that (else at
 * SENT_MAX, on a UTF-8 boundary). Pieces are trimmed; empty ones dropped. *out: caller frees
 * each and the array. Returns the count, or -1 when out of memory. */
#define SENT_MAX 600
static int split_sentences(const char *text, char ***out) {
  int n = 0, cap = 16;
  char **v = malloc(sizeof *v * (size_t)cap);
  const unsigned char *p = (const unsigned char *)text;
  while (v && *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (!*p) break;
    const unsigned char *e = p;
    size_t len = 0;
    for (;;) {
      if (!*e) break;
      if (e[0] == '\n' && (e[1] == '\n' || (e[1] == '\r' && e[2] == '\n'))) break;
      size_t k = stop_len(e);
      if (k) {
        e += k;
        while ((k = stop_len(e)) || *e == '"' || *e == '\'' || *e == ')' || *e == ']') e += k ? k : 1;
        if (!*e || *e == ' ' || *e == '\t' || *e == '\n' || *e == '\r' || (e[-1] & 0x80)) break;
        continue;
      }
      e++;
      if ((size_t)(e - p) >= SENT_MAX) { /* too long: back to the last space, else a UTF-8 boundary */
        const unsigned char *q = e;
        while (q > p && *q != ' ') q--;
        if (q > p) e = q;
        else while (e > p && (*e & 0xC0) == 0x80) e--;
        break;
      }
    }
    len = (size_t)(e - p);
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\n' || p[len - 1] == '\r' || p[len - 1] == '\t')) len--;
    if (len) {
      if (n == cap) {
        char **nv = realloc(v, sizeof *v * (size_t)(cap *= 2));
        if (!nv) break;
        v = nv;
      }
      if (!(v[n] = strndup((const char *)p, len))) break;
      n++;
    }
    p = e;
  }
  if (!v || *p) { /* out of memory part way */
    for (int i = 0; v && i < n; i++) free(v[i]);
    free(v);
    return -1;
  }
  *out = v;
  return n;
}

static void progress(int on, int done, int total, double audio_s) {
  if (!on) return;
  const int W = 30, k = total ? W * done / total : W;
  fprintf(stderr, "\r[");
  for (int i = 0; i < W; i++) fputc(i < k ? '#' : ' ', stderr);
  fprintf(stderr, "] %d/%d sentences, %.1f s of audio", done, total, audio_s);
  if (done == total) fprintf(stderr, "\n");
  fflush(stderr);
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
             "  --print-codes      print the codes of every frame\n"
             "  --instructions T   the voice / style in words (VoiceDesign, 1.7B CustomVoice)\n"
             "  --instruct-ids a,b,...  ids of <|im_start|>user\\n{instructions}<|im_end|>\\n instead\n"
             "  --speed X          playback speed in [0.25, 4.0] (libavfilter atempo; default 1)\n"
             "  (no --text/--text-ids: the text is read from stdin, sentence by sentence)\n"
             "  --progress, --no-progress  the sentence bar on stderr (default: on a TTY)\n"
             "  --ref-audio FILE   clone the voice of this clip (a Base folder; x-vector only, up to 60 s)\n");
}

int main(int argc, char **argv) {
  const char *model_dir = NULL, *text = NULL, *speaker = NULL, *language = "auto", *out_path = NULL;
  const char *codec_dir = NULL, *tok_path = NULL, *ids_arg = NULL, *format = NULL, *instructions = NULL;
  const char *hf = NULL, *ins_arg = NULL, *device = NULL, *tuning = NULL;
  double speed = 1.0;
  int bar = -1;
  const char *ref_audio = NULL;
  float *xvec = NULL;
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
    } else if (!strcmp(a, "--ref-audio")) {
      CLI_NEEDV();
      ref_audio = v;
    } else if (!strcmp(a, "--ref-text")) {
      CLI_NEEDV();
      fprintf(stderr, "error: --ref-text (in-context cloning: the clip's codes and transcript in the prompt) is not "
                      "implemented; --ref-audio alone clones the voice from its x-vector\n");
      return 2;
    } else if (!strcmp(a, "--progress")) {
      bar = 1;
    } else if (!strcmp(a, "--no-progress")) {
      bar = 0;
    } else if (!strcmp(a, "--instruct-ids")) {
      CLI_NEEDV();
      ins_arg = v;
    } else if (!strcmp(a, "--speed")) {
      CLI_NEEDV();
      char *end;
      speed = strtod(v, &end);
      if (end == v || *end || !(speed >= 0.25 && speed <= 4.0)) {
        fprintf(stderr, "error: --speed expects a number in [0.25, 4.0], got '%s'\n", v);
        return 2;
      }
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
  if (!model_dir || (!out_path && !stream)) {
    fprintf(stderr, "error: need --model-dir, and --out or --stream\n");
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
  int32_t *ids = NULL, *ins = NULL;
  int n_ids = 0, n_ins = 0;
  if (ids_arg && parse_ids(ids_arg, &ids, &n_ids)) {
    fprintf(stderr, "error: --text-ids expects comma-separated non-negative integers\n");
    return 2;
  }
  if (ins_arg && parse_ids(ins_arg, &ins, &n_ins)) {
    fprintf(stderr, "error: --instruct-ids expects comma-separated non-negative integers\n");
    free(ids);
    return 2;
  }
  anna_speech *s = NULL;
  anna_speech_stats st;
  char **sent = NULL, *doc = NULL;
  int n_sent = 1;
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
  if (!rc && ref_audio) { /* the reference clip's x-vector (a Base folder's speaker encoder) */
    FILE *rf = fopen(ref_audio, "rb");
    unsigned char *rb = NULL;
    long rl = -1;
    if (rf && !fseek(rf, 0, SEEK_END) && (rl = ftell(rf)) >= 0 && !fseek(rf, 0, SEEK_SET) &&
        (rb = malloc((size_t)rl + 1)) && fread(rb, 1, (size_t)rl, rf) != (size_t)rl)
      rl = -1;
    if (rf) fclose(rf);
    const int D = anna_speech_clone_dim(s);
    if (rl < 0)
      rc = anna_err(err, sizeof err, ANNA_EIO, "--ref-audio %s: cannot read the file", ref_audio);
    else if (!D)
      rc = anna_err(err, sizeof err, ANNA_EUNSUPPORTED, "--ref-audio: %s is not a Qwen3-TTS Base folder (no speaker "
                    "encoder to clone a voice with)", model_dir);
    else if (!(xvec = malloc(sizeof *xvec * (size_t)D)))
      rc = anna_err(err, sizeof err, ANNA_ENOMEM, "out of memory");
    else
      rc = anna_speech_clone_embed(s, rb, (size_t)rl, xvec, err, sizeof err);
    free(rb);
  }
  if (rc) goto done;
  /* no --text / --text-ids: the text comes from stdin, synthesized sentence by sentence into
   * the one output */
  if (!text && !ids) {
    size_t dl = 0;
    if (!(doc = read_stdin(&dl)) || (n_sent = split_sentences(doc, &sent)) < 0) {
      rc = anna_err(err, sizeof err, ANNA_ENOMEM, "out of memory reading stdin");
      goto done;
    }
    if (!n_sent) {
      rc = anna_err(err, sizeof err, ANNA_EINVAL, "no text: give --text, --text-ids or text on stdin");
      goto done;
    }
  }
  if (bar < 0) bar = sent && isatty(2);
  anna_speech_stats tot = {0};
  for (int si = 0; si < n_sent && !rc; si++) {
  const anna_speech_request rq = {.text = sent ? sent[si] : text,
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
                                  .on_frame = on_frame,
                                  .instruct_ids = ins,
                                  .n_instruct_ids = n_ins,
                                  .speed = speed,
                                  .voice_embed = xvec};
  rc = anna_speech_synthesize(s, &rq, on_chunk, &sp, &st, err, sizeof err);
  if (!rc && sp.rc) rc = sp.rc, snprintf(err, sizeof err, "%s", sp.err);
  if (rc && sent) {
    char e2[512];
    snprintf(e2, sizeof e2, "sentence %d (\"%.40s\"): %s", si + 1, sent[si], err);
    snprintf(err, sizeof err, "%s", e2);
  }
  if (!si) tot.first_chunk_s = st.first_chunk_s;
  tot.n_frames += st.n_frames, tot.n_samples += st.n_samples, tot.talker_s += st.talker_s;
  tot.codec_s += st.codec_s, tot.total_s += st.total_s;
  progress(bar && !rc, si + 1, n_sent, (double)tot.n_samples / anna_speech_sample_rate(s));
  }
  st = tot;
  if (!rc && sp.file) rc = anna_audio_encoder_finish(sp.file, err, sizeof err);
  if (!rc && sp.stream) rc = anna_audio_encoder_finish(sp.stream, err, sizeof err);
  if (rc) goto done;
  const double audio_s = (double)st.n_samples / anna_speech_sample_rate(s);
  fprintf(stderr, "%d frames, %.2f s of audio: first chunk %.3f s, talker %.2f s, codec %.2f s (RTF %.2f)\n",
          st.n_frames, audio_s, st.first_chunk_s, st.talker_s, st.codec_s, audio_s / st.total_s);
done:
  if (rc) fprintf(stderr, "error: %s\n", err);
  for (int i = 0; sent && i < n_sent; i++) free(sent[i]);
  free(sent);
  free(doc);
  free(xvec);
  anna_audio_encoder_free(sp.file);
  anna_audio_encoder_free(sp.stream);
  anna_speech_free(s);
  free(ids);
  free(ins);
  return rc ? 1 : 0;
}
