/*
 * qwen3.c: the forward pass of the Qwen3 family (Qwen3, Qwen3-MoE, Qwen2,
 * Llama), written once against the backend op table. The architectures
 * differ only in switches the loader set: q/k norm (Qwen3), q/k/v bias
 * (Qwen2; it rides inside the qlinear), sparse MoE layers (Qwen3-MoE).
 *
 * Per layer, mirroring transformers' Qwen3DecoderLayer:
 *   xb = input_layernorm(x)
 *   q, k, v = q_proj(xb), k_proj(xb), v_proj(xb)
 *   q, k = rope(q_norm(q)), rope(k_norm(k))       # norms per head, Qwen3 only
 *   att = softmax(q k^T / sqrt(head_dim), causal) v # GQA over the paged cache
 *   x = x + o_proj(att)
 *   xb = post_attention_layernorm(x)
 *   x = x + down_proj(silu(gate_proj(xb)) * up_proj(xb))   # or the MoE block
 * then logits = lm_head(norm(x)) for the rows that sample only.
 */
#include <math.h>

#include "base/base.h"
#include "model/model.h"

/* Grows the activation workspace to hold n tokens. */
static int ensure_ws(struct kiln_model *m, int n, int n_out, char *err, size_t errlen) {
    const struct kiln_config *c = &m->cfg;
    struct kiln_backend *be = m->be;
    if (n_out > m->out_cap) {
        if (m->out_logits) be->free(be, m->out_logits);
        if (!(m->out_logits = be->alloc(be, (size_t)n_out * c->vocab * be->act_size))) {
            m->out_cap = 0;
            return kiln_errf(err, errlen, "%s: cannot allocate logits for %d rows", be->name, n_out);
        }
        m->out_cap = n_out;
    }
    if (n <= m->ws_cap) return 0;
    void **ws[] = {&m->x, &m->xb, &m->q, &m->k, &m->v, &m->att, &m->hb, &m->hb2, &m->out_x};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        if (*ws[i]) be->free(be, *ws[i]), *ws[i] = NULL;
    int qd = c->n_head * c->head_dim, kvd = c->n_head_kv * c->head_dim;
    int hw = c->ffn > c->dim ? c->ffn : c->dim;
    if (c->moe_ffn > hw) hw = c->moe_ffn;
    size_t a = be->act_size, N = (size_t)n;
    size_t sz[] = {N * c->dim, N * c->dim, N * qd, N * kvd, N * kvd, N * qd, N * hw, N * hw, N * c->dim};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        if (!(*ws[i] = be->alloc(be, sz[i] * a))) {
            m->ws_cap = 0;
            return kiln_errf(err, errlen, "%s: cannot allocate %zu bytes of activations for %d tokens", be->name, sz[i] * a, n);
        }
    m->ws_cap = n;
    return 0;
}

/* linears that read the same x: one op where the backend has it */
static void matmul_multi(struct kiln_backend *be, void *const *outs, const void *x, const struct qlinear *const *ws, int count, int n) {
    if (be->matmul_multi) {
        be->matmul_multi(be, outs, x, ws, count, n);
        return;
    }
    for (int i = 0; i < count; i++) be->matmul(be, outs[i], x, ws[i], n);
}

