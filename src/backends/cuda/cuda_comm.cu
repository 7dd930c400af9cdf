/* cuda_comm.cu: tensor parallelism's collective on CUDA backends (ops.h comm_*; runtime/tp.h
 * is the caller): one NCCL communicator per device from ncclCommInitAll in this process, and
 * ncclAllReduce (sum, f32, in place) on each backend's compute stream. Every rank calls it
 * from its own thread (tp_comm_exec), so no ncclGroupStart/End is needed: each call is its
 * rank's single operation. Compiled with NCCL only (ANNA_HAVE_NCCL, cmake/nccl.cmake); without
 * it the entries stay NULL and the context uses the host transport. Not recordable in a
 * graph yet: the step's recorded part is flushed first, as for a download. */
#include "backends/cuda/cuda_internal.h"

#include "anna/anna.h"

#include <stdio.h>

#ifdef ANNA_HAVE_NCCL
#include <nccl.h>

#include <stdlib.h>

/* Most ranks of one communicator (runtime/tp.h: model/shard.h SHARD_MAX). */
#define CU_COMM_MAX 8

typedef struct cu_comm {
  int n;
  ncclComm_t comm[CU_COMM_MAX];
} cu_comm;

static void cu_comm_free(void *p) {
  cu_comm *c = (cu_comm *)p;
  if (!c) return;
  for (int i = 0; i < c->n; i++)
    if (c->comm[i]) ncclCommDestroy(c->comm[i]);
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
        if (err && errlen) snprintf(err, errlen, "nccl: ranks %d and %d are both on cuda device %d", j, i, devs[i]);
        return NULL;
      }
  }
  cu_comm *c = (cu_comm *)calloc(1, sizeof *c);
  if (!c) {
    if (err && errlen) snprintf(err, errlen, "out of memory");
    return NULL;
  }
  const ncclResult_t r = ncclCommInitAll(c->comm, n, devs);
  if (r != ncclSuccess) {
    if (err && errlen) snprintf(err, errlen, "nccl: ncclCommInitAll over %d devices: %s", n, ncclGetErrorString(r));
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
  if (cudaGetDevice(&cur) != cudaSuccess || cur != ci->device) cuda_check(ci, cudaSetDevice(ci->device), "set device");
  if (ci->err || count <= 0) return;
  cuda_flush(ci);
  if (ci->err) return;
  const ncclResult_t r = ncclAllReduce(buf, buf, (size_t)count, ncclFloat, ncclSum, c->comm[rank], ci->stream);
  if (r != ncclSuccess) cuda_fail(ci, ANNA_EIO, "nccl: all-reduce of %lld floats: %s", (long long)count, ncclGetErrorString(r));
}

void cuda_comm_install(ops_backend *be) {
  be->comm_create = cu_comm_create;
  be->comm_all_reduce = cu_comm_all_reduce;
  be->comm_free = cu_comm_free;
}
#else
void cuda_comm_install(ops_backend *be) {
  (void)be; /* no NCCL in this build: the host transport only */
}
#endif
