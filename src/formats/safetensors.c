/* safetensors.c: header parsing with jansson over an mmap'd file; all offsets checked. */
#include "formats/safetensors.h"

#include "base/error.h"
#include "formats/dtype.h"
#include "formats/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct st_file {
  char *path;
  void *map;
  size_t size;
};

struct safetensors_set {
  struct st_file *files;
  size_t n_files;
  safetensors_tensor *tensors;
  size_t n_tensors, cap_tensors;
  /* open-addressing name index */
  int64_t *slots;
  size_t n_slots;
};

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int parse_dtype(const char *s) {
  if (!strcmp(s, "F32")) return ANNA_DTYPE_F32;
  if (!strcmp(s, "F16")) return ANNA_DTYPE_F16;
  if (!strcmp(s, "BF16")) return ANNA_DTYPE_BF16;
  return -1;
}

static int map_file(struct st_file *f, const char *path, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return anna_err(err, errlen, ANNA_EIO, "%s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return anna_err(err, errlen, ANNA_EIO, "%s: %s", path, strerror(errno));
  }
  f->size = (size_t)st.st_size;
  if (f->size < 8) {
    close(fd);
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: file too short for a safetensors header (%zu bytes)",
                    path, f->size);
  }
  f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (f->map == MAP_FAILED) {
    f->map = NULL;
    return anna_err(err, errlen, ANNA_EIO, "%s: mmap: %s", path, strerror(errno));
  }
  f->path = strdup(path);
  if (!f->path) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  return 0;
}

static int add_tensor(safetensors_set *s, const safetensors_tensor *t) {
  if (s->n_tensors == s->cap_tensors) {
    size_t cap = s->cap_tensors ? s->cap_tensors * 2 : 256;
    safetensors_tensor *nt = realloc(s->tensors, cap * sizeof *nt);
    if (!nt) return ANNA_ENOMEM;
    s->tensors = nt;
    s->cap_tensors = cap;
  }
  s->tensors[s->n_tensors++] = *t;
  return 0;
}

static int parse_file(safetensors_set *s, struct st_file *f, char *err, size_t errlen) {
  const unsigned char *b = f->map;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
  if (hlen > f->size - 8 || hlen > (uint64_t)100 * 1024 * 1024)
    return anna_err(err, errlen, ANNA_EFORMAT,
                    "%s: header length %llu exceeds the file size %zu (truncated or not safetensors)",
                    f->path, (unsigned long long)hlen, f->size);
  json_error_t je;
  json_t *root = json_loadb((const char *)b + 8, (size_t)hlen, 0, &je);
  if (!root) return anna_err(err, errlen, ANNA_EFORMAT, "%s: bad header JSON: %s", f->path, je.text);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: header is not a JSON object", f->path);
    goto out;
  }
  const size_t data_start = 8 + (size_t)hlen, data_size = f->size - data_start;
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (!strcmp(key, "__metadata__")) continue;
    json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
           *jo = json_object_get(val, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2) {
      rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: tensor '%s': missing dtype/shape/data_offsets",
                    f->path, key);
      goto out;
    }
    safetensors_tensor t = {0};
    t.dtype = parse_dtype(json_string_value(jd));
    if (t.dtype < 0) {
      rc = anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: tensor '%s': unsupported dtype %s", f->path,
                    key, json_string_value(jd));
      goto out;
    }
    size_t nd = json_array_size(js);
    if (nd > SAFETENSORS_MAX_DIMS) {
      rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: tensor '%s': %zu dimensions (max %d)", f->path,
                    key, nd, SAFETENSORS_MAX_DIMS);
      goto out;
    }
    t.ndim = (int)nd;
    uint64_t nel = 1;
    for (size_t i = 0; i < nd; i++) {
      json_t *d = json_array_get(js, i);
      if (!json_is_integer(d) || json_integer_value(d) < 0 ||
          (uint64_t)json_integer_value(d) > ((uint64_t)1 << 40)) {
        rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: tensor '%s': bad dimension %zu", f->path, key, i);
        goto out;
      }
      t.shape[i] = json_integer_value(d);
      if (t.shape[i] && nel > ((uint64_t)1 << 48) / (uint64_t)t.shape[i]) {
        rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: tensor '%s': shape too large", f->path, key);
        goto out;
      }
      nel *= (uint64_t)t.shape[i];
    }
    json_t *o0 = json_array_get(jo, 0), *o1 = json_array_get(jo, 1);
    if (!json_is_integer(o0) || !json_is_integer(o1) || json_integer_value(o0) < 0 ||
        json_integer_value(o1) < json_integer_value(o0) ||
        (uint64_t)json_integer_value(o1) > data_size) {
      rc = anna_err(err, errlen, ANNA_EFORMAT,
                    "%s: tensor '%s': data_offsets outside the file's %zu data bytes (truncated file?)",
                    f->path, key, data_size);
      goto out;
    }
    uint64_t begin = (uint64_t)json_integer_value(o0), end = (uint64_t)json_integer_value(o1);
    uint64_t want = nel * (uint64_t)dtype_block_bytes(t.dtype);
    if (end - begin != want) {
      rc = anna_err(err, errlen, ANNA_EFORMAT,
                    "%s: tensor '%s': %llu data bytes but shape and dtype need %llu", f->path, key,
                    (unsigned long long)(end - begin), (unsigned long long)want);
      goto out;
    }
    t.data = b + data_start + begin;
    t.nbytes = (size_t)want;
    t.file = f->path;
    t.name = strdup(key);
    if (!t.name || add_tensor(s, &t) != 0) {
      free((char *)t.name);
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      goto out;
    }
  }
