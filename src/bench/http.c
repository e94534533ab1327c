/* http.c: see http.h. */
#include "bench/http.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/base.h"

int http_parse_url(struct http_url *u, const char *url, char *err, size_t errlen) {
    memset(u, 0, sizeof *u);
    if (strncmp(url, "http://", 7)) return kiln_errf(err, errlen, "URL '%s': only http:// is supported", url);
    const char *h = url + 7, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    const char *colon = memchr(h, ':', hl);
    size_t host_len = colon ? (size_t)(colon - h) : hl;
    if (host_len == 0 || host_len >= sizeof u->host) return kiln_errf(err, errlen, "URL '%s': bad host", url);
    memcpy(u->host, h, host_len);
    if (colon) {
        size_t pl = hl - host_len - 1;
        if (pl == 0 || pl >= sizeof u->port) return kiln_errf(err, errlen, "URL '%s': bad port", url);
        memcpy(u->port, colon + 1, pl);
        for (size_t i = 0; i < pl; i++)
            if (u->port[i] < '0' || u->port[i] > '9') return kiln_errf(err, errlen, "URL '%s': bad port", url);
    } else {
        strcpy(u->port, "80");
    }
    if (slash) {
        snprintf(u->path, sizeof u->path, "%s", slash);
        size_t n = strlen(u->path);
        while (n > 0 && u->path[n - 1] == '/') u->path[--n] = 0;
    }
    return 0;
}

/* ==== response decoding ==== */

enum { ST_HDR, ST_BODY, ST_CSIZE, ST_CDATA, ST_CCRLF, ST_DONE };

void http_resp_init(struct http_resp *r, int (*on_body)(const char *, size_t, void *), void *ctx) {
    memset(r, 0, sizeof *r);
    r->content_length = -1;
    r->on_body = on_body;
    r->ctx = ctx;
}

void http_resp_free(struct http_resp *r) { free(r->hdr); }

static int parse_headers(struct http_resp *r, char *err, size_t errlen) {
    /* r->hdr holds everything up to and including the blank line */
    if (strncmp(r->hdr, "HTTP/1.", 7) || r->hdr_len < 12) return kiln_errf(err, errlen, "not an HTTP/1.x response");
    r->status = atoi(r->hdr + 9);
    char *p = strstr(r->hdr, "\r\n");
    while (p && p[2] != '\r') {
        char *line = p + 2, *eol = strstr(line, "\r\n");
        if (!eol) break;
        *eol = 0;
        char *colon = strchr(line, ':');
        if (colon) {
            *colon = 0;
            char *v = colon + 1;
            while (*v == ' ' || *v == '\t') v++;
            if (!strcasecmp(line, "Transfer-Encoding") && strcasestr(v, "chunked")) r->chunked = 1;
            else if (!strcasecmp(line, "Content-Length")) r->content_length = atoll(v);
            *colon = ':';
        }
        *eol = '\r';
        p = eol;
    }
    if (r->chunked) r->state = ST_CSIZE;
    else {
        r->state = ST_BODY;
        r->remaining = r->content_length;
        if (r->content_length == 0) r->state = ST_DONE, r->done = 1;
    }
    return 0;
}

int http_resp_feed(struct http_resp *r, const char *p, size_t n, char *err, size_t errlen) {
    while (n > 0 && r->state != ST_DONE) {
        if (r->state == ST_HDR) {
            if (r->hdr_len + 1 >= r->hdr_cap) {
                r->hdr_cap = r->hdr_cap ? r->hdr_cap * 2 : 1024;
                if (r->hdr_cap > (1 << 20)) return kiln_errf(err, errlen, "response headers too long");
                r->hdr = kiln_realloc(r->hdr, r->hdr_cap);
            }
            r->hdr[r->hdr_len++] = *p++, n--;
            r->hdr[r->hdr_len] = 0;
            if (r->hdr_len >= 4 && !memcmp(r->hdr + r->hdr_len - 4, "\r\n\r\n", 4)) {
                if (parse_headers(r, err, errlen)) return -1;
            }
        } else if (r->state == ST_BODY || r->state == ST_CDATA) {
            size_t m = n;
            if (r->remaining >= 0 && (long long)m > r->remaining) m = (size_t)r->remaining;
            if (m && r->on_body && r->on_body(p, m, r->ctx)) return 1;
            p += m, n -= m;
            if (r->remaining >= 0) r->remaining -= (long long)m;
            if (r->remaining == 0) {
                if (r->state == ST_BODY) r->state = ST_DONE, r->done = 1;
                else r->state = ST_CCRLF, r->line_len = 0;
            }
        } else { /* ST_CSIZE, ST_CCRLF: a line */
            char ch = *p++;
            n--;
            if (ch == '\r') continue;
            if (ch != '\n') {
                if (r->line_len + 1 >= (int)sizeof r->line) return kiln_errf(err, errlen, "bad chunk header");
                r->line[r->line_len++] = ch;
                continue;
            }
            r->line[r->line_len] = 0;
            if (r->state == ST_CCRLF) {
                if (r->line_len) return kiln_errf(err, errlen, "missing CRLF after a chunk");
                r->state = ST_CSIZE;
            } else {
                if (!r->line_len) continue;
                char *end;
                long long sz = strtoll(r->line, &end, 16);
                if (end == r->line || sz < 0) return kiln_errf(err, errlen, "bad chunk size '%s'", r->line);
                if (sz == 0) r->state = ST_DONE, r->done = 1;
                else r->state = ST_CDATA, r->remaining = sz;
            }
            r->line_len = 0;
        }
    }
    return 0;
}

