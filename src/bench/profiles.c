/*
 * profiles.c: the rows and columns of the published tables (issue 8) and
 * the loop that runs them on a target (in-process engine or HTTP server).
 *
 * What is timed (for every target): from submitting a row's n_new prompt
 * tokens (the cached prefix, if any, is already in place and untimed) to
 * each sequence's first generated token (TTFT) and last generated token.
 * Decoding is greedy and included. Warm-up jobs are not timed.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "bench/bench.h"
#include "bench/stats.h"

void bench_opts_default(struct bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->profile = "prefix";
    o->reps = 3;
    o->warmup = 1;
    o->seed = 1234;
    o->output_len = -1; /* the profile's default */
    o->prefix_new = 250;
    o->lab.nchip = 1;
}

/* one row of a profile */
struct row {
    struct bench_job job;
    char what[64];
};

static const int prefix_plain[] = {128, 250, 500, 1000, 2000};
static const int prefix_cached[] = {500, 1000, 2000, 4000, 8000, 16000};
static const int speed_inputs[] = {1, 6144, 14336, 30720, 63488, 129024};
static const int batch_sizes[] = {1, 2, 4, 8, 16};
static const int batch_seqs[] = {1024, 2048, 4096, 8192};

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int add_row(struct row **rows, int *n, struct bench_job j, const char *what) {
    *rows = kiln_realloc(*rows, sizeof **rows * (size_t)(*n + 1));
    (*rows)[*n].job = j;
    snprintf((*rows)[*n].what, sizeof (*rows)[*n].what, "%s", what);
    return (*n)++;
}

static int build_rows(const struct bench_opts *o, struct row **rows, char *err, size_t errlen) {
    int n = 0;
    char w[64];
    *rows = NULL;
    if (!strcmp(o->profile, "prefix")) {
        int out = o->output_len > 0 ? o->output_len : 16;
        const int *in = o->inputs ? o->inputs : prefix_plain;
        int n_in = o->inputs ? o->n_inputs : N_OF(prefix_plain);
        for (int i = 0; i < n_in; i++) {
            snprintf(w, sizeof w, "no prefix, input %d", in[i]);
            add_row(rows, &n, (struct bench_job){.batch = 1, .n_prefix = 0, .n_new = in[i], .n_out = out}, w);
        }
        in = o->inputs ? o->inputs : prefix_cached;
        n_in = o->inputs ? o->n_inputs : N_OF(prefix_cached);
        for (int i = 0; i < n_in; i++) {
            if (in[i] <= o->prefix_new) continue;
            snprintf(w, sizeof w, "prefix %d + %d new", in[i] - o->prefix_new, o->prefix_new);
            add_row(rows, &n, (struct bench_job){.batch = 1, .n_prefix = in[i] - o->prefix_new, .n_new = o->prefix_new, .n_out = out}, w);
        }
    } else if (!strcmp(o->profile, "speed")) {
        int out = o->output_len > 0 ? o->output_len : 2048;
        const int *in = o->inputs ? o->inputs : speed_inputs;
        int n_in = o->inputs ? o->n_inputs : N_OF(speed_inputs);
        for (int i = 0; i < n_in; i++) {
            snprintf(w, sizeof w, "input %d, %d generated", in[i], out);
            add_row(rows, &n, (struct bench_job){.batch = 1, .n_new = in[i], .n_out = out}, w);
        }
    } else if (!strcmp(o->profile, "batch")) {
        const int *in = o->inputs ? o->inputs : batch_seqs;
        int n_in = o->inputs ? o->n_inputs : N_OF(batch_seqs);
        const int *bs = o->batches ? o->batches : batch_sizes;
        int n_bs = o->batches ? o->n_batches : N_OF(batch_sizes);
        for (int i = 0; i < n_in; i++)
            for (int b = 0; b < n_bs; b++) {
                int out = o->output_len > 0 ? o->output_len : in[i];
                snprintf(w, sizeof w, "batch %d, %d in / %d out", bs[b], in[i], out);
                add_row(rows, &n, (struct bench_job){.batch = bs[b], .n_new = in[i], .n_out = out}, w);
            }
    } else {
        return kiln_errf(err, errlen, "unknown profile '%s' (pp-tg, prefix, speed, batch, serving)", o->profile);
    }
    for (int i = 0; i < n; i++) (*rows)[i].job.seed = o->seed + 7919u * (uint64_t)i;
    return n;
}

