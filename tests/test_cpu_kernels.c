/*
 * test_cpu_kernels.c: every CPU kernel path (scalar, AVX2, AVX-512: each the
 * CPU has) against plain double-precision reference loops, on odd shapes
 * that exercise the tails: the dense matmul in its GEMV and GEMM shapes for
 * F32/BF16/F16 weights with and without bias, the row dot products that
 * qmatmul.c borrows, paged attention at head_dim 128 (the register path) and
 * an odd head_dim, the tiled prefill attention against the plain reference
 * (ragged sequences, cached prefixes, GQA 1/2/3/4/8, head_dim 64/128),
 * SwiGLU (the vector exp) and RoPE; and the worker pool's split loop
 * (cpu_parallel_for_split: every item exactly once, with stealing). A path the CPU lacks
 * is reported as skipped; the path in use before the group is restored.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/qmatmul_internal.h"
#include "base/base.h"
#include "test.h"

static float max_rel(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += (a[i] - ref[i]) * (a[i] - ref[i]), den += ref[i] * ref[i];
    return (float)sqrt(num / (den > 0 ? den : 1));
}

static void check_matmul(struct kiln_backend *be, struct kiln_rng *r, const char *isa, enum kiln_dtype t, int n_out,
                         int n_in, int with_bias) {
    char err[256];
    size_t es = dtype_size(t);
    uint8_t *w = kiln_malloc((size_t)n_out * n_in * es);
    double *wf = kiln_malloc(sizeof(double) * (size_t)n_out * n_in);
    for (int i = 0; i < n_out * n_in; i++) {
        float v = kiln_rng_normal(r);
        if (t == KILN_DTYPE_F32) ((float *)w)[i] = v, wf[i] = v;
        else if (t == KILN_DTYPE_BF16) ((uint16_t *)w)[i] = kiln_f32_to_bf16(v), wf[i] = kiln_bf16_to_f32(((uint16_t *)w)[i]);
        else ((uint16_t *)w)[i] = kiln_f32_to_f16(v), wf[i] = kiln_f16_to_f32(((uint16_t *)w)[i]);
    }
    float *bias = kiln_malloc(sizeof(float) * (size_t)n_out);
    for (int i = 0; i < n_out; i++) bias[i] = kiln_rng_normal(r);
    struct qlinear q = {.n_out = n_out, .n_in = n_in, .fmt = KILN_WFMT_DENSE, .w = {t, n_out, n_in, w, NULL}};
    if (with_bias) q.bias = (struct ktensor){KILN_DTYPE_F32, 1, n_out, bias, NULL};
    CHECK(be->prepare_linear(be, &q, err, sizeof err) == 0, "%s", err);
    static const int ns[] = {1, 2, 3, 4, 5, 7, 8, 13, 25, 40};
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        int n = ns[ni];
        float *x = kiln_malloc(sizeof(float) * (size_t)n * n_in), *y = kiln_malloc(sizeof(float) * (size_t)n * n_out);
        double *ref = kiln_malloc(sizeof(double) * (size_t)n * n_out);
        for (int i = 0; i < n * n_in; i++) x[i] = kiln_rng_normal(r);
        for (int tt = 0; tt < n; tt++)
            for (int o = 0; o < n_out; o++) {
                double s = with_bias ? bias[o] : 0;
                for (int i = 0; i < n_in; i++) s += wf[(size_t)o * n_in + i] * x[(size_t)tt * n_in + i];
                ref[(size_t)tt * n_out + o] = s;
            }
        memset(y, 0xff, sizeof(float) * (size_t)n * n_out); /* NaN: every output must be written */
        be->matmul(be, y, x, &q, n);
        float e = max_rel(y, ref, (size_t)n * n_out);
        CHECK(e < 2e-6f, "%s matmul %s %dx%d n=%d bias=%d: rel err %g", isa, dtype_name(t), n_out, n_in, n, with_bias, e);
        if (n < 8) { /* the decode GEMV's row order, one stream or two (cpu.h), its prefetches and its rows per pass
                        * (one; at batch 1 four for rows over 1 or 512 bytes, every shape here taking both; on AVX-512
                        * pairs at 2-4 activation rows unless the switch is 0) move no bit */
            const int st = cpu_gemv_streams(), pf = cpu_gemv_pfd(), pb = cpu_gemv_pfd_batch(), rk = cpu_gemv_rows();
            float *y2 = kiln_malloc(sizeof(float) * (size_t)n * n_out);
            for (int s2 = 1; s2 <= 2; s2++)
                for (int d = 0; d <= 1024; d += 1024)
                    for (int k = 0; k <= 512; k += k ? 511 : 1) {
                        CHECK(cpu_set_gemv_streams(s2) == s2 && cpu_set_gemv_pfd(d) == d && cpu_set_gemv_pfd_batch(1024 - d) == 1024 - d &&
                              cpu_set_gemv_rows(k) == k);
                        memset(y2, 0xff, sizeof(float) * (size_t)n * n_out);
                        be->matmul(be, y2, x, &q, n);
                        CHECK(!memcmp(y, y2, sizeof(float) * (size_t)n * n_out),
                              "%s matmul %s %dx%d n=%d: %d streams, prefetch %d, rows past %d bytes and the default (%d, %d, %d) give other bits",
                              isa, dtype_name(t), n_out, n_in, n, s2, d, k, st, pf, rk);
                    }
            cpu_set_gemv_streams(st), cpu_set_gemv_pfd(pf), cpu_set_gemv_pfd_batch(pb), cpu_set_gemv_rows(rk);
            free(y2);
        }
        if (n > 1 && n < 8) { /* decode of n sequences: each row's bits as decoded alone */
            float *y1 = kiln_malloc(sizeof(float) * (size_t)n_out);
            int same = 1;
            for (int tt = 0; tt < n; tt++) {
                be->matmul(be, y1, x + (size_t)tt * n_in, &q, 1);
                same &= memcmp(y1, y + (size_t)tt * n_out, sizeof(float) * (size_t)n_out) == 0;
            }
            CHECK(same, "%s matmul %s %dx%d n=%d: a row differs from the same row alone", isa, dtype_name(t), n_out, n_in, n);
            free(y1);
        }
        free(x), free(y), free(ref);
    }
    /* the dot products qmatmul.c uses: 1..4 rows at once */
    cpu_dot_fn dot = cpu_dot_for(t);
    float *xs = kiln_malloc(sizeof(float) * 4 * (size_t)n_in);
    for (int i = 0; i < 4 * n_in; i++) xs[i] = kiln_rng_normal(r);
    const float *xp[4] = {xs, xs + n_in, xs + 2 * n_in, xs + 3 * n_in};
    for (int nx = 1; nx <= 4; nx++) {
        float o[4];
        double ref[4];
        dot(w, xp, nx, n_in, o);
        for (int j = 0; j < nx; j++) {
            double mag = 0;
            ref[j] = 0;
            for (int i = 0; i < n_in; i++) ref[j] += wf[i] * xp[j][i], mag += fabs(wf[i] * xp[j][i]);
            /* f32 sums in any order: within a few ulp of the sum of magnitudes */
            CHECK(fabs(o[j] - ref[j]) <= 1e-6 * mag + 1e-30, "%s dot %s nx=%d row %d: %g vs %g", isa, dtype_name(t), nx, j,
                  o[j], ref[j]);
        }
    }
    free(xs);
    be->release_linear(be, &q);
    free(w), free(wf), free(bias);
}

