/*
 * load.c: binds a model's weights by their Hugging Face names, from a
 * checkpoint (safetensors, mmap'd, never copied) or from a seeded random
 * generator (--dummy, like SGLang's --load-format dummy), then prepares them
 * on the backend. One binding routine serves both sources, so a dummy model
 * has exactly the tensors and shapes a real checkpoint of that config has.
 *
 * Every tensor's presence, rank, shape and dtype is checked before the model
 * is used; any failure frees everything and reports the tensor by name.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "model/model.h"

void rope_init(struct rope *r, const struct kiln_config *c);

enum winit { W_LINEAR, W_NORM, W_BIAS };

struct wsrc {
    struct kiln_model *m;
    const char *where;
    int dummy;
    enum kiln_dtype dtype; /* dummy weights' dtype */
    uint64_t seed;
    float std;
    uint64_t counter;
    const char *quant; /* dummy weights' quantized format, or NULL */
    int group;         /* its group size (GPTQ/AWQ), 0 = 128 */
    char *err;
    size_t errlen;
};

/* ==== dummy weights ==== */

/* Fills n elements with uniform noise of standard deviation std (mean 1 for
 * norm weights). Uniform, not normal, because it is cheap enough to fill 8B
 * parameters in seconds; chunks are seeded independently so the result does
 * not depend on the thread count. */
static inline float dummy_value(struct kiln_rng *r, float mean, float a) { return mean + a * (float)(2.0 * kiln_rng_uniform(r) - 1.0); }

static void fill_dummy(void *p, enum kiln_dtype t, int64_t n, uint64_t seed, float std, float mean) {
    const int64_t chunk = 1 << 16;
    const float a = std * 1.7320508f; /* U(-a, a) has std a / sqrt(3) */
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < (n + chunk - 1) / chunk; c++) {
        struct kiln_rng r;
        kiln_rng_seed(&r, seed * 0x9e3779b97f4a7c15ull + (uint64_t)c);
        int64_t e = (c + 1) * chunk < n ? (c + 1) * chunk : n;
        if (t == KILN_DTYPE_BF16) /* one loop per dtype: the fill of a 30B model is seconds */
            for (int64_t i = c * chunk; i < e; i++) ((uint16_t *)p)[i] = kiln_f32_to_bf16(dummy_value(&r, mean, a));
        else if (t == KILN_DTYPE_F32)
            for (int64_t i = c * chunk; i < e; i++) ((float *)p)[i] = dummy_value(&r, mean, a);
        else
            for (int64_t i = c * chunk; i < e; i++) ((uint16_t *)p)[i] = kiln_f32_to_f16(dummy_value(&r, mean, a));
    }
}

static void *owned_alloc(void *ctx, size_t nb);

/* ==== the one getter both sources go through ==== */

/* Binds name, of shape (rows, cols), or (cols) when rows == 0. */
static int get(struct wsrc *s, struct ktensor *t, const char *name, int64_t rows, int64_t cols, enum winit init) {
    int vec = rows == 0;
    memset(t, 0, sizeof *t);
    t->rows = vec ? 1 : rows;
    t->cols = cols;
    if (s->dummy) {
        size_t nb = (size_t)(t->rows * cols) * dtype_size(s->dtype);
        void *p = owned_alloc(s->m, nb);
        if (!p) return kiln_errf(s->err, s->errlen, "dummy weights: out of memory for %s (%zu bytes)", name, nb);
        fill_dummy(p, s->dtype, t->rows * cols, s->seed + ++s->counter, init == W_NORM ? 0.05f : s->std,
                   init == W_NORM ? 1.0f : 0.0f);
        t->dtype = s->dtype;
        t->data = p;
        return 0;
    }
    const struct st_tensor *st = st_find(&s->m->st, name);
    if (!st) return kiln_errf(s->err, s->errlen, "%s: missing tensor '%s'", s->where, name);
    int ok = vec ? (st->ndim == 1 && st->shape[0] == cols) : (st->ndim == 2 && st->shape[0] == rows && st->shape[1] == cols);
    if (!ok) {
        char got[128] = "", *p = got;
        for (int i = 0; i < st->ndim && p < got + 100; i++) p += sprintf(p, "%s%lld", i ? ", " : "", (long long)st->shape[i]);
        if (vec) return kiln_errf(s->err, s->errlen, "%s: tensor '%s' has shape [%s], the config implies [%lld]", s->where, name, got, (long long)cols);
        return kiln_errf(s->err, s->errlen, "%s: tensor '%s' has shape [%s], the config implies [%lld, %lld]", s->where, name, got,
                         (long long)rows, (long long)cols);
    }
    if (quant_type_of(st->dtype) && !dtype_size(st->dtype) && s->m->cfg.quant.method == KILN_QUANT_GGUF) {
        /* a block-quantized GGUF table read by lookup (the token embedding):
         * kept as stored; the backend dequantizes the rows it gathers, and
         * the tied lm_head computes on the same blocks */
        t->dtype = st->dtype;
        t->data = st->data;
        return 0;
    }
    if (st->dtype != KILN_DTYPE_F32 && st->dtype != KILN_DTYPE_F16 && st->dtype != KILN_DTYPE_BF16)
        return kiln_errf(s->err, s->errlen, "%s: tensor '%s' has dtype %s; expected BF16, F16 or F32", s->where, name, dtype_name(st->dtype));
    t->dtype = st->dtype;
    t->data = st->data;
    return 0;
}

