/*
 * qgemm.cu: 4-bit weights on the GPU (GPTQ and AWQ int4, GGUF Q4_0), kept
 * 4-bit in device memory and computed on as such.
 *
 * Every one of these formats is, per output row n and input column k (in
 * GPTQ act-order checkpoints: k in the order that makes each group a
 * contiguous run, x permuted to match), w[n][k] = s[n][g] * (q[n][k] -
 * z[n][g]) with a 4-bit code q, a zero point z (Q4_0: 8) and a scale s per
 * group g of G input columns (Q4_0: 32; GPTQ/AWQ: 32, 64, 128, ... or the
 * whole row). At load the codes are reordered, once, into the layout
 * w4pack.h describes (w4pack.c builds it); nothing is dequantized to keep.
 *
 * Decode (n <= 16 rows of x): k_w4_gemv, the tensor-core GEMV of gemm.cu
 * (k_gemv_tc) with the weights unpacked in registers. A 16-row tile is the
 * A operand of mma.m16n8k16, x's rows the B operand (8 or 16 columns; rows
 * past n are zeros). `lop3` puts two codes into the mantissas of a bf16
 * pair 128 + q (0x4300 | q), so A holds integers, B the activations as
 * they are, and the products are exact in the f32 accumulators. A group's
 * products go into fresh sums S (its 32-column chunks, two mma each; per
 * 128-column block when the group spans it), a second pair of mma with
 * all-ones weights sums x over the same columns, and s (S - (128 + z) sum x)
 * is added into the running sums once per group (k_w4_gemv's ZF; without
 * it a bf16 subtract of 128 + z per code pair makes A hold q - z). Since a chunk's
 * 32 columns are split 8 per lane between the four lanes t of a row, the
 * code layout is exactly the mma fragment: word u of lane (g, t) is A's
 * row-g registers for chunk u, and B's registers are x's 16 bytes at
 * columns 32 u + 8 t. Decomposition: block b owns rows 16 b..16 b + 15,
 * its 8 warps split the 128-column blocks into 8 contiguous ranges, lane
 * (g, t) loads 32 contiguous bytes per block (the warp: 1 KB), three blocks
 * ahead (x's chunks too), the first before griddepcontrol.wait (weights are
 * written by no kernel); the warps' sums meet in shared memory. Up to 3
 * matmuls of one x per launch (q / k / v), or gate and up with the SwiGLU
 * (warps 0-3 gate, 4-7 up).
 *
 * Prefill (n > 16): k_w4_deq writes the weight as bf16 into a scratch
 * matrix and the matmul goes on as for a BF16 weight (cuBLAS). The bf16
 * rounding of s * (q - z) is the only difference from the decode path.
 */
#include "backend/cuda/cuda.cuh"
#include "backend/cuda/stream.cuh"

extern "C" {
#include "backend/cuda/w4pack.h"
}

/* ==== host: the layout (w4pack.c) to the device ==== */

struct cu_w4 {
    uint4 *q;         /* device: the codes (w4pack.h) */
    uint32_t *sc;     /* device: scales and zeros */
    int32_t *perm;    /* device: act-order column order (x'[k] = x[perm[k]]), or NULL */
    int n_out, n_in, nkb, ng, gsh, sbf; /* gsh: log2 of 32-column chunks per group; sbf: scales are bf16 */
    size_t bytes;     /* device bytes of q, sc and perm */
};

static int upload(struct cuda_ctx *c, void **d, const void *h, size_t bytes, char *err, size_t errlen) {
    cudaError_t e = cudaMalloc(d, bytes);
    if (e == cudaSuccess && (e = cu_h2d(c, *d, h, bytes)) != cudaSuccess) cudaFree(*d);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *d = NULL;
        return kiln_errf(err, errlen, "cuda: uploading %zu bytes of 4-bit weights failed: %s", bytes, cudaGetErrorString(e));
    }
    return 0;
}

int cu_w4_prepare(struct cuda_ctx *c, const struct qlinear *w, struct cu_linear *L, char *err, size_t errlen) {
    struct w4_pack p;
    const int rc0 = w4_pack(&p, w, err, errlen);
    if (rc0 <= 0) return rc0;
    struct cu_w4 *q4 = (struct cu_w4 *)kiln_calloc(1, sizeof *q4);
    q4->n_out = p.n_out, q4->n_in = p.n_in, q4->nkb = p.nkb, q4->ng = p.ng, q4->gsh = p.gsh, q4->sbf = p.sbf;
    int rc = upload(c, (void **)&q4->q, p.q, p.q_bytes, err, errlen);
    if (!rc) rc = upload(c, (void **)&q4->sc, p.sc, p.sc_words * 4, err, errlen);
    if (!rc && p.perm) rc = upload(c, (void **)&q4->perm, p.perm, (size_t)p.n_in * 4, err, errlen);
    q4->bytes = p.q_bytes + p.sc_words * 4 + (p.perm ? (size_t)p.n_in * 4 : 0);
    w4_pack_free(&p);
    if (rc) {
        cudaFree(q4->q), cudaFree(q4->sc), cudaFree(q4->perm);
        free(q4);
        return -1;
    }
    c->bytes_weights += q4->bytes;
    L->q4 = q4;
    return 1;
}

