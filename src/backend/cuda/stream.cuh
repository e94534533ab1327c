/*
 * stream.cuh: the streaming inner loop of the decode GEMVs (gemm.cu): a
 * 16-byte weight load that skips L1 (with or without an L2 policy) and the
 * dot product of 8 bf16 weights with 8 bf16 activations. In a header so
 * that tools/stream_bench.cu times the same instructions the kernels run.
 */
#ifndef KILN_STREAM_CUH
#define KILN_STREAM_CUH

#include "backend/cuda/cuda.cuh"

__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* ld_stream with an L2 policy (sm90.cuh pol_evict_first) */
__device__ __forceinline__ uint4 ld_stream_pol(const uint4 *p, uint64_t pol) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
    return v;
}

/* acc += dot of 8 bf16 weights with 8 bf16 activations */
__device__ __forceinline__ float dot8(float acc, uint4 w, uint4 x) {
    float2 a = bf2(w.x), b = bf2(x.x);
    acc = fmaf(a.x, b.x, acc), acc = fmaf(a.y, b.y, acc);
    a = bf2(w.y), b = bf2(x.y);
    acc = fmaf(a.x, b.x, acc), acc = fmaf(a.y, b.y, acc);
    a = bf2(w.z), b = bf2(x.z);
    acc = fmaf(a.x, b.x, acc), acc = fmaf(a.y, b.y, acc);
    a = bf2(w.w), b = bf2(x.w);
    acc = fmaf(a.x, b.x, acc), acc = fmaf(a.y, b.y, acc);
    return acc;
}

#endif
