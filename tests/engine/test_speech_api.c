/* test_speech_api.c: the speech API (anna.h anna_speech, anna_audio_encoder) on the
 * tests/fixtures/qwen3_tts talker + tests/fixtures/qwen3_tts_codec decoder:
 * - greedy case 0: the frames the API reports are the reference codes (codes_0.i32); its
 *   chunks concatenated are bit-identical to one whole-utterance decode of those codes through
 *   the codec kind (the pre-API anna-speak path), with the default 16-frame chunks;
 * - a sampled 19-frame run chunked 1 + 3 + 3 ...: the chunk sizes follow the schedule, the
 *   first chunk arrives before the talker finished (frames made so far < total), and the
 *   samples stay within 1e-3 of the one-pass decode (the codec's streaming bound with
 *   SIMD kernels, test_codec; measured 1.8e-4);
 * - the WAV file encoder (what anna-speak --out writes) read back with libsndfile holds
 *   exactly the chunks' samples as 16-bit; the streamed "pcm" encoder's bytes equal that
 *   WAV's data; streamed wav/flac/opus/mp3 decode with libsndfile at 24 kHz to the expected
 *   length (flac exact, lossy codecs within their padding);
 * - a chunk callback returning nonzero stops synthesis (stats.stopped, one chunk);
 * - bad input: unknown voice, unknown language, instructions (no tokenizer; a 0.6B CustomVoice), text without a tokenizer,
 *   empty text, aac, an unknown device.
 * Usage: test_speech_api [--device D] [--tuning S] (fixtures from ANNA_SOURCE_DIR). With
 * --device (media_device.h; exit 77 when it is missing here) it runs only the device checks:
 * the talker, code predictor and codec on D against the CPU speech object: greedy codes equal
 * (case 0: the reference codes; a 40-frame greedy run), PCM within 1e-3 of the CPU's, and a
 * seeded sampled run printed (codes equal expected, not required: near-ties may flip). */
#define _POSIX_C_SOURCE 200809L
#include "anna/anna.h"
#include "media_device.h"
#include "backends/registry.h"
#include "base/tuning.h"
#include "model/kind.h"

#include <math.h>
#include <sndfile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_fail, g_checks;

static void ok(const char *what, int cond) {
  g_checks++;
  printf("  %-76s %s\n", what, cond ? "ok" : "FAIL");
  if (!cond) g_fail++;
}

static const int32_t IDS0[] = {151644, 77091, 198, 9707, 1052, 11, 419, 374, 264, 1273, 13, 151645, 198, 151644, 77091, 198};
#define N_IDS0 ((int)(sizeof IDS0 / sizeof IDS0[0]))

typedef struct collect {
  float *pcm;
  int64_t n, cap;
  int64_t chunk[256];
  int n_chunks, frames_at_first;
  int32_t codes[64 * 16];
  int n_frames;
  int stop_after; /* > 0: return 1 after that many chunks */
} collect;

static void on_frame(void *user, const int32_t *codes, int n, int f) {
  collect *c = user;
  if (f < 64 && n == 16) memcpy(c->codes + f * 16, codes, 16 * sizeof *codes);
  c->n_frames = f + 1;
}

static int on_chunk(void *user, const float *pcm, int64_t n) {
  collect *c = user;
  if (c->n + n > c->cap) {
    c->cap = (c->n + n) * 2;
    c->pcm = realloc(c->pcm, (size_t)c->cap * sizeof *c->pcm);
  }
  memcpy(c->pcm + c->n, pcm, (size_t)n * sizeof *pcm);
  c->n += n;
  if (!c->n_chunks) c->frames_at_first = c->n_frames;
  if (c->n_chunks < 256) c->chunk[c->n_chunks] = n;
  c->n_chunks++;
  return c->stop_after > 0 && c->n_chunks >= c->stop_after;
}

