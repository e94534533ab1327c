/*
 * jinja_eval.c: renders a parsed template: scopes, expressions, statements.
 *
 * Scoping follows Jinja: a for loop (and a macro call) opens a scope, so a
 * `set` inside a loop does not leak out of it (that is what namespace() is
 * for); if/else open none. Undefined names and missing attributes or keys give
 * Undefined, which is falsey, prints as "", iterates as empty and has length
 * 0; using it in arithmetic is an error, as in Jinja. Attribute access on
 * Undefined gives Undefined too (Jinja would raise; no template that works
 * under transformers depends on the raise).
 *
 * Limits keep hostile templates bounded: macro recursion depth 200, output
 * 256 MiB, loop item count 10 million.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem, localtime_r, strncasecmp */
#endif
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tokenizer/jinja.h"

#define MAX_DEPTH 200
#define MAX_OUTPUT ((size_t)256 << 20)

enum { EXEC_OK = 0, EXEC_BREAK = 1, EXEC_CONTINUE = 2, EXEC_ERR = -1 };

struct jscope {
    struct jval vars; /* JV_DICT */
    struct jscope *parent;
};

int jinja_fail(struct jctx *c, int line, const char *fmt, ...) {
    if (!c->failed) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        kiln_errf(c->err, c->errlen, "template line %d: %s", line, msg);
    }
    c->failed = 1;
    return -1;
}

static struct jscope *scope_push(struct jctx *c, struct jscope *parent) {
    struct jscope *s = jarena_alloc(&c->arena, sizeof *s);
    s->vars = jv_dict(&c->arena, 8);
    s->parent = parent;
    return s;
}

static void scope_set(struct jctx *c, const char *name, struct jval v) {
    jv_dict_set(&c->arena, &c->scope->vars, jv_cstr(&c->arena, name), v);
}

static struct jval lookup(struct jctx *c, const char *name) {
    size_t n = strlen(name);
    for (struct jscope *s = c->scope; s; s = s->parent) {
        struct jval *v = jv_dict_get(&s->vars, name, n);
        if (v) return *v;
    }
    return jinja_global(c, name);
}

/* ==== expressions ==== */

static int eval(struct jctx *c, const struct jnode *n, struct jval *out);
static int exec_body(struct jctx *c, const struct jnode *body);