void cu_w4_release(struct cuda_ctx *c, struct cu_linear *L) {
    struct cu_w4 *q4 = L->q4;
    if (!q4) return;
    cudaFree(q4->q), cudaFree(q4->sc), cudaFree(q4->perm);
    c->bytes_weights -= q4->bytes;
    free(q4);
    L->q4 = NULL;
}

size_t cu_w4_bytes(const struct cu_linear *L) { return L->q4 ? L->q4->bytes : 0; }
int cu_w4_permuted(const struct cu_linear *L) { return L->q4 && L->q4->perm; }
int cu_w4_gsh(const struct cu_linear *L) { return L->q4->gsh; }

/* ==== device ==== */

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

struct w4_args {
    const uint4 *q;
    const uint32_t *sc;
    int n_out, n_in, nkb, ng, gsh, sbf;
};

/* up to 3 matmuls over the same x in one launch (q / k / v), or gate and up
 * of a GLU (j[0], j[1]: out = silu(gate) * up into j[0].out, up into out2) */
struct w4_job {
    const uint4 *q;
    const uint32_t *sc;
    const float *bias;
    bf16 *out;
    int n_out, tiles, ng, gsh, sbf;
};
struct w4_jobs {
    struct w4_job j[3];
    int nj, n_in, nkb;
    bf16 *out2;
};

#define W4J(J, ji, f) ((ji) == 0 ? (J).j[0].f : (ji) == 1 ? (J).j[1].f : (J).j[2].f)

/*
 * out_j[c][r] = sum_k x[c][k] w_j[r][k] + bias_j[r] for the columns c < n
 * <= 8 NT. Block T owns tile T of the jobs' concatenated 16-row tiles (GLU:
 * tile T of gate in warps 0-3 and of up in warps 4-7); its KS warps split
 * the 128-column blocks into contiguous ranges. U blocks in flight per lane:
 * their codes (the first U loaded before the wait) and their x chunks,
 * each slot reloaded U blocks ahead of its use.
 *
 * Each group's products go into fresh f32 sums, scaled once into acc: per
 * 32-column chunk, or with GB (groups of 128 columns or more, so one group
 * spans a block) once per block. ZF leaves the zero out of the codes (128 + q
 * instead of q - z: one bf16 subtract fewer per code pair) and takes it off
 * the group's sums instead, s (sum (128 + q) x - (128 + z) sum x), the sums
 * of x coming from the tensor cores too (an mma with all-ones weights).
 */
