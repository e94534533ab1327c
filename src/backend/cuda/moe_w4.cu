/*
 * moe_w4.cu: MoE experts kept 4-bit on the GPU (GPTQ / AWQ int4, GGUF
 * Q4_0; the layout of w4pack.h, as qgemm.cu keeps dense linears).
 *
 * Before, an MoE model's quantized experts were widened to bf16 at load:
 * Qwen3-30B-A3B's GPTQ-Int4 release took the 61 GB of its BF16 one, and
 * Qwen3-235B-A22B's fit no single GPU. Now a layer's gate and up (as a
 * pair) and its down stay 4-bit when every expert's matrix of that kind is
 * in the layout with the same group shape (cu_moe_settle); otherwise that
 * kind is widened on the device, once, at load. Act-order (permuted)
 * experts are widened at load (cu_prepare_linear): each expert would need
 * its own permutation of x.
 *
 * Decode and short prompts run moe_w4.cu's kernel in place of the bf16
 * ones:
 *
 *   k_moe_w4<GLU>  block (16-row tile T, used expert y): qgemm.cu's
 *                  tensor-core tile loop (w4_tile_dots) over the expert's
 *                  codes, its tokens' x rows as the B operand's 8 columns,
 *                  8 tokens at a time. GLU: warps 0-3 gate, 4-7 up (each
 *                  over all columns, split in 4), h[slot][r] = silu(g) u
 *                  rounded to bf16 once; down: the 8 warps split the
 *                  columns, y[slot][r] in f32 for k_combine.
 *
 *  - one token (moe_w4_pairs, MOE_W4_PAIRS_MAX): each routed pair its own
 *    block, no grouping (both kinds 4-bit);
 *  - up to moe_w4_batch tokens (MOE_W4_BATCH_MAX 96): expert by expert
 *    over moe_batch.cu's k_moe_sort grouping, each used expert's codes read
 *    once per 8 of its tokens;
 *  - above, with both kinds 4-bit and at most moe_w4_gemm (96) routed rows
 *    per expert on average: k_moe_w4_gemm, GEMMs on the codes over chunks
 *    of 64 of an expert's rows. It wins while the scratch copy's 2.4 GB of
 *    traffic per 30B-A3B layer outweighs cuBLAS's faster tiles (H200:
 *    pp256 16.6k against 8.7k tok/s, pp1024 28.2k against 26.4k; pp2048
 *    30.6k against 40.1k, so 96 rows = 1,536 tokens on 30B-A3B);
 *  - above that: the experts that have rows dequantized into bf16 scratch
 *    (k_moe_w4_deq; grid over (words, expert), blocks of unused experts
 *    exit), then moe.cu's chunked or grouped cuBLAS calls with the
 *    scratch's pointers in place of the weights'.
 *
 * Measured on an H100 (2026-12-06, `kiln bench --dummy qwen3-30b-a3b
 * --quant gptq-int4 --backend cuda`), against the same checkpoint widened
 * to bf16 as before: peak GPU memory 24.4 instead of 79.8 GB; decode
 * 377 tok/s (329 widened; the step is ~3 ms of ~480 short kernels, not the
 * 2.1 GB it reads: docs/cuda.md); prefill of 128 tokens 8.3k tok/s by
 * expert (4.4k through the scratch copy), 512 14.8k (by expert 11.7k;
 * widened 31.4k), 8,192 51.6k (widened 56.9k). Pairs beat the grouping at
 * one token (2.88 against 3.16 ms per step) and lose from two (2: 3.73
 * against 3.51, 4: 5.02 against 3.90).
 * Since then (H200, 2026-12-06, forty-seventh session): down with a warp
 * per tile (decode 425 -> 443 tok/s), the GEMMs on the codes (above), and
 * each kind's experts in one allocation (cuda.cu's cu_prepare_moe: peak
 * 22.8 -> 19.2 GB).
 */
