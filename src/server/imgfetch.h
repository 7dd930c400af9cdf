/* imgfetch.h: anna-serve's fetch of a chat image_url over http(s) (libcurl), only from hosts the
 * operator named (--allowed-image-domains), size and time limited, no redirects, no proxies from
 * the environment: without the flag the server sends no requests of its own (no server-side
 * request forgery). The host is checked on libcurl's own parse of the URL and that parse is what
 * it connects to, so the check and the request cannot disagree. Not checked: what the allowed
 * names resolve to (an allowed name that resolves to an internal address is the operator's
 * choice). Builds without libcurl refuse every fetch (imgfetch_available 0).
 */
#ifndef ANNA_SERVER_IMGFETCH_H
#define ANNA_SERVER_IMGFETCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct imgfetch_limits {
  const char
      *allowed;     /* comma-separated host names ("*.example.com": its subdomains); NULL: none */
  size_t max_bytes; /* body size limit */
  long timeout_s;   /* whole transfer */
} imgfetch_limits;

/* 1 when this build has libcurl. */
int imgfetch_available(void);
/* libcurl's global init: once, before any thread fetches (no-op without libcurl). */
void imgfetch_global_init(void);
/* 0 when url is http(s) on a host l allows; else ANNA_EINVAL saying why (unparsable, scheme,
 * host not listed) or ANNA_EUNSUPPORTED (no libcurl). Sends nothing. */
int imgfetch_check(const char *url, const imgfetch_limits *l, char *err, size_t errlen);
/* GETs url into *out (caller frees with free()) of *n bytes. ANNA_EINVAL with a message naming
 * the reason (host not allowed, HTTP status, over max_bytes, timeout, network error). */
int imgfetch_get(const char *url, const imgfetch_limits *l, uint8_t **out, size_t *n, char *err,
                 size_t errlen);

#endif
