/*
 * w4.cuh: what the kernels on 4-bit weights share (qgemm.cu for dense
 * linears, moe_w4.cu for MoE experts): the device copy of a linear in the
 * layout of w4pack.h, the code and scale decoding, the K loop of one
 * 16-row tile on the tensor cores, and the dequantization of one code word.
 * qgemm.cu's comment explains the arithmetic.
 */
#ifndef KILN_W4_CUH
#define KILN_W4_CUH

#include "backend/cuda/cuda.cuh"
#include "backend/cuda/stream.cuh"

extern "C" {
#include "backend/cuda/w4pack.h"
}

struct cu_w4 {
    uint4 *q;         /* device: the codes (w4pack.h) */
    uint32_t *sc;     /* device: scales and zeros */
    int32_t *perm;    /* device: act-order column order (x'[k] = x[perm[k]]), or NULL */
    int n_out, n_in, nkb, ng, gsh, sbf; /* gsh: log2 of 32-column chunks per group; sbf: scales are bf16 */
    size_t bytes;     /* device bytes of q, sc and perm */
    size_t q_bytes, sc_bytes;
    int grouped;      /* q and sc lie inside the allocations of its group's first linear (cu_w4_group): not freed on their own */
};

/* two codes of word w (bits 4 i and 16 + 4 i) as a bf16 pair 128 + q
 * (0x4300 is 128, whose mantissa step is 1: exact for q < 128) */
__device__ __forceinline__ unsigned w4_code(unsigned w, int i) {
    unsigned v;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(v) : "r"(w >> (4 * i)), "r"(0x000F000Fu), "r"(0x43004300u)); /* (a & b) | c */
    return v;
}

/* the same less the pair zz = (128 + z, 128 + z): q - z, exact */
__device__ __forceinline__ unsigned w4_pair(unsigned w, int i, unsigned zz) {
    const unsigned v = w4_code(w, i);
    __nv_bfloat162 r = __hsub2(*(const __nv_bfloat162 *)&v, *(const __nv_bfloat162 *)&zz);
    return *(unsigned *)&r;
}

__device__ __forceinline__ float w4_scale(unsigned sw, int sbf) {
    return sbf ? __uint_as_float(sw << 16) : __half2float(__ushort_as_half((unsigned short)(sw & 0xFFFFu)));
}

/*
 * The K loop of one 16-row tile against NT x 8 columns of x, for one warp
 * of the block: its 128-column blocks kb0 .. kb1 - 1. qp: the tile's codes
 * at this lane (tile base + lane * 2, in uint4), sp: the tile's scale words.
 * xrow(i): the x row that is column g + 8 i of the tile's B operand, NULL
 * past the columns there are (read as zeros); nch: x's 32-column chunks.
 * U blocks in flight per lane: their codes (the first U loaded before the
 * wait when WAIT) and their x chunks, each slot reloaded U blocks ahead of
 * its use.
 *
 * Each group's products go into fresh f32 sums, scaled once into acc: per
 * 32-column chunk, or with GB (groups of 128 columns or more, so one group
 * spans a block) once per block. ZF leaves the zero out of the codes (128 + q
 * instead of q - z: one bf16 subtract fewer per code pair) and takes it off
 * the group's sums instead, s (sum (128 + q) x - (128 + z) sum x), the sums
 * of x coming from the tensor cores too (an mma with all-ones weights).
 * acc[i][e] on return: weight row (lane / 4) + 8 (e / 2), column 8 i + 2
 * (lane % 4) + e % 2.
 */
template <int NT, int U, bool GB, bool ZF, bool WAIT, class XR>
__device__ __forceinline__ void w4_tile_dots(float (&acc)[NT][4], const uint4 *qp, const uint32_t *sp, int kb0, int kb1, int ng, int gsh,
                                             int sbf, int nch, XR xrow) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint4 z4 = make_uint4(0, 0, 0, 0);
    uint4 ra[U], rb[U], xr[U][4][NT];
