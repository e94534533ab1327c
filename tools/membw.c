/*
 * membw.c: this machine's memory read bandwidth, the denominator of kiln's
 * decode roofline (roofline tok/s = bandwidth / weight bytes read per token).
 *
 *   cc -O2 -fopenmp -mavx2 -o /tmp/membw tools/membw.c && /tmp/membw [threads] [MiB] [reps]
 *
 * Each thread sums its contiguous slice of a buffer much larger than the
 * last-level cache (default 1024 MiB) with 256-bit loads, as a decode GEMV
 * streams its weight rows; the best of `reps` passes is printed in GB/s
 * (10^9 bytes), with the median for the spread.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : omp_get_num_procs();
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    int reps = argc > 3 ? atoi(argv[3]) : 10;
    size_t n = mib << 20;
    float *buf;
    if (posix_memalign((void **)&buf, 64, n)) return 1;
    size_t nf = n / sizeof(float);
    omp_set_num_threads(nt);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < nf; i++) buf[i] = (float)(i & 1023);
    double *gbs = calloc((size_t)reps, sizeof *gbs);
    volatile float sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        float tot = 0;
#pragma omp parallel reduction(+ : tot)
        {
            int id = omp_get_thread_num(), nth = omp_get_num_threads();
            size_t per = (nf / nth) & ~(size_t)63, b = per * id, e = id == nth - 1 ? nf : b + per;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            size_t i = b;
            for (; i + 32 <= e; i += 32) {
                a0 = _mm256_add_ps(a0, _mm256_load_ps(buf + i));
                a1 = _mm256_add_ps(a1, _mm256_load_ps(buf + i + 8));
                a2 = _mm256_add_ps(a2, _mm256_load_ps(buf + i + 16));
                a3 = _mm256_add_ps(a3, _mm256_load_ps(buf + i + 24));
            }
            float s[8];
            _mm256_storeu_ps(s, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
            for (int j = 0; j < 8; j++) tot += s[j];
            for (; i < e; i++) tot += buf[i];
        }
        double dt = now() - t0;
        sink += tot;
        gbs[r] = (double)n / dt / 1e9;
    }
    qsort(gbs, (size_t)reps, sizeof *gbs, cmp);
    printf("threads %d, buffer %zu MiB, %d passes: best %.2f GB/s, median %.2f GB/s, worst %.2f GB/s\n", nt, mib, reps,
           gbs[reps - 1], gbs[reps / 2], gbs[0]);
    free(gbs);
    free(buf);
    return 0;
}
