/*
 * ref.h: the model fixtures' reference outputs (tests/fixtures/NAME/
 * reference.json + last_logits.f32, written by transformers), shared by the
 * CPU parity tests and the CUDA tests.
 */
#ifndef KILN_TEST_REF_H
#define KILN_TEST_REF_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

struct ref {
    cJSON *root;  /* reference.json: prompts, topk, greedy, last_logits */
    float *last;  /* [n_prompts][vocab] last-position logits */
    int n_prompts, vocab;
};

/* Reads dir's reference; 0, or -1 if a file is missing or mis-sized. */
int ref_load(const char *dir, struct ref *r);
void ref_free(struct ref *r);
/* A JSON list of ints as a malloc'd array; *n its length. */
int32_t *ref_ids(const cJSON *a, int *n);

/* A kiln_generate callback that appends each token to ids (room for every
 * token asked for). */
struct ref_collect {
    int32_t *ids;
    int n;
};
int ref_collect(int32_t id, void *ctx);

struct kiln_engine;

/* Feeds ids[0..n) one token at a time into a new sequence of e (the decode
 * path, from the cache) and leaves the last token's logits in out[vocab].
 * 0, or -1 with err set. */
int ref_stepwise(struct kiln_engine *e, const int32_t *ids, int n, float *out, char *err, size_t errlen);

/* Every position's logits of ids[0..n) (a malloc'd [n][vocab]) on a new
 * engine of model path on backend, fed in chunks of `chunk` tokens (n:
 * one prefill; 1: decode steps), 256 tokens of KV in pages of 16; NULL
 * with err set. */
float *ref_prompt_logits(const char *path, const char *backend, const int32_t *ids, int n, int chunk, int *vocab, char *err,
                         size_t errlen);

/* A dummy quantized linear for the tests (quant_dummy_linear: fmt as
 * `--quant` names it, group <= 0 per channel), its memory in m (freed by
 * ref_qmem_free); asym: random zero points instead of the dummy's
 * midpoint; act: a GPTQ act-order g_idx (a shuffled assignment of `group`
 * columns per group). Random choices from seed. 0, or -1 with err. */
struct qlinear;
struct ref_qmem {
    void *p[8];
    int n;
};
int ref_quant_linear(struct qlinear *w, struct ref_qmem *m, const char *fmt, int n_out, int n_in, int group, int act, int asym,
                     uint64_t seed, char *err, size_t errlen);
void ref_qmem_free(struct ref_qmem *m);

/* Greedy continuation of ids[0..n) on e for ng tokens, compared with
 * want[0..ng): the first step that differs (its token in *got), -1 if all
 * are identical, -2 if generation stopped early (err set). */
int ref_greedy_diff(struct kiln_engine *e, const int32_t *ids, int n, const int32_t *want, int ng, int32_t *got, char *err,
                    size_t errlen);

#endif
