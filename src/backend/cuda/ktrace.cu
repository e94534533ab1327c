/*
 * Host side of the kernel timeline trace (ktrace.cuh says what it records
 * and why). Empty unless built with -DKILN_CUDA_TRACE.
 */
#include "backend/cuda/cuda.cuh"

#ifdef KILN_CUDA_TRACE
#include <stdio.h>
#include <stdlib.h>

#define KT_UNITS 32
#define KT_RECS ((size_t)KT_LAUNCHES * KT_BLOCKS)

/* the translation units that include ktrace.cuh, in registration order (a
 * record's file index); filled before main by their static initialisers */
static struct {
    void (*set)(void *, unsigned, cudaStream_t);
    const char *name;
} kt_units[KT_UNITS];
static int kt_n;

extern "C" void ktrace_register(void (*set)(void *buf, unsigned file, cudaStream_t s), const char *name) {
    if (kt_n < KT_UNITS) kt_units[kt_n].set = set, kt_units[kt_n].name = name, kt_n++;
    else fprintf(stderr, "kiln: ktrace: more than %d units; %s is not traced (raise KT_UNITS)\n", KT_UNITS, name);
}

static struct ktrace_rec *kt_buf;
static const char *kt_path;
static long kt_at = 40, kt_fwd;

void ktrace_init(void) {
    kt_path = getenv("KILN_CUDA_KTRACE");
    if (!kt_path || !*kt_path || kt_buf) return;
    const char *at = getenv("KILN_CUDA_KTRACE_AT");
    if (at && atol(at) > 0) kt_at = atol(at);
    CUDA_CHECK(cudaMalloc(&kt_buf, KT_RECS * sizeof *kt_buf));
    fprintf(stderr, "kiln: ktrace: forward %ld's kernels to %s (%d units)\n", kt_at, kt_path, kt_n);
}

/* forward kt_at: a zeroed buffer (t1 = 0: no record) and every unit pointed
 * at it, in stream order before the forward's first launch */
void ktrace_begin(cudaStream_t s) {
    if (!kt_buf || ++kt_fwd != kt_at) return;
    CUDA_CHECK(cudaMemsetAsync(kt_buf, 0, KT_RECS * sizeof *kt_buf, s));
    for (int i = 0; i < kt_n; i++) kt_units[i].set(kt_buf, (unsigned)i, s);
    CUDA_CHECK(cudaGetLastError());
}

void ktrace_end(cudaStream_t s) {
    if (!kt_buf || kt_fwd != kt_at) return;
    for (int i = 0; i < kt_n; i++) kt_units[i].set(NULL, (unsigned)i, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    struct ktrace_rec *r = (struct ktrace_rec *)malloc(KT_RECS * sizeof *r);
    FILE *f = fopen(kt_path, "w");
    if (!r || !f) {
        fprintf(stderr, "kiln: ktrace: cannot write %s\n", kt_path);
        free(r);
        if (f) fclose(f);
        return;
    }
    CUDA_CHECK(cudaMemcpyAsync(r, kt_buf, KT_RECS * sizeof *r, cudaMemcpyDeviceToHost, s)); /* on the stream (docs/cuda.md, "One stream") */
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < kt_n; i++) fprintf(f, "# unit %d %s\n", i, kt_units[i].name);
    fprintf(f, "# grid t0 tw t1 unit line sm block mark0..mark%d (ns; tw 0: no wait; a mark: ns after t0, 0: not reached)\n", KT_MARKS - 1);
    size_t n = 0;
    for (size_t i = 0; i < KT_RECS; i++) {
        if (!r[i].t1) continue;
        fprintf(f, "%u %llu %llu %llu %u %u %u %u", r[i].grid, r[i].t0, r[i].tw, r[i].t1, r[i].site >> 16, r[i].site & 0xffff, r[i].sm,
                r[i].blk);
        for (int m = 0; m < KT_MARKS; m++) fprintf(f, " %u", r[i].mark[m]);
        fputc('\n', f);
        n++;
    }
    fclose(f);
    free(r);
    fprintf(stderr, "kiln: ktrace: %zu blocks of forward %ld written to %s\n", n, kt_at, kt_path);
}
#endif
