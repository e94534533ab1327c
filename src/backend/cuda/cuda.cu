/*
 * cuda.cu: the CUDA backend's op table, memory, weight upload, the per-forward
 * batch upload (`begin`), and CUDA graphs for decode steps.
 *
 * Owns: the stream, the cuBLAS handle, device memory and its accounting,
 * the device copy of each batch, and the graph cache. Kernels live in the
 * other files, one op family each (gemm, norm, rope, attention, moe, misc).
 *
 * Decisions a reader would question:
 *  - Weights are uploaded once at load, as bf16 (F16/F32 converted on the
 *    device). The tied lm_head shares the embedding's upload.
 *  - Decode steps are replayed from CUDA graphs. A step's ops are recorded
 *    the second time a batch shape (n_tokens, n_seqs, n_out) is seen (the
 *    first run is eager, which also sizes every scratch buffer), and replayed
 *    from then on: `begin` uploads the new tokens/positions/page tables into
 *    the same device buffer, every op returns at once, and `read` launches
 *    the graph. Kernels of a graphed step take all batch contents (lengths,
 *    pages, expert ids) from device memory, never from launch arguments.
 *    Any `free` drops the graphs, since they hold raw pointers.
 *    KILN_CUDA_GRAPHS=0 turns them off.
 *  - Decode matmuls are queued and launched together at the next other op
 *    (gemm.cu: q/k/v as one launch, gate/up fused with SwiGLU), and every
 *    kernel uses programmatic dependent launch (cuda.cuh cu_launch): both cut
 *    the fixed cost of the ~10 small launches per layer.
 *  - Memory is reported once, after the first forward: weights, KV pool,
 *    activations, and this backend's own workspace, separately.
 * Switches for experiments: KILN_CUDA_GRAPHS=0, KILN_CUDA_DEFER=0,
 * KILN_CUDA_PDL=0, KILN_CUDA_NO_FLASH=1 (prefill attention on the row kernel),
 * KILN_CUDA_FA_SPLIT=0 (no split-KV in the prefill attention; =N cuts the
 * longest tile's keys into N chunks),
 * KILN_CUDA_FUSE=0 (no rope+KV write fusion), KILN_CUDA_FUSE_ATT=0 (a decode
 * layer's rope + KV write as their own launch instead of inside the row
 * attention kernel), KILN_CUDA_FUSE_NORM=1 (fold
 * RMSNorm and the residual add into the next decode GEMV), KILN_CUDA_PF=0 (no
 * L2 prefetch of GEMV weights before griddepcontrol.wait), KILN_CUDA_READ=0
 * (logits widened on the device and copied pageable, the old path),
 * KILN_CUDA_MOE_GROUPED=0 (MoE prefill: one cuBLAS call per expert GEMM
 * instead of two grouped calls), KILN_CUDA_NORM_R=0 (norms on the two-pass
 * kernel only, norm.cu), KILN_CUDA_ATT_SPLIT_TOKENS=N (keys per decode
 * attention split, default ATT_SPLIT_TOKENS), KILN_CUDA_ATT_CLUSTER=0 (decode
 * attention merges its splits through global memory, not a cluster's
 * shared memory), KILN_CUDA_MOE_PTR=0 (MoE decode's expert GEMVs read the
 * expert id, then the pointer table, instead of k_route's pointers),
 * KILN_CUDA_MOE_BULK=0 (MoE decode's down GEMV without bulk copies),
 * KILN_CUDA_MOE_PRE=0 (its weight copies issued after its wait),
 * KILN_CUDA_GEMV_B=0 (no bulk-copy GEMV for matrices that fit in shared
 * memory), KILN_CUDA_GEMV_B_SPREAD=0 (its blocks not spread evenly over the
 * SMs), KILN_CUDA_ATT_DEC_CTX=N (decode steps take attn_dec.cu from N keys of
 * context, default ATT_DEC_MIN_CTX; 0: never), KILN_CUDA_ATT_DEC_SEQS=N (for
 * decode steps of at most N sequences, default ATT_DEC_MAX_SEQS),
 * KILN_CUDA_ATT_PRE=0 (decode attention reads no cached key before its
 * wait), KILN_CUDA_GEMV_TC=N (decode matmuls of 3..N rows on gemm.cu's
 * tensor-core GEMV, default 16; 0: cuBLAS), KILN_CUDA_MOE_W4_PAIRS=N and
 * KILN_CUDA_MOE_W4_BATCH=N (4-bit MoE experts: pair by pair up to N tokens,
 * expert by expert up to N, defaults MOE_W4_PAIRS_MAX / MOE_W4_BATCH_MAX,
 * MOE_W4_MIXED_MAX where no GEMMs on the codes follow; moe_w4.cu),
 * KILN_CUDA_MOE_W4_GEMM=N (above those, GEMMs on the codes
 * while the routed rows per expert average at most N, default 96; 0: the
 * bf16 scratch copy), KILN_CUDA_MOE_W4_WT=0 (4-bit down: a block per tile,
 * not a warp), KILN_CUDA_MOE_W4_GU_WARPS=4 (4-bit gate/up in blocks of 4
 * warps, 4 per SM, instead of 8; unmeasured, for an A/B).
 */
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include <unordered_map>

#include "backend/cuda/cuda.cuh"
#include "format/config.h"
extern "C" {
#include "format/quant.h"
}

/* decode steps (one token per sequence) of at most this many tokens may be
 * captured as graphs; the ops they call must all be device-driven or depend
 * on the shape only at these sizes (gemm.cu GEMV and cuBLAS, attention.cu
 * row kernel). MoE models stop where moe.cu's device-driven paths stop
 * (cuda_ctx.moe_direct, moe_batch; 4-bit experts: moe_w4_pairs,
 * moe_w4_batch): above them it groups the experts through the host. */
#define GRAPH_MAX_TOKENS 512

static cudaEvent_t meta_done;
/* KILN_CUDA_PROFILE=1: host time per forward, split into issuing the ops
 * (begin to read), waiting for the GPU, and copying the logits out;
 * printed when the backend is destroyed */
static int prof_on;
static double prof_t0, prof_issue, prof_wait, prof_copy;
static long prof_n;
int cu_pdl = 1;

/* the environment variable name is set to exactly v (the switches below) */
static int env_is(const char *name, const char *v) {
    const char *e = getenv(name);
    return e && !strcmp(e, v);
}

/* the environment variable name as an integer in [lo, hi], else (unset,
 * empty or out of range) def (the tunables below) */
static int env_int(const char *name, int def, int lo, int hi) {
    const char *e = getenv(name);
    if (!e || !*e) return def;
    const int v = atoi(e);
    return v >= lo && v <= hi ? v : def;
}

int cu_sm90_code(const void *k) {
    int dev = 0, major = 0;
    cudaFuncAttributes fa;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    const int ok = major >= 9 && cudaFuncGetAttributes(&fa, k) == cudaSuccess && fa.binaryVersion >= 90;
    cudaGetLastError();
    return ok;
}
int cu_cluster_max(const void *k, int threads, size_t smem) {
    int n = 0;
    for (int want = 16; want >= 8 && !n; want /= 2) {
        if (want > 8 && cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) continue;
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at;
        at.id = cudaLaunchAttributeClusterDimension;
        at.val.clusterDim.x = 1, at.val.clusterDim.y = (unsigned)want, at.val.clusterDim.z = 1;
        cfg.gridDim = dim3(1, (unsigned)want), cfg.blockDim = dim3((unsigned)threads), cfg.dynamicSmemBytes = smem;
        cfg.attrs = &at, cfg.numAttrs = 1;
        int c = 0;
        if (cudaOccupancyMaxActiveClusters(&c, k, &cfg) == cudaSuccess && c > 0) n = want;
    }
    cudaGetLastError();
    return n;
}
thread_local unsigned long cu_launch_seq;
extern int cu_gemv_pf, cu_gemv_rows, cu_gemv_bps, cu_gemv_srows, cu_gemv_smb, cu_gemv_tc;
/* sizes of the engine's buffers (activations, KV pages), for the accounting */
static std::unordered_map<void *, size_t> buf_sizes;

/* ==== memory ==== */

static void graphs_drop(struct cuda_ctx *c) {
    for (int i = 0; i < c->n_graphs; i++) {
        if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
        cu_sk_free(c->graphs[i].sk);
    }
    c->n_graphs = 0;
    c->tape_on = 0; /* a step being recorded may hold freed pointers */
}

static void *cu_alloc(struct kiln_backend *be, size_t bytes) {
    struct cuda_ctx *c = cu_ctx(be);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error so later calls work */
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        kiln_log(KILN_LOG_ERROR, "cuda: cannot allocate %.2f GiB (%.2f GiB free of %.2f)", bytes / 1073741824.0,
                 fr / 1073741824.0, tot / 1073741824.0);
        return NULL;
    }
    /* zeroed: a KV page slot that was never written must still read as a
     * finite value (flash_wg.cu's copy engine loads whole pages and masks
     * the slots past a sequence; 0 x NaN would not vanish) */
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes ? bytes : 256, c->stream));
    c->bytes_buffers += bytes;
    buf_sizes[p] = bytes;
    return p;
}

