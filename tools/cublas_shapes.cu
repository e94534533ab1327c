/*
 * cublas_shapes.cu: times Qwen3-8B's prefill GEMM shapes through cuBLAS at
 * 8,192 / 2,048 / 1,024 / 512 / 256 / 128 rows on random bf16 data (constant data draws
 * less power and runs faster on a power-bound card): gate/up as two calls,
 * one wide call (fused weights), a strided batch and a pointer batch; down;
 * q/k/v as three calls, one wide call, q + a strided k/v batch, and a
 * grouped batch; o. Used for docs/cuda.md "Prefill at 8,192 tokens".
 *
 *   nvcc -O2 -std=c++20 -arch=sm_90a -o /tmp/cublas_shapes tools/cublas_shapes.cu -lcublas && /tmp/cublas_shapes
 */
#include <cstdio>
#include <cublas_v2.h>

#include "gpu_bench.cuh"

int main() {
    cublasHandle_t h; cublasCreate(&h);
    const float one = 1, zero = 0;
    for (int n : {8192, 2048, 1024, 512, 256, 128}) {
        // gate/up: two N=12288 K=4096
        int F = 12288, D = 4096;
        bf16 *x = rnd((size_t)n * D, 1), *wgu = rnd((size_t)2 * F * D, 2), *wg = wgu, *wu = wgu + (size_t)F * D;
        bf16 *o = rnd((size_t)n * 2 * F, 3), *og = o, *ou = o + (size_t)n * F;
        auto ge = [&](bf16 *out, bf16 *w, int N, int K, bf16 *xx) { cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, w, CUDA_R_16BF, K, xx, CUDA_R_16BF, K, &zero, out, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT); };
        double fl = 2.0 * n * 2 * F * D;
        float t1 = timeit(10, [&] { ge(og, wg, F, D, x); ge(ou, wu, F, D, x); });
        float t2 = timeit(10, [&] { ge(o, wgu, 2 * F, D, x); });
        float t3 = timeit(10, [&] { cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, F, n, D, &one, wg, CUDA_R_16BF, D, (long long)F * D, x, CUDA_R_16BF, D, 0, &zero, og, CUDA_R_16BF, F, (long long)n * F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT); });
        void **dp; cudaMalloc(&dp, 6 * sizeof(void *)); void *hp[6] = {wg, wu, x, x, og, ou}; cudaMemcpy(dp, hp, sizeof hp, cudaMemcpyHostToDevice);
        float t4 = timeit(10, [&] { cublasGemmBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, F, n, D, &one, (const void **)dp, CUDA_R_16BF, D, (const void **)dp + 2, CUDA_R_16BF, D, &zero, dp + 4, CUDA_R_16BF, F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT); });
        printf("n=%5d gate/up: two %.1f | one wide %.1f | strided %.1f | batched %.1f us (two: %.0f TF/s, best %.0f)\n", n, t1, t2, t3, t4, fl / t1 / 1e6, fl / fminf(fminf(t2, t3), t4) / 1e6);
        // down K=12288
        float t5 = timeit(10, [&] { ge(x, wg, D, F, og); });
        printf("n=%5d down: %.1f us %.0f TF/s\n", n, t5, 2.0 * n * D * F / t5 / 1e6);
        // q/k/v: 4096 + 1024 + 1024
        bf16 *wq = wgu, *wk = wq + (size_t)4096 * D, *wv = wk + (size_t)1024 * D;
        bf16 *oq = o, *ok = oq + (size_t)n * 4096, *ov = ok + (size_t)n * 1024;
        double fq = 2.0 * n * 6144 * D;
        float q1 = timeit(10, [&] { ge(oq, wq, 4096, D, x); ge(ok, wk, 1024, D, x); ge(ov, wv, 1024, D, x); });
        float q2 = timeit(10, [&] { ge(o, wq, 6144, D, x); });
        float q3 = timeit(10, [&] { ge(oq, wq, 4096, D, x); cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 1024, n, D, &one, wk, CUDA_R_16BF, D, (long long)1024 * D, x, CUDA_R_16BF, D, 0, &zero, ok, CUDA_R_16BF, 1024, (long long)n * 1024, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT); });
        void *hq[9] = {wq, wk, wv, x, x, x, oq, ok, ov}; void **dq; cudaMalloc(&dq, sizeof hq); cudaMemcpy(dq, hq, sizeof hq, cudaMemcpyHostToDevice);
        cublasOperation_t ta[2] = {CUBLAS_OP_T, CUBLAS_OP_T}, tb[2] = {CUBLAS_OP_N, CUBLAS_OP_N};
        int m[2] = {4096, 1024}, nn[2] = {n, n}, k[2] = {D, D}, ld[2] = {D, D}, ldc[2] = {4096, 1024}, gs[2] = {1, 2};
        float al[2] = {1, 1}, be[2] = {0, 0};
        cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
        float q4 = timeit(10, [&] { st = cublasGemmGroupedBatchedEx(h, ta, tb, m, nn, k, al, (const void **)dq, CUDA_R_16BF, ld, (const void **)dq + 3, CUDA_R_16BF, ld, be, dq + 6, CUDA_R_16BF, ldc, 2, gs, CUBLAS_COMPUTE_32F); });
        printf("n=%5d q/k/v: three %.1f | one wide %.1f | q + strided kv %.1f | grouped %.1f (st %d) us (three: %.0f TF/s, wide %.0f)\n", n, q1, q2, q3, q4, (int)st, fq / q1 / 1e6, fq / q2 / 1e6);
        // o_proj
        float t6 = timeit(10, [&] { ge(x, wq, D, 4096, oq); });
        printf("n=%5d o: %.1f us %.0f TF/s\n", n, t6, 2.0 * n * D * 4096 / t6 / 1e6);
        cudaFree(x); cudaFree(wgu); cudaFree(o); cudaFree(dp); cudaFree(dq);
    }
    cudaError_t e = cudaDeviceSynchronize(); printf("sync %s\n", cudaGetErrorString(e));
}
