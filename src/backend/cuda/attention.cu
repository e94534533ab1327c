/*
 * attention.cu: the KV cache write and causal GQA attention over the paged
 * bf16 cache (layout in backend.h: one head's keys of one page contiguous).
 *
 * Two attention kernels, picked per forward by the longest sequence chunk:
 *  - rows (decode, and chunks of at most ATT_ROWS_MAX tokens): split-K
 *    flash-decoding. Each (row, query head) is split into n_split ranges of
 *    its cached keys; a block computes one range with an online softmax and
 *    writes (max, sum, unnormalised output) in f32; the last block of a
 *    (row, head) to finish (an atomic counter) merges the ranges, so a
 *    decode layer's attention is one launch. n_split depends on the batch shape only, never on the lengths
 *    (which the kernels read from the device), so a decode step can be a
 *    CUDA graph replayed at every length.
 *  - flash (prefill): FlashAttention-2 on the tensor cores (mma.sync
 *    m16n8k16 bf16, f32 accumulators), 64 query rows x one query head per
 *    block, 64-key tiles gathered page by page into shared memory with
 *    cp.async, two stages deep. Blocks run heaviest (longest causal span)
 *    first. head_dim 16, 32, 64 or 128.
 *    Split-KV (flash-decoding applied to prefill tiles): when the (tile,
 *    head) blocks are too few to fill the GPU and their key spans are long
 *    (a short chunk after a long cached prefix: 250 new tokens after 15,750
 *    cached are 4 tiles x 32 heads = 128 blocks, each walking 16k keys on
 *    one SM), cu_begin splits a tile's key range [0, kv_end) into n_sp
 *    chunks of whole 64-key blocks, one work-list entry each. A split block
 *    writes its unnormalised O (f32, 64 x D), row max m and row sum l to a
 *    partial slot; the last block of the (tile, head) to finish (an atomic
 *    counter, as in the row kernel) merges the n_sp partials in slot order
 *    and writes the output, so it stays one launch. The causal mask is the
 *    same per-key test as unsplit (it only bites in the chunk holding the
 *    diagonal); a row with no visible key in a chunk keeps m = -inf, l = 0
 *    and weighs 0 in the merge. The plan (cuda.cu fa_split_kb) is
 *    FlashAttention-2's wave heuristic: none when the unsplit blocks fill
 *    0.8 of a wave (slots = SMs x resident blocks per SM, 2 at head_dim 128)
 *    or no tile walks 16 key blocks, so a long prefill launches the unsplit
 *    kernel, unchanged; else, for the longest tile cut into k = 1..64
 *    chunks, every tile takes chunks of cb = ceil(longest / k) key blocks
 *    (>= 8, i.e. 512 keys), the time is estimated as waves x longest chunk,
 *    ceil(blocks / slots) x cb, and the smallest k within 1/0.85 of the best
 *    wins (250 new after 15,750 on 32 heads: 2 chunks, 256 blocks in one
 *    wave). KILN_CUDA_FA_SPLIT=0 turns it off; =N cuts the longest tile
 *    into N chunks whatever the estimate says.
 * Decode steps over 256 or more cached keys take attn_dec.cu instead on
 * sm_90 (cu_begin decides, cu_attention launches), and at 64 splits the
 * row kernel's shapes with grouped heads take attn_gqa.cu.
 * Scores and softmax are f32; P is rounded to bf16 for the P.V product, as
 * FlashAttention does. On Hopper (sm_90a code) the two-heads flash blocks at
 * head_dim 128 run flash_wg.cu's wgmma kernel instead (same work list,
 * mask, partial slots and merge: flash.cuh).
 */
#include <math.h>

#include "backend/cuda/cuda.cuh"
#include "backend/cuda/flash.cuh"

#include "backend/cuda/sm90.cuh"

/* ==== KV write ==== */

/*
 * k_kv_write: copies each new row's k and v heads into its page slot.
 * Decomposition: one thread per (row, kv head, U-element chunk).
 */
template <int U>
__global__ void k_kv_write(bf16 *__restrict__ kc, bf16 *__restrict__ vc, const bf16 *__restrict__ k, const bf16 *__restrict__ v,
                           const int *__restrict__ row_seq, const int *__restrict__ row_t, const int *__restrict__ seq,
                           const int *__restrict__ pages, int n, int nkv, int hd, int P) {
    KTRACE();
    pdl_wait();
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int per_head = hd / U, per_row = nkv * per_head;
    if (idx >= (size_t)n * per_row) return;
    const int row = (int)(idx / per_row), rem = (int)(idx % per_row), h = rem / per_head, d = (rem % per_head) * U;
    const int s = row_seq[row], t = row_t[row];
    const int page = pages[seq[4 * s + 3] + t / P], slot = t % P;
    const size_t dst = (((size_t)page * nkv + h) * P + slot) * hd + d, src = ((size_t)row * nkv + h) * hd + d;
    if (U == 8) {
        *(uint4 *)(kc + dst) = *(const uint4 *)(k + src);
        *(uint4 *)(vc + dst) = *(const uint4 *)(v + src);
    } else {
        kc[dst] = k[src];
        vc[dst] = v[src];
    }
}

