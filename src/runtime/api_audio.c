/* api_audio.c: audio in prompts (anna.h "Audio in prompts") over the Qwen3-ASR audio encoder
 * kind (model/audio_qwen3_asr.h), the audio decoder and log-mel front end (media/audio.h,
 * media/mel.h) and the text decoder's embedding-row input (model_input.embd).
 *
 * The model handle keeps the encoder as a second kind + impl (model_audio), as api_vision.c
 * keeps the vision tower. An audio anna_media carries its features ([n_mels, L], computed at
 * anna_media_audio_decode: they depend only on the clip, and the global-max clamp makes them a
 * per-utterance computation anyway). A context keeps, from its first prefill with audio, the
 * encoder's own CPU backend and state, sized for the longest clip so far (rounded up to 30-s
 * steps, so a few sizes, not one per clip). Prefill: encoder over each clip, then decoder runs
 * of n_batch rows whose pad rows take the encoder's rows, at plain 1-D positions (the thinker's
 * three mRoPE positions are always equal: MODELS.md "Qwen3-ASR").
 */
#define _DEFAULT_SOURCE
#include "anna/anna.h"

#include "base/error.h"
#include "media/asr_chunk.h"
#include "media/audio.h"
#include "media/mel.h"
#include "model/audio_qwen3_asr.h"
#include "runtime/model_handle.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define AUDIO_MAX_LANGS 64
#define AUDIO_FRAMES_STEP 3000 /* encoder state sizes: multiples of 30 s of frames */

struct model_audio {
  const model_kind *kind; /* static */
  void *impl;             /* owned: kind->free */
  model_desc desc;
  anna_audio_info info;
  char *langs[AUDIO_MAX_LANGS]; /* owned: config.json support_languages */
};

struct audio_clip {
  float *feat; /* [n_mels, L] mel-major, owned */
  int64_t L;
  int32_t n_mels;
  int32_t n_embd; /* the encoder it was made for (checked at prefill) */
};

struct ctx_audio {
  const struct model_audio *ma; /* borrowed from the model */
  int n_batch;
  ctx_encoder_device dev; /* where the encoder runs */
  ops_backend *be; /* the encoder's backend on dev (lazy) */
  void *st;        /* the encoder's state (lazy) */
  int64_t cap;     /* frames st takes */
};

/* ---- model ---- */

int model_audio_attach(anna_model *m, const model_source *src, const model_load_params *lp,
                       char *err, size_t errlen) {
  m->aud = NULL;
  const model_kind *k = model_kind_by_name("qwen3_asr_audio");
  if (!k || src->is_gguf || strcmp(src->model_type, "qwen3_asr")) return 0;
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/config.json", src->path);
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) return anna_err(err, errlen, ANNA_EFORMAT, "%s: line %d: %s", path, je.line, je.text);
  struct model_audio *a = calloc(1, sizeof *a);
  if (!a) {
    json_decref(root);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  const json_t *tc = json_object_get(root, "thinker_config");
  const json_t *ac = tc ? json_object_get(tc, "audio_config") : NULL;
  const json_t *nm = ac ? json_object_get(ac, "num_mel_bins") : NULL;
  a->info.n_mels = json_is_integer(nm) ? (int32_t)json_integer_value(nm) : 128;
  a->info.sample_rate = MEDIA_AUDIO_RATE;
  const json_t *sl = json_object_get(root, "support_languages");
  int rc = 0;
  if (sl && !json_is_array(sl))
    rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: support_languages is not an array", path);
  for (size_t i = 0; !rc && sl && i < json_array_size(sl); i++) {
    const json_t *v = json_array_get(sl, i);
    if (!json_is_string(v) || i >= AUDIO_MAX_LANGS)
      rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: support_languages must hold at most %d strings",
                    path, AUDIO_MAX_LANGS);
    else if (!(a->langs[i] = strdup(json_string_value(v))))
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    else
      a->info.n_languages = (int32_t)i + 1;
  }
  json_decref(root);
  char e2[512];
  if (!rc && (rc = k->load(&a->impl, src, lp, e2, sizeof e2)))
    anna_err(err, errlen, rc, "%s: audio encoder: %s", src->path, e2);
  if (rc) {
    for (int i = 0; i < AUDIO_MAX_LANGS; i++)
      free(a->langs[i]);
    free(a);
    return rc;
  }
  a->kind = k;
  k->describe(a->impl, &a->desc);
  audio_qwen3_asr_ids ids;
  audio_qwen3_asr_get_ids(a->impl, &ids);
  a->info.audio_token_id = ids.audio_pad;
  a->info.audio_start_id = ids.audio_start;
  a->info.audio_end_id = ids.audio_end;
  a->info.n_embd = a->desc.n_embd;
  if (a->info.n_embd != m->desc.n_embd && m->desc.n_embd > 0) {
    rc = anna_err(err, errlen, ANNA_EFORMAT,
                  "%s: the audio encoder's rows are %d wide, the thinker's hidden size is %d",
                  src->path, a->info.n_embd, m->desc.n_embd);
    m->aud = a;
    model_audio_detach(m);
    return rc;
  }
  m->aud = a;
  return 0;
}

