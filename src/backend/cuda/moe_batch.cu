/*
 * moe_batch.cu: the MoE FFN of a small batch of tokens (batched decode, a
 * short prompt), expert by expert, without the host.
 *
 * Decode's direct path (gemm.cu k_moe_gate_up / k_moe_down_r) streams the
 * chosen expert once per routed (token, slot): two tokens that pick the same
 * expert read it twice. At 16 tokens of Qwen3-30B-A3B (top-8 of 128) the 128
 * pairs name ~81 experts, and at 32 tokens 256 pairs ~111: most of the reads
 * would be repeats. The prefill path reads each expert once but learns the
 * per-expert row counts on the host (a sync per layer, no CUDA graph) and
 * runs GEMM kernels built for hundreds of rows. Here each expert with routed
 * rows is read once, by kernels whose grids are sized for the worst case
 * and whose blocks look their expert up on the device:
 *
 *   k_moe_sort   one block: the routed pairs grouped by expert (counts by
 *                shared atomics, a block scan for the offsets), the used
 *                experts listed in id order with their first slot and count
 *   k_moe_gu_e   block (row block b, used expert y): 8 warps, a warp per
 *                row r of the expert's gate and up (MOE_RG rows in turn),
 *                streamed once; for each
 *                of the expert's tokens (TG at a time) the two dots, then
 *                h[slot][r] = silu(g . x) * (u . x) rounded to bf16
 *   k_moe_dn_e   block (row block b, used expert y): a warp per row of the
 *                expert's down (MOE_RD rows in turn), streamed once; y[slot][r] = down_r . h[slot]
 *                in f32
 *   k_combine    (moe_combine.cuh) block per (token, slice of d): out[i]
 *                = sum_k wsel[i][k] y[pos[i K + k]] in slot order, y in
 *                f32, rounded once (as the direct path rounds)
 *
 * A layer's 4-bit kinds (moe_w4.cu) take k_moe_w4 in place of k_moe_gu_e /
 * k_moe_dn_e over the same grouping, up to cuda_ctx.moe_w4_batch tokens;
 * with `pairs` (one token, both kinds 4-bit) there is no grouping at all.
 *
 * Measured on an H100 (Qwen3-30B-A3B, `kiln bench --profile batch`, 256
 * tokens in, ms per decode step; this path against the grouped GEMMs it
 * replaces): 9 tokens 17.2 -> 14.5, 16 23.1 -> 21.1, 24 29.6 -> 27.6, 32
 * 32.9 -> 32.4, but 48 39.2 -> 42.2 and 64 43.4 -> 51.8, so MOE_BATCH_MAX
 * is 32. Below 9 tokens the direct path is as fast or faster (8: 13.8
 * against 14.3). These step times carry ~1.5-13 ms of a bench artefact
 * (prompts then prefilled one at a time, the waits counted as decode;
 * docs/benchmarks.md, forty-fifth session), the same in both figures of a
 * pair. The kernels reach ~2-2.3 TB/s of the experts' bytes, not the
 * card's ~3.3: not profiled yet.
 *
 * The order of an expert's slots (atomics) does not change any result: a
 * slot's dots depend only on its own token. A used expert's blocks exit at
 * once when y >= the used count, so a grid of min(E, n K) experts costs
 * little where few are used.
 */
#include "backend/cuda/cuda.cuh"
#include "backend/cuda/moe_combine.cuh"
#include "backend/cuda/stream.cuh"

/* tokens whose dots a warp accumulates in one pass over a weight row */
#define MOE_TG 8
/* 16-byte weight chunks per lane loaded before their dots */
#define MOE_U 4
/* rows per warp: gate/up (dim-long rows), down (ffn-long rows) */
#define MOE_RG 2
#define MOE_RD 8

/*
 * k_moe_sort: one block of 1024 threads (E <= 1024, nk <= 32768).
 * pos[j]: pair j's slot; pslot[slot] = j; for used expert y (in id order):
 * ue[y] = its id, uo[y] = its first slot, uc[y] = its count; *nu = how many.
 */
