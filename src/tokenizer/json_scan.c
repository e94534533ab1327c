/*
 * json_scan.c: the bounds-checked JSON scanner behind json_scan.h: its slow
 * paths (strings with escapes, numbers that are not plain integers, errors)
 * and the recursive js_skip. The per-token paths are inline in the header.
 */
#include "tokenizer/json_scan.h"

#include <locale.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"

void js_init(struct js *s, const char *text, size_t off, size_t len, int depth) {
    memset(s, 0, sizeof *s);
    s->base = (const uint8_t *)text;
    s->p = s->base + off;
    s->end = s->p + len;
    s->depth = depth;
}

void js_free(struct js *s) {
    free(s->buf);
    s->buf = NULL;
    s->buf_cap = 0;
}

int js_fail(struct js *s, const char *what) {
    if (!s->err) {
        snprintf(s->msg, sizeof s->msg, "%s", what);
        s->err = s->msg;
        s->err_off = (size_t)(s->p - s->base);
    }
    s->p = s->end;
    return -1;
}

/* "expected X" at the cursor, where c is the byte there or -1 at the end */
int js_fail_end_(struct js *s, int c, const char *expected) {
    char m[80];
    if (c < 0) snprintf(m, sizeof m, "unexpected end of input (expected %s)", expected);
    else snprintf(m, sizeof m, "expected %s", expected);
    return js_fail(s, m);
}

static int hex4(const uint8_t *p, uint32_t *v) {
    uint32_t h = 0;
    for (int i = 0; i < 4; i++) {
        uint32_t c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') d = (c | 0x20) - 'a' + 10;
        else return -1;
        h = h << 4 | d;
    }
    *v = h;
    return 0;
}

static uint8_t *put_utf8(uint8_t *o, uint32_t cp) {
    if (cp < 0x80) {
        *o++ = (uint8_t)cp;
    } else if (cp < 0x800) {
        *o++ = (uint8_t)(0xC0 | cp >> 6);
        *o++ = (uint8_t)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *o++ = (uint8_t)(0xE0 | cp >> 12);
        *o++ = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        *o++ = (uint8_t)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (uint8_t)(0xF0 | cp >> 18);
        *o++ = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
        *o++ = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        *o++ = (uint8_t)(0x80 | (cp & 0x3F));
    }
    return o;
}

/* js_string with escapes: start is after the opening quote, p at the first
 * backslash */
int js_string_escaped_(struct js *s, const uint8_t *start, const uint8_t *p, const uint8_t **out, size_t *len) {
    const uint8_t *e = s->end, *q = p;
    /* the closing quote: a backslash always takes the next byte with it */
    while (q < e && *q != '"') {
        if (*q == '\\' && e - q < 2) {
            q = e;
            break;
        }
        q += *q == '\\' ? 2 : 1;
    }
    if (q >= e) {
        s->p = start - 1;
        return js_fail(s, "unterminated string");
    }
    size_t n = (size_t)(q - start); /* the unescaped text is never longer */
    if (n + 1 > s->buf_cap) {
        s->buf_cap = n + 1 > 64 ? n + 1 : 64;
        free(s->buf);
        s->buf = kiln_malloc(s->buf_cap);
    }
    uint8_t *o = s->buf;
    memcpy(o, start, (size_t)(p - start));
    o += p - start;
    while (p < q) {
        if (*p != '\\') {
            *o++ = *p++;
            continue;
        }
        uint32_t cp, lo;
        switch (p[1]) { /* p + 1 < q: see the search for q above */
        case '"': case '\\': case '/': *o++ = p[1]; p += 2; break;
        case 'b': *o++ = '\b'; p += 2; break;
        case 'f': *o++ = '\f'; p += 2; break;
        case 'n': *o++ = '\n'; p += 2; break;
        case 'r': *o++ = '\r'; p += 2; break;
        case 't': *o++ = '\t'; p += 2; break;
        case 'u':
            if (q - p < 6 || hex4(p + 2, &cp)) {
                s->p = p;
                return js_fail(s, "invalid \\u escape (needs four hex digits)");
            }
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                s->p = p;
                return js_fail(s, "\\u escape: low surrogate without a high one before it");
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (q - p < 12 || p[6] != '\\' || p[7] != 'u' || hex4(p + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    s->p = p;
                    return js_fail(s, "\\u escape: high surrogate not followed by a \\u low surrogate");
                }
                cp = 0x10000 + ((cp & 0x3FF) << 10 | (lo & 0x3FF));
                p += 12;
            } else {
                p += 6;
            }
            o = put_utf8(o, cp);
            break;
        default:
            s->p = p;
            return js_fail(s, "invalid escape in string");
        }
    }
    *out = s->buf;
    *len = (size_t)(o - s->buf);
    s->p = q + 1;
    return 0;
}

