/*
 * bench.c: `kiln bench`, the benchmark tool (docs/bench.md).
 *
 *   kiln bench [--profile prefix|speed|batch|pp-tg] [model options] ...
 *   kiln bench serve --url URL [--profile prefix|speed|batch|serving] ...
 *   kiln bench plot A.json [B.json ...] -o FILE.svg
 *
 * What is timed is stated in each table's footer and in src/bench/inproc.c
 * (in-process), src/bench/serve.c (over HTTP) and src/bench/profiles.c.
 * Tables go to stdout (or -o FILE); notes, defaults and the progress line go
 * to stderr.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/base.h"
#include "bench/bench.h"
#include "bench/inproc.h"
#include "bench/plot.h"
#include "bench/serve.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "format/dtype.h"
#include "kiln.h"

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: kiln bench [--profile prefix|speed|batch|pp-tg] [model options] [options]\n"
            "       kiln bench serve --url http://HOST:PORT [--profile prefix|speed|batch|serving] [options]\n"
            "       kiln bench plot A.json [B.json ...] -o FILE.svg [--label NAME ...]\n"
            "\n"
            "With no arguments: --profile prefix on --dummy qwen3-0.6b, the best backend present;\n"
            "on the CPU with shorter defaults (printed) so it ends in a few minutes.\n"
            "\n"
            "profiles (docs/bench.md has the definitions):\n"
            "  prefix   SGLang edge table: inputs 128..2000 without prefix, 500..16000 with a cached prefix\n"
            "           (250 new tokens); Prefill(tps), TTFT, Decode(tps), TPOT; budget 16384 tokens\n"
            "  speed    Qwen speed table: batch 1, inputs 1..129024, 2048 generated; Speed=(in+out)/time, memory\n"
            "  batch    MindIE table: batch 1..16 x input=output 1024..8192; total, first and non-first token\n"
            "           times and throughputs\n"
            "  pp-tg    llama-bench: pp<p> prefill and tg<n> decode tok/s, mean ± sd over -r runs\n"
            "  serving  (serve only) N requests at a rate or concurrency: TTFT/TPOT/ITL/E2E, throughputs\n"
            "\n"
            "options:\n"
            "  -r, --reps N           repetitions per row (default: 3; pp-tg 5; 1 on the CPU for profiles)\n"
            "  --output-len N         generated tokens per row (prefix 16, speed 2048, batch = input)\n"
            "  --gen-len N            same as --output-len\n"
            "  --inputs LIST          input lengths instead of the profile's (comma-separated)\n"
            "  --batches LIST         batch sizes (batch profile; default 1,2,4,8,16)\n"
            "  --max-input N          skip rows with more input tokens (0: none; CPU default for prefix: 2000)\n"
            "  -p LIST, -n LIST       pp-tg prompt lengths (default 512) and decode lengths (default 128)\n"
            "  -d, --depth LIST       pp-tg: run each test after that many cached tokens too (default 0;\n"
            "                         as llama-bench -d: \"tg128 @ d4096\")\n"
            "  --tg-batch B           pp-tg: the tg tests decode B sequences at once (t/s counts all their tokens)\n"
            "  --roofline             pp-tg on the CPU: measure the memory bandwidth between windows of 16 steps\n"
            "                         of each tg repetition and report decode GB/s as a share of it (roofline %%)\n"
            "  --quant Q              weight format, passed to the engine when it supports it\n"
            "  --no-warmup            time the first job too\n"
            "  --seed N               prompt token ids' seed (default 1234)\n"
            "  --format md|csv|json   output format (default md, or from -o's extension)\n"
            "  -o, --output FILE      write the table to FILE instead of stdout\n"
            "  --plot FILE.svg        also plot decode tok/s and TTFT against input length\n"
            "  --label NAME           name of this run in plots and JSON (default: model precision backend)\n"
            "  --progress, --no-progress  the progress line on stderr (default: when stderr is a terminal)\n"
            "serve options:\n"
            "  --url URL              server base URL (http://127.0.0.1:8000)\n"
            "  --model NAME           model name for requests (default: the first of GET /v1/models)\n"
            "  --token-range N        prompt ids drawn from [0, N) (default 10000, as sglang bench_one_batch)\n"
            "  --max-total-tokens N   the server's token budget, to skip rows that do not fit (default: unknown)\n"
            "  --context N            the server's context length, likewise\n"
            "  --num-prompts N        serving: requests (default 100)\n"
            "  --input-len N --output-len N  serving: lengths (default 1024 / 128)\n"
            "  --range-ratio R        serving: lengths uniform in [len*R, len] (default 1: exact)\n"
            "  --request-rate R       serving: Poisson arrivals at R req/s (default inf: all at once)\n"
            "  --max-concurrency N    serving: at most N requests in flight\n"
            "  --warmup-requests N    serving: untimed requests first (default 1)\n"
            "\n%s",
            cli_model_usage);
}

static int parse_int_arg(const char *opt, const char *v, int *out, int min) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < min || x > 1000000000L) {
        fprintf(stderr, "kiln bench: %s expects an integer >= %d, got '%s'\n", opt, min, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_list(const char *opt, const char *v, int **out, int *n) {
    int cap = 8;
    *n = 0;
    *out = kiln_malloc(sizeof(int) * (size_t)cap);
    const char *p = v;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > 100000000L || (*end && *end != ',')) {
            fprintf(stderr, "kiln bench: %s expects a comma-separated list of integers, got '%s'\n", opt, v);
            free(*out);
            *out = NULL;
            return -1;
        }
        if (*n == cap) *out = kiln_realloc(*out, sizeof(int) * (size_t)(cap *= 2));
        (*out)[(*n)++] = (int)x;
        p = *end ? end + 1 : end;
    }
    if (!*n) {
        fprintf(stderr, "kiln bench: %s: empty list\n", opt);
        return -1;
    }
    return 0;
}

static char *read_all(const char *path) {
    char err[256];
    char *s = kiln_read_file(path, NULL, err, sizeof err);
    if (!s) fprintf(stderr, "kiln bench: %s\n", err);
    return s;
}

static const char *ext_of(const char *path) {
    const char *d = strrchr(path, '.');
    return d ? d + 1 : "";
}

static void upper(char *dst, size_t cap, const char *s) {
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++) dst[i] = (s[i] >= 'a' && s[i] <= 'z') ? (char)(s[i] - 32) : s[i];
    dst[i] = 0;
}

/* writes t to -o FILE (or stdout), and the plot if asked */
static int emit(const struct bt_table *t, enum bt_format fmt, const char *out_path, const char *plot_path, const char *label) {
    FILE *f = out_path ? fopen(out_path, "w") : stdout;
    if (!f) {
        fprintf(stderr, "kiln bench: cannot write %s: %s\n", out_path, strerror(errno));
        return 1;
    }
    bt_write(t, fmt, f);
    if (out_path) {
        fclose(f);
        fprintf(stderr, "kiln bench: wrote %s\n", out_path);
    } else {
        fflush(stdout);
    }
    for (int i = 0; i < t->n_notes; i++) fprintf(stderr, "kiln bench: note: %s\n", t->notes[i]);
    if (plot_path) {
        char *buf = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&buf, &len);
        bt_write_json(t, m);
        fclose(m);
        FILE *pf = fopen(plot_path, "w");
        char err[256];
        const char *texts[1] = {buf}, *labels[1] = {label};
        int rc = pf ? bench_plot_svg(texts, labels, 1, t->title, pf, err, sizeof err) : -1;
        if (pf) fclose(pf);
        free(buf);
        if (rc) {
            fprintf(stderr, "kiln bench: plot %s: %s\n", plot_path, pf ? err : strerror(errno));
            return 1;
        }
        fprintf(stderr, "kiln bench: wrote %s\n", plot_path);
    }
    return 0;
}

