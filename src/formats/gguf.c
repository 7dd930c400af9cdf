/* gguf.c: GGUF parser over a bounded cursor; see gguf.h for the contract. */
#include "formats/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "formats/dtype.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */

struct gguf_file {
  const uint8_t *base;
  size_t size;
  bool mapped;
  uint32_t version;
  size_t alignment;
  size_t data_offset;
  int64_t n_kv;
  gguf_kv *kvs;
  int64_t n_tensors;
  gguf_tensor *tensors;
  /* Sorted by name for O(log n) lookup and the duplicate check (MoE files hold thousands
   * of tensors, and callers look each one up by name). */
  const gguf_kv **kv_sorted;
  const gguf_tensor **t_sorted;
};

/* Every read checks `n > size || pos > size - n` (no overflow possible) and the first
 * failure sticks, so parsing code can read several fields and test once. */
typedef struct cursor {
  const uint8_t *p;
  size_t size;
  size_t pos;
  int failed;
  const char *what; /* field being read when the first failure happened */
} cursor;

static const void *cur_take(cursor *c, size_t n, const char *what) {
  if (c->failed) return NULL;
  if (n > c->size || c->pos > c->size - n) {
    c->failed = 1;
    c->what = what;
    return NULL;
  }
  const void *r = c->p + c->pos;
  c->pos += n;
  return r;
}

static size_t cur_left(const cursor *c) { return c->failed ? 0 : c->size - c->pos; }

static uint64_t load_le(const uint8_t *b, size_t n) {
  uint64_t v = 0;
  for (size_t k = 0; k < n; k++) v |= (uint64_t)b[k] << (8 * k);
  return v;
}

static uint32_t cur_u32(cursor *c, const char *what) {
  const uint8_t *b = cur_take(c, 4, what);
  return b ? (uint32_t)load_le(b, 4) : 0;
}

static uint64_t cur_u64(cursor *c, const char *what) {
  const uint8_t *b = cur_take(c, 8, what);
  return b ? load_le(b, 8) : 0;
}

/* Returns a pointer into the file and the length; the caller copies if it keeps it. */
static const char *cur_str(cursor *c, uint64_t *len, const char *what) {
  uint64_t n = cur_u64(c, what);
  if (c->failed) return NULL;
  if (n > cur_left(c)) {
    c->failed = 1;
    c->what = what;
    return NULL;
  }
  *len = n;
  return cur_take(c, (size_t)n, what);
}

static char *dup_n(const char *s, uint64_t n) {
  char *r = malloc((size_t)n + 1);
  if (!r) return NULL;
  if (n) memcpy(r, s, (size_t)n);
  r[n] = 0;
  return r;
}

static size_t scalar_size(int t) {
  switch (t) {
  case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
  case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
  case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
  case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
  default: return 0;
  }
}

const char *gguf_type_name(int t) {
  static const char *names[GGUF_TYPE_COUNT] = {"u8",   "i8",    "u16",   "i16", "u32",
                                               "i32",  "f32",   "bool",  "str", "arr",
                                               "u64",  "i64",   "f64"};
  return t >= 0 && t < GGUF_TYPE_COUNT ? names[t] : "?";
}

/* Decodes one little-endian scalar of type t at b into the widened fields of kv. */
static void scalar_decode(gguf_kv *kv, int t, const uint8_t *b) {
  uint64_t raw = load_le(b, scalar_size(t));
  switch (t) {
  case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
    kv->u = raw;
    break;
  case GGUF_TYPE_INT8: kv->i = (int8_t)raw; break;
  case GGUF_TYPE_INT16: kv->i = (int16_t)raw; break;
  case GGUF_TYPE_INT32: kv->i = (int32_t)raw; break;
  case GGUF_TYPE_INT64: kv->i = (int64_t)raw; break;
  case GGUF_TYPE_BOOL: kv->b = raw != 0; break;
  case GGUF_TYPE_FLOAT32: {
    uint32_t w = (uint32_t)raw;
    float x;
    memcpy(&x, &w, 4);
    kv->f = x;
    break;
  }
  case GGUF_TYPE_FLOAT64: memcpy(&kv->f, &raw, 8); break;
  default: break;
  }
}

