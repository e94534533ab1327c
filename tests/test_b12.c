/*
 * test_b12.c: BF16 weights stored in 12 bits (src/backend/cpu/b12.c).
 *
 * The format is lossless and the kernels keep the BF16 kernels' order of
 * sums, so everything here is exact:
 *   - every one of the 65,536 bf16 bit patterns decodes to itself, in
 *     blocks that fit 8 codes and in blocks that escape;
 *   - the escapes are what the format says (a block escapes iff its
 *     exponents span more than 8 values) and normal weights rarely do;
 *   - on every instruction set the CPU has, the matmul of a linear stored
 *     in 12 bits gives the same bits as the same linear kept as BF16, at
 *     1-7 activation rows (the decode GEMV, under every row order,
 *     prefetch and rows-per-pass setting) and at 8+ (the GEMM), with and
 *     without a bias, on blocks of every kind: normal weights at several
 *     scales, zeros, signed zeros, subnormals, wide blocks that escape;
 *   - a backend told to keep the stored weights (kiln quantize) makes no
 *     12-bit copy, nor does a matrix whose blocks mostly escape;
 *   - F16 linears whose weights are all bf16 values take the 12-bit store
 *     with the F16 kernels' bits, and no other F16 linear does.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/base.h"
#include "kiln.h"
#include "test.h"

/* w (n_out x n_in BF16, or F16 with linf), prepared: in 12 bits (b12) or
 * not */
static struct qlinear linf(struct kiln_backend *be, enum kiln_dtype dt, uint16_t *w, int n_out, int n_in, float *bias, int b12) {
    char err[256];
    struct qlinear q = {.n_out = n_out, .n_in = n_in, .fmt = KILN_WFMT_DENSE, .w = {dt, n_out, n_in, w, NULL}};
    if (bias) q.bias = (struct ktensor){KILN_DTYPE_F32, 1, n_out, bias, NULL};
    if (!b12) setenv("KILN_CPU_B12", "0", 1);
    CHECK(be->prepare_linear(be, &q, err, sizeof err) == 0, "%s", err);
    unsetenv("KILN_CPU_B12");
    return q;
}
static struct qlinear lin(struct kiln_backend *be, uint16_t *w, int n_out, int n_in, float *bias, int b12) {
    return linf(be, KILN_DTYPE_BF16, w, n_out, n_in, bias, b12);
}

/* every bf16 pattern, in 12 bits and back: once in order (a block of 64
 * has one high byte: none escapes) and once shuffled (nearly every block
 * escapes) */
static void check_roundtrip(struct kiln_backend *be, struct kiln_rng *r) {
    enum { N = 65536, K = 256 };
    uint16_t *w = kiln_malloc(sizeof(uint16_t) * N), *back = kiln_malloc(sizeof(uint16_t) * K);
    for (int sh = 0; sh < 2; sh++) {
        for (int i = 0; i < N; i++) w[i] = (uint16_t)i;
        for (int i = N - 1; sh && i > 0; i--) {
            const int k = (int)(kiln_rng_uniform(r) * (i + 1));
            const uint16_t t = w[i];
            w[i] = w[k], w[k] = t;
        }
        struct cpu_b12 *b = cpu_b12_pack(be, w, N / K, K);
        CHECK(b != NULL);
        if (!b) break;
        int bad = 0;
        int64_t esc = 0;
        for (int row = 0; row < N / K; row++) {
            cpu_b12_decode(b->data + (size_t)row * b->rb, K, 0, K, back);
            bad += memcmp(back, w + (size_t)row * K, sizeof(uint16_t) * K) != 0;
            for (int c = 0; c < K / B12_K; c++) { /* the format's rule: escape iff the exponents span > 8 values */
                int mn = 0x7F, mx = 0;
                for (int p = 0; p < B12_K; p++) {
                    const int h = (w[(size_t)row * K + c * B12_K + p] >> 8) & 0x7F;
                    mn = h < mn ? h : mn, mx = h > mx ? h : mx;
                }
                const int escaped = b->data[(size_t)row * b->rb + c] == 0xFF;
                CHECK(escaped == (mx - mn > 7), "b12 row %d block %d: escaped %d, exponent span %d", row, c, escaped, mx - mn);
                esc += escaped;
            }
        }
        CHECK(bad == 0, "b12 %s bf16 patterns: %d rows do not decode to themselves", sh ? "shuffled" : "ordered", bad);
        CHECK(esc == b->n_esc, "b12: %lld blocks marked, %lld counted", (long long)esc, (long long)b->n_esc);
        if (!sh) CHECK(b->n_esc == 0, "b12 ordered patterns: %lld escapes", (long long)b->n_esc);
        else CHECK(b->n_esc >= N / B12_K * 9 / 10, "b12 shuffled patterns: only %lld escapes", (long long)b->n_esc);
        CHECK(cpu_b12_bytes(b) == b->rb * (size_t)(N / K) + (size_t)b->n_esc * B12_K * 2);
        cpu_b12_free(b);
    }
    free(w), free(back);
}

