/*
 * qmatmul_exact.c: the exact path of the quantized matmul (qmatmul.c's
 * header comment, "exact"): FP8 blocks, GPTQ / AWQ groups the int8 path does
 * not take, and everything (every GGUF block type too) under KILN_QACT=f32.
 * f32 activations times the weights dequantized to f32
 * as stored: decode (n <= 4) fuses the dequantization into the FMAs (AVX2,
 * NEON; AVX-512 one-row and lookup kernels for 4-bit groups), prefill
 * (n >= 8) is a GEMM over dequantized f32 panels (AVX2, AVX-512 here; NEON
 * with matmul.c's microkernel and panel packing, cpu_neon_*), and the rest
 * (scalar, n 5..7, GGUF decode) dequantizes a row to scratch (vector
 * dequantization from AVX2 / NEON) for matmul.c's f32 dot.
 */
#include "backend/cpu/qmatmul_internal.h"

float qm_fp8_lut[256];

/* ==== exact path: one row dequantized to scratch ==== */

static void row_fp8(const struct qlinear *w, const struct qprep *p, int r, float *y) {
    const uint8_t *q = (const uint8_t *)w->w.data + (size_t)r * w->n_in;
    const float *s = p->fp8_scale + (size_t)(r / w->block_n) * w->scales.cols;
    for (int k0 = 0, b = 0; k0 < w->n_in; k0 += w->block_k, b++) {
        int k1 = k0 + w->block_k < w->n_in ? k0 + w->block_k : w->n_in;
        float sc = s[b];
        for (int k = k0; k < k1; k++) y[k] = qm_fp8_lut[q[k]] * sc;
    }
}

static void row_grp(const struct qgrp *g, int r, float *y) {
    const uint8_t *q = g->q + (size_t)r * g->row_bytes;
    const float *sb = g->sb + (size_t)r * g->n_group * 2;
    for (int gi = 0; gi < g->n_group; gi++) {
        int a = g->gstart[gi], e = g->gstart[gi + 1];
        float s = sb[2 * gi], b = sb[2 * gi + 1];
        int k = a;
        if (g->bits == 8) {
            for (; k < e; k++) y[k] = s * q[k] + b;
            continue;
        }
        for (; k < e && (k & 31); k++) y[k] = s * qgrp_code(g, r, k) + b;
        for (; k + 32 <= e; k += 32) {
            const uint8_t *c = q + (k >> 5) * 16;
            for (int i = 0; i < 16; i++) {
                y[k + i] = s * (c[i] & 15) + b;
                y[k + 16 + i] = s * (c[i] >> 4) + b;
            }
        }
        for (; k < e; k++) y[k] = s * qgrp_code(g, r, k) + b;
    }
}

/* The fused decode kernels (x86, NEON) are called through one of these: nx (1..4
 * activation rows) as a constant in each copy, so the accumulators stay in
 * registers */
#define BY_NX(CALL)         \
    switch (nx) {           \
    case 1: CALL(1); break; \
    case 2: CALL(2); break; \
    case 3: CALL(3); break; \
    default: CALL(4); break; \
    }

#if defined(KILN_X86)
/* AVX2 row dequantization. FP8: e4m3 bits moved into an f16 (sign, then
 * exponent+mantissa shifted left by 7) equal the value times 2^-8 for
 * normals and subnormals alike, so F16C converts 8 at a time and the 2^8
 * goes into the block scale. */
AVX2 static void row_fp8_avx2(const struct qlinear *w, const struct qprep *p, int r, float *y) {
    const uint8_t *q = (const uint8_t *)w->w.data + (size_t)r * w->n_in;
    const float *s = p->fp8_scale + (size_t)(r / w->block_n) * w->scales.cols;
    const __m128i m7f = _mm_set1_epi16(0x7f), m80 = _mm_set1_epi16(0x80);
    for (int k0 = 0, b = 0; k0 < w->n_in; k0 += w->block_k, b++) {
        int k1 = k0 + w->block_k < w->n_in ? k0 + w->block_k : w->n_in, k = k0;
        __m256 sc = _mm256_set1_ps(s[b] * 256.0f);
        for (; k + 8 <= k1; k += 8) {
            __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(q + k)));
            __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(v, m80), 8), _mm_slli_epi16(_mm_and_si128(v, m7f), 7));
            _mm256_storeu_ps(y + k, _mm256_mul_ps(_mm256_cvtph_ps(h), sc));
        }
        for (; k < k1; k++) y[k] = qm_fp8_lut[q[k]] * s[b];
    }
}

AVX2 static void row_grp_avx2(const struct qgrp *g, int r, float *y) {
    const uint8_t *q = g->q + (size_t)r * g->row_bytes;
    const float *sb = g->sb + (size_t)r * g->n_group * 2;
    const __m128i m4 = _mm_set1_epi8(15);
    for (int gi = 0; gi < g->n_group; gi++) {
        int a = g->gstart[gi], e = g->gstart[gi + 1], k = a;
        const float s = sb[2 * gi], b = sb[2 * gi + 1];
        const __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
#define CVT8(bytes) _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), vs, vb)
        if (g->bits == 8) {
            for (; k + 16 <= e; k += 16) {
                __m128i v = _mm_loadu_si128((const __m128i *)(q + k));
                _mm256_storeu_ps(y + k, CVT8(v));
                _mm256_storeu_ps(y + k + 8, CVT8(_mm_srli_si128(v, 8)));
            }
            for (; k < e; k++) y[k] = s * q[k] + b;
            continue;
        }
        for (; k < e && (k & 31); k++) y[k] = s * qgrp_code(g, r, k) + b;
        for (; k + 32 <= e; k += 32) {
            __m128i v = _mm_loadu_si128((const __m128i *)(q + (k >> 5) * 16));
            __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
            _mm256_storeu_ps(y + k, CVT8(lo));
            _mm256_storeu_ps(y + k + 8, CVT8(_mm_srli_si128(lo, 8)));
            _mm256_storeu_ps(y + k + 16, CVT8(hi));
            _mm256_storeu_ps(y + k + 24, CVT8(_mm_srli_si128(hi, 8)));
        }
#undef CVT8
        for (; k < e; k++) y[k] = s * qgrp_code(g, r, k) + b;
    }
}

/* Decode (n <= 4): the same arithmetic fused, without the scratch row: each
 * 8 dequantized weights go from registers straight into the FMAs of up to 4
 * activation rows. */
AVX2 static inline __attribute__((always_inline)) void fused_grp_avx2_(const struct qgrp *g, int r, const float *const *x, int nx, float *out) {
    const uint8_t *q = g->q + (size_t)r * g->row_bytes;
    const float *sb = g->sb + (size_t)r * g->n_group * 2;
    const __m128i m4 = _mm_set1_epi8(15);
    /* NA independent accumulators per activation row (4 at nx = 1): one
     * FMA chain per row would wait on the FMA latency at every step */
    enum { NA = 4 };
    const int na = nx == 1 ? 4 : nx == 2 ? 2 : 1;
    __m256 acc[4][NA];
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < NA; i++) acc[j][i] = _mm256_setzero_ps();
    float tail[4] = {0, 0, 0, 0};
