/* video.c: MP4 / WebM / MKV -> sampled RGB8 frames through FFmpeg (see video.h). */
#include "media/video.h"

#include "base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void media_video_options_default(media_video_options *o) {
  memset(o, 0, sizeof *o);
  o->sample_fps = 2.0;
  o->min_frames = 4;
  o->max_frames = 768;
}

int32_t media_video_sample_count(int64_t total, double fps, const media_video_options *o) {
  if (total <= 0) return 0;
  /* Qwen3VLVideoProcessor.sample_frames: int(total / fps * sample_fps), Python left to right. */
  double want = (double)total / fps * o->sample_fps;
  int64_t n = want >= 9.0e18 ? INT64_MAX : (int64_t)want;
  if (n < o->min_frames) n = o->min_frames;
  if (n > o->max_frames) n = o->max_frames;
  if (n > total) n = total;
  return (int32_t)n;
}

void media_video_sample_indices(int64_t total, int32_t n, int64_t *indices) {
  if (n <= 0) return;
  if (n == 1) {
    indices[0] = 0; /* numpy: div = 0, y = arange(1) * delta = 0 */
    return;
  }
  /* numpy.linspace: step = (stop - start) / (n - 1); y = arange(n) * step + start; the last
   * value is set to stop; .round() is round-half-even (rint in the default rounding mode). */
  double step = (double)(total - 1) / (double)(n - 1);
  for (int32_t i = 0; i < n - 1; i++)
    indices[i] = (int64_t)rint((double)i * step + 0.0);
  indices[n - 1] = total - 1;
}

void media_video_free(media_video *v) {
  if (!v) return;
  free(v->indices);
  free(v->times);
  free(v->rgb);
  memset(v, 0, sizeof *v);
}

#ifndef ANNA_HAVE_FFMPEG

int media_video_available(void) {
  return 0;
}

int media_video_decode(const uint8_t *data, size_t n, const media_video_options *o,
                       media_video *out, char *err, size_t errlen) {
  (void)data, (void)n, (void)o;
  if (out) memset(out, 0, sizeof *out);
  return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "video: this build has no FFmpeg (install libavformat-dev libavcodec-dev "
                  "libswscale-dev libavutil-dev and reconfigure)");
}

#else

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/display.h>
#include <libavutil/imgutils.h>
#include <libswscale/swscale.h>

int media_video_available(void) {
  return 1;
}

/* The demuxers a video request may reach: probing anything else (HLS, concat, image2, ...)
 * could make FFmpeg open other files or URLs named inside the bytes. */
static const char k_demuxers[] = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm";

typedef struct mem_reader {
  const uint8_t *data;
  size_t n, pos;
} mem_reader;

static int mem_read(void *opaque, uint8_t *buf, int size) {
  mem_reader *r = (mem_reader *)opaque;
  if (r->pos >= r->n) return AVERROR_EOF;
  size_t k = r->n - r->pos;
  if (size < 0) return AVERROR(EINVAL);
  if (k > (size_t)size) k = (size_t)size;
  memcpy(buf, r->data + r->pos, k);
  r->pos += k;
  return (int)k;
}

static int64_t mem_seek(void *opaque, int64_t offset, int whence) {
  mem_reader *r = (mem_reader *)opaque;
  int64_t base;
  switch (whence & ~AVSEEK_FORCE) {
  case AVSEEK_SIZE: return (int64_t)r->n;
  case SEEK_SET: base = 0; break;
  case SEEK_CUR: base = (int64_t)r->pos; break;
  case SEEK_END: base = (int64_t)r->n; break;
  default: return AVERROR(EINVAL);
  }
  if ((offset > 0 && base > INT64_MAX - offset) || base + offset < 0) return AVERROR(EINVAL);
  int64_t p = base + offset;
  r->pos = (uint64_t)p > r->n ? r->n : (size_t)p;
  return p;
}

/* The demuxer may not open anything besides the buffer (mov external references, ...). */
static int refuse_io_open(struct AVFormatContext *s, AVIOContext **pb, const char *url, int flags,
                          AVDictionary **options) {
  (void)s, (void)pb, (void)url, (void)flags, (void)options;
  return AVERROR(EPERM);
}

