/*
 * cpu.h: internals shared by the CPU backend's files (not a public API).
 *
 * The CPU backend keeps activations in f32, weights in their stored format
 * (mmap'd) or a copy made at load that its kernels read faster (x86: GGUF /
 * GPTQ / AWQ in groups of 16 rows, qmatmul*.c; BF16 in 12 bits, b12.c),
 * and KV pages in f32. Small vectors (norm weights, biases, rope
 * frequencies) get an f32 copy at prepare time. Every op parallelizes inside
 * itself over independent rows or heads with the backend's worker pool
 * (cpu_parallel_for below); no kernel here uses OpenMP.
 */
#ifndef KILN_CPU_H
#define KILN_CPU_H

#include "backend/backend.h"

struct cpu_pool;

struct cpu_ctx {
    int n_threads;
    struct cpu_pool *pool; /* the kernels' worker threads (cpu.c) */
    float *scratch; /* matmul's packed panels (matmul.c), grown as needed */
    size_t scratch_cap;
    void *qscratch; /* qmatmul.c's per-call activation buffers, grown as needed */
    size_t qscratch_cap;
    size_t qscratch_top; /* stacking (a task list's set-ups): bytes taken; -1: off */
    int qscratch_full;   /* ... a piece did not fit */
    /* RoPE cos/sin of the last positions seen (ops.c) */
    float *rope_cs;
    int32_t *rope_pos;
    size_t rope_cap, rope_pos_cap;
    int rope_n, rope_hd;
    const struct rope *rope_of;
    /* scratch that could not be allocated since the forward began (bytes),
     * and a test hook: the fail_next-th allocation from now fails, and
     * fail_fired says it has (cpu_scratch_alloc, cpu_test_fail_scratch) */
    size_t fault_bytes;
    int fail_next, fail_fired;
};

/* The architecture's vector kernels: x86 (AVX2 / AVX-512, each function
 * under its own target attribute) or AArch64 (NEON, always there; dotprod
 * under its own target attribute). Anything else builds the scalar path. */
#if defined(__x86_64__) || defined(__i386__)
#define KILN_X86 1
#elif defined(__aarch64__)
#define KILN_NEON 1
#endif

/* instruction sets of the kernels, chosen at run time (matmul.c), ordered
 * on each architecture (a level has what the ones below it have):
 * KILN_CPU_ISA=scalar|avx2|avx512 (x86) or scalar|neon|dotprod (AArch64)
 * caps it, tests force each with set. The other architecture's levels are
 * names only, above every reachable level, and are never chosen;
 * CPU_ISA_LAST is this architecture's top level. */
#if defined(KILN_NEON)
enum { CPU_ISA_SCALAR = 0, CPU_ISA_NEON = 1, CPU_ISA_DOTPROD = 2, CPU_ISA_LAST = 2, CPU_ISA_AVX2 = 16, CPU_ISA_AVX512 = 17 };
#else
enum { CPU_ISA_SCALAR = 0, CPU_ISA_AVX2 = 1, CPU_ISA_AVX512 = 2, CPU_ISA_LAST = 2, CPU_ISA_NEON = 16, CPU_ISA_DOTPROD = 17 };
#endif
int cpu_isa(void);                /* in use */
int cpu_isa_max(void);            /* best the CPU has */
int cpu_amd_avx512(void);         /* an AMD CPU with AVX-512 (Zen 4 and later): the decode GEMVs' streaming policy */
int cpu_set_isa(int isa);         /* capped at cpu_isa_max(); returns what was set */
const char *cpu_isa_name(int isa);

/* What the kernel dispatch picked: every place that chooses a kernel family
 * by instruction set reports its choice (cpu_isa_note: the level of the
 * family, plus CPU_USED_VNNI / CPU_USED_VBMI for the int8 kernels that need
 * those extensions), and cpu_isa_used() returns the union since the last
 * cpu_isa_used_reset(). Tests hold a forced KILN_CPU_ISA / cpu_set_isa()
 * to it: forced to avx2, nothing AVX-512 may show up. */
enum { CPU_USED_AVX2 = 1, CPU_USED_AVX512 = 2, CPU_USED_VNNI = 4, CPU_USED_VBMI = 8, CPU_USED_NEON = 16, CPU_USED_DOTPROD = 32 };
void cpu_isa_note(int isa, int extra);
int cpu_isa_used(void);
void cpu_isa_used_reset(void);