#define STEP(bytes, off)                                                                                   \
    do {                                                                                                   \
        __m256 wv = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), vs, vb);             \
        _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++) acc[j][((off) / 8) % na] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[j] + k + (off)), acc[j][((off) / 8) % na]); \
    } while (0)
    for (int gi = 0; gi < g->n_group; gi++) {
        int a = g->gstart[gi], e = g->gstart[gi + 1], k = a;
        const float s = sb[2 * gi], b = sb[2 * gi + 1];
        const __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
        if (g->bits == 8) {
            for (; k + 16 <= e; k += 16) {
                __m128i v = _mm_loadu_si128((const __m128i *)(q + k));
                STEP(v, 0);
                STEP(_mm_srli_si128(v, 8), 8);
            }
        } else {
            for (; k < e && (k & 31); k++)
                #pragma GCC unroll 4
                for (int j = 0; j < nx; j++) tail[j] += (s * qgrp_code(g, r, k) + b) * x[j][k];
            for (; k + 32 <= e; k += 32) {
                __m128i v = _mm_loadu_si128((const __m128i *)(q + (k >> 5) * 16));
                __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
                STEP(lo, 0);
                STEP(_mm_srli_si128(lo, 8), 8);
                STEP(hi, 16);
                STEP(_mm_srli_si128(hi, 8), 24);
            }
        }
        for (; k < e; k++)
            #pragma GCC unroll 4
            for (int j = 0; j < nx; j++) tail[j] += (s * qgrp_code(g, r, k) + b) * x[j][k];
    }
#undef STEP
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) {
        __m256 t = acc[j][0];
        for (int i = 1; i < na; i++) t = _mm256_add_ps(t, acc[j][i]);
        out[j] = kiln_hsum8(t) + tail[j];
    }
}
AVX2 static void fused_grp_avx2(const struct qgrp *g, int r, const float *const *x, int nx, float *out) {
#define C(N) fused_grp_avx2_(g, r, x, N, out)
    BY_NX(C)
#undef C
}

/* FP8 decode on AVX2: 32 codes per step, sign-extended to 16 bits and
 * shifted into f16 as in fused_fp8_512_ (below), widened by vcvtph2ps and
 * multiplied by s x 256 (w = s * q exactly), two accumulators per
 * activation row. It took 8 codes per step into one accumulator until the
 * thirty-first session. */
AVX2 static inline __attribute__((always_inline)) void fused_fp8_avx2_(const struct qlinear *w, const struct qprep *p, int r, const float *const *x, int nx, float *out) {
    const uint8_t *q = (const uint8_t *)w->w.data + (size_t)r * w->n_in;
    const float *s = p->fp8_scale + (size_t)(r / w->block_n) * w->scales.cols;
    const __m256i keep = _mm256_set1_epi16((short)0xBF80);
    __m256 acc[4][2];
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    float tail[4] = {0, 0, 0, 0};
    for (int k0 = 0, b = 0; k0 < w->n_in; k0 += w->block_k, b++) {
        int k1 = k0 + w->block_k < w->n_in ? k0 + w->block_k : w->n_in, k = k0;
        const __m256 sc = _mm256_set1_ps(s[b] * 256.0f);
        for (; k + 32 <= k1; k += 32) {
            const __m256i h0 = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + k))), 7), keep);
            const __m256i h1 = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + k + 16))), 7), keep);
            const __m256 w0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h0)), sc);
            const __m256 w1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h0, 1)), sc);
            const __m256 w2 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h1)), sc);
            const __m256 w3 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h1, 1)), sc);
            #pragma GCC unroll 4
            for (int j = 0; j < nx; j++) {
                acc[j][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[j] + k), acc[j][0]);
                acc[j][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[j] + k + 8), acc[j][1]);
                acc[j][0] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x[j] + k + 16), acc[j][0]);
                acc[j][1] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x[j] + k + 24), acc[j][1]);
            }
        }
        for (; k + 8 <= k1; k += 8) {
            const __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(q + k))), 7),
                                            _mm256_castsi256_si128(keep));
            const __m256 wv = _mm256_mul_ps(_mm256_cvtph_ps(h), sc);
            #pragma GCC unroll 4
            for (int j = 0; j < nx; j++) acc[j][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[j] + k), acc[j][0]);
        }
        for (; k < k1; k++)
            #pragma GCC unroll 4
            for (int j = 0; j < nx; j++) tail[j] += qm_fp8_lut[q[k]] * s[b] * x[j][k];
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(_mm256_add_ps(acc[j][0], acc[j][1])) + tail[j];
}
AVX2 static void fused_fp8_avx2(const struct qlinear *w, const struct qprep *p, int r, const float *const *x, int nx, float *out) {
#define C(N) fused_fp8_avx2_(w, p, r, x, N, out)
    BY_NX(C)
#undef C
}

/* GPTQ / AWQ 8-bit decode on AVX-512: 16 codes per vector (vpmovzxbd, one
 * convert, w = s * q + b by the FMA fused_grp_avx2_ uses, so the same
 * weights), a 64-byte line per step into 4 accumulators per activation
 * row; fused_grp_avx2_ takes 8 codes per vector. */
AVX512 static inline __attribute__((always_inline)) void fused_grp8_512_(const struct qgrp *g, int r, const float *const *x, int nx,
                                                                         float *out, int pfd) {
    const uint8_t *q = g->q + (size_t)r * g->row_bytes;
    const float *sb = g->sb + (size_t)r * g->n_group * 2;
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int j = 0; j < nx; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = _mm512_setzero_ps();
    float tail[4] = {0, 0, 0, 0};
    for (int gi = 0; gi < g->n_group; gi++) {
        int k = g->gstart[gi];
        const int e = g->gstart[gi + 1];
        const float s = sb[2 * gi], b = sb[2 * gi + 1];
        const __m512 vs = _mm512_set1_ps(s), vb = _mm512_set1_ps(b);
#define W16(o) _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + k + (o))))), vs, vb)
        for (; k + 64 <= e; k += 64) {
            if (pfd) _mm_prefetch((const char *)(q + k) + pfd, _MM_HINT_T0);
            const __m512 w0 = W16(0), w1 = W16(16), w2 = W16(32), w3 = W16(48);
#pragma GCC unroll 4
            for (int j = 0; j < nx; j++) {
                acc[j][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[j] + k), acc[j][0]);
                acc[j][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[j] + k + 16), acc[j][1]);
                acc[j][2] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(x[j] + k + 32), acc[j][2]);
                acc[j][3] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(x[j] + k + 48), acc[j][3]);
            }
        }
        for (; k + 16 <= e; k += 16) {
            const __m512 w0 = W16(0);
#pragma GCC unroll 4
            for (int j = 0; j < nx; j++) acc[j][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[j] + k), acc[j][0]);
        }
#undef W16
        for (; k < e; k++)
#pragma GCC unroll 4
            for (int j = 0; j < nx; j++) tail[j] += (s * q[k] + b) * x[j][k];
    }
