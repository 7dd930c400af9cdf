/* cuda_offload.cu: MoE expert offload on the CUDA backend (cuda_backend.h,
 * cuda_backend_set_offload; issue #27). The policy is the cache layer's expert_store; this
 * file is its device side:
 * - one device arena of slots (each expert's gate, up and down rows at 16-byte aligned
 *   offsets, so the int8 decode kernels' piece loads apply), the layer's cache slots and
 *   the staging slots of the layer being computed;
 * - per offloaded layer a table of 3E row pointers (pinned host copy + device copy) in the
 *   layout moe_table builds, pointing at slots, so the existing decode kernels
 *   (moe_ffn_decode_tab) run unchanged: only the routed experts' entries are read, and each
 *   call rewrites those before its kernels;
 * - a copy stream: the routed misses are copied from the pinned host mirror (or, for the
 *   experts the host limit left out, from the weights' host mapping through a pinned
 *   staging buffer) after an event recorded on the compute stream, and the compute stream
 *   waits for an event after the copies. So every copy into a slot follows all work queued
 *   before it (a slot read by an earlier kernel is never overwritten early) and precedes the
 *   kernels that read it.
 * Decode: the routed ids are read back per layer (one stream sync; the rest of a recorded
 * step runs eagerly) and copies do not overlap compute of the same layer. Prefill (more
 * than CUDA_MOE_DECODE_MAX_TOK tokens, grouped path's types, not exact mode) streams
 * (off_prefill): one readback per layer chunk, each routed expert copied at most once,
 * copies of the next group overlapping the grouped GEMMs of this one; otherwise it runs
 * through the decode kernels in batches of CUDA_MOE_DECODE_MAX_TOK tokens.
 * Misses are always copied (no CPU compute of misses yet). */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_math.cuh"
#include "backends/cuda/cuda_quant.cuh"

#include "anna/anna.h" /* ANNA_E* */
#include "backends/cuda/cuda_offload_check.h"
#include "cache/expert_store.h"
#include "ops/ops.h"
#include "backends/cuda/cuda_moe.cuh" /* after ops/ops.h */

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* anna_err's contract, local: this library links nothing from anna's objects. */
static int off_err(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int off_err(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

#define OFF_PARTS 3 /* gate, up, down */

struct cuda_offload {
  cuda_offload_params p;
  int n_layers; /* offloaded layers, in model order */
  const ops_weight *gate[OPS_MAX_LAYERS], *up[OPS_MAX_LAYERS], *down[OPS_MAX_LAYERS];
  int E;
  /* blob layout of one expert, per offloaded layer (llama.cpp's Q4_K_M gives some layers' down
   * projections more bits, so expert sizes differ between layers); slots hold eb = the largest */
  int64_t part_off[OPS_MAX_LAYERS][OFF_PARTS], part_bytes[OPS_MAX_LAYERS][OFF_PARTS], leb[OPS_MAX_LAYERS], eb;
  int64_t dense_weight_bytes;
  expert_store *st; /* NULL until the first MoE call sizes it */
  int k;            /* routed slots per token the staging was sized for */
  uint8_t *arena;
  const uint8_t **tab_h, **tab_d; /* [n_layers][3][E] */
  int32_t *ids_h;                 /* pinned: one batch's routed ids */
  uint8_t *stage_h;               /* pinned: staging_slots blobs read from the mapping */
  expert_store_place *places, *swaps;
  cudaStream_t cs;
  cudaEvent_t ev_main, ev_copy;
  int64_t bytes_mirror, bytes_file;
  /* The GGUF file (ops_model_shape.weights_file): experts outside the mirror are read from
   * it by pread at (data - map); -1 (folders, or the file does not match the mapping): they
   * are copied from the mapping. */
  /* Zero-copy misses: every expert is in the pinned mirror and the device addresses host
   * memory (unified addressing), so the table points each non-cached expert at its mirror
   * copy and the kernels read a miss over PCIe themselves: no readback, no copy, decode steps
   * stay graphs. Routing counts come from a device counter per expert (counts_d), read at
   * each swap plan. */
  int zc;
  float *counts_d, *counts_h; /* [n_layers][E] */
  int fd;
  const char *map;
  int64_t map_bytes;
  char path[256];
  char summary[400]; /* what went where (cuda_offload_stats.summary) */
  char summary2[600]; /* summary plus the prefill traffic, rebuilt at each stats call */
  /* Prefill streaming (off_prefill): the chunk's routed ids (pinned), the pair lists built
   * from them (host), the device workspace (gathered x, per-pair y, ones, the grouped
   * path's scratch) and the double-buffer events of the two staging halves. Grown to the
   * largest chunk seen (prefill only; decode never touches them). */
  int64_t pf_cap; /* pairs the buffers hold */
  int32_t *pf_ids_h;  /* pinned [nk]: the routed ids read back */
  int32_t *pf_work;   /* host [3 (E + 1)]: counts, starts, experts in group order */
  uint8_t *pf_hh;     /* pinned: plist, idxl, inv [nk] each, then the groups' tables */
  uint8_t *pf_ws;     /* device: off_pf_layout */
  size_t pf_ws_bytes, pf_hh_bytes;
  cudaEvent_t ev_ready[2], ev_free[2];
  int64_t pf_bytes, pf_tokens, pf_chunks;
  int pf_oom; /* the last workspace allocation failed (chunks of that size take the decode batches) */
  /* layer calls by path (cuda_backend_offload_paths): what a test prints per step */
  int64_t n_zc, n_staged, n_declined;
};

/* expert_store_read_fn: the expert's rows from the model's host weights (its file mapping:
 * the page cache, or the disk when the pages are not resident). */
static int off_read(void *user, int layer, int expert, void *dst, size_t bytes, char *err, size_t errlen) {
  cuda_offload *o = (cuda_offload *)user;
  const ops_weight *w[OFF_PARTS] = {&o->gate[layer][expert], o->up[layer] ? &o->up[layer][expert] : NULL,
                                    &o->down[layer][expert]};
  if (bytes < (size_t)o->leb[layer]) return off_err(err, errlen, ANNA_EINVAL, "offload: expert buffer too small");
  for (int m = 0; m < OFF_PARTS; m++) {
    if (!w[m]) continue;
    const char *d = (const char *)w[m]->data;
    const int64_t pb = o->part_bytes[layer][m];
    uint8_t *to = (uint8_t *)dst + o->part_off[layer][m];
    if (o->fd >= 0 && d >= o->map && d + pb <= o->map + o->map_bytes) {
      int rc = expert_store_pread(o->fd, to, (size_t)pb, (int64_t)(d - o->map), o->path, err, errlen);
      if (rc) return rc;
    } else {
      memcpy(to, d, (size_t)pb);
    }
  }
  return 0;
}

static void *off_host_alloc(void *user, size_t bytes) {
  (void)user;
  void *p = NULL;
  /* mapped: the zero-copy path's kernels read it (under unified addressing at the same address) */
  if (cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError(); /* the mirror stops here; the rest is read from the file */
    return NULL;
  }
  return p;
}
static void off_host_free(void *user, void *p) {
  (void)user;
  cudaFreeHost(p);
}

static int layer_of(const cuda_offload *o, const ops_weight *gate) {
  for (int i = 0; i < o->n_layers; i++)
    if (o->gate[i] == gate) return i;
  return -1;
}

extern "C" int cuda_backend_set_offload(ops_backend *be, const ops_model_shape *shape, const cuda_offload_params *p,
                                        char *err, size_t errlen) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->offload) return off_err(err, errlen, ANNA_ESTATE, "expert offload: already set");
  cuda_offload *o = (cuda_offload *)calloc(1, sizeof *o);
  if (!o) return off_err(err, errlen, ANNA_ENOMEM, "out of memory");
  o->p = *p;
  o->dense_weight_bytes = shape->dense_weight_bytes;
  for (int l = 0; l < shape->n_layers; l++) {
    const ops_layer_shape *ls = &shape->layers[l];
    if (!ls->n_exp || !ls->exp_gate) continue;
    if (o->n_layers && ls->n_exp != o->E) {
      const int e0 = o->E;
      free(o);
      return off_err(err, errlen, ANNA_EUNSUPPORTED, "expert offload: layer %d has %d experts, others %d", l,
                     ls->n_exp, e0);
    }
    if (!moe_decode_types_ok(ls->n_exp, ls->exp_gate, ls->exp_up, ls->exp_down)) {
      free(o);
      return off_err(err, errlen, ANNA_EUNSUPPORTED,
                      "expert offload: layer %d's experts (%s) are not a type the decode kernels read, or differ in "
                      "shape",
                      l, dtype_name(ls->exp_gate[0].type));
    }
    const ops_weight *w[OFF_PARTS] = {&ls->exp_gate[0], ls->exp_up ? &ls->exp_up[0] : NULL, &ls->exp_down[0]};
    if (o->n_layers && (!w[1]) != (!o->up[0])) {
      free(o);
      return off_err(err, errlen, ANNA_EUNSUPPORTED,
                     "expert offload: layer %d's experts are %s gate/up, the first MoE layer's are not", l,
                     w[1] ? "separate" : "fused");
    }
    const int li = o->n_layers;
    int64_t off = 0;
    for (int m = 0; m < OFF_PARTS; m++) {
      const int64_t b = w[m] ? dtype_row_bytes(w[m]->type, w[m]->cols) * w[m]->rows : 0;
      o->part_off[li][m] = off;
      o->part_bytes[li][m] = b;
      off += (b + 15) / 16 * 16;
    }
    o->leb[li] = off;
    if (off > o->eb) o->eb = off;
    o->E = ls->n_exp;
    o->gate[o->n_layers] = ls->exp_gate;
    o->up[o->n_layers] = ls->exp_up;
    o->down[o->n_layers] = ls->exp_down;
    o->n_layers++;
  }
  if (!o->n_layers) {
    free(o);
    return off_err(err, errlen, ANNA_EUNSUPPORTED, "expert offload: the model has no routed experts");
  }
  if (p->gpu_memory_limit > 0 && p->gpu_memory_limit < o->dense_weight_bytes + o->eb) {
    const long long eb = (long long)o->eb, need = (long long)o->dense_weight_bytes + eb;
    free(o);
    return off_err(err, errlen, ANNA_EINVAL,
                   "--gpu-memory-limit %lld bytes is below the %lld bytes needed: the dense weights alone are %lld "
                   "bytes (plus one expert of %lld, the KV cache and scratch)",
                   (long long)p->gpu_memory_limit, need, need - eb, eb);
  }
  o->fd = -1;
  if (shape->weights_file && shape->weights_map && shape->weights_map_bytes > 0) {
    /* the file the mapping came from, when it still is that file (same size) */
    int fd = open(shape->weights_file, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0 && (int64_t)sb.st_size == shape->weights_map_bytes) {
      o->fd = fd;
      o->map = (const char *)shape->weights_map;
      o->map_bytes = shape->weights_map_bytes;
      snprintf(o->path, sizeof o->path, "%s", shape->weights_file);
    } else if (fd >= 0) {
      close(fd);
    }
  }
  ci->offload = o;
  return 0;
}

