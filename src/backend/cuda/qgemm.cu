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
#include "backend/cuda/w4.cuh"

/* ==== host: the layout (w4pack.c) to the device ==== */

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

int cu_w4_prepare(struct cuda_ctx *c, const struct qlinear *w, struct cu_linear *L, int noperm, char *err, size_t errlen) {
    struct w4_pack p;
    const int rc0 = w4_pack(&p, w, err, errlen);
    if (rc0 <= 0) return rc0;
    if (noperm && p.perm) { /* act-order refused before anything goes up */
        w4_pack_free(&p);
        return 0;
    }
    struct cu_w4 *q4 = (struct cu_w4 *)kiln_calloc(1, sizeof *q4);
    q4->n_out = p.n_out, q4->n_in = p.n_in, q4->nkb = p.nkb, q4->ng = p.ng, q4->gsh = p.gsh, q4->sbf = p.sbf;
    int rc = upload(c, (void **)&q4->q, p.q, p.q_bytes, err, errlen);
    if (!rc) rc = upload(c, (void **)&q4->sc, p.sc, p.sc_words * 4, err, errlen);
    if (!rc && p.perm) rc = upload(c, (void **)&q4->perm, p.perm, (size_t)p.n_in * 4, err, errlen);
    q4->bytes = p.q_bytes + p.sc_words * 4 + (p.perm ? (size_t)p.n_in * 4 : 0);
    q4->q_bytes = p.q_bytes, q4->sc_bytes = p.sc_words * 4;
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
    if (!q4->grouped) cudaFree(q4->q), cudaFree(q4->sc);
    cudaFree(q4->perm);
    c->bytes_weights -= q4->bytes;
    free(q4);
    L->q4 = NULL;
}

void cu_w4_group(struct cuda_ctx *c, struct cu_linear *const *Ls, int count) {
    if (count < 2) return;
    for (int i = 0; i < count; i++)
        if (!Ls[i]->q4 || Ls[i]->q4->grouped || Ls[i]->q4->perm) return;
    const void **src = (const void **)kiln_malloc(sizeof *src * 2 * (size_t)count);
    size_t *bytes = (size_t *)kiln_malloc(sizeof *bytes * 2 * (size_t)count);
    for (int i = 0; i < count; i++) {
        const struct cu_w4 *q = Ls[i]->q4;
        src[i] = q->q, bytes[i] = q->q_bytes, src[count + i] = q->sc, bytes[count + i] = q->sc_bytes;
    }
    char *dq = cu_dev_concat(c, src, bytes, count, 0), *ds = dq ? cu_dev_concat(c, src + count, bytes + count, count, 0) : NULL;
    free(src), free(bytes);
    if (!ds) { /* the linears stay apart */
        cudaFree(dq);
        return;
    }
    size_t oq = 0, os = 0;
    for (int i = 0; i < count; i++) {
        struct cu_w4 *q = Ls[i]->q4;
        cudaFree(q->q), cudaFree(q->sc);
        q->q = (uint4 *)(dq + oq), q->sc = (uint32_t *)(ds + os), q->grouped = i > 0;
        oq += q->q_bytes, os += q->sc_bytes;
    }
}

size_t cu_w4_bytes(const struct cu_linear *L) { return L->q4 ? L->q4->bytes : 0; }
int cu_w4_permuted(const struct cu_linear *L) { return L->q4 && L->q4->perm; }
int cu_w4_gsh(const struct cu_linear *L) { return L->q4->gsh; }

/* ==== device ==== */

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
 * the 128-column blocks into contiguous ranges, each warp's K loop
 * (w4_tile_dots, w4.cuh) with U blocks in flight per lane, the first U
 * blocks' codes loaded before the wait.
 */
template <int NT, bool GLU, bool GB, bool ZF>
__global__ void __launch_bounds__(256, NT == 1 ? 2 : 1) k_w4_gemv(const struct w4_jobs J, const bf16 *x, int n) {
    KTRACE();
    constexpr int U = NT == 1 ? 3 : 2, KS = GLU ? 4 : 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
    int T = blockIdx.x, ji = 0;
    if (GLU) ji = warp >= KS;
    else if (J.nj > 1 && T >= J.j[0].tiles) T -= J.j[0].tiles, ji = J.nj > 2 && T >= J.j[1].tiles ? (T -= J.j[1].tiles, 2) : 1;
    const int nkb = J.nkb, wk = warp % KS;
    const int kb0 = wk * nkb / KS, kb1 = (wk + 1) * nkb / KS;
    const uint4 *qp = W4J(J, ji, q) + ((size_t)T * nkb) * 64 + lane * 2;
    const uint32_t *sp = W4J(J, ji, sc) + (size_t)T * W4J(J, ji, ng) * 16;
    float acc[NT][4];
    w4_tile_dots<NT, U, GB, ZF, true>(acc, qp, sp, kb0, kb1, W4J(J, ji, ng), W4J(J, ji, gsh), W4J(J, ji, sbf), J.n_in >> 5,
                                      [&](int i) { return g + 8 * i < n ? x + (size_t)(g + 8 * i) * J.n_in : (const bf16 *)NULL; });
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
 * matrix in the layout's column order (perm NULL) or the checkpoint's;
 * thread i owns 8 columns (one code word) of one row */
__global__ void k_w4_deq(const struct w4_args A, bf16 *__restrict__ w, const int32_t *__restrict__ perm) {
    KTRACE();
    pdl_wait();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)A.n_out * (A.n_in >> 3)) w4_deq_word(A, w, i, perm);
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

/* k_w4_deq of q into w (n_out x n_in bf16), in the checkpoint's column order with perm */
static void w4_deq_launch(struct cuda_ctx *c, const struct cu_w4 *q, bf16 *w, const int32_t *perm) {
    const size_t words = (size_t)q->n_out * (q->n_in / 8);
    cu_launch(c->stream, k_w4_deq, (unsigned)((words + 255) / 256), 256, 0, w4_args_of(q), w, perm);
    CU_LAUNCHED();
}

const bf16 *cu_w4_dequant(struct cuda_ctx *c, const struct cu_linear *L) {
    const struct cu_w4 *q = L->q4;
    bf16 *w = (bf16 *)cu_scratch(c, (void **)&c->w4_deq, &c->w4_deq_cap, (size_t)q->n_out * q->n_in * 2);
    if (w) w4_deq_launch(c, q, w, NULL);
    return w;
}

int cu_w4_widen(struct cuda_ctx *c, struct cu_linear *L) {
    const struct cu_w4 *q = L->q4;
    const size_t bytes = (size_t)q->n_out * q->n_in * 2;
    bf16 *w = NULL;
    if (cudaMalloc(&w, bytes) != cudaSuccess) {
        cudaGetLastError();
        cu_fault(c, bytes, 0);
        return -1;
    }
    w4_deq_launch(c, q, w, q->perm);
    if (CUDA_FAILED(cudaStreamSynchronize(c->stream))) { /* the codes are freed next */
        cudaFree(w);
        return -1;
    }
    cu_w4_release(c, L);
    L->w = w;
    c->bytes_weights += bytes;
    return 0;
}