#pragma GCC unroll 4
    for (int j = 0; j < nx; j++)
        out[j] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[j][0], acc[j][1]), _mm512_add_ps(acc[j][2], acc[j][3]))) + tail[j];
}
AVX512 static void fused_grp8_512(const struct qgrp *g, int r, const float *const *x, int nx, float *out, int pfd) {
#define C(N) fused_grp8_512_(g, r, x, N, out, pfd)
    BY_NX(C)
#undef C
}

/* FP8 decode on AVX-512: one 64-byte line of codes per step, sign-extended
 * to 16 bits and shifted into f16 (bit 15 the sign, bits 7-13 the
 * exponent and mantissa, bit 14 clear: the value / 256, subnormals
 * included), widened by vcvtph2ps (exact, and blind to a DAZ flag) and
 * multiplied by s x 256: w = s * q exactly as the scalar path has it. Four
 * accumulators per activation row. Per 64 weights 2 sign-extensions, 2
 * shifts, 2 ands, 4 conversions, 4 multiplies and 4 FMAs per activation
 * row, against 8 conversion chains and one accumulator in
 * fused_fp8_avx2, which held 0.6B FP8 decode at ~39% of the probe. */
AVX512 static inline __attribute__((always_inline)) void fused_fp8_512_(const struct qlinear *w, const struct qprep *p, int r,
                                                                        const float *const *x, int nx, float *out, int pfd) {
    const uint8_t *q = (const uint8_t *)w->w.data + (size_t)r * w->n_in;
    const float *s = p->fp8_scale + (size_t)(r / w->block_n) * w->scales.cols;
    const __m512i keep = _mm512_set1_epi16((short)0xBF80);
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int j = 0; j < nx; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = _mm512_setzero_ps();
    float tail[4] = {0, 0, 0, 0};
    for (int k0 = 0, b = 0; k0 < w->n_in; k0 += w->block_k, b++) {
        const int k1 = k0 + w->block_k < w->n_in ? k0 + w->block_k : w->n_in;
        const __m512 sc = _mm512_set1_ps(s[b] * 256.0f);
        int k = k0;
        for (; k + 64 <= k1; k += 64) {
            if (pfd) _mm_prefetch((const char *)(q + k) + pfd, _MM_HINT_T0);
            const __m512i h0 = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + k))), 7), keep);
            const __m512i h1 = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + k + 32))), 7), keep);
            const __m512 w0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h0)), sc);
            const __m512 w1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h0, 1)), sc);
            const __m512 w2 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h1)), sc);
            const __m512 w3 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h1, 1)), sc);
#pragma GCC unroll 4
            for (int j = 0; j < nx; j++) {
                acc[j][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[j] + k), acc[j][0]);
                acc[j][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[j] + k + 16), acc[j][1]);
                acc[j][2] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(x[j] + k + 32), acc[j][2]);
                acc[j][3] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(x[j] + k + 48), acc[j][3]);
            }
        }
        for (; k + 16 <= k1; k += 16) {
            const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + k))), 7),
                                               _mm512_castsi512_si256(keep));
            const __m512 w0 = _mm512_mul_ps(_mm512_cvtph_ps(h), sc);
#pragma GCC unroll 4
            for (int j = 0; j < nx; j++) acc[j][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[j] + k), acc[j][0]);
        }
        for (; k < k1; k++)
#pragma GCC unroll 4
            for (int j = 0; j < nx; j++) tail[j] += qm_fp8_lut[q[k]] * s[b] * x[j][k];
    }
#pragma GCC unroll 4
    for (int j = 0; j < nx; j++)
        out[j] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[j][0], acc[j][1]), _mm512_add_ps(acc[j][2], acc[j][3]))) + tail[j];
}
AVX512 static void fused_fp8_512(const struct qlinear *w, const struct qprep *p, int r, const float *const *x, int nx, float *out,
                                 int pfd) {
#define C(N) fused_fp8_512_(w, p, r, x, N, out, pfd)
    BY_NX(C)
#undef C
}

/* Decode, one activation row, 4-bit codes, AVX-512: 16 weights per vector
 * (the same w = s * q + b in f32, then the FMA with x), 4 accumulators. */
AVX512 static float fused_grp1_q4_512(const struct qgrp *g, int r, const float *x) {
    const uint8_t *q = g->q + (size_t)r * g->row_bytes;
    const float *sb = g->sb + (size_t)r * g->n_group * 2;
    const __m128i m4 = _mm_set1_epi8(15);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
    float tail = 0;
    for (int gi = 0; gi < g->n_group; gi++) {
        int a = g->gstart[gi], e = g->gstart[gi + 1], k = a;
        const float s = sb[2 * gi], b = sb[2 * gi + 1];
        const __m512 vs = _mm512_set1_ps(s), vb = _mm512_set1_ps(b);
        for (; k < e && (k & 31); k++) tail += (s * qgrp_code(g, r, k) + b) * x[k];
        for (; k + 64 <= e; k += 64) {
            __m128i v0 = _mm_loadu_si128((const __m128i *)(q + (k >> 5) * 16)), v1 = _mm_loadu_si128((const __m128i *)(q + (k >> 5) * 16 + 16));
            __m128i l0 = _mm_and_si128(v0, m4), h0 = _mm_and_si128(_mm_srli_epi16(v0, 4), m4);
            __m128i l1 = _mm_and_si128(v1, m4), h1 = _mm_and_si128(_mm_srli_epi16(v1, 4), m4);
            acc0 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(l0)), vs, vb), _mm512_loadu_ps(x + k), acc0);
            acc1 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(h0)), vs, vb), _mm512_loadu_ps(x + k + 16), acc1);
            acc2 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(l1)), vs, vb), _mm512_loadu_ps(x + k + 32), acc2);
            acc3 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(h1)), vs, vb), _mm512_loadu_ps(x + k + 48), acc3);
        }
        for (; k + 32 <= e; k += 32) {
            __m128i v0 = _mm_loadu_si128((const __m128i *)(q + (k >> 5) * 16));
            __m128i l0 = _mm_and_si128(v0, m4), h0 = _mm_and_si128(_mm_srli_epi16(v0, 4), m4);
            acc0 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(l0)), vs, vb), _mm512_loadu_ps(x + k), acc0);
            acc1 = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(h0)), vs, vb), _mm512_loadu_ps(x + k + 16), acc1);
        }
        for (; k < e; k++) tail += (s * qgrp_code(g, r, k) + b) * x[k];
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3))) + tail;
}

/* Decode, one activation row, 4-bit codes in groups that are whole runs of
 * 128 (g128 and its multiples, no act-order gaps), AVX-512: the 16 values
 * s * q + b of the group are computed once (the same f32 FMA as above, so
 * the same weights bit for bit) and the codes index them with vpermps,
 * which reads the low 4 bits of each dword: a 64-byte load holds 128 codes,
 * and shifting it right by 4j puts the j-th nibble of every dword in place.
 * x was reordered once per call to match (xl, see lut_order), so 16 weights
 * cost a shift, a permute and an FMA. */

/* 128 weights of one 64-byte code block: nibble j of dword l is weight
 * 16 j + l; its value lut[code] times x[16 j + l], into four accumulators */
