/* anna-quantize: Hugging Face folder -> GGUF (llama.cpp's Q4_K_M mix, or bf16) through
 * anna_quantize_model; by default into the cache that --weight-quant int4 loads from. */
#include "anna/anna.h"
#include "cli_common.h"

#include <sys/stat.h>

static void usage(FILE *f) {
  fprintf(f, "usage: anna-quantize --model-dir DIR|--hf-repo ORG/NAME [--type int4|bf16] [--out FILE.gguf]\n"
             "  --model-dir DIR   Hugging Face folder (config.json, *.safetensors, tokenizer.json):\n"
             "                    qwen2, qwen3, llama, qwen3_5 dense\n"
             "  --type T          int4 (default: Q4_K / Q6_K mix as llama.cpp's Q4_K_M) or bf16\n"
             "  --out FILE        write there (default: the cache ${ANNA_CACHE:-~/.cache/anna}/quant/,\n"
             "                    reused when the source files are unchanged)\n"
             "Prints the GGUF path on stdout, timing on stderr.\n");
}

int main(int argc, char **argv) {
  const char *dir = NULL, *type = "int4", *out = NULL, *hf = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--model-dir")) { CLI_NEEDV(); dir = v; }
    else if (!strcmp(a, "--hf-repo")) { CLI_NEEDV(); hf = v; }
    else if (!strcmp(a, "--type")) { CLI_NEEDV(); type = v; }
    else if (!strcmp(a, "--out")) { CLI_NEEDV(); out = v; }
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
    else {
      fprintf(stderr, "error: unknown argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (cli_hf_model(hf, &dir)) return 1;
  if (!dir) {
    fprintf(stderr, "error: --model-dir is required\n");
    usage(stderr);
    return 2;
  }
  if (strcmp(type, "int4") && strcmp(type, "bf16")) {
    fprintf(stderr, "error: --type expects int4 or bf16, got '%s'\n", type);
    return 2;
  }
  char err[1024], path[4096];
  int built = 0;
  const double t0 = cli_now();
  int rc = anna_quantize_model(dir, type, out, path, sizeof path, &built, err, sizeof err);
  if (rc) {
    fprintf(stderr, "error: %s\n", err);
    return 1;
  }
  struct stat sb;
  const double mib = stat(path, &sb) == 0 ? (double)sb.st_size / (1024.0 * 1024.0) : 0;
  fprintf(stderr, "%s %s in %.2f s (%.1f MiB)\n", built ? "quantized" : "cache hit:", type, cli_now() - t0, mib);
  printf("%s\n", path);
  return 0;
}
