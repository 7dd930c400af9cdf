/* tts_qwen3.h: the Qwen3-TTS talker and its code predictor (kind "qwen3_tts"): text ids ->
 * codec frames (16 codes each) that the speech-tokenizer decoder (codec_qwen3_tts.h) turns
 * into 24 kHz PCM.
 *
 * Source: a Qwen3-TTS folder (config.json model_type "qwen3_tts" with talker_config and its
 * code_predictor_config, model.safetensors with `talker.*`; docs MODELS.md "Qwen3-TTS").
 * Semantics are qwen-tts 0.1.1's Qwen3TTSForConditionalGeneration.generate for the
 * CustomVoice checkpoints in non-streaming text mode (the wrapper's default for them):
 *   prefill = T(role) | codec prefix (think/nothink, language, speaker, pad) + tts_pad..tts_bos
 *             | T(body[i]) + emb(pad) | T(tts_eos) + emb(pad) | T(tts_pad) + emb(bos),
 *   per frame: the talker's last hidden h -> codec_head -> c0; the code predictor with a
 *   fresh cache over [proj(h), proj(emb(c0))] -> c1, then proj(cp_emb[k-2](c_{k-1})) -> c_k
 *   up to c15; next talker input = emb(c0) + sum cp_emb[k-1](c_k) + T(tts_pad).
 * T(ids) = text_projection(text_embedding(ids)) (fc1 + bias, SiLU, fc2 + bias); proj is
 * small_to_mtp_projection (identity when the predictor is as wide as the talker).
 * Selection: talker c0 with repetition_penalty over earlier c0, ids [vocab-1024, vocab) except
 * codec eos suppressed, eos suppressed for the first min_new_tokens (2) frames; greedy or
 * seeded top-k / top-p / temperature sampling (generation_config.json, the wrapper's fallbacks
 * when absent); the predictor the same without penalty or suppression.
 * Instructions (VoiceDesign checkpoints, 1.7B CustomVoice): T(instruct ids) rows come first,
 * before the role rows, as generate puts them (the wrapper tokenizes
 * `<|im_start|>user\n{instruct}<|im_end|>\n`). A VoiceDesign folder (tts_model_type
 * "voice_design") has no preset speakers: a speaker is refused. A 0.6B CustomVoice
 * (tts_model_size "0b6") refuses instructions (the wrapper silently drops them).
 * Not done (refused or documented no-ops): voice cloning (Base: speaker encoder, ICL),
 * streaming text mode; a Base folder is refused at load. The talker's mrope_section / interleaved keys are a
 * no-op: the wrapper gives all three axes the same positions, which is 1-D RoPE.
 *
 * Both decoders run through the text decoder's forward (forward_batch_mm with every row an
 * embedding row, fwd_mm.hidden for the final-norm hidden state); the code predictor gets a
 * fresh sequence per frame. The kind table's run is not used for generation (its io set has
 * no codes output): callers use tts_qwen3_generate; run answers ANNA_EUNSUPPORTED.
 *
 * Ownership: a loaded model owns its mappings; a state owns its backend and host buffers and
 * borrows the model and the backend (both must outlive it). generate allocates nothing.
 */
#ifndef ANNA_MODEL_TTS_QWEN3_H
#define ANNA_MODEL_TTS_QWEN3_H

#include "model/kind.h"

#include <stdint.h>

extern const model_kind tts_qwen3_kind;

typedef struct tts_qwen3 tts_qwen3;
typedef struct tts_qwen3_state tts_qwen3_state;

#define TTS_QWEN3_GROUPS 16

typedef struct tts_qwen3_request {
  /* ids of `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n` (borrowed) */
  const int32_t *ids;
  int n_ids;
  const char *speaker;  /* a key of talker_config.spk_id (case-insensitive); NULL or "": none */
  const char *language; /* a key of codec_language_id, or NULL / "auto" */
  int max_frames;       /* >= 1 */
  int greedy;           /* 1: argmax for talker and predictor; 0: sampling (generation_config) */
  uint64_t seed;        /* sampling only */
  /* Optional (NULL: none): called with each frame as soon as its 16 codes are chosen (f is
   * its index; codes borrowed for the call), so a streaming decoder can start before the
   * utterance ends. A nonzero return stops generation there: generate returns 0 with the
   * frames so far (this one included). */
  int (*on_frame)(void *user, const int32_t *codes, int f);
  void *user;
  /* ids of `<|im_start|>user\n{instruct}<|im_end|>\n` (borrowed; NULL / 0: no instruction) */
  const int32_t *instruct_ids;
  int n_instruct_ids;
  /* a Base checkpoint's voice clone (x_vector_only_mode): the speaker encoder's x-vector
   * [hidden] in place of a preset speaker's row (borrowed; NULL: none) */
  const float *speaker_embed;
} tts_qwen3_request;

/* Caller frees with tts_qwen3_free. */
int tts_qwen3_load(tts_qwen3 **out, const char *dir, char *err, size_t errlen);
void tts_qwen3_free(tts_qwen3 *m);
/* The talker's codec vocabulary (logits row width) and the talker's hidden size. */
int tts_qwen3_vocab(const tts_qwen3 *m);
/* Preset speaker i (config spk_id order, lower case; borrowed), NULL past the last. */
const char *tts_qwen3_speaker(const tts_qwen3 *m, int i);
/* 1 when the checkpoint takes instructions (VoiceDesign, or a CustomVoice not of size "0b6"). */
int tts_qwen3_takes_instructions(const tts_qwen3 *m);
/* 1 for a Base checkpoint (voice cloning: requests carry speaker_embed). */
int tts_qwen3_is_base(const tts_qwen3 *m);
/* The shape a backend sizes its scratch for (both decoders), contexts of n_ctx positions. */
void tts_qwen3_backend_shape(const tts_qwen3 *m, int n_ctx, ops_model_shape *out);

/* One utterance at a time: n_ctx bounds prefill rows + frames. Caller frees with
 * tts_qwen3_state_free. */
int tts_qwen3_state_create(tts_qwen3_state **out, const tts_qwen3 *m, ops_backend *be, int n_ctx, char *err,
                           size_t errlen);
void tts_qwen3_state_free(tts_qwen3_state *s);

/* Prefill rows the request needs (or a negative ANNA_E* with the message: unknown speaker
 * or language, ids that are not the assistant wrapping of a non-empty text). */
int tts_qwen3_prefill_len(const tts_qwen3 *m, const tts_qwen3_request *rq, char *err, size_t errlen);

/* Generates up to rq->max_frames frames into codes[max_frames * 16] (frame-major), stopping
 * before a frame whose c0 is codec eos; *n_frames receives the count. prefill_logits (NULL:
 * not wanted) receives [prefill_len * vocab]: the codec_head logits of every prefill row. */
int tts_qwen3_generate(const tts_qwen3 *m, tts_qwen3_state *s, const tts_qwen3_request *rq, int32_t *codes,
                       int *n_frames, float *prefill_logits, char *err, size_t errlen);

#endif
