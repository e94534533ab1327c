/*
 * awq.c: AWQ checkpoints (AutoAWQ, version "gemm"): 4-bit, true zero
 * points, packed along N with an interleaved nibble order.
 *
 *   qweight I32 [K][N/8]   qzeros I32 [G][N/8]   scales F16 [G][N]   (G = K / group_size)
 *
 *   one word covers logical columns 8c .. 8c+7:
 *     bits:   31..28 27..24 23..20 19..16 15..12 11..8  7..4   3..0
 *     column: 8c+7   8c+5   8c+3   8c+1   8c+6   8c+4   8c+2   8c+0
 *   i.e. nibble i holds column 8c + AWQ_ORDER[i], AWQ_ORDER = [0,2,4,6,1,3,5,7],
 *   and column 8c + j sits in nibble AWQ_INV[j], AWQ_INV = [0,4,1,5,2,6,3,7].
 *
 *   W[n][k] = scales[k/gs][n] * (q(k, n) - z(k/gs, n))     (no -1 offset, unlike GPTQ v1)
 */
#include <stdio.h>

#include "base/base.h"
#include "format/quant.h"

const int awq_inv[8] = {0, 4, 1, 5, 2, 6, 3, 7};

void awq_element(const struct qlinear *w, int n, int k, int *q, int *z, float *s) {
    const int N = w->n_out, g = k / w->group, sh = 4 * awq_inv[n & 7];
    const uint32_t *qw = w->w.data, *qz = w->zeros.data;
    *q = (int)(qw[(size_t)k * (N / 8) + n / 8] >> sh) & 15;
    *z = (int)(qz[(size_t)g * (N / 8) + n / 8] >> sh) & 15;
    *s = quant_scalar(&w->scales, (int64_t)g * N + n);
}

int awq_check(const struct qlinear *w, const char *name, char *err, size_t errlen) {
    const int N = w->n_out, K = w->n_in;
    if (w->bits != 4) return kiln_errf(err, errlen, "%s: AWQ bits %d not supported", name, w->bits);
    if (N % 8) return kiln_errf(err, errlen, "%s: AWQ needs out features (%d) divisible by 8", name, N);
    if (K % w->group) return kiln_errf(err, errlen, "%s: AWQ needs in features (%d) divisible by group_size %d", name, K, w->group);
    int G = K / w->group;
    if (w->w.dtype != KILN_DTYPE_I32 || w->w.rows != K || w->w.cols != N / 8)
        return kiln_errf(err, errlen, "%s.qweight: %s [%lld, %lld], expected I32 [%d, %d]", name, dtype_name(w->w.dtype), (long long)w->w.rows,
                         (long long)w->w.cols, K, N / 8);
    if (w->zeros.dtype != KILN_DTYPE_I32 || w->zeros.rows != G || w->zeros.cols != N / 8)
        return kiln_errf(err, errlen, "%s.qzeros: %s [%lld, %lld], expected I32 [%d, %d]", name, dtype_name(w->zeros.dtype),
                         (long long)w->zeros.rows, (long long)w->zeros.cols, G, N / 8);
    if ((w->scales.dtype != KILN_DTYPE_F16 && w->scales.dtype != KILN_DTYPE_BF16 && w->scales.dtype != KILN_DTYPE_F32) || w->scales.rows != G ||
        w->scales.cols != N)
        return kiln_errf(err, errlen, "%s.scales: %s [%lld, %lld], expected F16/BF16 [%d, %d]", name, dtype_name(w->scales.dtype),
                         (long long)w->scales.rows, (long long)w->scales.cols, G, N);
    return 0;
}