AVX512 static inline __attribute__((always_inline)) void lut_block128(__m512 *a0, __m512 *a1, __m512 *a2, __m512 *a3, __m512i c,
                                                                      __m512 lut, const float *x) {
    *a0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(c, lut), _mm512_loadu_ps(x), *a0);
    *a1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), lut), _mm512_loadu_ps(x + 16), *a1);
    *a2 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(c, 8), lut), _mm512_loadu_ps(x + 32), *a2);
    *a3 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(c, 12), lut), _mm512_loadu_ps(x + 48), *a3);
    *a0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(c, 16), lut), _mm512_loadu_ps(x + 64), *a0);
    *a1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(c, 20), lut), _mm512_loadu_ps(x + 80), *a1);
    *a2 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(c, 24), lut), _mm512_loadu_ps(x + 96), *a2);
    *a3 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(c, 28), lut), _mm512_loadu_ps(x + 112), *a3);
}

AVX512 static float fused_grp1_lut_512(const struct qgrp *g, int r, const float *xl) {
    const uint8_t *q = g->q + (size_t)r * g->row_bytes;
    const float *sb = g->sb + (size_t)r * g->n_group * 2;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
    for (int gi = 0; gi < g->n_group; gi++) {
        const __m512 lut = _mm512_fmadd_ps(iota, _mm512_set1_ps(sb[2 * gi]), _mm512_set1_ps(sb[2 * gi + 1]));
        for (int k = g->gstart[gi]; k < g->gstart[gi + 1]; k += 128) {
            const __m512i c = _mm512_loadu_si512((const void *)(q + (k >> 5) * 16));
            const float *x = xl + k;
            _mm_prefetch((const char *)(q + (k >> 5) * 16) + QPFD_G, _MM_HINT_T0);
            lut_block128(&acc0, &acc1, &acc2, &acc3, c, lut, x);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

/* The same for groups of exactly 128 in order (g128 without act-order, the
 * common GPTQ/AWQ layout: gstart[i] = 128 i), over a run of rows in one call:
 * no group-start table, and a two-level prefetch, the codes 2 KiB ahead into
 * L1 and 32 KiB ahead into L2 (the scale/bias stream with them). The kernel
 * is compute bound in L2 (~1.9 ns per 128 weights per core: 7 shifts, 8
 * vpermps, 8 FMAs), so what the prefetch buys is the DRAM latency it does
 * not hide: decode sweep of Qwen3-0.6B's g128 layers (0.23 GB), 2 threads,
 * 4 KiB into L1 only 5.68-5.70 ms, two levels 5.26-5.36 ms. */
AVX512 static void lut128_rows_512(const struct qgrp *g, int64_t r0, int64_t r1, const float *xl, const float *bias, float *out) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int ng = g->n_group;
    CPU_FOR_ROWS2(r, r0, r1) {
        const uint8_t *q = g->q + (size_t)r * g->row_bytes;
        const float *sb = g->sb + (size_t)r * ng * 2;
        __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        for (int gi = 0; gi < ng; gi++, q += 64) {
            /* the scale/bias stream, a 64-byte line per 8 groups (once per row
             * covered one line of a row's 2-6 at K = 2048-6144) */
            if (!(gi & 7)) _mm_prefetch((const char *)(sb + 2 * gi) + L128_PF2 / 8, _MM_HINT_T1);
            const __m512 lut = _mm512_fmadd_ps(iota, _mm512_set1_ps(sb[2 * gi]), _mm512_set1_ps(sb[2 * gi + 1]));
            const __m512i c = _mm512_loadu_si512((const void *)q);
            const float *x = xl + 128 * gi;
            _mm_prefetch((const char *)q + L128_PF1, _MM_HINT_T0);
            _mm_prefetch((const char *)q + L128_PF2, _MM_HINT_T1);
            lut_block128(&acc0, &acc1, &acc2, &acc3, c, lut, x);
        }
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3))) + (bias ? bias[r] : 0.0f);
    }
}

static int lut128_ok(const struct qgrp *g) {
    if (g->bits != 4 || g->n_in % 128 || g->n_group != g->n_in / 128 || g->row_bytes != (size_t)g->n_in / 2) return 0;
    for (int i = 0; i <= g->n_group; i++)
        if (g->gstart[i] != 128 * i) return 0;
    return 1;
}

/* can fused_grp1_lut_512 run: 4-bit, every group a whole number of 128-runs */
static int lut_ok(const struct qgrp *g) {
    if (g->bits != 4 || g->n_in % 128) return 0;
    for (int i = 0; i <= g->n_group; i++)
        if (g->gstart[i] % 128) return 0;
    return 1;
}

/* xl[128 S + 16 j + d] = x[128 S + 32 (d / 4) + 4 (d % 4) + j / 2 + 16 (j & 1)]:
 * lane d of the dword-nibble j of a 64-byte code load (4 chunks of 32
 * weights, byte i of a chunk = weights i and 16 + i). With two-source
 * permutes (it runs on the caller before every decode matmul; K = 1024:
 * 362 ns as a scalar loop, 82 ns): output j of a 128-block takes lanes
 * 4t + j/2 of the vectors 2q + (j & 1), q = 0..3 -> lanes 4q + t. */
AVX512 static void lut_order_512(float *xl, const float *x, int K) {
    for (int s0 = 0; s0 < K; s0 += 128) {
        __m512 X[8];
        for (int m = 0; m < 8; m++) X[m] = _mm512_loadu_ps(x + s0 + 16 * m);
        for (int j = 0; j < 8; j++) {
            const int p = j & 1, h = j >> 1;
            const __m512i idx = _mm512_setr_epi32(h, 4 + h, 8 + h, 12 + h, 16 + h, 20 + h, 24 + h, 28 + h, h, 4 + h, 8 + h, 12 + h, 16 + h,
                                                  20 + h, 24 + h, 28 + h);
            __m512 lo = _mm512_permutex2var_ps(X[p], idx, X[2 + p]), hi = _mm512_permutex2var_ps(X[4 + p], idx, X[6 + p]);
            _mm512_storeu_ps(xl + s0 + 16 * j, _mm512_shuffle_f32x4(lo, hi, 0x44));
        }
    }
}

#endif /* KILN_X86 */

#if defined(KILN_NEON)
/* ==== NEON (AArch64) ====
 *
 * The same weights as the x86 kernels, 4 per float32x4_t, lane l of vector
 * i holding weight 4 i + l of the step:
 * - FP8: a code sign-extended to 16 bits and shifted left by 7 (sshll #7)
 *   has the sign in bits 15 and 14 and the exponent and mantissa in 13..7;
 *   with bit 14 cleared it is the f16 of the code's value / 256 (normals
 *   and subnormals alike, e4m3's bias 7 against f16's 15), which fcvtl
 *   widens exactly. Times s x 256 (exact unless s >= 2^120 overflows) it
 *   is qm_fp8_lut[q] * s, the scalar weight bit for bit (test_fp8_codes;
 *   the codes 0x7f / 0xff, e4m3's NaNs, come out as +-480 s, as on x86).
 * - GPTQ / AWQ: codes widened u8 -> u16 -> u32 (uxtl), converted (ucvtf),
 *   w = s * q + b as one FMA, the x86 vector kernels' weight (GCC compiles
 *   the scalar code's s * q + b unfused, -std=c11 contracting nothing: the
 *   two are at most one rounding of w apart). 4-bit: a 16-byte chunk holds 32 weights, byte i weights i (low
 *   nibble) and 16 + i (high).
 * 32 weights (8 vectors) per step; decode FMAs them into 8 accumulators
 * spread over the nx activation rows (8 per row at nx = 1, 4 at 2, 2 at 3
 * and 4), so at every nx there are 8 independent FMA chains. */