typedef struct vctx {
  mem_reader rd;
  AVIOContext *io;
  AVFormatContext *fmt;
  AVCodecContext *dec;
  AVPacket *pkt;
  AVFrame *frame, *tmp;
  struct SwsContext *sws;
  int sws_w, sws_h, sws_fmt, sws_cs, sws_range;
  int src_w, src_h; /* coded frame size (before rotation) */
  int rot_k;        /* counter-clockwise quarter turns applied after conversion (torch.rot90 k) */
  const media_video_options *opt;
  uint8_t *scratch; /* one converted frame when streaming to opt->frame_cb */
  int stream;
} vctx;

static void vctx_close_input(vctx *c) {
  if (c->fmt) avformat_close_input(&c->fmt);
  if (c->io) {
    av_freep(&c->io->buffer);
    avio_context_free(&c->io);
  }
}

static void vctx_free(vctx *c) {
  vctx_close_input(c);
  avcodec_free_context(&c->dec);
  av_packet_free(&c->pkt);
  av_frame_free(&c->frame);
  av_frame_free(&c->tmp);
  sws_freeContext(c->sws);
  free(c->scratch);
}

static const char *av_msg(int e, char *buf, size_t n) {
  if (av_strerror(e, buf, n) < 0) snprintf(buf, n, "error %d", e);
  return buf;
}

/* Opens the buffer with the allowed demuxers and finds the best video stream. */
static int vctx_open_input(vctx *c, const uint8_t *data, size_t n, char *err, size_t errlen) {
  char m[128];
  c->rd = (mem_reader){data, n, 0};
  uint8_t *buf = (uint8_t *)av_malloc(32768);
  if (!buf) return anna_err(err, errlen, ANNA_ENOMEM, "video: out of memory");
  c->io = avio_alloc_context(buf, 32768, 0, &c->rd, mem_read, NULL, mem_seek);
  if (!c->io) {
    av_free(buf);
    return anna_err(err, errlen, ANNA_ENOMEM, "video: out of memory");
  }
  c->fmt = avformat_alloc_context();
  if (!c->fmt) return anna_err(err, errlen, ANNA_ENOMEM, "video: out of memory");
  c->fmt->pb = c->io;
  c->fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
  c->fmt->io_open = refuse_io_open;
  c->fmt->format_whitelist = av_strdup(k_demuxers);
  c->fmt->protocol_whitelist = av_strdup("none");
  if (!c->fmt->format_whitelist || !c->fmt->protocol_whitelist)
    return anna_err(err, errlen, ANNA_ENOMEM, "video: out of memory");
  int rc = avformat_open_input(&c->fmt, NULL, NULL, NULL);
  if (rc < 0) /* avformat_open_input frees the context on failure */
    return anna_err(err, errlen, ANNA_EINVAL,
                    "video: not an MP4 / MOV, WebM or MKV container, or a corrupt one (%s)",
                    av_msg(rc, m, sizeof m));
  rc = avformat_find_stream_info(c->fmt, NULL);
  if (rc < 0)
    return anna_err(err, errlen, ANNA_EINVAL, "video: cannot read the stream info (%s)",
                    av_msg(rc, m, sizeof m));
  c->stream = av_find_best_stream(c->fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
  if (c->stream < 0)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "video: the %s container has no video stream (audio-only?)",
                    c->fmt->iformat ? c->fmt->iformat->name : "?");
  return 0;
}

static double stream_rotation(const AVStream *st) {
  const uint8_t *m = NULL;
#if LIBAVFORMAT_VERSION_INT >= AV_VERSION_INT(60, 15, 100)
  const AVPacketSideData *sd = av_packet_side_data_get(
      st->codecpar->coded_side_data, st->codecpar->nb_coded_side_data, AV_PKT_DATA_DISPLAYMATRIX);
  if (sd && sd->size >= 9 * sizeof(int32_t)) m = sd->data;
#else
  size_t size = 0;
  m = av_stream_get_side_data(st, AV_PKT_DATA_DISPLAYMATRIX, &size);
  if (size < 9 * sizeof(int32_t)) m = NULL;
#endif
  if (!m) return 0.0;
  double r = av_display_rotation_get((const int32_t *)m);
  return isnan(r) ? 0.0 : r;
}

/* Converts one decoded frame to packed RGB24 as torchcodec does; dst holds the rotated frame
 * (h x w when c->rot_k is odd), rows packed. */
