/* tp.c: the tensor-parallel communicator (tp.h): worker threads and the host / backend
 * all-reduce. */
#include "runtime/tp.h"

#include "base/error.h"
#include "model/shard.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct tp_comm {
  int n, transport;
  ops_backend *be[SHARD_MAX];
  /* host transport: each rank's partial, and the sum every rank uploads */
  float *part[SHARD_MAX], *sum;
  int64_t max_floats;
  /* the all-reduce's barrier: it opens when every rank still running the exec has arrived, so
   * a rank whose forward returned early (an error) leaves the others a wrong sum and its
   * error, never a hang (host transport) */
  pthread_mutex_t bmu;
  pthread_cond_t bcv;
  int bcount, bdone;
  uint64_t bgen;
  void *dev_comm; /* nccl: the backend's communicator */
  /* workers (ranks 1..n-1): a job is (fn, arg) of generation gen */
  pthread_t th[SHARD_MAX];
  int n_th;
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  uint64_t gen;
  int n_done, quit;
  void (*fn)(void *arg, int rank);
  void *arg;
};

static void bar_wait(tp_comm *c) {
  pthread_mutex_lock(&c->bmu);
  const uint64_t gen = c->bgen;
  if (++c->bcount >= c->n - c->bdone) {
    c->bcount = 0;
    c->bgen++;
    pthread_cond_broadcast(&c->bcv);
  } else {
    while (gen == c->bgen)
      pthread_cond_wait(&c->bcv, &c->bmu);
  }
  pthread_mutex_unlock(&c->bmu);
}

/* A rank's part of the exec returned: the barrier stops waiting for it. */
static void bar_leave(tp_comm *c) {
  pthread_mutex_lock(&c->bmu);
  c->bdone++;
  if (c->bcount > 0 && c->bcount >= c->n - c->bdone) {
    c->bcount = 0;
    c->bgen++;
    pthread_cond_broadcast(&c->bcv);
  }
  pthread_mutex_unlock(&c->bmu);
}

typedef struct worker_arg {
  tp_comm *c;
  int rank;
} worker_arg;

static void *worker(void *p) {
  tp_comm *c = ((worker_arg *)p)->c;
  const int rank = ((worker_arg *)p)->rank;
  free(p);
  uint64_t seen = 0;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (c->gen == seen && !c->quit)
      pthread_cond_wait(&c->go, &c->mu);
    if (c->quit) break;
    seen = c->gen;
    void (*fn)(void *, int) = c->fn;
    void *arg = c->arg;
    pthread_mutex_unlock(&c->mu);
    fn(arg, rank);
    bar_leave(c);
    pthread_mutex_lock(&c->mu);
    if (++c->n_done == c->n - 1) pthread_cond_signal(&c->done);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

int tp_transport_pick(const char *name, ops_backend *const *be, int n, int distinct_devices,
                      int *transport, char *err, size_t errlen) {
  const int have = n > 0 && be[0]->comm_create && be[0]->comm_all_reduce;
  if (!name || !strcmp(name, "auto")) {
    *transport = have && distinct_devices ? TP_COMM_NCCL : TP_COMM_HOST;
    return 0;
  }
  if (!strcmp(name, "host")) {
    *transport = TP_COMM_HOST;
    return 0;
  }
  if (!strcmp(name, "nccl")) {
    if (!have)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "--tp-comm nccl: this build's %s backend has no NCCL collective (build with "
                      "CUDA and NCCL, "
                      "or use --tp-comm host)",
                      be[0]->name ? be[0]->name : "device");
    if (!distinct_devices)
      return anna_err(
          err, errlen, ANNA_EUNSUPPORTED,
          "--tp-comm nccl: the %d shards must be on distinct devices (--device cuda:0,cuda:1)", n);
    *transport = TP_COMM_NCCL;
    return 0;
  }
  return anna_err(err, errlen, ANNA_EINVAL, "--tp-comm '%s': expected auto, host or nccl", name);
}

const char *tp_comm_transport_name(const tp_comm *c) {
  return c->transport == TP_COMM_NCCL ? "nccl" : "host";
}

