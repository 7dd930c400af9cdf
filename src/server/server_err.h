/* server_err.h: the anna error convention (anna.h: a message into (err, errlen), the code
 * returned) for the server's files, which use the public header only and so cannot reach the
 * library's internal helper.
 *
 * Contract: formats the message into err (truncated to errlen, NUL-terminated when errlen >
 * 0; err may be NULL when errlen is 0) and returns code, so callers can write
 * `return server_err(err, errlen, ANNA_EINVAL, ...)`. Allocates nothing.
 */
#ifndef ANNA_SERVER_SERVER_ERR_H
#define ANNA_SERVER_SERVER_ERR_H

#include <stddef.h>

int server_err(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
