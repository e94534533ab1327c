/*
 * test_quant.c: quantized checkpoints (tests/fixtures/quant, made by
 * tools/make_quant_fixtures.py with numpy, safetensors and llama.cpp's gguf
 * package):
 *
 *   - every GPTQ / AWQ / FP8 / GGUF variant against the same model holding
 *     the dequantized weights in F32 (dequantized by the generator, for GGUF
 *     by gguf.quants.dequantize): all-position logits within 1e-3 and the
 *     same greedy tokens, exact kernels (KILN_QACT=f32);
 *   - the int8-activation kernels (GGUF Q8_0/Q4_0/Q4_K, the default) against
 *     the same reference within a stated looser bound;
 *   - GGUF files converted from the repository's tiny fixtures against kiln's
 *     safetensors path on the original bf16 weights (tolerance per file in
 *     the manifest: the quantization error itself);
 *   - kernels on random blocks vs the reference dequantization, quantize
 *     round trips, config errors for unsupported combinations, the GGUF
 *     parser on truncated and corrupted files, the tokenizer synthesized
 *     from GGUF metadata, dummy weights in every format;
 *   - a forced instruction set (KILN_CPU_ISA, cpu_set_isa) bounds every
 *     kernel dispatch of a whole forward, per format.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/qmatmul_internal.h"
#include "backend/cuda/w4pack.h"
#include "base/base.h"
#include "engine/engine_internal.h"
#include "format/config.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "format/quantize.h"
#include "kiln.h"
#include "model/model.h"
#include "ref.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

#define QDIR FIXTURES "/quant"

static const int32_t prompt[] = {1, 17, 42, 99, 5, 64, 120, 3, 77, 8, 31, 90, 2, 11, 55, 100, 7, 63, 21, 44};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))

/* every position's logits on the CPU, in chunks of 6 (prefill and cache reuse) */
static float *all_logits(const char *path, int *vocab, char *err, size_t errlen) {
    return ref_prompt_logits(path, "cpu", prompt, NP, 6, vocab, err, errlen);
}

static float maxdiff(const float *a, const float *b, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* quantized vs reference: max |delta| over all positions, top-1 agreement */
static void compare(const char *q, const char *ref, float tol, const char *what) {
    char pq[512], pr[512], err[1024] = "";
    snprintf(pq, sizeof pq, "%s/%s", QDIR, q);
    snprintf(pr, sizeof pr, "%s/%s", strchr(ref, '/') || !strncmp(ref, "micro", 5) || strstr(ref, "-ref") ? QDIR : FIXTURES, ref);
    int V1 = 0, V2 = 0;
    float *a = all_logits(pq, &V1, err, sizeof err);
    CHECK(a != NULL, "%s: %s", q, err);
    float *b = all_logits(pr, &V2, err, sizeof err);
    CHECK(b != NULL, "%s: %s", ref, err);
    if (a && b && V1 == V2) {
        float d = maxdiff(a, b, (size_t)V1 * NP);
        int agree = 0;
        for (int t = 0; t < NP; t++) agree += argmax(a + (size_t)t * V1, V1) == argmax(b + (size_t)t * V1, V1);
        if (tol < 0) { /* relative to the largest reference logit */
            float mx = 0;
            for (size_t i = 0; i < (size_t)V1 * NP; i++) mx = fmaxf(mx, fabsf(b[i]));
            tol = -tol * mx;
        }
        CHECK(d <= tol, "%s vs %s (%s): max |delta| %g > %g", q, ref, what, d, tol);
        if (getenv("KILN_TEST_VERBOSE"))
            fprintf(stderr, "  %-34s vs %-30s %-6s max |delta| %.3g, top-1 %d/%d\n", q, ref, what, d, agree, NP);
    }
    free(a);
    free(b);
}

static void test_pairs(void) {
    char err[256];
    char *txt = kiln_read_file(QDIR "/manifest.json", NULL, err, sizeof err);
    CHECK(txt != NULL, "%s", err);
    if (!txt) return;
    cJSON *m = cJSON_Parse(txt);
    free(txt);
    const cJSON *p;
    setenv("KILN_QACT", "f32", 1);
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(m, "pairs")) compare(cJSON_GetArrayItem(p, 0)->valuestring, cJSON_GetArrayItem(p, 1)->valuestring, 1e-3f, "exact");
    unsetenv("KILN_QACT");
    /* int8 activations (llama.cpp's method): rounding x to 8 bits per block
     * of 32 costs up to ~0.4% per dot product, compounded over the layers:
     * bound max |delta| by 4% of the largest logit */
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(m, "pairs")) {
        const char *q = cJSON_GetArrayItem(p, 0)->valuestring;
        if (strstr(q, ".gguf") && (strstr(q, "q8_0") || strstr(q, "q4_0") || strstr(q, "kmix") || strstr(q, "iq4mix") || strstr(q, "k23mix")))
            compare(q, cJSON_GetArrayItem(p, 1)->valuestring, -0.04f, "int8");
        /* GPTQ / AWQ 4-bit (g32/g64/g128, per-channel, sym/asym, act-order,
         * MoE) on the int8-activation path: the same per-block rounding of
         * x as the GGUF blocks (the weights' s and b enter in f32), so the
         * same bound */
        if ((strstr(q, "gptq") || strstr(q, "awq")) && strstr(q, "int4"))
            compare(q, cJSON_GetArrayItem(p, 1)->valuestring, -0.04f, "int8");
    }
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(m, "gguf_vs_st")) {
        compare(cJSON_GetArrayItem(p, 0)->valuestring, cJSON_GetArrayItem(p, 1)->valuestring, (float)cJSON_GetArrayItem(p, 2)->valuedouble,
                "vs-st");
    }
    cJSON_Delete(m);
}

/* ==== kernels on random blocks vs the reference dequantization ==== */

static void *test_alloc(void *ctx, size_t n) {
    void ***list = ctx;
    void *p = kiln_malloc(n);
    size_t k = 0;
    while ((*list)[k]) k++;
    *list = kiln_realloc(*list, sizeof(void *) * (k + 2));
    (*list)[k] = p, (*list)[k + 1] = NULL;
    return p;
}

static void test_kernels(void) {
    char err[512];
    struct kiln_backend *be = backend_create("cpu", 0, err, sizeof err);
    CHECK(be != NULL, "%s", err);
    if (!be) return;
    const char *fmts[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "fp8", "gptq-int4", "gptq-int8", "awq"};
    const int N = 40, K = 512;
    float *x = kiln_malloc(sizeof(float) * 5 * K), *out = kiln_malloc(sizeof(float) * 5 * N), *W = kiln_malloc(sizeof(float) * N * K);
    struct kiln_rng r;
    kiln_rng_seed(&r, 7);
    for (int i = 0; i < 5 * K; i++) x[i] = kiln_rng_normal(&r);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0) setenv("KILN_QACT", "f32", 1);
        else unsetenv("KILN_QACT");
        for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
            void **owned = kiln_calloc(1, sizeof(void *));
            struct qlinear w = {.n_out = N, .n_in = K};
            int rc = quant_dummy_linear(&w, fmts[f], 64, 11 + f, 0.05f, test_alloc, &owned, err, sizeof err);
            CHECK(rc == 0, "%s: %s", fmts[f], err);
            if (rc == 0 && be->prepare_linear(be, &w, err, sizeof err) == 0) {
                quant_dequant_linear(&w, W);
                for (int n = 1; n <= 5; n += 2) {
                    be->matmul(be, out, x, &w, n);
                    double md = 0, scale = 0;
                    for (int t = 0; t < n; t++)
                        for (int o = 0; o < N; o++) {
                            double ref = 0, a = 0;
                            for (int k = 0; k < K; k++) ref += (double)W[(size_t)o * K + k] * x[(size_t)t * K + k], a += fabs(W[(size_t)o * K + k] * x[(size_t)t * K + k]);
                            md = fmax(md, fabs(ref - out[(size_t)t * N + o]));
                            scale = fmax(scale, a);
                        }
                    /* exact: f32 rounding only; int8: x rounded to 8 bits */
                    double tol = pass == 0 ? 1e-5 * scale : 3e-3 * scale;
                    CHECK(md <= tol, "%s n=%d %s: max |delta| %g > %g", fmts[f], n, pass ? "int8" : "exact", md, tol);
                    if (getenv("KILN_TEST_VERBOSE") && n == 5) fprintf(stderr, "  kernel %-10s %-5s max |delta| / sum |w x| = %.2e\n", fmts[f], pass ? "int8" : "exact", md / scale);
                }
#if defined(__x86_64__)
                /* decode: the int8 kernels' row order and prefetch (cpu.h) move no bit; the
                 * AVX2 kernels in place of the VNNI ones only the f32 order of the block sums */
                float *o1 = kiln_malloc(sizeof(float) * N), *o2 = kiln_malloc(sizeof(float) * N);
                be->matmul(be, o1, x, &w, 1);
                const int pf0 = cpu_qm_pfd(), two0 = cpu_qm_two(), vd0 = cpu_vnni_dec();
                for (int v = 0; v < 8; v++) {
                    cpu_set_qm_two(v & 1), cpu_set_qm_pfd(v & 2 ? 0 : 4096), cpu_set_vnni_dec(v >> 2);
                    memset(o2, 0xff, sizeof(float) * N);
                    be->matmul(be, o2, x, &w, 1);
                    double d = 0;
                    for (int o = 0; o < N; o++) d = fmax(d, fabs((double)o1[o] - o2[o]) / (fabs(o1[o]) + 1e-3));
                    CHECK(vd0 == (v >> 2) ? !memcmp(o1, o2, sizeof(float) * N) : d < 1e-4, "%s %s decode, streams %d, prefetch %d, vnni %d: rel %g",
                          fmts[f], pass ? "int8" : "exact", 1 + (v & 1), v & 2 ? 0 : 4096, v >> 2, d);
                }
                cpu_set_qm_two(two0), cpu_set_qm_pfd(pf0), cpu_set_vnni_dec(vd0);
                free(o1), free(o2);
#endif

                be->release_linear(be, &w);
            } else if (rc == 0) {
                CHECK(0, "%s: prepare: %s", fmts[f], err);
            }
            for (int i = 0; owned[i]; i++) free(owned[i]);
            free(owned);
        }
    }
    free(x), free(out), free(W);
    be->destroy(be);
}

/* The prefill kernels (int8 GEMM for Q8_0/Q4_0, the f32 GEMM on dequantized
 * panels for GPTQ/AWQ/FP8/exact GGUF) and the decode row dots on each
 * instruction set the CPU has, against the scalar path (itself checked
 * against the dequantized weights above): ragged shapes (rows not a
 * multiple of the 8/16/32-row panels, tokens not a multiple of the 4/6/8/12
 * token tiles, K of several blocks, bias on and off). The int8 sums are
 * exact, so paths differ only in the f32 order of the per-block terms. */
/* FP8 weights one at a time, bit for bit: every code but e4m3's two NaNs
 * in each row (K = 304: blocks of 128, 128 and 48, so each step width of
 * the vector kernels and a tail), each block with its own scale, against
 * one-hot activations, so each output is one weight times 1 plus zeros:
 * the dequantized weight itself (lut[q] * s) on every ISA, through the
 * fused decode (n = 1..4, every k) and the GEMM on dequantized panels
 * (n = K). The vector kernels build the weight from the code's f16 image
 * and s x 256 instead of the table. */
