/* kind.c: the registry of compiled model kinds and the probe that picks one for a path. */
#include "model/kind.h"

#include "base/error.h"
#include "formats/gguf.h"
#include "model/codec_qwen3_tts.h"
#include "model/audio_qwen3_asr.h"
#include "model/config.h"
#include "model/text_decoder.h"
#include "model/tts_qwen3.h"
#include "model/vision_qwen35.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* Probe order: the first kind that accepts a source loads it (a Qwen3.5 folder: the text
 * decoder; its vision tower is picked by name; likewise Qwen3-ASR's audio tower; a Qwen3-TTS
 * folder holding speech_tokenizer/: the codec, its talker by name "qwen3_tts"). */
static const model_kind *const k_kinds[] = {&text_decoder_kind, &vision_qwen35_kind, &codec_qwen3_tts_kind,
                                            &audio_qwen3_asr_kind, &tts_qwen3_kind};

static const char *const k_io_names[MODEL_IO_COUNT] = {"tokens", "embeddings", "logits", "hidden",
                                                       "pixels", "audio",      "codes",  "pcm"};

const char *model_io_name(int io) {
  return io >= 0 && io < MODEL_IO_COUNT ? k_io_names[io] : "?";
}

int model_kind_count(void) {
  return (int)(sizeof k_kinds / sizeof k_kinds[0]);
}

const model_kind *model_kind_get(int i) {
  return i >= 0 && i < model_kind_count() ? k_kinds[i] : NULL;
}

const model_kind *model_kind_by_name(const char *name) {
  for (int i = 0; name && i < model_kind_count(); i++)
    if (!strcmp(k_kinds[i]->name, name)) return k_kinds[i];
  return NULL;
}

/* The GGUF header's general.architecture (the mapping is closed again: a kind's load opens
 * the file itself). */
static int read_gguf(model_source *src, char *err, size_t errlen) {
  gguf_file *f = NULL;
  int rc = gguf_open(&f, src->path, err, errlen);
  if (rc) return rc;
  const char *arch = NULL;
  if (!(rc = gguf_get_str(f, "general.architecture", &arch, err, errlen)))
    snprintf(src->gguf_arch, sizeof src->gguf_arch, "%s", arch);
  gguf_close(f);
  return rc;
}

int model_kind_find(const char *path, model_source *src, const model_kind **out, char *err,
                    size_t errlen) {
  *out = NULL;
  memset(src, 0, sizeof *src);
  src->path = path;
  struct stat st;
  if (stat(path, &st) != 0)
    return anna_err(err, errlen, ANNA_EIO, "%s: no such file or folder", path);
  src->is_gguf = !S_ISDIR(st.st_mode);
  char cfg[PATH_MAX];
  int rc;
  if (src->is_gguf) {
    rc = read_gguf(src, err, errlen);
  } else {
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    rc = config_probe_hf(cfg, src->model_type, sizeof src->model_type, src->architecture,
                         sizeof src->architecture, err, errlen);
  }
  if (rc) return rc;
  for (int i = 0; i < model_kind_count(); i++)
    if (k_kinds[i]->probe(src)) {
      *out = k_kinds[i];
      return 0;
    }
  if (src->is_gguf)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: GGUF architecture '%s' is not supported",
                    path, src->gguf_arch);
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "%s: model_type '%s' is not supported", cfg,
                  src->model_type);
}
