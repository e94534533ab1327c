/*
 * qmatmul_gptq.c: GPTQ / AWQ 4-bit with int8 activations (qmatmul.c's
 * header comment, "int8"), on every ISA.
 *
 * w = s * q + b per group (b = -s z; struct qgrp keeps s and b per group),
 * x ~ dx * xq per block of 32 (qm_quantize_act's blocks). For one
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
 *   x86 (any ISA): the rows copied once at load into groups of 16 rows
 *     ("GPTQ / AWQ 4-bit in groups of 16 rows" below), one kernel family
 *     for every n, the same bits on every ISA; the kernels that follow
 *     run with KILN_CPU_X16=0 (the qgrp rows as packed) and off x86.
 *   decode (n = 1), AVX-512 VNNI: one row at a time, 4 blocks (64 code
 *     bytes, one load) per step: low nibbles [b0 0..15 | b1 | b2 | b3] and
 *     high nibbles [b0 16..31 | ...] against x laid out the same (act4), two
 *     vpdpbusd into one zmm whose lanes 4j..4j+3 hold block j's partial
 *     dots; cvt, times dx per lane, times s per lane, FMA. The b_g SX_g
 *     terms are one f32 dot of the row's [s, b] pairs with [0, SX] pairs.
 *   prefill (n >= 8), AVX-512 VNNI: 16 rows x 8 tokens; per call and per 16
 *     rows the codes are repacked [block][quad][16][4 bytes] (as qm_pack_i8's
 *     Q4_0 panel) plus [group][s x 16 | b x 16]; per block 8 vpdpbusd per
 *     token into a zeroed int accumulator, cvt, FMA with dx into a group
 *     accumulator; per group C += T * s + b * SX.
 *   prefill (n >= 8), AVX2: the same sums, 8 rows x 4 tokens, maddubs of
 *     the u8 codes with broadcast s8 activations added in i16 over a block,
 *     one madd to i32 per block (gemm_g4_avx2, Q4_0's AVX2 GEMM shape).
 *   prefill (n >= QN_MIN), AArch64 (neon, dotprod): the NEON int8 GEMM
 *     (qmatmul_int8_neon.c: 4 or 8 rows x 4 tokens; per block cvt(isum) x
 *     s dx, per group b x SX).
 *   otherwise (scalar, 2..7 tokens, AVX2 decode, NEON below QN_MIN): row
 *     dots, one block at a time.
 *
 * Every CPU and every forced ISA takes this path for these weights (the
 * numerics are the int8 ones everywhere; KILN_QACT=f32 gives the exact
 * kernels). The AVX2 GEMM beats the exact f32 GEMM it replaced on CPUs
 * without VNNI: 0.6B pp512 (KILN_CPU_ISA=avx2) 240-246 -> 304-357 tok/s;
 * before it, the int8 row dots there ran at 139.
 */
#include <math.h>

#include "backend/cpu/qmatmul_internal.h"

/* the group size if w can take the int8 path, else 0 */
int qm_gact_group(const struct qgrp *g) {
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
    __m256i *act2;    /* AVX2 decode: per block pair {lo, hi} codes (grows_avx2) */
    float *dx2;       /* ... and [dx_b x 4 | dx_b+1 x 4] per pair */
#endif
    const float *x;
    const uint8_t *g16; /* the weight in groups of 16 rows (g_g16), or NULL */
    int64_t ng;         /* ... its groups */
    int n, K, N, nb, G, gs, isa, vnni;
    int NT, ntile;
    void **scr; /* per-thread panels (cpu_scratch_threads) */
#if defined(KILN_NEON)
    float *xd; /* the NEON GEMM: the tiles' activation scales (qm_neon_gemm) */
#endif
};

/* reference: row r against token row a (nb blocks), sx = that token's SX_g */
static float gdot_scalar(const struct qgrp *g, int r, const struct q8a *a, const float *sx, int gs) {
    const uint8_t *q = g->q + (size_t)r * g->row_bytes;
    const float *sb = g->sb + (size_t)r * g->n_group * 2;
    const int bpg = gs / 32, nb = g->n_in / 32;
    float acc = 0;
    for (int gi = 0; gi < g->n_group; gi++) {
        float t = 0;
        for (int b = gi * bpg; b < nb && b < (gi + 1) * bpg; b++) t += a[b].d * (float)qm_isum_q4(q + 16 * (size_t)b, a[b].qs);
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
    CPU_FOR_ROWS2(r, r0, r1) {
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
AVX2 static inline __attribute__((always_inline)) __m256 grow_avx2(const uint8_t *q, const float *sb, const __m256i *act2, const float *dx2,
                                                                   const float *sxp, int G, int ppg, int np) {
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
    for (int k = 0; k + 8 <= 2 * G; k += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(sb + k), _mm256_loadu_ps(sxp + k), acc0);
    return _mm256_add_ps(acc0, acc1);
}

/* grow_avx2 for groups of 128 (two pairs) and an even G, the usual GPTQ
 * layout: two groups (128 code bytes) per iteration with no inner loop.
 * The same operations in the same order (a group's first pair times dx is
 * the FMA into a zero sum; even groups into acc0, odd into acc1), so the
 * same floats; the loop control and the prefetch test per pair went. On
 * a 460 MB code stream in 100 matrices at two threads (alternated 12
 * times) 18.8 -> 21.2 GB/s mean, since the vector ports are nearly
 * saturated there; a whole model's decode moved within the host's spread. */
AVX2 static inline __attribute__((always_inline)) __m256 grow128_avx2(const uint8_t *q, const float *sb, const __m256i *act2, const float *dx2,
                                                                      const float *sxp, int G) {
    const __m256i m4 = _mm256_set1_epi8(15), one16 = _mm256_set1_epi16(1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int gi = 0; gi < G; gi += 2, q += 128, act2 += 8, dx2 += 32) {
        _mm_prefetch((const char *)q + QPFD_G, _MM_HINT_T0);
        _mm_prefetch((const char *)q + 64 + QPFD_G, _MM_HINT_T0);
        __m256 f[4];
        #pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * p));
            const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v, m4), _mm256_loadu_si256(act2 + 2 * p)),
                                               _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_loadu_si256(act2 + 2 * p + 1)));
            f[p] = _mm256_cvtepi32_ps(_mm256_madd_epi16(s, one16));
        }
        const __m256 T0 = _mm256_fmadd_ps(f[1], _mm256_loadu_ps(dx2 + 8), _mm256_mul_ps(f[0], _mm256_loadu_ps(dx2)));
        const __m256 T1 = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(dx2 + 24), _mm256_mul_ps(f[2], _mm256_loadu_ps(dx2 + 16)));
        acc0 = _mm256_fmadd_ps(T0, _mm256_broadcast_ss(sb + 2 * gi), acc0);
        acc1 = _mm256_fmadd_ps(T1, _mm256_broadcast_ss(sb + 2 * gi + 2), acc1);
    }
    for (int k = 0; k + 8 <= 2 * G; k += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(sb + k), _mm256_loadu_ps(sxp + k), acc0);
    return _mm256_add_ps(acc0, acc1);
}