static int is_num_char(uint8_t c) {
    return (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.' || c == 'e' || c == 'E';
}

/* anything but a plain integer, as cJSON reads it: the run of number
 * characters (it must start with '-' or a digit), read by strtod with the
 * locale's decimal point, must be read whole */
int js_number_slow_(struct js *s, double *v) {
    const uint8_t *p = s->p, *e = s->end, *q = p;
    if (p >= e || (*p != '-' && !(*p >= '0' && *p <= '9'))) return js_fail_end_(s, p < e ? *p : -1, "a number");
    while (q < e && is_num_char(*q)) q++;
    size_t n = (size_t)(q - p);
    char tmp[64];
    if (n >= sizeof tmp) return js_fail(s, "invalid number (too long)");
    memcpy(tmp, p, n);
    tmp[n] = 0;
    const struct lconv *lc = localeconv();
    char dp = lc && lc->decimal_point && lc->decimal_point[0] ? lc->decimal_point[0] : '.';
    for (size_t i = 0; i < n; i++)
        if (tmp[i] == '.') tmp[i] = dp;
    char *endp;
    double d = strtod(tmp, &endp);
    if (endp != tmp + n) return js_fail(s, "invalid number");
    *v = d;
    s->p = q;
    return 0;
}

int js_obj_open(struct js *s) {
    int c = js_peek(s);
    if (c != '{') return js_fail_end_(s, c, "an object");
    if (s->depth >= JS_MAX_DEPTH) return js_fail(s, "nested too deeply");
    s->depth++;
    s->p++;
    return 0;
}

int js_arr_open(struct js *s) {
    int c = js_peek(s);
    if (c != '[') return js_fail_end_(s, c, "an array");
    if (s->depth >= JS_MAX_DEPTH) return js_fail(s, "nested too deeply");
    s->depth++;
    s->p++;
    return 0;
}

static int literal(struct js *s, const char *word, size_t n) {
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n)) return js_fail(s, "invalid literal");
    s->p += n;
    return 0;
}

int js_skip(struct js *s, size_t *count) {
    int c = js_peek(s), r, first = 1;
    size_t n = 0;
    const uint8_t *k;
    size_t kl;
    double v;
    if (count) *count = 0;
    switch (c) {
    case '{':
        if (js_obj_open(s)) return -1;
        while ((r = js_obj_next(s, &first, &k, &kl)) == 1) {
            if (js_skip(s, NULL)) return -1;
            n++;
        }
        break;
    case '[':
        if (js_arr_open(s)) return -1;
        while ((r = js_arr_next(s, &first)) == 1) {
            if (js_skip(s, NULL)) return -1;
            n++;
        }
        break;
    case '"': return js_string(s, &k, &kl);
    case 't': return literal(s, "true", 4);
    case 'f': return literal(s, "false", 5);
    case 'n': return literal(s, "null", 4);
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return js_number(s, &v);
        return js_fail_end_(s, c, "a value");
    }
    if (r < 0) return -1;
    if (count) *count = n;
    return 0;
}
