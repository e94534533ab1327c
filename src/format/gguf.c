/*
 * gguf.c: GGUF parsing, metadata and tensor-name mapping, and the tokenizer
 * synthesis (layout in gguf.h). The parser walks the file with a cursor that
 * checks every read against the end; counts are checked against the bytes
 * left before anything is allocated from them.
 */
#include "format/gguf.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "format/quant.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_MAX_DIMS 4

struct cur {
    const uint8_t *p, *end;
};

static int rd(struct cur *c, void *dst, size_t n) {
    if ((size_t)(c->end - c->p) < n) return -1;
    memcpy(dst, c->p, n);
    c->p += n;
    return 0;
}

static int rd_str(struct cur *c, const uint8_t **s, uint64_t *len) {
    if (rd(c, len, 8)) return -1;
    if (*len > (uint64_t)(c->end - c->p)) return -1;
    *s = c->p;
    c->p += *len;
    return 0;
}

static const size_t type_size[GGUF_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* Skips one value of type t; -1 if it runs past the end or is malformed. */
static int skip_val(struct cur *c, uint32_t t, int depth) {
    if (t >= GGUF_NTYPES) return -1;
    if (t == GGUF_STR) {
        const uint8_t *s;
        uint64_t l;
        return rd_str(c, &s, &l);
    }
    if (t == GGUF_ARR) {
        uint32_t at;
        uint64_t n;
        if (depth > 0 || rd(c, &at, 4) || rd(c, &n, 8) || at >= GGUF_NTYPES) return -1;
        if (at == GGUF_STR || at == GGUF_ARR) {
            if (n > (uint64_t)(c->end - c->p) / 8) return -1; /* every element is >= 8 bytes */
            for (uint64_t i = 0; i < n; i++)
                if (skip_val(c, at, depth + 1)) return -1;
            return 0;
        }
        if (n > (uint64_t)(c->end - c->p) / type_size[at]) return -1;
        c->p += n * type_size[at];
        return 0;
    }
    if ((size_t)(c->end - c->p) < type_size[t]) return -1;
    c->p += type_size[t];
    return 0;
}

static char *dup_n(const uint8_t *s, uint64_t n) {
    char *r = kiln_malloc((size_t)n + 1);
    memcpy(r, s, (size_t)n);
    r[n] = 0;
    return r;
}

void kiln_gguf_free(struct gguf_file *g) {
    for (int64_t i = 0; g->kv && i < g->n_kv; i++) free(g->kv[i].key);
    for (int64_t i = 0; g->t && i < g->n_tensors; i++) free(g->t[i].name);
    free(g->kv);
    free(g->t);
    memset(g, 0, sizeof *g);
}

int kiln_gguf_parse(struct gguf_file *g, const uint8_t *data, size_t size, const char *fname, char *err, size_t errlen) {
    memset(g, 0, sizeof *g);
    g->data = data, g->size = size;
    struct cur c = {data, data + size};
    uint32_t magic;
    uint64_t nt, nkv;
    if (rd(&c, &magic, 4) || magic != GGUF_MAGIC) return kiln_errf(err, errlen, "%s: not a GGUF file (bad magic)", fname);
    if (rd(&c, &g->version, 4)) return kiln_errf(err, errlen, "%s: truncated GGUF header", fname);
    if (g->version != 2 && g->version != 3)
        return kiln_errf(err, errlen, "%s: GGUF version %u is not supported (2 and 3 are)", fname, g->version);
    if (rd(&c, &nt, 8) || rd(&c, &nkv, 8)) return kiln_errf(err, errlen, "%s: truncated GGUF header", fname);
    /* a kv is >= 8+4+1 bytes, a tensor info >= 8+4+8+4+8 */
    if (nkv > size / 13 || nt > size / 32)
        return kiln_errf(err, errlen, "%s: GGUF header claims %llu tensors and %llu metadata keys, more than %zu bytes can hold", fname,
                         (unsigned long long)nt, (unsigned long long)nkv, size);
    g->kv = kiln_calloc((size_t)nkv + 1, sizeof *g->kv);
    g->alignment = 32;
    for (uint64_t i = 0; i < nkv; i++) {
        struct gguf_kv *kv = &g->kv[i];
        const uint8_t *ks;
        uint64_t kl;
        uint32_t t;
        if (rd_str(&c, &ks, &kl) || rd(&c, &t, 4)) {
            kiln_gguf_free(g);
            return kiln_errf(err, errlen, "%s: metadata entry %llu runs past the end of the file", fname, (unsigned long long)i);
        }
        kv->key = dup_n(ks, kl);
        g->n_kv = (int64_t)i + 1;
        if (t >= GGUF_NTYPES) {
            kiln_errf(err, errlen, "%s: metadata '%s' has unknown type %u", fname, kv->key, t);
            kiln_gguf_free(g);
            return -1;
        }
        kv->type = (enum gguf_type)t;
        if (t == GGUF_ARR) {
            uint32_t at;
            if ((size_t)(c.end - c.p) < 12) goto bad_kv;
            memcpy(&at, c.p, 4);
            memcpy(&kv->n, c.p + 4, 8);
            kv->arr_type = (enum gguf_type)at;
            kv->val = c.p + 12;
        } else {
            kv->val = c.p;
        }
        if (skip_val(&c, t, 0)) goto bad_kv;
        if (!strcmp(kv->key, "general.alignment")) {
            uint32_t a;
            if (t != GGUF_U32) goto bad_kv;
            memcpy(&a, kv->val, 4);
            if (a == 0 || (a & (a - 1)) || a > (1u << 20)) {
                kiln_errf(err, errlen, "%s: general.alignment %u is not a power of two", fname, a);
                kiln_gguf_free(g);
                return -1;
            }
            g->alignment = a;
        }
        continue;
    bad_kv:
        kiln_errf(err, errlen, "%s: metadata '%s' is malformed or runs past the end of the file", fname, kv->key);
        kiln_gguf_free(g);
        return -1;
    }
    g->t = kiln_calloc((size_t)nt + 1, sizeof *g->t);
    for (uint64_t i = 0; i < nt; i++) {
        struct gguf_tinfo *ti = &g->t[i];
        const uint8_t *ns;
        uint64_t nl;
        uint32_t nd, ty;
        if (rd_str(&c, &ns, &nl)) goto trunc;
        ti->name = dup_n(ns, nl);
        g->n_tensors = (int64_t)i + 1;
        if (rd(&c, &nd, 4)) goto trunc;
        if (nd < 1 || nd > GGUF_MAX_DIMS) {
            kiln_errf(err, errlen, "%s: tensor '%s' has %u dimensions (1..4 allowed)", fname, ti->name, nd);
            kiln_gguf_free(g);
            return -1;
        }
        ti->n_dims = (int)nd;
        uint64_t numel = 1;
        for (uint32_t d = 0; d < 4; d++) ti->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t v;
            if (rd(&c, &v, 8)) goto trunc;
            if (v == 0 || v > (1ull << 40) || numel > (1ull << 50) / v) {
                kiln_errf(err, errlen, "%s: tensor '%s' has a bad dimension ne[%u] = %llu", fname, ti->name, d, (unsigned long long)v);
                kiln_gguf_free(g);
                return -1;
            }
            ti->ne[d] = (int64_t)v;
            numel *= v;
        }
        if (rd(&c, &ty, 4) || rd(&c, &ti->offset, 8)) goto trunc;
        ti->ggml_type = (int)ty;
        const struct quant_type *q = quant_type_ggml((int)ty);
        if (q) {
            if (ti->ne[0] % q->block_elems) {
                kiln_errf(err, errlen, "%s: tensor '%s': row of %lld is not a multiple of the %s block (%d)", fname, ti->name,
                          (long long)ti->ne[0], q->name, q->block_elems);
                kiln_gguf_free(g);
                return -1;
            }
            ti->nbytes = (size_t)(numel / (uint64_t)q->block_elems) * (size_t)q->block_bytes;
        }
        if (ti->offset % g->alignment) {
            kiln_errf(err, errlen, "%s: tensor '%s' offset %llu is not aligned to %zu", fname, ti->name, (unsigned long long)ti->offset, g->alignment);
            kiln_gguf_free(g);
            return -1;
        }
        continue;
    trunc:
        kiln_errf(err, errlen, "%s: tensor info %llu runs past the end of the file", fname, (unsigned long long)i);
        kiln_gguf_free(g);
        return -1;
    }
    size_t off = (size_t)(c.p - data);
    size_t base = (off + g->alignment - 1) / g->alignment * g->alignment;
    if (base > size) base = size;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        struct gguf_tinfo *ti = &g->t[i];
        if (!quant_type_ggml(ti->ggml_type)) continue; /* unknown type: data extent unknown; rejected if used */
        if (ti->offset > size - base || ti->nbytes > size - base - ti->offset) {
            kiln_errf(err, errlen, "%s: tensor '%s' data [%llu, +%zu) runs past the end of the file (truncated?)", fname, ti->name,
                      (unsigned long long)ti->offset, ti->nbytes);
            kiln_gguf_free(g);
            return -1;
        }
        ti->data = data + base + ti->offset;
        for (int64_t j = 0; j < i; j++)
            if (!strcmp(g->t[j].name, ti->name)) {
                kiln_errf(err, errlen, "%s: tensor '%s' appears twice", fname, ti->name);
                kiln_gguf_free(g);
                return -1;
            }
    }
    return 0;
}

