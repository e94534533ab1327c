/*
 * qmatmul_int8_x86.c: the x86 kernels of the int8 path for GGUF blocks
 * (qmatmul_int8.c picks them and lays out what they read): AVX2 row dots
 * over up to 4 activation rows for every format, the int8 GEMM of Q8_0 /
 * Q4_0 prefill (AVX2, AVX-512 VNNI), and the Q8_0 / Q4_0 decode kernels
 * (AVX2, VNNI, VNNI + VBMI) on the stored blocks, which since the groups of
 * 16 rows (end of file: every n, the default) run only with
 * KILN_CPU_X16=0, and the Q4_K / Q5_K / Q6_K kernels. Every function
 * carries its own target attribute; the file is empty off x86.
 */
#include "backend/cpu/qmatmul_internal.h"

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

/* qm_dot_<fmt>_avx2 over nx <= 4 activation rows: a switch onto copies of the
 * kernel dot_<fmt>_avx2_ with nx a constant, so the accumulators stay in
 * registers */
#define QDOTX_BY_NX(name)                                                                               \
    AVX2 void qm_##name(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out) {   \
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

/* Q5_0 / Q5_1's 32 codes (0..31) in weight order: Q4_0's nibbles, and
 * bit i of qh as bit 4 of byte i (byte i of a broadcast of qh picks qh's
 * byte i / 8, and cmpeq tests its bit i % 8) */
AVX2 static inline __m256i q5_codes(const uint8_t *qh, const uint8_t *qs) {
    const __m128i m4 = _mm_set1_epi8(15), b = _mm_loadu_si128((const __m128i *)qs);
    const __m256i lo = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qm_q5_qh(qh)), sel);
    return _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit), _mm256_set1_epi8(16)));
}

/* the 32 codes of a type-0 / type-1 block whose codes start at q: Q4_0's
 * nibbles, or with FIVE Q5's (its qh the 4 bytes before) */
AVX2 static inline __attribute__((always_inline)) __m256i q45_codes(const uint8_t *q, const int five) {
    if (five) return q5_codes(q - 4, q);
    const __m128i m4 = _mm_set1_epi8(15), b = _mm_loadu_si128((const __m128i *)q);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
}

/* Q4_0 / Q5_0 (FIVE): w = d (q - 8) or d (q - 16): the integer dot of
 * the codes, the offset taken off once at the end as 8 or 16 x the sum of
 * d xd x the activation code sum */
AVX2 static inline __attribute__((always_inline)) void dot_t0_(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out,
                                                               const int five) {
    __m256 acc[NX];
    float off[NX] = {0};
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++, w += qm_q45_bytes(0, five)) {
        const __m256i qw = q45_codes(w + qm_q45_codes_at(0, five), five);
        const float d = h2f_c(w);
        #pragma GCC unroll 4
        for (int j = 0; j < nx; j++) {
            const __m256 s = dot_u8s8(qw, _mm256_loadu_si256((const __m256i *)a[j][i].qs));
            const float dd = d * a[j][i].d;
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dd), s, acc[j]);
            off[j] += dd * (float)a[j][i].sum;
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]) - (five ? 16 : 8) * off[j];
}

/* Q4_1 / Q5_1 (FIVE): w = d q + m */
AVX2 static inline __attribute__((always_inline)) void dot_t1_(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out,
                                                               const int five) {
    __m256 acc[NX];
    float off[NX] = {0};
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++, w += qm_q45_bytes(1, five)) {
        const __m256i qw = q45_codes(w + qm_q45_codes_at(1, five), five);
        const float d = h2f_c(w), m = h2f_c(w + 2);
        #pragma GCC unroll 4
        for (int j = 0; j < nx; j++) {
            const __m256 s = dot_u8s8(qw, _mm256_loadu_si256((const __m256i *)a[j][i].qs));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[j][i].d), s, acc[j]);
            off[j] += m * a[j][i].d * (float)a[j][i].sum;
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]) + off[j];
}

#define DOT_T(name, kern, five)                                                                                         \
    AVX2 static inline __attribute__((always_inline)) void name##_(const uint8_t *w, const struct q8a *const *a, int nx, \
                                                                    int nb, float *out) {                               \
        kern(w, a, nx, nb, out, five);                                                                                  \
    }                                                                                                                   \
    QDOTX_BY_NX(name)
DOT_T(dot_q4_0_avx2, dot_t0_, 0)
DOT_T(dot_q5_0_avx2, dot_t0_, 1)
DOT_T(dot_q4_1_avx2, dot_t1_, 0)
DOT_T(dot_q5_1_avx2, dot_t1_, 1)

/* IQ4_NL / IQ4_XS: a block's 32 indices (Q4_0's nibble split) looked up in
 * quant_iq4_kv by one vpshufb, int8 weights in weight order (-127..113),
 * then Q8_0's sign trick (maddubs of |w| with x signed by w) */
AVX2 static inline __m256i iq4_vals(const uint8_t *q) {
    const __m128i m4 = _mm_set1_epi8(15), b = _mm_loadu_si128((const __m128i *)q);
    const __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)quant_iq4_kv)), idx);
}

AVX2 static inline __attribute__((always_inline)) void dot_iq4nl_avx2_(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out) {
    __m256 acc[NX];
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++, w += 18) {
        const __m256i qw = iq4_vals(w + 2), aw = _mm256_sign_epi8(qw, qw);
        const float d = h2f_c(w);
        #pragma GCC unroll 4
        for (int j = 0; j < nx; j++)
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[j][i].d), dot_u8s8(aw, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)a[j][i].qs), qw)),
                                     acc[j]);
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]);
}
QDOTX_BY_NX(dot_iq4nl_avx2)

/* nb: superblocks of 256 */
AVX2 static inline __attribute__((always_inline)) void dot_iq4xs_avx2_(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out) {
    __m256 acc[NX];
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++, w += 136) {
        const float d = h2f_c(w);
        for (int s = 0; s < 8; s++) {
            const __m256i qw = iq4_vals(w + 8 + 16 * s), aw = _mm256_sign_epi8(qw, qw);
            const float dl = d * (float)(quant_iq4xs_scale(w, s) - 32);
            #pragma GCC unroll 4
            for (int j = 0; j < nx; j++) {
                const struct q8a *x = &a[j][8 * i + s];
                acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dl * x->d), dot_u8s8(aw, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x->qs), qw)), acc[j]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]);
}
QDOTX_BY_NX(dot_iq4xs_avx2)

/* Q2_K / Q3_K (nb: superblocks of 256): per activation block b (32
 * weights: code bits 2s of the 32 bytes at qs + 32c, b = 4c + s) the
 * codes as u8 (Q3_K: its third bit from hmask bit b, so u = q + 4), one
 * maddubs with x, one madd with the two sub-blocks' scales as i16 (8 lanes
 * each); the min (Q2_K) or offset (Q3_K) from maddubs of 1 with x, madd
 * with the mins or 4 x the scales */
AVX2 static inline __attribute__((always_inline)) void dot_k23_avx2_(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out,
                                                                     const int q3) {
    const __m256i m3 = _mm256_set1_epi8(3), one8 = _mm256_set1_epi8(1);
    __m256 acc[NX];
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++, w += q3 ? 110 : 84) {
        const float d = h2f_c(w + (q3 ? 108 : 80)), dmin = q3 ? 0.0f : h2f_c(w + 82);
        const __m256i hm = q3 ? _mm256_loadu_si256((const __m256i *)w) : _mm256_setzero_si256();
        for (int b = 0; b < 8; b++) {
            const int c = b / 4, sh = 2 * (b % 4);
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w + (q3 ? 32 : 16) + 32 * c));
            __m256i u = _mm256_and_si256(_mm256_srli_epi16(v, sh), m3);
            int s0, s1, m0 = 0, m1 = 0;
            if (q3) {
                u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, b), one8), 2));
                s0 = quant_q3k_scale(w + 96, 2 * b) - 32, s1 = quant_q3k_scale(w + 96, 2 * b + 1) - 32;
            } else {
                s0 = w[2 * b] & 15, s1 = w[2 * b + 1] & 15, m0 = w[2 * b] >> 4, m1 = w[2 * b + 1] >> 4;
            }
            const __m256i sc = _mm256_set_m128i(_mm_set1_epi16((short)s1), _mm_set1_epi16((short)s0));
            const __m256i mn = q3 ? _mm256_slli_epi16(sc, 2) : _mm256_set_m128i(_mm_set1_epi16((short)m1), _mm_set1_epi16((short)m0));
            #pragma GCC unroll 4
            for (int j = 0; j < nx; j++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)a[j][8 * i + b].qs);
                const __m256i is = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), sc), im = _mm256_madd_epi16(_mm256_maddubs_epi16(one8, x), mn);
                const float xd = a[j][8 * i + b].d;
                if (q3) acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(is, im)), _mm256_set1_ps(d * xd), acc[j]);
                else {
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(d * xd), acc[j]);
                    acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(im), _mm256_set1_ps(dmin * xd), acc[j]);
                }
            }
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]);
}
DOT_T(dot_q2_k_avx2, dot_k23_avx2_, 0)
DOT_T(dot_q3_k_avx2, dot_k23_avx2_, 1)
#undef DOT_T

/* Q6_K: per superblock the 16 int8 scales become two float vectors (x d)
 * once, and a 32-weight block's pair of scales reaches its lanes by one
 * vpermps shared by the nx rows (lanes 0-3 of the madd sum weights 0-15,
 * lanes 4-7 weights 16-31); each row then multiplies by its block's
 * activation scale. The same f32 products as the scalar-scale version
 * (d sc, then x its scale), bit for bit. */
AVX2 static inline __attribute__((always_inline)) void dot_q6_k_avx2_(const uint8_t *w, const struct q8a *const *a, int nx, int nsb, float *out) {
    __m256 acc[NX];
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
    for (int i = 0; i < nsb; i++, w += 210) {
        const __m256 d = _mm256_set1_ps(h2f_c(w + 208));
        const __m128i s16 = _mm_loadu_si128((const __m128i *)(w + 192));
        const __m256 sv[2] = {_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s16)), d),
                              _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s16, 8))), d)};
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h)), ql1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            __m256i lo[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
            #pragma GCC unroll 4
            for (int s4 = 0; s4 < 4; s4++) {
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * s4), m3);
                __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo[s4], _mm256_slli_epi16(hi, 4)), m32); /* -32..31 */
                __m256i aq = _mm256_sign_epi8(q, q);
                const __m256 sc = _mm256_permutevar8x32_ps(sv[h], _mm256_setr_epi32(2 * s4, 2 * s4, 2 * s4, 2 * s4, 2 * s4 + 1, 2 * s4 + 1,
                                                                                    2 * s4 + 1, 2 * s4 + 1));
                #pragma GCC unroll 4
                for (int j = 0; j < nx; j++) {
                    const struct q8a *x = &a[j][8 * i + 4 * h + s4];
                    __m256i p = i8dot_sign_avx2(aq, q, _mm256_loadu_si256((const __m256i *)x->qs));
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(sc, _mm256_set1_ps(x->d)), acc[j]);
                }
            }
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]);
}
QDOTX_BY_NX(dot_q6_k_avx2)

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

/* the 32 codes of sub-block j of a Q4_K (q5: Q5_K) superblock q, one byte
 * each (0..15 / 0..31, weight order), and its scale d sc_j and min dmin m_j */
AVX2 static inline __m256i qk_sub_codes(const uint8_t *q, int j, int q5, float *d, float *m) {
    int sc, mn;
    k4_scale_min(j, q + 4, &sc, &mn);
    *d = h2f_c(q) * (float)sc, *m = h2f_c(q + 2) * (float)mn;
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i c = _mm256_loadu_si256((const __m256i *)(q + (q5 ? 48 : 16) + 32 * (j / 2)));
    c = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(c, 4) : c, m4);
    if (q5) { /* bit j of each qh byte, moved to bit 4 (16-bit shifts stay inside each byte after the mask) */
        __m256i h = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(q + 16)), j), _mm256_set1_epi8(1));
        c = _mm256_or_si256(c, _mm256_slli_epi16(h, 4));
    }
    return c;
}

