/*
 * engine.c: owns the model, its backend and the KV page pool, and runs
 * single sequences (kiln_seq) for the CLI and the in-process benchmarks.
 * A sequence holds a page table into the pool; evaluation splits a prompt
 * into prefill chunks of at most prefill_chunk tokens.
 */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/engine_internal.h"
#include "engine/kv.h"
#include "format/quant.h"
#include "kiln.h"
#include "model/model.h"

struct kiln_seq {
    kiln_engine *e;
    int len;
    int32_t *pages;
    int n_pages, cap_pages;
};

static enum kiln_dtype parse_dtype(const char *s) {
    if (!s || !strcmp(s, "bf16")) return KILN_DTYPE_BF16;
    if (!strcmp(s, "f16")) return KILN_DTYPE_F16;
    if (!strcmp(s, "f32")) return KILN_DTYPE_F32;
    if (!strcmp(s, "q8_0")) return KILN_DTYPE_Q8_0;
    return KILN_DTYPE_NONE;
}

/* --mem-fraction F: the KV pool takes what is left of F x the device's
 * memory once the weights are in (what is in use now counts against it);
 * with --max-total-tokens too, the smaller of the two. Too little left is an
 * error here, before anything is served. */
static int kv_tokens_for_fraction(kiln_engine *e, const struct kiln_engine_opts *o, enum kiln_dtype kvt, int *tokens, char *err,
                                  size_t errlen) {
    const struct kiln_config *c = &e->model.cfg;
    if (o->mem_fraction > 1) return kiln_errf(err, errlen, "--mem-fraction %g: expected a fraction in (0, 1]", o->mem_fraction);
    size_t fr = 0, tot = 0;
    e->be->mem_info(e->be, &fr, &tot);
    const double G = 1073741824.0, budget = o->mem_fraction * (double)tot, used = (double)(tot - fr);
    const size_t per_tok = kv_bytes_per_token(c->n_layer, c->n_head_kv, c->head_dim, kvt);
    const double left = budget - used;
    const int page = o->page_size > 0 ? o->page_size : 16;
    if (left < (double)per_tok * page)
        return kiln_errf(err, errlen,
                         "--mem-fraction %g: %.2f GiB of %.2f GiB (%s) are already in use with the weights loaded, which leaves no "
                         "room for a KV cache in %.2f GiB; raise the fraction or use --max-total-tokens",
                         o->mem_fraction, used / G, tot / G, e->be->name, budget / G);
    double t = left / (double)per_tok;
    if (t > 1 << 30) t = 1 << 30;
    int from_mem = (int)t / page * page;
    *tokens = o->max_total_tokens > 0 && o->max_total_tokens < from_mem ? o->max_total_tokens : from_mem;
    kiln_log(KILN_LOG_INFO, "--mem-fraction %g: %.2f GiB in use, KV pool %d tokens (%.2f GiB)", o->mem_fraction, used / G, *tokens,
             (double)*tokens * per_tok / G);
    return 0;
}

static int warm_up(kiln_engine *e, char *err, size_t errlen);