void model_audio_detach(anna_model *m) {
  if (!m->aud) return;
  m->aud->kind->free(m->aud->impl);
  for (int i = 0; i < AUDIO_MAX_LANGS; i++)
    free(m->aud->langs[i]);
  free(m->aud);
  m->aud = NULL;
}

int anna_model_has_audio(const anna_model *m) {
  return m && m->aud != NULL;
}

static int no_audio(const anna_model *m, char *err, size_t errlen) {
  return anna_err(
      err, errlen, ANNA_EUNSUPPORTED,
      "the model %s has no audio encoder (not a speech-recognition model): it takes no audio",
      m ? m->path : "(none)");
}

int anna_model_audio_info(const anna_model *m, anna_audio_info *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (!anna_model_has_audio(m)) return no_audio(m, err, errlen);
  *out = m->aud->info;
  return 0;
}

const char *anna_model_audio_language(const anna_model *m, int i) {
  if (!anna_model_has_audio(m) || i < 0 || i >= m->aud->info.n_languages) return NULL;
  return m->aud->langs[i];
}

/* Qwen3-ASR's 30 languages (its README) with their ISO 639-1 codes (639-3 where there is
 * none: Cantonese yue, Filipino fil). */
static const char *const k_lang_codes[][2] = {
    {"zh", "Chinese"},    {"en", "English"},    {"yue", "Cantonese"}, {"ar", "Arabic"},
    {"de", "German"},     {"fr", "French"},     {"es", "Spanish"},    {"pt", "Portuguese"},
    {"id", "Indonesian"}, {"it", "Italian"},    {"ko", "Korean"},     {"ru", "Russian"},
    {"th", "Thai"},       {"vi", "Vietnamese"}, {"ja", "Japanese"},   {"tr", "Turkish"},
    {"hi", "Hindi"},      {"ms", "Malay"},      {"nl", "Dutch"},      {"sv", "Swedish"},
    {"da", "Danish"},     {"fi", "Finnish"},    {"pl", "Polish"},     {"cs", "Czech"},
    {"fil", "Filipino"},  {"tl", "Filipino"},   {"fa", "Persian"},    {"el", "Greek"},
    {"ro", "Romanian"},   {"hu", "Hungarian"},  {"mk", "Macedonian"},
};

const char *anna_model_audio_language_find(const anna_model *m, const char *lang) {
  if (!anna_model_has_audio(m) || !lang || !*lang) return NULL;
  const char *name = lang;
  for (size_t i = 0; i < sizeof k_lang_codes / sizeof k_lang_codes[0]; i++)
    if (!strcasecmp(lang, k_lang_codes[i][0])) name = k_lang_codes[i][1];
  const struct model_audio *a = m->aud;
  if (a->info.n_languages == 0) { /* the config lists none: any known name, spelled as ours */
    for (size_t i = 0; i < sizeof k_lang_codes / sizeof k_lang_codes[0]; i++)
      if (!strcasecmp(name, k_lang_codes[i][1])) return k_lang_codes[i][1];
    return NULL;
  }
  for (int i = 0; i < a->info.n_languages; i++)
    if (!strcasecmp(name, a->langs[i])) return a->langs[i];
  return NULL;
}

/* ---- media ---- */

