/* test_quantize.c: the int4 path (formats/quant_encode.h, formats/gguf_write.h,
 * model/quantize.h, anna_quantize_model, anna_model_options.weight_quant).
 *
 *   - encoders: byte identity with ggml on the golden tests/fixtures/quant/golden.bin
 *     (written by bench/ggml_quant_check.sh from ggml's ggml_quantize_chunk), and round trips
 *     through quant_dequantize_row within per-type error bounds;
 *   - GGUF writer: every value type and array kind, tensors and alignment read back by
 *     formats/gguf.c; bad input refused;
 *   - converter: the bf16 GGUF of each fixture equals llama.cpp's convert_hf_to_gguf.py output
 *     (tests/fixtures/gguf/<name>.gguf) tensor for tensor (names, order, types, dims, bytes) and
 *     carries its architecture keys; int4 equals llama-quantize Q4_K_M of that bf16 file
 *     (tests/fixtures/gguf_q4km) byte for byte; refusals name the model type;
 *   - cache and load: the cache path is keyed by the source files, a second call hits it,
 *     weight_quant "int4" loads the cached GGUF, bad values are ANNA_EINVAL.
 * Logits of the converted models against the transformers references: test_fixtures --gguf
 * (ctest test_quantize_fixtures_*). argv[1]: the fixtures folder. */
#include "anna/anna.h"
#include "formats/dtype.h"
#include "formats/gguf.h"
#include "formats/gguf_write.h"
#include "formats/quant.h"
#include "formats/quant_encode.h"
#include "model/quantize.h"

#include "test_util.h"

#include <jansson.h>

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_tmp[256];

/* ---- encoders ---- */

static void test_golden(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    printf("  FAIL cannot open %s\n", path);
    g_fail++;
    return;
  }
  char magic[4];
  uint32_t count = 0;
  int ok = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "AQG1", 4) && fread(&count, 4, 1, f) == 1;
  int same = 0, per_type[64] = {0};
  for (uint32_t i = 0; ok && i < count; i++) {
    uint32_t h[2], nb;
    if (fread(h, 4, 2, f) != 2 || h[1] == 0 || h[1] > (1u << 20)) break;
    float *x = malloc(sizeof(float) * h[1]);
    if (fread(x, 4, h[1], f) != h[1] || fread(&nb, 4, 1, f) != 1 || nb > (1u << 22)) {
      free(x);
      break;
    }
    unsigned char *want = malloc(nb), *got = malloc(nb);
    if (fread(want, 1, nb, f) == nb && (int64_t)nb == dtype_row_bytes((int)h[0], h[1]) &&
        quant_encode_row((int)h[0], x, got, h[1]) == 0 && !memcmp(want, got, nb)) {
      same++;
      if (h[0] < 64) per_type[h[0]]++;
    } else {
      printf("  FAIL golden row %u (%s, n %u) differs from ggml\n", i, dtype_name((int)h[0]), h[1]);
    }
    free(x);
    free(want);
    free(got);
  }
  fclose(f);
  g_checks++;
  if (!ok || same != (int)count || count < 20) {
    printf("  FAIL golden: %d of %u rows identical\n", same, count);
    g_fail++;
  }
  /* the golden must cover every type the converter writes */
  const int types[] = {ANNA_DTYPE_Q4_K, ANNA_DTYPE_Q6_K, ANNA_DTYPE_Q5_0, ANNA_DTYPE_Q8_0};
  for (int t = 0; t < 4; t++) check(dtype_name(types[t]), per_type[types[t]] >= 5 ? 0 : 1, 0);
  printf("golden: %d/%u rows byte-identical to ggml\n", same, count);
}

