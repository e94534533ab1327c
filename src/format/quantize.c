/*
 * quantize.c: `kiln quantize`, round-to-nearest, and the GGUF writer.
 *
 *   q8_0 | q4_0 | q4_k  -> one GGUF v3 file, named and laid out as llama.cpp's
 *                          convert_hf_to_gguf.py writes it (blk.N.attn_q.weight,
 *                          merged expert tensors, Llama q/k rows permuted,
 *                          tokenizer.ggml.* from tokenizer.json when present).
 *                          Linears (and the embedding) in the target type; a row
 *                          that does not fit a 256-block gets Q8_0, as llama.cpp
 *                          falls back; norms F32.
 *   gptq-int4 | gptq-int8 -> a Hugging Face folder: AutoGPTQ v1 layout,
 *                          sym, desc_act false, group_size G (default 128).
 *   fp8                 -> a Hugging Face folder: e4m3, 128x128 blocks, BF16
 *                          weight_scale_inv, the Qwen -FP8 layout.
 * Routers (mlp.gate), lm_head, norms and embeddings of the HF outputs stay
 * as stored. One linear at a time is dequantized to f32 as the source.
 *
 * GGUF writer: metadata and tensor infos are collected in memory, then
 * written as header | kv | infos | pad to 32 | data (each tensor aligned 32).
 */
#include "format/quantize.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "base/base.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "model/model.h"

/* ==== the GGUF writer ==== */

struct buf {
    uint8_t *p;
    size_t n, cap;
};

static void put(struct buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = kiln_realloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(struct buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

struct wtensor {
    char *name;
    int type, n_dims;
    int64_t ne[4];
    uint8_t *data;
    size_t nbytes;
};

struct gguf_writer {
    struct buf kv;
    uint64_t n_kv;
    struct wtensor *t;
    int n_t;
};

struct gguf_writer *kiln_gguf_writer_new(void) { return kiln_calloc(1, sizeof(struct gguf_writer)); }

void kiln_gguf_writer_free(struct gguf_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name), free(w->t[i].data);
    free(w->t);
    free(w->kv.p);
    free(w);
}

void kiln_gguf_w_str(struct gguf_writer *w, const char *key, const char *val) {
    put_str(&w->kv, key), put_u32(&w->kv, GGUF_STR), put_str(&w->kv, val), w->n_kv++;
}
void kiln_gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v) {
    put_str(&w->kv, key), put_u32(&w->kv, GGUF_U32), put_u32(&w->kv, v), w->n_kv++;
}
void kiln_gguf_w_f32(struct gguf_writer *w, const char *key, float v) {
    put_str(&w->kv, key), put_u32(&w->kv, GGUF_F32), put(&w->kv, &v, 4), w->n_kv++;
}
void kiln_gguf_w_bool(struct gguf_writer *w, const char *key, int v) {
    uint8_t b = (uint8_t)(v != 0);
    put_str(&w->kv, key), put_u32(&w->kv, GGUF_BOOL), put(&w->kv, &b, 1), w->n_kv++;
}
void kiln_gguf_w_arr_str(struct gguf_writer *w, const char *key, const char *const *s, size_t n) {
    put_str(&w->kv, key), put_u32(&w->kv, GGUF_ARR), put_u32(&w->kv, GGUF_STR), put_u64(&w->kv, n);
    for (size_t i = 0; i < n; i++) put_str(&w->kv, s[i]);
    w->n_kv++;
}
void kiln_gguf_w_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, size_t n) {
    put_str(&w->kv, key), put_u32(&w->kv, GGUF_ARR), put_u32(&w->kv, GGUF_I32), put_u64(&w->kv, n), put(&w->kv, v, 4 * n);
    w->n_kv++;
}

void kiln_gguf_w_tensor(struct gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne, const void *data, size_t nbytes) {
    w->t = kiln_realloc(w->t, sizeof *w->t * (size_t)(w->n_t + 1));
    struct wtensor *t = &w->t[w->n_t++];
    memset(t, 0, sizeof *t);
    t->name = kiln_strdup(name);
    t->type = type, t->n_dims = n_dims;
    for (int i = 0; i < n_dims; i++) t->ne[i] = ne[i];
    t->data = kiln_malloc(nbytes ? nbytes : 1);
    memcpy(t->data, data, nbytes);
    t->nbytes = nbytes;
}