/* the 32 codes - 32 of group j (= the 32-weight block j of the superblock,
 * weight order) of a Q6_K superblock q as s8, and the scales of its two
 * halves of 16 (dot_q6_k_scalar's layout) */
AVX2 static inline __m256i q6k_sub_codes(const uint8_t *q, int j, float *d0, float *d1) {
    const int h = j / 4, s4 = j % 4;
    const float d = h2f_c(q + 208);
    *d0 = d * (float)(int8_t)q[192 + 8 * h + 2 * s4], *d1 = d * (float)(int8_t)q[192 + 8 * h + 2 * s4 + 1];
    __m256i lo = _mm256_loadu_si256((const __m256i *)(q + 64 * h + 32 * (s4 & 1)));
    lo = _mm256_and_si256(s4 < 2 ? lo : _mm256_srli_epi16(lo, 4), _mm256_set1_epi8(15));
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(q + 128 + 32 * h)), 2 * s4), _mm256_set1_epi8(3));
    return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
}

/* rows r0 .. r0+nr-1 (nr <= R; missing rows repeat the last one with scale
 * 0) into the panel P: per block 32 * R code bytes, then R f32 scales (and
 * for the K formats R f32 mins; their blocks are the 32-weight sub-blocks) */
AVX2 void qm_pack_i8(uint8_t *P, const uint8_t *W, size_t rb, int r0, int nr, int nb, int R, int mode) {
    const size_t bs = PK_BLOCK(mode, R);
    const int blk = mode == PK_Q4 ? 18 : 34, kq = mode >= PK_Q4K, q6 = mode >= PK_Q6K, sbb = q6 ? 210 : mode == PK_Q5K ? 176 : 144;
    const __m256i x80 = _mm256_set1_epi8((char)0x80);
    for (int i0 = 0; i0 < R; i0 += 8) {
        const uint8_t *rp[8];
        for (int i = 0; i < 8; i++) rp[i] = W + (size_t)(r0 + (i0 + i < nr ? i0 + i : nr - 1)) * rb;
        for (int b = 0; b < nb; b++) {
            __m256 v[8];
            float ks[8], km[8];
            for (int i = 0; i < 8; i++) {
                const uint8_t *q = rp[i] + (size_t)blk * b;
                __m256i c;
                if (q6) {
                    c = q6k_sub_codes(rp[i] + (size_t)sbb * (b / 8), b % 8, &ks[i], &km[i]);
                    if (mode == PK_Q6KU) c = _mm256_add_epi8(c, _mm256_set1_epi8(32)); /* back to 0..63 */
                } else if (mode == PK_Q41 || mode == PK_Q50 || mode == PK_Q51) { /* w = d q - min: min -m (type 1) or 16 d */
                    const int t1 = mode != PK_Q50, five = mode != PK_Q41;
                    const uint8_t *qb = rp[i] + (size_t)qm_q45_bytes(t1, five) * b;
                    c = q45_codes(qb + qm_q45_codes_at(t1, five), five);
                    ks[i] = h2f_c(qb), km[i] = t1 ? -h2f_c(qb + 2) : 16 * ks[i];
                } else if (kq) {
                    c = qk_sub_codes(rp[i] + (size_t)sbb * (b / 8), b % 8, mode == PK_Q5K, &ks[i], &km[i]);
                } else if (mode == PK_Q4) {
                    c = q45_codes(q + 2, 0);
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
            for (int i = 0; i < 8; i++) sc[i0 + i] = i0 + i >= nr ? 0.0f : kq ? ks[i] : h2f_c(rp[i] + (size_t)blk * b);
            if (kq)
                for (int i = 0; i < 8; i++) sc[R + i0 + i] = i0 + i < nr ? km[i] : 0.0f;
        }
    }
}

/* R = 16 rows x NT = 8 tokens; corr 128 (Q8_0 as u8) or 8 (Q4_0) */
VNNI void qm_gemm_i8_vnni(const uint8_t *P, const struct q8a *xt, int nb, int corr, float *out, size_t ldo, int nr, int nt,
                              const float *bias) {
    __m512 f[8];
    #pragma GCC unroll 16
    for (int t = 0; t < 8; t++) f[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++, P += 576, xt += 8) {
        __m512i s[8];
        #pragma GCC unroll 16
        for (int t = 0; t < 8; t++) s[t] = _mm512_set1_epi32(-corr * xt[t].sum);
        qm_dp_groups(P, xt, 0, 8, s);
        __m512 sw = _mm512_loadu_ps((const float *)(P + 512));
        #pragma GCC unroll 16
        for (int t = 0; t < 8; t++) f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(sw, _mm512_set1_ps(xt[t].d)), f[t]);
    }
    qm_gemm_out8(f, out, ldo, nr, nt, bias);
}

/* R = 16 rows x NT = 8 tokens of Q4_K / Q5_K sub-blocks (qm_gemm_qk_avx2's
 * arithmetic): vpdpbusd takes the unsigned codes as they are, into i32
 * lanes, so Q5_K needs no widening step */
VNNI void qm_gemm_qk_vnni(const uint8_t *P, const struct q8a *xt, int nb, float *out, size_t ldo, int nr, int nt, const float *bias) {
    __m512 f[8];
    #pragma GCC unroll 16
    for (int t = 0; t < 8; t++) f[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++, P += 640, xt += 8) {
        __m512i s[8];
        #pragma GCC unroll 16
        for (int t = 0; t < 8; t++) s[t] = _mm512_setzero_si512();
        qm_dp_groups(P, xt, 0, 8, s);
        const __m512 sw = _mm512_loadu_ps((const float *)(P + 512)), mw = _mm512_loadu_ps((const float *)(P + 576));
        #pragma GCC unroll 16
        for (int t = 0; t < 8; t++) {
            f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(sw, _mm512_set1_ps(xt[t].d)), f[t]);
            f[t] = _mm512_fnmadd_ps(mw, _mm512_set1_ps(xt[t].d * (float)xt[t].sum), f[t]);
        }
    }
    qm_gemm_out8(f, out, ldo, nr, nt, bias);
}

/* R = 16 rows x NT = 8 tokens of Q6_K blocks of 32 (qm_gemm_q6k_avx2's
 * terms): the codes as stored (0..63, u8) into vpdpbusd, one i32 sum per
 * half of 16, less 32 x the half's activation code sum (hs, exact in i32),
 * each half times its own scale */
VNNI void qm_gemm_q6k_vnni(const uint8_t *P, const struct q8a *xt, const int32_t *hs, int nb, float *out, size_t ldo, int nr, int nt,
                           const float *bias) {
    __m512 f[8];
    #pragma GCC unroll 16
    for (int t = 0; t < 8; t++) f[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++, P += 640, xt += 8, hs += 16) {
        __m512i s0[8], s1[8];
        #pragma GCC unroll 16
        for (int t = 0; t < 8; t++) s0[t] = _mm512_set1_epi32(-hs[2 * t]), s1[t] = _mm512_set1_epi32(-hs[2 * t + 1]);
        qm_dp_groups(P, xt, 0, 4, s0);
        qm_dp_groups(P, xt, 4, 8, s1);
        const __m512 sw0 = _mm512_loadu_ps((const float *)(P + 512)), sw1 = _mm512_loadu_ps((const float *)(P + 576));
        #pragma GCC unroll 16
        for (int t = 0; t < 8; t++) {
            const __m512 xd = _mm512_set1_ps(xt[t].d);
            f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0[t]), _mm512_mul_ps(sw0, xd), f[t]);
            f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[t]), _mm512_mul_ps(sw1, xd), f[t]);
        }
    }
    qm_gemm_out8(f, out, ldo, nr, nt, bias);
}

/* R = 8 rows x NT = 4 tokens */
AVX2 void qm_gemm_q4_0_avx2(const uint8_t *P, const struct q8a *xt, int nb, float *out, size_t ldo, int nr, int nt, const float *bias) {
    __m256 f[4];
    const __m256i one16 = _mm256_set1_epi16(1);
    #pragma GCC unroll 16
    for (int t = 0; t < 4; t++) f[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, P += 288, xt += 4) {
        __m256i s[4];
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) s[t] = _mm256_setzero_si256();
        qm_u8_groups(P, xt, 0, 8, s);
        __m256 sw = _mm256_loadu_ps((const float *)(P + 256));
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) {
            __m256i i = _mm256_add_epi32(_mm256_madd_epi16(s[t], one16), _mm256_set1_epi32(-8 * xt[t].sum));
            f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(sw, _mm256_set1_ps(xt[t].d)), f[t]);
        }
    }
    qm_gemm_out4(f, out, ldo, nr, nt, bias);
}

/* R = 8 rows x NT = 4 tokens of Q4_K / Q5_K (q5) sub-blocks: codes are
 * unsigned, so maddubs takes them as they are, and a block adds
 * d_t (D_r isum - M_r sum_t) (dot_q4_k_scalar's terms). int16 lanes hold
 * 16 products of Q4_K codes (16 x 15 x 127 < 2^15) but only 8 of Q5_K
 * (8 x 31 x 127), so Q5_K widens after every 4 code groups. */
AVX2 void qm_gemm_qk_avx2(const uint8_t *P, const struct q8a *xt, int nb, int q5, float *out, size_t ldo, int nr, int nt, const float *bias) {
    __m256 f[4];
    const __m256i one16 = _mm256_set1_epi16(1);
    #pragma GCC unroll 16
    for (int t = 0; t < 4; t++) f[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, P += 320, xt += 4) {
        __m256i s[4], h[4];
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) s[t] = h[t] = _mm256_setzero_si256();
        if (q5) {
            qm_u8_groups(P, xt, 0, 4, h);
            #pragma GCC unroll 16
            for (int t = 0; t < 4; t++) s[t] = _mm256_madd_epi16(h[t], one16), h[t] = _mm256_setzero_si256();
            qm_u8_groups(P, xt, 4, 8, h);
        } else {
            qm_u8_groups(P, xt, 0, 8, h);
        }
        const __m256 sw = _mm256_loadu_ps((const float *)(P + 256)), mw = _mm256_loadu_ps((const float *)(P + 288));
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) {
            const __m256i i = _mm256_add_epi32(s[t], _mm256_madd_epi16(h[t], one16));
            f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(sw, _mm256_set1_ps(xt[t].d)), f[t]);
            f[t] = _mm256_fnmadd_ps(mw, _mm256_set1_ps(xt[t].d * (float)xt[t].sum), f[t]);
        }
    }
    qm_gemm_out4(f, out, ldo, nr, nt, bias);
}

/* R = 8 rows x NT = 4 tokens of Q6_K blocks of 32: codes - 32 are signed,
 * so as Q8_0 (maddubs of |w| with x signed by w); a half of 16 weights is 4
 * code groups, whose int16 lanes hold 8 products (8 x 32 x 127 < 2^15),
 * and each half has its own scale: two sums per block and token. */
AVX2 void qm_gemm_q6k_avx2(const uint8_t *P, const struct q8a *xt, int nb, float *out, size_t ldo, int nr, int nt, const float *bias) {
    __m256 f[4];
    const __m256i one16 = _mm256_set1_epi16(1);
    #pragma GCC unroll 16
    for (int t = 0; t < 4; t++) f[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, P += 320, xt += 4) {
        __m256i s0[4], h[4];
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) s0[t] = h[t] = _mm256_setzero_si256();
        qm_s8_groups(P, xt, 0, 4, h);
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) s0[t] = _mm256_madd_epi16(h[t], one16), h[t] = _mm256_setzero_si256();
        qm_s8_groups(P, xt, 4, 8, h);
        const __m256 sw0 = _mm256_loadu_ps((const float *)(P + 256)), sw1 = _mm256_loadu_ps((const float *)(P + 288));
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) {
            const __m256 xd = _mm256_set1_ps(xt[t].d);
            f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0[t]), _mm256_mul_ps(sw0, xd), f[t]);
            f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(h[t], one16)), _mm256_mul_ps(sw1, xd), f[t]);
        }
    }
    qm_gemm_out4(f, out, ldo, nr, nt, bias);
}

