/* tempo.h: mono float PCM played faster or slower without a pitch change, through FFmpeg's
 * atempo filter (libavfilter), for the speech API's `speed`.
 *
 * Contract: a media_tempo takes PCM at one rate in pushes of any size and hands out the
 * stretched PCM (about n / speed samples in all) through a callback as the filter releases it;
 * media_tempo_push with flush = 1 drains the filter's tail (call once, last). speed must lie
 * in [MEDIA_TEMPO_MIN, MEDIA_TEMPO_MAX]; atempo takes [0.5, 100] per instance, so a speed
 * under 0.5 chains two instances of sqrt(speed). speed 1 is not special-cased here (callers
 * skip the filter). The graph is abuffer (flt, mono) -> atempo [-> atempo] -> abuffersink (flt,
 * mono): the filter's WSOLA output is FFmpeg's, exactly.
 * A build without libavfilter returns ANNA_EUNSUPPORTED from media_tempo_create naming
 * libavfilter-dev. Memory: the graph is built at create; a push allocates one frame for its
 * input (chunk granularity, not per sample). Not thread-safe per object; objects are
 * independent.
 */
#ifndef ANNA_MEDIA_TEMPO_H
#define ANNA_MEDIA_TEMPO_H

#include <stddef.h>
#include <stdint.h>

#define MEDIA_TEMPO_MIN 0.25
#define MEDIA_TEMPO_MAX 4.0

typedef struct media_tempo media_tempo;

/* Receives out[0..n) (borrowed for the call); nonzero return stops the push (returned as is). */
typedef int (*media_tempo_fn)(void *user, const float *out, int64_t n);

/* 1 when this build has libavfilter, else 0. */
int media_tempo_available(void);
/* Caller frees with media_tempo_free. ANNA_EINVAL (speed or rate out of range, named),
 * ANNA_EUNSUPPORTED (no libavfilter), ANNA_ENOMEM. */
int media_tempo_create(media_tempo **out, int rate, double speed, char *err, size_t errlen);
/* Feeds in[0..n) (n >= 0) and hands what comes out to fn; flush = 1 ends the stream. Returns
 * 0, fn's nonzero return, or ANNA_EIO naming the filter's error. */
int media_tempo_push(media_tempo *t, const float *in, int64_t n, int flush, media_tempo_fn fn,
                     void *user, char *err, size_t errlen);
void media_tempo_free(media_tempo *t);

#endif
