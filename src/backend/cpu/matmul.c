/*
 * matmul.c: y = x W^T + b on the CPU for dense weights (F32, F16, BF16), and
 * the run-time choice of instruction set shared by the CPU kernels.
 *
 * Two shapes, both accumulating in f32 with f32 activations (weights are
 * widened bf16/f16 -> f32 exactly, so the only numerical difference between
 * paths is the order of the f32 sums):
 *
 *   GEMV (n < GEMM_MIN rows, decode): memory bound. Each thread of the
 *   worker pool (cpu.c, cpu_parallel_for_split) walks one contiguous run of
 *   weight rows as two sequential streams, software-prefetched GEMV_PFD ahead;
 *   each row is streamed once per pass and dotted with up to 2 (AVX2, NEON)
 *   or 4 (AVX-512) activation rows, each with the accumulators and order of
 *   sums of one row alone (a batch of 2-7 sequences decodes to the bits each
 *   would get alone). On x86 a pass may take R weight rows, one activation
 *   load serving them all (GEMV_ROWS_*, GEMV1): 4 at batch 1 over rows whose
 *   activations overflow L1 (cpu_gemv_rows), on AVX-512 2 half a run apart
 *   at 2-4 activation rows; the same bits.
 *
 *   GEMM (prefill): compute bound. The activations are packed once per call
 *   into panels of MR rows laid out [k][MR]; each thread then takes short
 *   contiguous runs of NR-wide output panels, widens and transposes its NR
 *   weight rows into an f32 panel [k][NR] (read from memory once per call),
 *   and runs a register-tiled MR x NR microkernel over every row panel:
 *   per k, NR/VL vector loads of weights, MR broadcasts of activations and
 *   MR * NR/VL FMAs, nothing else. AVX-512: 12 x 32 (24 zmm accumulators);
 *   AVX2: 6 x 16 (12 ymm accumulators).
 *
 * BF16 linears stored in 12 bits (b12.c, the prepared form in qlinear.be)
 * take the same two shapes: the GEMV with b12.c's rows kernels under the
 * same pass macros (gemv.h), the GEMM with panels decoded from the 12-bit
 * rows (pack_w_b12); both give the BF16 bits.
 *
 * Paths: scalar (portable, the reference), AVX2+FMA+F16C, AVX-512 (F+BW+VL),
 * picked at run time from what the CPU reports; KILN_CPU_ISA=scalar|avx2|
 * avx512 caps the choice (KILN_NO_SIMD=1 means scalar), and tests force each
 * path with cpu_set_isa(). On AArch64: NEON (GEMM 8 x 12, GEMV), and the
 * dotprod level (Q8_0 / Q4_0 with sdot, qmatmul_int8.c) when the CPU has it.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/gemv.h"
#include "backend/cpu/simd.h"
#include "base/base.h"
#include "format/quant.h"

/* ==== instruction set choice ==== */

static int isa_hw = -1, isa_cur = -1;

#if defined(KILN_NEON) && defined(__linux__)
#include <sys/auxv.h>
#endif
#if defined(KILN_X86)
#include <cpuid.h>
/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does
 * not take "f16c" (clang 14: the fuzz build), gcc's does */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static void isa_init(void) {
    if (isa_hw >= 0) return;
    int h = CPU_ISA_SCALAR;
#if defined(KILN_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c()) h = CPU_ISA_AVX2;
    if (h == CPU_ISA_AVX2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        h = CPU_ISA_AVX512;
#elif defined(KILN_NEON)
    /* Advanced SIMD is part of AArch64; dotprod (sdot/udot, ARMv8.2+:
     * Cortex-A76 / Pi 5, Neoverse, Apple) is optional. The f16 -> f32
     * widening (fcvtl) is base AArch64; FEAT_FP16 / FEAT_BF16 arithmetic
     * would round the f32 activations, which the parity contract forbids,
     * so they are not used. */
    h = CPU_ISA_NEON;
#if defined(__linux__) && defined(HWCAP_ASIMDDP)
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) h = CPU_ISA_DOTPROD;
#elif defined(__ARM_FEATURE_DOTPROD)
    h = CPU_ISA_DOTPROD;
#endif
#endif
    int c = h;
    const char *e = getenv("KILN_CPU_ISA");
    if (e && *e) {
#if defined(KILN_NEON)
        int want = !strcmp(e, "scalar") ? CPU_ISA_SCALAR : !strcmp(e, "neon") ? CPU_ISA_NEON : CPU_ISA_DOTPROD;
#else
        int want = !strcmp(e, "scalar") ? CPU_ISA_SCALAR : !strcmp(e, "avx2") ? CPU_ISA_AVX2 : CPU_ISA_AVX512;
#endif
        if (want < c) c = want;
    }
    if (getenv("KILN_NO_SIMD")) c = CPU_ISA_SCALAR;
    isa_cur = c;
    isa_hw = h;
}

int cpu_isa(void) {
    isa_init();
    return isa_cur;
}

/* an AMD CPU with AVX-512 (Zen 4 and later): the decode streaming policy of
 * the GEMV kernels (cpu.h) */
int cpu_amd_avx512(void) {
#if defined(KILN_X86)
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") && __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

int cpu_isa_max(void) {
    isa_init();
    return isa_hw;
}

int cpu_set_isa(int isa) {
    isa_init();
    isa_cur = isa < CPU_ISA_SCALAR ? CPU_ISA_SCALAR : isa > isa_hw ? isa_hw : isa;
    return isa_cur;
}

const char *cpu_isa_name(int isa) {
    return isa == CPU_ISA_AVX512 ? "avx512" : isa == CPU_ISA_AVX2 ? "avx2" : isa == CPU_ISA_DOTPROD ? "dotprod" : isa == CPU_ISA_NEON ? "neon" : "scalar";
}

static int isa_used;

void cpu_isa_note(int isa, int extra) {
    int m = (isa == CPU_ISA_AVX512 ? CPU_USED_AVX512 : isa == CPU_ISA_AVX2 ? CPU_USED_AVX2 : 0) | extra;
    if (extra & (CPU_USED_VNNI | CPU_USED_VBMI)) m |= CPU_USED_AVX512; /* both are AVX-512 extensions here */
    m |= isa == CPU_ISA_DOTPROD ? CPU_USED_NEON | CPU_USED_DOTPROD : isa == CPU_ISA_NEON ? CPU_USED_NEON : 0;
    /* callers are the threads that dispatch a whole op, once per call */
    if ((__atomic_load_n(&isa_used, __ATOMIC_RELAXED) & m) != m) __atomic_fetch_or(&isa_used, m, __ATOMIC_RELAXED);
}

int cpu_isa_used(void) { return __atomic_load_n(&isa_used, __ATOMIC_RELAXED); }

void cpu_isa_used_reset(void) { __atomic_store_n(&isa_used, 0, __ATOMIC_RELAXED); }

/* ==== scalar dot products (portable, and the reference for tests) ==== */

static void dot_f32_scalar(const void *row, const float *const *x, int nx, int n_in, float *out) {
    const float *w = row;
    for (int j = 0; j < nx; j++) {
        float s = 0;
        for (int i = 0; i < n_in; i++) s += w[i] * x[j][i];
        out[j] = s;
    }
}

static void dot_bf16_scalar(const void *row, const float *const *x, int nx, int n_in, float *out) {
    const uint16_t *w = row;
    for (int j = 0; j < nx; j++) {
        float s = 0;
        for (int i = 0; i < n_in; i++) s += kiln_bf16_to_f32(w[i]) * x[j][i];
        out[j] = s;
    }
}

static void dot_f16_scalar(const void *row, const float *const *x, int nx, int n_in, float *out) {
    const uint16_t *w = row;
    for (int j = 0; j < nx; j++) {
        float s = 0;
        for (int i = 0; i < n_in; i++) s += kiln_f16_to_f32(w[i]) * x[j][i];
        out[j] = s;
    }
}

#if defined(KILN_X86)
/* ==== AVX2 + FMA (+ F16C) ==== */

#define AVX2 KILN_AVX2

AVX2 static inline __m256 load8_bf16(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AVX2 static inline __m256 load8_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

AVX2 static inline __m256 load8_f32(const float *p) { return _mm256_loadu_ps(p); }

/* One body for the three weight types: W loads 8 weights as f32. Two
 * accumulators per activation row hide the FMA latency. */
#define DOT_AVX2(NAME, WT, LOAD, SCALAR)                                                            \
    AVX2 static void NAME(const void *row, const float *const *x, int nx, int n_in, float *out) {   \
        const WT *w = row;                                                                          \
        int i = 0, n16 = n_in & ~15;                                                                \
        __m256 a[4][2];                                                                             \
        for (int j = 0; j < 4; j++) a[j][0] = a[j][1] = _mm256_setzero_ps();                        \
        for (; i < n16; i += 16) {                                                                  \
            __m256 w0 = LOAD(w + i), w1 = LOAD(w + i + 8);                                          \
            for (int j = 0; j < nx; j++) {                                                          \
                a[j][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[j] + i), a[j][0]);                  \
                a[j][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[j] + i + 8), a[j][1]);              \
            }                                                                                       \
        }                                                                                           \
        for (int j = 0; j < nx; j++) {                                                              \
            float s = kiln_hsum8(_mm256_add_ps(a[j][0], a[j][1]));                                       \
            float t;                                                                                \
            const float *xt = x[j] + i;                                                             \
            SCALAR((const void *)(w + i), &xt, 1, n_in - i, &t);                                    \
            out[j] = s + t;                                                                         \
        }                                                                                           \
    }

