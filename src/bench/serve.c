/*
 * serve.c: `kiln bench serve`: see serve.h.
 *
 * What is timed, on the client: from just before the request is sent to
 * the arrival of each streamed chunk that carries a token (a choice with
 * text, or with no finish_reason yet). TTFT = first such chunk - send; E2E =
 * last such chunk - send (vLLM's client does the same); ITL = gaps between
 * those chunks. Connecting is inside the clock (a fresh connection per
 * request, as the Python clients' default), JSON building is outside.
 */
#include "bench/serve.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"

/* ==== growing string ==== */

struct sbuf {
    char *p;
    size_t n, cap;
};

static void sb_add(struct sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = kiln_realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static int sb_body(const char *p, size_t n, void *ctx) {
    struct sbuf *b = ctx;
    if (b->n + n > (64u << 20)) return 1; /* 64 MiB is not a JSON answer */
    sb_add(b, p, n);
    return 0;
}

/* ==== /v1/models ==== */

int bench_serve_connect(struct bench_serve_conn *c, const char *url, const char *model, int token_range, char *err,
                        size_t errlen) {
    memset(c, 0, sizeof *c);
    c->token_range = token_range > 0 ? token_range : 10000;
    c->timeout_s = 3600;
    if (http_parse_url(&c->url, url, err, errlen)) return -1;
    if (model) {
        snprintf(c->model, sizeof c->model, "%s", model);
        return 0;
    }
    struct sbuf b = {0};
    int st = http_request(&c->url, "GET", "/v1/models", NULL, 30, sb_body, &b, err, errlen);
    if (st < 0) {
        free(b.p);
        return kiln_err_prefix(err, errlen, "GET %s/v1/models", url);
    }
    if (st != 200) {
        kiln_errf(err, errlen, "GET %s/v1/models: HTTP %d: %.200s", url, st, b.p ? b.p : "");
        free(b.p);
        return -1;
    }
    cJSON *j = cJSON_Parse(b.p ? b.p : "");
    free(b.p);
    cJSON *data = j ? cJSON_GetObjectItemCaseSensitive(j, "data") : NULL;
    cJSON *first = cJSON_IsArray(data) ? cJSON_GetArrayItem(data, 0) : NULL;
    cJSON *id = first ? cJSON_GetObjectItemCaseSensitive(first, "id") : NULL;
    if (!cJSON_IsString(id)) {
        cJSON_Delete(j);
        return kiln_errf(err, errlen, "GET %s/v1/models: no model id in the answer (give --model)", url);
    }
    snprintf(c->model, sizeof c->model, "%s", id->valuestring);
    cJSON_Delete(j);
    return 0;
}

/* ==== one streamed completion ==== */

struct stream_state {
    struct sse sse;
    double *t;
    int n, cap;
    double t_finish; /* a finish chunk without text, 0 if none */
    int usage_out; /* -1: none */
    int done;
    char error[256];
    struct sbuf raw; /* a non-SSE answer (an error body) */
};

static int on_event(const char *data, size_t n, void *ctx) {
    struct stream_state *s = ctx;
    double now = kiln_now();
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        s->done = 1;
        return 1;
    }
    cJSON *j = cJSON_ParseWithLength(data, n);
    if (!j) return 0;
    cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (e) {
        cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : e;
        snprintf(s->error, sizeof s->error, "server error: %s", cJSON_IsString(m) ? m->valuestring : "(no message)");
        cJSON_Delete(j);
        return 1;
    }
    cJSON *ch = cJSON_GetObjectItemCaseSensitive(j, "choices");
    cJSON *c0 = cJSON_IsArray(ch) ? cJSON_GetArrayItem(ch, 0) : NULL;
    if (c0) {
        cJSON *text = cJSON_GetObjectItemCaseSensitive(c0, "text");
        cJSON *fin = cJSON_GetObjectItemCaseSensitive(c0, "finish_reason");
        int has_text = cJSON_IsString(text) && text->valuestring[0];
        int finished = fin && !cJSON_IsNull(fin);
        if (finished && !has_text) s->t_finish = now;
        if (has_text || !finished) {
            if (s->n == s->cap) {
                s->cap = s->cap ? s->cap * 2 : 256;
                s->t = kiln_realloc(s->t, sizeof(double) * (size_t)s->cap);
            }
            s->t[s->n++] = now;
        }
    }
    cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    cJSON *ct = cJSON_IsObject(u) ? cJSON_GetObjectItemCaseSensitive(u, "completion_tokens") : NULL;
    if (cJSON_IsNumber(ct)) s->usage_out = ct->valueint;
    cJSON_Delete(j);
    return 0;
}

