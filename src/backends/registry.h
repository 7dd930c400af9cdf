/* registry.h: the backends compiled into this build, and the one way to create one.
 *
 * Each backend is one registry entry (name, available(), create()); the runtime picks a
 * device by name through backend_registry_pick and never includes a backend's own header
 * or tests a build flag: everything it does afterwards goes through the ops_backend table
 * (ops.h), lifecycle entries included. The CPU backend is always compiled in; CUDA when
 * the build has it (ANNA_HAVE_CUDA, tested here and nowhere else outside src/backends/).
 * Entries are static: nothing here is freed.
 */
#ifndef ANNA_BACKENDS_REGISTRY_H
#define ANNA_BACKENDS_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "base/threadpool.h"
#include "base/tuning.h"
#include "ops/ops.h"

/* What creating a backend needs. Pointers are borrowed for the call only, except tp (see
 * there). */
typedef struct backend_params {
  int n_threads;            /* CPU: workers of the pool it creates (<= 0: one per core) */
  int device_index;         /* device backends: the ordinal ("cuda:N"; 0 for "cuda") */
  threadpool *tp;           /* CPU: an existing pool to use instead (borrowed; must outlive the backend) */
  int64_t n_batch;          /* most tokens of one forward call */
  int exact_matmul;         /* --exact: f32 activations and arithmetic everywhere */
  int gemm_bf16_single;     /* compute dtype bf16: activations rounded once to bf16 (device GEMMs) */
  int profile;              /* the caller wraps the table with ops_profile: no recorded steps */
  const ops_model_shape *shape; /* the model the backend sizes its scratch for (required) */
  const anna_tuning *tuning;    /* runtime switches (NULL: tuning_defaults) */
  /* MoE expert offload (anna_context_options, resolved): offload_experts 1 puts the routed
   * experts of shape->layers[].exp_* in an expert cache (backends that cannot refuse with
   * ANNA_EUNSUPPORTED); sizes in bytes as the public options, host_memory_limit < 0: none
   * mirrored, 0: all. */
  int offload_experts;
  int64_t gpu_memory_limit, expert_cache_bytes, host_memory_limit, reserve_bytes;
  int cached_experts_per_layer, expert_swap_every;
} backend_params;

typedef struct backend_info {
  const char *name; /* "cpu", "cuda" */
  /* 1 when the backend can run here (a device present); never fails loudly. */
  int (*available)(void);
  /* Caller frees *out with (*out)->destroy(*out). 0 or a negative ANNA_E* with a message. */
  int (*create)(const backend_params *p, ops_backend **out, char *err, size_t errlen);
  /* 1: the backend computes the bf16 compute dtype (anna_model_options.dtype "bf16"). */
  int bf16_compute;
  /* 1: the backend takes backend_params.offload_experts (MoE expert offload). */
  int expert_offload;
  /* What "device '<name>': ..." says when the backend is compiled in but cannot run here. */
  const char *missing;
  /* Devices of this kind visible to the process (CUDA honours CUDA_VISIBLE_DEVICES); the CPU
   * is one. */
  int (*count)(void);
  /* Device i's name into name[len] and its memory in bytes (0: unknown); 0 or negative. */
  int (*describe)(int i, char *name, size_t len, int64_t *mem_bytes);
} backend_info;

/* Most entries of a device list ("cuda:0,cuda:1", one per pipeline stage). */
#define BACKEND_MAX_DEVICES 16

/* One resolved device: its backend and ordinal. */
typedef struct backend_device {
  const backend_info *bi;
  int index;
} backend_device;

/* Number of compiled backends and the i-th (0 is "cpu"); NULL past the end. */
int backend_registry_count(void);
const backend_info *backend_registry_get(int i);
/* The compiled backend of that name, or NULL. */
const backend_info *backend_registry_find(const char *name);

/* Resolves a device name: NULL and "cpu" are the CPU; "auto" the first device backend that
 * is available, else the CPU; any other name must be a compiled, available backend.
 * ANNA_EUNSUPPORTED with the message the public API documents ("device 'x' is not available
 * in this build (have: cpu)", "device 'cuda': no CUDA device found", ...). */
int backend_registry_pick(const char *device, const backend_info **out, char *err, size_t errlen);

/* A device list: comma-separated names as backend_registry_pick takes them, each optionally
 * ":N" for the ordinal ("cuda:1"; default 0; "cpu:N" only N = 0). Up to max entries into
 * out[], their number into *n (NULL device: one "cpu"). ANNA_EUNSUPPORTED as pick, or naming
 * the devices there are ("device 'cuda:3': only 2 cuda devices (0..1)"); ANNA_EINVAL for an
 * empty entry, a bad ordinal or more than max entries. */
int backend_registry_pick_list(const char *devices, backend_device *out, int max, int *n, char *err, size_t errlen);

#endif
