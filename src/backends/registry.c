/* registry.c: the table of compiled backends. The only place outside a backend's own
 * folder that knows which backends exist (and the only build-flag test outside them). */
#include "backends/registry.h"

#include "backends/cpu/cpu_backend.h"
#include "base/error.h"
#ifdef ANNA_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cpu_available(void) {
  return 1;
}

static int cpu_count(void) {
  return 1;
}

static int cpu_describe(int i, char *name, size_t len, int64_t *mem) {
  if (i != 0) return ANNA_ERANGE;
  snprintf(name, len, "cpu");
  *mem = 0;
  return 0;
}

#ifdef ANNA_HAVE_CUDA
/* The glue between backend_params and the CUDA constructor lives on the C side: the anna_cuda
 * library needs nothing from anna's objects at link time (it only reads anna_tuning's fields). */
static int cuda_create(const backend_params *p, ops_backend **out, char *err, size_t errlen) {
  anna_tuning t;
  if (p->tuning) t = *p->tuning;
  else tuning_defaults(&t);
  int rc = cuda_backend_create_device(out, p->device_index, p->n_batch, &t, err, errlen);
  if (rc) return rc;
  cuda_backend_set_exact(*out, p->exact_matmul);
  if (p->gemm_bf16_single) cuda_backend_set_gemm_variant(*out, CUDA_GEMM_BF16_SINGLE);
  if (p->offload_experts) {
    const cuda_offload_params op = {.gpu_memory_limit = p->gpu_memory_limit,
                                    .expert_cache_bytes = p->expert_cache_bytes,
                                    .host_memory_limit = p->host_memory_limit,
                                    .reserve_bytes = p->reserve_bytes,
                                    .cached_experts_per_layer = p->cached_experts_per_layer,
                                    .swap_every = p->expert_swap_every,
                                    .no_prefill_stream = !t.cuda_offload_prefill_stream};
    if ((rc = cuda_backend_set_offload(*out, p->shape, &op, err, errlen))) {
      (*out)->destroy(*out);
      *out = NULL;
      return rc;
    }
  }
  /* Graphs stay off until the caller's warm-up has run (set_graphs): a profiled context
   * syncs around every op, which a recorded graph cannot do. */
  return 0;
}

/* The environment-reading constructor tests/cuda and older callers use: ANNA_TUNING's cuda_*
 * keys as the context would apply them. */
int cuda_backend_create(ops_backend **out, int64_t max_batch, char *err, size_t errlen) {
  *out = NULL;
  anna_tuning t;
  int rc = tuning_from_env(&t, NULL, err, errlen);
  return rc ? rc : cuda_backend_create_tuned(out, max_batch, &t, err, errlen);
}
#endif

static const backend_info backends[] = {
    {.name = "cpu", .available = cpu_available, .create = cpu_backend_create_params, .bf16_compute = 0,
     .missing = "not available", .count = cpu_count, .describe = cpu_describe},
#ifdef ANNA_HAVE_CUDA
    {.name = "cuda", .available = cuda_backend_available, .create = cuda_create, .bf16_compute = 1, .expert_offload = 1,
     .missing = "no CUDA device found", .count = cuda_backend_device_count, .describe = cuda_backend_describe},
#endif
};
#define N_BACKENDS ((int)(sizeof backends / sizeof backends[0]))

int backend_registry_count(void) {
  return N_BACKENDS;
}

const backend_info *backend_registry_get(int i) {
  return i >= 0 && i < N_BACKENDS ? &backends[i] : NULL;
}

const backend_info *backend_registry_find(const char *name) {
  for (int i = 0; name && i < N_BACKENDS; i++)
    if (!strcmp(backends[i].name, name)) return &backends[i];
  return NULL;
}

int backend_registry_pick(const char *device, const backend_info **out, char *err, size_t errlen) {
  *out = &backends[0];
  if (!device || !strcmp(device, "cpu")) return 0;
  if (!strcmp(device, "auto")) {
    for (int i = 1; i < N_BACKENDS; i++)
      if (backends[i].available()) {
        *out = &backends[i];
        return 0;
      }
    return 0;
  }
  const backend_info *b = backend_registry_find(device);
  if (b) {
    if (!b->available()) return anna_err(err, errlen, ANNA_EUNSUPPORTED, "device '%s': %s", device, b->missing);
    *out = b;
    return 0;
  }
  /* "(have: cpu)" in a CPU-only build; "(have: cpu, cuda, auto)" when there is a choice. */
  char have[128] = "";
  for (int i = 0; i < N_BACKENDS; i++) {
    size_t l = strlen(have);
    snprintf(have + l, sizeof have - l, "%s%s", i ? ", " : "", backends[i].name);
  }
  if (N_BACKENDS == 1)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "device '%s' is not available in this build (have: %s)", device,
                    have);
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "device '%s' is not available (have: %s, auto)", device, have);
}

int backend_registry_pick_list(const char *devices, backend_device *out, int max, int *n, char *err, size_t errlen) {
  *n = 0;
  if (!devices) {
    out[0] = (backend_device){&backends[0], 0};
    *n = 1;
    return 0;
  }
  const char *p = devices;
  for (;;) {
    const char *end = strchr(p, ',');
    const size_t len = end ? (size_t)(end - p) : strlen(p);
    char one[64];
    if (len == 0 || len >= sizeof one)
      return anna_err(err, errlen, ANNA_EINVAL, "device list '%s': %s entry", devices, len ? "an overlong" : "an empty");
    if (*n == max)
      return anna_err(err, errlen, ANNA_EINVAL, "device list '%s': more than %d devices", devices, max);
    memcpy(one, p, len);
    one[len] = 0;
    int index = 0;
    char *colon = strchr(one, ':');
    if (colon) {
      *colon = 0;
      char *e;
      errno = 0;
      const long v = strtol(colon + 1, &e, 10);
      if (e == colon + 1 || *e || errno || v < 0 || v > 1024)
        return anna_err(err, errlen, ANNA_EINVAL, "device '%s:%s': the ordinal must be a number >= 0", one, colon + 1);
      index = (int)v;
    }
    const backend_info *bi;
    int rc = backend_registry_pick(one, &bi, err, errlen);
    if (rc) return rc;
    const int have = bi->count ? bi->count() : 1;
    if (index >= have) {
      if (bi == &backends[0])
        return anna_err(err, errlen, ANNA_EUNSUPPORTED, "device 'cpu:%d': there is one cpu device (cpu:0)", index);
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "device '%s:%d': only %d %s device%s visible (0..%d; CUDA_VISIBLE_DEVICES selects them)", one,
                      index, have, bi->name, have == 1 ? "" : "s", have - 1);
    }
    out[(*n)++] = (backend_device){bi, index};
    if (!end) return 0;
    p = end + 1;
  }
}