void kiln_gguf_writer_bytes(struct gguf_writer *w, uint8_t **out, size_t *len) {
    struct buf b = {0};
    put_u32(&b, 0x46554747u), put_u32(&b, 3), put_u64(&b, (uint64_t)w->n_t), put_u64(&b, w->n_kv);
    put(&b, w->kv.p, w->kv.n);
    uint64_t off = 0;
    for (int i = 0; i < w->n_t; i++) {
        struct wtensor *t = &w->t[i];
        put_str(&b, t->name), put_u32(&b, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) put_u64(&b, (uint64_t)t->ne[d]);
        put_u32(&b, (uint32_t)t->type), put_u64(&b, off);
        off += (t->nbytes + 31) / 32 * 32;
    }
    static const uint8_t zero[32];
    put(&b, zero, (32 - b.n % 32) % 32);
    for (int i = 0; i < w->n_t; i++) {
        put(&b, w->t[i].data, w->t[i].nbytes);
        put(&b, zero, (32 - w->t[i].nbytes % 32) % 32);
    }
    *out = b.p, *len = b.n;
}

int kiln_gguf_writer_save(struct gguf_writer *w, const char *path, char *err, size_t errlen) {
    uint8_t *p;
    size_t n;
    kiln_gguf_writer_bytes(w, &p, &n);
    FILE *f = fopen(path, "wb");
    int rc = f && fwrite(p, 1, n, f) == n ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    free(p);
    return rc ? kiln_errf(err, errlen, "%s: cannot write: %s", path, strerror(errno)) : 0;
}

/* ==== tokenizer.json -> tokenizer.ggml.* ==== */

int kiln_gguf_w_tokenizer(struct gguf_writer *w, const char *dir, int n_vocab) {
    char *p = kiln_path_join(dir, "tokenizer.json"), e[256];
    char *txt = kiln_file_exists(p) ? kiln_read_file(p, NULL, e, sizeof e) : NULL;
    free(p);
    cJSON *root = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    const cJSON *m = cJSON_GetObjectItem(root, "model"), *vocab = cJSON_GetObjectItem(m, "vocab"), *merges = cJSON_GetObjectItem(m, "merges");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        if (root) kiln_log(KILN_LOG_WARN, "quantize: %s/tokenizer.json is not a BPE tokenizer; the GGUF has no tokenizer", dir);
        cJSON_Delete(root);
        return 1;
    }
    int n = n_vocab;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) if (it->valueint >= n) n = it->valueint + 1;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(root, "added_tokens")) {
        int id = cJSON_GetObjectItem(it, "id") ? cJSON_GetObjectItem(it, "id")->valueint : -1;
        if (id >= n) n = id + 1;
    }
    char **tok = kiln_calloc((size_t)n, sizeof *tok);
    int32_t *ty = kiln_malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) ty[i] = 5; /* unused until named */
    cJSON_ArrayForEach(it, vocab) if (it->valueint >= 0) tok[it->valueint] = kiln_strdup(it->string), ty[it->valueint] = 1;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(root, "added_tokens")) {
        const cJSON *id = cJSON_GetObjectItem(it, "id"), *ct = cJSON_GetObjectItem(it, "content");
        if (!cJSON_IsNumber(id) || !cJSON_IsString(ct) || id->valueint < 0) continue;
        free(tok[id->valueint]);
        tok[id->valueint] = kiln_strdup(ct->valuestring);
        ty[id->valueint] = cJSON_IsTrue(cJSON_GetObjectItem(it, "special")) ? 3 : 4;
    }
    for (int i = 0; i < n; i++)
        if (!tok[i]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%d]", i);
            tok[i] = kiln_strdup(pad);
        }
    int nm = cJSON_GetArraySize(merges), k = 0;
    char **mg = kiln_calloc((size_t)nm + 1, sizeof *mg);
    cJSON_ArrayForEach(it, merges) {
        if (cJSON_IsString(it)) mg[k++] = kiln_strdup(it->valuestring);
        else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2) {
            const char *a = cJSON_GetArrayItem(it, 0)->valuestring, *b = cJSON_GetArrayItem(it, 1)->valuestring;
            if (!a || !b) continue;
            mg[k] = kiln_malloc(strlen(a) + strlen(b) + 2);
            sprintf(mg[k++], "%s %s", a, b);
        }
    }
    char *pj = cJSON_PrintUnformatted(cJSON_GetObjectItem(root, "pre_tokenizer"));
    const char *pre = pj && strstr(pj, "\\\\p{N}{1,3}") ? "llama-bpe" : pj && strstr(pj, "Digits") ? "smollm" : "qwen2";
    free(pj);
    kiln_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    kiln_gguf_w_str(w, "tokenizer.ggml.pre", pre);
    kiln_gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, (size_t)n);
    kiln_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", ty, (size_t)n);
    kiln_gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)mg, (size_t)k);
    for (int i = 0; i < n; i++) free(tok[i]);
    for (int i = 0; i < k; i++) free(mg[i]);
    free(tok), free(ty), free(mg);
    cJSON_Delete(root);
    return 0;
}

