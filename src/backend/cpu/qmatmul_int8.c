/*
 * qmatmul_int8.c: the int8 path of the quantized matmul for GGUF blocks
 * (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; qmatmul.c's header comment, "int8"):
 * the activations quantized once per call to int8 blocks of 32 (the GPTQ
 * path, qmatmul_gptq.c, quantizes with the same functions), the scalar row
 * dots every kernel is held to, the NEON ones (Q8_0 / Q4_0), and the driver:
 * which kernel runs, the per-call activation vectors the decode kernels
 * read, the row dots or the GEMM on the pool. The AVX2 / AVX-512 kernels
 * are in qmatmul_int8_x86.c, the NEON GEMM in qmatmul_int8_neon.c.
 */
#include <math.h>

#include "backend/cpu/qmatmul_internal.h"

/* ==== activations quantized to int8 blocks ==== */

void qm_quantize_act(const float *x, struct q8a *b, int K) {
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

/* Activations quantized with AVX2: the same arithmetic as qm_quantize_act
 * (amax, d = amax / 127, id = 1 / d, x * id rounded to nearest even by
 * cvtps2dq as lrintf does), so the codes are bit-identical. Block b of the
 * row goes to out[b * stride] (stride 1: row-major; NT: the GEMM's tiles). */
#if defined(KILN_X86)
AVX2 void qm_quantize_act_avx2(const float *x, struct q8a *b, int K, int stride) {
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

#if defined(KILN_NEON)
/* Activations quantized with NEON, bit-identical to qm_quantize_act: amax
 * by fmaxnm (a NaN is skipped, as fmaxf skips it), the same d and id,
 * x * id rounded to nearest even by fcvtns (lrintf's default rounding),
 * narrowed with saturation (|x * id| <= 127 once rounded, so as the
 * scalar cast). Block b of the row goes to out[b * stride]. */
void qm_quantize_act_neon(const float *x, struct q8a *b, int K, int stride) {
    for (int o = 0; o < K; o += 32, b += stride) {
        float32x4_t v[8], m = vdupq_n_f32(0);
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) v[i] = vld1q_f32(x + o + 4 * i), m = vmaxnmq_f32(m, vabsq_f32(v[i]));
        const float amax = vmaxnmvq_f32(m), d = amax / 127, id = d > 0 ? 1 / d : 0;
        int16x8_t h[4];
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
            h[i] = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * i], id))), vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * i + 1], id))));
        const int8x16_t q0 = vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1])), q1 = vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3]));
        vst1q_s8(b->qs, q0), vst1q_s8(b->qs + 16, q1);
        b->d = d, b->sum = vaddlvq_s16(vaddq_s16(vaddq_s16(h[0], h[1]), vaddq_s16(h[2], h[3])));
    }
}
#endif

/* ==== row dots, scalar: the reference ==== */

static inline float h2f(const uint8_t *p) { return kiln_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static float dot_q8_0_scalar(const uint8_t *w, const struct q8a *a, int nb) {
    float acc = 0;
    for (int i = 0; i < nb; i++, w += 34) {
        acc += h2f(w) * a[i].d * (float)qm_isum_q8(w + 2, a[i].qs);
    }
    return acc;
}

static float dot_q4_0_scalar(const uint8_t *w, const struct q8a *a, int nb) {
    float acc = 0;
    for (int i = 0; i < nb; i++, w += 18) {
        acc += h2f(w) * a[i].d * (float)(qm_isum_q4(w + 2, a[i].qs) - 8 * a[i].sum);
    }
    return acc;
}

#if defined(KILN_X86)
/* ==== Q4_0 in groups of 16 rows (qmatmul_internal.h): the copy, and the
 * scalar kernels the AVX2 / VNNI ones (qmatmul_int8_x86.c) equal ==== */

uint8_t *qm_x16_pack(const uint8_t *W, int N, int K, int fmt) {
    const int q8 = fmt == X16_Q8, t1 = x16_t1(fmt), five = x16_five(fmt);
    const int bs = q8 ? 34 : qm_q45_bytes(t1, five), at = q8 ? 2 : qm_q45_codes_at(t1, five), nc = q8 ? 8 : 4;
    const int nb = K / 32, BB = x16_bb(fmt), C = q8 ? 32 : x16t_codes(t1);
    const size_t rb = (size_t)nb * bs;
    const int64_t ng = N / X16_R;
    uint8_t *P = kiln_walloc(rb * (size_t)N);
    if (!P) return NULL;
    #pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < ng; g++)
        for (int b = 0; b < nb; b++) {
            uint8_t *p = P + ((size_t)g * nb + b) * BB;
            for (int r = 0; r < X16_R; r++) {
                const uint8_t *blk = W + (size_t)(X16_R * g + r) * rb + (size_t)bs * b;
                memcpy(p + 2 * r, blk, 2);
                if (t1) memcpy(p + 32 + 2 * r, blk + 2, 2);
                for (int c = 0; c < nc; c++) memcpy(p + C + 64 * c + 4 * r, blk + at + 4 * c, 4);
                if (five) { /* weight 4k + j's fifth bit to bit k of byte j, weight 16 + 4k + j's to bit 4 + k */
                    const uint32_t h = qm_q5_qh(blk + at - 4);
                    for (int jj = 0; jj < 4; jj++) {
                        uint8_t v = 0;
                        for (int k = 0; k < 4; k++) v |= (uint8_t)((h >> (4 * k + jj) & 1) << k | (h >> (16 + 4 * k + jj) & 1) << (4 + k));
                        p[C + 256 + 4 * r + jj] = v;
                    }
                }
            }
        }
    memcpy(P + (size_t)ng * X16_R * rb, W + (size_t)ng * X16_R * rb, (size_t)(N - ng * X16_R) * rb); /* the rows past the groups, as stored */
    return P;
}

/* one block's sum of a row (stored codes at c, Q5: qh at c - 4) against
 * activation block x, and its d, as the group kernels form them: the
 * integer sum with Q4_0's / Q5_0's offset, then fma with d xd, for type-1
 * then fma with m and xd x code sum (xs) */
static float x16_block(float acc, int fmt, float d, float m, const uint8_t *c, const struct q8a *x, float xs) {
    const int five = x16_five(fmt);
    const int s = fmt == X16_Q8    ? qm_isum_q8(c, x->qs)
                  : fmt == X16_IQ4 ? qm_isum_iq4(c, x->qs)
                  : five           ? qm_isum_q5(c - 4, c, x->qs) - (fmt == X16_Q50 ? 16 * x->sum : 0)
                                   : qm_isum_q4(c, x->qs) - (fmt == X16_Q4 ? 8 * x->sum : 0);
    acc = fmaf((float)s, d * x->d, acc);
    return x16_t1(fmt) ? fmaf(m, xs, acc) : acc;
}

/* group G (format fmt) against nt tokens of the tile xt (qm_x16_vnni's
 * contract): each row's block gathered from its chunks into the stored
 * order, then the reference block sums */
static void x16_scalar(const uint8_t *G, const struct q8a *xt, const int32_t *c8, int NT, int nt, int nb, int fmt, float *out, size_t ldo,
                       const float *bias) {
    const int BB = x16_bb(fmt), nc = fmt == X16_Q8 ? 8 : 4, t1 = x16_t1(fmt), five = x16_five(fmt), C = fmt == X16_Q8 ? 32 : x16t_codes(t1);
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < X16_R; r++) {
            float acc = 0;
            for (int b = 0; b < nb; b++) {
                const uint8_t *p = G + (size_t)BB * b;
                uint8_t c[36]; /* Q5: the row's qh, then its codes */
                for (int k = 0; k < nc; k++) memcpy(c + 4 + 4 * k, p + C + 64 * k + 4 * r, 4);
                if (five) { /* the stored qh back from the regrouped bits */
                    uint32_t h = 0;
                    for (int jj = 0; jj < 4; jj++)
                        for (int k = 0; k < 8; k++) h |= (uint32_t)(p[C + 256 + 4 * r + jj] >> k & 1) << (k < 4 ? 4 * k + jj : 16 + 4 * (k - 4) + jj);
                    for (int i = 0; i < 4; i++) c[i] = (uint8_t)(h >> 8 * i);
                }
                const size_t xi = (size_t)b * NT + t;
                acc = x16_block(acc, fmt, h2f(p + 2 * r), t1 ? h2f(p + 32 + 2 * r) : 0.0f, c + 4, &xt[xi], t1 ? ((const float *)c8)[xi] : 0.0f);
            }
            out[(size_t)t * ldo + r] = acc + (bias ? bias[r] : 0.0f);
        }
}

/* a row past the groups (stored blocks) against token x of a tile (its
 * blocks NT apart, xs: type-1's per-block xd x code sum, NT apart), with
 * the groups' arithmetic */
static float x16_tail(const uint8_t *w, const struct q8a *x, const float *xs, int NT, int nb, int fmt) {
    const int t1 = x16_t1(fmt), five = x16_five(fmt), bs = fmt == X16_Q8 ? 34 : qm_q45_bytes(t1, five);
    const int at = fmt == X16_Q8 ? 2 : qm_q45_codes_at(t1, five);
    float acc = 0;
    for (int b = 0; b < nb; b++, w += bs) acc = x16_block(acc, fmt, h2f(w), t1 ? h2f(w + 2) : 0.0f, w + at, &x[(size_t)b * NT], t1 ? xs[(size_t)b * NT] : 0.0f);
    return acc;
}

/* the copy of a K-format linear W [N][K / 256 superblocks of sb bytes]
 * into groups of 16 rows of BB bytes per superblock (qmatmul_internal.h):
 * row(p, w, r, arg) writes row r's stored superblock w into the group's
 * superblock p; the rows past the groups are copied as stored.
 * kiln_walloc'd; NULL when out of memory */
static uint8_t *x16_sb_pack(const uint8_t *W, int N, int K, int sb, int BB, void (*row)(uint8_t *, const uint8_t *, int, int), int arg) {
    const int nsb = K / 256;
    const size_t rb = (size_t)nsb * sb;
    const int64_t ng = N / X16_R;
    uint8_t *P = kiln_walloc((size_t)ng * nsb * BB + (size_t)(N - ng * X16_R) * rb);
    if (!P) return NULL;
    #pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < ng; g++)
        for (int i = 0; i < nsb; i++)
            for (int r = 0; r < X16_R; r++) row(P + ((size_t)g * nsb + i) * BB, W + (size_t)(X16_R * g + r) * rb + (size_t)sb * i, r, arg);
    memcpy(P + (size_t)ng * nsb * BB, W + (size_t)ng * X16_R * rb, (size_t)(N - ng * X16_R) * rb);
    return P;
}

/* Q4_K (q5 = 0) and Q5_K (q5 = 1): the copy into groups of 16 rows
 * (qmatmul_internal.h), the scalar kernel over it and a stored row past the
 * groups, with the same steps */
static void x16k_row(uint8_t *p, const uint8_t *w, int r, int q5) {
    memcpy(p + 2 * r, w, 2), memcpy(p + 32 + 2 * r, w + 2, 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        k4_scale_min(j, w + 4, &sc, &m);
        p[64 + 16 * j + r] = (uint8_t)sc, p[192 + 16 * j + r] = (uint8_t)m;
    }
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 8; k++) memcpy(p + 320 + 512 * c + 64 * k + 4 * r, w + (q5 ? 48 : 16) + 32 * c + 4 * k, 4);
    if (q5)
        for (int k = 0; k < 8; k++) memcpy(p + 2368 + 64 * k + 4 * r, w + 16 + 4 * k, 4);
}

uint8_t *qm_x16k_pack(const uint8_t *W, int N, int K, int q5) { return x16_sb_pack(W, N, K, q5 ? 176 : 144, q5 ? Q5X_BB : QKX_BB, x16k_row, q5); }

