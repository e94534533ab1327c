/*
 * flash_wg.cu: prefill attention on Hopper's warpgroup MMA (wgmma, sm_90a).
 * It takes over attention.cu's k_flash<128, SPLIT, 2> on a GPU that runs the
 * sm_90a code: the same work list, grid (entry, pair of q heads of one KV
 * head), causal mask, split-KV partial slots and merge (flash.cuh); head_dim
 * 128 only. Two kernels: k_flash_wg2 (below), whose loader is the copy
 * engine (TMA), for page sizes that are powers of two from 8 up; and
 * k_flash_wg, described here, which gathers with cp.async (other page
 * sizes, or KILN_CUDA_FA_WG=1).
 *
 * Block: 2 warpgroups (256 threads); warpgroup w owns the entry's 64 query
 * rows of q head h0 + w, and both read the same K and V tiles. Per step of
 * WG_BN = 128 keys (two FA_BN blocks of the work list):
 *   S  = Q K^T : 8 x wgmma m64n128k16 (one per 16 of head_dim), Q and K from
 *                shared memory, S (64 x 128 f32) in registers, 64 per thread
 *   mask (only in a step that reaches past the tile's first row position or
 *   the entry's last key), online softmax per row on the quad's registers,
 *   as k_flash; P rounded to bf16 in the A-operand register layout
 *   O += P V  : 8 x wgmma m64n128k16 (one per 16 keys), P from registers, V
 *                from shared memory read MN-major (transposed), O in
 *                registers, 64 per thread
 * The accumulator layout of wgmma m64nN is mma.sync's m16n8 per warp (warp
 * w of the group: rows 16w .. 16w + 15), so thread x of a warpgroup holds
 * the same rows and columns as thread x of a k_flash block: the softmax,
 * the partial slots and the output store are k_flash's.
 * Shared memory (1024-byte aligned): Q of the two heads, then two stages of
 * K and V; every tile of 128-column rows is two halves of 64 columns (128
 * bytes per row), each in the 128-byte swizzle the tensor cores read: the
 * 16-byte chunk c of row r sits at chunk c ^ (r % 8). Tiles are gathered
 * page by page with cp.async (keys past the entry are zero-filled), the
 * next tile loading while the tensor cores work on this one; before the
 * tensor cores read what cp.async and plain stores wrote, every thread
 * fences the async proxy and the block meets at a barrier.
 * Descriptors: K-major Q and K (8-row groups 1024 bytes apart, a 16-column
 * k step 32 bytes into the row); MN-major V (16 keys = 2048 bytes per k
 * step, the two 64-column halves WG_BN * 128 bytes apart).
 */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda.cuh"
#include "backend/cuda/flash.cuh"
#include "backend/cuda/sm90.cuh"

#include <cudaTypedefs.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KILN_WGMMA 1
#endif

#define WG_BN 128
#define WG_Q_BYTES (2 * FA_BM * 256)        /* Q of two heads, 64 rows of 256 bytes */
#define WG_T_BYTES (WG_BN * 256)             /* one K or V tile */
#define WG_SMEM (WG_Q_BYTES + 4 * WG_T_BYTES + 1024) /* + alignment slack */

#ifdef KILN_WGMMA
/* byte offset of 16-byte chunk c (0..15) of row r in a swizzled tile of
 * `rows` rows of 128 columns */
__device__ __forceinline__ unsigned swz(int r, int c, int rows) {
    return (unsigned)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* shared-memory matrix descriptor, 128-byte swizzle */
__device__ __forceinline__ uint64_t wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 |
           (uint64_t)((sbo & 0x3FFFF) >> 4) << 32 | 1ull << 62;
}

__device__ __forceinline__ void wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0(void) { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait1(void) { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }

/* the accumulators are written asynchronously: keep the compiler from
 * moving their reads and writes across the wait */
__device__ __forceinline__ void wg_keep(float (&d)[16][4]) {
#pragma unroll
    for (int i = 0; i < 16; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[i][e])::"memory");
}

