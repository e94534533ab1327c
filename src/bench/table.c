/* table.c: see table.h. */
#include "bench/table.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

void bt_init(struct bt_table *t, const char *profile, const char *title, enum bt_spread spread) {
    memset(t, 0, sizeof *t);
    t->profile = kiln_strdup(profile);
    t->title = kiln_strdup(title ? title : profile);
    t->spread = spread;
}

void bt_free(struct bt_table *t) {
    for (int r = 0; r < t->n_rows; r++)
        for (int c = 0; c < t->n_cols; c++) free(t->cells[(size_t)r * BT_MAX_COLS + c].s);
    free(t->cells);
    for (int i = 0; i < t->n_meta; i++) free(t->meta[i].k), free(t->meta[i].v);
    for (int i = 0; i < t->n_notes; i++) free(t->notes[i]);
    for (int i = 0; i < t->n_footer; i++) free(t->footer[i]);
    for (int i = 0; i < t->n_summary; i++) free(t->summary[i].k);
    free(t->meta), free(t->notes), free(t->footer), free(t->summary);
    free(t->profile), free(t->title);
    memset(t, 0, sizeof *t);
}

static void copy_str(char *dst, size_t cap, const char *s) {
    snprintf(dst, cap, "%s", s);
}

int bt_col(struct bt_table *t, const char *name, const char *key, enum bt_kind kind, int prec, int ranged) {
    KILN_CHECK(t->n_cols < BT_MAX_COLS && t->n_rows == 0);
    struct bt_col *c = &t->cols[t->n_cols];
    copy_str(c->name, sizeof c->name, name);
    copy_str(c->key, sizeof c->key, key);
    c->kind = kind;
    c->prec = prec;
    c->ranged = ranged && kind == BT_NUM && t->spread != BT_SPREAD_NONE;
    return t->n_cols++;
}

int bt_find(const struct bt_table *t, const char *key) {
    for (int i = 0; i < t->n_cols; i++)
        if (!strcmp(t->cols[i].key, key)) return i;
    return -1;
}

int bt_row(struct bt_table *t) {
    if (t->n_rows == t->cap_rows) {
        t->cap_rows = t->cap_rows ? t->cap_rows * 2 : 16;
        t->cells = kiln_realloc(t->cells, sizeof *t->cells * BT_MAX_COLS * (size_t)t->cap_rows);
    }
    memset(&t->cells[(size_t)t->n_rows * BT_MAX_COLS], 0, sizeof *t->cells * BT_MAX_COLS);
    return t->n_rows++;
}

struct bt_cell *bt_cell(struct bt_table *t, int row, int col) {
    KILN_CHECK(row >= 0 && row < t->n_rows && col >= 0 && col < t->n_cols);
    return &t->cells[(size_t)row * BT_MAX_COLS + col];
}

static const struct bt_cell *cell_c(const struct bt_table *t, int row, int col) {
    return &t->cells[(size_t)row * BT_MAX_COLS + col];
}

void bt_set_str(struct bt_table *t, int row, int col, const char *s) {
    struct bt_cell *c = bt_cell(t, row, col);
    free(c->s);
    c->s = kiln_strdup(s ? s : "");
    c->set = 1;
}

void bt_set_num(struct bt_table *t, int row, int col, double v) {
    struct bt_cell *c = bt_cell(t, row, col);
    c->v = v;
    c->sd = NAN;
    c->lo = c->hi = NAN;
    c->set = !isnan(v);
}

void bt_set_range(struct bt_table *t, int row, int col, double v, double sd, double lo, double hi) {
    struct bt_cell *c = bt_cell(t, row, col);
    c->v = v;
    c->sd = sd;
    c->lo = lo;
    c->hi = hi;
    c->set = !isnan(v);
}