/* one-pass decode of codes[nf * 16] through the codec kind, as anna-speak did before the API */
static float *decode_whole(const char *codec_dir, const int32_t *codes, int nf, int64_t *ns) {
  const model_kind *ck = model_kind_by_name("qwen3_tts_codec");
  void *impl = NULL, *st = NULL;
  ops_backend *be = NULL;
  char err[512];
  anna_tuning t;
  tuning_from_env(&t, NULL, err, sizeof err);
  model_source src = {.path = codec_dir};
  snprintf(src.model_type, sizeof src.model_type, "qwen3_tts_tokenizer_12hz");
  const model_load_params lp = {.tuning = &t};
  static ops_model_shape shape;
  model_desc d;
  float *pcm = NULL;
  if (ck->load(&impl, &src, &lp, err, sizeof err)) goto out;
  ck->describe(impl, &d);
  ck->backend_shape(impl, 1024, &shape);
  const backend_params bp = {.n_threads = 2, .n_batch = 16, .shape = &shape, .tuning = &t};
  const model_state_params sp = {.n_seq = 1, .n_ctx = 1024, .n_batch = 16};
  if (backend_registry_find("cpu")->create(&bp, &be, err, sizeof err) || ck->state_create(&st, impl, be, &sp, err, sizeof err))
    goto out;
  *ns = (int64_t)nf * d.samples_per_frame;
  pcm = malloc((size_t)*ns * sizeof *pcm);
  const model_input in = {.io = MODEL_IO_CODES, .codes = codes, .n_frames = nf, .n_codebooks = 16};
  const model_output o = {.io = MODEL_IO_PCM, .pcm = pcm};
  if (ck->run(impl, st, be, &in, &o, err, sizeof err)) free(pcm), pcm = NULL;
out:
  if (!pcm) printf("  codec: %s\n", err);
  if (st) ck->state_free(st);
  if (be) be->destroy(be);
  if (impl) ck->free(impl);
  return pcm;
}

typedef struct bytes {
  unsigned char *b;
  size_t n, cap;
} bytes;

static int put_bytes(void *user, const void *p, size_t n) {
  bytes *b = user;
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2;
    b->b = realloc(b->b, b->cap);
  }
  memcpy(b->b + b->n, p, n);
  b->n += n;
  return 0;
}

/* decodes a file with libsndfile: rate and frames actually read */
static int64_t sf_count(const char *path, int *rate) {
  SF_INFO info = {0};
  SNDFILE *f = sf_open(path, SFM_READ, &info);
  if (!f) {
    printf("  libsndfile: %s: %s\n", path, sf_strerror(NULL));
    return -1;
  }
  *rate = info.samplerate;
  float buf[4096];
  int64_t n = 0;
  sf_count_t k;
  while ((k = sf_readf_float(f, buf, 4096)) > 0) n += k;
  sf_close(f);
  return n;
}

static double pcm_diff(const collect *a, const collect *b) {
  if (a->n != b->n) return INFINITY;
  double d = 0;
  for (int64_t i = 0; i < a->n; i++) d = fmax(d, fabs((double)a->pcm[i] - b->pcm[i]));
  return d;
}