/* d (+)= A B, A and B in shared memory (K-major) */
__device__ __forceinline__ void wgmma_ss(float (&d)[16][4], uint64_t da, uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63},"
        " %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "l"(da), "l"(db), "r"(acc));
}

/* d (+)= A B, A in registers, B in shared memory read MN-major */
__device__ __forceinline__ void wgmma_rs(float (&d)[16][4], const unsigned *a, uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63},"
        " {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* a box of a 2-d tensor map to shared memory, completing on mbarrier bar */
__device__ __forceinline__ void tma_load_2d(unsigned dst, const CUtensorMap *map, int c0, int c1, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#endif

#ifdef KILN_WGMMA
/* S = Q K^T of one 128-key step: 8 wgmma over head_dim (issued only) */
__device__ __forceinline__ void wg2_scores(float (&sc)[16][4], unsigned qa, unsigned ka) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
        wgmma_ss(sc, wg_desc(qa + (kk >> 2) * FA_BM * 128 + (kk & 3) * 32, 16, 1024),
                 wg_desc(ka + (kk >> 2) * WG_BN * 128 + (kk & 3) * 32, 16, 1024), kk > 0);
}

/* O += P V of one step: 8 wgmma over its keys (issued only) */
__device__ __forceinline__ void wg2_pv(float (&o)[16][4], const unsigned (&pa)[8][4], unsigned va) {
#pragma unroll
    for (int j = 0; j < WG_BN / 16; j++) wgmma_rs(o, pa[j], wg_desc(va + j * 16 * 128, WG_BN * 128, 1024), 1);
}

/* online softmax of one step, in place (sc: raw scores in, p out): mask,
 * the max on raw scores (scaled after), p = 2^(s * sl2 - m) with the scale
 * folded into the FMA, per-thread row sums; a0/a1 rescale the rows' O */
template <bool SPLIT>
__device__ __forceinline__ void wg2_softmax(float (&sc)[16][4], float (&mr)[2], float (&lr)[2], float &a0, float &a1, int key0,
                                            int p_lo, int k_end, int p0, int p1, int t4, float sl2) {
    if (key0 + WG_BN - 1 > p_lo || key0 + WG_BN > k_end) {
#pragma unroll
        for (int j = 0; j < 16; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = key0 + j * 8 + 2 * t4 + (e & 1);
                if (!(key < k_end && key <= (e < 2 ? p0 : p1))) sc[j][e] = -INFINITY;
            }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 16; j++) mx0 = fmaxf(mx0, fmaxf(sc[j][0], sc[j][1])), mx1 = fmaxf(mx1, fmaxf(sc[j][2], sc[j][3]));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1)), mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1)), mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(mr[0], mx0 * sl2), mn1 = fmaxf(mr[1], mx1 * sl2);
    /* a split chunk may start past a row's position: m stays -inf there
     * and 0 is subtracted (p = 0, l = 0) */
    const float b0 = SPLIT && mn0 == -INFINITY ? 0.f : mn0, b1 = SPLIT && mn1 == -INFINITY ? 0.f : mn1;
    a0 = ex2(mr[0] - b0), a1 = ex2(mr[1] - b1);
    mr[0] = mn0, mr[1] = mn1;
    float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        sc[j][0] = ex2(fmaf(sc[j][0], sl2, -b0)), sc[j][1] = ex2(fmaf(sc[j][1], sl2, -b0));
        sc[j][2] = ex2(fmaf(sc[j][2], sl2, -b1)), sc[j][3] = ex2(fmaf(sc[j][3], sl2, -b1));
        ls0 += sc[j][0] + sc[j][1], ls1 += sc[j][2] + sc[j][3];
    }
    lr[0] = lr[0] * a0 + ls0, lr[1] = lr[1] * a1 + ls1; /* this thread's columns; summed over the quad at the end */
}

/* p rounded to bf16 in the A-operand register layout */
__device__ __forceinline__ void wg2_pack(unsigned (&pa)[8][4], const float (&sc)[16][4]) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        pa[j][0] = pack_bf16(sc[2 * j][0], sc[2 * j][1]);
        pa[j][1] = pack_bf16(sc[2 * j][2], sc[2 * j][3]);
        pa[j][2] = pack_bf16(sc[2 * j + 1][0], sc[2 * j + 1][1]);
        pa[j][3] = pack_bf16(sc[2 * j + 1][2], sc[2 * j + 1][3]);
    }
}

