/* ops_profile.h: per-op-family wall time, by wrapping a backend's op table.
 *
 * ops_profile_wrap returns a table that forwards every entry to the wrapped backend (same
 * impl pointer) and times the compute ops, grouped in families. The wrapped backend stays
 * owned by the caller and must outlive the wrapper. Times are host wall clock. For an
 * asynchronous device backend (one with a `sync` entry) every timed op is bracketed by syncs,
 * so its time is the op's own, plus one launch + sync (microseconds: the figures are right
 * for prefill-sized ops and overstate tiny decode ops).
 * Single-threaded use (the thread that drives the context).
 */
#ifndef ANNA_OPS_OPS_PROFILE_H
#define ANNA_OPS_OPS_PROFILE_H

#include "ops/ops.h"

enum ops_family {
  OPS_FAMILY_MATMUL = 0, /* projections and MLP/expert-free matmuls */
  OPS_FAMILY_LM_HEAD,    /* the vocabulary projection */
  OPS_FAMILY_ATTENTION,  /* attention incl. rope and KV writes */
  OPS_FAMILY_GDN,        /* conv1d, gates, delta rule (chunked and recurrent) */
  OPS_FAMILY_MOE,        /* routing and expert FFNs */
  OPS_FAMILY_OTHER,      /* norms, activations, element-wise, copies, embedding */
  OPS_FAMILY_COUNT
};

const char *ops_family_name(int family);

/* Caller frees the wrapper with ops_profile_free (not the inner backend). lm_rows: rows of
 * the vocabulary projection (a matmul with that many rows counts as LM head). */
ops_backend *ops_profile_wrap(ops_backend *inner, int64_t lm_rows);
void ops_profile_free(ops_backend *wrapped);
/* Accumulated seconds per family (out[OPS_FAMILY_COUNT]); reset clears them. */
void ops_profile_read(const ops_backend *wrapped, double *out);
void ops_profile_reset(ops_backend *wrapped);

#endif