/* paged attention of a prefill chunk after n_past cached tokens, pages out
 * of order, against a direct double computation */
static void check_attention(struct kiln_backend *be, struct kiln_rng *r, const char *isa, int hd, int P) {
    enum { NH = 4, NKV = 2, PAST = 21, NEW = 19, T = PAST + NEW };
    int n_pages = (T + P - 1) / P + 3;
    struct kv_cache kv = {1, NKV, hd, P, n_pages, KILN_DTYPE_F32, NULL, NULL};
    void *kb = be->alloc(be, sizeof(float) * (size_t)n_pages * NKV * P * hd), *vb = be->alloc(be, sizeof(float) * (size_t)n_pages * NKV * P * hd);
    kv.k = &kb, kv.v = &vb;
    int32_t pages[64];
    for (int i = 0; i < n_pages; i++) pages[i] = n_pages - 1 - i;
    float *k = kiln_malloc(sizeof(float) * T * NKV * hd), *v = kiln_malloc(sizeof(float) * T * NKV * hd);
    float *q = kiln_malloc(sizeof(float) * T * NH * hd), *att = kiln_malloc(sizeof(float) * T * NH * hd);
    for (int i = 0; i < T * NKV * hd; i++) k[i] = kiln_rng_normal(r), v[i] = kiln_rng_normal(r);
    for (int i = 0; i < T * NH * hd; i++) q[i] = kiln_rng_normal(r);
    int32_t toks[T], pos[T];
    for (int i = 0; i < T; i++) toks[i] = 0, pos[i] = i;
    struct kiln_seq_view s1 = {0, PAST, 0, pages, n_pages};
    struct kiln_batch b1 = {PAST, toks, pos, 1, &s1, 0, NULL, NULL, NULL};
    be->kv_write(be, &kv, 0, k, v, &b1);
    struct kiln_seq_view s2 = {0, NEW, PAST, pages, n_pages};
    struct kiln_batch b2 = {NEW, toks + PAST, pos + PAST, 1, &s2, 0, NULL, NULL, NULL};
    be->kv_write(be, &kv, 0, k + PAST * NKV * hd, v + PAST * NKV * hd, &b2);
    float scale = 1.0f / sqrtf((float)hd);
    be->attention(be, att, q + PAST * NH * hd, &kv, 0, &b2, NH, scale);
    float worst = 0;
    for (int i = 0; i < NEW; i++)
        for (int h = 0; h < NH; h++) {
            int t = PAST + i, kh = h / (NH / NKV);
            double sc[T], mx = -1e30, sum = 0;
            for (int j = 0; j <= t; j++) {
                double d = 0;
                for (int c = 0; c < hd; c++) d += (double)q[(t * NH + h) * hd + c] * k[(j * NKV + kh) * hd + c];
                sc[j] = d * scale;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j <= t; j++) sum += (sc[j] = exp(sc[j] - mx));
            for (int c = 0; c < hd; c++) {
                double o = 0;
                for (int j = 0; j <= t; j++) o += sc[j] / sum * v[(j * NKV + kh) * hd + c];
                float d = fabsf((float)o - att[(i * NH + h) * hd + c]);
                worst = d > worst ? d : worst;
            }
        }
    CHECK(worst < 2e-6f, "%s attention hd=%d page=%d: max |delta| %g", isa, hd, P, worst);
    free(k), free(v), free(q), free(att);
    be->free(be, kb), be->free(be, vb);
}

