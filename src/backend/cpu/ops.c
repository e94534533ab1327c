/*
 * ops.c: the CPU backend's elementwise and per-row ops: embedding lookup,
 * RMSNorm (plain and fused with the residual add), per-head q/k RMSNorm with
 * RoPE, SwiGLU, add, row gather. Rows are independent, so each op hands
 * runs of rows to the worker pool (cpu.c); an op smaller than PAR_MIN
 * elements (decode's single rows) runs on the caller. Norm statistics
 * accumulate in double and round once, which keeps them within an ulp of
 * torch's f32.
 *
 * RoPE's cos/sin (times attn_factor) are computed once per forward for the
 * batch's positions (the first qk_norm_rope of a forward fills a table in
 * the backend context, keyed by the positions themselves; the other layers
 * reuse it), not per head and layer.
 * SwiGLU's exp is the vector exp of simd.h on AVX2/AVX-512 (libm's expf on
 * the scalar path).
 */
#include <math.h>

#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/simd.h"
#include "base/base.h"
#include "format/quant.h"

/* below this many elements an op runs on the calling thread: handing work
 * to the pool costs more than the work (decode's 1-row ops) */
enum { PAR_MIN = 16384 };

/* rows per chunk so that a chunk has about PAR_MIN elements */
static int64_t rows_chunk(int64_t width) { return width >= PAR_MIN ? 1 : PAR_MIN / (width > 0 ? width : 1); }

typedef void (*norm_fn)(float *out, const float *x, const float *w, int dim, float eps);
typedef void (*rope_fn)(float *h, const float *cs, int hd);

/* the arguments of one row op, for the pool's range functions */
struct row_job {
    float *out, *x;
    const float *y, *w, *cs;
    const void *src;
    const int32_t *ids;
    enum kiln_dtype dt;
    size_t rb;
    int dim, n_head, n_head_kv, hd;
    float eps;
    const float *qw, *kw;
    float *q, *k;
    norm_fn norm;
    rope_fn rope;
};

static void embed_rows(void *arg, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct row_job *j = arg;
    for (int64_t i = b; i < e; i++)
        cpu_row_to_f32(j->out + (size_t)i * j->dim, (const uint8_t *)j->src + (size_t)j->ids[i] * j->rb, j->dt, j->dim);
}

static void cpu_embed(struct kiln_backend *be, void *x, const struct ktensor *table, const struct kiln_batch *b) {
    struct row_job j = {.out = x, .src = table->data, .ids = b->tokens, .dt = table->dtype, .dim = (int)table->cols};
    j.rb = quant_row_bytes(table->dtype, j.dim); /* plain dtypes and GGUF blocks alike */
    cpu_parallel_for(be, b->n_tokens, rows_chunk(j.dim), embed_rows, &j);
}

/* RMSNorm of one row: sum of squares in double (each square is exact in
 * double), r = 1 / sqrt(mean + eps) in f32, out = w * (x * r). The vector
 * paths sum the squares in 8 (AVX2: 4 + 4) double lanes, then across them:
 * the same exact products, added in another order (in double, far below
 * f32's rounding); the products with r and w are the same f32 operations. */
static void norm_row_scalar(float *out, const float *x, const float *w, int dim, float eps) {
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / dim) + eps);
    for (int i = 0; i < dim; i++) out[i] = w[i] * (x[i] * r);
}

#if defined(KILN_X86)
KILN_AVX2 static void norm_row_avx2(float *out, const float *x, const float *w, int dim, float eps) {
    __m256d a0 = _mm256_setzero_pd(), a1 = a0;
    int i = 0;
    for (; i + 8 <= dim; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0), a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    double l[4];
    _mm256_storeu_pd(l, _mm256_add_pd(a0, a1));
    double ss = (l[0] + l[1]) + (l[2] + l[3]);
    for (int k = i; k < dim; k++) ss += (double)x[k] * x[k];
    float r = 1.0f / sqrtf((float)(ss / dim) + eps);
    const __m256 rv = _mm256_set1_ps(r);
    for (i = 0; i + 8 <= dim; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), rv)));
    for (; i < dim; i++) out[i] = w[i] * (x[i] * r);
}

