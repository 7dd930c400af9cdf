/* safetensors.h: read-only, mmap'd safetensors files (one or a sharded set).
 *
 * A safetensors_set maps every file of a model folder (model.safetensors, or the shards
 * named by model.safetensors.index.json) and indexes their tensors by name. Tensor data
 * pointers point into the mappings: no second host copy. They stay valid until
 * safetensors_close. The 8-byte header length, the JSON header, each dtype, shape and
 * data_offsets are validated against the file size before anything is trusted; a bad
 * file is an error naming the file and tensor.
 */
#ifndef ANNA_FORMATS_SAFETENSORS_H
#define ANNA_FORMATS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define SAFETENSORS_MAX_DIMS 8

typedef struct safetensors_tensor {
  const char *name;   /* borrowed from the set */
  int dtype;          /* anna_dtype (F32, F16, BF16; others rejected at open) */
  int ndim;
  int64_t shape[SAFETENSORS_MAX_DIMS]; /* as stored, outermost first (PyTorch order) */
  const void *data;   /* borrowed, points into the mapping */
  size_t nbytes;
  const char *file;   /* borrowed: the file it lives in, for messages */
} safetensors_tensor;

typedef struct safetensors_set safetensors_set;

/* Opens one .safetensors file, or a folder (model.safetensors or the index's shards).
 * Caller closes with safetensors_close. */
int safetensors_open(safetensors_set **out, const char *path, char *err, size_t errlen);
void safetensors_close(safetensors_set *s);

/* NULL when absent. Borrowed. */
const safetensors_tensor *safetensors_find(const safetensors_set *s, const char *name);
size_t safetensors_count(const safetensors_set *s);
const safetensors_tensor *safetensors_at(const safetensors_set *s, size_t i);

/* Element count of t (product of its shape). */
int64_t safetensors_tensor_numel(const safetensors_tensor *t);
/* Element i of t (F32, F16 or BF16 as stored) as f32, exactly (the formats' conversions of
 * quant.h); the caller keeps i < numel. */
float safetensors_tensor_f32(const safetensors_tensor *t, int64_t i);

#endif