AVX2 void qm_gemm_q8_0_avx2(const uint8_t *P, const struct q8a *xt, int nb, float *out, size_t ldo, int nr, int nt, const float *bias) {
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
    qm_gemm_out4(f, out, ldo, nr, nt, bias);
}

/* Decode (one activation row): 4 blocks per step into 4 accumulators, so
 * the FMA latency is hidden (one accumulator waits ~4 cycles per block);
 * the -8 / -128 offset x the block's activation sum enters the integer
 * lane 0 (no scalar float chain). VNNI: one vpdpbusd per block (Q8_0 as
 * w + 128, Q4_0 nibbles); AVX2: maddubs + madd (Q8_0 with the sign trick). */
/* software prefetch 4 KiB ahead of the weight stream. First set to 8 KiB
 * (decode, 2 threads, 6144x2048 weights from DRAM: none -> 2 KiB -> 8 KiB,
 * Q4_0 ~40 -> 64-69 -> 74-75 GMAC/s, Q8_0 ~30 -> 35-38 -> 40-42) for the
 * per-row kernels; with the row-loop kernels 4 KiB is better (one core,
 * AVX2 Q4_0 from DRAM, K = 2048: 0 / 1 / 2 / 4 / 8 / 16 / 32 KiB at 35.3-35.9
 * / 36.8 / 39.9-42.4 / 42.7-43.0 / 39.9-40.9 / 36.4-38.3 / 33.5-34.6 GMAC/s;
 * whole 0.6B tg, alternated: AVX2 Q4_0 one thread 59.0-61.8 -> 62.9-64.8
 * tok/s, two threads 96.5-102.7 -> 100.4-107.0; AVX-512 Q4_0 / Q8_0 equal
 * or +2-5%). Rechecked with the weights in 2 MiB pages (Zen 3, AVX2, 2
 * threads, `gemv-bench` builds alternated five times): Q4_0 1 / 2 / 4 KiB
 * at 70-94 / 64-92 / 64-94% of the probe from 0.3 to 19 MB, Q8_0 2 / 4 KiB
 * a tie; -D overrides it for such sweeps) */
#ifndef QPFD
#define QPFD 4096
#endif
/* QPF2: the VNNI K-format groups' second prefetch, each line again 32 KiB
 * ahead into L2. The hardware prefetchers barely help these streams (Zen
 * 4: the Q6_K group kernel on a 255 MB lm_head from DRAM ran at 16-20
 * Gweights/s with no software prefetch, 34-48 with QPFD alone, 55-65 with
 * both); Q4_K_M decode +7.5-8.1% (decode-ab qm-pf2 0 32768, 12 rounds,
 * 0.6B and 1.7B). Not for the AVX2 kernels (held to AVX2: 0.94) nor Q4_0
 * (0.93-0.97): there the one prefetch keeps up */
#ifndef QPF2
#define QPF2 32768
#endif
/* The int8 decode kernels' settings (qmatmul_internal.h), settled once by
 * qm_settle: QPFD ahead, two streams, the VNNI kernels where the CPU has
 * them; but one stream on AMD CPUs with AVX-512 (Zen 4 and later; there
 * Q8_0 decoded 6-10% faster as one, Q4_0 tied: docs/cpu.md, "Zen 4").
 * KILN_CPU_QM_PFD=N, KILN_CPU_QM_STREAMS=1|2 and KILN_CPU_VNNI_DEC=0|1
 * override. */
int qm_pfd_cur = QPFD, qm_two_cur = 1, qm_pf2_cur = QPF2;
static int qm_vnni_cur = 1, qm_settled;

void qm_settle(void) {
    if (qm_settled) return;
    if (cpu_amd_avx512()) qm_two_cur = 0;
    const char *e = getenv("KILN_CPU_QM_PFD"), *t = getenv("KILN_CPU_QM_STREAMS"), *v = getenv("KILN_CPU_VNNI_DEC"), *f = getenv("KILN_CPU_QM_PF2");
    if (e && *e) qm_pfd_cur = cpu_pfd_lines(atoi(e));
    if (f && *f) qm_pf2_cur = cpu_pfd_lines(atoi(f));
    if (t && (!strcmp(t, "1") || !strcmp(t, "2"))) qm_two_cur = *t == '2';
    if (v && *v) qm_vnni_cur = atoi(v) != 0;
    qm_settled = 1;
}

int cpu_qm_pfd(void) { return qm_settle(), qm_pfd_cur; }
int cpu_qm_two(void) { return qm_settle(), qm_two_cur; }
int cpu_vnni_dec(void) { return qm_settle(), qm_vnni_cur; }
int cpu_set_qm_pfd(int d) { return qm_settle(), qm_pfd_cur = cpu_pfd_lines(d); }
int cpu_set_qm_pf2(int d) { return qm_settle(), qm_pf2_cur = cpu_pfd_lines(d); }
int cpu_set_qm_two(int two) { return qm_settle(), qm_two_cur = two != 0; }
int cpu_set_vnni_dec(int on) { return qm_settle(), qm_vnni_cur = on != 0; }

#define KILN_PF(p)                                                                     \
    do {                                                                               \
        if (qm_pfd_cur) _mm_prefetch((const char *)(p) + qm_pfd_cur, _MM_HINT_T0);    \
    } while (0)
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
AVX2 float qm_dot1_q4_0_avx2(const uint8_t *w, const struct q8a *a, int nb) { DOT1_BODY(DOTI_Q4_AVX2) }
VNNI float qm_dot1_q4_0_vnni(const uint8_t *w, const struct q8a *a, int nb) { DOT1_BODY(DOTI_Q4_VNNI) }
#undef BS
#define BS 34
AVX2 float qm_dot1_q8_0_avx2(const uint8_t *w, const struct q8a *a, int nb) { DOT1_BODY(DOTI_Q8_AVX2) }
VNNI float qm_dot1_q8_0_vnni(const uint8_t *w, const struct q8a *a, int nb) { DOT1_BODY(DOTI_Q8_VNNI) }
#undef BS

/* The f16 scales of 8 consecutive blocks of BS bytes (a block's first two
 * bytes), as 8 f16 lanes: two 64-bit words built from 16-bit loads on the
 * integer ALUs (which the dot-product loops leave idle), moved into one xmm.
 * Built byte by byte (the earlier `w[o] | w[o + 1] << 8`), GCC emitted 16
 * byte loads, 8 shifts and 8 ors per 8 blocks, about as many instructions
 * as the dot products of those blocks (0.6B Q4_0 tg128 on AVX2: 82.6 / 85.3
 * -> 90.8 / 91.5 tok/s with 16-bit inserts from memory; the 64-bit words
 * take fewer vector-load slots: Q4_0 decode on one core in L2 37.7 -> 39.5
 * GMAC/s). An AVX2 gather of the 8 words measured slower (73.8 / 76.4). */
AVX2 static inline int ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
AVX2 static inline __m128i scales8_f16(const uint8_t *p, int bs) {
    const uint64_t lo = (uint64_t)ld16(p) | (uint64_t)ld16(p + bs) << 16 | (uint64_t)ld16(p + 2 * bs) << 32 | (uint64_t)ld16(p + 3 * bs) << 48;
    const uint64_t hi = (uint64_t)ld16(p + 4 * bs) | (uint64_t)ld16(p + 5 * bs) << 16 | (uint64_t)ld16(p + 6 * bs) << 32 | (uint64_t)ld16(p + 7 * bs) << 48;
    return _mm_unpacklo_epi64(_mm_cvtsi64_si128((long long)lo), _mm_cvtsi64_si128((long long)hi));
}

/* Decode with VNNI, 8 blocks per step: the 8 weight scales are gathered
 * into one vector (pinsrw + vcvtph2ps) and multiplied by the 8 activation
 * scales (xd, contiguous) at once, then broadcast per block with vpermps;
 * the -8 / -128 x sum offset comes in as the dpbusd accumulator, a vector
 * precomputed per call (corr), so a block costs its unpack, one vpdpbusd,
 * a convert, a permute and an FMA. */
#define DOT1V_BODY(CODES, OFS)                                                                           \
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}; \
    int i = 0;                                                                                           \
    for (; i + 8 <= nb; i += 8) {                                                                        \
        KILN_PF(w + (size_t)BS * i);                                                                     \
        KILN_PF(w + (size_t)BS * i + 64);                                                                \
        KILN_PF(w + (size_t)BS * i + 128);                                                               \
        const __m128i h = scales8_f16(w + (size_t)BS * i, BS);                                           \
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
#define BS 18
VNNI float qm_dot1v_q4_0(const uint8_t *w, const __m256i *corr, const float *xd, const struct q8a *a, int nb) { DOT1V_BODY(q4_codes, 8) }
#undef BS
#define BS 34
VNNI float qm_dot1v_q8_0(const uint8_t *w, const __m256i *corr, const float *xd, const struct q8a *a, int nb) { DOT1V_BODY(Q8U_CODES, 128) }
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
 * in another order (two accumulators). */
#define PF8(p, bytes) \
    for (int o_ = 0; o_ < (bytes); o_ += 64) KILN_PF((p) + o_)
#define BS 34
/* Q8_0 over nx <= NX activation rows (nx = 1: decode, 2-7: decode of that
 * many sequences): a block's |w| once, each row's x signed by w, each row's
 * xd; v[t] row t's sum as 8 lanes (reduced by the caller) */
AVX2 static inline __attribute__((always_inline)) void rowm_q8_0_(const uint8_t *w, const float *const *xd, const struct q8a *const *a, int nb,
                                                                  int nx, __m256 *v) {
    __m256 acc0[NX], acc1[NX];
    #pragma GCC unroll 4
    for (int t = 0; t < NX; t++) acc0[t] = acc1[t] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= nb; i += 8) {
        const uint8_t *wi = w + (size_t)BS * i;
        PF8(wi, 8 * BS);
        const __m256 ws = _mm256_cvtph_ps(scales8_f16(wi, BS));
        __m256 dd[NX];
        #pragma GCC unroll 4
        for (int t = 0; t < nx; t++) dd[t] = _mm256_mul_ps(ws, _mm256_loadu_ps(xd[t] + i));
        #pragma GCC unroll 8
        for (int u = 0; u < 8; u++) {
            const __m256i qw = _mm256_loadu_si256((const __m256i *)(wi + (size_t)BS * u + 2)), aw = _mm256_sign_epi8(qw, qw);
            #pragma GCC unroll 4
            for (int t = 0; t < nx; t++) {
                const __m256i p = i8dot_sign_avx2(aw, qw, XQS(a[t] + i + u));
                const __m256 f = _mm256_cvtepi32_ps(p), sc = _mm256_permutevar8x32_ps(dd[t], _mm256_set1_epi32(u));
                if (u & 1) acc1[t] = _mm256_fmadd_ps(f, sc, acc1[t]);
                else acc0[t] = _mm256_fmadd_ps(f, sc, acc0[t]);
            }
        }
    }
    for (; i < nb; i++) {
        const uint8_t *bw = w + (size_t)BS * i;
        #pragma GCC unroll 4
        for (int t = 0; t < nx; t++)
            acc0[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOTI_Q8_AVX2(bw, a[t] + i)), _mm256_set1_ps(h2f_c(bw) * a[t][i].d), acc0[t]);
    }
    #pragma GCC unroll 4
    for (int t = 0; t < nx; t++) v[t] = _mm256_add_ps(acc0[t], acc1[t]);
}

/* one row (decode) */
AVX2 static inline __attribute__((always_inline)) __m256 rowa_q8_0(const uint8_t *w, const float *xd, const struct q8a *a, int nb) {
    __m256 v;
    rowm_q8_0_(w, &xd, &a, nb, 1, &v);
    return v;
}

