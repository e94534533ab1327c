/*
 * quant.h: the quantized weight formats kiln reads, in one table, and their
 * reference dequantization (plain loops, used by the tests, by `kiln
 * quantize` and by the CPU kernels one chunk at a time; never to turn a whole
 * model into f32).
 *
 *   format         where            stored per linear (N = n_out, K = n_in)
 *   FP8 block      fp8.c            e4m3 [N][K], scale_inv [ceil(N/bn)][ceil(K/bk)]
 *   GPTQ v1/v2     gptq.c           qweight [K*b/32][N], qzeros [G][N*b/32], scales [G][N], g_idx [K]
 *   AWQ gemm       awq.c            qweight [K][N/8], qzeros [G][N/8], scales [G][N]
 *   GGUF blocks    quant.c (here)   [N][K / block elems] blocks: Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K
 *                                    Q5_K Q6_K IQ4_NL IQ4_XS
 *
 * GPTQ and AWQ are repacked once at load into one row-major "grouped int"
 * layout (struct qgrp, below) so the kernels read each output row
 * contiguously; FP8 and the GGUF blocks are computed on as stored, but for
 * Q4_0 and Q8_0 (and those GPTQ / AWQ rows) on x86 CPUs, which the CPU
 * backend copies into groups of 16 rows (backend/cpu/qmatmul_internal.h).
 */
#ifndef KILN_QUANT_H
#define KILN_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "format/config.h"
#include "format/dtype.h"
#include "model/weights.h"

/* ==== GGUF block types ==== */

struct quant_type {
    enum kiln_dtype dtype;
    const char *name;  /* "Q4_K" */
    int ggml_type;     /* GGML type id in GGUF files */
    int block_elems;   /* weights per block */
    int block_bytes;   /* bytes per block */
};

/* The row of the table for t (a block type or F32/F16/BF16), or NULL. */
const struct quant_type *quant_type_of(enum kiln_dtype t);
/* The row for a GGML type id, or NULL (unsupported type). */
const struct quant_type *quant_type_ggml(int ggml_type);
/* Bytes of n elements of t (n a multiple of its block for block types);
 * 0 if t is not a weight type. */
size_t quant_row_bytes(enum kiln_dtype t, int64_t n);

/* IQ4_NL / IQ4_XS: the 16 int8 values their 4-bit indices select, and
 * IQ4_XS's 6-bit scale of sub-block j (0..63, the weight's factor less 32)
 * of the superblock at b */
extern const int8_t quant_iq4_kv[16];
static inline int quant_iq4xs_scale(const uint8_t *b, int j) {
    return ((b[4 + j / 2] >> 4 * (j % 2)) & 15) | (((b[2] | b[3] << 8) >> 2 * j) & 3) << 4;
}

/* Q2_K / Q3_K: the 2-bit code of weight e (0..255) from a superblock's 64
 * code bytes qs (weight 128c + 32s + l at bits 2s of qs[32c + l]); Q3_K's
 * third bit of weight e from hmask (bit e / 32 of hmask[e % 32]) and its
 * 6-bit scale of sub-block j (0..15) from its 12 scale bytes sc */
