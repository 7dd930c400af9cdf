/* gguf.h: read-only GGUF (v2/v3) reader.
 *
 * gguf_open maps the file read-only and parses the header, every metadata key/value and
 * every tensor info up front; nothing is parsed lazily, so once gguf_open returns 0 every
 * accessor below is a plain lookup that cannot fail on file content. Tensor data is never
 * copied: gguf_tensor.data points into the mapping.
 *
 * Lifetimes: everything returned by an accessor (keys, strings, arrays, tensor structs,
 * tensor data) is borrowed from the gguf_file and valid until gguf_close. Numeric array
 * data points into the mapping and may be unaligned: read it with gguf_array_get_* (or
 * memcpy), never by casting.
 *
 * Untrusted input: every read goes through a bounded cursor; counts, lengths, dims, types,
 * offsets and the alignment are checked against the file size before anything is
 * allocated, and each tensor's data range must lie inside the file with a byte size that
 * matches its type and dims. A malformed file is a one-line error from gguf_open.
 */
#ifndef ANNA_FORMATS_GGUF_H
#define ANNA_FORMATS_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

/* Metadata value types, numbered as on disk. */
enum gguf_type {
  GGUF_TYPE_UINT8 = 0,
  GGUF_TYPE_INT8 = 1,
  GGUF_TYPE_UINT16 = 2,
  GGUF_TYPE_INT16 = 3,
  GGUF_TYPE_UINT32 = 4,
  GGUF_TYPE_INT32 = 5,
  GGUF_TYPE_FLOAT32 = 6,
  GGUF_TYPE_BOOL = 7,
  GGUF_TYPE_STRING = 8,
  GGUF_TYPE_ARRAY = 9,
  GGUF_TYPE_UINT64 = 10,
  GGUF_TYPE_INT64 = 11,
  GGUF_TYPE_FLOAT64 = 12,
  GGUF_TYPE_COUNT = 13,
};

/* An array value. Numeric elements: data points into the mapping (elem_size bytes each,
 * little-endian, possibly unaligned). String elements: strs[i] is NUL-terminated (a copy
 * owned by the file), lens[i] its byte length (strings may contain NUL bytes). */
typedef struct gguf_array {
  int elem_type; /* enum gguf_type, never ARRAY (nested arrays are rejected) */
  int64_t count;
  size_t elem_size; /* 0 for strings */
  const void *data;
  const char *const *strs;
  const uint64_t *lens;
} gguf_array;

typedef struct gguf_kv {
  const char *key; /* NUL-terminated copy */
  int type;        /* enum gguf_type */
  /* Scalars, widened: unsigned types in u, signed in i, floats in f, bool in b. */
  uint64_t u;
  int64_t i;
  double f;
  bool b;
  const char *str; /* STRING: NUL-terminated copy */
  uint64_t str_len;
  gguf_array arr; /* ARRAY */
} gguf_kv;

typedef struct gguf_tensor {
  const char *name; /* NUL-terminated copy */
  int type;         /* enum anna_dtype (formats/dtype.h) */
  int ndim;
  int64_t dims[GGUF_MAX_DIMS]; /* dims[0] is the contiguous (row) dimension; unused = 1 */
  int64_t nelem;
  int64_t nbytes;
  uint64_t offset;  /* from the start of the data section */
  const void *data; /* into the mapping */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Maps and parses path. On success *out owns the mapping (caller frees with gguf_close). */
int gguf_open(gguf_file **out, const char *path, char *err, size_t errlen);

/* Parses an in-memory image. buf is borrowed and must outlive *out (caller frees *out with
 * gguf_close, which does not free buf). */
int gguf_open_buffer(gguf_file **out, const void *buf, size_t size, char *err, size_t errlen);

void gguf_close(gguf_file *f); /* NULL is a no-op */

uint32_t gguf_version(const gguf_file *f);
size_t gguf_alignment(const gguf_file *f);
size_t gguf_data_offset(const gguf_file *f); /* file offset of the tensor data section */
size_t gguf_file_size(const gguf_file *f);

int64_t gguf_kv_count(const gguf_file *f);
const gguf_kv *gguf_kv_at(const gguf_file *f, int64_t i); /* borrowed; NULL if out of range */
const gguf_kv *gguf_kv_find(const gguf_file *f, const char *key); /* borrowed; NULL if absent */

/* Typed getters: 0, ANNA_ENOTFOUND when the key is missing, ANNA_EFORMAT when it has an
 * incompatible type or a value that does not fit. Integers convert between widths when the
 * value fits; get_f32 also accepts F64 and integer values. *out is untouched on error. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, char *err, size_t errlen);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, char *err, size_t errlen);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, char *err, size_t errlen);
int gguf_get_bool(const gguf_file *f, const char *key, bool *out, char *err, size_t errlen);
/* *out borrowed (NUL-terminated). */
int gguf_get_str(const gguf_file *f, const char *key, const char **out, char *err,
                 size_t errlen);
/* *out borrowed. */
int gguf_get_arr(const gguf_file *f, const char *key, const gguf_array **out, char *err,
                 size_t errlen);

/* Element i of a numeric array, converted (bool/int/float -> the requested kind). i must be
 * in [0, count); returns 0 for a string array or i out of range. */
int64_t gguf_array_get_i64(const gguf_array *a, int64_t i);
double gguf_array_get_f64(const gguf_array *a, int64_t i);

int64_t gguf_tensor_count(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i); /* borrowed */
const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name); /* borrowed/NULL */

const char *gguf_type_name(int type); /* static string; "?" if unknown */

#endif
