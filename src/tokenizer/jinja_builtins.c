/*
 * jinja_builtins.c: the filters, tests, globals and Python methods that chat
 * templates use.
 *
 * Filters: tojson (transformers' version), trim, length/count, upper, lower,
 * capitalize, title, default/d, first, last, join, list, items, replace,
 * string, int, float, abs, round, reverse, sort, unique, min, max, sum,
 * selectattr/rejectattr, select/reject, map, safe, escape/e, indent, format,
 * wordcount, dictsort. Tests: defined, undefined, none, string, mapping,
 * iterable, sequence, number, integer, float, boolean, true, false, callable,
 * eq/ne/lt/gt/le/ge (and ==, != ...), in, odd, even, divisibleby, lower,
 * upper, sameas. Methods: str (startswith, endswith, split, rsplit, strip,
 * lstrip, rstrip, replace, upper, lower, title, capitalize, find, count,
 * join, splitlines, isdigit, isalpha, isspace ...), dict (get, items, keys,
 * values), list (index, count). Globals: range, namespace, dict,
 * raise_exception, strftime_now.
 *
 * Strings are UTF-8 and Python counts code points: length and indexing do too.
 * Case mapping and whitespace use utf8proc (Python's str.isspace/upper/lower).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem, localtime_r, strncasecmp */
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "base/base.h"
#include "tokenizer/jinja.h"

enum {
    M_STARTSWITH = 1, M_ENDSWITH, M_SPLIT, M_RSPLIT, M_STRIP, M_LSTRIP, M_RSTRIP, M_REPLACE, M_UPPER, M_LOWER,
    M_TITLE, M_CAPITALIZE, M_FIND, M_COUNT, M_JOIN, M_SPLITLINES, M_ISDIGIT, M_ISALPHA, M_ISSPACE, M_ISUPPER,
    M_ISLOWER, M_ISALNUM, M_REMOVEPREFIX, M_REMOVESUFFIX,
    M_GET = 40, M_ITEMS, M_KEYS, M_VALUES,
    M_INDEX = 60, M_LCOUNT,
    G_RANGE = 80, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME
};

static const struct { const char *name; int id; } str_methods[] = {
    {"startswith", M_STARTSWITH}, {"endswith", M_ENDSWITH}, {"split", M_SPLIT}, {"rsplit", M_RSPLIT},
    {"strip", M_STRIP}, {"lstrip", M_LSTRIP}, {"rstrip", M_RSTRIP}, {"replace", M_REPLACE}, {"upper", M_UPPER},
    {"lower", M_LOWER}, {"title", M_TITLE}, {"capitalize", M_CAPITALIZE}, {"find", M_FIND}, {"count", M_COUNT},
    {"join", M_JOIN}, {"splitlines", M_SPLITLINES}, {"isdigit", M_ISDIGIT}, {"isalpha", M_ISALPHA},
    {"isspace", M_ISSPACE}, {"isupper", M_ISUPPER}, {"islower", M_ISLOWER}, {"isalnum", M_ISALNUM},
    {"removeprefix", M_REMOVEPREFIX}, {"removesuffix", M_REMOVESUFFIX}, {NULL, 0}};
static const struct { const char *name; int id; } dict_methods[] = {
    {"get", M_GET}, {"items", M_ITEMS}, {"keys", M_KEYS}, {"values", M_VALUES}, {NULL, 0}};
static const struct { const char *name; int id; } list_methods[] = {{"index", M_INDEX}, {"count", M_LCOUNT}, {NULL, 0}};
static const struct { const char *name; int id; } globals[] = {
    {"range", G_RANGE}, {"namespace", G_NAMESPACE}, {"dict", G_DICT}, {"raise_exception", G_RAISE},
    {"strftime_now", G_STRFTIME}, {NULL, 0}};

/* ==== helpers ==== */

static struct jval bind(struct jctx *c, int id, struct jval self) {
    struct jfunc *f = jarena_alloc(&c->arena, sizeof *f);
    f->id = id;
    f->self = jarena_alloc(&c->arena, sizeof *f->self);
    *f->self = self;
    return (struct jval){.t = JV_FUNC, .u.fn = f};
}

struct jval jinja_getattr(struct jctx *c, struct jval obj, const char *name) {
    if (obj.t == JV_DICT) {
        for (int i = 0; dict_methods[i].name; i++)
            if (!strcmp(name, dict_methods[i].name)) return bind(c, dict_methods[i].id, obj);
    }
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        struct jval *v = jv_dict_get(&obj, name, strlen(name));
        return v ? *v : jv_undef();
    }
    if (obj.t == JV_STR)
        for (int i = 0; str_methods[i].name; i++)
            if (!strcmp(name, str_methods[i].name)) return bind(c, str_methods[i].id, obj);
    if (obj.t == JV_LIST)
        for (int i = 0; list_methods[i].name; i++)
            if (!strcmp(name, list_methods[i].name)) return bind(c, list_methods[i].id, obj);
    return jv_undef();
}

struct jval jinja_global(struct jctx *c, const char *name) {
    for (int i = 0; globals[i].name; i++)
        if (!strcmp(name, globals[i].name)) return bind(c, globals[i].id, jv_none());
    return jv_undef();
}

int jinja_to_list(struct jctx *c, int line, struct jval x, struct jval *out) {
    if (x.t == JV_LIST) return *out = x, 0;
    if (x.t == JV_UNDEF) return *out = jv_list(&c->arena, 1), 0;
    if (x.t == JV_DICT || x.t == JV_NS) {
        struct jval l = jv_list(&c->arena, x.u.d->n);
        for (int i = 0; i < x.u.d->n; i++) jv_list_push(&c->arena, &l, x.u.d->k[i]);
        return *out = l, 0;
    }
    if (x.t == JV_STR) {
        struct jval l = jv_list(&c->arena, (int)x.u.s->n);
        for (size_t i = 0; i < x.u.s->n;) {
            size_t k = i + 1;
            while (k < x.u.s->n && ((unsigned char)x.u.s->s[k] & 0xC0) == 0x80) k++;
            jv_list_push(&c->arena, &l, jv_str(&c->arena, x.u.s->s + i, k - i));
            i = k;
        }
        return *out = l, 0;
    }
    return jinja_fail(c, line, "'%s' object is not iterable", jv_type_name(x));
}