#include <string.h>

#include "backend/cuda/moe_combine.cuh"
#include "backend/cuda/w4.cuh"

/* one kind of a layer's expert matrices (gate, up or down), 4-bit: the
 * device tables of the experts' codes and scale words, and their shared
 * layout */
struct moe_w4_mat {
    const uint4 *const *q;
    const uint32_t *const *sc;
    int n_out, n_in, nkb, ng, gsh, sbf;
};

static struct moe_w4_mat w4_mat(const struct cu_moe_tab *t, int kind) {
    const int E = t->n_expert;
    const struct cu_moe_w4 *k = &t->w4[kind];
    return {(const uint4 *const *)(t->gate + (size_t)kind * E), t->sc + (size_t)kind * E, k->n_out, k->n_in, k->nkb, k->ng, k->gsh, k->sbf};
}

/* the routed rows a k_moe_w4 launch reads: k_moe_sort's grouping (block y:
 * used expert ue[y], its slots uo[y] .. + uc[y], y < *nu; slot s is pair
 * pslot[s]), or with ue NULL each pair its own block (y = pair, expert
 * sel[y], slot y) */
struct moe_w4_rows {
    const int *pslot, *ue, *uo, *uc, *nu, *sel;
    int K;
};

/* k_moe_w4: see the file's comment. Grid (tiles of n_out, min(E, nk), or
 * nk pairs). GLU: x holds the tokens' rows (slot s reads row pair / K),
 * out h; down: x is h (slot s reads row s), out yo. 8 slots per pass (16,
 * NT = 2, ran slower on an H100: 30B-A3B GPTQ-Int4 pp128 7.9k against 8.2k
 * tok/s, decode 325 against 359). */
template <bool GLU, bool GB, bool WT, int NW = 8>
__global__ void __launch_bounds__(NW * 32, 16 / NW) k_moe_w4(const struct moe_w4_mat A, const struct moe_w4_mat B, const bf16 *__restrict__ x,
                                                            bf16 *__restrict__ h, float *__restrict__ yo, const struct moe_w4_rows R) {
    KTRACE();
    /* WT (down only): each warp a whole tile, 8 tiles per block, no split
     * of the columns and no reduction through shared memory. NW: warps per
     * block (4: GLU only, gate and up two warps each, 4 blocks per SM) */
    static_assert(!(WT && GLU), "a warp per tile: down only");
    static_assert(NW == 8 || (NW == 4 && GLU), "4 warps: gate/up only");
    constexpr int NT = 1, KS = WT ? 1 : GLU ? NW / 2 : NW, U = 3;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
    pdl_wait();
    const int y = blockIdx.y, T = WT ? blockIdx.x * 8 + warp : blockIdx.x;
    if (WT && T * 16 >= A.n_out) return; /* no block barrier on this path */
    int e, o, cnt;
    if (R.ue) {
        if (y >= *R.nu) return;
        e = R.ue[y], o = R.uo[y], cnt = R.uc[y];
    } else
        e = R.sel[y], o = y, cnt = 1;
    const bool hi = GLU && warp >= KS; /* up's warps */
    const int nkb = A.nkb, wk = warp % KS, kb0 = wk * nkb / KS, kb1 = (wk + 1) * nkb / KS;
    const int ng = hi ? B.ng : A.ng, gsh = hi ? B.gsh : A.gsh, sbf = hi ? B.sbf : A.sbf, n_in = A.n_in, n_out = A.n_out;
    const uint4 *qp = (hi ? B.q : A.q)[e] + (size_t)T * nkb * 64 + lane * 2;
    const uint32_t *sp = (hi ? B.sc : A.sc)[e] + (size_t)T * ng * 16;
    __shared__ float red[NW][NT * 4][32];
    for (int t0 = 0; t0 < cnt; t0 += 8 * NT) {
        const int nt = min(8 * NT, cnt - t0);
        float acc[NT][4];
        w4_tile_dots<NT, U, GB, true, false>(acc, qp, sp, kb0, kb1, ng, gsh, sbf, n_in >> 5, [&](int i) {
            const int c = g + 8 * i, s = o + t0 + c;
            return c < nt ? x + (size_t)(GLU ? (R.ue ? R.pslot[s] : s) / R.K : s) * n_in : (const bf16 *)NULL;
        });
        if constexpr (WT) { /* accumulator j of lane (g, t): row g + 8 (j / 2), slot 2 t + j % 2 */
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int col = 2 * (lane & 3) + (j & 1), row = T * 16 + g + (j & 2 ? 8 : 0);
                if (col < nt && row < n_out) yo[(size_t)(o + t0 + col) * n_out + row] = acc[0][j];
            }
        } else {
#pragma unroll
            for (int i = 0; i < NT; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) red[warp][i * 4 + j][lane] = acc[i][j];
            __syncthreads();
            if (threadIdx.x < NT * 128) { /* accumulator j of tile i, lane l: row (l / 4) + 8 (j / 2), slot 8 i + 2 (l % 4) + j % 2 */
                const int qd = threadIdx.x >> 5, l = threadIdx.x & 31;
                const int col = (qd >> 2) * 8 + 2 * (l & 3) + (qd & 1), row = T * 16 + (l >> 2) + (qd & 2 ? 8 : 0);
                if (col < nt && row < n_out) {
                    float s = 0.f, s2 = 0.f;
#pragma unroll
                    for (int w = 0; w < KS; w++) {
                        s += red[w][qd][l];
                        if (GLU) s2 += red[KS + w][qd][l];
                    }
                    const size_t slot = (size_t)(o + t0 + col);
                    if (GLU) h[slot * n_out + row] = __float2bfloat16(silu(s) * s2);
                    else yo[slot * n_out + row] = s;
                }
            }
            __syncthreads(); /* red is reused by the next slots */
        }
    }
}

