/*
 * attn_dec.cu: decode attention over a long paged cache, streamed through
 * shared memory by the copy engine (sm_90).
 *
 * Why: the row kernel (attention.cu k_att_rows) gives every query head its
 * own blocks and walks keys in 4 warps of dependent loads, and its splits
 * of ~16 keys merge in a cluster only up to 16 splits; above that the
 * merge goes through global memory and the GQA kernel. From ~300 keys of
 * context a decode step fell off a cliff (H200, tg64 at 512 cached tokens:
 * 8B 232 -> 171 tok/s, 0.6B 1,228 -> 713, 30B-A3B 408 -> 161), for 2 MB of
 * cache per layer.
 *
 * Decomposition: block (row * n_head_kv + kv head, split), a cluster of
 * the n_split blocks of one (row, kv head) (n_split = 16, or 8 where the
 * device refuses non-portable clusters, fewer when the rows alone fill the
 * GPU: dec_nsplit; 1 is no cluster). Split sp takes a contiguous range
 * of the row's len = row_t + 1 keys in whole stages of TS = 2048 U / HD
 * tokens (8 U KB of K and V at any head size; U = 1 or 2, below).
 * Warp 8 (the producer) copies each stage's K and V rows with
 * cp.async.bulk, one copy per page piece (a head's rows of one page are
 * contiguous), into DEC_NS stages that complete on mbarriers; it reads the
 * page entries 32 at a time, one per lane. Warps 0-7 (consumers) take the
 * stage's keys, KPW = 32 / LPK groups per warp, U keys per group: LPK = HD
 * / 8 lanes hold a key's 8-element slice (one 16-byte shared load) and the
 * same slice of the G = n_head / n_head_kv query heads, so a dot product
 * is a reduction over LPK lanes, and each group keeps its own online
 * softmax (m, l, o) per query head. After the last stage the groups merge
 * by shuffles, the 8 warps through shared memory, and the blocks of the
 * cluster by st.async into the first block's shared memory (as in
 * k_att_rows), which normalises and writes the G heads' outputs. The K/V
 * cache is read once per step, whatever G.
 *
 * What limits it: the consumers' arithmetic per key grows with G (G dot
 * products, G online-softmax updates), and a block runs on one SM, so at
 * 16k keys of context and G = 4 a block moves ~8 GB/s where the copy
 * engine would bring more; cuda.cuh ATT_DEC_MAX_CTX hands such steps to
 * flash decode (tensor cores).
 *
 * Before griddepcontrol.wait the producer already streams the stages whose
 * keys are all older than the row's last ATT_ROWS_MAX tokens: no kernel of
 * this forward writes those (only the new tokens' slots are written, and
 * the engine sends at most ATT_ROWS_MAX new tokens of a sequence to this
 * kernel), and every earlier forward ended before this one's batch upload.
 * q and the stages holding new tokens wait.
 *
 * n_split depends on the device and the number of rows (dec_nsplit), not
 * on the lengths, so a replayed graph is valid at every length; short rows
 * leave most splits empty (m = -inf, weight 0 in the merge). HD 64 or 128,
 * G 1-8; other shapes keep the other kernels.
 */
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda.cuh"
#include "backend/cuda/sm90.cuh"

#define DEC_NS 6       /* stages in flight per block */
/* keys per lane group and stage: 2 (more work between a warp's waits)
 * up to 4 query heads per KV head; 1 above, where 2 cost registers (H200,
 * tg64 with 2 / with 1: 8B after 16k keys 150 / 144, 0.6B 626 / 558;
 * 30B-A3B after 4k keys 292 / 301, after 16k 177 / 189) */
#define DEC_U(G) ((G) <= 4 ? 2 : 1)
#define DEC_NW 8       /* consumer warps */
#define DEC_THREADS (DEC_NW * 32 + 32)
#define DEC_CL_MAX 16

/* shared memory: the stages (reused for the warps' merge), the cluster's
 * slots [n_split][G][HD + 2], the barriers; total is the most (n_split =
 * DEC_CL_MAX), a launch asks for what its n_split needs (dec_bytes) */
