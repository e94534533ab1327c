/*
 * test_cuda.c: the CUDA backend against the CPU backend and the fixtures.
 * Needs a GPU; without one (or in a build without CUDA) the group reports
 * that it skipped. `make test-cuda` runs it.
 *
 * (a) ops: every op of the table on random inputs of real model shapes
 *     (Qwen3-8B: dim 4096, 32/8 heads of 128, ffn 12288; a Qwen3-MoE-like
 *     layer), CUDA vs CPU, by relative error ||cuda - cpu|| / ||cpu||.
 *     Inputs are bf16-representable so both backends see the same numbers;
 *     the CUDA op then differs by its own bf16 rounding of the output
 *     (relative 2^-9 per element) and f32 summation order: 1e-2 leaves a
 *     margin of ~3x over the ~3e-3 that one rounding gives. Attention and
 *     MoE round twice (P or the expert hidden state, then the output): 2e-2.
 *
 * (b) models: each fixture (transformers f32 reference) run on CUDA.
 *     Tolerance on the logits: |delta| <= TOL_LOGIT * (max - min of the
 *     reference logits), TOL_LOGIT = 0.04. Why: bf16 keeps 8 significant
 *     bits, so each rounding of an activation is a relative error up to
 *     2^-9 = 0.2%. A layer rounds the residual stream about 8 times on its
 *     way (norm, q/k/v, attention, o_proj, add, norm, gate/up/swiglu, down,
 *     add); independent roundings add like a random walk, so after L layers
 *     the hidden state carries ~ sqrt(8 L) * 0.2% ~ 1% (L = 3..4 here),
 *     and the lm_head output is itself rounded to bf16 (0.2% of |logit|).
 *     Logits are sums over the hidden state, so their error relative to
 *     their spread is of the same order: ~1-2% of the range, and 4% is
 *     twice that. Top-1 must agree wherever the reference's top-1/top-2
 *     margin exceeds the tolerance; greedy continuations must be identical
 *     up to the first step whose margin (measured by the CPU backend, which
 *     matches the reference to 1e-3) is within the tolerance.
 *     The quantized checkpoints of tests/fixtures/quant (GPTQ, AWQ, GGUF)
 *     run on CUDA against their dequantized reference model on the CPU,
 *     with the same tolerance: the weights are the same numbers, kept 4-bit
 *     or widened to bf16 at load (check_quant_pairs).
 */
#include <math.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "backend/backend.h"
#include "base/base.h"
#include "format/quant.h"
#include "kiln.h"
#include "ref.h"
#include "test.h"

#define TOL_OP 1e-2
#define TOL_OP2 2e-2
#define TOL_LOGIT 0.04f

static int verbose(void) { return getenv("KILN_TEST_VERBOSE") != NULL; }

/* whether none of these KILN_CUDA_* switches is set to 0 (a fusion's
 * launch count is checked only where the fusion is on) */
static int switches_on(const char *const *names) {
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && !strcmp(v, "0")) return 0;
    }
    return 1;
}

/* a copy of an environment variable's value (NULL: unset), and putting it back */
static char *env_save(const char *name) {
    const char *v = getenv(name);
    return v ? strdup(v) : NULL;
}
static void env_restore(const char *name, const char *saved) {
    if (saved) setenv(name, saved, 1);
    else unsetenv(name);
}

/* ==== helpers ==== */

static uint64_t rs = 0x243f6a8885a308d3ull;
static float frand(void) { /* uniform [-1, 1), rounded to bf16 */
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    float v = (float)((rs >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
    return kiln_bf16_to_f32(kiln_f32_to_bf16(v));
}

static float *rand_vec(size_t n, float scale) {
    float *v = kiln_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = kiln_bf16_to_f32(kiln_f32_to_bf16(frand() * scale));
    return v;
}

/* a bf16 host tensor (rows, cols) of uniform noise * scale + mean */
static struct ktensor rand_tensor(int64_t rows, int64_t cols, float scale, float mean) {
    struct ktensor t = {.dtype = KILN_DTYPE_BF16, .rows = rows, .cols = cols};
    uint16_t *d = kiln_malloc((size_t)(rows * cols) * 2);
    for (int64_t i = 0; i < rows * cols; i++) d[i] = kiln_f32_to_bf16(mean + scale * frand());
    t.data = d;
    return t;
}

static struct qlinear rand_linear(int n_out, int n_in, int bias) {
    struct qlinear w = {.n_out = n_out, .n_in = n_in, .fmt = KILN_WFMT_DENSE};
    w.w = rand_tensor(n_out, n_in, 1.f / sqrtf((float)n_in), 0.f);
    if (bias) w.bias = rand_tensor(1, n_out, 0.5f, 0.f);
    return w;
}

struct pair {
    struct kiln_backend *cpu, *gpu;
};

/* the same f32 host data in a buffer of each backend */
static void put(struct pair *p, void **bc, void **bg, const float *h, size_t n) {
    *bc = p->cpu->alloc(p->cpu, n * p->cpu->act_size);
    *bg = p->gpu->alloc(p->gpu, n * p->gpu->act_size);
    p->cpu->write(p->cpu, *bc, h, n);
    p->gpu->write(p->gpu, *bg, h, n);
}

static void *alloc_both(struct pair *p, void **bg, size_t n) {
    *bg = p->gpu->alloc(p->gpu, n * p->gpu->act_size);
    p->gpu->memzero(p->gpu, *bg, n * p->gpu->act_size);
    void *c = p->cpu->alloc(p->cpu, n * p->cpu->act_size);
    p->cpu->memzero(p->cpu, c, n * p->cpu->act_size); /* p->cpu may be a second CUDA backend */
    return c;
}

/* relative error of the CUDA buffer against the CPU buffer */
static double compare(struct pair *p, const void *bc, const void *bg, size_t n, double *max_abs) {
    float *a = kiln_malloc(n * 4), *b = kiln_malloc(n * 4);
    p->cpu->read(p->cpu, a, bc, n);
    p->gpu->read(p->gpu, b, bg, n);
    double num = 0, den = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)b[i] - a[i];
        if (!(fabs(d) <= mx)) mx = fabs(d); /* NaN fails */
        num += d * d, den += (double)a[i] * a[i];
    }
    free(a), free(b);
    if (max_abs) *max_abs = mx;
    double r = sqrt(num / (den > 0 ? den : 1));
    return mx != mx ? INFINITY : r;
}

static void check_rel(struct pair *p, const char *what, const void *bc, const void *bg, size_t n, double tol) {
    double mx, r = compare(p, bc, bg, n, &mx);
    if (verbose()) fprintf(stderr, "  %-44s rel %.2e  max|d| %.3g\n", what, r, mx);
    CHECK(r <= tol, "%s: relative error %.3g > %.3g (max |delta| %.3g)", what, r, tol, mx);
}

static void free_both(struct pair *p, void *bc, void *bg) {
    p->cpu->free(p->cpu, bc);
    p->gpu->free(p->gpu, bg);
}

/* The CPU and CUDA backends each keep their prepared form in the same `be`
 * field, so ops are run with per-backend copies of the descriptors. */
struct lin2 {
    struct qlinear c, g;
};

/* w on both backends (the CPU's copy owns w's host data) */
static struct lin2 lin_prepare(struct pair *p, struct qlinear w) {
    char err[256];
    struct lin2 l;
    l.c = w;
    l.g = l.c;
    l.c.bias.be = l.g.bias.be = NULL;
    CHECK(p->cpu->prepare_linear(p->cpu, &l.c, err, sizeof err) == 0, "%s", err);
    CHECK(p->gpu->prepare_linear(p->gpu, &l.g, err, sizeof err) == 0, "%s", err);
    return l;
}

static struct lin2 lin_make(struct pair *p, int n_out, int n_in, int bias) { return lin_prepare(p, rand_linear(n_out, n_in, bias)); }

static void lin_free(struct pair *p, struct lin2 *l) {
    p->cpu->release_linear(p->cpu, &l->c);
    p->gpu->release_linear(p->gpu, &l->g);
    free((void *)l->c.w.data);
    free((void *)l->c.bias.data);
}

struct vec2 {
    struct ktensor c, g;
};

static struct vec2 vec_make(struct pair *p, int64_t rows, int64_t cols, float scale, float mean) {
    char err[256];
    struct vec2 v;
    v.c = rand_tensor(rows, cols, scale, mean);
    v.g = v.c;
    CHECK(p->cpu->prepare_tensor(p->cpu, &v.c, err, sizeof err) == 0, "%s", err);
    CHECK(p->gpu->prepare_tensor(p->gpu, &v.g, err, sizeof err) == 0, "%s", err);
    return v;
}

static void vec_free(struct pair *p, struct vec2 *v) {
    p->cpu->release_tensor(p->cpu, &v->c);
    p->gpu->release_tensor(p->gpu, &v->g);
    free((void *)v->c.data);
}

/* a batch of one sequence of n tokens after n_past cached ones */
struct bat {
    struct kiln_batch b;
    struct kiln_seq_view v[80];
    int32_t tok[16384], pos[16384], rows[16384];
};

static void begin_both(struct pair *p, const struct kiln_batch *b) {
    p->cpu->begin(p->cpu, b);
    p->gpu->begin(p->gpu, b);
}

/* ==== (a) ops ==== */

long kiln_cuda_gemv_tc_count(void) __attribute__((weak));

/* n = 3..16 take the tensor-core GEMV where n_in % 256 == 0 and n_out % 16
 * == 0 (the first three shapes), unless KILN_CUDA_GEMV_TC / _ROWS say
 * otherwise; the others take cuBLAS (or the CUDA-core GEMV up to 8) */
static void test_matmul(struct pair *p) {
    const int shapes[][3] = {{1024, 4096, 0}, {4096, 12288, 0}, {12288, 4096, 1}, {1000, 100, 1}, {77, 200, 0}};
    const int ns[] = {1, 2, 3, 5, 8, 9, 12, 16, 17, 40};
    static const char *const sw[] = {"KILN_CUDA_GEMV_TC", "KILN_CUDA_GEMV_ROWS", "KILN_CUDA_DEFER", NULL};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        struct lin2 w = lin_make(p, shapes[s][0], shapes[s][1], shapes[s][2]);
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            int n = ns[k];
            float *x = rand_vec((size_t)n * w.c.n_in, 1.f);
            void *xc, *xg, *yg, *yc = alloc_both(p, &yg, (size_t)n * w.c.n_out);
            put(p, &xc, &xg, x, (size_t)n * w.c.n_in);
            const long tc0 = kiln_cuda_gemv_tc_count ? kiln_cuda_gemv_tc_count() : 0;
            p->cpu->matmul(p->cpu, yc, xc, &w.c, n);
            p->gpu->matmul(p->gpu, yg, xg, &w.g, n);
            char what[96];
            snprintf(what, sizeof what, "matmul %dx%d%s n=%d", w.c.n_out, w.c.n_in, w.c.bias.data ? "+b" : "", n);
            check_rel(p, what, yc, yg, (size_t)n * w.c.n_out, TOL_OP);
            if (kiln_cuda_gemv_tc_count && switches_on(sw)) {
                const int tc = n >= 3 && n <= 16 && w.c.n_in % 256 == 0 && w.c.n_out % 16 == 0;
                CHECK(kiln_cuda_gemv_tc_count() - tc0 == tc, "%s: tensor-core GEMV ran %ld times (%d)", what,
                      kiln_cuda_gemv_tc_count() - tc0, tc);
            }
            free_both(p, xc, xg), free_both(p, yc, yg), free(x);
        }
        lin_free(p, &w);
    }
}

/* ==== quantized weights on CUDA (qgemm.cu) ==== */

/* a dummy quantized linear (ref_quant_linear) with a bias when asked */
static struct qlinear q_linear(struct ref_qmem *m, const char *fmt, int n_out, int n_in, int group, int act, int asym, int bias) {
    char err[256];
    static uint64_t seed = 11;
    struct qlinear w;
    CHECK(ref_quant_linear(&w, m, fmt, n_out, n_in, group, act, asym, seed++, err, sizeof err) == 0, "%s", err);
    if (bias) w.bias = rand_tensor(1, n_out, 0.5f, 0.f);
    return w;
}

long kiln_cuda_w4_count(void) __attribute__((weak));

/*
 * Each format on CUDA against the exact product with the reference
 * dequantization (quant_dequant_linear, f64 sums): 4-bit GPTQ / AWQ (sym,
 * asym, act-order, groups of 32 / 64 / 128 and per channel) and Q4_0 stay
 * 4-bit on the device (their bytes are checked) and take the 4-bit GEMV up
 * to 16 rows of x (its launches counted), a bf16 copy and cuBLAS above;
 * GPTQ int8, Q8_0, Q4_K and a 4-bit linear whose columns are not a multiple
 * of 32 are dequantized to bf16 at load (4-bit: under half the bf16 bytes,
 * ~0.31 of them plus the padding of rows to 16 and columns to 128). Tolerances: the GEMV's products
 * are exact and summed in f32, so what is left is the bf16 rounding of the
 * output (a relative error of at most 2^-9 per element, ~1.1e-3 in the L2
 * norm): 3e-3. Paths that compute on bf16 weights add that rounding of
 * every weight (another ~1.1e-3): 4e-3. A wrong scale or zero point of one
 * group in 32 moves the result by ~10%, a column order off by one by ~100%.
 */
static void test_matmul_quant(struct pair *p) {
    static const struct {
        const char *fmt;
        int n_out, n_in, group, act, asym, bias, w4;
    } cases[] = {
        {"gptq-int4", 1024, 4096, 128, 0, 0, 0, 1},  {"gptq-int4", 4096, 1024, 128, 1, 1, 1, 1},
        {"gptq-int4", 512, 2048, 32, 1, 1, 0, 1},    {"gptq-int4", 256, 1536, 64, 0, 1, 0, 1},
        {"gptq-int4", 200, 160, -1, 0, 1, 1, 1},     {"awq", 1024, 2048, 64, 0, 1, 0, 1},
        {"gptq-int4", 1000, 4096, 128, 1, 0, 1, 1},
        {"awq", 96, 4064, 32, 0, 1, 0, 1},           {"q4_0", 2048, 1024, 0, 0, 0, 0, 1},
        {"q4_0", 1000, 96, 0, 0, 0, 1, 1},           {"gptq-int4", 128, 200, 8, 0, 1, 0, 0},
        {"gptq-int8", 512, 1024, 128, 1, 1, 0, 0},   {"q8_0", 256, 512, 0, 0, 0, 0, 0},
        {"q4_k", 256, 512, 0, 0, 0, 0, 0},
    };
    const int ns[] = {1, 2, 5, 8, 9, 16, 17, 40};
    char err[256];
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        struct ref_qmem m = {0};
        struct qlinear w = q_linear(&m, cases[ci].fmt, cases[ci].n_out, cases[ci].n_in, cases[ci].group, cases[ci].act,
                                    cases[ci].asym, cases[ci].bias);
        const int N = w.n_out, K = w.n_in;
        float *wd = kiln_malloc(sizeof(float) * (size_t)N * K);
        quant_dequant_linear(&w, wd);
        struct qlinear wg = w;
        wg.bias.be = NULL;
        CHECK(p->gpu->prepare_linear(p->gpu, &wg, err, sizeof err) == 0, "%s: %s", cases[ci].fmt, err);
        char label[48], what[160];
        quant_linear_label(&w, label, sizeof label);
        const int64_t bytes = p->gpu->linear_bytes(p->gpu, &wg), bf = (int64_t)N * K * 2 + (w.bias.data ? N * 4 : 0);
        if (cases[ci].w4)
            CHECK(bytes * 2 < bf, "%s %dx%d: %lld device bytes, not kept 4-bit (bf16: %lld)", label, N, K, (long long)bytes, (long long)bf);
        else
            CHECK(bytes == bf, "%s %dx%d: %lld device bytes, not the bf16 copy's %lld", label, N, K, (long long)bytes, (long long)bf);
        /* the 4-bit GEMV's variants (qgemm.cu): default (group scales once
         * per block where groups span it, zeros folded into the sums), scales
         * per chunk, zeros subtracted from the codes, both */
        static const char *const var_gb[] = {NULL, "0", NULL, "0"}, *const var_zf[] = {NULL, NULL, "0", "0"};
        for (int var = 0; var < (cases[ci].w4 ? 4 : 1); var++) {
            char *gb_saved = env_save("KILN_CUDA_W4_GB"), *zf_saved = env_save("KILN_CUDA_W4_ZF");
            env_restore("KILN_CUDA_W4_GB", var_gb[var]), env_restore("KILN_CUDA_W4_ZF", var_zf[var]);
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                const int n = ns[k];
                if (var && n > 16) continue; /* the variants are the GEMV's */
                float *x = rand_vec((size_t)n * K, 1.f), *ref = kiln_malloc(sizeof(float) * (size_t)n * N);
                for (int j = 0; j < n; j++)
                    for (int r = 0; r < N; r++) {
                        double a = w.bias.data ? kiln_bf16_to_f32(((const uint16_t *)w.bias.data)[r]) : 0;
                        for (int i = 0; i < K; i++) a += (double)x[(size_t)j * K + i] * wd[(size_t)r * K + i];
                        ref[(size_t)j * N + r] = (float)a;
                    }
                void *xc, *xg, *yg, *yc = alloc_both(p, &yg, (size_t)n * N);
                put(p, &xc, &xg, x, (size_t)n * K);
                p->cpu->write(p->cpu, yc, ref, (size_t)n * N);
                const long c0 = kiln_cuda_w4_count ? kiln_cuda_w4_count() : 0;
                p->gpu->matmul(p->gpu, yg, xg, &wg, n);
                /* 4-bit: the GEMV, in 16-row slices past 16 rows, up to
                 * 48 rows for groups of more than 64 columns and 32 for
                 * smaller ones (Q4_0, the one GGUF type here, has 32); the bf16 copy past that */
                const int grp = w.fmt == KILN_WFMT_GGUF ? 32 : w.group, lim = grp > 64 ? 48 : 32;
                const int gemv = !cases[ci].w4 ? 0 : n <= 16 ? 1 : n <= lim ? (n + 15) / 16 : 0;
                snprintf(what, sizeof what, "%s %dx%d%s%s n=%d%s%s", label, N, K, cases[ci].act ? " act" : "",
                         cases[ci].asym ? " asym" : "", n, var_gb[var] ? ", GB=0" : "", var_zf[var] ? ", ZF=0" : "");
                check_rel(p, what, yc, yg, (size_t)n * N, gemv ? 3e-3 : 4e-3);
                if (kiln_cuda_w4_count)
                    CHECK(kiln_cuda_w4_count() - c0 == gemv, "%s: 4-bit GEMV ran %ld times, expected %d", what,
                          kiln_cuda_w4_count() - c0, gemv);
                free_both(p, xc, xg), free_both(p, yc, yg), free(x), free(ref);
            }
            env_restore("KILN_CUDA_W4_GB", gb_saved), env_restore("KILN_CUDA_W4_ZF", zf_saved);
            free(gb_saved), free(zf_saved);
        }
        p->gpu->release_linear(p->gpu, &wg);
        free(wd);
        free((void *)w.bias.data);
        ref_qmem_free(&m);
    }
}

/* the two CUDA buffers hold the same bits (n activations) */
static int same_bits(struct kiln_backend *a, const void *ba, struct kiln_backend *b, const void *bb, size_t n) {
    float *u = kiln_malloc(n * 4), *v = kiln_malloc(n * 4);
    a->read(a, u, ba, n);
    b->read(b, v, bb, n);
    int same = memcmp(u, v, n * 4) == 0;
    free(u), free(v);
    return same;
}

/* rmsnorm, add_rmsnorm with out aliasing y (as a layer calls it) and the
 * in-place rmsnorm (the final norm) on n rows of dim, against the CPU; and
 * bit for bit against old, a CUDA backend on the two-pass kernel only
 * (KILN_CUDA_NORM_R=0; the register kernel keeps its arithmetic) */
