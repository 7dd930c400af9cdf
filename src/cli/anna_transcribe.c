/* anna-transcribe: speech to text with a Qwen3-ASR folder (qwen-asr's layout), on the CPU.
 *   anna-transcribe --model-dir DIR [--context TEXT] [--language NAME] [--max-new N]
 *                   [--max-seconds S] [--threads N] [--print-ids] FILE
 * FILE (WAV, FLAC, OGG, MP3, ...) is decoded and resampled to 16 kHz mono (media/audio.h), its
 * 128-bin log-mel computed (media/mel.h) and encoded by the audio tower (qwen3_asr_audio); the
 * thinker's decoder then runs greedy on the ASR prompt (MODELS.md "Qwen3-ASR":
 * <|im_start|>system\n{context}<|im_end|>\n<|im_start|>user\n<|audio_start|> pads
 * <|audio_end|><|im_end|>\n<|im_start|>assistant\n, plus "language {NAME}<asr_text>" when forced)
 * until <|im_end|> / <|endoftext|> or --max-new tokens (default 512). stdout: the text after
 * <asr_text> (all of it when there is none or the language was forced); the detected language
 * goes to stderr. --print-ids first prints the generated ids (through the stop id).
 * Not done: the wrapper's 1200-s splitting of long audio (longer files are refused, --max-seconds
 * default 300) and its collapsing of runs repeated more than 20 times. Exit 0, 1 (failure: an
 * "error: " line), 2 (usage). */
#include "backends/registry.h"
#include "base/error.h"
#include "base/tuning.h"
#include "cli_common.h"
#include "media/audio.h"
#include "media/mel.h"
#include "model/audio_qwen3_asr.h"
#include "model/kind.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(
      f, "usage: anna-transcribe --model-dir DIR [--context TEXT] [--language NAME] [--max-new N]\n"
         "                       [--max-seconds S] [--threads N] [--print-ids] FILE\n");
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

/* A loaded kind with its own CPU backend and state. */
typedef struct part {
  const model_kind *k;
  void *impl, *st;
  ops_backend *be;
  model_desc desc;
} part;

static int part_open(part *p, const model_kind *k, const model_source *src, int threads,
                     int64_t n_batch, int n_ctx, char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  p->k = k;
  anna_tuning t;
  tuning_defaults(&t);
  const model_load_params lp = {.tuning = &t};
  int rc = k->load(&p->impl, src, &lp, err, errlen);
  if (rc) return rc;
  k->describe(p->impl, &p->desc);
  ops_model_shape *shape = calloc(1, sizeof *shape);
  if (!shape) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  k->backend_shape(p->impl, n_ctx, shape);
  const backend_params bp = {
      .n_threads = threads, .n_batch = n_batch, .shape = shape, .tuning = &t};
  rc = backend_registry_find("cpu")->create(&bp, &p->be, err, errlen);
  free(shape);
  if (rc) return rc;
  const model_state_params sp = {.n_seq = 1, .n_ctx = n_ctx, .n_batch = (int)n_batch};
  return k->state_create(&p->st, p->impl, p->be, &sp, err, errlen);
}

static void part_close(part *p) {
  if (p->st) p->k->state_free(p->st);
  if (p->be) p->be->destroy(p->be);
  if (p->impl) p->k->free(p->impl);
}

/* Appends the ids of text to (*ids, *n); flags as tokenizer_encode. */
static int append(const tokenizer *tok, const char *text, int flags, int32_t **ids, size_t *n,
                  size_t *cap, char *err, size_t errlen) {
  int32_t *piece = NULL;
  size_t k = 0;
  int rc = tokenizer_encode(tok, text, strlen(text), flags, &piece, &k, err, errlen);
  if (rc) return rc;
  if (*n + k > *cap) {
    size_t nc = (*n + k) * 2 + 16;
    int32_t *ni = realloc(*ids, nc * sizeof *ni);
    if (!ni) {
      free(piece);
      return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    }
    *ids = ni, *cap = nc;
  }
  if (k) memcpy(*ids + *n, piece, k * sizeof *piece);
  *n += k;
  free(piece);
  return 0;
}

static int32_t special_id(const tokenizer *tok, const char *piece, char *err, size_t errlen) {
  const int32_t id = tokenizer_token_id(tok, piece);
  if (id < 0) anna_err(err, errlen, ANNA_ENOTFOUND, "the tokenizer has no %s token", piece);
  return id;
}

