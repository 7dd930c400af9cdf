/* context.c: the public API (include/anna/anna.h) over model loading, a backend and the
 * forward state. */
#include "anna/anna.h"

#include "backends/cpu/cpu_backend.h"
#ifdef ANNA_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif
#include "base/error.h"
#include "base/threadpool.h"
#include "model/forward.h"
#include "model/gguf_model.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct anna_context {
  anna_model *m;
  threadpool *tp;
  ops_backend *be;
  fwd_state *st;
  int on_cuda;
};

/* Devices this build can use: "auto" resolves to cuda when a GPU is present. */
static int device_pick(const char *device, int *cuda, char *err, size_t errlen) {
  *cuda = 0;
  if (!device || !strcmp(device, "cpu")) return 0;
#ifdef ANNA_HAVE_CUDA
  if (!strcmp(device, "auto")) {
    *cuda = cuda_backend_available();
    return 0;
  }
  if (!strcmp(device, "cuda")) {
    if (!cuda_backend_available()) return anna_err(err, errlen, ANNA_EUNSUPPORTED, "device 'cuda': no CUDA device found");
    *cuda = 1;
    return 0;
  }
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "device '%s' is not available (have: cpu, cuda, auto)", device);
#else
  if (!strcmp(device, "auto")) return 0;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "device '%s' is not available in this build (have: cpu)", device);
#endif
}

int anna_model_load(anna_model **out, const char *path, const anna_model_options *opt, char *err, size_t errlen) {
  *out = NULL;
  if (!path) return anna_err(err, errlen, ANNA_EINVAL, "no model path given");
  int cuda;
  int rc = device_pick(opt ? opt->device : NULL, &cuda, err, errlen);
  if (rc) return rc;
  if (opt && opt->dtype && strcmp(opt->dtype, "f32") && strcmp(opt->dtype, "float32"))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "compute dtype '%s' is not supported on cpu (have: f32)",
                    opt->dtype);
  struct stat st;
  if (stat(path, &st) != 0) return anna_err(err, errlen, ANNA_EIO, "%s: no such file or folder", path);
  if (S_ISDIR(st.st_mode)) return model_load_hf(out, path, err, errlen);
  return gguf_model_load(out, path, err, errlen);
}

void anna_model_free(anna_model *m) {
  model_free(m);
}

int anna_model_vocab(const anna_model *m) {
  return m->cfg.vocab;
}

int anna_model_n_layers(const anna_model *m) {
  return m->cfg.n_layers;
}

const char *anna_model_describe(const anna_model *m) {
  return m->describe;
}

const char *anna_model_path(const anna_model *m) {
  return m->path;
}

int anna_context_create(anna_context **out, anna_model *m, const anna_context_options *opt, char *err,
                        size_t errlen) {
  *out = NULL;
  anna_context_options o = {1, 4096, 512, 0, NULL};
  if (opt) {
    if (opt->n_seq) o.n_seq = opt->n_seq;
    if (opt->n_ctx) o.n_ctx = opt->n_ctx;
    if (opt->n_batch) o.n_batch = opt->n_batch;
    o.n_threads = opt->n_threads;
    o.device = opt->device;
  }
  int cuda;
  int rc = device_pick(o.device, &cuda, err, errlen);
  if (rc) return rc;
  anna_context *c = calloc(1, sizeof *c);
  if (!c) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  c->m = m;
#ifdef ANNA_HAVE_CUDA
  if (cuda) {
    c->on_cuda = 1;
    if ((rc = cuda_backend_create(&c->be, o.n_batch, err, errlen)) ||
        (rc = fwd_state_create(&c->st, m, c->be, o.n_seq, o.n_ctx, o.n_batch, err, errlen))) {
      anna_context_free(c);
      return rc;
    }
    *out = c;
    return 0;
  }
#endif
  if ((rc = threadpool_create(&c->tp, o.n_threads, err, errlen)) ||
      (rc = cpu_backend_create(&c->be, c->tp, fwd_backend_scratch_floats(m, o.n_ctx),
                               ((size_t)o.n_batch + 32) * (size_t)m->max_cols * 4, err, errlen)) ||
      (rc = fwd_state_create(&c->st, m, c->be, o.n_seq, o.n_ctx, o.n_batch, err, errlen))) {
    anna_context_free(c);
    return rc;
  }
  *out = c;
  return 0;
}

void anna_context_free(anna_context *c) {
  if (!c) return;
  fwd_state_free(c->st);
#ifdef ANNA_HAVE_CUDA
  if (c->on_cuda) cuda_backend_free(c->be);
  else
#endif
    cpu_backend_free(c->be);
  threadpool_free(c->tp);
  free(c);
}

int anna_context_decode(anna_context *c, const anna_batch *b, float *out, char *err, size_t errlen) {
  if (!b || !b->tokens || !b->seq || !b->pos) return anna_err(err, errlen, ANNA_EINVAL, "incomplete batch");
  int rc = forward_batch(c->m, c->be, c->st, b, out, err, errlen);
#ifdef ANNA_HAVE_CUDA
  /* Device failures are sticky in the backend; report the first one here. */
  if (!rc && c->on_cuda) rc = cuda_backend_error(c->be, err, errlen);
#endif
  return rc;
}

int32_t anna_context_seq_len(const anna_context *c, int seq) {
  return fwd_state_seq_len(c->st, seq);
}

void anna_context_seq_reset(anna_context *c, int seq) {
  fwd_state_seq_reset(c->st, seq);
}