static void kv_free(gguf_kv *kv) {
  free((void *)kv->key);
  free((void *)kv->str);
  if (kv->arr.strs && kv->arr.count > 0) free((void *)kv->arr.strs[0]);
  free((void *)kv->arr.strs);
  free((void *)kv->arr.lens);
}

/* String arrays are copied into one block: the pointer table, the lengths and the bytes
 * (with NUL terminators), sized by a first pass so no count from the file sizes anything
 * before it has been checked against the bytes actually present. */
static int read_str_array(cursor *c, gguf_kv *kv, uint64_t count, char *err, size_t errlen) {
  size_t start = c->pos;
  uint64_t total = 0;
  for (uint64_t k = 0; k < count; k++) {
    uint64_t len = 0;
    cur_str(c, &len, "array string");
    if (c->failed)
      return anna_err(err, errlen, ANNA_EFORMAT, "key '%s': string %" PRIu64 " of %" PRIu64
                      " runs past end of file", kv->key, k, count);
    total += len + 1;
  }
  /* count <= remaining/8 and total <= file size, so these products cannot overflow. */
  char **strs = malloc(count ? (size_t)count * sizeof(char *) : 1);
  uint64_t *lens = malloc(count ? (size_t)count * sizeof(uint64_t) : 1);
  char *bytes = malloc(total ? (size_t)total : 1);
  if (!strs || !lens || !bytes) {
    free(strs), free(lens), free(bytes);
    return anna_err(err, errlen, ANNA_ENOMEM, "key '%s': out of memory for %" PRIu64
                    " strings", kv->key, count);
  }
  c->pos = start;
  char *w = bytes;
  for (uint64_t k = 0; k < count; k++) {
    uint64_t len = 0;
    const char *s = cur_str(c, &len, "array string");
    if (len) memcpy(w, s, (size_t)len);
    w[len] = 0;
    strs[k] = w;
    lens[k] = len;
    w += len + 1;
  }
  /* strs[0] == bytes, which is how kv_free finds the block to free. */
  if (count == 0) free(bytes);
  kv->arr.strs = (const char *const *)strs;
  kv->arr.lens = lens;
  return 0;
}

static int read_kv(cursor *c, gguf_kv *kv, int64_t idx, char *err, size_t errlen) {
  uint64_t klen = 0;
  const char *k = cur_str(c, &klen, "key");
  if (c->failed)
    return anna_err(err, errlen, ANNA_EFORMAT, "metadata %" PRId64 ": key runs past end of file",
                    idx);
  kv->key = dup_n(k, klen);
  if (!kv->key) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  uint32_t t = cur_u32(c, "value type");
  if (c->failed)
    return anna_err(err, errlen, ANNA_EFORMAT, "key '%s': truncated value type", kv->key);
  if (t >= GGUF_TYPE_COUNT)
    return anna_err(err, errlen, ANNA_EFORMAT, "key '%s': bad value type %u", kv->key, t);
  kv->type = (int)t;
  if (t == GGUF_TYPE_STRING) {
    uint64_t len = 0;
    const char *s = cur_str(c, &len, "string");
    if (c->failed)
      return anna_err(err, errlen, ANNA_EFORMAT, "key '%s': string runs past end of file",
                      kv->key);
    kv->str = dup_n(s, len);
    kv->str_len = len;
    if (!kv->str) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    return 0;
  }
  if (t == GGUF_TYPE_ARRAY) {
    uint32_t et = cur_u32(c, "array type");
    uint64_t count = cur_u64(c, "array count");
    if (c->failed)
      return anna_err(err, errlen, ANNA_EFORMAT, "key '%s': truncated array header", kv->key);
    if (et >= GGUF_TYPE_COUNT || et == GGUF_TYPE_ARRAY)
      return anna_err(err, errlen, ANNA_EFORMAT, "key '%s': bad array element type %u",
                      kv->key, et);
    kv->arr.elem_type = (int)et;
    if (et == GGUF_TYPE_STRING) {
      if (count > cur_left(c) / 8)
        return anna_err(err, errlen, ANNA_EFORMAT, "key '%s': array count %" PRIu64
                        " exceeds file size", kv->key, count);
      kv->arr.count = (int64_t)count;
      return read_str_array(c, kv, count, err, errlen);
    }
    size_t es = scalar_size((int)et);
    if (count > cur_left(c) / es)
      return anna_err(err, errlen, ANNA_EFORMAT, "key '%s': array count %" PRIu64
                      " exceeds file size", kv->key, count);
    kv->arr.count = (int64_t)count;
    kv->arr.elem_size = es;
    kv->arr.data = cur_take(c, (size_t)count * es, "array data");
    return 0;
  }
  const uint8_t *b = cur_take(c, scalar_size((int)t), "value");
  if (!b)
    return anna_err(err, errlen, ANNA_EFORMAT, "key '%s': value runs past end of file", kv->key);
  scalar_decode(kv, (int)t, b);
  return 0;
}

