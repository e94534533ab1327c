/*
 * bench.h: `kiln bench` profiles, shared by the in-process engine runner and
 * the HTTP client (`kiln bench serve`).
 *
 * A profile is a list of jobs (rows). A target runs one job and reports its
 * timestamps; the profile code turns repetitions of them into a table with
 * the published columns (src/bench/stats.h holds the arithmetic).
 *
 *   job: batch B sequences; each has n_prefix tokens already cached (put
 *        there untimed), then n_new prompt tokens and n_out generated ones,
 *        timed from the moment the n_new tokens are submitted.
 */
#ifndef KILN_BENCH_BENCH_H
#define KILN_BENCH_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "bench/table.h"

struct bench_job {
    int batch;
    int n_prefix; /* cached prefix tokens (untimed); the prefix profile's "Prefix(tokens)" */
    int n_new;    /* prompt tokens submitted at t_send */
    int n_out;    /* tokens to generate, >= 1 */
    uint64_t seed;
};

struct bench_obs {
    double t_send;   /* timing starts: the n_new tokens are submitted */
    double *t_first; /* [batch] first generated token of each sequence */
    double *t_end;   /* [batch] last generated token */
    int *n_out;      /* [batch] tokens generated (measured) */
    double peak_mem; /* bytes, NaN if unknown */
};

struct bench_target {
    const char *kind;   /* "in-process" or "serve" */
    int max_tokens;     /* token budget over all sequences (KV pool), 0 = unknown */
    int max_ctx;        /* one sequence's context, 0 = unknown */
    const char *mem_what; /* what peak_mem measures */
    void *ctx;
    /* runs one job; 0 or -1 with err */
    int (*run)(struct bench_target *t, const struct bench_job *j, struct bench_obs *o, char *err, size_t errlen);
    /* releases cached state (the prefix) between rows; may be NULL */
    void (*reset)(struct bench_target *t);
};

/* what the table's label columns show */
struct bench_labels {
    char model[256]; /* "qwen3-0.6b" */
    char size[32];   /* "0.6B" */
    char precision[32]; /* "BF16", "Q4_0" */
    char backend[32];
    int threads;
    int nchip;
};

struct bench_opts {
    const char *profile; /* prefix, speed, batch */
    int reps;            /* repetitions per row (-r) */
    int warmup;          /* untimed warm-up job before the first row */
    uint64_t seed;
    int output_len;      /* prefix: generated tokens per row; speed: --gen-len; batch: 0 = output = input */
    int prefix_new;      /* prefix: new tokens after the cached prefix (250) */
    int max_input;       /* rows with more input tokens are skipped (0: no cap) */
    const int *inputs;   /* override the profile's input lengths (NULL: the table's) */
    int n_inputs;
    const int *batches;  /* batch profile: batch sizes (NULL: 1,2,4,8,16) */
    int n_batches;
    int progress;        /* 1: print the progress line on stderr */
    struct bench_labels lab;
};

void bench_opts_default(struct bench_opts *o);

/* Runs a profile (prefix | speed | batch) on a target into t (initialised
 * here). Rows that do not fit are skipped with a note; a failing row is
 * noted and the rest continue. Returns 0, or -1 with err when nothing could
 * run at all (bad profile name). */
int bench_run_profile(struct bench_target *tg, const struct bench_opts *o, struct bt_table *t, char *err, size_t errlen);

/* The progress line: "[bench] row i/N <what> | elapsed m:ss | eta m:ss". */
struct bench_progress {
    int on, n_rows;
    double t0, total_w, done_w;
    int last_len, tty;
};
void bench_progress_start(struct bench_progress *p, int on, int n_rows, double total_weight, double now);
void bench_progress_row(struct bench_progress *p, int row, const char *what, double now);
void bench_progress_done(struct bench_progress *p, double weight, double now);
void bench_progress_end(struct bench_progress *p);
/* "m:ss" or "h:mm:ss" */
void bench_fmt_dur(char *buf, size_t cap, double s);

/* Peak resident memory: resets /proc/self/status VmHWM (clear_refs 5) and
 * reads it back; NaN where unavailable. */
void bench_mem_reset_peak(void);

double bench_mem_peak_rss(void);

/* The machine's memory read bandwidth in GB/s (membw.c): `threads` threads
 * sum their slices of a fresh `bytes` buffer with `width`-byte loads (16,
 * 32: AVX2, 64: AVX-512; the caller checks the CPU has them), each slice
 * read as 1, 2 or 4 streams by turns, best of `passes`; -1 if the buffer
 * or a thread could not be had. bench_membw_passes: pass k reads
 * streams[k % n_streams] streams per slice and its figure goes to gbs[k]
 * (when gbs is not NULL). */
#define BENCH_MEMBW_MAX_THREADS 256
#define BENCH_MEMBW_MIB 1024 /* default buffer: well past a server's last-level cache */
double bench_membw(int threads, size_t bytes, int passes, int width);
double bench_membw_passes(int threads, size_t bytes, int passes, int width, const int *streams, int n_streams, double *gbs);

/* UTC date "YYYY-MM-DD HH:MM UTC" */
void bench_date(char *buf, size_t cap);

#endif
