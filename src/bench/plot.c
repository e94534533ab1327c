/* plot.c: see plot.h. Two panels side by side, one shared legend. */
#include "bench/plot.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "bench/table.h"

#define MAX_SERIES 64
#define MAX_PTS 256

struct series {
    char label[200];
    int n_dec, n_ttft;
    double dx[MAX_PTS], dy[MAX_PTS], tx[MAX_PTS], ty[MAX_PTS];
};

static const char *palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static struct series *get_series(struct series *s, int *n, const char *label) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(s[i].label, label)) return &s[i];
    if (*n == MAX_SERIES) return NULL;
    memset(&s[*n], 0, sizeof s[*n]);
    snprintf(s[*n].label, sizeof s[*n].label, "%s", label);
    return &s[(*n)++];
}

static void add_pt(double *xs, double *ys, int *n, double x, double y) {
    if (isnan(x) || isnan(y) || x <= 0 || *n == MAX_PTS) return;
    int i = *n;
    while (i > 0 && xs[i - 1] > x) xs[i] = xs[i - 1], ys[i] = ys[i - 1], i--;
    xs[i] = x, ys[i] = y;
    (*n)++;
}

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

/* a "nice" upper bound and tick step for [0, max] */
static double nice_step(double max, int ticks) {
    if (!(max > 0)) return 1;
    double raw = max / ticks, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
}

static void fmt_tick(char *b, size_t cap, double v) {
    if (v >= 1e6) snprintf(b, cap, "%gM", v / 1e6);
    else if (v >= 1e4) snprintf(b, cap, "%gk", v / 1e3);
    else snprintf(b, cap, "%g", v);
}

static void panel(FILE *f, const struct series *s, int ns, int which, double ox, double oy, double w, double h, double xmin,
                  double xmax, const char *ylab) {
    double ymax = 0;
    for (int i = 0; i < ns; i++) {
        int n = which ? s[i].n_ttft : s[i].n_dec;
        const double *ys = which ? s[i].ty : s[i].dy;
        for (int k = 0; k < n; k++)
            if (ys[k] > ymax) ymax = ys[k];
    }
    double step = nice_step(ymax * 1.05, 5), ytop = ceil(ymax * 1.05 / step) * step;
    if (!(ytop > 0)) ytop = 1;
    double lx0 = log2(xmin), lx1 = log2(xmax);
    if (lx1 - lx0 < 1) lx0 -= 0.5, lx1 += 0.5;
    lx0 -= 0.15, lx1 += 0.15; /* keep points off the frame */
#define PX(x) (ox + (log2(x) - lx0) / (lx1 - lx0) * w)
#define PY(y) (oy + h - (y) / ytop * h)
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n", ox, oy, w, h);
    char b[32];
    for (double y = 0; y <= ytop * 1.0001; y += step) {
        fmt_tick(b, sizeof b, y);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>", ox, PY(y), ox + w, PY(y));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%s</text>\n", ox - 4, PY(y) + 4, b);
    }
    for (double e = ceil(lx0); e <= floor(lx1); e += (lx1 - lx0 > 12 ? 2 : 1)) {
        double x = pow(2, e);
        fmt_tick(b, sizeof b, x);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>", PX(x), oy, PX(x), oy + h);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\">%s</text>\n", PX(x), oy + h + 15, b);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\">input tokens (log scale)</text>\n", ox + w / 2,
            oy + h + 32);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">%s</text>\n", ox + w / 2,
            oy - 8, ylab);
    for (int i = 0; i < ns; i++) {
        int n = which ? s[i].n_ttft : s[i].n_dec;
        const double *xs = which ? s[i].tx : s[i].dx, *ys = which ? s[i].ty : s[i].dy;
        if (!n) continue;
        const char *col = palette[i % (int)(sizeof palette / sizeof *palette)];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", col, i >= 10 ? " stroke-dasharray=\"5,3\"" : "");
        for (int k = 0; k < n; k++) fprintf(f, "%s%.1f,%.1f", k ? " " : "", PX(xs[k]), PY(ys[k]));
        fputs("\"/>\n", f);
        for (int k = 0; k < n; k++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>%g tokens: %.4g</title></circle>\n", PX(xs[k]),
                    PY(ys[k]), col, xs[k], ys[k]);
    }
#undef PX
#undef PY
}

