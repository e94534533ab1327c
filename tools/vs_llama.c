/*
 * vs_llama.c: kiln and llama.cpp in one process, their runs alternated.
 *
 *   make vs-llama LLAMA_CPP=/path/to/llama.cpp   (its include/ and a build/bin of shared libraries)
 *   ./build/vs-llama KILN_MODEL GGUF [-t 2] [-p 512] [-n 128] [-d 0] [-r 8] [--kv-dtype f16|bf16|q8_0] [--dummy [--quant Q]]
 *
 * On a VM whose memory bandwidth moves by 1.5x from one minute to the next
 * (docs/benchmarks.md), two benchmark processes run one after the other
 * measure two machines. Here both engines are loaded once and take turns,
 * round by round (ABBA: kiln first in odd rounds, llama.cpp first in even
 * ones), and each round gives a ratio of two runs a few seconds apart; the
 * report is the median ratio over the rounds with its quartiles, next to
 * each engine's median rate. With -w W the tg pair of a round runs
 * interleaved instead, W decode steps of each engine in turn (tg_windows).
 *
 * Each engine does what its own benchmark does. pp: a prompt of p random
 * token ids in a fresh sequence (llama.cpp: one llama_decode of the batch,
 * as llama-bench with n_batch >= p; kiln: one kiln_seq_eval, last-token
 * logits), t/s = p / time. tg: n decode steps of one random token each
 * after an untimed first token (llama.cpp: llama_decode + llama_synchronize
 * per token; kiln: kiln_seq_eval with the logits read), t/s = n / time.
 * With -d D the tg steps follow D tokens of context (an untimed prefill of
 * D random ids, as llama-bench's "tg128 @ dD"; pp stays from an empty
 * cache), and kiln's share of the probe counts the cache it reads too.
 * llama.cpp's context is llama-bench's (n_ctx = max(p, D) + n + 1, n_batch 2048 or more,
 * n_ubatch 512, flash attention auto, the given threads, the KV cache type kiln's --kv-dtype
 * names: f16 (the default on both sides), bf16, or q8_0, with flash attention
 * on as llama.cpp needs for a quantized V cache); kiln's is
 * `kiln bench --profile pp-tg`'s. KILN_MODEL is a checkpoint folder or a
 * .gguf file, or with --dummy a built-in config whose weights kiln makes
 * (--quant as kiln bench's; GGUF should then hold weights of the same
 * shape and format). Neither engine's threads run
 * while the other's arm is timed but for the OpenMP workers' spin after a
 * llama_decode (a few milliseconds at an arm's start). The bandwidth probe
 * of `kiln bench --roofline` runs before the first round and after each
 * round's tg pair; kiln's decode (bytes read per token x tg rate) is given
 * as a share of the mean of the two probes around it.
 *
 * llama.cpp's code is not part of kiln: this file uses its public C API
 * (llama.h) and is built only when LLAMA_CPP names a build of it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/base.h"
#include "bench/bench.h"
#include "bench/stats.h"
#include "kiln.h"
#include "llama.h"

struct arms {
    kiln_engine *ke;
    struct llama_model *lm;
    struct llama_context *lc;
    float *logits;
    int32_t *ids; /* max(p, c) + n + 1 random ids below the smaller vocabulary */
    int p, n, c, threads; /* c: tokens before tg's timed steps (1, or -d's depth) */
};

/* kiln: pp (tg = 0) or tg; tokens per second, or -1 on an error */
static double kiln_run(struct arms *a, int tg) {
    char err[256];
    kiln_seq *s = kiln_seq_new(a->ke, err, sizeof err);
    if (!s) return fprintf(stderr, "vs-llama: kiln: %s\n", err), -1;
    double t0 = kiln_now(), rate = -1;
    int rc = 0;
    if (!tg) {
        rc = kiln_seq_eval(s, a->ids, a->p, a->logits, 0, err, sizeof err);
        if (!rc) rate = a->p / (kiln_now() - t0);
    } else {
        rc = kiln_seq_eval(s, a->ids, a->c, a->logits, 0, err, sizeof err);
        t0 = kiln_now();
        for (int i = 0; i < a->n && !rc; i++) rc = kiln_seq_eval(s, a->ids + a->c + i, 1, a->logits, 0, err, sizeof err);
        if (!rc) rate = a->n / (kiln_now() - t0);
    }
    if (rc) fprintf(stderr, "vs-llama: kiln: %s\n", err);
    kiln_seq_free(s);
    return rate;
}

