/* respstore.c: stored /v1/responses in SQLite (see respstore.h). */
#include "respstore.h"

#include "anna/anna.h"

#include <stdlib.h>
#include <string.h>

#ifndef ANNA_HAVE_SQLITE

int respstore_available(void) {
  return 0;
}

int respstore_open(respstore **out, const char *path, long long ttl_s, char *err, size_t errlen) {
  (void)ttl_s;
  *out = NULL;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                  "--responses-db %s: anna was built without SQLite (install libsqlite3-dev and rebuild)", path);
}

void respstore_close(respstore *s) {
  (void)s;
}

int respstore_put(respstore *s, const respstore_row *row, char *err, size_t errlen) {
  (void)s, (void)row;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "built without SQLite");
}

int respstore_get(respstore *s, const char *id, long long now, respstore_row *row, char *err, size_t errlen) {
  (void)s, (void)id, (void)now, (void)row;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "built without SQLite");
}

int respstore_delete(respstore *s, const char *id, char *err, size_t errlen) {
  (void)s, (void)id;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "built without SQLite");
}

int respstore_sweep(respstore *s, long long now, char *err, size_t errlen) {
  (void)s, (void)now;
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "built without SQLite");
}

#else

#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>

#define SCHEMA_VERSION 1

enum { ST_PUT, ST_GET, ST_DEL_ID, ST_DEL_EXPIRED, ST_N };

static const char *const SQL[ST_N] = {
    [ST_PUT] = "INSERT OR REPLACE INTO responses(id, created, response, input_items, ctx_msgs, instructions, tools, "
               "no_think, ids) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    [ST_GET] = "SELECT created, response, input_items, ctx_msgs, instructions, tools, no_think, ids FROM responses "
               "WHERE id = ?1",
    [ST_DEL_ID] = "DELETE FROM responses WHERE id = ?1",
    [ST_DEL_EXPIRED] = "DELETE FROM responses WHERE created <= ?1",
};

struct respstore {
  pthread_mutex_t mu;
  sqlite3 *db;
  sqlite3_stmt *st[ST_N];
  long long ttl;
  char path[256];
};

int respstore_available(void) {
  return 1;
}

/* The error of the last call on s->db, naming the file. */
static int db_fail(respstore *s, const char *what, char *err, size_t errlen) {
  const int code = sqlite3_errcode(s->db);
  const int rc = code == SQLITE_NOMEM                              ? ANNA_ENOMEM
                 : code == SQLITE_CORRUPT || code == SQLITE_NOTADB ? ANNA_EFORMAT
                                                                   : ANNA_EIO;
  return anna_err(err, errlen, rc, "responses db %s: %s: %s", s->path, what, sqlite3_errmsg(s->db));
}

static void finalize_all(respstore *s) {
  for (int i = 0; i < ST_N; i++) {
    sqlite3_finalize(s->st[i]);
    s->st[i] = NULL;
  }
}