static void cu_free(struct kiln_backend *be, void *p) {
    cu_flush(cu_ctx(be));
    struct cuda_ctx *c = cu_ctx(be);
    if (!p) return;
    graphs_drop(c);
    auto it = buf_sizes.find(p);
    if (it != buf_sizes.end()) c->bytes_buffers -= it->second, buf_sizes.erase(it);
    CUDA_CHECK(cudaFree(p));
}

void *cu_scratch(struct cuda_ctx *c, void **p, size_t *cap, size_t bytes) { return cu_scratch_try(c, p, cap, bytes, 1); }

void *cu_scratch_try(struct cuda_ctx *c, void **p, size_t *cap, size_t bytes, int fault) {
    if (bytes <= *cap) return *p;
    if (c->mode == CU_CAPTURE) {
        fprintf(stderr, "kiln: cuda: scratch grew during graph capture (a bug)\n");
        abort();
    }
    graphs_drop(c);
    if (*p) {
        CUDA_CHECK(cudaFree(*p));
        c->bytes_ws -= *cap;
        *p = NULL, *cap = 0;
    }
    bytes = bytes + bytes / 4 + 256;
    if (cudaMalloc(p, bytes) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is not a sticky error */
        *p = NULL;
        if (fault) cu_fault(c, bytes, 0);
        return NULL;
    }
    c->bytes_ws += bytes;
    *cap = bytes;
    return *p;
}

/* test hook: the next n pinned allocations fail, as if the host could not
 * pin the memory */
static int pin_fail;
extern "C" void kiln_cuda_pin_fail(int n);
extern "C" void kiln_cuda_pin_fail(int n) { pin_fail = n; }

int cu_pinned(struct cuda_ctx *c, void **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return 0;
    if (*p) CUDA_CHECK(cudaFreeHost(*p));
    *p = NULL, *cap = 0;
    bytes = bytes + bytes / 4 + 256;
    if (pin_fail > 0 || cudaMallocHost(p, bytes) != cudaSuccess) {
        if (pin_fail > 0) pin_fail--;
        cudaGetLastError(); /* not a sticky error */
        *p = NULL;
        return -1;
    }
    *cap = bytes;
    return 0;
}

int *cu_att_cnt(struct cuda_ctx *c, size_t n) {
    if (n * sizeof(int) > c->att_cnt_cap) {
        if (!cu_scratch(c, (void **)&c->att_cnt, &c->att_cnt_cap, n * sizeof(int))) return NULL;
        CUDA_CHECK(cudaMemsetAsync(c->att_cnt, 0, c->att_cnt_cap, c->stream));
    }
    return c->att_cnt;
}

/* ==== failed CUDA and cuBLAS calls ==== */

/* The first failed call since `error` last reported one (CUDA_CHECK,
 * CUBLAS_CHECK, a launch): one device per process, driven by one thread at
 * a time, as the capability caches in this backend already assume. */
static struct {
    int on;
    char what[512];
} dev_fail;

/* test hooks: kiln_cuda_inject_fault(1) fails the next launch (not sticky),
 * (2) makes the next forward start with a kernel that traps, which loses the
 * context for the rest of the process */
int cu_inject_launch;
static int inject_trap;
extern "C" void kiln_cuda_inject_fault(int kind);
extern "C" void kiln_cuda_inject_fault(int kind) { cu_inject_launch = kind == 1, inject_trap = kind == 2; }
__global__ void k_trap(void) { __trap(); }

void cu_dev_fail(const char *lib, const char *name, const char *msg, const char *file, int line, const char *call) {
    if (dev_fail.on) return; /* after a sticky error every call fails: the first says why */
    const char *f = strrchr(file, '/');
    dev_fail.on = 1;
    snprintf(dev_fail.what, sizeof dev_fail.what, "%s error %s (%s) at %s:%d, in %s", lib, name ? name : "?", msg ? msg : "?",
             f ? f + 1 : file, line, call);
    kiln_log(KILN_LOG_ERROR, "cuda: %s", dev_fail.what);
}

/* a forward whose scratch could not be allocated, or in which a CUDA or
 * cuBLAS call failed: its outputs are not valid */
static int cu_error(struct kiln_backend *be, char *err, size_t errlen) {
    struct cuda_ctx *c = cu_ctx(be);
    /* a forward that ends on a held op (today every one ends on read,
     * argmax or attention, which launch what is held) still launches it,
     * and its launch is checked here */
    if (c->mode == CU_EAGER) cu_flush(c);
    if (dev_fail.on) {
        /* a sticky error survives the read that clears any other: the
         * context is lost and nothing on this device will run again. The
         * failure stays recorded until the next forward begins */
        cudaGetLastError();
        const cudaError_t now = cudaStreamSynchronize(c->stream);
        c->dev_failed = 1;
        return kiln_errf(err, errlen, "cuda: %s; the batch failed%s", dev_fail.what,
                         now == cudaSuccess ? ", nothing else changed"
                                            : ". The GPU context is lost (a sticky error): every later batch on this device "
                                              "fails too, until kiln is restarted");
    }
    if (!c->fault_bytes) return 0;
    if (c->fault_host)
        return kiln_errf(err, errlen,
                         "cuda: out of host memory: %.1f MiB of pinned host memory for this batch's results could not be "
                         "allocated; the batch failed, nothing else changed",
                         c->fault_bytes / 1048576.0);
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    return kiln_errf(err, errlen,
                     "cuda: out of device memory: %.1f MiB of scratch for this batch could not be allocated (%.1f MiB free "
                     "of %.1f); the batch failed, nothing else changed. A lower --mem-fraction or --max-total-tokens, or a "
                     "smaller prefill chunk (--chunk; kiln serve: --chunked-prefill-size), leaves room for it",
                     c->fault_bytes / 1048576.0, fr / 1048576.0, tot / 1048576.0);
}

static void cu_memzero(struct kiln_backend *be, void *p, size_t bytes) {
    CU_TAPE(cu_ctx(be), SKT_OTHER, p, NULL, NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0.f);
    cu_flush(cu_ctx(be));
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cu_ctx(be)->stream));
}

__global__ void k_bf16_to_f32(float *out, const bf16 *in, size_t n) {
    KTRACE();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __bfloat162float(in[i]);
}

__global__ void k_f16_to_bf16(bf16 *out, const __half *in, size_t n) {
    KTRACE();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16(__half2float(in[i]));
}

__global__ void k_f32_to_bf16(bf16 *out, const float *in, size_t n) {
    KTRACE();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16(in[i]);
}

static void log_memory(struct cuda_ctx *c);

/* bf16 -> f32 on the host (exact: a shift). Many rows of logits (64 x 152k
 * at a large decode batch) are tens of MB, so above a few MB the range is
 * split over threads: one thread writes ~1.3 GB/s here, which made this
 * copy the largest part of a batch-64 step. */
struct widen_job {
    float *dst;
    const uint16_t *src;
    size_t n;
};

static int widen_avx2_ok = -1; /* set by widen_bf16 before it starts threads */

static void *widen_run(void *arg) {
    const struct widen_job *j = (const struct widen_job *)arg;
    kiln_widen16(j->dst, j->src, j->n, 0, widen_avx2_ok); /* base.c: AVX2 when the host has it */
    return NULL;
}

static void widen_bf16(float *dst, const uint16_t *src, size_t n) {
    enum { MAX_T = 8 };
#if defined(__x86_64__)
    if (widen_avx2_ok < 0) widen_avx2_ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
    widen_avx2_ok = 0;
#endif
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = n < ((size_t)1 << 20) ? 1 : (int)(cores < MAX_T ? cores : MAX_T);
    if (nt < 1) nt = 1;
    struct widen_job jobs[MAX_T];
    pthread_t th[MAX_T];
    size_t per = (n + nt - 1) / nt;
    int started = 0;
    for (int t = 0; t < nt; t++) {
        size_t b = (size_t)t * per, e = b + per < n ? b + per : n;
        jobs[t] = (struct widen_job){dst + b, src + b, b < e ? e - b : 0};
    }
    for (int t = 1; t < nt; t++) /* a thread that cannot start leaves its range to this one */
        if (pthread_create(&th[t], NULL, widen_run, &jobs[t]) == 0) started |= 1 << t;
        else widen_run(&jobs[t]);
    widen_run(&jobs[0]);
    for (int t = 1; t < nt; t++)
        if (started & (1 << t)) pthread_join(th[t], NULL);
}

/* the end of a forward's queued work: a capture becomes a graph, and a
 * graph (just captured or replayed) is launched; the stream is eager after */
static void cu_finish(struct cuda_ctx *c) {
    if (c->mode != CU_REPLAY) cu_flush(c);
    if (c->tape_on) /* the first run of a decode shape was recorded: compile it for k_step (step.cu) */
        cu_sk_compile(c, &c->graphs[c->cur_graph]);
    if (c->mode == CU_CAPTURE) {
        /* a capture that failed leaves no graph: the forward's work never
         * ran, `error` reports the failure, and the shape is recorded again */
        cudaGraph_t g = NULL;
        cudaGraphExec_t exec = NULL;
        if (!CUDA_FAILED(cudaStreamEndCapture(c->stream, &g)) && CUDA_FAILED(cudaGraphInstantiate(&exec, g, 0))) exec = NULL;
        if (g) CUDA_CHECK(cudaGraphDestroy(g));
        c->graphs[c->cur_graph].exec = exec;
        c->mode = exec ? CU_REPLAY : CU_EAGER;
    }
    if (c->mode == CU_REPLAY) {
        if (c->graphs[c->cur_graph].sk) cu_sk_launch(c, c->graphs[c->cur_graph].sk);
        else CUDA_CHECK(cudaGraphLaunch(c->graphs[c->cur_graph].exec, c->stream));
        c->mode = CU_EAGER;
    }
    ktrace_end(c->stream);
}

