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
#include <string.h>

#include "backend/cuda/cuda.cuh"

#define ROPE_MAX_PAIRS 8 /* per lane: head_dim / 2 / 32 */

__global__ void __launch_bounds__(256) k_qk_norm_rope(bf16 *q, bf16 *k, const float *__restrict__ qw, const float *__restrict__ kw,
                                                      const float *__restrict__ inv_freq, float af, const int *__restrict__ pos,
                                                      int n_tok, int n_head, int n_head_kv, int hd, float eps, bf16 *kc, bf16 *vc,
                                                      const bf16 *__restrict__ vsrc, const int *__restrict__ row_seq,
                                                      const int *__restrict__ row_t, const int *__restrict__ seq,
                                                      const int *__restrict__ pages, int P) {
    KTRACE();
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

/*
 * k_qk_norm_rope_v: the same op for head_dim = 8 * G (64, 128, 256), with
 * 16-byte accesses. Decomposition: a block of 256 threads per (token, run of
 * 256 * ROPE_V_R head slots; ROPE_V_R is 4 for prefill, 1 for a few tokens,
 * where more blocks finish sooner); a head is G consecutive lanes of one warp,
 * lane li holding elements [8 li, 8 li + 8), so element i of the first half
 * and its rotation partner i + hd/2 sit in lanes li and li ^ G/2. Each
 * thread loads its ROPE_V_R slots before computing any (the loads are the
 * cost: one round trip per block instead of one per 2-byte element), and
 * every lane of a warp runs the same shuffles whatever its head is (q, k,
 * v or past the end); the head's kind only decides what is stored. Same
 * arithmetic as k_qk_norm_rope per element: x * r times the weight, then
 * the rotation, rounded to bf16 once; only the sum of squares is added in
 * another order. With qi the heads are read from row t of the prefill's one
 * q/k/v GEMM (q | k | v, ld columns; gemm.cu cu_matmul_multi) and written
 * to q, k and vo, where they would have been; without, q and k in place
 * and v (for the cache) from vsrc.
 */
template <int G, int ROPE_V_R>
__global__ void __launch_bounds__(256) k_qk_norm_rope_v(bf16 *q, bf16 *k, const float *__restrict__ qw, const float *__restrict__ kw,
                                                        const float *__restrict__ inv_freq, float af, const int *__restrict__ pos,
                                                        int n_head, int n_head_kv, float eps, bf16 *kc, bf16 *vc,
                                                        const bf16 *__restrict__ vsrc, const int *__restrict__ row_seq,
                                                        const int *__restrict__ row_t, const int *__restrict__ seq,
                                                        const int *__restrict__ pages, int P, const bf16 *__restrict__ qi, int ld,
                                                        bf16 *vo, const struct cu_qkv_bias B) {
    KTRACE();
    constexpr int HD = 8 * G, HALF = HD / 2;
    pdl_wait();
    __shared__ float cs[2][HALF];
    const int t = blockIdx.x, li = threadIdx.x % G, nh = n_head + n_head_kv + (kc || vo ? n_head_kv : 0);
    const float p = (float)pos[t];
    for (int i = threadIdx.x; i < HALF; i += blockDim.x) {
        float sn, cn;
        sincosf(p * inv_freq[i], &sn, &cn);
        cs[0][i] = cn * af, cs[1][i] = sn * af;
    }
    size_t crow = 0; /* token t's slot in its page, kv head 0 */
    if (kc) {
        const int s = row_seq[t], tt = row_t[t];
        crow = ((size_t)pages[seq[4 * s + 3] + tt / P] * n_head_kv * P + tt % P) * HD;
    }
    uint4 w[ROPE_V_R];
    bf16 *dst[ROPE_V_R]; /* the head's row in q, k or vo (v: NULL without vo) */
#pragma unroll
    for (int r = 0; r < ROPE_V_R; r++) {
        const int h = (blockIdx.y * ROPE_V_R + r) * (256 / G) + threadIdx.x / G;
        dst[r] = h < n_head               ? q + ((size_t)t * n_head + h) * HD
                 : h < n_head + n_head_kv ? k + ((size_t)t * n_head_kv + (h - n_head)) * HD
                 : h < nh && vo           ? vo + ((size_t)t * n_head_kv + (h - n_head - n_head_kv)) * HD
                                          : NULL;
        /* the input: in place, v from vsrc; or row t of the q | k | v GEMM output */
        const bf16 *src = h >= nh ? NULL
                          : qi    ? qi + (size_t)t * ld + (size_t)h * HD
                          : h < n_head + n_head_kv ? dst[r]
                                                   : vsrc + ((size_t)t * n_head_kv + (h - n_head - n_head_kv)) * HD;
        w[r] = src ? ((const uint4 *)src)[li] : make_uint4(0, 0, 0, 0);
        /* the GEMM output's bias (Qwen2), rounded as k_bias rounds it */
        const int j = h < n_head ? 0 : h < n_head + n_head_kv ? 1 : 2;
        const float *bj = j == 0 ? B.b[0] : j == 1 ? B.b[1] : B.b[2];
        if (qi && src && bj) {
            bf16 *e = (bf16 *)&w[r];
            const float *b = bj + (size_t)(h - (j > 0) * n_head - (j > 1) * n_head_kv) * HD + 8 * li;
#pragma unroll
            for (int u = 0; u < 8; u++) e[u] = __float2bfloat16(__bfloat162float(e[u]) + b[u]);
        }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < ROPE_V_R; r++) {
        const int h = (blockIdx.y * ROPE_V_R + r) * (256 / G) + threadIdx.x / G;
        const float *nw = h < n_head ? qw : h < n_head + n_head_kv ? kw : NULL;
        const bf16 *wv = (const bf16 *)&w[r];
        float x[8], ss = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) x[e] = __bfloat162float(wv[e]), ss += x[e] * x[e];
#pragma unroll
        for (int o = G / 2; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (nw) {
            const float rr = rsqrtf(ss / HD + eps);
#pragma unroll
            for (int e = 0; e < 8; e++) x[e] = nw[8 * li + e] * (x[e] * rr);
        }
        const bool first = li < G / 2;
        uint4 out;
        bf16 *ov = (bf16 *)&out;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float y = __shfl_xor_sync(0xffffffffu, x[e], G / 2);
            const int i = 8 * (li % (G / 2)) + e;
            const float c = cs[0][i], s = cs[1][i];
            ov[e] = __float2bfloat16(first ? x[e] * c - y * s : x[e] * c + y * s);
        }
        if (h >= nh) continue;
        if (dst[r]) ((uint4 *)dst[r])[li] = h < n_head + n_head_kv ? out : w[r];
        if (!kc || h < n_head) continue;
        const int hk = (h - n_head) % n_head_kv;
        bf16 *cd = (h < n_head + n_head_kv ? kc : vc) + crow + (size_t)hk * P * HD;
        ((uint4 *)cd)[li] = h < n_head + n_head_kv ? out : w[r];
    }
}

