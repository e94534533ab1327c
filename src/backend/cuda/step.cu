/*
 * step.cu: a whole decode step at batch 1 as one persistent kernel
 * (opt-in: KILN_CUDA_STEPK=1; not faster than the graph path yet, see
 * docs/cuda.md "The persistent decode step").
 *
 * Why: at batch 1 a step reads every weight once, so it should take the
 * weight bytes over the memory bandwidth. Launched op by op it takes longer:
 * every kernel boundary drains the GPU, and the small ops between the GEMVs
 * (rope and the KV write, attention, the norms) leave DRAM idle for several
 * microseconds each; PDL only lets the next kernel start early. Qwen3-0.6B
 * spends ~37 us per layer on ~7 us of weight bytes.
 *
 * How: the op calls of a decode step are recorded once (the first, eager
 * run of a graph shape: cuda.cu `begin`), compiled into a program of stages
 * (in constant memory), and every later step of that shape runs the program
 * in one launch (`k_step`) instead of replaying a CUDA graph. Stages:
 *
 *   GEMV  out = x W^T (+ bias) for up to 3 jobs that read the same x (q/k/v),
 *         or gate and up together with out = silu(g) * u. Its x is loaded
 *         into shared memory first: a plain activation, the RMSNorm of the
 *         residual stream or of the token's embedding row (every block
 *         computes it; block 0 writes the normed row out). Epilogues: the
 *         residual add folded in (res += out), the argmax of the logits.
 *   ATTN  q/k norm + RoPE, the new token's K/V written to its page slot, and
 *         split-K attention over the cache, the splits of a head merged by
 *         the last one to finish (an atomic counter, as attention.cu's row
 *         kernel).
 *
 * with a grid-wide barrier between stages (an atomic counter; one block per
 * SM, launched cooperatively so that all are resident).
 *
 * Weights never depend on the step's data, so they are streamed ahead of
 * use: each warp walks its share of every GEMV stage in program order (the
 * block's rows of a stage cut in 8; a row in pieces of at most a slot
 * (sk_slotw), or several narrow rows per piece), and lane 0 keeps its slots' pieces
 * in flight into the warp's shared-memory slots with the copy engine
 * (cp.async.bulk, one mbarrier per slot). When the warp has used a slot it
 * refills it with the next piece of the walk, which may belong to a later
 * stage: the copies run ahead across stage ends, barriers and attention
 * (192 KB per SM, 25 MB on an H200).
 * GEMV decomposition: a piece that is one row segment: lane l takes units
 * (16 bytes) l, l+32, ... and the warp sums at the row's last piece; whole
 * rows: 4 rows at a time, x read once per unit for the 4. Row sums are warp
 * sums, so no block barrier sits between pieces.
 * ATTN decomposition: each block is two halves of 4 warps; work item
 * (q head, split) i goes to half i mod 2G; in a half, warp 0 ropes q, warp 1
 * the new k (the first q head of a KV group writes it to the cache), warp 2
 * fetches the new v, while every warp's first 4 cached keys are already
 * loading; then 4 keys per warp per step with an online softmax, and the
 * 4 warps merged in shared memory.
 *
 * Numerics are those of the ops it replaces: the same roundings to bf16
 * (residual after the add, the normed row, q/k after RoPE, the GEMV
 * outputs), f32 accumulation; only summation orders differ.
 *
 * Limits (else the step keeps the graph path; KILN_CUDA_STEPK_WHY=1 says
 * why): one sequence, one token, dense layers (no MoE), bf16 weights with
 * n_in % 8 == 0 and n_in <= 16384, head_dim <= 128, at most SK_MAX_ST
 * stages (45 layers). KILN_CUDA_STEPK_PROF=N prints the N-th step's stage
 * timeline.
 */
#include <math.h>

#include "backend/cuda/cuda.cuh"
#include "backend/cuda/sm90.cuh"

#define SK_CW 8                    /* warps */
#define SK_NT (SK_CW * 32)
#define SK_WRING (24 * 1024)       /* bytes of a warp's weight ring, cut into slots (sk_slotw) */
#define SK_NSW_MAX 12              /* slots per warp at most (2 KB each) */
#define SK_RING (SK_CW * SK_WRING) /* bytes of the weight rings */
#define SK_HD_MAX 128
#define SK_MAX_HEADS 256
#define SK_XS_MAX (16384 * 2)      /* bytes of the GEMV input row in shared memory */
#define SK_XCH (SK_XS_MAX / 2 / (SK_NT * 8)) /* 8-element chunks of that row per thread */
#define SK_ATT_F 1036              /* floats of attention scratch per half (layout in sk_attn) */

enum { SK_GEMV = 1, SK_ATTN = 2 };

struct sk_stage {
    int type;
    union {
        struct { /* GEMV */
            int nj, n_in, glu;
            int n_out[3];
            float eps;
            const bf16 *w[3];
            const float *bias[3];
            bf16 *out[3];
            const bf16 *w2; /* glu: the up weights (w[0] is gate) */
            const float *bias2;
            bf16 *out2;
            const bf16 *x;     /* plain input, or NULL: the norm below */
            const bf16 *nsrc;  /* norm source (the residual stream) ... */
            const bf16 *embed; /* ... or the embedding table's row of the token */
            bf16 *nres;        /* with embed: the residual stream, written with the row */
            const float *nw;
            bf16 *nout; /* the normed row, written by block 0 */
            bf16 *res;  /* epilogue: res[r] = bf16(res[r] + out[r]) */
            int *ids;   /* epilogue: ids[0] = argmax of out (first maximum) */
        };
        struct { /* ATTN */
            const bf16 *q, *k, *v;
            const float *qn, *kn, *inv_freq;
            float af, aeps, sl2;
            bf16 *kc, *vc, *att;
            int nh, nkv, hd, P, ns;
        };
    };
};

struct sk_env {
    int n_st; /* stages, in sk_cst */
    const int *tok, *pos, *row_t, *seq, *pages;
    float *part; /* attention's split partials [nh][ns][hd + 4]: max, sum, 2 unused, unnormalised output */
    int *cnt;    /* splits done per q head, kept zero between launches */
    unsigned *bar; /* [0] grid barrier arrivals, [1] blocks done; zeroed by the last block */
    float *cand_v; /* per block argmax candidates */
    int *cand_i;
    int *ids;
    int nsw, slotw; /* a warp's ring: slots, bytes per slot (sk_slotw) */
    unsigned long long *prof; /* KILN_CUDA_STEPK_PROF: per (stage, block) start and end times, or NULL */
};