void cu_kv_write(struct kiln_backend *be, struct kv_cache *kv, int layer, const void *k, const void *v,
                 const struct kiln_batch *b) {
    CU_SKIP_IF_REPLAY(be);
    struct cuda_ctx *c = cu_ctx(be);
    CU_TAPE(c, SKT_KVW, kv, k, v, NULL, NULL, NULL, b->n_tokens, 0, layer, 0, 0.f);
    if (kv->dtype != KILN_DTYPE_BF16) {
        fprintf(stderr, "kiln: cuda: (a bug: the engine refuses this at open, kv_dtypes) the KV cache must be BF16 (got %s)\n",
                dtype_name(kv->dtype));
        abort();
    }
    if (!c->bytes_kv)
        c->bytes_kv = 2 * (size_t)kv->n_layer * kv->n_pages * kv->page_size * kv->n_head_kv * kv->head_dim * 2;
    const int n = b->n_tokens, hd = kv->head_dim, nkv = kv->n_head_kv;
    /* the rope just before, on this k: one kernel ropes q and k and writes the cache */
    /* (on the prefill's one q/k/v GEMM, prope.qi: v must be its v, which the kernel reads there) */
    if (c->prope.on && c->prope.k == k && c->prope.n_tok == n && c->prope.n_head_kv == nkv && c->prope.hd == hd && hd % 8 == 0 &&
        !((uintptr_t)v & 15) && (!c->prope.qi || (c->pqkv.on && v == c->pqkv.out[2]))) {
        /* a decode step: hold both for the attention that follows */
        if (!c->no_fuse_att && !c->tape_on && c->max_seq_n == 1 && !c->use_flash && !c->prope.qi && (hd == 64 || hd == 128 || hd == 256)) {
            c->pkv.on = 1, c->pkv.P = kv->page_size, c->pkv.kc = (bf16 *)kv->k[layer], c->pkv.vc = (bf16 *)kv->v[layer];
            c->pkv.v = (const bf16 *)v;
            return;
        }
        cu_rope_launch(c, (bf16 *)kv->k[layer], (bf16 *)kv->v[layer], (const bf16 *)v, kv->page_size);
        return;
    }
    cu_flush(c);
    if (hd % 8 == 0) {
        size_t tot = (size_t)n * nkv * hd / 8;
        cu_launch(c->stream, k_kv_write<8>, (unsigned)((tot + 127) / 128), 128, 0, 
            (bf16 *)kv->k[layer], (bf16 *)kv->v[layer], (const bf16 *)k, (const bf16 *)v, c->d_row_seq, c->d_row_t, c->d_seq,
            c->d_pages, n, nkv, hd, kv->page_size);
    } else {
        size_t tot = (size_t)n * nkv * hd;
        cu_launch(c->stream, k_kv_write<1>, (unsigned)((tot + 127) / 128), 128, 0, 
            (bf16 *)kv->k[layer], (bf16 *)kv->v[layer], (const bf16 *)k, (const bf16 *)v, c->d_row_seq, c->d_row_t, c->d_seq,
            c->d_pages, n, nkv, hd, kv->page_size);
    }
    CU_LAUNCHED();
}

/* ==== rows: split-K flash-decoding ==== */

/*
 * k_att_rows: block (row*n_head + h, split) of 4 warps. The split's key range
 * [beg, end) of the row's len = row_t + 1 keys is dealt to the warps token by
 * token (warp w takes beg+w, beg+w+4, ...); lane l holds EPL consecutive
 * elements of the head (HD/EPL lanes active). Each warp keeps an online
 * softmax (m, l, o); the 4 warps merge in shared memory, and the block writes
 * [m, l, o[HD]] to part (or the normalised output when n_split == 1).
 */
/* what k_att_rows<HD, true> needs to do the q/k norm + RoPE and the KV write
 * itself (decode: one new token per sequence, the last key of its row) */
struct att_rope {
    const bf16 *k, *v; /* this step's k and v projections, [row][nkv][HD], k not yet roped */
    const float *qw, *kw, *inv_freq; /* q_norm / k_norm weights (NULL: no norm), RoPE frequencies */
    const int *pos;
    float af, eps;
    int pre; /* the batch tables and the first cached keys are read before the wait (see k_att_rows) */
};

/* One head in a warp, lane l holding elements [l E, l E + E) (E = HD / 32,
 * HD >= 64, so element i < HD/2 and its rotation partner i + HD/2 sit in
 * lanes l and l ^ 16): the per-head RMSNorm (norm: the lane's E weights
 * nw, held in registers) and the
 * rotation, rounded to bf16, with k_qk_norm_rope_v's arithmetic per element
 * (only the sum of squares is added in another order). */
template <int E, int HD>
__device__ __forceinline__ void att_norm_rope(float *x, bool norm, const float *nw, float eps, const float *cn, const float *sn,
                                              int lane) {
    if (norm) {
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < E; e++) ss += x[e] * x[e];
#pragma unroll
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float rr = rsqrtf(ss / HD + eps);
#pragma unroll
        for (int e = 0; e < E; e++) x[e] = nw[e] * (x[e] * rr);
    }
    const bool first = lane < 16;
#pragma unroll
    for (int e = 0; e < E; e++) {
        const float y = __shfl_xor_sync(0xffffffffu, x[e], 16);
        x[e] = __bfloat162float(__float2bfloat16(first ? x[e] * cn[e] - y * sn[e] : x[e] * cn[e] + y * sn[e]));
    }
}

/* A lane's EPL consecutive bf16 (EPL = 1, 2, 4 or 8; aligned to their
 * size) as raw 32-bit words in one load, element 2i in word i's low half,
 * and the words back to floats: kept raw, a load's wait moves to the first
 * use of the value instead of the conversion right after it */
template <int EPL> __device__ __forceinline__ void ld_bf16_raw(uint32_t *w, const bf16 *p) {
    if constexpr (EPL == 1) w[0] = *(const unsigned short *)p;
    else if constexpr (EPL == 2) w[0] = *(const uint32_t *)p;
    else if constexpr (EPL == 4) {
        const uint2 v = *(const uint2 *)p;
        w[0] = v.x, w[1] = v.y;
    } else {
        static_assert(EPL == 8, "1, 2, 4 or 8 elements");
        const uint4 v = *(const uint4 *)p;
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    }
}
template <int EPL> __device__ __forceinline__ void bf16_unraw(float *x, const uint32_t *w) {
    if constexpr (EPL == 1) x[0] = __uint_as_float(w[0] << 16);
    else
#pragma unroll
        for (int i = 0; i < EPL / 2; i++) x[2 * i] = __uint_as_float(w[i] << 16), x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
}

/* ROPE (decode only, HD >= 64): q and the new key arrive unroped, straight
 * from the projections. Every warp ropes its block's q head; the blocks
 * whose key range holds the new token (the row's last, len - 1) rope its k
 * head in registers and use it and v from the projections for that token,
 * and of those the one of the KV group's first q head writes both into the
 * cache (no block of this launch reads that slot from the cache; one new
 * token per sequence, so no other row needs it). This replaces the
 * k_qk_norm_rope_v launch of the layer.
 * R.pre: the batch tables, the RoPE angles and the warp's first 4 cached
 * keys and values are read before griddepcontrol.wait, so those DRAM reads
 * overlap the previous kernel instead of following it; only q and the new
 * token's k and v wait. Allowed when the launch just before is a GEMV
 * (attention_fused checks it): a GEMV releases this kernel only after its
 * own wait, so every kernel before it has finished, and it writes neither
 * the cache nor the tables (uploaded before the step). The cached keys
 * read are those of earlier steps; this launch writes only the new slot,
 * which none of its blocks reads from the cache. */