static void q4kx_scalar(const uint8_t *G, const struct q8a *xt, const float *xs, int NT, int nt, int nsb, int q5, float *out, size_t ldo,
                        const float *bias) {
    const int BB = q5 ? Q5X_BB : QKX_BB;
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < X16_R; r++) {
            float acc = 0;
            for (int i = 0; i < nsb; i++) {
                const uint8_t *p = G + (size_t)BB * i;
                const float d = h2f(p + 2 * r), dm = h2f(p + 32 + 2 * r);
                for (int j = 0; j < 8; j++) {
                    const size_t b = (size_t)8 * i + j;
                    const struct q8a *x = &xt[b * NT + t];
                    int s = 0;
                    for (int k = 0; k < 8; k++)
                        for (int l = 0; l < 4; l++) {
                            int q = (p[320 + 512 * (j / 2) + 64 * k + 4 * r + l] >> (4 * (j & 1))) & 15;
                            if (q5) q |= ((p[2368 + 64 * k + 4 * r + l] >> j) & 1) << 4;
                            s += q * x->qs[4 * k + l];
                        }
                    acc = fmaf((float)s, d * (float)p[64 + 16 * j + r] * x->d, acc);
                    acc = fmaf(-(dm * (float)p[192 + 16 * j + r]), xs[b * NT + t], acc);
                }
            }
            out[(size_t)t * ldo + r] = acc + (bias ? bias[r] : 0.0f);
        }
}

static float q4kx_tail(const uint8_t *w, const struct q8a *x, const float *xs, int NT, int nsb, int q5) {
    float acc = 0;
    for (int i = 0; i < nsb; i++, w += q5 ? 176 : 144) {
        const float d = h2f(w), dm = h2f(w + 2);
        for (int j = 0; j < 8; j++) {
            const size_t b = (size_t)8 * i + j;
            int sc, m, s = 0;
            k4_scale_min(j, w + 4, &sc, &m);
            for (int l = 0; l < 32; l++) {
                int q = (w[(q5 ? 48 : 16) + 32 * (j / 2) + l] >> (4 * (j & 1))) & 15;
                if (q5) q |= ((w[16 + l] >> j) & 1) << 4;
                s += q * x[b * NT].qs[l];
            }
            acc = fmaf((float)s, d * (float)sc * x[b * NT].d, acc);
            acc = fmaf(-(dm * (float)m), xs[b * NT], acc);
        }
    }
    return acc;
}

/* IQ4_XS: the copy into groups of 16 rows (qmatmul_internal.h), the
 * scalar kernel over it and a stored row past the groups, with the same
 * steps */
static void x16iq_row(uint8_t *p, const uint8_t *blk, int r, int arg) {
    memcpy(p + 2 * r, blk, 2);
    for (int j = 0; j < 8; j++) {
        p[32 + 16 * j + r] = (uint8_t)(int8_t)(quant_iq4xs_scale(blk, j) - 32);
        for (int k = 0; k < 4; k++) memcpy(p + 160 + 256 * j + 64 * k + 4 * r, blk + 8 + 16 * j + 4 * k, 4);
    }
    (void)arg;
}

uint8_t *qm_x16iq_pack(const uint8_t *W, int N, int K) { return x16_sb_pack(W, N, K, 136, IQX_BB, x16iq_row, 0); }

static void iqx_scalar(const uint8_t *G, const struct q8a *xt, int NT, int nt, int nsb, float *out, size_t ldo, const float *bias) {
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < X16_R; r++) {
            float acc = 0;
            for (int i = 0; i < nsb; i++) {
                const uint8_t *p = G + (size_t)IQX_BB * i;
                for (int j = 0; j < 8; j++) {
                    const struct q8a *x = &xt[((size_t)8 * i + j) * NT + t];
                    uint8_t c[16];
                    for (int k = 0; k < 4; k++) memcpy(c + 4 * k, p + 160 + 256 * j + 64 * k + 4 * r, 4);
                    acc = fmaf((float)((int8_t)p[32 + 16 * j + r] * qm_isum_iq4(c, x->qs)), h2f(p + 2 * r) * x->d, acc);
                }
            }
            out[(size_t)t * ldo + r] = acc + (bias ? bias[r] : 0.0f);
        }
}

static float iqx_tail(const uint8_t *w, const struct q8a *x, int NT, int nsb) {
    float acc = 0;
    for (int i = 0; i < nsb; i++, w += 136)
        for (int j = 0; j < 8; j++) {
            const struct q8a *xb = &x[((size_t)8 * i + j) * NT];
            acc = fmaf((float)((quant_iq4xs_scale(w, j) - 32) * qm_isum_iq4(w + 8 + 16 * j, xb->qs)), h2f(w) * xb->d, acc);
        }
    return acc;
}

/* Q6_K: the copy into groups of 16 rows (qmatmul_internal.h), the scalar
 * kernel over it and a stored row past the groups, with the same steps */
static void x16q6_row(uint8_t *p, const uint8_t *w, int r, int arg) {
    if (r == 0) memset(p + 32, 0, 32);
    memcpy(p + 2 * r, w + 208, 2);
    for (int k = 0; k < 16; k++) p[64 + 16 * k + r] = w[192 + k];
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 8; k++) memcpy(p + 320 + 512 * c + 64 * k + 4 * r, w + 32 * c + 4 * k, 4);
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 8; k++) memcpy(p + 2368 + 512 * h + 64 * k + 4 * r, w + 128 + 32 * h + 4 * k, 4);
    (void)arg;
}

uint8_t *qm_x16q6_pack(const uint8_t *W, int N, int K) { return x16_sb_pack(W, N, K, 210, Q6X_BB, x16q6_row, 0); }

static void x16q3_row(uint8_t *p, const uint8_t *w, int r, int arg) {
    if (r == 0) memset(p + 32, 0, 32);
    memcpy(p + 2 * r, w + 108, 2);
    for (int k = 0; k < 16; k++) p[64 + 16 * k + r] = (uint8_t)(int8_t)(quant_q3k_scale(w + 96, k) - 32);
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < 8; k++) memcpy(p + 320 + 512 * c + 64 * k + 4 * r, w + 32 + 32 * c + 4 * k, 4);
    for (int k = 0; k < 8; k++) memcpy(p + 1344 + 64 * k + 4 * r, w + 4 * k, 4);
    (void)arg;
}

uint8_t *qm_x16q3_pack(const uint8_t *W, int N, int K) { return x16_sb_pack(W, N, K, 110, Q3X_BB, x16q3_row, 0); }

static void x16q2_row(uint8_t *p, const uint8_t *w, int r, int arg) {
    memcpy(p + 2 * r, w + 80, 2), memcpy(p + 32 + 2 * r, w + 82, 2);
    for (int k = 0; k < 16; k++) p[64 + 16 * k + r] = w[k];
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < 8; k++) memcpy(p + 320 + 512 * c + 64 * k + 4 * r, w + 16 + 32 * c + 4 * k, 4);
    (void)arg;
}

uint8_t *qm_x16q2_pack(const uint8_t *W, int N, int K) { return x16_sb_pack(W, N, K, 84, Q2X_BB, x16q2_row, 0); }

/* sub-block j's integer of one row from its 32 codes q (0..63), the
 * activation block x, its halves' offsets h (-32 x code sum) and the two
 * scales */
static int q6x_isum(const uint8_t *q, const struct q8a *x, const int32_t *h, int sc0, int sc1) {
    int s0 = h[0], s1 = h[1];
    for (int l = 0; l < 16; l++) s0 += q[l] * x->qs[l], s1 += q[16 + l] * x->qs[16 + l];
    return sc0 * s0 + sc1 * s1;
}

/* (kv 1: Q3_K's groups, codes 0..7; kv 2: Q2_K's, codes 0..3 and the mins) */
static void q6x_scalar(const uint8_t *G, const struct q8a *xt, const int32_t *h6, int NT, int nt, int nsb, int kv, float *out, size_t ldo,
                       const float *bias) {
    const int q3 = kv == 1;
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < X16_R; r++) {
            float acc = 0;
            for (int i = 0; i < nsb; i++) {
                const uint8_t *p = G + (size_t)(kv == 2 ? Q2X_BB : q3 ? Q3X_BB : Q6X_BB) * i;
                const float d = h2f(p + 2 * r);
                for (int j = 0; j < 8; j++) {
                    const size_t b = (size_t)8 * i + j;
                    const int h = j / 4, s = j % 4;
                    uint8_t q[32];
                    for (int k = 0; k < 8; k++)
                        for (int l = 0; l < 4; l++) {
                            if (kv) {
                                q[4 * k + l] = (uint8_t)((p[320 + 512 * h + 64 * k + 4 * r + l] >> (2 * s)) & 3);
                                if (q3) q[4 * k + l] |= (uint8_t)(((p[1344 + 64 * k + 4 * r + l] >> j) & 1) << 2);
                                continue;
                            }
                            const int lo = (p[320 + 512 * (2 * h + (s & 1)) + 64 * k + 4 * r + l] >> (4 * (s >> 1))) & 15;
                            q[4 * k + l] = (uint8_t)(lo | ((p[2368 + 512 * h + 64 * k + 4 * r + l] >> (2 * s)) & 3) << 4);
                        }
                    const int32_t *o = h6 + 2 * (b * NT + t), zero[2] = {0, 0};
                    if (kv == 2) { /* scale and min nibbles; the sums start at 0, the mins take the halves' code sums o */
                        const int v0 = p[64 + 32 * j + r], v1 = p[80 + 32 * j + r];
                        const int I = q6x_isum(q, &xt[b * NT + t], zero, v0 & 15, v1 & 15);
                        acc = fmaf((float)I, d * xt[b * NT + t].d, acc);
                        acc = fmaf(-(float)((v0 >> 4) * o[0] + (v1 >> 4) * o[1]), h2f(p + 32 + 2 * r) * xt[b * NT + t].d, acc);
                        continue;
                    }
                    const int I = q6x_isum(q, &xt[b * NT + t], o, (int8_t)p[64 + 32 * j + r], (int8_t)p[80 + 32 * j + r]);
                    acc = fmaf((float)I, d * xt[b * NT + t].d, acc);
                }
            }
            out[(size_t)t * ldo + r] = acc + (bias ? bias[r] : 0.0f);
        }
}

