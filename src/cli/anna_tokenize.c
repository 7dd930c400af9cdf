/* anna-tokenize: encode text (or a file) to ids, or decode ids to text, with the tokenizer
 * of a model folder (tokenizer.json). Output: one comma-separated line of ids, or the text.
 *   anna-tokenize --model-dir DIR|--model FILE.gguf --text T [--add-special] [--no-parse-special]
 *   anna-tokenize --model-dir DIR --file F
 *   anna-tokenize --model-dir DIR --decode 1,2,3 [--skip-special]
 *   anna-tokenize --model-dir DIR --file F --bench    (tokens/s over the file)
 */
#include "anna/anna.h"
#include "cli_common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: anna-tokenize --model-dir DIR|--hf-repo ORG/NAME[:FILE] (--text T | --file F | --decode ID,ID,...)\n"
          "                     [--add-special] [--no-parse-special] [--skip-special] [--bench]\n");
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap) {
      cap = cap ? cap * 2 : 1 << 16;
      char *nb = realloc(buf, cap + 1);
      if (!nb) {
        free(buf);
        fclose(f);
        return NULL;
      }
      buf = nb;
    }
    size_t k = fread(buf + n, 1, cap - n, f);
    n += k;
    if (k == 0) break;
  }
  fclose(f);
  buf[n] = 0;
  *len = n;
  return buf;
}

static int parse_ids(const char *s, int32_t **ids, size_t *n) {
  size_t cap = 16;
  *n = 0;
  *ids = malloc(cap * sizeof **ids);
  if (!*ids) return -1;
  while (*s) {
    while (*s == ' ' || *s == ',')
      s++;
    if (!*s) break;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || errno || v < 0 || v > INT32_MAX) return -1;
    if (*n == cap) {
      cap *= 2;
      int32_t *ni = realloc(*ids, cap * sizeof *ni);
      if (!ni) return -1;
      *ids = ni;
    }
    (*ids)[(*n)++] = (int32_t)v;
    s = end;
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *dir = NULL, *text = NULL, *file = NULL, *decode = NULL, *hf = NULL;
  int enc_flags = 0, dec_flags = 0, bench = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int has_val = i + 1 < argc;
    if ((!strcmp(a, "--model-dir") || !strcmp(a, "--model")) && has_val)
      dir = argv[++i];
    else if (!strcmp(a, "--hf-repo") && has_val)
      hf = argv[++i];
    else if (!strcmp(a, "--text") && has_val)
      text = argv[++i];
    else if (!strcmp(a, "--file") && has_val)
      file = argv[++i];
    else if (!strcmp(a, "--decode") && has_val)
      decode = argv[++i];
    else if (!strcmp(a, "--add-special"))
      enc_flags |= ANNA_TOKENIZE_ADD_SPECIAL;
    else if (!strcmp(a, "--no-parse-special"))
      enc_flags |= ANNA_TOKENIZE_NO_PARSE_SPECIAL;
    else if (!strcmp(a, "--skip-special"))
      dec_flags |= ANNA_DETOKENIZE_SKIP_SPECIAL;
    else if (!strcmp(a, "--bench"))
      bench = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "anna-tokenize: unknown or incomplete argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (cli_hf_model(hf, &dir)) return 1;
  if (!dir || (!!text + !!file + !!decode) != 1) {
    fprintf(stderr,
            "anna-tokenize: need --model-dir and exactly one of --text, --file, --decode\n");
    usage(stderr);
    return 2;
  }
  char err[512];
  anna_text *tok = NULL;
  /* A folder's tokenizer.json, or a GGUF file's tokenizer.ggml.* metadata; the chat
   * template is not needed (nor parsed, for folders). */
  if (anna_text_open(&tok, dir, ANNA_TEXT_NO_TEMPLATE, err, sizeof err)) {
    fprintf(stderr, "anna-tokenize: %s\n", err);
    return 1;
  }
  int rc = 0;
  if (decode) {
    int32_t *ids = NULL;
    size_t n = 0;
    char *out = NULL;
    size_t olen = 0;
    if (parse_ids(decode, &ids, &n)) {
      fprintf(stderr, "anna-tokenize: --decode wants comma-separated non-negative ids\n");
      rc = 2;
    } else if (anna_text_detokenize(tok, ids, n, dec_flags, &out, &olen, err, sizeof err)) {
      fprintf(stderr, "anna-tokenize: %s\n", err);
      rc = 1;
    } else {
      fwrite(out, 1, olen, stdout);
      fputc('\n', stdout);
    }
    free(out);
    free(ids);
  } else {
    size_t len = 0;
    char *buf = NULL;
    if (file) {
      buf = read_file(file, &len);
      if (!buf) {
        fprintf(stderr, "anna-tokenize: cannot read %s\n", file);
        anna_text_free(tok);
        return 1;
      }
      text = buf;
    } else {
      len = strlen(text);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (anna_text_tokenize(tok, text, len, enc_flags, &ids, &n, err, sizeof err)) {
      fprintf(stderr, "anna-tokenize: %s\n", err);
      rc = 1;
    } else if (bench) {
      clock_gettime(CLOCK_MONOTONIC, &t1);
      double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
      printf("%zu bytes -> %zu tokens in %.3f s: %.0f tokens/s, %.2f MB/s\n", len, n, s,
             (double)n / s, (double)len / s / 1e6);
    } else {
      for (size_t i = 0; i < n; i++)
        printf(i ? ",%d" : "%d", ids[i]);
      fputc('\n', stdout);
    }
    free(ids);
    free(buf);
  }
  anna_text_free(tok);
  return rc;
}