AVX2 void qm_rowm_q8_0(const uint8_t *w, const float *const *xd, const struct q8a *const *a, int nb, int nx, float *out) {
    __m256 v[NX];
    switch (nx) {
    case 1: rowm_q8_0_(w, xd, a, nb, 1, v); break;
    case 2: rowm_q8_0_(w, xd, a, nb, 2, v); break;
    case 3: rowm_q8_0_(w, xd, a, nb, 3, v); break;
    default: rowm_q8_0_(w, xd, a, nb, 4, v); break;
    }
    for (int t = 0; t < nx; t++) out[t] = kiln_hsum8(v[t]);
}
#undef BS
#define BS 18
/* Q4_0 over nx <= NX activation rows (nx = 1: decode, 2-7: decode of that
 * many sequences): a block pair's codes are unpacked once and meet each
 * row's pair vectors (x2[t], act2's layout), the 8 weight scales are
 * converted once per step, then times each row's xd, and each row's -8
 * offset is one FMA per step with its cs; v[t] row t's sum as 8 lanes */
AVX2 static inline __attribute__((always_inline)) void rowm_q4_0_(const uint8_t *w, const __m256i *const *x2, const float *const *xd,
                                                                  const float *const *cs, const struct q8a *const *a, int nb, int nx,
                                                                  __m256 *v) {
    __m256 acc0[NX], acc1[NX];
    #pragma GCC unroll 4
    for (int t = 0; t < NX; t++) acc0[t] = acc1[t] = _mm256_setzero_ps();
    const __m256i one16 = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(15);
    int i = 0;
    for (; i + 8 <= nb; i += 8) {
        const uint8_t *wi = w + (size_t)BS * i;
        PF8(wi, 8 * BS);
        const __m256 ws = _mm256_cvtph_ps(scales8_f16(wi, BS));
        __m256 dd[NX];
        #pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            dd[t] = _mm256_mul_ps(ws, _mm256_loadu_ps(xd[t] + i));
            acc1[t] = _mm256_fmadd_ps(dd[t], _mm256_loadu_ps(cs[t] + i), acc1[t]);
        }
        #pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            const uint8_t *b0 = wi + (size_t)BS * 2 * u;
            const __m256i v = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(b0 + BS + 2)), _mm_loadu_si128((const __m128i *)(b0 + 2)));
            const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            const __m256i ix = _mm256_setr_epi32(2 * u, 2 * u, 2 * u, 2 * u, 2 * u + 1, 2 * u + 1, 2 * u + 1, 2 * u + 1);
            #pragma GCC unroll 4
            for (int t = 0; t < nx; t++) {
                const __m256i *xq = x2[t] + (i + 2 * u);
                const __m256i sm = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(xq)), _mm256_maddubs_epi16(hi, _mm256_loadu_si256(xq + 1)));
                const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(sm, one16)), sc = _mm256_permutevar8x32_ps(dd[t], ix);
                if (u & 1) acc1[t] = _mm256_fmadd_ps(f, sc, acc1[t]);
                else acc0[t] = _mm256_fmadd_ps(f, sc, acc0[t]);
            }
        }
    }
    for (; i < nb; i++) {
        const uint8_t *bw = w + (size_t)BS * i;
        #pragma GCC unroll 4
        for (int t = 0; t < nx; t++)
            acc0[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOTI_Q4_AVX2(bw, a[t] + i)), _mm256_set1_ps(h2f_c(bw) * a[t][i].d), acc0[t]);
    }
    #pragma GCC unroll 4
    for (int t = 0; t < nx; t++) v[t] = _mm256_add_ps(acc0[t], acc1[t]);
}

/* one row (decode) */
AVX2 static inline __attribute__((always_inline)) __m256 rowa_q4_0(const uint8_t *w, const __m256i *x2, const float *xd, const float *cs,
                                                                   const struct q8a *a, int nb) {
    __m256 v;
    rowm_q4_0_(w, &x2, &xd, &cs, &a, nb, 1, &v);
    return v;
}

AVX2 void qm_rowm_q4_0(const uint8_t *w, const __m256i *const *x2, const float *const *xd, const float *const *cs, const struct q8a *const *a,
                       int nb, int nx, float *out) {
    __m256 v[NX];
    switch (nx) {
    case 1: rowm_q4_0_(w, x2, xd, cs, a, nb, 1, v); break;
    case 2: rowm_q4_0_(w, x2, xd, cs, a, nb, 2, v); break;
    case 3: rowm_q4_0_(w, x2, xd, cs, a, nb, 3, v); break;
    default: rowm_q4_0_(w, x2, xd, cs, a, nb, 4, v); break;
    }
    for (int t = 0; t < nx; t++) out[t] = kiln_hsum8(v[t]);
}
#undef BS

/* Q4_K / Q5_K decode (one activation row), a superblock (256 weights, 144
 * or 176 bytes) per step. The 8 six-bit scales and 8 mins are unpacked with
 * four 32-bit masks (bytes 0-3 hold scales 0-3 and the top bits of scales
 * 4-7, bytes 4-7 mins 0-3 and the top bits of mins 4-7, bytes 8-11 the low
 * nibbles of scales 4-7 and mins 4-7), converted as one vector each: the
 * sub-block scales d sc_s xd_b enter as one vector per superblock (vpermps
 * per sub-block), and the mins part dmin m_s xd_b sum_b as one FMA with
 * xs_b = xd_b sum_b, precomputed per call. A sub-block's 32 codes (Q5_K:
 * with bit 4 from the 32-byte plane qh, bit 2c / 2c+1 of byte l for weight
 * l of sub-block 2c / 2c+1) meet their activations in one maddubs + madd.
 * The same products as dot_q4_k_scalar / dot_q5_k_scalar, summed in
 * another order. These are the Q4_K / Q5_K kernels on x86 at every n (the
 * K formats have no int8 GEMM). */
AVX2 static inline __attribute__((always_inline)) void kq_scales(const uint8_t *w, __m256 *sc, __m256 *mi) {
    uint32_t u[3];
    memcpy(u, w + 4, 12);
    const uint32_t s03 = u[0] & 0x3f3f3f3fu, m03 = u[1] & 0x3f3f3f3fu;
    const uint32_t s47 = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    const uint32_t m47 = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    *sc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)((uint64_t)s47 << 32 | s03)))),
                        _mm256_set1_ps(h2f_c(w)));
    *mi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)((uint64_t)m47 << 32 | m03)))),
                        _mm256_set1_ps(h2f_c(w + 2)));
}
/* the codes of sub-blocks 2c (lo) and 2c + 1 (hi) as unsigned bytes */
AVX2 static inline __attribute__((always_inline)) void kq_codes(const uint8_t *w, int q5, int c, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i b = _mm256_loadu_si256((const __m256i *)(w + (q5 ? 48 : 16) + 32 * c));
    *lo = _mm256_and_si256(b, m4), *hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
    if (q5) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 16)), m1 = _mm256_set1_epi8(1);
        *lo = _mm256_or_si256(*lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), m1), 4));
        *hi = _mm256_or_si256(*hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), m1), 4));
    }
}
AVX2 static inline __attribute__((always_inline)) __m256 rowk_qk(const uint8_t *w, const float *xd, const float *xs, const struct q8a *a,
                                                                 int nsb, int q5) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), mn = _mm256_setzero_ps();
    const __m256i one16 = _mm256_set1_epi16(1);
    const int bs = q5 ? 176 : 144;
    for (int i = 0; i < nsb; i++, w += bs) {
        PF8(w, bs);
        __m256 sc, mi;
        kq_scales(w, &sc, &mi);
        const __m256 dd = _mm256_mul_ps(sc, _mm256_loadu_ps(xd + 8 * i));
        mn = _mm256_fmadd_ps(mi, _mm256_loadu_ps(xs + 8 * i), mn);
        const struct q8a *x = a + 8 * i;
        #pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i lo, hi;
            kq_codes(w, q5, c, &lo, &hi);
            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, XQS(x + 2 * c)), one16);
            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, XQS(x + 2 * c + 1)), one16);
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_permutevar8x32_ps(dd, _mm256_set1_epi32(2 * c)), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_permutevar8x32_ps(dd, _mm256_set1_epi32(2 * c + 1)), acc1);
        }
    }
    return _mm256_sub_ps(_mm256_add_ps(acc0, acc1), mn);
}

/* Q4_K / Q5_K over nx <= 4 activation rows (prefill's row dots): rowk_qk's
 * superblock step with the scales unpacked once for the nx rows; each row
 * brings its own xd / xs (per call, [token][block]) and its mins part is
 * taken off its accumulator per superblock */
AVX2 static inline __attribute__((always_inline)) void dotk_qk_(const uint8_t *w, const struct q8a *const *a, const float *const *xd,
                                                                const float *const *xs, int nx, int nsb, int q5, float *out) {
    __m256 acc[NX];
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    const __m256i one16 = _mm256_set1_epi16(1);
    const int bs = q5 ? 176 : 144;
    for (int i = 0; i < nsb; i++, w += bs) {
        PF8(w, bs);
        __m256 sc, mi, dd[NX];
        kq_scales(w, &sc, &mi);
        #pragma GCC unroll 4
        for (int j = 0; j < nx; j++) {
            dd[j] = _mm256_mul_ps(sc, _mm256_loadu_ps(xd[j] + 8 * i));
            acc[j] = _mm256_fnmadd_ps(mi, _mm256_loadu_ps(xs[j] + 8 * i), acc[j]);
        }
        #pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i lo, hi;
            kq_codes(w, q5, c, &lo, &hi);
            #pragma GCC unroll 4
            for (int j = 0; j < nx; j++) {
                const struct q8a *x = a[j] + 8 * i + 2 * c;
                const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, XQS(x)), one16);
                const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, XQS(x + 1)), one16);
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_permutevar8x32_ps(dd[j], _mm256_set1_epi32(2 * c)), acc[j]);
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_permutevar8x32_ps(dd[j], _mm256_set1_epi32(2 * c + 1)), acc[j]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]);
}
AVX2 void qm_dotk_qk(const uint8_t *w, const struct q8a *const *a, const float *const *xd, const float *const *xs, int nx, int nsb, int q5,
                     float *out) {
#define DOTK_CASE(NXC)                                                                 \
    if (q5) dotk_qk_(w, a, xd, xs, NXC, nsb, 1, out);                                  \
    else dotk_qk_(w, a, xd, xs, NXC, nsb, 0, out);                                     \
    break;
    switch (nx) {
    case 1: DOTK_CASE(1)
    case 2: DOTK_CASE(2)
    case 3: DOTK_CASE(3)
    default: DOTK_CASE(4)
    }
#undef DOTK_CASE
}
/* Q6_K decode, one row's sum as 8 lanes: per superblock the 16 scales x d
 * as two vectors (dot_q6_k_avx2's sv), times each block's activation scale
 * (xd, 8 per superblock, each repeated for the block's two halves: one
 * vpermps per half superblock), so a block needs one vpermps and one FMA
 * after its integer dot; the weight stream prefetched as rowk_qk's */
AVX2 static inline __attribute__((always_inline)) __m256 rowk_q6k(const uint8_t *w, const float *xd, const struct q8a *a, int nsb) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32), one16 = _mm256_set1_epi16(1);
    for (int i = 0; i < nsb; i++, w += 210) {
        PF8(w, 210);
        const __m256 d = _mm256_set1_ps(h2f_c(w + 208)), xv = _mm256_loadu_ps(xd + 8 * i);
        const __m128i s16 = _mm_loadu_si128((const __m128i *)(w + 192));
        const __m256 sx[2] = {
            _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s16)), d),
                          _mm256_permutevar8x32_ps(xv, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3))),
            _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s16, 8))), d),
                          _mm256_permutevar8x32_ps(xv, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)))};
        const struct q8a *x = a + 8 * i;
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h)), ql1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            const __m256i lo[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
            #pragma GCC unroll 4
            for (int s4 = 0; s4 < 4; s4++) {
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * s4), m3);
                const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo[s4], _mm256_slli_epi16(hi, 4)), m32); /* -32..31 */
                const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(XQS(x + 4 * h + s4), q)), one16);
                const __m256 sc = _mm256_permutevar8x32_ps(sx[h], _mm256_setr_epi32(2 * s4, 2 * s4, 2 * s4, 2 * s4, 2 * s4 + 1, 2 * s4 + 1,
                                                                                    2 * s4 + 1, 2 * s4 + 1));
                if (s4 & 1) acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc1);
                else acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc0);
            }
        }
    }
    return _mm256_add_ps(acc0, acc1);
}

