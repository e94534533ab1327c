/*
 * qmatmul.c: y = x W^T + b on the CPU for the quantized formats (FP8 block,
 * GPTQ, AWQ, GGUF blocks). matmul.c hands every non-dense linear here.
 * Everything runs on the backend's worker pool (cpu_parallel_for), and each
 * kernel has a scalar reference path (KILN_CPU_ISA=scalar) that the tests
 * hold the AVX2 and AVX-512 paths to (test_quant.c, test_qgemm).
 *
 * Two numerics, both reading the weights as stored (or as repacked once at
 * load, for GPTQ/AWQ: format/quant.h struct qgrp):
 *
 *   exact   (FP8, GPTQ/AWQ 8-bit or with groups the int8 path cannot take;
 *           GGUF Q5_0/Q5_1; anything with KILN_QACT=f32)
 *           f32 activations, weights dequantized to f32 (w = s * q + b), f32
 *           products: equal to the dequantized weights' matmul up to f32
 *           summation order.
 *             decode (n <= 4): fused dequantize + FMA per row, no scratch,
 *               one run of rows per thread (AVX-512 one-row kernel for 4-bit
 *               GPTQ/AWQ; g128 in order: lut128_rows_512);
 *             prefill (n >= 8): a GEMM: NR weight rows dequantized once into
 *               an f32 panel [k][NR] (8 x 8 transposes), x packed once in
 *               tiles of MR tokens, an MR x NR register-tiled microkernel
 *               (AVX-512 12 x 32, AVX2 6 x 16);
 *             otherwise (scalar, n 5..7): one row dequantized to scratch and
 *               matmul.c's f32 dots.
 *   int8    (GGUF Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, the llama.cpp way; GPTQ
 *           and AWQ 4-bit with groups of 32, 64 or k x 128: its own section,
 *           "GPTQ / AWQ 4-bit with int8 activations", below)
 *           activations quantized once per call to int8 blocks of 32 (f32
 *           scale + the block's integer sum); integer dot products of the
 *           stored codes with the activation codes, scaled per block. Costs
 *           ~0.5% relative error per dot from rounding x: the tests bound it
 *           separately. KILN_QACT=f32 forces the exact path.
 *             decode (n = 1): one row at a time, 4+ independent accumulators,
 *               software prefetch, one contiguous run of rows per thread
 *               (cpu_parallel_for_split); AVX-512 VNNI kernels for Q8_0 / Q4_0
 *               (vpdpbusd, 8 block scales converted at once; Q4_0 two blocks
 *               per zmm);
 *             prefill (n >= 8, Q8_0 / Q4_0): the int8 GEMM below (weights
 *               repacked per call into 4-byte-interleaved panels, VNNI or
 *               AVX2 microkernel over tiles of tokens);
 *             otherwise: row dots over up to 4 activation rows (AVX2).
 *
 * Act-order GPTQ: x is permuted once per call (x'[k] = x[perm[k]]) so the
 * repacked rows read groups contiguously.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/simd.h"
#include "base/base.h"
#include "format/quant.h"

struct qprep {
    struct qgrp grp;    /* GPTQ / AWQ */
    float *fp8_scale;   /* FP8: [ceil(N/bn)][ceil(K/bk)] as f32 */
    int int8_act;       /* GGUF Q8_0/Q4_0/Q4_K: int8 activation path */
    int gact;           /* GPTQ / AWQ 4-bit with int8 activations: the group size, or 0 */
};

static float fp8_lut[256];
static int gact_group(const struct qgrp *g);

static int qact_f32(void) {
    const char *e = getenv("KILN_QACT");
    return e && !strcmp(e, "f32");
}

static int want_int8(enum kiln_dtype t) {
    if (qact_f32()) return 0;
    return t == KILN_DTYPE_Q8_0 || t == KILN_DTYPE_Q4_0 || t == KILN_DTYPE_Q4_1 || t == KILN_DTYPE_Q4_K || t == KILN_DTYPE_Q5_K ||
           t == KILN_DTYPE_Q6_K;
}

int cpu_qprepare_linear(struct qlinear *w, char *err, size_t errlen) {
    if (quant_check_linear(w, "linear", err, errlen)) return -1;
    struct qprep *p = kiln_calloc(1, sizeof *p);
    switch (w->fmt) {
    case KILN_WFMT_FP8: {
        if (!fp8_lut[0x38]) /* 0x38 = 1.0: the table is filled (idempotent, same values from any thread) */
            for (int i = 0; i < 256; i++) fp8_lut[i] = kiln_fp8e4m3_to_f32((uint8_t)i);
        int64_t n = w->scales.rows * w->scales.cols;
        p->fp8_scale = kiln_malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) p->fp8_scale[i] = quant_scalar(&w->scales, i);
        break;
    }
    case KILN_WFMT_GPTQ:
    case KILN_WFMT_AWQ:
        if (qgrp_pack(&p->grp, w, err, errlen)) {
            free(p);
            return -1;
        }
        p->gact = qact_f32() ? 0 : gact_group(&p->grp);
        break;
    case KILN_WFMT_GGUF: p->int8_act = want_int8(w->w.dtype); break;
    default: free(p); return kiln_errf(err, errlen, "cpu: weight format %d is not supported", (int)w->fmt);
    }
    w->be = p;
    return 0;
}

void cpu_qrelease_linear(struct qlinear *w) {
    struct qprep *p = w->be;
    if (!p) return;
    qgrp_free(&p->grp);
    free(p->fp8_scale);
    free(p);
    w->be = NULL;
}

#define AVX2 KILN_AVX2
#define AVX512 KILN_AVX512
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* ==== exact path: one row dequantized to scratch ==== */

static void row_fp8(const struct qlinear *w, const struct qprep *p, int r, float *y) {
    const uint8_t *q = (const uint8_t *)w->w.data + (size_t)r * w->n_in;
    const float *s = p->fp8_scale + (size_t)(r / w->block_n) * w->scales.cols;
    for (int k0 = 0, b = 0; k0 < w->n_in; k0 += w->block_k, b++) {
        int k1 = k0 + w->block_k < w->n_in ? k0 + w->block_k : w->n_in;
        float sc = s[b];
        for (int k = k0; k < k1; k++) y[k] = fp8_lut[q[k]] * sc;
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
        for (; k < k1; k++) y[k] = fp8_lut[q[k]] * s[b];
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
/* nx as a constant in each copy, so the accumulators stay in registers */
AVX2 static void fused_grp_avx2(const struct qgrp *g, int r, const float *const *x, int nx, float *out) {
    switch (nx) {
    case 1: fused_grp_avx2_(g, r, x, 1, out); break;
    case 2: fused_grp_avx2_(g, r, x, 2, out); break;
    case 3: fused_grp_avx2_(g, r, x, 3, out); break;
    default: fused_grp_avx2_(g, r, x, 4, out); break;
    }
}

AVX2 static inline __attribute__((always_inline)) void fused_fp8_avx2_(const struct qlinear *w, const struct qprep *p, int r, const float *const *x, int nx, float *out) {
    const uint8_t *q = (const uint8_t *)w->w.data + (size_t)r * w->n_in;
    const float *s = p->fp8_scale + (size_t)(r / w->block_n) * w->scales.cols;
    const __m128i m7f = _mm_set1_epi16(0x7f), m80 = _mm_set1_epi16(0x80);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float tail[4] = {0, 0, 0, 0};
    for (int k0 = 0, b = 0; k0 < w->n_in; k0 += w->block_k, b++) {
        int k1 = k0 + w->block_k < w->n_in ? k0 + w->block_k : w->n_in, k = k0;
        __m256 sc = _mm256_set1_ps(s[b] * 256.0f);
        for (; k + 8 <= k1; k += 8) {
            __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(q + k)));
            __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(v, m80), 8), _mm_slli_epi16(_mm_and_si128(v, m7f), 7));
            __m256 wv = _mm256_mul_ps(_mm256_cvtph_ps(h), sc);
            #pragma GCC unroll 4
            for (int j = 0; j < nx; j++) acc[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[j] + k), acc[j]);
        }
        for (; k < k1; k++)
            #pragma GCC unroll 4
            for (int j = 0; j < nx; j++) tail[j] += fp8_lut[q[k]] * s[b] * x[j][k];
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]) + tail[j];
}
/* nx as a constant in each copy, so the accumulators stay in registers */
AVX2 static void fused_fp8_avx2(const struct qlinear *w, const struct qprep *p, int r, const float *const *x, int nx, float *out) {
    switch (nx) {
    case 1: fused_fp8_avx2_(w, p, r, x, 1, out); break;
    case 2: fused_fp8_avx2_(w, p, r, x, 2, out); break;
    case 3: fused_fp8_avx2_(w, p, r, x, 3, out); break;
    default: fused_fp8_avx2_(w, p, r, x, 4, out); break;
    }
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
/* prefetch distance of the code stream (6144x2048 from DRAM, 2 threads:
 * 1 KiB 47-49, 4 KiB 53-58 GMAC/s) */
#define QPFD_G 4096

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
#define L128_PF1 2048
#define L128_PF2 32768
AVX512 static void lut128_rows_512(const struct qgrp *g, int64_t r0, int64_t r1, const float *xl, const float *bias, float *out) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int ng = g->n_group;
    for (int64_t r = r0; r < r1; r++) {
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
    /* GEMM (prefill): */
    float *xp;         /* activations packed in tiles of MR tokens, [tile][K][MR] */
    int MR, NR, ntile;
    void **scr;        /* per-thread scratch */
    size_t scr_bytes;
};

/* 64-byte aligned, aborts on failure */
static void *amalloc(size_t bytes) {
    void *p = NULL;
    KILN_CHECK(posix_memalign(&p, 64, bytes ? bytes : 64) == 0);
    return p;
}

/* The backend's reusable buffer for one call's activation-side arrays
 * (quantized / reordered x and the decode kernels' per-block vectors), cut
 * into 64-byte aligned pieces: qbuf_get(be, sizes, ptrs, n). Only the
 * calling thread uses it (matmuls are not nested), so decode does not pay
 * for 3-5 allocations per matmul. */
static void qbuf_get(struct kiln_backend *be, const size_t *sz, void **ptr, int n) {
    struct cpu_ctx *c = be->ctx;
    size_t tot = 0;
    for (int i = 0; i < n; i++) tot += (sz[i] + 63) & ~(size_t)63;
    if (tot > c->qscratch_cap) {
        free(c->qscratch);
        c->qscratch = amalloc(tot);
        c->qscratch_cap = tot;
    }
    char *p = c->qscratch;
    for (int i = 0; i < n; i++) ptr[i] = sz[i] ? p : NULL, p += (sz[i] + 63) & ~(size_t)63;
}

static void *thread_scratch(void **scr, int tid, size_t bytes) {
    if (!scr[tid]) {
        scr[tid] = amalloc(bytes);
    }
    return scr[tid];
}

static void free_scratch(void **scr, int nt) {
    for (int i = 0; i < nt; i++) free(scr[i]);
    free(scr);
}

/* dequantizes row r of any exact-path format into y[K] */
static void dequant_row(const struct xjob *j, int r, float *y) {
#if defined(KILN_X86)
    const int v = j->isa >= CPU_ISA_AVX2;
    switch (j->w->fmt) {
    case KILN_WFMT_FP8: (v ? row_fp8_avx2 : row_fp8)(j->w, j->p, r, y); break;
    case KILN_WFMT_GPTQ:
    case KILN_WFMT_AWQ: (v ? row_grp_avx2 : row_grp)(&j->p->grp, r, y); break;
#else
    switch (j->w->fmt) {
    case KILN_WFMT_FP8: row_fp8(j->w, j->p, r, y); break;
    case KILN_WFMT_GPTQ:
    case KILN_WFMT_AWQ: row_grp(&j->p->grp, r, y); break;
#endif
    default: quant_dequant_row(j->w->w.dtype, (const uint8_t *)j->w->w.data + (size_t)r * j->rb, y, j->K); break;
    }
}

#if defined(KILN_X86)
static void x_fused_rows(void *arg, int64_t r0, int64_t r1, int tid) {
    const struct xjob *j = arg;
    const float *xs[4];
    for (int t = 0; t < j->n; t++) xs[t] = j->x + (size_t)t * j->K;
    const int k512 = j->xl || (j->n == 1 && j->isa >= CPU_ISA_AVX512 && j->w->fmt != KILN_WFMT_FP8 && j->p->grp.bits == 4);
    cpu_isa_note(k512 ? CPU_ISA_AVX512 : CPU_ISA_AVX2, 0);
    if (j->lut128) {
        lut128_rows_512(&j->p->grp, r0, r1, j->xl, j->bias, j->out);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        float o[4];
        if (j->xl) o[0] = fused_grp1_lut_512(&j->p->grp, (int)r, j->xl);
        else if (j->n == 1 && j->isa >= CPU_ISA_AVX512 && j->w->fmt != KILN_WFMT_FP8 && j->p->grp.bits == 4) o[0] = fused_grp1_q4_512(&j->p->grp, (int)r, xs[0]);
        else if (j->w->fmt == KILN_WFMT_FP8) fused_fp8_avx2(j->w, j->p, (int)r, xs, j->n, o);
        else fused_grp_avx2(&j->p->grp, (int)r, xs, j->n, o);
        for (int t = 0; t < j->n; t++) j->out[(size_t)t * j->N + r] = o[t] + (j->bias ? j->bias[r] : 0.0f);
    }
    (void)tid;
}

#endif /* KILN_X86 */

static void x_rows(void *arg, int64_t r0, int64_t r1, int tid) {
    const struct xjob *j = arg;
    float *y = thread_scratch(j->scr, tid, j->scr_bytes);
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

#if defined(KILN_X86)
/* GEMM: x packed once in tiles of MR tokens ([k][MR], zero padded); per NR
 * output rows the weights are dequantized once into an f32 panel [k][NR]
 * (per-thread scratch, L2), then an MR x NR register-tiled microkernel runs
 * over every token tile (AVX-512 12 x 32, AVX2 6 x 16, as matmul.c's). */
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

AVX2 static inline __m256i mask8(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
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

static void x_gemm_panels(void *arg, int64_t p0, int64_t p1, int tid) {
    const struct xjob *j = arg;
    const int K = j->K, NR = j->NR, MR = j->MR;
    float *wp = thread_scratch(j->scr, tid, j->scr_bytes), *y = wp + (size_t)K * NR;
    for (int64_t pi = p0; pi < p1; pi++) {
        const int r0 = (int)pi * NR, nr = j->N - r0 < NR ? j->N - r0 : NR;
        for (int i0 = 0; i0 < NR; i0 += 8) {
            /* 8 rows dequantized, then transposed 8 x 8 into the panel */
            for (int i = 0; i < 8; i++) {
                float *yi = y + (size_t)i * K;
                if (i0 + i < nr) dequant_row(j, r0 + i0 + i, yi);
                else memset(yi, 0, sizeof(float) * (size_t)K);
            }
            transpose_rows8(wp + i0, NR, y, K);
        }
        const float *bias = j->bias ? j->bias + r0 : NULL;
        for (int tile = 0; tile < j->ntile; tile++) {
            int t0 = tile * MR, mr = j->n - t0 < MR ? j->n - t0 : MR;
            float *c = j->out + (size_t)t0 * j->N + r0;
            const float *xp = j->xp + (size_t)tile * K * MR;
            if (j->isa >= CPU_ISA_AVX512) ukr_f32_512(xp, wp, K, c, j->N, mr, nr, bias);
            else ukr_f32_avx2(xp, wp, K, c, j->N, mr, nr, bias);
        }
    }
}

#endif /* KILN_X86 */

/* n at or above which the exact path runs the GEMM (below: row dots) */
#define XGEMM_MIN 8

/* the decode paths of the exact numerics: fused dequantize + FMA per row
 * (n <= 4), and with it the lookup kernels of 4-bit groups (n = 1) */
#if defined(KILN_X86)
static int exact_fused(const struct xjob *j) { return j->isa >= CPU_ISA_AVX2 && j->n <= 4 && j->w->fmt != KILN_WFMT_GGUF; }
static int exact_lut(const struct xjob *j) {
    return j->n == 1 && j->isa >= CPU_ISA_AVX512 && j->w->fmt != KILN_WFMT_FP8 && lut_ok(&j->p->grp);
}

#endif

static void matmul_exact(struct kiln_backend *be, float *out, const float *x, const struct qlinear *w, int n) {
    const struct qprep *p = w->be;
    const int K = w->n_in, N = w->n_out, nt = cpu_n_threads(be);
    float *xperm = NULL;
    if ((w->fmt == KILN_WFMT_GPTQ || w->fmt == KILN_WFMT_AWQ) && p->grp.perm) {
        xperm = kiln_malloc(sizeof(float) * (size_t)n * K);
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++) xperm[(size_t)t * K + k] = x[(size_t)t * K + p->grp.perm[k]];
        x = xperm;
    }
    struct xjob j = {.w = w, .p = p, .out = out, .x = x, .bias = w->bias.data ? cpu_vec(&w->bias) : NULL, .n = n, .K = K, .N = N,
                     .isa = cpu_isa(), .rb = w->fmt == KILN_WFMT_GGUF ? quant_row_bytes(w->w.dtype, K) : 0};
    /* rows per chunk: ~64 KiB of dequantized weights */
    int64_t chunk = (64 << 10) / ((int64_t)K * 4) + 1;
#if defined(KILN_X86)
    if (exact_fused(&j)) { /* decode: fused, no scratch */
        if (exact_lut(&j)) {
            float *xl;
            const size_t sz = sizeof(float) * (size_t)K;
            qbuf_get(be, &sz, (void **)&xl, 1);
            lut_order_512(xl, x, K);
            j.xl = xl;
            j.lut128 = lut128_ok(&p->grp);
        }
        cpu_parallel_for_split(be, N, chunk * 4, x_fused_rows, &j);
    } else if (j.isa >= CPU_ISA_AVX2 && n >= XGEMM_MIN) {
        cpu_isa_note(j.isa, 0); /* x_pack, the dequantized panels, ukr_f32_* */
        j.MR = j.isa >= CPU_ISA_AVX512 ? 12 : 6, j.NR = j.isa >= CPU_ISA_AVX512 ? 32 : 16;
        j.ntile = (n + j.MR - 1) / j.MR;
        j.xp = amalloc(sizeof(float) * (size_t)j.ntile * j.MR * K);
        j.scr = kiln_calloc((size_t)nt, sizeof(void *));
        cpu_parallel_for(be, j.ntile, 1, x_pack, &j);
        j.scr_bytes = sizeof(float) * ((size_t)K * j.NR + 8 * (size_t)K);
        cpu_parallel_for(be, (N + j.NR - 1) / j.NR, 1, x_gemm_panels, &j);
        free(j.xp);
        free_scratch(j.scr, nt);
    } else
#endif
    { /* row dots on dequantized rows (NEON: matmul.c's dot) */
        j.scr = kiln_calloc((size_t)nt, sizeof(void *));
        j.scr_bytes = sizeof(float) * (size_t)K;
        cpu_parallel_for(be, N, chunk, x_rows, &j);
        free_scratch(j.scr, nt);
    }
    free(xperm);
}

/* ==== int8 activation path (GGUF Q8_0, Q4_0, Q4_K) ==== */

/* One activation block: 32 codes, scale d (x ~ d * qs), and sum(qs). */
struct q8a {
    float d;
    int32_t sum;
    int8_t qs[32];
};

static void quantize_act(const float *x, struct q8a *b, int K) {
    for (int o = 0; o < K; o += 32, b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[o + i]));
        float d = amax / 127, id = d > 0 ? 1 / d : 0;
        int s = 0;
        for (int i = 0; i < 32; i++) {
            int v = (int)lrintf(x[o + i] * id);
            b->qs[i] = (int8_t)v;
            s += v;
        }
        b->d = d, b->sum = s;
    }
}

/* Activations quantized with AVX2: the same arithmetic as quantize_act
 * (amax, d = amax / 127, id = 1 / d, x * id rounded to nearest even by
 * cvtps2dq as lrintf does), so the codes are bit-identical. Block b of the
 * row goes to out[b * stride] (stride 1: row-major; NT: the GEMM's tiles). */
#if defined(KILN_X86)
AVX2 static void quantize_act_avx2(const float *x, struct q8a *b, int K, int stride) {
    const __m256 sgn = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), one8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1);
    for (int o = 0; o < K; o += 32, b += stride) {
        __m256 v0 = _mm256_loadu_ps(x + o), v1 = _mm256_loadu_ps(x + o + 8), v2 = _mm256_loadu_ps(x + o + 16), v3 = _mm256_loadu_ps(x + o + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sgn, v0), _mm256_andnot_ps(sgn, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sgn, v2), _mm256_andnot_ps(sgn, v3)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h);
        float d = amax / 127, id = d > 0 ? 1 / d : 0;
        __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3)), perm);
        _mm256_storeu_si256((__m256i *)b->qs, q);
        __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(one8, q), one16);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        b->d = d, b->sum = _mm_cvtsi128_si32(s4);
    }
}

