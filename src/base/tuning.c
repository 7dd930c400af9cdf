/* tuning.c: the anna_tuning table, its parser and printer, and the only getenv in src/. */
#include "base/tuning.h"

#include "base/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KIND_BOOL, KIND_INT, KIND_INT64, KIND_ENUM };

/* One row per field: the parser, the printer and the tests walk this table, so a new field
 * is one line here plus its declaration. */
typedef struct field {
  const char *key;
  int kind;
  size_t off;
  const char *const *names; /* KIND_ENUM: value i is names[i] (NULL-terminated) */
  int64_t lo, hi;           /* KIND_INT / KIND_INT64: accepted range */
  const int *allowed;       /* KIND_INT: when set, the only values accepted (-1 ends) */
  const char *legacy;       /* the environment variable it replaced */
} field;

static const char *const gemm_names[] = {"bf16", "int8", "bf16x1", "split", NULL};
static const char *const moe_names[] = {"default", "decode_f32", "cublas", "cublas_loop", "pipe", "predeq", "tiles",
                                        NULL};
static const char *const gdn_names[] = {"head", "cluster", NULL};
static const char *const attn_names[] = {"default", "per_head", NULL};
static const char *const flash_names[] = {"mma", "wmma", NULL};
static const int scan_allowed[] = {0, 16, 32, -1};

#define OFF(f) offsetof(anna_tuning, f)
static const field fields[] = {
    {"prefix_kv_share", KIND_BOOL, OFF(prefix_kv_share), NULL, 0, 1, NULL, "ANNA_PREFIX_KV_SHARE"},
    {"moe_shared_slot", KIND_BOOL, OFF(moe_shared_slot), NULL, 0, 1, NULL, "ANNA_MOE_SHARED_SLOT"},
    {"host_sampling", KIND_BOOL, OFF(host_sampling), NULL, 0, 1, NULL, "ANNA_HOST_SAMPLING"},
    {"cuda_gemm", KIND_ENUM, OFF(cuda_gemm), gemm_names, 0, 0, NULL, "ANNA_CUDA_GEMM"},
    {"cuda_gemm_tile_mb", KIND_INT, OFF(cuda_gemm_tile_mb), NULL, 0, 1 << 20, NULL, "ANNA_CUDA_GEMM_TILE_MB"},
    {"cuda_moe", KIND_ENUM, OFF(cuda_moe), moe_names, 0, 0, NULL, "ANNA_CUDA_MOE"},
    {"cuda_moe_deq_mb", KIND_INT, OFF(cuda_moe_deq_mb), NULL, 1, 1 << 20, NULL, "ANNA_CUDA_MOE_DEQ_MB"},
    {"cuda_gdn", KIND_ENUM, OFF(cuda_gdn), gdn_names, 0, 0, NULL, "ANNA_CUDA_GDN"},
    {"cuda_gdn_scan", KIND_INT, OFF(cuda_gdn_scan), NULL, 0, 32, scan_allowed, "ANNA_CUDA_GDN_SCAN"},
    {"cuda_attn", KIND_ENUM, OFF(cuda_attn), attn_names, 0, 0, NULL, "ANNA_CUDA_ATTN"},
    {"cuda_flash", KIND_ENUM, OFF(cuda_flash), flash_names, 0, 0, NULL, "ANNA_CUDA_FLASH"},
    {"cuda_pdl", KIND_BOOL, OFF(cuda_pdl), NULL, 0, 1, NULL, "ANNA_CUDA_PDL"},
    {"cuda_fuse_norm", KIND_BOOL, OFF(cuda_fuse_norm), NULL, 0, 1, NULL, "ANNA_CUDA_FUSE_NORM"},
    {"cuda_graph_piece", KIND_INT64, OFF(cuda_graph_piece), NULL, 0, INT64_MAX, NULL, "ANNA_CUDA_GRAPH_PIECE"},
    {"cuda_route_fold", KIND_BOOL, OFF(cuda_route_fold), NULL, 0, 1, NULL, "ANNA_CUDA_ROUTE_FOLD"},
};
#undef OFF
#define N_FIELDS ((int)(sizeof fields / sizeof fields[0]))