/* Q6_K over nx <= NX activation rows (decode of 2-7 sequences): rowk_q6k's
 * step with a 32-weight group's codes unpacked once for the nx rows; each
 * row brings its own activation scales (xd[t], [block]) */
AVX2 static inline __attribute__((always_inline)) void dotk_q6k_(const uint8_t *w, const struct q8a *const *a, const float *const *xd, int nx,
                                                                 int nsb, float *out) {
    __m256 acc[NX];
    for (int j = 0; j < NX; j++) acc[j] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
    for (int i = 0; i < nsb; i++, w += 210) {
        PF8(w, 210);
        const __m256 d = _mm256_set1_ps(h2f_c(w + 208));
        const __m128i s16 = _mm_loadu_si128((const __m128i *)(w + 192));
        const __m256 sd[2] = {_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s16)), d),
                              _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s16, 8))), d)};
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 sx[NX];
            #pragma GCC unroll 4
            for (int j = 0; j < nx; j++)
                sx[j] = _mm256_mul_ps(sd[h], _mm256_permutevar8x32_ps(_mm256_loadu_ps(xd[j] + 8 * i),
                                                                      _mm256_setr_epi32(4 * h, 4 * h, 4 * h + 1, 4 * h + 1, 4 * h + 2,
                                                                                        4 * h + 2, 4 * h + 3, 4 * h + 3)));
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h)), ql1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            #pragma GCC unroll 4
            for (int s4 = 0; s4 < 4; s4++) {
                const __m256i lo = _mm256_and_si256(s4 & 2 ? _mm256_srli_epi16(s4 & 1 ? ql1 : ql0, 4) : (s4 & 1 ? ql1 : ql0), m4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * s4), m3);
                const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), m32); /* -32..31 */
                const __m256i aq = _mm256_sign_epi8(q, q);
                const __m256i ix = _mm256_setr_epi32(2 * s4, 2 * s4, 2 * s4, 2 * s4, 2 * s4 + 1, 2 * s4 + 1, 2 * s4 + 1, 2 * s4 + 1);
                #pragma GCC unroll 4
                for (int j = 0; j < nx; j++) {
                    const __m256i p = i8dot_sign_avx2(aq, q, XQS(a[j] + 8 * i + 4 * h + s4));
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_permutevar8x32_ps(sx[j], ix), acc[j]);
                }
            }
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < nx; j++) out[j] = kiln_hsum8(acc[j]);
}
AVX2 void qm_dotk_q6k(const uint8_t *w, const struct q8a *const *a, const float *const *xd, int nx, int nsb, float *out) {
    switch (nx) {
    case 1: dotk_q6k_(w, a, xd, 1, nsb, out); break;
    case 2: dotk_q6k_(w, a, xd, 2, nsb, out); break;
    case 3: dotk_q6k_(w, a, xd, 3, nsb, out); break;
    default: dotk_q6k_(w, a, xd, 4, nsb, out); break;
    }
}

#define ROW_Q6K(r) rowk_q6k(W + (size_t)(r) * rb, xd, a, nsb)
AVX2 void qm_rowsk_q6k(const uint8_t *W, size_t rb, int64_t n, const float *xd, const struct q8a *a, int nsb, float *out) {
    QM_ROWS4(ROW_Q6K, n, out);
}
#undef PF8

#define ROW_Q4K(r) rowk_qk(W + (size_t)(r) * rb, xd, xs, a, nsb, 0)
#define ROW_Q5K(r) rowk_qk(W + (size_t)(r) * rb, xd, xs, a, nsb, 1)
AVX2 void qm_rowsk_qk(const uint8_t *W, size_t rb, int64_t n, const float *xd, const float *xs, const struct q8a *a, int nsb, int q5,
                      float *out) {
    if (q5) QM_ROWS4(ROW_Q5K, n, out);
    else QM_ROWS4(ROW_Q4K, n, out);
}
#undef ROW_Q4K
#undef ROW_Q5K
#define ROW_Q8(r) rowa_q8_0(W + (size_t)(r) * rb, xd, a, nb)
#define ROW_Q4(r) rowa_q4_0(W + (size_t)(r) * rb, (const __m256i *)act2, xd, cs, a, nb)
AVX2 void qm_rowsa_q8_0(const uint8_t *W, size_t rb, int64_t n, const float *xd, const struct q8a *a, int nb, float *out) { QM_ROWS4(ROW_Q8, n, out); }
AVX2 void qm_rowsa_q4_0(const uint8_t *W, size_t rb, int64_t n, const void *act2, const float *xd, const float *cs, const struct q8a *a, int nb,
                        float *out) {
    QM_ROWS4(ROW_Q4, n, out);
}
#undef ROW_Q8
#undef ROW_Q4

/* the 16 lanes of v added pairwise into 8 (lanes l and l + 8) */
VNNI static inline __m256 fold16(__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* Q4_0 decode with AVX-512 VNNI, two blocks per zmm: the 2 x 16 code bytes
 * are unpacked into [block i low 16 | block i+1 low 16 | i high | i+1 high]
 * and the activations were laid out the same way once per call (act2), so
 * one vpdpbusd, convert, permute and FMA serve two blocks; the offsets
 * -8 x sum sit in lanes 0 and 4 of the precomputed accumulator (corr2). */
VNNI float qm_dot1z_q4_0(const uint8_t *w, const __m512i *corr2, const __m512i *act2, const float *xd, const struct q8a *a, int nb) {
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

/* Q8_0 decode with AVX-512 VNNI, two blocks per zmm: the 2 x 32 code bytes
 * (two 32-byte loads, +128 to make them unsigned) against the two blocks'
 * activation codes laid out back to back once per call (act2: [x_b | x_b+1]),
 * -128 x sum of each block in lanes 0 and 8 of the starting accumulator
 * (corr2); lanes 0..7 hold block b's integer sum, 8..15 block b+1's, scaled
 * by a permute of the 8 block scales. Per 2 blocks: 2 loads, insert, xor,
 * vpdpbusd, permute, convert, FMA (qm_dot1v_q8_0: 2 x (xor, vpdpbusd, permute,
 * convert, FMA) on 256-bit halves). Integer block sums are unchanged. */
VNNI static inline __attribute__((always_inline)) __m256 roww_q8_0(const uint8_t *w, const __m512i *corr2, const __m512i *act2, const float *xd,
                                                                   const struct q8a *a, int nb) {
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
        const __m128i h = scales8_f16(w + (size_t)BS * i, BS);
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
    __m256 t = fold16(_mm512_add_ps(acc0, acc1));
    for (; i < nb; i++) {
        const uint8_t *bw = w + (size_t)BS * i;
        __m256i sm = _mm256_dpbusd_epi32(lane0(-128 * a[i].sum), Q8U_CODES(bw), XQS(a + i));
        t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sm), _mm256_set1_ps(h2f_c(bw) * xd[i]), t);
    }
    return t;
}
VNNI void qm_rowsw_q8_0(const uint8_t *W, size_t rb, int64_t n, const __m512i *corr2, const __m512i *act2, const float *xd, const struct q8a *a,
                        int nb, float *out) {
#define ROW(r) roww_q8_0(W + (size_t)(r) * rb, corr2, act2, xd, a, nb)
    QM_ROWS1(ROW, n, out);
#undef ROW
}

/* Q4_0 decode with AVX-512 VNNI + VBMI, four blocks per zmm: one vpermt2b
 * gathers the 4 x 16 code bytes of blocks 4g..4g+3 out of two 64-byte
 * loads (the 18-byte blocks straddle them), their low nibbles (weights
 * 0..15 of each block) and high nibbles (16..31) feed two vpdpbusd into the
 * same accumulator against the activations laid out to match once per call
 * (act4: [g][lo: x_b[0..15] of the 4 blocks | hi: x_b[16..31]]); lanes 4k..
 * 4k+3 hold block 4g+k's integer sum, the -8 x sum offset sits in lane 4k
 * of the starting accumulator (corr4). Per 8 blocks: 3 loads, the scale
 * gather as in qm_dot1z_q4_0, 2 byte permutes, 4 nibble ops, 4 vpdpbusd, then
 * 2 x (permute of the scales, convert, FMA): about half the vector ops of
 * qm_dot1z_q4_0 (two blocks per zmm), whose per-core rate (~35 GB/s of Q4_0
 * in L2) was barely above what one core streams from DRAM. Integer block
 * sums are the same; only the order of the f32 sums differs. */
/* byte indices into [64-byte load A | load B] of the 4 x 16 code bytes:
 * blocks 0..3 from A = w, B = w + 64 (code bytes at 2 + 18 k + j);
 * blocks 4..7 from A = w + 64, B = w + 128 (at 74 + 18 k + j: from A
 * below 128, else B's byte - 128 + 64) */
static const uint8_t q4q_i0[64] __attribute__((aligned(64))) = {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71};
static const uint8_t q4q_i1[64] __attribute__((aligned(64))) = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79};

/* One row's sum as 8 lanes (the caller reduces them: kiln_hsum8x4, as the
 * AVX2 row kernels, so rows are looped over and reduced four at a time). */
VBMI static inline __attribute__((always_inline)) __m256 rowq_q4_0(const uint8_t *w, const __m512i *corr4, const __m512i *act4, const float *xd,
                                                                   const struct q8a *a, int nb, __m512i c0, __m512i c1) {
    enum { BS = 18 };
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i idx9 = _mm512_setr_epi32(0x90000, 0x1b0012, 0x2d0024, 0x3f0036, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
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
    __m256 t = fold16(_mm512_add_ps(acc0, acc1));
    for (; i < nb; i++) {
        const uint8_t *bw = w + (size_t)BS * i;
        __m256i sm = _mm256_dpbusd_epi32(lane0(-8 * a[i].sum), q4_codes(bw), XQS(a + i));
        t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sm), _mm256_set1_ps(h2f_c(bw) * xd[i]), t);
    }
    return t;
}
VBMI void qm_rowsq_q4_0(const uint8_t *W, size_t rb, int64_t n, const __m512i *corr4, const __m512i *act4, const float *xd, const struct q8a *a,
                        int nb, float *out) {
    const __m512i c0 = _mm512_load_si512(q4q_i0), c1 = _mm512_load_si512(q4q_i1);
#define ROW(r) rowq_q4_0(W + (size_t)(r) * rb, corr4, act4, xd, a, nb, c0, c1)
    QM_ROWS1(ROW, n, out);
#undef ROW
}

/* ==== Q4_0 and Q8_0 in groups of 16 rows (qmatmul_internal.h, "Q4_0 and
 * Q8_0 in groups of 16 rows") ====
 *
 * Per block the integer sums of the 16 rows for each of the nt tokens
 * (x16_isum_* / x16_isum8_*: one 64-byte load is 16 rows x 4 codes, one
 * vpdpbusd or maddubs per token against a broadcast of its 4 activation
 * codes, started at -8 (Q8_0 on VNNI: -128) x the block's code sum), then
 * per token one convert and one FMA with the 16 scales times its block
 * scale. nt is up to 8 on VNNI (the prefill tiles; 1 is decode), 2 on AVX2.
 * A prefill call passes the codes pre-split in a per-thread panel (P).
 *
 * Measured (one Zen 4 core, K 1024 x N 2048 in L2, decode): Q4_0 90-104
 * Gweights/s against 44 for qm_rowsq_q4_0 on the stored blocks (AVX2 59-68
 * against 31 for qm_rowsa_q4_0); Q8_0 58-79 against 28 (AVX2 34 against
 * 24). */