template <int NT, bool GLU, bool GB, bool ZF>
__global__ void __launch_bounds__(256, NT == 1 ? 2 : 1) k_w4_gemv(const struct w4_jobs J, const bf16 *x, int n) {
    KTRACE();
    constexpr int U = NT == 1 ? 3 : 2, KS = GLU ? 4 : 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int T = blockIdx.x, ji = 0;
    if (GLU) ji = warp >= KS;
    else if (J.nj > 1 && T >= J.j[0].tiles) T -= J.j[0].tiles, ji = J.nj > 2 && T >= J.j[1].tiles ? (T -= J.j[1].tiles, 2) : 1;
    const int nkb = J.nkb, wk = warp % KS;
    const int kb0 = wk * nkb / KS, kb1 = (wk + 1) * nkb / KS;
    const int ng = W4J(J, ji, ng), gsh = W4J(J, ji, gsh), sbf = W4J(J, ji, sbf);
    const uint4 *qp = W4J(J, ji, q) + ((size_t)T * nkb) * 64 + lane * 2;
    const uint32_t *sp = W4J(J, ji, sc) + (size_t)T * ng * 16;
    const int nch = J.n_in >> 5; /* chunks of 32 columns in x's rows */
    const uint4 z4 = make_uint4(0, 0, 0, 0);
    uint4 ra[U], rb[U], xr[U][4][NT];
#pragma unroll
    for (int u = 0; u < U; u++)
        if (kb0 + u < kb1) ra[u] = ld_stream(qp + (size_t)(kb0 + u) * 64), rb[u] = ld_stream(qp + (size_t)(kb0 + u) * 64 + 1);
    pdl_wait_release();
    /* x chunks (column block b, chunk c, x row g + 8 i) of this lane, or zeros */
#define W4_XLOAD(dst, b)                                                                                                  \
    _Pragma("unroll") for (int c = 0; c < 4; c++) {                                                                       \
        const int ch = (b) * 4 + c;                                                                                       \
        _Pragma("unroll") for (int i = 0; i < NT; i++) {                                                                  \
            const int col = g + 8 * i;                                                                                    \
            dst[c][i] = col < n && ch < nch ? __ldg((const uint4 *)(x + (size_t)col * J.n_in + (size_t)ch * 32 + 8 * t)) : z4; \
        }                                                                                                                 \
    }
#pragma unroll
    for (int u = 0; u < U; u++)
        if (kb0 + u < kb1) { W4_XLOAD(xr[u], kb0 + u) }
    float acc[NT][4];
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
                        if (u == 0) /* sp is tile T's: its words of rows g, g + 8 for chunks 0..3 of block b */
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
    /* accumulator e of tile i, lane l: weight row (l / 4) + 8 (e / 2), x row 8 i + 2 (l % 4) + e % 2 */
    __shared__ float red[8][NT * 4][32];
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) red[warp][i * 4 + e][lane] = acc[i][e];
    __syncthreads();
    if (threadIdx.x >= NT * 128) return;
    const int qd = threadIdx.x >> 5, l = threadIdx.x & 31, e = qd & 3;
    const int col = (qd >> 2) * 8 + 2 * (l & 3) + (e & 1), row = T * 16 + (l >> 2) + (e & 2 ? 8 : 0);
    const int oj = GLU ? 0 : ji, n_out = W4J(J, oj, n_out);
    if (col >= n || row >= n_out) return;
    float s = 0.f, s2 = 0.f;
#pragma unroll
    for (int w = 0; w < KS; w++) {
        s += red[w][qd][l];
        if (GLU) s2 += red[KS + w][qd][l];
    }
    const float *bias = W4J(J, oj, bias);
    const size_t o = (size_t)col * n_out + row;
    if (!GLU) {
        W4J(J, oj, out)[o] = __float2bfloat16(s + (bias ? bias[row] : 0.f));
    } else { /* rounded as the separate matmuls and swiglu round */
        const float gv = __bfloat162float(__float2bfloat16(s + (bias ? bias[row] : 0.f)));
        const bf16 u = __float2bfloat16(s2 + (J.j[1].bias ? J.j[1].bias[row] : 0.f));
        J.j[0].out[o] = __float2bfloat16(silu(gv) * __bfloat162float(u));
        J.out2[o] = u;
    }
}

/* k_w4_deq: w[r][k] = s (q - z) as bf16, the unpadded (n_out, n_in)
 * matrix; thread i owns 8 columns (one code word) of one row */
__global__ void k_w4_deq(const struct w4_args A, bf16 *__restrict__ w) {
    KTRACE();
    pdl_wait();
    const int wpr = A.n_in >> 3; /* words per row */
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)A.n_out * wpr) return;
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
    *(uint4 *)(w + (size_t)r * A.n_in + k0) = make_uint4(o[0], o[1], o[2], o[3]);
}

/* k_w4_perm: x'[j][k] = x[j][perm[k]]; one thread per element */
__global__ void k_w4_perm(bf16 *__restrict__ xp, const bf16 *x, const int32_t *__restrict__ perm, int n_in, size_t total) {
    KTRACE();
    pdl_wait();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const size_t j = i / n_in;
    xp[i] = x[j * n_in + perm[i % n_in]];
}

/* ==== host launchers ==== */

static struct w4_args w4_args_of(const struct cu_w4 *q) {
    return {q->q, q->sc, q->n_out, q->n_in, q->nkb, q->ng, q->gsh, q->sbf};
}

const bf16 *cu_w4_x(struct cuda_ctx *c, const struct cu_linear *L, const bf16 *x, int n) {
    const struct cu_w4 *q = L->q4;
    if (!q->perm) return x;
    const size_t total = (size_t)n * q->n_in;
    bf16 *xp = (bf16 *)cu_scratch(c, (void **)&c->w4_x, &c->w4_x_cap, total * 2);
    if (!xp) return NULL;
    cu_launch(c->stream, k_w4_perm, (unsigned)((total + 255) / 256), 256, 0, xp, x, (const int32_t *)q->perm, q->n_in, total);
    CU_LAUNCHED();
    return xp;
}