/* 16 FP8 codes at q -> w[0..4), sc = s x 256 */
static inline __attribute__((always_inline)) void fp8x16_neon(const uint8_t *q, float32x4_t sc, float32x4_t *w) {
    const int8x16_t c = vld1q_s8((const int8_t *)q);
    const int16x8_t b14 = vdupq_n_s16(0x4000);
    const float16x8_t h0 = vreinterpretq_f16_s16(vbicq_s16(vshll_n_s8(vget_low_s8(c), 7), b14));
    const float16x8_t h1 = vreinterpretq_f16_s16(vbicq_s16(vshll_high_n_s8(c, 7), b14));
    w[0] = vmulq_f32(vcvt_f32_f16(vget_low_f16(h0)), sc);
    w[1] = vmulq_f32(vcvt_high_f32_f16(h0), sc);
    w[2] = vmulq_f32(vcvt_f32_f16(vget_low_f16(h1)), sc);
    w[3] = vmulq_f32(vcvt_high_f32_f16(h1), sc);
}

/* 16 unsigned codes -> w[0..4) = s * q + b */
static inline __attribute__((always_inline)) void grp16_neon(uint8x16_t c, float32x4_t vs, float32x4_t vb, float32x4_t *w) {
    const uint16x8_t lo = vmovl_u8(vget_low_u8(c)), hi = vmovl_high_u8(c);
    w[0] = vfmaq_f32(vb, vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), vs);
    w[1] = vfmaq_f32(vb, vcvtq_f32_u32(vmovl_high_u16(lo)), vs);
    w[2] = vfmaq_f32(vb, vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), vs);
    w[3] = vfmaq_f32(vb, vcvtq_f32_u32(vmovl_high_u16(hi)), vs);
}

/* the 32 weights of a 4-bit chunk c16 -> w[0..8) */
static inline __attribute__((always_inline)) void grp4x32_neon(const uint8_t *c16, float32x4_t vs, float32x4_t vb, float32x4_t *w) {
    const uint8x16_t c = vld1q_u8(c16);
    grp16_neon(vandq_u8(c, vdupq_n_u8(15)), vs, vb, w);
    grp16_neon(vshrq_n_u8(c, 4), vs, vb, w + 4);
}

/* acc[j][i % na] += v[i] x[j][k + 4 i], i < nv, for the nx rows */
static inline __attribute__((always_inline)) void fma_rows_neon(float32x4_t (*acc)[8], const float32x4_t *v, int nv, const float *const *x,
                                                                int k, int nx, int na) {
    _Pragma("GCC unroll 8") for (int i = 0; i < nv; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++) acc[j][i % na] = vfmaq_f32(acc[j][i % na], v[i], vld1q_f32(x[j] + k + 4 * i));
}

/* Each kernel below serves two uses, told apart by nx (a constant in every
 * copy, so the other branch compiles away): nx = 0, the row dequantized
 * into y[K] (the GEMM's panels, the row dots); nx = 1..4, decode: the
 * weights FMAd into nx activation rows, out[j] their sums. put_neon
 * takes nv vectors of weights k.., put1_neon one scalar weight (tails). */
static inline __attribute__((always_inline)) void put_neon(float *y, float32x4_t (*acc)[8], const float32x4_t *v, int nv,
                                                           const float *const *x, int k, int nx, int na) {
    if (!nx) {
        _Pragma("GCC unroll 8") for (int i = 0; i < nv; i++) vst1q_f32(y + k + 4 * i, v[i]);
    } else {
        fma_rows_neon(acc, v, nv, x, k, nx, na);
    }
}
static inline __attribute__((always_inline)) void put1_neon(float *y, float *tail, float w, const float *const *x, int k, int nx) {
    if (!nx) y[k] = w;
    else
        _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++) tail[j] += w * x[j][k];
}

/* accumulators per activation row: 8, 4, 2, 2 (at most 8 in all) */
#define ACC_NEON(nx) ((nx) <= 1 ? 8 : (nx) == 2 ? 4 : 2)

/* zeroes the accumulators; the sums of the nx rows into out */
static inline __attribute__((always_inline)) void acc_init_neon(float32x4_t (*acc)[8], float *tail, int nx, int na) {
    _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++) {
        tail[j] = 0;
        _Pragma("GCC unroll 8") for (int i = 0; i < na; i++) acc[j][i] = vdupq_n_f32(0);
    }
}
static inline __attribute__((always_inline)) void acc_sum_neon(float32x4_t (*acc)[8], const float *tail, int nx, int na, float *out) {
    _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++) {
        _Pragma("GCC unroll 8") for (int i = 1; i < na; i++) acc[j][0] = vaddq_f32(acc[j][0], acc[j][i]);
        out[j] = vaddvq_f32(acc[j][0]) + tail[j];
    }
}

/* FP8 row r: per block 32 codes per step (two fp8x16_neon), then 16, then
 * the table's weight for the block's tail */
static inline __attribute__((always_inline)) void fp8_neon_(const struct qlinear *w, const struct qprep *p, int r, float *y,
                                                            const float *const *x, int nx, float *out) {
    const uint8_t *q = (const uint8_t *)w->w.data + (size_t)r * w->n_in;
    const float *s = p->fp8_scale + (size_t)(r / w->block_n) * w->scales.cols;
    const int na = ACC_NEON(nx);
    float32x4_t acc[4][8];
    float tail[4];
    acc_init_neon(acc, tail, nx, na);
    for (int k0 = 0, b = 0; k0 < w->n_in; k0 += w->block_k, b++) {
        const int k1 = k0 + w->block_k < w->n_in ? k0 + w->block_k : w->n_in;
        const float32x4_t sc = vdupq_n_f32(s[b] * 256.0f);
        float32x4_t v[8];
        int k = k0;
        for (; k + 32 <= k1; k += 32) {
            fp8x16_neon(q + k, sc, v);
            fp8x16_neon(q + k + 16, sc, v + 4);
            put_neon(y, acc, v, 8, x, k, nx, na);
        }
        for (; k + 16 <= k1; k += 16) {
            fp8x16_neon(q + k, sc, v);
            put_neon(y, acc, v, 4, x, k, nx, na);
        }
        for (; k < k1; k++) put1_neon(y, tail, qm_fp8_lut[q[k]] * s[b], x, k, nx);
    }
    if (nx) acc_sum_neon(acc, tail, nx, na, out);
}

/* GPTQ / AWQ row r (4-bit and 8-bit): per group 32 weights per step (8-bit
 * then 16), the scalar weight s * q + b for the tails (4-bit: up to the
 * group's first whole 32-weight chunk, and after its last) */