static char *vfmt(const char *fmt, va_list ap) {
    if (!fmt) return kiln_strdup("");
    va_list aq;
    va_copy(aq, ap);
    char one[1];
    int n = vsnprintf(one, sizeof one, fmt, aq);
    va_end(aq);
    char *s = kiln_malloc((size_t)n + 1);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

void bt_meta(struct bt_table *t, const char *k, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *v = vfmt(fmt, ap);
    va_end(ap);
    for (int i = 0; i < t->n_meta; i++)
        if (!strcmp(t->meta[i].k, k)) {
            free(t->meta[i].v);
            t->meta[i].v = v;
            return;
        }
    t->meta = kiln_realloc(t->meta, sizeof *t->meta * (size_t)(t->n_meta + 1));
    t->meta[t->n_meta].k = kiln_strdup(k);
    t->meta[t->n_meta++].v = v;
}

void bt_note(struct bt_table *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    t->notes = kiln_realloc(t->notes, sizeof *t->notes * (size_t)(t->n_notes + 1));
    t->notes[t->n_notes++] = vfmt(fmt, ap);
    va_end(ap);
}

void bt_footer(struct bt_table *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    t->footer = kiln_realloc(t->footer, sizeof *t->footer * (size_t)(t->n_footer + 1));
    t->footer[t->n_footer++] = vfmt(fmt, ap);
    va_end(ap);
}

void bt_summary(struct bt_table *t, const char *k, double v) {
    t->summary = kiln_realloc(t->summary, sizeof *t->summary * (size_t)(t->n_summary + 1));
    t->summary[t->n_summary].k = kiln_strdup(k);
    t->summary[t->n_summary++].v = v;
}

int bt_parse_format(const char *s, enum bt_format *f) {
    if (!strcmp(s, "md")) *f = BT_MD;
    else if (!strcmp(s, "csv")) *f = BT_CSV;
    else if (!strcmp(s, "json")) *f = BT_JSON;
    else return -1;
    return 0;
}

void bt_write(const struct bt_table *t, enum bt_format f, FILE *out) {
    if (f == BT_CSV) bt_write_csv(t, out);
    else if (f == BT_JSON) bt_write_json(t, out);
    else bt_write_md(t, out);
}

/* a number as the column shows it; "" when missing */
static void fmt_num(char *buf, size_t cap, const struct bt_col *c, double v) {
    if (isnan(v)) snprintf(buf, cap, "%s", "");
    else if (isinf(v)) snprintf(buf, cap, "%s", v > 0 ? "inf" : "-inf");
    else if (c->kind == BT_INT || (c->prec < 0 && v == floor(v) && fabs(v) < 1e15)) snprintf(buf, cap, "%.0f", v);
    else if (c->prec < 0) snprintf(buf, cap, "%.2f", v);
    else snprintf(buf, cap, "%.*f", c->prec, v);
}

static void md_cell(char *buf, size_t cap, const struct bt_table *t, int r, int ci) {
    const struct bt_col *c = &t->cols[ci];
    const struct bt_cell *x = cell_c(t, r, ci);
    if (!x->set) {
        snprintf(buf, cap, "-");
        return;
    }
    if (c->kind == BT_STR) {
        snprintf(buf, cap, "%s", x->s ? x->s : "");
        return;
    }
    char a[64], b[64];
    fmt_num(a, sizeof a, c, x->v);
    if (c->ranged && t->spread == BT_SPREAD_SD && !isnan(x->sd)) {
        fmt_num(b, sizeof b, c, x->sd);
        snprintf(buf, cap, "%s ± %s", a, b);
    } else if (c->ranged && t->spread == BT_SPREAD_MINMAX && x->hi > x->lo) {
        fmt_num(b, sizeof b, c, (x->hi - x->lo) / 2);
        snprintf(buf, cap, "%s ± %s", a, b);
    } else {
        snprintf(buf, cap, "%s", a);
    }
}

void bt_write_md(const struct bt_table *t, FILE *out) {
    if (t->title && *t->title) fprintf(out, "### %s\n\n", t->title);
    for (int i = 0; i < t->n_meta; i++) fprintf(out, "- %s: %s\n", t->meta[i].k, t->meta[i].v);
    if (t->n_meta) fputc('\n', out);
    /* column widths for a readable plain-text table */
    int w[BT_MAX_COLS];
    char buf[256];
    for (int c = 0; c < t->n_cols; c++) {
        w[c] = (int)strlen(t->cols[c].name);
        for (int r = 0; r < t->n_rows; r++) {
            md_cell(buf, sizeof buf, t, r, c);
            int n = (int)strlen(buf);
            if (strstr(buf, "±")) n -= 1; /* two bytes, one column */
            if (n > w[c]) w[c] = n;
        }
    }
    fputc('|', out);
    for (int c = 0; c < t->n_cols; c++) fprintf(out, " %-*s |", w[c], t->cols[c].name);
    fputc('\n', out);
    fputc('|', out);
    for (int c = 0; c < t->n_cols; c++) {
        fputc(' ', out);
        for (int k = 0; k < w[c] - 1; k++) fputc('-', out);
        fputc(t->cols[c].kind == BT_STR ? '-' : ':', out);
        fputs(" |", out);
    }
    fputc('\n', out);
    for (int r = 0; r < t->n_rows; r++) {
        fputc('|', out);
        for (int c = 0; c < t->n_cols; c++) {
            md_cell(buf, sizeof buf, t, r, c);
            int pad = w[c] + (strstr(buf, "±") ? 1 : 0);
            if (t->cols[c].kind == BT_STR) fprintf(out, " %-*s |", pad, buf);
            else fprintf(out, " %*s |", pad, buf);
        }
        fputc('\n', out);
    }
    if (t->n_notes) {
        fputc('\n', out);
        for (int i = 0; i < t->n_notes; i++) fprintf(out, "- note: %s\n", t->notes[i]);
    }
    if (t->n_footer) {
        fputc('\n', out);
        for (int i = 0; i < t->n_footer; i++) fprintf(out, "%s\n", t->footer[i]);
    }
}

static void csv_field(FILE *out, const char *s) {
    if (strpbrk(s, ",\"\n\r")) {
        fputc('"', out);
        for (const char *p = s; *p; p++) {
            if (*p == '"') fputc('"', out);
            fputc(*p, out);
        }
        fputc('"', out);
    } else {
        fputs(s, out);
    }
}

void bt_write_csv(const struct bt_table *t, FILE *out) {
    char buf[256];
    int first = 1;
    for (int c = 0; c < t->n_cols; c++) {
        const struct bt_col *col = &t->cols[c];
        if (!first) fputc(',', out);
        first = 0;
        csv_field(out, col->name);
        if (col->ranged && t->spread == BT_SPREAD_SD) {
            snprintf(buf, sizeof buf, "%s sd", col->name);
            fputc(',', out), csv_field(out, buf);
        } else if (col->ranged) {
            snprintf(buf, sizeof buf, "%s min", col->name);
            fputc(',', out), csv_field(out, buf);
            snprintf(buf, sizeof buf, "%s max", col->name);
            fputc(',', out), csv_field(out, buf);
        }
    }
    fputc('\n', out);
    for (int r = 0; r < t->n_rows; r++) {
        for (int c = 0; c < t->n_cols; c++) {
            const struct bt_col *col = &t->cols[c];
            const struct bt_cell *x = cell_c(t, r, c);
            if (c) fputc(',', out);
            if (col->kind == BT_STR) {
                csv_field(out, x->set && x->s ? x->s : "");
                continue;
            }
            fmt_num(buf, sizeof buf, col, x->set ? x->v : NAN);
            fputs(buf, out);
            if (col->ranged && t->spread == BT_SPREAD_SD) {
                fmt_num(buf, sizeof buf, col, x->set ? x->sd : NAN);
                fputc(',', out), fputs(buf, out);
            } else if (col->ranged) {
                fmt_num(buf, sizeof buf, col, x->set ? x->lo : NAN);
                fputc(',', out), fputs(buf, out);
                fmt_num(buf, sizeof buf, col, x->set ? x->hi : NAN);
                fputc(',', out), fputs(buf, out);
            }
        }
        fputc('\n', out);
    }
}

void bt_json_str(FILE *out, const char *s) {
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", out);
        else if (*p == '\t') fputs("\\t", out);
        else if (*p < 0x20) fprintf(out, "\\u%04x", *p);
        else fputc(*p, out);
    }
    fputc('"', out);
}