static void norms_case(struct pair *p, struct kiln_backend *old, int n, int dim) {
    char err[256], what[96];
    struct vec2 w = vec_make(p, 1, dim, 0.5f, 1.f);
    struct ktensor wo = w.c;
    wo.be = NULL;
    CHECK(old->prepare_tensor(old, &wo, err, sizeof err) == 0, "%s", err);
    float *x = rand_vec((size_t)n * dim, 2.f), *y = rand_vec((size_t)n * dim, 1.f);
    const size_t sz = (size_t)n * dim * 2;
    void *xc, *xg, *yc, *yg, *oc, *og, *xo = old->alloc(old, sz), *yo = old->alloc(old, sz), *oo = old->alloc(old, sz);
    put(p, &xc, &xg, x, (size_t)n * dim);
    put(p, &yc, &yg, y, (size_t)n * dim);
    old->write(old, xo, x, (size_t)n * dim);
    old->write(old, yo, y, (size_t)n * dim);
    oc = alloc_both(p, &og, (size_t)n * dim);
    p->cpu->rmsnorm(p->cpu, oc, xc, &w.c, n, dim, 1e-6f);
    p->gpu->rmsnorm(p->gpu, og, xg, &w.g, n, dim, 1e-6f);
    old->rmsnorm(old, oo, xo, &wo, n, dim, 1e-6f);
    snprintf(what, sizeof what, "rmsnorm %dx%d", n, dim);
    check_rel(p, what, oc, og, (size_t)n * dim, TOL_OP);
    CHECK(same_bits(p->gpu, og, old, oo, (size_t)n * dim), "%s: not the two-pass kernel's bits", what);
    p->cpu->add_rmsnorm(p->cpu, xc, yc, yc, &w.c, n, dim, 1e-6f);
    p->gpu->add_rmsnorm(p->gpu, xg, yg, yg, &w.g, n, dim, 1e-6f);
    old->add_rmsnorm(old, xo, yo, yo, &wo, n, dim, 1e-6f);
    snprintf(what, sizeof what, "add_rmsnorm %dx%d: x + y", n, dim);
    check_rel(p, what, xc, xg, (size_t)n * dim, TOL_OP);
    CHECK(same_bits(p->gpu, xg, old, xo, (size_t)n * dim), "%s: not the two-pass kernel's bits", what);
    snprintf(what, sizeof what, "add_rmsnorm %dx%d: norm (out aliases y)", n, dim);
    check_rel(p, what, yc, yg, (size_t)n * dim, TOL_OP);
    CHECK(same_bits(p->gpu, yg, old, yo, (size_t)n * dim), "%s: not the two-pass kernel's bits", what);
    p->cpu->rmsnorm(p->cpu, xc, xc, &w.c, n, dim, 1e-6f);
    p->gpu->rmsnorm(p->gpu, xg, xg, &w.g, n, dim, 1e-6f);
    old->rmsnorm(old, xo, xo, &wo, n, dim, 1e-6f);
    snprintf(what, sizeof what, "rmsnorm in place %dx%d", n, dim);
    check_rel(p, what, xc, xg, (size_t)n * dim, TOL_OP);
    CHECK(same_bits(p->gpu, xg, old, xo, (size_t)n * dim), "%s: not the two-pass kernel's bits", what);
    free_both(p, xc, xg), free_both(p, yc, yg), free_both(p, oc, og);
    old->free(old, xo), old->free(old, yo), old->free(old, oo);
    old->release_tensor(old, &wo);
    free(x), free(y);
    vec_free(p, &w);
}

/* dims of every register-kernel width (1-4 chunks of 8 per thread, whole
 * and partial) and two that take the two-pass kernel (dim % 8, > 8192) */
static void test_norms(struct pair *p) {
    char err[256];
    char *saved = getenv("KILN_CUDA_NORM_R") ? strdup(getenv("KILN_CUDA_NORM_R")) : NULL;
    setenv("KILN_CUDA_NORM_R", "0", 1);
    struct kiln_backend *old = backend_create("cuda", 0, err, sizeof err);
    if (saved) setenv("KILN_CUDA_NORM_R", saved, 1), free(saved);
    else unsetenv("KILN_CUDA_NORM_R");
    CHECK(old != NULL, "%s", err);
    if (!old) return;
    const int dims[] = {4096, 1024, 896, 2560, 5120, 8192, 100, 10240};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        norms_case(p, old, 5, dims[i]);
        norms_case(p, old, 1, dims[i]);
    }
    old->destroy(old);
}

/* a rope table (theta 1e6, head_dim hd) prepared on both backends, and
 * q/k norm weights */
struct rope2 {
    struct rope c, g;
    float *inv_freq;
    struct vec2 qn, kn;
};

static struct rope2 rope2_make(struct pair *p, int hd) {
    struct rope2 R;
    char err[256];
    R.inv_freq = kiln_malloc(sizeof(float) * hd / 2);
    for (int i = 0; i < hd / 2; i++) R.inv_freq[i] = 1.f / powf(1e6f, (float)(2 * i) / hd);
    R.c = R.g = (struct rope){.n_freq = hd / 2, .attn_factor = 1.f, .inv_freq = R.inv_freq};
    CHECK(p->cpu->prepare_rope(p->cpu, &R.c, err, sizeof err) == 0, "%s", err);
    CHECK(p->gpu->prepare_rope(p->gpu, &R.g, err, sizeof err) == 0, "%s", err);
    R.qn = vec_make(p, 1, hd, 0.5f, 1.f), R.kn = vec_make(p, 1, hd, 0.5f, 1.f);
    return R;
}

static void rope2_free(struct pair *p, struct rope2 *R) {
    p->cpu->release_rope(p->cpu, &R->c);
    p->gpu->release_rope(p->gpu, &R->g);
    free(R->inv_freq);
    vec_free(p, &R->qn), vec_free(p, &R->kn);
}

/* one rope case: q/k norm (or not) + rope on n tokens at scattered
 * positions, then the same again followed by the KV write the model does
 * next (the CUDA backend fuses the two), comparing q, k and both caches */
static void rope_case(struct pair *p, const char *what, int n, int nh, int nkv, int hd) {
    char msg[160];
    struct rope2 R = rope2_make(p, hd);
    const int P = 16, np = (n + P - 1) / P, n_pages = 2 * np + 1;
    int32_t *pages = kiln_malloc(sizeof(int32_t) * (size_t)np);
    for (int i = 0; i < np; i++) pages[i] = 2 * (np - 1 - i) + 1; /* backwards, every other page */
    static struct bat B;
    memset(&B, 0, sizeof B);
    B.b.n_tokens = n, B.b.tokens = B.tok, B.b.pos = B.pos, B.b.n_seqs = 1, B.b.seqs = B.v;
    B.v[0] = (struct kiln_seq_view){0, n, 0, pages, np};
    for (int i = 0; i < n; i++) B.pos[i] = i == 0 ? 0 : (int)((frand() + 1) * 16000);
    struct kv_cache kc = {1, nkv, hd, P, n_pages, KILN_DTYPE_F32, NULL, NULL}, kg = kc;
    kg.dtype = KILN_DTYPE_BF16;
    void *kcv[2], *kgv[2];
    kc.k = &kcv[0], kc.v = &kcv[1], kg.k = &kgv[0], kg.v = &kgv[1];
    const size_t cache = (size_t)n_pages * P * nkv * hd, nq = (size_t)n * nh * hd, nk = (size_t)n * nkv * hd;
    kcv[0] = alloc_both(p, &kgv[0], cache);
    kcv[1] = alloc_both(p, &kgv[1], cache);
    begin_both(p, &B.b);
    for (int mode = 0; mode < 3; mode++) { /* rope only, norm + rope, norm + rope + KV write */
        const int norm = mode > 0;
        float *q = rand_vec(nq, 2.f), *k = rand_vec(nk, 2.f), *v = rand_vec(nk, 2.f);
        void *qc, *qg, *kc_, *kg_, *vc, *vg;
        put(p, &qc, &qg, q, nq);
        put(p, &kc_, &kg_, k, nk);
        put(p, &vc, &vg, v, nk);
        p->cpu->qk_norm_rope(p->cpu, qc, kc_, norm ? &R.qn.c : NULL, norm ? &R.kn.c : NULL, &R.c, &B.b, nh, nkv, hd, 1e-6f);
        p->gpu->qk_norm_rope(p->gpu, qg, kg_, norm ? &R.qn.g : NULL, norm ? &R.kn.g : NULL, &R.g, &B.b, nh, nkv, hd, 1e-6f);
        if (mode == 2) {
            p->cpu->kv_write(p->cpu, &kc, 0, kc_, vc, &B.b);
            p->gpu->kv_write(p->gpu, &kg, 0, kg_, vg, &B.b);
        }
        const char *m = mode == 0 ? "rope only" : mode == 1 ? "norm + rope" : "norm + rope + KV write";
        snprintf(msg, sizeof msg, "%s: q (%s)", what, m);
        check_rel(p, msg, qc, qg, nq, TOL_OP);
        snprintf(msg, sizeof msg, "%s: k (%s)", what, m);
        check_rel(p, msg, kc_, kg_, nk, TOL_OP);
        if (mode == 2) {
            snprintf(msg, sizeof msg, "%s: k cache", what);
            check_rel(p, msg, kcv[0], kgv[0], cache, TOL_OP);
            snprintf(msg, sizeof msg, "%s: v cache (exact copy)", what);
            double mx;
            compare(p, kcv[1], kgv[1], cache, &mx);
            CHECK(mx == 0, "%s: max |delta| %g", msg, mx);
        }
        free_both(p, qc, qg), free_both(p, kc_, kg_), free_both(p, vc, vg), free(q), free(k), free(v);
    }
    free_both(p, kcv[0], kgv[0]), free_both(p, kcv[1], kgv[1]);
    free(pages);
    rope2_free(p, &R);
}

/* the 16-byte kernel at head_dim 64 / 128 / 256 (decode and prefill sizes,
 * one and two blocks per token), the per-element kernel at other head
 * sizes and when KILN_CUDA_ROPE_V=0 */
static void test_rope(struct pair *p) {
    rope_case(p, "rope 7 tokens, 32/8 heads of 128", 7, 32, 8, 128);
    rope_case(p, "rope 300 tokens, 64/8 heads of 128", 300, 64, 8, 128);
    rope_case(p, "rope 5 tokens, 14/2 heads of 64", 5, 14, 2, 64);
    rope_case(p, "rope 40 tokens, 16/4 heads of 256", 40, 16, 4, 256);
    rope_case(p, "rope 100 tokens, 14/2 heads of 64", 100, 14, 2, 64);
    rope_case(p, "rope 70 tokens, 16/4 heads of 256", 70, 16, 4, 256);
    rope_case(p, "rope 6 tokens, 8/2 heads of 96 (per-element kernel)", 6, 8, 2, 96);
    setenv("KILN_CUDA_ROPE_V", "0", 1);
    rope_case(p, "rope 300 tokens, 32/8 heads of 128 (per-element kernel)", 300, 32, 8, 128);
    unsetenv("KILN_CUDA_ROPE_V");
}

/* ==== q/k/v as one GEMM (prefill) ==== */

long kiln_cuda_qkv_merge_count(void) __attribute__((weak));

static void matmul_multi_on(struct kiln_backend *be, void *const *outs, const void *x, const struct qlinear *const *ws, int n) {
    if (be->matmul_multi) be->matmul_multi(be, outs, x, ws, 3, n);
    else
        for (int i = 0; i < 3; i++) be->matmul(be, outs[i], x, ws[i], n);
}

/* one sequence of n new tokens: q/k/v through matmul_multi on linears the
 * CUDA backend grouped (group_linears), then, by mode, the three buffers
 * read right away (the held GEMM split at the read), after the rope (which
 * reads q and k from the one GEMM's output and writes v out), after the
 * rope + KV write (v into the cache from there too), or with a KV write
 * of another v buffer (the held rope runs first, then the plain write).
 * `merges` is how many one-GEMM launches the four modes should make. */
static void qkv_case(struct pair *p, const char *what, int n, int nh, int nkv, int hd, int dim, int bias, int merges) {
    char msg[200];
    struct rope2 R = rope2_make(p, hd);
    struct lin2 L[3] = {lin_make(p, nh * hd, dim, bias), lin_make(p, nkv * hd, dim, bias), lin_make(p, nkv * hd, dim, bias)};
    struct qlinear *gw[3] = {&L[0].g, &L[1].g, &L[2].g};
    if (p->gpu->group_linears) p->gpu->group_linears(p->gpu, gw, 3);
    const struct qlinear *wc[3] = {&L[0].c, &L[1].c, &L[2].c}, *wg[3] = {&L[0].g, &L[1].g, &L[2].g};
    const int P = 16, np = (n + P - 1) / P, n_pages = np + 1;
    int32_t *pages = kiln_malloc(sizeof(int32_t) * (size_t)np);
    for (int i = 0; i < np; i++) pages[i] = np - i; /* backwards, page 0 unused */
    static struct bat B;
    memset(&B, 0, sizeof B);
    B.b.n_tokens = n, B.b.tokens = B.tok, B.b.pos = B.pos, B.b.n_seqs = 1, B.b.seqs = B.v;
    B.v[0] = (struct kiln_seq_view){0, n, 0, pages, np};
    for (int i = 0; i < n; i++) B.pos[i] = i;
    struct kv_cache kc = {1, nkv, hd, P, n_pages, KILN_DTYPE_F32, NULL, NULL}, kg = kc;
    kg.dtype = KILN_DTYPE_BF16;
    void *kcv[2], *kgv[2];
    kc.k = &kcv[0], kc.v = &kcv[1], kg.k = &kgv[0], kg.v = &kgv[1];
    const size_t cache = (size_t)n_pages * P * nkv * hd, no[3] = {(size_t)n * nh * hd, (size_t)n * nkv * hd, (size_t)n * nkv * hd};
    kcv[0] = alloc_both(p, &kgv[0], cache);
    kcv[1] = alloc_both(p, &kgv[1], cache);
    const long m0 = kiln_cuda_qkv_merge_count ? kiln_cuda_qkv_merge_count() : 0;
    begin_both(p, &B.b);
    for (int mode = 0; mode < 4; mode++) {
        float *x = rand_vec((size_t)n * dim, 1.f), *v2 = rand_vec(no[2], 1.f);
        void *xc, *xg, *oc[3], *og[3], *v2c, *v2g;
        put(p, &xc, &xg, x, (size_t)n * dim);
        put(p, &v2c, &v2g, v2, no[2]);
        for (int i = 0; i < 3; i++) oc[i] = alloc_both(p, &og[i], no[i]);
        matmul_multi_on(p->cpu, oc, xc, wc, n);
        matmul_multi_on(p->gpu, og, xg, wg, n);
        if (mode > 0) {
            p->cpu->qk_norm_rope(p->cpu, oc[0], oc[1], &R.qn.c, &R.kn.c, &R.c, &B.b, nh, nkv, hd, 1e-6f);
            p->gpu->qk_norm_rope(p->gpu, og[0], og[1], &R.qn.g, &R.kn.g, &R.g, &B.b, nh, nkv, hd, 1e-6f);
        }
        if (mode > 1) {
            p->cpu->kv_write(p->cpu, &kc, 0, oc[1], mode == 2 ? oc[2] : v2c, &B.b);
            p->gpu->kv_write(p->gpu, &kg, 0, og[1], mode == 2 ? og[2] : v2g, &B.b);
        }
        static const char *const mn[4] = {"read at once", "after the rope", "after rope + KV write", "KV write of another v"};
        static const char *const bn[3] = {"q", "k", "v"};
        for (int i = 0; i < 3; i++) {
            snprintf(msg, sizeof msg, "%s: %s (%s)", what, bn[i], mn[mode]);
            check_rel(p, msg, oc[i], og[i], no[i], TOL_OP);
        }
        if (mode > 1) {
            snprintf(msg, sizeof msg, "%s: k cache (%s)", what, mn[mode]);
            check_rel(p, msg, kcv[0], kgv[0], cache, TOL_OP);
            snprintf(msg, sizeof msg, "%s: v cache (%s)", what, mn[mode]);
            check_rel(p, msg, kcv[1], kgv[1], cache, TOL_OP);
        }
        for (int i = 0; i < 3; i++) free_both(p, oc[i], og[i]);
        free_both(p, xc, xg), free_both(p, v2c, v2g), free(x), free(v2);
    }
    if (kiln_cuda_qkv_merge_count)
        CHECK(kiln_cuda_qkv_merge_count() - m0 == merges, "%s: %ld one-GEMM q/k/v launches, expected %d", what,
              kiln_cuda_qkv_merge_count() - m0, merges);
    free_both(p, kcv[0], kgv[0]), free_both(p, kcv[1], kgv[1]);
    free(pages);
    for (int i = 0; i < 3; i++) lin_free(p, &L[i]);
    rope2_free(p, &R);
}

/* one GEMM from 17 rows up to KILN_CUDA_QKV_MERGE (2,048 by default), at
 * head_dim 64 / 128 / 256 (the 16-byte rope kernel), with and without
 * biases (Qwen2's, added where the output is read); not at 5 rows (the
 * GEMV queue), nor with the per-element rope kernel's head size or
 * KILN_CUDA_ROPE_V=0 (then the GEMM still runs as one and is split) */
static void test_qkv_merge(struct pair *p) {
    qkv_case(p, "q/k/v 40 tokens, 16/8 heads of 128, dim 1024", 40, 16, 8, 128, 1024, 0, 4);
    qkv_case(p, "q/k/v 300 tokens, 32/8 heads of 128, dim 1024", 300, 32, 8, 128, 1024, 0, 4);
    qkv_case(p, "q/k/v 70 tokens, 14/2 heads of 64, dim 896", 70, 14, 2, 64, 896, 0, 4);
    qkv_case(p, "q/k/v 70 tokens, 14/2 heads of 64, dim 896, bias", 70, 14, 2, 64, 896, 1, 4);
    qkv_case(p, "q/k/v 300 tokens, 28/4 heads of 128, dim 1024, bias", 300, 28, 4, 128, 1024, 1, 4);
    qkv_case(p, "q/k/v 24 tokens, 16/4 heads of 256, dim 512", 24, 16, 4, 256, 512, 0, 4);
    qkv_case(p, "q/k/v 5 tokens (GEMV), 16/8 heads of 128, dim 1024", 5, 16, 8, 128, 1024, 0, 0);
    qkv_case(p, "q/k/v 40 tokens, 8/2 heads of 96 (split for the per-element rope)", 40, 8, 2, 96, 768, 0, 4);
    qkv_case(p, "q/k/v 40 tokens, 8/2 heads of 96, bias (split)", 40, 8, 2, 96, 768, 1, 4);
    setenv("KILN_CUDA_ROPE_V", "0", 1);
    qkv_case(p, "q/k/v 300 tokens, 32/8 heads of 128 (KILN_CUDA_ROPE_V=0)", 300, 32, 8, 128, 1024, 0, 4);
    unsetenv("KILN_CUDA_ROPE_V");
    qkv_case(p, "q/k/v 2100 tokens (over the limit), 16/8 heads of 128, dim 512", 2100, 16, 8, 128, 512, 0, 0);
}

/* attention over a paged cache: fills n_past tokens per sequence, then runs
 * the batch (decode rows, or prefill chunks that take the flash kernel) */
/* KV heads of the attention cases (32 query heads): 8 unless a case
 * checks another grouping (the GQA decode kernel handles 2, 4 and 8) */
static int att_nkv = 8;
/* query heads and page size of the attention cases: 32 and 16 unless a
 * case checks another (attn_dec.cu's groups of 1-8 heads and page pieces) */
static int att_nh = 32, att_P = 16;