static int stream_body(const char *p, size_t n, void *ctx) {
    struct stream_state *s = ctx;
    if (s->raw.n < 4096) sb_add(&s->raw, p, n < 4096 ? n : 4096);
    return sse_feed(&s->sse, p, n);
}

static char *completion_body(const char *model, const int32_t *ids, int n_ids, int n_out) {
    struct sbuf b = {0};
    char tmp[512];
    int k = snprintf(tmp, sizeof tmp, "{\"model\": ");
    sb_add(&b, tmp, (size_t)k);
    cJSON *m = cJSON_CreateString(model);
    char *ms = cJSON_PrintUnformatted(m);
    sb_add(&b, ms, strlen(ms));
    free(ms);
    cJSON_Delete(m);
    sb_add(&b, ", \"prompt\": [", 13);
    for (int i = 0; i < n_ids; i++) { /* digits by hand: snprintf per id cost ~1 ms of TTFT at 16k ids */
        char d[12], *q = d + sizeof d;
        uint32_t x = (uint32_t)ids[i];
        do *--q = (char)('0' + x % 10), x /= 10;
        while (x);
        if (i) *--q = ',';
        sb_add(&b, q, (size_t)(d + sizeof d - q));
    }
    k = snprintf(tmp, sizeof tmp,
                 "], \"max_tokens\": %d, \"min_tokens\": %d, \"ignore_eos\": true, \"temperature\": 0, \"stream\": true, "
                 "\"stream_options\": {\"include_usage\": true}}",
                 n_out, n_out);
    sb_add(&b, tmp, (size_t)k);
    return b.p;
}

int bench_serve_complete(const struct bench_serve_conn *c, const int32_t *ids, int n_ids, int n_out,
                         struct bench_req_times *r, double **chunk_t, char *err, size_t errlen) {
    char *body = completion_body(c->model, ids, n_ids, n_out);
    struct stream_state s = {.usage_out = -1};
    sse_init(&s.sse, on_event, &s);
    memset(r, 0, sizeof *r);
    r->n_in = n_ids;
    r->t_send = kiln_now();
    int st = http_request(&c->url, "POST", "/v1/completions", body, c->timeout_s, stream_body, &s, err, errlen);
    double end = kiln_now();
    free(body);
    int rc = 0;
    if (st < 0) rc = -1;
    else if (st != 200)
        rc = kiln_errf(err, errlen, "POST /v1/completions: HTTP %d: %.300s", st, s.raw.p ? s.raw.p : "");
    else if (s.error[0]) rc = kiln_errf(err, errlen, "%s", s.error);
    if (rc == 0 && s.n == 0 && s.t_finish > 0) { /* the server streamed no token chunk (empty texts): its end is all we have */
        s.t = kiln_malloc(sizeof(double));
        s.t[s.n++] = s.t_finish;
    }
    else if (s.n == 0) rc = kiln_errf(err, errlen, "POST /v1/completions: no token was streamed: %.300s", s.raw.p ? s.raw.p : "");
    if (rc == 0) {
        r->t_first = s.t[0];
        r->t_end = s.t[s.n - 1];
        r->n_out = s.usage_out >= 0 ? s.usage_out : s.n;
        r->n_chunks = s.n;
        r->ok = 1;
        (void)end;
    }
    sse_free(&s.sse);
    free(s.raw.p);
    if (chunk_t && rc == 0) *chunk_t = s.t;
    else free(s.t);
    return rc;
}

/* ==== the profile target: a job = batch concurrent requests ==== */

struct serve_tgt {
    struct bench_serve_conn *c;
    int32_t *pids;
    int cap_p;
};

struct req_arg {
    const struct bench_serve_conn *c;
    const int32_t *ids;
    int n_ids, n_out;
    struct bench_req_times r;
    double *chunk_t;
    int rc;
    char err[512];
};