DOT_AVX2(dot_f32_avx2, float, load8_f32, dot_f32_scalar)
DOT_AVX2(dot_bf16_avx2, uint16_t, load8_bf16, dot_bf16_scalar)
DOT_AVX2(dot_f16_avx2, uint16_t, load8_f16, dot_f16_scalar)

/* ==== AVX-512 (F + BW + VL) ==== */

#define AVX512 KILN_AVX512

AVX512 static inline __m512 load16m_bf16(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
AVX512 static inline __m512 load16m_f16(const uint16_t *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
AVX512 static inline __m512 load16m_f32(const float *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
AVX512 static inline __m512 load16_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
AVX512 static inline __m512 load16_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
AVX512 static inline __m512 load16_f32(const float *p) { return _mm512_loadu_ps(p); }

/* Dot of one weight row with 1..4 activation rows: 32 weights per step in
 * two accumulators per activation row; the tail under a mask. */
#define DOT_AVX512(NAME, WT, LOAD, LOADM)                                                          \
    AVX512 static void NAME(const void *row, const float *const *x, int nx, int n_in, float *out) { \
        const WT *w = row;                                                                         \
        int i = 0;                                                                                 \
        __m512 a[4][2];                                                                            \
        for (int j = 0; j < 4; j++) a[j][0] = a[j][1] = _mm512_setzero_ps();                       \
        for (; i + 32 <= n_in; i += 32) {                                                          \
            __m512 w0 = LOAD(w + i), w1 = LOAD(w + i + 16);                                        \
            for (int j = 0; j < nx; j++) {                                                         \
                a[j][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[j] + i), a[j][0]);                 \
                a[j][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[j] + i + 16), a[j][1]);            \
            }                                                                                      \
        }                                                                                          \
        for (; i < n_in; i += 16) {                                                                \
            int r = n_in - i;                                                                      \
            __mmask16 m = r >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << r) - 1);                \
            __m512 w0 = LOADM(w + i, m);                                                           \
            for (int j = 0; j < nx; j++) a[j][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x[j] + i), a[j][0]); \
        }                                                                                          \
        for (int j = 0; j < nx; j++) out[j] = _mm512_reduce_add_ps(_mm512_add_ps(a[j][0], a[j][1])); \
    }

DOT_AVX512(dot_f32_avx512, float, load16_f32, load16m_f32)
DOT_AVX512(dot_bf16_avx512, uint16_t, load16_bf16, load16m_bf16)
DOT_AVX512(dot_f16_avx512, uint16_t, load16_f16, load16m_f16)

#endif /* KILN_X86 */

/* Decode GEMV, one activation row: the weight rows are read one row at a
 * time, a chunk as two sequential streams, or one for rows of 4 KiB and
 * up on AMD CPUs (CPU_FOR_ROWS, cpu_gemv_streams: cpu.h), one 64-byte line
 * of weights per step (32 16-bit weights: 4 ymm accumulators on AVX2, 2 zmm
 * on AVX-512), with a software prefetch cpu_gemv_pfd() bytes ahead of the
 * stream (GEMV_PFD, or none on AMD CPUs with AVX-512); the first that many
 * bytes of both streams are prefetched on entry. The
 * AVX-512 loop took two lines per step (4 zmm, two prefetches) until
 * 2026-12-04: on a Zen 4 EPYC (2 cores, AVX-512 executed as two 256-bit
 * halves) that streamed BF16 ~22% slower than the AVX2 loop from DRAM
 * (`decode-ab gemv 1024 2048 isa 2 1`: AVX2 / AVX-512 1.28, then 0.99 with
 * one line per step) though it ran faster from L2 (55 against 43 GB/s on
 * one core): 0.6B BF16 tg128 19.1 -> 25.1 tok/s, 68 -> 95% of the probe.
 * A standalone loop showed the same for F16 (two lines 0.78 of AVX2, one
 * line 1.04); why two lines per step stream worse there is not known.
 * One thread, BF16 from DRAM (harness, CPU time): 4 rows at a time
 * (4 interleaved streams, no prefetch) 21-24 GB/s, one row + 4 KiB prefetch
 * 33-37 GB/s, a plain read 37-39. That 4 KiB was for one stream; with two
 * streams per thread each runs 2 KiB ahead, the same 4 KiB in flight per
 * thread. On a 2-core Zen 3 (2.45 GHz, AVX2), alternated, 2 threads: 0.6B
 * tg128 BF16 17.3 / 17.3 / 18.7 / 17.3 -> 18.8 / 21.4 / 20.3 / 19.4 tok/s,
 * Q4_0 (BF16 head) 39.9 -> 42.5 median of five pairs, 1.7B BF16 unchanged
 * (6.07-6.19 against 5.65-6.26); `make gemv-bench` BF16 at 67 MB, ten
 * pairs: median 24.2 -> 25.5 GB/s, 8 of 10 pairs faster. Then 1 KiB, on
 * the same host with the weights in 2 MiB pages: a standalone loop of the
 * same shape (2 threads x 2 streams, 512 MB, 40 interleaved passes) read
 * 25.4 / 26.6 / 26.7 / 26.1 GB/s (median) at 512 / 768 / 1024 / 1536 bytes
 * and 25.5 / 30.2 / 27.9 / 26.4 at 0 / 1 / 2 / 4 KiB; `gemv-bench bf16`,
 * 2 KiB against 1 KiB builds alternated 8 times, 70 / 75 / 84 / 85% ->
 * 79 / 84 / 86 / 88% of the probe at 1 / 4 / 17 / 67 MB. -D overrides it
 * for such sweeps. */
