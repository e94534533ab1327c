/*
 * backend.h: the op table every backend implements, and the two structures
 * the forward pass hands to it: the KV cache storage and the batch.
 *
 * The model (src/model/) is written once against this table. Activations are
 * opaque buffers from backend->alloc, `act_size` bytes per element (f32 on
 * the CPU, bf16 on CUDA); the model never dereferences them. Ops may run
 * asynchronously (CUDA stream order); `read` waits for them and converts to
 * f32 on the host.
 *
 * Shapes: activations are row-major [n_tokens][width]. q is [n][n_head *
 * head_dim], k and v are [n][n_head_kv * head_dim].
 */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "format/dtype.h"
#include "model/weights.h"

struct kiln_config;

/*
 * KV cache storage: a pool of pages, each holding page_size tokens of one
 * layer's K (and V) for every KV head:
 *
 *   k[layer] -> page 0                       page 1 ...
 *               +-----------------------+
 *               | head 0: slot 0..P-1   |   each slot = head_dim elements
 *               | head 1: slot 0..P-1   |
 *               | ...                   |
 *               +-----------------------+
 *
 *   row (layer, page, head, slot) starts at byte
 *   k[layer] + ((page * n_head_kv + head) * page_size + slot) * kv_row_bytes
 *
 * so one head's keys of one page are contiguous (what attention streams).
 * A row is head_dim elements of dtype (F32, F16, BF16), or for Q8_0 (the
 * CPU's INT8 cache, `--kv-dtype q8_0`) head_dim / 32 GGUF Q8_0 blocks
 * (an f16 scale d, then 32 int8 q; the element is d * q, exact in f32).
 * A sequence's token t lives in page pages[t / page_size], slot
 * t % page_size. Page ids index the same pool for every layer.
 */
struct kv_cache {
    int n_layer, n_head_kv, head_dim, page_size, n_pages;
    enum kiln_dtype dtype; /* F32, F16, BF16 or Q8_0 */
    void **k, **v;         /* [n_layer] backend buffers of n_pages pages */
};

/* bytes of one cache row (one token, one KV head): head_dim elements, or
 * head_dim / 32 Q8_0 blocks of 34 bytes */
static inline size_t kv_row_bytes(enum kiln_dtype t, int head_dim) {
    return t == KILN_DTYPE_Q8_0 ? (size_t)head_dim / 32 * 34 : (size_t)head_dim * dtype_size(t);
}

/*
 * One forward step over a flattened batch: prefill chunks and decode tokens
 * of several sequences side by side.
 *
 *   rows:   | seq 0: n new tokens    | seq 1: 1 token | seq 2: chunk ... |
 *   seq s:  start = first row, n = its rows, n_past = tokens already in the
 *           KV cache (its new tokens have positions n_past .. n_past+n-1
 *           unless pos says otherwise), pages = its page table covering
 *           n_past + n tokens.
 *
 * Logits are computed for the rows listed in out_rows only.
 */
struct kiln_seq_view {
    int start, n, n_past;
    const int32_t *pages;
    int n_pages;
};

struct kiln_batch {
    int n_tokens;
    const int32_t *tokens; /* [n_tokens] */
    const int32_t *pos;    /* [n_tokens] */
    int n_seqs;
    const struct kiln_seq_view *seqs;
    int n_out;
    const int32_t *out_rows; /* [n_out] rows whose logits are wanted */
    /* optional: when out_ids is set, the backend also finds each out row's
     * argmax (out_ids[i], on the device where there is one) and only the
     * rows with out_full[i] != 0 (every row if out_full is NULL) are copied
     * out as logits. Greedy requests need no more than the id, and 64 rows
     * of a 152k vocabulary are 39 MB of f32 per step otherwise. */
    int32_t *out_ids;
    const uint8_t *out_full;
};

struct kiln_backend {
    const char *name;
    size_t act_size; /* bytes per activation element */
    void *ctx;       /* backend private state */
    /* the engine runs one prefill chunk at open (engine.c, warm_up): set by
     * a backend whose scratch is scarce device memory, sized by the first
     * forward of a shape */
    int warm_at_open;
    /* set by a backend whose weights live in the memory mem_info reports
     * and cannot page (a GPU's): the loader refuses a checkpoint whose
     * weights cannot fit there before it uploads any (load.c) */
    int device_weights;
    /* set before a model's load by a caller that reads the stored weights
     * after it (kiln quantize): the backend then computes on them as they
     * are and stores no smaller copy of its own in their place */
    int keep_stored;
    /* the KV cache dtypes its attention reads: bit 1 << dtype; 0 for any
     * the engine offers (f32, f16, bf16, q8_0) */
    unsigned kv_dtypes;

    /* the width in bytes of the vector loads its weight-streaming kernels
     * use now (the CPU: 16, 32 with AVX2, 64 with AVX-512), for a bandwidth
     * probe that reads as they do; NULL where that does not apply */
    int (*load_width)(struct kiln_backend *be);

    /* memory: NULL on failure; buffers hold activations or KV pages */
    void *(*alloc)(struct kiln_backend *be, size_t bytes);
    void (*free)(struct kiln_backend *be, void *p);
    /* the device memory now free and in total (host RAM on the CPU), bytes */
    void (*mem_info)(struct kiln_backend *be, size_t *free_bytes, size_t *total_bytes);
    /* zero n bytes of a buffer */
    void (*memzero)(struct kiln_backend *be, void *p, size_t bytes);
    /* copies n activations to the host as f32 (waits for queued ops) */
    void (*read)(struct kiln_backend *be, float *dst, const void *src, size_t n);
    /* ids[i] = the first index of the largest value in row i of x (n rows
     * of width); waits for queued ops, like read */
    void (*argmax)(struct kiln_backend *be, int32_t *ids, const void *x, int n, int width);
    /* copies n f32 values from the host into an activation buffer */
    void (*write)(struct kiln_backend *be, void *dst, const float *src, size_t n);