/* ==== metadata getters ==== */

const struct gguf_kv *kiln_gguf_find(const struct gguf_file *g, const char *key) {
    for (int64_t i = 0; i < g->n_kv; i++)
        if (!strcmp(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

int kiln_gguf_get_int(const struct gguf_file *g, const char *key, int64_t *out, char *err, size_t errlen) {
    const struct gguf_kv *kv = kiln_gguf_find(g, key);
    if (!kv) return 1;
    const uint8_t *v = kv->val;
    switch (kv->type) {
    case GGUF_U8: *out = v[0]; return 0;
    case GGUF_I8: *out = (int8_t)v[0]; return 0;
    case GGUF_BOOL: *out = v[0] != 0; return 0;
    case GGUF_U16: { uint16_t x; memcpy(&x, v, 2); *out = x; return 0; }
    case GGUF_I16: { int16_t x; memcpy(&x, v, 2); *out = x; return 0; }
    case GGUF_U32: { uint32_t x; memcpy(&x, v, 4); *out = x; return 0; }
    case GGUF_I32: { int32_t x; memcpy(&x, v, 4); *out = x; return 0; }
    case GGUF_U64: { uint64_t x; memcpy(&x, v, 8); if (x > INT64_MAX) break; *out = (int64_t)x; return 0; }
    case GGUF_I64: { int64_t x; memcpy(&x, v, 8); *out = x; return 0; }
    default: break;
    }
    return kiln_errf(err, errlen, "GGUF metadata '%s' is not an integer", key);
}

int kiln_gguf_get_f64(const struct gguf_file *g, const char *key, double *out, char *err, size_t errlen) {
    const struct gguf_kv *kv = kiln_gguf_find(g, key);
    if (!kv) return 1;
    if (kv->type == GGUF_F32) { float f; memcpy(&f, kv->val, 4); *out = f; return 0; }
    if (kv->type == GGUF_F64) { memcpy(out, kv->val, 8); return 0; }
    int64_t i;
    if (kiln_gguf_get_int(g, key, &i, err, errlen) == 0) { *out = (double)i; return 0; }
    return kiln_errf(err, errlen, "GGUF metadata '%s' is not a number", key);
}

char *kiln_gguf_get_str(const struct gguf_file *g, const char *key) {
    const struct gguf_kv *kv = kiln_gguf_find(g, key);
    if (!kv || kv->type != GGUF_STR) return NULL;
    uint64_t l;
    memcpy(&l, kv->val, 8);
    return dup_n(kv->val + 8, l);
}

/* Element i of a string array: walks from the start (arrays were validated
 * at parse). Callers iterate with their own cursor for speed: see str_iter. */
int kiln_gguf_arr_str(const struct gguf_kv *kv, uint64_t i, const char **s, uint64_t *len) {
    if (kv->type != GGUF_ARR || kv->arr_type != GGUF_STR || i >= kv->n) return -1;
    const uint8_t *p = kv->val;
    for (uint64_t j = 0;; j++) {
        uint64_t l;
        memcpy(&l, p, 8);
        if (j == i) {
            *s = (const char *)p + 8, *len = l;
            return 0;
        }
        p += 8 + l;
    }
}

/* ==== metadata -> config ==== */

static const struct {
    const char *gguf, *hf;
    enum kiln_arch arch;
} garchs[] = {
    {"qwen3", "Qwen3ForCausalLM", KILN_ARCH_QWEN3},
    {"qwen3moe", "Qwen3MoeForCausalLM", KILN_ARCH_QWEN3_MOE},
    {"qwen2", "Qwen2ForCausalLM", KILN_ARCH_QWEN2},
    {"llama", "LlamaForCausalLM", KILN_ARCH_LLAMA},
};

static const struct gguf_tinfo *find_t(const struct gguf_file *g, const char *name) {
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->t[i].name, name)) return &g->t[i];
    return NULL;
}

/* {arch}.key as an int in [lo, hi]; 1 if absent */
static int arch_int(const struct gguf_file *g, const char *arch, const char *k, int *out, long lo, long hi, char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, k);
    int64_t v;
    int r = kiln_gguf_get_int(g, key, &v, err, errlen);
    if (r) return r;
    if (v < lo || v > hi) return kiln_errf(err, errlen, "GGUF metadata '%s' = %lld is out of range [%ld, %ld]", key, (long long)v, lo, hi);
    *out = (int)v;
    return 0;
}