/* Bytes of the weight mirrors made so far (dense weights: experts of offloaded layers are
 * never mirrored). */
static int64_t mirrored_bytes(const cuda_impl *ci) {
  int64_t b = 0;
  for (size_t i = 0; i < ci->map_cap; i++)
    if (ci->map[i].host) b += (int64_t)ci->map[i].bytes;
  return b;
}

/* Copies one expert's blob to a device slot on the copy stream: straight from the pinned
 * mirror, else read into the pinned staging blob `stage` first (the caller makes sure no
 * earlier copy from that blob is pending). */
static bool off_copy(cuda_impl *ci, cuda_offload *o, int layer, int expert, int slot, uint8_t *stage) {
  const void *src = expert_store_host_ptr(o->st, layer, expert);
  const int64_t lb = o->leb[layer];
  if (src) {
    expert_store_count_dma(o->st, lb);
    o->bytes_mirror += lb;
  } else {
    char e[256];
    int rc = expert_store_fetch(o->st, layer, expert, stage, e, sizeof e);
    if (rc) {
      cuda_fail(ci, rc, "%s", e);
      return false;
    }
    o->bytes_file += lb;
    src = stage;
  }
  return cuda_check(ci,
                    cudaMemcpyAsync(o->arena + (int64_t)slot * o->eb, src, (size_t)lb, cudaMemcpyHostToDevice, o->cs),
                    "offload expert copy");
}

/* Points the layer's host table entries for expert e at slot. */
static void off_point(cuda_offload *o, int layer, int e, int slot) {
  const uint8_t **t = o->tab_h + (int64_t)layer * OFF_PARTS * o->E;
  for (int m = 0; m < OFF_PARTS; m++)
    t[(int64_t)m * o->E + e] = o->part_bytes[layer][m] ? o->arena + (int64_t)slot * o->eb + o->part_off[layer][m] : NULL;
}

/* Zero-copy: points the layer's host table entries for expert e at its mirror copy. */
static void off_point_mirror(cuda_offload *o, int layer, int e) {
  const uint8_t *h = (const uint8_t *)expert_store_host_ptr(o->st, layer, e);
  const uint8_t **t = o->tab_h + (int64_t)layer * OFF_PARTS * o->E;
  for (int m = 0; m < OFF_PARTS; m++)
    t[(int64_t)m * o->E + e] = h && o->part_bytes[layer][m] ? h + o->part_off[layer][m] : NULL;
}