#pragma unroll
    for (int u = 0; u < U; u++)
        if (kb0 + u < kb1) ra[u] = ld_stream(qp + (size_t)(kb0 + u) * 64), rb[u] = ld_stream(qp + (size_t)(kb0 + u) * 64 + 1);
    if (WAIT) pdl_wait_release();
    const bf16 *xp[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) xp[i] = xrow(i);
    /* x chunks (column block b, chunk c, x row g + 8 i) of this lane, or zeros */
#define W4_XLOAD(dst, b)                                                                                          \
    _Pragma("unroll") for (int c = 0; c < 4; c++) {                                                               \
        const int ch = (b) * 4 + c;                                                                               \
        _Pragma("unroll") for (int i = 0; i < NT; i++) dst[c][i] =                                                \
            xp[i] && ch < nch ? __ldg((const uint4 *)(xp[i] + (size_t)ch * 32 + 8 * t)) : z4;                     \
    }
#pragma unroll
    for (int u = 0; u < U; u++)
        if (kb0 + u < kb1) { W4_XLOAD(xr[u], kb0 + u) }
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][e] = 0.f;
    const unsigned ones[4] = {0x3F803F80u, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u}; /* ZF: bf16 1.0 pairs */
    for (int kb = kb0; kb < kb1; kb += U) {
#pragma unroll
        for (int uu = 0; uu < U; uu++) {
            const int b = kb + uu;
            if (b >= kb1) break;
            unsigned sa = 0, sb = 0, za = 0, zb = 0;
            uint4 s4a = z4, s4b = z4;
            float fa = 0.f, fb = 0.f, sum[NT][4], xs[NT][4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if (!GB || u == 0) { /* a new group: its scales, zeros and fresh sums */
                    if (!GB && gsh == 0) { /* groups of 32: the block's four per row in one load (w4pack.h) */
                        if (u == 0) /* sp is the tile's: its words of rows g, g + 8 for chunks 0..3 of block b */
                            s4a = __ldg((const uint4 *)(sp + W4_SC_INDEX(0, ng, 0, b, 0, g))),
                            s4b = __ldg((const uint4 *)(sp + W4_SC_INDEX(0, ng, 0, b, 0, g + 8)));
                        sa = u == 0 ? s4a.x : u == 1 ? s4a.y : u == 2 ? s4a.z : s4a.w;
                        sb = u == 0 ? s4b.x : u == 1 ? s4b.y : u == 2 ? s4b.z : s4b.w;
                    } else {
                        const int gi = (b * 4 + u) >> gsh;
                        sa = __ldg(sp + gi * 16 + g), sb = __ldg(sp + gi * 16 + g + 8);
                    }
                    za = __byte_perm(sa, 0, 0x3232), zb = __byte_perm(sb, 0, 0x3232);
                    fa = w4_scale(sa, sbf), fb = w4_scale(sb, sbf);
#pragma unroll
                    for (int i = 0; i < NT; i++)
#pragma unroll
                        for (int e = 0; e < 4; e++) sum[i][e] = xs[i][e] = 0.f;
                }
                const unsigned wa = u == 0 ? ra[uu].x : u == 1 ? ra[uu].y : u == 2 ? ra[uu].z : ra[uu].w;
                const unsigned wb = u == 0 ? rb[uu].x : u == 1 ? rb[uu].y : u == 2 ? rb[uu].z : rb[uu].w;
                unsigned a0[4], a1[4];
                if (ZF) {
                    a0[0] = w4_code(wa, 0), a0[1] = w4_code(wb, 0), a0[2] = w4_code(wa, 1), a0[3] = w4_code(wb, 1);
                    a1[0] = w4_code(wa, 2), a1[1] = w4_code(wb, 2), a1[2] = w4_code(wa, 3), a1[3] = w4_code(wb, 3);
                } else {
                    a0[0] = w4_pair(wa, 0, za), a0[1] = w4_pair(wb, 0, zb), a0[2] = w4_pair(wa, 1, za), a0[3] = w4_pair(wb, 1, zb);
                    a1[0] = w4_pair(wa, 2, za), a1[1] = w4_pair(wb, 2, zb), a1[2] = w4_pair(wa, 3, za), a1[3] = w4_pair(wb, 3, zb);
                }
#pragma unroll
                for (int i = 0; i < NT; i++) {
                    const uint4 xv = xr[uu][u][i];
                    mma16816(sum[i], a0, xv.x, xv.y);
                    mma16816(sum[i], a1, xv.z, xv.w);
                    if (ZF) mma16816(xs[i], ones, xv.x, xv.y), mma16816(xs[i], ones, xv.z, xv.w);
                }
                if (!GB || u == 3) { /* the group's end: scaled into acc */
                    const float zfa = __uint_as_float(sa & 0xFFFF0000u), zfb = __uint_as_float(sb & 0xFFFF0000u);
#pragma unroll
                    for (int i = 0; i < NT; i++) {
                        if (ZF) {
                            sum[i][0] = fmaf(-zfa, xs[i][0], sum[i][0]), sum[i][1] = fmaf(-zfa, xs[i][1], sum[i][1]);
                            sum[i][2] = fmaf(-zfb, xs[i][2], sum[i][2]), sum[i][3] = fmaf(-zfb, xs[i][3], sum[i][3]);
                        }
                        acc[i][0] = fmaf(sum[i][0], fa, acc[i][0]), acc[i][1] = fmaf(sum[i][1], fa, acc[i][1]);
                        acc[i][2] = fmaf(sum[i][2], fb, acc[i][2]), acc[i][3] = fmaf(sum[i][3], fb, acc[i][3]);
                    }
                }
            }
            if (b + U < kb1) { /* this slot's next block, U blocks ahead */
                ra[uu] = ld_stream(qp + (size_t)(b + U) * 64), rb[uu] = ld_stream(qp + (size_t)(b + U) * 64 + 1);
                W4_XLOAD(xr[uu], b + U)
            }
        }
    }