static void test_fp8_codes(void) {
    char err[512];
    struct kiln_backend *be = backend_create("cpu", 2, err, sizeof err);
    CHECK(be != NULL, "%s", err);
    if (!be) return;
    const int saved = cpu_isa(), N = 11, K = 304;
    void **owned = kiln_calloc(1, sizeof(void *));
    struct qlinear w = {.n_out = N, .n_in = K};
    int rc = quant_dummy_linear(&w, "fp8", 0, 77, 0.05f, test_alloc, &owned, err, sizeof err);
    CHECK(rc == 0, "fp8: %s", err);
    struct kiln_rng r;
    kiln_rng_seed(&r, 5);
    if (rc == 0) {
        uint8_t *q = (uint8_t *)w.w.data;
        for (int o = 0; o < N; o++)
            for (int k = 0; k < K; k++) {
                const uint8_t c = (uint8_t)(k + 37 * o);
                q[(size_t)o * K + k] = (c & 0x7f) == 0x7f ? c ^ 1 : c;
            }
        float *s = (float *)w.scales.data;
        for (int i = 0; i < w.scales.rows * w.scales.cols; i++) s[i] = 0.01f * (1.0f + kiln_rng_uniform(&r)) * (i & 1 ? 37.0f : 1.0f);
    }
    if (rc == 0 && be->prepare_linear(be, &w, err, sizeof err) == 0) {
        float *W = kiln_malloc(sizeof(float) * N * K), *x = kiln_calloc((size_t)K * K, sizeof(float)), *out = kiln_malloc(sizeof(float) * K * N);
        quant_dequant_linear(&w, W);
        for (int k = 0; k < K; k++) x[(size_t)k * K + k] = 1.0f; /* row t: one-hot at t */
        for (int isa = CPU_ISA_SCALAR; isa <= cpu_isa_max(); isa++) {
            cpu_set_isa(isa);
            static const int ns[] = {1, 2, 3, 4, 304};
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                int bad = 0;
                for (int t0 = 0; t0 < K; t0 += ns[ni]) {
                    const int n = K - t0 < ns[ni] ? K - t0 : ns[ni];
                    memset(out, 0xff, sizeof(float) * n * N);
                    be->matmul(be, out, x + (size_t)t0 * K, &w, n);
                    for (int t = 0; t < n; t++)
                        for (int o = 0; o < N; o++) bad += !(out[(size_t)t * N + o] == W[(size_t)o * K + t0 + t]);
                }
                CHECK(bad == 0, "%s fp8 one-hot n=%d: %d of %d weights not the dequantized ones bit for bit", cpu_isa_name(isa), ns[ni], bad, N * K);
            }
        }
        be->release_linear(be, &w);
        free(W), free(x), free(out);
    }
    for (int i = 0; owned[i]; i++) free(owned[i]);
    free(owned);
    cpu_set_isa(saved);
    be->destroy(be);
}

/* The K formats at the int16 limits of the GEMMs (qm_gemm_qk_avx2,
 * qm_gemm_q6k_avx2): every code at its extreme (Q4_K 15, Q5_K 31, Q6_K 31
 * and -32) against activations all at +127 or all at -127, where an int16
 * lane summing 16 Q5_K or Q6_K products would wrap; each ISA against the
 * scalar kernels at prefill and decode sizes (1, 4 and 9 sequences) */
static void test_kq_extremes(void) {
    char err[512];
    struct kiln_backend *be = backend_create("cpu", 2, err, sizeof err);
    CHECK(be != NULL, "%s", err);
    if (!be) return;
    const int saved = cpu_isa(), N = 27, K = 512, maxn = 20; /* one group of 16 rows (x86) and 11 rows past it */
    static const char *fmts[] = {"q4_k", "q5_k", "q6_k", "q6_k"};
    for (int f = 0; f < 4; f++) {
        void **owned = kiln_calloc(1, sizeof(void *));
        struct qlinear w = {.n_out = N, .n_in = K};
        CHECK(quant_dummy_linear(&w, fmts[f], 0, 7 + f, 0.05f, test_alloc, &owned, err, sizeof err) == 0, "%s", err);
        uint8_t *q = (uint8_t *)w.w.data;
        for (int r = 0; r < N * K / 256; r++) /* the code bits all ones (Q6_K: 31), or all zeros (Q6_K: -32) */
            if (f < 2) memset(q + (size_t)r * (f ? 176 : 144) + 16, 0xff, f ? 160 : 128);
            else memset(q + (size_t)r * 210, f == 2 ? 0xff : 0, 192);
        CHECK(be->prepare_linear(be, &w, err, sizeof err) == 0, "%s", err);
        float *x = kiln_malloc(sizeof(float) * maxn * K), *ref = kiln_malloc(sizeof(float) * maxn * N), *out = kiln_malloc(sizeof(float) * maxn * N);
        for (int sign = -1; sign <= 1; sign += 2) {
            for (int i = 0; i < maxn * K; i++) x[i] = (float)sign * (1.0f + (float)(i / K)); /* every block at amax: codes +-127 */
            static const int nks[] = {1, 4, 9, 20}; /* decode, 4 and 9 sequences (row dots), prefill (the GEMM) */
            for (int ni = 0; ni < 4; ni++) {
                const int n = nks[ni];
                cpu_set_isa(CPU_ISA_SCALAR);
                be->matmul(be, ref, x, &w, n);
                double scale = 0;
                for (int i = 0; i < n * N; i++) scale = fmax(scale, fabs(ref[i]));
                for (int isa = CPU_ISA_SCALAR + 1; isa <= cpu_isa_max(); isa++) {
                    cpu_set_isa(isa);
                    memset(out, 0xff, sizeof(float) * (size_t)n * N);
                    be->matmul(be, out, x, &w, n);
                    double md = 0;
                    for (int i = 0; i < n * N; i++) md = fmax(md, isnan(out[i]) ? INFINITY : fabs(out[i] - ref[i]));
                    CHECK(md <= 1e-5 * scale, "%s %s codes at %s, x %c, n=%d: max |%s - scalar| %g (outputs up to %g)", cpu_isa_name(isa),
                          fmts[f], f == 3 ? "min" : "max", sign > 0 ? '+' : '-', n, cpu_isa_name(isa), md, scale);
                }
            }
        }
        be->release_linear(be, &w);
        free(x), free(ref), free(out);
        for (int i = 0; owned[i]; i++) free(owned[i]);
        free(owned);
    }
    cpu_set_isa(saved);
    be->destroy(be);
}