static inline __attribute__((always_inline)) void grp_neon_(const struct qgrp *g, int r, float *y, const float *const *x, int nx, float *out) {
    const uint8_t *q = g->q + (size_t)r * g->row_bytes;
    const float *sb = g->sb + (size_t)r * g->n_group * 2;
    const int na = ACC_NEON(nx);
    float32x4_t acc[4][8];
    float tail[4];
    acc_init_neon(acc, tail, nx, na);
    for (int gi = 0; gi < g->n_group; gi++) {
        int k = g->gstart[gi];
        const int e = g->gstart[gi + 1];
        const float s = sb[2 * gi], b = sb[2 * gi + 1];
        const float32x4_t vs = vdupq_n_f32(s), vb = vdupq_n_f32(b);
        float32x4_t v[8];
        if (g->bits == 8) {
            for (; k + 32 <= e; k += 32) {
                grp16_neon(vld1q_u8(q + k), vs, vb, v);
                grp16_neon(vld1q_u8(q + k + 16), vs, vb, v + 4);
                put_neon(y, acc, v, 8, x, k, nx, na);
            }
            for (; k + 16 <= e; k += 16) {
                grp16_neon(vld1q_u8(q + k), vs, vb, v);
                put_neon(y, acc, v, 4, x, k, nx, na);
            }
        } else {
            for (; k < e && (k & 31); k++) put1_neon(y, tail, s * qgrp_code(g, r, k) + b, x, k, nx);
            for (; k + 32 <= e; k += 32) {
                grp4x32_neon(q + (k >> 5) * 16, vs, vb, v);
                put_neon(y, acc, v, 8, x, k, nx, na);
            }
        }
        for (; k < e; k++) put1_neon(y, tail, s * qgrp_code(g, r, k) + b, x, k, nx);
    }
    if (nx) acc_sum_neon(acc, tail, nx, na, out);
}

static void row_fp8_neon(const struct qlinear *w, const struct qprep *p, int r, float *y) { fp8_neon_(w, p, r, y, NULL, 0, NULL); }
static void row_grp_neon(const struct qgrp *g, int r, float *y) { grp_neon_(g, r, y, NULL, 0, NULL); }

/* decode, nx (1..4) a constant in each copy */
static void fused_fp8_neon(const struct qlinear *w, const struct qprep *p, int r, const float *const *x, int nx, float *out) {
#define C(N) fp8_neon_(w, p, r, NULL, x, N, out)
    BY_NX(C)
#undef C
}
static void fused_grp_neon(const struct qgrp *g, int r, const float *const *x, int nx, float *out) {
#define C(N) grp_neon_(g, r, NULL, x, N, out)
    BY_NX(C)
#undef C
}
#endif /* KILN_NEON */

/* ==== exact path on the worker pool ==== */

struct xjob {
    const struct qlinear *w;
    const struct qprep *p;
    float *out;
    const float *x;
    const float *bias;
    int n, K, N, isa;
    size_t rb;
    const float *xl; /* decode, fused_grp1_lut_512: x reordered (lut_order) */
    int lut128;      /* ... and lut128_rows_512 can run */
    int two, pfd;    /* decode: the row order and prefetch (cpu_qm_two / cpu_qm_pfd), read on the calling thread */
    /* GEMM (prefill): */
    float *xp;         /* activations packed in tiles of MR tokens, [tile][K][MR] */
    int MR, NR, ntile;
    void **scr;        /* per-thread scratch (cpu_scratch_threads) */
};

/* The vector kernels of this build: from XVEC up (AVX2 on x86, NEON on
 * AArch64) rows dequantize with row_*_v, decode (n <= 4) takes the fused
 * kernels and prefill (n >= XGEMM_MIN) the GEMM (KILN_XVEC); elsewhere
 * every level is scalar. */
#if defined(KILN_X86)
#define KILN_XVEC 1
enum { XVEC = CPU_ISA_AVX2 };
#define row_fp8_v row_fp8_avx2
#define row_grp_v row_grp_avx2
#elif defined(KILN_NEON)
#define KILN_XVEC 1
enum { XVEC = CPU_ISA_NEON };
#define row_fp8_v row_fp8_neon
#define row_grp_v row_grp_neon
#else
enum { XVEC = CPU_ISA_LAST + 1 }; /* never */
#define row_fp8_v row_fp8
#define row_grp_v row_grp
#endif

/* dequantizes row r of any exact-path format into y[K] */
static void dequant_row(const struct xjob *j, int r, float *y) {
    const int v = j->isa >= XVEC;
    switch (j->w->fmt) {
    case KILN_WFMT_FP8: (v ? row_fp8_v : row_fp8)(j->w, j->p, r, y); break;
    case KILN_WFMT_GPTQ:
    case KILN_WFMT_AWQ: (v ? row_grp_v : row_grp)(&j->p->grp, r, y); break;
    default: quant_dequant_row(j->w->w.dtype, (const uint8_t *)j->w->w.data + (size_t)r * j->rb, y, j->K); break;
    }
}

#if defined(KILN_XVEC)
static void x_fused_rows(void *arg, int64_t r0, int64_t r1, int tid) {
    const struct xjob *j = arg;
    const float *xs[4];
    for (int t = 0; t < j->n; t++) xs[t] = j->x + (size_t)t * j->K;
    const int fp8 = j->w->fmt == KILN_WFMT_FP8;
#if defined(KILN_X86)
    const int g8 = !fp8 && j->p->grp.bits == 8, pfd = j->pfd;
    const int k512 = j->xl || (j->isa >= CPU_ISA_AVX512 && (fp8 || g8 || (j->n == 1 && j->p->grp.bits == 4)));
    cpu_isa_note(k512 ? CPU_ISA_AVX512 : CPU_ISA_AVX2, 0);
    if (j->lut128) {
        lut128_rows_512(&j->p->grp, r0, r1, j->xl, j->bias, j->out);
        return;
    }
#else
    cpu_isa_note(CPU_ISA_NEON, 0);
#endif
    CPU_FOR_ROWS(r, r0, r1, j->two) {
        float o[4];
#if defined(KILN_X86)
        if (j->xl) o[0] = fused_grp1_lut_512(&j->p->grp, (int)r, j->xl);
        else if (fp8 && k512) fused_fp8_512(j->w, j->p, (int)r, xs, j->n, o, pfd);
        else if (fp8) fused_fp8_avx2(j->w, j->p, (int)r, xs, j->n, o);
        else if (g8 && k512) fused_grp8_512(&j->p->grp, (int)r, xs, j->n, o, pfd);
        else if (k512) o[0] = fused_grp1_q4_512(&j->p->grp, (int)r, xs[0]);
        else fused_grp_avx2(&j->p->grp, (int)r, xs, j->n, o);
#else
        if (fp8) fused_fp8_neon(j->w, j->p, (int)r, xs, j->n, o);
        else fused_grp_neon(&j->p->grp, (int)r, xs, j->n, o);
#endif
        for (int t = 0; t < j->n; t++) j->out[(size_t)t * j->N + r] = o[t] + (j->bias ? j->bias[r] : 0.0f);
    }
    (void)tid;
}
#endif /* KILN_XVEC */

