/* codec_qwen3_tts.h: the Qwen3-TTS 12 Hz speech-tokenizer decoder as a model kind
 * ("qwen3_tts_codec"): codes [frames, 16] -> 24 kHz PCM [frames * 1920], with exact streaming.
 *
 * Source: a `speech_tokenizer/` folder (config.json model_type "qwen3_tts_tokenizer_12hz" +
 * model.safetensors), or a Qwen3-TTS model folder (model_type "qwen3_tts") holding one. Only
 * `decoder.*` tensors are read (the encoder is for voice-clone reference codes, another job);
 * of config.json only decoder_config and decode_upsample_rate are read, the rest (encoder_config,
 * sample rates other than the output's) is a documented no-op. Semantics are those of qwen-tts
 * 0.1.1's Qwen3TTSTokenizerV2Decoder.forward (docs MODELS.md, "Speech tokenizer"): codebooks
 * embedding_sum / max(cluster_usage, 1e-5) (converted to f32 at load), the split quantizer's
 * two output projections, pre_conv, the sliding-window pre-transformer, two ConvTranspose +
 * ConvNeXt upsample stages, the SnakeBeta decoder blocks, clamp to [-1, 1].
 *
 * Streaming: a state holds n_seq independent streams (state params n_seq; n_batch = the most
 * frames one internal step decodes, default 16; 0 = default). Every conv keeps its left
 * context ((kw - 1) * dilation input rows; one row for the block ConvTransposes) and every
 * transformer layer the keys/values of its last window - 1 frames, so a run of frames
 * continues the stream where the previous run stopped: decoding a stream in pieces of any size
 * gives the one-pass samples (equal within float rounding of batch-size dependent matmul /
 * attention kernels: measured max |diff| in tests/engine/test_codec.c). Runs longer than
 * n_batch are decoded in n_batch steps internally; nothing is allocated per run. The
 * reference's own decode() instead cuts audio into 300-frame chunks with 25 recomputed context
 * frames; that lossy chunking is not reproduced (one pass is the exact answer).
 * seq ops: seq_len (frames decoded so far on that stream) and reset (a new utterance); the
 * other entries are NULL (no sequence copy / rewind for a codec).
 *
 * Backends: needs the waveform decoder ops of ops.h (conv1d, conv1d_dw, conv_transpose1d,
 * snake_beta, add_scaled, clamp; layer_norm and gelu of the encoder ops) plus matmul, embed, rmsnorm,
 * rope, attention, act_mul, add, copy_rows; a backend lacking one (CUDA today) is refused at
 * state creation with ANNA_EUNSUPPORTED naming the op.
 *
 * Ownership: the loaded model owns its safetensors mapping and the f32 conversions; states
 * own their backend memory (freed by state_free).
 */
#ifndef ANNA_MODEL_CODEC_QWEN3_TTS_H
#define ANNA_MODEL_CODEC_QWEN3_TTS_H

#include "model/kind.h"

extern const model_kind codec_qwen3_tts_kind;

#endif