/* one repetition's figures */
struct rep {
    double ttft, tpot, total, prefill_tps, decode_tps, speed, e2e_tput, nonfirst_tput, mem;
    int n_out;
};

static void rep_of(const struct bench_job *j, const struct bench_obs *o, struct rep *r) {
    double first = o->t_first[0], end = o->t_end[0], tpot_sum = 0;
    int n_out = o->n_out[0], n_tpot = 0;
    for (int i = 0; i < j->batch; i++) {
        if (o->t_first[i] > first) first = o->t_first[i];
        if (o->t_end[i] > end) end = o->t_end[i];
        if (o->n_out[i] < n_out) n_out = o->n_out[i];
        struct bench_req_times q = {.t_send = o->t_send, .t_first = o->t_first[i], .t_end = o->t_end[i], .n_out = o->n_out[i]};
        double tp = bench_tpot(&q);
        if (!isnan(tp)) tpot_sum += tp, n_tpot++;
    }
    /* the batch's first token time: every sequence has its first token;
     * TPOT: the mean of the sequences' own TPOTs (equal when they run in
     * lockstep, as in-process; over HTTP they need not) */
    struct bench_req_times t = {.t_send = o->t_send, .t_first = first, .t_end = end, .n_in = j->n_new, .n_out = n_out, .ok = 1};
    r->n_out = n_out;
    r->ttft = bench_ttft(&t);
    r->tpot = n_tpot ? tpot_sum / n_tpot : NAN;
    r->total = bench_e2e(&t);
    r->prefill_tps = bench_rate((double)j->batch * j->n_new, r->ttft);
    r->decode_tps = j->batch / r->tpot;
    r->speed = bench_rate((double)j->batch * (j->n_prefix + j->n_new + n_out), r->total);
    r->e2e_tput = bench_rate((double)j->batch * n_out, r->total);
    r->nonfirst_tput = r->decode_tps;
    r->mem = o->peak_mem;
}

/* median of a field over reps, with min and max, into a ranged cell */
static void set_med(struct bt_table *t, int row, int col, const struct rep *reps, int n, size_t off, double scale) {
    double *v = kiln_malloc(sizeof(double) * (size_t)n);
    int k = 0;
    for (int i = 0; i < n; i++) {
        double x = *(const double *)((const char *)&reps[i] + off);
        if (!isnan(x)) v[k++] = x * scale;
    }
    struct bench_stat s = bench_stat_of(v, k);
    bt_set_range(t, row, col, s.median, s.sd, s.min, s.max);
    free(v);
}
#define MED(col, field, scale) set_med(t, r, col, reps, n_ok, offsetof(struct rep, field), scale)

static int fits(const struct bench_target *tg, const struct bench_opts *o, const struct bench_job *j, char *why, size_t cap) {
    long long per = (long long)j->n_prefix + j->n_new + j->n_out;
    if (o->max_input > 0 && j->n_prefix + j->n_new > o->max_input) {
        snprintf(why, cap, "input %d > --max-input %d", j->n_prefix + j->n_new, o->max_input);
        return 0;
    }
    if (tg->max_ctx > 0 && per > tg->max_ctx) {
        snprintf(why, cap, "%lld tokens per sequence exceed the model's context of %d", per, tg->max_ctx);
        return 0;
    }
    if (tg->max_tokens > 0 && per * j->batch > tg->max_tokens) {
        snprintf(why, cap, "batch %d x %lld tokens = %lld exceed the token budget of %d (--max-total-tokens)", j->batch, per,
                 per * j->batch, tg->max_tokens);
        return 0;
    }
    return 1;
}

static double row_weight(const struct bench_job *j, int reps) {
    return (double)reps * j->batch * (j->n_new + 12.0 * j->n_out) + j->n_prefix * 0.5;
}

