/*
 * jinja_value.c: template values and how Python prints them.
 *
 * Templates run in Python, so what they print is Python's: str() of None is
 * "None", of True "True", of 1.0 "1.0" (shortest round-trip repr), of a list
 * its repr with single-quoted strings. tojson is transformers' own filter:
 * json.dumps(x, ensure_ascii=False, indent=indent, separators=None,
 * sort_keys=sort_keys), so non-ASCII text is kept and the default separators
 * are ", " and ": " (",", ": " once indent is given).
 *
 * JSON numbers become ints when they are integral and fit in 53 bits (cJSON
 * does not keep the literal, so an input "1.0" becomes 1: a known limit).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tokenizer/jinja.h"

/* ==== constructors ==== */

struct jval jv_undef(void) { return (struct jval){.t = JV_UNDEF}; }
struct jval jv_none(void) { return (struct jval){.t = JV_NONE}; }
struct jval jv_bool(int b) { return (struct jval){.t = JV_BOOL, .u.b = !!b}; }
struct jval jv_int(int64_t i) { return (struct jval){.t = JV_INT, .u.i = i}; }
struct jval jv_float(double f) { return (struct jval){.t = JV_FLOAT, .u.f = f}; }

struct jval jv_str(struct jarena *a, const char *s, size_t n) {
    struct jstr *p = jarena_alloc(a, sizeof *p + n + 1);
    p->n = n;
    if (n && s) memcpy(p->s, s, n);
    p->s[n] = 0;
    return (struct jval){.t = JV_STR, .u.s = p};
}

struct jval jv_cstr(struct jarena *a, const char *s) { return jv_str(a, s, strlen(s)); }

struct jval jv_list(struct jarena *a, int cap) {
    struct jlist *l = jarena_alloc(a, sizeof *l);
    l->cap = cap > 0 ? cap : 4;
    l->v = jarena_alloc(a, (size_t)l->cap * sizeof *l->v);
    return (struct jval){.t = JV_LIST, .u.l = l};
}

struct jval jv_dict(struct jarena *a, int cap) {
    struct jdict *d = jarena_alloc(a, sizeof *d);
    d->cap = cap > 0 ? cap : 4;
    d->k = jarena_alloc(a, (size_t)d->cap * sizeof *d->k);
    d->v = jarena_alloc(a, (size_t)d->cap * sizeof *d->v);
    return (struct jval){.t = JV_DICT, .u.d = d};
}

void jv_list_push(struct jarena *a, struct jval *list, struct jval v) {
    struct jlist *l = list->u.l;
    if (l->n == l->cap) {
        struct jval *nv = jarena_alloc(a, (size_t)l->cap * 2 * sizeof *nv);
        memcpy(nv, l->v, (size_t)l->n * sizeof *nv);
        l->v = nv, l->cap *= 2;
    }
    l->v[l->n++] = v;
}

struct jval *jv_dict_getv(const struct jval *dict, struct jval key) {
    struct jdict *d = dict->u.d;
    for (int i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], key)) return &d->v[i];
    return NULL;
}

struct jval *jv_dict_get(const struct jval *dict, const char *key, size_t n) {
    struct jdict *d = dict->u.d;
    for (int i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s->n == n && !memcmp(d->k[i].u.s->s, key, n)) return &d->v[i];
    return NULL;
}

void jv_dict_set(struct jarena *a, struct jval *dict, struct jval k, struct jval v) {
    struct jval *old = jv_dict_getv(dict, k);
    if (old) {
        *old = v;
        return;
    }
    struct jdict *d = dict->u.d;
    if (d->n == d->cap) {
        struct jval *nk = jarena_alloc(a, (size_t)d->cap * 2 * sizeof *nk);
        struct jval *nv = jarena_alloc(a, (size_t)d->cap * 2 * sizeof *nv);
        memcpy(nk, d->k, (size_t)d->n * sizeof *nk);
        memcpy(nv, d->v, (size_t)d->n * sizeof *nv);
        d->k = nk, d->v = nv, d->cap *= 2;
    }
    d->k[d->n] = k, d->v[d->n] = v;
    d->n++;
}

