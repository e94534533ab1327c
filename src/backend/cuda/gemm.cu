/*
 * gemm.cu: y = x W^T + b with bf16 weights and activations, f32 accumulation.
 *
 * Three paths, picked by the number of activation rows n:
 *  - n <= 2 (decode; KILN_CUDA_GEMV_ROWS, up to 8): our own GEMV. A step
 *    at batch 1 reads every weight once and does two flops per byte, so it
 *    runs at memory bandwidth or not at all: each lane streams 16-byte weight loads (8 in flight, cache
 *    hint L1::no_allocate so the small x stays in L1), one warp per output row,
 *    split-K across up to 8 warps of a block when the rows are too few to
 *    fill the GPU (k_proj, v_proj, small models).
 *  - 3 <= n <= 16 (batched decode, where n_in % 256 == 0 and n_out % 16
 *    == 0): k_gemv_tc, the same streaming on the tensor cores (mma.sync).
 *  - otherwise (prefill): cuBLAS GemmEx, bf16 in, f32 compute, bf16 (or
 *    f32) out; bias added by a small kernel.
 * The MoE decode path's fused expert GEMVs are here too, since they are the
 * same loop reading expert pointers from a device table.
 */
#include "backend/cuda/cuda.cuh"
#include "backend/cuda/sm90.cuh"
#include "backend/cuda/stream.cuh"

#define GEMV_MAX_ROWS 8

/* a model matmul of at most this many rows takes the GEMV, more take cuBLAS
 * (KILN_CUDA_GEMV_ROWS, 0..8). Measured on the H200 (Qwen3-8B shapes): the
 * GEMV streams the weights once for all its rows, but each weight chunk
 * costs NB dot products read from L1, so by 8 rows it runs at 1.5 TB/s
 * where cuBLAS's tiles stay near 3.5 TB/s (docs/cuda.md) */
int cu_gemv_rows = 2;

template <typename T> __device__ __forceinline__ T to_out(float v);
template <> __device__ __forceinline__ float to_out<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 to_out<bf16>(float v) { return __float2bfloat16(v); }

/* A lane's share of NB dot products between one weight row w and NB
 * activation rows (x, row stride nch 16-byte chunks) over chunks
 * [c, c1) with stride 32. */
template <bool XS> __device__ __forceinline__ uint4 ldx(const uint4 *p) { return XS ? *p : __ldg(p); }

template <int NB, bool XS = false>
__device__ __forceinline__ void row_dots(float *acc, const uint4 *__restrict__ w, const uint4 *__restrict__ x, int nch,
                                         int c, int c1) {
    /* 8 loads in flight per lane: a 4096-wide row split in two is one round
     * trip to DRAM instead of two (ncu: 4096x4096 at 2.2 TB/s with 4) */
    for (; c + 224 < c1; c += 256) {
        uint4 wv[8];
#pragma unroll
        for (int u = 0; u < 8; u++) wv[u] = ld_stream(w + c + 32 * u);
#pragma unroll
        for (int u = 0; u < 8; u++)
#pragma unroll
            for (int j = 0; j < NB; j++) acc[j] = dot8(acc[j], wv[u], ldx<XS>(x + (size_t)j * nch + c + 32 * u));
    }
    for (; c + 96 < c1; c += 128) {
        uint4 wv[4];
#pragma unroll
        for (int u = 0; u < 4; u++) wv[u] = ld_stream(w + c + 32 * u);
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int j = 0; j < NB; j++) acc[j] = dot8(acc[j], wv[u], ldx<XS>(x + (size_t)j * nch + c + 32 * u));
    }
#pragma unroll 3
    for (; c < c1; c += 32) {
        uint4 wv = ld_stream(w + c);
#pragma unroll
        for (int j = 0; j < NB; j++) acc[j] = dot8(acc[j], wv, ldx<XS>(x + (size_t)j * nch + c));
    }
}

/*
 * k_gemv: for each job, out[j][row] = x[j] . W[row] + bias[row], j < NB.
 * Up to 3 jobs that share x (q, k and v; or gate and up) run in one launch:
 * the grid's blocks are dealt to the jobs in order (blk0 = a job's first
 * block). GLU: one job with two weights (gate, up) whose rows are streamed
 * together, writing out = silu(g) * u and out2 = u (both rounded as the
 * separate ops would round them).
 * Decomposition: a block of 8 warps owns 8/ks rows of one job; the ks warps
 * of a row split its n_in/8 chunks into ks contiguous ranges; within a range
 * lane l takes chunks l, l+32, ...; partial sums meet in shared memory.
 * Needs n_in % 8 == 0 and 16-byte aligned rows.
 */
struct gemv_job {
    const bf16 *w, *w2;
    const float *bias, *bias2;
    void *out, *out2;
    int n_out, blk0;
};
struct gemv_jobs {
    struct gemv_job j[3];
    int nj;
};

/*
 * An RMSNorm folded into the GEMV that reads its output (NORM): every block
 * computes out = rmsnorm(x [+ y]) * w for the n rows into shared memory with
 * the exact arithmetic of norm.cu (same chunk ownership, same block sum, so
 * the same bits), runs the GEMV from there, and the last block to finish (an
 * atomic counter, reset by that block) writes x += y and out to global
 * memory, after every block has read them. This removes the norm's launch
 * from a decode layer (gemm.cu cu_flush; cuda.cuh pending norm).
 */
struct gemv_norm {
    bf16 *x, *out;
    const bf16 *y;
    const float *w;
    float eps;
    int *cnt;
};

/* the split-K of a GEMV row over ks warps (part = warp % ks): lane 0 of
 * each leaves its NB (and GLU's) sums in red, and lane 0 of part 0 adds its
 * partners' in warp order; the caller syncs before red is written again */
template <int NB>
__device__ __forceinline__ void ks_sum(float (*red)[2 * NB], float *acc, float *acc2, int ks, int warp, int part, int lane) {
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < NB; j++) red[warp][j] = acc[j], red[warp][NB + j] = acc2[j];
    __syncthreads();
    if (part == 0 && lane == 0)
        for (int p = 1; p < ks; p++)
#pragma unroll
            for (int j = 0; j < NB; j++) acc[j] += red[warp + p][j], acc2[j] += red[warp + p][NB + j];
}

/* L2 prefetch of a lane's first GEMV_PF chunks of a weight row: weights are
 * never written by the previous kernel, so this runs before griddepcontrol.wait
 * and overlaps the previous kernel's tail (the block is resident as soon as
 * a slot frees up). */
#define GEMV_PF 4
__device__ __forceinline__ void prefetch_row(const uint4 *w, int c, int c1) {
#pragma unroll
    for (int u = 0; u < GEMV_PF; u++)
        if (c + 32 * u < c1) asm volatile("prefetch.global.L2 [%0];" ::"l"(w + c + 32 * u));
}

template <int NB, typename OutT, bool GLU, bool NORM>
__global__ void __launch_bounds__(256) k_gemv(const struct gemv_jobs J, const bf16 *__restrict__ x, int n_in, int ks,
                                              const struct gemv_norm N, int pf, int nblk) {
    KTRACE();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nch = n_in >> 3, per = (nch + ks - 1) / ks;
    const int part = warp % ks, c0 = part * per, c1 = min(nch, c0 + per);
    if (pf) {
        const int bid = blockIdx.x;
        const int ji = (J.nj > 2 && bid >= J.j[2].blk0) ? 2 : (J.nj > 1 && bid >= J.j[1].blk0) ? 1 : 0;
        const struct gemv_job jb = ji == 0 ? J.j[0] : ji == 1 ? J.j[1] : J.j[2];
        const int row = (bid - jb.blk0) * (8 / ks) + warp / ks;
        if (row < jb.n_out) {
            prefetch_row((const uint4 *)(jb.w + (size_t)row * n_in), c0 + lane, c1);
            if (GLU) prefetch_row((const uint4 *)(jb.w2 + (size_t)row * n_in), c0 + lane, c1);
        }
    }
    pdl_wait_release();
    extern __shared__ uint4 xs_raw[];
    bf16 *xs = (bf16 *)xs_raw;
    if (NORM) {
        for (int j = 0; j < NB; j++) {
            const bf16 *xr = N.x + (size_t)j * n_in, *yr = N.y ? N.y + (size_t)j * n_in : NULL;
            float ss = 0.f;
            for (int c = threadIdx.x * 8; c < n_in; c += 256 * 8) {
                float a[8];
                cu_load8(a, xr + c);
                if (yr) {
                    float b[8];
                    cu_load8(b, yr + c);
                    for (int i = 0; i < 8; i++) a[i] = __bfloat162float(__float2bfloat16(a[i] + b[i]));
                }
                for (int i = 0; i < 8; i++) ss += a[i] * a[i];
            }
            const float r = rsqrtf(cu_block_sum(ss) / n_in + N.eps);
            for (int c = threadIdx.x * 8; c < n_in; c += 256 * 8) {
                float a[8];
                cu_load8(a, xr + c);
                if (yr) {
                    float b[8];
                    cu_load8(b, yr + c);
                    for (int i = 0; i < 8; i++) a[i] = __bfloat162float(__float2bfloat16(a[i] + b[i]));
                }
                for (int i = 0; i < 8; i++) a[i] = N.w[c + i] * (a[i] * r);
                cu_store8(xs + (size_t)j * n_in + c, a);
            }
        }
        __syncthreads();
    }
    /* without NORM the grid is nblk blocks; with it, at most one wave, each
     * block looping over block indices (fewer norm prologues) */
    for (int bid = blockIdx.x; bid < nblk; bid += gridDim.x) {
    const int ji = (J.nj > 2 && bid >= J.j[2].blk0) ? 2 : (J.nj > 1 && bid >= J.j[1].blk0) ? 1 : 0;
    const struct gemv_job jb = ji == 0 ? J.j[0] : ji == 1 ? J.j[1] : J.j[2];
    const int row = (bid - jb.blk0) * (8 / ks) + warp / ks;
    float acc[NB], acc2[NB];
#pragma unroll
    for (int j = 0; j < NB; j++) acc[j] = acc2[j] = 0.f;
    if (row < jb.n_out) {
        const uint4 *xv = NORM ? (const uint4 *)xs : (const uint4 *)x;
        row_dots<NB, NORM>(acc, (const uint4 *)(jb.w + (size_t)row * n_in), xv, nch, c0 + lane, c1);
        if (GLU) row_dots<NB, NORM>(acc2, (const uint4 *)(jb.w2 + (size_t)row * n_in), xv, nch, c0 + lane, c1);
    }
#pragma unroll
    for (int j = 0; j < NB; j++) {
        acc[j] = warp_sum(acc[j]);
        if (GLU) acc2[j] = warp_sum(acc2[j]);
    }
    __shared__ float red[8][2 * NB];
    if (ks > 1) ks_sum<NB>(red, acc, acc2, ks, warp, part, lane);
    if (part == 0 && lane == 0 && row < jb.n_out) {
        const float b = jb.bias ? jb.bias[row] : 0.f;
        if (!GLU) {
#pragma unroll
            for (int j = 0; j < NB; j++) ((OutT *)jb.out)[(size_t)j * jb.n_out + row] = to_out<OutT>(acc[j] + b);
        } else {
            const float b2 = jb.bias2 ? jb.bias2[row] : 0.f;
#pragma unroll
            for (int j = 0; j < NB; j++) {
                const float g = __bfloat162float(__float2bfloat16(acc[j] + b));
                const bf16 u = __float2bfloat16(acc2[j] + b2);
                ((bf16 *)jb.out)[(size_t)j * jb.n_out + row] = __float2bfloat16(silu(g) * __bfloat162float(u));
                ((bf16 *)jb.out2)[(size_t)j * jb.n_out + row] = u;
            }
        }
    }
    if (ks > 1) __syncthreads(); /* red[] is rewritten by the next iteration */
    }
    if (NORM) {
        /* every block has read x, y and out once it counts itself done */
        __shared__ int last;
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            last = atomicAdd(N.cnt, 1) == (int)gridDim.x - 1;
        }
        __syncthreads();
        if (last) {
            for (int j = 0; j < NB; j++) {
                bf16 *xr = N.x + (size_t)j * n_in, *orow = N.out + (size_t)j * n_in;
                const bf16 *yr = N.y ? N.y + (size_t)j * n_in : NULL;
                for (int c = threadIdx.x * 8; c < n_in; c += 256 * 8) {
                    if (yr) {
                        float a[8], b[8];
                        cu_load8(a, xr + c);
                        cu_load8(b, yr + c);
                        for (int i = 0; i < 8; i++) a[i] = a[i] + b[i];
                        cu_store8(xr + c, a);
                    }
                    *(uint4 *)(orow + c) = *(const uint4 *)(xs + (size_t)j * n_in + c);
                }
            }
            if (threadIdx.x == 0) *N.cnt = 0;
        }
    }
}

