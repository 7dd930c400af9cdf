/* image.c: JPEG / PNG / WebP / GIF decoding into RGB8 with PIL's conversions (see image.h). */
#include "media/image.h"

#include "base/error.h"

#include <limits.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ANNA_HAVE_LIBJPEG
#include <jpeglib.h>
#include <jerror.h>
#endif
#ifdef ANNA_HAVE_LIBPNG
#include <png.h>
#endif
#ifdef ANNA_HAVE_LIBWEBP
#include <webp/decode.h>
#endif
#ifdef ANNA_HAVE_LIBGIF
#include <gif_lib.h>
#endif

media_image_format media_image_sniff(const uint8_t *d, size_t n) {
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return MEDIA_IMAGE_JPEG;
  if (n >= 8 && !memcmp(d, "\x89PNG\r\n\x1a\n", 8)) return MEDIA_IMAGE_PNG;
  if (n >= 12 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WEBP", 4)) return MEDIA_IMAGE_WEBP;
  if (n >= 6 && (!memcmp(d, "GIF87a", 6) || !memcmp(d, "GIF89a", 6))) return MEDIA_IMAGE_GIF;
  return MEDIA_IMAGE_UNKNOWN;
}

const char *media_image_format_name(media_image_format f) {
  switch (f) {
  case MEDIA_IMAGE_JPEG: return "JPEG";
  case MEDIA_IMAGE_PNG: return "PNG";
  case MEDIA_IMAGE_WEBP: return "WebP";
  case MEDIA_IMAGE_GIF: return "GIF";
  default: return "unknown";
  }
}

int media_image_format_available(media_image_format f) {
  switch (f) {
#ifdef ANNA_HAVE_LIBJPEG
  case MEDIA_IMAGE_JPEG: return 1;
#endif
#ifdef ANNA_HAVE_LIBPNG
  case MEDIA_IMAGE_PNG: return 1;
#endif
#ifdef ANNA_HAVE_LIBWEBP
  case MEDIA_IMAGE_WEBP: return 1;
#endif
#ifdef ANNA_HAVE_LIBGIF
  case MEDIA_IMAGE_GIF: return 1;
#endif
  default: return 0;
  }
}

void media_image_free(media_image *img) {
  if (!img) return;
  free(img->rgb);
  memset(img, 0, sizeof *img);
}

/* The header check every decoder runs before allocating pixels. */
__attribute__((unused)) static int check_dims(const char *fmt, int64_t w, int64_t h, int64_t max_pixels, char *err,
                      size_t errlen) {
  if (w <= 0 || h <= 0)
    return anna_err(err, errlen, ANNA_EINVAL, "%s image has a zero size (%lld x %lld)", fmt,
                    (long long)w, (long long)h);
  if (w > INT32_MAX || h > INT32_MAX || (max_pixels > 0 && w * h > max_pixels))
    return anna_err(err, errlen, ANNA_EINVAL,
                    "%s image is %lld x %lld = %lld pixels, over the limit of %lld pixels", fmt,
                    (long long)w, (long long)h, (long long)(w * h), (long long)max_pixels);
  return 0;
}

/* Allocates the w*h*3 output (dimensions already checked). */
__attribute__((unused)) static uint8_t *alloc_rgb(int64_t w, int64_t h) {
  return (uint8_t *)malloc((size_t)w * (size_t)h * 3);
}

/* RGBA rows (4 bytes a pixel) over white into RGB (3 bytes a pixel); in place is allowed since
 * the write position never passes the read position. */
__attribute__((unused)) static void rgba_over_white(const uint8_t *src, uint8_t *dst, size_t n_pixels) {
  for (size_t i = 0; i < n_pixels; i++) {
    uint32_t a = src[4 * i + 3];
    uint8_t r = media_image_over_white(src[4 * i], a);
    uint8_t g = media_image_over_white(src[4 * i + 1], a);
    uint8_t b = media_image_over_white(src[4 * i + 2], a);
    dst[3 * i] = r, dst[3 * i + 1] = g, dst[3 * i + 2] = b;
  }
}

/* ------------------------------------------------------------------------------------------ */
#ifdef ANNA_HAVE_LIBJPEG
struct jpeg_fail {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  int truncated;
  char msg[JMSG_LENGTH_MAX];
};

static void jpeg_on_error(j_common_ptr c) {
  struct jpeg_fail *f = (struct jpeg_fail *)c->err;
  f->pub.format_message(c, f->msg);
  longjmp(f->jb, 1);
}

/* Warnings are not printed (library code writes nothing to stderr). Premature end of data is
 * only a warning to libjpeg (it pads with gray); PIL refuses truncated files, so we do too.
 * Other warnings (extraneous bytes before a marker, ...) are recoverable as in PIL. */
static void jpeg_on_message(j_common_ptr c, int level) {
  struct jpeg_fail *f = (struct jpeg_fail *)c->err;
  if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) f->truncated = 1;
}

