/* misc.c: the progress line, peak memory and the date for `kiln bench`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"

void bench_fmt_dur(char *buf, size_t cap, double s) {
    if (isnan(s) || s < 0) {
        snprintf(buf, cap, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

void bench_progress_start(struct bench_progress *p, int on, int n_rows, double total_weight, double now) {
    memset(p, 0, sizeof *p);
    p->on = on;
    p->n_rows = n_rows;
    p->total_w = total_weight;
    p->t0 = now;
    p->tty = isatty(2);
}

/* the estimate: elapsed time scaled by the share of the work (weighted by
 * tokens) still to do; unknown until the first row ends */
void bench_progress_row(struct bench_progress *p, int row, const char *what, double now) {
    if (!p->on) return;
    char el[32], eta[32], line[256];
    double elapsed = now - p->t0;
    bench_fmt_dur(el, sizeof el, elapsed);
    if (p->done_w > 0 && p->total_w > p->done_w) bench_fmt_dur(eta, sizeof eta, elapsed * (p->total_w - p->done_w) / p->done_w);
    else snprintf(eta, sizeof eta, "?");
    int n = snprintf(line, sizeof line, "[bench] row %d/%d %s | elapsed %s | remaining ~%s", row, p->n_rows, what, el, eta);
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    if (!p->tty) {
        fprintf(stderr, "%s\n", line); /* a log file gets lines */
        return;
    }
    fprintf(stderr, "\r%s%*s", line, p->last_len > n ? p->last_len - n : 0, "");
    fflush(stderr);
    p->last_len = n;
}

void bench_progress_done(struct bench_progress *p, double weight, double now) {
    (void)now;
    p->done_w += weight;
}

void bench_progress_end(struct bench_progress *p) {
    if (p->on && p->last_len) fprintf(stderr, "\r%*s\r", p->last_len, "");
    p->last_len = 0;
}

void bench_mem_reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return;
    fputs("5", f);
    fclose(f);
}

double bench_mem_peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return NAN;
    char line[256];
    double v = NAN;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) {
            v = strtod(line + 6, NULL) * 1024.0; /* kB */
            break;
        }
    fclose(f);
    return v;
}

void bench_date(char *buf, size_t cap) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(buf, cap, "%Y-%m-%d %H:%M UTC", &tm);
}