static int is_num(struct jval v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double as_f(struct jval v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : v.u.b; }
static int64_t as_i(struct jval v) { return v.t == JV_INT ? v.u.i : v.u.b; }

struct jval jinja_str_of(struct jctx *c, struct jval v) {
    if (v.t == JV_STR) return v;
    struct jbuf b = {0};
    jv_str_to(&b, v);
    struct jval s = jv_str(&c->arena, b.s ? b.s : "", b.n);
    free(b.s);
    return s;
}

static int eval_args(struct jctx *c, const struct jnode *n, struct jargs *a) {
    a->n = n->n_items, a->n_kw = n->n_names;
    a->v = jarena_alloc(&c->arena, (size_t)(a->n + 1) * sizeof *a->v);
    a->kw = jarena_alloc(&c->arena, (size_t)(a->n_kw + 1) * sizeof *a->kw);
    a->kw_names = n->names;
    for (int i = 0; i < a->n; i++)
        if (eval(c, n->items[i], &a->v[i])) return -1;
    for (int i = 0; i < a->n_kw; i++)
        if (eval(c, n->items2[i], &a->kw[i])) return -1;
    return 0;
}

static int undefined_error(struct jctx *c, const struct jnode *n, const char *what) {
    if (n->kind == JE_NAME) return jinja_fail(c, n->line, "'%s' is undefined (used in %s)", n->name, what);
    if (n->kind == JE_ATTR) return jinja_fail(c, n->line, "'%s' is undefined (used in %s)", n->name, what);
    return jinja_fail(c, n->line, "an undefined value used in %s", what);
}

static int binop(struct jctx *c, const struct jnode *n, struct jval a, struct jval b, struct jval *out) {
    const char *op = n->name;
    if (op[0] == '~') {
        struct jval sa = jinja_str_of(c, a), sb = jinja_str_of(c, b);
        struct jval r = jv_str(&c->arena, NULL, sa.u.s->n + sb.u.s->n);
        memcpy(r.u.s->s, sa.u.s->s, sa.u.s->n);
        memcpy(r.u.s->s + sa.u.s->n, sb.u.s->s, sb.u.s->n);
        *out = r;
        return 0;
    }
    if (a.t == JV_UNDEF) return undefined_error(c, n->a, op);
    if (b.t == JV_UNDEF) return undefined_error(c, n->b, op);
    if (op[0] == '+' && a.t == JV_STR && b.t == JV_STR) {
        struct jval r = jv_str(&c->arena, NULL, a.u.s->n + b.u.s->n);
        memcpy(r.u.s->s, a.u.s->s, a.u.s->n);
        memcpy(r.u.s->s + a.u.s->n, b.u.s->s, b.u.s->n);
        *out = r;
        return 0;
    }
    if (op[0] == '+' && a.t == JV_LIST && b.t == JV_LIST) {
        struct jval r = jv_list(&c->arena, a.u.l->n + b.u.l->n);
        for (int i = 0; i < a.u.l->n; i++) jv_list_push(&c->arena, &r, a.u.l->v[i]);
        for (int i = 0; i < b.u.l->n; i++) jv_list_push(&c->arena, &r, b.u.l->v[i]);
        *out = r;
        return 0;
    }
    if (op[0] == '*' && !op[1] && ((a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL))) {
        int64_t k = as_i(b);
        size_t unit = a.t == JV_STR ? a.u.s->n : (size_t)a.u.l->n * sizeof(struct jval);
        if (k < 0 || !unit) k = 0; /* an empty string or list repeated is empty: no loop over k (it ran 7.8e15 times, fuzz_template) */
        if (unit && (uint64_t)k > MAX_OUTPUT / unit) return jinja_fail(c, n->line, "repetition too large");
        if (a.t == JV_STR) {
            struct jval r = jv_str(&c->arena, NULL, a.u.s->n * (size_t)k);
            for (int64_t i = 0; i < k; i++) memcpy(r.u.s->s + (size_t)i * a.u.s->n, a.u.s->s, a.u.s->n);
            *out = r;
        } else {
            struct jval r = jv_list(&c->arena, (int)(a.u.l->n * k) + 1);
            for (int64_t i = 0; i < k; i++)
                for (int j = 0; j < a.u.l->n; j++) jv_list_push(&c->arena, &r, a.u.l->v[j]);
            *out = r;
        }
        return 0;
    }
    if (!is_num(a) || !is_num(b))
        return jinja_fail(c, n->line, "unsupported operand types for %s: '%s' and '%s'", op, jv_type_name(a),
                          jv_type_name(b));
    int ints = a.t != JV_FLOAT && b.t != JV_FLOAT;
    int64_t x = ints ? as_i(a) : 0, y = ints ? as_i(b) : 0;
    double fx = as_f(a), fy = as_f(b);
    switch (op[0]) {
    case '+': *out = ints ? jv_int(x + y) : jv_float(fx + fy); return 0;
    case '-': *out = ints ? jv_int(x - y) : jv_float(fx - fy); return 0;
    case '*':
        if (op[1]) { /* ** */
            if (ints && y >= 0) {
                int64_t r = 1;
                for (int64_t i = 0; i < y && i < 64; i++) r *= x;
                *out = jv_int(r);
            } else *out = jv_float(pow(fx, fy));
            return 0;
        }
        *out = ints ? jv_int(x * y) : jv_float(fx * fy);
        return 0;
    case '/':
        if (ints ? y == 0 : fy == 0) return jinja_fail(c, n->line, "division by zero");
        if (op[1]) { /* floor division */
            if (ints) {
                int64_t q = x / y;
                if ((x % y) && ((x < 0) != (y < 0))) q--;
                *out = jv_int(q);
            } else *out = jv_float(floor(fx / fy));
            return 0;
        }
        *out = jv_float(fx / fy);
        return 0;
    case '%':
        if (ints ? y == 0 : fy == 0) return jinja_fail(c, n->line, "modulo by zero");
        if (ints) {
            int64_t r = x % y;
            if (r && ((r < 0) != (y < 0))) r += y;
            *out = jv_int(r);
        } else {
            double r = fmod(fx, fy);
            if (r != 0 && ((r < 0) != (fy < 0))) r += fy;
            *out = jv_float(r);
        }
        return 0;
    }
    return jinja_fail(c, n->line, "unknown operator '%s'", op);
}

static int compare(struct jctx *c, int line, const char *op, struct jval a, struct jval b, int *res) {
    if (!strcmp(op, "==")) return *res = jv_equal(a, b), 0;
    if (!strcmp(op, "!=")) return *res = !jv_equal(a, b), 0;
    if (!strcmp(op, "in") || !strcmp(op, "notin")) {
        int found = 0;
        if (b.t == JV_STR) {
            if (a.t != JV_STR) return jinja_fail(c, line, "'in <string>' requires a string on the left, not '%s'", jv_type_name(a));
            found = a.u.s->n == 0 || memmem(b.u.s->s, b.u.s->n, a.u.s->s, a.u.s->n) != NULL;
        } else if (b.t == JV_LIST) {
            for (int i = 0; i < b.u.l->n && !found; i++) found = jv_equal(a, b.u.l->v[i]);
        } else if (b.t == JV_DICT || b.t == JV_NS) {
            found = jv_dict_getv(&b, a) != NULL;
        } else if (b.t != JV_UNDEF) {
            return jinja_fail(c, line, "argument of type '%s' is not iterable", jv_type_name(b));
        }
        *res = op[0] == 'i' ? found : !found;
        return 0;
    }
    int cmp;
    if (is_num(a) && is_num(b)) {
        double x = as_f(a), y = as_f(b);
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) cmp = as_i(a) < as_i(b) ? -1 : as_i(a) > as_i(b);
        else cmp = x < y ? -1 : x > y;
    } else if (a.t == JV_STR && b.t == JV_STR) { /* UTF-8 byte order is code point order */
        size_t m = a.u.s->n < b.u.s->n ? a.u.s->n : b.u.s->n;
        cmp = memcmp(a.u.s->s, b.u.s->s, m);
        if (!cmp) cmp = (a.u.s->n > b.u.s->n) - (a.u.s->n < b.u.s->n);
    } else {
        return jinja_fail(c, line, "'%s' not supported between '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
    }
    if (!strcmp(op, "<")) *res = cmp < 0;
    else if (!strcmp(op, ">")) *res = cmp > 0;
    else if (!strcmp(op, "<=")) *res = cmp <= 0;
    else *res = cmp >= 0;
    return 0;
}

/* byte offset of code point index i in s (i clamped to the string) */
static size_t cp_offset(const struct jstr *s, int64_t i) {
    size_t off = 0;
    for (int64_t k = 0; k < i && off < s->n; k++) {
        off++;
        while (off < s->n && ((unsigned char)s->s[off] & 0xC0) == 0x80) off++;
    }
    return off;
}

static int64_t cp_count(const struct jstr *s) {
    int64_t n = 0;
    for (size_t i = 0; i < s->n; i++) n += ((unsigned char)s->s[i] & 0xC0) != 0x80;
    return n;
}

static int subscript(struct jctx *c, const struct jnode *n, struct jval obj, struct jval key, struct jval *out) {
    *out = jv_undef();
    if ((obj.t == JV_LIST || obj.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
        int64_t len = obj.t == JV_LIST ? obj.u.l->n : cp_count(obj.u.s), i = as_i(key);
        if (i < 0) i += len;
        if (i < 0 || i >= len) return 0;
        if (obj.t == JV_LIST) *out = obj.u.l->v[i];
        else {
            size_t a = cp_offset(obj.u.s, i), b = cp_offset(obj.u.s, i + 1);
            *out = jv_str(&c->arena, obj.u.s->s + a, b - a);
        }
        return 0;
    }
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        struct jval *v = jv_dict_getv(&obj, key);
        if (v) *out = *v;
        else if (key.t == JV_STR && obj.t == JV_DICT) *out = jinja_getattr(c, obj, key.u.s->s);
        return 0;
    }
    if (key.t == JV_STR) *out = jinja_getattr(c, obj, key.u.s->s);
    (void)n;
    return 0;
}

static int slice(struct jctx *c, const struct jnode *n, struct jval obj, struct jval *out) {
    struct jval parts[3] = {jv_none(), jv_none(), jv_none()};
    const struct jnode *pn[3] = {n->b, n->c, n->d};
    for (int i = 0; i < 3; i++) {
        if (pn[i] && eval(c, pn[i], &parts[i])) return -1;
        if (parts[i].t != JV_NONE && parts[i].t != JV_INT && parts[i].t != JV_BOOL)
            return jinja_fail(c, n->line, "slice indices must be integers or none");
    }
    if (obj.t != JV_LIST && obj.t != JV_STR) {
        if (obj.t == JV_UNDEF) return undefined_error(c, n->a, "a slice");
        return jinja_fail(c, n->line, "'%s' cannot be sliced", jv_type_name(obj));
    }
    int64_t len = obj.t == JV_LIST ? obj.u.l->n : cp_count(obj.u.s);
    int64_t step = parts[2].t == JV_NONE ? 1 : as_i(parts[2]);
    if (step == 0) return jinja_fail(c, n->line, "slice step cannot be zero");
    int64_t lo, hi;
    /* Python's PySlice_AdjustIndices */
    if (parts[0].t == JV_NONE) lo = step < 0 ? len - 1 : 0;
    else {
        lo = as_i(parts[0]);
        if (lo < 0) lo += len, lo = lo < 0 ? (step < 0 ? -1 : 0) : lo;
        else if (lo >= len) lo = step < 0 ? len - 1 : len;
    }
    if (parts[1].t == JV_NONE) hi = step < 0 ? -1 : len;
    else {
        hi = as_i(parts[1]);
        if (hi < 0) hi += len, hi = hi < 0 ? (step < 0 ? -1 : 0) : hi;
        else if (hi >= len) hi = step < 0 ? len - 1 : len;
    }
    struct jval items;
    if (jinja_to_list(c, n->line, obj, &items)) return -1;
    struct jval r = jv_list(&c->arena, 8);
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) jv_list_push(&c->arena, &r, items.u.l->v[i]);
    if (obj.t == JV_STR) {
        struct jbuf b = {0};
        for (int i = 0; i < r.u.l->n; i++) jbuf_put(&b, r.u.l->v[i].u.s->s, r.u.l->v[i].u.s->n);
        *out = jv_str(&c->arena, b.s ? b.s : "", b.n);
        free(b.s);
    } else *out = r;
    return 0;
}