/* argument i (positional) or named kw, else dflt */
static struct jval arg(const struct jargs *a, int i, const char *kw, struct jval dflt) {
    if (kw)
        for (int k = 0; k < a->n_kw; k++)
            if (!strcmp(a->kw_names[k], kw)) return a->kw[k];
    return i >= 0 && i < a->n ? a->v[i] : dflt;
}

static int64_t cp_len(const struct jstr *s) {
    int64_t n = 0;
    for (size_t i = 0; i < s->n; i++) n += ((unsigned char)s->s[i] & 0xC0) != 0x80;
    return n;
}

static int32_t next_cp(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (l <= 0) l = 1, cp = (unsigned char)s[*i];
    *i += (size_t)l;
    return cp;
}

static void put_cp(struct jbuf *b, int32_t cp) {
    utf8proc_uint8_t u[4];
    utf8proc_ssize_t l = utf8proc_encode_char(cp, u);
    jbuf_put(b, (char *)u, (size_t)l);
}

static int py_isspace(int32_t c) {
    if (c < 0x80) return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f);
    utf8proc_category_t k = utf8proc_category(c);
    return c == 0x85 || k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

static struct jval buf_val(struct jctx *c, struct jbuf *b) {
    struct jval v = jv_str(&c->arena, b->s ? b->s : "", b->n);
    free(b->s);
    return v;
}

/* case mapping: mode 0 upper, 1 lower, 2 title, 3 capitalize */
static struct jval str_case(struct jctx *c, const struct jstr *s, int mode) {
    struct jbuf b = {0};
    int prev_cased = 0, first = 1;
    for (size_t i = 0; i < s->n;) {
        int32_t cp = next_cp(s->s, s->n, &i);
        int32_t o;
        if (mode == 0) o = utf8proc_toupper(cp);
        else if (mode == 1) o = utf8proc_tolower(cp);
        else if (mode == 2) o = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
        else o = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
        int cased = utf8proc_tolower(cp) != cp || utf8proc_toupper(cp) != cp;
        prev_cased = cased;
        first = 0;
        put_cp(&b, o);
    }
    return buf_val(c, &b);
}

/* strip: which 1 left, 2 right, 3 both; chars NULL = whitespace */
static struct jval str_strip(struct jctx *c, const struct jstr *s, int which, const struct jstr *chars) {
    size_t lo = 0, hi = s->n;
    if (which & 1)
        while (lo < hi) {
            size_t k = lo;
            int32_t cp = next_cp(s->s, s->n, &k);
            int hit = chars ? memmem(chars->s, chars->n, s->s + lo, k - lo) != NULL : py_isspace(cp);
            if (!hit) break;
            lo = k;
        }
    if (which & 2)
        while (hi > lo) {
            size_t st = hi - 1;
            while (st > lo && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
            size_t k = st;
            int32_t cp = next_cp(s->s, s->n, &k);
            int hit = chars ? memmem(chars->s, chars->n, s->s + st, hi - st) != NULL : py_isspace(cp);
            if (!hit) break;
            hi = st;
        }
    return jv_str(&c->arena, s->s + lo, hi - lo);
}

static struct jval str_split(struct jctx *c, const struct jstr *s, const struct jstr *sep, int64_t maxsplit, int right) {
    struct jval l = jv_list(&c->arena, 8);
    if (!sep) { /* runs of whitespace, no empty strings; the rest after maxsplit keeps its tail */
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            while (i < s->n) {
                size_t m = i;
                if (!py_isspace(next_cp(s->s, s->n, &m))) break;
                i = m;
            }
            if (i >= s->n) break;
            if (maxsplit >= 0 && done >= maxsplit) {
                jv_list_push(&c->arena, &l, jv_str(&c->arena, s->s + i, s->n - i));
                break;
            }
            size_t e = i;
            while (e < s->n) {
                size_t m = e;
                if (py_isspace(next_cp(s->s, s->n, &m))) break;
                e = m;
            }
            jv_list_push(&c->arena, &l, jv_str(&c->arena, s->s + i, e - i));
            i = e;
            done++;
        }
        return l;
    }
    if (!right) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *hit = maxsplit >= 0 && done >= maxsplit ? NULL : memmem(s->s + i, s->n - i, sep->s, sep->n);
            if (!hit) {
                jv_list_push(&c->arena, &l, jv_str(&c->arena, s->s + i, s->n - i));
                return l;
            }
            jv_list_push(&c->arena, &l, jv_str(&c->arena, s->s + i, (size_t)(hit - (s->s + i))));
            i = (size_t)(hit - s->s) + sep->n;
            done++;
        }
    }
    /* rsplit with a separator: split from the right, then reverse */
    struct jval rev = jv_list(&c->arena, 8);
    size_t end = s->n;
    int64_t done = 0;
    for (;;) {
        const char *hit = NULL;
        if (maxsplit < 0 || done < maxsplit)
            for (size_t k = end >= sep->n ? end - sep->n + 1 : 0; k-- > 0;)
                if (!memcmp(s->s + k, sep->s, sep->n)) {
                    hit = s->s + k;
                    break;
                }
        if (!hit) {
            jv_list_push(&c->arena, &rev, jv_str(&c->arena, s->s, end));
            break;
        }
        size_t st = (size_t)(hit - s->s) + sep->n;
        jv_list_push(&c->arena, &rev, jv_str(&c->arena, s->s + st, end - st));
        end = (size_t)(hit - s->s);
        done++;
    }
    for (int i = rev.u.l->n - 1; i >= 0; i--) jv_list_push(&c->arena, &l, rev.u.l->v[i]);
    return l;
}