/* Binds a tensor of any dtype and rank <= 2 as stored (packed quantized
 * parts); the format's check validates shapes. Missing: -1 if required. */
static int get_raw(struct wsrc *s, struct ktensor *t, const char *name, int required) {
    memset(t, 0, sizeof *t);
    const struct st_tensor *st = st_find(&s->m->st, name);
    if (!st) return required ? kiln_errf(s->err, s->errlen, "%s: missing tensor '%s'", s->where, name) : 0;
    if (st->ndim < 1 || st->ndim > 2) return kiln_errf(s->err, s->errlen, "%s: tensor '%s' has rank %d, expected 1 or 2", s->where, name, st->ndim);
    t->dtype = st->dtype;
    t->rows = st->ndim == 2 ? st->shape[0] : 1;
    t->cols = st->shape[st->ndim - 1];
    t->data = st->data;
    return 0;
}

/* Memory the model owns (dummy weights, GGUF tensors rewritten at load),
 * in 2 MiB pages (base/walloc.c). Filling 60 GB of dummy weights in 4 KiB
 * pages spent most of its time in page faults (sys time 12.5 of 19.9
 * CPU-seconds for Qwen3-1.7B on a 2-core VM), and a decode GEMV streams
 * faster from 2 MiB pages (`gemv-bench q4_0`, Zen 3, AVX2, 2 threads,
 * builds alternated 4 times: 38 / 74 / 82 / 86% -> 75 / 90 / 96 / 96% of
 * the probe at 0.3 / 1.2 / 4.7 / 19 MB matrices, which before had 2 MiB
 * pages only from 2 MiB up). */
static void *owned_alloc(void *ctx, size_t nb) {
    struct kiln_model *m = ctx;
    void *p = kiln_walloc(nb);
    if (!p) return NULL; /* the caller reports it */
    m->owned = kiln_realloc(m->owned, sizeof *m->owned * (size_t)(m->n_owned + 1));
    m->owned[m->n_owned++] = p;
    return p;
}

/* A quantized checkpoint's linear, when its tensors say so: GPTQ/AWQ
 * <prefix>.qweight, FP8 an F8_E4M3 <prefix>.weight, GGUF a block-typed
 * weight. Returns 1 if not quantized (bind it dense), 0 bound, -1 error. */
