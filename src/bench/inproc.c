/*
 * inproc.c: `kiln bench` on the engine in this process.
 *
 * What is timed:
 *   profiles (prefix, speed, batch): from the call that evaluates a row's
 *     new prompt tokens to the argmax of each generated token's logits, i.e.
 *     prefill, every decode forward and greedy sampling: the first token's
 *     logits are copied to the host and its argmax taken there; decode
 *     steps take the backend's argmax (on the GPU with CUDA) and copy only
 *     the ids, as the server does for greedy requests. A cached prefix is evaluated into the sequence before the
 *     clock starts. Creating and freeing sequences is outside the clock.
 *   pp-tg: pp = one kiln_seq_eval over p random tokens (one forward when the
 *     prefill chunk allows), logits of the last token included, no sampling;
 *     tg = n kiln_seq_eval calls of one random token each after a one-token
 *     prompt (untimed), logits included, no sampling (as llama-bench).
 */
#include "bench/inproc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "bench/bench.h"
#include "bench/stats.h"
#include "engine/sampler.h"

#ifdef KILN_CUDA
/* from the CUDA runtime (linked in CUDA builds); cudaError_t is an enum */
extern int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
#endif

struct inproc {
    kiln_engine *e;
    int V, chunk, cuda;
    float *logits;
    int cap_b;
    kiln_seq *pseq; /* the cached prefix */
    int32_t *pids;  /* prefix token stream */
    int cap_p;
};

static void random_ids(int32_t *ids, int n, int vocab, uint64_t seed) {
    struct kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(kiln_rng_next(&r) % (uint64_t)vocab);
}

static double mem_now(struct inproc *p) {
#ifdef KILN_CUDA
    if (p->cuda) {
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) == 0) return (double)(tot - fr);
        return NAN;
    }
#endif
    (void)p;
    return bench_mem_peak_rss();
}

static void inproc_reset(struct bench_target *t) {
    struct inproc *p = t->ctx;
    kiln_seq_free(p->pseq);
    p->pseq = NULL;
}

