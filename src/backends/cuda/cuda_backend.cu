/* cuda_backend.cu: device memory, the sticky error, the weight mirror, the pointer ring
 * and the op table. Kernels live in one .cu per op family. */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_offload_check.h" /* cuda_backend_mirror_has */

#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEQ_FLOATS ((size_t)16 << 20) /* 64 MiB of f32 weight tile for GEMMs */
#define RING_MIN ((size_t)1 << 20)
/* 64 MiB of split-K attention partials: a 512-token prefill chunk of 8 heads x 256 dims can
 * split its keys 8 ways (flash prefill, cuda_attn.cu). */
#define ATT_PART_FLOATS ((size_t)16 << 20)
/* topk key levels: about 140 KB per row at a 248k vocabulary and k = 256, so 58 rows a pass */
#define TOPK_SCR_BYTES ((size_t)8 << 20)

/* anna_err's contract, local so this library needs nothing from anna's objects at link time. */
static int put_err(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int put_err(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

int cuda_fail(cuda_impl *ci, int code, const char *fmt, ...) {
  if (ci->err) return ci->err;
  ci->err = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ci->msg, sizeof ci->msg, fmt, ap);
  va_end(ap);
  return code;
}

bool cuda_check(cuda_impl *ci, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return true;
  cuda_fail(ci, e == cudaErrorMemoryAllocation ? ANNA_ENOMEM : ANNA_EIO, "cuda: %s: %s", what, cudaGetErrorString(e));
  return false;
}

bool cuda_check_launch(cuda_impl *ci, const char *what) {
  return cuda_check(ci, cudaGetLastError(), what);
}

/* ---- weight mirror ---- */

static size_t mirror_slot(const void *p, size_t cap) {
  uint64_t h = (uint64_t)(uintptr_t)p;
  h ^= h >> 29;
  h *= 0x9e3779b97f4a7c15ull;
  return (size_t)(h >> 17) & (cap - 1);
}

static bool mirror_grow(cuda_impl *ci) {
  size_t ncap = ci->map_cap ? ci->map_cap * 2 : 1024;
  cuda_mirror_ent *nm = (cuda_mirror_ent *)calloc(ncap, sizeof *nm);
  if (!nm) return cuda_fail(ci, ANNA_ENOMEM, "cuda: out of host memory for the weight mirror"), false;
  for (size_t i = 0; i < ci->map_cap; i++) {
    if (!ci->map[i].host) continue;
    size_t s = mirror_slot(ci->map[i].host, ncap);
    while (nm[s].host) s = (s + 1) & (ncap - 1);
    nm[s] = ci->map[i];
  }
  free(ci->map);
  ci->map = nm;
  ci->map_cap = ncap;
  return true;
}

/* The map entry for key, or NULL. */
static cuda_mirror_ent *mirror_find(cuda_impl *ci, const void *key) {
  if (!ci->map_cap) return NULL;
  size_t s = mirror_slot(key, ci->map_cap);
  while (ci->map[s].host) {
    if (ci->map[s].host == key) return &ci->map[s];
    s = (s + 1) & (ci->map_cap - 1);
  }
  return NULL;
}

/* A new entry: bytes of src copied to the device under key. */
static const void *mirror_add(cuda_impl *ci, const void *key, const void *src, size_t bytes) {
  if ((ci->map_n + 1) * 2 > ci->map_cap && !mirror_grow(ci)) return NULL;
  void *d = NULL;
  if (!cuda_check(ci, cudaMalloc(&d, bytes ? bytes : 1), "mirror alloc")) return NULL;
  /* On the side stream and waited for: the copy is complete before any kernel that reads
   * it is queued, also while a step is being recorded. */
  if (!cuda_check(ci, cudaMemcpyAsync(d, src, bytes, cudaMemcpyHostToDevice, ci->copy_stream), "mirror copy") ||
      !cuda_check(ci, cudaStreamSynchronize(ci->copy_stream), "mirror sync")) {
    cudaFree(d);
    return NULL;
  }
  size_t s = mirror_slot(key, ci->map_cap);
  while (ci->map[s].host) s = (s + 1) & (ci->map_cap - 1);
  ci->map[s].host = key;
  ci->map[s].dev = d;
  ci->map[s].bytes = bytes;
  ci->map_n++;
  return d;
}

const void *cuda_mirror(ops_backend *be, const void *host, size_t bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  if (!host || ci->err) return NULL;
  cuda_mirror_ent *m = mirror_find(ci, host);
  if (m) {
    if (m->bytes >= bytes) return m->dev;
    /* Seen before with fewer bytes: replace the copy by a larger one. */
    cuda_flush(ci); /* recorded nodes may point at the old copy: they run before it is freed */
    void *nd = NULL;
    if (!cuda_check(ci, cudaMalloc(&nd, bytes), "mirror alloc")) return NULL;
    if (!cuda_check(ci, cudaMemcpyAsync(nd, host, bytes, cudaMemcpyHostToDevice, ci->copy_stream), "mirror copy") ||
        !cuda_check(ci, cudaStreamSynchronize(ci->copy_stream), "mirror sync"))
      return NULL;
    cudaStreamSynchronize(ci->stream);
    cudaFree(m->dev);
    m->dev = nd;
    m->bytes = bytes;
    return nd;
  }
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, host) == cudaSuccess &&
      (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged))
    return host;
  cudaGetLastError(); /* an unregistered host pointer may leave a benign error behind */
  return mirror_add(ci, host, host, bytes);
}

const void *cuda_mirror_find(ops_backend *be, const void *key) {
  cuda_impl *ci = cuda_impl_of(be);
  const cuda_mirror_ent *m = ci->err ? NULL : mirror_find(ci, key);
  return m ? m->dev : NULL;
}

