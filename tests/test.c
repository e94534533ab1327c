/*
 * test.c: the one C test runner. `build/test-kiln` runs the fast groups;
 * `build/test-kiln NAME...` runs the named ones; `--list` lists them.
 * Groups never time anything: speed belongs to `kiln bench`.
 */
#include "test.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

int test_n_pass, test_n_fail;

void test_fail_at(const char *file, int line, const char *expr, const char *fmt, ...) {
    test_n_fail++;
    fprintf(stderr, "FAIL %s:%d: %s", file, line, expr);
    if (fmt && *fmt) {
        va_list ap;
        va_start(ap, fmt);
        fputs(": ", stderr);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fputc('\n', stderr);
}

void test_skip(const char *why) { fprintf(stderr, "  skipped: %s\n", why); }

#define GROUPS(X)                                                                         \
    X(base, 1, "number conversions, rng, file helpers")                                   \
    X(safetensors, 1, "safetensors parsing and its errors (truncated, overlapping, ...)") \
    X(config, 1, "config.json in transformers 4.x and 5.x spellings, bad configs")        \
    X(sampler, 1, "greedy, temperature, top-k/top-p/min-p sets, penalties, seeds, logit bias, masks")        \
    X(ops, 1, "CPU ops against plain reference loops")                                    \
    X(cpukernels, 1, "CPU kernel paths (scalar/AVX2/AVX-512/NEON) against references, odd shapes") \
    X(b12, 1, "BF16 in 12 bits: every bit pattern round-trips, escapes, matmuls bit for bit as BF16 on every ISA") \
    X(parity, 1, "HF transformers parity on every model fixture")                        \
    X(quant, 1, "GPTQ/AWQ/FP8/GGUF vs dequantized references, kernels, quantize, GGUF parser and tokenizer") \
    X(kv, 1, "KV page pool")                                                              \
    X(radix, 1, "radix prefix cache: match, split on partial match, insert swaps, LRU eviction under lock") \
    X(sched, 1, "scheduler: admission, chunked prefill, mixed steps, preemption, prefix reuse (synthetic model)") \
    X(serve, 1, "serving loop on the tiny model: concurrent greedy = solo, prefix reuse, preemption, pages freed") \
    X(serve_text, 1, "server text machines: stop strings across pieces, hold-back, <think> splitting, tool calls") \
    X(json, 1, "JSON validator (response_format json_object) and its vocabulary mask against brute force") \
    X(tokenizer, 1, "tokenizer.json BPE vectors, decode, streaming detokenizer")          \
    X(template, 1, "chat template vectors, Jinja subset, errors")                         \
    X(bench, 1, "kiln bench: metrics on a fake clock, tables, HTTP/SSE, profiles, tiny in-process runs")               \
    X(cuda, 0, "CUDA ops vs CPU ops and fixtures on a GPU (make test-cuda)")                \
    X(cuda_lost, 0, "a GPU context lost to a faulting kernel (the cuda group runs it in a process of its own)")

#define DECL(name, fast, desc) void test_##name(void);
GROUPS(DECL)

static const struct {
    const char *name;
    void (*fn)(void);
    int fast;
    const char *desc;
} groups[] = {
#define ROW(name, fast, desc) {#name, test_##name, fast, desc},
    GROUPS(ROW)};

int main(int argc, char **argv) {
    int n = (int)(sizeof groups / sizeof groups[0]);
    if (argc > 1 && !strcmp(argv[1], "--list")) {
        for (int i = 0; i < n; i++) printf("%-12s %s%s\n", groups[i].name, groups[i].desc, groups[i].fast ? "" : " (not run by default)");
        return 0;
    }
    if (getenv("KILN_TEST_VERBOSE")) kiln_log_level = KILN_LOG_DEBUG;
    else kiln_log_level = -1; /* tests provoke errors on purpose: keep stderr for failures */
    for (int i = 0; i < n; i++) {
        int run = argc == 1 ? groups[i].fast : 0;
        for (int a = 1; a < argc; a++) run |= !strcmp(argv[a], groups[i].name);
        if (!run) {
            /* a default run names what it left out (CI: the CUDA group, no GPU there) */
            if (argc == 1) fprintf(stderr, "[%s] skipped: not in the default run; %s\n", groups[i].name, groups[i].desc);
            continue;
        }
        int p0 = test_n_pass, f0 = test_n_fail;
        fprintf(stderr, "[%s] %s\n", groups[i].name, groups[i].desc);
        groups[i].fn();
        fprintf(stderr, "[%s] %d passed, %d failed\n", groups[i].name, test_n_pass - p0, test_n_fail - f0);
    }
    printf("%d passed, %d failed\n", test_n_pass, test_n_fail);
    return test_n_fail ? 1 : 0;
}