static int arch_req(const struct gguf_file *g, const char *arch, const char *k, int *out, long lo, long hi, char *err, size_t errlen) {
    int r = arch_int(g, arch, k, out, lo, hi, err, errlen);
    if (r == 1) return kiln_errf(err, errlen, "GGUF metadata '%s.%s' is missing", arch, k);
    return r;
}

int kiln_gguf_to_config(const struct gguf_file *g, struct kiln_config *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    char *arch = kiln_gguf_get_str(g, "general.architecture");
    if (!arch) return kiln_errf(err, errlen, "GGUF: no general.architecture");
    int found = 0;
    for (size_t i = 0; i < sizeof garchs / sizeof garchs[0]; i++)
        if (!strcmp(arch, garchs[i].gguf)) {
            c->arch = garchs[i].arch;
            snprintf(c->arch_name, sizeof c->arch_name, "%s", garchs[i].hf);
            found = 1;
        }
    if (!found) {
        kiln_errf(err, errlen, "GGUF: architecture '%s' is not supported (qwen3, qwen3moe, qwen2, llama are)", arch);
        free(arch);
        return -1;
    }
    int ok = 0;
    double d;
    if (arch_req(g, arch, "embedding_length", &c->dim, 1, 1 << 17, err, errlen) ||
        arch_req(g, arch, "block_count", &c->n_layer, 1, 4096, err, errlen) ||
        arch_req(g, arch, "attention.head_count", &c->n_head, 1, 4096, err, errlen))
        goto out;
    c->n_head_kv = c->n_head;
    if (arch_int(g, arch, "attention.head_count_kv", &c->n_head_kv, 1, 4096, err, errlen) < 0) goto out;
    c->head_dim = 0;
    if (arch_int(g, arch, "attention.key_length", &c->head_dim, 1, 4096, err, errlen) < 0) goto out;
    if (!c->head_dim) {
        if (c->dim % c->n_head) {
            kiln_errf(err, errlen, "GGUF: embedding_length %d is not a multiple of head_count %d", c->dim, c->n_head);
            goto out;
        }
        c->head_dim = c->dim / c->n_head;
    }
    if (c->head_dim % 2 || c->n_head % c->n_head_kv) {
        kiln_errf(err, errlen, "GGUF: head_dim %d must be even and head_count %d a multiple of head_count_kv %d", c->head_dim, c->n_head, c->n_head_kv);
        goto out;
    }
    c->max_pos = 32768;
    if (arch_int(g, arch, "context_length", &c->max_pos, 1, 1 << 24, err, errlen) < 0) goto out;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    d = 1e-6;
    if (kiln_gguf_get_f64(g, key, &d, err, errlen) < 0) goto out;
    if (!(d > 0 && d < 1)) {
        kiln_errf(err, errlen, "GGUF: %s must be in (0, 1)", key);
        goto out;
    }
    c->rms_eps = (float)d;
    c->rope.type = KILN_ROPE_DEFAULT;
    c->rope.theta = 10000;
    c->rope.beta_fast = 32, c->rope.beta_slow = 1, c->rope.truncate = 1;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    if (kiln_gguf_get_f64(g, key, &c->rope.theta, err, errlen) < 0) goto out;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    char *rs = kiln_gguf_get_str(g, key);
    if (rs && strcmp(rs, "none")) {
        double f = 0, orig = c->max_pos;
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        kiln_gguf_get_f64(g, key, &f, err, errlen);
        snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", arch);
        kiln_gguf_get_f64(g, key, &orig, err, errlen);
        if (!(f > 0) || (strcmp(rs, "linear") && strcmp(rs, "yarn"))) {
            kiln_errf(err, errlen, "GGUF: rope scaling '%s' (factor %g) is not supported (linear, yarn are)", rs, f);
            free(rs);
            goto out;
        }
        c->rope.type = rs[0] == 'l' ? KILN_ROPE_LINEAR : KILN_ROPE_YARN;
        c->rope.factor = f, c->rope.original_max_pos = orig;
    }
    free(rs);
    if (find_t(g, "rope_freqs.weight")) {
        kiln_errf(err, errlen, "GGUF: a rope_freqs tensor (Llama 3 rope scaling) is not supported");
        goto out;
    }
    c->qkv_bias = c->arch == KILN_ARCH_QWEN2;
    c->qk_norm = c->arch == KILN_ARCH_QWEN3 || c->arch == KILN_ARCH_QWEN3_MOE;
    c->attn_bias = c->arch == KILN_ARCH_LLAMA && find_t(g, "blk.0.attn_output.bias");
    if (c->arch == KILN_ARCH_LLAMA && find_t(g, "blk.0.attn_q.bias") && !c->attn_bias) c->qkv_bias = 1;
    c->mlp_bias = find_t(g, "blk.0.ffn_down.bias") != NULL;
    c->tie_embed = find_t(g, "output.weight") == NULL;
    c->dtype = KILN_DTYPE_F32;
    const struct gguf_tinfo *emb = find_t(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2 || emb->ne[0] != c->dim) {
        kiln_errf(err, errlen, "GGUF: token_embd.weight missing or not [vocab, %d]", c->dim);
        goto out;
    }
    c->vocab = (int)emb->ne[1];
    c->ffn = 0;
    if (arch_int(g, arch, "feed_forward_length", &c->ffn, 1, 1 << 20, err, errlen) < 0) goto out;
    c->layer_moe = kiln_calloc((size_t)c->n_layer, 1);
    if (c->arch == KILN_ARCH_QWEN3_MOE) {
        if (arch_req(g, arch, "expert_count", &c->n_expert, 1, 1 << 16, err, errlen) ||
            arch_req(g, arch, "expert_used_count", &c->n_expert_used, 1, c->n_expert, err, errlen) ||
            arch_req(g, arch, "expert_feed_forward_length", &c->moe_ffn, 1, 1 << 20, err, errlen))
            goto out;
        c->norm_topk_prob = 1; /* llama.cpp's qwen3moe graph always renormalizes */
        int nw = 1;
        if (arch_int(g, arch, "expert_weights_norm", &nw, 0, 1, err, errlen) < 0) goto out;
        c->norm_topk_prob = nw;
        for (int l = 0; l < c->n_layer; l++) {
            char n[64];
            snprintf(n, sizeof n, "blk.%d.ffn_gate_inp.weight", l);
            c->layer_moe[l] = find_t(g, n) != NULL;
        }
    }
    for (int l = 0; l < c->n_layer; l++)
        if (!c->layer_moe[l] && !c->ffn) {
            kiln_errf(err, errlen, "GGUF: %s.feed_forward_length missing (layer %d is dense)", arch, l);
            goto out;
        }
    int64_t v;
    c->bos = -1;
    if (kiln_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v, err, errlen) == 0 && v >= 0 && v < (1 << 24)) c->bos = (int)v;
    const char *eos_keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
    for (size_t i = 0; i < 3; i++)
        if (kiln_gguf_get_int(g, eos_keys[i], &v, err, errlen) == 0 && v >= 0 && v < (1 << 24) && c->n_eos < KILN_MAX_EOS) {
            int dup = 0;
            for (int j = 0; j < c->n_eos; j++) dup |= c->eos[j] == v;
            if (!dup) c->eos[c->n_eos++] = (int)v;
        }
    c->quant.method = KILN_QUANT_GGUF;
    ok = 1;