static int call_macro(struct jctx *c, int line, const struct jnode *m, const struct jargs *a, struct jval caller,
                      struct jval *out) {
    if (c->depth >= MAX_DEPTH) return jinja_fail(c, line, "macro recursion deeper than %d", MAX_DEPTH);
    if (a->n > m->n_items) return jinja_fail(c, line, "macro '%s' takes %d arguments, got %d", m->name ? m->name : "caller", m->n_items, a->n);
    struct jscope *saved = c->scope;
    struct jbuf saved_out = c->out;
    c->scope = scope_push(c, c->root);
    for (int i = 0; i < m->n_items; i++) {
        struct jval v = jv_undef();
        int have = 0;
        if (i < a->n) v = a->v[i], have = 1;
        for (int k = 0; k < a->n_kw; k++)
            if (!strcmp(a->kw_names[k], m->names[i])) v = a->kw[k], have = 1;
        if (!have && m->items[i] && eval(c, m->items[i], &v)) {
            c->scope = saved;
            return -1;
        }
        scope_set(c, m->names[i], v);
    }
    if (caller.t != JV_UNDEF) scope_set(c, "caller", caller);
    memset(&c->out, 0, sizeof c->out);
    c->depth++;
    int rc = exec_body(c, m->b);
    c->depth--;
    struct jbuf body = c->out;
    c->out = saved_out;
    c->scope = saved;
    if (rc < 0) {
        free(body.s);
        return -1;
    }
    *out = jv_str(&c->arena, body.s ? body.s : "", body.n);
    free(body.s);
    return 0;
}

