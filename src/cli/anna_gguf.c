/* anna-gguf: print a GGUF file's metadata (arrays abbreviated) and tensor list. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "formats/dtype.h"
#include "formats/gguf.h"

static void print_str(const char *s, uint64_t len, uint64_t max) {
  putchar('"');
  for (uint64_t k = 0; k < len && k < max; k++) {
    unsigned char ch = (unsigned char)s[k];
    if (ch == '"' || ch == '\\') printf("\\%c", ch);
    else if (ch == '\n') fputs("\\n", stdout);
    else if (ch < 0x20 || ch == 0x7f) printf("\\x%02x", ch);
    else putchar(ch);
  }
  if (len > max) printf("...(%" PRIu64 " bytes)", len);
  putchar('"');
}

static void print_scalar(const gguf_kv *kv) {
  switch (kv->type) {
  case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
    printf("%" PRIu64, kv->u);
    break;
  case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
    printf("%" PRId64, kv->i);
    break;
  case GGUF_TYPE_FLOAT32: case GGUF_TYPE_FLOAT64: printf("%.9g", kv->f); break;
  case GGUF_TYPE_BOOL: fputs(kv->b ? "true" : "false", stdout); break;
  case GGUF_TYPE_STRING: print_str(kv->str, kv->str_len, 200); break;
  default: break;
  }
}

static void print_array(const gguf_array *a) {
  const int64_t show = 8;
  printf("[");
  for (int64_t k = 0; k < a->count && k < show; k++) {
    if (k) printf(", ");
    if (a->elem_type == GGUF_TYPE_STRING) print_str(a->strs[k], a->lens[k], 40);
    else if (a->elem_type == GGUF_TYPE_FLOAT32 || a->elem_type == GGUF_TYPE_FLOAT64)
      printf("%.6g", gguf_array_get_f64(a, k));
    else if (a->elem_type == GGUF_TYPE_UINT64)
      printf("%" PRIu64, (uint64_t)gguf_array_get_i64(a, k));
    else printf("%" PRId64, gguf_array_get_i64(a, k));
  }
  if (a->count > show) printf(", ... (%" PRId64 " total)", a->count);
  printf("]");
}

int main(int argc, char **argv) {
  if (argc != 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    fprintf(stderr, "usage: anna-gguf FILE.gguf\n");
    return 2;
  }
  char err[512];
  gguf_file *f = NULL;
  if (gguf_open(&f, argv[1], err, sizeof err) != 0) {
    fprintf(stderr, "anna-gguf: %s\n", err);
    return 1;
  }
  printf("GGUF v%u, %zu bytes, alignment %zu, data at %zu\n", gguf_version(f), gguf_file_size(f),
         gguf_alignment(f), gguf_data_offset(f));
  printf("metadata (%" PRId64 "):\n", gguf_kv_count(f));
  for (int64_t k = 0; k < gguf_kv_count(f); k++) {
    const gguf_kv *kv = gguf_kv_at(f, k);
    if (kv->type == GGUF_TYPE_ARRAY) {
      printf("  %s: arr<%s> = ", kv->key, gguf_type_name(kv->arr.elem_type));
      print_array(&kv->arr);
    } else {
      printf("  %s: %s = ", kv->key, gguf_type_name(kv->type));
      print_scalar(kv);
    }
    putchar('\n');
  }
  int64_t total = 0;
  printf("tensors (%" PRId64 "):\n", gguf_tensor_count(f));
  for (int64_t k = 0; k < gguf_tensor_count(f); k++) {
    const gguf_tensor *t = gguf_tensor_at(f, k);
    printf("  %-48s %-8s [", t->name, dtype_name(t->type));
    for (int d = 0; d < t->ndim; d++) printf(d ? ", %" PRId64 : "%" PRId64, t->dims[d]);
    printf("] %" PRId64 " bytes @ %" PRIu64 "\n", t->nbytes, t->offset);
    total += t->nbytes;
  }
  printf("total tensor bytes: %" PRId64 "\n", total);
  gguf_close(f);
  return 0;
}