/*
 * The tiled (flash-style) attention against the plain reference
 * (cpu_attention_ref: per row and head, exact softmax, scalar loops) and both
 * against double precision, on one batch of ragged sequences: a fresh
 * prefill long enough for two row blocks, a decode row, chunks after cached
 * prefixes of several pages (one with keys growing along the sequence, so the
 * running max rises tile after tile and the accumulator is rescaled), short
 * chunks on either side of the tiled/row threshold; pages shuffled in one
 * pool. Bound: f32 sums in another order (and the vector exp), so every
 * output is within 1e-5 x the sum of magnitudes sum_j p_j |v_j| it adds up
 * (~1e-5 relative).
 * With a 16-bit cache (kvt F16 or BF16) the keys and values are rounded to
 * it first, so the references see what the cache holds, and the outputs
 * must equal, bit for bit, those over an F32 cache of the rounded values:
 * the rows are widened exactly and the same f32 kernels run.
 */
static void check_attention_tiled(struct kiln_backend *be, struct kiln_rng *r, const char *isa, int hd, int G, int P,
                                  enum kiln_dtype kvt, double *worst_out) {
    enum { NKV = 2, NS = 6 };
    static const int past[NS] = {0, 37, 70, 100, 5, 3};
    static const int nnew[NS] = {150, 1, 45, 3, 9, 40};
    const int NH = NKV * G;
    int n_pages = 0, rows = 0, tot = 0;
    for (int s = 0; s < NS; s++) n_pages += (past[s] + nnew[s] + P - 1) / P, rows += nnew[s], tot += past[s] + nnew[s];
    n_pages += 5;
    struct kv_cache kv = {1, NKV, hd, P, n_pages, kvt, NULL, NULL};
    const size_t kvn = (size_t)n_pages * NKV * P * hd, kvb = (size_t)n_pages * NKV * P * kv_row_bytes(kvt, hd);
    void *kb = be->alloc(be, kvb), *vb = be->alloc(be, kvb);
    memset(kb, 0xff, kvb), memset(vb, 0xff, kvb); /* NaN (a Q8_0 block's scale too): nothing unwritten may be read */
    kv.k = &kb, kv.v = &vb;
    int32_t *perm = kiln_malloc(sizeof(int32_t) * (size_t)n_pages);
    for (int i = 0; i < n_pages; i++) perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int k = (int)(kiln_rng_uniform(r) * (i + 1)), t = perm[i];
        perm[i] = perm[k], perm[k] = t;
    }
    /* every token's k, v (all sequences, [token][NKV][hd]), the new rows' q */
    float *k = kiln_malloc(sizeof(float) * (size_t)tot * NKV * hd), *v = kiln_malloc(sizeof(float) * (size_t)tot * NKV * hd);
    float *q = kiln_malloc(sizeof(float) * (size_t)rows * NH * hd);
    float *o = kiln_malloc(sizeof(float) * (size_t)rows * NH * hd), *oref = kiln_malloc(sizeof(float) * (size_t)rows * NH * hd);
    struct kiln_seq_view sw[NS], sa[NS];
    int32_t *toks = kiln_calloc((size_t)tot, sizeof(int32_t)), *pos = kiln_calloc((size_t)tot, sizeof(int32_t));
    int pg = 0, t0 = 0, r0 = 0;
    for (int s = 0; s < NS; s++) {
        int T = past[s] + nnew[s], np = (T + P - 1) / P;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < NKV * hd; i++) {
                float grow = s == 2 ? 1.0f + t / 80.0f : 1.0f; /* s2: scores grow along the keys */
                k[(size_t)(t0 + t) * NKV * hd + i] = kiln_rng_normal(r) * grow;
                v[(size_t)(t0 + t) * NKV * hd + i] = kiln_rng_normal(r);
            }
        for (int i = 0; i < nnew[s] * NH * hd; i++) q[(size_t)r0 * NH * hd + i] = kiln_rng_normal(r);
        sw[s] = (struct kiln_seq_view){t0, T, 0, perm + pg, np};
        sa[s] = (struct kiln_seq_view){r0, nnew[s], past[s], perm + pg, np};
        pg += np, t0 += T, r0 += nnew[s];
    }
    struct kiln_batch bw = {.n_tokens = tot, .tokens = toks, .pos = pos, .n_seqs = NS, .seqs = sw};
    struct kiln_batch ba = {.n_tokens = rows, .tokens = toks, .pos = pos, .n_seqs = NS, .seqs = sa};
    const float *kin = k, *vin = v; /* what kv_write stores */
    float *kq = NULL, *vq = NULL;
    if (kvt == KILN_DTYPE_Q8_0) {
        /* the cache quantizes the rows as given; k, v become the values it
         * holds, each row through the reference quantizer (quant.c). Key 0
         * of the first sequence: ties (x / d on a half step, d = 1/32, so
         * that its scores stay of the others' size), key 1: zeros (d = 0) */
        for (int i = 0; i < hd; i++) k[i] = (i % 32 == 0 ? 127.0f : (float)(i % 7) - 3.5f) / 32, k[NKV * hd + i] = 0.0f;
        const size_t nb = sizeof(float) * (size_t)tot * NKV * hd;
        kq = kiln_malloc(nb), vq = kiln_malloc(nb);
        memcpy(kq, k, nb), memcpy(vq, v, nb);
        kin = kq, vin = vq;
        uint8_t *blk = kiln_malloc(kv_row_bytes(kvt, hd));
        for (size_t i = 0; i < (size_t)tot * NKV * hd; i += (size_t)hd)
            for (int w = 0; w < 2; w++) {
                float *x = (w ? v : k) + i;
                CHECK(quant_quantize_row(KILN_DTYPE_Q8_0, x, blk, hd) == 0);
                quant_dequant_row(KILN_DTYPE_Q8_0, blk, x, hd);
            }
        free(blk);
    } else if (kvt != KILN_DTYPE_F32) /* the values the cache will hold */
        for (size_t i = 0; i < (size_t)tot * NKV * hd; i++) {
            k[i] = kvt == KILN_DTYPE_F16 ? kiln_f16_to_f32(kiln_f32_to_f16(k[i])) : kiln_bf16_to_f32(kiln_f32_to_bf16(k[i]));
            v[i] = kvt == KILN_DTYPE_F16 ? kiln_f16_to_f32(kiln_f32_to_f16(v[i])) : kiln_bf16_to_f32(kiln_f32_to_bf16(v[i]));
        }
    be->kv_write(be, &kv, 0, kin, vin, &bw);
    free(kq), free(vq);
    const float scale = 1.0f / sqrtf((float)hd);
    memset(o, 0xff, sizeof(float) * (size_t)rows * NH * hd); /* NaN: every output must be written */
    be->attention(be, o, q, &kv, 0, &ba, NH, scale);
    {
        /* the row path's L2 prefetch of the pages ahead (K pages, then the V
         * pass's first ones; here up to 4 pages ahead over 7) moves no bit */
        float *o0 = kiln_malloc(sizeof(float) * (size_t)rows * NH * hd);
        cpu_set_att_pfd(0);
        be->attention(be, o0, q, &kv, 0, &ba, NH, scale);
        cpu_set_att_pfd(ATT_PFD_DEFAULT);
        CHECK(!memcmp(o, o0, sizeof(float) * (size_t)rows * NH * hd), "%s attention hd=%d G=%d page=%d: prefetch changed the output", isa,
              hd, G, P);
        free(o0);
    }
    cpu_attention_ref(be, oref, q, &kv, 0, &ba, NH, scale);
    if (kvt != KILN_DTYPE_F32) {
        struct kv_cache k32 = {1, NKV, hd, P, n_pages, KILN_DTYPE_F32, NULL, NULL};
        void *kb32 = be->alloc(be, sizeof(float) * kvn), *vb32 = be->alloc(be, sizeof(float) * kvn);
        k32.k = &kb32, k32.v = &vb32;
        be->kv_write(be, &k32, 0, k, v, &bw);
        float *o32 = kiln_malloc(sizeof(float) * (size_t)rows * NH * hd);
        be->attention(be, o32, q, &k32, 0, &ba, NH, scale);
        CHECK(!memcmp(o, o32, sizeof(float) * (size_t)rows * NH * hd), "%s attention hd=%d G=%d page=%d: %s cache != F32 cache of its values",
              isa, hd, G, P, dtype_name(kvt));
        cpu_attention_ref(be, o32, q, &k32, 0, &ba, NH, scale);
        CHECK(!memcmp(oref, o32, sizeof(float) * (size_t)rows * NH * hd), "reference attention hd=%d G=%d page=%d: %s cache != F32 cache",
              hd, G, P, dtype_name(kvt));
        free(o32);
        be->free(be, kb32), be->free(be, vb32);
    }
    double worst_ref = 0, worst_dbl = 0, ref_dbl = 0;
    double *sc = kiln_malloc(sizeof(double) * 256);
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < nnew[s]; i++)
            for (int h = 0; h < NH; h++) {
                int row = sa[s].start + i, len = past[s] + i + 1, kh = h / G;
                const float *qr = q + ((size_t)row * NH + h) * hd;
                double mx = -1e300, sum = 0;
                for (int t = 0; t < len; t++) {
                    const float *kr = k + ((size_t)(sw[s].start + t) * NKV + kh) * hd;
                    double d = 0;
                    for (int c = 0; c < hd; c++) d += (double)qr[c] * kr[c];
                    sc[t] = d * scale;
                    mx = sc[t] > mx ? sc[t] : mx;
                }
                for (int t = 0; t < len; t++) sum += (sc[t] = exp(sc[t] - mx));
                for (int c = 0; c < hd; c++) {
                    double ex = 0, mag = 0;
                    for (int t = 0; t < len; t++) {
                        double vv = v[((size_t)(sw[s].start + t) * NKV + kh) * hd + c];
                        ex += sc[t] / sum * vv, mag += sc[t] / sum * fabs(vv);
                    }
                    size_t at = ((size_t)row * NH + h) * hd + c;
                    double e1 = fabs((double)o[at] - oref[at]) / mag, e2 = fabs((double)o[at] - ex) / mag,
                           e3 = fabs((double)oref[at] - ex) / mag;
                    if (!(e1 <= worst_ref)) worst_ref = e1; /* NaN sticks */
                    if (!(e2 <= worst_dbl)) worst_dbl = e2;
                    if (!(e3 <= ref_dbl)) ref_dbl = e3;
                }
            }
    CHECK(worst_ref <= 1e-5, "%s tiled attention hd=%d G=%d page=%d vs reference: %g x magnitude", isa, hd, G, P, worst_ref);
    CHECK(worst_dbl <= 1e-5, "%s tiled attention hd=%d G=%d page=%d vs double: %g x magnitude", isa, hd, G, P, worst_dbl);
    CHECK(ref_dbl <= 1e-5, "reference attention hd=%d G=%d page=%d vs double: %g x magnitude", hd, G, P, ref_dbl);
    if (worst_ref > *worst_out || worst_ref != worst_ref) *worst_out = worst_ref;
    free(sc), free(k), free(v), free(q), free(o), free(oref), free(toks), free(pos), free(perm);
    be->free(be, kb), be->free(be, vb);
}

