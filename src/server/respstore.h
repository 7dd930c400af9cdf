/* respstore.h: the on-disk store of /v1/responses (--responses-db PATH), an embedded SQLite
 * database behind responses.c's in-memory LRU.
 *
 * One connection, owned by the store and serialized by its own mutex (every call may come
 * from any connection thread). The file is opened in WAL mode (readers never wait on the one
 * writer; a crash loses at most the last transaction, never the file), with a 2 s busy timeout
 * for a file another process holds. Every statement is prepared once at open.
 *
 * Schema (version 1, recorded in table anna_schema; a file with another version is refused
 * at open, naming both numbers):
 *   responses(id TEXT PRIMARY KEY, created INTEGER (unix seconds), response TEXT (JSON),
 *             input_items TEXT (JSON), ctx_msgs TEXT (JSON), instructions TEXT, tools TEXT (JSON),
 *             no_think INTEGER, ids BLOB (int32 little-endian token ids, or NULL))
 *
 * Retention: ttl_s > 0 makes a row expire ttl_s seconds after `created`; respstore_get of an
 * expired row deletes it and reports it absent; respstore_sweep deletes all expired rows (the
 * server calls it periodically). ttl_s <= 0: rows stay until deleted.
 *
 * Errors: every function returns 0 (or the documented count) or a negative ANNA_E* code with
 * err filled by a message naming the file and SQLite's cause ("file is not a database",
 * "database is locked", "attempt to write a readonly database", ...). Nothing here exits.
 *
 * Without SQLite at build time (ANNA_HAVE_SQLITE undefined) respstore_open fails with
 * ANNA_EUNSUPPORTED saying so; the other functions are never reached.
 */
#ifndef ANNA_SERVER_RESPSTORE_H
#define ANNA_SERVER_RESPSTORE_H

#include <stddef.h>
#include <stdint.h>

typedef struct respstore respstore;

/* One stored response. Strings are NUL-terminated JSON texts (instructions: plain text);
 * instructions, tools and ids may be NULL. Rows returned by respstore_get are owned by the
 * caller (free with respstore_row_clear); rows passed to respstore_put are borrowed. */
typedef struct respstore_row {
  char id[64];
  long long created;
  char *response, *input_items, *ctx_msgs, *instructions, *tools;
  int no_think;
  int32_t *ids;
  size_t n_ids;
} respstore_row;

/* 1 when this build can open a database. */
int respstore_available(void);

/* Opens (creating when absent) the database at path. *out: caller frees with respstore_close.
 * Fails (nothing allocated) on a corrupt, locked, unwritable or newer-schema file. */
int respstore_open(respstore **out, const char *path, long long ttl_s, char *err, size_t errlen);
void respstore_close(respstore *s);

/* Inserts or replaces row->id. */
int respstore_put(respstore *s, const respstore_row *row, char *err, size_t errlen);

/* 1 and *row filled (caller clears) when id is stored and not expired at `now` (unix seconds);
 * 0 when absent or expired (an expired row is deleted); < 0 on error. */
int respstore_get(respstore *s, const char *id, long long now, respstore_row *row, char *err, size_t errlen);

/* 1 when a row was deleted, 0 when id was not stored, < 0 on error. */
int respstore_delete(respstore *s, const char *id, char *err, size_t errlen);

/* Deletes every row expired at `now`; the count deleted (>= 0) or < 0 on error. */
int respstore_sweep(respstore *s, long long now, char *err, size_t errlen);

/* Frees what respstore_get allocated and zeroes the row. */
void respstore_row_clear(respstore_row *row);

#endif