/* ==== GGUF output ==== */

static const char *gguf_arch(enum kiln_arch a) {
    return a == KILN_ARCH_QWEN3 ? "qwen3" : a == KILN_ARCH_QWEN3_MOE ? "qwen3moe" : a == KILN_ARCH_QWEN2 ? "qwen2" : "llama";
}

/* rows quantized to t (fallback Q8_0, then F16 when no block fits) */
static void put_matrix(struct gguf_writer *w, const char *name, const float *x, int64_t rows, int64_t cols, enum kiln_dtype t,
                       int permute_heads) {
    if (cols % quant_type_of(t)->block_elems) t = cols % 32 ? KILN_DTYPE_F16 : KILN_DTYPE_Q8_0;
    const struct quant_type *q = quant_type_of(t);
    size_t rb = quant_row_bytes(t, cols);
    uint8_t *d = kiln_malloc(rb * (size_t)rows);
    int64_t hd = permute_heads ? rows / permute_heads : 0;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t src = r;
        if (permute_heads) { /* convert_hf_to_gguf's Llama permute: GGUF row h*hd + 2j + i <- HF row h*hd + i*hd/2 + j */
            int64_t h = r / hd, in = r % hd, j = in / 2, i = in % 2;
            src = h * hd + i * (hd / 2) + j;
        }
        const float *xr = x + (size_t)src * cols;
        uint8_t *o = d + (size_t)r * rb;
        if (t == KILN_DTYPE_F16)
            for (int64_t k = 0; k < cols; k++) {
                uint16_t h16 = kiln_f32_to_f16(xr[k]);
                memcpy(o + 2 * k, &h16, 2);
            }
        else if (t == KILN_DTYPE_F32) memcpy(o, xr, (size_t)cols * 4);
        else quant_quantize_row(t, xr, o, cols);
    }
    int64_t ne[2] = {cols, rows};
    kiln_gguf_w_tensor(w, name, q->ggml_type, 2, ne, d, rb * (size_t)rows);
    free(d);
}

static float *linear_f32(const struct qlinear *l) {
    float *x = kiln_malloc(sizeof(float) * (size_t)l->n_out * l->n_in);
    quant_dequant_linear(l, x);
    return x;
}

static float *tensor_f32(const struct ktensor *t) {
    float *x = kiln_malloc(sizeof(float) * (size_t)(t->rows * t->cols));
    quant_dequant_row(t->dtype, t->data, x, t->rows * t->cols);
    return x;
}

static void put_vec(struct gguf_writer *w, const char *name, const struct ktensor *t) {
    float *x = tensor_f32(t);
    int64_t ne[1] = {t->cols};
    kiln_gguf_w_tensor(w, name, 0, 1, ne, x, sizeof(float) * (size_t)t->cols);
    free(x);
}

static void put_lin(struct gguf_writer *w, const char *name, const struct qlinear *l, enum kiln_dtype t, int permute) {
    float *x = linear_f32(l);
    put_matrix(w, name, x, l->n_out, l->n_in, t, permute);
    free(x);
    if (l->bias.data) {
        char bn[256];
        snprintf(bn, sizeof bn, "%.*s.bias", (int)(strlen(name) - 7), name);
        float *b = tensor_f32(&l->bias);
        if (permute) { /* biases are permuted like their rows */
            float *pb = kiln_malloc(sizeof(float) * (size_t)l->n_out);
            int64_t hd = l->n_out / permute;
            for (int64_t r = 0; r < l->n_out; r++) pb[r] = b[(r / hd) * hd + (r % hd % 2) * (hd / 2) + (r % hd) / 2];
            free(b);
            b = pb;
        }
        int64_t ne[1] = {l->n_out};
        kiln_gguf_w_tensor(w, bn, 0, 1, ne, b, sizeof(float) * (size_t)l->n_out);
        free(b);
    }
}

