/*
 * stream_bench.cu: how fast one kernel streams a decode step's weights once,
 * on its own, by pattern. Each launch reads bytes no launch just before it
 * read (so they come from DRAM, not L2); its span runs from the first
 * block's start (or, with PDL, the kernel before it's end) to the last
 * block's end, by %globaltimer, mean of 20 launches.
 *
 * 1. Bulk copies into shared memory against plain 16-byte loads, 21 MB
 *    (30B-A3B's q/k/v) and 50 MB (its gate/up): what k_gemv_b and
 *    k_moe_down_b can reach, against k_gemv / k_moe_gate_up.
 * 2. The MoE gate/up GEMV of Qwen3-30B-A3B (E = 128 experts of 768 x 2048,
 *    top 8, one token), built up one factor at a time from the bare
 *    stream to what gemm.cu's k_moe_gate_up does: rows of 8 chosen experts
 *    instead of one contiguous range, the dot products with x, the L2
 *    evict_first policy, the expert pointers read from a device table, and
 *    a programmatic-dependent launch (all blocks resident, waiting, then
 *    released at once). In a decode step it spans 19-21 us (docs/cuda.md
 *    items 15-16); this says which factor costs what.
 * 3. The MoE down GEMV (2048 x 768 of each of the 8 experts): bulk copies
 *    of 8 rows x 8 experts per block (k_moe_down_b) against loads.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/stream_bench tools/stream_bench.cu && /tmp/stream_bench
 */
#include <cstdint>
#include <cstdio>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                                \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

typedef __nv_bfloat16 bf16;
__device__ unsigned long long t_first, t_last, t_rel;
__device__ float sink;

__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void span_start() {
    if (threadIdx.x == 0) atomicMin(&t_first, gtime());
}
__device__ __forceinline__ void span_end() {
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(&t_last, gtime());
}
__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(unsigned a) { asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a) : "memory"); }
__device__ __forceinline__ void mbar_expect(unsigned a, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned a) {
    asm volatile("{\n.reg .pred p;\nW:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n@!p bra W;\n}\n" ::"r"(a) : "memory");
}
__device__ __forceinline__ void bulk(unsigned dst, const void *src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src),
                 "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint4 ld_stream_ef(const uint4 *p, uint64_t pol) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
    return v;
}
__device__ __forceinline__ uint64_t pol_evict_first() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ float2 bf2(unsigned u) { return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u)); }
__device__ __forceinline__ float dot8(float acc, uint4 w, uint4 x) {
    const unsigned wv[4] = {w.x, w.y, w.z, w.w}, xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 a = bf2(wv[i]), b = bf2(xv[i]);
        acc = fmaf(a.x, b.x, acc), acc = fmaf(a.y, b.y, acc);
    }
    return acc;
}
__device__ __forceinline__ float fold(uint4 v) { return __uint_as_float((v.x ^ v.y ^ v.z ^ v.w) & 0x3fffffffu); }
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---- 1. bulk copies against loads ---- */

/* block b copies its `per` bytes to shared memory in chunks of ch bytes */
__global__ void k_bulk(const char *src, unsigned per, unsigned ch) {
    span_start();
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ __align__(8) uint64_t bar;
    const unsigned b = smem_u32(&bar);
    if (threadIdx.x == 0) {
        mbar_init(b);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        mbar_expect(b, per);
    }
    __syncthreads();
    const char *s = src + (size_t)blockIdx.x * per;
    for (unsigned i = threadIdx.x; i * ch < per; i += blockDim.x) bulk(smem_u32(sm + i * ch), s + i * ch, min(ch, per - i * ch), b);
    mbar_wait(b);
    float a = 0.f;
    for (unsigned i = threadIdx.x * 16; i < per; i += blockDim.x * 16) a += ((const float *)sm)[i / 4];
    if (a == 1.f) sink = a;
    span_end();
}