#endif

static inline float h2f(const uint8_t *p) { return kiln_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static inline void k4_scale_min(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63, *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static float dot_q8_0_scalar(const uint8_t *w, const struct q8a *a, int nb) {
    float acc = 0;
    for (int i = 0; i < nb; i++, w += 34) {
        int s = 0;
        for (int j = 0; j < 32; j++) s += (int8_t)w[2 + j] * a[i].qs[j];
        acc += h2f(w) * a[i].d * (float)s;
    }
    return acc;
}

static float dot_q4_0_scalar(const uint8_t *w, const struct q8a *a, int nb) {
    float acc = 0;
    for (int i = 0; i < nb; i++, w += 18) {
        int s = 0;
        for (int j = 0; j < 16; j++) s += (w[2 + j] & 15) * a[i].qs[j] + (w[2 + j] >> 4) * a[i].qs[j + 16];
        acc += h2f(w) * a[i].d * (float)(s - 8 * a[i].sum);
    }
    return acc;
}

static float dot_q4_1_scalar(const uint8_t *w, const struct q8a *a, int nb) {
    float acc = 0;
    for (int i = 0; i < nb; i++, w += 20) {
        int s = 0;
        for (int j = 0; j < 16; j++) s += (w[4 + j] & 15) * a[i].qs[j] + (w[4 + j] >> 4) * a[i].qs[j + 16];
        acc += a[i].d * (h2f(w) * (float)s + h2f(w + 2) * (float)a[i].sum);
    }
    return acc;
}

static float dot_q5_k_scalar(const uint8_t *w, const struct q8a *a, int nsb) {
    float acc = 0;
    for (int i = 0; i < nsb; i++, w += 176, a += 8) {
        float d = h2f(w), dmin = h2f(w + 2);
        const uint8_t *qh = w + 16, *qs = w + 48;
        for (int c = 0; c < 4; c++)
            for (int h = 0; h < 2; h++) {
                int sc, m, s = 0, j = 2 * c + h;
                k4_scale_min(j, w + 4, &sc, &m);
                for (int l = 0; l < 32; l++) s += ((((qs[32 * c + l] >> (4 * h)) & 15)) | (((qh[l] >> j) & 1) << 4)) * a[j].qs[l];
                acc += a[j].d * (d * sc * (float)s - dmin * m * (float)a[j].sum);
            }
    }
    return acc;
}

static float dot_q4_k_scalar(const uint8_t *w, const struct q8a *a, int nsb) {
    float acc = 0;
    for (int i = 0; i < nsb; i++, w += 144, a += 8) {
        float d = h2f(w), dmin = h2f(w + 2);
        const uint8_t *qs = w + 16;
        for (int c = 0; c < 4; c++)
            for (int h = 0; h < 2; h++) {
                int sc, m, s = 0, j = 2 * c + h;
                k4_scale_min(j, w + 4, &sc, &m);
                for (int l = 0; l < 32; l++) s += ((qs[32 * c + l] >> (4 * h)) & 15) * a[j].qs[l];
                acc += a[j].d * (d * sc * (float)s - dmin * m * (float)a[j].sum);
            }
    }
    return acc;
}

/* Q6_K: 32-weight group j = 4h + s of half h holds ql low/high nibbles and
 * two bits of qh (see format/quant.c); q - 32 is signed, scales per 16. */
static float dot_q6_k_scalar(const uint8_t *w, const struct q8a *a, int nsb) {
    float acc = 0;
    for (int i = 0; i < nsb; i++, w += 210, a += 8) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        float d = h2f(w + 208);
        for (int h = 0; h < 2; h++)
            for (int s4 = 0; s4 < 4; s4++) {
                const struct q8a *x = &a[4 * h + s4];
                int sum[2] = {0, 0};
                for (int l = 0; l < 32; l++) {
                    int lo = s4 < 2 ? ql[64 * h + 32 * s4 + l] & 15 : ql[64 * h + 32 * (s4 - 2) + l] >> 4;
                    int q = (lo | (((qh[32 * h + l] >> (2 * s4)) & 3) << 4)) - 32;
                    sum[l >> 4] += q * x->qs[l];
                }
                acc += d * x->d * (float)(sc[8 * h + 2 * s4] * sum[0] + sc[8 * h + 2 * s4 + 1] * sum[1]);
            }
    }
    return acc;
}

#if defined(KILN_X86)
/* sum over 32 lanes of u8 a * s8 b, as 8 i32 lanes converted to f32 */
AVX2 static inline __m256 dot_u8s8(__m256i a, __m256i b) {
    __m256i p = _mm256_maddubs_epi16(a, b);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* f16 -> f32 with F16C, inline (kiln_f16_to_f32 is a call per block) */
AVX2 static inline float h2f_c(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

#endif /* KILN_X86 */

/* The AVX2 kernels take up to 4 activation rows (nx) per pass over a weight
 * row, so at prefill each block is unpacked once per 4 tokens. */
#define NX 4

#if defined(KILN_X86)

/* dot_<fmt>_avx2 over nx <= 4 activation rows: a switch onto copies of the
 * kernel dot_<fmt>_avx2_ with nx a constant, so the accumulators stay in
 * registers */
#define QDOTX_BY_NX(name)                                                                               \
    AVX2 static void name(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out) { \
        switch (nx) {                                                                                   \
        case 1: name##_(w, a, 1, nb, out); break;                                                       \
        case 2: name##_(w, a, 2, nb, out); break;                                                       \
        case 3: name##_(w, a, 3, nb, out); break;                                                       \
        default: name##_(w, a, 4, nb, out); break;                                                      \
        }                                                                                               \
    }

AVX2 static inline __attribute__((always_inline)) void dot_q8_0_avx2_(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out) {
    __m256 acc[NX];
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++, w += 34) {
        __m256i qw = _mm256_loadu_si256((const __m256i *)(w + 2)), aw = _mm256_sign_epi8(qw, qw);
        float d = h2f_c(w);
        #pragma GCC unroll 4
        for (int j = 0; j < nx; j++) {
            __m256 s = dot_u8s8(aw, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)a[j][i].qs), qw));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[j][i].d), s, acc[j]);
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]);
}
QDOTX_BY_NX(dot_q8_0_avx2)

AVX2 static inline __attribute__((always_inline)) void dot_q4_0_avx2_(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out) {
    __m256 acc[NX];
    float off[NX] = {0};
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15);
    for (int i = 0; i < nb; i++, w += 18) {
        __m128i b = _mm_loadu_si128((const __m128i *)(w + 2));
        __m256i qw = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
        float d = h2f_c(w);
        #pragma GCC unroll 4
        for (int j = 0; j < nx; j++) {
            __m256 s = dot_u8s8(qw, _mm256_loadu_si256((const __m256i *)a[j][i].qs));
            float dd = d * a[j][i].d;
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dd), s, acc[j]);
            off[j] += dd * (float)a[j][i].sum;
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]) - 8 * off[j];
}
QDOTX_BY_NX(dot_q4_0_avx2)

/* Q4_K / Q5_K: the sub-block pair (sb, sb + 1) of a superblock, its weights
 * as unsigned bytes lo (sub-block sb) and hi (sb + 1), against activation
 * blocks b and b + 1 of each of the nx rows; scales and mins from the
 * superblock's packed 6-bit table sc, the mins' part summed apart */
AVX2 static inline __attribute__((always_inline)) void kq_pair_avx2(__m256 *acc, float *mins, const struct q8a *const *a, int nx,
                                                                     int b, float d, float dmin, int sb, const uint8_t *sc,
                                                                     __m256i lo, __m256i hi) {
    int s0, m0, s1, m1;
    k4_scale_min(sb, sc, &s0, &m0);
    k4_scale_min(sb + 1, sc, &s1, &m1);
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) {
        const struct q8a *a0 = &a[j][b], *a1 = a0 + 1;
        acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * s0 * a0->d), dot_u8s8(lo, _mm256_loadu_si256((const __m256i *)a0->qs)), acc[j]);
        acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * s1 * a1->d), dot_u8s8(hi, _mm256_loadu_si256((const __m256i *)a1->qs)), acc[j]);
        mins[j] += dmin * (m0 * a0->d * (float)a0->sum + m1 * a1->d * (float)a1->sum);
    }
}

AVX2 static inline __attribute__((always_inline)) void dot_q4_k_avx2_(const uint8_t *w, const struct q8a *const *a, int nx, int nsb, float *out) {
    __m256 acc[NX];
    float mins[NX] = {0};
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int i = 0; i < nsb; i++, w += 144) {
        float d = h2f_c(w), dmin = h2f_c(w + 2);
        const uint8_t *qs = w + 16;
        for (int c = 0; c < 4; c++) {
            __m256i b = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            kq_pair_avx2(acc, mins, a, nx, 8 * i + 2 * c, d, dmin, 2 * c, w + 4, lo, hi);
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]) - mins[j];
}
QDOTX_BY_NX(dot_q4_k_avx2)

AVX2 static inline __attribute__((always_inline)) void dot_q4_1_avx2_(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out) {
    __m256 acc[NX];
    float off[NX] = {0};
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15);
    for (int i = 0; i < nb; i++, w += 20) {
        __m128i b = _mm_loadu_si128((const __m128i *)(w + 4));
        __m256i qw = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
        float d = h2f_c(w), m = h2f_c(w + 2);
        #pragma GCC unroll 4
        for (int j = 0; j < nx; j++) {
            __m256 s = dot_u8s8(qw, _mm256_loadu_si256((const __m256i *)a[j][i].qs));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[j][i].d), s, acc[j]);
            off[j] += m * a[j][i].d * (float)a[j][i].sum;
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]) + off[j];
}
QDOTX_BY_NX(dot_q4_1_avx2)