static int read_tensor_info(cursor *c, gguf_tensor *ti, int64_t idx, char *err, size_t errlen) {
  uint64_t nlen = 0;
  const char *name = cur_str(c, &nlen, "tensor name");
  if (c->failed)
    return anna_err(err, errlen, ANNA_EFORMAT, "tensor %" PRId64 ": name runs past end of file",
                    idx);
  ti->name = dup_n(name, nlen);
  if (!ti->name) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  uint32_t nd = cur_u32(c, "n_dims");
  if (c->failed)
    return anna_err(err, errlen, ANNA_EFORMAT, "tensor '%s': truncated info", ti->name);
  if (nd < 1 || nd > GGUF_MAX_DIMS)
    return anna_err(err, errlen, ANNA_EFORMAT, "tensor '%s': bad n_dims %u", ti->name, nd);
  ti->ndim = (int)nd;
  int64_t nelem = 1;
  for (int d = 0; d < GGUF_MAX_DIMS; d++) ti->dims[d] = 1;
  for (uint32_t d = 0; d < nd; d++) {
    uint64_t v = cur_u64(c, "dim");
    if (c->failed) break;
    if (v == 0 || v > (uint64_t)INT64_MAX || (int64_t)v > INT64_MAX / nelem)
      return anna_err(err, errlen, ANNA_EFORMAT, "tensor '%s': dim %u = %" PRIu64
                      " is zero or overflows", ti->name, d, v);
    ti->dims[d] = (int64_t)v;
    nelem *= (int64_t)v;
  }
  uint32_t type = cur_u32(c, "tensor type");
  ti->offset = cur_u64(c, "tensor offset");
  if (c->failed)
    return anna_err(err, errlen, ANNA_EFORMAT, "tensor '%s': truncated info", ti->name);
  if (type >= ANNA_DTYPE_COUNT || dtype_block_size((int)type) == 0)
    return anna_err(err, errlen, ANNA_EFORMAT, "tensor '%s': unknown type id %u", ti->name,
                    type);
  ti->type = (int)type;
  ti->nelem = nelem;
  int64_t bs = dtype_block_size((int)type);
  if (ti->dims[0] % bs != 0)
    return anna_err(err, errlen, ANNA_EFORMAT, "tensor '%s': row of %" PRId64
                    " is not a multiple of the %s block size %" PRId64, ti->name, ti->dims[0],
                    dtype_name((int)type), bs);
  /* nelem/bs * block_bytes: block_bytes <= 292 and bs >= 1; reject before overflowing. */
  int64_t nblocks = nelem / bs;
  if (nblocks > INT64_MAX / dtype_block_bytes((int)type))
    return anna_err(err, errlen, ANNA_EFORMAT, "tensor '%s': byte size overflows", ti->name);
  ti->nbytes = nblocks * dtype_block_bytes((int)type);
  return 0;
}

static int cmp_kv(const void *a, const void *b) {
  return strcmp((*(const gguf_kv *const *)a)->key, (*(const gguf_kv *const *)b)->key);
}

static int cmp_tensor(const void *a, const void *b) {
  return strcmp((*(const gguf_tensor *const *)a)->name, (*(const gguf_tensor *const *)b)->name);
}

/* Builds the sorted indexes; a duplicate key or tensor name is a format error, since a
 * lookup would silently pick one of them. */
