/*
 * cpu.c: the CPU backend's op table, memory, weight preparation and the
 * kernels' worker pool. Weights stay where the loader put them (the mmap'd
 * checkpoint); only small vectors (norms, biases, rope frequencies) get f32
 * copies here.
 *
 * The pool (cpu.h describes its contract): n - 1 pthreads wait for a job on
 * a generation counter; the caller publishes the job, works on it too, and
 * waits for the workers. Every wait spins ~2000 pauses, then yields the
 * core ~50 times, then sleeps on a futex, so a hand-off costs well under a
 * microsecond when the machine is idle and nothing when it is oversubscribed
 * (OpenMP's default spinning made 2-thread decode ~10x slower there).
 *
 * Two ways to hand out items: cpu_parallel_for takes chunks in order from
 * one shared counter; cpu_parallel_for_split (decode GEMVs) gives each
 * thread one contiguous run, walked front to back, and a thread that is done
 * takes chunks off the back of the others' runs. With the shared counter
 * the two threads' chunks interleave and each thread's weight stream breaks
 * at every chunk: decode matmuls of Qwen3-0.6B, 2 threads, Q4_0 8.8 -> 6.0
 * ms per token's worth, BF16 (with the one-row GEMV) 21 -> 16.6 ms. Near a
 * run's end the split's pieces shrink (half of what is left, down to an
 * eighth of a chunk), so the threads finish together: with 256 KiB chunks
 * (cpu_split_chunk) the Q4_0 decode of Qwen3-0.6B spent 3.9% of its samples
 * in the workers' wait and 1.2% in the caller's join, 2.5% and 0.7% with
 * the shrinking tail.
 */
#include "backend/cpu/cpu.h"
#include "format/quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"

void cpu_ops_install(struct kiln_backend *be);

/* ==== the worker pool ==== */

struct cpu_pool {
    int n;                 /* threads, the caller included */
    pthread_t *th;
    _Atomic int gen;       /* bumped once per job */
    _Atomic int pending;   /* workers still in the current job */
    _Atomic int sleepers;  /* workers asleep on gen */
    _Atomic int master_waits;
    _Atomic int stop;
    _Atomic int64_t next;  /* next item of the current job */
    int64_t n_items, chunk;
    cpu_range_fn fn;
    void *arg;
    int split;             /* cpu_parallel_for_split: one run of items per thread */
    struct pool_run *run;  /* [n]: thread t's run of items */
};

/* a thread's run of items (cpu_parallel_for_split), one cache line each:
 * [begin, end) packed in one word (begin | end << 32), taken from the front
 * by its owner and from the back by the others */
struct pool_run {
    _Atomic uint64_t be;
    char pad[56];
};

static void futex_wait(_Atomic int *addr, int val) { syscall(SYS_futex, (int *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0); }
static void futex_wake(_Atomic int *addr) { syscall(SYS_futex, (int *)addr, FUTEX_WAKE_PRIVATE, 1 << 30, NULL, NULL, 0); }

enum { SPIN_PAUSES = 2000, SPIN_YIELDS = 50 };

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static void pool_work(struct cpu_pool *p, int tid) {
    if (p->split) {
        /* own run front to back, so its owner reads its weights in order;
         * then chunks off the back of the others' runs, so as not to cut
         * into their owners' streams until the two meet */
        const uint64_t lo = 0xffffffffu, c = (uint64_t)p->chunk;
        for (int k = 0; k < p->n; k++) {
            struct pool_run *r = &p->run[(tid + k) % p->n];
            uint64_t v = atomic_load_explicit(&r->be, memory_order_relaxed);
            for (;;) {
                uint64_t b = v & lo, e = v >> 32, nb, ne;
                if (b >= e) break;
                /* a chunk, or half of what is left once that is under two
                 * chunks (at least an eighth of one): the last pieces of a
                 * run are small, so the threads finish together */
                uint64_t take = c;
                if (e - b < 2 * c) {
                    take = (e - b) / 2;
                    if (take < c / 8) take = c / 8;
                    if (take < 1) take = 1;
                }
                if (k == 0) nb = b + take < e ? b + take : e, ne = e;
                else nb = b, ne = e - b > take ? e - take : b;
                if (!atomic_compare_exchange_weak_explicit(&r->be, &v, nb | ne << 32, memory_order_relaxed, memory_order_relaxed))
                    continue; /* v reloaded */
                if (k == 0) p->fn(p->arg, (int64_t)b, (int64_t)nb, tid);
                else p->fn(p->arg, (int64_t)ne, (int64_t)e, tid);
                v = atomic_load_explicit(&r->be, memory_order_relaxed);
            }
        }
        return;
    }
    for (;;) {
        int64_t b = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
        if (b >= p->n_items) break;
        int64_t e = b + p->chunk < p->n_items ? b + p->chunk : p->n_items;
        p->fn(p->arg, b, e, tid);
    }
}

static void *pool_main(void *arg_) {
    struct cpu_pool *p = ((void **)arg_)[0];
    int tid = (int)(intptr_t)((void **)arg_)[1];
    free(arg_);
    int seen = 0;
    for (;;) {
        int g, spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (spins < SPIN_PAUSES) cpu_relax(), spins++;
            else if (spins < SPIN_PAUSES + SPIN_YIELDS) sched_yield(), spins++;
            else {
                atomic_fetch_add(&p->sleepers, 1);
                futex_wait(&p->gen, seen);
                atomic_fetch_sub(&p->sleepers, 1);
            }
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        pool_work(p, tid);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->master_waits))
            futex_wake(&p->pending);
    }
}

