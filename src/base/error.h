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

#include <stddef.h>

enum anna_status {
  ANNA_OK = 0,
  ANNA_EINVAL = -1,       /* bad argument, flag, or request */
  ANNA_ENOMEM = -2,       /* allocation failed */
  ANNA_EIO = -3,          /* open/read/mmap failed */
  ANNA_EFORMAT = -4,      /* malformed file or data */
  ANNA_ENOTFOUND = -5,    /* missing tensor, key, file */
  ANNA_EUNSUPPORTED = -6, /* valid but not implemented (model type, dtype, op) */
  ANNA_ERANGE = -7,       /* value out of range (context full, id too large) */
  ANNA_ESTATE = -8,       /* call not valid in the current state */
};

/* Formats a message into err (truncated to errlen, always NUL-terminated when errlen > 0)
 * and returns code, so callers can write `return anna_err(err, errlen, ANNA_EIO, ...)`. */
int anna_err(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Prefixes an existing message in err with "prefix: " (for adding context while an error
 * propagates up). Returns code. */
int anna_err_prefix(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Static name of a code ("invalid argument", ...). */
const char *anna_strerror(int code);

#endif
