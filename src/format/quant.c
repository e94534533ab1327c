/*
 * quant.c: the format table, the GGUF block layouts with their reference
 * dequantization and round-to-nearest quantization, and the per-linear
 * dispatch (check, dequantize, bytes, label, dummy weights) over every
 * format. GPTQ, AWQ and FP8 element rules live in gptq.c, awq.c and fp8.c.
 *
 * The GGUF blocks, as llama.cpp's ggml-common.h declares them (f16 = IEEE
 * half, little-endian; QK_K = 256):
 *
 *   Q8_0  (32 w, 34 B)   | d f16 | qs[32] int8 |                 w = d * qs[i]
 *   Q4_0  (32 w, 18 B)   | d f16 | qs[16] |   w[i] = d * ((qs[i] & 15) - 8),
 *                                             w[i+16] = d * ((qs[i] >> 4) - 8)
 *   Q4_1  (32 w, 20 B)   | d f16 | m f16 | qs[16] |  w = d * q + m (same nibbles)
 *   Q5_0  (32 w, 22 B)   | d f16 | qh u32 | qs[16] |  q = nibble | (bit i of qh) << 4,
 *                                             w[i] = d * (q - 16) (nibbles as Q4_0)
 *   Q5_1  (32 w, 24 B)   | d f16 | m f16 | qh u32 | qs[16] |  w = d * q + m
 *
 *   Q4_K  (256 w, 144 B) | d f16 | dmin f16 | scales[12] | qs[128] |
 *         8 sub-blocks of 32; 6-bit scale sc[j] and min m[j] packed:
 *           bytes 0-3:  sc[0..3] low 6 bits, top 2 bits = sc[4..7] >> 4
 *           bytes 4-7:  m[0..3]  low 6 bits, top 2 bits = m[4..7] >> 4
 *           bytes 8-11: sc[4..7] & 15 | (m[4..7] & 15) << 4
 *         64-weight chunk c: qs[32c + l] low nibble -> w[64c + l] (sub-block 2c),
 *                            high nibble -> w[64c + 32 + l] (sub-block 2c+1)
 *         w = d * sc[j] * q - dmin * m[j]
 *   Q5_K  (256 w, 176 B) | d | dmin | scales[12] | qh[32] | qs[128] |
 *         as Q4_K, plus bit 4 of w[32b + l] = bit b of qh[l]
 *   Q6_K  (256 w, 210 B) | ql[128] | qh[64] | scales[16] int8 | d f16 |
 *         half h (128 w): ql[64h + l] low nibble -> w[128h + l], high -> w[128h + 64 + l] (l < 64);
 *         qh[32h + l] bits 2s..2s+1 -> high 2 bits of w[128h + 32s + l];
 *         w = d * scales[i / 16] * (q - 32)
 *   IQ4_NL (32 w, 18 B)  | d f16 | qs[16] |  4-bit indices, nibbles as Q4_0, into the
 *         16 int8 values kv = {-127, -104, -83, -65, -49, -35, -22, -10,
 *         1, 13, 25, 38, 53, 69, 89, 113}: w = d * kv[q]
 *   IQ4_XS (256 w, 136 B) | d f16 | scales_h u16 | scales_l[4] | qs[128] |
 *         8 sub-blocks of 32: 6-bit scale ls[j] = (scales_l[j / 2] >> 4 (j % 2)) & 15
 *         | ((scales_h >> 2j) & 3) << 4; sub-block j's indices at qs[16j ..], nibbles
 *         as IQ4_NL's: w = d * (ls[j] - 32) * kv[q]
 *   Q2_K  (256 w, 84 B)  | scales[16] | qs[64] | d f16 | dmin f16 |
 *         weight 128c + 32s + l (c < 2, s < 4, l < 32): q = (qs[32c + l] >> 2s) & 3;
 *         16 sub-blocks of 16: scales[j] & 15 the scale, >> 4 the min:
 *         w = d * sc[j] * q - dmin * m[j]
 *   Q3_K  (256 w, 110 B) | hmask[32] | qs[64] | scales[12] | d f16 |
 *         weight 128c + 32s + l: low 2 bits as Q2_K's, bit 2 = bit 4c + s of hmask[l];
 *         q = that 3-bit code - 4; 6-bit scale of sub-block j (16 weights): low 4 bits
 *         from scales[j % 8] >> 4 (j / 8), top 2 from scales[8 + j % 4] >> 2 (j / 4);
 *         w = d * (sc[j] - 32) * q
 */
