/* asr_front.h: the Qwen3-ASR audio encoder's convolutional front, CPU reference (f32).
 *
 * Contract (qwen-asr 0.0.6 Qwen3ASRAudioEncoder.forward up to the first encoder layer; see
 * shared/docs/MODELS.md "Qwen3-ASR", Audio encoder): the [n_mels, L] log-mel (mel.h) is cut
 * along time into chunks of C = 2 * n_window frames (100 in the released models), the last one
 * the remainder. Every chunk is an image [1, n_mels, T] zero-padded to T = the longest chunk:
 * C when L >= C, else L itself (the reference pads to the batch's longest chunk, so a clip
 * shorter than one chunk is not padded, and the padding changes the conv outputs next to a
 * tail's end). Then per chunk:
 *   conv2d1 [h, 1, 3, 3], conv2d2 and conv2d3 [h, h, 3, 3], each stride 2, padding 1, bias,
 *   exact GELU (erf) after each -> [h, f3, t3] with f3 = ceil(ceil(ceil(n_mels/2)/2)/2);
 *   conv_out [d, h * f3] (no bias) on each time step's (channel, frequency) vector, channel
 *   major; plus the sinusoid row p of the step (p = 0.. restarts in every chunk):
 *   [sin(p g_i), cos(p g_i)], g_i = exp(-ln(1e4) i / (d/2 - 1)), i < d/2, in float32 as torch;
 *   keep the first ceil(ceil(ceil(c/2)/2)/2) steps of a chunk of c valid frames.
 * The output is [N, d] rows in time order, N = media_asr_front_tokens(L, C).
 *
 * This is the reference the backend ops (and the encoder's tests) are checked against: plain
 * loops, one thread, no allocation (the caller passes scratch). Weights are PyTorch's layouts,
 * f32, owned by the caller.
 */
#ifndef ANNA_MEDIA_ASR_FRONT_H
#define ANNA_MEDIA_ASR_FRONT_H

#include <stddef.h>
#include <stdint.h>

typedef struct media_asr_front {
  int n_mels;                     /* num_mel_bins (128) */
  int hidden;                     /* downsample_hidden_size (480) */
  int d_model;                    /* audio d_model (896 / 1024); even, >= 4 */
  int n_window;                   /* chunk = 2 * n_window frames (50 -> 100) */
  const float *conv1_w, *conv1_b; /* [hidden, 1, 3, 3], [hidden] */
  const float *conv2_w, *conv2_b; /* [hidden, hidden, 3, 3], [hidden] */
  const float *conv3_w, *conv3_b; /* [hidden, hidden, 3, 3], [hidden] */
  const float *conv_out_w;        /* [d_model, hidden * f3] */
} media_asr_front;

/* Steps a chunk of c valid frames keeps: three stride-2 halvings, rounded up. */
int64_t media_asr_front_chunk_tokens(int64_t c);

/* Tokens for L frames with chunks of `chunk` frames: full chunks * tokens(chunk) + tokens(tail). */
int64_t media_asr_front_tokens(int64_t L, int chunk);

/* Floats of scratch media_asr_front_run needs for L frames. */
size_t media_asr_front_scratch_floats(const media_asr_front *w, int64_t L);

/* out[N, d_model] for mel [n_mels, L] (mel-major, as mel.h writes it). scratch holds
 * media_asr_front_scratch_floats(w, L) floats. Returns 0 or ANNA_EINVAL (bad shapes, L < 1,
 * NULL weights). */
int media_asr_front_run(const media_asr_front *w, const float *mel, int64_t L, float *out,
                        float *scratch, char *err, size_t errlen);

#endif