static void add_columns(struct bt_table *t, const char *profile, const struct bench_target *tg) {
    if (!strcmp(profile, "prefix")) {
        bt_col(t, "Model", "model", BT_STR, 0, 0);
        bt_col(t, "Size", "size", BT_STR, 0, 0);
        bt_col(t, "PrefillLen(tokens)", "prefill_len", BT_INT, 0, 0);
        bt_col(t, "Ctx(K)", "ctx_k", BT_INT, 0, 0);
        bt_col(t, "Batch", "batch", BT_INT, 0, 0);
        bt_col(t, "NChip", "nchip", BT_INT, 0, 0);
        bt_col(t, "Input(tokens)", "input_tokens", BT_INT, 0, 0);
        bt_col(t, "Output(tokens)", "output_tokens", BT_INT, 0, 0);
        bt_col(t, "Prefill(tps)", "prefill_tps", BT_NUM, 3, 1);
        bt_col(t, "TTFT(ms)", "ttft_ms", BT_NUM, 3, 1);
        bt_col(t, "Decode(tps)", "decode_tps", BT_NUM, 3, 1);
        bt_col(t, "TPOT(ms)", "tpot_ms", BT_NUM, 3, 1);
        bt_col(t, "Profile", "profile", BT_STR, 0, 0);
        bt_col(t, "Prefix(tokens)", "prefix_tokens", BT_INT, 0, 0);
        bt_col(t, "MeasuredOutput(tokens)", "measured_output", BT_INT, 0, 0);
    } else if (!strcmp(profile, "speed")) {
        bt_col(t, "Model", "model", BT_STR, 0, 0);
        bt_col(t, "Input Length", "input_tokens", BT_INT, 0, 0);
        bt_col(t, "Quantization", "quantization", BT_STR, 0, 0);
        bt_col(t, "GPU Num", "nchip", BT_INT, 0, 0);
        bt_col(t, "Speed (tokens/s)", "speed_tps", BT_NUM, 2, 1);
        bt_col(t, strcmp(tg->mem_what ? tg->mem_what : "", "gpu") ? "Memory(MB)" : "GPU Memory(MB)", "memory_mb", BT_NUM, 0, 0);
        bt_col(t, "Output Length", "output_tokens", BT_INT, 0, 0);
        bt_col(t, "TTFT(ms)", "ttft_ms", BT_NUM, 2, 1);
        bt_col(t, "Prefill(tps)", "prefill_tps", BT_NUM, 2, 1);
        bt_col(t, "Decode(tps)", "decode_tps", BT_NUM, 2, 1);
        bt_col(t, "TPOT(ms)", "tpot_ms", BT_NUM, 3, 1);
        bt_col(t, "Total time(s)", "total_s", BT_NUM, 3, 1);
    } else {
        bt_col(t, "Model", "model", BT_STR, 0, 0);
        bt_col(t, "NChip", "nchip", BT_INT, 0, 0);
        bt_col(t, "Batchsize", "batch", BT_INT, 0, 0);
        bt_col(t, "In_seq", "input_tokens", BT_INT, 0, 0);
        bt_col(t, "Out_seq", "output_tokens", BT_INT, 0, 0);
        bt_col(t, "Total time(s)", "total_s", BT_NUM, 5, 1);
        bt_col(t, "First token time(ms)", "ttft_ms", BT_NUM, 2, 1);
        bt_col(t, "Non-first token time(ms)", "tpot_ms", BT_NUM, 2, 1);
        bt_col(t, "Non-first token Throughput(Tokens/s)", "decode_tps", BT_NUM, 4, 1);
        bt_col(t, "Throughput(Tokens/s)", "e2e_tps", BT_NUM, 4, 1);
        bt_col(t, "Memory(MB)", "memory_mb", BT_NUM, 0, 0);
    }
}