out:
  json_decref(root);
  return rc;
}

static int build_index(safetensors_set *s, char *err, size_t errlen) {
  size_t n = 16;
  while (n < s->n_tensors * 2) n *= 2;
  s->slots = malloc(n * sizeof *s->slots);
  if (!s->slots) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) s->slots[i] = -1;
  s->n_slots = n;
  for (size_t i = 0; i < s->n_tensors; i++) {
    size_t h = name_hash(s->tensors[i].name) & (n - 1);
    while (s->slots[h] >= 0) {
      if (!strcmp(s->tensors[s->slots[h]].name, s->tensors[i].name))
        return anna_err(err, errlen, ANNA_EFORMAT, "%s: tensor '%s' appears twice",
                        s->tensors[i].file, s->tensors[i].name);
      h = (h + 1) & (n - 1);
    }
    s->slots[h] = (int64_t)i;
  }
  return 0;
}

/* Shard file names from model.safetensors.index.json's weight_map, deduplicated. */
static int open_index(safetensors_set *s, const char *dir, const char *index_path, char *err,
                      size_t errlen) {
  json_error_t je;
  json_t *root = json_load_file(index_path, 0, &je);
  if (!root) return anna_err(err, errlen, ANNA_EFORMAT, "%s: %s", index_path, je.text);
  json_t *wm = json_object_get(root, "weight_map");
  int rc = 0;
  if (!json_is_object(wm)) {
    rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: no weight_map object", index_path);
    goto out;
  }
  const char *key;
  json_t *val;
  json_object_foreach(wm, key, val) {
    const char *fn = json_string_value(val);
    if (!fn || strchr(fn, '/')) {
      rc = anna_err(err, errlen, ANNA_EFORMAT, "%s: bad shard name for '%s'", index_path, key);
      goto out;
    }
    int seen = 0;
    for (size_t i = 0; i < s->n_files; i++) {
      const char *p = strrchr(s->files[i].path, '/');
      if (!strcmp(p ? p + 1 : s->files[i].path, fn)) seen = 1;
    }
    if (seen) continue;
    struct st_file *nf = realloc(s->files, (s->n_files + 1) * sizeof *nf);
    if (!nf) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      goto out;
    }
    s->files = nf;
    memset(&s->files[s->n_files], 0, sizeof *nf);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, fn);
    rc = map_file(&s->files[s->n_files], path, err, errlen);
    s->n_files++;
    if (rc) goto out;
    rc = parse_file(s, &s->files[s->n_files - 1], err, errlen);
    if (rc) goto out;
  }
out:
  json_decref(root);
  return rc;
}

int safetensors_open(safetensors_set **out, const char *path, char *err, size_t errlen) {
  *out = NULL;
  safetensors_set *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  struct stat st;
  int rc;
  if (stat(path, &st) != 0) {
    rc = anna_err(err, errlen, ANNA_EIO, "%s: %s", path, strerror(errno));
    goto fail;
  }
  if (S_ISDIR(st.st_mode)) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
    if (access(p, R_OK) == 0) {
      rc = open_index(s, path, p, err, errlen);
    } else {
      snprintf(p, sizeof p, "%s/model.safetensors", path);
      s->files = calloc(1, sizeof *s->files);
      if (!s->files) {
        rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
        goto fail;
      }
      s->n_files = 1;
      rc = map_file(&s->files[0], p, err, errlen);
      if (!rc) rc = parse_file(s, &s->files[0], err, errlen);
    }
  } else {
    s->files = calloc(1, sizeof *s->files);
    if (!s->files) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      goto fail;
    }
    s->n_files = 1;
    rc = map_file(&s->files[0], path, err, errlen);
    if (!rc) rc = parse_file(s, &s->files[0], err, errlen);
  }
  if (!rc) rc = build_index(s, err, errlen);
  if (rc) goto fail;
  *out = s;
  return 0;
fail:
  safetensors_close(s);
  return rc;
}

void safetensors_close(safetensors_set *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n_tensors; i++) free((char *)s->tensors[i].name);
  free(s->tensors);
  for (size_t i = 0; i < s->n_files; i++) {
    if (s->files[i].map) munmap(s->files[i].map, s->files[i].size);
    free(s->files[i].path);
  }
  free(s->files);
  free(s->slots);
  free(s);
}

const safetensors_tensor *safetensors_find(const safetensors_set *s, const char *name) {
  if (!s->n_slots) return NULL;
  size_t h = name_hash(name) & (s->n_slots - 1);
  while (s->slots[h] >= 0) {
    const safetensors_tensor *t = &s->tensors[s->slots[h]];
    if (!strcmp(t->name, name)) return t;
    h = (h + 1) & (s->n_slots - 1);
  }
  return NULL;
}

size_t safetensors_count(const safetensors_set *s) {
  return s->n_tensors;
}

const safetensors_tensor *safetensors_at(const safetensors_set *s, size_t i) {
  return i < s->n_tensors ? &s->tensors[i] : NULL;
}

int64_t safetensors_tensor_numel(const safetensors_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

float safetensors_tensor_f32(const safetensors_tensor *t, int64_t i) {
  if (t->dtype == ANNA_DTYPE_F32) {
    float f;
    memcpy(&f, (const char *)t->data + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, (const char *)t->data + 2 * i, 2);
  return t->dtype == ANNA_DTYPE_BF16 ? quant_bf16_to_f32(h) : quant_f16_to_f32(h);
}
