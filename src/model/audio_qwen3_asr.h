/* audio_qwen3_asr.h: the Qwen3-ASR audio encoder as a model kind ("qwen3_asr_audio": log-mel
 * features -> embeddings). It reads `thinker.audio_tower.*` and thinker_config.audio_config of
 * an HF folder whose model_type is qwen3_asr (qwen-asr's original layout; shared/docs/MODELS.md
 * "Qwen3-ASR") and maps one clip's features [n_mels, L] (media/mel.h) to the projector's rows
 * [N, output_dim], N = media_asr_front_tokens(L, 2 * n_window): the rows that replace the
 * <|audio_pad|> tokens' embeddings in the thinker's prompt. One clip per run, as the reference
 * encodes clips one at a time (batching would pad a short clip's tail chunk and change it).
 *
 * Selection: the text decoder's probe also accepts qwen3_asr folders (the thinker's decoder) and
 * comes first in the registry, so callers pick this kind by name
 * (model_kind_by_name("qwen3_asr_audio")) and load the same folder. load refuses a folder without
 * an audio tower (no thinker_config.audio_config, or missing tensors).
 *
 * State: n_batch of model_state_params is the most mel frames one run takes (0: 3000, 30 s);
 * n_ctx and the cache fields are ignored. Buffers are allocated at state_create (the conv front
 * runs in groups of at most 4 one-second chunks to bound its patch buffer); run allocates
 * nothing. Backends: every op used must be present (im2col_3x3s2 and the encoder ops are CPU-only
 * today): state_create refuses others with ANNA_EUNSUPPORTED. Errors: 0 / negative ANNA_E*.
 */
#ifndef ANNA_MODEL_AUDIO_QWEN3_ASR_H
#define ANNA_MODEL_AUDIO_QWEN3_ASR_H

#include "model/kind.h"

extern const model_kind audio_qwen3_asr_kind;

/* The thinker's special ids, from config.json (thinker_config; defaults are the released ids). */
typedef struct audio_qwen3_asr_ids {
  int32_t audio_pad, audio_start, audio_end;
} audio_qwen3_asr_ids;

/* Rows the encoder makes for n_frames mel frames (0 for n_frames < 1). impl: a loaded
 * qwen3_asr_audio model (borrowed). */
int64_t audio_qwen3_asr_tokens(const void *impl, int64_t n_frames);
/* The model's special ids (impl borrowed). */
void audio_qwen3_asr_get_ids(const void *impl, audio_qwen3_asr_ids *out);

#endif