/* grow_avx2 over nx <= 2 activation rows (decode of 2-7 sequences, a pass
 * per 2 of them): a pair's 32 code bytes loaded and unpacked once for both
 * rows, each row with its own act2 / dx2 / [0, SX] pairs and grow_avx2's
 * sums in grow_avx2's order, so a row gets the bits it gets alone. */
AVX2 static inline __attribute__((always_inline)) void grow2_avx2(const uint8_t *q, const float *sb, const __m256i *const *act2,
                                                                  const float *const *dx2, const float *const *sxp, int G, int ppg,
                                                                  int np, int nx, __m256 *res) {
    const __m256i m4 = _mm256_set1_epi8(15), one16 = _mm256_set1_epi16(1);
    __m256 acc0[2], acc1[2];
    for (int t = 0; t < nx; t++) acc0[t] = acc1[t] = _mm256_setzero_ps();
    for (int gi = 0; gi < G; gi++) {
        const int p0 = gi * ppg, p1 = p0 + ppg < np ? p0 + ppg : np;
        __m256 T[2];
        for (int t = 0; t < nx; t++) T[t] = _mm256_setzero_ps();
        for (int p = p0; p < p1; p++) {
            if (!(p & 1)) _mm_prefetch((const char *)q + 32 * (size_t)p + QPFD_G, _MM_HINT_T0);
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * (size_t)p));
            const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            for (int t = 0; t < nx; t++) {
                const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(act2[t] + 2 * p)),
                                                   _mm256_maddubs_epi16(hi, _mm256_loadu_si256(act2[t] + 2 * p + 1)));
                T[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s, one16)), _mm256_loadu_ps(dx2[t] + 8 * (size_t)p), T[t]);
            }
        }
        for (int t = 0; t < nx; t++) {
            if (gi & 1) acc1[t] = _mm256_fmadd_ps(T[t], _mm256_broadcast_ss(sb + 2 * gi), acc1[t]);
            else acc0[t] = _mm256_fmadd_ps(T[t], _mm256_broadcast_ss(sb + 2 * gi), acc0[t]);
        }
    }
    for (int t = 0; t < nx; t++) {
        for (int k = 0; k + 8 <= 2 * G; k += 8) acc0[t] = _mm256_fmadd_ps(_mm256_loadu_ps(sb + k), _mm256_loadu_ps(sxp[t] + k), acc0[t]);
        res[t] = _mm256_add_ps(acc0[t], acc1[t]);
    }
}

/* rows r0 .. r1-1 for n activation rows (2..7), two per pass; out[t][r],
 * with the [s, b] . [0, SX] terms past the last multiple of 8 and the bias
 * added as grows_avx2 and its caller add them */
AVX2 static void growsm_avx2(const struct qgrp *g, int64_t r0, int64_t r1, const __m256i *act2, const float *dx2, const float *sxp, int G,
                             int ppg, int np, int n, int N, const float *bias, float *out) {
    const int k0 = 2 * G / 8 * 8;
    for (int t = 0; t < n; t += 2) {
        const int nx = n - t < 2 ? n - t : 2, t1 = nx == 2 ? t + 1 : t;
        const __m256i *a2[2] = {act2 + (size_t)t * 2 * np, act2 + (size_t)t1 * 2 * np};
        const float *d2[2] = {dx2 + (size_t)t * 8 * np, dx2 + (size_t)t1 * 8 * np};
        const float *s2[2] = {sxp + (size_t)t * 2 * G, sxp + (size_t)t1 * 2 * G};
        CPU_FOR_ROWS2(r, r0, r1) {
            const float *sb = g->sb + (size_t)r * G * 2;
            __m256 v[2];
            if (nx == 2) grow2_avx2(g->q + (size_t)r * g->row_bytes, sb, a2, d2, s2, G, ppg, np, 2, v);
            else grow2_avx2(g->q + (size_t)r * g->row_bytes, sb, a2, d2, s2, G, ppg, np, 1, v);
            for (int i = 0; i < nx; i++) {
                float o = _mm_cvtss_f32(kiln_hsum8x4(v[i], v[i], v[i], v[i]));
                for (int k = k0; k < 2 * G; k++) o += sb[k] * s2[i][k];
                out[(size_t)(t + i) * N + r] = bias ? o + bias[r] : o;
            }
        }
    }
}

