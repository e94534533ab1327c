/*
 * misc.cu: the small elementwise ops: embedding lookup, SwiGLU, residual
 * add, row gather. All bf16 in and out, f32 arithmetic.
 * Decomposition: embed and gather give one block per row (16-byte copies);
 * swiglu and add give one thread per 8 elements (16-byte loads) when the
 * size allows, else one per element.
 */
#include "backend/cuda/cuda.cuh"

/* k_copy_rows: out[i] = src[idx[i]] (rows of `dim` bf16; idx from the device) */
__global__ void k_copy_rows(bf16 *__restrict__ out, const bf16 *__restrict__ src, const int *__restrict__ idx, int dim) {
    KTRACE();
    pdl_wait();
    const int i = blockIdx.x;
    const bf16 *s = src + (size_t)idx[i] * dim;
    bf16 *o = out + (size_t)i * dim;
    if (dim % 8 == 0) {
        for (int c = threadIdx.x; c < dim / 8; c += blockDim.x) ((uint4 *)o)[c] = ((const uint4 *)s)[c];
    } else {
        for (int c = threadIdx.x; c < dim; c += blockDim.x) o[c] = s[c];
    }
}

void cu_embed(struct kiln_backend *be, void *x, const struct ktensor *table, const struct kiln_batch *b) {
    CU_OP_ENTER(be);
    struct cuda_ctx *c = cu_ctx(be);
    CU_TAPE(c, SKT_EMBED, x, NULL, NULL, table, NULL, NULL, b->n_tokens, (int)table->cols, 0, 0, 0.f);
    cu_launch(c->stream, k_copy_rows, b->n_tokens, 128, 0, (bf16 *)x, (const bf16 *)table->be, c->d_tokens, (int)table->cols);
    CU_LAUNCHED();
}

/* gather_rows may run in place (out == x) only for rows[i] >= i, which the
 * model guarantees (out_rows ascend); the copy goes through a scratch row
 * block to be safe for any order. */
void cu_gather_rows(struct kiln_backend *be, void *out, const void *x, const int32_t *rows, int n_rows, int dim) {
    CU_OP_ENTER(be);
    struct cuda_ctx *c = cu_ctx(be);
    CU_TAPE(c, SKT_GATHER, out, x, NULL, rows, NULL, NULL, n_rows, dim, 0, 0, 0.f);
    const int *d_rows = c->d_out_rows;
    if (rows != c->out_rows_host || n_rows != c->n_out) { /* not the batch's rows: upload (never in a graph) */
        int *tmp = (int *)cu_scratch(c, &c->moe_buf, &c->moe_buf_cap, (size_t)n_rows * 4);
        if (!tmp) return; /* out of device memory: cu_error reports it */
        /* no row list on the device: no copy (the batch fails, cu_error) */
        if (CUDA_FAILED(cudaMemcpyAsync(tmp, rows, (size_t)n_rows * 4, cudaMemcpyHostToDevice, c->stream)) ||
            CUDA_FAILED(cudaStreamSynchronize(c->stream)))
            return;
        d_rows = tmp;
    }
    if (out == x) {
        /* in place: rows ascend and rows[i] >= i, so copying in order is safe
         * only sequentially; do it through f32buf-sized scratch instead */
        bf16 *tmp = (bf16 *)cu_scratch(c, (void **)&c->f32buf, &c->f32buf_cap, (size_t)n_rows * dim * 2);
        if (!tmp) return; /* out of device memory: cu_error reports it */
        cu_launch(c->stream, k_copy_rows, n_rows, 128, 0, tmp, (const bf16 *)x, d_rows, dim);
        CUDA_CHECK(cudaMemcpyAsync(out, tmp, (size_t)n_rows * dim * 2, cudaMemcpyDeviceToDevice, c->stream));
    } else {
        cu_launch(c->stream, k_copy_rows, n_rows, 128, 0, (bf16 *)out, (const bf16 *)x, d_rows, dim);
    }
    CU_LAUNCHED();
}

