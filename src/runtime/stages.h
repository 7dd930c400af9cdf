/* stages.h: the layer split of a context (anna_context_options.layer_split) as a plan: how
 * many stages, and how many consecutive layers each runs. A pure function of the option
 * string, the number of devices given and the model's layer count; context.c creates the
 * stages' backends and hands the plan to the model's state (fwd_state_options). */
#ifndef ANNA_RUNTIME_STAGES_H
#define ANNA_RUNTIME_STAGES_H

#include <stddef.h>

/* Most pipeline stages of one context (the device list's limit, registry.h). */
#define STAGES_MAX 16

/* split: NULL (one stage of every layer), "auto" (n_devices stages, layers as even as they
 * go, the earlier stages taking the remainder) or "N,N,..." (each N >= 1, summing to
 * n_layers). n_devices: the entries of the device list; a split of S stages needs S devices
 * or one (shared by every stage). Writes counts[0 .. *n_stages). ANNA_EINVAL naming what is
 * wrong: an empty or non-numeric entry, a zero-size stage, a sum other than n_layers, more
 * stages than layers or than STAGES_MAX, a device count that does not match. */
int stages_plan(const char *split, int n_devices, int n_layers, int *counts, int *n_stages, char *err, size_t errlen);

#endif