/* Counts the routed ids of a layer call: one relaxed atomic per (token, slot). */
static __global__ void k_offload_count(const int32_t *idx, int64_t nk, int E, float *counts) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nk) return;
  const int e = idx[i];
  if (e >= 0 && e < E) atomicAdd(&counts[e], 1.0f);
}

static size_t off_pf_layout(const cuda_offload *o, int64_t nk, int H, int64_t I, int G, size_t at[8]);

/* Sizes and fills the store at the first MoE call (the KV cache and scratch exist by then). */
static bool off_open(cuda_impl *ci, cuda_offload *o, int k) {
  size_t f = 0, t = 0;
  if (!cuda_check(ci, cudaStreamSynchronize(ci->stream), "offload sync") ||
      !cuda_check(ci, cudaMemGetInfo(&f, &t), "offload memory query"))
    return false;
  const int64_t since = (int64_t)ci->free_at_create - (int64_t)f;
  int64_t other = since - mirrored_bytes(ci); /* KV pool, scratch, rings */
  if (other < 0) other = 0;
  const int S = CUDA_MOE_DECODE_MAX_TOK * k < o->E ? CUDA_MOE_DECODE_MAX_TOK * k : o->E;
  const int64_t tables = (int64_t)o->n_layers * OFF_PARTS * o->E * (int64_t)sizeof(void *);
  expert_store_params sp;
  memset(&sp, 0, sizeof sp);
  sp.n_layers = o->n_layers;
  sp.n_experts = o->E;
  sp.expert_bytes = o->eb;
  sp.device_budget = o->p.gpu_memory_limit > 0 ? o->p.gpu_memory_limit : (int64_t)ci->free_at_create;
  /* the prefill streaming workspace of a full batch (off_pf_layout), allocated at the first
   * long chunk: kept out of the expert cache */
  int64_t pf = 0;
  {
    const ops_weight *g0 = &o->gate[0][0];
    const int64_t H = g0->cols, I = o->up[0] ? o->up[0][0].rows : g0->rows / 2, nk = ci->max_batch * k;
    if (ci->max_batch > CUDA_MOE_DECODE_MAX_TOK && !o->p.no_prefill_stream) {
      size_t at[8];
      const int Sh = S >= 2 ? S / 2 : 1;
      pf = (int64_t)off_pf_layout(o, nk, (int)H, I, 1 + (o->E + Sh - 1) / Sh, at);
    }
  }
  sp.dense_bytes = o->dense_weight_bytes + other + o->p.reserve_bytes + tables + pf;
  sp.cache_bytes = o->p.expert_cache_bytes > 0 ? o->p.expert_cache_bytes : -1;
  sp.slots_per_layer = o->p.cached_experts_per_layer;
  sp.staging_slots = S;
  sp.host_budget = o->p.host_memory_limit == 0 ? -1 : o->p.host_memory_limit < 0 ? 0 : o->p.host_memory_limit;
  sp.chunk_bytes = (int64_t)1 << 30;
  sp.swap_every = o->p.swap_every > 0 ? o->p.swap_every : 8;
  sp.decay = 0.5f;
  sp.read = off_read;
  sp.read_user = o;
  sp.host_alloc = off_host_alloc;
  sp.host_free = off_host_free;
  char e[512];
  int rc = expert_store_open(&o->st, &sp, e, sizeof e);
  if (rc) {
    cuda_fail(ci, rc, "expert offload: %s", e);
    return false;
  }
  o->k = k;
  const int n_slots = expert_store_n_slots(o->st), C = expert_store_cache_per_layer(o->st);
  const size_t arena = (size_t)n_slots * (size_t)o->eb;
  if (cudaMalloc(&o->arena, arena) != cudaSuccess) {
    (void)cudaGetLastError();
    o->arena = NULL;
    cuda_fail(ci, ANNA_ENOMEM, "expert offload: no room for %d expert slots (%zu bytes) on the device", n_slots,
              arena);
    return false;
  }
  const size_t tab_n = (size_t)o->n_layers * OFF_PARTS * (size_t)o->E;
  if (!cuda_check(ci, cudaHostAlloc((void **)&o->tab_h, tab_n * sizeof(void *), cudaHostAllocDefault), "offload table") ||
      !cuda_check(ci, cudaMalloc((void **)&o->tab_d, tab_n * sizeof(void *)), "offload device table") ||
      !cuda_check(ci, cudaHostAlloc((void **)&o->ids_h, (size_t)CUDA_MOE_DECODE_MAX_TOK * k * sizeof(int32_t),
                                    cudaHostAllocDefault),
                  "offload ids") ||
      !cuda_check(ci, cudaHostAlloc((void **)&o->stage_h, (size_t)S * (size_t)o->eb, cudaHostAllocDefault),
                  "offload staging") ||
      !cuda_check(ci, cudaStreamCreateWithFlags(&o->cs, cudaStreamNonBlocking), "offload stream") ||
      !cuda_check(ci, cudaEventCreateWithFlags(&o->ev_main, cudaEventDisableTiming), "offload event") ||
      !cuda_check(ci, cudaEventCreateWithFlags(&o->ev_copy, cudaEventDisableTiming), "offload event"))
    return false;
  memset(o->tab_h, 0, tab_n * sizeof(void *));
  o->places = (expert_store_place *)malloc(sizeof *o->places * (size_t)CUDA_MOE_DECODE_MAX_TOK * k);
  o->swaps = (expert_store_place *)malloc(sizeof *o->swaps * (size_t)(C * o->n_layers > 0 ? C * o->n_layers : 1));
  if (!o->places || !o->swaps) {
    cuda_fail(ci, ANNA_ENOMEM, "expert offload: out of host memory");
    return false;
  }
  /* the initial residents, through the staging blobs S at a time */
  int j = 0;
  for (int s = 0; s < C * o->n_layers && !ci->err; s++) {
    int l, ex;
    expert_store_slot_owner(o->st, s, &l, &ex);
    if (l < 0) continue;
    if (j == S) {
      if (!cuda_check(ci, cudaStreamSynchronize(o->cs), "offload fill")) return false;
      j = 0;
    }
    off_point(o, l, ex, s);
    if (!off_copy(ci, o, l, ex, s, o->stage_h + (int64_t)j++ * o->eb)) return false;
  }
  {
    expert_store_stats ss;
    expert_store_get_stats(o->st, &ss);
    int uva = 0;
    if (cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, ci->device) != cudaSuccess) {
      (void)cudaGetLastError();
      uva = 0;
    }
    o->zc = uva && ss.mirrored == (int64_t)o->n_layers * o->E && !o->p.no_zero_copy;
  }
  if (o->zc) {
    const size_t cn = (size_t)o->n_layers * (size_t)o->E;
    if (!cuda_check(ci, cudaMalloc((void **)&o->counts_d, cn * sizeof(float)), "offload counters") ||
        !cuda_check(ci, cudaMemset(o->counts_d, 0, cn * sizeof(float)), "offload counters") ||
        !cuda_check(ci, cudaHostAlloc((void **)&o->counts_h, cn * sizeof(float), cudaHostAllocDefault),
                    "offload counters"))
      return false;
    const int32_t *tab = expert_store_table(o->st);
    for (int l = 0; l < o->n_layers; l++)
      for (int x = 0; x < o->E; x++)
        if (tab[(int64_t)l * o->E + x] < 0) off_point_mirror(o, l, x);
  }
  if (!cuda_check(ci, cudaMemcpyAsync(o->tab_d, o->tab_h, tab_n * sizeof(void *), cudaMemcpyHostToDevice, o->cs),
                  "offload table upload") ||
      !cuda_check(ci, cudaStreamSynchronize(o->cs), "offload fill"))
    return false;
  {
    expert_store_stats ss;
    expert_store_get_stats(o->st, &ss);
    snprintf(o->summary, sizeof o->summary,
             "expert offload: %d layers x %d experts of %lld bytes; %d cached per layer + %d staging slots (%zu "
             "bytes on the device); %lld experts in %lld bytes of pinned host mirror, %lld read from %s; "
             "dense %lld bytes; swaps every %d steps; misses %s",
             o->n_layers, o->E, (long long)o->eb, C, S, arena, (long long)ss.mirrored, (long long)ss.mirror_bytes,
             (long long)o->n_layers * o->E - ss.mirrored, o->fd >= 0 ? "the file (pread)" : "the weights' mapping",
             (long long)sp.dense_bytes, sp.swap_every,
             o->zc ? "read by the kernels from the pinned mirror (zero-copy)" : "copied into staging slots");
  }
  return true;
}

