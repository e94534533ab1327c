/*
 * stream_bench.cu: how fast one kernel streams a decode step's weights once,
 * on its own, by pattern. Each launch reads bytes no launch just before it
 * read (so they come from DRAM, not L2); its span runs from the first
 * block's start (or, with PDL, the kernel before it's end) to the last
 * block's end, by %globaltimer, mean of 20 launches.
 *
 * 1. Bulk copies into shared memory against plain 16-byte loads, 21 MB
 *    (30B-A3B's q/k/v) and 50 MB (its gate/up): what k_gemv_b and
 *    k_moe_down_b can reach, against k_gemv / k_moe_gate_up; and the same
 *    one-shot copy by cp.async from every thread, or into registers.
 * 2. The MoE gate/up GEMV of Qwen3-30B-A3B (E = 128 experts of 768 x 2048,
 *    top 8, one token), built up one factor at a time from the bare
 *    stream to what gemm.cu's k_moe_gate_up does: rows of 8 chosen experts
 *    instead of one contiguous range, the dot products with x, the L2
 *    evict_first policy, the expert pointers read from a device table, and
 *    a programmatic-dependent launch (all blocks resident, waiting, then
 *    released at once). In a decode step it spans 19-21 us (docs/cuda.md
 *    items 15-16); this says which factor costs what.
 * 2b. The same kernel with its experts in separate allocations across 12
 *    layers (9.7 GB: does the TLB cost?), one launch at a time and 20 back
 *    to back on one stream.
 * 3. The MoE down GEMV (2048 x 768 of each of the 8 experts): bulk copies
 *    of 8 rows x 8 experts per block (k_moe_down_b) against loads.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -o /tmp/stream_bench tools/stream_bench.cu && /tmp/stream_bench
 */
#include <cstdint>
#include <cstdio>
#include <vector>

#include "backend/cuda/cuda.cuh"   /* warp_sum */
#include "backend/cuda/sm90.cuh"   /* mbarriers, bulk copies, evict_first */
#include "backend/cuda/stream.cuh" /* the GEMVs' ld_stream, ld_stream_pol and dot8 */

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                                \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

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
__device__ __forceinline__ float fold(uint4 v) { return __uint_as_float((v.x ^ v.y ^ v.z ^ v.w) & 0x3fffffffu); }

/* ---- 1. bulk copies against loads ---- */

