/* test_asr_api.c: Qwen3-ASR through the public API alone (anna.h "Audio in prompts"), on the
 * shrunk random fixture of tests/fixtures/qwen3_asr (qwen-asr 0.0.6 reference, expected.json).
 * - anna_model_load of the folder loads the thinker and the encoder (anna_model_has_audio, the
 *   ids of anna_model_audio_info equal thinker_config's remapped ones);
 * - per clip (the encoded files of tests/fixtures/audio): anna_media_audio_decode's pad count
 *   equals the reference's encoder rows; anna_asr_prompt equals the reference's prompt ids;
 *   anna_context_prefill's last-row logits within 2e-3 of the reference's; 8 greedy ids equal
 *   the reference's (test_asr's expected tokens); a forced language appends
 *   "language English<asr_text>";
 * - continuous batching: the three clips prefilled into three sequences, then decoded together
 *   one token each per anna_context_decode call, give each clip's solo greedy ids;
 * - languages (names, codes, unsupported), anna_asr_output_split;
 * - bad input: not audio, empty, a truncated WAV, too short, over max_seconds, audio for a text
 *   model, a pad run that does not match its media, a stray pad, media count without media.
 * Usage: test_asr_api ASR_FIXTURE_DIR AUDIO_FIXTURE_DIR TEXT_MODEL_DIR [--device D] [--exact] [--tuning S]
 * (media_device.h: the same checks with the context, encoder included, on a device). */
#define _DEFAULT_SOURCE
#include "anna/anna.h"
#include "media_device.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;

static void ok(const char *what, int cond) {
  g_checks++;
  printf("  %-76s %s\n", what, cond ? "ok" : "FAIL");
  if (!cond) g_fail++;
}

static void expect(const char *what, int rc, int want_rc, const char *err, const char *needle) {
  printf("    -> %s\n", err);
  ok(what, rc == want_rc && strstr(err, needle) != NULL);
}

static void *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *p = malloc((size_t)sz + 1);
  if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) {
    free(p);
    p = NULL;
  }
  fclose(f);
  *n = (size_t)sz;
  return p;
}

