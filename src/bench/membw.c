/*
 * membw.c: the machine's memory read bandwidth, measured inside a benchmark
 * run (`kiln bench --profile pp-tg --roofline`), the denominator of the
 * decode roofline: roofline tok/s = bandwidth / weight bytes per token.
 *
 * The bandwidth of a shared or virtual machine moves by 10-30% within
 * minutes, so a figure taken in another run says little about this one;
 * the bench measures it right before each timed decode repetition and after
 * the last.
 *
 * Method: `threads` threads each sum their contiguous slice of a fresh
 * buffer of `bytes` (larger than the last-level cache), as a decode GEMV
 * streams its weight rows. A slice is read as 1, 2 or 4 streams (its equal
 * parts in lockstep, 256 bytes of each in turn): one core keeps more lines
 * in flight with two streams than with one (this repository's test host,
 * 2 threads, 32-byte loads: 20.6-25.5 GB/s with one, 22.8-30.1 with two,
 * about the same with four), and the CPU kernels' decode reads two
 * (CPU_FOR_ROWS2), so a one-stream probe would understate what the machine
 * delivers. The passes cycle through the three patterns; the result is the
 * best pass, in GB/s (10^9 bytes). The buffer is mapped for the call and
 * unmapped after it, so the process's resident memory (the bench's memory
 * column) is as it was. tools/membw.c prints each pattern on its own.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"
#include "bench/bench.h"

struct bw_slice {
    const uint8_t *p;
    size_t n; /* bytes, a multiple of 1024 */
    int fill, width, streams;
    uint64_t sum;
};

/* sum of the S parts of [p, p + n) read in lockstep, 256 bytes of each in
 * turn, as W-byte vectors into four accumulators (the compiler keeps them
 * in registers of that width when the target has it) */
#define BW_SUM(NAME, W, ATTR)                                                                    \
    ATTR static uint64_t NAME(const uint8_t *p, size_t n, int S) {                               \
        typedef uint64_t v __attribute__((vector_size(W)));                                      \
        const size_t part = n / (size_t)S / 256 * 256;                                           \
        v a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                                                \
        for (size_t o = 0; o < part; o += 256)                                                   \
            for (int s = 0; s < S; s++) {                                                        \
                const v *q = (const v *)(p + (size_t)s * part + o);                              \
                for (int i = 0; i < 256 / (W); i += 4) a0 += q[i], a1 += q[i + 1], a2 += q[i + 2], a3 += q[i + 3]; \
            }                                                                                    \
        v a = a0 + a1 + a2 + a3;                                                                 \
        uint64_t s = 0;                                                                          \
        for (int k = 0; k < (W) / 8; k++) s += a[k];                                             \
        return s;                                                                                \
    }
BW_SUM(bw_sum16, 16, )
#if defined(__x86_64__)
BW_SUM(bw_sum32, 32, __attribute__((target("avx2"))))
BW_SUM(bw_sum64, 64, __attribute__((target("avx512f"))))
#endif

static void *bw_thread(void *arg) {
    struct bw_slice *s = arg;
    if (s->fill) memset((void *)s->p, 1, s->n); /* each thread faults its own slice in */
#if defined(__x86_64__)
    else if (s->width == 64) s->sum += bw_sum64(s->p, s->n, s->streams);
    else if (s->width == 32) s->sum += bw_sum32(s->p, s->n, s->streams);
#endif
    else s->sum += bw_sum16(s->p, s->n, s->streams);
    return NULL;
}

/* one pass of every thread over its slice; 0, or -1 if a thread could not start */
static int bw_pass(struct bw_slice *sl, int threads, int fill) {
    pthread_t th[BENCH_MEMBW_MAX_THREADS];
    int rc = 0, started = 0;
    for (int t = 0; t < threads; t++) {
        sl[t].fill = fill;
        if (pthread_create(&th[t], NULL, bw_thread, &sl[t])) {
            rc = -1;
            break;
        }
        started++;
    }
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    return rc;
}

double bench_membw_passes(int threads, size_t bytes, int passes, int width, const int *streams, int n_streams, double *gbs) {
    if (threads < 1) threads = 1;
    if (threads > BENCH_MEMBW_MAX_THREADS) threads = BENCH_MEMBW_MAX_THREADS;
    if (passes < 1) passes = 1;
    const size_t per = bytes / (size_t)threads / 1024 * 1024, total = per * (size_t)threads;
    if (per == 0 || n_streams < 1) return -1;
    void *buf = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return -1;
    struct bw_slice sl[BENCH_MEMBW_MAX_THREADS];
    for (int t = 0; t < threads; t++) sl[t] = (struct bw_slice){.p = (const uint8_t *)buf + per * (size_t)t, .n = per, .width = width};
    double best = -1;
    if (bw_pass(sl, threads, 1) == 0)
        for (int k = 0; k < passes; k++) {
            const int S = streams[k % n_streams] < 1 ? 1 : streams[k % n_streams];
            for (int t = 0; t < threads; t++) sl[t].streams = S;
            double t0 = kiln_now();
            if (bw_pass(sl, threads, 0)) {
                best = -1;
                break;
            }
            /* the bytes read: each slice's S parts of whole 256-byte steps */
            double g = (double)(per / (size_t)S / 256 * 256 * (size_t)S) * threads / (kiln_now() - t0) / 1e9;
            if (gbs) gbs[k] = g;
            if (g > best) best = g;
        }
    munmap(buf, total);
    return best;
}

double bench_membw(int threads, size_t bytes, int passes, int width) {
    static const int streams[] = {1, 2, 4};
    return bench_membw_passes(threads, bytes, passes, width, streams, 3, NULL);
}