kiln_engine *kiln_engine_open(const struct kiln_engine_opts *o, char *err, size_t errlen) {
    kiln_engine *e = kiln_calloc(1, sizeof *e);
    e->be = backend_create(o->backend, o->n_threads, err, errlen);
    if (!e->be) goto fail;
    int rc;
    if (o->dummy) {
        enum kiln_dtype dt = parse_dtype(o->dummy_dtype);
        if (dt == KILN_DTYPE_NONE) {
            kiln_errf(err, errlen, "--dtype %s: expected bf16, f16 or f32", o->dummy_dtype);
            goto fail;
        }
        rc = model_load_dummy_quant(&e->model, o->dummy, dt, o->quant, o->quant_group, o->seed, e->be, err, errlen);
    } else if (o->model) {
        rc = model_load_dir(&e->model, o->model, e->be, err, errlen);
    } else {
        kiln_errf(err, errlen, "no model: give -m DIR or --dummy NAME");
        goto fail;
    }
    if (rc) goto fail;
    const struct kiln_config *c = &e->model.cfg;
    int page = o->page_size > 0 ? o->page_size : 16;
    int tokens = o->max_total_tokens > 0 ? o->max_total_tokens : (c->max_pos < 32768 ? c->max_pos : 32768);
    enum kiln_dtype kvt = e->be->act_size == 4 ? KILN_DTYPE_F32 : KILN_DTYPE_BF16;
    if (o->kv_dtype && (kvt = parse_dtype(o->kv_dtype)) == KILN_DTYPE_NONE) {
        kiln_errf(err, errlen, "--kv-dtype %s: expected f32, f16, bf16 or q8_0", o->kv_dtype);
        goto fail;
    }
    if (e->be->kv_dtypes && !(e->be->kv_dtypes & (1u << kvt))) {
        char ok[64] = "";
        const enum kiln_dtype kvs[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_Q8_0};
        for (int i = 0; i < 4; i++)
            if (e->be->kv_dtypes & (1u << kvs[i])) snprintf(ok + strlen(ok), sizeof ok - strlen(ok), "%s%s", *ok ? " or " : "", dtype_name(kvs[i]));
        kiln_errf(err, errlen, "--kv-dtype %s: the %s backend keeps its KV cache in %s", o->kv_dtype, e->be->name, ok);
        goto fail;
    }
    if (o->mem_fraction > 0 && kv_tokens_for_fraction(e, o, kvt, &tokens, err, errlen)) goto fail;
    e->max_tokens = tokens;
    e->prefill_chunk = o->prefill_chunk > 0 ? o->prefill_chunk : 512;
    if (kv_pool_init(&e->kv, e->be, c->n_layer, c->n_head_kv, c->head_dim, page, (tokens + page - 1) / page, kvt, err, errlen))
        goto fail;
    if (e->be->warm_at_open && warm_up(e, err, errlen)) goto fail;
    return e;
fail:
    kiln_engine_close(e);
    return NULL;
}

void kiln_engine_close(kiln_engine *e) {
    if (!e) return;
    if (e->kv.ref) kv_pool_free(&e->kv);
    model_free(&e->model);
    if (e->be) e->be->destroy(e->be);
    free(e);
}

const struct kiln_config *kiln_engine_config(const kiln_engine *e) { return &e->model.cfg; }
const char *kiln_engine_backend(const kiln_engine *e) { return e->be->name; }

int kiln_engine_load_width(const kiln_engine *e) { return e->be->load_width ? e->be->load_width(e->be) : 0; }

int kiln_engine_max_tokens(const kiln_engine *e) { return e->max_tokens; }
const char *kiln_engine_model_dir(const kiln_engine *e) { return strncmp(e->model.path, "dummy:", 6) ? e->model.path : NULL; }
int64_t kiln_engine_param_bytes(const kiln_engine *e) { return model_n_bytes(&e->model); }
void kiln_engine_weight_format(const kiln_engine *e, char *buf, size_t len) { model_main_format(&e->model, buf, len); }
int64_t kiln_engine_n_params(const kiln_engine *e) { return model_n_params(&e->model); }

double kiln_engine_decode_bytes(const kiln_engine *e) { return model_decode_bytes(&e->model); }

double kiln_engine_kv_token_bytes(const kiln_engine *e) {
    const struct kv_cache *c = &e->kv.cache;
    return 2.0 * c->n_layer * c->n_head_kv * (double)kv_row_bytes(c->dtype, c->head_dim);
}

const char *kiln_engine_kv_dtype(const kiln_engine *e) { return dtype_name(e->kv.cache.dtype); }

int kiln_engine_is_eos(const kiln_engine *e, int32_t id) {
    const struct kiln_config *c = &e->model.cfg;
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos[i] == id) return 1;
    return 0;
}

/* ==== single sequences ==== */

kiln_seq *kiln_seq_new(kiln_engine *e, char *err, size_t errlen) {
    (void)err, (void)errlen;
    kiln_seq *s = kiln_calloc(1, sizeof *s);
    s->e = e;
    return s;
}

/* gives back the pages past those that n tokens need */
static void seq_trim_pages(kiln_seq *s, int n) {
    const int P = s->e->kv.cache.page_size, keep = (n + P - 1) / P;
    for (int i = keep; i < s->n_pages; i++) kv_pool_release(&s->e->kv, s->pages[i]);
    if (s->n_pages > keep) s->n_pages = keep;
}

void kiln_seq_truncate(kiln_seq *s, int n) {
    if (n < 0) n = 0;
    if (n >= s->len) return;
    seq_trim_pages(s, n);
    s->len = n;
}

