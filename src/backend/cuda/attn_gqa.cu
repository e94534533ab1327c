/*
 * attn_gqa.cu: split-K decode attention with the query heads of a KV group
 * taken together (grouped-query attention).
 *
 * k_att_rows (attention.cu) gives every query head its own blocks, so the
 * G = n_head / n_head_kv heads that share a KV head each stream the same
 * cached keys and values: G reads of the cache per step (L2 absorbs some,
 * not at 30k tokens). Here block (row * n_head_kv + kv head, split) of 4
 * warps reads each key and value of its range once and applies it to the G
 * query heads:
 *   - warp w takes U consecutive tokens at a time (beg + w*U, then +4U);
 *     lane l holds EPL = HD/32 elements of the head; the U*G dot products
 *     are warp sums; each query head keeps its own online softmax (m, l, o);
 *   - the 4 warps merge in shared memory, and the block writes, per query
 *     head, [m, l, o[HD]] to the same partials layout as k_att_rows (or the
 *     normalised output when n_split == 1);
 *   - the last block of a (row, kv head) to finish (an atomic counter, left
 *     at zero) merges the splits of its G heads, so a layer's attention is
 *     one launch and a CUDA graph replays it at any length.
 * Decode rows and short chunks over long caches only: cu_attention picks it
 * where k_att_rows would run and the split factor is at its cap of 64
 * (max_len above ~1024 tokens at batch 1; the factor is part of the graph
 * key, so a replayed step keeps its kernel). Measured on the H200 (dummy
 * Qwen3-8B, G = 4, decode TPOT): 10.36 vs 11.91 ms at 30,720 tokens of
 * context, 8.20 vs 8.46 at 14,336, but 5.93 vs 5.07 ms at a few tokens,
 * where its G-fold fewer blocks leave the GPU idle and the merge of many
 * short splits dominates. G in {2, 4, 8}, head_dim 64 or 128; other shapes
 * keep k_att_rows. KILN_CUDA_GQA=0 turns it off.
 */
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda.cuh"

template <int HD, int G>
__global__ void __launch_bounds__(128) k_att_gqa(bf16 *__restrict__ out, float *__restrict__ part, const bf16 *__restrict__ q,
                                                 const bf16 *__restrict__ kc, const bf16 *__restrict__ vc,
                                                 const int *__restrict__ row_seq, const int *__restrict__ row_t,
                                                 const int *__restrict__ seq, const int *__restrict__ pages, int n_head, int nkv,
                                                 int P, float sl2, int n_split, int *__restrict__ done) {
    KTRACE();
    pdl_wait();
    constexpr int EPL = HD / 32, U = G <= 4 ? 4 : 2;
    const int rk = blockIdx.x, row = rk / nkv, kh = rk % nkv, sp = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int s = row_seq[row], len = row_t[row] + 1, poff = seq[4 * s + 3];
    const int chunk = (len + n_split - 1) / n_split, beg = sp * chunk, end = min(len, beg + chunk);
    float qv[G][EPL], o[G][EPL], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const bf16 *qh = q + ((size_t)row * n_head + kh * G + g) * HD + lane * EPL;
#pragma unroll
        for (int e = 0; e < EPL; e++) qv[g][e] = __bfloat162float(qh[e]) * sl2, o[g][e] = 0.f;
        m[g] = -INFINITY, l[g] = 0.f;
    }
    for (int t0 = beg + warp * U; t0 < end; t0 += 4 * U) {
        float kx[U][EPL], vx[U][EPL];
        /* all loads of the step first: the loop is latency-bound otherwise */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int t = t0 + u;
#pragma unroll
            for (int e = 0; e < EPL; e++) kx[u][e] = vx[u][e] = 0.f;
            if (t < end) {
                const size_t off = (((size_t)pages[poff + t / P] * nkv + kh) * P + t % P) * HD + lane * EPL;
#pragma unroll
                for (int e = 0; e < EPL; e++) kx[u][e] = __bfloat162float(kc[off + e]), vx[u][e] = __bfloat162float(vc[off + e]);
            }
        }
        float d[U][G];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int g = 0; g < G; g++) {
                float a = 0.f;
#pragma unroll
                for (int e = 0; e < EPL; e++) a += qv[g][e] * kx[u][e];
                d[u][g] = a;
            }
#pragma unroll
        for (int x = 16; x; x >>= 1)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int g = 0; g < G; g++) d[u][g] += __shfl_xor_sync(0xffffffffu, d[u][g], x);
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mn = m[g];
#pragma unroll
            for (int u = 0; u < U; u++)
                if (t0 + u < end) mn = fmaxf(mn, d[u][g]);
            const float corr = exp2f(m[g] - mn);
            float p[U], ps = 0.f;