template <int HD, int G> struct dec_smem {
    static constexpr int U = DEC_U(G);
    static constexpr int TS = 2048 * U / HD;
    static constexpr size_t stage = (size_t)2 * TS * HD * 2; /* K rows, then V rows, bf16 */
    static constexpr size_t stages = DEC_NS * stage;
    static constexpr size_t warps = (size_t)DEC_NW * G * (HD + 2) * 4;
    static constexpr size_t region = stages > warps ? stages : warps;
    static constexpr size_t slots = (size_t)DEC_CL_MAX * G * (HD + 2) * 4;
    static constexpr size_t bars = (2 * DEC_NS + 1) * 8;
    static constexpr size_t total = region + slots + bars;
};

template <int HD, int G>
__global__ void __launch_bounds__(DEC_THREADS) k_att_dec(bf16 *__restrict__ out, const bf16 *q, const bf16 *kc, const bf16 *vc,
                                                         const int *__restrict__ row_seq, const int *__restrict__ row_t,
                                                         const int *__restrict__ seq, const int *__restrict__ pages, int n_head,
                                                         int nkv, int P, float sl2, int n_split, int pre) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    KTRACE();
    using SM = dec_smem<HD, G>;
    constexpr int TS = SM::TS, LPK = HD / 8, KPW = 32 / LPK, U = SM::U;
    static_assert(DEC_NW * KPW * U == TS, "a stage is U keys per lane group");
    extern __shared__ __align__(128) unsigned char smem[];
    float *slots = (float *)(smem + SM::region); /* n_split of them: the launch sizes the shared memory by it */
    unsigned long long *bar = (unsigned long long *)(smem + SM::region + (size_t)n_split * G * (HD + 2) * 4);
    const unsigned full0 = smem_u32(bar), empty0 = smem_u32(bar + DEC_NS), cbar = smem_u32(bar + 2 * DEC_NS);
    const int rk = blockIdx.x, row = rk / nkv, kh = rk % nkv, sp = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int i = 0; i < DEC_NS; i++) mbar_init(full0 + 8 * i, 1), mbar_init(empty0 + 8 * i, DEC_NW);
        if (n_split > 1 && sp == 0) {
            mbar_init(cbar, 1);
            mbar_arrive_tx(cbar, (unsigned)((n_split - 1) * G * (HD + 2) * 4));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (n_split > 1) cluster_arrive_relaxed(); /* this block has started (its barrier is set up) */
    /* the row's tables were uploaded before the step: no kernel writes them */
    const int s = row_seq[row], len = row_t[row] + 1, poff = seq[4 * s + 3];
    const int n_st = (len + TS - 1) / TS, per = (n_st + n_split - 1) / n_split;
    const int st0 = sp * per, st1 = min(n_st, st0 + per); /* this block's stages [st0, st1) */
    const int old_end = len - ATT_ROWS_MAX;                /* keys below this are no new token's */

    if (warp == DEC_NW) { /* the producer */
        bool waited = !pre;
        if (!pre) pdl_wait();
        const int pmax = (len - 1) / P; /* the row's last page */
        int win = -64, pe = 0;          /* page entries [win, win + 32), lane l holds win + l's (none yet) */
        for (int i = st0; i < st1; i++) {
            const int k = i - st0, b = k % DEC_NS;
            if (k >= DEC_NS) mbar_wait(empty0 + 8 * b, ((k / DEC_NS) - 1) & 1);
            const int t0 = i * TS, t1 = min(len, t0 + TS);
            if (!waited && t1 > old_end) pdl_wait(), waited = true;
            if (lane == 0) mbar_arrive_tx(full0 + 8 * b, (unsigned)((t1 - t0) * HD * 4));
            const unsigned dk = smem_u32(smem + b * SM::stage), dv = dk + TS * HD * 2;
            for (int t = t0; t < t1;) {
                const int pi = t / P, n = min(t1, (pi + 1) * P) - t;
                if (pi < win || pi >= win + 32) {
                    win = pi;
                    pe = win + lane <= pmax ? pages[poff + win + lane] : 0;
                }
                const int pg = __shfl_sync(0xffffffffu, pe, pi - win);
                if (lane == 0) {
                    const size_t src = (((size_t)pg * nkv + kh) * P + t % P) * HD;
                    const unsigned off = (unsigned)(t - t0) * HD * 2, bytes = (unsigned)n * HD * 2;
                    bulk_load(dk + off, kc + src, bytes, full0 + 8 * b);
                    bulk_load(dv + off, vc + src, bytes, full0 + 8 * b);
                }
                t += n;
            }
        }
        if (!waited) pdl_wait();
        if (n_split > 1) cluster_wait();
        return; /* nothing below is the producer's */
    }

    /* the consumers: lane group kk of LPK lanes, slice kl of 8 elements */
    pdl_wait();
    const int kk = lane / LPK, kl = lane % LPK;
    float qv[G][8], o[G][8], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const uint4 r = *(const uint4 *)(q + ((size_t)row * n_head + kh * G + g) * HD + kl * 8);
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int e = 0; e < 4; e++)
            qv[g][2 * e] = __uint_as_float(w[e] << 16) * sl2, qv[g][2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u) * sl2;
