/* hub.c: see hub.h. */
#include "hub.h"

#include "anna/anna.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef ANNA_HAVE_CURL
#include <curl/curl.h>
#include <openssl/evp.h>
#endif

#define HUB_PATH_MAX 4096

/* snprintf into a path buffer; -1 when it does not fit (a path is never silently cut). */
static int pathf(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int pathf(char *out, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(out, cap, fmt, ap);
  va_end(ap);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* ---- names and paths --------------------------------------------------------------------- */

/* The Hub's repo-id characters (huggingface_hub's validate_repo_id): [A-Za-z0-9._-], no "--" or
 * ".." and not starting or ending with '-' or '.'. */
static int repo_part_ok(const char *s, size_t n) {
  if (!n || n > 96) return 0;
  if (s[0] == '-' || s[0] == '.' || s[n - 1] == '-' || s[n - 1] == '.') return 0;
  for (size_t i = 0; i < n; i++) {
    const char c = s[i];
    if (!(isalnum((unsigned char)c) || c == '.' || c == '_' || c == '-')) return 0;
    if (i && ((c == '-' && s[i - 1] == '-') || (c == '.' && s[i - 1] == '.'))) return 0;
  }
  return 1;
}

static int file_ok(const char *f) {
  if (!*f || f[0] == '/' || strlen(f) > 1000) return 0;
  for (const char *p = f; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == '\\') return 0;
  /* No path component may be "." or ".." (the snapshot path must stay inside the snapshot). */
  for (const char *p = f; *p;) {
    const char *q = strchr(p, '/');
    size_t n = q ? (size_t)(q - p) : strlen(p);
    if (!n || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return 0;
    p = q ? q + 1 : p + n;
  }
  return 1;
}

int hub_spec_parse(const char *spec, char *repo, size_t repo_cap, char *file, size_t file_cap,
                   char *err, size_t errlen) {
  if (!spec || !*spec)
    return anna_err(err, errlen, ANNA_EINVAL, "empty Hub model name (want ORG/NAME[:FILE])");
  const char *colon = strchr(spec, ':');
  const size_t rn = colon ? (size_t)(colon - spec) : strlen(spec);
  const char *slash = memchr(spec, '/', rn);
  if (!slash || memchr(slash + 1, '/', rn - (size_t)(slash - spec) - 1))
    return anna_err(err, errlen, ANNA_EINVAL, "Hub model '%.200s' is not ORG/NAME[:FILE]", spec);
  if (!repo_part_ok(spec, (size_t)(slash - spec)) ||
      !repo_part_ok(slash + 1, rn - (size_t)(slash - spec) - 1))
    return anna_err(
        err, errlen, ANNA_EINVAL,
        "Hub repo '%.*s' has characters a repo id cannot have (letters, digits, '-', '_', '.')",
        (int)(rn > 200 ? 200 : rn), spec);
  if (rn >= repo_cap) return anna_err(err, errlen, ANNA_EINVAL, "Hub repo name too long");
  memcpy(repo, spec, rn);
  repo[rn] = 0;
  const char *f = colon ? colon + 1 : "";
  if (colon && !file_ok(f))
    return anna_err(err, errlen, ANNA_EINVAL,
                    "Hub file '%.200s' is not a relative path inside the repo", f);
  if (strlen(f) >= file_cap) return anna_err(err, errlen, ANNA_EINVAL, "Hub file name too long");
  strcpy(file, f);
  return 0;
}

static const char *env(const char *k) {
  const char *v = getenv(k);
  return v && *v ? v : NULL;
}

static int env_true(const char *k) {
  const char *v = env(k);
  return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
               !strcasecmp(v, "on"));
}

/* HF_HOME as huggingface_hub computes it. */
static int hf_home(char *out, size_t cap) {
  const char *h = env("HF_HOME");
  if (h) return snprintf(out, cap, "%s", h) >= (int)cap ? -1 : 0;
  const char *x = env("XDG_CACHE_HOME");
  if (x) return snprintf(out, cap, "%s/huggingface", x) >= (int)cap ? -1 : 0;
  const char *home = env("HOME");
  if (!home) return -1;
  return snprintf(out, cap, "%s/.cache/huggingface", home) >= (int)cap ? -1 : 0;
}

static int cache_root(const hub_options *o, char *out, size_t cap, char *err, size_t errlen) {
  const char *c = o->cache_dir          ? o->cache_dir
                  : env("HF_HUB_CACHE") ? env("HF_HUB_CACHE")
                                        : env("HUGGINGFACE_HUB_CACHE");
  int bad;
  if (c) {
    bad = snprintf(out, cap, "%s", c) >= (int)cap;
  } else {
    char home[HUB_PATH_MAX];
    bad = hf_home(home, sizeof home) || snprintf(out, cap, "%s/hub", home) >= (int)cap;
  }
  if (bad)
    return anna_err(err, errlen, ANNA_EINVAL, "no Hub cache folder (set HF_HOME or HF_HUB_CACHE)");
  return 0;
}

static int mkdir_p(const char *path) {
  char tmp[HUB_PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return -1;
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
    *p = '/';
  }
  return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

/* Reads a short text file (a ref, a token) into out, trailing whitespace trimmed. */
static int read_small(const char *path, char *out, size_t cap) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  size_t n = fread(out, 1, cap - 1, f);
  fclose(f);
  out[n] = 0;
  while (n && isspace((unsigned char)out[n - 1]))
    out[--n] = 0;
  return n ? 0 : -1;
}

static int write_small(const char *path, const char *s) {
  char tmp[HUB_PATH_MAX + 16];
  if (pathf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid())) return -1;
  FILE *f = fopen(tmp, "wb");
  if (!f) return -1;
  int bad = fputs(s, f) < 0;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path)) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