static float q6x_tail(const uint8_t *w, const struct q8a *x, const int32_t *h6, int NT, int nsb, int kv) {
    const int q3 = kv == 1;
    float acc = 0;
    for (int i = 0; i < nsb; i++, w += kv == 2 ? 84 : q3 ? 110 : 210) {
        const float d = h2f(w + (kv == 2 ? 80 : q3 ? 108 : 208));
        for (int j = 0; j < 8; j++) {
            const size_t b = (size_t)8 * i + j;
            const int h = j / 4, s = j % 4;
            uint8_t q[32];
            if (kv == 2) { /* as q6x_scalar's Q2_K steps */
                const int32_t zero[2] = {0, 0}, *o = h6 + 2 * b * NT;
                for (int l = 0; l < 32; l++) q[l] = (uint8_t)quant_k23_code(w + 16, 32 * j + l);
                const int I = q6x_isum(q, &x[b * NT], zero, w[2 * j] & 15, w[2 * j + 1] & 15);
                acc = fmaf((float)I, d * x[b * NT].d, acc);
                acc = fmaf(-(float)((w[2 * j] >> 4) * o[0] + (w[2 * j + 1] >> 4) * o[1]), h2f(w + 82) * x[b * NT].d, acc);
                continue;
            }
            for (int l = 0; l < 32; l++)
                q[l] = q3 ? (uint8_t)(quant_k23_code(w + 32, 32 * j + l) | quant_q3k_hbit(w, 32 * j + l) << 2)
                          : (uint8_t)(((w[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 15) | ((w[128 + 32 * h + l] >> (2 * s)) & 3) << 4);
            const int sc0 = q3 ? quant_q3k_scale(w + 96, 2 * j) - 32 : (int8_t)w[192 + 2 * j];
            const int sc1 = q3 ? quant_q3k_scale(w + 96, 2 * j + 1) - 32 : (int8_t)w[192 + 2 * j + 1];
            const int I = q6x_isum(q, &x[b * NT], h6 + 2 * b * NT, sc0, sc1);
            acc = fmaf((float)I, d * x[b * NT].d, acc);
        }
    }
    return acc;
}
#endif

static float dot_q4_1_scalar(const uint8_t *w, const struct q8a *a, int nb) {
    float acc = 0;
    for (int i = 0; i < nb; i++, w += 20) {
        int s = 0;
        for (int j = 0; j < 16; j++) s += (w[4 + j] & 15) * a[i].qs[j] + (w[4 + j] >> 4) * a[i].qs[j + 16];
        acc += a[i].d * (h2f(w) * (float)s + h2f(w + 2) * (float)a[i].sum);
    }
    return acc;
}

/* Q5_0 (d, qh, 16 bytes of nibbles; w = d (q - 16)) and Q5_1 (d, m, qh,
 * nibbles; w = d q + m): as Q4_0 and Q4_1 with 5-bit codes */
static float dot_q5_0_scalar(const uint8_t *w, const struct q8a *a, int nb) {
    float acc = 0;
    for (int i = 0; i < nb; i++, w += 22) acc += h2f(w) * a[i].d * (float)(qm_isum_q5(w + 2, w + 6, a[i].qs) - 16 * a[i].sum);
    return acc;
}

static float dot_q5_1_scalar(const uint8_t *w, const struct q8a *a, int nb) {
    float acc = 0;
    for (int i = 0; i < nb; i++, w += 24) acc += a[i].d * (h2f(w) * (float)qm_isum_q5(w + 4, w + 8, a[i].qs) + h2f(w + 2) * (float)a[i].sum);
    return acc;
}

/* IQ4_NL (d, 16 bytes of indices into quant_iq4_kv: w = d kv[q]) and
 * IQ4_XS (superblocks of 256: d, 8 sub-block scales ls - 32, the same
 * indices): the integer dot of the looked-up values, scaled per block */
static float dot_iq4nl_scalar(const uint8_t *w, const struct q8a *a, int nb) {
    float acc = 0;
    for (int i = 0; i < nb; i++, w += 18) acc += h2f(w) * a[i].d * (float)qm_isum_iq4(w + 2, a[i].qs);
    return acc;
}

static float dot_iq4xs_scalar(const uint8_t *w, const struct q8a *a, int nsb) {
    float acc = 0;
    for (int i = 0; i < nsb; i++, w += 136, a += 8) {
        const float d = h2f(w);
        for (int j = 0; j < 8; j++) acc += d * (float)(quant_iq4xs_scale(w, j) - 32) * a[j].d * (float)qm_isum_iq4(w + 8 + 16 * j, a[j].qs);
    }
    return acc;
}

/* Q2_K (w = d sc q - dmin m, 2-bit q, sc / m per 16 weights) and Q3_K (w
 * = d (sc - 32) (u - 4), u the 3-bit code): per activation block (32
 * weights, two sub-blocks) the integer sums sc x sum q x and m x sum x
 * (Q3_K: (sc - 32) x (sum u x - 4 sum x)), then scaled */
static float dot_q2_k_scalar(const uint8_t *w, const struct q8a *a, int nsb) {
    float acc = 0;
    for (int i = 0; i < nsb; i++, w += 84, a += 8) {
        const float d = h2f(w + 80), dmin = h2f(w + 82);
        for (int b = 0; b < 8; b++) {
            int is = 0, im = 0;
            for (int h = 0; h < 2; h++) {
                int sq = 0, sx = 0;
                for (int l = 16 * h; l < 16 * h + 16; l++) sq += quant_k23_code(w + 16, 32 * b + l) * a[b].qs[l], sx += a[b].qs[l];
                is += (w[2 * b + h] & 15) * sq, im += (w[2 * b + h] >> 4) * sx;
            }
            acc += a[b].d * (d * (float)is - dmin * (float)im);
        }
    }
    return acc;
}

static float dot_q3_k_scalar(const uint8_t *w, const struct q8a *a, int nsb) {
    float acc = 0;
    for (int i = 0; i < nsb; i++, w += 110, a += 8) {
        const float d = h2f(w + 108);
        for (int b = 0; b < 8; b++) {
            int is = 0;
            for (int h = 0; h < 2; h++) {
                int sq = 0;
                for (int l = 16 * h; l < 16 * h + 16; l++) {
                    const int e = 32 * b + l;
                    sq += ((quant_k23_code(w + 32, e) | quant_q3k_hbit(w, e) << 2) - 4) * a[b].qs[l];
                }
                is += (quant_q3k_scale(w + 96, 2 * b + h) - 32) * sq;
            }
            acc += d * a[b].d * (float)is;
        }
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

/* The K formats: each 32-weight sub-block's (Q6_K: each half's) integer
 * dot in vector lanes, reduced by addv; the f32 part exactly as
 * dot_q4_k_scalar / dot_q5_k_scalar / dot_q6_k_scalar write it, in their
 * order, so the results are theirs bit for bit. Codes go in as s8 (Q4_K
 * 0..15, Q5_K 0..31, Q6_K -32..31). */
#define QK45_NEON(NAME, ATTR, IDOT, Q5)                                                                       \
    ATTR static float NAME(const uint8_t *w, const struct q8a *a, int nsb) {                                  \
        const uint8x16_t m4 = vdupq_n_u8(15), b4 = vdupq_n_u8(16);                                            \
        float acc = 0;                                                                                        \
        for (int i = 0; i < nsb; i++, w += (Q5) ? 176 : 144, a += 8) {                                        \
            const float d = h2f(w), dmin = h2f(w + 2);                                                        \
            const uint8_t *qs = w + ((Q5) ? 48 : 16);                                                         \
            const uint8x16_t qh0 = vld1q_u8(w + 16), qh1 = vld1q_u8(w + 32); /* Q5_K's fifth bits */         \
            for (int c = 0; c < 4; c++) {                                                                     \
                const uint8x16_t b0 = vld1q_u8(qs + 32 * c), b1 = vld1q_u8(qs + 32 * c + 16);                 \
                for (int h = 0; h < 2; h++) {                                                                 \
                    const int j = 2 * c + h;                                                                  \
                    uint8x16_t c0 = h ? vshrq_n_u8(b0, 4) : vandq_u8(b0, m4);                                 \
                    uint8x16_t c1 = h ? vshrq_n_u8(b1, 4) : vandq_u8(b1, m4);                                 \
                    if (Q5) {                                                                                 \
                        const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << j));                                \
                        c0 = vorrq_u8(c0, vandq_u8(vtstq_u8(qh0, bit), b4));                                  \
                        c1 = vorrq_u8(c1, vandq_u8(vtstq_u8(qh1, bit), b4));                                  \
                    }                                                                                         \
                    const int32x4_t sv = IDOT(IDOT(vdupq_n_s32(0), vreinterpretq_s8_u8(c0), vld1q_s8(a[j].qs)), \
                                              vreinterpretq_s8_u8(c1), vld1q_s8(a[j].qs + 16));               \
                    int sc, m;                                                                                \
                    k4_scale_min(j, w + 4, &sc, &m);                                                          \
                    acc += a[j].d * (d * sc * (float)vaddvq_s32(sv) - dmin * m * (float)a[j].sum);            \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
        return acc;                                                                                           \
    }

#define QK6_NEON(NAME, ATTR, IDOT)                                                                            \
    ATTR static float NAME(const uint8_t *w, const struct q8a *a, int nsb) {                                  \
        const uint8x16_t m4 = vdupq_n_u8(15), m3 = vdupq_n_u8(3);                                             \
        const int8x16_t o32 = vdupq_n_s8(32);                                                                 \
        float acc = 0;                                                                                        \
        for (int i = 0; i < nsb; i++, w += 210, a += 8) {                                                     \
            const uint8_t *ql = w, *qh = w + 128;                                                             \
            const int8_t *sc = (const int8_t *)(w + 192);                                                     \
            const float d = h2f(w + 208);                                                                     \
            for (int h = 0; h < 2; h++) {                                                                     \
                const uint8x16_t h0 = vld1q_u8(qh + 32 * h), h1 = vld1q_u8(qh + 32 * h + 16);                 \
                for (int s4 = 0; s4 < 4; s4++) {                                                              \
                    const struct q8a *x = &a[4 * h + s4];                                                     \
                    const uint8_t *src = ql + 64 * h + 32 * (s4 & 1);                                         \
                    const uint8x16_t l0 = vld1q_u8(src), l1 = vld1q_u8(src + 16);                             \
                    const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * s4));                                       \
                    const uint8x16_t c0 = vorrq_u8(s4 < 2 ? vandq_u8(l0, m4) : vshrq_n_u8(l0, 4),             \
                                                   vshlq_n_u8(vandq_u8(vshlq_u8(h0, sh), m3), 4));            \
                    const uint8x16_t c1 = vorrq_u8(s4 < 2 ? vandq_u8(l1, m4) : vshrq_n_u8(l1, 4),             \
                                                   vshlq_n_u8(vandq_u8(vshlq_u8(h1, sh), m3), 4));            \
                    const int s0 = vaddvq_s32(IDOT(vdupq_n_s32(0), vsubq_s8(vreinterpretq_s8_u8(c0), o32), vld1q_s8(x->qs))); \
                    const int s1 = vaddvq_s32(IDOT(vdupq_n_s32(0), vsubq_s8(vreinterpretq_s8_u8(c1), o32), vld1q_s8(x->qs + 16))); \
                    acc += d * x->d * (float)(sc[8 * h + 2 * s4] * s0 + sc[8 * h + 2 * s4 + 1] * s1);         \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
        return acc;                                                                                           \
    }

QK45_NEON(dot_q4_k_neon, , i8dot_neon, 0)
QK45_NEON(dot_q5_k_neon, , i8dot_neon, 1)
QK6_NEON(dot_q6_k_neon, , i8dot_neon)
QK45_NEON(dot_q4_k_dotprod, DP_ATTR, i8dot_dp, 0)
QK45_NEON(dot_q5_k_dotprod, DP_ATTR, i8dot_dp, 1)
QK6_NEON(dot_q6_k_dotprod, DP_ATTR, i8dot_dp)

/* Q4_1 / Q5_0 / Q5_1 (T1: type 1, w = d q + m; FIVE: 5-bit codes, bit 4
 * from the block's qh by vtst of its byte i / 8 against bit i % 8): the
 * block's integer dot in vector lanes, the f32 part as the scalar dots
 * write it, so bit-identical to them */
#define Q45_NEON(NAME, ATTR, IDOT, T1, FIVE)                                                                       \
    ATTR static float NAME(const uint8_t *w, const struct q8a *a, int nb) {                                       \
        const uint8x16_t m4 = vdupq_n_u8(15), b16 = vdupq_n_u8(16);                                                \
        const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));                           \
        float acc = 0;                                                                                             \
        for (int i = 0; i < nb; i++, w += qm_q45_bytes(T1, FIVE)) {                                                \
            const uint8_t *qs = w + qm_q45_codes_at(T1, FIVE), *qh = qs - 4;                                       \
            const uint8x16_t c = vld1q_u8(qs);                                                                     \
            uint8x16_t lo = vandq_u8(c, m4), hi = vshrq_n_u8(c, 4);                                                \
            if (FIVE) {                                                                                            \
                lo = vorrq_u8(lo, vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1])), bit), b16));  \
                hi = vorrq_u8(hi, vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3])), bit), b16));  \
            }                                                                                                      \
            const int32x4_t sv = IDOT(IDOT(vdupq_n_s32(0), vreinterpretq_s8_u8(lo), vld1q_s8(a[i].qs)),            \
                                      vreinterpretq_s8_u8(hi), vld1q_s8(a[i].qs + 16));                            \
            if (T1) acc += a[i].d * (h2f(w) * (float)vaddvq_s32(sv) + h2f(w + 2) * (float)a[i].sum);              \
            else acc += h2f(w) * a[i].d * (float)(vaddvq_s32(sv) - 16 * a[i].sum);                                 \
        }                                                                                                          \
        return acc;                                                                                                \
    }

