/* cuda_backend.cu: device memory, the sticky error, the weight mirror, the pointer ring
 * and the op table. Kernels live in one .cu per op family. */
#include "backends/cuda/cuda_internal.h"

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
   * it is queued, also while the main stream is being captured. */
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
    if (ci->capturing) { /* freeing the old copy would wait on the captured stream */
      cuda_fail(ci, ANNA_ESTATE, "cuda: weight at %p grew during a captured step", host);
      return NULL;
    }
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
    if (ci->capturing) {
      cuda_fail(ci, ANNA_ESTATE, "cuda: op arguments of one captured step exceed the %zu-byte ring", ci->ring_cap);
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
  if (!cuda_check(ci, cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, ci->stream), "ring copy")) return NULL;
  return d;
}

/* ---- decode steps as graphs ---- */

/* Ends the capture and replays it: the executable graph of the last step is updated in
 * place when only kernel arguments changed, else rebuilt. */
static double host_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Adds the last replay's device time once it has finished (the caller synced). */
static void graph_time_collect(cuda_impl *ci) {
  if (!ci->ev_pending) return;
  float ms = 0.0f;
  if (cudaEventElapsedTime(&ms, ci->ev0, ci->ev1) == cudaSuccess) ci->t_gpu += 1e-3 * ms;
  else (void)cudaGetLastError(); /* not finished or not recorded: the replay goes uncounted */
  ci->ev_pending = 0;
}

static void graph_finish(cuda_impl *ci) {
  if (!ci->capturing) return;
  ci->capturing = 0;
  cudaGraph_t g = NULL;
  cudaError_t e = cudaStreamEndCapture(ci->stream, &g);
  const double t1 = host_now();
  ci->t_capture += t1 - ci->cap_t0;
  if (e != cudaSuccess || !g) {
    cuda_check(ci, e != cudaSuccess ? e : cudaErrorUnknown, "end capture");
    if (g) cudaGraphDestroy(g);
    return;
  }
  if (ci->err) { /* an op failed while captured: nothing of the step runs */
    cudaGraphDestroy(g);
    return;
  }
  if (ci->gexec) {
    cudaGraphExecUpdateResultInfo info;
    if (cudaGraphExecUpdate(ci->gexec, g, &info) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphExecDestroy(ci->gexec);
      ci->gexec = NULL;
    }
  }
  if (!ci->gexec) {
    if (!cuda_check(ci, cudaGraphInstantiate(&ci->gexec, g, 0), "graph instantiate")) {
      ci->gexec = NULL;
      cudaGraphDestroy(g);
      return;
    }
    ci->graph_builds++;
  }
  cudaGraphDestroy(g);
  ci->t_update += host_now() - t1;
  const bool timed = ci->ev0 && cudaEventRecord(ci->ev0, ci->stream) == cudaSuccess;
  if (cuda_check(ci, cudaGraphLaunch(ci->gexec, ci->stream), "graph launch")) ci->graph_launches++;
  ci->ev_pending = timed && cudaEventRecord(ci->ev1, ci->stream) == cudaSuccess;
}

extern "C" void cuda_backend_set_exact(ops_backend *be, int on) {
  cuda_impl_of(be)->exact = on;
}

extern "C" void cuda_backend_set_matvec_variant(ops_backend *be, int variant) {
  cuda_impl_of(be)->mv_variant = variant;
}

extern "C" void cuda_backend_set_graphs(ops_backend *be, int on) {
  cuda_impl_of(be)->graphs = on;
}

extern "C" void cuda_backend_step_begin(ops_backend *be, int64_t n_tokens) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || !ci->graphs || ci->capturing || n_tokens < 1 || n_tokens > CUDA_GRAPH_MAX_TOK) return;
  /* The previous step may still read the ring (a graph launched without a download). */
  if (!cuda_check(ci, cudaStreamSynchronize(ci->stream), "step sync")) return;
  graph_time_collect(ci);
  ci->ring_off = 0;
  ci->cap_t0 = host_now();
  if (cuda_check(ci, cudaStreamBeginCapture(ci->stream, cudaStreamCaptureModeRelaxed), "begin capture"))
    ci->capturing = 1;
}

extern "C" void cuda_backend_step_end(ops_backend *be) {
  graph_finish(cuda_impl_of(be));
}

extern "C" void cuda_backend_graph_times(ops_backend *be, double *capture_s, double *update_s, double *gpu_s) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->ev_pending && !ci->capturing && cudaStreamSynchronize(ci->stream) == cudaSuccess) graph_time_collect(ci);
  *capture_s = ci->t_capture;
  *update_s = ci->t_update;
  *gpu_s = ci->t_gpu;
}

extern "C" void cuda_backend_graph_stats(ops_backend *be, int64_t *launches, int64_t *builds) {
  cuda_impl *ci = cuda_impl_of(be);
  *launches = ci->graph_launches;
  *builds = ci->graph_builds;
}

/* ---- memory entries ---- */

static void *cu_alloc(ops_backend *be, size_t bytes) {
  cuda_impl *ci = cuda_impl_of(be);
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

static void cu_free(ops_backend *be, void *p) {
  (void)be;
  if (p) cudaFree(p);
}

static void cu_memset0(ops_backend *be, void *p, size_t bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || !bytes) return;
  cuda_check(ci, cudaMemsetAsync(p, 0, bytes, ci->stream), "memset");
}