static void test_roundtrip(void) {
  /* relative RMS error bounds on gaussian rows (measured worst of 8: Q8_0 0.0055, Q6_K 0.018,
   * Q5_0 0.044, Q4_K 0.072; bounds ~1.4x), F16 and exact F32 */
  static const struct {
    int type;
    double tol;
  } T[] = {{ANNA_DTYPE_Q8_0, 0.008}, {ANNA_DTYPE_Q6_K, 0.025}, {ANNA_DTYPE_Q5_0, 0.06},
           {ANNA_DTYPE_Q4_K, 0.10},  {ANNA_DTYPE_F16, 1e-3},  {ANNA_DTYPE_F32, 0}};
  const int64_t n = 4096;
  float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
  unsigned char *q = malloc((size_t)n * 4);
  for (size_t t = 0; t < sizeof T / sizeof T[0]; t++) {
    double worst = 0;
    for (int rep = 0; rep < 8; rep++) {
      for (int64_t i = 0; i < n; i++) {
        float u1 = (frand() + 1.0f) * 0.5f + 1e-7f, u2 = frand();
        x[i] = 0.05f * sqrtf(-2.0f * logf(u1)) * cosf(3.14159265f * u2) * (rep + 1);
      }
      if (quant_encode_row(T[t].type, x, q, n) || quant_dequantize_row(T[t].type, q, y, n)) {
        worst = INFINITY;
        break;
      }
      double e2 = 0, s2 = 0;
      for (int64_t i = 0; i < n; i++) e2 += (double)(x[i] - y[i]) * (x[i] - y[i]), s2 += (double)x[i] * x[i];
      worst = fmax(worst, sqrt(e2 / s2));
    }
    char what[64];
    snprintf(what, sizeof what, "round trip %s rel rms", dtype_name(T[t].type));
    check(what, worst, T[t].tol);
    printf("round trip %-5s rel rms error %.4f (bound %.3g)\n", dtype_name(T[t].type), worst, T[t].tol);
  }
  /* zeros stay zeros; bad n and unsupported types are refused */
  memset(x, 0, sizeof(float) * 256);
  quant_encode_row(ANNA_DTYPE_Q4_K, x, q, 256);
  quant_dequantize_row(ANNA_DTYPE_Q4_K, q, y, 256);
  double m = 0;
  for (int i = 0; i < 256; i++) m = fmax(m, fabs(y[i]));
  check("zero row stays zero", m, 0);
  check("q4_k n=100 refused", quant_encode_row(ANNA_DTYPE_Q4_K, x, q, 100) == ANNA_EINVAL ? 0 : 1, 0);
  check("iq2_xxs unsupported", quant_encode_row(ANNA_DTYPE_IQ2_XXS, x, q, 256) == ANNA_EUNSUPPORTED ? 0 : 1, 0);
  free(x);
  free(y);
  free(q);
}

/* ---- GGUF writer ---- */

static int fill_pattern(void *user, int64_t i, void *dst, size_t nbytes, char *err, size_t errlen) {
  (void)user, (void)err, (void)errlen;
  for (size_t k = 0; k < nbytes; k++) ((unsigned char *)dst)[k] = (unsigned char)(k * 7 + (size_t)i);
  return 0;
}

static int fill_fail(void *user, int64_t i, void *dst, size_t nbytes, char *err, size_t errlen) {
  (void)user, (void)i, (void)dst, (void)nbytes;
  snprintf(err, errlen, "fill failed on purpose");
  return ANNA_EIO;
}

