/*
 * attention.c: causal grouped-query attention over the paged KV cache, and
 * the write of new keys/values into their pages (layout in backend.h).
 *
 * Decomposition: one OpenMP work item per (query row, query head). Each
 * computes scores against every cached position of its sequence up to its
 * own (causal), a softmax in f32 (max-subtracted, as torch does), and the
 * weighted sum of values. Query head h reads KV head h / (n_head/n_head_kv).
 */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "base/base.h"

static inline float *kv_at(const struct kv_cache *kv, void *base, int page, int head, int slot) {
    return (float *)base + (((size_t)page * kv->n_head_kv + head) * kv->page_size + slot) * kv->head_dim;
}

void cpu_kv_write(struct kiln_backend *be, struct kv_cache *kv, int layer, const void *k_, const void *v_,
                  const struct kiln_batch *b) {
    (void)be;
    const float *k = k_, *v = v_;
    const int hd = kv->head_dim, nkv = kv->n_head_kv;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct kiln_seq_view *sq = &b->seqs[s];
#pragma omp parallel for schedule(static)
        for (int i = 0; i < sq->n; i++) {
            int t = sq->n_past + i, row = sq->start + i;
            int page = sq->pages[t / kv->page_size], slot = t % kv->page_size;
            for (int h = 0; h < nkv; h++) {
                memcpy(kv_at(kv, kv->k[layer], page, h, slot), k + ((size_t)row * nkv + h) * hd, (size_t)hd * 4);
                memcpy(kv_at(kv, kv->v[layer], page, h, slot), v + ((size_t)row * nkv + h) * hd, (size_t)hd * 4);
            }
        }
    }
}

void cpu_attention(struct kiln_backend *be, void *out_, const void *q_, const struct kv_cache *kv, int layer,
                   const struct kiln_batch *b, int n_head, float scale) {
    (void)be;
    float *out = out_;
    const float *q = q_;
    const int hd = kv->head_dim, nkv = kv->n_head_kv, group = n_head / nkv, P = kv->page_size;
    int max_len = 1;
    for (int s = 0; s < b->n_seqs; s++)
        if (b->seqs[s].n_past + b->seqs[s].n > max_len) max_len = b->seqs[s].n_past + b->seqs[s].n;

#pragma omp parallel
    {
        float *sc = kiln_malloc(sizeof(float) * (size_t)max_len);
        for (int s = 0; s < b->n_seqs; s++) {
            const struct kiln_seq_view *sq = &b->seqs[s];
#pragma omp for schedule(dynamic, 1) collapse(2)
            for (int i = 0; i < sq->n; i++)
                for (int h = 0; h < n_head; h++) {
                    int row = sq->start + i, len = sq->n_past + i + 1, kh = h / group;
                    const float *qh = q + ((size_t)row * n_head + h) * hd;
                    float mx = -FLT_MAX;
                    for (int t = 0; t < len; t++) {
                        const float *kt = kv_at(kv, kv->k[layer], sq->pages[t / P], kh, t % P);
                        float d = 0;
                        for (int j = 0; j < hd; j++) d += qh[j] * kt[j];
                        sc[t] = d * scale;
                        if (sc[t] > mx) mx = sc[t];
                    }
                    float sum = 0;
                    for (int t = 0; t < len; t++) {
                        sc[t] = expf(sc[t] - mx);
                        sum += sc[t];
                    }
                    float inv = 1.0f / sum;
                    float *o = out + ((size_t)row * n_head + h) * hd;
                    for (int j = 0; j < hd; j++) o[j] = 0;
                    for (int t = 0; t < len; t++) {
                        const float *vt = kv_at(kv, kv->v[layer], sq->pages[t / P], kh, t % P);
                        float p = sc[t] * inv;
                        for (int j = 0; j < hd; j++) o[j] += p * vt[j];
                    }
                }
        }
        free(sc);
    }
}