static int write_gguf(const struct kiln_model *m, const char *src, enum kiln_dtype t, const char *out, char *err, size_t errlen) {
    const struct kiln_config *c = &m->cfg;
    const char *a = gguf_arch(c->arch);
    struct gguf_writer *w = kiln_gguf_writer_new();
    char k[128];
    kiln_gguf_w_str(w, "general.architecture", a);
    kiln_gguf_w_str(w, "general.name", "kiln quantize");
    kiln_gguf_w_u32(w, "general.file_type", t == KILN_DTYPE_Q8_0 ? 7 : t == KILN_DTYPE_Q4_0 ? 2 : 15);
#define KV_U32(key, v) (snprintf(k, sizeof k, "%s." key, a), kiln_gguf_w_u32(w, k, (uint32_t)(v)))
    KV_U32("block_count", c->n_layer);
    KV_U32("context_length", c->max_pos);
    KV_U32("embedding_length", c->dim);
    if (c->ffn) KV_U32("feed_forward_length", c->ffn);
    KV_U32("attention.head_count", c->n_head);
    KV_U32("attention.head_count_kv", c->n_head_kv);
    KV_U32("attention.key_length", c->head_dim);
    KV_U32("attention.value_length", c->head_dim);
    if (c->n_expert) {
        KV_U32("expert_count", c->n_expert);
        KV_U32("expert_used_count", c->n_expert_used);
        KV_U32("expert_feed_forward_length", c->moe_ffn);
    }
#undef KV_U32
    snprintf(k, sizeof k, "%s.rope.freq_base", a), kiln_gguf_w_f32(w, k, (float)c->rope.theta);
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", a), kiln_gguf_w_f32(w, k, c->rms_eps);
    if (c->rope.type == KILN_ROPE_LINEAR || c->rope.type == KILN_ROPE_YARN) {
        snprintf(k, sizeof k, "%s.rope.scaling.type", a), kiln_gguf_w_str(w, k, c->rope.type == KILN_ROPE_LINEAR ? "linear" : "yarn");
        snprintf(k, sizeof k, "%s.rope.scaling.factor", a), kiln_gguf_w_f32(w, k, (float)c->rope.factor);
        snprintf(k, sizeof k, "%s.rope.scaling.original_context_length", a), kiln_gguf_w_u32(w, k, (uint32_t)c->rope.original_max_pos);
    } else if (c->rope.type != KILN_ROPE_DEFAULT) {
        kiln_gguf_writer_free(w);
        return kiln_errf(err, errlen, "quantize: this rope scaling type cannot be written to GGUF by kiln");
    }
    if (c->bos >= 0) kiln_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos);
    if (c->n_eos) kiln_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos[0]);
    if (strncmp(src, "dummy:", 6)) kiln_gguf_w_tokenizer(w, src, c->vocab);

    float *emb = tensor_f32(&m->embed);
    put_matrix(w, "token_embd.weight", emb, m->embed.rows, m->embed.cols, t, 0);
    free(emb);
    put_vec(w, "output_norm.weight", &m->norm);
    if (!c->tie_embed) put_lin(w, "output.weight", &m->lm_head, t == KILN_DTYPE_Q4_K ? KILN_DTYPE_Q8_0 : t, 0);
    int llama = c->arch == KILN_ARCH_LLAMA;
    char n[256];
    for (int l = 0; l < c->n_layer; l++) {
        const struct layer *L = &m->layers[l];
#define NM(s) (snprintf(n, sizeof n, "blk.%d." s, l), n)
        put_vec(w, NM("attn_norm.weight"), &L->attn_norm);
        put_vec(w, NM("ffn_norm.weight"), &L->ffn_norm);
        if (c->qk_norm) {
            put_vec(w, NM("attn_q_norm.weight"), &L->q_norm);
            put_vec(w, NM("attn_k_norm.weight"), &L->k_norm);
        }
        put_lin(w, NM("attn_q.weight"), &L->wq, t, llama ? c->n_head : 0);
        put_lin(w, NM("attn_k.weight"), &L->wk, t, llama ? c->n_head_kv : 0);
        put_lin(w, NM("attn_v.weight"), &L->wv, t, 0);
        put_lin(w, NM("attn_output.weight"), &L->wo, t, 0);
        if (L->is_moe) {
            put_lin(w, NM("ffn_gate_inp.weight"), &L->moe.router, KILN_DTYPE_F32, 0);
            const struct qlinear *sets[3] = {L->moe.gate, L->moe.up, L->moe.down};
            const char *nn[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
            for (int s = 0; s < 3; s++) {
                /* one [E, rows, cols] tensor: quantize each expert, concatenate */
                struct gguf_writer *tmp = kiln_gguf_writer_new();
                size_t tot = 0;
                for (int e = 0; e < c->n_expert; e++) {
                    put_lin(tmp, "x.weight", &sets[s][e], t, 0);
                    tot += tmp->t[e].nbytes;
                }
                uint8_t *d = kiln_malloc(tot);
                size_t o = 0;
                for (int e = 0; e < c->n_expert; e++) memcpy(d + o, tmp->t[e].data, tmp->t[e].nbytes), o += tmp->t[e].nbytes;
                int64_t ne[3] = {sets[s][0].n_in, sets[s][0].n_out, c->n_expert};
                snprintf(n, sizeof n, "blk.%d.%s", l, nn[s]);
                kiln_gguf_w_tensor(w, n, tmp->t[0].type, 3, ne, d, tot);
                free(d);
                kiln_gguf_writer_free(tmp);
            }
        } else {
            put_lin(w, NM("ffn_gate.weight"), &L->gate, t, 0);
            put_lin(w, NM("ffn_up.weight"), &L->up, t, 0);
            put_lin(w, NM("ffn_down.weight"), &L->down, t, 0);
        }
#undef NM
    }
    int rc = kiln_gguf_writer_save(w, out, err, errlen);
    kiln_gguf_writer_free(w);
    return rc;
}

