/*
 * fp8.c: FP8 e4m3 weights with 2-D block scales, the layout of Qwen's -FP8
 * releases (quant_method "fp8", weight_block_size [128, 128]).
 *
 *   weight [N][K] F8_E4M3              weight_scale_inv [ceil(N/bn)][ceil(K/bk)] (BF16 or F32)
 *   +---------+---------+----+         +----+----+---+
 *   | blk 0,0 | blk 0,1 |0,2 |  128    | s00| s01|s02|
 *   +---------+---------+----+         +----+----+---+
 *   | blk 1,0 | blk 1,1 |1,2 |  128    | s10| s11|s12|
 *   +---------+---------+----+         +----+----+---+
 *   | 2,0 (partial rows)...  |  N%128
 *   +---------+---------+----+
 *       128       128   K%128   (edge blocks are partial, same scale rule)
 *
 *   W[n][k] = e4m3(weight[n][k]) * weight_scale_inv[n / bn][k / bk]
 *
 * Despite its name weight_scale_inv multiplies (transformers'
 * finegrained_fp8.py). e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa
 * bits, no infinities, 0x7F/0xFF NaN, largest finite 448.
 */
#include <stdio.h>

#include "base/base.h"
#include "format/quant.h"

float fp8_weight_scale(const struct qlinear *w, int n, int k) {
    const uint8_t *q = w->w.data;
    float s = quant_scalar(&w->scales, (int64_t)(n / w->block_n) * w->scales.cols + k / w->block_k);
    return kiln_fp8e4m3_to_f32(q[(size_t)n * w->n_in + k]) * s;
}

int fp8_check(const struct qlinear *w, const char *name, char *err, size_t errlen) {
    if (w->w.dtype != KILN_DTYPE_F8_E4M3)
        return kiln_errf(err, errlen, "%s.weight: dtype %s, expected F8_E4M3", name, dtype_name(w->w.dtype));
    if (w->block_n < 1 || w->block_k < 1) return kiln_errf(err, errlen, "%s: FP8 weight without a block size", name);
    int64_t bn = (w->n_out + w->block_n - 1) / w->block_n, bk = (w->n_in + w->block_k - 1) / w->block_k;
    if (!w->scales.data) return kiln_errf(err, errlen, "%s: FP8 weight without weight_scale_inv", name);
    if (w->scales.dtype != KILN_DTYPE_F32 && w->scales.dtype != KILN_DTYPE_BF16 && w->scales.dtype != KILN_DTYPE_F16)
        return kiln_errf(err, errlen, "%s.weight_scale_inv: dtype %s, expected BF16 or F32", name, dtype_name(w->scales.dtype));
    if (w->scales.rows != bn || w->scales.cols != bk)
        return kiln_errf(err, errlen, "%s.weight_scale_inv: shape [%lld, %lld], a [%d, %d] weight in %dx%d blocks needs [%lld, %lld]", name,
                         (long long)w->scales.rows, (long long)w->scales.cols, w->n_out, w->n_in, w->block_n, w->block_k, (long long)bn, (long long)bk);
    return 0;
}