static void attention_case_hd(struct pair *p, const char *what, int n_seqs, const int *n_past, const int *n_new, int hd) {
    const int nh = att_nh, nkv = att_nkv, P = att_P;
    int n_pages = 0;
    for (int s = 0; s < n_seqs; s++) n_pages += (n_past[s] + n_new[s] + P - 1) / P;
    n_pages = n_pages < 256 ? 256 : n_pages;
    struct kv_cache kc = {1, nkv, hd, P, n_pages, KILN_DTYPE_F32, NULL, NULL}, kg = kc;
    kg.dtype = KILN_DTYPE_BF16;
    void *kcv[2], *kgv[2];
    kc.k = &kcv[0], kc.v = &kcv[1], kg.k = &kgv[0], kg.v = &kgv[1];
    size_t cache = (size_t)n_pages * P * nkv * hd;
    kcv[0] = alloc_both(p, &kgv[0], cache);
    kcv[1] = alloc_both(p, &kgv[1], cache);
    /* page tables: a shuffled pool, so sequences own scattered pages */
    int32_t *perm = kiln_malloc(sizeof(int32_t) * (size_t)n_pages);
    for (int i = 0; i < n_pages; i++) perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = (int)((frand() + 1) * 0.5f * (i + 1)) % (i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    static struct bat B;
    int used = 0;
    for (int phase = 0; phase < 2; phase++) {
        memset(&B, 0, sizeof B);
        int r = 0;
        for (int s = 0; s < n_seqs; s++) {
            int past = phase ? n_past[s] : 0, n = phase ? n_new[s] : n_past[s];
            int np = (n_past[s] + n_new[s] + P - 1) / P;
            if (phase == 0) used += np;
            int off = 0;
            for (int t = 0; t < s; t++) off += (n_past[t] + n_new[t] + P - 1) / P;
            B.v[s] = (struct kiln_seq_view){r, n, past, perm + off, np};
            for (int i = 0; i < n; i++, r++) B.pos[r] = past + i, B.rows[r] = r;
        }
        B.b = (struct kiln_batch){r, B.tok, B.pos, n_seqs, B.v, 0, B.rows, NULL, NULL};
        if (r == 0) continue;
        float *k = rand_vec((size_t)r * nkv * hd, 1.f), *v = rand_vec((size_t)r * nkv * hd, 1.f);
        void *kc_, *kg_, *vc_, *vg_;
        put(p, &kc_, &kg_, k, (size_t)r * nkv * hd);
        put(p, &vc_, &vg_, v, (size_t)r * nkv * hd);
        begin_both(p, &B.b);
        p->cpu->kv_write(p->cpu, &kc, 0, kc_, vc_, &B.b);
        p->gpu->kv_write(p->gpu, &kg, 0, kg_, vg_, &B.b);
        if (phase == 1) {
            float *q = rand_vec((size_t)r * nh * hd, 1.f);
            void *qc, *qg, *og, *oc = alloc_both(p, &og, (size_t)r * nh * hd);
            put(p, &qc, &qg, q, (size_t)r * nh * hd);
            /* a sharp softmax (scale 0.25) so errors in the weights show */
            p->cpu->attention(p->cpu, oc, qc, &kc, 0, &B.b, nh, 0.25f);
            p->gpu->attention(p->gpu, og, qg, &kg, 0, &B.b, nh, 0.25f);
            check_rel(p, what, oc, og, (size_t)r * nh * hd, TOL_OP2);
            free_both(p, qc, qg), free_both(p, oc, og), free(q);
        }
        free_both(p, kc_, kg_), free_both(p, vc_, vg_), free(k), free(v);
    }
    CHECK(used <= n_pages);
    free_both(p, kcv[0], kgv[0]), free_both(p, kcv[1], kgv[1]);
    free(perm);
}

static void attention_case(struct pair *p, const char *what, int n_seqs, const int *n_past, const int *n_new) {
    attention_case_hd(p, what, n_seqs, n_past, n_new, 128);
}

/* A decode step as a layer runs it: q/k norm + RoPE, the KV write, then
 * attention, for S sequences of one new token each after n_past[s] cached
 * ones (scattered pages). The CUDA backend holds the first two and does all
 * three in the row attention kernel (attention.cu attention_fused); compared
 * with the CPU ops: the attention output and both caches (v is an exact
 * copy). Its q and k buffers stay unroped there, so they are not compared. */
long kiln_cuda_fused_att_count(void) __attribute__((weak));
long kiln_cuda_att_pre_count(void) __attribute__((weak));
long kiln_cuda_att_cluster_count(void) __attribute__((weak));
int kiln_cuda_att_cluster_max(void) __attribute__((weak));
long kiln_cuda_att_dec_count(void) __attribute__((weak));
int kiln_cuda_att_dec_split(int hd, int n_head, int nkv) __attribute__((weak));

/* whether a decode step of S sequences, the longest max_len keys, takes
 * attn_dec.cu's kernel (cuda.cuh ATT_DEC_MIN_CTX, ATT_DEC_MAX_SEQS,
 * ATT_DEC_MAX_CTX; flash decode from 2,048 keys at up to 4 sequences).
 * The backend decides in begin by the previous attention call's shape, as
 * a model's layers all have one: a case after one of another shape that
 * the kernel does not take (head_dim 256) would not get it. */
static int dec_takes(int hd, int nh, int nkv, int S, int max_len) {
    const char *e = getenv("KILN_CUDA_ATT_DEC_CTX");
    const int from = e && *e ? atoi(e) : 256;
    if (!kiln_cuda_att_dec_split || kiln_cuda_att_dec_split(hd, nh, nkv) <= 0 || from <= 0 || max_len < from || S > 512) return 0;
    return !(S <= 4 && nh / nkv > 2 && max_len > 8192); /* flash decode's */
}

/* gemv: a GEMV (on the GPU only, into a buffer nothing reads) is the launch
 * just before the fused attention, as the q/k/v projection is in a layer:
 * then the kernel reads the cached keys before its wait (R.pre); without
 * it the launch before is phase 0's KV write, and it must not */
static void fused_att_case(struct pair *p, const char *what, int S, const int *n_past, int nh, int nkv, int hd, int gemv) {
    const int P = 16;
    char msg[200];
    struct rope2 R = rope2_make(p, hd);
    int n_pages = 0, np[8], off[8];
    for (int s = 0; s < S; s++) off[s] = n_pages, np[s] = (n_past[s] + 1 + P - 1) / P, n_pages += np[s];
    int32_t *perm = kiln_malloc(sizeof(int32_t) * (size_t)n_pages);
    for (int i = 0; i < n_pages; i++) perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = (int)((frand() + 1) * 0.5f * (i + 1)) % (i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    struct kv_cache kc = {1, nkv, hd, P, n_pages, KILN_DTYPE_F32, NULL, NULL}, kg = kc;
    kg.dtype = KILN_DTYPE_BF16;
    void *kcv[2], *kgv[2];
    kc.k = &kcv[0], kc.v = &kcv[1], kg.k = &kgv[0], kg.v = &kgv[1];
    const size_t cache = (size_t)n_pages * P * nkv * hd;
    kcv[0] = alloc_both(p, &kgv[0], cache);
    kcv[1] = alloc_both(p, &kgv[1], cache);
    static struct bat B;
    for (int phase = 0; phase < 2; phase++) { /* the cached tokens, then the step */
        memset(&B, 0, sizeof B);
        int n = 0;
        for (int s = 0; s < S; s++) {
            const int k = phase ? 1 : n_past[s];
            B.v[s] = (struct kiln_seq_view){n, k, phase ? n_past[s] : 0, perm + off[s], np[s]};
            for (int i = 0; i < k; i++, n++) B.pos[n] = (phase ? n_past[s] : 0) + i, B.rows[n] = n;
        }
        B.b = (struct kiln_batch){n, B.tok, B.pos, S, B.v, 0, B.rows, NULL, NULL};
        if (n == 0) continue;
        const size_t nq = (size_t)n * nh * hd, nk = (size_t)n * nkv * hd;
        float *q = rand_vec(nq, 2.f), *k = rand_vec(nk, 2.f), *v = rand_vec(nk, 2.f);
        void *qc, *qg, *kc_, *kg_, *vc, *vg;
        put(p, &qc, &qg, q, nq);
        put(p, &kc_, &kg_, k, nk);
        put(p, &vc, &vg, v, nk);
        begin_both(p, &B.b);
        if (phase == 0) {
            p->cpu->kv_write(p->cpu, &kc, 0, kc_, vc, &B.b);
            p->gpu->kv_write(p->gpu, &kg, 0, kg_, vg, &B.b);
        } else {
            void *oc, *og;
            oc = alloc_both(p, &og, nq);
            const long runs0 = kiln_cuda_fused_att_count ? kiln_cuda_fused_att_count() : 0;
            const long pre0 = kiln_cuda_att_pre_count ? kiln_cuda_att_pre_count() : 0;
            const long cl0 = kiln_cuda_att_cluster_count ? kiln_cuda_att_cluster_count() : 0;
            const long dec0 = kiln_cuda_att_dec_count ? kiln_cuda_att_dec_count() : 0;
            struct lin2 L = lin_make(p, 256, 1024, 0);
            void *xg, *yg, *xc = alloc_both(p, &xg, 1024), *yc = alloc_both(p, &yg, 256);
            if (gemv) p->gpu->matmul(p->gpu, yg, xg, &L.g, 1); /* queued; launched by the next op's flush */
            struct kiln_backend *be[2] = {p->cpu, p->gpu};
            for (int i = 0; i < 2; i++) {
                const int g = i == 1;
                be[i]->qk_norm_rope(be[i], g ? qg : qc, g ? kg_ : kc_, g ? &R.qn.g : &R.qn.c, g ? &R.kn.g : &R.kn.c, g ? &R.g : &R.c,
                                    &B.b, nh, nkv, hd, 1e-6f);
                be[i]->kv_write(be[i], g ? &kg : &kc, 0, g ? kg_ : kc_, g ? vg : vc, &B.b);
                be[i]->attention(be[i], g ? og : oc, g ? qg : qc, g ? &kg : &kc, 0, &B.b, nh, 0.25f);
            }
            /* from ATT_DEC_MIN_CTX keys the step takes attn_dec.cu's
             * kernel instead, after the rope + KV write as their own launch
             * (folded in, they cost 0.6B 1-4%: docs/cuda.md item 23) */
            int max_len = 0, split = 1;
            for (int s = 0; s < S; s++) max_len = n_past[s] + 1 > max_len ? n_past[s] + 1 : max_len;
            const int dec = dec_takes(hd, nh, nkv, S, max_len);
            if (kiln_cuda_att_dec_count)
                CHECK(kiln_cuda_att_dec_count() - dec0 == dec, "%s: attn_dec.cu ran %ld times, expected %d", what,
                      kiln_cuda_att_dec_count() - dec0, dec);
            static const char *const sw[] = {"KILN_CUDA_FUSE", "KILN_CUDA_FUSE_ATT", NULL};
            if (kiln_cuda_fused_att_count && switches_on(sw))
                CHECK(kiln_cuda_fused_att_count() - runs0 == !dec, "%s: the fused row kernel ran %ld times, expected %d", what,
                      kiln_cuda_fused_att_count() - runs0, !dec);
            static const char *const sw_pre[] = {"KILN_CUDA_FUSE", "KILN_CUDA_FUSE_ATT", "KILN_CUDA_ATT_PRE", NULL};
            if (kiln_cuda_att_pre_count && switches_on(sw_pre))
                CHECK(kiln_cuda_att_pre_count() - pre0 == (gemv && !dec), "%s: keys read before the wait %ld times, expected %d",
                      what, kiln_cuda_att_pre_count() - pre0, gemv && !dec);
            /* 2-16 splits (16 keys each, from the longest row) merge in a
             * cluster's shared memory on sm_90 (attention.cu, CL) */
            while (split < 64 && split * 16 < max_len) split *= 2;
            static const char *const sw_cl[] = {"KILN_CUDA_FUSE", "KILN_CUDA_FUSE_ATT", "KILN_CUDA_ATT_CLUSTER", NULL};
            if (kiln_cuda_att_cluster_count && kiln_cuda_att_cluster_max && switches_on(sw_cl) && !dec &&
                !getenv("KILN_CUDA_ATT_SPLIT_TOKENS"))
                CHECK(kiln_cuda_att_cluster_count() - cl0 == (split > 1 && split <= kiln_cuda_att_cluster_max()),
                      "%s: %d splits (clusters up to %d), cluster merges %ld", what, split, kiln_cuda_att_cluster_max(),
                      kiln_cuda_att_cluster_count() - cl0);
            free_both(p, xc, xg), free_both(p, yc, yg);
            lin_free(p, &L);
            snprintf(msg, sizeof msg, "%s: output", what);
            check_rel(p, msg, oc, og, nq, TOL_OP2);
            free_both(p, oc, og);
        }
        free_both(p, qc, qg), free_both(p, kc_, kg_), free_both(p, vc, vg), free(q), free(k), free(v);
    }
    snprintf(msg, sizeof msg, "%s: k cache", what);
    check_rel(p, msg, kcv[0], kgv[0], cache, TOL_OP);
    double mx;
    compare(p, kcv[1], kgv[1], cache, &mx);
    CHECK(mx == 0, "%s: v cache (exact copy) max |delta| %g", what, mx);
    free_both(p, kcv[0], kgv[0]), free_both(p, kcv[1], kgv[1]);
    free(perm);
    rope2_free(p, &R);
}

static void test_fused_attention(struct pair *p) {
    if (kiln_cuda_att_cluster_max) printf("  decode attention: splits merged in clusters of up to %d blocks\n", kiln_cuda_att_cluster_max());
    /* splits (16 keys each, a power of two from the longest row): 32, 2, 8
     * and 16; all but the first merge in a cluster on sm_90 */
    const int past4[] = {0, 5, 200, 470}, past2[] = {31, 16}, past1[] = {100}, past4b[] = {3, 17, 250, 130};
    const int past4s[] = {0, 7, 33, 63}; /* short rows: 1-4 splits of up to 16 keys */
    /* each twice: with attn_dec.cu's kernel off (the row kernel at every
     * length), then as a model runs (it takes the 471-key step) */
    char *saved = env_save("KILN_CUDA_ATT_DEC_CTX");
    for (int pass = 0; pass < 4; pass++) {
        const int gemv = pass & 1;
        if (pass < 2) setenv("KILN_CUDA_ATT_DEC_CTX", "0", 1);
        else env_restore("KILN_CUDA_ATT_DEC_CTX", saved);
        char after[120];
        snprintf(after, sizeof after, "%s%s", gemv ? ", after a GEMV (keys read before the wait)" : "",
                 pass < 2 ? ", attn_dec off" : "");
        char what[5][200];
        snprintf(what[0], sizeof what[0], "decode step (norm + rope + KV write + attention), 4 seqs, 32/8 heads of 128%s", after);
        snprintf(what[1], sizeof what[1], "decode step, 2 seqs at page ends, 14/2 heads of 64%s", after);
        snprintf(what[2], sizeof what[2], "decode step, 1 seq, 16/4 heads of 256%s", after);
        snprintf(what[3], sizeof what[3], "decode step, 4 seqs up to 251 keys (16 splits), 32/8 heads of 128%s", after);
        fused_att_case(p, what[0], 4, past4, 32, 8, 128, gemv);
        fused_att_case(p, what[1], 2, past2, 14, 2, 64, gemv);
        fused_att_case(p, what[2], 1, past1, 16, 4, 256, gemv);
        fused_att_case(p, what[3], 4, past4b, 32, 8, 128, gemv);
        snprintf(what[4], sizeof what[4], "decode step, 4 seqs up to 64 keys, 32/8 heads of 128%s", after);
        fused_att_case(p, what[4], 4, past4s, 32, 8, 128, gemv);
        /* longer rows through attn_dec.cu (with it off, the GQA and flash
         * kernels take these, unfused): 8 and 2 heads per KV head, and a new
         * key that opens a stage and a page */
        if (pass < 2) continue;
        const int pastg8[] = {2999, 300, 0, 1023}, pastg2[] = {700, 255}, past4096[] = {4096};
        snprintf(what[0], sizeof what[0], "decode step, 4 seqs up to 3000 keys, 32/4 heads of 128%s", after);
        fused_att_case(p, what[0], 4, pastg8, 32, 4, 128, gemv);
        snprintf(what[0], sizeof what[0], "decode step, 2 seqs up to 701 keys, 16/8 heads of 64%s", after);
        fused_att_case(p, what[0], 2, pastg2, 16, 8, 64, gemv);
        snprintf(what[0], sizeof what[0], "decode step, 1 seq, key 4097 opens a page, 32/8 heads of 128%s", after);
        fused_att_case(p, what[0], 1, past4096, 32, 8, 128, gemv);
    }
    free(saved);
}

/* attn_dec.cu: decode over long caches, streamed by the copy engine. Every
 * query-head group it takes (1-8 heads per KV head, head_dim 64 and 128),
 * page sizes whose pages split a 16-key stage (1, 8, 24) or hold several
 * (64), rows whose lengths end on and just past a stage, next to empty
 * rows; each case checks that the kernel ran (where the device has it). */
static void dec_case(struct pair *p, const char *what, int S, const int *past, int hd) {
    int ones[80], max_len = 0;
    for (int s = 0; s < 80; s++) ones[s] = 1;
    for (int s = 0; s < S; s++) max_len = past[s] + 1 > max_len ? past[s] + 1 : max_len;
    const long d0 = kiln_cuda_att_dec_count ? kiln_cuda_att_dec_count() : 0;
    attention_case_hd(p, what, S, past, ones, hd);
    const int want = dec_takes(hd, att_nh, att_nkv, S, max_len);
    if (kiln_cuda_att_dec_count)
        CHECK(kiln_cuda_att_dec_count() - d0 == want, "%s: attn_dec.cu ran %ld times, expected %d", what,
              kiln_cuda_att_dec_count() - d0, want);
}

static void test_att_dec(struct pair *p) {
    if (kiln_cuda_att_dec_split) printf("  decode attention over long caches: attn_dec.cu, clusters of %d\n", kiln_cuda_att_dec_split(128, 32, 8));
    const int mix[] = {8000, 3, 0, 700}, edge[] = {255, 256, 271, 4095}, one[] = {300}, eight[] = {900, 260, 5, 2047, 1, 333, 64, 8000};
    static const int groups[][3] = {{32, 8, 128}, {32, 16, 128}, {32, 4, 128}, {32, 32, 128}, {40, 8, 128}, {28, 4, 128},
                                    {24, 8, 128}, {36, 6, 128}, {32, 8, 64}, {14, 2, 64}, {32, 32, 64}};
    char what[200];
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
        att_nh = groups[i][0], att_nkv = groups[i][1];
        snprintf(what, sizeof what, "attn_dec decode 8000/3/0/700, %d/%d heads of %d", att_nh, att_nkv, groups[i][2]);
        dec_case(p, what, 4, mix, groups[i][2]);
    }
    /* past 8,192 keys: 2 heads per group still here, 4 and 8 take flash decode */
    const int longer[] = {15000, 3, 0, 700};
    att_nkv = 16;
    dec_case(p, "attn_dec decode 15000/3/0/700, 32/16 heads", 4, longer, 128);
    att_nkv = 8; /* the plan follows the previous call's group: one at 32/8 first, short (row kernel) */
    const int short4[] = {100, 3, 0, 254};
    dec_case(p, "decode up to 255 keys (row kernel)", 4, short4, 128);
    dec_case(p, "decode 15000/3/0/700, 32/8 heads (flash decode)", 4, longer, 128);
    att_nh = 32, att_nkv = 8;
    dec_case(p, "attn_dec decode 255/256/271/4095 (stage ends)", 4, edge, 128);
    dec_case(p, "attn_dec decode of 1 seq after 300", 1, one, 128);
    dec_case(p, "attn_dec decode of 8 seqs up to 8000", 8, eight, 128);
    static const int pages[] = {1, 8, 24, 64};
    for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++) {
        att_P = pages[i];
        snprintf(what, sizeof what, "attn_dec decode 255/256/271/4095, pages of %d", att_P);
        dec_case(p, what, 4, edge, 128);
        snprintf(what, sizeof what, "attn_dec decode 255/256/271/4095, pages of %d, head_dim 64", att_P);
        dec_case(p, what, 4, edge, 64);
    }
    att_P = 16;
    /* more sequences, fewer splits per (row, KV head) (attn_dec.cu
     * dec_nsplit: at 32/8 heads on an H200, 4 at 8 sequences, 2 at 16, 1 at
     * 40 and 65, where the grid takes two waves) */
    int many[65];
    for (int s = 0; s < 65; s++) many[s] = (s * 523) % 1500;
    dec_case(p, "attn_dec decode of 16 seqs up to 1500", 16, many, 128);
    for (int s = 0; s < 65; s++) many[s] = (s * 181) % 600 + (s == 0 ? 2000 : 0);
    dec_case(p, "attn_dec decode of 40 seqs up to 2000", 40, many, 128);
    dec_case(p, "attn_dec decode of 40 seqs up to 2000, head_dim 64", 40, many, 64);
    for (int s = 0; s < 65; s++) many[s] = s ? 100 : 300;
    dec_case(p, "attn_dec decode of 65 seqs up to 300", 65, many, 128);
}

