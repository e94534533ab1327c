/*
 * config.h: a model's hyper-parameters, read from a Hugging Face config.json
 * (and generation_config.json), in both spellings found in the wild:
 *
 *   transformers 4.x          transformers 5.x
 *   rope_theta                rope_parameters.rope_theta
 *   rope_scaling {...}        rope_parameters {...}
 *   torch_dtype               dtype
 *   num_experts               num_local_experts
 *
 * head_dim absent means hidden_size / num_attention_heads; present, it is
 * trusted (Qwen3 has n_head * head_dim != hidden_size).
 */
#ifndef KILN_CONFIG_H
#define KILN_CONFIG_H

#include <stdint.h>

#include "format/dtype.h"

enum kiln_arch {
    KILN_ARCH_QWEN3 = 0, /* Qwen3ForCausalLM: q/k RMSNorm per head */
    KILN_ARCH_QWEN3_MOE, /* Qwen3MoeForCausalLM: + sparse MoE FFN */
    KILN_ARCH_QWEN2,     /* Qwen2ForCausalLM: q/k/v bias, no q/k norm */
    KILN_ARCH_LLAMA,     /* LlamaForCausalLM: the plain layout */
};

enum kiln_rope_type {
    KILN_ROPE_DEFAULT = 0,
    KILN_ROPE_LINEAR,
    KILN_ROPE_LLAMA3,
    KILN_ROPE_YARN,
};

struct kiln_rope_cfg {
    enum kiln_rope_type type;
    double theta;
    double factor;                        /* linear, llama3, yarn */
    double low_freq_factor, high_freq_factor; /* llama3 */
    double original_max_pos;              /* llama3, yarn */
    double beta_fast, beta_slow;          /* yarn */
    double attention_factor;              /* yarn: 0 = derive from factor */
    int truncate;                         /* yarn: transformers' default true */
};

#define KILN_MAX_EOS 8

/* quantization_config of a quantized checkpoint (GPTQ, AWQ, FP8 block), or
 * the GGUF file's tensor types (method GGUF, nothing else set). Parsed and
 * checked by config_parse: a combination kiln cannot run is an error there,
 * never wrong numbers later. Which linears are quantized is decided per
 * module by the tensors present (qweight / F8_E4M3 weight), so unquantized
 * lm_head, routers and modules_to_not_convert need no list. */
enum kiln_quant_method {
    KILN_QUANT_NONE = 0,
    KILN_QUANT_FP8,  /* quant_method "fp8": e4m3 weights, weight_block_size scales */
    KILN_QUANT_GPTQ, /* quant_method "gptq": checkpoint_format gptq (v1) or gptq_v2 */
    KILN_QUANT_AWQ,  /* quant_method "awq", version gemm */
    KILN_QUANT_GGUF, /* a .gguf file: per-tensor types */
};

struct kiln_quant_cfg {
    enum kiln_quant_method method;
    int bits;             /* GPTQ 4|8, AWQ 4 */
    int group_size;       /* GPTQ/AWQ: -1 = per output channel */
    int sym, desc_act;    /* GPTQ */
    int v2;               /* GPTQ checkpoint_format gptq_v2: zeros stored as is */
    int block_n, block_k; /* FP8 weight_block_size */
    int n_skip;           /* modules_to_not_convert */
    char **skip;
};

struct kiln_config {
    enum kiln_arch arch;
    char arch_name[64];
    int vocab;      /* vocab_size */
    int dim;        /* hidden_size */
    int n_layer;    /* num_hidden_layers */
    int n_head;     /* num_attention_heads */
    int n_head_kv;  /* num_key_value_heads */
    int head_dim;   /* head_dim, or dim / n_head */
    int ffn;        /* intermediate_size (dense layers) */
    int max_pos;    /* max_position_embeddings */
    float rms_eps;
    struct kiln_rope_cfg rope;
    int tie_embed;  /* tie_word_embeddings */
    int attn_bias;  /* q/k/v/o bias (Llama, Qwen3: attention_bias) */
    int qkv_bias;   /* q/k/v bias only (Qwen2) */
    int mlp_bias;   /* Llama mlp_bias */
    int qk_norm;    /* Qwen3 */
    enum kiln_dtype dtype; /* torch_dtype / dtype */

    /* MoE (Qwen3-MoE); n_expert == 0 for dense models */
    int n_expert;        /* num_experts */
    int n_expert_used;   /* num_experts_per_tok */
    int moe_ffn;         /* moe_intermediate_size */
    int norm_topk_prob;
    uint8_t *layer_moe;  /* [n_layer]: 1 where the layer's FFN is the sparse MoE */

    /* special tokens (config.json, overridden by generation_config.json) */
    int bos;
    int n_eos;
    int eos[KILN_MAX_EOS];

    /* sampling defaults from generation_config.json (0 = unset) */
    float gen_temperature, gen_top_p;
    int gen_top_k;

    struct kiln_quant_cfg quant; /* method NONE for a plain checkpoint */
};

/* Parses config.json text. path names the file in error messages. Fills cfg
 * (free with config_free) or returns -1 with a message naming the field. */
int config_parse(struct kiln_config *cfg, const char *json, const char *path, char *err, size_t errlen);

/* Applies generation_config.json text (eos list, bos, sampling defaults). */
int config_parse_generation(struct kiln_config *cfg, const char *json, const char *path, char *err, size_t errlen);

/* Reads dir/config.json and, if present, dir/generation_config.json. */
int config_load_dir(struct kiln_config *cfg, const char *dir, char *err, size_t errlen);

void config_free(struct kiln_config *cfg);

/* Parses a quantization_config object (cJSON *) into q; -1 with a clear
 * error for an unsupported method or combination. */
int config_parse_quant(struct kiln_quant_cfg *q, const void *cjson_obj, const char *path, char *err, size_t errlen);
void config_free_quant(struct kiln_quant_cfg *q);

const char *config_arch_name(enum kiln_arch a);

#endif