int bench_plot_svg(const char *const *texts, const char *const *labels, int n, const char *title, FILE *out, char *err,
                   size_t errlen) {
    struct series *s = kiln_calloc(MAX_SERIES, sizeof *s);
    int ns = 0;
    for (int i = 0; i < n; i++) {
        cJSON *j = cJSON_Parse(texts[i]);
        if (!j) {
            free(s);
            return kiln_errf(err, errlen, "result %d is not JSON", i + 1);
        }
        const cJSON *meta = cJSON_GetObjectItemCaseSensitive(j, "meta");
        const char *prof = str(j, "profile");
        char base[160];
        if (labels && labels[i]) snprintf(base, sizeof base, "%s", labels[i]);
        else if (str(meta, "label")) snprintf(base, sizeof base, "%s", str(meta, "label"));
        else
            snprintf(base, sizeof base, "%s %s %s", str(meta, "model") ? str(meta, "model") : "?",
                     str(meta, "precision") ? str(meta, "precision") : "", str(meta, "backend") ? str(meta, "backend") : "");
        const cJSON *rows = cJSON_GetObjectItemCaseSensitive(j, "rows"), *r;
        cJSON_ArrayForEach(r, rows) {
            char lab[200];
            double x = num(r, "input_tokens"), dec = num(r, "decode_tps"), ttft = num(r, "ttft_ms");
            const char *test = str(r, "test");
            if (prof && !strcmp(prof, "pp-tg") && test) { /* llama-bench rows: TTFT of each pp */
                if (strncmp(test, "pp", 2)) continue;
                x = atof(test + 2), dec = NAN;
                snprintf(lab, sizeof lab, "%s", base);
            } else if (prof && !strcmp(prof, "prefix")) {
                snprintf(lab, sizeof lab, "%s, %s", base, num(r, "prefix_tokens") > 0 ? "cached prefix" : "no prefix");
            } else if (prof && !strcmp(prof, "batch")) {
                snprintf(lab, sizeof lab, "%s, batch %g", base, num(r, "batch"));
            } else {
                snprintf(lab, sizeof lab, "%s", base);
            }
            struct series *se = get_series(s, &ns, lab);
            if (!se) continue;
            add_pt(se->dx, se->dy, &se->n_dec, x, dec);
            add_pt(se->tx, se->ty, &se->n_ttft, x, ttft);
        }
        cJSON_Delete(j);
    }
    double xmin = INFINITY, xmax = 0;
    for (int i = 0; i < ns; i++) {
        for (int k = 0; k < s[i].n_dec; k++) xmin = fmin(xmin, s[i].dx[k]), xmax = fmax(xmax, s[i].dx[k]);
        for (int k = 0; k < s[i].n_ttft; k++) xmin = fmin(xmin, s[i].tx[k]), xmax = fmax(xmax, s[i].tx[k]);
    }
    if (!(xmax > 0)) {
        free(s);
        return kiln_errf(err, errlen, "nothing to plot: no rows with input_tokens and decode_tps or ttft_ms");
    }
    const double W = 1000, ph = 320, top = 60, legend_y = top + ph + 60;
    double H = legend_y + 20 * ns + 20;
    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                 "font-family=\"sans-serif\">\n", W, H, W, H);
    fprintf(out, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(out, "<text x=\"%.0f\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">", W / 2);
    xml_text(out, title ? title : "kiln bench");
    fputs("</text>\n", out);
    panel(out, s, ns, 0, 70, top, 400, ph, xmin, xmax, "decode tok/s (higher is better)");
    panel(out, s, ns, 1, 570, top, 400, ph, xmin, xmax, "TTFT ms (lower is better)");
    for (int i = 0; i < ns; i++) {
        const char *col = palette[i % (int)(sizeof palette / sizeof *palette)];
        double y = legend_y + 20 * i;
        fprintf(out, "<line x1=\"70\" y1=\"%.1f\" x2=\"100\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>", y, y, col,
                i >= 10 ? " stroke-dasharray=\"5,3\"" : "");
        fprintf(out, "<text x=\"108\" y=\"%.1f\" font-size=\"12\">", y + 4);
        xml_text(out, s[i].label);
        fputs("</text>\n", out);
    }
    fputs("</svg>\n", out);
    free(s);
    return 0;
}