/* Rows r0 .. r1-1 through QM_ROWS4 (qmatmul_internal.h: a call per row
 * spent a fifth of a 1024-wide row's time on its prologue and horizontal
 * sum), then the [s, b] . [0, SX] terms past the last multiple of 8 one by
 * one. */
AVX2 static void grows_avx2(const struct qgrp *g, int64_t r0, int64_t r1, const __m256i *act2, const float *dx2, const float *sxp, int G, int ppg,
                            int np, float *out) {
#define GROW(r) grow_avx2(g->q + (size_t)(r0 + (r)) * g->row_bytes, g->sb + (size_t)(r0 + (r)) * G * 2, act2, dx2, sxp, G, ppg, np)
#define GROW128(r) grow128_avx2(g->q + (size_t)(r0 + (r)) * g->row_bytes, g->sb + (size_t)(r0 + (r)) * G * 2, act2, dx2, sxp, G)
    if (ppg == 2 && G % 2 == 0 && np == 2 * G) QM_ROWS4(GROW128, r1 - r0, out + r0);
    else QM_ROWS4(GROW, r1 - r0, out + r0);
#undef GROW
#undef GROW128
    const int k0 = 2 * G / 8 * 8;
    if (k0 < 2 * G)
        for (int64_t r = r0; r < r1; r++) {
            const float *sb = g->sb + (size_t)r * G * 2;
            for (int k = k0; k < 2 * G; k++) out[r] += sb[k] * sxp[k];
        }
}
#endif /* KILN_X86 */

static void g_rows(void *arg, int64_t r0, int64_t r1, int tid) {
    const struct gjob *j = arg;
    const struct qgrp *g = j->g;
#if defined(KILN_X86)
    if (j->n == 1 && j->dec2) {
        grows_avx2(g, r0, r1, j->act2, j->dx2, j->sx, j->G, j->gs / 64, j->nb / 2, j->out);
        if (j->bias)
            for (int64_t r = r0; r < r1; r++) j->out[r] += j->bias[r];
        return;
    }
    if (j->dec2) {
        growsm_avx2(g, r0, r1, j->act2, j->dx2, j->sx, j->G, j->gs / 64, j->nb / 2, j->n, j->N, j->bias, j->out);
        return;
    }
    if (j->n == 1 && j->vnni && j->gs == 128 && j->K % 1024 == 0) {
        grows128_vnni(g, r0, r1, j->act4, j->dx4, j->sx, j->bias, j->out);
        return;
    }
    if (j->n == 1 && j->vnni) {
        CPU_FOR_ROWS2(r, r0, r1)
            j->out[r] = gdot1_vnni(g->q + (size_t)r * g->row_bytes, g->sb + (size_t)r * j->G * 2, j->act4, j->dx4, j->sx, j->nb, j->G, j->gs) +
                        (j->bias ? j->bias[r] : 0.0f);
        return;
    }
#endif
    CPU_FOR_ROWS2(r, r0, r1) {
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
            qm_dp_groups(pb, xb, 0, 8, s);
            #pragma GCC unroll 16
            for (int t = 0; t < 8; t++) T[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_set1_ps(xb[t].d), T[t]);
        }
        const __m512 sv = _mm512_loadu_ps(S + 32 * gi), bv = _mm512_loadu_ps(S + 32 * gi + 16);
        #pragma GCC unroll 16
        for (int t = 0; t < 8; t++) C[t] = _mm512_fmadd_ps(bv, _mm512_set1_ps(sx[8 * gi + t]), _mm512_fmadd_ps(T[t], sv, C[t]));
    }
    qm_gemm_out8(C, out, ldo, nr, nt, bias);
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
            qm_u8_groups(pb, xb, 0, 8, s);
            #pragma GCC unroll 16
            for (int t = 0; t < 4; t++) T[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s[t], one16)), _mm256_set1_ps(xb[t].d), T[t]);
        }
        const __m256 sv = _mm256_loadu_ps(S + 16 * gi), bv = _mm256_loadu_ps(S + 16 * gi + 8);
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) C[t] = _mm256_fmadd_ps(bv, _mm256_set1_ps(sx[4 * gi + t]), _mm256_fmadd_ps(T[t], sv, C[t]));
    }
    qm_gemm_out4(C, out, ldo, nr, nt, bias);
}