static void test_qgemm(void) {
    char err[512];
    struct kiln_backend *be = backend_create("cpu", 2, err, sizeof err);
    CHECK(be != NULL, "%s", err);
    if (!be) return;
    const int saved = cpu_isa();
    struct {
        const char *fmt;
        int N, K, f32act, group, asym; /* asym: 1 random zero points, 2 and act-order (a random g_idx); FP8: 3 random codes, 4 random subnormal codes */
    } cs[] = {{"q8_0", 37, 320, 0, 64, 0},      {"q4_0", 37, 320, 0, 64, 0},      {"q8_0", 53, 96, 0, 64, 0},  {"q4_0", 16, 64, 0, 64, 0},
              {"q4_1", 37, 320, 0, 64, 0},      {"q4_1", 6, 96, 0, 64, 0},
              {"q5_0", 37, 320, 0, 64, 0},      {"q5_0", 6, 96, 0, 64, 0},        {"q5_1", 37, 320, 0, 64, 0}, {"q5_1", 6, 96, 0, 64, 0},
              {"q4_k", 21, 512, 0, 64, 0},      {"q5_k", 21, 512, 0, 64, 0},      {"q6_k", 21, 512, 0, 64, 0},
              {"iq4_nl", 37, 320, 0, 64, 0},    {"iq4_nl", 6, 96, 0, 64, 0},      {"iq4_xs", 21, 512, 0, 64, 0}, {"iq4_xs", 6, 256, 0, 64, 0},
              {"q2_k", 21, 512, 0, 64, 0},      {"q2_k", 6, 256, 0, 64, 0},       {"q3_k", 21, 512, 0, 64, 0},   {"q3_k", 6, 256, 0, 64, 0},
              {"q8_0", 37, 320, 1, 64, 0},      {"gptq-int4", 40, 320, 0, 64, 0},
              {"gptq-int8", 24, 192, 0, 64, 0}, {"awq", 40, 320, 0, 64, 0},       {"fp8", 37, 320, 0, 64, 0},
              /* FP8 with every code (subnormals, both signs) and K 300: each step width's tail in the last block */
              {"fp8", 29, 300, 0, 64, 3}, {"fp8", 21, 256, 0, 64, 4},
              /* 8-bit GPTQ: per-channel K 300 and groups of 96 (each step width of the AVX-512 kernel, and its tail) */
              {"gptq-int8", 24, 300, 0, 0, 0}, {"gptq-int8", 16, 384, 0, 96, 0},
              /* 8-bit groups of 80 (32 + 32 + 16: the NEON kernels' 16-weight step); 4-bit groups of 48 (the exact path
               * by default: every other group starts mid-chunk, so the scalar head and tail of a group run) */
              {"gptq-int8", 20, 320, 0, 80, 0}, {"gptq-int4", 24, 336, 0, 48, 0},
              {"gptq-int4", 40, 384, 0, 128, 0}, {"awq", 24, 512, 0, 256, 0},     {"q4_0", 45, 1056, 0, 64, 0},
              /* enough rows that decode runs split across the 2 threads (runs per thread, stealing) */
              {"q8_0", 1000, 256, 0, 64, 0},    {"q4_0", 1900, 256, 0, 64, 0},    {"gptq-int4", 600, 256, 0, 128, 0},
              /* GPTQ / AWQ 4-bit on int8 activations: K of 11 blocks (a VNNI decode step of 3 blocks at the end),
               * groups 32/64/128/per-channel, K = 1024 / 2048 for the g128 run-of-rows kernel, zero points
               * random, act-order; the f32 pair checks the exact path did not move */
              {"gptq-int4", 40, 352, 0, 32, 1},  {"gptq-int4", 41 * 8, 352, 0, 64, 2}, {"gptq-int4", 24, 1024, 0, 128, 1},
              {"gptq-int4", 48, 2048, 0, 128, 2}, {"gptq-int4", 40, 640, 0, 128, 0},   {"awq", 40, 352, 0, 32, 0},
              {"awq", 24, 1024, 0, 128, 0},       {"gptq-int4", 16, 256, 0, 0, 1},     {"gptq-int4", 600, 1024, 0, 128, 1},
              {"gptq-int4", 40, 1024, 1, 128, 2},
              /* row counts that leave every tail of the NEON GEMM's panels of 4 and 8 rows (qmatmul_int8_neon.c; GPTQ / AWQ
               * rows come in multiples of 8: one panel, three, per-channel with act-order) */
              {"q8_0", 31, 256, 0, 64, 0},       {"q4_0", 30, 384, 0, 64, 0},         {"q8_0", 6, 96, 0, 64, 0},
              {"gptq-int4", 8, 384, 0, 128, 1},  {"gptq-int4", 24, 320, 0, 64, 0},    {"gptq-int4", 16, 256, 0, 0, 2}};
    /* 2-7: the decode of that many sequences (5: a pass of 4, then 1; 1-4 the exact path's fused kernels); 8 and 13 take
     * the row dots on AVX2 (the exact path: its GEMM), 17 and 37 the int8 GEMM on every x86 ISA (qmatmul_int8.c
     * igemm_min); on AArch64 the GEMM runs from 4 (QN_MIN) in tiles of 4
     * tokens: 4 and 64 whole, 5, 13, 17, 37 one token in the last tile, 10 two, 7 three */
    static const int ns[] = {1, 2, 3, 4, 5, 7, 8, 10, 13, 17, 37, 64};
    const int maxn = 64;
    struct kiln_rng r;
    kiln_rng_seed(&r, 99);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int N = cs[c].N, K = cs[c].K;
        if (cs[c].f32act) setenv("KILN_QACT", "f32", 1);
        void **owned = kiln_calloc(1, sizeof(void *));
        struct qlinear w = {.n_out = N, .n_in = K};
        int rc = quant_dummy_linear(&w, cs[c].fmt, cs[c].group, 300 + c, 0.05f, test_alloc, &owned, err, sizeof err);
        CHECK(rc == 0, "%s: %s", cs[c].fmt, err);
        int32_t *gidx = NULL;
        if (rc == 0 && w.w.dtype >= KILN_DTYPE_Q4_K && w.w.dtype <= KILN_DTYPE_Q6_K) {
            /* the K formats' scales random (the dummy's are all alike), so a
             * kernel that takes a sub-block's or half's scale from the wrong
             * place fails */
            const int q6 = w.w.dtype == KILN_DTYPE_Q6_K, sbb = q6 ? 210 : w.w.dtype == KILN_DTYPE_Q5_K ? 176 : 144;
            uint8_t *q = (uint8_t *)w.w.data;
            for (int sb = 0; sb < N * K / 256; sb++)
                for (int j = 0; j < (q6 ? 16 : 12); j++)
                    q[(size_t)sb * sbb + (q6 ? 192 : 4) + j] = q6 ? (uint8_t)(int8_t)((int)(kiln_rng_next(&r) % 121) - 60) : (uint8_t)kiln_rng_next(&r);
        }
        if (rc == 0 && (w.w.dtype == KILN_DTYPE_Q2_K || w.w.dtype == KILN_DTYPE_Q3_K)) /* Q2_K's scale / min bytes, Q3_K's 12 scale bytes random */
            for (int sb = 0; sb < N * K / 256; sb++)
                for (int j = 0; j < (w.w.dtype == KILN_DTYPE_Q2_K ? 16 : 12); j++)
                    ((uint8_t *)w.w.data)[(size_t)sb * (w.w.dtype == KILN_DTYPE_Q2_K ? 84 : 110) + (w.w.dtype == KILN_DTYPE_Q2_K ? 0 : 96) + j] =
                        (uint8_t)kiln_rng_next(&r);
        if (rc == 0 && w.w.dtype == KILN_DTYPE_IQ4_XS) /* IQ4_XS: every sub-block's 6-bit scale random */
            for (int sb = 0; sb < N * K / 256; sb++)
                for (int j = 2; j < 8; j++) ((uint8_t *)w.w.data)[(size_t)sb * 136 + j] = (uint8_t)kiln_rng_next(&r);
        if (rc == 0 && cs[c].asym >= 3) /* FP8: every code but the two NaNs at random (4: only zeros and subnormals) */
            for (int64_t i = 0; i < (int64_t)N * K; i++) {
                const uint8_t v = (uint8_t)(kiln_rng_next(&r) % 254);
                ((uint8_t *)w.w.data)[i] = cs[c].asym == 4 ? (v & 0x87) : v >= 0x7f ? v + 1 : v;
            }
        else if (rc == 0 && cs[c].asym) /* random 4-bit zero points */
            for (int64_t i = 0; i < w.zeros.rows * w.zeros.cols; i++) ((uint32_t *)w.zeros.data)[i] = (uint32_t)kiln_rng_next(&r);
        if (rc == 0 && cs[c].asym == 2) {
            /* act-order: input channel order shuffled, each group keeps its size */
            gidx = kiln_malloc(sizeof(int32_t) * K);
            for (int k = 0; k < K; k++) gidx[k] = k / w.group;
            for (int k = K - 1; k > 0; k--) {
                int o = (int)(kiln_rng_next(&r) % (uint64_t)(k + 1)), t = gidx[k];
                gidx[k] = gidx[o], gidx[o] = t;
            }
            w.g_idx = (struct ktensor){KILN_DTYPE_I32, 1, K, gidx, NULL};
        }
        float *bias = kiln_malloc(sizeof(float) * N);
        for (int i = 0; i < N; i++) bias[i] = kiln_rng_normal(&r);
        if (c & 1) w.bias = (struct ktensor){KILN_DTYPE_F32, 1, N, bias, NULL};
        if (rc == 0 && be->prepare_linear(be, &w, err, sizeof err) == 0) {
            float *x = kiln_malloc(sizeof(float) * maxn * K), *ref = kiln_malloc(sizeof(float) * maxn * N), *out = kiln_malloc(sizeof(float) * maxn * N);
            float *W = kiln_malloc(sizeof(float) * N * K);
            quant_dequant_linear(&w, W);
            for (int i = 0; i < maxn * K; i++) x[i] = kiln_rng_normal(&r) * (i % 97 == 0 ? 8.0f : 1.0f);
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                const int n = ns[ni];
                double scale = 0;
                for (int t = 0; t < n; t++)
                    for (int o = 0; o < N; o++) {
                        double a = 0;
                        for (int k = 0; k < K; k++) a += fabs(W[(size_t)o * K + k] * x[(size_t)t * K + k]);
                        scale = fmax(scale, a);
                    }
                cpu_set_isa(CPU_ISA_SCALAR);
                be->matmul(be, ref, x, &w, n);
                if (cs[c].asym || cs[c].group == 32) {
                    /* the scalar path itself against the dequantized weights (zero points and
                     * act-order included). Exact: 1e-5 x sum |w x|. int8 activations: x_i is
                     * rounded to d q_i, d = amax / 127 of its block of 32, so |x_i - d q_i| <=
                     * d / 2 and each output moves by at most sum_blocks d_b / 2 sum_{i in b} |w_i|
                     * (plus the same 1e-5 x sum |w x| of f32 rounding): a worst-case bound, not a
                     * fitted one. Blocks are taken in the order the kernel quantizes (act-order:
                     * x permuted by the sorted g_idx). */
                    int *ord = kiln_malloc(sizeof(int) * K);
                    for (int k = 0, o = 0; gidx && o < K / w.group + 1; o++)
                        for (int kk = 0; kk < K; kk++)
                            if (gidx[kk] == o) ord[k++] = kk;
                    if (!gidx)
                        for (int k = 0; k < K; k++) ord[k] = k;
                    double worst = 0;
                    for (int t = 0; t < n; t++)
                        for (int o = 0; o < N; o++) {
                            double d = w.bias.data ? bias[o] : 0, bound = 0, a = 0;
                            for (int b0 = 0; b0 < K; b0 += 32) {
                                double amax = 0, sw = 0;
                                for (int i = b0; i < b0 + 32 && i < K; i++) {
                                    const int k = ord[i];
                                    amax = fmax(amax, fabs(x[(size_t)t * K + k])), sw += fabs(W[(size_t)o * K + k]);
                                }
                                bound += amax / 127 / 2 * sw;
                            }
                            for (int k = 0; k < K; k++)
                                d += (double)W[(size_t)o * K + k] * x[(size_t)t * K + k], a += fabs(W[(size_t)o * K + k] * x[(size_t)t * K + k]);
                            const double tol = (cs[c].f32act || !strcmp(cs[c].fmt, "fp8") ? 0 : bound) + 1e-5 * a + 1e-6 * scale; /* FP8: exact */
                            worst = fmax(worst, fabs(d - ref[(size_t)t * N + o]) / tol);
                        }
                    free(ord);
                    CHECK(worst <= 1, "scalar %s g%d asym %d N=%d K=%d n=%d: |delta| vs dequantized at %.3g of its bound", cs[c].fmt,
                          cs[c].group, cs[c].asym, N, K, n, worst);
                    if (getenv("KILN_TEST_VERBOSE") && n == 37)
                        fprintf(stderr, "  qgemm %s g%d asym %d K=%d: |delta| vs dequantized at %.3g of the rounding bound\n", cs[c].fmt, cs[c].group, cs[c].asym, K, worst);
                }
                for (int isa = CPU_ISA_SCALAR + 1; isa <= cpu_isa_max(); isa++) {
                    cpu_set_isa(isa);
                    memset(out, 0xff, sizeof(float) * (size_t)n * N); /* NaN: every output must be written */
                    be->matmul(be, out, x, &w, n);
                    double md = 0;
                    for (int i = 0; i < n * N; i++) md = fmax(md, isnan(out[i]) ? INFINITY : fabs(out[i] - ref[i]));
                    CHECK(md <= 2e-6 * scale, "%s %s%s N=%d K=%d n=%d: max |%s - scalar| %g > %g", cpu_isa_name(isa), cs[c].fmt,
                          cs[c].f32act ? " (f32 act)" : "", N, K, n, cpu_isa_name(isa), md, 2e-6 * scale);
                    /* GPTQ / AWQ 4-bit on AVX2, 2-7 sequences (groups of 64 and up): each row's bits as
                     * decoded alone (qmatmul_gptq.c growsm_avx2 against grows_avx2) */
                    if (isa == CPU_ISA_AVX2 && n > 1 && n < 8 && !cs[c].f32act && cs[c].group >= 64 &&
                        (!strcmp(cs[c].fmt, "gptq-int4") || !strcmp(cs[c].fmt, "awq"))) {
                        float *o1 = kiln_malloc(sizeof(float) * N);
                        int same = 1;
                        for (int t = 0; t < n; t++) {
                            be->matmul(be, o1, x + (size_t)t * K, &w, 1);
                            same &= memcmp(o1, out + (size_t)t * N, sizeof(float) * N) == 0;
                        }
                        CHECK(same, "avx2 %s g%d N=%d K=%d n=%d: a row differs from the same row alone", cs[c].fmt, cs[c].group, N, K, n);
                        free(o1);
                    }
                }
            }
            be->release_linear(be, &w);
            free(x), free(ref), free(out), free(W);
        }
        unsetenv("KILN_QACT");
        for (int i = 0; owned[i]; i++) free(owned[i]);
        free(owned), free(bias), free(gidx);
    }
    cpu_set_isa(saved);
    be->destroy(be);
}

/* Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and GPTQ / AWQ 4-bit in groups of 16 rows (x86:
 * qmatmul_internal.h, qmatmul_gptq.c): every ISA gives the scalar kernel's bits, at every n,
 * for rows in groups and rows past them (N = 16 x g + r), with and without
 * bias, GPTQ with groups of 32 / 64 / 128 / per-channel and random zero
 * points; a token's row is the same bits in any batch (decode, a few
 * sequences, prefill tiles); and the result is the stored layout's
 * (KILN_CPU_X16=0) up to f32 summation order. */
