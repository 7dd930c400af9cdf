/* respond.h: one whole response body on a libmicrohttpd connection, the same headers for every
 * route module (http.c, audio_api.c, speech_api.c).
 *
 * http_send_text queues `status` with body (owned: freed whatever happens; NULL = out of
 * memory, sent as a 500 OpenAI error object), Content-Type ctype, X-Request-Id rid, Retry-After
 * on 429 / 503, WWW-Authenticate on 401 and Allow when allow is not NULL; *status_out gets the
 * status sent (for the access log). Returns MHD_NO when nothing could be queued. Implemented in
 * http.c. */
#ifndef ANNA_SERVER_RESPOND_H
#define ANNA_SERVER_RESPOND_H

#include <microhttpd.h>

enum MHD_Result http_send_text(struct MHD_Connection *c, const char *rid, int status, char *body, const char *ctype,
                               const char *allow, int *status_out);

#endif