static void test_writer(void) {
  char err[256], path[300];
  snprintf(path, sizeof path, "%s/w.gguf", g_tmp);
  gguf_writer *w = NULL;
  check("writer create", gguf_writer_create(&w, err, sizeof err), 0);
  const int32_t ai[3] = {1, -2, 3};
  const float af[2] = {0.5f, -1.25f};
  const char *as[3] = {"a", "", "ccc"};
  int rc = gguf_writer_set_u8(w, "k.u8", 200) | gguf_writer_set_i8(w, "k.i8", -5) | gguf_writer_set_u16(w, "k.u16", 60000) |
           gguf_writer_set_i16(w, "k.i16", -30000) | gguf_writer_set_u32(w, "k.u32", 4000000000u) |
           gguf_writer_set_i32(w, "k.i32", -2000000000) | gguf_writer_set_u64(w, "k.u64", 1ull << 60) |
           gguf_writer_set_i64(w, "k.i64", -(1ll << 60)) | gguf_writer_set_f32(w, "k.f32", 1.5f) |
           gguf_writer_set_f64(w, "k.f64", -2.25) | gguf_writer_set_bool(w, "k.bool", 1) |
           gguf_writer_set_str(w, "k.str", "héllo") | gguf_writer_set_arr(w, "k.ai", GGUF_TYPE_INT32, ai, 3) |
           gguf_writer_set_arr(w, "k.af", GGUF_TYPE_FLOAT32, af, 2) | gguf_writer_set_arr_str(w, "k.as", as, NULL, 3) |
           gguf_writer_set_arr(w, "k.empty", GGUF_TYPE_UINT8, NULL, 0) | gguf_writer_set_u32(w, "general.alignment", 64);
  check("writer set all kinds", rc ? 1 : 0, 0);
  check("duplicate key refused", gguf_writer_set_u8(w, "k.u8", 1) == ANNA_EINVAL ? 0 : 1, 0);
  check("nested array type refused", gguf_writer_set_arr(w, "k.bad", GGUF_TYPE_STRING, as, 1) == ANNA_EINVAL ? 0 : 1, 0);
  const int64_t d1[2] = {256, 3}, d2[1] = {5}, d3[2] = {100, 2};
  rc = gguf_writer_add_tensor(w, "t.q4k", ANNA_DTYPE_Q4_K, 2, d1) | gguf_writer_add_tensor(w, "t.f32", ANNA_DTYPE_F32, 1, d2);
  check("add tensors", rc ? 1 : 0, 0);
  check("bad row length refused", gguf_writer_add_tensor(w, "t.bad", ANNA_DTYPE_Q8_0, 2, d3) == ANNA_EINVAL ? 0 : 1, 0);
  check("duplicate tensor refused", gguf_writer_add_tensor(w, "t.f32", ANNA_DTYPE_F32, 1, d2) == ANNA_EINVAL ? 0 : 1, 0);
  check("write", gguf_writer_write(w, path, fill_pattern, NULL, err, sizeof err), 0);
  char p2[300];
  snprintf(p2, sizeof p2, "%s/w2.gguf", g_tmp);
  err[0] = 0;
  check("fill error propagates", gguf_writer_write(w, p2, fill_fail, NULL, err, sizeof err) == ANNA_EIO && strstr(err, "on purpose") ? 0 : 1, 0);
  gguf_writer_free(w);
  gguf_file *f = NULL;
  if (gguf_open(&f, path, err, sizeof err)) {
    printf("  FAIL reading back: %s\n", err);
    g_fail++;
    return;
  }
  const gguf_kv *k;
  check("version 3", gguf_version(f) == 3 ? 0 : 1, 0);
  check("alignment 64", gguf_alignment(f) == 64 && gguf_data_offset(f) % 64 == 0 ? 0 : 1, 0);
  check("u8", (k = gguf_kv_find(f, "k.u8")) && k->type == GGUF_TYPE_UINT8 && k->u == 200 ? 0 : 1, 0);
  check("i8", (k = gguf_kv_find(f, "k.i8")) && k->type == GGUF_TYPE_INT8 && k->i == -5 ? 0 : 1, 0);
  check("u16", (k = gguf_kv_find(f, "k.u16")) && k->u == 60000 ? 0 : 1, 0);
  check("i16", (k = gguf_kv_find(f, "k.i16")) && k->i == -30000 ? 0 : 1, 0);
  check("u32", (k = gguf_kv_find(f, "k.u32")) && k->u == 4000000000u ? 0 : 1, 0);
  check("i32", (k = gguf_kv_find(f, "k.i32")) && k->i == -2000000000 ? 0 : 1, 0);
  check("u64", (k = gguf_kv_find(f, "k.u64")) && k->u == 1ull << 60 ? 0 : 1, 0);
  check("i64", (k = gguf_kv_find(f, "k.i64")) && k->i == -(1ll << 60) ? 0 : 1, 0);
  check("f32", (k = gguf_kv_find(f, "k.f32")) && k->f == 1.5 ? 0 : 1, 0);
  check("f64", (k = gguf_kv_find(f, "k.f64")) && k->f == -2.25 ? 0 : 1, 0);
  check("bool", (k = gguf_kv_find(f, "k.bool")) && k->type == GGUF_TYPE_BOOL && k->b ? 0 : 1, 0);
  check("str", (k = gguf_kv_find(f, "k.str")) && !strcmp(k->str, "héllo") ? 0 : 1, 0);
  check("arr i32", (k = gguf_kv_find(f, "k.ai")) && k->arr.count == 3 && gguf_array_get_i64(&k->arr, 1) == -2 ? 0 : 1, 0);
  check("arr f32", (k = gguf_kv_find(f, "k.af")) && k->arr.count == 2 && gguf_array_get_f64(&k->arr, 1) == -1.25 ? 0 : 1, 0);
  check("arr str", (k = gguf_kv_find(f, "k.as")) && k->arr.count == 3 && !strcmp(k->arr.strs[2], "ccc") && k->arr.lens[1] == 0 ? 0 : 1, 0);
  check("arr empty", (k = gguf_kv_find(f, "k.empty")) && k->arr.count == 0 ? 0 : 1, 0);
  const gguf_tensor *t = gguf_tensor_find(f, "t.q4k");
  int tens_ok = t && t->type == ANNA_DTYPE_Q4_K && t->dims[0] == 256 && t->dims[1] == 3 && t->nbytes == 3 * 144;
  for (int64_t b = 0; tens_ok && b < t->nbytes; b++) tens_ok = ((const unsigned char *)t->data)[b] == (unsigned char)(b * 7);
  check("tensor q4k bytes", tens_ok ? 0 : 1, 0);
  t = gguf_tensor_find(f, "t.f32");
  check("tensor f32", t && t->ndim == 1 && t->nbytes == 20 && t->offset % 64 == 0 && ((const unsigned char *)t->data)[1] == 8 ? 0 : 1, 0);
  gguf_close(f);
}

