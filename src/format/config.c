/*
 * config.c: config.json / generation_config.json to struct kiln_config.
 * Each field is read with a checked getter that names the field and the file
 * in its error; values are validated against each other at the end so that
 * a model built from a config that passes here has consistent shapes.
 */
#include "format/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "base/base.h"

static const struct {
    const char *hf_name, *model_type;
    enum kiln_arch arch;
} archs[] = {
    {"Qwen3ForCausalLM", "qwen3", KILN_ARCH_QWEN3},
    {"Qwen3MoeForCausalLM", "qwen3_moe", KILN_ARCH_QWEN3_MOE},
    {"Qwen2ForCausalLM", "qwen2", KILN_ARCH_QWEN2},
    {"LlamaForCausalLM", "llama", KILN_ARCH_LLAMA},
};

const char *config_arch_name(enum kiln_arch a) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (archs[i].arch == a) return archs[i].hf_name;
    return "?";
}

/* A present, non-null item, or NULL. */
static const cJSON *item(const cJSON *o, const char *k) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, k);
    return j && !cJSON_IsNull(j) ? j : NULL;
}

/* Integer field; -1 with err if present but not an integer in [lo, hi]; *out
 * untouched when absent (returns 1). */
static int get_int(const cJSON *o, const char *k, int *out, long lo, long hi, const char *path, char *err, size_t errlen) {
    const cJSON *j = item(o, k);
    if (!j) return 1;
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < lo || j->valuedouble > hi)
        return kiln_errf(err, errlen, "%s: \"%s\" must be an integer in [%ld, %ld]", path, k, lo, hi);
    *out = (int)j->valuedouble;
    return 0;
}

static int req_int(const cJSON *o, const char *k, int *out, long lo, long hi, const char *path, char *err, size_t errlen) {
    int r = get_int(o, k, out, lo, hi, path, err, errlen);
    if (r == 1) return kiln_errf(err, errlen, "%s: missing \"%s\"", path, k);
    return r;
}

static int get_num(const cJSON *o, const char *k, double *out, const char *path, char *err, size_t errlen) {
    const cJSON *j = item(o, k);
    if (!j) return 1;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble)) return kiln_errf(err, errlen, "%s: \"%s\" must be a number", path, k);
    *out = j->valuedouble;
    return 0;
}

static int get_bool(const cJSON *o, const char *k, int *out, const char *path, char *err, size_t errlen) {
    const cJSON *j = item(o, k);
    if (!j) return 1;
    if (!cJSON_IsBool(j)) return kiln_errf(err, errlen, "%s: \"%s\" must be true or false", path, k);
    *out = cJSON_IsTrue(j);
    return 0;
}

/* eos_token_id: an integer or a list of integers. */
static int get_eos(const cJSON *o, struct kiln_config *c, const char *path, char *err, size_t errlen) {
    const cJSON *j = item(o, "eos_token_id");
    if (!j) return 0;
    c->n_eos = 0;
    if (cJSON_IsNumber(j)) {
        if (j->valuedouble < 0 || j->valuedouble != floor(j->valuedouble)) return kiln_errf(err, errlen, "%s: bad eos_token_id", path);
        c->eos[c->n_eos++] = (int)j->valuedouble;
        return 0;
    }
    if (!cJSON_IsArray(j)) return kiln_errf(err, errlen, "%s: \"eos_token_id\" must be an integer or a list", path);
    for (const cJSON *x = j->child; x; x = x->next) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble))
            return kiln_errf(err, errlen, "%s: \"eos_token_id\" holds a non-integer", path);
        if (c->n_eos < KILN_MAX_EOS) c->eos[c->n_eos++] = (int)x->valuedouble;
    }
    return 0;
}