/*
 * k_gemv_s: the streaming GEMV, for decode at batch 1-2 (NB rows of x) over
 * large matrices. The jobs' rows are concatenated; a row is n_in/256 steps,
 * a step one 16-byte chunk per lane of a warp (32 chunks, 256 weights; GLU:
 * the same chunk of the gate and of the up row), and steps go in quads of 4
 * (n_in % 1024 == 0, so a row is whole quads). The grid is a fixed number of
 * blocks per SM (cu_gemv_bps), all resident at once; warp g of Wt takes the
 * contiguous quad range [g Q / Wt, (g+1) Q / Wt) of all Q quads and streams
 * it with 8 loads in flight per lane, straight across row boundaries, so no
 * warp idles between rows and there is no second wave (k_gemv's o_proj on
 * Qwen3-8B is 1.3 waves of blocks). The first quads are loaded before
 * griddepcontrol.wait: weights are never written by an earlier kernel.
 * A row inside one warp's range is summed there. A row cut by range ends is
 * summed in pieces: each warp leaves its piece in slot[g][0 if the row is
 * the first of its range, else 1] and bumps cnt[ga] (ga: the warp holding
 * the row's first quad); the last piece to arrive adds the pieces in warp
 * order, writes the row and zeroes the counter. Cut points depend only on
 * the shape and the grid, so results repeat from run to run.
 * Measured on the H200 (docs/cuda.md): Qwen3-8B decode 200 -> 211 tok/s;
 * on small matrices (0.6B's, 30B-A3B's attention) it was first no faster
 * than k_gemv; since the PDL changes it wins where rows are never cut
 * (cu_gemv_smb).
 */
#define GEMV_S_NB 2
#define GS_SLOT (2 * GEMV_S_NB * 2) /* floats per warp: 2 cut rows x NB x (gate, up) */

__device__ __forceinline__ int gs_start(long h, int Q, int Wt) { return (int)(h * Q / Wt); }
/* the warp whose quad range holds quad q (ranges [h Q / Wt, (h+1) Q / Wt)) */
__device__ __forceinline__ int gs_warp_of(int q, int Q, int Wt) { return (int)((((long)q + 1) * Wt + Q - 1) / Q) - 1; }

/* the first row of job ji in the concatenation of the jobs' rows */
__device__ __forceinline__ int gs_row0(const struct gemv_jobs &J, int ji) {
    return ji == 0 ? 0 : ji == 1 ? J.j[0].n_out : J.j[0].n_out + J.j[1].n_out;
}
/* row (of the concatenated jobs) -> job index */
__device__ __forceinline__ int gs_job(const struct gemv_jobs &J, int row) {
    return (J.nj > 2 && row >= gs_row0(J, 2)) ? 2 : (J.nj > 1 && row >= gs_row0(J, 1)) ? 1 : 0;
}

/* out[j0 + j][row] for j < NB (row of the concatenated jobs), bias added;
 * GLU: silu(gate) * up and up, each rounded as the separate ops round */
template <int NB, typename OutT, bool GLU>
__device__ __forceinline__ void gs_emit(const struct gemv_jobs &J, int row, const float *v, const float *v2, int j0 = 0) {
    /* fields picked one by one: a struct picked by a run-time index is copied to the stack */
    const int ji = gs_job(J, row);
    const int r = row - gs_row0(J, ji);
    const int n_out = ji == 0 ? J.j[0].n_out : ji == 1 ? J.j[1].n_out : J.j[2].n_out;
    const float *bias = ji == 0 ? J.j[0].bias : ji == 1 ? J.j[1].bias : J.j[2].bias;
    void *out = ji == 0 ? J.j[0].out : ji == 1 ? J.j[1].out : J.j[2].out;
    const float b = bias ? bias[r] : 0.f;
    if (!GLU) {
#pragma unroll
        for (int j = 0; j < NB; j++) ((OutT *)out)[(size_t)(j0 + j) * n_out + r] = to_out<OutT>(v[j] + b);
    } else {
        const float b2 = J.j[0].bias2 ? J.j[0].bias2[r] : 0.f;
#pragma unroll
        for (int j = 0; j < NB; j++) {
            const float gv = __bfloat162float(__float2bfloat16(v[j] + b));
            const bf16 u = __float2bfloat16(v2[j] + b2);
            ((bf16 *)out)[(size_t)(j0 + j) * n_out + r] = __float2bfloat16(silu(gv) * __bfloat162float(u));
            ((bf16 *)J.j[0].out2)[(size_t)(j0 + j) * n_out + r] = u;
        }
    }
}

/* a row cut by warp range ends (lane 0): leave this warp's piece in
 * slot[g][0 if the row is the first of its range, else 1]; the last piece to
 * arrive (counter cnt[ga], ga the warp holding the row's first quad) adds the
 * pieces in warp order, writes the row and zeroes the counter */
template <int NB, typename OutT, bool GLU>
__device__ __forceinline__ void gs_piece(const struct gemv_jobs &J, float *slot, int *cnt, int g, int Q, int Wt, int S4,
                                         int row, bool first, const float *v, const float *v2) {
    float *sl = slot + (size_t)g * GS_SLOT + (first ? 0 : 2 * NB);
#pragma unroll
    for (int j = 0; j < NB; j++) sl[j] = v[j], sl[NB + j] = GLU ? v2[j] : 0.f;
    const int ga = gs_warp_of(row * S4, Q, Wt), gb = gs_warp_of(row * S4 + S4 - 1, Q, Wt);
    __threadfence();
    if (atomicAdd(cnt + ga, 1) != gb - ga) return;
    __threadfence();
    float s[2 * NB];
#pragma unroll
    for (int j = 0; j < 2 * NB; j++) s[j] = 0.f;
    for (int h = ga; h <= gb; h++) {
        const volatile float *hs = slot + (size_t)h * GS_SLOT + (gs_start(h, Q, Wt) >= row * S4 ? 0 : 2 * NB);
#pragma unroll
        for (int j = 0; j < 2 * NB; j++) s[j] += hs[j];
    }
    gs_emit<NB, OutT, GLU>(J, row, s, s + NB);
    cnt[ga] = 0;
}

template <int NB, typename OutT, bool GLU>
__global__ void __launch_bounds__(256, NB == 1 ? 3 : 2) k_gemv_s(const struct gemv_jobs J, const bf16 *__restrict__ x, int n_in, int rows,
                                                   float *__restrict__ slot, int *__restrict__ cnt) {
    KTRACE();
    constexpr int QD = GLU ? 1 : 2; /* quads in flight: 8 loads per lane */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = blockIdx.x * 8 + warp, Wt = gridDim.x * 8;
    const int nch = n_in >> 3, S4 = n_in >> 10; /* quads per row */
    const int Q = rows * S4, q0 = gs_start(g, Q, Wt), q1 = gs_start(g + 1, Q, Wt);
    /* load cursor: pointer(s) to the lane's chunk, quads left in this job */
    int lj = gs_job(J, q0 / S4);
    const int jr0 = gs_row0(J, lj);
    const int jn = lj == 0 ? J.j[0].n_out : lj == 1 ? J.j[1].n_out : J.j[2].n_out;
    const size_t off = (size_t)(q0 - jr0 * S4) * 128 + lane;
    const uint4 *lp = (const uint4 *)(lj == 0 ? J.j[0].w : lj == 1 ? J.j[1].w : J.j[2].w) + off;
    const uint4 *lp2 = GLU ? (const uint4 *)J.j[0].w2 + off : NULL;
    int left = (jr0 + jn) * S4 - q0;
    uint4 ring[QD][4], ring2[QD][4];
    /* the next quad into ring slot r; lp/lp2 move one quad on (into the next job at a job's end) */
    auto load_quad = [&](int r) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            ring[r][u] = ld_stream(lp + 32 * u);
            if (GLU) ring2[r][u] = ld_stream(lp2 + 32 * u);
        }
        lp += 128, lp2 += 128;
        if (--left == 0 && lj < J.nj - 1) {
            lj++;
            lp = (const uint4 *)(lj == 1 ? J.j[1].w : J.j[2].w) + lane;
            left = (lj == 1 ? J.j[1].n_out : J.j[2].n_out) * S4;
        }
    };
