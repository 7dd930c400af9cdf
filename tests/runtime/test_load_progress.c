/* test_load_progress: anna_model_options.progress (model/prefetch.h). Loading the qwen3
 * fixture folder, and a GGUF written from it, with a progress callback: the first call is
 * (0, total), the last (total, total), done never goes back, total is exactly the weight
 * files' size (the folder's model.safetensors; the GGUF file), and the model still loads and
 * describes itself the same. Without a callback nothing is called. A folder with a weight
 * file that cannot be read still loads progress to the end and fails the load naming it. */
#include "anna/anna.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fails;
#define CHECK(c)                                                                                                       \
  do {                                                                                                                 \
    if (!(c)) {                                                                                                        \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);                                            \
      fails++;                                                                                                         \
    }                                                                                                                  \
  } while (0)

typedef struct rec {
  int calls, back;
  uint64_t first_done, first_total, last_done, last_total, prev;
} rec;

static void on_progress(void *user, uint64_t done, uint64_t total) {
  rec *r = user;
  if (r->calls++ == 0)
    r->first_done = done, r->first_total = total;
  else if (done < r->prev)
    r->back++;
  r->prev = done;
  r->last_done = done;
  r->last_total = total;
}

static uint64_t file_size(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static void check_load(const char *path, uint64_t want_total, const char *want_desc) {
  rec r = {0};
  char err[512] = "";
  anna_model *m = NULL;
  anna_model_options mo = {.progress = on_progress, .progress_user = &r};
  int rc = anna_model_load(&m, path, &mo, err, sizeof err);
  CHECK(rc == 0);
  if (rc) fprintf(stderr, "load %s: %s\n", path, err);
  CHECK(r.calls >= 2);
  CHECK(r.first_done == 0 && r.first_total == want_total);
  CHECK(r.last_done == want_total && r.last_total == want_total);
  CHECK(r.back == 0);
  if (m && want_desc) CHECK(!strcmp(anna_model_describe(m), want_desc));
  anna_model_free(m);
}

int main(int argc, char **argv) {
  const char *fx = argc > 1 ? argv[1] : "../shared/fixtures";
  char dir[1024], st[1100], gguf[256];
  snprintf(dir, sizeof dir, "%s/qwen3", fx);
  snprintf(st, sizeof st, "%s/model.safetensors", dir);
  const uint64_t st_size = file_size(st);
  CHECK(st_size > 0);

  /* reference description, loaded without a callback: nothing is called */
  char err[512] = "";
  anna_model *m = NULL;
  rec none = {0};
  anna_model_options plain = {.progress_user = &none};
  if (anna_model_load(&m, dir, &plain, err, sizeof err)) {
    fprintf(stderr, "cannot load %s: %s\n", dir, err);
    return 1;
  }
  char desc[256];
  snprintf(desc, sizeof desc, "%s", anna_model_describe(m));
  anna_model_free(m);
  CHECK(none.calls == 0);

  check_load(dir, st_size, desc);

  snprintf(gguf, sizeof gguf, "/tmp/anna_test_load_progress_%d.gguf", (int)getpid());
  if (anna_quantize_model(dir, "bf16", gguf, NULL, 0, NULL, err, sizeof err)) {
    fprintf(stderr, "cannot write %s: %s\n", gguf, err);
    fails++;
  } else {
    check_load(gguf, file_size(gguf), NULL);
  }
  unlink(gguf);

  /* a folder whose weight file is a dangling link: progress still ends, the load fails */
  char bad[256], link_path[300], cfg_src[1100], cfg_dst[300];
  snprintf(bad, sizeof bad, "/tmp/anna_test_load_progress_%d", (int)getpid());
  mkdir(bad, 0700);
  snprintf(link_path, sizeof link_path, "%s/model.safetensors", bad);
  snprintf(cfg_src, sizeof cfg_src, "%s/config.json", dir);
  snprintf(cfg_dst, sizeof cfg_dst, "%s/config.json", bad);
  CHECK(symlink("/nonexistent/model.safetensors", link_path) == 0);
  CHECK(symlink(cfg_src, cfg_dst) == 0);
  rec r = {0};
  anna_model_options mo = {.progress = on_progress, .progress_user = &r};
  m = NULL;
  CHECK(anna_model_load(&m, bad, &mo, err, sizeof err) != 0);
  CHECK(m == NULL);
  CHECK(r.calls >= 2 && r.last_done == r.last_total);
  anna_model_free(m);
  unlink(link_path);
  unlink(cfg_dst);
  rmdir(bad);

  if (fails)
    fprintf(stderr, "%d check(s) failed\n", fails);
  else
    printf("test_load_progress: ok\n");
  return fails != 0;
}
