/* common.c: see common.h. */
#include "cli/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

const char *cli_model_usage =
    "model options:\n"
    "  -m, --model DIR|FILE   Hugging Face checkpoint directory, or a .gguf file\n"
    "  --dummy NAME|FILE      seeded random weights of a built-in config (qwen3-0.6b ... qwen3-235b-a22b) or a config.json\n"
    "  --dtype bf16|f16|f32   dummy weights' dtype (default bf16)\n"
    "  --quant FMT            dummy weights built quantized: fp8, gptq-int4, gptq-int8, awq, q8_0, q4_0, q4_1,\n"
    "                         q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs\n"
    "  --seed-weights N       dummy weights' seed (default 0)\n"
    "  --backend cpu|cuda     compute backend (default: the best present)\n"
    "  -t, --threads N        CPU threads (default: all cores)\n"
    "  --max-total-tokens N   KV cache capacity in tokens\n"
    "  --mem-fraction F       size the KV cache so that weights + KV use F of the device's memory (0 < F <= 1)\n"
    "  --page-size N          KV page size in tokens (default 16)\n"
    "  --kv-dtype T           KV cache rows: f32 (the CPU's default), f16 or bf16 (half the bytes), q8_0 (CPU:\n"
    "                         int8 in blocks of 32 with an f16 scale, 17/64 of the bytes); CUDA keeps bf16\n"
    "  --chunk N              most prompt tokens per forward (default 512)\n"
    "  -v                     log more\n";

static int need(int argc, char **argv, int i) {
    if (i + 1 >= argc) {
        fprintf(stderr, "kiln: %s needs a value\n", argv[i]);
        return -1;
    }
    return 0;
}

static int to_int(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < -2147483647L || v > 2147483647L) return -1;
    *out = (int)v;
    return 0;
}

int cli_model_opt(int argc, char **argv, int *i, struct kiln_engine_opts *o) {
    const char *a = argv[*i];
    int *iv = NULL;
    const char **sv = NULL;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) sv = &o->model;
    else if (!strcmp(a, "--dummy")) sv = &o->dummy;
    else if (!strcmp(a, "--dtype")) sv = &o->dummy_dtype;
    else if (!strcmp(a, "--quant")) sv = &o->quant;
    else if (!strcmp(a, "--kv-dtype")) sv = &o->kv_dtype;
    else if (!strcmp(a, "--backend")) sv = &o->backend;
    else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) iv = &o->n_threads;
    else if (!strcmp(a, "--max-total-tokens")) iv = &o->max_total_tokens;
    else if (!strcmp(a, "--page-size")) iv = &o->page_size;
    else if (!strcmp(a, "--chunk")) iv = &o->prefill_chunk;
    else if (!strcmp(a, "--mem-fraction")) {
        if (need(argc, argv, *i)) return -1;
        char *end;
        const char *v = argv[++*i];
        o->mem_fraction = strtod(v, &end);
        if (end == v || *end || !(o->mem_fraction > 0 && o->mem_fraction <= 1)) {
            fprintf(stderr, "kiln: --mem-fraction expects a number in (0, 1], got '%s'\n", v);
            return -1;
        }
        return 1;
    } else if (!strcmp(a, "--seed-weights")) {
        if (need(argc, argv, *i)) return -1;
        o->seed = strtoull(argv[++*i], NULL, 10);
        return 1;
    } else if (!strcmp(a, "-v")) {
        kiln_log_level = KILN_LOG_DEBUG;
        return 1;
    } else return 0;
    if (need(argc, argv, *i)) return -1;
    const char *v = argv[++*i];
    if (sv) *sv = v;
    else if (to_int(v, iv) || *iv < 0) {
        fprintf(stderr, "kiln: %s expects a non-negative integer, got '%s'\n", a, v);
        return -1;
    }
    return 1;
}

int cli_parse_ids(const char *s, int32_t **ids, int *n) {
    int cap = 16;
    *n = 0;
    *ids = kiln_malloc(sizeof(int32_t) * (size_t)cap);
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 0x7fffffff) {
            fprintf(stderr, "kiln: bad token id list near '%.20s'\n", p);
            free(*ids);
            *ids = NULL;
            return -1;
        }
        if (*n == cap) *ids = kiln_realloc(*ids, sizeof(int32_t) * (size_t)(cap *= 2));
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
        if (*p && *p != ',' && *p != ' ' && *p != '\n' && *p != '\t' && *p != '\r') {
            fprintf(stderr, "kiln: bad token id list near '%.20s'\n", p);
            free(*ids);
            *ids = NULL;
            return -1;
        }
    }
    return 0;
}

kiln_engine *cli_open_engine(const struct kiln_engine_opts *o, const char *cmd) {
    char err[1024] = "";
    if (!o->model && !o->dummy) {
        fprintf(stderr, "kiln %s: give a model: -m DIR or --dummy NAME\n", cmd);
        return NULL;
    }
    kiln_engine *e = kiln_engine_open(o, err, sizeof err);
    if (!e) fprintf(stderr, "kiln %s: %s\n", cmd, err);
    return e;
}
