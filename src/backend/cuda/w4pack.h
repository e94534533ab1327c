/*
 * w4pack.h: the layout in which the CUDA backend keeps 4-bit weights
 * (GPTQ / AWQ int4, GGUF Q4_0; qgemm.cu reads it), built on the host at
 * load. Plain C, so that the CPU tests check it in every build.
 *
 * Every such format is w[n][k] = s[n][g] (q[n][k] - z[n][g]) with 4-bit
 * codes q and per group g of G columns (a power of two times 32, or the
 * whole row) a scale s and a zero point z; in act-order GPTQ checkpoints k
 * runs over the columns sorted by group (perm[k] is the original column;
 * x is permuted the same way).
 *
 *   q:  [tile of 16 rows][block of 128 columns][lane 0..31][row g, g + 8][4 words]
 *       lane = 4 g + t holds, for rows 16 T + g and 16 T + g + 8, word u of
 *       each: the 8 codes of columns 128 b + 32 u + 8 t + j (j = 0..7),
 *       code j = 2 i at bits 4 i, code 2 i + 1 at bits 16 + 4 i (i = 0..3)
 *   sc: 32-bit words, the scale (f16, or bf16 when the checkpoint's scales
 *       are bf16 values that f16 cannot hold) in the low half, 128 + z as
 *       bf16 in the high half; [tile][group][16 rows], but for groups of 32
 *       columns [tile][block][16 rows][4 groups], so that a lane reads the
 *       four of its row in one 16-byte load (w4_sc_index)
 *
 * Rows are padded to 16 with codes and scales 0, columns to 128 with codes
 * 0 (and scales 0, but for a per-channel group, which spans the padding:
 * the kernels multiply padding columns only with zeros).
 */
#ifndef KILN_W4PACK_H
#define KILN_W4PACK_H

#include <stddef.h>
#include <stdint.h>

#include "model/weights.h"

struct w4_pack {
    uint8_t *q;       /* the codes, q_bytes */
    uint32_t *sc;     /* scales and zeros, sc_words */
    int32_t *perm;    /* [n_in] act-order column order, or NULL */
    size_t q_bytes, sc_words;
    int n_out, n_in, nkb, ng; /* 128-column blocks per row, groups per tile */
    int gsh, sbf;     /* log2 of 32-column chunks per group; scales are bf16 */
};

/* w in the layout: 1, or 0 when w is not a format or group shape the
 * layout takes (nothing allocated), or -1 with err */
int w4_pack(struct w4_pack *p, const struct qlinear *w, char *err, size_t errlen);
void w4_pack_free(struct w4_pack *p);
/* where sc holds the word of row h of tile T for chunk u of column block b
 * (ng groups per tile, gsh as in struct w4_pack); a macro, so that the
 * kernels (qgemm.cu) index the same layout */
#define W4_SC_INDEX(T, ng, gsh, b, u, h)                                                                  \
    ((gsh) == 0 ? ((size_t)(T) * (ng) + 4 * (size_t)(b)) * 16 + 4 * (size_t)(h) + (size_t)(u)            \
                : ((size_t)(T) * (ng) + (size_t)(((b) * 4 + (u)) >> (gsh))) * 16 + (size_t)(h))
static inline size_t w4_sc_index(const struct w4_pack *p, int T, int b, int u, int h) {
    return W4_SC_INDEX(T, p->ng, p->gsh, b, u, h);
}
/* the weight at row n, column k of the layout's column order, s (q - z),
 * read back as the kernel reads it (tests) */
float w4_pack_weight(const struct w4_pack *p, int n, int k);

#endif