int main(int argc, char **argv) {
  const char *dir = NULL, *file = NULL, *context = "", *language = NULL;
  int max_new = 512, threads = 0, print_ids = 0, max_seconds = 300;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--model-dir")) {
      CLI_NEEDV();
      dir = v;
    } else if (!strcmp(a, "--context")) {
      CLI_NEEDV();
      context = v;
    } else if (!strcmp(a, "--language")) {
      CLI_NEEDV();
      language = v;
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
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (a[0] == '-') {
      fprintf(stderr, "error: unknown flag %s\n", a);
      usage(stderr);
      return 2;
    } else if (file) {
      fprintf(stderr, "error: one audio file only (got %s and %s)\n", file, a);
      return 2;
    } else {
      file = a;
    }
  }
  if (!dir || !file) {
    fprintf(stderr, "error: %s\n", !dir ? "--model-dir is required" : "no audio file given");
    usage(stderr);
    return 2;
  }
  char err[1024] = "";
  int rc = 0;
  media_audio au = {0};
  media_mel *mel = NULL;
  float *feat = NULL, *rows = NULL, *logits = NULL;
  int32_t *ids = NULL, *seq = NULL, *pos = NULL, *eidx = NULL, *gen = NULL;
  int8_t *want = NULL;
  tokenizer *tok = NULL;
  part enc = {0}, dec = {0};
  char *text = NULL;
  size_t n_bytes = 0;
  unsigned char *bytes = read_all(file, &n_bytes);
  if (!bytes) {
    fprintf(stderr, "error: %s: cannot read the file\n", file);
    return 1;
  }
  rc = media_audio_decode(bytes, n_bytes, (double)max_seconds, &au, err, sizeof err);
  free(bytes);
  if (!rc) rc = media_mel_create(128, &mel, err, sizeof err);
  const int64_t L = media_mel_frames(au.n);
  if (!rc && !(feat = malloc(sizeof(float) * 128 * (size_t)(L > 0 ? L : 1))))
    rc = anna_err(err, sizeof err, ANNA_ENOMEM, "out of memory");
  if (!rc) rc = media_mel_compute(mel, au.samples, au.n, feat, err, sizeof err);
  model_source src;
  const model_kind *dk = NULL;
  if (!rc) rc = model_kind_find(dir, &src, &dk, err, sizeof err);
  if (!rc && strcmp(src.model_type, "qwen3_asr"))
    rc = anna_err(err, sizeof err, ANNA_EUNSUPPORTED,
                  "%s: model_type '%s' is not a Qwen3-ASR model", dir, src.model_type);
  if (!rc)
    rc = part_open(&enc, model_kind_by_name("qwen3_asr_audio"), &src, threads, L, 0, err,
                   sizeof err);
  char tpath[4096];
  snprintf(tpath, sizeof tpath, "%s/tokenizer.json", dir);
  if (!rc) rc = tokenizer_load_json(&tok, tpath, err, sizeof err);
  /* the prompt: the context is user text, so its special-token spellings stay plain text */
  size_t n = 0, cap = 0;
  const int64_t N = rc ? 0 : audio_qwen3_asr_tokens(enc.impl, L);
  audio_qwen3_asr_ids sid;
  if (!rc) audio_qwen3_asr_get_ids(enc.impl, &sid);
  if (!rc) rc = append(tok, "<|im_start|>", 0, &ids, &n, &cap, err, sizeof err);
  if (!rc) {
    size_t ln = strlen(context) + 16;
    char *sys = malloc(ln);
    if (!sys)
      rc = anna_err(err, sizeof err, ANNA_ENOMEM, "out of memory");
    else {
      snprintf(sys, ln, "system\n%s", context);
      rc = append(tok, sys, TOKENIZER_ENCODE_NO_PARSE_SPECIAL, &ids, &n, &cap, err, sizeof err);
      free(sys);
    }
  }
  if (!rc)
    rc = append(tok, "<|im_end|>\n<|im_start|>user\n<|audio_start|>", 0, &ids, &n, &cap, err,
                sizeof err);
  /* the pads: the tokenizer's <|audio_pad|> must be the id the thinker replaces */
  const size_t pad0 = n;
  if (!rc) rc = append(tok, "<|audio_pad|>", 0, &ids, &n, &cap, err, sizeof err);
  if (!rc && (n != pad0 + 1 || ids[pad0] != sid.audio_pad))
    rc = anna_err(
        err, sizeof err, ANNA_EFORMAT,
        "the tokenizer's <|audio_pad|> is not one token of id %d (thinker_config.audio_token_id)",
        sid.audio_pad);
  n = pad0;
  for (int64_t i = 0; !rc && i < N; i++) {
    if (n == cap) {
      size_t nc = 2 * cap + (size_t)N + 64;
      int32_t *ni = realloc(ids, nc * sizeof *ni);
      if (!ni) {
        rc = anna_err(err, sizeof err, ANNA_ENOMEM, "out of memory");
        break;
      }
      ids = ni, cap = nc;
    }
    ids[n++] = sid.audio_pad;
  }
  if (!rc)
    rc = append(tok, "<|audio_end|><|im_end|>\n<|im_start|>assistant\n", 0, &ids, &n, &cap, err,
                sizeof err);
  if (!rc && language) {
    char forced[256];
    snprintf(forced, sizeof forced, "language %s", language);
    rc = append(tok, forced, TOKENIZER_ENCODE_NO_PARSE_SPECIAL, &ids, &n, &cap, err, sizeof err);
    if (!rc) rc = append(tok, "<asr_text>", 0, &ids, &n, &cap, err, sizeof err);
  }
  const int32_t im_end = rc ? -1 : special_id(tok, "<|im_end|>", err, sizeof err);
  const int32_t eot = rc || im_end < 0 ? -1 : special_id(tok, "<|endoftext|>", err, sizeof err);
  if (!rc && (im_end < 0 || eot < 0)) rc = ANNA_ENOTFOUND;
  if (!rc)
    rc = part_open(&dec, dk, &src, threads, (int64_t)n, (int)n + max_new + 1, err, sizeof err);
  if (!rc && dec.desc.vocab < 1)
    rc = anna_err(err, sizeof err, ANNA_EUNSUPPORTED, "%s: the decoder makes no logits", dir);
  if (!rc) {
    rows = malloc(sizeof(float) * (size_t)(N > 0 ? N : 1) * (size_t)enc.desc.n_embd);
    logits = malloc(sizeof(float) * (size_t)dec.desc.vocab);
    seq = calloc(n, sizeof *seq), pos = malloc(n * sizeof *pos), eidx = malloc(n * sizeof *eidx);
    want = calloc(n, 1), gen = malloc(sizeof(int32_t) * (size_t)max_new);
    if (!rows || !logits || !seq || !pos || !eidx || !want || !gen)
      rc = anna_err(err, sizeof err, ANNA_ENOMEM, "out of memory");
  }
  if (!rc) {
    const model_input in = {.io = MODEL_IO_AUDIO, .features = feat, .n_frames = L, .n_mels = 128};
    int64_t w = 0;
    const model_output o = {
        .io = MODEL_IO_EMBEDDINGS, .embd = rows, .embd_rows = N, .embd_written = &w};
    rc = enc.k->run(enc.impl, enc.st, enc.be, &in, &o, err, sizeof err);
  }
  int n_gen = 0;
  if (!rc) {
    int64_t ne = 0;
    for (size_t i = 0; i < n; i++) {
      pos[i] = (int32_t)i;
      if (i >= pad0 && ne < N) eidx[ne++] = (int32_t)i;
    }
    want[n - 1] = 1;
    anna_batch b = {(int32_t)n, ids, seq, pos, want};
    const model_input in = {
        .io = MODEL_IO_TOKENS, .batch = &b, .embd = rows, .embd_idx = eidx, .n_embd = ne};
    const model_output o = {.io = MODEL_IO_LOGITS, .logits = logits};
    rc = dec.k->run(dec.impl, dec.st, dec.be, &in, &o, err, sizeof err);
    int32_t g = 0, gs = 0, gp;
    int8_t gw = 1;
    float best;
    while (!rc && n_gen < max_new) {
      g = (int32_t)ops_argmax_f32(logits, dec.desc.vocab, &best);
      gen[n_gen++] = g;
      if (g == im_end || g == eot || n_gen == max_new) break;
      gp = (int32_t)n + n_gen - 1;
      anna_batch b1 = {1, &g, &gs, &gp, &gw};
      const model_input in1 = {.io = MODEL_IO_TOKENS, .batch = &b1};
      rc = dec.k->run(dec.impl, dec.st, dec.be, &in1, &o, err, sizeof err);
    }
  }
  size_t tlen = 0;
  const int stopped = n_gen > 0 && (gen[n_gen - 1] == im_end || gen[n_gen - 1] == eot);
  if (!rc)
    rc = tokenizer_decode(tok, gen, (size_t)(n_gen - stopped), 0, &text, &tlen, err, sizeof err);
  if (!rc) {
    if (print_ids) {
      for (int i = 0; i < n_gen; i++)
        printf("%s%d", i ? "," : "", gen[i]);
      printf("\n");
    }
    const char *mark = language ? NULL : strstr(text, "<asr_text>");
    if (mark) fprintf(stderr, "%.*s\n", (int)(mark - text), text); /* "language English" */
    printf("%s\n", mark ? mark + strlen("<asr_text>") : text);
  }
  if (rc) fprintf(stderr, "error: %s\n", err[0] ? err : "failed");
  free(text);
  part_close(&dec);
  part_close(&enc);
  tokenizer_free(tok);
  free(ids), free(seq), free(pos), free(eidx), free(want), free(gen);
  free(rows), free(logits), free(feat);
  media_mel_free(mel);
  media_audio_free(&au);
  return rc ? 1 : 0;
}
