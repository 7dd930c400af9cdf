/* anna-gguf: print a GGUF file's metadata (arrays abbreviated) and tensor list. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anna/anna.h"
#include "cli_common.h"

int main(int argc, char **argv) {
  const char *path = argc == 2 ? argv[1] : NULL;
  if (argc == 3 && !strcmp(argv[1], "--hf-repo") && cli_hf_model(argv[2], &path)) return 1;
  if (!path || strcmp(path, "-h") == 0 || strcmp(path, "--help") == 0) {
    fprintf(stderr, "usage: anna-gguf FILE.gguf | anna-gguf --hf-repo ORG/NAME:FILE.gguf\n");
    return 2;
  }
  char err[512];
  anna_gguf *f = NULL;
  if (anna_gguf_open(&f, path, err, sizeof err) != 0) {
    fprintf(stderr, "anna-gguf: %s\n", err);
    return 1;
  }
  printf("GGUF v%u, %zu bytes, alignment %zu, data at %zu\n", anna_gguf_version(f), anna_gguf_file_size(f),
         anna_gguf_alignment(f), anna_gguf_data_offset(f));
  printf("metadata (%" PRId64 "):\n", anna_gguf_kv_count(f));
  char small[4096], *buf = small;
  size_t cap = sizeof small;
  int rc = 0;
  for (int64_t k = 0; k < anna_gguf_kv_count(f) && !rc; k++) {
    int elem = -1;
    int type = anna_gguf_kv_type(f, k, &elem, NULL);
    if (type == ANNA_GGUF_ARRAY)
      printf("  %s: arr<%s> = ", anna_gguf_kv_key(f, k), anna_gguf_type_name(elem));
    else
      printf("  %s: %s = ", anna_gguf_kv_key(f, k), anna_gguf_type_name(type));
    int64_t len = anna_gguf_kv_text(f, k, buf, cap);
    if (len >= 0 && (size_t)len >= cap) { /* a value longer than the buffer: grow it once for it */
      char *nb = malloc((size_t)len + 1);
      if (!nb) {
        fprintf(stderr, "anna-gguf: out of memory\n");
        rc = 1;
        break;
      }
      if (buf != small) free(buf);
      buf = nb;
      cap = (size_t)len + 1;
      anna_gguf_kv_text(f, k, buf, cap);
    }
    fwrite(buf, 1, len > 0 ? (size_t)len : 0, stdout);
    putchar('\n');
  }
  if (buf != small) free(buf);
  if (rc) {
    anna_gguf_close(f);
    return rc;
  }
  int64_t total = 0;
  printf("tensors (%" PRId64 "):\n", anna_gguf_tensor_count(f));
  for (int64_t k = 0; k < anna_gguf_tensor_count(f); k++) {
    anna_gguf_tensor t;
    if (anna_gguf_tensor_info(f, k, &t)) break;
    printf("  %-48s %-8s [", t.name, t.type_name);
    for (int d = 0; d < t.ndim; d++) printf(d ? ", %" PRId64 : "%" PRId64, t.dims[d]);
    printf("] %" PRId64 " bytes @ %" PRIu64 "\n", t.n_bytes, t.offset);
    total += t.n_bytes;
  }
  printf("total tensor bytes: %" PRId64 "\n", total);
  anna_gguf_close(f);
  return 0;
}
