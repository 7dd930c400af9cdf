/* test_asr_chunk: qwen-asr's long-audio splitting and transcript joining (media/asr_chunk.h)
 * against the reference's own results on tests/fixtures/qwen3_asr/long (tools/mkfix_asr_chunk.py):
 * the pieces [start, n, n_padded] split_audio_into_chunks makes of long.wav for three chunk
 * lengths (one below the 5-s search half-width's pathology, where 0.5-s pieces appear), and
 * parse_asr_output's (language, text) on hand-made raw outputs, forced and not; then the
 * joined text and languages of the fixture model's per-piece outputs. Also bad arguments. */
#include "anna/anna.h"
#include "media/asr_chunk.h"
#include "media/audio.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                         \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
    free(b);
    b = NULL;
  }
  fclose(f);
  *n = (size_t)len;
  return b;
}

int main(int argc, char **argv) {
  (void)argc, (void)argv;
  const char *dir = ASR_LONG_FIXTURES;
  char path[1024], err[256];
  snprintf(path, sizeof path, "%s/expected.json", dir);
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) {
    fprintf(stderr, "test_asr_chunk: %s: %s\n", path, je.text);
    return 1;
  }
  /* parse cases: one piece each */
  size_t i;
  json_t *c;
  json_array_foreach(json_object_get(root, "parse"), i, c) {
    const char *raw = json_string_value(json_array_get(c, 0));
    const int forced = json_is_true(json_array_get(c, 1));
    const char *lang = json_string_value(json_array_get(c, 2));
    const char *text = json_string_value(json_array_get(c, 3));
    char *t = NULL, *l = NULL;
    int rc = asr_chunk_join(&raw, 1, forced, &t, &l, err, sizeof err);
    CHECK(!rc, "parse %zu: %s", i, err);
    if (!rc) {
      CHECK(!strcmp(t, text), "parse %zu (%s): text '%s', reference '%s'", i, raw, t, text);
      CHECK(!strcmp(l, lang), "parse %zu (%s): language '%s', reference '%s'", i, raw, l, lang);
    }
    free(t), free(l);
  }
  /* the fixture model's pieces joined */
  json_t *mo = json_object_get(root, "model");
  json_t *pieces = json_object_get(mo, "pieces");
  const size_t np = json_array_size(pieces);
  CHECK(np >= 3, "model: %zu pieces", np);
  const char **raws = calloc(np ? np : 1, sizeof *raws);
  json_array_foreach(pieces, i, c) raws[i] = json_string_value(json_object_get(c, "raw"));
  char *t = NULL, *l = NULL;
  int rc = asr_chunk_join(raws, (int32_t)np, 0, &t, &l, err, sizeof err);
  CHECK(!rc && !strcmp(t, json_string_value(json_object_get(mo, "text"))),
        "joined '%s', reference '%s'", t ? t : err, json_string_value(json_object_get(mo, "text")));
  CHECK(!rc && !strcmp(l, json_string_value(json_object_get(mo, "language"))), "languages '%s'",
        l ? l : err);
  free(t), free(l), free(raws);
  /* a language per piece: merged in order, consecutive repeats and empty ones dropped */
  const char *multi[] = {"language English<asr_text>a", "language english<asr_text> b",
                         "language None<asr_text>", "language Chinese<asr_text>c",
                         "language English<asr_text>d"};
  rc = asr_chunk_join(multi, 5, 0, &t, &l, err, sizeof err);
  CHECK(!rc && !strcmp(t, "abcd") && !strcmp(l, "English,Chinese,English"), "multi: '%s' '%s'",
        t ? t : err, l ? l : "");
  free(t), free(l);

  /* splits of long.wav */
  if (!media_audio_available()) {
    fprintf(stderr, "test_asr_chunk: built without libsndfile/libsoxr: splits skipped\n");
  } else {
    snprintf(path, sizeof path, "%s/%s", dir,
             json_string_value(json_object_get(root, "file")));
    size_t nb = 0;
    unsigned char *bytes = slurp(path, &nb);
    CHECK(bytes != NULL, "%s: cannot read", path);
    media_audio au = {0};
    rc = bytes ? media_audio_decode(bytes, nb, 3600, &au, err, sizeof err) : -1;
    free(bytes);
    CHECK(!rc, "decode: %s", err);
    CHECK(rc || au.n == json_integer_value(json_object_get(root, "n")), "samples %lld",
          (long long)au.n);
    const char *key;
    json_t *rows;
    json_object_foreach(json_object_get(root, "splits"), key, rows) {
      if (rc) break;
      asr_chunk *ck = NULL;
      int32_t k = 0;
      int r2 = asr_chunk_split(au.samples, au.n, 16000, atof(key), &ck, &k, err, sizeof err);
      CHECK(!r2, "split %s: %s", key, err);
      CHECK(r2 || (size_t)k == json_array_size(rows), "split %s: %d pieces, reference %zu", key,
            k, json_array_size(rows));
      for (int32_t j = 0; !r2 && j < k && (size_t)j < json_array_size(rows); j++) {
        json_t *r = json_array_get(rows, (size_t)j);
        const long long s = json_integer_value(json_array_get(r, 0)),
                        n = json_integer_value(json_array_get(r, 1)),
                        p = json_integer_value(json_array_get(r, 2));
        CHECK(ck[j].start == s && ck[j].n == n && ck[j].n_padded == p,
              "split %s piece %d: [%lld %lld %lld], reference [%lld %lld %lld]", key, j,
              (long long)ck[j].start, (long long)ck[j].n, (long long)ck[j].n_padded, s, n, p);
      }
      free(ck);
    }
    /* within the length: one piece, unpadded; bad arguments named */
    asr_chunk *ck = NULL;
    int32_t k = 0;
    float tiny[100] = {0};
    CHECK(!asr_chunk_split(tiny, 100, 16000, 1200, &ck, &k, err, sizeof err) && k == 1 &&
              ck[0].n == 100 && ck[0].n_padded == 100,
          "short clip: %d pieces", k);
    free(ck);
    CHECK(asr_chunk_split(tiny, 100, 16000, 0, &ck, &k, err, sizeof err) == ANNA_EINVAL &&
              strstr(err, "chunk length"),
          "zero length: %s", err);
    CHECK(asr_chunk_split(NULL, 0, 16000, 10, &ck, &k, err, sizeof err) == ANNA_EINVAL,
          "no samples accepted");
    media_audio_free(&au);
  }
  json_decref(root);
  if (failures) fprintf(stderr, "test_asr_chunk: %d failures\n", failures);
  else printf("test_asr_chunk: ok\n");
  return failures ? 1 : 0;
}