/* ---- converter ---- */

/* Our bf16 GGUF of fixture `name` against llama.cpp's converter output. */
static void test_vs_converter(const char *fixtures, const char *refdir, const char *name) {
  char dir[512], ref[512], out[512], err[512], used[512];
  snprintf(dir, sizeof dir, "%s/%s", fixtures, name);
  snprintf(ref, sizeof ref, "%s/%s.gguf", refdir, name);
  snprintf(out, sizeof out, "%s/%s-bf16.gguf", g_tmp, name);
  int built = 0;
  int rc = anna_quantize_model(dir, "bf16", out, used, sizeof used, &built, err, sizeof err);
  check("quantize bf16", rc ? 1 : 0, 0);
  if (rc) {
    printf("  %s: %s\n", name, err);
    return;
  }
  check("built flag / path", built == 1 && !strcmp(used, out) ? 0 : 1, 0);
  gguf_file *a = NULL, *b = NULL;
  if (gguf_open(&a, out, err, sizeof err) || gguf_open(&b, ref, err, sizeof err)) {
    printf("  FAIL %s: %s\n", name, err);
    g_fail++;
    gguf_close(a);
    return;
  }
  int64_t same = 0, differ = 0, missing = 0;
  for (int64_t i = 0; i < gguf_tensor_count(b); i++) {
    const gguf_tensor *tb = gguf_tensor_at(b, i), *ta = gguf_tensor_find(a, tb->name);
    if (!ta) {
      printf("  %s: missing tensor %s\n", name, tb->name);
      missing++;
      continue;
    }
    int ok = ta->type == tb->type && ta->nelem == tb->nelem && ta->nbytes == tb->nbytes;
    for (int d = 0; ok && d < GGUF_MAX_DIMS; d++) ok = ta->dims[d] == tb->dims[d];
    if (ok && memcmp(ta->data, tb->data, (size_t)ta->nbytes)) {
      /* float tensors computed from bf16 by the converter in torch (norm + 1, -exp): compare values */
      double md = 0;
      if (ta->type == ANNA_DTYPE_F32) {
        const float *x = ta->data, *y = tb->data;
        for (int64_t k = 0; k < ta->nelem; k++) md = fmax(md, fabs((double)x[k] - y[k]) / fmax(1.0, fabs(y[k])));
      } else {
        md = INFINITY;
      }
      if (md > 1e-2) {
        printf("  %s: tensor %s data differs (max rel %.3g)\n", name, tb->name, md);
        ok = 0;
      } else if (md > 0) {
        printf("  %s: tensor %s within %.2g of the converter (it rounds through bf16)\n", name, tb->name, md);
      }
    } else if (!ok) {
      printf("  %s: tensor %s: type %s/%s dims differ\n", name, tb->name, dtype_name(ta->type), dtype_name(tb->type));
    }
    ok ? same++ : differ++;
  }
  check("converter: every tensor equal", (double)(differ + missing), 0);
  check("converter: same tensor count", gguf_tensor_count(a) == gguf_tensor_count(b) ? 0 : 1, 0);
  /* same order too: llama-quantize's Q4_K_M choice depends on it */
  int order = gguf_tensor_count(a) == gguf_tensor_count(b);
  for (int64_t i = 0; order && i < gguf_tensor_count(b); i++) order = !strcmp(gguf_tensor_at(a, i)->name, gguf_tensor_at(b, i)->name);
  check("converter: same tensor order", order ? 0 : 1, 0);
  /* architecture keys the converter writes and the loaders read */
  int kmiss = 0;
  for (int64_t i = 0; i < gguf_kv_count(b); i++) {
    const gguf_kv *kb = gguf_kv_at(b, i);
    const gguf_kv *ka = gguf_kv_find(a, kb->key);
    if (!strncmp(kb->key, "general.", 8) && strcmp(kb->key, "general.architecture") && strcmp(kb->key, "general.file_type"))
      continue; /* names, licences, sizes: informational */
    if (!ka) {
      printf("  %s: missing key %s\n", name, kb->key);
      kmiss++;
      continue;
    }
    int eq = ka->type == kb->type;
    if (eq && kb->type == GGUF_TYPE_STRING) eq = !strcmp(ka->str, kb->str);
    else if (eq && kb->type == GGUF_TYPE_ARRAY) {
      eq = ka->arr.count == kb->arr.count && ka->arr.elem_type == kb->arr.elem_type;
      for (int64_t k = 0; eq && k < kb->arr.count; k++)
        eq = kb->arr.elem_type == GGUF_TYPE_STRING ? !strcmp(ka->arr.strs[k], kb->arr.strs[k])
                                                   : gguf_array_get_f64(&ka->arr, k) == gguf_array_get_f64(&kb->arr, k);
    } else if (eq) {
      eq = ka->u == kb->u && ka->i == kb->i && (float)ka->f == (float)kb->f && ka->b == kb->b;
    }
    if (!eq) {
      printf("  %s: key %s differs\n", name, kb->key);
      kmiss++;
    }
  }
  check("converter: keys equal", kmiss, 0);
  printf("%-14s bf16 vs convert_hf_to_gguf.py: %lld tensors equal, %lld differ, %lld missing; %d key(s) differ\n", name,
         (long long)same, (long long)differ, (long long)missing, kmiss);
  gguf_close(a);
  gguf_close(b);
}

