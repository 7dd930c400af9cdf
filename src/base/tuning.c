/* tuning.c: the anna_tuning table, its parser and printer, and the only getenv in src/. */
#include "base/tuning.h"

#include "base/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KIND_BOOL, KIND_INT }; /* every field is an int */

/* One row per field: the parser, the printer and the tests walk this table, so a new field
 * is one line here plus its declaration. */
typedef struct field {
  const char *key;
  int kind;
  size_t off;
  int64_t lo, hi;     /* accepted range */
  const char *legacy; /* the environment variable it replaced; NULL for keys born here */
} field;

#define OFF(f) offsetof(anna_tuning, f)
static const field fields[] = {
    {"prefix_kv_share", KIND_BOOL, OFF(prefix_kv_share), 0, 1, "ANNA_PREFIX_KV_SHARE"},
    {"cuda_moe_deq_mb", KIND_INT, OFF(cuda_moe_deq_mb), 1, 1 << 20, "ANNA_CUDA_MOE_DEQ_MB"},
    {"cuda_decode_mmq", KIND_BOOL, OFF(cuda_decode_mmq), 0, 1, NULL},
    {"cuda_kv_quant", KIND_BOOL, OFF(cuda_kv_quant), 0, 1, NULL}, /* new with the key: no variable to retire */
    {"cuda_batch_invariant", KIND_BOOL, OFF(cuda_batch_invariant), 0, 1, NULL},
    {"cuda_mmq_split_k", KIND_BOOL, OFF(cuda_mmq_split_k), 0, 1, NULL},
    {"cuda_mmq_v2", KIND_INT, OFF(cuda_mmq_v2), 0, 3, NULL},
    {"cuda_mmq_bf16", KIND_INT, OFF(cuda_mmq_bf16), 0, 2, NULL},
    {"spec_window_states", KIND_BOOL, OFF(spec_window_states), 0, 1, NULL},
    {"encoder_cpu", KIND_BOOL, OFF(encoder_cpu), 0, 1, NULL},
    {"cuda_offload_prefill_stream", KIND_BOOL, OFF(cuda_offload_prefill_stream), 0, 1, NULL},
};
#undef OFF
#define N_FIELDS ((int)(sizeof fields / sizeof fields[0]))

/* Keys retired with their A/B variants (bench/RESULTS.md, "Variants retired"): still
 * recognised, so that an old script or options string fails with a message saying so
 * rather than "unknown key". hint: what replaced the variant, if anything. */
typedef struct retired {
  const char *key, *legacy, *hint;
} retired;
static const retired retired_keys[] = {
    {"moe_shared_slot", "ANNA_MOE_SHARED_SLOT", "the shared expert runs as routed expert E"},
    {"host_sampling", "ANNA_HOST_SAMPLING", "anna-serve --host-sampling (engine_options.host_sampling)"},
    {"cuda_gemm", "ANNA_CUDA_GEMM", "--dtype bf16 (anna_model_options.dtype) selects bf16x1"},
    {"cuda_gemm_tile_mb", "ANNA_CUDA_GEMM_TILE_MB", "the whole 64 MiB scratch"},
    {"cuda_moe", "ANNA_CUDA_MOE", "the paths are picked by shape"},
    {"cuda_gdn", "ANNA_CUDA_GDN", "the per-head gdn_step, the cluster one by shape"},
    {"cuda_gdn_scan", "ANNA_CUDA_GDN_SCAN", "scan columns picked by shape"},
    {"cuda_attn", "ANNA_CUDA_ATTN", "grouped-query decode attention"},
    {"cuda_flash", "ANNA_CUDA_FLASH", "the mma.sync flash kernel, WMMA for other head dims"},
    {"cuda_pdl", "ANNA_CUDA_PDL", "programmatic launches wherever the device has them"},
    {"cuda_fuse_norm", "ANNA_CUDA_FUSE_NORM", "the add_rmsnorm fusion, always"},
    {"cuda_graph_piece", "ANNA_CUDA_GRAPH_PIECE", "an early graph piece of 48 nodes"},
    {"cuda_route_fold", "ANNA_CUDA_ROUTE_FOLD", "the route inside the router group, always"},
};
#define N_RETIRED ((int)(sizeof retired_keys / sizeof retired_keys[0]))

void tuning_defaults(anna_tuning *t) {
  *t = (anna_tuning){
      .prefix_kv_share = 1,
      .cuda_moe_deq_mb = 2048,
      .cuda_decode_mmq = 1,
      .cuda_kv_quant = 1,
      .cuda_batch_invariant = 0,
      .cuda_mmq_split_k = 1,
      .cuda_mmq_v2 = 0,
      .cuda_mmq_bf16 = 0,
      .spec_window_states = 1,
      .encoder_cpu = 0,
      .cuda_offload_prefill_stream = 1,
  };
}

const char *tuning_key(int i) {
  return i >= 0 && i < N_FIELDS ? fields[i].key : NULL;
}

static int is_sep(char ch) {
  return ch == ',' || ch == '\n';
}

