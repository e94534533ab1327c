/*
 * http.h: a minimal HTTP/1.1 client on POSIX sockets for `kiln bench serve`:
 * one request per connection (Connection: close), Content-Length or chunked
 * response bodies, and a Server-Sent Events splitter. http:// only.
 */
#ifndef KILN_BENCH_HTTP_H
#define KILN_BENCH_HTTP_H

#include <stddef.h>

struct http_url {
    char host[256];
    char port[16];
    char path[512]; /* base path without a trailing '/', "" for none */
};

/* "http://host[:port][/base]" */
int http_parse_url(struct http_url *u, const char *url, char *err, size_t errlen);

/* Incremental decoder of a response: feed raw bytes as they arrive; body
 * bytes (de-chunked) go to on_body. */
struct http_resp {
    int status;
    int state; /* internal */
    int chunked;
    long long content_length; /* -1: unknown (read to close) */
    long long remaining;      /* in the current chunk / body */
    char *hdr;
    size_t hdr_len, hdr_cap;
    char line[64];
    int line_len;
    int (*on_body)(const char *p, size_t n, void *ctx); /* non-zero stops */
    void *ctx;
    int done;
};

void http_resp_init(struct http_resp *r, int (*on_body)(const char *, size_t, void *), void *ctx);
void http_resp_free(struct http_resp *r);
/* 0 ok (r->done when the body is complete), -1 on a malformed response,
 * 1 when on_body asked to stop */
int http_resp_feed(struct http_resp *r, const char *p, size_t n, char *err, size_t errlen);

/* Server-Sent Events: feed body bytes; each complete event's data (the
 * "data:" lines joined by '\n') goes to on_event. */
struct sse {
    char *buf;
    size_t len, cap;
    char *data;
    size_t dlen, dcap;
    int has_data;
    int (*on_event)(const char *data, size_t n, void *ctx);
    void *ctx;
};
void sse_init(struct sse *s, int (*on_event)(const char *, size_t, void *), void *ctx);
void sse_free(struct sse *s);
int sse_feed(struct sse *s, const char *p, size_t n); /* non-zero: on_event stopped */

/* One request: method, path (appended to the URL's base path), optional
 * JSON body. Body bytes of the response go to on_body. Returns the HTTP
 * status or -1 with err (connection, timeout, malformed). */
int http_request(const struct http_url *u, const char *method, const char *path, const char *body, double timeout_s,
                 int (*on_body)(const char *p, size_t n, void *ctx), void *ctx, char *err, size_t errlen);

#endif