static void *req_thread(void *p) {
    struct req_arg *a = p;
    a->chunk_t = NULL;
    a->rc = bench_serve_complete(a->c, a->ids, a->n_ids, a->n_out, &a->r, &a->chunk_t, a->err, sizeof a->err);
    return NULL;
}

static void rand_ids(int32_t *ids, int n, int range, uint64_t seed) {
    struct kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(kiln_rng_next(&r) % (uint64_t)range);
}

static int serve_run(struct bench_target *t, const struct bench_job *j, struct bench_obs *o, char *err, size_t errlen) {
    struct serve_tgt *st = t->ctx;
    const int B = j->batch, L = j->n_prefix + j->n_new;
    if (j->n_prefix > st->cap_p) {
        st->pids = kiln_realloc(st->pids, sizeof(int32_t) * (size_t)j->n_prefix);
        rand_ids(st->pids, j->n_prefix, st->c->token_range, 0x9e3779b97f4a7c15ull);
        st->cap_p = j->n_prefix;
    }
    int32_t **ids = kiln_calloc((size_t)B, sizeof *ids);
    struct req_arg *a = kiln_calloc((size_t)B, sizeof *a);
    pthread_t *th = kiln_calloc((size_t)B, sizeof *th);
    int rc = 0;
    for (int b = 0; b < B; b++) {
        ids[b] = kiln_malloc(sizeof(int32_t) * (size_t)L);
        memcpy(ids[b], st->pids, sizeof(int32_t) * (size_t)j->n_prefix);
        rand_ids(ids[b] + j->n_prefix, j->n_new, st->c->token_range, j->seed * 1000003u + (uint64_t)b);
        a[b] = (struct req_arg){.c = st->c, .ids = ids[b], .n_ids = L, .n_out = j->n_out};
    }
    if (j->n_prefix > 0) { /* untimed: let the server cache the prefix */
        struct bench_req_times w;
        if (bench_serve_complete(st->c, st->pids, j->n_prefix, 1, &w, NULL, err, errlen)) {
            kiln_err_prefix(err, errlen, "sending the prefix");
            rc = -1;
            goto out;
        }
    }
    o->t_send = kiln_now();
    int started = 0;
    for (int b = 0; b < B; b++, started++)
        if (pthread_create(&th[b], NULL, req_thread, &a[b])) {
            rc = kiln_errf(err, errlen, "cannot start a request thread");
            break;
        }
    for (int b = 0; b < started; b++) pthread_join(th[b], NULL);
    for (int b = 0; b < started && rc == 0; b++) {
        if (a[b].rc) {
            rc = kiln_errf(err, errlen, "%s", a[b].err);
            break;
        }
        o->t_first[b] = a[b].r.t_first;
        o->t_end[b] = a[b].r.t_end;
        o->n_out[b] = a[b].r.n_out;
    }
    o->peak_mem = NAN;
out:
    for (int b = 0; b < B; b++) free(ids[b]), free(a[b].chunk_t);
    free(ids), free(a), free(th);
    return rc;
}

static void serve_reset(struct bench_target *t) { (void)t; }

void bench_serve_target(struct bench_target *t, struct bench_serve_conn *c, int max_tokens, int max_ctx) {
    struct serve_tgt *st = kiln_calloc(1, sizeof *st);
    st->c = c;
    memset(t, 0, sizeof *t);
    t->kind = "serve";
    t->max_tokens = max_tokens;
    t->max_ctx = max_ctx;
    t->mem_what = NULL;
    t->ctx = st;
    t->run = serve_run;
    t->reset = serve_reset;
}

void bench_serve_target_free(struct bench_target *t) {
    struct serve_tgt *st = t->ctx;
    if (st) free(st->pids);
    free(st);
    t->ctx = NULL;
}

/* ==== the serving benchmark ==== */

struct pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int in_flight, done;
};

struct srv_arg {
    struct req_arg a;
    struct pool *pool;
};

static void *srv_thread(void *p) {
    struct srv_arg *s = p;
    req_thread(&s->a);
    pthread_mutex_lock(&s->pool->mu);
    s->pool->in_flight--;
    s->pool->done++;
    pthread_cond_broadcast(&s->pool->cv);
    pthread_mutex_unlock(&s->pool->mu);
    return NULL;
}

