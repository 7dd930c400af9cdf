/* media_device.h: the optional device flags of the public-API media tests (test_vision_api,
 * test_video_api, test_asr_api, test_speech_api), so the same checks run on a GPU:
 *     --device D     the context's / speech object's device ("cuda", "cuda:1", "auto"; default cpu)
 *     --exact        anna_context_options.exact_matmul (f32 matmuls on the device too)
 *     --tuning S     anna_context_options.tuning ("encoder_cpu=1": the encoders on the CPU)
 * A device that this build or host lacks makes the test exit 77 (ctest SKIP_RETURN_CODE) with
 * one "SKIP" line. With a device, media_device_encoder_diff isolates the encoder: the same
 * prefill on a second context of the same options with tuning encoder_cpu=1 (the encoder on
 * the CPU, the decoder on the device), compared row for row. Header-only: static functions. */
#ifndef ANNA_TESTS_MEDIA_DEVICE_H
#define ANNA_TESTS_MEDIA_DEVICE_H

#include "anna/anna.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct media_device {
  const char *device; /* NULL: the cpu */
  int exact;
  const char *tuning; /* NULL: none */
} media_device;

/* Reads the flags from argv[first..argc); 0, or -1 (message printed) for an unknown flag. */
static inline int media_device_parse(media_device *d, int argc, char **argv, int first) {
  memset(d, 0, sizeof *d);
  for (int i = first; i < argc; i++) {
    if (!strcmp(argv[i], "--device") && i + 1 < argc) d->device = argv[++i];
    else if (!strcmp(argv[i], "--exact")) d->exact = 1;
    else if (!strcmp(argv[i], "--tuning") && i + 1 < argc) d->tuning = argv[++i];
    else {
      fprintf(stderr, "unknown argument '%s' (have: --device D, --exact, --tuning S)\n", argv[i]);
      return -1;
    }
  }
  if (d->device || d->exact || d->tuning)
    printf("device %s%s%s%s\n", d->device ? d->device : "cpu", d->exact ? ", exact" : "", d->tuning ? ", tuning " : "",
           d->tuning ? d->tuning : "");
  return 0;
}

/* 1 (one "SKIP" line printed) when d names a CUDA device and this build or host has none: the
 * tests ask before they load anything, so a skip leaves nothing allocated (LeakSanitizer). */
static inline int media_device_absent(const media_device *d) {
  if (!d->device || strncmp(d->device, "cuda", 4)) return 0;
  char buf[4096];
  anna_devices_list(buf, sizeof buf);
  for (const char *p = buf; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
    if (!strncmp(p, "cuda", 4)) return 0;
  printf("SKIP: no CUDA device in this build or on this host (asked for %s)\n", d->device);
  return 1;
}

/* 1 when rc/err say the device is missing here (not compiled in, or no such device). */
static inline int media_device_missing(int rc, const char *err) {
  return rc == ANNA_EUNSUPPORTED &&
         (strstr(err, "not available") || strstr(err, "no CUDA device") || strstr(err, "only "));
}

/* Max |lg - x| over vocab, where x is p's last-row logits (sequence 0) on a context of *co's
 * options plus tuning encoder_cpu=1; INFINITY (message printed) when that fails. */
static inline double media_device_encoder_diff(anna_model *m, const anna_context_options *co, const anna_prompt *p,
                                               const float *lg, int vocab) {
  char tun[512], err[512];
  snprintf(tun, sizeof tun, "%s%sencoder_cpu=1", co->tuning ? co->tuning : "", co->tuning ? "," : "");
  anna_context_options o = *co;
  o.tuning = tun;
  anna_context *c = NULL;
  float *x = malloc(sizeof(float) * (size_t)vocab);
  int rc = x ? anna_context_create(&c, m, &o, err, sizeof err) : -1;
  if (!rc) rc = anna_context_prefill(c, 0, p, x, err, sizeof err);
  double d = rc ? INFINITY : 0;
  if (rc) printf("  encoder_cpu=1 context: %s\n", err);
  for (int i = 0; !rc && i < vocab; i++) d = fmax(d, fabs((double)lg[i] - x[i]));
  anna_context_free(c);
  free(x);
  return d;
}

#endif
