/*
 * moe.cu: the sparse MoE FFN (Qwen3-MoE semantics, as cpu/moe.c):
 *
 *   logits = router(x) in f32; p = softmax(logits); top-k of p (ties to the
 *   lower id); renormalise if norm_topk; y = sum_k p_k * expert_k(x)
 *
 * Routing stays on the device. Then three paths:
 *  - direct (n <= cuda_ctx.moe_direct tokens, decode): each routed (token, slot)
 *    streams its expert's gate/up rows straight from a device table of expert
 *    pointers (gemm.cu k_moe_gate_up), and one kernel does the down
 *    projections and the weighted sum (k_moe_down). No host round trip, so a
 *    decode step stays one CUDA graph.
 *  - batch (up to cuda_ctx.moe_batch tokens; moe_batch.cu): each expert
 *    with routed rows read once for all of them, found on the device.
 *  - 4-bit experts (moe_w4.cu): pair by pair or expert by expert with
 *    kernels on the codes, or above moe_w4_batch tokens the grouped path on
 *    a bf16 scratch copy of the experts that have rows.
 *  - grouped (prefill): a counting sort on the device groups the routed rows
 *    by expert (k_moe_count, k_moe_place), the per-expert counts come back
 *    to the host (one sync per layer: they are the GEMM sizes), the rows are
 *    gathered into one block, each expert's rows a contiguous slice. The
 *    expert GEMMs (cuBLAS; every expert's weights read once) run as two
 *    batched calls over chunks of T rows (each expert's slice starting on a
 *    multiple of T, its last chunk padded), or with few rows per expert as
 *    two grouped calls of one problem per expert. A combine kernel sums each
 *    token's k results in slot order.
 */
#include <string.h>

#include "backend/cuda/cuda.cuh"
#include "backend/cuda/moe_combine.cuh"


/* the per-layer device tables of expert pointers; NULL when device memory
 * runs out (recorded by cu_fault). A table is found by the moe_ffn's host
 * `gate` array, and checked against the experts' device pointers: a model
 * freed and another loaded can get the same host address (malloc reuses
 * it), and its layer must not run on the freed model's pointers. That
 * happened in make test-cuda, one MoE case after another, as an illegal
 * address now and then (eighteenth session). First the layer's expert
 * kinds are settled: 4-bit in one layout, or widened (moe_w4.cu). */
const struct cu_moe_tab *cu_moe_table(struct cuda_ctx *c, const struct moe_ffn *m) {
    const int E = m->n_expert;
    if (cu_moe_settle(c, m)) return NULL; /* out of device memory: cu_error reports it */
    const struct qlinear *ws[3] = {m->gate, m->up, m->down};
    const bf16 **h = (const bf16 **)kiln_malloc(sizeof(bf16 *) * 6 * (size_t)E);
    for (int k = 0; k < 3; k++)
        for (int e = 0; e < E; e++) {
            const struct cu_linear *L = (const struct cu_linear *)ws[k][e].be;
            h[(size_t)k * E + e] = L->q4 ? (const bf16 *)cu_moe_w4_ptr(&ws[k][e], 0) : L->w;
            h[(size_t)(3 + k) * E + e] = (const bf16 *)cu_moe_w4_ptr(&ws[k][e], 1);
        }
    const size_t bytes = sizeof(bf16 *) * 6 * (size_t)E;
    for (int i = 0; i < c->n_moe_tabs; i++) {
        struct cu_moe_tab *t = &c->moe_tabs[i];
        if (t->key != (const void *)m->gate || t->n_expert != E) continue;
        if (memcmp(t->host, h, bytes)) { /* another model's layer at the old address: new pointers, in stream order */
            free(t->host);
            t->host = h;
            cu_moe_w4_kinds(m, t->w4);
            if (CUDA_FAILED(cudaMemcpyAsync((void *)t->gate, h, bytes, cudaMemcpyHostToDevice, c->stream))) {
                memset(t->host, 0, bytes); /* matches no layer: the next call uploads again */
                return NULL;               /* the batch fails (cu_error) */
            }
        } else
            free(h);
        return t;
    }
    const bf16 **d = NULL;
    if (cudaMalloc(&d, bytes) != cudaSuccess) { /* out of device memory: cu_error reports it */
        cudaGetLastError();
        free(h);
        cu_fault(c, bytes, 0);
        return NULL;
    }
    if (CUDA_FAILED(cu_h2d(c, d, h, bytes))) { /* the batch fails (cu_error) */
        cudaFree(d), free(h);
        return NULL;
    }
    c->bytes_ws += bytes;
    c->moe_tabs = (struct cu_moe_tab *)kiln_realloc(c->moe_tabs, sizeof *c->moe_tabs * (size_t)(c->n_moe_tabs + 1));
    struct cu_moe_tab *t = &c->moe_tabs[c->n_moe_tabs++];
    t->key = m->gate, t->n_expert = E, t->host = h, t->gate = d, t->up = d + E, t->down = d + 2 * E;
    t->sc = (const uint32_t *const *)(d + 3 * E);
    cu_moe_w4_kinds(m, t->w4);
    return t;
}