/* warp w streams rows w*rpw .. of rb bytes with U loads per lane per trip */
template <int U> __global__ void k_rows(const char *src, int rb, int rpw) {
    span_start();
    const int lane = threadIdx.x & 31;
    const size_t w = (size_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    float a = 0.f;
    for (int r = 0; r < rpw; r++) {
        const uint4 *p = (const uint4 *)(src + (w * rpw + r) * rb);
        const int nch = rb / 16;
        for (int c = lane; c < nch; c += 32 * U) {
            uint4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++) v[u] = c + 32 * u < nch ? ld_stream(p + c + 32 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int u = 0; u < U; u++) a += fold(v[u]);
        }
    }
    if (a == 1.f) sink = a;
    span_end();
}

/* ---- 2. MoE gate/up, factor by factor ---- */

enum { SCAT = 1, COMP = 2, EF = 4, PTR = 8, PDL = 16, ALL8 = 32 };

struct experts {
    const bf16 *gate, *up; /* [E][F][D] each */
    const bf16 *const *tab; /* PTR: the 8 chosen pairs' (gate, up) pointers, as k_route writes them */
    int e0;                 /* first of the 8 chosen experts (e0 .. e0 + 7) */
};

/* grid (F/8, 8): block (bx, p) owns rows 8 bx .. 8 bx + 7 of pair p's gate
 * and up, warp w row 8 bx + w, as k_moe_gate_up */
template <int M>
__global__ void __launch_bounds__(256) k_gu(bf16 *h, const bf16 *x, struct experts X, int F, int D) {
    if (M & PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
    span_start();
    const int p = blockIdx.y, r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const bf16 *gb, *ub;
    if (M & PTR) gb = X.tab[2 * p], ub = X.tab[2 * p + 1];
    else if (M & SCAT) gb = X.gate + (size_t)(X.e0 + p) * F * D, ub = X.up + (size_t)(X.e0 + p) * F * D;
    else gb = X.gate + (size_t)X.e0 * F * D + (size_t)p * F * D * 2, ub = gb + (size_t)F * D; /* one contiguous range */
    const uint64_t pol = (M & EF) ? pol_evict_first() : 0;
    auto ld = [&](const uint4 *q) { return (M & EF) ? ld_stream_ef(q, pol) : ld_stream(q); };
    const uint4 *g = (const uint4 *)(gb + (size_t)r * D), *u = (const uint4 *)(ub + (size_t)r * D), *xv = (const uint4 *)x;
    const int nch = D / 8;
    float ag = 0.f, au = 0.f;
    if (M & ALL8) { /* the row pair's 8 KB in flight at once (D = 2048) */
        uint4 gv[8], uv[8];
#pragma unroll
        for (int k = 0; k < 8; k++) gv[k] = ld(g + lane + 32 * k), uv[k] = ld(u + lane + 32 * k);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            if (M & COMP) {
                const uint4 xk = __ldg(xv + lane + 32 * k);
                ag = dot8(ag, gv[k], xk), au = dot8(au, uv[k], xk);
            } else
                ag += fold(gv[k]), au += fold(uv[k]);
        }
    } else {
        for (int c = lane; c + 32 < nch; c += 64) {
            const uint4 g0 = ld(g + c), g1 = ld(g + c + 32), u0 = ld(u + c), u1 = ld(u + c + 32);
            if (M & COMP) {
                const uint4 x0 = __ldg(xv + c), x1 = __ldg(xv + c + 32);
                ag = dot8(ag, g0, x0), ag = dot8(ag, g1, x1), au = dot8(au, u0, x0), au = dot8(au, u1, x1);
            } else
                ag += fold(g0) + fold(g1), au += fold(u0) + fold(u1);
        }
    }
    ag = warp_sum(ag), au = warp_sum(au);
    if (lane == 0) h[(size_t)p * F + r] = __float2bfloat16(ag / (1.f + __expf(-ag)) * au);
    span_end();
}

/* the kernel before, for PDL: one block that lets the next grid launch,
 * holds ~us microseconds (so its blocks are all resident and waiting), and
 * stamps its end */
