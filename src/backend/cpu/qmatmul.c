/*
 * qmatmul.c: y = x W^T + b on the CPU for the quantized formats (FP8 block,
 * GPTQ, AWQ, GGUF blocks). matmul.c hands every non-dense linear here.
 *
 * Two paths, both reading the weights as stored (or as repacked once at
 * load, for GPTQ/AWQ: format/quant.h struct qgrp); nothing is ever
 * dequantized to f32 beyond one row of scratch per thread:
 *
 *   exact   (every format) OpenMP splits the n_out rows across threads; a
 *           thread dequantizes its current row into an L1/L2-resident
 *           scratch row and takes f32 dot products with up to 4 activation
 *           rows at a time (matmul.c's dot kernels). At decode (n <= 4) FP8,
 *           GPTQ and AWQ skip the scratch: dequantized registers feed the
 *           FMAs directly. The result equals the dequantized weights'
 *           matmul up to f32 summation order.
 *   int8    (GGUF Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, the llama.cpp way) activations are
 *           quantized once per call to int8 blocks of 32 (f32 scale + the
 *           block's integer sum); each output is then integer dot products
 *           of the stored weight codes with the activation codes, scaled per
 *           block. AVX2 (maddubs/madd) with a scalar fallback, picked at run
 *           time. Costs ~0.5% relative error per dot from rounding x: the
 *           tests bound it separately. KILN_QACT=f32 forces the exact path.
 *
 * Act-order GPTQ: x is permuted once per call (x'[k] = x[perm[k]]) so the
 * repacked rows read groups contiguously.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/simd.h"
#include "base/base.h"
#include "format/quant.h"

struct qprep {
    struct qgrp grp;    /* GPTQ / AWQ */
    float *fp8_scale;   /* FP8: [ceil(N/bn)][ceil(K/bk)] as f32 */
    int int8_act;       /* GGUF Q8_0/Q4_0/Q4_K: int8 activation path */
};

static float fp8_lut[256];

static int want_int8(enum kiln_dtype t) {
    const char *e = getenv("KILN_QACT");
    if (e && !strcmp(e, "f32")) return 0;
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

#define AVX2 __attribute__((target("avx2,fma,f16c")))

static int have_avx2(void) {
    static int v = -1;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") && !getenv("KILN_NO_SIMD");
    }
    return v;
}

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
AVX2 static void fused_grp_avx2(const struct qgrp *g, int r, const float *const *x, int nx, float *out) {
    const uint8_t *q = g->q + (size_t)r * g->row_bytes;
    const float *sb = g->sb + (size_t)r * g->n_group * 2;
    const __m128i m4 = _mm_set1_epi8(15);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float tail[4] = {0, 0, 0, 0};
#define STEP(bytes, off)                                                                                   \
    do {                                                                                                   \
        __m256 wv = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), vs, vb);             \
        for (int j = 0; j < nx; j++) acc[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[j] + k + (off)), acc[j]); \
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
            for (int j = 0; j < nx; j++) tail[j] += (s * qgrp_code(g, r, k) + b) * x[j][k];
    }
#undef STEP
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]) + tail[j];
}

AVX2 static void fused_fp8_avx2(const struct qlinear *w, const struct qprep *p, int r, const float *const *x, int nx, float *out) {
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
            for (int j = 0; j < nx; j++) acc[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[j] + k), acc[j]);
        }
        for (; k < k1; k++)
            for (int j = 0; j < nx; j++) tail[j] += fp8_lut[q[k]] * s[b] * x[j][k];
    }
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]) + tail[j];
}