static int convert_frame(vctx *c, const AVFrame *f, uint8_t *dst, char *err, size_t errlen) {
  const int w = f->width, h = f->height;
  if (!c->sws || c->sws_w != w || c->sws_h != h || c->sws_fmt != f->format ||
      c->sws_cs != (int)f->colorspace || c->sws_range != (int)f->color_range) {
    sws_freeContext(c->sws);
    /* torchcodec: swscale with flags 0 (libswscale then picks bicubic) when the width is a
     * multiple of 32, else a filtergraph whose auto-inserted scale filter runs swscale with its
     * default flags, also bicubic in FFmpeg 5.1. Equal-size YUV 4:2:0 -> RGB with an even height
     * takes swscale's unscaled fast path (flags do not matter); odd heights and other formats
     * take the generic path, where they do: the odd-height fixtures pin this. */
    c->sws = sws_getContext(w, h, (enum AVPixelFormat)f->format, w, h, AV_PIX_FMT_RGB24, 0, NULL,
                            NULL, NULL);
    if (!c->sws)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                      "video: cannot convert pixel format %s to RGB",
                      av_get_pix_fmt_name((enum AVPixelFormat)f->format)
                          ? av_get_pix_fmt_name((enum AVPixelFormat)f->format)
                          : "?");
    int *inv = NULL, *tab = NULL, sr = 0, dr = 0, br = 0, ct = 0, sat = 0;
    if (sws_getColorspaceDetails(c->sws, &inv, &sr, &tab, &dr, &br, &ct, &sat) < 0)
      return anna_err(err, errlen, ANNA_EUNSUPPORTED, "video: swscale colorspace query failed");
    if (f->color_range != AVCOL_RANGE_UNSPECIFIED) sr = f->color_range == AVCOL_RANGE_JPEG;
    const int *cs = sws_getCoefficients((int)f->colorspace);
    /* -1 only for YUV -> YUV, which RGB24 output never is; the return is not an error. */
    (void)sws_setColorspaceDetails(c->sws, cs, sr, cs, dr, br, ct, sat);
    c->sws_w = w, c->sws_h = h, c->sws_fmt = f->format;
    c->sws_cs = (int)f->colorspace, c->sws_range = (int)f->color_range;
  }
  const size_t row = (size_t)w * 3;
  if ((w % 32) == 0 && c->rot_k == 0) {
    uint8_t *d[4] = {dst, NULL, NULL, NULL};
    int ls[4] = {(int)row, 0, 0, 0};
    if (sws_scale(c->sws, (const uint8_t *const *)f->data, f->linesize, 0, h, d, ls) != h)
      return anna_err(err, errlen, ANNA_EINVAL, "video: colour conversion failed");
    return 0;
  }
  /* torchcodec's filtergraph path converts into an aligned frame, then copies rows. */
  if (!c->tmp || c->tmp->width != w || c->tmp->height != h) {
    av_frame_free(&c->tmp);
    c->tmp = av_frame_alloc();
    if (!c->tmp) return anna_err(err, errlen, ANNA_ENOMEM, "video: out of memory");
    c->tmp->format = AV_PIX_FMT_RGB24, c->tmp->width = w, c->tmp->height = h;
    if (av_frame_get_buffer(c->tmp, 0) < 0)
      return anna_err(err, errlen, ANNA_ENOMEM, "video: out of memory");
  }
  if (sws_scale(c->sws, (const uint8_t *const *)f->data, f->linesize, 0, h, c->tmp->data,
                c->tmp->linesize) != h)
    return anna_err(err, errlen, ANNA_EINVAL, "video: colour conversion failed");
  const uint8_t *src = c->tmp->data[0];
  const size_t ls = (size_t)c->tmp->linesize[0];
  if (c->rot_k == 0) {
    for (int y = 0; y < h; y++)
      memcpy(dst + (size_t)y * row, src + (size_t)y * ls, row);
    return 0;
  }
  /* A rotation makes torchcodec take the filtergraph path ("transpose=cclock", "clock" or
   * "hflip,vflip" after the conversion): out[i][j] for k = 1 is in[j][w-1-i], k = 2
   * in[h-1-i][w-1-j], k = 3 in[h-1-j][i]. */
  const int ow = (c->rot_k & 1) ? h : w, oh = (c->rot_k & 1) ? w : h;
  for (int i = 0; i < oh; i++)
    for (int j = 0; j < ow; j++) {
      int sy, sx;
      if (c->rot_k == 1)
        sy = j, sx = w - 1 - i;
      else if (c->rot_k == 2)
        sy = h - 1 - i, sx = w - 1 - j;
      else
        sy = h - 1 - j, sx = i;
      const uint8_t *p = src + (size_t)sy * ls + (size_t)sx * 3;
      uint8_t *q = dst + ((size_t)i * (size_t)ow + (size_t)j) * 3;
      q[0] = p[0], q[1] = p[1], q[2] = p[2];
    }
  return 0;
}