/*
 * The kernels' threads (cpu.c): n_threads - 1 persistent workers plus the
 * caller. A waiting thread spins briefly, then yields its core, then sleeps
 * on a futex: cheap hand-offs on an idle machine, and no core burnt
 * spinning (nor a stalled partner) when the machine is oversubscribed,
 * where OpenMP's spinning barriers cost ~10x at 2 threads.
 *
 * cpu_parallel_for: items [0, n) in chunks of `chunk`, handed out in order
 * from a shared counter (a thread that runs late takes fewer); fn gets
 * [begin, end) and its thread id (0 = the caller). Small n (one chunk) runs
 * on the caller alone. Not reentrant: fn must not call it again.
 */
typedef void (*cpu_range_fn)(void *arg, int64_t begin, int64_t end, int tid);
void cpu_parallel_for(struct kiln_backend *be, int64_t n, int64_t chunk, cpu_range_fn fn, void *arg);
/* the same, but [0, n) is first cut into one contiguous run per thread,
 * which its thread walks front to back in chunks; a thread whose run is
 * done takes chunks from the others' runs (the pieces shrink near a run's
 * end). For weight-streaming decode kernels: each thread reads its own
 * stretch of the weights front to back (interleaved chunks of the shared
 * counter break both threads' streams at every chunk). */
void cpu_parallel_for_split(struct kiln_backend *be, int64_t n, int64_t chunk, cpu_range_fn fn, void *arg);
/* several decode GEMVs run as one split job (one start and one join): their
 * rows (items) are laid end to end, in order, and cut into one run per
 * thread as above, in chunks of cpu_split_chunk(all rows, row_bytes); fn of
 * each task gets its own item numbers */
struct cpu_task {
    cpu_range_fn fn;
    void *arg;
    int64_t n;
};
void cpu_parallel_for_split_tasks(struct kiln_backend *be, const struct cpu_task *t, int count, size_t row_bytes);
int cpu_n_threads(struct kiln_backend *be);

/* Scratch memory for one op of a forward, 64-byte aligned, freed with
 * free(). When it cannot be had the op that asked skips its work, the bytes
 * are recorded, and the `error` op (which the model calls after the
 * forward) fails the forward with a message; the engine then fails that
 * batch and goes on, and the next forward tries again. Nothing aborts (the
 * CUDA backend does the same with device memory). Only the calling thread
 * allocates: a parallel job gets its per-thread buffers up front
 * (cpu_scratch_threads). cpu_test_fail_scratch(be, n), for tests: the
 * n-th allocation from now (n >= 1) fails, once, and the buffers kept
 * between calls are dropped so that the next forward allocates them again;
 * cpu_test_fail_fired says whether that failure has happened. */
void *cpu_scratch_alloc(struct kiln_backend *be, size_t bytes);
void **cpu_scratch_threads(struct kiln_backend *be, size_t bytes); /* cpu_n_threads buffers, or NULL */
void cpu_scratch_threads_free(struct kiln_backend *be, void **scr);
void cpu_test_fail_scratch(struct kiln_backend *be, int n);
int cpu_test_fail_fired(struct kiln_backend *be);

/* The decode GEMVs' share of that contract: the chunk (rows) of a split
 * job over `rows` rows of `row_bytes` each: ~256 KiB of weights, but at most
 * half a thread's run, so every thread's run is two calls or more and a
 * late thread's second half can still be taken by another.
 *
 * Inside a chunk, a GEMV walks its rows as two streams, CPU_FOR_ROWS2:
 * r0, h, r0 + 1, h + 1, ... (h the chunk's midpoint), so each core keeps two
 * far-apart sequential streams in flight instead of one; each row is
 * computed as before, so results do not change. On this repository's 2-core
 * test host (2 threads, AVX2, 32-byte loads): a plain read of one stream per
 * thread 20.6-25.5 GB/s, two 22.8-30.1; the Q4_0 decode over 256 MB of
 * 1.2-19 MB matrices 84-95% -> 90-104% of the one-stream read with 256 KiB
 * chunks (with 64 KiB chunks two streams gained only 2-4 points; 16 KiB
 * chunks lost 15-20). docs/cpu.md has the runs. */