/* ==== Hugging Face folder output (GPTQ v1 / FP8 block) ==== */

struct stw {
    cJSON *hdr;
    struct buf data;
};

static void st_put(struct stw *s, const char *name, const char *dtype, int64_t r, int64_t c, const void *d, size_t nb) {
    cJSON *e = cJSON_CreateObject(), *sh = cJSON_CreateArray(), *of = cJSON_CreateArray();
    cJSON_AddStringToObject(e, "dtype", dtype);
    if (r >= 0) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)r));
    cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)c));
    cJSON_AddItemToObject(e, "shape", sh);
    cJSON_AddItemToArray(of, cJSON_CreateNumber((double)s->data.n));
    cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(s->data.n + nb)));
    cJSON_AddItemToObject(e, "data_offsets", of);
    cJSON_AddItemToObject(s->hdr, name, e);
    put(&s->data, d, nb);
}

static void st_put_tensor(struct stw *s, const char *name, const struct ktensor *t) {
    st_put(s, name, dtype_name(t->dtype), t->rows == 1 ? -1 : t->rows, t->cols, t->data, (size_t)(t->rows * t->cols) * dtype_size(t->dtype));
}

static void hf_linear(struct stw *s, const char *prefix, const struct qlinear *l, const char *to, int group) {
    char n[320];
    float *W = linear_f32(l);
    const int N = l->n_out, K = l->n_in;
    if (!strcmp(to, "fp8")) {
        int bn = (N + 127) / 128, bk = (K + 127) / 128;
        uint16_t *sc = kiln_malloc(sizeof(uint16_t) * (size_t)bn * bk);
        uint8_t *q = kiln_malloc((size_t)N * K);
        for (int i = 0; i < bn; i++)
            for (int j = 0; j < bk; j++) {
                float amax = 0;
                for (int r = i * 128; r < N && r < i * 128 + 128; r++)
                    for (int c = j * 128; c < K && c < j * 128 + 128; c++) amax = fmaxf(amax, fabsf(W[(size_t)r * K + c]));
                uint16_t sb = kiln_f32_to_bf16(amax > 0 ? amax / 448 : 1);
                float sf = kiln_bf16_to_f32(sb);
                sc[i * bk + j] = sb;
                for (int r = i * 128; r < N && r < i * 128 + 128; r++)
                    for (int c = j * 128; c < K && c < j * 128 + 128; c++) q[(size_t)r * K + c] = quant_f32_to_e4m3(W[(size_t)r * K + c] / sf);
            }
        snprintf(n, sizeof n, "%s.weight", prefix), st_put(s, n, "F8_E4M3", N, K, q, (size_t)N * K);
        snprintf(n, sizeof n, "%s.weight_scale_inv", prefix), st_put(s, n, "BF16", bn, bk, sc, sizeof(uint16_t) * (size_t)bn * bk);
        free(sc), free(q);
    } else { /* GPTQ v1, sym: z = 2^(b-1), stored z - 1 */
        int bits = strstr(to, "8") ? 8 : 4, p = 32 / bits, maxq = (1 << bits) - 1, gs = group > 0 && group < K ? group : K;
        int G = (K + gs - 1) / gs, z = (maxq + 1) / 2;
        uint16_t *sc = kiln_malloc(sizeof(uint16_t) * (size_t)G * N);
        uint32_t *qw = kiln_calloc((size_t)(K / p) * N, 4), *qz = kiln_calloc((size_t)G * (N / p), 4);
        int32_t *gi = kiln_malloc(sizeof(int32_t) * (size_t)K);
        for (int k = 0; k < K; k++) gi[k] = k / gs;
        for (int g = 0; g < G; g++)
            for (int c = 0; c < N; c++) {
                float amax = 0;
                for (int k = g * gs; k < K && k < (g + 1) * gs; k++) amax = fmaxf(amax, fabsf(W[(size_t)c * K + k]));
                float s = kiln_f16_to_f32(kiln_f32_to_f16(amax > 0 ? 2 * amax / maxq : 1)); /* AutoGPTQ sym: (xmax - xmin) / maxq */
                sc[(size_t)g * N + c] = kiln_f32_to_f16(s);
                for (int k = g * gs; k < K && k < (g + 1) * gs; k++) {
                    long v = lrintf(W[(size_t)c * K + k] / s) + z;
                    v = v < 0 ? 0 : v > maxq ? maxq : v;
                    qw[(size_t)(k / p) * N + c] |= (uint32_t)v << (bits * (k % p));
                }
                qz[(size_t)g * (N / p) + c / p] |= (uint32_t)(z - 1) << (bits * (c % p));
            }
        snprintf(n, sizeof n, "%s.qweight", prefix), st_put(s, n, "I32", K / p, N, qw, (size_t)(K / p) * N * 4);
        snprintf(n, sizeof n, "%s.qzeros", prefix), st_put(s, n, "I32", G, N / p, qz, (size_t)G * (N / p) * 4);
        snprintf(n, sizeof n, "%s.scales", prefix), st_put(s, n, "F16", G, N, sc, sizeof(uint16_t) * (size_t)G * N);
        snprintf(n, sizeof n, "%s.g_idx", prefix), st_put(s, n, "I32", -1, K, gi, sizeof(int32_t) * (size_t)K);
        free(sc), free(qw), free(qz), free(gi);
    }
    free(W);
    if (l->bias.data) snprintf(n, sizeof n, "%s.bias", prefix), st_put_tensor(s, n, &l->bias);
}

