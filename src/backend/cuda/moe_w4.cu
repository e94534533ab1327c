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
 *  - up to moe_w4_batch tokens (MOE_W4_BATCH_MAX 128): expert by expert
 *    over moe_batch.cu's k_moe_sort grouping, each used expert's codes read
 *    once per 8 of its tokens;
 *  - above: the experts that have rows dequantized into bf16 scratch
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
template <bool GLU, bool GB, bool WT>
__global__ void __launch_bounds__(256, 2) k_moe_w4(const struct moe_w4_mat A, const struct moe_w4_mat B, const bf16 *__restrict__ x,
                                                   bf16 *__restrict__ h, float *__restrict__ yo, const struct moe_w4_rows R) {
    KTRACE();
    /* WT (down only): each warp a whole tile, 8 tiles per block, no split
     * of the columns and no reduction through shared memory */
    static_assert(!(WT && GLU), "a warp per tile: down only");
    constexpr int NT = 1, KS = WT ? 1 : GLU ? 4 : 8, U = 3;
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
    __shared__ float red[8][NT * 4][32];
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
    if (A.gsh >= 2 && B.gsh >= 2)
        cu_launch(c->stream, k_moe_w4<true, true, false>, grid, 256, 0, A, B, x, h, (float *)NULL, R);
    else
        cu_launch(c->stream, k_moe_w4<true, false, false>, grid, 256, 0, A, B, x, h, (float *)NULL, R);
    CU_LAUNCHED();
    w4_moe_runs++;
}

void cu_moe_w4_down(struct cuda_ctx *c, const struct cu_moe_tab *tab, float *yo, const bf16 *h, const int *ue, const int *uo,
                    const int *uc, const int *nu, const int *sel, unsigned ny) {
    const struct moe_w4_mat A = w4_mat(tab, 2);
    const struct moe_w4_rows R = {NULL, ue, uo, uc, nu, sel, 1};
    /* short rows (ffn <= 2,048: 16 column blocks) a warp per tile, else a
     * block per tile with its warps splitting the columns;
     * KILN_CUDA_MOE_W4_WT=0 keeps the latter (read per launch) */
    const char *wt_env = getenv("KILN_CUDA_MOE_W4_WT");
    const int tiles = (A.n_out + 15) / 16, wt = A.nkb <= 16 && !(wt_env && !strcmp(wt_env, "0"));
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