KILN_AVX512 static void norm_row_avx512(float *out, const float *x, const float *w, int dim, float eps) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    for (int i = 0; i < dim; i += 16) {
        __mmask16 m = dim - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (dim - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i); /* lanes past the end are 0: they add nothing */
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v)), hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a0 = _mm512_fmadd_pd(lo, lo, a0), a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    float r = 1.0f / sqrtf((float)(ss / dim) + eps);
    const __m512 rv = _mm512_set1_ps(r);
    for (int i = 0; i < dim; i += 16) {
        __mmask16 m = dim - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (dim - i)) - 1);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), rv)));
    }
}

#endif

#if defined(KILN_NEON)
/* NEON: the squares summed in 8 double lanes (4 x 2), as the AVX2 path */
static void norm_row_neon(float *out, const float *x, const float *w, int dim, float eps) {
    float64x2_t a0 = vdupq_n_f64(0), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 8 <= dim; i += 8) {
        float32x4_t v0 = vld1q_f32(x + i), v1 = vld1q_f32(x + i + 4);
        float64x2_t d0 = vcvt_f64_f32(vget_low_f32(v0)), d1 = vcvt_high_f64_f32(v0);
        float64x2_t d2 = vcvt_f64_f32(vget_low_f32(v1)), d3 = vcvt_high_f64_f32(v1);
        a0 = vfmaq_f64(a0, d0, d0), a1 = vfmaq_f64(a1, d1, d1), a2 = vfmaq_f64(a2, d2, d2), a3 = vfmaq_f64(a3, d3, d3);
    }
    double ss = vaddvq_f64(vaddq_f64(vaddq_f64(a0, a1), vaddq_f64(a2, a3)));
    for (int k = i; k < dim; k++) ss += (double)x[k] * x[k];
    float r = 1.0f / sqrtf((float)(ss / dim) + eps);
    const float32x4_t rv = vdupq_n_f32(r);
    for (i = 0; i + 4 <= dim; i += 4) vst1q_f32(out + i, vmulq_f32(vld1q_f32(w + i), vmulq_f32(vld1q_f32(x + i), rv)));
    for (; i < dim; i++) out[i] = w[i] * (x[i] * r);
}
#endif

static norm_fn norm_for(void) {
    int isa = cpu_isa();
    cpu_isa_note(isa, 0);
#if defined(KILN_X86)
    return isa == CPU_ISA_AVX512 ? norm_row_avx512 : isa == CPU_ISA_AVX2 ? norm_row_avx2 : norm_row_scalar;
#elif defined(KILN_NEON)
    return isa >= CPU_ISA_NEON ? norm_row_neon : norm_row_scalar;
#else
    return (void)isa, norm_row_scalar;
#endif
}

static void rmsnorm_rows(void *arg, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct row_job *j = arg;
    for (int64_t i = b; i < e; i++) j->norm(j->out + (size_t)i * j->dim, j->y + (size_t)i * j->dim, j->w, j->dim, j->eps);
}

static void cpu_rmsnorm(struct kiln_backend *be, void *out, const void *x, const struct ktensor *w, int n, int dim, float eps) {
    struct row_job j = {.out = out, .y = x, .w = cpu_vec(w), .dim = dim, .eps = eps, .norm = norm_for()};
    cpu_parallel_for(be, n, rows_chunk(dim), rmsnorm_rows, &j);
}

/* out may alias y: each row finishes x += y before out is written */
static void add_rmsnorm_rows(void *arg, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct row_job *j = arg;
    const int dim = j->dim;
    for (int64_t i = b; i < e; i++) {
        float *xr = j->x + (size_t)i * dim;
        const float *yr = j->y + (size_t)i * dim;
        for (int c = 0; c < dim; c++) xr[c] += yr[c];
        j->norm(j->out + (size_t)i * dim, xr, j->w, dim, j->eps);
    }
}