int64_t cpu_split_chunk(struct kiln_backend *be, int64_t rows, size_t row_bytes);
#define CPU_FOR_ROWS2(r, r0, r1) CPU_FOR_ROWS(r, r0, r1, 1)
/* the same with the order chosen at run time: two streams when `two`, else
 * the rows in order (one stream) */
#define CPU_FOR_ROWS(r, r0, r1, two)                                                                        \
    for (int64_t k2_ = 0, h2_ = ((r1) - (r0) + 1) / 2, r = (r0);                                           \
         k2_ < (r1) - (r0) && ((r = (r0) + (!(two) ? k2_ : k2_ & 1 ? h2_ + k2_ / 2 : k2_ / 2)), 1); k2_++)
/* The dense 16-bit / f32 decode GEMV (matmul.c GEMV1_*) reads a chunk as
 * two streams, except on AMD CPUs for rows of 4 KiB and up, which it reads
 * as one: on a Zen 3 EPYC with the weights in 2 MiB pages one stream read
 * 5-6% more there (BF16 K = 2048, 4096, 6144) and 0-10% less on 2 KiB rows
 * (docs/cpu.md, "One stream for long rows on AMD"); on the Xeon that the
 * two streams were measured on (2 KiB rows) two read 5-10% more. AMD CPUs
 * with AVX-512 (Zen 4 and later) read every row size as one stream and
 * without software prefetch (cpu_gemv_pfd): on a Zen 4 EPYC one stream
 * decoded 0.6B BF16 14% faster than two (docs/cpu.md, "Zen 4").
 * KILN_CPU_GEMV_STREAMS=1|2 forces one order for every row size, 0 the
 * rule by row size; cpu_set_gemv_streams (tests, tools/decode_ab.c) sets
 * 0, 1 or 2 and returns what is in effect. The int8 decode kernels keep two
 * streams (on the same Zen 3 one and two tied), but for one on AMD CPUs
 * with AVX-512 (cpu_qm_two). */
int cpu_gemv_streams(void);
int cpu_set_gemv_streams(int s);
/* a prefetch distance in whole 64-byte lines (bytes; negative: none) */
static inline int cpu_pfd_lines(int d) { return d < 0 ? 0 : d / 64 * 64; }
/* dflt, or the environment's `name` where it is set, in whole lines: how
 * the decode kernels' prefetch settings are chosen, each once (matmul.c) */
int cpu_pfd_env(int dflt, const char *name);
/* the dense decode GEMV's software prefetch distance in bytes, 0 for none
 * (matmul.c; KILN_CPU_GEMV_PFD); the setter for tests and decode-ab */
int cpu_gemv_pfd(void);
int cpu_set_gemv_pfd(int bytes);
/* the same for passes of 2+ activation rows (batched decode; matmul.c,
 * KILN_CPU_GEMV_PFD_BATCH): 2 KiB on AMD CPUs with AVX-512, else
 * cpu_gemv_pfd() */
int cpu_gemv_pfd_batch(void);
int cpu_set_gemv_pfd_batch(int bytes);
/* The batch-1 dense GEMV reads long rows four at a time, each activation
 * load serving four rows' lines (each row keeps its accumulators and order
 * of sums: the same bits). Long: a row's f32 activations and weights
 * ((4 + weight size) x K bytes) overflow the L1 data cache, cpu_gemv_rows()
 * bytes (its size): streamed one row at a time, each row evicts the
 * activations before the next reads them, and the L2 refills slowed the
 * stream (Zen 4, BF16 from DRAM: K 6,144 and 12,288 1.27x; docs/cpu.md,
 * "Long rows four at a time"). KILN_CPU_GEMV_ROWS=BYTES forces the size, 0
 * never (and no pass of two rows at 2-4 activation rows on AVX-512 either);
 * the setter for tests and decode-ab. */
int cpu_gemv_rows(void);
int cpu_set_gemv_rows(int bytes);
/* x86: the int8 decode kernels' prefetch distance and row order (two
 * streams or one; since the thirty-first session also the exact path's
 * fused FP8 / GPTQ decode: one stream on a Zen 4 1.047-1.062x, and the
 * prefetch for its AVX-512 FP8 and 8-bit kernels), and whether batch-1
 * Q8_0 / Q4_0 decode takes the VNNI kernels (qmatmul_int8_x86.c,
 * qmatmul.c); getters and setters for tests and decode-ab */