out:
    free(arch);
    if (!ok) {
        config_free(c);
        return -1;
    }
    return 0;
}

/* ==== tensor names ==== */

static const struct {
    const char *gguf, *hf;
} names[] = {
    {"attn_norm", "input_layernorm"}, {"ffn_norm", "post_attention_layernorm"},
    {"attn_q", "self_attn.q_proj"},   {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},   {"attn_output", "self_attn.o_proj"},
    {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},
    {"ffn_gate", "mlp.gate_proj"},    {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},    {"ffn_gate_inp", "mlp.gate"},
};

static enum kiln_dtype dtype_of(int ggml_type) {
    const struct quant_type *q = quant_type_ggml(ggml_type);
    return q ? q->dtype : KILN_DTYPE_NONE;
}

static void add_t(struct st_set *s, const char *name, enum kiln_dtype dt, int ndim, int64_t rows, int64_t cols, const void *data, size_t nb,
                  int file) {
    s->t = kiln_realloc(s->t, sizeof *s->t * (size_t)(s->n + 1));
    struct st_tensor *t = &s->t[s->n++];
    memset(t, 0, sizeof *t);
    t->name = kiln_strdup(name);
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim == 1) t->shape[0] = cols;
    else t->shape[0] = rows, t->shape[1] = cols;
    t->numel = rows * cols;
    t->data = data;
    t->nbytes = nb;
    t->file = file;
}

