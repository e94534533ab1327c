/*
 * qmatmul_int8_neon.c: the int8 GEMM on AArch64, for prefill (n >= QN_MIN
 * tokens, qmatmul_internal.h, which says why 4) of GGUF Q8_0 / Q4_0
 * (qmatmul_int8.c) and GPTQ / AWQ 4-bit (qmatmul_gptq.c) on int8
 * activations. Below QN_MIN, and for the other formats, the row dots run.
 * Empty off AArch64.
 *
 * Tile decomposition. Tokens come in tiles of QN_NT = 4 (the activations
 * quantized once per call into [tile][block][4], qm_quant_token with NT =
 * 4; a tile's padding tokens are zero blocks). Weight rows come in panels
 * of R rows, which a thread repacks once per call (pack4 / pack8) and then
 * runs against every tile of tokens, so a weight row's codes are unpacked
 * once per call instead of once per token, each weight byte is read from
 * the panel once per 4 tokens and each activation code once per R rows.
 * Per 32-weight block a panel holds the R rows' codes as s8 (Q8_0 as
 * stored, Q4_0 nibble - 8, GPTQ nibble 0..15) and R f32 scales (the f16
 * d, or GPTQ's s of the block's group); a GPTQ panel ends with its R
 * offsets b per group.
 *
 *   dotprod  R = 8, codes interleaved [quad 0..7][row 0..7][4 bytes]: one
 *            vector is 4 consecutive k of 4 rows, and sdot by lane
 *            (vdotq_laneq_s32) against a token's 4 activation codes of that
 *            quad adds one 4-product sum to each row's i32 lane. Per block
 *            8 x 2 x 4 = 64 sdot into 8 i32 accumulators (2 row halves x 4
 *            tokens), no horizontal sums; then per token and half a
 *            convert, a multiply of the rows' scales by the token's scale,
 *            an FMA into 8 f32 accumulators.
 *   neon     R = 4, codes as rows ([row][32]): per row and token the block's
 *            products by smull / smlal2 into i16 lanes (Q8_0: 2 per lane,
 *            2 x 128 x 127 < 2^15, then saddlp / sadalp; Q4_0 and GPTQ: all
 *            4 per lane, 4 x 15 x 127 < 2^15, one saddlp), the 4 rows' i32
 *            vectors pairwise added (addp) into one [row] vector per token,
 *            then the same convert, scale and FMA; 4 f32 accumulators.
 *
 * Integer block sums are exact; per block the f32 term is cvt(isum) x (d_r
 * xd_t), so only the order (and rounding) of the f32 terms differs from
 * the scalar row dots. GPTQ / AWQ: per block cvt(isum) x (s_g xd_t), per
 * group b_g x SX_g (SX as qmatmul_gptq.c computes it), the same terms as
 * gdot_scalar in another order.
 */
#include "backend/cpu/qmatmul_internal.h"

#if defined(KILN_NEON)

/* ==== panels ==== */

/* bytes of one block of 32 in a panel of R rows: 32 R codes, R f32 scales */
#define QN_BLOCK(R) ((size_t)(R) * 36)

static size_t panel_bytes(int R, int nb, int G) { return QN_BLOCK(R) * (size_t)nb + sizeof(float) * (size_t)R * (size_t)G; }

/* the weight formats of a panel: GGUF Q8_0, Q4_0, GPTQ / AWQ 4-bit */
enum { F_Q8, F_Q4, F_G4 };

/* one block's 32 codes at p (a GGUF block, or GPTQ's 16 code bytes) as two
 * s8 vectors, weights 0..15 and 16..31 */
static inline __attribute__((always_inline)) void block_codes(const uint8_t *p, int fmt, int8x16_t *c0, int8x16_t *c1) {
    if (fmt == F_Q8) {
        *c0 = vld1q_s8((const int8_t *)p + 2), *c1 = vld1q_s8((const int8_t *)p + 18);
        return;
    }
    const uint8x16_t v = vld1q_u8(fmt == F_Q4 ? p + 2 : p);
    const int8x16_t o = vdupq_n_s8(fmt == F_Q4 ? 8 : 0); /* Q4_0: nibble - 8 */
    *c0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))), o), *c1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), o);
}

