/* error.c: message formatting for the anna error convention (see error.h), and
 * anna_status_name (anna.h). */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int anna_err(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

int anna_err_prefix(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (!err || errlen == 0) return code;
  char prefix[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  size_t pl = strlen(prefix), ml = strnlen(err, errlen - 1);
  if (pl + 2 >= errlen) {
    snprintf(err, errlen, "%s", prefix);
    return code;
  }
  size_t keep = ml;
  if (pl + 2 + keep >= errlen) keep = errlen - pl - 3;
  memmove(err + pl + 2, err, keep);
  err[pl + 2 + keep] = '\0';
  memcpy(err, prefix, pl);
  err[pl] = ':';
  err[pl + 1] = ' ';
  return code;
}

const char *anna_strerror(int code) {
  switch (code) {
  case ANNA_OK: return "ok";
  case ANNA_EINVAL: return "invalid argument";
  case ANNA_ENOMEM: return "out of memory";
  case ANNA_EIO: return "i/o error";
  case ANNA_EFORMAT: return "malformed data";
  case ANNA_ENOTFOUND: return "not found";
  case ANNA_EUNSUPPORTED: return "unsupported";
  case ANNA_ERANGE: return "out of range";
  case ANNA_ESTATE: return "invalid state";
  default: return "unknown error";
  }
}

const char *anna_status_name(int code) {
  switch (code) {
  case ANNA_OK: return "ANNA_OK";
  case ANNA_EINVAL: return "ANNA_EINVAL";
  case ANNA_ENOMEM: return "ANNA_ENOMEM";
  case ANNA_EIO: return "ANNA_EIO";
  case ANNA_EFORMAT: return "ANNA_EFORMAT";
  case ANNA_ENOTFOUND: return "ANNA_ENOTFOUND";
  case ANNA_EUNSUPPORTED: return "ANNA_EUNSUPPORTED";
  case ANNA_ERANGE: return "ANNA_ERANGE";
  case ANNA_ESTATE: return "ANNA_ESTATE";
  default: return "ANNA_E?";
  }
}