static void x_rows(void *arg, int64_t r0, int64_t r1, int tid) {
    const struct xjob *j = arg;
    float *y = j->scr[tid];
    cpu_dot_fn dot = cpu_dot_for(KILN_DTYPE_F32);
    for (int64_t r = r0; r < r1; r++) {
        dequant_row(j, (int)r, y);
        float b = j->bias ? j->bias[r] : 0.0f;
        for (int t = 0; t < j->n; t += 4) {
            int nx = j->n - t < 4 ? j->n - t : 4;
            const float *xs[4];
            float o[4];
            for (int i = 0; i < nx; i++) xs[i] = j->x + (size_t)(t + i) * j->K;
            dot(y, xs, nx, j->K, o);
            for (int i = 0; i < nx; i++) j->out[(size_t)(t + i) * j->N + r] = o[i] + b;
        }
    }
}

#if defined(KILN_XVEC)
/* GEMM: x packed once in tiles of MR tokens ([k][MR], zero padded); per NR
 * output rows the weights are dequantized once into an f32 panel [k][NR]
 * (per-thread scratch, L2), then an MR x NR register-tiled microkernel runs
 * over every token tile (AVX-512 12 x 32, AVX2 6 x 16, as matmul.c's; NEON
 * matmul.c's own 8 x 12 kernel and panel packing, cpu_neon_*). */
static void x_pack(void *arg, int64_t b, int64_t e, int tid) {
    const struct xjob *j = arg;
    const int K = j->K, MR = j->MR;
    for (int64_t tile = b; tile < e; tile++) {
        float *d = j->xp + (size_t)tile * K * MR;
        for (int i = 0; i < MR; i++) {
            int64_t t = tile * MR + i;
            if (t < j->n) {
                const float *s = j->x + (size_t)t * K;
                for (int k = 0; k < K; k++) d[(size_t)k * MR + i] = s[k];
            } else {
                for (int k = 0; k < K; k++) d[(size_t)k * MR + i] = 0;
            }
        }
    }
    (void)tid;
}

#if defined(KILN_X86)
AVX512 static void ukr_f32_512(const float *xp, const float *wp, int K, float *c, size_t ldc, int mr, int nr, const float *bias) {
    __m512 a0[12], a1[12];
    #pragma GCC unroll 16
    for (int t = 0; t < 12; t++) a0[t] = _mm512_setzero_ps(), a1[t] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++, xp += 12, wp += 32) {
        __m512 w0 = _mm512_load_ps(wp), w1 = _mm512_load_ps(wp + 16);
        #pragma GCC unroll 16
        for (int t = 0; t < 12; t++) {
            __m512 xb = _mm512_set1_ps(xp[t]);
            a0[t] = _mm512_fmadd_ps(xb, w0, a0[t]);
            a1[t] = _mm512_fmadd_ps(xb, w1, a1[t]);
        }
    }
    __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? 0xffff : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
    __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    __m512 b1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
    #pragma GCC unroll 16
    for (int t = 0; t < 12; t++)
        if (t < mr) {
            _mm512_mask_storeu_ps(c + t * ldc, m0, _mm512_add_ps(a0[t], b0));
            _mm512_mask_storeu_ps(c + t * ldc + 16, m1, _mm512_add_ps(a1[t], b1));
        }
}

AVX2 static void ukr_f32_avx2(const float *xp, const float *wp, int K, float *c, size_t ldc, int mr, int nr, const float *bias) {
    __m256 a0[6], a1[6];
    #pragma GCC unroll 16
    for (int t = 0; t < 6; t++) a0[t] = _mm256_setzero_ps(), a1[t] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++, xp += 6, wp += 16) {
        __m256 w0 = _mm256_load_ps(wp), w1 = _mm256_load_ps(wp + 8);
        #pragma GCC unroll 16
        for (int t = 0; t < 6; t++) {
            __m256 xb = _mm256_broadcast_ss(xp + t);
            a0[t] = _mm256_fmadd_ps(xb, w0, a0[t]);
            a1[t] = _mm256_fmadd_ps(xb, w1, a1[t]);
        }
    }
    __m256i m0 = mask8(nr), m1 = mask8(nr - 8);
    __m256 b0 = bias ? _mm256_maskload_ps(bias, m0) : _mm256_setzero_ps();
    __m256 b1 = bias ? _mm256_maskload_ps(bias + 8, m1) : _mm256_setzero_ps();
    #pragma GCC unroll 16
    for (int t = 0; t < 6; t++)
        if (t < mr) {
            _mm256_maskstore_ps(c + t * ldc, m0, _mm256_add_ps(a0[t], b0));
            _mm256_maskstore_ps(c + t * ldc + 8, m1, _mm256_add_ps(a1[t], b1));
        }
}

/* d[k * ld + i] = y[i * K + k] for 8 rows i (y: 8 rows of K) */
AVX2 static void transpose_rows8(float *d, int ld, const float *y, int K) {
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(y + (size_t)i * K + k);
        kiln_transpose8(r);
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(d + (size_t)(k + i) * ld, r[i]);
    }
    for (; k < K; k++)
        for (int i = 0; i < 8; i++) d[(size_t)k * ld + i] = y[(size_t)i * K + k];
}

#endif /* KILN_X86 */

static void x_gemm_panels(void *arg, int64_t p0, int64_t p1, int tid) {
    const struct xjob *j = arg;
    const int K = j->K, NR = j->NR, MR = j->MR;
    float *wp = j->scr[tid], *y = wp + (size_t)K * NR;
    for (int64_t pi = p0; pi < p1; pi++) {
        const int r0 = (int)pi * NR, nr = j->N - r0 < NR ? j->N - r0 : NR;
#if defined(KILN_NEON)
        /* the nr rows dequantized one after another (y holds NR rows),
         * then 4 x 4-transposed into the panel by matmul.c's packing */
        for (int i = 0; i < nr; i++) dequant_row(j, r0 + i, y + (size_t)i * K);
        cpu_neon_pack_f32(wp, y, K, nr);
#else
        for (int i0 = 0; i0 < NR; i0 += 8) {
            /* 8 rows dequantized, then transposed 8 x 8 into the panel */
            for (int i = 0; i < 8; i++) {
                float *yi = y + (size_t)i * K;
                if (i0 + i < nr) dequant_row(j, r0 + i0 + i, yi);
                else memset(yi, 0, sizeof(float) * (size_t)K);
            }
            transpose_rows8(wp + i0, NR, y, K);
        }
#endif
        const float *bias = j->bias ? j->bias + r0 : NULL;
        for (int tile = 0; tile < j->ntile; tile++) {
            int t0 = tile * MR, mr = j->n - t0 < MR ? j->n - t0 : MR;
            float *c = j->out + (size_t)t0 * j->N + r0;
            const float *xp = j->xp + (size_t)tile * K * MR;
#if defined(KILN_NEON)
            cpu_neon_ukr(xp, wp, K, c, j->N, mr, nr, bias);
#else
            if (j->isa >= CPU_ISA_AVX512) ukr_f32_512(xp, wp, K, c, j->N, mr, nr, bias);
            else ukr_f32_avx2(xp, wp, K, c, j->N, mr, nr, bias);
#endif
        }
    }
}

/* the GEMM's tile shape for isa, and the floats of a thread's scratch (the
 * panel, then the dequantized rows it is made from: 8 on x86, NR on NEON) */
