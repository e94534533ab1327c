/*
 * gemv_bench.c: the CPU backend's decode GEMV (one activation row) against
 * the machine's read bandwidth, per matrix size: how close a format's kernel
 * streams to the roofline probe, and what small matrices cost it.
 *
 *   make gemv-bench && ./build/gemv-bench [format] [threads] [passes] [K] [MB]
 *
 * format: bf16 or a quantized one quant_dummy_linear makes (q4_0, q8_0,
 * gptq-int4, ...; default q4_0); threads default 2, passes 3, K 1024. For
 * N = 512, 2048, 8192 and 32768 output rows it makes as many distinct
 * N x K matrices as fill ~MB megabytes (default 256: a decode streams
 * distinct weights from DRAM, never the same matrix twice in a row; a few
 * MB that stay in the caches give the kernel's own rate instead, what it
 * does when the bytes are not the limit) and times two sweeps of
 * be->matmul over them. Each pass first measures the bandwidth with
 * bench_membw (the --roofline probe: 1, 2 and 4 streams per thread, the
 * kernels' load width) and prints every size's GB/s and share of it.
 * KILN_CPU_ISA picks the kernels as for kiln itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "base/base.h"
#include "bench/bench.h"
#include "format/quant.h"

/* the weights in 2 MiB pages, as the model holds them (base/walloc.c);
 * the matrices live until exit */
static void *alloc64(void *ctx, size_t n) {
    (void)ctx;
    return kiln_walloc(n);
}

/* w (n_out, n_in set): random weights of fmt; 0 or -1 with err */
static int make(struct qlinear *w, const char *fmt, uint64_t seed, char *err, size_t errlen) {
    if (strcmp(fmt, "bf16")) return quant_dummy_linear(w, fmt, 128, seed, 0.05f, alloc64, NULL, err, errlen);
    const size_t n = (size_t)w->n_out * w->n_in;
    uint16_t *d = alloc64(NULL, 2 * n);
    if (!d) return kiln_errf(err, errlen, "out of memory");
    struct kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) d[i] = kiln_f32_to_bf16(0.05f * kiln_rng_normal(&r));
    w->fmt = KILN_WFMT_DENSE;
    w->w = (struct ktensor){.dtype = KILN_DTYPE_BF16, .rows = w->n_out, .cols = w->n_in, .data = d};
    return 0;
}

int main(int argc, char **argv) {
    const char *fmt = argc > 1 ? argv[1] : "q4_0";
    const int nt = argc > 2 ? atoi(argv[2]) : 2, passes = argc > 3 ? atoi(argv[3]) : 3, K = argc > 4 ? atoi(argv[4]) : 1024;
    enum { NS = 4 };
    static const int Ns[NS] = {512, 2048, 8192, 32768};
    const double total = argc > 5 ? atof(argv[5]) * 1e6 : 256e6;
    char err[256];
    if (nt < 1 || passes < 1 || K < 128 || K % 128) {
        fprintf(stderr, "usage: gemv-bench [format] [threads >= 1] [passes >= 1] [K, a multiple of 128]\n");
        return 2;
    }
    struct kiln_backend *be = backend_create("cpu", nt, err, sizeof err);
    if (!be) {
        fprintf(stderr, "gemv-bench: %s\n", err);
        return 1;
    }
    struct qlinear *ws[NS];
    int cnt[NS];
    double bytes[NS];
    for (int s = 0; s < NS; s++) {
        struct qlinear t = {.n_out = Ns[s], .n_in = K};
        if (make(&t, fmt, 1, err, sizeof err)) {
            fprintf(stderr, "gemv-bench: %s: %s\n", fmt, err);
            return 1;
        }
        bytes[s] = (double)quant_linear_bytes(&t);
        kiln_wfree((void *)t.w.data), kiln_wfree((void *)t.scales.data), kiln_wfree((void *)t.zeros.data), kiln_wfree((void *)t.g_idx.data);
        cnt[s] = (int)(total / bytes[s]) + 1;
        ws[s] = kiln_calloc((size_t)cnt[s], sizeof **ws);
        for (int i = 0; i < cnt[s]; i++) {
            ws[s][i] = (struct qlinear){.n_out = Ns[s], .n_in = K};
            if (make(&ws[s][i], fmt, (uint64_t)i + 1, err, sizeof err) || be->prepare_linear(be, &ws[s][i], err, sizeof err)) {
                fprintf(stderr, "gemv-bench: %s: %s\n", fmt, err);
                return 1;
            }
        }
    }
    float *x = kiln_malloc(sizeof(float) * (size_t)K), *y = kiln_malloc(sizeof(float) * (size_t)Ns[NS - 1]);
    for (int i = 0; i < K; i++) x[i] = (float)((i * 37) % 17 - 8) * 0.1f;
    const int width = be->load_width(be);
    printf("%s, K = %d, %d threads, %s, ~%.0f MB of distinct matrices per size, 2 sweeps\n", fmt, K, nt, cpu_isa_name(cpu_isa()), total / 1e6);
    for (int p = 0; p < passes; p++) {
        const double bw = bench_membw(nt, (size_t)1 << 30, 6, width);
        printf("probe %5.1f GB/s |", bw);
        for (int s = 0; s < NS; s++) {
            double t0 = kiln_now();
            for (int k = 0; k < 2; k++)
                for (int i = 0; i < cnt[s]; i++) be->matmul(be, y, x, &ws[s][i], 1);
            double dt = kiln_now() - t0, g = 2.0 * cnt[s] * bytes[s] / dt / 1e9;
            printf(" N %5d (%.2f MB) %5.1f GB/s %3.0f%% %6.1f us |", Ns[s], bytes[s] / 1e6, g, 100 * g / bw, 1e6 * dt / (2.0 * cnt[s]));
        }
        printf("\n");
        fflush(stdout);
    }
    return 0;
}