static int is_hex(const char *s, size_t n) {
  if (strlen(s) != n) return 0;
  for (size_t i = 0; i < n; i++)
    if (!isxdigit((unsigned char)s[i])) return 0;
  return 1;
}

/* The snapshot entry points at the blob through a relative link, as huggingface_hub makes it:
 * snapshots/COMMIT/a/b.txt -> ../../../blobs/ETAG. */
static int snapshot_link(const char *repo_dir, const char *commit, const char *file,
                         const char *etag) {
  char dst[HUB_PATH_MAX], target[HUB_PATH_MAX];
  if (snprintf(dst, sizeof dst, "%s/snapshots/%s/%s", repo_dir, commit, file) >= (int)sizeof dst)
    return -1;
  char *slash = strrchr(dst, '/');
  *slash = 0;
  if (mkdir_p(dst)) return -1;
  *slash = '/';
  size_t up = 2;
  for (const char *p = file; *p; p++)
    up += *p == '/';
  target[0] = 0;
  for (size_t i = 0; i < up; i++)
    strcat(target, "../");
  if (strlen(target) + strlen(etag) + 8 >= sizeof target) return -1;
  strcat(target, "blobs/");
  strcat(target, etag);
  char cur[HUB_PATH_MAX];
  ssize_t n = readlink(dst, cur, sizeof cur - 1);
  if (n >= 0) {
    cur[n] = 0;
    if (!strcmp(cur, target)) return 0;
  }
  unlink(dst);
  return symlink(target, dst);
}

/* A GGUF file of a quantization tag, as llama.cpp's -hf ORG/NAME:TAG picks one: a *.gguf whose
 * name holds TAG (any case) as a whole field ("x-Q4_K_M.gguf" for Q4_K_M, not for Q4_K), not a
 * vision projector (mmproj*). */
static int gguf_match(const char *path, const char *tag) {
  const size_t n = strlen(path), tn = strlen(tag);
  if (n < 5 || strcmp(path + n - 5, ".gguf") || !tn) return 0;
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (!strncasecmp(base, "mmproj", 6)) return 0;
  for (const char *p = base; (p = strcasestr(p, tag)) != NULL; p++) {
    const char before = p == base ? '-' : p[-1], after = p[tn];
    if (strchr("-._", before) && (after == '-' || after == '.')) return 1;
  }
  return 0;
}

/* A spec's FILE part is a tag (Q4_K_M) rather than a file name when it has no '.' or '/'. */
static int is_tag(const char *file) {
  return *file && !strchr(file, '.') && !strchr(file, '/');
}

#define HUB_DEFAULT_TAG "Q4_K_M" /* llama.cpp's -hf default for a GGUF repo named alone */

/* ---- token ------------------------------------------------------------------------------- */

static void token_find(const hub_options *o, char *out, size_t cap) {
  out[0] = 0;
  if (o->token) {
    snprintf(out, cap, "%s", o->token);
    return;
  }
  const char *t = env("HF_TOKEN") ? env("HF_TOKEN") : env("HUGGING_FACE_HUB_TOKEN");
  if (t) {
    snprintf(out, cap, "%s", t);
    return;
  }
  char path[HUB_PATH_MAX];
  const char *tp = env("HF_TOKEN_PATH");
  if (tp)
    snprintf(path, sizeof path, "%s", tp);
  else if (hf_home(path, sizeof path - 8) == 0)
    strcat(path, "/token");
  else
    return;
  if (read_small(path, out, cap)) out[0] = 0;
}

#ifdef ANNA_HAVE_CURL

/* ---- HTTP -------------------------------------------------------------------------------- */

typedef struct hdrs {
  long status;
  char etag[160], linked_etag[160], commit[64], location[2048], err_code[64], err_msg[256];
  long long linked_size, content_length;
} hdrs;

static void hdr_value(char *dst, size_t cap, const char *v, size_t n) {
  while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
    n--;
  while (n && *v == ' ')
    v++, n--;
  if (n >= cap) n = cap - 1;
  memcpy(dst, v, n);
  dst[n] = 0;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *ud) {
  hdrs *h = ud;
  const size_t n = sz * nm;
  if (n > 5 && !strncmp(p, "HTTP/", 5)) { /* a new response (after a redirect or a 100) */
    memset(h, 0, sizeof *h);
    h->linked_size = h->content_length = -1;
    const char *sp = memchr(p, ' ', n);
    if (sp) h->status = strtol(sp + 1, NULL, 10);
    return n;
  }
  const char *c = memchr(p, ':', n);
  if (!c) return n;
  const size_t kn = (size_t)(c - p), vn = n - kn - 1;
  const char *v = c + 1;
  char tmp[32];
#define IS(name) (kn == strlen(name) && !strncasecmp(p, name, kn))
  if (IS("etag"))
    hdr_value(h->etag, sizeof h->etag, v, vn);
  else if (IS("x-linked-etag"))
    hdr_value(h->linked_etag, sizeof h->linked_etag, v, vn);
  else if (IS("x-repo-commit"))
    hdr_value(h->commit, sizeof h->commit, v, vn);
  else if (IS("location"))
    hdr_value(h->location, sizeof h->location, v, vn);
  else if (IS("x-error-code"))
    hdr_value(h->err_code, sizeof h->err_code, v, vn);
  else if (IS("x-error-message"))
    hdr_value(h->err_msg, sizeof h->err_msg, v, vn);
  else if (IS("x-linked-size")) {
    hdr_value(tmp, sizeof tmp, v, vn);
    h->linked_size = strtoll(tmp, NULL, 10);
  } else if (IS("content-length")) {
    hdr_value(tmp, sizeof tmp, v, vn);
    h->content_length = strtoll(tmp, NULL, 10);
  }
#undef IS
  return n;
}