/*
 * k_route: softmax over E router logits and top-K. Decomposition: block i
 * routes token i. Warp 0 does the softmax (lane-strided max and sum, xor
 * trees) into shared memory and keys each probability; then all 256 threads
 * rank the experts at once: an expert's rank is how many others beat it (a
 * higher key, or the same key and a lower id), counted by S = 256 / E
 * threads per expert over slices of the others (a thread per expert and
 * several experts per thread when E > 256), summed by shared atomics. The
 * experts of rank < K are the choices, slot = rank. A thread stops counting
 * once its slice holds K beaters: that expert is out, and every rank < K
 * is still exact.
 * Keys: a probability (>= 0) keys as its bits + 2, so unsigned order is its
 * order; a NaN one as 1, below every probability, so choices are still made,
 * < E, from NaN logits (broken weights), as the CPU backend's first untaken
 * ids. Ties go to the lower id, as on the CPU.
 * With tab (decode's direct path): the layer's 3E expert pointers (gate |
 * up | down) are copied to shared memory before the wait (they never
 * change), and the chosen experts' three pointers are written to selp, so
 * the expert GEMVs that follow make one dependent load (selp) where they
 * made two (sel, then the table).
 * Measured on the H200 (ktrace marks, Qwen3-30B-A3B, E = 128, K = 8): the
 * choices took 2.2 us as K rounds of warp reductions, each waiting for the
 * winner's lane to rescan its experts (and 3.2 us as K shuffle argmaxes).
 * Shared memory: route_smem.
 */
__global__ void __launch_bounds__(256) k_route(int *__restrict__ sel, float *__restrict__ wsel, const bf16 **__restrict__ selp,
                                               const bf16 *const *__restrict__ tab, const float *__restrict__ logits, int E,
                                               int K, int norm_topk) {
    KTRACE();
    extern __shared__ __align__(16) unsigned char rsm[];
    const int nc = (E + 31) / 32; /* chunks of 32 keys */
    unsigned *key = (unsigned *)rsm; /* 32 nc keys, 0 past E: 0 never beats a key (>= 1) */
    const bf16 **st = (const bf16 **)(key + 32 * nc);
    float *p = (float *)(st + (tab ? 3 * E : 0)), *pk = p + E;
    int *rank = (int *)(pk + K);
    if (tab)
        for (int j = threadIdx.x; j < 3 * E; j += blockDim.x) st[j] = tab[j];
    const int i = blockIdx.x, lane = threadIdx.x & 31, nt = blockDim.x;
    for (int e = E + threadIdx.x; e < 32 * nc; e += nt) key[e] = 0;
    pdl_wait();
    KTRACE_MARK(0); /* past the wait */
    if (threadIdx.x < 32) {
        const float *l = logits + (size_t)i * E;
        float mx = -INFINITY;
        for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
        for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.f;
        for (int e = lane; e < E; e += 32) sum += (p[e] = expf(l[e] - mx));
        for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const float inv = 1.f / sum;
        for (int e = lane; e < E; e += 32) {
            const float v = p[e] * inv;
            p[e] = v, key[e] = v == v ? __float_as_uint(v) + 2u : 1u, rank[e] = 0;
        }
    }
    __syncthreads(); /* also the pointer table's and the padding's */
    KTRACE_MARK(1); /* softmax done */
    /* S threads per expert, thread s of them counting over chunks
     * [nc s / S, nc (s + 1) / S); a chunk's 32 keys as 8 16-byte loads that
     * every lane of the warp makes at the same address (a broadcast) */
    const int S = E <= nt ? min(nt / E, nc) : 1;
    for (int t = threadIdx.x; t < E * S; t += nt) {
        const int e = t % E, s = t / E;
        const unsigned ke = key[e];
        int c = 0;
        for (int ch = nc * s / S; ch < nc * (s + 1) / S && c < K; ch++) {
            /* f beats e iff key[f] >= key[e] + (f > e): in a chunk wholly
             * before e a tie beats, wholly after it does not, and e's own
             * chunk compares per key */
            const uint4 *kv = (const uint4 *)(key + 32 * ch);
            const int d = e - 32 * ch;
            if (d < 0 || d > 31) {
                const unsigned th = d > 31 ? ke : ke + 1;
#pragma unroll
                for (int v = 0; v < 8; v++) {
                    const uint4 k4 = kv[v];
                    c += (k4.x >= th) + (k4.y >= th) + (k4.z >= th) + (k4.w >= th);
                }
            } else {
#pragma unroll
                for (int v = 0; v < 8; v++) {
                    const uint4 k4 = kv[v];
                    c += (k4.x >= ke + (4 * v >= d)) + (k4.y >= ke + (4 * v + 1 >= d)) + (k4.z >= ke + (4 * v + 2 >= d)) +
                         (k4.w >= ke + (4 * v + 3 >= d));
                }
            }
        }
        if (c) atomicAdd(&rank[e], c);
    }
    __syncthreads();
    KTRACE_MARK(2); /* ranks counted */
    for (int e = threadIdx.x; e < E; e += nt) {
        const int r = rank[e];
        if (r < K) {
            const size_t j = (size_t)i * K + r;
            sel[j] = e, pk[r] = p[e];
            if (tab) selp[3 * j] = st[e], selp[3 * j + 1] = st[E + e], selp[3 * j + 2] = st[2 * E + e];
        }
    }
    __syncthreads();
    KTRACE_MARK(3); /* top K written */
    for (int r = threadIdx.x; r < K; r += nt) {
        float tot = 0.f; /* in slot order, as the CPU backend adds them */
        for (int k = 0; k < K; k++) tot += pk[k];
        wsel[(size_t)i * K + r] = norm_topk ? pk[r] / tot : pk[r];
    }
}