static int build_index(gguf_file *f, char *err, size_t errlen) {
  f->kv_sorted = malloc((f->n_kv ? (size_t)f->n_kv : 1) * sizeof(gguf_kv *));
  f->t_sorted = malloc((f->n_tensors ? (size_t)f->n_tensors : 1) * sizeof(gguf_tensor *));
  if (!f->kv_sorted || !f->t_sorted) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  for (int64_t k = 0; k < f->n_kv; k++) f->kv_sorted[k] = &f->kvs[k];
  for (int64_t k = 0; k < f->n_tensors; k++) f->t_sorted[k] = &f->tensors[k];
  qsort(f->kv_sorted, (size_t)f->n_kv, sizeof(gguf_kv *), cmp_kv);
  qsort(f->t_sorted, (size_t)f->n_tensors, sizeof(gguf_tensor *), cmp_tensor);
  for (int64_t k = 1; k < f->n_kv; k++)
    if (strcmp(f->kv_sorted[k - 1]->key, f->kv_sorted[k]->key) == 0)
      return anna_err(err, errlen, ANNA_EFORMAT, "duplicate metadata key '%s'",
                      f->kv_sorted[k]->key);
  for (int64_t k = 1; k < f->n_tensors; k++)
    if (strcmp(f->t_sorted[k - 1]->name, f->t_sorted[k]->name) == 0)
      return anna_err(err, errlen, ANNA_EFORMAT, "duplicate tensor name '%s'",
                      f->t_sorted[k]->name);
  return 0;
}

static int parse(gguf_file *f, char *err, size_t errlen) {
  cursor c = {.p = f->base, .size = f->size};
  uint32_t magic = cur_u32(&c, "magic");
  uint32_t version = cur_u32(&c, "version");
  uint64_t n_tensors = cur_u64(&c, "tensor count");
  uint64_t n_kv = cur_u64(&c, "metadata count");
  if (c.failed)
    return anna_err(err, errlen, ANNA_EFORMAT, "truncated header (%zu bytes)", f->size);
  if (magic != GGUF_MAGIC)
    return anna_err(err, errlen, ANNA_EFORMAT, "not a GGUF file (magic 0x%08x)", magic);
  if (version != 2 && version != 3)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "GGUF version %u not supported", version);
  f->version = version;
  /* Smallest kv: 8-byte key length + 4-byte type + 1-byte value. Smallest tensor info:
   * 8 + 4 + 8 + 4 + 8. Counts above what the remaining bytes could hold are lies. */
  if (n_kv > cur_left(&c) / 13)
    return anna_err(err, errlen, ANNA_EFORMAT, "metadata count %" PRIu64 " exceeds file size",
                    n_kv);
  if (n_tensors > cur_left(&c) / 32)
    return anna_err(err, errlen, ANNA_EFORMAT, "tensor count %" PRIu64 " exceeds file size",
                    n_tensors);
  f->kvs = calloc(n_kv ? (size_t)n_kv : 1, sizeof(gguf_kv));
  f->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof(gguf_tensor));
  if (!f->kvs || !f->tensors) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");

  f->alignment = GGUF_DEFAULT_ALIGNMENT;
  for (uint64_t k = 0; k < n_kv; k++) {
    f->n_kv = (int64_t)k + 1; /* so gguf_close frees what was read so far */
    int rc = read_kv(&c, &f->kvs[k], (int64_t)k, err, errlen);
    if (rc) return rc;
    if (strcmp(f->kvs[k].key, "general.alignment") == 0) {
      const gguf_kv *kv = &f->kvs[k];
      if (kv->type != GGUF_TYPE_UINT32 || kv->u == 0 || (kv->u & (kv->u - 1)) != 0)
        return anna_err(err, errlen, ANNA_EFORMAT, "general.alignment must be a power-of-two "
                        "u32 (type %s, value %" PRIu64 ")", gguf_type_name(kv->type), kv->u);
      f->alignment = (size_t)kv->u;
    }
  }
  for (uint64_t k = 0; k < n_tensors; k++) {
    f->n_tensors = (int64_t)k + 1;
    int rc = read_tensor_info(&c, &f->tensors[k], (int64_t)k, err, errlen);
    if (rc) return rc;
  }
  size_t pos = c.pos;
  size_t pad = (f->alignment - pos % f->alignment) % f->alignment;
  f->data_offset = pos + pad; /* pos <= size and alignment <= 2^31: no overflow */
  if (n_tensors > 0 && f->data_offset > f->size)
    return anna_err(err, errlen, ANNA_EFORMAT, "data section starts at %zu, past end of file "
                    "(%zu bytes)", f->data_offset, f->size);
  size_t data_size = f->data_offset <= f->size ? f->size - f->data_offset : 0;
  for (int64_t k = 0; k < f->n_tensors; k++) {
    gguf_tensor *t = &f->tensors[k];
    if (t->offset % f->alignment != 0)
      return anna_err(err, errlen, ANNA_EFORMAT, "tensor '%s': offset %" PRIu64
                      " not aligned to %zu", t->name, t->offset, f->alignment);
    if (t->offset > data_size || (uint64_t)t->nbytes > data_size - t->offset)
      return anna_err(err, errlen, ANNA_EFORMAT, "tensor '%s': data [%" PRIu64 ", +%" PRId64
                      ") lies outside the %zu-byte data section", t->name, t->offset, t->nbytes,
                      data_size);
    t->data = f->base + f->data_offset + t->offset;
  }
  return build_index(f, err, errlen);
}