static void add_footer(struct bt_table *t, const struct bench_opts *o, const struct bench_target *tg) {
    bt_footer(t, "Timed: from submitting a row's new prompt tokens to each generated token; greedy (argmax) decoding, "
                 "included; random token ids (seed %llu); warm-up %s; each figure is the median of %d run(s), \"x ± h\" "
                 "shows half the min-max range (min and max are in the CSV/JSON).",
              (unsigned long long)o->seed, o->warmup ? "excluded (one untimed job first)" : "off", o->reps);
    if (!strcmp(o->profile, "prefix")) {
        bt_footer(t, "Prefill(tps) = new (uncached) prompt tokens / TTFT. TTFT(ms) = time to the first generated token. "
                     "TPOT(ms) = (E2E - TTFT) / (output - 1). Decode(tps) = 1000 / TPOT. Profile = prefill_len:input_len; "
                     "Prefix(tokens) = input - prefill_len. Ctx(K) = token budget / 1024. Concurrency 1.");
        bt_footer(t, "Cached prefix: %s", strcmp(tg->kind, "serve") ? "the prefix tokens are evaluated into the sequence before the "
                                                                     "clock starts (untimed); the 250 new tokens then extend it."
                                                                   : "the prefix is sent once untimed (max_tokens 1) so the "
                                                                     "server can cache it; then prefix + new tokens are sent "
                                                                     "and timed (whether the server reuses its cache is up to it).");
    } else if (!strcmp(o->profile, "speed")) {
        bt_footer(t, "Speed (tokens/s) = (prompt + generated tokens) / total time (Qwen's definition), batch 1. "
                     "Prefill(tps) = input / TTFT; Decode(tps) = 1000 / TPOT; TPOT = (total - TTFT) / (output - 1).");
    } else {
        bt_footer(t, "Total time = submit to the last token of the batch. First token time = submit to the moment every "
                     "sequence has its first token. Non-first token time = per sequence (its last token - its first) / (Out_seq - 1), "
                     "averaged over the batch. "
                     "Non-first token Throughput = batch * 1000 / non-first time; Throughput = batch * Out_seq / total "
                     "(MindIE's definitions; the published header spells it \"Throughout\").");
        if (strcmp(tg->kind, "serve")) bt_footer(t, "In-process, batch > 1: the prompts are prefilled as many whole prompts "
                                                     "per forward as fit one prefill chunk (one after another when one fills it); "
                                                     "decode steps run all sequences in one forward (kiln_seqs_eval).");
        else bt_footer(t, "Over HTTP, batch > 1 means that many concurrent streaming requests.");
    }
    if (tg->mem_what && strcmp(o->profile, "prefix"))
        bt_footer(t, "Memory(MB): %s, in MiB.",
                  !strcmp(tg->mem_what, "gpu") ? "GPU memory in use (cudaMemGetInfo total - free) after the row"
                  : !strcmp(tg->mem_what, "rss") ? "peak resident memory of the process during the row (VmHWM, reset per row)"
                                                  : tg->mem_what);
}