static void cu_read(struct kiln_backend *be, float *dst, const void *src, size_t n) {
    double t1 = prof_on ? kiln_now() : 0;
    struct cuda_ctx *c = cu_ctx(be);
    cu_finish(c);
    if (c->old_read) { /* the previous path: widened on the device, pageable copy */
        if (n) {
            float *f = (float *)cu_scratch(c, (void **)&c->f32buf, &c->f32buf_cap, n * sizeof(float));
            if (f) {
                cu_launch(c->stream, k_bf16_to_f32, (unsigned)((n + 255) / 256), 256, 0, f, (const bf16 *)src, n);
                CU_LAUNCHED();
                CUDA_CHECK(cudaMemcpyAsync(dst, f, n * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
            } else {
                memset(dst, 0, n * sizeof(float));
            }
        }
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        if (!c->logged) log_memory(c);
        return;
    }
    /* the bf16 values to pinned memory (half the bytes of f32, and a
     * pinned copy is a DMA, not a staged one), widened here: exact */
    if (cu_pinned(c, (void **)&c->logit_host, &c->logit_host_cap, n * 2)) {
        cu_fault(c, n * 2, 1); /* reported by cu_error */
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        memset(dst, 0, n * sizeof(float));
        return;
    }
    if (n) CUDA_CHECK(cudaMemcpyAsync(c->logit_host, src, n * 2, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    double t2 = prof_on ? kiln_now() : 0;
    widen_bf16(dst, c->logit_host, n);
    if (prof_on) {
        double t3 = kiln_now();
        prof_issue += t1 - prof_t0, prof_wait += t2 - t1, prof_copy += t3 - t2, prof_n++;
    }
    if (!c->logged) log_memory(c);
}

/*
 * The argmax of each out row, in two launches. k_argmax_part: block
 * (part, row) takes AMAX_CHUNK values of the row, thread t the values t,
 * t + 256, ... of the chunk (16 loads in flight, each warp's loads
 * contiguous), keeping its first maximum; warp shuffles then shared memory
 * merge (value, index) pairs with amax_merge (cuda.cuh): the larger value
 * wins, the lower index on ties. Its pair goes to part[row][part].
 * k_argmax_fin: a warp per row merges the row's parts the same way. The
 * answer is the host's kiln_argmax on the same (bf16-exact) values: the
 * first maximum. One block per row (the first version) walked 152k values
 * in 594 dependent steps per thread: 228 us per decode step on the H200
 * (ncu), 5% of a Qwen3-8B step, for 2.4 MB at batch 8.
 */
#define AMAX_CHUNK 4096

__global__ void __launch_bounds__(256) k_argmax_part(float2 *part, const bf16 *x, int width) {
    KTRACE();
    pdl_wait();
    const int P = gridDim.x, row = blockIdx.y, c0 = blockIdx.x * AMAX_CHUNK;
    const bf16 *r = x + (size_t)row * width;
    float v[AMAX_CHUNK / 256];
#pragma unroll
    for (int j = 0; j < AMAX_CHUNK / 256; j++) {
        const int i = c0 + j * 256 + threadIdx.x;
        v[j] = i < width ? __bfloat162float(r[i]) : -INFINITY;
    }
    /* the first value is taken as it is (NaN included, as on the host); values
     * past the row are -inf and replace nothing */
    float m = v[0];
    int at = c0 + threadIdx.x < width ? c0 + threadIdx.x : 0x7fffffff;
#pragma unroll
    for (int j = 1; j < AMAX_CHUNK / 256; j++)
        if (v[j] > m) m = v[j], at = c0 + j * 256 + threadIdx.x;
    for (int o = 16; o; o >>= 1) amax_merge(m, at, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, at, o));
    __shared__ float sm[8];
    __shared__ int sa[8];
    const int w = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) sm[w] = m, sa[w] = at;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < 8; i++) amax_merge(m, at, sm[i], sa[i]);
        part[(size_t)row * P + blockIdx.x] = make_float2(m, __int_as_float(at));
    }
}

__global__ void __launch_bounds__(32) k_argmax_fin(int *ids, const float2 *part, int P) {
    KTRACE();
    pdl_wait();
    const float2 *p = part + (size_t)blockIdx.x * P;
    float m = -INFINITY;
    int at = 0x7fffffff;
    for (int i = threadIdx.x; i < P; i += 32) {
        const float2 e = p[i];
        if (at == 0x7fffffff) m = e.x, at = __float_as_int(e.y);
        else amax_merge(m, at, e.x, __float_as_int(e.y));
    }
    for (int o = 16; o; o >>= 1) amax_merge(m, at, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, at, o));
    if (threadIdx.x == 0) ids[blockIdx.x] = at;
}

