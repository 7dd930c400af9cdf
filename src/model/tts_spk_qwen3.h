/* tts_spk_qwen3.h: the speaker encoder of Qwen3-TTS Base checkpoints (voice cloning): a
 * reference clip at 24 kHz -> its x-vector, the row the talker's prompt takes in place of a
 * preset speaker's embedding (qwen-tts 0.1.1: Qwen3TTSSpeakerEncoder, mel_spectrogram,
 * extract_speaker_embedding, and generate's x_vector_only_mode prompt).
 *
 * Contract:
 *   features: mel_spectrogram(y, n_fft 1024, 128 mels, 24000 Hz, hop 256, win 1024, fmin 0,
 *     fmax 12000): y reflect-padded by 384 on both sides, frames of 1024 every 256 (no
 *     centering) times the periodic Hann window, magnitude sqrt(re^2 + im^2 + 1e-9), librosa's
 *     slaney mel filters (float64, stored float32), log(max(mel, 1e-5)).
 *   encoder (ECAPA-TDNN, speaker_encoder_config): TDNN (conv1d, 'same' reflect padding,
 *     dilation, ReLU) -> SE-Res2Net blocks (1x1 TDNN, Res2Net of `scale` chunks: chunk 0 kept,
 *     chunk i = TDNN(chunk i + out i-1), 1x1 TDNN, squeeze-excitation on the time mean,
 *     residual) -> multi-layer aggregation TDNN over the blocks' outputs concatenated ->
 *     attentive statistics pooling (global mean / std appended, TDNN, tanh, 1x1 conv, softmax
 *     over time, weighted mean and std with eps 1e-12) -> 1x1 conv to enc_dim.
 *   Weights: `speaker_encoder.*` of model.safetensors (f32 / bf16 / f16), kept as f32 copies.
 * Arithmetic: float32 weights and activations, double accumulators and a double FFT (FFTW),
 * so results agree with the float32 reference to its own rounding (checked within 1e-3).
 * Memory: load copies the weights; embed allocates its activations per call (a clip, not a
 * token path) and frees them. Thread-safe for concurrent embed calls (the model is read-only).
 * Needs FFTW3 (ANNA_EUNSUPPORTED naming libfftw3-dev without it).
 */
#ifndef ANNA_MODEL_TTS_SPK_QWEN3_H
#define ANNA_MODEL_TTS_SPK_QWEN3_H

#include <stddef.h>
#include <stdint.h>

#define TTS_SPK_RATE 24000

typedef struct tts_spk tts_spk;

/* Loads the speaker encoder from dir (config.json speaker_encoder_config, model.safetensors
 * speaker_encoder.*). ANNA_ENOTFOUND when the folder has no speaker_encoder tensors (not a
 * Base checkpoint). Caller frees with tts_spk_free. */
int tts_spk_load(tts_spk **out, const char *dir, char *err, size_t errlen);
void tts_spk_free(tts_spk *e);
/* The x-vector width (enc_dim). */
int tts_spk_dim(const tts_spk *e);
/* x[0..n) at 24 kHz in [-1, 1] -> out[enc_dim]. ANNA_EINVAL for a clip under one frame
 * (768 samples after padding to 1024), ANNA_ENOMEM. */
int tts_spk_embed(const tts_spk *e, const float *x, int64_t n, float *out, char *err, size_t errlen);
/* The log-mel features alone: *out [L][128] frame-major (caller frees), *L frames. */
int tts_spk_mel(const float *x, int64_t n, float **out, int64_t *L, char *err, size_t errlen);

#endif