/* ==== SSE ==== */

void sse_init(struct sse *s, int (*on_event)(const char *, size_t, void *), void *ctx) {
    memset(s, 0, sizeof *s);
    s->on_event = on_event;
    s->ctx = ctx;
}

void sse_free(struct sse *s) {
    free(s->buf);
    free(s->data);
}

static void data_append(struct sse *s, const char *p, size_t n) {
    if (s->dlen + n + 2 > s->dcap) {
        s->dcap = (s->dlen + n + 2) * 2;
        s->data = kiln_realloc(s->data, s->dcap);
    }
    memcpy(s->data + s->dlen, p, n);
    s->dlen += n;
    s->data[s->dlen] = 0;
}

/* one line (without its end of line) */
static int sse_line(struct sse *s, const char *l, size_t n) {
    if (n == 0) { /* end of event */
        int rc = 0;
        if (s->has_data && s->on_event) rc = s->on_event(s->data ? s->data : "", s->dlen, s->ctx);
        s->dlen = 0;
        s->has_data = 0;
        return rc;
    }
    if (l[0] == ':') return 0; /* comment */
    const char *colon = memchr(l, ':', n);
    size_t fl = colon ? (size_t)(colon - l) : n;
    if (fl == 4 && !memcmp(l, "data", 4)) {
        const char *v = colon ? colon + 1 : l + n;
        if (v < l + n && *v == ' ') v++;
        if (s->has_data) data_append(s, "\n", 1);
        data_append(s, v, (size_t)(l + n - v));
        s->has_data = 1;
    }
    return 0;
}

/* lines end at '\n'; a '\r' before it is dropped (servers send "\n" or "\r\n") */
int sse_feed(struct sse *s, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch == '\r') continue;
        if (ch == '\n') {
            size_t len = s->len;
            s->len = 0;
            int rc = sse_line(s, s->buf ? s->buf : "", len);
            if (rc) return rc;
            continue;
        }
        if (s->len + 2 > s->cap) {
            s->cap = (s->len + 2) * 2;
            s->buf = kiln_realloc(s->buf, s->cap);
        }
        s->buf[s->len++] = ch;
    }
    return 0;
}

/* ==== one request ==== */

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k, n -= (size_t)k;
    }
    return 0;
}

int http_request(const struct http_url *u, const char *method, const char *path, const char *body, double timeout_s,
                 int (*on_body)(const char *p, size_t n, void *ctx), void *ctx, char *err, size_t errlen) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(u->host, u->port, &hints, &ai);
    if (g) return kiln_errf(err, errlen, "%s:%s: %s", u->host, u->port, gai_strerror(g));
    int fd = -1;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) return kiln_errf(err, errlen, "cannot connect to %s:%s: %s", u->host, u->port, strerror(errno));
    size_t blen = body ? strlen(body) : 0;
    char head[2048];
    int hn;
    if (body)
        hn = snprintf(head, sizeof head,
                      "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: kiln-bench\r\nAccept: */*\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, u->path, path, u->host, u->port, blen);
    else
        hn = snprintf(head, sizeof head,
                      "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: kiln-bench\r\nAccept: */*\r\nConnection: close\r\n\r\n",
                      method, u->path, path, u->host, u->port);
    if (hn >= (int)sizeof head) {
        close(fd);
        return kiln_errf(err, errlen, "request line too long");
    }
    if (send_all(fd, head, (size_t)hn) || (body && send_all(fd, body, blen))) {
        close(fd);
        return kiln_errf(err, errlen, "sending the request: %s", strerror(errno));
    }
    struct http_resp r;
    http_resp_init(&r, on_body, ctx);
    char buf[16384];
    int rc = 0;
    double deadline = kiln_now() + (timeout_s > 0 ? timeout_s : 1e9);
    for (;;) {
        int ms = (int)((deadline - kiln_now()) * 1e3);
        if (ms <= 0) {
            rc = kiln_errf(err, errlen, "timed out after %.0f s", timeout_s);
            break;
        }
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int pr = poll(&pf, 1, ms > 1000 ? 1000 : ms);
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) continue;
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            rc = kiln_errf(err, errlen, "reading the response: %s", strerror(errno));
            break;
        }
        if (k == 0) { /* closed */
            if (r.state == ST_HDR) rc = kiln_errf(err, errlen, "connection closed before a response");
            else if (!r.done && !(r.state == ST_BODY && r.content_length < 0)) rc = kiln_errf(err, errlen, "response cut short");
            break;
        }
        int f = http_resp_feed(&r, buf, (size_t)k, err, errlen);
        if (f < 0) {
            rc = -1;
            break;
        }
        if (f > 0 || r.done) break;
    }
    close(fd);
    int status = r.status;
    http_resp_free(&r);
    return rc ? -1 : status;
}
