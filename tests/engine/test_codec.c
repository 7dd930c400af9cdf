/* test_codec.c: the Qwen3-TTS speech-tokenizer decoder kind (model/codec_qwen3_tts.c) against
 * the reference decoder of qwen-tts 0.1.1 (tests/fixtures/qwen3_tts_codec, tools/mkfix_codec.py):
 * - probe: the speech_tokenizer folder, and a qwen3_tts model folder holding one;
 * - one pass (1, 7, 40 frames) within 2e-3 of the reference PCM (max error printed);
 * - streaming: the 40 frames in pieces of 1, 3, 7, 2, ... frames, and through a state whose
 *   internal step is 5 frames, equal the one pass: bit for bit with the scalar CPU kernels
 *   (every op's per-row result independent of the row count), within 1e-3 with the native
 *   ones (the f32 matmul takes the 8x32 tile kernel from 8 rows and the row dots below, two
 *   summation orders; the random fixture weights amplify that to ~3e-4, the same as the
 *   reference's own f32-vs-f64 spread);
 * - the reference's chunked_decode (chunks of 16 with 5 context frames) reproduced with resets;
 * - bad input: code 2048 and -1, 15 codebooks, zero frames, a stream out of range (a refused
 *   run leaves the stream as it was), a missing tensor, a tensor of the wrong shape, a
 *   backend without the conv ops (how CUDA is refused).
 * Usage: test_codec FIXTURES_DIR (unused: the fixture is in this repository, ANNA_SOURCE_DIR). */
#define _POSIX_C_SOURCE 200809L
#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "base/error.h"
#include "base/tuning.h"
#include "model/kind.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NQ 16
#define SPF 1920

static int g_fail, g_checks;
static char g_dir[1024];

static void ok(const char *what, int cond) {
  g_checks++;
  printf("  %-72s %s\n", what, cond ? "ok" : "FAIL");
  if (!cond) g_fail++;
}

static void *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *p = malloc(n > 0 ? (size_t)n : 1);
  if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
    free(p);
    p = NULL;
  }
  fclose(f);
  *len = (size_t)n;
  return p;
}

static int write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(p, 1, n, f);
  return fclose(f) || w != n ? -1 : 0;
}

static void *fixture(const char *name, size_t *len) {
  char p[1200];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  void *d = read_file(p, len);
  if (!d) printf("  cannot read %s\n", p);
  return d;
}

typedef struct codec {
  const model_kind *k;
  void *impl, *st;
  ops_backend *be;
  model_desc d;
} codec;

static int codec_open(codec *c, const char *path, int n_seq, int n_batch, char *err,
                      size_t errlen) {
  memset(c, 0, sizeof *c);
  model_source src;
  anna_tuning t;
  static ops_model_shape shape;
  int rc = tuning_from_env(&t, NULL, err, errlen);
  const model_load_params lp = {.tuning = &t};
  if (!rc) rc = model_kind_find(path, &src, &c->k, err, errlen);
  if (!rc && strcmp(c->k->name, "qwen3_tts_codec"))
    rc = anna_err(err, errlen, ANNA_EINVAL, "%s: kind %s", path, c->k->name);
  if (!rc) rc = c->k->load(&c->impl, &src, &lp, err, errlen);
  if (rc) return rc;
  c->k->describe(c->impl, &c->d);
  c->k->backend_shape(c->impl, 1024, &shape);
  const backend_params bp = {.n_threads = 2, .n_batch = n_batch, .shape = &shape, .tuning = &t};
  rc = backend_registry_find("cpu")->create(&bp, &c->be, err, errlen);
  const model_state_params sp = {.n_seq = n_seq, .n_ctx = 1024, .n_batch = n_batch};
  if (!rc) rc = c->k->state_create(&c->st, c->impl, c->be, &sp, err, errlen);
  return rc;
}

static void codec_close(codec *c) {
  if (c->st) c->k->state_free(c->st);
  if (c->be) c->be->destroy(c->be);
  if (c->impl) c->k->free(c->impl);
}

static int decode(codec *c, int seq, const int32_t *codes, int64_t n, int nq, float *pcm, char *err,
                  size_t errlen) {
  const model_input in = {
      .io = MODEL_IO_CODES, .codes = codes, .n_frames = n, .n_codebooks = nq, .seq = seq};
  const model_output out = {.io = MODEL_IO_PCM, .pcm = pcm};
  return c->k->run(c->impl, c->st, c->be, &in, &out, err, errlen);
}

static double max_diff(const float *a, const float *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (!(d <= m)) m = d; /* NaN wins */
  }
  return m;
}

