/*
 * model.h: a loaded model of the Qwen3 family (Qwen3, Qwen3-MoE, Qwen2,
 * Llama: one layout with switches), its weights bound by name, and the
 * forward pass over a batch.
 *
 * Per layer (pre-norm residual):
 *   h = x + o_proj(attn(rope(qk_norm(q_proj(norm1(x)))), rope(k), v))
 *   x = h + ffn(norm2(h)), ffn = down(silu(gate(.)) * up(.)) or the MoE
 */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include <stdio.h>

#include "backend/backend.h"
#include "format/config.h"
#include "format/safetensors.h"
#include "model/weights.h"

struct layer {
    struct ktensor attn_norm; /* (dim) input_layernorm */
    struct ktensor ffn_norm;  /* (dim) post_attention_layernorm */
    struct ktensor q_norm;    /* (head_dim) Qwen3 only */
    struct ktensor k_norm;    /* (head_dim) Qwen3 only */
    struct qlinear wq;        /* (n_head*head_dim, dim) */
    struct qlinear wk;        /* (n_head_kv*head_dim, dim) */
    struct qlinear wv;        /* (n_head_kv*head_dim, dim) */
    struct qlinear wo;        /* (dim, n_head*head_dim) */
    int is_moe;
    struct qlinear gate;      /* (ffn, dim)  dense layers */
    struct qlinear up;        /* (ffn, dim) */
    struct qlinear down;      /* (dim, ffn) */
    struct moe_ffn moe;       /* MoE layers */
};

struct kiln_model {
    struct kiln_config cfg;
    struct st_set st;          /* the mapped checkpoint (or the dummy tensors) */
    void **owned;              /* memory the model allocated (dummy weights) */
    int n_owned;
    struct ktensor embed;      /* (vocab, dim) */
    struct ktensor norm;       /* (dim) final norm */
    struct qlinear lm_head;    /* (vocab, dim), the embedding when tied */
    struct layer *layers;      /* [n_layer] */
    struct rope rope;
    struct kiln_backend *be;   /* the backend the weights were prepared for */
    char *path;                /* directory, or "dummy:NAME" */

    /* forward workspace, sized for ws_cap tokens and out_cap logit rows;
     * grown on demand */
    int ws_cap, out_cap;
    void *x, *xb, *q, *k, *v, *att, *hb, *hb2, *out_x, *out_logits;
};

/* Loads a Hugging Face checkpoint directory (or a .gguf file: any path whose
 * first bytes are the GGUF magic) and prepares its weights on be.
 * Everything is validated (names, shapes, dtypes) before anything is used. */
int model_load_dir(struct kiln_model *m, const char *dir, struct kiln_backend *be, char *err, size_t errlen);

/* Builds seeded random weights for a config: `name` is a built-in config
 * ("qwen3-8b") or a path to a config.json. dtype: F32, F16 or BF16. */
int model_load_dummy(struct kiln_model *m, const char *name, enum kiln_dtype dtype, uint64_t seed,
                     struct kiln_backend *be, char *err, size_t errlen);

/* The same with every linear but lm_head and the MoE router built directly
 * in a quantized format (format/quant.h quant_dummy_linear: "gptq-int4",
 * "q4_k", "fp8", ...; NULL = dense); group: GPTQ/AWQ group size (0 = 128). */
int model_load_dummy_quant(struct kiln_model *m, const char *name, enum kiln_dtype dtype, const char *quant, int group,
                           uint64_t seed, struct kiln_backend *be, char *err, size_t errlen);

void model_free(struct kiln_model *m);

/* Runs one forward over batch b; writes logits of b->out_rows to
 * logits[n_out][vocab] on the host. The KV cache pages named by the batch
 * receive the new tokens' keys and values. */
int model_forward(struct kiln_model *m, struct kv_cache *kv, const struct kiln_batch *b, float *logits, char *err,
                  size_t errlen);

/* Total parameters and stored bytes of the weights. */
int64_t model_n_params(const struct kiln_model *m);
int64_t model_n_bytes(const struct kiln_model *m);
/* the weight bytes a one-token decode step reads: every linear (lm_head's
 * being the embedding when tied), the norm vectors, for MoE n_used /
 * n_expert of each layer's expert bytes; not an untied embedding table, of
 * which one row is read. Each linear as the backend's kernels read it
 * (backend.h linear_bytes: the CPU's 12-bit BF16 rows), else as stored. */
double model_decode_bytes(const struct kiln_model *m);
/* Prints one line per weight format: "  GPTQ-int4-g128   196 linears  1.23 GiB"
 * (stored bytes, plus what the backend repacked at load). */
/* the weight format holding most of the linears' bytes, e.g. "Q4_0", "BF16", "GPTQ-int4-g128" */
void model_main_format(const struct kiln_model *m, char *buf, size_t len);
void model_describe_formats(const struct kiln_model *m, FILE *f);

/* Names of the built-in configs, NULL-terminated table; and lookup. */
const char *model_builtin_config(const char *name);
void model_list_builtin(void (*fn)(const char *name, void *ctx), void *ctx);

#endif
