/*
 * json_mask.c: the JSON validator and the per-step vocabulary mask (see
 * json_mask.h).
 *
 * The mask tries every token's bytes from the current state, but walks the
 * tokens sorted by their bytes, as a trie: a token that shares its first L
 * bytes with the previous one resumes from the state the previous one
 * reached after those L bytes (kept in a stack of states, one per byte),
 * and when the previous token failed at byte i, every following token that
 * shares bytes 0..i fails without a look. So after '{' (where only '"',
 * '}' and whitespace may come) almost the whole vocabulary is rejected by
 * one comparison per token. Inside a string, where nearly every token is
 * fine, "plain" tokens are accepted without simulation: those that, fed
 * inside a string, never leave it (no quote) and end where they began (no
 * control byte, whole UTF-8 characters, whole escapes). They leave the
 * state as it is. That is ~96% of Qwen's vocabulary.
 */
#include "engine/json_mask.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

enum json_mode {
    JS_START,     /* before the top-level object: only '{' */
    JS_OBJ_FIRST, /* after '{': a key or '}' */
    JS_OBJ_KEY,   /* after ',' in an object: a key */
    JS_COLON,     /* after a key */
    JS_VALUE,     /* after ':' or ',' in an array: a value */
    JS_ARR_FIRST, /* after '[': a value or ']' */
    JS_AFTER,     /* after a value: ',' or the container's closing bracket */
    JS_STRING,
    JS_ESCAPE,  /* after '\' in a string */
    JS_UNICODE, /* in \uXXXX; sub = hex digits seen */
    JS_LITERAL, /* in true / false / null; lit = which, sub = bytes matched */
    JS_NUMBER,  /* sub = enum json_num */
    JS_DONE,    /* the top-level object closed */
};

/* -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
enum json_num { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_EXP_SIGN, N_EXP_DIGITS };

static const char *const literals[] = {"true", "false", "null"};

/* ==== the validator ==== */

void json_fsm_init(struct json_fsm *f) {
    memset(f, 0, sizeof *f);
    f->mode = JS_START;
}

int json_fsm_done(const struct json_fsm *f) { return f->mode == JS_DONE; }

static int is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
static int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static int is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static int top_is_object(const struct json_fsm *f) { return (int)((f->stack >> (f->depth - 1)) & 1); }

static int open_container(struct json_fsm *f, int object) {
    if (f->depth == JSON_MAX_DEPTH) return -1;
    if (object) f->stack |= 1ull << f->depth;
    else f->stack &= ~(1ull << f->depth);
    f->depth++;
    f->mode = object ? JS_OBJ_FIRST : JS_ARR_FIRST;
    return 0;
}

static int close_container(struct json_fsm *f, int object) {
    if (f->depth == 0 || top_is_object(f) != object) return -1;
    f->depth--;
    f->mode = f->depth ? JS_AFTER : JS_DONE;
    return 0;
}

static int start_string(struct json_fsm *f, int key) {
    f->mode = JS_STRING;
    f->key = (uint8_t)key;
    f->u8_need = 0;
    return 0;
}

/* The lead byte of a multi-byte UTF-8 character: how many continuation
 * bytes follow and the range of the first (which excludes overlong forms,
 * surrogates and code points past U+10FFFF). */
static int utf8_lead(struct json_fsm *f, uint8_t c) {
    uint8_t lo = 0x80, hi = 0xBF, need;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return -1;
    f->u8_need = need, f->u8_lo = lo, f->u8_hi = hi;
    return 0;
}