static struct cpu_pool *pool_create(int n) {
    struct cpu_pool *p = kiln_calloc(1, sizeof *p);
    p->n = n;
    p->th = kiln_calloc((size_t)(n > 1 ? n - 1 : 1), sizeof *p->th);
    if (posix_memalign((void **)&p->run, 64, sizeof *p->run * (size_t)n)) {
        free(p->th), free(p);
        return NULL;
    }
    memset(p->run, 0, sizeof *p->run * (size_t)n);
    for (int i = 1; i < n; i++) {
        void **a = kiln_malloc(2 * sizeof(void *));
        a[0] = p, a[1] = (void *)(intptr_t)i;
        if (pthread_create(&p->th[i - 1], NULL, pool_main, a)) {
            free(a);
            p->n = i; /* fewer threads than asked: still correct */
            break;
        }
    }
    return p;
}

static void pool_destroy(struct cpu_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    futex_wake(&p->gen);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i - 1], NULL);
    free(p->th);
    free(p->run);
    free(p);
}

int cpu_n_threads(struct kiln_backend *be) { return ((struct cpu_ctx *)be->ctx)->pool->n; }

void *cpu_scratch_alloc(struct kiln_backend *be, size_t bytes) {
    struct cpu_ctx *c = be->ctx;
    void *p = NULL;
    if (c->fail_next > 0 && --c->fail_next == 0) c->fail_fired = 1;
    else if (posix_memalign(&p, 64, bytes ? bytes : 64)) p = NULL;
    if (!p) c->fault_bytes += bytes ? bytes : 64;
    return p;
}

void **cpu_scratch_threads(struct kiln_backend *be, size_t bytes) {
    const int n = cpu_n_threads(be);
    void **scr = cpu_scratch_alloc(be, sizeof(void *) * (size_t)n);
    if (!scr) return NULL;
    for (int i = 0; i < n; i++)
        if (!(scr[i] = cpu_scratch_alloc(be, bytes))) {
            while (i--) free(scr[i]);
            free(scr);
            return NULL;
        }
    return scr;
}

void cpu_scratch_threads_free(struct kiln_backend *be, void **scr) {
    if (!scr) return;
    for (int i = 0; i < cpu_n_threads(be); i++) free(scr[i]);
    free(scr);
}

/* the buffers kept from one call to the next, freed (they grow again on use) */
static void drop_kept_scratch(struct cpu_ctx *c) {
    free(c->scratch), c->scratch = NULL, c->scratch_cap = 0;
    free(c->qscratch), c->qscratch = NULL, c->qscratch_cap = 0;
    free(c->rope_cs), c->rope_cs = NULL, c->rope_cap = 0;
    free(c->rope_pos), c->rope_pos = NULL, c->rope_pos_cap = 0;
    c->rope_of = NULL;
}