static int get_quant_linear(struct wsrc *s, struct qlinear *w, const char *prefix) {
    const struct kiln_quant_cfg *q = &s->m->cfg.quant;
    char name[320];
    if (s->dummy) {
        /* dummy: every linear but lm_head and the MoE router */
        size_t l = strlen(prefix);
        if (!s->quant || !strcmp(prefix, "lm_head") || (l > 8 && !strcmp(prefix + l - 8, "mlp.gate"))) return 1;
        if (quant_dummy_linear(w, s->quant, s->group ? s->group : 128, s->seed + ++s->counter, s->std, owned_alloc, s->m, s->err, s->errlen))
            return kiln_err_prefix(s->err, s->errlen, "%s: ", prefix);
        return 0;
    }
    if (q->method == KILN_QUANT_GPTQ || q->method == KILN_QUANT_AWQ) {
        snprintf(name, sizeof name, "%s.qweight", prefix);
        if (!st_find(&s->m->st, name)) return 1;
        w->fmt = q->method == KILN_QUANT_GPTQ ? KILN_WFMT_GPTQ : KILN_WFMT_AWQ;
        w->bits = q->bits;
        w->group = q->group_size < 0 || q->group_size > w->n_in ? w->n_in : q->group_size;
        w->zero_plus1 = q->method == KILN_QUANT_GPTQ && !q->v2;
        if (get_raw(s, &w->w, name, 1)) return -1;
        snprintf(name, sizeof name, "%s.qzeros", prefix);
        if (get_raw(s, &w->zeros, name, 1)) return -1;
        snprintf(name, sizeof name, "%s.scales", prefix);
        if (get_raw(s, &w->scales, name, 1)) return -1;
        if (q->method == KILN_QUANT_GPTQ) {
            snprintf(name, sizeof name, "%s.g_idx", prefix);
            if (get_raw(s, &w->g_idx, name, 0)) return -1;
        }
    } else if (q->method == KILN_QUANT_FP8) {
        snprintf(name, sizeof name, "%s.weight", prefix);
        const struct st_tensor *t = st_find(&s->m->st, name);
        if (!t || t->dtype != KILN_DTYPE_F8_E4M3) return 1;
        w->fmt = KILN_WFMT_FP8;
        w->block_n = q->block_n, w->block_k = q->block_k;
        if (get_raw(s, &w->w, name, 1)) return -1;
        if (w->w.rows != w->n_out || w->w.cols != w->n_in)
            return kiln_errf(s->err, s->errlen, "%s: tensor '%s' has shape [%lld, %lld], the config implies [%d, %d]", s->where, name,
                             (long long)w->w.rows, (long long)w->w.cols, w->n_out, w->n_in);
        snprintf(name, sizeof name, "%s.weight_scale_inv", prefix);
        if (get_raw(s, &w->scales, name, 1)) return -1;
    } else if (q->method == KILN_QUANT_GGUF) {
        snprintf(name, sizeof name, "%s.weight", prefix);
        const struct st_tensor *t = st_find(&s->m->st, name);
        if (!t || dtype_size(t->dtype)) return 1; /* F32/F16/BF16: dense */
        w->fmt = KILN_WFMT_GGUF;
        if (get_raw(s, &w->w, name, 1)) return -1;
        if (w->w.rows != w->n_out || w->w.cols != w->n_in)
            return kiln_errf(s->err, s->errlen, "%s: tensor '%s' has shape [%lld, %lld], the config implies [%d, %d]", s->where, name,
                             (long long)w->w.rows, (long long)w->w.cols, w->n_out, w->n_in);
    } else {
        return 1;
    }
    return quant_check_linear(w, prefix, s->err, s->errlen) ? kiln_err_prefix(s->err, s->errlen, "%s: ", s->where) : 0;
}

static int get_linear(struct wsrc *s, struct qlinear *w, const char *prefix, int n_out, int n_in, int bias) {
    char name[320];
    memset(w, 0, sizeof *w);
    w->n_out = n_out;
    w->n_in = n_in;
    w->fmt = KILN_WFMT_DENSE;
    int r = get_quant_linear(s, w, prefix);
    if (r < 0) return -1;
    if (r == 1) {
        snprintf(name, sizeof name, "%s.weight", prefix);
        if (get(s, &w->w, name, n_out, n_in, W_LINEAR)) return -1;
    }
    if (bias) {
        snprintf(name, sizeof name, "%s.bias", prefix);
        if (get(s, &w->bias, name, 0, n_out, W_BIAS)) return -1;
    }
    return 0;
}

/* the model's own tensors: the embedding, the final norm, lm_head, and
 * the layers' table (each layer is bound by bind_layer) */
static int bind_top(struct wsrc *s) {
    struct kiln_model *m = s->m;
    const struct kiln_config *c = &m->cfg;
    if (get(s, &m->embed, "model.embed_tokens.weight", c->vocab, c->dim, W_LINEAR)) return -1;
    if (get(s, &m->norm, "model.norm.weight", 0, c->dim, W_NORM)) return -1;
    if (c->tie_embed) {
        m->lm_head = (struct qlinear){.n_out = c->vocab, .n_in = c->dim, .fmt = KILN_WFMT_DENSE, .w = m->embed};
        m->lm_head.w.be = NULL;
        const struct st_tensor *et = s->dummy ? NULL : st_find(&m->st, "model.embed_tokens.weight");
        if (et && !dtype_size(et->dtype)) { /* GGUF blocks: the lm_head computes on them */
            m->lm_head.fmt = KILN_WFMT_GGUF;
            m->lm_head.w = (struct ktensor){.dtype = et->dtype, .rows = c->vocab, .cols = c->dim, .data = et->data};
            if (quant_check_linear(&m->lm_head, "lm_head (tied)", s->err, s->errlen)) return -1;
        }
    } else if (get_linear(s, &m->lm_head, "lm_head", c->vocab, c->dim, 0)) {
        return -1;
    }
    m->layers = kiln_calloc((size_t)c->n_layer, sizeof *m->layers);
    return 0;
}