/* O's rows times the step's factors, skipped when no row's max moved */
__device__ __forceinline__ void wg2_rescale(float (&o)[16][4], float a0, float a1) {
    if (!__all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f)) {
#pragma unroll
        for (int j = 0; j < 16; j++) o[j][0] *= a0, o[j][1] *= a0, o[j][2] *= a1, o[j][3] *= a1;
    }
}

#endif

template <bool SPLIT>
__global__ void __launch_bounds__(256, 1) k_flash_wg(bf16 *__restrict__ out, float *__restrict__ part, int *__restrict__ done,
                                                     const bf16 *__restrict__ q, const bf16 *__restrict__ kc,
                                                     const bf16 *__restrict__ vc, const int *__restrict__ tiles,
                                                     const int *__restrict__ seq, const int *__restrict__ pages, int n_head,
                                                     int nkv, int P, float sl2) {
#ifdef KILN_WGMMA
    constexpr int D = 128;
    pdl_wait();
    extern __shared__ uint4 smem_u4[];
    char *sm = (char *)(((uintptr_t)smem_u4 + 1023) & ~(uintptr_t)1023);
    const unsigned sm_a = (unsigned)__cvta_generic_to_shared(sm);
    const int *ent = tiles + FA_ENT * blockIdx.x, h0 = blockIdx.y * 2, kh = h0 / (n_head / nkv);
    const struct flash_ent F = flash_entry<SPLIT>(tiles, seq);
    const int m0 = F.m0, start = F.start, n = F.n, n_past = F.n_past, poff = F.poff;
    const int kb0 = F.kb0, kb1 = F.kb1, k_end = F.k_end;
    const int tid = threadIdx.x, wg = tid >> 7, x = tid & 127, warp = x >> 5, lane = x & 31, g = lane >> 2, t4 = lane & 3;
    const int qr0 = m0 + warp * 16 + g;
    const int p0 = n_past + qr0, p1 = p0 + 8, p_lo = n_past + m0;

    /* Q of both heads (rows past n repeat row n - 1); it rides in the first
     * tile's cp.async group */
    for (int i = tid; i < 2 * FA_BM * 16; i += 256) {
        const int hi = i >> 10, r = (i >> 4) & (FA_BM - 1), c = i & 15;
        cp_async16(sm + hi * (WG_Q_BYTES / 2) + swz(r, c, FA_BM),
                   q + ((size_t)(start + min(m0 + r, n - 1)) * n_head + h0 + hi) * D + c * 8);
    }
    auto load = [&](int kb, int st) {
        char *K = sm + WG_Q_BYTES + st * 2 * WG_T_BYTES, *V = K + WG_T_BYTES;
        for (int i = tid; i < WG_BN * 16; i += 256) {
            const int key = i >> 4, c = i & 15, tk = kb * FA_BN + key;
            const unsigned off = swz(key, c, WG_BN);
            if (tk < k_end) {
                const size_t src = (((size_t)pages[poff + tk / P] * nkv + kh) * P + tk % P) * D + c * 8;
                cp_async16(K + off, kc + src);
                cp_async16(V + off, vc + src);
            } else {
                *(uint4 *)(K + off) = make_uint4(0, 0, 0, 0);
                *(uint4 *)(V + off) = make_uint4(0, 0, 0, 0);
            }
        }
        asm volatile("cp.async.commit_group;");
    };

    float o[16][4], sc[16][4];
#pragma unroll
    for (int i = 0; i < 16; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[i][e] = sc[i][e] = 0.f;
    float mr[2] = {-INFINITY, -INFINITY}, lr[2] = {0.f, 0.f};
    const unsigned qa = sm_a + wg * (WG_Q_BYTES / 2);

    load(kb0, 0);
    int st = 0;
    for (int kb = kb0; kb < kb1; kb += 2, st ^= 1) {
        asm volatile("cp.async.wait_group 0;");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads(); /* this tile is in; both warpgroups are done with the other stage */
        if (kb + 2 < kb1) load(kb + 2, st ^ 1);
        const unsigned ka = sm_a + WG_Q_BYTES + st * 2 * WG_T_BYTES, va = ka + WG_T_BYTES;

        wg_fence();
        wg2_scores(sc, qa, ka);
        wg_commit();
        wg_wait0();
        wg_keep(sc);

        /* scale (log2 domain) and mask, then the online softmax of rows
         * qr0 (e < 2) and qr0 + 8 (e >= 2) */
        const int key0 = kb * FA_BN;
        if (key0 + WG_BN - 1 > p_lo || key0 + WG_BN > k_end) {
#pragma unroll
            for (int j = 0; j < 16; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = key0 + j * 8 + 2 * t4 + (e & 1);
                    sc[j][e] = key < k_end && key <= (e < 2 ? p0 : p1) ? sc[j][e] * sl2 : -INFINITY;
                }
        } else {
#pragma unroll
            for (int j = 0; j < 16; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) sc[j][e] *= sl2;
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 16; j++) mx0 = fmaxf(mx0, fmaxf(sc[j][0], sc[j][1])), mx1 = fmaxf(mx1, fmaxf(sc[j][2], sc[j][3]));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1)), mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1)), mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(mr[0], mx0), mn1 = fmaxf(mr[1], mx1);
        /* a split chunk may start past a row's position: m stays -inf there
         * and 0 is subtracted (p = 0, l = 0) */
        const float b0 = SPLIT && mn0 == -INFINITY ? 0.f : mn0, b1 = SPLIT && mn1 == -INFINITY ? 0.f : mn1;
        const float a0 = exp2f(mr[0] - b0), a1 = exp2f(mr[1] - b1);
        float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            sc[j][0] = exp2f(sc[j][0] - b0), sc[j][1] = exp2f(sc[j][1] - b0);
            sc[j][2] = exp2f(sc[j][2] - b1), sc[j][3] = exp2f(sc[j][3] - b1);
            ls0 += sc[j][0] + sc[j][1], ls1 += sc[j][2] + sc[j][3];
        }
        ls0 += __shfl_xor_sync(0xffffffffu, ls0, 1), ls0 += __shfl_xor_sync(0xffffffffu, ls0, 2);
        ls1 += __shfl_xor_sync(0xffffffffu, ls1, 1), ls1 += __shfl_xor_sync(0xffffffffu, ls1, 2);
        lr[0] = lr[0] * a0 + ls0, lr[1] = lr[1] * a1 + ls1;
        mr[0] = mn0, mr[1] = mn1;
        unsigned pa[8][4];
        wg2_pack(pa, sc);