/* a block's BB bytes ahead of the stream, as KILN_PF */
#define X16_PF(p, BB)                                                                                \
    do {                                                                                             \
        for (int o_ = 0; o_ < (BB); o_ += 64) KILN_PF((p) + o_);                                     \
    } while (0)
#define X16_PFK(p, BB)                                                                               \
    do {                                                                                             \
        for (int o_ = 0; o_ < (BB); o_ += 64) X16_PF1((p) + o_);                                     \
    } while (0)
/* one line of a group: into L1 qm_pfd_cur ahead, and into L2 qm_pf2_cur ahead */
#define X16_PF1(q)                                                                                   \
    do {                                                                                             \
        KILN_PF(q);                                                                                  \
        if (qm_pf2_cur) _mm_prefetch((const char *)(q) + qm_pf2_cur, _MM_HINT_T1);                   \
    } while (0)
/* every group kernel's end: T tokens' sums for the group's 16 rows, plus
 * the bias, to out (rows ldo apart); VNNI one zmm per token, AVX2 two
 * halves of 8 */
VNNI static inline __attribute__((always_inline)) void x16_out_vnni(const __m512 *acc, int T, float *out, size_t ldo, const float *bias) {
    const __m512 bv = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    #pragma GCC unroll 8
    for (int t = 0; t < T; t++) _mm512_storeu_ps(out + (size_t)t * ldo, _mm512_add_ps(acc[t], bv));
}
AVX2 static inline __attribute__((always_inline)) void x16_out_avx2(__m256 (*acc)[2], int T, float *out, size_t ldo, const float *bias) {
    #pragma GCC unroll 2
    for (int e = 0; e < 2; e++) {
        const __m256 bv = bias ? _mm256_loadu_ps(bias + 8 * e) : _mm256_setzero_ps();
        #pragma GCC unroll 2
        for (int t = 0; t < T; t++) _mm256_storeu_ps(out + (size_t)t * ldo + 8 * e, _mm256_add_ps(acc[t][e], bv));
    }
}
/* fmt (X16_*) a constant: Q4_0 / Q5_0 take the offset from c8 (-8 / -16 x
 * the code sum), type-1 Q4_1 / Q5_1 read c8 as f32 xd x code sum for the
 * term of m */
VNNI static inline __attribute__((always_inline)) void x16_vnni_(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *c8, int NT,
                                                                 int nb, int T, int fmt, float *out, size_t ldo, const float *bias) {
    const int q8 = fmt == X16_Q8, t1 = x16_t1(fmt), five = x16_five(fmt), BB = x16_bb(fmt), C = q8 ? 32 : x16t_codes(t1);
    const float *xs = (const float *)c8;
    __m512 acc[8];
    #pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *p = G + (size_t)BB * b;
        if (!P) X16_PF(p, BB);
        const struct q8a *x = xt + (size_t)b * NT;
        const uint8_t *c = P ? P + 512 * (size_t)b : p + C;
        __m512i s[8];
        if (q8) x16_isum8_vnni(c, P != NULL, x, c8 + (size_t)b * NT, T, s); /* sum q x */
        else if (fmt == X16_IQ4) x16_isum_iq4_vnni(c, P != NULL, x, c8 + (size_t)b * NT, T, s); /* sum kv[q] x */
        else x16_isum_vnni(c, P != NULL, five ? p + C + 256 : NULL, x, t1 ? NULL : c8 + (size_t)b * NT, T, s); /* sum (q - 8) x, ... */
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(d, _mm512_set1_ps(x[t].d)), acc[t]);
            if (t1) acc[t] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32))), _mm512_set1_ps(xs[(size_t)b * NT + t]), acc[t]);
        }
    }
    x16_out_vnni(acc, T, out, ldo, bias);
}

/* the kernel with nt (1..8) and the format as constants */
#define X16_BY_NT(CALL)          \
    switch (nt) {                \
    case 1: CALL(1); break;      \
    case 2: CALL(2); break;      \
    case 3: CALL(3); break;      \
    case 4: CALL(4); break;      \
    case 5: CALL(5); break;      \
    case 6: CALL(6); break;      \
    case 7: CALL(7); break;      \
    default: CALL(8); break;     \
    }
VNNI void qm_x16_vnni(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *c8, int NT, int nt, int nb, int fmt, float *out,
                      size_t ldo, const float *bias) {
#define X16C(F, T) x16_vnni_(G, P, xt, c8, NT, nb, T, F, out, ldo, bias)
#define Q4C(T) X16C(X16_Q4, T)
#define Q8C(T) X16C(X16_Q8, T)
#define Q41C(T) X16C(X16_Q41, T)
#define Q50C(T) X16C(X16_Q50, T)
#define Q51C(T) X16C(X16_Q51, T)
#define IQ4C(T) X16C(X16_IQ4, T)
    switch (fmt) {
    case X16_Q8: X16_BY_NT(Q8C) break;
    case X16_IQ4: X16_BY_NT(IQ4C) break;
    case X16_Q41: X16_BY_NT(Q41C) break;
    case X16_Q50: X16_BY_NT(Q50C) break;
    case X16_Q51: X16_BY_NT(Q51C) break;
    default: X16_BY_NT(Q4C) break;
    }
#undef X16C
#undef Q4C
#undef Q8C
#undef Q41C
#undef Q50C
#undef Q51C
#undef IQ4C
}

/* AVX2: the same sums, 16 rows as two halves of 8 (a chunk's first and
 * second 32 bytes), nt <= 2 tokens (x16_isum_avx2, x16_isum8_avx2: Q8_0's
 * codes as they are, so no offset and no panel) */
AVX2 static inline __attribute__((always_inline)) void x16_avx2_(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *c8, int NT,
                                                                 int nb, int T, int fmt, float *out, size_t ldo, const float *bias) {
    const int q8 = fmt == X16_Q8, t1 = x16_t1(fmt), five = x16_five(fmt), BB = x16_bb(fmt), C = q8 ? 32 : x16t_codes(t1);
    const float *xs = (const float *)c8;
    __m256 acc[2][2];
    #pragma GCC unroll 2
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *p = G + (size_t)BB * b;
        if (!P) X16_PF(p, BB);
        const struct q8a *x = xt + (size_t)b * NT;
        __m256i s[2][2];
        if (q8) x16_isum8_avx2(p + 32, x, T, s);
        else if (fmt == X16_IQ4) x16_isum_iq4_avx2(P ? P + 512 * (size_t)b : p + C, P != NULL, x, T, s);
        else x16_isum_avx2(P ? P + 512 * (size_t)b : p + C, P != NULL, five, p + C + 256, x, t1 ? NULL : c8 + (size_t)b * NT, T, s);
        #pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * e)));
            #pragma GCC unroll 2
            for (int t = 0; t < T; t++) {
                acc[t][e] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t][e]), _mm256_mul_ps(d, _mm256_set1_ps(x[t].d)), acc[t][e]);
                if (t1)
                    acc[t][e] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * e))), _mm256_set1_ps(xs[(size_t)b * NT + t]),
                                                acc[t][e]);
            }
        }
    }
    x16_out_avx2(acc, T, out, ldo, bias);
}

AVX2 void qm_x16_avx2(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *c8, int NT, int nt, int nb, int fmt, float *out,
                      size_t ldo, const float *bias) {
#define X16A(F)                                                                  \
    case F:                                                                      \
        if (nt == 1) x16_avx2_(G, F == X16_Q8 ? NULL : P, xt, c8, NT, nb, 1, F, out, ldo, bias); \
        else x16_avx2_(G, F == X16_Q8 ? NULL : P, xt, c8, NT, nb, 2, F, out, ldo, bias);         \
        break;
    switch (fmt) {
        X16A(X16_Q4)
        X16A(X16_Q8)
        X16A(X16_Q41)
        X16A(X16_Q50)
        X16A(X16_Q51)
        X16A(X16_IQ4)
    }
#undef X16A
}

/* IQ4_XS in groups (qmatmul_internal.h): per superblock and sub-block j,
 * IQ4_NL's block sums (x16_isum_iq4_*), times the 16 rows' int8 scales
 * (vpmulld: exact), one convert and one FMA with d xd_j per token */
VNNI static inline __attribute__((always_inline)) void x16iq_vnni_(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *c8,
                                                                   int NT, int nsb, int T, float *out, size_t ldo, const float *bias) {
    __m512 acc[8];
    #pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int i = 0; i < nsb; i++) {
        const uint8_t *p = G + (size_t)IQX_BB * i;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        for (int j = 0; j < 8; j++) {
            const size_t b = (size_t)8 * i + j;
            if (!P)
                for (int o = 276 * j; o < 276 * j + 276 && o < IQX_BB; o += 64) X16_PF1(p + o); /* the superblock's lines, spread over its sub-blocks */
            __m512i s[8];
            x16_isum_iq4_vnni(P ? P + 512 * b : p + 160 + 256 * j, P != NULL, xt + b * NT, c8 + b * NT, T, s);
            const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * j)));
            #pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_mullo_epi32(s[t], sc)), _mm512_mul_ps(d, _mm512_set1_ps(xt[b * NT + t].d)), acc[t]);
        }
    }
    x16_out_vnni(acc, T, out, ldo, bias);
}

VNNI void qm_x16iq_vnni(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *c8, int NT, int nt, int nsb, float *out,
                        size_t ldo, const float *bias) {
#define IQC(T) x16iq_vnni_(G, P, xt, c8, NT, nsb, T, out, ldo, bias)
    X16_BY_NT(IQC)
#undef IQC
}

AVX2 static inline __attribute__((always_inline)) void x16iq_avx2_(const uint8_t *G, const uint8_t *P, const struct q8a *xt, int NT, int nsb, int T,
                                                                   float *out, size_t ldo, const float *bias) {
    __m256 acc[2][2];
    #pragma GCC unroll 2
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int i = 0; i < nsb; i++) {
        const uint8_t *p = G + (size_t)IQX_BB * i;
        for (int j = 0; j < 8; j++) {
            const size_t b = (size_t)8 * i + j;
            if (!P)
                for (int o = 276 * j; o < 276 * j + 276 && o < IQX_BB; o += 64) X16_PF1(p + o);
            __m256i s[2][2];
            x16_isum_iq4_avx2(P ? P + 512 * b : p + 160 + 256 * j, P != NULL, xt + b * NT, T, s);
            #pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * e)));
                const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 32 + 16 * j + 8 * e)));
                #pragma GCC unroll 2
                for (int t = 0; t < T; t++)
                    acc[t][e] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(s[t][e], sc)), _mm256_mul_ps(d, _mm256_set1_ps(xt[b * NT + t].d)),
                                                acc[t][e]);
            }
        }
    }
    x16_out_avx2(acc, T, out, ldo, bias);
}

AVX2 void qm_x16iq_avx2(const uint8_t *G, const uint8_t *P, const struct q8a *xt, int NT, int nt, int nsb, float *out, size_t ldo,
                        const float *bias) {
    if (nt == 1) x16iq_avx2_(G, P, xt, NT, nsb, 1, out, ldo, bias);
    else x16iq_avx2_(G, P, xt, NT, nsb, 2, out, ldo, bias);
}

/* Q4_K (and Q5_K: q5, its fifth bits merged from the qh chunks) in groups
 * of 16 rows (qmatmul_internal.h): per superblock and
 * sub-block j (pair c = j / 2, nibble h = j % 2), the pair's 8 chunks give
 * the sub-block's codes (low or high nibbles), 8 vpdpbusd (maddubs) per
 * token against its activation block; the 16 rows' d sc_j and dmin m_j
 * convert once for all tokens. The f32 steps of q4kx_scalar, so the same
 * bits. */
