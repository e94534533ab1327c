/*
 * attention.c: causal grouped-query attention over the paged KV cache, and
 * the write of new keys/values into their pages (layout in backend.h).
 *
 * Query head h reads KV head h / G (G = n_head / n_head_kv). The G query
 * heads of one KV head are always handled together, so a sequence's keys
 * and values of one KV head are read once for all of them. Two paths:
 *
 * Tiled (prefill and chunks: n >= 2 new tokens, n * G >= 4 rows), in the
 * manner of flash attention. A sequence's query rows of one KV head are
 * numbered r = i * G + g (position i, head g: position-major, so a run of
 * rows covers consecutive positions) and cut into blocks of QB rows, one
 * work item each; a block is cut into subtiles of L rows, the vector lanes
 * (32 on AVX-512, 16 otherwise). Inside a subtile the rows are in the lanes
 * ("transposed"): Q^T [hd][L] (pre-scaled), scores S^T [BK][L], the
 * accumulator O^T [hd][L]. Per key tile of BK keys (row pointers gathered
 * across pages), per subtile that still sees a key of the tile:
 *
 *   qk:      S^T[j][:] = sum_d K[j][d] Q^T[d][:]; AVX-512: blocks of 12 keys
 *            x 32 lanes (24 zmm accumulators); per d, 2 vector loads of Q^T,
 *            one broadcast per key, 24 FMAs: no horizontal sums, any hd
 *   softmax: online, per lane: causal mask (key t > the row's position:
 *            p = 0), m' = max(m, max_j S), alpha = exp(m - m'),
 *            P = exp(S - m'), l = alpha l + sum_j P (vector exp, simd.h)
 *   pv:      O^T[d][:] = alpha O^T[d][:] + sum_j V[j][d] P[j][:]; blocks of
 *            12 dims x 32 lanes, alpha applied as the accumulators load
 *
 * and at the end O = O^T / l goes back to the rows. Each K/V page is thus
 * read from memory once per block of QB rows and reused from L1/L2 by every
 * subtile, instead of once per (row, head); the next key tile is prefetched
 * while one is computed. A subtile stops at its last row's position
 * (causal), so the diagonal costs at most one partly masked tile.
 *
 * Rows (decode: one new token): one work item per (row, run of adjacent KV
 * heads; all of them unless that leaves threads idle): page by page, the
 * scores of each head's G query heads (q . k, head_dim 128 keeps q in
 * registers), an exact max-subtracted softmax per head (as torch), then
 * page by page the p-weighted sums of values (accumulated in registers).
 * A page stays in L1 across the G heads; a run of heads reads one
 * contiguous block per page (a page holds its heads side by side), and the
 * next page is prefetched (pages are scattered: the hardware prefetcher
 * restarts at each).
 *
 * Work items of both kinds go to the worker pool (cpu.c) one at a time,
 * longest first (cost ~ rows x keys), so the long causal blocks start first
 * and the short ones fill in at the end.
 *
 * Every kernel comes in scalar, AVX2 and AVX-512 flavours (cpu_isa()); they
 * differ only in the order of f32 sums (and the vector exp, ~1-2 ulp).
 * cpu_attention_ref is the plain reference the tests hold them to: the row
 * path with scalar loops, for every row.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/simd.h"
#include "format/quant.h"
#include "base/base.h"

/* ==== the cache's rows: F32, F16 / BF16, or Q8_0 (--kv-dtype) ====
 *
 * The kernels below read f32 rows. A cache of 16-bit rows holds half the
 * bytes (what decode at long contexts streams), a Q8_0 cache 17/64 of them
 * (blocks of 32 int8 q with an f16 scale d: backend.h); their rows are
 * widened on the way in (exact: d * q has at most 19 significant bits), in
 * registers by the row kernels, into the thread's scratch otherwise (a page
 * at a time on the generic row path, a key tile at a time on the tiled
 * path, reused there by every subtile). kv_write rounds 16-bit rows to
 * nearest even and quantizes Q8_0 rows as `kiln quantize` does (d = max|x|
 * / 127, q = x / d to nearest even: quant_quantize_row, to the byte). The
 * same f32 kernels then see the same numbers as an F32 cache holding the
 * stored values: the tests check that bit for bit. */

static inline size_t kv_rowb(const struct kv_cache *kv) { return kv_row_bytes(kv->dtype, kv->head_dim); }

static inline char *kv_at(const struct kv_cache *kv, void *base, int page, int head, int slot) {
    return (char *)base + (((size_t)page * kv->n_head_kv + head) * kv->page_size + slot) * kv_rowb(kv);
}

static void narrow_scalar(uint16_t *dst, const float *src, size_t n, enum kiln_dtype t) {
    for (size_t i = 0; i < n; i++) dst[i] = t == KILN_DTYPE_F16 ? kiln_f32_to_f16(src[i]) : kiln_f32_to_bf16(src[i]);
}

#if defined(KILN_X86)
KILN_AVX2 static void narrow_avx2(uint16_t *dst, const float *src, size_t n, enum kiln_dtype t) {
    size_t i = 0;
    if (t == KILN_DTYPE_F16)
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    narrow_scalar(dst + i, src + i, n - i, t); /* BF16: the scalar rounding (kiln_f32_to_bf16) */
}

/* n f32 values (whole blocks) to Q8_0 blocks, the bytes quant_quantize_row
 * writes: the same f32 division, cvtps's round to nearest even for lrintf */
KILN_AVX2 static void q8_store_avx2(uint8_t *b, const float *x, size_t n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t o = 0; o < n; o += 32, b += 34, x += 32) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int c = 0; c < 4; c++) v[c] = _mm256_loadu_ps(x + 8 * c), m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[c]));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float d = _mm_cvtss_f32(h) / 127;
        const uint16_t dh = kiln_f32_to_f16(d);
        memcpy(b, &dh, 2);
        if (!(d > 0)) {
            memset(b + 2, 0, 32);
            continue;
        }
        const __m256 dv = _mm256_set1_ps(d);
        __m256i q[4];
        for (int c = 0; c < 4; c++) q[c] = _mm256_cvtps_epi32(_mm256_div_ps(v[c], dv));
        /* packs work within 128-bit lanes: the dwords come out as 0 2 4 6 1 3 5 7 */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(b + 2), _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
}

/* n values (whole blocks) of Q8_0 blocks to f32: d * q, exact (below,
 * with the row kernels' loads) */
KILN_AVX2 static void q8_widen_avx2(float *y, const uint8_t *b, size_t n);
#endif

#if defined(KILN_NEON)
static void widen_neon(float *dst, const uint16_t *src, size_t n, enum kiln_dtype t) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, t == KILN_DTYPE_F16 ? kiln_f16x4(src + i) : kiln_bf16x4(src + i));
    kiln_widen16(dst + i, src + i, n - i, t == KILN_DTYPE_F16, 0);
}

/* q8_widen_avx2's and q8_store_avx2's NEON twins (the same values, the same
 * bytes): the row path widens every page it reads on NEON, so a scalar loop
 * here would cost more than the bytes it saves */
static void q8_widen_neon(float *y, const uint8_t *b, size_t n) {
    for (size_t o = 0; o < n; o += 32, b += 34, y += 32) {
        uint16_t dh;
        memcpy(&dh, b, 2);
        const float d = kiln_f16_to_f32(dh);
        for (int c = 0; c < 32; c += 8) {
            const int16x8_t w = vmovl_s8(vld1_s8((const int8_t *)b + 2 + c));
            vst1q_f32(y + c, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), d));
            vst1q_f32(y + c + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), d));
        }
    }
}

static void q8_store_neon(uint8_t *b, const float *x, size_t n) {
    for (size_t o = 0; o < n; o += 32, b += 34, x += 32) {
        float32x4_t v[8], m = vdupq_n_f32(0);
        for (int c = 0; c < 8; c++) v[c] = vld1q_f32(x + 4 * c), m = vmaxq_f32(m, vabsq_f32(v[c]));
        const float d = vmaxvq_f32(m) / 127;
        const uint16_t dh = kiln_f32_to_f16(d);
        memcpy(b, &dh, 2);
        if (!(d > 0)) {
            memset(b + 2, 0, 32);
            continue;
        }
        const float32x4_t dv = vdupq_n_f32(d);
        for (int c = 0; c < 8; c += 2) { /* x / d to nearest even (lrintf), narrowed without saturation: |q| <= 127 */
            const int32x4_t q0 = vcvtnq_s32_f32(vdivq_f32(v[c], dv)), q1 = vcvtnq_s32_f32(vdivq_f32(v[c + 1], dv));
            vst1_s8((int8_t *)b + 2 + 4 * c, vmovn_s16(vcombine_s16(vmovn_s32(q0), vmovn_s32(q1))));
        }
    }
}
#endif

/* n values of cache rows (16-bit, or whole Q8_0 blocks) to f32 (exact), in the ISA's way */
static void kv_widen(float *dst, const void *src, size_t n, enum kiln_dtype t, int isa) {
    if (t == KILN_DTYPE_Q8_0) {
#if defined(KILN_X86)
        if (isa >= CPU_ISA_AVX2) {
            q8_widen_avx2(dst, src, n);
            return;
        }
#elif defined(KILN_NEON)
        if (isa >= CPU_ISA_NEON) {
            q8_widen_neon(dst, src, n);
            return;
        }
#endif
        quant_dequant_row(KILN_DTYPE_Q8_0, src, dst, (int64_t)n);
        return;
    }
#if defined(KILN_X86)
    if (isa >= CPU_ISA_AVX2) {
        kiln_widen16(dst, src, n, t == KILN_DTYPE_F16, 1);
        return;
    }
#elif defined(KILN_NEON)
    if (isa >= CPU_ISA_NEON) {
        widen_neon(dst, src, n, t);
        return;
    }
#endif
    (void)isa;
    kiln_widen16(dst, src, n, t == KILN_DTYPE_F16, 0);
}