/* k_moe_w4_deq: expert blockIdx.y's matrix as bf16 at w + its index x
 * n_out x n_in, a thread per code word; experts without rows (cnt) skip */
__global__ void k_moe_w4_deq(const struct moe_w4_mat A, const int *__restrict__ cnt, bf16 *__restrict__ w) {
    KTRACE();
    pdl_wait();
    const int e = blockIdx.y;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = (size_t)A.n_out * A.n_in;
    if (!cnt[e] || i >= n / 8) return;
    const struct w4_args a = {A.q[e], A.sc[e], A.n_out, A.n_in, A.nkb, A.ng, A.gsh, A.sbf};
    w4_deq_word(a, w + (size_t)e * n, i, NULL);
}

/*
 * k_moe_w4_gemm: the prefill expert GEMMs on the codes (the forty-second
 * session's k_w4_gemm of branch w4-gemm, with its weights looked up per
 * chunk): for chunk q of 64 rows of xg (all routed to expert ce[q], rows
 * cr[q] .. + 63, padding past the expert's count computed and never read),
 * out_z[r][n] = sum_k x[r][k] W_z[e][n][k], z = blockIdx.z (gate / up, or
 * down alone). Block (bx, q, z): weight rows 64 bx .. + 63 (4 tiles) x the
 * chunk's 64 x rows; 8 warps 2 x 4, warp (wr, wt) tiles 2 wr, 2 wr + 1
 * against x rows 16 wt .. + 15 (two mma column tiles). The 128-column
 * blocks stream through 4 shared-memory stages by cp.async (4 KB of codes,
 * 16 KB of x). Numerics are the GEMV's: A holds 128 + q, products exact,
 * per group s (S - (128 + z) sum x), the sums of x from k_moe_w4_xsum.
 */
#define MW_TN 64
#define MW_S 4
#define MW_STAGE (4096 + MW_TN * 256)
#define MW_SMEM (MW_S * MW_STAGE)