static void cu_upload(ops_backend *be, void *dst, const void *src, size_t bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || !bytes) return;
  if (ci->capturing) { /* staged in pinned memory: the replay reads it, the caller may reuse src */
    char *h, *d;
    if (!cuda_ring_reserve(be, bytes, &h, &d)) return;
    memcpy(h, src, bytes);
    cuda_check(ci, cudaMemcpyAsync(dst, h, bytes, cudaMemcpyHostToDevice, ci->stream), "upload");
    return;
  }
  if (cuda_check(ci, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ci->stream), "upload"))
    cuda_check(ci, cudaStreamSynchronize(ci->stream), "upload sync");
}

static void cu_download(ops_backend *be, void *dst, const void *src, size_t bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err) {
    memset(dst, 0, bytes); /* defined output even after a failure; the error is reported */
    return;
  }
  if (!bytes) return;
  graph_finish(ci); /* a download ends the captured part of a step */
  if (ci->err) {
    memset(dst, 0, bytes);
    return;
  }
  if (cuda_check(ci, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ci->stream), "download"))
    cuda_check(ci, cudaStreamSynchronize(ci->stream), "download sync");
}

/* Device-to-device byte copy on the compute stream (prefix reuse copies KV rows and
 * recurrent state between sequences). */
static void cu_copy(ops_backend *be, void *dst, const void *src, size_t bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  if (!bytes || ci->err || dst == src) return;
  cuda_check(ci, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ci->stream), "copy");
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

extern "C" const char *cuda_backend_device_name(void) {
  static char name[256];
  cudaDeviceProp p;
  if (!cuda_backend_available() || cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "none";
  snprintf(name, sizeof name, "%s", p.name);
  return name;
}

extern "C" int cuda_backend_error(ops_backend *be, char *err, size_t errlen) {
  cuda_impl *ci = cuda_impl_of(be);
  graph_finish(ci);
  if (!ci->err) cuda_check(ci, cudaStreamSynchronize(ci->stream), "sync");
  if (!ci->err) return 0;
  return put_err(err, errlen, ci->err, "%s", ci->msg);
}

extern "C" void cuda_backend_free(ops_backend *be) {
  if (!be) return;
  cuda_impl *ci = cuda_impl_of(be);
  if (ci) {
    if (ci->capturing) graph_finish(ci);
    if (ci->stream) cudaStreamSynchronize(ci->stream);
    if (ci->gexec) cudaGraphExecDestroy(ci->gexec);
    if (ci->ev0) cudaEventDestroy(ci->ev0);
    if (ci->ev1) cudaEventDestroy(ci->ev1);
    if (ci->copy_stream) cudaStreamDestroy(ci->copy_stream);
    cuda_backend_drop_mirrors(be);
    if (ci->deq) cudaFree(ci->deq);
    if (ci->att_part) cudaFree(ci->att_part);
    if (ci->act16) cudaFree(ci->act16);
    if (ci->gdn_scr) cudaFree(ci->gdn_scr);
    if (ci->ring_d) cudaFree(ci->ring_d);
    if (ci->ring_h) cudaFreeHost(ci->ring_h);
    if (ci->blas) cublasDestroy(ci->blas);
    if (ci->stream) cudaStreamDestroy(ci->stream);
    free(ci);
  }
  free(be);
}

/* Not while a step is being captured: a graph is timed as a whole. */
static void cu_sync(ops_backend *be) {
  cuda_impl *ci = cuda_impl_of(be);
  if (!ci->err && !ci->capturing) cuda_check(ci, cudaStreamSynchronize(ci->stream), "sync");
}

extern "C" int cuda_backend_create(ops_backend **out, int64_t max_batch, char *err, size_t errlen) {
  *out = NULL;
  if (!cuda_backend_available()) return put_err(err, errlen, ANNA_EUNSUPPORTED, "cuda: no CUDA device found");
  if (max_batch < 1) max_batch = 1;
  ops_backend *be = (ops_backend *)calloc(1, sizeof *be);
  cuda_impl *ci = (cuda_impl *)calloc(1, sizeof *ci);
  if (!be || !ci) {
    free(be);
    free(ci);
    return put_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  be->impl = ci;
  cudaError_t e;
  const char *what = "set device";
  ci->ring_cap = RING_MIN;
  if ((size_t)max_batch * 64 > ci->ring_cap) ci->ring_cap = (size_t)max_batch * 64;
  if ((e = cudaSetDevice(0)) != cudaSuccess ||
      (what = "stream", e = cudaStreamCreateWithFlags(&ci->stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (what = "copy stream", e = cudaStreamCreateWithFlags(&ci->copy_stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (what = "scratch", e = cudaMalloc((void **)&ci->deq, DEQ_FLOATS * sizeof(float))) != cudaSuccess ||
      (what = "ring", e = cudaMalloc((void **)&ci->ring_d, ci->ring_cap)) != cudaSuccess ||
      (what = "attention scratch", e = cudaMalloc((void **)&ci->att_part, ATT_PART_FLOATS * sizeof(float))) !=
          cudaSuccess ||
      (what = "pinned ring", e = cudaHostAlloc((void **)&ci->ring_h, ci->ring_cap, cudaHostAllocDefault)) !=
          cudaSuccess) {
    int code = e == cudaErrorMemoryAllocation ? ANNA_ENOMEM : ANNA_EIO;
    cudaGetLastError();
    cuda_backend_free(be);
    return put_err(err, errlen, code, "cuda backend: %s: %s", what, cudaGetErrorString(e));
  }
  ci->deq_floats = DEQ_FLOATS;
  ci->att_part_floats = ATT_PART_FLOATS;
  ci->mv_smem = cuda_matmul_setup();
  ci->max_batch = max_batch;
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
  be->matmul = cuda_op_matmul;
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
  be->gdn_step = cuda_op_gdn_step;
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
  *out = be;
  return 0;
}