AVX2 static inline __attribute__((always_inline)) void dot_q5_k_avx2_(const uint8_t *w, const struct q8a *const *a, int nx, int nsb, float *out) {
    __m256 acc[NX];
    float mins[NX] = {0};
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15), m1 = _mm256_set1_epi8(1);
    for (int i = 0; i < nsb; i++, w += 176) {
        float d = h2f_c(w), dmin = h2f_c(w + 2);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 16));
        const uint8_t *qs = w + 48;
        for (int c = 0; c < 4; c++) {
            __m256i b = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            /* bit 2c / 2c+1 of qh[l] is bit 4 of the low / high sub-block's weight l */
            __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), m1), 4);
            __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), m1), 4);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(b, m4), h0), hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4), h1);
            kq_pair_avx2(acc, mins, a, nx, 8 * i + 2 * c, d, dmin, 2 * c, w + 4, lo, hi);
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]) - mins[j];
}
QDOTX_BY_NX(dot_q5_k_avx2)

AVX2 static inline __attribute__((always_inline)) void dot_q6_k_avx2_(const uint8_t *w, const struct q8a *const *a, int nx, int nsb, float *out) {
    __m256 acc[NX];
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
    for (int i = 0; i < nsb; i++, w += 210) {
        const int8_t *sc = (const int8_t *)(w + 192);
        const float d = h2f_c(w + 208);
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h)), ql1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            __m256i lo[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
            for (int s4 = 0; s4 < 4; s4++) {
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * s4), m3);
                __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo[s4], _mm256_slli_epi16(hi, 4)), m32); /* -32..31 */
                __m256i aq = _mm256_sign_epi8(q, q);
                float s0 = d * sc[8 * h + 2 * s4], s1 = d * sc[8 * h + 2 * s4 + 1];
                #pragma GCC unroll 4
                for (int j = 0; j < nx; j++) {
                    const struct q8a *x = &a[j][8 * i + 4 * h + s4];
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x->qs), q)),
                                                  _mm256_set1_epi16(1));
                    /* i32 lanes 0-3 sum weights 0-15 (scale 2s), lanes 4-7 weights 16-31 (scale 2s+1) */
                    float t0 = s0 * x->d, t1 = s1 * x->d;
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_setr_ps(t0, t0, t0, t0, t1, t1, t1, t1), acc[j]);
                }
            }
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]);
}
QDOTX_BY_NX(dot_q6_k_avx2)

#endif /* KILN_X86 */

typedef float (*qdot_fn)(const uint8_t *w, const struct q8a *a, int nb);
typedef void (*qdotx_fn)(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out);

/* ==== int8 GEMM (prefill) for Q8_0 / Q4_0 ====
 *
 * The weights of R output rows are repacked per call into a panel where one
 * vector holds 4 consecutive k of each of the R rows ([block][quad][R][4]
 * bytes, then the R block scales as f32); the activations are quantized into
 * tiles of NT tokens ([block][NT] q8a). Per block, each weight vector meets
 * the 4 codes of NT tokens (one broadcast each): NT integer dot products of
 * R rows x 4 k per weight load, then one convert and one FMA per token with
 * the R weight scales times the token's block scale. Every weight byte is
 * read from the panel (L1/L2) once per NT tokens, every activation code once
 * per R rows.
 *
 *   AVX-512 VNNI  R = 16 (zmm), NT = 8, vpdpbusd of u8 weights (Q4_0: the
 *                 nibble; Q8_0: w + 128) with s8 activations; the offset
 *                 comes back as -8 or -128 x the block's activation sum,
 *                 the accumulator's start value.
 *   AVX2          R = 8 (ymm), NT = 4. Q4_0: maddubs(nibbles, x) summed in
 *                 i16 over the whole block (8 x 2 x 15 x 127 < 2^15), one
 *                 madd per block. Q8_0: llama.cpp's sign trick
 *                 (maddubs(|w|, sign(x, w))), madd per quad.
 *
 * Integer sums are exact, so each block's contribution equals the row dot's
 * (dot_*_avx2, dot_*_scalar) up to the f32 summation order. */

enum { PK_Q8_S8 = 0, PK_Q8_U8 = 1, PK_Q4 = 2 };

#if defined(KILN_X86)


/* rows r0 .. r0+nr-1 (nr <= R; missing rows repeat the last one with scale
 * 0) into the panel P: per block 32 * R code bytes, then R f32 scales */
AVX2 static void pack_i8(uint8_t *P, const uint8_t *W, size_t rb, int r0, int nr, int nb, int R, int mode) {
    const size_t bs = 36 * (size_t)R;
    const int blk = mode == PK_Q4 ? 18 : 34;
    const __m128i m4 = _mm_set1_epi8(15);
    const __m256i x80 = _mm256_set1_epi8((char)0x80);
    for (int i0 = 0; i0 < R; i0 += 8) {
        const uint8_t *rp[8];
        for (int i = 0; i < 8; i++) rp[i] = W + (size_t)(r0 + (i0 + i < nr ? i0 + i : nr - 1)) * rb;
        for (int b = 0; b < nb; b++) {
            __m256 v[8];
            for (int i = 0; i < 8; i++) {
                const uint8_t *q = rp[i] + (size_t)blk * b;
                __m256i c;
                if (mode == PK_Q4) {
                    __m128i h = _mm_loadu_si128((const __m128i *)(q + 2));
                    c = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(h, 4), m4), _mm_and_si128(h, m4));
                } else {
                    c = _mm256_loadu_si256((const __m256i *)(q + 2));
                    if (mode == PK_Q8_U8) c = _mm256_xor_si256(c, x80);
                }
                v[i] = _mm256_castsi256_ps(c);
            }
            kiln_transpose8(v);
            uint8_t *d = P + (size_t)b * bs;
            for (int qd = 0; qd < 8; qd++) _mm256_storeu_ps((float *)(d + (size_t)qd * 4 * R + 4 * i0), v[qd]);
            float *sc = (float *)(d + 32 * (size_t)R);
            for (int i = 0; i < 8; i++) sc[i0 + i] = i0 + i < nr ? h2f_c(rp[i] + (size_t)blk * b) : 0.0f;
        }
    }
}


/* R = 16 rows x NT = 8 tokens; corr 128 (Q8_0 as u8) or 8 (Q4_0) */
VNNI static void gemm_i8_vnni(const uint8_t *P, const struct q8a *xt, int nb, int corr, float *out, size_t ldo, int nr, int nt,
                              const float *bias) {
    __m512 f[8];
    #pragma GCC unroll 16
    for (int t = 0; t < 8; t++) f[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++, P += 576, xt += 8) {
        __m512i s[8];
        #pragma GCC unroll 16
        for (int t = 0; t < 8; t++) s[t] = _mm512_set1_epi32(-corr * xt[t].sum);
        #pragma GCC unroll 16
        for (int q = 0; q < 8; q++) {
            __m512i wv = _mm512_loadu_si512((const void *)(P + 64 * q));
            #pragma GCC unroll 16
            for (int t = 0; t < 8; t++) {
                int32_t a;
                memcpy(&a, xt[t].qs + 4 * q, 4);
                s[t] = _mm512_dpbusd_epi32(s[t], wv, _mm512_set1_epi32(a));
            }
        }
        __m512 sw = _mm512_loadu_ps((const float *)(P + 512));
        #pragma GCC unroll 16
        for (int t = 0; t < 8; t++) f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(sw, _mm512_set1_ps(xt[t].d)), f[t]);
    }
    __mmask16 m = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias) : _mm512_setzero_ps();
    #pragma GCC unroll 16
    for (int t = 0; t < 8; t++)
        if (t < nt) _mm512_mask_storeu_ps(out + t * ldo, m, _mm512_add_ps(f[t], bv));
}

/* R = 8 rows x NT = 4 tokens */
AVX2 static void gemm_q4_0_avx2(const uint8_t *P, const struct q8a *xt, int nb, float *out, size_t ldo, int nr, int nt, const float *bias) {
    __m256 f[4];
    const __m256i one16 = _mm256_set1_epi16(1);
    #pragma GCC unroll 16
    for (int t = 0; t < 4; t++) f[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, P += 288, xt += 4) {
        __m256i s[4];
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) s[t] = _mm256_setzero_si256();
        #pragma GCC unroll 16
        for (int q = 0; q < 8; q++) {
            __m256i wv = _mm256_loadu_si256((const __m256i *)(P + 32 * q));
            #pragma GCC unroll 16
            for (int t = 0; t < 4; t++) {
                int32_t a;
                memcpy(&a, xt[t].qs + 4 * q, 4);
                s[t] = _mm256_add_epi16(s[t], _mm256_maddubs_epi16(wv, _mm256_set1_epi32(a)));
            }
        }
        __m256 sw = _mm256_loadu_ps((const float *)(P + 256));
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) {
            __m256i i = _mm256_add_epi32(_mm256_madd_epi16(s[t], one16), _mm256_set1_epi32(-8 * xt[t].sum));
            f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(sw, _mm256_set1_ps(xt[t].d)), f[t]);
        }
    }
    __m256i m = mask8(nr);
    __m256 bv = bias ? _mm256_maskload_ps(bias, m) : _mm256_setzero_ps();
    #pragma GCC unroll 16
    for (int t = 0; t < 4; t++)
        if (t < nt) _mm256_maskstore_ps(out + t * ldo, m, _mm256_add_ps(f[t], bv));
}

AVX2 static void gemm_q8_0_avx2(const uint8_t *P, const struct q8a *xt, int nb, float *out, size_t ldo, int nr, int nt, const float *bias) {
    __m256 f[4];
    const __m256i one16 = _mm256_set1_epi16(1);
    #pragma GCC unroll 16
    for (int t = 0; t < 4; t++) f[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, P += 288, xt += 4) {
        __m256i s[4];
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) s[t] = _mm256_setzero_si256();
        #pragma GCC unroll 16
        for (int q = 0; q < 8; q++) {
            __m256i wv = _mm256_loadu_si256((const __m256i *)(P + 32 * q)), aw = _mm256_sign_epi8(wv, wv);
            #pragma GCC unroll 16
            for (int t = 0; t < 4; t++) {
                int32_t a;
                memcpy(&a, xt[t].qs + 4 * q, 4);
                __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_set1_epi32(a), wv));
                s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(p, one16));
            }
        }
        __m256 sw = _mm256_loadu_ps((const float *)(P + 256));
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(sw, _mm256_set1_ps(xt[t].d)), f[t]);
    }
    __m256i m = mask8(nr);
    __m256 bv = bias ? _mm256_maskload_ps(bias, m) : _mm256_setzero_ps();
    #pragma GCC unroll 16
    for (int t = 0; t < 4; t++)
        if (t < nt) _mm256_maskstore_ps(out + t * ldo, m, _mm256_add_ps(f[t], bv));
}


/* Decode (one activation row): 4 blocks per step into 4 accumulators, so
 * the FMA latency is hidden (one accumulator waits ~4 cycles per block);
 * the -8 / -128 offset x the block's activation sum enters the integer
 * lane 0 (no scalar float chain). VNNI: one vpdpbusd per block (Q8_0 as
 * w + 128, Q4_0 nibbles); AVX2: maddubs + madd (Q8_0 with the sign trick). */
/* software prefetch 8 KiB ahead of the weight stream (decode, 2 threads,
 * 6144x2048 weights from DRAM: none -> 2 KiB -> 8 KiB, Q4_0 ~40 -> 64-69 ->
 * 74-75 GMAC/s, Q8_0 ~30 -> 35-38 -> 40-42) */
#define QPFD 8192
#define KILN_PF(p) _mm_prefetch((const char *)(p) + QPFD, _MM_HINT_T0)
#define DOT1_BODY(DOTI)                                                                                   \
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}; \
    int i = 0;                                                                                            \
    for (; i + 4 <= nb; i += 4) {                                                                         \
        KILN_PF(w + (size_t)BS * i);                                                                      \
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {                                             \
            const uint8_t *bw = w + (size_t)BS * (i + u);                                                 \
            const struct q8a *x = a + i + u;                                                              \
            acc[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOTI(bw, x)), _mm256_set1_ps(h2f_c(bw) * x->d), acc[u]); \
        }                                                                                                 \
    }                                                                                                     \
    for (; i < nb; i++) {                                                                                 \
        const uint8_t *bw = w + (size_t)BS * i;                                                           \
        const struct q8a *x = a + i;                                                                      \
        acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOTI(bw, x)), _mm256_set1_ps(h2f_c(bw) * x->d), acc[0]); \
    }                                                                                                     \
    return kiln_hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));

AVX2 static inline __m256i q4_codes(const uint8_t *bw) {
    __m128i v = _mm_loadu_si128((const __m128i *)(bw + 2)), m4 = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
}
AVX2 static inline __m256i lane0(int v) { return _mm256_zextsi128_si256(_mm_cvtsi32_si128(v)); }
#define XQS(x) _mm256_loadu_si256((const __m256i *)(x)->qs)

#define DOTI_Q4_AVX2(bw, x) \
    _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(q4_codes(bw), XQS(x)), _mm256_set1_epi16(1)), lane0(-8 * (x)->sum))
#define DOTI_Q8_AVX2(bw, x)                                                                                              \
    ({                                                                                                                   \
        __m256i qw_ = _mm256_loadu_si256((const __m256i *)((bw) + 2));                                                   \
        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(qw_, qw_), _mm256_sign_epi8(XQS(x), qw_)), _mm256_set1_epi16(1)); \
    })
#define DOTI_Q4_VNNI(bw, x) _mm256_dpbusd_epi32(lane0(-8 * (x)->sum), q4_codes(bw), XQS(x))
#define DOTI_Q8_VNNI(bw, x) \
    _mm256_dpbusd_epi32(lane0(-128 * (x)->sum), _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)((bw) + 2)), _mm256_set1_epi8((char)0x80)), XQS(x))

#define BS 18
AVX2 static float dot1_q4_0_avx2(const uint8_t *w, const struct q8a *a, int nb) { DOT1_BODY(DOTI_Q4_AVX2) }
VNNI static float dot1_q4_0_vnni(const uint8_t *w, const struct q8a *a, int nb) { DOT1_BODY(DOTI_Q4_VNNI) }
#undef BS
#define BS 34
AVX2 static float dot1_q8_0_avx2(const uint8_t *w, const struct q8a *a, int nb) { DOT1_BODY(DOTI_Q8_AVX2) }
VNNI static float dot1_q8_0_vnni(const uint8_t *w, const struct q8a *a, int nb) { DOT1_BODY(DOTI_Q8_VNNI) }
#undef BS



/* Decode with VNNI, 8 blocks per step: the 8 weight scales are gathered
 * into one vector (pinsrw + vcvtph2ps) and multiplied by the 8 activation
 * scales (xd, contiguous) at once, then broadcast per block with vpermps;
 * the -8 / -128 x sum offset comes in as the dpbusd accumulator, a vector
 * precomputed per call (corr), so a block costs its unpack, one vpdpbusd,
 * a convert, a permute and an FMA. */