__device__ __forceinline__ void mw_cp16(void *dst, const void *src, bool ok) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(src), "r"(ok ? 16 : 0));
}

/* xs[u][j] = sum of x[j][k] over unit u of `unit` columns (f32), for nu
 * units: those past n_in (the layout's padding to 128 columns, which the
 * GEMM reads with scale 0) hold 0; a thread per (row, unit) */
__global__ void k_moe_w4_xsum(float *__restrict__ xs, const bf16 *__restrict__ x, int n, int n_in, int unit, int nu) {
    KTRACE();
    pdl_wait();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * nu) return;
    const int j = (int)(i % n), u = (int)(i / n);
    float a = 0.f;
    for (int k = u * unit; k < (u + 1) * unit && k < n_in; k += 8) {
        float f[8];
        cu_load8(f, x + (size_t)j * n_in + k);
        for (int e = 0; e < 8; e++) a += f[e];
    }
    xs[(size_t)u * n + j] = a;
}

/* a warp's accumulators (2 weight tiles x NT column tiles) to 0 */
template <int NT>
__device__ __forceinline__ void mw_zero(float (&a)[2][NT][4]) {
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) a[m][i][j] = 0.f;
}

template <bool GB>
__global__ void __launch_bounds__(256, 2) k_moe_w4_gemm(const struct moe_w4_mat A0, const struct moe_w4_mat A1, const int *__restrict__ ce,
                                                        const int *__restrict__ cr, const bf16 *__restrict__ x,
                                                        const float *__restrict__ xsum, int n, bf16 *out0, bf16 *out1) {
    KTRACE();
    constexpr int NT = MW_TN / 32;
    extern __shared__ __align__(16) unsigned char mw_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int wr = warp & 1, wt = warp >> 1;
    pdl_wait();
    const int q = blockIdx.y, e = ce[q], c0 = cr[q];
    const struct moe_w4_mat &W = blockIdx.z ? A1 : A0;
    bf16 *out = blockIdx.z ? out1 : out0;
    const uint4 *Q = W.q[e];
    const uint32_t *SC = W.sc[e];
    const int n_in = W.n_in, n_out = W.n_out, nkb = W.nkb, ng = W.ng, gsh = W.gsh, sbf = W.sbf;
    const int tiles = (n_out + 15) >> 4, T0 = blockIdx.x * 4;
    /* stage s <- block kb: thread i copies code unit i (tile i / 64, lane
     * (i % 64) / 2, half i % 2) and x units i + 256 j (row / 16, unit % 16) */
    auto load = [&](int s, int kb) {
        unsigned char *st = mw_smem + s * MW_STAGE;
        {
            const int i = threadIdx.x, r = i >> 6, v = i & 63, T = T0 + r;
            const bool ok = T < tiles;
            mw_cp16(st + (r * 64 + (v & 1) * 32 + (v >> 1)) * 16, Q + ((size_t)(ok ? T : 0) * nkb + kb) * 64 + v, ok);
        }
        uint4 *xs = (uint4 *)(st + 4096);
#pragma unroll
        for (int j = 0; j < MW_TN / 16; j++) {
            const int i = threadIdx.x + 256 * j, r = i >> 4, u = i & 15, col = kb * 128 + u * 8;
            const bool ok = c0 + r < n && col < n_in;
            mw_cp16(xs + r * 16 + (u ^ ((r & 1) << 2)), ok ? x + (size_t)(c0 + r) * n_in + col : x, ok);
        }
    };
#pragma unroll
    for (int s = 0; s < MW_S - 1; s++) {
        if (s < nkb) load(s, s);
        asm volatile("cp.async.commit_group;");
    }
    float acc[2][NT][4];
    mw_zero(acc);
    const int Tw = T0 + 2 * wr;
    const uint32_t *sp[2];
#pragma unroll
    for (int m = 0; m < 2; m++) sp[m] = SC + (size_t)(Tw + m < tiles ? Tw + m : 0) * ng * 16;
    const int xrow = wt * (MW_TN / 4) + g, xsw = (g & 1) << 2;
    const float *xsp = xsum + c0 + wt * (MW_TN / 4) + 2 * t; /* + unit * n + 8 i: this lane's two x rows of tile i */
    constexpr int ush = GB ? 2 : 0; /* log2 of 32-column chunks per unit of xsum */
    for (int kb = 0; kb < nkb; kb++) {
        unsigned sa[2][4], sb[2][4];
#pragma unroll
        for (int m = 0; m < 2; m++) {
            if (GB) {
                const int gi = (kb * 4) >> gsh;
                sa[m][0] = __ldg(sp[m] + gi * 16 + g), sb[m][0] = __ldg(sp[m] + gi * 16 + g + 8);
            } else if (gsh == 0) { /* groups of 32: a row's four in one 16-byte load (w4_sc_index) */
                const uint4 a4 = __ldg((const uint4 *)(sp[m] + W4_SC_INDEX(0, ng, 0, kb, 0, g)));
                const uint4 b4 = __ldg((const uint4 *)(sp[m] + W4_SC_INDEX(0, ng, 0, kb, 0, g + 8)));
                sa[m][0] = a4.x, sa[m][1] = a4.y, sa[m][2] = a4.z, sa[m][3] = a4.w;
                sb[m][0] = b4.x, sb[m][1] = b4.y, sb[m][2] = b4.z, sb[m][3] = b4.w;
            } else {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int gi = (kb * 4 + u) >> gsh;
                    sa[m][u] = __ldg(sp[m] + gi * 16 + g), sb[m][u] = __ldg(sp[m] + gi * 16 + g + 8);
                }
            }
        }
        asm volatile("cp.async.wait_group %0;" ::"n"(MW_S - 2));
        __syncthreads();
        if (kb + MW_S - 1 < nkb) load((kb + MW_S - 1) % MW_S, kb + MW_S - 1);
        asm volatile("cp.async.commit_group;");
        const unsigned char *st = mw_smem + (kb % MW_S) * MW_STAGE;
        const uint4 *cs = (const uint4 *)st, *xs = (const uint4 *)(st + 4096);
        uint4 wa[2], wb[2];
#pragma unroll
        for (int m = 0; m < 2; m++) wa[m] = cs[(2 * wr + m) * 64 + lane], wb[m] = cs[(2 * wr + m) * 64 + 32 + lane];
        float sum[2][NT][4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            if (!GB || u == 0) mw_zero(sum);
            uint4 xv[NT];
#pragma unroll
            for (int i = 0; i < NT; i++) xv[i] = xs[(xrow + 8 * i) * 16 + ((4 * u + t) ^ xsw)];
#pragma unroll
            for (int m = 0; m < 2; m++) {
                const unsigned w0 = u == 0 ? wa[m].x : u == 1 ? wa[m].y : u == 2 ? wa[m].z : wa[m].w;
                const unsigned w1 = u == 0 ? wb[m].x : u == 1 ? wb[m].y : u == 2 ? wb[m].z : wb[m].w;
                unsigned a0[4], a1[4];
                a0[0] = w4_code(w0, 0), a0[1] = w4_code(w1, 0), a0[2] = w4_code(w0, 1), a0[3] = w4_code(w1, 1);
                a1[0] = w4_code(w0, 2), a1[1] = w4_code(w1, 2), a1[2] = w4_code(w0, 3), a1[3] = w4_code(w1, 3);
#pragma unroll
                for (int i = 0; i < NT; i++) mma16816(sum[m][i], a0, xv[i].x, xv[i].y), mma16816(sum[m][i], a1, xv[i].z, xv[i].w);
            }
            if (!GB || u == 3) { /* the group's end (or the block's): s (S - (128 + z) sum x) into acc */
                const int su = GB ? 0 : u, unit = (kb * 4 + u) >> ush;
                float2 xsv[NT];
#pragma unroll
                for (int i = 0; i < NT; i++) xsv[i] = *(const float2 *)(xsp + (size_t)unit * n + 8 * i);
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    const float fa = w4_scale(sa[m][su], sbf), fb = w4_scale(sb[m][su], sbf);
                    const float za = __uint_as_float(sa[m][su] & 0xFFFF0000u), zb = __uint_as_float(sb[m][su] & 0xFFFF0000u);
#pragma unroll
                    for (int i = 0; i < NT; i++) {
                        acc[m][i][0] = fmaf(fmaf(-za, xsv[i].x, sum[m][i][0]), fa, acc[m][i][0]);
                        acc[m][i][1] = fmaf(fmaf(-za, xsv[i].y, sum[m][i][1]), fa, acc[m][i][1]);
                        acc[m][i][2] = fmaf(fmaf(-zb, xsv[i].x, sum[m][i][2]), fb, acc[m][i][2]);
                        acc[m][i][3] = fmaf(fmaf(-zb, xsv[i].y, sum[m][i][3]), fb, acc[m][i][3]);
                    }
                }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;");
    /* accumulator j of (m, i), lane (g, t): weight row 16 (Tw + m) + g + 8 (j / 2), x row 8 i + 2 t + j % 2 */
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int row = (Tw + m) * 16 + g + (j & 2 ? 8 : 0);
            if (row >= n_out) continue;
#pragma unroll
            for (int i = 0; i < NT; i++) {
                const int col = c0 + wt * (MW_TN / 4) + 8 * i + 2 * t + (j & 1);
                if (col < n) out[(size_t)col * n_out + row] = __float2bfloat16(acc[m][i][j]);
            }
        }
}