/* An ETag as huggingface_hub normalises it: no weak marker, no quotes. */
static void etag_norm(char *e) {
  char *s = e;
  if (!strncmp(s, "W/", 2)) s += 2;
  size_t n = strlen(s);
  if (n >= 2 && s[0] == '"' && s[n - 1] == '"') {
    s++;
    n -= 2;
  }
  memmove(e, s, n);
  e[n] = 0;
}

typedef struct hub_ctx {
  const hub_options *o;
  char endpoint[1024];
  char token[512];
  char auth[600];
  char host[256]; /* the endpoint's host: the token goes there only */
} hub_ctx;

/* A handle with what every request shares. The token rides in a header that curl drops when a
 * redirect leaves the host (CURLOPT_UNRESTRICTED_AUTH stays off). */
static CURL *easy_new(hub_ctx *hc, struct curl_slist **hl) {
  CURL *c = curl_easy_init();
  if (!c) return NULL;
  *hl = NULL;
  *hl = curl_slist_append(*hl, "User-Agent: anna/1.0; hf_hub-compatible");
  if (hc->auth[0]) *hl = curl_slist_append(*hl, hc->auth);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, *hl);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
  /* A stalled transfer (under 1 KB/s for 60 s) is an error to retry, not a hang. */
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  return c;
}

static int http_status_err(const char *what, const char *url, const hdrs *h, int have_token,
                           char *err, size_t errlen) {
  const char *msg = h->err_msg[0] ? h->err_msg : "";
  if (h->status == 401 || h->status == 403) {
    if (!have_token)
      return anna_err(
          err, errlen, ANNA_EIO,
          "%s: HTTP %ld from %s: the repo is gated or private; set HF_TOKEN (or log in with "
          "`hf auth login`) %s",
          what, h->status, url, msg);
    return anna_err(err, errlen, ANNA_EIO,
                    "%s: HTTP %ld from %s: the token was refused (no access to this repo?) %s",
                    what, h->status, url, msg);
  }
  if (h->status == 404)
    return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: not found (HTTP 404%s%s) at %s %s", what,
                    h->err_code[0] ? ", " : "", h->err_code, url, msg);
  return anna_err(err, errlen, ANNA_EIO, "%s: HTTP %ld from %s %s", what, h->status, url, msg);
}

typedef struct membuf {
  char *p;
  size_t n, cap;
} membuf;

static size_t on_mem(char *p, size_t sz, size_t nm, void *ud) {
  membuf *m = ud;
  const size_t k = sz * nm;
  if (m->n + k + 1 > m->cap) {
    if (m->n + k + 1 > (64u << 20)) return 0; /* a file listing is never this big */
    size_t cap = (m->n + k + 1) * 2;
    char *q = realloc(m->p, cap);
    if (!q) return 0;
    m->p = q;
    m->cap = cap;
  }
  memcpy(m->p + m->n, p, k);
  m->n += k;
  m->p[m->n] = 0;
  return k;
}

/* GET url into *out (caller frees). */
static int http_get_mem(hub_ctx *hc, const char *what, const char *url, membuf *out, char *err,
                        size_t errlen) {
  struct curl_slist *hl;
  CURL *c = easy_new(hc, &hl);
  if (!c) return anna_err(err, errlen, ANNA_ENOMEM, "curl_easy_init failed");
  hdrs h = {.linked_size = -1, .content_length = -1};
  memset(out, 0, sizeof *out);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &h);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_mem);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
  CURLcode cr = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &h.status);
  curl_easy_cleanup(c);
  curl_slist_free_all(hl);
  int rc = 0;
  if (cr != CURLE_OK)
    rc = anna_err(err, errlen, ANNA_EIO, "%s: %s (%s)", what, curl_easy_strerror(cr), url);
  else if (h.status != 200)
    rc = http_status_err(what, url, &h, hc->token[0] != 0, err, errlen);
  if (rc) {
    free(out->p);
    memset(out, 0, sizeof *out);
  }
  return rc;
}

/* HEAD of a resolve URL without following the CDN redirect: the Hub puts the commit, the
 * linked ETag (sha256 of an LFS file) and its size on the redirect itself. */