Q45_NEON(dot_q4_1_neon, , i8dot_neon, 1, 0)
Q45_NEON(dot_q4_1_dotprod, DP_ATTR, i8dot_dp, 1, 0)
Q45_NEON(dot_q5_0_neon, , i8dot_neon, 0, 1)
Q45_NEON(dot_q5_0_dotprod, DP_ATTR, i8dot_dp, 0, 1)
Q45_NEON(dot_q5_1_neon, , i8dot_neon, 1, 1)
Q45_NEON(dot_q5_1_dotprod, DP_ATTR, i8dot_dp, 1, 1)
/* IQ4_NL / IQ4_XS: the 32 indices of a block (Q4_0's nibble order) looked
 * up in the 16-value table by tbl, the integer dot in lanes; the f32 part
 * as dot_iq4nl_scalar / dot_iq4xs_scalar write it, so their bits */
#define IQ4_NEON(NAME, ATTR, IDOT, XS)                                                                          \
    ATTR static float NAME(const uint8_t *w, const struct q8a *a, int nb) {                                    \
        const int8x16_t kv = vld1q_s8(quant_iq4_kv);                                                            \
        const uint8x16_t m4 = vdupq_n_u8(15);                                                                   \
        float acc = 0;                                                                                          \
        for (int i = 0; i < nb; i++) {                                                                          \
            const int nj = (XS) ? 8 : 1;                                                                        \
            const uint8_t *bw = (XS) ? w + (size_t)136 * i : w + (size_t)18 * i;                                \
            const float d = h2f(bw);                                                                            \
            for (int j = 0; j < nj; j++) {                                                                      \
                const struct q8a *x = a + (size_t)nj * i + j;                                                   \
                const uint8x16_t c = vld1q_u8((XS) ? bw + 8 + 16 * j : bw + 2);                                 \
                const int32x4_t sv = IDOT(IDOT(vdupq_n_s32(0), vqtbl1q_s8(kv, vandq_u8(c, m4)), vld1q_s8(x->qs)), \
                                          vqtbl1q_s8(kv, vshrq_n_u8(c, 4)), vld1q_s8(x->qs + 16));               \
                if (XS) acc += d * (float)(quant_iq4xs_scale(bw, j) - 32) * x->d * (float)vaddvq_s32(sv);      \
                else acc += d * x->d * (float)vaddvq_s32(sv);                                                   \
            }                                                                                                   \
        }                                                                                                       \
        return acc;                                                                                             \
    }

/* Q2_K / Q3_K: activation block b's 32 codes are bytes 32 (b / 4) .. + 31
 * of the superblock's code bytes shifted down by 2 (b % 4) (Q3_K: | bit b
 * of hmask byte l << 2, less 4); each 16-weight half's integer dot (Q2_K:
 * and its activation sum) in lanes, then the f32 part as the scalar dots
 * write it, so their bits */
#define K23_NEON(NAME, ATTR, IDOT, Q3)                                                                          \
    ATTR static float NAME(const uint8_t *w, const struct q8a *a, int nsb) {                                   \
        const uint8x16_t m3 = vdupq_n_u8(3), one = vdupq_n_u8(1);                                               \
        const int8x16_t ones = vdupq_n_s8(1), four = vdupq_n_s8(4);                                             \
        float acc = 0;                                                                                          \
        for (int i = 0; i < nsb; i++, w += (Q3) ? 110 : 84, a += 8) {                                           \
            const uint8_t *qs = w + ((Q3) ? 32 : 16);                                                           \
            const float d = h2f(w + ((Q3) ? 108 : 80)), dmin = (Q3) ? 0.0f : h2f(w + 82);                        \
            const uint8x16_t hm0 = vld1q_u8(w), hm1 = vld1q_u8(w + 16); /* Q3_K's hmask */                     \
            for (int b = 0; b < 8; b++) {                                                                       \
                const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * (b % 4))), hs = vdupq_n_s8((int8_t)-b);           \
                int8x16_t c[2];                                                                                 \
                for (int h = 0; h < 2; h++) {                                                                   \
                    uint8x16_t v = vandq_u8(vshlq_u8(vld1q_u8(qs + 32 * (b / 4) + 16 * h), sh), m3);            \
                    if (Q3) v = vorrq_u8(v, vshlq_n_u8(vandq_u8(vshlq_u8(h ? hm1 : hm0, hs), one), 2));         \
                    c[h] = (Q3) ? vsubq_s8(vreinterpretq_s8_u8(v), four) : vreinterpretq_s8_u8(v);              \
                }                                                                                               \
                const int8x16_t x0 = vld1q_s8(a[b].qs), x1 = vld1q_s8(a[b].qs + 16);                            \
                const int sq0 = vaddvq_s32(IDOT(vdupq_n_s32(0), c[0], x0)), sq1 = vaddvq_s32(IDOT(vdupq_n_s32(0), c[1], x1)); \
                if (Q3) {                                                                                       \
                    const int is = (quant_q3k_scale(w + 96, 2 * b) - 32) * sq0 + (quant_q3k_scale(w + 96, 2 * b + 1) - 32) * sq1; \
                    acc += d * a[b].d * (float)is;                                                              \
                } else {                                                                                        \
                    const int sx0 = vaddvq_s32(IDOT(vdupq_n_s32(0), ones, x0)), sx1 = vaddvq_s32(IDOT(vdupq_n_s32(0), ones, x1)); \
                    const int is = (w[2 * b] & 15) * sq0 + (w[2 * b + 1] & 15) * sq1, im = (w[2 * b] >> 4) * sx0 + (w[2 * b + 1] >> 4) * sx1; \
                    acc += a[b].d * (d * (float)is - dmin * (float)im);                                         \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        return acc;                                                                                             \
    }

IQ4_NEON(dot_iq4nl_neon, , i8dot_neon, 0)
IQ4_NEON(dot_iq4nl_dotprod, DP_ATTR, i8dot_dp, 0)
IQ4_NEON(dot_iq4xs_neon, , i8dot_neon, 1)
IQ4_NEON(dot_iq4xs_dotprod, DP_ATTR, i8dot_dp, 1)
K23_NEON(dot_q2_k_neon, , i8dot_neon, 0)
K23_NEON(dot_q2_k_dotprod, DP_ATTR, i8dot_dp, 0)
K23_NEON(dot_q3_k_neon, , i8dot_neon, 1)
K23_NEON(dot_q3_k_dotprod, DP_ATTR, i8dot_dp, 1)
QDOT_NEON(dot_q8_0_neon, , i8dot_neon, 34, Q8_CODES)
QDOT_NEON(dot_q4_0_neon, , i8dot_neon, 18, Q4_CODES)
QDOT_NEON(dot_q8_0_dotprod, DP_ATTR, i8dot_dp, 34, Q8_CODES)
QDOT_NEON(dot_q4_0_dotprod, DP_ATTR, i8dot_dp, 18, Q4_CODES)
#endif /* KILN_NEON */

/* ==== the driver ==== */

typedef float (*qdot_fn)(const uint8_t *w, const struct q8a *a, int nb);
typedef void (*qdotx_fn)(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out);
#if defined(KILN_X86)
typedef float (*qdot1v_fn)(const uint8_t *w, const __m256i *corr, const float *xd, const struct q8a *a, int nb);
#endif

/* the most rows the multi-row decode kernels (decm) take in one call */
#define DECM_MAX 32

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
    __m512i *act2, *corr2; /* Q4_0 decode, AVX-512: block pairs (qm_dot1z_q4_0) */
    __m512i *act4, *corr4; /* ... with VBMI: groups of 4 blocks (qm_rowsq_q4_0) */
    int dec2;      /* decode without VNNI (dot1a_*): xd, cs and for Q4_0 act2 */
    float *cs;     /* per block: -8 x the activation sum (Q4_0) */
    int deck;      /* Q4_K: 1, Q5_K: 2 (qm_rowsk_qk, qm_dotk_qk), Q6_K: 3 (qm_rowsk_q6k, qm_dotk_q6k): xd and xs, [token][block] */
    float *xs;     /* per block: the activation scale x the code sum */
    int32_t *hs;   /* Q6_K GEMM on VNNI: per block of xa, 32 x its two halves' code sums */
    int decm;      /* decode of 2-7 rows, Q4_0: 1 (qm_rowm_q4_0), Q8_0: 2 (qm_rowm_q8_0): per row its act2 / xd / cs below */
    const __m256i *x2m[DECM_MAX];
    const float *xdm[DECM_MAX], *csm[DECM_MAX];
    const uint8_t *x16; /* Q4_0 / Q8_0 in groups of 16 rows (i_x16), or NULL */
    const uint8_t *kx16; /* the AVX2 GEMM's Q4_K / Q5_K groups, whose panels qm_pack_i8_x16k cuts, or NULL */
    int64_t ng;         /* ... its groups */
    int32_t *c8;        /* ... -8 (Q8_0: -128) x each activation block's code sum, in xa's order */
#endif
    /* GEMM */
    int R, NT, mode, ntile;
    void **scr; /* per-thread panels (cpu_scratch_threads) */
#if defined(KILN_NEON)
    struct qn_gemm qn; /* the NEON GEMM (qmatmul_int8_neon.c) */
#endif
};

struct q8a *qm_quant_token(const float *x, struct q8a *xa, int64_t t, int n, int K, int NT, int isa) {
    const int nb = K / 32, stride = NT ? NT : 1;
    struct q8a *d = NT ? xa + (size_t)(t / NT) * nb * NT + t % NT : xa + (size_t)t * nb;
    if (t >= n) {
        for (int b = 0; b < nb; b++) memset(&d[(size_t)b * stride], 0, sizeof *d);
#if defined(KILN_X86)
    } else if (isa >= CPU_ISA_AVX2) {
        qm_quantize_act_avx2(x + (size_t)t * K, d, K, stride);
#elif defined(KILN_NEON)
    } else if (isa >= CPU_ISA_NEON) {
        qm_quantize_act_neon(x + (size_t)t * K, d, K, stride);
#endif
    } else {
        for (int b = 0; b < nb; b++) qm_quantize_act(x + (size_t)t * K + 32 * b, &d[(size_t)b * stride], 32);
    }
    (void)isa;
    return d;
}

static void i_quant(void *arg, int64_t t0, int64_t t1, int tid) {
    const struct ijob *j = arg;
    for (int64_t t = t0; t < t1; t++) qm_quant_token(j->x, j->xa, t, j->n, j->K, j->NT, j->isa);
    (void)tid;
}

