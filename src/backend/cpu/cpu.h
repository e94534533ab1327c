/*
 * cpu.h: internals shared by the CPU backend's files (not a public API).
 *
 * The CPU backend keeps activations in f32, weights in their stored format
 * (mmap'd), and KV pages in f32. Small vectors (norm weights, biases, rope
 * frequencies) get an f32 copy at prepare time. Every op parallelizes inside
 * itself with OpenMP over independent rows or heads.
 */
#ifndef KILN_CPU_H
#define KILN_CPU_H

#include "backend/backend.h"

struct cpu_ctx {
    int n_threads;
};

/* f32 view of a small prepared tensor (norm weight, bias) */
static inline const float *cpu_vec(const struct ktensor *t) { return (const float *)t->be; }

/* out[n][n_out] = x[n][n_in] W^T + b, all f32 activations */
void cpu_matmul(struct kiln_backend *be, void *out, const void *x, const struct qlinear *w, int n);

/* dot products of one weight row (stored dtype) with 1..4 f32 vectors */
typedef void (*cpu_dot_fn)(const void *row, const float *const *x, int nx, int n_in, float *out);
cpu_dot_fn cpu_dot_for(enum kiln_dtype t);

/* converts one row of n stored elements to f32 */
void cpu_row_to_f32(float *dst, const void *src, enum kiln_dtype t, int64_t n);

void cpu_attention(struct kiln_backend *be, void *out, const void *q, const struct kv_cache *kv, int layer,
                   const struct kiln_batch *b, int n_head, float scale);
void cpu_kv_write(struct kiln_backend *be, struct kv_cache *kv, int layer, const void *k, const void *v,
                  const struct kiln_batch *b);
void cpu_moe(struct kiln_backend *be, void *out, const void *x, const struct moe_ffn *m, int n, int dim);

struct kiln_backend *cpu_backend_create(int n_threads, char *err, size_t errlen);

#endif