#define SC16(u) ((short)(w[(size_t)BS * (i + (u))] | w[(size_t)BS * (i + (u)) + 1] << 8)) /* block u's f16 scale bits */
#define DOT1V_BODY(CODES, OFS)                                                                           \
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}; \
    int i = 0;                                                                                           \
    for (; i + 8 <= nb; i += 8) {                                                                        \
        KILN_PF(w + (size_t)BS * i);                                                                     \
        KILN_PF(w + (size_t)BS * i + 64);                                                                \
        KILN_PF(w + (size_t)BS * i + 128);                                                               \
        /* constant lane indices (pinsrw needs them at any -O level) */                                 \
        const __m128i h = _mm_set_epi16(SC16(7), SC16(6), SC16(5), SC16(4), SC16(3), SC16(2), SC16(1), SC16(0)); \
        const __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(xd + i));                    \
        _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) {                                            \
            const uint8_t *bw = w + (size_t)BS * (i + u);                                                \
            __m256i s = _mm256_dpbusd_epi32(_mm256_load_si256(corr + i + u), CODES(bw), XQS(a + i + u));  \
            acc[u & 3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_permutevar8x32_ps(dd, _mm256_set1_epi32(u)), acc[u & 3]); \
        }                                                                                                \
    }                                                                                                    \
    for (; i < nb; i++) {                                                                                \
        const uint8_t *bw = w + (size_t)BS * i;                                                          \
        __m256i s = _mm256_dpbusd_epi32(_mm256_load_si256(corr + i), CODES(bw), XQS(a + i));              \
        acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(h2f_c(bw) * xd[i]), acc[0]);      \
    }                                                                                                    \
    return kiln_hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));

#define Q8U_CODES(bw) _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)((bw) + 2)), _mm256_set1_epi8((char)0x80))
typedef float (*qdot1v_fn)(const uint8_t *w, const __m256i *corr, const float *xd, const struct q8a *a, int nb);
#define BS 18
VNNI static float dot1v_q4_0(const uint8_t *w, const __m256i *corr, const float *xd, const struct q8a *a, int nb) { DOT1V_BODY(q4_codes, 8) }
#undef BS
#define BS 34
VNNI static float dot1v_q8_0(const uint8_t *w, const __m256i *corr, const float *xd, const struct q8a *a, int nb) { DOT1V_BODY(Q8U_CODES, 128) }
#undef BS

/* Decode without VNNI (AVX2), 8 blocks per step. Per step the 8 f16 weight
 * scales are gathered into one vector, converted and multiplied by the 8
 * activation scales (xd) at once; a block's scale reaches its lanes by a
 * vpermps instead of a scalar convert, multiply and broadcast per block.
 * Q8_0: one block per ymm, the sign trick (maddubs(|w|, sign(x, w))) and a
 * madd. Q4_0: two blocks per ymm, [block i low 16 | i+1 low 16] and the
 * high halves against the activations laid out the same way once per call
 * (act2, as the AVX-512 kernel's), two maddubs added in i16 (|sum| <= 2 x 2
 * x 15 x 128), one madd: lanes 0-3 belong to block i, 4-7 to i+1. Q4_0's
 * -8 offset leaves the integer sums: sum_b d_b (-8 sum_b x) is one FMA of
 * the 8 scales with the per-call vector cs = -8 x sum per block. Tails
 * (nb % 8 blocks) as dot1_*_avx2. The same f32 products as those, summed
 * in another order. */
#define PF8(bytes) \
    for (int o_ = 0; o_ < (bytes); o_ += 64) KILN_PF(w + (size_t)BS * i + o_)
#define BS 34
AVX2 static float dot1a_q8_0(const uint8_t *w, const float *xd, const struct q8a *a, int nb) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const __m256i one16 = _mm256_set1_epi16(1);
    int i = 0;
    for (; i + 8 <= nb; i += 8) {
        PF8(8 * BS);
        const __m128i h = _mm_set_epi16(SC16(7), SC16(6), SC16(5), SC16(4), SC16(3), SC16(2), SC16(1), SC16(0));
        const __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(xd + i));
        #pragma GCC unroll 8
        for (int u = 0; u < 8; u++) {
            const __m256i qw = _mm256_loadu_si256((const __m256i *)(w + (size_t)BS * (i + u) + 2));
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(XQS(a + i + u), qw)), one16);
            acc[u & 3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_permutevar8x32_ps(dd, _mm256_set1_epi32(u)), acc[u & 3]);
        }
    }
    for (; i < nb; i++) {
        const uint8_t *bw = w + (size_t)BS * i;
        acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOTI_Q8_AVX2(bw, a + i)), _mm256_set1_ps(h2f_c(bw) * a[i].d), acc[0]);
    }
    return kiln_hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}
#undef BS
#define BS 18
AVX2 static float dot1a_q4_0(const uint8_t *w, const void *act2, const float *xd, const float *cs, const struct q8a *a, int nb) {
    const __m256i *x2 = act2;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 off = _mm256_setzero_ps();
    const __m256i one16 = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(15);
    int i = 0;
    for (; i + 8 <= nb; i += 8) {
        PF8(8 * BS);
        const __m128i h = _mm_set_epi16(SC16(7), SC16(6), SC16(5), SC16(4), SC16(3), SC16(2), SC16(1), SC16(0));
        const __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(xd + i));
        off = _mm256_fmadd_ps(dd, _mm256_loadu_ps(cs + i), off);
        #pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            const uint8_t *b0 = w + (size_t)BS * (i + 2 * u);
            const __m256i v = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(b0 + BS + 2)), _mm_loadu_si128((const __m128i *)(b0 + 2)));
            const __m256i *xq = x2 + (i + 2 * u); /* pair (i + 2u) / 2: 2 ymm */
            const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v, m4), _mm256_loadu_si256(xq)),
                                               _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_loadu_si256(xq + 1)));
            const __m256i ix = _mm256_setr_epi32(2 * u, 2 * u, 2 * u, 2 * u, 2 * u + 1, 2 * u + 1, 2 * u + 1, 2 * u + 1);
            acc[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s, one16)), _mm256_permutevar8x32_ps(dd, ix), acc[u]);
        }
    }
    float t = kiln_hsum8(_mm256_add_ps(off, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))));
    __m256 r = _mm256_setzero_ps();
    for (; i < nb; i++) {
        const uint8_t *bw = w + (size_t)BS * i;
        r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOTI_Q4_AVX2(bw, a + i)), _mm256_set1_ps(h2f_c(bw) * a[i].d), r);
    }
    return t + kiln_hsum8(r);
}
#undef BS
#undef PF8


/* Q4_0 decode with AVX-512 VNNI, two blocks per zmm: the 2 x 16 code bytes
 * are unpacked into [block i low 16 | block i+1 low 16 | i high | i+1 high]
 * and the activations were laid out the same way once per call (act2), so
 * one vpdpbusd, convert, permute and FMA serve two blocks; the offsets
 * -8 x sum sit in lanes 0 and 4 of the precomputed accumulator (corr2). */
VNNI static float dot1z_q4_0(const uint8_t *w, const __m512i *corr2, const __m512i *act2, const float *xd, const struct q8a *a, int nb) {
    enum { BS = 18 };
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m512i idx9 = _mm512_setr_epi32(0x90000, 0x1b0012, 0x2d0024, 0x3f0036, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i ix0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1), two = _mm512_set1_epi32(2);
    int i = 0;
    for (; i + 8 <= nb; i += 8) {
        KILN_PF(w + (size_t)BS * i);
        KILN_PF(w + (size_t)BS * i + 64);
        KILN_PF(w + (size_t)BS * i + 128);
        /* the 8 f16 block scales (words 0, 9, ..., 63 of the 128 bytes) */
        __m128i h = _mm512_castsi512_si128(_mm512_permutex2var_epi16(_mm512_loadu_si512((const void *)(w + (size_t)BS * i)), idx9,
                                                                    _mm512_loadu_si512((const void *)(w + (size_t)BS * i + 64))));
        const __m512 dd = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(xd + i)));
        __m512i ix = ix0;
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const uint8_t *b0 = w + (size_t)BS * (i + 2 * p);
            __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + 2))),
                                                _mm_loadu_si128((const __m128i *)(b0 + BS + 2)), 1);
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            __m512i s = _mm512_dpbusd_epi32(_mm512_load_si512(corr2 + i / 2 + p), _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                                            _mm512_load_si512(act2 + i / 2 + p));
            __m512 sc = _mm512_permutexvar_ps(ix, dd);
            if (p & 1) acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc1);
            else acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc0);
            ix = _mm512_add_epi32(ix, two);
        }
    }
    __m256 t = _mm256_setzero_ps();
    for (; i < nb; i++) {
        const uint8_t *bw = w + (size_t)BS * i;
        __m256i s = _mm256_dpbusd_epi32(lane0(-8 * a[i].sum), q4_codes(bw), XQS(a + i));
        t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(h2f_c(bw) * xd[i]), t);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + kiln_hsum8(t);
}

/* Q4_0 decode with AVX-512 VNNI + VBMI, four blocks per zmm: one vpermt2b
 * gathers the 4 x 16 code bytes of blocks 4g..4g+3 out of two 64-byte
 * loads (the 18-byte blocks straddle them), their low nibbles (weights
 * 0..15 of each block) and high nibbles (16..31) feed two vpdpbusd into the
 * same accumulator against the activations laid out to match once per call
 * (act4: [g][lo: x_b[0..15] of the 4 blocks | hi: x_b[16..31]]); lanes 4k..
 * 4k+3 hold block 4g+k's integer sum, the -8 x sum offset sits in lane 4k
 * of the starting accumulator (corr4). Per 8 blocks: 3 loads, the scale
 * gather as in dot1z_q4_0, 2 byte permutes, 4 nibble ops, 4 vpdpbusd, then
 * 2 x (permute of the scales, convert, FMA): about half the vector ops of
 * dot1z_q4_0 (two blocks per zmm), whose per-core rate (~35 GB/s of Q4_0
 * in L2) was barely above what one core streams from DRAM. Integer block
 * sums are the same; only the order of the f32 sums differs. */
/* Q8_0 decode with AVX-512 VNNI, two blocks per zmm: the 2 x 32 code bytes
 * (two 32-byte loads, +128 to make them unsigned) against the two blocks'
 * activation codes laid out back to back once per call (act2: [x_b | x_b+1]),
 * -128 x sum of each block in lanes 0 and 8 of the starting accumulator
 * (corr2); lanes 0..7 hold block b's integer sum, 8..15 block b+1's, scaled
 * by a permute of the 8 block scales. Per 2 blocks: 2 loads, insert, xor,
 * vpdpbusd, permute, convert, FMA (dot1v_q8_0: 2 x (xor, vpdpbusd, permute,
 * convert, FMA) on 256-bit halves). Integer block sums are unchanged. */
VNNI static float dot1w_q8_0(const uint8_t *w, const __m512i *corr2, const __m512i *act2, const float *xd, const struct q8a *a, int nb) {
    enum { BS = 34 };
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    const __m512i ofs = _mm512_set1_epi8((char)0x80);
    const __m512i ix0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), two = _mm512_set1_epi32(2);
    int i = 0;
    for (; i + 8 <= nb; i += 8) {
        KILN_PF(w + (size_t)BS * i);
        KILN_PF(w + (size_t)BS * i + 64);
        KILN_PF(w + (size_t)BS * i + 128);
        KILN_PF(w + (size_t)BS * i + 192);
        KILN_PF(w + (size_t)BS * i + 256);
        const __m128i h = _mm_set_epi16(SC16(7), SC16(6), SC16(5), SC16(4), SC16(3), SC16(2), SC16(1), SC16(0));
        const __m512 dd = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(xd + i)));
        __m512i ix = ix0;
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const uint8_t *b0 = w + (size_t)BS * (i + 2 * p);
            __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                                           _mm256_loadu_si256((const __m256i *)(b0 + BS + 2)), 1);
            __m512i sm = _mm512_dpbusd_epi32(_mm512_load_si512(corr2 + i / 2 + p), _mm512_xor_si512(c, ofs), _mm512_load_si512(act2 + i / 2 + p));
            __m512 sc = _mm512_permutexvar_ps(ix, dd);
            if (p & 1) acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sm), sc, acc1);
            else acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sm), sc, acc0);
            ix = _mm512_add_epi32(ix, two);
        }
    }
    __m256 t = _mm256_setzero_ps();
    for (; i < nb; i++) {
        const uint8_t *bw = w + (size_t)BS * i;
        __m256i sm = _mm256_dpbusd_epi32(lane0(-128 * a[i].sum), Q8U_CODES(bw), XQS(a + i));
        t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sm), _mm256_set1_ps(h2f_c(bw) * xd[i]), t);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + kiln_hsum8(t);
}

/* widest rows (in blocks of 32) given to dot1q_q4_0: measured from DRAM
 * (2 threads, 1.77 MB matrices) it is 4-10% faster than dot1z_q4_0 at
 * K = 1024 and 1536, but 6% slower at K = 2048 and 20-28% slower at 3072
 * and 4096 (one thread: 48 against 65 GMAC/s), though 25% faster at 3072
 * in L2; not understood */
#define Q4Q_MAX_NB 48
#define VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")))
VBMI static float dot1q_q4_0(const uint8_t *w, const __m512i *corr4, const __m512i *act4, const float *xd, const struct q8a *a, int nb) {
    enum { BS = 18 };
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i idx9 = _mm512_setr_epi32(0x90000, 0x1b0012, 0x2d0024, 0x3f0036, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    /* byte indices into [64-byte load A | load B] of the 4 x 16 code bytes:
     * blocks 0..3 from A = w, B = w + 64 (code bytes at 2 + 18 k + j);
     * blocks 4..7 from A = w + 64, B = w + 128 (at 74 + 18 k + j: from A
     * below 128, else B's byte - 128 + 64) */
    static const uint8_t i0[64] __attribute__((aligned(64))) = {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71};
    static const uint8_t i1[64] __attribute__((aligned(64))) = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79};
    const __m512i c0 = _mm512_load_si512(i0), c1 = _mm512_load_si512(i1);
    const __m512i s0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), four = _mm512_set1_epi32(4);
    int i = 0;
    for (; i + 8 <= nb; i += 8) {
        const uint8_t *b = w + (size_t)BS * i;
        KILN_PF(b);
        KILN_PF(b + 64);
        KILN_PF(b + 128);
        const __m512i L0 = _mm512_loadu_si512((const void *)b), L1 = _mm512_loadu_si512((const void *)(b + 64)),
                      L2 = _mm512_maskz_loadu_epi8(0xffff, b + 128); /* bytes 128..143 only: no read past the group */
        /* the 8 f16 block scales (words 0, 9, ..., 63), times the activation scales */
        const __m128i h = _mm512_castsi512_si128(_mm512_permutex2var_epi16(L0, idx9, L1));
        const __m512 dd = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(xd + i)));
        const __m512i q0 = _mm512_permutex2var_epi8(L0, c0, L1), q1 = _mm512_permutex2var_epi8(L1, c1, L2);
        __m512i t0 = _mm512_dpbusd_epi32(_mm512_load_si512(corr4 + i / 4), _mm512_and_si512(q0, m4), _mm512_load_si512(act4 + i / 2));
        __m512i t1 = _mm512_dpbusd_epi32(_mm512_load_si512(corr4 + i / 4 + 1), _mm512_and_si512(q1, m4), _mm512_load_si512(act4 + i / 2 + 2));
        t0 = _mm512_dpbusd_epi32(t0, _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4), _mm512_load_si512(act4 + i / 2 + 1));
        t1 = _mm512_dpbusd_epi32(t1, _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4), _mm512_load_si512(act4 + i / 2 + 3));
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t0), _mm512_permutexvar_ps(s0, dd), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t1), _mm512_permutexvar_ps(_mm512_add_epi32(s0, four), dd), acc1);
    }
    __m256 t = _mm256_setzero_ps();
    for (; i < nb; i++) {
        const uint8_t *bw = w + (size_t)BS * i;
        __m256i sm = _mm256_dpbusd_epi32(lane0(-8 * a[i].sum), q4_codes(bw), XQS(a + i));
        t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sm), _mm256_set1_ps(h2f_c(bw) * xd[i]), t);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + kiln_hsum8(t);
}