static void test_attention(struct pair *p) {
    /* the row, GQA and flash kernels at every length: attn_dec.cu off here
     * (test_att_dec has it) */
    char *dec_saved = env_save("KILN_CUDA_ATT_DEC_CTX");
    setenv("KILN_CUDA_ATT_DEC_CTX", "0", 1);
    int past1[] = {37, 0, 300, 1000}, new1[] = {1, 1, 1, 1};
    attention_case(p, "attention decode, 4 seqs (split-K rows)", 4, past1, new1);
    int past2[] = {20, 0}, new2[] = {150, 70};
    attention_case(p, "attention prefill 150+70 after 20/0 (flash)", 2, past2, new2);
    int past3[] = {700}, new3[] = {9};
    attention_case(p, "attention chunk of 9 after 700 (rows)", 1, past3, new3);
    int past4[] = {0}, new4[] = {1000};
    attention_case(p, "attention prefill 1000 (flash)", 1, past4, new4);
    /* what the server sends: a long cached prefix with a few new tokens,
     * and decode rows of very different lengths side by side */
    int past5[] = {15744}, new5[] = {6};
    attention_case(p, "attention 6 after 15744 cached (rows, 64 splits)", 1, past5, new5);
    int past6[] = {15000, 3, 0, 700}, new6[] = {1, 1, 1, 1};
    attention_case(p, "attention decode 15000/3/0/700 (rows)", 4, past6, new6);
    att_nkv = 16; /* 2 query heads per KV head */
    attention_case(p, "attention decode 15000/3/0/700, 32/16 heads (GQA 2)", 4, past6, new6);
    int past3b[] = {5000};
    attention_case_hd(p, "attention chunk of 9 after 5000, 32/16 heads, head_dim 64", 1, past3b, new3, 64);
    att_nkv = 4; /* 8 per KV head */
    attention_case(p, "attention decode 15000/3/0/700, 32/4 heads (GQA 8)", 4, past6, new6);
    attention_case_hd(p, "attention chunk of 9 after 5000, 32/4 heads, head_dim 64", 1, past3b, new3, 64);
    att_nkv = 8;
    int past7[] = {4000, 10, 0}, new7[] = {1, 40, 1};
    attention_case(p, "attention decode + prefill chunk mixed (flash)", 3, past7, new7);
    /* split-KV flash: few (tile, head) blocks over long key spans. With 32
     * heads on 132 SMs (2 blocks each at head_dim 128): 4 tiles of ~250 key
     * blocks -> 2 chunks each; 40 after 6000 -> 10 chunks, next to 5
     * unsplit tiles of a 300-token prefill in the same launch (the plan
     * takes heads and head_dim from the previous call, so the head_dim 64
     * cases split as for 128, then as for 64). Then the same without splits
     * (KILN_CUDA_FA_SPLIT=0, what the A/B timing runs) and with the most
     * chunks (=64: 8 key blocks each). */
    int past8[] = {15750}, new8[] = {250};
    attention_case(p, "attention 250 after 15750 cached (flash, split-KV)", 1, past8, new8);
    int past9[] = {6000, 0}, new9[] = {40, 300};
    attention_case(p, "attention 40 after 6000 + 300 from 0 (flash, split-KV)", 2, past9, new9);
    attention_case_hd(p, "attention 250 after 15750, head_dim 64 (split-KV)", 1, past8, new8, 64);
    attention_case_hd(p, "attention 40 after 6000 + 300, head_dim 64 (split-KV)", 2, past9, new9, 64);
    /* q heads per flash block: 2 where a KV head serves an even number of
     * them and the longest tile walks >= 2,048 keys (>= 512 where the
     * wgmma kernel runs: the 1000-token prefill above too), else 1 (the
     * short prefills above; MHA and odd groups always) */
    int new11[] = {2100};
    attention_case(p, "attention prefill 2100 (flash, 2 heads per block, unsplit)", 1, past4, new11);
    att_nkv = 32;
    attention_case(p, "attention prefill 2100, 32/32 heads (flash, 1 head per block)", 1, past4, new11);
    attention_case(p, "attention 250 after 15750, 32/32 heads (flash, split-KV, 1 head per block)", 1, past8, new8);
    att_nkv = 16;
    attention_case_hd(p, "attention 40 after 6000 + 300, 32/16 heads, head_dim 64 (split-KV, GQA 2)", 2, past9, new9, 64);
    att_nkv = 8;
    const char *old = getenv("KILN_CUDA_FA_SPLIT");
    char *saved = old ? strdup(old) : NULL;
    setenv("KILN_CUDA_FA_SPLIT", "0", 1);
    attention_case(p, "attention 250 after 15750 cached (flash, no split)", 1, past8, new8);
    /* the longest tile cut into 64 chunks: every chunk at the minimum 8 key blocks */
    setenv("KILN_CUDA_FA_SPLIT", "64", 1);
    int past10[] = {1000, 3000}, new10[] = {100, 17};
    attention_case(p, "attention 100 after 1000 + 17 after 3000 (flash, fine splits)", 2, past10, new10);
    if (saved) setenv("KILN_CUDA_FA_SPLIT", saved, 1), free(saved);
    else unsetenv("KILN_CUDA_FA_SPLIT");
    /* on Hopper the 2-heads-per-block cases above ran the wgmma kernel
     * (flash_wg.cu); the mma.sync one (k_flash, HG = 2) stays the kernel of
     * other GPUs: the same cases through it */
    setenv("KILN_CUDA_FA_WG", "0", 1);
    attention_case(p, "attention prefill 2100 (flash, mma.sync, 2 heads per block)", 1, past4, new11);
    attention_case(p, "attention 250 after 15750 cached (flash, mma.sync, split-KV)", 1, past8, new8);
    attention_case(p, "attention 40 after 6000 + 300 from 0 (flash, mma.sync, split-KV)", 2, past9, new9);
    /* and through the wgmma kernel that loads with cp.async (the one for
     * page sizes the copy engine's boxes do not fit) */
    setenv("KILN_CUDA_FA_WG", "1", 1);
    attention_case(p, "attention prefill 2100 (flash, wgmma + cp.async)", 1, past4, new11);
    attention_case(p, "attention 250 after 15750 cached (flash, wgmma + cp.async, split-KV)", 1, past8, new8);
    unsetenv("KILN_CUDA_FA_WG");
    env_restore("KILN_CUDA_ATT_DEC_CTX", dec_saved);
    free(dec_saved);
}

static void test_misc(struct pair *p) {
    const int n = 6, dim = 4096, ffn = 12288;
    float *g = rand_vec((size_t)n * ffn, 4.f), *u = rand_vec((size_t)n * ffn, 1.f);
    void *gc, *gg, *uc, *ug;
    put(p, &gc, &gg, g, (size_t)n * ffn);
    put(p, &uc, &ug, u, (size_t)n * ffn);
    p->cpu->swiglu(p->cpu, gc, gc, uc, n, ffn);
    p->gpu->swiglu(p->gpu, gg, gg, ug, n, ffn);
    check_rel(p, "swiglu 6x12288 (in place)", gc, gg, (size_t)n * ffn, TOL_OP);
    p->cpu->add(p->cpu, gc, uc, (size_t)n * ffn - 3);
    p->gpu->add(p->gpu, gg, ug, (size_t)n * ffn - 3);
    check_rel(p, "add (odd length)", gc, gg, (size_t)n * ffn, TOL_OP);
    free_both(p, gc, gg), free_both(p, uc, ug), free(g), free(u);

    struct vec2 table = vec_make(p, 1000, dim, 1.f, 0.f);
    struct bat B = {0};
    B.b.n_tokens = n, B.b.tokens = B.tok, B.b.pos = B.pos, B.b.n_seqs = 1, B.b.seqs = B.v;
    B.v[0] = (struct kiln_seq_view){0, n, 0, NULL, 0};
    for (int i = 0; i < n; i++) B.tok[i] = (int)((frand() + 1) * 499), B.pos[i] = i;
    B.rows[0] = 1, B.rows[1] = 4, B.rows[2] = 5;
    B.b.n_out = 3, B.b.out_rows = B.rows;
    begin_both(p, &B.b);
    void *xg, *xc = alloc_both(p, &xg, (size_t)n * dim), *og, *oc = alloc_both(p, &og, (size_t)3 * dim);
    p->cpu->embed(p->cpu, xc, &table.c, &B.b);
    p->gpu->embed(p->gpu, xg, &table.g, &B.b);
    check_rel(p, "embed 6 tokens of a 1000x4096 table", xc, xg, (size_t)n * dim, 1e-6);
    p->cpu->gather_rows(p->cpu, oc, xc, B.rows, 3, dim);
    p->gpu->gather_rows(p->gpu, og, xg, B.rows, 3, dim);
    check_rel(p, "gather_rows 1,4,5", oc, og, (size_t)3 * dim, 1e-6);
    free_both(p, xc, xg), free_both(p, oc, og);
    vec_free(p, &table);
}

/* Device memory running out inside a forward: an op whose scratch cannot
 * grow skips its launch, the backend's `error` op reports the batch as
 * failed (the engine then fails that batch and serves on), and once memory
 * is back the next forward runs the same op correctly. gather_rows in
 * place needs a scratch copy of its rows: 8192 rows of 2048 after every
 * other free byte of the device is taken. */
static void test_scratch_oom(struct pair *p) {
    const int n = 16384, dim = 2048, m = n / 2;
    char err[512];
    struct bat *B = kiln_calloc(1, sizeof *B);
    B->b = (struct kiln_batch){1, B->tok, B->pos, 1, B->v, 0, B->rows, NULL, NULL};
    B->v[0] = (struct kiln_seq_view){0, 1, 0, NULL, 0};
    float *x = rand_vec((size_t)n * dim, 1.f);
    void *xc, *xg;
    put(p, &xc, &xg, x, (size_t)n * dim);
    int32_t *rows = kiln_malloc(sizeof(int32_t) * (size_t)m);
    for (int i = 0; i < m; i++) rows[i] = 2 * i; /* ascending, rows[i] >= i: in place is allowed */
    begin_both(p, &B->b);
    enum { MAXH = 4096 };
    void **hog = kiln_malloc(sizeof(void *) * MAXH);
    int nh = 0;
    const int lvl = kiln_log_level;
    kiln_log_level = -1; /* the failed allocations below are expected */
    for (size_t chunk = (size_t)1 << 30; chunk >= ((size_t)1 << 20); chunk >>= 1)
        while (nh < MAXH && (hog[nh] = p->gpu->alloc(p->gpu, chunk))) nh++;
    kiln_log_level = lvl;
    p->gpu->gather_rows(p->gpu, xg, xg, rows, m, dim);
    const int rc = p->gpu->error(p->gpu, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "out of device memory"), "an op without room for its scratch: error %d \"%s\"", rc,
          rc ? err : "");
    for (int i = 0; i < nh; i++) p->gpu->free(p->gpu, hog[i]);
    begin_both(p, &B->b);
    CHECK(p->gpu->error(p->gpu, err, sizeof err) == 0, "begin clears the failed forward's error: %s", err);
    p->cpu->gather_rows(p->cpu, xc, xc, rows, m, dim);
    p->gpu->gather_rows(p->gpu, xg, xg, rows, m, dim);
    CHECK(p->gpu->error(p->gpu, err, sizeof err) == 0, "with memory back: %s", err);
    check_rel(p, "gather_rows in place after running out of memory", xc, xg, (size_t)m * dim, 1e-6);
    free_both(p, xc, xg), free(x), free(rows), free(hog), free(B);
}

/* `read` of one vocabulary-sized row (a decode step's logits: bf16 to
 * pinned memory, widened on the host with AVX2 where it has it): every value
 * exact, five reads in a row, and a length that is not a multiple of 16 so
 * the widening's scalar tail runs. */
static void test_read_row(struct pair *p) {
    const size_t n = 151936 - 5;
    float *x = rand_vec(n, 3.f), *y = kiln_malloc(sizeof(float) * n);
    void *xg = p->gpu->alloc(p->gpu, n * p->gpu->act_size);
    p->gpu->write(p->gpu, xg, x, n);
    for (int r = 0; r < 5; r++) {
        for (size_t i = 0; i < n; i++) y[i] = -1e30f;
        p->gpu->read(p->gpu, y, xg, n);
        size_t same = 0;
        for (size_t i = 0; i < n; i++) same += y[i] == x[i];
        CHECK(same == n, "read of %zu values, round %d: %zu exact", n, r, same);
    }
    p->gpu->free(p->gpu, xg);
    free(x), free(y);
}

/* The device argmax of rows of a vocabulary's width and of an odd one,
 * against the host's kiln_argmax on the same bf16 values: the first of
 * tied maxima whether the tie is inside one of the kernel's 4,096-value
 * parts or across parts, a maximum at the last index, a row of one value
 * everywhere (index 0), a row whose maximum is -inf everywhere but one
 * value, and 1..16 rows (a batched decode step's out rows). */
static void test_argmax(struct pair *p) {
    const int widths[] = {151936, 1003};
    for (int wi = 0; wi < 2; wi++) {
        const int width = widths[wi], rows = 16;
        float *x = rand_vec((size_t)rows * width, 4.f), *y = kiln_malloc(sizeof(float) * rows * width);
        float *r0 = x, *r1 = x + width, *r2 = x + 2 * (size_t)width, *r3 = x + 3 * (size_t)width, *r4 = x + 4 * (size_t)width;
        r0[width / 3] = r0[width - 7] = 9.5f;   /* tied across parts (one part at width 1003) */
        r1[width - 1] = 9.5f;                   /* the last index */
        r2[4097 % width] = r2[4100 % width] = 9.5f, r2[4099 % width] = 9.25f; /* tied inside a part */
        for (int i = 0; i < width; i++) r3[i] = 1.f, r4[i] = -INFINITY;
        r4[width / 2] = -3.f;
        void *xg = p->gpu->alloc(p->gpu, (size_t)rows * width * p->gpu->act_size);
        p->gpu->write(p->gpu, xg, x, (size_t)rows * width);
        p->gpu->read(p->gpu, y, xg, (size_t)rows * width); /* the bf16 values */
        for (int n = 1; n <= rows; n += n < 4 ? 1 : 4) {
            int32_t ids[16];
            for (int i = 0; i < rows; i++) ids[i] = -1;
            p->gpu->argmax(p->gpu, ids, xg, n, width);
            int bad = -1;
            for (int i = 0; i < n && bad < 0; i++)
                if (ids[i] != kiln_argmax(y + (size_t)i * width, width)) bad = i;
            CHECK(bad < 0, "argmax of %d rows of %d: row %d gives %d, the host %d", n, width, bad, bad < 0 ? 0 : ids[bad],
                  bad < 0 ? 0 : kiln_argmax(y + (size_t)bad * width, width));
        }
        CHECK(kiln_argmax(y, width) == width / 3 && kiln_argmax(y + 3 * (size_t)width, width) == 0 &&
                  kiln_argmax(y + 4 * (size_t)width, width) == width / 2,
              "argmax fixture rows at width %d", width);
        p->gpu->free(p->gpu, xg);
        free(x), free(y);
    }
}

/* Pinned host memory that cannot be had (kiln_cuda_pin_fail: the next
 * allocations fail as if the host refused to pin them): read and argmax,
 * which stage their results there, leave zeros, the backend reports the
 * failed batch, and the next batch works. A fresh backend, so both buffers
 * must grow. */
void kiln_cuda_pin_fail(int n) __attribute__((weak));

static void test_pinned_oom(void) {
    if (!kiln_cuda_pin_fail) return;
    char err[512];
    struct kiln_backend *g = backend_create("cuda", 0, err, sizeof err);
    CHECK(g != NULL, "%s", err);
    if (!g) return;
    struct bat *B = kiln_calloc(1, sizeof *B);
    B->b = (struct kiln_batch){1, B->tok, B->pos, 1, B->v, 0, B->rows, NULL, NULL};
    B->v[0] = (struct kiln_seq_view){0, 1, 0, NULL, 0};
    const int rows = 3, width = 1000;
    float *x = rand_vec((size_t)rows * width, 1.f), *y = kiln_malloc(sizeof(float) * rows * width);
    x[width + 17] = 9.f; /* row 1's maximum */
    void *xg = g->alloc(g, (size_t)rows * width * g->act_size);
    g->write(g, xg, x, (size_t)rows * width);
    int32_t ids[3] = {-1, -1, -1};
    for (int round = 0; round < 2; round++) {
        CHECK(g->begin(g, &B->b) == 0, "begin");
        CHECK(g->error(g, err, sizeof err) == 0, "begin clears the failed batch's error: %s", err);
        if (round == 0) kiln_cuda_pin_fail(1);
        for (size_t i = 0; i < (size_t)rows * width; i++) y[i] = 1.f;
        g->read(g, y, xg, (size_t)rows * width);
        const int rc = g->error(g, err, sizeof err);
        size_t same = 0, zero = 0;
        for (size_t i = 0; i < (size_t)rows * width; i++) same += y[i] == x[i], zero += y[i] == 0.f;
        if (round == 0) {
            CHECK(rc == -1 && strstr(err, "pinned host memory"), "read without pinned memory: error %d \"%s\"", rc, rc ? err : "");
            CHECK(zero == (size_t)rows * width, "read without pinned memory leaves zeros (%zu of %d)", zero, rows * width);
        } else {
            CHECK(rc == 0, "read with pinned memory back: %s", err);
            CHECK(same == (size_t)rows * width, "read with pinned memory back: %zu of %d values", same, rows * width);
        }
        CHECK(g->begin(g, &B->b) == 0, "begin");
        if (round == 0) kiln_cuda_pin_fail(1);
        g->argmax(g, ids, xg, rows, width);
        const int rc2 = g->error(g, err, sizeof err);
        if (round == 0) {
            CHECK(rc2 == -1 && strstr(err, "pinned host memory"), "argmax without pinned memory: error %d \"%s\"", rc2, rc2 ? err : "");
            CHECK(ids[0] == 0 && ids[1] == 0 && ids[2] == 0, "argmax without pinned memory leaves zeros (%d %d %d)", ids[0], ids[1], ids[2]);
        } else {
            CHECK(rc2 == 0 && ids[1] == 17, "argmax with pinned memory back: error %d, row 1's id %d (17)", rc2, ids[1]);
        }
    }
    kiln_cuda_pin_fail(0);
    g->free(g, xg);
    g->destroy(g);
    free(x), free(y), free(B);
}

/* The decode paths that only a model's forward reaches: q/k/v reading one x
 * (one launch of three jobs) and gate/up folded into swiglu (the GLU GEMV,
 * which also writes up), at batch 1 and 2 (CUDA-core GEMVs) and 5 and 16
 * (the tensor-core GEMV where the shape allows it), at Qwen3-8B shapes (the streaming
 * GEMV k_gemv_s) and Qwen2-0.5B-like shapes with q/k/v biases (k_gemv).
 * norm: x is the output of a residual add + RMSNorm just before, as in a
 * layer, which the
 * CUDA backend may fold into the GEMV (KILN_CUDA_FUSE_NORM); the residual
 * and the norm's output are checked too, after the GEMV, within ntol (the
 * GEMV outputs within TOL_OP): p->cpu is the CPU backend, or a CUDA
 * backend that folds nothing against one that folds (ntol 0: the same
 * bits). bulk: bulk-copy GEMV launches expected per shape's count. */
long kiln_cuda_gemv_b_count(void) __attribute__((weak));
int kiln_cuda_gemv_b_ok(void) __attribute__((weak));

/* Qwen3-8B shapes take the streaming GEMV; the Qwen2-0.5B-like and
 * Qwen3-30B-A3B-like ones fit in shared memory and take the bulk-copy GEMV
 * on sm_90 (gemm.cu k_gemv_b: 30B-A3B's q/k/v are 20 rows per block, so
 * blocks straddle the q/k and k/v boundaries; 0.5B's q/k/v 5 rows, 2 warps
 * a row, its gate/up 19 row pairs), unless a norm is folded into them
 * (KILN_CUDA_FUSE_NORM=1: the row-block GEMV) */