/* anna-quantize int4 against llama-quantize Q4_K_M of the same bf16 file
 * (tests/fixtures/gguf_q4km/README.md): every tensor byte for byte. */
static void test_vs_llama_quantize(const char *fixtures, const char *name) {
  char dir[512], ref[512], out[512], err[512];
  snprintf(dir, sizeof dir, "%s/%s", fixtures, name);
  snprintf(ref, sizeof ref, "%s/tests/fixtures/gguf_q4km/%s.gguf", ANNA_SOURCE_DIR, name);
  snprintf(out, sizeof out, "%s/%s-q4km.gguf", g_tmp, name);
  gguf_file *a = NULL, *b = NULL;
  if (anna_quantize_model(dir, "int4", out, NULL, 0, NULL, err, sizeof err) || gguf_open(&a, out, err, sizeof err) ||
      gguf_open(&b, ref, err, sizeof err)) {
    printf("  FAIL %s: %s\n", name, err);
    g_fail++;
    gguf_close(a);
    return;
  }
  int64_t same = 0;
  int types[64] = {0};
  for (int64_t i = 0; i < gguf_tensor_count(b); i++) {
    const gguf_tensor *tb = gguf_tensor_at(b, i), *ta = gguf_tensor_find(a, tb->name);
    int ok = ta && ta->type == tb->type && ta->nbytes == tb->nbytes;
    for (int d = 0; ok && d < GGUF_MAX_DIMS; d++) ok = ta->dims[d] == tb->dims[d];
    if (ok) ok = !memcmp(ta->data, tb->data, (size_t)tb->nbytes);
    if (ok) {
      same++;
      if (tb->type >= 0 && tb->type < 64) types[tb->type]++;
    } else {
      printf("  %s: tensor %s differs from llama-quantize (%s vs %s)\n", name, tb->name, ta ? dtype_name(ta->type) : "missing",
             dtype_name(tb->type));
    }
  }
  char what[96];
  snprintf(what, sizeof what, "%s int4 == llama-quantize Q4_K_M", name);
  check(what, (double)(gguf_tensor_count(b) - same) + (gguf_tensor_count(a) != gguf_tensor_count(b)), 0);
  printf("%-14s int4 vs llama-quantize Q4_K_M: %lld of %lld tensors identical (Q4_K %d, Q6_K %d, Q5_0 %d, Q8_0 %d, F32 %d)\n",
         name, (long long)same, (long long)gguf_tensor_count(b), types[ANNA_DTYPE_Q4_K], types[ANNA_DTYPE_Q6_K],
         types[ANNA_DTYPE_Q5_0], types[ANNA_DTYPE_Q8_0], types[ANNA_DTYPE_F32]);
  gguf_close(a);
  gguf_close(b);
}

