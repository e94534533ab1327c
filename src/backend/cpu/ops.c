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

static inline void norm_row(float *out, const float *x, const float *w, int dim, float eps) {
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / dim) + eps);
    for (int i = 0; i < dim; i++) out[i] = w[i] * (x[i] * r);
}

static void rmsnorm_rows(void *arg, int64_t b, int64_t e, int tid) {
    (void)tid;
    const struct row_job *j = arg;
    for (int64_t i = b; i < e; i++) norm_row(j->out + (size_t)i * j->dim, j->y + (size_t)i * j->dim, j->w, j->dim, j->eps);
}

static void cpu_rmsnorm(struct kiln_backend *be, void *out, const void *x, const struct ktensor *w, int n, int dim, float eps) {
    struct row_job j = {.out = out, .y = x, .w = cpu_vec(w), .dim = dim, .eps = eps};
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
        norm_row(j->out + (size_t)i * dim, xr, j->w, dim, j->eps);
    }
}

static void cpu_add_rmsnorm(struct kiln_backend *be, void *x, void *out, const void *y, const struct ktensor *w, int n,
                            int dim, float eps) {
    struct row_job j = {.out = out, .x = x, .y = y, .w = cpu_vec(w), .dim = dim, .eps = eps};
    cpu_parallel_for(be, n, rows_chunk(dim), add_rmsnorm_rows, &j);
}

/* one head vector: optional RMSNorm, then rotate pairs (i, i + half) by
 * the angles' cos cs[i] and sin cs[half + i] */
static inline void head_norm_rope(float *h, const float *nw, const float *cs, int hd, float eps) {
    if (nw) norm_row(h, h, nw, hd, eps);
    int half = hd / 2;
    const float *cv = cs, *sv = cs + half;
    for (int i = 0; i < half; i++) {
        float a = h[i], bb = h[i + half];
        h[i] = a * cv[i] - bb * sv[i];
        h[i + half] = bb * cv[i] + a * sv[i];
    }
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
    if (need > c->rope_cap) {
        free(c->rope_cs);
        c->rope_cs = kiln_malloc(sizeof(float) * need);
        c->rope_cap = need;
    }
    if ((size_t)b->n_tokens > c->rope_pos_cap) {
        free(c->rope_pos);
        c->rope_pos = kiln_malloc(sizeof(int32_t) * (size_t)b->n_tokens);
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
        for (int h = 0; h < j->n_head; h++) head_norm_rope(j->q + ((size_t)i * j->n_head + h) * hd, j->qw, c, hd, j->eps);
        for (int h = 0; h < j->n_head_kv; h++) head_norm_rope(j->k + ((size_t)i * j->n_head_kv + h) * hd, j->kw, c, hd, j->eps);
    }
}

static void cpu_qk_norm_rope(struct kiln_backend *be, void *q_, void *k_, const struct ktensor *qn, const struct ktensor *kn,
                             const struct rope *rope, const struct kiln_batch *b, int n_head, int n_head_kv, int head_dim,
                             float eps) {
    struct row_job j = {.q = q_, .k = k_, .qw = qn ? cpu_vec(qn) : NULL, .kw = kn ? cpu_vec(kn) : NULL,
                        .cs = rope_table(be, rope, b, head_dim), .n_head = n_head, .n_head_kv = n_head_kv, .hd = head_dim,
                        .eps = eps};
    cpu_parallel_for(be, b->n_tokens, rows_chunk((int64_t)(n_head + n_head_kv) * head_dim), qk_norm_rope_rows, &j);
}

static void swiglu_scalar(float *out, const float *g, const float *u, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

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
    struct swiglu_job j = {.out = out, .g = gate, .u = up, .total = (size_t)n * ffn};
    j.fn = isa == CPU_ISA_AVX512 ? swiglu_avx512 : isa == CPU_ISA_AVX2 ? swiglu_avx2 : swiglu_scalar;
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
