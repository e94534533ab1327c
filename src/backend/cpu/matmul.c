/*
 * matmul.c: y = x W^T + b on the CPU for dense weights (F32, F16, BF16).
 *
 * Decomposition: OpenMP splits the n_out weight rows across threads; each
 * thread streams its rows once and, for every row, takes the dot product with
 * up to four activation rows at a time, so at prefill each weight row is read
 * from memory once per four tokens rather than once per token. The dot
 * kernels come in an AVX2+FMA+F16C flavour, picked at run time when the CPU
 * has it, and a portable scalar flavour; both accumulate in f32.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "base/base.h"

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

/* ==== AVX2 + FMA (+ F16C) ==== */

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

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
            float s = hsum8(_mm256_add_ps(a[j][0], a[j][1]));                                       \
            float t;                                                                                \
            const float *xt = x[j] + i;                                                             \
            SCALAR((const void *)(w + i), &xt, 1, n_in - i, &t);                                    \
            out[j] = s + t;                                                                         \
        }                                                                                           \
    }

DOT_AVX2(dot_f32_avx2, float, load8_f32, dot_f32_scalar)
DOT_AVX2(dot_bf16_avx2, uint16_t, load8_bf16, dot_bf16_scalar)
DOT_AVX2(dot_f16_avx2, uint16_t, load8_f16, dot_f16_scalar)

static int have_avx2(void) {
    static int v = -1;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !getenv("KILN_NO_SIMD");
    }
    return v;
}

cpu_dot_fn cpu_dot_for(enum kiln_dtype t) {
    int v = have_avx2();
    switch (t) {
    case KILN_DTYPE_F32: return v ? dot_f32_avx2 : dot_f32_scalar;
    case KILN_DTYPE_BF16: return v ? dot_bf16_avx2 : dot_bf16_scalar;
    case KILN_DTYPE_F16: return v ? dot_f16_avx2 : dot_f16_scalar;
    default: return NULL;
    }
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
    default: memset(dst, 0, (size_t)n * 4);
    }
}

/* ==== the op ==== */

void cpu_matmul(struct kiln_backend *be, void *out_, const void *x_, const struct qlinear *w, int n) {
    (void)be;
    float *out = out_;
    const float *x = x_;
    const int n_in = w->n_in, n_out = w->n_out;
    const size_t rb = (size_t)n_in * dtype_size(w->w.dtype);
    const uint8_t *W = w->w.data;
    const float *bias = w->bias.data ? cpu_vec(&w->bias) : NULL;
    cpu_dot_fn dot = cpu_dot_for(w->w.dtype);

#pragma omp parallel for schedule(static)
    for (int r = 0; r < n_out; r++) {
        const void *row = W + (size_t)r * rb;
        float b = bias ? bias[r] : 0.0f;
        for (int t = 0; t < n; t += 4) {
            int nx = n - t < 4 ? n - t : 4;
            const float *xs[4];
            float o[4];
            for (int j = 0; j < nx; j++) xs[j] = x + (size_t)(t + j) * n_in;
            dot(row, xs, nx, n_in, o);
            for (int j = 0; j < nx; j++) out[(size_t)(t + j) * n_out + r] = o[j] + b;
        }
    }
}