static void decode_fused_cases(struct pair *p, int norm, const char *tag, double ntol, int bulk, const char *qfmt) {
    /* dim, q, kv, ffn, bias, bulk-copy launches (30B-A3B-like: q/k/v only; its gate/up are 50 MB) */
    const int shapes[][6] = {{4096, 4096, 1024, 12288, 0, 0}, {896, 896, 128, 4864, 1, 2}, {2048, 4096, 512, 6144, 0, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int dim = shapes[s][0], qd = shapes[s][1], kvd = shapes[s][2], ffn = shapes[s][3], b = shapes[s][4];
        struct lin2 L[5];
        struct ref_qmem qm[5];
        memset(qm, 0, sizeof qm);
        if (!qfmt) {
            L[0] = lin_make(p, qd, dim, b), L[1] = lin_make(p, kvd, dim, b), L[2] = lin_make(p, kvd, dim, b);
            L[3] = lin_make(p, ffn, dim, 0), L[4] = lin_make(p, ffn, dim, 0);
        } else { /* 4-bit weights; the CPU on its exact W4A16 path (KILN_QACT=f32), not on int8 activations */
            char *saved = env_save("KILN_QACT");
            setenv("KILN_QACT", "f32", 1);
            const int no[5] = {qd, kvd, kvd, ffn, ffn};
            for (int i = 0; i < 5; i++) L[i] = lin_prepare(p, q_linear(&qm[i], qfmt, no[i], dim, 128, 0, 1, i < 3 && b));
            env_restore("KILN_QACT", saved);
            free(saved);
        }
        struct vec2 nw = vec_make(p, 1, dim, 0.2f, 1.f);
        static const int ns[] = {1, 2, 5, 16};
        for (int ni = 0; ni < 4; ni++) {
            const int n = ns[ni];
            float *x = rand_vec((size_t)n * dim, 1.f), *r = rand_vec((size_t)n * dim, 1.f);
            void *xc, *xg, *rc, *rg, *yc, *yg, *oc[5], *og[5];
            put(p, &xc, &xg, x, (size_t)n * dim);
            put(p, &rc, &rg, r, (size_t)n * dim);
            put(p, &yc, &yg, r, (size_t)n * dim);
            for (int i = 0; i < 5; i++) oc[i] = alloc_both(p, &og[i], (size_t)n * L[i].c.n_out);
            const long gb0 = kiln_cuda_gemv_b_count ? kiln_cuda_gemv_b_count() : 0, w40 = kiln_cuda_w4_count ? kiln_cuda_w4_count() : 0;
            for (int i = 0; i < 5; i++) {
                /* residual r += y, x = norm(r): before q/k/v with y = x (the
                 * norm's output aliasing y, as a dense layer calls it) at
                 * n = 1 and no add at n = 2 (a model's first norm), before
                 * gate/up with y its own buffer (as after an MoE block) */
                if (norm && i == 0 && n == 2) {
                    p->cpu->rmsnorm(p->cpu, xc, rc, &nw.c, n, dim, 1e-6f);
                    p->gpu->rmsnorm(p->gpu, xg, rg, &nw.g, n, dim, 1e-6f);
                } else if (norm && (i == 0 || i == 3)) {
                    p->cpu->add_rmsnorm(p->cpu, rc, xc, i == 0 ? xc : yc, &nw.c, n, dim, 1e-6f);
                    p->gpu->add_rmsnorm(p->gpu, rg, xg, i == 0 ? xg : yg, &nw.g, n, dim, 1e-6f);
                }
                p->cpu->matmul(p->cpu, oc[i], xc, &L[i].c, n);
                p->gpu->matmul(p->gpu, og[i], xg, &L[i].g, n);
                if (i == 2 || i == 4) { /* the queue: q/k/v, then gate/up */
                    if (i == 4) {
                        p->cpu->swiglu(p->cpu, oc[3], oc[3], oc[4], n, ffn);
                        p->gpu->swiglu(p->gpu, og[3], og[3], og[4], n, ffn);
                    }
                    char what[128];
                    for (int j = i == 2 ? 0 : 3; j <= i; j++) {
                        static const char *nm[5] = {"q", "k", "v", "swiglu(gate, up)", "up"};
                        snprintf(what, sizeof what, "decode %s %dx%d n=%d%s", nm[j], L[j].c.n_out, dim, n, tag);
                        check_rel(p, what, oc[j], og[j], (size_t)n * L[j].c.n_out, TOL_OP);
                    }
                    if (norm) {
                        snprintf(what, sizeof what, "decode residual before %s, %d x n=%d%s", i == 2 ? "q/k/v" : "gate/up", dim, n, tag);
                        check_rel(p, what, rc, rg, (size_t)n * dim, ntol);
                        snprintf(what, sizeof what, "decode norm before %s, %d x n=%d%s", i == 2 ? "q/k/v" : "gate/up", dim, n, tag);
                        check_rel(p, what, xc, xg, (size_t)n * dim, ntol);
                    }
                }
            }
            static const char *const sw[] = {"KILN_CUDA_GEMV_B", "KILN_CUDA_DEFER", NULL};
            if (qfmt && kiln_cuda_w4_count && switches_on(sw)) /* q/k/v in one launch, gate/up with the SwiGLU in one */
                CHECK(kiln_cuda_w4_count() - w40 == 2, "decode %d-wide n=%d%s: %ld 4-bit GEMV launches, expected 2", dim, n, tag,
                      kiln_cuda_w4_count() - w40);
            if (!qfmt && kiln_cuda_gemv_b_ok && kiln_cuda_gemv_b_ok() && switches_on(sw)) {
                CHECK(kiln_cuda_gemv_b_count() - gb0 == (n <= 2 ? bulk * shapes[s][5] : 0), "decode %d-wide n=%d%s: %ld bulk-copy GEMVs", dim, n, tag,
                      kiln_cuda_gemv_b_count() - gb0);
            }
            for (int i = 0; i < 5; i++) free_both(p, oc[i], og[i]);
            free_both(p, xc, xg), free_both(p, rc, rg), free_both(p, yc, yg), free(x), free(r);
        }
        for (int i = 0; i < 5; i++) {
            if (!qfmt) {
                lin_free(p, &L[i]);
                continue;
            }
            p->cpu->release_linear(p->cpu, &L[i].c);
            p->gpu->release_linear(p->gpu, &L[i].g);
            free((void *)L[i].c.bias.data);
            ref_qmem_free(&qm[i]);
        }
        vec_free(p, &nw);
    }
}

/* with the norm: on the default backend, and with KILN_CUDA_FUSE_NORM=0
 * (never folded) and =1 (folded into the GEMV); then the folding backend's
 * residual and norm bit for bit against the other's */
static void test_decode_fused(struct pair *p) {
    decode_fused_cases(p, 0, "", TOL_OP, 1, NULL);
    const int fold_default = getenv("KILN_CUDA_FUSE_NORM") && !strcmp(getenv("KILN_CUDA_FUSE_NORM"), "1");
    decode_fused_cases(p, 1, ", after add_rmsnorm", TOL_OP, !fold_default, NULL);
    decode_fused_cases(p, 1, ", GPTQ-int4, after add_rmsnorm", TOL_OP, 0, "gptq-int4");
    decode_fused_cases(p, 0, ", Q4_0", TOL_OP, 0, "q4_0");
    char *zf_saved = env_save("KILN_CUDA_W4_ZF");
    setenv("KILN_CUDA_W4_ZF", "0", 1);
    decode_fused_cases(p, 1, ", GPTQ-int4, zeros in the codes", TOL_OP, 0, "gptq-int4");
    decode_fused_cases(p, 0, ", Q4_0, zeros in the codes", TOL_OP, 0, "q4_0");
    env_restore("KILN_CUDA_W4_ZF", zf_saved);
    free(zf_saved);
    char *saved = getenv("KILN_CUDA_FUSE_NORM") ? strdup(getenv("KILN_CUDA_FUSE_NORM")) : NULL;
    static const char *modes[] = {"0", "1"};
    struct kiln_backend *be[2] = {NULL, NULL};
    for (int m = 0; m < 2; m++) {
        char err[256], tag[80];
        setenv("KILN_CUDA_FUSE_NORM", modes[m], 1);
        struct pair q = {p->cpu, be[m] = backend_create("cuda", 0, err, sizeof err)};
        CHECK(q.gpu != NULL, "%s", err);
        if (!q.gpu) continue;
        snprintf(tag, sizeof tag, ", after add_rmsnorm, KILN_CUDA_FUSE_NORM=%s", modes[m]);
        decode_fused_cases(&q, 1, tag, TOL_OP, m == 0, NULL);
    }
    if (saved) setenv("KILN_CUDA_FUSE_NORM", saved, 1), free(saved);
    else unsetenv("KILN_CUDA_FUSE_NORM");
    if (be[0] && be[1]) {
        struct pair q = {be[0], be[1]};
        decode_fused_cases(&q, 1, ", folded against KILN_CUDA_FUSE_NORM=0", 0, 1, NULL);
    }
    for (int m = 0; m < 2; m++)
        if (be[m]) be[m]->destroy(be[m]);
}

long kiln_cuda_moe_down_b_count(void) __attribute__((weak));
long kiln_cuda_moe_down_r_count(void) __attribute__((weak));
int kiln_cuda_moe_down_b_ok(void) __attribute__((weak));
long kiln_cuda_moe_chunked_count(void) __attribute__((weak));
long kiln_cuda_moe_batch_count(void) __attribute__((weak));

/* the backend's MoE path limits as a backend made now reads them (cuda.cuh
 * MOE_DIRECT_MAX, MOE_BATCH_MAX) */
static int moe_env(const char *name, int def) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

/* E random experts (gate, up: F x dim; down: dim x F) into ex[3E] and the
 * layers' gate / up / down arrays, CPU copies in mc, GPU copies in mg */
static void experts_make(struct pair *p, struct lin2 *ex, struct moe_ffn *mc, struct moe_ffn *mg, int E, int F, int dim) {
    for (int e = 0; e < E; e++) {
        ex[3 * e] = lin_make(p, F, dim, 0), ex[3 * e + 1] = lin_make(p, F, dim, 0), ex[3 * e + 2] = lin_make(p, dim, F, 0);
        mc->gate[e] = ex[3 * e].c, mg->gate[e] = ex[3 * e].g;
        mc->up[e] = ex[3 * e + 1].c, mg->up[e] = ex[3 * e + 1].g;
        mc->down[e] = ex[3 * e + 2].c, mg->down[e] = ex[3 * e + 2].g;
    }
}

/* one MoE layer of E experts, top-K, against the CPU, at n = 1, 4, 8
 * (decode's direct path), 9, 16, 33 and 64 (expert by expert on the device,
 * moe_batch.cu) and 100 and 300 tokens (grouped GEMMs; chunked: 1 or 0,
 * whether they must run as chunk batches, -1 not checked). Which path a
 * size takes follows KILN_CUDA_MOE_DIRECT / _BATCH as the backend read
 * them. The direct path's
 * down GEMV is the register kernel (gemm.cu k_moe_down_r, R x J rows x
 * chunks per warp: 8 x 3 up to 768 wide, 4 x 6 at 1536, 2 x 12 at 2048 with
 * 10 slots, two per warp); with KILN_CUDA_MOE_LD=0 on sm_90 the bulk-copy
 * kernel (k_moe_down_b, rows per block R from the shape: 8 at 768 wide, 2 at
 * 1536, 1 at 2048 with 10 slots) */
enum { ROUTER_RANDOM, ROUTER_TIED, ROUTER_NAN };

static void moe_case_c(struct pair *p, int E, int K, int dim, int F, int router_kind, int chunked) {
    struct moe_ffn mc = {.n_expert = E, .n_used = K, .ffn = F, .norm_topk = 1}, mg = mc;
    struct qlinear rw = rand_linear(E, dim, 0);
    CHECK(rw.w.dtype == KILN_DTYPE_BF16, "rand_linear's weights are bf16");
    uint16_t *w = (uint16_t *)rw.w.data;
    const int tied = router_kind == ROUTER_TIED, nan = router_kind == ROUTER_NAN;
    if (tied) { /* experts 2m and 2m + 1 get the same logit, x[m % dim], exactly on both backends */
        memset(w, 0, sizeof *w * (size_t)E * dim);
        for (int e = 0; e < E; e++) w[(size_t)e * dim + (e / 2) % dim] = kiln_f32_to_bf16(1.f);
    }
    if (nan) w[0] = 0x7fc0; /* expert 0's logit is NaN, so every probability is */
    struct lin2 router = lin_prepare(p, rw);
    struct lin2 *ex = kiln_malloc(sizeof(struct lin2) * 3 * E);
    mc.gate = kiln_malloc(sizeof(struct qlinear) * E), mc.up = kiln_malloc(sizeof(struct qlinear) * E);
    mc.down = kiln_malloc(sizeof(struct qlinear) * E);
    mg.gate = kiln_malloc(sizeof(struct qlinear) * E), mg.up = kiln_malloc(sizeof(struct qlinear) * E);
    mg.down = kiln_malloc(sizeof(struct qlinear) * E);
    experts_make(p, ex, &mc, &mg, E, F, dim);
    /* router logits spread over a few units so the top-k is not near-tied */
    mc.router = router.c, mg.router = router.g;
    char err[256] = "no prepare_moe";
    /* as at load: each kind's experts moved into one allocation, the tables up */
    CHECK(p->gpu->prepare_moe && p->gpu->prepare_moe(p->gpu, &mg, err, sizeof err) == 0, "moe E=%d: prepare_moe: %s", E, err);
    static const char *const sw_ld[] = {"KILN_CUDA_MOE_LD", "KILN_CUDA_MOE_PTR", NULL};
    static const char *const sw[] = {"KILN_CUDA_MOE_BULK", "KILN_CUDA_MOE_PTR", NULL};
    const int ld = switches_on(sw_ld) && F <= 3072;
    const int bulk = !ld && kiln_cuda_moe_down_b_ok && kiln_cuda_moe_down_b_ok() && switches_on(sw);
    const int ns[] = {1, 4, 8, 9, 16, 33, 64, 100, 300};
    const int dmax = moe_env("KILN_CUDA_MOE_DIRECT", 8), bmax = moe_env("KILN_CUDA_MOE_BATCH", 32);
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int n = ns[k];
        float *x = rand_vec((size_t)n * dim, 3.f);
        void *xc, *xg, *og, *oc = alloc_both(p, &og, (size_t)n * dim);
        put(p, &xc, &xg, x, (size_t)n * dim);
        const long b0 = kiln_cuda_moe_down_b_count ? kiln_cuda_moe_down_b_count() : 0;
        const long r0 = kiln_cuda_moe_down_r_count ? kiln_cuda_moe_down_r_count() : 0;
        const long c0 = kiln_cuda_moe_chunked_count ? kiln_cuda_moe_chunked_count() : 0;
        const long m0 = kiln_cuda_moe_batch_count ? kiln_cuda_moe_batch_count() : 0;
        const int direct = n <= dmax, batch = !direct && n <= bmax;
        p->cpu->moe(p->cpu, oc, xc, &mc, n, dim);
        p->gpu->moe(p->gpu, og, xg, &mg, n, dim);
        char what[96];
        snprintf(what, sizeof what, "moe E=%d top-%d %dx%d n=%d (%s%s)", E, K, F, dim, n,
                 direct ? "direct" : batch ? "expert by expert" : "grouped",
                 tied ? ", logits tied in pairs" : nan ? ", a NaN router weight" : "");
        if (nan) { /* experts are still chosen among the E (no read past the tables), and NaN comes out everywhere */
            float *hc = kiln_malloc(sizeof(float) * (size_t)n * dim), *hg = kiln_malloc(sizeof(float) * (size_t)n * dim);
            p->cpu->read(p->cpu, hc, oc, (size_t)n * dim);
            p->gpu->read(p->gpu, hg, og, (size_t)n * dim);
            size_t bad = 0;
            for (size_t e = 0; e < (size_t)n * dim; e++) bad += !isnan(hc[e]) || !isnan(hg[e]);
            CHECK(bad == 0, "%s: %zu outputs are not NaN on both backends", what, bad);
            free(hc), free(hg);
        } else
            check_rel(p, what, oc, og, (size_t)n * dim, TOL_OP2);
        if (kiln_cuda_moe_down_b_count)
            CHECK(kiln_cuda_moe_down_b_count() - b0 == (bulk && direct), "%s: bulk-copy down kernel ran %ld times", what,
                  kiln_cuda_moe_down_b_count() - b0);
        if (kiln_cuda_moe_down_r_count)
            CHECK(kiln_cuda_moe_down_r_count() - r0 == (ld && direct), "%s: register down kernel ran %ld times", what,
                  kiln_cuda_moe_down_r_count() - r0);
        if (kiln_cuda_moe_chunked_count && chunked >= 0)
            CHECK(kiln_cuda_moe_chunked_count() - c0 == (chunked && !direct && !batch), "%s: the experts ran as chunk batches %ld times",
                  what, kiln_cuda_moe_chunked_count() - c0);
        if (kiln_cuda_moe_batch_count)
            CHECK(kiln_cuda_moe_batch_count() - m0 == batch, "%s: the expert-by-expert kernels ran %ld times", what,
                  kiln_cuda_moe_batch_count() - m0);
        free_both(p, xc, xg), free_both(p, oc, og), free(x);
    }
    for (int e = 0; e < 3 * E; e++) lin_free(p, &ex[e]);
    lin_free(p, &router);
    free(ex), free(mc.gate), free(mc.up), free(mc.down), free(mg.gate), free(mg.up), free(mg.down);
}

static void moe_case(struct pair *p, int E, int K, int dim, int F, int router_kind) {
    moe_case_c(p, E, K, dim, F, router_kind, -1);
}

/* tied: the top K (odd) ends inside a pair of equal probabilities, which
 * both backends break towards the lower expert id */
static void test_moe(struct pair *p) {
    moe_case(p, 32, 8, 1024, 768, ROUTER_RANDOM);
    moe_case(p, 16, 8, 512, 1536, ROUTER_RANDOM);
    moe_case(p, 16, 10, 256, 2048, ROUTER_RANDOM);
    moe_case(p, 128, 8, 512, 768, ROUTER_RANDOM); /* Qwen3-MoE's E and K */
    moe_case(p, 16, 5, 256, 768, ROUTER_TIED);
    moe_case(p, 128, 7, 512, 768, ROUTER_TIED);
    moe_case(p, 128, 8, 512, 768, ROUTER_NAN);
    moe_case(p, 512, 10, 256, 128, ROUTER_RANDOM); /* Qwen3-Next's E and K: 2 experts per k_route thread */
    moe_case(p, 1024, 10, 64, 64, ROUTER_RANDOM);  /* the most experts the CUDA backend takes (k_route's shared memory) */
    moe_case(p, 1024, 32, 64, 64, ROUTER_TIED);    /* and the most experts per token */
    moe_case(p, 200, 9, 256, 128, ROUTER_TIED);    /* E not a multiple of the warp */
    moe_case(p, 16, 8, 256, 3200, ROUTER_RANDOM);  /* wider than the register kernel takes: bulk copies, R = 1 */
    /* the bulk-copy down kernel, the register one turned off */
    char *saved = getenv("KILN_CUDA_MOE_LD") ? strdup(getenv("KILN_CUDA_MOE_LD")) : NULL, err[256];
    setenv("KILN_CUDA_MOE_LD", "0", 1);
    struct pair q = {p->cpu, backend_create("cuda", 0, err, sizeof err)};
    CHECK(q.gpu != NULL, "%s", err);
    if (q.gpu) {
        moe_case(&q, 32, 8, 1024, 768, ROUTER_RANDOM);
        moe_case(&q, 16, 8, 512, 1536, ROUTER_RANDOM);
        moe_case(&q, 16, 10, 256, 2048, ROUTER_RANDOM);
        moe_case(&q, 128, 7, 512, 768, ROUTER_TIED);
        q.gpu->destroy(q.gpu);
    }
    if (saved) setenv("KILN_CUDA_MOE_LD", saved, 1), free(saved);
    else unsetenv("KILN_CUDA_MOE_LD");
}

/* the MoE cases a backend made under other path settings runs (chunked
 * as moe_case_c) */
static void moe_env_cases(struct pair *p, const char *what, int chunked) {
    char err[256];
    struct pair q = {p->cpu, backend_create("cuda", 0, err, sizeof err)};
    CHECK(q.gpu != NULL, "%s: %s", what, err);
    if (!q.gpu) return;
    moe_case_c(&q, 32, 8, 1024, 768, ROUTER_RANDOM, chunked);
    moe_case_c(&q, 16, 10, 256, 2048, ROUTER_RANDOM, chunked);
    moe_case_c(&q, 128, 7, 512, 768, ROUTER_TIED, chunked);
    moe_case_c(&q, 200, 9, 256, 128, ROUTER_TIED, chunked);
    moe_case_c(&q, 128, 8, 512, 768, ROUTER_NAN, chunked);
    moe_case_c(&q, 1024, 32, 64, 64, ROUTER_TIED, chunked); /* the most experts, and per token: the sort's widest scan */
    q.gpu->destroy(q.gpu);
}

/* the prefill expert GEMMs with each expert's rows cut into chunks of T
 * rows (KILN_CUDA_MOE_CHUNK=T; moe.cu moe_experts_chunked): one row, fewer
 * rows than a warp, a T that is no power of two, the sizes the backend
 * picks; T = 0, one problem per expert (the grouped call), and that with the
 * grouped call off (one cuBLAS call per expert). At 100 and 300 tokens an
 * expert has 0 to several chunks (16 experts of 10: ~190 rows each at 300
 * tokens), the last one padded. */
static void test_moe_chunks(struct pair *p) {
    static const char *const ts[] = {"1", "8", "48", "64", "128", "0", "0/loop"};
    char *saved = env_save("KILN_CUDA_MOE_CHUNK"), *saved_g = env_save("KILN_CUDA_MOE_GROUPED");
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        const int loop = strchr(ts[i], '/') != NULL;
        setenv("KILN_CUDA_MOE_CHUNK", loop ? "0" : ts[i], 1);
        if (loop) setenv("KILN_CUDA_MOE_GROUPED", "0", 1);
        moe_env_cases(p, ts[i], atoi(ts[i]) > 0);
        env_restore("KILN_CUDA_MOE_GROUPED", saved_g);
    }
    env_restore("KILN_CUDA_MOE_CHUNK", saved);
    free(saved), free(saved_g);
}

/* the MoE paths' limits moved: every size expert by expert (the direct
 * path off, the batch path up to 300 tokens), and no batch path (9-32
 * tokens through the grouped GEMMs) */
static void test_moe_paths(struct pair *p) {
    static const char *const set[][2] = {{"0", "300"}, {"8", "0"}};
    char *sd = env_save("KILN_CUDA_MOE_DIRECT"), *sb = env_save("KILN_CUDA_MOE_BATCH");
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) {
        setenv("KILN_CUDA_MOE_DIRECT", set[i][0], 1), setenv("KILN_CUDA_MOE_BATCH", set[i][1], 1);
        moe_env_cases(p, set[i][1], -1);
    }
    env_restore("KILN_CUDA_MOE_DIRECT", sd), env_restore("KILN_CUDA_MOE_BATCH", sb);
    free(sd), free(sb);
}

long kiln_cuda_moe_w4_count(void) __attribute__((weak));
long kiln_cuda_moe_w4_gemm_count(void) __attribute__((weak));

/* a quantized expert matrix's format: ref_quant_linear's fmt, group, act-order, asymmetric */
struct qex {
    const char *fmt;
    int group, act, asym;
};

/* w (n_out x n_in f32) rounded to bf16, as a dense linear on the GPU */
static struct qlinear gpu_bf16_of(struct pair *p, const float *w, int n_out, int n_in) {
    char err[256];
    struct qlinear q = rand_linear(n_out, n_in, 0);
    uint16_t *d = (uint16_t *)q.w.data;
    for (size_t i = 0; i < (size_t)n_out * n_in; i++) d[i] = kiln_f32_to_bf16(w[i]);
    CHECK(p->gpu->prepare_linear(p->gpu, &q, err, sizeof err) == 0, "%s", err);
    return q;
}

/* an MoE layer in f64 on the host (Qwen3-MoE semantics, as cpu/moe.c):
 * router rw (bf16, E x dim), experts w[3 E] (gate | up | down, f32); out
 * NULL: the routing only. gap[i]: token i's K-th largest router logit less
 * its (K+1)-th (how far it is from choosing another expert) */