/* k_route's shared memory, bytes (its layout: keys, pointers, p, pk, rank) */
static size_t route_smem(int E, int K, int ptr) {
    return (size_t)32 * ((E + 31) / 32) * 4 + (ptr ? 3 * (size_t)E * sizeof(void *) : 0) + (size_t)(2 * E + K) * 4;
}

/*
 * The counting sort of the routed pairs j = i*K + k by expert, as the host
 * did it (stable: ascending j within an expert), in two launches.
 * k_moe_count: block e counts the pairs routed to expert e.
 * k_moe_place: block e sums the rows of the experts before it (its first
 * slot; each expert's count rounded up to a multiple of T, so that its rows
 * start on a chunk boundary: moe_chunk_rows) and walks the pairs in order,
 * 256 at a time: a pair's rank among the chunk's pairs of expert e is a
 * ballot prefix within its warp plus the counts of the warps before it;
 * pos[j] = its slot.
 */
__global__ void k_moe_count(int *__restrict__ cnt, const int *__restrict__ sel, int nk) {
    KTRACE();
    pdl_wait();
    const int e = blockIdx.x;
    int c = 0;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) c += sel[j] == e;
    for (int o = 16; o; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    __shared__ int ws[32];
    if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = 0;
        for (int w = 0; w < (int)blockDim.x / 32; w++) t += ws[w];
        cnt[e] = t;
    }
}

__global__ void k_moe_place(int *__restrict__ pos, const int *__restrict__ sel, const int *__restrict__ cnt, int nk, int T) {
    KTRACE();
    pdl_wait();
    const int e = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x / 32;
    __shared__ int base, wc[32];
    if (threadIdx.x == 0) {
        int b = 0;
        for (int i = 0; i < e; i++) b += (cnt[i] + T - 1) / T * T;
        base = b;
    }
    __syncthreads();
    for (int j0 = 0; j0 < nk; j0 += blockDim.x) {
        const int j = j0 + threadIdx.x, hit = j < nk && sel[j] == e;
        const unsigned m = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) wc[warp] = __popc(m);
        __syncthreads();
        int before = base;
        for (int w = 0; w < warp; w++) before += wc[w];
        if (hit) pos[j] = before + __popc(m & ((1u << lane) - 1));
        __syncthreads();
        if (threadIdx.x == 0)
            for (int w = 0; w < nw; w++) base += wc[w];
        __syncthreads();
    }
}

/* k_gather: xg[pos[j]] = x[j / K], rows of dim (dim % 8 == 0); one block per
 * routed pair (the slots between experts' rows, chunk padding, are not
 * written: their GEMM rows are computed and never read) */