static void matmul_exact(float *out, const float *x, const struct qlinear *w, int n) {
    const struct qprep *p = w->be;
    const int K = w->n_in, N = w->n_out;
    const float *bias = w->bias.data ? cpu_vec(&w->bias) : NULL;
    cpu_dot_fn dot = cpu_dot_for(KILN_DTYPE_F32);
    float *xp = NULL;
    if ((w->fmt == KILN_WFMT_GPTQ || w->fmt == KILN_WFMT_AWQ) && p->grp.perm) {
        xp = kiln_malloc(sizeof(float) * (size_t)n * K);
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++) xp[(size_t)t * K + k] = x[(size_t)t * K + p->grp.perm[k]];
        x = xp;
    }
    size_t rb = w->fmt == KILN_WFMT_GGUF ? quant_row_bytes(w->w.dtype, K) : 0;
    const int v = have_avx2();
    if (v && n <= 4 && w->fmt != KILN_WFMT_GGUF) { /* decode: fused, no scratch */
#pragma omp parallel for schedule(static)
        for (int r = 0; r < N; r++) {
            const float *xs[4];
            float o[4];
            for (int j = 0; j < n; j++) xs[j] = x + (size_t)j * K;
            if (w->fmt == KILN_WFMT_FP8) fused_fp8_avx2(w, p, r, xs, n, o);
            else fused_grp_avx2(&p->grp, r, xs, n, o);
            for (int j = 0; j < n; j++) out[(size_t)j * N + r] = o[j] + (bias ? bias[r] : 0.0f);
        }
        free(xp);
        return;
    }
#pragma omp parallel
    {
        float *y = kiln_malloc(sizeof(float) * (size_t)K);
#pragma omp for schedule(static)
        for (int r = 0; r < N; r++) {
            switch (w->fmt) {
            case KILN_WFMT_FP8: (v ? row_fp8_avx2 : row_fp8)(w, p, r, y); break;
            case KILN_WFMT_GPTQ:
            case KILN_WFMT_AWQ: (v ? row_grp_avx2 : row_grp)(&p->grp, r, y); break;
            default: quant_dequant_row(w->w.dtype, (const uint8_t *)w->w.data + (size_t)r * rb, y, K); break;
            }
            float b = bias ? bias[r] : 0.0f;
            for (int t = 0; t < n; t += 4) {
                int nx = n - t < 4 ? n - t : 4;
                const float *xs[4];
                float o[4];
                for (int j = 0; j < nx; j++) xs[j] = x + (size_t)(t + j) * K;
                dot(y, xs, nx, K, o);
                for (int j = 0; j < nx; j++) out[(size_t)(t + j) * N + r] = o[j] + b;
            }
        }
        free(y);
    }
    free(xp);
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

/* The AVX2 kernels take up to 4 activation rows (nx) per pass over a weight
 * row, so at prefill each block is unpacked once per 4 tokens. */
#define NX 4

AVX2 static void dot_q8_0_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out) {
    __m256 acc[NX];
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++, w += 34) {
        __m256i qw = _mm256_loadu_si256((const __m256i *)(w + 2)), aw = _mm256_sign_epi8(qw, qw);
        float d = h2f_c(w);
        for (int j = 0; j < nx; j++) {
            __m256 s = dot_u8s8(aw, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)a[j][i].qs), qw));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[j][i].d), s, acc[j]);
        }
    }
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]);
}

AVX2 static void dot_q4_0_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out) {
    __m256 acc[NX];
    float off[NX] = {0};
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15);
    for (int i = 0; i < nb; i++, w += 18) {
        __m128i b = _mm_loadu_si128((const __m128i *)(w + 2));
        __m256i qw = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
        float d = h2f_c(w);
        for (int j = 0; j < nx; j++) {
            __m256 s = dot_u8s8(qw, _mm256_loadu_si256((const __m256i *)a[j][i].qs));
            float dd = d * a[j][i].d;
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dd), s, acc[j]);
            off[j] += dd * (float)a[j][i].sum;
        }
    }
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]) - 8 * off[j];
}

AVX2 static void dot_q4_k_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nsb, float *out) {
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
            int s0, m0, s1, m1;
            k4_scale_min(2 * c, w + 4, &s0, &m0);
            k4_scale_min(2 * c + 1, w + 4, &s1, &m1);
            for (int j = 0; j < nx; j++) {
                const struct q8a *a0 = &a[j][8 * i + 2 * c], *a1 = a0 + 1;
                acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * s0 * a0->d), dot_u8s8(lo, _mm256_loadu_si256((const __m256i *)a0->qs)), acc[j]);
                acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * s1 * a1->d), dot_u8s8(hi, _mm256_loadu_si256((const __m256i *)a1->qs)), acc[j]);
                mins[j] += dmin * (m0 * a0->d * (float)a0->sum + m1 * a1->d * (float)a1->sum);
            }
        }
    }
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]) - mins[j];
}