/* xg[r] = x[plist[r] / k]: each (token, slot) pair's activations, in the chunk's pair order. */
static __global__ void k_off_gather(float *xg, const float *x, const int32_t *plist, int64_t m, int H, int k) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m * H; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / H;
    xg[i] = x[(int64_t)(plist[r] / k) * H + i % H];
  }
}
static __global__ void k_off_fill(float *p, int64_t n, float v) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

/* The prefill workspace of nk pairs and G groups: device byte offsets (256-aligned) of the
 * gathered x [nk, H] f32, the pairs' y [nk, H] f32, ones [nk] f32, plist / idxl / inv [nk]
 * int32 each, G tables of 3E pointers, the grouped path's scratch (k = 1 over nk pairs);
 * returns the total. The host twin (pinned) holds the ints and tables at hh offsets 0 and
 * at[6]. Not the argument ring: a wrap mid-call would reuse memory later kernels read. */
static size_t off_pf_layout(const cuda_offload *o, int64_t nk, int H, int64_t I, int G, size_t at[8]) {
  const size_t sz[6] = {(size_t)(nk * H) * 4, (size_t)(nk * H) * 4, (size_t)nk * 4, (size_t)nk * 12,
                        (size_t)G * OFF_PARTS * o->E * sizeof(void *), (size_t)ops_moe_scratch_floats(nk, 1, H, (int)I) * 4};
  size_t off = 0;
  for (int i = 0; i < 6; i++) {
    at[i] = off;
    off = (off + sz[i] + 255) & ~(size_t)255;
  }
  at[6] = ((size_t)nk * 12 + 15) & ~(size_t)15; /* host: the tables after the ints */
  at[7] = at[6] + sz[4];                        /* host bytes */
  return off;
}

/* Grows the prefill buffers to nk pairs and G groups; false with the error set. */
static bool off_prefill_reserve(cuda_impl *ci, cuda_offload *o, int64_t nk, int H, int64_t I, int G) {
  size_t at[8];
  const size_t need = off_pf_layout(o, nk, H, I, G, at);
  o->pf_oom = 0;
  if (nk <= o->pf_cap && need <= o->pf_ws_bytes && at[7] <= o->pf_hh_bytes) return true;
  if (!cuda_check(ci, cudaStreamSynchronize(ci->stream), "offload prefill sync")) return false;
  if (o->pf_ids_h) cudaFreeHost(o->pf_ids_h);
  if (o->pf_hh) cudaFreeHost(o->pf_hh);
  free(o->pf_work);
  if (o->pf_ws) cudaFree(o->pf_ws);
  o->pf_ids_h = NULL, o->pf_hh = NULL, o->pf_work = NULL, o->pf_ws = NULL;
  o->pf_cap = 0, o->pf_ws_bytes = 0, o->pf_hh_bytes = 0;
  if (!cuda_check(ci, cudaHostAlloc((void **)&o->pf_ids_h, (size_t)nk * sizeof(int32_t), cudaHostAllocDefault),
                  "offload prefill ids") ||
      !cuda_check(ci, cudaHostAlloc((void **)&o->pf_hh, at[7], cudaHostAllocDefault), "offload prefill lists"))
    return false;
  o->pf_work = (int32_t *)malloc(sizeof(int32_t) * (size_t)(3 * ((int64_t)o->E + 1)));
  if (!o->pf_work) {
    cuda_fail(ci, ANNA_ENOMEM, "expert offload: out of host memory");
    return false;
  }
  if (cudaMalloc((void **)&o->pf_ws, need) != cudaSuccess) {
    (void)cudaGetLastError();
    o->pf_ws = NULL;
    o->pf_oom = 1; /* the caller falls back to the decode batches (no workspace needed) */
    return false;
  }
  o->pf_cap = nk, o->pf_ws_bytes = need, o->pf_hh_bytes = at[7];
  return true;
}

/* Prefill streaming: a layer call of many tokens. The routed ids of the whole chunk are read
 * back once; the pairs are grouped by expert on the host: first the experts cached on the
 * device (computed from their cache slots, no copy), then the misses in groups of half the
 * staging slots. Group g + 1's experts are copied (mirror DMA, or pread into the pinned
 * staging blobs) on the copy stream into the other half while group g's grouped GEMMs run
 * on the compute stream: ev_ready[h] orders a half's copies before its kernels, ev_free[h]
 * its kernels before the next copies into it. Each routed expert is read once per chunk.
 * Each group runs the grouped prefill path (moe_ffn_grouped_tab) as one token per pair on
 * the gathered activations, writing the pairs' y rows; one combine in the resident path's
 * order makes out. false when the grouped path does not take this layer (nothing queued:
 * the caller falls back to the decode batches); true otherwise (errors are sticky). */