/* the argmax of the out rows on the device; only the ids come back */
static void cu_argmax(struct kiln_backend *be, int32_t *ids, const void *x, int n, int width) {
    struct cuda_ctx *c = cu_ctx(be);
    if (n <= 0) return;
    const int P = (width + AMAX_CHUNK - 1) / AMAX_CHUNK, n4 = (n + 3) & ~3; /* ids, then the parts (16-byte aligned) */
    int *d = (int *)cu_scratch(c, (void **)&c->ids_dev, &c->ids_dev_cap, (size_t)n4 * 4 + (size_t)n * P * 8);
    if (!d) { /* out of device memory: reported by cu_error */
        cu_finish(c);
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        memset(ids, 0, (size_t)n * 4);
        return;
    }
    if (c->mode != CU_REPLAY) {
        CU_TAPE(c, SKT_ARGMAX, d, x, NULL, NULL, NULL, NULL, n, width, 0, 0, 0.f);
        cu_flush(c);
        float2 *part = (float2 *)(d + n4);
        cu_launch(c->stream, k_argmax_part, dim3((unsigned)P, (unsigned)n), 256, 0, part, (const bf16 *)x, width);
        CU_LAUNCHED();
        cu_launch(c->stream, k_argmax_fin, (unsigned)n, 32, 0, d, (const float2 *)part, P);
        CU_LAUNCHED();
    }
    cu_finish(c);
    if (cu_pinned(c, (void **)&c->ids_host, &c->ids_host_cap, (size_t)n * 4)) {
        cu_fault(c, (size_t)n * 4, 1); /* reported by cu_error */
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        memset(ids, 0, (size_t)n * 4);
        return;
    }
    CUDA_CHECK(cudaMemcpyAsync(c->ids_host, d, (size_t)n * 4, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    memcpy(ids, c->ids_host, (size_t)n * 4);
    if (!c->logged) log_memory(c);
}

static void cu_mem_info(struct kiln_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    *free_bytes = *total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

static void cu_write(struct kiln_backend *be, void *dst, const float *src, size_t n) {
    CU_TAPE(cu_ctx(be), SKT_OTHER, dst, NULL, NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0.f);
    cu_flush(cu_ctx(be));
    struct cuda_ctx *c = cu_ctx(be);
    uint16_t *h = (uint16_t *)kiln_malloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) h[i] = kiln_f32_to_bf16(src[i]);
    CUDA_CHECK(cudaMemcpyAsync(dst, h, n * 2, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    free(h);
}

/* ==== weights ==== */

/* a weight copy to the device failed (not for room: the allocation took
 * the bytes): d freed, NULL and err */
static bf16 *upload_failed(struct cuda_ctx *c, bf16 *d, size_t n, cudaError_t e, char *err, size_t errlen) {
    cudaGetLastError();
    cudaFree(d);
    c->bytes_weights -= n * 2;
    kiln_errf(err, errlen, "cuda: uploading %.1f MiB of weights failed: %s", n * 2 / 1048576.0, cudaGetErrorString(e));
    return NULL;
}

/* n elements of host data in dtype t -> a new bf16 device array */
static bf16 *upload_bf16(struct cuda_ctx *c, const void *src, enum kiln_dtype t, size_t n, char *err, size_t errlen) {
    bf16 *d = NULL;
    if (cudaMalloc(&d, n * 2 + 16) != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        kiln_errf(err, errlen, "cuda: out of device memory uploading %.1f MiB of weights (%.2f GiB uploaded, %.2f GiB free of %.2f)",
                  n * 2 / 1048576.0, c->bytes_weights / 1073741824.0, fr / 1073741824.0, tot / 1073741824.0);
        return NULL;
    }
    c->bytes_weights += n * 2;
    cudaError_t e;
    if (t == KILN_DTYPE_BF16) {
        if ((e = cu_h2d(c, d, src, n * 2)) == cudaSuccess) return d;
        return upload_failed(c, d, n, e, err, errlen);
    }
    size_t es = t == KILN_DTYPE_F32 ? 4 : 2;
    void *tmp;
    if (cudaMalloc(&tmp, n * es) != cudaSuccess) { /* the F16/F32 staging copy of one tensor */
        cudaGetLastError();
        cudaFree(d);
        c->bytes_weights -= n * 2;
        kiln_errf(err, errlen, "cuda: out of device memory converting %.1f MiB of %s weights to bf16 (%.2f GiB uploaded)",
                  n * es / 1048576.0, dtype_name(t), c->bytes_weights / 1073741824.0);
        return NULL;
    }
    if ((e = cu_h2d(c, tmp, src, n * es)) == cudaSuccess) {
        const unsigned g = (unsigned)((n + 255) / 256);
        if (t == KILN_DTYPE_F32) cu_launch(c->stream, k_f32_to_bf16, g, 256, 0, d, (const float *)tmp, n);
        else cu_launch(c->stream, k_f16_to_bf16, g, 256, 0, d, (const __half *)tmp, n);
        CU_LAUNCHED();
        e = cudaStreamSynchronize(c->stream);
    }
    cudaFree(tmp);
    return e == cudaSuccess ? d : upload_failed(c, d, n, e, err, errlen);
}

/* n elements of host data in dtype t -> a new f32 device array (norms,
 * biases, RoPE frequencies); NULL and err on a failure */
static float *upload_f32(struct cuda_ctx *c, const void *src, enum kiln_dtype t, size_t n, char *err, size_t errlen) {
    float *h = (float *)kiln_malloc(n * 4 + 4), *d = NULL;
    for (size_t i = 0; i < n; i++)
        h[i] = t == KILN_DTYPE_F32 ? ((const float *)src)[i]
             : t == KILN_DTYPE_BF16 ? kiln_bf16_to_f32(((const uint16_t *)src)[i])
                                    : kiln_f16_to_f32(((const uint16_t *)src)[i]);
    cudaError_t e = cudaMalloc(&d, n * 4 + 4);
    if (e == cudaSuccess && (e = cu_h2d(c, d, h, n * 4)) != cudaSuccess) cudaFree(d);
    free(h);
    if (e != cudaSuccess) {
        cudaGetLastError();
        kiln_errf(err, errlen, "cuda: uploading %zu f32 values failed: %s", n, cudaGetErrorString(e));
        return NULL;
    }
    c->bytes_weights += n * 4;
    return d;
}

static int dense_dtype(enum kiln_dtype t) { return t == KILN_DTYPE_F32 || t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16; }

/* says once per backend that weights were widened at load, and why */
static void say_dequant(struct cuda_ctx *c, const char *what) {
    if (c->deq_said++) return;
    kiln_log(KILN_LOG_INFO, "cuda: %s weights are dequantized to bf16 at load (the CUDA backend computes on GPTQ / AWQ int4 "
                            "and Q4_0 as stored, but act-order ones of MoE models, and on every other format, FP8 included, in bf16)", what);
}

/* A quantized matrix the 4-bit kernels do not take, widened to bf16 on the
 * host (the reference dequantization rounded once, quant_widen_bf16) and
 * uploaded: GGUF blocks of any type (the embedding table and head of a GGUF
 * file, Q8_0 and K-quant linears), FP8, GPTQ / AWQ int8 and group shapes
 * qgemm.cu does not take, and act-order 4-bit weights of an MoE model. An
 * info line (once per backend) names the format `what`. NULL with err. */
static bf16 *upload_widened(struct cuda_ctx *c, const struct qlinear *w, const char *what, char *err, size_t errlen) {
    const size_t n = (size_t)w->n_out * w->n_in;
    uint16_t *h = (uint16_t *)malloc(n * 2);
    if (!h) {
        kiln_errf(err, errlen, "cuda: out of host memory dequantizing a %d x %d weight", w->n_out, w->n_in);
        return NULL;
    }
    bf16 *d = NULL;
    if (!quant_widen_bf16(w, h, err, errlen)) {
        say_dequant(c, what);
        d = upload_bf16(c, h, KILN_DTYPE_BF16, n, err, errlen);
    }
    free(h);
    return d;
}

/* vectors (norms) -> f32; matrices (the embedding) -> bf16, GGUF blocks widened */
static int cu_prepare_tensor(struct kiln_backend *be, struct ktensor *t, char *err, size_t errlen) {
    struct cuda_ctx *c = cu_ctx(be);
    size_t n = (size_t)(t->rows * t->cols);
    if (!dense_dtype(t->dtype)) {
        if (t->rows == 1 || !quant_type_of(t->dtype))
            return kiln_errf(err, errlen, "cuda: tensors of dtype %s are not supported", dtype_name(t->dtype));
        struct qlinear view = {.n_out = (int)t->rows, .n_in = (int)t->cols, .fmt = KILN_WFMT_GGUF, .w = *t};
        bf16 *d = upload_widened(c, &view, dtype_name(t->dtype), err, errlen);
        if (!d) return -1;
        t->be = d;
        if (!c->embed_host) c->embed_host = t->data, c->embed_dev = d;
        return 0;
    }
    if (t->rows == 1) {
        t->be = upload_f32(c, t->data, t->dtype, n, err, errlen);
        return t->be ? 0 : -1;
    }
    bf16 *d = upload_bf16(c, t->data, t->dtype, n, err, errlen);
    if (!d) return -1;
    t->be = d;
    if (!c->embed_host) c->embed_host = t->data, c->embed_dev = d;
    return 0;
}

static int cu_prepare_linear(struct kiln_backend *be, struct qlinear *w, char *err, size_t errlen) {
    struct cuda_ctx *c = cu_ctx(be);
    const int dense = w->fmt == KILN_WFMT_DENSE && dense_dtype(w->w.dtype);
    if (!dense && w->fmt != KILN_WFMT_GPTQ && w->fmt != KILN_WFMT_AWQ && w->fmt != KILN_WFMT_FP8 &&
        !(w->fmt == KILN_WFMT_GGUF && quant_type_of(w->w.dtype)))
        return kiln_errf(err, errlen, "cuda: linear weights of dtype %s are not supported", dtype_name(w->w.dtype));
    struct cu_linear *L = (struct cu_linear *)kiln_calloc(1, sizeof *L);
    int rc = 0;
    if (c->embed_host && w->w.data == c->embed_host) {
        L->w = c->embed_dev;
        L->shared = 1;
    } else if (dense) {
        L->w = upload_bf16(c, w->w.data, w->w.dtype, (size_t)w->n_out * w->n_in, err, errlen);
    } else if (!c->w4_off && (rc = cu_w4_prepare(c, w, L, c->w4_noperm, err, errlen)) != 0) {
        /* 4-bit, kept as stored (rc 1), or an upload error (-1); act-order in an MoE model (w4_noperm) is widened below */
    } else {
        char what[48];
        quant_linear_label(w, what, sizeof what);
        L->w = upload_widened(c, w, what, err, errlen);
    }
    if (rc < 0 || (!L->w && !L->q4)) {
        free(L);
        return -1;
    }
    if (w->bias.data && !(L->bias = upload_f32(c, w->bias.data, w->bias.dtype, (size_t)w->n_out, err, errlen))) {
        if (L->q4) cu_w4_release(c, L);
        else if (!L->shared) cudaFree(L->w), c->bytes_weights -= (size_t)w->n_out * w->n_in * 2;
        free(L);
        return -1;
    }
    w->be = L;
    w->repacked = 1; /* computed on the device copy: the loader may drop the stored pages */
    return 0;
}

/* The shapes the kernels take, checked at load so that a model they cannot
 * run is an error before any weight is uploaded, never an abort in a
 * forward: the row attention kernel is instantiated for these head sizes
 * (attention.cu launch_rows), the MoE GEMVs read 16-byte chunks and route
 * at most CU_MOE_MAX_USED of at most CU_MOE_MAX_EXPERTS experts per token
 * (moe.cu). Every weight format loads: BF16 / F16 / F32 as bf16, 4-bit
 * GPTQ / AWQ / Q4_0 as stored (MoE experts: moe_w4.cu), the rest widened to bf16. */
static int cu_check_model(struct kiln_backend *be, const struct kiln_config *cfg, char *err, size_t errlen) {
    const int hd = cfg->head_dim;
    if (hd != 16 && hd != 32 && hd != 64 && hd != 128 && hd != 256)
        return kiln_errf(err, errlen, "the CUDA backend runs head_dim 16, 32, 64, 128 or 256, not %d (use --backend cpu)", hd);
    if (cfg->n_expert > 0 && (cfg->dim % 8 || cfg->moe_ffn % 8 || cfg->n_expert_used > CU_MOE_MAX_USED ||
                              cfg->n_expert > CU_MOE_MAX_EXPERTS))
        return kiln_errf(err, errlen,
                         "the CUDA backend's MoE needs hidden_size and moe_intermediate_size divisible by 8, at most %d "
                         "experts and at most %d experts per token (got %d, %d, %d, %d; use --backend cpu)",
                         CU_MOE_MAX_EXPERTS, CU_MOE_MAX_USED, cfg->dim, cfg->moe_ffn, cfg->n_expert, cfg->n_expert_used);
    cu_ctx(be)->w4_off = env_is("KILN_CUDA_W4", "0");
    /* an MoE model's 4-bit experts stay 4-bit (moe_w4.cu), but not in act-order */
    cu_ctx(be)->w4_noperm = cfg->n_expert > 0;
    return 0;
}

/* the bytes a pass over w reads: its bf16 matrix, or its 4-bit codes and scales */
static int64_t cu_linear_bytes(struct kiln_backend *be, const struct qlinear *w) {
    (void)be;
    const struct cu_linear *L = (const struct cu_linear *)w->be;
    if (!L) return quant_linear_bytes(w);
    return (int64_t)(L->q4 ? cu_w4_bytes(L) : (size_t)w->n_out * w->n_in * 2) + (L->bias ? (int64_t)w->n_out * 4 : 0);
}

static int cu_prepare_rope(struct kiln_backend *be, struct rope *r, char *err, size_t errlen) {
    r->be = upload_f32(cu_ctx(be), r->inv_freq, KILN_DTYPE_F32, (size_t)r->n_freq, err, errlen);
    return r->be ? 0 : -1;
}

static void cu_release_tensor(struct kiln_backend *be, struct ktensor *t) {
    struct cuda_ctx *c = cu_ctx(be);
    if (!t->be) return;
    if (t->be == c->embed_dev) c->embed_host = NULL, c->embed_dev = NULL;
    graphs_drop(c);
    cudaFree(t->be);
    t->be = NULL;
    c->bytes_weights -= (size_t)(t->rows * t->cols) * (t->rows == 1 ? 4 : 2); /* as cu_prepare_tensor uploaded it */
}

static void cu_release_linear(struct kiln_backend *be, struct qlinear *w) {
    cu_flush(cu_ctx(be));
    struct cu_linear *L = (struct cu_linear *)w->be;
    if (!L) return;
    struct cuda_ctx *c = cu_ctx(be);
    graphs_drop(c);
    if (L->q4) cu_w4_release(c, L);
    else if (!L->shared) {
        if (!L->grouped) cudaFree(L->w);
        c->bytes_weights -= (size_t)w->n_out * w->n_in * 2;
    }
    if (L->bias) cudaFree(L->bias), c->bytes_weights -= (size_t)w->n_out * 4;
    free(L);
    w->be = NULL;
}

/*
 * Linears that read the same x (a layer's q, k and v), moved into one
 * allocation in order, so that one GEMM computes all of them (gemm.cu
 * cu_matmul_multi): fewer, fuller waves of tiles where a prefill chunk has
 * few rows (H100, Qwen3-8B's q/k/v at 256 rows: 42.9 us as three cuBLAS
 * calls, 24.6 as one; equal at 8,192; tools/cublas_shapes.cu). Only bf16
 * weights whose row counts keep 16-byte alignment (biases stay where they
 * are); anything
 * else, or no device memory for the move, stays as it was (nothing fails).
 * The group's first linear owns the allocation. Also an MoE layer's bf16
 * experts of one kind (cu_prepare_moe), for the memory.
 */
/* one allocation holding the buffers back to back (cuda.cuh); the linears'
 * groupings below and cu_w4_group move weights with it */
char *cu_dev_concat(struct cuda_ctx *c, const void *const *src, const size_t *bytes, int count, size_t tail) {
    size_t total = tail;
    for (int i = 0; i < count; i++) total += bytes[i];
    char *d = NULL;
    if (cudaMalloc(&d, total) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    cudaError_t e = cudaSuccess;
    size_t off = 0;
    for (int i = 0; i < count && e == cudaSuccess; off += bytes[i++])
        e = cudaMemcpyAsync(d + off, src[i], bytes[i], cudaMemcpyDeviceToDevice, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaFree(d);
        return NULL;
    }
    return d;
}

static int group_said;
static void cu_group_linears(struct kiln_backend *be, struct qlinear *const *ws, int count) {
    struct cuda_ctx *c = cu_ctx(be);
    if (count < 2) return;
    for (int i = 0; i < count; i++) {
        const struct cu_linear *L = (const struct cu_linear *)ws[i]->be;
        if (!L || !L->w || L->q4 || L->shared || L->grouped || ws[i]->n_in != ws[0]->n_in || ws[i]->n_out % 8 ||
            ws[i]->n_in % 8)
            return;
    }
    cu_flush(c);
    const void **src = (const void **)kiln_malloc(sizeof *src * (size_t)count);
    size_t *bytes = (size_t *)kiln_malloc(sizeof *bytes * (size_t)count);
    for (int i = 0; i < count; i++) src[i] = ((const struct cu_linear *)ws[i]->be)->w, bytes[i] = (size_t)ws[i]->n_out * ws[i]->n_in * 2;
    bf16 *d = (bf16 *)cu_dev_concat(c, src, bytes, count, 16);
    free(src), free(bytes);
    if (!d) return; /* the linears stay apart */
    graphs_drop(c);
    size_t off = 0;
    for (int i = 0; i < count; i++) {
        struct cu_linear *L = (struct cu_linear *)ws[i]->be;
        cudaFree(L->w);
        L->w = d + off, L->grouped = i > 0;
        off += (size_t)ws[i]->n_out * ws[i]->n_in;
    }
    if (!group_said++)
        kiln_log(KILN_LOG_DEBUG, "cuda: linears are stored as one matrix (q/k/v: one prefill GEMM; MoE experts: no allocation each)");
}

/* an MoE layer at load: its expert kinds settled (moe_w4.cu), each kind's
 * experts moved into one allocation (cu_group_linears, cu_w4_group; on its
 * own a 3 MiB expert of Qwen3-30B-A3B takes 4 MiB of device memory,
 * cudaMalloc's 2 MiB granularity: ~18 GB over the model; grouped, its BF16
 * pp-tg peak fell from 78.3 to 60.1 GB on an H200), and its pointer tables
 * uploaded, so that running out of device memory here is an error before
 * serving starts */
static int cu_prepare_moe(struct kiln_backend *be, const struct moe_ffn *m, char *err, size_t errlen) {
    struct cuda_ctx *c = cu_ctx(be);
    const int E = m->n_expert;
    if (!cu_moe_settle(c, m)) {
        struct qlinear **ws = (struct qlinear **)kiln_malloc(sizeof *ws * (size_t)E);
        struct cu_linear **Ls = (struct cu_linear **)kiln_malloc(sizeof *Ls * (size_t)E);
        struct qlinear *kinds[3] = {m->gate, m->up, m->down};
        for (int k = 0; k < 3; k++) {
            for (int e = 0; e < E; e++) ws[e] = &kinds[k][e], Ls[e] = (struct cu_linear *)ws[e]->be;
            if (Ls[0]->q4) cu_w4_group(c, Ls, E); /* 235B-A22B's 4-bit experts: 3 MiB of codes each */
            else cu_group_linears(be, ws, E);
        }
        free(ws), free(Ls);
        if (cu_moe_table(c, m) && !CUDA_FAILED(cudaStreamSynchronize(c->stream))) return 0;
    }
    const double mib = c->fault_bytes / 1048576.0;
    c->fault_bytes = 0, c->fault_host = 0;
    return kiln_errf(err, errlen, "cuda: preparing an MoE layer's %d experts failed (%.1f MiB of device memory wanted)", E, mib);
}

static void cu_release_rope(struct kiln_backend *be, struct rope *r) {
    if (r->be) cudaFree(r->be), cu_ctx(be)->bytes_weights -= (size_t)r->n_freq * 4;
    r->be = NULL;
}

/* ==== the batch ==== */

static int tile_cmp(const void *a, const void *b) {
    const int *x = (const int *)a, *y = (const int *)b;
    return y[7] - x[7]; /* heaviest (most keys to walk) first */
}

/* key blocks (FA_BN keys) that the tile of rows m0.. of v walks */
static int fa_tile_kb(const struct kiln_seq_view *v, int m0) {
    const int rows = v->n - m0 < FA_BM ? v->n - m0 : FA_BM;
    return (v->n_past + m0 + rows + FA_BN - 1) / FA_BN;
}

/* chunks of a tile of n_kb key blocks cut into chunks of ~cb (0: none),
 * each of at least FA_SPLIT_MIN_KB blocks */
static int fa_n_split(int n_kb, int cb) {
    if (!cb) return 1;
    const int a = (n_kb + cb - 1) / cb, m = n_kb / FA_SPLIT_MIN_KB;
    return a < m ? a : m > 1 ? m : 1;
}

/* key blocks of the batch's longest tile */
static int fa_longest_kb(const struct kiln_batch *b) {
    int J = 0;
    for (int s = 0; s < b->n_seqs; s++)
        for (int m0 = 0; m0 < b->seqs[s].n; m0 += FA_BM) {
            const int kb = fa_tile_kb(&b->seqs[s], m0);
            J = kb > J ? kb : J;
        }
    return J;
}

/*
 * Split-KV plan of the flash kernel (attention.cu): the chunk length cb in
 * key blocks, or 0 for no split (J: the longest tile's key blocks).
 * FlashAttention-2's num_splits heuristic
 * for tiles of unequal length: none when the unsplit (tile, head) blocks
 * already fill 0.8 of a wave of resident blocks or no tile is 16 key
 * blocks long; else for the longest tile (J key blocks) cut into k chunks,
 * every tile takes chunks of cb = ceil(J / k), and the launch is estimated
 * at ceil(blocks / slots) waves of the longest chunk; the smallest k within
 * 1/0.85 of the best estimate wins (fewer partials to write and merge).
 * The q head count and head_dim come from the last attention call (they
 * are not part of the batch): others only make the plan coarser or finer,
 * never wrong.
 */
static int fa_split_kb(const struct cuda_ctx *c, const struct kiln_batch *b, int n_tiles, int J) {
    const char *e = getenv("KILN_CUDA_FA_SPLIT");
    const long force = e && *e ? strtol(e, NULL, 10) : 1;
    if (force <= 0) return 0;
    if (J < 2 * FA_SPLIT_MIN_KB) return 0;
    if (force > 1) { /* KILN_CUDA_FA_SPLIT=N: the longest tile in N chunks */
        const int k = force < FA_SPLIT_MAX ? (int)force : FA_SPLIT_MAX, cb = (J + k - 1) / k;
        return cb > FA_SPLIT_MIN_KB ? cb : FA_SPLIT_MIN_KB;
    }
    const int hg = c->fa_hg_run;
    const long heads = (c->fa_heads > 0 ? c->fa_heads : 32) / hg; /* blocks per entry */
    const long slots = (long)c->n_sm * cu_flash_blocks_per_sm(c->fa_hd > 0 ? c->fa_hd : 128, hg);
    if (5 * (long)n_tiles * heads >= 4 * slots) return 0;
    const int k_max = J / FA_SPLIT_MIN_KB < FA_SPLIT_MAX ? J / FA_SPLIT_MIN_KB : FA_SPLIT_MAX;
    long est[FA_SPLIT_MAX + 1], best = -1;
    for (int k = 1; k <= k_max; k++) {
        const int cb = (J + k - 1) / k;
        long blocks = 0, longest = 0;
        for (int s = 0; s < b->n_seqs; s++)
            for (int m0 = 0; m0 < b->seqs[s].n; m0 += FA_BM) {
                const int kb = fa_tile_kb(&b->seqs[s], m0), n_sp = fa_n_split(kb, cb), len = (kb + n_sp - 1) / n_sp;
                blocks += n_sp * heads, longest = len > longest ? len : longest;
            }
        est[k] = (blocks + slots - 1) / slots * longest;
        best = best < 0 || est[k] < best ? est[k] : best;
    }
    for (int k = 1; k <= k_max; k++)
        if (100 * best >= 85 * est[k]) return k == 1 ? 0 : (J + k - 1) / k;
    return 0;
}

static int cu_begin(struct kiln_backend *be, const struct kiln_batch *b) {
    if (prof_on) prof_t0 = kiln_now();
    cu_flush(cu_ctx(be));
    struct cuda_ctx *c = cu_ctx(be);
    if (c->mode == CU_CAPTURE) { /* a forward that never reached read(): drop its capture */
        cudaGraph_t g;
        cudaStreamEndCapture(c->stream, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        c->graphs[c->cur_graph].seen = 0;
    }
    c->mode = CU_EAGER;
    ktrace_begin(c->stream);
    c->tape_on = 0;
    if (c->fault_bytes || c->dev_failed) { /* the last forward failed: its shape's graph is not recorded from it */
        for (int i = 0; i < c->n_graphs; i++)
            if (!c->graphs[i].exec && !c->graphs[i].sk) c->graphs[i].seen = 0;
        if (c->dev_failed) dev_fail.on = 0; /* reported; a failure outside any forward waits for the end of this one */
        c->fault_bytes = 0, c->fault_host = 0, c->dev_failed = 0;
    }
    if (inject_trap) {
        inject_trap = 0;
        k_trap<<<1, 1, 0, c->stream>>>();
    }
    const int n = b->n_tokens, S = b->n_seqs, no = b->n_out;
    size_t tot_pages = 0;
    int max_n = 0, max_len = 0, n_tiles = 0;
    for (int s = 0; s < S; s++) {
        tot_pages += (size_t)b->seqs[s].n_pages;
        if (b->seqs[s].n > max_n) max_n = b->seqs[s].n;
        if (b->seqs[s].n_past + b->seqs[s].n > max_len) max_len = b->seqs[s].n_past + b->seqs[s].n;
        n_tiles += (b->seqs[s].n + FA_BM - 1) / FA_BM;
    }
    c->n_tokens = n, c->n_seqs = S, c->n_out = no, c->max_seq_n = max_n, c->max_len = max_len;
    /* splits of ~ATT_SPLIT_TOKENS keys, rounded up to a power of two (at
     * most 64) so that only a handful of decode graphs are ever recorded;
     * with many rows the grid is full without splitting that finely, so
     * each split takes more keys (fewer blocks, fewer partials to merge) */
    const int split_tokens = c->att_split_tokens * (n > 4 ? n / 4 : 1);
    c->att_split = 1;
    while (c->att_split < 64 && (long)c->att_split * split_tokens < max_len) c->att_split *= 2;
    c->out_rows_host = b->out_rows;
    c->seqs_host = b->seqs;
    /* the flash kernel's work list (layout in cuda.cuh): a tile per 64 rows
     * of a sequence, or n_sp entries for a tile split into key chunks */
    int n_ent = 0, n_slots = 0, cb = 0;
    static int rows_ctx = -1, dec_ctx = -1;
    if (rows_ctx < 0) {
        rows_ctx = env_int("KILN_CUDA_FLASH_ROWS_CTX", FA_ROWS_MIN_CTX, INT_MIN, INT_MAX);
        dec_ctx = env_int("KILN_CUDA_FLASH_DECODE_CTX", FA_DECODE_MIN_CTX, INT_MIN, INT_MAX);
    }
    /* a decode step over a long context: attn_dec.cu's kernel (in a graph) where the shape suits it */
    /* from this many keys (0: never; read per batch, tests switch it) */
    const int dec_min = env_int("KILN_CUDA_ATT_DEC_CTX", ATT_DEC_MIN_CTX, INT_MIN, INT_MAX);
    const int dec_seqs = env_int("KILN_CUDA_ATT_DEC_SEQS", ATT_DEC_MAX_SEQS, INT_MIN, INT_MAX); /* A/B timing: at most this many sequences */
    const int flash_dec = dec_ctx > 0 && max_n == 1 && S <= FA_DECODE_MAX_SEQS && max_len >= dec_ctx;
    /* by the last attention call's shape (a model's layers share one; none yet: try it) */
    const int dec_ok = !c->fa_hd || cu_att_dec_shape(c->fa_hd, c->fa_heads, c->fa_nkv), G = c->fa_nkv ? c->fa_heads / c->fa_nkv : 0;
    c->att_dec = dec_min > 0 && dec_ok && max_n == 1 && S <= dec_seqs && max_len >= dec_min &&
                 !(flash_dec && G > 2 && max_len > ATT_DEC_MAX_CTX);
    c->use_flash = max_n > ATT_ROWS_MAX || (rows_ctx > 0 && max_n >= 2 && max_len >= rows_ctx) || (!c->att_dec && flash_dec);
    if (c->use_flash) {
        /* two q heads per flash block where the KV groups allow it (the last
         * attention call says; unknown: assume so) and the tiles are long;
         * on short ones the halved grid cost more than the shared K/V tiles
         * saved (H200: 0.6B pp1024 4.95 -> 5.3 ms, pp8192 70.6 -> 53.8 ms);
         * the wgmma kernel (flash_wg.cu) pays off from 512 keys on */
        const int J = fa_longest_kb(b);
        const int wg = (c->fa_hd == 128 || c->fa_hd == 0) && cu_flash_wg_ok();
        const int hg_min = env_int("KILN_CUDA_FA_HG_MIN", wg ? FA_WG_HG_MIN_KB : FA_HG_MIN_KB, INT_MIN, INT_MAX); /* A/B timing */
        c->fa_hg_run = (c->fa_hg ? c->fa_hg : 2) == 2 && J >= hg_min ? 2 : 1;
        const char *ov = getenv("KILN_CUDA_FA_OVERLAP"); /* A/B timing: 0 never, 1 always */
        c->fa_ovl_run = ov && *ov ? *ov != '0' : J >= FA_WG_OVL_MIN_KB;
        cb = fa_split_kb(c, b, n_tiles, J);
        for (int s = 0; s < S; s++)
            for (int m0 = 0; m0 < b->seqs[s].n; m0 += FA_BM) {
                const int k = fa_n_split(fa_tile_kb(&b->seqs[s], m0), cb);
                n_ent += k, n_slots += k > 1 ? k : 0;
            }
    }
    size_t need = (size_t)4 * n + 4 * S + no + tot_pages + (size_t)FA_ENT * n_ent;
    if (CUDA_FAILED(cudaEventSynchronize(meta_done))) return -1; /* the last upload has left meta_host */
    if (need > c->meta_cap) {
        graphs_drop(c);
        if (c->meta) cudaFree(c->meta), cudaFreeHost(c->meta_host), c->bytes_ws -= c->meta_cap * 4;
        c->meta = NULL, c->meta_host = NULL, c->meta_cap = 0;
        const size_t cap = need * 2 + 1024;
        if (cudaMalloc(&c->meta, cap * 4) != cudaSuccess || cudaMallocHost(&c->meta_host, cap * 4) != cudaSuccess) {
            cudaGetLastError(); /* out of memory: this forward fails (model_forward says so), the next may fit */
            if (c->meta) cudaFree(c->meta);
            c->meta = NULL, c->meta_host = NULL;
            return -1;
        }
        c->meta_cap = cap;
        c->bytes_ws += c->meta_cap * 4;
    }
    int *h = c->meta_host, *p = h;
    memcpy(p, b->tokens, 4 * (size_t)n), p += n;
    memcpy(p, b->pos, 4 * (size_t)n), p += n;
    int *row_seq = p, *row_t = p + n;
    p += 2 * n;
    int *seq = p;
    p += 4 * S;
    memcpy(p, b->out_rows, 4 * (size_t)no), p += no;
    int *pages = p, off = 0;
    for (int s = 0; s < S; s++) {
        const struct kiln_seq_view *v = &b->seqs[s];
        seq[4 * s] = v->start, seq[4 * s + 1] = v->n, seq[4 * s + 2] = v->n_past, seq[4 * s + 3] = off;
        for (int i = 0; i < v->n; i++) row_seq[v->start + i] = s, row_t[v->start + i] = v->n_past + i;
        memcpy(pages + off, v->pages, 4 * (size_t)v->n_pages);
        off += v->n_pages;
    }
    p += off;
    /* prefill attention work list, heaviest first */
    int *tiles = p;
    for (int s = 0, t = 0, j = 0; s < S && n_ent; s++)
        for (int m0 = 0; m0 < b->seqs[s].n; m0 += FA_BM) {
            const int kb = fa_tile_kb(&b->seqs[s], m0), k = fa_n_split(kb, cb);
            for (int i = 0; i < k; i++, t++) {
                int *e = tiles + FA_ENT * t;
                const int kb0 = (int)((long)i * kb / k), kb1 = (int)((long)(i + 1) * kb / k);
                e[0] = s, e[1] = m0, e[2] = kb0, e[3] = kb1, e[4] = k > 1 ? j : -1, e[5] = i, e[6] = k;
                e[7] = k > 1 ? (kb1 - kb0 - 1) * FA_BN : b->seqs[s].n_past + m0;
            }
            j += k > 1 ? k : 0;
        }
    if (n_ent > 1) qsort(tiles, (size_t)n_ent, FA_ENT * sizeof(int), tile_cmp);
    p += FA_ENT * n_ent;
    int *d = c->meta;
    c->d_tokens = d, c->d_pos = d + n, c->d_row_seq = d + 2 * n, c->d_row_t = d + 3 * n, c->d_seq = d + 4 * n;
    c->d_out_rows = d + 4 * n + 4 * S, c->d_pages = d + 4 * n + 4 * S + no;
    c->fa_tiles = d + (pages - h) + off, c->n_fa_tiles = n_ent, c->fa_slots = n_slots;
    /* without this batch's tables the kernels would read the last batch's
     * pages (and write its KV cache): the forward does not start */
    if (CUDA_FAILED(cudaMemcpyAsync(d, h, (size_t)(p - h) * 4, cudaMemcpyHostToDevice, c->stream)) ||
        CUDA_FAILED(cudaEventRecord(meta_done, c->stream)))
        return -1;

    /* graphs: replay a known decode shape, record it the second time */
    /* an MoE model has built its expert tables in its first (eager) forward */
    int graph_max = GRAPH_MAX_TOKENS;
    for (int i = 0; i < c->n_moe_tabs; i++) { /* as far as every MoE layer's paths without a host wait go (moe.cu cu_moe) */
        const struct cu_moe_w4 *k = c->moe_tabs[i].w4;
        int most = c->moe_batch > c->moe_direct ? c->moe_batch : c->moe_direct;
        if (k[0].on || k[2].on) most = cu_moe_w4_most(c, k);
        if (most < graph_max) graph_max = most;
    }
    if (c->no_graphs || n > graph_max || max_n > 1 || no == 0 || c->use_flash) return 0;
    int gi = -1;
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].n_tokens == n && c->graphs[i].n_seqs == S && c->graphs[i].n_out == no &&
            c->graphs[i].att_split == c->att_split && c->graphs[i].att_dec == c->att_dec && c->graphs[i].ids == (b->out_ids != NULL))
            gi = i;
    if (gi < 0) {
        c->graphs = (struct cu_graph *)kiln_realloc(c->graphs, sizeof *c->graphs * (size_t)(c->n_graphs + 1));
        gi = c->n_graphs++;
        c->graphs[gi] = (struct cu_graph){n, S, no, c->att_split, b->out_ids != NULL, 0, c->att_dec, NULL, NULL, NULL};
    }
    struct cu_graph *g = &c->graphs[gi];
    c->cur_graph = gi;
    if (g->exec || g->sk) {
        c->mode = CU_REPLAY;
    } else if (g->seen++ == 0 && n == 1 && S == 1 && no == 1 && cu_sk_enabled(c)) {
        /* the first run of a one-token step: record its ops for k_step (step.cu) */
        c->tape_on = 1, c->n_tape = 0;
    } else if (g->seen >= 2) {
        if (!CUDA_FAILED(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal))) c->mode = CU_CAPTURE;
    }
    return 0;
}

static void log_memory(struct cuda_ctx *c) {
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    const double G = 1073741824.0;
    kiln_log(KILN_LOG_INFO,
             "cuda memory: weights %.2f GiB, KV pool %.2f GiB, activations %.2f GiB, backend workspace %.2f GiB; "
             "device %.2f GiB used of %.2f",
             c->bytes_weights / G, c->bytes_kv / G, (c->bytes_buffers - c->bytes_kv) / G, c->bytes_ws / G, (tot - fr) / G,
             tot / G);
    c->logged = 1;
}

/* ==== the table ==== */

static void cu_destroy(struct kiln_backend *be) {
    if (prof_on && prof_n)
        fprintf(stderr, "kiln: cuda profile: %ld forwards, per forward: issue %.3f ms, GPU wait %.3f ms, logits out %.3f ms\n",
                prof_n, 1e3 * prof_issue / prof_n, 1e3 * prof_wait / prof_n, 1e3 * prof_copy / prof_n);
    cu_flush(cu_ctx(be));
    struct cuda_ctx *c = cu_ctx(be);
    cudaStreamSynchronize(c->stream);
    graphs_drop(c);
    free(c->graphs);
    for (int i = 0; i < c->n_moe_tabs; i++) cudaFree((void *)c->moe_tabs[i].gate), free(c->moe_tabs[i].host);
    free(c->moe_tabs);
    void *dev[] = {c->meta, c->att_part, c->att_cnt, c->f32buf, c->w4_x, c->w4_deq, c->moe_buf, c->blas_ws, c->qkv_buf};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    if (c->meta_host) cudaFreeHost(c->meta_host);
    if (c->logit_host) cudaFreeHost(c->logit_host);
    if (c->ids_host) cudaFreeHost(c->ids_host);
    if (c->ids_dev) cudaFree(c->ids_dev);
    if (c->norm_cnt) cudaFree(c->norm_cnt);
    if (c->gs_slot) cudaFree(c->gs_slot);
    if (c->gs_cnt) cudaFree(c->gs_cnt);
    if (c->moe_host) cudaFreeHost(c->moe_host);
    if (c->moe_ptr_host) cudaFreeHost(c->moe_ptr_host);
    if (c->sk_part) cudaFree(c->sk_part);
    if (c->sk_bar) cudaFree(c->sk_bar);
    free(c->tape);
    cublasDestroy(c->blas);
    cu_sk_forget_stream(c->stream);
    cudaStreamDestroy(c->stream);
    free(c);
    free(be);
}

/* decode steps run by the persistent step kernel so far (step.cu; tests) */
extern "C" long kiln_cuda_step_count(void);
extern "C" long kiln_cuda_step_count(void) { return cu_sk_count; }

extern "C" int cuda_available(void);
extern "C" int cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

/* whether a CUDA or cuBLAS call failed: its error in *out (a cuBLAS
 * failure as cudaErrorUnknown, its status in *blas) */
static int mk_failed(cudaError_t e, cudaError_t *out, int *) { return (*out = e) != cudaSuccess; }
static int mk_failed(cublasStatus_t s, cudaError_t *out, int *blas) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    *out = cudaErrorUnknown, *blas = (int)s;
    return 1;
}

/* the context's own device resources (stream, cuBLAS and its workspace,
 * counters); on a failure *what names the call and its error is returned */
static cudaError_t cu_ctx_make(struct cuda_ctx *c, const char **what, int *blas) {
#define MK(x)                              \
    do {                                   \
        cudaError_t e_;                    \
        if (mk_failed((x), &e_, blas)) {   \
            *what = #x;                    \
            return e_;                     \
        }                                  \
    } while (0)
    MK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    if (!meta_done) MK(cudaEventCreateWithFlags(&meta_done, cudaEventDisableTiming));
    MK(cudaEventRecord(meta_done, c->stream));
    MK(cublasCreate(&c->blas));
    MK(cublasSetStream(c->blas, c->stream));
    const size_t blas_ws = 32u << 20;
    MK(cudaMalloc(&c->blas_ws, blas_ws));
    c->bytes_ws += blas_ws;
    MK(cublasSetWorkspace(c->blas, c->blas_ws, blas_ws));
    const size_t wt = (size_t)8 * 8 * c->n_sm; /* warps of the largest streaming grid */
    MK(cudaMalloc(&c->gs_slot, wt * 8 * sizeof(float)));
    MK(cudaMalloc(&c->gs_cnt, wt * sizeof(int)));
    MK(cu_zero(c, c->gs_cnt, wt * sizeof(int)));
    c->bytes_ws += wt * 9 * sizeof(float);
    MK(cudaMalloc(&c->norm_cnt, 64));
    MK(cu_zero(c, c->norm_cnt, 64));
    return cudaSuccess;
#undef MK
}

extern "C" struct kiln_backend *cuda_backend_create(char *err, size_t errlen);
extern "C" struct kiln_backend *cuda_backend_create(char *err, size_t errlen) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        kiln_errf(err, errlen, "backend 'cuda': no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return NULL;
    }
    /* a failure from here on (the device taken or out of memory, a broken
     * driver) is an error for the caller, not an abort */
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
        cudaGetLastError();
        kiln_errf(err, errlen, "backend 'cuda': the device does not answer (%s)", cudaGetErrorString(e));
        return NULL;
    }
    ktrace_init();
    struct kiln_backend *be = (struct kiln_backend *)kiln_calloc(1, sizeof *be);
    struct cuda_ctx *c = (struct cuda_ctx *)kiln_calloc(1, sizeof *c);
    c->n_sm = prop.multiProcessorCount;
    c->smem_sm = (int)prop.sharedMemPerMultiprocessor;
    const char *what = "";
    int blas = 0;
    if ((e = cu_ctx_make(c, &what, &blas)) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it for whoever tries next */
        if (blas) kiln_errf(err, errlen, "backend 'cuda': %s failed: cuBLAS status %d", what, blas);
        else kiln_errf(err, errlen, "backend 'cuda': %s failed: %s", what, cudaGetErrorString(e));
        void *dev[] = {c->blas_ws, c->gs_slot, c->gs_cnt, c->norm_cnt};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
            if (dev[i]) cudaFree(dev[i]);
        if (c->blas) cublasDestroy(c->blas);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
        free(be);
        return NULL;
    }
    c->no_graphs = env_is("KILN_CUDA_GRAPHS", "0");
    c->no_sk = !env_is("KILN_CUDA_STEPK", "1"); /* opt-in: not faster yet (step.cu, docs/cuda.md) */
    c->no_defer = env_is("KILN_CUDA_DEFER", "0");
    c->no_fuse = env_is("KILN_CUDA_FUSE", "0");
    c->no_gemm_res = env_is("KILN_CUDA_GEMM_RES", "0");
    c->qkv_max = env_int("KILN_CUDA_QKV_MERGE", 2048, INT_MIN, INT_MAX);
    c->w4_slice_env = env_int("KILN_CUDA_W4_SLICE", -1, INT_MIN, INT_MAX);
    c->no_fuse_att = env_is("KILN_CUDA_FUSE_ATT", "0"); /* decode rope + KV write as their own launch */
    /* folding the norm into the next GEMV is off unless asked for: measured
     * on the H200 it cost 0.6B decode ~5% and gained nothing on 8B (each
     * block's norm prologue sits on the GEMV's critical path) */
    c->no_fuse_norm = !env_is("KILN_CUDA_FUSE_NORM", "1");
    c->no_norm_r = env_is("KILN_CUDA_NORM_R", "0");
    c->no_att_cluster = env_is("KILN_CUDA_ATT_CLUSTER", "0");
    c->no_moe_ptr = env_is("KILN_CUDA_MOE_PTR", "0");
    c->no_moe_ld = env_is("KILN_CUDA_MOE_LD", "0");
    c->no_moe_bulk = env_is("KILN_CUDA_MOE_BULK", "0");
    c->no_moe_pre = env_is("KILN_CUDA_MOE_PRE", "0");
    c->no_gemv_b = env_is("KILN_CUDA_GEMV_B", "0");
    c->no_gemv_b_spread = env_is("KILN_CUDA_GEMV_B_SPREAD", "0");
    c->moe_ef = !env_is("KILN_CUDA_MOE_EF", "0");
    c->att_split_tokens = env_int("KILN_CUDA_ATT_SPLIT_TOKENS", ATT_SPLIT_TOKENS, 1, INT_MAX); /* keys per decode attention split */
    c->old_read = env_is("KILN_CUDA_READ", "0");
    cu_gemv_pf = !env_is("KILN_CUDA_PF", "0");
    const char *bps = getenv("KILN_CUDA_GEMV_BPS");
    if (bps && *bps >= '0' && *bps <= '8' && !bps[1]) cu_gemv_bps = *bps - '0';
    const char *sr = getenv("KILN_CUDA_GEMV_SROWS");
    if (sr) cu_gemv_srows = atoi(sr);
    const char *smb = getenv("KILN_CUDA_GEMV_SMB");
    if (smb) cu_gemv_smb = atoi(smb);
    c->moe_grouped = !env_is("KILN_CUDA_MOE_GROUPED", "0");
    c->moe_direct = env_int("KILN_CUDA_MOE_DIRECT", MOE_DIRECT_MAX, 0, GRAPH_MAX_TOKENS);
    c->moe_batch = env_int("KILN_CUDA_MOE_BATCH", MOE_BATCH_MAX, 0, GRAPH_MAX_TOKENS);
    c->moe_w4_pairs = env_int("KILN_CUDA_MOE_W4_PAIRS", MOE_W4_PAIRS_MAX, 0, GRAPH_MAX_TOKENS);
    c->moe_w4_batch = env_int("KILN_CUDA_MOE_W4_BATCH", MOE_W4_BATCH_MAX, 0, GRAPH_MAX_TOKENS);
    c->moe_w4_mixed = env_int("KILN_CUDA_MOE_W4_BATCH", MOE_W4_MIXED_MAX, 0, GRAPH_MAX_TOKENS);
    c->moe_w4_gemm = env_int("KILN_CUDA_MOE_W4_GEMM", 96, 0, 1 << 20);
    c->moe_w4_wt = env_int("KILN_CUDA_MOE_W4_WT", 1, 0, 1);
    c->moe_w4_gu_warps = env_int("KILN_CUDA_MOE_W4_GU_WARPS", 8, 4, 8) == 4 ? 4 : 8;
    /* rows per chunk of the prefill expert GEMMs (0: one problem per expert; -1: by the row count) */
    c->moe_chunk = env_int("KILN_CUDA_MOE_CHUNK", -1, 0, 4096);
    const char *gr = getenv("KILN_CUDA_GEMV_ROWS");
    if (gr && *gr >= '0' && *gr <= '8' && !gr[1]) cu_gemv_rows = *gr - '0';
    const char *gt = getenv("KILN_CUDA_GEMV_TC"); /* batched decode matmuls on the tensor cores up to this many rows (0: cuBLAS) */
    if (gt && *gt) cu_gemv_tc = atoi(gt);
    prof_on = env_is("KILN_CUDA_PROFILE", "1");
    c->no_att_pre = env_is("KILN_CUDA_ATT_PRE", "0");
    cu_pdl = !env_is("KILN_CUDA_PDL", "0") && prop.major >= 9;
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    kiln_log(KILN_LOG_INFO, "cuda: %s, sm_%d%d, %d SMs, %.1f GiB free of %.1f%s", prop.name, prop.major, prop.minor,
             prop.multiProcessorCount, fr / 1073741824.0, tot / 1073741824.0, c->no_graphs ? ", graphs off" : "");

    be->name = "cuda";
    be->warm_at_open = 1;
    be->device_weights = 1;
    be->act_size = 2;
    be->kv_dtypes = 1u << KILN_DTYPE_BF16;
    be->ctx = c;
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->memzero = cu_memzero;
    be->read = cu_read;
    be->argmax = cu_argmax;
    be->mem_info = cu_mem_info;
    be->write = cu_write;
    be->prepare_tensor = cu_prepare_tensor;
    be->prepare_linear = cu_prepare_linear;
    be->linear_bytes = cu_linear_bytes;
    be->check_model = cu_check_model;
    be->prepare_moe = cu_prepare_moe;
    be->error = cu_error;
    be->prepare_rope = cu_prepare_rope;
    be->release_tensor = cu_release_tensor;
    be->release_linear = cu_release_linear;
    be->release_rope = cu_release_rope;
    be->begin = cu_begin;
    be->embed = cu_embed;
    be->rmsnorm = cu_rmsnorm;
    be->add_rmsnorm = cu_add_rmsnorm;
    be->matmul = cu_matmul;
    be->matmul_multi = cu_matmul_multi;
    be->group_linears = cu_group_linears;
    be->qk_norm_rope = cu_qk_norm_rope;
    be->kv_write = cu_kv_write;
    be->attention = cu_attention;
    be->swiglu = cu_swiglu;
    be->add = cu_add;
    be->moe = cu_moe;
    be->gather_rows = cu_gather_rows;
    be->destroy = cu_destroy;
    return be;
}
