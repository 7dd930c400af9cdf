/* gguf_tensor_cmp.c: are the tensors of two GGUF files the same? For every tensor of B:
 * present in A with the same type, dims and bytes. Prints a summary line (and the first
 * differing tensors); exit 0 when all are identical. Used by bench/llamacpp_quantize_check.sh.
 *   gguf_tensor_cmp A.gguf B.gguf */
#include "formats/dtype.h"
#include "formats/gguf.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc != 3) return fprintf(stderr, "usage: gguf_tensor_cmp A.gguf B.gguf\n"), 2;
  char err[512];
  gguf_file *a = NULL, *b = NULL;
  if (gguf_open(&a, argv[1], err, sizeof err) || gguf_open(&b, argv[2], err, sizeof err))
    return fprintf(stderr, "error: %s\n", err), 1;
  int64_t same = 0, differ = 0, shown = 0;
  for (int64_t i = 0; i < gguf_tensor_count(b); i++) {
    const gguf_tensor *tb = gguf_tensor_at(b, i), *ta = gguf_tensor_find(a, tb->name);
    int ok = ta && ta->type == tb->type && ta->nbytes == tb->nbytes;
    for (int d = 0; ok && d < GGUF_MAX_DIMS; d++) ok = ta->dims[d] == tb->dims[d];
    if (ok) ok = !memcmp(ta->data, tb->data, (size_t)tb->nbytes);
    if (ok) same++;
    else {
      differ++;
      if (shown++ < 10)
        printf("  differs: %s (%s vs %s)\n", tb->name, ta ? dtype_name(ta->type) : "missing", dtype_name(tb->type));
    }
  }
  printf("%lld of %lld tensors identical (A has %lld)\n", (long long)same, (long long)(same + differ),
         (long long)gguf_tensor_count(a));
  gguf_close(a);
  gguf_close(b);
  return differ ? 1 : 0;
}