static bool off_prefill(ops_backend *be, cuda_impl *ci, cuda_offload *o, int li, float *out, const float *x, int64_t n, int H,
                        const int32_t *idx, const float *wts, int k, const ops_weight *gate, const ops_weight *up,
                        const ops_weight *down, int act) {
  const int64_t nk = n * k, I = up ? up[0].rows : gate[0].rows / 2;
  const int E = o->E;
  if (nk > 0x3fffffff) return false;
  if (!moe_ffn_grouped_tab(be, NULL, NULL, nk, H, NULL, NULL, 1, gate, up, down, act, NULL, E, NULL, true, nk))
    return false;
  cuda_flush(ci); /* the routed ids are read back: the rest of a recorded step runs eagerly */
  const int C = expert_store_cache_per_layer(o->st), base = C * o->n_layers;
  const int S = expert_store_n_slots(o->st) - base;
  const int halves = S >= 2 ? 2 : 1, Sh = S / halves;
  const int G = 1 + (E + Sh - 1) / Sh; /* the cached group and the miss groups, at most */
  if (!off_prefill_reserve(ci, o, nk, H, I, G)) return !o->pf_oom || ci->err; /* no room: decode batches */
  size_t at[8];
  off_pf_layout(o, nk, H, I, G, at);
  if (!o->ev_ready[0]) {
    for (int h = 0; h < 2; h++)
      if (!cuda_check(ci, cudaEventCreateWithFlags(&o->ev_ready[h], cudaEventDisableTiming), "offload event") ||
          !cuda_check(ci, cudaEventCreateWithFlags(&o->ev_free[h], cudaEventDisableTiming), "offload event"))
        return true;
  }
  if (!cuda_check(ci, cudaMemcpyAsync(o->pf_ids_h, idx, (size_t)nk * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                      ci->stream),
                  "offload prefill ids") ||
      !cuda_check(ci, cudaStreamSynchronize(ci->stream), "offload prefill ids sync"))
    return true;
  {
    char e[256];
    int rc = expert_store_note_chunk(o->st, li, o->pf_ids_h, nk, e, sizeof e);
    if (rc) {
      cuda_fail(ci, rc, "expert offload: %s", e);
      return true;
    }
  }
  /* counting sort of the pairs by expert, experts in group order (cached first); the host
   * lists are free: the readback sync above finished every copy out of them */
  int32_t *plist = (int32_t *)o->pf_hh, *idxl = plist + nk, *inv = idxl + nk;
  int32_t *cnt = o->pf_work, *start = cnt + E + 1, *eord = start + E + 1;
  memset(cnt, 0, sizeof(int32_t) * (size_t)(E + 1));
  for (int64_t i = 0; i < nk; i++)
    if (o->pf_ids_h[i] >= 0) cnt[o->pf_ids_h[i]]++; /* note_chunk checked the range; -1: no expert */
  const int32_t *rt = expert_store_table(o->st) + (int64_t)li * E;
  int ne = 0, nhit = 0;
  for (int e = 0; e < E; e++)
    if (cnt[e] && rt[e] >= 0) eord[ne++] = e;
  nhit = ne;
  for (int e = 0; e < E; e++)
    if (cnt[e] && rt[e] < 0) eord[ne++] = e;
  int32_t pos = 0;
  for (int j = 0; j < ne; j++) start[eord[j]] = pos, pos += cnt[eord[j]];
  for (int64_t i = 0; i < nk; i++) {
    if (o->pf_ids_h[i] < 0) {
      inv[i] = -1; /* the combine skips it */
      continue;
    }
    const int32_t p = start[o->pf_ids_h[i]]++;
    plist[p] = (int32_t)i, idxl[p] = o->pf_ids_h[i], inv[i] = p;
  }
  uint8_t *ws = o->pf_ws;
  float *xg = (float *)(ws + at[0]), *yall = (float *)(ws + at[1]), *ones = (float *)(ws + at[2]);
  float *sub = (float *)(ws + at[5]);
  const int32_t *plist_d = (const int32_t *)(ws + at[3]), *idxl_d = plist_d + nk, *inv_d = idxl_d + nk;
  cuda_copy_async(ci, ws + at[3], o->pf_hh, (size_t)nk * 12, cudaMemcpyHostToDevice, "offload prefill lists");
  cuda_launch(ci, "offload prefill ones", k_off_fill, cuda_blocks(nk, 256), 256, 0, ones, nk, 1.0f);
  if (pos) /* the routed pairs only */
    cuda_launch(ci, "offload prefill gather", k_off_gather, cuda_blocks((int64_t)pos * H, 256), 256, 0, xg,
                (const float *)x, plist_d, (int64_t)pos, H, k);
  /* copies into staging follow every earlier kernel (an earlier layer may still read a slot) */
  if (!cuda_check(ci, cudaEventRecord(o->ev_main, ci->stream), "offload event") ||
      !cuda_check(ci, cudaStreamWaitEvent(o->cs, o->ev_main, 0), "offload wait"))
    return true;
  int used[2] = {0, 0}, file_pending[2] = {0, 0};
  const size_t tb = (size_t)OFF_PARTS * E * sizeof(const uint8_t *);
  int g = 0;
  for (int j0 = 0; j0 < ne && !ci->err; g++) {
    /* group: all cached experts, else the next Sh misses */
    const bool hitg = j0 < nhit;
    const int j1 = hitg ? nhit : (ne - j0 < Sh ? ne : j0 + Sh);
    const uint8_t **ht = (const uint8_t **)(o->pf_hh + at[6] + (size_t)g * tb);
    uint8_t *td = ws + at[4] + (size_t)g * tb;
    memset(ht, 0, tb);
    const int h = hitg ? 0 : (g - (nhit > 0)) % halves;
    if (!hitg) {
      if (used[h] && !cuda_check(ci, cudaStreamWaitEvent(o->cs, o->ev_free[h], 0), "offload wait")) return true;
      /* the staging blobs of this half are rewritten by the host: the copies from them before are done */
      if (file_pending[h] && !cuda_check(ci, cudaEventSynchronize(o->ev_ready[h]), "offload staging sync"))
        return true;
      file_pending[h] = 0;
    }
    for (int j = j0; j < j1 && !ci->err; j++) {
      const int e = eord[j];
      const int slot = hitg ? rt[e] : base + h * Sh + (j - j0);
      for (int m = 0; m < OFF_PARTS; m++)
        ht[(int64_t)m * E + e] = o->part_bytes[li][m] ? o->arena + (int64_t)slot * o->eb + o->part_off[li][m] : NULL;
      if (!hitg) {
        const bool mir = expert_store_host_ptr(o->st, li, e) != NULL;
        if (!off_copy(ci, o, li, e, slot, o->stage_h + (int64_t)(slot - base) * o->eb)) return true;
        file_pending[h] |= !mir;
        o->pf_bytes += o->leb[li];
      }
    }
    cuda_copy_async(ci, td, ht, tb, cudaMemcpyHostToDevice, "offload prefill table");
    if (!hitg) {
      used[h] = 1;
      if (!cuda_check(ci, cudaEventRecord(o->ev_ready[h], o->cs), "offload event") ||
          !cuda_check(ci, cudaStreamWaitEvent(ci->stream, o->ev_ready[h], 0), "offload wait"))
        return true;
    }
    const int64_t b = start[eord[j0]] - cnt[eord[j0]], m = start[eord[j1 - 1]] - b;
    if (ci->err) return true;
    if (!moe_ffn_grouped_tab(be, yall + b * H, xg + b * H, m, H, idxl_d + b, ones, 1, gate, up, down, act, sub, E,
                             (const uint8_t *const *)td, false, nk)) {
      cuda_fail(ci, ANNA_EUNSUPPORTED, "expert offload: the grouped prefill path refused a group of %lld pairs",
                (long long)m);
      return true;
    }
    if (!hitg && !cuda_check(ci, cudaEventRecord(o->ev_free[h], ci->stream), "offload event")) return true;
    j0 = j1;
  }
  moe_combine(be, out, yall, inv_d, wts, n, H, k);
  if (li == 0) o->pf_tokens += n;
  o->pf_chunks++;
  return true;
}