#include "format/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"

static const struct quant_type types[] = {
    {KILN_DTYPE_F32, "F32", 0, 1, 4},      {KILN_DTYPE_F16, "F16", 1, 1, 2},      {KILN_DTYPE_BF16, "BF16", 30, 1, 2},
    {KILN_DTYPE_Q8_0, "Q8_0", 8, 32, 34},  {KILN_DTYPE_Q4_0, "Q4_0", 2, 32, 18},  {KILN_DTYPE_Q4_1, "Q4_1", 3, 32, 20},
    {KILN_DTYPE_Q5_0, "Q5_0", 6, 32, 22},  {KILN_DTYPE_Q5_1, "Q5_1", 7, 32, 24},
    {KILN_DTYPE_Q4_K, "Q4_K", 12, 256, 144}, {KILN_DTYPE_Q5_K, "Q5_K", 13, 256, 176}, {KILN_DTYPE_Q6_K, "Q6_K", 14, 256, 210},
    {KILN_DTYPE_IQ4_NL, "IQ4_NL", 20, 32, 18}, {KILN_DTYPE_IQ4_XS, "IQ4_XS", 23, 256, 136},
    {KILN_DTYPE_Q2_K, "Q2_K", 10, 256, 84},    {KILN_DTYPE_Q3_K, "Q3_K", 11, 256, 110},
};

const int8_t quant_iq4_kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
#define N_TYPES (sizeof types / sizeof types[0])

const struct quant_type *quant_type_of(enum kiln_dtype t) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (types[i].dtype == t) return &types[i];
    return NULL;
}

const struct quant_type *quant_type_ggml(int g) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (types[i].ggml_type == g) return &types[i];
    return NULL;
}

size_t quant_row_bytes(enum kiln_dtype t, int64_t n) {
    const struct quant_type *q = quant_type_of(t);
    if (!q) return 0;
    return (size_t)(n / q->block_elems) * (size_t)q->block_bytes;
}