/* k_swiglu8: out = silu(g) * u over 8-element chunks */
__global__ void k_swiglu8(bf16 *out, const bf16 *g, const bf16 *u, size_t n8) {
    KTRACE();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    ((uint4 *)out)[i] = swiglu_chunk8(((const uint4 *)g)[i], ((const uint4 *)u)[i]);
}

__global__ void k_swiglu1(bf16 *out, const bf16 *g, const bf16 *u, size_t n) {
    KTRACE();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = __bfloat162float(g[i]);
    out[i] = __float2bfloat16(silu(a) * __bfloat162float(u[i]));
}

void cu_swiglu_raw(struct cuda_ctx *c, bf16 *out, const bf16 *g, const bf16 *u, size_t n) {
    if (n % 8 == 0) cu_launch(c->stream, k_swiglu8, (unsigned)((n / 8 + 255) / 256), 256, 0, out, g, u, n / 8);
    else cu_launch(c->stream, k_swiglu1, (unsigned)((n + 255) / 256), 256, 0, out, g, u, n);
    CU_LAUNCHED();
}

void cu_swiglu(struct kiln_backend *be, void *out, const void *gate, const void *up, int n, int ffn) {
    CU_SKIP_IF_REPLAY(be);
    CU_TAPE(cu_ctx(be), SKT_SWIGLU, out, gate, up, NULL, NULL, NULL, n, ffn, 0, 0, 0.f);
    if (cu_swiglu_fused(cu_ctx(be), out, gate, up, n, ffn)) return;
    cu_flush(cu_ctx(be));
    cu_swiglu_raw(cu_ctx(be), (bf16 *)out, (const bf16 *)gate, (const bf16 *)up, (size_t)n * ffn);
}

__global__ void k_add8(bf16 *x, const bf16 *y, size_t n8) {
    KTRACE();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    uint4 xv = ((const uint4 *)x)[i], yv = ((const uint4 *)y)[i];
    __nv_bfloat162 *xh = (__nv_bfloat162 *)&xv;
    const __nv_bfloat162 *yh = (const __nv_bfloat162 *)&yv;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float2 a = __bfloat1622float2(xh[j]), b = __bfloat1622float2(yh[j]);
        xh[j] = __floats2bfloat162_rn(a.x + b.x, a.y + b.y);
    }
    ((uint4 *)x)[i] = xv;
}

__global__ void k_add1(bf16 *x, const bf16 *y, size_t n) {
    KTRACE();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(y[i]));
}

void cu_add_launch(struct cuda_ctx *c, bf16 *x, const bf16 *y, size_t n) {
    if (n % 8 == 0) cu_launch(c->stream, k_add8, (unsigned)((n / 8 + 255) / 256), 256, 0, x, y, n / 8);
    else cu_launch(c->stream, k_add1, (unsigned)((n + 255) / 256), 256, 0, x, y, n);
    CU_LAUNCHED();
}

/* a decode-sized add is held back: an RMSNorm of x right after takes it in
 * (norm.cu), any other op launches it (cu_flush) */
void cu_add(struct kiln_backend *be, void *x, const void *y, size_t n) {
    CU_OP_ENTER(be);
    struct cuda_ctx *c = cu_ctx(be);
    CU_TAPE(c, SKT_ADD, x, NULL, y, NULL, NULL, NULL, (int)n, 0, 0, 0, 0.f);
    if (!c->no_fuse && !c->no_fuse_norm && !c->no_defer && c->n_tokens <= 8 && n % 8 == 0 && !((uintptr_t)x & 15) && !((uintptr_t)y & 15)) {
        c->padd.on = 1, c->padd.x = (bf16 *)x, c->padd.y = (const bf16 *)y, c->padd.n = n;
        return;
    }
    cu_add_launch(c, (bf16 *)x, (const bf16 *)y, n);
}