static int http_head(hub_ctx *hc, const char *what, const char *url0, hdrs *h, char *err,
                     size_t errlen) {
  char url[4096];
  snprintf(url, sizeof url, "%s", url0);
  for (int hop = 0; hop < 5; hop++) {
    struct curl_slist *hl;
    CURL *c = easy_new(hc, &hl);
    if (!c) return anna_err(err, errlen, ANNA_ENOMEM, "curl_easy_init failed");
    memset(h, 0, sizeof *h);
    h->linked_size = h->content_length = -1;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    CURLcode cr = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &h->status);
    curl_easy_cleanup(c);
    curl_slist_free_all(hl);
    if (cr != CURLE_OK)
      return anna_err(err, errlen, ANNA_EIO, "%s: %s (%s)", what, curl_easy_strerror(cr), url);
    /* Relative redirects (a renamed repo, the Hub's resolve cache) lead to the real answer, as
     * huggingface_hub follows them; an absolute one is the CDN and carries the metadata. */
    if (h->status >= 300 && h->status < 400 && h->location[0] == '/') {
      char next[4096];
      if (snprintf(next, sizeof next, "%s%s", hc->endpoint, h->location) >= (int)sizeof next)
        return anna_err(err, errlen, ANNA_EIO, "%s: redirect too long", what);
      memcpy(url, next, sizeof url);
      continue;
    }
    if (h->status == 200 || (h->status >= 300 && h->status < 400)) return 0;
    return http_status_err(what, url, h, hc->token[0] != 0, err, errlen);
  }
  return anna_err(err, errlen, ANNA_EIO, "%s: too many redirects from %s", what, url0);
}

/* ---- download of one blob ---------------------------------------------------------------- */

typedef struct dl {
  FILE *f;
  const char *name;
  long long base, total; /* bytes already on disk before this transfer, expected size */
  int bar, restarted;
  double t0, last;
  hdrs *h; /* the headers of the response being received (its status) */
} dl;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t on_file(char *p, size_t sz, size_t nm, void *ud) {
  dl *d = ud;
  const size_t k = sz * nm;
  if (d->h->status < 200 || d->h->status > 299) return k; /* an error page is no part of a blob */
  if (d->h->status == 200 && d->base && !d->restarted) {
    /* The server ignored the Range and sends the whole file: drop what was on disk. */
    if (fflush(d->f) || ftruncate(fileno(d->f), 0) || fseek(d->f, 0, SEEK_SET)) return 0;
    d->restarted = 1;
    d->base = 0;
  }
  return fwrite(p, 1, k, d->f) == k ? k : 0;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow) {
  dl *d = ud;
  if (!d->bar) return 0;
  const double t = now_s();
  if (t - d->last < 0.2 && dlnow < dltotal) return 0;
  d->last = t;
  const long long have = d->base + (long long)dlnow;
  const long long tot = d->total > 0 ? d->total : d->base + (long long)dltotal;
  const double frac = tot > 0 ? (double)have / (double)tot : 0;
  char bar[31];
  int fill = (int)(frac * 30 + 0.5);
  if (fill > 30) fill = 30;
  if (fill < 0) fill = 0;
  memset(bar, '#', (size_t)fill);
  memset(bar + fill, '.', (size_t)(30 - fill));
  bar[30] = 0;
  const double rate = t > d->t0 ? (double)dlnow / (t - d->t0) : 0;
  fprintf(stderr, "\r%-32.32s [%s] %3d%% %8.1f/%.1f MB %6.1f MB/s", d->name, bar, (int)(frac * 100),
          have / 1e6, tot / 1e6, rate / 1e6);
  return 0;
}

/* sha256 (64 hex) or, for a 40-hex ETag, the git blob sha1 ("blob SIZE\0" + bytes). */
static int file_digest(const char *path, int git_sha1, char *hex, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) return anna_err(err, errlen, ANNA_EIO, "cannot read %s: %s", path, strerror(errno));
  EVP_MD_CTX *m = EVP_MD_CTX_new();
  if (!m || !EVP_DigestInit_ex(m, git_sha1 ? EVP_sha1() : EVP_sha256(), NULL)) {
    fclose(f);
    EVP_MD_CTX_free(m);
    return anna_err(err, errlen, ANNA_ENOMEM, "no digest context");
  }
  if (git_sha1) {
    struct stat st;
    char pre[64];
    fstat(fileno(f), &st);
    int n = snprintf(pre, sizeof pre, "blob %lld", (long long)st.st_size);
    EVP_DigestUpdate(m, pre, (size_t)n + 1); /* with the NUL */
  }
  static const size_t BUF = 1 << 20;
  unsigned char *buf = malloc(BUF);
  size_t n;
  int rc = 0;
  if (!buf) rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  while (!rc && (n = fread(buf, 1, BUF, f)) > 0)
    EVP_DigestUpdate(m, buf, n);
  if (!rc && ferror(f)) rc = anna_err(err, errlen, ANNA_EIO, "read error on %s", path);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned mdn = 0;
  EVP_DigestFinal_ex(m, md, &mdn);
  for (unsigned i = 0; i < mdn; i++)
    sprintf(hex + 2 * i, "%02x", md[i]);
  hex[2 * mdn] = 0;
  free(buf);
  EVP_MD_CTX_free(m);
  fclose(f);
  return rc;
}

/* Downloads url into blob_path (through blob_path.incomplete, resumed when present), checks
 * size and digest against etag, and renames into place. */