/* The program runs from constant memory: every thread reads the same stage
 * fields (a broadcast), and the constant cache keeps them close; from global
 * memory the issuing lane's reads of a stage's geometry waited behind the
 * weight stream in L2 for microseconds. SK_MAX_ST stages: 45 dense layers. */
#define SK_MAX_ST 228
__constant__ struct sk_stage sk_cst[SK_MAX_ST];
static const struct sk_prog *sk_loaded; /* the program now in sk_cst */
static cudaStream_t sk_stream;          /* the stream of the last k_step launch (one per backend) */

struct sk_prog {
    int slotw; /* bytes per ring slot (sk_slotw) */
    struct sk_stage *h_st;
    int n_st, smem;
    int *ids;
};

long cu_sk_count; /* steps run by k_step (tests read it) */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

__device__ __forceinline__ float sk_bf(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ bf16 sk_ldcg(const bf16 *p) { return __ushort_as_bfloat16(__ldcg((const unsigned short *)p)); }

/* acc += 8 bf16 weights . 8 f32 activations (a bf16 is the high half of an f32) */
__device__ __forceinline__ float sk_dotf(float acc, uint4 w, const float *x) {
    const unsigned u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        acc = fmaf(__uint_as_float(u[i] << 16), x[2 * i], acc);
        acc = fmaf(__uint_as_float(u[i] & 0xffff0000u), x[2 * i + 1], acc);
    }
    return acc;
}
__device__ __forceinline__ unsigned long long sk_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
/* the consumer warps (256 threads) and one half of them (128) */
__device__ __forceinline__ void cbar(void) { bar_sync(1, SK_CW * 32); }
__device__ __forceinline__ void hbar(int half) { bar_sync(2 + half, SK_CW * 16); }

/* sum over the consumer threads, in the order of norm.cu's cu_block_sum */
__device__ __forceinline__ float sk_csum(float v, float *red) {
    v = warp_sum(v);
    cbar();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    cbar();
    float t = 0.f;
    for (int i = 0; i < SK_CW; i++) t += red[i];
    return t;
}

__device__ __forceinline__ int sk_rows(const struct sk_stage &S) {
    return S.n_out[0] + (S.nj > 1 ? S.n_out[1] : 0) + (S.nj > 2 ? S.n_out[2] : 0);
}
/* the job holding row r of the concatenation, and its first row */
__device__ __forceinline__ void sk_job(const struct sk_stage &S, int r, int &j, int &js) {
    j = 0, js = 0;
    if (S.nj > 1 && r >= S.n_out[0]) j = 1, js = S.n_out[0];
    if (S.nj > 2 && r >= S.n_out[0] + S.n_out[1]) j = 2, js = S.n_out[0] + S.n_out[1];
}
__device__ __forceinline__ int sk_jn(const struct sk_stage &S, int j) { return j == 0 ? S.n_out[0] : j == 1 ? S.n_out[1] : S.n_out[2]; }
__device__ __forceinline__ const bf16 *sk_jw(const struct sk_stage &S, int j) { return j == 0 ? S.w[0] : j == 1 ? S.w[1] : S.w[2]; }

/*
 * A warp's walk through its weights: for each GEMV stage in program order,
 * the warp's rows (the block's range cut in 8), in pieces of at most PU
 * 16-byte units per matrix: a segment of one row (wide rows) or several
 * whole rows of one job (narrow rows). The warp issues pieces (lane 0, bulk
 * copies into its E.nsw slots) and consumes them in the same order, so the
 * copies run E.nsw pieces ahead, across stage ends and barriers.
 */
struct sk_cur {
    int s, r, whi, k0; /* stage (E.n_st: done), row, the warp's row end in that stage, unit offset in the row */
};

__device__ __forceinline__ int sk_pu(const struct sk_env &E, const struct sk_stage &S) { return E.slotw / 16 / (S.glu ? 2 : 1); }

/* the first piece at or after stage s */
__device__ __forceinline__ void sk_cur_stage(const struct sk_env &E, struct sk_cur &c, int s) {
    const int b = blockIdx.x, G = gridDim.x, w = (threadIdx.x >> 5);
    for (; s < E.n_st; s++) {
        const struct sk_stage &S = sk_cst[s];
        if (S.type != SK_GEMV) continue;
        const int R = sk_rows(S), lo = (int)((long)b * R / G), hi = (int)((long)(b + 1) * R / G);
        const int wlo = lo + (hi - lo) * w / SK_CW, whi = lo + (hi - lo) * (w + 1) / SK_CW;
        if (wlo < whi) {
            c.s = s, c.r = wlo, c.whi = whi, c.k0 = 0;
            return;
        }
    }
    c.s = E.n_st;
}

/* the piece at c: nrp rows (or one row's units [k0, k0 + len)) of job j starting at job row jr */
__device__ __forceinline__ void sk_piece(const struct sk_env &E, const struct sk_stage &S, const struct sk_cur &c, int &j, int &jr, int &nrp,
                                         int &len) {
    int js;
    sk_job(S, c.r, j, js);
    jr = c.r - js;
    const int U = S.n_in >> 3, PU = sk_pu(E, S);
    if (U > PU) {
        nrp = 1, len = min(PU, U - c.k0);
    } else {
        nrp = min(min(PU / U, c.whi - c.r), js + sk_jn(S, j) - c.r), len = U;
    }
}

/* the next piece after c's (nrp rows or len units of a row of U units) */
__device__ __forceinline__ void sk_cur_next(const struct sk_env &E, struct sk_cur &c, int nrp, int len, int U) {
    if (nrp == 1 && c.k0 + len < U) {
        c.k0 += len;
        return;
    }
    c.k0 = 0, c.r += nrp;
    if (c.r >= c.whi) sk_cur_stage(E, c, c.s + 1);
}

/* c moves to the next piece of the walk */
__device__ __forceinline__ void sk_advance(const struct sk_env &E, struct sk_cur &c) {
    int j, jr, nrp, len;
    sk_piece(E, sk_cst[c.s], c, j, jr, nrp, len);
    sk_cur_next(E, c, nrp, len, sk_cst[c.s].n_in >> 3);
}

/* lane 0: the copies of the piece at c into slot `slot` of this warp */
__device__ __forceinline__ void sk_issue(const struct sk_env &E, const struct sk_cur &c, unsigned char *ring, uint64_t *full, int slot) {
    const struct sk_stage &S = sk_cst[c.s];
    int j, jr, nrp, len;
    sk_piece(E, S, c, j, jr, nrp, len);
    const unsigned bytes = (unsigned)nrp * len * 16, dst = smem_u32(ring + (size_t)slot * E.slotw);
    const unsigned fb = smem_u32(&full[slot]);
    const size_t off = (size_t)jr * S.n_in + (size_t)c.k0 * 8;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the slot's last reads before the copy engine writes it */
    mbar_arrive_tx(fb, S.glu ? 2 * bytes : bytes);
    bulk_load(dst, sk_jw(S, j) + off, bytes, fb);
    if (S.glu) bulk_load(dst + bytes, S.w2 + off, bytes, fb);
}

