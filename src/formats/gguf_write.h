/* gguf_write.h: a GGUF v3 writer (the format formats/gguf.h reads and llama.cpp loads).
 *
 * Build the file in memory-light steps: create a writer, add metadata key/values (every
 * GGUF value type, arrays of numbers or strings), declare tensors (name, type, dims) and
 * then write: gguf_writer_write streams the header, the KV section, the tensor infos and,
 * for each tensor in declaration order, asks the caller's fill callback for its bytes
 * straight into the file (so a model is never held twice in memory). Tensor data offsets
 * are aligned to general.alignment (32 unless the caller set that key as a u32).
 *
 * Ownership: the writer copies keys, strings and names; array data is copied too. The
 * writer is not thread-safe. Errors are 0 / negative ANNA_E* with a message in err.
 */
#ifndef ANNA_FORMATS_GGUF_WRITE_H
#define ANNA_FORMATS_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct gguf_writer gguf_writer;

/* Caller frees with gguf_writer_free. */
int gguf_writer_create(gguf_writer **out, char *err, size_t errlen);
void gguf_writer_free(gguf_writer *w); /* NULL is a no-op */

/* Scalars. A key may be set once (a second set is ANNA_EINVAL). */
int gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v);
int gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v);
int gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v);
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v);
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_set_f64(gguf_writer *w, const char *key, double v);
int gguf_writer_set_bool(gguf_writer *w, const char *key, int v);
int gguf_writer_set_str(gguf_writer *w, const char *key, const char *s);
/* Numeric array: elem_type an enum gguf_type scalar (not STRING/ARRAY); data holds n
 * little-endian elements of that type (copied). */
int gguf_writer_set_arr(gguf_writer *w, const char *key, int elem_type, const void *data, int64_t n);
/* String array: n strings, lens[i] bytes each (lens NULL: NUL-terminated). Copied. */
int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, const size_t *lens, int64_t n);

/* Declares a tensor: type an anna_dtype (= ggml type id), dims[0] the row length (GGUF
 * order, innermost first), ndim 1..4. dims[0] must be a whole number of the type's blocks. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, int type, int ndim, const int64_t *dims);

/* Fills dst (nbytes, exactly the tensor's size) with tensor index i's data. 0 or ANNA_E*
 * with a message in err (the write then fails with it). */
typedef int (*gguf_fill_fn)(void *user, int64_t i, void *dst, size_t nbytes, char *err, size_t errlen);

/* Writes the whole file to path (created or truncated). fill is called once per tensor, in
 * declaration order, with a buffer of that tensor's size. On failure the file may be
 * partial: callers that need atomicity write to a temporary name and rename. */
int gguf_writer_write(gguf_writer *w, const char *path, gguf_fill_fn fill, void *user, char *err, size_t errlen);

#endif