static void g_gemm_panels(void *arg, int64_t p0, int64_t p1, int tid) {
    const struct gjob *j = arg;
    uint8_t *P = j->scr[tid];
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

/* ==== GPTQ / AWQ 4-bit in groups of 16 rows (x86) ====
 *
 * As Q4_0's (qmatmul_internal.h, "Q4_0 in groups of 16 rows"): on x86 the
 * int8 path copies the repacked rows once at load into groups of 16 rows,
 * and every x86 kernel reads that. A 16-row group holds, per quant group,
 * the 16 rows' s then their b (128 bytes of f32), then the group's blocks
 * as 4 chunks of 64 bytes each (chunk c: code bytes 4c .. 4c + 3 of the
 * block's 16 in each row, row r at 4r; low nibbles weights 4c .., high
 * ones 16 + 4c ..). Rows past the last whole group follow as qgrp rows
 * (codes, then their [s, b] pairs). Every kernel computes a row as
 *
 *   for each group g: T = fma chain over its blocks of (float)(sum q x) dx_b
 *                     acc = fma(b_g, SX_g, fma(T, s_g, acc))
 *
 * so the scalar, AVX2 and VNNI ones give the same bits at every n. */
#if defined(KILN_X86)
static size_t g16_bytes(const struct qgrp *g) { return (size_t)g->n_group * 128 + (size_t)(g->n_in / 32) * 256; }

uint8_t *qm_g16_pack(struct qgrp *g) {
    const int N = g->n_out, nb = g->n_in / 32, G = g->n_group, bpg = (g->gstart[1] + 31) / 32;
    const int64_t ng = N / 16, nt = N - 16 * ng;
    const size_t GB = g16_bytes(g), sbr = sizeof(float) * 2 * (size_t)G;
    uint8_t *P = kiln_walloc(ng * GB + (size_t)nt * (g->row_bytes + sbr));
    if (!P) return NULL;
    #pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < ng; u++) {
        uint8_t *p = P + (size_t)u * GB;
        for (int gi = 0; gi < G; gi++) {
            float *sv = (float *)p;
            for (int r = 0; r < 16; r++) {
                const float *sb = g->sb + ((size_t)(16 * u + r) * G + gi) * 2;
                sv[r] = sb[0], sv[16 + r] = sb[1];
            }
            p += 128;
            for (int b = gi * bpg; b < nb && b < (gi + 1) * bpg; b++, p += 256)
                for (int r = 0; r < 16; r++)
                    for (int c = 0; c < 4; c++) memcpy(p + 64 * c + 4 * r, g->q + (size_t)(16 * u + r) * g->row_bytes + 16 * (size_t)b + 4 * c, 4);
        }
    }
    uint8_t *tail = P + (size_t)ng * GB;
    memcpy(tail, g->q + (size_t)ng * 16 * g->row_bytes, (size_t)nt * g->row_bytes);
    memcpy(tail + (size_t)nt * g->row_bytes, g->sb + (size_t)ng * 16 * G * 2, (size_t)nt * sbr);
    free(g->q), free(g->sb);
    g->q = NULL, g->sb = NULL; /* nothing reads them now */
    return P;
}

/* group U (16 rows) against nt tokens of the tile xt (block b of token t
 * at xt[b NT + t]), sxt the tile's SX ([G][NT]): out[t ldo + r] */
static void g16_scalar(const uint8_t *U, const struct q8a *xt, const float *sxt, int NT, int nt, int nb, int G, int bpg, float *out, size_t ldo,
                       const float *bias) {
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < 16; r++) {
            const uint8_t *p = U;
            float acc = 0;
            for (int gi = 0; gi < G; gi++) {
                const float sg = ((const float *)p)[r], bg = ((const float *)p)[16 + r];
                float T = 0;
                p += 128;
                for (int b = gi * bpg; b < nb && b < (gi + 1) * bpg; b++, p += 256) {
                    const struct q8a *x = &xt[(size_t)b * NT + t];
                    int sum = 0;
                    for (int c = 0; c < 4; c++)
                        for (int i = 0; i < 4; i++) {
                            const int q = p[64 * c + 4 * r + i];
                            sum += (q & 15) * x->qs[4 * c + i] + (q >> 4) * x->qs[16 + 4 * c + i];
                        }
                    T = fmaf((float)sum, x->d, T);
                }
                acc = fmaf(bg, sxt[(size_t)gi * NT + t], fmaf(T, sg, acc));
            }
            out[(size_t)t * ldo + r] = acc + (bias ? bias[r] : 0.0f);
        }
}

/* a row past the groups (qgrp codes q, [s, b] pairs sb) against token x of
 * a tile, sx its SX values NT apart: the groups' arithmetic */
static float g16_tail(const uint8_t *q, const float *sb, const struct q8a *x, const float *sx, int NT, int nb, int G, int bpg) {
    float acc = 0;
    for (int gi = 0; gi < G; gi++) {
        float T = 0;
        for (int b = gi * bpg; b < nb && b < (gi + 1) * bpg; b++) {
            const struct q8a *xb = &x[(size_t)b * NT];
            T = fmaf((float)qm_isum_q4(q + 16 * (size_t)b, xb->qs), xb->d, T);
        }
        acc = fmaf(sb[2 * gi + 1], sx[(size_t)gi * NT], fmaf(T, sb[2 * gi], acc));
    }
    return acc;
}

/* a block's 256 code bytes, qm_pfd_cur ahead of the stream (the int8 decode
 * kernels' distance, qm_settle) */
#define G16_PF(p)                                                                                     \
    do {                                                                                              \
        if (qm_pfd_cur)                                                                               \
            for (int o_ = 0; o_ < 256; o_ += 64) _mm_prefetch((const char *)(p) + o_ + qm_pfd_cur, _MM_HINT_T0); \
    } while (0)

/* VNNI: per block 4 loads of 16 rows x 4 code bytes split into nibbles once
 * for the nt <= 8 tokens, 8 vpdpbusd per token against broadcasts of 4
 * activation codes (two chains for one token), the block's sum times dx
 * into the group's T; per group acc = fma(b, SX, fma(T, s, acc)) with the
 * 16 rows' s and b as vectors */
