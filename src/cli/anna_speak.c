/* anna_speak.c: text -> speech with a Qwen3-TTS CustomVoice folder: the talker and code
 * predictor (model/tts_qwen3.h) make codec frames, the speech-tokenizer decoder
 * (model/codec_qwen3_tts.h) turns them into 24 kHz PCM, libsndfile writes a 16-bit WAV.
 *
 *   anna-speak --model-dir DIR --text T --speaker S [--language L] --out out.wav
 *              [--codec-dir DIR/speech_tokenizer] [--tokenizer DIR/tokenizer.json]
 *              [--text-ids a,b,...] [--max-frames N] [--greedy] [--seed N] [--threads N]
 *              [--print-codes]
 *
 * The text is wrapped as `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n`
 * (the chat specials parsed, the text itself not); --text-ids gives those ids directly.
 * The tokenizer must be a tokenizer.json (a released folder ships vocab.json + merges.txt:
 * convert it once, or pass --tokenizer). Sampling follows generation_config.json unless
 * --greedy. Exit codes: 0, 1 (model / run error), 2 (bad flag); errors are one "error:" line.
 */
#define _POSIX_C_SOURCE 200809L
#include "backends/registry.h"
#include "base/error.h"
#include "base/tuning.h"
#include "cli_common.h"
#include "model/kind.h"
#include "model/tts_qwen3.h"
#include "tokenizer/tokenizer.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef ANNA_HAVE_SNDFILE
#include <sndfile.h>
#endif

static int write_wav(const char *path, const float *pcm, int64_t n, int rate, char *err, size_t errlen) {
#ifdef ANNA_HAVE_SNDFILE
  SF_INFO info = {.samplerate = rate, .channels = 1, .format = SF_FORMAT_WAV | SF_FORMAT_PCM_16};
  SNDFILE *f = sf_open(path, SFM_WRITE, &info);
  if (!f) return anna_err(err, errlen, ANNA_EIO, "%s: %s", path, sf_strerror(NULL));
  /* the codec clamps to [-1, 1]; libsndfile scales floats to 16 bits */
  sf_count_t w = sf_writef_float(f, pcm, n);
  int rc = sf_close(f);
  if (w != n || rc) return anna_err(err, errlen, ANNA_EIO, "%s: short write", path);
  return 0;
#else
  (void)path, (void)pcm, (void)n, (void)rate;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "WAV output needs libsndfile (libsndfile1-dev) at build time");
#endif
}

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

/* ids of the assistant wrapping: specials parsed in the frame, not in the user's text */
static int encode_text(const char *tok_path, const char *text, int32_t **out, int *n, char *err, size_t errlen) {
  tokenizer *tok = NULL;
  int rc = tokenizer_load_json(&tok, tok_path, err, errlen);
  if (rc) return rc;
  const char *parts[3] = {"<|im_start|>assistant\n", text, "<|im_end|>\n<|im_start|>assistant\n"};
  int32_t *all = NULL;
  size_t total = 0;
  for (int i = 0; i < 3 && !rc; i++) {
    int32_t *ids = NULL;
    size_t k = 0;
    rc = tokenizer_encode(tok, parts[i], strlen(parts[i]), i == 1 ? TOKENIZER_ENCODE_NO_PARSE_SPECIAL : 0, &ids, &k,
                          err, errlen);
    if (rc) break;
    int32_t *na = realloc(all, (total + k + 1) * sizeof *na);
    if (!na) {
      free(ids);
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      break;
    }
    all = na;
    if (k) memcpy(all + total, ids, k * sizeof *ids);
    total += k;
    free(ids);
  }
  tokenizer_free(tok);
  if (rc) {
    free(all);
    return rc;
  }
  *out = all, *n = (int)total;
  return 0;
}