static int have_vbmi(void) {
    static int v = -1;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512vbmi");
    }
    return v;
}

static int have_vnni(void) {
    static int v = -1;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    }
    return v;
}

#else
static int have_vnni(void) { return 0; }
#endif /* KILN_X86 */

#if defined(KILN_NEON)
/* ==== NEON int8 row dots (Q8_0 / Q4_0) ====
 *
 * Per block the integer dot of the 32 weight codes with the 32 activation
 * codes is exact, as in every other path: Q8_0 codes as stored, Q4_0
 * nibbles minus 8 (sum (q - 8) x = sum q x - 8 sum x, the scalar path's
 * integer). Baseline NEON: smull / smull2 (|w x| <= 128 x 127 fits i16)
 * and sadalp into 4 i32 lanes; with dotprod: sdot. Four blocks per step:
 * their 4 x 4 lanes pairwise added to one i32 vector (lane u = block u),
 * converted, times the 4 products of weight and activation scales, into
 * one f32 accumulator (an FMA, so only the f32 order and rounding of the
 * per-block terms differ from dot_*_scalar); a last partial step runs per
 * block. */
#define DP_ATTR __attribute__((target("arch=armv8.2-a+dotprod")))

static inline int32x4_t i8dot_neon(int32x4_t acc, int8x16_t a, int8x16_t b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}
DP_ATTR static inline int32x4_t i8dot_dp(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }

/* the 32 codes of a block as two s8 vectors: elements 0..15 and 16..31 */
#define Q8_CODES(bw, c0, c1) (c0 = vld1q_s8((const int8_t *)(bw) + 2), c1 = vld1q_s8((const int8_t *)(bw) + 18))
#define Q4_CODES(bw, c0, c1)                                                                                  \
    do {                                                                                                      \
        uint8x16_t b_ = vld1q_u8((bw) + 2);                                                                   \
        c0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b_, vdupq_n_u8(15))), vdupq_n_s8(8));                      \
        c1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b_, 4)), vdupq_n_s8(8));                                 \
    } while (0)

#define QDOT_NEON(NAME, ATTR, IDOT, BS, CODES)                                                                \
    ATTR static float NAME(const uint8_t *w, const struct q8a *a, int nb) {                                   \
        float32x4_t acc = vdupq_n_f32(0);                                                                     \
        int i = 0;                                                                                            \
        for (; i + 4 <= nb; i += 4) {                                                                         \
            int32x4_t s[4];                                                                                   \
            uint16_t hs[4];                                                                                   \
            float xd[4];                                                                                      \
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {                                             \
                const uint8_t *bw = w + (size_t)(BS) * (i + u);                                               \
                int8x16_t c0, c1;                                                                             \
                CODES(bw, c0, c1);                                                                            \
                s[u] = IDOT(IDOT(vdupq_n_s32(0), c0, vld1q_s8(a[i + u].qs)), c1, vld1q_s8(a[i + u].qs + 16)); \
                hs[u] = (uint16_t)(bw[0] | bw[1] << 8), xd[u] = a[i + u].d;                                   \
            }                                                                                                 \
            int32x4_t t = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));                         \
            float32x4_t sc = vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(hs))), vld1q_f32(xd));      \
            acc = vfmaq_f32(acc, vcvtq_f32_s32(t), sc);                                                       \
        }                                                                                                     \
        float r = vaddvq_f32(acc);                                                                            \
        for (; i < nb; i++) {                                                                                 \
            const uint8_t *bw = w + (size_t)(BS) * i;                                                         \
            int8x16_t c0, c1;                                                                                 \
            CODES(bw, c0, c1);                                                                                \
            int32x4_t s = IDOT(IDOT(vdupq_n_s32(0), c0, vld1q_s8(a[i].qs)), c1, vld1q_s8(a[i].qs + 16));      \
            r += h2f(bw) * a[i].d * (float)vaddvq_s32(s);                                                     \
        }                                                                                                     \
        return r;                                                                                             \
    }

QDOT_NEON(dot_q8_0_neon, , i8dot_neon, 34, Q8_CODES)
QDOT_NEON(dot_q4_0_neon, , i8dot_neon, 18, Q4_CODES)
QDOT_NEON(dot_q8_0_dotprod, DP_ATTR, i8dot_dp, 34, Q8_CODES)
QDOT_NEON(dot_q4_0_dotprod, DP_ATTR, i8dot_dp, 18, Q4_CODES)
#endif /* KILN_NEON */

struct ijob {
    const struct qlinear *w;
    float *out;
    const float *x;
    struct q8a *xa;
    const float *bias;
    int n, K, N, nb, nblk, isa;
    size_t rb;
    qdot_fn dot;
    qdotx_fn dotx;
    qdot_fn dot1; /* one activation row (decode), or NULL */
#if defined(KILN_X86)
    qdot1v_fn dot1v; /* VNNI decode: with corr / xd below */
    __m256i *corr; /* per block: lane 0 = -8 or -128 x the activation sum */
    float *xd;     /* per block: the activation scale */
    __m512i *act2, *corr2; /* Q4_0 decode, AVX-512: block pairs (dot1z_q4_0) */
    __m512i *act4, *corr4; /* ... with VBMI: groups of 4 blocks (dot1q_q4_0) */
    int dec2;      /* decode without VNNI (dot1a_*): xd, cs and for Q4_0 act2 */
    float *cs;     /* per block: -8 x the activation sum (Q4_0) */
#endif
    /* GEMM */
    int R, NT, mode, ntile;
    void **scr;
    size_t scr_bytes;
};

static void i_quant(void *arg, int64_t t0, int64_t t1, int tid) {
    const struct ijob *j = arg;
    for (int64_t t = t0; t < t1; t++) {
        /* row-major, or the GEMM's tiles: token t's block b at [(t / NT) * nb + b] * NT + t % NT */
        struct q8a *d = j->NT ? j->xa + (size_t)(t / j->NT) * j->nb * j->NT + t % j->NT : j->xa + (size_t)t * j->nb;
        int stride = j->NT ? j->NT : 1;
        if (t >= j->n) {
            for (int b = 0; b < j->nb; b++) memset(&d[(size_t)b * stride], 0, sizeof *d);
#if defined(KILN_X86)
        } else if (j->isa >= CPU_ISA_AVX2) {
            quantize_act_avx2(j->x + (size_t)t * j->K, d, j->K, stride);
#endif
        } else if (stride == 1) {
            quantize_act(j->x + (size_t)t * j->K, d, j->K);
        }
    }
    (void)tid;
}

static void i_rows(void *arg, int64_t r0, int64_t r1, int tid) {
    const struct ijob *j = arg;
    const uint8_t *W = j->w->w.data;
#if defined(KILN_X86)
    if (j->n == 1 && j->dec2) {
        const size_t rb = j->rb;
        if (j->w->w.dtype == KILN_DTYPE_Q4_0)
            for (int64_t r = r0; r < r1; r++) j->out[r] = dot1a_q4_0(W + (size_t)r * rb, j->act2, j->xd, j->cs, j->xa, j->nblk) + (j->bias ? j->bias[r] : 0.0f);
        else
            for (int64_t r = r0; r < r1; r++) j->out[r] = dot1a_q8_0(W + (size_t)r * rb, j->xd, j->xa, j->nblk) + (j->bias ? j->bias[r] : 0.0f);
        return;
    }
    if (j->n == 1 && j->dot1v) {
        const size_t rb = j->rb;
        const int nblk = j->nblk;
        const float *bias = j->bias;
        float *out = j->out;
        if (j->act4) {
            for (int64_t r = r0; r < r1; r++) out[r] = dot1q_q4_0(W + (size_t)r * rb, j->corr4, j->act4, j->xd, j->xa, nblk) + (bias ? bias[r] : 0.0f);
            return;
        }
        if (j->act2 && j->w->w.dtype == KILN_DTYPE_Q8_0) {
            for (int64_t r = r0; r < r1; r++) out[r] = dot1w_q8_0(W + (size_t)r * rb, j->corr2, j->act2, j->xd, j->xa, nblk) + (bias ? bias[r] : 0.0f);
            return;
        }
        if (j->act2) {
            for (int64_t r = r0; r < r1; r++) out[r] = dot1z_q4_0(W + (size_t)r * rb, j->corr2, j->act2, j->xd, j->xa, nblk) + (bias ? bias[r] : 0.0f);
            return;
        }
        for (int64_t r = r0; r < r1; r++) out[r] = j->dot1v(W + (size_t)r * rb, j->corr, j->xd, j->xa, nblk) + (bias ? bias[r] : 0.0f);
        return;
    }
#endif
    for (int64_t r = r0; r < r1; r++) {
        float b = j->bias ? j->bias[r] : 0.0f;
        const uint8_t *row = W + (size_t)r * j->rb;
        for (int t = 0; t < j->n; t += NX) {
            int nx = j->n - t < NX ? j->n - t : NX;
            const struct q8a *as[NX];
            float o[NX];
            for (int i = 0; i < nx; i++) as[i] = j->xa + (size_t)(t + i) * j->nb;
            if (nx == 1 && j->dot1) o[0] = j->dot1(row, as[0], j->nblk);
            else if (j->isa >= CPU_ISA_AVX2) j->dotx(row, as, nx, j->nblk, o);
            else
                for (int i = 0; i < nx; i++) o[i] = j->dot(row, as[i], j->nblk);
            for (int i = 0; i < nx; i++) j->out[(size_t)(t + i) * j->N + r] = o[i] + b;
        }
    }
    (void)tid;
}

#if defined(KILN_X86)
static void i_gemm_panels(void *arg, int64_t p0, int64_t p1, int tid) {
    const struct ijob *j = arg;
    uint8_t *P = thread_scratch(j->scr, tid, j->scr_bytes);
    for (int64_t pi = p0; pi < p1; pi++) {
        const int r0 = (int)pi * j->R, nr = j->N - r0 < j->R ? j->N - r0 : j->R;
        pack_i8(P, j->w->w.data, j->rb, r0, nr, j->nb, j->R, j->mode);
        const float *bias = j->bias ? j->bias + r0 : NULL;
        for (int tile = 0; tile < j->ntile; tile++) {
            const int t0 = tile * j->NT, nt = j->n - t0 < j->NT ? j->n - t0 : j->NT;
            const struct q8a *xt = j->xa + (size_t)tile * j->nb * j->NT;
            float *c = j->out + (size_t)t0 * j->N + r0;
            if (j->R == 16) gemm_i8_vnni(P, xt, j->nb, j->mode == PK_Q4 ? 8 : 128, c, j->N, nr, nt, bias);
            else if (j->mode == PK_Q4) gemm_q4_0_avx2(P, xt, j->nb, c, j->N, nr, nt, bias);
            else gemm_q8_0_avx2(P, xt, j->nb, c, j->N, nr, nt, bias);
        }
    }
}

#endif

/* n at or above which Q8_0 / Q4_0 run the int8 GEMM (below: row dots) */
#define IGEMM_MIN 8

/* everything of an int8 matmul before its parallel part: the kernels for
 * w's dtype, the activations quantized (once, into the backend's buffer)
 * and, for the VNNI decode, the per-block vectors; returns whether it is
 * the GEMM */
