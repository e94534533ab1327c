/*
 * moe_combine.cuh: the last step of an MoE FFN on the GPU, shared by the
 * grouped path (moe.cu, bf16 expert outputs) and the expert-by-expert one
 * (moe_batch.cu, f32): out[i][d] = sum_k wsel[i][k] * y[pos[i K + k]][d],
 * in slot order, f32, rounded once. Block per token, threads over d.
 */
#pragma once
#include "backend/cuda/cuda.cuh"

__device__ __forceinline__ float moe_y(float v) { return v; }
__device__ __forceinline__ float moe_y(bf16 v) { return __bfloat162float(v); }

template <typename Y>
__global__ void k_combine(bf16 *__restrict__ out, const Y *__restrict__ y, const int *__restrict__ pos, const float *__restrict__ wsel,
                          int K, int dim) {
    KTRACE();
    pdl_wait();
    const int i = blockIdx.x;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float s = 0.f;
        for (int k = 0; k < K; k++) s += wsel[(size_t)i * K + k] * moe_y(y[(size_t)pos[(size_t)i * K + k] * dim + d]);
        out[(size_t)i * dim + d] = __float2bfloat16(s);
    }
}
