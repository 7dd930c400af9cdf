/* image.h: untrusted image bytes (JPEG, PNG, WebP, GIF first frame) -> RGB8.
 *
 * Contract: media_image_decode reads one encoded image from a memory buffer and returns its
 * pixels as interleaved 8-bit RGB, top row first, exactly as the Hugging Face image processors
 * see it: they open the file with PIL and call transformers' convert_to_rgb, so
 *   - transparency (an alpha channel, a PNG tRNS colour or palette entry, a GIF transparent
 *     index) is composited onto opaque white with PIL's Image.alpha_composite integer rounding;
 *   - 16-bit PNG samples keep their high byte (PIL's ";16B" raw modes), except 16-bit gray
 *     without alpha, which PIL opens as "I;16" and clips to 255 when converting to RGB;
 *   - gray, low-bit-depth and palette images are expanded to RGB;
 *   - no gamma, ICC profile or EXIF orientation is applied (PIL's Image.open applies none).
 * JPEG goes through libjpeg-turbo with PIL's defaults (islow IDCT, fancy upsampling), so it
 * matches PIL up to the IDCT of the libjpeg build PIL ships.
 *
 * Limits are checked on the header before any pixel buffer is allocated: a width or height of
 * 0, or width * height above the caller's max_pixels, is refused cheaply. Corrupt, truncated
 * and unknown data is ANNA_EINVAL with a message naming the format and the problem; a format
 * whose library was absent at build time is ANNA_EUNSUPPORTED naming the missing package.
 * Decoder errors never exit: libjpeg and libpng errors longjmp back here, and every error path
 * frees what it allocated. Thread-safe (no global state).
 */
#ifndef ANNA_MEDIA_IMAGE_H
#define ANNA_MEDIA_IMAGE_H

#include <stddef.h>
#include <stdint.h>

typedef enum media_image_format {
  MEDIA_IMAGE_UNKNOWN = 0,
  MEDIA_IMAGE_JPEG,
  MEDIA_IMAGE_PNG,
  MEDIA_IMAGE_WEBP,
  MEDIA_IMAGE_GIF,
} media_image_format;

/* A decoded image: width * height pixels of 3 bytes (R, G, B), rows packed, top row first. */
typedef struct media_image {
  int32_t width, height;
  media_image_format format; /* what the bytes were */
  uint8_t *rgb;              /* owned: media_image_free releases it */
} media_image;

/* The format the first bytes announce (magic numbers only; nothing is validated). */
media_image_format media_image_sniff(const uint8_t *data, size_t n);

/* "JPEG", "PNG", "WebP", "GIF" or "unknown". */
const char *media_image_format_name(media_image_format f);

/* 1 when this build can decode f (its library was found at configure time), else 0. */
int media_image_format_available(media_image_format f);

/* Decodes data[0..n) into *out (zeroed first; on error it holds nothing to free).
 * max_pixels > 0 bounds width * height (checked on the header, before allocating).
 * Returns 0, ANNA_EINVAL (bad or unknown data, a limit exceeded), ANNA_EUNSUPPORTED (format not
 * compiled in, CMYK JPEG, animated WebP) or ANNA_ENOMEM. Caller frees with media_image_free. */
int media_image_decode(const uint8_t *data, size_t n, int64_t max_pixels, media_image *out,
                       char *err, size_t errlen);

/* Releases out->rgb and zeroes *img. Accepts NULL and zeroed images. */
void media_image_free(media_image *img);

/* PIL's Image.alpha_composite of one RGBA pixel over opaque white, colour channel v with alpha
 * a (exposed for the test that checks it against PIL's table). */
static inline uint8_t media_image_over_white(uint32_t v, uint32_t a) {
  /* PIL: coef1 = a*255*255*128 / (255*255) = a*128, 7 fractional bits, division by 255 by
   * the shift trick, rounded. */
  uint32_t c1 = a * 128u, c2 = 255u * 128u - c1;
  uint32_t t = v * c1 + 255u * c2 + (0x80u << 7);
  return (uint8_t)((((t >> 8) + t) >> 8) >> 7);
}

#endif