VNNI static inline __attribute__((always_inline)) void g16_vnni_(const uint8_t *U, const uint8_t *P, const struct q8a *xt, const float *sxt, int NT,
                                                                 int nb, int G, int bpg, int T, float *out, size_t ldo, const float *bias) {
    __m512 acc[8];
    #pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    const uint8_t *p = U;
    for (int gi = 0; gi < G; gi++) {
        const __m512 sv = _mm512_loadu_ps(p), bv = _mm512_loadu_ps(p + 64);
        __m512 Tv[8];
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++) Tv[t] = _mm512_setzero_ps();
        p += 128;
        for (int b = gi * bpg; b < nb && b < (gi + 1) * bpg; b++, p += 256) {
            if (!P) G16_PF(p);
            const struct q8a *x = xt + (size_t)b * NT;
            __m512i s[8];
            x16_isum_vnni(P ? P + 512 * (size_t)b : p, P != NULL, NULL, x, NULL, T, s);
            #pragma GCC unroll 8
            for (int t = 0; t < T; t++) Tv[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_set1_ps(x[t].d), Tv[t]);
        }
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[t] = _mm512_fmadd_ps(bv, _mm512_set1_ps(sxt[(size_t)gi * NT + t]), _mm512_fmadd_ps(Tv[t], sv, acc[t]));
    }
    const __m512 bias_v = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    #pragma GCC unroll 8
    for (int t = 0; t < T; t++) _mm512_storeu_ps(out + (size_t)t * ldo, _mm512_add_ps(acc[t], bias_v));
}

VNNI static void g16_vnni(const uint8_t *U, const uint8_t *P, const struct q8a *xt, const float *sxt, int NT, int nt, int nb, int G, int bpg,
                          float *out, size_t ldo, const float *bias) {
    switch (nt) {
    case 1: g16_vnni_(U, P, xt, sxt, NT, nb, G, bpg, 1, out, ldo, bias); break;
    case 2: g16_vnni_(U, P, xt, sxt, NT, nb, G, bpg, 2, out, ldo, bias); break;
    case 3: g16_vnni_(U, P, xt, sxt, NT, nb, G, bpg, 3, out, ldo, bias); break;
    case 4: g16_vnni_(U, P, xt, sxt, NT, nb, G, bpg, 4, out, ldo, bias); break;
    case 5: g16_vnni_(U, P, xt, sxt, NT, nb, G, bpg, 5, out, ldo, bias); break;
    case 6: g16_vnni_(U, P, xt, sxt, NT, nb, G, bpg, 6, out, ldo, bias); break;
    case 7: g16_vnni_(U, P, xt, sxt, NT, nb, G, bpg, 7, out, ldo, bias); break;
    default: g16_vnni_(U, P, xt, sxt, NT, nb, G, bpg, 8, out, ldo, bias); break;
    }
}

/* AVX2: two halves of 8 rows (a chunk's 32-byte halves), nt <= 2 tokens;
 * a block's 8 maddubs per token add in i16 (8 x 2 x 15 x 127 < 2^15), one
 * madd makes each row's i32 sum: the VNNI lane, exactly */
AVX2 static inline __attribute__((always_inline)) void g16_avx2_(const uint8_t *U, const uint8_t *P, const struct q8a *xt, const float *sxt, int NT,
                                                                 int nb, int G, int bpg, int T, float *out, size_t ldo, const float *bias) {
    __m256 acc[2][2];
    #pragma GCC unroll 2
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    const uint8_t *p = U;
    for (int gi = 0; gi < G; gi++) {
        const float *sb = (const float *)p;
        __m256 Tv[2][2];
        #pragma GCC unroll 2
        for (int t = 0; t < T; t++) Tv[t][0] = Tv[t][1] = _mm256_setzero_ps();
        p += 128;
        for (int b = gi * bpg; b < nb && b < (gi + 1) * bpg; b++, p += 256) {
            if (!P) G16_PF(p);
            const struct q8a *x = xt + (size_t)b * NT;
            __m256i s[2][2];
            x16_isum_avx2(P ? P + 512 * (size_t)b : p, P != NULL, 0, NULL, x, NULL, T, s);
            #pragma GCC unroll 2
            for (int t = 0; t < T; t++)
                #pragma GCC unroll 2
                for (int e = 0; e < 2; e++) Tv[t][e] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t][e]), _mm256_set1_ps(x[t].d), Tv[t][e]);
        }
        #pragma GCC unroll 2
        for (int t = 0; t < T; t++)
            #pragma GCC unroll 2
            for (int e = 0; e < 2; e++)
                acc[t][e] = _mm256_fmadd_ps(_mm256_loadu_ps(sb + 16 + 8 * e), _mm256_set1_ps(sxt[(size_t)gi * NT + t]),
                                            _mm256_fmadd_ps(Tv[t][e], _mm256_loadu_ps(sb + 8 * e), acc[t][e]));
    }
    #pragma GCC unroll 2
    for (int e = 0; e < 2; e++) {
        const __m256 bias_v = bias ? _mm256_loadu_ps(bias + 8 * e) : _mm256_setzero_ps();
        #pragma GCC unroll 2
        for (int t = 0; t < T; t++) _mm256_storeu_ps(out + (size_t)t * ldo + 8 * e, _mm256_add_ps(acc[t][e], bias_v));
    }
}

AVX2 static void g16_avx2(const uint8_t *U, const uint8_t *P, const struct q8a *xt, const float *sxt, int NT, int nt, int nb, int G, int bpg,
                          float *out, size_t ldo, const float *bias) {
    if (nt == 1) g16_avx2_(U, P, xt, sxt, NT, nb, G, bpg, 1, out, ldo, bias);
    else g16_avx2_(U, P, xt, sxt, NT, nb, G, bpg, 2, out, ldo, bias);
}

/* items are the 16-row groups, then one for the rows past them; each group
 * meets every tile of tokens in turn */
