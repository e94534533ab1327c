/*
 * http.c: libmicrohttpd glue (see http.h).
 *
 * MHD calls the access handler several times per request: once with the
 * headers (we allocate the connection state and check Content-Length),
 * then with pieces of the body (accumulated up to max_body), then once
 * with nothing left to upload, where the route handler runs. With
 * MHD_USE_THREAD_PER_CONNECTION that last call, and the body reader of a
 * streamed response, run on the connection's own thread, so both may block
 * while the engine works. A client that goes away is noticed by
 * http_client_gone (polled by waiting handlers) or by a failed write,
 * after which MHD frees the response and stream_free cancels the work.
 * An idle keep-alive connection is closed after 10 minutes (each holds a
 * thread); the timeout is not checked while a handler or a stream reader
 * is blocked in our code, so long generations are not cut.
 */
#include "server/http.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/base.h"

struct http_server {
    struct MHD_Daemon *d;
    size_t max_body;
    http_handler fn;
    void *ctx;
};

struct conn {
    char *body;
    size_t len, cap;
    int too_big;
};

static const char too_big_body[] =
    "{\"error\":{\"message\":\"the request body is larger than the server accepts (--max-body-bytes)\","
    "\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"request_too_large\"}}";

static enum MHD_Result queue_plain(struct MHD_Connection *c, int status, const char *body, int close) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (close) MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

struct stream_ctx {
    ssize_t (*stream)(void *cls, char *buf, size_t max);
    void (*stream_free)(void *cls);
    void *cls;
};

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct stream_ctx *s = cls;
    ssize_t n = s->stream(s->cls, buf, max);
    if (n > 0) return n;
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_done(void *cls) {
    struct stream_ctx *s = cls;
    if (s->stream_free) s->stream_free(s->cls);
    free(s);
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    struct http_server *h = cls;
    struct conn *st = *con_cls;
    if (!st) { /* headers only */
        st = kiln_calloc(1, sizeof *st);
        *con_cls = st;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > h->max_body) {
            st->too_big = 1;
            /* answer before reading a byte of the body; the connection closes */
            return queue_plain(c, 413, too_big_body, 1);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!st->too_big) {
            if (st->len + *upload_size > h->max_body) {
                st->too_big = 1;
                free(st->body);
                st->body = NULL;
                st->len = st->cap = 0;
            } else {
                if (st->len + *upload_size + 1 > st->cap) {
                    st->cap = (st->len + *upload_size + 1) * 2;
                    st->body = kiln_realloc(st->body, st->cap);
                }
                memcpy(st->body + st->len, upload, *upload_size);
                st->len += *upload_size;
                st->body[st->len] = 0;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (st->too_big) return queue_plain(c, 413, too_big_body, 1);

    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct http_request rq = {.method = method, .url = url,
                              .authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
                              .body = st->body ? st->body : "", .body_len = st->len, .fd = ci ? ci->connect_fd : -1};
    struct http_response rs = {.status = 200};
    h->fn(h->ctx, &rq, &rs);

    struct MHD_Response *r;
    if (rs.stream) {
        struct stream_ctx *sc = kiln_malloc(sizeof *sc);
        *sc = (struct stream_ctx){rs.stream, rs.stream_free, rs.cls};
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, sc, stream_done);
        MHD_add_response_header(r, "Content-Type", rs.content_type ? rs.content_type : "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
    } else {
        r = MHD_create_response_from_buffer(rs.body_len, rs.body ? rs.body : (void *)"", rs.body ? MHD_RESPMEM_MUST_FREE
                                                                                             : MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Content-Type", rs.content_type ? rs.content_type : "application/json");
    }
    if (rs.retry_after > 0) {
        char v[32];
        snprintf(v, sizeof v, "%d", rs.retry_after);
        MHD_add_response_header(r, "Retry-After", v);
    }
    if (rs.www_authenticate) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)rs.status, r);
    MHD_destroy_response(r);
    return ok;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    struct conn *st = *con_cls;
    if (!st) return;
    free(st->body);
    free(st);
    *con_cls = NULL;
}

struct http_server *http_start(const char *host, int port, size_t max_body, http_handler fn, void *ctx, char *err,
                               size_t errlen) {
    if (!host) host = "127.0.0.1";
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    int gai = getaddrinfo(host, ports, &hints, &ai);
    if (gai) {
        kiln_errf(err, errlen, "cannot resolve --host %s: %s", host, gai_strerror(gai));
        return NULL;
    }
    struct http_server *h = kiln_calloc(1, sizeof *h);
    h->max_body = max_body;
    h->fn = fn;
    h->ctx = ctx;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_access, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        free(h);
        kiln_errf(err, errlen, "cannot listen on %s:%d (in use, or not an address of this machine)", host, port);
        return NULL;
    }
    return h;
}

void http_stop(struct http_server *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}

int http_client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return 1;
    if (p.revents & POLLIN) {
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0;
    }
    return 0;
}
