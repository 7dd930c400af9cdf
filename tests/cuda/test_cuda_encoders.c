/* test_cuda_encoders.c: the encoder kinds end to end on the CUDA backend (the encoder and
 * waveform decoder ops of cuda_encoder.cu, with the backend's matmuls), against the fixtures'
 * reference outputs and the CPU backend's:
 * - the Qwen3.5 vision tower (model/vision_qwen35.c) on every case of tests/fixtures/qwen3_5_vision
 *   (images of several grids, two images, a 4-frame video) and all cases in one call;
 * - the Qwen3-ASR audio encoder (model/audio_qwen3_asr.c) on every clip of tests/fixtures/qwen3_asr;
 * - the Qwen3-TTS codec decoder (model/codec_qwen3_tts.c) on 1, 7 and 40 frames of
 *   tests/fixtures/qwen3_tts_codec in one pass, and the 40 frames streamed in pieces.
 * Each runs twice on the device: exact (f32 matmuls, --exact) held to the CPU tests' bounds
 * (within 2e-3 absolute of the reference, and 1e-4 of its largest value for the two encoders,
 * whose rows are small), and with the default matmuls (the vision fixture's bf16 weights take
 * the split bf16 tensor-core GEMM) within 2e-3 absolute. The CUDA-vs-CPU distance is printed
 * and held to 2e-3. Exits 77 (skipped) without a CUDA device.
 * Usage: test_cuda_encoders SHARED_FIXTURES_DIR SOURCE_DIR */
#define _DEFAULT_SOURCE
#include "backends/registry.h"
#include "base/error.h"
#include "base/tuning.h"
#include "model/kind.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_fail, g_checks;

static void ok(const char *what, int cond) {
  g_checks++;
  printf("  %-86s %s\n", what, cond ? "ok" : "FAIL");
  if (!cond) g_fail++;
}

static void *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  *n = 0;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *p = malloc((size_t)(sz > 0 ? sz : 1));
  if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) {
    free(p);
    p = NULL;
  }
  fclose(f);
  *n = (size_t)sz;
  return p;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* max |a - b| (NaN: inf) and max |b|. */
static double max_diff(const float *a, const float *b, int64_t n, double *mref) {
  double mx = 0, mr = 0;
  for (int64_t i = 0; i < n; i++) {
    const double d = fabs((double)a[i] - b[i]);
    if (!(d <= mx)) mx = d;
    mr = fmax(mr, fabs((double)b[i]));
  }
  if (mref) *mref = mr;
  return isnan(mx) ? INFINITY : mx;
}

/* ---- a model kind on one backend ---- */

typedef struct rig {
  const model_kind *k;
  void *impl, *st;
  ops_backend *be;
  model_desc desc;
  const char *dev;
} rig;

enum { DEV_CPU, DEV_CUDA_EXACT, DEV_CUDA };
static const char *dev_name[] = {"cpu", "cuda --exact", "cuda"};

/* Loads `kind` from dir (model_type names the folder's kind; NULL: probed) on device dev with
 * a one-sequence (n_seq) state of n_batch rows. */
static int rig_open(rig *r, const char *kind, const char *dir, const char *model_type, int dev, int n_seq,
                    int n_batch, int n_ctx, char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  r->dev = dev_name[dev];
  model_source src;
  memset(&src, 0, sizeof src);
  src.path = dir;
  int rc = 0;
  if (model_type) {
    snprintf(src.model_type, sizeof src.model_type, "%s", model_type);
  } else {
    const model_kind *k = NULL;
    rc = model_kind_find(dir, &src, &k, err, errlen);
    if (!rc && strcmp(k->name, kind)) rc = anna_err(err, errlen, ANNA_EINVAL, "%s: kind %s, not %s", dir, k->name, kind);
    if (rc) return rc;
  }
  r->k = model_kind_by_name(kind);
  if (!r->k) return anna_err(err, errlen, ANNA_ENOTFOUND, "no %s kind", kind);
  anna_tuning t;
  tuning_defaults(&t);
  const model_load_params lp = {.tuning = &t};
  rc = r->k->load(&r->impl, &src, &lp, err, errlen);
  if (rc) return rc;
  r->k->describe(r->impl, &r->desc);
  ops_model_shape *shape = calloc(1, sizeof *shape);
  r->k->backend_shape(r->impl, n_ctx, shape);
  const backend_params bp = {
      .n_threads = 2, .n_batch = n_batch, .exact_matmul = dev == DEV_CUDA_EXACT, .shape = shape, .tuning = &t};
  rc = backend_registry_find(dev == DEV_CPU ? "cpu" : "cuda")->create(&bp, &r->be, err, errlen);
  free(shape);
  if (rc) return rc;
  const model_state_params sp = {.n_seq = n_seq, .n_ctx = n_ctx, .n_batch = n_batch};
  return r->k->state_create(&r->st, r->impl, r->be, &sp, err, errlen);
}