/* quads 0..3 of 4 rows (a, b, c, d: 4 x 4 bytes each) transposed, 32-bit
 * elements: q[k] = [a_k b_k c_k d_k] */
static inline void tr4(int8x16_t a, int8x16_t b, int8x16_t c, int8x16_t d, int8x16_t *q) {
    const int32x4_t t0 = vtrn1q_s32(vreinterpretq_s32_s8(a), vreinterpretq_s32_s8(b));
    const int32x4_t t1 = vtrn2q_s32(vreinterpretq_s32_s8(a), vreinterpretq_s32_s8(b));
    const int32x4_t t2 = vtrn1q_s32(vreinterpretq_s32_s8(c), vreinterpretq_s32_s8(d));
    const int32x4_t t3 = vtrn2q_s32(vreinterpretq_s32_s8(c), vreinterpretq_s32_s8(d));
    q[0] = vreinterpretq_s8_s64(vtrn1q_s64(vreinterpretq_s64_s32(t0), vreinterpretq_s64_s32(t2)));
    q[1] = vreinterpretq_s8_s64(vtrn1q_s64(vreinterpretq_s64_s32(t1), vreinterpretq_s64_s32(t3)));
    q[2] = vreinterpretq_s8_s64(vtrn2q_s64(vreinterpretq_s64_s32(t0), vreinterpretq_s64_s32(t2)));
    q[3] = vreinterpretq_s8_s64(vtrn2q_s64(vreinterpretq_s64_s32(t1), vreinterpretq_s64_s32(t3)));
}

/* rows r0 .. r0 + nr - 1 (nr <= R) of s into the panel P of R = 4 (rows)
 * or 8 (interleaved) rows; compiled per R and format */
static inline __attribute__((always_inline)) void pack_(uint8_t *P, const struct qn_src *s, int64_t r0, int nr, int nb, int R, int fmt) {
    const uint8_t *rp[8];
    const float *sbp[8];
    const size_t bs = fmt == F_Q8 ? 34 : fmt == F_Q4 ? 18 : 16;
    #pragma GCC unroll 8
    for (int i = 0; i < R; i++) { /* missing rows: the last one again, scale 0 */
        const int64_t r = r0 + (i < nr ? i : nr - 1);
        rp[i] = fmt == F_G4 ? s->g->q + (size_t)r * s->g->row_bytes : s->W + (size_t)r * s->rb;
        sbp[i] = fmt == F_G4 ? s->g->sb + (size_t)r * s->G * 2 : NULL;
    }
    for (int b = 0, gi = 0, bg = 0; b < nb; b++) {
        uint8_t *d = P + QN_BLOCK(R) * b;
        float *sc = (float *)(d + 32 * (size_t)R);
        #pragma GCC unroll 2
        for (int g = 0; g < R / 4; g++) {
            int8x16_t c[4][2];
            #pragma GCC unroll 4
            for (int i = 0; i < 4; i++) block_codes(rp[4 * g + i] + bs * b, fmt, &c[i][0], &c[i][1]);
            if (R == 4) { /* rows */
                #pragma GCC unroll 4
                for (int i = 0; i < 4; i++) vst1q_s8((int8_t *)d + 32 * i, c[i][0]), vst1q_s8((int8_t *)d + 32 * i + 16, c[i][1]);
                continue;
            }
            /* R = 8: quad k of rows 0..3 at 32 k, of rows 4..7 at 32 k + 16 */
            #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                int8x16_t q[4];
                tr4(c[0][h], c[1][h], c[2][h], c[3][h], q);
                #pragma GCC unroll 4
                for (int k = 0; k < 4; k++) vst1q_s8((int8_t *)d + 32 * (4 * h + k) + 16 * g, q[k]);
            }
        }
        if (fmt == F_G4) { /* the s of the block's group */
            #pragma GCC unroll 8
            for (int i = 0; i < R; i++) sc[i] = sbp[i][2 * gi];
            if (++bg == s->bpg) bg = 0, gi++;
        } else { /* the f16 d, converted 4 at a time */
            uint16_t h[8];
            #pragma GCC unroll 8
            for (int i = 0; i < R; i++) memcpy(&h[i], rp[i] + bs * b, 2);
            #pragma GCC unroll 2
            for (int i = 0; i < R; i += 4) vst1q_f32(sc + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + i))));
        }
        for (int i = nr; i < R; i++) sc[i] = 0;
    }
    if (fmt == F_G4) { /* the offsets b of each group */
        float *o = (float *)(P + QN_BLOCK(R) * nb);
        for (int gi = 0; gi < s->G; gi++)
            for (int i = 0; i < R; i++) o[(size_t)gi * R + i] = i < nr ? sbp[i][2 * gi + 1] : 0.0f;
    }
}

