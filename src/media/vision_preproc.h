/* vision_preproc.h: the Qwen2-VL / Qwen3.5 image processor (transformers 5.25
 * Qwen2VLImageProcessor, torchvision backend) on decoded RGB8 images.
 *
 * Contract: RGB8 -> smart_resize to multiples of F = patch_size * merge_size within
 * [min_pixels, max_pixels] -> antialiased bicubic resize bit-exact with torch's uint8 CPU
 * kernel (separable, horizontal pass first, int16 fixed-point weights, uint8 rounding between
 * the passes) -> (x - 255*mean) / (255*std) in f32 (transformers fuses rescale into normalize)
 * -> pixel_values [grid_t * grid_h * grid_w, 3 * temporal_patch_size * patch_size^2] in the
 * processor's order: rows by merge block (block row, block column, row in block, column in
 * block), each row (channel, frame, y, x) with the single image repeated over the
 * temporal_patch_size frames. grid_thw = (1, H/patch, W/patch); the language model sees
 * grid_t * grid_h * grid_w / merge_size^2 vision tokens.
 *
 * The config comes from the model's preprocessor_config.json (vision_preproc_config_parse);
 * defaults are the published Qwen3.5 file, not the class defaults (which differ). Everything
 * returns 0 or a negative ANNA_E* code with a message; nothing allocates except
 * vision_preproc_image's output.
 */
#ifndef ANNA_MEDIA_VISION_PREPROC_H
#define ANNA_MEDIA_VISION_PREPROC_H

#include <stddef.h>
#include <stdint.h>

typedef struct vision_preproc_config {
  int32_t patch_size;          /* 16 */
  int32_t merge_size;          /* 2 */
  int32_t temporal_patch_size; /* 2 */
  int64_t min_pixels;          /* size.shortest_edge (or min_pixels): 65536 */
  int64_t max_pixels;          /* size.longest_edge (or max_pixels): 16777216 */
  double rescale_factor;       /* 1/255 */
  float image_mean[3];         /* 0.5 */
  float image_std[3];          /* 0.5 */
  int do_resize, do_rescale, do_normalize, do_convert_rgb; /* all 1 */
} vision_preproc_config;

/* The published Qwen3.5 preprocessor_config.json values (see the fields above). */
void vision_preproc_config_default(vision_preproc_config *c);

/* Overlays the keys of a preprocessor_config.json text (n bytes, need not be NUL-terminated)
 * on *c (call vision_preproc_config_default first). Unknown keys and values of the wrong type
 * or range are ANNA_EINVAL naming the key; informational keys (processor_class,
 * image_processor_type, ...) are accepted and ignored (listed in vision_preproc.c). */
int vision_preproc_config_parse(const char *json, size_t n, vision_preproc_config *c, char *err,
                                size_t errlen);

/* transformers' smart_resize: *out_h, *out_w multiples of factor with the aspect ratio kept as
 * closely as possible and the area within [min_pixels, max_pixels]. ANNA_EINVAL for a zero
 * side or an aspect ratio above 200. */
int vision_preproc_smart_resize(int64_t h, int64_t w, int32_t factor, int64_t min_pixels,
                                int64_t max_pixels, int32_t *out_h, int32_t *out_w, char *err,
                                size_t errlen);

/* Antialiased bicubic resize of packed RGB8 (sw x sh) into dst (dw x dh, caller-owned,
 * dw*dh*3 bytes), bit-exact with torch.nn.functional.interpolate(mode="bicubic",
 * antialias=True) on a uint8 CPU tensor (the path torchvision's resize takes). Allocates
 * temporary buffers. ANNA_EINVAL for a zero size, ANNA_ENOMEM. */
int vision_preproc_resize_rgb8(const uint8_t *src, int32_t sw, int32_t sh, uint8_t *dst,
                               int32_t dw, int32_t dh, char *err, size_t errlen);

/* The processor's output for one image. */
typedef struct vision_pixels {
  float *values;     /* [n_patches, patch_dim], owned: vision_pixels_free */
  int64_t n_patches; /* grid_t * grid_h * grid_w */
  int32_t patch_dim; /* 3 * temporal_patch_size * patch_size^2 (1536) */
  int32_t grid_t, grid_h, grid_w;
  int32_t height, width; /* the resized image */
} vision_pixels;

/* Runs the processor on packed RGB8 (w x h). Caller frees out with vision_pixels_free.
 * ANNA_EINVAL for a bad config, a zero side, aspect > 200, or a size that does not divide
 * into merge blocks when do_resize is off; ANNA_ENOMEM. */
int vision_preproc_image(const vision_preproc_config *c, const uint8_t *rgb, int32_t w,
                         int32_t h, vision_pixels *out, char *err, size_t errlen);

/* Vision tokens the language model sees for this output: n_patches / merge_size^2. */
int64_t vision_pixels_tokens(const vision_pixels *p, const vision_preproc_config *c);

/* Releases p->values and zeroes *p. Accepts NULL. */
void vision_pixels_free(vision_pixels *p);