/* llama.cpp decodes the k token ids from i as one batch and waits for it: 0, or -1 */
static int llama_step(struct arms *a, int i, int k) {
    if (llama_decode(a->lc, llama_batch_get_one(a->ids + i, k))) return fprintf(stderr, "vs-llama: llama_decode failed\n"), -1;
    llama_synchronize(a->lc);
    return 0;
}

static double llama_run(struct arms *a, int tg) {
    llama_memory_clear(llama_get_memory(a->lc), false);
    llama_set_n_threads(a->lc, a->threads, a->threads);
    double t0 = kiln_now();
    if (!tg) {
        if (llama_decode(a->lc, llama_batch_get_one(a->ids, a->p))) return fprintf(stderr, "vs-llama: llama_decode failed\n"), -1;
        llama_synchronize(a->lc);
        return a->p / (kiln_now() - t0);
    }
    if (llama_step(a, 0, a->c)) return -1;
    t0 = kiln_now();
    for (int i = 0; i < a->n; i++)
        if (llama_step(a, a->c + i, 1)) return -1;
    return a->n / (kiln_now() - t0);
}

/* tg with the two engines' decode steps interleaved (-w): windows of w
 * steps, kiln's and llama.cpp's in turn, the one that opens a window pair
 * alternating (first, then by window), each engine's rate its n steps
 * over the sum of its windows' times. Each engine decodes its own
 * sequence, both after the untimed context (one token, or -d's). On a
 * host whose bandwidth moves within seconds, a window pair of ~1 s sees
 * one state of it where two whole tg runs (~10 s on 1.7B) often see two.
 * 0, or -1 on an error. */
static int tg_windows(struct arms *a, int w, int first, double *rk, double *rl) {
    char err[256];
    kiln_seq *s = kiln_seq_new(a->ke, err, sizeof err);
    if (!s) return fprintf(stderr, "vs-llama: kiln: %s\n", err), -1;
    int rc = kiln_seq_eval(s, a->ids, a->c, a->logits, 0, err, sizeof err);
    llama_memory_clear(llama_get_memory(a->lc), false);
    llama_set_n_threads(a->lc, a->threads, a->threads);
    if (!rc && llama_step(a, 0, a->c)) rc = -2;
    double t[2] = {0, 0};
    for (int i0 = 0, win = 0; i0 < a->n && !rc; i0 += w, win++) {
        const int i1 = i0 + w < a->n ? i0 + w : a->n;
        for (int k = 0; k < 2 && !rc; k++) {
            const int e = (first + win + k) & 1; /* 0 kiln, 1 llama.cpp */
            const double t0 = kiln_now();
            for (int i = i0; i < i1 && !rc; i++) {
                if (!e) rc = kiln_seq_eval(s, a->ids + a->c + i, 1, a->logits, 0, err, sizeof err);
                else if (llama_step(a, a->c + i, 1)) rc = -2;
            }
            t[e] += kiln_now() - t0;
        }
    }
    kiln_seq_free(s);
    if (rc == -2) return -1; /* llama_step said why */
    if (rc) return fprintf(stderr, "vs-llama: kiln: %s\n", err), -1;
    *rk = a->n / t[0], *rl = a->n / t[1];
    return 0;
}

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static bool no_progress(float progress, void *user) {
    (void)progress, (void)user;
    return true;
}