static int value_start(struct json_fsm *f, uint8_t c) {
    switch (c) {
    case '{': return open_container(f, 1);
    case '[': return open_container(f, 0);
    case '"': return start_string(f, 0);
    case '-': f->mode = JS_NUMBER, f->sub = N_MINUS; return 0;
    case 't': f->mode = JS_LITERAL, f->lit = 0, f->sub = 1; return 0;
    case 'f': f->mode = JS_LITERAL, f->lit = 1, f->sub = 1; return 0;
    case 'n': f->mode = JS_LITERAL, f->lit = 2, f->sub = 1; return 0;
    default:
        if (!is_digit(c)) return -1;
        f->mode = JS_NUMBER, f->sub = c == '0' ? N_ZERO : N_INT;
        return 0;
    }
}

/* One byte of a number: 1 consumed, 0 the number ended before c, -1 invalid. */
static int number_byte(struct json_fsm *f, uint8_t c) {
    int d = is_digit(c), e = c == 'e' || c == 'E';
    switch (f->sub) {
    case N_MINUS:
        if (!d) return -1;
        f->sub = c == '0' ? N_ZERO : N_INT;
        return 1;
    case N_ZERO:
    case N_INT:
        if (d && f->sub == N_INT) return 1;
        if (d) return -1; /* no leading zeros */
        if (c == '.') return f->sub = N_DOT, 1;
        if (e) return f->sub = N_EXP, 1;
        return 0;
    case N_DOT:
        if (!d) return -1;
        return f->sub = N_FRAC, 1;
    case N_FRAC:
        if (d) return 1;
        if (e) return f->sub = N_EXP, 1;
        return 0;
    case N_EXP:
        if (c == '+' || c == '-') return f->sub = N_EXP_SIGN, 1;
        if (!d) return -1;
        return f->sub = N_EXP_DIGITS, 1;
    case N_EXP_SIGN:
        if (!d) return -1;
        return f->sub = N_EXP_DIGITS, 1;
    default: /* N_EXP_DIGITS */
        return d ? 1 : 0;
    }
}

int json_fsm_feed(struct json_fsm *f, uint8_t c) {
    switch (f->mode) {
    case JS_STRING:
        if (f->u8_need) {
            if (c < f->u8_lo || c > f->u8_hi) return -1;
            f->u8_need--;
            f->u8_lo = 0x80, f->u8_hi = 0xBF;
            return 0;
        }
        if (c == '"') {
            f->mode = f->key ? JS_COLON : JS_AFTER;
            return 0;
        }
        if (c == '\\') {
            f->mode = JS_ESCAPE;
            return 0;
        }
        if (c < 0x20) return -1; /* control characters must be escaped */
        return c < 0x80 ? 0 : utf8_lead(f, c);
    case JS_ESCAPE:
        if (c == 'u') {
            f->mode = JS_UNICODE, f->sub = 0;
            return 0;
        }
        if (c && strchr("\"\\/bfnrt", c)) {
            f->mode = JS_STRING;
            return 0;
        }
        return -1;
    case JS_UNICODE:
        if (!is_hex(c)) return -1;
        if (++f->sub == 4) f->mode = JS_STRING;
        return 0;
    case JS_LITERAL: {
        const char *w = literals[f->lit];
        if (c != (uint8_t)w[f->sub]) return -1;
        if (!w[++f->sub]) f->mode = JS_AFTER;
        return 0;
    }
    case JS_NUMBER: {
        int r = number_byte(f, c);
        if (r != 0) return r < 0 ? -1 : 0;
        f->mode = JS_AFTER; /* the number ended: c belongs to what follows */
        break;
    }
    default:
        break;
    }
    /* between tokens of the JSON text */
    if (is_ws(c)) return f->mode == JS_START || f->mode == JS_DONE || ++f->ws > JSON_MAX_WS ? -1 : 0;
    f->ws = 0;
    switch (f->mode) {
    case JS_START:
        return c == '{' ? open_container(f, 1) : -1;
    case JS_OBJ_FIRST:
        if (c == '}') return close_container(f, 1);
        return c == '"' ? start_string(f, 1) : -1;
    case JS_OBJ_KEY:
        return c == '"' ? start_string(f, 1) : -1;
    case JS_COLON:
        if (c != ':') return -1;
        f->mode = JS_VALUE;
        return 0;
    case JS_ARR_FIRST:
        if (c == ']') return close_container(f, 0);
        return value_start(f, c);
    case JS_VALUE:
        return value_start(f, c);
    case JS_AFTER:
        if (c == ',') {
            f->mode = top_is_object(f) ? JS_OBJ_KEY : JS_VALUE;
            return 0;
        }
        if (c == '}') return close_container(f, 1);
        if (c == ']') return close_container(f, 0);
        return -1;
    default: /* JS_DONE */
        return -1;
    }
}

