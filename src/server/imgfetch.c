/* imgfetch.c: see imgfetch.h. */
#include "imgfetch.h"

#include "anna/anna.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifdef ANNA_HAVE_CURL
#include <curl/curl.h>

int imgfetch_available(void) {
  return 1;
}

void imgfetch_global_init(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* host in the comma-separated list: exact (case-insensitive), or "*.d" for subdomains of d. */
static int host_listed(const char *host, const char *list) {
  const size_t hl = strlen(host);
  for (const char *p = list; p && *p;) {
    const char *q = strchr(p, ',');
    size_t n = q ? (size_t)(q - p) : strlen(p);
    if (n == hl && !strncasecmp(p, host, n)) return 1;
    if (n > 2 && p[0] == '*' && p[1] == '.' && hl > n - 1 &&
        !strncasecmp(host + hl - (n - 1), p + 1, n - 1))
      return 1;
    p = q ? q + 1 : NULL;
  }
  return 0;
}

/* Parses url; *u (caller frees with curl_url_cleanup) when it is http(s) on an allowed host. */
static int url_check(const char *url, const imgfetch_limits *l, CURLU **u, char *err,
                     size_t errlen) {
  *u = NULL;
  if (!l->allowed || !*l->allowed)
    return anna_err(err, errlen, ANNA_EINVAL,
                    "this server fetches no remote images (--allowed-image-domains)");
  CURLU *h = curl_url();
  char *scheme = NULL, *host = NULL;
  int rc = 0;
  if (!h) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (curl_url_set(h, CURLUPART_URL, url, 0) || curl_url_get(h, CURLUPART_SCHEME, &scheme, 0) ||
      curl_url_get(h, CURLUPART_HOST, &host, 0))
    rc = anna_err(err, errlen, ANNA_EINVAL, "the image URL does not parse");
  else if (strcasecmp(scheme, "http") && strcasecmp(scheme, "https"))
    rc = anna_err(err, errlen, ANNA_EINVAL, "the image URL's scheme must be http or https");
  else if (!host_listed(host, l->allowed))
    rc = anna_err(err, errlen, ANNA_EINVAL,
                  "host '%.100s' is not among this server's --allowed-image-domains", host);
  curl_free(scheme);
  curl_free(host);
  if (rc)
    curl_url_cleanup(h);
  else
    *u = h;
  return rc;
}

int imgfetch_check(const char *url, const imgfetch_limits *l, char *err, size_t errlen) {
  CURLU *u;
  int rc = url_check(url, l, &u, err, errlen);
  if (!rc) curl_url_cleanup(u);
  return rc;
}

typedef struct sink {
  uint8_t *buf;
  size_t n, cap, max;
  int over;
} sink;

static size_t sink_write(char *p, size_t sz, size_t nm, void *ud) {
  sink *s = ud;
  const size_t k = sz * nm;
  if (k > s->max - s->n) {
    s->over = 1;
    return 0; /* aborts the transfer */
  }
  if (s->n + k > s->cap) {
    size_t nc = s->cap ? s->cap * 2 : 65536;
    while (nc < s->n + k)
      nc *= 2;
    uint8_t *nb = realloc(s->buf, nc);
    if (!nb) return 0;
    s->buf = nb;
    s->cap = nc;
  }
  memcpy(s->buf + s->n, p, k);
  s->n += k;
  return k;
}

int imgfetch_get(const char *url, const imgfetch_limits *l, uint8_t **out, size_t *n, char *err,
                 size_t errlen) {
  *out = NULL;
  *n = 0;
  CURLU *u;
  int rc = url_check(url, l, &u, err, errlen);
  if (rc) return rc;
  CURL *c = curl_easy_init();
  if (!c) {
    curl_url_cleanup(u);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  sink s = {.max = l->max_bytes};
  char cerr[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(c, CURLOPT_CURLU, u); /* the parse the host check saw */
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, l->timeout_s > 0 ? l->timeout_s : 10L);
  curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)l->max_bytes);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink_write);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "anna-serve");
  const CURLcode cc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (s.over || cc == CURLE_FILESIZE_EXCEEDED)
    rc = anna_err(err, errlen, ANNA_EINVAL,
                  "the image at the URL is over %zu bytes (--max-image-bytes)", l->max_bytes);
  else if (cc == CURLE_OPERATION_TIMEDOUT)
    rc = anna_err(err, errlen, ANNA_EINVAL, "fetching the image timed out after %ld s",
                  l->timeout_s);
  else if (cc != CURLE_OK)
    rc = anna_err(err, errlen, ANNA_EINVAL, "fetching the image failed: %s",
                  cerr[0] ? cerr : curl_easy_strerror(cc));
  else if (status != 200)
    rc = anna_err(err, errlen, ANNA_EINVAL,
                  "fetching the image: HTTP status %ld (redirects are not followed)", status);
  curl_easy_cleanup(c);
  curl_url_cleanup(u);
  if (rc) {
    free(s.buf);
    return rc;
  }
  *out = s.buf;
  *n = s.n;
  return 0;
}

#else

int imgfetch_available(void) {
  return 0;
}

void imgfetch_global_init(void) {}

int imgfetch_check(const char *url, const imgfetch_limits *l, char *err, size_t errlen) {
  (void)url;
  (void)l;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "this build has no libcurl: remote images cannot be fetched");
}

int imgfetch_get(const char *url, const imgfetch_limits *l, uint8_t **out, size_t *n, char *err,
                 size_t errlen) {
  (void)url;
  (void)l;
  *out = NULL;
  *n = 0;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "this build has no libcurl: remote images cannot be fetched");
}

#endif