/* ==== host ==== */

static const struct cu_w4 *q4_of(const struct qlinear *w) { return ((const struct cu_linear *)w->be)->q4; }

/* the experts' matrices of one kind all 4-bit, unpermuted, in one layout
 * (and that of `like`, when given) */
static int kind_uniform(const struct qlinear *ws, int E, const struct cu_w4 *like) {
    const struct cu_w4 *a = like ? like : q4_of(&ws[0]);
    for (int e = 0; e < E; e++) {
        const struct cu_w4 *q = q4_of(&ws[e]);
        if (!a || !q || q->perm || q->n_out != a->n_out || q->n_in != a->n_in || q->ng != a->ng || q->gsh != a->gsh || q->sbf != a->sbf)
            return 0;
    }
    return 1;
}

static int widen_kind(struct cuda_ctx *c, const struct qlinear *ws, int E) {
    for (int e = 0; e < E; e++)
        if (q4_of(&ws[e]) && cu_w4_widen(c, (struct cu_linear *)ws[e].be)) return -1;
    return 0;
}

int cu_moe_settle(struct cuda_ctx *c, const struct moe_ffn *m) {
    const int E = m->n_expert;
    if (!kind_uniform(m->gate, E, NULL) || !kind_uniform(m->up, E, q4_of(&m->gate[0]))) {
        if (widen_kind(c, m->gate, E) || widen_kind(c, m->up, E)) return -1;
    }
    if (!kind_uniform(m->down, E, NULL) && widen_kind(c, m->down, E)) return -1;
    return 0;
}