/* n f32 values into a cache row of dtype t (F32: a copy) */
static void kv_store(void *dst, const float *src, size_t n, enum kiln_dtype t, int isa) {
    if (t == KILN_DTYPE_F32) {
        memcpy(dst, src, n * 4);
        return;
    }
#if defined(KILN_X86)
    if (isa >= CPU_ISA_AVX2) {
        if (t == KILN_DTYPE_Q8_0) q8_store_avx2(dst, src, n);
        else narrow_avx2(dst, src, n, t);
        return;
    }
#elif defined(KILN_NEON)
    if (isa >= CPU_ISA_NEON && t == KILN_DTYPE_Q8_0) {
        q8_store_neon(dst, src, n);
        return;
    }
#endif
    (void)isa;
    if (t == KILN_DTYPE_Q8_0) quant_quantize_row(KILN_DTYPE_Q8_0, src, dst, (int64_t)n);
    else narrow_scalar(dst, src, n, t);
}

/* a copy, a rounding or a quantization per row (a few MB at most per layer): on the caller */
void cpu_kv_write(struct kiln_backend *be, struct kv_cache *kv, int layer, const void *k_, const void *v_,
                  const struct kiln_batch *b) {
    (void)be;
    const float *k = k_, *v = v_;
    const int hd = kv->head_dim, nkv = kv->n_head_kv, isa = cpu_isa();
    for (int s = 0; s < b->n_seqs; s++) {
        const struct kiln_seq_view *sq = &b->seqs[s];
        for (int i = 0; i < sq->n; i++) {
            int t = sq->n_past + i, row = sq->start + i;
            int page = sq->pages[t / kv->page_size], slot = t % kv->page_size;
            for (int h = 0; h < nkv; h++) {
                kv_store(kv_at(kv, kv->k[layer], page, h, slot), k + ((size_t)row * nkv + h) * hd, (size_t)hd, kv->dtype, isa);
                kv_store(kv_at(kv, kv->v[layer], page, h, slot), v + ((size_t)row * nkv + h) * hd, (size_t)hd, kv->dtype, isa);
            }
        }
    }
}

/* ==== row path inner loops: scores, exp-sum, p.V ==== */

/* sc[j] = scale * q . k[j] for nk keys of hd floats, contiguous */
typedef void (*qk_fn)(const float *q, const float *k, int nk, int hd, float scale, float *sc);
/* sc[j] = exp(sc[j] - mx) for j < n; returns their sum */
typedef float (*expsum_fn)(float *sc, int n, float mx);
/* o[0..hd) += sum_j p[j] * v[j] for nk values of hd floats, contiguous */
typedef void (*pv_fn)(float *o, const float *p, const float *v, int nk, int hd);
/* the same two at head_dim HD = 64 or 128 on the cache's rows (F32, or
 * F16 / BF16 widened in registers), for the ng query heads of a KV group at
 * once: q head g at q + HD g with its scores at sc + sl g; its output at
 * o + HD g with its probabilities at p + sl g. Each row is loaded (and widened) once
 * for all ng heads; a head's sums do not depend on ng or the row type.
 * nx: the block read next, prefetched row by row into L1 (or NULL); far:
 * a block further along the thread's stream, row by row into L2 (or NULL). */
typedef void (*qkg_fn)(const float *q, int ng, const void *k, int nk, float scale, float *sc, size_t sl, const void *nx,
                         const void *far);
typedef void (*pvg_fn)(float *o, const float *p, int ng, size_t sl, const void *v, int nk, const void *nx, const void *far);

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

#if defined(KILN_X86)
/* The head_dim 64 and 128 loops of the row path (qkg_fn, pvg_fn), one body for
 * every row type the cache holds: f32 rows, or 16-bit rows whose loads of 8
 * (AVX2) or 16 (AVX-512) values are widened in registers (F16: vcvtph2ps;
 * BF16: zero-extend and shift), or Q8_0 rows (int8 sign-extended, converted,
 * times the block's scale, broadcast from f16 once per block of 32), so a
 * page is read once at its stored bytes and its sums are the f32 rows' to
 * the bit. t is a constant in each caller (the bodies are inlined). Other
 * head sizes take qk_fn / pv_fn.
 * Head_dim 64 (Qwen2.5-0.5B, Llama-3.2-1B) took those until the
 * thirty-eighth session: a page widened into scratch and each query head
 * on its own, 5-7 GB/s of K and V on two Zen 4 cores against ~16-28 now. */
enum { KV_F32 = 0, KV_F16, KV_BF16, KV_Q8 };
#define KV_INLINE static inline __attribute__((always_inline))

/* bytes of a row of HD values of type t, and row j of a page block */
KV_INLINE size_t row_b(int t, int HD) { return t == KV_F32 ? 4 * (size_t)HD : t == KV_Q8 ? (size_t)HD / 32 * 34 : 2 * (size_t)HD; }
KV_INLINE const char *kv_row(const void *blk, int j, int t, int HD) { return (const char *)blk + (size_t)j * row_b(t, HD); }

/* values i .. i + 7 (i + 15) of a row as f32; a Q8_0 chunk never crosses its block */
KV_INLINE KILN_AVX2 __m256 ld8_kv(const char *row, int i, int t) {
    if (t == KV_F32) return _mm256_loadu_ps((const float *)row + i);
    if (t == KV_Q8) {
        const char *b = row + 34 * (i / 32);
        short dh; /* the block's scale (2-byte aligned at best) */
        memcpy(&dh, b, 2);
        const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16(dh));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + i % 32)))), d);
    }
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    return t == KV_F16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

KILN_AVX2 static void q8_widen_avx2(float *y, const uint8_t *b, size_t n) {
    for (size_t o = 0; o < n; o += 32, b += 34, y += 32)
        for (int c = 0; c < 4; c++) _mm256_storeu_ps(y + 8 * c, ld8_kv((const char *)b, 8 * c, KV_Q8));
}

KV_INLINE KILN_AVX512 __m512 ld16_kv(const char *row, int i, int t) {
    if (t == KV_F32) return _mm512_loadu_ps((const float *)row + i);
    if (t == KV_Q8) {
        const char *b = row + 34 * (i / 32);
        short dh;
        memcpy(&dh, b, 2);
        const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(dh));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2 + i % 32)))), d);
    }
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    return t == KV_F16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The grouped loops behind qkg_fn / pvg_fn: GQ query heads of a KV
 * group per pass over a page's rows, up to 4 on AVX2 and 8 on AVX-512
 * (its 32 registers hold 8 heads' accumulators; a group of more heads
 * takes several passes), each key or value chunk loaded (and widened)
 * once for all of them. Per head, whatever GQ is: scores (head_dim 128) from two
 * accumulators over alternate chunks (a multiply, then FMAs in chunk
 * order), one horizontal sum, times scale, or (head_dim 64) qk_avx2's /
 * qk_avx512's one accumulator in chunk order, so 64-wide heads kept their
 * bits when they moved here; outputs accumulate p[j] v[j] over j in order (a pass
 * covers S chunks of the head for all GQ heads, so accumulators and chunks
 * fit in the registers). nx: the block the caller reads next (the next
 * head of the run, or the next page's first), or NULL; row j of it is
 * prefetched while row j of this one is read, one block (4 KB at 16 keys)
 * ahead of use, as a plain stream would be: the hardware prefetcher alone
 * fed these loops ~5 GB/s a core, against ~9 with it (one AVX2 core, F16
 * rows from DRAM). far: row j of the same head's block some pages further
 * along the thread's stream (far_block), into L2: a thread's stream is
 * runs of a page's heads with the other threads' runs between them, and
 * the L1 lead alone left two Zen 4 cores at ~18 GB/s of F16 rows against
 * ~28 with both (docs/cpu.md, "pages ahead into L2"). */
KV_INLINE void pf_row(const void *nx, const void *far, int j, int t, int HD) {
    const size_t o = (size_t)j * row_b(t, HD);
    const int lines = (int)((row_b(t, HD) + 63) / 64); /* a row's 64-byte lines (Q8_0 rows of 136 or 68 bytes: the
                                                          next row's first line covers the rest) */
    if (far)
        for (int l = 0; l < lines; l++) _mm_prefetch((const char *)far + o + 64 * l, _MM_HINT_T1);
    if (nx)
        for (int l = 0; l < lines; l++) _mm_prefetch((const char *)nx + o + 64 * l, _MM_HINT_T0);
}

KV_INLINE KILN_AVX2 void qk128g_avx2(const float *q, const void *k, int nk, float scale, float *sc, size_t sl, int t, int GQ,
                                     const void *nx, const void *far) {
    for (int j = 0; j < nk; j++) {
        const char *kr = kv_row(k, j, t, 128);
        if (nx || far) pf_row(nx, far, j, t, 128);
        __m256 a0[8], a1[8]; /* GQ <= 4 here (8: the size the macros' dead cases compile with) */
        const __m256 k0 = ld8_kv(kr, 0, t), k1 = ld8_kv(kr, 8, t);
#pragma GCC unroll 4
        for (int g = 0; g < GQ; g++)
            a0[g] = _mm256_mul_ps(_mm256_loadu_ps(q + 128 * g), k0), a1[g] = _mm256_mul_ps(_mm256_loadu_ps(q + 128 * g + 8), k1);
#pragma GCC unroll 7
        for (int i = 2; i < 16; i += 2) {
            const __m256 ka = ld8_kv(kr, 8 * i, t), kb = ld8_kv(kr, 8 * i + 8, t);
#pragma GCC unroll 4
            for (int g = 0; g < GQ; g++) {
                a0[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + 128 * g + 8 * i), ka, a0[g]);
                a1[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + 128 * g + 8 * i + 8), kb, a1[g]);
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < GQ; g++) sc[sl * g + j] = kiln_hsum8(_mm256_add_ps(a0[g], a1[g])) * scale;
    }
}