const void *cuda_mirror_keyed(ops_backend *be, const void *key, const void *src, size_t bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  if (!key || ci->err) return NULL;
  const cuda_mirror_ent *m = mirror_find(ci, key);
  if (m) return m->dev;
  return mirror_add(ci, key, src, bytes);
}

void cuda_backend_drop_mirrors(ops_backend *be) {
  if (!be) return;
  cuda_impl *ci = cuda_impl_of(be);
  cudaStreamSynchronize(ci->stream);
  for (size_t i = 0; i < ci->map_cap; i++)
    if (ci->map[i].host) cudaFree(ci->map[i].dev);
  free(ci->map);
  ci->map = NULL;
  ci->map_cap = ci->map_n = 0;
}

extern "C" int cuda_backend_mirror_has(ops_backend *be, const void *host) {
  cuda_impl *ci = (cuda_impl *)be->impl; /* not cuda_impl_of: a query launches nothing */
  return host && mirror_find(ci, host) ? 1 : 0;
}

/* ---- pointer ring ---- */

bool cuda_ring_reserve(ops_backend *be, size_t bytes, char **h, char **d) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err) return false;
  bytes = (bytes + 15) & ~(size_t)15;
  if (bytes > ci->ring_cap) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: %zu bytes of op arguments exceed the %zu-byte ring", bytes, ci->ring_cap);
    return false;
  }
  if (ci->ring_off + bytes > ci->ring_cap) {
    if (ci->recording) {
      cuda_fail(ci, ANNA_ESTATE, "cuda: op arguments of one recorded step exceed the %zu-byte ring", ci->ring_cap);
      return false;
    }
    /* Wrapping: every earlier copy out of the ring must have finished first. */
    if (!cuda_check(ci, cudaStreamSynchronize(ci->stream), "ring sync")) return false;
    ci->ring_off = 0;
  }
  *h = ci->ring_h + ci->ring_off;
  *d = ci->ring_d + ci->ring_off;
  ci->ring_off += bytes;
  return true;
}

void *cuda_ring_put(ops_backend *be, const void *host, size_t bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  char *h, *d;
  if (!cuda_ring_reserve(be, bytes, &h, &d)) return NULL;
  memcpy(h, host, bytes);
  cuda_copy_async(ci, d, h, bytes, cudaMemcpyHostToDevice, "ring copy");
  return ci->err ? NULL : d;
}

/* ---- decode steps as graphs ---- */

static double host_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Grows *p (elements of `size` bytes, capacity *cap) to hold `need`; false when out of host
 * memory (sticky error). Capacities only grow: after the first steps nothing is allocated. */
static bool log_reserve(cuda_impl *ci, void **p, int64_t *cap, int64_t need, size_t size) {
  if (need <= *cap) return true;
  int64_t nc = *cap ? *cap : 256;
  while (nc < need)
    nc *= 2;
  void *np = realloc(*p, (size_t)nc * size);
  if (!np) return cuda_fail(ci, ANNA_ENOMEM, "cuda: out of host memory for the step log"), false;
  *p = np;
  *cap = nc;
  return true;
}

static cuda_node *log_node(cuda_impl *ci, int kind) {
  if (!log_reserve(ci, (void **)&ci->log, &ci->log_cap, ci->log_n + 1, sizeof(cuda_node)))
    return NULL;
  cuda_node *nd = &ci->log[ci->log_n++];
  memset(nd, 0, sizeof *nd);
  nd->kind = kind;
  return nd;
}

static void graph_launch_log(cuda_impl *ci);

/* Before a node is added: launches the step's early piece when the log has reached it. */
static void log_piece_check(cuda_impl *ci) {
  if (!ci->piece_at || ci->piece_done || ci->log_n < ci->piece_at) return;
  ci->piece_done = 1;
  graph_launch_log(ci);
  ci->log_n = ci->log_args_n = ci->log_offs_n = 0;
}

bool cuda_log_kernel(cuda_impl *ci, const void *func, dim3 grid, dim3 block, size_t smem, int pdl, int nargs,
                     const void *const *args, const size_t *sizes, const size_t *aligns) {
  log_piece_check(ci);
  if (nargs > CUDA_MAX_KARGS) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: a kernel of %d parameters cannot be recorded", nargs);
    return false;
  }
  size_t bytes = 0;
  for (int i = 0; i < nargs; i++)
    bytes = (bytes + aligns[i] - 1) / aligns[i] * aligns[i] + sizes[i];
  /* Each node's arguments start 16-aligned so that their offsets (and alignment) are the
   * same in every step. */
  const int64_t at = (ci->log_args_n + 15) & ~(int64_t)15;
  if (!log_reserve(ci, (void **)&ci->log_args, &ci->log_args_cap, at + (int64_t)bytes, 1) ||
      !log_reserve(ci, (void **)&ci->log_offs, &ci->log_offs_cap, ci->log_offs_n + nargs,
                   sizeof(uint32_t)))
    return false;
  cuda_node *nd = log_node(ci, CUDA_NODE_KERNEL);
  if (!nd) return false;
  memset(ci->log_args + ci->log_args_n, 0, (size_t)(at - ci->log_args_n) + bytes);
  size_t off = 0;
  for (int i = 0; i < nargs; i++) {
    off = (off + aligns[i] - 1) / aligns[i] * aligns[i];
    memcpy(ci->log_args + at + off, args[i], sizes[i]);
    ci->log_offs[ci->log_offs_n + i] = (uint32_t)off;
    off += sizes[i];
  }
  nd->func = func;
  nd->pdl = pdl && ci->pdl;
  nd->grid[0] = grid.x, nd->grid[1] = grid.y, nd->grid[2] = grid.z;
  nd->block[0] = block.x, nd->block[1] = block.y, nd->block[2] = block.z;
  nd->smem = smem;
  nd->arg0 = (uint32_t)at;
  nd->arg_bytes = (uint32_t)bytes;
  nd->off0 = (uint32_t)ci->log_offs_n;
  nd->nargs = (uint32_t)nargs;
  ci->log_args_n = at + (int64_t)bytes;
  ci->log_offs_n += nargs;
  return true;
}