void cu_moe_w4_kinds(const struct moe_ffn *m, struct cu_moe_w4 *k) {
    const struct qlinear *ws[3] = {m->gate, m->up, m->down};
    for (int i = 0; i < 3; i++) {
        const struct cu_w4 *q = q4_of(&ws[i][0]);
        k[i] = q ? (struct cu_moe_w4){1, q->n_out, q->n_in, q->nkb, q->ng, q->gsh, q->sbf} : (struct cu_moe_w4){0, 0, 0, 0, 0, 0, 0};
    }
}

const void *cu_moe_w4_ptr(const struct qlinear *w, int sc) {
    const struct cu_w4 *q = q4_of(w);
    return !q ? NULL : sc ? (const void *)q->sc : (const void *)q->q;
}

static long w4_moe_runs;
extern "C" long kiln_cuda_moe_w4_count(void);
extern "C" long kiln_cuda_moe_w4_count(void) { return w4_moe_runs; }

void cu_moe_w4_gate_up(struct cuda_ctx *c, const struct cu_moe_tab *tab, bf16 *h, const bf16 *x, const int *pslot, const int *ue,
                       const int *uo, const int *uc, const int *nu, const int *sel, int K, unsigned ny) {
    const struct moe_w4_mat A = w4_mat(tab, 0), B = w4_mat(tab, 1);
    const struct moe_w4_rows R = {pslot, ue, uo, uc, nu, sel, K};
    const dim3 grid((unsigned)(A.n_out + 15) / 16, ny);
    /* KILN_CUDA_MOE_W4_GU_WARPS=4: blocks of 4 warps, 4 per SM, so one
     * token's 384 blocks (30B-A3B) are resident at once instead of 264 + 120 */
    const bool gb = A.gsh >= 2 && B.gsh >= 2;
#define GO(GB, NW) cu_launch(c->stream, k_moe_w4<true, GB, false, NW>, grid, NW * 32, 0, A, B, x, h, (float *)NULL, R)
    if (c->moe_w4_gu_warps == 4) {
        if (gb) GO(true, 4);
        else GO(false, 4);
    } else {
        if (gb) GO(true, 8);
        else GO(false, 8);
    }
#undef GO
    CU_LAUNCHED();
    w4_moe_runs++;
}