void cpu_test_fail_scratch(struct kiln_backend *be, int n) {
    struct cpu_ctx *c = be->ctx;
    drop_kept_scratch(c);
    c->fail_next = n, c->fail_fired = 0;
}

int cpu_test_fail_fired(struct kiln_backend *be) { return ((struct cpu_ctx *)be->ctx)->fail_fired; }

static void parallel_for(struct kiln_backend *be, int64_t n, int64_t chunk, cpu_range_fn fn, void *arg, int split) {
    struct cpu_pool *p = ((struct cpu_ctx *)be->ctx)->pool;
    if (n <= 0) return;
    if (chunk < 1) chunk = 1;
    if (p->n == 1 || n <= chunk) {
        fn(arg, 0, n, 0);
        return;
    }
    p->fn = fn, p->arg = arg, p->n_items = n, p->chunk = chunk, p->split = split;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    if (split)
        for (int t = 0; t < p->n; t++) {
            uint64_t b = (uint64_t)(n * t / p->n), e = (uint64_t)(n * (t + 1) / p->n);
            atomic_store_explicit(&p->run[t].be, b | e << 32, memory_order_relaxed);
        }
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes the job, then reads sleepers */
    if (atomic_load(&p->sleepers)) futex_wake(&p->gen);
    pool_work(p, 0);
    int spins = 0, v;
    while ((v = atomic_load_explicit(&p->pending, memory_order_acquire)) != 0) {
        if (spins < SPIN_PAUSES) cpu_relax(), spins++;
        else if (spins < SPIN_PAUSES + SPIN_YIELDS) sched_yield(), spins++;
        else {
            atomic_store(&p->master_waits, 1);
            if ((v = atomic_load(&p->pending)) != 0) futex_wait(&p->pending, v);
            atomic_store(&p->master_waits, 0);
        }
    }
}

void cpu_parallel_for(struct kiln_backend *be, int64_t n, int64_t chunk, cpu_range_fn fn, void *arg) {
    parallel_for(be, n, chunk, fn, arg, 0);
}

void cpu_parallel_for_split(struct kiln_backend *be, int64_t n, int64_t chunk, cpu_range_fn fn, void *arg) {
    parallel_for(be, n, chunk, fn, arg, n < ((int64_t)1 << 32)); /* runs are packed in 32-bit halves */
}

int64_t cpu_split_chunk(struct kiln_backend *be, int64_t rows, size_t row_bytes) {
    enum { CHUNK_BYTES = 256 << 10 };
    const int64_t nt = cpu_n_threads(be), half_run = (rows + 2 * nt - 1) / (2 * nt);
    int64_t c = (int64_t)(CHUNK_BYTES / (row_bytes ? row_bytes : 1));
    if (c > half_run) c = half_run;
    return c < 1 ? 1 : c;
}

/* several split jobs as one: the tasks' items are laid end to end, so each
 * thread's run may cover the end of one task and the start of the next */
struct task_set {
    const struct cpu_task *t;
    int count;
};

static void tasks_range(void *arg, int64_t b, int64_t e, int tid) {
    const struct task_set *s = arg;
    int64_t off = 0;
    for (int i = 0; i < s->count && b < e; off += s->t[i].n, i++) {
        const int64_t end = off + s->t[i].n;
        if (b >= end) continue;
        const int64_t e1 = e < end ? e : end;
        s->t[i].fn(s->t[i].arg, b - off, e1 - off, tid);
        b = e1;
    }
}

void cpu_parallel_for_split_tasks(struct kiln_backend *be, const struct cpu_task *t, int count, size_t row_bytes) {
    struct task_set s = {t, count};
    int64_t n = 0;
    for (int i = 0; i < count; i++) n += t[i].n;
    cpu_parallel_for_split(be, n, cpu_split_chunk(be, n, row_bytes), tasks_range, &s);
}

/* ==== memory ==== */

static void *cpu_alloc(struct kiln_backend *be, size_t bytes) {
    (void)be;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) return NULL;
    return p;
}

static void cpu_free(struct kiln_backend *be, void *p) {
    (void)be;
    free(p);
}

