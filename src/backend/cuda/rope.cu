/*
 * rope.cu: per-head RMSNorm of q and k (Qwen3's q_norm/k_norm, optional)
 * fused with the rotary embedding, in place.
 *
 * Decomposition: a block of 8 warps per (token, group of 8 heads), over the
 * n_head query heads, then the n_head_kv key heads (then, with the KV write
 * fused in, the value heads, copied); warp w takes head 8 * group + w, and
 * lane l owns the rotation pairs (i, i + half) for i = l, l+32, ...
 * (head_dim <= 512). The token's cos/sin are computed once per block into
 * shared memory (a thread per pair) rather than once per head. The norm's
 * sum of squares is a warp sum; everything is f32 and rounded to bf16 once.
 * Angles use the accurate sincosf: positions reach tens of thousands of
 * radians.
 */
#include "backend/cuda/cuda.cuh"

#define ROPE_MAX_PAIRS 8 /* per lane: head_dim / 2 / 32 */

__global__ void __launch_bounds__(256) k_qk_norm_rope(bf16 *q, bf16 *k, const float *__restrict__ qw, const float *__restrict__ kw,
                                                      const float *__restrict__ inv_freq, float af, const int *__restrict__ pos,
                                                      int n_tok, int n_head, int n_head_kv, int hd, float eps, bf16 *kc, bf16 *vc,
                                                      const bf16 *__restrict__ vsrc, const int *__restrict__ row_seq,
                                                      const int *__restrict__ row_t, const int *__restrict__ seq,
                                                      const int *__restrict__ pages, int P) {
    pdl_wait();
    __shared__ float cs[2][32 * ROPE_MAX_PAIRS];
    const int lane = threadIdx.x & 31, t = blockIdx.x, h = blockIdx.y * 8 + (threadIdx.x >> 5), half = hd / 2;
    const int nh = n_head + n_head_kv + (kc ? n_head_kv : 0);
    const float p = (float)pos[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float sn, cn;
        sincosf(p * inv_freq[i], &sn, &cn);
        cs[0][i] = cn * af, cs[1][i] = sn * af;
    }
    __syncthreads();
    if (h >= nh) return;
    /* fused KV write: the cache row of token t, kv head hk */
    size_t cbase = 0;
    if (kc && h >= n_head) {
        const int hk = (h - n_head) % n_head_kv, s = row_seq[t], tt = row_t[t];
        cbase = (((size_t)pages[seq[4 * s + 3] + tt / P] * n_head_kv + hk) * P + tt % P) * hd;
        if (h >= n_head + n_head_kv) { /* a v head: copy (hd % 8 == 0) */
            const uint4 *src = (const uint4 *)(vsrc + ((size_t)t * n_head_kv + hk) * hd);
            for (int i = lane; i < hd / 8; i += 32) ((uint4 *)(vc + cbase))[i] = src[i];
            return;
        }
    }
    bf16 *v = h < n_head ? q + ((size_t)t * n_head + h) * hd : k + ((size_t)t * n_head_kv + (h - n_head)) * hd;
    const float *nw = h < n_head ? qw : kw;
    float a[ROPE_MAX_PAIRS], b[ROPE_MAX_PAIRS], ss = 0.f;
#pragma unroll
    for (int j = 0; j < ROPE_MAX_PAIRS; j++) {
        int i = lane + 32 * j;
        a[j] = b[j] = 0.f;
        if (i < half) a[j] = __bfloat162float(v[i]), b[j] = __bfloat162float(v[i + half]);
        ss += a[j] * a[j] + b[j] * b[j];
    }
    float r = 1.f;
    if (nw) {
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        r = rsqrtf(ss / hd + eps);
    }
#pragma unroll
    for (int j = 0; j < ROPE_MAX_PAIRS; j++) {
        int i = lane + 32 * j;
        if (i >= half) break;
        float x0 = a[j], x1 = b[j];
        if (nw) x0 = nw[i] * (x0 * r), x1 = nw[i + half] * (x1 * r);
        const float c = cs[0][i], s = cs[1][i];
        const bf16 r0 = __float2bfloat16(x0 * c - x1 * s), r1 = __float2bfloat16(x1 * c + x0 * s);
        v[i] = r0, v[i + half] = r1;
        if (kc && h >= n_head) kc[cbase + i] = r0, kc[cbase + i + half] = r1;
    }
}

/* launches the pending rope (cuda.cuh prope), with the KV write fused in when kc */
void cu_rope_launch(struct cuda_ctx *c, bf16 *kc, bf16 *vc, const bf16 *v, int P) {
    c->prope.on = 0;
    const int nh = c->prope.n_head + c->prope.n_head_kv + (kc ? c->prope.n_head_kv : 0);
    cu_launch(c->stream, k_qk_norm_rope, dim3((unsigned)c->prope.n_tok, (unsigned)((nh + 7) / 8)), 256, 0, c->prope.q, c->prope.k, c->prope.qw, c->prope.kw,
              c->prope.inv_freq, c->prope.af, c->d_pos, c->prope.n_tok, c->prope.n_head, c->prope.n_head_kv, c->prope.hd,
              c->prope.eps, kc, vc, v, c->d_row_seq, c->d_row_t, c->d_seq, c->d_pages, P);
    CU_LAUNCHED();
}

/* held back (decode) so that the KV write right after can be fused into it
 * (attention.cu cu_kv_write); any other next op launches it as it is */
void cu_qk_norm_rope(struct kiln_backend *be, void *q, void *k, const struct ktensor *qn, const struct ktensor *kn,
                     const struct rope *rope, const struct kiln_batch *b, int n_head, int n_head_kv, int head_dim,
                     float eps) {
    CU_OP_ENTER(be);
    struct cuda_ctx *c = cu_ctx(be);
    CU_TAPE(c, SKT_ROPE, q, k, NULL, qn, kn, rope, b->n_tokens, head_dim, n_head, n_head_kv, eps);
    if (head_dim / 2 > 32 * ROPE_MAX_PAIRS) {
        fprintf(stderr, "kiln: cuda: head_dim %d > %d is not supported\n", head_dim, 64 * ROPE_MAX_PAIRS);
        abort();
    }
    c->prope.q = (bf16 *)q, c->prope.k = (bf16 *)k, c->prope.qw = qn ? (const float *)qn->be : NULL;
    c->prope.kw = kn ? (const float *)kn->be : NULL, c->prope.inv_freq = (const float *)rope->be, c->prope.af = rope->attn_factor;
    c->prope.n_tok = b->n_tokens, c->prope.n_head = n_head, c->prope.n_head_kv = n_head_kv, c->prope.hd = head_dim;
    c->prope.eps = eps;
    c->prope.on = 1;
    if (c->no_fuse || b->n_tokens > 8) cu_rope_launch(c, NULL, NULL, NULL, 0);
}