/* CL (sm_90, 2 <= n_split <= ATT_CL_MAX): the launch's clusters are the
 * n_split blocks of one (row, head) (cluster rank = split sp). The first
 * block sets up an mbarrier that expects the other blocks' slots,
 * (n_split - 1) x (HD + 2) x 4 bytes, before every block arrives (relaxed)
 * on the cluster barrier; each block waits on that barrier while its q is
 * in flight, so the mbarrier is ready before any remote store. At the end
 * every other block sends its [M, L, o] into slot sp of the first block's
 * shared memory with st.async, each store completing its 4 bytes on that
 * mbarrier, and exits: no fence, no barrier on the sender's side. The
 * first block writes its own slot, waits on the mbarrier and merges. That
 * replaces the global partials, the fence, the atomic ticket and the last
 * block's reads back from L2. Same values and order of sums as the global
 * merge, so the same bits. (Earlier versions: every block kept its own
 * slot and the first read them remotely between two barriers; then remote
 * stores and a release arrive on the cluster barrier, whose release alone
 * took ~1.4 us.) */
#define ATT_CL_MAX 16
template <int HD, bool ROPE, bool CL>
__global__ void __launch_bounds__(128) k_att_rows(bf16 *__restrict__ out, float *__restrict__ part, const bf16 *q,
                                                  const bf16 *__restrict__ kc, const bf16 *__restrict__ vc,
                                                  const int *__restrict__ row_seq, const int *__restrict__ row_t,
                                                  const int *__restrict__ seq, const int *__restrict__ pages, int n_head, int nkv,
                                                  int P, float sl2, int n_split, int *__restrict__ done, att_rope R) {
    KTRACE();
    constexpr int EPL = HD >= 32 ? HD / 32 : 1, LANES = HD / EPL, RW = (EPL + 1) / 2;
    const bool pre = ROPE && R.pre;
    if (!pre) pdl_wait();
    const int rh = blockIdx.x, row = rh / n_head, h = rh % n_head, kh = h / (n_head / nkv), sp = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool act = lane < LANES;
    /* Before the wait (pre), this block runs behind the previous GEMV's
     * weight stream, where every trip to memory takes ~1 us: loads that do
     * not depend on each other are written first, so they go out together,
     * and nothing loaded is converted before the wait. The RoPE inputs and
     * the q/k norm weights (never written by a kernel) depend only on the
     * lane and the row; the key and value rows stay raw bf16 words until
     * the key loop. (Interleaved with the sincosf and converted at once,
     * they made ~13 dependent trips before the wait: ~4 us per layer.) */
    const int s = row_seq[row], len = row_t[row] + 1;
    float fr[EPL], qw[EPL], kw[EPL], p = 0.f;
    if constexpr (ROPE) {
        const int f0 = (lane * EPL) % (HD / 2); /* element i rotates by inv_freq[i mod HD/2] */
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            fr[e] = R.inv_freq[f0 + e];
            qw[e] = R.qw ? R.qw[lane * EPL + e] : 1.f;
            kw[e] = R.kw ? R.kw[lane * EPL + e] : 1.f;
        }
        p = (float)R.pos[row];
    }
    const int poff = seq[4 * s + 3];
    const int chunk = (len + n_split - 1) / n_split, beg = sp * chunk, end = min(len, beg + chunk);
    const int tn = len - 1; /* the new token (ROPE) */
    const bool has_new = ROPE && beg <= tn && tn < end;
    /* a warp step's 4 consecutive keys from the cache as raw bf16 words
     * (the new one comes from registers): the 4 page entries, then the 8
     * rows, so two trips to memory */
    uint32_t kr[4][RW], vr[4][RW];
    /* key t's row of this KV head in the paged cache, its page pg = pages[poff + t / P] */
    auto slot = [&](int pg, int t) { return (((size_t)pg * nkv + kh) * P + t % P) * HD; };
    auto load4 = [&](int t0) {
        int pg[4];
        bool ok[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int t = t0 + u;
            ok[u] = !(has_new && t == tn) && t < end && act;
            pg[u] = ok[u] ? pages[poff + t / P] : 0;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int t = t0 + u;
#pragma unroll
            for (int i = 0; i < RW; i++) kr[u][i] = vr[u][i] = 0u;
            if (ok[u]) {
                const size_t off = slot(pg[u], t) + lane * EPL;
                ld_bf16_raw<EPL>(kr[u], kc + off), ld_bf16_raw<EPL>(vr[u], vc + off);
            }
        }
    };
    /* CL: the first block's barrier for the others' slots (below), set up
     * before this block arrives on the cluster barrier that every block
     * waits on before its first remote store */
    __shared__ __align__(8) unsigned long long cbar;
    (void)cbar;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (CL) {
        if (sp == 0 && threadIdx.x == 0) {
            mbar_init(smem_u32(&cbar), 1);
            mbar_arrive_tx(smem_u32(&cbar), (unsigned)((n_split - 1) * (HD + 2) * 4));
            mbar_init_fence_cluster();
        }
        cluster_arrive_relaxed(); /* this block has started */
    }