static void cpu_add_rmsnorm(struct kiln_backend *be, void *x, void *out, const void *y, const struct ktensor *w, int n,
                            int dim, float eps) {
    struct row_job j = {.out = out, .x = x, .y = y, .w = cpu_vec(w), .dim = dim, .eps = eps, .norm = norm_for()};
    cpu_parallel_for(be, n, rows_chunk(dim), add_rmsnorm_rows, &j);
}

/* RoPE of one head vector: rotate pairs (i, i + half) by the angles' cos
 * cs[i] and sin cs[half + i]; the vector path does the same f32 products
 * and sums (a c - b s, b c + a s; no FMA), so it is bit-identical */
/* rotates the pairs (i, i + half) for i in [i0, half): the scalar kernel,
 * and the tail the vector kernels leave */
static void rope_pairs(float *h, const float *cv, const float *sv, int half, int i0) {
    for (int i = i0; i < half; i++) {
        float a = h[i], bb = h[i + half];
        h[i] = a * cv[i] - bb * sv[i];
        h[i + half] = bb * cv[i] + a * sv[i];
    }
}

static void rope_scalar(float *h, const float *cs, int hd) { rope_pairs(h, cs, cs + hd / 2, hd / 2, 0); }

#if defined(KILN_X86)
KILN_AVX512 static void rope_avx512(float *h, const float *cs, int hd) {
    const int half = hd / 2;
    const float *cv = cs, *sv = cs + half;
    for (int i = 0; i < half; i += 16) {
        __mmask16 m = half - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (half - i)) - 1);
        __m512 a = _mm512_maskz_loadu_ps(m, h + i), b = _mm512_maskz_loadu_ps(m, h + half + i);
        __m512 c = _mm512_maskz_loadu_ps(m, cv + i), sn = _mm512_maskz_loadu_ps(m, sv + i);
        _mm512_mask_storeu_ps(h + i, m, _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, sn)));
        _mm512_mask_storeu_ps(h + half + i, m, _mm512_add_ps(_mm512_mul_ps(b, c), _mm512_mul_ps(a, sn)));
    }
}

KILN_AVX2 static void rope_avx2(float *h, const float *cs, int hd) {
    const int half = hd / 2;
    const float *cv = cs, *sv = cs + half;
    int i = 0;
    for (; i + 8 <= half; i += 8) {
        __m256 a = _mm256_loadu_ps(h + i), b = _mm256_loadu_ps(h + half + i), c = _mm256_loadu_ps(cv + i), sn = _mm256_loadu_ps(sv + i);
        _mm256_storeu_ps(h + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, sn)));
        _mm256_storeu_ps(h + half + i, _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, sn)));
    }
    rope_pairs(h, cv, sv, half, i);
}

#endif

#if defined(KILN_NEON)
static void rope_neon(float *h, const float *cs, int hd) {
    const int half = hd / 2;
    const float *cv = cs, *sv = cs + half;
    int i = 0;
    for (; i + 4 <= half; i += 4) {
        float32x4_t a = vld1q_f32(h + i), b = vld1q_f32(h + half + i), c = vld1q_f32(cv + i), sn = vld1q_f32(sv + i);
        vst1q_f32(h + i, vsubq_f32(vmulq_f32(a, c), vmulq_f32(b, sn)));
        vst1q_f32(h + half + i, vaddq_f32(vmulq_f32(b, c), vmulq_f32(a, sn)));
    }
    rope_pairs(h, cv, sv, half, i);
}
#endif

/* one head vector: optional RMSNorm, then RoPE */
static inline void head_norm_rope(const struct row_job *j, float *h, const float *nw, const float *cs) {
    if (nw) j->norm(h, h, nw, j->hd, j->eps);
    j->rope(h, cs, j->hd);
}

