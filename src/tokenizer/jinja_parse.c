/*
 * jinja_parse.c: tokens -> syntax tree, by recursive descent with Jinja's
 * own precedence (lowest first): `x if c else y`, or, and, not, comparisons
 * and `in` (chained), + -, ~, * / // %, **, unary - +, then postfix
 * (.attr, [key], [a:b:c], call) with filters `|f` and tests `is t` binding
 * tighter than any operator, so `messages|length - 1` is (len) - 1.
 *
 * Statements: if/elif/else, for (tuple targets, `if` filter, else), set
 * (name, tuple, ns.attr, block set), macro, call blocks, filter blocks,
 * break/continue (transformers enables loopcontrols), and generation blocks
 * (transformers' AssistantTracker; rendered as plain bodies). Anything else
 * (include, extends, import, block, with, do ...) is an error that names the
 * tag and its line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tokenizer/jinja.h"

struct parser {
    struct jtok *t;
    int pos, n;
    struct jarena *a;
    char *err;
    size_t errlen;
    int failed;
};

/* the current token; past the end it stays on the final JT_EOF */
static struct jtok *cur(struct parser *P) { return &P->t[P->pos < P->n ? P->pos : P->n - 1]; }
static struct jtok *peek(struct parser *P) { return &P->t[P->pos + 1 < P->n ? P->pos + 1 : P->n - 1]; }

static int fail(struct parser *P, int line, const char *fmt, const char *what) {
    if (!P->failed) {
        char msg[200];
        snprintf(msg, sizeof msg, fmt, what);
        kiln_errf(P->err, P->errlen, "template line %d: %s", line, msg);
    }
    P->failed = 1;
    return -1;
}

static const char *tok_desc(struct parser *P, struct jtok *t) {
    switch (t->type) {
    case JT_TEXT: return "template text";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "'%}'";
    case JT_EOF: return "end of template";
    default: {
        size_t n = t->n < 40 ? t->n : 40;
        char *s = jarena_alloc(P->a, n + 3);
        s[0] = '\'';
        memcpy(s + 1, t->s, n);
        s[n + 1] = '\'';
        return s;
    }
    }
}

static int is_op(struct jtok *t, const char *op) {
    return t->type == JT_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n);
}
static int is_name(struct jtok *t, const char *name) {
    return t->type == JT_NAME && t->n == strlen(name) && !memcmp(t->s, name, t->n);
}
static int skip_op(struct parser *P, const char *op) {
    if (is_op(cur(P), op)) return P->pos++, 1;
    return 0;
}
static int skip_name(struct parser *P, const char *name) {
    if (is_name(cur(P), name)) return P->pos++, 1;
    return 0;
}
static int expect_op(struct parser *P, const char *op) {
    if (skip_op(P, op)) return 0;
    char msg[64];
    snprintf(msg, sizeof msg, "expected '%s', got %%s", op);
    return fail(P, cur(P)->line, msg, tok_desc(P, cur(P)));
}

static const char *dup_tok(struct parser *P, struct jtok *t) {
    char *s = jarena_alloc(P->a, t->n + 1);
    memcpy(s, t->s, t->n);
    return s;
}

static const char *expect_name(struct parser *P) {
    struct jtok *t = cur(P);
    if (t->type != JT_NAME) {
        fail(P, t->line, "expected a name, got %s", tok_desc(P, t));
        return NULL;
    }
    P->pos++;
    return dup_tok(P, t);
}

static struct jnode *node(struct parser *P, enum jnode_kind k, int line) {
    struct jnode *n = jarena_alloc(P->a, sizeof *n);
    n->kind = k, n->line = line;
    return n;
}