void cuda_copy_async(cuda_impl *ci, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                     const char *what) {
  if (ci->err || !bytes) return;
  if (ci->recording && kind != cudaMemcpyDeviceToHost) {
    log_piece_check(ci);
    cuda_node *nd = log_node(ci, CUDA_NODE_COPY);
    if (!nd) return;
    nd->copy_kind = (int32_t)kind;
    nd->dst = dst;
    nd->src = src;
    nd->bytes = bytes;
    return;
  }
  if (ci->recording) cuda_flush(ci);
  cuda_check(ci, cudaMemcpyAsync(dst, src, bytes, kind, ci->stream), what);
}

void cuda_memset_async(cuda_impl *ci, void *p, size_t bytes, const char *what) {
  if (ci->err || !bytes) return;
  if (ci->recording) {
    log_piece_check(ci);
    cuda_node *nd = log_node(ci, CUDA_NODE_MEMSET);
    if (!nd) return;
    nd->dst = p;
    nd->bytes = bytes;
    return;
  }
  cuda_check(ci, cudaMemsetAsync(p, 0, bytes, ci->stream), what);
}

/* Adds the last replay's device time once it has finished (the caller synced). */
static void graph_time_collect(cuda_impl *ci) {
  if (!ci->ev_pending) return;
  float ms = 0.0f;
  if (cudaEventElapsedTime(&ms, ci->ev0, ci->ev1) == cudaSuccess)
    ci->t_gpu += 1e-3 * ms;
  else
    (void)cudaGetLastError(); /* not finished or not recorded: the replay goes uncounted */
  ci->ev_pending = 0;
}

static void kernel_params(const cuda_node *nd, const uint8_t *args, const uint32_t *offs,
                          void **argv, cudaKernelNodeParams *p) {
  for (uint32_t i = 0; i < nd->nargs; i++)
    argv[i] = (void *)(args + nd->arg0 + offs[nd->off0 + i]);
  *p = cudaKernelNodeParams();
  p->func = (void *)nd->func;
  p->gridDim = dim3(nd->grid[0], nd->grid[1], nd->grid[2]);
  p->blockDim = dim3(nd->block[0], nd->block[1], nd->block[2]);
  p->sharedMemBytes = (unsigned)nd->smem;
  p->kernelParams = argv;
}

static cudaMemsetParams memset_params(const cuda_node *nd) {
  cudaMemsetParams mp = cudaMemsetParams();
  mp.dst = nd->dst;
  mp.value = 0;
  mp.elementSize = 1;
  mp.width = nd->bytes;
  mp.height = 1;
  return mp;
}

static void gent_release(cuda_graph_ent *e) {
  if (e->exec) cudaGraphExecDestroy(e->exec);
  if (e->graph) cudaGraphDestroy(e->graph);
  e->exec = NULL;
  e->graph = NULL;
  e->n = 0;
}

static void gent_free(cuda_graph_ent *e) {
  gent_release(e);
  free(e->nodes);
  free(e->log);
  free(e->args);
  free(e->offs);
  memset(e, 0, sizeof *e);
}

/* Same nodes: count, kinds, kernels and copy directions (what an exec update cannot change). */
static bool gent_same_shape(const cuda_impl *ci, const cuda_graph_ent *e) {
  if (!e->exec || e->n != ci->log_n) return false;
  for (int64_t i = 0; i < e->n; i++) {
    const cuda_node *a = &e->log[i], *b = &ci->log[i];
    if (a->kind != b->kind || a->func != b->func || a->copy_kind != b->copy_kind || a->pdl != b->pdl) return false;
  }
  return true;
}

/* Room for n nodes (handles and log entries share one capacity). */
static bool gent_reserve(cuda_impl *ci, cuda_graph_ent *e, int64_t n) {
  if (n <= e->cap) return true;
  int64_t cap = e->cap;
  if (!log_reserve(ci, (void **)&e->log, &cap, n, sizeof(cuda_node))) return false;
  cap = e->cap;
  if (!log_reserve(ci, (void **)&e->nodes, &cap, n, sizeof(cudaGraphNode_t))) return false;
  e->cap = cap;
  return true;
}

/* Keeps the step log in the entry (for the next comparison). */
static bool gent_keep_log(cuda_impl *ci, cuda_graph_ent *e) {
  if (!gent_reserve(ci, e, ci->log_n) ||
      !log_reserve(ci, (void **)&e->args, &e->args_cap, ci->log_args_n, 1) ||
      !log_reserve(ci, (void **)&e->offs, &e->offs_cap, ci->log_offs_n, sizeof(uint32_t)))
    return false;
  memcpy(e->log, ci->log, (size_t)ci->log_n * sizeof(cuda_node));
  memcpy(e->args, ci->log_args, (size_t)ci->log_args_n);
  memcpy(e->offs, ci->log_offs, (size_t)ci->log_offs_n * sizeof(uint32_t));
  e->n = ci->log_n;
  e->args_n = ci->log_args_n;
  e->offs_n = ci->log_offs_n;
  return true;
}

/* Updates e's executable graph in place where the step's nodes differ from e's log. False
 * when the driver refuses an update (the caller rebuilds). */
