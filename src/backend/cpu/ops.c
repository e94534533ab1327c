/*
 * ops.c: the CPU backend's elementwise and per-row ops: embedding lookup,
 * RMSNorm (plain and fused with the residual add), per-head q/k RMSNorm with
 * RoPE, SwiGLU, add, row gather. Rows are independent, so each op is an
 * OpenMP loop over rows (or row x head). Norm statistics accumulate in
 * double and round once, which keeps them within an ulp of torch's f32.
 */
#include <math.h>

#include "backend/cpu/cpu.h"
#include "base/base.h"

static void cpu_embed(struct kiln_backend *be, void *x_, const struct ktensor *table, const struct kiln_batch *b) {
    (void)be;
    float *x = x_;
    const int64_t dim = table->cols;
    const size_t rb = (size_t)dim * dtype_size(table->dtype);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < b->n_tokens; i++)
        cpu_row_to_f32(x + (size_t)i * dim, (const uint8_t *)table->data + (size_t)b->tokens[i] * rb, table->dtype, dim);
}

static inline void norm_row(float *out, const float *x, const float *w, int dim, float eps) {
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / dim) + eps);
    for (int i = 0; i < dim; i++) out[i] = w[i] * (x[i] * r);
}

static void cpu_rmsnorm(struct kiln_backend *be, void *out, const void *x, const struct ktensor *w, int n, int dim, float eps) {
    (void)be;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) norm_row((float *)out + (size_t)i * dim, (const float *)x + (size_t)i * dim, cpu_vec(w), dim, eps);
}

/* out may alias y: each row finishes x += y before out is written */
static void cpu_add_rmsnorm(struct kiln_backend *be, void *x_, void *out, const void *y_, const struct ktensor *w, int n,
                            int dim, float eps) {
    (void)be;
    float *x = x_;
    const float *y = y_;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        float *xr = x + (size_t)i * dim;
        const float *yr = y + (size_t)i * dim;
        for (int j = 0; j < dim; j++) xr[j] += yr[j];
        norm_row((float *)out + (size_t)i * dim, xr, cpu_vec(w), dim, eps);
    }
}

/* one head vector: optional RMSNorm, then rotate pairs (i, i + half) */
static inline void head_norm_rope(float *h, const float *nw, const float *inv_freq, float af, int hd, float pos, float eps) {
    if (nw) norm_row(h, h, nw, hd, eps);
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float ang = pos * inv_freq[i];
        float c = cosf(ang) * af, s = sinf(ang) * af;
        float a = h[i], bb = h[i + half];
        h[i] = a * c - bb * s;
        h[i + half] = bb * c + a * s;
    }
}

static void cpu_qk_norm_rope(struct kiln_backend *be, void *q_, void *k_, const struct ktensor *qn, const struct ktensor *kn,
                             const struct rope *rope, const struct kiln_batch *b, int n_head, int n_head_kv, int head_dim,
                             float eps) {
    (void)be;
    float *q = q_, *k = k_;
    const float *qw = qn ? cpu_vec(qn) : NULL, *kw = kn ? cpu_vec(kn) : NULL;
    const float *inv = rope->be;
    int nh = n_head + n_head_kv;
#pragma omp parallel for schedule(static) collapse(2)
    for (int i = 0; i < b->n_tokens; i++)
        for (int h = 0; h < nh; h++) {
            float pos = (float)b->pos[i];
            if (h < n_head)
                head_norm_rope(q + ((size_t)i * n_head + h) * head_dim, qw, inv, rope->attn_factor, head_dim, pos, eps);
            else
                head_norm_rope(k + ((size_t)i * n_head_kv + h - n_head) * head_dim, kw, inv, rope->attn_factor, head_dim, pos, eps);
        }
}

static void cpu_swiglu(struct kiln_backend *be, void *out_, const void *gate_, const void *up_, int n, int ffn) {
    (void)be;
    float *out = out_;
    const float *g = gate_, *u = up_;
    size_t total = (size_t)n * ffn;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < total; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void cpu_add(struct kiln_backend *be, void *x_, const void *y_, size_t n) {
    (void)be;
    float *x = x_;
    const float *y = y_;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] += y[i];
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