#pragma unroll
            for (int u = 0; u < U; u++) p[u] = t0 + u < end ? exp2f(d[u][g] - mn) : 0.f, ps += p[u];
            l[g] = l[g] * corr + ps;
            m[g] = mn;
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                float a = o[g][e] * corr;
#pragma unroll
                for (int u = 0; u < U; u++) a += p[u] * vx[u][e];
                o[g][e] = a;
            }
        }
    }
    /* the 4 warps' states, merged per query head */
    __shared__ float sm[4][G], sl[4][G], so[4][G][HD];
    if (lane == 0)
#pragma unroll
        for (int g = 0; g < G; g++) sm[warp][g] = m[g], sl[warp][g] = l[g];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < EPL; e++) so[warp][g][lane * EPL + e] = o[g][e];
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += 128) {
        const int g = idx / HD, dd = idx % HD, h = kh * G + g;
        float M = -INFINITY, L = 0.f, acc = 0.f;
#pragma unroll
        for (int w = 0; w < 4; w++) M = fmaxf(M, sm[w][g]);
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const float wt = sm[w][g] == -INFINITY ? 0.f : exp2f(sm[w][g] - M);
            L += wt * sl[w][g], acc += wt * so[w][g][dd];
        }
        if (n_split == 1) {
            out[((size_t)row * n_head + h) * HD + dd] = __float2bfloat16(acc / L);
        } else {
            float *pp = part + (((size_t)row * n_head + h) * n_split + sp) * (HD + 2);
            pp[2 + dd] = acc;
            if (dd == 0) pp[0] = M, pp[1] = L;
        }
    }
    if (n_split == 1) return;
    /* the last block of this (row, kv head) merges the splits of its G heads,
     * then resets the counter for the next launch (graph replays included) */
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&done[rk], 1) == n_split - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int g = 0; g < G; g++) {
        const int h = kh * G + g;
        const float *pp = part + ((size_t)row * n_head + h) * n_split * (HD + 2);
        att_merge<HD>(out + ((size_t)row * n_head + h) * HD, n_split, [&](int i, int j) { return __ldcg(pp + (size_t)i * (HD + 2) + j); });
        __syncthreads(); /* att_merge's shared state is rewritten for the next head */
    }
    if (threadIdx.x == 0) done[rk] = 0;
}

template <int HD, int G>
static void launch(struct cuda_ctx *c, bf16 *out, const bf16 *q, const struct kv_cache *kv, int layer, int n_head, float sl2,
                   int n_split) {
    const int rows = c->n_tokens * n_head;
    float *part = NULL;
    if (n_split > 1)
        part = (float *)cu_scratch(c, (void **)&c->att_part, &c->att_part_cap, (size_t)rows * n_split * (HD + 2) * sizeof(float));
    if ((n_split > 1 && !part) || !cu_att_cnt(c, (size_t)rows)) return; /* out of device memory: cu_error reports it */
    dim3 grid((unsigned)(c->n_tokens * kv->n_head_kv), (unsigned)n_split);
    cu_launch(c->stream, k_att_gqa<HD, G>, grid, 128, 0, out, part, q, (const bf16 *)kv->k[layer], (const bf16 *)kv->v[layer],
              c->d_row_seq, c->d_row_t, c->d_seq, c->d_pages, n_head, kv->n_head_kv, kv->page_size, sl2, n_split, c->att_cnt);
    CU_LAUNCHED();
}

/* 1 if it ran the batch's attention (decode rows / short chunks), 0 if the
 * shape is not one it handles */
/* whether cu_attention_gqa takes this attention */
int cu_attention_gqa_takes(const struct cuda_ctx *c, const struct kv_cache *kv, int n_head) {
    static int off = -1;
    if (off < 0) {
        const char *e = getenv("KILN_CUDA_GQA");
        off = e && !strcmp(e, "0");
    }
    const int G = n_head / kv->n_head_kv, hd = kv->head_dim;
    return !(off || n_head % kv->n_head_kv || (hd != 64 && hd != 128) || c->att_split < 64) && (G == 2 || G == 4 || G == 8);
}

int cu_attention_gqa(struct cuda_ctx *c, bf16 *out, const bf16 *q, const struct kv_cache *kv, int layer, int n_head, float sl2) {
    if (!cu_attention_gqa_takes(c, kv, n_head)) return 0;
    const int G = n_head / kv->n_head_kv, hd = kv->head_dim;
    const int n_split = c->att_split; /* 64: the most the merge handles */
#define GQA_CASE(H, GG)                                                   \
    if (hd == H && G == GG) {                                             \
        launch<H, GG>(c, out, q, kv, layer, n_head, sl2, n_split);        \
        return 1;                                                         \
    }
    GQA_CASE(64, 2) GQA_CASE(64, 4) GQA_CASE(64, 8) GQA_CASE(128, 2) GQA_CASE(128, 4) GQA_CASE(128, 8)
#undef GQA_CASE
    return 0;
}
