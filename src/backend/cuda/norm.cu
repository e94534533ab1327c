/*
 * norm.cu: RMSNorm, and RMSNorm fused with the residual add before it.
 *
 * Statistics in f32 over the bf16 row (the residual is rounded to bf16 before
 * it is normalised, as transformers does in bf16). Output bf16.
 * Decomposition: one block of 256 threads per row; thread t owns the same
 * 8-element chunks (t, t+256, ...) in both passes, so `out` may alias `x`
 * (rmsnorm) or `y` (add_rmsnorm): every element is read and written by the
 * one thread that owns it, and the block-wide sum sits between the passes.
 */
#include "backend/cuda/cuda.cuh"

/* k_add_rmsnorm: x += y (when y), then out = x / rms(x) * w; see the header */
__global__ void __launch_bounds__(256) k_add_rmsnorm(bf16 *x, bf16 *out, const bf16 *y, const float *__restrict__ w, int dim,
                                                     float eps) {
    KTRACE();
    pdl_wait();
    bf16 *xr = x + (size_t)blockIdx.x * dim, *orow = out + (size_t)blockIdx.x * dim;
    const bf16 *yr = y ? y + (size_t)blockIdx.x * dim : NULL;
    float ss = 0.f;
    if (dim % 8 == 0) {
        for (int c = threadIdx.x * 8; c < dim; c += 256 * 8) {
            float a[8];
            cu_load8(a, xr + c);
            if (yr) {
                float b[8];
                cu_load8(b, yr + c);
                for (int i = 0; i < 8; i++) a[i] = __bfloat162float(__float2bfloat16(a[i] + b[i]));
                cu_store8(xr + c, a);
            }
            for (int i = 0; i < 8; i++) ss += a[i] * a[i];
        }
        const float r = rsqrtf(cu_block_sum(ss) / dim + eps);
        for (int c = threadIdx.x * 8; c < dim; c += 256 * 8) {
            float a[8];
            cu_load8(a, xr + c);
            for (int i = 0; i < 8; i++) a[i] = w[c + i] * (a[i] * r);
            cu_store8(orow + c, a);
        }
        return;
    }
    for (int i = threadIdx.x; i < dim; i += 256) {
        float a = __bfloat162float(xr[i]);
        if (yr) {
            bf16 s = __float2bfloat16(a + __bfloat162float(yr[i]));
            xr[i] = s;
            a = __bfloat162float(s);
        }
        ss += a * a;
    }
    const float r = rsqrtf(cu_block_sum(ss) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += 256) orow[i] = __float2bfloat16(w[i] * (__bfloat162float(xr[i]) * r));
}

/*
 * k_add_rmsnorm_r: the same for dim <= CH * 2048, dim % 8 == 0, with the
 * same chunk ownership and order of sums (so the same bits), for the
 * critical path of a decode step, where the norm sits between two GEMVs:
 * the weights (never written by a kernel) are read before the wait, and the
 * row stays in registers between the passes, so after the wait there is one
 * round trip to memory (x and y) where k_add_rmsnorm has two (x and y, then
 * x again and w).
 */
template <int CH>
__global__ void __launch_bounds__(256) k_add_rmsnorm_r(bf16 *x, bf16 *out, const bf16 *y, const float *__restrict__ w, int dim,
                                                       float eps) {
    KTRACE();
    float wv[CH][8], a[CH][8];
#pragma unroll
    for (int k = 0; k < CH; k++) {
        const int c = (threadIdx.x + 256 * k) * 8;
        if (c < dim)
#pragma unroll
            for (int i = 0; i < 8; i++) wv[k][i] = w[c + i];
    }
    pdl_wait();
    bf16 *xr = x + (size_t)blockIdx.x * dim, *orow = out + (size_t)blockIdx.x * dim;
    const bf16 *yr = y ? y + (size_t)blockIdx.x * dim : NULL;
#pragma unroll
    for (int k = 0; k < CH; k++) {
        const int c = (threadIdx.x + 256 * k) * 8;
        if (c < dim) {
            cu_load8(a[k], xr + c);
            if (yr) {
                float b[8];
                cu_load8(b, yr + c);
#pragma unroll
                for (int i = 0; i < 8; i++) a[k][i] = __bfloat162float(__float2bfloat16(a[k][i] + b[i]));
            }
        }
    }
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < CH; k++) {
        const int c = (threadIdx.x + 256 * k) * 8;
        if (c < dim) {
            if (yr) cu_store8(xr + c, a[k]);
#pragma unroll
            for (int i = 0; i < 8; i++) ss += a[k][i] * a[k][i];
        }
    }
    const float r = rsqrtf(cu_block_sum(ss) / dim + eps);