/* row r, block c of the test matrix: the kinds of block a checkpoint can hold */
static void fill_block(uint16_t *v, int kind, struct kiln_rng *r) {
    static const float scale[] = {1e-3f, 0.02f, 1.0f, 30.0f};
    for (int p = 0; p < B12_K; p++) {
        float f = kiln_rng_normal(r);
        switch (kind) {
        case 0: case 1: case 2: case 3: f *= scale[kind]; break;
        case 4: f = 0; break;                                        /* all zero: fits (base 0) */
        case 5: f = p % 3 ? 0.02f * f : (p & 1 ? -0.0f : 0.0f); break; /* zeros among weights: escapes */
        case 6: f *= p & 1 ? 1e-38f : 3e-39f; break;                   /* subnormals and tiny normals */
        default: f *= ldexpf(1.0f, (int)(kiln_rng_uniform(r) * 60) - 30); /* 2^60 wide: escapes */
        }
        v[p] = kiln_f32_to_bf16(f);
    }
}

static void check_matmul_b12(struct kiln_backend *be, struct kiln_rng *r, const char *isa, int n_out, int n_in, int with_bias) {
    uint16_t *w = kiln_malloc(sizeof(uint16_t) * (size_t)n_out * n_in);
    for (int o = 0; o < n_out; o++)
        for (int c = 0; c < n_in / B12_K; c++) { /* kinds 0-7 in turn among normal blocks: 1 in 24 escapes */
            const int k = (o * 7 + c * 3) % 48;
            fill_block(w + (size_t)o * n_in + c * B12_K, k < 8 ? k : k % 4, r);
        }
    float *bias = kiln_malloc(sizeof(float) * (size_t)n_out);
    for (int i = 0; i < n_out; i++) bias[i] = kiln_rng_normal(r);
    struct qlinear q16 = lin(be, w, n_out, n_in, with_bias ? bias : NULL, 0), q12 = lin(be, w, n_out, n_in, with_bias ? bias : NULL, 1);
    CHECK(q16.be == NULL && !q16.repacked, "KILN_CPU_B12=0 still stored a 12-bit copy");
#if defined(KILN_X86) || defined(KILN_NEON)
    CHECK(q12.be != NULL && q12.repacked, "a BF16 %dx%d linear is not stored in 12 bits on x86 or AArch64", n_out, n_in);
#endif
    static const int ns[] = {1, 2, 3, 4, 5, 7, 8, 13};
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        const int n = ns[ni];
        const size_t ny = (size_t)n * n_out;
        float *x = kiln_malloc(sizeof(float) * (size_t)n * n_in), *y16 = kiln_malloc(sizeof(float) * ny), *y12 = kiln_malloc(sizeof(float) * ny);
        for (int i = 0; i < n * n_in; i++) x[i] = kiln_rng_normal(r);
        memset(y16, 0xff, sizeof(float) * ny);
        be->matmul(be, y16, x, &q16, n);
        const int st = cpu_gemv_streams(), pf = cpu_gemv_pfd(), pb = cpu_gemv_pfd_batch(), rk = cpu_gemv_rows(), p12 = cpu_b12_pfd();
        for (int s2 = 1; s2 <= (n < 8 ? 2 : 1); s2++)
            for (int d = 0; d <= (n < 8 ? 1024 : 0); d += 1024)
                for (int k = 0; k <= (n < 8 ? 512 : 0); k += k ? 511 : 1) {
                    if (n < 8) cpu_set_gemv_streams(s2), cpu_set_gemv_pfd(d), cpu_set_gemv_pfd_batch(1024 - d), cpu_set_gemv_rows(k), cpu_set_b12_pfd(2048 - 2 * d);
                    memset(y12, 0xff, sizeof(float) * ny); /* NaN: every output must be written */
                    be->matmul(be, y12, x, &q12, n);
                    CHECK(!memcmp(y16, y12, sizeof(float) * ny), "%s b12 matmul %dx%d n=%d bias=%d (streams %d, prefetch %d, rows %d): not the BF16 bits",
                          isa, n_out, n_in, n, with_bias, s2, d, k);
                }
        cpu_set_gemv_streams(st), cpu_set_gemv_pfd(pf), cpu_set_gemv_pfd_batch(pb), cpu_set_gemv_rows(rk), cpu_set_b12_pfd(p12);
        free(x), free(y16), free(y12);
    }
    /* q/k/v-style: three linears sharing x as one job */
    {
        float *x = kiln_malloc(sizeof(float) * 3 * (size_t)n_in), *y = kiln_malloc(sizeof(float) * 9 * (size_t)n_out);
        for (int i = 0; i < 3 * n_in; i++) x[i] = kiln_rng_normal(r);
        const struct qlinear *ws12[3] = {&q12, &q12, &q12};
        void *o12[3] = {y, y + 3 * n_out, y + 6 * n_out};
        float *y16 = kiln_malloc(sizeof(float) * 3 * (size_t)n_out);
        cpu_matmul_multi(be, o12, x, ws12, 3, 3);
        cpu_matmul(be, y16, x, &q16, 3);
        for (int i = 0; i < 3; i++)
            CHECK(!memcmp(y + (size_t)3 * i * n_out, y16, sizeof(float) * 3 * (size_t)n_out), "%s b12 multi %dx%d: linear %d", isa, n_out, n_in, i);
        free(x), free(y), free(y16);
    }
    be->release_linear(be, &q16), be->release_linear(be, &q12);
    CHECK(q12.be == NULL);
    free(w), free(bias);
}