static int blob_download(hub_ctx *hc, const char *name, const char *url, const char *blob_path,
                         const char *etag, long long size, char *err, size_t errlen) {
  char part[HUB_PATH_MAX + 16];
  snprintf(part, sizeof part, "%s.incomplete", blob_path);
  const int retries = hc->o->retries >= 0 ? hc->o->retries : 3;
  const int bar = hc->o->progress >= 0 ? hc->o->progress : isatty(2);
  int rc = 0;
  for (int attempt = 0;; attempt++) {
    struct stat st;
    long long have = stat(part, &st) == 0 ? (long long)st.st_size : 0;
    if (size >= 0 && have > size) { /* not a prefix of this blob: start over */
      unlink(part);
      have = 0;
    }
    if (!hc->o->quiet && !bar)
      fprintf(stderr, "hub: downloading %s (%.1f MB)%s\n", name, size >= 0 ? size / 1e6 : 0.0,
              have ? " resuming" : "");
    FILE *f = fopen(part, have ? "ab" : "wb");
    if (!f) return anna_err(err, errlen, ANNA_EIO, "cannot write %s: %s", part, strerror(errno));
    hdrs h = {.linked_size = -1, .content_length = -1};
    dl d = {.f = f, .name = name, .base = have, .total = size, .bar = bar, .t0 = now_s(), .h = &h};
    struct curl_slist *hl;
    CURL *c = easy_new(hc, &hl);
    if (!c) {
      fclose(f);
      return anna_err(err, errlen, ANNA_ENOMEM, "curl_easy_init failed");
    }
    char range[64];
    if (have && (size < 0 || have < size)) {
      snprintf(range, sizeof range, "%lld-", have);
      curl_easy_setopt(c, CURLOPT_RANGE, range);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_file);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &d);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &d);
    CURLcode cr = CURLE_OK;
    if (have && size >= 0 && have == size) {
      /* Complete already (a crash between download and rename): only verify. */
    } else {
      cr = curl_easy_perform(c);
    }
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(hl);
    if (fclose(f)) cr = cr == CURLE_OK ? CURLE_WRITE_ERROR : cr;
    if (bar) fputc('\n', stderr);
    if (status == 416) { /* our prefix is the whole file or not this file's: start over */
      unlink(part);
      if (attempt < retries) continue;
    }
    if (cr == CURLE_OK && status != 200 && status != 206 && !(have && size >= 0 && have == size)) {
      hdrs hs = h;
      hs.status = status;
      return http_status_err(name, url, &hs, hc->token[0] != 0, err, errlen);
    }
    if (cr != CURLE_OK) {
      if (attempt < retries &&
          (cr == CURLE_PARTIAL_FILE || cr == CURLE_RECV_ERROR || cr == CURLE_OPERATION_TIMEDOUT ||
           cr == CURLE_COULDNT_CONNECT || cr == CURLE_GOT_NOTHING || cr == CURLE_SEND_ERROR)) {
        if (!hc->o->quiet) fprintf(stderr, "hub: %s: %s, retrying\n", name, curl_easy_strerror(cr));
        sleep((unsigned)(attempt < 3 ? 1 << attempt : 8));
        continue;
      }
      return anna_err(err, errlen, ANNA_EIO,
                      "%s: %s (%s); the partial file %s resumes on the next run", name,
                      curl_easy_strerror(cr), url, part);
    }
    break;
  }
  struct stat st;
  if (stat(part, &st)) return anna_err(err, errlen, ANNA_EIO, "%s vanished", part);
  if (size >= 0 && (long long)st.st_size != size) {
    unlink(part);
    return anna_err(err, errlen, ANNA_EFORMAT,
                    "%s: got %lld bytes, the Hub says %lld; removed, try again", name,
                    (long long)st.st_size, size);
  }
  const int sha256 = is_hex(etag, 64), sha1 = is_hex(etag, 40);
  if (sha256 || sha1) {
    char hex[2 * EVP_MAX_MD_SIZE + 1];
    if ((rc = file_digest(part, sha1, hex, err, errlen))) return rc;
    if (strcasecmp(hex, etag)) {
      unlink(part);
      return anna_err(err, errlen, ANNA_EFORMAT,
                      "%s: checksum mismatch (%s %s, expected %s); the download was removed", name,
                      sha1 ? "git-sha1" : "sha256", hex, etag);
    }
  }
  if (rename(part, blob_path))
    return anna_err(err, errlen, ANNA_EIO, "cannot rename %s: %s", part, strerror(errno));
  return 0;
}

/* URL-escapes a path, keeping '/' (file names with spaces, '#', '?'). */
static int url_path(const char *s, char *out, size_t cap) {
  static const char hexd[] = "0123456789ABCDEF";
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (o + 4 >= cap) return -1;
    if (isalnum(*p) || strchr("/-._~", *p)) {
      out[o++] = (char)*p;
    } else {
      out[o++] = '%';
      out[o++] = hexd[*p >> 4];
      out[o++] = hexd[*p & 15];
    }
  }
  out[o] = 0;
  return 0;
}

/* Brings one file of the repo at commit (or rev when commit is "") into the cache; *commit_out
 * gets the commit the Hub served it from. */
