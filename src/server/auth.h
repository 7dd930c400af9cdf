/* auth.h: anna-serve's API keys (--api-key, --api-key-file) and the check of an
 * "Authorization: Bearer KEY" header against them.
 *
 * The key set is built once at startup and is immutable afterwards: any number of
 * connection threads may call auth_check at once. auth_check compares the presented key
 * with every configured key in full, in time that depends only on the lengths of the
 * configured keys and of the header (never on where the first differing byte is, nor on
 * which key matched), so a timing probe cannot learn a key byte by byte.
 */
#ifndef ANNA_SERVER_AUTH_H
#define ANNA_SERVER_AUTH_H

#include <stddef.h>

typedef struct auth_keys auth_keys;

/* Longest key accepted (bytes); longer keys in a flag or file are an error. */
#define AUTH_KEY_MAX 512

/* Builds the key set from n keys (copied) and the file at path (may be NULL: one key per
 * line, surrounding blanks and a trailing CR dropped, blank lines and lines starting with
 * '#' skipped). *out is NULL when no key is configured at all (auth off). A key that is
 * empty, longer than AUTH_KEY_MAX or holds a byte outside 0x21..0x7e, or a file that
 * cannot be read or holds no key: ANNA_EINVAL / ANNA_EIO with err naming it. Caller frees
 * with auth_free. */
int auth_keys_create(auth_keys **out, const char *const *keys, int n, const char *path, char *err,
                     size_t errlen);
void auth_free(auth_keys *k);
int auth_count(const auth_keys *k);

/* 1 when header (the Authorization header's value, may be NULL) is "Bearer KEY" with KEY one
 * of the configured keys; 0 otherwise. A NULL k (auth off) accepts everything. */
int auth_check(const auth_keys *k, const char *header);

#endif