__attribute__((noinline)) static void pack4(uint8_t *P, const struct qn_src *s, int64_t r0, int nr, int nb) {
    if (s->G) pack_(P, s, r0, nr, nb, 4, F_G4);
    else if (s->q4) pack_(P, s, r0, nr, nb, 4, F_Q4);
    else pack_(P, s, r0, nr, nb, 4, F_Q8);
}
__attribute__((noinline)) static void pack8(uint8_t *P, const struct qn_src *s, int64_t r0, int nr, int nb) {
    if (s->G) pack_(P, s, r0, nr, nb, 8, F_G4);
    else if (s->q4) pack_(P, s, r0, nr, nb, 8, F_Q4);
    else pack_(P, s, r0, nr, nb, 8, F_Q8);
}

/* ==== microkernels ==== */

/* the tile's result: out[t][0..nr-1] = f[t] + bias for the nt real tokens
 * (f[t][h]: rows 4h .. 4h + 3) */
static inline void tile_out(const float32x4_t (*f)[2], int H, float *out, size_t ldo, int nr, int nt, const float *bias) {
    for (int t = 0; t < nt; t++) {
        float v[8];
        for (int h = 0; h < H; h++) vst1q_f32(v + 4 * h, f[t][h]);
        for (int r = 0; r < nr; r++) out[(size_t)t * ldo + r] = v[r] + (bias ? bias[r] : 0.0f);
    }
}

/* one block's integer sums of a row (w0, w1: weights 0..15, 16..31) with a
 * token (x0, x1), as 4 i32 lanes; q8: codes up to |128|, so 2 products per
 * i16 lane, else (|code| <= 15) 4 */
static inline __attribute__((always_inline)) int32x4_t isum_neon(int8x16_t w0, int8x16_t w1, int8x16_t x0, int8x16_t x1, int q8) {
    int16x8_t p = vmlal_high_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), w0, x0);
    if (q8) return vpadalq_s16(vpaddlq_s16(p), vmlal_high_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(x1)), w1, x1));
    p = vmlal_s8(p, vget_low_s8(w1), vget_low_s8(x1));
    return vpaddlq_s16(vmlal_high_s8(p, w1, x1));
}

/* neon: R = 4 rows x 4 tokens. xd: the tile's activation scales
 * [block][4]; sx (GPTQ, G > 0): the tile's SX [group][4], bpg blocks per
 * group */