/* the grid barrier among the consumer warps of all blocks */
__device__ __forceinline__ void sk_grid_sync(unsigned *bar, unsigned target) {
    cbar();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1u);
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
        } while (v < target);
    }
    cbar();
}

/* one output row of a GEMV stage: job j, row lr of it (row gr of the concatenation) */
/* one output row of a GEMV stage: job j, row lr of it; rx: the residual's
 * value at lr when the caller has it (NAN: load it) */
__device__ __forceinline__ void sk_emit(const struct sk_stage &S, int j, int lr, float a, float a2, float rx, float &bv, int &bi) {
    const float *bias = j == 0 ? S.bias[0] : j == 1 ? S.bias[1] : S.bias[2];
    bf16 *out = j == 0 ? S.out[0] : j == 1 ? S.out[1] : S.out[2];
    const float v = a + (bias ? bias[lr] : 0.f);
    if (S.glu) {
        const float g = __bfloat162float(__float2bfloat16(v));
        const bf16 u = __float2bfloat16(a2 + (S.bias2 ? S.bias2[lr] : 0.f));
        out[lr] = __float2bfloat16(silu(g) * __bfloat162float(u));
        S.out2[lr] = u;
        return;
    }
    const bf16 y = __float2bfloat16(v);
    out[lr] = y;
    if (S.res) S.res[lr] = __float2bfloat16((rx == rx ? rx : sk_bf(sk_ldcg(S.res + lr))) + sk_bf(y));
    if (S.ids) {
        const float yv = sk_bf(y);
        if (bi == 0x7fffffff) bv = yv, bi = lr; /* the thread's first row, as k_argmax_part */
        else amax_merge(bv, bi, yv, lr);
    }
}

/* all lanes: the residual at row r from the warp's preloaded values (rows
 * r0 .. r0 + 31 of its range), NAN when not preloaded */
__device__ __forceinline__ float sk_res_of(const struct sk_stage &S, float resv, int r0, int whi0, int r) {
    const float v = __shfl_sync(0xffffffffu, resv, (r - r0) & 31);
    return S.res && r - r0 < 32 && r < whi0 ? v : NAN;
}

__device__ void sk_gemv(const struct sk_env &E, int s, unsigned char *smem, uint64_t *full, struct sk_cur &ic, struct sk_cur &cc,
                        int &ki, int &kc, float *red) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, b = blockIdx.x;
    /* the stage's fields from shared memory (read for every piece and row) */
    __shared__ struct sk_stage Sh;
    if (tid < (int)(sizeof(struct sk_stage) / 4)) ((int *)&Sh)[tid] = ((const int *)&sk_cst[s])[tid];
    cbar();
    const struct sk_stage &S = Sh;
    bf16 *xs = (bf16 *)(smem + SK_RING);
    /* a residual epilogue's inputs, loaded now (one L2 round trip under the
     * prologue's, not one per row): lane l holds the warp's row r0 + l */
    const int r0 = cc.s == s ? cc.r : 0, whi0 = cc.s == s ? cc.whi : 0;
    const float resv = S.res && lane < whi0 - r0 ? sk_bf(sk_ldcg(S.res + r0 + lane)) : 0.f;
    const int n_in = S.n_in, U = n_in >> 3;
    /* x into shared memory; every load of a thread issued before the first use (L2 latency under the weight stream) */
    if (S.x) {
        for (int c = tid; c < U; c += SK_CW * 32) ((uint4 *)xs)[c] = __ldcg((const uint4 *)S.x + c);
    } else {
        const bf16 *src = S.embed ? S.embed + (size_t)E.tok[0] * n_in : S.nsrc;
        uint4 xv[SK_XCH];
        float ss = 0.f;
#pragma unroll
        for (int i = 0; i < SK_XCH; i++) {
            const int c = tid * 8 + i * SK_NT * 8;
            if (c < n_in) xv[i] = __ldcg((const uint4 *)(src + c));
        }
#pragma unroll
        for (int i = 0; i < SK_XCH; i++) {
            const int c = tid * 8 + i * SK_NT * 8;
            if (c >= n_in) break;
            if (S.embed && b == 0) *(uint4 *)(S.nres + c) = xv[i];
            float a[8];
            cu_u4_f8(a, xv[i]);
            for (int k = 0; k < 8; k++) ss += a[k] * a[k];
        }
        const float r = rsqrtf(sk_csum(ss, red) / n_in + S.eps);
#pragma unroll
        for (int i = 0; i < SK_XCH; i++) {
            const int c = tid * 8 + i * SK_NT * 8;
            if (c >= n_in) break;
            float a[8];
            cu_u4_f8(a, xv[i]);
            for (int k = 0; k < 8; k++) a[k] = S.nw[c + k] * (a[k] * r);
            cu_store8(xs + c, a);
            if (b == 0) *(uint4 *)(S.nout + c) = *(const uint4 *)(xs + c);
        }
    }
    cbar();
    if (E.prof && tid == 0) E.prof[((size_t)s * gridDim.x + b) * 3 + 1] = sk_now();
    const uint4 *x4 = (const uint4 *)xs;
    unsigned char *ring = smem + (size_t)warp * E.nsw * E.slotw;
    uint64_t *wfull = full + warp * SK_NSW_MAX;
    float bv = -INFINITY, a = 0.f, a2 = 0.f; /* a, a2: a wide row's sums so far (gate, up) */
    int bi = 0x7fffffff;
    while (cc.s == s) {
        int j, jr, nrp, len;
        sk_piece(E, S, cc, j, jr, nrp, len);
        const int slot = kc % E.nsw;
        mbar_wait(smem_u32(&wfull[slot]), (kc / E.nsw) & 1);
        const uint4 *wv = (const uint4 *)(ring + (size_t)slot * E.slotw), *wu = wv + (size_t)nrp * len;
        if (nrp == 1) { /* a row segment: units k0 .. k0 + len */
            for (int i = lane; i < len; i += 32) {
                float xf[8];
                cu_u4_f8(xf, x4[cc.k0 + i]);
                a = sk_dotf(a, wv[i], xf);
                if (S.glu) a2 = sk_dotf(a2, wu[i], xf);
            }
        }
        __syncwarp();
        const bool row_done = nrp > 1 || cc.k0 + len == U;
        if (nrp == 1 && row_done) {
            a = warp_sum(a), a2 = S.glu ? warp_sum(a2) : 0.f;
            const float rx = sk_res_of(S, resv, r0, whi0, jr);
            if (lane == 0) sk_emit(S, j, jr, a, a2, rx, bv, bi);
            a = a2 = 0.f;
        }
        if (nrp > 1) { /* whole rows, 4 at a time: x read once per unit for the 4 */
            for (int q0 = 0; q0 < nrp; q0 += 4) {
                float g[4] = {0.f, 0.f, 0.f, 0.f}, h[4] = {0.f, 0.f, 0.f, 0.f};
                const int qn = min(4, nrp - q0);
                for (int i = lane; i < U; i += 32) {
                    float xf[8];
                    cu_u4_f8(xf, x4[i]);
                    uint4 w4[4], u4[4];
#pragma unroll
                    for (int q = 0; q < 4; q++) w4[q] = wv[(size_t)(q0 + min(q, qn - 1)) * U + i];
                    if (S.glu)
#pragma unroll
                        for (int q = 0; q < 4; q++) u4[q] = wu[(size_t)(q0 + min(q, qn - 1)) * U + i];
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        g[q] = sk_dotf(g[q], w4[q], xf);
                        if (S.glu) h[q] = sk_dotf(h[q], u4[q], xf);
                    }
                }
#pragma unroll
                for (int o = 16; o; o >>= 1)
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        g[q] += __shfl_xor_sync(0xffffffffu, g[q], o);
                        if (S.glu) h[q] += __shfl_xor_sync(0xffffffffu, h[q], o);
                    }
                float gq = g[0], hq = h[0];
#pragma unroll
                for (int q = 1; q < 4; q++)
                    if (lane == q) gq = g[q], hq = h[q];
                const float rx = sk_res_of(S, resv, r0, whi0, jr + q0 + min(lane, qn - 1));
                if (lane < qn) sk_emit(S, j, jr + q0 + lane, gq, hq, rx, bv, bi);
            }
            __syncwarp();
        }
        kc++;
        sk_cur_next(E, cc, nrp, len, U);
        /* the slot is free: the next piece of the walk into it (lane 0 keeps the issue cursor) */
        if (lane == 0 && ic.s < E.n_st) {
            sk_issue(E, ic, ring, wfull, ki % E.nsw);
            ki++;
            sk_advance(E, ic);
        }
    }
    if (S.ids) { /* this block's candidate: the first maximum over its threads */
        __shared__ float cv[SK_CW];
        __shared__ int ci[SK_CW];
        for (int o = 16; o; o >>= 1) amax_merge(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
        cbar();
        if (lane == 0) cv[warp] = bv, ci[warp] = bi;
        cbar();
        if (tid == 0) {
            for (int w = 1; w < SK_CW; w++) amax_merge(bv, bi, cv[w], ci[w]);
            E.cand_v[b] = bv, E.cand_i[b] = bi;
        }
    }
    cbar(); /* xs is rewritten by the next stage */
}