static bool gent_update(cuda_impl *ci, cuda_graph_ent *e) {
  void *argv[CUDA_MAX_KARGS];
  int64_t changed = 0;
  for (int64_t i = 0; i < e->n; i++) {
    const cuda_node *a = &e->log[i], *b = &ci->log[i];
    if (!memcmp(a, b, sizeof *a) &&
        (b->kind != CUDA_NODE_KERNEL ||
         !memcmp(e->args + a->arg0, ci->log_args + b->arg0, b->arg_bytes)))
      continue;
    cudaError_t r;
    if (b->kind == CUDA_NODE_KERNEL) {
      cudaKernelNodeParams p;
      kernel_params(b, ci->log_args, ci->log_offs, argv, &p);
      r = cudaGraphExecKernelNodeSetParams(e->exec, e->nodes[i], &p);
    } else if (b->kind == CUDA_NODE_COPY) {
      r = cudaGraphExecMemcpyNodeSetParams1D(e->exec, e->nodes[i], b->dst, b->src, b->bytes,
                                             (cudaMemcpyKind)b->copy_kind);
    } else {
      const cudaMemsetParams mp = memset_params(b);
      r = cudaGraphExecMemsetNodeSetParams(e->exec, e->nodes[i], &mp);
    }
    if (r != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    changed++;
  }
  if (changed) ci->graph_updates++;
  return gent_keep_log(ci, e);
}

/* Builds e's graph from the step log: one chain, in recording order. */
static bool gent_build(cuda_impl *ci, cuda_graph_ent *e) {
  gent_release(e);
  if (!gent_reserve(ci, e, ci->log_n)) return false;
  if (!cuda_check(ci, cudaGraphCreate(&e->graph, 0), "graph create")) return false;
  void *argv[CUDA_MAX_KARGS];
  for (int64_t i = 0; i < ci->log_n; i++) {
    const cuda_node *nd = &ci->log[i];
    const cudaGraphNode_t *dep = i ? &e->nodes[i - 1] : NULL;
    const size_t ndep = i ? 1 : 0;
    cudaError_t r;
    /* A cuda_launch_pdl kernel after a kernel: a programmatic edge, it may launch once every
     * block of the one before has started (cuda_pdl_enter orders its memory accesses). */
    const bool prog = nd->kind == CUDA_NODE_KERNEL && nd->pdl && i && ci->log[i - 1].kind == CUDA_NODE_KERNEL;
    if (nd->kind == CUDA_NODE_KERNEL) {
      cudaKernelNodeParams p;
      kernel_params(nd, ci->log_args, ci->log_offs, argv, &p);
      r = cudaGraphAddKernelNode(&e->nodes[i], e->graph, prog ? NULL : dep, prog ? 0 : ndep, &p);
      if (r == cudaSuccess && prog) {
        cudaGraphEdgeData ed;
        memset(&ed, 0, sizeof ed);
        ed.from_port = cudaGraphKernelNodePortProgrammatic;
        ed.type = cudaGraphDependencyTypeProgrammatic;
#if CUDART_VERSION >= 13000
        r = cudaGraphAddDependencies(e->graph, dep, &e->nodes[i], &ed, 1);
#else
        r = cudaGraphAddDependencies_v2(e->graph, dep, &e->nodes[i], &ed, 1);
#endif
      }
    } else if (nd->kind == CUDA_NODE_COPY) {
      r = cudaGraphAddMemcpyNode1D(&e->nodes[i], e->graph, dep, ndep, nd->dst, nd->src, nd->bytes,
                                   (cudaMemcpyKind)nd->copy_kind);
    } else {
      const cudaMemsetParams mp = memset_params(nd);
      r = cudaGraphAddMemsetNode(&e->nodes[i], e->graph, dep, ndep, &mp);
    }
    if (!cuda_check(ci, r, "graph node")) {
      gent_release(e);
      return false;
    }
  }
  if (!cuda_check(ci, cudaGraphInstantiate(&e->exec, e->graph, 0), "graph instantiate")) {
    e->exec = NULL;
    gent_release(e);
    return false;
  }
  ci->graph_builds++;
  return gent_keep_log(ci, e);
}

/* Runs the log recorded so far: as the cached graph with the same nodes (arguments updated
 * in place where they changed), else as a new graph. The step's first launch is counted and
 * starts the replay timing; every launch moves its end. */
static void graph_launch_log(cuda_impl *ci) {
  const double t1 = host_now();
  ci->t_capture += t1 - ci->cap_t0;
  ci->cap_t0 = t1;
  if (ci->err || ci->log_n == 0) return; /* an op failed while recorded: nothing of the step runs */
  cuda_graph_ent *e = NULL;
  for (int i = 0; i < CUDA_GRAPH_CACHE; i++)
    if (gent_same_shape(ci, &ci->gcache[i]) && (!e || ci->gcache[i].tick > e->tick))
      e = &ci->gcache[i];
  if (e && !gent_update(ci, e)) {
    if (ci->err || !gent_build(ci, e)) return; /* an update the driver refused: rebuilt */
  } else if (!e) {
    e = &ci->gcache[0];
    for (int i = 1; i < CUDA_GRAPH_CACHE; i++)
      if (ci->gcache[i].tick < e->tick) e = &ci->gcache[i];
    if (!gent_build(ci, e)) return;
  }
  e->tick = ++ci->gtick;
  const double t2 = host_now();
  ci->t_update += t2 - t1;
  ci->cap_t0 = t2;
  const bool first = !ci->step_launched;
  const bool timed = ci->ev0 && (!first || cudaEventRecord(ci->ev0, ci->stream) == cudaSuccess);
  if (!cuda_check(ci, cudaGraphLaunch(e->exec, ci->stream), "graph launch")) return;
  if (first) ci->graph_launches++;
  ci->step_launched = 1;
  ci->ev_pending = timed && (first || ci->ev_pending) && cudaEventRecord(ci->ev1, ci->stream) == cudaSuccess;
}

/* Ends the recording and runs what is left of it (graph_launch_log). */
void cuda_flush(cuda_impl *ci) {
  if (!ci->recording) return;
  ci->recording = 0;
  graph_launch_log(ci);
}

extern "C" void cuda_backend_set_exact(ops_backend *be, int on) {
  cuda_impl_of(be)->exact = on;
}

extern "C" void cuda_backend_set_matvec_variant(ops_backend *be, int variant) {
  cuda_impl_of(be)->mv_variant = variant;
}

extern "C" void cuda_backend_set_pdl(ops_backend *be, int on) {
  cuda_impl *ci = cuda_impl_of(be);
  ci->pdl = on && ci->pdl_ok;
}

extern "C" void cuda_backend_set_attn_variant(ops_backend *be, int variant) {
  cuda_impl_of(be)->attn_variant = variant;
}

extern "C" void cuda_backend_set_flash_variant(ops_backend *be, int variant) {
  cuda_impl_of(be)->flash_variant = variant;
}

extern "C" void cuda_backend_set_gemm_variant(ops_backend *be, int variant) {
  cuda_impl_of(be)->gemm_variant = variant;
}

extern "C" void cuda_backend_set_moe_variant(ops_backend *be, int variant) {
  cuda_impl_of(be)->moe_variant = variant;
}

extern "C" void cuda_backend_set_gdn_variant(ops_backend *be, int variant) {
  cuda_impl_of(be)->gdn_variant = variant;
}

extern "C" void cuda_backend_set_gemm_tile(ops_backend *be, size_t bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  const size_t whole = ci->deq_floats * sizeof(float);
  ci->gemm_tile_bytes = bytes == 0 || bytes > whole ? whole : bytes;
}

extern "C" void cuda_backend_set_gdn_scan_cols(ops_backend *be, int cols) {
  cuda_impl_of(be)->gdn_scan_cols = cols == 16 || cols == 32 ? cols : 0;
}

extern "C" void cuda_backend_set_graphs(ops_backend *be, int on) {
  cuda_impl_of(be)->graphs = on;
}

extern "C" void cuda_backend_set_decode_mmq(ops_backend *be, int on) {
  cuda_impl *ci = cuda_impl_of(be);
  ci->decode_mmq = on;
  ci->graph_max_tok = on || ci->batch_inv ? CUDA_GRAPH_MAX_TOK : 8;
}

extern "C" void cuda_backend_set_batch_invariant(ops_backend *be, int on) {
  cuda_impl *ci = cuda_impl_of(be);
  ci->batch_inv = on;
  /* The forward pass takes the fused GDN decode step only when every run of the batch is a
   * short uncut one, so a decode token would switch between it and the separate ops (not the
   * same bits) with its neighbours: batch-invariant mode always runs the separate ops. */
  be->gdn_step = on ? NULL : cuda_op_gdn_step;
  ci->graph_max_tok = on || ci->decode_mmq ? CUDA_GRAPH_MAX_TOK : 8; /* the 9..64-token steps stay recordable */
}

extern "C" void cuda_backend_set_mmq_split_k(ops_backend *be, int on) {
  cuda_impl_of(be)->mmq_split = on;
}

extern "C" void cuda_backend_set_mmq_v2(ops_backend *be, int mode) {
  cuda_impl_of(be)->mmq_v2 = mode >= 1 && mode <= 3 ? mode : 0;
}

extern "C" void cuda_backend_set_mmq_bf16(ops_backend *be, int mode) {
  cuda_impl_of(be)->mmq_bf16 = mode >= 1 && mode <= 2 ? mode : 0;
}

extern "C" void cuda_backend_set_graph_piece(ops_backend *be, int64_t nodes) {
  cuda_impl_of(be)->piece_at = nodes > 0 ? nodes : 0;
}

extern "C" void cuda_backend_step_begin(ops_backend *be, int64_t n_tokens) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || !ci->graphs || ci->recording || n_tokens < 1 || n_tokens > ci->graph_max_tok)
    return;
  /* The previous step may still read the ring (a graph launched without a download). */
  if (!cuda_check(ci, cudaStreamSynchronize(ci->stream), "step sync")) return;
  graph_time_collect(ci);
  ci->ring_off = 0;
  ci->log_n = ci->log_args_n = ci->log_offs_n = 0;
  ci->cap_t0 = host_now();
  ci->piece_done = ci->step_launched = 0;
  ci->recording = 1;
}