static inline float h2f(const uint8_t *p) { return kiln_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static inline void f2h(uint8_t *p, float f) {
    uint16_t h = kiln_f32_to_f16(f);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

static inline void scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63, *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

/* ==== dequantization (reference) ==== */

void quant_dequant_row(enum kiln_dtype t, const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    switch (t) {
    case KILN_DTYPE_F32: memcpy(y, src, (size_t)n * 4); return;
    case KILN_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) y[i] = h2f(b + 2 * i);
        return;
    case KILN_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) y[i] = kiln_bf16_to_f32((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
        return;
    case KILN_DTYPE_Q8_0:
        for (int64_t o = 0; o < n; o += 32, b += 34, y += 32) {
            float d = h2f(b);
            for (int i = 0; i < 32; i++) y[i] = d * (int8_t)b[2 + i];
        }
        return;
    case KILN_DTYPE_Q4_0:
        for (int64_t o = 0; o < n; o += 32, b += 18, y += 32) {
            float d = h2f(b);
            for (int i = 0; i < 16; i++) {
                y[i] = d * ((b[2 + i] & 15) - 8);
                y[i + 16] = d * ((b[2 + i] >> 4) - 8);
            }
        }
        return;
    case KILN_DTYPE_Q4_1:
        for (int64_t o = 0; o < n; o += 32, b += 20, y += 32) {
            float d = h2f(b), m = h2f(b + 2);
            for (int i = 0; i < 16; i++) {
                y[i] = d * (b[4 + i] & 15) + m;
                y[i + 16] = d * (b[4 + i] >> 4) + m;
            }
        }
        return;
    case KILN_DTYPE_Q5_0:
    case KILN_DTYPE_Q5_1: {
        int one = t == KILN_DTYPE_Q5_1, bb = one ? 24 : 22;
        for (int64_t o = 0; o < n; o += 32, b += bb, y += 32) {
            float d = h2f(b), m = one ? h2f(b + 2) : 0;
            const uint8_t *p = b + (one ? 4 : 2), *qs = p + 4;
            uint32_t qh = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            for (int i = 0; i < 16; i++) {
                int q0 = (qs[i] & 15) | (int)((qh >> i) & 1) << 4, q1 = (qs[i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4;
                y[i] = one ? d * q0 + m : d * (q0 - 16);
                y[i + 16] = one ? d * q1 + m : d * (q1 - 16);
            }
        }
        return;
    }
    case KILN_DTYPE_Q4_K:
    case KILN_DTYPE_Q5_K: {
        int five = t == KILN_DTYPE_Q5_K, bb = five ? 176 : 144;
        for (int64_t o = 0; o < n; o += 256, b += bb, y += 256) {
            float d = h2f(b), dmin = h2f(b + 2);
            const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
            for (int c = 0; c < 4; c++) {
                int s0, m0, s1, m1;
                scale_min_k4(2 * c, sc, &s0, &m0);
                scale_min_k4(2 * c + 1, sc, &s1, &m1);
                for (int l = 0; l < 32; l++) {
                    int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
                    if (five) {
                        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                    }
                    y[64 * c + l] = d * s0 * lo - dmin * m0;
                    y[64 * c + 32 + l] = d * s1 * hi - dmin * m1;
                }
            }
        }
        return;
    }
    case KILN_DTYPE_Q6_K:
        for (int64_t o = 0; o < n; o += 256, b += 210, y += 256) {
            const uint8_t *ql = b, *qh = b + 128;
            const int8_t *sc = (const int8_t *)(b + 192);
            float d = h2f(b + 208);
            for (int h = 0; h < 2; h++)
                for (int s = 0; s < 4; s++)
                    for (int l = 0; l < 32; l++) {
                        int e = 32 * s + l; /* within the half */
                        int lo = e < 64 ? ql[64 * h + e] & 15 : ql[64 * h + e - 64] >> 4;
                        int q = lo | (((qh[32 * h + l] >> (2 * s)) & 3) << 4);
                        y[128 * h + e] = d * sc[(128 * h + e) / 16] * (q - 32);
                    }
        }
        return;
    case KILN_DTYPE_IQ4_NL:
        for (int64_t o = 0; o < n; o += 32, b += 18, y += 32) {
            float d = h2f(b);
            for (int i = 0; i < 16; i++) {
                y[i] = d * quant_iq4_kv[b[2 + i] & 15];
                y[i + 16] = d * quant_iq4_kv[b[2 + i] >> 4];
            }
        }
        return;
    case KILN_DTYPE_IQ4_XS:
        for (int64_t o = 0; o < n; o += 256, b += 136, y += 256) {
            const float d = h2f(b);
            for (int j = 0; j < 8; j++) {
                const float dl = d * (float)(quant_iq4xs_scale(b, j) - 32);
                const uint8_t *qs = b + 8 + 16 * j;
                for (int i = 0; i < 16; i++) {
                    y[32 * j + i] = dl * quant_iq4_kv[qs[i] & 15];
                    y[32 * j + 16 + i] = dl * quant_iq4_kv[qs[i] >> 4];
                }
            }
        }
        return;
    case KILN_DTYPE_Q2_K:
        for (int64_t o = 0; o < n; o += 256, b += 84, y += 256) {
            const float d = h2f(b + 80), dmin = h2f(b + 82);
            for (int e = 0; e < 256; e++) {
                const int j = e / 16;
                y[e] = d * (b[j] & 15) * quant_k23_code(b + 16, e) - dmin * (b[j] >> 4);
            }
        }
        return;
    case KILN_DTYPE_Q3_K:
        for (int64_t o = 0; o < n; o += 256, b += 110, y += 256) {
            const float d = h2f(b + 108);
            for (int e = 0; e < 256; e++)
                y[e] = d * (float)(quant_q3k_scale(b + 96, e / 16) - 32) * (float)((quant_k23_code(b + 32, e) | quant_q3k_hbit(b, e) << 2) - 4);
        }
        return;
    default: memset(y, 0, (size_t)n * 4);
    }
}

/* ==== round-to-nearest quantization (kiln quantize, dummy weights) ==== */

static int nearest(float x) { return (int)lrintf(x); }

static void quant_k4(const float *x, uint8_t *b) {
    float sc[8], mn[8], dmax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = 0; /* the min is clamped to <= 0, as llama.cpp does */
        for (int l = 0; l < 32; l++) lo = fminf(lo, x[32 * j + l]), hi = fmaxf(hi, x[32 * j + l]);
        sc[j] = (hi - lo) / 15, mn[j] = -lo;
        dmax = fmaxf(dmax, sc[j]), mmax = fmaxf(mmax, mn[j]);
    }
    float d = dmax / 63, dmin = mmax / 63;
    f2h(b, d), f2h(b + 2, dmin);
    d = h2f(b), dmin = h2f(b + 2);
    int is[8], im[8];
    for (int j = 0; j < 8; j++) {
        is[j] = d > 0 ? nearest(sc[j] / d) : 0, im[j] = dmin > 0 ? nearest(mn[j] / dmin) : 0;
        if (is[j] > 63) is[j] = 63;
        if (im[j] > 63) im[j] = 63;
    }
    uint8_t *q = b + 4;
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)((is[j] & 63) | ((is[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)((im[j] & 63) | ((im[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((is[j + 4] & 15) | ((im[j + 4] & 15) << 4));
    }
    uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int v[2];
            for (int h = 0; h < 2; h++) {
                int j = 2 * c + h;
                float s = d * is[j], m = dmin * im[j];
                int u = s > 0 ? nearest((x[32 * j + l] + m) / s) : 0;
                v[h] = u < 0 ? 0 : u > 15 ? 15 : u;
            }
            qs[32 * c + l] = (uint8_t)(v[0] | v[1] << 4);
        }
}

int quant_quantize_row(enum kiln_dtype t, const float *x, void *dst, int64_t n) {
    uint8_t *b = dst;
    switch (t) {
    case KILN_DTYPE_Q8_0:
        for (int64_t o = 0; o < n; o += 32, b += 34, x += 32) {
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
            float d = amax / 127;
            f2h(b, d);
            for (int i = 0; i < 32; i++) b[2 + i] = (uint8_t)(int8_t)(d > 0 ? nearest(x[i] / d) : 0);
        }
        return 0;
    case KILN_DTYPE_Q4_0:
        for (int64_t o = 0; o < n; o += 32, b += 18, x += 32) {
            float amax = 0, mx = 0; /* the signed value of largest magnitude maps to -8 */
            for (int i = 0; i < 32; i++)
                if (fabsf(x[i]) > amax) amax = fabsf(x[i]), mx = x[i];
            float d = mx / -8, id = d ? 1 / d : 0;
            f2h(b, d);
            for (int i = 0; i < 16; i++) {
                int a = (int)(x[i] * id + 8.5f), c = (int)(x[i + 16] * id + 8.5f);
                a = a > 15 ? 15 : a < 0 ? 0 : a, c = c > 15 ? 15 : c < 0 ? 0 : c;
                b[2 + i] = (uint8_t)(a | c << 4);
            }
        }
        return 0;
    case KILN_DTYPE_Q4_1:
        for (int64_t o = 0; o < n; o += 32, b += 20, x += 32) {
            float lo = x[0], hi = x[0];
            for (int i = 1; i < 32; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
            float d = (hi - lo) / 15, id = d ? 1 / d : 0;
            f2h(b, d), f2h(b + 2, lo);
            for (int i = 0; i < 16; i++) {
                int a = (int)((x[i] - lo) * id + 0.5f), c = (int)((x[i + 16] - lo) * id + 0.5f);
                a = a > 15 ? 15 : a, c = c > 15 ? 15 : c;
                b[4 + i] = (uint8_t)(a | c << 4);
            }
        }
        return 0;
    case KILN_DTYPE_Q4_K:
        for (int64_t o = 0; o < n; o += 256, b += 144, x += 256) quant_k4(x, b);
        return 0;
    default: return -1;
    }
}

/* f32 -> e4m3fn, round to nearest (ties to the even code), saturating at
 * 448: a binary search over the 127 finite non-negative codes, which are
 * monotonic in value (base.c's brute-force encoder is too slow for models). */
uint8_t quant_f32_to_e4m3(float f) {
    static float v[127];
    if (v[0x38] != 1.0f)
        for (int c = 0; c < 127; c++) v[c] = kiln_fp8e4m3_to_f32((uint8_t)c);
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (isnan(f)) return 0x7f;
    if (a >= 448.0f) return sign | 0x7e;
    int lo = 0, hi = 126; /* v[lo] <= a < v[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v[mid] <= a) lo = mid;
        else hi = mid;
    }
    float dl = a - v[lo], dh = v[hi] - a;
    int c = dl < dh ? lo : dh < dl ? hi : (lo & 1 ? hi : lo);
    return sign | (uint8_t)c;
}

/* ==== whole linears ==== */

float quant_scalar(const struct ktensor *t, int64_t i) {
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case KILN_DTYPE_F32: return ((const float *)p)[i];
    case KILN_DTYPE_F16: return kiln_f16_to_f32(((const uint16_t *)p)[i]);
    case KILN_DTYPE_BF16: return kiln_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return 0;
    }
}

int quant_check_linear(const struct qlinear *w, const char *name, char *err, size_t errlen) {
    switch (w->fmt) {
    case KILN_WFMT_DENSE: return 0;
    case KILN_WFMT_FP8: return fp8_check(w, name, err, errlen);
    case KILN_WFMT_GPTQ: return gptq_check(w, name, err, errlen);
    case KILN_WFMT_AWQ: return awq_check(w, name, err, errlen);
    case KILN_WFMT_GGUF: {
        const struct quant_type *q = quant_type_of(w->w.dtype);
        if (!q) return kiln_errf(err, errlen, "%s: tensor type %s is not supported", name, dtype_name(w->w.dtype));
        if (w->n_in % q->block_elems)
            return kiln_errf(err, errlen, "%s: %d input columns are not a multiple of the %s block (%d)", name, w->n_in, q->name, q->block_elems);
        return 0;
    }
    }
    return kiln_errf(err, errlen, "%s: unknown weight format", name);
}

void quant_dequant_linear(const struct qlinear *w, float *out) {
    const int N = w->n_out, K = w->n_in;
    switch (w->fmt) {
    case KILN_WFMT_DENSE:
    case KILN_WFMT_GGUF: {
        size_t rb = quant_row_bytes(w->w.dtype, K);
        for (int n = 0; n < N; n++) quant_dequant_row(w->w.dtype, (const uint8_t *)w->w.data + (size_t)n * rb, out + (size_t)n * K, K);
        return;
    }
    case KILN_WFMT_FP8:
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) out[(size_t)n * K + k] = fp8_weight_scale(w, n, k);
        return;
    case KILN_WFMT_GPTQ:
    case KILN_WFMT_AWQ:
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) {
                int q, z;
                float s;
                if (w->fmt == KILN_WFMT_GPTQ) gptq_element(w, n, k, &q, &z, &s);
                else awq_element(w, n, k, &q, &z, &s);
                out[(size_t)n * K + k] = s * (float)(q - z);
            }
        return;
    }
}

int quant_widen_bf16(const struct qlinear *w, uint16_t *out, char *err, size_t errlen) {
    const int N = w->n_out, K = w->n_in;
    if (w->fmt == KILN_WFMT_GPTQ || w->fmt == KILN_WFMT_AWQ) {
        /* through the row-major repacking: w = s q + b per group, in the
         * permuted column order, written back to the original columns */
        struct qgrp g;
        if (qgrp_pack(&g, w, err, errlen)) return -1;
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            int gi = 0;
            for (int j = 0; j < K; j++) {
                while (j >= g.gstart[gi + 1]) gi++;
                const float *sb = g.sb + ((size_t)n * g.n_group + gi) * 2;
                out[(size_t)n * K + (g.perm ? g.perm[j] : j)] = kiln_f32_to_bf16(sb[0] * (float)qgrp_code(&g, n, j) + sb[1]);
            }
        }
        qgrp_free(&g);
        return 0;
    }
#pragma omp parallel
    {
        float *row = kiln_malloc(sizeof(float) * (size_t)K);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            if (w->fmt == KILN_WFMT_FP8) {
                const uint8_t *q = (const uint8_t *)w->w.data + (size_t)n * K;
                for (int k0 = 0; k0 < K; k0 += w->block_k) {
                    const float sc = quant_scalar(&w->scales, (int64_t)(n / w->block_n) * w->scales.cols + k0 / w->block_k);
                    for (int k = k0; k < K && k < k0 + w->block_k; k++) row[k] = kiln_fp8e4m3_to_f32(q[k]) * sc;
                }
            } else { /* dense and GGUF blocks */
                quant_dequant_row(w->w.dtype, (const uint8_t *)w->w.data + (size_t)n * quant_row_bytes(w->w.dtype, K), row, K);
            }
            for (int k = 0; k < K; k++) out[(size_t)n * K + k] = kiln_f32_to_bf16(row[k]);
        }
        free(row);
    }
    return 0;
}

int64_t quant_tensor_bytes(const struct ktensor *t) {
    if (!t->data) return 0;
    size_t rb = quant_row_bytes(t->dtype, t->cols);
    if (!rb) rb = (size_t)t->cols * dtype_size(t->dtype);
    return (int64_t)rb * t->rows;
}

int64_t quant_linear_bytes(const struct qlinear *w) {
    return quant_tensor_bytes(&w->w) + quant_tensor_bytes(&w->bias) + quant_tensor_bytes(&w->scales) + quant_tensor_bytes(&w->zeros) +
           quant_tensor_bytes(&w->g_idx);
}

void quant_linear_label(const struct qlinear *w, char *buf, size_t len) {
    switch (w->fmt) {
    case KILN_WFMT_DENSE:
    case KILN_WFMT_GGUF: snprintf(buf, len, "%s", dtype_name(w->w.dtype)); return;
    case KILN_WFMT_FP8: snprintf(buf, len, "FP8-e4m3-b%dx%d(%s scales)", w->block_n, w->block_k, dtype_name(w->scales.dtype)); return;
    case KILN_WFMT_GPTQ: {
        int act = 0; /* g_idx present and not k / group: act-order */
        for (int k = 0; w->g_idx.data && k < w->n_in && !act; k++) act = ((const int32_t *)w->g_idx.data)[k] != k / w->group;
        snprintf(buf, len, "GPTQ%s-int%d-g%d%s", w->zero_plus1 ? "" : "v2", w->bits, w->group == w->n_in ? -1 : w->group, act ? "-act" : "");
        return;
    }
    case KILN_WFMT_AWQ: snprintf(buf, len, "AWQ-int%d-g%d", w->bits, w->group); return;
    }
    snprintf(buf, len, "?");
}

/* ==== dummy quantized weights ==== */

static const char *const dummy_fmts[] = {"fp8", "gptq-int4", "gptq-int8", "awq", "awq-int4", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k",
                                         "iq4_nl", "iq4_xs", "q2_k", "q3_k", NULL};

int quant_dummy_known(const char *fmt) {
    for (int i = 0; dummy_fmts[i]; i++)
        if (!strcasecmp(fmt, dummy_fmts[i])) return 1;
    return 0;
}

static void fill_bytes(uint8_t *p, size_t n, uint64_t seed) {
    const size_t chunk = 1 << 16;
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < (n + chunk - 1) / chunk; c++) {
        struct kiln_rng r;
        kiln_rng_seed(&r, seed * 0x9e3779b97f4a7c15ull + c);
        size_t e = (c + 1) * chunk < n ? (c + 1) * chunk : n;
        for (size_t i = c * chunk; i < e; i += 8) {
            uint64_t v = kiln_rng_next(&r);
            for (size_t j = 0; j < 8 && i + j < e; j++) p[i + j] = (uint8_t)(v >> (8 * j));
        }
    }
}

static int oom(char *err, size_t errlen, size_t bytes) {
    return kiln_errf(err, errlen, "dummy weights: out of memory (%zu bytes)", bytes);
}

/* Random codes are uniform; scales are set so the dequantized weights have
 * roughly standard deviation std. Block scales in the GGUF blocks are
 * rewritten after the random fill so they are sane f16 values. */
int quant_dummy_linear(struct qlinear *w, const char *fmt, int group, uint64_t seed, float std,
                       void *(*alloc)(void *, size_t), void *ctx, char *err, size_t errlen) {
    const int N = w->n_out, K = w->n_in;
    struct kiln_rng r;
    kiln_rng_seed(&r, seed);
    if (!strcasecmp(fmt, "fp8")) {
        w->fmt = KILN_WFMT_FP8;
        w->block_n = w->block_k = 128;
        int bn = (N + 127) / 128, bk = (K + 127) / 128;
        uint8_t *q = alloc(ctx, (size_t)N * K);
        if (!q) return oom(err, errlen, (size_t)N * K);
        fill_bytes(q, (size_t)N * K, seed);
        for (size_t i = 0; i < (size_t)N * K; i++) q[i] &= 0xB7; /* |v| <= 0x37 (~0.94): no NaN, a plausible spread */
        float *s = alloc(ctx, sizeof(float) * (size_t)bn * bk);
        if (!s) return oom(err, errlen, sizeof(float) * (size_t)bn * bk);
        for (int i = 0; i < bn * bk; i++) s[i] = std * 2.0f;
        w->w = (struct ktensor){.dtype = KILN_DTYPE_F8_E4M3, .rows = N, .cols = K, .data = q};
        w->scales = (struct ktensor){.dtype = KILN_DTYPE_F32, .rows = bn, .cols = bk, .data = s};
        return 0;
    }
    if (!strncasecmp(fmt, "gptq", 4) || !strncasecmp(fmt, "awq", 3)) {
        int awq = fmt[0] == 'a' || fmt[0] == 'A', bits = strstr(fmt, "8") ? 8 : 4, pf = 32 / bits;
        if (group <= 0 || group > K) group = K;
        if (K % pf || N % pf || (awq && K % group))
            return kiln_errf(err, errlen, "--quant %s: a [%d, %d] linear does not fit the packing (multiples of %d%s)", fmt, N, K, pf, awq ? " and of the group" : "");
        int G = (K + group - 1) / group;
        w->fmt = awq ? KILN_WFMT_AWQ : KILN_WFMT_GPTQ;
        w->bits = bits, w->group = group, w->zero_plus1 = !awq;
        size_t nq = awq ? (size_t)K * (N / 8) : (size_t)(K / pf) * N;
        uint8_t *q = alloc(ctx, nq * 4);
        if (!q) return oom(err, errlen, nq * 4);
        fill_bytes(q, nq * 4, seed);
        size_t nz = (size_t)G * (N / pf);
        uint32_t *z = alloc(ctx, nz * 4);
        if (!z) return oom(err, errlen, nz * 4);
        uint32_t zw = bits == 4 ? (awq ? 0x88888888u : 0x77777777u) : (awq ? 0x80808080u : 0x7F7F7F7Fu);
        for (size_t i = 0; i < nz; i++) z[i] = zw;
        uint16_t *s = alloc(ctx, sizeof(uint16_t) * (size_t)G * N);
        if (!s) return oom(err, errlen, sizeof(uint16_t) * (size_t)G * N);
        float sv = std * 1.7320508f / (float)(1 << (bits - 1));
        for (size_t i = 0; i < (size_t)G * N; i++) s[i] = kiln_f32_to_f16(sv * (0.75f + 0.5f * (float)kiln_rng_uniform(&r)));
        w->w = awq ? (struct ktensor){.dtype = KILN_DTYPE_I32, .rows = K, .cols = N / 8, .data = q}
                   : (struct ktensor){.dtype = KILN_DTYPE_I32, .rows = K / pf, .cols = N, .data = q};
        w->zeros = (struct ktensor){.dtype = KILN_DTYPE_I32, .rows = G, .cols = N / pf, .data = z};
        w->scales = (struct ktensor){.dtype = KILN_DTYPE_F16, .rows = G, .cols = N, .data = s};
        return 0;
    }
    enum kiln_dtype t = !strcasecmp(fmt, "q8_0") ? KILN_DTYPE_Q8_0 : !strcasecmp(fmt, "q4_0") ? KILN_DTYPE_Q4_0
                      : !strcasecmp(fmt, "q4_1") ? KILN_DTYPE_Q4_1 : !strcasecmp(fmt, "q4_k") ? KILN_DTYPE_Q4_K
                      : !strcasecmp(fmt, "q5_0") ? KILN_DTYPE_Q5_0 : !strcasecmp(fmt, "q5_1") ? KILN_DTYPE_Q5_1
                      : !strcasecmp(fmt, "q5_k") ? KILN_DTYPE_Q5_K : !strcasecmp(fmt, "q6_k") ? KILN_DTYPE_Q6_K
                      : !strcasecmp(fmt, "iq4_nl") ? KILN_DTYPE_IQ4_NL : !strcasecmp(fmt, "iq4_xs") ? KILN_DTYPE_IQ4_XS
                      : !strcasecmp(fmt, "q2_k") ? KILN_DTYPE_Q2_K : !strcasecmp(fmt, "q3_k") ? KILN_DTYPE_Q3_K : KILN_DTYPE_NONE;
    const struct quant_type *qt = quant_type_of(t);
    if (!qt)
        return kiln_errf(err, errlen, "--quant %s: unknown format (fp8, gptq-int4, gptq-int8, awq, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs)", fmt);
    if (K % qt->block_elems && qt->block_elems == 256) { /* as llama.cpp does: rows that do not fit a K-quant get Q8_0 */
        t = KILN_DTYPE_Q8_0;
        qt = quant_type_of(t);
    }
    if (K % qt->block_elems) return kiln_errf(err, errlen, "--quant %s: %d input columns are not a multiple of %d", fmt, K, qt->block_elems);
    size_t rb = quant_row_bytes(t, K), nb = rb * (size_t)N;
    uint8_t *q = alloc(ctx, nb);
    if (!q) return oom(err, errlen, nb);
    fill_bytes(q, nb, seed);
    /* sane block headers: replace the f16 scales with positive values */
    size_t nblk = nb / (size_t)qt->block_bytes;
    float d = std * 1.7320508f / (t == KILN_DTYPE_Q8_0 || t == KILN_DTYPE_IQ4_NL ? 127.0f : t == KILN_DTYPE_Q6_K ? 32.0f * 32.0f
                                  : t == KILN_DTYPE_IQ4_XS ? 8.0f * 127.0f : t == KILN_DTYPE_Q2_K ? 8.0f * 2.0f : t == KILN_DTYPE_Q3_K ? 8.0f * 4.0f
                                                           : 8.0f);
    for (size_t i = 0; i < nblk; i++) {
        uint8_t *b = q + i * (size_t)qt->block_bytes;
        switch (t) {
        case KILN_DTYPE_Q8_0:
        case KILN_DTYPE_IQ4_NL:
        case KILN_DTYPE_Q4_0: f2h(b, d); break;
        case KILN_DTYPE_Q2_K: /* random 4-bit scales and mins (the codes' mean 1.5 against m / sc ~ 1) */
            f2h(b + 80, d), f2h(b + 82, d);
            break;
        case KILN_DTYPE_Q3_K: /* random 6-bit scales: sc - 32 anywhere in -32 .. 31 */
            f2h(b + 108, d / 4);
            break;
        case KILN_DTYPE_IQ4_XS: /* every sub-block's scale 40 - 32 = 8 */
            f2h(b, d), b[2] = b[3] = 0xAA;
            for (int j = 0; j < 4; j++) b[4 + j] = 0x88;
            break;
        case KILN_DTYPE_Q4_1: f2h(b, d), f2h(b + 2, -8 * d); break;
        case KILN_DTYPE_Q5_0: f2h(b, d / 2); break;
        case KILN_DTYPE_Q5_1: f2h(b, d / 2), f2h(b + 2, -8 * d); break;
        case KILN_DTYPE_Q4_K:
        case KILN_DTYPE_Q5_K:
            f2h(b, d / 32), f2h(b + 2, d / 4);
            for (int j = 0; j < 12; j++) b[4 + j] = 0x20 | (j >= 8 ? 0x02 : 0); /* sc ~32, m ~32/4 */
            break;
        case KILN_DTYPE_Q6_K:
            f2h(b + 208, d);
            for (int j = 0; j < 16; j++) b[192 + j] = 32;
            break;
        default: break;
        }
    }
    w->fmt = KILN_WFMT_GGUF;
    w->w = (struct ktensor){.dtype = t, .rows = N, .cols = K, .data = q};
    return 0;
}