/* one warp: per-head RMSNorm (nw may be NULL) and RoPE of a q or k head,
 * as rope.cu does it; the rounded values to dst (f32), and to the cache */
__device__ void sk_rope_head(const struct sk_stage &S, const bf16 *src, const float *nw, float pos, float *dst, bf16 *cache) {
    const int lane = threadIdx.x & 31, hd = S.hd, half = hd / 2;
    float a[2], b[2], ss = 0.f;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int i = lane + 32 * j;
        a[j] = b[j] = 0.f;
        if (i < half) a[j] = sk_bf(sk_ldcg(src + i)), b[j] = sk_bf(sk_ldcg(src + i + half));
        ss += a[j] * a[j] + b[j] * b[j];
    }
    float r = 1.f;
    if (nw) r = rsqrtf(warp_sum(ss) / hd + S.aeps);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int i = lane + 32 * j;
        if (i >= half) break;
        float x0 = a[j], x1 = b[j];
        if (nw) x0 = nw[i] * (x0 * r), x1 = nw[i + half] * (x1 * r);
        float sn, cn;
        sincosf(pos * S.inv_freq[i], &sn, &cn);
        const float c = cn * S.af, s = sn * S.af;
        const bf16 r0 = __float2bfloat16(x0 * c - x1 * s), r1 = __float2bfloat16(x1 * c + x0 * s);
        dst[i] = sk_bf(r0), dst[i + half] = sk_bf(r1);
        if (cache) cache[i] = r0, cache[i + half] = r1;
    }
}

/* a warp's keys and values of cached tokens t0 .. t0 + 3 (< end, != tn: zeros) */
__device__ __forceinline__ void sk_kv_load(const struct sk_stage &S, const int *pages, int g, int t0, int end, int tn,
                                           float (&kx)[4][4], float (&vx)[4][4]) {
    const int lane = threadIdx.x & 31, hd = S.hd, epl = hd >= 32 ? hd / 32 : 1, lanes = hd / epl;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int t = t0 + u;
#pragma unroll
        for (int e = 0; e < 4; e++) kx[u][e] = vx[u][e] = 0.f;
        if (t < end && t != tn && lane < lanes) {
            const size_t off = (((size_t)pages[t / S.P] * S.nkv + g) * S.P + t % S.P) * hd + lane * epl;
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (e < epl) kx[u][e] = sk_bf(S.kc[off + e]), vx[u][e] = sk_bf(S.vc[off + e]);
        }
    }
}