#pragma unroll
        for (int j = 0; j < 16; j++) o[j][0] *= a0, o[j][1] *= a0, o[j][2] *= a1, o[j][3] *= a1;

        wg_fence();
        wg2_pv(o, pa, va);
        wg_commit();
        wg_wait0();
        wg_keep(o);
    }
    if (SPLIT && ent[4] >= 0) {
        const int j0 = ent[4], sp = ent[5], n_sp = ent[6];
        flash_part_store<D>(part, j0 + sp, n_head, h0 + wg, x, o, mr, lr);
        if (!flash_group_last(done, j0 * n_head + h0, n_sp)) return;
        flash_part_merge<D>(part, j0, n_sp, n_head, h0 + wg, x, o, lr);
    }
    flash_store_out<D>(out, start, n, n_head, h0 + wg, qr0, t4, o, lr);
#else
    __trap(); /* the host launches this kernel only where the sm_90a code runs */
#endif
}


/*
 * k_flash_wg2: k_flash_wg with FlashAttention-3's schedule. Warpgroups 0
 * and 1 compute (one q head each, as above); warp 8 loads: per 128-key
 * step, lane j asks the copy engine (TMA) for box j of the step's keys:
 * BR = min(P, 64) keys x 64 columns, twice (the two column halves), of K
 * and of V, from 2-d tensor maps over the layer's cache viewed as
 * (n_pages * n_head_kv * P) rows of head_dim, landing in the 128-byte
 * swizzle; lane 0 tells the stage's "full" mbarrier how many bytes to
 * expect. Boxes past the entry's last key are not loaded: the stage keeps
 * what it held (zeroed at the start, then finite cache values), masked
 * like the keys past the entry inside a loaded box (the cache is zeroed
 * when allocated, so never-written slots are finite too). A computing
 * warpgroup waits on "full", and after its P V product arrives on the
 * stage's "empty" mbarrier, which the loader waits on before refilling.
 * No block barrier in the loop; two named barriers make the warpgroups
 * take turns issuing their MMAs, so one's softmax runs under the other's
 * (measured level with letting them run free, KILN_CUDA_FA_PINGPONG=0).
 * Softmax: the scale folds into the exponent's FMA (the max is taken on
 * the raw scores), ex2.approx.ftz, the row sums stay per thread until the
 * end, and O is rescaled only when some row's max moved. The loader warp
 * returns when its loads are issued; the computing warps meet at named
 * barrier 5 for the split merge.
 *
 * OVL (long tiles, cu_begin's fa_ovl_run): also the in-warpgroup overlap.
 * A warpgroup issues S of step i + 1 and then P V of step i, waits for S
 * alone (wait_group 1), and runs step i + 1's softmax while P V of step i
 * is on the tensor cores; then O is rescaled and the new P packed. That
 * holds S, O and P in registers at once (~190 per thread), more than the
 * 168 a 288-thread block gets (three warps share a scheduler's 16K): the
 * block is 384 threads, and setmaxnreg gives the loader warpgroup 40
 * registers and the computing ones 232 (ptxas honours it only because the
 * loader never reaches the code after the branch).
 * H200, 250 new tokens after 15,750 cached on Qwen3-8B: 12.2 ms with the
 * overlap, 12.6 without, 13.7 with the single-thread loader before it.
 */