VNNI static inline __attribute__((always_inline)) void x16k_vnni_(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const float *xs, int NT,
                                                                  int nsb, int T, int q5, float *out, size_t ldo, const float *bias) {
    const __m512i m4 = _mm512_set1_epi8(15), m10 = _mm512_set1_epi8(0x10);
    const int BB = q5 ? Q5X_BB : QKX_BB;
    __m512 acc[8];
    #pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int i = 0; i < nsb; i++) {
        const uint8_t *p = G + (size_t)BB * i;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)), dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const size_t b = (size_t)8 * i + j;
            const struct q8a *x = xt + b * NT;
            __m512i q[8];
            if (!P)
                for (int o = 384 * j; o < 384 * j + 384 && o < BB; o += 64) X16_PF1(p + o); /* the superblock's lines, spread over its sub-blocks */
            #pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                if (P) {
                    q[k] = _mm512_loadu_si512((const void *)(P + 4096 * (size_t)i + 512 * j + 64 * k));
                    continue;
                }
                const __m512i v = _mm512_loadu_si512((const void *)(p + 320 + 512 * (j / 2) + 64 * k));
                q[k] = j & 1 ? _mm512_and_si512(_mm512_srli_epi16(v, 4), m4) : _mm512_and_si512(v, m4);
                if (q5) { /* Q5_K: bit j of the qh chunk to bit 4 */
                    const __m512i u = _mm512_loadu_si512((const void *)(p + 2368 + 64 * k));
                    const __m512i hb = j < 4 ? _mm512_slli_epi16(u, 4 - j) : j == 4 ? u : _mm512_srli_epi16(u, j - 4);
                    q[k] = _mm512_ternarylogic_epi32(q[k], hb, m10, 0xF8); /* q | (hb & 0x10) */
                }
            }
            const __m512 dsc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 64 + 16 * j)))));
            const __m512 dmm = _mm512_mul_ps(dm, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 192 + 16 * j)))));
            #pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
                #pragma GCC unroll 4
                for (int k = 0; k < 8; k += 2) {
                    a0 = _mm512_dpbusd_epi32(a0, q[k], BC4_512(x[t].qs + 4 * k));
                    a1 = _mm512_dpbusd_epi32(a1, q[k + 1], BC4_512(x[t].qs + 4 * k + 4));
                }
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), _mm512_mul_ps(dsc, _mm512_set1_ps(x[t].d)), acc[t]);
                acc[t] = _mm512_fnmadd_ps(dmm, _mm512_set1_ps(xs[b * NT + t]), acc[t]);
            }
        }
    }
    x16_out_vnni(acc, T, out, ldo, bias);
}

VNNI void qm_x16k_vnni(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const float *xs, int NT, int nt, int nsb, int q5, float *out,
                       size_t ldo, const float *bias) {
#define KC(T) x16k_vnni_(G, P, xt, xs, NT, nsb, T, 0, out, ldo, bias)
#define K5(T) x16k_vnni_(G, P, xt, xs, NT, nsb, T, 1, out, ldo, bias)
    if (q5) X16_BY_NT(K5) else X16_BY_NT(KC)
#undef KC
#undef K5
}

/* Q4_K / Q5_K sub-block j's code bytes o .. o + 31 of group superblock p
 * (o < 512: chunk o / 64, its rows 8 (o % 64 / 32) ..): the pair's low or
 * high nibbles, and for Q5_K bit j of the qh chunk as bit 4 (0..31). The
 * AVX2 kernel and qm_x16q5_unpack both take their codes from here. */
AVX2 static inline __attribute__((always_inline)) __m256i x16k_code(const uint8_t *p, int j, int o, int q5) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 320 + 512 * (j / 2) + o));
    const __m256i lo = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(15));
    if (!q5) return lo;
    const __m256i u = _mm256_loadu_si256((const __m256i *)(p + 2368 + o));
    const __m256i hb = j < 4 ? _mm256_slli_epi16(u, 4 - j) : j == 4 ? u : _mm256_srli_epi16(u, j - 4);
    return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
}

AVX2 void qm_pack_i8_x16k(uint8_t *P, const uint8_t *G, size_t rb, int64_t ng, int r0, int nr, int nb, int q5) {
    const int nsb = nb / 8, BB = q5 ? Q5X_BB : QKX_BB;
    if (r0 >= X16_R * ng) { /* the rows past the groups */
        qm_pack_i8(P, G + (size_t)ng * nsb * BB, rb, r0 - (int)(X16_R * ng), nr, nb, 8, q5 ? PK_Q5K : PK_Q4K);
        return;
    }
    const int e = r0 % X16_R / 8; /* which half of group r0 / 16 */
    const uint8_t *g = G + (size_t)(r0 / X16_R) * nsb * BB;
    for (int b = 0; b < nb; b++) {
        const uint8_t *p = g + (size_t)BB * (b / 8);
        const int j = b % 8;
        uint8_t *d = P + (size_t)b * PK_BLOCK(PK_Q4K, 8);
        /* chunk k's 8 rows x 4 codes are the panel's quad k as it stands */
        #pragma GCC unroll 8
        for (int k = 0; k < 8; k++) _mm256_storeu_si256((__m256i *)(d + 32 * k), x16k_code(p, j, 64 * k + 32 * e, q5));
        float *sw = (float *)(d + 256);
        for (int i = 0; i < 8; i++) {
            const int r = 8 * e + i;
            sw[i] = h2f_c(p + 2 * r) * (float)p[64 + 16 * j + r];
            sw[8 + i] = h2f_c(p + 32 + 2 * r) * (float)p[192 + 16 * j + r];
        }
    }
    (void)nr; /* a half group is always 8 real rows */
}

/* AVX2: 16 rows as two halves of 8, nt <= 2; a sub-block's 8 maddubs per
 * token add in i16 (8 x 2 x 15 x 127 < 2^15), one madd */
AVX2 static inline __attribute__((always_inline)) void x16k_avx2_(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const float *xs, int NT,
                                                                  int nsb, int T, int q5, float *out, size_t ldo, const float *bias) {
    const __m256i one16 = _mm256_set1_epi16(1);
    const int BB = q5 ? Q5X_BB : QKX_BB;
    __m256 acc[2][2];
    #pragma GCC unroll 2
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int i = 0; i < nsb; i++) {
        const uint8_t *p = G + (size_t)BB * i;
        for (int j = 0; j < 8; j++) {
            const size_t b = (size_t)8 * i + j;
            const struct q8a *x = xt + b * NT;
            /* the superblock's lines spread over its sub-blocks, as the VNNI
             * kernel's: one burst of 37 at its start ran 0.6B Q4_K_M's decode
             * 7.8% slower (decode-ab, AVX2, 12 rounds) */
            if (!P)
                for (int o = 384 * j; o < 384 * j + 384 && o < BB; o += 64) X16_PF1(p + o);
            #pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                __m256i hs[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, h5[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
                #pragma GCC unroll 8
                for (int k = 0; k < 8; k++) {
                    const __m256i q = P ? _mm256_loadu_si256((const __m256i *)(P + 4096 * (size_t)i + 512 * j + 64 * k + 32 * e))
                                        : x16k_code(p, j, 64 * k + 32 * e, q5);
                    /* Q5_K's codes reach 31: i16 sums of 4 chunks (4 x 2 x 31 x 128 < 2^15) */
                    #pragma GCC unroll 2
                    for (int t = 0; t < T; t++) {
                        if (q5 && k >= 4) h5[t] = _mm256_add_epi16(h5[t], _mm256_maddubs_epi16(q, BC4_256(x[t].qs + 4 * k)));
                        else hs[t] = _mm256_add_epi16(hs[t], _mm256_maddubs_epi16(q, BC4_256(x[t].qs + 4 * k)));
                    }
                }
                const __m256 dsc = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * e))),
                                                 _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 64 + 16 * j + 8 * e)))));
                const __m256 dmm = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * e))),
                                                 _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 192 + 16 * j + 8 * e)))));
                #pragma GCC unroll 2
                for (int t = 0; t < T; t++) {
                    __m256i si = _mm256_madd_epi16(hs[t], one16);
                    if (q5) si = _mm256_add_epi32(si, _mm256_madd_epi16(h5[t], one16));
                    acc[t][e] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(dsc, _mm256_set1_ps(x[t].d)), acc[t][e]);
                    acc[t][e] = _mm256_fnmadd_ps(dmm, _mm256_set1_ps(xs[b * NT + t]), acc[t][e]);
                }
            }
        }
    }
    x16_out_avx2(acc, T, out, ldo, bias);
}

AVX2 void qm_x16k_avx2(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const float *xs, int NT, int nt, int nsb, int q5, float *out,
                       size_t ldo, const float *bias) {
    if (q5 && nt == 1) x16k_avx2_(G, P, xt, xs, NT, nsb, 1, 1, out, ldo, bias);
    else if (q5) x16k_avx2_(G, P, xt, xs, NT, nsb, 2, 1, out, ldo, bias);
    else if (nt == 1) x16k_avx2_(G, P, xt, xs, NT, nsb, 1, 0, out, ldo, bias);
    else x16k_avx2_(G, P, xt, xs, NT, nsb, 2, 0, out, ldo, bias);
}

/* one Q5_K group superblock's codes (0..31) assembled into a panel, 512
 * bytes per sub-block j at P + 512 j (the kernels' P), as qm_x16q6_unpack */
AVX2 void qm_x16q5_unpack(const uint8_t *p, uint8_t *P) {
    for (int j = 0; j < 8; j++)
        for (int o = 0; o < 512; o += 32) _mm256_storeu_si256((__m256i *)(P + 512 * j + o), x16k_code(p, j, o, 1));
}

/* Q6_K in groups of 16 rows (qmatmul_internal.h; one Zen 4 core, K 1024
 * x N 2048: 21 -> 48 Gweights/s VNNI, 21 -> 32 AVX2): per superblock and
 * sub-block j = 4h + s, its 8 chunks of codes assembled once for all
 * tokens (low 4 bits: region 2h + (s & 1) masked or shifted down by 4; top
 * 2: region h's bits 2s, 2s + 1 moved to bits 4, 5), then per token two
 * chains of 4 vpdpbusd (maddubs) started at the halves' offsets, each
 * times its half's 16 scales (vpmulld), one convert and one FMA with the
 * rows' d times the block's scale. q6x_scalar's integers and f32 steps, so
 * the same bits. */
/* Q6_K sub-block j = 4h + s's code bytes o .. o + 31 (AVX2) or o .. o + 63
 * (VNNI) of group superblock p, 0..63: the low 4 bits from region 2h + (s &
 * 1) (low nibbles for s < 2), the top 2 from bits 2s, 2s + 1 of region h
 * moved to bits 4, 5. The AVX2 kernel and qm_x16q6_unpack share the first. */