/* int4 types: llama.cpp's Q4_K_M choice for these shapes. */
static void test_int4_types(const char *fixtures) {
  char dir[512], out[512], err[512];
  snprintf(dir, sizeof dir, "%s/qwen3_5_text", fixtures);
  snprintf(out, sizeof out, "%s/q35-int4.gguf", g_tmp);
  if (anna_quantize_model(dir, "int4", out, NULL, 0, NULL, err, sizeof err)) {
    printf("  FAIL %s\n", err);
    g_fail++;
    return;
  }
  gguf_file *f = NULL;
  if (gguf_open(&f, out, err, sizeof err)) {
    printf("  FAIL %s\n", err);
    g_fail++;
    return;
  }
  /* llama.cpp's use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2 picks Q6_K for
   * attn_v / attn_qkv / ffn_down; hidden 128 is not a multiple of 256, so Q4_K falls back to
   * Q5_0 and Q6_K to Q8_0 there (ffn_down has 256 columns: Q4_K / Q6_K stay). */
  uint32_t n = 0;
  gguf_get_u32(f, "qwen35.block_count", &n, NULL, 0);
  check("block_count", n >= 4 ? 0 : 1, 0);
  int seen_more = 0, seen_less = 0;
  for (int l = 0; l < (int)n; l++) {
    const int more = l < (int)n / 8 || l >= 7 * (int)n / 8 || (l - (int)n / 8) % 3 == 2;
    seen_more += more, seen_less += !more;
    char nm[64];
    const char *part[3] = {"ffn_down", "attn_qkv", "attn_v"};
    for (int p = 0; p < 3; p++) {
      snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, part[p]);
      const gguf_tensor *t = gguf_tensor_find(f, nm);
      if (!t) continue;
      const int expect = p == 0 ? (more ? ANNA_DTYPE_Q6_K : ANNA_DTYPE_Q4_K) : (more ? ANNA_DTYPE_Q8_0 : ANNA_DTYPE_Q5_0);
      char what[96];
      snprintf(what, sizeof what, "int4 type of %s", nm);
      check(what, t->type == expect ? 0 : 1, 0);
      if (t->type != expect) printf("  %s: got %s want %s\n", nm, dtype_name(t->type), dtype_name(expect));
    }
  }
  check("both more-bits branches covered", seen_more && seen_less ? 0 : 1, 0);
  static const struct {
    const char *name;
    int type;
  } want[] = {
      {"output.weight", ANNA_DTYPE_Q8_0},     /* Q6_K, 128 columns: Q8_0 */
      {"token_embd.weight", ANNA_DTYPE_Q5_0}, /* Q4_K (untied), fallback Q5_0 */
      {"blk.0.attn_gate.weight", ANNA_DTYPE_Q5_0},
      {"blk.0.ssm_conv1d.weight", ANNA_DTYPE_F32},
      {"blk.0.attn_norm.weight", ANNA_DTYPE_F32},
      {"blk.0.ssm_a", ANNA_DTYPE_F32},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const gguf_tensor *t = gguf_tensor_find(f, want[i].name);
    char what[96];
    snprintf(what, sizeof what, "int4 type of %s", want[i].name);
    check(what, t && t->type == want[i].type ? 0 : 1, 0);
    if (!t || t->type != want[i].type)
      printf("  %s: got %s want %s\n", want[i].name, t ? dtype_name(t->type) : "none", dtype_name(want[i].type));
  }
  const gguf_kv *k = gguf_kv_find(f, "general.file_type");
  check("int4 file_type Q4_K_M", k && k->u == 15 ? 0 : 1, 0);
  gguf_close(f);
}

static void test_refusals(const char *fixtures) {
  char dir[512], out[512], err[512];
  static const char *unsup[] = {"qwen3_moe", "qwen3_5_moe_text", "gemma3_text", "gemma4_text"};
  snprintf(out, sizeof out, "%s/refused.gguf", g_tmp);
  for (size_t i = 0; i < sizeof unsup / sizeof unsup[0]; i++) {
    snprintf(dir, sizeof dir, "%s/%s", fixtures, unsup[i]);
    err[0] = 0;
    int rc = anna_quantize_model(dir, "int4", out, NULL, 0, NULL, err, sizeof err);
    char what[96];
    snprintf(what, sizeof what, "%s refused as unsupported", unsup[i]);
    check(what, rc == ANNA_EUNSUPPORTED && strstr(err, "not supported") ? 0 : 1, 0);
    printf("refused %-18s: %s\n", unsup[i], err);
  }
  snprintf(dir, sizeof dir, "%s/qwen2", fixtures);
  check("type q3 refused", anna_quantize_model(dir, "q3", out, NULL, 0, NULL, err, sizeof err) == ANNA_EINVAL ? 0 : 1, 0);
  check("missing folder", anna_quantize_model("/nonexistent/x", "int4", NULL, NULL, 0, NULL, err, sizeof err) ? 0 : 1, 0);
}