/* a growable array of node pointers, moved into the arena when done */
struct nvec {
    struct jnode **v;
    int n, cap;
    const char **names;
};
static void nvec_push(struct nvec *v, struct jnode *x, const char *name) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 8;
        v->v = kiln_realloc(v->v, (size_t)v->cap * sizeof *v->v);
        v->names = kiln_realloc(v->names, (size_t)v->cap * sizeof *v->names);
    }
    v->names[v->n] = name;
    v->v[v->n++] = x;
}
static struct jnode **nvec_done(struct parser *P, struct nvec *v, const char ***names) {
    struct jnode **out = jarena_alloc(P->a, (size_t)(v->n + 1) * sizeof *out);
    if (v->n) memcpy(out, v->v, (size_t)v->n * sizeof *out);
    if (names) {
        *names = jarena_alloc(P->a, (size_t)(v->n + 1) * sizeof **names);
        if (v->n) memcpy(*names, v->names, (size_t)v->n * sizeof **names);
    }
    free(v->v);
    free(v->names);
    return out;
}

/* ==== expressions ==== */

static struct jnode *parse_expr(struct parser *P);
static struct jnode *parse_or(struct parser *P);
static struct jnode *parse_unary(struct parser *P, int with_filter);
static struct jnode *parse_primary(struct parser *P);
static struct jnode *parse_postfix(struct parser *P, struct jnode *n);

/* (args, kw=args) after the '(' */
static int parse_call_args(struct parser *P, struct jnode *call) {
    struct nvec pos = {0}, kw = {0};
    while (!P->failed && !is_op(cur(P), ")")) {
        if (pos.n + kw.n && expect_op(P, ",")) break;
        if (is_op(cur(P), ")")) break; /* trailing comma */
        if (cur(P)->type == JT_NAME && is_op(peek(P), "=")) {
            const char *name = dup_tok(P, cur(P));
            P->pos += 2;
            nvec_push(&kw, parse_expr(P), name);
        } else {
            if (kw.n) fail(P, cur(P)->line, "%s", "positional argument after a keyword argument");
            nvec_push(&pos, parse_expr(P), NULL);
        }
    }
    call->n_items = pos.n;
    call->items = nvec_done(P, &pos, NULL);
    call->n_names = kw.n;
    call->items2 = nvec_done(P, &kw, &call->names);
    return expect_op(P, ")");
}

static struct jnode *parse_filter(struct parser *P, struct jnode *x) {
    struct jtok *t = cur(P);
    struct jnode *f = node(P, JE_FILTER, t->line);
    f->a = x;
    f->name = expect_name(P);
    while (f->name && skip_op(P, ".")) { /* dotted filter names do not exist in our set; keep the last part */
        f->name = expect_name(P);
    }
    if (skip_op(P, "(")) parse_call_args(P, f);
    else f->items = jarena_alloc(P->a, sizeof *f->items), f->items2 = f->items, f->names = jarena_alloc(P->a, sizeof *f->names);
    return f;
}

