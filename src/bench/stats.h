/*
 * stats.h: the metric arithmetic of `kiln bench`, on timestamps only.
 *
 * Nothing here reads a clock: callers pass the times they took (seconds on
 * any monotonic clock), so tests drive it with made-up figures. The
 * definitions follow vLLM / SGLang bench_serving (docs/bench.md):
 *
 *   TTFT  = t_first - t_send            (time to the first token)
 *   E2E   = t_end - t_send              (whole request)
 *   TPOT  = (E2E - TTFT) / (n_out - 1)  (per token after the first; n_out > 1)
 *   ITL   = gaps between consecutive streamed chunks, pooled over requests
 *   prefill tok/s = new prompt tokens / TTFT
 *   decode tok/s  = batch / TPOT
 *   speed         = (prompt + generated tokens) / E2E     (Qwen's table)
 */
#ifndef KILN_BENCH_STATS_H
#define KILN_BENCH_STATS_H

#include <stddef.h>

/* summary of a sample; an empty sample gives n = 0 and NaN everywhere */
struct bench_stat {
    int n;
    double mean, sd, median, min, max, p90, p95, p99;
};

/* Percentile p in [0, 100] by linear interpolation between closest ranks
 * (numpy.percentile's default). xs need not be sorted; NaN if n == 0. */
double bench_percentile(const double *xs, int n, double p);
/* mean, sample standard deviation (n - 1; 0 for one value), median, ... */
struct bench_stat bench_stat_of(const double *xs, int n);

/* One request (or one in-process sequence) as the client saw it. */
struct bench_req_times {
    double t_send, t_first, t_end; /* t_first: first token (or chunk) */
    int n_in, n_out;               /* prompt tokens, generated tokens */
    const double *chunk_t;         /* arrival time of each streamed chunk, or NULL */
    int n_chunks;
    int ok;
};

double bench_ttft(const struct bench_req_times *r);
double bench_e2e(const struct bench_req_times *r);
/* NaN when n_out <= 1 (vLLM leaves those out of the TPOT statistics) */
double bench_tpot(const struct bench_req_times *r);

/* tokens / seconds, NaN when seconds <= 0 */
double bench_rate(double tokens, double seconds);

/* What sglang.bench_serving / vllm bench serve print for a run. */
struct bench_serving_summary {
    int completed, failed;
    double duration;               /* seconds, first send to last end */
    long long total_in, total_out; /* over completed requests */
    double req_tput, in_tput, out_tput, total_tput; /* per second */
    double concurrency;            /* sum of E2E / duration (SGLang) */
    struct bench_stat ttft, tpot, itl, e2e; /* in milliseconds */
};

/* Summarises n requests over a run of `duration` seconds. */
void bench_serving_summarize(const struct bench_req_times *r, int n, double duration, struct bench_serving_summary *s);

#endif