/* block b copies its `per` bytes to shared memory in chunks of ch bytes */
__global__ void k_bulk(const char *src, unsigned per, unsigned ch) {
#ifdef __CUDA_ARCH__ /* sm90.cuh exists only in the device pass */
    span_start();
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ __align__(8) uint64_t bar;
    const unsigned b = smem_u32(&bar);
    if (threadIdx.x == 0) {
        mbar_init(b, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        mbar_arrive_tx(b, per);
    }
    __syncthreads();
    const char *s = src + (size_t)blockIdx.x * per;
    for (unsigned i = threadIdx.x; i * ch < per; i += blockDim.x) bulk_load(smem_u32(sm + i * ch), s + i * ch, min(ch, per - i * ch), b);
    mbar_wait(b, 0);
    float a = 0.f;
    for (unsigned i = threadIdx.x * 16; i < per; i += blockDim.x * 16) a += ((const float *)sm)[i / 4];
    if (a == 1.f) sink = a;
    span_end();
#endif
}

/* the same one-shot copy by cp.async: every thread copies 16-byte chunks
 * (the load path, no registers held), then waits for its own */
__global__ void k_async(const char *src, unsigned per) {
    span_start();
    extern __shared__ __align__(128) unsigned char sm[];
    const char *s = src + (size_t)blockIdx.x * per;
    for (unsigned i = threadIdx.x * 16; i < per; i += blockDim.x * 16) {
        const unsigned a = (unsigned)__cvta_generic_to_shared(sm + i);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(s + i));
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    float a = 0.f;
    for (unsigned i = threadIdx.x * 16; i < per; i += blockDim.x * 16) a += ((const float *)sm)[i / 4];
    if (a == 1.f) sink = a;
    span_end();
}

/* the same one-shot stream into registers: thread t loads chunks t, t + 256,
 * ... of its block's per bytes, all at once (at most 24) */
__global__ void __launch_bounds__(256, 2) k_regs(const char *src, unsigned per) {
    span_start();
    const uint4 *s = (const uint4 *)(src + (size_t)blockIdx.x * per);
    const unsigned n = per / 16;
    uint4 v[24];
#pragma unroll
    for (int i = 0; i < 24; i++)
        if (threadIdx.x + 256u * i < n) v[i] = ld_stream(s + threadIdx.x + 256 * i);
    float a = 0.f;
#pragma unroll
    for (int i = 0; i < 24; i++)
        if (threadIdx.x + 256u * i < n) a += fold(v[i]);
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
#ifdef __CUDA_ARCH__ /* sm90.cuh exists only in the device pass */
    if (M & PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
    span_start();
    const int p = blockIdx.y, r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const bf16 *gb, *ub;
    if (M & PTR) gb = X.tab[2 * p], ub = X.tab[2 * p + 1];
    else if (M & SCAT) gb = X.gate + (size_t)(X.e0 + p) * F * D, ub = X.up + (size_t)(X.e0 + p) * F * D;
    else gb = X.gate + (size_t)X.e0 * F * D + (size_t)p * F * D * 2, ub = gb + (size_t)F * D; /* one contiguous range */
    const uint64_t pol = (M & EF) ? pol_evict_first() : 0;
    auto ld = [&](const uint4 *q) { return (M & EF) ? ld_stream_pol(q, pol) : ld_stream(q); };
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
    if (lane == 0) h[(size_t)p * F + r] = __float2bfloat16(silu(ag) * au);
    span_end();
#endif
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

/* the block's output rows r0 .. r0 + 7: warp w holds expert w's 8 partial
 * dot products, summed over the warp, then over the warps in warp order */
__device__ __forceinline__ void down_rows_out(bf16 *out, float (&acc)[8], int r0) {
    __shared__ float red[8][8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
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
}

/* block b: output rows 8 b .. 8 b + 7 over the 8 experts, bulk copies of
 * the 64 rows (96 KB) and h (12 KB), as k_moe_down_b */
__global__ void __launch_bounds__(256) k_down_bulk(bf16 *out, const bf16 *h, const bf16 *down, int e0, int F, int D) {
#ifdef __CUDA_ARCH__ /* sm90.cuh exists only in the device pass */
    span_start();
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ __align__(8) uint64_t bar;
    const unsigned b = smem_u32(&bar), rb = (unsigned)F * 2;
    const int r0 = blockIdx.x * 8, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        mbar_init(b, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        mbar_arrive_tx(b, 64 * rb + 8 * rb);
    }
    __syncthreads();
    if (threadIdx.x < 64) {
        const int k = threadIdx.x / 8, q = threadIdx.x % 8;
        bulk_load(smem_u32(sm + (size_t)threadIdx.x * rb), down + ((size_t)(e0 + k) * D + r0 + q) * F, rb, b);
    } else if (threadIdx.x == 64)
        bulk_load(smem_u32(sm + 64 * (size_t)rb), h, 8 * rb, b);
    mbar_wait(b, 0);
    const uint4 *hs = (const uint4 *)(sm + 64 * (size_t)rb + (size_t)warp * rb);
    float acc[8] = {};
    for (int c = lane; c < F / 8; c += 32) {
        const uint4 hx = hs[c];
#pragma unroll
        for (int q = 0; q < 8; q++) acc[q] = dot8(acc[q], ((const uint4 *)(sm + (size_t)(warp * 8 + q) * rb))[c], hx);
    }
    down_rows_out(out, acc, r0);
    span_end();
#endif
}

/* the same with loads: warp k streams expert k's 8 rows (each lane 3
 * chunks of each row, all 24 in flight: 2 blocks per SM, so up to 128
 * registers, and the 256 blocks in one wave) */
__global__ void __launch_bounds__(256, 2) k_down_ld(bf16 *out, const bf16 *h, const bf16 *down, int e0, int F, int D) {
    span_start();
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
    down_rows_out(out, acc, r0);
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
    CK(cudaFuncSetAttribute(k_async, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
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
            const double ua = span([&](int r) { k_async<<<nb, 256, per>>>(fresh(r, bytes), per); }, 0);
            printf("  %3zu MB  cp.async 16 B, %d blocks per SM, %6u B each    %6.2f us %5.2f TB/s\n", mb, bps, per, ua, per * (double)nb / ua * 1e-6);
            if (bps == 2 && per <= 24u * 256 * 16) {
                const double ur = span([&](int r) { k_regs<<<nb, 256>>>(fresh(r, bytes), per); }, 0);
                printf("  %3zu MB  registers, 2 blocks per SM, %6u B each      %6.2f us %5.2f TB/s\n", mb, per, ur, per * (double)nb / ur * 1e-6);
            }
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
        int m; /* k's mode bits */
        void (*k)(bf16 *, const bf16 *, struct experts, int, int);
    } cases[] = {
#define GU(name, m) {name, m, k_gu<m>}
        GU("bare stream, one contiguous range", 0),
        GU("+ rows of 8 chosen experts", SCAT),
        GU("+ dot products with x", SCAT | COMP),
        GU("+ evict_first", SCAT | COMP | EF),
        GU("+ pointers from a table (k_moe_gate_up)", SCAT | COMP | EF | PTR),
        GU("+ PDL: resident, then released", SCAT | COMP | EF | PTR | PDL),
        GU("k_moe_gate_up, 8 KB per warp at once", SCAT | COMP | EF | PTR | ALL8),
        GU("the same, PDL", SCAT | COMP | EF | PTR | ALL8 | PDL),
#undef GU
    };
    for (auto &cs : cases) {
        const int pdl = (cs.m & PDL) != 0;
        const double us = span(
            [&](int r) {
                /* contiguous: 16 expert-sized slices in a row of gate */
                const struct experts X = {gate, up, tab + 16 * (r % 16), cs.m & SCAT ? 8 * (r % 16) : 16 * (r % 8)};
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
    {
        /* the TLB: k_moe_gate_up's pointers into 12 layers x 128 experts,
         * each expert's gate and up its own allocation (as the engine
         * uploads them), 8 drawn at random per launch, against 8 drawn
         * from one layer */
        const int L = 12, NS = 64;
        std::vector<bf16 *> ex((size_t)L * E * 2);
        for (auto &q : ex) {
            CK(cudaMalloc(&q, (size_t)F * D * 2));
            k_fill<<<64, 256>>>(q, (size_t)F * D);
        }
        const bf16 **tab2;
        CK(cudaMalloc(&tab2, (size_t)2 * NS * 16 * sizeof(void *)));
        std::vector<const bf16 *> ht((size_t)2 * NS * 16);
        unsigned rng = 12345;
        for (int wide = 0; wide < 2; wide++)
            for (int s = 0; s < NS; s++)
                for (int p = 0; p < 8; p++) {
                    rng = rng * 1664525u + 1013904223u;
                    const int l = wide ? (int)(rng >> 8) % L : 0, e = (int)(rng >> 20) % E;
                    ht[((size_t)wide * NS + s) * 16 + 2 * p] = ex[((size_t)l * E + e) * 2];
                    ht[((size_t)wide * NS + s) * 16 + 2 * p + 1] = ex[((size_t)l * E + e) * 2 + 1];
                }
        CK(cudaMemcpy(tab2, ht.data(), ht.size() * sizeof(void *), cudaMemcpyHostToDevice));
        CK(cudaDeviceSynchronize());
        printf("2b. k_moe_gate_up's pointers into experts allocated one by one (%.1f GB in all)\n", L * E * 2. * F * D * 2 / 1e9);
        for (int wide = 0; wide < 2; wide++) {
            const double us = span(
                [&](int r) {
                    const struct experts X = {gate, up, tab2 + ((size_t)wide * NS + (r * 7) % NS) * 16, 0};
                    k_gu<SCAT | COMP | EF | PTR><<<dim3(F / 8, 8), 256>>>(h, x, X, F, D);
                },
                0);
            printf("  8 experts drawn from %-26s %6.2f us %5.2f TB/s\n", wide ? "12 layers (9.7 GB)" : "one layer (0.8 GB)", us, gu_bytes / us * 1e-6);
        }
        /* back to back: 20 launches on one stream, no sync between, timed by events */
        for (int wide = 0; wide < 2; wide++) {
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            for (int rep = 0; rep < 2; rep++) {
                CK(cudaEventRecord(e0));
                for (int r = 0; r < 20; r++) {
                    const struct experts X = {gate, up, tab2 + ((size_t)wide * NS + (r * 7 + rep) % NS) * 16, 0};
                    k_gu<SCAT | COMP | EF | PTR><<<dim3(F / 8, 8), 256>>>(h, x, X, F, D);
                }
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
            }
            float ms = 0.f;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            printf("  20 back to back, %-28s %6.2f us each %5.2f TB/s\n", wide ? "12 layers" : "one layer", ms * 1e3 / 20, gu_bytes / (ms * 1e3 / 20) * 1e-6);
        }
        for (auto q : ex) cudaFree(q);
        cudaFree(tab2);
    }
    printf("3. MoE down, 8 experts of %d x %d (%.1f MB)\n", D, F, 8. * F * D * 2 / 1e6);
    const double dn_bytes = 8. * F * D * 2;
    double us = span([&](int r) { k_down_bulk<<<D / 8, 256, 72 * F * 2>>>(out, h, down, 8 * (r % 16), F, D); }, 0);
    printf("  %-46s %6.2f us %5.2f TB/s\n", "bulk copies, 96 KB per block (k_moe_down_b)", us, dn_bytes / us * 1e-6);
    us = span([&](int r) { k_down_ld<<<D / 8, 256>>>(out, h, down, 8 * (r % 16), F, D); }, 0);
    printf("  %-46s %6.2f us %5.2f TB/s\n", "loads, 24 per lane at once", us, dn_bytes / us * 1e-6);
    CK(cudaGetLastError());
    return 0;
}