static void moe_ref64(float *out, double *gap, const float *x, int n, int dim, const uint16_t *rw, float *const *w, int E, int K, int F) {
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        double *p = kiln_malloc(sizeof(double) * E), *h = kiln_malloc(sizeof(double) * F), mx = -INFINITY, tot = 0, ptot = 0;
        for (int e = 0; e < E; e++) {
            double a = 0;
            for (int k = 0; k < dim; k++) a += (double)xi[k] * kiln_bf16_to_f32(rw[(size_t)e * dim + k]);
            p[e] = a, mx = a > mx ? a : mx;
        }
        for (int e = 0; e < E; e++) tot += p[e] = exp(p[e] - mx);
        int *chosen = kiln_malloc(sizeof(int) * K);
        for (int k = 0; k < K; k++) { /* the largest not yet chosen, ties to the lower id */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= chosen[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            chosen[k] = best, ptot += p[best];
        }
        double next = 0; /* the largest probability not chosen */
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int j = 0; j < K; j++) taken |= chosen[j] == e;
            if (!taken && p[e] > next) next = p[e];
        }
        gap[i] = K < E ? log(p[chosen[K - 1]] / next) : INFINITY;
        if (!out) {
            free(p), free(h), free(chosen);
            continue;
        }
        double *o = kiln_calloc((size_t)dim, sizeof(double));
        for (int k = 0; k < K; k++) {
            const int e = chosen[k];
            const float *g = w[e], *u = w[E + e], *d = w[2 * E + e];
            for (int r = 0; r < F; r++) {
                double a = 0, b = 0;
                for (int c = 0; c < dim; c++) a += (double)g[(size_t)r * dim + c] * xi[c], b += (double)u[(size_t)r * dim + c] * xi[c];
                h[r] = a / (1 + exp(-a)) * b;
            }
            for (int r = 0; r < dim; r++) {
                double a = 0;
                for (int c = 0; c < F; c++) a += (double)d[(size_t)r * F + c] * h[c];
                o[r] += p[e] / ptot * a;
            }
        }
        for (int r = 0; r < dim; r++) out[(size_t)i * dim + r] = (float)o[r];
        free(p), free(h), free(chosen), free(o);
    }
}

/* relative L2 error of b against a (n rows of dim) over the rows whose
 * gap is at least min_gap; *left: the rows left out */
static double rel_rows(const float *a, const float *b, int n, int dim, const double *gap, double min_gap, int *left) {
    double num = 0, den = 0;
    *left = 0;
    for (int i = 0; i < n; i++) {
        if (gap[i] < min_gap) {
            ++*left;
            continue;
        }
        for (int j = 0; j < dim; j++) {
            const double d = (double)b[(size_t)i * dim + j] - a[(size_t)i * dim + j];
            if (d != d) return INFINITY;
            num += d * d, den += (double)a[(size_t)i * dim + j] * a[(size_t)i * dim + j];
        }
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/*
 * An MoE layer with quantized experts, at the sizes of moe_case_c. 4-bit
 * kinds (gate with up, and down) stay 4-bit on the device (their bytes are
 * checked) and run moe_w4.cu's kernels (launches counted, one per 4-bit
 * kind): pair by pair up to the direct limit when both kinds are 4-bit,
 * expert by expert up to the 4-bit batch limit; above it they are
 * dequantized into scratch for cuBLAS. want_gu / want_dn: whether each kind
 * should stay 4-bit. act0 makes expert 0's gate act-order (the others' are
 * not): a kind the 4-bit kernels cannot take as a whole, widened on the
 * device with its columns put back in order. Checked against
 *  - the CPU on the same weights: TOL_OP2, as for bf16 experts (the CPU's
 *    4-bit kernels quantize x to int8: ~1% of the output's norm here);
 *  - the 4-bit kernels (up to 64 tokens): an f64 reference on the
 *    dequantized weights (a widened kind's rounded to bf16, as the GPU holds
 *    it): 4e-3. Their products are exact and summed in f32; what is left is
 *    the bf16 rounding of h and of the output, 1.66e-3 of the norm each (as
 *    test_matmul_quant measures one rounding), ~2.4e-3 together;
 *  - the GEMMs on the codes (k_moe_w4_gemm, both kinds 4-bit, few rows per
 *    expert): the f64 reference, 6e-3 (gate, up, h and y rounded to bf16
 *    besides the output: ~3.7e-3);
 *  - the dequantized path: bit for bit the same layer with bf16 experts (the
 *    reference dequantization rounded once), which is what it computes,
 *    where that layer runs the same grouped GEMMs.
 * A token whose K-th and (K+1)-th router logits lie within 1e-4 (f64) is
 * left out of the first two: the f32 logits of the backends may choose
 * either expert (random routers put one such token in ~10^3 here).
 */
static void moe_w4_case(struct pair *p, int E, int K, int dim, int F, struct qex gu, struct qex dn, int act0, int want_gu, int want_dn) {
    struct moe_ffn mc = {.n_expert = E, .n_used = K, .ffn = F, .norm_topk = 1}, mg = mc, mb = mc;
    struct lin2 router = lin_make(p, E, dim, 0);
    mc.router = router.c, mg.router = mb.router = router.g;
    struct lin2 *ex = kiln_malloc(sizeof(struct lin2) * 3 * E);
    struct ref_qmem *qm = kiln_calloc((size_t)3 * E, sizeof *qm);
    struct qlinear *arr = kiln_malloc(sizeof(struct qlinear) * 9 * E);
    float **wd = kiln_malloc(sizeof(float *) * 3 * E); /* the reference's weights */
    mc.gate = arr, mc.up = arr + E, mc.down = arr + 2 * E, mg.gate = arr + 3 * E, mg.up = arr + 4 * E, mg.down = arr + 5 * E;
    mb.gate = arr + 6 * E, mb.up = arr + 7 * E, mb.down = arr + 8 * E;
    for (int e = 0; e < E; e++) {
        ex[3 * e] = lin_prepare(p, q_linear(&qm[3 * e], gu.fmt, F, dim, gu.group, gu.act || (act0 && e == 0), gu.asym, 0));
        ex[3 * e + 1] = lin_prepare(p, q_linear(&qm[3 * e + 1], gu.fmt, F, dim, gu.group, gu.act, gu.asym, 0));
        ex[3 * e + 2] = lin_prepare(p, q_linear(&qm[3 * e + 2], dn.fmt, dim, F, dn.group, dn.act, dn.asym, 0));
        mc.gate[e] = ex[3 * e].c, mg.gate[e] = ex[3 * e].g, mc.up[e] = ex[3 * e + 1].c, mg.up[e] = ex[3 * e + 1].g;
        mc.down[e] = ex[3 * e + 2].c, mg.down[e] = ex[3 * e + 2].g;
        for (int k = 0; k < 3; k++) {
            const struct qlinear *q = &ex[3 * e + k].c;
            float *w = wd[(size_t)k * E + e] = kiln_malloc(sizeof(float) * (size_t)q->n_out * q->n_in);
            quant_dequant_linear(q, w);
            mb.gate[(size_t)k * E + e] = gpu_bf16_of(p, w, q->n_out, q->n_in); /* mb's three arrays are contiguous */
            if (!(k < 2 ? want_gu : want_dn)) /* a widened kind: the reference takes its bf16 weights */
                for (size_t i = 0; i < (size_t)q->n_out * q->n_in; i++) w[i] = kiln_bf16_to_f32(kiln_f32_to_bf16(w[i]));
        }
    }
    char err[256] = "no prepare_moe";
    CHECK(p->gpu->prepare_moe && p->gpu->prepare_moe(p->gpu, &mg, err, sizeof err) == 0, "moe E=%d: prepare_moe: %s", E, err);
    const int ns[] = {1, 4, 8, 9, 16, 33, 64, 100, 300};
    const int pmax = moe_env("KILN_CUDA_MOE_W4_PAIRS", 1), dmax = moe_env("KILN_CUDA_MOE_DIRECT", 8), bmax = moe_env("KILN_CUDA_MOE_BATCH", 32); /* mb's paths */
    const int gmax = moe_env("KILN_CUDA_MOE_W4_GEMM", 96);
    /* expert by expert up to 96 tokens where the GEMMs on the codes follow, else 128 (cuda.cuh) */
    const int wmax = moe_env("KILN_CUDA_MOE_W4_BATCH", want_gu && want_dn && gmax > 0 ? 96 : 128);
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        const int n = ns[k];
        float *x = rand_vec((size_t)n * dim, 3.f);
        void *xc, *xg, *og, *oc = alloc_both(p, &og, (size_t)n * dim), *ob = p->gpu->alloc(p->gpu, (size_t)n * dim * p->gpu->act_size);
        put(p, &xc, &xg, x, (size_t)n * dim);
        const long w0 = kiln_cuda_moe_w4_count ? kiln_cuda_moe_w4_count() : 0;
        const long m0 = kiln_cuda_moe_batch_count ? kiln_cuda_moe_batch_count() : 0;
        const long g0 = kiln_cuda_moe_w4_gemm_count ? kiln_cuda_moe_w4_gemm_count() : 0;
        p->cpu->moe(p->cpu, oc, xc, &mc, n, dim);
        p->gpu->moe(p->gpu, og, xg, &mg, n, dim);
        const long w1 = kiln_cuda_moe_w4_count ? kiln_cuda_moe_w4_count() : 0;
        const long m1 = kiln_cuda_moe_batch_count ? kiln_cuda_moe_batch_count() : 0;
        const long g1 = kiln_cuda_moe_w4_gemm_count ? kiln_cuda_moe_w4_gemm_count() : 0;
        char what[160];
        snprintf(what, sizeof what, "moe E=%d top-%d %dx%d n=%d, %s g%d / %s g%d%s", E, K, F, dim, n, gu.fmt, gu.group, dn.fmt, dn.group,
                 act0 ? ", expert 0's gate act-order" : "");
        const int pairs = want_gu && want_dn && n <= pmax, by_expert = !pairs && (want_gu || want_dn) && n <= wmax;
        const int fused = !pairs && !by_expert && want_gu && want_dn && gmax > 0 && (long)n * K <= (long)E * gmax;
        float *hc = kiln_malloc(sizeof(float) * (size_t)n * dim), *hg = kiln_malloc(sizeof(float) * (size_t)n * dim), *ref = NULL;
        double *gap = kiln_malloc(sizeof(double) * n), mx;
        p->cpu->read(p->cpu, hc, oc, (size_t)n * dim);
        p->gpu->read(p->gpu, hg, og, (size_t)n * dim);
        if (((pairs || by_expert) && n <= 64) || fused) ref = kiln_malloc(sizeof(float) * (size_t)n * dim);
        moe_ref64(ref, gap, x, n, dim, (const uint16_t *)router.c.w.data, wd, E, K, F);
        int left;
        double r = rel_rows(hc, hg, n, dim, gap, 1e-4, &left);
        if (verbose()) fprintf(stderr, "  %-44s rel %.2e (%d near-tied tokens left out)\n", what, r, left);
        CHECK(r <= TOL_OP2, "%s: relative error %.3g against the cpu > %.3g", what, r, TOL_OP2);
        if (ref) { /* fused: gate, up, h and y rounded to bf16 besides the output, ~3.7e-3 */
            const double tol = fused ? 6e-3 : 4e-3;
            r = rel_rows(ref, hg, n, dim, gap, 1e-4, &left);
            if (verbose()) fprintf(stderr, "  %-44s rel %.2e against f64%s\n", what, r, fused ? " (GEMMs on the codes)" : "");
            CHECK(r <= tol, "%s: relative error %.3g against the f64 reference > %.0e", what, r, tol);
        } else if (!pairs && !by_expert && n > dmax && n > bmax) { /* both layers on the grouped GEMMs */
            p->gpu->moe(p->gpu, ob, xg, &mb, n, dim);
            struct pair gg = {p->gpu, p->gpu}; /* both on the GPU */
            r = compare(&gg, ob, og, (size_t)n * dim, &mx);
            if (verbose()) fprintf(stderr, "  %-44s rel %.2e against bf16 experts\n", what, r);
            CHECK(r == 0, "%s: %.3g relative to the same layer with bf16 experts, not the same bits (max |delta| %.3g)", what, r, mx);
        }
        free(hc), free(hg), free(ref), free(gap);
        if (kiln_cuda_moe_w4_count)
            CHECK(w1 - w0 == (pairs || by_expert ? want_gu + want_dn : 0), "%s: 4-bit expert kernels ran %ld times", what, w1 - w0);
        if (kiln_cuda_moe_batch_count && (want_gu || want_dn))
            CHECK(m1 - m0 == by_expert, "%s: the expert-by-expert path ran %ld times", what, m1 - m0);
        if (kiln_cuda_moe_w4_gemm_count)
            CHECK(g1 - g0 == fused, "%s: the GEMMs on the codes ran %ld times", what, g1 - g0);
        free_both(p, xc, xg), free_both(p, oc, og), p->gpu->free(p->gpu, ob), free(x);
    }
    /* after the first forward (which settles the kinds): 4-bit (padded rows and columns included), or the bf16 copy */
    const struct qlinear *kinds[2] = {&mg.up[E - 1], &mg.down[E - 1]};
    const int want[2] = {want_gu, want_dn};
    for (int i = 0; i < 2; i++) {
        const int64_t bytes = p->gpu->linear_bytes(p->gpu, kinds[i]), bf = (int64_t)F * dim * 2;
        CHECK(want[i] ? bytes < bf : bytes == bf, "moe E=%d %s: %s holds %lld device bytes (bf16: %lld), expected %s", E,
              i ? dn.fmt : gu.fmt, i ? "down" : "up", (long long)bytes, (long long)bf, want[i] ? "4-bit" : "the bf16 copy");
    }
    for (int e = 0; e < 3 * E; e++) {
        p->cpu->release_linear(p->cpu, &ex[e].c);
        p->gpu->release_linear(p->gpu, &ex[e].g);
        ref_qmem_free(&qm[e]);
        p->gpu->release_linear(p->gpu, &mb.gate[e]);
        free((void *)mb.gate[e].w.data), free(wd[e]);
    }
    lin_free(p, &router);
    free(ex), free(qm), free(arr), free(wd);
}

static void test_moe_w4(struct pair *p) {
    const struct qex g128 = {"gptq-int4", 128, 0, 0}, g64a = {"gptq-int4", 64, 0, 1}, pc = {"gptq-int4", -1, 0, 1};
    const struct qex awq = {"awq", 32, 0, 1}, q40 = {"q4_0", 0, 0, 0}, q80 = {"q8_0", 0, 0, 0}, g32 = {"gptq-int4", 32, 0, 1};
    moe_w4_case(p, 32, 8, 1024, 768, g128, g128, 0, 1, 1);  /* groups spanning a 128-column block (GB) */
    moe_w4_case(p, 128, 8, 512, 768, awq, awq, 0, 1, 1);    /* Qwen3-MoE's E and K, groups of 32 */
    moe_w4_case(p, 16, 4, 256, 512, q40, q40, 0, 1, 1);     /* GGUF Q4_0 */
    moe_w4_case(p, 16, 4, 256, 160, q40, g32, 0, 1, 1);     /* rows and columns padded in the layout */
    moe_w4_case(p, 32, 8, 512, 256, g64a, q80, 0, 1, 0);    /* down widened at load (Q8_0) */
    moe_w4_case(p, 32, 8, 512, 256, g128, pc, 1, 0, 1);     /* gate / up widened on the device; down per channel */
    moe_w4_case(p, 8, 2, 4096, 1536, g128, g128, 0, 1, 1);  /* Qwen3-235B-A22B's dim and expert ffn (E, K cut for the f64 reference's time) */
    /* other path limits, each on a backend made under them: every size
     * expert by expert (up to 300 tokens: many passes over an expert's
     * codes), pairs up to 16 tokens and no expert-by-expert path, neither
     * (the GEMMs on the codes from 1 token), neither and no GEMMs on the
     * codes (all dequantized), the GEMMs on the codes at every prefill
     * size, down with the warps splitting each tile's columns
     * (KILN_CUDA_MOE_W4_WT=0, as for rows past 2,048), and gate/up in
     * blocks of 4 warps (KILN_CUDA_MOE_W4_GU_WARPS=4) */
    static const char *const set[][5] = {{"0", "300", NULL, NULL, NULL}, {"16", "0", NULL, NULL, NULL}, {"0", "0", NULL, NULL, NULL},
                                         {"0", "0", "0", NULL, NULL},    {NULL, NULL, "1000", NULL, NULL}, {NULL, NULL, NULL, "0", NULL},
                                         {NULL, NULL, NULL, NULL, "4"}};
    static const char *const names[5] = {"KILN_CUDA_MOE_W4_PAIRS", "KILN_CUDA_MOE_W4_BATCH", "KILN_CUDA_MOE_W4_GEMM", "KILN_CUDA_MOE_W4_WT",
                                         "KILN_CUDA_MOE_W4_GU_WARPS"};
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) {
        char *saved[5], err[256];
        for (int j = 0; j < 5; j++) saved[j] = env_save(names[j]), env_restore(names[j], set[i][j]);
        struct pair q = {p->cpu, backend_create("cuda", 0, err, sizeof err)};
        CHECK(q.gpu != NULL, "%s", err);
        if (q.gpu) {
            moe_w4_case(&q, 32, 8, 1024, 768, g128, g128, 0, 1, 1);
            moe_w4_case(&q, 128, 8, 512, 768, awq, awq, 0, 1, 1);
            moe_w4_case(&q, 16, 4, 256, 160, q40, g32, 0, 1, 1);
            moe_w4_case(&q, 32, 8, 512, 256, g64a, q80, 0, 1, 0);
            q.gpu->destroy(q.gpu);
        }
        for (int j = 0; j < 5; j++) env_restore(names[j], saved[j]), free(saved[j]);
    }
}

/* a MoE layer whose host arrays are reused for other experts, as when a
 * model is freed and the next one's arrays land at the same addresses: the
 * GPU must run the new experts, not its table of the freed ones' pointers.
 * The second set is made before the first is freed, so that its device
 * addresses differ. */
static void test_moe_reuse(struct pair *p) {
    const int E = 8, K = 2, dim = 256, F = 256, n = 2;
    struct qlinear *arr_c = kiln_malloc(sizeof(struct qlinear) * 3 * E), *arr_g = kiln_malloc(sizeof(struct qlinear) * 3 * E);
    struct lin2 *ex[2] = {kiln_malloc(sizeof(struct lin2) * 3 * E), kiln_malloc(sizeof(struct lin2) * 3 * E)};
    for (int round = 0; round < 2; round++) {
        struct moe_ffn mc = {.n_expert = E, .n_used = K, .ffn = F, .norm_topk = 1}, mg = mc;
        struct lin2 router = lin_make(p, E, dim, 0);
        mc.router = router.c, mg.router = router.g;
        mc.gate = arr_c, mc.up = arr_c + E, mc.down = arr_c + 2 * E;
        mg.gate = arr_g, mg.up = arr_g + E, mg.down = arr_g + 2 * E;
        experts_make(p, ex[round], &mc, &mg, E, F, dim);
        if (round == 1)
            for (int e = 0; e < 3 * E; e++) lin_free(p, &ex[0][e]);
        float *x = rand_vec((size_t)n * dim, 3.f);
        void *xc, *xg, *og, *oc = alloc_both(p, &og, (size_t)n * dim);
        put(p, &xc, &xg, x, (size_t)n * dim);
        p->cpu->moe(p->cpu, oc, xc, &mc, n, dim);
        p->gpu->moe(p->gpu, og, xg, &mg, n, dim);
        char what[64];
        snprintf(what, sizeof what, "moe, host arrays reused, round %d", round + 1);
        check_rel(p, what, oc, og, (size_t)n * dim, TOL_OP2);
        free_both(p, xc, xg), free_both(p, oc, og), free(x);
        lin_free(p, &router);
    }
    for (int e = 0; e < 3 * E; e++) lin_free(p, &ex[1][e]);
    free(ex[0]), free(ex[1]), free(arr_c), free(arr_g);
}

/* ==== (b) models ==== */

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static float margin(const float *v, int n) {
    int b = argmax(v, n);
    float s = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && v[i] > s) s = v[i];
    return v[b] - s;
}