void cu_moe_w4_down(struct cuda_ctx *c, const struct cu_moe_tab *tab, float *yo, const bf16 *h, const int *ue, const int *uo,
                    const int *uc, const int *nu, const int *sel, unsigned ny) {
    const struct moe_w4_mat A = w4_mat(tab, 2);
    const struct moe_w4_rows R = {NULL, ue, uo, uc, nu, sel, 1};
    /* short rows (ffn <= 2,048: 16 column blocks) a warp per tile, else a
     * block per tile with its warps splitting the columns (always under
     * KILN_CUDA_MOE_W4_WT=0; the warp per tile was 443 against 425 tok/s
     * on 30B-A3B's decode) */
    const int tiles = (A.n_out + 15) / 16, wt = A.nkb <= 16 && c->moe_w4_wt;
    const dim3 grid((unsigned)(wt ? (tiles + 7) / 8 : tiles), ny);
#define GO(GB, WT) cu_launch(c->stream, k_moe_w4<false, GB, WT>, grid, 256, 0, A, A, h, (bf16 *)NULL, yo, R)
    if (A.gsh >= 2) {
        if (wt) GO(true, true);
        else GO(true, false);
    } else {
        if (wt) GO(false, true);
        else GO(false, false);
    }
#undef GO
    CU_LAUNCHED();
    w4_moe_runs++;
}

int cu_moe_w4_dequant(struct cuda_ctx *c, const struct cu_moe_tab *tab, const int *dcnt, const bf16 **hw) {
    const int E = tab->n_expert;
    size_t bytes = 0;
    for (int k = 0; k < 3; k++)
        if (tab->w4[k].on) bytes += (size_t)E * tab->w4[k].n_out * tab->w4[k].n_in * 2;
    bf16 *w = (bf16 *)cu_scratch(c, (void **)&c->w4_deq, &c->w4_deq_cap, bytes);
    if (!w) return -1; /* out of device memory: cu_error reports it */
    for (int k = 0; k < 3; k++) {
        const struct cu_moe_w4 *q = &tab->w4[k];
        for (int e = 0; e < E; e++) hw[(size_t)k * E + e] = q->on ? w + (size_t)e * q->n_out * q->n_in : tab->host[(size_t)k * E + e];
        if (!q->on) continue;
        const size_t words = (size_t)q->n_out * q->n_in / 8;
        cu_launch(c->stream, k_moe_w4_deq, dim3((unsigned)((words + 255) / 256), (unsigned)E), 256, 0, w4_mat(tab, k), dcnt, w);
        CU_LAUNCHED();
        w += (size_t)E * q->n_out * q->n_in;
    }
    return 0;
}