static int decode_jpeg(const uint8_t *data, size_t n, int64_t max_pixels, media_image *out,
                       char *err, size_t errlen) {
  struct jpeg_decompress_struct cinfo;
  struct jpeg_fail fail;
  uint8_t *volatile rgb = NULL;
  volatile int rc = 0;
  memset(&fail, 0, sizeof fail);
  cinfo.err = jpeg_std_error(&fail.pub);
  fail.pub.error_exit = jpeg_on_error;
  fail.pub.emit_message = jpeg_on_message;
  if (setjmp(fail.jb)) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "JPEG data is corrupt: %s", fail.msg);
    goto done;
  }
  jpeg_create_decompress(&cinfo);
  if (n > ULONG_MAX) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "JPEG data of %zu bytes is too large", n);
    goto done;
  }
  jpeg_mem_src(&cinfo, data, (unsigned long)n);
  jpeg_read_header(&cinfo, TRUE);
  if (fail.truncated) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "JPEG data is truncated (header incomplete)");
    goto done;
  }
  if ((rc = check_dims("JPEG", cinfo.image_width, cinfo.image_height, max_pixels, err,
                       errlen)))
    goto done;
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "JPEG image is CMYK/YCCK, which is not supported (convert it to RGB)");
    goto done;
  }
  cinfo.out_color_space = JCS_RGB;
  cinfo.dct_method = JDCT_ISLOW;
  cinfo.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&cinfo);
  if (cinfo.output_components != 3) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "JPEG decoder gave %d components, expected 3",
                  cinfo.output_components);
    goto done;
  }
  size_t w = cinfo.output_width, h = cinfo.output_height;
  rgb = alloc_rgb((int64_t)w, (int64_t)h);
  if (!rgb) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "JPEG: out of memory for %zu x %zu pixels", w, h);
    goto done;
  }
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = rgb + (size_t)cinfo.output_scanline * w * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  if (fail.truncated) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "JPEG data is truncated (image data ends early)");
    goto done;
  }
  /* The trailing markers are not read: PIL stops after the last scanline too. */
  out->width = (int32_t)w, out->height = (int32_t)h, out->rgb = rgb;
  rgb = NULL;
done:
  free(rgb);
  jpeg_destroy_decompress(&cinfo);
  return rc;
}
#endif

/* ------------------------------------------------------------------------------------------ */
#ifdef ANNA_HAVE_LIBPNG
struct png_src {
  const uint8_t *data;
  size_t n, pos;
  char msg[200];
};

static void png_on_error(png_structp p, png_const_charp msg) {
  struct png_src *s = (struct png_src *)png_get_error_ptr(p);
  if (!s->msg[0]) snprintf(s->msg, sizeof s->msg, "%s", msg);
  png_longjmp(p, 1);
}

static void png_on_warning(png_structp p, png_const_charp msg) { (void)p, (void)msg; }

static void png_read_cb(png_structp p, png_bytep dst, png_size_t len) {
  struct png_src *s = (struct png_src *)png_get_io_ptr(p);
  if (len > s->n - s->pos) {
    snprintf(s->msg, sizeof s->msg, "data is truncated");
    png_longjmp(p, 1);
  }
  memcpy(dst, s->data + s->pos, len);
  s->pos += len;
}