static void common_meta(struct bt_table *t, const char *cmd0, int argc, char **argv, const char *label) {
    char date[64];
    bench_date(date, sizeof date);
    struct utsname u;
    char cpu[256] = "";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                if (c) snprintf(cpu, sizeof cpu, "%s", c + 2);
                cpu[strcspn(cpu, "\n")] = 0;
                break;
            }
        fclose(f);
    }
    if (uname(&u) == 0) bt_meta(t, "machine", "%s, %ld cores%s%s", u.machine, sysconf(_SC_NPROCESSORS_ONLN), *cpu ? ", " : "", cpu);
    bt_meta(t, "date", "%s", date);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s", cmd0);
    size_t n = strlen(cmd);
    for (int i = 1; i < argc && n + 2 < sizeof cmd; i++) n += (size_t)snprintf(cmd + n, sizeof cmd - n, " %s", argv[i]);
    bt_meta(t, "command", "%s", cmd);
    if (label) bt_meta(t, "label", "%s", label);
}

/* ==== kiln bench plot ==== */

static int cli_bench_plot(int argc, char **argv) {
    const char *out = NULL, *title = "kiln bench";
    const char **files = kiln_calloc((size_t)argc, sizeof *files), **labels = kiln_calloc((size_t)argc, sizeof *labels);
    int n = 0, n_lab = 0, rc = 2;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--label") && i + 1 < argc) labels[n_lab++] = argv[++i];
        else if (!strcmp(argv[i], "--title") && i + 1 < argc) title = argv[++i];
        else if (argv[i][0] == '-') {
            fprintf(stderr, "kiln bench plot: unknown option '%s'\n", argv[i]);
            goto done;
        } else files[n++] = argv[i];
    }
    if (!n || !out) {
        fprintf(stderr, "usage: kiln bench plot A.json [B.json ...] -o FILE.svg [--label NAME ...] [--title T]\n");
        goto done;
    }
    char **texts = kiln_calloc((size_t)n, sizeof *texts);
    rc = 1;
    for (int i = 0; i < n; i++)
        if (!(texts[i] = read_all(files[i]))) goto free_texts;
    FILE *f = fopen(out, "w");
    if (!f) {
        fprintf(stderr, "kiln bench plot: cannot write %s: %s\n", out, strerror(errno));
        goto free_texts;
    }
    char err[256];
    if (bench_plot_svg((const char *const *)texts, n_lab ? labels : NULL, n, title, f, err, sizeof err)) {
        fprintf(stderr, "kiln bench plot: %s\n", err);
        fclose(f);
        goto free_texts;
    }
    fclose(f);
    fprintf(stderr, "kiln bench plot: wrote %s\n", out);
    rc = 0;