static int inproc_run(struct bench_target *t, const struct bench_job *j, struct bench_obs *o, char *err, size_t errlen) {
    struct inproc *p = t->ctx;
    const int B = j->batch, V = p->V;
    if (B < 1 || j->n_new < 1 || j->n_out < 1) return kiln_errf(err, errlen, "bad job");
    if (j->n_prefix > 0 && B != 1) return kiln_errf(err, errlen, "a cached prefix needs batch 1");
    if (B > p->cap_b) {
        p->cap_b = B;
        free(p->logits);
        p->logits = kiln_malloc(sizeof(float) * (size_t)V * (size_t)B);
    }
    kiln_seq **seqs = kiln_calloc((size_t)B, sizeof *seqs);
    int32_t **ids = kiln_calloc((size_t)B, sizeof *ids);
    int *nn = kiln_malloc(sizeof(int) * (size_t)B);
    int32_t *tok = kiln_malloc(sizeof(int32_t) * (size_t)B);
    const int32_t **tp = kiln_malloc(sizeof(int32_t *) * (size_t)B);
    int rc = -1;

    if (j->n_prefix > 0) { /* bring the cached prefix to exactly n_prefix tokens, untimed */
        if (j->n_prefix > p->cap_p) {
            p->pids = kiln_realloc(p->pids, sizeof(int32_t) * (size_t)j->n_prefix);
            random_ids(p->pids, j->n_prefix, V, 0x9e3779b97f4a7c15ull); /* one stream: shorter prefixes are its prefixes */
            p->cap_p = j->n_prefix;
        }
        if (!p->pseq && !(p->pseq = kiln_seq_new(p->e, err, errlen))) goto out;
        int have = kiln_seq_len(p->pseq);
        if (have > j->n_prefix) kiln_seq_truncate(p->pseq, j->n_prefix), have = j->n_prefix;
        if (have < j->n_prefix && kiln_seq_eval(p->pseq, p->pids + have, j->n_prefix - have, NULL, 0, err, errlen)) {
            kiln_err_prefix(err, errlen, "evaluating the %d-token prefix", j->n_prefix);
            inproc_reset(t);
            goto out;
        }
        seqs[0] = p->pseq;
    } else {
        inproc_reset(t);
        for (int b = 0; b < B; b++)
            if (!(seqs[b] = kiln_seq_new(p->e, err, errlen))) goto out;
    }
    for (int b = 0; b < B; b++) {
        ids[b] = kiln_malloc(sizeof(int32_t) * (size_t)j->n_new);
        random_ids(ids[b], j->n_new, V, j->seed * 1000003u + (uint64_t)b);
        nn[b] = j->n_new;
        tp[b] = ids[b];
    }
    if (!p->cuda) bench_mem_reset_peak();

    /* ---- timed ---- */
    o->t_send = kiln_now();
    /* as many whole prompts per forward as fit one prefill chunk, as a
     * server batches waiting prompts; a prompt alone (batch 1, or longer
     * than the chunk) through kiln_seq_eval, in its chunks */
    const int g = j->n_new <= p->chunk ? p->chunk / j->n_new : 1;
    for (int b0 = 0; b0 < B; b0 += g) {
        const int m = B - b0 < g ? B - b0 : g;
        if (m > 1 ? kiln_seqs_eval(seqs + b0, m, tp + b0, nn + b0, p->logits + (size_t)b0 * V, err, errlen)
                  : kiln_seq_eval(seqs[b0], ids[b0], j->n_new, p->logits + (size_t)b0 * V, 0, err, errlen))
            goto out;
        for (int b = b0; b < b0 + m; b++) tok[b] = sampler_argmax(p->logits + (size_t)b * V, V);
        const double now = kiln_now();
        for (int b = b0; b < b0 + m; b++) o->t_first[b] = now;
    }
    for (int b = 0; b < B; b++) o->n_out[b] = 1, tp[b] = &tok[b], nn[b] = 1;
    /* decode: the greedy token is the argmax taken by the backend (on the
     * GPU with CUDA), as the server does for greedy requests */
    for (int s = 1; s < j->n_out; s++) {
        if (kiln_seqs_eval_argmax(seqs, B, tp, nn, tok, err, errlen)) goto out;
        for (int b = 0; b < B; b++) o->n_out[b]++;
    }
    double end = kiln_now();
    /* ---- end of timing ---- */
    for (int b = 0; b < B; b++) o->t_end[b] = end;
    if (B == 1 && j->n_out == 1) o->t_end[0] = o->t_first[0];
    o->peak_mem = mem_now(p);
    rc = 0;
out:
    if (j->n_prefix > 0) {
        if (p->pseq) kiln_seq_truncate(p->pseq, j->n_prefix);
    } else {
        for (int b = 0; b < B; b++) kiln_seq_free(seqs[b]);
    }
    for (int b = 0; b < B; b++) free(ids[b]);
    free(seqs), free(ids), free(nn), free(tok), free(tp);
    return rc;
}

void bench_inproc_target(struct bench_target *t, kiln_engine *e, int max_tokens, int chunk) {
    struct inproc *p = kiln_calloc(1, sizeof *p);
    p->e = e;
    p->V = kiln_engine_config(e)->vocab;
    p->chunk = chunk;
    p->cuda = !strcmp(kiln_engine_backend(e), "cuda");
    memset(t, 0, sizeof *t);
    t->kind = "in-process";
    t->max_tokens = max_tokens;
    t->max_ctx = kiln_engine_config(e)->max_pos;
    t->mem_what = p->cuda ? "gpu" : "rss";
    t->ctx = p;
    t->run = inproc_run;
    t->reset = inproc_reset;
}

void bench_inproc_free(struct bench_target *t) {
    struct inproc *p = t->ctx;
    if (!p) return;
    kiln_seq_free(p->pseq);
    free(p->pids);
    free(p->logits);
    free(p);
    t->ctx = NULL;
}

/* *mem = the higher of itself and the memory in use now (NAN: none yet) */
static void keep_peak(double *mem, struct inproc *p) {
    const double m = mem_now(p);
    if (!isnan(m) && (isnan(*mem) || m > *mem)) *mem = m;
}

/* ==== pp / tg (llama-bench) ==== */

/* the bandwidth probe of --roofline: two passes of each stream pattern
 * (~0.3 s at 20 GB/s) */
#define BW_PASSES 6

static int probe_bw(double *gbs, const struct bench_pptg_opts *o, int mib, int width, char *err, size_t errlen) {
    if ((*gbs = bench_membw(o->lab.threads, (size_t)mib << 20, BW_PASSES, width)) > 0) return 0;
    return kiln_errf(err, errlen, "--roofline: the bandwidth probe could not map %d MiB or start its threads", mib);
}