#pragma unroll
    for (int r = 0; r < QD; r++)
        if (q0 + r < q1) load_quad(r);
    pdl_wait_release();
    const uint4 *xv = (const uint4 *)x + lane;
    int cr = q0 / S4, cq = q0 - cr * S4, rs = q0; /* row, quad within it, first quad of its piece */
    float acc[NB], acc2[NB];
#pragma unroll
    for (int j = 0; j < NB; j++) acc[j] = acc2[j] = 0.f;
    for (int q = q0; q < q1;) {
#pragma unroll
        for (int r = 0; r < QD; r++, q++) {
            if (q >= q1) break;
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int j = 0; j < NB; j++) {
                    const uint4 xc = __ldg(xv + (size_t)j * nch + cq * 128 + 32 * u);
                    acc[j] = dot8(acc[j], ring[r][u], xc);
                    if (GLU) acc2[j] = dot8(acc2[j], ring2[r][u], xc);
                }
            if (q + QD < q1) load_quad(r);
            if (++cq == S4 || q + 1 == q1) {
                /* the piece [rs, q] of row cr ends here */
                float v[NB], v2[NB];
#pragma unroll
                for (int j = 0; j < NB; j++) {
                    v[j] = warp_sum(acc[j]), acc[j] = 0.f;
                    v2[j] = GLU ? warp_sum(acc2[j]) : 0.f, acc2[j] = 0.f;
                }
                if (rs == cr * S4 && cq == S4) {
                    if (lane == 0) gs_emit<NB, OutT, GLU>(J, cr, v, v2);
                } else if (lane == 0) {
                    gs_piece<NB, OutT, GLU>(J, slot, cnt, g, Q, Wt, S4, cr, cr * S4 <= q0, v, v2);
                }
                if (cq == S4) cq = 0, cr++;
                rs = q + 1;
            }
        }
    }
}

/*
 * k_gemv_b (sm_90): the GEMV for matrices that fit in the GPU's shared
 * memory at once (2 blocks of up to GEMV_B_SMEM per SM: ~29 MB on an H200),
 * such as Qwen3-0.6B's four and Qwen3-30B-A3B's attention matrices.
 * Block b owns R consecutive rows of the jobs' concatenated rows (GLU: R
 * gate rows and the same R up rows). Before griddepcontrol.wait (weights
 * are never written by an earlier kernel) one thread issues a bulk copy per
 * job segment of its rows into shared memory, all on one mbarrier, so the
 * whole matrix is on its way in one DRAM round trip, issued as soon as the
 * block is resident, i.e. while the kernels before it still run. After the
 * wait the block copies x (NB rows) to shared memory and waits for its
 * weights; ks warps share a row (lanes stride its 16-byte chunks within the
 * warp's contiguous range), their sums meet in shared memory in warp order.
 * k_gemv and k_gemv_s keep 4-8 loads per lane in flight and walk a row in
 * several round trips.
 */
#define GEMV_B_SMEM (110 * 1024)
/* the dynamic shared memory k_gemv_b may ask for: above GEMV_B_SMEM so that
 * a launch of at most one block per SM can keep the SM to itself */
#define GEMV_B_ATTR (120 * 1024)