#pragma unroll
        for (int e = 0; e < 8; e++) o[g][e] = 0.f;
        m[g] = -INFINITY, l[g] = 0.f;
    }
    if (n_split > 1) cluster_wait(); /* every block has started: the first one's barrier is set up */
    for (int i = st0; i < st1; i++) {
        const int k = i - st0, b = k % DEC_NS;
        mbar_wait(full0 + 8 * b, (k / DEC_NS) & 1);
        /* the group's U keys j + u * (TS / U): all their loads first */
        const int j = warp * KPW + kk;
        const bf16 *sk = (const bf16 *)(smem + b * SM::stage) + j * HD + kl * 8;
        uint4 kr[U], vr[U];
#pragma unroll
        for (int u = 0; u < U; u++) kr[u] = *(const uint4 *)(sk + u * (TS / U) * HD), vr[u] = *(const uint4 *)(sk + (TS + u * (TS / U)) * HD);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + 8 * b); /* this warp is done with the stage's shared memory */
        float kx[U][8], vx[U][8], d[U][G];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const uint32_t kw[4] = {kr[u].x, kr[u].y, kr[u].z, kr[u].w}, vw[4] = {vr[u].x, vr[u].y, vr[u].z, vr[u].w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                kx[u][2 * e] = __uint_as_float(kw[e] << 16), kx[u][2 * e + 1] = __uint_as_float(kw[e] & 0xffff0000u);
                vx[u][2 * e] = __uint_as_float(vw[e] << 16), vx[u][2 * e + 1] = __uint_as_float(vw[e] & 0xffff0000u);
            }
            /* the key exists: the row's last stage may be partly empty, its
             * other rows stale (or never written: 0 x NaN is NaN) */
            ok[u] = i * TS + j + u * (TS / U) < len;
            if (!ok[u])
#pragma unroll
                for (int e = 0; e < 8; e++) kx[u][e] = vx[u][e] = 0.f;
#pragma unroll
            for (int g = 0; g < G; g++) {
                float a = 0.f;
#pragma unroll
                for (int e = 0; e < 8; e++) a += qv[g][e] * kx[u][e];
                d[u][g] = a;
            }
        }
#pragma unroll
        for (int x = LPK / 2; x; x >>= 1)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int g = 0; g < G; g++) d[u][g] += __shfl_xor_sync(0xffffffffu, d[u][g], x);
        if (ok[0]) /* keys fill a stage in order: ok[u] implies ok[0] */
#pragma unroll
            for (int g = 0; g < G; g++) {
                float mn = m[g];
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (ok[u]) mn = fmaxf(mn, d[u][g]);
                const float corr = exp2f(m[g] - mn);
                float p[U], ps = 0.f;
#pragma unroll
                for (int u = 0; u < U; u++) p[u] = ok[u] ? exp2f(d[u][g] - mn) : 0.f, ps += p[u];
                l[g] = l[g] * corr + ps, m[g] = mn;
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    float a = o[g][e] * corr;
#pragma unroll
                    for (int u = 0; u < U; u++) a += p[u] * vx[u][e];
                    o[g][e] = a;
                }
            }
    }
    /* the KPW lane groups of the warp merge by shuffles (lanes kl of each
     * group meet at xor LPK, 2 LPK, ...) */
#pragma unroll
    for (int x = LPK; x < 32; x <<= 1)
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m[g], x), l2 = __shfl_xor_sync(0xffffffffu, l[g], x);
            const float mn = fmaxf(m[g], m2);
            const float w1 = m[g] == -INFINITY ? 0.f : exp2f(m[g] - mn), w2 = m2 == -INFINITY ? 0.f : exp2f(m2 - mn);
            l[g] = l[g] * w1 + l2 * w2;