    /* a model's shapes, once at load before any weight is read: -1 with err
     * naming what this backend cannot run (NULL: it runs every shape the
     * config parser accepts) */
    int (*check_model)(struct kiln_backend *be, const struct kiln_config *cfg, char *err, size_t errlen);
    /* weights, once at load: upload / convert / repack; 0 or -1 with err */
    int (*prepare_tensor)(struct kiln_backend *be, struct ktensor *t, char *err, size_t errlen);
    int (*prepare_linear)(struct kiln_backend *be, struct qlinear *w, char *err, size_t errlen);
    int (*prepare_rope)(struct kiln_backend *be, struct rope *r, char *err, size_t errlen);
    /* optional: the bytes of w its kernels read in one pass over it, where
     * its prepared form differs from the stored one (the CPU's 12-bit BF16);
     * NULL: the stored bytes (quant_linear_bytes) */
    int64_t (*linear_bytes)(struct kiln_backend *be, const struct qlinear *w);
    /* optional, once at load after prepare_linear: count linears that read
     * the same x (a layer's q, k, v), which the backend may store as one
     * (CUDA: one allocation, one prefill GEMM in matmul_multi); never
     * fails: what it cannot group stays as it was */
    void (*group_linears)(struct kiln_backend *be, struct qlinear *const *ws, int count);
    /* optional, once at load after prepare_linear: an MoE layer's experts
     * as a whole (CUDA: each kind kept 4-bit or widened, the pointer
     * tables uploaded); 0 or -1 with err */
    int (*prepare_moe)(struct kiln_backend *be, const struct moe_ffn *m, char *err, size_t errlen);
    void (*release_tensor)(struct kiln_backend *be, struct ktensor *t);
    void (*release_linear)(struct kiln_backend *be, struct qlinear *w);
    void (*release_rope)(struct kiln_backend *be, struct rope *r);

    /* a forward begins: the backend may copy ids, positions, page tables */
    int (*begin)(struct kiln_backend *be, const struct kiln_batch *b);
    /* after the forward's last op: -1 with err if an op since begin could
     * not run (its scratch memory could not be allocated), so this
     * forward's outputs are not valid; the backend stays usable (NULL:
     * ops never fail) */
    int (*error)(struct kiln_backend *be, char *err, size_t errlen);

    /* x[i] = table[tokens[i]] for the batch's tokens */
    void (*embed)(struct kiln_backend *be, void *x, const struct ktensor *table, const struct kiln_batch *b);
    /* out[i] = x[i] / rms(x[i]) * w, over n rows of dim */
    void (*rmsnorm)(struct kiln_backend *be, void *out, const void *x, const struct ktensor *w, int n, int dim, float eps);
    /* x += y, then out = rmsnorm(x) (the residual add fused with the next norm) */
    void (*add_rmsnorm)(struct kiln_backend *be, void *x, void *out, const void *y, const struct ktensor *w, int n, int dim,
                        float eps);
    /* out[n][n_out] = x[n][n_in] W^T + b */
    void (*matmul)(struct kiln_backend *be, void *out, const void *x, const struct qlinear *w, int n);
    /* optional (NULL: matmul per linear): outs[i] = x ws[i]^T + b_i for
     * count linears that read the same x (q/k/v, gate/up), as one op */
    void (*matmul_multi)(struct kiln_backend *be, void *const *outs, const void *x, const struct qlinear *const *ws, int count,
                         int n);
    /* per head: optional RMSNorm over head_dim (qn/kn NULL: none), then RoPE
     * at the batch positions; q and k updated in place */
    void (*qk_norm_rope)(struct kiln_backend *be, void *q, void *k, const struct ktensor *qn, const struct ktensor *kn,
                         const struct rope *rope, const struct kiln_batch *b, int n_head, int n_head_kv, int head_dim,
                         float eps);
    /* writes the batch's new k, v rows into the layer's pages */
    void (*kv_write)(struct kiln_backend *be, struct kv_cache *kv, int layer, const void *k, const void *v,
                     const struct kiln_batch *b);
    /* causal GQA attention of the batch's queries over each sequence's cache
     * (its n_past cached tokens plus its new ones, already written) */
    void (*attention)(struct kiln_backend *be, void *out, const void *q, const struct kv_cache *kv, int layer,
                      const struct kiln_batch *b, int n_head, float scale);
    /* out = silu(gate) * up, n rows of width ffn */
    void (*swiglu)(struct kiln_backend *be, void *out, const void *gate, const void *up, int n, int ffn);
    /* x += y over n elements */
    void (*add)(struct kiln_backend *be, void *x, const void *y, size_t n);
    /* out = MoE(x), n rows of dim */
    void (*moe)(struct kiln_backend *be, void *out, const void *x, const struct moe_ffn *m, int n, int dim);
    /* out[i] = x[rows[i]] */
    void (*gather_rows)(struct kiln_backend *be, void *out, const void *x, const int32_t *rows, int n_rows, int dim);

    void (*destroy)(struct kiln_backend *be);
};

/* Creates a backend by name ("cpu", "cuda"); NULL with err if unavailable.
 * n_threads <= 0 means all cores (CPU). */
struct kiln_backend *backend_create(const char *name, int n_threads, char *err, size_t errlen);

/* The best backend present: "cuda" when built with CUDA and a GPU answers,
 * else "cpu". */
const char *backend_default_name(void);

#endif