#ifndef GEMV_PFD
#define GEMV_PFD 1024
#endif

/* one or two streams per thread, or 0: by row size (cpu.h); chosen once,
 * before any pool job */
static int gemv_streams = -1;

int cpu_gemv_streams(void) {
    if (gemv_streams >= 0) return gemv_streams;
    const char *e = getenv("KILN_CPU_GEMV_STREAMS");
    int s = 2;
#if defined(KILN_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd")) s = cpu_amd_avx512() ? 1 : 0; /* Zen 4 and later: one (cpu.h) */
#endif
    if (e && (!strcmp(e, "0") || !strcmp(e, "1") || !strcmp(e, "2"))) s = *e - '0';
    return gemv_streams = s;
}

int cpu_set_gemv_streams(int s) { return gemv_streams = s >= 0 && s <= 2 ? s : 2; }

int cpu_pfd_env(int dflt, const char *name) {
    const char *e = getenv(name);
    return cpu_pfd_lines(e && *e ? atoi(e) : dflt);
}

/* The software prefetch distance of the dense decode GEMV in bytes, 0 for
 * none (cpu.h): GEMV_PFD, but none on AMD CPUs with AVX-512 (Zen 4 and
 * later), whose hardware prefetchers stream faster alone ("Zen 4: one line
 * per GEMV step, no software prefetch", docs/cpu.md). KILN_CPU_GEMV_PFD=N
 * forces N bytes; chosen once, before any pool job. */
static int gemv_pfd = -1;

int cpu_gemv_pfd(void) {
    if (gemv_pfd < 0) gemv_pfd = cpu_pfd_env(cpu_amd_avx512() ? 0 : GEMV_PFD, "KILN_CPU_GEMV_PFD");
    return gemv_pfd;
}

int cpu_set_gemv_pfd(int d) { return gemv_pfd = cpu_pfd_lines(d); }

/* The same for passes of 2+ activation rows (batched decode): the FMAs per
 * line are 2-4x batch 1's, the stream waits on them, and a prefetch 2 KiB
 * ahead lets the lines arrive meanwhile. AMD CPUs with AVX-512: 2048 (Zen
 * 4, BF16 GEMV sweeps, `decode-ab gemv K N gemv-pfd 0 2048 8 n`: K 1,024
 * 1.14 / 1.15 / 1.28 at n = 2 / 3 / 4, K 3,072 1.15 / 1.20 / 1.24, K 2,048
 * 1.10 at n = 2, while batch 1 lost, 0.81-0.90); elsewhere cpu_gemv_pfd().
 * KILN_CPU_GEMV_PFD_BATCH=N forces N bytes; chosen once, before any pool
 * job. */
static int gemv_pfd_batch = -1;

int cpu_gemv_pfd_batch(void) {
    if (gemv_pfd_batch < 0) gemv_pfd_batch = cpu_pfd_env(cpu_amd_avx512() ? 2048 : cpu_gemv_pfd(), "KILN_CPU_GEMV_PFD_BATCH");
    return gemv_pfd_batch;
}

int cpu_set_gemv_pfd_batch(int d) { return gemv_pfd_batch = cpu_pfd_lines(d); }

/* The batch-1 GEMV reads GEMV_R rows at a time, one activation load
 * serving GEMV_R rows (cpu.h), where a row's activations and weights
 * ((4 + weight size) x K bytes) overflow the L1 data cache: cpu_gemv_rows()
 * is that size in bytes (sysconf, else 32 KiB), 0 for never.
 * KILN_CPU_GEMV_ROWS=BYTES forces it; chosen once, before any pool job. */
static int gemv_rows_b = -1;

int cpu_gemv_rows(void) {
    if (gemv_rows_b >= 0) return gemv_rows_b;
    long l1 = 0;
#if defined(_SC_LEVEL1_DCACHE_SIZE)
    l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#endif
    int b = l1 >= 8192 && l1 <= (1L << 22) ? (int)l1 : 32768;
    const char *e = getenv("KILN_CPU_GEMV_ROWS");
    if (e && *e) b = atoi(e);
    return gemv_rows_b = b < 0 ? 0 : b;
}

int cpu_set_gemv_rows(int bytes) { return gemv_rows_b = bytes < 0 ? 0 : bytes; }

#if defined(KILN_X86)
/* Rows r + q sd (q < R) of out[t][.] = W . x[t] + bias for nx activation
 * rows (R, nx compile-time: the accumulators stay in registers; sd 1 for
 * adjacent rows), one 64-byte
 * line of each row per step: each activation load serves the R rows, and
 * each row keeps the accumulators, steps, tail and reduction it has with
 * R = 1, so every R gives the same bits (test_cpu_kernels). */
#define GEMV_ROWS_AVX512(NAME, WT, LOAD, LOADM)                                                                   \
    AVX512 static inline __attribute__((always_inline)) void NAME(const uint8_t *W, size_t rb, const float *x, int nx, \
                                                                  int R, int n_in, int64_t r, const float *bias,   \
                                                                  float *out, int n_out, int pfd, int64_t sd) {    \
        enum { V = 64 / (16 * (int)sizeof(WT)) }; /* vectors of 16 weights per cache line: 2 (16-bit), 1 (f32) */ \
        const WT *w[GEMV_R];                                                                                      \
        __m512 a[GEMV_R][4][2];                                                                                   \
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {                                                     \
            w[q] = (const WT *)(W + (size_t)(r + q * sd) * rb);                                                   \
            _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++) a[q][j][0] = a[q][j][1] = _mm512_setzero_ps();   \
        }                                                                                                         \
        int i = 0;                                                                                                \
        for (; i + 16 * V <= n_in; i += 16 * V) {                                                                 \
            __m512 x0[4], x1[4];                                                                                  \
            _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++) {                                                \
                x0[j] = _mm512_loadu_ps(x + (size_t)j * n_in + i);                                                \
                x1[j] = V > 1 ? _mm512_loadu_ps(x + (size_t)j * n_in + i + 16) : x0[j];                           \
            }                                                                                                     \
            _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {                                                 \
                if (pfd) _mm_prefetch((const char *)(w[q] + i) + pfd, _MM_HINT_T0);                              \
                const __m512 w0 = LOAD(w[q] + i), w1 = V > 1 ? LOAD(w[q] + i + 16) : w0;                          \
                _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++) {                                            \
                    a[q][j][0] = _mm512_fmadd_ps(w0, x0[j], a[q][j][0]);                                          \
                    if (V > 1) a[q][j][1] = _mm512_fmadd_ps(w1, x1[j], a[q][j][1]);                               \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
        for (; i < n_in; i += 16) {                                                                               \
            int rem = n_in - i;                                                                                   \
            __mmask16 m = rem >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rem) - 1);                            \
            _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {                                                 \
                const __m512 w0 = LOADM(w[q] + i, m);                                                             \
                _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++)                                              \
                    a[q][j][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x + (size_t)j * n_in + i), a[q][j][0]); \
            }                                                                                                     \
        }                                                                                                         \
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++)                                                       \
            _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++)                                                  \
                out[(size_t)j * n_out + r + q * sd] = _mm512_reduce_add_ps(_mm512_add_ps(a[q][j][0], a[q][j][1])) + \
                                                 (bias ? bias[r + q * sd] : 0.0f);                                \
    }

