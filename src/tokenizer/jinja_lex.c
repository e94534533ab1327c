/*
 * jinja_lex.c: template source -> tokens, and the arena.
 *
 * Whitespace is decided here, as in Jinja's lexer with transformers'
 * settings: newlines normalized to \n and one trailing newline dropped
 * (keep_trailing_newline=False); `{%-`/`{{-`/`{#-` strip all whitespace
 * before the tag and `-%}`/`-}}`/`-#}` all whitespace after; trim_blocks
 * drops the first newline after a block or comment tag; lstrip_blocks drops
 * spaces and tabs between the start of a line and a block or comment tag
 * (never for `{{`, never for `{%+`). Inside tags `}}` and `%}` only end the tag
 * when brackets are balanced, so dict literals work.
 */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tokenizer/jinja.h"

/* ==== arena ==== */

struct jarena_block {
    struct jarena_block *next;
    size_t used, cap;
    max_align_t data[];
};

void *jarena_alloc(struct jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    struct jarena_block *b = a->head;
    if (!b || b->used + n > b->cap) {
        size_t cap = n > 65536 ? n : 65536;
        b = kiln_malloc(sizeof *b + cap);
        b->next = a->head, b->used = 0, b->cap = cap;
        a->head = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void jarena_free(struct jarena *a) {
    for (struct jarena_block *b = a->head, *n; b; b = n) n = b->next, free(b);
    a->head = NULL;
}

/* ==== lexer ==== */

struct lexer {
    const char *s;
    size_t n, pos;
    int line;
    struct jarena *a;
    struct jtok *toks;
    int n_toks, cap;
    char *err;
    size_t errlen;
};

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static struct jtok *push(struct lexer *L, enum jtok_type type, const char *s, size_t n) {
    if (L->n_toks == L->cap) {
        L->cap = L->cap ? L->cap * 2 : 256;
        L->toks = kiln_realloc(L->toks, (size_t)L->cap * sizeof *L->toks);
    }
    struct jtok *t = &L->toks[L->n_toks++];
    memset(t, 0, sizeof *t);
    t->type = type, t->line = L->line, t->s = s, t->n = n;
    return t;
}

static void count_lines(struct lexer *L, size_t from, size_t to) {
    for (size_t i = from; i < to; i++) L->line += L->s[i] == '\n';
}

static int lex_string(struct lexer *L) {
    char q = L->s[L->pos];
    size_t i = L->pos + 1;
    struct jbuf b = {0};
    while (i < L->n && L->s[i] != q) {
        char c = L->s[i];
        if (c == '\\' && i + 1 < L->n) {
            char e = L->s[++i];
            char out = 0;
            switch (e) {
            case 'n': out = '\n'; break;
            case 't': out = '\t'; break;
            case 'r': out = '\r'; break;
            case '\\': out = '\\'; break;
            case '\'': out = '\''; break;
            case '"': out = '"'; break;
            case '0': out = '\0'; break;
            case 'b': out = '\b'; break;
            case 'f': out = '\f'; break;
            case 'v': out = '\v'; break;
            case 'a': out = '\a'; break;
            case '\n': i++; continue; /* line continuation */
            case 'x': case 'u': case 'U': {
                int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                uint32_t cp = 0;
                for (int k = 0; k < nd; k++) {
                    char h = i + 1 < L->n ? L->s[++i] : 0;
                    int v = h >= '0' && h <= '9' ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
                    if (v < 0) {
                        free(b.s);
                        return kiln_errf(L->err, L->errlen, "template line %d: bad \\%c escape in a string", L->line, e);
                    }
                    cp = cp * 16 + (uint32_t)v;
                }
                char u[4];
                int k = 0;
                if (cp < 0x80) u[k++] = (char)cp;
                else if (cp < 0x800) u[k++] = (char)(0xC0 | cp >> 6), u[k++] = (char)(0x80 | (cp & 63));
                else if (cp < 0x10000) u[k++] = (char)(0xE0 | cp >> 12), u[k++] = (char)(0x80 | ((cp >> 6) & 63)), u[k++] = (char)(0x80 | (cp & 63));
                else u[k++] = (char)(0xF0 | cp >> 18), u[k++] = (char)(0x80 | ((cp >> 12) & 63)), u[k++] = (char)(0x80 | ((cp >> 6) & 63)), u[k++] = (char)(0x80 | (cp & 63));
                jbuf_put(&b, u, (size_t)k);
                i++;
                continue;
            }
            default: jbuf_put(&b, "\\", 1), out = e; break; /* unknown escapes stay as written */
            }
            jbuf_put(&b, &out, 1);
            i++;
            continue;
        }
        jbuf_put(&b, &c, 1);
        i++;
    }
    if (i >= L->n) {
        free(b.s);
        return kiln_errf(L->err, L->errlen, "template line %d: unterminated string literal", L->line);
    }
    char *s = jarena_alloc(L->a, b.n + 1);
    if (b.n) memcpy(s, b.s, b.n);
    struct jtok *t = push(L, JT_STRING, s, b.n);
    (void)t;
    free(b.s);
    count_lines(L, L->pos, i);
    L->pos = i + 1;
    return 0;
}

static const char *ops3[] = {NULL};
static const char *ops2[] = {"**", "//", "==", "!=", "<=", ">=", NULL};
static const char ops1[] = "+-*/%~<>=()[]{},.:|!?";

/* lexes the inside of a tag up to its end marker (end is '}' or '%') */
static int lex_tag(struct lexer *L, char end, enum jtok_type end_type) {
    int depth = 0;
    (void)ops3;
    for (;;) {
        while (L->pos < L->n && is_space(L->s[L->pos])) {
            L->line += L->s[L->pos] == '\n';
            L->pos++;
        }
        if (L->pos >= L->n)
            return kiln_errf(L->err, L->errlen, "template line %d: unexpected end of template inside a tag (missing '%c}')",
                             L->line, end);
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        if (!depth) {
            int strip = 0, plus = 0;
            size_t k = 0;
            if (p[0] == '-') strip = 1, k = 1;
            else if (p[0] == '+' && end == '%') plus = 1, k = 1;
            if (left >= k + 2 && p[k] == end && p[k + 1] == '}') {
                push(L, end_type, NULL, 0);
                L->pos += k + 2;
                if (strip) {
                    while (L->pos < L->n && is_space(L->s[L->pos])) L->line += L->s[L->pos++] == '\n';
                } else if (end == '%' && !plus && L->pos < L->n && L->s[L->pos] == '\n') { /* trim_blocks */
                    L->pos++;
                    L->line++;
                }
                return 0;
            }
        }
        char c = p[0];
        if (c == '\'' || c == '"') {
            if (lex_string(L)) return -1;
            continue;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t k = 1;
            while (k < left && ((p[k] >= 'a' && p[k] <= 'z') || (p[k] >= 'A' && p[k] <= 'Z') || p[k] == '_' ||
                                (p[k] >= '0' && p[k] <= '9')))
                k++;
            push(L, JT_NAME, p, k);
            L->pos += k;
            continue;
        }
        if (c >= '0' && c <= '9') {
            size_t k = 0;
            int is_float = 0;
            char num[64];
            size_t m = 0;
            while (k < left && ((p[k] >= '0' && p[k] <= '9') || p[k] == '_')) {
                if (p[k] != '_' && m < 60) num[m++] = p[k];
                k++;
            }
            if (k + 1 < left && p[k] == '.' && p[k + 1] >= '0' && p[k + 1] <= '9') {
                is_float = 1;
                num[m++] = p[k++];
                while (k < left && ((p[k] >= '0' && p[k] <= '9') || p[k] == '_')) {
                    if (p[k] != '_' && m < 60) num[m++] = p[k];
                    k++;
                }
            }
            if (k < left && (p[k] == 'e' || p[k] == 'E')) {
                size_t e = k + 1;
                if (e < left && (p[e] == '+' || p[e] == '-')) e++;
                if (e < left && p[e] >= '0' && p[e] <= '9') {
                    is_float = 1;
                    while (k < e && m < 60) num[m++] = p[k++];
                    while (k < left && p[k] >= '0' && p[k] <= '9') {
                        if (m < 60) num[m++] = p[k];
                        k++;
                    }
                }
            }
            num[m] = 0;
            struct jtok *t = push(L, is_float ? JT_FLOAT : JT_INT, p, k);
            if (is_float) t->f = strtod(num, NULL);
            else t->i = strtoll(num, NULL, 10);
            L->pos += k;
            continue;
        }
        int matched = 0;
        for (int i = 0; ops2[i]; i++)
            if (left >= 2 && !memcmp(p, ops2[i], 2)) {
                push(L, JT_OP, ops2[i], 2);
                L->pos += 2;
                matched = 1;
                break;
            }
        if (matched) continue;
        if (strchr(ops1, c)) {
            if (c == '(' || c == '[' || c == '{') depth++;
            if (c == ')' || c == ']' || c == '}') {
                if (!depth) return kiln_errf(L->err, L->errlen, "template line %d: unexpected '%c'", L->line, c);
                depth--;
            }
            push(L, JT_OP, p, 1);
            L->pos++;
            continue;
        }
        return kiln_errf(L->err, L->errlen, "template line %d: unexpected character '%c' inside a tag", L->line, c);
    }
}

/* "{% raw %}" ... "{% endraw %}": the text in between is data */
static int lex_raw(struct lexer *L) {
    size_t i = L->pos;
    for (;;) {
        const char *q = strstr(L->s + i, "{%");
        if (!q) return kiln_errf(L->err, L->errlen, "template line %d: missing {%% endraw %%}", L->line);
        size_t j = (size_t)(q - L->s) + 2;
        int strip_before = L->s[j] == '-';
        if (L->s[j] == '-' || L->s[j] == '+') j++;
        while (j < L->n && is_space(L->s[j])) j++;
        if (L->n - j >= 6 && !memcmp(L->s + j, "endraw", 6)) {
            size_t text_end = (size_t)(q - L->s), k = j + 6;
            while (k < L->n && is_space(L->s[k])) k++;
            int strip_after = 0;
            if (L->s[k] == '-') strip_after = 1, k++;
            else if (L->s[k] == '+') k++;
            if (L->s[k] != '%' || L->s[k + 1] != '}') return kiln_errf(L->err, L->errlen, "template line %d: bad endraw tag", L->line);
            k += 2;
            size_t te = text_end;
            if (strip_before)
                while (te > L->pos && is_space(L->s[te - 1])) te--;
            if (te > L->pos) push(L, JT_TEXT, L->s + L->pos, te - L->pos);
            if (strip_after) while (k < L->n && is_space(L->s[k])) k++;
            else if (L->s[k] == '\n') k++;
            count_lines(L, L->pos, k);
            L->pos = k;
            return 0;
        }
        i = j;
    }
}

static int lex_source(struct lexer *L) {
    while (L->pos < L->n) {
        const char *s = L->s;
        size_t text_start = L->pos, tag = L->pos;
        char kind = 0;
        for (; tag + 1 < L->n; tag++)
            if (s[tag] == '{' && (s[tag + 1] == '{' || s[tag + 1] == '%' || s[tag + 1] == '#')) {
                kind = s[tag + 1];
                break;
            }
        if (!kind) {
            push(L, JT_TEXT, s + text_start, L->n - text_start);
            count_lines(L, text_start, L->n);
            L->pos = L->n;
            return 0;
        }
        char sign = tag + 2 < L->n ? s[tag + 2] : 0;
        size_t text_end = tag;
        if (sign == '-') {
            while (text_end > text_start && is_space(s[text_end - 1])) text_end--;
        } else if (sign != '+' && kind != '{') { /* lstrip_blocks */
            size_t l = text_end;
            while (l > text_start && (s[l - 1] == ' ' || s[l - 1] == '\t' || s[l - 1] == '\r' || s[l - 1] == '\f' ||
                                      s[l - 1] == '\v'))
                l--;
            int at_line_start = l == 0 || s[l - 1] == '\n';
            if (at_line_start && l < text_end) text_end = l;
        }
        if (text_end > text_start) push(L, JT_TEXT, s + text_start, text_end - text_start);
        count_lines(L, text_start, tag);
        L->pos = tag + 2 + (sign == '-' || sign == '+');
        if (kind == '#') {
            const char *e = strstr(s + L->pos, "#}");
            if (!e) return kiln_errf(L->err, L->errlen, "template line %d: missing end of comment tag", L->line);
            size_t end = (size_t)(e - s) + 2;
            int strip = e > s + L->pos && e[-1] == '-';
            int plus = e > s + L->pos && e[-1] == '+';
            count_lines(L, L->pos, end);
            if (strip) while (end < L->n && is_space(s[end])) L->line += s[end++] == '\n';
            else if (!plus && end < L->n && s[end] == '\n') end++, L->line++;
            L->pos = end;
            continue;
        }
        if (kind == '%') { /* raw? */
            size_t k = L->pos;
            while (k < L->n && is_space(s[k])) k++;
            if (L->n - k >= 3 && !memcmp(s + k, "raw", 3) && (k + 3 >= L->n || !((s[k + 3] | 0x20) >= 'a' && (s[k + 3] | 0x20) <= 'z') )) {
                k += 3;
                while (k < L->n && is_space(s[k])) k++;
                int strip = s[k] == '-';
                if (strip) k++;
                if (k + 1 >= L->n || s[k] != '%' || s[k + 1] != '}') return kiln_errf(L->err, L->errlen, "template line %d: bad raw tag", L->line);
                k += 2;
                if (strip) while (k < L->n && is_space(s[k])) k++;
                count_lines(L, L->pos, k);
                L->pos = k;
                if (lex_raw(L)) return -1;
                continue;
            }
        }
        push(L, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, NULL, 0);
        if (lex_tag(L, kind == '{' ? '}' : '%', kind == '{' ? JT_VAR_END : JT_BLOCK_END)) return -1;
    }
    return 0;
}

int jinja_lex(const char *src, size_t len, struct jarena *a, struct jtok **toks, int *n_toks, char *err, size_t errlen) {
    /* newline_sequence "\n" and keep_trailing_newline=False */
    char *s = jarena_alloc(a, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else s[n++] = src[i];
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    struct lexer L = {.s = s, .n = n, .line = 1, .a = a, .err = err, .errlen = errlen};
    if (lex_source(&L)) {
        free(L.toks);
        return -1;
    }
    push(&L, JT_EOF, NULL, 0);
    /* move the tokens into the arena so the template owns them */
    *toks = jarena_alloc(a, (size_t)L.n_toks * sizeof **toks);
    memcpy(*toks, L.toks, (size_t)L.n_toks * sizeof **toks);
    *n_toks = L.n_toks;
    free(L.toks);
    return 0;
}