bool cuda_offload_moe_ffn(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                          const float *wts, int k, int n_experts, const ops_weight *gate, const ops_weight *up,
                          const ops_weight *down, int act, float *scratch) {
  cuda_impl *ci = cuda_impl_of(be);
  cuda_offload *o = ci->offload;
  const int li = o ? layer_of(o, gate) : -1;
  if (li < 0) return false;
  if (ci->err) return true;
  if (n_experts != o->E) {
    cuda_fail(ci, ANNA_EINVAL, "expert offload: moe_ffn with %d experts, the layer has %d", n_experts, o->E);
    return true;
  }
  if (!o->st && !off_open(ci, o, k)) return true;
  if (k > o->k) {
    cuda_fail(ci, ANNA_EINVAL, "expert offload: %d routed slots per token, staging sized for %d", k, o->k);
    return true;
  }
  /* zero-copy steps being recorded (decode of up to 64 sequences) stay graphs: streaming
   * reads the routed ids back */
  const bool stream = n > CUDA_MOE_DECODE_MAX_TOK && !o->p.no_prefill_stream;
  if (stream && !(o->zc && ci->recording) && off_prefill(be, ci, o, li, out, x, n, H, idx, wts, k, gate, up, down, act))
    return true;
  if (stream) o->n_declined++;
  if (o->zc) {
    o->n_zc++;
    /* nothing to read back: count the routes on the device and run the kernels on the
     * table (cache slots and mirror copies); recordable, so the step stays a graph */
    const uint8_t *const *tab_z = o->tab_d + (int64_t)li * OFF_PARTS * o->E;
    cuda_launch(ci, "offload count", k_offload_count, cuda_blocks(n * k, 256), 256, 0, idx, n * k, o->E,
                o->counts_d + (int64_t)li * o->E);
    for (int64_t t0 = 0; t0 < n && !ci->err; t0 += CUDA_MOE_DECODE_MAX_TOK) {
      const int64_t m = n - t0 < CUDA_MOE_DECODE_MAX_TOK ? n - t0 : CUDA_MOE_DECODE_MAX_TOK;
      if (!moe_ffn_decode_tab(be, out + t0 * H, x + t0 * H, m, H, idx + t0 * k, wts + t0 * k, k, gate, up, down, act,
                              scratch, o->E, tab_z, true)) {
        cuda_fail(ci, ANNA_EUNSUPPORTED, "expert offload: the decode kernels do not take this layer's shapes");
        return true;
      }
    }
    return true;
  }
  o->n_staged++;
  cuda_flush(ci); /* the routed ids are read back: the rest of a recorded step runs eagerly */
  const uint8_t *const *tab_d = o->tab_d + (int64_t)li * OFF_PARTS * o->E;
  const int base_staging = expert_store_cache_per_layer(o->st) * o->n_layers;
  for (int64_t t0 = 0; t0 < n && !ci->err; t0 += CUDA_MOE_DECODE_MAX_TOK) {
    const int64_t m = n - t0 < CUDA_MOE_DECODE_MAX_TOK ? n - t0 : CUDA_MOE_DECODE_MAX_TOK;
    if (!cuda_check(ci,
                    cudaMemcpyAsync(o->ids_h, idx + t0 * k, (size_t)(m * k) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                    ci->stream),
                    "offload ids") ||
        !cuda_check(ci, cudaStreamSynchronize(ci->stream), "offload ids sync"))
      return true;
    /* the stream sync also finished every earlier copy the stream waited for, so the host
     * table and the staging blobs are free to rewrite */
    char e[256];
    int np = 0;
    int rc = expert_store_route(o->st, li, o->ids_h, (int)(m * k), o->places, &np, e, sizeof e);
    if (rc) {
      cuda_fail(ci, rc, "expert offload: %s", e);
      return true;
    }
    if (!cuda_check(ci, cudaEventRecord(o->ev_main, ci->stream), "offload event") ||
        !cuda_check(ci, cudaStreamWaitEvent(o->cs, o->ev_main, 0), "offload wait"))
      return true;
    for (int i = 0; i < np && !ci->err; i++) {
      const expert_store_place *pl = &o->places[i];
      off_point(o, li, pl->expert, pl->slot);
      if (pl->copy) off_copy(ci, o, li, pl->expert, pl->slot, o->stage_h + (int64_t)(pl->slot - base_staging) * o->eb);
    }
    if (ci->err) return true;
    if (!cuda_check(ci,
                    cudaMemcpyAsync((void *)tab_d, (const void *)(o->tab_h + (int64_t)li * OFF_PARTS * o->E),
                                    (size_t)OFF_PARTS * o->E * sizeof(void *), cudaMemcpyHostToDevice, o->cs),
                    "offload table upload") ||
        !cuda_check(ci, cudaEventRecord(o->ev_copy, o->cs), "offload event") ||
        !cuda_check(ci, cudaStreamWaitEvent(ci->stream, o->ev_copy, 0), "offload wait"))
      return true;
    if (!moe_ffn_decode_tab(be, out + t0 * H, x + t0 * H, m, H, idx + t0 * k, wts + t0 * k, k, gate, up, down, act,
                            scratch, o->E, tab_d, true)) {
      cuda_fail(ci, ANNA_EUNSUPPORTED, "expert offload: the decode kernels do not take this layer's shapes");
      return true;
    }
    /* later copies into these slots wait for an event recorded after this layer's kernels */
    expert_store_release(o->st, li);
  }
  return true;
}