static int open_common(gguf_file **out, gguf_file *f, char *err, size_t errlen) {
  int rc = parse(f, err, errlen);
  if (rc) {
    gguf_close(f);
    return rc;
  }
  *out = f;
  return 0;
}

int gguf_open_buffer(gguf_file **out, const void *buf, size_t size, char *err, size_t errlen) {
  *out = NULL;
  gguf_file *f = calloc(1, sizeof *f);
  if (!f) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  f->base = buf;
  f->size = size;
  return open_common(out, f, err, errlen);
}

int gguf_open(gguf_file **out, const char *path, char *err, size_t errlen) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return anna_err(err, errlen, ANNA_EIO, "%s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return anna_err(err, errlen, ANNA_EIO, "%s: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode) || st.st_size <= 0) {
    close(fd);
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: not a regular non-empty file", path);
  }
  void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  close(fd);
  if (m == MAP_FAILED) return anna_err(err, errlen, ANNA_EIO, "%s: mmap: %s", path, strerror(e));
  gguf_file *f = calloc(1, sizeof *f);
  if (!f) {
    munmap(m, (size_t)st.st_size);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  f->base = m;
  f->size = (size_t)st.st_size;
  f->mapped = true;
  int rc = open_common(out, f, err, errlen);
  if (rc) anna_err_prefix(err, errlen, rc, "%s", path);
  return rc;
}

void gguf_close(gguf_file *f) {
  if (!f) return;
  for (int64_t k = 0; k < f->n_kv; k++) kv_free(&f->kvs[k]);
  for (int64_t k = 0; k < f->n_tensors; k++) free((void *)f->tensors[k].name);
  free(f->kvs);
  free(f->tensors);
  free(f->kv_sorted);
  free(f->t_sorted);
  if (f->mapped) munmap((void *)f->base, f->size);
  free(f);
}

uint32_t gguf_version(const gguf_file *f) { return f->version; }
size_t gguf_alignment(const gguf_file *f) { return f->alignment; }
size_t gguf_data_offset(const gguf_file *f) { return f->data_offset; }
size_t gguf_file_size(const gguf_file *f) { return f->size; }
int64_t gguf_kv_count(const gguf_file *f) { return f->n_kv; }
int64_t gguf_tensor_count(const gguf_file *f) { return f->n_tensors; }

const gguf_kv *gguf_kv_at(const gguf_file *f, int64_t i) {
  return i >= 0 && i < f->n_kv ? &f->kvs[i] : NULL;
}

const gguf_kv *gguf_kv_find(const gguf_file *f, const char *key) {
  gguf_kv probe = {.key = key};
  const gguf_kv *pp = &probe;
  const gguf_kv **hit = bsearch(&pp, f->kv_sorted, (size_t)f->n_kv, sizeof(gguf_kv *), cmp_kv);
  return hit ? *hit : NULL;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i) {
  return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name) {
  gguf_tensor probe = {.name = name};
  const gguf_tensor *pp = &probe;
  const gguf_tensor **hit =
      bsearch(&pp, f->t_sorted, (size_t)f->n_tensors, sizeof(gguf_tensor *), cmp_tensor);
  return hit ? *hit : NULL;
}

static bool is_unsigned(int t) {
  return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 ||
         t == GGUF_TYPE_UINT64;
}
static bool is_signed(int t) {
  return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 ||
         t == GGUF_TYPE_INT64;
}

static const gguf_kv *find_or_err(const gguf_file *f, const char *key, int *rc, char *err,
                                  size_t errlen) {
  const gguf_kv *kv = gguf_kv_find(f, key);
  *rc = kv ? 0 : anna_err(err, errlen, ANNA_ENOTFOUND, "metadata key '%s' not found", key);
  return kv;
}