/* [s, e) without surrounding blanks. */
static void trim(const char **s, const char **e) {
  while (*s < *e && (**s == ' ' || **s == '\t' || **s == '\r')) (*s)++;
  while (*e > *s && ((*e)[-1] == ' ' || (*e)[-1] == '\t' || (*e)[-1] == '\r')) (*e)--;
}

static int set_field(anna_tuning *t, const field *f, const char *v, size_t vn, char *err, size_t errlen) {
  char buf[64];
  if (vn == 0 || vn >= sizeof buf)
    return anna_err(err, errlen, ANNA_EINVAL, "tuning key '%s': bad value '%.*s'", f->key, (int)(vn < 64 ? vn : 64), v);
  memcpy(buf, v, vn);
  buf[vn] = 0;
  errno = 0;
  char *end;
  long long x = strtoll(buf, &end, 10);
  int ok = !errno && *end == 0 && x >= f->lo && x <= f->hi;
  if (!ok) {
    if (f->kind == KIND_BOOL)
      return anna_err(err, errlen, ANNA_EINVAL, "tuning key '%s': bad value '%s' (have: 0, 1)", f->key, buf);
    return anna_err(err, errlen, ANNA_EINVAL, "tuning key '%s': bad value '%s' (an integer in %lld..%lld)", f->key,
                    buf, (long long)f->lo, (long long)f->hi);
  }
  *(int *)((char *)t + f->off) = (int)x;
  return 0;
}

int tuning_parse(anna_tuning *t, const char *spec, char *err, size_t errlen) {
  if (!spec) return 0;
  anna_tuning n = *t; /* all or nothing */
  const char *s = spec;
  while (*s) {
    const char *e = s;
    while (*e && !is_sep(*e)) e++;
    const char *ks = s, *ke = e;
    trim(&ks, &ke);
    if (ks < ke) {
      const char *eq = memchr(ks, '=', (size_t)(ke - ks));
      if (!eq)
        return anna_err(err, errlen, ANNA_EINVAL, "tuning '%.*s': expected key=value", (int)(ke - ks), ks);
      const char *kend = eq, *vs = eq + 1, *ve = ke;
      trim(&ks, &kend);
      trim(&vs, &ve);
      const field *f = NULL;
      for (int i = 0; i < N_FIELDS && !f; i++)
        if (strlen(fields[i].key) == (size_t)(kend - ks) && !memcmp(fields[i].key, ks, (size_t)(kend - ks)))
          f = &fields[i];
      if (!f) {
        for (int i = 0; i < N_RETIRED; i++)
          if (strlen(retired_keys[i].key) == (size_t)(kend - ks) && !memcmp(retired_keys[i].key, ks, (size_t)(kend - ks)))
            return anna_err(err, errlen, ANNA_EINVAL,
                            "tuning key '%s' was retired with its A/B variant (now: %s; bench/RESULTS.md, "
                            "\"Variants retired\")",
                            retired_keys[i].key, retired_keys[i].hint);
        return anna_err(err, errlen, ANNA_EINVAL, "unknown tuning key '%.*s'", (int)(kend - ks), ks);
      }
      int rc = set_field(&n, f, vs, (size_t)(ve - vs), err, errlen);
      if (rc) return rc;
    }
    s = *e ? e + 1 : e;
  }
  *t = n;
  return 0;
}

int tuning_from_env(anna_tuning *t, const char *extra_spec, char *err, size_t errlen) {
  anna_tuning n;
  tuning_defaults(&n);
  for (int i = 0; i < N_FIELDS; i++)
    if (fields[i].legacy && getenv(fields[i].legacy))
      return anna_err(err, errlen, ANNA_EINVAL, "%s is no longer read: use ANNA_TUNING=%s=<value>", fields[i].legacy,
                      fields[i].key);
  for (int i = 0; i < N_RETIRED; i++)
    if (getenv(retired_keys[i].legacy))
      return anna_err(err, errlen, ANNA_EINVAL,
                      "%s is no longer read: its variant was retired (now: %s; bench/RESULTS.md, \"Variants retired\")",
                      retired_keys[i].legacy, retired_keys[i].hint);
  int rc = tuning_parse(&n, getenv("ANNA_TUNING"), err, errlen);
  if (rc) return anna_err_prefix(err, errlen, rc, "ANNA_TUNING");
  if ((rc = tuning_parse(&n, extra_spec, err, errlen))) return rc;
  *t = n;
  return 0;
}

size_t tuning_format(const anna_tuning *t, char *buf, size_t len) {
  size_t need = 0;
  for (int i = 0; i < N_FIELDS; i++) {
    const field *f = &fields[i];
    char line[96];
    const int l = snprintf(line, sizeof line, "%s=%d\n", f->key, *(const int *)((const char *)t + f->off));
    if (buf && need < len) {
      size_t room = len - need;
      memcpy(buf + need, line, (size_t)l < room ? (size_t)l : room);
    }
    need += (size_t)l;
  }
  if (buf && len) buf[need < len ? need : len - 1] = 0;
  return need;
}