template <int NB, typename OutT, bool GLU>
__global__ void __launch_bounds__(256) k_gemv_b(const struct gemv_jobs J, const bf16 *__restrict__ x, int n_in, int rows, int R,
                                                int ks) {
    KTRACE();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char gb_s[];
    __shared__ __align__(8) uint64_t bar;
    __shared__ float red[8][2 * NB];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nch = n_in >> 3;
    const int r0 = blockIdx.x * R, nr = min(R, rows - r0);
    const size_t rb = (size_t)n_in * 2;
    const bf16 *ws = (const bf16 *)gb_s;                                      /* rows; GLU: up rows from R rb */
    const uint4 *xs = (const uint4 *)(gb_s + (size_t)(GLU ? 2 : 1) * R * rb); /* x, NB rows */
    const unsigned b = smem_u32(&bar);
    if (threadIdx.x == 0) {
        mbar_init(b, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        mbar_arrive_tx(b, (unsigned)(nr * rb * (GLU ? 2 : 1)));
        for (int ji = 0; ji < J.nj; ji++) {
            const int j0 = gs_row0(J, ji), jn = ji == 0 ? J.j[0].n_out : ji == 1 ? J.j[1].n_out : J.j[2].n_out;
            const int a = max(r0, j0), e = min(r0 + nr, j0 + jn);
            if (a >= e) continue;
            const bf16 *w = ji == 0 ? J.j[0].w : ji == 1 ? J.j[1].w : J.j[2].w;
            bulk_load(smem_u32(ws + (size_t)(a - r0) * n_in), w + (size_t)(a - j0) * n_in, (unsigned)((e - a) * rb), b);
            if (GLU)
                bulk_load(smem_u32(ws + (size_t)(R + a - r0) * n_in), J.j[0].w2 + (size_t)(a - j0) * n_in, (unsigned)((e - a) * rb), b);
        }
    }
    pdl_wait_release();
    for (int i = threadIdx.x; i < NB * nch; i += blockDim.x) ((uint4 *)xs)[i] = __ldg((const uint4 *)x + i);
    __syncthreads();
    mbar_wait(b, 0);
    const int per = (nch + ks - 1) / ks, part = warp % ks, c0 = part * per, c1 = min(nch, c0 + per), wpr = 8 / ks;
    for (int base = 0; base < nr; base += wpr) { /* the same trip count in every warp: the block syncs inside */
        const int rr = base + warp / ks;
        float acc[NB], acc2[NB];
#pragma unroll
        for (int j = 0; j < NB; j++) acc[j] = acc2[j] = 0.f;
        if (rr < nr) {
            const uint4 *wr = (const uint4 *)(ws + (size_t)rr * n_in), *ur = (const uint4 *)(ws + (size_t)(R + rr) * n_in);
            for (int c = c0 + lane; c < c1; c += 32) {
                const uint4 wv = wr[c];
                const uint4 uv = GLU ? ur[c] : wv;
#pragma unroll
                for (int j = 0; j < NB; j++) {
                    const uint4 xc = xs[(size_t)j * nch + c];
                    acc[j] = dot8(acc[j], wv, xc);
                    if (GLU) acc2[j] = dot8(acc2[j], uv, xc);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < NB; j++) {
            acc[j] = warp_sum(acc[j]);
            if (GLU) acc2[j] = warp_sum(acc2[j]);
        }
        if (ks > 1) {
            ks_sum<NB>(red, acc, acc2, ks, warp, part, lane);
            __syncthreads();
        }
        if (part == 0 && lane == 0 && rr < nr) gs_emit<NB, OutT, GLU>(J, r0 + rr, acc, acc2);
    }
#else
    __trap(); /* bulk copies are sm_90: the host never launches this elsewhere */
#endif
}

/* whether k_gemv_b<NB, OutT, GLU> runs here (sm_90 code in the build; its
 * shared memory raised to GEMV_B_ATTR) */
template <int NB, typename OutT, bool GLU> static int gemv_b_ok(void) {
    static int ok = -1;
    if (ok < 0) {
        ok = cu_sm90_code((const void *)k_gemv_b<NB, OutT, GLU>) &&
             cudaFuncSetAttribute(k_gemv_b<NB, OutT, GLU>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMV_B_ATTR) == cudaSuccess;
        cudaGetLastError();
    }
    return ok;
}

static long gemv_b_runs;
extern "C" long kiln_cuda_gemv_b_count(void);
extern "C" long kiln_cuda_gemv_b_count(void) { return gemv_b_runs; }
extern "C" int kiln_cuda_gemv_b_ok(void);
extern "C" int kiln_cuda_gemv_b_ok(void) { return gemv_b_ok<1, bf16, false>(); }

/* launches k_gemv_b for jobs J over n <= 2 rows of x when the matrix fits
 * (rows dealt to at most 2 blocks per SM); 0 if it does not */
template <typename OutT, bool GLU>
static int gemv_b_launch(struct cuda_ctx *c, const struct gemv_jobs *J, const bf16 *x, int n, int n_in) {
    if (c->no_gemv_b || n > 2 || !(n == 1 ? gemv_b_ok<1, OutT, GLU>() : gemv_b_ok<2, OutT, GLU>())) return 0;
    int rows = 0;
    for (int i = 0; i < J->nj; i++) rows += J->j[i].n_out;
    const long maxb = 2L * c->n_sm, rb = (long)n_in * 2 * (GLU ? 2 : 1);
    const int R = (int)((rows + maxb - 1) / maxb);
    size_t smem = (size_t)R * rb + (size_t)n * n_in * 2;
    if (smem > GEMV_B_SMEM) return 0;
    const int nb = (rows + R - 1) / R, nch = n_in / 8;
    /* Spread: ask for enough shared memory that no SM can hold more than
     * per = ceil(nb / SMs) of these blocks. Otherwise the block scheduler
     * packs small blocks 3-4 to an SM and leaves others idle (30B-A3B's o
     * projection, 72 KB blocks: 3 per SM on 87-94 of 132 SMs), and the
     * packed SMs' copies and dot products finish last. (per + 1) blocks of
     * smem_sm / (per + 1) bytes plus the 1 KB each block reserves do not fit. */
    if (!c->no_gemv_b_spread && c->smem_sm > 0) {
        const int per = (int)((nb + c->n_sm - 1) / c->n_sm);
        const size_t floor_b = (size_t)c->smem_sm / (size_t)(per + 1);
        if (smem < floor_b && floor_b <= GEMV_B_ATTR) smem = floor_b;
    }
    int ks = R >= 8 ? 1 : R >= 4 ? 2 : R >= 2 ? 4 : 8;
    while (ks > 1 && nch / ks < 32) ks /= 2;
    if (n == 1) cu_launch(c->stream, k_gemv_b<1, OutT, GLU>, nb, 256, smem, *J, x, n_in, rows, R, ks);
    else cu_launch(c->stream, k_gemv_b<2, OutT, GLU>, nb, 256, smem, *J, x, n_in, rows, R, ks);
    CU_LAUNCHED();
    gemv_b_runs++;
    return 1;
}

/*
 * k_gemv_tc: the decode GEMV for 3-16 rows of x (batched decode) on the
 * tensor cores. At these batch sizes a step still reads every weight once,
 * but the CUDA-core GEMV pays NB dot products per 16-byte weight chunk
 * (1.5 TB/s at 8 rows) and cuBLAS splits K with a second, reduce kernel per
 * matmul; mma.sync does a 16 x 8 x 16 product per instruction, so the
 * weights stream as at batch 1.
 * Decomposition: block b owns rows 16b..16b+15 of the jobs' concatenated
 * rows, all of one job (jobs as k_gemv_s's: q/k/v in one launch, gate/up
 * with SwiGLU as GLU, written by gs_emit); its 8 warps
 * split n_in into 8 contiguous ranges of n_in / 256 blocks of 32 (GLU:
 * warps 0-3 the gate rows, 4-7 the up rows, 4 ranges each, so that a lane
 * keeps two weight streams either way: with all four in every lane the
 * gate/up GEMV ran at 2.8 TB/s, the others at 3.5). In a
 * block of 32, lane (g = lane / 4, t = lane % 4) loads 16 bytes of weight
 * rows g and g + 8 and of x rows g (and g + 8 when NT = 2) at k = 8t..8t+7.
 * The dot product does not care in which order k is summed, so those 8
 * values serve as k = 2t, 2t+1 and 2t+8, 2t+9 of two m16n8k16 products: A's
 * and B's fragments are then the loaded words as they are, with no shuffle
 * or shared memory (x rows past n are zeros). The warps' accumulators meet
 * in shared memory. Weights and x are loaded U = 4 blocks ahead (the first
 * weights before griddepcontrol.wait: no kernel writes them; x loaded just
 * before its use left the warps waiting on L2: 2.2 TB/s). Needs n_in % 256 == 0 and
 * every job's n_out % 16 == 0.
 */
#define TC_MAX_ROWS 16

template <int NT, typename OutT, bool GLU>
__global__ void __launch_bounds__(256) k_gemv_tc(const struct gemv_jobs J, const bf16 *__restrict__ x, int n, int n_in) {
    KTRACE();
    constexpr int U = 4;              /* blocks of 32 in flight per lane */
    constexpr int KS = GLU ? 4 : 8;   /* warps that split a row's n_in */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16, ji = gs_job(J, row0); /* rows of the concatenated jobs (every n_out % 16 == 0) */
    /* GLU: warps 0-3 take the gate rows, 4-7 the same rows of up */
    const bf16 *W = GLU && warp >= KS ? J.j[0].w2 : ji == 0 ? J.j[0].w : ji == 1 ? J.j[1].w : J.j[2].w;
    const int r0 = row0 - gs_row0(J, ji), nkb = n_in / (32 * KS);
    const size_t rs = (size_t)n_in >> 3, k0 = (size_t)(warp % KS) * nkb * 4 + t; /* a row, the lane's first chunk: in uint4 */
    const uint4 *wa = (const uint4 *)W + (r0 + g) * rs + k0, *wb = wa + 8 * rs;
    uint4 ra[U], rb[U];
#pragma unroll
    for (int u = 0; u < U; u++)
        if (u < nkb) ra[u] = ld_stream(wa + 4 * u), rb[u] = ld_stream(wb + 4 * u);
    pdl_wait_release();
    const uint4 *xa = (const uint4 *)x + g * rs + k0, *xb = xa + 8 * rs;
    const bool va = g < n, vb = g + 8 < n;
    const uint4 z = make_uint4(0, 0, 0, 0);
    uint4 xr[U][NT]; /* x's chunks, loaded as far ahead as the weights' (an L2 round trip each) */
#pragma unroll
    for (int u = 0; u < U; u++)
        if (u < nkb) {
            xr[u][0] = va ? __ldg(xa + 4 * u) : z;
            if (NT > 1) xr[u][NT - 1] = vb ? __ldg(xb + 4 * u) : z;
        }
    float acc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[i][c] = 0.f;
    for (int b = 0; b < nkb; b += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (b + u >= nkb) break;
            /* two m16n8k16 products of one block of 32: k 8t..8t+3, then 8t+4..8t+7 */
            const unsigned a0[4] = {ra[u].x, rb[u].x, ra[u].y, rb[u].y}, a1[4] = {ra[u].z, rb[u].z, ra[u].w, rb[u].w};
#pragma unroll
            for (int i = 0; i < NT; i++) {
                mma16816(acc[i], a0, xr[u][i].x, xr[u][i].y);
                mma16816(acc[i], a1, xr[u][i].z, xr[u][i].w);
            }
            const int nb = b + u + U;
            if (nb < nkb) {
                ra[u] = ld_stream(wa + 4 * nb), rb[u] = ld_stream(wb + 4 * nb);
                xr[u][0] = va ? __ldg(xa + 4 * nb) : z;
                if (NT > 1) xr[u][NT - 1] = vb ? __ldg(xb + 4 * nb) : z;
            }
        }
    }
    /* accumulator c of tile i, lane l: weight row (l / 4) + 8 (c / 2), x row 8 i + 2 (l % 4) + c % 2 */
    __shared__ float red[8][NT * 4][32];
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) red[warp][i * 4 + c][lane] = acc[i][c];
    __syncthreads();
    if (threadIdx.x >= NT * 128) return;
    const int q = threadIdx.x >> 5, l = threadIdx.x & 31, c = q & 3;
    const int col = (q >> 2) * 8 + 2 * (l & 3) + (c & 1);
    if (col >= n) return;
    float s = 0.f, s2 = 0.f;
#pragma unroll
    for (int w = 0; w < KS; w++) {
        s += red[w][q][l];
        if (GLU) s2 += red[KS + w][q][l];
    }
    gs_emit<1, OutT, GLU>(J, row0 + (l >> 2) + (c & 2 ? 8 : 0), &s, &s2, col);
}

/* rows of x up to which decode matmuls take k_gemv_tc (above cu_gemv_rows;
 * KILN_CUDA_GEMV_TC=0: cuBLAS as before), where the shape allows it */
int cu_gemv_tc = TC_MAX_ROWS;
static long gemv_tc_runs;
extern "C" long kiln_cuda_gemv_tc_count(void);
extern "C" long kiln_cuda_gemv_tc_count(void) { return gemv_tc_runs; }

static int tc_fits(int n, int n_out, int n_in) {
    return n > cu_gemv_rows && n <= cu_gemv_tc && n <= TC_MAX_ROWS && n_in % 256 == 0 && n_out % 16 == 0;
}

template <typename OutT, bool GLU>
static void gemv_tc_launch(struct cuda_ctx *c, struct gemv_jobs *J, const bf16 *x, int n, int n_in) {
    int blk = 0; /* 16 rows each */
    for (int i = 0; i < J->nj; i++) blk += J->j[i].n_out / 16;
    if (n <= 8) cu_launch(c->stream, k_gemv_tc<1, OutT, GLU>, blk, 256, 0, *J, x, n, n_in);
    else cu_launch(c->stream, k_gemv_tc<2, OutT, GLU>, blk, 256, 0, *J, x, n, n_in);
    CU_LAUNCHED();
    gemv_tc_runs++;
    c->gemv_seq = cu_launch_seq; /* wait-then-release, as the others */
}

/* k_gemv_any: the same for any n_in (scalar loads); one warp per row, all
 * n rows of x. Used only for odd shapes. */
template <typename OutT>
__global__ void k_gemv_any(OutT *__restrict__ out, const bf16 *__restrict__ x, const bf16 *__restrict__ W,
                           const float *__restrict__ bias, int n, int n_out, int n_in) {
    KTRACE();
    pdl_wait();
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n_out) return;
    const bf16 *w = W + (size_t)row * n_in;
    for (int j = 0; j < n; j++) {
        float s = 0.f;
        for (int i = lane; i < n_in; i += 32) s += __bfloat162float(w[i]) * __bfloat162float(x[(size_t)j * n_in + i]);
        s = warp_sum(s);
        if (lane == 0) out[(size_t)j * n_out + row] = to_out<OutT>(s + (bias ? bias[row] : 0.f));
    }
}

static int gemv_ok(const bf16 *x, const bf16 *w, int n_in) { return n_in % 8 == 0 && !((uintptr_t)x & 15) && !((uintptr_t)w & 15); }

int cu_gemv_pf = 1;
/* blocks per SM of the streaming GEMV (k_gemv_s); 0: the row-block kernel k_gemv */
int cu_gemv_bps = 3;
/* k_gemv_s only when there are as many rows as warps (KILN_CUDA_GEMV_SROWS) */
int cu_gemv_srows = 1;
/* ... and only for matrices of at least this many MiB (KILN_CUDA_GEMV_SMB),
 * or whose rows are one quad (n_in 1024: no row is ever cut, so there are
 * no merges). Measured on the H200 (tg128, fourteenth session): streaming
 * every matrix gave Qwen3-0.6B 1037 / 1004 / 1017 -> 1113 / 1060 / 1068
 * tok/s, almost all of it from q/k/v and gate/up (n_in 1024), but cost
 * 30B-A3B 3% (its 16-21 MB attention matrices, rows cut in 2-4 pieces:
 * 359 / 359 -> 348 / 349). */
int cu_gemv_smb = 32;

/* blocks of k_gemv_s resident per SM */
template <int NB, typename OutT, bool GLU> static int gs_occ(void) {
    static int occ;
    if (!occ && (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k_gemv_s<NB, OutT, GLU>, 256, 0) != cudaSuccess || occ < 1))
        occ = 1;
    return occ;
}

/* launches jobs J (blk0 filled here) over n rows of x; with the pending norm
 * folded in when nm (then x is nm->out) */
