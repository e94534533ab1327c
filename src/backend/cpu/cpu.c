/*
 * cpu.c: the CPU backend's op table, memory and weight preparation.
 * Weights stay where the loader put them (the mmap'd checkpoint); only small
 * vectors (norms, biases, rope frequencies) get f32 copies here.
 */
#include "backend/cpu/cpu.h"

#include <omp.h>
#include <stdlib.h>

#include "base/base.h"

void cpu_ops_install(struct kiln_backend *be);

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
    if (w->fmt != KILN_WFMT_DENSE || !cpu_dot_for(w->w.dtype))
        return kiln_errf(err, errlen, "cpu: linear weights of dtype %s are not supported", dtype_name(w->w.dtype));
    if (w->bias.data) return cpu_prepare_tensor(be, &w->bias, err, errlen);
    return 0;
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

static void cpu_release_linear(struct kiln_backend *be, struct qlinear *w) { cpu_release_tensor(be, &w->bias); }

static void cpu_release_rope(struct kiln_backend *be, struct rope *r) {
    (void)be;
    r->be = NULL;
}

static int cpu_begin(struct kiln_backend *be, const struct kiln_batch *b) {
    (void)be, (void)b;
    return 0;
}

static void cpu_destroy(struct kiln_backend *be) {
    free(be->ctx);
    free(be);
}

struct kiln_backend *cpu_backend_create(int n_threads, char *err, size_t errlen) {
    (void)err, (void)errlen;
    struct kiln_backend *be = kiln_calloc(1, sizeof *be);
    struct cpu_ctx *c = kiln_calloc(1, sizeof *c);
    c->n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
    omp_set_num_threads(c->n_threads);
    be->name = "cpu";
    be->act_size = sizeof(float);
    be->ctx = c;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->memzero = cpu_memzero;
    be->read = cpu_read;
    be->write = cpu_write;
    be->prepare_tensor = cpu_prepare_tensor;
    be->prepare_linear = cpu_prepare_linear;
    be->prepare_rope = cpu_prepare_rope;
    be->release_tensor = cpu_release_tensor;
    be->release_linear = cpu_release_linear;
    be->release_rope = cpu_release_rope;
    be->begin = cpu_begin;
    be->matmul = cpu_matmul;
    be->kv_write = cpu_kv_write;
    be->attention = cpu_attention;
    be->moe = cpu_moe;
    be->destroy = cpu_destroy;
    cpu_ops_install(be);
    return be;
}