/* ==== Python semantics ==== */

int jv_truthy(struct jval v) {
    switch (v.t) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s->n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static int is_num(struct jval v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double num(struct jval v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : v.u.b; }

int jv_equal(struct jval a, struct jval b) {
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return (a.t == JV_INT ? a.u.i : a.u.b) == (b.t == JV_INT ? b.u.i : b.u.b);
        return num(a) == num(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a.u.s->n == b.u.s->n && !memcmp(a.u.s->s, b.u.s->s, a.u.s->n);
    case JV_LIST:
        if (a.u.l->n != b.u.l->n) return 0;
        for (int i = 0; i < a.u.l->n; i++)
            if (!jv_equal(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (int i = 0; i < a.u.d->n; i++) {
            struct jval *o = jv_dict_getv(&b, a.u.d->k[i]);
            if (!o || !jv_equal(a.u.d->v[i], *o)) return 0;
        }
        return 1;
    case JV_NS: return a.u.d == b.u.d;
    case JV_MACRO: return a.u.macro == b.u.macro;
    default: return 0;
    }
}

const char *jv_type_name(struct jval v) {
    static const char *names[] = {"undefined", "NoneType", "bool", "int", "float", "str", "list", "dict",
                                  "Namespace", "macro", "function"};
    return names[v.t];
}

/* ==== conversion from JSON ==== */

struct jval jv_from_json(struct jarena *a, const cJSON *j) {
    if (!j || cJSON_IsNull(j)) return jv_none();
    if (cJSON_IsBool(j)) return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0) return jv_int((int64_t)d);
        return jv_float(d);
    }
    if (cJSON_IsString(j)) return jv_cstr(a, j->valuestring);
    if (cJSON_IsArray(j)) {
        struct jval l = jv_list(a, cJSON_GetArraySize(j));
        const cJSON *it;
        cJSON_ArrayForEach(it, j) jv_list_push(a, &l, jv_from_json(a, it));
        return l;
    }
    if (cJSON_IsObject(j)) {
        struct jval d = jv_dict(a, cJSON_GetArraySize(j));
        const cJSON *it;
        cJSON_ArrayForEach(it, j) jv_dict_set(a, &d, jv_cstr(a, it->string), jv_from_json(a, it));
        return d;
    }
    return jv_none();
}

/* ==== printing ==== */

void jbuf_put(struct jbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        b->s = kiln_realloc(b->s, c);
        b->cap = c;
    }
    if (n) memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

void jbuf_puts(struct jbuf *b, const char *s) { jbuf_put(b, s, strlen(s)); }

/* Python's float repr: the shortest digits that round-trip, fixed notation
 * for exponents -4..15, otherwise d.ddde+XX */
void jv_float_repr(char *out, size_t n, double f) {
    if (isnan(f)) { snprintf(out, n, "nan"); return; }
    if (isinf(f)) { snprintf(out, n, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { snprintf(out, n, signbit(f) ? "-0.0" : "0.0"); return; }
    char e[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, neg = e[0] == '-';
    const char *q = e + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char *o = out;
    size_t left = n;
#define PUT(c) do { if (left > 1) *o++ = (c), left--; } while (0)
    if (neg) PUT('-');
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            PUT('0');
            PUT('.');
            for (int i = 0; i < -exp - 1; i++) PUT('0');
            for (int i = 0; i < nd; i++) PUT(digits[i]);
        } else {
            for (int i = 0; i <= exp; i++) PUT(i < nd ? digits[i] : '0');
            PUT('.');
            if (nd > exp + 1) for (int i = exp + 1; i < nd; i++) PUT(digits[i]);
            else PUT('0');
        }
    } else {
        PUT(digits[0]);
        if (nd > 1) {
            PUT('.');
            for (int i = 1; i < nd; i++) PUT(digits[i]);
        }
        char ex[16];
        snprintf(ex, sizeof ex, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        for (char *x = ex; *x; x++) PUT(*x);
    }
#undef PUT
    *o = 0;
}

static void put_int(struct jbuf *b, int64_t i) {
    char t[32];
    snprintf(t, sizeof t, "%lld", (long long)i);
    jbuf_puts(b, t);
}

/* repr of a str: single quotes unless it holds ' and no " */
static void repr_str(struct jbuf *b, const struct jstr *s) {
    char q = memchr(s->s, '\'', s->n) && !memchr(s->s, '"', s->n) ? '"' : '\'';
    jbuf_put(b, &q, 1);
    for (size_t i = 0; i < s->n; i++) {
        unsigned char c = (unsigned char)s->s[i];
        char t[8];
        if (c == '\\' || c == (unsigned char)q) jbuf_put(b, "\\", 1), jbuf_put(b, (char *)&c, 1);
        else if (c == '\n') jbuf_puts(b, "\\n");
        else if (c == '\r') jbuf_puts(b, "\\r");
        else if (c == '\t') jbuf_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) snprintf(t, sizeof t, "\\x%02x", c), jbuf_puts(b, t);
        else jbuf_put(b, (char *)&c, 1);
    }
    jbuf_put(b, &q, 1);
}

void jv_repr_to(struct jbuf *b, struct jval v) {
    if (v.t == JV_STR) repr_str(b, v.u.s);
    else jv_str_to(b, v);
}

void jv_str_to(struct jbuf *b, struct jval v) {
    char t[40];
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: jbuf_puts(b, "None"); return;
    case JV_BOOL: jbuf_puts(b, v.u.b ? "True" : "False"); return;
    case JV_INT: put_int(b, v.u.i); return;
    case JV_FLOAT: jv_float_repr(t, sizeof t, v.u.f), jbuf_puts(b, t); return;
    case JV_STR: jbuf_put(b, v.u.s->s, v.u.s->n); return;
    case JV_LIST:
        jbuf_puts(b, v.u.l->tuple ? "(" : "[");
        for (int i = 0; i < v.u.l->n; i++) {
            if (i) jbuf_puts(b, ", ");
            jv_repr_to(b, v.u.l->v[i]);
        }
        jbuf_puts(b, v.u.l->tuple ? (v.u.l->n == 1 ? ",)" : ")") : "]");
        return;
    case JV_DICT:
        jbuf_puts(b, "{");
        for (int i = 0; i < v.u.d->n; i++) {
            if (i) jbuf_puts(b, ", ");
            jv_repr_to(b, v.u.d->k[i]);
            jbuf_puts(b, ": ");
            jv_repr_to(b, v.u.d->v[i]);
        }
        jbuf_puts(b, "}");
        return;
    case JV_NS: jbuf_puts(b, "<Namespace>"); return;
    case JV_MACRO: jbuf_puts(b, "<Macro>"); return;
    case JV_FUNC: jbuf_puts(b, "<function>"); return;
    }
}

static void json_str(struct jbuf *b, const char *s, size_t n) {
    jbuf_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char t[8];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) snprintf(t, sizeof t, "\\u%04x", c), esc = t;
        if (!esc) continue;
        jbuf_put(b, s + run, i - run);
        jbuf_puts(b, esc);
        run = i + 1;
    }
    jbuf_put(b, s + run, n - run);
    jbuf_put(b, "\"", 1);
}