/* F16 as BF16 (b12.c): each of the 65,536 f16 patterns is taken iff it is
 * a bf16 value (its f32 has 16 zero low bits, NaN excluded), as those bits;
 * an F16 linear of bf16 values (normal weights at several scales, zeros,
 * f16 subnormals) is stored in 12 bits and matmuls to the F16 kernels'
 * bits; one weight that is not a bf16 value keeps the linear F16 */
static void check_f16(struct kiln_backend *be, struct kiln_rng *r) {
    int wrong = 0, taken = 0;
    uint16_t row[B12_K];
    for (uint32_t h = 0; h < 65536; h++) {
        for (int p = 0; p < B12_K; p++) row[p] = (uint16_t)h;
        uint16_t *b = cpu_f16_as_bf16(be, row, 1, B12_K);
        const float f = kiln_f16_to_f32((uint16_t)h);
        uint32_t u;
        memcpy(&u, &f, 4);
        const int exact = !isnan(f) && (u & 0xFFFF) == 0;
        wrong += !b != !exact || (b && (b[0] != u >> 16 || b[B12_K - 1] != u >> 16));
        taken += b != NULL;
        free(b);
    }
    CHECK(wrong == 0, "f16 as bf16: %d of 65536 patterns taken or converted wrongly", wrong);
    /* 2 x 30 x 128 normals, 2 zeros, 2 infinities, 2 x 511 subnormals of at most 8 significant bits */
    CHECK(taken == 8706, "f16 as bf16: %d patterns taken, not 8,706", taken);
    static const int shapes[][2] = {{37, 320}, {66, 1024}};
    for (size_t si = 0; si < 2; si++) {
        const int n_out = shapes[si][0], n_in = shapes[si][1];
        uint16_t *w = kiln_malloc(sizeof(uint16_t) * (size_t)n_out * n_in);
        static const float scale[] = {0.02f, 1.0f, 0.0f, 0.02f, 3e-5f, 0.05f, 0.01f, 0.02f};
        for (int i = 0; i < n_out * n_in; i++) /* a bf16 value, in f16 (below 2^-14 rounded to f16's subnormal grid: 3e-5) */
            w[i] = kiln_f32_to_f16(kiln_bf16_to_f32(kiln_f32_to_bf16(scale[i / B12_K % 8] * kiln_rng_normal(r))));
        struct qlinear q16 = linf(be, KILN_DTYPE_F16, w, n_out, n_in, NULL, 0), q12 = linf(be, KILN_DTYPE_F16, w, n_out, n_in, NULL, 1);
#if defined(KILN_X86) || defined(KILN_NEON)
        CHECK(q12.be != NULL && q12.repacked, "an F16 %dx%d linear of bf16 values is not stored in 12 bits", n_out, n_in);
#endif
        static const int ns[] = {1, 3, 8, 13};
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int n = ns[ni];
            const size_t ny = (size_t)n * n_out;
            float *x = kiln_malloc(sizeof(float) * (size_t)n * n_in), *y16 = kiln_malloc(sizeof(float) * ny), *y12 = kiln_malloc(sizeof(float) * ny);
            for (int i = 0; i < n * n_in; i++) x[i] = kiln_rng_normal(r);
            be->matmul(be, y16, x, &q16, n);
            memset(y12, 0xff, sizeof(float) * ny);
            be->matmul(be, y12, x, &q12, n);
            CHECK(!memcmp(y16, y12, sizeof(float) * ny), "%s f16 in 12 bits %dx%d n=%d: not the F16 bits", cpu_isa_name(cpu_isa()), n_out, n_in, n);
            free(x), free(y16), free(y12);
        }
        be->release_linear(be, &q16), be->release_linear(be, &q12);
        w[n_out * n_in / 2] = 0x3C01; /* 1 + 2^-10: not a bf16 value */
        struct qlinear qx = linf(be, KILN_DTYPE_F16, w, n_out, n_in, NULL, 1);
        CHECK(qx.be == NULL && !qx.repacked, "an F16 linear with a weight that is not a bf16 value was stored in 12 bits");
        be->release_linear(be, &qx);
        free(w);
    }
}