static void cpu_memzero(struct kiln_backend *be, void *p, size_t bytes) {
    (void)be;
    memset(p, 0, bytes);
}

static void cpu_read(struct kiln_backend *be, float *dst, const void *src, size_t n) {
    (void)be;
    memcpy(dst, src, n * sizeof(float));
}

/* host RAM: MemAvailable and MemTotal of /proc/meminfo (sysconf where that is missing) */
static void cpu_mem_info(struct kiln_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    long pg = sysconf(_SC_PAGESIZE);
    *total_bytes = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)pg;
    *free_bytes = (size_t)sysconf(_SC_AVPHYS_PAGES) * (size_t)pg;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return;
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) *free_bytes = (size_t)kb * 1024;
        else if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) *total_bytes = (size_t)kb * 1024;
    fclose(f);
}

static void cpu_argmax(struct kiln_backend *be, int32_t *ids, const void *x, int n, int width) {
    (void)be;
    for (int i = 0; i < n; i++) ids[i] = kiln_argmax((const float *)x + (size_t)i * width, width);
}

static void cpu_write(struct kiln_backend *be, void *dst, const float *src, size_t n) {
    (void)be;
    memcpy(dst, src, n * sizeof(float));
}

/* small tensors only: an f32 copy for the kernels */
static int cpu_prepare_tensor(struct kiln_backend *be, struct ktensor *t, char *err, size_t errlen) {
    (void)be;
    int64_t n = t->rows * t->cols;
    if (t->rows != 1) return 0; /* matrices (the embedding) are read as stored */
    if (t->dtype != KILN_DTYPE_F32 && t->dtype != KILN_DTYPE_F16 && t->dtype != KILN_DTYPE_BF16)
        return kiln_errf(err, errlen, "cpu: vector of dtype %s is not supported", dtype_name(t->dtype));
    float *f = kiln_malloc(sizeof(float) * (size_t)n);
    cpu_row_to_f32(f, t->data, t->dtype, n);
    t->be = f;
    return 0;
}

static int cpu_prepare_linear(struct kiln_backend *be, struct qlinear *w, char *err, size_t errlen) {
    if (w->fmt != KILN_WFMT_DENSE && cpu_qprepare_linear(w, err, errlen)) return -1;
    if (w->fmt == KILN_WFMT_DENSE && !cpu_dot_for(w->w.dtype))
        return kiln_errf(err, errlen, "cpu: linear weights of dtype %s are not supported", dtype_name(w->w.dtype));
    /* BF16 in 12 bits (b12.c): the decode reads 24% fewer bytes, the same
     * bits; kept as BF16 where escaped blocks would leave it less than 10%
     * smaller (weights whose blocks span wide exponent ranges). F16 whose
     * every weight is a bf16 value (a file converted from BF16) too, as
     * that BF16: the F16 kernels' bits (b12.c, "F16 as BF16") */
    const int f16 = w->w.dtype == KILN_DTYPE_F16;
    const int b12 = w->fmt == KILN_WFMT_DENSE && (w->w.dtype == KILN_DTYPE_BF16 || f16) && w->n_in % B12_K == 0 && !be->keep_stored && cpu_b12_on();
    uint16_t *hb = b12 && f16 ? cpu_f16_as_bf16(be, w->w.data, w->n_out, w->n_in) : NULL; /* NULL: not all bf16 values, stays F16 */
    if (b12 && (!f16 || hb)) {
        struct cpu_b12 *b = cpu_b12_pack(be, f16 ? hb : w->w.data, w->n_out, w->n_in);
        free(hb);
        if (!b) return kiln_errf(err, errlen, "cpu: out of memory storing a 16-bit linear (%d x %d) in 12 bits", w->n_out, w->n_in);
        if ((double)cpu_b12_bytes(b) > 0.9 * 2.0 * (double)w->n_out * (double)w->n_in) {
            cpu_b12_free(b);
        } else {
            w->be = b;
            w->repacked = 1;
        }
    }
    if (w->bias.data) return cpu_prepare_tensor(be, &w->bias, err, errlen);
    return 0;
}