/* the cos/sin table of this forward's positions: [n_tokens][cos half | sin half] */
static const float *rope_table(struct kiln_backend *be, const struct rope *rope, const struct kiln_batch *b, int head_dim) {
    struct cpu_ctx *c = be->ctx;
    int half = head_dim / 2;
    size_t need = (size_t)b->n_tokens * head_dim;
    /* valid while the rope, the width and the positions are the same (the
     * layers of one forward); positions are compared, not trusted */
    if (c->rope_of == rope && c->rope_hd == head_dim && c->rope_n == b->n_tokens &&
        !memcmp(c->rope_pos, b->pos, sizeof(int32_t) * (size_t)b->n_tokens))
        return c->rope_cs;
    c->rope_of = NULL; /* valid again once filled below */
    if (need > c->rope_cap) {
        free(c->rope_cs);
        c->rope_cap = 0;
        if (!(c->rope_cs = cpu_scratch_alloc(be, sizeof(float) * need))) return NULL; /* reported by cpu_error */
        c->rope_cap = need;
    }
    if ((size_t)b->n_tokens > c->rope_pos_cap) {
        free(c->rope_pos);
        c->rope_pos_cap = 0;
        if (!(c->rope_pos = cpu_scratch_alloc(be, sizeof(int32_t) * (size_t)b->n_tokens))) return NULL;
        c->rope_pos_cap = (size_t)b->n_tokens;
    }
    const float *inv = rope->be;
    float af = rope->attn_factor;
    float *cs = c->rope_cs;
    for (int t = 0; t < b->n_tokens; t++) {
        float pos = (float)b->pos[t];
        float *row = cs + (size_t)t * head_dim;
        for (int i = 0; i < half; i++) {
            float ang = pos * inv[i];
            row[i] = cosf(ang) * af;
            row[half + i] = sinf(ang) * af;
        }
    }
    memcpy(c->rope_pos, b->pos, sizeof(int32_t) * (size_t)b->n_tokens);
    c->rope_n = b->n_tokens;
    c->rope_hd = head_dim;
    c->rope_of = rope;
    return cs;
}

static void qk_norm_rope_rows(void *arg, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct row_job *j = arg;
    const int hd = j->hd;
    for (int64_t i = b; i < e; i++) {
        const float *c = j->cs + (size_t)i * hd;
        for (int h = 0; h < j->n_head; h++) head_norm_rope(j, j->q + ((size_t)i * j->n_head + h) * hd, j->qw, c);
        for (int h = 0; h < j->n_head_kv; h++) head_norm_rope(j, j->k + ((size_t)i * j->n_head_kv + h) * hd, j->kw, c);
    }
}

static void cpu_qk_norm_rope(struct kiln_backend *be, void *q_, void *k_, const struct ktensor *qn, const struct ktensor *kn,
                             const struct rope *rope, const struct kiln_batch *b, int n_head, int n_head_kv, int head_dim,
                             float eps) {
    struct row_job j = {.q = q_, .k = k_, .qw = qn ? cpu_vec(qn) : NULL, .kw = kn ? cpu_vec(kn) : NULL,
                        .cs = rope_table(be, rope, b, head_dim), .n_head = n_head, .n_head_kv = n_head_kv, .hd = head_dim,
                        .eps = eps, .norm = norm_for()};
    const int isa = cpu_isa();
    cpu_isa_note(isa, 0);
#if defined(KILN_X86)
    j.rope = isa == CPU_ISA_AVX512 ? rope_avx512 : isa == CPU_ISA_AVX2 ? rope_avx2 : rope_scalar;
#elif defined(KILN_NEON)
    j.rope = isa >= CPU_ISA_NEON ? rope_neon : rope_scalar;
#else
    j.rope = (void)isa, rope_scalar;
#endif
    if (j.cs) cpu_parallel_for(be, b->n_tokens, rows_chunk((int64_t)(n_head + n_head_kv) * head_dim), qk_norm_rope_rows, &j);
}