#endif
    /* the new token's k and v go to the cache from warp 0 of one block per
     * KV head (the one of the group's first q head), at the block's end,
     * where nothing waits for the store (no later read in this launch);
     * its page entry goes out with the keys' */
    const bool writer = has_new && h % (n_head / nkv) == 0 && warp == 0;
    float kn[EPL], vn[EPL]; /* the new token's k (roped) and v */
    int pg_new = 0;
    if (pre) load4(beg + warp * 4);
    if (writer) pg_new = pages[poff + tn / P];
    auto put_new = [&]() {
        if (!writer) return;
        const size_t dst = slot(pg_new, tn) + lane * EPL;
#pragma unroll
        for (int e = 0; e < EPL; e++) ((bf16 *)kc)[dst + e] = __float2bfloat16(kn[e]), ((bf16 *)vc)[dst + e] = __float2bfloat16(vn[e]);
    };
    float cn[EPL], sn[EPL]; /* the angles: their inputs went out with the row's tables */
    if constexpr (ROPE)
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            sincosf(p * fr[e], &sn[e], &cn[e]);
            cn[e] *= R.af, sn[e] *= R.af;
        }
    if (pre) pdl_wait();
    /* q and (has_new) the new token's k and v: one round trip */
    float qv[EPL], o[EPL];
    {
        uint32_t qr[RW], kr1[RW], vr1[RW];
#pragma unroll
        for (int i = 0; i < RW; i++) qr[i] = kr1[i] = vr1[i] = 0u;
        if (act) ld_bf16_raw<EPL>(qr, q + ((size_t)row * n_head + h) * HD + lane * EPL);
        if (ROPE && has_new) {
            const size_t src = ((size_t)row * nkv + kh) * HD + lane * EPL;
            ld_bf16_raw<EPL>(kr1, R.k + src), ld_bf16_raw<EPL>(vr1, R.v + src);
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if constexpr (CL) cluster_wait(); /* every block has started: the first one's barrier is set up (while q comes) */
#endif
        KTRACE_MARK(1);
        bf16_unraw<EPL>(qv, qr), bf16_unraw<EPL>(kn, kr1), bf16_unraw<EPL>(vn, vr1);
    }
#pragma unroll
    for (int e = 0; e < EPL; e++) o[e] = 0.f;
    if constexpr (ROPE) {
        static_assert(HD >= 64, "fused RoPE: a head spans the warp");
        att_norm_rope<EPL, HD>(qv, R.qw != NULL, qw, R.eps, cn, sn, lane);
        if (has_new) att_norm_rope<EPL, HD>(kn, R.kw != NULL, kw, R.eps, cn, sn, lane);
    }
#pragma unroll
    for (int e = 0; e < EPL; e++) qv[e] *= sl2;
    KTRACE_MARK(2); /* q (and the new k, v) roped */
    float m = -INFINITY, l = 0.f;
    /* 4 consecutive tokens per warp step, all their loads issued before the
     * first use: the loop is latency-bound otherwise */
    for (int t0 = beg + warp * 4; t0 < end; t0 += 16) {
        if (!pre || t0 != beg + warp * 4) load4(t0); /* else loaded before the wait */
        float kx[4][EPL], vx[4][EPL];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            bf16_unraw<EPL>(kx[u], kr[u]), bf16_unraw<EPL>(vx[u], vr[u]);
            if (has_new && t0 + u == tn)
#pragma unroll
                for (int e = 0; e < EPL; e++) kx[u][e] = kn[e], vx[u][e] = vn[e];
        }
        att_step4<EPL>(qv, kx, vx, end - t0, m, l, o);
    }
    KTRACE_MARK(3); /* warp 0's keys done */
    __shared__ float sm[4], sl[4], so[4][HD];
    if (lane == 0) sm[warp] = m, sl[warp] = l;
    if (act)
#pragma unroll
        for (int e = 0; e < EPL; e++) so[warp][lane * EPL + e] = o[e];
    __syncthreads();
    KTRACE_MARK(0); /* the block's warps merged */
    const float M = fmaxf(fmaxf(sm[0], sm[1]), fmaxf(sm[2], sm[3]));
    float w[4], L = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = sm[i] == -INFINITY ? 0.f : exp2f(sm[i] - M), L += w[i] * sl[i];
    /* CL: every block's [M, L, o] goes to slot sp of the cluster's first
     * block, the others' by st.async into its shared memory, each store
     * completing 4 bytes on its barrier cbar; only that block waits */
    __shared__ float cp[CL ? ATT_CL_MAX * (HD + 2) : 1];
    (void)cp;
    for (int d = threadIdx.x; d < HD; d += 128) {
        float acc = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) acc += w[i] * so[i][d];
        if (n_split == 1) out[((size_t)row * n_head + h) * HD + d] = __float2bfloat16(acc / L);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        else if (CL) {
            if (sp == 0) cp[2 + d] = acc;
            else st_async_dsmem(cp + sp * (HD + 2) + 2 + d, 0, acc, &cbar);
        }
#endif
        else part[((size_t)rh * n_split + sp) * (HD + 2) + 2 + d] = acc;
    }
    if (n_split == 1) {
        put_new();
        return;
    }
    bf16 *ob = out + ((size_t)row * n_head + h) * HD;
    if constexpr (CL) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (threadIdx.x == 0) {
            if (sp == 0) cp[0] = M, cp[1] = L;
            else st_async_dsmem(cp + sp * (HD + 2), 0, M, &cbar), st_async_dsmem(cp + sp * (HD + 2) + 1, 0, L, &cbar);
        }
        KTRACE_MARK(4);
        if (sp != 0) { /* nothing reads this block's shared memory */
            put_new();
            return;
        }
        mbar_wait_cluster(smem_u32(&cbar), 0); /* the other blocks' slots are in */
        __syncthreads();                        /* and this block's own */
        KTRACE_MARK(5);
        const float *all = cp;
        att_merge<HD>(ob, n_split, [all](int i, int j) { return all[i * (HD + 2) + j]; });
        put_new();
#else
        __trap(); /* clusters are sm_90: the host never launches this elsewhere */
#endif
        return;
    }
    if (threadIdx.x == 0) {
        part[((size_t)rh * n_split + sp) * (HD + 2)] = M;
        part[((size_t)rh * n_split + sp) * (HD + 2) + 1] = L;
    }
    /* the last block of this (row, head) to finish merges all the splits,
     * then resets the counter for the next launch (graph replays included) */
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&done[rh], 1) == n_split - 1;
    __syncthreads();
    if (!last) {
        put_new();
        return;
    }
    __threadfence();
    const float *pp = part + (size_t)rh * n_split * (HD + 2);
    att_merge<HD>(ob, n_split, [&](int i, int j) { return __ldcg(pp + (size_t)i * (HD + 2) + j); });
    if (threadIdx.x == 0) done[rh] = 0;
    put_new();
}

/* ==== flash (prefill) on the tensor cores ==== */

