/* cli_image.h: images and video for the command-line tools (anna-generate and anna-bench
 * --image / --video): reading a file, decoding it for the model's tower, and the chat prompt with
 * image and video content parts whose pad ids expand to each item's tokens. Header-only, anna.h + jansson only. */
#ifndef ANNA_CLI_IMAGE_H
#define ANNA_CLI_IMAGE_H

#include "anna/anna.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CLI_MAX_IMAGES 16

/* Whole file into *buf (caller frees with free()). ANNA_EIO naming the path. */
static int cli_read_file(const char *path, uint8_t **buf, size_t *n, char *err, size_t errlen) {
  *buf = NULL;
  *n = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return anna_err(err, errlen, ANNA_EIO, "--image %s: cannot open", path);
  uint8_t *b = NULL;
  size_t len = 0, cap = 0, r;
  do {
    if (len == cap) {
      uint8_t *nb = realloc(b, cap = cap ? cap * 2 : 1 << 16);
      if (!nb) {
        free(b);
        fclose(f);
        return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      }
      b = nb;
    }
    r = fread(b + len, 1, cap - len, f);
    len += r;
  } while (r > 0);
  fclose(f);
  *buf = b;
  *n = len;
  return 0;
}

/* anna_media_image_decode with the file's name in the message. */
static int cli_image_decode(const anna_model *m, const char *path, const uint8_t *buf, size_t n,
                            anna_media **out, char *err, size_t errlen) {
  int rc = anna_media_image_decode(out, m, buf, n, 0, err, errlen);
  if (rc) {
    char e2[512];
    snprintf(e2, sizeof e2, "%s", err ? err : "");
    return anna_err(err, errlen, rc, "--image %s: %s", path, e2);
  }
  return 0;
}

/* anna_media_video_decode (no limits: the user chose the file) with the name in the message. */
static int cli_video_decode(const anna_model *m, const char *path, const uint8_t *buf, size_t n,
                            anna_media **out, char *err, size_t errlen) {
  int rc = anna_media_video_decode(out, m, buf, n, NULL, err, errlen);
  if (rc) {
    char e2[512];
    snprintf(e2, sizeof e2, "%s", err ? err : "");
    return anna_err(err, errlen, rc, "--video %s: %s", path, e2);
  }
  return 0;
}

/* Decodes media i of the CLI's list: images 0..n_img-1, then the video (i == n_img). */
static int cli_media_decode(const anna_model *m, const char *path, int is_video, const uint8_t *buf,
                            size_t n, anna_media **out, char *err, size_t errlen) {
  return is_video ? cli_video_decode(m, path, buf, n, out, err, errlen)
                  : cli_image_decode(m, path, buf, n, out, err, errlen);
}

/* The chat prompt with images and an optional video: a user message whose content parts are one
 * image part per image, the video part, then the text (as Qwen's processors order them), built
 * by anna_text_encode_chat_media (pad runs, the video's timestamp text). media has room for
 * n_img + 1; media[n_img] is the video. *ids: caller frees; media[i] caller frees. */
static int cli_image_prompt(const anna_model *m, const anna_text *text, const char *prompt,
                            const char *system, int no_think, const char **files, int n_img,
                            const char *video, anna_media **media, anna_media_ref *refs,
                            int32_t **ids, size_t *n, char *err, size_t errlen) {
  const int n_media = n_img + (video != NULL);
  int rc = 0;
  for (int i = 0; i < n_media; i++) {
    uint8_t *buf = NULL;
    size_t len = 0;
    const char *f = i < n_img ? files[i] : video;
    rc = cli_read_file(f, &buf, &len, err, errlen);
    if (!rc) rc = cli_media_decode(m, f, i == n_img, buf, len, &media[i], err, errlen);
    free(buf);
    if (rc) return rc;
  }
  json_t *msgs = json_array(), *parts = json_array();
  if (system)
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
  for (int i = 0; i < n_media; i++)
    json_array_append_new(parts, json_pack("{s:s}", "type", i < n_img ? "image" : "video"));
  json_array_append_new(parts, json_pack("{s:s,s:s}", "type", "text", "text", prompt));
  json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", "user", "content", parts));
  char *mj = json_dumps(msgs, JSON_COMPACT);
  json_decref(msgs);
  int32_t *at = NULL;
  rc = mj ? anna_text_encode_chat_media(text, m, mj, NULL,
                                        no_think ? "{\"enable_thinking\": false}" : NULL, media,
                                        n_media, ids, n, &at, err, errlen)
          : anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  free(mj);
  for (int i = 0; !rc && i < n_media; i++)
    refs[i] = (anna_media_ref){media[i], at[i]};
  free(at);
  return rc;
}

#endif