void kiln_seq_free(kiln_seq *s) {
    if (!s) return;
    seq_trim_pages(s, 0);
    free(s->pages);
    free(s);
}

int kiln_seq_len(const kiln_seq *s) { return s->len; }

/* makes room in the page table for len + n tokens */
static int seq_reserve(kiln_seq *s, int n, char *err, size_t errlen) {
    kiln_engine *e = s->e;
    const struct kiln_config *c = &e->model.cfg;
    if (s->len + n > c->max_pos)
        return kiln_errf(err, errlen, "%d tokens exceed the model's context of %d", s->len + n, c->max_pos);
    int P = e->kv.cache.page_size, need = (s->len + n + P - 1) / P - s->n_pages;
    if (need <= 0) return 0;
    if (s->n_pages + need > s->cap_pages) {
        s->cap_pages = (s->n_pages + need) * 2;
        s->pages = kiln_realloc(s->pages, sizeof *s->pages * (size_t)s->cap_pages);
    }
    if (kv_pool_alloc(&e->kv, need, s->pages + s->n_pages))
        return kiln_errf(err, errlen, "KV cache full: %d tokens do not fit in %d (raise --max-total-tokens)", s->len + n, e->max_tokens);
    s->n_pages += need;
    return 0;
}

int kiln_seq_eval(kiln_seq *s, const int32_t *ids, int n, float *logits, int all_rows, char *err, size_t errlen) {
    kiln_engine *e = s->e;
    const int V = e->model.cfg.vocab, chunk = e->prefill_chunk;
    if (n <= 0) return kiln_errf(err, errlen, "nothing to evaluate");
    if (seq_reserve(s, n, err, errlen)) return -1;
    int32_t *pos = kiln_malloc(sizeof(int32_t) * (size_t)(n < chunk ? n : chunk));
    int32_t *rows = kiln_malloc(sizeof(int32_t) * (size_t)(n < chunk ? n : chunk));
    int rc = 0;
    for (int off = 0; off < n && rc == 0; off += chunk) {
        int m = n - off < chunk ? n - off : chunk, last = off + m == n;
        for (int i = 0; i < m; i++) pos[i] = s->len + i, rows[i] = i;
        struct kiln_seq_view v = {.start = 0, .n = m, .n_past = s->len, .pages = s->pages, .n_pages = s->n_pages};
        struct kiln_batch b = {.n_tokens = m, .tokens = ids + off, .pos = pos, .n_seqs = 1, .seqs = &v, .n_out = 0, .out_rows = rows};
        float *out = NULL;
        if (logits && all_rows) {
            b.n_out = m;
            out = logits + (size_t)off * V;
        } else if (logits && last) {
            b.n_out = 1;
            rows[0] = m - 1;
            out = logits;
        }
        rc = model_forward(&e->model, &e->kv.cache, &b, out, err, errlen);
        if (rc == 0) s->len += m;
    }
    if (rc) seq_trim_pages(s, s->len); /* the pages reserved for the chunks that did not go in */
    free(pos);
    free(rows);
    return rc;
}

static int seqs_eval(kiln_seq **seqs, int n_seqs, const int32_t *const *ids, const int *n, float *logits, int32_t *next,
                     char *err, size_t errlen) {
    if (n_seqs <= 0) return kiln_errf(err, errlen, "nothing to evaluate");
    kiln_engine *e = seqs[0]->e;
    int total = 0;
    for (int i = 0; i < n_seqs; i++) {
        if (seqs[i]->e != e || n[i] <= 0) return kiln_errf(err, errlen, "kiln_seqs_eval: bad sequence %d", i);
        total += n[i];
    }
    int32_t *tok = kiln_malloc(sizeof(int32_t) * (size_t)total), *pos = kiln_malloc(sizeof(int32_t) * (size_t)total);
    int32_t *rows = kiln_malloc(sizeof(int32_t) * (size_t)n_seqs);
    struct kiln_seq_view *v = kiln_malloc(sizeof *v * (size_t)n_seqs);
    int rc = 0, i, r = 0;
    for (i = 0; i < n_seqs && rc == 0; i++) rc = seq_reserve(seqs[i], n[i], err, errlen);
    if (rc == 0) {
        for (i = 0; i < n_seqs; i++) {
            kiln_seq *s = seqs[i];
            v[i] = (struct kiln_seq_view){.start = r, .n = n[i], .n_past = s->len, .pages = s->pages, .n_pages = s->n_pages};
            for (int j = 0; j < n[i]; j++, r++) tok[r] = ids[i][j], pos[r] = s->len + j;
            rows[i] = r - 1;
        }
        struct kiln_batch b = {.n_tokens = total, .tokens = tok, .pos = pos, .n_seqs = n_seqs, .seqs = v,
                               .n_out = logits || next ? n_seqs : 0, .out_rows = rows, .out_ids = next};
        rc = model_forward(&e->model, &e->kv.cache, &b, logits, err, errlen);
    }
    for (i = 0; i < n_seqs; i++) {
        if (rc == 0) seqs[i]->len += n[i];
        else seq_trim_pages(seqs[i], seqs[i]->len); /* give back pages reserved for this step */
    }
    free(tok), free(pos), free(rows), free(v);
    return rc;
}