static void swiglu_scalar(float *out, const float *g, const float *u, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

#if defined(KILN_X86)
KILN_AVX2 static void swiglu_avx2(float *out, const float *g, const float *u, size_t n) {
    size_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 d = _mm256_add_ps(one, kiln_exp8(_mm256_sub_ps(zero, gv)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(gv, d), _mm256_loadu_ps(u + i)));
    }
    swiglu_scalar(out + i, g + i, u + i, n - i);
}

KILN_AVX512 static void swiglu_avx512(float *out, const float *g, const float *u, size_t n) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
        __m512 d = _mm512_add_ps(one, kiln_exp16(_mm512_sub_ps(zero, gv)));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(gv, d), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

#endif

#if defined(KILN_NEON)
static void swiglu_neon(float *out, const float *g, const float *u, size_t n) {
    size_t i = 0;
    const float32x4_t one = vdupq_n_f32(1.0f);
    for (; i + 4 <= n; i += 4) {
        float32x4_t gv = vld1q_f32(g + i);
        float32x4_t d = vaddq_f32(one, kiln_exp4(vnegq_f32(gv)));
        vst1q_f32(out + i, vmulq_f32(vdivq_f32(gv, d), vld1q_f32(u + i)));
    }
    swiglu_scalar(out + i, g + i, u + i, n - i);
}
#endif

struct swiglu_job {
    float *out;
    const float *g, *u;
    size_t total;
    void (*fn)(float *, const float *, const float *, size_t);
};

static void swiglu_range(void *arg, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct swiglu_job *j = arg;
    size_t b0 = (size_t)b * 16, e0 = (size_t)e * 16 < j->total ? (size_t)e * 16 : j->total;
    j->fn(j->out + b0, j->g + b0, j->u + b0, e0 - b0);
}

static void cpu_swiglu(struct kiln_backend *be, void *out, const void *gate, const void *up, int n, int ffn) {
    int isa = cpu_isa();
    cpu_isa_note(isa, 0);
    struct swiglu_job j = {.out = out, .g = gate, .u = up, .total = (size_t)n * ffn};
#if defined(KILN_X86)
    j.fn = isa == CPU_ISA_AVX512 ? swiglu_avx512 : isa == CPU_ISA_AVX2 ? swiglu_avx2 : swiglu_scalar;
#elif defined(KILN_NEON)
    j.fn = isa >= CPU_ISA_NEON ? swiglu_neon : swiglu_scalar;
#else
    j.fn = (void)isa, swiglu_scalar;
#endif
    cpu_parallel_for(be, (int64_t)((j.total + 15) / 16), PAR_MIN / 16, swiglu_range, &j);
}

struct add_job {
    float *x;
    const float *y;
    size_t n;
};

static void add_range(void *arg, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct add_job *j = arg;
    size_t e0 = (size_t)e * 16 < j->n ? (size_t)e * 16 : j->n;
    for (size_t i = (size_t)b * 16; i < e0; i++) j->x[i] += j->y[i];
}

static void cpu_add(struct kiln_backend *be, void *x, const void *y, size_t n) {
    struct add_job j = {x, y, n};
    cpu_parallel_for(be, (int64_t)((n + 15) / 16), PAR_MIN / 16, add_range, &j);
}

static void cpu_gather_rows(struct kiln_backend *be, void *out, const void *x, const int32_t *rows, int n_rows, int dim) {
    (void)be;
    for (int i = 0; i < n_rows; i++)
        memmove((float *)out + (size_t)i * dim, (const float *)x + (size_t)rows[i] * dim, (size_t)dim * 4);
}

void cpu_ops_install(struct kiln_backend *be);
void cpu_ops_install(struct kiln_backend *be) {
    be->embed = cpu_embed;
    be->rmsnorm = cpu_rmsnorm;
    be->add_rmsnorm = cpu_add_rmsnorm;
    be->qk_norm_rope = cpu_qk_norm_rope;
    be->swiglu = cpu_swiglu;
    be->add = cpu_add;
    be->gather_rows = cpu_gather_rows;
}