static int parse_rope(struct kiln_config *c, const cJSON *root, const char *path, char *err, size_t errlen) {
    struct kiln_rope_cfg *r = &c->rope;
    r->type = KILN_ROPE_DEFAULT;
    r->theta = 10000.0;
    r->beta_fast = 32;
    r->beta_slow = 1;
    r->truncate = 1;
    /* 4.x: rope_theta + rope_scaling; 5.x: rope_parameters holds both */
    const cJSON *rp = item(root, "rope_parameters");
    const cJSON *rs = item(root, "rope_scaling");
    if (rp && !cJSON_IsObject(rp)) return kiln_errf(err, errlen, "%s: \"rope_parameters\" must be an object", path);
    if (rs && !cJSON_IsObject(rs)) return kiln_errf(err, errlen, "%s: \"rope_scaling\" must be an object or null", path);
    if (get_num(root, "rope_theta", &r->theta, path, err, errlen) < 0) return -1;
    if (rp && get_num(rp, "rope_theta", &r->theta, path, err, errlen) < 0) return -1;
    const cJSON *sc = rs ? rs : rp;
    if (!sc) return 0;
    const cJSON *t = item(sc, "rope_type");
    if (!t) t = item(sc, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : "default";
    if (!strcmp(type, "default")) r->type = KILN_ROPE_DEFAULT;
    else if (!strcmp(type, "linear")) r->type = KILN_ROPE_LINEAR;
    else if (!strcmp(type, "llama3")) r->type = KILN_ROPE_LLAMA3;
    else if (!strcmp(type, "yarn")) r->type = KILN_ROPE_YARN;
    else return kiln_errf(err, errlen, "%s: rope type \"%s\" is not supported (default, linear, llama3, yarn are)", path, type);
    if (r->type == KILN_ROPE_DEFAULT) return 0;
    if (get_num(sc, "factor", &r->factor, path, err, errlen)) return kiln_errf(err, errlen, "%s: rope scaling \"%s\" needs a numeric \"factor\"", path, type);
    if (!(r->factor > 0)) return kiln_errf(err, errlen, "%s: rope scaling factor must be positive", path);
    r->original_max_pos = c->max_pos;
    if (get_num(sc, "original_max_position_embeddings", &r->original_max_pos, path, err, errlen) < 0) return -1;
    if (r->type == KILN_ROPE_LLAMA3) {
        if (get_num(sc, "low_freq_factor", &r->low_freq_factor, path, err, errlen) ||
            get_num(sc, "high_freq_factor", &r->high_freq_factor, path, err, errlen))
            return kiln_errf(err, errlen, "%s: llama3 rope scaling needs low_freq_factor and high_freq_factor", path);
        if (!(r->high_freq_factor > r->low_freq_factor)) return kiln_errf(err, errlen, "%s: llama3 rope: high_freq_factor must exceed low_freq_factor", path);
    }
    if (r->type == KILN_ROPE_YARN) {
        if (get_num(sc, "beta_fast", &r->beta_fast, path, err, errlen) < 0) return -1;
        if (get_num(sc, "beta_slow", &r->beta_slow, path, err, errlen) < 0) return -1;
        if (get_num(sc, "attention_factor", &r->attention_factor, path, err, errlen) < 0) return -1;
        if (get_bool(sc, "truncate", &r->truncate, path, err, errlen) < 0) return -1;
    }
    return 0;
}

static enum kiln_dtype parse_torch_dtype(const char *s) {
    if (!strcmp(s, "bfloat16")) return KILN_DTYPE_BF16;
    if (!strcmp(s, "float16")) return KILN_DTYPE_F16;
    if (!strcmp(s, "float32")) return KILN_DTYPE_F32;
    return KILN_DTYPE_NONE;
}

#define TRY(x)                                                                                               \
    do {                                                                                                     \
        if ((x) < 0) goto fail;                                                                              \
    } while (0)

int config_parse(struct kiln_config *c, const char *json, const char *path, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kiln_errf(err, errlen, "%s: not a JSON object", path);
    }
    /* architecture: architectures[0], else model_type */
    const cJSON *ja = item(root, "architectures"), *mt = item(root, "model_type");
    const char *an = NULL;
    if (cJSON_IsArray(ja) && cJSON_IsString(ja->child)) an = ja->child->valuestring;
    int found = 0;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0] && !found; i++) {
        if (an ? !strcmp(an, archs[i].hf_name) : (cJSON_IsString(mt) && !strcmp(mt->valuestring, archs[i].model_type))) {
            c->arch = archs[i].arch;
            snprintf(c->arch_name, sizeof c->arch_name, "%s", archs[i].hf_name);
            found = 1;
        }
    }
    if (!found) {
        kiln_errf(err, errlen, "%s: unsupported architecture \"%s\" (supported: Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM)",
                  path, an ? an : cJSON_IsString(mt) ? mt->valuestring : "(none given)");
        goto fail;
    }
    TRY(req_int(root, "hidden_size", &c->dim, 1, 1 << 17, path, err, errlen));
    TRY(req_int(root, "num_hidden_layers", &c->n_layer, 1, 4096, path, err, errlen));
    TRY(req_int(root, "num_attention_heads", &c->n_head, 1, 4096, path, err, errlen));
    TRY(req_int(root, "vocab_size", &c->vocab, 1, 1 << 24, path, err, errlen));
    c->n_head_kv = c->n_head;
    TRY(get_int(root, "num_key_value_heads", &c->n_head_kv, 1, 4096, path, err, errlen));
    c->head_dim = 0;
    TRY(get_int(root, "head_dim", &c->head_dim, 1, 4096, path, err, errlen));
    if (!c->head_dim) {
        if (c->dim % c->n_head) {
            kiln_errf(err, errlen, "%s: hidden_size %d is not a multiple of num_attention_heads %d and no head_dim is given", path, c->dim, c->n_head);
            goto fail;
        }
        c->head_dim = c->dim / c->n_head;
    }
    if (c->head_dim % 2) {
        kiln_errf(err, errlen, "%s: head_dim %d must be even for rotary embeddings", path, c->head_dim);
        goto fail;
    }
    if (c->n_head % c->n_head_kv) {
        kiln_errf(err, errlen, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", path, c->n_head, c->n_head_kv);
        goto fail;
    }
    c->max_pos = 32768;
    TRY(get_int(root, "max_position_embeddings", &c->max_pos, 1, 1 << 24, path, err, errlen));
    double eps = 1e-6;
    TRY(get_num(root, "rms_norm_eps", &eps, path, err, errlen));
    if (!(eps > 0 && eps < 1)) {
        kiln_errf(err, errlen, "%s: rms_norm_eps must be in (0, 1)", path);
        goto fail;
    }
    c->rms_eps = (float)eps;
    TRY(parse_rope(c, root, path, err, errlen));
    TRY(get_bool(root, "tie_word_embeddings", &c->tie_embed, path, err, errlen));
    TRY(get_bool(root, "attention_bias", &c->attn_bias, path, err, errlen));
    TRY(get_bool(root, "mlp_bias", &c->mlp_bias, path, err, errlen));
    c->qkv_bias = c->arch == KILN_ARCH_QWEN2;
    c->qk_norm = c->arch == KILN_ARCH_QWEN3 || c->arch == KILN_ARCH_QWEN3_MOE;

    const cJSON *act = item(root, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu"))) {
        kiln_errf(err, errlen, "%s: hidden_act \"%s\" is not supported (only silu)", path, cJSON_IsString(act) ? act->valuestring : "?");
        goto fail;
    }
    int sw = 0;
    TRY(get_bool(root, "use_sliding_window", &sw, path, err, errlen));
    if (sw) {
        kiln_errf(err, errlen, "%s: use_sliding_window is true: sliding-window attention is not supported", path);
        goto fail;
    }
    const cJSON *dt = item(root, "dtype");
    if (!dt) dt = item(root, "torch_dtype");
    c->dtype = KILN_DTYPE_BF16;
    if (dt) {
        if (!cJSON_IsString(dt) || (c->dtype = parse_torch_dtype(dt->valuestring)) == KILN_DTYPE_NONE) {
            kiln_errf(err, errlen, "%s: dtype \"%s\" is not one of bfloat16, float16, float32", path, cJSON_IsString(dt) ? dt->valuestring : "?");
            goto fail;
        }
    }
    const cJSON *q = item(root, "quantization_config");
    if (q) TRY(config_parse_quant(&c->quant, q, path, err, errlen));

    /* FFN sizes and MoE */
    c->ffn = 0;
    TRY(get_int(root, "intermediate_size", &c->ffn, 1, 1 << 20, path, err, errlen));
    c->layer_moe = kiln_calloc((size_t)c->n_layer, 1);
    if (c->arch == KILN_ARCH_QWEN3_MOE) {
        int r = get_int(root, "num_experts", &c->n_expert, 1, 1 << 16, path, err, errlen);
        if (r == 1) r = get_int(root, "num_local_experts", &c->n_expert, 1, 1 << 16, path, err, errlen);
        if (r == 1) r = kiln_errf(err, errlen, "%s: missing \"num_experts\" (or \"num_local_experts\")", path);
        TRY(r);
        TRY(req_int(root, "num_experts_per_tok", &c->n_expert_used, 1, c->n_expert, path, err, errlen));
        TRY(req_int(root, "moe_intermediate_size", &c->moe_ffn, 1, 1 << 20, path, err, errlen));
        TRY(get_bool(root, "norm_topk_prob", &c->norm_topk_prob, path, err, errlen));
        int step = 1;
        TRY(get_int(root, "decoder_sparse_step", &step, 1, 1 << 16, path, err, errlen));
        const cJSON *mo = item(root, "mlp_only_layers");
        if (mo && !cJSON_IsArray(mo)) {
            kiln_errf(err, errlen, "%s: \"mlp_only_layers\" must be a list", path);
            goto fail;
        }
        for (int l = 0; l < c->n_layer; l++) c->layer_moe[l] = (l + 1) % step == 0;
        for (const cJSON *x = mo ? mo->child : NULL; x; x = x->next) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= c->n_layer || x->valuedouble != floor(x->valuedouble)) {
                kiln_errf(err, errlen, "%s: \"mlp_only_layers\" holds %g, not a layer index below %d", path, cJSON_IsNumber(x) ? x->valuedouble : -1.0, c->n_layer);
                goto fail;
            }
            c->layer_moe[(int)x->valuedouble] = 0;
        }
    }
    for (int l = 0; l < c->n_layer; l++)
        if (!c->layer_moe[l] && !c->ffn) {
            kiln_errf(err, errlen, "%s: missing \"intermediate_size\" (layer %d has a dense MLP)", path, l);
            goto fail;
        }

    c->bos = -1;
    TRY(get_int(root, "bos_token_id", &c->bos, 0, 1 << 24, path, err, errlen));
    TRY(get_eos(root, c, path, err, errlen));
    cJSON_Delete(root);
    return 0;
