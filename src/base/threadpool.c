/* threadpool.c: workers wait on a generation counter; threadpool_run bumps it and counts
 * completions. A short spin before sleeping keeps per-op latency low in decode, where one
 * token runs hundreds of small parallel loops. */
#include "base/threadpool.h"

#include "base/error.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

/* About 50-100 us of polling before sleeping on the condition variable. */
#define SPIN_LIMIT 4096

static inline void cpu_relax(void) {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

struct threadpool {
  int n;
  pthread_t *threads;
  pthread_mutex_t mu;
  pthread_cond_t cv_work;
  pthread_cond_t cv_done;
  atomic_uint_fast64_t gen; /* bumped per run */
  atomic_int pending;       /* workers still running the current task */
  int stop;
  threadpool_fn fn;
  void *ctx;
};

struct worker_arg {
  threadpool *tp;
  int ith;
};

static void *worker_main(void *p) {
  struct worker_arg *wa = p;
  threadpool *tp = wa->tp;
  int ith = wa->ith;
  free(wa);
  uint_fast64_t seen = 0;
  for (;;) {
    /* Spin a little: the next op usually follows within microseconds. Yield now and then
     * so a spinning worker never starves a busy thread on an oversubscribed machine. */
    for (int spins = 0; atomic_load_explicit(&tp->gen, memory_order_acquire) == seen && spins < SPIN_LIMIT; spins++) {
      cpu_relax();
      if ((spins & 63) == 63) sched_yield();
    }
    if (atomic_load_explicit(&tp->gen, memory_order_acquire) == seen) {
      pthread_mutex_lock(&tp->mu);
      while (atomic_load(&tp->gen) == seen && !tp->stop) pthread_cond_wait(&tp->cv_work, &tp->mu);
      pthread_mutex_unlock(&tp->mu);
    }
    if (tp->stop) return NULL;
    seen = atomic_load(&tp->gen);
    tp->fn(tp->ctx, ith, tp->n);
    if (atomic_fetch_sub(&tp->pending, 1) == 1) {
      pthread_mutex_lock(&tp->mu);
      pthread_cond_signal(&tp->cv_done);
      pthread_mutex_unlock(&tp->mu);
    }
  }
}

int threadpool_create(threadpool **out, int n_threads, char *err, size_t errlen) {
  *out = NULL;
  if (n_threads <= 0) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    n_threads = c > 0 ? (int)c : 1;
  }
  if (n_threads > 1024) return anna_err(err, errlen, ANNA_EINVAL, "too many threads: %d", n_threads);
  threadpool *tp = calloc(1, sizeof *tp);
  if (!tp) return anna_err(err, errlen, ANNA_ENOMEM, "threadpool: out of memory");
  tp->n = n_threads;
  pthread_mutex_init(&tp->mu, NULL);
  pthread_cond_init(&tp->cv_work, NULL);
  pthread_cond_init(&tp->cv_done, NULL);
  atomic_init(&tp->gen, 0);
  atomic_init(&tp->pending, 0);
  tp->threads = calloc((size_t)n_threads, sizeof(pthread_t));
  if (!tp->threads) {
    free(tp);
    return anna_err(err, errlen, ANNA_ENOMEM, "threadpool: out of memory");
  }
  for (int i = 1; i < n_threads; i++) {
    struct worker_arg *wa = malloc(sizeof *wa);
    if (wa) {
      wa->tp = tp;
      wa->ith = i;
    }
    if (!wa || pthread_create(&tp->threads[i], NULL, worker_main, wa) != 0) {
      free(wa);
      tp->n = i; /* join only what started */
      threadpool_free(tp);
      return anna_err(err, errlen, ANNA_ENOMEM, "threadpool: cannot start thread %d", i);
    }
  }
  *out = tp;
  return 0;
}

void threadpool_free(threadpool *tp) {
  if (!tp) return;
  pthread_mutex_lock(&tp->mu);
  tp->stop = 1;
  atomic_fetch_add(&tp->gen, 1);
  pthread_cond_broadcast(&tp->cv_work);
  pthread_mutex_unlock(&tp->mu);
  for (int i = 1; i < tp->n; i++) pthread_join(tp->threads[i], NULL);
  pthread_mutex_destroy(&tp->mu);
  pthread_cond_destroy(&tp->cv_work);
  pthread_cond_destroy(&tp->cv_done);
  free(tp->threads);
  free(tp);
}

int threadpool_size(const threadpool *tp) {
  return tp ? tp->n : 1;
}

void threadpool_run(threadpool *tp, threadpool_fn fn, void *ctx) {
  if (!tp || tp->n == 1) {
    fn(ctx, 0, 1);
    return;
  }
  tp->fn = fn;
  tp->ctx = ctx;
  atomic_store(&tp->pending, tp->n - 1);
  pthread_mutex_lock(&tp->mu);
  atomic_fetch_add_explicit(&tp->gen, 1, memory_order_release);
  pthread_cond_broadcast(&tp->cv_work);
  pthread_mutex_unlock(&tp->mu);
  fn(ctx, 0, tp->n);
  /* Spin first, then sleep, for the other workers to finish. */
  for (int spins = 0; atomic_load(&tp->pending) > 0 && spins < SPIN_LIMIT; spins++) {
    cpu_relax();
    if ((spins & 63) == 63) sched_yield();
  }
  if (atomic_load(&tp->pending) > 0) {
    pthread_mutex_lock(&tp->mu);
    while (atomic_load(&tp->pending) > 0) pthread_cond_wait(&tp->cv_done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
  }
}
