/*
 * attention.c: causal grouped-query attention over the paged KV cache, and
 * the write of new keys/values into their pages (layout in backend.h).
 *
 * Decomposition: one work item per (query row, query head), handed out by
 * the worker pool (cpu.c) one at a time (later rows see more context). Each
 * computes scores against every cached position of its sequence up to its
 * own (causal), a softmax in f32 (max-subtracted, as torch does), and the
 * weighted sum of values. Query head h reads KV head h / (n_head/n_head_kv).
 *
 * The three inner loops walk the cache a page at a time (a page's keys of
 * one head are contiguous) and come in scalar, AVX2 and AVX-512 flavours
 * (cpu_isa()): scores (q . k for the page's keys; head_dim 128 keeps q in
 * registers), exp-and-sum over the scores (vector exp, simd.h), and the
 * p-weighted sum of the page's values accumulated in registers.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/simd.h"
#include "base/base.h"

static inline float *kv_at(const struct kv_cache *kv, void *base, int page, int head, int slot) {
    return (float *)base + (((size_t)page * kv->n_head_kv + head) * kv->page_size + slot) * kv->head_dim;
}

/* a plain copy (memory bound, a few MB at most per layer): on the caller */
void cpu_kv_write(struct kiln_backend *be, struct kv_cache *kv, int layer, const void *k_, const void *v_,
                  const struct kiln_batch *b) {
    (void)be;
    const float *k = k_, *v = v_;
    const int hd = kv->head_dim, nkv = kv->n_head_kv;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct kiln_seq_view *sq = &b->seqs[s];
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

/* ==== inner loops: scores, exp-sum, p.V ==== */

/* sc[j] = scale * q . k[j] for nk keys of hd floats, contiguous */
typedef void (*qk_fn)(const float *q, const float *k, int nk, int hd, float scale, float *sc);
/* sc[j] = exp(sc[j] - mx) for j < n; returns their sum */
typedef float (*expsum_fn)(float *sc, int n, float mx);
/* o[0..hd) += sum_j p[j] * v[j] for nk values of hd floats, contiguous */
typedef void (*pv_fn)(float *o, const float *p, const float *v, int nk, int hd);

static void qk_scalar(const float *q, const float *k, int nk, int hd, float scale, float *sc) {
    for (int j = 0; j < nk; j++, k += hd) {
        float d = 0;
        for (int i = 0; i < hd; i++) d += q[i] * k[i];
        sc[j] = d * scale;
    }
}

static float expsum_scalar(float *sc, int n, float mx) {
    float sum = 0;
    for (int t = 0; t < n; t++) {
        sc[t] = expf(sc[t] - mx);
        sum += sc[t];
    }
    return sum;
}

static void pv_scalar(float *o, const float *p, const float *v, int nk, int hd) {
    for (int j = 0; j < nk; j++, v += hd)
        for (int i = 0; i < hd; i++) o[i] += p[j] * v[i];
}

KILN_AVX2 static void qk_avx2(const float *q, const float *k, int nk, int hd, float scale, float *sc) {
    if (hd == 128) {
        __m256 qv[16];
        for (int i = 0; i < 16; i++) qv[i] = _mm256_loadu_ps(q + 8 * i);
        for (int j = 0; j < nk; j++, k += 128) {
            __m256 a0 = _mm256_mul_ps(qv[0], _mm256_loadu_ps(k)), a1 = _mm256_mul_ps(qv[1], _mm256_loadu_ps(k + 8));
            for (int i = 2; i < 16; i += 2) {
                a0 = _mm256_fmadd_ps(qv[i], _mm256_loadu_ps(k + 8 * i), a0);
                a1 = _mm256_fmadd_ps(qv[i + 1], _mm256_loadu_ps(k + 8 * i + 8), a1);
            }
            sc[j] = kiln_hsum8(_mm256_add_ps(a0, a1)) * scale;
        }
        return;
    }
    for (int j = 0; j < nk; j++, k += hd) {
        __m256 a = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= hd; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), a);
        float d = kiln_hsum8(a);
        for (; i < hd; i++) d += q[i] * k[i];
        sc[j] = d * scale;
    }
}

