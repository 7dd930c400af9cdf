/* webui.h: the chat page anna-serve serves at "/" (web/index.html, web/app.js, web/app.css,
 * compiled into the binary by cmake/embed_file.cmake: no file is read at run time).
 *
 * webui_route answers GET/HEAD of "/", "/index.html", "/app.js" and "/app.css" and returns 1;
 * for any other path it does nothing and returns 0 (the caller routes it on). Every answer
 * carries a strict Content-Security-Policy (default-src 'self', no inline script or style,
 * no frames, no plugins), X-Content-Type-Options: nosniff, a strong ETag and
 * "Cache-Control: no-cache" (revalidate: the page changes with the binary), and a matching
 * If-None-Match gets 304. A method other than GET/HEAD on those paths is a 405.
 * *ret gets MHD's result and *status the HTTP status (for the access log).
 * The page holds no secret, so it is served without an API key; the API calls it makes carry
 * the key the user enters. */
#ifndef ANNA_SERVER_WEBUI_H
#define ANNA_SERVER_WEBUI_H

#include <microhttpd.h>

/* The policy sent with every page asset (exposed for tests and the docs). */
extern const char webui_csp[];

int webui_route(struct MHD_Connection *c, const char *method, const char *url, const char *rid,
                enum MHD_Result *ret, int *status);

#endif