__global__ void k_hold(int us) {
    asm volatile("griddepcontrol.launch_dependents;");
    const unsigned long long t0 = gtime();
    while (gtime() - t0 < (unsigned long long)us * 1000) {
    }
    if (threadIdx.x == 0) t_rel = gtime();
}

/* ---- 3. MoE down ---- */

/* block b: output rows 8 b .. 8 b + 7 over the 8 experts, bulk copies of
 * the 64 rows (96 KB) and h (12 KB), as k_moe_down_b */
__global__ void __launch_bounds__(256) k_down_bulk(bf16 *out, const bf16 *h, const bf16 *down, int e0, int F, int D) {
    span_start();
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ __align__(8) uint64_t bar;
    __shared__ float red[8][8];
    const unsigned b = smem_u32(&bar), rb = (unsigned)F * 2;
    const int r0 = blockIdx.x * 8, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        mbar_init(b);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        mbar_expect(b, 64 * rb + 8 * rb);
    }
    __syncthreads();
    if (threadIdx.x < 64) {
        const int k = threadIdx.x / 8, q = threadIdx.x % 8;
        bulk(smem_u32(sm + (size_t)threadIdx.x * rb), down + ((size_t)(e0 + k) * D + r0 + q) * F, rb, b);
    } else if (threadIdx.x == 64)
        bulk(smem_u32(sm + 64 * (size_t)rb), h, 8 * rb, b);
    mbar_wait(b);
    const uint4 *hs = (const uint4 *)(sm + 64 * (size_t)rb + (size_t)warp * rb);
    float acc[8] = {};
    for (int c = lane; c < F / 8; c += 32) {
        const uint4 hx = hs[c];
#pragma unroll
        for (int q = 0; q < 8; q++) acc[q] = dot8(acc[q], ((const uint4 *)(sm + (size_t)(warp * 8 + q) * rb))[c], hx);
    }
#pragma unroll
    for (int q = 0; q < 8; q++) acc[q] = warp_sum(acc[q]);
    if (lane == 0)
#pragma unroll
        for (int q = 0; q < 8; q++) red[warp][q] = acc[q];
    __syncthreads();
    if (threadIdx.x < 8) {
        float s = 0.f;
        for (int w = 0; w < 8; w++) s += red[w][threadIdx.x];
        out[r0 + threadIdx.x] = __float2bfloat16(s);
    }
    span_end();
}

/* the same with loads: warp k streams expert k's 8 rows (each lane 3
 * chunks of each row, all 24 in flight) */
__global__ void __launch_bounds__(256) k_down_ld(bf16 *out, const bf16 *h, const bf16 *down, int e0, int F, int D) {
    span_start();
    __shared__ float red[8][8];
    const int r0 = blockIdx.x * 8, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint4 *hv = (const uint4 *)(h + (size_t)warp * F);
    uint4 wv[8][3];
#pragma unroll
    for (int q = 0; q < 8; q++)
#pragma unroll
        for (int j = 0; j < 3; j++) wv[q][j] = ld_stream((const uint4 *)(down + ((size_t)(e0 + warp) * D + r0 + q) * F) + lane + 32 * j);
    float acc[8] = {};
#pragma unroll
    for (int j = 0; j < 3; j++) {
        const uint4 hx = __ldg(hv + lane + 32 * j);
#pragma unroll
        for (int q = 0; q < 8; q++) acc[q] = dot8(acc[q], wv[q][j], hx);
    }
#pragma unroll
    for (int q = 0; q < 8; q++) acc[q] = warp_sum(acc[q]);
    if (lane == 0)
#pragma unroll
        for (int q = 0; q < 8; q++) red[warp][q] = acc[q];
    __syncthreads();
    if (threadIdx.x < 8) {
        float s = 0.f;
        for (int w = 0; w < 8; w++) s += red[w][threadIdx.x];
        out[r0 + threadIdx.x] = __float2bfloat16(s);
    }
    span_end();
}