static struct jval str_replace(struct jctx *c, const struct jstr *s, const struct jstr *old, const struct jstr *new,
                               int64_t count) {
    struct jbuf b = {0};
    if (!old->n) { /* Python inserts new between every character */
        int64_t done = 0;
        for (size_t i = 0; i <= s->n;) {
            if (count < 0 || done < count) jbuf_put(&b, new->s, new->n), done++;
            if (i == s->n) break;
            size_t k = i;
            next_cp(s->s, s->n, &k);
            jbuf_put(&b, s->s + i, k - i);
            i = k;
        }
        return buf_val(c, &b);
    }
    size_t i = 0;
    int64_t done = 0;
    for (;;) {
        const char *hit = count >= 0 && done >= count ? NULL : memmem(s->s + i, s->n - i, old->s, old->n);
        if (!hit) break;
        jbuf_put(&b, s->s + i, (size_t)(hit - (s->s + i)));
        jbuf_put(&b, new->s, new->n);
        i = (size_t)(hit - s->s) + old->n;
        done++;
    }
    jbuf_put(&b, s->s + i, s->n - i);
    return buf_val(c, &b);
}

static int need_str(struct jctx *c, int line, const char *what, struct jval v) {
    if (v.t == JV_STR) return 0;
    return jinja_fail(c, line, "%s expects a string, got '%s'", what, jv_type_name(v));
}

static int prefix_test(struct jctx *c, int line, const struct jstr *s, struct jval p, int end, int *res) {
    *res = 0;
    if (p.t == JV_LIST) {
        for (int i = 0; i < p.u.l->n && !*res; i++)
            if (prefix_test(c, line, s, p.u.l->v[i], end, res)) return -1;
        return 0;
    }
    if (need_str(c, line, end ? "endswith" : "startswith", p)) return -1;
    size_t n = p.u.s->n;
    *res = n <= s->n && !memcmp(end ? s->s + s->n - n : s->s, p.u.s->s, n);
    return 0;
}

static int str_all(const struct jstr *s, int kind) {
    if (!s->n) return 0;
    int has_cased = 0;
    for (size_t i = 0; i < s->n;) {
        int32_t cp = next_cp(s->s, s->n, &i);
        utf8proc_category_t k = utf8proc_category(cp);
        int alpha = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        int digit = k == UTF8PROC_CATEGORY_ND;
        int upper = utf8proc_tolower(cp) != cp, lower = utf8proc_toupper(cp) != cp;
        switch (kind) {
        case M_ISDIGIT: if (!digit) return 0; break;
        case M_ISALPHA: if (!alpha) return 0; break;
        case M_ISALNUM: if (!alpha && !digit && k != UTF8PROC_CATEGORY_NL && k != UTF8PROC_CATEGORY_NO) return 0; break;
        case M_ISSPACE: if (!py_isspace(cp)) return 0; break;
        case M_ISUPPER: if (lower) return 0; has_cased |= upper; break;
        case M_ISLOWER: if (upper) return 0; has_cased |= lower; break;
        }
    }
    return kind == M_ISUPPER || kind == M_ISLOWER ? has_cased : 1;
}

/* ==== calls ==== */

static int call_str_method(struct jctx *c, int line, int id, const struct jstr *s, const struct jargs *a, struct jval *out) {
    struct jval none = jv_none();
    struct jval a0 = arg(a, 0, NULL, none), a1 = arg(a, 1, NULL, none);
    int r;
    switch (id) {
    case M_STARTSWITH:
    case M_ENDSWITH:
        if (prefix_test(c, line, s, a0, id == M_ENDSWITH, &r)) return -1;
        return *out = jv_bool(r), 0;
    case M_SPLIT:
    case M_RSPLIT: {
        struct jval sep = arg(a, 0, "sep", none), mx = arg(a, 1, "maxsplit", jv_int(-1));
        if (sep.t != JV_NONE && (need_str(c, line, "split", sep))) return -1;
        if (sep.t == JV_STR && !sep.u.s->n) return jinja_fail(c, line, "split: empty separator");
        return *out = str_split(c, s, sep.t == JV_STR ? sep.u.s : NULL, mx.t == JV_INT ? mx.u.i : -1, id == M_RSPLIT), 0;
    }
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP:
        if (a0.t != JV_NONE && need_str(c, line, "strip", a0)) return -1;
        return *out = str_strip(c, s, id == M_STRIP ? 3 : id == M_LSTRIP ? 1 : 2, a0.t == JV_STR ? a0.u.s : NULL), 0;
    case M_REPLACE: {
        struct jval cnt = arg(a, 2, "count", jv_int(-1));
        if (need_str(c, line, "replace", a0) || need_str(c, line, "replace", a1)) return -1;
        return *out = str_replace(c, s, a0.u.s, a1.u.s, cnt.t == JV_INT ? cnt.u.i : -1), 0;
    }
    case M_UPPER: return *out = str_case(c, s, 0), 0;
    case M_LOWER: return *out = str_case(c, s, 1), 0;
    case M_TITLE: return *out = str_case(c, s, 2), 0;
    case M_CAPITALIZE: return *out = str_case(c, s, 3), 0;
    case M_FIND:
    case M_COUNT: {
        if (need_str(c, line, id == M_FIND ? "find" : "count", a0)) return -1;
        if (id == M_FIND) {
            const char *h = memmem(s->s, s->n, a0.u.s->s, a0.u.s->n);
            if (!h) return *out = jv_int(-1), 0;
            struct jstr *pre = jarena_alloc(&c->arena, sizeof *pre + (size_t)(h - s->s) + 1);
            pre->n = (size_t)(h - s->s);
            memcpy(pre->s, s->s, pre->n);
            return *out = jv_int(cp_len(pre)), 0;
        }
        if (!a0.u.s->n) return *out = jv_int(cp_len(s) + 1), 0;
        int64_t n = 0;
        for (const char *p = s->s; (p = memmem(p, s->n - (size_t)(p - s->s), a0.u.s->s, a0.u.s->n)); p += a0.u.s->n) n++;
        return *out = jv_int(n), 0;
    }
    case M_JOIN: {
        struct jval l;
        if (jinja_to_list(c, line, a0, &l)) return -1;
        struct jbuf b = {0};
        for (int i = 0; i < l.u.l->n; i++) {
            if (i) jbuf_put(&b, s->s, s->n);
            if (l.u.l->v[i].t != JV_STR) {
                free(b.s);
                return jinja_fail(c, line, "join: sequence item %d: expected str, got '%s'", i, jv_type_name(l.u.l->v[i]));
            }
            jbuf_put(&b, l.u.l->v[i].u.s->s, l.u.l->v[i].u.s->n);
        }
        return *out = buf_val(c, &b), 0;
    }
    case M_SPLITLINES: {
        struct jval l = jv_list(&c->arena, 8);
        size_t i = 0;
        while (i < s->n) {
            size_t e = i;
            while (e < s->n && s->s[e] != '\n' && s->s[e] != '\r') e++;
            jv_list_push(&c->arena, &l, jv_str(&c->arena, s->s + i, e - i));
            if (e < s->n && s->s[e] == '\r' && e + 1 < s->n && s->s[e + 1] == '\n') e++;
            i = e + 1;
        }
        return *out = l, 0;
    }
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX: {
        if (need_str(c, line, "removeprefix", a0)) return -1;
        if (prefix_test(c, line, s, a0, id == M_REMOVESUFFIX, &r)) return -1;
        if (!r) return *out = (struct jval){.t = JV_STR, .u.s = (struct jstr *)s}, 0;
        size_t n = a0.u.s->n;
        return *out = jv_str(&c->arena, id == M_REMOVEPREFIX ? s->s + n : s->s, s->n - n), 0;
    }
    default: return *out = jv_bool(str_all(s, id)), 0;
    }
}