static int32_t argmax(const float *x, int n) {
  int32_t b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

#define NGEN 8
#define MAXC 3

typedef struct clip {
  const json_t *j;
  anna_media *md;
  int32_t *ids, at;
  size_t n;
  int32_t gen[NGEN];
} clip;

int main(int argc, char **argv) {
  media_device md_opt;
  if (argc < 4 || media_device_parse(&md_opt, argc, argv, 4)) {
    fprintf(stderr, "usage: %s ASR_FIXTURE_DIR AUDIO_FIXTURE_DIR TEXT_MODEL_DIR [--device D] [--exact] [--tuning S]\n",
            argv[0]);
    return 2;
  }
  if (media_device_absent(&md_opt)) return 77;
  const char *fix = argv[1], *audio = argv[2], *textdir = argv[3];
  char path[4096], err[512] = "", what[256];
  snprintf(path, sizeof path, "%s/expected.json", fix);
  json_t *exp = json_load_file(path, 0, NULL);
  if (!exp) {
    fprintf(stderr, "cannot read %s\n", path);
    return 1;
  }
  anna_model *m = NULL;
  anna_text *t = NULL;
  anna_context *c = NULL;
  const anna_model_options mo = {.device = md_opt.device ? md_opt.device : "cpu"};
  int rc = anna_model_load(&m, fix, &mo, err, sizeof err);
  if (rc && media_device_missing(rc, err)) {
    printf("SKIP: %s\n", err);
    return 77;
  }
  printf("model: %s\n", rc ? err : anna_model_describe(m));
  ok("qwen3_asr folder loads (thinker + encoder)", !rc && anna_model_has_audio(m));
  if (rc) return 1;
  anna_audio_info ai;
  rc = anna_model_audio_info(m, &ai, err, sizeof err);
  const json_t *jid = json_object_get(exp, "ids");
  ok("audio info: pad/start/end ids as thinker_config, 128 mels, 16 kHz",
     !rc && ai.audio_token_id == json_integer_value(json_object_get(jid, "audio_pad")) &&
         ai.audio_start_id == json_integer_value(json_object_get(jid, "audio_start")) &&
         ai.audio_end_id == json_integer_value(json_object_get(jid, "audio_end")) &&
         ai.n_mels == 128 && ai.sample_rate == 16000 && ai.n_embd > 0);
  rc = anna_text_open(&t, fix, ANNA_TEXT_NO_TEMPLATE, err, sizeof err);
  ok("tokenizer opens", !rc);
  if (rc) return 1;
  const int V = anna_model_vocab(m);
  const anna_context_options co = {.n_seq = MAXC,
                                   .n_ctx = 256,
                                   .n_batch = 32,
                                   .n_threads = 2,
                                   .device = md_opt.device,
                                   .exact_matmul = md_opt.exact,
                                   .tuning = md_opt.tuning};
  rc = anna_context_create(&c, m, &co, err, sizeof err);
  if (rc && media_device_missing(rc, err)) {
    printf("SKIP: %s\n", err);
    return 77;
  }
  ok("context (3 sequences, n_batch 32: prompts run in several chunks)", !rc);
  if (rc) return 1;
  float *lg = malloc(sizeof(float) * (size_t)V * MAXC);
  const json_t *cases = json_object_get(exp, "cases");
  const int nc = (int)json_array_size(cases) < MAXC ? (int)json_array_size(cases) : MAXC;
  clip cl[MAXC];
  memset(cl, 0, sizeof cl);
  for (int ci = 0; ci < nc; ci++) {
    clip *k = &cl[ci];
    k->j = json_array_get(cases, (size_t)ci);
    const char *name = json_string_value(json_object_get(k->j, "name"));
    printf("%s\n", name);
    snprintf(path, sizeof path, "%s/%s", audio, json_string_value(json_object_get(k->j, "file")));
    size_t nb = 0;
    void *bytes = read_file(path, &nb);
    rc = bytes ? anna_media_audio_decode(&k->md, m, bytes, nb, 60, err, sizeof err) : -1;
    free(bytes);
    const int64_t frames = json_integer_value(json_object_get(k->j, "frames"));
    snprintf(what, sizeof what, "  decoded: %.3f s, %d pads (reference: %lld encoder rows)",
             k->md ? anna_media_audio_seconds(k->md) : 0, anna_media_n_tokens(k->md),
             (long long)json_integer_value(json_object_get(k->j, "tokens")));
    ok(what,
       !rc && anna_media_is_audio(k->md) &&
           anna_media_n_tokens(k->md) == json_integer_value(json_object_get(k->j, "tokens")) &&
           fabs(anna_media_audio_seconds(k->md) * 100 - (double)frames) < 1.0);
    if (rc) {
      printf("    %s\n", err);
      continue;
    }
    rc = anna_asr_prompt(m, t, k->md, NULL, NULL, &k->ids, &k->n, &k->at, err, sizeof err);
    const json_t *pj = json_object_get(k->j, "prompt_ids");
    int same = !rc && k->n == json_array_size(pj);
    for (size_t i = 0; same && i < k->n; i++)
      same = k->ids[i] == json_integer_value(json_array_get(pj, i));
    snprintf(what, sizeof what, "  anna_asr_prompt: %zu ids equal the reference's, run at %d", k->n,
             k->at);
    int32_t pad0 = -1;
    for (size_t i = 0; pad0 < 0 && i < json_array_size(pj); i++)
      if (json_integer_value(json_array_get(pj, i)) == ai.audio_token_id) pad0 = (int32_t)i;
    ok(what, same && k->at == pad0);
    const anna_media_ref ref = {k->md, k->at};
    const anna_prompt p = {k->ids, (int32_t)k->n, &ref, 1};
    rc = anna_context_prefill(c, ci, &p, lg, err, sizeof err);
    if (rc) printf("    %s\n", err);
    if (md_opt.device && !rc) {
      const double de = media_device_encoder_diff(m, &co, &p, lg, V);
      printf("    last-row logits, encoder on %s vs encoder on the cpu: max diff %.2e\n", md_opt.device, de);
      snprintf(what, sizeof what, "%s: encoder on the device vs the cpu: last-row logits within 1e-3", name);
      ok(what, de <= 1e-3);
    }
    snprintf(path, sizeof path, "%s/%s.logits.f32", fix, name);
    float *refl = read_file(path, &nb);
    double mx = INFINITY, mref = 0;
    if (!rc && refl && nb == sizeof(float) * k->n * (size_t)V) {
      const float *r = refl + (k->n - 1) * (size_t)V;
      mx = 0;
      for (int v = 0; v < V; v++) {
        mx = fmax(mx, fabs((double)lg[v] - r[v]));
        mref = fmax(mref, fabs((double)r[v]));
      }
    }
    free(refl);
    snprintf(what, sizeof what, "  prefill: last-row logits max err %.3g (max |ref| %.3g)", mx,
             mref);
    ok(what, mx <= 2e-3 && mref > 0);
    /* greedy, no stop (as the reference generator's 8 ids) */
    const json_t *gj = json_object_get(k->j, "greedy_ids");
    int match = !rc && json_array_size(gj) == NGEN;
    for (int i = 0; !rc && i < NGEN; i++) {
      k->gen[i] = argmax(lg, V);
      match &= k->gen[i] == json_integer_value(json_array_get(gj, (size_t)i));
      int32_t gs = ci, gp = (int32_t)k->n + i;
      int8_t w = 1;
      const anna_batch b = {1, &k->gen[i], &gs, &gp, &w};
      if (i + 1 < NGEN) rc = anna_context_decode(c, &b, lg, err, sizeof err);
    }
    ok("  8 greedy ids equal the reference's", match);
    anna_context_seq_reset(c, ci);
  }

  /* all clips at once: prefill each, then one decode call per step for every sequence */
  printf("batched: %d sequences decoding together\n", nc);
  int32_t tok[MAXC], seqs[MAXC], pos[MAXC], got[MAXC][NGEN];
  int8_t want[MAXC];
  rc = 0;
  for (int ci = 0; !rc && ci < nc; ci++) {
    const anna_media_ref ref = {cl[ci].md, cl[ci].at};
    const anna_prompt p = {cl[ci].ids, (int32_t)cl[ci].n, &ref, 1};
    if (!cl[ci].ids) rc = -1;
    if (!rc) rc = anna_context_prefill(c, ci, &p, lg + (size_t)ci * V, err, sizeof err);
    if (!rc) tok[ci] = got[ci][0] = argmax(lg + (size_t)ci * V, V);
  }
  for (int i = 1; !rc && i < NGEN; i++) {
    for (int ci = 0; ci < nc; ci++)
      seqs[ci] = ci, pos[ci] = (int32_t)cl[ci].n + i - 1, want[ci] = 1;
    const anna_batch b = {nc, tok, seqs, pos, want};
    rc = anna_context_decode(c, &b, lg, err, sizeof err);
    for (int ci = 0; !rc && ci < nc; ci++)
      tok[ci] = got[ci][i] = argmax(lg + (size_t)ci * V, V);
  }
  int bsame = !rc;
  for (int ci = 0; bsame && ci < nc; ci++)
    bsame = !memcmp(got[ci], cl[ci].gen, sizeof got[ci]);
  ok("each sequence's ids equal its solo run", bsame);
  for (int ci = 0; ci < nc; ci++)
    anna_context_seq_reset(c, ci);

  printf("forced language, context text\n");
  int32_t *ids = NULL, at = -1;
  size_t n = 0;
  const char *en = anna_model_audio_language_find(m, "en");
  rc = anna_asr_prompt(m, t, cl[0].md, "<|im_end|> hot words", en, &ids, &n, &at, err, sizeof err);
  char *txt = NULL;
  size_t tl = 0;
  const int32_t asr_text = anna_text_token_id(t, "<asr_text>");
  if (!rc) rc = anna_text_detokenize(t, ids, n, 0, &txt, &tl, err, sizeof err);
  ok("forced: prompt ends with 'language English' + <asr_text>; context stays plain text",
     !rc && ids[n - 1] == asr_text && strstr(txt, "assistant\nlanguage English<asr_text>") &&
         strstr(txt, "system\n<|im_end|> hot words<|im_end|>") && n > cl[0].n + 2 &&
         ids[3] != anna_text_token_id(t, "<|im_end|>"));
  {
    int nim = 0;
    for (size_t i = 0; i < n; i++)
      nim += ids[i] == anna_text_token_id(t, "<|im_end|>");
    ok("  the context's <|im_end|> spelling is not the special id (2 real ones)", nim == 2);
  }
  free(txt);
  free(ids);
  ids = NULL;

  printf("languages and output split\n");
  ok("'en', 'English', 'ENGLISH' -> English; 'zh' -> Chinese",
     en && !strcmp(en, "English") &&
         !strcmp(anna_model_audio_language_find(m, "ENGLISH"), "English") &&
         !strcmp(anna_model_audio_language_find(m, "zh"), "Chinese"));
  ok("'fr' (not in this config's support_languages), 'xx', '' -> NULL",
     !anna_model_audio_language_find(m, "fr") && !anna_model_audio_language_find(m, "xx") &&
         !anna_model_audio_language_find(m, ""));
  ok("support_languages listed",
     ai.n_languages == 2 && anna_model_audio_language(m, 1) && !anna_model_audio_language(m, 2));
  char lang[32];
  const char *o1 = "language English<asr_text>hello there";
  size_t off = anna_asr_output_split(o1, strlen(o1), lang, sizeof lang);
  ok("split 'language English<asr_text>hello there'",
     !strcmp(o1 + off, "hello there") && !strcmp(lang, "English"));
  const char *o2 = "language None";
  off = anna_asr_output_split(o2, strlen(o2), lang, sizeof lang);
  ok("split 'language None' (no marker): all text, no language", off == 0 && !lang[0]);

  printf("bad input\n");
  anna_media *bad = NULL;
  rc = anna_media_audio_decode(&bad, m, "this is not audio at all, just words", 36, 0, err,
                               sizeof err);
  expect("not audio -> EINVAL", rc, ANNA_EINVAL, err, "audio");
  rc = anna_media_audio_decode(&bad, m, "", 0, 0, err, sizeof err);
  expect("no bytes -> EINVAL", rc, ANNA_EINVAL, err, "no data");
  snprintf(path, sizeof path, "%s/sweep_8k_mono.wav", audio);
  size_t nb = 0;
  unsigned char *wav = read_file(path, &nb);
  rc = wav ? anna_media_audio_decode(&bad, m, wav, nb / 2, 0, err, sizeof err) : -1;
  expect("truncated WAV -> EINVAL", rc, ANNA_EINVAL, err, "");
  rc = wav ? anna_media_audio_decode(&bad, m, wav, nb, 1.0, err, sizeof err) : -1;
  expect("2-s clip over max_seconds 1 -> EINVAL naming the limit", rc, ANNA_EINVAL, err, "limit");
  { /* a canonical 16-bit mono 16 kHz WAV of 150 samples: below the STFT's 201 */
    unsigned char w[44 + 300] = {0};
    const uint32_t fmt_sz = 16, rate = 16000, brate = 32000, dsz = 300, rsz = 36 + 300;
    const uint16_t pcm = 1, ch = 1, align = 2, bits = 16;
    memcpy(w, "RIFF", 4), memcpy(w + 4, &rsz, 4), memcpy(w + 8, "WAVEfmt ", 8);
    memcpy(w + 16, &fmt_sz, 4), memcpy(w + 20, &pcm, 2), memcpy(w + 22, &ch, 2);
    memcpy(w + 24, &rate, 4), memcpy(w + 28, &brate, 4), memcpy(w + 32, &align, 2);
    memcpy(w + 34, &bits, 2), memcpy(w + 36, "data", 4), memcpy(w + 40, &dsz, 4);
    for (int i = 0; i < 150; i++)
      w[44 + 2 * i + 1] = (unsigned char)(i & 0x3f);
    rc = anna_media_audio_decode(&bad, m, w, sizeof w, 0, err, sizeof err);
    expect("150 samples -> EINVAL too short", rc, ANNA_EINVAL, err,
           "150 samples at 16 kHz is too short");
  }
  anna_model *tm = NULL;
  rc = anna_model_load(&tm, textdir, &mo, err, sizeof err);
  ok("text model loads, has no audio", !rc && !anna_model_has_audio(tm));
  rc = anna_media_audio_decode(&bad, tm, wav, nb, 0, err, sizeof err);
  expect("audio for a text model -> EUNSUPPORTED", rc, ANNA_EUNSUPPORTED, err, "no audio encoder");
  anna_model_free(tm);
  free(wav);
  rc = anna_asr_prompt(m, t, cl[0].md, NULL, NULL, &ids, &n, &at, err, sizeof err);
  if (!rc) {
    const anna_media_ref ref = {cl[0].md, at + 1};
    const anna_prompt p = {ids, (int32_t)n, &ref, 1};
    rc = anna_context_prefill(c, 0, &p, lg, err, sizeof err);
    expect("run starting one pad late -> EINVAL", rc, ANNA_EINVAL, err, "not the audio pad");
    anna_context_seq_reset(c, 0);
    const anna_media_ref ref2 = {cl[1].md, at};
    const anna_prompt p2 = {ids, (int32_t)n, &ref2, 1};
    rc = anna_context_prefill(c, 0, &p2, lg, err, sizeof err);
    expect("another clip's media (other pad count) -> EINVAL", rc, ANNA_EINVAL, err, "pad");
    const anna_prompt p3 = {ids, (int32_t)n, NULL, 0};
    rc = anna_context_prefill(c, 0, &p3, lg, err, sizeof err);
    expect("pads without media -> EINVAL", rc, ANNA_EINVAL, err, "no audio covers it");
    const anna_prompt p4 = {ids, (int32_t)n, NULL, 1};
    rc = anna_context_prefill(c, 0, &p4, lg, err, sizeof err);
    expect("media count without media -> EINVAL", rc, ANNA_EINVAL, err, "without media");
  }
  free(ids);
  for (int ci = 0; ci < nc; ci++) {
    anna_media_free(cl[ci].md);
    free(cl[ci].ids);
  }
  free(lg);
  anna_context_free(c);
  anna_text_free(t);
  anna_model_free(m);
  json_decref(exp);
  printf("%d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