/* The same for AVX2: 32 weights per step into 4 accumulators per row and
 * activation row; the tail (n_in % 32) through the scalar dot. R x nx is at
 * most 4 (16 accumulators: with R = 4 the compiler keeps some in memory,
 * still 1.3-1.4x R = 1 at K >= 6,144 on a Zen 4, docs/cpu.md). */
#define GEMV_ROWS_AVX2(NAME, WT, LOAD, SCALAR)                                                                    \
    AVX2 static inline __attribute__((always_inline)) void NAME(const uint8_t *W, size_t rb, const float *x, int nx,   \
                                                                int R, int n_in, int64_t r, const float *bias,     \
                                                                float *out, int n_out, int pfd, int64_t sd) {      \
        const WT *w[GEMV_R];                                                                                      \
        __m256 a[GEMV_R][2][4];                                                                                   \
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {                                                     \
            w[q] = (const WT *)(W + (size_t)(r + q * sd) * rb);                                                   \
            _Pragma("GCC unroll 2") for (int j = 0; j < nx; j++) a[q][j][0] = a[q][j][1] = a[q][j][2] = a[q][j][3] = _mm256_setzero_ps(); \
        }                                                                                                         \
        const int n32 = n_in & ~31;                                                                               \
        for (int i = 0; i < n32; i += 32) {                                                                       \
            _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {                                                 \
                for (int c = 0; pfd && c < 32 * (int)sizeof(WT); c += 64)                                         \
                    _mm_prefetch((const char *)(w[q] + i) + c + pfd, _MM_HINT_T0);                               \
                const __m256 w0 = LOAD(w[q] + i), w1 = LOAD(w[q] + i + 8), w2 = LOAD(w[q] + i + 16), w3 = LOAD(w[q] + i + 24); \
                _Pragma("GCC unroll 2") for (int j = 0; j < nx; j++) {                                            \
                    const float *xj = x + (size_t)j * n_in + i;                                                   \
                    a[q][j][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xj), a[q][j][0]);                            \
                    a[q][j][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xj + 8), a[q][j][1]);                        \
                    a[q][j][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xj + 16), a[q][j][2]);                       \
                    a[q][j][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xj + 24), a[q][j][3]);                       \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++)                                                       \
            _Pragma("GCC unroll 2") for (int j = 0; j < nx; j++) {                                                \
                float t = 0;                                                                                      \
                if (n32 < n_in) {                                                                                 \
                    const float *xt = x + (size_t)j * n_in + n32;                                                 \
                    SCALAR((const void *)(w[q] + n32), &xt, 1, n_in - n32, &t);                                   \
                }                                                                                                 \
                out[(size_t)j * n_out + r + q * sd] =                                                             \
                    kiln_hsum8(_mm256_add_ps(_mm256_add_ps(a[q][j][0], a[q][j][1]), _mm256_add_ps(a[q][j][2], a[q][j][3]))) + t + \
                    (bias ? bias[r + q * sd] : 0.0f);                                                             \
            }                                                                                                     \
    }

GEMV_ROWS_AVX512(rows_f32_avx512, float, load16_f32, load16m_f32)
GEMV_ROWS_AVX512(rows_bf16_avx512, uint16_t, load16_bf16, load16m_bf16)
GEMV_ROWS_AVX512(rows_f16_avx512, uint16_t, load16_f16, load16m_f16)
GEMV1(gemv1_f32_avx512, AVX512, rows_f32_avx512, 4, cpu_gemv_pfd(), 0)
GEMV1(gemv1_bf16_avx512, AVX512, rows_bf16_avx512, 4, cpu_gemv_pfd(), 0)
GEMV1(gemv1_f16_avx512, AVX512, rows_f16_avx512, 4, cpu_gemv_pfd(), 0)
GEMV_ROWS_AVX2(rows_f32_avx2, float, load8_f32, dot_f32_scalar)
GEMV_ROWS_AVX2(rows_bf16_avx2, uint16_t, load8_bf16, dot_bf16_scalar)
GEMV_ROWS_AVX2(rows_f16_avx2, uint16_t, load8_f16, dot_f16_scalar)
GEMV1(gemv1_f32_avx2, AVX2, rows_f32_avx2, 2, cpu_gemv_pfd(), 0)
GEMV1(gemv1_bf16_avx2, AVX2, rows_bf16_avx2, 2, cpu_gemv_pfd(), 0)
GEMV1(gemv1_f16_avx2, AVX2, rows_f16_avx2, 2, cpu_gemv_pfd(), 0)

#endif /* KILN_X86 */

#if defined(KILN_NEON)
/* ==== NEON (AArch64) ==== */

static inline float32x4_t load4_f32(const float *p) { return vld1q_f32(p); }

/* dot of one weight row with 1..4 activation rows: 8 weights per step, two
 * accumulators per activation row (as DOT_AVX2); instantiated per nx so
 * that the accumulators stay in registers (with nx a variable gcc kept
 * them on the stack: a load and a store per 8 weights) */
#define DOT_NEON(NAME, WT, LOAD, SCALAR)                                                            \
    static inline __attribute__((always_inline)) void NAME##_(const WT *w, const float *const *x,   \
                                                              int nx, int n_in, float *out) {      \
        int i = 0, n8 = n_in & ~7;                                                                  \
        float32x4_t a[4][2];                                                                        \
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) a[j][0] = a[j][1] = vdupq_n_f32(0);     \
        for (; i < n8; i += 8) {                                                                    \
            float32x4_t w0 = LOAD(w + i), w1 = LOAD(w + i + 4);                                     \
            _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++) {                                  \
                a[j][0] = vfmaq_f32(a[j][0], w0, vld1q_f32(x[j] + i));                              \
                a[j][1] = vfmaq_f32(a[j][1], w1, vld1q_f32(x[j] + i + 4));                          \
            }                                                                                       \
        }                                                                                           \
        _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++) {                                      \
            float s = vaddvq_f32(vaddq_f32(a[j][0], a[j][1]));                                      \
            float t;                                                                                \
            const float *xt = x[j] + i;                                                             \
            SCALAR((const void *)(w + i), &xt, 1, n_in - i, &t);                                    \
            out[j] = s + t;                                                                         \
        }                                                                                           \
    }                                                                                               \
    static void NAME(const void *row, const float *const *x, int nx, int n_in, float *out) {        \
        switch (nx) {                                                                               \
        case 1: NAME##_(row, x, 1, n_in, out); break;                                               \
        case 2: NAME##_(row, x, 2, n_in, out); break;                                               \
        case 3: NAME##_(row, x, 3, n_in, out); break;                                               \
        default: NAME##_(row, x, 4, n_in, out); break;                                              \
        }                                                                                           \
    }

DOT_NEON(dot_f32_neon, float, load4_f32, dot_f32_scalar)
DOT_NEON(dot_bf16_neon, uint16_t, kiln_bf16x4, dot_bf16_scalar)
DOT_NEON(dot_f16_neon, uint16_t, kiln_f16x4, dot_f16_scalar)

/* decode GEMV (one activation row): one weight row at a time, 32 weights
 * per step into 4 accumulators of 2 x 4 lanes, prefetch GEMV_PFD ahead
 * (as GEMV1_AVX2); the tail (n_in % 32) through the scalar dot */
