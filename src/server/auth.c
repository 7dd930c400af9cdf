/* auth.c: API keys (see auth.h). */
#include "auth.h"

#include "anna/anna.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct auth_keys {
  int n;
  char **key;
  size_t *len;
};

static int key_add(auth_keys *k, const char *s, size_t len, const char *where, char *err, size_t errlen) {
  if (len == 0) return anna_err(err, errlen, ANNA_EINVAL, "%s: empty API key", where);
  if (len > AUTH_KEY_MAX)
    return anna_err(err, errlen, ANNA_EINVAL, "%s: API key longer than %d bytes", where, AUTH_KEY_MAX);
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
      return anna_err(err, errlen, ANNA_EINVAL,
                      "%s: API key holds a space, control or non-ASCII byte (0x%02x at offset %zu)", where,
                      (unsigned char)s[i], i);
  char **nk = realloc(k->key, (size_t)(k->n + 1) * sizeof *nk);
  if (!nk) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  k->key = nk;
  size_t *nl = realloc(k->len, (size_t)(k->n + 1) * sizeof *nl);
  if (!nl) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  k->len = nl;
  char *c = malloc(len + 1);
  if (!c) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  memcpy(c, s, len);
  c[len] = '\0';
  k->key[k->n] = c;
  k->len[k->n] = len;
  k->n++;
  return 0;
}

static int load_file(auth_keys *k, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) return anna_err(err, errlen, ANNA_EIO, "--api-key-file %s: %s", path, strerror(errno));
  char line[AUTH_KEY_MAX + 64];
  int lineno = 0, before = k->n, rc = 0;
  while (!rc && fgets(line, sizeof line, f)) {
    lineno++;
    size_t n = strlen(line);
    if (n == sizeof line - 1 && line[n - 1] != '\n' && !feof(f)) {
      rc = anna_err(err, errlen, ANNA_EINVAL, "--api-key-file %s line %d: API key longer than %d bytes", path,
                    lineno, AUTH_KEY_MAX);
      break;
    }
    const char *s = line;
    while (*s == ' ' || *s == '\t')
      s++;
    size_t l = strlen(s);
    while (l && (s[l - 1] == '\n' || s[l - 1] == '\r' || s[l - 1] == ' ' || s[l - 1] == '\t'))
      l--;
    if (!l || *s == '#') continue;
    char where[300];
    snprintf(where, sizeof where, "--api-key-file %.200s line %d", path, lineno);
    rc = key_add(k, s, l, where, err, errlen);
  }
  if (!rc && ferror(f)) rc = anna_err(err, errlen, ANNA_EIO, "--api-key-file %s: read error", path);
  fclose(f);
  if (!rc && k->n == before) rc = anna_err(err, errlen, ANNA_EINVAL, "--api-key-file %s holds no key", path);
  return rc;
}

int auth_keys_create(auth_keys **out, const char *const *keys, int n, const char *path, char *err,
                     size_t errlen) {
  *out = NULL;
  if (n <= 0 && !path) return 0;
  auth_keys *k = calloc(1, sizeof *k);
  if (!k) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  int rc = 0;
  for (int i = 0; !rc && i < n; i++)
    rc = key_add(k, keys[i], strlen(keys[i]), "--api-key", err, errlen);
  if (!rc && path) rc = load_file(k, path, err, errlen);
  if (rc) {
    auth_free(k);
    return rc;
  }
  *out = k;
  return 0;
}

void auth_free(auth_keys *k) {
  if (!k) return;
  for (int i = 0; i < k->n; i++)
    free(k->key[i]);
  free(k->key);
  free(k->len);
  free(k);
}

int auth_count(const auth_keys *k) { return k ? k->n : 0; }

/* Compares the presented bytes p[0, plen) with key in full: every key byte is read whatever
 * plen is (p is indexed modulo its length), and the length difference is folded into the
 * same accumulator instead of returning early. */
static unsigned diff_ct(const unsigned char *p, size_t plen, const unsigned char *key, size_t klen) {
  volatile unsigned acc = (unsigned)(plen != klen);
  for (size_t i = 0; i < klen; i++) {
    unsigned char b = plen ? p[i % plen] : 0;
    acc |= (unsigned)(b ^ key[i]);
  }
  return acc;
}

int auth_check(const auth_keys *k, const char *header) {
  if (!k) return 1;
  if (!header) return 0;
  /* RFC 7235: the scheme is case-insensitive; blanks around the token are tolerated. */
  while (*header == ' ' || *header == '\t')
    header++;
  if (strncasecmp(header, "Bearer", 6) || (header[6] != ' ' && header[6] != '\t')) return 0;
  const char *t = header + 6;
  while (*t == ' ' || *t == '\t')
    t++;
  size_t tl = strlen(t);
  while (tl && (t[tl - 1] == ' ' || t[tl - 1] == '\t'))
    tl--;
  if (tl > AUTH_KEY_MAX) tl = AUTH_KEY_MAX + 1; /* still no key can match: bounded work */
  unsigned ok = 0;
  for (int i = 0; i < k->n; i++) /* no early exit: every key is compared */
    ok |= diff_ct((const unsigned char *)t, tl, (const unsigned char *)k->key[i], k->len[i]) == 0;
  return ok != 0;
}
