/*
 * flash.cuh: what the two prefill attention kernels share (attention.cu's
 * k_flash on mma.sync, flash_wg.cu's k_flash_wg on wgmma): the copy and
 * packing helpers, and the split-KV partial slots.
 *
 * Both kernels give a thread the same piece of a head's 64-row tile: with
 * x = the thread's index among the head's 128 threads, warp w = x / 32,
 * g = (x % 32) / 4, t = x % 4, it holds rows 16w + g and 16w + g + 8, and
 * per 8-column chunk dt of the D-wide output the columns 8dt + 2t, +1 of
 * both rows: o[dt][0..1] row 16w + g, o[dt][2..3] row 16w + g + 8 (the
 * m16n8 accumulator layout of mma.sync, which wgmma's m64 layout repeats
 * per warp). A split entry stores (o, m, l) thread-major to its slot, and
 * the group's last block merges the slots in slot order; the slot format
 * is therefore the same for both kernels.
 */
#ifndef KILN_FLASH_CUH
#define KILN_FLASH_CUH

#include "backend/cuda/cuda.cuh"

/* A flash block's entry (blockIdx.x; cuda.cuh, fa[] in the batch meta): its
 * sequence's rows start .. start + n of the batch come after n_past cached
 * keys, page table at poff; the tile's first row m0 (within the sequence);
 * the key blocks [kb0, kb1) it walks (its split's with SPLIT, else every
 * block up to the tile's last key, kv_end); keys at or past k_end belong to
 * another split or to nobody. */
struct flash_ent {
    int m0, start, n, n_past, poff, kv_end, kb0, kb1, k_end;
};

template <bool SPLIT>
__device__ __forceinline__ struct flash_ent flash_entry(const int *tiles, const int *seq) {
    const int *ent = tiles + FA_ENT * blockIdx.x;
    const int s = ent[0];
    struct flash_ent f;
    f.m0 = ent[1], f.start = seq[4 * s], f.n = seq[4 * s + 1], f.n_past = seq[4 * s + 2], f.poff = seq[4 * s + 3];
    f.kv_end = f.n_past + min(f.m0 + FA_BM, f.n);
    f.kb0 = SPLIT ? ent[2] : 0, f.kb1 = SPLIT ? ent[3] : (f.kv_end + FA_BN - 1) / FA_BN;
    f.k_end = min(f.kv_end, f.kb1 * FA_BN);
    return f;
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(src));
}

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    unsigned u;
    memcpy(&u, &h, 4);
    return u;
}

/* floats per thread in a partial slot: o, m[2], l[2] */
#define FA_PE(D) ((D) / 2 + 4)

/* (o, m, l) of one head's thread x to slot `slot` of head h */
template <int D>
__device__ __forceinline__ void flash_part_store(float *part, int slot, int n_head, int h, int x, const float (&o)[D / 8][4],
                                                 const float *m, const float *l) {
    float *pp = part + ((size_t)slot * n_head + h) * FA_PE(D) * 128 + x;
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) pp[(dt * 4 + e) * 128] = o[dt][e];
    pp[(D / 2) * 128] = m[0], pp[(D / 2 + 1) * 128] = m[1];
    pp[(D / 2 + 2) * 128] = l[0], pp[(D / 2 + 3) * 128] = l[1];
}

/* the merge of slots j0 .. j0 + n_sp - 1 of head h into (o, l), in slot
 * order (the result does not depend on which block came last):
 * M = max m_i, L = sum w_i l_i, O = sum w_i O_i, w_i = 2^(m_i - M), 0 for a
 * chunk the row saw no key of */
template <int D>
__device__ __forceinline__ void flash_part_merge(const float *part, int j0, int n_sp, int n_head, int h, int x,
                                                 float (&o)[D / 8][4], float *l) {
    const size_t stride = (size_t)n_head * FA_PE(D) * 128;
    const float *pg = part + (size_t)j0 * stride + (size_t)h * FA_PE(D) * 128 + x;
    float M0 = -INFINITY, M1 = -INFINITY;
    for (int i = 0; i < n_sp; i++)
        M0 = fmaxf(M0, __ldcg(pg + i * stride + (D / 2) * 128)), M1 = fmaxf(M1, __ldcg(pg + i * stride + (D / 2 + 1) * 128));
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    l[0] = l[1] = 0.f;
    for (int i = 0; i < n_sp; i++) {
        const float *pi = pg + i * stride;
        const float m_0 = __ldcg(pi + (D / 2) * 128), m_1 = __ldcg(pi + (D / 2 + 1) * 128);
        const float w0 = m_0 == -INFINITY ? 0.f : exp2f(m_0 - M0), w1 = m_1 == -INFINITY ? 0.f : exp2f(m_1 - M1);
        l[0] += w0 * __ldcg(pi + (D / 2 + 2) * 128), l[1] += w1 * __ldcg(pi + (D / 2 + 3) * 128);
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            o[dt][0] += w0 * __ldcg(pi + (dt * 4 + 0) * 128), o[dt][1] += w0 * __ldcg(pi + (dt * 4 + 1) * 128);
            o[dt][2] += w1 * __ldcg(pi + (dt * 4 + 2) * 128), o[dt][3] += w1 * __ldcg(pi + (dt * 4 + 3) * 128);
        }
    }
}

/* the split group's counter: true in the last of the group's blocks to get
 * here (which also zeroes the counter for the next launch). Every thread of
 * the block calls it after storing its slot; or, with bar > 0, threads
 * 0 .. nthr - 1 only, meeting at named barrier `bar`. */
__device__ __forceinline__ void flash_bar(int bar, int nthr) {
    if (bar) asm volatile("bar.sync %0, %1;" ::"r"(bar), "r"(nthr) : "memory");
    else __syncthreads();
}
__device__ __forceinline__ bool flash_group_last(int *done, int idx, int n_sp, int bar = 0, int nthr = 0) {
    __shared__ int last;
    __threadfence();
    flash_bar(bar, nthr);
    if (threadIdx.x == 0) {
        last = atomicAdd(&done[idx], 1) == n_sp - 1;
        if (last) done[idx] = 0; /* every block of the group has counted */
    }
    flash_bar(bar, nthr);
    if (last) __threadfence();
    return last;
}

/* rows r0 and r0 + 8 of o / l to out (rows at or past n are not written) */
template <int D>
__device__ __forceinline__ void flash_store_out(bf16 *out, int start, int n, int n_head, int h, int qr0, int t4,
                                                const float (&o)[D / 8][4], const float *l) {
    const int qr1 = qr0 + 8;
    const float i0 = 1.f / l[0], i1 = 1.f / l[1];
    bf16 *o0 = out + ((size_t)(start + qr0) * n_head + h) * D, *o1 = out + ((size_t)(start + qr1) * n_head + h) * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
        if (qr0 < n) *(unsigned *)(o0 + dt * 8 + 2 * t4) = pack_bf16(o[dt][0] * i0, o[dt][1] * i0);
        if (qr1 < n) *(unsigned *)(o1 + dt * 8 + 2 * t4) = pack_bf16(o[dt][2] * i1, o[dt][3] * i1);
    }
}

#endif