static long w4_gemm_runs;
extern "C" long kiln_cuda_moe_w4_gemm_count(void);
extern "C" long kiln_cuda_moe_w4_gemm_count(void) { return w4_gemm_runs; }

template <bool GB>
static void w4_gemm_go(struct cuda_ctx *c, const struct moe_w4_mat &A0, const struct moe_w4_mat &A1, int nz, const int *ce, const int *cr,
                       int nc, const bf16 *x, const float *xs, int n, bf16 *out0, bf16 *out1) {
    static bool attr_set = false;
    if (!attr_set) {
        CUDA_CHECK(cudaFuncSetAttribute(k_moe_w4_gemm<GB>, cudaFuncAttributeMaxDynamicSharedMemorySize, MW_SMEM));
        attr_set = true;
    }
    const dim3 grid((unsigned)((A0.n_out + 63) / 64), (unsigned)nc, (unsigned)nz);
    cu_launch(c->stream, k_moe_w4_gemm<GB>, grid, 256, MW_SMEM, A0, A1, ce, cr, x, xs, n, out0, out1);
    CU_LAUNCHED();
}

/* the sums of x's rows over units of 128 (GB) or 32 columns, every unit of
 * the nkb 128-column blocks the GEMM reads, into scratch; NULL when out of
 * memory */
static const float *w4_xsum(struct cuda_ctx *c, const bf16 *x, int n, int n_in, int nkb, int gb) {
    const int unit = gb ? 128 : 32, nu = gb ? nkb : 4 * nkb;
    float *xs = (float *)cu_scratch(c, (void **)&c->w4_deq, &c->w4_deq_cap, (size_t)nu * n * 4);
    if (!xs) return NULL;
    const size_t total = (size_t)nu * n;
    cu_launch(c->stream, k_moe_w4_xsum, (unsigned)((total + 255) / 256), 256, 0, xs, x, n, n_in, unit, nu);
    CU_LAUNCHED();
    return xs;
}

int cu_moe_w4_gemm(struct cuda_ctx *c, const struct cu_moe_tab *tab, const int *dce, const int *dcr, int nc, bf16 *xg, bf16 *hg,
                   bf16 *hu, bf16 *y, int rows) {
    const struct moe_w4_mat G = w4_mat(tab, 0), U = w4_mat(tab, 1), D = w4_mat(tab, 2);
    const int gb = G.gsh >= 2 && U.gsh >= 2, gbd = D.gsh >= 2;
    const float *xs = w4_xsum(c, xg, rows, G.n_in, G.nkb, gb);
    if (!xs) return -1;
    if (gb) w4_gemm_go<true>(c, G, U, 2, dce, dcr, nc, xg, xs, rows, hg, hu);
    else w4_gemm_go<false>(c, G, U, 2, dce, dcr, nc, xg, xs, rows, hg, hu);
    cu_swiglu_raw(c, hg, hg, hu, (size_t)rows * G.n_out);
    if (!(xs = w4_xsum(c, hg, rows, D.n_in, D.nkb, gbd))) return -1;
    if (gbd) w4_gemm_go<true>(c, D, D, 1, dce, dcr, nc, hg, xs, rows, y, y);
    else w4_gemm_go<false>(c, D, D, 1, dce, dcr, nc, hg, xs, rows, y, y);
    w4_gemm_runs++;
    return 0;
}
