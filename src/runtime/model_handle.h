/* model_handle.h: what the public opaque anna_model is: a loaded model of some kind
 * (model/kind.h) plus what the runtime resolved at load. The runtime reaches the model
 * only through kind's table; impl is the kind's own struct (a text_model for the text
 * decoder), owned by the handle and freed with kind->free by anna_model_free. Immutable
 * after anna_model_load, so several contexts may share it.
 */
#ifndef ANNA_RUNTIME_MODEL_HANDLE_H
#define ANNA_RUNTIME_MODEL_HANDLE_H

#include "anna/anna.h"
#include "base/tuning.h"
#include "model/kind.h"

struct anna_model {
  const model_kind *kind; /* static table */
  void *impl;             /* owned: kind->free */
  char *path;             /* owned: the folder or file it was loaded from */
  model_desc desc;        /* kind->describe(impl), read once (strings borrowed from impl) */
  int compute_bf16;   /* anna_model_options.dtype "bf16": contexts on cuda round GEMM inputs to bf16
                       */
  anna_tuning tuning; /* resolved at load (ANNA_TUNING, then anna_model_options.tuning) */
};

#endif