static void g_g16(void *arg, int64_t u0, int64_t u1, int tid) {
    const struct gjob *j = arg;
    const size_t GB = g16_bytes(j->g);
    const int bpg = j->gs / 32, NT = j->NT;
    uint8_t *P = j->scr ? j->scr[tid] : NULL; /* several tiles: each group's codes split once */
    CPU_FOR_ROWS(u, u0, u1, qm_two_cur) {
        if (P && u < j->ng) {
            const uint8_t *p = j->g16 + (size_t)u * GB;
            for (int gi = 0, b = 0; gi < j->G; gi++)
                for (p += 128; b < j->nb && b < (gi + 1) * bpg; b++, p += 256) x16_unpack(p, P + 512 * (size_t)b);
        }
        for (int tile = 0; tile < j->ntile; tile++) {
            const int t0 = tile * NT, nt = j->n - t0 < NT ? j->n - t0 : NT;
            const struct q8a *xt = j->xa + (size_t)tile * j->nb * NT;
            const float *sxt = j->sx + (size_t)tile * j->G * NT;
            if (u < j->ng) {
                const uint8_t *U = j->g16 + (size_t)u * GB;
                float *o = j->out + (size_t)t0 * j->N + 16 * u;
                const float *bias = j->bias ? j->bias + 16 * u : NULL;
                if (j->vnni) g16_vnni(U, P, xt, sxt, NT, nt, j->nb, j->G, bpg, o, j->N, bias);
                else if (j->isa >= CPU_ISA_AVX2)
                    for (int t = 0; t < nt; t += 2)
                        g16_avx2(U, P, xt + t, sxt + t, NT, nt - t < 2 ? nt - t : 2, j->nb, j->G, bpg, o + (size_t)t * j->N, j->N, bias);
                else g16_scalar(U, xt, sxt, NT, nt, j->nb, j->G, bpg, o, j->N, bias);
            } else {
                const int64_t ntl = j->N - 16 * j->ng;
                const uint8_t *tq = j->g16 + (size_t)j->ng * GB;
                const float *tsb = (const float *)(tq + (size_t)ntl * j->g->row_bytes);
                for (int64_t r = 16 * j->ng; r < j->N; r++) {
                    const int64_t i = r - 16 * j->ng;
                    for (int t = 0; t < nt; t++)
                        j->out[(size_t)(t0 + t) * j->N + r] = g16_tail(tq + (size_t)i * j->g->row_bytes, tsb + (size_t)i * 2 * j->G, xt + t, sxt + t, NT,
                                                                       j->nb, j->G, bpg) + (j->bias ? j->bias[r] : 0.0f);
                }
            }
        }
    }
    (void)tid;
}
#endif /* KILN_X86 */