template <typename OutT, bool GLU>
static void gemv_jobs_launch(struct cuda_ctx *c, struct gemv_jobs *J, const bf16 *x, int n, int n_in,
                             const struct gemv_norm *nm = NULL) {
    int tc = !nm && tc_fits(n, 16, n_in); /* and each job's n_out below; above 8 rows the callers checked it all */
    for (int i = 0; i < J->nj; i++) tc &= J->j[i].n_out % 16 == 0;
    if (tc) {
        gemv_tc_launch<OutT, GLU>(c, J, x, n, n_in);
        return;
    }
    if (!nm && gemv_b_launch<OutT, GLU>(c, J, x, n, n_in)) {
        c->gemv_seq = cu_launch_seq; /* wait-then-release, as the others */
        return;
    }
    if (!nm && n <= GEMV_S_NB && cu_gemv_bps > 0 && n_in % 1024 == 0) {
        int rows = 0;
        for (int i = 0; i < J->nj; i++) rows += J->j[i].n_out;
        /* every warp needs a quad: at most Q / 8 blocks */
        const long Q = (long)rows * (n_in / 1024);
        const long blocks = Q / 8 < (long)cu_gemv_bps * c->n_sm ? Q / 8 : (long)cu_gemv_bps * c->n_sm;
        const long bytes = (long)rows * n_in * 2 * (GLU ? 2 : 1);
        if (blocks >= 1 && (!cu_gemv_srows || rows >= blocks * 8) && (bytes >= ((long)cu_gemv_smb << 20) || n_in == 1024)) {
            /* one wave: no more blocks than fit at once (registers; at
             * batch 2 the kernel holds 2 blocks per SM, not cu_gemv_bps) */
            const long wave = (long)c->n_sm * (n == 1 ? gs_occ<1, OutT, GLU>() : gs_occ<2, OutT, GLU>());
            const unsigned nb = (unsigned)(blocks < wave ? blocks : wave);
            if (n == 1) cu_launch(c->stream, k_gemv_s<1, OutT, GLU>, nb, 256, 0, *J, x, n_in, rows, c->gs_slot, c->gs_cnt);
            else cu_launch(c->stream, k_gemv_s<2, OutT, GLU>, nb, 256, 0, *J, x, n_in, rows, c->gs_slot, c->gs_cnt);
            CU_LAUNCHED();
            c->gemv_seq = cu_launch_seq;
            return;
        }
    }
    /* enough warps in flight to cover the memory latency: about 48 per SM */
    long rows = 0;
    for (int i = 0; i < J->nj; i++) rows += J->j[i].n_out;
    int nch = n_in / 8, ks = 1;
    while (ks < 8 && rows * ks < (long)c->n_sm * 48) ks *= 2;
    while (ks > 1 && nch / ks < 128) ks /= 2; /* >= 4 chunks per lane: one full batch of loads in flight */
    int blk = 0, rpb = 8 / ks;
    for (int i = 0; i < J->nj; i++) J->j[i].blk0 = blk, blk += (J->j[i].n_out + rpb - 1) / rpb;
    struct gemv_norm N = {};
    if (nm) N = *nm;
    const size_t smem = nm ? (size_t)n * n_in * 2 : 0;
#define GEMV_CASE(NB)                                                                                              \
    case NB:                                                                                                       \
        if (nm) {                                                                                                  \
            int occ = 0;                                                                                           \
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k_gemv<NB, OutT, GLU, true>, 256, smem) != cudaSuccess || occ < 1) \
                occ = 1;                                                                                           \
            const int grid = blk < occ * c->n_sm ? blk : occ * c->n_sm;                                            \
            cu_launch(c->stream, k_gemv<NB, OutT, GLU, true>, grid, 256, smem, *J, x, n_in, ks, N, cu_gemv_pf, blk); \
        } else {                                                                                                   \
            cu_launch(c->stream, k_gemv<NB, OutT, GLU, false>, blk, 256, 0, *J, x, n_in, ks, N, cu_gemv_pf, blk);  \
        }                                                                                                          \
        break;
    switch (n) {
        GEMV_CASE(1) GEMV_CASE(2) GEMV_CASE(3) GEMV_CASE(4) GEMV_CASE(5) GEMV_CASE(6) GEMV_CASE(7) GEMV_CASE(8)
    }
#undef GEMV_CASE
    CU_LAUNCHED();
    c->gemv_seq = cu_launch_seq; /* wait-then-release (k_gemv, k_gemv_s): attention.cu's pre-wait loads rely on it */
}

template <typename OutT>
static void gemv(struct cuda_ctx *c, OutT *out, const bf16 *x, const bf16 *w, const float *bias, int n, int n_out, int n_in) {
    if (!gemv_ok(x, w, n_in)) {
        cu_launch(c->stream, k_gemv_any<OutT>, (n_out + 7) / 8, 256, 0, out, x, w, bias, n, n_out, n_in);
        CU_LAUNCHED();
        return;
    }
    struct gemv_jobs J = {};
    J.nj = 1;
    J.j[0].w = w, J.j[0].bias = bias, J.j[0].out = out, J.j[0].n_out = n_out;
    gemv_jobs_launch<OutT, false>(c, &J, x, n, n_in);
}

/* ==== deferred decode matmuls: q/k/v in one launch, gate/up fused with SwiGLU ==== */

/* the pending norm can be folded into a GEMV over x (its output) */
static int norm_fold(struct cuda_ctx *c, const void *x, int n, int n_in) {
    return n <= cu_gemv_rows && c->pnorm.on && c->pnorm.out == x && c->pnorm.n == n && c->pnorm.dim == n_in && (size_t)n * n_in * 2 <= 48 * 1024;
}

static struct gemv_norm take_norm(struct cuda_ctx *c) {
    struct gemv_norm N = {c->pnorm.x, c->pnorm.out, c->pnorm.y, c->pnorm.w, c->pnorm.eps, c->norm_cnt};
    c->pnorm.on = 0;
    return N;
}

/* Launches the queued matmuls (all read the same x) as one multi-job GEMV,
 * with the pending norm folded in when it produced that x. */
void cu_flush_mm(struct cuda_ctx *c) {
    if (!c->n_pend) return;
    if (c->pend[0].L->q4) { /* 4-bit weights, queued by cu_matmul (the norm was launched before them) */
        bf16 *outs[3];
        const struct cu_linear *Ls[3];
        for (int i = 0; i < c->n_pend; i++) outs[i] = (bf16 *)c->pend[i].out, Ls[i] = c->pend[i].L;
        const int nl = c->n_pend;
        c->n_pend = 0;
        cu_w4_gemv_multi(c, outs, Ls, nl, 0, c->pend_x, c->pend_n);
        return;
    }
    struct gemv_jobs J = {};
    J.nj = c->n_pend;
    for (int i = 0; i < c->n_pend; i++) {
        J.j[i].w = c->pend[i].L->w, J.j[i].bias = c->pend[i].L->bias, J.j[i].out = c->pend[i].out;
        J.j[i].n_out = c->pend[i].n_out;
    }
    c->n_pend = 0;
    if (norm_fold(c, c->pend_x, c->pend_n, c->pend_n_in)) {
        struct gemv_norm N = take_norm(c);
        gemv_jobs_launch<bf16, false>(c, &J, c->pend_x, c->pend_n, c->pend_n_in, &N);
    } else {
        gemv_jobs_launch<bf16, false>(c, &J, c->pend_x, c->pend_n, c->pend_n_in);
    }
}

/* Every op other than matmul calls this first, so the held-back ops are
 * invisible: at most one kind is pending at a time (each is held back only
 * right after a flush), except a norm with the matmuls that read it. */
void cu_flush(struct cuda_ctx *c) {
    /* a rope on the one q/k/v GEMM's output writes all three buffers; else
     * they are split out */
    if (c->prope.on && c->prope.qi) cu_rope_launch(c, NULL, NULL, NULL, 0);
    if (c->pqkv.on) cu_pqkv_split(c);
    if (c->pgemm.on) cu_pgemm_launch(c, NULL);
    if (c->pkv.on) { /* the held rope + KV write (attention.cu) */
        c->pkv.on = 0;
        cu_rope_launch(c, c->pkv.kc, c->pkv.vc, c->pkv.v, c->pkv.P); /* clears prope.on */
    }
    if (c->prope.on) cu_rope_launch(c, NULL, NULL, NULL, 0); /* clears prope.on */
    if (c->padd.on) {
        c->padd.on = 0;
        cu_add_launch(c, c->padd.x, c->padd.y, c->padd.n);
    }
    cu_flush_mm(c);
    if (c->pnorm.on) {
        c->pnorm.on = 0;
        cu_norm_launch(c, c->pnorm.x, c->pnorm.out, c->pnorm.y, c->pnorm.w, c->pnorm.n, c->pnorm.dim, c->pnorm.eps);
    }
}

/* out = silu(gate) * up when gate and up are the two queued matmuls: one
 * kernel streams both weights; returns 0 if the queue does not match */
int cu_swiglu_fused(struct cuda_ctx *c, void *out, const void *gate, const void *up, int n, int ffn) {
    if (c->n_pend != 2 || c->pend[0].out != gate || c->pend[1].out != up || out != gate || c->pend_n != n ||
        c->pend[0].n_out != ffn || c->pend[1].n_out != ffn)
        return 0;
    if (c->pend[0].L->q4) { /* both 4-bit (a queue holds one kind) */
        bf16 *outs[2] = {(bf16 *)out, (bf16 *)up};
        const struct cu_linear *Ls[2] = {c->pend[0].L, c->pend[1].L};
        c->n_pend = 0;
        cu_w4_gemv_multi(c, outs, Ls, 2, 1, c->pend_x, n);
        return 1;
    }
    struct gemv_jobs J = {};
    J.nj = 1;
    J.j[0].w = c->pend[0].L->w, J.j[0].w2 = c->pend[1].L->w, J.j[0].bias = c->pend[0].L->bias, J.j[0].bias2 = c->pend[1].L->bias;
    J.j[0].out = out, J.j[0].out2 = (void *)up, J.j[0].n_out = ffn;
    c->n_pend = 0;
    if (norm_fold(c, c->pend_x, n, c->pend_n_in)) {
        struct gemv_norm N = take_norm(c);
        gemv_jobs_launch<bf16, true>(c, &J, c->pend_x, n, c->pend_n_in, &N);
    } else {
        gemv_jobs_launch<bf16, true>(c, &J, c->pend_x, n, c->pend_n_in);
    }
    return 1;
}

/* ==== prefill: cuBLAS ==== */

/* out[n][n_out] (bf16 or f32) = x[n][n_in] W^T + beta out; column-major
 * view: out^T = W x^T + beta out^T (beta 0 or 1) */
