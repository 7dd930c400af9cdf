/* cli_image.h: images for the command-line tools (anna-generate and anna-bench --image):
 * reading a file, decoding it for the model's tower, and the chat prompt with image content
 * parts whose pad ids expand to each image's tokens. Header-only, anna.h + jansson only. */
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

/* The chat prompt with images: a user message whose content parts are one image part per
 * image, then the text (as Qwen's processors order them); each image pad id the template
 * wrote expands to the image's tokens. *ids: caller frees; media[i] caller frees. */
static int cli_image_prompt(const anna_model *m, const anna_text *text, const char *prompt,
                            const char *system, int no_think, const char **files, int n_img,
                            anna_media **media, anna_media_ref *refs, int32_t **ids, size_t *n,
                            char *err, size_t errlen) {
  anna_vision_info vi;
  int rc = anna_model_vision_info(m, &vi, err, errlen);
  if (rc) return rc;
  for (int i = 0; i < n_img; i++) {
    uint8_t *buf = NULL;
    size_t len = 0;
    rc = cli_read_file(files[i], &buf, &len, err, errlen);
    if (!rc) rc = cli_image_decode(m, files[i], buf, len, &media[i], err, errlen);
    free(buf);
    if (rc) return rc;
  }
  json_t *msgs = json_array(), *parts = json_array();
  if (system)
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
  for (int i = 0; i < n_img; i++)
    json_array_append_new(parts, json_pack("{s:s}", "type", "image"));
  json_array_append_new(parts, json_pack("{s:s,s:s}", "type", "text", "text", prompt));
  json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", "user", "content", parts));
  char *mj = json_dumps(msgs, JSON_COMPACT);
  json_decref(msgs);
  int32_t *ids0 = NULL;
  size_t n0 = 0;
  rc = mj ? anna_text_encode_chat(text, mj, NULL, no_think ? "{\"enable_thinking\": false}" : NULL,
                                  &ids0, &n0, err, errlen)
          : anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  free(mj);
  if (rc) return rc;
  size_t total = n0;
  for (int i = 0; i < n_img; i++)
    total += (size_t)anna_media_n_tokens(media[i]);
  int32_t *out = malloc(sizeof *out * total);
  int k = 0;
  size_t o = 0;
  for (size_t i = 0; out && i < n0; i++) {
    if (ids0[i] != vi.image_token_id) {
      out[o++] = ids0[i];
      continue;
    }
    if (k == n_img) break;
    refs[k] = (anna_media_ref){media[k], (int32_t)o};
    for (int32_t j = 0; j < anna_media_n_tokens(media[k]); j++)
      out[o++] = vi.image_token_id;
    k++;
  }
  free(ids0);
  if (!out) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (k != n_img) {
    free(out);
    return anna_err(err, errlen, ANNA_EINVAL,
                    "the chat template wrote %d image pad tokens for %d images (does it render "
                    "image content parts?)",
                    k, n_img);
  }
  *ids = out;
  *n = o;
  return 0;
}

#endif