struct blkfill {
    int bs, hi0, hi1, base; /* block bytes; the scales' high bytes kept small (-1: none), base + 0..7 */
};
static void test_x16(void) {
#if defined(KILN_X86)
    char err[512];
    struct kiln_backend *be = backend_create("cpu", 2, err, sizeof err);
    CHECK(be != NULL, "%s", err);
    if (!be) return;
    const int saved = cpu_isa();
    static const struct {
        const char *fmt;
        int N, K, group;
    } cs[] = {{"q4_0", 16, 64, 0},         {"q4_0", 37, 320, 0},       {"q4_0", 48, 1056, 0},      {"q4_0", 131, 256, 0},
              {"q4_0", 7, 96, 0},          {"gptq-int4", 40, 384, 128}, {"gptq-int4", 56, 352, 32}, {"gptq-int4", 48, 320, 64},
              {"gptq-int4", 16, 256, 0},   {"awq", 24, 1024, 128},     {"gptq-int4", 8, 256, 128}, {"awq", 72, 512, 256},
              {"q8_0", 16, 64, 0},         {"q8_0", 37, 320, 0},       {"q8_0", 48, 1056, 0},      {"q8_0", 7, 96, 0},
              {"q4_k", 16, 256, 0},        {"q4_k", 37, 512, 0},       {"q4_k", 48, 1024, 0},      {"q4_k", 9, 256, 0},
              {"q6_k", 16, 256, 0},        {"q6_k", 37, 512, 0},       {"q6_k", 48, 1024, 0},      {"q6_k", 9, 256, 0},
              {"q5_k", 16, 256, 0},        {"q5_k", 37, 512, 0},       {"q5_k", 48, 1024, 0},      {"q5_k", 9, 256, 0},
              {"q5_0", 16, 64, 0},         {"q5_0", 37, 320, 0},       {"q5_0", 48, 1056, 0},      {"q5_0", 7, 96, 0},
              {"q5_1", 16, 64, 0},         {"q5_1", 37, 320, 0},       {"q5_1", 48, 1056, 0},      {"q5_1", 7, 96, 0},
              {"q4_1", 16, 64, 0},         {"q4_1", 37, 320, 0},       {"q4_1", 48, 1056, 0},      {"q4_1", 7, 96, 0},
              {"iq4_nl", 16, 64, 0},       {"iq4_nl", 37, 320, 0},     {"iq4_nl", 48, 1056, 0},    {"iq4_nl", 7, 96, 0},
              {"iq4_xs", 16, 256, 0},      {"iq4_xs", 37, 512, 0},     {"iq4_xs", 48, 1024, 0},    {"iq4_xs", 9, 256, 0},
              {"q3_k", 16, 256, 0},        {"q3_k", 37, 512, 0},       {"q3_k", 48, 1024, 0},      {"q3_k", 9, 256, 0},
              {"q2_k", 16, 256, 0},        {"q2_k", 37, 512, 0},       {"q2_k", 48, 1024, 0},      {"q2_k", 9, 256, 0}};
    static const int ns[] = {1, 2, 3, 7, 8, 9, 17, 37};
    const int maxn = 37;
    struct kiln_rng r;
    kiln_rng_seed(&r, 4242);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int N = cs[c].N, K = cs[c].K, q4 = !strcmp(cs[c].fmt, "q4_0"), q8 = !strcmp(cs[c].fmt, "q8_0"), qk = !strcmp(cs[c].fmt, "q4_k"),
                  q6 = !strcmp(cs[c].fmt, "q6_k"), q5 = !strcmp(cs[c].fmt, "q5_k"),
                  t01 = !strncmp(cs[c].fmt, "q5_", 3) || !strcmp(cs[c].fmt, "q4_1") || !strcmp(cs[c].fmt, "iq4_nl"),
                  iqx = !strcmp(cs[c].fmt, "iq4_xs"), q3 = !strcmp(cs[c].fmt, "q3_k"), q2 = !strcmp(cs[c].fmt, "q2_k");
        void **owned = kiln_calloc(1, sizeof(void *));
        struct qlinear w = {.n_out = N, .n_in = K}, w0;
        CHECK(quant_dummy_linear(&w, cs[c].fmt, cs[c].group, 900 + c, 0.05f, test_alloc, &owned, err, sizeof err) == 0, "%s", err);
        /* GGUF blocks: every byte random (codes, fifth / third / top bits, scales, mins of every row differ, Q8_0's -128
         * included) but the high bytes of the f16 scales, kept small (struct blkfill) */
        const struct blkfill fill = q4 || q8 ? (struct blkfill){q8 ? 34 : 18, 1, -1, 0x28}
                                                : t01       ? (struct blkfill){(int)quant_row_bytes(w.w.dtype, 32), 1,
                                                                             strcmp(cs[c].fmt, "q5_0") && strcmp(cs[c].fmt, "iq4_nl") ? 3 : -1, 0x28}
                                                : q3        ? (struct blkfill){110, 109, -1, 0x18}
                                                : q2        ? (struct blkfill){84, 81, 83, 0x18}
                                                : iqx       ? (struct blkfill){136, 1, -1, 0x20}
                                                : qk || q5  ? (struct blkfill){q5 ? 176 : 144, 1, 3, 0x20}
                                                : q6        ? (struct blkfill){210, 209, -1, 0x10}
                                                            : (struct blkfill){0, -1, -1, 0};
        if (fill.bs) {
            uint8_t *q = (uint8_t *)w.w.data;
            const int64_t nblk = (int64_t)N * K / quant_type_of(w.w.dtype)->block_elems;
            for (int64_t bk = 0; bk < nblk; bk++)
                for (int i = 0; i < fill.bs; i++)
                    q[fill.bs * bk + i] = i == fill.hi0 || i == fill.hi1 ? (uint8_t)(fill.base + kiln_rng_next(&r) % 8) : (uint8_t)kiln_rng_next(&r);
        } else { /* random zero points */
            for (int64_t i = 0; i < w.zeros.rows * w.zeros.cols; i++) ((uint32_t *)w.zeros.data)[i] = (uint32_t)kiln_rng_next(&r);
        }
        float *bias = test_alloc(&owned, sizeof(float) * N);
        for (int i = 0; i < N; i++) bias[i] = kiln_rng_normal(&r);
        if (c & 1) w.bias = (struct ktensor){KILN_DTYPE_F32, 1, N, bias, NULL};
        w0 = w;
        setenv("KILN_CPU_X16", "0", 1);
        CHECK(be->prepare_linear(be, &w0, err, sizeof err) == 0, "%s", err);
        unsetenv("KILN_CPU_X16");
        CHECK(be->prepare_linear(be, &w, err, sizeof err) == 0, "%s", err);
        /* Q4_K and Q5_K go into groups from AVX2 (qmatmul.c); without VNNI
         * their prefill (n >= 16 here) takes the AVX2 GEMM on panels cut
         * from the groups, which must give the same bits */
        const int grouped = !(qk || q5) || cpu_isa() >= CPU_ISA_AVX2;
        CHECK(w.repacked == grouped && w0.repacked == !(q4 || q8 || qk || q6 || q5 || t01 || iqx || q3 || q2), "%s N=%d: repacked %d, stored %d", cs[c].fmt, N, w.repacked,
              w0.repacked);
        if (!grouped) {
            be->release_linear(be, &w), be->release_linear(be, &w0);
            for (int i = 0; owned[i]; i++) free(owned[i]);
            free(owned);
            continue;
        }
        float *x = kiln_malloc(sizeof(float) * maxn * K), *ref = kiln_malloc(sizeof(float) * maxn * N), *out = kiln_malloc(sizeof(float) * maxn * N);
        float *one = kiln_malloc(sizeof(float) * N);
        for (int i = 0; i < maxn * K; i++) x[i] = kiln_rng_normal(&r) * (i % 53 == 0 ? 6.0f : 1.0f);
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int n = ns[ni];
            cpu_set_isa(CPU_ISA_SCALAR);
            be->matmul(be, ref, x, &w, n);
            for (int isa = CPU_ISA_SCALAR; isa <= cpu_isa_max(); isa++) {
                cpu_set_isa(isa);
                memset(out, 0xff, sizeof(float) * (size_t)n * N);
                be->matmul(be, out, x, &w, n);
                CHECK(!memcmp(out, ref, sizeof(float) * (size_t)n * N), "%s %s N=%d K=%d n=%d: not the scalar kernel's bits", cpu_isa_name(isa),
                      cs[c].fmt, N, K, n);
                int same = 1;
                for (int t = 0; t < n; t += 5) {
                    be->matmul(be, one, x + (size_t)t * K, &w, 1);
                    same &= !memcmp(one, out + (size_t)t * N, sizeof(float) * N);
                }
                CHECK(same, "%s %s N=%d K=%d n=%d: a token's row differs from the same token alone", cpu_isa_name(isa), cs[c].fmt, N, K, n);
                memset(out, 0xff, sizeof(float) * (size_t)n * N);
                be->matmul(be, out, x, &w0, n);
                double md = 0, scale = 0;
                for (int i = 0; i < n * N; i++) md = fmax(md, isnan(out[i]) ? INFINITY : fabs(out[i] - ref[i])), scale = fmax(scale, fabs(ref[i]));
                CHECK(md <= 2e-6 * scale * sqrt(K / 32.0), "%s %s N=%d K=%d n=%d: stored layout %g from groups of 16 (outputs up to %g)",
                      cpu_isa_name(isa), cs[c].fmt, N, K, n, md, scale);
            }
        }
        be->release_linear(be, &w), be->release_linear(be, &w0);
        free(x), free(ref), free(out), free(one);
        for (int i = 0; owned[i]; i++) free(owned[i]);
        free(owned);
    }
    cpu_set_isa(saved);
    be->destroy(be);
#endif
}

/* ==== quantize round trips ==== */

/* matmul_multi (q/k/v, gate/up of a decode step as one pool job) gives
 * exactly what one matmul per linear gives, on every ISA, for every decode
 * path: int8 rows (Q8_0, Q4_0, Q4_K), the exact fused rows (GPTQ g128
 * lookup, AWQ, FP8) and dense BF16; the runs cross from one linear into
 * the next */
static void test_qmulti(void) {
    char err[512];
    struct kiln_backend *be = backend_create("cpu", 2, err, sizeof err);
    CHECK(be != NULL, "%s", err);
    if (!be || !be->matmul_multi) return;
    const int saved = cpu_isa();
    static const char *fmts[] = {"q8_0", "q4_0", "q4_k", "gptq-int4", "awq", "fp8", "gptq-int8", "bf16"};
    static const int Ns[3] = {712, 136, 264};
    const int K = 512;
    struct kiln_rng r;
    kiln_rng_seed(&r, 7);
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        void **owned = kiln_calloc(1, sizeof(void *));
        struct qlinear w[3];
        const struct qlinear *ws[3];
        int ok = 1;
        for (int i = 0; i < 3; i++) {
            w[i] = (struct qlinear){.n_out = Ns[i], .n_in = K};
            if (!strcmp(fmts[f], "bf16")) {
                uint16_t *d = test_alloc(&owned, sizeof(uint16_t) * Ns[i] * K);
                for (int k = 0; k < Ns[i] * K; k++) d[k] = kiln_f32_to_bf16(0.05f * kiln_rng_normal(&r));
                w[i].fmt = KILN_WFMT_DENSE;
                w[i].w = (struct ktensor){.dtype = KILN_DTYPE_BF16, .rows = Ns[i], .cols = K, .data = d};
            } else {
                int rc = quant_dummy_linear(&w[i], fmts[f], 128, 500 + 10 * f + i, 0.05f, test_alloc, &owned, err, sizeof err);
                CHECK(rc == 0, "%s: %s", fmts[f], err);
                ok &= rc == 0;
            }
            if (i == 1) {
                float *bias = test_alloc(&owned, sizeof(float) * Ns[i]);
                for (int k = 0; k < Ns[i]; k++) bias[k] = kiln_rng_normal(&r);
                w[i].bias = (struct ktensor){KILN_DTYPE_F32, 1, Ns[i], bias, NULL};
            }
            if (ok && be->prepare_linear(be, &w[i], err, sizeof err)) {
                CHECK(0, "%s: %s", fmts[f], err);
                ok = 0;
            }
            ws[i] = &w[i];
        }
        if (!ok) continue;
        float *x = kiln_malloc(sizeof(float) * 5 * K), *ref[3], *out[3];
        for (int k = 0; k < 5 * K; k++) x[k] = kiln_rng_normal(&r);
        for (int i = 0; i < 3; i++) ref[i] = kiln_malloc(sizeof(float) * 4 * Ns[i]), out[i] = kiln_malloc(sizeof(float) * 4 * Ns[i]);
        for (int isa = CPU_ISA_SCALAR; isa <= cpu_isa_max(); isa++)
            for (int n = 1; n <= 4; n += 3) {
                cpu_set_isa(isa);
                for (int i = 0; i < 3; i++) be->matmul(be, ref[i], x, ws[i], n);
                for (int i = 0; i < 3; i++) memset(out[i], 0xff, sizeof(float) * n * Ns[i]);
                be->matmul_multi(be, (void *const *)out, x, ws, 3, n);
                for (int i = 0; i < 3; i++)
                    CHECK(!memcmp(out[i], ref[i], sizeof(float) * n * Ns[i]), "%s %s n=%d: matmul_multi's linear %d differs from matmul",
                          cpu_isa_name(isa), fmts[f], n, i);
                /* cpu_matmul_tasks (the MoE experts' lists): linears 0 and 1 on the same x (1 takes 0's set-up, and has a
                 * bias), 2 on the next row's; rows past the last group of 16; the bits of matmul one at a time, and the
                 * int8 paths ran it as one job */
                const struct cpu_mm tl[3] = {{ws[0], x, out[0], n}, {ws[1], x, out[1], n}, {ws[2], x + K, out[2], n}};
                for (int i = 0; i < 3; i++) be->matmul(be, ref[i], tl[i].x, ws[i], n), memset(out[i], 0xff, sizeof(float) * n * Ns[i]);
                const long jobs = cpu_test_tasks_jobs();
                cpu_matmul_tasks(be, tl, 3);
                for (int i = 0; i < 3; i++)
                    CHECK(!memcmp(out[i], ref[i], sizeof(float) * n * Ns[i]), "%s %s n=%d: the task list's linear %d differs from matmul",
                          cpu_isa_name(isa), fmts[f], n, i);
                int int8 = !strcmp(fmts[f], "q8_0") || !strcmp(fmts[f], "q4_0") || !strcmp(fmts[f], "q4_k") || !strcmp(fmts[f], "gptq-int4") ||
                           !strcmp(fmts[f], "awq");
#if defined(KILN_NEON)
                /* from QN_MIN tokens NEON runs Q8_0 / Q4_0 / GPTQ / AWQ on its int8 GEMM, which a task list leaves to
                 * matmul one by one (as x86 does from its larger GEMM thresholds) */
                if ((isa == CPU_ISA_NEON || isa == CPU_ISA_DOTPROD) && n >= QN_MIN && strcmp(fmts[f], "q4_k")) int8 = 0;
#endif
                CHECK(cpu_test_tasks_jobs() == jobs + int8, "%s %s n=%d: the task list ran as %ld jobs", cpu_isa_name(isa), fmts[f], n,
                      cpu_test_tasks_jobs() - jobs);
            }
        for (int i = 0; i < 3; i++) be->release_linear(be, &w[i]), free(ref[i]), free(out[i]);
        free(x);
        for (int i = 0; owned[i]; i++) free(owned[i]);
        free(owned);
    }
    cpu_set_isa(saved);
    be->destroy(be);
}