__global__ void __launch_bounds__(1024) k_moe_sort(int *__restrict__ pos, int *__restrict__ pslot, int *__restrict__ ue,
                                                   int *__restrict__ uo, int *__restrict__ uc, int *__restrict__ nu,
                                                   const int *__restrict__ sel, int nk, int E) {
    KTRACE();
    __shared__ int cnt[CU_MOE_MAX_EXPERTS], off[CU_MOE_MAX_EXPERTS], wsum[2][32];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    for (int e = t; e < E; e += blockDim.x) cnt[e] = 0;
    pdl_wait();
    __syncthreads();
    for (int j = t; j < nk; j += blockDim.x) pos[j] = atomicAdd(&cnt[sel[j]], 1); /* rank within the expert */
    __syncthreads();
    /* exclusive scans of the counts and of "used", thread t = expert t */
    const int v = t < E ? cnt[t] : 0, u = v > 0;
    int sv = v, su = u;
    for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(0xffffffffu, sv, o), b = __shfl_up_sync(0xffffffffu, su, o);
        if (lane >= o) sv += a, su += b;
    }
    if (lane == 31) wsum[0][warp] = sv, wsum[1][warp] = su;
    __syncthreads();
    if (warp == 0) {
        int a = wsum[0][lane], b = wsum[1][lane];
        for (int o = 1; o < 32; o <<= 1) {
            const int a2 = __shfl_up_sync(0xffffffffu, a, o), b2 = __shfl_up_sync(0xffffffffu, b, o);
            if (lane >= o) a += a2, b += b2;
        }
        wsum[0][lane] = a, wsum[1][lane] = b; /* inclusive over warps */
    }
    __syncthreads();
    const int ov = sv - v + (warp ? wsum[0][warp - 1] : 0), ou = su - u + (warp ? wsum[1][warp - 1] : 0);
    if (t < E) {
        off[t] = ov;
        if (u) ue[ou] = t, uo[ou] = ov, uc[ou] = v;
    }
    if (t == 0) *nu = wsum[1][31];
    __syncthreads();
    for (int j = t; j < nk; j += blockDim.x) {
        const int s = off[sel[j]] + pos[j];
        pos[j] = s, pslot[s] = j;
    }
}

/* k_moe_gu_e: see the file's comment. Grid (ceil(ffn / (8 MOE_RG)),
 * min(E, nk)): warp w of block b takes rows b 8 + w + j 8 gridDim.x, so its
 * few dependent loads (the used count, the expert, its slots) are paid once
 * for MOE_RG rows. */
__global__ void __launch_bounds__(256) k_moe_gu_e(bf16 *__restrict__ h, const bf16 *__restrict__ x, const int *__restrict__ pslot,
                                                  const int *__restrict__ ue, const int *__restrict__ uo, const int *__restrict__ uc,
                                                  const int *__restrict__ nu, const bf16 *const *__restrict__ gate,
                                                  const bf16 *const *__restrict__ up, int K, int ffn, int dim) {
    KTRACE();
    pdl_wait();
    const int y = blockIdx.y, lane = threadIdx.x & 31;
    const int nuv = *nu, e = ue[y], o = uo[y], cnt = uc[y]; /* independent loads; ue/uo/uc past nu are stale, unused */
    if (y >= nuv) return;
    const bf16 *gb = gate[e], *ubp = up[e];
    const int nch = dim >> 3;
    for (int r = blockIdx.x * 8 + (threadIdx.x >> 5); r < ffn; r += gridDim.x * 8) {
        const uint4 *g = (const uint4 *)(gb + (size_t)r * dim), *u = (const uint4 *)(ubp + (size_t)r * dim);
        for (int t0 = 0; t0 < cnt; t0 += MOE_TG) {
            const int nt = min(MOE_TG, cnt - t0);
            const uint4 *xv[MOE_TG];
            float ag[MOE_TG], au[MOE_TG];
#pragma unroll
            for (int t = 0; t < MOE_TG; t++) {
                xv[t] = (const uint4 *)(x + (size_t)(pslot[o + t0 + min(t, nt - 1)] / K) * dim);
                ag[t] = au[t] = 0.f;
            }
            for (int c0 = lane; c0 < nch; c0 += 32 * MOE_U) {
                uint4 gw[MOE_U] = {}, uw[MOE_U] = {}; /* MOE_U chunks of both rows in flight before any dot */
#pragma unroll
                for (int v = 0; v < MOE_U; v++)
                    if (c0 + 32 * v < nch) gw[v] = ld_stream(g + c0 + 32 * v), uw[v] = ld_stream(u + c0 + 32 * v);
#pragma unroll
                for (int v = 0; v < MOE_U; v++)
                    if (c0 + 32 * v < nch)
#pragma unroll
                        for (int t = 0; t < MOE_TG; t++)
                            if (t < nt) {
                                const uint4 xx = __ldg(xv[t] + c0 + 32 * v);
                                ag[t] = dot8(ag[t], gw[v], xx), au[t] = dot8(au[t], uw[v], xx);
                            }
            }
#pragma unroll
            for (int t = 0; t < MOE_TG; t++)
                if (t < nt) {
                    const float a = warp_sum(ag[t]), b = warp_sum(au[t]);
                    if (lane == 0) h[(size_t)(o + t0 + t) * ffn + r] = __float2bfloat16(silu(a) * b);
                }
        }
    }
}