static void blas_gemm(struct cuda_ctx *c, void *out, cudaDataType_t ot, const bf16 *x, const bf16 *w, int n, int n_out, int n_in,
                      float beta = 0.f) {
    const float one = 1.f;
    CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, n, n_in, &one, w, CUDA_R_16BF, n_in, x, CUDA_R_16BF,
                              n_in, &beta, out, ot, n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* k_split_cols: row t of s (q | k | v, ld columns) into row t of each of
 * the three outputs, plus the output's bias (rounded as k_bias rounds);
 * one thread per 16-byte chunk (n_out[] % 8 == 0: a chunk is one output's) */
__global__ void k_split_cols(bf16 *o0, bf16 *o1, bf16 *o2, const bf16 *__restrict__ s, int n0, int n1, int ld, size_t total,
                             const struct cu_qkv_bias B) {
    KTRACE();
    pdl_wait();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int per = ld / 8, col = (int)(i % per) * 8;
    const size_t t = i / per;
    uint4 v = ((const uint4 *)s)[i];
    const int j = col < n0 ? 0 : col < n0 + n1 ? 1 : 2, cj = col - (j > 0) * n0 - (j > 1) * n1;
    const float *b = j == 0 ? B.b[0] : j == 1 ? B.b[1] : B.b[2];
    if (b) {
        bf16 *e = (bf16 *)&v;
#pragma unroll
        for (int u = 0; u < 8; u++) e[u] = __float2bfloat16(__bfloat162float(e[u]) + b[cj + u]);
    }
    bf16 *o = j == 0 ? o0 + t * n0 : j == 1 ? o1 + t * n1 : o2 + t * (ld - n0 - n1);
    *(uint4 *)(o + cj) = v;
}

void cu_pqkv_split(struct cuda_ctx *c) {
    c->pqkv.on = 0;
    const size_t total = (size_t)c->pqkv.n * c->pqkv.ld / 8;
    cu_launch(c->stream, k_split_cols, (unsigned)((total + 255) / 256), 256, 0, c->pqkv.out[0], c->pqkv.out[1], c->pqkv.out[2],
              (const bf16 *)c->pqkv.s, c->pqkv.n_out[0], c->pqkv.n_out[1], c->pqkv.ld, total, c->pqkv.bias);
    CU_LAUNCHED();
}

void cu_pgemm_launch(struct cuda_ctx *c, bf16 *res) {
    c->pgemm.on = 0;
    blas_gemm(c, res ? res : c->pgemm.out, CUDA_R_16BF, c->pgemm.x, c->pgemm.w, c->pgemm.n, c->pgemm.n_out, c->pgemm.n_in,
              res ? 1.f : 0.f);
}

/* k_bias: out[i][r] += bias[r]; one thread per element */
__global__ void k_bias(bf16 *out, const float *bias, int n_out, size_t total) {
    KTRACE();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[i] = __float2bfloat16(__bfloat162float(out[i]) + bias[i % n_out]);
}

/* queues a decode matmul (launched by cu_flush_mm or cu_swiglu_fused):
 * those of one x, n and kind (bf16 or 4-bit) go out as one launch, up to 3 */
static void mm_enqueue(struct cuda_ctx *c, void *out, const void *x, const struct cu_linear *L, int n, int n_in, int n_out) {
    int ok = c->n_pend < 3 && out != x;
    if (c->n_pend && (c->pend_x != x || c->pend_n != n || c->pend_n_in != n_in || !c->pend[0].L->q4 != !L->q4)) ok = 0;
    for (int i = 0; i < c->n_pend; i++) ok &= c->pend[i].out != out;
    if (!ok) cu_flush(c);
    c->pend_x = (const bf16 *)x, c->pend_n = n, c->pend_n_in = n_in;
    c->pend[c->n_pend].out = out, c->pend[c->n_pend].L = L, c->pend[c->n_pend].n_out = n_out;
    c->n_pend++;
}

void cu_matmul(struct kiln_backend *be, void *out, const void *x, const struct qlinear *w, int n) {
    CU_SKIP_IF_REPLAY(be);
    struct cuda_ctx *c = cu_ctx(be);
    if (c->prope.qi || c->pqkv.on) cu_flush(c); /* x may be one of the held q/k/v buffers */
    CU_TAPE(c, SKT_MATMUL, out, x, NULL, w, NULL, NULL, n, 0, 0, 0, 0.f);
    const struct cu_linear *L = (const struct cu_linear *)w->be;
    const bf16 *W = L->w;
    if (L->q4) { /* 4-bit weights (qgemm.cu): the GEMV on the codes, or cuBLAS on a bf16 copy */
        /* past 16 rows, in slices (cu_w4_gemv_multi) */
        const int gemv = n <= W4_GEMV_ROWS || n <= w4_slice_rows(c->w4_slice_env, cu_w4_gsh(L));
        if (gemv && !cu_w4_permuted(L) && !c->no_defer) {
            /* queued as the dense GEMVs are: matmuls of one x in one launch,
             * gate / up with the SwiGLU (cu_swiglu_fused); the ops held back
             * before them go first (no norm folds into the 4-bit GEMV) */
            if (c->pgemm.on || c->pnorm.on || c->padd.on || c->prope.on || c->pkv.on) cu_flush(c);
            mm_enqueue(c, out, x, L, n, w->n_in, w->n_out);
            return;
        }
        cu_flush(c);
        const bf16 *xq = cu_w4_x(c, L, (const bf16 *)x, n);
        if (!xq) return; /* out of device memory: recorded (cu_fault), the forward reports it */
        if (gemv) {
            cu_w4_gemv(c, (bf16 *)out, xq, L, n);
            return;
        }
        if (!(W = cu_w4_dequant(c, L))) return;
        x = xq;
    }
    const int small = !L->q4 && (n <= cu_gemv_rows || tc_fits(n, w->n_out, w->n_in)) && gemv_ok((const bf16 *)x, W, w->n_in);
    if (small && !c->no_defer) {
        if (c->pgemm.on) cu_flush(c);
        /* a pending norm stays pending only if this matmul reads its output
         * and writes none of its buffers */
        if (c->pnorm.on && !(norm_fold(c, x, n, w->n_in) && out != c->pnorm.x && out != c->pnorm.out && out != (void *)c->pnorm.y))
            cu_flush(c);
        if (c->padd.on || c->prope.on) cu_flush(c);
        /* queue it: matmuls that read the same x run as one launch */
        mm_enqueue(c, out, x, L, n, w->n_in, w->n_out);
        return;
    }
    cu_flush(c);
    if (small) {
        gemv<bf16>(c, (bf16 *)out, (const bf16 *)x, L->w, L->bias, n, w->n_out, w->n_in);
        return;
    }
    if (!L->bias && !c->no_gemm_res && !c->no_fuse && !c->no_defer && !c->tape_on && out != x) {
        c->pgemm.on = 1, c->pgemm.out = (bf16 *)out, c->pgemm.x = (const bf16 *)x, c->pgemm.w = W;
        c->pgemm.n = n, c->pgemm.n_out = w->n_out, c->pgemm.n_in = w->n_in;
        return;
    }
    blas_gemm(c, out, CUDA_R_16BF, (const bf16 *)x, W, n, w->n_out, w->n_in);
    if (L->bias) {
        size_t total = (size_t)n * w->n_out;
        cu_launch(c->stream, k_bias, (unsigned)((total + 255) / 256), 256, 0, (bf16 *)out, L->bias, w->n_out, total);
        CU_LAUNCHED();
    }
}

void cu_matmul_f32(struct cuda_ctx *c, float *out, const bf16 *x, const bf16 *w, int n, int n_out, int n_in) {
    if (n <= cu_gemv_rows) gemv<float>(c, out, x, w, NULL, n, n_out, n_in);
    else blas_gemm(c, out, CUDA_R_32F, x, w, n, n_out, n_in);
}

void cu_matmul_f32_norm(struct cuda_ctx *c, float *out, const bf16 *x, const bf16 *w, int n, int n_out, int n_in) {
    if (n <= cu_gemv_rows && norm_fold(c, x, n, n_in) && gemv_ok(x, w, n_in) && (void *)out != c->pnorm.x &&
        (void *)out != c->pnorm.out && (const void *)out != c->pnorm.y) {
        cu_flush_mm(c);
        struct gemv_jobs J = {};
        J.nj = 1;
        J.j[0].w = w, J.j[0].out = out, J.j[0].n_out = n_out;
        struct gemv_norm N = take_norm(c);
        gemv_jobs_launch<float, false>(c, &J, x, n, n_in, &N);
        return;
    }
    cu_flush(c);
    cu_matmul_f32(c, out, x, w, n, n_out, n_in);
}

void cu_gemm_bf16(struct cuda_ctx *c, bf16 *out, const bf16 *x, const bf16 *w, int n, int n_out, int n_in) {
    if (n <= GEMV_MAX_ROWS) gemv<bf16>(c, out, x, w, NULL, n, n_out, n_in);
    else blas_gemm(c, out, CUDA_R_16BF, x, w, n, n_out, n_in);
}

/* ==== MoE decode: experts read straight from the routing result ==== */

/* the expert GEMVs' weight loads: with EF (sm_90) under an L2 evict_first
 * policy (cuda_ctx.moe_ef) */
template <bool EF> struct moe_ld {
    uint64_t pol = 0;
    __device__ __forceinline__ moe_ld() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (EF) pol = pol_evict_first();
#endif
    }
    __device__ __forceinline__ uint4 operator()(const uint4 *q) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (EF) return ld_stream_pol(q, pol);
#endif
        return ld_stream(q);
    }
};

/*
 * k_moe_gate_up: h[p][r] = silu(gate_e[r] . x_i) * (up_e[r] . x_i) for each
 * routed pair p = i*K + k with e = sel[p].
 * Decomposition: grid.y = pair, a block of 8 warps owns 8 rows of that
 * expert's gate and up, one warp per row (both matrices streamed together).
 * EF: the weight loads carry an L2 evict_first policy, as k_moe_down_b's
 * copies do (cuda_ctx.moe_ef): a token's 75 MB of expert rows are read once,
 * and marked so they leave L2 before anything else does. Measured on the
 * H200 (30B-A3B tg128, alternated in three runs): +1.5-4.4%.
 */