static inline __attribute__((always_inline)) void gemm_neon_(const uint8_t *P, const struct q8a *xt, const float *xd, const float *sx, int nb,
                                                              int G, int bpg, int q8, float32x4_t (*fo)[2]) {
    const float *off = (const float *)(P + QN_BLOCK(4) * nb);
    float32x4_t f[4][1]; /* in registers; fo written at the end */
    #pragma GCC unroll 4
    for (int t = 0; t < 4; t++) f[t][0] = vdupq_n_f32(0);
    for (int b0 = 0, gi = 0; b0 < nb; b0 += bpg, gi++) {
        const int b1 = b0 + bpg < nb ? b0 + bpg : nb;
        for (int b = b0; b < b1; b++) {
            const int8_t *c = (const int8_t *)(P + QN_BLOCK(4) * b);
            const int8x16_t w00 = vld1q_s8(c), w01 = vld1q_s8(c + 16), w10 = vld1q_s8(c + 32), w11 = vld1q_s8(c + 48);
            const int8x16_t w20 = vld1q_s8(c + 64), w21 = vld1q_s8(c + 80), w30 = vld1q_s8(c + 96), w31 = vld1q_s8(c + 112);
            const float32x4_t sw = vld1q_f32((const float *)(c + 128)), xdv = vld1q_f32(xd + 4 * (size_t)b);
            const struct q8a *x = xt + 4 * (size_t)b;
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                const int8x16_t x0 = vld1q_s8(x[t].qs), x1 = vld1q_s8(x[t].qs + 16);
                const int32x4_t s0 = isum_neon(w00, w01, x0, x1, q8), s1 = isum_neon(w10, w11, x0, x1, q8);
                const int32x4_t s2 = isum_neon(w20, w21, x0, x1, q8), s3 = isum_neon(w30, w31, x0, x1, q8);
                const int32x4_t s = vpaddq_s32(vpaddq_s32(s0, s1), vpaddq_s32(s2, s3)); /* lane r: row r's block sum */
                f[t][0] = vfmaq_f32(f[t][0], vcvtq_f32_s32(s), vmulq_laneq_f32(sw, xdv, t));
                __asm__ volatile("" ::: "memory"); /* a token at a time: loading all 4 first spilled (Q8_0) */
            }
        }
        if (G) {
            const float32x4_t ov = vld1q_f32(off + 4 * (size_t)gi), sxv = vld1q_f32(sx + 4 * (size_t)gi);
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) f[t][0] = vfmaq_laneq_f32(f[t][0], ov, sxv, t);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < 4; t++) fo[t][0] = f[t][0];
}

/* dotprod: R = 8 rows x 4 tokens (interleaved panel, sdot by lane) */
DP_ATTR static inline __attribute__((always_inline)) void gemm_dp_(const uint8_t *P, const struct q8a *xt, const float *xd, const float *sx,
                                                                   int nb, int G, int bpg, float32x4_t (*fo)[2]) {
    const float *off = (const float *)(P + QN_BLOCK(8) * nb);
    float32x4_t f[4][2]; /* in registers; fo written at the end */
    #pragma GCC unroll 4
    for (int t = 0; t < 4; t++) f[t][0] = f[t][1] = vdupq_n_f32(0);
    for (int b0 = 0, gi = 0; b0 < nb; b0 += bpg, gi++) {
        const int b1 = b0 + bpg < nb ? b0 + bpg : nb;
        for (int b = b0; b < b1; b++) {
            const int8_t *c = (const int8_t *)(P + QN_BLOCK(8) * b);
            const struct q8a *x = xt + 4 * (size_t)b;
            int8x16_t xa[4][2];
            int32x4_t s[4][2];
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                xa[t][0] = vld1q_s8(x[t].qs), xa[t][1] = vld1q_s8(x[t].qs + 16);
                s[t][0] = s[t][1] = vdupq_n_s32(0);
            }
            /* two halves of 4 quads: 8 weight vectors live at a time (the
             * barrier keeps the compiler from loading all 16 at once, which
             * spilled accumulators) */
            #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                int8x16_t wv[4][2];
                #pragma GCC unroll 4
                for (int k = 0; k < 4; k++) /* quad 4h + k: 4 codes of rows 0..3, of rows 4..7 */
                    wv[k][0] = vld1q_s8(c + 32 * (4 * h + k)), wv[k][1] = vld1q_s8(c + 32 * (4 * h + k) + 16);
                #pragma GCC unroll 4
                for (int t = 0; t < 4; t++)
                    #pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) {
                        s[t][0] = vdotq_laneq_s32(s[t][0], wv[k][0], xa[t][h], k);
                        s[t][1] = vdotq_laneq_s32(s[t][1], wv[k][1], xa[t][h], k);
                    }
                if (!h) __asm__ volatile("" ::: "memory");
            }
            const float32x4_t sw0 = vld1q_f32((const float *)(c + 256)), sw1 = vld1q_f32((const float *)(c + 272));
            const float32x4_t xdv = vld1q_f32(xd + 4 * (size_t)b);
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                f[t][0] = vfmaq_f32(f[t][0], vcvtq_f32_s32(s[t][0]), vmulq_laneq_f32(sw0, xdv, t));
                f[t][1] = vfmaq_f32(f[t][1], vcvtq_f32_s32(s[t][1]), vmulq_laneq_f32(sw1, xdv, t));
            }
        }
        if (G) {
            const float32x4_t o0 = vld1q_f32(off + 8 * (size_t)gi), o1 = vld1q_f32(off + 8 * (size_t)gi + 4), sxv = vld1q_f32(sx + 4 * (size_t)gi);
            #pragma GCC unroll 4
            for (int t = 0; t < 4; t++) f[t][0] = vfmaq_laneq_f32(f[t][0], o0, sxv, t), f[t][1] = vfmaq_laneq_f32(f[t][1], o1, sxv, t);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < 4; t++) fo[t][0] = f[t][0], fo[t][1] = f[t][1];
}