static void i_rows(void *arg, int64_t r0, int64_t r1, int tid) {
    const struct ijob *j = arg;
    const uint8_t *W = j->w->w.data;
#if defined(KILN_X86)
    if (j->decm) {
        CPU_FOR_ROWS2(r, r0, r1) {
            const float b = j->bias ? j->bias[r] : 0.0f;
            for (int t = 0; t < j->n; t += NX) {
                const int nx = j->n - t < NX ? j->n - t : NX;
                const struct q8a *as[NX];
                float o[NX];
                for (int i = 0; i < nx; i++) as[i] = j->xa + (size_t)(t + i) * j->nb;
                if (j->decm == 2) qm_rowm_q8_0(W + (size_t)r * j->rb, j->xdm + t, as, j->nblk, nx, o);
                else qm_rowm_q4_0(W + (size_t)r * j->rb, j->x2m + t, j->xdm + t, j->csm + t, as, j->nblk, nx, o);
                for (int i = 0; i < nx; i++) j->out[(size_t)(t + i) * j->N + r] = o[i] + b;
            }
        }
        return;
    }
    if (j->n == 1 && j->deck) {
        if (j->deck == 3) qm_rowsk_q6k(W + (size_t)r0 * j->rb, j->rb, r1 - r0, j->xd, j->xa, j->nblk, j->out + r0);
        else qm_rowsk_qk(W + (size_t)r0 * j->rb, j->rb, r1 - r0, j->xd, j->xs, j->xa, j->nblk, j->deck == 2, j->out + r0);
        if (j->bias)
            for (int64_t r = r0; r < r1; r++) j->out[r] += j->bias[r];
        return;
    }
    if (j->n == 1 && j->dec2) {
        const size_t rb = j->rb;
        if (j->w->w.dtype == KILN_DTYPE_Q4_0) qm_rowsa_q4_0(W + (size_t)r0 * rb, rb, r1 - r0, j->act2, j->xd, j->cs, j->xa, j->nblk, j->out + r0);
        else qm_rowsa_q8_0(W + (size_t)r0 * rb, rb, r1 - r0, j->xd, j->xa, j->nblk, j->out + r0);
        if (j->bias)
            for (int64_t r = r0; r < r1; r++) j->out[r] += j->bias[r];
        return;
    }
    if (j->n == 1 && j->dot1v) {
        const size_t rb = j->rb;
        const int nblk = j->nblk;
        const float *bias = j->bias;
        float *out = j->out;
        if (j->act4 || (j->act2 && j->w->w.dtype == KILN_DTYPE_Q8_0)) {
            if (j->act4) qm_rowsq_q4_0(W + (size_t)r0 * rb, rb, r1 - r0, j->corr4, j->act4, j->xd, j->xa, nblk, out + r0);
            else qm_rowsw_q8_0(W + (size_t)r0 * rb, rb, r1 - r0, j->corr2, j->act2, j->xd, j->xa, nblk, out + r0);
            if (bias)
                for (int64_t r = r0; r < r1; r++) out[r] += bias[r];
            return;
        }
        if (j->act2) {
            CPU_FOR_ROWS2(r, r0, r1) out[r] = qm_dot1z_q4_0(W + (size_t)r * rb, j->corr2, j->act2, j->xd, j->xa, nblk) + (bias ? bias[r] : 0.0f);
            return;
        }
        CPU_FOR_ROWS2(r, r0, r1) out[r] = j->dot1v(W + (size_t)r * rb, j->corr, j->xd, j->xa, nblk) + (bias ? bias[r] : 0.0f);
        return;
    }
#endif
    CPU_FOR_ROWS2(r, r0, r1) {
        float b = j->bias ? j->bias[r] : 0.0f;
        const uint8_t *row = W + (size_t)r * j->rb;
        for (int t = 0; t < j->n; t += NX) {
            int nx = j->n - t < NX ? j->n - t : NX;
            const struct q8a *as[NX];
            float o[NX];
            for (int i = 0; i < nx; i++) as[i] = j->xa + (size_t)(t + i) * j->nb;
            if (nx == 1 && j->dot1) o[0] = j->dot1(row, as[0], j->nblk);
#if defined(KILN_X86)
            else if (j->deck) {
                const float *xd[NX], *xs[NX];
                for (int i = 0; i < nx; i++) xd[i] = j->xd + (size_t)(t + i) * j->nb, xs[i] = j->xs + (size_t)(t + i) * j->nb;
                if (j->deck == 3) qm_dotk_q6k(row, as, xd, nx, j->nblk, o);
                else qm_dotk_qk(row, as, xd, xs, nx, j->nblk, j->deck == 2, o);
            }
#endif
            else if (j->isa >= CPU_ISA_AVX2) j->dotx(row, as, nx, j->nblk, o);
            else
                for (int i = 0; i < nx; i++) o[i] = j->dot(row, as[i], j->nblk);
            for (int i = 0; i < nx; i++) j->out[(size_t)(t + i) * j->N + r] = o[i] + b;
        }
    }
    (void)tid;
}

#if defined(KILN_X86)
/* Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K in groups of 16 rows:
 * items are the groups, then one for the rows past them; each group meets
 * every tile of tokens in turn (nt <= NT). A tile's per-block vectors: c8
 * (Q4_0, Q8_0, Q5_0), xs (Q4_1, Q5_1, Q4_K, Q5_K) or h6 (Q6_K, two per
 * block), all in j->c8's space. */

/* the X16_* format of a type-0 / type-1 dtype or Q8_0 */
static int x16_fmt(enum kiln_dtype t) {
    return t == KILN_DTYPE_Q8_0 ? X16_Q8 : t == KILN_DTYPE_Q4_1 ? X16_Q41 : t == KILN_DTYPE_Q5_0 ? X16_Q50 : t == KILN_DTYPE_Q5_1 ? X16_Q51
           : t == KILN_DTYPE_IQ4_NL ? X16_IQ4 : X16_Q4;
}

static void x16_group(const struct ijob *j, const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *c8, int nt, float *o,
                      const float *bias) {
    const enum kiln_dtype dt = j->w->w.dtype;
    const int fmt = x16_fmt(dt), vnni = j->isa >= CPU_ISA_AVX512 && j->R == 16, nsb = j->nb / 8;
    const float *xs = (const float *)c8;
    if (dt == KILN_DTYPE_Q4_K || dt == KILN_DTYPE_Q5_K) {
        const int q5 = dt == KILN_DTYPE_Q5_K;
        if (vnni) qm_x16k_vnni(G, P, xt, xs, j->NT, nt, nsb, q5, o, j->N, bias);
        else if (j->isa >= CPU_ISA_AVX2)
            for (int t = 0; t < nt; t += 2)
                qm_x16k_avx2(G, P, xt + t, xs + t, j->NT, nt - t < 2 ? nt - t : 2, nsb, q5, o + (size_t)t * j->N, j->N, bias);
        else q4kx_scalar(G, xt, xs, j->NT, nt, nsb, q5, o, j->N, bias);
    } else if (dt == KILN_DTYPE_IQ4_XS) {
        if (vnni) qm_x16iq_vnni(G, P, xt, c8, j->NT, nt, nsb, o, j->N, bias);
        else if (j->isa >= CPU_ISA_AVX2)
            for (int t = 0; t < nt; t += 2) qm_x16iq_avx2(G, P, xt + t, j->NT, nt - t < 2 ? nt - t : 2, nsb, o + (size_t)t * j->N, j->N, bias);
        else iqx_scalar(G, xt, j->NT, nt, nsb, o, j->N, bias);
    } else if (dt == KILN_DTYPE_Q6_K || dt == KILN_DTYPE_Q3_K || dt == KILN_DTYPE_Q2_K) {
        const int q3 = dt == KILN_DTYPE_Q3_K ? 1 : dt == KILN_DTYPE_Q2_K ? 2 : 0; /* the kernels' kv */
        if (vnni) qm_x16q6_vnni(G, P, xt, c8, j->NT, nt, nsb, q3, o, j->N, bias);
        else if (j->isa >= CPU_ISA_AVX2)
            for (int t = 0; t < nt; t += 2)
                qm_x16q6_avx2(G, P, xt + t, c8 + 2 * t, j->NT, nt - t < 2 ? nt - t : 2, nsb, q3, o + (size_t)t * j->N, j->N, bias);
        else q6x_scalar(G, xt, c8, j->NT, nt, nsb, q3, o, j->N, bias);
    } else if (vnni) qm_x16_vnni(G, P, xt, c8, j->NT, nt, j->nb, fmt, o, j->N, bias);
    else if (j->isa >= CPU_ISA_AVX2)
        for (int t = 0; t < nt; t += 2)
            qm_x16_avx2(G, P, xt + t, c8 + t, j->NT, nt - t < 2 ? nt - t : 2, j->nb, fmt, o + (size_t)t * j->N, j->N, bias);
    else x16_scalar(G, xt, c8, j->NT, nt, j->nb, fmt, o, j->N, bias);
}

/* the bytes of one group of 16 rows of dtype t, nb blocks of 32 */
static size_t x16_group_bytes(enum kiln_dtype t, int nb) {
    return t == KILN_DTYPE_Q4_K ? (size_t)(nb / 8) * QKX_BB : t == KILN_DTYPE_Q5_K ? (size_t)(nb / 8) * Q5X_BB
           : t == KILN_DTYPE_Q6_K ? (size_t)(nb / 8) * Q6X_BB : t == KILN_DTYPE_IQ4_XS ? (size_t)(nb / 8) * IQX_BB
           : t == KILN_DTYPE_Q3_K ? (size_t)(nb / 8) * Q3X_BB : t == KILN_DTYPE_Q2_K ? (size_t)(nb / 8) * Q2X_BB
           : (size_t)nb * x16_bb(x16_fmt(t));
}

static void i_x16(void *arg, int64_t u0, int64_t u1, int tid) {
    const struct ijob *j = arg;
    const enum kiln_dtype dt = j->w->w.dtype;
    const int fmt = x16_fmt(dt), q8 = fmt == X16_Q8, BB = x16_bb(fmt), pv = dt == KILN_DTYPE_Q6_K || dt == KILN_DTYPE_Q3_K || dt == KILN_DTYPE_Q2_K ? 2 : 1; /* per-block values in c8 */
    const int C = q8 ? 32 : x16t_codes(x16_t1(fmt)); /* where a block's codes start */
    const size_t GB = x16_group_bytes(dt, j->nb);
    const uint8_t *tail = j->x16 + (size_t)j->ng * GB; /* the rows past the groups, as stored */
    uint8_t *P = j->scr ? j->scr[tid] : NULL; /* several tiles: each group's codes split (Q8_0: flipped, Q5_*, Q6_K: assembled) once */
    CPU_FOR_ROWS(u, u0, u1, qm_two_cur) {
        const uint8_t *G = j->x16 + (size_t)u * GB;
        if (P && u < j->ng && dt == KILN_DTYPE_IQ4_XS) { /* the values, 512 bytes per sub-block */
            for (int b = 0; b < j->nb; b++) x16_unpack_iq4(G + (size_t)IQX_BB * (b / 8) + 160 + 256 * (b % 8), P + 512 * (size_t)b, j->R == 16);
        } else if (P && u < j->ng && (dt == KILN_DTYPE_Q5_K || dt == KILN_DTYPE_Q6_K || dt == KILN_DTYPE_Q3_K || dt == KILN_DTYPE_Q2_K)) {
            /* 512 bytes per 32-weight block, as below */
            const size_t SB = GB / (size_t)(j->nb / 8); /* a superblock's bytes */
            for (int i = 0; i < j->nb / 8; i++) {
                if (dt != KILN_DTYPE_Q5_K) qm_x16q6_unpack(G + SB * i, P + 4096 * (size_t)i, dt == KILN_DTYPE_Q3_K ? 1 : dt == KILN_DTYPE_Q2_K ? 2 : 0);
                else qm_x16q5_unpack(G + SB * i, P + 4096 * (size_t)i);
            }
        } else if (P && u < j->ng)
            for (int b = 0; b < j->nb; b++) {
                const uint8_t *c = G + (size_t)BB * b + C;
                if (q8) x16_flip(c, P + 512 * (size_t)b);
                else if (fmt == X16_IQ4) x16_unpack_iq4(c, P + 512 * (size_t)b, j->R == 16);
                else if (x16_five(fmt)) x16_unpack5(c, c + 256, P + 512 * (size_t)b);
                else x16_unpack(c, P + 512 * (size_t)b);
            }
        for (int tile = 0; tile < j->ntile; tile++) {
            const int t0 = tile * j->NT, nt = j->n - t0 < j->NT ? j->n - t0 : j->NT;
            const size_t ti = (size_t)tile * j->nb * j->NT;
            const struct q8a *xt = j->xa + ti;
            const int32_t *c8 = j->c8 + pv * ti;
            if (u < j->ng) {
                x16_group(j, G, P, xt, c8, nt, j->out + (size_t)t0 * j->N + X16_R * u, j->bias ? j->bias + X16_R * u : NULL);
                continue;
            }
            for (int64_t r = X16_R * j->ng; r < j->N; r++) {
                const uint8_t *row = tail + (size_t)(r - X16_R * j->ng) * j->rb;
                for (int t = 0; t < nt; t++) {
                    const float v = dt == KILN_DTYPE_Q4_K || dt == KILN_DTYPE_Q5_K
                                        ? q4kx_tail(row, xt + t, (const float *)c8 + t, j->NT, j->nb / 8, dt == KILN_DTYPE_Q5_K)
                                    : dt == KILN_DTYPE_Q6_K || dt == KILN_DTYPE_Q3_K || dt == KILN_DTYPE_Q2_K
                                        ? q6x_tail(row, xt + t, c8 + 2 * t, j->NT, j->nb / 8, dt == KILN_DTYPE_Q3_K ? 1 : dt == KILN_DTYPE_Q2_K ? 2 : 0)
                                    : dt == KILN_DTYPE_IQ4_XS ? iqx_tail(row, xt + t, j->NT, j->nb / 8)
                                                            : x16_tail(row, xt + t, (const float *)c8 + t, j->NT, j->nb, fmt);
                    j->out[(size_t)(t0 + t) * j->N + r] = v + (j->bias ? j->bias[r] : 0.0f);
                }
            }
        }
    }
}