template <bool EF>
__global__ void __launch_bounds__(256) k_moe_gate_up(bf16 *__restrict__ h, const bf16 *__restrict__ x, const int *__restrict__ sel,
                                                     const bf16 *const *__restrict__ selp, const bf16 *const *__restrict__ gate,
                                                     const bf16 *const *__restrict__ up, int K, int ffn, int dim) {
    KTRACE();
    const moe_ld<EF> ld;
    /* wait, then release: k_moe_down_b reads k_route's pointers before its
     * own wait, which is safe only if this launch releases it after k_route
     * is done */
    pdl_wait_release();
    const int p = blockIdx.y, i = p / K;
    const int r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= ffn) return;
    const bf16 *gb, *ub;
    if (selp) gb = selp[3 * p], ub = selp[3 * p + 1]; /* written by k_route */
    else gb = gate[sel[p]], ub = up[sel[p]];
    const int nch = dim >> 3;
    const uint4 *xv = (const uint4 *)(x + (size_t)i * dim);
    const uint4 *g = (const uint4 *)(gb + (size_t)r * dim), *u = (const uint4 *)(ub + (size_t)r * dim);
    float ag = 0.f, au = 0.f;
    int c = lane;
    for (; c + 32 < nch; c += 64) {
        uint4 g0 = ld(g + c), g1 = ld(g + c + 32), u0 = ld(u + c), u1 = ld(u + c + 32);
        uint4 x0 = __ldg(xv + c), x1 = __ldg(xv + c + 32);
        ag = dot8(ag, g0, x0), ag = dot8(ag, g1, x1), au = dot8(au, u0, x0), au = dot8(au, u1, x1);
    }
    for (; c < nch; c += 32) {
        uint4 x0 = __ldg(xv + c);
        ag = dot8(ag, ld(g + c), x0), au = dot8(au, ld(u + c), x0);
    }
    ag = warp_sum(ag), au = warp_sum(au);
    if (lane == 0) h[(size_t)p * ffn + r] = __float2bfloat16(silu(ag) * au);
}

/*
 * k_moe_down: out[i][r] = sum_k wsel[i][k] * (down_e[r] . h[i*K+k]).
 * Decomposition: grid.y = token, a block owns 4 output rows; warp w takes
 * routed slots k = w, w+8, ... and all 4 rows (4 weight rows in flight);
 * the weighted partials meet in shared memory, summed in slot order.
 */
#define MOE_DOWN_ROWS 4
__global__ void __launch_bounds__(256) k_moe_down(bf16 *__restrict__ out, const bf16 *__restrict__ h, const int *__restrict__ sel,
                                                  const bf16 *const *__restrict__ selp, const float *__restrict__ wsel,
                                                  const bf16 *const *__restrict__ down, int K, int ffn, int dim) {
    KTRACE();
    pdl_wait();
    const int i = blockIdx.y, r0 = blockIdx.x * MOE_DOWN_ROWS, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nch = ffn >> 3;
    __shared__ float red[8][MOE_DOWN_ROWS];
    float tot[MOE_DOWN_ROWS] = {0.f, 0.f, 0.f, 0.f};
    for (int k = warp; k < K; k += 8) {
        const int p = i * K + k;
        const bf16 *db = selp ? selp[3 * p + 2] : down[sel[p]];
        const uint4 *hv = (const uint4 *)(h + (size_t)p * ffn);
        float acc[MOE_DOWN_ROWS] = {0.f, 0.f, 0.f, 0.f};
        for (int c = lane; c < nch; c += 32) {
            uint4 hx = __ldg(hv + c);
#pragma unroll
            for (int q = 0; q < MOE_DOWN_ROWS; q++)
                if (r0 + q < dim) acc[q] = dot8(acc[q], ld_stream((const uint4 *)(db + (size_t)(r0 + q) * ffn) + c), hx);
        }
        const float wk = wsel[p];
#pragma unroll
        for (int q = 0; q < MOE_DOWN_ROWS; q++) tot[q] += wk * warp_sum(acc[q]);
    }
    if (lane == 0)
#pragma unroll
        for (int q = 0; q < MOE_DOWN_ROWS; q++) red[warp][q] = tot[q];
    __syncthreads();
    if (threadIdx.x < MOE_DOWN_ROWS && r0 + (int)threadIdx.x < dim) {
        float s = 0.f;
        for (int w = 0; w < 8; w++) s += red[w][threadIdx.x];
        out[(size_t)i * dim + r0 + threadIdx.x] = __float2bfloat16(s);
    }
}

/*
 * k_moe_down_b (sm_90): k_moe_down with its weights and h landing in shared
 * memory by bulk copies. k_moe_down keeps 4 16-byte loads per lane in flight
 * and walks a 768-wide row in 3 such round trips, so each SM has ~64 KB on
 * the way at a time (2.1 TB/s measured, against 3.2 for gate/up). Here a
 * block of R output rows issues, right after its wait, one copy per (slot,
 * row) of the chosen experts' rows (R x K x 2 ffn bytes: 96 KB for Qwen3-30B-A3B at R = 8)
 * and one of the token's K rows of h, all on one mbarrier: the block's whole
 * share of the matrix is in flight at once, and two resident blocks per SM
 * hold the layer's 25 MB in one round trip. Decomposition and order of sums
 * as k_moe_down (warp w: slots w, w + 8, ...; lanes stride a row's 16-byte
 * chunks; the warps' weighted sums meet in shared memory in warp order), so
 * the same bits. Shared layout: slot k's row q at (k R + q) ffn elements,
 * then h's K rows.
 */
template <int R>
__global__ void __launch_bounds__(256) k_moe_down_b(bf16 *__restrict__ out, const bf16 *__restrict__ h,
                                                    const bf16 *const *__restrict__ selp, const float *__restrict__ wsel, int K,
                                                    int ffn, int dim, int pre, int ef) {
    KTRACE();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char mdb[];
    __shared__ __align__(8) uint64_t bar[2]; /* weights, h */
    __shared__ float red[8][R];
    const int i = blockIdx.y, r0 = blockIdx.x * R, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nr = min(R, dim - r0), nch = ffn >> 3;
    const unsigned rb = (unsigned)ffn * 2, bw = smem_u32(&bar[0]), bh = smem_u32(&bar[1]);
    const bf16 *hs = (const bf16 *)(mdb + (size_t)K * R * rb);
    if (threadIdx.x == 0) {
        mbar_init(bw, 1), mbar_init(bh, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        mbar_arrive_tx(bw, (unsigned)(K * nr) * rb);
    }
    __syncthreads();
    auto issue = [&]() {
        for (int t = threadIdx.x; t < K * nr; t += blockDim.x) {
            const int k = t / nr, q = t % nr;
            const bf16 *src = selp[3 * (i * K + k) + 2] + (size_t)(r0 + q) * ffn;
            const unsigned dst = smem_u32(mdb + (size_t)(k * R + q) * rb);
            if (ef) bulk_load_pol(dst, src, rb, bw, pol_evict_first());
            else bulk_load(dst, src, rb, bw);
        }
    };
    /* pre: the launch before (k_moe_gate_up) released this one after its
     * own wait, so k_route, which wrote selp, is done: the weight copies go
     * out while gate/up still runs */
    if (pre) issue();
    pdl_wait();
    if (!pre) issue();
    if (threadIdx.x == 0) {
        mbar_arrive_tx(bh, (unsigned)K * rb);
        bulk_load(smem_u32(hs), h + (size_t)i * K * ffn, (unsigned)K * rb, bh);
    }
    float tot[R];
#pragma unroll
    for (int q = 0; q < R; q++) tot[q] = 0.f;
    mbar_wait(bw, 0);
    mbar_wait(bh, 0);
    for (int k = warp; k < K; k += 8) {
        const uint4 *hv = (const uint4 *)(hs + (size_t)k * ffn);
        float acc[R];
#pragma unroll
        for (int q = 0; q < R; q++) acc[q] = 0.f;
        for (int c = lane; c < nch; c += 32) {
            const uint4 hx = hv[c];
#pragma unroll
            for (int q = 0; q < R; q++)
                if (q < nr) acc[q] = dot8(acc[q], ((const uint4 *)(mdb + (size_t)(k * R + q) * rb))[c], hx);
        }
        const float wk = wsel[i * K + k];
#pragma unroll
        for (int q = 0; q < R; q++) tot[q] += wk * warp_sum(acc[q]);
    }
    if (lane == 0)
#pragma unroll
        for (int q = 0; q < R; q++) red[warp][q] = tot[q];
    __syncthreads();
    if (threadIdx.x < nr) {
        float s = 0.f;
        for (int w = 0; w < 8; w++) s += red[w][threadIdx.x];
        out[(size_t)i * dim + r0 + threadIdx.x] = __float2bfloat16(s);
    }
#else
    __trap(); /* bulk copies are sm_90: the host never launches this elsewhere */
#endif
}

/*
 * k_moe_down_r: k_moe_down with each warp's rows held in registers. Warp w
 * takes slots w, w + 8, ... as k_moe_down does; for a slot it loads its R
 * rows' chunks c = lane + 32 j (j < J, J = ceil(ffn / 256)) at once, R x J
 * 16-byte loads per lane in flight (24: 96 registers), then reads h and
 * adds in k_moe_down's order, so the same bits. With pre (right after
 * k_moe_gate_up, which releases this launch after its own wait, so k_route's
 * selp is written) the first slot's loads go out before the wait, while
 * gate/up still runs. Two blocks per SM: Qwen3-30B-A3B's 256 blocks
 * (R = 8) are one wave holding the layer's 25 MB of down rows in flight.
 * Measured alone on the H200 (tools/stream_bench.cu, 8 experts of
 * 2048 x 768): 6.47 us (3.89 TB/s) against 8.40 (3.00) for k_moe_down_b's
 * bulk copies, which no chunk size lifts above ~3.3 TB/s.
 */
template <int R, int J, bool EF>
__global__ void __launch_bounds__(256, 2) k_moe_down_r(bf16 *__restrict__ out, const bf16 *__restrict__ h,
                                                       const bf16 *const *__restrict__ selp, const float *__restrict__ wsel,
                                                       int K, int ffn, int dim, int pre) {
    KTRACE();
    const moe_ld<EF> ld;
    __shared__ float red[8][R];
    const int i = blockIdx.y, r0 = blockIdx.x * R, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nr = min(R, dim - r0), nch = ffn >> 3;
    uint4 wv[R][J];
    auto load = [&](int k) {
        const bf16 *db = selp[3 * (i * K + k) + 2] + (size_t)r0 * ffn;
#pragma unroll
        for (int q = 0; q < R; q++)
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int c = lane + 32 * j;
                if (q < nr && c < nch) wv[q][j] = ld((const uint4 *)(db + (size_t)q * ffn) + c);
            }
    };
    if (pre && warp < K) load(warp);
    pdl_wait();
    KTRACE_MARK(0); /* past the wait */
    float tot[R];
#pragma unroll
    for (int q = 0; q < R; q++) tot[q] = 0.f;
    for (int k = warp; k < K; k += 8) {
        if (!pre || k != warp) load(k);
        const uint4 *hv = (const uint4 *)(h + (size_t)(i * K + k) * ffn);
        float acc[R];
#pragma unroll
        for (int q = 0; q < R; q++) acc[q] = 0.f;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int c = lane + 32 * j;
            if (c < nch) {
                const uint4 hx = __ldg(hv + c);
#pragma unroll
                for (int q = 0; q < R; q++)
                    if (q < nr) acc[q] = dot8(acc[q], wv[q][j], hx);
            }
        }
        const float wk = wsel[i * K + k];
#pragma unroll
        for (int q = 0; q < R; q++) tot[q] += wk * warp_sum(acc[q]);
    }
    KTRACE_MARK(1); /* warp 0's slots summed: its rows and h landed */
    if (lane == 0)