static int decode_png(const uint8_t *data, size_t n, int64_t max_pixels, media_image *out,
                      char *err, size_t errlen) {
  struct png_src src = {.data = data, .n = n};
  png_structp p = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error,
                                         png_on_warning);
  if (!p) return anna_err(err, errlen, ANNA_ENOMEM, "PNG: out of memory");
  png_infop info = png_create_info_struct(p);
  uint8_t *volatile buf = NULL;
  png_bytep *volatile rows = NULL;
  volatile int rc = 0;
  if (!info) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "PNG: out of memory");
    goto done;
  }
  if (setjmp(png_jmpbuf(p))) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "PNG %s", src.msg[0] ? src.msg : "data is corrupt");
    goto done;
  }
  png_set_read_fn(p, &src, png_read_cb);
  /* libpng's own limit defaults to 1e6 x 1e6; ours is checked right after the header. */
  png_read_info(p, info);
  png_uint_32 w, h;
  int depth, ctype, interlace;
  png_get_IHDR(p, info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
  if ((rc = check_dims("PNG", w, h, max_pixels, err, errlen))) goto done;
  /* 16-bit gray without alpha: PIL opens it as "I;16" and its conversion to RGB clips each
   * value to 255 (it does not scale); replicated below from the 16-bit samples. */
  int gray16 = depth == 16 && ctype == PNG_COLOR_TYPE_GRAY;
  int has_trns = png_get_valid(p, info, PNG_INFO_tRNS) != 0;
  if (gray16) {
    if (has_trns) {
      rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "PNG: 16-bit gray with a tRNS colour is not supported");
      goto done;
    }
  } else {
    if (depth == 16) png_set_strip_16(p); /* high byte, as PIL's ;16B raw modes */
    if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(p);
    if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(p);
    if (has_trns) png_set_tRNS_to_alpha(p);
    if (ctype == PNG_COLOR_TYPE_GRAY || ctype == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(p);
  }
  png_set_interlace_handling(p);
  png_read_update_info(p, info);
  size_t ch = png_get_channels(p, info), rowbytes = png_get_rowbytes(p, info);
  size_t want = gray16 ? 2 * (size_t)w : ch * (size_t)w;
  if ((gray16 ? ch != 1 : (ch != 3 && ch != 4)) || rowbytes != want) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "PNG: unexpected layout after conversion (%zu channels)",
                  ch);
    goto done;
  }
  size_t rb = rowbytes > 3 * (size_t)w ? rowbytes : 3 * (size_t)w;
  buf = (uint8_t *)malloc(rb * h);
  rows = (png_bytep *)malloc(sizeof(png_bytep) * h);
  if (!buf || !rows) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "PNG: out of memory for %u x %u pixels", w, h);
    goto done;
  }
  /* Rows at a stride of max(rowbytes, 3w), converted to packed RGB in place: RGBA rows shrink
   * (forward copy is safe), 16-bit gray rows grow within their own stride (right to left). */
  for (png_uint_32 y = 0; y < h; y++) rows[y] = buf + (size_t)y * rb;
  png_read_image(p, rows);
  for (png_uint_32 y = 0; y < h; y++) {
    uint8_t *s = buf + (size_t)y * rb, *d = buf + (size_t)y * 3 * w;
    if (gray16) {
      for (png_int_32 x = (png_int_32)w - 1; x >= 0; x--) {
        unsigned v = ((unsigned)s[2 * x] << 8) | s[2 * x + 1];
        d[3 * x] = d[3 * x + 1] = d[3 * x + 2] = v > 255 ? 255 : (uint8_t)v;
      }
    } else if (ch == 4) {
      rgba_over_white(s, d, w);
    } else if (d != s) {
      memmove(d, s, 3 * (size_t)w);
    }
  }
  out->width = (int32_t)w, out->height = (int32_t)h, out->rgb = buf;
  buf = NULL;
done:
  free(buf);
  free(rows);
  png_destroy_read_struct(&p, info ? &info : NULL, NULL);
  return rc;
}
#endif

/* ------------------------------------------------------------------------------------------ */
#ifdef ANNA_HAVE_LIBWEBP
static const char *webp_status(VP8StatusCode s) {
  switch (s) {
  case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
  case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
  case VP8_STATUS_BITSTREAM_ERROR: return "bitstream error";
  case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
  case VP8_STATUS_SUSPENDED: return "suspended";
  case VP8_STATUS_USER_ABORT: return "aborted";
  case VP8_STATUS_NOT_ENOUGH_DATA: return "data is truncated";
  default: return "error";
  }
}