extern "C" void cuda_backend_step_end(ops_backend *be) {
  cuda_impl *ci = cuda_impl_of(be);
  cuda_flush(ci);
  if (ci->offload) cuda_offload_step_end(ci);
}

extern "C" void cuda_backend_graph_times(ops_backend *be, double *capture_s, double *update_s,
                                         double *gpu_s) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->ev_pending && !ci->recording && cudaStreamSynchronize(ci->stream) == cudaSuccess)
    graph_time_collect(ci);
  *capture_s = ci->t_capture;
  *update_s = ci->t_update;
  *gpu_s = ci->t_gpu;
}

extern "C" void cuda_backend_graph_stats(ops_backend *be, int64_t *launches, int64_t *builds,
                                         int64_t *updates) {
  cuda_impl *ci = cuda_impl_of(be);
  *launches = ci->graph_launches;
  *builds = ci->graph_builds;
  if (updates) *updates = ci->graph_updates;
}

/* ---- memory entries ---- */

/* ops.h bind: the calling thread's current device becomes this backend's. Kernels, cuBLAS
 * and the runtime's allocations go to the current device, so every thread that issues work
 * (the server's engine thread, each pipeline stage in turn) binds first; the memory entries
 * below bind themselves (the cache calls them outside a forward pass). */
static void cu_bind(ops_backend *be) {
  cuda_impl *ci = (cuda_impl *)be->impl; /* not cuda_impl_of: binding launches nothing deferred */
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != ci->device) cuda_check(ci, cudaSetDevice(ci->device), "set device");
}

static void *cu_alloc(ops_backend *be, size_t bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  cu_bind(be);
  void *p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
    cudaGetLastError(); /* out of memory is reported by the caller (NULL), not sticky */
    return NULL;
  }
  if (!cuda_check(ci, cudaMemsetAsync(p, 0, bytes ? bytes : 1, ci->stream), "alloc memset")) {
    cudaFree(p);
    return NULL;
  }
  return p;
}

