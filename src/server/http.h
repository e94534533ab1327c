/*
 * http.h: a small HTTP/1.1 front on libmicrohttpd, nothing model-specific.
 * One thread per connection: a handler may block (waiting for tokens), and
 * a streamed body is produced by a callback that may block too. Request
 * bodies above max_body get 413 before the handler sees them.
 */
#ifndef KILN_SERVER_HTTP_H
#define KILN_SERVER_HTTP_H

#include <stddef.h>
#include <sys/types.h>

struct http_request {
    const char *method, *url;
    const char *authorization; /* the Authorization header, or NULL */
    const char *body;          /* NUL-terminated (may hold NULs before body_len) */
    size_t body_len;
    int fd;                    /* the client socket, for http_client_gone */
};

struct http_response {
    int status;
    const char *content_type;  /* default application/json */
    char *body;                /* malloc'd, freed by http.c */
    size_t body_len;
    int retry_after;           /* seconds; > 0 adds Retry-After */
    int www_authenticate;      /* adds WWW-Authenticate: Bearer (401) */
    /* a streamed body instead (Server-Sent Events): stream() fills buf and
     * returns the bytes written (> 0), 0 at the end, -1 to abort the
     * connection; stream_free(cls) runs once the response is done, also
     * when the client went away. */
    ssize_t (*stream)(void *cls, char *buf, size_t max);
    void (*stream_free)(void *cls);
    void *cls;
};

typedef void (*http_handler)(void *ctx, const struct http_request *rq, struct http_response *rs);

struct http_server;

/* Listens on host:port (host NULL: 127.0.0.1). 0 or -1 with err. */
struct http_server *http_start(const char *host, int port, size_t max_body, http_handler fn, void *ctx, char *err,
                               size_t errlen);
void http_stop(struct http_server *h);

/* 1 when the client closed its end of the connection (without consuming
 * anything it sent), else 0. */
int http_client_gone(int fd);

#endif
