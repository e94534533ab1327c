/*
 * json_scan.h: a small, bounds-checked JSON scanner for the two big members
 * of tokenizer.json (model.vocab and model.merges), which load.c reads
 * without building a cJSON tree. The small rest of the file still goes
 * through cJSON.
 *
 * The scanner works on a byte range of a text in memory and never reads
 * outside it. Every function returns 0 (or 1 for "one more member") on
 * success and -1 on the first error, which is kept in s->err (a message)
 * and s->err_off (its byte offset from the start of the text); after an
 * error the cursor is at the end, so every further call fails too.
 *
 * Decision: the grammar accepted is a subset of what cJSON 1.7 accepts, so a
 * text that passes js_skip also parses with cJSON (load.c relies on this when
 * it hands the rest of the file to cJSON):
 * - whitespace is any byte <= 0x20 (as cJSON);
 * - numbers start with '-' or a digit and are the longest run of
 *   [0-9+-.eE] (at most 63 bytes) that strtod reads whole (as cJSON);
 * - strings may hold raw bytes of any value (as cJSON), escapes are the JSON
 *   ones, \uXXXX needs four hex digits (cJSON reads bad hex as 0; this
 *   scanner refuses it), and surrogates must come as a high/low pair;
 * - containers nest at most JS_MAX_DEPTH deep (cJSON's CJSON_NESTING_LIMIT).
 * Unescaped strings are exact: \u0000 gives a NUL byte inside the string
 * (the length says where it ends), a pair gives one 4-byte UTF-8 sequence.
 *
 * The per-token paths (whitespace, a string without escapes, a plain
 * integer, the next member or element) are inline here; load.c runs them
 * about a million times per load.
 */
#ifndef KILN_JSON_SCAN_H
#define KILN_JSON_SCAN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define JS_MAX_DEPTH 1000

struct js {
    const uint8_t *base;    /* start of the whole text (error offsets count from here) */
    const uint8_t *p, *end; /* the cursor and the end of the scanned range */
    int depth;              /* containers open now */
    const char *err;        /* first error (points to msg), NULL if none */
    size_t err_off;
    char msg[80];
    uint8_t *buf;           /* scratch for strings with escapes (owned) */
    size_t buf_cap;
};

/* Scans text[off .. off+len) of a text that starts at text (offsets in errors
 * count from text). depth: containers already open around the range. */
void js_init(struct js *s, const char *text, size_t off, size_t len, int depth);
void js_free(struct js *s);

/* Records an error at the cursor (the first one wins); returns -1. */
int js_fail(struct js *s, const char *what);

/* Skips whitespace; returns the next byte, or -1 at the end of the range. */
static inline int js_peek(struct js *s);

/* Reads a string at the cursor. *out, *len: its unescaped bytes, either
 * inside the text (no escapes) or in s->buf; valid until the next js_string
 * call. */
static inline int js_string(struct js *s, const uint8_t **out, size_t *len);

/* Reads a number at the cursor, as cJSON would (its value as a double). */
static inline int js_number(struct js *s, double *v);

/* Skips (and validates) one value at the cursor. If count is not NULL it
 * receives the number of members (object) or elements (array), else 0. */
int js_skip(struct js *s, size_t *count);

/* Objects: js_obj_open at '{', then js_obj_next until it returns 0 (the '}'
 * was consumed). 1 means a member whose key is in *key, *klen (see js_string)
 * and whose value is at the cursor, to be read before the next call. *first
 * must be 1 before the first js_obj_next. */
int js_obj_open(struct js *s);
static inline int js_obj_next(struct js *s, int *first, const uint8_t **key, size_t *klen);

/* Arrays: the same, with js_arr_next returning 1 for each element. */
int js_arr_open(struct js *s);
static inline int js_arr_next(struct js *s, int *first);

/* ==== inline paths; the slow cases are in json_scan.c ==== */

int js_string_escaped_(struct js *s, const uint8_t *start, const uint8_t *first_backslash, const uint8_t **out,
                       size_t *len);
int js_number_slow_(struct js *s, double *v);
int js_fail_end_(struct js *s, int c, const char *expected);