#endif

#if defined(KILN_X86)
static void i_gemm_panels(void *arg, int64_t p0, int64_t p1, int tid) {
    const struct ijob *j = arg;
    uint8_t *P = j->scr[tid];
    for (int64_t pi = p0; pi < p1; pi++) {
        const int r0 = (int)pi * j->R, nr = j->N - r0 < j->R ? j->N - r0 : j->R;
        if (j->kx16) qm_pack_i8_x16k(P, j->kx16, j->rb, j->ng, r0, nr, j->nb, j->mode == PK_Q5K);
        else qm_pack_i8(P, j->w->w.data, j->rb, r0, nr, j->nb, j->R, j->mode);
        const float *bias = j->bias ? j->bias + r0 : NULL;
        for (int tile = 0; tile < j->ntile; tile++) {
            const int t0 = tile * j->NT, nt = j->n - t0 < j->NT ? j->n - t0 : j->NT;
            const struct q8a *xt = j->xa + (size_t)tile * j->nb * j->NT;
            float *c = j->out + (size_t)t0 * j->N + r0;
            if (j->mode == PK_Q6KU) qm_gemm_q6k_vnni(P, xt, j->hs + (size_t)tile * j->nb * j->NT * 2, j->nb, c, j->N, nr, nt, bias);
            else if (j->R == 16 && j->mode >= PK_Q4K) qm_gemm_qk_vnni(P, xt, j->nb, c, j->N, nr, nt, bias);
            else if (j->R == 16) qm_gemm_i8_vnni(P, xt, j->nb, j->mode == PK_Q4 ? 8 : 128, c, j->N, nr, nt, bias);
            else if (j->mode == PK_Q6K) qm_gemm_q6k_avx2(P, xt, j->nb, c, j->N, nr, nt, bias);
            else if (j->mode >= PK_Q4K) qm_gemm_qk_avx2(P, xt, j->nb, j->mode >= PK_Q5K, c, j->N, nr, nt, bias);
            else if (j->mode == PK_Q4) qm_gemm_q4_0_avx2(P, xt, j->nb, c, j->N, nr, nt, bias);
            else qm_gemm_q8_0_avx2(P, xt, j->nb, c, j->N, nr, nt, bias);
        }
    }
}

#endif

#if defined(KILN_X86)
/* Q4_0 decode's per-call activation vectors for one row of nb blocks xa:
 * xd the block scales, cs -8 x the code sums, and (pairs, when not NULL)
 * the block pairs [x_b lo 16 | x_b+1 lo | x_b hi | x_b+1 hi], 64 bytes per
 * pair (act2's layout, rowa_q4_0 / rowm_q4_0 / qm_dot1z_q4_0) */
static void act_q4_vectors(float *xd, float *cs, int8_t *pairs, const struct q8a *xa, int nb) {
    if (xd)
        for (int b = 0; b < nb; b++) xd[b] = xa[b].d, cs[b] = (float)(-8 * xa[b].sum);
    if (pairs)
        for (int q = 0; q < nb / 2; q++) {
            const struct q8a *x0 = &xa[2 * q], *x1 = x0 + 1;
            int8_t *d = pairs + 64 * (size_t)q;
            memcpy(d, x0->qs, 16), memcpy(d + 16, x1->qs, 16), memcpy(d + 32, x0->qs + 16, 16), memcpy(d + 48, x1->qs + 16, 16);
        }
}
#endif

#if defined(KILN_X86)
/* n at or above which Q8_0 / Q4_0 and the K formats run the int8 GEMM
 * (below: the row dots, which read the weights once per 4 rows but pack
 * nothing). Measured with `--profile batch` on 0.6B GGUFs, 2 threads
 * (fifteenth session, docs/cpu.md): on AVX2 the row dots win up to 16
 * rows for Q4_0 / Q8_0 (batch 8: 57-58 -> 76-87 tok/s Q4_0) and up to 12
 * for the K formats (GEMM ahead at 16); with VNNI the GEMM is ahead from
 * 12. KILN_CPU_IGEMM_MIN=n overrides (2..DECM_MAX + 1). */
static int igemm_min(int vnni, enum kiln_dtype t) {
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("KILN_CPU_IGEMM_MIN");
        env = e && atoi(e) > 1 && atoi(e) <= DECM_MAX + 1 ? atoi(e) : 0;
    }
    if (env) return env;
    return vnni ? 12 : t == KILN_DTYPE_Q4_0 || t == KILN_DTYPE_Q8_0 ? 17 : 16;
}

/* KILN_CPU_KGEMM=0: Q4_K / Q5_K / Q6_K prefill on the row dots, as before
 * the GEMM, for A/B runs; read once */