static int file_fetch(hub_ctx *hc, const char *repo, const char *repo_dir, const char *rev,
                      const char *file, char *commit_out, char *err, size_t errlen) {
  char fe[2048], url[4096], what[1200];
  if (url_path(file, fe, sizeof fe))
    return anna_err(err, errlen, ANNA_EINVAL, "file name too long");
  snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", hc->endpoint, repo, rev, fe);
  snprintf(what, sizeof what, "%s:%s@%s", repo, file, rev);
  hdrs h;
  int rc = http_head(hc, what, url, &h, err, errlen);
  if (rc) return rc;
  char etag[160];
  snprintf(etag, sizeof etag, "%s", h.linked_etag[0] ? h.linked_etag : h.etag);
  etag_norm(etag);
  if (!h.commit[0] || !etag[0] || strchr(etag, '/') || !strcmp(etag, "..") || !strcmp(etag, "."))
    return anna_err(
        err, errlen, ANNA_EFORMAT,
        "%s: the server sent no X-Repo-Commit / ETag (is %s a Hugging Face Hub endpoint?)", what,
        hc->endpoint);
  if (!is_hex(h.commit, 40)) /* it names a snapshot folder: nothing but a git commit id */
    return anna_err(err, errlen, ANNA_EFORMAT, "%s: X-Repo-Commit '%.60s' is not a commit id", what,
                    h.commit);
  snprintf(commit_out, 64, "%s", h.commit);
  const long long size = h.linked_size >= 0 ? h.linked_size : h.content_length;
  char blobs[HUB_PATH_MAX], blob[HUB_PATH_MAX], lockdir[HUB_PATH_MAX], lock[HUB_PATH_MAX];
  snprintf(blobs, sizeof blobs, "%s/blobs", repo_dir);
  if (snprintf(blob, sizeof blob, "%s/%s", blobs, etag) >= (int)sizeof blob)
    return anna_err(err, errlen, ANNA_EINVAL, "cache path too long");
  /* huggingface_hub's lock folder, so two processes (anna or Python) never write one blob. */
  char root[HUB_PATH_MAX];
  snprintf(root, sizeof root, "%s", repo_dir);
  char *base = strrchr(root, '/');
  *base++ = 0;
  if (pathf(lockdir, sizeof lockdir, "%s/.locks/%s", root, base) ||
      pathf(lock, sizeof lock, "%s/%s.lock", lockdir, etag))
    return anna_err(err, errlen, ANNA_EINVAL, "cache path too long");
  if (mkdir_p(blobs) || mkdir_p(lockdir))
    return anna_err(err, errlen, ANNA_EIO, "cannot create %s: %s", blobs, strerror(errno));
  int lfd = open(lock, O_RDWR | O_CREAT, 0644);
  if (lfd < 0) return anna_err(err, errlen, ANNA_EIO, "cannot open %s: %s", lock, strerror(errno));
  flock(lfd, LOCK_EX);
  struct stat st;
  if (stat(blob, &st) || (size >= 0 && (long long)st.st_size != size)) {
    /* Downloaded by commit, not by branch, so a push between HEAD and GET cannot mix files. */
    char curl_url[4096];
    snprintf(curl_url, sizeof curl_url, "%s/%s/resolve/%s/%s", hc->endpoint, repo, h.commit, fe);
    rc = blob_download(hc, file, curl_url, blob, etag, size, err, errlen);
  }
  if (!rc && snapshot_link(repo_dir, h.commit, file, etag))
    rc = anna_err(err, errlen, ANNA_EIO, "cannot link %s into snapshots/%s: %s", file, h.commit,
                  strerror(errno));
  flock(lfd, LOCK_UN);
  close(lfd);
  return rc;
}

/* What a folder download takes from a repo's file list: the top-level files a model load
 * reads (config, weights, tokenizer, template, processor), not other formats' weights. */
static int folder_wants(const char *f) {
  if (strchr(f, '/')) return 0;
  const char *dot = strrchr(f, '.');
  if (!dot) return 0;
  return !strcmp(dot, ".json") || !strcmp(dot, ".safetensors") || !strcmp(dot, ".jinja") ||
         !strcmp(f, "merges.txt") || !strcmp(f, "vocab.txt") || !strcmp(f, "tokenizer.model");
}

/* The repo's commit at rev and its file list (*root: caller json_decref's). */
static int listing_get(hub_ctx *hc, const char *repo, const char *rev, json_t **root,
                       const char **sha, json_t **sib, char *err, size_t errlen) {
  char url[4096], what[512];
  snprintf(url, sizeof url, "%s/api/models/%s/revision/%s", hc->endpoint, repo, rev);
  snprintf(what, sizeof what, "%s@%s (file list)", repo, rev);
  membuf m;
  int rc = http_get_mem(hc, what, url, &m, err, errlen);
  if (rc) return rc;
  json_error_t je;
  *root = json_loadb(m.p, m.n, 0, &je);
  free(m.p);
  *sha = *root ? json_string_value(json_object_get(*root, "sha")) : NULL;
  *sib = *root ? json_object_get(*root, "siblings") : NULL;
  if (!*sha || !is_hex(*sha, 40) || !json_is_array(*sib)) {
    json_decref(*root);
    *root = NULL;
    return anna_err(err, errlen, ANNA_EFORMAT,
                    "%s: the listing from %s has no commit sha / siblings", what, url);
  }
  return 0;
}

