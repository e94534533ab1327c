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
};

/* Parses config.json text. path names the file in error messages. Fills cfg
 * (free with config_free) or returns -1 with a message naming the field. */
int config_parse(struct kiln_config *cfg, const char *json, const char *path, char *err, size_t errlen);

/* Applies generation_config.json text (eos list, bos, sampling defaults). */
int config_parse_generation(struct kiln_config *cfg, const char *json, const char *path, char *err, size_t errlen);

/* Reads dir/config.json and, if present, dir/generation_config.json. */
int config_load_dir(struct kiln_config *cfg, const char *dir, char *err, size_t errlen);

void config_free(struct kiln_config *cfg);

const char *config_arch_name(enum kiln_arch a);

#endif