#pragma unroll
        for (int q = 0; q < R; q++) red[warp][q] = tot[q];
    __syncthreads();
    KTRACE_MARK(2); /* every warp's sums in */
    if (threadIdx.x < nr) {
        float s = 0.f;
        for (int w = 0; w < 8; w++) s += red[w][threadIdx.x];
        out[(size_t)i * dim + r0 + threadIdx.x] = __float2bfloat16(s);
    }
}

static long moe_down_r_runs;
extern "C" long kiln_cuda_moe_down_r_count(void);
extern "C" long kiln_cuda_moe_down_r_count(void) { return moe_down_r_runs; }

/* k_moe_down_r for ffn <= 256 J: R = 24 / J rows per block */
template <int J>
static void launch_down_r(struct cuda_ctx *c, bf16 *out, const bf16 *h, const bf16 *const *selp, const float *wsel, int n, int K,
                          int ffn, int dim, int pre) {
    constexpr int R = 24 / J;
    dim3 grid((unsigned)((dim + R - 1) / R), (unsigned)n);
    if (c->moe_ef) cu_launch(c->stream, k_moe_down_r<R, J, true>, grid, 256, 0, out, h, selp, wsel, K, ffn, dim, pre);
    else cu_launch(c->stream, k_moe_down_r<R, J, false>, grid, 256, 0, out, h, selp, wsel, K, ffn, dim, pre);
    moe_down_r_runs++;
}

/* shared memory per k_moe_down_b block: 2 fit on an SM (228 KB) */
#define MOE_DOWN_B_SMEM (110 * 1024 + 768)

/* whether this device runs k_moe_down_b (sm_90 code in the build) */
static int moe_down_b_ok(void) {
    static int ok = -1;
    if (ok < 0) {
        ok = cu_sm90_code((const void *)k_moe_down_b<8>) &&
             cudaFuncSetAttribute(k_moe_down_b<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_DOWN_B_SMEM) == cudaSuccess &&
             cudaFuncSetAttribute(k_moe_down_b<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_DOWN_B_SMEM) == cudaSuccess &&
             cudaFuncSetAttribute(k_moe_down_b<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_DOWN_B_SMEM) == cudaSuccess &&
             cudaFuncSetAttribute(k_moe_down_b<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_DOWN_B_SMEM) == cudaSuccess;
        cudaGetLastError();
    }
    return ok;
}

static long moe_down_b_runs;
extern "C" long kiln_cuda_moe_down_b_count(void);
extern "C" long kiln_cuda_moe_down_b_count(void) { return moe_down_b_runs; }
extern "C" int kiln_cuda_moe_down_b_ok(void);
extern "C" int kiln_cuda_moe_down_b_ok(void) { return moe_down_b_ok(); }

void cu_moe_gate_up(struct cuda_ctx *c, bf16 *h, const bf16 *x, const int *sel, const bf16 *const *selp, const bf16 *const *gate,
                    const bf16 *const *up, int n, int K, int ffn, int dim) {
    dim3 grid((unsigned)((ffn + 7) / 8), (unsigned)(n * K));
    if (c->moe_ef) cu_launch(c->stream, k_moe_gate_up<true>, grid, 256, 0, h, x, sel, selp, gate, up, K, ffn, dim);
    else cu_launch(c->stream, k_moe_gate_up<false>, grid, 256, 0, h, x, sel, selp, gate, up, K, ffn, dim);
    CU_LAUNCHED();
    c->moe_gu_seq = cu_launch_seq;
}

void cu_moe_down(struct cuda_ctx *c, bf16 *out, const bf16 *h, const int *sel, const bf16 *const *selp, const float *wsel,
                 const bf16 *const *down, int n, int K, int ffn, int dim) {
    /* the weights before the wait only right after k_moe_gate_up (which
     * releases this launch after its own wait); the register kernel where a
     * warp's rows fit (ffn <= 3072), else the bulk-copy one where they fit in
     * shared memory, else k_moe_down */
    const int pre = !c->no_moe_pre && c->moe_gu_seq == cu_launch_seq;
    if (selp && !c->no_moe_ld && ffn <= 3072) {
        if (ffn <= 768) launch_down_r<3>(c, out, h, selp, wsel, n, K, ffn, dim, pre);
        else if (ffn <= 1536) launch_down_r<6>(c, out, h, selp, wsel, n, K, ffn, dim, pre);
        else launch_down_r<12>(c, out, h, selp, wsel, n, K, ffn, dim, pre);
        CU_LAUNCHED();
        return;
    }
    /* the bulk kernel: the most rows per block (8, 4, 2, 1) whose copies fit
     * in two blocks' share of an SM */
    const size_t rb = (size_t)ffn * 2;
    int R = 8;
    while (R > 1 && (size_t)K * (R + 1) * rb > MOE_DOWN_B_SMEM) R /= 2;
    if (selp && !c->no_moe_bulk && (size_t)K * (R + 1) * rb <= MOE_DOWN_B_SMEM && moe_down_b_ok()) {
        dim3 grid((unsigned)((dim + R - 1) / R), (unsigned)n);
        const size_t smem = (size_t)K * (R + 1) * rb;
        moe_down_b_runs++;
        switch (R) {
        case 8: cu_launch(c->stream, k_moe_down_b<8>, grid, 256, smem, out, h, selp, wsel, K, ffn, dim, pre, c->moe_ef); break;
        case 4: cu_launch(c->stream, k_moe_down_b<4>, grid, 256, smem, out, h, selp, wsel, K, ffn, dim, pre, c->moe_ef); break;
        case 2: cu_launch(c->stream, k_moe_down_b<2>, grid, 256, smem, out, h, selp, wsel, K, ffn, dim, pre, c->moe_ef); break;
        default: cu_launch(c->stream, k_moe_down_b<1>, grid, 256, smem, out, h, selp, wsel, K, ffn, dim, pre, c->moe_ef); break;
        }
        CU_LAUNCHED();
        return;
    }
    dim3 grid((unsigned)((dim + MOE_DOWN_ROWS - 1) / MOE_DOWN_ROWS), (unsigned)n);
    cu_launch(c->stream, k_moe_down, grid, 256, 0, out, h, sel, selp, wsel, down, K, ffn, dim);
    CU_LAUNCHED();
}

/* ==== q/k/v as one GEMM (prefill) ==== */

static long qkv_merges;
extern "C" long kiln_cuda_qkv_merge_count(void);
extern "C" long kiln_cuda_qkv_merge_count(void) { return qkv_merges; }

/* 1 if the three linears run as one GEMM: bf16 weights that
 * cu_group_linears put back to back (biases are added by the kernels that
 * read the output), a prefill (some sequence has
 * more than one new row: a batch of single-row decodes keeps its rope for
 * the attention kernel) of more rows than the GEMV paths take and at most
 * qkv_max, and the ops not being recorded for a graph */
static int qkv_merges_ok(struct cuda_ctx *c, void *const *outs, const void *x, const struct qlinear *const *ws, int n) {
    if (n > c->qkv_max || n <= TC_MAX_ROWS || c->max_seq_n < 2 || c->tape_on || c->no_defer || c->no_fuse ||
        c->mode != CU_EAGER)
        return 0;
    const bf16 *next = NULL;
    for (int i = 0; i < 3; i++) {
        const struct cu_linear *L = (const struct cu_linear *)ws[i]->be;
        if (!L || !L->w || L->q4 || ws[i]->n_in != ws[0]->n_in || ws[i]->n_out % 8 || (next && L->w != next) ||
            outs[i] == x || (i && outs[i] == outs[0]) || (i == 2 && outs[2] == outs[1]))
            return 0;
        next = L->w + (size_t)ws[i]->n_out * ws[i]->n_in;
    }
    return 1;
}

void cu_matmul_multi(struct kiln_backend *be, void *const *outs, const void *x, const struct qlinear *const *ws, int count, int n) {
    CU_SKIP_IF_REPLAY(be);
    struct cuda_ctx *c = cu_ctx(be);
    if (count == 3 && qkv_merges_ok(c, outs, x, ws, n)) {
        const int ld = ws[0]->n_out + ws[1]->n_out + ws[2]->n_out;
        cu_flush(c);
        /* the output: scratch, but a failed allocation only means three
         * GEMMs instead of one */
        if (cu_scratch_try(c, (void **)&c->qkv_buf, &c->qkv_buf_cap, (size_t)n * ld * 2, 0)) {
            blas_gemm(c, c->qkv_buf, CUDA_R_16BF, (const bf16 *)x, ((const struct cu_linear *)ws[0]->be)->w, n, ld, ws[0]->n_in);
            c->pqkv.on = 1, c->pqkv.n = n, c->pqkv.ld = ld, c->pqkv.s = c->qkv_buf;
            for (int i = 0; i < 3; i++)
                c->pqkv.out[i] = (bf16 *)outs[i], c->pqkv.n_out[i] = ws[i]->n_out, c->pqkv.bias.b[i] = ((const struct cu_linear *)ws[i]->be)->bias;
            qkv_merges++;
            return;
        }
    }
    for (int i = 0; i < count; i++) cu_matmul(be, outs[i], x, ws[i], n);
}