int cpu_qm_pfd(void);
int cpu_qm_two(void);
int cpu_set_qm_pfd(int bytes);
/* ... and the VNNI K-format groups' second prefetch, into L2, that many
 * bytes ahead (0 none; KILN_CPU_QM_PF2); the setter for decode-ab */
int cpu_set_qm_pf2(int bytes);
int cpu_set_qm_two(int two);
/* MoE experts as lists of matmuls in batches of up to 512 gathered rows
 * (moe.c; KILN_CPU_MOE_TASKS=0: one by one); the setter for tests and
 * decode-ab: 0 one by one, 1 as by default, more: batches of that many
 * rows. cpu_test_tasks_jobs: the task lists run as one job so far */
int cpu_set_moe_tasks(int rows);
long cpu_test_tasks_jobs(void);
/* how far ahead, in bytes of a thread's stream, decode attention's rows
 * (head_dim 64 or 128, x86) prefetch their pages into L2 (attention.c,
 * KILN_CPU_ATT_PFD; 0 none); the setter for decode-ab */
enum { ATT_PFD_DEFAULT = 32768 };
int cpu_set_att_pfd(int bytes);
int cpu_vnni_dec(void);
int cpu_set_vnni_dec(int on);

/* f32 view of a small prepared tensor (norm weight, bias) */
static inline const float *cpu_vec(const struct ktensor *t) { return (const float *)t->be; }

/* out[n][n_out] = x[n][n_in] W^T + b, all f32 activations */
void cpu_matmul(struct kiln_backend *be, void *out, const void *x, const struct qlinear *w, int n);
enum { MULTI_MAX = 4 }; /* linears per cpu_matmul_multi job */
/* outs[i] = x ws[i]^T + b_i for count linears sharing x: decode (GEMV) of
 * linears of one format, dtype and width as one pool job, else one by one */
void cpu_matmul_multi(struct kiln_backend *be, void *const *outs, const void *x, const struct qlinear *const *ws, int count,
                      int n);

/* a list of matmuls, each with its own x (the experts of an MoE layer):
 * t[i].out[n][n_out] = t[i].x[n][n_in] t[i].w^T + b. Linears of one
 * format, dtype and width on a path that allows it (the int8 paths: GGUF
 * types, GPTQ / AWQ 4-bit without act order; no GEMM among them) run as
 * one pool job, else one by one; the bits are the same either way. */
struct cpu_mm {
    const struct qlinear *w;
    const float *x;
    float *out;
    int n;
};
void cpu_matmul_tasks(struct kiln_backend *be, const struct cpu_mm *t, int count);

/* dot products of one weight row (stored dtype) with 1..4 f32 vectors */
typedef void (*cpu_dot_fn)(const void *row, const float *const *x, int nx, int n_in, float *out);
cpu_dot_fn cpu_dot_for(enum kiln_dtype t);

/* BF16 weights in 12 bits, losslessly (b12.c has the format): a dense
 * BF16 linear's prepared form on x86 when n_in is a multiple of B12_K and
 * KILN_CPU_B12 is not 0 (cpu_b12_on). Rows of rb bytes at data; escaped
 * blocks' raw bf16 at esc. The GEMVs and GEMM read it with the BF16
 * kernels' order of sums: the same bits as the stored BF16. */
enum { B12_K = 64, B12_BB = 96 }; /* weights per block; bytes per block after the row's base bytes */
struct cpu_b12 {
    uint8_t *data;
    uint16_t *esc;
    size_t rb;
    int n_out, n_in;
    int64_t n_esc; /* escaped blocks */
};
int cpu_b12_on(void);
size_t cpu_b12_row_bytes(int n_in);
/* NULL when out of memory (or n_in is not a multiple of B12_K); the pool
 * encodes the rows */
struct cpu_b12 *cpu_b12_pack(struct kiln_backend *be, const uint16_t *w, int n_out, int n_in);
/* an F16 linear's weights as BF16 (malloc'd) when every one is a bf16
 * value, else NULL (also when out of memory): b12.c */
uint16_t *cpu_f16_as_bf16(struct kiln_backend *be, const uint16_t *h, int n_out, int n_in);
void cpu_b12_free(struct cpu_b12 *b);
size_t cpu_b12_bytes(const struct cpu_b12 *b);
/* bf16 of elements [k0, k0 + k) of a row (multiples of B12_K); the same
 * as f32, vectorized for cpu_isa() (the GEMM's panels) */