fail:
    cJSON_Delete(root);
    config_free(c);
    return -1;
}

int config_parse_generation(struct kiln_config *c, const char *json, const char *path, char *err, size_t errlen) {
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kiln_errf(err, errlen, "%s: not a JSON object", path);
    }
    double t = 0, p = 0;
    int rc = -1;
    TRY(get_int(root, "bos_token_id", &c->bos, 0, 1 << 24, path, err, errlen));
    TRY(get_eos(root, c, path, err, errlen));
    TRY(get_num(root, "temperature", &t, path, err, errlen));
    TRY(get_num(root, "top_p", &p, path, err, errlen));
    TRY(get_int(root, "top_k", &c->gen_top_k, 0, 1 << 24, path, err, errlen));
    c->gen_temperature = (float)t;
    c->gen_top_p = (float)p;
    rc = 0;
fail:
    cJSON_Delete(root);
    return rc;
}

int config_load_dir(struct kiln_config *c, const char *dir, char *err, size_t errlen) {
    char *p = kiln_path_join(dir, "config.json");
    char *txt = kiln_read_file(p, NULL, err, errlen);
    int rc = txt ? config_parse(c, txt, p, err, errlen) : -1;
    free(txt);
    free(p);
    if (rc) return -1;
    p = kiln_path_join(dir, "generation_config.json");
    if (kiln_file_exists(p)) {
        txt = kiln_read_file(p, NULL, err, errlen);
        rc = txt ? config_parse_generation(c, txt, p, err, errlen) : -1;
        free(txt);
    }
    free(p);
    if (rc) config_free(c);
    return rc;
}