#pragma unroll
            for (int e = 0; e < 8; e++) o[g][e] = o[g][e] * w1 + __shfl_xor_sync(0xffffffffu, o[g][e], x) * w2;
            m[g] = mn;
        }
    /* the 8 warps through shared memory (the stages are free once every
     * consumer has passed its last one) */
    bar_sync(1, DEC_NW * 32);
    float *ws = (float *)smem; /* [warp][g][HD + 2]: m, l, o */
    if (lane < LPK)
#pragma unroll
        for (int g = 0; g < G; g++) {
            float *w = ws + (warp * G + g) * (HD + 2);
            if (lane == 0) w[0] = m[g], w[1] = l[g];
#pragma unroll
            for (int e = 0; e < 8; e++) w[2 + kl * 8 + e] = o[g][e];
        }
    bar_sync(1, DEC_NW * 32);
    for (int idx = threadIdx.x; idx < G * HD; idx += DEC_NW * 32) {
        const int g = idx / HD, dd = idx % HD;
        float M = -INFINITY, L = 0.f, acc = 0.f;
#pragma unroll
        for (int w = 0; w < DEC_NW; w++) M = fmaxf(M, ws[(w * G + g) * (HD + 2)]);
#pragma unroll
        for (int w = 0; w < DEC_NW; w++) {
            const float *p = ws + (w * G + g) * (HD + 2), mw = p[0];
            const float wt = mw == -INFINITY ? 0.f : exp2f(mw - M);
            L += wt * p[1], acc += wt * p[2 + dd];
        }
        if (n_split == 1) {
            out[((size_t)row * n_head + kh * G + g) * HD + dd] = __float2bfloat16(acc / L);
            continue;
        }
        float *dst = slots + ((size_t)sp * G + g) * (HD + 2);
        if (sp == 0) {
            dst[2 + dd] = acc;
            if (dd == 0) dst[0] = M, dst[1] = L;
        } else {
            st_async_dsmem(dst + 2 + dd, 0, acc, bar + 2 * DEC_NS);
            if (dd == 0) st_async_dsmem(dst, 0, M, bar + 2 * DEC_NS), st_async_dsmem(dst + 1, 0, L, bar + 2 * DEC_NS);
        }
    }
    if (n_split == 1 || sp != 0) return; /* nothing reads this block's shared memory */
    mbar_wait_cluster(cbar, 0); /* the other blocks' slots are in */
    bar_sync(1, DEC_NW * 32);  /* and this block's own */
    for (int idx = threadIdx.x; idx < G * HD; idx += DEC_NW * 32) {
        const int g = idx / HD, dd = idx % HD;
        float M = -INFINITY, L = 0.f, acc = 0.f;
        for (int i = 0; i < n_split; i++) M = fmaxf(M, slots[((size_t)i * G + g) * (HD + 2)]);
        for (int i = 0; i < n_split; i++) {
            const float *p = slots + ((size_t)i * G + g) * (HD + 2), mw = p[0];
            const float wt = mw == -INFINITY ? 0.f : exp2f(mw - M);
            L += wt * p[1], acc += wt * p[2 + dd];
        }
        out[((size_t)row * n_head + kh * G + g) * HD + dd] = __float2bfloat16(acc / L);
    }
#else
    __trap(); /* sm_90 only: the host never launches it elsewhere */
#endif
}

/* the cluster size this kernel runs at: 16 where the device allows
 * non-portable clusters of its blocks, else 8; 0 where it cannot run */
template <int HD, int G> static int dec_split(void) {
    static int n = -1;
    if (n >= 0) return n;
    const void *k = (const void *)k_att_dec<HD, G>;
    const size_t smem = dec_smem<HD, G>::total;
    n = cu_sm90_code(k) && cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess
            ? cu_cluster_max(k, DEC_THREADS, smem)
            : 0;
    cudaGetLastError();
    return n;
}

static long dec_runs; /* launches (tests read it) */

template <int HD, int G> static size_t dec_bytes(int ns) {
    return dec_smem<HD, G>::region + (size_t)ns * G * (HD + 2) * 4 + dec_smem<HD, G>::bars;
}

