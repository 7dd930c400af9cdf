/* vision_qwen35.h: the Qwen3.5 vision tower as a model kind ("qwen3_5_vision": pixels ->
 * embeddings). It reads `model.visual.*` and `vision_config` of an HF folder whose model_type
 * is qwen3_5 or qwen3_5_moe (shared/docs/MODELS.md "Qwen3.5 vision tower") and maps the
 * processor's pixel_values [n_patches, 3*Tp*P*P] with their grids (t, h, w) to the merger's
 * rows [sum t*h*w / M^2, out_hidden], in input order: the rows that replace the image / video
 * pad tokens' embeddings. Several inputs run in one call (attention never crosses an input, nor
 * a temporal slice of a video).
 *
 * Sources: an HF folder (model.visual.*), or a llama.cpp mmproj GGUF (src->is_gguf; projector
 * type qwen3vl_merger as convert_hf_to_gguf.py --mmproj writes Qwen3.5 / Qwen3-VL: v.* / mm.*
 * names, the Conv3d split per temporal slot, hyperparameters under clip.vision.*; deepstack
 * layers and other projector types are refused naming them).
 *
 * Selection: the text decoder's probe also accepts these folders and comes first in the
 * registry, so model_kind_find never returns this kind; callers pick it by name
 * (model_kind_by_name("qwen3_5_vision")) and load the same source. Its probe is still exact
 * (qwen3_5 / qwen3_5_moe), and load refuses a folder without a vision tower.
 *
 * State: n_batch of model_state_params is the most patches one run takes (0: 4096, a
 * 1024x1024 image); n_ctx and the cache fields are ignored. Buffers are allocated at
 * state_create, run allocates nothing. Backends: every op it uses must be present (the encoder
 * ops of ops.h are CPU-only today): state_create refuses others with ANNA_EUNSUPPORTED. The
 * impl is a vision_model (opaque), the state a vision_state; the table is static.
 */
#ifndef ANNA_MODEL_VISION_QWEN35_H
#define ANNA_MODEL_VISION_QWEN35_H

#include "model/kind.h"

extern const model_kind vision_qwen35_kind;

/* The text model's 3-axis rope positions for a prompt with vision runs (transformers'
 * get_rope_index; MODELS.md "mRoPE for the text model"). A vision run is a maximal run of
 * tokens with is_vision[i] != 0 (an image's pads, or one temporal group of a video's); run r
 * has the patch grid run_hw[2r] x run_hw[2r+1] (h, w), so gh x gw = h/merge x w/merge tokens.
 * With p the next text position: a text token gets (p, p, p) and p += 1; vision token (r, c) of
 * a run gets (p, p + r, p + c), then p += max(gh, gw). pos3 [3 * n]: the T row, then H, then
 * W. *next receives p after the last token: decode token i after the prompt is at next + i on
 * every axis (transformers' rope_delta is next - n). ANNA_EINVAL (nothing written to *next)
 * when the runs do not match is_vision (count, or a run's length != gh * gw). */
int vision_qwen35_rope_positions(const uint8_t *is_vision, int32_t n, const int32_t *run_hw, int n_runs, int merge,
                                 int32_t *pos3, int32_t *next, char *err, size_t errlen);

#endif