/* k_moe_dn_e: see the file's comment. Grid (ceil(dim / (8 MOE_RD)),
 * min(E, nk)), rows per warp as k_moe_gu_e. */
__global__ void __launch_bounds__(256) k_moe_dn_e(float *__restrict__ yo, const bf16 *__restrict__ h, const int *__restrict__ ue,
                                                  const int *__restrict__ uo, const int *__restrict__ uc, const int *__restrict__ nu,
                                                  const bf16 *const *__restrict__ down, int ffn, int dim) {
    KTRACE();
    pdl_wait();
    const int y = blockIdx.y, lane = threadIdx.x & 31;
    const int nuv = *nu, e = ue[y], o = uo[y], cnt = uc[y];
    if (y >= nuv) return;
    const bf16 *db = down[e];
    const int nch = ffn >> 3;
    for (int r = blockIdx.x * 8 + (threadIdx.x >> 5); r < dim; r += gridDim.x * 8) {
        const uint4 *d = (const uint4 *)(db + (size_t)r * ffn);
        for (int t0 = 0; t0 < cnt; t0 += MOE_TG) {
            const int nt = min(MOE_TG, cnt - t0);
            float acc[MOE_TG];
            const uint4 *hv[MOE_TG];
#pragma unroll
            for (int t = 0; t < MOE_TG; t++) acc[t] = 0.f, hv[t] = (const uint4 *)(h + (size_t)(o + t0 + min(t, nt - 1)) * ffn);
            for (int c0 = lane; c0 < nch; c0 += 32 * MOE_U) {
                uint4 dw[MOE_U] = {};
#pragma unroll
                for (int v = 0; v < MOE_U; v++)
                    if (c0 + 32 * v < nch) dw[v] = ld_stream(d + c0 + 32 * v);
#pragma unroll
                for (int v = 0; v < MOE_U; v++)
                    if (c0 + 32 * v < nch)
#pragma unroll
                        for (int t = 0; t < MOE_TG; t++)
                            if (t < nt) acc[t] = dot8(acc[t], dw[v], __ldg(hv[t] + c0 + 32 * v));
            }
#pragma unroll
            for (int t = 0; t < MOE_TG; t++)
                if (t < nt) {
                    const float s = warp_sum(acc[t]);
                    if (lane == 0) yo[(size_t)(o + t0 + t) * dim + r] = s;
                }
        }
    }
}

static long batch_runs;
extern "C" long kiln_cuda_moe_batch_count(void);
extern "C" long kiln_cuda_moe_batch_count(void) { return batch_runs; }

