/* anna-pull: downloads a model from the Hugging Face Hub into huggingface_hub's cache and
 * prints its local path (a snapshot folder, or one file for ORG/NAME:FILE) on stdout. */
#include "anna/anna.h"
#include "cli_common.h"

static int usage(void) {
  fprintf(stderr,
          "usage: anna-pull [options] ORG/NAME[:FILE|:TAG]\n"
          "  ORG/NAME             a folder model: config.json, *.safetensors, tokenizer and template files\n"
          "  ORG/NAME:FILE        one file of the repo (a GGUF: Qwen/Qwen2.5-0.5B-Instruct-GGUF:qwen2.5-0.5b-instruct-q8_0.gguf)\n"
          "  ORG/NAME:TAG         the GGUF of a quantization (Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q8_0); a GGUF\n"
          "                       repo named alone gives its Q4_K_M file, as llama.cpp's -hf\n"
          "  --revision REV       branch, tag or commit (default main)\n"
          "  --cache-dir DIR      the Hub cache (default HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub)\n"
          "  --endpoint URL       the Hub (default HF_ENDPOINT or https://huggingface.co)\n"
          "  --offline            the cache only (as HF_HUB_OFFLINE=1)\n"
          "  --retries N          attempts after a transfer breaks off, each resuming (default 3)\n"
          "  --no-progress        no progress bar (it is shown when stderr is a terminal)\n"
          "  --quiet              nothing on stderr but errors\n"
          "The token comes from HF_TOKEN, HUGGING_FACE_HUB_TOKEN or HF_HOME/token.\n"
          "The last stdout line is the local path.\n");
  return 2;
}

int main(int argc, char **argv) {
  hub_options o = {.offline = -1, .progress = -1, .retries = -1};
  const char *spec = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--revision")) { CLI_NEEDV(); o.revision = v; }
    else if (!strcmp(a, "--cache-dir")) { CLI_NEEDV(); o.cache_dir = v; }
    else if (!strcmp(a, "--endpoint")) { CLI_NEEDV(); o.endpoint = v; }
    else if (!strcmp(a, "--offline")) o.offline = 1;
    else if (!strcmp(a, "--retries")) { CLI_NEEDV(); if (cli_int(a, v, 0, 100, &o.retries)) return 2; }
    else if (!strcmp(a, "--no-progress")) o.progress = 0;
    else if (!strcmp(a, "--quiet")) { o.quiet = 1; o.progress = 0; }
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage();
    else if (a[0] == '-') { fprintf(stderr, "error: unknown flag %s\n", a); return usage(); }
    else if (spec) { fprintf(stderr, "error: one model at a time (got %s and %s)\n", spec, a); return 2; }
    else spec = a;
  }
  if (!spec) return usage();
  char err[1024], *path = NULL;
  if (hub_fetch(spec, &o, &path, err, sizeof err)) {
    fprintf(stderr, "error: %s\n", err);
    return 1;
  }
  printf("%s\n", path);
  free(path);
  return 0;
}