__device__ __forceinline__ void ldsm_x4(unsigned *r, const void *p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_t(unsigned *r, const void *p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/*
 * k_flash: block (entry, HG query heads of one KV head); an entry of the
 * work list (layout in cuda.cuh) is a tile (sequence, first row m0) and the
 * key blocks it walks: all of its causal span, or with SPLIT one chunk of it.
 * Warp w owns query rows m0+16w .. m0+16w+15 of each of the block's heads;
 * lane (g = lane/4, t = lane%4) holds rows g and g+8 of the m16n8 fragments.
 * Per 64-key tile: S = Q K^T (ldmatrix from K rows), causal mask on absolute
 * cache positions, online softmax over the quad, O += P V (P re-packed from
 * the S accumulators as the A operand, V through ldmatrix.trans). Shared
 * memory rows are padded by 16 bytes (conflict-free ldmatrix). Keys past the
 * tile's last row are never loaded.
 * HG = 1: the warp's Q fragments stay in registers. HG = 2 (two q heads that
 * share a KV head, GQA): each K and V fragment read from shared memory feeds
 * both heads' MMAs, which halves the shared-memory traffic per flop and the
 * K/V tile loads per head; Q then sits in shared memory (registers hold two
 * heads' O and S) and is read with ldmatrix per 16-wide k step.
 * SPLIT (the launch has split entries; without them the kernel is the plain
 * one): a split entry writes (O, m, l) of every thread's fragments to its
 * partial slot per head, thread-major (element e of thread x at
 * [e * 128 + x], so both the writes and the merge's reads are coalesced),
 * and the last block of its group merges the group's slots fragment by
 * fragment, in registers.
 */
template <int D, bool SPLIT, int HG>
__global__ void __launch_bounds__(128) k_flash(bf16 *__restrict__ out, float *__restrict__ part, int *__restrict__ done,
                                               const bf16 *__restrict__ q, const bf16 *__restrict__ kc,
                                               const bf16 *__restrict__ vc, const int *__restrict__ tiles,
                                               const int *__restrict__ seq, const int *__restrict__ pages, int n_head, int nkv,
                                               int P, float sl2) {
    KTRACE();
    pdl_wait();
    constexpr int LD = D + 8;
    extern __shared__ uint4 smem_u4[];
    bf16 *smem = (bf16 *)smem_u4;
    /* stage st: K at smem + st * 2 * FA_BN * LD, V right after it; HG = 2:
     * Q of head i at smem + 4 * FA_BN * LD + i * FA_BM * LD */
    const int *ent = tiles + FA_ENT * blockIdx.x, h0 = blockIdx.y * HG, kh = h0 / (n_head / nkv);
    const struct flash_ent F = flash_entry<SPLIT>(tiles, seq);
    const int m0 = F.m0, start = F.start, n = F.n, n_past = F.n_past, poff = F.poff;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int mat = lane >> 3, r8 = lane & 7;
    const int qr0 = m0 + warp * 16 + g, qr1 = qr0 + 8;
    unsigned qa[HG == 1 ? D / 16 : 1][4];
    bf16 *Qs = smem + 4 * FA_BN * LD;
    if (HG == 1) {
        const bf16 *q0 = q + ((size_t)(start + min(qr0, n - 1)) * n_head + h0) * D;
        const bf16 *q1 = q + ((size_t)(start + min(qr1, n - 1)) * n_head + h0) * D;
#pragma unroll
        for (int ks = 0; ks < (HG == 1 ? D / 16 : 0); ks++) {
            qa[ks][0] = *(const unsigned *)(q0 + ks * 16 + 2 * t4);
            qa[ks][1] = *(const unsigned *)(q1 + ks * 16 + 2 * t4);
            qa[ks][2] = *(const unsigned *)(q0 + ks * 16 + 8 + 2 * t4);
            qa[ks][3] = *(const unsigned *)(q1 + ks * 16 + 8 + 2 * t4);
        }
    } else {
        /* the tile's Q rows of both heads (rows past n repeat row n - 1) */
        for (int i = threadIdx.x; i < HG * FA_BM * D / 8; i += 128) {
            const int hi = i / (FA_BM * D / 8), r = (i / (D / 8)) % FA_BM, dc = (i % (D / 8)) * 8;
            cp_async16(Qs + (hi * FA_BM + r) * LD + dc, q + ((size_t)(start + min(m0 + r, n - 1)) * n_head + h0 + hi) * D + dc);
        }
    }
    float o[HG][D / 8][4];
#pragma unroll
    for (int hi = 0; hi < HG; hi++)
#pragma unroll
        for (int i = 0; i < D / 8; i++) o[hi][i][0] = o[hi][i][1] = o[hi][i][2] = o[hi][i][3] = 0.f;
    float mr[HG][2], lr[HG][2];
#pragma unroll
    for (int hi = 0; hi < HG; hi++) mr[hi][0] = mr[hi][1] = -INFINITY, lr[hi][0] = lr[hi][1] = 0.f;
    const int kv_end = F.kv_end, kb0 = F.kb0, n_kb = F.kb1;
    const int p0 = n_past + qr0, p1 = n_past + qr1;

    auto load = [&](int kb, int st) {
        for (int i = threadIdx.x; i < FA_BN * D / 8; i += 128) {
            const int key = i / (D / 8), dc = (i % (D / 8)) * 8, tk = kb * FA_BN + key;
            bf16 *dk = smem + st * 2 * FA_BN * LD + key * LD + dc, *dv = dk + FA_BN * LD;
            if (tk < kv_end) {
                const size_t off = (((size_t)pages[poff + tk / P] * nkv + kh) * P + tk % P) * D + dc;
                cp_async16(dk, kc + off);
                cp_async16(dv, vc + off);
            } else {
                *(uint4 *)dk = make_uint4(0, 0, 0, 0);
                *(uint4 *)dv = make_uint4(0, 0, 0, 0);
            }
        }
        asm volatile("cp.async.commit_group;"); /* with HG = 2 the first group also holds Q */
    };

    load(kb0, kb0 & 1);
    for (int kb = kb0; kb < n_kb; kb++) {
        if (kb + 1 < n_kb) {
            load(kb + 1, (kb + 1) & 1);
            asm volatile("cp.async.wait_group 1;");
        } else {
            asm volatile("cp.async.wait_group 0;");
        }
        __syncthreads();
        const bf16 *K = smem + (kb & 1) * 2 * FA_BN * LD, *V = K + FA_BN * LD;
        float sc[HG][FA_BN / 8][4];
#pragma unroll
        for (int hi = 0; hi < HG; hi++)
#pragma unroll
            for (int i = 0; i < FA_BN / 8; i++) sc[hi][i][0] = sc[hi][i][1] = sc[hi][i][2] = sc[hi][i][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            unsigned qf[HG][4];
#pragma unroll
            for (int hi = 0; hi < HG; hi++) {
                if (HG == 1) {
#pragma unroll
                    for (int r = 0; r < 4; r++) qf[hi][r] = qa[HG == 1 ? ks : 0][r];
                } else {
                    ldsm_x4(qf[hi], Qs + (hi * FA_BM + warp * 16 + (mat & 1) * 8 + r8) * LD + ks * 16 + (mat >> 1) * 8);
                }
            }
#pragma unroll
            for (int nt2 = 0; nt2 < FA_BN / 16; nt2++) {
                unsigned b[4];
                ldsm_x4(b, K + (nt2 * 16 + (mat >> 1) * 8 + r8) * LD + ks * 16 + (mat & 1) * 8);
#pragma unroll
                for (int hi = 0; hi < HG; hi++) {
                    mma16816(sc[hi][2 * nt2], qf[hi], b[0], b[1]);
                    mma16816(sc[hi][2 * nt2 + 1], qf[hi], b[2], b[3]);
                }
            }
        }
        /* per head: scale (log2 domain) and causal mask, then the online softmax */
        unsigned pa[HG][FA_BN / 16][4];
#pragma unroll
        for (int hi = 0; hi < HG; hi++) {
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < FA_BN / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = kb * FA_BN + nt * 8 + 2 * t4 + (e & 1);
                    const float v = key <= (e < 2 ? p0 : p1) ? sc[hi][nt][e] * sl2 : -INFINITY;
                    sc[hi][nt][e] = v;
                    if (e < 2) mx0 = fmaxf(mx0, v);
                    else mx1 = fmaxf(mx1, v);
                }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1)), mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1)), mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float mn0 = fmaxf(mr[hi][0], mx0), mn1 = fmaxf(mr[hi][1], mx1);
            /* unsplit, key block 0 holds a visible key of every row, so m is
             * finite from the first block on; a chunk may start past a row's
             * position: keep m = -inf there and subtract 0 (p = 0, l = 0) */
            const float b0 = SPLIT && mn0 == -INFINITY ? 0.f : mn0, b1 = SPLIT && mn1 == -INFINITY ? 0.f : mn1;
            const float a0 = exp2f(mr[hi][0] - b0), a1 = exp2f(mr[hi][1] - b1);
            float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
            for (int nt = 0; nt < FA_BN / 8; nt++) {
                sc[hi][nt][0] = exp2f(sc[hi][nt][0] - b0), sc[hi][nt][1] = exp2f(sc[hi][nt][1] - b0);
                sc[hi][nt][2] = exp2f(sc[hi][nt][2] - b1), sc[hi][nt][3] = exp2f(sc[hi][nt][3] - b1);
                ls0 += sc[hi][nt][0] + sc[hi][nt][1], ls1 += sc[hi][nt][2] + sc[hi][nt][3];
            }
            ls0 += __shfl_xor_sync(0xffffffffu, ls0, 1), ls0 += __shfl_xor_sync(0xffffffffu, ls0, 2);
            ls1 += __shfl_xor_sync(0xffffffffu, ls1, 1), ls1 += __shfl_xor_sync(0xffffffffu, ls1, 2);
            lr[hi][0] = lr[hi][0] * a0 + ls0, lr[hi][1] = lr[hi][1] * a1 + ls1;
            mr[hi][0] = mn0, mr[hi][1] = mn1;
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) o[hi][dt][0] *= a0, o[hi][dt][1] *= a0, o[hi][dt][2] *= a1, o[hi][dt][3] *= a1;
#pragma unroll
            for (int j = 0; j < FA_BN / 16; j++) {
                pa[hi][j][0] = pack_bf16(sc[hi][2 * j][0], sc[hi][2 * j][1]);
                pa[hi][j][1] = pack_bf16(sc[hi][2 * j][2], sc[hi][2 * j][3]);
                pa[hi][j][2] = pack_bf16(sc[hi][2 * j + 1][0], sc[hi][2 * j + 1][1]);
                pa[hi][j][3] = pack_bf16(sc[hi][2 * j + 1][2], sc[hi][2 * j + 1][3]);
            }
        }