/* convert_hf_to_gguf's Llama permute: within each head, HF row (i, j)
 * (i in {0,1} the rotate-half, j < hd/2) went to row 2j + i. Undo it. */
static void *unpermute(const uint8_t *src, int64_t rows, size_t rb, int n_head, void *(*alloc)(void *, size_t), void *ctx) {
    uint8_t *dst = alloc(ctx, (size_t)rows * rb);
    if (!dst) return NULL;
    int64_t hd = rows / n_head;
    for (int64_t h = 0; h < n_head; h++)
        for (int i = 0; i < 2; i++)
            for (int64_t j = 0; j < hd / 2; j++)
                memcpy(dst + (size_t)(h * hd + i * (hd / 2) + j) * rb, src + (size_t)(h * hd + 2 * j + i) * rb, rb);
    return dst;
}

int kiln_gguf_to_st(const struct gguf_file *g, const struct kiln_config *c, struct st_set *s, int file, void *(*alloc)(void *, size_t), void *ctx,
               char *err, size_t errlen) {
    char hf[320];
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const struct gguf_tinfo *ti = &g->t[i];
        const char *n = ti->name;
        enum kiln_dtype dt = dtype_of(ti->ggml_type);
        int l = -1, off = 0;
        const char *rest = NULL, *sfx = NULL;
        if (!strcmp(n, "token_embd.weight")) snprintf(hf, sizeof hf, "model.embed_tokens.weight");
        else if (!strcmp(n, "output_norm.weight")) snprintf(hf, sizeof hf, "model.norm.weight");
        else if (!strcmp(n, "output.weight")) snprintf(hf, sizeof hf, "lm_head.weight");
        else if (sscanf(n, "blk.%d.%n", &l, &off) == 1 && off > 0 && l >= 0 && l < c->n_layer) {
            rest = n + off;
            sfx = strrchr(rest, '.');
            if (!sfx) continue;
            size_t bl = (size_t)(sfx - rest);
            const char *what = NULL;
            for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
                if (strlen(names[k].gguf) == bl && !strncmp(rest, names[k].gguf, bl)) what = names[k].hf;
            int exps = !strncmp(rest, "ffn_gate_exps.", 14) || !strncmp(rest, "ffn_up_exps.", 12) || !strncmp(rest, "ffn_down_exps.", 14);
            if (exps) {
                if (!dt) return kiln_errf(err, errlen, "GGUF: tensor '%s' has type %d, which kiln does not support", n, ti->ggml_type);
                if (ti->n_dims != 3 || ti->ne[2] != c->n_expert)
                    return kiln_errf(err, errlen, "GGUF: tensor '%s' is not [%d experts, rows, cols]", n, c->n_expert);
                const char *proj = rest[4] == 'g' ? "gate_proj" : rest[4] == 'u' ? "up_proj" : "down_proj";
                size_t per = ti->nbytes / (size_t)c->n_expert;
                for (int e = 0; e < c->n_expert; e++) {
                    snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.%d.%s%s", l, e, proj, sfx);
                    add_t(s, hf, dt, 2, ti->ne[1], ti->ne[0], ti->data + (size_t)e * per, per, file);
                }
                continue;
            }
            if (!what) continue; /* tensors kiln does not use */
            snprintf(hf, sizeof hf, "model.layers.%d.%s%s", l, what, sfx);
        } else {
            continue;
        }
        if (!dt) return kiln_errf(err, errlen, "GGUF: tensor '%s' has type %d, which kiln does not support (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS are)",
                                  n, ti->ggml_type);
        if (ti->n_dims > 2) return kiln_errf(err, errlen, "GGUF: tensor '%s' has %d dimensions, expected 1 or 2", n, ti->n_dims);
        const void *data = ti->data;
        if (c->arch == KILN_ARCH_LLAMA && rest && (!strncmp(rest, "attn_q.", 7) || !strncmp(rest, "attn_k.", 7))) {
            int nh = rest[5] == 'q' ? c->n_head : c->n_head_kv;
            int64_t rows = ti->n_dims == 2 ? ti->ne[1] : ti->ne[0];
            if (rows % (2 * nh)) return kiln_errf(err, errlen, "GGUF: tensor '%s' rows %lld do not split into %d heads", n, (long long)rows, nh);
            data = unpermute(ti->data, rows, ti->nbytes / (size_t)rows, nh, alloc, ctx);
            if (!data) return kiln_errf(err, errlen, "GGUF: out of memory for tensor '%s' (%zu bytes)", n, ti->nbytes);
        }
        if (ti->n_dims == 1) add_t(s, hf, dt, 1, 1, ti->ne[0], data, ti->nbytes, file);
        else add_t(s, hf, dt, 2, ti->ne[1], ti->ne[0], data, ti->nbytes, file);
    }
    return 0;
}

