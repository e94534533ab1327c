/*
 * inproc.h: `kiln bench` on the engine in this process (kiln.h only).
 */
#ifndef KILN_BENCH_INPROC_H
#define KILN_BENCH_INPROC_H

#include "bench/bench.h"
#include "kiln.h"

/* A target that runs jobs on e: prompts of random token ids, greedy decode.
 * max_tokens is the engine's KV budget, chunk its prefill chunk. */
void bench_inproc_target(struct bench_target *t, kiln_engine *e, int max_tokens, int chunk);
void bench_inproc_free(struct bench_target *t);

struct bench_pptg_opts {
    const int *pp, *tg; /* -p and -n lists (0 entries are skipped) */
    int n_pp, n_tg;
    const int *depth; /* -d list: each test after that many cached tokens (NULL: 0 only) */
    int n_depth;
    int reps, warmup;
    uint64_t seed;
    struct bench_labels lab;
    const char *size_str, *params_str; /* "1.11 GiB", "0.60 B" */
    int progress;
    int roofline;        /* CPU: measure the memory bandwidth between windows of each tg repetition (bench_membw) */
    int roofline_mib;    /* its buffer (0: BENCH_MEMBW_MIB) */
    int roofline_window; /* decode steps per window (0: BENCH_ROOF_WINDOW) */
    int tg_batch;        /* --tg-batch: the tg tests decode this many sequences at once (0, 1: one, as llama-bench) */
};

/* --roofline splits a timed tg repetition into windows of this many steps
 * with a bandwidth probe before each and after the last (bench_roof_pair) */
#define BENCH_ROOF_WINDOW 16

/* The bandwidth a repetition's windows ran against: window w took t[w]
 * seconds between probes bw[w] and bw[w + 1] (GB/s), so it is held to their
 * mean, and the repetition to the time-weighted mean over its nw windows
 * (returned; *max gets the highest of the nw + 1 probes). With bytes read
 * per window B[w], B / (t x that figure) is the share of what a plain read
 * would have moved in the same seconds. -1 when nothing was timed. */
double bench_roof_pair(const double *t, const double *bw, int nw, double *max);

/* llama-bench's pp and tg tests: table with model | size | params | backend
 * | threads | test | t/s (mean ± sd) plus TTFT, GB/s and peak memory. */
int bench_pptg(kiln_engine *e, const struct bench_pptg_opts *o, struct bt_table *t, char *err, size_t errlen);

#endif
