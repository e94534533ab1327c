/*
 * gptq.c: GPTQ checkpoints (AutoGPTQ / GPTQModel), checkpoint_format "gptq"
 * (v1) and "gptq_v2", 4 and 8 bits; and the row-major repacking (struct
 * qgrp) that both GPTQ and AWQ are turned into once at load.
 *
 * Per linear (K = in_features, N = out_features, b = bits, p = 32/b, G =
 * ceil(K / group_size), one group when group_size is -1):
 *
 *   qweight I32 [K/p][N]   packs along K, LSB first:
 *      word (r, n) = | k=rp+p-1 | ... | k=rp+1 | k=rp |   (b bits each, k=rp in bits 0..b-1)
 *   qzeros  I32 [G][N/p]   packs along N, LSB first: word (g, c) holds n = cp .. cp+p-1
 *   scales  F16 [G][N]
 *   g_idx   I32 [K]        group of input channel k (act-order: not monotonic)
 *
 *   W[n][k] = scales[g][n] * (q(k, n) - z(g, n)),  g = g_idx[k]
 *   v1 stores z - 1 (AutoGPTQ's `zeros -= 1`, then the reader does
 *   (stored + 1) & (2^b - 1)); v2 stores z. Symmetric 4-bit: z = 8 (v1 word
 *   0x77777777); 8-bit: z = 128.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "format/quant.h"

static inline uint32_t word(const struct ktensor *t, int64_t i) { return ((const uint32_t *)t->data)[i]; }

void gptq_element(const struct qlinear *w, int n, int k, int *q, int *z, float *s) {
    const int b = w->bits, p = 32 / b, mask = (1 << b) - 1, N = w->n_out;
    int g = w->g_idx.data ? (int)word(&w->g_idx, k) : k / w->group;
    *q = (int)(word(&w->w, (int64_t)(k / p) * N + n) >> (b * (k % p))) & mask;
    int zs = (int)(word(&w->zeros, (int64_t)g * (N / p) + n / p) >> (b * (n % p))) & mask;
    *z = w->zero_plus1 ? (zs + 1) & mask : zs;
    *s = quant_scalar(&w->scales, (int64_t)g * N + n);
}

int gptq_check(const struct qlinear *w, const char *name, char *err, size_t errlen) {
    const int b = w->bits, N = w->n_out, K = w->n_in;
    if (b != 4 && b != 8) return kiln_errf(err, errlen, "%s: GPTQ bits %d not supported", name, b);
    const int p = 32 / b;
    if (K % p || N % p) return kiln_errf(err, errlen, "%s: GPTQ %d-bit needs in (%d) and out (%d) features divisible by %d", name, b, K, N, p);
    int G = (K + w->group - 1) / w->group;
    if (w->w.dtype != KILN_DTYPE_I32 || w->w.rows != K / p || w->w.cols != N)
        return kiln_errf(err, errlen, "%s.qweight: %s [%lld, %lld], expected I32 [%d, %d]", name, dtype_name(w->w.dtype), (long long)w->w.rows,
                         (long long)w->w.cols, K / p, N);
    if (w->zeros.dtype != KILN_DTYPE_I32 || w->zeros.rows != G || w->zeros.cols != N / p)
        return kiln_errf(err, errlen, "%s.qzeros: %s [%lld, %lld], expected I32 [%d, %d] (group_size %d)", name, dtype_name(w->zeros.dtype),
                         (long long)w->zeros.rows, (long long)w->zeros.cols, G, N / p, w->group);
    if ((w->scales.dtype != KILN_DTYPE_F16 && w->scales.dtype != KILN_DTYPE_BF16 && w->scales.dtype != KILN_DTYPE_F32) || w->scales.rows != G ||
        w->scales.cols != N)
        return kiln_errf(err, errlen, "%s.scales: %s [%lld, %lld], expected F16/BF16/F32 [%d, %d]", name, dtype_name(w->scales.dtype),
                         (long long)w->scales.rows, (long long)w->scales.cols, G, N);
    if (w->g_idx.data) {
        if (w->g_idx.dtype != KILN_DTYPE_I32 || w->g_idx.rows * w->g_idx.cols != K)
            return kiln_errf(err, errlen, "%s.g_idx: %s with %lld elements, expected I32 [%d]", name, dtype_name(w->g_idx.dtype),
                             (long long)(w->g_idx.rows * w->g_idx.cols), K);
        for (int k = 0; k < K; k++)
            if (word(&w->g_idx, k) >= (uint32_t)G)
                return kiln_errf(err, errlen, "%s.g_idx[%d] = %d is not a group below %d", name, k, (int)word(&w->g_idx, k), G);
    }
    return 0;
}

/* ==== the repacked layout (see quant.h) ==== */