/* ops.h mem_info: the current device's free / total bytes (cudaMemGetInfo), after the
 * queued work, so memory this backend freed or allocated asynchronously is counted. */
static int cu_mem_info(ops_backend *be, int64_t *free_bytes, int64_t *total_bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  size_t f = 0, t = 0;
  if (cudaStreamSynchronize(ci->stream) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
    (void)cudaGetLastError();
    return ANNA_EIO;
  }
  *free_bytes = (int64_t)f;
  *total_bytes = (int64_t)t;
  return 0;
}

static void cu_free(ops_backend *be, void *p) {
  if (!p) return;
  cu_bind(be);
  cudaFree(p);
}

static void cu_memset0(ops_backend *be, void *p, size_t bytes) {
  cu_bind(be);
  cuda_memset_async(cuda_impl_of(be), p, bytes, "memset");
}

static void cu_upload(ops_backend *be, void *dst, const void *src, size_t bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  cu_bind(be);
  if (ci->err || !bytes) return;
  if (ci->recording) { /* staged in pinned memory: the replay reads it, the caller may reuse src */
    char *h, *d;
    if (!cuda_ring_reserve(be, bytes, &h, &d)) return;
    memcpy(h, src, bytes);
    cuda_copy_async(ci, dst, h, bytes, cudaMemcpyHostToDevice, "upload");
    return;
  }
  if (cuda_check(ci, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ci->stream), "upload"))
    cuda_check(ci, cudaStreamSynchronize(ci->stream), "upload sync");
}

static void cu_download(ops_backend *be, void *dst, const void *src, size_t bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  cu_bind(be);
  if (ci->err) {
    memset(dst, 0, bytes); /* defined output even after a failure; the error is reported */
    return;
  }
  if (!bytes) return;
  cuda_flush(ci); /* a download ends the recorded part of a step */
  if (ci->err) {
    memset(dst, 0, bytes);
    return;
  }
  if (cuda_check(ci, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ci->stream), "download"))
    cuda_check(ci, cudaStreamSynchronize(ci->stream), "download sync");
}

/* ops.h copy_to: a stage hand-off to another CUDA backend (the same device or a peer). Like
 * a download it ends this backend's recorded part of the step and waits for it; `to` has
 * launched nothing since its previous step ended (the context synchronizes every stage after
 * each step), so its later ops read the bytes. cudaMemcpyPeerAsync copies directly over
 * NVLink / PCIe between devices, or as a device copy on one. */
static void cu_copy_to(ops_backend *be, ops_backend *to, void *dst, const void *src, size_t bytes) {
  cu_bind(be);
  cuda_impl *ci = cuda_impl_of(be);
  const cuda_impl *di = (const cuda_impl *)to->impl;
  if (ci->err || !bytes) return;
  cuda_flush(ci);
  if (ci->err) return;
  if (cuda_check(ci, cudaMemcpyPeerAsync(dst, di->device, src, ci->device, bytes, ci->stream), "stage copy"))
    cuda_check(ci, cudaStreamSynchronize(ci->stream), "stage copy sync");
}

/* Device-to-device byte copy on the compute stream (prefix reuse copies KV rows and
 * recurrent state between sequences). */
static void cu_copy(ops_backend *be, void *dst, const void *src, size_t bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  cu_bind(be);
  if (!bytes || ci->err || dst == src) return;
  cuda_copy_async(ci, dst, src, bytes, cudaMemcpyDeviceToDevice, "copy");
}

/* ---- backend ---- */

extern "C" int cuda_backend_available(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n > 0;
}

extern "C" int cuda_backend_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

extern "C" int cuda_backend_describe(int i, char *name, size_t len, int64_t *mem_bytes) {
  cudaDeviceProp p;
  if (i < 0 || i >= cuda_backend_device_count() || cudaGetDeviceProperties(&p, i) != cudaSuccess) {
    (void)cudaGetLastError();
    return ANNA_ERANGE;
  }
  snprintf(name, len, "%s", p.name);
  *mem_bytes = (int64_t)p.totalGlobalMem;
  return 0;
}