__global__ void k_gather(bf16 *__restrict__ xg, const bf16 *__restrict__ x, const int *__restrict__ pos, int K, int dim) {
    KTRACE();
    pdl_wait();
    const uint4 *s = (const uint4 *)(x + (size_t)(blockIdx.x / K) * dim);
    uint4 *o = (uint4 *)(xg + (size_t)pos[blockIdx.x] * dim);
    for (int c = threadIdx.x; c < dim / 8; c += blockDim.x) o[c] = s[c];
}

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

static long chunked_layers; /* MoE prefill layers whose expert GEMMs ran as chunk batches (tests) */
extern "C" long kiln_cuda_moe_chunked_count(void) { return chunked_layers; }

/*
 * Rows per chunk of the prefill expert GEMMs (moe_experts_chunked), or 0 for
 * one problem per expert (moe_experts_grouped). KILN_CUDA_MOE_CHUNK=T sets
 * it (0: one problem per expert). By default from the mean rows per expert,
 * after tools/moe_shapes.cu on an H100 (Qwen3-30B-A3B: 128 experts, top-8,
 * expert FFN 768, hidden 2,048; µs for a layer's gate + up + down, the
 * routed rows spread evenly / skewed over the experts; docs/cuda.md "MoE
 * prefill"):
 *
 *   tokens (mean rows)  one problem per expert  chunks of 64   chunks of 128
 *   8,192 (512)         2,094 / 2,286           1,415 / 1,403  1,047 / 1,110
 *   4,096 (256)         1,289 / 1,348             866 / 882      723 / 767
 *   2,048 (128)           792 / 711               612 / 626      599 / 592
 *   1,024 (64)            528 / 523               509 / 515      516 / 530
 *   512 (32)              459 / 462               465 / 472      517 / 518
 *
 * One GEMM over all 65,536 rows of 8,192 tokens with one expert's weights,
 * the same FLOPs without grouping, takes 915. Up to ~1,024 tokens the
 * layer is bound by reading the experts' 1.2 GB of weights (~400 µs), and
 * the padding costs about what the chunks gain.
 */
static int moe_chunk_rows(const struct cuda_ctx *c, size_t nk, int E) {
    if (c->moe_chunk >= 0) return c->moe_chunk;
    const size_t mean = nk / (size_t)E;
    return mean >= 96 ? 128 : mean >= 48 ? 64 : 0;
}

/* the pinned host table holds n pointers; -1 if it cannot (nothing ran) */
static int ptr_table(struct cuda_ctx *c, size_t n) {
    const size_t bytes = sizeof(void *) * n;
    if (c->moe_ptr_cap >= bytes) return 0;
    if (CUDA_FAILED(cudaStreamSynchronize(c->stream))) return -1; /* no copy from the old table in flight */
    return cu_pinned(c, (void **)&c->moe_ptr_host, &c->moe_ptr_cap, bytes) ? -1 : 0;
}

/* expert e's GEMMs, one cuBLAS call each: gate and up (part & 1), down (part
 * & 2). hw[3 E] (gate | up | down), here and in the grouped and chunked
 * calls below: the experts' bf16 weights, the layer's own (tab->host) or
 * 4-bit kinds' scratch copies (moe_w4.cu) */
static void expert_calls(struct cuda_ctx *c, const bf16 *const *hw, int E, const int *cnt, const int *off, bf16 *xg, bf16 *hg,
                         bf16 *hu, bf16 *y, int F, int dim, int part) {
    for (int e = 0; e < E; e++) {
        const int o = off[e], ne = cnt[e];
        if (!ne) continue;
        if (part & 1) {
            cu_gemm_bf16(c, hg + (size_t)o * F, xg + (size_t)o * dim, hw[e], ne, F, dim);
            cu_gemm_bf16(c, hu + (size_t)o * F, xg + (size_t)o * dim, hw[E + e], ne, F, dim);
        }
        if (part & 2) cu_gemm_bf16(c, y + (size_t)o * dim, hg + (size_t)o * F, hw[2 * E + e], ne, dim, F);
    }
}