KILN_AVX2 static float expsum_avx2(float *sc, int n, float mx) {
    __m256 m = _mm256_set1_ps(mx), s = _mm256_setzero_ps();
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 e = kiln_exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + t), m));
        _mm256_storeu_ps(sc + t, e);
        s = _mm256_add_ps(s, e);
    }
    float sum = kiln_hsum8(s);
    if (t < n) {
        float tmp[8] = {0};
        for (int i = t; i < n; i++) tmp[i - t] = sc[i] - mx;
        __m256 e = kiln_exp8(_mm256_loadu_ps(tmp));
        _mm256_storeu_ps(tmp, e);
        for (int i = t; i < n; i++) sc[i] = tmp[i - t], sum += tmp[i - t];
    }
    return sum;
}

KILN_AVX2 static void pv_avx2(float *o, const float *p, const float *v, int nk, int hd) {
    if (hd == 128) {
        __m256 a[16];
        for (int i = 0; i < 16; i++) a[i] = _mm256_loadu_ps(o + 8 * i);
        for (int j = 0; j < nk; j++, v += 128) {
            __m256 pj = _mm256_set1_ps(p[j]);
            for (int i = 0; i < 16; i++) a[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * i), a[i]);
        }
        for (int i = 0; i < 16; i++) _mm256_storeu_ps(o + 8 * i, a[i]);
        return;
    }
    for (int j = 0; j < nk; j++, v += hd) {
        __m256 pj = _mm256_set1_ps(p[j]);
        int i = 0;
        for (; i + 8 <= hd; i += 8) _mm256_storeu_ps(o + i, _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + i), _mm256_loadu_ps(o + i)));
        for (; i < hd; i++) o[i] += p[j] * v[i];
    }
}

KILN_AVX512 static void qk_avx512(const float *q, const float *k, int nk, int hd, float scale, float *sc) {
    if (hd == 128) {
        __m512 qv[8];
        for (int i = 0; i < 8; i++) qv[i] = _mm512_loadu_ps(q + 16 * i);
        for (int j = 0; j < nk; j++, k += 128) {
            __m512 a0 = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k)), a1 = _mm512_mul_ps(qv[1], _mm512_loadu_ps(k + 16));
            for (int i = 2; i < 8; i += 2) {
                a0 = _mm512_fmadd_ps(qv[i], _mm512_loadu_ps(k + 16 * i), a0);
                a1 = _mm512_fmadd_ps(qv[i + 1], _mm512_loadu_ps(k + 16 * i + 16), a1);
            }
            sc[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) * scale;
        }
        return;
    }
    for (int j = 0; j < nk; j++, k += hd) {
        __m512 a = _mm512_setzero_ps();
        for (int i = 0; i < hd; i += 16) {
            __mmask16 m = hd - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - i)) - 1);
            a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i), _mm512_maskz_loadu_ps(m, k + i), a);
        }
        sc[j] = _mm512_reduce_add_ps(a) * scale;
    }
}

KILN_AVX512 static float expsum_avx512(float *sc, int n, float mx) {
    __m512 m = _mm512_set1_ps(mx), s = _mm512_setzero_ps();
    for (int t = 0; t < n; t += 16) {
        __mmask16 k = n - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - t)) - 1);
        __m512 e = kiln_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sc + t), m));
        _mm512_mask_storeu_ps(sc + t, k, e);
        s = _mm512_mask_add_ps(s, k, s, e);
    }
    return _mm512_reduce_add_ps(s);
}

KILN_AVX512 static void pv_avx512(float *o, const float *p, const float *v, int nk, int hd) {
    if (hd == 128) {
        __m512 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm512_loadu_ps(o + 16 * i);
        for (int j = 0; j < nk; j++, v += 128) {
            __m512 pj = _mm512_set1_ps(p[j]);
            for (int i = 0; i < 8; i++) a[i] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + 16 * i), a[i]);
        }
        for (int i = 0; i < 8; i++) _mm512_storeu_ps(o + 16 * i, a[i]);
        return;
    }
    for (int j = 0; j < nk; j++, v += hd) {
        __m512 pj = _mm512_set1_ps(p[j]);
        for (int i = 0; i < hd; i += 16) {
            __mmask16 m = hd - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - i)) - 1);
            _mm512_mask_storeu_ps(o + i, m, _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(m, v + i), _mm512_maskz_loadu_ps(m, o + i)));
        }
    }
}