static void check_model(const char *name) {
    char dir[256], err[1024] = "";
    snprintf(dir, sizeof dir, FIXTURES "/%s", name);
    struct ref r = {0};
    CHECK(ref_load(dir, &r) == 0, "%s: reference files", name);
    if (!r.last) return;
    struct kiln_engine_opts o = {.model = dir, .backend = "cuda", .max_total_tokens = 2048, .page_size = 16};
    kiln_engine *e = kiln_engine_open(&o, err, sizeof err);
    CHECK(e != NULL, "%s: %s", name, err);
    o.backend = "cpu";
    kiln_engine *ec = kiln_engine_open(&o, err, sizeof err);
    CHECK(ec != NULL, "%s (cpu): %s", name, err);
    if (!e || !ec) goto done;
    const int V = r.vocab;
    cJSON *prompts = cJSON_GetObjectItem(r.root, "prompts"), *topk = cJSON_GetObjectItem(r.root, "topk");
    cJSON *greedy = cJSON_GetObjectItem(r.root, "greedy");
    for (int p = 0; p < r.n_prompts; p++) {
        const float *ref = r.last + (size_t)p * V;
        float lo = ref[0], hi = ref[0];
        for (int i = 0; i < V; i++) lo = fminf(lo, ref[i]), hi = fmaxf(hi, ref[i]);
        const float tol = TOL_LOGIT * (hi - lo);
        int n;
        int32_t *ids = ref_ids(cJSON_GetArrayItem(prompts, p), &n);
        float *lg = kiln_malloc(sizeof(float) * (size_t)n * V), *one = kiln_malloc(sizeof(float) * (size_t)V);

        /* the whole prompt in one forward (GEMM + flash attention when long) */
        kiln_seq *s = kiln_seq_new(e, err, sizeof err);
        int rc = kiln_seq_eval(s, ids, n, lg, 1, err, sizeof err);
        CHECK(rc == 0, "%s prompt %d: %s", name, p, err);
        kiln_seq_free(s);
        const float *last = lg + (size_t)(n - 1) * V;
        float d = 0;
        for (int i = 0; i < V; i++) d = fmaxf(d, fabsf(last[i] - ref[i])) + (last[i] != last[i] ? INFINITY : 0);
        CHECK(d <= tol, "%s prompt %d (%d tokens): last logits max |delta| %g > %g (%.0f%% of the range %g)", name, p, n, d,
              tol, 100 * TOL_LOGIT, hi - lo);
        if (verbose())
            fprintf(stderr, "  %-18s prompt %d (%3d tokens): max |delta| %.4f = %.2f%% of the logit range %.3f\n", name, p, n, d,
                    100 * d / (hi - lo), hi - lo);
        /* top-1 at every position where the reference's margin is clear */
        cJSON *tk = cJSON_GetArrayItem(topk, p);
        cJSON *tids = cJSON_GetObjectItem(tk, "ids"), *tvals = cJSON_GetObjectItem(tk, "values");
        int bad = -1, n_clear = 0;
        for (int t = 0; t < n && t < cJSON_GetArraySize(tids); t++) {
            cJSON *ri = cJSON_GetArrayItem(tids, t), *rv = cJSON_GetArrayItem(tvals, t);
            float m = (float)(cJSON_GetArrayItem(rv, 0)->valuedouble - cJSON_GetArrayItem(rv, 1)->valuedouble);
            if (m <= tol) continue;
            n_clear++;
            if (argmax(lg + (size_t)t * V, V) != cJSON_GetArrayItem(ri, 0)->valueint) bad = t;
        }
        CHECK(bad < 0, "%s prompt %d: top-1 differs at position %d although the reference margin exceeds %g", name, p, bad, tol);
        if (verbose()) fprintf(stderr, "  %-18s prompt %d: top-1 agrees at all %d positions with a clear margin\n", name, p, n_clear);

        /* one token at a time (decode kernels, CUDA graphs) */
        rc = ref_stepwise(e, ids, n, one, err, sizeof err);
        CHECK(rc == 0, "%s prompt %d stepwise: %s", name, p, err);
        d = 0;
        for (int i = 0; i < V; i++) d = fmaxf(d, fabsf(one[i] - ref[i])) + (one[i] != one[i] ? INFINITY : 0);
        CHECK(d <= tol, "%s prompt %d: stepwise decode last logits max |delta| %g > %g", name, p, d, tol);
        if (verbose()) fprintf(stderr, "  %-18s prompt %d stepwise: max |delta| %.4f\n", name, p, d);

        /* greedy continuation: identical until the first step whose margin
         * (CPU logits on the reference's own prefix) is within tol */
        int ng;
        int32_t *want = ref_ids(cJSON_GetArrayItem(greedy, p), &ng), tok = 0;
        const int first = ref_greedy_diff(e, ids, n, want, ng, &tok, err, sizeof err);
        CHECK(first != -2, "%s prompt %d: greedy generation stopped early: %s", name, p, err);
        if (first >= 0) {
            int32_t *pre = kiln_malloc(sizeof(int32_t) * (size_t)(n + ng));
            memcpy(pre, ids, sizeof(int32_t) * (size_t)n);
            memcpy(pre + n, want, sizeof(int32_t) * (size_t)first);
            s = kiln_seq_new(ec, err, sizeof err);
            rc = kiln_seq_eval(s, pre, n + first, one, 0, err, sizeof err);
            kiln_seq_free(s);
            float m = margin(one, V);
            CHECK(rc == 0 && m <= tol, "%s prompt %d: greedy differs at step %d (%d vs %d) where the margin %g exceeds %g", name,
                  p, first, tok, want[first], m, tol);
            if (verbose())
                fprintf(stderr, "  %-18s prompt %d greedy: first %d of %d identical; step %d is a near-tie (margin %.4f <= %.4f)\n",
                        name, p, first, ng, first, m, tol);
            free(pre);
        } else if (verbose()) {
            fprintf(stderr, "  %-18s prompt %d greedy: all %d tokens identical\n", name, p, ng);
        }
        free(want), free(one), free(lg), free(ids);
    }
done:
    kiln_engine_close(e);
    kiln_engine_close(ec);
    ref_free(&r);
}


/* logits of every prompt position of the test prompt, fed in chunks of
 * `chunk` tokens (20: one prefill; 1: decode steps); NULL and err */
static const int32_t qprompt[] = {1, 17, 42, 99, 5, 64, 120, 3, 77, 8, 31, 90, 2, 11, 55, 100, 7, 63, 21, 44};
#define QNP ((int)(sizeof qprompt / sizeof qprompt[0]))

static float *prompt_logits(const char *path, const char *backend, int chunk, int *vocab, char *err, size_t errlen) {
    return ref_prompt_logits(path, backend, qprompt, QNP, chunk, vocab, err, errlen);
}

/* max - min of a row of V logits */
static float row_range(const float *y, int V) {
    float lo = y[0], hi = y[0];
    for (int i = 0; i < V; i++) lo = fminf(lo, y[i]), hi = fmaxf(hi, y[i]);
    return hi - lo;
}

/* max |x - y| over a row of V logits; infinite where x holds a NaN */
static float row_delta(const float *x, const float *y, int V) {
    float d = 0;
    for (int i = 0; i < V; i++) d = fmaxf(d, fabsf(x[i] - y[i])) + (x[i] != x[i] ? INFINITY : 0);
    return d;
}

/* worst |a - b| over the rows of b's logits, as a share of each row's range */
static float worst_share(const float *a, const float *b, int V) {
    float worst = 0;
    for (int t = 0; t < QNP; t++) {
        const float *x = a + (size_t)t * V, *y = b + (size_t)t * V;
        worst = fmaxf(worst, row_delta(x, y, V) / row_range(y, V));
    }
    return worst;
}

/*
 * Each pair of tests/fixtures/quant/manifest.json: the quantized checkpoint
 * (FP8 and the others widened to bf16 at load, 4-bit kept) on CUDA, in one
 * prefill (4-bit weights through cuBLAS on a bf16 copy), in decode steps
 * (the 4-bit GEMV) and in chunks of 6, against its reference model (the
 * same weights dequantized, f32) on CUDA and on the CPU: |delta| <=
 * TOL_LOGIT x the range of the reference's logits at every position, and
 * top-1 wherever the reference's margin exceeds that, and the dense
 * reference model on CUDA against the CPU the same way. MoE pairs against
 * their reference on CUDA instead: in the MoE fixtures a near-tie of the
 * router flips under bf16 activations (moe-gptq-int4-g32-asym-act's
 * reference model itself moves 10% of the range on CUDA), which
 * check_model covers for the MoE fixture of transformers.
 */
static void check_quant_pairs(void) {
    char err[1024] = "";
    char *txt = kiln_read_file(FIXTURES "/quant/manifest.json", NULL, err, sizeof err);
    CHECK(txt != NULL, "quant manifest: %s", err);
    if (!txt) return;
    cJSON *m = cJSON_Parse(txt), *pr;
    free(txt);
    cJSON_ArrayForEach(pr, cJSON_GetObjectItem(m, "pairs")) {
        const char *q = cJSON_GetArrayItem(pr, 0)->valuestring, *ref = cJSON_GetArrayItem(pr, 1)->valuestring;
        char pq[512], pref[512];
        snprintf(pq, sizeof pq, FIXTURES "/quant/%s", q);
        snprintf(pref, sizeof pref, FIXTURES "/quant/%s", ref);
        int V = 0, Vc = 0, Vg = 0;
        const int moe = strstr(q, "moe") != NULL;
        float *rc = prompt_logits(pref, "cpu", QNP, &Vc, err, sizeof err);
        CHECK(rc != NULL, "%s (cpu): %s", ref, err);
        float *rg = prompt_logits(pref, "cuda", QNP, &Vg, err, sizeof err);
        CHECK(rg != NULL && Vg == Vc, "%s (cuda): %s", ref, rg ? "vocab differs" : err);
        if (rc && rg && Vg == Vc && !moe) { /* the dense reference model itself (bf16 weights, no quantized code) */
            const float w = worst_share(rg, rc, Vc);
            CHECK(w <= TOL_LOGIT, "%s (a dense model) on cuda: max |delta| %.2f%% of the range against the cpu > %.0f%%", ref, 100 * w,
                  100 * TOL_LOGIT);
        }
        const int chunks[] = {QNP, 1, 6};
        for (int ci = 0; rc && rg && Vg == Vc && ci < 3; ci++) {
            float *g = prompt_logits(pq, "cuda", chunks[ci], &V, err, sizeof err);
            CHECK(g != NULL && V == Vc, "%s on cuda: %s", q, g ? "vocab differs" : err);
            if (!g || V != Vc) {
                free(g);
                continue;
            }
            const float wg = worst_share(g, rg, V), wc = worst_share(g, rc, V);
            if (moe)
                CHECK(wg <= TOL_LOGIT, "%s on cuda (chunks of %d): max |delta| %.2f%% of the range against the reference on cuda > %.0f%%",
                      q, chunks[ci], 100 * wg, 100 * TOL_LOGIT);
            int bad_top = -1;
            for (int t = 0; t < QNP; t++) {
                const float *a = g + (size_t)t * V, *b = rc + (size_t)t * V;
                if (margin(b, V) > TOL_LOGIT * row_range(b, V) && argmax(a, V) != argmax(b, V)) bad_top = t;
            }
            if (!moe) {
                CHECK(wc <= TOL_LOGIT, "%s on cuda (chunks of %d): max |delta| %.2f%% of the range against the reference on the cpu > %.0f%%",
                      q, chunks[ci], 100 * wc, 100 * TOL_LOGIT);
                CHECK(bad_top < 0, "%s on cuda (chunks of %d): top-1 differs at position %d where the reference margin is clear", q,
                      chunks[ci], bad_top);
            }
            if (verbose())
                fprintf(stderr, "  %-34s on cuda, chunks of %2d: max |delta| %.2f%% / %.2f%% of the range (reference on cuda / cpu)\n", q,
                        chunks[ci], 100 * wg, 100 * wc);
            free(g);
        }
        free(rc), free(rg);
    }
    cJSON_Delete(m);
}

/* ==== (c) the batches a server makes, engine against engine ==== */

/*
 * A dummy Qwen3 with head_dim 128 and a 32k context (tests/fixtures/dummy),
 * run on CUDA and on the CPU with the same tokens fed to both (teacher
 * forcing), logits compared row by row with the tolerance of (b): several
 * sequences in one forward with prefill chunks next to decode rows, decode
 * steps replayed from graphs while the lengths change, a forward that wants
 * no logits, and one sequence with 15,744 cached tokens and a few new ones.
 * Then the serving loop itself on CUDA: concurrent greedy requests against
 * the same requests alone.
 */
#define LONG_CFG FIXTURES "/dummy/qwen3-long-tiny.json"

static kiln_engine *open_dummy(const char *backend, int max_total, int chunk) {
    char err[512] = "";
    struct kiln_engine_opts o = {.dummy = LONG_CFG, .seed = 7, .backend = backend, .page_size = 16,
                                 .max_total_tokens = max_total, .prefill_chunk = chunk};
    kiln_engine *e = kiln_engine_open(&o, err, sizeof err);
    CHECK(e != NULL, "dummy engine on %s: %s", backend, err);
    return e;
}

static uint32_t tok_state = 12345;
static int32_t next_tok(void) {
    tok_state = tok_state * 1103515245u + 12345u;
    return 3 + (int32_t)((tok_state >> 8) % 4000);
}

/* rows of logits, CUDA against CPU; returns the worst |delta| / range */
static float compare_rows(const char *what, int step, const float *g, const float *c, int n_rows, int V) {
    float worst = 0;
    for (int r = 0; r < n_rows; r++) {
        const float *gr = g + (size_t)r * V, *cr = c + (size_t)r * V;
        const float d = row_delta(gr, cr, V), range = row_range(cr, V);
        CHECK(d <= TOL_LOGIT * range, "%s, step %d, row %d: max |delta| %g > %g%% of the range %g", what, step, r, d,
              100 * TOL_LOGIT, range);
        worst = fmaxf(worst, d / range);
    }
    return worst;
}

static void check_mixed_batches(void) {
    kiln_engine *eg = open_dummy("cuda", 4096, 512), *ec = open_dummy("cpu", 4096, 512);
    if (!eg || !ec) goto done;
    {
        const int V = kiln_engine_config(eg)->vocab, S = 4;
        char err[512] = "";
        kiln_seq *sg[4], *sc[4];
        for (int i = 0; i < S; i++) sg[i] = kiln_seq_new(eg, err, sizeof err), sc[i] = kiln_seq_new(ec, err, sizeof err);
        /* per step: tokens per sequence (0: the sequence sits this step out);
         * -1 in the first slot: no logits wanted */
        static const int plan[][5] = {
            {0, 37, 1, 5, 300},                                                 /* prefill, flash, 4 sequences */
            {0, 1, 1, 1, 1}, {0, 1, 1, 1, 1}, {0, 1, 1, 1, 1}, {0, 1, 1, 1, 1}, /* decode: eager, capture, replays */
            {0, 1, 20, 1, 3},                                                   /* decode rows next to a chunk */
            {0, 1, 1, 1, 1}, {0, 1, 1, 1, 1},                                   /* replays at new lengths */
            {-1, 2, 1, 1, 1},                                                   /* no logits */
            {0, 1, 0, 1, 0}, {0, 1, 0, 1, 0}, {0, 1, 0, 1, 0},                  /* two of the four */
            {0, 6, 1, 9, 1},                                                    /* small chunks: row kernel */
            {0, 1, 1, 1, 1}, {0, 1, 1, 1, 1},
        };
        float *lg = kiln_malloc(sizeof(float) * (size_t)S * V), *lc = kiln_malloc(sizeof(float) * (size_t)S * V);
        float worst = 0;
        for (size_t st = 0; st < sizeof plan / sizeof plan[0]; st++) {
            kiln_seq *qg[4], *qc[4];
            const int32_t *ids[4];
            int32_t buf[4][512];
            int n[4], m = 0;
            for (int i = 0; i < S; i++) {
                if (!plan[st][1 + i]) continue;
                n[m] = plan[st][1 + i];
                for (int j = 0; j < n[m]; j++) buf[m][j] = next_tok();
                ids[m] = buf[m], qg[m] = sg[i], qc[m] = sc[i], m++;
            }
            const int want = plan[st][0] >= 0;
            int rg = kiln_seqs_eval(qg, m, ids, n, want ? lg : NULL, err, sizeof err);
            CHECK(rg == 0, "mixed batches step %zu (cuda): %s", st, err);
            int rc = kiln_seqs_eval(qc, m, ids, n, want ? lc : NULL, err, sizeof err);
            CHECK(rc == 0, "mixed batches step %zu (cpu): %s", st, err);
            if (rg || rc) break;
            if (want) worst = fmaxf(worst, compare_rows("mixed batches", (int)st, lg, lc, m, V));
        }
        if (verbose()) fprintf(stderr, "  mixed batches: worst max |delta| %.2f%% of the logit range\n", 100 * worst);
        /* decode steps whose greedy token is the device's argmax (graphs with
         * the argmax kernel): it must be the CPU's argmax wherever the CPU's
         * top-1 margin exceeds the tolerance */
        int n_clear = 0;
        for (int st = 0; st < 4; st++) {
            const int32_t *ids[4];
            int32_t one[4], next[4] = {-1, -1, -1, -1};
            int n[4] = {1, 1, 1, 1};
            for (int i = 0; i < S; i++) one[i] = next_tok(), ids[i] = &one[i];
            CHECK(kiln_seqs_eval_argmax(sg, S, ids, n, next, err, sizeof err) == 0, "argmax step %d (cuda): %s", st, err);
            CHECK(kiln_seqs_eval(sc, S, ids, n, lc, err, sizeof err) == 0, "argmax step %d (cpu): %s", st, err);
            for (int i = 0; i < S; i++) {
                const float *cr = lc + (size_t)i * V;
                float lo = cr[0], hi = cr[0];
                for (int t = 0; t < V; t++) lo = fminf(lo, cr[t]), hi = fmaxf(hi, cr[t]);
                if (margin(cr, V) <= TOL_LOGIT * (hi - lo)) continue;
                n_clear++;
                CHECK(next[i] == argmax(cr, V), "argmax step %d, sequence %d: device %d, cpu %d", st, i, next[i], argmax(cr, V));
            }
        }
        if (verbose()) fprintf(stderr, "  device argmax: agrees with the CPU on all %d rows with a clear margin\n", n_clear);
        for (int i = 0; i < S; i++) kiln_seq_free(sg[i]), kiln_seq_free(sc[i]);
        free(lg), free(lc);
    }
done:
    kiln_engine_close(eg);
    kiln_engine_close(ec);
}

static void check_long_prefix(void) {
    kiln_engine *eg = open_dummy("cuda", 20000, 2048), *ec = open_dummy("cpu", 20000, 2048);
    if (!eg || !ec) goto done;
    {
        const int V = kiln_engine_config(eg)->vocab, N = 15744;
        char err[512] = "";
        int32_t *ids = kiln_malloc(sizeof(int32_t) * (N + 64));
        for (int i = 0; i < N + 64; i++) ids[i] = next_tok();
        float *lg = kiln_malloc(sizeof(float) * 8 * V), *lc = kiln_malloc(sizeof(float) * 8 * V);
        kiln_seq *g = kiln_seq_new(eg, err, sizeof err), *c = kiln_seq_new(ec, err, sizeof err);
        int rc = kiln_seq_eval(g, ids, N, NULL, 0, err, sizeof err);
        CHECK(rc == 0, "long prefix (cuda): %s", err);
        rc |= kiln_seq_eval(c, ids, N, NULL, 0, err, sizeof err);
        CHECK(rc == 0, "long prefix (cpu): %s", err);
        float worst = 0;
        if (rc == 0) {
            /* 6 new tokens after 15,744 cached: the repro of the server's abort */
            CHECK(kiln_seq_eval(g, ids + N, 6, lg, 1, err, sizeof err) == 0, "6 after 15744 (cuda): %s", err);
            CHECK(kiln_seq_eval(c, ids + N, 6, lc, 1, err, sizeof err) == 0, "6 after 15744 (cpu): %s", err);
            worst = compare_rows("6 new tokens after 15744 cached", 0, lg, lc, 6, V);
            /* decode next to a short sequence (64 splits for both) */
            kiln_seq *sg = kiln_seq_new(eg, err, sizeof err), *sc = kiln_seq_new(ec, err, sizeof err);
            for (int st = 0; st < 4; st++) {
                kiln_seq *qg[2] = {g, sg}, *qc[2] = {c, sc};
                const int32_t *pi[2] = {ids + N + 6 + st, ids + N + 20 + 8 * st};
                int n[2] = {1, st == 0 ? 8 : 1};
                CHECK(kiln_seqs_eval(qg, 2, pi, n, lg, err, sizeof err) == 0, "long + short (cuda): %s", err);
                CHECK(kiln_seqs_eval(qc, 2, pi, n, lc, err, sizeof err) == 0, "long + short (cpu): %s", err);
                worst = fmaxf(worst, compare_rows("long + short decode", st, lg, lc, 2, V));
            }
            kiln_seq_free(sg), kiln_seq_free(sc);
        }
        if (verbose()) fprintf(stderr, "  long prefix: worst max |delta| %.2f%% of the logit range\n", 100 * worst);
        kiln_seq_free(g), kiln_seq_free(c);
        free(ids), free(lg), free(lc);
    }
done:
    kiln_engine_close(eg);
    kiln_engine_close(ec);
}

static int collect_into(int32_t id, void *ctx) {
    int32_t **p = ctx;
    *(*p)++ = id;
    return 0;
}

/*
 * (d) the persistent decode step kernel (step.cu, opt-in: KILN_CUDA_STEPK=1)
 * against the op-by-op path it replaces (CUDA graphs of the kernels above),
 * on the same tokens: a 37-token prompt, then 40 one-token steps through
 * two sequences per engine, one reading logits (compared row by row with
 * the tolerance of (b)) and one asking for the argmax only (the ids must
 * match wherever the logits' top-1/top-2 margin exceeds that tolerance).
 * Shapes: the tiny dummy above (head_dim 128, 31 lm_head rows per block)
 * and a dummy Qwen3-0.6B (lm_head of 151,936 rows, argmax across blocks).
 * The step counter checks that the kernel really ran.
 */