/* the compiled variants: neon Q8_0, neon nibbles (Q4_0, GPTQ), dotprod
 * (not inlined into the driver: one copy each) */
__attribute__((noinline)) static void gemm_neon_q8(const uint8_t *P, const struct q8a *xt, const float *xd, const float *sx, int nb, int G, int bpg, float32x4_t (*f)[2]) {
    gemm_neon_(P, xt, xd, sx, nb, G, bpg, 1, f);
}
__attribute__((noinline)) static void gemm_neon_q4(const uint8_t *P, const struct q8a *xt, const float *xd, const float *sx, int nb, int G, int bpg, float32x4_t (*f)[2]) {
    gemm_neon_(P, xt, xd, sx, nb, G, bpg, 0, f);
}
DP_ATTR __attribute__((noinline)) static void gemm_dp(const uint8_t *P, const struct q8a *xt, const float *xd, const float *sx, int nb, int G, int bpg, float32x4_t (*f)[2]) {
    gemm_dp_(P, xt, xd, sx, nb, G, bpg, f);
}

/* ==== the driver's part: panels on the pool ==== */

/* items are the panels of R rows; each is packed once, then meets every
 * tile of tokens in turn */
static void qn_panels(void *arg, int64_t p0, int64_t p1, int tid) {
    const struct qn_gemm *j = arg;
    const int R = j->dp ? 8 : 4;
    const int nb = j->nb, G = j->src.G, bpg = G ? j->src.bpg : nb;
    uint8_t *P = j->scr[tid];
    for (int64_t pi = p0; pi < p1; pi++) {
        const int64_t r0 = pi * R;
        const int nr = j->N - r0 < R ? (int)(j->N - r0) : R;
        if (j->dp) pack8(P, &j->src, r0, nr, nb);
        else pack4(P, &j->src, r0, nr, nb);
        for (int tile = 0; tile < j->ntile; tile++) {
            const int t0 = QN_NT * tile, nt = j->n - t0 < QN_NT ? j->n - t0 : QN_NT;
            const size_t ti = (size_t)tile * nb * QN_NT;
            const float *sx = G ? j->sx + (size_t)tile * G * QN_NT : NULL;
            float32x4_t f[QN_NT][2];
            if (j->dp) gemm_dp(P, j->xa + ti, j->xd + ti, sx, nb, G, bpg, f);
            else if (!G && !j->src.q4) gemm_neon_q8(P, j->xa + ti, j->xd + ti, sx, nb, G, bpg, f);
            else gemm_neon_q4(P, j->xa + ti, j->xd + ti, sx, nb, G, bpg, f);
            tile_out((const float32x4_t (*)[2])f, R / 4, j->out + (size_t)t0 * j->N + r0, j->N, nr, nt, j->bias ? j->bias + r0 : NULL);
        }
    }
}

void qm_neon_gemm(struct kiln_backend *be, struct qn_gemm *j) {
    const int R = j->dp ? 8 : 4;
    for (size_t i = 0; i < (size_t)j->ntile * QN_NT * j->nb; i++) j->xd[i] = j->xa[i].d; /* the tiles' scales, [tile][block][4] */
    if (!(j->scr = cpu_scratch_threads(be, panel_bytes(R, j->nb, j->src.G)))) return; /* reported by cpu_error */
    cpu_parallel_for(be, (j->N + R - 1) / R, 1, qn_panels, j);
    cpu_scratch_threads_free(be, j->scr);
}

#endif /* KILN_NEON */