static void test_probe(void) {
  printf("probe\n");
  char err[512] = "", tmp[] = "/tmp/anna_codec_XXXXXX", p[1200];
  model_source src;
  const model_kind *k = NULL;
  int rc = model_kind_find(g_dir, &src, &k, err, sizeof err);
  if (rc) printf("  %s\n", err);
  ok("speech_tokenizer folder -> qwen3_tts_codec, codes -> pcm",
     !rc && k && !strcmp(k->name, "qwen3_tts_codec") && k->inputs == MODEL_IO_BIT(MODEL_IO_CODES) &&
         k->outputs == MODEL_IO_BIT(MODEL_IO_PCM) && model_kind_by_name("qwen3_tts_codec") == k);
  /* a Qwen3-TTS model folder: config.json model_type qwen3_tts + speech_tokenizer/ */
  if (!mkdtemp(tmp)) return;
  snprintf(p, sizeof p, "%s/config.json", tmp);
  const char *cfg = "{\"model_type\": \"qwen3_tts\", \"tts_model_type\": \"base\"}";
  write_file(p, cfg, strlen(cfg));
  codec c;
  rc = -1;
  snprintf(p, sizeof p, "%s/speech_tokenizer", tmp);
  if (!symlink(g_dir, p)) rc = codec_open(&c, tmp, 1, 8, err, sizeof err);
  if (rc) printf("  %s\n", err);
  ok("qwen3_tts folder with speech_tokenizer/ loads the codec",
     !rc && c.d.samples_per_frame == SPF && c.d.sample_rate == 24000 && c.d.n_layers == 3);
  if (!rc) printf("  %s\n", c.d.text);
  codec_close(&c);
  unlink(p);
  snprintf(p, sizeof p, "%s/config.json", tmp);
  rc = model_kind_find(tmp, &src, &k, err, sizeof err);
  /* (the talker kind, model/tts_qwen3.c, takes a qwen3_tts folder the codec does not) */
  ok("qwen3_tts folder without speech_tokenizer/: not the codec's (the talker's)",
     rc == 0 && k && !strcmp(k->name, "qwen3_tts"));
  unlink(p);
  rmdir(tmp);
}

/* One pass vs the reference; returns our 40-frame output (caller frees) for the streaming test. */
static float *test_one_pass(void) {
  printf("one pass vs qwen-tts\n");
  char err[512] = "";
  codec c;
  int rc = codec_open(&c, g_dir, 1, 64, err, sizeof err);
  if (rc) printf("  %s\n", err);
  ok("load the fixture, CPU state of 64-frame steps", !rc);
  float *keep = NULL;
  static const int lens[] = {1, 7, 40};
  for (int i = 0; !rc && i < 3; i++) {
    char name[64], what[128];
    size_t nc, np;
    snprintf(name, sizeof name, "codes_%d.i32", lens[i]);
    int32_t *codes = fixture(name, &nc);
    snprintf(name, sizeof name, "pcm_%d.f32", lens[i]);
    float *ref = fixture(name, &np);
    float *got = calloc((size_t)lens[i] * SPF, sizeof *got);
    int r = !codes || !ref || nc != (size_t)lens[i] * NQ * 4 || np != (size_t)lens[i] * SPF * 4;
    c.k->seq->reset(c.st, 0);
    if (!r) r = decode(&c, 0, codes, lens[i], NQ, got, err, sizeof err);
    if (r > 0)
      printf("  fixture files missing or of the wrong size\n");
    else if (r)
      printf("  %s\n", err);
    const double md = r ? 1e9 : max_diff(got, ref, (size_t)lens[i] * SPF);
    snprintf(what, sizeof what, "%d frames: max |pcm - reference| = %.3g (<= 2e-3)", lens[i], md);
    ok(what, !r && md <= 2e-3);
    ok("  frames counted on the stream", c.k->seq->seq_len(c.st, 0) == lens[i]);
    if (lens[i] == 40 && !r)
      keep = got;
    else
      free(got);
    free(codes), free(ref);
  }
  codec_close(&c);
  return keep;
}