static void usage(FILE *f) {
  fprintf(f, "usage: anna-speak --model-dir DIR (--text T | --text-ids a,b,..) --speaker S [--language L]\n"
             "                  --out out.wav [options]\n"
             "  --codec-dir DIR    speech tokenizer folder (default DIR/speech_tokenizer)\n"
             "  --tokenizer FILE   tokenizer.json (default DIR/tokenizer.json)\n"
             "  --greedy           greedy codes (default: sampling as generation_config.json says)\n"
             "  --seed N           sampling seed (default 0)\n"
             "  --max-frames N     at most N codec frames, 12.5 per second (default 1024)\n"
             "  --threads N        CPU threads (default 2)\n"
             "  --print-codes      print the codes of every frame\n");
}

int main(int argc, char **argv) {
  const char *model_dir = NULL, *text = NULL, *speaker = NULL, *language = "auto", *out_path = NULL;
  const char *codec_dir = NULL, *tok_path = NULL, *ids_arg = NULL;
  int max_frames = 1024, greedy = 0, threads = 2, print_codes = 0, seed = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--model-dir")) {
      CLI_NEEDV();
      model_dir = v;
    }
    else if (!strcmp(a, "--text")) {
      CLI_NEEDV();
      text = v;
    }
    else if (!strcmp(a, "--text-ids")) {
      CLI_NEEDV();
      ids_arg = v;
    }
    else if (!strcmp(a, "--speaker")) {
      CLI_NEEDV();
      speaker = v;
    }
    else if (!strcmp(a, "--language")) {
      CLI_NEEDV();
      language = v;
    }
    else if (!strcmp(a, "--out")) {
      CLI_NEEDV();
      out_path = v;
    }
    else if (!strcmp(a, "--codec-dir")) {
      CLI_NEEDV();
      codec_dir = v;
    }
    else if (!strcmp(a, "--tokenizer")) {
      CLI_NEEDV();
      tok_path = v;
    }
    else if (!strcmp(a, "--greedy"))
      greedy = 1;
    else if (!strcmp(a, "--print-codes"))
      print_codes = 1;
    else if (!strcmp(a, "--max-frames")) {
      CLI_NEEDV();
      if (cli_int(a, v, 1, 1 << 16, &max_frames)) return 2;
    } else if (!strcmp(a, "--seed")) {
      CLI_NEEDV();
      if (cli_int(a, v, 0, INT_MAX, &seed)) return 2;
    } else if (!strcmp(a, "--threads")) {
      CLI_NEEDV();
      if (cli_int(a, v, 1, 1024, &threads)) return 2;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "error: unknown flag '%s'\n", a);
      return 2;
    }
  }
  if (!model_dir || (!text && !ids_arg) || !out_path) {
    fprintf(stderr, "error: need --model-dir, --text or --text-ids, and --out\n");
    usage(stderr);
    return 2;
  }
  char err[512] = "", cpath[PATH_MAX], tpath[PATH_MAX];
  int32_t *ids = NULL;
  int n_ids = 0;
  if (ids_arg && parse_ids(ids_arg, &ids, &n_ids)) {
    fprintf(stderr, "error: --text-ids expects comma-separated non-negative integers\n");
    return 2;
  }
  if (!codec_dir) snprintf(cpath, sizeof cpath, "%s/speech_tokenizer", model_dir), codec_dir = cpath;
  if (!tok_path) snprintf(tpath, sizeof tpath, "%s/tokenizer.json", model_dir), tok_path = tpath;

  int rc = 0;
  tts_qwen3 *m = NULL;
  tts_qwen3_state *st = NULL;
  ops_backend *be = NULL, *cbe = NULL;
  const model_kind *ck = model_kind_by_name("qwen3_tts_codec");
  void *cimpl = NULL, *cst = NULL;
  int32_t *codes = NULL;
  float *pcm = NULL;
  anna_tuning t;
  static ops_model_shape shape, cshape;
  if (!ids && (rc = encode_text(tok_path, text, &ids, &n_ids, err, sizeof err))) goto done;
  if ((rc = tuning_from_env(&t, NULL, err, sizeof err)) || (rc = tts_qwen3_load(&m, model_dir, err, sizeof err)))
    goto done;
  tts_qwen3_request rq = {ids, n_ids, speaker, language, max_frames, greedy, (uint64_t)seed};
  const int P = tts_qwen3_prefill_len(m, &rq, err, sizeof err);
  if (P < 0) {
    rc = P;
    goto done;
  }
  const int n_ctx = P + max_frames + 1 > 16 ? P + max_frames + 1 : 16;
  tts_qwen3_backend_shape(m, n_ctx, &shape);
  const backend_params bp = {.n_threads = threads, .n_batch = P > 16 ? P : 16, .shape = &shape, .tuning = &t};
  if ((rc = backend_registry_find("cpu")->create(&bp, &be, err, sizeof err)) ||
      (rc = tts_qwen3_state_create(&st, m, be, n_ctx, err, sizeof err)))
    goto done;
  if (!(codes = malloc((size_t)max_frames * TTS_QWEN3_GROUPS * sizeof *codes))) {
    rc = anna_err(err, sizeof err, ANNA_ENOMEM, "out of memory");
    goto done;
  }
  int nf = 0;
  const double t0 = cli_now();
  if ((rc = tts_qwen3_generate(m, st, &rq, codes, &nf, NULL, err, sizeof err))) goto done;
  const double t1 = cli_now();
  if (print_codes)
    for (int f = 0; f < nf; f++)
      for (int k = 0; k < TTS_QWEN3_GROUPS; k++)
        printf("%d%s", codes[f * TTS_QWEN3_GROUPS + k], k + 1 < TTS_QWEN3_GROUPS ? "," : "\n");
  if (nf == 0) {
    rc = anna_err(err, sizeof err, ANNA_ERANGE, "the talker produced no frames (codec eos first)");
    goto done;
  }
  /* the codec */
  model_source src = {.path = codec_dir};
  const model_load_params lp = {.tuning = &t};
  model_desc d;
  if (!ck) {
    rc = anna_err(err, sizeof err, ANNA_EUNSUPPORTED, "the qwen3_tts_codec kind is not compiled in");
    goto done;
  }
  snprintf(src.model_type, sizeof src.model_type, "qwen3_tts_tokenizer_12hz");
  if ((rc = ck->load(&cimpl, &src, &lp, err, sizeof err))) goto done;
  ck->describe(cimpl, &d);
  ck->backend_shape(cimpl, 1024, &cshape);
  const backend_params cbp = {.n_threads = threads, .n_batch = 16, .shape = &cshape, .tuning = &t};
  const model_state_params sp = {.n_seq = 1, .n_ctx = 1024, .n_batch = 16};
  if ((rc = backend_registry_find("cpu")->create(&cbp, &cbe, err, sizeof err)) ||
      (rc = ck->state_create(&cst, cimpl, cbe, &sp, err, sizeof err)))
    goto done;
  const int64_t ns = (int64_t)nf * d.samples_per_frame;
  if (!(pcm = malloc((size_t)ns * sizeof *pcm))) {
    rc = anna_err(err, sizeof err, ANNA_ENOMEM, "out of memory");
    goto done;
  }
  const model_input in = {.io = MODEL_IO_CODES, .codes = codes, .n_frames = nf, .n_codebooks = TTS_QWEN3_GROUPS};
  const model_output out = {.io = MODEL_IO_PCM, .pcm = pcm};
  if ((rc = ck->run(cimpl, cst, cbe, &in, &out, err, sizeof err))) goto done;
  const double t2 = cli_now();
  if ((rc = write_wav(out_path, pcm, ns, d.sample_rate, err, sizeof err))) goto done;
  const double audio_s = (double)ns / d.sample_rate;
  fprintf(stderr, "%d frames, %.2f s of audio: talker %.2f s, codec %.2f s (RTF %.2f)\n", nf, audio_s, t1 - t0,
          t2 - t1, audio_s / (t2 - t0));
done:
  if (rc) fprintf(stderr, "error: %s\n", err);
  if (cst) ck->state_free(cst);
  if (cbe) cbe->destroy(cbe);
  if (cimpl) ck->free(cimpl);
  tts_qwen3_state_free(st);
  if (be) be->destroy(be);
  tts_qwen3_free(m);
  free(codes);
  free(pcm);
  free(ids);
  return rc ? 1 : 0;
}