static int eval_call(struct jctx *c, const struct jnode *n, struct jval caller, struct jval *out) {
    struct jval fn;
    if (eval(c, n->a, &fn)) return -1;
    struct jargs a;
    if (eval_args(c, n, &a)) return -1;
    if (fn.t == JV_MACRO) return call_macro(c, n->line, fn.u.macro, &a, caller, out);
    if (fn.t == JV_FUNC) return jinja_call_func(c, n->line, fn.u.fn, &a, out);
    if (fn.t == JV_UNDEF) {
        if (n->a->kind == JE_ATTR) return jinja_fail(c, n->line, "unknown method '%s'", n->a->name);
        return undefined_error(c, n->a, "a call");
    }
    return jinja_fail(c, n->line, "'%s' object is not callable", jv_type_name(fn));
}

static int eval(struct jctx *c, const struct jnode *n, struct jval *out) {
    struct jval a, b;
    if (c->failed) return -1;
    switch (n->kind) {
    case JE_LITERAL: *out = *n->lit; return 0;
    case JE_NAME: *out = lookup(c, n->name); return 0;
    case JE_ATTR:
        if (eval(c, n->a, &a)) return -1;
        *out = jinja_getattr(c, a, n->name);
        return 0;
    case JE_ITEM:
        if (eval(c, n->a, &a) || eval(c, n->b, &b)) return -1;
        return subscript(c, n, a, b, out);
    case JE_SLICE:
        if (eval(c, n->a, &a)) return -1;
        return slice(c, n, a, out);
    case JE_CALL: return eval_call(c, n, jv_undef(), out);
    case JE_FILTER: {
        struct jargs args;
        if (eval(c, n->a, &a) || eval_args(c, n, &args)) return -1;
        return jinja_filter(c, n->line, n->name, a, &args, out);
    }
    case JE_TEST: {
        struct jargs args;
        int r;
        if (eval(c, n->a, &a) || eval_args(c, n, &args)) return -1;
        if (jinja_test(c, n->line, n->name, a, &args, &r)) return -1;
        *out = jv_bool(n->flag ? !r : r);
        return 0;
    }
    case JE_NEG:
    case JE_POS:
        if (eval(c, n->a, &a)) return -1;
        if (!is_num(a)) return jinja_fail(c, n->line, "bad operand type for unary %c: '%s'", n->kind == JE_NEG ? '-' : '+', jv_type_name(a));
        if (n->kind == JE_POS) *out = a.t == JV_BOOL ? jv_int(a.u.b) : a;
        else *out = a.t == JV_FLOAT ? jv_float(-a.u.f) : jv_int(-as_i(a));
        return 0;
    case JE_NOT:
        if (eval(c, n->a, &a)) return -1;
        *out = jv_bool(!jv_truthy(a));
        return 0;
    case JE_AND:
        if (eval(c, n->a, &a)) return -1;
        if (!jv_truthy(a)) return *out = a, 0;
        return eval(c, n->b, out);
    case JE_OR:
        if (eval(c, n->a, &a)) return -1;
        if (jv_truthy(a)) return *out = a, 0;
        return eval(c, n->b, out);
    case JE_BINOP:
        if (eval(c, n->a, &a) || eval(c, n->b, &b)) return -1;
        return binop(c, n, a, b, out);
    case JE_COMPARE: {
        if (eval(c, n->a, &a)) return -1;
        for (int i = 0; i < n->n_items; i++) {
            int r = 0;
            if (eval(c, n->items[i], &b) || compare(c, n->line, n->names[i], a, b, &r)) return -1;
            if (!r) return *out = jv_bool(0), 0;
            a = b;
        }
        *out = jv_bool(1);
        return 0;
    }
    case JE_COND:
        if (eval(c, n->a, &a)) return -1;
        if (jv_truthy(a)) return eval(c, n->b, out);
        if (n->c) return eval(c, n->c, out);
        *out = jv_undef();
        return 0;
    case JE_LIST:
    case JE_TUPLE: {
        struct jval l = jv_list(&c->arena, n->n_items);
        for (int i = 0; i < n->n_items; i++) {
            if (eval(c, n->items[i], &a)) return -1;
            jv_list_push(&c->arena, &l, a);
        }
        l.u.l->tuple = n->kind == JE_TUPLE;
        *out = l;
        return 0;
    }
    case JE_DICT: {
        struct jval d = jv_dict(&c->arena, n->n_items);
        for (int i = 0; i < n->n_items; i++) {
            if (eval(c, n->items[i], &a) || eval(c, n->items2[i], &b)) return -1;
            jv_dict_set(&c->arena, &d, a, b);
        }
        *out = d;
        return 0;
    }
    default: return jinja_fail(c, n->line, "internal: not an expression");
    }
}

