/*
 * params.h: the body of a generation request (/v1/completions,
 * /v1/chat/completions, and the prompt part of /tokenize) parsed and
 * validated into struct gen_params: sampling, stops, the prompts as token
 * ids (chat messages through the model's chat template), tools and
 * response_format. Nothing is queued here. A missing field takes its
 * default, an unknown one is ignored, and a known field of the wrong type
 * or out of range gives -1 with a message naming it, which the routes turn
 * into a 400.
 */
#ifndef KILN_SERVER_PARAMS_H
#define KILN_SERVER_PARAMS_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "kiln.h"

#define PARAMS_MAX_N 64        /* choices per prompt */
#define PARAMS_MAX_STOPS 16    /* stop strings */
#define PARAMS_MAX_CHOICES 256 /* prompts x n in one call */

struct kiln_tokenizer;

/* What the parser needs to know about the server. */
struct params_ctx {
    const struct kiln_tokenizer *tok; /* NULL: token-id prompts only */
    const char *model_name;           /* the only model clients may name */
    int vocab;                        /* the model's vocabulary */
    int max_len;                      /* prompt + max_tokens limit */
    int has_think;                    /* the vocabulary has <think> and </think> */
};

struct param_error {
    const char *param; /* the field at fault, or NULL */
    char msg[1024];
};

struct prompt {
    int32_t *ids;
    int n;
    char *text; /* the prompt string when echo asks for it (NULL: token ids, decoded when echoed) */
};

struct gen_params {
    int chat, stream, include_usage, continuous_usage; /* continuous: every chunk carries the usage so far (vLLM's continuous_usage_stats) */
    struct prompt *prompts; /* chat: one; completions: one or several */
    int n_prompts;
    int n;          /* choices per prompt */
    int max_tokens; /* -1: what fits the context after each prompt */
    int min_tokens, ignore_eos;
    struct kiln_sampling sp; /* sp.bias_ids / sp.bias point into bias_ids / bias */
    int32_t *bias_ids;
    float *bias;
    int32_t *stop_ids; /* stop_token_ids */
    int n_stop_ids;
    int seed_set;
    int logprobs, top_logprobs; /* logprobs: 0/1 for chat; -1 off */
    char *stops[PARAMS_MAX_STOPS];
    int n_stops;
    int think, think_in_reasoning;
    int tools; /* chat: parse <tool_call> blocks in the output */
    int json;  /* response_format json_object: constrain the output to one JSON object */
    int echo;  /* completions: each choice's text starts with its prompt */
};

/* Parses a generation request. 0, or -1 with e filled (p may then hold
 * allocations: call params_free either way). When no seed was given
 * p->seed_set is 0 and the caller picks one. */
int params_parse(const struct params_ctx *c, const cJSON *req, int chat, struct gen_params *p, struct param_error *e);

/* A completion body whose top-level "prompt" is one array of plain
 * non-negative integers (the long token-id prompts of benchmark clients and
 * pre-tokenizing callers): reads the ids with the JSON scanner instead of
 * cJSON (about 10x faster: no node, strtod or locale call per number) and
 * blanks the array in body (spaces), so cJSON then parses a small text.
 * 1 with *ids, *n set (the caller owns *ids) and the body changed; 0 when
 * the body is anything else (left untouched: cJSON and params_parse judge
 * it, with their usual errors). */
int params_scan_prompt_ids(char *body, size_t len, int32_t **ids, int *n);

/* params_parse for a body that params_scan_prompt_ids took the prompt ids
 * from: ids (n of them) stand for the blanked "prompt"; p owns ids after
 * the call, whatever it returns. */
int params_parse_ids(const struct params_ctx *c, const cJSON *req, int32_t *ids, int n, struct gen_params *p,
                     struct param_error *e);

/* /tokenize: {"prompt": text} or {"messages": [...], "add_generation_prompt"}
 * into p->prompts[0]. 0 or -1 with e. */
int params_tokenize(const struct params_ctx *c, const cJSON *req, struct gen_params *p, struct param_error *e);

/* A JSON array of token ids into a malloc'd array (*ids, *n). 0 or -1 with e. */
int params_ids(const struct params_ctx *c, const cJSON *a, const char *param, int32_t **ids, int *n, struct param_error *e);

void params_free(struct gen_params *p);

#endif