KV_INLINE KILN_AVX2 void pvg_avx2(float *o, const float *p, size_t sl, const void *v, int nk, int t, int GQ, const void *nx, const void *far,
                                  int HD) {
    enum { SMAX = 4 };
    const int S = GQ <= 2 ? 4 : 2; /* chunks of 8 per pass: GQ S accumulators + S chunks + 1 broadcast <= 13 */
    for (int c0 = 0; c0 < HD / 8; c0 += S) {
        __m256 a[8][SMAX];
#pragma GCC unroll 4
        for (int g = 0; g < GQ; g++)
#pragma GCC unroll 4
            for (int c = 0; c < S; c++) a[g][c] = _mm256_loadu_ps(o + HD * g + 8 * (c0 + c));
        for (int j = 0; j < nk; j++) {
            if ((nx || far) && c0 == 0) pf_row(nx, far, j, t, HD);
            __m256 vv[SMAX];
            const char *vr = kv_row(v, j, t, HD);
#pragma GCC unroll 4
            for (int c = 0; c < S; c++) vv[c] = ld8_kv(vr, 8 * (c0 + c), t);
#pragma GCC unroll 4
            for (int g = 0; g < GQ; g++) {
                const __m256 pj = _mm256_set1_ps(p[sl * g + j]);
#pragma GCC unroll 4
                for (int c = 0; c < S; c++) a[g][c] = _mm256_fmadd_ps(pj, vv[c], a[g][c]);
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < GQ; g++)
#pragma GCC unroll 4
            for (int c = 0; c < S; c++) _mm256_storeu_ps(o + HD * g + 8 * (c0 + c), a[g][c]);
    }
}

KV_INLINE KILN_AVX512 void qk128g_avx512(const float *q, const void *k, int nk, float scale, float *sc, size_t sl, int t, int GQ,
                                         const void *nx, const void *far) {
    for (int j = 0; j < nk; j++) {
        const char *kr = kv_row(k, j, t, 128);
        if (nx || far) pf_row(nx, far, j, t, 128);
        __m512 a0[8], a1[8];
        const __m512 k0 = ld16_kv(kr, 0, t), k1 = ld16_kv(kr, 16, t);
#pragma GCC unroll 8
        for (int g = 0; g < GQ; g++)
            a0[g] = _mm512_mul_ps(_mm512_loadu_ps(q + 128 * g), k0), a1[g] = _mm512_mul_ps(_mm512_loadu_ps(q + 128 * g + 16), k1);
#pragma GCC unroll 3
        for (int i = 2; i < 8; i += 2) {
            const __m512 ka = ld16_kv(kr, 16 * i, t), kb = ld16_kv(kr, 16 * i + 16, t);
#pragma GCC unroll 8
            for (int g = 0; g < GQ; g++) {
                a0[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + 128 * g + 16 * i), ka, a0[g]);
                a1[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + 128 * g + 16 * i + 16), kb, a1[g]);
            }
        }
#pragma GCC unroll 8
        for (int g = 0; g < GQ; g++) sc[sl * g + j] = _mm512_reduce_add_ps(_mm512_add_ps(a0[g], a1[g])) * scale;
    }
}

KV_INLINE KILN_AVX512 void pvg_avx512(float *o, const float *p, size_t sl, const void *v, int nk, int t, int GQ, const void *nx, const void *far,
                                      int HD) {
    enum { SMAX = 4 };
    const int S = GQ <= 4 ? 4 : 2; /* chunks of 16 per pass: GQ S accumulators + S chunks + 1 broadcast <= 21 of 32 registers */
    for (int c0 = 0; c0 < HD / 16; c0 += S) {
        __m512 a[8][SMAX];
#pragma GCC unroll 8
        for (int g = 0; g < GQ; g++)
#pragma GCC unroll 4
            for (int c = 0; c < S; c++) a[g][c] = _mm512_loadu_ps(o + HD * g + 16 * (c0 + c));
        for (int j = 0; j < nk; j++) {
            if ((nx || far) && c0 == 0) pf_row(nx, far, j, t, HD);
            __m512 vv[SMAX];
            const char *vr = kv_row(v, j, t, HD);
#pragma GCC unroll 4
            for (int c = 0; c < S; c++) vv[c] = ld16_kv(vr, 16 * (c0 + c), t);
#pragma GCC unroll 8
            for (int g = 0; g < GQ; g++) {
                const __m512 pj = _mm512_set1_ps(p[sl * g + j]);
#pragma GCC unroll 4
                for (int c = 0; c < S; c++) a[g][c] = _mm512_fmadd_ps(pj, vv[c], a[g][c]);
            }
        }
#pragma GCC unroll 8
        for (int g = 0; g < GQ; g++)
#pragma GCC unroll 4
            for (int c = 0; c < S; c++) _mm512_storeu_ps(o + HD * g + 16 * (c0 + c), a[g][c]);
    }
}

/* head_dim 64: the one-accumulator order of qk_avx2 / qk_avx512 (the
 * generic loops these replace there), so a 64-wide head's scores keep
 * their bits; each key row is loaded (and widened) once for the GQ heads */
KV_INLINE KILN_AVX2 void qk64g_avx2(const float *q, const void *k, int nk, float scale, float *sc, size_t sl, int t, int GQ,
                                    const void *nx, const void *far) {
    for (int j = 0; j < nk; j++) {
        const char *kr = kv_row(k, j, t, 64);
        if (nx || far) pf_row(nx, far, j, t, 64);
        __m256 kk[8], a[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) kk[i] = ld8_kv(kr, 8 * i, t);
#pragma GCC unroll 4
        for (int g = 0; g < GQ; g++) {
            a[g] = _mm256_setzero_ps();
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) a[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + 64 * g + 8 * i), kk[i], a[g]);
        }
#pragma GCC unroll 4
        for (int g = 0; g < GQ; g++) sc[sl * g + j] = kiln_hsum8(a[g]) * scale;
    }
}

KV_INLINE KILN_AVX512 void qk64g_avx512(const float *q, const void *k, int nk, float scale, float *sc, size_t sl, int t, int GQ,
                                        const void *nx, const void *far) {
    for (int j = 0; j < nk; j++) {
        const char *kr = kv_row(k, j, t, 64);
        if (nx || far) pf_row(nx, far, j, t, 64);
        __m512 kk[4], a[8];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) kk[i] = ld16_kv(kr, 16 * i, t);
#pragma GCC unroll 8
        for (int g = 0; g < GQ; g++) {
            a[g] = _mm512_setzero_ps();
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) a[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + 64 * g + 16 * i), kk[i], a[g]);
        }
#pragma GCC unroll 8
        for (int g = 0; g < GQ; g++) sc[sl * g + j] = _mm512_reduce_add_ps(a[g]) * scale;
    }
}

/* the head_dim-HD row kernels of the table (qkg_fn, pvg_fn; HD 64 or 128),
 * one per row type: a group's heads MG at a time (4 on AVX2, 8 on
 * AVX-512), the constant GQ of each call unrolled; with MG 4 the cases
 * past 4 are dead code the compiler drops (the bodies' arrays hold 8 so
 * that they compile) */
#define QKG(NAME, ISA, BODY, T, HD, MG)                                                                                   \
    ISA static void NAME(const float *q, int ng, const void *k, int nk, float scale, float *sc, size_t sl,               \
                         const void *nx, const void *far) {                                                              \
        for (int g = 0; g < ng; g += MG, q += MG * HD, sc += MG * sl, nx = far = NULL) switch (ng - g < MG ? ng - g : MG) { \
            case 1: BODY(q, k, nk, scale, sc, sl, T, 1, nx, far); break;                                                 \
            case 2: BODY(q, k, nk, scale, sc, sl, T, 2, nx, far); break;                                                 \
            case 3: BODY(q, k, nk, scale, sc, sl, T, 3, nx, far); break;                                                 \
            case 4: BODY(q, k, nk, scale, sc, sl, T, 4, nx, far); break;                                                 \
            case 5: if (MG > 4) BODY(q, k, nk, scale, sc, sl, T, 5, nx, far); break;                                     \
            case 6: if (MG > 4) BODY(q, k, nk, scale, sc, sl, T, 6, nx, far); break;                                     \
            case 7: if (MG > 4) BODY(q, k, nk, scale, sc, sl, T, 7, nx, far); break;                                     \
            default: if (MG > 4) BODY(q, k, nk, scale, sc, sl, T, 8, nx, far); break;                                    \
            }                                                                                                            \
    }