/* Stores frame number k (presentation order) into every sampled slot that wants it. */
static int take_frame(vctx *c, media_video *v, int64_t k, int32_t *next, char *err, size_t errlen) {
  const AVFrame *f = c->frame;
  if (*next >= v->n_frames || v->indices[*next] != k) return 0;
  if (f->width != c->src_w || f->height != c->src_h)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "video: frame %lld is %d x %d but the stream is %d x %d (size changes are "
                    "not supported)",
                    (long long)k, f->width, f->height, c->src_w, c->src_h);
  const size_t fb = (size_t)v->width * (size_t)v->height * 3;
  const media_video_options *o = c->opt;
  uint8_t *dst = o->frame_cb ? c->scratch : v->rgb + (size_t)*next * fb;
  int rc = convert_frame(c, f, dst, err, errlen);
  if (rc) return rc;
  for (; *next < v->n_frames && v->indices[*next] == k; (*next)++) {
    if (o->frame_cb) {
      if ((rc = o->frame_cb(o->frame_user, *next, v->n_frames, dst, v->width, v->height, err,
                            errlen)))
        return rc;
    } else if (v->rgb + (size_t)*next * fb != dst) {
      memcpy(v->rgb + (size_t)*next * fb, dst, fb);
    }
  }
  return 0;
}

static int decode_sampled(vctx *c, const media_video_options *o, media_video *v, char *err,
                          size_t errlen) {
  char m[128];
  AVStream *st = c->fmt->streams[c->stream];
  const AVCodec *codec = avcodec_find_decoder(st->codecpar->codec_id);
  if (!codec)
    return anna_err(err, errlen, ANNA_EUNSUPPORTED, "video: no decoder for codec %s",
                    avcodec_get_name(st->codecpar->codec_id));
  c->dec = avcodec_alloc_context3(codec);
  if (!c->dec) return anna_err(err, errlen, ANNA_ENOMEM, "video: out of memory");
  int rc = avcodec_parameters_to_context(c->dec, st->codecpar);
  if (rc < 0)
    return anna_err(err, errlen, ANNA_EINVAL, "video: bad codec parameters (%s)",
                    av_msg(rc, m, sizeof m));
  c->dec->thread_count = o->threads;
  c->dec->pkt_timebase = st->time_base;
  if ((rc = avcodec_open2(c->dec, codec, NULL)) < 0)
    return anna_err(err, errlen, ANNA_EINVAL, "video: cannot open the %s decoder (%s)", codec->name,
                    av_msg(rc, m, sizeof m));
  int64_t k = 0;
  int32_t next = 0;
  int eof = 0;
  while (next < v->n_frames) {
    if (!eof) {
      rc = av_read_frame(c->fmt, c->pkt);
      if (rc == AVERROR_EOF) {
        eof = 1;
        rc = avcodec_send_packet(c->dec, NULL);
      } else if (rc < 0) {
        return anna_err(err, errlen, ANNA_EINVAL, "video: truncated or corrupt data (%s)",
                        av_msg(rc, m, sizeof m));
      } else {
        if (c->pkt->stream_index != c->stream || (c->pkt->flags & AV_PKT_FLAG_DISCARD)) {
          av_packet_unref(c->pkt);
          continue;
        }
        rc = avcodec_send_packet(c->dec, c->pkt);
        av_packet_unref(c->pkt);
      }
      if (rc < 0 && rc != AVERROR(EAGAIN) && rc != AVERROR_EOF)
        return anna_err(err, errlen, ANNA_EINVAL, "video: corrupt %s data near frame %lld (%s)",
                        codec->name, (long long)k, av_msg(rc, m, sizeof m));
    }
    for (;;) {
      rc = avcodec_receive_frame(c->dec, c->frame);
      if (rc == AVERROR(EAGAIN)) break;
      if (rc == AVERROR_EOF) {
        return anna_err(err, errlen, ANNA_EINVAL,
                        "video: the stream decodes to %lld frames but frame %lld was sampled "
                        "(truncated or corrupt)",
                        (long long)k, (long long)v->indices[next]);
      }
      if (rc < 0)
        return anna_err(err, errlen, ANNA_EINVAL, "video: corrupt %s data near frame %lld (%s)",
                        codec->name, (long long)k, av_msg(rc, m, sizeof m));
      rc = take_frame(c, v, k, &next, err, errlen);
      av_frame_unref(c->frame);
      if (rc) return rc;
      k++;
      if (next >= v->n_frames) break;
    }
  }
  return 0;
}

