/* webui.c: serves the embedded chat page (see webui.h). */
#include "webui.h"

#include <stddef.h>
#include <string.h>

/* Generated at build time (cmake/embed_file.cmake). */
extern const unsigned char webui_index_html[], webui_app_js[], webui_app_css[];
extern const size_t webui_index_html_len, webui_app_js_len, webui_app_css_len;
extern const char webui_index_html_etag[], webui_app_js_etag[], webui_app_css_etag[];

/* img-src allows data: and blob: for attached images shown before and after sending;
 * connect-src 'self' is all the API calls need. */
const char webui_csp[] =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'";

typedef struct asset {
  const char *path;
  const unsigned char *data;
  const size_t *len;
  const char *etag;
  const char *ctype;
} asset;

static const asset assets[] = {
    {"/", webui_index_html, &webui_index_html_len, webui_index_html_etag,
     "text/html; charset=utf-8"},
    {"/index.html", webui_index_html, &webui_index_html_len, webui_index_html_etag,
     "text/html; charset=utf-8"},
    {"/app.js", webui_app_js, &webui_app_js_len, webui_app_js_etag,
     "text/javascript; charset=utf-8"},
    {"/app.css", webui_app_css, &webui_app_css_len, webui_app_css_etag, "text/css; charset=utf-8"},
};

static const char method_body[] =
    "{\"error\":{\"message\":\"this route takes GET\",\"type\":\"invalid_request_error\","
    "\"param\":null,\"code\":\"method_not_allowed\"}}";

int webui_route(struct MHD_Connection *c, const char *method, const char *url, const char *rid,
                enum MHD_Result *ret, int *status) {
  const asset *a = NULL;
  for (size_t i = 0; i < sizeof assets / sizeof assets[0] && !a; i++)
    if (!strcmp(url, assets[i].path)) a = &assets[i];
  if (!a) return 0;
  int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
  const char *inm = get ? MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match") : NULL;
  /* A list of tags or "*" (RFC 9110 13.1.2); ours hold no comma: a substring match is exact. */
  int fresh = inm && (strstr(inm, a->etag) != NULL || !strcmp(inm, "*"));
  *status = !get ? 405 : fresh ? 304 : 200;
  /* The assets are static and outlive the daemon: MHD sends them without a copy. */
  struct MHD_Response *resp =
      !get    ? MHD_create_response_from_buffer(sizeof method_body - 1, (void *)method_body,
                                                MHD_RESPMEM_PERSISTENT)
      : fresh ? MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT)
              : MHD_create_response_from_buffer(*a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
  if (!resp) {
    *ret = MHD_NO;
    return 1;
  }
  if (!get) {
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Allow", "GET, HEAD");
  } else {
    if (!fresh) MHD_add_response_header(resp, "Content-Type", a->ctype);
    MHD_add_response_header(resp, "ETag", a->etag);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "Content-Security-Policy", webui_csp);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(resp, "X-Frame-Options", "DENY");
  }
  MHD_add_response_header(resp, "X-Request-Id", rid);
  *ret = MHD_queue_response(c, (unsigned)*status, resp);
  MHD_destroy_response(resp);
  return 1;
}