int json_fsm_feed_bytes(struct json_fsm *f, const void *s, size_t n) {
    const uint8_t *b = s;
    for (size_t i = 0; i < n; i++)
        if (json_fsm_feed(f, b[i])) return -1;
    return 0;
}

/* ==== the vocabulary ==== */

struct json_vocab {
    int n_vocab;
    uint8_t *bytes;  /* the candidates' bytes, back to back */
    uint32_t *off;   /* [n_vocab + 1] id's bytes are bytes[off[id] .. off[id + 1]) */
    int32_t *order;  /* [n_order] candidate ids (non-empty bytes) sorted by their bytes */
    uint16_t *lcp;   /* [n_order] bytes shared with the previous id in order */
    uint8_t *plain;  /* [n_order] valid inside a string, and leaves its state as it was */
    int n_order, max_len;
    int32_t *never; /* ids that are never allowed (no bytes), EOS excluded */
    int n_never;
    int32_t *eos;
    int n_eos;
};

struct sort_item {
    const uint8_t *b;
    uint32_t n;
    int32_t id;
};

static int cmp_bytes(const void *pa, const void *pb) {
    const struct sort_item *a = pa, *b = pb;
    uint32_t n = a->n < b->n ? a->n : b->n;
    int c = memcmp(a->b, b->b, n);
    if (c) return c;
    if (a->n != b->n) return a->n < b->n ? -1 : 1;
    return a->id - b->id;
}

static int is_eos(const struct json_vocab *v, int32_t id) {
    for (int i = 0; i < v->n_eos; i++)
        if (v->eos[i] == id) return 1;
    return 0;
}

struct json_vocab *json_vocab_new(int n_vocab, json_token_bytes get, void *ctx, const int32_t *eos, int n_eos) {
    struct json_vocab *v = kiln_calloc(1, sizeof *v);
    v->n_vocab = n_vocab;
    v->eos = kiln_malloc(sizeof *v->eos * (size_t)(n_eos ? n_eos : 1));
    if (n_eos) memcpy(v->eos, eos, sizeof *v->eos * (size_t)n_eos);
    v->n_eos = n_eos;
    v->off = kiln_malloc(sizeof *v->off * (size_t)(n_vocab + 1));
    struct sort_item *it = kiln_malloc(sizeof *it * (size_t)(n_vocab ? n_vocab : 1));
    v->never = kiln_malloc(sizeof *v->never * (size_t)(n_vocab ? n_vocab : 1));
    size_t total = 0;
    for (int id = 0; id < n_vocab; id++) {
        size_t n = 0;
        const uint8_t *b = is_eos(v, id) ? NULL : get(ctx, id, &n);
        if (b && n > 0 && n < 65536) {
            it[v->n_order++] = (struct sort_item){b, (uint32_t)n, id};
            total += n;
        } else if (!is_eos(v, id)) {
            v->never[v->n_never++] = id;
        }
    }
    /* bytes in id order, so off[] serves both lookups by id and the walk */
    v->bytes = kiln_malloc(total ? total : 1);
    size_t at = 0;
    for (int k = 0, id = 0; id < n_vocab; id++) {
        v->off[id] = (uint32_t)at;
        if (k < v->n_order && it[k].id == id) {
            memcpy(v->bytes + at, it[k].b, it[k].n);
            at += it[k].n;
            if ((int)it[k].n > v->max_len) v->max_len = (int)it[k].n;
            k++;
        }
    }
    v->off[n_vocab] = (uint32_t)at;
    qsort(it, (size_t)v->n_order, sizeof *it, cmp_bytes);
    v->order = kiln_malloc(sizeof *v->order * (size_t)(v->n_order ? v->n_order : 1));
    v->lcp = kiln_malloc(sizeof *v->lcp * (size_t)(v->n_order ? v->n_order : 1));
    v->plain = kiln_malloc((size_t)(v->n_order ? v->n_order : 1));
    for (int k = 0; k < v->n_order; k++) {
        const uint8_t *b = v->bytes + v->off[it[k].id];
        uint32_t n = it[k].n, l = 0;
        if (k > 0) {
            const uint8_t *p = v->bytes + v->off[it[k - 1].id];
            uint32_t m = it[k - 1].n < n ? it[k - 1].n : n;
            while (l < m && p[l] == b[l]) l++;
        }
        v->order[k] = it[k].id;
        v->lcp[k] = (uint16_t)l;
        struct json_fsm f = {.mode = JS_STRING};
        int plain = !memchr(b, '"', n) && json_fsm_feed_bytes(&f, b, n) == 0 && f.mode == JS_STRING && f.u8_need == 0;
        v->plain[k] = (uint8_t)plain;
    }
    free(it);
    return v;
}