void audio_clip_free(audio_clip *a) {
  if (!a) return;
  free(a->feat);
  free(a);
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* Decodes data into *au, refusing clips too short for one STFT frame. */
static int clip_decode(const void *data, size_t n, double max_seconds, media_audio *au, char *err,
                       size_t errlen) {
  if (!data || !n) return anna_err(err, errlen, ANNA_EINVAL, "audio: no data");
  /* <= 0: no limit of ours; the decoder's own ceiling (1e7 s) still bounds the header */
  int rc = media_audio_decode(data, n, max_seconds > 0 ? max_seconds : 1e7, au, err, errlen);
  if (rc) return rc;
  if (au->n <= MEDIA_MEL_N_FFT / 2) {
    const long long got = (long long)au->n;
    media_audio_free(au);
    return anna_err(err, errlen, ANNA_EINVAL,
                    "audio: %lld samples at 16 kHz is too short (at least %d, about 13 ms)", got,
                    MEDIA_MEL_N_FFT / 2 + 1);
  }
  return 0;
}

/* The media of samples x[0..n) (n > MEDIA_MEL_N_FFT / 2) for a's encoder; mel is the caller's
 * (one per thread, reused across pieces). */
static int clip_media(anna_media **out, const struct model_audio *a, media_mel *mel,
                      const float *x, int64_t n, char *err, size_t errlen) {
  int rc = 0;
  audio_clip *clip = calloc(1, sizeof *clip);
  const int64_t L = media_mel_frames(n);
  if (!clip) rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (!rc && !(clip->feat = malloc(sizeof(float) * (size_t)a->info.n_mels * (size_t)L)))
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (!rc) rc = media_mel_compute(mel, x, n, clip->feat, err, errlen);
  const double seconds = (double)n / MEDIA_AUDIO_RATE;
  if (rc) {
    audio_clip_free(clip);
    return rc;
  }
  clip->L = L;
  clip->n_mels = a->info.n_mels;
  clip->n_embd = a->info.n_embd;
  const int64_t N = audio_qwen3_asr_tokens(a->impl, L);
  if (N < 1 || N > INT32_MAX / 2) {
    audio_clip_free(clip);
    return anna_err(err, errlen, ANNA_EINVAL, "audio: %lld frames make %lld encoder rows",
                    (long long)L, (long long)N);
  }
  uint64_t h = fnv1a(1469598103934665603ull, &L, sizeof L);
  h = fnv1a(h, clip->feat, sizeof(float) * (size_t)clip->n_mels * (size_t)L);
  return media_wrap_audio(out, clip, (int32_t)N, seconds, h, err, errlen);
}

int anna_media_audio_decode(anna_media **out, const anna_model *m, const void *data, size_t n,
                            double max_seconds, char *err, size_t errlen) {
  *out = NULL;
  if (!anna_model_has_audio(m)) return no_audio(m, err, errlen);
  media_audio au;
  int rc = clip_decode(data, n, max_seconds, &au, err, errlen);
  if (rc) return rc;
  media_mel *mel = NULL;
  rc = media_mel_create(m->aud->info.n_mels, &mel, err, errlen);
  if (!rc) rc = clip_media(out, m->aud, mel, au.samples, au.n, err, errlen);
  media_mel_free(mel);
  media_audio_free(&au);
  return rc;
}

int anna_media_audio_decode_chunks(anna_media ***out, double **offsets, int32_t *n_out,
                                   const anna_model *m, const void *data, size_t n,
                                   double max_seconds, double chunk_seconds, char *err,
                                   size_t errlen) {
  *out = NULL;
  *n_out = 0;
  if (offsets) *offsets = NULL;
  if (!anna_model_has_audio(m)) return no_audio(m, err, errlen);
  if (!(chunk_seconds <= 1e7))
    return anna_err(err, errlen, ANNA_EINVAL, "audio: chunk length %g s is not in (0, 1e7]",
                    chunk_seconds);
  media_audio au;
  int rc = clip_decode(data, n, max_seconds, &au, err, errlen);
  if (rc) return rc;
  asr_chunk *ck = NULL;
  int32_t k = 0;
  media_mel *mel = NULL;
  anna_media **md = NULL;
  double *off = NULL;
  float *pad = NULL;
  rc = asr_chunk_split(au.samples, au.n, MEDIA_AUDIO_RATE,
                       chunk_seconds > 0 ? chunk_seconds : ASR_CHUNK_MAX_SECONDS, &ck, &k, err,
                       errlen);
  if (!rc && (!(md = calloc((size_t)k, sizeof *md)) || !(off = calloc((size_t)k, sizeof *off))))
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (!rc) rc = media_mel_create(m->aud->info.n_mels, &mel, err, errlen);
  for (int32_t i = 0; !rc && i < k; i++) {
    const float *x = au.samples + ck[i].start;
    if (ck[i].n_padded > ck[i].n) { /* a short piece: zeros after it, as qwen-asr pads */
      free(pad);
      if (!(pad = calloc((size_t)ck[i].n_padded, sizeof *pad))) {
        rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
        break;
      }
      memcpy(pad, x, sizeof *pad * (size_t)ck[i].n);
      x = pad;
    }
    off[i] = (double)ck[i].start / MEDIA_AUDIO_RATE;
    rc = clip_media(&md[i], m->aud, mel, x, ck[i].n_padded, err, errlen);
  }
  free(pad);
  free(ck);
  media_mel_free(mel);
  media_audio_free(&au);
  if (rc) {
    for (int32_t i = 0; md && i < k; i++)
      anna_media_free(md[i]);
    free(md), free(off);
    return rc;
  }
  *out = md;
  *n_out = k;
  if (offsets)
    *offsets = off;
  else
    free(off);
  return 0;
}

/* ---- prompt ---- */

static int ids_append(const anna_text *t, const char *text, int flags, int32_t **ids, size_t *n,
                      size_t *cap, char *err, size_t errlen) {
  int32_t *piece = NULL;
  size_t k = 0;
  int rc = anna_text_tokenize(t, text, strlen(text), flags, &piece, &k, err, errlen);
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

int anna_asr_prompt(const anna_model *m, const anna_text *t, const anna_media *md,
                    const char *context, const char *language, int32_t **ids_out, size_t *n_out,
                    int32_t *audio_at, char *err, size_t errlen) {
  *ids_out = NULL;
  *n_out = 0;
  if (audio_at) *audio_at = -1;
  if (!anna_model_has_audio(m)) return no_audio(m, err, errlen);
  if (!t) return anna_err(err, errlen, ANNA_EINVAL, "asr prompt: no tokenizer");
  if (!anna_media_is_audio(md))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "asr prompt: the media is not audio");
  const int32_t pad = m->aud->info.audio_token_id, N = anna_media_n_tokens(md);
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  /* pieces tokenized one at a time, as qwen-asr's processor splits them: the user's context
   * and language are plain text (their special-token spellings are not parsed) */
  int rc = ids_append(t, "<|im_start|>", 0, &ids, &n, &cap, err, errlen);
  if (!rc) {
    const size_t ln = strlen(context ? context : "") + 16;
    char *sys = malloc(ln);
    if (!sys) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    } else {
      snprintf(sys, ln, "system\n%s", context ? context : "");
      rc = ids_append(t, sys, ANNA_TOKENIZE_NO_PARSE_SPECIAL, &ids, &n, &cap, err, errlen);
      free(sys);
    }
  }
  if (!rc)
    rc = ids_append(t, "<|im_end|>\n<|im_start|>user\n<|audio_start|>", 0, &ids, &n, &cap, err,
                    errlen);
  const size_t at = n;
  if (!rc) rc = ids_append(t, "<|audio_pad|>", 0, &ids, &n, &cap, err, errlen);
  if (!rc && (n != at + 1 || ids[at] != pad))
    rc = anna_err(
        err, errlen, ANNA_EFORMAT,
        "the tokenizer's <|audio_pad|> is not one token of id %d (thinker_config.audio_token_id)",
        pad);
  n = at;
  if (!rc && n + (size_t)N > cap) {
    const size_t nc = n + (size_t)N + 64;
    int32_t *ni = realloc(ids, nc * sizeof *ni);
    if (!ni)
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    else
      ids = ni, cap = nc;
  }
  for (int32_t i = 0; !rc && i < N; i++)
    ids[n++] = pad;
  if (!rc)
    rc = ids_append(t, "<|audio_end|><|im_end|>\n<|im_start|>assistant\n", 0, &ids, &n, &cap, err,
                    errlen);
  if (!rc && language) {
    char forced[256];
    if (strlen(language) > 200)
      rc = anna_err(err, errlen, ANNA_EINVAL, "asr prompt: language name longer than 200 bytes");
    snprintf(forced, sizeof forced, "language %s", language);
    if (!rc)
      rc = ids_append(t, forced, ANNA_TOKENIZE_NO_PARSE_SPECIAL, &ids, &n, &cap, err, errlen);
    if (!rc) rc = ids_append(t, "<asr_text>", 0, &ids, &n, &cap, err, errlen);
  }
  if (rc) {
    free(ids);
    return rc;
  }
  *ids_out = ids;
  *n_out = n;
  if (audio_at) *audio_at = (int32_t)at;
  return 0;
}