/* ==== statements ==== */

static int emit_value(struct jctx *c, int line, struct jval v) {
    jv_str_to(&c->out, v);
    if (c->out.n > MAX_OUTPUT) return jinja_fail(c, line, "output larger than %zu bytes", MAX_OUTPUT);
    return 0;
}

/* binds for-loop or set targets: one name takes the value, several unpack it */
static int bind_targets(struct jctx *c, int line, const char **names, int n, struct jval v) {
    if (n == 1) {
        scope_set(c, names[0], v);
        return 0;
    }
    struct jval l;
    if (jinja_to_list(c, line, v, &l)) return -1;
    if (l.u.l->n != n) return jinja_fail(c, line, "cannot unpack %d values into %d names", l.u.l->n, n);
    for (int i = 0; i < n; i++) scope_set(c, names[i], l.u.l->v[i]);
    return 0;
}

static int exec_for(struct jctx *c, const struct jnode *n) {
    struct jval it, items;
    if (eval(c, n->a, &it)) return -1;
    if (it.t == JV_NONE) return jinja_fail(c, n->line, "'NoneType' object is not iterable");
    if (jinja_to_list(c, n->line, it, &items)) return -1;
    struct jscope *saved = c->scope;
    c->scope = scope_push(c, saved);
    if (n->d) { /* for x in y if cond: filter first, loop.length counts what is left */
        struct jval kept = jv_list(&c->arena, items.u.l->n);
        for (int i = 0; i < items.u.l->n; i++) {
            struct jval ok;
            if (bind_targets(c, n->line, n->names, n->n_names, items.u.l->v[i]) || eval(c, n->d, &ok)) {
                c->scope = saved;
                return -1;
            }
            if (jv_truthy(ok)) jv_list_push(&c->arena, &kept, items.u.l->v[i]);
        }
        items = kept;
    }
    int len = items.u.l->n, rc = 0;
    for (int i = 0; i < len; i++) {
        struct jval loop = jv_dict(&c->arena, 12);
        struct jarena *A = &c->arena;
        jv_dict_set(A, &loop, jv_cstr(A, "index"), jv_int(i + 1));
        jv_dict_set(A, &loop, jv_cstr(A, "index0"), jv_int(i));
        jv_dict_set(A, &loop, jv_cstr(A, "revindex"), jv_int(len - i));
        jv_dict_set(A, &loop, jv_cstr(A, "revindex0"), jv_int(len - i - 1));
        jv_dict_set(A, &loop, jv_cstr(A, "first"), jv_bool(i == 0));
        jv_dict_set(A, &loop, jv_cstr(A, "last"), jv_bool(i == len - 1));
        jv_dict_set(A, &loop, jv_cstr(A, "length"), jv_int(len));
        jv_dict_set(A, &loop, jv_cstr(A, "depth"), jv_int(1));
        jv_dict_set(A, &loop, jv_cstr(A, "depth0"), jv_int(0));
        jv_dict_set(A, &loop, jv_cstr(A, "previtem"), i > 0 ? items.u.l->v[i - 1] : jv_undef());
        jv_dict_set(A, &loop, jv_cstr(A, "nextitem"), i + 1 < len ? items.u.l->v[i + 1] : jv_undef());
        struct jfunc *cyc = jarena_alloc(A, sizeof *cyc);
        cyc->id = -1; /* loop.cycle: jinja_call_func reads index0 from self */
        cyc->self = jarena_alloc(A, sizeof *cyc->self);
        *cyc->self = loop;
        jv_dict_set(A, &loop, jv_cstr(A, "cycle"), (struct jval){.t = JV_FUNC, .u.fn = cyc});
        scope_set(c, "loop", loop);
        if (bind_targets(c, n->line, n->names, n->n_names, items.u.l->v[i])) {
            rc = -1;
            break;
        }
        rc = exec_body(c, n->b);
        if (rc == EXEC_BREAK) {
            rc = 0;
            break;
        }
        if (rc == EXEC_CONTINUE) rc = 0;
        if (rc < 0) break;
    }
    c->scope = saved;
    if (rc < 0) return -1;
    if (len == 0 && n->c) return exec_body(c, n->c);
    return 0;
}