long kiln_cuda_step_count(void) __attribute__((weak));

static void check_step_kernel(const char *dummy) {
    char err[512] = "";
    struct kiln_engine_opts o = {.dummy = dummy, .seed = 11, .backend = "cuda", .page_size = 16, .max_total_tokens = 1024};
    char *saved = getenv("KILN_CUDA_STEPK") ? strdup(getenv("KILN_CUDA_STEPK")) : NULL;
    setenv("KILN_CUDA_STEPK", "0", 1);
    kiln_engine *e0 = kiln_engine_open(&o, err, sizeof err);
    CHECK(e0 != NULL, "%s (graphs): %s", dummy, err);
    setenv("KILN_CUDA_STEPK", "1", 1);
    kiln_engine *e1 = e0 ? kiln_engine_open(&o, err, sizeof err) : NULL;
    CHECK(e1 != NULL, "%s (step kernel): %s", dummy, err);
    if (saved) setenv("KILN_CUDA_STEPK", saved, 1), free(saved);
    else unsetenv("KILN_CUDA_STEPK");
    if (!e0 || !e1 || !kiln_cuda_step_count) goto done;
    {
        const int V = kiln_engine_config(e0)->vocab, NP = 37, NS = 40;
        kiln_seq *a0 = kiln_seq_new(e0, err, sizeof err), *b0 = kiln_seq_new(e0, err, sizeof err);
        kiln_seq *a1 = kiln_seq_new(e1, err, sizeof err), *b1 = kiln_seq_new(e1, err, sizeof err);
        int32_t prompt[NP];
        for (int i = 0; i < NP; i++) prompt[i] = next_tok() % V;
        int rc = 0;
        kiln_seq *all[4] = {a0, b0, a1, b1};
        for (int i = 0; i < 4; i++) rc |= kiln_seq_eval(all[i], prompt, NP, NULL, 0, err, sizeof err);
        CHECK(rc == 0, "%s prompt: %s", dummy, err);
        float *l0 = kiln_malloc(sizeof(float) * (size_t)V), *l1 = kiln_malloc(sizeof(float) * (size_t)V);
        float worst = 0;
        int id_bad = -1, n_ids = 0;
        const long runs0 = kiln_cuda_step_count();
        for (int t = 0; t < NS && rc == 0; t++) {
            const int32_t tok = next_tok() % V;
            const int32_t *ids[1] = {&tok};
            const int one = 1;
            int32_t n0 = -1, n1 = -1;
            rc |= kiln_seq_eval(a0, &tok, 1, l0, 0, err, sizeof err);
            rc |= kiln_seq_eval(a1, &tok, 1, l1, 0, err, sizeof err);
            rc |= kiln_seqs_eval_argmax(&b0, 1, ids, &one, &n0, err, sizeof err);
            rc |= kiln_seqs_eval_argmax(&b1, 1, ids, &one, &n1, err, sizeof err);
            CHECK(rc == 0, "%s step %d: %s", dummy, t, err);
            worst = fmaxf(worst, compare_rows("step kernel vs graphs", t, l1, l0, 1, V));
            float lo = l0[0], hi = l0[0];
            for (int i = 0; i < V; i++) lo = fminf(lo, l0[i]), hi = fmaxf(hi, l0[i]);
            CHECK(n0 == argmax(l0, V), "%s step %d: the graph path's device argmax %d is not the argmax %d of its logits", dummy, t,
                  n0, argmax(l0, V));
            if (margin(l0, V) > TOL_LOGIT * (hi - lo)) {
                n_ids++;
                if (n1 != n0) id_bad = t;
            }
        }
        const long runs = kiln_cuda_step_count() - runs0;
        CHECK(id_bad < 0, "%s: the step kernel's argmax differs at step %d although the margin is clear", dummy, id_bad);
        /* per shape (logits or ids) and attention split count, the first step
         * is recorded on the op path; the rest run k_step */
        CHECK(runs >= 2 * NS - 8, "%s: the step kernel ran %ld of %d steps", dummy, runs, 2 * NS);
        if (verbose())
            fprintf(stderr, "  step kernel %-12s: %ld of %d steps, worst |delta| %.2f%% of the range, %d clear argmaxes equal\n",
                    dummy, runs, 2 * NS, 100 * worst, n_ids);
        for (int i = 0; i < 4; i++) kiln_seq_free(all[i]);
        free(l0), free(l1);
    }
done:
    kiln_engine_close(e0);
    kiln_engine_close(e1);
}

/* n greedy requests at once through kiln_serving on CUDA against each alone
 * on the same engine. Batch shapes change the kernels' summation order, so
 * a request may leave its solo run at a near-tie: wherever they differ, the
 * CPU's logits on the solo run's prefix must show a margin within the
 * tolerance there, else the batch computed something else. */
static void check_serving(void) {
    enum { N = 24, GEN = 16, MAXP = 400 };
    kiln_engine *eg = open_dummy("cuda", 8192, 64), *ec = open_dummy("cpu", 8192, 64);
    if (!eg || !ec) goto done;
    {
        char err[512] = "";
        const int V = kiln_engine_config(eg)->vocab;
        struct kiln_sampling sp = sampling_default();
        sp.temperature = 0;
        static int32_t prompts[N][MAXP], want[N][GEN], got[N][GEN];
        int len[N], n_got[N] = {0};
        for (int i = 0; i < N; i++) {
            len[i] = 5 + (i * 97) % 380;
            for (int j = 0; j < len[i]; j++) prompts[i][j] = j < 48 && i % 2 ? 100 + j : next_tok(); /* odd ones share 48 */
            int32_t *w = want[i];
            int n = kiln_generate(eg, prompts[i], len[i], GEN, &sp, 1, collect_into, &w, err, sizeof err);
            CHECK(n == GEN, "serving: solo run %d: %s", i, err);
        }
        struct kiln_serving_opts so = {.max_running = 64, .chunk = 64};
        kiln_serving *s = kiln_serving_start(eg, &so, err, sizeof err);
        CHECK(s != NULL, "serving on cuda: %s", err);
        if (!s) goto done;
        kiln_channel *ch = kiln_channel_new();
        kiln_request *rq[N];
        for (int i = 0; i < N; i++) {
            struct kiln_request_params p = {.prompt = prompts[i], .n_prompt = len[i], .max_tokens = GEN, .ignore_eos = 1,
                                            .logprobs = -1, .sampling = sp};
            CHECK(kiln_serving_submit(s, &p, ch, i, &rq[i], err, sizeof err) == 0, "%s", err);
        }
        int finished = 0;
        struct kiln_event ev;
        while (finished < N && kiln_channel_next(ch, &ev, 120.0)) {
            if (ev.type == KILN_EVENT_TOKEN && n_got[ev.tag] < GEN) got[ev.tag][n_got[ev.tag]++] = ev.id;
            if (ev.type == KILN_EVENT_FINISH) {
                finished++;
                CHECK(ev.finish == KILN_FINISH_LENGTH, "serving on cuda: request %d finished with %d (%s)", ev.tag, ev.finish,
                      ev.err);
            }
        }
        CHECK(finished == N, "serving on cuda: %d of %d requests finished", finished, N);
        int same = 0;
        float *one = kiln_malloc(sizeof(float) * (size_t)V);
        int32_t *pre = kiln_malloc(sizeof(int32_t) * (MAXP + GEN));
        for (int i = 0; i < N; i++) {
            int k = 0;
            while (k < n_got[i] && got[i][k] == want[i][k]) k++;
            if (k == GEN) {
                same++;
                continue;
            }
            if (k >= n_got[i]) continue; /* reported above */
            memcpy(pre, prompts[i], sizeof(int32_t) * (size_t)len[i]);
            memcpy(pre + len[i], want[i], sizeof(int32_t) * (size_t)k);
            kiln_seq *q = kiln_seq_new(ec, err, sizeof err);
            int rc = kiln_seq_eval(q, pre, len[i] + k, one, 0, err, sizeof err);
            kiln_seq_free(q);
            float lo = one[0], hi = one[0];
            for (int t = 0; t < V; t++) lo = fminf(lo, one[t]), hi = fmaxf(hi, one[t]);
            float m = margin(one, V);
            CHECK(rc == 0 && m <= TOL_LOGIT * (hi - lo),
                  "serving on cuda: request %d differs from its solo run at step %d (%d vs %d) where the margin %g exceeds %g", i,
                  k, got[i][k], want[i][k], m, TOL_LOGIT * (hi - lo));
        }
        if (verbose()) fprintf(stderr, "  serving on cuda: %d of %d concurrent greedy outputs equal their solo runs\n", same, N);
        struct kiln_serving_stats st;
        kiln_serving_stats(s, &st);
        CHECK(st.running == 0 && st.waiting == 0 && st.kv_pages_free + st.kv_pages_evictable == st.kv_pages_total,
              "serving on cuda: every page free or evictable at the end");
        for (int i = 0; i < N; i++) kiln_request_release(rq[i]);
        kiln_channel_release(ch);
        kiln_serving_free(s);
        free(one), free(pre);
    }
done:
    kiln_engine_close(eg);
    kiln_engine_close(ec);
}

/* ==== (c) shapes the kernels do not take: refused at load ==== */

/* writes a small Qwen3 config (head_dim hd; MoE with k of e experts when
 * e > 0) to a temporary file; its path in path */
static void write_cfg(char *path, size_t n, int hd, int e, int k, int moe_ffn) {
    snprintf(path, n, "/tmp/kiln-test-cfg-%d-%d.json", (int)getpid(), hd * 1000 + e * 10 + k);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fprintf(f,
            "{\"architectures\": [\"%s\"], \"hidden_size\": 256, \"intermediate_size\": 512, \"head_dim\": %d,\n"
            " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"vocab_size\": 512,\n"
            " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000, \"tie_word_embeddings\": true",
            e ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM", hd);
    if (e) fprintf(f, ",\n \"num_experts\": %d, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d", e, k, moe_ffn);
    fprintf(f, "}\n");
    fclose(f);
}

/* load: 0 when it loaded, else -1 with the message in err */
static int load_cfg(const char *path, const char *backend, char *err, size_t errlen) {
    struct kiln_engine_opts o = {.dummy = path, .seed = 3, .backend = backend, .max_total_tokens = 256};
    kiln_engine *e = kiln_engine_open(&o, err, errlen);
    kiln_engine_close(e);
    return e ? 0 : -1;
}

static void check_load_refusals(void) {
    static const struct {
        int hd, e, k, ffn;
        const char *says; /* in the CUDA backend's message */
    } cases[] = {
        {96, 0, 0, 0, "head_dim 16, 32, 64, 128 or 256, not 96"},
        {48, 0, 0, 0, "not 48"},
        {64, 64, 40, 64, "at most 32 experts per token"},
        {64, 1025, 8, 64, "at most 1024 experts"},
        {64, 8, 2, 36, "divisible by 8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[128], err[512];
        write_cfg(path, sizeof path, cases[i].hd, cases[i].e, cases[i].k, cases[i].ffn);
        const int rg = load_cfg(path, "cuda", err, sizeof err);
        CHECK(rg == -1 && strstr(err, cases[i].says) && strstr(err, "--backend cpu"),
              "cuda refuses %s at load: rc %d, \"%s\"", path, rg, rg ? err : "");
        /* the CPU backend runs any shape the config parser accepts */
        const int rc = load_cfg(path, "cpu", err, sizeof err);
        CHECK(rc == 0, "cpu loads %s: %s", path, err);
        remove(path);
    }
    /* a KV cache the CUDA attention does not read: refused at open, not at
     * the first forward */
    static const char *const kvs[] = {"f16", "f32", "q8_0"};
    for (int i = 0; i < 3; i++) {
        char err[512] = "";
        struct kiln_engine_opts o = {.dummy = LONG_CFG, .seed = 7, .backend = "cuda", .max_total_tokens = 256, .kv_dtype = kvs[i]};
        kiln_engine *e = kiln_engine_open(&o, err, sizeof err);
        CHECK(!e && strstr(err, "--kv-dtype") && strstr(err, "BF16"), "cuda with --kv-dtype %s: %s", kvs[i], e ? "opened" : err);
        if (e) kiln_engine_close(e);
    }
    char err[512] = "";
    struct kiln_engine_opts o = {.dummy = LONG_CFG, .seed = 7, .backend = "cuda", .max_total_tokens = 256, .kv_dtype = "bf16"};
    kiln_engine *e = kiln_engine_open(&o, err, sizeof err);
    CHECK(e != NULL, "cuda with --kv-dtype bf16: %s", err);
    if (e) kiln_engine_close(e);
}

/* A CUDA call that fails inside a forward (kiln_cuda_inject_fault(1): the
 * next launch asks for 4,096 threads per block, which CUDA refuses as an
 * invalid argument without losing the context) fails that batch with the call's error, the sequence
 * keeps its length, and the same tokens then give what a sequence that never
 * failed gets. Once in a decode step, once in a prefill. */
void kiln_cuda_inject_fault(int kind) __attribute__((weak));

static int32_t fail_ids[6] = {11, 205, 3071, 42, 977, 1500};

static void check_failed_launch(void) {
    if (!kiln_cuda_inject_fault) return;
    kiln_engine *e = open_dummy("cuda", 512, 0);
    if (!e) return;
    char err[1024] = "";
    const int V = kiln_engine_config(e)->vocab;
    float *la = kiln_malloc(sizeof(float) * (size_t)V), *lb = kiln_malloc(sizeof(float) * (size_t)V);
    kiln_seq *a = kiln_seq_new(e, err, sizeof err), *b = kiln_seq_new(e, err, sizeof err);
    CHECK(a && b, "%s", err);
    if (!a || !b) goto done;
    /* prefill: fails whole, then goes in */
    kiln_cuda_inject_fault(1);
    int rc = kiln_seq_eval(a, fail_ids, 5, la, 0, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "CUDA error") && strstr(err, "in a launch") && strstr(err, "nothing else changed") && kiln_seq_len(a) == 0,
          "a prefill whose launch fails: rc %d, length %d, \"%s\"", rc, kiln_seq_len(a), rc ? err : "");
    CHECK(kiln_seq_eval(a, fail_ids, 5, la, 0, err, sizeof err) == 0 && kiln_seq_len(a) == 5, "the prefill again: %s", err);
    /* a decode step: fails, then the same token goes in */
    kiln_cuda_inject_fault(1);
    rc = kiln_seq_eval(a, fail_ids + 5, 1, la, 0, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "CUDA error") && strstr(err, "in a launch") && kiln_seq_len(a) == 5,
          "a decode step whose launch fails: rc %d, length %d, \"%s\"", rc, kiln_seq_len(a), rc ? err : "");
    CHECK(kiln_seq_eval(a, fail_ids + 5, 1, la, 0, err, sizeof err) == 0, "the step again: %s", err);
    CHECK(kiln_seq_eval(b, fail_ids, 5, lb, 0, err, sizeof err) == 0 && kiln_seq_eval(b, fail_ids + 5, 1, lb, 0, err, sizeof err) == 0,
          "a sequence that never failed: %s", err);
    float lo = lb[0], hi = lb[0], d = 0;
    for (int i = 0; i < V; i++) lo = fminf(lo, lb[i]), hi = fmaxf(hi, lb[i]), d = fmaxf(d, fabsf(la[i] - lb[i]));
    CHECK(d <= 1e-3f * (hi - lo) && kiln_argmax(la, V) == kiln_argmax(lb, V),
          "after a failed step: max |delta| %g against a sequence that never failed (range %g), argmax %d / %d", d, hi - lo,
          kiln_argmax(la, V), kiln_argmax(lb, V));
done:
    kiln_seq_free(a), kiln_seq_free(b);
    kiln_engine_close(e);
    free(la), free(lb);
}

/* The group `cuda_lost`, which check_lost_context runs in a process of its
 * own: a kernel that traps (kiln_cuda_inject_fault(2)) loses the GPU
 * context. The batch fails with an error that says so, every later batch
 * fails the same way instead of aborting, and the engine still closes. */
void test_cuda_lost(void) {
    if (!kiln_cuda_inject_fault) {
        test_skip("a build without CUDA");
        return;
    }
    kiln_engine *e = open_dummy("cuda", 512, 0);
    if (!e) return;
    char err[1024] = "";
    const int V = kiln_engine_config(e)->vocab;
    float *l = kiln_malloc(sizeof(float) * (size_t)V);
    kiln_seq *a = kiln_seq_new(e, err, sizeof err);
    CHECK(a && kiln_seq_eval(a, fail_ids, 5, l, 0, err, sizeof err) == 0, "before the fault: %s", err);
    if (!a) {
        kiln_engine_close(e), free(l);
        return;
    }
    kiln_cuda_inject_fault(2);
    int rc = kiln_seq_eval(a, fail_ids + 5, 1, l, 0, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "CUDA error") && strstr(err, "context is lost") && kiln_seq_len(a) == 5,
          "the step with the trap: rc %d, length %d, \"%s\"", rc, kiln_seq_len(a), rc ? err : "");
    for (int k = 0; k < 2; k++) {
        rc = kiln_seq_eval(a, fail_ids + 5, 1, l, 0, err, sizeof err);
        CHECK(rc == -1 && strstr(err, "CUDA error"), "a later step: rc %d, \"%s\"", rc, rc ? err : "");
    }
    kiln_seq *b = kiln_seq_new(e, err, sizeof err);
    rc = b ? kiln_seq_eval(b, fail_ids, 5, l, 0, err, sizeof err) : -1;
    CHECK(rc == -1, "a later prefill: rc %d", rc);
    kiln_seq_free(a), kiln_seq_free(b);
    kiln_engine_close(e);
    free(l);
}

/* runs `test-kiln cuda_lost` (this executable) and checks it ended on its
 * own with status 0: no abort, every check passed */
static void check_lost_context(void) {
    if (!kiln_cuda_inject_fault) return;
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    CHECK(n > 0, "readlink /proc/self/exe");
    if (n <= 0) return;
    exe[n] = 0;
    char *argv[] = {exe, (char *)"cuda_lost", NULL};
    extern char **environ;
    pid_t pid;
    int st = 0;
    const int rc = posix_spawn(&pid, exe, NULL, NULL, argv, environ);
    CHECK(rc == 0 && waitpid(pid, &st, 0) == pid, "spawning %s cuda_lost: %d", exe, rc);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "test-kiln cuda_lost: %s %d", WIFEXITED(st) ? "exit status" : "killed by signal",
          WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

/* KILN_TEST_CUDA_ONLY=a,b,...: only the parts whose names hold one of
 * the comma-separated words (e.g. "moe,quant_pairs" to check an MoE change
 * in a short GPU lease); unset: every part */
static int part_on(const char *name) {
    const char *only = getenv("KILN_TEST_CUDA_ONLY");
    if (!only || !*only) return 1;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", only);
    for (char *save = NULL, *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save))
        if (*w && strstr(name, w)) return 1;
    return 0;
}

#define PART(call)                                  \
    do {                                            \
        if (part_on(#call)) call;                   \
    } while (0)

void test_cuda(void) {
    char err[256];
    struct pair p = {NULL, NULL};
    p.gpu = backend_create("cuda", 0, err, sizeof err);
    if (!p.gpu) {
        test_skip(err);
        return;
    }
    p.cpu = backend_create("cpu", 0, err, sizeof err);
    if (getenv("KILN_TEST_CUDA_ONLY") && *getenv("KILN_TEST_CUDA_ONLY"))
        fprintf(stderr, "test_cuda: only the parts matching KILN_TEST_CUDA_ONLY=%s (not a full run)\n", getenv("KILN_TEST_CUDA_ONLY"));
    PART(test_matmul(&p));
    PART(test_matmul_quant(&p));
    PART(test_norms(&p));
    PART(test_rope(&p));
    PART(test_qkv_merge(&p));
    PART(test_attention(&p));
    PART(test_att_dec(&p));
    PART(test_fused_attention(&p));
    PART(test_misc(&p));
    PART(test_decode_fused(&p));
    PART(test_moe(&p));
    PART(test_moe_chunks(&p));
    PART(test_moe_paths(&p));
    PART(test_moe_w4(&p));
    PART(test_moe_reuse(&p));
    PART(test_scratch_oom(&p));
    PART(test_read_row(&p));
    PART(test_argmax(&p));
    PART(test_pinned_oom());
    p.cpu->destroy(p.cpu);
    p.gpu->destroy(p.gpu);
    PART(check_load_refusals());
    const char *models[] = {"qwen3-dense-tiny", "qwen3-dense-small", "qwen3-moe-tiny", "qwen2-tiny", "llama-tiny", "qwen3-fp8-tiny"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "check_model %s", models[i]);
        if (part_on(name)) check_model(models[i]);
    }
    PART(check_quant_pairs());
    PART(check_mixed_batches());
    PART(check_long_prefix());
    PART(check_serving());
    PART(check_step_kernel(LONG_CFG));
    PART(check_step_kernel("qwen3-0.6b"));
    PART(check_failed_launch());
    PART(check_lost_context());
}
