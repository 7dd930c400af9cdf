/* cuda_comm.cu: tensor parallelism's collective on CUDA backends (ops.h comm_*; runtime/tp.h
 * is the caller): one NCCL communicator per device from ncclCommInitAll in this process, and
 * ncclAllReduce (sum, f32, in place) on each backend's compute stream. Every rank calls it
 * from its own thread (tp_comm_exec), so no ncclGroupStart/End is needed: each call is its
 * rank's single operation. Compiled when NCCL's header is found (ANNA_HAVE_NCCL,
 * cmake/nccl.cmake); the library is opened at run time (nccl_open). Without it the entries
 * stay NULL and the context uses the host transport. Not recordable in a graph yet: the
 * step's recorded part is flushed first, as for a download. */
#include "backends/cuda/cuda_internal.h"

#include "anna/anna.h"

#include <stdio.h>

#ifdef ANNA_HAVE_NCCL
#include <nccl.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

/* Most ranks of one communicator (runtime/tp.h: model/shard.h SHARD_MAX). */
#define CU_COMM_MAX 8

/* libnccl is opened at the first communicator, not linked: a binary built with NCCL's header
 * still starts where the library is missing (one GPU, or no NCCL wheel), and --tp-comm auto
 * then falls back to the host transport. Tried: libnccl.so.2 on the loader's path, then the
 * library cmake found (ANNA_NCCL_PATH). */
typedef struct nccl_api {
  ncclResult_t (*init_all)(ncclComm_t *, int, const int *);
  ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t);
  ncclResult_t (*destroy)(ncclComm_t);
  const char *(*error_string)(ncclResult_t);
  int ok;
  char why[200];
} nccl_api;

static nccl_api g_nccl;
static pthread_once_t g_nccl_once = PTHREAD_ONCE_INIT;

static void nccl_open(void) {
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
#ifdef ANNA_NCCL_PATH
  if (!h) h = dlopen(ANNA_NCCL_PATH, RTLD_NOW | RTLD_LOCAL);
#endif
  if (!h) {
    const char *e = dlerror();
    snprintf(g_nccl.why, sizeof g_nccl.why, "cannot load libnccl.so.2 (%s)", e ? e : "not found");
    return;
  }
  g_nccl.init_all = (ncclResult_t(*)(ncclComm_t *, int, const int *))dlsym(h, "ncclCommInitAll");
  g_nccl.all_reduce = (ncclResult_t(*)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                       ncclComm_t, cudaStream_t))dlsym(h, "ncclAllReduce");
  g_nccl.destroy = (ncclResult_t(*)(ncclComm_t))dlsym(h, "ncclCommDestroy");
  g_nccl.error_string = (const char *(*)(ncclResult_t))dlsym(h, "ncclGetErrorString");
  g_nccl.ok = g_nccl.init_all && g_nccl.all_reduce && g_nccl.destroy && g_nccl.error_string;
  if (!g_nccl.ok)
    snprintf(g_nccl.why, sizeof g_nccl.why, "libnccl.so.2 lacks ncclCommInitAll / ncclAllReduce");
}

typedef struct cu_comm {
  int n;
  ncclComm_t comm[CU_COMM_MAX];
} cu_comm;

static void cu_comm_free(void *p) {
  cu_comm *c = (cu_comm *)p;
  if (!c) return;
  for (int i = 0; i < c->n; i++)
    if (c->comm[i]) g_nccl.destroy(c->comm[i]);
  free(c);
}

static void *cu_comm_create(ops_backend *const *be, int n, char *err, size_t errlen) {
  if (n < 2 || n > CU_COMM_MAX) {
    if (err && errlen) snprintf(err, errlen, "nccl: %d ranks (2..%d)", n, CU_COMM_MAX);
    return NULL;
  }
  int devs[CU_COMM_MAX];
  for (int i = 0; i < n; i++) {
    devs[i] = ((const cuda_impl *)be[i]->impl)->device;
    for (int j = 0; j < i; j++)
      if (devs[j] == devs[i]) {
        if (err && errlen)
          snprintf(err, errlen, "nccl: ranks %d and %d are both on cuda device %d", j, i, devs[i]);
        return NULL;
      }
  }
  pthread_once(&g_nccl_once, nccl_open);
  if (!g_nccl.ok) {
    if (err && errlen) snprintf(err, errlen, "nccl: %s", g_nccl.why);
    return NULL;
  }
  cu_comm *c = (cu_comm *)calloc(1, sizeof *c);
  if (!c) {
    if (err && errlen) snprintf(err, errlen, "out of memory");
    return NULL;
  }
  const ncclResult_t r = g_nccl.init_all(c->comm, n, devs);
  if (r != ncclSuccess) {
    if (err && errlen)
      snprintf(err, errlen, "nccl: ncclCommInitAll over %d devices: %s", n, g_nccl.error_string(r));
    free(c);
    return NULL;
  }
  c->n = n;
  return c;
}

static void cu_comm_all_reduce(ops_backend *be, void *p, int rank, float *buf, int64_t count) {
  cu_comm *c = (cu_comm *)p;
  cuda_impl *ci = cuda_impl_of(be); /* launches a deferred norm that may write buf */
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != ci->device)
    cuda_check(ci, cudaSetDevice(ci->device), "set device");
  if (ci->err || count <= 0) return;
  cuda_flush(ci);
  if (ci->err) return;
  const ncclResult_t r =
      g_nccl.all_reduce(buf, buf, (size_t)count, ncclFloat, ncclSum, c->comm[rank], ci->stream);
  if (r != ncclSuccess)
    cuda_fail(ci, ANNA_EIO, "nccl: all-reduce of %lld floats: %s", (long long)count,
              g_nccl.error_string(r));
}

void cuda_comm_install(ops_backend *be) {
  be->comm_create = cu_comm_create;
  be->comm_all_reduce = cu_comm_all_reduce;
  be->comm_free = cu_comm_free;
}
#else
void cuda_comm_install(ops_backend *be) {
  (void)be; /* no NCCL header at build time: the host transport only */
}
#endif