free_texts:
    for (int i = 0; i < n; i++) free(texts[i]);
    free(texts);
done:
    free(files), free(labels);
    return rc;
}

/* ==== options shared by in-process and serve ==== */

struct cli_opts {
    struct bench_opts b;
    const char *profile, *out_path, *plot_path, *label, *quant, *url, *model_name;
    int fmt_set, reps_set, out_len_set, max_input_set, progress_set, roofline, tg_batch;
    enum bt_format fmt;
    int *pp, n_pp, *tg, n_tg, *depth, n_depth, *inputs, n_inputs, *batches, n_batches;
    int token_range, max_tokens, context;
    struct bench_serving_opts sv;
    int sv_in_set;
};

/* 1 consumed, 0 not ours, -1 error */
static int bench_opt(int argc, char **argv, int *i, struct cli_opts *c, int serve) {
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    static const char *valued[] = {"--profile", "-r", "--reps", "--output-len", "--gen-len", "--inputs", "--batches", "--max-input",
                                   "-p", "-n", "-d", "--depth", "--quant", "--seed", "--format", "-o", "--output", "--plot", "--label", "--url",
                                   "--model", "--token-range", "--num-prompts", "--input-len", "--range-ratio", "--request-rate",
                                   "--max-concurrency", "--warmup-requests", "--context", "--tg-batch", NULL};
    int is_valued = 0;
    for (int k = 0; valued[k]; k++) is_valued |= !strcmp(a, valued[k]);
    if (serve && !strcmp(a, "--max-total-tokens")) is_valued = 1;
    if (is_valued && !v) {
        fprintf(stderr, "kiln bench: %s needs a value\n", a);
        return -1;
    }
    if (!strcmp(a, "--profile")) c->profile = v;
    else if (!strcmp(a, "-r") || !strcmp(a, "--reps")) {
        if (parse_int_arg(a, v, &c->b.reps, 1)) return -1;
        c->reps_set = 1;
    } else if (!strcmp(a, "--output-len") || !strcmp(a, "--gen-len")) {
        if (parse_int_arg(a, v, &c->b.output_len, 1)) return -1;
        c->sv.output_len = c->b.output_len;
        c->out_len_set = 1;
    } else if (!strcmp(a, "--inputs")) {
        free(c->inputs);
        if (parse_list(a, v, &c->inputs, &c->n_inputs)) return -1;
    } else if (!strcmp(a, "--batches")) {
        free(c->batches);
        if (parse_list(a, v, &c->batches, &c->n_batches)) return -1;
    } else if (!strcmp(a, "--max-input")) {
        if (parse_int_arg(a, v, &c->b.max_input, 0)) return -1;
        c->max_input_set = 1;
    } else if (!strcmp(a, "-p")) {
        free(c->pp);
        if (parse_list(a, v, &c->pp, &c->n_pp)) return -1;
    } else if (!strcmp(a, "-n")) {
        free(c->tg);
        if (parse_list(a, v, &c->tg, &c->n_tg)) return -1;
    } else if (!strcmp(a, "-d") || !strcmp(a, "--depth")) {
        free(c->depth);
        if (parse_list(a, v, &c->depth, &c->n_depth)) return -1;
    } else if (!strcmp(a, "--quant")) {
        if (!serve) {
            fprintf(stderr, "kiln bench: --quant %s: this kiln's engine options have no --quant yet (quantized formats are "
                            "not built in)\n", v);
            return -1;
        }
        c->quant = v;
    } else if (!strcmp(a, "--seed")) {
        c->b.seed = strtoull(v, NULL, 10);
        c->sv.seed = c->b.seed;
    } else if (!strcmp(a, "--format")) {
        if (bt_parse_format(v, &c->fmt)) {
            fprintf(stderr, "kiln bench: --format expects md, csv or json, got '%s'\n", v);
            return -1;
        }
        c->fmt_set = 1;
    } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) c->out_path = v;
    else if (!strcmp(a, "--plot")) c->plot_path = v;
    else if (!strcmp(a, "--label")) c->label = v;
    else if (!strcmp(a, "--no-warmup")) {
        c->b.warmup = 0;
        c->sv.warmup_requests = 0;
        return 1;
    } else if (!serve && !strcmp(a, "--roofline")) {
        c->roofline = 1;
        return 1;
    } else if (!serve && !strcmp(a, "--tg-batch")) {
        if (parse_int_arg(a, v, &c->tg_batch, 1)) return -1;
    } else if (!strcmp(a, "--progress") || !strcmp(a, "--no-progress")) {
        c->b.progress = c->sv.progress = !strcmp(a, "--progress");
        c->progress_set = 1;
        return 1;
    } else if (serve && !strcmp(a, "--url")) c->url = v;
    else if (serve && !strcmp(a, "--model")) c->model_name = v;
    else if (serve && !strcmp(a, "--token-range")) {
        if (parse_int_arg(a, v, &c->token_range, 2)) return -1;
    } else if (serve && !strcmp(a, "--max-total-tokens")) {
        if (parse_int_arg(a, v, &c->max_tokens, 0)) return -1;
    } else if (serve && !strcmp(a, "--context")) {
        if (parse_int_arg(a, v, &c->context, 0)) return -1;
    } else if (serve && !strcmp(a, "--num-prompts")) {
        if (parse_int_arg(a, v, &c->sv.num_prompts, 1)) return -1;
    } else if (serve && !strcmp(a, "--input-len")) {
        if (parse_int_arg(a, v, &c->sv.input_len, 1)) return -1;
    } else if (serve && !strcmp(a, "--range-ratio")) c->sv.range_ratio = atof(v);
    else if (serve && !strcmp(a, "--request-rate")) c->sv.request_rate = strtod(v, NULL);
    else if (serve && !strcmp(a, "--max-concurrency")) {
        if (parse_int_arg(a, v, &c->sv.max_concurrency, 0)) return -1;
    } else if (serve && !strcmp(a, "--warmup-requests")) {
        if (parse_int_arg(a, v, &c->sv.warmup_requests, 0)) return -1;
    } else return 0;
    (*i)++;
    return 1;
}

