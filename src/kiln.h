/*
 * kiln.h: the engine boundary. The CLI, the server and the benchmarks use
 * only this header: they see token ids, logits and text, never tensors.
 *
 * Errors: functions return 0 / a pointer on success and -1 / NULL on
 * failure, with a message in (err, errlen). Nothing here exits.
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/sampler.h"
#include "format/config.h"

typedef struct kiln_engine kiln_engine;
typedef struct kiln_seq kiln_seq;

struct kiln_engine_opts {
    const char *model;       /* checkpoint directory, or NULL when dummy is set */
    const char *dummy;       /* built-in config name ("qwen3-8b") or a config.json path */
    const char *dummy_dtype; /* "bf16" (default), "f16", "f32" */
    uint64_t seed;           /* dummy weights' seed */
    const char *backend;     /* "cpu", "cuda", NULL or "auto" for the best present */
    int n_threads;           /* CPU threads; 0 = every core */
    int page_size;           /* KV page size in tokens; 0 = 16 */
    int max_total_tokens;    /* KV pool capacity; 0 = the context, at most 32768 */
    int prefill_chunk;       /* most tokens in one forward; 0 = 512 */
};

kiln_engine *kiln_engine_open(const struct kiln_engine_opts *o, char *err, size_t errlen);
void kiln_engine_close(kiln_engine *e);
const struct kiln_config *kiln_engine_config(const kiln_engine *e);
const char *kiln_engine_backend(const kiln_engine *e);
/* The model directory, or NULL for dummy weights (no tokenizer then). */
const char *kiln_engine_model_dir(const kiln_engine *e);
int kiln_engine_is_eos(const kiln_engine *e, int32_t id);
/* Prints architecture, shapes, dtypes, parameter count and bytes. */
void kiln_engine_describe(const kiln_engine *e, FILE *f);
int64_t kiln_engine_param_bytes(const kiln_engine *e);
int64_t kiln_engine_n_params(const kiln_engine *e);

/* One sequence with its own KV pages: for run, logits and in-process bench. */
kiln_seq *kiln_seq_new(kiln_engine *e, char *err, size_t errlen);
void kiln_seq_free(kiln_seq *s);
int kiln_seq_len(const kiln_seq *s);
/* Appends n tokens (a prompt in chunks, or one decode token). logits, if
 * not NULL, receives the last token's logits [vocab], or every new token's
 * [n][vocab] when all_rows is set. */
int kiln_seq_eval(kiln_seq *s, const int32_t *ids, int n, float *logits, int all_rows, char *err, size_t errlen);
/* Several sequences in one forward (continuous batching in its simplest
 * form): sequence i appends n[i] tokens ids[i]; logits[i*vocab..] receives
 * its last token's logits (logits may be NULL). All or nothing: on error no
 * sequence advances. */
int kiln_seqs_eval(kiln_seq **seqs, int n_seqs, const int32_t *const *ids, const int *n, float *logits, char *err,
                   size_t errlen);
/* Forgets the cached tokens after the first n (n <= len). */
void kiln_seq_truncate(kiln_seq *s, int n);

/* Generates up to n_gen tokens after the prompt; on_token is called with
 * each (return non-zero to stop). Stops at an EOS token unless ignore_eos.
 * Returns the number generated or -1. */
int kiln_generate(kiln_engine *e, const int32_t *prompt, int n_prompt, int n_gen, const struct kiln_sampling *sp,
                  int ignore_eos, int (*on_token)(int32_t id, void *ctx), void *ctx, char *err, size_t errlen);

#endif