#define PVG(NAME, ISA, BODY, T, HD, MG)                                                                                   \
    ISA static void NAME(float *o, const float *p, int ng, size_t sl, const void *v, int nk, const void *nx,            \
                         const void *far) {                                                                              \
        for (int g = 0; g < ng; g += MG, o += MG * HD, p += MG * sl, nx = far = NULL) switch (ng - g < MG ? ng - g : MG) { \
            case 1: BODY(o, p, sl, v, nk, T, 1, nx, far, HD); break;                                                     \
            case 2: BODY(o, p, sl, v, nk, T, 2, nx, far, HD); break;                                                     \
            case 3: BODY(o, p, sl, v, nk, T, 3, nx, far, HD); break;                                                     \
            case 4: BODY(o, p, sl, v, nk, T, 4, nx, far, HD); break;                                                     \
            case 5: if (MG > 4) BODY(o, p, sl, v, nk, T, 5, nx, far, HD); break;                                         \
            case 6: if (MG > 4) BODY(o, p, sl, v, nk, T, 6, nx, far, HD); break;                                         \
            case 7: if (MG > 4) BODY(o, p, sl, v, nk, T, 7, nx, far, HD); break;                                         \
            default: if (MG > 4) BODY(o, p, sl, v, nk, T, 8, nx, far, HD); break;                                        \
            }                                                                                                            \
    }
/* the kernels of one head size and instruction set, for each row type */
#define KV_ROWS(HD, SFX, ISA, QKBODY, PVBODY, MG)                                                                             \
    QKG(qk##HD##_f32_##SFX, ISA, QKBODY, KV_F32, HD, MG)                                                                      \
    QKG(qk##HD##_f16_##SFX, ISA, QKBODY, KV_F16, HD, MG)                                                                      \
    QKG(qk##HD##_bf16_##SFX, ISA, QKBODY, KV_BF16, HD, MG)                                                                    \
    PVG(pv##HD##_f32_##SFX, ISA, PVBODY, KV_F32, HD, MG)                                                                      \
    PVG(pv##HD##_f16_##SFX, ISA, PVBODY, KV_F16, HD, MG)                                                                      \
    PVG(pv##HD##_bf16_##SFX, ISA, PVBODY, KV_BF16, HD, MG)                                                                    \
    QKG(qk##HD##_q8_##SFX, ISA, QKBODY, KV_Q8, HD, MG)                                                                        \
    PVG(pv##HD##_q8_##SFX, ISA, PVBODY, KV_Q8, HD, MG)
KV_ROWS(128, avx2, KILN_AVX2, qk128g_avx2, pvg_avx2, 4)
KV_ROWS(128, avx512, KILN_AVX512, qk128g_avx512, pvg_avx512, 8)
KV_ROWS(64, avx2, KILN_AVX2, qk64g_avx2, pvg_avx2, 4)
KV_ROWS(64, avx512, KILN_AVX512, qk64g_avx512, pvg_avx512, 8)
#undef QKG
#undef PVG
#undef KV_ROWS

KILN_AVX2 static void qk_avx2(const float *q, const float *k, int nk, int hd, float scale, float *sc) {
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
    for (int j = 0; j < nk; j++, v += hd) {
        __m256 pj = _mm256_set1_ps(p[j]);
        int i = 0;
        for (; i + 8 <= hd; i += 8) _mm256_storeu_ps(o + i, _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + i), _mm256_loadu_ps(o + i)));
        for (; i < hd; i++) o[i] += p[j] * v[i];
    }
}

KILN_AVX512 static void qk_avx512(const float *q, const float *k, int nk, int hd, float scale, float *sc) {
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
    for (int j = 0; j < nk; j++, v += hd) {
        __m512 pj = _mm512_set1_ps(p[j]);
        for (int i = 0; i < hd; i += 16) {
            __mmask16 m = hd - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - i)) - 1);
            _mm512_mask_storeu_ps(o + i, m, _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(m, v + i), _mm512_maskz_loadu_ps(m, o + i)));
        }
    }
}

#endif /* KILN_X86 */

#if defined(KILN_NEON)
/* NEON: 4 accumulators per key (16 floats per step) */
static void qk_neon(const float *q, const float *k, int nk, int hd, float scale, float *sc) {
    for (int j = 0; j < nk; j++, k += hd) {
        float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
        int i = 0;
        for (; i + 16 <= hd; i += 16) {
            a0 = vfmaq_f32(a0, vld1q_f32(q + i), vld1q_f32(k + i));
            a1 = vfmaq_f32(a1, vld1q_f32(q + i + 4), vld1q_f32(k + i + 4));
            a2 = vfmaq_f32(a2, vld1q_f32(q + i + 8), vld1q_f32(k + i + 8));
            a3 = vfmaq_f32(a3, vld1q_f32(q + i + 12), vld1q_f32(k + i + 12));
        }
        for (; i + 4 <= hd; i += 4) a0 = vfmaq_f32(a0, vld1q_f32(q + i), vld1q_f32(k + i));
        float d = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
        for (; i < hd; i++) d += q[i] * k[i];
        sc[j] = d * scale;
    }
}

static float expsum_neon(float *sc, int n, float mx) {
    float32x4_t m = vdupq_n_f32(mx), s = vdupq_n_f32(0);
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        float32x4_t e = kiln_exp4(vsubq_f32(vld1q_f32(sc + t), m));
        vst1q_f32(sc + t, e);
        s = vaddq_f32(s, e);
    }
    float sum = vaddvq_f32(s);
    if (t < n) {
        float tmp[4] = {0};
        for (int i = t; i < n; i++) tmp[i - t] = sc[i] - mx;
        vst1q_f32(tmp, kiln_exp4(vld1q_f32(tmp)));
        for (int i = t; i < n; i++) sc[i] = tmp[i - t], sum += tmp[i - t];
    }
    return sum;
}

static void pv_neon(float *o, const float *p, const float *v, int nk, int hd) {
    int i0 = 0;
    /* 64 dims at a time in 16 accumulators, then 4 at a time */
    for (; i0 + 64 <= hd; i0 += 64) {
        float32x4_t a[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) a[i] = vld1q_f32(o + i0 + 4 * i);
        const float *vj = v + i0;
        for (int j = 0; j < nk; j++, vj += hd) {
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) a[i] = vfmaq_n_f32(a[i], vld1q_f32(vj + 4 * i), p[j]);
        }
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) vst1q_f32(o + i0 + 4 * i, a[i]);
    }
    for (int j = 0; j < nk; j++) {
        const float *vj = v + (size_t)j * hd;
        int i = i0;
        for (; i + 4 <= hd; i += 4) vst1q_f32(o + i, vfmaq_n_f32(vld1q_f32(o + i), vld1q_f32(vj + i), p[j]));
        for (; i < hd; i++) o[i] += p[j] * vj[i];
    }
}
#endif /* KILN_NEON */

/* ==== tiled path kernels: rows in the lanes ==== */

enum {
    BK = 32,             /* keys per key tile (a multiple of every kernel's key block) */
    QB = 256,            /* query rows per work item (a multiple of every L) */
    TILE_MIN_ROWS = 4,   /* a sequence of one row, or fewer rows (n * G), takes the row path */
    LMAX = 32,
};

/* s[j][0..L) = sum_d k[j][d] * qt[d][0..L) for j < nk rounded up to the
 * kernel's key block (krow[j] valid up to BK: spare entries repeat a key) */
typedef void (*tqk_fn)(const float *qt, const float *const *krow, int nk, int hd, float *s);
/* online softmax of nk keys (key j is position t0 + j; lane r sees keys up
 * to lim[r]): s becomes P in place, m and l are updated, alpha gets
 * exp(m_old - m_new) */
typedef void (*tsm_fn)(float *s, int nk, int t0, const int32_t *lim, float *m, float *l, float *alpha);
/* ot[d][0..L) = alpha * ot[d] + sum_{j < nk} vrow[j][d] * p[j][0..L) */
typedef void (*tpv_fn)(float *ot, const float *alpha, const float *p, const float *const *vrow, int nk, int hd);

#define LS 16 /* lanes of the scalar tiles */

static void tqk_scalar(const float *qt, const float *const *krow, int nk, int hd, float *s) {
    for (int j = 0; j < nk; j++) {
        float a[LS] = {0};
        const float *k = krow[j];
        for (int d = 0; d < hd; d++)
            for (int r = 0; r < LS; r++) a[r] += k[d] * qt[d * LS + r];
        for (int r = 0; r < LS; r++) s[j * LS + r] = a[r];
    }
}

static void tsm_scalar(float *s, int nk, int t0, const int32_t *lim, float *m, float *l, float *alpha) {
    for (int r = 0; r < LS; r++) {
        float mx = m[r], sum = 0;
        for (int j = 0; j < nk; j++)
            if (t0 + j <= lim[r] && s[j * LS + r] > mx) mx = s[j * LS + r];
        for (int j = 0; j < nk; j++) {
            float p = t0 + j <= lim[r] ? expf(s[j * LS + r] - mx) : 0.0f;
            s[j * LS + r] = p;
            sum += p;
        }
        alpha[r] = expf(m[r] - mx);
        l[r] = l[r] * alpha[r] + sum;
        m[r] = mx;
    }
}

static void tpv_scalar(float *ot, const float *alpha, const float *p, const float *const *vrow, int nk, int hd) {
    for (int d = 0; d < hd; d++) {
        float a[LS];
        for (int r = 0; r < LS; r++) a[r] = ot[d * LS + r] * alpha[r];
        for (int j = 0; j < nk; j++) {
            float v = vrow[j][d];
            for (int r = 0; r < LS; r++) a[r] += v * p[j * LS + r];
        }
        for (int r = 0; r < LS; r++) ot[d * LS + r] = a[r];
    }
}

#if defined(KILN_X86)
/* AVX2: 16 lanes = 2 ymm; qk blocks of 4 keys (8 accumulators), pv blocks
 * of 4 dims (8 accumulators) */
