/* hub.h: models from the Hugging Face Hub, downloaded into huggingface_hub's own cache.
 *
 * A model is named as ORG/NAME (a folder of weights: config.json, *.safetensors, tokenizer
 * and template files), ORG/NAME:FILE (one file, typically a GGUF) or ORG/NAME:TAG (TAG has no
 * '.': the one GGUF file whose name holds the quantization TAG as a whole field, any case, as
 * llama.cpp's -hf picks it; a repo of GGUF files named alone means TAG Q4_K_M). hub_fetch
 * resolves the name to a local path, downloading what is missing:
 *   GET  {endpoint}/api/models/ORG/NAME/revision/REV    the commit and the file list (folders)
 *   HEAD {endpoint}/ORG/NAME/resolve/COMMIT/FILE       the file's ETag (sha256 for LFS files,
 *                                                      the git blob sha1 for others) and size
 *   GET  the same URL, redirects followed (the CDN), Range to resume a partial blob
 * into the cache layout huggingface_hub uses, so Python users and anna share the files:
 *   CACHE/models--ORG--NAME/blobs/ETAG                 the bytes, checked against ETAG
 *   CACHE/models--ORG--NAME/snapshots/COMMIT/FILE      a relative symlink to the blob
 *   CACHE/models--ORG--NAME/refs/REV                   the commit REV resolved to
 * A partial download stays in blobs/ETAG.incomplete and the next call resumes it. A blob whose
 * checksum does not match is deleted and the call fails (ANNA_EFORMAT) naming the file.
 *
 * Environment (as huggingface_hub reads it): HF_ENDPOINT; HF_TOKEN, HUGGING_FACE_HUB_TOKEN,
 * HF_TOKEN_PATH or HF_HOME/token (sent as a Bearer token to the endpoint's host only);
 * HF_HUB_CACHE (or HUGGINGFACE_HUB_CACHE), HF_HOME (default XDG_CACHE_HOME/huggingface or
 * ~/.cache/huggingface), HF_HUB_OFFLINE=1 (the cache only). Files of anna's own front ends use
 * anna/anna.h and this header only; the module links libcurl and libcrypto (without libcurl
 * at build time only the offline cache lookup works and a download is ANNA_EUNSUPPORTED).
 * Threads: hub_fetch may run in several threads or processes at once (a blob is written under
 * an flock of huggingface_hub's .locks/ file), but libcurl's global setup is not thread-safe:
 * a multi-threaded caller runs curl_global_init (or one hub_fetch) before starting threads.
 * Progress and "downloading" lines go to stderr (hub_options.progress / quiet).
 */
#ifndef ANNA_HUB_H
#define ANNA_HUB_H

#include <stddef.h>

typedef struct hub_options {
  const char *endpoint;  /* NULL: HF_ENDPOINT, else https://huggingface.co */
  const char *token;     /* NULL: from the environment (above); "" sends none */
  const char *cache_dir; /* NULL: from the environment (above) */
  const char *revision;  /* NULL: "main"; a branch, tag or 40-hex commit */
  int offline;           /* -1: HF_HUB_OFFLINE; 0 / 1 */
  int progress;          /* -1: a bar when stderr is a terminal; 0 / 1 */
  int retries;           /* -1: 3; attempts after a transfer that broke off (each resumes) */
  int quiet;             /* 1: no "downloading ..." lines on stderr */
} hub_options;

/* Splits "ORG/NAME[:FILE]" into repo (ORG/NAME) and file ("" for a folder), both
 * NUL-terminated into caller buffers. ANNA_EINVAL naming what is wrong (no '/', empty parts,
 * '..' or a leading '/' in FILE, characters the Hub does not allow in a repo id). */
int hub_spec_parse(const char *spec, char *repo, size_t repo_cap, char *file, size_t file_cap,
                   char *err, size_t errlen);

/* Resolves spec (ORG/NAME[:FILE|:TAG]) to a local path, downloading what the cache lacks:
 * the snapshot folder for ORG/NAME, the snapshot file for ORG/NAME:FILE or :TAG. *path_out is
 * malloc'd (caller frees). opt may be NULL (all defaults). Errors: ANNA_EINVAL (spec),
 * ANNA_ENOTFOUND (no such repo / file / revision on the Hub, or not in the cache offline),
 * ANNA_EIO (network, an HTTP status such as 401 for a gated repo without a token, the file
 * system; the message names the URL or path), ANNA_EFORMAT (checksum or size mismatch, a
 * listing that does not parse), ANNA_EUNSUPPORTED (a download in a build without libcurl). */
int hub_fetch(const char *spec, const hub_options *opt, char **path_out, char *err, size_t errlen);

#endif