/* The one GGUF of sib matching tag into out; an error naming the GGUF files otherwise. */
static int gguf_pick(const char *repo, json_t *sib, const char *tag, char *out, size_t cap,
                     char *err, size_t errlen) {
  size_t i, nmatch = 0, ngguf = 0;
  json_t *s;
  char all[600] = "";
  out[0] = 0;
  json_array_foreach(sib, i, s) {
    const char *f = json_string_value(json_object_get(s, "rfilename"));
    if (!f || !file_ok(f)) continue;
    const size_t n = strlen(f);
    if (n < 5 || strcmp(f + n - 5, ".gguf")) continue;
    if (ngguf++ < 8 && strlen(all) + n + 3 < sizeof all) {
      if (all[0]) strcat(all, ", ");
      strcat(all, f);
    }
    if (gguf_match(f, tag) && nmatch++ == 0 && n < cap) strcpy(out, f);
  }
  if (nmatch == 1 && out[0]) return 0;
  if (nmatch > 1)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "%s: %zu GGUF files match '%s' (split GGUF files are not supported; name one "
                    "as %s:FILE): %s%s",
                    repo, nmatch, tag, repo, all, ngguf > 8 ? ", ..." : "");
  return anna_err(err, errlen, ANNA_ENOTFOUND, "%s: no GGUF file for '%s'%s%s%s", repo, tag,
                  ngguf ? " (name one as ORG/NAME:FILE or a tag; it has: " : "", all,
                  ngguf ? (ngguf > 8 ? ", ...)" : ")") : "");
}

/* ORG/NAME:TAG: the GGUF of that quantization; *picked gets its file name. */
static int tag_fetch(hub_ctx *hc, const char *repo, const char *repo_dir, const char *rev,
                     const char *tag, char *picked, size_t cap, char *commit_out, char *err,
                     size_t errlen) {
  json_t *root, *sib;
  const char *sha;
  int rc = listing_get(hc, repo, rev, &root, &sha, &sib, err, errlen);
  if (rc) return rc;
  if (!(rc = gguf_pick(repo, sib, tag, picked, cap, err, errlen)))
    rc = file_fetch(hc, repo, repo_dir, sha, picked, commit_out, err, errlen);
  json_decref(root);
  return rc;
}

/* ORG/NAME: the files a model folder needs. A repo of GGUF files only gives its Q4_K_M file
 * instead (as llama.cpp's -hf does), *picked its name. */
static int folder_fetch(hub_ctx *hc, const char *repo, const char *repo_dir, const char *rev,
                        char *picked, size_t cap, char *commit_out, char *err, size_t errlen) {
  json_t *root, *sib;
  const char *sha;
  int rc = listing_get(hc, repo, rev, &root, &sha, &sib, err, errlen);
  if (rc) return rc;
  snprintf(commit_out, 64, "%s", sha);
  size_t i, nwant = 0, nsafe = 0, ngguf = 0;
  json_t *s;
  json_array_foreach(sib, i, s) {
    const char *f = json_string_value(json_object_get(s, "rfilename"));
    if (!f) continue;
    size_t n = strlen(f);
    if (n > 12 && !strcmp(f + n - 12, ".safetensors")) nsafe++;
    if (n > 5 && !strcmp(f + n - 5, ".gguf")) ngguf++;
  }
  if (!nsafe && ngguf) {
    if (!(rc = gguf_pick(repo, sib, HUB_DEFAULT_TAG, picked, cap, err, errlen)))
      rc = file_fetch(hc, repo, repo_dir, sha, picked, commit_out, err, errlen);
    json_decref(root);
    return rc;
  }
  json_array_foreach(sib, i, s) {
    const char *f = json_string_value(json_object_get(s, "rfilename"));
    if (!f || !file_ok(f) || !folder_wants(f)) continue;
    char got[64];
    nwant++;
    if ((rc = file_fetch(hc, repo, repo_dir, sha, f, got, err, errlen))) break;
  }
  json_decref(root);
  if (!rc && !nwant)
    rc = anna_err(err, errlen, ANNA_ENOTFOUND,
                  "%s@%s has no model files (config.json, *.safetensors)", repo, rev);
  return rc;
}

static void ctx_init(hub_ctx *hc, const hub_options *o) {
  memset(hc, 0, sizeof *hc);
  hc->o = o;
  const char *ep = o->endpoint          ? o->endpoint
                   : env("HF_ENDPOINT") ? env("HF_ENDPOINT")
                                        : "https://huggingface.co";
  snprintf(hc->endpoint, sizeof hc->endpoint, "%s", ep);
  size_t n = strlen(hc->endpoint);
  while (n && hc->endpoint[n - 1] == '/')
    hc->endpoint[--n] = 0;
  token_find(o, hc->token, sizeof hc->token);
  if (hc->token[0]) snprintf(hc->auth, sizeof hc->auth, "Authorization: Bearer %s", hc->token);
}
#endif /* ANNA_HAVE_CURL */

/* ---- offline lookup and the entry point -------------------------------------------------- */

/* Offline: the cached path of file (a name, a tag, or "" for the folder) at rev. A tag, or a
 * folder without config.json (a GGUF repo named alone, HUB_DEFAULT_TAG), is looked for among
 * the snapshot's GGUF files: exactly one must match. */