static int int8_setup(struct kiln_backend *be, struct ijob *jp, float *out, const float *x, const struct qlinear *w, int n) {
    const int K = w->n_in, N = w->n_out, nb = K / 32;
    struct ijob j = {.w = w, .out = out, .x = x, .bias = w->bias.data ? cpu_vec(&w->bias) : NULL, .n = n, .K = K, .N = N,
                     .nb = nb, .nblk = nb, .isa = cpu_isa(), .rb = quant_row_bytes(w->w.dtype, K)};
#if !defined(KILN_X86)
    /* row dots at every n (no int8 GEMM here yet); NEON Q8_0 / Q4_0 dots
     * (sdot with dotprod), the scalar ones for the other formats */
    switch (w->w.dtype) {
    case KILN_DTYPE_Q8_0: j.dot = dot_q8_0_scalar; break;
    case KILN_DTYPE_Q4_0: j.dot = dot_q4_0_scalar; break;
    case KILN_DTYPE_Q4_1: j.dot = dot_q4_1_scalar; break;
    case KILN_DTYPE_Q5_K: j.dot = dot_q5_k_scalar, j.nblk = K / 256; break;
    case KILN_DTYPE_Q6_K: j.dot = dot_q6_k_scalar, j.nblk = K / 256; break;
    default: j.dot = dot_q4_k_scalar, j.nblk = K / 256; break;
    }
#if defined(KILN_NEON)
    if (j.isa >= CPU_ISA_NEON && w->w.dtype == KILN_DTYPE_Q8_0) j.dot = j.isa >= CPU_ISA_DOTPROD ? dot_q8_0_dotprod : dot_q8_0_neon;
    if (j.isa >= CPU_ISA_NEON && w->w.dtype == KILN_DTYPE_Q4_0) j.dot = j.isa >= CPU_ISA_DOTPROD ? dot_q4_0_dotprod : dot_q4_0_neon;
    cpu_isa_note(w->w.dtype == KILN_DTYPE_Q8_0 || w->w.dtype == KILN_DTYPE_Q4_0 ? j.isa : CPU_ISA_SCALAR, 0);
#endif
    j.dot1 = j.dot;
    const size_t sz = sizeof *j.xa * (size_t)n * nb;
    qbuf_get(be, &sz, (void **)&j.xa, 1);
    cpu_parallel_for(be, n, (16384 + K - 1) / K, i_quant, &j);
    *jp = j;
    return 0;
#else
    switch (w->w.dtype) {
    case KILN_DTYPE_Q8_0: j.dot = dot_q8_0_scalar, j.dotx = dot_q8_0_avx2; break;
    case KILN_DTYPE_Q4_0: j.dot = dot_q4_0_scalar, j.dotx = dot_q4_0_avx2; break;
    case KILN_DTYPE_Q4_1: j.dot = dot_q4_1_scalar, j.dotx = dot_q4_1_avx2; break;
    case KILN_DTYPE_Q5_K: j.dot = dot_q5_k_scalar, j.dotx = dot_q5_k_avx2, j.nblk = K / 256; break;
    case KILN_DTYPE_Q6_K: j.dot = dot_q6_k_scalar, j.dotx = dot_q6_k_avx2, j.nblk = K / 256; break;
    default: j.dot = dot_q4_k_scalar, j.dotx = dot_q4_k_avx2, j.nblk = K / 256; break;
    }
    const int vnni = j.isa >= CPU_ISA_AVX512 && have_vnni();
    if (j.isa >= CPU_ISA_AVX2 && w->w.dtype == KILN_DTYPE_Q8_0)
        j.dot1 = vnni ? dot1_q8_0_vnni : dot1_q8_0_avx2;
    if (j.isa >= CPU_ISA_AVX2 && w->w.dtype == KILN_DTYPE_Q4_0)
        j.dot1 = vnni ? dot1_q4_0_vnni : dot1_q4_0_avx2;
    const int gemm = j.isa >= CPU_ISA_AVX2 && n >= IGEMM_MIN && (w->w.dtype == KILN_DTYPE_Q8_0 || w->w.dtype == KILN_DTYPE_Q4_0);
    if (gemm) {
        j.R = vnni ? 16 : 8, j.NT = vnni ? 8 : 4;
        j.mode = w->w.dtype == KILN_DTYPE_Q4_0 ? PK_Q4 : vnni ? PK_Q8_U8 : PK_Q8_S8;
        j.ntile = (n + j.NT - 1) / j.NT;
    }
    const int nrow = gemm ? j.ntile * j.NT : n;
    /* VNNI decode (Q8_0 / Q4_0): per-block vectors built once per call */
    const int dec = !gemm && n == 1 && vnni && (w->w.dtype == KILN_DTYPE_Q8_0 || w->w.dtype == KILN_DTYPE_Q4_0);
    const int dec4 = dec && w->w.dtype == KILN_DTYPE_Q4_0, dec4q = dec4 && nb <= Q4Q_MAX_NB && have_vbmi();
    const int dec8 = dec && w->w.dtype == KILN_DTYPE_Q8_0;
    /* row dots, quantizer: AVX2; the GEMM and n = 1 on VNNI */
    cpu_isa_note(j.isa >= CPU_ISA_AVX2 ? CPU_ISA_AVX2 : CPU_ISA_SCALAR, (vnni && (gemm || n == 1) ? CPU_USED_VNNI : 0) | (dec4q ? CPU_USED_VBMI : 0));
    /* decode without VNNI: the AVX2 8-block kernels (cs in corr's space) */
    j.dec2 = !gemm && n == 1 && !vnni && j.isa >= CPU_ISA_AVX2 && (w->w.dtype == KILN_DTYPE_Q8_0 || w->w.dtype == KILN_DTYPE_Q4_0);
    const int d2q4 = j.dec2 && w->w.dtype == KILN_DTYPE_Q4_0;
    {
        const size_t sz[5] = {sizeof *j.xa * (size_t)nrow * nb, dec || j.dec2 ? sizeof(__m256i) * (size_t)nb : 0,
                              dec || j.dec2 ? sizeof(float) * (size_t)nb : 0, dec4 || dec8 || d2q4 ? 64 * (size_t)(nb / 2 + 1) : 0,
                              dec4 || dec8 ? 64 * (size_t)(nb / 2 + 1) : 0};
        void *ptr[5];
        qbuf_get(be, sz, ptr, 5);
        j.xa = ptr[0], j.corr = ptr[1], j.xd = ptr[2], j.act2 = ptr[3], j.corr2 = ptr[4];
    }
    cpu_parallel_for(be, nrow, (16384 + K - 1) / K, i_quant, &j);
    if (j.dec2) {
        j.cs = (float *)j.corr, j.corr = NULL;
        for (int b = 0; b < nb; b++) j.xd[b] = j.xa[b].d, j.cs[b] = (float)(-8 * j.xa[b].sum);
        if (d2q4)
            for (int q = 0; q < nb / 2; q++) {
                const struct q8a *x0 = &j.xa[2 * q], *x1 = x0 + 1;
                int8_t *d = (int8_t *)&j.act2[q];
                memcpy(d, x0->qs, 16), memcpy(d + 16, x1->qs, 16), memcpy(d + 32, x0->qs + 16, 16), memcpy(d + 48, x1->qs + 16, 16);
            }
        else j.act2 = NULL;
    }
    if (dec) {
        const int c = dec4 ? 8 : 128;
        j.dot1v = c == 8 ? dot1v_q4_0 : dot1v_q8_0;
        for (int b = 0; b < nb; b++) {
            int32_t v[8] = {-c * j.xa[b].sum, 0, 0, 0, 0, 0, 0, 0};
            memcpy(&j.corr[b], v, sizeof v);
            j.xd[b] = j.xa[b].d;
        }
        if (dec8) {
            /* block pairs: [x_b | x_b+1] codes, -128 x sum in lanes 0 and 8 */
            for (int q = 0; q < nb / 2; q++) {
                const struct q8a *x0 = &j.xa[2 * q], *x1 = x0 + 1;
                int8_t *d = (int8_t *)&j.act2[q];
                memcpy(d, x0->qs, 32), memcpy(d + 32, x1->qs, 32);
                int32_t v[16] = {0};
                v[0] = -128 * x0->sum, v[8] = -128 * x1->sum;
                memcpy(&j.corr2[q], v, sizeof v);
            }
        } else if (dec4q) {
            /* groups of 4 blocks: [lo: x_b[0..15] x 4 | hi: x_b[16..31] x 4]
             * (act2's space: 2 zmm per 2 blocks), corr4 in corr2's space */
            j.act4 = j.act2, j.corr4 = j.corr2, j.act2 = j.corr2 = NULL;
            for (int g = 0; g < nb / 4; g++) {
                int8_t *lo = (int8_t *)&j.act4[2 * g], *hi = lo + 64;
                int32_t v[16] = {0};
                for (int k = 0; k < 4; k++) {
                    const struct q8a *xb = &j.xa[4 * g + k];
                    memcpy(lo + 16 * k, xb->qs, 16), memcpy(hi + 16 * k, xb->qs + 16, 16);
                    v[4 * k] = -8 * xb->sum;
                }
                memcpy(&j.corr4[g], v, sizeof v);
            }
        } else if (dec4) {
            for (int q = 0; q < nb / 2; q++) {
                const struct q8a *x0 = &j.xa[2 * q], *x1 = x0 + 1;
                int8_t *d = (int8_t *)&j.act2[q];
                memcpy(d, x0->qs, 16), memcpy(d + 16, x1->qs, 16), memcpy(d + 32, x0->qs + 16, 16), memcpy(d + 48, x1->qs + 16, 16);
                int32_t v[16] = {0};
                v[0] = -8 * x0->sum, v[4] = -8 * x1->sum;
                memcpy(&j.corr2[q], v, sizeof v);
            }
        }
    }
    *jp = j;
    return gemm;
#endif
}

/* rows per chunk of the decode's split runs: ~64 KiB of weights */
static int64_t int8_chunk(const struct ijob *j) { return (int64_t)(64 << 10) / (int64_t)j->rb + 1; }

static void matmul_int8(struct kiln_backend *be, float *out, const float *x, const struct qlinear *w, int n) {
    struct ijob j;
#if defined(KILN_X86)
    if (int8_setup(be, &j, out, x, w, n)) {
        const int nthr = cpu_n_threads(be);
        j.scr = kiln_calloc((size_t)nthr, sizeof(void *));
        j.scr_bytes = (size_t)j.nb * 36 * j.R;
        cpu_parallel_for(be, (j.N + j.R - 1) / j.R, 1, i_gemm_panels, &j);
        free_scratch(j.scr, nthr);
    } else
#else
    int8_setup(be, &j, out, x, w, n);
#endif
    {
        /* one contiguous run of rows per thread (cpu_parallel_for_split),
         * stolen from in chunks of ~64 KiB of weights */
        cpu_parallel_for_split(be, j.N, int8_chunk(&j), i_rows, &j);
    }
}

/* ==== GPTQ / AWQ 4-bit with int8 activations ==== */

/*
 * w = s * q + b per group (b = -s z; struct qgrp keeps s and b per group),
 * x ~ dx * xq per block of 32 (the quantize_act blocks above). For one
 * output, with groups of whole 32-blocks:
 *
 *   sum_k w_k x_k = sum_g [ s_g * sum_{blk in g} dx_blk * (sum_i q_i xq_i)
 *                         + b_g * SX_g ],   SX_g = sum_{blk in g} dx_blk * sum_i xq_i
 *
 * The inner sum is an exact integer dot (u8 codes 0..15 x s8 activations:
 * vpdpbusd / maddubs); SX_g depends on x only and is computed once per call.
 * Runs when the groups are equal runs of 32, 64 or a multiple of 128 after
 * qgrp_pack's act-order sort (x is permuted first), K a multiple of 32;
 * else, and for 8-bit codes, the exact path. Codes as packed by qgrp_pack:
 * per 32-block 16 bytes, byte i = element i (low nibble), 16 + i (high).
 *
 *   decode (n = 1), AVX-512 VNNI: one row at a time, 4 blocks (64 code
 *     bytes, one load) per step: low nibbles [b0 0..15 | b1 | b2 | b3] and
 *     high nibbles [b0 16..31 | ...] against x laid out the same (act4), two
 *     vpdpbusd into one zmm whose lanes 4j..4j+3 hold block j's partial
 *     dots; cvt, times dx per lane, times s per lane, FMA. The b_g SX_g
 *     terms are one f32 dot of the row's [s, b] pairs with [0, SX] pairs.
 *   prefill (n >= 8), AVX-512 VNNI: 16 rows x 8 tokens; per call and per 16
 *     rows the codes are repacked [block][quad][16][4 bytes] (as pack_i8's
 *     Q4_0 panel) plus [group][s x 16 | b x 16]; per block 8 vpdpbusd per
 *     token into a zeroed int accumulator, cvt, FMA with dx into a group
 *     accumulator; per group C += T * s + b * SX.
 *   prefill (n >= 8), AVX2: the same sums, 8 rows x 4 tokens, maddubs of
 *     the u8 codes with broadcast s8 activations added in i16 over a block,
 *     one madd to i32 per block (gemm_g4_avx2, Q4_0's AVX2 GEMM shape).
 *   otherwise (scalar, 2..7 tokens, AVX2 decode): row dots, one block at
 *     a time.
 *
 * Every CPU and every forced ISA takes this path for these weights (the
 * numerics are the int8 ones everywhere; KILN_QACT=f32 gives the exact
 * kernels). The AVX2 GEMM beats the exact f32 GEMM it replaced on CPUs
 * without VNNI: 0.6B pp512 (KILN_CPU_ISA=avx2) 240-246 -> 304-357 tok/s;
 * before it, the int8 row dots there ran at 139.
 */

/* the group size if w can take the int8 path, else 0 */
static int gact_group(const struct qgrp *g) {
    if (g->bits != 4 || g->n_in % 32 || g->n_group < 1) return 0;
    const int gs = g->gstart[1];
    if (!(gs == 32 || gs == 64 || (gs % 128 == 0 && gs > 0))) return 0;
    for (int i = 0; i <= g->n_group; i++) {
        int e = i * gs < g->n_in ? i * gs : g->n_in;
        if (g->gstart[i] != e) return 0;
    }
    return gs;
}

struct gjob {
    const struct qgrp *g;
    float *out;
    const float *bias;
    struct q8a *xa;   /* row-major [n][nb], or the GEMM's tiles [tile][nb][NT] */
    float *sx;        /* SX_g per token: [n][G] (rows), [tile][G][NT] (GEMM); VNNI decode: [G] pairs {0, SX_g} */
    int dec2;         /* AVX2 decode by block pairs (act2, dx2) */
#if defined(KILN_X86)
    __m512i *act4;    /* VNNI decode: per 4 blocks {lo, hi} codes */
    __m512 *dx4;      /* ... and dx per lane (0 past the last block) */
    __m256i *act2;    /* AVX2 decode: per block pair {lo, hi} codes (gdot1_avx2) */
    float *dx2;       /* ... and [dx_b x 4 | dx_b+1 x 4] per pair */
#endif
    const float *x;
    int n, K, N, nb, G, gs, isa, vnni;
    int NT, ntile;
    void **scr;
    size_t scr_bytes;
};

/* integer dot of one 32-block of 4-bit codes with one activation block */
static int gdot_blk(const uint8_t *c, const int8_t *xq) {
    int s = 0;
    for (int i = 0; i < 16; i++) s += (c[i] & 15) * xq[i] + (c[i] >> 4) * xq[16 + i];
    return s;
}

/* reference: row r against token row a (nb blocks), sx = that token's SX_g */
static float gdot_scalar(const struct qgrp *g, int r, const struct q8a *a, const float *sx, int gs) {
    const uint8_t *q = g->q + (size_t)r * g->row_bytes;
    const float *sb = g->sb + (size_t)r * g->n_group * 2;
    const int bpg = gs / 32, nb = g->n_in / 32;
    float acc = 0;
    for (int gi = 0; gi < g->n_group; gi++) {
        float t = 0;
        for (int b = gi * bpg; b < nb && b < (gi + 1) * bpg; b++) t += a[b].d * (float)gdot_blk(q + 16 * (size_t)b, a[b].qs);
        acc += sb[2 * gi] * t + sb[2 * gi + 1] * sx[gi];
    }
    return acc;
}

#if defined(KILN_NEON)
/* NEON: gdot_scalar with each block's integer dot in vector lanes (nibbles
 * 0..15 as s8 times the s8 codes: smull + sadalp, or sdot); the same
 * integers and the same f32 operations in the same order, so bit-identical
 * to gdot_scalar */
#define GDOT_NEON(NAME, ATTR, IDOT)                                                                                  \
    ATTR static float NAME(const struct qgrp *g, int r, const struct q8a *a, const float *sx, int gs) {              \
        const uint8_t *q = g->q + (size_t)r * g->row_bytes;                                                          \
        const float *sb = g->sb + (size_t)r * g->n_group * 2;                                                        \
        const int bpg = gs / 32, nb = g->n_in / 32;                                                                  \
        float acc = 0;                                                                                               \
        for (int gi = 0; gi < g->n_group; gi++) {                                                                    \
            float t = 0;                                                                                             \
            for (int b = gi * bpg; b < nb && b < (gi + 1) * bpg; b++) {                                              \
                const uint8x16_t c = vld1q_u8(q + 16 * (size_t)b);                                                   \
                const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(c, vdupq_n_u8(15)));                               \
                const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(c, 4));                                          \
                const int32x4_t d = IDOT(IDOT(vdupq_n_s32(0), lo, vld1q_s8(a[b].qs)), hi, vld1q_s8(a[b].qs + 16));  \
                t += a[b].d * (float)vaddvq_s32(d);                                                                  \
            }                                                                                                        \
            acc += sb[2 * gi] * t + sb[2 * gi + 1] * sx[gi];                                                         \
        }                                                                                                            \
        return acc;                                                                                                  \
    }

GDOT_NEON(gdot_neon, , i8dot_neon)
GDOT_NEON(gdot_dotprod, DP_ATTR, i8dot_dp)
#endif /* KILN_NEON */

#if defined(KILN_X86)
/* AVX2: the same per block (maddubs of [lo | hi] codes with the 32 codes) */
AVX2 static float gdot_avx2(const struct qgrp *g, int r, const struct q8a *a, const float *sx, int gs) {
    const uint8_t *q = g->q + (size_t)r * g->row_bytes;
    const float *sb = g->sb + (size_t)r * g->n_group * 2;
    const int bpg = gs / 32, nb = g->n_in / 32;
    const __m128i m4 = _mm_set1_epi8(15);
    const __m256i one16 = _mm256_set1_epi16(1);
    float acc = 0;
    for (int gi = 0; gi < g->n_group; gi++) {
        __m256 t = _mm256_setzero_ps();
        for (int b = gi * bpg; b < nb && b < (gi + 1) * bpg; b++) {
            __m128i h = _mm_loadu_si128((const __m128i *)(q + 16 * (size_t)b));
            __m256i c = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(h, 4), m4), _mm_and_si128(h, m4));
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(c, _mm256_loadu_si256((const __m256i *)a[b].qs)), one16);
            t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(a[b].d), t);
        }
        acc += sb[2 * gi] * kiln_hsum8(t) + sb[2 * gi + 1] * sx[gi];
    }
    return acc;
}

