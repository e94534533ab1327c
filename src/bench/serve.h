/*
 * serve.h: `kiln bench serve`: the profiles and a serving benchmark against
 * any OpenAI-compatible server, over POST /v1/completions with streaming.
 *
 * Requests carry the prompt as a list of token ids (no tokenizer needed),
 * max_tokens = min_tokens = the wanted output length and ignore_eos, so
 * lengths are exact on servers that honour them (vLLM, SGLang, kiln). The
 * model name comes from GET /v1/models unless given. The first streamed
 * chunk with a choice is the first token (TTFT, measured here, on the
 * client); the output token count is the server's usage.completion_tokens
 * when it sends one, else the number of such chunks.
 */
#ifndef KILN_BENCH_SERVE_H
#define KILN_BENCH_SERVE_H

#include "bench/bench.h"
#include "bench/http.h"
#include "bench/stats.h"

struct bench_serve_conn {
    struct http_url url;
    char model[256];
    int token_range;  /* prompt ids are drawn from [0, token_range) */
    double timeout_s; /* per request */
};

/* Parses url and fills model (GET /v1/models when model is NULL). */
int bench_serve_connect(struct bench_serve_conn *c, const char *url, const char *model, int token_range, char *err,
                        size_t errlen);

/* One streamed completion: prompt ids, n_out tokens (exact when the server
 * honours min_tokens/ignore_eos). Fills r (times on kiln_now's clock,
 * chunk arrival times malloc'd in *chunk_t, free it). 0 or -1 with err. */
int bench_serve_complete(const struct bench_serve_conn *c, const int32_t *ids, int n_ids, int n_out,
                         struct bench_req_times *r, double **chunk_t, char *err, size_t errlen);

/* A bench_target whose jobs are requests to the server (batch B = B
 * concurrent requests). max_tokens/max_ctx are unknown (0) unless given. */
void bench_serve_target(struct bench_target *t, struct bench_serve_conn *c, int max_tokens, int max_ctx);
void bench_serve_target_free(struct bench_target *t);

struct bench_serving_opts {
    int num_prompts;
    int input_len, output_len;
    double range_ratio;   /* lengths uniform in [len * ratio, len]; 1 = exact */
    double request_rate;  /* requests/s, Poisson arrivals; <= 0 or inf: all at once */
    int max_concurrency;  /* 0: unlimited */
    int warmup_requests;
    uint64_t seed;
    int progress;
};

/* Runs the serving benchmark; t gets a key/value table of what
 * sglang.bench_serving prints. */
int bench_serving_run(const struct bench_serve_conn *c, const struct bench_serving_opts *o, struct bt_table *t, char *err,
                      size_t errlen);

#endif
