/* api_gguf.c: read-only GGUF inspection for anna.h (anna_gguf_*) over formats/gguf.h. An
 * anna_gguf is a gguf_file under another name (pointer casts only); kv text is formatted
 * exactly as anna-gguf has always printed it. */
#include "anna/anna.h"

#include "base/error.h"
#include "formats/dtype.h"
#include "formats/gguf.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

_Static_assert(ANNA_GGUF_MAX_DIMS == GGUF_MAX_DIMS, "anna.h ANNA_GGUF_MAX_DIMS must equal gguf.h's");
_Static_assert((int)ANNA_GGUF_UINT8 == (int)GGUF_TYPE_UINT8 && (int)ANNA_GGUF_STRING == (int)GGUF_TYPE_STRING &&
                   (int)ANNA_GGUF_ARRAY == (int)GGUF_TYPE_ARRAY && (int)ANNA_GGUF_FLOAT64 == (int)GGUF_TYPE_FLOAT64,
               "anna.h GGUF types must be numbered as on disk");

static const gguf_file *gf(const anna_gguf *g) { return (const gguf_file *)(const void *)g; }

int anna_gguf_open(anna_gguf **out, const char *path, char *err, size_t errlen) {
  gguf_file *f = NULL;
  *out = NULL;
  if (!path) return anna_err(err, errlen, ANNA_EINVAL, "gguf: no path");
  int rc = gguf_open(&f, path, err, errlen);
  if (!rc) *out = (anna_gguf *)(void *)f;
  return rc;
}

void anna_gguf_close(anna_gguf *g) { gguf_close((gguf_file *)(void *)g); }

uint32_t anna_gguf_version(const anna_gguf *g) { return gguf_version(gf(g)); }
size_t anna_gguf_file_size(const anna_gguf *g) { return gguf_file_size(gf(g)); }
size_t anna_gguf_alignment(const anna_gguf *g) { return gguf_alignment(gf(g)); }
size_t anna_gguf_data_offset(const anna_gguf *g) { return gguf_data_offset(gf(g)); }
const char *anna_gguf_type_name(int type) { return gguf_type_name(type); }
int64_t anna_gguf_kv_count(const anna_gguf *g) { return gguf_kv_count(gf(g)); }

const char *anna_gguf_kv_key(const anna_gguf *g, int64_t i) {
  const gguf_kv *kv = gguf_kv_at(gf(g), i);
  return kv ? kv->key : NULL;
}

int64_t anna_gguf_kv_find(const anna_gguf *g, const char *key) {
  if (!key) return -1;
  /* Linear: inspection is not a hot path, and gguf_kv_find returns a pointer, not an index. */
  for (int64_t i = 0; i < gguf_kv_count(gf(g)); i++)
    if (!strcmp(gguf_kv_at(gf(g), i)->key, key)) return i;
  return -1;
}

int anna_gguf_kv_type(const anna_gguf *g, int64_t i, int *elem_type, int64_t *count) {
  const gguf_kv *kv = gguf_kv_at(gf(g), i);
  if (!kv) return -1;
  int arr = kv->type == GGUF_TYPE_ARRAY;
  if (elem_type) *elem_type = arr ? kv->arr.elem_type : -1;
  if (count) *count = arr ? kv->arr.count : 1;
  return kv->type;
}

/* snprintf into a running buffer: keeps counting past cap so the caller learns the length. */
typedef struct textbuf {
  char *p;
  size_t cap, len;
} textbuf;