#define NK2 4
KILN_AVX2 static void tqk_avx2(const float *qt, const float *const *krow, int nk, int hd, float *s) {
    for (int j0 = 0; j0 < nk; j0 += NK2) {
        const float *k0 = krow[j0], *k1 = krow[j0 + 1], *k2 = krow[j0 + 2], *k3 = krow[j0 + 3];
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
        const float *q = qt;
        for (int d = 0; d < hd; d++, q += 16) {
            __m256 q0 = _mm256_load_ps(q), q1 = _mm256_load_ps(q + 8), b;
            b = _mm256_broadcast_ss(k0 + d), a00 = _mm256_fmadd_ps(b, q0, a00), a01 = _mm256_fmadd_ps(b, q1, a01);
            b = _mm256_broadcast_ss(k1 + d), a10 = _mm256_fmadd_ps(b, q0, a10), a11 = _mm256_fmadd_ps(b, q1, a11);
            b = _mm256_broadcast_ss(k2 + d), a20 = _mm256_fmadd_ps(b, q0, a20), a21 = _mm256_fmadd_ps(b, q1, a21);
            b = _mm256_broadcast_ss(k3 + d), a30 = _mm256_fmadd_ps(b, q0, a30), a31 = _mm256_fmadd_ps(b, q1, a31);
        }
        float *o = s + (size_t)j0 * 16;
        _mm256_store_ps(o, a00), _mm256_store_ps(o + 8, a01), _mm256_store_ps(o + 16, a10), _mm256_store_ps(o + 24, a11);
        _mm256_store_ps(o + 32, a20), _mm256_store_ps(o + 40, a21), _mm256_store_ps(o + 48, a30), _mm256_store_ps(o + 56, a31);
    }
}

KILN_AVX2 static void tsm_avx2(float *s, int nk, int t0, const int32_t *lim, float *m, float *l, float *alpha) {
    for (int h = 0; h < 16; h += 8) {
        __m256i lv = _mm256_loadu_si256((const __m256i *)(lim + h));
        __m256 mo = _mm256_load_ps(m + h), mx = mo, ninf = _mm256_set1_ps(-INFINITY);
        for (int j = 0; j < nk; j++) {
            __m256 inval = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(t0 + j), lv));
            __m256 x = _mm256_blendv_ps(_mm256_load_ps(s + j * 16 + h), ninf, inval);
            mx = _mm256_max_ps(mx, x);
        }
        __m256 sum = _mm256_setzero_ps();
        for (int j = 0; j < nk; j++) {
            __m256 inval = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(t0 + j), lv));
            __m256 p = _mm256_andnot_ps(inval, kiln_exp8(_mm256_sub_ps(_mm256_load_ps(s + j * 16 + h), mx)));
            _mm256_store_ps(s + j * 16 + h, p);
            sum = _mm256_add_ps(sum, p);
        }
        __m256 al = kiln_exp8(_mm256_sub_ps(mo, mx));
        _mm256_store_ps(alpha + h, al);
        _mm256_store_ps(l + h, _mm256_fmadd_ps(_mm256_load_ps(l + h), al, sum));
        _mm256_store_ps(m + h, mx);
    }
}

KILN_AVX2 static void tpv_avx2(float *ot, const float *alpha, const float *p, const float *const *vrow, int nk, int hd) {
    const __m256 al0 = _mm256_load_ps(alpha), al1 = _mm256_load_ps(alpha + 8);
    int d0 = 0;
    for (; d0 + 4 <= hd; d0 += 4) {
        float *o = ot + (size_t)d0 * 16;
        __m256 a00 = _mm256_mul_ps(_mm256_load_ps(o), al0), a01 = _mm256_mul_ps(_mm256_load_ps(o + 8), al1);
        __m256 a10 = _mm256_mul_ps(_mm256_load_ps(o + 16), al0), a11 = _mm256_mul_ps(_mm256_load_ps(o + 24), al1);
        __m256 a20 = _mm256_mul_ps(_mm256_load_ps(o + 32), al0), a21 = _mm256_mul_ps(_mm256_load_ps(o + 40), al1);
        __m256 a30 = _mm256_mul_ps(_mm256_load_ps(o + 48), al0), a31 = _mm256_mul_ps(_mm256_load_ps(o + 56), al1);
        for (int j = 0; j < nk; j++) {
            const float *v = vrow[j] + d0;
            __m256 p0 = _mm256_load_ps(p + j * 16), p1 = _mm256_load_ps(p + j * 16 + 8), b;
            b = _mm256_broadcast_ss(v), a00 = _mm256_fmadd_ps(b, p0, a00), a01 = _mm256_fmadd_ps(b, p1, a01);
            b = _mm256_broadcast_ss(v + 1), a10 = _mm256_fmadd_ps(b, p0, a10), a11 = _mm256_fmadd_ps(b, p1, a11);
            b = _mm256_broadcast_ss(v + 2), a20 = _mm256_fmadd_ps(b, p0, a20), a21 = _mm256_fmadd_ps(b, p1, a21);
            b = _mm256_broadcast_ss(v + 3), a30 = _mm256_fmadd_ps(b, p0, a30), a31 = _mm256_fmadd_ps(b, p1, a31);
        }
        _mm256_store_ps(o, a00), _mm256_store_ps(o + 8, a01), _mm256_store_ps(o + 16, a10), _mm256_store_ps(o + 24, a11);
        _mm256_store_ps(o + 32, a20), _mm256_store_ps(o + 40, a21), _mm256_store_ps(o + 48, a30), _mm256_store_ps(o + 56, a31);
    }
    for (; d0 < hd; d0++) {
        float *o = ot + (size_t)d0 * 16;
        __m256 a0 = _mm256_mul_ps(_mm256_load_ps(o), al0), a1 = _mm256_mul_ps(_mm256_load_ps(o + 8), al1);
        for (int j = 0; j < nk; j++) {
            __m256 b = _mm256_broadcast_ss(vrow[j] + d0);
            a0 = _mm256_fmadd_ps(b, _mm256_load_ps(p + j * 16), a0), a1 = _mm256_fmadd_ps(b, _mm256_load_ps(p + j * 16 + 8), a1);
        }
        _mm256_store_ps(o, a0), _mm256_store_ps(o + 8, a1);
    }
}

/* AVX-512: 32 lanes = 2 zmm; qk blocks of 12 keys (24 accumulators; 8 and
 * 4 for the rest), pv blocks of 12 dims (24 accumulators; 8, 4, 1 for the
 * rest). The block helpers are inlined with a constant width, so their
 * accumulators stay in registers. */
#define KILN_INLINE __attribute__((always_inline)) inline
KILN_AVX512 static KILN_INLINE void tqk512_block(const float *qt, const float *const *krow, int hd, float *s, const int NK) {
    const float *k[12];
    __m512 a[12][2];
#pragma GCC unroll 12
    for (int u = 0; u < NK; u++) k[u] = krow[u], a[u][0] = a[u][1] = _mm512_setzero_ps();
    const float *q = qt;
    for (int d = 0; d < hd; d++, q += 32) {
        __m512 q0 = _mm512_load_ps(q), q1 = _mm512_load_ps(q + 16);
#pragma GCC unroll 12
        for (int u = 0; u < NK; u++) {
            __m512 b = _mm512_set1_ps(k[u][d]);
            a[u][0] = _mm512_fmadd_ps(b, q0, a[u][0]), a[u][1] = _mm512_fmadd_ps(b, q1, a[u][1]);
        }
    }
#pragma GCC unroll 12
    for (int u = 0; u < NK; u++) _mm512_store_ps(s + 32 * u, a[u][0]), _mm512_store_ps(s + 32 * u + 16, a[u][1]);
}

KILN_AVX512 static void tqk_avx512(const float *qt, const float *const *krow, int nk, int hd, float *s) {
    int j0 = 0;
    for (; nk - j0 >= 12; j0 += 12) tqk512_block(qt, krow + j0, hd, s + (size_t)j0 * 32, 12);
    if (nk - j0 > 4) tqk512_block(qt, krow + j0, hd, s + (size_t)j0 * 32, 8), j0 += 8;
    if (nk - j0 > 0) tqk512_block(qt, krow + j0, hd, s + (size_t)j0 * 32, 4);
}

KILN_AVX512 static void tsm_avx512(float *s, int nk, int t0, const int32_t *lim, float *m, float *l, float *alpha) {
    for (int h = 0; h < 32; h += 16) {
        __m512i lv = _mm512_loadu_si512(lim + h);
        __m512 mo = _mm512_load_ps(m + h), mx = mo;
        for (int j = 0; j < nk; j++) {
            __mmask16 ok = _mm512_cmple_epi32_mask(_mm512_set1_epi32(t0 + j), lv);
            mx = _mm512_mask_max_ps(mx, ok, mx, _mm512_load_ps(s + j * 32 + h));
        }
        __m512 sum = _mm512_setzero_ps();
        for (int j = 0; j < nk; j++) {
            __mmask16 ok = _mm512_cmple_epi32_mask(_mm512_set1_epi32(t0 + j), lv);
            __m512 p = _mm512_maskz_mov_ps(ok, kiln_exp16(_mm512_sub_ps(_mm512_load_ps(s + j * 32 + h), mx)));
            _mm512_store_ps(s + j * 32 + h, p);
            sum = _mm512_add_ps(sum, p);
        }
        __m512 al = kiln_exp16(_mm512_sub_ps(mo, mx));
        _mm512_store_ps(alpha + h, al);
        _mm512_store_ps(l + h, _mm512_fmadd_ps(_mm512_load_ps(l + h), al, sum));
        _mm512_store_ps(m + h, mx);
    }
}