static void json_newline(struct jbuf *b, int indent, const char *indent_str, int depth) {
    jbuf_put(b, "\n", 1);
    for (int i = 0; i < depth; i++) {
        if (indent_str) jbuf_puts(b, indent_str);
        else for (int k = 0; k < indent; k++) jbuf_put(b, " ", 1);
    }
}

static int key_cmp(const void *x, const void *y) {
    const struct jval *a = *(const struct jval *const *)x, *b = *(const struct jval *const *)y;
    if (a->t == JV_STR && b->t == JV_STR) {
        size_t n = a->u.s->n < b->u.s->n ? a->u.s->n : b->u.s->n;
        int c = memcmp(a->u.s->s, b->u.s->s, n);
        return c ? c : (a->u.s->n > b->u.s->n) - (a->u.s->n < b->u.s->n);
    }
    return 0;
}

int jv_json_to(struct jbuf *b, struct jval v, int indent, const char *indent_str, int sort_keys, int depth) {
    int pretty = indent >= 0 || indent_str;
    char t[40];
    if (depth > 200) return -1;
    switch (v.t) {
    case JV_NONE: jbuf_puts(b, "null"); return 0;
    case JV_BOOL: jbuf_puts(b, v.u.b ? "true" : "false"); return 0;
    case JV_INT: put_int(b, v.u.i); return 0;
    case JV_FLOAT:
        if (isnan(v.u.f)) jbuf_puts(b, "NaN");
        else if (isinf(v.u.f)) jbuf_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else jv_float_repr(t, sizeof t, v.u.f), jbuf_puts(b, t);
        return 0;
    case JV_STR: json_str(b, v.u.s->s, v.u.s->n); return 0;
    case JV_LIST:
        if (!v.u.l->n) return jbuf_puts(b, "[]"), 0;
        jbuf_puts(b, "[");
        for (int i = 0; i < v.u.l->n; i++) {
            if (i) jbuf_puts(b, pretty ? "," : ", ");
            if (pretty) json_newline(b, indent, indent_str, depth + 1);
            if (jv_json_to(b, v.u.l->v[i], indent, indent_str, sort_keys, depth + 1)) return -1;
        }
        if (pretty) json_newline(b, indent, indent_str, depth);
        jbuf_puts(b, "]");
        return 0;
    case JV_DICT:
    case JV_NS: {
        struct jdict *d = v.u.d;
        if (!d->n) return jbuf_puts(b, "{}"), 0;
        int *order = kiln_malloc((size_t)d->n * sizeof *order);
        for (int i = 0; i < d->n; i++) order[i] = i;
        if (sort_keys) { /* insertion sort on the key strings: dicts here are small */
            for (int i = 1; i < d->n; i++)
                for (int j = i; j > 0; j--) {
                    const struct jval *x = &d->k[order[j - 1]], *y = &d->k[order[j]];
                    if (key_cmp(&x, &y) <= 0) break;
                    int tmp = order[j];
                    order[j] = order[j - 1], order[j - 1] = tmp;
                }
        }
        jbuf_puts(b, "{");
        for (int i = 0; i < d->n; i++) {
            struct jval k = d->k[order[i]];
            if (i) jbuf_puts(b, pretty ? "," : ", ");
            if (pretty) json_newline(b, indent, indent_str, depth + 1);
            if (k.t == JV_STR) json_str(b, k.u.s->s, k.u.s->n);
            else { /* json.dumps turns int/float/bool/None keys into strings */
                struct jbuf kb = {0};
                if (k.t == JV_BOOL) jbuf_puts(&kb, k.u.b ? "true" : "false");
                else if (k.t == JV_NONE) jbuf_puts(&kb, "null");
                else jv_str_to(&kb, k);
                json_str(b, kb.s ? kb.s : "", kb.n);
                free(kb.s);
            }
            jbuf_puts(b, ": ");
            if (jv_json_to(b, d->v[order[i]], indent, indent_str, sort_keys, depth + 1)) {
                free(order);
                return -1;
            }
        }
        free(order);
        if (pretty) json_newline(b, indent, indent_str, depth);
        jbuf_puts(b, "}");
        return 0;
    }
    default: return -1;
    }
}