static int kgemm_on(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("KILN_CPU_KGEMM");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

/* whether an int8 matmul of n activation rows of dtype t runs the GEMM
 * (else the row dots); int8_setup and qm_int8_multi ask the same */
static int int8_gemm(int isa, enum kiln_dtype t, int n) {
    const int vnni = isa >= CPU_ISA_AVX512 && qm_have_vnni();
    const int kq = t == KILN_DTYPE_Q4_K || t == KILN_DTYPE_Q5_K || t == KILN_DTYPE_Q6_K;
    return isa >= CPU_ISA_AVX2 && n >= igemm_min(vnni, t) &&
           (t == KILN_DTYPE_Q8_0 || t == KILN_DTYPE_Q4_0 || t == KILN_DTYPE_Q4_1 || t == KILN_DTYPE_Q5_0 || t == KILN_DTYPE_Q5_1 ||
            (kq && kgemm_on()));
}
#endif

#if defined(KILN_NEON)
/* whether an int8 matmul of n activation rows of dtype t runs the NEON
 * GEMM (else the row dots); int8_setup and qm_int8_multi ask the same.
 * QN_MIN: see qmatmul_int8_neon.c */
static int neon_gemm(int isa, enum kiln_dtype t, int n) {
    return isa >= CPU_ISA_NEON && n >= QN_MIN && (t == KILN_DTYPE_Q8_0 || t == KILN_DTYPE_Q4_0);
}
#endif

/* everything of an int8 matmul before its parallel part: the kernels for
 * w's dtype, the activations quantized (once, into the backend's buffer)
 * and, for the VNNI decode, the per-block vectors; returns whether it is
 * the GEMM (1 or 0), or -1 when the buffer could not grow */
static int int8_setup(struct kiln_backend *be, struct ijob *jp, float *out, const float *x, const struct qlinear *w, int n) {
#if defined(KILN_X86)
    qm_settle(); /* the decode settings, on the calling thread before the kernels read them */
#endif
    const int K = w->n_in, N = w->n_out, nb = K / 32;
    struct ijob j = {.w = w, .out = out, .x = x, .bias = w->bias.data ? cpu_vec(&w->bias) : NULL, .n = n, .K = K, .N = N,
                     .nb = nb, .nblk = nb, .isa = cpu_isa(), .rb = quant_row_bytes(w->w.dtype, K)};
#if !defined(KILN_X86)
    /* row dots (NEON Q8_0 / Q4_0 / Q4_1 and K-format dots, sdot with
     * dotprod; the scalar ones when held to scalar), or for Q8_0 / Q4_0
     * from QN_MIN tokens the NEON GEMM */
    switch (w->w.dtype) {
    case KILN_DTYPE_Q8_0: j.dot = dot_q8_0_scalar; break;
    case KILN_DTYPE_Q4_0: j.dot = dot_q4_0_scalar; break;
    case KILN_DTYPE_Q4_1: j.dot = dot_q4_1_scalar; break;
    case KILN_DTYPE_Q5_0: j.dot = dot_q5_0_scalar; break;
    case KILN_DTYPE_Q5_1: j.dot = dot_q5_1_scalar; break;
    case KILN_DTYPE_Q5_K: j.dot = dot_q5_k_scalar, j.nblk = K / 256; break;
    case KILN_DTYPE_Q6_K: j.dot = dot_q6_k_scalar, j.nblk = K / 256; break;
    case KILN_DTYPE_IQ4_NL: j.dot = dot_iq4nl_scalar; break;
    case KILN_DTYPE_IQ4_XS: j.dot = dot_iq4xs_scalar, j.nblk = K / 256; break;
    case KILN_DTYPE_Q2_K: j.dot = dot_q2_k_scalar, j.nblk = K / 256; break;
    case KILN_DTYPE_Q3_K: j.dot = dot_q3_k_scalar, j.nblk = K / 256; break;
    default: j.dot = dot_q4_k_scalar, j.nblk = K / 256; break;
    }
#if defined(KILN_NEON)
    if (j.isa >= CPU_ISA_NEON) {
        const int dp = j.isa >= CPU_ISA_DOTPROD;
        switch (w->w.dtype) {
        case KILN_DTYPE_Q8_0: j.dot = dp ? dot_q8_0_dotprod : dot_q8_0_neon; break;
        case KILN_DTYPE_Q4_0: j.dot = dp ? dot_q4_0_dotprod : dot_q4_0_neon; break;
        case KILN_DTYPE_Q4_1: j.dot = dp ? dot_q4_1_dotprod : dot_q4_1_neon; break;
        case KILN_DTYPE_Q5_0: j.dot = dp ? dot_q5_0_dotprod : dot_q5_0_neon; break;
        case KILN_DTYPE_Q5_1: j.dot = dp ? dot_q5_1_dotprod : dot_q5_1_neon; break;
        case KILN_DTYPE_Q4_K: j.dot = dp ? dot_q4_k_dotprod : dot_q4_k_neon; break;
        case KILN_DTYPE_Q5_K: j.dot = dp ? dot_q5_k_dotprod : dot_q5_k_neon; break;
        case KILN_DTYPE_Q6_K: j.dot = dp ? dot_q6_k_dotprod : dot_q6_k_neon; break;
        case KILN_DTYPE_IQ4_NL: j.dot = dp ? dot_iq4nl_dotprod : dot_iq4nl_neon; break;
        case KILN_DTYPE_IQ4_XS: j.dot = dp ? dot_iq4xs_dotprod : dot_iq4xs_neon; break;
        case KILN_DTYPE_Q2_K: j.dot = dp ? dot_q2_k_dotprod : dot_q2_k_neon; break;
        case KILN_DTYPE_Q3_K: j.dot = dp ? dot_q3_k_dotprod : dot_q3_k_neon; break;
        default: break;
        }
    }
    cpu_isa_note(j.isa, 0);
    if (neon_gemm(j.isa, w->w.dtype, n)) {
        /* the GEMM: x quantized into tiles of QN_NT tokens, their scales beside */
        j.NT = QN_NT, j.ntile = (n + QN_NT - 1) / QN_NT;
        j.qn = (struct qn_gemm){.src = {.W = w->w.data, .rb = j.rb, .q4 = w->w.dtype == KILN_DTYPE_Q4_0}, .out = out, .bias = j.bias, .N = N,
                                .n = n, .nb = nb, .ntile = j.ntile, .dp = j.isa >= CPU_ISA_DOTPROD};
        const size_t nx = (size_t)j.ntile * QN_NT * nb, sz[2] = {sizeof *j.xa * nx, sizeof(float) * nx};
        void *ptr[2];
        if (qm_buf_get(be, sz, ptr, 2)) return -1;
        j.xa = ptr[0], j.qn.xa = j.xa, j.qn.xd = ptr[1];
        cpu_parallel_for(be, (int64_t)j.ntile * QN_NT, (16384 + K - 1) / K, i_quant, &j);
        *jp = j;
        return 1;
    }
#endif
    j.dot1 = j.dot;
    const size_t sz = sizeof *j.xa * (size_t)n * nb;
    if (qm_buf_get(be, &sz, (void **)&j.xa, 1)) return -1;
    cpu_parallel_for(be, n, (16384 + K - 1) / K, i_quant, &j);
    *jp = j;
    return 0;
#else
    /* Q4_K / Q5_K in groups without VNNI: from the GEMM's number of tokens
     * the AVX2 GEMM, on panels cut from the groups (the same bits as the
     * group kernel, whose 2-token tiles prefilled 25% slower) */
    const uint8_t *gx16 = ((const struct qprep *)w->be)->x16;
    if (gx16 && (w->w.dtype == KILN_DTYPE_Q4_K || w->w.dtype == KILN_DTYPE_Q5_K) && !(j.isa >= CPU_ISA_AVX512 && qm_have_vnni()) &&
        int8_gemm(j.isa, w->w.dtype, n))
        j.kx16 = gx16, j.ng = N / X16_R, gx16 = NULL;
    if (gx16) {
        /* Q4_0 in groups of 16 rows: every n on one kernel, tokens in tiles
         * of NT (VNNI 8, AVX2 2; fewer when n is) */
        const int vnni = j.isa >= CPU_ISA_AVX512 && qm_have_vnni();
        j.x16 = ((const struct qprep *)w->be)->x16, j.ng = N / X16_R;
        j.R = vnni ? 16 : 0, j.NT = vnni || j.isa < CPU_ISA_AVX2 ? 8 : 2;
        if (j.NT > n) j.NT = n;
        j.ntile = (n + j.NT - 1) / j.NT;
        cpu_isa_note(j.isa >= CPU_ISA_AVX2 ? CPU_ISA_AVX2 : CPU_ISA_SCALAR, vnni ? CPU_USED_VNNI : 0);
        const int q6 = w->w.dtype == KILN_DTYPE_Q6_K || w->w.dtype == KILN_DTYPE_Q3_K || w->w.dtype == KILN_DTYPE_Q2_K; /* two values per block in c8 */
        const size_t nx = (size_t)j.ntile * j.NT * nb, sz[2] = {sizeof *j.xa * nx, sizeof(int32_t) * nx * (q6 ? 2 : 1)};
        void *ptr[2];
        if (qm_buf_get(be, sz, ptr, 2)) return -1;
        j.xa = ptr[0], j.c8 = ptr[1];
        cpu_parallel_for(be, (int64_t)j.ntile * j.NT, (16384 + K - 1) / K, i_quant, &j);
        const enum kiln_dtype dt = w->w.dtype;
        if (dt == KILN_DTYPE_Q4_K || dt == KILN_DTYPE_Q5_K || dt == KILN_DTYPE_Q4_1 || dt == KILN_DTYPE_Q5_1) {
            /* the mins' term: xd x code sum per block, as f32 in c8's space */
            float *xs = (float *)j.c8;
            for (size_t i = 0; i < nx; i++) xs[i] = j.xa[i].d * (float)j.xa[i].sum;
        } else if (q6) { /* the offset of the codes: -32 (Q3_K: -4) x the code sum of each half block; Q2_K: the sums (its mins') */
            const int off = dt == KILN_DTYPE_Q3_K ? 4 : dt == KILN_DTYPE_Q2_K ? -1 : 32;
            for (size_t i = 0; i < nx; i++) {
                int s0 = 0;
                for (int l = 0; l < 16; l++) s0 += j.xa[i].qs[l];
                j.c8[2 * i] = -off * s0, j.c8[2 * i + 1] = -off * (j.xa[i].sum - s0);
            }
        } else {
            /* Q8_0's and IQ4_NL's VNNI codes are the value + 128, Q4_0's q */
            const int off = dt == KILN_DTYPE_Q8_0 || dt == KILN_DTYPE_IQ4_NL || dt == KILN_DTYPE_IQ4_XS ? 128 : dt == KILN_DTYPE_Q5_0 ? 16 : 8;
            for (size_t i = 0; i < nx; i++) j.c8[i] = -off * j.xa[i].sum;
        }
        *jp = j;
        return 2;
    }
    switch (w->w.dtype) {
    case KILN_DTYPE_Q8_0: j.dot = dot_q8_0_scalar, j.dotx = qm_dot_q8_0_avx2; break;
    case KILN_DTYPE_Q4_0: j.dot = dot_q4_0_scalar, j.dotx = qm_dot_q4_0_avx2; break;
    case KILN_DTYPE_Q4_1: j.dot = dot_q4_1_scalar, j.dotx = qm_dot_q4_1_avx2; break;
    case KILN_DTYPE_Q5_0: j.dot = dot_q5_0_scalar, j.dotx = qm_dot_q5_0_avx2; break;
    case KILN_DTYPE_Q5_1: j.dot = dot_q5_1_scalar, j.dotx = qm_dot_q5_1_avx2; break;
    case KILN_DTYPE_Q5_K: j.dot = dot_q5_k_scalar, j.nblk = K / 256; break; /* on AVX2: qm_*_qk (j.deck) */
    case KILN_DTYPE_Q6_K: j.dot = dot_q6_k_scalar, j.dotx = qm_dot_q6_k_avx2, j.nblk = K / 256; break;
    case KILN_DTYPE_IQ4_NL: j.dot = dot_iq4nl_scalar, j.dotx = qm_dot_iq4nl_avx2; break;
    case KILN_DTYPE_IQ4_XS: j.dot = dot_iq4xs_scalar, j.dotx = qm_dot_iq4xs_avx2, j.nblk = K / 256; break;
    case KILN_DTYPE_Q2_K: j.dot = dot_q2_k_scalar, j.dotx = qm_dot_q2_k_avx2, j.nblk = K / 256; break;
    case KILN_DTYPE_Q3_K: j.dot = dot_q3_k_scalar, j.dotx = qm_dot_q3_k_avx2, j.nblk = K / 256; break;
    default: j.dot = dot_q4_k_scalar, j.nblk = K / 256; break; /* Q4_K; on AVX2: qm_*_qk (j.deck) */
    }
    const int vnni = j.isa >= CPU_ISA_AVX512 && qm_have_vnni();
    if (j.isa >= CPU_ISA_AVX2 && w->w.dtype == KILN_DTYPE_Q8_0)
        j.dot1 = vnni ? qm_dot1_q8_0_vnni : qm_dot1_q8_0_avx2;
    if (j.isa >= CPU_ISA_AVX2 && w->w.dtype == KILN_DTYPE_Q4_0)
        j.dot1 = vnni ? qm_dot1_q4_0_vnni : qm_dot1_q4_0_avx2;
    const int gemm = int8_gemm(j.isa, w->w.dtype, n);
    if (gemm) {
        j.R = vnni ? 16 : 8, j.NT = vnni ? 8 : 4;
        j.mode = w->w.dtype == KILN_DTYPE_Q4_0 ? PK_Q4 : w->w.dtype == KILN_DTYPE_Q4_K ? PK_Q4K : w->w.dtype == KILN_DTYPE_Q5_K ? PK_Q5K
                 : w->w.dtype == KILN_DTYPE_Q5_0 ? PK_Q50 : w->w.dtype == KILN_DTYPE_Q5_1 ? PK_Q51 : w->w.dtype == KILN_DTYPE_Q4_1 ? PK_Q41
                 : w->w.dtype == KILN_DTYPE_Q6_K ? (vnni ? PK_Q6KU : PK_Q6K) : vnni ? PK_Q8_U8 : PK_Q8_S8;
        j.ntile = (n + j.NT - 1) / j.NT;
    }
    const int nrow = gemm ? j.ntile * j.NT : n;
    /* VNNI decode (Q8_0 / Q4_0): per-block vectors built once per call */
    const int dec = !gemm && n == 1 && vnni && cpu_vnni_dec() && (w->w.dtype == KILN_DTYPE_Q8_0 || w->w.dtype == KILN_DTYPE_Q4_0);
    const int dec4 = dec && w->w.dtype == KILN_DTYPE_Q4_0, dec4q = dec4 && nb <= Q4Q_MAX_NB && qm_have_vbmi();
    const int dec8 = dec && w->w.dtype == KILN_DTYPE_Q8_0;
    /* row dots, quantizer: AVX2; the GEMM and n = 1 on VNNI */
    cpu_isa_note(j.isa >= CPU_ISA_AVX2 ? CPU_ISA_AVX2 : CPU_ISA_SCALAR, ((gemm && j.R == 16) || dec ? CPU_USED_VNNI : 0) | (dec4q ? CPU_USED_VBMI : 0));
    /* decode without VNNI: the AVX2 8-block kernels (cs in corr's space) */
    j.dec2 = !gemm && n == 1 && !(vnni && cpu_vnni_dec()) && j.isa >= CPU_ISA_AVX2 && (w->w.dtype == KILN_DTYPE_Q8_0 || w->w.dtype == KILN_DTYPE_Q4_0);
    const int d2q4 = j.dec2 && w->w.dtype == KILN_DTYPE_Q4_0;
    /* decode of 2-7 rows: rowa_q4_0's / rowa_q8_0's step over up to 4 rows at once (qm_rowm_*) */
    j.decm = gemm || n < 2 || n > DECM_MAX || j.isa < CPU_ISA_AVX2 ? 0 : w->w.dtype == KILN_DTYPE_Q4_0 ? 1 : w->w.dtype == KILN_DTYPE_Q8_0 ? 2 : 0;
    /* Q4_K / Q5_K / Q6_K row dots on AVX2 and up (the AVX-512 machines take them too), below the GEMM's n */
    j.deck = gemm || j.isa < CPU_ISA_AVX2 ? 0 : w->w.dtype == KILN_DTYPE_Q4_K ? 1 : w->w.dtype == KILN_DTYPE_Q5_K ? 2
             : w->w.dtype == KILN_DTYPE_Q6_K ? 3 : 0;
    {
        const int vecs = dec || j.dec2;
        const size_t sz[5] = {sizeof *j.xa * (size_t)nrow * nb,
                              vecs ? sizeof(__m256i) * (size_t)nb : j.deck || j.decm ? sizeof(float) * (size_t)nrow * nb
                              : gemm && j.mode == PK_Q6KU ? sizeof(int32_t) * 2 * (size_t)nrow * nb : 0,
                              vecs ? sizeof(float) * (size_t)nb : j.deck || j.decm ? sizeof(float) * (size_t)nrow * nb : 0,
                              dec4 || dec8 || d2q4 ? 64 * (size_t)(nb / 2 + 1) : j.decm == 1 ? 64 * (size_t)(nb / 2 + 1) * n : 0,
                              dec4 || dec8 ? 64 * (size_t)(nb / 2 + 1) : 0};
        void *ptr[5];
        if (qm_buf_get(be, sz, ptr, 5)) return -1;
        j.xa = ptr[0], j.corr = ptr[1], j.xd = ptr[2], j.act2 = ptr[3], j.corr2 = ptr[4];
    }
    cpu_parallel_for(be, nrow, (16384 + K - 1) / K, i_quant, &j);
    if (gemm && j.mode == PK_Q6KU) { /* 32 x each half's code sum, in xa's [tile][block][NT] order */
        j.hs = (int32_t *)j.corr, j.corr = NULL;
        for (size_t b = 0; b < (size_t)nrow * nb; b++) {
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 16; l++) s0 += j.xa[b].qs[l], s1 += j.xa[b].qs[16 + l];
            j.hs[2 * b] = 32 * s0, j.hs[2 * b + 1] = 32 * s1;
        }
    }
    if (j.decm) { /* per row t: cs, xd and the block pairs [x_b lo | x_b+1 lo | x_b hi | x_b+1 hi] as d2q4's */
        float *cs = (float *)j.corr;
        j.corr = NULL;
        for (int t = 0; t < n; t++) {
            float *xdt = j.xd + (size_t)t * nb, *cst = cs + (size_t)t * nb;
            int8_t *a2 = j.decm == 1 ? (int8_t *)j.act2 + (size_t)t * 64 * (nb / 2 + 1) : NULL; /* Q8_0 takes no pairs */
            act_q4_vectors(xdt, cst, a2, j.xa + (size_t)t * nb, nb);
            j.xdm[t] = xdt, j.csm[t] = cst, j.x2m[t] = (const __m256i *)a2;
        }
        j.act2 = NULL;
    }
    if (j.deck) {
        j.xs = (float *)j.corr, j.corr = NULL;
        for (size_t b = 0; b < (size_t)n * nb; b++) j.xd[b] = j.xa[b].d, j.xs[b] = j.xa[b].d * (float)j.xa[b].sum;
    }
    if (j.dec2) {
        j.cs = (float *)j.corr, j.corr = NULL;
        if (!d2q4) j.act2 = NULL;
        act_q4_vectors(j.xd, j.cs, (int8_t *)j.act2, j.xa, nb);
    }
    if (dec) {
        const int c = dec4 ? 8 : 128;
        j.dot1v = c == 8 ? qm_dot1v_q4_0 : qm_dot1v_q8_0;
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
            act_q4_vectors(NULL, NULL, (int8_t *)j.act2, j.xa, nb);
            for (int q = 0; q < nb / 2; q++) {
                int32_t v[16] = {0};
                v[0] = -8 * j.xa[2 * q].sum, v[4] = -8 * j.xa[2 * q + 1].sum;
                memcpy(&j.corr2[q], v, sizeof v);
            }
        }
    }
    *jp = j;
    return gemm;