void tuning_defaults(anna_tuning *t) {
  *t = (anna_tuning){
      .prefix_kv_share = 1,
      .moe_shared_slot = 1,
      .host_sampling = 0,
      .cuda_gemm = TUNING_CUDA_GEMM_BF16,
      .cuda_gemm_tile_mb = 0,
      .cuda_moe = TUNING_CUDA_MOE_DEFAULT,
      .cuda_moe_deq_mb = 2048,
      .cuda_gdn = TUNING_CUDA_GDN_HEAD,
      .cuda_gdn_scan = 0,
      .cuda_attn = TUNING_CUDA_ATTN_DEFAULT,
      .cuda_flash = TUNING_CUDA_FLASH_MMA,
      .cuda_pdl = 1,
      .cuda_fuse_norm = 1,
      .cuda_graph_piece = 48, /* CUDA_GRAPH_PIECE (cuda_internal.h) */
      .cuda_route_fold = 1,
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
  char *p = (char *)t + f->off;
  if (f->kind == KIND_ENUM) {
    for (int i = 0; f->names[i]; i++)
      if (!strcmp(buf, f->names[i])) {
        *(int *)p = i;
        return 0;
      }
    char have[160] = "";
    for (int i = 0; f->names[i]; i++) {
      size_t l = strlen(have);
      snprintf(have + l, sizeof have - l, "%s%s", i ? ", " : "", f->names[i]);
    }
    return anna_err(err, errlen, ANNA_EINVAL, "tuning key '%s': bad value '%s' (have: %s)", f->key, buf, have);
  }
  errno = 0;
  char *end;
  long long x = strtoll(buf, &end, 10);
  int ok = !errno && *end == 0 && x >= f->lo && x <= f->hi;
  if (ok && f->allowed) {
    ok = 0;
    for (int i = 0; f->allowed[i] >= 0; i++) ok |= x == f->allowed[i];
  }
  if (!ok) {
    if (f->kind == KIND_BOOL)
      return anna_err(err, errlen, ANNA_EINVAL, "tuning key '%s': bad value '%s' (have: 0, 1)", f->key, buf);
    if (f->allowed)
      return anna_err(err, errlen, ANNA_EINVAL, "tuning key '%s': bad value '%s' (have: 0, 16, 32)", f->key, buf);
    return anna_err(err, errlen, ANNA_EINVAL, "tuning key '%s': bad value '%s' (an integer in %lld..%lld)", f->key,
                    buf, (long long)f->lo, (long long)f->hi);
  }
  if (f->kind == KIND_INT64) *(int64_t *)p = x;
  else *(int *)p = (int)x;
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
      if (!f) return anna_err(err, errlen, ANNA_EINVAL, "unknown tuning key '%.*s'", (int)(kend - ks), ks);
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
    if (getenv(fields[i].legacy))
      return anna_err(err, errlen, ANNA_EINVAL, "%s is no longer read: use ANNA_TUNING=%s=<value>", fields[i].legacy,
                      fields[i].key);
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
    const char *p = (const char *)t + f->off;
    char line[96];
    int l;
    if (f->kind == KIND_ENUM) {
      int v = *(const int *)p, nv = 0;
      while (f->names[nv]) nv++;
      l = v >= 0 && v < nv ? snprintf(line, sizeof line, "%s=%s\n", f->key, f->names[v])
                           : snprintf(line, sizeof line, "%s=%d\n", f->key, v);
    } else if (f->kind == KIND_INT64) {
      l = snprintf(line, sizeof line, "%s=%lld\n", f->key, (long long)*(const int64_t *)p);
    } else {
      l = snprintf(line, sizeof line, "%s=%d\n", f->key, *(const int *)p);
    }
    if (buf && need < len) {
      size_t room = len - need;
      memcpy(buf + need, line, (size_t)l < room ? (size_t)l : room);
    }
    need += (size_t)l;
  }
  if (buf && len) buf[need < len ? need : len - 1] = 0;
  return need;
}
