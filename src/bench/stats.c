/* stats.c: see stats.h. */
#include "bench/stats.h"

#include <math.h>
#include <stdlib.h>

#include "base/base.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct_sorted(const double *v, int n, double p) {
    if (n <= 0) return NAN;
    if (p <= 0) return v[0];
    if (p >= 100) return v[n - 1];
    double r = p / 100.0 * (n - 1);
    int lo = (int)floor(r);
    if (lo >= n - 1) return v[n - 1];
    double f = r - lo;
    return v[lo] + (v[lo + 1] - v[lo]) * f;
}

double bench_percentile(const double *xs, int n, double p) {
    if (n <= 0) return NAN;
    double *v = kiln_malloc(sizeof(double) * (size_t)n);
    memcpy(v, xs, sizeof(double) * (size_t)n);
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    double r = pct_sorted(v, n, p);
    free(v);
    return r;
}

struct bench_stat bench_stat_of(const double *xs, int n) {
    struct bench_stat s = {.n = 0, .mean = NAN, .sd = NAN, .median = NAN, .min = NAN, .max = NAN, .p90 = NAN, .p95 = NAN, .p99 = NAN};
    if (n <= 0) return s;
    double *v = kiln_malloc(sizeof(double) * (size_t)n);
    memcpy(v, xs, sizeof(double) * (size_t)n);
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    s.n = n;
    s.mean = sum / n;
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (v[i] - s.mean) * (v[i] - s.mean);
    s.sd = n > 1 ? sqrt(ss / (n - 1)) : 0.0;
    s.median = pct_sorted(v, n, 50);
    s.min = v[0];
    s.max = v[n - 1];
    s.p90 = pct_sorted(v, n, 90);
    s.p95 = pct_sorted(v, n, 95);
    s.p99 = pct_sorted(v, n, 99);
    free(v);
    return s;
}

double bench_ttft(const struct bench_req_times *r) { return r->t_first - r->t_send; }
double bench_e2e(const struct bench_req_times *r) { return r->t_end - r->t_send; }
double bench_tpot(const struct bench_req_times *r) {
    if (r->n_out <= 1) return NAN;
    return (bench_e2e(r) - bench_ttft(r)) / (r->n_out - 1);
}
double bench_rate(double tokens, double seconds) { return seconds > 0 ? tokens / seconds : NAN; }

void bench_serving_summarize(const struct bench_req_times *r, int n, double duration, struct bench_serving_summary *s) {
    memset(s, 0, sizeof *s);
    s->duration = duration;
    double *ttft = kiln_malloc(sizeof(double) * (size_t)(n + 1)), *tpot = kiln_malloc(sizeof(double) * (size_t)(n + 1));
    double *e2e = kiln_malloc(sizeof(double) * (size_t)(n + 1));
    int n_itl = 0, n_tpot = 0;
    for (int i = 0; i < n; i++)
        if (r[i].ok && r[i].n_chunks > 1) n_itl += r[i].n_chunks - 1;
    double *itl = kiln_malloc(sizeof(double) * (size_t)(n_itl + 1));
    n_itl = 0;
    double busy = 0;
    for (int i = 0; i < n; i++) {
        if (!r[i].ok) {
            s->failed++;
            continue;
        }
        int k = s->completed++;
        s->total_in += r[i].n_in;
        s->total_out += r[i].n_out;
        ttft[k] = bench_ttft(&r[i]) * 1e3;
        e2e[k] = bench_e2e(&r[i]) * 1e3;
        busy += bench_e2e(&r[i]);
        double t = bench_tpot(&r[i]);
        if (!isnan(t)) tpot[n_tpot++] = t * 1e3;
        for (int c = 1; c < r[i].n_chunks && r[i].chunk_t; c++) itl[n_itl++] = (r[i].chunk_t[c] - r[i].chunk_t[c - 1]) * 1e3;
    }
    s->req_tput = bench_rate(s->completed, duration);
    s->in_tput = bench_rate((double)s->total_in, duration);
    s->out_tput = bench_rate((double)s->total_out, duration);
    s->total_tput = bench_rate((double)(s->total_in + s->total_out), duration);
    s->concurrency = bench_rate(busy, duration);
    s->ttft = bench_stat_of(ttft, s->completed);
    s->e2e = bench_stat_of(e2e, s->completed);
    s->tpot = bench_stat_of(tpot, n_tpot);
    s->itl = bench_stat_of(itl, n_itl);
    free(ttft), free(tpot), free(e2e), free(itl);
}