#pragma unroll
        for (int j = 0; j < FA_BN / 16; j++)
#pragma unroll
            for (int dt2 = 0; dt2 < D / 16; dt2++) {
                unsigned b[4];
                ldsm_x4_t(b, V + (j * 16 + (mat & 1) * 8 + r8) * LD + dt2 * 16 + (mat >> 1) * 8);
#pragma unroll
                for (int hi = 0; hi < HG; hi++) {
                    mma16816(o[hi][2 * dt2], pa[hi][j], b[0], b[1]);
                    mma16816(o[hi][2 * dt2 + 1], pa[hi][j], b[2], b[3]);
                }
            }
        __syncthreads(); /* this stage is refilled two tiles on */
    }
    if (SPLIT && ent[4] >= 0) {
        /* a chunk of a split tile: (O, m, l) to its slot, per head; the
         * group's last block to finish merges all the slots into o, lr */
        const int j0 = ent[4], sp = ent[5], n_sp = ent[6];
#pragma unroll
        for (int hi = 0; hi < HG; hi++) flash_part_store<D>(part, j0 + sp, n_head, h0 + hi, threadIdx.x, o[hi], mr[hi], lr[hi]);
        if (!flash_group_last(done, j0 * n_head + h0, n_sp)) return;
#pragma unroll
        for (int hi = 0; hi < HG; hi++) flash_part_merge<D>(part, j0, n_sp, n_head, h0 + hi, threadIdx.x, o[hi], lr[hi]);
    }
#pragma unroll
    for (int hi = 0; hi < HG; hi++) flash_store_out<D>(out, start, n, n_head, h0 + hi, qr0, t4, o[hi], lr[hi]);
}