KILN_AVX512 static KILN_INLINE void tpv512_block(float *o, __m512 al0, __m512 al1, const float *p, const float *const *vrow, int d0,
                                                 int nk, const int ND) {
    __m512 a[12][2];
#pragma GCC unroll 12
    for (int u = 0; u < ND; u++)
        a[u][0] = _mm512_mul_ps(_mm512_load_ps(o + 32 * u), al0), a[u][1] = _mm512_mul_ps(_mm512_load_ps(o + 32 * u + 16), al1);
    for (int j = 0; j < nk; j++) {
        const float *v = vrow[j] + d0;
        __m512 p0 = _mm512_load_ps(p + j * 32), p1 = _mm512_load_ps(p + j * 32 + 16);
#pragma GCC unroll 12
        for (int u = 0; u < ND; u++) {
            __m512 b = _mm512_set1_ps(v[u]);
            a[u][0] = _mm512_fmadd_ps(b, p0, a[u][0]), a[u][1] = _mm512_fmadd_ps(b, p1, a[u][1]);
        }
    }
#pragma GCC unroll 12
    for (int u = 0; u < ND; u++) _mm512_store_ps(o + 32 * u, a[u][0]), _mm512_store_ps(o + 32 * u + 16, a[u][1]);
}

KILN_AVX512 static void tpv_avx512(float *ot, const float *alpha, const float *p, const float *const *vrow, int nk, int hd) {
    const __m512 al0 = _mm512_load_ps(alpha), al1 = _mm512_load_ps(alpha + 16);
    int d0 = 0;
    for (; hd - d0 >= 12; d0 += 12) tpv512_block(ot + (size_t)d0 * 32, al0, al1, p, vrow, d0, nk, 12);
    for (; hd - d0 >= 4; d0 += 4) tpv512_block(ot + (size_t)d0 * 32, al0, al1, p, vrow, d0, nk, 4);
    for (; d0 < hd; d0++) tpv512_block(ot + (size_t)d0 * 32, al0, al1, p, vrow, d0, nk, 1);
}

#endif /* KILN_X86 */

#if defined(KILN_NEON)
/* NEON: 16 lanes = 4 q registers; qk blocks of 4 keys and pv blocks of 4
 * dims (16 accumulators each) */
static void tqk_neon(const float *qt, const float *const *krow, int nk, int hd, float *s) {
    for (int j = 0; j < nk; j += 4, s += 4 * LS) {
        const float *k0 = krow[j], *k1 = krow[j + 1], *k2 = krow[j + 2], *k3 = krow[j + 3];
        float32x4_t a[4][4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) a[u][0] = a[u][1] = a[u][2] = a[u][3] = vdupq_n_f32(0);
        const float *q = qt;
        for (int d = 0; d < hd; d++, q += LS) {
            float32x4_t q0 = vld1q_f32(q), q1 = vld1q_f32(q + 4), q2 = vld1q_f32(q + 8), q3 = vld1q_f32(q + 12);
            const float kv[4] = {k0[d], k1[d], k2[d], k3[d]};
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                a[u][0] = vfmaq_n_f32(a[u][0], q0, kv[u]), a[u][1] = vfmaq_n_f32(a[u][1], q1, kv[u]);
                a[u][2] = vfmaq_n_f32(a[u][2], q2, kv[u]), a[u][3] = vfmaq_n_f32(a[u][3], q3, kv[u]);
            }
        }
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++)
            for (int c = 0; c < 4; c++) vst1q_f32(s + u * LS + 4 * c, a[u][c]);
    }
}

static void tsm_neon(float *s, int nk, int t0, const int32_t *lim, float *m, float *l, float *alpha) {
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    for (int h = 0; h < LS; h += 4) {
        int32x4_t lv = vld1q_s32(lim + h);
        float32x4_t mo = vld1q_f32(m + h), mx = mo;
        for (int j = 0; j < nk; j++) {
            uint32x4_t ok = vcleq_s32(vdupq_n_s32(t0 + j), lv);
            mx = vmaxq_f32(mx, vbslq_f32(ok, vld1q_f32(s + j * LS + h), ninf));
        }
        float32x4_t sum = vdupq_n_f32(0);
        for (int j = 0; j < nk; j++) {
            uint32x4_t ok = vcleq_s32(vdupq_n_s32(t0 + j), lv);
            float32x4_t e = kiln_exp4(vsubq_f32(vld1q_f32(s + j * LS + h), mx));
            float32x4_t p = vreinterpretq_f32_u32(vandq_u32(ok, vreinterpretq_u32_f32(e)));
            vst1q_f32(s + j * LS + h, p);
            sum = vaddq_f32(sum, p);
        }
        float32x4_t al = kiln_exp4(vsubq_f32(mo, mx));
        vst1q_f32(alpha + h, al);
        vst1q_f32(l + h, vfmaq_f32(sum, vld1q_f32(l + h), al));
        vst1q_f32(m + h, mx);
    }
}

static void tpv_neon(float *ot, const float *alpha, const float *p, const float *const *vrow, int nk, int hd) {
    const float32x4_t al[4] = {vld1q_f32(alpha), vld1q_f32(alpha + 4), vld1q_f32(alpha + 8), vld1q_f32(alpha + 12)};
    int d0 = 0;
    for (; d0 + 4 <= hd; d0 += 4) {
        float *o = ot + (size_t)d0 * LS;
        float32x4_t a[4][4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++)
            for (int c = 0; c < 4; c++) a[u][c] = vmulq_f32(vld1q_f32(o + u * LS + 4 * c), al[c]);
        for (int j = 0; j < nk; j++) {
            const float *v = vrow[j] + d0, *pj = p + j * LS;
            float32x4_t p0 = vld1q_f32(pj), p1 = vld1q_f32(pj + 4), p2 = vld1q_f32(pj + 8), p3 = vld1q_f32(pj + 12);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                a[u][0] = vfmaq_n_f32(a[u][0], p0, v[u]), a[u][1] = vfmaq_n_f32(a[u][1], p1, v[u]);
                a[u][2] = vfmaq_n_f32(a[u][2], p2, v[u]), a[u][3] = vfmaq_n_f32(a[u][3], p3, v[u]);
            }
        }
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++)
            for (int c = 0; c < 4; c++) vst1q_f32(o + u * LS + 4 * c, a[u][c]);
    }
    for (; d0 < hd; d0++) {
        float *o = ot + (size_t)d0 * LS;
        float32x4_t a[4];
        for (int c = 0; c < 4; c++) a[c] = vmulq_f32(vld1q_f32(o + 4 * c), al[c]);
        for (int j = 0; j < nk; j++) {
            const float v = vrow[j][d0];
            for (int c = 0; c < 4; c++) a[c] = vfmaq_n_f32(a[c], vld1q_f32(p + j * LS + 4 * c), v);
        }
        for (int c = 0; c < 4; c++) vst1q_f32(o + 4 * c, a[c]);
    }
}
#endif /* KILN_NEON */

/* ==== work items and the drivers ==== */

struct att_item {
    int64_t cost; /* ~ rows x keys */
    int seq, kh;
    int r0, r1; /* tiled: the sequence's rows [r0, r1) (r = i * G + g); rows: r0 = the batch row, r1 = KV heads from kh */
    int tiled;
};

struct att_job {
    float *out, *scratch; /* scratch: scr_len floats per thread */
    size_t scr_len;
    const float *q;
    const struct kv_cache *kv;
    const struct kiln_batch *b;
    const struct att_item *items;
    int layer, n_head, group, sc_len;
    float scale;
    qk_fn qk;
    expsum_fn expsum;
    pv_fn pv;
    int L; /* lanes of the tiled kernels */
    tqk_fn tqk;
    tsm_fn tsm;
    tpv_fn tpv;
    int isa;      /* for widening 16-bit cache rows */
    qkg_fn qkg; /* head_dim 64 or 128 with AVX2 / AVX-512, or NULL (then 16-bit pages are widened into scratch) */
    pvg_fn pvg;
    size_t wide;  /* offset in a thread's scratch of the widened rows (16-bit caches) */
    int far_pages; /* row path with qkg / pvg: pages ahead of the one read whose blocks go to L2 (0: none) */
};

/* the next page of one head towards L2 while this one is computed: pages
 * are a few KB apart, so the hardware prefetcher restarts at every page */
static inline void prefetch_page(const struct kv_cache *kv, const void *base, int page, int kh, int n) {
    const char *p = kv_at(kv, (void *)base, page, kh, 0), *e = p + (size_t)n * kv_rowb(kv);
    for (; p < e; p += 64) _mm_prefetch(p, _MM_HINT_T1);
}

/* n rows of one head's page (from slot 0) as f32: the page itself, or its
 * rows widened into buf */
static const float *page_rows(const struct att_job *j, const void *base, int page, int kh, int n, float *buf) {
    const struct kv_cache *kv = j->kv;
    const void *p = kv_at(kv, (void *)base, page, kh, 0);
    if (kv->dtype == KILN_DTYPE_F32) return p;
    kv_widen(buf, p, (size_t)n * kv->head_dim, kv->dtype, j->isa);
    return buf;
}

/* head kh's block far_pages pages past page pi of a row's stream (its K
 * pages, then its V pages: v = 1 in the V pass), or NULL past its end */
static inline const void *far_block(const struct att_job *j, const struct kiln_seq_view *sq, int pi, int kh, int npg, int v) {
    if (!j->far_pages) return NULL;
    int f = pi + j->far_pages + (v ? npg : 0);
    if (f >= 2 * npg) return NULL;
    return kv_at(j->kv, f < npg ? j->kv->k[j->layer] : j->kv->v[j->layer], sq->pages[f < npg ? f : f - npg], kh, 0);
}

/* one row and a run of nkh adjacent KV heads (each with its G query heads),
 * page by page: a page holds its heads side by side, so the run is one
 * contiguous block of nkh head pages (random 4-8 KB reads of a single head
 * stream well below the machine's bandwidth) */