void respstore_close(respstore *s) {
  if (!s) return;
  finalize_all(s);
  sqlite3_close(s->db);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* Creates the tables or checks the recorded schema version, in one transaction. */
static int schema_init(respstore *s, char *err, size_t errlen) {
  if (sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
    return db_fail(s, "cannot start a transaction", err, errlen);
  int rc = 0;
  sqlite3_stmt *q = NULL;
  if (sqlite3_exec(s->db,
                   "CREATE TABLE IF NOT EXISTS anna_schema(version INTEGER NOT NULL);"
                   "CREATE TABLE IF NOT EXISTS responses(id TEXT PRIMARY KEY, created INTEGER NOT NULL, "
                   "response TEXT NOT NULL, input_items TEXT NOT NULL, ctx_msgs TEXT NOT NULL, instructions TEXT, "
                   "tools TEXT, no_think INTEGER NOT NULL, ids BLOB);"
                   "CREATE INDEX IF NOT EXISTS responses_created ON responses(created);",
                   NULL, NULL, NULL) != SQLITE_OK) {
    rc = db_fail(s, "cannot create the tables", err, errlen);
    goto done;
  }
  if (sqlite3_prepare_v2(s->db, "SELECT version FROM anna_schema", -1, &q, NULL) != SQLITE_OK) {
    rc = db_fail(s, "cannot read the schema version", err, errlen);
    goto done;
  }
  int step = sqlite3_step(q);
  if (step == SQLITE_ROW) {
    const int v = sqlite3_column_int(q, 0);
    if (v != SCHEMA_VERSION) {
      rc = anna_err(err, errlen, ANNA_EFORMAT, "responses db %s: schema version %d; this anna reads version %d",
                    s->path, v, SCHEMA_VERSION);
      goto done;
    }
  } else if (step == SQLITE_DONE) {
    char sql[64];
    snprintf(sql, sizeof sql, "INSERT INTO anna_schema(version) VALUES(%d)", SCHEMA_VERSION);
    if (sqlite3_exec(s->db, sql, NULL, NULL, NULL) != SQLITE_OK) {
      rc = db_fail(s, "cannot record the schema version", err, errlen);
      goto done;
    }
  } else {
    rc = db_fail(s, "cannot read the schema version", err, errlen);
    goto done;
  }
done:
  sqlite3_finalize(q);
  if (sqlite3_exec(s->db, rc ? "ROLLBACK" : "COMMIT", NULL, NULL, NULL) != SQLITE_OK && !rc)
    rc = db_fail(s, "cannot commit the schema", err, errlen);
  return rc;
}

int respstore_open(respstore **out, const char *path, long long ttl_s, char *err, size_t errlen) {
  *out = NULL;
  respstore *s = calloc(1, sizeof *s);
  if (!s) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  pthread_mutex_init(&s->mu, NULL);
  snprintf(s->path, sizeof s->path, "%s", path);
  s->ttl = ttl_s;
  int rc;
  /* NOMUTEX: s->mu serializes every use of the one connection. */
  if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL) !=
      SQLITE_OK) {
    rc = s->db ? db_fail(s, "cannot open", err, errlen)
               : anna_err(err, errlen, ANNA_ENOMEM, "responses db %s: out of memory", path);
    goto fail;
  }
  sqlite3_extended_result_codes(s->db, 0);
  sqlite3_busy_timeout(s->db, 2000);
  /* journal_mode is the first statement that reads the file: a file that is not a database
   * fails here, and a read-only one cannot switch to WAL. */
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(s->db, "PRAGMA journal_mode=WAL", -1, &q, NULL) != SQLITE_OK ||
      sqlite3_step(q) != SQLITE_ROW) {
    sqlite3_finalize(q);
    rc = db_fail(s, "cannot open", err, errlen);
    goto fail;
  }
  const char *mode = (const char *)sqlite3_column_text(q, 0);
  const int wal = mode && !strcmp(mode, "wal");
  sqlite3_finalize(q);
  if (!wal) {
    rc = anna_err(err, errlen, ANNA_EIO,
                  "responses db %s: cannot switch to WAL mode (is the file or its folder read-only?)", path);
    goto fail;
  }
  /* NORMAL is durable in WAL mode up to the last checkpointed commit, and never corrupts. */
  if (sqlite3_exec(s->db, "PRAGMA synchronous=NORMAL", NULL, NULL, NULL) != SQLITE_OK) {
    rc = db_fail(s, "cannot set synchronous", err, errlen);
    goto fail;
  }
  if ((rc = schema_init(s, err, errlen))) goto fail;
  for (int i = 0; i < ST_N; i++)
    if (sqlite3_prepare_v3(s->db, SQL[i], -1, SQLITE_PREPARE_PERSISTENT, &s->st[i], NULL) != SQLITE_OK) {
      rc = db_fail(s, "cannot prepare a statement", err, errlen);
      goto fail;
    }
  *out = s;
  return 0;
fail:
  respstore_close(s);
  return rc;
}

static int bind_text(sqlite3_stmt *q, int i, const char *t) {
  return t ? sqlite3_bind_text(q, i, t, -1, SQLITE_STATIC) : sqlite3_bind_null(q, i);
}

int respstore_put(respstore *s, const respstore_row *row, char *err, size_t errlen) {
  /* ids as little-endian bytes so a file moves between machines. */
  unsigned char *blob = NULL;
  if (row->ids && row->n_ids) {
    if (!(blob = malloc(row->n_ids * 4))) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    for (size_t i = 0; i < row->n_ids; i++) {
      const uint32_t v = (uint32_t)row->ids[i];
      blob[4 * i] = (unsigned char)v, blob[4 * i + 1] = (unsigned char)(v >> 8);
      blob[4 * i + 2] = (unsigned char)(v >> 16), blob[4 * i + 3] = (unsigned char)(v >> 24);
    }
  }
  pthread_mutex_lock(&s->mu);
  sqlite3_stmt *q = s->st[ST_PUT];
  int rc = 0;
  if (sqlite3_bind_text(q, 1, row->id, -1, SQLITE_STATIC) || sqlite3_bind_int64(q, 2, row->created) ||
      bind_text(q, 3, row->response ? row->response : "null") ||
      bind_text(q, 4, row->input_items ? row->input_items : "[]") ||
      bind_text(q, 5, row->ctx_msgs ? row->ctx_msgs : "[]") || bind_text(q, 6, row->instructions) ||
      bind_text(q, 7, row->tools) || sqlite3_bind_int(q, 8, row->no_think) ||
      (blob ? sqlite3_bind_blob64(q, 9, blob, row->n_ids * 4, SQLITE_STATIC) : sqlite3_bind_null(q, 9)) ||
      sqlite3_step(q) != SQLITE_DONE)
    rc = db_fail(s, "cannot store a response", err, errlen);
  sqlite3_reset(q);
  sqlite3_clear_bindings(q);
  pthread_mutex_unlock(&s->mu);
  free(blob);
  return rc;
}