static struct jnode *parse_test(struct parser *P, struct jnode *x) {
    struct jtok *t = cur(P);
    struct jnode *n = node(P, JE_TEST, t->line);
    n->a = x;
    n->flag = skip_name(P, "not");
    n->name = expect_name(P);
    n->items = jarena_alloc(P->a, 2 * sizeof *n->items);
    n->items2 = jarena_alloc(P->a, sizeof *n->items2);
    n->names = jarena_alloc(P->a, sizeof *n->names);
    struct jtok *c = cur(P);
    if (is_op(c, "(")) {
        P->pos++;
        parse_call_args(P, n);
    } else if ((c->type == JT_NAME || c->type == JT_STRING || c->type == JT_INT || c->type == JT_FLOAT ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        n->items[0] = parse_postfix(P, parse_primary(P));
        n->n_items = 1;
    }
    return n;
}

static struct jnode *parse_filter_expr(struct parser *P, struct jnode *x) {
    while (!P->failed) {
        if (skip_op(P, "|")) x = parse_filter(P, x);
        else if (skip_name(P, "is")) x = parse_test(P, x);
        else if (is_op(cur(P), "(")) x = parse_postfix(P, x);
        else break;
    }
    return x;
}

static struct jnode *literal(struct parser *P, int line, struct jval v) {
    struct jnode *n = node(P, JE_LITERAL, line);
    n->lit = jarena_alloc(P->a, sizeof *n->lit);
    *n->lit = v;
    return n;
}

static struct jnode *parse_primary(struct parser *P) {
    struct jtok *t = cur(P);
    if (P->failed) return node(P, JE_LITERAL, t->line);
    if (t->type == JT_NAME) {
        P->pos++;
        if (is_name(t, "true") || is_name(t, "True")) return literal(P, t->line, jv_bool(1));
        if (is_name(t, "false") || is_name(t, "False")) return literal(P, t->line, jv_bool(0));
        if (is_name(t, "none") || is_name(t, "None")) return literal(P, t->line, jv_none());
        struct jnode *n = node(P, JE_NAME, t->line);
        n->name = dup_tok(P, t);
        return n;
    }
    if (t->type == JT_STRING) { /* adjacent literals concatenate */
        struct jbuf b = {0};
        while (cur(P)->type == JT_STRING) jbuf_put(&b, cur(P)->s, cur(P)->n), P->pos++;
        struct jnode *n = literal(P, t->line, jv_str(P->a, b.s ? b.s : "", b.n));
        free(b.s);
        return n;
    }
    if (t->type == JT_INT) return P->pos++, literal(P, t->line, jv_int(t->i));
    if (t->type == JT_FLOAT) return P->pos++, literal(P, t->line, jv_float(t->f));
    if (skip_op(P, "(")) {
        if (skip_op(P, ")")) {
            struct jnode *n = node(P, JE_TUPLE, t->line);
            n->items = jarena_alloc(P->a, sizeof *n->items);
            return n;
        }
        struct jnode *e = parse_expr(P);
        if (is_op(cur(P), ",")) {
            struct nvec v = {0};
            nvec_push(&v, e, NULL);
            while (skip_op(P, ",") && !is_op(cur(P), ")")) nvec_push(&v, parse_expr(P), NULL);
            e = node(P, JE_TUPLE, t->line);
            e->n_items = v.n;
            e->items = nvec_done(P, &v, NULL);
        }
        expect_op(P, ")");
        return e;
    }
    if (skip_op(P, "[")) {
        struct nvec v = {0};
        while (!P->failed && !is_op(cur(P), "]")) {
            if (v.n && expect_op(P, ",")) break;
            if (is_op(cur(P), "]")) break;
            nvec_push(&v, parse_expr(P), NULL);
        }
        expect_op(P, "]");
        struct jnode *n = node(P, JE_LIST, t->line);
        n->n_items = v.n;
        n->items = nvec_done(P, &v, NULL);
        return n;
    }
    if (skip_op(P, "{")) {
        struct nvec k = {0}, v = {0};
        while (!P->failed && !is_op(cur(P), "}")) {
            if (k.n && expect_op(P, ",")) break;
            if (is_op(cur(P), "}")) break;
            nvec_push(&k, parse_expr(P), NULL);
            expect_op(P, ":");
            nvec_push(&v, parse_expr(P), NULL);
        }
        expect_op(P, "}");
        struct jnode *n = node(P, JE_DICT, t->line);
        n->n_items = k.n;
        n->items = nvec_done(P, &k, NULL);
        n->items2 = nvec_done(P, &v, NULL);
        return n;
    }
    fail(P, t->line, "unexpected %s in an expression", tok_desc(P, t));
    return node(P, JE_LITERAL, t->line);
}

static struct jnode *parse_postfix(struct parser *P, struct jnode *x) {
    while (!P->failed) {
        struct jtok *t = cur(P);
        if (skip_op(P, ".")) {
            struct jtok *nt = cur(P);
            if (nt->type == JT_INT) { /* x.0 is x[0] */
                P->pos++;
                struct jnode *n = node(P, JE_ITEM, t->line);
                n->a = x, n->b = literal(P, t->line, jv_int(nt->i));
                x = n;
                continue;
            }
            struct jnode *n = node(P, JE_ATTR, t->line);
            n->a = x;
            n->name = expect_name(P);
            x = n;
        } else if (skip_op(P, "[")) {
            struct jnode *parts[3] = {0};
            int colons = 0;
            for (;;) {
                if (is_op(cur(P), ":")) {
                    P->pos++;
                    if (++colons > 2) {
                        fail(P, t->line, "%s", "too many ':' in a slice");
                        break;
                    }
                    continue;
                }
                if (is_op(cur(P), "]") || P->failed) break;
                if (parts[colons]) {
                    fail(P, cur(P)->line, "unexpected %s in a subscript", tok_desc(P, cur(P)));
                    break;
                }
                parts[colons] = parse_expr(P);
            }
            expect_op(P, "]");
            struct jnode *n = node(P, colons ? JE_SLICE : JE_ITEM, t->line);
            n->a = x, n->b = parts[0], n->c = parts[1], n->d = parts[2];
            if (!colons && !parts[0]) fail(P, t->line, "%s", "empty subscript");
            x = n;
        } else if (skip_op(P, "(")) {
            struct jnode *n = node(P, JE_CALL, t->line);
            n->a = x;
            parse_call_args(P, n);
            x = n;
        } else break;
    }
    return x;
}

static struct jnode *parse_unary(struct parser *P, int with_filter) {
    struct jtok *t = cur(P);
    struct jnode *x;
    if (skip_op(P, "-")) {
        x = node(P, JE_NEG, t->line);
        x->a = parse_unary(P, 0);
    } else if (skip_op(P, "+")) {
        x = node(P, JE_POS, t->line);
        x->a = parse_unary(P, 0);
    } else x = parse_primary(P);
    x = parse_postfix(P, x);
    if (with_filter) x = parse_filter_expr(P, x);
    return x;
}

static struct jnode *binop(struct parser *P, const char *op, struct jnode *a, struct jnode *b, int line) {
    struct jnode *n = node(P, JE_BINOP, line);
    n->name = op, n->a = a, n->b = b;
    return n;
}

static struct jnode *parse_pow(struct parser *P) {
    struct jnode *x = parse_unary(P, 1);
    while (!P->failed && is_op(cur(P), "**")) {
        int line = cur(P)->line;
        P->pos++;
        x = binop(P, "**", x, parse_unary(P, 1), line);
    }
    return x;
}

static struct jnode *parse_math2(struct parser *P) {
    struct jnode *x = parse_pow(P);
    static const char *ops[] = {"*", "/", "//", "%"};
    for (;;) {
        int k = -1;
        for (int i = 0; i < 4; i++)
            if (is_op(cur(P), ops[i])) k = i;
        if (k < 0 || P->failed) return x;
        int line = cur(P)->line;
        P->pos++;
        x = binop(P, ops[k], x, parse_pow(P), line);
    }
}

static struct jnode *parse_concat(struct parser *P) {
    struct jnode *x = parse_math2(P);
    while (!P->failed && is_op(cur(P), "~")) {
        int line = cur(P)->line;
        P->pos++;
        x = binop(P, "~", x, parse_math2(P), line);
    }
    return x;
}

static struct jnode *parse_math1(struct parser *P) {
    struct jnode *x = parse_concat(P);
    while (!P->failed && (is_op(cur(P), "+") || is_op(cur(P), "-"))) {
        int line = cur(P)->line;
        const char *op = is_op(cur(P), "+") ? "+" : "-";
        P->pos++;
        x = binop(P, op, x, parse_concat(P), line);
    }
    return x;
}

static struct jnode *parse_compare(struct parser *P) {
    int line = cur(P)->line;
    struct jnode *x = parse_math1(P);
    struct nvec ops = {0};
    static const char *cmp[] = {"==", "!=", "<", ">", "<=", ">="};
    for (;;) {
        const char *op = NULL;
        for (int i = 0; i < 6; i++)
            if (is_op(cur(P), cmp[i])) op = cmp[i];
        if (op) P->pos++;
        else if (skip_name(P, "in")) op = "in";
        else if (is_name(cur(P), "not") && is_name(peek(P), "in")) P->pos += 2, op = "notin";
        else break;
        nvec_push(&ops, parse_math1(P), op);
    }
    if (!ops.n) return x;
    struct jnode *n = node(P, JE_COMPARE, line);
    n->a = x;
    n->n_items = ops.n;
    n->items = nvec_done(P, &ops, &n->names);
    return n;
}

static struct jnode *parse_not(struct parser *P) {
    struct jtok *t = cur(P);
    if (skip_name(P, "not")) {
        struct jnode *n = node(P, JE_NOT, t->line);
        n->a = parse_not(P);
        return n;
    }
    return parse_compare(P);
}

static struct jnode *parse_and(struct parser *P) {
    struct jnode *x = parse_not(P);
    while (!P->failed && is_name(cur(P), "and")) {
        struct jnode *n = node(P, JE_AND, cur(P)->line);
        P->pos++;
        n->a = x, n->b = parse_not(P);
        x = n;
    }
    return x;
}

static struct jnode *parse_or(struct parser *P) {
    struct jnode *x = parse_and(P);
    while (!P->failed && is_name(cur(P), "or")) {
        struct jnode *n = node(P, JE_OR, cur(P)->line);
        P->pos++;
        n->a = x, n->b = parse_and(P);
        x = n;
    }
    return x;
}

/* x if cond else y (else optional: undefined) */
static struct jnode *parse_expr(struct parser *P) {
    struct jnode *x = parse_or(P);
    while (!P->failed && is_name(cur(P), "if")) {
        struct jnode *n = node(P, JE_COND, cur(P)->line);
        P->pos++;
        n->a = parse_or(P);
        n->b = x;
        if (skip_name(P, "else")) n->c = parse_expr(P);
        x = n;
    }
    return x;
}

/* an expression that may be an unparenthesized tuple: "a, b" */
static struct jnode *parse_tuple_expr(struct parser *P) {
    int line = cur(P)->line;
    struct jnode *x = parse_expr(P);
    if (!is_op(cur(P), ",")) return x;
    struct nvec v = {0};
    nvec_push(&v, x, NULL);
    while (skip_op(P, ",")) nvec_push(&v, parse_expr(P), NULL);
    struct jnode *n = node(P, JE_TUPLE, line);
    n->n_items = v.n;
    n->items = nvec_done(P, &v, NULL);
    return n;
}

/* ==== statements ==== */

static struct jnode *parse_body(struct parser *P, const char *const *ends, const char **which);

static int end_tag(struct parser *P) {
    if (cur(P)->type == JT_BLOCK_END) return P->pos++, 0;
    return fail(P, cur(P)->line, "expected '%%}', got %s", tok_desc(P, cur(P)));
}

static struct jnode *parse_if(struct parser *P, int line) {
    struct jnode *n = node(P, JN_IF, line);
    n->a = parse_expr(P);
    end_tag(P);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *which = NULL;
    n->b = parse_body(P, ends, &which);
    if (P->failed) return n;
    if (!strcmp(which, "elif")) {
        n->c = parse_if(P, cur(P)->line);
        return n;
    }
    if (!strcmp(which, "else")) {
        end_tag(P);
        static const char *const ends2[] = {"endif", NULL};
        n->c = parse_body(P, ends2, &which);
    }
    end_tag(P);
    return n;
}

static struct jnode *parse_for(struct parser *P, int line) {
    struct jnode *n = node(P, JN_FOR, line);
    struct nvec targets = {0};
    do {
        const char *name = expect_name(P);
        if (!name) break;
        nvec_push(&targets, NULL, name);
    } while (skip_op(P, ","));
    n->n_names = targets.n;
    nvec_done(P, &targets, &n->names);
    if (!skip_name(P, "in")) fail(P, cur(P)->line, "expected 'in' in a for loop, got %s", tok_desc(P, cur(P)));
    /* the iterable: no conditional expression here, `if` filters the loop */
    int tl = cur(P)->line;
    struct jnode *it = parse_or(P);
    if (is_op(cur(P), ",")) {
        struct nvec v = {0};
        nvec_push(&v, it, NULL);
        while (skip_op(P, ",")) nvec_push(&v, parse_or(P), NULL);
        it = node(P, JE_TUPLE, tl);
        it->n_items = v.n;
        it->items = nvec_done(P, &v, NULL);
    }
    n->a = it;
    if (skip_name(P, "if")) n->d = parse_expr(P);
    if (skip_name(P, "recursive")) fail(P, line, "%s", "unsupported 'recursive' for loop");
    end_tag(P);
    static const char *const ends[] = {"else", "endfor", NULL};
    const char *which = NULL;
    n->b = parse_body(P, ends, &which);
    if (!P->failed && !strcmp(which, "else")) {
        end_tag(P);
        static const char *const ends2[] = {"endfor", NULL};
        n->c = parse_body(P, ends2, &which);
    }
    end_tag(P);
    return n;
}

static struct jnode *parse_set(struct parser *P, int line) {
    struct jnode *n = node(P, JN_SET, line);
    struct nvec targets = {0};
    do {
        const char *name = expect_name(P);
        if (!name) break;
        if (skip_op(P, ".")) n->name2 = expect_name(P);
        nvec_push(&targets, NULL, name);
    } while (skip_op(P, ","));
    n->n_names = targets.n;
    nvec_done(P, &targets, &n->names);
    n->name = n->names[0];
    if (n->name2 && n->n_names > 1) fail(P, line, "%s", "unsupported set of several targets with an attribute");
    if (skip_op(P, "=")) {
        n->a = parse_tuple_expr(P);
        end_tag(P);
        return n;
    }
    if (n->n_names != 1 || n->name2) fail(P, line, "%s", "a block set takes one plain name");
    n->kind = JN_SET_BLOCK;
    while (!P->failed && skip_op(P, "|")) n->a = parse_filter(P, n->a); /* {% set x | filter %} */
    end_tag(P);
    static const char *const ends[] = {"endset", NULL};
    const char *which;
    n->b = parse_body(P, ends, &which);
    end_tag(P);
    return n;
}

/* "(a, b=default)" of a macro or call block */
static void parse_params(struct parser *P, struct jnode *n) {
    struct nvec p = {0};
    if (skip_op(P, "(")) {
        while (!P->failed && !is_op(cur(P), ")")) {
            if (p.n && expect_op(P, ",")) break;
            const char *name = expect_name(P);
            struct jnode *dflt = NULL;
            if (skip_op(P, "=")) dflt = parse_expr(P);
            nvec_push(&p, dflt, name);
        }
        expect_op(P, ")");
    }
    n->n_items = p.n;
    n->items = nvec_done(P, &p, &n->names);
}

static struct jnode *parse_stmt(struct parser *P) {
    struct jtok *t = cur(P);
    int line = t->line;
    if (t->type != JT_NAME) {
        fail(P, line, "expected a tag name after '{%%', got %s", tok_desc(P, t));
        return NULL;
    }
    P->pos++;
    if (is_name(t, "if")) return parse_if(P, line);
    if (is_name(t, "for")) return parse_for(P, line);
    if (is_name(t, "set")) return parse_set(P, line);
    if (is_name(t, "break") || is_name(t, "continue")) {
        struct jnode *n = node(P, is_name(t, "break") ? JN_BREAK : JN_CONTINUE, line);
        end_tag(P);
        return n;
    }
    if (is_name(t, "macro")) {
        struct jnode *n = node(P, JN_MACRO, line);
        n->name = expect_name(P);
        parse_params(P, n);
        end_tag(P);
        static const char *const ends[] = {"endmacro", NULL};
        const char *which;
        n->b = parse_body(P, ends, &which);
        if (cur(P)->type == JT_NAME) P->pos++; /* {% endmacro name %} */
        end_tag(P);
        return n;
    }
    if (is_name(t, "call")) {
        struct jnode *n = node(P, JN_CALL_BLOCK, line);
        parse_params(P, n);
        n->a = parse_expr(P);
        if (n->a && n->a->kind != JE_CALL) fail(P, line, "%s", "a call block needs a macro call");
        end_tag(P);
        static const char *const ends[] = {"endcall", NULL};
        const char *which;
        n->b = parse_body(P, ends, &which);
        end_tag(P);
        return n;
    }
    if (is_name(t, "filter")) {
        struct jnode *n = node(P, JN_FILTER_BLOCK, line);
        n->a = parse_filter(P, NULL);
        while (!P->failed && skip_op(P, "|")) n->a = parse_filter(P, n->a);
        end_tag(P);
        static const char *const ends[] = {"endfilter", NULL};
        const char *which;
        n->b = parse_body(P, ends, &which);
        end_tag(P);
        return n;
    }
    if (is_name(t, "generation")) {
        end_tag(P);
        static const char *const ends[] = {"endgeneration", NULL};
        const char *which;
        struct jnode *n = parse_body(P, ends, &which);
        end_tag(P);
        return n;
    }
    fail(P, line, "unsupported tag '%s'", dup_tok(P, t));
    return NULL;
}

/* statements until a block tag named in ends (its name consumed, *which set;
 * the tag's '%}' is left for the caller), or EOF when ends is NULL */
static struct jnode *parse_body(struct parser *P, const char *const *ends, const char **which) {
    struct jnode *body = node(P, JN_BODY, cur(P)->line);
    struct nvec v = {0};
    int start_line = P->pos > 0 ? P->t[P->pos - 1].line : 1;
    while (!P->failed) {
        struct jtok *t = cur(P);
        if (t->type == JT_EOF) {
            if (ends) {
                char what[64];
                snprintf(what, sizeof what, "'%s'", ends[0] ? ends[ends[1] ? (ends[2] ? 2 : 1) : 0] : "?");
                for (int i = 0; ends[i]; i++)
                    if (!strncmp(ends[i], "end", 3)) snprintf(what, sizeof what, "'{%% %s %%}'", ends[i]);
                char msg[160];
                snprintf(msg, sizeof msg, "unexpected end of template, expected %s for the block opened at line %d",
                         what, start_line);
                fail(P, t->line, "%s", msg);
            }
            break;
        }
        if (t->type == JT_TEXT) {
            struct jnode *n = node(P, JN_TEXT, t->line);
            n->lit = jarena_alloc(P->a, sizeof *n->lit);
            *n->lit = jv_str(P->a, t->s, t->n);
            nvec_push(&v, n, NULL);
            P->pos++;
            continue;
        }
        if (t->type == JT_VAR_BEGIN) {
            P->pos++;
            struct jnode *n = node(P, JN_OUTPUT, t->line);
            n->a = parse_tuple_expr(P);
            if (!P->failed && cur(P)->type != JT_VAR_END)
                fail(P, cur(P)->line, "expected '}}', got %s", tok_desc(P, cur(P)));
            P->pos++;
            nvec_push(&v, n, NULL);
            continue;
        }
        if (t->type == JT_BLOCK_BEGIN) {
            struct jtok *name = peek(P);
            int matched = 0;
            for (int i = 0; ends && ends[i]; i++)
                if (is_name(name, ends[i])) {
                    *which = ends[i];
                    P->pos += 2;
                    matched = 1;
                    break;
                }
            if (matched) break;
            if (name->type == JT_NAME && (!strncmp(name->s, "end", 3) || is_name(name, "elif") || is_name(name, "else"))) {
                fail(P, name->line, "unexpected '%s' here", dup_tok(P, name));
                break;
            }
            P->pos++;
            struct jnode *n = parse_stmt(P);
            if (n) nvec_push(&v, n, NULL);
            continue;
        }
        fail(P, t->line, "unexpected %s", tok_desc(P, t));
    }
    body->n_items = v.n;
    body->items = nvec_done(P, &v, NULL);
    return body;
}

struct jinja_template *jinja_parse(const char *src, size_t len, char *err, size_t errlen) {
    struct jinja_template *t = kiln_calloc(1, sizeof *t);
    struct jtok *toks;
    int n;
    if (jinja_lex(src, len, &t->arena, &toks, &n, err, errlen)) {
        jinja_free(t);
        return NULL;
    }
    struct parser P = {.t = toks, .n = n, .a = &t->arena, .err = err, .errlen = errlen};
    t->root = parse_body(&P, NULL, NULL);
    if (P.failed) {
        jinja_free(t);
        return NULL;
    }
    return t;
}

void jinja_free(struct jinja_template *t) {
    if (!t) return;
    jarena_free(&t->arena);
    free(t);
}
