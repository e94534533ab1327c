/*
 * moe_combine.cuh: the last step of an MoE FFN on the GPU, shared by the
 * grouped path (moe.cu, bf16 expert outputs) and the expert-by-expert one
 * (moe_batch.cu, f32): out[i][d] = sum_k wsel[i][k] * y[pos[i K + k]][d]
 * (pos NULL: y's rows are the pairs), in slot order, f32, rounded once.
 * Block (token, slice of d), threads over d (moe_combine_grid): one block
 * per token took 7.7 us per layer at batch 1, each thread's K loads of its
 * 8 values of d waiting in turn (H100 ktrace, 30B-A3B).
 */
#pragma once
#include "backend/cuda/cuda.cuh"

__device__ __forceinline__ float moe_y(float v) { return v; }
__device__ __forceinline__ float moe_y(bf16 v) { return __bfloat162float(v); }

/* the grid of k_combine for n tokens of dim (256 threads per block) */
static inline dim3 moe_combine_grid(int n, int dim) { return dim3((unsigned)n, (unsigned)((dim + 255) / 256)); }

template <typename Y>
__global__ void k_combine(bf16 *__restrict__ out, const Y *__restrict__ y, const int *__restrict__ pos, const float *__restrict__ wsel,
                          int K, int dim) {
    KTRACE();
    pdl_wait();
    const int i = blockIdx.x;
    for (int d = blockIdx.y * blockDim.x + threadIdx.x; d < dim; d += gridDim.y * blockDim.x) {
        float s = 0.f;
        for (int k = 0; k < K; k++) {
            const size_t j = (size_t)i * K + k;
            s += wsel[j] * moe_y(y[(size_t)(pos ? pos[j] : j) * dim + d]);
        }
        out[(size_t)i * dim + d] = __float2bfloat16(s);
    }
}
