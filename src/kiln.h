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

#include "engine/json_mask.h"
#include "engine/sampler.h"
#include "format/config.h"

typedef struct kiln_engine kiln_engine;
typedef struct kiln_seq kiln_seq;

struct kiln_engine_opts {
    const char *model;       /* checkpoint directory or .gguf file, or NULL when dummy is set */
    const char *dummy;       /* built-in config name ("qwen3-8b") or a config.json path */
    const char *dummy_dtype; /* "bf16" (default), "f16", "f32" */
    uint64_t seed;           /* dummy weights' seed */
    const char *backend;     /* "cpu", "cuda", NULL or "auto" for the best present */
    int n_threads;           /* CPU threads; 0 = every core */
    int page_size;           /* KV page size in tokens; 0 = 16 */
    int max_total_tokens;    /* KV pool capacity; 0 = the context, at most 32768 (or what mem_fraction gives) */
    double mem_fraction;     /* > 0: size the KV pool so that weights + KV take this fraction of the device's
                              * memory (SGLang's --mem-fraction-static); with max_total_tokens, the smaller */
    int prefill_chunk;       /* most tokens in one forward; 0 = 512 */
    const char *quant;       /* dummy weights built quantized: "gptq-int4", "q4_k", "fp8", ... (NULL: dense) */
    const char *kv_dtype;    /* KV cache rows: "f32" (CPU default), "f16", "bf16" (CUDA's only one), "q8_0" (CPU); NULL = the default */
    int quant_group;         /* their GPTQ/AWQ group size; 0 = 128 */
};

kiln_engine *kiln_engine_open(const struct kiln_engine_opts *o, char *err, size_t errlen);
void kiln_engine_close(kiln_engine *e);
const struct kiln_config *kiln_engine_config(const kiln_engine *e);
/* the KV pool's capacity in tokens */
int kiln_engine_max_tokens(const kiln_engine *e);
const char *kiln_engine_backend(const kiln_engine *e);
/* The vector load width (bytes) of the backend's weight-streaming kernels
 * now, for a bandwidth probe that reads as they do; 0 where that does not
 * apply (CUDA). */
int kiln_engine_load_width(const kiln_engine *e);
/* The model directory, or NULL for dummy weights (no tokenizer then). */
const char *kiln_engine_model_dir(const kiln_engine *e);
int kiln_engine_is_eos(const kiln_engine *e, int32_t id);
/* Prints architecture, shapes, dtypes, parameter count and bytes. */
void kiln_engine_describe(const kiln_engine *e, FILE *f);
int64_t kiln_engine_param_bytes(const kiln_engine *e);
/* the format of most of the weight bytes ("BF16", "Q4_0", "GPTQ-int4-g128", ...) */
void kiln_engine_weight_format(const kiln_engine *e, char *buf, size_t len);
int64_t kiln_engine_n_params(const kiln_engine *e);
/* Weight bytes one decode step reads (see model_decode_bytes in model/model.h). */
double kiln_engine_decode_bytes(const kiln_engine *e);
/* KV cache bytes one token of context holds (keys and values, every layer):
 * what attention reads per cached token at each decode step. */
double kiln_engine_kv_token_bytes(const kiln_engine *e);
/* the KV cache's row type ("F32", "F16", "BF16", "Q8_0") */
const char *kiln_engine_kv_dtype(const kiln_engine *e);

/* One sequence with its own KV pages: for run, logits and in-process bench. */
kiln_seq *kiln_seq_new(kiln_engine *e, char *err, size_t errlen);
void kiln_seq_free(kiln_seq *s);
int kiln_seq_len(const kiln_seq *s);
/* Appends n tokens (a prompt in chunks, or one decode token). logits, if
 * not NULL, receives the last token's logits [vocab], or every new token's
 * [n][vocab] when all_rows is set. -1 with err if a forward fails (e.g. the
 * backend is out of scratch memory): the chunks evaluated before it stay,
 * the rest is not appended and its KV pages go back to the pool. */
int kiln_seq_eval(kiln_seq *s, const int32_t *ids, int n, float *logits, int all_rows, char *err, size_t errlen);
/* Several sequences in one forward (continuous batching in its simplest
 * form): sequence i appends n[i] tokens ids[i]; logits[i*vocab..] receives
 * its last token's logits (logits may be NULL). All or nothing: on error no
 * sequence advances. */
int kiln_seqs_eval(kiln_seq **seqs, int n_seqs, const int32_t *const *ids, const int *n, float *logits, char *err,
                   size_t errlen);
/* The same, but next[i] receives the argmax of sequence i's last logits
 * (its greedy next token), found on the device: no logits are copied. */
int kiln_seqs_eval_argmax(kiln_seq **seqs, int n_seqs, const int32_t *const *ids, const int *n, int32_t *next, char *err,
                          size_t errlen);
/* Forgets the cached tokens after the first n (n <= len). */
void kiln_seq_truncate(kiln_seq *s, int n);

/* Generates up to n_gen tokens after the prompt; on_token is called with
 * each (return non-zero to stop). Stops at an EOS token unless ignore_eos.
 * Returns the number generated or -1. */
int kiln_generate(kiln_engine *e, const int32_t *prompt, int n_prompt, int n_gen, const struct kiln_sampling *sp,
                  int ignore_eos, int (*on_token)(int32_t id, void *ctx), void *ctx, char *err, size_t errlen);