/* --device: the same requests on the CPU and on the device. */
static int device_checks(const char *mdir, const char *cdir, const media_device *md) {
  char err[512];
  anna_speech_options so = {.codec_dir = cdir, .n_threads = 2, .max_frames = 64};
  anna_speech *cpu = NULL, *dev = NULL;
  int rc = anna_speech_load(&cpu, mdir, &so, err, sizeof err);
  if (rc) {
    printf("  cpu load: %s\n", err);
    return 1;
  }
  so.device = md->device, so.tuning = md->tuning;
  rc = anna_speech_load(&dev, mdir, &so, err, sizeof err);
  if (rc) {
    printf("%s: %s\n", media_device_missing(rc, err) ? "SKIP" : "  device load", err);
    anna_speech_free(cpu);
    return media_device_missing(rc, err) ? 77 : 1;
  }
  const anna_speech_request reqs[3] = {
      {.text_ids = IDS0, .n_text_ids = N_IDS0, .voice = "Ryan", .language = "English", .greedy = 1, .max_frames = 11,
       .on_frame = on_frame},
      {.text_ids = IDS0, .n_text_ids = N_IDS0, .voice = "vivian", .greedy = 1, .max_frames = 40, .on_frame = on_frame},
      {.text_ids = IDS0, .n_text_ids = N_IDS0, .voice = "vivian", .seed = 3, .max_frames = 40, .on_frame = on_frame}};
  const char *names[3] = {"greedy case 0", "greedy 40 frames", "sampled seed 3"};
  for (int r = 0; r < 3; r++) {
    /* twice on the device: the second request reuses the kept talker backend */
    collect a = {0}, b = {0}, b2 = {0};
    int rc_a = anna_speech_synthesize(cpu, &reqs[r], on_chunk, &a, NULL, err, sizeof err);
    if (rc_a) printf("  cpu %s: %s\n", names[r], err);
    int rc_b = anna_speech_synthesize(dev, &reqs[r], on_chunk, &b, NULL, err, sizeof err);
    if (rc_b) printf("  device %s: %s\n", names[r], err);
    int rc_c = anna_speech_synthesize(dev, &reqs[r], on_chunk, &b2, NULL, err, sizeof err);
    if (rc_c) printf("  device %s (again): %s\n", names[r], err);
    const int nf = a.n_frames < 64 ? a.n_frames : 64;
    const int same = !rc_a && !rc_b && a.n_frames == b.n_frames && !memcmp(a.codes, b.codes, (size_t)nf * 64);
    const double d = same ? pcm_diff(&a, &b) : INFINITY, d2 = pcm_diff(&b, &b2);
    printf("  %s: cpu %d frames, %s %d frames, codes %s, max |pcm %s - cpu| = %.3g, repeat on %s: %.3g\n", names[r],
           a.n_frames, md->device, b.n_frames, same ? "equal" : "DIFFERENT", md->device, d, md->device, d2);
    char what[160];
    if (r < 2) {
      snprintf(what, sizeof what, "device %s: codes equal the cpu's", names[r]);
      ok(what, same);
      snprintf(what, sizeof what, "device %s: pcm within 1e-3 of the cpu's", names[r]);
      ok(what, d <= 1e-3);
    }
    snprintf(what, sizeof what, "device %s: a second request (kept backend) repeats the first", names[r]);
    ok(what, !rc_c && b2.n_frames == b.n_frames && d2 <= 1e-6);
    if (r == 0) {
      char p[1200];
      snprintf(p, sizeof p, "%s/codes_0.i32", mdir);
      FILE *f = fopen(p, "rb");
      int32_t ref[3 * 16] = {0};
      size_t nref = f ? fread(ref, sizeof *ref, 48, f) : 0;
      if (f) fclose(f);
      ok("device greedy case 0: the reference codes", !rc_b && b.n_frames == 3 && nref == 48 && !memcmp(ref, b.codes, sizeof ref));
    }
    free(a.pcm), free(b.pcm), free(b2.pcm);
  }
  anna_speech_free(dev);
  anna_speech_free(cpu);
  printf("%d/%d checks passed\n", g_checks - g_fail, g_checks);
  return g_fail != 0;
}

