/*
 * ref.h: the model fixtures' reference outputs (tests/fixtures/NAME/
 * reference.json + last_logits.f32, written by transformers), shared by the
 * CPU parity tests and the CUDA tests.
 */
#ifndef KILN_TEST_REF_H
#define KILN_TEST_REF_H

#include <cjson/cJSON.h>
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

#endif