static int copy_file(const char *src_dir, const char *out_dir, const char *name) {
    char *a = kiln_path_join(src_dir, name), *b = kiln_path_join(out_dir, name), e[128];
    size_t n;
    char *d = kiln_file_exists(a) ? kiln_read_file(a, &n, e, sizeof e) : NULL;
    int rc = 0;
    if (d) {
        FILE *f = fopen(b, "wb");
        rc = f && fwrite(d, 1, n, f) == n ? 0 : -1;
        if (f) fclose(f);
    }
    free(d), free(a), free(b);
    return rc;
}

static int write_hf(const struct kiln_model *m, const char *src, const char *to, int group, const char *out, char *err, size_t errlen) {
    const struct kiln_config *c = &m->cfg;
    if (strncmp(src, "dummy:", 6) && kiln_gguf_is_file(src)) return kiln_errf(err, errlen, "quantize: --to %s needs a checkpoint folder as source", to);
    int bits = strstr(to, "8") ? 8 : 4, pf = 32 / bits;
    if (mkdir(out, 0755) && errno != EEXIST) return kiln_errf(err, errlen, "%s: cannot create: %s", out, strerror(errno));
    struct stw s = {cJSON_CreateObject(), {0}};
    char n[256];
    st_put_tensor(&s, "model.embed_tokens.weight", &m->embed);
    st_put_tensor(&s, "model.norm.weight", &m->norm);
    if (!c->tie_embed) st_put_tensor(&s, "lm_head.weight", &m->lm_head.w);
    int fp8 = !strcmp(to, "fp8");
    for (int l = 0; l < c->n_layer; l++) {
        const struct layer *L = &m->layers[l];
#define NM(x) (snprintf(n, sizeof n, "model.layers.%d." x, l), n)
        st_put_tensor(&s, NM("input_layernorm.weight"), &L->attn_norm);
        st_put_tensor(&s, NM("post_attention_layernorm.weight"), &L->ffn_norm);
        if (c->qk_norm) st_put_tensor(&s, NM("self_attn.q_norm.weight"), &L->q_norm), st_put_tensor(&s, NM("self_attn.k_norm.weight"), &L->k_norm);
        const struct qlinear *lin[4] = {&L->wq, &L->wk, &L->wv, &L->wo};
        const char *ln[4] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"};
        for (int i = 0; i < 4; i++) {
            if (!fp8 && (lin[i]->n_in % pf || lin[i]->n_out % pf)) {
                cJSON_Delete(s.hdr), free(s.data.p);
                return kiln_errf(err, errlen, "quantize: %s of layer %d ([%d, %d]) does not fit %d-bit GPTQ packing", ln[i], l, lin[i]->n_out, lin[i]->n_in, bits);
            }
            snprintf(n, sizeof n, "model.layers.%d.%s", l, ln[i]);
            hf_linear(&s, n, lin[i], to, group);
        }
        if (L->is_moe) {
            snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", l), st_put_tensor(&s, n, &L->moe.router.w);
            for (int e = 0; e < c->n_expert; e++) {
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.gate_proj", l, e), hf_linear(&s, n, &L->moe.gate[e], to, group);
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.up_proj", l, e), hf_linear(&s, n, &L->moe.up[e], to, group);
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.down_proj", l, e), hf_linear(&s, n, &L->moe.down[e], to, group);
            }
        } else {
            hf_linear(&s, NM("mlp.gate_proj"), &L->gate, to, group);
            hf_linear(&s, NM("mlp.up_proj"), &L->up, to, group);
            hf_linear(&s, NM("mlp.down_proj"), &L->down, to, group);
        }
#undef NM
    }
    char *h = cJSON_PrintUnformatted(s.hdr);
    cJSON_Delete(s.hdr);
    size_t hl = strlen(h), pad = (8 - hl % 8) % 8;
    char *path = kiln_path_join(out, "model.safetensors");
    FILE *f = fopen(path, "wb");
    uint64_t L64 = hl + pad;
    int rc = f && fwrite(&L64, 8, 1, f) == 1 && fwrite(h, 1, hl, f) == hl && fwrite("        ", 1, pad, f) == pad &&
                     fwrite(s.data.p, 1, s.data.n, f) == s.data.n ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    free(h), free(s.data.p), free(path);
    if (rc) return kiln_errf(err, errlen, "%s: cannot write model.safetensors", out);
    /* config.json: the source's, plus quantization_config as the releases spell it */
    char *cp = kiln_path_join(src, "config.json"), *txt = NULL;
    cJSON *cfg = NULL;
    if (strncmp(src, "dummy:", 6) && (txt = kiln_read_file(cp, NULL, err, errlen))) cfg = cJSON_Parse(txt);
    free(txt), free(cp);
    if (!cfg) {
        cfg = cJSON_CreateObject();
        cJSON *ar = cJSON_CreateArray();
        cJSON_AddItemToArray(ar, cJSON_CreateString(c->arch_name));
        cJSON_AddItemToObject(cfg, "architectures", ar);
        cJSON_AddNumberToObject(cfg, "hidden_size", c->dim);
        cJSON_AddNumberToObject(cfg, "num_hidden_layers", c->n_layer);
        cJSON_AddNumberToObject(cfg, "num_attention_heads", c->n_head);
        cJSON_AddNumberToObject(cfg, "num_key_value_heads", c->n_head_kv);
        cJSON_AddNumberToObject(cfg, "head_dim", c->head_dim);
        cJSON_AddNumberToObject(cfg, "vocab_size", c->vocab);
        cJSON_AddNumberToObject(cfg, "intermediate_size", c->ffn);
        cJSON_AddNumberToObject(cfg, "rms_norm_eps", c->rms_eps);
        cJSON_AddNumberToObject(cfg, "rope_theta", c->rope.theta);
        cJSON_AddBoolToObject(cfg, "tie_word_embeddings", c->tie_embed);
        if (c->n_expert) {
            cJSON_AddNumberToObject(cfg, "num_experts", c->n_expert);
            cJSON_AddNumberToObject(cfg, "num_experts_per_tok", c->n_expert_used);
            cJSON_AddNumberToObject(cfg, "moe_intermediate_size", c->moe_ffn);
            cJSON_AddBoolToObject(cfg, "norm_topk_prob", c->norm_topk_prob);
            cJSON *mo = cJSON_CreateArray();
            for (int l = 0; l < c->n_layer; l++)
                if (!c->layer_moe[l]) cJSON_AddItemToArray(mo, cJSON_CreateNumber(l));
            cJSON_AddItemToObject(cfg, "mlp_only_layers", mo);
        }
    }
    cJSON_DeleteItemFromObject(cfg, "quantization_config");
    cJSON *q = cJSON_CreateObject();
    if (fp8) {
        cJSON_AddStringToObject(q, "activation_scheme", "dynamic");
        cJSON_AddStringToObject(q, "fmt", "e4m3");
        cJSON_AddStringToObject(q, "quant_method", "fp8");
        cJSON *b = cJSON_CreateArray();
        cJSON_AddItemToArray(b, cJSON_CreateNumber(128));
        cJSON_AddItemToArray(b, cJSON_CreateNumber(128));
        cJSON_AddItemToObject(q, "weight_block_size", b);
        cJSON *skip = cJSON_CreateArray();
        cJSON_AddItemToArray(skip, cJSON_CreateString("lm_head"));
        cJSON_AddItemToObject(q, "modules_to_not_convert", skip);
    } else {
        cJSON_AddNumberToObject(q, "bits", bits);
        cJSON_AddNumberToObject(q, "group_size", group > 0 ? group : -1);
        cJSON_AddNumberToObject(q, "damp_percent", 0.01);
        cJSON_AddBoolToObject(q, "desc_act", 0);
        cJSON_AddBoolToObject(q, "static_groups", 0);
        cJSON_AddBoolToObject(q, "sym", 1);
        cJSON_AddBoolToObject(q, "true_sequential", 1);
        cJSON_AddStringToObject(q, "quant_method", "gptq");
        cJSON_AddStringToObject(q, "checkpoint_format", "gptq");
    }
    cJSON *qj = cJSON_Duplicate(q, 1);
    cJSON_AddItemToObject(cfg, "quantization_config", q);
    char *cj = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    path = kiln_path_join(out, "config.json");
    f = fopen(path, "w");
    rc = f && fputs(cj, f) >= 0 ? 0 : -1;
    if (f) fclose(f);
    free(path), free(cj);
    if (!fp8) { /* AutoGPTQ also reads quantize_config.json */
        cJSON_DeleteItemFromObject(qj, "quant_method");
        cj = cJSON_Print(qj);
        path = kiln_path_join(out, "quantize_config.json");
        f = fopen(path, "w");
        if (!f || fputs(cj, f) < 0) rc = -1;
        if (f) fclose(f);
        free(path), free(cj);
    }
    cJSON_Delete(qj);
    if (strncmp(src, "dummy:", 6))
        for (const char **fn = (const char *[]){"generation_config.json", "tokenizer.json", "tokenizer_config.json", NULL}; *fn; fn++)
            if (copy_file(src, out, *fn)) rc = -1;
    return rc ? kiln_errf(err, errlen, "%s: cannot write the folder", out) : 0;
}