static void json_num(FILE *out, double v, int prec) {
    if (isnan(v) || isinf(v)) fputs("null", out);
    else if (prec < 0) fprintf(out, "%.10g", v);
    else fprintf(out, "%.*f", prec, v);
}

void bt_write_json(const struct bt_table *t, FILE *out) {
    fprintf(out, "{\n  \"kiln_bench\": 1,\n  \"profile\": ");
    bt_json_str(out, t->profile);
    fprintf(out, ",\n  \"title\": ");
    bt_json_str(out, t->title);
    fprintf(out, ",\n  \"meta\": {");
    for (int i = 0; i < t->n_meta; i++) {
        fprintf(out, "%s\n    ", i ? "," : "");
        bt_json_str(out, t->meta[i].k);
        fputs(": ", out);
        bt_json_str(out, t->meta[i].v);
    }
    fprintf(out, "%s},\n", t->n_meta ? "\n  " : "");
    for (int i = 0; i < t->n_summary; i++) {
        fputs("  ", out);
        bt_json_str(out, t->summary[i].k);
        fputs(": ", out);
        json_num(out, t->summary[i].v, 3);
        fputs(",\n", out);
    }
    fprintf(out, "  \"columns\": [");
    for (int c = 0; c < t->n_cols; c++) {
        fprintf(out, "%s{\"name\": ", c ? ", " : "");
        bt_json_str(out, t->cols[c].name);
        fputs(", \"key\": ", out);
        bt_json_str(out, t->cols[c].key);
        fputc('}', out);
    }
    fprintf(out, "],\n  \"rows\": [");
    for (int r = 0; r < t->n_rows; r++) {
        fprintf(out, "%s\n    {", r ? "," : "");
        for (int c = 0; c < t->n_cols; c++) {
            const struct bt_col *col = &t->cols[c];
            const struct bt_cell *x = cell_c(t, r, c);
            if (c) fputs(", ", out);
            bt_json_str(out, col->key);
            fputs(": ", out);
            if (col->kind == BT_STR) {
                if (x->set) bt_json_str(out, x->s);
                else fputs("null", out);
                continue;
            }
            int prec = col->kind == BT_INT ? 0 : col->prec < 0 ? -1 : col->prec + 2;
            json_num(out, x->set ? x->v : NAN, prec);
            if (col->ranged && t->spread == BT_SPREAD_SD) {
                fprintf(out, ", \"%s_sd\": ", col->key);
                json_num(out, x->set ? x->sd : NAN, prec);
            } else if (col->ranged) {
                fprintf(out, ", \"%s_min\": ", col->key);
                json_num(out, x->set ? x->lo : NAN, prec);
                fprintf(out, ", \"%s_max\": ", col->key);
                json_num(out, x->set ? x->hi : NAN, prec);
            }
        }
        fputc('}', out);
    }
    fprintf(out, "%s],\n  \"notes\": [", t->n_rows ? "\n  " : "");
    for (int i = 0; i < t->n_notes; i++) {
        fputs(i ? ",\n    " : "\n    ", out);
        bt_json_str(out, t->notes[i]);
    }
    fprintf(out, "%s],\n  \"definitions\": [", t->n_notes ? "\n  " : "");
    for (int i = 0; i < t->n_footer; i++) {
        fputs(i ? ",\n    " : "\n    ", out);
        bt_json_str(out, t->footer[i]);
    }
    fprintf(out, "%s]\n}\n", t->n_footer ? "\n  " : "");
}