/* An MoE layer's experts as lists of matmuls (moe.c, qm_int8_tasks): the
 * logits of a prefill, single steps and a 2-token step are those of one
 * matmul at a time, in one batch or in batches of 5 gathered rows, on every
 * ISA, in groups of 16 rows or as stored; and for the GGUF and 4-bit
 * GPTQ / AWQ formats the lists did run as one job. */
enum { MT_T = 37, MT_STEPS = 4 };

/* the logits of the fixed run, or -1 */
static int moe_run(kiln_engine *e, float *lg, int V) {
    char err[512];
    kiln_seq *s = kiln_seq_new(e, err, sizeof err);
    if (!s) return -1;
    int32_t ids[MT_T];
    for (int i = 0; i < MT_T; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
    int rc = kiln_seq_eval(s, ids, MT_T, lg, 1, err, sizeof err);
    float *o = lg + (size_t)MT_T * V;
    for (int t = 0; t < MT_STEPS && !rc; t++, o += V) rc = kiln_seq_eval(s, ids + t, 1, o, 0, err, sizeof err);
    if (!rc) rc = kiln_seq_eval(s, ids + 5, 2, o, 1, err, sizeof err);
    kiln_seq_free(s);
    return rc;
}

static void test_moe_tasks(void) {
    /* last: BF16 / F32 experts 36 wide (SwiGLU per expert: its vector kernels' scalar tails) */
    static const struct {
        const char *quant;
        int x16;
        const char *dtype;
    } fmts[] = {{"q4_0", 1, NULL}, {"q4_0", 0, NULL},   {"q8_0", 1, NULL},   {"q8_0", 0, NULL},      {"q4_1", 1, NULL},      {"q5_0", 1, NULL},
                {"q5_1", 1, NULL}, {"q4_k", 1, NULL},   {"q4_k", 0, NULL},   {"q5_k", 1, NULL},      {"q6_k", 1, NULL},      {"iq4_nl", 1, NULL},
                {"iq4_xs", 1, NULL}, {"q2_k", 1, NULL}, {"q3_k", 1, NULL},   {"gptq-int4", 1, NULL}, {"gptq-int4", 0, NULL}, {"awq", 1, NULL},
                {NULL, 1, "bf16"}, {NULL, 1, "bf16"},   {NULL, 1, "f32"}};
    const size_t nf = sizeof fmts / sizeof fmts[0];
    const int saved = cpu_isa();
    for (int isa = CPU_ISA_SCALAR; isa <= cpu_isa_max(); isa++) {
        CHECK(cpu_set_isa(isa) == isa);
        for (size_t f = 0; f < nf; f++) {
            char err[512];
            struct kiln_engine_opts o = {.dummy = f + 2 < nf ? FIXTURES "/dummy/qwen3-moe-small.json" : FIXTURES "/dummy/qwen3-moe-odd.json",
                                         .backend = "cpu", .quant = fmts[f].quant, .dummy_dtype = fmts[f].dtype, .quant_group = 128,
                                         .max_total_tokens = 128, .n_threads = 2};
            if (!fmts[f].x16) setenv("KILN_CPU_X16", "0", 1);
            kiln_engine *e = kiln_engine_open(&o, err, sizeof err);
            unsetenv("KILN_CPU_X16");
            const char *name = fmts[f].quant ? fmts[f].quant : fmts[f].dtype;
            CHECK(e != NULL, "%s: %s", name, err);
            if (!e) continue;
            const int V = kiln_engine_config(e)->vocab;
            const size_t nl = (size_t)(MT_T + MT_STEPS + 2) * V;
            float *want = kiln_malloc(sizeof(float) * nl), *got = kiln_malloc(sizeof(float) * nl);
            cpu_set_moe_tasks(0);
            CHECK(moe_run(e, want, V) == 0, "%s isa %d: the run failed", name, isa);
            static const int rows[2] = {1, 5};
            for (int r = 0; r < 2; r++) {
                const long jobs = cpu_test_tasks_jobs();
                cpu_set_moe_tasks(rows[r]);
                memset(got, 0xff, sizeof(float) * nl);
                CHECK(moe_run(e, got, V) == 0 && !memcmp(got, want, sizeof(float) * nl),
                      "%s isa %d x16 %d: the experts as lists (batches of %d) give other logits", name, isa, fmts[f].x16,
                      rows[r] == 1 ? 512 : rows[r]);
                if (fmts[f].quant)
                    CHECK(cpu_test_tasks_jobs() > jobs, "%s isa %d x16 %d: no list ran as one job", name, isa, fmts[f].x16);
            }
            cpu_set_moe_tasks(1);
            free(want), free(got);
            kiln_engine_close(e);
        }
    }
    cpu_set_isa(saved);
}

static void test_roundtrip(void) {
    int same = 1; /* the fast e4m3 encoder against base.c's exhaustive one */
    for (int i = -5000; i <= 5000 && same; i++) {
        float f = (float)i * 0.0917f;
        same = quant_f32_to_e4m3(f) == kiln_f32_to_fp8e4m3(f) && quant_f32_to_e4m3(f * 1e-3f) == kiln_f32_to_fp8e4m3(f * 1e-3f);
        if (!same) fprintf(stderr, "  e4m3(%g): %02x vs %02x\n", f, quant_f32_to_e4m3(f), kiln_f32_to_fp8e4m3(f));
    }
    CHECK(same, "fast e4m3 encoder differs from kiln_f32_to_fp8e4m3");
    enum kiln_dtype ts[] = {KILN_DTYPE_Q8_0, KILN_DTYPE_Q4_0, KILN_DTYPE_Q4_1, KILN_DTYPE_Q4_K};
    const float bound[] = {0.5f / 127, 1.0f / 15 + 1e-3f, 0.5f / 15 + 1e-3f, 1.2f / 15};
    float x[512], y[512];
    uint8_t buf[1024];
    struct kiln_rng r;
    kiln_rng_seed(&r, 3);
    for (int i = 0; i < 512; i++) x[i] = kiln_rng_normal(&r);
    for (size_t t = 0; t < 4; t++) {
        CHECK(quant_quantize_row(ts[t], x, buf, 512) == 0);
        quant_dequant_row(ts[t], buf, y, 512);
        float amax = 0, md = 0;
        for (int i = 0; i < 512; i++) amax = fmaxf(amax, fabsf(x[i])), md = fmaxf(md, fabsf(x[i] - y[i]));
        CHECK(md <= bound[t] * 2 * amax, "%s: round trip error %g (amax %g)", dtype_name(ts[t]), md, amax);
    }
}

/* ==== configs kiln must refuse ==== */

static void test_config_errors(void) {
    const char *base = "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                       "\"vocab_size\":128,\"intermediate_size\":128,\"quantization_config\":%s}";
    struct {
        const char *q, *want;
    } cases[] = {
        {"{\"quant_method\":\"gptq\",\"bits\":3,\"group_size\":128}", "bits 3"},
        {"{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":128,\"checkpoint_format\":\"marlin\"}", "marlin"},
        {"{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":128,\"version\":\"gemv\"}", "gemv"},
        {"{\"quant_method\":\"awq\",\"bits\":8,\"group_size\":128}", "bits 8"},
        {"{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\"}", "per-tensor"},
        {"{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\",\"weight_block_size\":[128,128]}", "e5m2"},
        {"{\"quant_method\":\"compressed-tensors\"}", "compressed-tensors"},
        {"{\"quant_method\":\"bitsandbytes\"}", "bitsandbytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[1024], err[512] = "";
        snprintf(json, sizeof json, base, cases[i].q);
        struct kiln_config c;
        int rc = config_parse(&c, json, "config.json", err, sizeof err);
        CHECK(rc < 0 && strstr(err, cases[i].want), "case %zu: rc %d, err '%s'", i, rc, err);
        if (rc == 0) config_free(&c);
    }
    char json[1024], err[512] = "";
    snprintf(json, sizeof json, base, "{\"quant_method\":\"gptq\",\"bits\":8,\"group_size\":-1,\"desc_act\":true,\"sym\":false,\"checkpoint_format\":\"gptq_v2\"}");
    struct kiln_config c;
    CHECK(config_parse(&c, json, "config.json", err, sizeof err) == 0, "%s", err);
    CHECK(c.quant.method == KILN_QUANT_GPTQ && c.quant.bits == 8 && c.quant.group_size == -1 && c.quant.desc_act && !c.quant.sym && c.quant.v2);
    config_free(&c);
    /* a GPTQ checkpoint whose tensors contradict the config: a clear load error */
    struct kiln_engine_opts o = {.model = QDIR "/micro", .backend = "cpu"};
    (void)o;
}

/* ==== the GGUF parser on damaged files ==== */

static void test_gguf_parser(void) {
    char err[512];
    size_t len;
    uint8_t *d = (uint8_t *)kiln_read_file(QDIR "/gguf/micro-q4_0.gguf", &len, err, sizeof err);
    CHECK(d != NULL, "%s", err);
    if (!d) return;
    struct gguf_file g;
    CHECK(kiln_gguf_parse(&g, d, len, "f", err, sizeof err) == 0, "%s", err);
    struct kiln_config c;
    CHECK(kiln_gguf_to_config(&g, &c, err, sizeof err) == 0, "%s", err);
    CHECK(c.dim == 64 && c.n_layer == 1 && c.n_head == 4 && c.n_head_kv == 2 && c.head_dim == 16 && c.vocab == 128 && c.tie_embed, "config");
    config_free(&c);
    kiln_gguf_free(&g);
    /* every truncation fails cleanly */
    int bad = 0;
    for (size_t n = 0; n < len; n += n < 4096 ? 1 : 997) {
        uint8_t *cp = kiln_malloc(n + 1);
        memcpy(cp, d, n);
        if (kiln_gguf_parse(&g, cp, n, "f", err, sizeof err) == 0) bad++, kiln_gguf_free(&g);
        free(cp);
    }
    CHECK(bad == 0, "%d truncated files parsed", bad);
    /* random byte corruption in the header region: no crash, no leak */
    struct kiln_rng r;
    kiln_rng_seed(&r, 5);
    uint8_t *cp = kiln_malloc(len);
    for (int it = 0; it < 3000; it++) {
        memcpy(cp, d, len);
        for (int k = 0; k < 4; k++) cp[kiln_rng_next(&r) % 2048] = (uint8_t)kiln_rng_next(&r);
        if (kiln_gguf_parse(&g, cp, len, "f", err, sizeof err) == 0) {
            struct kiln_config cc;
            if (kiln_gguf_to_config(&g, &cc, err, sizeof err) == 0) config_free(&cc);
            kiln_gguf_free(&g);
        }
    }
    free(cp);
    /* a wrong magic and a version 1 file */
    uint8_t v1[24] = {'G', 'G', 'U', 'F', 1, 0, 0, 0};
    CHECK(kiln_gguf_parse(&g, v1, sizeof v1, "f", err, sizeof err) < 0 && strstr(err, "version 1"), "%s", err);
    free(d);
}

/* ==== tokenizer from GGUF metadata ==== */

static void test_gguf_tokenizer(void) {
    char err[512] = "", *json = NULL;
    size_t len = 0;
    int rc = kiln_gguf_tokenizer_json_file(QDIR "/gguf/micro-tok-q8_0.gguf", &json, &len, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    if (rc) return;
    struct kiln_tokenizer *t = tok_load_json(json, len, err, sizeof err);
    CHECK(t != NULL, "tok_load_json on the synthesized tokenizer.json: %s", err);
    if (t) {
        int32_t *ids = NULL;
        int n = 0;
        const char *text = "hello world<|im_end|>";
        CHECK(tok_encode(t, text, strlen(text), &ids, &n, err, sizeof err) == 0 && n > 1, "%s", err);
        CHECK(n > 0 && ids[n - 1] == 319, "last id %d, want <|im_end|> = 319", n > 0 ? ids[n - 1] : -1);
        CHECK(tok_is_special(t, 319));
        free(ids);
        tok_free(t);
    }
    free(json);
    /* tok_load takes the .gguf path itself, as kiln run/serve/tokenize do */
    t = tok_load(QDIR "/gguf/micro-tok-q8_0.gguf", err, sizeof err);
    CHECK(t != NULL, "tok_load on a .gguf: %s", err);
    if (t) {
        CHECK(tok_eos_token(t) && tok_token_id(t, tok_eos_token(t)) == 317, "eos token text from tokenizer.ggml.eos_token_id");
        int32_t *ids = NULL;
        int n = 0;
        CHECK(tok_encode(t, "hello world<|im_end|>", 21, &ids, &n, err, sizeof err) == 0 && n > 1 && ids[n - 1] == 319);
        free(ids);
        tok_free(t);
    }
    /* and the engine runs from the .gguf alone */
    struct kiln_engine_opts o = {.model = QDIR "/gguf/micro-tok-q8_0.gguf", .backend = "cpu", .max_total_tokens = 64};
    kiln_engine *e = kiln_engine_open(&o, err, sizeof err);
    CHECK(e != NULL, "%s", err);
    if (e) {
        CHECK(kiln_engine_is_eos(e, 317), "eos from tokenizer.ggml.eos_token_id");
        kiln_engine_close(e);
    }
}

/* The real Qwen3 tokenizer through GGUF: tokenizer.json -> tokenizer.ggml.*
 * (kiln's writer, the layout convert_hf_to_gguf.py writes) -> GGUF bytes ->
 * kiln_gguf_tokenizer_json -> tok_load_json, then the 94 HF tokenizer vectors. */
static void test_gguf_qwen3_tokenizer(void) {
    const char *dirs[] = {FIXTURES "/qwen3-dense-tiny", "../shared/models/qwen3-tokenizer"};
    const char *dir = NULL;
    for (int i = 0; i < 2 && !dir; i++) {
        char *p = kiln_path_join(dirs[i], "tokenizer.json");
        size_t n = 0;
        char e[64], *t = kiln_file_exists(p) ? kiln_read_file(p, &n, e, sizeof e) : NULL;
        if (t && n > 1000) dir = dirs[i];
        free(t), free(p);
    }
    if (!dir) {
        test_skip("no Qwen3 tokenizer.json");
        return;
    }
    struct gguf_writer *w = kiln_gguf_writer_new();
    kiln_gguf_w_str(w, "general.architecture", "qwen3");
    CHECK(kiln_gguf_w_tokenizer(w, dir, 151936) == 0);
    uint8_t *bytes;
    size_t len;
    kiln_gguf_writer_bytes(w, &bytes, &len);
    kiln_gguf_writer_free(w);
    struct gguf_file g;
    char err[512] = "", *json = NULL;
    size_t jl;
    CHECK(kiln_gguf_parse(&g, bytes, len, "qwen3-tok.gguf", err, sizeof err) == 0, "%s", err);
    CHECK(kiln_gguf_tokenizer_json(&g, &json, &jl, err, sizeof err) == 0, "%s", err);
    kiln_gguf_free(&g);
    free(bytes);
    struct kiln_tokenizer *t = json ? tok_load_json(json, jl, err, sizeof err) : NULL;
    free(json);
    CHECK(t != NULL, "%s", err);
    char *vt = kiln_read_file(FIXTURES "/tokenizer/qwen3_vectors.json", NULL, err, sizeof err);
    cJSON *v = vt ? cJSON_Parse(vt) : NULL;
    free(vt);
    int n_ok = 0, n_all = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(v, "cases")) {
        const cJSON *text = cJSON_GetObjectItem(c, "text"), *want = cJSON_GetObjectItem(c, "ids");
        if (!t || !cJSON_IsString(text) || !cJSON_IsArray(want)) continue;
        int32_t *ids = NULL;
        int n = 0, same = 0;
        if (tok_encode(t, text->valuestring, strlen(text->valuestring), &ids, &n, err, sizeof err) == 0 && n == cJSON_GetArraySize(want)) {
            same = 1;
            int i = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, want) same &= ids[i++] == x->valueint;
        }
        n_ok += same, n_all++;
        free(ids);
    }
    CHECK(n_all > 0 && n_ok == n_all, "GGUF-synthesized Qwen3 tokenizer: %d of %d vectors match", n_ok, n_all);
    if (getenv("KILN_TEST_VERBOSE")) fprintf(stderr, "  GGUF-synthesized Qwen3 tokenizer: %d/%d vectors\n", n_ok, n_all);
    cJSON_Delete(v);
    if (t) tok_free(t);
}

/* ==== dummy weights in every format ==== */

static void test_dummy(void) {
    const char *fmts[] = {"fp8", "gptq-int4", "gptq-int8", "awq", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"};
    char err[512];
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        struct kiln_engine_opts o = {.dummy = QDIR "/micro/config.json", .backend = "cpu", .quant = fmts[f], .quant_group = 32,
                                     .max_total_tokens = 64};
        if (strstr(fmts[f], "_k")) o.dummy = QDIR "/gguf/kmix-ref/config.json";
        kiln_engine *e = kiln_engine_open(&o, err, sizeof err);
        CHECK(e != NULL, "--quant %s: %s", fmts[f], err);
        if (!e) continue;
        float *lg = kiln_malloc(sizeof(float) * (size_t)kiln_engine_config(e)->vocab);
        kiln_seq *s = kiln_seq_new(e, err, sizeof err);
        CHECK(kiln_seq_eval(s, prompt, 5, lg, 0, err, sizeof err) == 0, "%s", err);
        int finite = 1;
        for (int i = 0; i < kiln_engine_config(e)->vocab; i++) finite &= isfinite(lg[i]);
        CHECK(finite, "--quant %s: non-finite logits", fmts[f]);
        kiln_seq_free(s);
        free(lg);
        kiln_engine_close(e);
    }
}

/* Dummy GPTQ/AWQ weights on the CPU, and on x86 Q4_0 ones: after the
 * repack the stored codes' whole pages are given back (resident memory is
 * the repacked size, as for a checkpoint's file mapping), the BF16
 * embedding keeps its pages, and the model still runs (test_dummy checks
 * its logits). */
static void test_dummy_dropped(void) {
#if defined(KILN_X86)
    const char *fmts[] = {"gptq-int4", "awq", "q4_0"};
#else
    const char *fmts[] = {"gptq-int4", "awq"};
#endif
    char err[512];
    const long pg = sysconf(_SC_PAGESIZE);
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        struct kiln_backend *be = backend_create("cpu", 1, err, sizeof err);
        struct kiln_model m;
        memset(&m, 0, sizeof m);
        int rc = be ? model_load_dummy_quant(&m, FIXTURES "/dummy/qwen3-long-tiny.json", KILN_DTYPE_BF16, fmts[f], 128, 1, be, err, sizeof err) : -1;
        CHECK(rc == 0, "--quant %s: %s", fmts[f], err);
        if (rc == 0) {
            const struct ktensor *ts[] = {&m.layers[0].wq.w, &m.layers[1].down.w, &m.embed};
            for (int i = 0; i < 3; i++) {
                uintptr_t a = ((uintptr_t)ts[i]->data + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
                const size_t bytes = dtype_size(ts[i]->dtype) ? (size_t)(ts[i]->rows * ts[i]->cols) * dtype_size(ts[i]->dtype)
                                                              : (size_t)ts[i]->rows * quant_row_bytes(ts[i]->dtype, ts[i]->cols);
                const uintptr_t e = ((uintptr_t)ts[i]->data + (uintptr_t)bytes) & ~(uintptr_t)(pg - 1);
                const size_t np = e > a ? (e - a) / (size_t)pg : 0;
                unsigned char *v = kiln_calloc(np + 1, 1);
                size_t res = 0;
                CHECK(np >= 8 && mincore((void *)a, e - a, v) == 0, "--quant %s tensor %d: %zu whole pages", fmts[f], i, np);
                for (size_t k = 0; k < np; k++) res += v[k] & 1;
                if (i < 2) CHECK(res == 0, "--quant %s: %zu of %zu pages of stored codes still resident after the repack", fmts[f], res, np);
                else CHECK(res == np, "the BF16 embedding: %zu of %zu pages resident", res, np);
                free(v);
            }
            model_free(&m);
        }
        if (be) be->destroy(be);
    }
}

/* ==== a forced instruction set is honoured by every kernel ====
 *
 * Per ISA the CPU has (forced with cpu_set_isa, as KILN_CPU_ISA does), a
 * micro model in each weight format runs a 12-token prefill (the GEMMs) and
 * two decode steps (the row kernels, the multi-linear jobs, attention,
 * norms, RoPE, SwiGLU); every kernel dispatch reports its choice
 * (cpu_isa_note) and the union must be exactly the forced level: nothing
 * from AVX-512 (VNNI, VBMI included) under avx2, no SIMD at all under
 * scalar. Under avx512 the int8 formats must reach their VNNI kernels
 * when the CPU has them. */
static void test_isa_dispatch(void) {
    static const struct {
        const char *quant, *dtype, *qact;
    } fmts[] = {{NULL, "bf16", NULL}, {NULL, "f16", NULL}, {NULL, "f32", NULL}, {"q8_0", NULL, NULL}, {"q4_0", NULL, NULL},
                {"gptq-int4", NULL, NULL}, {"gptq-int4", NULL, "f32"}, {"awq", NULL, NULL}, {"gptq-int8", NULL, NULL},
                {"fp8", NULL, NULL}, {"q4_k", NULL, NULL}};
    const int saved = cpu_isa();
    char err[512];
#if defined(KILN_X86)
    __builtin_cpu_init();
    const int vnni = __builtin_cpu_supports("avx512vnni");
#else
    const int vnni = 0;
#endif
    for (int isa = CPU_ISA_SCALAR; isa <= cpu_isa_max(); isa++) {
        CHECK(cpu_set_isa(isa) == isa);
        for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
            if (fmts[f].qact) setenv("KILN_QACT", fmts[f].qact, 1);
            struct kiln_engine_opts o = {.dummy = QDIR "/micro/config.json", .dummy_dtype = fmts[f].dtype, .backend = "cpu",
                                         .quant = fmts[f].quant, .quant_group = 32, .max_total_tokens = 64, .n_threads = 2};
            if (fmts[f].quant && strstr(fmts[f].quant, "_k")) o.dummy = QDIR "/gguf/kmix-ref/config.json";
            kiln_engine *e = kiln_engine_open(&o, err, sizeof err);
            if (fmts[f].qact) unsetenv("KILN_QACT");
            const char *name = fmts[f].quant ? fmts[f].quant : fmts[f].dtype;
            CHECK(e != NULL, "%s: %s", name, err);
            if (!e) continue;
            kiln_seq *s = kiln_seq_new(e, err, sizeof err);
            cpu_isa_used_reset();
            int rc = kiln_seq_eval(s, prompt, 12, NULL, 0, err, sizeof err);
            rc |= kiln_seq_eval(s, prompt + 12, 1, NULL, 0, err, sizeof err);
            rc |= kiln_seq_eval(s, prompt + 13, 1, NULL, 0, err, sizeof err);
            CHECK(rc == 0, "%s: %s", name, err);
            const int used = cpu_isa_used();
            if (isa == CPU_ISA_SCALAR) CHECK(used == 0, "forced scalar, %s%s: dispatch used 0x%x", name, fmts[f].qact ? " (f32)" : "", used);
            if (isa == CPU_ISA_AVX2)
                CHECK(used == CPU_USED_AVX2, "forced avx2, %s%s: dispatch used 0x%x (AVX-512 kernels: 0x%x)", name,
                      fmts[f].qact ? " (f32)" : "", used, used & ~CPU_USED_AVX2);
            if (isa == CPU_ISA_NEON)
                CHECK(used == CPU_USED_NEON, "forced neon, %s%s: dispatch used 0x%x", name, fmts[f].qact ? " (f32)" : "", used);
            if (isa == CPU_ISA_DOTPROD) {
                CHECK(used & CPU_USED_NEON, "dotprod, %s: dispatch used 0x%x", name, used);
                if (fmts[f].quant && (!strcmp(fmts[f].quant, "q8_0") || !strcmp(fmts[f].quant, "q4_0")))
                    CHECK(used & CPU_USED_DOTPROD, "dotprod, %s: sdot kernels not used (0x%x)", name, used);
            }
            if (isa == CPU_ISA_AVX512) {
                CHECK(used & CPU_USED_AVX512, "avx512, %s: dispatch used 0x%x", name, used);
                const int int8 = fmts[f].quant && !fmts[f].qact &&
                                 (!strcmp(fmts[f].quant, "q8_0") || !strcmp(fmts[f].quant, "q4_0") || !strcmp(fmts[f].quant, "gptq-int4"));
                if (vnni && int8) CHECK(used & CPU_USED_VNNI, "avx512 with VNNI, %s: VNNI kernels not used (0x%x)", name, used);
            }
            kiln_seq_free(s);
            kiln_engine_close(e);
        }
    }
    cpu_set_isa(saved);
}