/*
 * The expert GEMMs of the grouped path as two cublasGemmGroupedBatchedEx
 * calls instead of 3 cublasGemmEx calls per expert (384 on Qwen3-30B-A3B,
 * each paying cuBLAS's host-side dispatch): one call holds the gate and up
 * problems of every expert that has rows, the second their down problems.
 * Problem p of a call is out_p^T = W_p x_p^T in cuBLAS's column-major view
 * (as blas_gemm in gemm.cu), its own group of size 1 since the row counts
 * differ. The pointer tables go up from pinned memory in one copy. Returns 0
 * if cuBLAS refuses the call (then the caller loops over experts, and stops
 * asking).
 */
static int grouped_gemm(struct cuda_ctx *c, int np, const int *rows, int n_out, int n_in, const void **dptr) {
    int *ia = (int *)kiln_malloc(sizeof(int) * 6 * (size_t)np);
    int *m = ia, *nn = ia + np, *k = ia + 2 * np, *lda = ia + 3 * np, *ldc = ia + 4 * np, *gs = ia + 5 * np;
    cublasOperation_t *ta = (cublasOperation_t *)kiln_malloc(sizeof *ta * 2 * (size_t)np), *tb = ta + np;
    float *ab = (float *)kiln_malloc(sizeof(float) * 2 * (size_t)np);
    for (int p = 0; p < np; p++) {
        m[p] = n_out, nn[p] = rows[p], k[p] = n_in, lda[p] = n_in, ldc[p] = n_out, gs[p] = 1;
        ta[p] = CUBLAS_OP_T, tb[p] = CUBLAS_OP_N, ab[p] = 1.f, ab[np + p] = 0.f;
    }
    /* dptr: np weights, np x slices, np outputs (device copies) */
    cublasStatus_t st = cublasGemmGroupedBatchedEx(c->blas, ta, tb, m, nn, k, ab, (const void *const *)dptr, CUDA_R_16BF, lda,
                                                   (const void *const *)(dptr + np), CUDA_R_16BF, lda, ab + np,
                                                   (void *const *)(dptr + 2 * np), CUDA_R_16BF, ldc, np, gs, CUBLAS_COMPUTE_32F);
    free(ia), free(ta), free(ab);
    if (st != CUBLAS_STATUS_SUCCESS) {
        kiln_log(KILN_LOG_INFO, "cuda: grouped GEMM refused (cuBLAS status %d): experts run one call each", (int)st);
        return 0;
    }
    return 1;
}

/* fills the pointer tables of both calls, copies them up, runs the calls;
 * 1, or 0 if cuBLAS refused the first, -1 if there was no pinned memory for
 * the tables (nothing was computed in either case) */
static int moe_experts_grouped(struct cuda_ctx *c, const bf16 *const *hw, int E, const int *cnt, const int *off, bf16 *xg, bf16 *hg,
                               bf16 *hu, bf16 *y, int F, int dim, const void **dtab) {
    /* no pinned table this time: the caller runs one call per expert
     * (same results), so this is not the batch's failure */
    if (ptr_table(c, 9 * (size_t)E)) return -1;
    int *rows = (int *)kiln_malloc(sizeof(int) * 2 * (size_t)E), g = 0;
    const void **h = (const void **)c->moe_ptr_host;
    for (int e = 0; e < E; e++)
        if (cnt[e]) rows[g++] = cnt[e];
    /* gate/up table: [A: 2g weights | B: 2g x slices | C: 2g outputs]; down: [g | g | g] after it */
    const void **A = h, **B = h + 2 * g, **C = h + 4 * g, **A2 = h + 6 * g, **B2 = h + 7 * g, **C2 = h + 8 * g;
    int q = 0;
    for (int e = 0; e < E; e++) {
        const int o = off[e];
        if (!cnt[e]) continue;
        A[q] = hw[e], A[g + q] = hw[E + e];
        B[q] = B[g + q] = xg + (size_t)o * dim;
        C[q] = hg + (size_t)o * F, C[g + q] = hu + (size_t)o * F;
        A2[q] = hw[2 * E + e], B2[q] = hg + (size_t)o * F, C2[q] = y + (size_t)o * dim;
        q++;
    }
    for (int i = 0; i < g; i++) rows[g + i] = rows[i];
    if (CUDA_FAILED(cudaMemcpyAsync(dtab, h, sizeof(void *) * 9 * (size_t)g, cudaMemcpyHostToDevice, c->stream))) {
        free(rows); /* no table on the device: no grouped calls (the batch fails, cu_error) */
        return -1;
    }
    int ok = grouped_gemm(c, 2 * g, rows, F, dim, dtab);
    if (ok) {
        cu_swiglu_raw(c, hg, hg, hu, (size_t)off[E] * F);
        if (!grouped_gemm(c, g, rows, dim, F, dtab + 6 * g)) expert_calls(c, hw, E, cnt, off, xg, hg, hu, y, F, dim, 2);
    }
    free(rows);
    return ok;
}

