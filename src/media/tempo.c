/* tempo.c: the atempo filter graph (tempo.h). */
#include "media/tempo.h"

#include "anna/anna.h"
#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check(int rate, double speed, char *err, size_t errlen) {
  if (!(speed >= MEDIA_TEMPO_MIN && speed <= MEDIA_TEMPO_MAX))
    return anna_err(err, errlen, ANNA_EINVAL, "speed %g is not in [%g, %g]", speed, MEDIA_TEMPO_MIN,
                    MEDIA_TEMPO_MAX);
  if (rate < 1000 || rate > 768000)
    return anna_err(err, errlen, ANNA_EINVAL, "tempo: sample rate %d is not in [1000, 768000]", rate);
  return 0;
}

#ifdef ANNA_HAVE_AVFILTER
#include <libavfilter/avfilter.h>
#include <libavfilter/buffersink.h>
#include <libavfilter/buffersrc.h>
#include <libavutil/channel_layout.h>
#include <libavutil/error.h>
#include <libavutil/frame.h>
#include <libavutil/opt.h>

struct media_tempo {
  AVFilterGraph *g;
  AVFilterContext *src, *sink;
  AVFrame *out;
  int rate;
  int64_t pts;
  int flushed;
};

int media_tempo_available(void) {
  return 1;
}

static int av_fail(char *err, size_t errlen, const char *what, int e) {
  char b[AV_ERROR_MAX_STRING_SIZE] = "";
  av_strerror(e, b, sizeof b);
  return anna_err(err, errlen, e == AVERROR(ENOMEM) ? ANNA_ENOMEM : ANNA_EIO, "tempo: %s: %s", what, b);
}

void media_tempo_free(media_tempo *t) {
  if (!t) return;
  avfilter_graph_free(&t->g);
  av_frame_free(&t->out);
  free(t);
}

int media_tempo_create(media_tempo **out, int rate, double speed, char *err, size_t errlen) {
  *out = NULL;
  int rc = check(rate, speed, err, errlen);
  if (rc) return rc;
  media_tempo *t = calloc(1, sizeof *t);
  if (!t) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  t->rate = rate;
  t->g = avfilter_graph_alloc();
  t->out = av_frame_alloc();
  if (!t->g || !t->out) {
    media_tempo_free(t);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  char args[160], chain[96];
  snprintf(args, sizeof args, "sample_rate=%d:sample_fmt=flt:channel_layout=mono:time_base=1/%d",
           rate, rate);
  /* one atempo takes [0.5, 100]: below 0.5, two of sqrt(speed) */
  if (speed < 0.5)
    snprintf(chain, sizeof chain, "atempo=%.17g,atempo=%.17g", sqrt(speed), sqrt(speed));
  else
    snprintf(chain, sizeof chain, "atempo=%.17g", speed);
  int e = avfilter_graph_create_filter(&t->src, avfilter_get_by_name("abuffer"), "in", args, NULL,
                                       t->g);
  if (e < 0) {
    media_tempo_free(t);
    return av_fail(err, errlen, "abuffer", e);
  }
  e = avfilter_graph_create_filter(&t->sink, avfilter_get_by_name("abuffersink"), "out", NULL, NULL,
                                   t->g);
  static const enum AVSampleFormat fmts[] = {AV_SAMPLE_FMT_FLT, AV_SAMPLE_FMT_NONE};
  if (e >= 0)
    e = av_opt_set_int_list(t->sink, "sample_fmts", fmts, AV_SAMPLE_FMT_NONE,
                            AV_OPT_SEARCH_CHILDREN);
  if (e < 0) {
    media_tempo_free(t);
    return av_fail(err, errlen, "abuffersink", e);
  }
  AVFilterInOut *o = avfilter_inout_alloc(), *i = avfilter_inout_alloc();
  if (!o || !i) {
    avfilter_inout_free(&o), avfilter_inout_free(&i);
    media_tempo_free(t);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  o->name = av_strdup("in"), o->filter_ctx = t->src, o->pad_idx = 0, o->next = NULL;
  i->name = av_strdup("out"), i->filter_ctx = t->sink, i->pad_idx = 0, i->next = NULL;
  e = avfilter_graph_parse_ptr(t->g, chain, &i, &o, NULL);
  avfilter_inout_free(&o), avfilter_inout_free(&i);
  if (e >= 0) e = avfilter_graph_config(t->g, NULL);
  if (e < 0) {
    media_tempo_free(t);
    return av_fail(err, errlen, chain, e);
  }
  *out = t;
  return 0;
}

/* Everything the sink holds now, to fn. */
static int drain(media_tempo *t, media_tempo_fn fn, void *user, char *err, size_t errlen) {
  for (;;) {
    int e = av_buffersink_get_frame(t->sink, t->out);
    if (e == AVERROR(EAGAIN) || e == AVERROR_EOF) return 0;
    if (e < 0) return av_fail(err, errlen, "output", e);
    const int64_t n = t->out->nb_samples;
    int rc = n ? fn(user, (const float *)t->out->extended_data[0], n) : 0;
    av_frame_unref(t->out);
    if (rc) return rc;
  }
}

int media_tempo_push(media_tempo *t, const float *in, int64_t n, int flush, media_tempo_fn fn,
                     void *user, char *err, size_t errlen) {
  if (!t || (n > 0 && !in) || n < 0 || n > INT32_MAX)
    return anna_err(err, errlen, ANNA_EINVAL, "tempo: bad push");
  if (t->flushed) return anna_err(err, errlen, ANNA_EINVAL, "tempo: pushed after the flush");
  if (n > 0) {
    AVFrame *f = av_frame_alloc();
    if (!f) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    f->format = AV_SAMPLE_FMT_FLT;
    f->sample_rate = t->rate;
    f->nb_samples = (int)n;
    f->pts = t->pts;
    av_channel_layout_default(&f->ch_layout, 1);
    int e = av_frame_get_buffer(f, 0);
    if (e >= 0) {
      memcpy(f->extended_data[0], in, (size_t)n * sizeof(float));
      e = av_buffersrc_add_frame(t->src, f); /* takes the frame's reference */
    }
    av_frame_free(&f);
    if (e < 0) return av_fail(err, errlen, "input", e);
    t->pts += n;
    int rc = drain(t, fn, user, err, errlen);
    if (rc) return rc;
  }
  if (flush) {
    t->flushed = 1;
    int e = av_buffersrc_add_frame(t->src, NULL);
    if (e < 0) return av_fail(err, errlen, "flush", e);
    return drain(t, fn, user, err, errlen);
  }
  return 0;
}

#else /* no libavfilter */

struct media_tempo {
  int unused;
};

int media_tempo_available(void) {
  return 0;
}

int media_tempo_create(media_tempo **out, int rate, double speed, char *err, size_t errlen) {
  *out = NULL;
  int rc = check(rate, speed, err, errlen);
  if (rc) return rc;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "speed: anna was built without libavfilter (install libavfilter-dev and reconfigure)");
}

int media_tempo_push(media_tempo *t, const float *in, int64_t n, int flush, media_tempo_fn fn,
                     void *user, char *err, size_t errlen) {
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "speed: anna was built without libavfilter");
}

void media_tempo_free(media_tempo *t) {
  (void)t;
}

#endif