static int exec_set(struct jctx *c, const struct jnode *n) {
    struct jval v;
    if (n->kind == JN_SET_BLOCK) {
        struct jbuf saved = c->out;
        memset(&c->out, 0, sizeof c->out);
        int rc = exec_body(c, n->b);
        struct jbuf body = c->out;
        c->out = saved;
        if (rc < 0) {
            free(body.s);
            return -1;
        }
        v = jv_str(&c->arena, body.s ? body.s : "", body.n);
        free(body.s);
        /* {% set x | f %}: the filters are a chain whose innermost input is NULL */
        if (n->a) {
            const struct jnode *chain[32];
            int k = 0;
            for (const struct jnode *f = n->a; f && k < 32; f = f->a) chain[k++] = f;
            for (int i = k - 1; i >= 0; i--) {
                struct jargs a;
                if (eval_args(c, chain[i], &a) || jinja_filter(c, chain[i]->line, chain[i]->name, v, &a, &v)) return -1;
            }
        }
        scope_set(c, n->name, v);
        return 0;
    }
    if (eval(c, n->a, &v)) return -1;
    if (n->name2) {
        struct jval ns = lookup(c, n->name);
        if (ns.t != JV_NS) return jinja_fail(c, n->line, "cannot assign attribute '%s' on '%s' (not a namespace)", n->name2, n->name);
        jv_dict_set(&c->arena, &ns, jv_cstr(&c->arena, n->name2), v);
        return 0;
    }
    return bind_targets(c, n->line, n->names, n->n_names, v);
}

