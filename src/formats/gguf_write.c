/* gguf_write.c: GGUF v3 writer (see gguf_write.h). Metadata is serialized into a byte
 * buffer as it is added; tensor infos are kept until the write computes their offsets. */
#include "formats/gguf_write.h"

#include "base/error.h"
#include "formats/dtype.h"
#include "formats/gguf.h"

#include <stdlib.h>
#include <string.h>

typedef struct wtensor {
  char *name;
  int type, ndim;
  int64_t dims[GGUF_MAX_DIMS];
  uint64_t nbytes, offset;
} wtensor;

struct gguf_writer {
  unsigned char *kv; /* serialized key/values */
  size_t kv_len, kv_cap;
  int64_t n_kv;
  char **keys;
  size_t n_keys, cap_keys;
  wtensor *t;
  int64_t n_t, cap_t;
  uint32_t alignment;
};

int gguf_writer_create(gguf_writer **out, char *err, size_t errlen) {
  *out = calloc(1, sizeof **out);
  if (!*out) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  (*out)->alignment = GGUF_DEFAULT_ALIGNMENT;
  return 0;
}

void gguf_writer_free(gguf_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n_keys; i++) free(w->keys[i]);
  for (int64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
  free(w->keys);
  free(w->t);
  free(w->kv);
  free(w);
}

static int put(gguf_writer *w, const void *p, size_t n) {
  if (!n) return 0; /* empty arrays pass NULL data */
  if (w->kv_len + n > w->kv_cap) {
    size_t cap = w->kv_cap ? w->kv_cap : 4096;
    while (cap < w->kv_len + n) cap *= 2;
    unsigned char *nb = realloc(w->kv, cap);
    if (!nb) return ANNA_ENOMEM;
    w->kv = nb;
    w->kv_cap = cap;
  }
  memcpy(w->kv + w->kv_len, p, n);
  w->kv_len += n;
  return 0;
}
static int put_u32(gguf_writer *w, uint32_t v) { return put(w, &v, 4); } /* little-endian hosts only (x86, arm) */
static int put_u64(gguf_writer *w, uint64_t v) { return put(w, &v, 8); }
static int put_str(gguf_writer *w, const char *s, size_t n) {
  int rc = put_u64(w, n);
  return rc ? rc : put(w, s, n);
}

static size_t scalar_size(int type) {
  switch (type) {
  case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
  case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
  case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
  case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
  default: return 0;
  }
}

/* Records key (refusing duplicates) and writes its name and value type. */
static int key_begin(gguf_writer *w, const char *key, int type) {
  if (!key || !*key) return ANNA_EINVAL;
  for (size_t i = 0; i < w->n_keys; i++)
    if (!strcmp(w->keys[i], key)) return ANNA_EINVAL;
  if (w->n_keys == w->cap_keys) {
    size_t cap = w->cap_keys ? 2 * w->cap_keys : 64;
    char **nk = realloc(w->keys, cap * sizeof *nk);
    if (!nk) return ANNA_ENOMEM;
    w->keys = nk;
    w->cap_keys = cap;
  }
  if (!(w->keys[w->n_keys] = strdup(key))) return ANNA_ENOMEM;
  w->n_keys++;
  w->n_kv++;
  int rc = put_str(w, key, strlen(key));
  return rc ? rc : put_u32(w, (uint32_t)type);
}

static int set_scalar(gguf_writer *w, const char *key, int type, const void *v) {
  int rc = key_begin(w, key, type);
  return rc ? rc : put(w, v, scalar_size(type));
}

int gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v) { return set_scalar(w, key, GGUF_TYPE_UINT8, &v); }
int gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v) { return set_scalar(w, key, GGUF_TYPE_INT8, &v); }
int gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v) { return set_scalar(w, key, GGUF_TYPE_UINT16, &v); }
int gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v) { return set_scalar(w, key, GGUF_TYPE_INT16, &v); }
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) {
  int rc = set_scalar(w, key, GGUF_TYPE_UINT32, &v);
  /* the reader takes general.alignment from a u32 key: honour it for the data section */
  if (!rc && !strcmp(key, "general.alignment")) {
    if (v == 0 || (v & (v - 1))) return ANNA_EINVAL;
    w->alignment = v;
  }
  return rc;
}
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v) { return set_scalar(w, key, GGUF_TYPE_INT32, &v); }
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v) { return set_scalar(w, key, GGUF_TYPE_UINT64, &v); }
int gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v) { return set_scalar(w, key, GGUF_TYPE_INT64, &v); }
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v) { return set_scalar(w, key, GGUF_TYPE_FLOAT32, &v); }
int gguf_writer_set_f64(gguf_writer *w, const char *key, double v) { return set_scalar(w, key, GGUF_TYPE_FLOAT64, &v); }
int gguf_writer_set_bool(gguf_writer *w, const char *key, int v) {
  uint8_t b = v != 0;
  return set_scalar(w, key, GGUF_TYPE_BOOL, &b);
}
int gguf_writer_set_str(gguf_writer *w, const char *key, const char *s) {
  if (!s) return ANNA_EINVAL;
  int rc = key_begin(w, key, GGUF_TYPE_STRING);
  return rc ? rc : put_str(w, s, strlen(s));
}

int gguf_writer_set_arr(gguf_writer *w, const char *key, int elem_type, const void *data, int64_t n) {
  const size_t es = scalar_size(elem_type);
  if (!es || n < 0 || (n && !data)) return ANNA_EINVAL;
  int rc = key_begin(w, key, GGUF_TYPE_ARRAY);
  if (!rc) rc = put_u32(w, (uint32_t)elem_type);
  if (!rc) rc = put_u64(w, (uint64_t)n);
  if (!rc) rc = put(w, data, es * (size_t)n);
  return rc;
}

int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, const size_t *lens, int64_t n) {
  if (n < 0 || (n && !strs)) return ANNA_EINVAL;
  int rc = key_begin(w, key, GGUF_TYPE_ARRAY);
  if (!rc) rc = put_u32(w, GGUF_TYPE_STRING);
  if (!rc) rc = put_u64(w, (uint64_t)n);
  for (int64_t i = 0; !rc && i < n; i++) rc = put_str(w, strs[i] ? strs[i] : "", lens ? lens[i] : strs[i] ? strlen(strs[i]) : 0);
  return rc;
}

int gguf_writer_add_tensor(gguf_writer *w, const char *name, int type, int ndim, const int64_t *dims) {
  if (!name || !*name || ndim < 1 || ndim > GGUF_MAX_DIMS || dtype_block_size(type) <= 0) return ANNA_EINVAL;
  for (int64_t i = 0; i < w->n_t; i++)
    if (!strcmp(w->t[i].name, name)) return ANNA_EINVAL;
  int64_t nel = 1;
  for (int d = 0; d < ndim; d++) {
    if (dims[d] < 1) return ANNA_EINVAL;
    nel *= dims[d];
  }
  if (dims[0] % dtype_block_size(type)) return ANNA_EINVAL;
  if (w->n_t == w->cap_t) {
    int64_t cap = w->cap_t ? 2 * w->cap_t : 64;
    wtensor *nt = realloc(w->t, (size_t)cap * sizeof *nt);
    if (!nt) return ANNA_ENOMEM;
    w->t = nt;
    w->cap_t = cap;
  }
  wtensor *t = &w->t[w->n_t];
  memset(t, 0, sizeof *t);
  if (!(t->name = strdup(name))) return ANNA_ENOMEM;
  t->type = type;
  t->ndim = ndim;
  for (int d = 0; d < GGUF_MAX_DIMS; d++) t->dims[d] = d < ndim ? dims[d] : 1;
  t->nbytes = (uint64_t)dtype_row_bytes(type, dims[0]) * (uint64_t)(nel / dims[0]);
  w->n_t++;
  return 0;
}