static void sleep_until(double t) {
    for (;;) {
        double d = t - kiln_now();
        if (d <= 0) return;
        struct timespec ts = {.tv_sec = (time_t)d, .tv_nsec = (long)((d - (double)(time_t)d) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static void stat_rows(struct bt_table *t, const char *name, const char *key, const struct bench_stat *s) {
    static const char *what[] = {"Mean", "Median", "P99"};
    for (int k = 0; k < 3; k++) {
        double v = k == 0 ? s->mean : k == 1 ? s->median : s->p99;
        char n[96], kk[64];
        snprintf(n, sizeof n, "%s %s (ms)", what[k], name);
        snprintf(kk, sizeof kk, "%s_%s_ms", k == 0 ? "mean" : k == 1 ? "median" : "p99", key);
        int r = bt_row(t);
        bt_set_str(t, r, 0, n);
        bt_set_num(t, r, 1, v);
        bt_summary(t, kk, v);
    }
}

static void kv_row(struct bt_table *t, const char *name, const char *key, double v) {
    int r = bt_row(t);
    bt_set_str(t, r, 0, name);
    bt_set_num(t, r, 1, v);
    bt_summary(t, key, v);
}

int bench_serving_run(const struct bench_serve_conn *c, const struct bench_serving_opts *o, struct bt_table *t, char *err,
                      size_t errlen) {
    const int N = o->num_prompts;
    if (N <= 0 || o->input_len <= 0 || o->output_len <= 0)
        return kiln_errf(err, errlen, "serving: --num-prompts, --input-len and --output-len must be positive");
    struct kiln_rng rng;
    kiln_rng_seed(&rng, o->seed);
    struct srv_arg *a = kiln_calloc((size_t)N, sizeof *a);
    int32_t **ids = kiln_calloc((size_t)N, sizeof *ids);
    double *arrive = kiln_malloc(sizeof(double) * (size_t)N);
    double ratio = o->range_ratio > 0 && o->range_ratio <= 1 ? o->range_ratio : 1;
    double at = 0;
    struct pool pool = {.in_flight = 0};
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.cv, NULL);
    for (int i = 0; i < N; i++) {
        int lo_in = (int)(o->input_len * ratio), lo_out = (int)(o->output_len * ratio);
        if (lo_in < 1) lo_in = 1;
        if (lo_out < 1) lo_out = 1;
        int n_in = lo_in + (int)(kiln_rng_next(&rng) % (uint64_t)(o->input_len - lo_in + 1));
        int n_out = lo_out + (int)(kiln_rng_next(&rng) % (uint64_t)(o->output_len - lo_out + 1));
        ids[i] = kiln_malloc(sizeof(int32_t) * (size_t)n_in);
        rand_ids(ids[i], n_in, c->token_range, o->seed * 31u + (uint64_t)i + 1);
        a[i].a = (struct req_arg){.c = c, .ids = ids[i], .n_ids = n_in, .n_out = n_out};
        a[i].pool = &pool;
        arrive[i] = at;
        if (o->request_rate > 0 && isfinite(o->request_rate)) at += -log(1.0 - kiln_rng_uniform(&rng)) / o->request_rate;
    }
    for (int w = 0; w < o->warmup_requests; w++) { /* untimed */
        struct bench_req_times r;
        if (bench_serve_complete(c, ids[0], a[0].a.n_ids < 16 ? a[0].a.n_ids : 16, 4, &r, NULL, err, errlen)) {
            kiln_err_prefix(err, errlen, "warm-up request");
            goto fail;
        }
    }
    pthread_t *th = kiln_calloc((size_t)N, sizeof *th);
    char *live = kiln_calloc((size_t)N, 1);
    struct bench_progress pr;
    bench_progress_start(&pr, o->progress, N, N, kiln_now());
    double t0 = kiln_now();
    int started = 0;
    for (int i = 0; i < N; i++) {
        sleep_until(t0 + arrive[i]);
        pthread_mutex_lock(&pool.mu);
        while (o->max_concurrency > 0 && pool.in_flight >= o->max_concurrency) pthread_cond_wait(&pool.cv, &pool.mu);
        pool.in_flight++;
        int done = pool.done;
        pthread_mutex_unlock(&pool.mu);
        if (pthread_create(&th[i], NULL, srv_thread, &a[i])) {
            pthread_mutex_lock(&pool.mu);
            pool.in_flight--;
            pthread_mutex_unlock(&pool.mu);
            a[i].a.rc = -1;
            snprintf(a[i].a.err, sizeof a[i].a.err, "cannot start a thread");
            continue;
        }
        started++;
        live[i] = 1;
        char what[64];
        snprintf(what, sizeof what, "sent %d, done %d", i + 1, done);
        pr.done_w = done;
        bench_progress_row(&pr, i + 1, what, kiln_now());
    }
    for (int i = 0; i < N; i++)
        if (live[i]) pthread_join(th[i], NULL);
    bench_progress_end(&pr);
    double t_last = t0;
    struct bench_req_times *rt = kiln_calloc((size_t)N, sizeof *rt);
    const char *first_err = NULL;
    for (int i = 0; i < N; i++) {
        rt[i] = a[i].a.r;
        rt[i].ok = a[i].a.rc == 0;
        rt[i].n_in = a[i].a.n_ids;
        rt[i].chunk_t = a[i].a.chunk_t;
        if (rt[i].ok && rt[i].t_end > t_last) t_last = rt[i].t_end;
        if (!rt[i].ok && !first_err) first_err = a[i].a.err;
    }
    (void)started;
    struct bench_serving_summary s;
    bench_serving_summarize(rt, N, t_last - t0, &s);

    bt_init(t, "serving", "kiln bench serve --profile serving", BT_SPREAD_NONE);
    bt_col(t, "Metric", "metric", BT_STR, 0, 0);
    bt_col(t, "Value", "value", BT_NUM, -1, 0);
    kv_row(t, "Successful requests", "completed", s.completed);
    kv_row(t, "Failed requests", "failed", s.failed);
    kv_row(t, "Benchmark duration (s)", "duration_s", s.duration);
    kv_row(t, "Total input tokens", "total_input_tokens", (double)s.total_in);
    kv_row(t, "Total generated tokens", "total_output_tokens", (double)s.total_out);
    kv_row(t, "Request throughput (req/s)", "request_throughput", s.req_tput);
    kv_row(t, "Input token throughput (tok/s)", "input_throughput", s.in_tput);
    kv_row(t, "Output token throughput (tok/s)", "output_throughput", s.out_tput);
    kv_row(t, "Total token throughput (tok/s)", "total_token_throughput", s.total_tput);
    kv_row(t, "Concurrency", "concurrency", s.concurrency);
    stat_rows(t, "E2E Latency", "e2e_latency", &s.e2e);
    stat_rows(t, "TTFT", "ttft", &s.ttft);
    stat_rows(t, "TPOT", "tpot", &s.tpot);
    stat_rows(t, "ITL", "itl", &s.itl);
    if (first_err) bt_note(t, "%d request(s) failed; the first: %s", s.failed, first_err);
    bt_footer(t, "TTFT = first streamed token - send; E2E = last streamed token - send; TPOT = (E2E - TTFT) / (output - 1) "
                 "per request (requests with one output token left out); ITL = gaps between streamed chunks, pooled; "
                 "throughputs = tokens / benchmark duration (first send to last token); Concurrency = sum of E2E / "
                 "duration. Percentiles interpolate linearly (numpy). Definitions of vLLM / sglang.bench_serving.");
    bt_footer(t, "Load: %d prompts of random token ids in [0, %d), input %d and output %d tokens%s, %s, %s; ignore_eos "
                 "and min_tokens sent; %d untimed warm-up request(s).",
              N, c->token_range, o->input_len, o->output_len, ratio < 1 ? " (scaled by a uniform ratio)" : "",
              o->request_rate > 0 && isfinite(o->request_rate) ? "Poisson arrivals" : "all sent at once",
              o->max_concurrency > 0 ? "with a concurrency cap" : "no concurrency cap", o->warmup_requests);
    free(rt);
    free(th), free(live);
    for (int i = 0; i < N; i++) free(ids[i]), free(a[i].a.chunk_t);
    free(ids), free(a), free(arrive);
    pthread_mutex_destroy(&pool.mu);
    pthread_cond_destroy(&pool.cv);
    return 0;
fail:
    for (int i = 0; i < N; i++) free(ids[i]);
    free(ids), free(a), free(arrive);
    pthread_mutex_destroy(&pool.mu);
    pthread_cond_destroy(&pool.cv);
    return -1;
}