static void rig_close(rig *r) {
  if (r->st) r->k->state_free(r->st);
  if (r->be) r->be->destroy(r->be);
  if (r->impl) r->k->free(r->impl);
  memset(r, 0, sizeof *r);
}

/* One check of a device run: against the reference (abs bound; rel bound when > 0) and against
 * the CPU's output (2e-3), with the error printed. */
static void check(const char *what, const rig *r, int rc, const char *err, const float *got, const float *ref,
                  const float *cpu, int64_t n, double abs_tol, double rel_tol) {
  char line[512];
  if (rc) {
    snprintf(line, sizeof line, "%s on %s: %s", what, r->dev, err);
    ok(line, 0);
    return;
  }
  double mref, mx = max_diff(got, ref, n, &mref), mc = cpu ? max_diff(got, cpu, n, NULL) : 0;
  snprintf(line, sizeof line, "%s on %s: max err %.3g (rel %.3g), vs cpu %.3g", what, r->dev, mx,
           mref > 0 ? mx / mref : mx, mc);
  ok(line, mx <= abs_tol && (rel_tol <= 0 || mx <= rel_tol * mref) && mc <= 2e-3);
}

/* ---- vision tower ---- */

#define MAX_PATCHES 512

typedef struct vcase {
  char name[32];
  int n_grids;
  int32_t grid[3 * 8];
  int64_t n_patches, rows;
  int patch_dim, out_hidden;
  float *pix, *ref;
} vcase;

static int vcase_load(const char *dir, const json_t *c, vcase *v) {
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s", json_string_value(json_object_get(c, "name")));
  const json_t *g = json_object_get(c, "grid_thw");
  v->n_grids = (int)json_array_size(g);
  if (v->n_grids < 1 || v->n_grids > 8) return -1;
  for (int i = 0; i < v->n_grids; i++)
    for (int j = 0; j < 3; j++) v->grid[3 * i + j] = (int32_t)json_integer_value(json_array_get(json_array_get(g, i), j));
  v->n_patches = json_integer_value(json_object_get(c, "n_patches"));
  v->patch_dim = (int)json_integer_value(json_object_get(c, "patch_dim"));
  v->rows = json_integer_value(json_object_get(c, "tower_rows"));
  v->out_hidden = (int)json_integer_value(json_object_get(c, "out_hidden"));
  char path[1500];
  size_t n;
  snprintf(path, sizeof path, "%s/%s.pix.u8", dir, v->name);
  unsigned char *u8 = read_file(path, &n);
  if (!u8 || n != (size_t)(v->n_patches * v->patch_dim)) {
    printf("  cannot read %s\n", path);
    free(u8);
    return -1;
  }
  v->pix = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) v->pix[i] = ((float)u8[i] / 255.0f - 0.5f) / 0.5f; /* the processor's normalisation */
  free(u8);
  snprintf(path, sizeof path, "%s/%s.tower.f32", dir, v->name);
  v->ref = read_file(path, &n);
  if (!v->ref || n != (size_t)(v->rows * v->out_hidden) * sizeof(float)) {
    printf("  cannot read %s\n", path);
    return -1;
  }
  return 0;
}

static int vision_run(rig *r, const float *pix, int64_t n_patches, int patch_dim, const int32_t *grid, int n_grids,
                      float *out, int64_t out_rows, char *err, size_t errlen) {
  int64_t written = -1;
  const model_input in = {.io = MODEL_IO_PIXELS, .pixels = pix, .n_patches = n_patches, .patch_dim = patch_dim,
                          .n_grids = n_grids, .grid_thw = grid};
  const model_output o = {.io = MODEL_IO_EMBEDDINGS, .embd = out, .embd_rows = out_rows, .embd_written = &written};
  int rc = r->k->run(r->impl, r->st, r->be, &in, &o, err, errlen);
  if (!rc && written != out_rows)
    rc = anna_err(err, errlen, ANNA_EINVAL, "%lld rows written, %lld expected", (long long)written, (long long)out_rows);
  return rc;
}