static void att_row(const struct att_job *j, const struct att_item *it, float *sc) {
    const struct kv_cache *kv = j->kv;
    const int hd = kv->head_dim, P = kv->page_size, G = j->group, kh0 = it->kh, nkh = it->r1, row = it->r0, GH = G * nkh;
    const struct kiln_seq_view *sq = &j->b->seqs[it->seq];
    const int len = sq->n_past + (row - sq->start) + 1;
    const float *qr = j->q + ((size_t)row * j->n_head + (size_t)kh0 * G) * hd;
    float *out = j->out + ((size_t)row * j->n_head + (size_t)kh0 * G) * hd, *wide = sc + j->wide;
    for (int t0 = 0; t0 < len; t0 += P) {
        const int n = len - t0 < P ? len - t0 : P;
        for (int h = 0; h < nkh; h++) {
            float *s = sc + (size_t)h * G * j->sc_len + t0;
            const float *q = qr + (size_t)h * G * hd;
            if (j->qkg) { /* the block after this one (the V pass's first after the last) is prefetched row by row */
                const void *kp = kv_at(kv, kv->k[j->layer], sq->pages[t0 / P], kh0 + h, 0);
                const void *nx = h + 1 < nkh     ? kv_at(kv, kv->k[j->layer], sq->pages[t0 / P], kh0 + h + 1, 0)
                                 : t0 + P < len ? kv_at(kv, kv->k[j->layer], sq->pages[t0 / P + 1], kh0, 0)
                                                : kv_at(kv, kv->v[j->layer], sq->pages[0], kh0, 0);
                j->qkg(q, G, kp, n, j->scale, s, j->sc_len, nx, far_block(j, sq, t0 / P, kh0 + h, (len + P - 1) / P, 0));
                continue;
            }
            if (t0 + P < len) prefetch_page(kv, kv->k[j->layer], sq->pages[t0 / P + 1], kh0 + h, len - t0 - P < P ? len - t0 - P : P);
            const float *kp = page_rows(j, kv->k[j->layer], sq->pages[t0 / P], kh0 + h, n, wide);
            for (int g = 0; g < G; g++) j->qk(q + (size_t)g * hd, kp, n, hd, j->scale, s + (size_t)g * j->sc_len);
        }
    }
    for (int g = 0; g < GH; g++) {
        float *s = sc + (size_t)g * j->sc_len, mx = -FLT_MAX;
        for (int t = 0; t < len; t++)
            if (s[t] > mx) mx = s[t];
        float inv = 1.0f / j->expsum(s, len, mx);
        for (int t = 0; t < len; t++) s[t] *= inv;
        memset(out + (size_t)g * hd, 0, sizeof(float) * (size_t)hd);
    }
    for (int t0 = 0; t0 < len; t0 += P) {
        const int n = len - t0 < P ? len - t0 : P;
        for (int h = 0; h < nkh; h++) {
            const float *p = sc + (size_t)h * G * j->sc_len + t0;
            float *o = out + (size_t)h * G * hd;
            if (j->pvg) {
                const void *vp = kv_at(kv, kv->v[j->layer], sq->pages[t0 / P], kh0 + h, 0);
                const void *nx = h + 1 < nkh     ? kv_at(kv, kv->v[j->layer], sq->pages[t0 / P], kh0 + h + 1, 0)
                                 : t0 + P < len ? kv_at(kv, kv->v[j->layer], sq->pages[t0 / P + 1], kh0, 0)
                                                : NULL;
                j->pvg(o, p, G, j->sc_len, vp, n, nx, far_block(j, sq, t0 / P, kh0 + h, (len + P - 1) / P, 1));
                continue;
            }
            if (t0 + P < len) prefetch_page(kv, kv->v[j->layer], sq->pages[t0 / P + 1], kh0 + h, len - t0 - P < P ? len - t0 - P : P);
            const float *vp = page_rows(j, kv->v[j->layer], sq->pages[t0 / P], kh0 + h, n, wide);
            for (int g = 0; g < G; g++) j->pv(o + (size_t)g * hd, p + (size_t)g * j->sc_len, vp, n, hd);
        }
    }
}

/* one (sequence, KV head, block of up to QB rows), flash style */
static void att_tile(const struct att_job *j, const struct att_item *it, float *scr) {
    const struct kv_cache *kv = j->kv;
    const int hd = kv->head_dim, P = kv->page_size, G = j->group, kh = it->kh, L = j->L;
    const struct kiln_seq_view *sq = &j->b->seqs[it->seq];
    const int R = it->r1 - it->r0, nst = (R + L - 1) / L;
    float *wide = scr + j->wide; /* 16-bit caches: the tile's keys, then its values, as f32 [BK][hd] */
    /* scratch: Q^T and O^T [nst][hd][L], S [BK][L], m, l, alpha [nst][L], lim [nst][L] */
    float *qt = scr, *ot = qt + (size_t)QB * hd, *S = ot + (size_t)QB * hd, *m = S + BK * LMAX, *l = m + QB, *al = l + QB;
    int32_t *lim = (int32_t *)(al + QB);
    const float *krow[BK], *vrow[BK];
    int st_hi[QB / 16]; /* per subtile: the largest key limit of its rows */
    for (int st = 0; st < nst; st++) {
        float *q = qt + (size_t)st * hd * L;
        st_hi[st] = -1;
        for (int r = 0; r < L; r++) {
            int rr = it->r0 + st * L + r;
            int32_t *lm = lim + st * L + r;
            m[st * L + r] = -INFINITY, l[st * L + r] = 0;
            if (rr >= it->r1) { /* a spare lane: q = 0, never masked, never written out */
                for (int d = 0; d < hd; d++) q[d * L + r] = 0;
                *lm = INT32_MAX;
                continue;
            }
            int i = rr / G, g = rr % G;
            const float *src = j->q + ((size_t)(sq->start + i) * j->n_head + (size_t)kh * G + g) * hd;
            for (int d = 0; d < hd; d++) q[d * L + r] = src[d] * j->scale;
            *lm = sq->n_past + i;
            if (*lm > st_hi[st]) st_hi[st] = *lm;
        }
    }
    memset(ot, 0, sizeof(float) * (size_t)nst * hd * L);
    const int n_keys = st_hi[nst - 1] + 1; /* rows are position-major: the last subtile sees the most */
    void *kbase = kv->k[j->layer], *vbase = kv->v[j->layer];
    const size_t rowb = kv_rowb(kv);
    for (int t0 = 0; t0 < n_keys; t0 += BK) {
        int nt = n_keys - t0 < BK ? n_keys - t0 : BK;
        for (int u = 0; u < BK; u++) {
            int t = t0 + (u < nt ? u : nt - 1); /* spare entries: the last key again (scores unused) */
            const char *kr = kv_at(kv, kbase, sq->pages[t / P], kh, t % P), *vr = kv_at(kv, vbase, sq->pages[t / P], kh, t % P);
            if (kv->dtype == KILN_DTYPE_F32) {
                krow[u] = (const float *)kr, vrow[u] = (const float *)vr;
            } else if (u < nt) {
                float *kw = wide + (size_t)u * hd, *vw = wide + (size_t)(BK + u) * hd;
                kv_widen(kw, kr, (size_t)hd, kv->dtype, j->isa), kv_widen(vw, vr, (size_t)hd, kv->dtype, j->isa);
                krow[u] = kw, vrow[u] = vw;
            } else {
                krow[u] = krow[nt - 1], vrow[u] = vrow[nt - 1];
            }
        }
        /* the next tile's keys and values towards L2 while this one is computed
         * (rows gathered from pages defeat the hardware prefetcher's ramp-up) */
        for (int t = t0 + BK; t < t0 + 2 * BK && t < n_keys; t++) {
            const char *kr = kv_at(kv, kbase, sq->pages[t / P], kh, t % P), *vr = kv_at(kv, vbase, sq->pages[t / P], kh, t % P);
            for (size_t d = 0; d < rowb; d += 64) _mm_prefetch(kr + d, _MM_HINT_T1), _mm_prefetch(vr + d, _MM_HINT_T1);
        }
        for (int st = 0; st < nst; st++) {
            if (t0 > st_hi[st]) continue; /* causal: this subtile's rows see none of these keys */
            int nk = st_hi[st] + 1 - t0 < nt ? st_hi[st] + 1 - t0 : nt;
            float *sm = m + st * L, *sl = l + st * L, *sa = al + st * L, *so = ot + (size_t)st * hd * L;
            j->tqk(qt + (size_t)st * hd * L, krow, nk, hd, S);
            j->tsm(S, nk, t0, lim + st * L, sm, sl, sa);
            j->tpv(so, sa, S, vrow, nk, hd);
        }
    }
    for (int st = 0; st < nst; st++)
        for (int r = 0; r < L; r++) {
            int rr = it->r0 + st * L + r;
            if (rr >= it->r1) break;
            int i = rr / G, g = rr % G;
            float *dst = j->out + ((size_t)(sq->start + i) * j->n_head + (size_t)kh * G + g) * hd, inv = 1.0f / l[st * L + r];
            const float *src = ot + (size_t)st * hd * L + r;
            for (int d = 0; d < hd; d++) dst[d] = src[(size_t)d * L] * inv;
        }
}

static void att_items(void *arg, int64_t b0, int64_t e0, int tid) {
    const struct att_job *j = arg;
    float *scr = j->scratch + (size_t)tid * j->scr_len;
    for (int64_t i = b0; i < e0; i++) {
        const struct att_item *it = &j->items[i];
        if (it->tiled) att_tile(j, it, scr);
        else att_row(j, it, scr);
    }
}