static struct jval pair(struct jctx *c, struct jval k, struct jval v) {
    struct jval p = jv_list(&c->arena, 2);
    jv_list_push(&c->arena, &p, k);
    jv_list_push(&c->arena, &p, v);
    p.u.l->tuple = 1;
    return p;
}

int jinja_call_func(struct jctx *c, int line, const struct jfunc *f, const struct jargs *a, struct jval *out) {
    struct jval self = *f->self, none = jv_none();
    if (f->id == -1) { /* loop.cycle(a, b, ...) */
        struct jval *i0 = jv_dict_get(&self, "index0", 6);
        if (!a->n) return jinja_fail(c, line, "loop.cycle needs at least one argument");
        return *out = a->v[i0->u.i % a->n], 0;
    }
    if (f->id < M_GET) return call_str_method(c, line, f->id, self.u.s, a, out);
    switch (f->id) {
    case M_GET: {
        struct jval *v = jv_dict_getv(&self, arg(a, 0, NULL, none));
        return *out = v ? *v : arg(a, 1, "default", none), 0;
    }
    case M_ITEMS:
    case M_KEYS:
    case M_VALUES: {
        struct jval l = jv_list(&c->arena, self.u.d->n);
        for (int i = 0; i < self.u.d->n; i++)
            jv_list_push(&c->arena, &l, f->id == M_ITEMS ? pair(c, self.u.d->k[i], self.u.d->v[i])
                                        : f->id == M_KEYS ? self.u.d->k[i] : self.u.d->v[i]);
        return *out = l, 0;
    }
    case M_INDEX:
    case M_LCOUNT: {
        int64_t n = 0;
        for (int i = 0; i < self.u.l->n; i++)
            if (jv_equal(self.u.l->v[i], arg(a, 0, NULL, none))) {
                if (f->id == M_INDEX) return *out = jv_int(i), 0;
                n++;
            }
        if (f->id == M_INDEX) return jinja_fail(c, line, "list.index: value not in list");
        return *out = jv_int(n), 0;
    }
    case G_RANGE: {
        int64_t lo = 0, hi, step = 1;
        for (int i = 0; i < a->n; i++)
            if (a->v[i].t != JV_INT) return jinja_fail(c, line, "range() takes integers");
        if (a->n == 1) hi = a->v[0].u.i;
        else if (a->n >= 2) lo = a->v[0].u.i, hi = a->v[1].u.i, step = a->n > 2 ? a->v[2].u.i : 1;
        else return jinja_fail(c, line, "range() takes 1 to 3 arguments");
        if (!step) return jinja_fail(c, line, "range() step must not be zero");
        int64_t count = step > 0 ? (hi - lo + step - 1) / step : (lo - hi - step - 1) / -step;
        if (count > 10000000) return jinja_fail(c, line, "range() too large");
        struct jval l = jv_list(&c->arena, count > 0 ? (int)count : 1);
        for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) jv_list_push(&c->arena, &l, jv_int(i));
        return *out = l, 0;
    }
    case G_NAMESPACE:
    case G_DICT: {
        struct jval d = jv_dict(&c->arena, a->n_kw + 4);
        for (int i = 0; i < a->n; i++) { /* namespace(some_dict) */
            if (a->v[i].t != JV_DICT) return jinja_fail(c, line, "%s() takes keyword arguments or a dict", f->id == G_DICT ? "dict" : "namespace");
            for (int k = 0; k < a->v[i].u.d->n; k++) jv_dict_set(&c->arena, &d, a->v[i].u.d->k[k], a->v[i].u.d->v[k]);
        }
        for (int i = 0; i < a->n_kw; i++) jv_dict_set(&c->arena, &d, jv_cstr(&c->arena, a->kw_names[i]), a->kw[i]);
        if (f->id == G_NAMESPACE) d.t = JV_NS;
        return *out = d, 0;
    }
    case G_RAISE: {
        struct jval m = jinja_str_of(c, arg(a, 0, NULL, jv_cstr(&c->arena, "")));
        return jinja_fail(c, line, "raise_exception: %s", m.u.s->s);
    }
    case G_STRFTIME: {
        struct jval fmt = arg(a, 0, NULL, none);
        if (need_str(c, line, "strftime_now", fmt)) return -1;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[256];
        size_t n = strftime(buf, sizeof buf, fmt.u.s->s, &tm);
        return *out = jv_str(&c->arena, buf, n), 0;
    }
    }
    return jinja_fail(c, line, "internal: unknown function");
}