void json_vocab_free(struct json_vocab *v) {
    if (!v) return;
    free(v->bytes), free(v->off), free(v->order), free(v->lcp), free(v->plain), free(v->never), free(v->eos);
    free(v);
}

void json_vocab_mask(const struct json_vocab *v, const struct json_fsm *f, float *logits) {
    int done = json_fsm_done(f);
    for (int i = 0; i < v->n_never; i++) logits[v->never[i]] = -INFINITY;
    for (int i = 0; i < v->n_eos; i++)
        if (!done && v->eos[i] >= 0 && v->eos[i] < v->n_vocab) logits[v->eos[i]] = -INFINITY;
    if (done) {
        for (int k = 0; k < v->n_order; k++) logits[v->order[k]] = -INFINITY;
        return;
    }
    /* st[i]: the state after the first i bytes of the current token; valid
     * for i <= have. fail: the byte at which the last simulated token
     * failed (-1: it did not). */
    struct json_fsm *st = kiln_malloc(sizeof *st * (size_t)(v->max_len + 1));
    st[0] = *f;
    int have = 0, fail = -1;
    int fast = f->mode == JS_STRING && f->u8_need == 0;
    for (int k = 0; k < v->n_order; k++) {
        int32_t id = v->order[k];
        int l = v->lcp[k];
        if (fail >= 0 && l > fail) { /* shares the failing prefix */
            logits[id] = -INFINITY;
            continue;
        }
        if (fast && v->plain[k]) { /* plain text inside a string: fine, state unchanged */
            have = 0, fail = -1;
            continue;
        }
        const uint8_t *b = v->bytes + v->off[id];
        int n = (int)(v->off[id + 1] - v->off[id]);
        fail = -1;
        for (int i = l < have ? l : have; i < n; i++) {
            st[i + 1] = st[i];
            if (json_fsm_feed(&st[i + 1], b[i])) {
                fail = i;
                break;
            }
        }
        have = fail >= 0 ? fail : n;
        if (fail >= 0) logits[id] = -INFINITY;
    }
    free(st);
}

int json_vocab_accept(const struct json_vocab *v, struct json_fsm *f, int32_t id) {
    if (is_eos(v, id)) return json_fsm_done(f) ? 0 : -1;
    if (id < 0 || id >= v->n_vocab || v->off[id + 1] == v->off[id]) return -1;
    return json_fsm_feed_bytes(f, v->bytes + v->off[id], v->off[id + 1] - v->off[id]);
}