static int bind_layer(struct wsrc *s, int l) {
    struct kiln_model *m = s->m;
    const struct kiln_config *c = &m->cfg;
    char p[256];
    const int qd = c->n_head * c->head_dim, kvd = c->n_head_kv * c->head_dim, ab = c->attn_bias || c->qkv_bias;
    struct layer *L = &m->layers[l];
#define P(fmt, ...) (snprintf(p, sizeof p, "model.layers.%d." fmt, l, ##__VA_ARGS__), p)
    if (get(s, &L->attn_norm, P("input_layernorm.weight"), 0, c->dim, W_NORM)) return -1;
    if (get(s, &L->ffn_norm, P("post_attention_layernorm.weight"), 0, c->dim, W_NORM)) return -1;
    if (get_linear(s, &L->wq, P("self_attn.q_proj"), qd, c->dim, ab)) return -1;
    if (get_linear(s, &L->wk, P("self_attn.k_proj"), kvd, c->dim, ab)) return -1;
    if (get_linear(s, &L->wv, P("self_attn.v_proj"), kvd, c->dim, ab)) return -1;
    if (get_linear(s, &L->wo, P("self_attn.o_proj"), c->dim, qd, c->attn_bias)) return -1;
    if (c->qk_norm) {
        if (get(s, &L->q_norm, P("self_attn.q_norm.weight"), 0, c->head_dim, W_NORM)) return -1;
        if (get(s, &L->k_norm, P("self_attn.k_norm.weight"), 0, c->head_dim, W_NORM)) return -1;
    }
    L->is_moe = c->layer_moe[l];
    if (L->is_moe) {
        struct moe_ffn *e = &L->moe;
        e->n_expert = c->n_expert;
        e->n_used = c->n_expert_used;
        e->ffn = c->moe_ffn;
        e->norm_topk = c->norm_topk_prob;
        if (get_linear(s, &e->router, P("mlp.gate"), c->n_expert, c->dim, 0)) return -1;
        e->gate = kiln_calloc((size_t)c->n_expert, sizeof *e->gate);
        e->up = kiln_calloc((size_t)c->n_expert, sizeof *e->up);
        e->down = kiln_calloc((size_t)c->n_expert, sizeof *e->down);
        for (int x = 0; x < c->n_expert; x++) {
            if (get_linear(s, &e->gate[x], P("mlp.experts.%d.gate_proj", x), c->moe_ffn, c->dim, 0)) return -1;
            if (get_linear(s, &e->up[x], P("mlp.experts.%d.up_proj", x), c->moe_ffn, c->dim, 0)) return -1;
            if (get_linear(s, &e->down[x], P("mlp.experts.%d.down_proj", x), c->dim, c->moe_ffn, 0)) return -1;
        }
    } else {
        if (get_linear(s, &L->gate, P("mlp.gate_proj"), c->ffn, c->dim, c->mlp_bias)) return -1;
        if (get_linear(s, &L->up, P("mlp.up_proj"), c->ffn, c->dim, c->mlp_bias)) return -1;
        if (get_linear(s, &L->down, P("mlp.down_proj"), c->dim, c->ffn, c->mlp_bias)) return -1;
    }
#undef P
    return 0;
}

/* ==== preparing on the backend, and the walk over every weight ==== */

/* fn on every linear of layer l */
static int layer_linears(struct kiln_model *m, int l, int (*fn)(struct kiln_model *, struct qlinear *, void *), void *ctx) {
    struct layer *L = &m->layers[l];
    struct qlinear *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down, &L->moe.router};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        if (ws[i]->w.data && fn(m, ws[i], ctx)) return -1;
    for (int x = 0; L->moe.gate && x < L->moe.n_expert; x++) {
        if (L->moe.gate[x].w.data && fn(m, &L->moe.gate[x], ctx)) return -1;
        if (L->moe.up[x].w.data && fn(m, &L->moe.up[x], ctx)) return -1;
        if (L->moe.down[x].w.data && fn(m, &L->moe.down[x], ctx)) return -1;
    }
    return 0;
}

/* fn on every vector (norm weights) of layer l */
static int layer_vectors(struct kiln_model *m, int l, int (*fn)(struct kiln_model *, struct ktensor *, void *), void *ctx) {
    struct layer *L = &m->layers[l];
    struct ktensor *ts[] = {&L->attn_norm, &L->ffn_norm, &L->q_norm, &L->k_norm};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (ts[i]->data && fn(m, ts[i], ctx)) return -1;
    return 0;
}

/* Calls fn on every distinct linear of the model (lm_head once even when tied). */
static int each_linear(struct kiln_model *m, int (*fn)(struct kiln_model *, struct qlinear *, void *), void *ctx) {
    if (m->lm_head.w.data && fn(m, &m->lm_head, ctx)) return -1;
    for (int l = 0; m->layers && l < m->cfg.n_layer; l++)
        if (layer_linears(m, l, fn, ctx)) return -1;
    return 0;
}

static int each_vector(struct kiln_model *m, int (*fn)(struct kiln_model *, struct ktensor *, void *), void *ctx) {
    if (m->embed.data && fn(m, &m->embed, ctx)) return -1;
    if (m->norm.data && fn(m, &m->norm, ctx)) return -1;
    for (int l = 0; m->layers && l < m->cfg.n_layer; l++)
        if (layer_vectors(m, l, fn, ctx)) return -1;
    return 0;
}