/* ==== tests ==== */

int jinja_test(struct jctx *c, int line, const char *name, struct jval x, const struct jargs *a, int *r) {
    struct jval none = jv_none(), y = arg(a, 0, NULL, none);
    if (!strcmp(name, "defined")) *r = x.t != JV_UNDEF;
    else if (!strcmp(name, "undefined")) *r = x.t == JV_UNDEF;
    else if (!strcmp(name, "none")) *r = x.t == JV_NONE;
    else if (!strcmp(name, "string")) *r = x.t == JV_STR;
    else if (!strcmp(name, "mapping")) *r = x.t == JV_DICT;
    else if (!strcmp(name, "iterable")) *r = x.t == JV_STR || x.t == JV_LIST || x.t == JV_DICT || x.t == JV_UNDEF;
    else if (!strcmp(name, "sequence")) *r = x.t == JV_STR || x.t == JV_LIST || x.t == JV_DICT;
    else if (!strcmp(name, "number")) *r = x.t == JV_INT || x.t == JV_FLOAT || x.t == JV_BOOL;
    else if (!strcmp(name, "integer")) *r = x.t == JV_INT;
    else if (!strcmp(name, "float")) *r = x.t == JV_FLOAT;
    else if (!strcmp(name, "boolean")) *r = x.t == JV_BOOL;
    else if (!strcmp(name, "true")) *r = x.t == JV_BOOL && x.u.b;
    else if (!strcmp(name, "false")) *r = x.t == JV_BOOL && !x.u.b;
    else if (!strcmp(name, "callable")) *r = x.t == JV_MACRO || x.t == JV_FUNC;
    else if (!strcmp(name, "sameas")) *r = x.t == y.t && (x.t == JV_NONE || x.t == JV_UNDEF || jv_equal(x, y));
    else if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) *r = jv_equal(x, y);
    else if (!strcmp(name, "ne") || !strcmp(name, "!=")) *r = !jv_equal(x, y);
    else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (x.t != JV_INT) return jinja_fail(c, line, "test '%s' needs an integer", name);
        int64_t d = name[0] == 'd' ? (y.t == JV_INT ? y.u.i : 0) : 2;
        if (!d) return jinja_fail(c, line, "divisibleby needs a non-zero integer");
        *r = name[0] == 'o' ? x.u.i % 2 != 0 : x.u.i % d == 0;
    } else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        *r = x.t == JV_STR && str_all(x.u.s, name[0] == 'l' ? M_ISLOWER : M_ISUPPER);
    } else if (!strcmp(name, "in")) {
        if (y.t == JV_STR && x.t == JV_STR) *r = memmem(y.u.s->s, y.u.s->n, x.u.s->s, x.u.s->n) != NULL;
        else if (y.t == JV_LIST) {
            *r = 0;
            for (int i = 0; i < y.u.l->n && !*r; i++) *r = jv_equal(x, y.u.l->v[i]);
        } else if (y.t == JV_DICT) *r = jv_dict_getv(&y, x) != NULL;
        else return jinja_fail(c, line, "test 'in' needs a container");
    } else if (!strcmp(name, "lt") || !strcmp(name, "gt") || !strcmp(name, "le") || !strcmp(name, "ge") ||
               !strcmp(name, "<") || !strcmp(name, ">") || !strcmp(name, "<=") || !strcmp(name, ">=")) {
        int num = (x.t == JV_INT || x.t == JV_FLOAT) && (y.t == JV_INT || y.t == JV_FLOAT);
        if (!num) return jinja_fail(c, line, "test '%s' needs numbers", name);
        double p = x.t == JV_INT ? (double)x.u.i : x.u.f, q = y.t == JV_INT ? (double)y.u.i : y.u.f;
        char k0 = name[0], k1 = name[1];
        if (k0 == 'l' || k0 == '<') *r = (k1 == 'e' || k1 == '=') ? p <= q : p < q;
        else *r = (k1 == 'e' || k1 == '=') ? p >= q : p > q;
    } else return jinja_fail(c, line, "unsupported test '%s'", name);
    return 0;
}

/* ==== filters ==== */

static int attr_path(struct jctx *c, struct jval v, struct jval attr, struct jval *out) {
    if (attr.t == JV_INT) {
        if (v.t == JV_LIST && attr.u.i >= 0 && attr.u.i < v.u.l->n) return *out = v.u.l->v[attr.u.i], 0;
        return *out = jv_undef(), 0;
    }
    if (attr.t != JV_STR) return *out = jv_undef(), 0;
    /* "a.b" walks nested attributes, as Jinja's make_attrgetter */
    const char *p = attr.u.s->s;
    *out = v;
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        char key[128];
        if (n >= sizeof key) n = sizeof key - 1;
        memcpy(key, p, n);
        key[n] = 0;
        if (out->t == JV_LIST && key[0] >= '0' && key[0] <= '9') {
            long i = atol(key);
            *out = i < out->u.l->n ? out->u.l->v[i] : jv_undef();
        } else *out = jinja_getattr(c, *out, key);
        p += n + (dot != NULL);
    }
    return 0;
}

static int cmp_vals(struct jval a, struct jval b, int case_sensitive) {
    if ((a.t == JV_INT || a.t == JV_FLOAT || a.t == JV_BOOL) && (b.t == JV_INT || b.t == JV_FLOAT || b.t == JV_BOOL)) {
        double x = a.t == JV_FLOAT ? a.u.f : a.t == JV_INT ? (double)a.u.i : a.u.b;
        double y = b.t == JV_FLOAT ? b.u.f : b.t == JV_INT ? (double)b.u.i : b.u.b;
        return (x > y) - (x < y);
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s->n < b.u.s->n ? a.u.s->n : b.u.s->n;
        int r = case_sensitive ? memcmp(a.u.s->s, b.u.s->s, n) : strncasecmp(a.u.s->s, b.u.s->s, n);
        return r ? r : (a.u.s->n > b.u.s->n) - (a.u.s->n < b.u.s->n);
    }
    return (int)a.t - (int)b.t;
}