int kiln_quantize(const char *src, const char *to, int group, const char *out, char *err, size_t errlen) {
    enum kiln_dtype gt = !strcasecmp(to, "q8_0") ? KILN_DTYPE_Q8_0 : !strcasecmp(to, "q4_0") ? KILN_DTYPE_Q4_0
                       : !strcasecmp(to, "q4_k") ? KILN_DTYPE_Q4_K : KILN_DTYPE_NONE;
    int hf = !strcasecmp(to, "gptq-int4") || !strcasecmp(to, "gptq-int8") || !strcasecmp(to, "fp8");
    if (!gt && !hf) return kiln_errf(err, errlen, "quantize: --to %s: expected q8_0, q4_0, q4_k, gptq-int4, gptq-int8 or fp8", to);
    if (group == 0) group = 128;
    if (group < -1 || (group > 0 && group % 8)) return kiln_errf(err, errlen, "quantize: --group-size %d: expected -1 or a positive multiple of 8", group);
    struct kiln_backend *be = backend_create("cpu", 0, err, errlen);
    if (!be) return -1;
    be->keep_stored = 1; /* the writers read the source's weights */
    struct kiln_model m;
    int rc = model_load_dir(&m, src, be, err, errlen);
    if (rc == 0) {
        rc = gt ? write_gguf(&m, src, gt, out, err, errlen) : write_hf(&m, src, to, group, out, err, errlen);
        model_free(&m);
    }
    be->destroy(be);
    return rc;
}
