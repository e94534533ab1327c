/*
 * text.c: strbuf, the stop-string matcher, the <think> splitter and the
 * tool-call parser (see text.h). Held-back text is always cut at the start of a possible match;
 * since stop strings and tags begin with a whole UTF-8 character, released
 * text never ends inside a character.
 */
#include "server/text.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* ==== strbuf ==== */

static void sb_reserve(struct strbuf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    b->p = kiln_realloc(b->p, cap);
    b->cap = cap;
}

void sb_put(struct strbuf *b, const char *s, size_t n) {
    sb_reserve(b, n);
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void sb_puts(struct strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

void sb_printf(struct strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    sb_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

void sb_clear(struct strbuf *b) {
    b->n = 0;
    if (b->p) b->p[0] = 0;
}

void sb_free(struct strbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

const char *sb_str(const struct strbuf *b) { return b->p ? b->p : ""; }

/* drops the first k bytes */
static void sb_consume(struct strbuf *b, size_t k) {
    if (k >= b->n) {
        sb_clear(b);
        return;
    }
    memmove(b->p, b->p + k, b->n - k);
    b->n -= k;
    b->p[b->n] = 0;
}

size_t text_partial_suffix(const char *s, size_t n, const char *pat) {
    size_t m = strlen(pat);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, pat, k)) return k;
    return 0;
}

/* ==== stop strings ==== */

void stop_init(struct stop_matcher *m, const char *const *stops, int n_stops) {
    memset(m, 0, sizeof *m);
    m->stops = kiln_calloc((size_t)(n_stops ? n_stops : 1), sizeof *m->stops);
    for (int i = 0; i < n_stops; i++)
        if (stops[i] && stops[i][0]) m->stops[m->n_stops++] = kiln_strdup(stops[i]);
}

void stop_free(struct stop_matcher *m) {
    for (int i = 0; i < m->n_stops; i++) free(m->stops[i]);
    free(m->stops);
    sb_free(&m->hold);
}

int stop_feed(struct stop_matcher *m, const char *text, size_t len, struct strbuf *out) {
    if (m->hit) return 1;
    if (m->n_stops == 0) {
        sb_put(out, text, len);
        return 0;
    }
    sb_put(&m->hold, text, len);
    const char *h = sb_str(&m->hold);
    /* the earliest complete match wins */
    size_t first = m->hold.n;
    for (int i = 0; i < m->n_stops; i++) {
        const char *p = memmem(h, m->hold.n, m->stops[i], strlen(m->stops[i]));
        if (p && (size_t)(p - h) < first) first = (size_t)(p - h);
    }
    if (first < m->hold.n) {
        sb_put(out, h, first);
        sb_clear(&m->hold);
        m->hit = 1;
        return 1;
    }
    /* hold back the longest tail that may grow into a stop string */
    size_t keep = 0;
    for (int i = 0; i < m->n_stops; i++) {
        size_t k = text_partial_suffix(h, m->hold.n, m->stops[i]);
        if (k > keep) keep = k;
    }
    sb_put(out, h, m->hold.n - keep);
    sb_consume(&m->hold, m->hold.n - keep);
    return 0;
}

void stop_flush(struct stop_matcher *m, struct strbuf *out) {
    if (!m->hit) sb_put(out, m->hold.p ? m->hold.p : "", m->hold.n);
    sb_clear(&m->hold);
}

/* ==== <think> splitter ==== */

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

void think_init(struct think_splitter *t, int in_reasoning) {
    memset(t, 0, sizeof *t);
    t->in_reasoning_at_start = in_reasoning;
    t->state = THINK_START;
}

void think_free(struct think_splitter *t) { sb_free(&t->hold); }

/* Content: whitespace right after </think> is dropped. */
static void emit_content(struct think_splitter *t, const char *s, size_t n, struct strbuf *content) {
    if (t->strip_lead) {
        while (n && is_ws(*s)) s++, n--;
        if (n) t->strip_lead = 0;
    }
    sb_put(content, s, n);
}

/* Processes the hold buffer as far as it can be decided. */
static void think_run(struct think_splitter *t, struct strbuf *reasoning, struct strbuf *content, int final) {
    for (;;) {
        const char *h = sb_str(&t->hold);
        size_t n = t->hold.n;
        if (t->state == THINK_START) {
            size_t ws = 0;
            while (ws < n && is_ws(h[ws])) ws++;
            size_t rest = n - ws, lo = sizeof THINK_OPEN - 1;
            if (rest >= lo && !memcmp(h + ws, THINK_OPEN, lo)) {
                sb_consume(&t->hold, ws + lo);
                t->state = THINK_REASONING;
                t->strip_lead = 1;
                continue;
            }
            if (!final && rest < lo && !memcmp(h + ws, THINK_OPEN, rest)) return; /* maybe "<thi" so far */
            t->state = t->in_reasoning_at_start ? THINK_REASONING : THINK_CONTENT;
            t->strip_lead = t->in_reasoning_at_start;
            continue;
        }
        if (t->state == THINK_CONTENT) {
            emit_content(t, h, n, content);
            sb_clear(&t->hold);
            return;
        }
        /* reasoning: up to </think>, without the whitespace around it */
        if (t->strip_lead) {
            size_t ws = 0;
            while (ws < n && is_ws(h[ws])) ws++;
            if (ws) {
                sb_consume(&t->hold, ws);
                continue;
            }
            if (n) t->strip_lead = 0;
        }
        const char *close = memmem(h, n, THINK_CLOSE, sizeof THINK_CLOSE - 1);
        if (close) {
            size_t end = (size_t)(close - h);
            while (end && is_ws(h[end - 1])) end--;
            sb_put(reasoning, h, end);
            sb_consume(&t->hold, (size_t)(close - h) + sizeof THINK_CLOSE - 1);
            t->state = THINK_CONTENT;
            t->strip_lead = 1;
            continue;
        }
        if (final) {
            sb_put(reasoning, h, n);
            sb_clear(&t->hold);
            return;
        }
        size_t keep = text_partial_suffix(h, n, THINK_CLOSE);
        size_t end = n - keep;
        while (end && is_ws(h[end - 1])) end--; /* trailing whitespace may precede </think> */
        sb_put(reasoning, h, end);
        sb_consume(&t->hold, end);
        return;
    }
}

void think_feed(struct think_splitter *t, const char *text, size_t len, struct strbuf *reasoning, struct strbuf *content) {
    sb_put(&t->hold, text, len);
    think_run(t, reasoning, content, 0);
}

void think_flush(struct think_splitter *t, struct strbuf *reasoning, struct strbuf *content) {
    think_run(t, reasoning, content, 1);
}

/* ==== tool calls ==== */

static const char TOOL_OPEN[] = "<tool_call>", TOOL_CLOSE[] = "</tool_call>";

void tool_init(struct tool_parser *t) { memset(t, 0, sizeof *t); }

void tool_free(struct tool_parser *t) {
    for (int i = 0; i < t->n_calls; i++) free(t->calls[i].name), free(t->calls[i].arguments);
    free(t->calls);
    sb_free(&t->hold);
    sb_free(&t->pre);
    memset(t, 0, sizeof *t);
}

int tool_parse_call(const char *s, size_t n, struct tool_call *out) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    if (!j) return -1;
    while (end < s + n && is_ws(*end)) end++;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    cJSON *parsed = NULL;
    if (cJSON_IsString(args)) { /* some models send the arguments as a JSON string */
        parsed = cJSON_Parse(args->valuestring);
        args = parsed;
    }
    int ok = end == s + n && cJSON_IsObject(j) && cJSON_IsString(name) && name->valuestring[0] && (!args || cJSON_IsObject(args));
    if (ok) {
        out->name = kiln_strdup(name->valuestring);
        out->arguments = args ? cJSON_PrintUnformatted(args) : kiln_strdup("{}");
    }
    cJSON_Delete(parsed);
    cJSON_Delete(j);
    return ok ? 0 : -1;
}

static void tool_add(struct tool_parser *t, const struct tool_call *c) {
    if (t->n_calls == t->cap_calls) {
        t->cap_calls = t->cap_calls ? t->cap_calls * 2 : 4;
        t->calls = kiln_realloc(t->calls, sizeof *t->calls * (size_t)t->cap_calls);
    }
    t->calls[t->n_calls++] = *c;
}

/* A block that is no call: content, as the model wrote it. */
static void tool_verbatim(struct tool_parser *t, const char *inner, size_t n, int closed, struct strbuf *content) {
    sb_put(content, sb_str(&t->pre), t->pre.n);
    sb_puts(content, TOOL_OPEN);
    sb_put(content, inner, n);
    if (closed) sb_puts(content, TOOL_CLOSE);
    sb_clear(&t->pre);
}

static void tool_run(struct tool_parser *t, struct strbuf *content, int final) {
    for (;;) {
        const char *h = sb_str(&t->hold);
        size_t n = t->hold.n;
        if (t->in_call) {
            const char *close = memmem(h, n, TOOL_CLOSE, sizeof TOOL_CLOSE - 1);
            if (!close && !final) return; /* the whole block waits for its end tag */
            size_t inner = close ? (size_t)(close - h) : n;
            struct tool_call c;
            if (close && tool_parse_call(h, inner, &c) == 0) {
                tool_add(t, &c);
                sb_clear(&t->pre);
                t->strip_lead = 1;
            } else {
                tool_verbatim(t, h, inner, close != NULL, content);
            }
            sb_consume(&t->hold, close ? inner + sizeof TOOL_CLOSE - 1 : n);
            t->in_call = 0;
            continue;
        }
        if (t->strip_lead) {
            size_t ws = 0;
            while (ws < n && is_ws(h[ws])) ws++;
            sb_consume(&t->hold, ws);
            if (t->hold.n == 0) return;
            t->strip_lead = 0;
            continue;
        }
        const char *open = memmem(h, n, TOOL_OPEN, sizeof TOOL_OPEN - 1);
        if (open) {
            size_t at = (size_t)(open - h), end = at;
            while (end && is_ws(h[end - 1])) end--;
            sb_put(content, h, end);
            sb_put(&t->pre, h + end, at - end);
            sb_consume(&t->hold, at + sizeof TOOL_OPEN - 1);
            t->in_call = 1;
            continue;
        }
        if (final) {
            sb_put(content, h, n);
            sb_clear(&t->hold);
            return;
        }
        /* hold back a possible start of the tag and the whitespace before it */
        size_t end = n - text_partial_suffix(h, n, TOOL_OPEN);
        while (end && is_ws(h[end - 1])) end--;
        sb_put(content, h, end);
        sb_consume(&t->hold, end);
        return;
    }
}

void tool_feed(struct tool_parser *t, const char *text, size_t len, struct strbuf *content) {
    sb_put(&t->hold, text, len);
    tool_run(t, content, 0);
}

void tool_flush(struct tool_parser *t, struct strbuf *content) { tool_run(t, content, 1); }