static int filter_select(struct jctx *c, int line, const char *name, struct jval x, const struct jargs *a, struct jval *out) {
    int by_attr = name[1] == 'e' && name[6] == 'a'; /* selectattr / rejectattr */
    int reject = name[0] == 'r';
    struct jval l;
    if (jinja_to_list(c, line, x, &l)) return -1;
    struct jval r = jv_list(&c->arena, l.u.l->n);
    int first = by_attr ? 1 : 0;
    struct jval test = arg(a, first, NULL, jv_none());
    struct jargs rest = *a;
    rest.n = a->n > first + 1 ? a->n - first - 1 : 0;
    rest.v = a->v + (a->n > first + 1 ? first + 1 : 0);
    for (int i = 0; i < l.u.l->n; i++) {
        struct jval v = l.u.l->v[i];
        if (by_attr && attr_path(c, v, arg(a, 0, NULL, jv_none()), &v)) return -1;
        int ok;
        if (test.t == JV_NONE) ok = jv_truthy(v);
        else if (test.t != JV_STR) return jinja_fail(c, line, "%s: the test name must be a string", name);
        else if (jinja_test(c, line, test.u.s->s, v, &rest, &ok)) return -1;
        if (ok != reject) jv_list_push(&c->arena, &r, l.u.l->v[i]);
    }
    return *out = r, 0;
}

static int filter_tojson(struct jctx *c, int line, struct jval x, const struct jargs *a, struct jval *out) {
    struct jval ea = arg(a, 0, "ensure_ascii", jv_bool(0)), ind = arg(a, 1, "indent", jv_none());
    struct jval sep = arg(a, 2, "separators", jv_none()), sk = arg(a, 3, "sort_keys", jv_bool(0));
    if (jv_truthy(ea)) return jinja_fail(c, line, "tojson: ensure_ascii=True is not supported");
    if (sep.t != JV_NONE) return jinja_fail(c, line, "tojson: custom separators are not supported");
    int indent = -1;
    const char *indent_str = NULL;
    if (ind.t == JV_INT) indent = (int)(ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : ind.u.i);
    else if (ind.t == JV_STR) indent_str = ind.u.s->s;
    else if (ind.t != JV_NONE) return jinja_fail(c, line, "tojson: indent must be an int or a string");
    struct jbuf b = {0};
    if (x.t == JV_UNDEF || jv_json_to(&b, x, indent, indent_str, jv_truthy(sk), 0)) {
        free(b.s);
        return jinja_fail(c, line, "tojson: object of type '%s' is not JSON serializable", jv_type_name(x));
    }
    return *out = buf_val(c, &b), 0;
}