struct errbuf {
    char *err;
    size_t errlen;
};

/* The CPU backend repacks GPTQ/AWQ linears, and on x86 Q4_0 / Q8_0 ones
 * (cpu_qprepare_linear) and BF16 ones (in 12 bits, b12.c), at load, and
 * the CUDA backend uploads every linear; neither reads the stored tensors
 * again (qlinear.repacked). Their pages are dropped right after each
 * linear is prepared, so resident memory is the prepared size, not stored
 * + prepared, at the end and along the way (a dummy model's anonymous
 * pages cannot be evicted to make room). From a checkpoint they are the
 * file mapping's (read-only), and a later read (kiln quantize's reference
 * dequantization) faults them back in from the file. Dummy weights are the
 * model's own anonymous memory, one buffer per tensor (owned_alloc), so only
 * whole pages inside each tensor go and its neighbours keep theirs; they
 * come back as zeros, which nothing reads (0.6B GPTQ-int4 --dummy: 767 ->
 * 553 MiB peak RSS in a tg run, Q4_0's 552). A tied lm_head's weight is the
 * embedding, which the CPU's lookup still reads: from a file its pages go
 * too (the lookup faults back the rows it gathers), a dummy's stay. */
static int drop_repacked(struct kiln_model *m, struct qlinear *w, void *ctx) {
    (void)ctx;
    if (!w->repacked) return 0;
    const struct ktensor *ts[] = {&w->w, &w->zeros, &w->scales, &w->g_idx};
    long pg = sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < 4; i++) {
        if (!ts[i]->data || (ts[i]->data == m->embed.data && !m->st.n_files)) continue; /* a dummy's tied embedding: still read */
        const size_t bytes = dtype_size(ts[i]->dtype) ? (size_t)(ts[i]->rows * ts[i]->cols) * dtype_size(ts[i]->dtype)
                                                      : (size_t)ts[i]->rows * quant_row_bytes(ts[i]->dtype, ts[i]->cols); /* GGUF blocks */
        uintptr_t a = (uintptr_t)ts[i]->data, e = a + (uintptr_t)bytes;
        a = (a + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1); /* whole pages inside the tensor only */
        e &= ~(uintptr_t)(pg - 1);
        if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
    }
    return 0;
}

static int prep_lin(struct kiln_model *m, struct qlinear *w, void *ctx) {
    struct errbuf *e = ctx;
    if (m->be->prepare_linear(m->be, w, e->err, e->errlen)) return -1;
    return drop_repacked(m, w, NULL);
}

/* an MoE layer as a whole, right after its linears (CUDA: its experts moved
 * into one allocation per kind before the next layer's go up, so the load
 * never holds the whole model in per-expert allocations) */
static int prep_moe_layer(struct kiln_model *m, int l, void *ctx) {
    struct errbuf *e = ctx;
    if (!m->be->prepare_moe || !m->layers[l].is_moe) return 0;
    if (m->be->prepare_moe(m->be, &m->layers[l].moe, e->err, e->errlen)) return kiln_err_prefix(e->err, e->errlen, "layer %d: ", l);
    return 0;
}

static int prep_vec(struct kiln_model *m, struct ktensor *t, void *ctx) {
    struct errbuf *e = ctx;
    return m->be->prepare_tensor(m->be, t, e->err, e->errlen);
}

static int rel_lin(struct kiln_model *m, struct qlinear *w, void *ctx) {
    (void)ctx;
    m->be->release_linear(m->be, w);
    return 0;
}

static int rel_vec(struct kiln_model *m, struct ktensor *t, void *ctx) {
    (void)ctx;
    m->be->release_tensor(m->be, t);
    return 0;
}

struct count {
    int64_t params, bytes;
};

static int count_lin(struct kiln_model *m, struct qlinear *w, void *ctx) {
    struct count *c = ctx;
    if (w == &m->lm_head && m->cfg.tie_embed) return 0; /* the embedding's bytes, counted once with it */
    c->params += (int64_t)w->n_out * w->n_in + (w->bias.data ? w->n_out : 0);
    c->bytes += quant_linear_bytes(w);
    return 0;
}

static int count_vec(struct kiln_model *m, struct ktensor *t, void *ctx) {
    (void)m;
    struct count *c = ctx;
    c->params += t->rows * t->cols;
    c->bytes += t->rows * (int64_t)quant_row_bytes(t->dtype, t->cols);
    return 0;
}

int64_t model_n_params(const struct kiln_model *m) {
    struct count c = {0, 0};
    each_linear((struct kiln_model *)m, count_lin, &c);
    each_vector((struct kiln_model *)m, count_vec, &c);
    return c.params;
}

int64_t model_n_bytes(const struct kiln_model *m) {
    struct count c = {0, 0};
    each_linear((struct kiln_model *)m, count_lin, &c);
    each_vector((struct kiln_model *)m, count_vec, &c);
    return c.bytes;
}