static char *col_dup(sqlite3_stmt *q, int i) {
  if (sqlite3_column_type(q, i) == SQLITE_NULL) return NULL;
  const unsigned char *t = sqlite3_column_text(q, i);
  return t ? strdup((const char *)t) : NULL;
}

static int delete_id(respstore *s, const char *id, char *err, size_t errlen) {
  sqlite3_stmt *q = s->st[ST_DEL_ID];
  int rc = 0;
  if (sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC) || sqlite3_step(q) != SQLITE_DONE)
    rc = db_fail(s, "cannot delete a response", err, errlen);
  else
    rc = sqlite3_changes(s->db) > 0;
  sqlite3_reset(q);
  sqlite3_clear_bindings(q);
  return rc;
}

int respstore_get(respstore *s, const char *id, long long now, respstore_row *row, char *err, size_t errlen) {
  memset(row, 0, sizeof *row);
  pthread_mutex_lock(&s->mu);
  sqlite3_stmt *q = s->st[ST_GET];
  int rc = 0, expired = 0;
  if (sqlite3_bind_text(q, 1, id, -1, SQLITE_STATIC)) {
    rc = db_fail(s, "cannot read a response", err, errlen);
    goto done;
  }
  const int step = sqlite3_step(q);
  if (step == SQLITE_DONE) goto done;
  if (step != SQLITE_ROW) {
    rc = db_fail(s, "cannot read a response", err, errlen);
    goto done;
  }
  row->created = sqlite3_column_int64(q, 0);
  if (s->ttl > 0 && row->created + s->ttl <= now) {
    expired = 1;
    goto done;
  }
  snprintf(row->id, sizeof row->id, "%s", id);
  row->response = col_dup(q, 1);
  row->input_items = col_dup(q, 2);
  row->ctx_msgs = col_dup(q, 3);
  row->instructions = col_dup(q, 4);
  row->tools = col_dup(q, 5);
  row->no_think = sqlite3_column_int(q, 6);
  const unsigned char *b = sqlite3_column_blob(q, 7);
  const size_t nb = (size_t)sqlite3_column_bytes(q, 7);
  if (b && nb % 4 == 0 && nb && (row->ids = malloc(nb))) {
    row->n_ids = nb / 4;
    for (size_t i = 0; i < row->n_ids; i++)
      row->ids[i] = (int32_t)((uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 | (uint32_t)b[4 * i + 2] << 16 |
                              (uint32_t)b[4 * i + 3] << 24);
  }
  if (!row->response || !row->input_items || !row->ctx_msgs || (b && nb && !row->ids)) {
    respstore_row_clear(row);
    rc = anna_err(err, errlen, ANNA_ENOMEM, "responses db %s: out of memory reading '%.64s'", s->path, id);
    goto done;
  }
  rc = 1;
done:
  sqlite3_reset(q);
  sqlite3_clear_bindings(q);
  if (expired) {
    memset(row, 0, sizeof *row);
    const int d = delete_id(s, id, err, errlen);
    rc = d < 0 ? d : 0;
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int respstore_delete(respstore *s, const char *id, char *err, size_t errlen) {
  pthread_mutex_lock(&s->mu);
  const int rc = delete_id(s, id, err, errlen);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int respstore_sweep(respstore *s, long long now, char *err, size_t errlen) {
  if (s->ttl <= 0) return 0;
  pthread_mutex_lock(&s->mu);
  sqlite3_stmt *q = s->st[ST_DEL_EXPIRED];
  int rc;
  if (sqlite3_bind_int64(q, 1, now - s->ttl) || sqlite3_step(q) != SQLITE_DONE)
    rc = db_fail(s, "cannot delete expired responses", err, errlen);
  else
    rc = sqlite3_changes(s->db);
  sqlite3_reset(q);
  sqlite3_clear_bindings(q);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

#endif

void respstore_row_clear(respstore_row *row) {
  if (!row) return;
  free(row->response);
  free(row->input_items);
  free(row->ctx_msgs);
  free(row->instructions);
  free(row->tools);
  free(row->ids);
  memset(row, 0, sizeof *row);
}