static void test_streaming(const float *one, double bound, const char *isa) {
  printf("exact streaming (%s kernels)\n", isa);
  char err[512] = "", what[160];
  size_t nc;
  int32_t *codes = fixture("codes_40.i32", &nc);
  float *got = calloc(40 * SPF, sizeof *got);
  codec c;
  int rc = !codes || !one || codec_open(&c, g_dir, 2, 64, err, sizeof err);
  if (rc) printf("  %s\n", err);
  static const int pieces[] = {1, 3, 7, 2, 1, 5, 8, 13};
  int64_t t = 0;
  for (int i = 0; !rc && t < 40; i++) {
    int64_t n = pieces[i % 8] < 40 - t ? pieces[i % 8] : 40 - t;
    /* stream 1 gets the same frames one at a time in between: streams must not interfere */
    rc = decode(&c, 0, codes + t * NQ, n, NQ, got + t * SPF, err, sizeof err);
    float junk[SPF];
    if (!rc) rc = decode(&c, 1, codes + (39 - t) * NQ, 1, NQ, junk, err, sizeof err);
    t += n;
  }
  if (rc && codes && one) printf("  %s\n", err);
  double md = rc ? 1e9 : max_diff(got, one, 40 * SPF);
  snprintf(what, sizeof what, "pieces 1,3,7,2,1,5,8,13 == one pass: max |diff| %.3g (<= %g)%s",
           md, bound, md == 0 ? ", bit-identical" : "");
  ok(what, !rc && md <= bound);
  if (!rc) codec_close(&c);
  /* a state whose internal step is 5 frames decodes 40 frames in one call */
  rc = !codes || !one || codec_open(&c, g_dir, 1, 5, err, sizeof err);
  if (!rc) rc = decode(&c, 0, codes, 40, NQ, got, err, sizeof err);
  if (rc && codes && one) printf("  %s\n", err);
  md = rc ? 1e9 : max_diff(got, one, 40 * SPF);
  snprintf(what, sizeof what, "5-frame internal steps == one pass: max |diff| %.3g (<= %g)%s", md,
           bound, md == 0 ? ", bit-identical" : "");
  ok(what, !rc && md <= bound);
  /* the reference's chunked_decode(chunk 16, context 5): each chunk decoded from a reset stream
   * with its 5 context frames, whose samples are dropped */
  size_t np;
  float *ref = fixture("pcm_40_chunked.f32", &np);
  float *buf = calloc(21 * SPF, sizeof *buf);
  int r = rc || !ref || np != 40 * SPF * 4;
  for (int start = 0; !r && start < 40; start += 16) {
    const int end = start + 16 < 40 ? start + 16 : 40, ctx = start - 5 > 0 ? 5 : start;
    c.k->seq->reset(c.st, 0);
    r = decode(&c, 0, codes + (start - ctx) * NQ, end - start + ctx, NQ, buf, err, sizeof err);
    if (!r)
      memcpy(got + (int64_t)start * SPF, buf + (int64_t)ctx * SPF,
             sizeof(float) * (size_t)(end - start) * SPF);
  }
  md = r ? 1e9 : max_diff(got, ref, 40 * SPF);
  snprintf(what, sizeof what,
           "reference chunked_decode (16 / 5) reproduced: max |diff| %.3g (<= 2e-3)", md);
  ok(what, !r && md <= 2e-3);
  if (!rc) codec_close(&c);
  free(buf), free(ref), free(got), free(codes);
}