int kiln_seqs_eval(kiln_seq **seqs, int n_seqs, const int32_t *const *ids, const int *n, float *logits, char *err,
                   size_t errlen) {
    return seqs_eval(seqs, n_seqs, ids, n, logits, NULL, err, errlen);
}

int kiln_seqs_eval_argmax(kiln_seq **seqs, int n_seqs, const int32_t *const *ids, const int *n, int32_t *next, char *err,
                          size_t errlen) {
    return seqs_eval(seqs, n_seqs, ids, n, NULL, next, err, errlen);
}

/* A GPU engine (the backend's warm_at_open) evaluates one whole prefill
 * chunk before it is handed out:
 * the backend's scratch buffers (attention partials, MoE tables, the batch
 * tables) take their prefill size now, so weights and a KV pool that leave
 * too little device memory for them are an error at start, not a failed
 * request later, and the memory report the backend logs after its first
 * forward counts them. The sequence and its pages are freed after. On the
 * CPU the buffers are host memory and a chunk takes seconds, so it starts
 * cold. */
static int warm_up(kiln_engine *e, char *err, size_t errlen) {
    const int V = e->model.cfg.vocab;
    int n = e->prefill_chunk < e->max_tokens ? e->prefill_chunk : e->max_tokens;
    if (n > e->model.cfg.max_pos) n = e->model.cfg.max_pos;
    if (n > V) n = V; /* distinct ids; any n that fits the pool and the context works */
    if (n < 1) return 0;
    int32_t *ids = kiln_malloc(sizeof(int32_t) * (size_t)n);
    float *logits = kiln_malloc(sizeof(float) * (size_t)V);
    for (int i = 0; i < n; i++) ids[i] = i;
    kiln_seq *s = kiln_seq_new(e, err, errlen);
    int rc = s ? kiln_seq_eval(s, ids, n, logits, 0, err, errlen) : -1;
    kiln_seq_free(s);
    free(ids), free(logits);
    if (rc) return kiln_err_prefix(err, errlen, "warm-up forward of %d tokens on %s: ", n, e->be->name);
    return 0;
}

int kiln_generate(kiln_engine *e, const int32_t *prompt, int n_prompt, int n_gen, const struct kiln_sampling *sp,
                  int ignore_eos, int (*on_token)(int32_t id, void *ctx), void *ctx, char *err, size_t errlen) {
    const int V = e->model.cfg.vocab;
    kiln_seq *s = kiln_seq_new(e, err, errlen);
    float *logits = kiln_malloc(sizeof(float) * (size_t)V);
    struct kiln_sampler smp;
    sampler_init(&smp, sp, V);
    sampler_set_prompt(&smp, prompt, n_prompt);
    int done = 0, rc = kiln_seq_eval(s, prompt, n_prompt, logits, 0, err, errlen);
    while (rc == 0 && done < n_gen) {
        int32_t tok = sampler_sample(&smp, logits);
        sampler_accept(&smp, tok);
        done++;
        if (on_token && on_token(tok, ctx)) break;
        if (!ignore_eos && kiln_engine_is_eos(e, tok)) break;
        if (done < n_gen) rc = kiln_seq_eval(s, &tok, 1, logits, 0, err, errlen);
    }
    sampler_free(&smp);
    free(logits);
    kiln_seq_free(s);
    return rc ? -1 : done;
}

/* ==== inspect ==== */

