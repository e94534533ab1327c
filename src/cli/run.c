/*
 * run.c: `kiln run`, `kiln logits` and `kiln inspect`.
 *
 * Their outputs are contracts other tools rely on: `run --print-ids` prints
 * only the generated ids, comma-separated, on one line; `logits --out FILE`
 * writes vocab little-endian float32 values; everything else (timings,
 * progress) goes to stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "format/gguf.h"
#include "kiln.h"
#include "tokenizer/tokenizer.h"

struct run_state {
    int print_ids, n;
    struct tok_stream *ts;
    double t_first;
};

static int on_token(int32_t id, void *ctx) {
    struct run_state *r = ctx;
    if (r->n == 0) r->t_first = kiln_now();
    if (r->print_ids) {
        printf("%s%d", r->n ? "," : "", id);
    } else if (r->ts) {
        char *out = NULL;
        size_t len = 0;
        if (tok_stream_push(r->ts, id, &out, &len) == 0 && len) fwrite(out, 1, len, stdout);
        free(out);
    } else {
        printf("%s%d", r->n ? "," : "", id);
    }
    fflush(stdout);
    r->n++;
    return 0;
}

static void run_usage(void) {
    fprintf(stderr,
            "usage: kiln run -m MODEL (--ids 1,2,3 | -p TEXT [--chat]) [-n N] [sampling] [--print-ids]\n"
            "  --ids LIST            prompt token ids\n"
            "  -p, --prompt TEXT     prompt text (needs the model's tokenizer.json)\n"
            "  --chat                wrap the prompt as a user message with the model's chat template\n"
            "  --enable-thinking 0|1 the template's thinking switch (Qwen3), with --chat\n"
            "  -n N                  tokens to generate (default 64)\n"
            "  --greedy              argmax decoding (the default without sampling options)\n"
            "  --temp T --top-k K --top-p P --min-p M --seed S\n"
            "  --repeat-penalty R --presence-penalty P --frequency-penalty F\n"
            "  --ignore-eos          do not stop at an end-of-sequence token\n"
            "  --print-ids           print only the generated ids, comma-separated\n%s",
            cli_model_usage);
}

int cli_run(int argc, char **argv) {
    struct kiln_engine_opts o = {0};
    struct kiln_sampling sp = sampling_default();
    sp.temperature = 0;
    const char *ids_s = NULL, *prompt = NULL;
    int n_gen = 64, chat = 0, print_ids = 0, ignore_eos = 0, thinking = -1, seed_set = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_model_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        static const char *with_value[] = {"--ids", "-p", "--prompt", "-n", "--enable-thinking", "--temp", "--top-k", "--top-p",
                                           "--min-p", "--repeat-penalty", "--presence-penalty", "--frequency-penalty", "--seed", NULL};
        for (int k = 0; with_value[k]; k++)
            if (!strcmp(a, with_value[k])) {
                if (!v) {
                    fprintf(stderr, "kiln run: %s needs a value\n", a);
                    return 2;
                }
                i++;
            }
        if (!strcmp(a, "--ids")) ids_s = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "-n")) n_gen = atoi(v);
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--enable-thinking")) thinking = atoi(v) != 0;
        else if (!strcmp(a, "--greedy")) sp.temperature = 0;
        else if (!strcmp(a, "--temp")) sp.temperature = (float)atof(v);
        else if (!strcmp(a, "--top-k")) sp.top_k = atoi(v);
        else if (!strcmp(a, "--top-p")) sp.top_p = (float)atof(v);
        else if (!strcmp(a, "--min-p")) sp.min_p = (float)atof(v);
        else if (!strcmp(a, "--repeat-penalty")) sp.repetition_penalty = (float)atof(v);
        else if (!strcmp(a, "--presence-penalty")) sp.presence_penalty = (float)atof(v);
        else if (!strcmp(a, "--frequency-penalty")) sp.frequency_penalty = (float)atof(v);
        else if (!strcmp(a, "--seed")) sp.seed = strtoull(v, NULL, 10), seed_set = 1;
        else if (!strcmp(a, "--print-ids")) print_ids = 1;
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) return run_usage(), 0;
        else {
            fprintf(stderr, "kiln run: unknown option '%s'\n", a);
            run_usage();
            return 2;
        }
    }
    if (!ids_s == !prompt) {
        fprintf(stderr, "kiln run: give exactly one of --ids or -p\n");
        run_usage();
        return 2;
    }
    if (n_gen < 0 || sp.temperature < 0 || sp.top_k < 0 || sp.top_p <= 0 || sp.top_p > 1 || sp.min_p < 0 || sp.min_p > 1 ||
        sp.repetition_penalty <= 0) {
        fprintf(stderr, "kiln run: sampling options out of range\n");
        return 2;
    }
    if (!seed_set) sp.seed = (uint64_t)time(NULL);

    int rc = 1;
    int32_t *ids = NULL;
    int n_ids = 0;
    struct kiln_tokenizer *tok = NULL;
    char err[1024] = "";
    kiln_engine *e = cli_open_engine(&o, "run");
    if (!e) return 1;
    const char *dir = kiln_engine_model_dir(e);
    if (dir) { /* a checkpoint folder with tokenizer.json, or a GGUF file */
        char *tj = kiln_path_join(dir, "tokenizer.json");
        if (kiln_file_exists(tj) || kiln_gguf_is_file(dir)) tok = tok_load(dir, err, sizeof err);
        free(tj);
    }
    if (prompt) {
        if (!tok) {
            fprintf(stderr, "kiln run: -p needs the model's tokenizer.json%s%s\n", *err ? ": " : "", err);
            goto out;
        }
        char *text = NULL;
        if (chat) {
            size_t n = strlen(prompt);
            char *msg = kiln_malloc(n * 6 + 64), *q = msg;
            q += sprintf(q, "[{\"role\":\"user\",\"content\":\"");
            for (const unsigned char *c = (const unsigned char *)prompt; *c; c++) {
                if (*c == '"' || *c == '\\') *q++ = '\\', *q++ = (char)*c;
                else if (*c < 0x20) q += sprintf(q, "\\u%04x", *c);
                else *q++ = (char)*c;
            }
            sprintf(q, "\"}]");
            text = tok_apply_chat_template(tok, msg, 1, thinking, err, sizeof err);
            free(msg);
            if (!text) {
                fprintf(stderr, "kiln run: chat template: %s\n", err);
                goto out;
            }
            prompt = text;
        }
        if (tok_encode(tok, prompt, strlen(prompt), &ids, &n_ids, err, sizeof err)) {
            fprintf(stderr, "kiln run: %s\n", err);
            free(text);
            goto out;
        }
        free(text);
    } else if (cli_parse_ids(ids_s, &ids, &n_ids)) {
        goto out;
    }
    if (n_ids == 0) {
        fprintf(stderr, "kiln run: empty prompt\n");
        goto out;
    }
    struct run_state st = {.print_ids = print_ids || !tok};
    if (tok && !st.print_ids) st.ts = tok_stream_new(tok, 1);
    double t0 = kiln_now();
    int n = kiln_generate(e, ids, n_ids, n_gen, &sp, ignore_eos, on_token, &st, err, sizeof err);
    double t1 = kiln_now();
    if (st.ts) {
        char *out = NULL;
        size_t len = 0;
        if (tok_stream_flush(st.ts, &out, &len) == 0 && len) fwrite(out, 1, len, stdout);
        free(out);
        tok_stream_free(st.ts);
    }
    printf("\n");
    if (n < 0) {
        fprintf(stderr, "kiln run: %s\n", err);
        goto out;
    }
    if (n > 0) {
        double pre = st.t_first - t0, dec = t1 - st.t_first;
        fprintf(stderr, "kiln: prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens, %.1f tok/s after the first\n", n_ids,
                pre, n_ids / pre, n, n > 1 ? (n - 1) / dec : 0.0);
    }
    rc = 0;
