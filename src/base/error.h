/* error.h: the one error convention of anna.
 *
 * Every call that can fail returns 0 on success or a negative ANNA_E* code, and writes a
 * one-line, human-readable message into a caller-owned buffer (err, errlen). The message
 * names what was wrong (file, tensor, field, flag). errlen may be 0 and err NULL when the
 * caller does not want the text. Library code never exits or aborts on input it did not
 * write itself; only programming errors (broken invariants) may assert.
 */
#ifndef ANNA_BASE_ERROR_H
#define ANNA_BASE_ERROR_H

#include "anna/anna.h"

#include <stddef.h>

/* The status codes (ANNA_OK, ANNA_E*) and anna_status_name are public: anna/anna.h. */

/* anna_err (format a message, return the code) is public too: anna/anna.h. */

/* Prefixes an existing message in err with "prefix: " (for adding context while an error
 * propagates up). Returns code. */
int anna_err_prefix(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Static description of a code ("invalid argument", ...); anna_status_name gives its name. */
const char *anna_strerror(int code);

#endif