static void g_quant(void *arg, int64_t t0, int64_t t1, int tid) {
    const struct gjob *j = arg;
    const int stride = j->NT ? j->NT : 1;
    for (int64_t t = t0; t < t1; t++) {
        const struct q8a *d = qm_quant_token(j->x, j->xa, t, j->n, j->K, j->NT, j->isa);
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

/* n at or above which the VNNI / AVX2 GEMM runs */
#define GGEMM_MIN 8

/* whether a call of n tokens runs a GEMM (else the row dots): x86 from
 * AVX2, AArch64 from NEON (qmatmul_int8_neon.c, QN_MIN) */
static int gact_gemm(int isa, int n) {
#if defined(KILN_NEON)
    return isa >= CPU_ISA_NEON && n >= QN_MIN;
#else
    return isa >= CPU_ISA_AVX2 && n >= GGEMM_MIN;
#endif
}

/* everything of a call before its parallel part (x quantized into the
 * backend's buffer, SX, the VNNI decode vectors); returns whether it is
 * the GEMM (1 or 0), or -1 when the buffer could not grow. x must already
 * be in qgrp's (act-order) order. */
static int gact_setup(struct kiln_backend *be, struct gjob *jp, float *out, const float *x, const struct qlinear *w, int n) {
    const struct qprep *p = w->be;
    struct gjob j = {.g = &p->grp, .out = out, .bias = w->bias.data ? cpu_vec(&w->bias) : NULL, .x = x, .n = n, .K = w->n_in,
                     .N = w->n_out, .nb = w->n_in / 32, .G = p->grp.n_group, .gs = p->gact, .isa = cpu_isa()};
    j.vnni = j.isa >= CPU_ISA_AVX512 && qm_have_vnni();
#if defined(KILN_X86)
    if (p->g16) {
        /* groups of 16 rows: every n on one kernel, tokens in tiles of NT
         * (VNNI 8, AVX2 2; fewer when n is), SX in the tiles' [G][NT] */
        qm_settle();
        j.g16 = p->g16, j.ng = j.N / 16;
        j.NT = j.vnni || j.isa < CPU_ISA_AVX2 ? 8 : 2;
        if (j.NT > n) j.NT = n;
        j.ntile = (n + j.NT - 1) / j.NT;
        cpu_isa_note(j.isa >= CPU_ISA_AVX2 ? CPU_ISA_AVX2 : CPU_ISA_SCALAR, j.vnni ? CPU_USED_VNNI : 0);
        const size_t sz[2] = {sizeof *j.xa * (size_t)j.ntile * j.NT * j.nb, sizeof(float) * (size_t)j.ntile * j.NT * j.G};
        void *ptr[2];
        if (qm_buf_get(be, sz, ptr, 2)) return -1; /* reported by cpu_error */
        j.xa = ptr[0], j.sx = ptr[1];
        cpu_parallel_for(be, (int64_t)j.ntile * j.NT, (16384 + j.K - 1) / j.K, g_quant, &j);
        *jp = j;
        return 2;
    }
#endif
    const int gemm = gact_gemm(j.isa, n);
    if (gemm) j.NT = j.vnni ? 8 : 4, j.ntile = (n + j.NT - 1) / j.NT; /* NEON: QN_NT = 4 */
    const int nrow = gemm ? j.ntile * j.NT : n, dec = j.vnni && n == 1, nu = (j.nb + 3) / 4;
    /* AVX2 decode by block pairs: groups of an even number of blocks; one
     * sequence without VNNI (with it: dec), or 2-7 of them on any AVX2 CPU */
    j.dec2 = !gemm && (n > 1 || !j.vnni) && j.isa >= CPU_ISA_AVX2 && j.gs % 64 == 0 && j.nb % 2 == 0;
    cpu_isa_note(j.isa >= CPU_ISA_AVX2 ? CPU_ISA_AVX2 : CPU_ISA_SCALAR, j.vnni && (gemm || dec) ? CPU_USED_VNNI : 0);
    size_t sz[4] = {sizeof *j.xa * (size_t)nrow * j.nb, sizeof(float) * 2 * (size_t)nrow * j.G,
                          dec ? 128 * (size_t)nu : j.dec2 ? 32 * (size_t)j.nb * n : 0, dec ? 64 * (size_t)nu : j.dec2 ? 16 * (size_t)j.nb * n : 0};
#if defined(KILN_NEON)
    sz[2] = gemm ? sizeof(float) * (size_t)nrow * j.nb : 0; /* xd */
#endif
    void *ptr[4];
    if (qm_buf_get(be, sz, ptr, 4)) return -1; /* reported by cpu_error */
    j.xa = ptr[0], j.sx = ptr[1];
#if defined(KILN_NEON)
    cpu_isa_note(j.isa, 0); /* gdot_neon / gdot_dotprod, or the GEMM */
    j.xd = ptr[2];
#endif
#if defined(KILN_X86)
    if (dec) j.act4 = ptr[2], j.dx4 = ptr[3];
    if (j.dec2) j.act2 = ptr[2], j.dx2 = ptr[3];
#endif
    cpu_parallel_for(be, nrow, (16384 + j.K - 1) / j.K, g_quant, &j);
#if defined(KILN_X86)
    if (j.dec2) {
        /* per token t: act2[2p] = [x_2p 0..15 | x_2p+1 0..15], act2[2p+1]
         * the 16..31 halves; dx2 per pair; sx becomes the [0, SX_g] pairs
         * ([t][2G], filled from the back over the [t][G] values) */
        const int np = j.nb / 2;
        for (int t = 0; t < n; t++)
            for (int p = 0; p < np; p++) {
                const struct q8a *x0 = &j.xa[(size_t)t * j.nb + 2 * p], *x1 = x0 + 1;
                int8_t *d = (int8_t *)&j.act2[(size_t)t * 2 * np + 2 * p];
                float *dx = j.dx2 + (size_t)t * 8 * np + 8 * p;
                memcpy(d, x0->qs, 16), memcpy(d + 16, x1->qs, 16), memcpy(d + 32, x0->qs + 16, 16), memcpy(d + 48, x1->qs + 16, 16);
                for (int i = 0; i < 4; i++) dx[i] = x0->d, dx[4 + i] = x1->d;
            }
        for (int t = n - 1; t >= 0; t--)
            for (int gi = j.G - 1; gi >= 0; gi--) {
                const float v = j.sx[(size_t)t * j.G + gi];
                j.sx[(size_t)t * 2 * j.G + 2 * gi] = 0, j.sx[(size_t)t * 2 * j.G + 2 * gi + 1] = v;
            }
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

void qm_matmul_gact(struct kiln_backend *be, float *out, const float *x, const struct qlinear *w, int n) {
    const struct qprep *p = w->be;
    float *xperm = NULL;
    if (p->grp.perm) {
        const int K = w->n_in;
        if (!(xperm = cpu_scratch_alloc(be, sizeof(float) * (size_t)n * K))) return; /* reported by cpu_error */
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++) xperm[(size_t)t * K + k] = x[(size_t)t * K + p->grp.perm[k]];
        x = xperm;
    }
    struct gjob j;
    const int gemm = gact_setup(be, &j, out, x, w, n); /* never the GEMM without AVX2 or NEON */
    if (gemm < 0) {
        /* reported by cpu_error */
#if defined(KILN_NEON)
    } else if (gemm) {
        struct qn_gemm q = {.src = {.g = j.g, .G = j.G, .bpg = j.gs / 32}, .xa = j.xa, .xd = j.xd, .sx = j.sx, .out = j.out, .bias = j.bias,
                            .N = j.N, .n = n, .nb = j.nb, .ntile = j.ntile, .dp = j.isa >= CPU_ISA_DOTPROD};
        qm_neon_gemm(be, &q);
#endif
#if defined(KILN_X86)
    } else if (gemm == 2) {
        /* several tiles of tokens: a panel per thread for the split codes */
        const int64_t units = j.ng + (j.N > 16 * j.ng);
        if (!(j.ntile > 1 && j.isa >= CPU_ISA_AVX2) || (j.scr = cpu_scratch_threads(be, 512 * (size_t)j.nb))) {
            /* one tile (decode): a run of groups per thread, stolen in chunks; several: a group at a time */
            if (j.ntile > 1) cpu_parallel_for(be, units, 1, g_g16, &j);
            else cpu_parallel_for_split(be, units, cpu_split_chunk(be, j.ng + 1, 16 * qm_grp_row_bytes(j.g)), g_g16, &j);
            cpu_scratch_threads_free(be, j.scr);
        }
    } else if (gemm) {
        const int R = j.vnni ? 16 : 8;
        if ((j.scr = cpu_scratch_threads(be, (size_t)j.nb * 32 * R + sizeof(float) * 2 * R * (size_t)j.G)))
            cpu_parallel_for(be, (j.N + R - 1) / R, 1, g_gemm_panels, &j);
        cpu_scratch_threads_free(be, j.scr);
#endif
    } else {
        cpu_parallel_for_split(be, j.N, cpu_split_chunk(be, j.N, qm_grp_row_bytes(j.g)), g_rows, &j);
    }
    free(xperm);
}

int qm_gact_multi(struct kiln_backend *be, float *const *outs, const float *x, const struct qlinear *const *ws, int count, int n) {
    const struct qprep *p0 = ws[0]->be;
    /* GPTQ / AWQ int8 rows: x quantized once (same K, same groups), all rows in one job */
    struct gjob g[MULTI_MAX];
    struct cpu_task t[MULTI_MAX];
    if (n >= GGEMM_MIN || gact_gemm(cpu_isa(), n)) return 0;
    for (int i = 0; i < count; i++) {
        const struct qprep *p = ws[i]->be;
        if (p->gact != p0->gact || p->grp.perm || p->grp.n_group != p0->grp.n_group || ws[i]->n_in != ws[0]->n_in ||
            (p->g16 != NULL) != (p0->g16 != NULL))
            return 0;
    }
    const int gemm = gact_setup(be, &g[0], outs[0], x, ws[0], n);
    if (gemm < 0) return 1;  /* skipped; reported by cpu_error */
    if (gemm == 1) return 0; /* not reached: the GEMM was ruled out above */
    for (int i = 0; i < count; i++) {
        if (i) {
            g[i] = g[0];
            g[i].g = &((const struct qprep *)ws[i]->be)->grp, g[i].out = outs[i], g[i].N = ws[i]->n_out;
            g[i].bias = ws[i]->bias.data ? cpu_vec(&ws[i]->bias) : NULL;
        }
#if defined(KILN_X86)
        if (gemm == 2) {
            g[i].g16 = ((const struct qprep *)ws[i]->be)->g16, g[i].ng = g[i].N / 16;
            t[i] = (struct cpu_task){g_g16, &g[i], g[i].ng + (g[i].N > 16 * g[i].ng)};
            continue;
        }
#endif
        t[i] = (struct cpu_task){g_rows, &g[i], ws[i]->n_out};
    }
    cpu_parallel_for_split_tasks(be, t, count, (gemm == 2 ? 16 : 1) * qm_grp_row_bytes(g[0].g));
    return 1;
}

/* the most gact_setup takes from the per-call buffer for n rows of K: in
 * groups (g16) the tiles' codes and SX (at most one per block); else the
 * row paths' pieces too */
static size_t gsetup_bytes(int n, int K, int g16) {
    const size_t nb = (size_t)K / 32, r = (size_t)n + 8;
    if (g16) return r * nb * (sizeof(struct q8a) + sizeof(float)) + 3 * 64;
    return r * nb * (sizeof(struct q8a) + 56) + 192 * (nb / 4 + 1) + 8 * 64;
}

static int g_task_setup(struct kiln_backend *be, void *job, const struct cpu_mm *t) {
    return gact_setup(be, job, t->out, t->x, t->w, t->n);
}

static void g_task_share(void *job, const struct cpu_mm *t, int mode) {
    struct gjob *g = job;
    const struct qprep *p = t->w->be;
    g->g = &p->grp, g->out = t->out, g->N = t->w->n_out;
    g->bias = t->w->bias.data ? cpu_vec(&t->w->bias) : NULL;
#if defined(KILN_X86)
    if (mode == 2) g->g16 = p->g16, g->ng = g->N / 16;
#else
    (void)mode;
#endif
}

static int g_task(void *job, int mode, void **scr, struct cpu_task *out) {
    struct gjob *g = job;
#if defined(KILN_X86)
    if (mode == 2) {
        const int panel = g->ntile > 1 && g->isa >= CPU_ISA_AVX2;
        if (out) g->scr = panel ? scr : NULL, *out = (struct cpu_task){g_g16, g, g->ng + (g->N > 16 * g->ng)};
        return panel;
    }
#else
    (void)mode, (void)scr;
#endif
    if (out) *out = (struct cpu_task){g_rows, g, g->N};
    return 0;
}

static size_t g_task_bytes(const void *job, int mode) { return (mode == 2 ? 16 : 1) * qm_grp_row_bytes(((const struct gjob *)job)->g); }

int qm_gact_tasks(struct kiln_backend *be, const struct cpu_mm *t, int count) {
    static const struct qm_task_ops ops = {sizeof(struct gjob), g_task_setup, g_task_share, g_task, g_task_bytes};
    const struct qprep *p0 = t[0].w->be;
    size_t bytes = 0;
    for (int i = 0; i < count; i++) {
        const struct qprep *p = t[i].w->be;
        /* no act order (its x is permuted per linear), no GEMM (its own job) */
        if (p->gact != p0->gact || p->grp.perm || p->grp.n_group != p0->grp.n_group || t[i].w->n_in != t[0].w->n_in ||
            (p->g16 != NULL) != (p0->g16 != NULL) || (!p->g16 && gact_gemm(cpu_isa(), t[i].n)))
            return 0;
        if (!i || t[i].x != t[i - 1].x || t[i].n != t[i - 1].n) bytes += gsetup_bytes(t[i].n, t[0].w->n_in, p->g16 != NULL);
    }
    return qm_run_tasks(be, t, count, bytes, &ops);
}