int main(int argc, char **argv) {
  char mdir[1024], cdir[1024], err[512];
  snprintf(mdir, sizeof mdir, "%s/tests/fixtures/qwen3_tts", ANNA_SOURCE_DIR);
  snprintf(cdir, sizeof cdir, "%s/tests/fixtures/qwen3_tts_codec", ANNA_SOURCE_DIR);
  media_device md_opt;
  /* ctest's anna_test passes the shared fixtures folder first: not used here */
  const int first = argc > 1 && strncmp(argv[1], "--", 2) ? 2 : 1;
  if (media_device_parse(&md_opt, argc, argv, first)) return 2;
  if (media_device_absent(&md_opt)) return 77;
  if (md_opt.device) return device_checks(mdir, cdir, &md_opt);
  printf("test_speech_api (%s)\n", mdir);
  ok("probe: the talker folder is a speech model", anna_speech_probe(mdir) == 1);
  ok("probe: the codec folder is not", anna_speech_probe(cdir) == 0);
  anna_speech *s = NULL;
  anna_speech_options so = {.codec_dir = cdir, .n_threads = 2, .max_frames = 64};
  int rc = anna_speech_load(&s, mdir, &so, err, sizeof err);
  if (rc) printf("  load: %s\n", err);
  ok("load", rc == 0);
  if (rc) return 1;
  ok("24 kHz, 1920 samples per frame", anna_speech_sample_rate(s) == 24000 && anna_speech_frame_samples(s) == 1920);
  ok("voices: vivian, ryan, eric", anna_speech_voice(s, 0) && anna_speech_voice(s, 2) && !anna_speech_voice(s, 3));

  /* greedy case 0: reference codes, bit-identical to the one-pass decode */
  collect c = {0};
  anna_speech_stats st;
  anna_speech_request rq = {.text_ids = IDS0, .n_text_ids = N_IDS0, .voice = "Ryan", .language = "English", .greedy = 1,
                            .max_frames = 11, .on_frame = on_frame};
  rc = anna_speech_synthesize(s, &rq, on_chunk, &c, &st, err, sizeof err);
  if (rc) printf("  synthesize: %s\n", err);
  char p[1200];
  snprintf(p, sizeof p, "%s/codes_0.i32", mdir);
  FILE *f = fopen(p, "rb");
  int32_t ref[3 * 16] = {0};
  size_t nref = f ? fread(ref, sizeof *ref, 48, f) : 0;
  if (f) fclose(f);
  ok("case 0: 3 frames, the reference codes", rc == 0 && c.n_frames == 3 && nref == 48 && !memcmp(ref, c.codes, sizeof ref));
  ok("case 0: one chunk of 3 * 1920 samples, stats agree",
     c.n_chunks == 1 && c.n == 3 * 1920 && st.n_samples == c.n && st.n_frames == 3 && st.n_text_tokens == N_IDS0);
  int64_t ns = 0;
  float *whole = decode_whole(cdir, c.codes, c.n_frames, &ns);
  ok("case 0: chunks == one-pass decode, bit for bit", whole && ns == c.n && !memcmp(whole, c.pcm, (size_t)ns * 4));
  free(whole);

  /* a longer sampled run, default chunks (16): bit-identical; then 1 + 3 + 3 ...: close */
  collect a = {0}, b = {0};
  anna_speech_request rs = {.text_ids = IDS0, .n_text_ids = N_IDS0, .voice = "vivian", .seed = 3, .max_frames = 40,
                            .on_frame = on_frame};
  rc = anna_speech_synthesize(s, &rs, on_chunk, &a, NULL, err, sizeof err);
  ok("sampled run: more than one 16-frame chunk", rc == 0 && a.n_frames > 16 && a.n_chunks == (a.n_frames + 15) / 16);
  whole = decode_whole(cdir, a.codes, a.n_frames, &ns);
  ok("sampled run, 16-frame chunks == one-pass decode, bit for bit", whole && ns == a.n && !memcmp(whole, a.pcm, (size_t)ns * 4));
  rs.first_chunk_frames = 1, rs.chunk_frames = 3;
  rc = anna_speech_synthesize(s, &rs, on_chunk, &b, NULL, err, sizeof err);
  int sched = rc == 0 && b.n_frames == a.n_frames && b.chunk[0] == 1920 && b.n_chunks == 1 + (b.n_frames - 1 + 2) / 3;
  for (int i = 1; sched && i < b.n_chunks - 1; i++) sched = b.chunk[i] == 3 * 1920;
  ok("chunks 1 + 3 + 3 ...: the schedule, same codes", sched && !memcmp(a.codes, b.codes, (size_t)a.n_frames * 64));
  ok("first chunk before the talker finished (1 of the frames made)", b.frames_at_first == 1 && b.n_frames > 1);
  double md = 0;
  for (int64_t i = 0; whole && i < ns && b.n == ns; i++) md = fmax(md, fabs((double)whole[i] - b.pcm[i]));
  printf("  max |chunked 1+3 - one-pass| = %.3g\n", md);
  ok("chunks 1 + 3 + 3 ...: within 1e-3 of the one-pass decode (test_codec's bound)", whole && b.n == ns && md <= 1e-3);
  free(whole);

  /* encoders: WAV file (anna-speak --out) == chunks as 16-bit; streamed pcm == WAV data */
  char wav[256];
  snprintf(wav, sizeof wav, "test_speech_api_%d.wav", (int)getpid());
  anna_audio_encoder *e = NULL;
  rc = anna_audio_encoder_file(&e, "wav", 24000, wav, err, sizeof err);
  for (int i = 0, off = 0; !rc && i < a.n_chunks; off += (int)a.chunk[i], i++)
    rc = anna_audio_encoder_write(e, a.pcm + off, a.chunk[i], err, sizeof err);
  if (!rc) rc = anna_audio_encoder_finish(e, err, sizeof err);
  anna_audio_encoder_free(e);
  SF_INFO info = {0};
  SNDFILE *sf = rc ? NULL : sf_open(wav, SFM_READ, &info);
  short *s16 = malloc((size_t)a.n * sizeof *s16);
  int same = sf && info.frames == a.n && info.samplerate == 24000 && sf_readf_short(sf, s16, a.n) == a.n;
  for (int64_t i = 0; same && i < a.n; i++) same = s16[i] == (short)lrintf(a.pcm[i] * 32767.0f);
  if (sf) sf_close(sf);
  ok("WAV file: libsndfile reads back exactly the chunks' samples (16-bit)", same);
  bytes pb = {0};
  rc = anna_audio_encoder_stream(&e, "pcm", 24000, put_bytes, &pb, err, sizeof err);
  if (!rc) rc = anna_audio_encoder_write(e, a.pcm, a.n, err, sizeof err);
  if (!rc) rc = anna_audio_encoder_finish(e, err, sizeof err);
  anna_audio_encoder_free(e);
  int pcm_same = !rc && pb.n == (size_t)a.n * 2;
  for (int64_t i = 0; pcm_same && i < a.n; i++) pcm_same = (short)(pb.b[2 * i] | pb.b[2 * i + 1] << 8) == s16[i];
  ok("streamed pcm == the WAV's samples, little endian", pcm_same);
  free(pb.b);
  free(s16);
  remove(wav);
  const char *fmts[] = {"wav", "flac", "opus", "mp3"};
  for (int k = 0; k < 4; k++) {
    bytes eb = {0};
    rc = anna_audio_encoder_stream(&e, fmts[k], 24000, put_bytes, &eb, err, sizeof err);
    for (int i = 0, off = 0; !rc && i < b.n_chunks; off += (int)b.chunk[i], i++)
      rc = anna_audio_encoder_write(e, b.pcm + off, b.chunk[i], err, sizeof err);
    if (!rc) rc = anna_audio_encoder_finish(e, err, sizeof err);
    anna_audio_encoder_free(e);
    if (rc) printf("  %s: %s\n", fmts[k], err);
    char path[256];
    snprintf(path, sizeof path, "test_speech_api_%d.%s", (int)getpid(), fmts[k]);
    FILE *o = fopen(path, "wb");
    if (o) fwrite(eb.b, 1, eb.n, o), fclose(o);
    int rate = 0;
    const int64_t got = rc ? -1 : sf_count(path, &rate);
    /* lossy codecs add encoder delay / frame padding: within 0.1 s */
    const int64_t tol = k < 2 ? 0 : 2400;
    char what[128];
    snprintf(what, sizeof what, "streamed %s: libsndfile decodes %lld of %lld samples at 24 kHz", fmts[k], (long long)got,
             (long long)b.n);
    ok(what, rate == 24000 && got >= b.n - tol && got <= b.n + tol);
    remove(path);
    free(eb.b);
  }

  /* speed (libavfilter atempo): about n / speed samples, counted in the stats as delivered */
  {
    collect f1 = {0}, f2 = {0};
    anna_speech_request r1 = rs;
    r1.first_chunk_frames = 0, r1.chunk_frames = 0;
    int r = anna_speech_synthesize(s, &r1, on_chunk, &f1, NULL, err, sizeof err);
    r1.speed = 2.0;
    if (!r) r = anna_speech_synthesize(s, &r1, on_chunk, &f2, &st, err, sizeof err);
    if (r) printf("  speed: %s\n", err);
    printf("  speed 2: %lld of %lld samples\n", (long long)f2.n, (long long)f1.n);
    ok("speed 2: about half the samples (5%), stats count them",
       !r && f1.n > 0 && llabs(2 * f2.n - f1.n) <= f1.n / 20 && st.n_samples == f2.n);
    r1.speed = 4.5;
    r = anna_speech_synthesize(s, &r1, on_chunk, &f2, NULL, err, sizeof err);
    ok("speed 4.5: ANNA_EINVAL naming [0.25, 4]", r == ANNA_EINVAL && strstr(err, "[0.25, 4]"));
    free(f1.pcm), free(f2.pcm);
  }

  /* stop from the callback */
  collect d = {.stop_after = 1};
  rs.first_chunk_frames = 2, rs.chunk_frames = 2;
  rc = anna_speech_synthesize(s, &rs, on_chunk, &d, &st, err, sizeof err);
  ok("callback stop: returns 0, stopped, one chunk, 2 frames made", rc == 0 && st.stopped && d.n_chunks == 1 && st.n_frames == 2);

  /* bad input */
  collect z = {0};
  anna_speech_request bad = rq;
  bad.voice = "alloy";
  rc = anna_speech_synthesize(s, &bad, on_chunk, &z, NULL, err, sizeof err);
  ok("unknown voice: ANNA_EINVAL naming it", rc == ANNA_EINVAL && strstr(err, "alloy") && !z.n_chunks);
  bad = rq, bad.language = "klingon";
  rc = anna_speech_synthesize(s, &bad, on_chunk, &z, NULL, err, sizeof err);
  ok("unknown language: ANNA_EINVAL naming it", rc == ANNA_EINVAL && strstr(err, "klingon"));
  bad = rq, bad.instructions = "whisper";
  rc = anna_speech_synthesize(s, &bad, on_chunk, &z, NULL, err, sizeof err);
  ok("instructions without a tokenizer.json: ANNA_ENOTFOUND", rc == ANNA_ENOTFOUND && strstr(err, "instruction"));
  static const int32_t ins_ids[] = {151644, 872, 198, 1234, 151645, 198};
  bad = rq, bad.instruct_ids = ins_ids, bad.n_instruct_ids = 6;
  rc = anna_speech_synthesize(s, &bad, on_chunk, &z, NULL, err, sizeof err);
  ok("instructions to a 0.6B CustomVoice: ANNA_EINVAL", rc == ANNA_EINVAL && strstr(err, "0.6B CustomVoice"));
  bad = rq, bad.text_ids = NULL, bad.text = "hello";
  rc = anna_speech_synthesize(s, &bad, on_chunk, &z, NULL, err, sizeof err);
  ok("text without a tokenizer.json: ANNA_ENOTFOUND", rc == ANNA_ENOTFOUND && strstr(err, "tokenizer"));
  bad.text = "";
  rc = anna_speech_synthesize(s, &bad, on_chunk, &z, NULL, err, sizeof err);
  ok("empty text: ANNA_EINVAL", rc == ANNA_EINVAL && !z.n_chunks);
  ok("aac: ANNA_EUNSUPPORTED", anna_audio_format_check("aac", err, sizeof err) == ANNA_EUNSUPPORTED);
  anna_speech *s2 = NULL;
  anna_speech_options tpu = so;
  tpu.device = "tpu";
  ok("device tpu: ANNA_EUNSUPPORTED", anna_speech_load(&s2, mdir, &tpu, err, sizeof err) == ANNA_EUNSUPPORTED && !s2);
  anna_speech_free(s);
  free(c.pcm), free(a.pcm), free(b.pcm), free(d.pcm), free(z.pcm);
  printf("%d/%d checks passed\n", g_checks - g_fail, g_checks);
  return g_fail != 0;
}