int jinja_filter(struct jctx *c, int line, const char *name, struct jval x, const struct jargs *a, struct jval *out) {
    struct jval none = jv_none(), l;
    if (!strcmp(name, "tojson")) return filter_tojson(c, line, x, a, out);
    if (!strcmp(name, "safe")) return *out = x, 0;
    if (!strcmp(name, "string")) return *out = jinja_str_of(c, x), 0;
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        int use = x.t == JV_UNDEF || (jv_truthy(arg(a, 1, "boolean", jv_bool(0))) && !jv_truthy(x));
        return *out = use ? arg(a, 0, "default_value", jv_cstr(&c->arena, "")) : x, 0;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        if (x.t == JV_STR) return *out = jv_int(cp_len(x.u.s)), 0;
        if (x.t == JV_LIST) return *out = jv_int(x.u.l->n), 0;
        if (x.t == JV_DICT || x.t == JV_NS) return *out = jv_int(x.u.d->n), 0;
        if (x.t == JV_UNDEF) return *out = jv_int(0), 0;
        return jinja_fail(c, line, "object of type '%s' has no len()", jv_type_name(x));
    }
    if (!strcmp(name, "trim")) {
        struct jval s = jinja_str_of(c, x), ch = arg(a, 0, "chars", none);
        return *out = str_strip(c, s.u.s, 3, ch.t == JV_STR ? ch.u.s : NULL), 0;
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") || !strcmp(name, "capitalize")) {
        struct jval s = jinja_str_of(c, x);
        int mode = name[0] == 'u' ? 0 : name[0] == 'l' ? 1 : name[0] == 't' ? 2 : 3;
        return *out = str_case(c, s.u.s, mode), 0;
    }
    if (!strcmp(name, "replace")) {
        struct jval s = jinja_str_of(c, x), o = jinja_str_of(c, arg(a, 0, "old", none)), n = jinja_str_of(c, arg(a, 1, "new", none));
        struct jval cnt = arg(a, 2, "count", none);
        return *out = str_replace(c, s.u.s, o.u.s, n.u.s, cnt.t == JV_INT ? cnt.u.i : -1), 0;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        if (jinja_to_list(c, line, x, &l)) return -1;
        if (!l.u.l->n) return *out = jv_undef(), 0;
        return *out = l.u.l->v[name[0] == 'f' ? 0 : l.u.l->n - 1], 0;
    }
    if (!strcmp(name, "join")) {
        struct jval sep = jinja_str_of(c, arg(a, 0, "d", jv_cstr(&c->arena, ""))), at = arg(a, 1, "attribute", none);
        if (jinja_to_list(c, line, x, &l)) return -1;
        struct jbuf b = {0};
        for (int i = 0; i < l.u.l->n; i++) {
            struct jval v = l.u.l->v[i];
            if (at.t != JV_NONE) attr_path(c, v, at, &v);
            if (i) jbuf_put(&b, sep.u.s->s, sep.u.s->n);
            jv_str_to(&b, v);
        }
        return *out = buf_val(c, &b), 0;
    }
    if (!strcmp(name, "list")) {
        if (jinja_to_list(c, line, x, &l)) return -1;
        struct jval r = jv_list(&c->arena, l.u.l->n);
        for (int i = 0; i < l.u.l->n; i++) jv_list_push(&c->arena, &r, l.u.l->v[i]);
        return *out = r, 0;
    }
    if (!strcmp(name, "items") || !strcmp(name, "dictsort")) {
        if (x.t == JV_UNDEF) return *out = jv_list(&c->arena, 1), 0;
        if (x.t != JV_DICT && x.t != JV_NS) return jinja_fail(c, line, "%s expects a mapping, got '%s'", name, jv_type_name(x));
        struct jval r = jv_list(&c->arena, x.u.d->n);
        for (int i = 0; i < x.u.d->n; i++) jv_list_push(&c->arena, &r, pair(c, x.u.d->k[i], x.u.d->v[i]));
        if (name[0] == 'd') /* by key, case-insensitive as Jinja's default */
            for (int i = 1; i < r.u.l->n; i++)
                for (int j = i; j > 0 && cmp_vals(r.u.l->v[j - 1].u.l->v[0], r.u.l->v[j].u.l->v[0], 0) > 0; j--) {
                    struct jval t = r.u.l->v[j];
                    r.u.l->v[j] = r.u.l->v[j - 1], r.u.l->v[j - 1] = t;
                }
        return *out = r, 0;
    }
    if (!strcmp(name, "int")) {
        struct jval d = arg(a, 0, "default", jv_int(0));
        if (x.t == JV_INT) return *out = x, 0;
        if (x.t == JV_BOOL) return *out = jv_int(x.u.b), 0;
        if (x.t == JV_FLOAT) return *out = isfinite(x.u.f) ? jv_int((int64_t)x.u.f) : d, 0;
        if (x.t == JV_STR) {
            char *end;
            long long v = strtoll(x.u.s->s, &end, 10);
            if (end != x.u.s->s && !*end) return *out = jv_int(v), 0;
            double f = strtod(x.u.s->s, &end);
            return *out = end != x.u.s->s && !*end && isfinite(f) ? jv_int((int64_t)f) : d, 0;
        }
        return *out = d, 0;
    }
    if (!strcmp(name, "float")) {
        struct jval d = arg(a, 0, "default", jv_float(0));
        if (x.t == JV_INT || x.t == JV_BOOL) return *out = jv_float(x.t == JV_INT ? (double)x.u.i : x.u.b), 0;
        if (x.t == JV_FLOAT) return *out = x, 0;
        if (x.t == JV_STR) {
            char *end;
            double f = strtod(x.u.s->s, &end);
            return *out = end != x.u.s->s && !*end ? jv_float(f) : d, 0;
        }
        return *out = d, 0;
    }
    if (!strcmp(name, "abs")) {
        if (x.t == JV_INT) return *out = jv_int(x.u.i < 0 ? -x.u.i : x.u.i), 0;
        if (x.t == JV_FLOAT) return *out = jv_float(fabs(x.u.f)), 0;
        return jinja_fail(c, line, "abs expects a number");
    }
    if (!strcmp(name, "round")) {
        struct jval p = arg(a, 0, "precision", jv_int(0)), m = arg(a, 1, "method", jv_cstr(&c->arena, "common"));
        double v = x.t == JV_INT ? (double)x.u.i : x.t == JV_FLOAT ? x.u.f : NAN;
        if (isnan(v) && x.t != JV_FLOAT) return jinja_fail(c, line, "round expects a number");
        double k = pow(10, p.t == JV_INT ? (double)p.u.i : 0);
        const char *ms = m.t == JV_STR ? m.u.s->s : "common";
        double r = !strcmp(ms, "floor") ? floor(v * k) / k : !strcmp(ms, "ceil") ? ceil(v * k) / k : round(v * k) / k;
        return *out = jv_float(r), 0;
    }
    if (!strcmp(name, "reverse")) {
        if (x.t == JV_STR) {
            if (jinja_to_list(c, line, x, &l)) return -1;
            struct jbuf b = {0};
            for (int i = l.u.l->n - 1; i >= 0; i--) jbuf_put(&b, l.u.l->v[i].u.s->s, l.u.l->v[i].u.s->n);
            return *out = buf_val(c, &b), 0;
        }
        if (jinja_to_list(c, line, x, &l)) return -1;
        struct jval r = jv_list(&c->arena, l.u.l->n);
        for (int i = l.u.l->n - 1; i >= 0; i--) jv_list_push(&c->arena, &r, l.u.l->v[i]);
        return *out = r, 0;
    }
    if (!strcmp(name, "sort") || !strcmp(name, "unique") || !strcmp(name, "min") || !strcmp(name, "max")) {
        if (jinja_to_list(c, line, x, &l)) return -1;
        int rev = jv_truthy(arg(a, 0, "reverse", jv_bool(0))) && name[0] == 's';
        int cs = jv_truthy(arg(a, name[0] == 's' ? 1 : 0, "case_sensitive", jv_bool(0)));
        struct jval at = arg(a, name[0] == 's' ? 2 : 1, "attribute", none);
        struct jval r = jv_list(&c->arena, l.u.l->n);
        for (int i = 0; i < l.u.l->n; i++) {
            struct jval v = l.u.l->v[i], key = v;
            if (at.t != JV_NONE) attr_path(c, v, at, &key);
            if (name[0] == 'u') {
                int seen = 0;
                for (int j = 0; j < r.u.l->n && !seen; j++) {
                    struct jval k2 = r.u.l->v[j];
                    if (at.t != JV_NONE) attr_path(c, k2, at, &k2);
                    seen = key.t == JV_STR && k2.t == JV_STR && !cs ? !cmp_vals(key, k2, 0) : jv_equal(key, k2);
                }
                if (!seen) jv_list_push(&c->arena, &r, v);
                continue;
            }
            jv_list_push(&c->arena, &r, v);
            for (int j = r.u.l->n - 1; j > 0; j--) { /* insertion sort, stable */
                struct jval p = r.u.l->v[j - 1], q = r.u.l->v[j];
                if (at.t != JV_NONE) attr_path(c, p, at, &p), attr_path(c, q, at, &q);
                int k = cmp_vals(p, q, cs);
                if (rev ? k >= 0 : k <= 0) break;
                struct jval t = r.u.l->v[j];
                r.u.l->v[j] = r.u.l->v[j - 1], r.u.l->v[j - 1] = t;
            }
        }
        if (name[0] == 'm') {
            if (!r.u.l->n) return *out = jv_undef(), 0;
            return *out = r.u.l->v[name[1] == 'i' ? 0 : r.u.l->n - 1], 0;
        }
        return *out = r, 0;
    }
    if (!strcmp(name, "sum")) {
        if (jinja_to_list(c, line, x, &l)) return -1;
        struct jval at = arg(a, 0, "attribute", none), s = arg(a, 1, "start", jv_int(0));
        int is_f = s.t == JV_FLOAT;
        double f = s.t == JV_FLOAT ? s.u.f : (double)(s.t == JV_INT ? s.u.i : 0);
        int64_t i64 = s.t == JV_INT ? s.u.i : 0;
        for (int i = 0; i < l.u.l->n; i++) {
            struct jval v = l.u.l->v[i];
            if (at.t != JV_NONE) attr_path(c, v, at, &v);
            if (v.t == JV_FLOAT) is_f = 1, f += v.u.f;
            else if (v.t == JV_INT || v.t == JV_BOOL) i64 += v.t == JV_INT ? v.u.i : v.u.b, f += (double)(v.t == JV_INT ? v.u.i : v.u.b);
            else return jinja_fail(c, line, "sum: unsupported item type '%s'", jv_type_name(v));
        }
        return *out = is_f ? jv_float(f) : jv_int(i64), 0;
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr") || !strcmp(name, "select") || !strcmp(name, "reject"))
        return filter_select(c, line, name, x, a, out);
    if (!strcmp(name, "map")) {
        if (jinja_to_list(c, line, x, &l)) return -1;
        struct jval at = arg(a, -1, "attribute", none), dflt = arg(a, -1, "default", jv_undef());
        struct jval r = jv_list(&c->arena, l.u.l->n);
        for (int i = 0; i < l.u.l->n; i++) {
            struct jval v = l.u.l->v[i];
            if (at.t != JV_NONE) {
                attr_path(c, v, at, &v);
                if (v.t == JV_UNDEF) v = dflt;
            } else {
                struct jval fname = arg(a, 0, NULL, none);
                if (fname.t != JV_STR) return jinja_fail(c, line, "map needs a filter name or attribute=");
                struct jargs rest = *a;
                rest.n = a->n - 1, rest.v = a->v + 1, rest.n_kw = 0;
                if (jinja_filter(c, line, fname.u.s->s, v, &rest, &v)) return -1;
            }
            jv_list_push(&c->arena, &r, v);
        }
        return *out = r, 0;
    }
    if (!strcmp(name, "escape") || !strcmp(name, "e") || !strcmp(name, "forceescape")) {
        struct jval s = jinja_str_of(c, x);
        struct jbuf b = {0};
        for (size_t i = 0; i < s.u.s->n; i++) {
            char ch = s.u.s->s[i];
            if (ch == '&') jbuf_puts(&b, "&amp;");
            else if (ch == '<') jbuf_puts(&b, "&lt;");
            else if (ch == '>') jbuf_puts(&b, "&gt;");
            else if (ch == '"') jbuf_puts(&b, "&#34;");
            else if (ch == '\'') jbuf_puts(&b, "&#39;");
            else jbuf_put(&b, &ch, 1);
        }
        return *out = buf_val(c, &b), 0;
    }
    if (!strcmp(name, "indent")) {
        struct jval s = jinja_str_of(c, x), w = arg(a, 0, "width", jv_int(4)), first = arg(a, 1, "first", jv_bool(0));
        struct jval blank = arg(a, 2, "blank", jv_bool(0));
        struct jbuf pad = {0}, b = {0};
        if (w.t == JV_STR) jbuf_put(&pad, w.u.s->s, w.u.s->n);
        else for (int64_t i = 0; i < (w.t == JV_INT ? w.u.i : 4) && i < 256; i++) jbuf_put(&pad, " ", 1);
        const char *p = s.u.s->s, *end = p + s.u.s->n;
        int lineno = 0;
        while (p <= end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
            int do_pad = (lineno > 0 || jv_truthy(first)) && (n > 0 || jv_truthy(blank));
            if (do_pad && pad.n) jbuf_put(&b, pad.s, pad.n);
            jbuf_put(&b, p, n);
            if (!nl) break;
            jbuf_put(&b, "\n", 1);
            p = nl + 1;
            lineno++;
        }
        free(pad.s);
        return *out = buf_val(c, &b), 0;
    }
    if (!strcmp(name, "wordcount")) {
        struct jval s = jinja_str_of(c, x);
        if (jinja_to_list(c, line, s, &l)) return -1;
        struct jval w = str_split(c, s.u.s, NULL, -1, 0);
        return *out = jv_int(w.u.l->n), 0;
    }
    if (!strcmp(name, "format")) { /* printf-style: %s %d %i %f %r %% */
        struct jval s = jinja_str_of(c, x);
        struct jbuf b = {0};
        int k = 0;
        for (size_t i = 0; i < s.u.s->n; i++) {
            char ch = s.u.s->s[i];
            if (ch != '%' || i + 1 >= s.u.s->n) {
                jbuf_put(&b, &ch, 1);
                continue;
            }
            char f = s.u.s->s[++i];
            if (f == '%') {
                jbuf_put(&b, "%", 1);
                continue;
            }
            if (k >= a->n) {
                free(b.s);
                return jinja_fail(c, line, "format: not enough arguments");
            }
            if (f == 'r') jv_repr_to(&b, a->v[k++]);
            else if (f == 's' || f == 'd' || f == 'i' || f == 'f') jv_str_to(&b, a->v[k++]);
            else {
                free(b.s);
                return jinja_fail(c, line, "format: unsupported conversion '%%%c'", f);
            }
        }
        return *out = buf_val(c, &b), 0;
    }
    return jinja_fail(c, line, "unsupported filter '%s'", name);
}