static void cli_opts_init(struct cli_opts *c) {
    memset(c, 0, sizeof *c);
    bench_opts_default(&c->b);
    c->b.progress = isatty(2);
    c->sv = (struct bench_serving_opts){.num_prompts = 100, .input_len = 1024, .output_len = 128, .range_ratio = 1,
                                        .request_rate = INFINITY, .warmup_requests = 1, .seed = c->b.seed,
                                        .progress = c->b.progress};
}

static void cli_opts_free(struct cli_opts *c) { free(c->pp), free(c->tg), free(c->depth), free(c->inputs), free(c->batches); }

static void finish_formats(struct cli_opts *c) {
    if (!c->fmt_set && c->out_path) {
        if (bt_parse_format(ext_of(c->out_path), &c->fmt)) c->fmt = BT_MD;
    }
    c->b.inputs = c->inputs, c->b.n_inputs = c->n_inputs;
    c->b.batches = c->batches, c->b.n_batches = c->n_batches;
}

/* ==== kiln bench serve ==== */

static int cli_bench_serve(int argc, char **argv) {
    struct cli_opts c;
    cli_opts_init(&c);
    c.profile = "serving";
    int rc = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            bench_usage(stdout);
            rc = 0;
            goto out;
        }
        int r = bench_opt(argc, argv, &i, &c, 1);
        if (r < 0) goto out;
        if (!r) {
            fprintf(stderr, "kiln bench serve: unknown option '%s'\n", argv[i]);
            goto out;
        }
    }
    if (c.pp || c.tg || c.depth) {
        fprintf(stderr, "kiln bench serve: -p, -n and -d belong to kiln bench --profile pp-tg\n");
        goto out;
    }
    if (!c.url) {
        fprintf(stderr, "kiln bench serve: give --url http://HOST:PORT\n");
        goto out;
    }
    finish_formats(&c);
    char err[1024] = "";
    struct bench_serve_conn conn;
    if (bench_serve_connect(&conn, c.url, c.model_name, c.token_range, err, sizeof err)) {
        fprintf(stderr, "kiln bench serve: %s\n", err);
        rc = 1;
        goto out;
    }
    fprintf(stderr, "kiln bench serve: %s, model '%s'\n", c.url, conn.model);
    struct bt_table t;
    rc = 1;
    if (!strcmp(c.profile, "serving")) {
        if (bench_serving_run(&conn, &c.sv, &t, err, sizeof err)) {
            fprintf(stderr, "kiln bench serve: %s\n", err);
            goto out;
        }
    } else {
        if (!c.reps_set) c.b.reps = 3;
        c.b.profile = c.profile;
        snprintf(c.b.lab.model, sizeof c.b.lab.model, "%s", conn.model);
        snprintf(c.b.lab.size, sizeof c.b.lab.size, "-");
        upper(c.b.lab.precision, sizeof c.b.lab.precision, c.quant ? c.quant : "-");
        struct bench_target tg;
        bench_serve_target(&tg, &conn, c.max_tokens, c.context);
        int prc = bench_run_profile(&tg, &c.b, &t, err, sizeof err);
        bench_serve_target_free(&tg);
        if (prc) {
            fprintf(stderr, "kiln bench serve: %s\n", err);
            goto out;
        }
        bt_meta(&t, "target", "%s (OpenAI /v1/completions, streaming)", c.url);
    }
    bt_meta(&t, "model", "%s", conn.model);
    if (c.quant) bt_meta(&t, "precision", "%s", c.quant);
    bt_meta(&t, "backend", "server");
    common_meta(&t, "kiln bench serve", argc, argv, c.label);
    rc = emit(&t, c.fmt, c.out_path, c.plot_path, c.label);
    bt_free(&t);
