/*
 * table.h: one result table of `kiln bench` and its writers.
 *
 * A table has columns (a display name as in the published tables, and a
 * short key for CSV/JSON readers), rows of cells, metadata lines (model,
 * backend, date, ...), notes (skipped rows) and a footer (metric
 * definitions, what is timed). Numeric cells measured over repetitions
 * carry their spread: mean and standard deviation (pp-tg, as llama-bench)
 * or median, min and max (the published-table profiles).
 *
 *   md    a Markdown table with metadata above and notes + footer below
 *   csv   one header line of column names, then rows; a ranged column is
 *         followed by "NAME sd" or "NAME min" and "NAME max"; nothing else
 *   json  {"kiln_bench":1, "profile", "meta", "columns", "rows":[{key:
 *         value, key_sd | key_min, key_max}], "summary", "notes",
 *         "definitions"}; NaN is written as null
 */
#ifndef KILN_BENCH_TABLE_H
#define KILN_BENCH_TABLE_H

#include <stdio.h>

enum bt_kind { BT_STR, BT_INT, BT_NUM };
enum bt_spread { BT_SPREAD_NONE, BT_SPREAD_SD, BT_SPREAD_MINMAX };
enum bt_format { BT_MD, BT_CSV, BT_JSON };

#define BT_MAX_COLS 32

struct bt_col {
    char name[48]; /* display name: "TTFT(ms)" */
    char key[32];  /* json key: "ttft_ms" */
    enum bt_kind kind;
    int prec;   /* decimals for BT_NUM; -1: none for integral values, else 2 */
    int ranged; /* cells carry a spread */
};

struct bt_cell {
    int set;       /* 0: missing (md "-", csv empty, json null) */
    char *s;       /* BT_STR */
    double v;      /* value: mean or median */
    double sd;     /* BT_SPREAD_SD */
    double lo, hi; /* BT_SPREAD_MINMAX */
};

struct bt_kv {
    char *k, *v;
};

struct bt_num {
    char *k;
    double v;
};

struct bt_table {
    char *profile, *title;
    enum bt_spread spread;
    int n_cols;
    struct bt_col cols[BT_MAX_COLS];
    int n_rows, cap_rows;
    struct bt_cell *cells; /* [n_rows][n_cols] */
    int n_meta, n_notes, n_footer, n_summary;
    struct bt_kv *meta;
    char **notes, **footer;
    struct bt_num *summary; /* top-level JSON numbers ("pp512": 123.4) */
};

void bt_init(struct bt_table *t, const char *profile, const char *title, enum bt_spread spread);
void bt_free(struct bt_table *t);
/* adds a column; returns its index */
int bt_col(struct bt_table *t, const char *name, const char *key, enum bt_kind kind, int prec, int ranged);
/* index of the column with this key, or -1 */
int bt_find(const struct bt_table *t, const char *key);
/* appends an empty row; returns its index */
int bt_row(struct bt_table *t);
void bt_set_str(struct bt_table *t, int row, int col, const char *s);
void bt_set_num(struct bt_table *t, int row, int col, double v);
/* v with a spread: (sd) for BT_SPREAD_SD, (lo, hi) for BT_SPREAD_MINMAX */
void bt_set_range(struct bt_table *t, int row, int col, double v, double sd, double lo, double hi);
struct bt_cell *bt_cell(struct bt_table *t, int row, int col);
void bt_meta(struct bt_table *t, const char *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void bt_note(struct bt_table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void bt_footer(struct bt_table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void bt_summary(struct bt_table *t, const char *k, double v);

int bt_parse_format(const char *s, enum bt_format *f);
void bt_write(const struct bt_table *t, enum bt_format f, FILE *out);
void bt_write_md(const struct bt_table *t, FILE *out);
void bt_write_csv(const struct bt_table *t, FILE *out);
void bt_write_json(const struct bt_table *t, FILE *out);

/* JSON string literal of s (quotes and escapes) to out */
void bt_json_str(FILE *out, const char *s);

#endif
