/*
 * sampler.h: turns one row of logits into a token, per request.
 *
 * Order of operations (as vLLM and transformers apply them):
 *   1. the logit bias (OpenAI's logit_bias: a value added to chosen ids);
 *   2. penalties: repetition (prompt + output tokens,
 *      transformers' rule: divide positive logits, multiply negative ones),
 *      presence and frequency (output tokens only, OpenAI's rule);
 *   3. temperature 0 (or top_k 1) means greedy: the first maximal logit;
 *   4. otherwise divide by the temperature, softmax, then keep the top_k
 *      most likely, then the smallest set whose mass reaches top_p, then
 *      those with p >= min_p * p_max; renormalise and draw with the
 *      request's own seeded generator. Tokens whose logit is -inf (masked
 *      by the caller: EOS before min_tokens, a JSON constraint) are never
 *      drawn.
 */
#ifndef KILN_SAMPLER_H
#define KILN_SAMPLER_H

#include <stdint.h>

#include "base/base.h"

struct kiln_sampling {
    float temperature;        /* 0: greedy */
    int top_k;                /* 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    uint64_t seed;
    /* logit_bias: bias[i] is added to the logit of bias_ids[i] (ids outside
     * the vocabulary are ignored). Borrowed: sampler_init copies them. */
    int n_bias;
    const int32_t *bias_ids;
    const float *bias;
};

/* temperature 1, top_p 1, everything else off, seed 0 */
struct kiln_sampling sampling_default(void);

struct kiln_sampler {
    struct kiln_sampling p; /* p.bias_ids / p.bias point to the sampler's own copies */
    struct kiln_rng rng;
    int vocab;
    uint32_t *count; /* [vocab] output-token counts, when penalties are on */
    uint8_t *seen;   /* [vocab] prompt or output token, for the repetition penalty */
    float *prob;     /* [vocab] scratch */
    int32_t *idx;    /* [vocab] scratch */
};

void sampler_init(struct kiln_sampler *s, const struct kiln_sampling *p, int vocab);
void sampler_free(struct kiln_sampler *s);
/* Records the prompt (for the repetition penalty). */
void sampler_set_prompt(struct kiln_sampler *s, const int32_t *ids, int n);
/* Records an output token (for all penalties). Call after each sample. */
void sampler_accept(struct kiln_sampler *s, int32_t id);
/* Picks a token from logits[vocab]; logits are modified (bias, penalties). */
int32_t sampler_sample(struct kiln_sampler *s, float *logits);

/* The kept set after top-k/top-p/min-p, for tests: writes the kept ids in
 * descending probability to out and returns how many; prob gets their
 * renormalised probabilities. */
int sampler_candidates(struct kiln_sampler *s, float *logits, int32_t *out, float *prob);

int32_t sampler_argmax(const float *logits, int n);
/* 1 when sampler_sample is the plain argmax of the raw logits (greedy, no
 * bias, no penalties): the engine may then take the device's argmax */
int sampler_is_greedy(const struct kiln_sampler *s);

/* Log-probabilities of one row of raw logits (log-softmax): returns the
 * logprob of token tok and writes the n_top most likely ids and their
 * logprobs, most likely first, to top_ids/top_lp (n_top may be 0). */
float sampler_logprobs(const float *logits, int vocab, int32_t tok, int n_top, int32_t *top_ids, float *top_lp);

#endif