/* the scratch's parts, in order, each 256-byte aligned: sorted positions
 * and slots (nk each), the used experts' ids, first slots and counts (E
 * each), their count, h (nk x ffn bf16), the down outputs (nk x dim f32);
 * with base NULL only the total bytes */
struct batch_parts {
    int *pos, *pslot, *ue, *uo, *uc, *nu;
    bf16 *h;
    float *yo;
};
static size_t batch_layout(int n, int K, int E, int ffn, int dim, char *base, struct batch_parts *b) {
    const size_t nk = (size_t)n * K;
    const size_t sizes[8] = {nk * 4, nk * 4, (size_t)E * 4, (size_t)E * 4, (size_t)E * 4, 4, nk * ffn * 2, nk * dim * 4};
    void **parts[8] = {(void **)&b->pos, (void **)&b->pslot, (void **)&b->ue, (void **)&b->uo, (void **)&b->uc, (void **)&b->nu,
                       (void **)&b->h, (void **)&b->yo};
    size_t o = 0;
    for (int i = 0; i < 8; i++) {
        if (base) *parts[i] = base + o;
        o += (sizes[i] + 255) & ~(size_t)255;
    }
    return o;
}

size_t cu_moe_batch_scratch(int n, int K, int E, int ffn, int dim) {
    struct batch_parts b;
    return batch_layout(n, K, E, ffn, dim, NULL, &b);
}

void cu_moe_batch(struct cuda_ctx *c, bf16 *out, const bf16 *x, const int *sel, const float *wsel, const struct cu_moe_tab *tab,
                  int n, int K, int E, int ffn, int dim, void *scratch, int pairs) {
    const size_t nk = (size_t)n * K;
    struct batch_parts b;
    batch_layout(n, K, E, ffn, dim, (char *)scratch, &b);
    if (pairs) { /* 4-bit experts, pair by pair: no grouping; slot j is pair j */
        cu_moe_w4_gate_up(c, tab, b.h, x, NULL, NULL, NULL, NULL, NULL, sel, K, (unsigned)nk);
        cu_moe_w4_down(c, tab, b.yo, b.h, NULL, NULL, NULL, NULL, sel, (unsigned)nk);
        cu_launch(c->stream, k_combine<float>, moe_combine_grid(n, dim), 256, 0, out, (const float *)b.yo, (const int *)NULL, wsel, K, dim);
        CU_LAUNCHED();
        return;
    }
    const unsigned ny = (unsigned)(nk < (size_t)E ? nk : (size_t)E);
    cu_launch(c->stream, k_moe_sort, 1, 1024, 0, b.pos, b.pslot, b.ue, b.uo, b.uc, b.nu, sel, (int)nk, E);
    CU_LAUNCHED();
    if (tab->w4[0].on) { /* 4-bit experts (moe_w4.cu) */
        cu_moe_w4_gate_up(c, tab, b.h, x, b.pslot, b.ue, b.uo, b.uc, b.nu, sel, K, ny);
    } else {
        cu_launch(c->stream, k_moe_gu_e, dim3((unsigned)((ffn + 8 * MOE_RG - 1) / (8 * MOE_RG)), ny), 256, 0, b.h, x, b.pslot, b.ue,
                  b.uo, b.uc, b.nu, tab->gate, tab->up, K, ffn, dim);
        CU_LAUNCHED();
    }
    if (tab->w4[2].on) {
        cu_moe_w4_down(c, tab, b.yo, b.h, b.ue, b.uo, b.uc, b.nu, sel, ny);
    } else {
        cu_launch(c->stream, k_moe_dn_e, dim3((unsigned)((dim + 8 * MOE_RD - 1) / (8 * MOE_RD)), ny), 256, 0, b.yo, b.h, b.ue, b.uo,
                  b.uc, b.nu, tab->down, ffn, dim);
        CU_LAUNCHED();
    }
    cu_launch(c->stream, k_combine<float>, moe_combine_grid(n, dim), 256, 0, out, (const float *)b.yo, b.pos, wsel, K, dim);
    CU_LAUNCHED();
    batch_runs++;
}