static void describe_linear(FILE *f, const char *name, const struct qlinear *w) {
    char fmt[64];
    quant_linear_label(w, fmt, sizeof fmt);
    fprintf(f, "  %-28s [%d, %d] %s%s\n", name, w->n_out, w->n_in, fmt, w->bias.data ? " +bias" : "");
}

void kiln_engine_describe(const kiln_engine *e, FILE *f) {
    const struct kiln_model *m = &e->model;
    const struct kiln_config *c = &m->cfg;
    fprintf(f, "model:         %s\n", m->path);
    fprintf(f, "architecture:  %s\n", c->arch_name);
    fprintf(f, "layers:        %d\n", c->n_layer);
    fprintf(f, "hidden:        %d\n", c->dim);
    fprintf(f, "heads:         %d q, %d kv, head_dim %d\n", c->n_head, c->n_head_kv, c->head_dim);
    if (c->n_expert) {
        int n_moe = 0;
        for (int l = 0; l < c->n_layer; l++) n_moe += c->layer_moe[l];
        fprintf(f, "ffn:           MoE %d experts, top-%d, expert ffn %d, norm_topk_prob %s; %d MoE layers, %d dense (ffn %d)\n",
                c->n_expert, c->n_expert_used, c->moe_ffn, c->norm_topk_prob ? "true" : "false", n_moe, c->n_layer - n_moe, c->ffn);
    } else {
        fprintf(f, "ffn:           %d (SwiGLU)\n", c->ffn);
    }
    fprintf(f, "vocab:         %d\n", c->vocab);
    fprintf(f, "context:       %d\n", c->max_pos);
    fprintf(f, "rope:          theta %g, type %d\n", c->rope.theta, (int)c->rope.type);
    fprintf(f, "norm eps:      %g\n", (double)c->rms_eps);
    fprintf(f, "tied lm_head:  %s\n", c->tie_embed ? "yes" : "no");
    fprintf(f, "q/k norm:      %s; qkv bias: %s\n", c->qk_norm ? "yes" : "no", (c->qkv_bias || c->attn_bias) ? "yes" : "no");
    int64_t np = model_n_params(m), nb = model_n_bytes(m);
    fprintf(f, "parameters:    %lld (%.3f B)\n", (long long)np, np / 1e9);
    fprintf(f, "weight bytes:  %lld (%.2f GiB)\n", (long long)nb, nb / (double)(1 << 30));
    fprintf(f, "decode reads:  %.2f GiB of weights per token (as the backend keeps them)\n", model_decode_bytes(m) / (double)(1 << 30));
    model_describe_formats(m, f);
    fprintf(f, "backend:       %s\n", e->be->name);
    size_t kvb = kv_bytes_per_token(c->n_layer, c->n_head_kv, c->head_dim, e->kv.cache.dtype);
    fprintf(f, "kv cache:      %d tokens x %zu bytes = %.1f MiB (%s, pages of %d)\n", e->max_tokens, kvb,
            (double)kvb * e->max_tokens / (1 << 20), dtype_name(e->kv.cache.dtype), e->kv.cache.page_size);
    fprintf(f, "tensors:\n");
    fprintf(f, "  %-28s [%lld, %lld] %s\n", "embed_tokens", (long long)m->embed.rows, (long long)m->embed.cols, dtype_name(m->embed.dtype));
    const struct layer *L = &m->layers[0];
    describe_linear(f, "layers.0.q_proj", &L->wq);
    describe_linear(f, "layers.0.k_proj", &L->wk);
    describe_linear(f, "layers.0.v_proj", &L->wv);
    describe_linear(f, "layers.0.o_proj", &L->wo);
    if (L->is_moe) {
        describe_linear(f, "layers.0.mlp.gate (router)", &L->moe.router);
        describe_linear(f, "layers.0.experts.*.gate_proj", &L->moe.gate[0]);
        describe_linear(f, "layers.0.experts.*.up_proj", &L->moe.up[0]);
        describe_linear(f, "layers.0.experts.*.down_proj", &L->moe.down[0]);
    } else {
        describe_linear(f, "layers.0.gate_proj", &L->gate);
        describe_linear(f, "layers.0.up_proj", &L->up);
        describe_linear(f, "layers.0.down_proj", &L->down);
    }
    describe_linear(f, c->tie_embed ? "lm_head (tied)" : "lm_head", &m->lm_head);
}