/* one pointer-array batched GEMM of np problems out_p^T = W_p x_p^T, all
 * n_out x T from n_in (cuBLAS's column-major view, as blas_gemm) */
static int batched_gemm(struct cuda_ctx *c, int np, int T, int n_out, int n_in, const void **dptr) {
    const float one = 1.f, zero = 0.f;
    const cublasStatus_t st = cublasGemmBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &one, dptr, CUDA_R_16BF, n_in,
                                                  dptr + np, CUDA_R_16BF, n_in, &zero, (void *const *)(dptr + 2 * np), CUDA_R_16BF,
                                                  n_out, np, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        kiln_log(KILN_LOG_INFO, "cuda: batched GEMM refused (cuBLAS status %d): MoE prefill stops cutting experts' rows into chunks",
                 (int)st);
        return 0;
    }
    return 1;
}

/*
 * The expert GEMMs as two pointer-array batched calls of one shape each.
 * k_moe_place started each expert's rows on a multiple of T (off), so its
 * rows cut into whole T-row chunks, the last one padded with rows that are
 * computed and never read. Call 1 holds the gate and the up problem of
 * every chunk (F x T from dim), call 2 the down problems (dim x T from F):
 * cuBLAS gets hundreds of same-shaped tiles' worth of work per call, where
 * the grouped call's per-expert problems of a few hundred rows ran its
 * slower kernels (moe_chunk_rows has the figures). Costs the padding: on
 * average T/2 rows per expert with rows. Tables: gate/up [A: 2nc weights |
 * B: 2nc x chunks | C: 2nc outputs], down [nc | nc | nc] after it.
 * Returns 1, 0 if cuBLAS refused the first call, -1 if there was no pinned
 * memory for the tables (nothing was computed in either case).
 */
static int moe_experts_chunked(struct cuda_ctx *c, const bf16 *const *hw, int E, const int *cnt, const int *off, int T, bf16 *xg,
                               bf16 *hg, bf16 *hu, bf16 *y, int F, int dim, const void **dtab) {
    const int nc = off[E] / T;
    if (ptr_table(c, 9 * (size_t)nc)) return -1;
    const void **h = (const void **)c->moe_ptr_host;
    const void **A = h, **B = h + 2 * nc, **C = h + 4 * nc, **A2 = h + 6 * nc, **B2 = h + 7 * nc, **C2 = h + 8 * nc;
    int q = 0;
    for (int e = 0; e < E; e++)
        for (int r = off[e]; r < off[e + 1]; r += T, q++) {
            A[q] = hw[e], A[nc + q] = hw[E + e];
            B[q] = B[nc + q] = xg + (size_t)r * dim;
            C[q] = hg + (size_t)r * F, C[nc + q] = hu + (size_t)r * F;
            A2[q] = hw[2 * E + e], B2[q] = hg + (size_t)r * F, C2[q] = y + (size_t)r * dim;
        }
    if (CUDA_FAILED(cudaMemcpyAsync(dtab, h, sizeof(void *) * 9 * (size_t)nc, cudaMemcpyHostToDevice, c->stream)))
        return -1; /* no table on the device (the batch fails, cu_error) */
    if (!batched_gemm(c, 2 * nc, T, F, dim, dtab)) return 0;
    cu_swiglu_raw(c, hg, hg, hu, (size_t)off[E] * F);
    if (!batched_gemm(c, nc, T, dim, F, dtab + 6 * nc)) expert_calls(c, hw, E, cnt, off, xg, hg, hu, y, F, dim, 2);
    chunked_layers++;
    return 1;
}