static int usage(void) {
    fprintf(stderr, "usage: vs-llama KILN_MODEL GGUF [-t threads] [-p prompt] [-n gen] [-d depth] [-r rounds] [-w window] [--kv-dtype f16|bf16|q8_0] [--dummy [--quant Q]]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 3) return usage();
    struct kiln_engine_opts o = {.backend = "cpu", .kv_dtype = "f16"};
    const char *kmodel = argv[1], *gguf = argv[2];
    int threads = 2, p = 512, n = 128, d = 0, rounds = 8, dummy = 0, win = 0;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--dummy")) dummy = 1;
        else if (i + 1 >= argc) return usage();
        else if (!strcmp(argv[i], "-t")) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-p")) p = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n")) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-d")) d = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r")) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-w")) win = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv-dtype")) o.kv_dtype = argv[++i];
        else if (!strcmp(argv[i], "--quant")) o.quant = argv[++i];
        else return usage();
    }
    if (threads < 1 || p < 1 || n < 1 || d < 0 || rounds < 1 || win < 0) return usage();
    const int c = d > 0 ? d : 1, pc = p > c ? p : c; /* tg's context; the longest prompt either test decodes */
    if (dummy) o.dummy = kmodel;
    else o.model = kmodel;
    o.n_threads = threads, o.max_total_tokens = pc + n + 16, o.prefill_chunk = p;

    char err[256];
    struct arms a = {.p = p, .n = n, .c = c, .threads = threads};
    if (!(a.ke = kiln_engine_open(&o, err, sizeof err))) return fprintf(stderr, "vs-llama: kiln: %s\n", err), 1;
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.progress_callback = no_progress;
    if (!(a.lm = llama_model_load_from_file(gguf, mp))) return fprintf(stderr, "vs-llama: llama.cpp cannot load %s\n", gguf), 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(pc + n + 1), cp.n_batch = pc > 2048 ? (uint32_t)pc : 2048, cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = threads;
    if (!strcmp(o.kv_dtype, "f16")) cp.type_k = cp.type_v = GGML_TYPE_F16;
    else if (!strcmp(o.kv_dtype, "bf16")) cp.type_k = cp.type_v = GGML_TYPE_BF16;
    else if (!strcmp(o.kv_dtype, "q8_0")) cp.type_k = cp.type_v = GGML_TYPE_Q8_0, cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    else return fprintf(stderr, "vs-llama: --kv-dtype %s: llama.cpp's side takes f16, bf16 or q8_0\n", o.kv_dtype), 1;
    if (!(a.lc = llama_init_from_model(a.lm, cp))) return fprintf(stderr, "vs-llama: llama.cpp: no context\n"), 1;

    const int kv = kiln_engine_config(a.ke)->vocab, lv = llama_vocab_n_tokens(llama_model_get_vocab(a.lm));
    a.logits = kiln_malloc(sizeof(float) * (size_t)kv);
    a.ids = kiln_malloc(sizeof(int32_t) * (size_t)(pc + n + 1));
    struct kiln_rng rng;
    kiln_rng_seed(&rng, 1234);
    for (int i = 0; i < pc + n + 1; i++) a.ids[i] = (int32_t)(kiln_rng_next(&rng) % (uint64_t)(kv < lv ? kv : lv));

    printf("vs-llama: kiln %s, llama.cpp %s, %d threads, pp%d / tg%d", kmodel, gguf, threads, p, n);
    if (d) printf(" @ d%d", d);
    printf(", %d rounds (ABBA)", rounds);
    if (win) printf(", tg interleaved in windows of %d steps", win);
    printf("\n");
    printf("kiln: %s kernels; llama.cpp: %s\n", cpu_isa_name(cpu_isa()), llama_print_system_info());
    /* the same shapes on both sides, or the comparison means nothing */
    const double kp = (double)kiln_engine_n_params(a.ke), lp = (double)llama_model_n_params(a.lm);
    printf("parameters: kiln %.3f B, llama.cpp %.3f B; vocabularies %d / %d\n", kp / 1e9, lp / 1e9, kv, lv);
    if (kp > 1.01 * lp || lp > 1.01 * kp || kv != lv) printf("vs-llama: warning: the two models differ in shape\n");
    for (int tg = 0; tg < 2; tg++) { /* one untimed run of each, as both benchmarks warm up */
        if (kiln_run(&a, tg) < 0 || llama_run(&a, tg) < 0) return 1;
    }
    /* the bandwidth probe (kiln bench --roofline's) before the first round and after each round's tg
     * pair: kiln's decode as a share of the mean of the probes around it */
    /* bytes a tg step reads: the weights, and at depth the cache at the tg's mean context */
    const double kvb = kiln_engine_kv_token_bytes(a.ke) * (c + n / 2.0);
    const double bytes = kiln_engine_decode_bytes(a.ke) + (d ? kvb : 0);
    const int width = kiln_engine_load_width(a.ke) > 0 ? kiln_engine_load_width(a.ke) : 16;
    double *bw = kiln_malloc(sizeof(double) * (size_t)(rounds + 1)), *roof = kiln_malloc(sizeof(double) * (size_t)rounds);
    if ((bw[0] = bench_membw(threads, (size_t)BENCH_MEMBW_MIB << 20, 6, width)) <= 0) return fprintf(stderr, "vs-llama: no probe\n"), 1;
    double *r[2][2], *ratio[2];
    for (int tg = 0; tg < 2; tg++) {
        ratio[tg] = kiln_malloc(sizeof(double) * (size_t)rounds);
        for (int e = 0; e < 2; e++) r[tg][e] = kiln_malloc(sizeof(double) * (size_t)rounds);
    }
    char name[2][48];
    snprintf(name[0], sizeof name[0], "pp%d", p);
    snprintf(name[1], sizeof name[1], d ? "tg%d @ d%d" : "tg%d", n, d);
    for (int i = 0; i < rounds; i++)
        for (int tg = 0; tg < 2; tg++) {
            if (tg && win) {
                if (tg_windows(&a, win, i & 1, &r[1][0][i], &r[1][1][i])) return 1;
            } else
                for (int k = 0; k < 2; k++) {
                    const int e = (i + k) & 1; /* 0 kiln, 1 llama.cpp */
                    const double v = e ? llama_run(&a, tg) : kiln_run(&a, tg);
                    if (v < 0) return 1;
                    r[tg][e][i] = v;
                }
            ratio[tg][i] = r[tg][0][i] / r[tg][1][i];
            printf("round %d %s: kiln %.2f, llama.cpp %.2f tok/s, ratio %.3f", i + 1, name[tg], r[tg][0][i],
                   r[tg][1][i], ratio[tg][i]);
            if (tg) {
                if ((bw[i + 1] = bench_membw(threads, (size_t)BENCH_MEMBW_MIB << 20, 6, width)) <= 0) return 1;
                roof[i] = 100 * r[1][0][i] * bytes / 1e9 / (0.5 * (bw[i] + bw[i + 1]));
                printf("; probe %.1f GB/s, kiln at %.1f%% of it", bw[i + 1], roof[i]);
            }
            printf("\n");
            fflush(stdout);
        }
    printf("\n| test | kiln t/s (median) | llama.cpp t/s (median) | kiln / llama.cpp: median [quartiles] | kiln decode, %% of the probe |\n"
           "|---|---:|---:|---|---:|\n");
    for (int tg = 0; tg < 2; tg++) {
        printf("| %s | %.2f | %.2f | %.3f [%.3f, %.3f] |", name[tg], bench_percentile(r[tg][0], rounds, 50),
               bench_percentile(r[tg][1], rounds, 50), bench_percentile(ratio[tg], rounds, 50), bench_percentile(ratio[tg], rounds, 25),
               bench_percentile(ratio[tg], rounds, 75));
        if (tg)
            printf(" %.1f [%.1f, %.1f] (%.3f GB per token) |\n", bench_percentile(roof, rounds, 50), bench_percentile(roof, rounds, 25),
                   bench_percentile(roof, rounds, 75), bytes / 1e9);
        else printf(" |\n");
    }
    llama_free(a.lc);
    llama_model_free(a.lm);
    llama_backend_free();
    kiln_engine_close(a.ke);
    return 0;
}