double bench_roof_pair(const double *t, const double *bw, int nw, double *max) {
    double tt = 0, tb = 0, mx = nw > 0 ? bw[0] : -1;
    for (int w = 0; w < nw; w++) {
        tt += t[w], tb += t[w] * 0.5 * (bw[w] + bw[w + 1]);
        if (bw[w + 1] > mx) mx = bw[w + 1];
    }
    if (max) *max = mx;
    return tt > 0 ? tb / tt : -1;
}

/* a test's share of the progress estimate: ppN costs ~N token-evals per
 * run (the warm-up included), tgN ~12 N, and depth d adds its d untimed
 * tokens to each run */
static double test_weight(int tg, int n, int d, int reps, int warmup) {
    return tg ? (12.0 * n + d) * reps : ((double)n + d) * (reps + warmup);
}

/* tg at batch B: B fresh sequences, each given d random tokens of context
 * and a one-token prompt (untimed), then `steps` decode steps of all B
 * together, one random token each (*busy: their seconds) */
static int tg_batched(kiln_engine *e, int B, int n, int d, uint64_t seed, int steps, double *busy, char *err, size_t errlen) {
    const int V = kiln_engine_config(e)->vocab;
    const size_t stride = (size_t)n + 1 + d; /* a sequence's ids: d of context, the prompt, n steps */
    kiln_seq **seqs = kiln_calloc((size_t)B, sizeof *seqs);
    int32_t *ids = kiln_malloc(sizeof(int32_t) * (size_t)B * stride), *tok = kiln_malloc(sizeof(int32_t) * (size_t)B);
    const int32_t **tp = kiln_malloc(sizeof(int32_t *) * (size_t)B);
    int *nn = kiln_malloc(sizeof(int) * (size_t)B), rc = 0;
    for (int b = 0; b < B && rc == 0; b++) {
        int32_t *sid = ids + (size_t)b * stride;
        random_ids(sid, (int)stride, V, seed * 1000003u + (uint64_t)b);
        if (!(seqs[b] = kiln_seq_new(e, err, errlen))) rc = -1;
        else if (d > 0) rc = kiln_seq_eval(seqs[b], sid, d, NULL, 0, err, errlen);
        tp[b] = sid + d, nn[b] = 1;
    }
    if (rc == 0) rc = kiln_seqs_eval_argmax(seqs, B, tp, nn, tok, err, errlen); /* the prompts */
    if (rc == 0) {
        const double t0 = kiln_now();
        for (int i = 0; i < steps && rc == 0; i++) {
            for (int b = 0; b < B; b++) tp[b] = ids + (size_t)b * stride + d + 1 + i;
            rc = kiln_seqs_eval_argmax(seqs, B, tp, nn, tok, err, errlen);
        }
        *busy = kiln_now() - t0;
    }
    for (int b = 0; b < B; b++) kiln_seq_free(seqs[b]);
    free(seqs), free(ids), free(tok), free(tp), free(nn);
    return rc;
}