void cpu_b12_decode(const uint8_t *row, int n_in, int k0, int k, uint16_t *dst);
void cpu_b12_decode_f32(const uint8_t *row, int n_in, int k0, int k, float *dst);
/* the AVX2 12-bit kernel's batch-1 prefetch distance in bytes (b12.c,
 * KILN_CPU_B12_PFD); the setter for tests and decode-ab */
int cpu_b12_pfd(void);
int cpu_set_b12_pfd(int bytes);
/* whether the AVX-512 12-bit kernels decode with VBMI (the CPU has it and
 * KILN_CPU_B12_VBMI is not 0); the setter returns what was set */
int cpu_b12_vbmi(void);
int cpu_set_b12_vbmi(int on);
/* whether the AVX2 12-bit loop takes pairs of rows at batch 1
 * (KILN_CPU_B12_PAIRS2, default on); the setter returns what was set */
int cpu_b12_pairs2(void);
int cpu_set_b12_pairs2(int on);
/* cpu_dot_fn of a 12-bit row (the scalar path) */
void cpu_b12_dot_scalar(const void *row, const float *const *x, int nx, int n_in, float *out);

/* quantized linears (qmatmul.c; the paths in qmatmul_*.c): prepare once at load (repack GPTQ/AWQ,
 * f32 copies of FP8 scales), release, and the matmul */
int cpu_qprepare_linear(struct qlinear *w, char *err, size_t errlen);
void cpu_qrelease_linear(struct qlinear *w);
void cpu_qmatmul(struct kiln_backend *be, void *out, const void *x, const struct qlinear *w, int n);
/* the decode of count quantized linears of one format, dtype and width as
 * one pool job (x quantized or reordered once); 0 when their shape or the
 * path does not allow it (nothing done: the caller runs them one by one) */
int cpu_qmatmul_multi(struct kiln_backend *be, float *const *outs, const float *x, const struct qlinear *const *ws, int count,
                      int n);
/* cpu_matmul_tasks for quantized linears of one format: 1 when done as one
 * job, 0 when the caller must run them one by one */
int cpu_qmatmul_tasks(struct kiln_backend *be, const struct cpu_mm *t, int count);

#if defined(KILN_NEON)
/* matmul.c's NEON f32 GEMM, for the other GEMMs over f32 weight panels (the
 * exact quantized path's prefill, qmatmul_exact.c): x packed in tiles of
 * CPU_NEON_MR tokens ([k][MR], zero padded), weights in panels of
 * CPU_NEON_NR rows ([k][NR]). cpu_neon_pack_f32: nr <= NR rows of K f32
 * (one after the other) into such a panel, rows past nr zero;
 * cpu_neon_ukr: c[t][0..nr) = sum_k xp[k][t] wp[k][0..nr) + bias for the
 * tile's first mr tokens (c's rows ldc apart). */
enum { CPU_NEON_MR = 8, CPU_NEON_NR = 12 };
void cpu_neon_pack_f32(float *wp, const float *rows, int K, int nr);
void cpu_neon_ukr(const float *xp, const float *wp, int K, float *c, size_t ldc, int mr, int nr, const float *bias);
#endif

/* converts one row of n stored elements to f32 */
void cpu_row_to_f32(float *dst, const void *src, enum kiln_dtype t, int64_t n);

void cpu_attention(struct kiln_backend *be, void *out, const void *q, const struct kv_cache *kv, int layer,
                   const struct kiln_batch *b, int n_head, float scale);
/* the same attention computed plainly (attention.c): per row and head, exact
 * max-subtracted softmax, scalar loops, whatever cpu_isa() says; the
 * reference the tests hold cpu_attention's tiled and vector paths to */
void cpu_attention_ref(struct kiln_backend *be, void *out, const void *q, const struct kv_cache *kv, int layer,
                       const struct kiln_batch *b, int n_head, float scale);
void cpu_kv_write(struct kiln_backend *be, struct kv_cache *kv, int layer, const void *k, const void *v,
                  const struct kiln_batch *b);
void cpu_moe(struct kiln_backend *be, void *out, const void *x, const struct moe_ffn *m, int n, int dim);

struct kiln_backend *cpu_backend_create(int n_threads, char *err, size_t errlen);

#endif