static void test_cache_and_load(const char *fixtures) {
  char dir[512], err[512], p1[4096], p2[4096];
  snprintf(dir, sizeof dir, "%s/qwen3", fixtures);
  setenv("ANNA_CACHE", g_tmp, 1);
  int built = -1;
  int rc = anna_quantize_model(dir, "int4", NULL, p1, sizeof p1, &built, err, sizeof err);
  check("cache build", rc == 0 && built == 1 ? 0 : 1, 0);
  char prefix[600];
  snprintf(prefix, sizeof prefix, "%s/quant/qwen3-int4-", g_tmp);
  check("cache path layout", !strncmp(p1, prefix, strlen(prefix)) && strstr(p1, ".gguf") ? 0 : 1, 0);
  rc = anna_quantize_model(dir, "int4", NULL, p2, sizeof p2, &built, err, sizeof err);
  check("cache hit", rc == 0 && built == 0 && !strcmp(p1, p2) ? 0 : 1, 0);
  char pb[4096];
  rc = anna_quantize_model(dir, "bf16", NULL, pb, sizeof pb, &built, err, sizeof err);
  check("type in key", rc == 0 && strcmp(pb, p1) ? 0 : 1, 0);
  printf("cache: %s\n", p1);
  /* weight_quant */
  anna_model *m = NULL;
  anna_model_options mo = {0};
  mo.weight_quant = "int8";
  rc = anna_model_load(&m, dir, &mo, err, sizeof err);
  check("weight_quant int8 refused", rc == ANNA_EINVAL && strstr(err, "weight_quant") ? 0 : 1, 0);
  mo.weight_quant = "int4";
  rc = anna_model_load(&m, dir, &mo, err, sizeof err);
  check("weight_quant int4 loads", rc, 0);
  if (!rc) {
    check("describe says gguf", strstr(anna_model_describe(m), "gguf") ? 0 : 1, 0);
    printf("int4 load: %s\n", anna_model_describe(m));
    anna_model_free(m);
  } else {
    printf("  %s\n", err);
  }
  /* a GGUF file loads as stored whatever weight_quant says (documented in anna.h) */
  rc = anna_model_load(&m, ANNA_SOURCE_DIR "/tests/fixtures/gguf/qwen3.gguf", &mo, err, sizeof err);
  check("weight_quant int4 on a GGUF loads it as stored", rc, 0);
  if (!rc) anna_model_free(m);
  mo.weight_quant = "auto";
  rc = anna_model_load(&m, dir, &mo, err, sizeof err);
  check("weight_quant auto loads as stored", rc == 0 && !strstr(anna_model_describe(m), "gguf") ? 0 : 1, 0);
  if (!rc) anna_model_free(m);
}

/* ---- logits of converted fixtures vs the transformers references ---- */

/* Loads `path`, prefills the fixture's long case (150 tokens) and compares every position's
 * logits with the reference: max |d|, RMS(d) / RMS(ref) and top-1 agreement. */
static int fixture_logits(const char *fixdir, const char *path, double *maxd, double *rel, double *top1, char *err,
                          size_t errlen) {
  char p[1200];
  snprintf(p, sizeof p, "%s/expected.json", fixdir);
  json_error_t je;
  json_t *root = json_load_file(p, 0, &je);
  if (!root) return snprintf(err, errlen, "%.400s: %.100s", p, je.text), -1;
  json_t *c = json_array_get(json_object_get(root, "cases"), 1);
  json_t *ids = json_object_get(c, "prompt_ids");
  const int n = (int)json_array_size(ids);
  snprintf(p, sizeof p, "%s/%s", fixdir, json_string_value(json_object_get(c, "logits_file")));
  anna_model *m = NULL;
  anna_context *ctx = NULL;
  int rc = -1;
  int32_t *tok = calloc((size_t)n + 1, sizeof *tok), *sq = calloc((size_t)n + 1, sizeof *sq),
          *pos = calloc((size_t)n + 1, sizeof *pos);
  int8_t *want = calloc((size_t)n + 1, 1);
  float *ref = NULL, *lg = NULL;
  if (n < 2 || anna_model_load(&m, path, NULL, err, errlen)) goto out;
  const int V = anna_model_vocab(m);
  ref = malloc(sizeof(float) * (size_t)n * V);
  lg = malloc(sizeof(float) * (size_t)n * V);
  FILE *f = fopen(p, "rb");
  if (!f || fread(ref, sizeof(float), (size_t)n * V, f) != (size_t)n * V) {
    if (f) fclose(f);
    snprintf(err, errlen, "%.400s: cannot read", p);
    goto out;
  }
  fclose(f);
  anna_context_options o = {.n_seq = 1, .n_ctx = 512, .n_batch = 512, .n_threads = 2};
  if (anna_context_create(&ctx, m, &o, err, errlen)) goto out;
  for (int i = 0; i < n; i++) tok[i] = (int32_t)json_integer_value(json_array_get(ids, i)), pos[i] = i, want[i] = 1;
  anna_batch b = {n, tok, sq, pos, want};
  if (anna_context_decode(ctx, &b, lg, err, errlen)) goto out;
  double e2 = 0, s2 = 0, md = 0;
  int agree = 0;
  for (int t = 0; t < n; t++) {
    int a = 0, r = 0;
    for (int v = 0; v < V; v++) {
      const double d = (double)lg[(size_t)t * V + v] - ref[(size_t)t * V + v];
      e2 += d * d, s2 += (double)ref[(size_t)t * V + v] * ref[(size_t)t * V + v];
      md = fmax(md, fabs(d));
      if (lg[(size_t)t * V + v] > lg[(size_t)t * V + a]) a = v;
      if (ref[(size_t)t * V + v] > ref[(size_t)t * V + r]) r = v;
    }
    agree += a == r;
  }
  *maxd = md, *rel = sqrt(e2 / s2), *top1 = (double)agree / n;
  rc = 0;
out:
  anna_context_free(ctx);
  anna_model_free(m);
  json_decref(root);
  free(tok), free(sq), free(pos), free(want), free(ref), free(lg);
  return rc;
}