static void check_swiglu_rope(struct kiln_backend *be, struct kiln_rng *r, const char *isa) {
    /* SwiGLU over the exp's whole range, an odd width (vector tails) */
    enum { W = 1000 + 37 };
    float *g = kiln_malloc(sizeof(float) * W), *u = kiln_malloc(sizeof(float) * W), *o = kiln_malloc(sizeof(float) * W);
    for (int i = 0; i < W; i++) g[i] = -100.0f + 200.0f * i / (W - 1) + 0.01f * kiln_rng_normal(r), u[i] = kiln_rng_normal(r);
    g[0] = -90.0f, g[1] = 90.0f, g[2] = 0.0f, g[3] = 1e-30f;
    be->swiglu(be, o, g, u, 1, W);
    float worst = 0;
    for (int i = 0; i < W; i++) {
        double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        double e = fabs(o[i] - ref) / (fabs(ref) > 1e-30 ? fabs(ref) : 1e-30);
        if (fabs(ref) < 1e-35) e = fabs(o[i] - ref);
        worst = e > worst ? (float)e : worst;
    }
    CHECK(worst < 1e-6f, "%s swiglu: max rel err %g", isa, worst);
    free(g), free(u), free(o);

    /* RoPE at several positions, two batches in a row (the cos/sin table
     * must follow the positions), with the per-head norm */
    enum { HD = 64, NH = 3, NKV = 1, NT = 5 };
    float inv[HD / 2], qn[HD], kn[HD];
    for (int i = 0; i < HD / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / HD);
    for (int i = 0; i < HD; i++) qn[i] = 1 + 0.1f * kiln_rng_normal(r), kn[i] = 1 + 0.1f * kiln_rng_normal(r);
    struct ktensor qnt = {KILN_DTYPE_F32, 1, HD, qn, NULL}, knt = {KILN_DTYPE_F32, 1, HD, kn, NULL};
    char err[256];
    be->prepare_tensor(be, &qnt, err, sizeof err), be->prepare_tensor(be, &knt, err, sizeof err);
    struct rope rp = {HD / 2, inv, 0.9f, NULL};
    be->prepare_rope(be, &rp, err, sizeof err);
    for (int round = 0; round < 2; round++) {
        float q[NT * NH * HD], k[NT * NKV * HD], q0[NT * NH * HD], k0[NT * NKV * HD];
        for (int i = 0; i < NT * NH * HD; i++) q[i] = q0[i] = kiln_rng_normal(r);
        for (int i = 0; i < NT * NKV * HD; i++) k[i] = k0[i] = kiln_rng_normal(r);
        int32_t toks[NT] = {0}, pos[NT];
        for (int i = 0; i < NT; i++) pos[i] = round * 1000 + i * 7;
        struct kiln_seq_view sv = {0, NT, 0, NULL, 0};
        struct kiln_batch b = {NT, toks, pos, 1, &sv, 0, NULL, NULL, NULL};
        be->qk_norm_rope(be, q, k, &qnt, &knt, &rp, &b, NH, NKV, HD, 1e-6f);
        float worst = 0;
        for (int t = 0; t < NT; t++)
            for (int h = 0; h < NH + NKV; h++) {
                const float *src = h < NH ? q0 + (t * NH + h) * HD : k0 + (t * NKV + h - NH) * HD;
                const float *got = h < NH ? q + (t * NH + h) * HD : k + (t * NKV + h - NH) * HD;
                const float *nw = h < NH ? qn : kn;
                double ss = 0, x[HD];
                for (int i = 0; i < HD; i++) ss += (double)src[i] * src[i];
                for (int i = 0; i < HD; i++) x[i] = src[i] / sqrt(ss / HD + 1e-6) * nw[i];
                for (int i = 0; i < HD / 2; i++) {
                    double a = (double)pos[t] * inv[i], c = cos(a) * 0.9, s = sin(a) * 0.9;
                    double r0 = x[i] * c - x[i + HD / 2] * s, r1 = x[i + HD / 2] * c + x[i] * s;
                    float d0 = fabsf((float)r0 - got[i]), d1 = fabsf((float)r1 - got[i + HD / 2]);
                    worst = d0 > worst ? d0 : worst;
                    worst = d1 > worst ? d1 : worst;
                }
            }
        CHECK(worst < 1e-3f, "%s rope round %d: max |delta| %g", isa, round, worst);
    }
    be->release_rope(be, &rp);
    be->release_tensor(be, &qnt), be->release_tensor(be, &knt);
}