void test_b12(void) {
    char err[256];
    struct kiln_backend *be = backend_create("cpu", 2, err, sizeof err);
    CHECK(be != NULL, "%s", err);
    if (!be) return;
    struct kiln_rng r;
    kiln_rng_seed(&r, 12);
    check_roundtrip(be, &r);
    {   /* normal weights: ~0.5% of blocks escape (a weight 2^16 below the block's largest); the size */
        enum { N = 512, K = 1024 };
        uint16_t *w = kiln_malloc(sizeof(uint16_t) * N * K);
        for (int i = 0; i < N * K; i++) w[i] = kiln_f32_to_bf16(0.02f * kiln_rng_normal(&r));
        struct cpu_b12 *b = cpu_b12_pack(be, w, N, K);
        CHECK(b != NULL);
        if (b) {
            const double frac = (double)b->n_esc / (N * K / B12_K), bits = 8.0 * (double)cpu_b12_bytes(b) / (N * K);
            CHECK(frac > 0.001 && frac < 0.02, "b12: %.4f of normal blocks escape", frac);
            CHECK(bits < 12.25, "b12: %.3f bits per weight", bits);
            fprintf(stderr, "  normal weights: %.2f%% of blocks escape, %.3f bits per weight\n", 100 * frac, bits);
        }
        cpu_b12_free(b);
        CHECK(cpu_b12_pack(be, w, N, K - 32) == NULL, "n_in not a multiple of 64 must be refused");
        /* weights whose blocks mostly escape stay BF16 (12-bit rows plus the escapes would read more) */
        for (int i = 0; i < N * K / B12_K; i++) fill_block(w + (size_t)i * B12_K, 7, &r);
        struct qlinear qw = lin(be, w, N, K, NULL, 1);
        CHECK(qw.be == NULL && !qw.repacked, "a matrix of escaping blocks was stored in 12 bits");
        be->release_linear(be, &qw);
        /* kiln quantize's backend keeps the stored weights */
        be->keep_stored = 1;
        struct qlinear q = lin(be, w, N, K, NULL, 1);
        CHECK(q.be == NULL && !q.repacked, "keep_stored: a 12-bit copy was made");
        be->release_linear(be, &q);
        be->keep_stored = 0;
        free(w);
    }
#if defined(KILN_X86) || defined(KILN_NEON)
    {   /* the parity fixtures' BF16 linears (K 64-384) run in 12 bits: their decode reads fewer bytes than stored */
        struct kiln_engine_opts o = {.model = FIXTURES "/qwen3-dense-tiny", .backend = "cpu", .max_total_tokens = 64};
        kiln_engine *e = kiln_engine_open(&o, err, sizeof err);
        CHECK(e != NULL, "%s", err);
        if (e) CHECK(kiln_engine_decode_bytes(e) < 0.85 * (double)kiln_engine_param_bytes(e), "%g of %lld bytes",
                     kiln_engine_decode_bytes(e), (long long)kiln_engine_param_bytes(e));
        kiln_engine_close(e);
    }
#endif
    const int saved = cpu_isa(), vbmi = cpu_b12_vbmi();
    for (int isa = CPU_ISA_SCALAR; isa <= CPU_ISA_LAST; isa++) {
        if (isa > cpu_isa_max()) {
            test_skip(cpu_isa_name(isa));
            continue;
        }
        CHECK(cpu_set_isa(isa) == isa);
        /* (n_out, n_in): one row of one block; a few blocks; 700 rows (runs per thread, stealing); rows long
         * enough to be read four at a time at batch 1 (K 6,144: 4 K + 1.5 K bytes > 32 KiB), n_out odd (a pass
         * of pairs leaves one) */
        static const int shapes[][2] = {{1, 64}, {37, 320}, {700, 128}, {45, 6144}, {66, 1024}};
        /* AVX-512 decodes the codes two ways: with VBMI (vpmultishiftqb + vpermb) where the CPU has it, and without */
        for (int vb = 0; vb <= (isa == CPU_ISA_AVX512); vb++) {
            if (cpu_set_b12_vbmi(vb) != vb) {
                test_skip("avx512vbmi");
                continue;
            }
            char name[32];
            snprintf(name, sizeof name, "%s%s", cpu_isa_name(isa), vb ? "+vbmi" : "");
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                check_matmul_b12(be, &r, name, shapes[si][0], shapes[si][1], (int)(si & 1));
            if (!vb) check_f16(be, &r);
        }
    }
    cpu_set_isa(saved);
    cpu_set_b12_vbmi(vbmi);
    be->destroy(be);
}