#endif
}

#if defined(KILN_X86)
/* groups with several tiles of tokens: whether each group's codes are split
 * once into a per-thread panel (j->scr, 512 bytes per block) that the tiles
 * share (else each tile splits them) */
static int x16_panel(const struct ijob *j) {
    const enum kiln_dtype t = j->w->w.dtype;
    return j->ntile > 1 && j->isa >= CPU_ISA_AVX2 &&
           (t == KILN_DTYPE_Q4_0 || t == KILN_DTYPE_Q4_1 || t == KILN_DTYPE_Q5_0 || t == KILN_DTYPE_IQ4_NL || t == KILN_DTYPE_IQ4_XS ||
            t == KILN_DTYPE_Q3_K || t == KILN_DTYPE_Q2_K || t == KILN_DTYPE_Q5_1 || t == KILN_DTYPE_Q5_K || t == KILN_DTYPE_Q6_K ||
            (j->R == 16 && t == KILN_DTYPE_Q8_0));
}
#endif

void qm_matmul_int8(struct kiln_backend *be, float *out, const float *x, const struct qlinear *w, int n) {
    struct ijob j;
    const int gemm = int8_setup(be, &j, out, x, w, n);
    if (gemm < 0) return; /* reported by cpu_error */
#if defined(KILN_NEON)
    if (gemm) {
        qm_neon_gemm(be, &j.qn);
        return;
    }
#endif
#if defined(KILN_X86)
    if (gemm == 2) {
        const int64_t units = j.ng + (j.N > X16_R * j.ng);
        if (x16_panel(&j) && !(j.scr = cpu_scratch_threads(be, 512 * (size_t)j.nb))) return; /* reported by cpu_error */
        /* one tile (decode): a run of groups per thread, stolen in chunks; several: a group at a time from the counter */
        if (j.ntile > 1) cpu_parallel_for(be, units, 1, i_x16, &j);
        else cpu_parallel_for_split(be, units, cpu_split_chunk(be, j.ng + 1, X16_R * j.rb), i_x16, &j);
        cpu_scratch_threads_free(be, j.scr);
    } else if (gemm) {
        if ((j.scr = cpu_scratch_threads(be, (size_t)j.nb * PK_BLOCK(j.mode, j.R)))) cpu_parallel_for(be, (j.N + j.R - 1) / j.R, 1, i_gemm_panels, &j);
        cpu_scratch_threads_free(be, j.scr);
    } else
#endif
    {
        /* one contiguous run of rows per thread (cpu_parallel_for_split),
         * walked and stolen from in chunks of cpu_split_chunk */
        cpu_parallel_for_split(be, j.N, cpu_split_chunk(be, j.N, j.rb), i_rows, &j);
    }
}

int qm_int8_multi(struct kiln_backend *be, float *const *outs, const float *x, const struct qlinear *const *ws, int count, int n) {
    /* the row-dot decode: x quantized once, the rows of all linears in one job */
    struct ijob j[MULTI_MAX];
    struct cpu_task t[MULTI_MAX];
    const int isa = cpu_isa();
#if defined(KILN_X86)
    if (int8_gemm(isa, ws[0]->w.dtype, n)) return 0;
#elif defined(KILN_NEON)
    if (neon_gemm(isa, ws[0]->w.dtype, n)) return 0;
#else
    (void)isa;
#endif
    for (int i = 1; i < count; i++)
        if (((const struct qprep *)ws[i]->be)->int8_act != 1) return 0;
#if defined(KILN_X86)
    const int x16 = ((const struct qprep *)ws[0]->be)->x16 != NULL;
    for (int i = 1; i < count; i++) /* all in groups of 16 rows, or none */
        if ((((const struct qprep *)ws[i]->be)->x16 != NULL) != x16) return 0;
#endif
    const int gemm = int8_setup(be, &j[0], outs[0], x, ws[0], n);
    if (gemm < 0) return 1; /* skipped; reported by cpu_error */
    if (gemm == 1) return 0; /* not reached: the GEMM was ruled out above */
    for (int i = 0; i < count; i++) {
        if (i) {
            j[i] = j[0];
            j[i].w = ws[i], j[i].out = outs[i], j[i].N = ws[i]->n_out;
            j[i].bias = ws[i]->bias.data ? cpu_vec(&ws[i]->bias) : NULL;
        }
#if defined(KILN_X86)
        if (gemm == 2) {
            j[i].x16 = ((const struct qprep *)ws[i]->be)->x16, j[i].ng = j[i].N / X16_R;
            t[i] = (struct cpu_task){i_x16, &j[i], j[i].ng + (j[i].N > X16_R * j[i].ng)};
            continue;
        }
#endif
        t[i] = (struct cpu_task){i_rows, &j[i], ws[i]->n_out};
    }
    cpu_parallel_for_split_tasks(be, t, count, gemm == 2 ? X16_R * j[0].rb : j[0].rb);
    return 1;
}

/* the most int8_setup takes from the per-call buffer for n activation rows of
 * K: in groups (x16) the tiles' codes and c8 (tokens rounded up to a tile
 * of at most 8); else every row path's pieces (the decode vectors) */
static size_t setup_bytes(int n, int K, int x16) {
    const size_t nb = (size_t)K / 32, r = (size_t)n + 8;
    if (x16) return r * nb * (sizeof(struct q8a) + 2 * sizeof(int32_t)) + 4 * 64;
    return r * nb * (sizeof(struct q8a) + 6 * sizeof(float)) + 128 * (nb / 2 + 1) * r + 32 * nb + 8 * 64;
}

static int i_task_setup(struct kiln_backend *be, void *job, const struct cpu_mm *t) {
    return int8_setup(be, job, t->out, t->x, t->w, t->n);
}

static void i_task_share(void *job, const struct cpu_mm *t, int mode) {
    struct ijob *j = job;
    j->w = t->w, j->out = t->out, j->N = t->w->n_out;
    j->bias = t->w->bias.data ? cpu_vec(&t->w->bias) : NULL;
#if defined(KILN_X86)
    if (mode == 2) j->x16 = ((const struct qprep *)t->w->be)->x16, j->ng = j->N / X16_R;
#else
    (void)mode;
#endif
}

static int i_task(void *job, int mode, void **scr, struct cpu_task *out) {
    struct ijob *j = job;
#if defined(KILN_X86)
    if (mode == 2) {
        const int panel = x16_panel(j);
        if (out) j->scr = panel ? scr : NULL, *out = (struct cpu_task){i_x16, j, j->ng + (j->N > X16_R * j->ng)};
        return panel;
    }
#else
    (void)mode, (void)scr;
#endif
    if (out) *out = (struct cpu_task){i_rows, j, j->N};
    return 0;
}

static size_t i_task_bytes(const void *job, int mode) {
    const struct ijob *j = job;
    return mode == 2 ? 16 * j->rb : j->rb;
}

int qm_int8_tasks(struct kiln_backend *be, const struct cpu_mm *t, int count) {
    static const struct qm_task_ops ops = {sizeof(struct ijob), i_task_setup, i_task_share, i_task, i_task_bytes};
    const struct qlinear *w0 = t[0].w;
    const enum kiln_dtype dt = w0->w.dtype;
    const int isa = cpu_isa();
    size_t bytes = 0;
    for (int i = 0; i < count; i++) {
        const struct qprep *p = t[i].w->be;
        if (p->int8_act != 1 || t[i].w->w.dtype != dt || t[i].w->n_in != w0->n_in) return 0;
#if defined(KILN_X86)
        /* the GEMMs (stored blocks; Q4_K / Q5_K panels cut from the groups without VNNI) keep their own jobs */
        const int kx = (dt == KILN_DTYPE_Q4_K || dt == KILN_DTYPE_Q5_K) && !(isa >= CPU_ISA_AVX512 && qm_have_vnni());
        if (!p->x16 != !((const struct qprep *)w0->be)->x16 || ((!p->x16 || kx) && int8_gemm(isa, dt, t[i].n))) return 0;
#elif defined(KILN_NEON)
        if (neon_gemm(isa, dt, t[i].n)) return 0;
#else
        (void)isa;
#endif
#if defined(KILN_X86)
        const int x16 = p->x16 != NULL;
#else
        const int x16 = 0;
#endif
        if (!i || t[i].x != t[i - 1].x || t[i].n != t[i - 1].n) bytes += setup_bytes(t[i].n, w0->n_in, x16);
    }
    return qm_run_tasks(be, t, count, bytes, &ops);
}