/* ==== scratch memory that cannot be had ====
 *
 * Every scratch allocation of a forward, one at a time, is made to fail
 * (cpu_test_fail_scratch: the k-th allocation from now, k = 1, 2, ...) in
 * a 12-token prefill and two decode steps, per instruction set and weight
 * format (the dense and int8 GEMMs and row kernels, the GPTQ act-order
 * permutation, the exact FP8 path, MoE, attention, RoPE). An eval whose
 * allocation failed must fail with the out-of-memory message and leave
 * the sequence and the KV pool as they were; the same eval again must then
 * give the logits of a run that never failed, bit for bit; and an eval
 * during which the armed failure did not happen must succeed with those
 * logits (so no allocation goes unreported, and the loop ends). */
static void scratch_oom_one(const struct kiln_engine_opts *o, const char *name, int isa) {
    char err[512];
    kiln_engine *e = kiln_engine_open(o, err, sizeof err);
    CHECK(e != NULL, "%s: %s", name, err);
    if (!e) return;
    struct kiln_backend *be = e->be;
    const int V = kiln_engine_config(e)->vocab;
    const int n_in[3] = {12, 1, 1}, off[3] = {0, 12, 13};
    float *want = kiln_malloc(sizeof(float) * 3 * (size_t)V), *got = kiln_malloc(sizeof(float) * (size_t)V);
    kiln_seq *s = kiln_seq_new(e, err, sizeof err);
    int rc = 0;
    for (int t = 0; t < 3 && !rc; t++) rc = kiln_seq_eval(s, prompt + off[t], n_in[t], want + (size_t)t * V, 0, err, sizeof err);
    CHECK(rc == 0, "%s: %s", name, err);
    kiln_seq_truncate(s, 0);
    int failures = 0;
    for (int t = 0; t < 3 && !rc; t++) {
        const int len = kiln_seq_len(s), free0 = kv_pool_n_free(&e->kv);
        for (int k = 1;; k++) {
            if (k > 500) {
                CHECK(0, "%s isa %d step %d: more than 500 allocations in one eval", name, isa, t);
                break;
            }
            cpu_test_fail_scratch(be, k);
            rc = kiln_seq_eval(s, prompt + off[t], n_in[t], got, 0, err, sizeof err);
            const int fired = cpu_test_fail_fired(be);
            cpu_test_fail_scratch(be, 0); /* disarmed */
            if (!fired) {
                CHECK(rc == 0 && !memcmp(got, want + (size_t)t * V, sizeof(float) * (size_t)V),
                      "%s isa %d step %d: an eval without a failed allocation: rc %d (%s) or other logits", name, isa, t, rc,
                      rc ? err : "");
                break;
            }
            failures++;
            CHECK(rc == -1 && strstr(err, "out of memory") && kiln_seq_len(s) == len && kv_pool_n_free(&e->kv) == free0,
                  "%s isa %d step %d: allocation %d failed: rc %d, \"%s\", length %d (was %d), free KV pages %d (were %d)", name,
                  isa, t, k, rc, rc ? err : "", kiln_seq_len(s), len, kv_pool_n_free(&e->kv), free0);
            rc = kiln_seq_eval(s, prompt + off[t], n_in[t], got, 0, err, sizeof err);
            CHECK(rc == 0 && !memcmp(got, want + (size_t)t * V, sizeof(float) * (size_t)V),
                  "%s isa %d step %d: the eval again after allocation %d failed: rc %d (%s) or other logits", name, isa, t, k, rc,
                  rc ? err : "");
            if (rc) break;
            kiln_seq_truncate(s, len);
        }
    } /* the eval that ended the loop took the sequence on to the next step */
    CHECK(failures > 0, "%s isa %d: no scratch allocation was made", name, isa);
    kiln_seq_free(s);
    free(want), free(got);
    kiln_engine_close(e);
}