void tp_comm_free(tp_comm *c) {
  if (!c) return;
  if (c->n_th) {
    pthread_mutex_lock(&c->mu);
    c->quit = 1;
    pthread_cond_broadcast(&c->go);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_th; i++)
      pthread_join(c->th[i], NULL);
  }
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->go);
  pthread_cond_destroy(&c->done);
  pthread_mutex_destroy(&c->bmu);
  pthread_cond_destroy(&c->bcv);
  if (c->dev_comm) c->be[0]->comm_free(c->dev_comm);
  for (int i = 0; i < c->n; i++)
    free(c->part[i]);
  free(c->sum);
  free(c);
}

int tp_comm_create(tp_comm **out, int n, ops_backend *const *be, int transport, int64_t max_floats,
                   char *err, size_t errlen) {
  *out = NULL;
  if (n < 2 || n > SHARD_MAX)
    return anna_err(err, errlen, ANNA_EINVAL, "tensor parallel over %d shards", n);
  tp_comm *c = calloc(1, sizeof *c);
  if (!c) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  c->n = n;
  c->transport = transport;
  c->max_floats = max_floats;
  memcpy(c->be, be, sizeof(ops_backend *) * (size_t)n);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->go, NULL);
  pthread_cond_init(&c->done, NULL);
  pthread_mutex_init(&c->bmu, NULL);
  pthread_cond_init(&c->bcv, NULL);
  int rc = 0;
  if (transport == TP_COMM_HOST) {
    for (int i = 0; i < n && !rc; i++)
      if (!(c->part[i] = malloc(sizeof(float) * (size_t)(max_floats > 0 ? max_floats : 1))))
        rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    if (!rc && !(c->sum = malloc(sizeof(float) * (size_t)(max_floats > 0 ? max_floats : 1))))
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  } else if (!rc) {
    if (!be[0]->comm_create)
      rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "the backend has no collective");
    else if (!(c->dev_comm = be[0]->comm_create(be, n, err, errlen)))
      rc = ANNA_EUNSUPPORTED;
  }
  for (int r = 1; !rc && r < n; r++) {
    worker_arg *a = malloc(sizeof *a);
    if (!a) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      break;
    }
    *a = (worker_arg){c, r};
    if (pthread_create(&c->th[c->n_th], NULL, worker, a)) {
      free(a);
      rc = anna_err(err, errlen, ANNA_ENOMEM, "tensor parallel: cannot start a worker thread");
      break;
    }
    c->n_th++;
  }
  if (rc) {
    tp_comm_free(c);
    return rc;
  }
  *out = c;
  return 0;
}

void tp_comm_all_reduce(void *ctx, int rank, ops_backend *be, float *buf, int64_t count) {
  tp_comm *c = ctx;
  if (c->transport == TP_COMM_NCCL) {
    be->comm_all_reduce(be, c->dev_comm, rank, buf, count);
    return;
  }
  const size_t bytes = sizeof(float) * (size_t)count;
  /* the forward pass never asks beyond n_batch * hidden, what max_floats was sized from */
  be->download(be, c->part[rank], buf, bytes); /* synchronous: the shard's queue has drained */
  bar_wait(c);
  const int n = c->n;
  const int64_t i0 = count * rank / n, i1 = count * (rank + 1) / n;
  for (int64_t i = i0; i < i1; i++) {
    float s = c->part[0][i];
    for (int r = 1; r < n; r++)
      s += c->part[r][i];
    c->sum[i] = s;
  }
  bar_wait(c);
  /* c->sum is next written after the next call's first barrier, which every rank reaches
   * only after this upload has read it */
  be->upload(be, buf, c->sum, bytes);
}

void tp_comm_exec(void *ctx, void (*fn)(void *arg, int rank), void *arg) {
  tp_comm *c = ctx;
  pthread_mutex_lock(&c->bmu); /* nobody is inside the barrier between execs */
  c->bdone = c->bcount = 0;
  pthread_mutex_unlock(&c->bmu);
  pthread_mutex_lock(&c->mu);
  c->fn = fn;
  c->arg = arg;
  c->n_done = 0;
  c->gen++;
  pthread_cond_broadcast(&c->go);
  pthread_mutex_unlock(&c->mu);
  fn(arg, 0);
  bar_leave(c);
  pthread_mutex_lock(&c->mu);
  while (c->n_done < c->n - 1)
    pthread_cond_wait(&c->done, &c->mu);
  pthread_mutex_unlock(&c->mu);
}