int media_video_decode(const uint8_t *data, size_t n, const media_video_options *opt,
                       media_video *out, char *err, size_t errlen) {
  media_video_options defo;
  if (!opt) media_video_options_default(&defo), opt = &defo;
  memset(out, 0, sizeof *out);
  if (!data || n == 0) return anna_err(err, errlen, ANNA_EINVAL, "video: empty input");
  if (opt->max_bytes > 0 && (uint64_t)n > (uint64_t)opt->max_bytes)
    return anna_err(err, errlen, ANNA_EINVAL, "video: %zu bytes exceed the limit of %lld bytes", n,
                    (long long)opt->max_bytes);
  if (!(opt->sample_fps > 0) || opt->min_frames < 1 || opt->max_frames < opt->min_frames)
    return anna_err(err, errlen, ANNA_EINVAL, "video: bad sampling options (fps %g, frames %d..%d)",
                    opt->sample_fps, opt->min_frames, opt->max_frames);
  vctx c;
  memset(&c, 0, sizeof c);
  c.opt = opt;
  media_video v;
  memset(&v, 0, sizeof v);
  char m[128];
  int rc = vctx_open_input(&c, data, n, err, errlen);
  if (rc) goto fail;
  AVStream *st = c.fmt->streams[c.stream];
  const AVCodecParameters *par = st->codecpar;
  v.width = par->width, v.height = par->height;
  snprintf(v.codec, sizeof v.codec, "%s", avcodec_get_name(par->codec_id));
  if (v.width <= 0 || v.height <= 0) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "video: the %s stream has no frame size", v.codec);
    goto fail;
  }
  if (opt->max_pixels > 0 && (int64_t)v.width * v.height > opt->max_pixels) {
    rc = anna_err(err, errlen, ANNA_EINVAL,
                  "video: %d x %d frames exceed the limit of %lld pixels per frame", v.width,
                  v.height, (long long)opt->max_pixels);
    goto fail;
  }
  /* torchcodec: the display matrix angle rounded to a quarter turn; 90 is counter-clockwise.
   * The sampled frames have the rotated size. */
  double rot = stream_rotation(st);
  long quarter = lround(rot / 90.0);
  if (!(fabs(rot) <= 180.0) || quarter < -2 || quarter > 2) {
    rc = anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "video: rotation of %.1f degrees is not supported", rot);
    goto fail;
  }
  c.rot_k = (int)((quarter % 4 + 4) % 4);
  c.src_w = v.width, c.src_h = v.height;
  if (c.rot_k & 1) v.width = c.src_h, v.height = c.src_w;

  /* torchcodec's exact-mode scan: count the stream's packets and their pts span. */
  if (!(c.pkt = av_packet_alloc()) || !(c.frame = av_frame_alloc())) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "video: out of memory");
    goto fail;
  }
  int64_t count = 0, pmin = INT64_MAX, pmax = INT64_MIN;
  for (;;) {
    rc = av_read_frame(c.fmt, c.pkt);
    if (rc == AVERROR_EOF) break;
    if (rc < 0) {
      rc = anna_err(err, errlen, ANNA_EINVAL, "video: truncated or corrupt %s data (%s)",
                    c.fmt->iformat->name, av_msg(rc, m, sizeof m));
      goto fail;
    }
    if (c.pkt->stream_index == c.stream && !(c.pkt->flags & AV_PKT_FLAG_DISCARD)) {
      int64_t p = c.pkt->pts == AV_NOPTS_VALUE ? c.pkt->dts : c.pkt->pts;
      count++;
      if (p < pmin) pmin = p;
      if (p != AV_NOPTS_VALUE && c.pkt->duration > 0 && p > INT64_MAX - c.pkt->duration)
        p = INT64_MAX;
      else
        p += c.pkt->duration;
      if (p > pmax) pmax = p;
    }
    av_packet_unref(c.pkt);
  }
  if (count == 0) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "video: the %s stream has no frames", v.codec);
    goto fail;
  }
  /* pts_to_seconds as torchcodec: multiply before dividing. */
  const AVRational tb = st->time_base;
  double dur = tb.den ? (double)pmax * tb.num / tb.den - (double)pmin * tb.num / tb.den : 0.0;
  double fps = 0.0;
  if (dur != 0.0 && isfinite(dur))
    fps = (double)count / dur;
  else if (st->r_frame_rate.num > 0 && st->r_frame_rate.den > 0)
    fps = av_q2d(st->r_frame_rate);
  if (!(fps > 0) || !isfinite(fps)) fps = 24.0; /* the processor's assumption */
  /* A cut-off Matroska / WebM file still demuxes (it has no frame index): compare the data
   * with the duration the header declares for the stream (the container's when the video is
   * its only stream). torchcodec would take the prefix as a shorter clip; a request that lost
   * a third of its bytes is refused instead. Tolerance: two frames and 0.1 s. */
  double hdr = 0.0;
  if (st->duration > 0 && st->duration != AV_NOPTS_VALUE && tb.den)
    hdr = (double)st->duration * tb.num / tb.den;
  else if (c.fmt->nb_streams == 1 && c.fmt->duration > 0 && c.fmt->duration != AV_NOPTS_VALUE)
    hdr = (double)c.fmt->duration / AV_TIME_BASE;
  if (hdr > 0 && dur + 2.0 / fps + 0.1 < hdr) {
    rc = anna_err(err, errlen, ANNA_EINVAL,
                  "video: truncated: the header says %.3f s but the data holds %.3f s", hdr, dur);
    goto fail;
  }
  v.total_frames = count;
  v.fps = fps;
  v.duration_s = dur;
  if (opt->max_duration_s > 0 && !(dur <= opt->max_duration_s)) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "video: %.3f s exceeds the limit of %.3f s", dur,
                  opt->max_duration_s);
    goto fail;
  }
  v.n_frames = media_video_sample_count(count, fps, opt);
  if (opt->limit_frames > 0 && v.n_frames > opt->limit_frames) {
    rc =
        anna_err(err, errlen, ANNA_EINVAL, "video: %d sampled frames exceed the limit of %d frames",
                 v.n_frames, opt->limit_frames);
    goto fail;
  }
  const size_t fb = (size_t)v.width * (size_t)v.height * 3;
  if ((size_t)v.n_frames > SIZE_MAX / fb) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "video: %d frames of %d x %d are too large", v.n_frames,
                  v.width, v.height);
    goto fail;
  }
  v.indices = (int64_t *)malloc(sizeof(int64_t) * (size_t)v.n_frames);
  v.times = (double *)malloc(sizeof(double) * (size_t)v.n_frames);
  if (opt->frame_cb)
    c.scratch = (uint8_t *)malloc(fb);
  else
    v.rgb = (uint8_t *)malloc(fb * (size_t)v.n_frames);
  if (!v.indices || !v.times || (!v.rgb && !c.scratch)) {
    rc = anna_err(err, errlen, ANNA_ENOMEM, "video: out of memory for %d frames of %d x %d",
                  v.n_frames, v.width, v.height);
    goto fail;
  }
  media_video_sample_indices(count, v.n_frames, v.indices);
  for (int32_t i = 0; i < v.n_frames; i++)
    v.times[i] = (double)v.indices[i] / fps;

  /* Back to the start as torchcodec's scan does, then decode in presentation order. */
  rc = avformat_seek_file(c.fmt, c.stream, INT64_MIN, 0, 0, 0);
  if (rc < 0) rc = avformat_seek_file(c.fmt, -1, INT64_MIN, 0, 0, 0);
  if (rc < 0) {
    rc = anna_err(err, errlen, ANNA_EINVAL, "video: cannot seek back to the start (%s)",
                  av_msg(rc, m, sizeof m));
    goto fail;
  }
  if ((rc = decode_sampled(&c, opt, &v, err, errlen))) goto fail;
  vctx_free(&c);
  *out = v;
  return 0;
fail:
  vctx_free(&c);
  media_video_free(&v);
  return rc;
}

#endif