#pragma unroll
    for (int k = 0; k < CH; k++) {
        const int c = (threadIdx.x + 256 * k) * 8;
        if (c < dim) {
#pragma unroll
            for (int i = 0; i < 8; i++) a[k][i] = wv[k][i] * (a[k][i] * r);
            cu_store8(orow + c, a[k]);
        }
    }
}

void cu_norm_launch(struct cuda_ctx *c, bf16 *x, bf16 *out, const bf16 *y, const float *w, int n, int dim, float eps) {
    const int ch = (dim + 2047) / 2048;
    if (dim % 8 || ch > 4 || c->no_norm_r) cu_launch(c->stream, k_add_rmsnorm, n, 256, 0, x, out, y, w, dim, eps);
    else if (ch == 1) cu_launch(c->stream, k_add_rmsnorm_r<1>, n, 256, 0, x, out, y, w, dim, eps);
    else if (ch == 2) cu_launch(c->stream, k_add_rmsnorm_r<2>, n, 256, 0, x, out, y, w, dim, eps);
    else if (ch == 3) cu_launch(c->stream, k_add_rmsnorm_r<3>, n, 256, 0, x, out, y, w, dim, eps);
    else cu_launch(c->stream, k_add_rmsnorm_r<4>, n, 256, 0, x, out, y, w, dim, eps);
    CU_LAUNCHED();
}

/* a decode-sized norm is held back to be folded into the GEMV that reads it
 * (gemm.cu); any other next op launches it as it is (cu_flush) */
static void norm_op(struct cuda_ctx *c, bf16 *x, bf16 *out, const bf16 *y, const float *w, int n, int dim, float eps) {
    if (!c->no_fuse && !c->no_fuse_norm && !c->no_defer && n <= 8 && dim % 8 == 0 && (size_t)n * dim * 2 <= 48 * 1024 && !((uintptr_t)x & 15) &&
        !((uintptr_t)out & 15) && !((uintptr_t)y & 15)) {
        c->pnorm.on = 1, c->pnorm.x = x, c->pnorm.out = out, c->pnorm.y = y, c->pnorm.w = w;
        c->pnorm.n = n, c->pnorm.dim = dim, c->pnorm.eps = eps;
        return;
    }
    cu_norm_launch(c, x, out, y, w, n, dim, eps);
}

void cu_rmsnorm(struct kiln_backend *be, void *out, const void *x, const struct ktensor *w, int n, int dim, float eps) {
    CU_SKIP_IF_REPLAY(be);
    struct cuda_ctx *c = cu_ctx(be);
    CU_TAPE(c, SKT_NORM, out, x, NULL, w, NULL, NULL, n, dim, 0, 0, eps);
    /* a residual add just before, into this norm's input: x += y, out = norm(x) in one */
    const bf16 *y = NULL;
    if (c->padd.on && c->padd.x == x && c->padd.n == (size_t)n * dim && out != c->padd.x) {
        y = c->padd.y;
        c->padd.on = 0;
    }
    cu_flush(c);
    norm_op(c, (bf16 *)x, (bf16 *)out, y, (const float *)w->be, n, dim, eps);
}

void cu_add_rmsnorm(struct kiln_backend *be, void *x, void *out, const void *y, const struct ktensor *w, int n, int dim,
                    float eps) {
    struct cuda_ctx *c = cu_ctx(be);
    if (c->mode == CU_REPLAY) return;
    /* y is the held GEMM's output and nothing reads it after (out == y):
     * the GEMM adds into x itself, and the norm is only a norm. x must not
     * be the GEMM's input (it is written while read) */
    if (c->pgemm.on && c->pgemm.out == y && out == y && c->pgemm.n == n && c->pgemm.n_out == dim && c->pgemm.x != x) {
        cu_pgemm_launch(c, (bf16 *)x);
        y = NULL;
    }
    CU_OP_ENTER(be);
    CU_TAPE(c, SKT_ADDNORM, x, out, y, w, NULL, NULL, n, dim, 0, 0, eps);
    norm_op(c, (bf16 *)x, (bf16 *)out, (const bf16 *)y, (const float *)w->be, n, dim, eps);
}