static void test_scratch_oom(void) {
    /* cfg: a dummy config other than micro's (the MoE's experts as lists of matmuls) */
    static const struct {
        const char *quant, *dtype, *dir, *cfg;
    } fmts[] = {{NULL, "bf16", NULL, NULL},
                {NULL, "f32", NULL, NULL},
                {"q8_0", NULL, NULL, NULL},
                {"q4_0", NULL, NULL, NULL},
                {"gptq-int4", NULL, NULL, NULL},
                {"gptq-int8", NULL, NULL, NULL},
                {"awq", NULL, NULL, NULL},
                {"fp8", NULL, NULL, NULL},
                {"q4_k", NULL, NULL, NULL},
                {NULL, NULL, "micro-moe", NULL},
                {NULL, NULL, "gptq-int4-g32-asym-act", NULL},
                {"q4_0", NULL, NULL, FIXTURES "/dummy/qwen3-moe-small.json"},
                {"gptq-int4", NULL, NULL, FIXTURES "/dummy/qwen3-moe-small.json"}};
    const int saved = cpu_isa();
    for (int isa = CPU_ISA_SCALAR; isa <= cpu_isa_max(); isa++) {
        CHECK(cpu_set_isa(isa) == isa);
        for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
            char dir[512];
            struct kiln_engine_opts o = {.dummy = QDIR "/micro/config.json", .dummy_dtype = fmts[f].dtype, .backend = "cpu",
                                         .quant = fmts[f].quant, .quant_group = 32, .max_total_tokens = 64, .n_threads = 2};
            if (fmts[f].quant && strstr(fmts[f].quant, "_k")) o.dummy = QDIR "/gguf/kmix-ref/config.json";
            if (fmts[f].cfg) o.dummy = fmts[f].cfg, o.quant_group = 128;
            if (fmts[f].dir) {
                snprintf(dir, sizeof dir, QDIR "/%s", fmts[f].dir);
                o.dummy = NULL, o.model = dir;
            }
            char name[64];
            snprintf(name, sizeof name, "%s%s", fmts[f].cfg ? "moe " : "",
                     fmts[f].dir ? fmts[f].dir : fmts[f].quant ? fmts[f].quant : fmts[f].dtype);
            scratch_oom_one(&o, name, isa);
        }
    }
    cpu_set_isa(saved);
}

/* ==== quality: KL(P_bf16 || P_quant) and top-1 agreement ====
 *
 * Not a check: with KILN_QUANT_QUALITY=DIR[,DIR...] set, every model DIR is
 * quantized by kiln_quantize into each format (under /tmp) and the next-token
 * distributions of a fixed 128-token random prompt, at every position, are
 * compared with the BF16 model's. Prints the rows of docs/quant.md's table. */
static void quality_one(const char *dir, const char *fmt) {
    char out[512], err[1024] = "";
    const char *base = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    int gguf = fmt[0] == 'q';
    snprintf(out, sizeof out, "/tmp/kiln-quality-%s-%s%s", base, fmt, gguf ? ".gguf" : "");
    double t0 = kiln_now();
    if (kiln_quantize(dir, fmt, 128, out, err, sizeof err)) {
        fprintf(stderr, "| %s | %s | quantize failed: %s |\n", base, fmt, err);
        return;
    }
    double tq = kiln_now() - t0;
    enum { T = 128 };
    int32_t ids[T];
    struct kiln_rng r;
    kiln_rng_seed(&r, 99);
    const char *paths[2] = {dir, out};
    float *lg[2] = {NULL, NULL};
    int V = 0;
    int64_t bytes[2] = {0, 0};
    for (int m = 0; m < 2; m++) {
        struct kiln_engine_opts o = {.model = paths[m], .backend = "cpu", .max_total_tokens = T + 16};
        kiln_engine *e = kiln_engine_open(&o, err, sizeof err);
        if (!e) {
            fprintf(stderr, "| %s | %s | load failed: %s |\n", base, fmt, err);
            free(lg[0]);
            return;
        }
        V = kiln_engine_config(e)->vocab;
        if (m == 0)
            for (int i = 0; i < T; i++) ids[i] = (int32_t)(kiln_rng_next(&r) % (uint64_t)V);
        bytes[m] = kiln_engine_param_bytes(e);
        lg[m] = kiln_malloc(sizeof(float) * (size_t)V * T);
        kiln_seq *s = kiln_seq_new(e, err, sizeof err);
        kiln_seq_eval(s, ids, T, lg[m], 1, err, sizeof err);
        kiln_seq_free(s);
        kiln_engine_close(e);
    }
    double kl = 0, klmax = 0;
    int top1 = 0;
    for (int t = 0; t < T; t++) {
        const float *a = lg[0] + (size_t)t * V, *b = lg[1] + (size_t)t * V;
        double ma = a[argmax(a, V)], mb = b[argmax(b, V)], za = 0, zb = 0;
        for (int i = 0; i < V; i++) za += exp(a[i] - ma), zb += exp(b[i] - mb);
        double k = 0;
        for (int i = 0; i < V; i++) {
            double la = a[i] - ma - log(za), lb = b[i] - mb - log(zb);
            k += exp(la) * (la - lb);
        }
        kl += k / T;
        klmax = fmax(klmax, k);
        top1 += argmax(a, V) == argmax(b, V);
    }
    fprintf(stderr, "| %s | %s | %.2f | %.3g | %.3g | %.1f%% | %.0fs |\n", base, fmt, (double)bytes[1] / bytes[0], kl, klmax, 100.0 * top1 / T, tq);
    free(lg[0]), free(lg[1]);
}

static void quality_report(const char *list) {
    const char *fmts[] = {"q8_0", "q4_k", "q4_0", "gptq-int8", "gptq-int4", "fp8"};
    fprintf(stderr, "| model | format | weight bytes vs bf16 | mean KL | max KL | top-1 | quantize time |\n|---|---|---|---|---|---|---|\n");
    char *dup = kiln_strdup(list), *save = NULL;
    for (char *d = strtok_r(dup, ",", &save); d; d = strtok_r(NULL, ",", &save))
        for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
            if (!getenv("KILN_QUANT_QUALITY_FMTS") || strstr(getenv("KILN_QUANT_QUALITY_FMTS"), fmts[f])) quality_one(d, fmts[f]);
    free(dup);
}

/* ==== kiln quantize round trip ==== */

