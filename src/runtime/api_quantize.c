/* api_quantize.c: anna_quantize_model (anna.h) over model/quantize.h. */
#include "anna/anna.h"

#include "base/error.h"
#include "model/quantize.h"

#include <stdio.h>

int anna_quantize_model(const char *model_dir, const char *type, const char *out_path, char *path_out,
                        size_t path_len, int *built, char *err, size_t errlen) {
  if (built) *built = 0;
  if (!model_dir) return anna_err(err, errlen, ANNA_EINVAL, "quantize: no model folder");
  if (!model_quantize_type_known(type))
    return anna_err(err, errlen, ANNA_EINVAL, "quantize type '%s' is not supported (have: int4, bf16)", type ? type : "(null)");
  if (out_path) {
    int rc = model_quantize_hf(model_dir, out_path, type, NULL, err, errlen);
    if (rc) return rc;
    if (built) *built = 1;
    if (path_out && path_len) snprintf(path_out, path_len, "%s", out_path);
    return 0;
  }
  char p[4096];
  int rc = model_quantize_cached(model_dir, type, p, sizeof p, built, err, errlen);
  if (!rc && path_out && path_len) snprintf(path_out, path_len, "%s", p);
  return rc;
}