AVX2 static inline __attribute__((always_inline)) __m256i x16q6_code(const uint8_t *p, int j, int o) {
    const int h = j / 4, s = j % 4;
    const __m256i l = _mm256_loadu_si256((const __m256i *)(p + 320 + 512 * (2 * h + (s & 1)) + o));
    const __m256i u = _mm256_loadu_si256((const __m256i *)(p + 2368 + 512 * h + o));
    const __m256i lo = _mm256_and_si256(s >> 1 ? _mm256_srli_epi16(l, 4) : l, _mm256_set1_epi8(15));
    const __m256i hi = s == 0 ? _mm256_slli_epi16(u, 4) : s == 1 ? _mm256_slli_epi16(u, 2) : s == 2 ? u : _mm256_srli_epi16(u, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
}
/* Q2_K's: bits 2s, 2s + 1 of region c */
AVX2 static inline __attribute__((always_inline)) __m256i x16q2_code(const uint8_t *p, int j, int o) {
    return _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(p + 320 + 512 * (j / 4) + o)), 2 * (j % 4)), _mm256_set1_epi8(3));
}
VNNI static inline __attribute__((always_inline)) __m512i x16q2_code512(const uint8_t *p, int j, int o) {
    return _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512((const void *)(p + 320 + 512 * (j / 4) + o)), 2 * (j % 4)), _mm512_set1_epi8(3));
}
/* Q3_K's (q3): u = bits 2s, 2s + 1 of region c | bit j of the hmask chunk << 2 */
AVX2 static inline __attribute__((always_inline)) __m256i x16q3_code(const uint8_t *p, int j, int o) {
    const __m256i l = _mm256_loadu_si256((const __m256i *)(p + 320 + 512 * (j / 4) + o)), h = _mm256_loadu_si256((const __m256i *)(p + 1344 + o));
    const __m256i hb = j < 2 ? _mm256_slli_epi16(h, 2 - j) : j == 2 ? h : _mm256_srli_epi16(h, j - 2);
    return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l, 2 * (j % 4)), _mm256_set1_epi8(3)), _mm256_and_si256(hb, _mm256_set1_epi8(4)));
}
VNNI static inline __attribute__((always_inline)) __m512i x16q3_code512(const uint8_t *p, int j, int o) {
    const __m512i l = _mm512_loadu_si512((const void *)(p + 320 + 512 * (j / 4) + o)), h = _mm512_loadu_si512((const void *)(p + 1344 + o));
    const __m512i hb = j < 2 ? _mm512_slli_epi16(h, 2 - j) : j == 2 ? h : _mm512_srli_epi16(h, j - 2);
    return _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l, 2 * (j % 4)), _mm512_set1_epi8(3)), hb, _mm512_set1_epi8(4), 0xF8);
}
VNNI static inline __attribute__((always_inline)) __m512i x16q6_code512(const uint8_t *p, int j, int o) {
    const int h = j / 4, s = j % 4;
    const __m512i l = _mm512_loadu_si512((const void *)(p + 320 + 512 * (2 * h + (s & 1)) + o));
    const __m512i u = _mm512_loadu_si512((const void *)(p + 2368 + 512 * h + o));
    const __m512i lo = _mm512_and_si512(s >> 1 ? _mm512_srli_epi16(l, 4) : l, _mm512_set1_epi8(15));
    const __m512i hi = s == 0 ? _mm512_slli_epi16(u, 4) : s == 1 ? _mm512_slli_epi16(u, 2) : s == 2 ? u : _mm512_srli_epi16(u, 2);
    return _mm512_ternarylogic_epi32(lo, hi, _mm512_set1_epi8(0x30), 0xF8); /* lo | (hi & 0x30) */
}

VNNI static inline __attribute__((always_inline)) void x16q6_vnni_(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *h6,
                                                                   int NT, int nsb, int T, int kv, float *out, size_t ldo, const float *bias) {
    const int BB = kv == 2 ? Q2X_BB : kv ? Q3X_BB : Q6X_BB, PS = kv == 2 ? 192 : kv ? 256 : 448; /* a superblock's bytes; its lines prefetched per sub-block */
    __m512 acc[8];
    #pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int i = 0; i < nsb; i++) {
        const uint8_t *p = G + (size_t)BB * i;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        const __m512 dm = kv == 2 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32))) : _mm512_setzero_ps();
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const size_t b = (size_t)8 * i + j;
            const struct q8a *x = xt + b * NT;
            __m512i q[8];
            if (P) {
                #pragma GCC unroll 8
                for (int k = 0; k < 8; k++) q[k] = _mm512_loadu_si512((const void *)(P + 4096 * (size_t)i + 512 * j + 64 * k));
            } else {
                for (int o = PS * j; o < PS * j + PS && o < BB; o += 64) X16_PF1(p + o); /* the superblock's lines, spread over its sub-blocks */
                #pragma GCC unroll 8
                for (int k = 0; k < 8; k++) q[k] = kv == 2 ? x16q2_code512(p, j, 64 * k) : kv ? x16q3_code512(p, j, 64 * k) : x16q6_code512(p, j, 64 * k);
            }
            /* Q2_K: a byte holds the scale (low nibble) and the min */
            const __m512i r0 = kv == 2 ? _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 64 + 32 * j)))
                                       : _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 64 + 32 * j)));
            const __m512i r1 = kv == 2 ? _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 80 + 32 * j)))
                                       : _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 80 + 32 * j)));
            const __m512i sc0 = kv == 2 ? _mm512_and_si512(r0, _mm512_set1_epi32(15)) : r0, sc1 = kv == 2 ? _mm512_and_si512(r1, _mm512_set1_epi32(15)) : r1;
            #pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const int32_t *o = h6 + 2 * (b * NT + t);
                __m512i a0 = kv == 2 ? _mm512_setzero_si512() : _mm512_set1_epi32(o[0]), a1 = kv == 2 ? _mm512_setzero_si512() : _mm512_set1_epi32(o[1]);
                #pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    a0 = _mm512_dpbusd_epi32(a0, q[k], BC4_512(x[t].qs + 4 * k));
                    a1 = _mm512_dpbusd_epi32(a1, q[k + 4], BC4_512(x[t].qs + 16 + 4 * k));
                }
                const __m512i I = _mm512_add_epi32(_mm512_mullo_epi32(a0, sc0), _mm512_mullo_epi32(a1, sc1));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(d, _mm512_set1_ps(x[t].d)), acc[t]);
                if (kv == 2) { /* the mins: m0 S0 + m1 S1 (h6: the halves' code sums) */
                    const __m512i M = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_srli_epi32(r0, 4), _mm512_set1_epi32(o[0])),
                                                       _mm512_mullo_epi32(_mm512_srli_epi32(r1, 4), _mm512_set1_epi32(o[1])));
                    acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(dm, _mm512_set1_ps(x[t].d)), acc[t]);
                }
            }
        }
    }
    x16_out_vnni(acc, T, out, ldo, bias);
}

VNNI void qm_x16q6_vnni(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *h6, int NT, int nt, int nsb, int kv, float *out,
                        size_t ldo, const float *bias) {
#define KC(T) x16q6_vnni_(G, P, xt, h6, NT, nsb, T, 0, out, ldo, bias)
#define K3(T) x16q6_vnni_(G, P, xt, h6, NT, nsb, T, 1, out, ldo, bias)
#define K2(T) x16q6_vnni_(G, P, xt, h6, NT, nsb, T, 2, out, ldo, bias)
    if (kv == 2) X16_BY_NT(K2) else if (kv) X16_BY_NT(K3) else X16_BY_NT(KC)
#undef KC
#undef K3
#undef K2
}

/* AVX2: rows 8e .. 8e + 7 from each chunk's e-th 32 bytes, nt <= 2; two
 * maddubs of codes 0..63 add in i16 (2 x 2 x 63 x 128 < 2^15), then madd */
AVX2 static inline __attribute__((always_inline)) void x16q6_avx2_(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *h6,
                                                                   int NT, int nsb, int T, int kv, float *out, size_t ldo, const float *bias) {
    const int BB = kv == 2 ? Q2X_BB : kv ? Q3X_BB : Q6X_BB, PS = kv == 2 ? 192 : kv ? 256 : 448;
    const __m256i one16 = _mm256_set1_epi16(1);
    __m256 acc[2][2];
    #pragma GCC unroll 2
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int i = 0; i < nsb; i++) {
        const uint8_t *p = G + (size_t)BB * i;
        for (int j = 0; j < 8; j++) {
            const size_t b = (size_t)8 * i + j;
            const struct q8a *x = xt + b * NT;
            if (!P)
                for (int o = PS * j; o < PS * j + PS && o < BB; o += 64) KILN_PF(p + o);
            #pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                __m256i q[8];
                #pragma GCC unroll 8
                for (int k = 0; k < 8; k++)
                    q[k] = P    ? _mm256_loadu_si256((const __m256i *)(P + 4096 * (size_t)i + 512 * j + 64 * k + 32 * e))
                           : kv == 2 ? x16q2_code(p, j, 64 * k + 32 * e)
                           : kv ? x16q3_code(p, j, 64 * k + 32 * e)
                                : x16q6_code(p, j, 64 * k + 32 * e);
                const __m256i r0 = kv == 2 ? _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 64 + 32 * j + 8 * e)))
                                           : _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 64 + 32 * j + 8 * e)));
                const __m256i r1 = kv == 2 ? _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 80 + 32 * j + 8 * e)))
                                           : _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 80 + 32 * j + 8 * e)));
                const __m256i sc0 = kv == 2 ? _mm256_and_si256(r0, _mm256_set1_epi32(15)) : r0, sc1 = kv == 2 ? _mm256_and_si256(r1, _mm256_set1_epi32(15)) : r1;
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * e)));
                const __m256 dm = kv == 2 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * e))) : _mm256_setzero_ps();
                #pragma GCC unroll 2
                for (int t = 0; t < T; t++) {
                    const int32_t *o = h6 + 2 * (b * NT + t);
                    __m256i a[2];
                    #pragma GCC unroll 2
                    for (int v = 0; v < 2; v++) {
                        const int8_t *xq = x[t].qs + 16 * v;
                        const __m256i h01 = _mm256_add_epi16(_mm256_maddubs_epi16(q[4 * v], BC4_256(xq)), _mm256_maddubs_epi16(q[4 * v + 1], BC4_256(xq + 4)));
                        const __m256i h23 = _mm256_add_epi16(_mm256_maddubs_epi16(q[4 * v + 2], BC4_256(xq + 8)), _mm256_maddubs_epi16(q[4 * v + 3], BC4_256(xq + 12)));
                        a[v] = _mm256_add_epi32(_mm256_madd_epi16(h01, one16), _mm256_madd_epi16(h23, one16));
                        if (kv != 2) a[v] = _mm256_add_epi32(a[v], _mm256_set1_epi32(o[v]));
                    }
                    const __m256i I = _mm256_add_epi32(_mm256_mullo_epi32(a[0], sc0), _mm256_mullo_epi32(a[1], sc1));
                    acc[t][e] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(d, _mm256_set1_ps(x[t].d)), acc[t][e]);
                    if (kv == 2) { /* the mins: m0 S0 + m1 S1 */
                        const __m256i M = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_srli_epi32(r0, 4), _mm256_set1_epi32(o[0])),
                                                           _mm256_mullo_epi32(_mm256_srli_epi32(r1, 4), _mm256_set1_epi32(o[1])));
                        acc[t][e] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(dm, _mm256_set1_ps(x[t].d)), acc[t][e]);
                    }
                }
            }
        }
    }
    x16_out_avx2(acc, T, out, ldo, bias);
}

AVX2 void qm_x16q6_avx2(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *h6, int NT, int nt, int nsb, int kv, float *out,
                        size_t ldo, const float *bias) {
    if (kv == 2 && nt == 1) x16q6_avx2_(G, P, xt, h6, NT, nsb, 1, 2, out, ldo, bias);
    else if (kv == 2) x16q6_avx2_(G, P, xt, h6, NT, nsb, 2, 2, out, ldo, bias);
    else if (kv && nt == 1) x16q6_avx2_(G, P, xt, h6, NT, nsb, 1, 1, out, ldo, bias);
    else if (kv) x16q6_avx2_(G, P, xt, h6, NT, nsb, 2, 1, out, ldo, bias);
    else if (nt == 1) x16q6_avx2_(G, P, xt, h6, NT, nsb, 1, 0, out, ldo, bias);
    else x16q6_avx2_(G, P, xt, h6, NT, nsb, 2, 0, out, ldo, bias);
}

/* one Q6_K group superblock's codes assembled (as the kernels above do)
 * into a panel, 512 bytes per sub-block j at P + 512 j, chunk k at + 64 k:
 * the kernels' P, so a prefill assembles each group once per call, not
 * once per tile of tokens */
AVX2 void qm_x16q6_unpack(const uint8_t *p, uint8_t *P, int kv) {
    for (int j = 0; j < 8; j++)
        for (int o = 0; o < 512; o += 32)
            _mm256_storeu_si256((__m256i *)(P + 512 * j + o), kv == 2 ? x16q2_code(p, j, o) : kv ? x16q3_code(p, j, o) : x16q6_code(p, j, o));
}

#endif /* KILN_X86 */