static int decode_webp(const uint8_t *data, size_t n, int64_t max_pixels, media_image *out,
                       char *err, size_t errlen) {
  WebPBitstreamFeatures ft;
  VP8StatusCode st = WebPGetFeatures(data, n, &ft);
  if (st != VP8_STATUS_OK)
    return anna_err(err, errlen, ANNA_EINVAL, "WebP header is invalid: %s", webp_status(st));
  int rc = check_dims("WebP", ft.width, ft.height, max_pixels, err, errlen);
  if (rc) return rc;
  if (ft.has_animation)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "animated WebP is not supported");
  size_t w = (size_t)ft.width, h = (size_t)ft.height;
  size_t ch = ft.has_alpha ? 4 : 3;
  uint8_t *buf = (uint8_t *)malloc(w * h * ch);
  if (!buf) return anna_err(err, errlen, ANNA_ENOMEM, "WebP: out of memory for %zu x %zu", w, h);
  WebPDecoderConfig cfg;
  if (!WebPInitDecoderConfig(&cfg)) {
    free(buf);
    return anna_err(err, errlen, ANNA_EINVAL, "WebP: decoder version mismatch");
  }
  cfg.output.colorspace = ft.has_alpha ? MODE_RGBA : MODE_RGB;
  cfg.output.is_external_memory = 1;
  cfg.output.u.RGBA.rgba = buf;
  cfg.output.u.RGBA.stride = (int)(w * ch);
  cfg.output.u.RGBA.size = w * h * ch;
  st = WebPDecode(data, n, &cfg);
  WebPFreeDecBuffer(&cfg.output);
  if (st != VP8_STATUS_OK) {
    free(buf);
    return anna_err(err, errlen, ANNA_EINVAL, "WebP data is corrupt: %s", webp_status(st));
  }
  if (ch == 4) rgba_over_white(buf, buf, w * h); /* shrinks; the tail is unused */
  out->width = (int32_t)w, out->height = (int32_t)h, out->rgb = buf;
  return 0;
}
#endif

/* ------------------------------------------------------------------------------------------ */
#ifdef ANNA_HAVE_LIBGIF
struct gif_src {
  const uint8_t *data;
  size_t n, pos;
};

static int gif_read_cb(GifFileType *g, GifByteType *dst, int len) {
  struct gif_src *s = (struct gif_src *)g->UserData;
  size_t k = len < 0 ? 0 : (size_t)len;
  if (k > s->n - s->pos) k = s->n - s->pos;
  memcpy(dst, s->data + s->pos, k);
  s->pos += k;
  return (int)k;
}

/* First frame only. Pixels outside the first frame's rectangle take the transparent index when
 * there is one, else index 0 (the canvas PIL starts from). */
static int decode_gif(const uint8_t *data, size_t n, int64_t max_pixels, media_image *out,
                      char *err, size_t errlen) {
  struct gif_src src = {.data = data, .n = n};
  int gerr = 0, rc = 0;
  uint8_t *idx = NULL, *rgb = NULL;
  GifFileType *g = DGifOpen(&src, gif_read_cb, &gerr);
  if (!g) return anna_err(err, errlen, ANNA_EINVAL, "GIF header is invalid: %s", GifErrorString(gerr));
  if ((rc = check_dims("GIF", g->SWidth, g->SHeight, max_pixels, err, errlen))) goto done;
  int trans = -1;
  for (;;) {
    GifRecordType rt;
    if (DGifGetRecordType(g, &rt) == GIF_ERROR) goto gif_fail;
    if (rt == TERMINATE_RECORD_TYPE) {
      rc = anna_err(err, errlen, ANNA_EINVAL, "GIF has no image frame");
      goto done;
    }
    if (rt == EXTENSION_RECORD_TYPE) {
      int code;
      GifByteType *ext;
      if (DGifGetExtension(g, &code, &ext) == GIF_ERROR) goto gif_fail;
      if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4)
        trans = (ext[1] & 1) ? ext[4] : -1;
      while (ext) {
        if (DGifGetExtensionNext(g, &ext) == GIF_ERROR) goto gif_fail;
      }
      continue;
    }
    if (rt != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(g) == GIF_ERROR) goto gif_fail;
    break;
  }
  GifImageDesc *d = &g->Image;
  const ColorMapObject *cmap = d->ColorMap ? d->ColorMap : g->SColorMap;
  if (!cmap) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "GIF frame has no colour table");
    goto done;
  }
  size_t sw = (size_t)g->SWidth, sh = (size_t)g->SHeight;
  if (d->Width <= 0 || d->Height <= 0 || d->Left < 0 || d->Top < 0 ||
      (size_t)d->Left + (size_t)d->Width > sw || (size_t)d->Top + (size_t)d->Height > sh) {
    rc = anna_err(err, errlen, ANNA_EINVAL,
                  "GIF frame %dx%d at (%d,%d) lies outside the %zux%zu screen", d->Width,
                  d->Height, d->Left, d->Top, sw, sh);
    goto done;
  }
  idx = (uint8_t *)malloc(sw * sh);
  rgb = alloc_rgb((int64_t)sw, (int64_t)sh);
  if (!idx || !rgb) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "GIF: out of memory for %zu x %zu", sw, sh);
    goto done;
  }
  memset(idx, trans >= 0 ? trans : 0, sw * sh);
  static const int ioff[4] = {0, 4, 2, 1}, istep[4] = {8, 8, 4, 2};
  int passes = d->Interlace ? 4 : 1;
  for (int pass = 0; pass < passes; pass++) {
    int y0 = d->Interlace ? ioff[pass] : 0, dy = d->Interlace ? istep[pass] : 1;
    for (int y = y0; y < d->Height; y += dy) {
      uint8_t *row = idx + (size_t)(d->Top + y) * sw + (size_t)d->Left;
      if (DGifGetLine(g, row, d->Width) == GIF_ERROR) goto gif_fail;
    }
  }
  for (size_t i = 0; i < sw * sh; i++) {
    int k = idx[i];
    if (k == trans) {
      rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = 255;
    } else if (k < cmap->ColorCount) {
      rgb[3 * i] = cmap->Colors[k].Red, rgb[3 * i + 1] = cmap->Colors[k].Green,
              rgb[3 * i + 2] = cmap->Colors[k].Blue;
    } else {
      rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = 0; /* PIL pads the palette with black */
    }
  }
  out->width = (int32_t)sw, out->height = (int32_t)sh, out->rgb = rgb;
  rgb = NULL;
  goto done;