static int fwrite_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : ANNA_EIO; }

static int pad_to(FILE *f, uint64_t pos, uint32_t align, uint64_t *newpos) {
  static const unsigned char zeros[256];
  uint64_t want = (pos + align - 1) / align * align;
  while (pos < want) {
    size_t n = (size_t)(want - pos < sizeof zeros ? want - pos : sizeof zeros);
    if (fwrite_all(f, zeros, n)) return ANNA_EIO;
    pos += n;
  }
  *newpos = pos;
  return 0;
}

int gguf_writer_write(gguf_writer *w, const char *path, gguf_fill_fn fill, void *user, char *err, size_t errlen) {
  FILE *f = fopen(path, "wb");
  if (!f) return anna_err(err, errlen, ANNA_EIO, "%s: cannot create", path);
  int rc = 0;
  void *buf = NULL;
  size_t buf_cap = 0;
  uint64_t off = 0;
  for (int64_t i = 0; i < w->n_t; i++) {
    off = (off + w->alignment - 1) / w->alignment * w->alignment;
    w->t[i].offset = off;
    off += w->t[i].nbytes;
  }
  const uint32_t magic_ver[2] = {0x46554747u /* "GGUF" */, 3};
  const uint64_t counts[2] = {(uint64_t)w->n_t, (uint64_t)w->n_kv};
  uint64_t pos = 0;
  if ((rc = fwrite_all(f, magic_ver, 8)) || (rc = fwrite_all(f, counts, 16)) || (rc = fwrite_all(f, w->kv, w->kv_len)))
    goto io;
  pos = 24 + w->kv_len;
  for (int64_t i = 0; i < w->n_t; i++) {
    const wtensor *t = &w->t[i];
    const uint64_t nl = strlen(t->name);
    const uint32_t nd = (uint32_t)t->ndim, ty = (uint32_t)t->type;
    if ((rc = fwrite_all(f, &nl, 8)) || (rc = fwrite_all(f, t->name, nl)) || (rc = fwrite_all(f, &nd, 4))) goto io;
    for (int d = 0; d < t->ndim; d++)
      if ((rc = fwrite_all(f, &t->dims[d], 8))) goto io;
    if ((rc = fwrite_all(f, &ty, 4)) || (rc = fwrite_all(f, &t->offset, 8))) goto io;
    pos += 8 + nl + 4 + 8 * (uint64_t)t->ndim + 4 + 8;
  }
  if ((rc = pad_to(f, pos, w->alignment, &pos))) goto io;
  const uint64_t data0 = pos;
  for (int64_t i = 0; i < w->n_t; i++) {
    const wtensor *t = &w->t[i];
    if ((rc = pad_to(f, pos, w->alignment, &pos))) goto io;
    if (pos - data0 != t->offset) {
      rc = anna_err(err, errlen, ANNA_EIO, "%s: internal offset mismatch at tensor %s", path, t->name);
      goto out;
    }
    if (t->nbytes > buf_cap) {
      free(buf);
      buf_cap = (size_t)t->nbytes;
      if (!(buf = malloc(buf_cap))) {
        rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory (%llu bytes for tensor %s)", (unsigned long long)t->nbytes,
                      t->name);
        goto out;
      }
    }
    if ((rc = fill(user, i, buf, (size_t)t->nbytes, err, errlen))) goto out;
    if ((rc = fwrite_all(f, buf, (size_t)t->nbytes))) goto io;
    pos += t->nbytes;
  }
  free(buf);
  buf = NULL;
  if (fclose(f)) {
    f = NULL;
    goto io;
  }
  return 0;
io:
  rc = anna_err(err, errlen, ANNA_EIO, "%s: write failed", path);
out:
  free(buf);
  if (f) fclose(f);
  return rc;
}
