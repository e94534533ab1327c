/*
 * membw.c: this machine's memory read bandwidth, the denominator of kiln's
 * decode roofline (roofline tok/s = bandwidth / weight bytes read per token),
 * measured the way `kiln bench --profile pp-tg --roofline` measures it
 * (src/bench/membw.c), with each stream pattern shown on its own:
 *
 *   cc -O2 -Isrc -o /tmp/membw tools/membw.c src/bench/membw.c src/base/base.c -lpthread -lm
 *   /tmp/membw [threads] [MiB] [passes per pattern] [load width: 16|32|64]
 *
 * Each thread sums its slice of a fresh buffer much larger than the
 * last-level cache (default 1024 MiB) as 1, 2 and 4 streams; per pattern
 * the best and the median pass, in GB/s (10^9 bytes), then the best of all
 * (the figure the bench uses). Defaults: all cores, 10 passes, 32-byte loads.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench/bench.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    int reps = argc > 3 ? atoi(argv[3]) : 10, width = argc > 4 ? atoi(argv[4]) : 32;
    if (reps < 1 || (width != 16 && width != 32 && width != 64)) {
        fprintf(stderr, "usage: membw [threads] [MiB] [passes >= 1] [width 16|32|64]\n");
        return 2;
    }
    static const int streams[] = {1, 2, 4};
    double *g = calloc(3 * (size_t)reps, sizeof *g), best = -1;
    if (!g || bench_membw_passes(nt, mib << 20, 3 * reps, width, streams, 3, g) < 0) {
        fprintf(stderr, "membw: could not map %zu MiB or start %d threads\n", mib, nt);
        return 1;
    }
    printf("threads %d, buffer %zu MiB, %d-byte loads, %d passes per pattern:", nt, mib, width, reps);
    for (int s = 0; s < 3; s++) {
        double v[reps];
        for (int k = 0; k < reps; k++) v[k] = g[3 * k + s];
        qsort(v, (size_t)reps, sizeof *v, cmp);
        printf(" %d stream%s best %.2f median %.2f;", streams[s], s ? "s" : "", v[reps - 1], v[reps / 2]);
        if (v[reps - 1] > best) best = v[reps - 1];
    }
    printf(" best %.2f GB/s\n", best);
    free(g);
    return 0;
}
