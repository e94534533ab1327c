/*
 * swiglu.cuh: silu(g) = g / (1 + e^-g) in f32, the one formula every
 * kernel that applies it uses (cuda.cuh includes this file), and silu(g) * u
 * over one 16-byte chunk (8 bf16), rounded once; shared by misc.cu's
 * k_swiglu8 and tools/mlp_overlap.cu, so the tool times the kernel's
 * arithmetic.
 */
#pragma once
#include <cuda_bf16.h>

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

__device__ __forceinline__ uint4 swiglu_chunk8(uint4 gv, uint4 uv) {
    uint4 ov;
    const __nv_bfloat162 *gh = (const __nv_bfloat162 *)&gv, *uh = (const __nv_bfloat162 *)&uv;
    __nv_bfloat162 *oh = (__nv_bfloat162 *)&ov;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float2 a = __bfloat1622float2(gh[j]), b = __bfloat1622float2(uh[j]);
        oh[j] = __floats2bfloat162_rn(silu(a.x) * b.x, silu(a.y) * b.y);
    }
    return ov;
}