/* the bytes the backend's kernels read in a pass over w */
static int64_t read_bytes(const struct kiln_model *m, const struct qlinear *w) {
    return m->be && m->be->linear_bytes && w->be ? m->be->linear_bytes(m->be, w) : quant_linear_bytes(w);
}

static int read_delta(struct kiln_model *m, struct qlinear *w, void *ctx) {
    ((struct count *)ctx)->bytes += read_bytes(m, w) - quant_linear_bytes(w);
    return 0;
}

double model_decode_bytes(const struct kiln_model *m) {
    /* model_n_bytes counts the embedding once (as lm_head when tied, which
     * reads it whole), so: less an untied embedding table (one row read),
     * less the unused share of every layer's experts; and each linear as
     * the backend reads it, where it stores its own form (the tied lm_head
     * included: that form is its own copy) */
    double b = (double)model_n_bytes(m);
    struct count d = {0, 0};
    each_linear((struct kiln_model *)m, read_delta, &d);
    b += (double)d.bytes;
    if (!m->cfg.tie_embed && m->embed.data) b -= (double)m->embed.rows * quant_row_bytes(m->embed.dtype, m->embed.cols);
    for (int l = 0; m->layers && l < m->cfg.n_layer; l++) {
        const struct moe_ffn *f = &m->layers[l].moe;
        double ex = 0;
        for (int x = 0; f->gate && x < f->n_expert; x++)
            ex += (double)read_bytes(m, &f->gate[x]) + (double)read_bytes(m, &f->up[x]) + (double)read_bytes(m, &f->down[x]);
        if (f->n_expert > 0) b -= ex * (f->n_expert - f->n_used) / f->n_expert;
    }
    return b;
}

struct fmt_count {
    char label[8][64];
    int n[8];
    int64_t bytes[8];
    int k;
};

static int count_fmt(struct kiln_model *m, struct qlinear *w, void *ctx) {
    struct fmt_count *c = ctx;
    if (w == &m->lm_head && m->cfg.tie_embed && w->fmt == KILN_WFMT_DENSE) return 0;
    char l[64];
    quant_linear_label(w, l, sizeof l);
    int i = 0;
    while (i < c->k && strcmp(c->label[i], l)) i++;
    if (i == c->k) {
        if (c->k == 8) return 0;
        snprintf(c->label[c->k++], sizeof c->label[0], "%s", l);
    }
    c->n[i]++;
    c->bytes[i] += quant_linear_bytes(w);
    return 0;
}

void model_main_format(const struct kiln_model *m, char *buf, size_t len) {
    struct fmt_count c = {0};
    each_linear((struct kiln_model *)m, count_fmt, &c);
    int best = -1;
    for (int i = 0; i < c.k; i++)
        if (best < 0 || c.bytes[i] > c.bytes[best]) best = i;
    snprintf(buf, len, "%s", best < 0 ? "?" : c.label[best]);
}

void model_describe_formats(const struct kiln_model *m, FILE *f) {
    struct fmt_count c = {0};
    each_linear((struct kiln_model *)m, count_fmt, &c);
    for (int i = 0; i < c.k; i++)
        fprintf(f, "  %-34s %5d linears %10.2f MiB\n", c.label[i], c.n[i], c.bytes[i] / (double)(1 << 20));
}

/* The least device memory the bound weights can take on a backend that
 * computes in 16 bits or more: 2 bytes per element of a dense tensor (a
 * GPU keeps them in bf16, f32 norms included), the stored codes of a
 * quantized linear or table (kept so, repacked with their scales, or
 * widened: never smaller); a tied lm_head shares the embedding's copy. A
 * floor, so it refuses no model that fits (the CUDA backend's weights of
 * Qwen3-8B BF16 are 15.26 GiB against a floor of 15.26). */
static int64_t elem2(const struct ktensor *t) { return t->data ? 2 * t->rows * t->cols : 0; }
static int floor_lin(struct kiln_model *m, struct qlinear *w, void *ctx) {
    if (w == &m->lm_head && m->cfg.tie_embed) return 0;
    *(int64_t *)ctx += (w->fmt == KILN_WFMT_DENSE ? elem2(&w->w) : quant_tensor_bytes(&w->w)) + elem2(&w->bias);
    return 0;
}
static int floor_vec(struct kiln_model *m, struct ktensor *t, void *ctx) {
    *(int64_t *)ctx += dtype_size(t->dtype) ? elem2(t) : quant_tensor_bytes(t); /* a GGUF embedding's blocks as stored */
    return 0;
}

/* Refuses, on a backend with device_weights, bound weights whose floor
 * exceeds the free memory. A layer not bound yet (a dummy's, generated as
 * it is bound) counts as a bound one of its kind (dense or MoE), or 0. */