struct att_job {
    float *out, *sc; /* sc: one score row of sc_len floats per thread */
    const float *q;
    const struct kv_cache *kv;
    const struct kiln_batch *b;
    const int32_t *row_seq; /* batch row -> its sequence */
    int layer, n_head, group, sc_len;
    float scale;
    qk_fn qk;
    expsum_fn expsum;
    pv_fn pv;
};

/* items are (batch row, query head), row-major */
static void att_items(void *arg, int64_t b0, int64_t e0, int tid) {
    const struct att_job *j = arg;
    const struct kv_cache *kv = j->kv;
    const int hd = kv->head_dim, nkv = kv->n_head_kv, P = kv->page_size, n_head = j->n_head;
    const size_t page_stride = (size_t)P * hd; /* one head's page */
    float *sc = j->sc + (size_t)tid * j->sc_len;
    for (int64_t it = b0; it < e0; it++) {
        int row = (int)(it / n_head), h = (int)(it % n_head);
        if (j->row_seq[row] < 0) continue; /* a row of no sequence */
        const struct kiln_seq_view *sq = &j->b->seqs[j->row_seq[row]];
        int len = sq->n_past + (row - sq->start) + 1, kh = h / j->group;
        const float *qh = j->q + ((size_t)row * n_head + h) * hd;
        for (int t0 = 0; t0 < len; t0 += P) {
            const float *kp = (const float *)kv->k[j->layer] + ((size_t)sq->pages[t0 / P] * nkv + kh) * page_stride;
            j->qk(qh, kp, len - t0 < P ? len - t0 : P, hd, j->scale, sc + t0);
        }
        float mx = -FLT_MAX;
        for (int t = 0; t < len; t++)
            if (sc[t] > mx) mx = sc[t];
        float inv = 1.0f / j->expsum(sc, len, mx);
        for (int t = 0; t < len; t++) sc[t] *= inv;
        float *o = j->out + ((size_t)row * n_head + h) * hd;
        for (int d = 0; d < hd; d++) o[d] = 0;
        for (int t0 = 0; t0 < len; t0 += P) {
            const float *vp = (const float *)kv->v[j->layer] + ((size_t)sq->pages[t0 / P] * nkv + kh) * page_stride;
            j->pv(o, sc + t0, vp, len - t0 < P ? len - t0 : P, hd);
        }
    }
}

void cpu_attention(struct kiln_backend *be, void *out, const void *q, const struct kv_cache *kv, int layer,
                   const struct kiln_batch *b, int n_head, float scale) {
    int max_len = 1;
    int64_t work = 0; /* about rows x heads x context x head_dim multiply-adds, twice */
    int32_t *row_seq = kiln_malloc(sizeof(int32_t) * (size_t)(b->n_tokens > 0 ? b->n_tokens : 1));
    for (int i = 0; i < b->n_tokens; i++) row_seq[i] = -1;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct kiln_seq_view *sq = &b->seqs[s];
        if (sq->n_past + sq->n > max_len) max_len = sq->n_past + sq->n;
        for (int i = 0; i < sq->n; i++) row_seq[sq->start + i] = s;
        work += (int64_t)sq->n * n_head * (sq->n_past + sq->n) * kv->head_dim;
    }
    const int isa = cpu_isa(), nth = cpu_n_threads(be);
    struct att_job j = {.out = out, .q = q, .kv = kv, .b = b, .row_seq = row_seq, .layer = layer, .n_head = n_head,
                        .group = n_head / kv->n_head_kv, .sc_len = (max_len + 31) & ~31, .scale = scale};
    j.qk = isa == CPU_ISA_AVX512 ? qk_avx512 : isa == CPU_ISA_AVX2 ? qk_avx2 : qk_scalar;
    j.expsum = isa == CPU_ISA_AVX512 ? expsum_avx512 : isa == CPU_ISA_AVX2 ? expsum_avx2 : expsum_scalar;
    j.pv = isa == CPU_ISA_AVX512 ? pv_avx512 : isa == CPU_ISA_AVX2 ? pv_avx2 : pv_scalar;
    j.sc = kiln_malloc(sizeof(float) * (size_t)j.sc_len * nth);
    int64_t items = (int64_t)b->n_tokens * n_head;
    cpu_parallel_for(be, items, work >= 65536 ? 1 : items, att_items, &j);
    free(j.sc);
    free(row_seq);
}