static size_t x_gemm_shape(struct xjob *j) {
#if defined(KILN_NEON)
    j->MR = CPU_NEON_MR, j->NR = CPU_NEON_NR;
    return (size_t)j->K * 2 * j->NR;
#else
    j->MR = j->isa >= CPU_ISA_AVX512 ? 12 : 6, j->NR = j->isa >= CPU_ISA_AVX512 ? 32 : 16;
    return (size_t)j->K * (j->NR + 8);
#endif
}

/* n at or above which the exact path runs the GEMM (below: row dots) */
#define XGEMM_MIN 8

/* the decode paths of the exact numerics: fused dequantize + FMA per row
 * (n <= 4), and with it (x86) the lookup kernels of 4-bit groups (n = 1) */
static int exact_fused(const struct xjob *j) { return j->isa >= XVEC && j->n <= 4 && j->w->fmt != KILN_WFMT_GGUF; }
static int exact_lut(const struct xjob *j) {
#if defined(KILN_X86)
    return j->n == 1 && j->isa >= CPU_ISA_AVX512 && j->w->fmt != KILN_WFMT_FP8 && lut_ok(&j->p->grp);
#else
    (void)j;
    return 0;
#endif
}

/* the fused decode's row order and prefetch, read on the calling thread:
 * x86 the int8 kernels' (cpu_qm_two / cpu_qm_pfd); NEON two streams
 * (CPU_FOR_ROWS2's order) and no software prefetch */
static void x_decode_settings(struct xjob *j) {
#if defined(KILN_X86)
    j->two = cpu_qm_two(), j->pfd = cpu_qm_pfd();
#else
    j->two = 1, j->pfd = 0;
#endif
}

/* bytes the fused decode reads per row: FP8 codes, or GPTQ / AWQ codes and group scale pairs */
static size_t x_row_bytes(const struct qlinear *w) {
    return w->fmt == KILN_WFMT_FP8 ? (size_t)w->n_in : qm_grp_row_bytes(&((const struct qprep *)w->be)->grp);
}

#endif /* KILN_XVEC */

void qm_matmul_exact(struct kiln_backend *be, float *out, const float *x, const struct qlinear *w, int n) {
    const struct qprep *p = w->be;
    const int K = w->n_in, N = w->n_out;
    float *xperm = NULL;
    if ((w->fmt == KILN_WFMT_GPTQ || w->fmt == KILN_WFMT_AWQ) && p->grp.perm) {
        if (!(xperm = cpu_scratch_alloc(be, sizeof(float) * (size_t)n * K))) return; /* reported by cpu_error */
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++) xperm[(size_t)t * K + k] = x[(size_t)t * K + p->grp.perm[k]];
        x = xperm;
    }
    struct xjob j = {.w = w, .p = p, .out = out, .x = x, .bias = w->bias.data ? cpu_vec(&w->bias) : NULL, .n = n, .K = K, .N = N,
                     .isa = cpu_isa(), .rb = w->fmt == KILN_WFMT_GGUF ? quant_row_bytes(w->w.dtype, K) : 0};
    /* rows per chunk: ~64 KiB of dequantized weights */
    int64_t chunk = (64 << 10) / ((int64_t)K * 4) + 1;
#if defined(KILN_XVEC)
    if (exact_fused(&j)) { /* decode: fused, no scratch but the reordered x of the lookup kernels */
        x_decode_settings(&j);
        float *xl = NULL;
        const size_t sz = sizeof(float) * (size_t)K;
        if (!exact_lut(&j) || !qm_buf_get(be, &sz, (void **)&xl, 1)) {
#if defined(KILN_X86)
            if (xl) {
                lut_order_512(xl, x, K);
                j.xl = xl;
                j.lut128 = lut128_ok(&p->grp);
            }
#endif
            cpu_parallel_for_split(be, N, cpu_split_chunk(be, N, x_row_bytes(w)), x_fused_rows, &j);
        }
    } else if (j.isa >= XVEC && n >= XGEMM_MIN) {
        /* x_pack, the dequantized panels, the microkernel (NEON at either AArch64 level: no sdot) */
        cpu_isa_note((int)XVEC == (int)CPU_ISA_NEON ? CPU_ISA_NEON : j.isa, 0);
        const size_t scr = x_gemm_shape(&j);
        j.ntile = (n + j.MR - 1) / j.MR;
        j.xp = cpu_scratch_alloc(be, sizeof(float) * (size_t)j.ntile * j.MR * K);
        j.scr = j.xp ? cpu_scratch_threads(be, sizeof(float) * scr) : NULL;
        if (j.scr) {
            cpu_parallel_for(be, j.ntile, 1, x_pack, &j);
            cpu_parallel_for(be, (N + j.NR - 1) / j.NR, 1, x_gemm_panels, &j);
        }
        free(j.xp);
        cpu_scratch_threads_free(be, j.scr);
    } else
#endif
    { /* row dots on dequantized rows (scalar, n 5..7, GGUF below XGEMM_MIN): matmul.c's dot */
        if ((j.scr = cpu_scratch_threads(be, sizeof(float) * (size_t)K))) cpu_parallel_for(be, N, chunk, x_rows, &j);
        cpu_scratch_threads_free(be, j.scr);
    }
    free(xperm);
}

int qm_exact_multi(struct kiln_backend *be, float *const *outs, const float *x, const struct qlinear *const *ws, int count, int n) {
#if !defined(KILN_XVEC)
    return 0; /* the exact decode has only row dots here: one by one */
#else
    /* the exact decode: x reordered once for the lookup kernels */
    struct xjob j[MULTI_MAX];
    struct cpu_task t[MULTI_MAX];
    const int K = ws[0]->n_in;
#if defined(KILN_X86)
    float *xl = NULL;
#endif
    for (int i = 0; i < count; i++) {
        const struct qprep *p = ws[i]->be;
        if ((ws[i]->fmt == KILN_WFMT_GPTQ || ws[i]->fmt == KILN_WFMT_AWQ) && (p->grp.perm || p->gact)) return 0;
        j[i] = (struct xjob){.w = ws[i], .p = p, .out = outs[i], .x = x, .bias = ws[i]->bias.data ? cpu_vec(&ws[i]->bias) : NULL,
                             .n = n, .K = K, .N = ws[i]->n_out, .isa = cpu_isa()};
        x_decode_settings(&j[i]);
        if (!exact_fused(&j[i])) return 0;
    }
    for (int i = 0; i < count; i++) {
#if defined(KILN_X86)
        if (exact_lut(&j[i])) {
            if (!xl) {
                const size_t sz = sizeof(float) * (size_t)K;
                if (qm_buf_get(be, &sz, (void **)&xl, 1)) return 1; /* skipped; reported by cpu_error */
                lut_order_512(xl, x, K);
            }
            j[i].xl = xl;
            j[i].lut128 = lut128_ok(&j[i].p->grp);
        }
#endif
        t[i] = (struct cpu_task){x_fused_rows, &j[i], ws[i]->n_out};
    }
    cpu_parallel_for_split_tasks(be, t, count, x_row_bytes(ws[0]));
    return 1;
#endif
}