static void test_bad_input(void) {
  printf("bad input\n");
  char err[512] = "", what[600];
  codec c;
  int rc = codec_open(&c, g_dir, 1, 8, err, sizeof err);
  if (rc) {
    printf("  %s\n", err);
    ok("open", 0);
    return;
  }
  int32_t codes[3 * NQ] = {0};
  float pcm[3 * SPF];
  rc = decode(&c, 0, codes, 2, NQ, pcm, err, sizeof err);
  ok("two good frames", !rc && c.k->seq->seq_len(c.st, 0) == 2);
  codes[NQ + 5] = 2048;
  rc = decode(&c, 0, codes, 3, NQ, pcm, err, sizeof err);
  snprintf(what, sizeof what, "code 2048: %s", err);
  ok(what, rc == ANNA_ERANGE && strstr(err, "2048") && strstr(err, "codebook 5"));
  ok("  the refused run left the stream as it was", c.k->seq->seq_len(c.st, 0) == 2);
  codes[NQ + 5] = -1;
  rc = decode(&c, 0, codes, 3, NQ, pcm, err, sizeof err);
  snprintf(what, sizeof what, "code -1: %s", err);
  ok(what, rc == ANNA_ERANGE && strstr(err, "-1"));
  codes[NQ + 5] = 0;
  rc = decode(&c, 0, codes, 3, NQ - 1, pcm, err, sizeof err);
  snprintf(what, sizeof what, "15 codebooks: %s", err);
  ok(what, rc == ANNA_EINVAL && strstr(err, "15 codebooks"));
  rc = decode(&c, 0, codes, 0, NQ, pcm, err, sizeof err);
  snprintf(what, sizeof what, "zero frames: %s", err);
  ok(what, rc == ANNA_EINVAL && strstr(err, "0 frames"));
  rc = decode(&c, 1, codes, 1, NQ, pcm, err, sizeof err);
  snprintf(what, sizeof what, "stream 1 of 1: %s", err);
  ok(what, rc == ANNA_ERANGE);
  const model_input in = {.io = MODEL_IO_TOKENS};
  rc = c.k->run(c.impl, c.st, c.be, &in, &(model_output){.io = MODEL_IO_LOGITS}, err, sizeof err);
  ok("tokens -> logits: unsupported", rc == ANNA_EUNSUPPORTED);
  /* a backend without the waveform ops (CUDA today) */
  ops_backend fake = *c.be;
  fake.name = "fake";
  fake.conv1d = NULL;
  void *st2 = NULL;
  const model_state_params sp = {.n_seq = 1, .n_batch = 4};
  rc = c.k->state_create(&st2, c.impl, &fake, &sp, err, sizeof err);
  snprintf(what, sizeof what, "backend without conv1d: %s", err);
  ok(what, rc == ANNA_EUNSUPPORTED && strstr(err, "conv1d") && !st2);
  codec_close(&c);

  /* broken copies of the fixture folder */
  char tmp[] = "/tmp/anna_codec_XXXXXX", p[1200], src_p[1200];
  if (!mkdtemp(tmp)) return;
  size_t n;
  snprintf(src_p, sizeof src_p, "%s/model.safetensors", g_dir);
  char *st = read_file(src_p, &n);
  const char *name = "decoder.pre_conv.conv.bias";
  char *hit = NULL;
  for (size_t i = 0; st && i + strlen(name) < n && i < 1 << 20 && !hit; i++)
    if (!memcmp(st + i, name, strlen(name))) hit = st + i;
  if (hit)
    hit[strlen("decoder.pre_conv.conv.")] = 'x'; /* the same length: the header stays valid */
  snprintf(p, sizeof p, "%s/model.safetensors", tmp);
  if (hit) write_file(p, st, n);
  free(st);
  snprintf(src_p, sizeof src_p, "%s/config.json", g_dir);
  char *cfg = read_file(src_p, &n);
  snprintf(p, sizeof p, "%s/config.json", tmp);
  if (cfg) write_file(p, cfg, n);
  rc = codec_open(&c, tmp, 1, 4, err, sizeof err);
  snprintf(what, sizeof what, "missing tensor: %s", err);
  ok(what, hit && rc == ANNA_ENOTFOUND && strstr(err, "decoder.pre_conv.conv.bias"));
  codec_close(&c);
  /* a config whose latent_dim disagrees with the tensors */
  json_error_t je;
  json_t *j = cfg ? json_loadb(cfg, n, 0, &je) : NULL;
  json_object_set_new(json_object_get(j, "decoder_config"), "latent_dim", json_integer(25));
  if (j) json_dump_file(j, p, 0);
  json_decref(j);
  snprintf(src_p, sizeof src_p, "%s/model.safetensors", g_dir);
  st = read_file(src_p, &n);
  snprintf(p, sizeof p, "%s/model.safetensors", tmp);
  if (st) write_file(p, st, n);
  free(st);
  rc = codec_open(&c, tmp, 1, 4, err, sizeof err);
  snprintf(what, sizeof what, "wrong shape: %s", err);
  ok(what, rc == ANNA_EFORMAT && strstr(err, "shape"));
  codec_close(&c);
  /* no decoder_config */
  snprintf(p, sizeof p, "%s/config.json", tmp);
  const char *bad = "{\"model_type\": \"qwen3_tts_tokenizer_12hz\"}";
  write_file(p, bad, strlen(bad));
  rc = codec_open(&c, tmp, 1, 4, err, sizeof err);
  snprintf(what, sizeof what, "no decoder_config: %s", err);
  ok(what, rc == ANNA_EFORMAT && strstr(err, "decoder_config"));
  codec_close(&c);
  free(cfg);
  unlink(p);
  snprintf(p, sizeof p, "%s/model.safetensors", tmp);
  unlink(p);
  rmdir(tmp);
}

int main(int argc, char **argv) {
  (void)argc, (void)argv;
  snprintf(g_dir, sizeof g_dir, "%s/tests/fixtures/qwen3_tts_codec", ANNA_SOURCE_DIR);
  test_probe();
  float *one = test_one_pass();
  test_streaming(one, 1e-3, cpu_backend_isa());
  free(one);
  cpu_backend_force_isa(0); /* scalar kernels: streaming must then be bit for bit */
  one = test_one_pass();
  test_streaming(one, 0, "scalar");
  free(one);
  cpu_backend_force_isa(2);
  test_bad_input();
  printf("%d passed, %d failed\n", g_checks - g_fail, g_fail);
  return g_fail ? 1 : 0;
}