static int check_fit(struct kiln_model *m, struct kiln_backend *be, char *err, size_t errlen) {
    if (!be->device_weights || !be->mem_info) return 0;
    int64_t need = 0, kind[2] = {0, 0};
    floor_vec(m, &m->embed, &need), floor_vec(m, &m->norm, &need), floor_lin(m, &m->lm_head, &need);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        int64_t f = 0;
        layer_linears(m, l, floor_lin, &f), layer_vectors(m, l, floor_vec, &f);
        if (f) kind[m->cfg.layer_moe[l] != 0] = f;
        need += f;
    }
    for (int l = 0; l < m->cfg.n_layer; l++)
        if (!m->layers[l].attn_norm.data) need += kind[m->cfg.layer_moe[l] != 0];
    size_t free_b = 0, total_b = 0;
    be->mem_info(be, &free_b, &total_b);
    if (need <= (int64_t)free_b || !total_b) return 0; /* total 0: the backend could not tell */
    const double G = 1024.0 * 1024.0 * 1024.0;
    return kiln_errf(err, errlen, "%s: the weights need at least %.2f GiB (%lld bytes) of %s memory, %.2f GiB of its %.2f GiB are free",
                     m->path, need / G, (long long)need, be->name, free_b / G, total_b / G);
}

/* Binds and prepares the weights. A dummy model's layer is generated (in
 * host memory) as it is bound, so each is bound, then prepared, before the
 * next: its weights never all exist at once when the backend computes on
 * its own copy and drops the stored pages (drop_repacked); Qwen3-235B-A22B's
 * GPTQ-Int4 dummy is ~124 GB of host memory whole. A checkpoint's binding
 * only points into the mapped files and checks names, shapes and dtypes,
 * so all its layers are bound first: a tensor missing from the last layer
 * fails the load before anything went to the backend, not after minutes
 * of upload. Either way check_fit runs before the first upload (a dummy's
 * layer 0 bound: the others count as it does). */
static int finish_load(struct kiln_model *m, struct wsrc *s, struct kiln_backend *be, char *err, size_t errlen) {
    m->be = be;
    if (be->check_model && be->check_model(be, &m->cfg, err, errlen)) return kiln_err_prefix(err, errlen, "%s: ", m->path);
    if (bind_top(s)) return -1;
    const int bound = s->dummy ? 1 : m->cfg.n_layer; /* a dummy generates the rest as it binds them, below */
    for (int l = 0; l < bound; l++)
        if (bind_layer(s, l)) return -1;
    if (check_fit(m, be, err, errlen)) return -1;
    rope_init(&m->rope, &m->cfg);
    struct errbuf e = {err, errlen};
    /* the embedding before lm_head: a tied lm_head shares its backend copy */
    if (prep_vec(m, &m->embed, &e) || prep_vec(m, &m->norm, &e) || prep_lin(m, &m->lm_head, &e)) goto prep_fail;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        if (l >= bound && bind_layer(s, l)) return -1;
        if (layer_vectors(m, l, prep_vec, &e) || layer_linears(m, l, prep_lin, &e) || prep_moe_layer(m, l, &e)) goto prep_fail;
    }
    if (be->prepare_rope(be, &m->rope, err, errlen)) goto prep_fail;
    if (be->group_linears) {
        const double t0 = kiln_now();
        for (int l = 0; l < m->cfg.n_layer; l++) {
            struct qlinear *qkv[3] = {&m->layers[l].wq, &m->layers[l].wk, &m->layers[l].wv};
            be->group_linears(be, qkv, 3);
        }
        kiln_log(KILN_LOG_DEBUG, "%s: q/k/v of %d layers offered for grouping in %.1f ms", be->name, m->cfg.n_layer,
                 1e3 * (kiln_now() - t0));
    }
    return 0;
prep_fail:
    return kiln_err_prefix(err, errlen, "%s: preparing weights: ", m->path);
}

/* A single GGUF file: metadata -> config, tensors -> the Hugging Face names
 * (format/gguf.c), then the same binding as a checkpoint folder. */
static int load_gguf(struct kiln_model *m, const char *path, struct kiln_backend *be, char *err, size_t errlen) {
    struct st_set *st = &m->st;
    memset(st, 0, sizeof *st);
    st->files = kiln_calloc(1, sizeof *st->files);
    if (kiln_file_map(&st->files[0], path, err, errlen)) return -1;
    st->n_files = 1;
    struct gguf_file g;
    if (kiln_gguf_parse(&g, st->files[0].data, st->files[0].size, path, err, errlen)) return -1;
    int rc = kiln_gguf_to_config(&g, &m->cfg, err, errlen);
    if (rc == 0) rc = kiln_gguf_to_st(&g, &m->cfg, st, 0, owned_alloc, m, err, errlen);
    kiln_gguf_free(&g);
    if (rc || st_finish(st, err, errlen)) return kiln_err_prefix(err, errlen, "%s: ", path);
    struct wsrc s = {.m = m, .where = path, .err = err, .errlen = errlen};
    return finish_load(m, &s, be, err, errlen);
}

