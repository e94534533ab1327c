/*
 * gemv.h: the decode GEMV's shared pieces (not a public API): the kernel
 * type, the row order and prefetch policies' helpers, and the macros that
 * turn a rows kernel (R weight rows x nx activation rows per pass) into a
 * gemv1 function. matmul.c instantiates them for F32 / F16 / BF16 rows,
 * b12.c for BF16 stored in 12 bits.
 */
#ifndef KILN_CPU_GEMV_H
#define KILN_CPU_GEMV_H

#include "backend/cpu/cpu.h"
#include "backend/cpu/simd.h"

/* rows per pass of the batch-1 GEMV over long rows (cpu_gemv_rows) */
enum { GEMV_R = 4 };
/* rows [r0, r1) of out[t][r] = W[r] . x[t] + bias[r] for nx activation rows
 * (t < nx, x rows n_in apart, out rows n_out apart): each weight row is
 * read once for all nx. nx is at most GEMVM_MAX of the ISA (2 on AVX2 and
 * NEON, 4 on AVX-512: the four accumulators of every row stay in
 * registers); each row's sums are those of nx = 1, so a sequence decodes to
 * the same bits alone or in a batch. */
typedef void (*gemv1_fn)(const uint8_t *W, size_t rb, const float *x, int nx, int n_in, int64_t r0, int64_t r1, const float *bias,
                         float *out, int n_out);

/* two streams for rows of rb bytes? (the policy above) */
static inline int gemv_two(size_t rb) {
    const int s = cpu_gemv_streams();
    return s ? s == 2 : rb < 4096;
}

/* does a row of K = n_in activations and rb bytes of weights overflow lim bytes (cpu_gemv_rows)? */
static inline int gemv_rows_for(int n_in, size_t rb, int lim) { return lim && (int64_t)4 * n_in + (int64_t)rb > lim; }

/* the first pfd bytes of both streams of rows [r0, r1) (CPU_FOR_ROWS), or
 * the first 2 x pfd of the one stream */
static inline void gemv_pf_start(const uint8_t *W, size_t rb, int64_t r0, int64_t r1, int two, int pfd) {
    const int64_t h = two ? (r1 - r0 + 1) / 2 : r1 - r0;
    for (int s = 0; s < 1 + two; s++) {
        const uint8_t *p = W + (size_t)(r0 + s * h) * rb;
        size_t bytes = (size_t)(s ? r1 - r0 - h : h) * rb;
        if (bytes > (size_t)pfd * (2 - two)) bytes = (size_t)pfd * (2 - two);
        for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
    }
}

/* rows [r0, r1) for nx activation rows: R rows per pass while R fit, then
 * one; each thread's rows as CPU_FOR_ROWS orders them */
#define GEMV_PASSES(ROWS, RR)                                                                                     \
    do {                                                                                                          \
        const int64_t nu_ = (r1 - r0) / (RR);                                                                     \
        CPU_FOR_ROWS(u_, 0, nu_, two_) ROWS(W, rb, x, nx, RR, n_in, r0 + (RR) * u_, bias, out, n_out, pfd_, 1);   \
        r0 += (RR) * nu_;                                                                                         \
    } while (0)

/* How many rows a pass takes: GEMV_R adjacent rows at batch 1 over rows
 * that overflow the L1 data cache (cpu_gemv_rows); on AVX-512 at 2-4
 * activation rows two rows half the run [r0, r1) apart, two streams read
 * together (16 accumulators at 4; the one-row loop there issues 1.25 loads
 * per FMA). Two adjacent rows per pass at 3-4 (the first version) gained
 * over rows of more than 4 KiB only (BF16 K 3,072 1.13-1.23x with
 * cpu_gemv_pfd_batch's prefetch, 4 KiB rows 0.85-0.97x, 2 KiB 0.62-0.82x);
 * pairs half a run apart gained at every row size in GEMV sweeps (K 1,024
 * n = 4 1.16-1.19, K 2,048 1.11 / 1.29 at n = 3 / 4, K 3,072 and 6,144
 * 1.10-1.21 over the adjacent pairs, n = 2 1.19-1.21) and 3-11% of a
 * batched decode step (docs/cpu.md). Else one row. The multi-row passes
 * follow the gemv-rows switch (0: never). PFD1: the prefetch distance of
 * batch-1 passes (cpu_gemv_pfd(), or the 12-bit rows' own); PAIRS1: the
 * pairs at batch 1 too (the 12-bit rows on AVX-512, b12.c). */
#define GEMV1(NAME, ISA, ROWS, MAXNX, PFD1, PAIRS1)                                                           \
    ISA static inline __attribute__((always_inline)) void NAME##_(const uint8_t *W, size_t rb, const float *x, int nx, \
                                                                  int n_in, int64_t r0, int64_t r1, const float *bias, \
                                                                  float *out, int n_out) {                         \
        const int two_ = gemv_two(rb), pfd_ = nx > 1 ? cpu_gemv_pfd_batch() : (PFD1), rk_ = cpu_gemv_rows();     \
        gemv_pf_start(W, rb, r0, r1, two_, pfd_);                                                                 \
        if (nx == 1 && gemv_rows_for(n_in, rb, rk_)) GEMV_PASSES(ROWS, GEMV_R);                      \
        if (rk_ && (MAXNX == 4 ? nx >= 2 || (PAIRS1) : nx == 1 && (PAIRS1))) { /* pairs half the run apart */  \
            const int64_t h_ = (r1 - r0) / 2;                                                                     \
            for (int64_t u_ = 0; u_ < h_; u_++) ROWS(W, rb, x, nx, 2, n_in, r0 + u_, bias, out, n_out, pfd_, h_); \
            r0 += 2 * h_;                                                                                         \
        }                                                                                                         \
        GEMV_PASSES(ROWS, 1);                                                                                     \
    }                                                                                                             \
    ISA static void NAME(const uint8_t *W, size_t rb, const float *x, int nx, int n_in, int64_t r0, int64_t r1,   \
                         const float *bias, float *out, int n_out) {                                              \
        switch (nx < MAXNX ? nx : MAXNX) {                                                                        \
        case 1: NAME##_(W, rb, x, 1, n_in, r0, r1, bias, out, n_out); break;                                      \
        case 2: NAME##_(W, rb, x, 2, n_in, r0, r1, bias, out, n_out); break;                                      \
        case 3: NAME##_(W, rb, x, MAXNX < 3 ? MAXNX : 3, n_in, r0, r1, bias, out, n_out); break;                  \
        default: NAME##_(W, rb, x, MAXNX, n_in, r0, r1, bias, out, n_out); break;                                 \
        }                                                                                                         \
    }

/* the 12-bit BF16 rows' gemv1 for cpu_isa() (b12.c), NULL on the scalar path */
gemv1_fn cpu_b12_gemv1(void);

#endif
