/*
 * Kernel timeline trace: where a decode step's time goes, graphs and PDL
 * included. No profiler with a timeline runs on the lent H200s (nsys is
 * absent, ncu serialises kernels and so hides exactly the overlaps PDL and
 * the early weight copies buy), so the kernels time themselves.
 *
 * Only in a build with -DKILN_CUDA_TRACE (`make ktrace`: build-trace/);
 * in every other build KTRACE() and KTRACE_WAITED() are empty.
 *
 * Each traced kernel opens with KTRACE(). Every block reads %globaltimer
 * there (t0), again right after its wait on the kernel before (pdl_wait or
 * the GEMVs' own wait: tw), and when its last warp leaves the kernel (t1,
 * from a destructor, so early returns count too); it then stores one record
 * {grid id, block, site, SM, t0, tw, t1} in a device buffer. The site is the
 * source line of the KTRACE() with the file's index among the units that
 * registered (ktrace.cu). KTRACE_MARK(i) adds thread 0's time at up to
 * KT_MARKS points inside a kernel.
 *
 * At run time KILN_CUDA_KTRACE=FILE turns it on: the records of forward
 * number KILN_CUDA_KTRACE_AT (default 40, counted from 1: a decode step of a
 * bench after its prompt) are written to FILE as text, one block per line;
 * tools/ktrace.py turns them into a per-launch timeline and a per-kernel
 * account of the step.
 *
 * Cost in the trace build: a barrier at each block's start, two shared
 * atomics per warp and a 56-byte store per block at its end; the figures it
 * gives are for comparing kernels within a step, not for the benchmark table.
 */
#pragma once

#ifdef KILN_CUDA_TRACE

#define KT_MARKS 6
struct ktrace_rec {
    unsigned grid, blk, site, sm;
    unsigned long long t0, tw, t1;
    unsigned mark[KT_MARKS]; /* KTRACE_MARK(i)'s time, ns after t0; 0: not reached */
};
/* a record's slot: (grid id mod KT_LAUNCHES) x KT_BLOCKS + block. Grid ids
 * count launches one by one, so a forward of up to KT_LAUNCHES launches
 * writes each block's record to its own slot with a plain store (an atomic
 * slot counter kept the block's last warp waiting ~1 us at every kernel's end) */
#define KT_LAUNCHES 1024
#define KT_BLOCKS 2048

/* per translation unit (no relocatable device code): ktrace.cu points each
 * unit's copy at the buffer for the traced forward and back to NULL after */
static __constant__ struct ktrace_rec *ktrace_buf;
static __constant__ unsigned ktrace_file;

extern "C" void ktrace_register(void (*set)(void *buf, unsigned file, cudaStream_t s), const char *name);
static void ktrace_set_unit(void *buf, unsigned file, cudaStream_t s) {
    cudaMemcpyToSymbolAsync(ktrace_buf, &buf, sizeof buf, 0, cudaMemcpyHostToDevice, s);
    cudaMemcpyToSymbolAsync(ktrace_file, &file, sizeof file, 0, cudaMemcpyHostToDevice, s);
}
static int ktrace_unit_registered = (ktrace_register(ktrace_set_unit, __BASE_FILE__), 0);

__device__ __forceinline__ unsigned long long ktrace_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned ktrace_tid(void) { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
/* the block's times and exited warps: static shared variables, so the trace
 * holds no registers across the kernel (more registers would change the
 * occupancy it is there to observe) */
struct ktrace_shared {
    unsigned long long t0, tw, t1, mark[KT_MARKS];
    unsigned exited;
};
__device__ __forceinline__ struct ktrace_shared &ktrace_sh(void) {
    __shared__ struct ktrace_shared sh;
    return sh;
}
__device__ __forceinline__ unsigned long long &ktrace_tw(void) { return ktrace_sh().tw; }

/* t0 at entry (one barrier, so that no warp can leave before the shared
 * fields are set); on leaving, lane 0 of each warp raises t1 to its time, and
 * the last warp out writes the block's record */
template <unsigned SITE>
struct ktrace_scope {
    __device__ ktrace_scope() {
        if (ktrace_tid() == 0) {
            struct ktrace_shared &sh = ktrace_sh();
            sh.t0 = ktrace_now(), sh.tw = 0, sh.t1 = 0, sh.exited = 0;
            for (int i = 0; i < KT_MARKS; i++) sh.mark[i] = 0;
        }
        __syncthreads();
    }
    __device__ ~ktrace_scope() {
        if ((ktrace_tid() & 31) != 0) return;
        struct ktrace_shared &sh = ktrace_sh();
        atomicMax(&sh.t1, ktrace_now());
        __threadfence_block(); /* this warp's earlier stamps (tw, marks) before its exit count */
        const unsigned nw = (blockDim.x * blockDim.y * blockDim.z + 31) / 32;
        if (atomicAdd(&sh.exited, 1u) != nw - 1) return;
        struct ktrace_rec *buf = ktrace_buf;
        const unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        if (!buf || blk >= KT_BLOCKS) return;
        unsigned long long g;
        unsigned sm;
        asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        struct ktrace_rec r;
        r.grid = (unsigned)g, r.blk = blk, r.site = ktrace_file << 16 | SITE, r.sm = sm;
        r.t0 = sh.t0, r.tw = sh.tw, r.t1 = *(volatile unsigned long long *)&sh.t1;
        for (int i = 0; i < KT_MARKS; i++) r.mark[i] = sh.mark[i] ? (unsigned)(sh.mark[i] - sh.t0) : 0;
        buf[(size_t)(g % KT_LAUNCHES) * KT_BLOCKS + blk] = r;
    }
};
#define KTRACE() ktrace_scope<__LINE__> ktrace_scope_
#define KTRACE_WAITED()                                 \
    do {                                                \
        if (ktrace_tid() == 0) ktrace_tw() = ktrace_now(); \
    } while (0)
/* thread 0's time at a point inside a kernel (i < KT_MARKS), for a kernel
 * whose own span needs taking apart */
#define KTRACE_MARK(i)                                          \
    do {                                                        \
        if (ktrace_tid() == 0) ktrace_sh().mark[i] = ktrace_now(); \
    } while (0)
/* the same once the float v has arrived (a load's result: the empty asm
 * takes it as an input, so the mark waits for it) */
#define KTRACE_MARK_AFTER(i, v)                 \
    do {                                        \
        asm volatile("" ::"f"(v) : "memory");   \
        KTRACE_MARK(i);                         \
    } while (0)

/* host side (ktrace.cu): read the environment once the device is set; a
 * forward's start and end (cuda.cu cu_begin, cu_finish) */
void ktrace_init(void);
void ktrace_begin(cudaStream_t s);
void ktrace_end(cudaStream_t s);

#else
static inline void ktrace_init(void) {}
static inline void ktrace_begin(cudaStream_t) {}
static inline void ktrace_end(cudaStream_t) {}
#define KTRACE() \
    do {         \
    } while (0)
#define KTRACE_WAITED() \
    do {                \
    } while (0)
#define KTRACE_MARK(i) \
    do {               \
    } while (0)
#define KTRACE_MARK_AFTER(i, v) \
    do {                        \
    } while (0)
#endif