static long w4_runs;
extern "C" long kiln_cuda_w4_count(void);
extern "C" long kiln_cuda_w4_count(void) { return w4_runs; }

static struct w4_job w4_job_of(const struct cu_linear *L, bf16 *out) {
    const struct cu_w4 *q = L->q4;
    return {q->q, q->sc, L->bias, out, q->n_out, (q->n_out + 15) / 16, q->ng, q->gsh, q->sbf};
}

/* one launch: nl matmuls over x (GLU: gate, up -> out[0] = silu(gate) * up, out[1] = up) */
void cu_w4_gemv_multi(struct cuda_ctx *c, bf16 *const *outs, const struct cu_linear *const *Ls, int nl, int glu, const bf16 *x, int n) {
    if (n > W4_GEMV_ROWS) {
        /* 16-row slices of x, a launch each, every one reading the codes
         * again: up to w4_slice_rows rows that costs less than writing the
         * bf16 copy for cuBLAS (docs/cuda.md, "4-bit weights") */
        for (int r = 0; r < n; r += W4_GEMV_ROWS) {
            bf16 *o[3];
            for (int i = 0; i < nl; i++) o[i] = outs[i] + (size_t)r * Ls[i]->q4->n_out;
            cu_w4_gemv_multi(c, o, Ls, nl, glu, x + (size_t)r * Ls[0]->q4->n_in, n - r < W4_GEMV_ROWS ? n - r : W4_GEMV_ROWS);
        }
        return;
    }
    struct w4_jobs J = {};
    J.nj = nl, J.n_in = Ls[0]->q4->n_in, J.nkb = Ls[0]->q4->nkb;
    unsigned tiles = 0;
    for (int i = 0; i < nl; i++) J.j[i] = w4_job_of(Ls[i], outs[i]), tiles += J.j[i].tiles;
    if (glu) J.out2 = outs[1], tiles = J.j[0].tiles;
    /* GB where every job's groups span whole 128-column blocks, ZF always;
     * both read their switch per launch (tests flip them; graphs replay
     * what they captured): KILN_CUDA_W4_GB=0 scales per chunk always,
     * KILN_CUDA_W4_ZF=0 subtracts the zeros from the codes */
    const char *ge = getenv("KILN_CUDA_W4_GB"), *ze = getenv("KILN_CUDA_W4_ZF");
    int gb = !(ge && !strcmp(ge, "0"));
    for (int i = 0; i < nl; i++) gb &= J.j[i].gsh >= 2;
    const int zf = !(ze && !strcmp(ze, "0")), v = (n > 8) * 8 + glu * 4 + gb * 2 + zf;
#define W4_GO(NT, GLU, GB, ZF) cu_launch(c->stream, k_w4_gemv<NT, GLU, GB, ZF>, tiles, 256, 0, J, x, n)
    switch (v) {
    case 0: W4_GO(1, false, false, false); break;
    case 1: W4_GO(1, false, false, true); break;
    case 2: W4_GO(1, false, true, false); break;
    case 3: W4_GO(1, false, true, true); break;
    case 4: W4_GO(1, true, false, false); break;
    case 5: W4_GO(1, true, false, true); break;
    case 6: W4_GO(1, true, true, false); break;
    case 7: W4_GO(1, true, true, true); break;
    case 8: W4_GO(2, false, false, false); break;
    case 9: W4_GO(2, false, false, true); break;
    case 10: W4_GO(2, false, true, false); break;
    case 11: W4_GO(2, false, true, true); break;
    case 12: W4_GO(2, true, false, false); break;
    case 13: W4_GO(2, true, false, true); break;
    case 14: W4_GO(2, true, true, false); break;
    default: W4_GO(2, true, true, true); break;
    }
#undef W4_GO
    CU_LAUNCHED();
    w4_runs++;
    c->gemv_seq = cu_launch_seq; /* wait-then-release, as gemm.cu's GEMVs */
}

void cu_w4_gemv(struct cuda_ctx *c, bf16 *out, const bf16 *x, const struct cu_linear *L, int n) {
    cu_w4_gemv_multi(c, &out, &L, 1, 0, x, n);
}

const bf16 *cu_w4_dequant(struct cuda_ctx *c, const struct cu_linear *L) {
    const struct cu_w4 *q = L->q4;
    const size_t words = (size_t)q->n_out * (q->n_in / 8);
    bf16 *w = (bf16 *)cu_scratch(c, (void **)&c->w4_deq, &c->w4_deq_cap, words * 16);
    if (!w) return NULL;
    cu_launch(c->stream, k_w4_deq, (unsigned)((words + 255) / 256), 256, 0, w4_args_of(q), w);
    CU_LAUNCHED();
    return w;
}