/* Eight bytes at a time (little-endian only): a word with the high bit set
 * in each byte that is > 0x20, or that equals c. A carry or borrow can only
 * mark bytes above a byte that is truly marked, so the lowest mark is exact. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define JS_SWAR 1
#define JS_ONES 0x0101010101010101ull
#define JS_HIGHS 0x8080808080808080ull
static inline uint64_t js_above_space_(uint64_t w) { return ((w + JS_ONES * (0x7F - 0x20)) | w) & JS_HIGHS; }
static inline uint64_t js_has_byte_(uint64_t w, uint8_t c) {
    uint64_t x = w ^ (JS_ONES * c);
    return (x - JS_ONES) & ~x & JS_HIGHS;
}
#endif

/* the first byte at or after p that is not whitespace, or e */
static inline const uint8_t *js_ws_(const uint8_t *p, const uint8_t *e) {
    if (p < e && *p > 0x20) return p;
#ifdef JS_SWAR
    while (e - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t m = js_above_space_(w);
        if (m) return p + (__builtin_ctzll(m) >> 3);
        p += 8;
    }
#endif
    while (p < e && *p <= 0x20) p++;
    return p;
}

/* p just after an opening quote: the closing quote, or NULL if a backslash
 * comes first or the range ends (then js_string must read it) */
static inline const uint8_t *js_plain_end_(const uint8_t *p, const uint8_t *e) {
#ifdef JS_SWAR
    while (e - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t m = js_has_byte_(w, '"') | js_has_byte_(w, '\\');
        if (m) {
            p += __builtin_ctzll(m) >> 3;
            return *p == '"' ? p : NULL;
        }
        p += 8;
    }
#endif
    while (p < e && *p != '"' && *p != '\\') p++;
    return p < e && *p == '"' ? p : NULL;
}

static inline int js_peek(struct js *s) {
    const uint8_t *p = s->p = js_ws_(s->p, s->end);
    return p < s->end ? *p : -1;
}

static inline int js_string(struct js *s, const uint8_t **out, size_t *len) {
    const uint8_t *p = s->p, *e = s->end;
    if (p >= e || *p != '"') return js_fail_end_(s, p < e ? *p : -1, "a string");
    const uint8_t *start = ++p;
#ifdef JS_SWAR
    while (e - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t m = js_has_byte_(w, '"') | js_has_byte_(w, '\\');
        if (m) {
            p += __builtin_ctzll(m) >> 3;
            goto found;
        }
        p += 8;
    }
#endif
    while (p < e && *p != '"' && *p != '\\') p++;
    if (p >= e) {
        s->p = start - 1;
        return js_fail(s, "unterminated string");
    }
#ifdef JS_SWAR
found:
#endif
    if (*p == '\\') return js_string_escaped_(s, start, p, out, len);
    *out = start;
    *len = (size_t)(p - start);
    s->p = p + 1;
    return 0;
}

static inline int js_number(struct js *s, double *v) {
    /* plain integers of up to 15 digits are exact in a double: no strtod */
    const uint8_t *p = s->p, *e = s->end;
    size_t avail = (size_t)(e - p);
    if (avail > 16) avail = 16;
    size_t i = 0;
    uint64_t x = 0;
    while (i < avail && p[i] >= '0' && p[i] <= '9') x = x * 10 + (uint64_t)(p[i++] - '0');
    if (i && i < 16 && (p + i >= e || !((p[i] >= '0' && p[i] <= '9') || p[i] == '.' || p[i] == 'e' || p[i] == 'E' ||
                                        p[i] == '+' || p[i] == '-'))) {
        *v = (double)x;
        s->p = p + i;
        return 0;
    }
    return js_number_slow_(s, v);
}

/* the step shared by objects and arrays: 0 at the closing bracket (consumed),
 * 1 before the next member (its ',' consumed), -1 on an error */
static inline int js_next_(struct js *s, int *first, int close, const char *want) {
    if (s->err) return -1;
    int c = js_peek(s);
    if (c == close) {
        s->p++;
        s->depth--;
        *first = 0;
        return 0;
    }
    if (!*first) {
        if (c != ',') return js_fail_end_(s, c, want);
        s->p++;
        js_peek(s);
    }
    *first = 0;
    return 1;
}

static inline int js_obj_next(struct js *s, int *first, const uint8_t **key, size_t *klen) {
    int r = js_next_(s, first, '}', "',' or '}'");
    if (r <= 0) return r;
    int c = js_peek(s);
    if (c != '"') return js_fail_end_(s, c, "a string key");
    if (js_string(s, key, klen)) return -1;
    c = js_peek(s);
    if (c != ':') return js_fail_end_(s, c, "':' after a key");
    s->p++;
    js_peek(s);
    return 1;
}

static inline int js_arr_next(struct js *s, int *first) {
    return js_next_(s, first, ']', "',' or ']'");
}

#endif