/* ==== tokenizer.ggml.* -> tokenizer.json ==== */

/* Pre-tokenizer regexes by tokenizer.ggml.pre, as the Hugging Face
 * tokenizer.json files of those families spell them. */
#define RX_QWEN2 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_LLAMA3 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static cJSON *bytelevel(int use_regex) {
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "ByteLevel");
    cJSON_AddBoolToObject(b, "add_prefix_space", 0);
    cJSON_AddBoolToObject(b, "trim_offsets", 0);
    cJSON_AddBoolToObject(b, "use_regex", use_regex);
    return b;
}

static cJSON *split(const char *rx) {
    cJSON *s = cJSON_CreateObject(), *p = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "type", "Split");
    cJSON_AddStringToObject(p, "Regex", rx);
    cJSON_AddItemToObject(s, "pattern", p);
    cJSON_AddStringToObject(s, "behavior", "Isolated");
    cJSON_AddBoolToObject(s, "invert", 0);
    return s;
}

/* Copies the length-prefixed string at *p (u64 length, then bytes; checked
 * at parse time) into *buf, NUL-terminated, and steps *p past it. */
static void take_str(const uint8_t **p, char **buf, size_t *cap) {
    uint64_t l;
    memcpy(&l, *p, 8);
    if (l + 1 > *cap) *buf = kiln_realloc(*buf, *cap = (size_t)l + 64);
    memcpy(*buf, *p + 8, (size_t)l);
    (*buf)[l] = 0;
    *p += 8 + l;
}