/* ==== serving: many requests, one engine thread ====
 *
 * kiln_serving_start starts the engine thread, which alone uses the engine
 * from then on (no kiln_seq / kiln_generate on it meanwhile): it runs the
 * scheduler (engine/sched.h: continuous batching, chunked prefill, the
 * radix prefix cache, preemption) in a loop. Any thread may submit
 * requests; each request's events (tokens, then one finish) go to a
 * channel the submitter waits on. A channel can collect several requests
 * (the n choices of one API call), told apart by their tag.
 *
 * Lifetime: the submitter holds its request handle until it calls
 * kiln_request_release (which also cancels it if unfinished); the engine
 * frees the request after both let go. Every submitted request ends with
 * exactly one KILN_EVENT_FINISH event, also on cancel or engine error. */

typedef struct kiln_serving kiln_serving;
typedef struct kiln_request kiln_request;
typedef struct kiln_channel kiln_channel;

struct kiln_serving_opts {
    int max_running; /* most requests in the batch (0: 256) */
    int max_queued;  /* most waiting requests; more gets KILN_EFULL (0: 1024) */
    int chunk;       /* per-step token budget for chunked prefill (0: the engine's prefill_chunk) */
};

#define KILN_MAX_TOP_LOGPROBS 20
#define KILN_EFULL (-2) /* kiln_serving_submit: the queue is full, retry later */

enum kiln_finish { KILN_FINISH_NONE, KILN_FINISH_STOP, KILN_FINISH_LENGTH, KILN_FINISH_ABORT, KILN_FINISH_ERROR };
enum kiln_event_type { KILN_EVENT_TOKEN, KILN_EVENT_FINISH };

struct kiln_request_params {
    const int32_t *prompt; /* copied */
    int n_prompt;
    int max_tokens;  /* > 0 */
    int min_tokens;  /* EOS (and stop_ids) are masked until this many were generated */
    int ignore_eos;
    int logprobs;    /* -1: none; else the sampled token's logprob and this many top alternatives (<= 20) */
    struct kiln_sampling sampling; /* its logit bias is copied */
    const int32_t *stop_ids; /* copied: sampling one of these ends the request (KILN_FINISH_STOP), */
    int n_stop_ids;          /* also with ignore_eos; like EOS they are masked until min_tokens */
    /* non-NULL: the output is constrained to one JSON object (json_mask.h)
     * and the request stops (KILN_FINISH_STOP) when it closes. Borrowed:
     * it must outlive the request. */
    const struct json_vocab *json;
};

struct kiln_event {
    int type; /* enum kiln_event_type */
    int tag;  /* the submitter's tag */
    /* KILN_EVENT_TOKEN */
    int32_t id;
    float logprob; /* log-softmax of the raw logits (before penalties and temperature) */
    int n_top;
    int32_t top_id[KILN_MAX_TOP_LOGPROBS];
    float top_logprob[KILN_MAX_TOP_LOGPROBS];
    /* KILN_EVENT_FINISH */
    int finish;    /* enum kiln_finish */
    int n_prompt, n_cached, n_generated;
    char err[256]; /* KILN_FINISH_ERROR */
};

/* Serving statistics, for /metrics. Histograms are cumulative per bucket
 * upper bound (the last bucket is +Inf). */
#define KILN_HIST_BUCKETS 20
struct kiln_histogram {
    int n_bounds;
    double bounds[KILN_HIST_BUCKETS];
    uint64_t counts[KILN_HIST_BUCKETS + 1];
    double sum;
    uint64_t count;
};
struct kiln_serving_stats {
    uint64_t requests_finished[5]; /* by enum kiln_finish */
    uint64_t prompt_tokens, generation_tokens, cached_prompt_tokens;
    uint64_t prefix_query_tokens, prefix_hit_tokens; /* scheduler's radix matches */
    uint64_t preemptions, steps;
    int running, waiting;
    int kv_pages_total, kv_pages_free, kv_pages_cached, kv_pages_evictable, page_size;
    struct kiln_histogram ttft, tpot, e2e;
};

kiln_serving *kiln_serving_start(kiln_engine *e, const struct kiln_serving_opts *o, char *err, size_t errlen);
/* Stops the engine thread and aborts every request left (their finish
 * events are sent); later submissions fail. The handle stays valid for
 * threads still draining their channels until kiln_serving_free. */
void kiln_serving_stop(kiln_serving *s);
void kiln_serving_free(kiln_serving *s);
/* Validates and queues a request. Returns 0 with *out set, KILN_EFULL when
 * the queue is full, or -1 with err (bad parameters, a prompt or
 * max_tokens that cannot fit the context or the KV pool). */
int kiln_serving_submit(kiln_serving *s, const struct kiln_request_params *p, kiln_channel *ch, int tag, kiln_request **out,
                        char *err, size_t errlen);
/* Asks the engine to stop the request: it finishes with KILN_FINISH_ABORT
 * (unless it finished already) and its pages are freed. */
void kiln_request_cancel(kiln_request *r);
/* Drops the submitter's handle (cancels the request if unfinished). */
void kiln_request_release(kiln_request *r);
void kiln_serving_stats(kiln_serving *s, struct kiln_serving_stats *st);
/* The largest prompt + max_tokens a request may have. */
int kiln_serving_max_tokens(const kiln_serving *s);
/* Health: runs a 1-token greedy request through the queue (bypassing
 * max_queued). 0 when it came back within timeout_s, else -1 with err. */
int kiln_serving_canary(kiln_serving *s, double timeout_s, char *err, size_t errlen);
/* Drops the unlocked prefix cache (pages back to the free list); returns
 * the pages freed. Waits for the engine thread to do it. */
int kiln_serving_flush_cache(kiln_serving *s);

kiln_channel *kiln_channel_new(void);
/* Drops the submitter's reference; the channel lives on while requests
 * still post to it. */
void kiln_channel_release(kiln_channel *c);
/* Waits up to timeout_s for the next event (timeout_s < 0: forever).
 * Returns 1 with *ev filled, 0 on timeout. */
int kiln_channel_next(kiln_channel *c, struct kiln_event *ev, double timeout_s);

#endif