static int item_cmp(const void *a_, const void *b_) {
    const struct att_item *a = a_, *b = b_;
    return a->cost > b->cost ? -1 : a->cost < b->cost ? 1 : 0;
}

/* below this much work (~ rows x keys x head_dim) attention runs on the caller */
enum { ATT_PAR_MIN = 8192 };

static int row_kh_env = -1; /* KILN_CPU_ATT_ROWKH: KV heads per row item (A/B timing) */
static _Atomic int att_pfd = -1; /* KILN_CPU_ATT_PFD: bytes of a row item's stream its L2 prefetch runs ahead (0: off) */

int cpu_set_att_pfd(int bytes) { return att_pfd = cpu_pfd_lines(bytes); }

/* isa < 0: the reference (every row on the row path, scalar loops) */
static void attention(struct kiln_backend *be, float *out, const float *q, const struct kv_cache *kv, int layer,
                      const struct kiln_batch *b, int n_head, float scale, int isa) {
    const int G = n_head / kv->n_head_kv, nkv = kv->n_head_kv, hd = kv->head_dim, nth = cpu_n_threads(be);
    struct att_job j = {.out = out, .q = q, .kv = kv, .b = b, .layer = layer, .n_head = n_head, .group = G, .scale = scale,
                        .isa = isa < 0 ? CPU_ISA_SCALAR : isa};
    if (isa >= 0) cpu_isa_note(isa, 0);
#if defined(KILN_X86)
    j.qk = isa == CPU_ISA_AVX512 ? qk_avx512 : isa == CPU_ISA_AVX2 ? qk_avx2 : qk_scalar;
    j.expsum = isa == CPU_ISA_AVX512 ? expsum_avx512 : isa == CPU_ISA_AVX2 ? expsum_avx2 : expsum_scalar;
    j.pv = isa == CPU_ISA_AVX512 ? pv_avx512 : isa == CPU_ISA_AVX2 ? pv_avx2 : pv_scalar;
    j.L = isa == CPU_ISA_AVX512 ? 32 : 16;
    j.tqk = isa == CPU_ISA_AVX512 ? tqk_avx512 : isa == CPU_ISA_AVX2 ? tqk_avx2 : tqk_scalar;
    j.tsm = isa == CPU_ISA_AVX512 ? tsm_avx512 : isa == CPU_ISA_AVX2 ? tsm_avx2 : tsm_scalar;
    j.tpv = isa == CPU_ISA_AVX512 ? tpv_avx512 : isa == CPU_ISA_AVX2 ? tpv_avx2 : tpv_scalar;
    if ((hd == 128 || hd == 64) && isa >= CPU_ISA_AVX2) {
        /* [head_dim 64][AVX-512][row type: KV_F32, KV_F16, KV_BF16, KV_Q8] */
        /* [head_dim 64][AVX-512][row type: KV_F32, KV_F16, KV_BF16, KV_Q8] */
        static const qkg_fn qkt[2][2][4] = {{{qk128_f32_avx2, qk128_f16_avx2, qk128_bf16_avx2, qk128_q8_avx2},
                                             {qk128_f32_avx512, qk128_f16_avx512, qk128_bf16_avx512, qk128_q8_avx512}},
                                            {{qk64_f32_avx2, qk64_f16_avx2, qk64_bf16_avx2, qk64_q8_avx2},
                                             {qk64_f32_avx512, qk64_f16_avx512, qk64_bf16_avx512, qk64_q8_avx512}}};
        static const pvg_fn pvt[2][2][4] = {{{pv128_f32_avx2, pv128_f16_avx2, pv128_bf16_avx2, pv128_q8_avx2},
                                             {pv128_f32_avx512, pv128_f16_avx512, pv128_bf16_avx512, pv128_q8_avx512}},
                                            {{pv64_f32_avx2, pv64_f16_avx2, pv64_bf16_avx2, pv64_q8_avx2},
                                             {pv64_f32_avx512, pv64_f16_avx512, pv64_bf16_avx512, pv64_q8_avx512}}};
        const int h = hd == 64, z = isa == CPU_ISA_AVX512;
        const int t = kv->dtype == KILN_DTYPE_F32 ? KV_F32 : kv->dtype == KILN_DTYPE_F16 ? KV_F16 : kv->dtype == KILN_DTYPE_BF16 ? KV_BF16 : KV_Q8;
        j.qkg = qkt[h][z][t], j.pvg = pvt[h][z][t];
    }
#elif defined(KILN_NEON)
    const int neon = isa >= CPU_ISA_NEON;
    j.qk = neon ? qk_neon : qk_scalar, j.expsum = neon ? expsum_neon : expsum_scalar, j.pv = neon ? pv_neon : pv_scalar;
    j.L = LS;
    j.tqk = neon ? tqk_neon : tqk_scalar, j.tsm = neon ? tsm_neon : tsm_scalar, j.tpv = neon ? tpv_neon : tpv_scalar;
#else
    j.qk = qk_scalar, j.expsum = expsum_scalar, j.pv = pv_scalar, j.L = LS;
    j.tqk = tqk_scalar, j.tsm = tsm_scalar, j.tpv = tpv_scalar;
#endif
    int n_items = 0, max_len = 1, any_tiled = 0;
    int64_t work = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct kiln_seq_view *sq = &b->seqs[s];
        int rows = sq->n * G;
        if (sq->n_past + sq->n > max_len) max_len = sq->n_past + sq->n;
        n_items += nkv * (isa >= 0 && sq->n >= 2 && rows >= TILE_MIN_ROWS ? (rows + QB - 1) / QB : sq->n);
    }
    struct att_item *items = cpu_scratch_alloc(be, sizeof *items * (size_t)(n_items > 0 ? n_items : 1));
    if (!items) return; /* reported by cpu_error */
    /* row items take runs of adjacent KV heads (one contiguous block per
     * page), halved while there would be fewer items than threads */
    int row_items = 0, row_kh = nkv;
    for (int s = 0; s < b->n_seqs; s++)
        if (!(isa >= 0 && b->seqs[s].n >= 2 && b->seqs[s].n * G >= TILE_MIN_ROWS)) row_items += b->seqs[s].n;
    if (row_kh_env < 0) {
        const char *e = getenv("KILN_CPU_ATT_ROWKH");
        row_kh_env = e ? atoi(e) : 0;
    }
    while (row_kh > 1 && row_kh % 2 == 0 && (int64_t)row_items * (nkv / row_kh) < nth) row_kh /= 2;
    if (row_kh_env > 0 && nkv % row_kh_env == 0) row_kh = row_kh_env;
    n_items = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct kiln_seq_view *sq = &b->seqs[s];
        int rows = sq->n * G;
        if (isa >= 0 && sq->n >= 2 && rows >= TILE_MIN_ROWS) {
            any_tiled = 1;
            for (int r0 = 0; r0 < rows; r0 += QB) {
                int r1 = rows - r0 < QB ? rows : r0 + QB;
                int64_t cost = (int64_t)(r1 - r0) * (sq->n_past + (r1 - 1) / G + 1) * hd;
                for (int kh = 0; kh < nkv; kh++) items[n_items++] = (struct att_item){cost, s, kh, r0, r1, 1};
                work += cost * nkv;
            }
        } else {
            for (int i = 0; i < sq->n; i++) {
                int64_t cost = (int64_t)G * row_kh * (sq->n_past + i + 1) * hd;
                for (int kh = 0; kh < nkv; kh += row_kh) items[n_items++] = (struct att_item){cost, s, kh, sq->start + i, row_kh, 0};
                work += cost * (nkv / row_kh);
            }
        }
    }
    qsort(items, (size_t)n_items, sizeof *items, item_cmp);
    int pfd = att_pfd;
    if (pfd < 0) att_pfd = pfd = cpu_pfd_env(ATT_PFD_DEFAULT, "KILN_CPU_ATT_PFD");
    if (j.qkg && pfd > 0) { /* pages of a row item's run (row_kh heads) that make pfd bytes */
        const size_t run = (size_t)row_kh * kv->page_size * kv_rowb(kv);
        j.far_pages = (int)(((size_t)pfd + run - 1) / run);
    }
    j.items = items;
    j.sc_len = (max_len + 31) & ~31;
    size_t row_len = (size_t)G * row_kh * j.sc_len;
    size_t tile_len = any_tiled ? 2 * (size_t)QB * hd + BK * LMAX + 4 * QB : 0;
    j.wide = ((row_len > tile_len ? row_len : tile_len) + 15) & ~(size_t)15;
    /* 16-bit caches: a page of rows (row path) or a tile's keys and values (tiled) widened */
    size_t wide_len = kv->dtype == KILN_DTYPE_F32 ? 0 : (size_t)hd * (kv->page_size > 2 * BK ? kv->page_size : 2 * BK);
    j.scr_len = (j.wide + wide_len + 15) & ~(size_t)15;
    if ((j.scratch = cpu_scratch_alloc(be, sizeof(float) * j.scr_len * (size_t)nth)))
        cpu_parallel_for(be, n_items, work >= ATT_PAR_MIN ? 1 : n_items, att_items, &j);
    free(j.scratch);
    free(items);
}

void cpu_attention(struct kiln_backend *be, void *out, const void *q, const struct kv_cache *kv, int layer,
                   const struct kiln_batch *b, int n_head, float scale) {
    attention(be, out, q, kv, layer, b, n_head, scale, cpu_isa());
}

void cpu_attention_ref(struct kiln_backend *be, void *out, const void *q, const struct kv_cache *kv, int layer,
                       const struct kiln_batch *b, int n_head, float scale) {
    attention(be, out, q, kv, layer, b, n_head, scale, -1);
}