#define GEMV1_NEON(NAME, WT, LOAD, SCALAR)                                                                        \
    static inline __attribute__((always_inline)) void NAME##_(const uint8_t *W, size_t rb, const float *x, int nx,       \
                                                              int n_in, int64_t r0, int64_t r1, const float *bias,      \
                                                              float *out, int n_out) {                                  \
        const int two_ = gemv_two(rb), pfd_ = cpu_gemv_pfd();                                                   \
        gemv_pf_start(W, rb, r0, r1, two_, pfd_);                                                                 \
        const int n32 = n_in & ~31;                                                                               \
        CPU_FOR_ROWS(r, r0, r1, two_) {                                                                          \
            const WT *w = (const WT *)(W + (size_t)r * rb);                                                       \
            float32x4_t a[2][8];                                                                                  \
            for (int j = 0; j < nx; j++)                                                                          \
                for (int u = 0; u < 8; u++) a[j][u] = vdupq_n_f32(0);                                             \
            for (int i = 0; i < n32; i += 32) {                                                                   \
                for (int c = 0; pfd_ && c < 32 * (int)sizeof(WT); c += 64)                                        \
                    _mm_prefetch((const char *)(w + i) + c + pfd_, _MM_HINT_T0);                                  \
                float32x4_t wv[8];                                                                                \
                _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) wv[u] = LOAD(w + i + 4 * u);                  \
                for (int j = 0; j < nx; j++) {                                                                    \
                    const float *xj = x + (size_t)j * n_in + i;                                                   \
                    _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) a[j][u] =                                 \
                        vfmaq_f32(a[j][u], wv[u], vld1q_f32(xj + 4 * u));                                         \
                }                                                                                                 \
            }                                                                                                     \
            for (int j = 0; j < nx; j++) {                                                                        \
                float t = 0;                                                                                      \
                if (n32 < n_in) {                                                                                 \
                    const float *xt = x + (size_t)j * n_in + n32;                                                 \
                    SCALAR((const void *)(w + n32), &xt, 1, n_in - n32, &t);                                      \
                }                                                                                                 \
                float32x4_t s = vaddq_f32(vaddq_f32(vaddq_f32(a[j][0], a[j][1]), vaddq_f32(a[j][2], a[j][3])),    \
                                          vaddq_f32(vaddq_f32(a[j][4], a[j][5]), vaddq_f32(a[j][6], a[j][7])));   \
                out[(size_t)j * n_out + r] = vaddvq_f32(s) + t + (bias ? bias[r] : 0.0f);                         \
            }                                                                                                     \
        }                                                                                                         \
    }                                                                                                             \
    static void NAME(const uint8_t *W, size_t rb, const float *x, int nx, int n_in, int64_t r0, int64_t r1,              \
                     const float *bias, float *out, int n_out) {                                                  \
        if (nx == 1) NAME##_(W, rb, x, 1, n_in, r0, r1, bias, out, n_out);                                        \
        else NAME##_(W, rb, x, 2, n_in, r0, r1, bias, out, n_out);                                               \
    }

GEMV1_NEON(gemv1_f32_neon, float, load4_f32, dot_f32_scalar)
GEMV1_NEON(gemv1_bf16_neon, uint16_t, kiln_bf16x4, dot_bf16_scalar)
GEMV1_NEON(gemv1_f16_neon, uint16_t, kiln_f16x4, dot_f16_scalar)
#endif /* KILN_NEON */

/* the most activation rows one gemv1 call takes (its registers) */
static int gemvm_max(void) { return cpu_isa() == CPU_ISA_AVX512 ? 4 : 2; }

static gemv1_fn gemv1_for(enum kiln_dtype t) {
    int v = cpu_isa();
    cpu_isa_note(v, 0);
#if defined(KILN_NEON)
    if (v >= CPU_ISA_NEON)
        return t == KILN_DTYPE_BF16 ? gemv1_bf16_neon : t == KILN_DTYPE_F16 ? gemv1_f16_neon : t == KILN_DTYPE_F32 ? gemv1_f32_neon : NULL;
    return NULL;
#elif !defined(KILN_X86)
    return (void)v, (void)t, NULL;
#else
    if (v == CPU_ISA_AVX512)
        return t == KILN_DTYPE_BF16 ? gemv1_bf16_avx512 : t == KILN_DTYPE_F16 ? gemv1_f16_avx512 : t == KILN_DTYPE_F32 ? gemv1_f32_avx512 : NULL;
    if (v == CPU_ISA_AVX2)
        return t == KILN_DTYPE_BF16 ? gemv1_bf16_avx2 : t == KILN_DTYPE_F16 ? gemv1_f16_avx2 : t == KILN_DTYPE_F32 ? gemv1_f32_avx2 : NULL;
    return NULL;
#endif
}

cpu_dot_fn cpu_dot_for(enum kiln_dtype t) {
    int v = cpu_isa();
    cpu_isa_note(v, 0);
#if defined(KILN_NEON)
    switch (t) {
    case KILN_DTYPE_F32: return v ? dot_f32_neon : dot_f32_scalar;
    case KILN_DTYPE_BF16: return v ? dot_bf16_neon : dot_bf16_scalar;
    case KILN_DTYPE_F16: return v ? dot_f16_neon : dot_f16_scalar;
    default: return NULL;
    }
#elif !defined(KILN_X86)
    (void)v;
    return t == KILN_DTYPE_F32 ? dot_f32_scalar : t == KILN_DTYPE_BF16 ? dot_bf16_scalar : t == KILN_DTYPE_F16 ? dot_f16_scalar : NULL;
#else
    switch (t) {
    case KILN_DTYPE_F32: return v == CPU_ISA_AVX512 ? dot_f32_avx512 : v ? dot_f32_avx2 : dot_f32_scalar;
    case KILN_DTYPE_BF16: return v == CPU_ISA_AVX512 ? dot_bf16_avx512 : v ? dot_bf16_avx2 : dot_bf16_scalar;
    case KILN_DTYPE_F16: return v == CPU_ISA_AVX512 ? dot_f16_avx512 : v ? dot_f16_avx2 : dot_f16_scalar;
    default: return NULL;
    }
#endif
}

void cpu_row_to_f32(float *dst, const void *src, enum kiln_dtype t, int64_t n) {
    switch (t) {
    case KILN_DTYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case KILN_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = kiln_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case KILN_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = kiln_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    default: quant_dequant_row(t, src, dst, n); /* GGUF blocks (a quantized embedding) */
    }
}

/* ==== GEMM: packing ==== */

enum { MR512 = 12, NR512 = 32, MR256 = 6, NR256 = 16, PACK_KB = 16 };
#if defined(KILN_NEON)
enum { MRNEON = CPU_NEON_MR, NRNEON = CPU_NEON_NR };
#endif

/* x rows [t0, t0+mr) -> xp[k][MR] (rows past mr are zero). k outer: xp is
 * written once, front to back, while the mr rows are read as mr sequential
 * streams (row-outer wrote xp with a stride of MR floats, MR passes over it:
 * 4.6% of an F16 pp512 profile on Qwen3-0.6B) */
static void pack_x(float *xp, const float *x, int n_in, int t0, int mr, int MR) {
    const float *xr[MR512];
    for (int r = 0; r < mr; r++) xr[r] = x + (size_t)(t0 + r) * n_in;
    for (int k = 0; k < n_in; k++, xp += MR) {
        int r = 0;
        for (; r < mr; r++) xp[r] = xr[r][k];
        for (; r < MR; r++) xp[r] = 0;
    }
}

/* weight rows [o0, o0+nr) of W (stored dtype) -> wp[k][NR] f32 (rows past nr
 * are zero). Generic: widen a PACK_KB-long piece of each row into tmp, then
 * transpose it. */