out:
    free(ids);
    if (tok) tok_free(tok);
    kiln_engine_close(e);
    return rc;
}

int cli_logits(int argc, char **argv) {
    struct kiln_engine_opts o = {0};
    const char *ids_s = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_model_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(argv[i], "--ids") && i + 1 < argc) ids_s = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else {
            fprintf(stderr, "usage: kiln logits -m MODEL --ids 1,2,3 --out FILE\n%s", cli_model_usage);
            return 2;
        }
    }
    if (!ids_s || !out) {
        fprintf(stderr, "usage: kiln logits -m MODEL --ids 1,2,3 --out FILE\n%s", cli_model_usage);
        return 2;
    }
    int32_t *ids;
    int n;
    if (cli_parse_ids(ids_s, &ids, &n)) return 2;
    if (!n) {
        fprintf(stderr, "kiln logits: empty --ids\n");
        free(ids);
        return 2;
    }
    kiln_engine *e = cli_open_engine(&o, "logits");
    if (!e) {
        free(ids);
        return 1;
    }
    int V = kiln_engine_config(e)->vocab, rc = 1;
    float *lg = kiln_malloc(sizeof(float) * (size_t)V);
    char err[1024];
    kiln_seq *s = kiln_seq_new(e, err, sizeof err);
    if (kiln_seq_eval(s, ids, n, lg, 0, err, sizeof err)) {
        fprintf(stderr, "kiln logits: %s\n", err);
    } else {
        FILE *f = fopen(out, "wb");
        if (!f || fwrite(lg, sizeof(float), (size_t)V, f) != (size_t)V || fclose(f)) {
            fprintf(stderr, "kiln logits: cannot write %s\n", out);
        } else {
            rc = 0;
        }
    }
    kiln_seq_free(s);
    free(lg);
    free(ids);
    kiln_engine_close(e);
    return rc;
}

int cli_inspect(int argc, char **argv) {
    struct kiln_engine_opts o = {0};
    for (int i = 1; i < argc; i++) {
        int r = cli_model_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (!r) {
            fprintf(stderr, "usage: kiln inspect -m MODEL\n%s", cli_model_usage);
            return 2;
        }
    }
    if (!o.max_total_tokens) o.max_total_tokens = 4096;
    kiln_engine *e = cli_open_engine(&o, "inspect");
    if (!e) return 1;
    kiln_engine_describe(e, stdout);
    kiln_engine_close(e);
    return 0;
}