/* one step of gdot1_vnni: blocks 4u .. 4u+3 (fewer at the row's end) */
VNNI static inline __m512 gstep_vnni(const uint8_t *q, int u, int nb, const __m512i *act4, const __m512 *dx4) {
    const __m512i m4 = _mm512_set1_epi8(15);
    const uint8_t *c = q + 64 * (size_t)u;
    _mm_prefetch((const char *)c + L128_PF1, _MM_HINT_T0);
    _mm_prefetch((const char *)c + L128_PF2, _MM_HINT_T1);
    __m512i v = nb - 4 * u >= 4 ? _mm512_loadu_si512((const void *)c) : _mm512_maskz_loadu_epi8((__mmask64)((1ull << (16 * (nb - 4 * u))) - 1), c);
    __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v, m4), act4[2 * u]);
    d = _mm512_dpbusd_epi32(d, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4), act4[2 * u + 1]);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(d), dx4[u]);
}

/* VNNI decode, one row: 4 blocks per step (see the section comment) */
VNNI static float gdot1_vnni(const uint8_t *q, const float *sb, const __m512i *act4, const __m512 *dx4, const float *sxv, int nb, int G, int gs) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    const int nu = (nb + 3) / 4;
    if (gs >= 128) {
        /* a step lies in one group: its s broadcast */
        const int upg = gs / 128;
        for (int gi = 0, u = 0; gi < G; gi++) {
            if (!(gi & 7)) _mm_prefetch((const char *)(sb + 2 * gi) + L128_PF2 / 8, _MM_HINT_T1);
            const __m512 sv = _mm512_set1_ps(sb[2 * gi]);
            for (const int ue = u + upg < nu ? u + upg : nu; u < ue; u++) {
                if (u & 1) acc1 = _mm512_fmadd_ps(gstep_vnni(q, u, nb, act4, dx4), sv, acc1);
                else acc0 = _mm512_fmadd_ps(gstep_vnni(q, u, nb, act4, dx4), sv, acc0);
            }
        }
    } else {
        /* 2 (g64) or 4 (g32) groups per step: lane l takes the s of group
         * g0 + (32 (l / 4)) / gs, gathered from the [s, b] pairs */
        const int ng = 128 / gs;
        const __m512i sidx = gs == 32 ? _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6)
                                      : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
        for (int u = 0; u < nu; u++) {
            const int g0 = u * ng, m = G - g0 < ng ? G - g0 : ng;
            const __m512 sv = _mm512_permutexvar_ps(sidx, _mm512_maskz_loadu_ps((__mmask16)((1u << (2 * m)) - 1), sb + 2 * g0));
            if (u & 1) acc1 = _mm512_fmadd_ps(gstep_vnni(q, u, nb, act4, dx4), sv, acc1);
            else acc0 = _mm512_fmadd_ps(gstep_vnni(q, u, nb, act4, dx4), sv, acc0);
        }
    }
    /* sum_g b_g SX_g: sb's [s, b] pairs against [0, SX] pairs */
    for (int i = 0; i < 2 * G; i += 16) {
        __mmask16 m = 2 * G - i >= 16 ? 0xffff : (__mmask16)((1u << (2 * G - i)) - 1);
        acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, sb + i), _mm512_maskz_loadu_ps(m, sxv + i), acc1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* gdot1_vnni for g128 with K a multiple of 1024 (G a multiple of 8: the
 * usual GPTQ layout), over a run of rows: no tails, two groups per
 * iteration, the b_g SX_g dot folded in a zmm per 8 groups, one horizontal
 * sum per row */
VNNI static void grows128_vnni(const struct qgrp *g, int64_t r0, int64_t r1, const __m512i *act4, const __m512 *dx4, const float *sxv,
                               const float *bias, float *out) {
    const __m512i m4 = _mm512_set1_epi8(15);
    const int G = g->n_group;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = g->q + (size_t)r * g->row_bytes;
        const float *sb = g->sb + (size_t)r * G * 2;
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), accb = _mm512_setzero_ps();
        for (int gi = 0; gi < G; gi += 2, q += 128) {
            if (!(gi & 7)) {
                _mm_prefetch((const char *)(sb + 2 * gi) + L128_PF2 / 8, _MM_HINT_T1);
                accb = _mm512_fmadd_ps(_mm512_loadu_ps(sb + 2 * gi), _mm512_loadu_ps(sxv + 2 * gi), accb);
            }
            _mm_prefetch((const char *)q + L128_PF1, _MM_HINT_T0);
            _mm_prefetch((const char *)q + 64 + L128_PF1, _MM_HINT_T0);
            _mm_prefetch((const char *)q + L128_PF2, _MM_HINT_T1);
            _mm_prefetch((const char *)q + 64 + L128_PF2, _MM_HINT_T1);
            const __m512i v0 = _mm512_loadu_si512((const void *)q), v1 = _mm512_loadu_si512((const void *)(q + 64));
            __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v0, m4), act4[2 * gi]);
            __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v1, m4), act4[2 * gi + 2]);
            d0 = _mm512_dpbusd_epi32(d0, _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4), act4[2 * gi + 1]);
            d1 = _mm512_dpbusd_epi32(d1, _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4), act4[2 * gi + 3]);
            acc0 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d0), dx4[gi]), _mm512_set1_ps(sb[2 * gi]), acc0);
            acc1 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d1), dx4[gi + 1]), _mm512_set1_ps(sb[2 * gi + 2]), acc1);
        }
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), accb)) + (bias ? bias[r] : 0.0f);
    }
}

/* AVX2 decode (no VNNI), groups of an even number of blocks: two blocks per
 * ymm. A pair's 32 code bytes are one load ([block b | b+1], 16 each); low
 * nibbles [b 0..15 | b+1 0..15] and high nibbles [b 16..31 | ...] meet the
 * activations laid out the same way once per call (act2), two maddubs added
 * in i16, one madd: lanes 0-3 hold block b's partial dots, 4-7 block b+1's;
 * convert, FMA with [dx_b x 4 | dx_b+1 x 4] (dx2) into the group's sum,
 * which is scaled by s_g as a vector (no horizontal sum per group). The b_g
 * SX_g terms: one f32 dot of the row's [s, b] pairs with [0, SX] pairs. */
AVX2 static float gdot1_avx2(const uint8_t *q, const float *sb, const __m256i *act2, const float *dx2, const float *sxp, int G, int ppg,
                             int np) {
    const __m256i m4 = _mm256_set1_epi8(15), one16 = _mm256_set1_epi16(1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int gi = 0; gi < G; gi++) {
        const int p0 = gi * ppg, p1 = p0 + ppg < np ? p0 + ppg : np;
        __m256 T = _mm256_setzero_ps();
        for (int p = p0; p < p1; p++) {
            if (!(p & 1)) _mm_prefetch((const char *)q + 32 * (size_t)p + QPFD_G, _MM_HINT_T0);
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * (size_t)p));
            const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v, m4), _mm256_loadu_si256(act2 + 2 * p)),
                                               _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_loadu_si256(act2 + 2 * p + 1)));
            T = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s, one16)), _mm256_loadu_ps(dx2 + 8 * (size_t)p), T);
        }
        if (gi & 1) acc1 = _mm256_fmadd_ps(T, _mm256_broadcast_ss(sb + 2 * gi), acc1);
        else acc0 = _mm256_fmadd_ps(T, _mm256_broadcast_ss(sb + 2 * gi), acc0);
    }
    int k = 0;
    for (; k + 8 <= 2 * G; k += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(sb + k), _mm256_loadu_ps(sxp + k), acc0);
    float r = kiln_hsum8(_mm256_add_ps(acc0, acc1));
    for (; k < 2 * G; k++) r += sb[k] * sxp[k];
    return r;
}
#endif /* KILN_X86 */

static void g_rows(void *arg, int64_t r0, int64_t r1, int tid) {
    const struct gjob *j = arg;
    const struct qgrp *g = j->g;
#if defined(KILN_X86)
    if (j->n == 1 && j->dec2) {
        for (int64_t r = r0; r < r1; r++)
            j->out[r] = gdot1_avx2(g->q + (size_t)r * g->row_bytes, g->sb + (size_t)r * j->G * 2, j->act2, j->dx2, j->sx, j->G, j->gs / 64,
                                   j->nb / 2) +
                        (j->bias ? j->bias[r] : 0.0f);
        return;
    }
    if (j->n == 1 && j->vnni && j->gs == 128 && j->K % 1024 == 0) {
        grows128_vnni(g, r0, r1, j->act4, j->dx4, j->sx, j->bias, j->out);
        return;
    }
    if (j->n == 1 && j->vnni) {
        for (int64_t r = r0; r < r1; r++)
            j->out[r] = gdot1_vnni(g->q + (size_t)r * g->row_bytes, g->sb + (size_t)r * j->G * 2, j->act4, j->dx4, j->sx, j->nb, j->G, j->gs) +
                        (j->bias ? j->bias[r] : 0.0f);
        return;
    }
#endif
    for (int64_t r = r0; r < r1; r++) {
        const float b = j->bias ? j->bias[r] : 0.0f;
        for (int t = 0; t < j->n; t++) {
            const struct q8a *a = j->xa + (size_t)t * j->nb;
            const float *sx = j->sx + (size_t)t * j->G;
#if defined(KILN_X86)
            float v = j->isa >= CPU_ISA_AVX2 ? gdot_avx2(g, (int)r, a, sx, j->gs) : gdot_scalar(g, (int)r, a, sx, j->gs);
#elif defined(KILN_NEON)
            float v = j->isa >= CPU_ISA_DOTPROD ? gdot_dotprod(g, (int)r, a, sx, j->gs)
                      : j->isa >= CPU_ISA_NEON  ? gdot_neon(g, (int)r, a, sx, j->gs)
                                                : gdot_scalar(g, (int)r, a, sx, j->gs);
#else
            float v = gdot_scalar(g, (int)r, a, sx, j->gs);
#endif
            j->out[(size_t)t * j->N + r] = v + b;
        }
    }
    (void)tid;
}

#if defined(KILN_X86)
/* rows r0 .. r0+nr-1 (nr <= R, R = 16 or 8) into the panel: per block 8
 * quads x R rows x 4 code bytes (32 R bytes), then per group R s and R b
 * (missing rows: codes of the last row, s = b = 0) */
AVX2 static void pack_g4(uint8_t *P, const struct qgrp *g, int r0, int nr, int nb, int R) {
    const __m128i m4 = _mm_set1_epi8(15);
    for (int i0 = 0; i0 < R; i0 += 8) {
        const uint8_t *rp[8];
        for (int i = 0; i < 8; i++) rp[i] = g->q + (size_t)(r0 + (i0 + i < nr ? i0 + i : nr - 1)) * g->row_bytes;
        for (int b = 0; b < nb; b++) {
            __m256 v[8];
            for (int i = 0; i < 8; i++) {
                __m128i h = _mm_loadu_si128((const __m128i *)(rp[i] + 16 * (size_t)b));
                v[i] = _mm256_castsi256_ps(_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(h, 4), m4), _mm_and_si128(h, m4)));
            }
            kiln_transpose8(v);
            uint8_t *d = P + (size_t)b * 32 * R;
            for (int qd = 0; qd < 8; qd++) _mm256_storeu_ps((float *)(d + (size_t)qd * 4 * R + 4 * i0), v[qd]);
        }
    }
    float *S = (float *)(P + (size_t)nb * 32 * R);
    for (int gi = 0; gi < g->n_group; gi++)
        for (int i = 0; i < R; i++) {
            const float *sb = g->sb + ((size_t)(i < nr ? r0 + i : r0) * g->n_group + gi) * 2;
            S[2 * R * gi + i] = i < nr ? sb[0] : 0.0f;
            S[2 * R * gi + R + i] = i < nr ? sb[1] : 0.0f;
        }
}

/* 16 rows x 8 tokens; sx: the tile's [G][8] SX values */
VNNI static void gemm_g4_vnni(const uint8_t *P, const struct q8a *xt, const float *sx, int nb, int G, int bpg, float *out, size_t ldo, int nr,
                              int nt, const float *bias) {
    const float *S = (const float *)(P + (size_t)nb * 512);
    __m512 C[8];
    #pragma GCC unroll 16
    for (int t = 0; t < 8; t++) C[t] = _mm512_setzero_ps();
    for (int gi = 0; gi < G; gi++) {
        __m512 T[8];
        #pragma GCC unroll 16
        for (int t = 0; t < 8; t++) T[t] = _mm512_setzero_ps();
        const int b1 = (gi + 1) * bpg < nb ? (gi + 1) * bpg : nb;
        for (int b = gi * bpg; b < b1; b++) {
            const uint8_t *pb = P + (size_t)b * 512;
            const struct q8a *xb = xt + (size_t)b * 8;
            __m512i s[8];
            #pragma GCC unroll 16
            for (int t = 0; t < 8; t++) s[t] = _mm512_setzero_si512();
            #pragma GCC unroll 16
            for (int q = 0; q < 8; q++) {
                __m512i wv = _mm512_loadu_si512((const void *)(pb + 64 * q));
                #pragma GCC unroll 16
                for (int t = 0; t < 8; t++) {
                    int32_t a;
                    memcpy(&a, xb[t].qs + 4 * q, 4);
                    s[t] = _mm512_dpbusd_epi32(s[t], wv, _mm512_set1_epi32(a));
                }
            }
            #pragma GCC unroll 16
            for (int t = 0; t < 8; t++) T[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_set1_ps(xb[t].d), T[t]);
        }
        const __m512 sv = _mm512_loadu_ps(S + 32 * gi), bv = _mm512_loadu_ps(S + 32 * gi + 16);
        #pragma GCC unroll 16
        for (int t = 0; t < 8; t++) C[t] = _mm512_fmadd_ps(bv, _mm512_set1_ps(sx[8 * gi + t]), _mm512_fmadd_ps(T[t], sv, C[t]));
    }
    __mmask16 m = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    __m512 bb = bias ? _mm512_maskz_loadu_ps(m, bias) : _mm512_setzero_ps();
    #pragma GCC unroll 16
    for (int t = 0; t < 8; t++)
        if (t < nt) _mm512_mask_storeu_ps(out + t * ldo, m, _mm512_add_ps(C[t], bb));
}

/* AVX2: 8 rows x 4 tokens, the same sums as gemm_g4_vnni: per block and
 * quad one maddubs of the 8 rows' u8 codes with 4 broadcast activation
 * codes per token, added in i16 over the block (2 x 15 x 127 per maddubs
 * lane, 8 quads: < 2^15), one madd to i32 per block; sx: [G][4] */