static void test_fixture_logits(const char *fixtures, const char *name) {
  char dir[512], out[512], err[512];
  snprintf(dir, sizeof dir, "%s/%s", fixtures, name);
  for (int q = 0; q < 2; q++) {
    const char *type = q ? "int4" : "bf16";
    snprintf(out, sizeof out, "%s/%s-%s-logits.gguf", g_tmp, name, type);
    double md = INFINITY, rel = INFINITY, top1 = 0;
    if (anna_quantize_model(dir, type, out, NULL, 0, NULL, err, sizeof err) ||
        fixture_logits(dir, out, &md, &rel, &top1, err, sizeof err)) {
      printf("  FAIL %s %s: %s\n", name, type, err);
      g_fail++;
      continue;
    }
    char what[96];
    snprintf(what, sizeof what, "%s %s logits", name, type);
    if (!q) {
      check(what, md, 2e-3); /* the fixtures README bound for f32 compute */
    } else {
      /* int4 on these tiny random models (hidden 128: most matrices fall back to Q5_0; flat
       * logits, so top-1 flips easily). Measured: qwen2/qwen3/llama RMS(d)/RMS(ref) 0.18-0.21,
       * top-1 0.65-0.71; qwen3_5 (8 layers with GDN recurrences: every weight error ~4x as
       * visible, Q8_0 everywhere gives 0.07-0.14 there against 0.03) 0.46-0.49, top-1
       * 0.35-0.42. A layout error gives RMS ratios >= 1 and top-1 near 1/vocab. Bounds ~1.3x;
       * bench/notes/int4.md has the numbers. */
      const int q35 = !strncmp(name, "qwen3_5", 7);
      check(what, rel, q35 ? 0.65 : 0.28);
      snprintf(what, sizeof what, "%s int4 top-1 agreement", name);
      check(what, top1, 1.0), check(what, (q35 ? 0.25 : 0.5) - top1, 0);
    }
    printf("%-14s %s GGUF vs transformers: max|d| %.3g, rms(d)/rms(ref) %.4f, top-1 %.3f\n", name, type, md, rel, top1);
  }
}

int main(int argc, char **argv) {
  const char *fixtures = argc > 1 ? argv[1] : "../shared/fixtures";
  snprintf(g_tmp, sizeof g_tmp, "/tmp/anna_test_quantize_XXXXXX");
  if (!mkdtemp(g_tmp)) return perror("mkdtemp"), 1;
  test_golden(ANNA_SOURCE_DIR "/tests/fixtures/quant/golden.bin");
  test_roundtrip();
  test_writer();
  static const char *names[] = {"qwen2", "qwen3", "llama", "qwen3_5", "qwen3_5_text"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    test_vs_converter(fixtures, ANNA_SOURCE_DIR "/tests/fixtures/gguf", names[i]);
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) test_fixture_logits(fixtures, names[i]);
  /* Llama 3 rope scaling: the converter's rope_freqs tensor (tests/fixtures/llama3) */
  test_vs_converter(ANNA_SOURCE_DIR "/tests/fixtures", ANNA_SOURCE_DIR "/tests/fixtures/gguf", "llama3");
  test_fixture_logits(ANNA_SOURCE_DIR "/tests/fixtures", "llama3");
  test_vs_llama_quantize(fixtures, "qwen3_5_text");
  test_vs_llama_quantize(ANNA_SOURCE_DIR "/tests/fixtures", "llama3");
  test_int4_types(fixtures);
  test_refusals(fixtures);
  test_cache_and_load(fixtures);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  if (system(cmd)) printf("note: could not remove %s\n", g_tmp);
  printf("%s: %d of %d checks failed\n", g_fail ? "FAIL" : "OK", g_fail, g_checks);
  return g_fail ? 1 : 0;
}