int bench_pptg(kiln_engine *e, const struct bench_pptg_opts *o, struct bt_table *t, char *err, size_t errlen) {
    const int V = kiln_engine_config(e)->vocab;
    const int cuda = !strcmp(kiln_engine_backend(e), "cuda");
    struct inproc memp = {.cuda = cuda};
    float *logits = kiln_malloc(sizeof(float) * (size_t)V);
    int reps = o->reps > 0 ? o->reps : 1;
    double *ts = kiln_malloc(sizeof(double) * (size_t)reps), *ttft = kiln_malloc(sizeof(double) * (size_t)reps);
    /* --roofline, per repetition: the paired bandwidth and share, and the
     * same against the repetition's highest probe */
    double *bw = kiln_malloc(sizeof(double) * 4 * (size_t)reps), *roof = bw + reps, *bwmax = bw + 2 * reps, *roofmax = bw + 3 * reps;
    const int roof_win = o->roofline_window > 0 ? o->roofline_window : BENCH_ROOF_WINDOW;
    double dbytes = kiln_engine_decode_bytes(e);

    bt_init(t, "pp-tg", "kiln bench --profile pp-tg", BT_SPREAD_SD);
    int c_model = bt_col(t, "model", "model", BT_STR, 0, 0);
    int c_size = bt_col(t, "size", "size", BT_STR, 0, 0);
    int c_params = bt_col(t, "params", "params", BT_STR, 0, 0);
    int c_be = bt_col(t, "backend", "backend", BT_STR, 0, 0);
    int c_thr = bt_col(t, "threads", "threads", BT_INT, 0, 0);
    int c_test = bt_col(t, "test", "test", BT_STR, 0, 0);
    int c_ts = bt_col(t, "t/s", "tps", BT_NUM, 2, 1);
    int c_ttft = bt_col(t, "TTFT(ms)", "ttft_ms", BT_NUM, 2, 1);
    int c_gbs = bt_col(t, "GB/s", "gbps", BT_NUM, 1, 0);
    const int load_width = kiln_engine_load_width(e);
    int c_bw = -1, c_roof = -1, bw_width = load_width > 0 ? load_width : 16;
    const int bw_mib = o->roofline_mib > 0 ? o->roofline_mib : BENCH_MEMBW_MIB;
    if (o->roofline) {
        c_bw = bt_col(t, "membw(GB/s)", "membw_gbps", BT_NUM, 1, 0);
        c_roof = bt_col(t, "roofline(%)", "roofline_pct", BT_NUM, 1, 1);
    }
    int c_mem = bt_col(t, cuda ? "GPU mem(MiB)" : "peak RSS(MiB)", "peak_mem_mib", BT_NUM, 0, 0);
    bt_footer(t, "pp<p>: one kiln_seq_eval over p random token ids (seed %llu) in a fresh sequence, last-token logits "
                 "included, no sampling; t/s = p / time. TTFT(ms) = the same eval plus picking the first token (argmax).",
              (unsigned long long)o->seed);
    bt_footer(t, "tg<n>: n kiln_seq_eval calls of one random token each after an untimed one-token prompt, batch 1, "
                 "logits included, no sampling; t/s = n / time. GB/s = %.3f GB of weights read per token (all weights but "
                 "the input embedding and unused experts) x t/s.",
              dbytes / 1e9);
    const int TB = o->tg_batch > 1 ? o->tg_batch : 1;
    if (TB > 1)
        bt_footer(t, "tg<n> @ b%d: %d sequences, each after its own one-token prompt (untimed), decoded together: n steps of "
                     "kiln_seqs_eval_argmax, one random token per sequence per step, the greedy token picked by the backend "
                     "as the server does; t/s = %d x n / time (all sequences' tokens), GB/s = the weights' bytes x steps per "
                     "second.",
                  TB, TB, TB);
    if (o->roofline)
        bt_footer(t, "membw: this machine's memory read bandwidth, measured by %d threads with %d-byte loads over a fresh "
                     "%d MiB buffer, each thread's slice read as 1, 2 or 4 streams (best of %d passes). With --roofline a "
                     "timed tg repetition runs as windows of %d steps with a probe before each and after the last (only "
                     "the windows are timed, t/s included); a window is held to the mean of the two probes around it and "
                     "the repetition to the time-weighted mean of its windows' figures (membw). roofline(%%) = GB/s / "
                     "membw, mean ± sd over the repetitions.",
                  o->lab.threads, bw_width, bw_mib, BW_PASSES, roof_win);
    bt_footer(t, "t/s is the mean ± standard deviation over %d repetitions; %s. Memory: %s.", reps,
              o->warmup ? "one untimed warm-up run of each test first" : "no warm-up",
              cuda ? "GPU memory in use (cudaMemGetInfo total - free) after the test"
                   : "peak resident memory of the process during the test (VmHWM, reset per test)");

    static const int depth0 = 0;
    const int *depths = o->n_depth > 0 ? o->depth : &depth0, n_depth = o->n_depth > 0 ? o->n_depth : 1;
    const double kvb = kiln_engine_kv_token_bytes(e);
    int any_depth = 0, max_depth = 0;
    for (int di = 0; di < n_depth; di++) any_depth |= depths[di] > 0, max_depth = depths[di] > max_depth ? depths[di] : max_depth;
    if (any_depth)
        bt_footer(t, "@ d<d>: the same test after d random tokens (seed %llu) evaluated into the sequence untimed (for tg, "
                     "in place of the one-token prompt), as llama-bench's -d. There the bytes per step behind GB/s%s also "
                     "count the KV cache read: %.1f KB per cached token x the timed steps' mean context.",
                  (unsigned long long)o->seed, o->roofline ? " and roofline(%)" : "", kvb / 1e3);
    int n_tests = 0;
    for (int i = 0; i < o->n_pp; i++) n_tests += o->pp[i] > 0;
    for (int i = 0; i < o->n_tg; i++) n_tests += o->tg[i] > 0;
    n_tests *= n_depth;
    double tw = 0;
    for (int di = 0; di < n_depth; di++) {
        for (int i = 0; i < o->n_pp; i++) tw += test_weight(0, o->pp[i], depths[di], reps, o->warmup);
        for (int i = 0; i < o->n_tg; i++) tw += test_weight(1, o->tg[i], depths[di], reps, o->warmup);
    }
    struct bench_progress pr;
    bench_progress_start(&pr, o->progress, n_tests, tw, kiln_now());
    int rc = 0, row_i = 0;
    int32_t *dids = kiln_malloc(sizeof(int32_t) * (size_t)(max_depth > 0 ? max_depth : 1));
    for (int di = 0; di < n_depth && rc == 0; di++) {
        const int d = depths[di];
        for (int pass = 0; pass < 2 && rc == 0; pass++) {
            const int *list = pass ? o->tg : o->pp;
            int n_list = pass ? o->n_tg : o->n_pp;
            for (int li = 0; li < n_list && rc == 0; li++) {
                int n = list[li];
                if (n <= 0) continue;
                char test[48], tkey[48];
                snprintf(test, sizeof test, "%s%d", pass ? "tg" : "pp", n);
                memcpy(tkey, test, sizeof tkey); /* the table's name and the JSON key differ only at depth */
                if (d > 0) {
                    snprintf(test + strlen(test), sizeof test - strlen(test), " @ d%d", d);
                    snprintf(tkey + strlen(tkey), sizeof tkey - strlen(tkey), "_d%d", d);
                }
                const int B = pass ? TB : 1; /* sequences decoded together */
                if (B > 1) {
                    snprintf(test + strlen(test), sizeof test - strlen(test), " @ b%d", B);
                    snprintf(tkey + strlen(tkey), sizeof tkey - strlen(tkey), "_b%d", B);
                }
                bench_progress_row(&pr, ++row_i, test, kiln_now());
                int32_t *ids = kiln_malloc(sizeof(int32_t) * (size_t)(n + 1));
                double mem = NAN;
                const int roofline = o->roofline && pass;
                /* a tg repetition's windows: their seconds, and the probes around them */
                const int max_win = roofline ? (n + roof_win - 1) / roof_win : 1;
                double *wt = kiln_malloc(sizeof(double) * (2 * (size_t)max_win + 1)), *wbw = wt + max_win;
                /* bytes a timed decode step reads: the weights, and at depth the
                 * KV cache over the steps' mean context (d + (n + 1) / 2) */
                const double sbytes = dbytes + (d > 0 ? kvb * B * (d + (n + 1) / 2.0) : 0.0);
                for (int k = -(o->warmup ? 1 : 0); k < reps && rc == 0; k++) {
                    if (B > 1) { /* batched decode: its own loop */
                        double busy = 0;
                        rc = tg_batched(e, B, n, d, o->seed + 7919u * (uint64_t)(k + 1) + (uint64_t)n * 31u, k < 0 ? 1 : n, &busy, err,
                                        errlen);
                        if (k >= 0 && rc == 0) ts[k] = (double)B * n / busy, ttft[k] = NAN, keep_peak(&mem, &memp);
                        continue;
                    }
                    random_ids(ids, n + 1, V, o->seed + 7919u * (uint64_t)(k + 1) + (uint64_t)n * 31u + (uint64_t)pass);
                    kiln_seq *s = kiln_seq_new(e, err, errlen);
                    if (!s) {
                        rc = -1;
                        break;
                    }
                    if (d > 0) { /* the context, untimed */
                        random_ids(dids, d, V, o->seed + 104729u * (uint64_t)(k + 2) + (uint64_t)d);
                        if ((rc = kiln_seq_eval(s, dids, d, logits, 0, err, errlen))) {
                            kiln_seq_free(s);
                            break;
                        }
                    }
                    if (!cuda) bench_mem_reset_peak();
                    if (!pass) {
                        double t0 = kiln_now();
                        rc = kiln_seq_eval(s, ids, n, logits, 0, err, errlen);
                        double t1 = kiln_now();
                        volatile int32_t first = sampler_argmax(logits, V);
                        (void)first;
                        double t2 = kiln_now();
                        if (k >= 0) ts[k] = n / (t1 - t0), ttft[k] = (t2 - t0) * 1e3;
                        if (k >= 0) keep_peak(&mem, &memp);
                    } else {
                        if (d == 0) rc = kiln_seq_eval(s, ids, 1, logits, 0, err, errlen);
                        /* timed in windows of `win` steps; with --roofline the
                         * probe runs before each and after the last, untimed,
                         * and the peak memory restarts after it (its buffer is
                         * gone by then) */
                        const int steps = k < 0 ? 1 : n, probe = roofline && k >= 0, win = probe ? roof_win : steps;
                        const int nw = (steps + win - 1) / win;
                        double busy = 0;
                        for (int w = 0; w < nw && rc == 0; w++) {
                            if (probe) {
                                if ((rc = probe_bw(&wbw[w], o, bw_mib, bw_width, err, errlen))) break;
                                if (!cuda) bench_mem_reset_peak();
                            }
                            const int i1 = (w + 1) * win < steps ? (w + 1) * win : steps;
                            double t0 = kiln_now();
                            for (int i = w * win; i < i1 && rc == 0; i++) rc = kiln_seq_eval(s, ids + 1 + i, 1, logits, 0, err, errlen);
                            busy += wt[w] = kiln_now() - t0;
                            if (k >= 0) keep_peak(&mem, &memp);
                        }
                        if (rc == 0 && probe && (rc = probe_bw(&wbw[nw], o, bw_mib, bw_width, err, errlen)) == 0) {
                            const double gbs = sbytes * n / busy / 1e9;
                            bw[k] = bench_roof_pair(wt, wbw, nw, &bwmax[k]);
                            roof[k] = 100.0 * gbs / bw[k], roofmax[k] = 100.0 * gbs / bwmax[k];
                        }
                        if (k >= 0) ts[k] = n / busy, ttft[k] = NAN;
                    }
                    kiln_seq_free(s);
                }
                free(ids), free(wt);
                if (rc) {
                    kiln_err_prefix(err, errlen, "%s", test);
                    break;
                }
                struct bench_stat st = bench_stat_of(ts, reps), sf = bench_stat_of(ttft, pass ? 0 : reps);
                int r = bt_row(t);
                char model[300];
                snprintf(model, sizeof model, "%s %s", o->lab.model, o->lab.precision);
                bt_set_str(t, r, c_model, model);
                bt_set_str(t, r, c_size, o->size_str);
                bt_set_str(t, r, c_params, o->params_str);
                bt_set_str(t, r, c_be, o->lab.backend);
                bt_set_num(t, r, c_thr, o->lab.threads);
                bt_set_str(t, r, c_test, test);
                bt_set_range(t, r, c_ts, st.mean, st.sd, st.min, st.max);
                if (!pass) bt_set_range(t, r, c_ttft, sf.mean, sf.sd, sf.min, sf.max);
                if (pass) bt_set_num(t, r, c_gbs, sbytes * st.mean / B / 1e9);
                struct bench_stat sb = {0}, sr = {0}, sbm = {0}, srm = {0};
                if (roofline) {
                    sb = bench_stat_of(bw, reps), sr = bench_stat_of(roof, reps);
                    sbm = bench_stat_of(bwmax, reps), srm = bench_stat_of(roofmax, reps);
                    bt_set_num(t, r, c_bw, sb.mean);
                    bt_set_range(t, r, c_roof, sr.mean, sr.sd, sr.min, sr.max);
                }
                bt_set_num(t, r, c_mem, mem / (1 << 20));
                char key[48];
                bt_summary(t, tkey, st.mean);
                snprintf(key, sizeof key, "%s_sd", tkey);
                bt_summary(t, key, st.sd);
                if (!pass) {
                    snprintf(key, sizeof key, "%s_ttft_ms", tkey);
                    bt_summary(t, key, sf.mean);
                } else {
                    snprintf(key, sizeof key, "%s_gbps", tkey);
                    bt_summary(t, key, sbytes * st.mean / B / 1e9);
                    if (roofline) {
                        snprintf(key, sizeof key, "%s_membw_gbps", tkey);
                        bt_summary(t, key, sb.mean);
                        snprintf(key, sizeof key, "%s_roofline_pct", tkey);
                        bt_summary(t, key, sr.mean);
                        snprintf(key, sizeof key, "%s_membw_max_gbps", tkey);
                        bt_summary(t, key, sbm.mean);
                        snprintf(key, sizeof key, "%s_roofline_max_pct", tkey);
                        bt_summary(t, key, srm.mean);
                    }
                }
                snprintf(key, sizeof key, "%s_mem_mib", tkey);
                bt_summary(t, key, mem / (1 << 20));
                bench_progress_done(&pr, test_weight(pass, n, d, reps, o->warmup), kiln_now());
            }
        }
    }
    free(dids);
    bench_progress_end(&pr);
    free(logits), free(ts), free(ttft), free(bw);
    return rc;
}