int bench_run_profile(struct bench_target *tg, const struct bench_opts *o, struct bt_table *t, char *err, size_t errlen) {
    struct row *rows = NULL;
    int n_rows = build_rows(o, &rows, err, errlen);
    if (n_rows < 0) return -1;
    char title[128];
    snprintf(title, sizeof title, "kiln bench --profile %s", o->profile);
    bt_init(t, o->profile, title, BT_SPREAD_MINMAX);
    add_columns(t, o->profile, tg);
    add_footer(t, o, tg);

    /* which rows fit; progress weights */
    char why[256];
    int *ok = kiln_calloc((size_t)n_rows, sizeof(int));
    double total_w = 0;
    int n_run = 0;
    for (int i = 0; i < n_rows; i++) {
        ok[i] = fits(tg, o, &rows[i].job, why, sizeof why);
        if (!ok[i]) bt_note(t, "skipped %s: %s", rows[i].what, why);
        else total_w += row_weight(&rows[i].job, o->reps), n_run++;
    }

    int maxb = 1;
    for (int i = 0; i < n_rows; i++)
        if (rows[i].job.batch > maxb) maxb = rows[i].job.batch;
    struct bench_obs obs = {.t_first = kiln_malloc(sizeof(double) * (size_t)maxb),
                            .t_end = kiln_malloc(sizeof(double) * (size_t)maxb),
                            .n_out = kiln_malloc(sizeof(int) * (size_t)maxb)};
    struct rep *reps = kiln_malloc(sizeof *reps * (size_t)(o->reps > 0 ? o->reps : 1));

    struct bench_progress pr;
    bench_progress_start(&pr, o->progress, n_run, total_w, kiln_now());
    if (o->warmup && n_run) {
        struct bench_job w = {.batch = 1, .n_new = 32, .n_out = 4, .seed = o->seed ^ 0x5eedu};
        bench_progress_row(&pr, 0, "warm-up", kiln_now());
        if (tg->run(tg, &w, &obs, err, errlen))
            bt_note(t, "warm-up failed: %s", err);
        if (tg->reset) tg->reset(tg);
    }
    int done = 0;
    for (int i = 0; i < n_rows; i++) {
        if (!ok[i]) continue;
        const struct bench_job *j = &rows[i].job;
        bench_progress_row(&pr, ++done, rows[i].what, kiln_now());
        int n_ok = 0;
        char rerr[512] = "";
        for (int k = 0; k < o->reps; k++) {
            struct bench_job jk = *j;
            jk.seed = j->seed + 104729u * (uint64_t)k;
            obs.peak_mem = NAN;
            if (tg->run(tg, &jk, &obs, rerr, sizeof rerr)) break;
            rep_of(&jk, &obs, &reps[n_ok++]);
        }
        if (tg->reset && (i + 1 == n_rows || rows[i + 1].job.n_prefix < j->n_prefix || !rows[i + 1].job.n_prefix)) tg->reset(tg);
        bench_progress_done(&pr, row_weight(j, o->reps), kiln_now());
        if (!n_ok) {
            bt_note(t, "failed %s: %s", rows[i].what, rerr);
            continue;
        }
        if (n_ok < o->reps) bt_note(t, "%s: only %d of %d runs completed: %s", rows[i].what, n_ok, o->reps, rerr);
        int r = bt_row(t), c = 0;
        int n_out = reps[0].n_out;
        for (int k = 1; k < n_ok; k++)
            if (reps[k].n_out < n_out) n_out = reps[k].n_out;
        double mem = NAN;
        for (int k = 0; k < n_ok; k++)
            if (!isnan(reps[k].mem) && (isnan(mem) || reps[k].mem > mem)) mem = reps[k].mem;
        if (!strcmp(o->profile, "prefix")) {
            char prof[32];
            snprintf(prof, sizeof prof, "%d:%d", j->n_new, j->n_prefix + j->n_new);
            bt_set_str(t, r, c++, o->lab.model);
            bt_set_str(t, r, c++, o->lab.size);
            bt_set_num(t, r, c++, j->n_new);
            bt_set_num(t, r, c++, tg->max_tokens > 0 ? tg->max_tokens / 1024 : NAN);
            bt_set_num(t, r, c++, j->batch);
            bt_set_num(t, r, c++, o->lab.nchip);
            bt_set_num(t, r, c++, j->n_prefix + j->n_new);
            bt_set_num(t, r, c++, j->n_out);
            MED(c, prefill_tps, 1), c++;
            MED(c, ttft, 1e3), c++;
            MED(c, decode_tps, 1), c++;
            MED(c, tpot, 1e3), c++;
            bt_set_str(t, r, c++, prof);
            bt_set_num(t, r, c++, j->n_prefix);
            bt_set_num(t, r, c++, n_out);
        } else if (!strcmp(o->profile, "speed")) {
            bt_set_str(t, r, c++, o->lab.model);
            bt_set_num(t, r, c++, j->n_new);
            bt_set_str(t, r, c++, o->lab.precision);
            bt_set_num(t, r, c++, o->lab.nchip);
            MED(c, speed, 1), c++;
            bt_set_num(t, r, c++, mem / (1 << 20));
            bt_set_num(t, r, c++, n_out);
            MED(c, ttft, 1e3), c++;
            MED(c, prefill_tps, 1), c++;
            MED(c, decode_tps, 1), c++;
            MED(c, tpot, 1e3), c++;
            MED(c, total, 1), c++;
        } else {
            bt_set_str(t, r, c++, o->lab.model);
            bt_set_num(t, r, c++, o->lab.nchip);
            bt_set_num(t, r, c++, j->batch);
            bt_set_num(t, r, c++, j->n_new);
            bt_set_num(t, r, c++, n_out);
            MED(c, total, 1), c++;
            MED(c, ttft, 1e3), c++;
            MED(c, tpot, 1e3), c++;
            MED(c, nonfirst_tput, 1), c++;
            MED(c, e2e_tput, 1), c++;
            bt_set_num(t, r, c++, mem / (1 << 20));
        }
    }
    bench_progress_end(&pr);
    free(obs.t_first), free(obs.t_end), free(obs.n_out), free(reps), free(ok), free(rows);
    return 0;
}
