/*
 * rope.cu: per-head RMSNorm of q and k (Qwen3's q_norm/k_norm, optional)
 * fused with the rotary embedding, in place.
 *
 * Decomposition: one warp per (token, head) over the n_head query heads and
 * then the n_head_kv key heads; lane l owns the rotation pairs (i, i + half)
 * for i = l, l+32, ... (head_dim <= 512). The norm's sum of squares is a warp
 * sum; everything is f32 and rounded to bf16 once. Angles use the accurate
 * sincosf: positions reach tens of thousands of radians.
 */
#include "backend/cuda/cuda.cuh"

#define ROPE_MAX_PAIRS 8 /* per lane: head_dim / 2 / 32 */

__global__ void __launch_bounds__(256) k_qk_norm_rope(bf16 *q, bf16 *k, const float *__restrict__ qw, const float *__restrict__ kw,
                                                      const float *__restrict__ inv_freq, float af, const int *__restrict__ pos,
                                                      int n_tok, int n_head, int n_head_kv, int hd, float eps) {
    pdl_wait();
    const int gw = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int nh = n_head + n_head_kv;
    if (gw >= n_tok * nh) return;
    const int t = gw / nh, h = gw % nh, half = hd / 2;
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
    const float p = (float)pos[t];
#pragma unroll
    for (int j = 0; j < ROPE_MAX_PAIRS; j++) {
        int i = lane + 32 * j;
        if (i >= half) break;
        float x0 = a[j], x1 = b[j];
        if (nw) x0 = nw[i] * (x0 * r), x1 = nw[i + half] * (x1 * r);
        float s, c;
        sincosf(p * inv_freq[i], &s, &c);
        c *= af, s *= af;
        v[i] = __float2bfloat16(x0 * c - x1 * s);
        v[i + half] = __float2bfloat16(x1 * c + x0 * s);
    }
}

void cu_qk_norm_rope(struct kiln_backend *be, void *q, void *k, const struct ktensor *qn, const struct ktensor *kn,
                     const struct rope *rope, const struct kiln_batch *b, int n_head, int n_head_kv, int head_dim,
                     float eps) {
    CU_OP_ENTER(be);
    struct cuda_ctx *c = cu_ctx(be);
    if (head_dim / 2 > 32 * ROPE_MAX_PAIRS) {
        fprintf(stderr, "kiln: cuda: head_dim %d > %d is not supported\n", head_dim, 64 * ROPE_MAX_PAIRS);
        abort();
    }
    int warps = b->n_tokens * (n_head + n_head_kv);
    cu_launch(c->stream, k_qk_norm_rope, (warps + 7) / 8, 256, 0, (bf16 *)q, (bf16 *)k, qn ? (const float *)qn->be : NULL,
                                                           kn ? (const float *)kn->be : NULL, (const float *)rope->be,
                                                           rope->attn_factor, c->d_pos, b->n_tokens, n_head, n_head_kv,
                                                           head_dim, eps);
    CU_LAUNCHED();
}