static void tb_printf(textbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(textbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *dst = b->len < b->cap ? b->p + b->len : NULL;
  int n = vsnprintf(dst, dst ? b->cap - b->len : 0, fmt, ap);
  va_end(ap);
  if (n > 0) b->len += (size_t)n;
}

static void tb_str(textbuf *b, const char *s, uint64_t len, uint64_t max) {
  tb_printf(b, "\"");
  for (uint64_t k = 0; k < len && k < max; k++) {
    unsigned char ch = (unsigned char)s[k];
    if (ch == '"' || ch == '\\') tb_printf(b, "\\%c", ch);
    else if (ch == '\n') tb_printf(b, "\\n");
    else if (ch < 0x20 || ch == 0x7f) tb_printf(b, "\\x%02x", ch);
    else tb_printf(b, "%c", ch);
  }
  if (len > max) tb_printf(b, "...(%" PRIu64 " bytes)", len);
  tb_printf(b, "\"");
}

int64_t anna_gguf_kv_text(const anna_gguf *g, int64_t i, char *out, size_t cap) {
  const gguf_kv *kv = gguf_kv_at(gf(g), i);
  if (!kv) return -1;
  textbuf b = {out, out ? cap : 0, 0};
  if (b.cap) out[0] = '\0';
  switch (kv->type) {
  case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
    tb_printf(&b, "%" PRIu64, kv->u);
    break;
  case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
    tb_printf(&b, "%" PRId64, kv->i);
    break;
  case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64: tb_printf(&b, "%.9g", kv->f); break;
  case GGUF_TYPE_BOOL: tb_printf(&b, "%s", kv->b ? "true" : "false"); break;
  case GGUF_TYPE_STRING: tb_str(&b, kv->str, kv->str_len, 200); break;
  case GGUF_TYPE_ARRAY: {
    const gguf_array *a = &kv->arr;
    const int64_t show = 8;
    tb_printf(&b, "[");
    for (int64_t k = 0; k < a->count && k < show; k++) {
      if (k) tb_printf(&b, ", ");
      if (a->elem_type == GGUF_TYPE_STRING) tb_str(&b, a->strs[k], a->lens[k], 40);
      else if (a->elem_type == GGUF_TYPE_FLOAT32 || a->elem_type == GGUF_TYPE_FLOAT64)
        tb_printf(&b, "%.6g", gguf_array_get_f64(a, k));
      else if (a->elem_type == GGUF_TYPE_UINT64)
        tb_printf(&b, "%" PRIu64, (uint64_t)gguf_array_get_i64(a, k));
      else tb_printf(&b, "%" PRId64, gguf_array_get_i64(a, k));
    }
    if (a->count > show) tb_printf(&b, ", ... (%" PRId64 " total)", a->count);
    tb_printf(&b, "]");
    break;
  }
  default: break;
  }
  return (int64_t)b.len;
}

int anna_gguf_kv_int(const anna_gguf *g, int64_t i, int64_t *out) {
  const gguf_kv *kv = gguf_kv_at(gf(g), i);
  if (!kv) return ANNA_ERANGE;
  switch (kv->type) {
  case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
    if (kv->u > (uint64_t)INT64_MAX) return ANNA_ERANGE;
    *out = (int64_t)kv->u;
    return 0;
  case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64: *out = kv->i; return 0;
  case GGUF_TYPE_BOOL: *out = kv->b; return 0;
  default: return ANNA_EINVAL;
  }
}

int anna_gguf_kv_float(const anna_gguf *g, int64_t i, double *out) {
  const gguf_kv *kv = gguf_kv_at(gf(g), i);
  if (!kv) return ANNA_ERANGE;
  switch (kv->type) {
  case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
    *out = (double)kv->u;
    return 0;
  case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64: *out = (double)kv->i; return 0;
  case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64: *out = kv->f; return 0;
  default: return ANNA_EINVAL;
  }
}

int anna_gguf_kv_str(const anna_gguf *g, int64_t i, const char **out, size_t *len) {
  const gguf_kv *kv = gguf_kv_at(gf(g), i);
  if (!kv) return ANNA_ERANGE;
  if (kv->type != GGUF_TYPE_STRING) return ANNA_EINVAL;
  *out = kv->str;
  if (len) *len = (size_t)kv->str_len;
  return 0;
}

int64_t anna_gguf_tensor_count(const anna_gguf *g) { return gguf_tensor_count(gf(g)); }

int anna_gguf_tensor_info(const anna_gguf *g, int64_t i, anna_gguf_tensor *out) {
  if (i < 0 || i >= gguf_tensor_count(gf(g))) return ANNA_ERANGE;
  const gguf_tensor *t = gguf_tensor_at(gf(g), i);
  if (!t) return ANNA_ERANGE;
  out->name = t->name;
  out->type = t->type;
  out->type_name = dtype_name(t->type);
  out->ndim = t->ndim;
  memcpy(out->dims, t->dims, sizeof out->dims);
  out->n_elements = t->nelem;
  out->n_bytes = t->nbytes;
  out->offset = t->offset;
  return 0;
}