static void test_vision(const char *shared, const char *src_dir) {
  printf("vision tower (qwen3_5_vision)\n");
  char path[1400], err[512] = "";
  snprintf(path, sizeof path, "%s/tests/fixtures/qwen3_5_vision", src_dir);
  char epath[1500];
  snprintf(epath, sizeof epath, "%s/expected.json", path);
  json_t *root = json_load_file(epath, 0, NULL);
  const json_t *cases = json_object_get(root, "cases");
  const int n = (int)json_array_size(cases);
  vcase *cs = calloc((size_t)n + 1, sizeof *cs);
  int bad = n < 1;
  for (int i = 0; i < n && !bad; i++) bad |= vcase_load(path, json_array_get(cases, (size_t)i), &cs[i]);
  ok("fixture read (expected.json, pixels, tower rows)", !bad);
  char mdir[1400];
  snprintf(mdir, sizeof mdir, "%s/qwen3_5", shared);
  rig cpu;
  int rc = bad ? -1 : rig_open(&cpu, "qwen3_5_vision", mdir, "qwen3_5", DEV_CPU, 1, MAX_PATCHES, 0, err, sizeof err);
  if (rc) printf("  cpu: %s\n", err);
  ok("cpu rig", !rc);
  if (rc) goto done;
  /* every case and all cases in one call, on the cpu first */
  int64_t tot_p = 0, tot_r = 0;
  int tot_g = 0;
  float **cref = calloc((size_t)n + 1, sizeof *cref);
  for (int c = 0; c < n; c++) {
    cref[c] = malloc(sizeof(float) * (size_t)(cs[c].rows * cs[c].out_hidden));
    if (vision_run(&cpu, cs[c].pix, cs[c].n_patches, cs[c].patch_dim, cs[c].grid, cs[c].n_grids, cref[c], cs[c].rows,
                   err, sizeof err))
      printf("  cpu %s: %s\n", cs[c].name, err);
    tot_p += cs[c].n_patches, tot_r += cs[c].rows, tot_g += cs[c].n_grids;
  }
  const int D = cs[0].patch_dim, O = cs[0].out_hidden;
  float *pix = malloc(sizeof(float) * (size_t)(tot_p * D)), *ref = malloc(sizeof(float) * (size_t)(tot_r * O));
  float *cpu_all = malloc(sizeof(float) * (size_t)(tot_r * O)), *out = malloc(sizeof(float) * (size_t)(tot_r * O));
  int32_t *grid = malloc(sizeof(int32_t) * 3 * (size_t)tot_g);
  {
    int64_t po = 0, ro = 0;
    int go = 0;
    for (int c = 0; c < n; c++) {
      memcpy(pix + po * D, cs[c].pix, sizeof(float) * (size_t)(cs[c].n_patches * D));
      memcpy(ref + ro * O, cs[c].ref, sizeof(float) * (size_t)(cs[c].rows * O));
      memcpy(grid + 3 * go, cs[c].grid, sizeof(int32_t) * 3 * (size_t)cs[c].n_grids);
      po += cs[c].n_patches, ro += cs[c].rows, go += cs[c].n_grids;
    }
  }
  if (vision_run(&cpu, pix, tot_p, D, grid, tot_g, cpu_all, tot_r, err, sizeof err)) printf("  cpu all: %s\n", err);
  for (int dev = DEV_CUDA_EXACT; dev <= DEV_CUDA; dev++) {
    rig g;
    rc = rig_open(&g, "qwen3_5_vision", mdir, "qwen3_5", dev, 1, MAX_PATCHES, 0, err, sizeof err);
    if (rc) printf("  %s: %s\n", dev_name[dev], err);
    ok(dev == DEV_CUDA ? "cuda rig (default matmuls)" : "cuda rig (exact matmuls)", !rc);
    if (rc) {
      rig_close(&g);
      continue;
    }
    const double rel = dev == DEV_CUDA_EXACT ? 1e-4 : 0;
    for (int c = 0; c < n; c++) {
      rc = vision_run(&g, cs[c].pix, cs[c].n_patches, cs[c].patch_dim, cs[c].grid, cs[c].n_grids, out, cs[c].rows, err,
                      sizeof err);
      check(cs[c].name, &g, rc, err, out, cs[c].ref, cref[c], cs[c].rows * O, 2e-3, rel);
    }
    rc = vision_run(&g, pix, tot_p, D, grid, tot_g, out, tot_r, err, sizeof err);
    check("all cases in one call", &g, rc, err, out, ref, cpu_all, tot_r * O, 2e-3, rel);
    /* time of the batched call (the fixture tower is tiny: launch-bound, a smoke figure) */
    const double t0 = now_s();
    for (int i = 0; i < 5 && !rc; i++) rc = vision_run(&g, pix, tot_p, D, grid, tot_g, out, tot_r, err, sizeof err);
    const double tg = (now_s() - t0) / 5;
    const double t1 = now_s();
    for (int i = 0; i < 5 && !rc; i++) rc = vision_run(&cpu, pix, tot_p, D, grid, tot_g, out, tot_r, err, sizeof err);
    printf("    time of the batched call (%lld patches): %s %.2f ms, cpu %.2f ms\n", (long long)tot_p, g.dev, 1e3 * tg,
           1e3 * (now_s() - t1) / 5);
    rig_close(&g);
  }
  for (int c = 0; c < n; c++) free(cref[c]);
  free(cref), free(pix), free(ref), free(cpu_all), free(out), free(grid);
  rig_close(&cpu);
done:
  for (int i = 0; i < n; i++) free(cs[i].pix), free(cs[i].ref);
  free(cs);
  json_decref(root);
}