__global__ void k_fill(bf16 *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned v = (unsigned)i * 2654435761u;
        v ^= v >> 15;
        p[i] = __float2bfloat16(((v & 0xffff) / 65536.f - 0.5f) * 0.1f);
    }
}

/* mean span in us of 20 launches (after 2 untimed); launch(r) issues launch r */
template <typename L> static double span(L launch, int pdl) {
    double tot = 0.;
    for (int r = 0; r < 22; r++) {
        const unsigned long long hi = ~0ull, lo = 0;
        cudaMemcpyToSymbol(t_first, &hi, 8), cudaMemcpyToSymbol(t_last, &lo, 8), cudaMemcpyToSymbol(t_rel, &lo, 8);
        launch(r);
        cudaDeviceSynchronize();
        unsigned long long a, b, rel;
        cudaMemcpyFromSymbol(&a, t_first, 8), cudaMemcpyFromSymbol(&b, t_last, 8), cudaMemcpyFromSymbol(&rel, t_rel, 8);
        if (r >= 2) tot += ((pdl ? b - rel : b - a) * 1e-3);
    }
    return tot / 20;
}

int main() {
    int nsm = 0;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    const size_t NB = (size_t)4 << 30; /* a 4 GiB pool: launch r reads past launch r - 1's bytes */
    char *pool;
    CK(cudaMalloc(&pool, NB));
    CK(cudaMemset(pool, 1, NB));
    CK(cudaFuncSetAttribute(k_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
    CK(cudaFuncSetAttribute(k_down_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, 110 * 1024));
    auto fresh = [&](int r, size_t bytes) { return pool + (size_t)r * ((bytes + (1 << 20)) & ~(size_t)((1 << 20) - 1)) % (NB - bytes); };

    printf("1. one-shot streams (%d SMs)\n", nsm);
    for (size_t mb : {21, 50}) {
        const size_t bytes = mb * 1000000;
        for (int bps = 1; bps <= 3; bps++) {
            const int nb = bps * nsm;
            const unsigned per = (unsigned)(bytes / nb) & ~15u;
            if (per > 220u * 1024 / bps) continue;
            const double us = span([&](int r) { k_bulk<<<nb, 256, per>>>(fresh(r, bytes), per, per); }, 0);
            printf("  %3zu MB  bulk copies, %d blocks per SM, %6u B each      %6.2f us %5.2f TB/s\n", mb, bps, per, us, per * (double)nb / us * 1e-6);
        }
        for (int rpw = 1; rpw <= 2; rpw++) {
            const size_t nb = bytes / 4096 / 8 / rpw;
            const double us = span([&](int r) { k_rows<2><<<(unsigned)nb, 256>>>(fresh(r, bytes), 4096, rpw); }, 0);
            printf("  %3zu MB  loads, %d row(s) of 4 KB per warp, 2 per lane per trip %6.2f us %5.2f TB/s\n", mb, rpw, us, nb * 8 * rpw * 4096. / us * 1e-6);
        }
    }

    const int E = 128, F = 768, D = 2048;
    const size_t em = (size_t)E * F * D;
    bf16 *gate, *up, *down, *x, *h, *out;
    const bf16 **tab;
    CK(cudaMalloc(&gate, em * 2));
    CK(cudaMalloc(&up, em * 2));
    CK(cudaMalloc(&down, em * 2));
    CK(cudaMalloc(&x, D * 2));
    CK(cudaMalloc(&h, 8 * F * 2));
    CK(cudaMalloc(&out, D * 2));
    CK(cudaMalloc(&tab, 16 * 16 * sizeof(void *)));
    k_fill<<<1024, 256>>>(gate, em), k_fill<<<1024, 256>>>(up, em), k_fill<<<1024, 256>>>(down, em), k_fill<<<4, 256>>>(x, D);
    k_fill<<<4, 256>>>(h, 8 * F);
    {
        const bf16 *ht[16 * 16];
        for (int s = 0; s < 16; s++)
            for (int p = 0; p < 8; p++) ht[s * 16 + 2 * p] = gate + (size_t)(8 * s + p) * F * D, ht[s * 16 + 2 * p + 1] = up + (size_t)(8 * s + p) * F * D;
        CK(cudaMemcpy(tab, ht, sizeof ht, cudaMemcpyHostToDevice));
    }
    CK(cudaDeviceSynchronize());
    /* launch r uses experts 8 (r % 16) .. + 7: the last launch's 50 MB is never read again at once */
    printf("2. MoE gate/up, 8 experts of %d x %d, gate and up (%.1f MB)\n", F, D, 16. * F * D * 2 / 1e6);
    const double gu_bytes = 16. * F * D * 2;
    struct gu_case {
        const char *name;
        void (*k)(bf16 *, const bf16 *, struct experts, int, int);
    } cases[] = {
        {"bare stream, one contiguous range", k_gu<0>},
        {"+ rows of 8 chosen experts", k_gu<SCAT>},
        {"+ dot products with x", k_gu<SCAT | COMP>},
        {"+ evict_first", k_gu<SCAT | COMP | EF>},
        {"+ pointers from a table (k_moe_gate_up)", k_gu<SCAT | COMP | EF | PTR>},
        {"+ PDL: resident, then released", k_gu<SCAT | COMP | EF | PTR | PDL>},
        {"k_moe_gate_up, 8 KB per warp at once", k_gu<SCAT | COMP | EF | PTR | ALL8>},
        {"the same, PDL", k_gu<SCAT | COMP | EF | PTR | ALL8 | PDL>},
    };
    for (auto &cs : cases) {
        const int pdl = cs.k == k_gu<SCAT | COMP | EF | PTR | PDL> || cs.k == k_gu<SCAT | COMP | EF | PTR | ALL8 | PDL>;
        const double us = span(
            [&](int r) {
                struct experts X = {gate, up, tab + 16 * (r % 16), 8 * (r % 16)};
                if (!(cs.k == k_gu<0>)) X.e0 = 8 * (r % 16);
                else X.e0 = 16 * (r % 8); /* 16 expert-sized slices in a row of gate */
                if (pdl) {
                    k_hold<<<1, 32>>>(30);
                    cudaLaunchConfig_t cfg = {};
                    cudaLaunchAttribute at = {};
                    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
                    at.val.programmaticStreamSerializationAllowed = 1;
                    cfg.gridDim = dim3(F / 8, 8), cfg.blockDim = dim3(256), cfg.attrs = &at, cfg.numAttrs = 1;
                    cudaLaunchKernelEx(&cfg, cs.k, h, (const bf16 *)x, X, F, D);
                } else
                    cs.k<<<dim3(F / 8, 8), 256>>>(h, x, X, F, D);
            },
            pdl);
        printf("  %-46s %6.2f us %5.2f TB/s%s\n", cs.name, us, gu_bytes / us * 1e-6, pdl ? " (from the release)" : "");
    }
    CK(cudaGetLastError());
    printf("3. MoE down, 8 experts of %d x %d (%.1f MB)\n", D, F, 8. * F * D * 2 / 1e6);
    const double dn_bytes = 8. * F * D * 2;
    double us = span([&](int r) { k_down_bulk<<<D / 8, 256, 72 * F * 2>>>(out, h, down, 8 * (r % 16), F, D); }, 0);
    printf("  %-46s %6.2f us %5.2f TB/s\n", "bulk copies, 96 KB per block (k_moe_down_b)", us, dn_bytes / us * 1e-6);
    us = span([&](int r) { k_down_ld<<<D / 8, 256>>>(out, h, down, 8 * (r % 16), F, D); }, 0);
    printf("  %-46s %6.2f us %5.2f TB/s\n", "loads, 24 per lane at once", us, dn_bytes / us * 1e-6);
    CK(cudaGetLastError());
    return 0;
}