void cu_moe(struct kiln_backend *be, void *out, const void *x_, const struct moe_ffn *m, int n, int dim) {
    CU_SKIP_IF_REPLAY(be);
    struct cuda_ctx *c = cu_ctx(be);
    CU_TAPE(c, SKT_OTHER, out, x_, NULL, m, NULL, NULL, n, dim, 0, 0, 0.f);
    /* a pending norm that produced x is folded into the router GEMV */
    if (!(c->pnorm.on && c->pnorm.out == x_ && !c->n_pend)) cu_flush(c);
    const int E = m->n_expert, K = m->n_used, F = m->ffn;
    const bf16 *x = (const bf16 *)x_;
    if (dim % 8 || F % 8 || K > CU_MOE_MAX_USED || E > CU_MOE_MAX_EXPERTS) { /* cu_check_model refuses such a model at load */
        fprintf(stderr, "kiln: cuda: (a bug: the load-time check refuses this) MoE needs dim and expert ffn divisible by 8, E <= %d and top-k <= %d (got %d, %d, %d, %d)\n", CU_MOE_MAX_EXPERTS, CU_MOE_MAX_USED, dim, F, E, K);
        abort();
    }
    const struct cu_moe_tab *tab = cu_moe_table(c, m);
    if (!tab) return; /* out of device memory: cu_error reports it */
    const size_t nk = (size_t)n * K;
    /* 4-bit experts (moe_w4.cu): pair by pair up to moe_w4_pairs tokens when
     * both kinds are 4-bit, expert by expert up to cu_moe_w4_most (the bf16
     * direct path's kernels do not take them), then the GEMMs on the codes
     * or the dequantized copy */
    const int w4 = tab->w4[0].on || tab->w4[2].on, w4_pairs = tab->w4[0].on && tab->w4[2].on && n <= c->moe_w4_pairs;
    const int direct = !w4 && n <= c->moe_direct;
    const int batch = !direct && (w4 ? w4_pairs || n <= cu_moe_w4_most(c, tab->w4) : n <= c->moe_batch);
    /* grouped: each expert's rows start on a multiple of T (1: packed) */
    /* 4-bit gate/up and down with few rows per expert: GEMMs on the codes,
     * each expert's rows in chunks of MOE_W4_GEMM_ROWS (moe_w4.cu) */
    const int fused = !direct && !batch && tab->w4[0].on && tab->w4[2].on && c->moe_w4_gemm > 0 && nk <= (size_t)E * c->moe_w4_gemm;
    const int T = direct || batch ? 0 : fused ? MOE_W4_GEMM_ROWS : moe_chunk_rows(c, nk, E), pad = T > 1 ? T : 1;
    const size_t rows = nk + (size_t)E * (pad - 1), ntab = 9 * (T ? rows / T : (size_t)E);
    /* scratch: logits | sel | wsel | (direct: h | chosen pointers) (grouped: pos | xg | hg | hu | y | counts | pointer tables) */
    size_t o_log = 0, o_sel = al256(o_log + (size_t)n * E * 4), o_w = al256(o_sel + nk * 4), o_end = al256(o_w + nk * 4);
    size_t o_h = o_end, o_pos = o_end, o_xg = al256(o_pos + nk * 4);
    size_t o_hg = al256(o_xg + rows * dim * 2), o_hu = al256(o_hg + rows * F * 2), o_y = al256(o_hu + rows * F * 2);
    size_t o_cnt = al256(o_y + rows * dim * 2), o_tab = al256(o_cnt + (size_t)E * 4);
    const size_t o_selp = al256(o_h + nk * F * 2); /* direct: the chosen experts' pointers, 3 per pair */
    size_t total = direct ? al256(o_selp + nk * 3 * sizeof(void *))
                   : batch ? o_end + al256(cu_moe_batch_scratch(n, K, E, F, dim))
                           : al256(o_tab + sizeof(void *) * ntab);
    char *buf = (char *)cu_scratch(c, &c->moe_buf, &c->moe_buf_cap, total);
    if (!buf) return; /* out of device memory: cu_error reports it */
    float *logits = (float *)(buf + o_log), *wsel = (float *)(buf + o_w);
    int *sel = (int *)(buf + o_sel);

    cu_matmul_f32_norm(c, logits, x, ((const struct cu_linear *)m->router.be)->w, n, E, dim);
    const int ptr = direct && !c->no_moe_ptr; /* tab->gate heads the layer's 3E pointers (moe_tab) */
    const bf16 **selp = ptr ? (const bf16 **)(buf + o_selp) : NULL;
    cu_launch(c->stream, k_route, n, 256, route_smem(E, K, ptr), sel, wsel, selp, ptr ? tab->gate : (const bf16 *const *)NULL,
              logits, E, K, m->norm_topk);
    CU_LAUNCHED();

    if (batch) {
        cu_moe_batch(c, (bf16 *)out, x, sel, wsel, tab, n, K, E, F, dim, buf + o_end, w4_pairs);
        return;
    }
    if (direct) {
        bf16 *h = (bf16 *)(buf + o_h);
        cu_moe_gate_up(c, h, x, sel, selp, tab->gate, tab->up, n, K, F, dim);
        cu_moe_down(c, (bf16 *)out, h, sel, selp, wsel, tab->down, n, K, F, dim);
        return;
    }

    /* grouped: sort the routed rows by expert on the device; only the
     * per-expert counts come to the host (the GEMM sizes), one sync */
    int *pos = (int *)(buf + o_pos), *dcnt = (int *)(buf + o_cnt);
    cu_launch(c->stream, k_moe_count, E, 256, 0, dcnt, sel, (int)nk);
    CU_LAUNCHED();
    cu_launch(c->stream, k_moe_place, E, 256, 0, pos, sel, dcnt, (int)nk, pad);
    CU_LAUNCHED();
    if (cu_pinned(c, (void **)&c->moe_host, &c->moe_host_cap, ((size_t)2 * E + 1) * 4)) {
        cu_fault(c, ((size_t)2 * E + 1) * 4, 1); /* the batch fails (cu_error) */
        return;
    }
    int *cnt = c->moe_host, *off = cnt + E;
    /* the counts size the GEMMs below: without them nothing more runs (the batch fails, cu_error) */
    if (CUDA_FAILED(cudaMemcpyAsync(cnt, dcnt, (size_t)E * 4, cudaMemcpyDeviceToHost, c->stream)) ||
        CUDA_FAILED(cudaStreamSynchronize(c->stream)))
        return;
    const bf16 **hw = tab->host; /* the experts' bf16 weights for cuBLAS */
    if (w4 && !fused) {
        hw = (const bf16 **)kiln_malloc(sizeof *hw * 3 * (size_t)E);
        if (cu_moe_w4_dequant(c, tab, dcnt, hw)) {
            free(hw); /* out of device memory: cu_error reports it */
            return;
        }
    }
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + (cnt[e] + pad - 1) / pad * pad; /* as k_moe_place: expert e's first slot */
    bf16 *xg = (bf16 *)(buf + o_xg), *hg = (bf16 *)(buf + o_hg), *hu = (bf16 *)(buf + o_hu), *y = (bf16 *)(buf + o_y);
    cu_launch(c->stream, k_gather, (unsigned)nk, 128, 0, xg, x, pos, K, dim);
    CU_LAUNCHED();
    const void **dtab = (const void **)(buf + o_tab);
    int done = 0;
    if (fused) { /* the chunks' experts and first rows, through the pinned table */
        const int nc = off[E] / T;
        if (ptr_table(c, (size_t)nc)) { /* no pinned memory: the batch fails (cu_error) */
            cu_fault(c, sizeof(void *) * (size_t)nc, 1);
            return;
        }
        int *h = (int *)c->moe_ptr_host, *dce = (int *)dtab;
        for (int e = 0, q = 0; e < E; e++)
            for (int r = off[e]; r < off[e + 1]; r += T, q++) h[q] = e, h[nc + q] = r;
        if (CUDA_FAILED(cudaMemcpyAsync(dce, h, sizeof(int) * 2 * (size_t)nc, cudaMemcpyHostToDevice, c->stream)) ||
            cu_moe_w4_gemm(c, tab, dce, dce + nc, nc, xg, hg, hu, y, off[E]))
            return; /* the batch fails (cu_error) */
        done = 1;
    } else if (T) {
        done = moe_experts_chunked(c, hw, E, cnt, off, T, xg, hg, hu, y, F, dim, dtab);
        if (done == 0) c->moe_chunk = 0; /* cuBLAS refused: one problem per expert from now on */
    } else if (c->moe_grouped) {
        done = moe_experts_grouped(c, hw, E, cnt, off, xg, hg, hu, y, F, dim, dtab);
        if (done == 0) c->moe_grouped = 0; /* cuBLAS refused: one call per expert from now on */
    }
    if (done <= 0) {
        expert_calls(c, hw, E, cnt, off, xg, hg, hu, y, F, dim, 1);
        cu_swiglu_raw(c, hg, hg, hu, (size_t)off[E] * F);
        expert_calls(c, hw, E, cnt, off, xg, hg, hu, y, F, dim, 2);
    }
    if (hw != tab->host) free(hw);
    cu_launch(c->stream, k_combine<bf16>, moe_combine_grid(n, dim), 256, 0, (bf16 *)out, (const bf16 *)y, pos, wsel, K, dim);
    CU_LAUNCHED();
    /* no wait here: the pinned pointer tables are rewritten only by the next
     * MoE layer, after its own sync (which comes after this upload in stream
     * order), so the host runs ahead into the next layer's ops */
}