__device__ void sk_attn(const struct sk_env &E, const struct sk_stage &S, unsigned char *smem) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, half = warp >> 2, wh = warp & 3, th = threadIdx.x & 127;
    /* per half: q, new k, new v (f32), the 4 warps' o, m, l, then the merge's weights */
    float *hs = (float *)(smem + SK_RING) + half * SK_ATT_F;
    float *qs = hs, *ks = hs + 128, *vs = hs + 256, *so = hs + 384, *sm = hs + 896, *sl = hs + 900, *wsp = hs + 904,
          *wsl = hs + 968;
    int *flag = (int *)(hs + 1032);
    const int hd = S.hd, nh = S.nh, nkv = S.nkv, grp = nh / nkv, ns = S.ns, P = S.P;
    const int len = E.row_t[0] + 1, tn = len - 1;
    const float pos = (float)E.pos[0];
    const int *pages = E.pages + E.seq[3];
    const int epl = hd >= 32 ? hd / 32 : 1, lanes = hd / epl;
    const bool act = lane < lanes;
    const int chunk = (len + ns - 1) / ns;
    for (int it = blockIdx.x * 2 + half; it < nh * ns; it += 2 * gridDim.x) {
        const int h = it / ns, sp = it % ns, g = h / grp, beg = sp * chunk, end = min(len, beg + chunk);
        const bool has_new = beg <= tn && tn < end, writer = has_new && h % grp == 0;
        const size_t cb = (((size_t)pages[tn / P] * nkv + g) * P + tn % P) * hd;
        /* the warp's first 4 cached keys and values are loaded before the rope: they do not depend on it */
        float kx[4][4], vx[4][4];
        sk_kv_load(S, pages, g, beg + wh * 4, end, tn, kx, vx);
        if (wh == 0) {
            sk_rope_head(S, S.q + (size_t)h * hd, S.qn, pos, qs, NULL);
        } else if (wh == 1 && has_new) {
            sk_rope_head(S, S.k + (size_t)g * hd, S.kn, pos, ks, writer ? S.kc + cb : NULL);
        } else if (wh == 2 && has_new) {
            for (int i = lane; i < hd; i += 32) {
                const bf16 v = sk_ldcg(S.v + (size_t)g * hd + i);
                vs[i] = sk_bf(v);
                if (writer) S.vc[cb + i] = v;
            }
        }
        hbar(half);
        float qv[4], o[4];
#pragma unroll
        for (int e = 0; e < 4; e++) qv[e] = act && e < epl ? qs[lane * epl + e] * S.sl2 : 0.f, o[e] = 0.f;
        float m = -INFINITY, l = 0.f;
        for (int t0 = beg + wh * 4; t0 < end; t0 += 16) {
            if (t0 != beg + wh * 4) sk_kv_load(S, pages, g, t0, end, tn, kx, vx);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (t0 + u == tn && act) /* the new token, from the rope warps */
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (e < epl) kx[u][e] = ks[lane * epl + e], vx[u][e] = vs[lane * epl + e];
            att_step4<4>(qv, kx, vx, end - t0, m, l, o);
        }
        /* the 4 warps merged; a warp that saw no key has m = -inf, l = 0 */
        if (lane == 0) sm[wh] = m, sl[wh] = l;
        if (act)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (e < epl) so[wh * SK_HD_MAX + lane * epl + e] = o[e];
        hbar(half);
        const float M = fmaxf(fmaxf(sm[0], sm[1]), fmaxf(sm[2], sm[3]));
        float w[4], L = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = sm[i] == -INFINITY ? 0.f : exp2f(sm[i] - M), L += w[i] * sl[i];
        float *pp = E.part + (size_t)h * ns * (hd + 4);
        for (int d = th; d < hd; d += 128) {
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < 4; i++) acc += w[i] * so[i * SK_HD_MAX + d];
            if (ns == 1) S.att[(size_t)h * hd + d] = __float2bfloat16(acc / L);
            else pp[(size_t)sp * (hd + 4) + 4 + d] = acc;
        }
        if (ns > 1) {
            if (th == 0) pp[(size_t)sp * (hd + 4)] = M, pp[(size_t)sp * (hd + 4) + 1] = L;
            /* the last split of head h to finish merges them all (attention.cu's merge arithmetic, splits in order) */
            __threadfence();
            hbar(half);
            if (th == 0) *flag = atomicAdd(&E.cnt[h], 1) == ns - 1;
            hbar(half);
            if (*flag) {
                __threadfence();
                /* every load at once: (max, sum) of split th, and this thread's output element of the first 8 splits */
                if (th < ns) wsp[th] = __ldcg(pp + (size_t)th * (hd + 4)), wsl[th] = __ldcg(pp + (size_t)th * (hd + 4) + 1);
                float o8[8];
#pragma unroll
                for (int i = 0; i < 8; i++) o8[i] = i < ns && th < hd ? __ldcg(pp + (size_t)i * (hd + 4) + 4 + th) : 0.f;
                hbar(half);
                if (th == 0) {
                    float MM = -INFINITY, LL = 0.f;
                    for (int i = 0; i < ns; i++) MM = fmaxf(MM, wsp[i]);
                    for (int i = 0; i < ns; i++) {
                        wsp[i] = wsp[i] == -INFINITY ? 0.f : exp2f(wsp[i] - MM);
                        LL += wsp[i] * wsl[i];
                    }
                    wsl[0] = 1.f / LL;
                }
                hbar(half);
                if (th < hd) {
                    float acc = 0.f;
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        if (i < ns) acc += wsp[i] * o8[i];
                    for (int i = 8; i < ns; i++) acc += wsp[i] * __ldcg(pp + (size_t)i * (hd + 4) + 4 + th);
                    S.att[(size_t)h * hd + th] = __float2bfloat16(acc * wsl[0]);
                }
                if (th == 0) E.cnt[h] = 0;
            }
        }
        hbar(half); /* the half's scratch is rewritten by its next item */
    }
}

#endif

