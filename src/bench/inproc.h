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
    int roofline;     /* CPU: measure the memory bandwidth around each tg repetition (bench_membw) */
    int roofline_mib; /* its buffer (0: BENCH_MEMBW_MIB) */
};

/* llama-bench's pp and tg tests: table with model | size | params | backend
 * | threads | test | t/s (mean ± sd) plus TTFT, GB/s and peak memory. */
int bench_pptg(kiln_engine *e, const struct bench_pptg_opts *o, struct bt_table *t, char *err, size_t errlen);

#endif