/* ---- Video (transformers 5.25 Qwen3VLVideoProcessor, torchvision backend) ----
 * Sampled RGB8 frames (media_video_decode) -> smart_resize with the whole-clip budget ->
 * each frame resized exactly as an image (vision_preproc_resize_rgb8) -> the same
 * normalisation -> the frame count padded to a multiple of temporal_patch_size by repeating
 * the last frame -> pixel_values [grid_t * grid_h * grid_w, patch_dim], rows in the image
 * order within each temporal group, groups in time order, each row (channel, frame in the
 * group, y, x). grid = (n_padded / Tp, H / patch, W / patch). */
typedef struct vision_video_config {
  vision_preproc_config pre; /* patching, mean/std, rescale; min_pixels / max_pixels are the
                                video size.shortest_edge / longest_edge: 4096 / 25165824 */
  double fps;                /* sampling rate: 2 (used by media_video_options) */
  int32_t min_frames, max_frames;  /* 4, 768 */
  int cap_pixels_per_frame;        /* 0: the transformers 5.25 default (None -> False) */
  int32_t max_video_tokens;        /* 768: the per-frame cap in merged tokens when capping */
} vision_video_config;

/* The published Qwen3.5 video_preprocessor_config.json values (see the fields above). */
void vision_video_config_default(vision_video_config *c);

/* Overlays the keys of a video_preprocessor_config.json text (n bytes) on *c (call
 * vision_video_config_default first): the image keys as vision_preproc_config_parse (size is
 * the video budget), plus fps, min_frames, max_frames, max_video_tokens, cap_pixels_per_frame
 * (true / false / null = false), do_sample_frames (only true: frames are always sampled),
 * num_frames (only null), return_metadata (no effect: timestamps are always returned) and
 * video_processor_type (informational). Anything else is ANNA_EINVAL naming the key. */
int vision_video_config_parse(const char *json, size_t n, vision_video_config *c, char *err,
                              size_t errlen);

/* Qwen3VL's video smart_resize for n sampled frames of h x w, including the per-frame cap
 * when c->cap_pixels_per_frame: sides below F = patch * merge are first scaled up
 * (int(side * max(F/h, F/w))), aspect > 200 refused, then hb = round(h/F)*F, ... compared as
 * round(n/Tp)*Tp * hb * wb against the budget. ANNA_EINVAL for n < Tp, a zero side or the
 * aspect ratio. */
int vision_video_smart_resize(const vision_video_config *c, int32_t n, int64_t h, int64_t w,
                              int32_t *out_h, int32_t *out_w, char *err, size_t errlen);

/* Runs the video processor on n frames of packed RGB8 (frames[i] at i * w * h * 3). Caller
 * frees out with vision_pixels_free; out->grid_t = ceil(n / Tp). ANNA_EINVAL for n < 1, a bad
 * size or config; ANNA_ENOMEM. */
int vision_preproc_video(const vision_video_config *c, const uint8_t *frames, int32_t n,
                         int32_t w, int32_t h, vision_pixels *out, char *err, size_t errlen);

/* The same processor fed one frame at a time, so that only the resized frames are kept (the
 * decoder's full-size frames are not): init, then add every slot 0..n-1 (any order; the first
 * call fixes n and the source size and allocates n resized frames), then finish, then free.
 * vision_video_builder_frame_cb has the media_video_options.frame_cb signature, so decoding can
 * stream straight into a builder. finish gives the same bytes as vision_preproc_video. */
typedef struct vision_video_builder {
  vision_video_config cfg;
  int32_t n, w, h;   /* sampled frames and their size, fixed by the first add */
  int32_t rw, rh;    /* resized size */
  int32_t added;     /* slots filled */
  uint8_t *frames;   /* [n][rh][rw][3], owned */
  uint8_t *filled;   /* [n], owned */
} vision_video_builder;

void vision_video_builder_init(vision_video_builder *b, const vision_video_config *c);

/* Resizes rgb (w x h, borrowed) into slot. ANNA_EINVAL for a slot out of range or filled twice,
 * a size or count different from the first call, or what vision_video_smart_resize refuses. */
int vision_video_builder_add(vision_video_builder *b, int32_t slot, int32_t n, const uint8_t *rgb,
                             int32_t w, int32_t h, char *err, size_t errlen);

/* media_video_options.frame_cb adapter: user is a vision_video_builder. */
int vision_video_builder_frame_cb(void *user, int32_t slot, int32_t n, const uint8_t *rgb,
                                  int32_t w, int32_t h, char *err, size_t errlen);

/* Normalises and patchifies the n frames (padding as vision_preproc_video) into *out (caller
 * frees with vision_pixels_free). ANNA_EINVAL when a slot is missing. */
int vision_video_builder_finish(vision_video_builder *b, vision_pixels *out, char *err,
                                size_t errlen);

/* Releases the builder's frames. Accepts NULL and initialised-but-unused builders. */
void vision_video_builder_free(vision_video_builder *b);

/* Per temporal group timestamps as Qwen3VLProcessor._calculate_timestamps: indices padded to a
 * multiple of tp with the last one, t = index / fps, group g -> (t[g*tp] + t[g*tp + tp-1]) / 2.
 * out has ceil(n / tp) entries (caller-owned). */
void vision_video_timestamps(const int64_t *indices, int32_t n, double fps, int32_t tp,
                             double *out);

/* The prompt text of one group's timestamp, "<%.1f seconds>", into buf (NUL-terminated).
 * Returns the length, or a negative ANNA_EINVAL when bufsize is too small. */
int vision_video_timestamp_text(double t, char *buf, size_t bufsize);

#endif