/* cpu_parallel_for_split: each item of [0, n) handed out exactly once, at
 * 2 and 3 threads, chunks of 1 to more than a run; `slow` makes every
 * thread but the caller sleep in each chunk, so the caller ends its run
 * early and takes chunks off the back of the others' runs. */
struct split_ctx {
    _Atomic int *hits;
    int64_t n;
    int slow;
    _Atomic int bad;
};

static void split_fn(void *arg, int64_t b, int64_t e, int tid) {
    struct split_ctx *c = arg;
    if (b < 0 || e > c->n || b >= e) atomic_store(&c->bad, 1);
    if (c->slow && tid != 0) usleep(200);
    for (int64_t i = b; i < e && i >= 0 && i < c->n; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void check_split(void) {
    static const int64_t ns[] = {1, 2, 5, 17, 100, 1000, 4099};
    static const int64_t chunks[] = {1, 3, 16, 64, 5000};
    for (int nt = 2; nt <= 3; nt++) {
        char err[256];
        struct kiln_backend *be = backend_create("cpu", nt, err, sizeof err);
        CHECK(be != NULL, "%s", err);
        if (!be) return;
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
            for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++)
                for (int slow = 0; slow < 2; slow++) {
                    const int64_t n = ns[ni];
                    if (slow && n / chunks[ci] > 200) continue; /* keep the sleeps short */
                    struct split_ctx c = {.hits = kiln_calloc((size_t)n, sizeof(_Atomic int)), .n = n, .slow = slow};
                    cpu_parallel_for_split(be, n, chunks[ci], split_fn, &c);
                    int once = 1;
                    for (int64_t i = 0; i < n; i++) once &= atomic_load(&c.hits[i]) == 1;
                    CHECK(once && !atomic_load(&c.bad), "split loop: %d threads, n=%lld, chunk=%lld%s: items not each run once",
                          nt, (long long)n, (long long)chunks[ci], slow ? ", slow workers" : "");
                    free((void *)c.hits);
                }
        be->destroy(be);
    }
}

/* the decode GEMVs' two-stream row order (CPU_FOR_ROWS2, and the quantized
 * kernels' QM_ROWS4 / QM_ROWS1 loops): every row of a chunk exactly once,
 * out[r] from row r, nothing past the end; and cpu_split_chunk's bounds */
#if defined(KILN_X86)
#define ROWV(r) _mm256_set1_ps((float)(r) + 1.0f) /* lanes sum to 8 (r + 1) */
AVX2 static int rows4_bad(int64_t n, int four) {
    float out[48];
    for (int i = 0; i < 48; i++) out[i] = -1;
    if (four) QM_ROWS4(ROWV, n, out);
    else QM_ROWS1(ROWV, n, out);
    int bad = 0;
    for (int64_t r = 0; r < 48; r++) bad += out[r] != (r < n ? 8.0f * (float)(r + 1) : -1.0f);
    return bad;
}
#undef ROWV
#endif

static void check_rows2(void) {
    for (int64_t r0 = 0; r0 < 3; r0++)
        for (int64_t n = 0; n <= 45; n++) {
            int seen[48] = {0}, bad = 0;
            int64_t prev = -1, jumps = 0;
            CPU_FOR_ROWS2(r, r0, r0 + n) {
                if (r < r0 || r >= r0 + n) bad++;
                else seen[r]++;
                jumps += prev >= 0 && r != prev + 1;
                prev = r;
            }
            for (int64_t i = r0; i < r0 + n; i++) bad += seen[i] != 1;
            /* two streams: every step but the last changes stream (n >= 3) */
            CHECK(!bad && (n < 3 || jumps >= n - 2), "CPU_FOR_ROWS2 over [%lld, %lld): %d rows not seen once, %lld stream changes", (long long)r0,
                  (long long)(r0 + n), bad, (long long)jumps);
            /* one stream: the rows in order */
            int64_t want = r0;
            bad = 0;
            CPU_FOR_ROWS(r, r0, r0 + n, 0) bad += r != want++;
            CHECK(!bad && want == r0 + n, "CPU_FOR_ROWS(one stream) over [%lld, %lld): rows out of order or missing", (long long)r0, (long long)(r0 + n));
        }
#if defined(KILN_X86)
    if (cpu_isa_max() >= CPU_ISA_AVX2)
        for (int64_t n = 0; n <= 45; n++) CHECK(!rows4_bad(n, 1) && !rows4_bad(n, 0), "QM_ROWS4 / QM_ROWS1 over %lld rows", (long long)n);
#endif
    char err[256];
    struct kiln_backend *be = backend_create("cpu", 2, err, sizeof err);
    CHECK(be != NULL, "%s", err);
    if (!be) return;
    /* ~256 KiB of rows, at most half a thread's run, never 0 */
    CHECK(cpu_split_chunk(be, 151936, 576) == (256 << 10) / 576, "%lld", (long long)cpu_split_chunk(be, 151936, 576));
    CHECK(cpu_split_chunk(be, 2048, 576) == 455, "%lld", (long long)cpu_split_chunk(be, 2048, 576));
    CHECK(cpu_split_chunk(be, 1024, 576) == 256 && cpu_split_chunk(be, 1, 576) == 1 && cpu_split_chunk(be, 100, 0) == 25);
    be->destroy(be);
}

/* activations quantized to int8 blocks (qm_quant_token at this ISA: AVX2 /
 * NEON vector code) give the scalar qm_quantize_act's blocks bit for bit:
 * codes, d and code sum, row-major and in a GEMM's tiles of 4 tokens, on
 * normal values of several scales, an all-zero block and blocks of exact
 * halves (x / d = k + 0.5: rounded to even) */
static void check_quant_act(struct kiln_rng *r, const char *isa) {
    enum { K = 256, N = 5, NB = K / 32 };
    float *x = kiln_malloc(sizeof(float) * N * K);
    struct q8a *ref = kiln_malloc(sizeof(struct q8a) * N * NB), *got = kiln_malloc(sizeof(struct q8a) * 8 * NB);
    for (int i = 0; i < N * K; i++) x[i] = kiln_rng_normal(r) * (i / 32 % 3 == 0 ? 1e-3f : i / 32 % 3 == 1 ? 1.0f : 300.0f);
    for (int i = 0; i < 32; i++) x[64 + i] = 0;                                                  /* token 0, block 2: zeros */
    for (int i = 0; i < 32; i++) x[K + 32 + i] = i == 5 ? 127.0f : (float)((i % 9) - 4) + 0.5f; /* token 1, block 1: d = 1, halves */
    for (int i = 0; i < 32; i++) x[2 * K + i] = i == 0 ? -12.7f : 0.05f * (float)(i - 16);       /* token 2, block 0: d = 0.1 */
    for (int t = 0; t < N; t++) qm_quantize_act(x + (size_t)t * K, ref + (size_t)t * NB, K);
    for (int nt = 0; nt <= 4; nt += 4) {
        memset(got, 0x55, sizeof(struct q8a) * 8 * NB);
        for (int t = 0; t < (nt ? 8 : N); t++) qm_quant_token(x, got, t, N, K, nt, cpu_isa());
        int bad = 0;
        for (int t = 0; t < N; t++)
            for (int b = 0; b < NB; b++) {
                const struct q8a *g = nt ? &got[((size_t)(t / nt) * NB + b) * nt + t % nt] : &got[(size_t)t * NB + b];
                bad += memcmp(g, &ref[(size_t)t * NB + b], sizeof *g) != 0;
            }
        CHECK(bad == 0, "%s activation quantization (tiles of %d): %d of %d blocks differ from the scalar", isa, nt, bad, N * NB);
        if (nt) { /* the padding tokens of the last tile are zero blocks */
            const struct q8a *pad = &got[((size_t)(7 / nt) * NB) * nt + 7 % nt];
            CHECK(pad->d == 0 && pad->sum == 0 && pad->qs[0] == 0 && pad->qs[31] == 0, "%s: padding token not zeroed", isa);
        }
    }
    CHECK(ref[NB + 1].qs[0] == -4 && ref[NB + 1].qs[1] == -2 && ref[NB + 1].qs[2] == -2 && ref[NB + 1].qs[5] == 127,
          "scalar reference: halves not rounded to even (%d %d %d)", ref[NB + 1].qs[0], ref[NB + 1].qs[1], ref[NB + 1].qs[2]);
    free(x), free(ref), free(got);
}

void test_cpukernels(void) {
    check_split();
    check_rows2();
    char err[256];
    struct kiln_backend *be = backend_create("cpu", 2, err, sizeof err);
    CHECK(be != NULL, "%s", err);
    if (!be) return;
    int saved = cpu_isa();
    for (int isa = CPU_ISA_SCALAR; isa <= CPU_ISA_LAST; isa++) {
        if (isa > cpu_isa_max()) {
            fprintf(stderr, "  %s: not on this CPU\n", cpu_isa_name(isa));
            test_skip(cpu_isa_name(isa));
            continue;
        }
        CHECK(cpu_set_isa(isa) == isa);
        const char *name = cpu_isa_name(isa);
        struct kiln_rng r;
        kiln_rng_seed(&r, 7 + isa);
        enum kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_F16};
        /* (n_out, n_in); 700 x 96: the decode GEMV in runs per thread with stealing; 45 x 2053: rows of 4 KiB
         * and more (with n_out odd: a pass of pairs leaves a row) */
        static const int shapes[][2] = {{1, 5}, {37, 83}, {77, 130}, {33, 1}, {64, 256}, {96, 203}, {700, 96}, {45, 2053}};
        for (int ti = 0; ti < 3; ti++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                check_matmul(be, &r, name, types[ti], shapes[si][0], shapes[si][1], (int)(si & 1));
        check_attention(be, &r, name, 128, 16);
        check_attention(be, &r, name, 40, 4);
        check_attention(be, &r, name, 8, 3);
        {
            static const int gs[] = {1, 2, 3, 4, 8};
            double worst = 0;
            for (int hi = 0; hi < 2; hi++)
                for (size_t gi = 0; gi < sizeof gs / sizeof gs[0]; gi++)
                    check_attention_tiled(be, &r, name, hi ? 128 : 64, gs[gi], hi ? 16 : 5, KILN_DTYPE_F32, &worst);
            fprintf(stderr, "  %s tiled attention: worst |tiled - reference| = %.2g x sum p|v|\n", name, worst);
            /* 16-bit caches (--kv-dtype): row and tiled paths, a page smaller and larger than a key tile */
            check_attention_tiled(be, &r, name, 128, 4, 16, KILN_DTYPE_F16, &worst);
            check_attention_tiled(be, &r, name, 64, 2, 5, KILN_DTYPE_F16, &worst);
            check_attention_tiled(be, &r, name, 128, 1, 64, KILN_DTYPE_BF16, &worst);
            check_attention_tiled(be, &r, name, 64, 8, 5, KILN_DTYPE_BF16, &worst);
            /* the row path's head_dim-128 loops take a KV group's heads 4 at
             * a time: groups of 2, 3, 5 (4 + 1) and 8 (4 + 4) */
            check_attention_tiled(be, &r, name, 128, 2, 16, KILN_DTYPE_F16, &worst);
            check_attention_tiled(be, &r, name, 128, 3, 16, KILN_DTYPE_BF16, &worst);
            check_attention_tiled(be, &r, name, 128, 5, 16, KILN_DTYPE_F16, &worst);
            check_attention_tiled(be, &r, name, 128, 8, 32, KILN_DTYPE_BF16, &worst);
            /* Q8_0 caches: the grouped kernels at both head sizes, the
             * generic loops (head_dim 96), pages shorter than a key tile */
            check_attention_tiled(be, &r, name, 128, 2, 16, KILN_DTYPE_Q8_0, &worst);
            check_attention_tiled(be, &r, name, 128, 5, 64, KILN_DTYPE_Q8_0, &worst);
            check_attention_tiled(be, &r, name, 64, 4, 5, KILN_DTYPE_Q8_0, &worst);
            check_attention_tiled(be, &r, name, 96, 3, 16, KILN_DTYPE_Q8_0, &worst);
            /* AVX-512 takes up to 8 heads a pass: every group size from 5 to 8 */
            check_attention_tiled(be, &r, name, 64, 6, 16, KILN_DTYPE_Q8_0, &worst);
            check_attention_tiled(be, &r, name, 128, 7, 16, KILN_DTYPE_F16, &worst);
            check_attention_tiled(be, &r, name, 64, 8, 32, KILN_DTYPE_Q8_0, &worst);
        }
        check_swiglu_rope(be, &r, name);
        check_quant_act(&r, name);
    }
    cpu_set_isa(saved);
    be->destroy(be);
}
