/* cli_common.h: small helpers shared by the command-line tools (flag parsing that reports
 * what was wrong, id lists, timing). Header-only: each tool is one translation unit. */
#ifndef ANNA_CLI_COMMON_H
#define ANNA_CLI_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hub.h"

/* Inside a `for (int i = 1; i < argc; i++)` flag loop with `a` = argv[i] and `v` = argv[i+1]
 * (or NULL): takes the flag's value, or reports the missing value and returns 2 (usage). */
#define CLI_NEEDV()                                                                                                    \
  do {                                                                                                                 \
    if (!v) {                                                                                                          \
      fprintf(stderr, "error: %s needs a value\n", a);                                                                 \
      return 2;                                                                                                        \
    }                                                                                                                  \
    i++;                                                                                                               \
  } while (0)

static inline double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --weight-quant none|auto|int4 (anna_model_options.weight_quant); prints the error and
 * returns -1 for anything else. */
static inline int cli_weight_quant(const char *flag, const char *v) {
  if (v && (!strcmp(v, "none") || !strcmp(v, "auto") || !strcmp(v, "int4"))) return 0;
  fprintf(stderr, "error: %s expects none, auto or int4, got '%s'\n", flag, v ? v : "");
  return -1;
}

/* Parses an int flag value in [lo, hi]; prints the error and returns -1 on failure. */
static inline int cli_int(const char *flag, const char *v, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long x = v ? strtol(v, &end, 10) : 0;
  if (!v || errno || *end || end == v || x < lo || x > hi) {
    fprintf(stderr, "error: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, v ? v : "");
    return -1;
  }
  *out = (int)x;
  return 0;
}

static inline int cli_float(const char *flag, const char *v, double lo, double hi, float *out) {
  char *end;
  errno = 0;
  double x = v ? strtod(v, &end) : 0;
  if (!v || errno || *end || end == v || !(x >= lo && x <= hi)) {
    fprintf(stderr, "error: %s expects a number in [%g, %g], got '%s'\n", flag, lo, hi, v ? v : "");
    return -1;
  }
  *out = (float)x;
  return 0;
}

/* "5,17,3" -> ids (caller frees). Returns count or -1 (message printed). */
static inline long cli_ids(const char *flag, const char *v, int32_t **out) {
  *out = NULL;
  if (!v || !*v) {
    fprintf(stderr, "error: %s expects a comma-separated list of token ids\n", flag);
    return -1;
  }
  size_t cap = 1;
  for (const char *p = v; *p; p++) cap += *p == ',';
  int32_t *ids = malloc(cap * sizeof *ids);
  if (!ids) return -1;
  long n = 0;
  const char *p = v;
  while (*p) {
    char *end;
    errno = 0;
    long x = strtol(p, &end, 10);
    if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
      fprintf(stderr, "error: %s: bad token id at '%s'\n", flag, p);
      free(ids);
      return -1;
    }
    ids[n++] = (int32_t)x;
    p = *end ? end + 1 : end;
  }
  *out = ids;
  return n;
}

/* --hf-repo ORG/NAME[:FILE|:TAG] (spec; NULL: the flag was not given): resolves it through the
 * Hugging Face Hub cache, downloading what it lacks (src/hub/hub.h: HF_ENDPOINT, HF_TOKEN,
 * HF_HOME, HF_HUB_OFFLINE), and sets *model to the local folder or file (valid until exit: the
 * path is freed by an atexit handler, so a tool needs no cleanup for it). --hf-repo together
 * with a --model / --model-dir is an error. Returns 0, or 1 with the message printed. */
static char *cli_hf_path_ __attribute__((unused));
__attribute__((unused)) static void cli_hf_free_(void) {
  free(cli_hf_path_);
  cli_hf_path_ = NULL;
}
static inline int cli_hf_model(const char *spec, const char **model) {
  if (!spec) return 0;
  if (*model) {
    fprintf(stderr, "error: give --hf-repo or --model / --model-dir, not both\n");
    return 1;
  }
  char err[1024];
  if (cli_hf_path_ || hub_fetch(spec, NULL, &cli_hf_path_, err, sizeof err)) {
    fprintf(stderr, "error: --hf-repo %s: %s\n", spec, cli_hf_path_ ? "given twice" : err);
    return 1;
  }
  atexit(cli_hf_free_);
  *model = cli_hf_path_;
  return 0;
}

#endif