extern "C" const char *cuda_backend_device_name(void) {
  static char name[256];
  cudaDeviceProp p;
  if (!cuda_backend_available() || cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "none";
  snprintf(name, sizeof name, "%s", p.name);
  return name;
}

extern "C" int cuda_backend_error(ops_backend *be, char *err, size_t errlen) {
  cuda_impl *ci = cuda_impl_of(be);
  cuda_flush(ci);
  if (!ci->err) cuda_check(ci, cudaStreamSynchronize(ci->stream), "sync");
  if (!ci->err) return 0;
  return put_err(err, errlen, ci->err, "%s", ci->msg);
}

extern "C" void cuda_backend_free(ops_backend *be) {
  if (!be) return;
  cuda_impl *ci = cuda_impl_of(be);
  if (ci) {
    if (ci->recording) cuda_flush(ci);
    if (ci->stream) cudaStreamSynchronize(ci->stream);
    for (int i = 0; i < CUDA_GRAPH_CACHE; i++) gent_free(&ci->gcache[i]);
    free(ci->log);
    free(ci->log_args);
    free(ci->log_offs);
    if (ci->ev0) cudaEventDestroy(ci->ev0);
    if (ci->ev1) cudaEventDestroy(ci->ev1);
    if (ci->copy_stream) cudaStreamDestroy(ci->copy_stream);
    memset(&ci->pnorm, 0, sizeof ci->pnorm); /* a deferred norm nobody reads any more */
    cuda_offload_free(ci);
    cuda_backend_drop_mirrors(be);
    if (ci->deq) cudaFree(ci->deq);
    if (ci->att_part) cudaFree(ci->att_part);
    if (ci->act16) cudaFree(ci->act16);
    if (ci->moe_deq) cudaFree(ci->moe_deq);
    if (ci->moe_host) cudaFreeHost(ci->moe_host);
    if (ci->gdn_scr) cudaFree(ci->gdn_scr);
    if (ci->topk_scr) cudaFree(ci->topk_scr);
    if (ci->pnorm_count) cudaFree(ci->pnorm_count);
    if (ci->route_count) cudaFree(ci->route_count);
    if (ci->ring_d) cudaFree(ci->ring_d);
    if (ci->ring_h) cudaFreeHost(ci->ring_h);
    if (ci->blas) cublasDestroy(ci->blas);
    if (ci->stream) cudaStreamDestroy(ci->stream);
    free(ci);
  }
  free(be);
}

/* Not while a step is being recorded: a graph is timed as a whole. */
static void cu_sync(ops_backend *be) {
  cuda_impl *ci = cuda_impl_of(be);
  if (!ci->err && !ci->recording) cuda_check(ci, cudaStreamSynchronize(ci->stream), "sync");
}

/* The table's offload_stats entry (the same fields). */
static void cu_offload_stats(ops_backend *be, ops_offload_stats *st) {
  cuda_offload_stats o;
  cuda_backend_offload_stats(be, &o);
  *st = (ops_offload_stats){o.on, o.cache_per_layer, o.staging_slots, o.mirrored, o.routed, o.hits,
                             o.swaps, o.bytes_mirror, o.bytes_file, o.device_bytes, o.summary};
}

/* Statistics for the table's step_stats entry. */
static void cu_step_stats(ops_backend *be, ops_step_stats *st) {
  cuda_backend_graph_stats(be, &st->steps, &st->builds, &st->updates);
  cuda_backend_graph_times(be, &st->capture_s, &st->update_s, &st->gpu_s);
}

extern "C" int cuda_backend_create_tuned(ops_backend **out, int64_t max_batch, const anna_tuning *t, char *err,
                                         size_t errlen) {
  return cuda_backend_create_device(out, 0, max_batch, t, err, errlen);
}

extern "C" int cuda_backend_create_device(ops_backend **out, int device, int64_t max_batch, const anna_tuning *t,
                                          char *err, size_t errlen) {
  *out = NULL;
  if (!cuda_backend_available()) return put_err(err, errlen, ANNA_EUNSUPPORTED, "cuda: no CUDA device found");
  const int have = cuda_backend_device_count();
  if (device < 0 || device >= have)
    return put_err(err, errlen, ANNA_EUNSUPPORTED,
                   "device 'cuda:%d': only %d cuda device%s visible (0..%d; CUDA_VISIBLE_DEVICES selects them)", device,
                   have, have == 1 ? "" : "s", have - 1);
  if (max_batch < 1) max_batch = 1;
  ops_backend *be = (ops_backend *)calloc(1, sizeof *be);
  cuda_impl *ci = (cuda_impl *)calloc(1, sizeof *ci);
  if (!be || !ci) {
    free(be);
    free(ci);
    return put_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  be->impl = ci;
  ci->device = device;
  cudaError_t e;
  const char *what = "set device";
  {
    /* what the device had before this backend's scratch: the expert offload's budget */
    size_t f = 0, tot = 0;
    if (cudaSetDevice(device) == cudaSuccess && cudaMemGetInfo(&f, &tot) == cudaSuccess) ci->free_at_create = f;
    (void)cudaGetLastError();
  }
  ci->ring_cap = RING_MIN;
  if ((size_t)max_batch * 64 > ci->ring_cap) ci->ring_cap = (size_t)max_batch * 64;
  if ((e = cudaSetDevice(device)) != cudaSuccess ||
      (what = "stream", e = cudaStreamCreateWithFlags(&ci->stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (what = "copy stream", e = cudaStreamCreateWithFlags(&ci->copy_stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (what = "scratch", e = cudaMalloc((void **)&ci->deq, DEQ_FLOATS * sizeof(float))) != cudaSuccess ||
      (what = "ring", e = cudaMalloc((void **)&ci->ring_d, ci->ring_cap)) != cudaSuccess ||
      (what = "attention scratch", e = cudaMalloc((void **)&ci->att_part, ATT_PART_FLOATS * sizeof(float))) !=
          cudaSuccess ||
      (what = "topk scratch", e = cudaMalloc(&ci->topk_scr, TOPK_SCR_BYTES)) != cudaSuccess ||
      (what = "norm counter", e = cudaMalloc((void **)&ci->pnorm_count, sizeof(int))) != cudaSuccess ||
      (what = "norm counter", e = cudaMemset(ci->pnorm_count, 0, sizeof(int))) != cudaSuccess ||
      (what = "route counter", e = cudaMalloc((void **)&ci->route_count, sizeof(int))) != cudaSuccess ||
      (what = "route counter", e = cudaMemset(ci->route_count, 0, sizeof(int))) != cudaSuccess ||
      (what = "pinned ring", e = cudaHostAlloc((void **)&ci->ring_h, ci->ring_cap, cudaHostAllocDefault)) !=
          cudaSuccess) {
    int code = e == cudaErrorMemoryAllocation ? ANNA_ENOMEM : ANNA_EIO;
    cudaGetLastError();
    cuda_backend_free(be);
    return put_err(err, errlen, code, "cuda backend: %s: %s", what, cudaGetErrorString(e));
  }
  ci->deq_floats = DEQ_FLOATS;
  cuda_backend_set_gemm_tile(be, 0); /* the whole scratch */
  ci->att_part_floats = ATT_PART_FLOATS;
  ci->topk_scr_bytes = TOPK_SCR_BYTES;
  ci->mv_smem = cuda_matmul_setup();
  ci->max_batch = max_batch;
  /* Programmatic launches in decode graphs (cuda_launch_pdl) need sm_90 (read once, here). */
  {
    int major = 0;
    ci->pdl_ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
    if (cudaDeviceGetAttribute(&ci->n_sm, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      (void)cudaGetLastError();
      ci->n_sm = 0;
    }
    ci->pdl = ci->pdl_ok;
    ci->piece_at = CUDA_GRAPH_PIECE;
  }
  /* The automatic paths (the variants these fields select are test hooks, cuda_backend.h;
   * the retired A/B runs: bench/RESULTS.md, "Variants retired"); calloc left the rest 0. */
  ci->attn_variant = CUDA_ATTN_DEFAULT;
  ci->flash_variant = CUDA_FLASH_MMA;
  ci->gemm_variant = CUDA_GEMM_BF16;
  ci->moe_variant = CUDA_MOE_DEFAULT;
  ci->gdn_variant = CUDA_GDN_HEAD;
  ci->gdn_scan_cols = 0;
  /* the runtime knob (base/tuning.h): the MoE prefill's dequantized experts */
  ci->moe_deq_cap = t && t->cuda_moe_deq_mb > 0 ? (size_t)t->cuda_moe_deq_mb << 20 : (size_t)2 << 30;
  cuda_backend_set_decode_mmq(be, t && t->cuda_decode_mmq); /* graphs up to 8 tokens without it: MV_MAX_TOK */
  cuda_backend_set_batch_invariant(be, t && t->cuda_batch_invariant);
  ci->mmq_split = t && t->cuda_mmq_split_k;
  cuda_backend_set_mmq_v2(be, t ? t->cuda_mmq_v2 : 0);
  cuda_backend_set_mmq_bf16(be, t ? t->cuda_mmq_bf16 : 0);
  if (cublasCreate(&ci->blas) != CUBLAS_STATUS_SUCCESS) {
    ci->blas = NULL;
    cuda_backend_free(be);
    return put_err(err, errlen, ANNA_EIO, "cuda backend: cannot create a cuBLAS handle");
  }
  cublasSetStream(ci->blas, ci->stream);
  /* Replay timing only: without the events the steps run untimed. */
  if (cudaEventCreate(&ci->ev0) != cudaSuccess || cudaEventCreate(&ci->ev1) != cudaSuccess) {
    (void)cudaGetLastError();
    if (ci->ev0) cudaEventDestroy(ci->ev0);
    ci->ev0 = ci->ev1 = NULL;
  }
  /* Default math: SGEMM stays f32 (no TF32: the exact path holds the fixtures' logits to
   * 2e-3), and bf16 GemmEx (cuda_gemm.cu) may use tensor cores. */
  cublasSetMathMode(ci->blas, CUBLAS_DEFAULT_MATH);
  be->name = "cuda";
  be->alloc = cu_alloc;
  be->free = cu_free;
  be->memset0 = cu_memset0;
  be->upload = cu_upload;
  be->download = cu_download;
  be->sync = cu_sync;
  be->copy = cu_copy;
  be->copy_to = cu_copy_to;
  be->matmul = cuda_op_matmul;
  be->matmul_group = cuda_op_matmul_group;
  be->matmul_group_route = cuda_op_matmul_group_route;
  be->act_matmul = cuda_op_act_matmul;
  be->act_matmul_gated_add = cuda_op_act_matmul_gated_add;
  be->embed = cuda_op_embed;
  be->rmsnorm = cuda_op_rmsnorm;
  be->rope = cuda_op_rope;
  be->attention = cuda_op_attention;
  be->act_mul = cuda_op_act_mul;
  be->conv1d_silu = cuda_op_conv1d_silu;
  be->gdn_chunked = cuda_op_gdn_chunked;
  be->gdn_recurrent = cuda_op_gdn_recurrent;
  be->gdn_gates = cuda_op_gdn_gates;
  be->l2norm = cuda_op_l2norm;
  be->rmsnorm_gated = cuda_op_rmsnorm_gated;
  be->gdn_step = ci->batch_inv ? NULL : cuda_op_gdn_step; /* see cuda_backend_set_batch_invariant */
  be->add_rmsnorm = cuda_op_add_rmsnorm;
  be->norm_rope = cuda_op_norm_rope;
  be->add = cuda_op_add;
  be->scale = cuda_op_scale;
  be->mul_sigmoid = cuda_op_mul_sigmoid;
  be->copy_rows = cuda_op_copy_rows;
  be->scatter_rows = cuda_op_scatter_rows;
  be->softcap = cuda_op_softcap;
  be->moe_ffn = cuda_op_moe_ffn;
  be->moe_route = cuda_op_moe_route;
  be->topk = cuda_op_topk;
  be->sample_tail = cuda_op_sample_tail;
  be->mask_rows = cuda_op_mask_rows;
  cuda_encoder_ops_install(be); /* vision / audio encoders, the codec's waveform decoder */
  cuda_comm_install(be);        /* tensor parallelism's NCCL all-reduce, when built with NCCL */
  be->destroy = cuda_backend_free;
  be->bind = cu_bind;
  be->error = cuda_backend_error;
  be->step_begin = cuda_backend_step_begin;
  be->step_end = cuda_backend_step_end;
  be->set_graphs = cuda_backend_set_graphs;
  be->step_stats = cu_step_stats;
  be->mem_info = cu_mem_info;
  be->offload_stats = cu_offload_stats;
  be->warmup = 1; /* weights are mirrored on first use */
  /* Quantized caches (cuda_kv.cu writes them, cuda_attn.cu's k_attn_kv reads them) and the
   * residual ring with the tuning key cuda_kv_quant (on by default since the kv test families
   * passed on an H100, session 17; bench/notes/kvq.md); off: f32 caches only. */
  ci->kv_quant = t && t->cuda_kv_quant;
  be->kv_types = ci->kv_quant ? 0x7fu : 1u << OPS_KV_F32; /* F32, F16, Q8, Q4, TQ2..4 */
  be->residual_ring = ci->kv_quant;
  be->kv_store = ci->kv_quant ? cuda_op_kv_store : NULL;
  *out = be;
  return 0;
}
