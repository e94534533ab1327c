/*
 * tokenize.c: `kiln tokenize` and `kiln template`, thin front-ends over
 * src/tokenizer/ for scripts, tests and the tokenizer benchmark.
 *
 *   kiln tokenize -m MODEL [--lines] [--time]    stdin text -> ids "1,2,3"
 *   kiln tokenize -m MODEL --decode [--skip-special]   stdin ids -> text
 *   kiln template -m MODEL --messages FILE.json [--add-generation-prompt]
 *                 [--enable-thinking 0|1] [--chat-template FILE]
 *
 * stdin is read whole and used byte for byte (no newline stripping). --time
 * reports load time and encode throughput on stderr, timing only the calls
 * into the tokenizer (not reading stdin or printing).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "tokenizer/tokenizer.h"

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = kiln_malloc(cap);
    for (;;) {
        if (n + 1 >= cap) buf = kiln_realloc(buf, cap *= 2);
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static void print_ids(FILE *f, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", (int)ids[i]);
    fputc('\n', f);
}

static int tokenize_usage(void) {
    fprintf(stderr, "usage: kiln tokenize -m MODEL [--lines] [--time]   (UTF-8 text on stdin -> ids)\n"
                    "       kiln tokenize -m MODEL --decode [--skip-special]   (ids on stdin -> text)\n"
                    "  --lines   encode each line (with its newline) on its own, one output line each\n"
                    "  --time    report load time and encode MB/s on stderr\n");
    return 2;
}

static int decode_stdin(const struct kiln_tokenizer *t, int skip_special) {
    size_t n;
    char *text = read_all(stdin, &n);
    int32_t *ids = NULL;
    int n_ids = 0, cap = 0;
    char *p = text;
    char err[512];
    while (*p) {
        if (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < -2147483647L || v > 2147483647L) {
            fprintf(stderr, "kiln tokenize: not a token id: '%.20s'\n", p);
            free(text);
            free(ids);
            return 1;
        }
        if (n_ids == cap) ids = kiln_realloc(ids, (size_t)(cap = cap ? cap * 2 : 256) * sizeof *ids);
        ids[n_ids++] = (int32_t)v;
        p = end;
    }
    free(text);
    size_t len;
    char *out = tok_decode(t, ids, n_ids, skip_special, &len, err, sizeof err);
    free(ids);
    if (!out) {
        fprintf(stderr, "kiln tokenize: %s\n", err);
        return 1;
    }
    fwrite(out, 1, len, stdout);
    free(out);
    return 0;
}

int cli_tokenize(int argc, char **argv) {
    const char *model = NULL;
    int decode = 0, skip_special = 0, timing = 0, lines = 0;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--decode")) decode = 1;
        else if (!strcmp(argv[i], "--skip-special")) skip_special = 1;
        else if (!strcmp(argv[i], "--time") || !strcmp(argv[i], "--bench")) timing = 1;
        else if (!strcmp(argv[i], "--lines")) lines = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return tokenize_usage(), 0;
        else {
            fprintf(stderr, "kiln tokenize: unknown option '%s'\n", argv[i]);
            return tokenize_usage();
        }
    }
    if (!model) return tokenize_usage();
    char err[512];
    double t0 = kiln_now();
    struct kiln_tokenizer *t = tok_load(model, err, sizeof err);
    double t_load = kiln_now() - t0;
    if (!t) {
        fprintf(stderr, "kiln tokenize: %s\n", err);
        return 1;
    }
    if (decode) {
        int rc = decode_stdin(t, skip_special);
        tok_free(t);
        return rc;
    }
    size_t n;
    char *text = read_all(stdin, &n);
    double t_enc = 0;
    long n_tokens = 0;
    int rc = 0;
    for (size_t off = 0; off < n || (off == 0 && n == 0);) {
        size_t end = n;
        if (lines) {
            const char *nl = memchr(text + off, '\n', n - off);
            if (nl) end = (size_t)(nl - text) + 1;
        }
        int32_t *ids;
        int n_ids;
        double t1 = kiln_now();
        if (tok_encode(t, text + off, end - off, &ids, &n_ids, err, sizeof err)) {
            fprintf(stderr, "kiln tokenize: %s\n", err);
            rc = 1;
            break;
        }
        t_enc += kiln_now() - t1;
        n_tokens += n_ids;
        print_ids(stdout, ids, n_ids);
        free(ids);
        off = end;
        if (n == 0) break;
    }
    if (timing && !rc)
        fprintf(stderr, "load: %.1f ms\nencode: %zu bytes, %ld tokens, %.1f ms, %.2f MB/s%s\n", t_load * 1e3, n,
                n_tokens, t_enc * 1e3, t_enc > 0 ? (double)n / 1e6 / t_enc : 0.0, lines ? " (per line)" : "");
    free(text);
    tok_free(t);
    return rc;
}

static int template_usage(void) {
    fprintf(stderr, "usage: kiln template -m MODEL --messages FILE.json [--add-generation-prompt]\n"
                    "                     [--enable-thinking 0|1] [--chat-template FILE]\n"
                    "  FILE.json is an array of messages or {\"messages\": [...], \"tools\": [...]}\n");
    return 2;
}

int cli_template(int argc, char **argv) {
    const char *model = NULL, *messages = NULL, *tpl_file = NULL;
    int add_gen = 0, thinking = -1;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--messages") && i + 1 < argc) messages = argv[++i];
        else if (!strcmp(argv[i], "--chat-template") && i + 1 < argc) tpl_file = argv[++i];
        else if (!strcmp(argv[i], "--add-generation-prompt")) add_gen = 1;
        else if (!strcmp(argv[i], "--enable-thinking") && i + 1 < argc) {
            const char *v = argv[++i];
            if (strcmp(v, "0") && strcmp(v, "1")) {
                fprintf(stderr, "kiln template: --enable-thinking takes 0 or 1\n");
                return 2;
            }
            thinking = v[0] - '0';
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return template_usage(), 0;
        else {
            fprintf(stderr, "kiln template: unknown option '%s'\n", argv[i]);
            return template_usage();
        }
    }
    if ((!model && !tpl_file) || !messages) return template_usage();
    char err[1024];
    char *json = kiln_read_file(messages, NULL, err, sizeof err);
    if (!json) {
        fprintf(stderr, "kiln template: %s\n", err);
        return 1;
    }
    struct kiln_tokenizer *t = NULL;
    if (model && !(t = tok_load(model, err, sizeof err))) {
        fprintf(stderr, "kiln template: %s\n", err);
        free(json);
        return 1;
    }
    char *out;
    if (tpl_file) {
        char *tpl = kiln_read_file(tpl_file, NULL, err, sizeof err);
        out = tpl ? tok_render_template(tpl, json, add_gen, thinking, t ? tok_bos_token(t) : NULL,
                                        t ? tok_eos_token(t) : NULL, err, sizeof err)
                  : NULL;
        free(tpl);
    } else {
        out = tok_apply_chat_template(t, json, add_gen, thinking, err, sizeof err);
    }
    free(json);
    tok_free(t);
    if (!out) {
        fprintf(stderr, "kiln template: %s\n", err);
        return 1;
    }
    fputs(out, stdout);
    free(out);
    return 0;
}
