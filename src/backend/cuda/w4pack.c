/*
 * w4pack.c: GPTQ / AWQ int4 and GGUF Q4_0 linears into the CUDA backend's
 * 4-bit layout (w4pack.h). GPTQ and AWQ come through qgrp_pack (format/
 * gptq.c: their codes in row order, act-order columns sorted by group,
 * per group s and -s z); Q4_0's blocks already hold one group of 32 with
 * its codes in the same byte order (byte j: code j low, code j + 16 high).
 */
#include "backend/cuda/w4pack.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "format/quant.h"

/* the linear as rows of 16-byte chunks of 32 codes with a scale and zero per group */
struct src {
    int N, K, G;
    const uint8_t *base; /* chunk c of row n at base + n * row_bytes + c * stride + skip */
    size_t row_bytes, stride, skip;
    const float *sb;     /* qgrp: [N][n_group][2] = (s, -s z); NULL for Q4_0 (d at the block's start, z = 8) */
    int n_group;
};

static int f16_exact(float s) { return kiln_f16_to_f32(kiln_f32_to_f16(s)) == s; }
static int bf16_exact(float s) { return kiln_bf16_to_f32(kiln_f32_to_bf16(s)) == s; }

/* the word of 8 codes at columns k0 .. k0 + 7 of row n (k0 % 8 == 0): code
 * j at bits (j & 1) * 16 + (j >> 1) * 4 */
static uint32_t code_word(const struct src *s, int n, int k0) {
    const uint8_t *c = s->base + (size_t)n * s->row_bytes + (size_t)(k0 / 32) * s->stride + s->skip;
    const int i0 = k0 & 31, sh = i0 >= 16 ? 4 : 0;
    uint32_t w = 0;
    for (int j = 0; j < 8; j++) w |= (uint32_t)((c[(i0 & 15) + j] >> sh) & 15) << ((j & 1) * 16 + (j >> 1) * 4);
    return w;
}

static void scale_zero(const struct src *s, int n, int gi, float *sc, int *z) {
    if (!s->sb) {
        const uint8_t *b = s->base + (size_t)n * s->row_bytes + (size_t)gi * s->stride;
        *sc = kiln_f16_to_f32((uint16_t)(b[0] | b[1] << 8)), *z = 8;
        return;
    }
    const float *p = s->sb + ((size_t)n * s->n_group + gi) * 2;
    *sc = p[0];
    *z = p[0] != 0.f ? (int)lrintf(-p[1] / p[0]) : 8;
}

static void layout(struct w4_pack *p, const struct src *s) {
    const int tiles = (s->N + 15) / 16, nkb = (s->K + 127) / 128, ng = (nkb * 128 + s->G - 1) / s->G;
    p->nkb = nkb, p->ng = ng, p->n_out = s->N, p->n_in = s->K;
    p->q_bytes = (size_t)tiles * nkb * 1024, p->sc_words = (size_t)tiles * ng * 16;
    p->q = kiln_calloc(p->q_bytes, 1);
    p->sc = kiln_calloc(p->sc_words, 4);
    int gsh = 0;
    while ((32 << gsh) < s->G) gsh++;
    p->gsh = gsh;
#pragma omp parallel for schedule(static)
    for (int T = 0; T < tiles; T++) {
        for (int h = 0; h < 16 && 16 * T + h < s->N; h++) {
            const int n = 16 * T + h, g = h & 7, half = h >> 3;
            for (int k0 = 0; k0 < s->K; k0 += 8) { /* lane (g, t), word u of block b */
                const int b = k0 / 128, u = (k0 / 32) & 3, t = (k0 / 8) & 3;
                const uint32_t w = code_word(s, n, k0);
                memcpy(p->q + ((size_t)T * nkb + b) * 1024 + (size_t)(4 * g + t) * 32 + half * 16 + u * 4, &w, 4);
            }
            for (int gi = 0; gi * s->G < s->K; gi++) {
                float sv;
                int z;
                scale_zero(s, n, gi, &sv, &z);
                const uint16_t sbits = p->sbf ? kiln_f32_to_bf16(sv) : kiln_f32_to_f16(sv);
                p->sc[w4_sc_index(p, T, gi * s->G / 128, (gi * s->G / 32) & 3, h)] = sbits | (uint32_t)kiln_f32_to_bf16(128.f + (float)z) << 16;
            }
        }
    }
}

int w4_pack(struct w4_pack *p, const struct qlinear *w, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    const int N = w->n_out, K = w->n_in;
    if (K % 32) return 0;
    struct src s = {N, K, 0, NULL, 0, 0, 0, NULL, 0};
    if (w->fmt == KILN_WFMT_GGUF && w->w.dtype == KILN_DTYPE_Q4_0) {
        s.base = w->w.data, s.G = 32, s.row_bytes = (size_t)(K / 32) * 18, s.stride = 18, s.skip = 2;
        layout(p, &s);
        return 1;
    }
    if ((w->fmt != KILN_WFMT_GPTQ && w->fmt != KILN_WFMT_AWQ) || w->bits != 4) return 0;
    struct qgrp g;
    if (qgrp_pack(&g, w, err, errlen)) return -1;
    /* groups: equal runs of a power of two times 32 columns, or the whole row */
    const int G = g.n_group > 1 ? g.gstart[1] : K;
    int ok = G % 32 == 0 && (g.n_group == 1 || ((G / 32) & (G / 32 - 1)) == 0);
    for (int i = 0; ok && i < g.n_group; i++) ok = g.gstart[i] == i * G;
    /* scales: f16 or bf16 in the layout; f32 checkpoints' scales that are
     * neither exactly leave the linear to the bf16 path */
    int all16 = 1, all_bf = 1;
    for (size_t i = 0; ok && i < (size_t)N * g.n_group; i++) all16 &= f16_exact(g.sb[2 * i]), all_bf &= bf16_exact(g.sb[2 * i]);
    if (!ok || !(all16 || all_bf)) {
        qgrp_free(&g);
        return 0;
    }
    p->sbf = !all16;
    s.base = g.q, s.row_bytes = g.row_bytes, s.stride = 16, s.sb = g.sb, s.n_group = g.n_group;
    s.G = g.n_group == 1 ? (K + 127) / 128 * 256 : G; /* per channel: one group over the padded row */
    layout(p, &s);
    p->perm = g.perm, g.perm = NULL;
    qgrp_free(&g);
    return 1;
}

void w4_pack_free(struct w4_pack *p) {
    free(p->q), free(p->sc), free(p->perm);
    memset(p, 0, sizeof *p);
}

float w4_pack_weight(const struct w4_pack *p, int n, int k) {
    const int T = n / 16, h = n % 16, g = h & 7, half = h >> 3, b = k / 128, u = (k / 32) & 3, t = (k / 8) & 3, j = k & 7;
    uint32_t w;
    memcpy(&w, p->q + ((size_t)T * p->nkb + b) * 1024 + (size_t)(4 * g + t) * 32 + half * 16 + u * 4, 4);
    const int q = (int)((w >> ((j & 1) * 16 + (j >> 1) * 4)) & 15);
    const uint32_t sw = p->sc[w4_sc_index(p, T, b, u, h)];
    const float s = p->sbf ? kiln_bf16_to_f32((uint16_t)sw) : kiln_f16_to_f32((uint16_t)sw);
    const float z = kiln_bf16_to_f32((uint16_t)(sw >> 16)) - 128.f;
    return s * ((float)q - z);
}