__global__ void __launch_bounds__(SK_NT, 1) k_step(const struct sk_env E) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char sk_smem[];
    __shared__ __align__(8) uint64_t full[SK_CW * SK_NSW_MAX];
    __shared__ float red[SK_CW];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, G = gridDim.x;
    if (lane == 0) {
        for (int i = 0; i < E.nsw; i++) mbar_init(smem_u32(&full[warp * SK_NSW_MAX + i]), 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    /* the warp's first pieces, one per slot, on their way before anything else */
    struct sk_cur ic, cc; /* issue into shared memory, consume */
    sk_cur_stage(E, ic, 0);
    cc = ic;
    int ki = 0, kc = 0;
    unsigned char *ring = sk_smem + (size_t)warp * E.nsw * E.slotw;
    if (lane == 0) {
        for (; ki < E.nsw && ic.s < E.n_st; ki++) {
            sk_issue(E, ic, ring, full + warp * SK_NSW_MAX, ki);
            sk_advance(E, ic);
        }
    }
    unsigned target = 0;
    for (int s = 0; s < E.n_st; s++) {
        const struct sk_stage &S = sk_cst[s];
        if (E.prof && threadIdx.x == 0) E.prof[((size_t)s * G + blockIdx.x) * 3] = sk_now();
        if (S.type == SK_GEMV) sk_gemv(E, s, sk_smem, full, ic, cc, ki, kc, red);
        else sk_attn(E, S, sk_smem);
        if (E.prof) {
            cbar();
            if (threadIdx.x == 0) E.prof[((size_t)s * G + blockIdx.x) * 3 + 2] = sk_now();
        }
        if (s + 1 < E.n_st) sk_grid_sync(E.bar, target += G);
    }
    cbar();
    if (warp == 0) {
        unsigned done = 0;
        if (lane == 0) {
            __threadfence();
            done = atomicAdd(E.bar + 1, 1u);
        }
        done = __shfl_sync(0xffffffffu, done, 0);
        if (done == (unsigned)G - 1) { /* the last block: the argmax over the candidates, and the counters reset */
            __threadfence();
            if (E.ids) {
                float bv = -INFINITY;
                int bi = 0x7fffffff;
                for (int i = lane; i < G; i += 32) amax_merge(bv, bi, __ldcg(E.cand_v + i), __ldcg(E.cand_i + i));
                for (int o = 16; o; o >>= 1) amax_merge(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
                if (lane == 0) E.ids[0] = bi;
            }
            if (lane == 0) E.bar[0] = 0, E.bar[1] = 0;
        }
    }
#endif
}

/* ==== host: the tape, the compiler, the launch ==== */

void cu_sk_rec(struct cuda_ctx *c, int op, void *a, const void *b, const void *y, const void *t, const void *t2, const void *t3,
               int n, int dim, int i0, int i1, float f) {
    if (c->n_tape == c->tape_cap) {
        c->tape_cap = c->tape_cap ? 2 * c->tape_cap : 256;
        c->tape = (struct sk_op *)kiln_realloc(c->tape, sizeof *c->tape * (size_t)c->tape_cap);
    }
    struct sk_op *o = &c->tape[c->n_tape++];
    o->op = op, o->a = a, o->b = b, o->y = y, o->t = t, o->t2 = t2, o->t3 = t3;
    o->n = n, o->dim = dim, o->i0 = i0, o->i1 = i1, o->f = f;
}

/* the GPU runs k_step (sm_90 code, cooperative launch), and KILN_CUDA_STEPK=1
 * asked for it when the backend was created (c->no_sk == 0) */
int cu_sk_enabled(struct cuda_ctx *c) {
    static int ok = -1;
    if (ok < 0) {
        int dev = 0, major = 0, coop = 0;
        cudaFuncAttributes fa;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
        ok = major == 9 && coop && cudaFuncGetAttributes(&fa, k_step) == cudaSuccess && fa.ptxVersion >= 90;
        cudaGetLastError();
    }
    return ok && !c->no_sk;
}

/* why a tape does not compile (KILN_CUDA_STEPK_WHY=1 prints it) */
static int sk_fail(const char *why, int i) {
    static int say = -1;
    if (say < 0) say = getenv("KILN_CUDA_STEPK_WHY") != NULL;
    if (say) fprintf(stderr, "kiln: cuda: decode step kernel not used: %s (op %d)\n", why, i);
    return -1;
}

static int lin_ok(const struct qlinear *q) {
    const struct cu_linear *L = (const struct cu_linear *)q->be;
    return L && L->w && q->n_in % 8 == 0 && !((uintptr_t)L->w & 15) && q->n_in * 2 <= SK_XS_MAX;
}

/* the tape of one decode step -> stages; 0, or -1 when it is not the shape k_step runs */
static int sk_build(struct cuda_ctx *c, struct sk_stage **out, int *n_out, int *xs_bytes) {
    struct sk_stage *st = (struct sk_stage *)kiln_calloc((size_t)c->n_tape + 1, sizeof *st);
    int n = 0, open = 0; /* open: the last stage is a GEMV that may take more jobs */
    struct { int on; const bf16 *src, *embed; bf16 *nres, *out; const float *w; float eps; } pn = {};
    const bf16 *emb_table = NULL; bf16 *emb_x = NULL;
    const void *g_out = NULL, *g_src = NULL;
    const struct sk_op *rope = NULL, *kvw = NULL;
    int xs = 0;
#define FAIL(why) do { free(st); return sk_fail(why, i); } while (0)
    for (int i = 0; i < c->n_tape; i++) {
        const struct sk_op *o = &c->tape[i];
        struct sk_stage *last = n ? &st[n - 1] : NULL;
        if (o->op != SKT_MATMUL) open = 0;
        switch (o->op) {
        case SKT_EMBED:
            if (o->n != 1) FAIL("embed of more than one token");
            emb_table = (const bf16 *)((const struct ktensor *)o->t)->be, emb_x = (bf16 *)o->a;
            break;
        case SKT_NORM: {
            if (o->n != 1 || o->dim % 8) FAIL("norm shape");
            pn = {};
            pn.on = 1, pn.w = (const float *)((const struct ktensor *)o->t)->be, pn.eps = o->f, pn.out = (bf16 *)o->a;
            if (emb_x && o->b == emb_x) pn.embed = emb_table, pn.nres = emb_x, emb_x = NULL;
            else if (g_out && o->b == g_out) pn.src = (const bf16 *)g_src, g_out = NULL;
            else pn.src = (const bf16 *)o->b;
            break;
        }
        case SKT_ADDNORM:
        case SKT_ADD:
            if (!last || last->type != SK_GEMV || last->glu || last->nj != 1 || last->out[0] != o->y || last->res || last->ids)
                FAIL("residual add after something other than a one-job GEMV");
            if (o->op == SKT_ADD && o->n != last->n_out[0]) FAIL("add shape");
            last->res = (bf16 *)o->a;
            if (o->op == SKT_ADDNORM) {
                if (o->n != 1 || o->dim != last->n_out[0]) FAIL("add_rmsnorm shape");
                pn = {};
                pn.on = 1, pn.src = (const bf16 *)o->a, pn.w = (const float *)((const struct ktensor *)o->t)->be, pn.eps = o->f;
                pn.out = (bf16 *)o->b;
            }
            break;
        case SKT_MATMUL: {
            const struct qlinear *q = (const struct qlinear *)o->t;
            const struct cu_linear *L = (const struct cu_linear *)q->be;
            if (o->n != 1 || !lin_ok(q)) FAIL("matmul shape or weight format");
            if (open && last->x == NULL && pn.on == 0 && last->nout == o->b && last->n_in == q->n_in && last->nj < 3) {
                /* one more job on the open stage's normed x */
            } else if (open && last->x == o->b && last->nj < 3 && last->n_in == q->n_in) {
            } else {
                struct sk_stage *s = &st[n++];
                s->type = SK_GEMV, s->n_in = q->n_in;
                if (pn.on && pn.out == o->b) {
                    if (pn.src == NULL && pn.embed == NULL) FAIL("norm source");
                    s->nsrc = pn.src, s->embed = pn.embed, s->nres = pn.nres, s->nw = pn.w, s->eps = pn.eps, s->nout = pn.out;
                    pn.on = 0;
                } else {
                    if (pn.on) FAIL("a norm whose output no matmul reads");
                    s->x = (const bf16 *)o->b;
                }
                last = s;
                open = 1;
            }
            for (int j = 0; j < last->nj; j++)
                if (last->out[j] == o->a) FAIL("two jobs with one output");
            if (o->a == o->b) FAIL("matmul in place");
            const int j = last->nj++;
            last->w[j] = L->w, last->bias[j] = L->bias, last->out[j] = (bf16 *)o->a, last->n_out[j] = q->n_out;
            if (q->n_in * 2 > xs) xs = q->n_in * 2;
            break;
        }
        case SKT_SWIGLU:
            if (!last || last->type != SK_GEMV || last->nj != 2 || last->out[0] != o->b || last->out[1] != o->y || o->a != o->b ||
                o->n != 1 || last->n_out[0] != o->dim || last->n_out[1] != o->dim || last->res)
                FAIL("swiglu not over the two jobs of the last GEMV");
            last->glu = 1, last->nj = 1, last->w2 = last->w[1], last->bias2 = last->bias[1], last->out2 = last->out[1];
            break;
        case SKT_ROPE:
            if (o->n != 1 || rope || o->dim > SK_HD_MAX || o->dim % 8 || o->i0 % o->i1 || o->i0 > SK_MAX_HEADS) FAIL("rope shape");
            rope = o;
            break;
        case SKT_KVW: {
            const struct kv_cache *kv = (const struct kv_cache *)o->a;
            if (!rope || rope->b != o->b || o->n != 1 || kv->dtype != KILN_DTYPE_BF16 || kv->head_dim != rope->dim ||
                kv->n_head_kv != rope->i1)
                FAIL("kv_write without its rope");
            kvw = o;
            break;
        }
        case SKT_ATT: {
            const struct kv_cache *kv = (const struct kv_cache *)o->t;
            if (!kvw || kvw->a != o->t || kvw->i0 != o->i0 || rope->a != o->b || o->i1 != rope->i0) FAIL("attention without its kv_write");
            struct sk_stage *s = &st[n++];
            const struct rope *rp = (const struct rope *)rope->t3;
            s->type = SK_ATTN;
            s->q = (const bf16 *)rope->a, s->k = (const bf16 *)rope->b, s->v = (const bf16 *)kvw->y;
            s->qn = rope->t ? (const float *)((const struct ktensor *)rope->t)->be : NULL;
            s->kn = rope->t2 ? (const float *)((const struct ktensor *)rope->t2)->be : NULL;
            s->inv_freq = (const float *)rp->be, s->af = rp->attn_factor, s->aeps = rope->f;
            s->sl2 = o->f * 1.4426950408889634f;
            s->kc = (bf16 *)kv->k[o->i0], s->vc = (bf16 *)kv->v[o->i0], s->att = (bf16 *)o->a;
            s->nh = rope->i0, s->nkv = rope->i1, s->hd = rope->dim, s->P = kv->page_size, s->ns = c->att_split;
            rope = kvw = NULL;
            break;
        }
        case SKT_GATHER:
            if (o->n != 1 || !o->t || ((const int32_t *)o->t)[0] != 0) FAIL("gather of another row");
            g_out = o->a, g_src = o->b;
            break;
        case SKT_ARGMAX:
            if (!last || last->type != SK_GEMV || last->glu || last->nj != 1 || last->out[0] != o->b || o->n != 1 || last->res)
                FAIL("argmax not of the last GEMV");
            last->ids = (int *)o->a;
            break;
        default:
            FAIL("an op the step kernel does not run");
        }
    }
    int i = c->n_tape;
    if (n > SK_MAX_ST) FAIL("more stages than the constant table holds");
    if (rope || kvw || pn.on || n == 0 || st[n - 1].type != SK_GEMV) FAIL("the step does not end in a GEMV");
    for (int s = 0; s + 1 < n; s++) {
        if (st[s].type == SK_GEMV && st[s].ids) FAIL("argmax before the last stage");
    }
#undef FAIL
    *out = st, *n_out = n, *xs_bytes = xs;
    return 0;
}

/* bytes per ring slot: 8192 (3 per warp), or KILN_CUDA_STEPK_SLOTW (a
 * multiple of 2048 dividing 24 KB). H200 tg128, 0.6B / 8B: 2 KB 606 / -,
 * 4 KB 686 / 166, 8 KB 794 / 207, 12 KB 736 / 200 tok/s (docs/cuda.md) */
static int sk_slotw(void) {
    const char *e = getenv("KILN_CUDA_STEPK_SLOTW");
    const int v = e ? atoi(e) : 0;
    return v >= 2048 && v % 2048 == 0 && SK_WRING % v == 0 ? v : 8192;
}

/* the step's own scratch: `part` bytes of split partials (grown to twice
 * that) and the zeroed barrier counters; -1 when the device has no room
 * (not sticky, so cleared) or a call failed (recorded, cu_dev_fail) */
static int sk_scratch(struct cuda_ctx *c, size_t part) {
    if (part > c->sk_part_cap) {
        if (c->sk_part) {
            CUDA_CHECK(cudaFree(c->sk_part));
            c->bytes_ws -= c->sk_part_cap;
        }
        c->sk_part = NULL, c->sk_part_cap = 0;
        if (cudaMalloc(&c->sk_part, part * 2) != cudaSuccess) {
            cudaGetLastError();
            c->sk_part = NULL;
            return sk_fail("scratch memory", (int)(part * 2));
        }
        c->sk_part_cap = part * 2;
        c->bytes_ws += c->sk_part_cap;
    }
    if (!c->sk_bar) {
        const size_t bytes = 64 + SK_MAX_HEADS * sizeof(int) + (size_t)c->n_sm * 8; /* barriers, head counters, argmax candidates */
        if (cudaMalloc(&c->sk_bar, bytes) != cudaSuccess) {
            cudaGetLastError();
            c->sk_bar = NULL;
            return sk_fail("scratch memory", (int)bytes);
        }
        if (CUDA_FAILED(cu_zero(c, c->sk_bar, bytes))) { /* counters not zeroed: never launched */
            cudaFree(c->sk_bar), c->sk_bar = NULL;
            return -1;
        }
        c->bytes_ws += bytes;
    }
    return 0;
}

void cu_sk_compile(struct cuda_ctx *c, struct cu_graph *g) {
    struct sk_stage *st;
    int n, xs;
    c->tape_on = 0;
    if (sk_build(c, &st, &n, &xs)) return;
    int nh = 0, hd = 0, ns = 1;
    for (int i = 0; i < n; i++)
        if (st[i].type == SK_ATTN) nh = st[i].nh > nh ? st[i].nh : nh, hd = st[i].hd > hd ? st[i].hd : hd, ns = st[i].ns;
    /* scratch of its own (never reallocated under a recorded program) */
    const size_t part = (size_t)nh * ns * (hd + 4) * sizeof(float);
    if (sk_scratch(c, part)) { /* without its scratch the step keeps the graph path */
        free(st);
        return;
    }
    struct sk_prog *p = (struct sk_prog *)kiln_calloc(1, sizeof *p);
    p->n_st = n;
    p->ids = st[n - 1].ids;
    int extra = 2 * SK_ATT_F * (int)sizeof(float);
    if (xs > extra) extra = xs;
    p->smem = SK_RING + extra;
    p->slotw = sk_slotw();
    p->h_st = st;
    int dev = 0, maxs = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&maxs, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (p->smem + 4096 > maxs) { /* + the kernel's static shared memory */
        sk_fail("shared memory", p->smem);
        cu_sk_free(p);
        return;
    }
    static int smem_set = 0;
    if (p->smem > smem_set) {
        CUDA_CHECK(cudaFuncSetAttribute(k_step, cudaFuncAttributeMaxDynamicSharedMemorySize, p->smem));
        smem_set = p->smem;
    }
    g->sk = p;
}

/* a backend's stream is going away */
void cu_sk_forget_stream(cudaStream_t s) {
    if (sk_stream == s) sk_stream = NULL;
}

void cu_sk_free(struct sk_prog *p) {
    if (!p) return;
    if (sk_loaded == p) sk_loaded = NULL;
    free(p->h_st);
    free(p);
}

/* per stage: its work (first start to last end over the blocks) and the
 * barrier before it (last end of the previous stage to its first start) */
static void sk_prof_print(struct cuda_ctx *c, const struct sk_prog *p, unsigned long long *d) {
    const int G = c->n_sm, n = p->n_st;
    unsigned long long *h = (unsigned long long *)kiln_malloc((size_t)n * G * 3 * 8);
    CUDA_CHECK(cudaMemcpyAsync(h, d, (size_t)n * G * 3 * 8, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    CUDA_CHECK(cudaFree(d));
    double sum[3] = {0, 0, 0}, bsum = 0, bytes = 0;
    unsigned long long prev_end = 0, t_first = 0, t_last = 0;
    for (int s = 0; s < n; s++) {
        unsigned long long s0 = ~0ull, s1 = 0, e1 = 0;
        double pro = 0;
        for (int b = 0; b < G; b++) {
            const unsigned long long a = h[((size_t)s * G + b) * 3], e = h[((size_t)s * G + b) * 3 + 2];
            s0 = a < s0 ? a : s0, s1 = a > s1 ? a : s1, e1 = e > e1 ? e : e1;
            if (p->h_st[s].type == SK_GEMV) pro += (h[((size_t)s * G + b) * 3 + 1] - a) / 1e3 / G;
        }
        if (s == 0) t_first = s0;
        t_last = e1;
        const struct sk_stage *S = &p->h_st[s];
        double mb = 0;
        if (S->type == SK_GEMV) {
            long rows = S->n_out[0] + (S->nj > 1 ? S->n_out[1] : 0) + (S->nj > 2 ? S->n_out[2] : 0);
            mb = (double)rows * S->n_in * 2 * (S->glu ? 2 : 1) / 1e6;
        }
        const double work = (e1 - s0) / 1e3, bar = s ? (s0 - prev_end) / 1e3 : 0;
        sum[S->type] += work, bsum += bar, bytes += mb;
        if (s < 12 || s >= n - 2)
            fprintf(stderr, "stepk stage %3d %s %8.2f MB: work %7.2f us (prologue %5.2f, start spread %5.2f), barrier before %5.2f us, %6.2f TB/s\n", s,
                    S->type == SK_GEMV ? (S->glu ? "glu " : S->res ? "gemv+res" : "gemv") : "attn", mb, work, pro, (s1 - s0) / 1e3,
                    bar, mb / work);
        prev_end = e1;
    }
    fprintf(stderr, "stepk total %.1f us: gemv %.1f us, attn %.1f us, barriers %.1f us; %.1f MB, %.2f TB/s\n",
            (t_last - t_first) / 1e3, sum[SK_GEMV], sum[SK_ATTN], bsum, bytes, bytes / ((t_last - t_first) / 1e3));
    free(h);
}

void cu_sk_launch(struct cuda_ctx *c, struct sk_prog *p) {
    struct sk_env E;
    /* the program into constant memory when another one ran last; a launch
     * of another backend (another stream) may still be reading the table */
    if (sk_loaded != p) {
        /* without its program in constant memory the kernel must not run (the batch fails, cu_error) */
        if (sk_stream && sk_stream != c->stream && CUDA_FAILED(cudaStreamSynchronize(sk_stream))) return;
        sk_loaded = NULL;
        if (CUDA_FAILED(cudaMemcpyToSymbolAsync(sk_cst, p->h_st, sizeof(struct sk_stage) * (size_t)p->n_st, 0, cudaMemcpyHostToDevice,
                                                c->stream)))
            return;
        sk_loaded = p;
    }
    sk_stream = c->stream;
    E.n_st = p->n_st;
    E.tok = c->d_tokens, E.pos = c->d_pos, E.row_t = c->d_row_t, E.seq = c->d_seq, E.pages = c->d_pages;
    E.part = c->sk_part;
    E.bar = c->sk_bar;
    E.cnt = (int *)((char *)c->sk_bar + 64);
    E.cand_v = (float *)((char *)c->sk_bar + 64 + SK_MAX_HEADS * sizeof(int));
    E.cand_i = (int *)(E.cand_v + c->n_sm);
    E.ids = p->ids;
    E.slotw = p->slotw, E.nsw = SK_WRING / p->slotw;
    /* KILN_CUDA_STEPK_PROF=N: time the stages of the N-th step (stderr) */
    static long prof_at = -2;
    if (prof_at == -2) {
        const char *pe = getenv("KILN_CUDA_STEPK_PROF");
        prof_at = pe ? atol(pe) : -1;
    }
    E.prof = NULL;
    if (cu_sk_count == prof_at && cudaMalloc(&E.prof, (size_t)p->n_st * c->n_sm * 3 * 8) != cudaSuccess)
        cudaGetLastError(), E.prof = NULL; /* no room: this step is not profiled */
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)c->n_sm), cfg.blockDim = dim3(SK_NT), cfg.dynamicSmemBytes = (size_t)p->smem, cfg.stream = c->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeCooperative;
    at[0].val.cooperative = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    cudaError_t e = cudaLaunchKernelEx(&cfg, k_step, E);
    if (e != cudaSuccess) {
        char call[96];
        snprintf(call, sizeof call, "the launch of the decode step kernel, %d bytes of shared memory", p->smem);
        cu_dev_fail("CUDA", cudaGetErrorName(e), cudaGetErrorString(e), __FILE__, __LINE__, call);
    }
    cu_sk_count++;
    if (E.prof) sk_prof_print(c, p, E.prof);
}