int anna_asr_transcript_join(const char *const *raw, int32_t n, int forced, char **text,
                             char **language, char *err, size_t errlen) {
  return asr_chunk_join(raw, n, forced, text, language, err, errlen);
}

size_t anna_asr_output_split(const char *text, size_t len, char *lang, size_t cap) {
  static const char mark[] = "<asr_text>";
  const size_t ml = sizeof mark - 1;
  if (lang && cap) lang[0] = 0;
  for (size_t i = 0; text && i + ml <= len; i++) {
    if (memcmp(text + i, mark, ml)) continue;
    if (lang && cap) {
      size_t s = 0, e = i;
      if (i >= 9 && !memcmp(text, "language ", 9)) s = 9;
      size_t k = e - s < cap - 1 ? e - s : cap - 1;
      memcpy(lang, text + s, k);
      lang[k] = 0;
    }
    return i + ml;
  }
  return 0;
}

/* ---- context ---- */

int ctx_audio_create(ctx_audio **out, const anna_model *m, int n_batch, const ctx_encoder_device *dev, char *err,
                     size_t errlen) {
  *out = NULL;
  if (!m->aud) return 0;
  ctx_audio *a = calloc(1, sizeof *a);
  if (!a) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  a->ma = m->aud;
  a->n_batch = n_batch;
  a->dev = *dev;
  *out = a;
  return 0;
}