static int cached_path(const char *repo_dir, const char *rev, const char *file, char *out,
                       size_t cap) {
  char commit[128], p[HUB_PATH_MAX];
  if (is_hex(rev, 40)) {
    snprintf(commit, sizeof commit, "%s", rev);
  } else {
    if (pathf(p, sizeof p, "%s/refs/%s", repo_dir, rev)) return -1;
    if (read_small(p, commit, sizeof commit) || strchr(commit, '/')) return -1;
  }
  const int tag = is_tag(file);
  if (pathf(p, sizeof p, "%s/snapshots/%s%s%s", repo_dir, commit, *file && !tag ? "/" : "",
            tag ? "" : file))
    return -1;
  struct stat st;
  if (stat(p, &st)) return -1;
  char q[HUB_PATH_MAX + 16];
  if (!*file && pathf(q, sizeof q, "%s/config.json", p) == 0 && stat(q, &st) == 0) {
    /* a folder counts when it holds a config */
  } else if (tag || !*file) {
    DIR *d = opendir(p);
    if (!d) return -1;
    const char *want = tag ? file : HUB_DEFAULT_TAG;
    int nmatch = 0;
    struct dirent *e;
    char hit[1024] = "";
    while ((e = readdir(d)) != NULL)
      if (gguf_match(e->d_name, want) && nmatch++ == 0) snprintf(hit, sizeof hit, "%s", e->d_name);
    closedir(d);
    if (nmatch != 1) return -1;
    size_t n = strlen(p);
    if (n + 1 + strlen(hit) >= sizeof p) return -1;
    p[n] = '/';
    strcpy(p + n + 1, hit);
  }
  if (strlen(p) >= cap) return -1;
  strcpy(out, p);
  return 0;
}

int hub_fetch(const char *spec, const hub_options *opt, char **path_out, char *err, size_t errlen) {
  static const hub_options defaults = {.offline = -1, .progress = -1, .retries = -1};
  const hub_options *o = opt ? opt : &defaults;
  *path_out = NULL;
  char repo[256], file[1024], root[HUB_PATH_MAX], repo_dir[HUB_PATH_MAX], path[HUB_PATH_MAX];
  int rc = hub_spec_parse(spec, repo, sizeof repo, file, sizeof file, err, errlen);
  if (rc) return rc;
  const char *rev = o->revision && *o->revision ? o->revision : "main";
  if (!file_ok(rev) || strlen(rev) > 200)
    return anna_err(err, errlen, ANNA_EINVAL, "bad revision '%.100s'", rev);
  if ((rc = cache_root(o, root, sizeof root, err, errlen))) return rc;
  char flat[256];
  snprintf(flat, sizeof flat, "%s", repo);
  *strchr(flat, '/') = 0;
  if (snprintf(repo_dir, sizeof repo_dir, "%s/models--%s--%s", root, flat, strchr(repo, '/') + 1) >=
      (int)sizeof repo_dir)
    return anna_err(err, errlen, ANNA_EINVAL, "cache path too long");
  const int offline = o->offline >= 0 ? o->offline : env_true("HF_HUB_OFFLINE");
  if (offline) {
    if (cached_path(repo_dir, rev, file, path, sizeof path))
      return anna_err(err, errlen, ANNA_ENOTFOUND,
                      "%s%s%s@%s is not in the Hub cache %s (HF_HUB_OFFLINE is set)", repo,
                      *file ? ":" : "", file, rev, root);
  } else {
#ifdef ANNA_HAVE_CURL
    hub_ctx hc;
    ctx_init(&hc, o);
    char commit[64] = "", picked[1024] = "";
    if (is_tag(file))
      rc = tag_fetch(&hc, repo, repo_dir, rev, file, picked, sizeof picked, commit, err, errlen);
    else if (*file)
      rc = file_fetch(&hc, repo, repo_dir, rev, file, commit, err, errlen);
    else
      rc = folder_fetch(&hc, repo, repo_dir, rev, picked, sizeof picked, commit, err, errlen);
    if (rc) return rc;
    const char *got = picked[0] ? picked : file;
    char refs[HUB_PATH_MAX], ref[HUB_PATH_MAX + 256];
    if (pathf(refs, sizeof refs, "%s/refs", repo_dir))
      return anna_err(err, errlen, ANNA_EINVAL, "cache path too long");
    if (strcmp(rev, commit)) {
      if (pathf(ref, sizeof ref, "%s/%s", refs, rev))
        return anna_err(err, errlen, ANNA_EINVAL, "cache path too long");
      char *sl = strrchr(ref, '/');
      *sl = 0;
      int bad = mkdir_p(ref);
      *sl = '/';
      if (bad || write_small(ref, commit))
        return anna_err(err, errlen, ANNA_EIO, "cannot write %s: %s", ref, strerror(errno));
    }
    if (pathf(path, sizeof path, "%s/snapshots/%s%s%s", repo_dir, commit, *got ? "/" : "", got))
      return anna_err(err, errlen, ANNA_EINVAL, "cache path too long");
#else
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "this build has no libcurl (libcurl4-openssl-dev): Hub downloads are off; "
                    "HF_HUB_OFFLINE=1 reads the cache");
#endif
  }
  *path_out = strdup(path);
  return *path_out ? 0 : anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
}