static inline int quant_k23_code(const uint8_t *qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * (e / 32 % 4))) & 3; }
static inline int quant_q3k_hbit(const uint8_t *hmask, int e) { return (hmask[e % 32] >> (e / 32)) & 1; }
static inline int quant_q3k_scale(const uint8_t *sc, int j) { return ((sc[j % 8] >> (4 * (j / 8))) & 15) | ((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4; }

/* Dequantizes n elements (whole blocks) of row src (of type t: a block type
 * or F32/F16/BF16) into dst. */
void quant_dequant_row(enum kiln_dtype t, const void *src, float *dst, int64_t n);
/* Round-to-nearest quantization of n elements (whole blocks) into dst, for
 * t in Q8_0, Q4_0, Q4_1, Q4_K (what `kiln quantize` writes). 0 or -1. */
int quant_quantize_row(enum kiln_dtype t, const float *src, void *dst, int64_t n);

/* f32 -> FP8 e4m3fn, round to nearest even, saturating at +-448. */
uint8_t quant_f32_to_e4m3(float f);

/* ==== whole linears ==== */

/* Checks a bound quantized linear's tensors against its format's shape rules
 * (rank, shapes, dtypes, divisibility); `name` is the module for the error. */
int quant_check_linear(const struct qlinear *w, const char *name, char *err, size_t errlen);

/* Reference dequantization of the whole weight, out[n_out][n_in] (f32,
 * caller-allocated). For tests and `kiln quantize` only. */
void quant_dequant_linear(const struct qlinear *w, float *out);
/* The same values rounded to bf16 (nearest even), out[n_out][n_in]
 * (caller-allocated), row-parallel and without the f32 copy: for a backend
 * that computes in bf16 on formats it has no kernels for (CUDA). 0, or -1
 * with err (an act-order g_idx out of range). */
int quant_widen_bf16(const struct qlinear *w, uint16_t *out, char *err, size_t errlen);

/* Bytes a tensor occupies as stored (block-quantized rows included; 0
 * when it has no data). */
int64_t quant_tensor_bytes(const struct ktensor *t);
/* Bytes the linear's weight occupies as stored (weight, scales, zeros,
 * g_idx, bias). */
int64_t quant_linear_bytes(const struct qlinear *w);
/* A short label: "BF16", "FP8-b128x128", "GPTQ-int4-g128", "AWQ-int4-g128", "Q4_K". */
void quant_linear_label(const struct qlinear *w, char *buf, size_t len);

/* ==== the repacked GPTQ / AWQ layout the CPU kernels use ====
 *
 *   row n (K' = n_in, in the order given by perm):
 *     4-bit: chunks of 32 weights in 16 bytes, byte j = q[j] | q[j+16] << 4
 *     8-bit: one byte per weight
 *   group g covers permuted columns gstart[g] .. gstart[g+1]-1:
 *     W'[n][k] = sb[n][g][0] * q + sb[n][g][1]   (scale, offset = -scale * zero)
 *   x'[k] = x[perm[k]] (perm NULL when act-order is off).                    */
struct qgrp {
    int n_out, n_in, bits, n_group;
    int32_t *perm;   /* [n_in] or NULL */
    int32_t *gstart; /* [n_group + 1] */
    uint8_t *q;      /* [n_out][row_bytes] */
    size_t row_bytes;
    float *sb;       /* [n_out][n_group][2] */
};

/* Repacks a GPTQ or AWQ linear; 0, or -1 with err (a g_idx out of range). */
int qgrp_pack(struct qgrp *g, const struct qlinear *w, char *err, size_t errlen);
void qgrp_free(struct qgrp *g);
/* The unsigned code of permuted element k of row n. */
static inline int qgrp_code(const struct qgrp *g, int n, int k) {
    const uint8_t *r = g->q + (size_t)n * g->row_bytes;
    if (g->bits == 8) return r[k];
    int c = k >> 5, i = k & 31;
    return (r[c * 16 + (i & 15)] >> ((i >> 4) * 4)) & 15;
}

/* FP8 block: element (n, k) of the weight and its scale (format/fp8.c). */
float fp8_weight_scale(const struct qlinear *w, int n, int k);
/* GPTQ / AWQ: code, zero (true, v1 offset removed) and scale of (n, k). */
void gptq_element(const struct qlinear *w, int n, int k, int *q, int *z, float *s);
void awq_element(const struct qlinear *w, int n, int k, int *q, int *z, float *s);
/* AWQ's nibble order: output n of a packed word sits at bits 4 awq_inv[n % 8] */
extern const int awq_inv[8];
int gptq_check(const struct qlinear *w, const char *name, char *err, size_t errlen);
int awq_check(const struct qlinear *w, const char *name, char *err, size_t errlen);
int fp8_check(const struct qlinear *w, const char *name, char *err, size_t errlen);

/* A scalar read of a small tensor (scales) as f32. */
float quant_scalar(const struct ktensor *t, int64_t i);

/* Dummy quantized weights: fills w (n_out, n_in already set) with seeded
 * random codes and scales of the named format ("gptq-int4", "gptq-int8",
 * "awq", "fp8", "q8_0", "q4_0", "q4_k", ...), allocating through alloc(ctx,
 * bytes) (memory the model frees; NULL when out of memory, reported as an
 * error). std: the dequantized weights' spread. */
int quant_dummy_linear(struct qlinear *w, const char *fmt, int group, uint64_t seed, float std,
                       void *(*alloc)(void *ctx, size_t bytes), void *ctx, char *err, size_t errlen);
/* Is fmt a name quant_dummy_linear accepts? */
int quant_dummy_known(const char *fmt);

#endif