int qgrp_pack(struct qgrp *g, const struct qlinear *w, char *err, size_t errlen) {
    const int N = w->n_out, K = w->n_in, G = (K + w->group - 1) / w->group;
    memset(g, 0, sizeof *g);
    g->n_out = N, g->n_in = K, g->bits = w->bits, g->n_group = G;
    /* act-order: sort input channels by group (stable) so each group is a
     * contiguous run; the kernel permutes x the same way */
    int32_t *grp = kiln_malloc(sizeof(int32_t) * (size_t)K);
    int trivial = 1;
    for (int k = 0; k < K; k++) {
        grp[k] = w->g_idx.data ? (int32_t)word(&w->g_idx, k) : k / w->group;
        if (grp[k] != k / w->group) trivial = 0;
    }
    g->gstart = kiln_calloc((size_t)G + 1, sizeof(int32_t));
    for (int k = 0; k < K; k++) g->gstart[grp[k] + 1]++;
    for (int i = 0; i < G; i++) g->gstart[i + 1] += g->gstart[i];
    if (!trivial) {
        int32_t *fill = kiln_malloc(sizeof(int32_t) * (size_t)G);
        memcpy(fill, g->gstart, sizeof(int32_t) * (size_t)G);
        g->perm = kiln_malloc(sizeof(int32_t) * (size_t)K);
        for (int k = 0; k < K; k++) g->perm[fill[grp[k]]++] = k;
        free(fill);
    }
    g->row_bytes = w->bits == 8 ? (size_t)K : (size_t)((K + 31) / 32) * 16;
    g->q = kiln_calloc((size_t)N, g->row_bytes);
    g->sb = kiln_malloc(sizeof(float) * 2 * (size_t)N * G);
    const int awq = w->fmt == KILN_WFMT_AWQ, b = w->bits, pf = 32 / b, mask = (1 << b) - 1;
    const uint32_t *qw = w->w.data;
    /* 16 rows at a time, so that a stored word of codes (GPTQ: 32/b columns
     * of one row; AWQ: 8 rows of one column) is read from a cache line its
     * neighbouring rows use too; the code of (n, k) by one shift of a word
     * found once per column, scale and zero once per row and group (through
     * gptq_element / awq_element, as before) */
#pragma omp parallel for schedule(static)
    for (int n0 = 0; n0 < N; n0 += 16) {
        const int n1 = n0 + 16 < N ? n0 + 16 : N;
        for (int j = 0; j < K; j++) {
            const int k = g->perm ? g->perm[j] : j, gg = grp[k], first = j == 0 || grp[g->perm ? g->perm[j - 1] : j - 1] != gg;
            const uint32_t *row = awq ? qw + (size_t)k * (N / 8) : qw + (size_t)(k / pf) * N;
            const int sh = awq ? 0 : b * (k % pf);
            for (int n = n0; n < n1; n++) {
                const int q = awq ? (int)(row[n / 8] >> (4 * awq_inv[n & 7])) & 15 : (int)(row[n] >> sh) & mask;
                uint8_t *r = g->q + (size_t)n * g->row_bytes;
                if (b == 8) r[j] = (uint8_t)q;
                else r[(j >> 5) * 16 + (j & 15)] |= (uint8_t)(q << (((j & 31) >> 4) * 4));
                if (first) {
                    int q2, z;
                    float s;
                    if (awq) awq_element(w, n, k, &q2, &z, &s);
                    else gptq_element(w, n, k, &q2, &z, &s);
                    float *sb = g->sb + ((size_t)n * G + gg) * 2;
                    sb[0] = s, sb[1] = -s * (float)z;
                }
            }
        }
    }
    free(grp);
    (void)err, (void)errlen;
    return 0;
}

void qgrp_free(struct qgrp *g) {
    free(g->perm), free(g->gstart), free(g->q), free(g->sb);
    memset(g, 0, sizeof *g);
}