/* ---- audio encoder ---- */

static int asr_encode(rig *r, const float *mel, int64_t L, float *out, int64_t rows, char *err, size_t errlen) {
  int64_t written = -1;
  const model_input in = {.io = MODEL_IO_AUDIO, .features = mel, .n_frames = L, .n_mels = 128};
  const model_output o = {.io = MODEL_IO_EMBEDDINGS, .embd = out, .embd_rows = rows, .embd_written = &written};
  int rc = r->k->run(r->impl, r->st, r->be, &in, &o, err, errlen);
  if (!rc && written != rows)
    rc = anna_err(err, errlen, ANNA_EINVAL, "%lld rows written, %lld expected", (long long)written, (long long)rows);
  return rc;
}

static void test_asr(const char *src_dir) {
  printf("audio encoder (qwen3_asr_audio)\n");
  char fix[1400], audio[1400], path[1500], err[512] = "";
  snprintf(fix, sizeof fix, "%s/tests/fixtures/qwen3_asr", src_dir);
  snprintf(audio, sizeof audio, "%s/tests/fixtures/audio", src_dir);
  snprintf(path, sizeof path, "%s/expected.json", fix);
  json_t *exp = json_load_file(path, 0, NULL);
  const json_t *cj = json_object_get(exp, "cases");
  const int nc = (int)json_array_size(cj);
  int bad = !exp || nc < 1 || nc > 8;
  float *mel[8] = {0}, *enc[8] = {0};
  int64_t L[8] = {0}, N[8] = {0};
  size_t enc_bytes[8] = {0};
  const char *name[8] = {0};
  for (int i = 0; !bad && i < nc; i++) {
    const json_t *c = json_array_get(cj, (size_t)i);
    name[i] = json_string_value(json_object_get(c, "name"));
    L[i] = json_integer_value(json_object_get(c, "frames"));
    N[i] = json_integer_value(json_object_get(c, "tokens"));
    size_t n1 = 0, n2 = 0;
    snprintf(path, sizeof path, "%s/%s", audio, json_string_value(json_object_get(c, "mel")));
    mel[i] = read_file(path, &n1);
    snprintf(path, sizeof path, "%s/%s.enc.f32", fix, name[i]);
    enc[i] = read_file(path, &n2);
    enc_bytes[i] = n2;
    bad = !name[i] || !mel[i] || !enc[i] || n1 != sizeof(float) * 128 * (size_t)L[i] || n2 % (sizeof(float) * (size_t)N[i]);
  }
  ok("fixture read (expected.json, mel features, encoder rows)", !bad);
  rig cpu;
  int rc = bad ? -1 : rig_open(&cpu, "qwen3_asr_audio", fix, "qwen3_asr", DEV_CPU, 1, 400, 0, err, sizeof err);
  if (rc && !bad) printf("  cpu: %s\n", err);
  ok("cpu rig", !rc);
  if (!rc) {
    const int H = cpu.desc.n_embd;
    for (int i = 0; i < nc; i++)
      if (enc_bytes[i] != sizeof(float) * (size_t)(N[i] * H)) {
        printf("  %s: encoder rows of %zu bytes, not %lld rows of %d\n", name[i], enc_bytes[i], (long long)N[i], H);
        rc = -1;
      }
    ok("reference rows of the encoder's width", !rc);
  }
  if (!rc) {
    const int H = cpu.desc.n_embd;
    float *cref[8] = {0}, *out = malloc(sizeof(float) * 400 * (size_t)H);
    for (int i = 0; i < nc; i++) {
      cref[i] = malloc(sizeof(float) * (size_t)(N[i] * H));
      if (asr_encode(&cpu, mel[i], L[i], cref[i], N[i], err, sizeof err)) printf("  cpu %s: %s\n", name[i], err);
    }
    for (int dev = DEV_CUDA_EXACT; dev <= DEV_CUDA; dev++) {
      rig g;
      rc = rig_open(&g, "qwen3_asr_audio", fix, "qwen3_asr", dev, 1, 400, 0, err, sizeof err);
      if (rc) printf("  %s: %s\n", dev_name[dev], err);
      ok(dev == DEV_CUDA ? "cuda rig (default matmuls)" : "cuda rig (exact matmuls)", !rc);
      for (int i = 0; !rc && i < nc; i++) {
        const int r2 = asr_encode(&g, mel[i], L[i], out, N[i], err, sizeof err);
        check(name[i], &g, r2, err, out, enc[i], cref[i], N[i] * H, 2e-3, dev == DEV_CUDA_EXACT ? 1e-4 : 0);
      }
      rig_close(&g);
    }
    for (int i = 0; i < nc; i++) free(cref[i]);
    free(out);
  }
  rig_close(&cpu);
  for (int i = 0; i < nc && i < 8; i++) free(mel[i]), free(enc[i]);
  json_decref(exp);
}