gif_fail:
  rc = anna_err(err, errlen, ANNA_EINVAL, "GIF data is corrupt: %s",
                g->Error == D_GIF_ERR_READ_FAILED ? "data is truncated" : GifErrorString(g->Error));
done:
  free(idx);
  free(rgb);
  DGifCloseFile(g, &gerr);
  return rc;
}
#endif

/* ------------------------------------------------------------------------------------------ */
static const char *format_package(media_image_format f) {
  switch (f) {
  case MEDIA_IMAGE_JPEG: return "libjpeg-dev (libjpeg-turbo)";
  case MEDIA_IMAGE_PNG: return "libpng-dev";
  case MEDIA_IMAGE_WEBP: return "libwebp-dev";
  case MEDIA_IMAGE_GIF: return "libgif-dev";
  default: return "?";
  }
}

int media_image_decode(const uint8_t *data, size_t n, int64_t max_pixels, media_image *out,
                       char *err, size_t errlen) {
  if (!out) return anna_err(err, errlen, ANNA_EINVAL, "image: no output");
  memset(out, 0, sizeof *out);
  if (!data || n == 0) return anna_err(err, errlen, ANNA_EINVAL, "image data is empty");
  media_image_format f = media_image_sniff(data, n);
  if (f == MEDIA_IMAGE_UNKNOWN)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "image format not recognised (expected JPEG, PNG, WebP or GIF; first bytes "
                    "%02x %02x %02x %02x)",
                    data[0], n > 1 ? data[1] : 0, n > 2 ? data[2] : 0, n > 3 ? data[3] : 0);
  if (!media_image_format_available(f))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "%s images are not supported by this build (%s was not found when it was "
                    "configured)",
                    media_image_format_name(f), format_package(f));
  int rc = ANNA_EUNSUPPORTED;
  switch (f) {
#ifdef ANNA_HAVE_LIBJPEG
  case MEDIA_IMAGE_JPEG: rc = decode_jpeg(data, n, max_pixels, out, err, errlen); break;
#endif
#ifdef ANNA_HAVE_LIBPNG
  case MEDIA_IMAGE_PNG: rc = decode_png(data, n, max_pixels, out, err, errlen); break;
#endif
#ifdef ANNA_HAVE_LIBWEBP
  case MEDIA_IMAGE_WEBP: rc = decode_webp(data, n, max_pixels, out, err, errlen); break;
#endif
#ifdef ANNA_HAVE_LIBGIF
  case MEDIA_IMAGE_GIF: rc = decode_gif(data, n, max_pixels, out, err, errlen); break;
#endif
  default: break;
  }
  if (rc == 0) out->format = f;
  else memset(out, 0, sizeof *out);
  return rc;
}
