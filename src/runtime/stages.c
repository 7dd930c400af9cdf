/* stages.c: parsing and checking anna_context_options.layer_split (stages.h). */
#include "runtime/stages.h"

#include "base/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int stages_plan(const char *split, int n_devices, int n_layers, int *counts, int *n_stages, char *err, size_t errlen) {
  *n_stages = 1;
  counts[0] = n_layers;
  if (!split) {
    if (n_devices > 1)
      return anna_err(err, errlen, ANNA_EINVAL, "%d devices given without --layer-split (one device per stage)",
                      n_devices);
    return 0;
  }
  if (n_layers < 1) return anna_err(err, errlen, ANNA_EINVAL, "--layer-split: the model has no layers to split");
  int S = 0;
  if (!strcmp(split, "auto")) {
    S = n_devices;
    if (S > n_layers)
      return anna_err(err, errlen, ANNA_EINVAL, "--layer-split auto: %d devices for a model of %d layers", S,
                      n_layers);
    for (int i = 0; i < S; i++) counts[i] = n_layers / S + (i < n_layers % S);
  } else {
    const char *p = split;
    int sum = 0;
    for (;;) {
      if (S == STAGES_MAX)
        return anna_err(err, errlen, ANNA_EINVAL, "--layer-split '%s': more than %d stages", split, STAGES_MAX);
      char *e;
      errno = 0;
      const long v = strtol(p, &e, 10);
      if (e == p || (*e && *e != ',') || errno || v > n_layers || v < 0 || *p == '-' || *p == '+' || *p == ' ')
        return anna_err(err, errlen, ANNA_EINVAL,
                        "--layer-split '%s': expected auto or layer counts like 12,12 (stage %d is not a count of "
                        "0..%d)",
                        split, S, n_layers);
      if (v == 0)
        return anna_err(err, errlen, ANNA_EINVAL, "--layer-split '%s': stage %d has no layers (each needs >= 1)", split,
                        S);
      counts[S++] = (int)v;
      sum += (int)v;
      if (!*e) break;
      p = e + 1;
    }
    if (S > n_layers)
      return anna_err(err, errlen, ANNA_EINVAL, "--layer-split '%s': %d stages for a model of %d layers", split, S,
                      n_layers);
    if (sum != n_layers)
      return anna_err(err, errlen, ANNA_EINVAL, "--layer-split '%s': the stages hold %d layers; the model has %d",
                      split, sum, n_layers);
  }
  if (n_devices != 1 && n_devices != S)
    return anna_err(err, errlen, ANNA_EINVAL, "--layer-split: %d stages but %d devices (give one per stage, or one)",
                    S, n_devices);
  *n_stages = S;
  return 0;
}