static int exec_stmt(struct jctx *c, const struct jnode *n) {
    struct jval v;
    switch (n->kind) {
    case JN_TEXT:
        jbuf_put(&c->out, n->lit->u.s->s, n->lit->u.s->n);
        if (c->out.n > MAX_OUTPUT) return jinja_fail(c, n->line, "output larger than %zu bytes", MAX_OUTPUT);
        return 0;
    case JN_OUTPUT:
        if (eval(c, n->a, &v)) return -1;
        return emit_value(c, n->line, v);
    case JN_IF:
        if (eval(c, n->a, &v)) return -1;
        if (jv_truthy(v)) return exec_body(c, n->b);
        if (!n->c) return 0;
        return n->c->kind == JN_IF ? exec_stmt(c, n->c) : exec_body(c, n->c);
    case JN_FOR: return exec_for(c, n);
    case JN_SET:
    case JN_SET_BLOCK: return exec_set(c, n);
    case JN_MACRO: scope_set(c, n->name, (struct jval){.t = JV_MACRO, .u.macro = n}); return 0;
    case JN_BREAK: return EXEC_BREAK;
    case JN_CONTINUE: return EXEC_CONTINUE;
    case JN_BODY: return exec_body(c, n);
    case JN_CALL_BLOCK: {
        /* the body becomes `caller`, a macro with the block's parameters */
        struct jnode *m = jarena_alloc(&c->arena, sizeof *m);
        *m = *n;
        m->kind = JN_MACRO;
        m->name = "caller";
        if (eval_call(c, n->a, (struct jval){.t = JV_MACRO, .u.macro = m}, &v)) return -1;
        return emit_value(c, n->line, v);
    }
    case JN_FILTER_BLOCK: {
        struct jbuf saved = c->out;
        memset(&c->out, 0, sizeof c->out);
        int rc = exec_body(c, n->b);
        struct jbuf body = c->out;
        c->out = saved;
        if (rc < 0) {
            free(body.s);
            return -1;
        }
        v = jv_str(&c->arena, body.s ? body.s : "", body.n);
        free(body.s);
        const struct jnode *chain[32];
        int k = 0;
        for (const struct jnode *f = n->a; f && k < 32; f = f->a) chain[k++] = f;
        for (int i = k - 1; i >= 0; i--) {
            struct jargs a;
            if (eval_args(c, chain[i], &a) || jinja_filter(c, chain[i]->line, chain[i]->name, v, &a, &v)) return -1;
        }
        return emit_value(c, n->line, v);
    }
    default: return jinja_fail(c, n->line, "internal: not a statement");
    }
}

static int exec_body(struct jctx *c, const struct jnode *body) {
    for (int i = 0; i < body->n_items; i++) {
        int rc = exec_stmt(c, body->items[i]);
        if (rc) return rc;
    }
    return 0;
}

char *jinja_render(const struct jinja_template *t, const cJSON *vars, char *err, size_t errlen) {
    struct jctx c = {.err = err, .errlen = errlen};
    c.root = c.scope = scope_push(&c, NULL);
    const cJSON *it;
    cJSON_ArrayForEach(it, vars) scope_set(&c, it->string, jv_from_json(&c.arena, it));
    int rc = exec_body(&c, t->root);
    if (rc == EXEC_BREAK || rc == EXEC_CONTINUE) rc = jinja_fail(&c, 1, "break or continue outside a loop");
    jarena_free(&c.arena);
    if (rc < 0) {
        free(c.out.s);
        return NULL;
    }
    if (!c.out.s) return kiln_strdup("");
    return c.out.s;
}
