/*
 * jinja.h: a Jinja2 subset for chat templates, shared by jinja_lex.c (source
 * -> tokens), jinja_parse.c (tokens -> tree), jinja_value.c (values, Python
 * str/repr/json) and jinja_eval.c (tree -> text). chat.c is the only user.
 *
 * The environment is the one transformers builds in _compile_jinja_template:
 * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
 * loopcontrols extension (break/continue), its own tojson (ensure_ascii=False),
 * raise_exception and strftime_now, and Jinja's defaults otherwise (default
 * Undefined, keep_trailing_newline=False, no autoescape).
 *
 * Memory: a parsed template owns an arena with its tree; one render owns
 * another arena with every value it creates. Values are immutable except
 * namespace() objects, so they are shared freely and never freed one by one.
 */
#ifndef KILN_JINJA_H
#define KILN_JINJA_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* ==== arena ==== */

struct jarena {
    struct jarena_block *head;
};
void *jarena_alloc(struct jarena *a, size_t n);
void jarena_free(struct jarena *a);

/* ==== tokens ==== */

enum jtok_type {
    JT_TEXT, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP, JT_EOF
};

struct jtok {
    enum jtok_type type;
    int line;
    const char *s; /* text / name / op / decoded string (arena) */
    size_t n;
    int64_t i;
    double f;
};

/* Lexes src into *toks (arena), ending with JT_EOF. -1 + err on error. */
int jinja_lex(const char *src, size_t len, struct jarena *a, struct jtok **toks, int *n_toks, char *err,
              size_t errlen);

/* ==== syntax tree ==== */

enum jnode_kind {
    /* statements */
    JN_BODY, JN_TEXT, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SET_BLOCK, JN_MACRO, JN_BREAK, JN_CONTINUE,
    JN_FILTER_BLOCK, JN_CALL_BLOCK,
    /* expressions */
    JE_LITERAL, JE_NAME, JE_ATTR, JE_ITEM, JE_SLICE, JE_CALL, JE_FILTER, JE_TEST, JE_NEG, JE_POS, JE_NOT,
    JE_BINOP, JE_AND, JE_OR, JE_COMPARE, JE_COND, JE_LIST, JE_TUPLE, JE_DICT
};

struct jnode {
    enum jnode_kind kind;
    int line;
    const char *name; /* JE_NAME, JE_ATTR, filter/test name, set target, macro name; op for JE_BINOP */
    const char *name2;            /* JN_SET: attribute of the target (ns.attr) */
    struct jnode *a, *b, *c, *d; /* children: operands, condition, bodies */
    struct jnode **items;        /* body statements, call args, list items, dict keys */
    int n_items;
    struct jnode **items2;       /* dict values, call kwarg values, compare operands */
    const char **names;          /* call kwarg names, for-loop targets, macro params, compare ops */
    int n_names;
    int flag;                    /* JE_TEST: negated; JN_FOR: recursive (unsupported) */
    struct jval *lit;            /* JE_LITERAL */
};

struct jinja_template {
    struct jarena arena;
    struct jnode *root; /* JN_BODY */
};

/* Parses a template. NULL + err ("template line N: ...") on error. */
struct jinja_template *jinja_parse(const char *src, size_t len, char *err, size_t errlen);
void jinja_free(struct jinja_template *t);

/* ==== values ==== */

enum jtype { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS, JV_MACRO, JV_FUNC };

struct jstr {
    size_t n;
    char s[]; /* NUL-terminated */
};
struct jlist {
    int n, cap;
    int tuple; /* prints as (a, b): dict items, dictsort pairs, tuple literals */
    struct jval *v;
};
struct jdict { /* insertion ordered; also namespace() objects */
    int n, cap;
    struct jval *k, *v;
};
struct jfunc { /* a builtin global or a bound method */
    int id;
    struct jval *self;
};

struct jval {
    enum jtype t;
    union {
        int b;
        int64_t i;
        double f;
        struct jstr *s;
        struct jlist *l;
        struct jdict *d;
        const struct jnode *macro;
        struct jfunc *fn;
    } u;
};

struct jval jv_undef(void);
struct jval jv_none(void);
struct jval jv_bool(int b);
struct jval jv_int(int64_t i);
struct jval jv_float(double f);
struct jval jv_str(struct jarena *a, const char *s, size_t n);
struct jval jv_cstr(struct jarena *a, const char *s);
struct jval jv_list(struct jarena *a, int cap);
struct jval jv_dict(struct jarena *a, int cap);
void jv_list_push(struct jarena *a, struct jval *list, struct jval v);
void jv_dict_set(struct jarena *a, struct jval *dict, struct jval k, struct jval v);
/* lookup by key; NULL if absent */
struct jval *jv_dict_get(const struct jval *dict, const char *key, size_t n);
struct jval *jv_dict_getv(const struct jval *dict, struct jval key);

int jv_truthy(struct jval v);
int jv_equal(struct jval a, struct jval b);
const char *jv_type_name(struct jval v);
struct jval jv_from_json(struct jarena *a, const cJSON *j);

/* a growing string */
struct jbuf {
    char *s;
    size_t n, cap;
};
void jbuf_put(struct jbuf *b, const char *s, size_t n);
void jbuf_puts(struct jbuf *b, const char *s);

/* Python str(v), repr(v), and json.dumps(v, ensure_ascii=False, indent,
 * sort_keys) appended to b. indent < 0: no indent. 0 or -1 (not serializable). */
void jv_str_to(struct jbuf *b, struct jval v);
void jv_repr_to(struct jbuf *b, struct jval v);
int jv_json_to(struct jbuf *b, struct jval v, int indent, const char *indent_str, int sort_keys, int depth);
void jv_float_repr(char *out, size_t n, double f);

/* ==== render ==== */

/* One render: values live in arena; err is filled once (the first error). */
struct jscope;
struct jctx {
    struct jarena arena;
    struct jbuf out;
    struct jscope *scope, *root;
    int depth; /* macro call depth */
    char *err;
    size_t errlen;
    int failed;
};

/* Sets the render error "template line N: ..." (only the first one counts); returns -1. */
int jinja_fail(struct jctx *c, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* arguments of a call, filter or test after evaluation */
struct jargs {
    int n, n_kw;
    struct jval *v;
    const char **kw_names;
    struct jval *kw;
};

/* Builtins (jinja_builtins.c). Each returns 0 with *out set, or -1 via jinja_fail. */
int jinja_filter(struct jctx *c, int line, const char *name, struct jval x, const struct jargs *a, struct jval *out);
int jinja_test(struct jctx *c, int line, const char *name, struct jval x, const struct jargs *a, int *out);
/* attribute lookup: dict keys, namespace attributes, and methods bound as JV_FUNC */
struct jval jinja_getattr(struct jctx *c, struct jval obj, const char *name);
/* the globals: range, namespace, dict, raise_exception, strftime_now; undefined if not one */
struct jval jinja_global(struct jctx *c, const char *name);
/* calls a JV_FUNC (a global or a bound method) */
int jinja_call_func(struct jctx *c, int line, const struct jfunc *f, const struct jargs *a, struct jval *out);
/* iteration as Python's list(x): list items, dict keys, string characters */
int jinja_to_list(struct jctx *c, int line, struct jval x, struct jval *out);
/* v as a string value (Jinja's str(v)), allocated in the context's arena. */
struct jval jinja_str_of(struct jctx *c, struct jval v);

/* Renders with the variables of the JSON object vars. malloc'd text, or NULL +
 * err ("template line N: ..."). */
char *jinja_render(const struct jinja_template *t, const cJSON *vars, char *err, size_t errlen);

#endif