void cuda_offload_step_end(cuda_impl *ci) {
  cuda_offload *o = ci->offload;
  if (!o || !o->st || ci->err || !expert_store_step(o->st)) return;
  const int C = expert_store_cache_per_layer(o->st);
  /* earlier table uploads read the host table: finished before it changes */
  if (!cuda_check(ci, cudaStreamSynchronize(o->cs), "offload swap sync")) return;
  if (o->zc) {
    /* the device counters of the steps since the last plan (the step just queued included:
     * wait for it), then zeroed for the next ones */
    const size_t cn = (size_t)o->n_layers * (size_t)o->E;
    if (!cuda_check(ci, cudaMemcpyAsync(o->counts_h, o->counts_d, cn * sizeof(float), cudaMemcpyDeviceToHost,
                                        ci->stream),
                    "offload counters") ||
        !cuda_check(ci, cudaStreamSynchronize(ci->stream), "offload counters") ||
        !cuda_check(ci, cudaMemsetAsync(o->counts_d, 0, cn * sizeof(float), ci->stream), "offload counters"))
      return;
    const int32_t *tab = expert_store_table(o->st);
    for (int l = 0; l < o->n_layers; l++) {
      const float *c = o->counts_h + (int64_t)l * o->E;
      /* PCIe reads of the misses, estimated as one expert per routed (token, slot) */
      for (int e = 0; e < o->E; e++)
        if (tab[(int64_t)l * o->E + e] < 0 && c[e] > 0.0f) o->bytes_mirror += (int64_t)(c[e] + 0.5f) * o->leb[l];
      expert_store_add_counts(o->st, l, c);
    }
  }
  const int n = expert_store_plan_swaps(o->st, o->swaps, C * o->n_layers);
  if (!n) return;
  /* the victims' slots are read by the step just queued: the copies follow it */
  if (!cuda_check(ci, cudaEventRecord(o->ev_main, ci->stream), "offload event") ||
      !cuda_check(ci, cudaStreamWaitEvent(o->cs, o->ev_main, 0), "offload wait"))
    return;
  const int S = expert_store_n_slots(o->st) - C * o->n_layers;
  for (int i = 0, j = 0; i < n && !ci->err; i++) {
    const expert_store_place *sw = &o->swaps[i];
    off_point(o, sw->layer, sw->expert, sw->slot);
    if (!expert_store_host_ptr(o->st, sw->layer, sw->expert)) {
      if (j == S) {
        if (!cuda_check(ci, cudaStreamSynchronize(o->cs), "offload swap staging")) return;
        j = 0;
      }
      off_copy(ci, o, sw->layer, sw->expert, sw->slot, o->stage_h + (int64_t)j++ * o->eb);
    } else {
      off_copy(ci, o, sw->layer, sw->expert, sw->slot, NULL);
    }
  }
  if (o->zc && !ci->err) {
    /* no later call uploads a table: the victims now read from the mirror, the arrivals
     * from their slots, uploaded after the copies; the compute stream waits for both */
    for (int i = 0; i < n; i++)
      if (o->swaps[i].victim >= 0) off_point_mirror(o, o->swaps[i].layer, o->swaps[i].victim);
    const size_t tab_n = (size_t)o->n_layers * OFF_PARTS * (size_t)o->E;
    if (!cuda_check(ci, cudaMemcpyAsync(o->tab_d, o->tab_h, tab_n * sizeof(void *), cudaMemcpyHostToDevice, o->cs),
                    "offload table upload") ||
        !cuda_check(ci, cudaEventRecord(o->ev_copy, o->cs), "offload event") ||
        !cuda_check(ci, cudaStreamWaitEvent(ci->stream, o->ev_copy, 0), "offload wait"))
      return;
  }
  /* the next MoE call's table upload and its event order these copies before its kernels;
   * the staging blobs are reused by that call only after its stream sync, which waits for
   * nothing on this stream: sync here so they are free */
  if (!ci->err) cuda_check(ci, cudaStreamSynchronize(o->cs), "offload swap copies");
}

void cuda_offload_free(cuda_impl *ci) {
  cuda_offload *o = ci->offload;
  if (!o) return;
  if (o->cs) {
    cudaStreamSynchronize(o->cs);
    cudaStreamDestroy(o->cs);
  }
  if (o->ev_main) cudaEventDestroy(o->ev_main);
  if (o->ev_copy) cudaEventDestroy(o->ev_copy);
  for (int h = 0; h < 2; h++) {
    if (o->ev_ready[h]) cudaEventDestroy(o->ev_ready[h]);
    if (o->ev_free[h]) cudaEventDestroy(o->ev_free[h]);
  }
  if (o->pf_ids_h) cudaFreeHost(o->pf_ids_h);
  if (o->pf_hh) cudaFreeHost(o->pf_hh);
  free(o->pf_work);
  if (o->pf_ws) cudaFree(o->pf_ws);
  if (o->arena) cudaFree(o->arena);
  if (o->counts_d) cudaFree(o->counts_d);
  if (o->counts_h) cudaFreeHost(o->counts_h);
  if (o->tab_d) cudaFree(o->tab_d);
  if (o->tab_h) cudaFreeHost(o->tab_h);
  if (o->ids_h) cudaFreeHost(o->ids_h);
  if (o->stage_h) cudaFreeHost(o->stage_h);
  free(o->places);
  free(o->swaps);
  expert_store_free(o->st);
  if (o->fd >= 0) close(o->fd);
  free(o);
  ci->offload = NULL;
}

extern "C" void cuda_backend_offload_stats(ops_backend *be, cuda_offload_stats *out) {
  memset(out, 0, sizeof *out);
  cuda_impl *ci = (cuda_impl *)be->impl;
  cuda_offload *o = ci->offload;
  if (!o) return;
  out->on = 1;
  if (!o->st) return;
  expert_store_stats s;
  expert_store_get_stats(o->st, &s);
  out->cache_per_layer = s.cache_per_layer;
  out->staging_slots = s.staging_slots;
  out->mirrored = s.mirrored;
  out->routed = s.routed;
  out->hits = s.hits;
  out->swaps = s.swaps;
  out->bytes_mirror = o->bytes_mirror;
  out->bytes_file = o->bytes_file;
  out->device_bytes = expert_store_device_bytes(o->st);
  out->summary = o->summary;
  out->prefill_bytes = o->pf_bytes;
  out->prefill_tokens = o->pf_tokens;
  if (o->pf_chunks) {
    snprintf(o->summary2, sizeof o->summary2, "%s; prefill streamed %lld layer chunks, %lld expert bytes copied for %lld tokens (%.0f per token)",
             o->summary, (long long)o->pf_chunks, (long long)o->pf_bytes, (long long)o->pf_tokens,
             o->pf_tokens ? (double)o->pf_bytes / (double)o->pf_tokens : 0.0);
    out->summary = o->summary2;
  }
}

