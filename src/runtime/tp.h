/* tp.h: the communicator of a tensor-parallel context (anna_context_options.tensor_parallel):
 * N shards of every layer (model/shard.h), one backend each, run a batch concurrently, one
 * thread per shard (tp_comm_exec), and meet at every all-reduce (tp_comm_all_reduce, the
 * forward pass's fwd_state_options.tp_all_reduce hook).
 *
 * Transports:
 *   host: each shard's partial is downloaded to host memory, the shards wait for each other,
 *         each sums a 1/N slice of the elements over the ranks in order 0..N-1 (so the result
 *         is deterministic and the same bits on every shard), they wait again, and each
 *         uploads the sum. Works for any set of backends: CPU shards, two shards on one GPU,
 *         several GPUs.
 *   nccl: the backends' own collective (ops_backend.comm_*: the CUDA backend over NCCL, one
 *         communicator per device from ncclCommInitAll, ncclAllReduce on each backend's
 *         stream); only when the backend was built with it and every shard is on its own
 *         device.
 * One process, one context: the communicator owns N - 1 worker threads (rank 0 runs on the
 * caller's thread). Not thread-safe beyond that: one exec at a time. */
#ifndef ANNA_RUNTIME_TP_H
#define ANNA_RUNTIME_TP_H

#include "ops/ops.h"

#include <stddef.h>
#include <stdint.h>

typedef struct tp_comm tp_comm;

enum tp_transport { TP_COMM_HOST = 0, TP_COMM_NCCL };

/* The transport for name (NULL or "auto": nccl when the backends offer it and every shard is
 * on a distinct device, else host; "host"; "nccl": ANNA_EUNSUPPORTED naming why when the
 * backend has no collective or two shards share a device). be[0..n) are the shards' backends,
 * distinct_devices whether their devices differ. */
int tp_transport_pick(const char *name, ops_backend *const *be, int n, int distinct_devices,
                      int *transport, char *err, size_t errlen);

/* A communicator of n >= 2 shards over be[0..n) (borrowed; they must outlive it), for
 * all-reduces of at most max_floats floats. Caller frees with tp_comm_free. */
int tp_comm_create(tp_comm **out, int n, ops_backend *const *be, int transport, int64_t max_floats,
                   char *err, size_t errlen);
void tp_comm_free(tp_comm *c);

/* The transport's name ("host", "nccl"). */
const char *tp_comm_transport_name(const tp_comm *c);

/* fwd_state_options.tp_all_reduce: buf [count] in be's memory becomes the sum over the ranks.
 * Every rank must call it with the same count; ctx is the tp_comm. Allocates nothing. Host
 * transport: a rank whose part of the exec returned early (an error) no longer holds the
 * others back (they get a wrong sum and the caller that rank's error, not a hang); over NCCL
 * the caller must not let ranks diverge (text_decoder.c refuses rank-0-only errors first). */
void tp_comm_all_reduce(void *ctx, int rank, ops_backend *be, float *buf, int64_t count);

/* Runs fn(arg, r) for every rank r concurrently (rank 0 on the calling thread) and returns
 * when all have returned. ctx is the tp_comm. */
void tp_comm_exec(void *ctx, void (*fn)(void *arg, int rank), void *arg);

#endif
