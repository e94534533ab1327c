/*
 * weights.h: how a model's weights are held, independent of architecture.
 *
 * A ktensor is one stored tensor (a norm vector, the embedding table); a
 * qlinear is one linear layer y = x W^T + b with W of shape (n_out, n_in)
 * in whatever format the checkpoint stores it. Host data points into the
 * mmap'd checkpoint (or into memory the dummy builder owns); `be` is the
 * backend's prepared form (a device copy, a repacked layout), set once at
 * load by backend->prepare_*.
 */
#ifndef KILN_WEIGHTS_H
#define KILN_WEIGHTS_H

#include <stdint.h>

#include "format/dtype.h"

struct ktensor {
    enum kiln_dtype dtype;
    int64_t rows, cols; /* a vector has rows == 1 */
    const void *data;   /* host bytes, row-major */
    void *be;           /* backend copy (device pointer, f32 copy, ...) */
};

/* How a linear layer's weight is stored. Dense formats keep W in w.dtype. */
enum kiln_wfmt {
    KILN_WFMT_DENSE = 0, /* w: (n_out, n_in) in F32 / F16 / BF16 */
};

struct qlinear {
    int n_out, n_in;
    enum kiln_wfmt fmt;
    struct ktensor w;    /* dense: (n_out, n_in) */
    struct ktensor bias; /* (n_out) or data == NULL */
    void *be;            /* backend's prepared form, or NULL */
};

/* The sparse MoE FFN of one layer (Qwen3-MoE):
 *   p = softmax(router(x)); top-k of p; renormalise if norm_topk;
 *   y = sum_e p_e * down_e(silu(gate_e(x)) * up_e(x))                      */
struct moe_ffn {
    int n_expert, n_used, ffn, norm_topk;
    struct qlinear router;                /* (n_expert, dim) */
    struct qlinear *gate, *up, *down;     /* [n_expert]: (ffn, dim), (ffn, dim), (dim, ffn) */
};

/* Rotary embedding as transformers computes it: for pair i of a head,
 * angle = pos * inv_freq[i]; q' = q*cos + rotate_half(q)*sin, both times
 * attn_factor (1 except YaRN). Pairs are (i, i + head_dim/2). */
struct rope {
    int n_freq;       /* head_dim / 2 */
    float *inv_freq;  /* [n_freq], host */
    float attn_factor;
    void *be;         /* backend copy of inv_freq */
};

#endif