extern "C" void cuda_backend_offload_paths(ops_backend *be, cuda_offload_paths *out) {
  memset(out, 0, sizeof *out);
  const cuda_offload *o = ((cuda_impl *)be->impl)->offload;
  if (!o) return;
  out->zero_copy = o->n_zc;
  out->staged = o->n_staged;
  out->streamed = o->pf_chunks;
  out->stream_declined = o->n_declined;
}

/* The first byte where the parts of two expert blobs differ (the padding between parts is
 * never written by a copy from the weights), or -1. */
static int64_t off_blob_diff(const cuda_offload *o, int layer, const uint8_t *a, const uint8_t *b, int *part) {
  for (int m = 0; m < OFF_PARTS; m++) {
    const uint8_t *x = a + o->part_off[layer][m], *y = b + o->part_off[layer][m];
    for (int64_t i = 0; i < o->part_bytes[layer][m]; i++)
      if (x[i] != y[i]) {
        *part = m;
        return i;
      }
  }
  return -1;
}

extern "C" int cuda_backend_offload_check(ops_backend *be, char *err, size_t errlen) {
  cuda_impl *ci = (cuda_impl *)be->impl;
  cuda_offload *o = ci->offload;
  if (err && errlen) err[0] = 0;
  if (ci->err) return off_err(err, errlen, ci->err, "%s", ci->msg);
  if (!o || !o->st) return 0;
  cudaError_t ce = cudaStreamSynchronize(ci->stream);
  if (ce == cudaSuccess) ce = cudaStreamSynchronize(o->cs);
  if (ce != cudaSuccess)
    return off_err(err, errlen, ANNA_EIO, "offload check: sync: %s", cudaGetErrorString(ce));
  int rc = expert_store_check(o->st, err, errlen);
  if (rc) return rc;
  const int L = o->n_layers, E = o->E, C = expert_store_cache_per_layer(o->st);
  uint8_t *want = (uint8_t *)malloc((size_t)o->eb), *got = (uint8_t *)malloc((size_t)o->eb);
  const size_t tab_n = (size_t)L * OFF_PARTS * (size_t)E;
  const uint8_t **tab = o->zc ? (const uint8_t **)malloc(tab_n * sizeof *tab) : NULL;
  if (!want || !got || (o->zc && !tab)) {
    free(want), free(got), free(tab);
    return off_err(err, errlen, ANNA_ENOMEM, "offload check: out of host memory");
  }
  char e2[256];
  int part = 0;
  /* every occupied cache slot holds its expert's bytes (a slot the map calls resident but
   * something overwrote shows here) */
  for (int s = 0; s < C * L && !rc; s++) {
    int l, ex;
    expert_store_slot_owner(o->st, s, &l, &ex);
    if (l < 0) continue;
    if ((rc = off_read(o, l, ex, want, (size_t)o->eb, e2, sizeof e2))) {
      off_err(err, errlen, rc, "offload check: layer %d expert %d: %s", l, ex, e2);
      break;
    }
    if ((ce = cudaMemcpy(got, o->arena + (int64_t)s * o->eb, (size_t)o->eb, cudaMemcpyDeviceToHost)) != cudaSuccess) {
      rc = off_err(err, errlen, ANNA_EIO, "offload check: slot read: %s", cudaGetErrorString(ce));
      break;
    }
    const int64_t at = off_blob_diff(o, l, got, want, &part);
    if (at >= 0)
      rc = off_err(err, errlen, ANNA_ESTATE,
                   "offload check: cache slot %d holds layer %d expert %d by the map, but its device bytes differ from "
                   "the weights at byte %lld of part %d",
                   s, l, ex, (long long)at, part);
  }
  /* the host mirror copies */
  for (int l = 0; l < L && !rc; l++)
    for (int ex = 0; ex < E && !rc; ex++) {
      const uint8_t *h = (const uint8_t *)expert_store_host_ptr(o->st, l, ex);
      if (!h) continue;
      if ((rc = off_read(o, l, ex, want, (size_t)o->eb, e2, sizeof e2))) {
        off_err(err, errlen, rc, "offload check: layer %d expert %d: %s", l, ex, e2);
        break;
      }
      const int64_t at = off_blob_diff(o, l, h, want, &part);
      if (at >= 0)
        rc = off_err(err, errlen, ANNA_ESTATE,
                     "offload check: the host mirror of layer %d expert %d differs from the weights at byte %lld of "
                     "part %d",
                     l, ex, (long long)at, part);
    }
  /* zero-copy: the kernels read every routed expert through the device table, with no
   * per-call upload, so all of it must be right between steps */
  if (o->zc && !rc) {
    if ((ce = cudaMemcpy(tab, o->tab_d, tab_n * sizeof *tab, cudaMemcpyDeviceToHost)) != cudaSuccess) {
      rc = off_err(err, errlen, ANNA_EIO, "offload check: table read: %s", cudaGetErrorString(ce));
    } else {
      const int32_t *rt = expert_store_table(o->st);
      for (int l = 0; l < L && !rc; l++)
        for (int ex = 0; ex < E && !rc; ex++) {
          const int s = rt[(int64_t)l * E + ex];
          const uint8_t *h = (const uint8_t *)expert_store_host_ptr(o->st, l, ex);
          for (int m = 0; m < OFF_PARTS && !rc; m++) {
            const uint8_t *w = !o->part_bytes[l][m] ? NULL
                               : s >= 0             ? o->arena + (int64_t)s * o->eb + o->part_off[l][m]
                               : h                  ? h + o->part_off[l][m]
                                                    : NULL;
            const uint8_t *g = tab[((int64_t)l * OFF_PARTS + m) * E + ex];
            if (g != w)
              rc = off_err(err, errlen, ANNA_ESTATE,
                           "offload check: zero-copy table of layer %d, part %d of expert %d points at %p, not at its "
                           "%s %p",
                           l, m, ex, (const void *)g, s >= 0 ? "cache slot" : "mirror copy", (const void *)w);
          }
        }
    }
  }
  free(want), free(got), free(tab);
  return rc;
}