static void pack_w_generic(float *wp, const uint8_t *W, enum kiln_dtype t, size_t rb, int n_in, int o0, int nr, int NR) {
    float tmp[NR512][PACK_KB];
    for (int k0 = 0; k0 < n_in; k0 += PACK_KB) {
        int kk = n_in - k0 < PACK_KB ? n_in - k0 : PACK_KB;
        for (int j = 0; j < nr; j++)
            cpu_row_to_f32(tmp[j], W + (size_t)(o0 + j) * rb + (size_t)k0 * dtype_size(t), t, kk);
        for (int k = 0; k < kk; k++) {
            float *d = wp + (size_t)(k0 + k) * NR;
            for (int j = 0; j < nr; j++) d[j] = tmp[j][k];
            for (int j = nr; j < NR; j++) d[j] = 0;
        }
    }
}

#if defined(KILN_X86)
/* AVX2 (also used on AVX-512 machines): widen 8 k of 8 rows at a time and
 * transpose the 8 x 8 block in registers; the k tail and a partial panel
 * (nr < NR) go through the generic path. */

#define PACK_T8(LOAD, T)                                                                          \
    for (; k0 + 8 <= n_in; k0 += 8)                                                               \
        for (int jb = 0; jb < NR; jb += 8) {                                                      \
            __m256 r[8];                                                                          \
            for (int j = 0; j < 8; j++) r[j] = LOAD((const T *)(W + (size_t)(o0 + jb + j) * rb) + k0); \
            kiln_transpose8(r);                                                                        \
            for (int k = 0; k < 8; k++) _mm256_store_ps(wp + (size_t)(k0 + k) * NR + jb, r[k]);   \
        }

AVX2 static void pack_w_avx2(float *wp, const uint8_t *W, enum kiln_dtype t, size_t rb, int n_in, int o0, int nr, int NR) {
    if (nr < NR) {
        pack_w_generic(wp, W, t, rb, n_in, o0, nr, NR);
        return;
    }
    int k0 = 0;
    if (t == KILN_DTYPE_BF16) {
        PACK_T8(load8_bf16, uint16_t)
    } else if (t == KILN_DTYPE_F16) {
        PACK_T8(load8_f16, uint16_t)
    } else {
        PACK_T8(load8_f32, float)
    }
    if (k0 < n_in) {
        float tmp[NR512];
        for (; k0 < n_in; k0++) {
            for (int j = 0; j < NR; j++) cpu_row_to_f32(tmp + j, W + (size_t)(o0 + j) * rb + (size_t)k0 * dtype_size(t), t, 1);
            memcpy(wp + (size_t)k0 * NR, tmp, sizeof(float) * (size_t)NR);
        }
    }
}

/* ==== GEMM: microkernels ==== */