out:
    cli_opts_free(&c);
    return rc;
}

/* ==== kiln bench (in-process) ==== */

int cli_bench(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "serve")) return cli_bench_serve(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "plot")) return cli_bench_plot(argc - 1, argv + 1);
    struct cli_opts c;
    cli_opts_init(&c);
    struct kiln_engine_opts eo = {0};
    int chunk_set = 0, mtt_set = 0, rc = 2;
    const char *quant_label = NULL;
    for (int i = 1; i < argc; i++) /* the engine may own --quant: only remember it for the tables */
        if (!strcmp(argv[i], "--quant") && i + 1 < argc) quant_label = argv[i + 1];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            bench_usage(stdout);
            rc = 0;
            goto out;
        }
        const char *a = argv[i];
        int r = cli_model_opt(argc, argv, &i, &eo);
        if (r < 0) goto out;
        if (r) {
            chunk_set |= !strcmp(a, "--chunk");
            mtt_set |= !strcmp(a, "--max-total-tokens");
            continue;
        }
        r = bench_opt(argc, argv, &i, &c, 0);
        if (r < 0) goto out;
        if (!r) {
            fprintf(stderr, "kiln bench: unknown option '%s' (kiln bench --help)\n", argv[i]);
            goto out;
        }
    }
    c.profile = c.profile ? c.profile : "prefix";
    if (strcmp(c.profile, "prefix") && strcmp(c.profile, "speed") && strcmp(c.profile, "batch") && strcmp(c.profile, "pp-tg")) {
        fprintf(stderr, "kiln bench: unknown profile '%s' (prefix, speed, batch, pp-tg; serving needs `kiln bench serve`)\n",
                c.profile);
        goto out;
    }
    finish_formats(&c);
    int pptg = !strcmp(c.profile, "pp-tg");
    int defaulted_model = !eo.model && !eo.dummy;
    if (defaulted_model) eo.dummy = "qwen3-0.6b";
    const char *backend = eo.backend && strcmp(eo.backend, "auto") ? eo.backend : backend_default_name();
    int cpu = !strcmp(backend, "cpu");
    char defaults[512] = "";
    size_t dn = 0;
