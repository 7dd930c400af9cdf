/* test_tts.c: the Qwen3-TTS talker + code predictor (model/tts_qwen3.c) against qwen-tts 0.1.1
 * (tests/fixtures/qwen3_tts, tools/mkfix_tts.py):
 * - probe: the folder is kind "qwen3_tts" (tokens -> codes);
 * - per case: the prefill rows' codec_head logits within 2e-3 of the reference (max error
 *   printed), greedy codes (talker and predictor) identical for every reference frame;
 * - sampling: seeded runs repeat, differ across seeds, and stay in range;
 * - bad input: unknown speaker, unknown language, empty text, ids that are not the assistant
 *   wrapping, a text id past the vocabulary, too many frames for the state.
 * - instructions (tools/mkfix_tts_instruct.py): a VoiceDesign and a 1.7B CustomVoice config over
 *   the same weights, prefill logits and greedy codes vs the reference with instruct_ids;
 * Usage: test_tts (the fixture is in this repository, ANNA_SOURCE_DIR). */
#define _POSIX_C_SOURCE 200809L
#include "backends/registry.h"
#include "base/error.h"
#include "base/tuning.h"
#include "model/kind.h"
#include "model/tts_qwen3.h"
#include "model/tts_spk_qwen3.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_checks;
static char g_dir[1024];

static void ok(const char *what, int cond) {
  g_checks++;
  printf("  %-72s %s\n", what, cond ? "ok" : "FAIL");
  if (!cond) g_fail++;
}