/* c[r][0..nr) = sum_k xp[k][r] * wp[k][0..NR) + bias, rows r < mr */
AVX512 static void ukr_avx512(const float *xp, const float *wp, int K, float *c, size_t ldc, int mr, int nr,
                              const float *bias) {
    __m512 acc[MR512][2];
#pragma GCC unroll 12
    for (int r = 0; r < MR512; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        __m512 w0 = _mm512_load_ps(wp), w1 = _mm512_load_ps(wp + 16);
#pragma GCC unroll 12
        for (int r = 0; r < MR512; r++) {
            __m512 b = _mm512_set1_ps(xp[r]);
            acc[r][0] = _mm512_fmadd_ps(b, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(b, w1, acc[r][1]);
        }
        wp += NR512;
        xp += MR512;
    }
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? (__mmask16)0xffff : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
    __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
    /* constant indices only (unrolled): acc stays in registers in the k loop */
#pragma GCC unroll 12
    for (int r = 0; r < MR512; r++)
        if (r < mr) {
            _mm512_mask_storeu_ps(c + (size_t)r * ldc, m0, _mm512_add_ps(acc[r][0], b0));
            _mm512_mask_storeu_ps(c + (size_t)r * ldc + 16, m1, _mm512_add_ps(acc[r][1], b1));
        }
}

AVX2 static void ukr_avx2(const float *xp, const float *wp, int K, float *c, size_t ldc, int mr, int nr,
                          const float *bias) {
    __m256 acc[MR256][2];
#pragma GCC unroll 6
    for (int r = 0; r < MR256; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        __m256 w0 = _mm256_load_ps(wp), w1 = _mm256_load_ps(wp + 8);
#pragma GCC unroll 6
        for (int r = 0; r < MR256; r++) {
            __m256 b = _mm256_broadcast_ss(xp + r);
            acc[r][0] = _mm256_fmadd_ps(b, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(b, w1, acc[r][1]);
        }
        wp += NR256;
        xp += MR256;
    }
    /* constant indices only (unrolled): acc stays in registers in the k loop */
    float tile[MR256][NR256] __attribute__((aligned(32)));
#pragma GCC unroll 6
    for (int r = 0; r < MR256; r++) {
        _mm256_store_ps(tile[r], acc[r][0]);
        _mm256_store_ps(tile[r] + 8, acc[r][1]);
    }
    for (int r = 0; r < mr; r++) {
        float *cr = c + (size_t)r * ldc;
        for (int j = 0; j < nr; j++) cr[j] = tile[r][j] + (bias ? bias[j] : 0.0f);
    }
}

#endif /* KILN_X86 */

#if defined(KILN_NEON)
/* NEON: 4 k of 4 rows widened and transposed in registers (two zip
 * steps); the k tail and a partial panel go through the generic path */
#define PACK_T4(LOAD, T)                                                                                     \
    for (; k0 + 4 <= n_in; k0 += 4)                                                                          \
        for (int jb = 0; jb < NR; jb += 4) {                                                                 \
            float32x4_t r0 = LOAD((const T *)(W + (size_t)(o0 + jb) * rb) + k0);                             \
            float32x4_t r1 = LOAD((const T *)(W + (size_t)(o0 + jb + 1) * rb) + k0);                         \
            float32x4_t r2 = LOAD((const T *)(W + (size_t)(o0 + jb + 2) * rb) + k0);                         \
            float32x4_t r3 = LOAD((const T *)(W + (size_t)(o0 + jb + 3) * rb) + k0);                         \
            float32x4_t t0 = vzip1q_f32(r0, r2), t1 = vzip2q_f32(r0, r2), t2 = vzip1q_f32(r1, r3), t3 = vzip2q_f32(r1, r3); \
            vst1q_f32(wp + (size_t)(k0 + 0) * NR + jb, vzip1q_f32(t0, t2));                                  \
            vst1q_f32(wp + (size_t)(k0 + 1) * NR + jb, vzip2q_f32(t0, t2));                                  \
            vst1q_f32(wp + (size_t)(k0 + 2) * NR + jb, vzip1q_f32(t1, t3));                                  \
            vst1q_f32(wp + (size_t)(k0 + 3) * NR + jb, vzip2q_f32(t1, t3));                                  \
        }

static void pack_w_neon(float *wp, const uint8_t *W, enum kiln_dtype t, size_t rb, int n_in, int o0, int nr, int NR) {
    if (nr < NR) {
        pack_w_generic(wp, W, t, rb, n_in, o0, nr, NR);
        return;
    }
    int k0 = 0;
    if (t == KILN_DTYPE_BF16) {
        PACK_T4(kiln_bf16x4, uint16_t)
    } else if (t == KILN_DTYPE_F16) {
        PACK_T4(kiln_f16x4, uint16_t)
    } else {
        PACK_T4(load4_f32, float)
    }
    for (; k0 < n_in; k0++)
        for (int j = 0; j < NR; j++) cpu_row_to_f32(wp + (size_t)k0 * NR + j, W + (size_t)(o0 + j) * rb + (size_t)k0 * dtype_size(t), t, 1);
}

void cpu_neon_pack_f32(float *wp, const float *rows, int K, int nr) {
    pack_w_neon(wp, (const uint8_t *)rows, KILN_DTYPE_F32, sizeof(float) * (size_t)K, K, 0, nr, NRNEON);
}

/* c[r][0..nr) = sum_k xp[k][r] * wp[k][0..12) + bias, rows r < mr: 8 x 12
 * in 24 accumulators, per k 3 weight loads, 2 activation loads and 24
 * lane-indexed FMAs (no broadcasts) */
void cpu_neon_ukr(const float *xp, const float *wp, int K, float *c, size_t ldc, int mr, int nr, const float *bias) {
    float32x4_t acc[MRNEON][3];
#pragma GCC unroll 8
    for (int r = 0; r < MRNEON; r++) acc[r][0] = acc[r][1] = acc[r][2] = vdupq_n_f32(0);
    for (int k = 0; k < K; k++) {
        float32x4_t w0 = vld1q_f32(wp), w1 = vld1q_f32(wp + 4), w2 = vld1q_f32(wp + 8);
        float32x4_t x0 = vld1q_f32(xp), x1 = vld1q_f32(xp + 4);
#define UKR_ROW(r, xv, l)                                   \
    acc[r][0] = vfmaq_laneq_f32(acc[r][0], w0, xv, l);      \
    acc[r][1] = vfmaq_laneq_f32(acc[r][1], w1, xv, l);      \
    acc[r][2] = vfmaq_laneq_f32(acc[r][2], w2, xv, l);
        UKR_ROW(0, x0, 0) UKR_ROW(1, x0, 1) UKR_ROW(2, x0, 2) UKR_ROW(3, x0, 3)
        UKR_ROW(4, x1, 0) UKR_ROW(5, x1, 1) UKR_ROW(6, x1, 2) UKR_ROW(7, x1, 3)
#undef UKR_ROW
        wp += NRNEON;
        xp += MRNEON;
    }
    /* constant indices only (unrolled): acc stays in registers in the k loop */
    float tile[MRNEON][NRNEON];
#pragma GCC unroll 8
    for (int r = 0; r < MRNEON; r++) vst1q_f32(tile[r], acc[r][0]), vst1q_f32(tile[r] + 4, acc[r][1]), vst1q_f32(tile[r] + 8, acc[r][2]);
    for (int r = 0; r < mr; r++) {
        float *cr = c + (size_t)r * ldc;
        for (int j = 0; j < nr; j++) cr[j] = tile[r][j] + (bias ? bias[j] : 0.0f);
    }
}
#endif /* KILN_NEON */

/* per-call scratch kept in the backend context: the packed activations,
 * then one weight panel per thread */
static float *scratch(struct kiln_backend *be, size_t floats) {
    struct cpu_ctx *c = be->ctx;
    if (floats > c->scratch_cap) {
        free(c->scratch);
        c->scratch_cap = 0;
        if (!(c->scratch = cpu_scratch_alloc(be, floats * sizeof(float)))) return NULL; /* reported by cpu_error */
        c->scratch_cap = floats;
    }
    return c->scratch;
}

struct mm_job {
    float *out, *xp, *wp;
    const float *x, *bias;
    const uint8_t *W;
    enum kiln_dtype dt;
    size_t rb, wp_sz;
    int n, n_in, n_out, MR, NR, isa;
    cpu_dot_fn dot;
    gemv1_fn gemv1;
    int mx;  /* activation rows per gemv1 call */
    int b12; /* W holds 12-bit BF16 rows (b12.c) */
};

static void gemm_pack_x(void *arg, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct mm_job *j = arg;
    for (int64_t tb = b; tb < e; tb++) {
        int t0 = (int)tb * j->MR, mr = j->n - t0 < j->MR ? j->n - t0 : j->MR;
        pack_x(j->xp + (size_t)tb * j->MR * j->n_in, j->x, j->n_in, t0, mr, j->MR);
    }
}

/* a dense linear's rows and their stride in bytes: its 12-bit copy
 * (b12.c, qlinear.be) or the stored weight */
static const uint8_t *dense_rows(const struct qlinear *w, size_t *rb) {
    const struct cpu_b12 *b = w->be;
    *rb = b ? b->rb : (size_t)w->n_in * dtype_size(w->w.dtype);
    return b ? b->data : w->w.data;
}

static void pack_w(float *wp, const uint8_t *W, enum kiln_dtype t, size_t rb, int n_in, int o0, int nr, int NR) {
#if defined(KILN_NEON)
    pack_w_neon(wp, W, t, rb, n_in, o0, nr, NR);
#elif defined(KILN_X86)
    pack_w_avx2(wp, W, t, rb, n_in, o0, nr, NR);
#else
    pack_w_generic(wp, W, t, rb, n_in, o0, nr, NR);
#endif
}

/* the same from 12-bit BF16 rows (b12.c): B12_KC columns of the nr rows
 * decoded to f32 at a time (exactly the widened bf16), then packed as F32
 * rows of B12_KC */
enum { B12_KC = 256 };
static void pack_w_b12(float *wp, const uint8_t *W, size_t rb, int n_in, int o0, int nr, int NR) {
    float tmp[NR512 * B12_KC];
    for (int k0 = 0; k0 < n_in; k0 += B12_KC) {
        const int kc = n_in - k0 < B12_KC ? n_in - k0 : B12_KC;
        for (int r = 0; r < nr; r++) cpu_b12_decode_f32(W + (size_t)(o0 + r) * rb, n_in, k0, kc, tmp + (size_t)r * B12_KC);
        pack_w(wp + (size_t)k0 * NR, (const uint8_t *)tmp, KILN_DTYPE_F32, sizeof(float) * B12_KC, kc, 0, nr, NR);
    }
}

static void gemm_panels(void *arg, int64_t b, int64_t e, int tid) {
    const struct mm_job *j = arg;
    const int MR = j->MR, NR = j->NR, n = j->n, n_in = j->n_in, n_out = j->n_out;
    const int n_tb = (n + MR - 1) / MR;
    float *wp = j->wp + (size_t)tid * j->wp_sz;
    for (int64_t ob = b; ob < e; ob++) {
        int o0 = (int)ob * NR, nr = n_out - o0 < NR ? n_out - o0 : NR;
        const float *bo = j->bias ? j->bias + o0 : NULL;
        if (j->b12) pack_w_b12(wp, j->W, j->rb, n_in, o0, nr, NR);
        else pack_w(wp, j->W, j->dt, j->rb, n_in, o0, nr, NR);
        /* the next panel's weight rows (same thread) are prefetched into L2
         * a slice per row panel, so its packing does not wait on DRAM */
        const int pf_rows = ob + 1 < e ? (n_out - o0 - nr < NR ? n_out - o0 - nr : NR) : 0;
        const size_t lpr = (j->rb + 63) / 64, pf_lines = (size_t)pf_rows * lpr;
        const uint8_t *pf_w = j->W + (size_t)(o0 + nr) * j->rb;
        for (int tb = 0; tb < n_tb; tb++) {
            for (size_t i = pf_lines * tb / n_tb; i < pf_lines * (tb + 1) / n_tb; i++)
                _mm_prefetch((const char *)(pf_w + (i / lpr) * j->rb + (i % lpr) * 64), _MM_HINT_T1);
            int t0 = tb * MR, mr = n - t0 < MR ? n - t0 : MR;
            const float *xp = j->xp + (size_t)tb * MR * n_in;
            float *c = j->out + (size_t)t0 * n_out + o0;
#if defined(KILN_NEON)
            cpu_neon_ukr(xp, wp, n_in, c, n_out, mr, nr, bo);
#elif defined(KILN_X86)
            if (j->isa == CPU_ISA_AVX512) ukr_avx512(xp, wp, n_in, c, n_out, mr, nr, bo);
            else ukr_avx2(xp, wp, n_in, c, n_out, mr, nr, bo);
#endif
        }
    }
}

static void gemm(struct kiln_backend *be, float *out, const float *x, const struct qlinear *w, int n, int isa) {
    struct mm_job j = {.out = out, .x = x, .dt = w->w.dtype, .n = n, .n_in = w->n_in, .n_out = w->n_out, .isa = isa,
                       .bias = w->bias.data ? cpu_vec(&w->bias) : NULL, .b12 = w->be != NULL};
    j.W = dense_rows(w, &j.rb);
    cpu_isa_note(isa, 0);
    j.MR = isa == CPU_ISA_AVX512 ? MR512 : MR256, j.NR = isa == CPU_ISA_AVX512 ? NR512 : NR256;
#if defined(KILN_NEON)
    j.MR = MRNEON, j.NR = NRNEON;
#endif
    const int n_tb = (n + j.MR - 1) / j.MR, n_ob = (j.n_out + j.NR - 1) / j.NR;
    const size_t xp_sz = ((size_t)n_tb * j.MR * j.n_in + 15) & ~(size_t)15;
    j.wp_sz = ((size_t)j.NR * j.n_in + 15) & ~(size_t)15;
    int nth = cpu_n_threads(be);
    if (!(j.xp = scratch(be, xp_sz + (size_t)nth * j.wp_sz))) return;
    j.wp = j.xp + xp_sz;
    cpu_parallel_for(be, n_tb, 4, gemm_pack_x, &j);
    /* output panels in small contiguous runs: each thread streams its own
     * weight rows; a thread that runs late takes fewer */
    int64_t chunk = n_ob / (nth * 4);
    cpu_parallel_for(be, n_ob, chunk < 1 ? 1 : chunk, gemm_panels, &j);
}

/* ==== GEMV (and the scalar path at any n) ==== */

static void gemv_rows(void *arg, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct mm_job *j = arg;
    const int n = j->n, n_in = j->n_in, n_out = j->n_out;
    if (j->gemv1) { /* up to gemvm_max rows of x per pass over the weights */
        for (int t = 0; t < n; t += j->mx) {
            const int nx = n - t < j->mx ? n - t : j->mx;
            j->gemv1(j->W, j->rb, j->x + (size_t)t * n_in, nx, n_in, b, e, j->bias, j->out + (size_t)t * n_out, n_out);
        }
        return;
    }
    for (int64_t r = b; r < e; r++) {
        const void *row = j->W + (size_t)r * j->rb;
        float bb = j->bias ? j->bias[r] : 0.0f;
        for (int t = 0; t < n; t += 4) {
            int nx = n - t < 4 ? n - t : 4;
            const float *xs[4];
            float o[4];
            for (int q = 0; q < nx; q++) xs[q] = j->x + (size_t)(t + q) * n_in;
            j->dot(row, xs, nx, n_in, o);
            for (int q = 0; q < nx; q++) j->out[(size_t)(t + q) * n_out + r] = o[q] + bb;
        }
    }
}

/* count linears of one dtype and width sharing x (one for a plain matmul):
 * their rows laid end to end, one contiguous run per thread, walked and
 * stolen from in chunks of cpu_split_chunk (~256 KiB of weights) */
static void gemv(struct kiln_backend *be, float *const *outs, const float *x, const struct qlinear *const *ws, int count, int n,
                 cpu_dot_fn dot) {
    struct mm_job j[MULTI_MAX];
    struct cpu_task t[MULTI_MAX];
    int64_t rows = 0;
    cpu_gemv_streams(), cpu_gemv_pfd(), cpu_gemv_pfd_batch(), cpu_gemv_rows(), cpu_b12_pfd(), cpu_b12_pairs2(); /* chosen here, on the calling thread, before the kernels read them */
    for (int i = 0; i < count; i++) {
        const struct qlinear *w = ws[i];
        const int b12 = w->be != NULL;
        j[i] = (struct mm_job){.out = outs[i], .x = x, .dt = w->w.dtype, .n = n, .n_in = w->n_in, .n_out = w->n_out,
                               .bias = w->bias.data ? cpu_vec(&w->bias) : NULL, .dot = b12 ? cpu_b12_dot_scalar : dot,
                               .gemv1 = b12 ? cpu_b12_gemv1() : gemv1_for(w->w.dtype), .mx = gemvm_max(), .b12 = b12};
        j[i].W = dense_rows(w, &j[i].rb);
        t[i] = (struct cpu_task){gemv_rows, &j[i], w->n_out};
        rows += w->n_out;
    }
    if (count == 1) cpu_parallel_for_split(be, rows, cpu_split_chunk(be, rows, j[0].rb), gemv_rows, &j[0]);
    else cpu_parallel_for_split_tasks(be, t, count, j[0].rb);
}

/* ==== the op ==== */

enum { GEMM_MIN = 8 }; /* fewer activation rows: the weight-streaming GEMV */

void cpu_matmul(struct kiln_backend *be, void *out_, const void *x_, const struct qlinear *w, int n) {
    if (w->fmt != KILN_WFMT_DENSE) return cpu_qmatmul(be, out_, x_, w, n); /* quantized: qmatmul.c */
    int isa = cpu_isa();
    float *out = out_;
    if (isa != CPU_ISA_SCALAR && n >= GEMM_MIN) gemm(be, out, x_, w, n, isa);
    else gemv(be, &out, x_, &w, 1, n, cpu_dot_for(w->w.dtype));
}

void cpu_matmul_tasks(struct kiln_backend *be, const struct cpu_mm *t, int count) {
    int q = count > 1 && t[0].w->fmt != KILN_WFMT_DENSE;
    for (int i = 1; i < count && q; i++) q = t[i].w->fmt == t[0].w->fmt;
    if (q && cpu_qmatmul_tasks(be, t, count)) return;
    for (int i = 0; i < count; i++) cpu_matmul(be, t[i].out, t[i].x, t[i].w, t[i].n);
}

/* q/k/v or gate/up of a decode step: one pool job instead of one per
 * linear (each job costs a start and a join, ~190 of them per token) */
void cpu_matmul_multi(struct kiln_backend *be, void *const *outs, const void *x, const struct qlinear *const *ws, int count,
                      int n) {
    int same = count <= MULTI_MAX;
    for (int i = 1; i < count && same; i++)
        same = ws[i]->fmt == ws[0]->fmt && ws[i]->w.dtype == ws[0]->w.dtype && ws[i]->n_in == ws[0]->n_in &&
               (ws[0]->fmt != KILN_WFMT_DENSE || !ws[i]->be == !ws[0]->be); /* all in 12 bits or none */
    if (same && ws[0]->fmt == KILN_WFMT_DENSE && (n < GEMM_MIN || cpu_isa() == CPU_ISA_SCALAR)) {
        gemv(be, (float *const *)outs, x, ws, count, n, cpu_dot_for(ws[0]->w.dtype));
        return;
    }
    if (same && ws[0]->fmt != KILN_WFMT_DENSE && cpu_qmatmul_multi(be, (float *const *)outs, x, ws, count, n)) return;
    for (int i = 0; i < count; i++) cpu_matmul(be, outs[i], x, ws[i], n);
}