int kiln_gguf_tokenizer_json(const struct gguf_file *g, char **json_out, size_t *len_out, char *err, size_t errlen) {
    *json_out = NULL;
    char *model = kiln_gguf_get_str(g, "tokenizer.ggml.model");
    if (!model) return kiln_errf(err, errlen, "GGUF: no tokenizer (tokenizer.ggml.model missing)");
    if (strcmp(model, "gpt2")) {
        kiln_errf(err, errlen, "GGUF: tokenizer model '%s' is not supported (only gpt2, byte-level BPE)", model);
        free(model);
        return -1;
    }
    free(model);
    const struct gguf_kv *tok = kiln_gguf_find(g, "tokenizer.ggml.tokens"), *mer = kiln_gguf_find(g, "tokenizer.ggml.merges");
    const struct gguf_kv *typ = kiln_gguf_find(g, "tokenizer.ggml.token_type");
    if (!tok || tok->type != GGUF_ARR || tok->arr_type != GGUF_STR) return kiln_errf(err, errlen, "GGUF: tokenizer.ggml.tokens missing or not strings");
    if (!mer || mer->type != GGUF_ARR || mer->arr_type != GGUF_STR) return kiln_errf(err, errlen, "GGUF: tokenizer.ggml.merges missing or not strings");
    if (typ && (typ->type != GGUF_ARR || (typ->arr_type != GGUF_I32 && typ->arr_type != GGUF_U32) || typ->n != tok->n))
        return kiln_errf(err, errlen, "GGUF: tokenizer.ggml.token_type is not an int32 array as long as the tokens");
    char *pre = kiln_gguf_get_str(g, "tokenizer.ggml.pre");
    const char *rx = NULL;
    int digits = 0, gpt2_regex = 0;
    if (!pre || !strcmp(pre, "qwen2") || !strcmp(pre, "deepseek-r1-qwen")) rx = RX_QWEN2;
    else if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) rx = RX_LLAMA3;
    else if (!strcmp(pre, "smollm")) digits = 1, gpt2_regex = 1;
    else if (!strcmp(pre, "gpt2") || !strcmp(pre, "default")) gpt2_regex = 1;
    else {
        kiln_errf(err, errlen, "GGUF: tokenizer.ggml.pre '%s' is not supported (qwen2, llama-bpe, smollm, gpt2 are)", pre);
        free(pre);
        return -1;
    }
    int nfc = !pre || !strcmp(pre, "qwen2") || !strcmp(pre, "deepseek-r1-qwen");
    free(pre);

    cJSON *root = cJSON_CreateObject(), *added = cJSON_CreateArray(), *vocab = cJSON_CreateObject(), *merges = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON_AddItemToObject(root, "added_tokens", added);
    if (nfc) {
        cJSON *nm = cJSON_CreateObject();
        cJSON_AddStringToObject(nm, "type", "NFC");
        cJSON_AddItemToObject(root, "normalizer", nm);
    } else {
        cJSON_AddNullToObject(root, "normalizer");
    }
    cJSON *pt = cJSON_CreateObject(), *seq = cJSON_CreateArray();
    cJSON_AddStringToObject(pt, "type", "Sequence");
    if (digits) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "type", "Digits");
        cJSON_AddBoolToObject(d, "individual_digits", 1);
        cJSON_AddItemToArray(seq, d);
    }
    if (rx) cJSON_AddItemToArray(seq, split(rx));
    cJSON_AddItemToArray(seq, bytelevel(gpt2_regex));
    cJSON_AddItemToObject(pt, "pretokenizers", seq);
    cJSON_AddItemToObject(root, "pre_tokenizer", pt);
    cJSON_AddItemToObject(root, "post_processor", bytelevel(0));
    cJSON_AddItemToObject(root, "decoder", bytelevel(0));
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddNullToObject(m, "dropout");
    cJSON_AddNullToObject(m, "unk_token");
    cJSON_AddStringToObject(m, "continuing_subword_prefix", "");
    cJSON_AddStringToObject(m, "end_of_word_suffix", "");
    cJSON_AddBoolToObject(m, "fuse_unk", 0);
    cJSON_AddBoolToObject(m, "byte_fallback", 0);
    cJSON_AddBoolToObject(m, "ignore_merges", 0);
    cJSON_AddItemToObject(m, "vocab", vocab);
    cJSON_AddItemToObject(m, "merges", merges);
    cJSON_AddItemToObject(root, "model", m);

    /* token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user
     * defined, 5 unused, 6 byte. Control and user-defined tokens are the
     * added tokens (control = special); the rest form the BPE vocab. */
    const uint8_t *p = tok->val;
    char *buf = NULL;
    size_t cap = 0;
    for (uint64_t i = 0; i < tok->n; i++) {
        take_str(&p, &buf, &cap);
        int32_t ty = 1;
        if (typ) memcpy(&ty, typ->val + 4 * i, 4);
        if (ty == 3 || ty == 4) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", buf);
            cJSON_AddBoolToObject(a, "single_word", 0);
            cJSON_AddBoolToObject(a, "lstrip", 0);
            cJSON_AddBoolToObject(a, "rstrip", 0);
            cJSON_AddBoolToObject(a, "normalized", 0);
            cJSON_AddBoolToObject(a, "special", ty == 3);
            cJSON_AddItemToArray(added, a);
        } else if (ty != 5) {
            cJSON_AddItemToObject(vocab, buf, cJSON_CreateNumber((double)i));
        }
    }
    p = mer->val;
    for (uint64_t i = 0; i < mer->n; i++) {
        take_str(&p, &buf, &cap);
        char *sp = strchr(buf, ' ');
        if (!sp || sp == buf || !sp[1]) {
            kiln_errf(err, errlen, "GGUF: tokenizer.ggml.merges[%llu] '%.40s' is not two tokens separated by a space", (unsigned long long)i, buf);
            free(buf);
            cJSON_Delete(root);
            return -1;
        }
        *sp = 0;
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(buf));
        cJSON_AddItemToArray(pair, cJSON_CreateString(sp + 1));
        cJSON_AddItemToArray(merges, pair);
    }
    free(buf);
    char *txt = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!txt) return kiln_errf(err, errlen, "GGUF: out of memory writing tokenizer.json");
    *json_out = txt;
    if (len_out) *len_out = strlen(txt);
    return 0;
}

int kiln_gguf_tokenizer_json_file(const char *path, char **json_out, size_t *len_out, char *err, size_t errlen) {
    struct kiln_file f;
    if (kiln_file_map(&f, path, err, errlen)) return -1;
    struct gguf_file g;
    int rc = kiln_gguf_parse(&g, f.data, f.size, path, err, errlen);
    if (rc == 0) {
        rc = kiln_gguf_tokenizer_json(&g, json_out, len_out, err, errlen);
        kiln_gguf_free(&g);
    }
    kiln_file_unmap(&f);
    return rc;
}

int kiln_gguf_is_file(const char *path) {
    if (kiln_is_dir(path)) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint32_t m = 0;
    size_t n = fread(&m, 1, 4, f);
    fclose(f);
    return n == 4 && m == GGUF_MAGIC;
}