AVX2 static void gemm_g4_avx2(const uint8_t *P, const struct q8a *xt, const float *sx, int nb, int G, int bpg, float *out, size_t ldo, int nr,
                              int nt, const float *bias) {
    const float *S = (const float *)(P + (size_t)nb * 256);
    const __m256i one16 = _mm256_set1_epi16(1);
    __m256 C[4];
    #pragma GCC unroll 16
    for (int t = 0; t < 4; t++) C[t] = _mm256_setzero_ps();
    for (int gi = 0; gi < G; gi++) {
        __m256 T[4];
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) T[t] = _mm256_setzero_ps();
        const int b1 = (gi + 1) * bpg < nb ? (gi + 1) * bpg : nb;
        for (int b = gi * bpg; b < b1; b++) {
            const uint8_t *pb = P + (size_t)b * 256;
            const struct q8a *xb = xt + (size_t)b * 4;
            __m256i s[4];
            #pragma GCC unroll 16
            for (int t = 0; t < 4; t++) s[t] = _mm256_setzero_si256();
            #pragma GCC unroll 16
            for (int q = 0; q < 8; q++) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)(pb + 32 * q));
                #pragma GCC unroll 16
                for (int t = 0; t < 4; t++) {
                    int32_t a;
                    memcpy(&a, xb[t].qs + 4 * q, 4);
                    s[t] = _mm256_add_epi16(s[t], _mm256_maddubs_epi16(wv, _mm256_set1_epi32(a)));
                }
            }
            #pragma GCC unroll 16
            for (int t = 0; t < 4; t++) T[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s[t], one16)), _mm256_set1_ps(xb[t].d), T[t]);
        }
        const __m256 sv = _mm256_loadu_ps(S + 16 * gi), bv = _mm256_loadu_ps(S + 16 * gi + 8);
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) C[t] = _mm256_fmadd_ps(bv, _mm256_set1_ps(sx[4 * gi + t]), _mm256_fmadd_ps(T[t], sv, C[t]));
    }
    __m256i m = mask8(nr);
    __m256 bb = bias ? _mm256_maskload_ps(bias, m) : _mm256_setzero_ps();
    #pragma GCC unroll 16
    for (int t = 0; t < 4; t++)
        if (t < nt) _mm256_maskstore_ps(out + t * ldo, m, _mm256_add_ps(C[t], bb));
}

static void g_gemm_panels(void *arg, int64_t p0, int64_t p1, int tid) {
    const struct gjob *j = arg;
    uint8_t *P = thread_scratch(j->scr, tid, j->scr_bytes);
    const int R = j->vnni ? 16 : 8, NT = j->NT;
    for (int64_t pi = p0; pi < p1; pi++) {
        const int r0 = (int)pi * R, nr = j->N - r0 < R ? j->N - r0 : R;
        pack_g4(P, j->g, r0, nr, j->nb, R);
        for (int tile = 0; tile < j->ntile; tile++) {
            const int t0 = tile * NT, nt = j->n - t0 < NT ? j->n - t0 : NT;
            const struct q8a *xt = j->xa + (size_t)tile * j->nb * NT;
            const float *sx = j->sx + (size_t)tile * j->G * NT, *bias = j->bias ? j->bias + r0 : NULL;
            float *c = j->out + (size_t)t0 * j->N + r0;
            if (j->vnni) gemm_g4_vnni(P, xt, sx, j->nb, j->G, j->gs / 32, c, j->N, nr, nt, bias);
            else gemm_g4_avx2(P, xt, sx, j->nb, j->G, j->gs / 32, c, j->N, nr, nt, bias);
        }
    }
}

#endif /* KILN_X86 */

static void g_quant(void *arg, int64_t t0, int64_t t1, int tid) {
    const struct gjob *j = arg;
    const int stride = j->NT ? j->NT : 1;
    for (int64_t t = t0; t < t1; t++) {
        struct q8a *d = j->NT ? j->xa + (size_t)(t / j->NT) * j->nb * j->NT + t % j->NT : j->xa + (size_t)t * j->nb;
        if (t >= j->n) {
            for (int b = 0; b < j->nb; b++) memset(&d[(size_t)b * stride], 0, sizeof *d);
#if defined(KILN_X86)
        } else if (j->isa >= CPU_ISA_AVX2) {
            quantize_act_avx2(j->x + (size_t)t * j->K, d, j->K, stride);
#endif
        } else {
            quantize_act(j->x + (size_t)t * j->K, d, j->K);
        }
        /* SX_g of this token: [t][G] (rows), [tile][G][NT] (GEMM) */
        for (int gi = 0; gi < j->G; gi++) {
            float s = 0;
            const int bpg = j->gs / 32, b1 = (gi + 1) * bpg < j->nb ? (gi + 1) * bpg : j->nb;
            for (int b = gi * bpg; b < b1; b++) s += d[(size_t)b * stride].d * (float)d[(size_t)b * stride].sum;
            if (j->NT) j->sx[((size_t)(t / j->NT) * j->G + gi) * j->NT + t % j->NT] = s;
            else j->sx[(size_t)t * j->G + gi] = s;
        }
    }
    (void)tid;
}

/* n at or above which the VNNI GEMM runs */
#define GGEMM_MIN 8

/* everything of a call before its parallel part (x quantized into the
 * backend's buffer, SX, the VNNI decode vectors); returns whether it is
 * the GEMM. x must already be in qgrp's (act-order) order. */
static int gact_setup(struct kiln_backend *be, struct gjob *jp, float *out, const float *x, const struct qlinear *w, int n) {
    const struct qprep *p = w->be;
    struct gjob j = {.g = &p->grp, .out = out, .bias = w->bias.data ? cpu_vec(&w->bias) : NULL, .x = x, .n = n, .K = w->n_in,
                     .N = w->n_out, .nb = w->n_in / 32, .G = p->grp.n_group, .gs = p->gact, .isa = cpu_isa()};
    j.vnni = j.isa >= CPU_ISA_AVX512 && have_vnni();
    const int gemm = j.isa >= CPU_ISA_AVX2 && n >= GGEMM_MIN;
    if (gemm) j.NT = j.vnni ? 8 : 4, j.ntile = (n + j.NT - 1) / j.NT;
    const int nrow = gemm ? j.ntile * j.NT : n, dec = j.vnni && n == 1, nu = (j.nb + 3) / 4;
    /* AVX2 decode by block pairs: groups of an even number of blocks */
    j.dec2 = !gemm && n == 1 && !j.vnni && j.isa >= CPU_ISA_AVX2 && j.gs % 64 == 0 && j.nb % 2 == 0;
    cpu_isa_note(j.isa >= CPU_ISA_AVX2 ? CPU_ISA_AVX2 : CPU_ISA_SCALAR, j.vnni && (gemm || dec) ? CPU_USED_VNNI : 0);
    const size_t sz[4] = {sizeof *j.xa * (size_t)nrow * j.nb, sizeof(float) * 2 * (size_t)nrow * j.G,
                          dec ? 128 * (size_t)nu : j.dec2 ? 32 * (size_t)j.nb : 0, dec ? 64 * (size_t)nu : j.dec2 ? 16 * (size_t)j.nb : 0};
    void *ptr[4];
    qbuf_get(be, sz, ptr, 4);
    j.xa = ptr[0], j.sx = ptr[1];
#if defined(KILN_NEON)
    cpu_isa_note(j.isa, 0); /* gdot_neon / gdot_dotprod */
#endif
#if defined(KILN_X86)
    if (dec) j.act4 = ptr[2], j.dx4 = ptr[3];
    if (j.dec2) j.act2 = ptr[2], j.dx2 = ptr[3];
#endif
    cpu_parallel_for(be, nrow, (16384 + j.K - 1) / j.K, g_quant, &j);
#if defined(KILN_X86)
    if (j.dec2) {
        /* act2[2p] = [x_2p 0..15 | x_2p+1 0..15], act2[2p+1] the 16..31
         * halves; dx2 per pair; sx becomes the [0, SX_g] pairs */
        for (int p = 0; p < j.nb / 2; p++) {
            const struct q8a *x0 = &j.xa[2 * p], *x1 = x0 + 1;
            int8_t *d = (int8_t *)&j.act2[2 * p];
            memcpy(d, x0->qs, 16), memcpy(d + 16, x1->qs, 16), memcpy(d + 32, x0->qs + 16, 16), memcpy(d + 48, x1->qs + 16, 16);
            for (int i = 0; i < 4; i++) j.dx2[8 * p + i] = x0->d, j.dx2[8 * p + 4 + i] = x1->d;
        }
        for (int gi = j.G - 1; gi >= 0; gi--) j.sx[2 * gi + 1] = j.sx[gi], j.sx[2 * gi] = 0;
    }
    if (dec) {
        /* act4[2u] = [x_b 0..15 for b = 4u .. 4u+3], act4[2u+1] the 16..31
         * halves; dx4[u] lanes 4k..4k+3 = dx of block 4u + k (0 past nb);
         * sx becomes the [0, SX_g] pairs (the G SX values are read first) */
        for (int u = 0; u < nu; u++) {
            int8_t *lo = (int8_t *)&j.act4[2 * u], *hi = lo + 64;
            float dv[16];
            for (int k = 0; k < 4; k++) {
                const int b = 4 * u + k;
                if (b < j.nb) memcpy(lo + 16 * k, j.xa[b].qs, 16), memcpy(hi + 16 * k, j.xa[b].qs + 16, 16);
                else memset(lo + 16 * k, 0, 16), memset(hi + 16 * k, 0, 16);
                for (int i = 0; i < 4; i++) dv[4 * k + i] = b < j.nb ? j.xa[b].d : 0.0f;
            }
            memcpy(&j.dx4[u], dv, sizeof dv);
        }
        for (int gi = j.G - 1; gi >= 0; gi--) j.sx[2 * gi + 1] = j.sx[gi], j.sx[2 * gi] = 0; /* in place, from the back */
    }
#endif
    *jp = j;
    return gemm;
}

static void matmul_gact(struct kiln_backend *be, float *out, const float *x, const struct qlinear *w, int n) {
    const struct qprep *p = w->be;
    float *xperm = NULL;
    if (p->grp.perm) {
        const int K = w->n_in;
        xperm = kiln_malloc(sizeof(float) * (size_t)n * K);
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++) xperm[(size_t)t * K + k] = x[(size_t)t * K + p->grp.perm[k]];
        x = xperm;
    }
    struct gjob j;
#if defined(KILN_X86)
    if (gact_setup(be, &j, out, x, w, n)) {
        const int nthr = cpu_n_threads(be);
        j.scr = kiln_calloc((size_t)nthr, sizeof(void *));
        const int R = j.vnni ? 16 : 8;
        j.scr_bytes = (size_t)j.nb * 32 * R + sizeof(float) * 2 * R * (size_t)j.G;
        cpu_parallel_for(be, (j.N + R - 1) / R, 1, g_gemm_panels, &j);
        free_scratch(j.scr, nthr);
    } else
#else
    gact_setup(be, &j, out, x, w, n); /* never the GEMM here (no VNNI) */
#endif
    {
        cpu_parallel_for_split(be, j.N, (int64_t)(64 << 10) / (int64_t)j.g->row_bytes + 1, g_rows, &j);
    }
    free(xperm);
}

int cpu_qmatmul_multi(struct kiln_backend *be, float *const *outs, const float *x, const struct qlinear *const *ws, int count,
                      int n) {
    const struct qprep *p0 = ws[0]->be;
    struct cpu_task t[MULTI_MAX];
    if (count > MULTI_MAX) return 0;
    if (p0->int8_act) {
        /* the row-dot decode: x quantized once, the rows of all linears in one job */
        struct ijob j[MULTI_MAX];
        const int isa = cpu_isa();
        if (isa >= CPU_ISA_AVX2 && n >= IGEMM_MIN) return 0;
        for (int i = 1; i < count; i++)
            if (((const struct qprep *)ws[i]->be)->int8_act != 1) return 0;
        if (int8_setup(be, &j[0], outs[0], x, ws[0], n)) return 0; /* not reached: the GEMM was ruled out above */
        for (int i = 0; i < count; i++) {
            if (i) {
                j[i] = j[0];
                j[i].w = ws[i], j[i].out = outs[i], j[i].N = ws[i]->n_out;
                j[i].bias = ws[i]->bias.data ? cpu_vec(&ws[i]->bias) : NULL;
            }
            t[i] = (struct cpu_task){i_rows, &j[i], ws[i]->n_out};
        }
        cpu_parallel_for_split_tasks(be, t, count, int8_chunk(&j[0]));
        return 1;
    }
    if (p0->gact) {
        /* GPTQ / AWQ int8 rows: x quantized once (same K, same groups), all rows in one job */
        struct gjob g[MULTI_MAX];
        if (n >= GGEMM_MIN) return 0;
        for (int i = 0; i < count; i++) {
            const struct qprep *p = ws[i]->be;
            if (p->gact != p0->gact || p->grp.perm || p->grp.n_group != p0->grp.n_group || ws[i]->n_in != ws[0]->n_in) return 0;
        }
        if (gact_setup(be, &g[0], outs[0], x, ws[0], n)) return 0; /* not reached: the GEMM was ruled out above */
        for (int i = 0; i < count; i++) {
            if (i) {
                g[i] = g[0];
                g[i].g = &((const struct qprep *)ws[i]->be)->grp, g[i].out = outs[i], g[i].N = ws[i]->n_out;
                g[i].bias = ws[i]->bias.data ? cpu_vec(&ws[i]->bias) : NULL;
            }
            t[i] = (struct cpu_task){g_rows, &g[i], ws[i]->n_out};
        }
        cpu_parallel_for_split_tasks(be, t, count, (int64_t)(64 << 10) / (int64_t)g[0].g->row_bytes + 1);
        return 1;
    }
#if !defined(KILN_X86)
    return 0; /* the exact decode has only row dots here: one by one */
#else
    /* the exact decode: x reordered once for the lookup kernels */
    struct xjob j[MULTI_MAX];
    const int K = ws[0]->n_in;
    float *xl = NULL;
    for (int i = 0; i < count; i++) {
        const struct qprep *p = ws[i]->be;
        if ((ws[i]->fmt == KILN_WFMT_GPTQ || ws[i]->fmt == KILN_WFMT_AWQ) && (p->grp.perm || p->gact)) return 0;
        j[i] = (struct xjob){.w = ws[i], .p = p, .out = outs[i], .x = x, .bias = ws[i]->bias.data ? cpu_vec(&ws[i]->bias) : NULL,
                             .n = n, .K = K, .N = ws[i]->n_out, .isa = cpu_isa()};
        if (!exact_fused(&j[i])) return 0;
    }
    for (int i = 0; i < count; i++) {
        if (exact_lut(&j[i])) {
            if (!xl) {
                const size_t sz = sizeof(float) * (size_t)K;
                qbuf_get(be, &sz, (void **)&xl, 1);
                lut_order_512(xl, x, K);
            }
            j[i].xl = xl;
            j[i].lut128 = lut128_ok(&j[i].p->grp);
        }
        t[i] = (struct cpu_task){x_fused_rows, &j[i], ws[i]->n_out};
    }
    cpu_parallel_for_split_tasks(be, t, count, ((64 << 10) / ((int64_t)K * 4) + 1) * 4);
    return 1;
#endif
}

void cpu_qmatmul(struct kiln_backend *be, void *out, const void *x, const struct qlinear *w, int n) {
    const struct qprep *p = w->be;
    if (p->int8_act) matmul_int8(be, out, x, w, n);
    else if (p->gact) matmul_gact(be, out, x, w, n);
    else matmul_exact(be, out, x, w, n);
}