static void *fixture(const char *name, size_t *len) {
  char p[1200];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  FILE *f = fopen(p, "rb");
  if (!f) {
    printf("  cannot read %s\n", p);
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *d = malloc(n > 0 ? (size_t)n : 1);
  if (d && fread(d, 1, (size_t)n, f) != (size_t)n) {
    free(d);
    d = NULL;
  }
  fclose(f);
  *len = (size_t)n;
  return d;
}

typedef struct tcase {
  char text[256], speaker[64], language[64];
  int32_t ids[256];
  int n_ids, n_prefill, frames, max_new;
} tcase;

static int read_cases(tcase *c, int max) {
  char p[1200];
  snprintf(p, sizeof p, "%s/cases.json", g_dir);
  json_t *root = json_load_file(p, 0, NULL);
  if (!json_is_array(root)) return -1;
  int n = 0;
  for (size_t i = 0; i < json_array_size(root) && n < max; i++, n++) {
    json_t *o = json_array_get(root, i), *ids = json_object_get(o, "ids");
    snprintf(c[n].text, sizeof c[n].text, "%s", json_string_value(json_object_get(o, "text")));
    snprintf(c[n].speaker, sizeof c[n].speaker, "%s", json_string_value(json_object_get(o, "speaker")));
    snprintf(c[n].language, sizeof c[n].language, "%s", json_string_value(json_object_get(o, "language")));
    c[n].n_ids = (int)json_array_size(ids);
    for (int j = 0; j < c[n].n_ids && j < 256; j++) c[n].ids[j] = (int32_t)json_integer_value(json_array_get(ids, j));
    c[n].n_prefill = (int)json_integer_value(json_object_get(o, "n_prefill"));
    c[n].frames = (int)json_integer_value(json_object_get(o, "frames"));
    c[n].max_new = (int)json_integer_value(json_object_get(o, "max_new_tokens"));
  }
  json_decref(root);
  return n;
}

/* Instruction prompts (tools/mkfix_tts_instruct.py): folder sub (qwen3_tts_design: a VoiceDesign
 * config; qwen3_tts_instruct: a 1.7B CustomVoice config; the qwen3_tts weights), each case's
 * prefill rows (instruction rows first) within 2e-3 of the reference's logits and greedy codes
 * identical; a design folder refuses a speaker. */
static void check_instruct(const char *sub, ops_backend *be) {
  char dir[1200], p[1300], err[512] = "";
  snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", ANNA_SOURCE_DIR, sub);
  printf("%s\n", sub);
  tts_qwen3 *m = NULL;
  tts_qwen3_state *st = NULL;
  int rc = tts_qwen3_load(&m, dir, err, sizeof err);
  if (!rc) rc = tts_qwen3_state_create(&st, m, be, 256, err, sizeof err);
  if (rc) printf("  %s\n", err);
  ok("load", rc == 0);
  snprintf(p, sizeof p, "%s/cases.json", dir);
  json_t *root = rc ? NULL : json_load_file(p, 0, NULL);
  ok("cases.json read", json_array_size(root) >= 2);
  static int32_t codes[256 * TTS_QWEN3_GROUPS], ids[256], ins[256];
  static float logits[256 * 3072];
  const int V = m ? tts_qwen3_vocab(m) : 0;
  for (size_t ci = 0; ci < json_array_size(root); ci++) {
    json_t *o = json_array_get(root, ci), *ji = json_object_get(o, "ids"), *jn = json_object_get(o, "instruct_ids");
    const int n_ids = (int)json_array_size(ji), n_ins = (int)json_array_size(jn);
    for (int j = 0; j < n_ids && j < 256; j++) ids[j] = (int32_t)json_integer_value(json_array_get(ji, (size_t)j));
    for (int j = 0; j < n_ins && j < 256; j++) ins[j] = (int32_t)json_integer_value(json_array_get(jn, (size_t)j));
    const int n_prefill = (int)json_integer_value(json_object_get(o, "n_prefill"));
    const int frames = (int)json_integer_value(json_object_get(o, "frames"));
    const int max_new = (int)json_integer_value(json_object_get(o, "max_new_tokens"));
    printf("case %zu: \"%s\" [%s] speaker '%s' %s\n", ci, json_string_value(json_object_get(o, "instruct")),
           json_string_value(json_object_get(o, "text")), json_string_value(json_object_get(o, "speaker")),
           json_string_value(json_object_get(o, "language")));
    tts_qwen3_request rq = {ids, n_ids, json_string_value(json_object_get(o, "speaker")),
                            json_string_value(json_object_get(o, "language")), max_new - 1, 1, 0, NULL, NULL, ins,
                            n_ins, NULL};
    int nf = -1;
    const int P = tts_qwen3_prefill_len(m, &rq, err, sizeof err);
    ok("prefill rows (instruction rows first) = the reference's", P == n_prefill);
    char name[64];
    size_t len = 0, clen = 0;
    snprintf(name, sizeof name, "../%s/prefill_logits_%zu.f32", sub, ci);
    float *ref = fixture(name, &len);
    snprintf(name, sizeof name, "../%s/codes_%zu.i32", sub, ci);
    int32_t *rc_codes = fixture(name, &clen);
    rc = P == n_prefill && V <= 3072 ? tts_qwen3_generate(m, st, &rq, codes, &nf, logits, err, sizeof err) : -1;
    if (rc) printf("  generate: %s\n", err);
    double worst = INFINITY;
    if (!rc && ref && len == (size_t)P * (size_t)V * sizeof(float)) {
      worst = 0;
      for (int64_t i = 0; i < (int64_t)P * V; i++)
        if (isfinite(ref[i]) && fabs((double)logits[i] - ref[i]) > worst) worst = fabs((double)logits[i] - ref[i]);
    }
    printf("  prefill logits max |err| %.3g\n", worst);
    ok("prefill logits within 2e-3 of qwen-tts", worst <= 2e-3);
    ok("greedy codes identical to qwen-tts",
       !rc && rc_codes && nf == frames && clen == (size_t)frames * TTS_QWEN3_GROUPS * sizeof(int32_t) &&
           !memcmp(codes, rc_codes, clen));
    free(ref), free(rc_codes);
    if (ci == 0 && strstr(sub, "design")) {
      rq.speaker = "ryan";
      rc = tts_qwen3_prefill_len(m, &rq, err, sizeof err);
      printf("  %s\n", err);
      ok("a speaker to a VoiceDesign checkpoint: EINVAL", rc == ANNA_EINVAL && strstr(err, "VoiceDesign"));
    }
  }
  json_decref(root);
  tts_qwen3_state_free(st);
  tts_qwen3_free(m);
}

/* a 16-bit-free float WAV's samples (the fixture's ref.wav: IEEE float, mono): the data chunk */
static float *wav_f32(const char *path, int64_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char h[12], ck[8];
  float *x = NULL;
  if (fread(h, 1, 12, f) == 12 && !memcmp(h, "RIFF", 4) && !memcmp(h + 8, "WAVE", 4)) {
    while (fread(ck, 1, 8, f) == 8) {
      const uint32_t len = ck[4] | ck[5] << 8 | ck[6] << 16 | (uint32_t)ck[7] << 24;
      if (memcmp(ck, "data", 4)) {
        fseek(f, (long)(len + (len & 1)), SEEK_CUR);
        continue;
      }
      *n = len / 4;
      x = malloc(len ? len : 1);
      if (x && fread(x, 4, (size_t)*n, f) != (size_t)*n) free(x), x = NULL;
      break;
    }
  }
  fclose(f);
  return x;
}

/* Voice cloning (tools/mkfix_tts_clone.py, a Base config with a shrunk speaker encoder): the
 * reference clip's log-mel and x-vector vs qwen-tts (within 1e-4 / 1e-3), then the talker with
 * that x-vector in place of a preset speaker: prefill logits within 2e-3, greedy codes identical. */
static void check_clone(ops_backend *be) {
  char dir[1200], p[1300], err[512] = "";
  snprintf(dir, sizeof dir, "%s/tests/fixtures/qwen3_tts_clone", ANNA_SOURCE_DIR);
  printf("qwen3_tts_clone\n");
  tts_spk *enc = NULL;
  tts_qwen3 *m = NULL;
  tts_qwen3_state *st = NULL;
  int rc = tts_spk_load(&enc, dir, err, sizeof err);
  if (!rc) rc = tts_qwen3_load(&m, dir, err, sizeof err);
  if (!rc) rc = tts_qwen3_state_create(&st, m, be, 256, err, sizeof err);
  if (rc) printf("  %s\n", err);
  ok("load the speaker encoder and the Base talker", rc == 0);
  if (rc) {
    g_fail++;
    return;
  }
  snprintf(p, sizeof p, "%s/ref.wav", dir);
  int64_t n = 0, L = 0;
  float *x = wav_f32(p, &n), *mel = NULL, xv[64];
  size_t len = 0;
  float *rmel = fixture("../qwen3_tts_clone/ref.mel.f32", &len), *rx = NULL;
  rc = x ? tts_spk_mel(x, n, &mel, &L, err, sizeof err) : -1;
  double wm = INFINITY, wx = INFINITY;
  if (!rc && rmel && len == (size_t)L * 128 * sizeof(float)) {
    wm = 0;
    for (int64_t i = 0; i < L * 128; i++) wm = fmax(wm, fabs((double)mel[i] - rmel[i]));
  }
  printf("  log-mel: %lld frames, max |err| %.3g\n", (long long)L, wm);
  ok("log-mel within 1e-4 of qwen-tts' mel_spectrogram", wm <= 1e-4);
  const int D = tts_spk_dim(enc);
  rc = x && D <= 64 ? tts_spk_embed(enc, x, n, xv, err, sizeof err) : -1;
  if (rc) printf("  embed: %s\n", err);
  rx = fixture("../qwen3_tts_clone/xvec.f32", &len);
  if (!rc && rx && len == (size_t)D * sizeof(float)) {
    wx = 0;
    for (int i = 0; i < D; i++) wx = fmax(wx, fabs((double)xv[i] - rx[i]));
  }
  printf("  x-vector [%d]: max |err| %.3g (values up to %.3g)\n", D, wx, rx ? fabs((double)rx[0]) : 0.0);
  ok("x-vector within 1e-3 of extract_speaker_embedding", wx <= 1e-3);
  snprintf(p, sizeof p, "%s/cases.json", dir);
  json_t *root = json_load_file(p, 0, NULL);
  static int32_t codes[256 * TTS_QWEN3_GROUPS], ids[256];
  static float logits[256 * 3072];
  const int V = tts_qwen3_vocab(m);
  for (size_t ci = 0; ci < json_array_size(root); ci++) {
    json_t *o = json_array_get(root, ci), *ji = json_object_get(o, "ids");
    const int n_ids = (int)json_array_size(ji);
    for (int j = 0; j < n_ids && j < 256; j++) ids[j] = (int32_t)json_integer_value(json_array_get(ji, (size_t)j));
    const int n_prefill = (int)json_integer_value(json_object_get(o, "n_prefill"));
    const int frames = (int)json_integer_value(json_object_get(o, "frames"));
    const int max_new = (int)json_integer_value(json_object_get(o, "max_new_tokens"));
    printf("case %zu: [%s] %s, cloned voice\n", ci, json_string_value(json_object_get(o, "text")),
           json_string_value(json_object_get(o, "language")));
    tts_qwen3_request rq = {ids,  n_ids, NULL, json_string_value(json_object_get(o, "language")), max_new - 1, 1, 0,
                            NULL, NULL, NULL, 0, xv};
    const int P = tts_qwen3_prefill_len(m, &rq, err, sizeof err);
    ok("prefill rows = the reference's", P == n_prefill);
    char name[64];
    size_t ll = 0, cl = 0;
    snprintf(name, sizeof name, "../qwen3_tts_clone/prefill_logits_%zu.f32", ci);
    float *ref = fixture(name, &ll);
    snprintf(name, sizeof name, "../qwen3_tts_clone/codes_%zu.i32", ci);
    int32_t *rcodes = fixture(name, &cl);
    int nf = -1;
    rc = P == n_prefill && wx <= 1e-3 ? tts_qwen3_generate(m, st, &rq, codes, &nf, logits, err, sizeof err) : -1;
    if (rc) printf("  generate: %s\n", err);
    double w = INFINITY;
    if (!rc && ref && ll == (size_t)P * (size_t)V * sizeof(float)) {
      w = 0;
      for (int64_t i = 0; i < (int64_t)P * V; i++)
        if (isfinite(ref[i])) w = fmax(w, fabs((double)logits[i] - ref[i]));
    }
    printf("  prefill logits max |err| %.3g\n", w);
    ok("prefill logits within 2e-3 of qwen-tts", w <= 2e-3);
    ok("greedy codes identical to qwen-tts", !rc && rcodes && nf == frames &&
                                                  cl == (size_t)frames * TTS_QWEN3_GROUPS * sizeof(int32_t) &&
                                                  !memcmp(codes, rcodes, cl));
    free(ref), free(rcodes);
    if (!ci) {
      rq.speaker_embed = NULL;
      rc = tts_qwen3_prefill_len(m, &rq, err, sizeof err);
      ok("a Base checkpoint without a cloned voice: EINVAL", rc == ANNA_EINVAL && strstr(err, "reference clip"));
    }
  }
  free(mel);
  mel = NULL;
  rc = tts_spk_mel(x, 100, &mel, &L, err, sizeof err);
  ok("a 100-sample reference clip: EINVAL", rc == ANNA_EINVAL && strstr(err, "too short"));
  json_decref(root);
  free(x), free(mel), free(rmel), free(rx);
  tts_qwen3_state_free(st);
  tts_qwen3_free(m);
  tts_spk_free(enc);
}

int main(void) {
  snprintf(g_dir, sizeof g_dir, "%s/tests/fixtures/qwen3_tts", ANNA_SOURCE_DIR);
  char err[512] = "";
  printf("probe\n");
  model_source src;
  const model_kind *k = NULL;
  int rc = model_kind_find(g_dir, &src, &k, err, sizeof err);
  if (rc) printf("  %s\n", err);
  ok("qwen3_tts folder -> kind qwen3_tts, tokens -> codes",
     !rc && k == &tts_qwen3_kind && k->outputs == MODEL_IO_BIT(MODEL_IO_CODES) && model_kind_by_name("qwen3_tts") == k);

  tts_qwen3 *m = NULL;
  if ((rc = tts_qwen3_load(&m, g_dir, err, sizeof err))) {
    printf("load: %s\n", err);
    return 1;
  }
  anna_tuning t;
  static ops_model_shape shape;
  tts_qwen3_backend_shape(m, 256, &shape);
  ops_backend *be = NULL;
  const backend_params bp = {.n_threads = 2, .n_batch = 256, .shape = &shape, .tuning = &t};
  tts_qwen3_state *st = NULL;
  if ((rc = tuning_from_env(&t, NULL, err, sizeof err)) ||
      (rc = backend_registry_find("cpu")->create(&bp, &be, err, sizeof err)) ||
      (rc = tts_qwen3_state_create(&st, m, be, 256, err, sizeof err))) {
    printf("setup: %s\n", err);
    return 1;
  }
  const int V = tts_qwen3_vocab(m);
  static tcase cs[4];
  const int nc = read_cases(cs, 4);
  ok("cases.json read", nc >= 2);
  static int32_t codes[256 * TTS_QWEN3_GROUPS];
  static float logits[256 * 3072];
  for (int ci = 0; ci < nc; ci++) {
    const tcase *c = &cs[ci];
    /* the reference's max_new_tokens c0 draws make max_new - 1 frames (the last c0 gets no
     * predictor pass); fewer frames means it stopped on codec eos, which this must do too */
    printf("case %d: \"%s\" %s %s, %d frames of at most %d\n", ci, c->text, c->speaker, c->language, c->frames,
           c->max_new - 1);
    const tts_qwen3_request rq = {c->ids, c->n_ids, c->speaker, c->language, c->max_new - 1, 1, 0, NULL, NULL, NULL, 0, NULL};
    char name[64];
    size_t len = 0, clen = 0;
    snprintf(name, sizeof name, "prefill_logits_%d.f32", ci);
    float *ref = fixture(name, &len);
    snprintf(name, sizeof name, "codes_%d.i32", ci);
    int32_t *rc_codes = fixture(name, &clen);
    int nf = -1;
    const int P = tts_qwen3_prefill_len(m, &rq, err, sizeof err);
    ok("prefill rows = the reference's", P == c->n_prefill);
    rc = P == c->n_prefill && V <= 3072 ? tts_qwen3_generate(m, st, &rq, codes, &nf, logits, err, sizeof err) : -1;
    if (rc) printf("  generate: %s\n", err);
    ok("generate", rc == 0);
    if (rc || !ref || !rc_codes) {
      g_fail++;
      continue;
    }
    /* the reference stores every prefill row for case 0, the last row otherwise */
    const int64_t nref = (int64_t)(len / sizeof(float));
    const float *mine = logits + (int64_t)P * V - nref;
    double e = 0;
    for (int64_t i = 0; i < nref; i++) {
      double d = fabs((double)mine[i] - ref[i]);
      if (!(d <= e)) e = d;
    }
    char what[128];
    snprintf(what, sizeof what, "prefill logits (%lld rows) max |err| %.2e <= 2e-3", (long long)(nref / V), e);
    ok(what, e <= 2e-3);
    int same = nf == c->frames && clen == (size_t)c->frames * TTS_QWEN3_GROUPS * sizeof(int32_t);
    int first_bad = -1;
    for (int i = 0; same && i < c->frames * TTS_QWEN3_GROUPS; i++)
      if (codes[i] != rc_codes[i]) same = 0, first_bad = i;
    if (!same) printf("  frames %d (ref %d), first mismatch at code %d\n", nf, c->frames, first_bad);
    snprintf(what, sizeof what, "greedy codes identical, %d frames x 16%s", c->frames,
             c->frames < c->max_new - 1 ? " (stopped on codec eos)" : "");
    ok(what, same);
    free(ref);
    free(rc_codes);
  }

  printf("sampling\n");
  {
    const tcase *c = &cs[1];
    static int32_t a[8 * 16], b[8 * 16], d[8 * 16];
    int na = 0, nb = 0, nd = 0;
    tts_qwen3_request rq = {c->ids, c->n_ids, c->speaker, c->language, 8, 0, 7, NULL, NULL, NULL, 0, NULL};
    int r1 = tts_qwen3_generate(m, st, &rq, a, &na, NULL, err, sizeof err);
    int r2 = tts_qwen3_generate(m, st, &rq, b, &nb, NULL, err, sizeof err);
    rq.seed = 8;
    int r3 = tts_qwen3_generate(m, st, &rq, d, &nd, NULL, err, sizeof err);
    ok("seeded sampling runs", !r1 && !r2 && !r3 && na >= 1 && nd >= 1);
    ok("same seed, same codes", na == nb && !memcmp(a, b, sizeof(int32_t) * 16 * (size_t)na));
    ok("another seed, other codes", na != nd || memcmp(a, d, sizeof(int32_t) * 16 * (size_t)na) != 0);
    int inr = 1;
    for (int i = 0; i < na * 16; i++) inr &= a[i] >= 0 && a[i] < (i % 16 ? 256 : 2048);
    ok("sampled codes in range (c0 < 2048, c1..15 < predictor vocab)", inr);
  }

  printf("bad input\n");
  {
    const tcase *c = &cs[0];
    int nf;
    tts_qwen3_request rq = {c->ids, c->n_ids, "nobody", c->language, 4, 1, 0, NULL, NULL, NULL, 0, NULL};
    rc = tts_qwen3_generate(m, st, &rq, codes, &nf, NULL, err, sizeof err);
    printf("  %s\n", err);
    ok("unknown speaker: EINVAL naming it", rc == ANNA_EINVAL && strstr(err, "nobody") && strstr(err, "speaker"));
    rq.speaker = c->speaker, rq.language = "klingon";
    rc = tts_qwen3_generate(m, st, &rq, codes, &nf, NULL, err, sizeof err);
    printf("  %s\n", err);
    ok("unknown language: EINVAL naming it", rc == ANNA_EINVAL && strstr(err, "klingon") && strstr(err, "language"));
    int32_t empty[8];
    memcpy(empty, c->ids, 3 * sizeof(int32_t));
    memcpy(empty + 3, c->ids + c->n_ids - 5, 5 * sizeof(int32_t));
    rq.language = "auto", rq.ids = empty, rq.n_ids = 8;
    rc = tts_qwen3_generate(m, st, &rq, codes, &nf, NULL, err, sizeof err);
    printf("  %s\n", err);
    ok("empty text: EINVAL", rc == ANNA_EINVAL && strstr(err, "empty text"));
    int32_t bad[256];
    memcpy(bad, c->ids, (size_t)c->n_ids * sizeof(int32_t));
    bad[0] = 9;
    rq.ids = bad, rq.n_ids = c->n_ids;
    rc = tts_qwen3_generate(m, st, &rq, codes, &nf, NULL, err, sizeof err);
    printf("  %s\n", err);
    ok("ids without the assistant wrapping: EINVAL", rc == ANNA_EINVAL);
    bad[0] = c->ids[0], bad[4] = 200000;
    rc = tts_qwen3_generate(m, st, &rq, codes, &nf, NULL, err, sizeof err);
    printf("  %s\n", err);
    ok("text id past the vocabulary: EINVAL", rc == ANNA_EINVAL && strstr(err, "200000"));
    rq.ids = c->ids, rq.max_frames = 250;
    rc = tts_qwen3_generate(m, st, &rq, codes, &nf, NULL, err, sizeof err);
    printf("  %s\n", err);
    ok("prefill + frames past the state: ERANGE", rc == ANNA_ERANGE);
    rq.max_frames = 0;
    rc = tts_qwen3_generate(m, st, &rq, codes, &nf, NULL, err, sizeof err);
    ok("max_frames 0: EINVAL", rc == ANNA_EINVAL);
  }

  tts_qwen3_state_free(st);
  tts_qwen3_free(m);
  check_instruct("qwen3_tts_design", be);
  check_instruct("qwen3_tts_instruct", be);
  check_clone(be);
  be->destroy(be);
  printf("%d/%d checks passed\n", g_checks - g_fail, g_checks);
  return g_fail ? 1 : 0;
}