void config_free(struct kiln_config *c) {
    free(c->layer_moe);
    c->layer_moe = NULL;
    config_free_quant(&c->quant);
}

void config_free_quant(struct kiln_quant_cfg *q) {
    for (int i = 0; i < q->n_skip; i++) free(q->skip[i]);
    free(q->skip);
    memset(q, 0, sizeof *q);
}

/* quantization_config, as the releases spell it:
 *   fp8:  {"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128],
 *          "modules_to_not_convert":[...]}
 *   gptq: {"quant_method":"gptq","bits":4,"group_size":128,"desc_act":false,"sym":true,"checkpoint_format":"gptq"}
 *   awq:  {"quant_method":"awq","bits":4,"group_size":128,"version":"gemm","zero_point":true}            */
int config_parse_quant(struct kiln_quant_cfg *q, const void *obj, const char *path, char *err, size_t errlen) {
    const cJSON *o = obj;
    memset(q, 0, sizeof *q);
    if (!cJSON_IsObject(o)) return kiln_errf(err, errlen, "%s: \"quantization_config\" must be an object", path);
    const cJSON *m = item(o, "quant_method");
    const char *method = cJSON_IsString(m) ? m->valuestring : "(none)";
    const cJSON *sk = item(o, "modules_to_not_convert");
    if (sk && !cJSON_IsArray(sk)) return kiln_errf(err, errlen, "%s: quantization_config.modules_to_not_convert must be a list or null", path);
    for (const cJSON *x = sk ? sk->child : NULL; x; x = x->next) {
        if (!cJSON_IsString(x)) return kiln_errf(err, errlen, "%s: quantization_config.modules_to_not_convert holds a non-string", path);
        q->skip = kiln_realloc(q->skip, sizeof *q->skip * (size_t)(q->n_skip + 1));
        q->skip[q->n_skip++] = kiln_strdup(x->valuestring);
    }
    if (!strcmp(method, "fp8")) {
        q->method = KILN_QUANT_FP8;
        const cJSON *f = item(o, "fmt");
        if (f && (!cJSON_IsString(f) || strcmp(f->valuestring, "e4m3")))
            return kiln_errf(err, errlen, "%s: fp8 fmt \"%s\" is not supported (only e4m3)", path, cJSON_IsString(f) ? f->valuestring : "?");
        const cJSON *b = item(o, "weight_block_size");
        if (!b) return kiln_errf(err, errlen, "%s: fp8 without weight_block_size (per-tensor FP8) is not supported; kiln runs the block-wise [128, 128] layout", path);
        if (!cJSON_IsArray(b) || cJSON_GetArraySize(b) != 2 || !cJSON_IsNumber(b->child) || !cJSON_IsNumber(b->child->next) ||
            b->child->valuedouble < 1 || b->child->next->valuedouble < 1 || b->child->valuedouble > 65536 || b->child->next->valuedouble > 65536)
            return kiln_errf(err, errlen, "%s: fp8 weight_block_size must be [n, k] with positive integers", path);
        q->block_n = (int)b->child->valuedouble;
        q->block_k = (int)b->child->next->valuedouble;
        return 0;
    }
    if (!strcmp(method, "gptq") || !strcmp(method, "awq")) {
        int awq = method[0] == 'a';
        q->method = awq ? KILN_QUANT_AWQ : KILN_QUANT_GPTQ;
        if (req_int(o, "bits", &q->bits, 1, 64, path, err, errlen)) return kiln_err_prefix(err, errlen, "quantization_config: ");
        if (req_int(o, "group_size", &q->group_size, -1, 1 << 20, path, err, errlen)) return kiln_err_prefix(err, errlen, "quantization_config: ");
        if (q->group_size == 0) return kiln_errf(err, errlen, "%s: quantization_config.group_size 0 (use -1 for per-channel)", path);
        if (awq) {
            if (q->bits != 4) return kiln_errf(err, errlen, "%s: AWQ with bits %d is not supported (only 4-bit AWQ exists)", path, q->bits);
            const cJSON *v = item(o, "version");
            if (v && (!cJSON_IsString(v) || strcasecmp(v->valuestring, "gemm")))
                return kiln_errf(err, errlen, "%s: AWQ version \"%s\" is not supported (only gemm)", path, cJSON_IsString(v) ? v->valuestring : "?");
            int zp = 1;
            if (get_bool(o, "zero_point", &zp, path, err, errlen) < 0) return -1;
            if (!zp) return kiln_errf(err, errlen, "%s: AWQ with zero_point false is not supported", path);
            return 0;
        }
        if (q->bits != 4 && q->bits != 8) return kiln_errf(err, errlen, "%s: GPTQ with bits %d is not supported (4 and 8 are)", path, q->bits);
        q->sym = 1;
        if (get_bool(o, "sym", &q->sym, path, err, errlen) < 0 || get_bool(o, "desc_act", &q->desc_act, path, err, errlen) < 0) return -1;
        const cJSON *cf = item(o, "checkpoint_format");
        if (cf) {
            if (!cJSON_IsString(cf)) return kiln_errf(err, errlen, "%s: checkpoint_format must be a string", path);
            if (!strcmp(cf->valuestring, "gptq_v2")) q->v2 = 1;
            else if (strcmp(cf->valuestring, "gptq"))
                return kiln_errf(err, errlen, "%s: GPTQ checkpoint_format \"%s\" is not supported (gptq and gptq_v2 are)", path, cf->valuestring);
        }
        return 0;
    }
    return kiln_errf(err, errlen, "%s: quantization_config quant_method \"%s\" is not supported (fp8, gptq, awq are; GGUF files load directly)", path, method);
}