static int type_err(const gguf_kv *kv, const char *want, char *err, size_t errlen) {
  return anna_err(err, errlen, ANNA_EFORMAT, "metadata key '%s' is %s, expected %s", kv->key,
                  gguf_type_name(kv->type), want);
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, char *err, size_t errlen) {
  int rc;
  const gguf_kv *kv = find_or_err(f, key, &rc, err, errlen);
  if (!kv) return rc;
  if (is_signed(kv->type)) {
    *out = kv->i;
  } else if (is_unsigned(kv->type)) {
    if (kv->u > (uint64_t)INT64_MAX)
      return anna_err(err, errlen, ANNA_EFORMAT, "metadata key '%s' = %" PRIu64
                      " does not fit int64", key, kv->u);
    *out = (int64_t)kv->u;
  } else {
    return type_err(kv, "an integer", err, errlen);
  }
  return 0;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, char *err, size_t errlen) {
  int64_t v = 0;
  const gguf_kv *kv = gguf_kv_find(f, key);
  if (kv && kv->type == GGUF_TYPE_UINT64 && kv->u > UINT32_MAX)
    return anna_err(err, errlen, ANNA_EFORMAT, "metadata key '%s' = %" PRIu64
                    " does not fit u32", key, kv->u);
  int rc = gguf_get_i64(f, key, &v, err, errlen);
  if (rc) return rc;
  if (v < 0 || v > (int64_t)UINT32_MAX)
    return anna_err(err, errlen, ANNA_EFORMAT, "metadata key '%s' = %" PRId64
                    " does not fit u32", key, v);
  *out = (uint32_t)v;
  return 0;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, char *err, size_t errlen) {
  int rc;
  const gguf_kv *kv = find_or_err(f, key, &rc, err, errlen);
  if (!kv) return rc;
  if (kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64) *out = (float)kv->f;
  else if (is_signed(kv->type)) *out = (float)kv->i;
  else if (is_unsigned(kv->type)) *out = (float)kv->u;
  else return type_err(kv, "a number", err, errlen);
  return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, bool *out, char *err, size_t errlen) {
  int rc;
  const gguf_kv *kv = find_or_err(f, key, &rc, err, errlen);
  if (!kv) return rc;
  if (kv->type != GGUF_TYPE_BOOL) return type_err(kv, "bool", err, errlen);
  *out = kv->b;
  return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, const char **out, char *err,
                 size_t errlen) {
  int rc;
  const gguf_kv *kv = find_or_err(f, key, &rc, err, errlen);
  if (!kv) return rc;
  if (kv->type != GGUF_TYPE_STRING) return type_err(kv, "str", err, errlen);
  *out = kv->str;
  return 0;
}

int gguf_get_arr(const gguf_file *f, const char *key, const gguf_array **out, char *err,
                 size_t errlen) {
  int rc;
  const gguf_kv *kv = find_or_err(f, key, &rc, err, errlen);
  if (!kv) return rc;
  if (kv->type != GGUF_TYPE_ARRAY) return type_err(kv, "arr", err, errlen);
  *out = &kv->arr;
  return 0;
}

int64_t gguf_array_get_i64(const gguf_array *a, int64_t i) {
  if (i < 0 || i >= a->count || a->elem_size == 0) return 0;
  gguf_kv tmp = {0};
  scalar_decode(&tmp, a->elem_type, (const uint8_t *)a->data + (size_t)i * a->elem_size);
  if (is_unsigned(a->elem_type)) return (int64_t)tmp.u;
  if (is_signed(a->elem_type)) return tmp.i;
  if (a->elem_type == GGUF_TYPE_BOOL) return tmp.b;
  return (int64_t)tmp.f;
}

double gguf_array_get_f64(const gguf_array *a, int64_t i) {
  if (i < 0 || i >= a->count || a->elem_size == 0) return 0;
  gguf_kv tmp = {0};
  scalar_decode(&tmp, a->elem_type, (const uint8_t *)a->data + (size_t)i * a->elem_size);
  if (is_unsigned(a->elem_type)) return (double)tmp.u;
  if (is_signed(a->elem_type)) return (double)tmp.i;
  if (a->elem_type == GGUF_TYPE_BOOL) return tmp.b;
  return tmp.f;
}
