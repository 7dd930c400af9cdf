/* video.h: untrusted video bytes (MP4 / MOV, WebM, MKV) -> the RGB8 frames the Qwen3-VL /
 * Qwen3.5 video processor samples, with their indices and timestamps.
 *
 * Contract: media_video_decode reads one container from a memory buffer through FFmpeg
 * (libavformat over a custom AVIOContext, libavcodec, libswscale) and reproduces what
 * transformers 5.25 does with a video file path: Qwen3VLVideoProcessor.fetch_videos decodes
 * with torchcodec (seek_mode "exact"), so
 *   - total_frames is the packet count of the best video stream (torchcodec's scan), fps is
 *     total_frames / (max(pts + duration) - min(pts)) in stream time base seconds (the header
 *     r_frame_rate when that span is 0; 24 when neither exists, as the processor assumes);
 *   - n = int(total / fps * sample_fps) clamped to [min_frames, max_frames] and <= total,
 *     indices = round-half-even(linspace(0, total - 1, n)) (numpy's arithmetic);
 *   - frame i is the i-th frame in presentation order, converted to RGB24 by libswscale the
 *     way torchcodec's CPU path does: the frame's own colour matrix (sws_getCoefficients of
 *     frame->colorspace, BT.601 when unspecified) and range (limited unless the frame says
 *     full), swscale flags 0, i.e. bicubic (torchcodec's swscale path for widths that are
 *     multiples of 32; its filtergraph path for other widths auto-inserts a scale filter with
 *     the same default in FFmpeg 5.1); with the same libswscale build the bytes are identical.
 * Only the mov/mp4 and matroska/webm demuxers are allowed and the demuxer may open no other
 * resource (no external references, no network): the buffer is all it reads.
 *
 * Limits are checked before the large allocations: bytes before opening, width * height on
 * the stream header, duration after the packet scan (no frames are decoded before it), and
 * the sampled frame count before the RGB buffer is allocated. A stream whose packets span
 * less than the duration its header declares (minus two frames and 0.1 s) is refused as
 * truncated, where torchcodec would sample the prefix. Corrupt, truncated, not-a-video
 * and audio-only input are ANNA_EINVAL naming the problem; a build without FFmpeg returns
 * ANNA_EUNSUPPORTED naming the packages. Rotated streams (a display matrix other than 0
 * degrees) are rotated after the conversion as torchcodec does (its filtergraph: the angle
 * rounded to a quarter turn, 90 = counter-clockwise; the frames then have the rotated size).
 * Every error path frees what it allocated. Thread-safe (no global state is changed; FFmpeg
 * may log decoder warnings to stderr through its default logger).
 */
#ifndef ANNA_MEDIA_VIDEO_H
#define ANNA_MEDIA_VIDEO_H

#include <stddef.h>
#include <stdint.h>

typedef struct media_video_options {
  /* Sampling: the processor's video_preprocessor_config.json values. */
  double sample_fps;  /* fps: 2 */
  int32_t min_frames; /* 4 */
  int32_t max_frames; /* 768 */
  /* Refusal limits, 0 = none: each refusal is ANNA_EINVAL naming the limit. */
  int64_t max_bytes;     /* size of the encoded buffer */
  int64_t max_pixels;    /* width * height of one frame */
  double max_duration_s; /* stream duration after the scan */
  int32_t limit_frames;  /* sampled frames (before padding to the temporal patch) */
  int32_t threads;       /* decoder threads; 0 = FFmpeg decides (torchcodec's choice) */
  /* Streaming: when frame_cb is set, out->rgb stays NULL and each sampled slot is handed over
   * as it is decoded, in slot order (a repeated index is handed over once per slot), from one
   * scratch frame (valid during the call only), so memory does not grow with n * w * h: the
   * caller resizes as it goes (vision_video_builder). A nonzero return stops decoding and is
   * returned by media_video_decode (the callback writes its own message into err). */
  int (*frame_cb)(void *user, int32_t slot, int32_t n_frames, const uint8_t *rgb, int32_t w,
                  int32_t h, char *err, size_t errlen);
  void *frame_user;
} media_video_options;

/* sample_fps 2, min_frames 4, max_frames 768, no limits, threads 0. */
void media_video_options_default(media_video_options *o);

/* A decoded, sampled video. */
typedef struct media_video {
  int32_t width, height; /* every sampled frame has this size (after the stream's rotation) */
  int64_t total_frames;  /* frames in the stream (packets of the video stream) */
  double fps;            /* average frame rate used for sampling and timestamps */
  double duration_s;     /* the scanned stream span, seconds */
  char codec[32];        /* decoder name, e.g. "h264", "vp9" */
  int32_t n_frames;      /* sampled frames */
  int64_t *indices;      /* [n_frames] frame indices, owned */
  double *times;         /* [n_frames] indices[i] / fps, seconds, owned */
  uint8_t *rgb;          /* [n_frames][height][width][3], owned; NULL with frame_cb */
} media_video;

/* 1 when this build has FFmpeg (libavformat, libavcodec, libswscale, libavutil), else 0. */
int media_video_available(void);

/* The processor's frame count for total frames at fps (see the contract); 0 when total <= 0. */
int32_t media_video_sample_count(int64_t total, double fps, const media_video_options *o);

/* indices[0..n) = round-half-even(linspace(0, total - 1, n)) as numpy computes it. */
void media_video_sample_indices(int64_t total, int32_t n, int64_t *indices);

/* Decodes and samples data[0..n) into *out (zeroed first; on error it holds nothing to free).
 * o = NULL uses media_video_options_default. Returns 0, ANNA_EINVAL (bad data, a limit
 * exceeded), ANNA_EUNSUPPORTED (no FFmpeg in this build, no decoder for the codec, a
 * pixel format libswscale cannot convert, a rotation that is not a quarter turn) or
 * ANNA_ENOMEM. Caller frees with media_video_free. */
int media_video_decode(const uint8_t *data, size_t n, const media_video_options *o,
                       media_video *out, char *err, size_t errlen);

/* Releases what *v owns and zeroes it. Accepts NULL and zeroed videos. */
void media_video_free(media_video *v);

#endif