#define NOTE_DEFAULT(...) dn += (size_t)snprintf(defaults + dn, sizeof defaults - dn, __VA_ARGS__)
    if (defaulted_model) NOTE_DEFAULT(" --dummy qwen3-0.6b");
    NOTE_DEFAULT(" --backend %s", backend);
    if (c.roofline && (!pptg || !cpu)) {
        fprintf(stderr, "kiln bench: --roofline belongs to --profile pp-tg on the CPU backend (it measures host memory)\n");
        goto out;
    }
    if (c.tg_batch > 1 && (!pptg || c.roofline)) {
        fprintf(stderr, "kiln bench: --tg-batch belongs to --profile pp-tg, without --roofline (which measures batch 1)\n");
        goto out;
    }
    if (pptg) {
        if (!c.pp) c.pp = kiln_malloc(sizeof(int)), c.pp[0] = 512, c.n_pp = 1;
        if (!c.tg) c.tg = kiln_malloc(sizeof(int)), c.tg[0] = 128, c.n_tg = 1;
        if (!c.reps_set) c.b.reps = 5;
    } else {
        if (c.pp || c.tg || c.depth) {
            fprintf(stderr, "kiln bench: -p, -n and -d belong to --profile pp-tg (profiles take --inputs and --output-len)\n");
            goto out;
        }
        if (!c.reps_set) c.b.reps = cpu ? 1 : 3, NOTE_DEFAULT(" -r %d", c.b.reps);
        if (cpu && !strcmp(c.profile, "prefix") && !c.max_input_set && !c.inputs)
            c.b.max_input = 2000, NOTE_DEFAULT(" --max-input 2000");
        if (!c.out_len_set) {
            int ol = !strcmp(c.profile, "prefix") ? 16 : !strcmp(c.profile, "speed") ? 2048 : 0;
            if (ol) NOTE_DEFAULT(" --output-len %d", ol);
        }
    }
    c.b.profile = c.profile;
    if (!mtt_set && !strcmp(c.profile, "prefix")) eo.max_total_tokens = 16384, NOTE_DEFAULT(" --max-total-tokens 16384");
    if (!mtt_set && pptg) { /* as llama-bench's context: what the longest test needs, so memory shows the model, not a big pool */
        int need = 0;
        for (int i = 0; i < c.n_pp; i++) need = c.pp[i] > need ? c.pp[i] : need;
        int dmax = 0;
        for (int i = 0; i < c.n_depth; i++) dmax = c.depth[i] > dmax ? c.depth[i] : dmax;
        need += dmax;
        /* --tg-batch: that many sequences hold their tokens at once, each in whole pages */
        const int tb = c.tg_batch > 1 ? c.tg_batch : 1, P = eo.page_size > 0 ? eo.page_size : 16;
        for (int i = 0; i < c.n_tg; i++) {
            const int seq = (c.tg[i] + 1 + dmax + P - 1) / P * P;
            need = tb * seq > need ? tb * seq : need;
        }
        eo.max_total_tokens = (need + 255) / 256 * 256;
        NOTE_DEFAULT(" --max-total-tokens %d", eo.max_total_tokens);
    }
    /* one forward per timed prompt where it is reasonable */
    if (!chunk_set) {
        int mx = 0;
        if (pptg)
            for (int i = 0; i < c.n_pp; i++) mx = c.pp[i] > mx ? c.pp[i] : mx;
        else if (c.inputs)
            for (int i = 0; i < c.n_inputs; i++) mx = c.inputs[i] > mx ? c.inputs[i] : mx;
        else mx = !strcmp(c.profile, "prefix") ? 2000 : !strcmp(c.profile, "speed") ? 129024 : 8192;
        if (!strcmp(c.profile, "prefix") && mx > 2000 && !c.inputs) mx = 2000;
        if (c.b.max_input > 0 && mx > c.b.max_input) mx = c.b.max_input;
        if (!strcmp(c.profile, "batch")) { /* the batch's prompts in as few forwards as 8,192 tokens allow */
            int mb = c.batches ? 1 : 16;
            for (int i = 0; i < c.n_batches; i++) mb = c.batches[i] > mb ? c.batches[i] : mb;
            const long long all = (long long)mx * mb;
            if (mx < 8192) mx = all < 8192 ? (int)all : 8192;
        }
        if (!pptg && mx > 16384) mx = 16384;
        eo.prefill_chunk = mx > 512 ? mx : 512;
    }
    fprintf(stderr, "kiln bench: --profile %s%s (chunk %d)%s\n", c.profile, defaults, eo.prefill_chunk,
            cpu && !pptg && !strcmp(c.profile, "prefix") && c.b.max_input == 2000 && !c.max_input_set
                ? "; the CPU defaults shorten the table: -r 3 --max-input 0 runs all of it"
                : "");
    kiln_engine *e = cli_open_engine(&eo, "bench");
    if (!e) {
        rc = 1;
        goto out;
    }
    const struct kiln_config *cfg = kiln_engine_config(e);
    struct bench_labels *lab = &c.b.lab;
    if (eo.dummy) {
        const char *d = strrchr(eo.dummy, '/'); /* a config.json path: its file name without .json */
        snprintf(lab->model, sizeof lab->model, "%s", d ? d + 1 : eo.dummy);
        size_t ml = strlen(lab->model);
        if (ml > 5 && !strcmp(lab->model + ml - 5, ".json")) lab->model[ml - 5] = 0;
    } else {
        char path[512];
        snprintf(path, sizeof path, "%s", eo.model);
        size_t pl = strlen(path);
        while (pl > 1 && path[pl - 1] == '/') path[--pl] = 0;
        const char *base = strrchr(path, '/');
        snprintf(lab->model, sizeof lab->model, "%.200s", base ? base + 1 : path);
    }
    double np = (double)kiln_engine_n_params(e), nb = (double)kiln_engine_param_bytes(e);
    snprintf(lab->size, sizeof lab->size, "%.2fB", np / 1e9);
    char wfmt[64];
    kiln_engine_weight_format(e, wfmt, sizeof wfmt); /* a checkpoint: what its weights are, not the config's dtype */
    upper(lab->precision, sizeof lab->precision, quant_label ? quant_label : eo.dummy ? (eo.dummy_dtype ? eo.dummy_dtype : "bf16") : wfmt);
    upper(lab->backend, sizeof lab->backend, kiln_engine_backend(e));
    lab->threads = eo.n_threads > 0 ? eo.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    lab->nchip = 1;
    char err[1024] = "";
    struct bt_table t;
    memset(&t, 0, sizeof t);
    int prc;
    if (pptg) {
        char size_s[32], params_s[32];
        snprintf(size_s, sizeof size_s, "%.2f GiB", nb / (1 << 30));
        snprintf(params_s, sizeof params_s, "%.2f B", np / 1e9);
        struct bench_pptg_opts po = {.pp = c.pp, .n_pp = c.n_pp, .tg = c.tg, .n_tg = c.n_tg, .depth = c.depth,
                                     .n_depth = c.n_depth, .reps = c.b.reps,
                                     .warmup = c.b.warmup, .seed = c.b.seed, .lab = *lab, .size_str = size_s,
                                     .params_str = params_s, .progress = c.b.progress, .roofline = c.roofline,
                                     .tg_batch = c.tg_batch};
        prc = bench_pptg(e, &po, &t, err, sizeof err);
    } else {
        struct bench_target tg;
        int mtt = eo.max_total_tokens > 0 ? eo.max_total_tokens : (cfg->max_pos < 32768 ? cfg->max_pos : 32768);
        bench_inproc_target(&tg, e, mtt, eo.prefill_chunk);
        prc = bench_run_profile(&tg, &c.b, &t, err, sizeof err);
        bench_inproc_free(&tg);
    }
    if (prc) {
        fprintf(stderr, "kiln bench: %s\n", err);
        if (t.n_rows == 0) {
            bt_free(&t);
            kiln_engine_close(e);
            rc = 1;
            goto out;
        }
        bt_note(&t, "stopped early: %s", err);
    }
    bt_meta(&t, "model", "%s", lab->model);
    bt_meta(&t, "precision", "%s", lab->precision);
    bt_meta(&t, "params", "%.3f B", np / 1e9);
    bt_meta(&t, "weights", "%.2f GiB", nb / (1 << 30));
    bt_meta(&t, "backend", "%s", lab->backend);
    bt_meta(&t, "threads", "%d", lab->threads);
    bt_meta(&t, "kv_cache", "%s, %.1f KB per token", kiln_engine_kv_dtype(e), kiln_engine_kv_token_bytes(e) / 1e3);
    bt_meta(&t, "target", "in-process");
    common_meta(&t, "kiln bench", argc, argv, c.label);
    rc = emit(&t, c.fmt, c.out_path, c.plot_path, c.label);
    if (prc) rc = 1;
    bt_free(&t);
    kiln_engine_close(e);
out:
    cli_opts_free(&c);
    return rc;
}