/* the 16-byte kernel takes this head size (KILN_CUDA_ROPE_V=0: the per-element kernel always) */
static int rope_v_takes(int hd) {
    const char *e = getenv("KILN_CUDA_ROPE_V");
    return (hd == 64 || hd == 128 || hd == 256) && !(e && !strcmp(e, "0"));
}

/* launches the pending rope (cuda.cuh prope), with the KV write fused in when kc */
void cu_rope_launch(struct cuda_ctx *c, bf16 *kc, bf16 *vc, const bf16 *v, int P) {
    c->prope.on = 0;
    /* on the q/k/v GEMM's output: v comes from there too, and goes to its
     * buffer as well as (kc) to the cache */
    const bf16 *qi = c->prope.qi;
    bf16 *vo = NULL;
    struct cu_qkv_bias B = {};
    c->prope.qi = NULL;
    if (qi) {
        c->pqkv.on = 0;
        vo = c->pqkv.out[2], B = c->pqkv.bias;
        v = qi + c->pqkv.n_out[0] + c->pqkv.n_out[1];
    }
    const int nh = c->prope.n_head + c->prope.n_head_kv + (kc || vo ? c->prope.n_head_kv : 0), hd = c->prope.hd;
    if (rope_v_takes(hd)) {
        const int G = hd / 8, R = c->prope.n_tok > 64 ? 4 : 1, per_block = 256 / G * R;
        const dim3 grid((unsigned)c->prope.n_tok, (unsigned)((nh + per_block - 1) / per_block));
        auto k = hd == 64    ? (R == 4 ? k_qk_norm_rope_v<8, 4> : k_qk_norm_rope_v<8, 1>)
                 : hd == 128 ? (R == 4 ? k_qk_norm_rope_v<16, 4> : k_qk_norm_rope_v<16, 1>)
                             : (R == 4 ? k_qk_norm_rope_v<32, 4> : k_qk_norm_rope_v<32, 1>);
        cu_launch(c->stream, k, grid, 256, 0, c->prope.q, c->prope.k, c->prope.qw, c->prope.kw, c->prope.inv_freq, c->prope.af,
                  c->d_pos, c->prope.n_head, c->prope.n_head_kv, c->prope.eps, kc, vc, v, c->d_row_seq, c->d_row_t, c->d_seq,
                  c->d_pages, P, qi, c->prope.ld, vo, B);
        CU_LAUNCHED();
        return;
    }
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
    struct cuda_ctx *c = cu_ctx(be);
    /* q and k still in the held q/k/v GEMM's output: read them there (the
     * kernel writes them to q and k, and v to its buffer) */
    const int merged = c->pqkv.on && q == c->pqkv.out[0] && k == c->pqkv.out[1] && c->pqkv.n == b->n_tokens &&
                       c->pqkv.n_out[0] == n_head * head_dim && c->pqkv.n_out[1] == n_head_kv * head_dim &&
                       c->pqkv.n_out[2] == c->pqkv.n_out[1] && rope_v_takes(head_dim);
    if (merged) c->pqkv.on = 0; /* not split by the flush */
    CU_OP_ENTER(be);
    if (merged) c->pqkv.on = 1;
    CU_TAPE(c, SKT_ROPE, q, k, NULL, qn, kn, rope, b->n_tokens, head_dim, n_head, n_head_kv, eps);
    if (head_dim / 2 > 32 * ROPE_MAX_PAIRS) {
        fprintf(stderr, "kiln: cuda: head_dim %d > %d is not supported\n", head_dim, 64 * ROPE_MAX_PAIRS);
        abort();
    }
    c->prope.q = (bf16 *)q, c->prope.k = (bf16 *)k, c->prope.qw = qn ? (const float *)qn->be : NULL;
    c->prope.kw = kn ? (const float *)kn->be : NULL, c->prope.inv_freq = (const float *)rope->be, c->prope.af = rope->attn_factor;
    c->prope.n_tok = b->n_tokens, c->prope.n_head = n_head, c->prope.n_head_kv = n_head_kv, c->prope.hd = head_dim;
    c->prope.eps = eps;
    c->prope.qi = merged ? c->pqkv.s : NULL, c->prope.ld = c->pqkv.ld;
    c->prope.on = 1;
    if (c->no_fuse) cu_rope_launch(c, NULL, NULL, NULL, 0);
}