#define WG2_NS 3
#define WG2_SMEM (WG_Q_BYTES + WG2_NS * 2 * WG_T_BYTES + 1024 + 64)


template <bool SPLIT, bool OVL>
__global__ void __launch_bounds__(OVL ? 384 : 288, 1) k_flash_wg2(bf16 *__restrict__ out, float *__restrict__ part, int *__restrict__ done,
                                                      const bf16 *__restrict__ q, const __grid_constant__ CUtensorMap kmap,
                                                      const __grid_constant__ CUtensorMap vmap, const int *__restrict__ tiles,
                                                      const int *__restrict__ seq, const int *__restrict__ pages, int n_head,
                                                      int nkv, int P, int ps, float sl2, int pp) {
#ifdef KILN_WGMMA
    constexpr int D = 128;
    pdl_wait();
    extern __shared__ uint4 smem_u4[];
    char *sm = (char *)(((uintptr_t)smem_u4 + 1023) & ~(uintptr_t)1023);
    const unsigned sm_a = (unsigned)__cvta_generic_to_shared(sm);
    const unsigned bar_full = sm_a + WG_Q_BYTES + WG2_NS * 2 * WG_T_BYTES, bar_empty = bar_full + 8 * WG2_NS;
    const int *ent = tiles + FA_ENT * blockIdx.x, h0 = blockIdx.y * 2, kh = h0 / (n_head / nkv);
    const struct flash_ent F = flash_entry<SPLIT>(tiles, seq);
    const int m0 = F.m0, start = F.start, n = F.n, n_past = F.n_past, poff = F.poff;
    const int kb0 = F.kb0, kb1 = F.kb1, k_end = F.k_end;
    const int tid = threadIdx.x, wg = tid >> 7, x = tid & 127, warp = x >> 5, lane = x & 31, g = lane >> 2, t4 = lane & 3;
    const int qr0 = m0 + warp * 16 + g;
    const int n_step = (kb1 - kb0 + 1) / 2;
    if (tid == 0) {
        for (int i = 0; i < WG2_NS; i++) mbar_init(bar_full + 8 * i, 1), mbar_init(bar_empty + 8 * i, 256);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    /* the stages start zeroed (a box that is never loaded keeps finite
     * values under its masked keys) */
    for (int i = tid; i < WG2_NS * 2 * WG_T_BYTES / 16; i += blockDim.x)
        ((uint4 *)(sm + WG_Q_BYTES))[i] = make_uint4(0, 0, 0, 0);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();

    float o[16][4], lr[2] = {0.f, 0.f};
    if (wg == 2) {
        if (OVL) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (warp == 0) { /* warp 8: lane j loads box j of each step (at most 16) */
            const int BR = P < 64 ? P : 64;
            for (int i = 0; i < n_step; i++) {
                const int st = i % WG2_NS, key0 = (kb0 + 2 * i) * FA_BN, tk = key0 + lane * BR;
                /* the page first: its load overlaps the wait */
                const int row = lane * BR < WG_BN && tk < k_end ? pages[poff + (tk >> ps)] : -1;
                if (i >= WG2_NS) mbar_wait(bar_empty + 8 * st, (i / WG2_NS - 1) & 1);
                const unsigned nb = __popc(__ballot_sync(0xffffffffu, row >= 0));
                const unsigned K = sm_a + WG_Q_BYTES + st * 2 * WG_T_BYTES, V = K + WG_T_BYTES, full = bar_full + 8 * st;
                if (lane == 0) mbar_arrive_tx(full, nb * BR * D * 2 * 2);
                __syncwarp();
                if (row >= 0) {
                    const int r = (row * nkv + kh) * P + (tk & (P - 1));
                    const unsigned off = lane * BR * 128;
                    tma_load_2d(K + off, &kmap, 0, r, full);
                    tma_load_2d(K + WG_BN * 128 + off, &kmap, 64, r, full);
                    tma_load_2d(V + off, &vmap, 0, r, full);
                    tma_load_2d(V + WG_BN * 128 + off, &vmap, 64, r, full);
                }
            }
        }
        return; /* the consumers finish on their own (named barrier 5), so the
                 * loader's registers are never needed again */
    } else {
        if (OVL) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        /* this warpgroup's Q (rows past n repeat row n - 1) */
        for (int i = x; i < FA_BM * 16; i += 128) {
            const int r = i >> 4, c = i & 15;
            cp_async16(sm + wg * (WG_Q_BYTES / 2) + swz(r, c, FA_BM),
                       q + ((size_t)(start + min(m0 + r, n - 1)) * n_head + h0 + wg) * D + c * 8);
        }
        asm volatile("cp.async.commit_group;");
        asm volatile("cp.async.wait_group 0;");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        bar_sync(3 + wg, 128);
        const int p0 = n_past + qr0, p1 = p0 + 8, p_lo = n_past + m0;
        const unsigned qa = sm_a + wg * (WG_Q_BYTES / 2);
        float sc[16][4], mr[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int i = 0; i < 16; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[i][e] = sc[i][e] = 0.f;
        if (!OVL) {
            for (int i = 0; i < n_step; i++) {
                const int st = i % WG2_NS;
                const unsigned ka = sm_a + WG_Q_BYTES + st * 2 * WG_T_BYTES;
                mbar_wait(bar_full + 8 * st, (i / WG2_NS) & 1);
                if (pp && (wg == 1 || i > 0)) bar_sync(1 + wg, 256); /* my turn: the other issued its step before */
                wg_fence();
                wg2_scores(sc, qa, ka);
                wg_commit();
                if (pp && (wg == 0 || i + 1 < n_step)) bar_arrive(2 - wg, 256); /* the other's turn */
                wg_wait0();
                wg_keep(sc);
                float a0, a1;
                wg2_softmax<SPLIT>(sc, mr, lr, a0, a1, (kb0 + 2 * i) * FA_BN, p_lo, k_end, p0, p1, t4, sl2);
                unsigned pa[8][4];
                wg2_pack(pa, sc);
                wg2_rescale(o, a0, a1);
                wg_fence();
                wg2_pv(o, pa, ka + WG_T_BYTES);
                wg_commit();
                wg_wait0();
                wg_keep(o);
                mbar_arrive(bar_empty + 8 * st);
            }
        } else if (n_step > 0) {
            /* in-warpgroup overlap: the launch unit u issues S of step u
             * and P V of step u - 1; S of step u is waited for alone
             * (wait_group 1) and its softmax runs while P V of step u - 1
             * is on the tensor cores; then O is rescaled and P packed. The
             * turn-taking covers units 0 .. n_step. */
            unsigned pa[8][4];
            mbar_wait(bar_full, 0);
            if (pp && wg == 1) bar_sync(2, 256);
            wg_fence();
            wg2_scores(sc, qa, sm_a + WG_Q_BYTES);
            wg_commit();
            if (pp) bar_arrive(2 - wg, 256);
            wg_wait0();
            wg_keep(sc);
            {
                float a0, a1; /* O is still zero: nothing to rescale */
                wg2_softmax<SPLIT>(sc, mr, lr, a0, a1, kb0 * FA_BN, p_lo, k_end, p0, p1, t4, sl2);
            }
            wg2_pack(pa, sc);
            for (int i = 0; i + 1 < n_step; i++) { /* units 1 .. n_step - 1 */
                const int st = i % WG2_NS, s1 = (i + 1) % WG2_NS;
                mbar_wait(bar_full + 8 * s1, ((i + 1) / WG2_NS) & 1);
                if (pp) bar_sync(1 + wg, 256);
                wg_fence();
                wg2_scores(sc, qa, sm_a + WG_Q_BYTES + s1 * 2 * WG_T_BYTES);
                wg_commit();
                wg2_pv(o, pa, sm_a + WG_Q_BYTES + st * 2 * WG_T_BYTES + WG_T_BYTES);
                wg_commit();
                if (pp) bar_arrive(2 - wg, 256);
                wg_wait1();
                wg_keep(sc);
                float a0, a1;
                wg2_softmax<SPLIT>(sc, mr, lr, a0, a1, (kb0 + 2 * (i + 1)) * FA_BN, p_lo, k_end, p0, p1, t4, sl2);
                wg_wait0();
                wg_keep(o);
                mbar_arrive(bar_empty + 8 * st);
                wg2_rescale(o, a0, a1);
                wg2_pack(pa, sc);
            }
            { /* unit n_step: the last P V */
                const int st = (n_step - 1) % WG2_NS;
                if (pp) bar_sync(1 + wg, 256);
                wg_fence();
                wg2_pv(o, pa, sm_a + WG_Q_BYTES + st * 2 * WG_T_BYTES + WG_T_BYTES);
                wg_commit();
                if (pp && wg == 0) bar_arrive(2, 256);
                wg_wait0();
                wg_keep(o);
                mbar_arrive(bar_empty + 8 * st);
            }
        }
        lr[0] += __shfl_xor_sync(0xffffffffu, lr[0], 1), lr[0] += __shfl_xor_sync(0xffffffffu, lr[0], 2);
        lr[1] += __shfl_xor_sync(0xffffffffu, lr[1], 1), lr[1] += __shfl_xor_sync(0xffffffffu, lr[1], 2);
        if (SPLIT && ent[4] >= 0) {
            const int j0 = ent[4], n_sp = ent[6];
            flash_part_store<D>(part, j0 + ent[5], n_head, h0 + wg, x, o, mr, lr);
            if (!flash_group_last(done, j0 * n_head + h0, n_sp, 5, 256)) return;
            flash_part_merge<D>(part, j0, n_sp, n_head, h0 + wg, x, o, lr);
        }
        flash_store_out<D>(out, start, n, n_head, h0 + wg, qr0, t4, o, lr);
    }
#else
    __trap();
#endif
}

/* a 2-d tensor map over one layer's K or V cache: rows of head_dim 128
 * bf16 (n_pages * n_head_kv * P of them), boxes of min(P, 64) rows x 64
 * columns in the 128-byte swizzle */
static bool wg_tensor_map(CUtensorMap *m, const void *base, const struct kv_cache *kv) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    if (!encode) {
        cudaDriverEntryPointQueryResult q;
        void *f = NULL;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !f) {
            cudaGetLastError();
            return false;
        }
        encode = (PFN_cuTensorMapEncodeTiled_v12000)f;
    }
    const cuuint64_t dims[2] = {128, (cuuint64_t)kv->n_pages * kv->n_head_kv * kv->page_size};
    const cuuint64_t strides[1] = {128 * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)(kv->page_size < 64 ? kv->page_size : 64)}, es[2] = {1, 1};
    return encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* 1 when this GPU runs the kernel's sm_90a code and KILN_CUDA_FA_WG is not 0 */