#undef W4_XLOAD
}

/* a linear's layout in kernel arguments */
struct w4_args {
    const uint4 *q;
    const uint32_t *sc;
    int n_out, n_in, nkb, ng, gsh, sbf;
};

/* code word i of the unpadded (n_out, n_in) matrix (row i / (n_in / 8),
 * columns 8 (i % (n_in / 8)) ..) as 8 bf16 weights s (q - z) into row-major
 * w; with perm (act-order) column k of the layout goes to column perm[k] */
__device__ __forceinline__ void w4_deq_word(const struct w4_args &A, bf16 *__restrict__ w, size_t i, const int32_t *perm) {
    const int wpr = A.n_in >> 3; /* words per row */
    const int r = (int)(i / wpr), k0 = (int)(i % wpr) * 8;
    const int T = r >> 4, h = r & 15, g = h & 7, half = h >> 3;
    const int b = k0 >> 7, u = (k0 >> 5) & 3, t = (k0 >> 3) & 3;
    const unsigned wd = ((const unsigned *)A.q)[(((size_t)T * A.nkb + b) * 1024 + (size_t)(4 * g + t) * 32 + half * 16 + u * 4) / 4];
    const unsigned sw = A.sc[W4_SC_INDEX(T, A.ng, A.gsh, b, u, h)];
    const float s = w4_scale(sw, A.sbf), zf = __uint_as_float(sw & 0xFFFF0000u) - 128.f;
    unsigned o[4];
#pragma unroll
    for (int i2 = 0; i2 < 4; i2++) {
        const float lo = (float)((wd >> (4 * i2)) & 15u), hi = (float)((wd >> (16 + 4 * i2)) & 15u);
        __nv_bfloat162 p = __floats2bfloat162_rn(s * (lo - zf), s * (hi - zf));
        o[i2] = *(unsigned *)&p;
    }
    bf16 *row = w + (size_t)r * A.n_in;
    if (!perm) {
        *(uint4 *)(row + k0) = make_uint4(o[0], o[1], o[2], o[3]);
        return;
    }
    const bf16 *v = (const bf16 *)o; /* o's pairs are columns (2 i2, 2 i2 + 1) */
#pragma unroll
    for (int j = 0; j < 8; j++) row[perm[k0 + j]] = v[j];
}

#endif
