/* asr_chunk.h: long audio cut into pieces, and the pieces' transcripts joined, exactly as
 * qwen-asr 0.0.6's Qwen3ASRModel.transcribe does (qwen_asr/inference/utils.py:
 * split_audio_into_chunks, parse_asr_output, merge_languages; inference/qwen3_asr.py).
 *
 * Contract, splitting n samples at `rate` into pieces of at most max_seconds:
 *   - n / rate <= max_seconds: one piece, the whole clip, never padded;
 *   - else, from start = 0, while n - start > max_len (max_len = (int64)(max_seconds * rate)):
 *     the cut aims at start + max_len; in [left, right) = [max(start, cut - 5 s), min(n, cut +
 *     5 s)) the 100-ms window (1600 samples at 16 kHz, at least 4) of least sum |x| is found
 *     (the first of equal sums), and the boundary is its quietest sample (the first of equal
 *     |x|); when right - left <= window the boundary is the cut itself. The boundary is kept in
 *     [start + 1, n]; the piece is [start, boundary); the rest is the last piece.
 *   - pieces shorter than 0.5 s are zero-padded at the end to 0.5 s (n_padded); their offsets
 *     are where they start in the source, in seconds.
 *   The pieces tile the clip: no overlap, no gap, so joined transcripts repeat no words.
 *   Window sums are kept in double (numpy sums float32, through BLAS): boundaries are the
 *   reference's exactly wherever the minimum is not a near-tie; all-zero windows (digital
 *   silence) are recognised exactly, so ties among them resolve to the first as numpy does.
 *
 * Joining (asr_chunk_join): each piece's raw generated text (special tokens kept, end-of-
 * generation ids dropped) is parsed as parse_asr_output does: stripped of white space (Python's
 * str.strip: ASCII and Unicode spaces), runs of one character repeated more than 20 times
 * collapsed to one, then a pattern of 1..20 characters repeated 20 or more times collapsed to
 * one copy (detect_and_fix_repetitions, on code points); with a forced language the whole is
 * text, else "language X<asr_text>T" gives language X (first letter upper, rest lower) and T
 * stripped, "language None" gives no language, text without <asr_text> is all text. Texts are
 * concatenated with nothing between them (qwen-asr's "".join), languages merged in order with
 * consecutive duplicates and empty ones dropped, comma-separated.
 *
 * Memory: asr_chunk_split allocates the piece table; joining allocates its results. Nothing
 * is shared: thread-safe.
 */
#ifndef ANNA_MEDIA_ASR_CHUNK_H
#define ANNA_MEDIA_ASR_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#define ASR_CHUNK_MAX_SECONDS 1200.0  /* qwen-asr's MAX_ASR_INPUT_SECONDS */
#define ASR_CHUNK_SEARCH_SECONDS 5.0  /* split_audio_into_chunks' search_expand_sec */
#define ASR_CHUNK_WINDOW_MS 100.0     /* its min_window_ms */
#define ASR_CHUNK_MIN_SECONDS 0.5     /* MIN_ASR_INPUT_SECONDS: shorter pieces are padded */

typedef struct asr_chunk {
  int64_t start;    /* first sample in the source */
  int64_t n;        /* samples taken from the source */
  int64_t n_padded; /* n, or the 0.5-s minimum when the piece is shorter (zeros after) */
} asr_chunk;

/* Splits x[0..n) (rate > 0, n >= 1) into pieces of at most max_seconds (> 0). *out (caller
 * frees with free()) gets *n_out >= 1 pieces in order. Returns 0, ANNA_EINVAL (bad arguments,
 * named) or ANNA_ENOMEM. */
int asr_chunk_split(const float *x, int64_t n, int32_t rate, double max_seconds, asr_chunk **out,
                    int32_t *n_out, char *err, size_t errlen);

/* Joins the raw outputs raw[0..n) of one clip's pieces (see above; forced: the prompt forced a
 * language, so outputs are all text). *text and *language (caller frees both with free();
 * *language may be "") receive the joined transcript and the merged languages. Returns 0 or
 * ANNA_ENOMEM. */
int asr_chunk_join(const char *const *raw, int32_t n, int forced, char **text, char **language,
                   char *err, size_t errlen);

#endif