int cu_flash_wg_ok(void) {
    static int ok = -1;
    if (ok < 0) {
        int dev = 0, major = 0;
        cudaFuncAttributes fa;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        ok = major == 9 && cudaFuncGetAttributes(&fa, k_flash_wg<false>) == cudaSuccess && fa.ptxVersion >= 90;
        cudaGetLastError();
        if (ok) {
            CUDA_CHECK(cudaFuncSetAttribute(k_flash_wg<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM));
            CUDA_CHECK(cudaFuncSetAttribute(k_flash_wg<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM));
            CUDA_CHECK(cudaFuncSetAttribute(k_flash_wg2<false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG2_SMEM));
            CUDA_CHECK(cudaFuncSetAttribute(k_flash_wg2<true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG2_SMEM));
            CUDA_CHECK(cudaFuncSetAttribute(k_flash_wg2<false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG2_SMEM));
            CUDA_CHECK(cudaFuncSetAttribute(k_flash_wg2<true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG2_SMEM));
        }
    }
    const char *e = getenv("KILN_CUDA_FA_WG");
    return ok && !(e && !strcmp(e, "0"));
}

void cu_flash_wg_launch(struct cuda_ctx *c, bf16 *out, const bf16 *q, const struct kv_cache *kv, int layer, int n_head,
                        float sl2, float *part, int *cnt) {
    const dim3 grid((unsigned)c->n_fa_tiles, (unsigned)(n_head / 2));
    const bf16 *kc = (const bf16 *)kv->k[layer], *vc = (const bf16 *)kv->v[layer];
    const char *e = getenv("KILN_CUDA_FA_WG");
    const int P = kv->page_size;
    CUtensorMap km, vm;
    if (!(e && !strcmp(e, "1")) && P >= 8 && !(P & (P - 1)) && wg_tensor_map(&km, kc, kv) && wg_tensor_map(&vm, vc, kv)) {
        int ps = 0;
        while ((1 << ps) < P) ps++;
        const char *pe = getenv("KILN_CUDA_FA_PINGPONG");
        const int pp = !(pe && *pe == '0');
        const int ovl = c->fa_ovl_run;
        /* the four instances take the same arguments */
        decltype(&k_flash_wg2<true, true>) k =
            part ? (ovl ? k_flash_wg2<true, true> : k_flash_wg2<true, false>)
                 : (ovl ? k_flash_wg2<false, true> : k_flash_wg2<false, false>);
        cu_launch(c->stream, k, grid, ovl ? 384 : 288, WG2_SMEM, out, part, cnt, q, km, vm, (const int *)c->fa_tiles,
                  (const int *)c->d_seq, (const int *)c->d_pages, n_head, kv->n_head_kv, P, ps, sl2, pp);
        CU_LAUNCHED();
        return;
    }
    if (part)
        cu_launch(c->stream, k_flash_wg<true>, grid, 256, WG_SMEM, out, part, cnt, q, kc, vc, (const int *)c->fa_tiles,
                  (const int *)c->d_seq, (const int *)c->d_pages, n_head, kv->n_head_kv, kv->page_size, sl2);
    else
        cu_launch(c->stream, k_flash_wg<false>, grid, 256, WG_SMEM, out, part, cnt, q, kc, vc, (const int *)c->fa_tiles,
                  (const int *)c->d_seq, (const int *)c->d_pages, n_head, kv->n_head_kv, kv->page_size, sl2);
    CU_LAUNCHED();
}
