/* responses.h: OpenAI's Responses API (POST /v1/responses, GET / DELETE /v1/responses/{id},
 * GET /v1/responses/{id}/input_items) over the chat path of oai.h.
 *
 * A request is translated into a Chat Completions body (messages from instructions, the
 * stored context of previous_response_id and the input items; flat function tools nested;
 * text.format -> response_format) and parsed by oai_parse, so rendering, sampling, tools,
 * the enforced JSON schema and the reasoning split are the chat path's own. The output text
 * is split by outparse into reasoning, message and function_call items.
 *
 * Store: responses with store = true (the default) are kept in memory, at most max_entries
 * (--responses-store-max; least recently used evicted first). Each keeps its input items,
 * output items, the chat messages of its whole context and, when the reply ended with an
 * end-of-turn token, the token ids of prompt + reply: a request chained with
 * previous_response_id (same instructions, tools and thinking switch, no images) then starts
 * with exactly those ids, so the prefix cache reuses the whole previous turn even where the
 * template would re-render it differently (Qwen3 drops older turns' <think> text).
 * With a database (--responses-db, respstore.h) every stored response is also written there
 * before it is returned, and the memory side is a cache in front of the file (at least one
 * entry): a miss reads the file, so responses survive restarts. ttl_s > 0 (--responses-ttl):
 * a response expires ttl_s seconds after its creation; reads of an expired one are 404 and
 * delete it, resp_store_sweep deletes all expired ones.
 *
 * Threads: the store has its own mutex; a resp_job and its stream belong to one connection.
 */
#ifndef ANNA_SERVER_RESPONSES_H
#define ANNA_SERVER_RESPONSES_H

#include "oai.h"

#include <stddef.h>

typedef struct resp_store resp_store;

/* max_entries <= 0 and no db_path: nothing is stored (store = true is then a documented no-op
 * and previous_response_id always 404). db_path (NULL: none) is opened or created now: a
 * corrupt, locked or unwritable file, or a build without SQLite, fails here with err naming
 * the cause. Caller frees with resp_store_free. */
int resp_store_create(resp_store **out, int max_entries, const char *db_path, long long ttl_s, char *err,
                      size_t errlen);
void resp_store_free(resp_store *s);
/* Deletes expired responses from memory and the file: how many (>= 0), or < 0 with err. */
int resp_store_sweep(resp_store *s, char *err, size_t errlen);

typedef struct resp_job resp_job;

/* Parses a POST /v1/responses body: *out (caller frees with resp_job_free) holds the chat
 * job in resp_job_chat, not yet submitted. 0, or -1 with *e filled (404 for an unknown
 * previous_response_id). */
int resp_parse(const oai_config *cfg, resp_store *st, const char *body, size_t len, const char *rid,
               resp_job **out, oai_error *e);
oai_job *resp_job_chat(resp_job *j);
void resp_job_free(resp_job *j);

/* Non-stream body of a finished job (caller frees); stores the response when asked to.
 * NULL with e filled (500: out of memory, or the store failed, naming why). */
char *resp_finish_json(resp_job *j, oai_error *e);

/* Streaming (SSE events with increasing sequence_number), as oai_stream_*: step renders what
 * is new into *out and sets *finished after the terminal event (response.completed,
 * response.incomplete or response.failed); the response is stored just before it (a store
 * that fails makes the terminal event response.failed, naming the cause). */
typedef struct resp_stream resp_stream;
resp_stream *resp_stream_new(resp_job *j);
void resp_stream_free(resp_stream *s);
int resp_stream_step(resp_stream *s, char **out, size_t *len, size_t *cap, int *finished);
int resp_stream_has_news(const resp_stream *s); /* with the request's mu held */

/* GET / DELETE /v1/responses/{id} and GET .../input_items (order "asc" | "desc" (default),
 * limit 1..100 (default 20), after: an item id; NULL for defaults). *body: caller frees.
 * Return the HTTP status (200, 400, 404; 500 when the database fails); errors fill e. */
int resp_get(resp_store *st, const char *id, char **body, oai_error *e);
int resp_delete(resp_store *st, const char *id, char **body, oai_error *e);
int resp_input_items(resp_store *st, const char *id, const char *order, const char *limit, const char *after,
                     char **body, oai_error *e);

#endif
