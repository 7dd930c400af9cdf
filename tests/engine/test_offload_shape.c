/* test_offload_shape: what model_shape_get tells a backend that offloads MoE experts
 * (ops_model_shape: the expert arrays per layer, the dense bytes, the GGUF file and mapping),
 * without a device. For every MoE fixture (HF folders and GGUF files): every MoE layer lists
 * its expert arrays with the forward pass's count (E + 1 when the shared expert is linked as
 * expert E), others none; the dense bytes are positive and, with the experts, no more than
 * the file's tensor bytes; for a GGUF, pread of the file at (data - weights_map) gives each
 * sampled expert's bytes exactly (the offload's file tier reads experts that way).
 * Usage: test_offload_shape FIXTURES_DIR */
#define _POSIX_C_SOURCE 200809L
#include "cache/expert_store.h"
#include "formats/dtype.h"
#include "model/gguf_model.h"
#include "model/model.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int g_fail, g_checks;
#define CHECK(c, ...)                                                                              \
  do {                                                                                             \
    g_checks++;                                                                                    \
    if (!(c)) {                                                                                    \
      g_fail++;                                                                                    \
      printf("  FAIL %s:%d: ", __FILE__, __LINE__);                                                \
      printf(__VA_ARGS__);                                                                         \
      printf("\n");                                                                                \
    }                                                                                              \
  } while (0)

static int64_t w_bytes(const ops_weight *w) {
  return w && w->data ? dtype_row_bytes(w->type, w->cols) * w->rows : 0;
}

static void check_model(const char *path, int gguf) {
  printf("%s\n", path);
  char err[512] = "";
  text_model *m = NULL;
  int rc = gguf ? gguf_model_load(&m, path, err, sizeof err) : model_load_hf(&m, path, err, sizeof err);
  CHECK(rc == 0, "load: %s", err);
  if (rc) return;
  ops_model_shape *s = calloc(1, sizeof *s);
  model_shape_get(m, 256, s);
  const model_config *c = &m->cfg;
  int moe_layers = 0;
  int64_t expert_bytes = 0;
  for (int l = 0; l < c->n_layers; l++) {
    const ops_layer_shape *ls = &s->layers[l];
    if (!c->layers[l].is_moe) {
      CHECK(ls->n_exp == 0 && !ls->exp_gate, "layer %d is dense but lists experts", l);
      continue;
    }
    moe_layers++;
    const layer_weights *w = &m->layers[l];
    const int sx = w->sx_gate && w->router.rows == c->n_experts;
    CHECK(ls->n_exp == c->n_experts + sx, "layer %d: %d experts, want %d", l, ls->n_exp, c->n_experts + sx);
    CHECK(ls->exp_gate == (sx ? w->sx_gate : w->exp_gate) && ls->exp_down == (sx ? w->sx_down : w->exp_down),
          "layer %d: not the arrays forward.c passes", l);
    for (int e = 0; e < ls->n_exp; e++)
      expert_bytes += w_bytes(&ls->exp_gate[e]) + (ls->exp_up ? w_bytes(&ls->exp_up[e]) : 0) + w_bytes(&ls->exp_down[e]);
  }
  CHECK(moe_layers > 0, "no MoE layer");
  printf("  %d MoE layers, %d experts each%s, %lld expert bytes, %lld dense bytes\n", moe_layers,
         moe_layers ? s->layers[c->n_layers - 1].n_exp : 0,
         moe_layers && s->layers[c->n_layers - 1].n_exp > c->n_experts ? " (the shared one as expert E)" : "",
         (long long)expert_bytes, (long long)s->dense_weight_bytes);
  CHECK(s->dense_weight_bytes > 0, "dense bytes %lld", (long long)s->dense_weight_bytes);
  if (gguf) {
    CHECK(s->weights_file && !strcmp(s->weights_file, path), "weights_file %s", s->weights_file ? s->weights_file : "(null)");
    CHECK(s->weights_map && s->weights_map_bytes > 0, "no mapping");
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (int64_t)sb.st_size == s->weights_map_bytes, "mapping %lld bytes, file %lld",
          (long long)s->weights_map_bytes, (long long)sb.st_size);
    CHECK(s->dense_weight_bytes + expert_bytes <= s->weights_map_bytes, "dense %lld + experts %lld > file %lld",
          (long long)s->dense_weight_bytes, (long long)expert_bytes, (long long)s->weights_map_bytes);
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0, "open %s", path);
    int read_ok = 0, sampled = 0;
    for (int l = 0; fd >= 0 && l < c->n_layers; l++) {
      const ops_layer_shape *ls = &s->layers[l];
      for (int e = 0; e < ls->n_exp; e += 3) {
        const ops_weight *parts[3] = {&ls->exp_gate[e], ls->exp_up ? &ls->exp_up[e] : NULL, &ls->exp_down[e]};
        for (int p = 0; p < 3; p++) {
          if (!parts[p]) continue;
          const int64_t nb = w_bytes(parts[p]);
          const int64_t off = (const char *)parts[p]->data - (const char *)s->weights_map;
          unsigned char *buf = malloc((size_t)nb);
          sampled++;
          if (off >= 0 && off + nb <= s->weights_map_bytes &&
              expert_store_pread(fd, buf, (size_t)nb, off, path, err, sizeof err) == 0 &&
              !memcmp(buf, parts[p]->data, (size_t)nb))
            read_ok++;
          free(buf);
        }
      }
    }
    CHECK(sampled > 0 && read_ok == sampled, "%d of %d sampled expert matrices read back from the file", read_ok,
          sampled);
    if (fd >= 0) close(fd);
  } else {
    CHECK(!s->weights_file && !s->weights_map, "a folder has no single file");
  }
  free(s);
  model_free(m);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_offload_shape FIXTURES_DIR\n");
    return 2;
  }
  char p[1024];
  static const char *hf[] = {"qwen3_moe", "qwen3_5_moe_text"};
  for (size_t i = 0; i < sizeof hf / sizeof *hf; i++) {
    snprintf(p, sizeof p, "%s/%s", argv[1], hf[i]);
    check_model(p, 0);
  }
  static const char *gg[] = {"qwen3_moe", "qwen3_5_moe_text", "qwen3_5_moe_fused", "gemma4_moe"};
  for (size_t i = 0; i < sizeof gg / sizeof *gg; i++) {
    snprintf(p, sizeof p, "%s/tests/fixtures/gguf/%s.gguf", ANNA_SOURCE_DIR, gg[i]);
    check_model(p, 1);
  }
  printf("%s: %d checks, %d failures\n", g_fail ? "FAILED" : "OK", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