/* two stages of K and V tiles (+ Q of the HG heads when HG > 1) */
template <int D, int HG>
static size_t flash_smem(void) {
    const size_t smem = (size_t)(4 * FA_BN + (HG > 1 ? HG * FA_BM : 0)) * (D + 8) * sizeof(bf16);
    static bool attr_set = false;
    if (!attr_set) {
        CUDA_CHECK(cudaFuncSetAttribute(k_flash<D, false, HG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CUDA_CHECK(cudaFuncSetAttribute(k_flash<D, true, HG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = true;
    }
    return smem;
}

template <int D, int HG>
static int flash_blocks_per_sm(void) {
    static int nb = 0;
    if (!nb) {
        const size_t smem = flash_smem<D, HG>();
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_flash<D, true, HG>, 128, smem));
        nb = nb > 0 ? nb : 1;
    }
    return nb;
}

int cu_flash_blocks_per_sm(int hd, int hg) {
    if (hd == 128 && hg == 2 && cu_flash_wg_ok()) return 1; /* k_flash_wg(2): 160 (230) KB of shared memory */
    switch (hd * 4 + (hg == 2 ? 2 : 1)) {
    case 16 * 4 + 1: return flash_blocks_per_sm<16, 1>();
    case 32 * 4 + 1: return flash_blocks_per_sm<32, 1>();
    case 64 * 4 + 1: return flash_blocks_per_sm<64, 1>();
    case 128 * 4 + 1: return flash_blocks_per_sm<128, 1>();
    case 16 * 4 + 2: return flash_blocks_per_sm<16, 2>();
    case 32 * 4 + 2: return flash_blocks_per_sm<32, 2>();
    case 64 * 4 + 2: return flash_blocks_per_sm<64, 2>();
    case 128 * 4 + 2: return flash_blocks_per_sm<128, 2>();
    default: return 1;
    }
}

/* the most q heads per flash block: 2 when a KV head serves an even
 * number of q heads (KILN_CUDA_FA_HG=1 forces 1); cu_begin decides per
 * batch whether to use 2 */
int cu_flash_hg(int n_head, int nkv) {
    static int force = -1;
    if (force < 0) {
        const char *e = getenv("KILN_CUDA_FA_HG");
        force = e && !strcmp(e, "1") ? 1 : 0;
    }
    return !force && nkv > 0 && (n_head / nkv) % 2 == 0 ? 2 : 1;
}

template <int D, int HG>
static void launch_flash(struct cuda_ctx *c, bf16 *out, const bf16 *q, const struct kv_cache *kv, int layer, int n_head,
                         float sl2) {
    const size_t smem = flash_smem<D, HG>();
    dim3 grid((unsigned)c->n_fa_tiles, (unsigned)(n_head / HG));
    const bf16 *kc = (const bf16 *)kv->k[layer], *vc = (const bf16 *)kv->v[layer];
    if (!c->fa_slots) {
        if (D == 128 && HG == 2 && cu_flash_wg_ok()) {
            cu_flash_wg_launch(c, out, q, kv, layer, n_head, sl2, NULL, NULL);
            return;
        }
        cu_launch(c->stream, k_flash<D, false, HG>, grid, 128, smem, out, (float *)NULL, (int *)NULL, q, kc, vc, c->fa_tiles,
                  c->d_seq, c->d_pages, n_head, kv->n_head_kv, kv->page_size, sl2);
        CU_LAUNCHED();
        return;
    }
    /* split entries: a partial slot per (slot, head), a counter per (group, head) */
    const size_t slots = (size_t)c->fa_slots * n_head;
    float *part = (float *)cu_scratch(c, (void **)&c->att_part, &c->att_part_cap, slots * FA_PE(D) * 128 * sizeof(float));
    if (!part || !cu_att_cnt(c, slots)) return; /* out of device memory: cu_error reports it */
    if (D == 128 && HG == 2 && cu_flash_wg_ok()) {
        cu_flash_wg_launch(c, out, q, kv, layer, n_head, sl2, part, c->att_cnt);
        return;
    }
    cu_launch(c->stream, k_flash<D, true, HG>, grid, 128, smem, out, part, c->att_cnt, q, kc, vc, c->fa_tiles, c->d_seq,
              c->d_pages, n_head, kv->n_head_kv, kv->page_size, sl2);
    CU_LAUNCHED();
}

template <int D>
static void launch_flash_hg(struct cuda_ctx *c, bf16 *out, const bf16 *q, const struct kv_cache *kv, int layer, int n_head,
                            float sl2) {
    if (c->fa_hg_run == 2 && cu_flash_hg(n_head, kv->n_head_kv) == 2) launch_flash<D, 2>(c, out, q, kv, layer, n_head, sl2);
    else launch_flash<D, 1>(c, out, q, kv, layer, n_head, sl2);
}

/* the largest cluster the row kernel's merge may use: 16 (ATT_CL_MAX, a
 * non-portable size, allowed on Hopper) when the device takes it, else 8; 0 without
 * clusters (before sm_90, or no sm_90 code in this build) */
template <int HD, bool ROPE>
static int rows_cluster_max(void) {
    static int mx = -1;
    if (mx < 0) mx = cu_sm90_code((const void *)k_att_rows<HD, ROPE, true>) ? cu_cluster_max((const void *)k_att_rows<HD, ROPE, true>, 128, 0) : 0;
    return mx;
}

static long att_cluster_runs;
extern "C" long kiln_cuda_att_cluster_count(void);
extern "C" long kiln_cuda_att_cluster_count(void) { return att_cluster_runs; }
extern "C" int kiln_cuda_att_cluster_max(void);
extern "C" int kiln_cuda_att_cluster_max(void) { return rows_cluster_max<128, true>(); }

template <int HD, bool ROPE = false>
static void launch_rows(struct cuda_ctx *c, bf16 *out, const bf16 *q, const struct kv_cache *kv, int layer, int n_head,
                        float sl2, att_rope R = att_rope{}) {
    const int rows = c->n_tokens * n_head;
    /* about ATT_SPLIT_TOKENS keys per split, from the longest sequence; begin()
     * computed it and a graph is recorded per value, so replays stay valid */
    const int n_split = c->att_split;
    dim3 grid((unsigned)rows, (unsigned)n_split);
    const bf16 *kc = (const bf16 *)kv->k[layer], *vc = (const bf16 *)kv->v[layer];
    if (n_split > 1 && !c->no_att_cluster && n_split <= rows_cluster_max<HD, ROPE>()) {
        att_cluster_runs++;
        cu_launch_cl(c->stream, k_att_rows<HD, ROPE, true>, grid, 128, 0, dim3(1, (unsigned)n_split, 1), out, (float *)NULL, q, kc,
                     vc, c->d_row_seq, c->d_row_t, c->d_seq, c->d_pages, n_head, kv->n_head_kv, kv->page_size, sl2, n_split,
                     (int *)NULL, R);
        CU_LAUNCHED();
        return;
    }
    float *part = NULL;
    if (n_split > 1)
        part = (float *)cu_scratch(c, (void **)&c->att_part, &c->att_part_cap, (size_t)rows * n_split * (HD + 2) * sizeof(float));
    if ((n_split > 1 && !part) || !cu_att_cnt(c, (size_t)rows)) return; /* out of device memory: cu_error reports it */
    cu_launch(c->stream, k_att_rows<HD, ROPE, false>, grid, 128, 0, out, part, q, kc, vc, c->d_row_seq, c->d_row_t, c->d_seq,
              c->d_pages, n_head, kv->n_head_kv, kv->page_size, sl2, n_split, c->att_cnt, R);
    CU_LAUNCHED();
}

/* launches of the fused row kernel below, and of those the ones that read
 * before the wait (tests read them) */
static long fused_att_runs, att_pre_runs;
extern "C" long kiln_cuda_fused_att_count(void);
extern "C" long kiln_cuda_fused_att_count(void) { return fused_att_runs; }
extern "C" long kiln_cuda_att_pre_count(void);
extern "C" long kiln_cuda_att_pre_count(void) { return att_pre_runs; }

/* the held rope + KV write (cu_kv_write) done inside the row kernel, when
 * this attention reads that q and that layer's cache and takes the rows
 * kernel; 0 if not (the caller flushes them as they are) */
static int attention_fused(struct cuda_ctx *c, bf16 *out, const bf16 *q, const struct kv_cache *kv, int layer, int n_head,
                           float sl2) {
    if (!c->pkv.on || !c->prope.on || c->n_pend || c->padd.on || c->pnorm.on || q != c->prope.q || c->prope.n_head != n_head || c->prope.n_tok != c->n_tokens ||
        c->pkv.kc != (bf16 *)kv->k[layer] || c->use_flash || cu_attention_gqa_takes(c, kv, n_head) || cu_att_dec_takes(c, kv, n_head))
        return 0;
    /* reads before the wait only right after a GEMV (k_att_rows, R.pre) */
    const int pre = !c->no_att_pre && c->gemv_seq && c->gemv_seq == cu_launch_seq;
    const att_rope R = {c->prope.k, c->pkv.v, c->prope.qw, c->prope.kw, c->prope.inv_freq, c->d_pos, c->prope.af, c->prope.eps, pre};
    c->pkv.on = 0, c->prope.on = 0;
    fused_att_runs++, att_pre_runs += pre;
    switch (kv->head_dim) {
    case 64: launch_rows<64, true>(c, out, q, kv, layer, n_head, sl2, R); return 1;
    case 128: launch_rows<128, true>(c, out, q, kv, layer, n_head, sl2, R); return 1;
    case 256: launch_rows<256, true>(c, out, q, kv, layer, n_head, sl2, R); return 1;
    default: c->pkv.on = 1, c->prope.on = 1, fused_att_runs--, att_pre_runs -= pre; return 0;
    }
}

void cu_attention(struct kiln_backend *be, void *out_, const void *q_, const struct kv_cache *kv, int layer,
                  const struct kiln_batch *b, int n_head, float scale) {
    if (cu_ctx(be)->mode == CU_REPLAY) return;
    if (attention_fused(cu_ctx(be), (bf16 *)out_, (const bf16 *)q_, kv, layer, n_head, scale * 1.4426950408889634f)) return;
    CU_OP_ENTER(be);
    struct cuda_ctx *c = cu_ctx(be);
    CU_TAPE(c, SKT_ATT, out_, q_, NULL, kv, NULL, NULL, b->n_tokens, 0, layer, n_head, scale);
    bf16 *out = (bf16 *)out_;
    const bf16 *q = (const bf16 *)q_;
    const float sl2 = scale * 1.4426950408889634f;
    const int hd = kv->head_dim;
    /* for the next forward's split plan (cuda.cu cu_begin) */
    c->fa_heads = n_head, c->fa_hd = hd, c->fa_hg = cu_flash_hg(n_head, kv->n_head_kv), c->fa_nkv = kv->n_head_kv;
    if (c->use_flash && !getenv("KILN_CUDA_NO_FLASH")) {
        switch (hd) {
        case 16: launch_flash_hg<16>(c, out, q, kv, layer, n_head, sl2); return;
        case 32: launch_flash_hg<32>(c, out, q, kv, layer, n_head, sl2); return;
        case 64: launch_flash_hg<64>(c, out, q, kv, layer, n_head, sl2); return;
        case 128: launch_flash_hg<128>(c, out, q, kv, layer, n_head, sl2); return;
        default: break;
        }
    }
    if (cu_attention_dec(c, out, q, kv, layer, n_head, sl2)) return; /* attn_dec.cu: a long context, streamed */
    if (cu_attention_gqa(c, out, q, kv, layer, n_head, sl2)) return; /* attn_gqa.cu: the KV group's heads together */
    switch (hd) {
    case 16: launch_rows<16>(c, out, q, kv, layer, n_head, sl2); return;
    case 32: launch_rows<32>(c, out, q, kv, layer, n_head, sl2); return;
    case 64: launch_rows<64>(c, out, q, kv, layer, n_head, sl2); return;
    case 128: launch_rows<128>(c, out, q, kv, layer, n_head, sl2); return;
    case 256: launch_rows<256>(c, out, q, kv, layer, n_head, sl2); return;
    default: /* cu_check_model refuses such a model at load: reaching this is a bug */
        fprintf(stderr, "kiln: cuda: attention at head_dim %d (a bug: the load-time check refuses it)\n", hd);
        abort();
    }
}