static int64_t cpu_linear_bytes(struct kiln_backend *be, const struct qlinear *w) {
    (void)be;
    return w->fmt == KILN_WFMT_DENSE && w->be ? (int64_t)cpu_b12_bytes(w->be) : quant_linear_bytes(w);
}

static int cpu_prepare_rope(struct kiln_backend *be, struct rope *r, char *err, size_t errlen) {
    (void)be, (void)err, (void)errlen;
    r->be = r->inv_freq;
    return 0;
}

static void cpu_release_tensor(struct kiln_backend *be, struct ktensor *t) {
    (void)be;
    if (t->rows == 1) free(t->be);
    t->be = NULL;
}

static void cpu_release_linear(struct kiln_backend *be, struct qlinear *w) {
    if (w->fmt != KILN_WFMT_DENSE) cpu_qrelease_linear(w);
    else cpu_b12_free(w->be), w->be = NULL;
    cpu_release_tensor(be, &w->bias);
}

static void cpu_release_rope(struct kiln_backend *be, struct rope *r) {
    struct cpu_ctx *c = be->ctx;
    if (c->rope_of == r) c->rope_of = NULL; /* the cos/sin table was this rope's */
    r->be = NULL;
}

static int cpu_begin(struct kiln_backend *be, const struct kiln_batch *b) {
    (void)b;
    ((struct cpu_ctx *)be->ctx)->fault_bytes = 0;
    return 0;
}

static int cpu_error(struct kiln_backend *be, char *err, size_t errlen) {
    struct cpu_ctx *c = be->ctx;
    if (!c->fault_bytes) return 0;
    const size_t b = c->fault_bytes;
    c->fault_bytes = 0;
    return kiln_errf(err, errlen,
                     "cpu: out of memory: %.1f MiB of scratch for this batch could not be allocated; the batch failed, "
                     "nothing else changed. A smaller prefill chunk (--chunk; kiln serve: --chunked-prefill-size) needs less",
                     b / 1048576.0);
}

static int cpu_load_width(struct kiln_backend *be) {
    (void)be;
#if defined(KILN_X86)
    return cpu_isa() >= CPU_ISA_AVX512 ? 64 : cpu_isa() >= CPU_ISA_AVX2 ? 32 : 16;
#else
    return 16; /* NEON and scalar: 16-byte vectors */
#endif
}

static void cpu_destroy(struct kiln_backend *be) {
    struct cpu_ctx *c = be->ctx;
    pool_destroy(c->pool);
    drop_kept_scratch(c);
    free(be->ctx);
    free(be);
}

struct kiln_backend *cpu_backend_create(int n_threads, char *err, size_t errlen) {
    struct kiln_backend *be = kiln_calloc(1, sizeof *be);
    struct cpu_ctx *c = kiln_calloc(1, sizeof *c);
    c->n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
    c->qscratch_top = (size_t)-1; /* not stacking (qm_buf_stack) */
    omp_set_num_threads(c->n_threads); /* for the OpenMP loops outside this backend (weight loading and conversion: load.c, gptq.c, quant.c) */
    if (!(c->pool = pool_create(c->n_threads))) {
        free(c), free(be);
        kiln_errf(err, errlen, "cpu: out of memory for the thread pool");
        return NULL;
    }
    be->name = "cpu";
    be->act_size = sizeof(float);
    be->ctx = c;
    be->load_width = cpu_load_width;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->memzero = cpu_memzero;
    be->read = cpu_read;
    be->argmax = cpu_argmax;
    be->mem_info = cpu_mem_info;
    be->write = cpu_write;
    be->prepare_tensor = cpu_prepare_tensor;
    be->prepare_linear = cpu_prepare_linear;
    be->linear_bytes = cpu_linear_bytes;
    be->prepare_rope = cpu_prepare_rope;
    be->release_tensor = cpu_release_tensor;
    be->release_linear = cpu_release_linear;
    be->release_rope = cpu_release_rope;
    be->begin = cpu_begin;
    be->error = cpu_error;
    be->matmul = cpu_matmul;
    be->matmul_multi = cpu_matmul_multi;
    be->kv_write = cpu_kv_write;
    be->attention = cpu_attention;
    be->moe = cpu_moe;
    be->destroy = cpu_destroy;
    cpu_ops_install(be);
    return be;
}
