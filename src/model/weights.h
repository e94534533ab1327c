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

/* How a linear layer's weight is stored. Dense formats keep W in w.dtype.
 * The layouts are drawn in src/format/{fp8,gptq,awq,gguf}.c and listed in
 * format/quant.h. */
enum kiln_wfmt {
    KILN_WFMT_DENSE = 0, /* w: (n_out, n_in) in F32 / F16 / BF16 */
    KILN_WFMT_FP8,       /* w: (n_out, n_in) F8_E4M3; scales: (ceil(n_out/bn), ceil(n_in/bk)) F32/BF16 */
    KILN_WFMT_GPTQ,      /* w: qweight I32 (n_in*bits/32, n_out); zeros: qzeros I32 (G, n_out*bits/32);
                            scales: (G, n_out) F16/BF16/F32; g_idx: I32 (n_in) or absent */
    KILN_WFMT_AWQ,       /* w: qweight I32 (n_in, n_out/8); zeros: qzeros I32 (G, n_out/8); scales: (G, n_out) */
    KILN_WFMT_GGUF,      /* w: (n_out, n_in / block elems) blocks of w.dtype (KILN_DTYPE_Q8_0, ...) */
};

struct qlinear {
    int n_out, n_in;
    enum kiln_wfmt fmt;
    struct ktensor w;      /* dense: (n_out, n_in); quantized: the packed weight as stored */
    struct ktensor bias;   /* (n_out) or data == NULL */
    struct ktensor scales; /* FP8 weight_scale_inv, GPTQ/AWQ scales; else data == NULL */
    struct ktensor zeros;  /* GPTQ/AWQ qzeros */
    struct ktensor g_idx;  /* GPTQ g_idx (act-order), data == NULL when trivial */
    int bits;              /* GPTQ/AWQ: 4 or 8 */
    int group;             /* GPTQ/AWQ group size along n_in (n_in for per-channel) */
    int block_n, block_k;  /* FP8 scale block (128 x 128) */
    int zero_plus1;        /* GPTQ v1: stored zeros are z - 1 */
    void *be;              /* backend's prepared form, or NULL */
    int repacked;          /* set by the backend's prepare: it computes on its own copy and never reads w, scales, zeros, g_idx again */
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