int model_forward(struct kiln_model *m, struct kv_cache *kv, const struct kiln_batch *b, float *logits, char *err,
                  size_t errlen) {
    const struct kiln_config *c = &m->cfg;
    struct kiln_backend *be = m->be;
    const int n = b->n_tokens, dim = c->dim, hd = c->head_dim;
    const float eps = c->rms_eps, scale = 1.0f / sqrtf((float)hd);
    if (n <= 0) return kiln_errf(err, errlen, "forward: empty batch");
    for (int i = 0; i < n; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab)
            return kiln_errf(err, errlen, "token id %d is outside the vocabulary [0, %d)", b->tokens[i], c->vocab);
    if (ensure_ws(m, n, b->n_out, err, errlen)) return -1;
    if (be->begin(be, b)) { /* the backend's own account first (a failed device call), else the tables' memory */
        if (be->error && be->error(be, err, errlen)) return -1;
        return kiln_errf(err, errlen, "%s: cannot start the forward (no memory for the batch's tables)", be->name);
    }

    be->embed(be, m->x, &m->embed, b);
    be->rmsnorm(be, m->xb, m->x, &m->layers[0].attn_norm, n, dim, eps);
    /* x: the residual stream, nr rows of it. After the last layer's
     * attention only the rows that give logits matter (the KV cache is
     * written by then), so when those are fewer than n, the o projection
     * and the FFN of that layer run on them alone, gathered into out_x (with
     * their attention rows in q): ~1/n_layer of a long prefill's work, and
     * all of that layer's tail for a prefill chunk that wants no logits */
    void *x = m->x, *att = m->att;
    int nr = n;
    for (int l = 0; l < c->n_layer; l++) {
        struct layer *L = &m->layers[l];
        const int last = l + 1 == c->n_layer;
        /* attention */
        {
            void *outs[3] = {m->q, m->k, m->v};
            const struct qlinear *ws[3] = {&L->wq, &L->wk, &L->wv};
            matmul_multi(be, outs, m->xb, ws, 3, n);
        }
        be->qk_norm_rope(be, m->q, m->k, c->qk_norm ? &L->q_norm : NULL, c->qk_norm ? &L->k_norm : NULL, &m->rope, b,
                         c->n_head, c->n_head_kv, hd, eps);
        be->kv_write(be, kv, l, m->k, m->v, b);
        be->attention(be, m->att, m->q, kv, l, b, c->n_head, scale);
        if (last && b->n_out < n) {
            if (b->n_out == 0) return be->error ? be->error(be, err, errlen) : 0;
            be->gather_rows(be, m->q, m->att, b->out_rows, b->n_out, c->n_head * hd);
            be->gather_rows(be, m->out_x, m->x, b->out_rows, b->n_out, dim);
            x = m->out_x, att = m->q, nr = b->n_out;
        }
        be->matmul(be, m->xb, att, &L->wo, nr);
        /* x = x + o_proj(att); xb = post_attention_layernorm(x) */
        be->add_rmsnorm(be, x, m->xb, m->xb, &L->ffn_norm, nr, dim, eps);
        /* feed-forward */
        if (L->is_moe) {
            be->moe(be, m->hb2, m->xb, &L->moe, nr, dim);
            /* x = x + moe(xb); xb = next layer's input_layernorm(x) */
            if (!last)
                be->add_rmsnorm(be, x, m->xb, m->hb2, &m->layers[l + 1].attn_norm, nr, dim, eps);
            else
                be->add(be, x, m->hb2, (size_t)nr * dim);
            continue;
        }
        {
            void *outs[2] = {m->hb, m->hb2};
            const struct qlinear *ws[2] = {&L->gate, &L->up};
            matmul_multi(be, outs, m->xb, ws, 2, nr);
        }
        be->swiglu(be, m->hb, m->hb, m->hb2, nr, c->ffn);
        be->matmul(be, m->xb, m->hb, &L->down, nr);
        if (!last)
            be->add_rmsnorm(be, x, m->xb, m->xb, &m->layers[l + 1].attn_norm, nr, dim, eps);
        else
            be->add(be, x, m->xb, (size_t)nr * dim);
    }
    /* final norm and lm_head, only for the rows that sample (gathered
     * already when the last layer ran on them alone; a batch without any
     * returned after the last layer's attention, as n >= 1 > n_out) */
    if (x != m->out_x) be->gather_rows(be, m->out_x, m->x, b->out_rows, b->n_out, dim);
    be->rmsnorm(be, m->out_x, m->out_x, &m->norm, b->n_out, dim, eps);
    be->matmul(be, m->out_logits, m->out_x, &m->lm_head, b->n_out);
    const size_t V = (size_t)c->vocab;
    if (!b->out_ids) {
        be->read(be, logits, m->out_logits, (size_t)b->n_out * V);
        return be->error ? be->error(be, err, errlen) : 0;
    }
    be->argmax(be, b->out_ids, m->out_logits, b->n_out, (int)V);
    /* then the rows that want their logits, in runs of adjacent rows */
    for (int i = 0, j; logits && i < b->n_out; i = j) {
        if (b->out_full && !b->out_full[i]) {
            j = i + 1;
            continue;
        }
        for (j = i + 1; j < b->n_out && (!b->out_full || b->out_full[j]); j++) {}
        be->read(be, logits + (size_t)i * V, (const char *)m->out_logits + (size_t)i * V * be->act_size, (size_t)(j - i) * V);
    }
    return be->error ? be->error(be, err, errlen) : 0;
}
