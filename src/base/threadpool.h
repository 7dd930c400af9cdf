/* threadpool.h: a fixed pool of worker threads for data-parallel loops.
 *
 * The pool owns its threads from threadpool_create until threadpool_free. One caller at a
 * time runs a parallel loop with threadpool_run: the function is called once per worker
 * index 0..n_threads-1 (the caller's own thread is worker 0), and threadpool_run returns
 * when all have finished. Work splitting is the caller's business (threadpool_range gives
 * the usual even split). Workers spin briefly then sleep, so back-to-back small loops in
 * the decode path do not pay a futex wake each. Not reentrant: a task must not call
 * threadpool_run on the same pool.
 */
#ifndef ANNA_BASE_THREADPOOL_H
#define ANNA_BASE_THREADPOOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct threadpool threadpool;

/* fn(ctx, worker_index, n_workers). */
typedef void (*threadpool_fn)(void *ctx, int ith, int nth);

/* Creates a pool of n_threads workers (n_threads <= 0: one per online core).
 * Returns 0 or a negative ANNA_E* code. Caller frees with threadpool_free. */
int threadpool_create(threadpool **out, int n_threads, char *err, size_t errlen);
void threadpool_free(threadpool *tp);
int threadpool_size(const threadpool *tp);

/* Runs fn on every worker and waits. tp may be NULL: then fn(ctx, 0, 1) runs inline. */
void threadpool_run(threadpool *tp, threadpool_fn fn, void *ctx);

/* Even split of [0, n) for worker ith of nth: writes [*lo, *hi). */
static inline void threadpool_range(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
  int64_t per = (n + nth - 1) / nth;
  int64_t a = per * ith, b = a + per;
  if (a > n) a = n;
  if (b > n) b = n;
  *lo = a;
  *hi = b;
}

#endif