int model_load_dir(struct kiln_model *m, const char *dir, struct kiln_backend *be, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    m->path = kiln_strdup(dir);
    if (kiln_gguf_is_file(dir)) {
        if (load_gguf(m, dir, be, err, errlen)) goto fail;
        return 0;
    }
    if (!kiln_is_dir(dir)) {
        kiln_errf(err, errlen, "%s: not a directory (expected a Hugging Face checkpoint folder)", dir);
        goto fail;
    }
    if (config_load_dir(&m->cfg, dir, err, errlen)) goto fail;
    if (st_open_dir(&m->st, dir, err, errlen)) goto fail;
    struct wsrc s = {.m = m, .where = dir, .err = err, .errlen = errlen};
    if (finish_load(m, &s, be, err, errlen)) goto fail;
    return 0;
fail:
    model_free(m);
    return -1;
}

/* ==== built-in configs: the JSON files of configs/, compiled in ==== */

extern const struct {
    const char *name;
    const char *json;
} kiln_builtin_configs[];

const char *model_builtin_config(const char *name) {
    for (int i = 0; kiln_builtin_configs[i].name; i++)
        if (!strcasecmp(kiln_builtin_configs[i].name, name)) return kiln_builtin_configs[i].json;
    return NULL;
}

void model_list_builtin(void (*fn)(const char *name, void *ctx), void *ctx) {
    for (int i = 0; kiln_builtin_configs[i].name; i++) fn(kiln_builtin_configs[i].name, ctx);
}

int model_load_dummy(struct kiln_model *m, const char *name, enum kiln_dtype dtype, uint64_t seed,
                     struct kiln_backend *be, char *err, size_t errlen) {
    return model_load_dummy_quant(m, name, dtype, NULL, 0, seed, be, err, errlen);
}

int model_load_dummy_quant(struct kiln_model *m, const char *name, enum kiln_dtype dtype, const char *quant, int group,
                           uint64_t seed, struct kiln_backend *be, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    if (quant && !quant_dummy_known(quant))
        return kiln_errf(err, errlen, "--quant %s: unknown format (fp8, gptq-int4, gptq-int8, awq, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs)", quant);
    char path[512];
    snprintf(path, sizeof path, "dummy:%s", name);
    m->path = kiln_strdup(path);
    const char *json = model_builtin_config(name);
    char *txt = NULL;
    if (!json) {
        if (!kiln_file_exists(name)) {
            kiln_errf(err, errlen, "--dummy %s: neither a built-in config (qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-14b, qwen3-32b, qwen3-30b-a3b, qwen3-235b-a22b) nor a config.json file", name);
            goto fail;
        }
        json = txt = kiln_read_file(name, NULL, err, errlen);
        if (!txt) goto fail;
    }
    int rc = config_parse(&m->cfg, json, name, err, errlen);
    free(txt);
    if (rc) goto fail;
    if (dtype != KILN_DTYPE_F32 && dtype != KILN_DTYPE_F16 && dtype != KILN_DTYPE_BF16) {
        kiln_errf(err, errlen, "--dummy: dtype %s is not one of bf16, f16, f32", dtype_name(dtype));
        goto fail;
    }
    struct wsrc s = {.m = m, .where = m->path, .dummy = 1, .dtype = dtype, .seed = seed, .std = 0.02f, .quant = quant, .group = group,
                     .err = err, .errlen = errlen};
    if (finish_load(m, &s, be, err, errlen)) goto fail;
    return 0;
fail:
    model_free(m);
    return -1;
}

void model_free(struct kiln_model *m) {
    if (m->be) {
        each_linear(m, rel_lin, NULL);
        each_vector(m, rel_vec, NULL);
        if (m->rope.inv_freq) m->be->release_rope(m->be, &m->rope);
        void *ws[] = {m->x, m->xb, m->q, m->k, m->v, m->att, m->hb, m->hb2, m->out_x, m->out_logits};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            if (ws[i]) m->be->free(m->be, ws[i]);
    }
    for (int l = 0; m->layers && l < m->cfg.n_layer; l++) {
        free(m->layers[l].moe.gate);
        free(m->layers[l].moe.up);
        free(m->layers[l].moe.down);
    }
    free(m->layers);
    free(m->rope.inv_freq);
    for (int i = 0; i < m->n_owned; i++) kiln_wfree(m->owned[i]);
    free(m->owned);
    st_close(&m->st);
    config_free(&m->cfg);
    free(m->path);
    memset(m, 0, sizeof *m);
}