/* Splits per (row, KV head): the device's cluster size, halved while the
 * grid would need more than one wave (blocks per SM by shared memory, 1 KB
 * of each block's reserve included). A decode step of several sequences
 * has enough (row, KV head) pairs to fill the GPU with fewer splits, and
 * each wave of these blocks costs its start (barriers, cluster) and merge:
 * at 16 splits, 8 sequences of Qwen3-8B (1,024 blocks, one per SM) took 51
 * us per layer after 256 keys (ncu), against ~6 us for one sequence. The
 * split count depends on the number of rows, which a decode graph's key
 * holds, and on nothing that changes between replays. */
template <int HD, int G> static int dec_nsplit(const struct cuda_ctx *c, int nkv) {
    int ns = dec_split<HD, G>();
    const long pairs = (long)c->n_tokens * nkv;
    while (ns > 1) {
        const int per = c->smem_sm > 0 ? (int)((size_t)c->smem_sm / (dec_bytes<HD, G>(ns) + 1024)) : 1;
        if (pairs * ns <= (long)c->n_sm * (per > 1 ? per : 1)) break;
        ns /= 2;
    }
    return ns;
}

template <int HD, int G>
static void launch(struct cuda_ctx *c, bf16 *out, const bf16 *q, const struct kv_cache *kv, int layer, int n_head, float sl2) {
    const int nkv = kv->n_head_kv, ns = dec_nsplit<HD, G>(c, nkv);
    const int pre = !c->no_att_pre; /* KILN_CUDA_ATT_PRE=0: everything after the wait (A/B timing) */
    dec_runs++;
    cu_launch_cl(c->stream, k_att_dec<HD, G>, dim3((unsigned)(c->n_tokens * nkv), (unsigned)ns), DEC_THREADS, dec_bytes<HD, G>(ns),
                 dim3(1, (unsigned)ns, 1), out, q, (const bf16 *)kv->k[layer], (const bf16 *)kv->v[layer], c->d_row_seq, c->d_row_t,
                 c->d_seq, c->d_pages, n_head, nkv, kv->page_size, sl2, ns, pre);
    CU_LAUNCHED();
}

/* the shapes compiled (head_dim 64 and 128, 1-8 query heads per KV head):
 * without c, the cluster size of the shape (0: not compiled, or the device
 * cannot run it); with c, its launch (1; 0: not compiled) */
static int dec_dispatch(int hd, int G, struct cuda_ctx *c, bf16 *out, const bf16 *q, const struct kv_cache *kv, int layer,
                        int n_head, float sl2) {
#define DEC_CASE(H, GG)                                          \
    if (hd == H && G == GG) {                                    \
        if (!c) return dec_split<H, GG>();                       \
        launch<H, GG>(c, out, q, kv, layer, n_head, sl2);        \
        return 1;                                                \
    }
    DEC_CASE(64, 1) DEC_CASE(64, 2) DEC_CASE(64, 3) DEC_CASE(64, 4) DEC_CASE(64, 5) DEC_CASE(64, 6) DEC_CASE(64, 7) DEC_CASE(64, 8)
    DEC_CASE(128, 1) DEC_CASE(128, 2) DEC_CASE(128, 3) DEC_CASE(128, 4) DEC_CASE(128, 5) DEC_CASE(128, 6) DEC_CASE(128, 7) DEC_CASE(128, 8)
#undef DEC_CASE
    return 0;
}

extern "C" int kiln_cuda_att_dec_split(int hd, int n_head, int nkv);
extern "C" int kiln_cuda_att_dec_split(int hd, int n_head, int nkv) {
    return nkv > 0 && n_head % nkv == 0 ? dec_dispatch(hd, n_head / nkv, NULL, NULL, NULL, NULL, 0, 0, 0.f) : 0;
}
extern "C" long kiln_cuda_att_dec_count(void);
extern "C" long kiln_cuda_att_dec_count(void) { return dec_runs; }

int cu_att_dec_shape(int hd, int n_head, int nkv) { return kiln_cuda_att_dec_split(hd, n_head, nkv) > 0; }

int cu_att_dec_takes(const struct cuda_ctx *c, const struct kv_cache *kv, int n_head) {
    return c->att_dec && cu_att_dec_shape(kv->head_dim, n_head, kv->n_head_kv);
}

int cu_attention_dec(struct cuda_ctx *c, bf16 *out, const bf16 *q, const struct kv_cache *kv, int layer, int n_head, float sl2) {
    return cu_att_dec_takes(c, kv, n_head) && dec_dispatch(kv->head_dim, n_head / kv->n_head_kv, c, out, q, kv, layer, n_head, sl2);
}