static void test_quantize_roundtrip(void) {
    const char *fmts[] = {"q8_0", "q4_0", "q4_k", "gptq-int4", "gptq-int8", "fp8"};
    /* The layout check: each written linear, read back and dequantized by
     * kiln's reference, against the source weights (relative RMS error: a
     * packing mistake gives ~100%; RTN gives ~0.5% at 8 bits, ~3% for e4m3,
     * ~8% at 4 bits). Then the logits, with the tolerance one RTN step costs
     * on this fixture (|logit| up to ~8): max |delta| and top-1 agreement. */
    const float tol[] = {0.15f, 2.0f, 1.0f, 2.0f, 0.15f, 0.6f};
    const float wtol[] = {0.01f, 0.12f, 0.12f, 0.12f, 0.01f, 0.05f};
    const char *src = FIXTURES "/qwen3-dense-small";
    char err[1024] = "";
    int V = 0, V2 = 0;
    setenv("KILN_QACT", "f32", 1);
    float *ref = all_logits(src, &V, err, sizeof err);
    CHECK(ref != NULL, "%s", err);
    for (size_t f = 0; ref && f < sizeof fmts / sizeof fmts[0]; f++) {
        char out[256];
        snprintf(out, sizeof out, "/tmp/kiln-test-quantize-%d-%s%s", (int)getpid(), fmts[f], fmts[f][0] == 'q' ? ".gguf" : "");
        int rc = kiln_quantize(src, fmts[f], 32, out, err, sizeof err);
        CHECK(rc == 0, "quantize %s: %s", fmts[f], err);
        if (rc == 0) {
            struct kiln_backend *be = backend_create("cpu", 0, err, sizeof err);
            struct kiln_model a, b;
            if (be && model_load_dir(&a, src, be, err, sizeof err) == 0) {
                if (model_load_dir(&b, out, be, err, sizeof err) == 0) {
                    double worst = 0;
                    for (int l = 0; l < a.cfg.n_layer; l++) {
                        const struct qlinear *la[] = {&a.layers[l].wq, &a.layers[l].wk, &a.layers[l].wv, &a.layers[l].wo, &a.layers[l].gate, &a.layers[l].up, &a.layers[l].down};
                        const struct qlinear *lb[] = {&b.layers[l].wq, &b.layers[l].wk, &b.layers[l].wv, &b.layers[l].wo, &b.layers[l].gate, &b.layers[l].up, &b.layers[l].down};
                        for (int i = 0; i < 7; i++) {
                            size_t n = (size_t)la[i]->n_out * la[i]->n_in;
                            float *wa = kiln_malloc(n * 4), *wb = kiln_malloc(n * 4);
                            quant_dequant_linear(la[i], wa);
                            quant_dequant_linear(lb[i], wb);
                            double e2 = 0, s2 = 0;
                            for (size_t j = 0; j < n; j++) e2 += (wa[j] - wb[j]) * (double)(wa[j] - wb[j]), s2 += wa[j] * (double)wa[j];
                            worst = fmax(worst, sqrt(e2 / s2));
                            free(wa), free(wb);
                        }
                    }
                    CHECK(worst <= wtol[f], "quantize %s: a linear's relative RMS error %.3g > %.3g", fmts[f], worst, wtol[f]);
                    if (getenv("KILN_TEST_VERBOSE")) fprintf(stderr, "  quantize %-10s worst linear relative RMS error %.3g\n", fmts[f], worst);
                    model_free(&b);
                } else {
                    CHECK(0, "load %s: %s", out, err);
                }
                model_free(&a);
            }
            if (be) be->destroy(be);
        }
        float *q = rc ? NULL : all_logits(out, &V2, err, sizeof err);
        CHECK(q != NULL, "load %s: %s", out, err);
        if (q) {
            float d = maxdiff(ref, q, (size_t)V * NP);
            int agree = 0;
            for (int t = 0; t < NP; t++) agree += argmax(ref + (size_t)t * V, V) == argmax(q + (size_t)t * V, V);
            CHECK(d <= tol[f] && agree >= NP / 2, "quantize %s: max |delta| %g (tol %g), top-1 %d/%d", fmts[f], d, tol[f], agree, NP);
            if (getenv("KILN_TEST_VERBOSE")) fprintf(stderr, "  quantize %-10s round trip: max |delta| %.3g, top-1 %d/%d\n", fmts[f], d, agree, NP);
        }
        free(q);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
        if (system(cmd)) fprintf(stderr, "  could not remove %s\n", out);
    }
    unsetenv("KILN_QACT");
    free(ref);
}

/* an allocator that refuses every request after the first `left` */
struct fail_alloc {
    void **owned;
    int left;
};
static void *fail_alloc(void *ctx, size_t n) {
    struct fail_alloc *f = ctx;
    if (f->left-- <= 0) return NULL;
    return test_alloc(&f->owned, n);
}

/* dummy quantized weights when memory runs out part way: an error naming
 * it, never a crash (library code does not exit) */
static void test_dummy_oom(void) {
    static const char *fmts[] = {"fp8", "gptq-int4", "awq", "q4_0", "q6_k"};
    static const int allocs[] = {2, 3, 3, 1, 1}; /* what each format makes */
    for (int f = 0; f < 5; f++)
        for (int left = 0; left <= allocs[f]; left++) {
            struct fail_alloc fa = {kiln_calloc(1, sizeof(void *)), left};
            struct qlinear w = {.n_out = 64, .n_in = 256};
            char err[256] = "";
            int rc = quant_dummy_linear(&w, fmts[f], 128, 5, 0.05f, fail_alloc, &fa, err, sizeof err);
            if (left < allocs[f]) CHECK(rc != 0 && strstr(err, "out of memory"), "%s, %d allocations allowed: rc %d, '%s'", fmts[f], left, rc, err);
            else CHECK(rc == 0, "%s with every allocation: %s", fmts[f], err);
            for (int k = 0; fa.owned[k]; k++) free(fa.owned[k]);
            free(fa.owned);
        }
}

/* ==== the CUDA backend's 4-bit layout (backend/cuda/w4pack.c), read back on the CPU ==== */

/*
 * Each case through w4_pack, then every weight read back from the layout
 * the way the kernel reads it (w4_pack_weight: the code from its word and
 * bit position, the scale and 128 + z from the tile's scale word) against
 * the reference dequantization at the same column (perm[k] for
 * act-order): equal to the last bit (s (q - z) is exact in f32 both ways),
 * and the padding rows zero. Formats or group shapes the
 * layout does not take (GPTQ int8, K % 32, groups of 96, f32 scales that
 * neither f16 nor bf16 holds) must come back 0, to be widened to bf16.
 */
static void test_w4_pack(void) {
    static const struct {
        const char *fmt;
        int n_out, n_in, group, act, asym, scales, want; /* scales: 0 as made, 1 bf16 values beyond f16, 2 f32 beyond both */
    } cases[] = {
        {"gptq-int4", 64, 512, 128, 0, 0, 0, 1}, {"gptq-int4", 40, 384, 32, 1, 1, 0, 1}, {"gptq-int4", 24, 256, 64, 1, 1, 0, 1},
        {"gptq-int4", 24, 160, -1, 0, 1, 0, 1},  {"awq", 48, 4064, 32, 0, 1, 0, 1},   {"awq", 32, 256, 128, 0, 1, 1, 1},
        {"q4_0", 33, 96, 0, 0, 0, 0, 1},         {"q4_0", 16, 1024, 0, 0, 0, 0, 1},   {"gptq-int4", 16, 200, 8, 0, 1, 0, 0},
        {"gptq-int4", 16, 384, 96, 0, 0, 0, 0},  {"gptq-int8", 16, 256, 128, 0, 0, 0, 0}, {"gptq-int4", 16, 256, 128, 0, 0, 2, 0},
        {"q8_0", 16, 256, 0, 0, 0, 0, 0},
    };
    char err[256];
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        struct ref_qmem m = {0};
        struct qlinear w;
        CHECK(ref_quant_linear(&w, &m, cases[ci].fmt, cases[ci].n_out, cases[ci].n_in, cases[ci].group, cases[ci].act, cases[ci].asym,
                               5 + ci, err, sizeof err) == 0, "%s", err);
        const int N = w.n_out, K = w.n_in;
        void *scales_own = NULL;
        if (cases[ci].scales) { /* rewrite the f16 scales: bf16 values f16 cannot hold, or f32 values neither holds */
            const int64_t ns = w.scales.rows * w.scales.cols;
            const uint16_t *h = w.scales.data;
            void *ns_data = scales_own = kiln_malloc((size_t)ns * 4);
            for (int64_t i = 0; i < ns; i++) {
                const float v = kiln_f16_to_f32(h[i]) * (cases[ci].scales == 1 ? 0x1p-20f : 1.f);
                if (cases[ci].scales == 1) ((uint16_t *)ns_data)[i] = kiln_f32_to_bf16(v);
                else ((float *)ns_data)[i] = v * (1.f + 0x1p-20f);
            }
            w.scales.data = ns_data, w.scales.dtype = cases[ci].scales == 1 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
        }
        float *deq = kiln_malloc(sizeof(float) * (size_t)N * K);
        quant_dequant_linear(&w, deq);
        struct w4_pack p;
        const int rc = w4_pack(&p, &w, err, sizeof err);
        char label[48];
        quant_linear_label(&w, label, sizeof label);
        CHECK(rc == cases[ci].want, "%s %dx%d: w4_pack %d, expected %d (%s)", label, N, K, rc, cases[ci].want, rc < 0 ? err : "");
        if (rc == 1) {
            const int tiles = (N + 15) / 16;
            CHECK(p.q_bytes == (size_t)tiles * p.nkb * 1024 && p.nkb == (K + 127) / 128, "%s %dx%d: %zu code bytes", label, N, K, p.q_bytes);
            CHECK(p.sbf == (cases[ci].scales == 1), "%s %dx%d: scales as %s", label, N, K, p.sbf ? "bf16" : "f16");
            CHECK(!cases[ci].act || p.perm, "%s %dx%d: act-order without a column order", label, N, K);
            int bad = 0, bad_n = 0, bad_k = 0;
            for (int n = 0; n < tiles * 16; n++) /* padding columns: never read (the kernel's x is zero there) */
                for (int k = 0; k < K; k++) {
                    const float got = w4_pack_weight(&p, n, k);
                    const float want = n < N && k < K ? deq[(size_t)n * K + (p.perm ? p.perm[k] : k)] : 0.f;
                    if (got != want && !bad++) bad_n = n, bad_k = k;
                }
            CHECK(bad == 0, "%s %dx%d%s: %d weights read back wrong, first (%d, %d)", label, N, K, cases[ci].act ? " act" : "", bad, bad_n, bad_k);
            w4_pack_free(&p);
        }
        free(deq), free(scales_own);
        ref_qmem_free(&m);
    }
}

/* quant_widen_bf16 (what the CUDA backend keeps for formats it has no
 * kernels for) against the reference dequantization rounded to bf16, bit
 * for bit, for each format family: GPTQ (int4 act-order asym, int8), AWQ,
 * FP8 with partial edge blocks, GGUF blocks, F16 */
static void test_widen_bf16(void) {
    static const struct {
        const char *fmt;
        int n_out, n_in, group, act;
    } cases[] = {{"gptq-int4", 40, 384, 32, 1}, {"gptq-int8", 24, 256, 128, 1}, {"awq", 32, 256, 64, 0}, {"fp8", 200, 300, 0, 0},
                 {"q8_0", 20, 256, 0, 0},        {"q4_k", 12, 512, 0, 0},        {"iq4_xs", 8, 256, 0, 0}, {"q4_0", 9, 96, 0, 0}};
    char err[256];
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        struct ref_qmem m = {0};
        struct qlinear w;
        CHECK(ref_quant_linear(&w, &m, cases[ci].fmt, cases[ci].n_out, cases[ci].n_in, cases[ci].group, cases[ci].act, 1, 40 + ci, err,
                               sizeof err) == 0, "%s", err);
        const int N = w.n_out, K = w.n_in;
        float *ref = kiln_malloc(sizeof(float) * (size_t)N * K);
        uint16_t *got = kiln_malloc(2 * (size_t)N * K);
        quant_dequant_linear(&w, ref);
        CHECK(quant_widen_bf16(&w, got, err, sizeof err) == 0, "%s: %s", cases[ci].fmt, err);
        int bad = 0;
        for (size_t i = 0; i < (size_t)N * K; i++) bad += got[i] != kiln_f32_to_bf16(ref[i]);
        CHECK(bad == 0, "%s %dx%d: %d of %d values differ from the reference rounded to bf16", cases[ci].fmt, N, K, bad, N * K);
        free(ref), free(got);
        ref_qmem_free(&m);
    }
}

void test_quant(void) {
    const char *ql = getenv("KILN_QUANT_QUALITY");
    if (ql) {
        quality_report(ql);
        return;
    }
    test_quantize_roundtrip();
    test_roundtrip();
    test_kernels();
    test_qgemm();
    test_fp8_codes();
    test_kq_extremes();
    test_x16();
    test_qmulti();
    test_moe_tasks();
    test_config_errors();
    test_gguf_parser();
    test_pairs();
    test_gguf_tokenizer();
    test_gguf_qwen3_tokenizer();
    test_dummy();
    test_dummy_dropped();
    test_isa_dispatch();
    test_scratch_oom();
    test_dummy_oom();
    test_w4_pack();
    test_widen_bf16();
}