/* ---- codec ---- */

#define NQ 16
#define SPF 1920

static int codec_decode(rig *r, int seq, const int32_t *codes, int64_t n, float *pcm, char *err, size_t errlen) {
  const model_input in = {.io = MODEL_IO_CODES, .codes = codes, .n_frames = n, .n_codebooks = NQ, .seq = seq};
  const model_output out = {.io = MODEL_IO_PCM, .pcm = pcm};
  return r->k->run(r->impl, r->st, r->be, &in, &out, err, errlen);
}

static void test_codec(const char *src_dir) {
  printf("codec decoder (qwen3_tts_codec)\n");
  char dir[1400], path[1500], err[512] = "";
  snprintf(dir, sizeof dir, "%s/tests/fixtures/qwen3_tts_codec", src_dir);
  static const int lens[3] = {1, 7, 40};
  int32_t *codes[3] = {0};
  float *ref[3] = {0}, *cref[3] = {0};
  int bad = 0;
  for (int i = 0; i < 3; i++) {
    size_t nc, np;
    snprintf(path, sizeof path, "%s/codes_%d.i32", dir, lens[i]);
    codes[i] = read_file(path, &nc);
    snprintf(path, sizeof path, "%s/pcm_%d.f32", dir, lens[i]);
    ref[i] = read_file(path, &np);
    bad |= !codes[i] || !ref[i] || nc != (size_t)lens[i] * NQ * 4 || np != (size_t)lens[i] * SPF * 4;
  }
  ok("fixture read (codes, reference pcm)", !bad);
  rig cpu;
  int rc = bad ? -1 : rig_open(&cpu, "qwen3_tts_codec", dir, NULL, DEV_CPU, 1, 64, 1024, err, sizeof err);
  if (rc && !bad) printf("  cpu: %s\n", err);
  ok("cpu rig", !rc);
  if (rc) goto done;
  for (int i = 0; i < 3; i++) {
    cref[i] = calloc((size_t)lens[i] * SPF, sizeof(float));
    cpu.k->seq->reset(cpu.st, 0);
    if (codec_decode(&cpu, 0, codes[i], lens[i], cref[i], err, sizeof err)) printf("  cpu %d frames: %s\n", lens[i], err);
  }
  float *got = calloc(40 * SPF, sizeof(float));
  for (int dev = DEV_CUDA_EXACT; dev <= DEV_CUDA; dev++) {
    rig g;
    rc = rig_open(&g, "qwen3_tts_codec", dir, NULL, dev, 2, 64, 1024, err, sizeof err);
    if (rc) printf("  %s: %s\n", dev_name[dev], err);
    ok(dev == DEV_CUDA ? "cuda rig (default matmuls)" : "cuda rig (exact matmuls)", !rc);
    if (rc) {
      rig_close(&g);
      continue;
    }
    char what[96];
    for (int i = 0; i < 3; i++) {
      g.k->seq->reset(g.st, 0);
      const int r2 = codec_decode(&g, 0, codes[i], lens[i], got, err, sizeof err);
      snprintf(what, sizeof what, "%d frames in one pass", lens[i]);
      check(what, &g, r2, err, got, ref[i], cref[i], (int64_t)lens[i] * SPF, 2e-3, 0);
    }
    /* streamed in pieces, another stream decoding in between: the one pass within 1e-3 (the
     * matmuls take other kernels at other row counts, as on the CPU's native kernels) */
    static const int pieces[] = {1, 3, 7, 2, 1, 5, 8, 13};
    g.k->seq->reset(g.st, 0);
    g.k->seq->reset(g.st, 1);
    int r2 = 0;
    int64_t t = 0;
    for (int i = 0; !r2 && t < 40; i++) {
      const int64_t n = pieces[i % 8] < 40 - t ? pieces[i % 8] : 40 - t;
      float junk[SPF];
      r2 = codec_decode(&g, 0, codes[2] + t * NQ, n, got + t * SPF, err, sizeof err);
      if (!r2) r2 = codec_decode(&g, 1, codes[2] + (39 - t) * NQ, 1, junk, err, sizeof err);
      t += n;
    }
    check("40 frames in pieces 1,3,7,2,1,5,8,13", &g, r2, err, got, ref[2], cref[2], 40 * SPF, 2e-3, 0);
    /* the streamed output against this device's own one pass */
    float *one = calloc(40 * SPF, sizeof(float));
    g.k->seq->reset(g.st, 0);
    if (!r2) r2 = codec_decode(&g, 0, codes[2], 40, one, err, sizeof err);
    const double md = r2 ? INFINITY : max_diff(got, one, 40 * SPF, NULL);
    snprintf(what, sizeof what, "pieces == one pass on %s: max |diff| %.3g (<= 1e-3)", g.dev, md);
    ok(what, !r2 && md <= 1e-3);
    const double t0 = now_s();
    for (int i = 0; i < 5 && !r2; i++) {
      g.k->seq->reset(g.st, 0);
      r2 = codec_decode(&g, 0, codes[2], 40, one, err, sizeof err);
    }
    const double tg = (now_s() - t0) / 5, t1 = now_s();
    for (int i = 0; i < 5 && !r2; i++) {
      cpu.k->seq->reset(cpu.st, 0);
      r2 = codec_decode(&cpu, 0, codes[2], 40, one, err, sizeof err);
    }
    printf("    time of 40 frames (3.2 s of audio): %s %.2f ms, cpu %.2f ms\n", g.dev, 1e3 * tg, 1e3 * (now_s() - t1) / 5);
    free(one);
    rig_close(&g);
  }
  free(got);
  rig_close(&cpu);
done:
  for (int i = 0; i < 3; i++) free(codes[i]), free(ref[i]), free(cref[i]);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 3) {
    fprintf(stderr, "usage: test_cuda_encoders SHARED_FIXTURES_DIR SOURCE_DIR\n");
    return 2;
  }
  const backend_info *bi = backend_registry_find("cuda");
  if (!bi || !bi->available()) {
    printf("skipped: no CUDA device\n");
    return 77;
  }
  test_vision(argv[1], argv[2]);
  test_asr(argv[2]);
  test_codec(argv[2]);
  printf("%s: %d check(s), %d failure(s)\n", g_fail ? "FAILED" : "OK", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