AVX2 static void dot_q4_1_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out) {
    __m256 acc[NX];
    float off[NX] = {0};
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15);
    for (int i = 0; i < nb; i++, w += 20) {
        __m128i b = _mm_loadu_si128((const __m128i *)(w + 4));
        __m256i qw = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
        float d = h2f_c(w), m = h2f_c(w + 2);
        for (int j = 0; j < nx; j++) {
            __m256 s = dot_u8s8(qw, _mm256_loadu_si256((const __m256i *)a[j][i].qs));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[j][i].d), s, acc[j]);
            off[j] += m * a[j][i].d * (float)a[j][i].sum;
        }
    }
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]) + off[j];
}

AVX2 static void dot_q5_k_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nsb, float *out) {
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
            int s0, m0, s1, mm1;
            k4_scale_min(2 * c, w + 4, &s0, &m0);
            k4_scale_min(2 * c + 1, w + 4, &s1, &mm1);
            for (int j = 0; j < nx; j++) {
                const struct q8a *a0 = &a[j][8 * i + 2 * c], *a1 = a0 + 1;
                acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * s0 * a0->d), dot_u8s8(lo, _mm256_loadu_si256((const __m256i *)a0->qs)), acc[j]);
                acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * s1 * a1->d), dot_u8s8(hi, _mm256_loadu_si256((const __m256i *)a1->qs)), acc[j]);
                mins[j] += dmin * (m0 * a0->d * (float)a0->sum + mm1 * a1->d * (float)a1->sum);
            }
        }
    }
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]) - mins[j];
}

AVX2 static void dot_q6_k_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nsb, float *out) {
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
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]);
}

typedef float (*qdot_fn)(const uint8_t *w, const struct q8a *a, int nb);
typedef void (*qdotx_fn)(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out);

static void matmul_int8(float *out, const float *x, const struct qlinear *w, int n) {
    const int K = w->n_in, N = w->n_out, nb = K / 32;
    const float *bias = w->bias.data ? cpu_vec(&w->bias) : NULL;
    const int v = have_avx2();
    qdot_fn dot;
    qdotx_fn dotx;
    int nblk = nb;
    switch (w->w.dtype) {
    case KILN_DTYPE_Q8_0: dot = dot_q8_0_scalar, dotx = dot_q8_0_avx2; break;
    case KILN_DTYPE_Q4_0: dot = dot_q4_0_scalar, dotx = dot_q4_0_avx2; break;
    case KILN_DTYPE_Q4_1: dot = dot_q4_1_scalar, dotx = dot_q4_1_avx2; break;
    case KILN_DTYPE_Q5_K: dot = dot_q5_k_scalar, dotx = dot_q5_k_avx2, nblk = K / 256; break;
    case KILN_DTYPE_Q6_K: dot = dot_q6_k_scalar, dotx = dot_q6_k_avx2, nblk = K / 256; break;
    default: dot = dot_q4_k_scalar, dotx = dot_q4_k_avx2, nblk = K / 256; break;
    }
    struct q8a *xa = kiln_malloc(sizeof *xa * (size_t)n * nb);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; t++) quantize_act(x + (size_t)t * K, xa + (size_t)t * nb, K);
    const size_t rb = quant_row_bytes(w->w.dtype, K);
    const uint8_t *W = w->w.data;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; r++) {
        float b = bias ? bias[r] : 0.0f;
        const uint8_t *row = W + (size_t)r * rb;
        for (int t = 0; t < n; t += NX) {
            int nx = n - t < NX ? n - t : NX;
            const struct q8a *as[NX];
            float o[NX];
            for (int j = 0; j < nx; j++) as[j] = xa + (size_t)(t + j) * nb;
            if (v) dotx(row, as, nx, nblk, o);
            else
                for (int j = 0; j < nx; j++) o[j] = dot(row, as[j], nblk);
            for (int j = 0; j < nx; j++) out[(size_t)(t + j) * N + r] = o[j] + b;
        }
    }
    free(xa);
}

void cpu_qmatmul(struct kiln_backend *be, void *out, const void *x, const struct qlinear *w, int n) {
    (void)be;
    const struct qprep *p = w->be;
    if (p->int8_act) matmul_int8(out, x, w, n);
    else matmul_exact(out, x, w, n);
}