static void encoder_close(ctx_audio *a) {
  ctx_encoder_close(a->ma->kind, &a->be, &a->st);
  a->cap = 0;
}

void ctx_audio_free(ctx_audio *a) {
  if (!a) return;
  encoder_close(a);
  free(a);
}

/* The encoder's backend and state for at least `frames` mel frames per run. */
static int encoder_open(ctx_audio *a, int64_t frames, char *err, size_t errlen) {
  if (a->st && a->cap >= frames) return 0;
  encoder_close(a);
  const int64_t cap = (frames + AUDIO_FRAMES_STEP - 1) / AUDIO_FRAMES_STEP * AUDIO_FRAMES_STEP;
  if (cap > INT_MAX)
    return anna_err(err, errlen, ANNA_ERANGE, "audio: %lld frames", (long long)frames);
  const int rc = ctx_encoder_open(a->ma->kind, a->ma->impl, &a->dev, cap, "audio encoder", &a->be, &a->st,
                                  err, errlen);
  if (rc) return rc;
  a->cap = cap;
  return 0;
}

int ctx_audio_prefill(anna_context *c, int seq, const anna_prompt *p, float *logits, char *err,
                      size_t errlen) {
  ctx_audio *a = context_audio(c);
  const struct model_audio *ma = a->ma;
  if (!p || !p->tokens || p->n <= 0)
    return anna_err(err, errlen, ANNA_EINVAL, "prefill: empty prompt");
  if (p->n_media < 0 || (p->n_media > 0 && !p->media))
    return anna_err(err, errlen, ANNA_EINVAL, "prefill: media count %d without media", p->n_media);
  const int32_t len = anna_context_seq_len(c, seq);
  if (len < 0) return anna_err(err, errlen, ANNA_EINVAL, "prefill: sequence %d has no state", seq);
  const int32_t n = p->n, pad = ma->info.audio_token_id;
  const int E = ma->info.n_embd, nb = a->n_batch;
  /* the runs: each exactly its media's pad count, in order, and no pad outside them */
  int64_t rows_n = 0;
  int32_t end = -1;
  for (int32_t r = 0; r < p->n_media; r++) {
    const anna_media *md = p->media[r].media;
    const audio_clip *cl = media_audio_clip(md);
    const int32_t at = p->media[r].at;
    if (!md) return anna_err(err, errlen, ANNA_EINVAL, "prompt media %d: no media", r);
    if (!cl)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "prompt media %d is an image: this model has no vision tower", r);
    if (cl->n_mels != ma->info.n_mels || cl->n_embd != E)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "prompt media %d: prepared for another model's audio encoder", r);
    const int32_t k = anna_media_n_tokens(md);
    if (at < 0 || at > n - k)
      return anna_err(err, errlen, ANNA_EINVAL,
                      "prompt media %d: its %d pad tokens at %d do not fit %d tokens", r, k, at, n);
    if (at <= end)
      return anna_err(err, errlen, ANNA_EINVAL,
                      "prompt media %d at %d: media must come in increasing order, not adjacent to "
                      "the previous run",
                      r, at);
    for (int32_t i = at; i < at + k; i++)
      if (p->tokens[i] != pad)
        return anna_err(
            err, errlen, ANNA_EINVAL,
            "prompt media %d: token %d is %d, not the audio pad %d (the run needs %d pads)", r, i,
            p->tokens[i], pad, k);
    end = at + k;
    rows_n += k;
  }
  {
    int32_t r = 0, i = 0;
    for (; i < n; i++) {
      while (r < p->n_media && p->media[r].at + anna_media_n_tokens(p->media[r].media) <= i)
        r++;
      const int inside = r < p->n_media && i >= p->media[r].at;
      if (p->tokens[i] == pad && !inside)
        return anna_err(err, errlen, ANNA_EINVAL,
                        "prompt token %d is the audio pad %d but no audio covers it", i, pad);
    }
  }
  const int vocab = anna_model_vocab(context_model(c));
  float *rows = malloc(sizeof *rows * ((size_t)rows_n * (size_t)E + 1));
  int32_t *bseq = malloc(sizeof *bseq * (size_t)nb), *bpos = malloc(sizeof *bpos * (size_t)nb);
  int32_t *bidx = malloc(sizeof *bidx * (size_t)nb);
  int8_t *bflag = calloc((size_t)nb, 1);
  uint8_t *isa = calloc((size_t)n, 1);
  float *lg = logits ? logits : malloc(sizeof *lg * (size_t)vocab);
  int rc = 0;
  if (!rows || !bseq || !bpos || !bidx || !bflag || !isa || !lg)
    rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  int64_t row = 0;
  for (int32_t r = 0; !rc && r < p->n_media; r++) {
    const anna_media *md = p->media[r].media;
    const audio_clip *cl = media_audio_clip(md);
    const int32_t k = anna_media_n_tokens(md);
    memset(isa + p->media[r].at, 1, (size_t)k);
    if ((rc = encoder_open(a, cl->L, err, errlen))) break;
    const model_input in = {
        .io = MODEL_IO_AUDIO, .features = cl->feat, .n_frames = cl->L, .n_mels = cl->n_mels};
    int64_t wrote = 0;
    const model_output mo = {
        .io = MODEL_IO_EMBEDDINGS, .embd = rows + row * E, .embd_rows = k, .embd_written = &wrote};
    rc = ma->kind->run(ma->impl, a->st, a->be, &in, &mo, err, errlen);
    if (!rc && wrote != k)
      rc = anna_err(err, errlen, ANNA_EFORMAT, "audio encoder wrote %lld rows, expected %d",
                    (long long)wrote, k);
    row += k;
  }
  row = 0;
  for (int32_t s0 = 0; !rc && s0 < n; s0 += nb) {
    const int32_t cn = n - s0 < nb ? n - s0 : nb;
    int64_t ne = 0;
    for (int32_t i = 0; i < cn; i++) {
      bseq[i] = seq;
      bpos[i] = len + s0 + i;
      bflag[i] = s0 + i == n - 1;
      if (isa[s0 + i]) bidx[ne++] = i;
    }
    const anna_batch b = {cn, p->tokens + s0, bseq, bpos, bflag};
    if (ne) {
      const model_input mm = {.embd = rows + row * E, .embd_idx = bidx, .n_embd = ne};
      rc = context_run_mm(c, &b, &mm, lg, err, errlen);
    } else {
      rc = anna_context_decode(c, &b, lg, err, errlen);
    }
    row += ne;
  }
  if (lg != logits) free(lg);
  free(rows);
  free(bseq);
  free(bpos);
  free(bidx);
  free(bflag);
  free(isa);
  return rc;
}
