/*
 * openai.c: the OpenAI-compatible routes (see openai.h).
 *
 * One API call is a job: its choices (n per prompt; several prompts only
 * for /v1/completions, choice index = prompt * n + sample) are engine
 * requests posting to one channel, tagged with the choice index. Each
 * choice runs its tokens through the same pipeline whether the call
 * streams or not:
 *
 *   id -> tok_stream (UTF-8 safe text) -> stop matcher -> <think> splitter -> tool parser -> text / reasoning / tool calls
 *
 * so a streamed answer concatenates to exactly the non-streamed one. A
 * choice is done for the client at EOS / a stop token id / length / a stop
 * string (then its engine request is cancelled); the job is done when
 * every engine request has posted its finish event, so usage counts and
 * the cache-hit count are final and no engine request outlives its job.
 *
 * Parameters are validated before anything is queued (params.c): a wrong
 * type or an out-of-range value is a 400 naming the parameter. The
 * engine applies what needs no text: logit_bias (in the sampler),
 * stop_token_ids, and the JSON constraint of response_format json_object,
 * whose token table (every token's bytes) is built here once.
 */
#include "server/openai.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "server/http.h"
#include "server/params.h"
#include "server/text.h"
#include "tokenizer/tokenizer.h"

struct openai_server {
    kiln_engine *e;
    kiln_serving *srv;
    struct kiln_tokenizer *tok;
    struct openai_opts o;
    char *model_name;
    struct http_server *http;
    atomic_ulong next_id;
    long created;
    struct params_ctx pc;  /* what request parsing needs to know */
    struct json_vocab *jv; /* token bytes for response_format json_object (NULL without a tokenizer) */
    int think_open, think_close; /* the ids of <think> and </think> (-1: none) */
    pthread_mutex_t mu;
    uint64_t http_by_code[6]; /* 2xx 400 401 404 413 5xx, for /metrics */
};

/* ==== replies ==== */

static void count_status(struct openai_server *s, int status) {
    int i = status < 300 ? 0 : status == 400 ? 1 : status == 401 ? 2 : status == 404 || status == 405 ? 3 : status == 413 ? 4 : 5;
    pthread_mutex_lock(&s->mu);
    s->http_by_code[i]++;
    pthread_mutex_unlock(&s->mu);
}

static void reply_json(struct http_response *rs, int status, cJSON *j) {
    rs->status = status;
    rs->body = cJSON_PrintUnformatted(j);
    rs->body_len = strlen(rs->body);
    cJSON_Delete(j);
}

static void reply_error(struct http_response *rs, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void reply_error(struct http_response *rs, int status, const char *param, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *type = status == 401 ? "authentication_error"
                       : status == 404 ? "not_found_error"
                       : status == 503 ? "overloaded_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    cJSON *e = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(e, "error");
    cJSON_AddStringToObject(o, "message", msg);
    cJSON_AddStringToObject(o, "type", type);
    if (param) cJSON_AddStringToObject(o, "param", param);
    else cJSON_AddNullToObject(o, "param");
    cJSON_AddNumberToObject(o, "code", status);
    reply_json(rs, status, e);
}

/* ==== jobs: one API call, its choices ==== */

struct choice {
    kiln_request *req;
    int prompt; /* index in p.prompts */
    struct tok_stream *ts;
    struct stop_matcher stop;
    struct think_splitter think;
    struct tool_parser tools;
    int calls_sent; /* tool calls already streamed */
    int n_tokens, n_cached, client_done, engine_done, error;
    int n_reason, in_think, think_done; /* reasoning tokens: from <think> (or a prompt that opened it) to </think> */
    const char *finish;
    struct strbuf text, reasoning;  /* everything (non-streaming) */
    struct strbuf d_text, d_reason; /* the current delta (streaming) */
    cJSON *lp;                      /* chat: content array; completions: {tokens, ...} */
    int text_offset;
    char err[256];
};

struct job {
    struct openai_server *s;
    struct gen_params p;
    struct choice *c;
    kiln_channel *ch;
    char id[48];
    long created;
    int n_choices; /* prompts x n */
    int n_engine_done, fd, error;
    /* streaming */
    struct strbuf out;
    size_t out_off;
    int stream_over;
};

static void job_free(struct job *j) {
    for (int i = 0; i < j->n_choices; i++) {
        struct choice *c = &j->c[i];
        kiln_request_release(c->req);
        if (c->ts) tok_stream_free(c->ts);
        stop_free(&c->stop);
        think_free(&c->think);
        tool_free(&c->tools);
        sb_free(&c->text), sb_free(&c->reasoning), sb_free(&c->d_text), sb_free(&c->d_reason);
        cJSON_Delete(c->lp);
    }
    free(j->c);
    kiln_channel_release(j->ch);
    params_free(&j->p);
    sb_free(&j->out);
    free(j);
}

static cJSON *new_lp(const struct job *j) {
    if (j->p.chat) return cJSON_CreateArray();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddArrayToObject(o, "tokens");
    cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON_AddArrayToObject(o, "text_offset");
    return o;
}

static char *token_text(const struct openai_server *s, int32_t id) {
    char *t = s->tok ? tok_decode(s->tok, &id, 1, 0, NULL, NULL, 0) : NULL;
    if (!t) {
        t = kiln_malloc(32);
        snprintf(t, 32, "token_id:%d", id);
    }
    return t;
}

static cJSON *bytes_of(const char *t) {
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)t; *p; p++) cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

static void add_logprob(struct job *j, struct choice *c, const struct kiln_event *ev) {
    if (!c->lp) c->lp = new_lp(j);
    char *t = token_text(j->s, ev->id);
    if (j->p.chat) {
        cJSON *e = cJSON_CreateObject(), *top = cJSON_CreateArray();
        cJSON_AddStringToObject(e, "token", t);
        cJSON_AddNumberToObject(e, "logprob", ev->logprob);
        cJSON_AddItemToObject(e, "bytes", bytes_of(t));
        for (int k = 0; k < ev->n_top; k++) {
            char *tt = token_text(j->s, ev->top_id[k]);
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "token", tt);
            cJSON_AddNumberToObject(x, "logprob", ev->top_logprob[k]);
            cJSON_AddItemToObject(x, "bytes", bytes_of(tt));
            cJSON_AddItemToArray(top, x);
            free(tt);
        }
        cJSON_AddItemToObject(e, "top_logprobs", top);
        cJSON_AddItemToArray(c->lp, e);
    } else {
        cJSON_AddItemToArray(cJSON_GetObjectItem(c->lp, "tokens"), cJSON_CreateString(t));
        cJSON_AddItemToArray(cJSON_GetObjectItem(c->lp, "token_logprobs"), cJSON_CreateNumber(ev->logprob));
        cJSON *top = cJSON_CreateObject();
        for (int k = 0; k < ev->n_top; k++) {
            char *tt = token_text(j->s, ev->top_id[k]);
            if (!cJSON_GetObjectItemCaseSensitive(top, tt)) cJSON_AddNumberToObject(top, tt, ev->top_logprob[k]);
            free(tt);
        }
        cJSON_AddItemToArray(cJSON_GetObjectItem(c->lp, "top_logprobs"), top);
        cJSON_AddItemToArray(cJSON_GetObjectItem(c->lp, "text_offset"), cJSON_CreateNumber(c->text_offset));
    }
    free(t);
}

/* released text -> <think> splitter -> tool parser -> the choice's deltas */
static void deliver(struct job *j, struct choice *c, const char *text, size_t n, int final) {
    struct strbuf *dt = &c->d_text, *dr = &c->d_reason, content = {0};
    struct strbuf *to = j->p.tools ? &content : dt;
    size_t t0 = dt->n;
    if (j->p.think) {
        think_feed(&c->think, text, n, dr, to);
        if (final) think_flush(&c->think, dr, to);
    } else {
        sb_put(to, text, n);
    }
    if (j->p.tools) {
        tool_feed(&c->tools, sb_str(&content), content.n, dt);
        if (final) tool_flush(&c->tools, dt);
        sb_free(&content);
    }
    c->text_offset += (int)(dt->n - t0);
}

static int is_stop_id(const struct gen_params *p, int32_t id) {
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == id) return 1;
    return 0;
}

/* {"index"?, "id", "type": "function", "function": {"name", "arguments"}};
 * index only in stream deltas */
static cJSON *tool_call_json(struct openai_server *s, const struct tool_call *tc, int index) {
    cJSON *o = cJSON_CreateObject(), *f;
    char id[32];
    uint64_t x = (uint64_t)atomic_fetch_add(&s->next_id, 1) * 0x9e3779b97f4a7c15ull;
    x ^= x >> 31;
    snprintf(id, sizeof id, "call_%016llx%08x", (unsigned long long)x, (unsigned)(x * 0xbf58476d1ce4e5b9ull >> 32));
    if (index >= 0) cJSON_AddNumberToObject(o, "index", index);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "type", "function");
    f = cJSON_AddObjectToObject(o, "function");
    cJSON_AddStringToObject(f, "name", tc->name);
    cJSON_AddStringToObject(f, "arguments", tc->arguments);
    return o;
}

static const char *finish_name(int f) {
    return f == KILN_FINISH_STOP ? "stop" : f == KILN_FINISH_LENGTH ? "length" : f == KILN_FINISH_ABORT ? "abort" : "error";
}

/* The choice ends for the client: release what is held back. */
static void close_choice(struct job *j, struct choice *c, const char *finish) {
    struct strbuf rel = {0};
    if (c->ts) {
        char *out = NULL;
        size_t len = 0;
        if (tok_stream_flush(c->ts, &out, &len) == 0 && len) stop_feed(&c->stop, out, len, &rel);
        free(out);
    }
    if (!c->stop.hit) stop_flush(&c->stop, &rel);
    deliver(j, c, sb_str(&rel), rel.n, 1);
    sb_free(&rel);
    c->client_done = 1;
    int called = c->tools.n_calls > 0 && (!strcmp(finish, "stop") || !strcmp(finish, "length"));
    c->finish = called ? "tool_calls" : finish;
}

/* Applies one engine event to its choice; new text lands in the deltas. */
static void job_event(struct job *j, const struct kiln_event *ev) {
    if (ev->tag < 0 || ev->tag >= j->n_choices) return;
    struct choice *c = &j->c[ev->tag];
    if (ev->type == KILN_EVENT_FINISH) {
        c->engine_done = 1;
        j->n_engine_done++;
        c->n_cached = ev->n_cached;
        if (ev->finish == KILN_FINISH_ERROR) {
            c->error = j->error = 1;
            snprintf(c->err, sizeof c->err, "%s", ev->err);
        }
        if (!c->client_done) close_choice(j, c, finish_name(ev->finish));
        return;
    }
    if (c->client_done) return; /* after a stop string: the engine is being cancelled */
    c->n_tokens++;
    if (j->p.think && !c->think_done) { /* counted by token id, both tags included */
        if (ev->id == j->s->think_open) c->in_think = 1;
        if (c->in_think) c->n_reason++;
        if (ev->id == j->s->think_close) c->in_think = 0, c->think_done = 1;
    }
    if (j->p.logprobs >= 0) add_logprob(j, c, ev);
    if (is_stop_id(&j->p, ev->id)) return; /* it ended the request; like EOS, its text is not returned */
    struct strbuf rel = {0};
    int hit = 0;
    if (c->ts) {
        char *out = NULL;
        size_t len = 0;
        if (tok_stream_push(c->ts, ev->id, &out, &len) == 0 && len) {
            if (c->n_tokens > j->p.min_tokens) hit = stop_feed(&c->stop, out, len, &rel);
            else sb_put(&rel, out, len);
        }
        free(out);
    }
    deliver(j, c, sb_str(&rel), rel.n, 0);
    sb_free(&rel);
    if (hit) {
        close_choice(j, c, "stop");
        kiln_request_cancel(c->req);
    }
}

/* Each prompt counts once (not once per choice), as does its cache hit:
 * the best of its choices'. */
static cJSON *usage_json(const struct job *j) {
    int gen = 0, prompt = 0, cached = 0, reason = 0;
    for (int i = 0; i < j->n_choices; i++) gen += j->c[i].n_tokens, reason += j->c[i].n_reason;
    for (int q = 0; q < j->p.n_prompts; q++) {
        int best = 0;
        for (int k = 0; k < j->p.n; k++) best = j->c[q * j->p.n + k].n_cached > best ? j->c[q * j->p.n + k].n_cached : best;
        prompt += j->p.prompts[q].n;
        cached += best;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", gen);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + gen);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", cached);
    if (j->p.think) /* a thinking model's chat: how many of the completion tokens were reasoning */
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "completion_tokens_details"), "reasoning_tokens", reason);
    return u;
}

static cJSON *chunk_base(const struct job *j) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", j->p.chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->s->model_name);
    return o;
}

static void sse(struct job *j, cJSON *o) {
    char *t = cJSON_PrintUnformatted(o);
    sb_printf(&j->out, "data: %s\n\n", t);
    free(t);
    cJSON_Delete(o);
}

/* Streams whatever choice i has new: text, reasoning, tool calls,
 * logprobs, finish. */
static void emit_chunk(struct job *j, int i, int role) {
    struct choice *c = &j->c[i];
    int has_lp = c->lp && (j->p.chat ? cJSON_GetArraySize(c->lp) : cJSON_GetArraySize(cJSON_GetObjectItem(c->lp, "tokens")));
    int finish = c->client_done && c->finish, calls = c->tools.n_calls > c->calls_sent;
    if (!role && !c->d_text.n && !c->d_reason.n && !has_lp && !finish && !calls) return;
    cJSON *o = chunk_base(j), *arr = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", i);
    if (j->p.chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (c->d_reason.n) cJSON_AddStringToObject(d, "reasoning_content", sb_str(&c->d_reason));
        if (c->d_text.n || role) cJSON_AddStringToObject(d, "content", sb_str(&c->d_text));
        if (calls) {
            cJSON *a = cJSON_AddArrayToObject(d, "tool_calls");
            for (; c->calls_sent < c->tools.n_calls; c->calls_sent++)
                cJSON_AddItemToArray(a, tool_call_json(j->s, &c->tools.calls[c->calls_sent], c->calls_sent));
        }
    } else {
        cJSON_AddStringToObject(ch, "text", sb_str(&c->d_text));
    }
    if (has_lp) {
        if (j->p.chat) {
            cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
            cJSON_AddItemToObject(l, "content", c->lp);
        } else {
            cJSON_AddItemToObject(ch, "logprobs", c->lp);
        }
        c->lp = NULL;
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", c->finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(arr, ch);
    if (j->p.continuous_usage) cJSON_AddItemToObject(o, "usage", usage_json(j));
    else if (j->p.include_usage) cJSON_AddNullToObject(o, "usage");
    sse(j, o);
    sb_clear(&c->d_text);
    sb_clear(&c->d_reason);
    if (finish) c->finish = NULL; /* sent */
}

static void emit_error(struct job *j) {
    const char *msg = "generation failed";
    for (int i = 0; i < j->n_choices; i++)
        if (j->c[i].error) msg = j->c[i].err;
    cJSON *e = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(e, "error");
    cJSON_AddStringToObject(o, "message", msg);
    cJSON_AddStringToObject(o, "type", "server_error");
    cJSON_AddNumberToObject(o, "code", 500);
    sse(j, e);
}

static ssize_t job_stream(void *cls, char *buf, size_t max) {
    struct job *j = cls;
    while (j->out_off == j->out.n) {
        sb_clear(&j->out);
        j->out_off = 0;
        if (j->stream_over) return 0;
        if (j->n_engine_done == j->n_choices) {
            if (j->error) emit_error(j);
            if (j->p.include_usage) {
                cJSON *o = chunk_base(j);
                cJSON_AddArrayToObject(o, "choices");
                cJSON_AddItemToObject(o, "usage", usage_json(j));
                sse(j, o);
            }
            sb_puts(&j->out, "data: [DONE]\n\n");
            j->stream_over = 1;
            continue;
        }
        struct kiln_event ev;
        if (kiln_channel_next(j->ch, &ev, 0.25)) {
            job_event(j, &ev);
            emit_chunk(j, ev.tag, 0);
        } else if (http_client_gone(j->fd)) {
            return -1; /* MHD closes; job_stream_free cancels the requests */
        }
    }
    size_t n = j->out.n - j->out_off < max ? j->out.n - j->out_off : max;
    memcpy(buf, j->out.p + j->out_off, n);
    j->out_off += n;
    return (ssize_t)n;
}

static void job_stream_free(void *cls) { job_free(cls); }

/* echo: prompt q as text, the string the client sent or its token ids
 * decoded (special tokens kept); malloc'd */
static char *echo_text(const struct job *j, int q) {
    const struct prompt *pr = &j->p.prompts[q];
    if (pr->text) return kiln_strdup(pr->text);
    char *t = j->s->tok ? tok_decode(j->s->tok, pr->ids, pr->n, 0, NULL, NULL, 0) : NULL;
    return t ? t : kiln_strdup("");
}

static cJSON *final_response(struct job *j) {
    cJSON *o = cJSON_CreateObject(), *arr;
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", j->p.chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->s->model_name);
    arr = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < j->n_choices; i++) {
        struct choice *c = &j->c[i];
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", i);
        if (j->p.chat) {
            cJSON *m = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            if (c->tools.n_calls && !c->text.n) cJSON_AddNullToObject(m, "content");
            else cJSON_AddStringToObject(m, "content", sb_str(&c->text));
            if (c->reasoning.n) cJSON_AddStringToObject(m, "reasoning_content", sb_str(&c->reasoning));
            if (c->tools.n_calls) {
                cJSON *a = cJSON_AddArrayToObject(m, "tool_calls");
                for (int k = 0; k < c->tools.n_calls; k++) cJSON_AddItemToArray(a, tool_call_json(j->s, &c->tools.calls[k], -1));
            }
        } else {
            cJSON_AddStringToObject(ch, "text", sb_str(&c->text));
        }
        if (c->lp && j->p.chat) {
            cJSON *l = cJSON_AddObjectToObject(ch, "logprobs");
            cJSON_AddItemToObject(l, "content", c->lp);
            c->lp = NULL;
        } else if (c->lp) {
            cJSON_AddItemToObject(ch, "logprobs", c->lp);
            c->lp = NULL;
        } else if (j->p.logprobs >= 0) {
            cJSON_AddItemToObject(ch, "logprobs", new_lp(j));
        } else {
            cJSON_AddNullToObject(ch, "logprobs");
        }
        cJSON_AddStringToObject(ch, "finish_reason", c->finish ? c->finish : "abort");
        cJSON_AddItemToArray(arr, ch);
    }
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    return o;
}

static void handle_generate(struct openai_server *s, const struct http_request *rq, struct http_response *rs, int chat) {
    /* a prompt of token ids is read by the JSON scanner, the rest by cJSON */
    int32_t *ids = NULL;
    int n_ids = 0;
    char *copy = NULL;
    if (!chat) {
        copy = kiln_malloc(rq->body_len + 1);
        memcpy(copy, rq->body, rq->body_len + 1);
        if (!params_scan_prompt_ids(copy, rq->body_len, &ids, &n_ids)) free(copy), copy = NULL;
    }
    cJSON *req = cJSON_ParseWithLength(copy ? copy : rq->body, rq->body_len);
    free(copy);
    if (!req) {
        free(ids);
        return reply_error(rs, 400, NULL, "the body is not valid JSON");
    }
    struct job *j = kiln_calloc(1, sizeof *j);
    j->s = s;
    j->fd = rq->fd;
    struct param_error pe;
    int rc = ids ? params_parse_ids(&s->pc, req, ids, n_ids, &j->p, &pe) : params_parse(&s->pc, req, chat, &j->p, &pe);
    cJSON_Delete(req);
    if (rc) {
        reply_error(rs, 400, pe.param, "%s", pe.msg);
        params_free(&j->p);
        free(j);
        return;
    }
    if (!j->p.seed_set)
        j->p.sp.seed = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)atomic_fetch_add(&s->next_id, 1) * 0x9e3779b97f4a7c15ull;
    j->n_choices = j->p.n_prompts * j->p.n;
    snprintf(j->id, sizeof j->id, "%s-%016llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)atomic_fetch_add(&s->next_id, 1) * 0x9e3779b97f4a7c15ull);
    j->created = (long)time(NULL);
    j->ch = kiln_channel_new();
    j->c = kiln_calloc((size_t)j->n_choices, sizeof *j->c);
    for (int i = 0; i < j->n_choices; i++) {
        struct choice *c = &j->c[i];
        c->prompt = i / j->p.n;
        c->ts = s->tok ? tok_stream_new(s->tok, 1) : NULL;
        stop_init(&c->stop, (const char *const *)j->p.stops, j->p.n_stops);
        think_init(&c->think, j->p.think_in_reasoning);
        c->in_think = j->p.think_in_reasoning;
        tool_init(&c->tools);
        if (j->p.echo) { /* the prompt goes first: the first chunk when streaming, else the head of the text */
            char *pre = echo_text(j, c->prompt);
            sb_puts(&c->d_text, pre);
            free(pre);
        }
    }
    int limit = kiln_serving_max_tokens(s->srv);
    for (int i = 0; i < j->n_choices; i++) {
        const struct prompt *q = &j->p.prompts[j->c[i].prompt];
        struct kiln_request_params kp = {.prompt = q->ids, .n_prompt = q->n,
                                         .max_tokens = j->p.max_tokens > 0 ? j->p.max_tokens : limit - q->n,
                                         .min_tokens = j->p.min_tokens, .ignore_eos = j->p.ignore_eos,
                                         .logprobs = j->p.logprobs >= 0 ? j->p.top_logprobs : -1, .sampling = j->p.sp,
                                         .stop_ids = j->p.stop_ids, .n_stop_ids = j->p.n_stop_ids,
                                         .json = j->p.json ? s->jv : NULL};
        kp.sampling.seed = j->p.sp.seed + (uint64_t)(i % j->p.n); /* sample k of every prompt: seed + k */
        char err[512] = "";
        rc = kiln_serving_submit(s->srv, &kp, j->ch, i, &j->c[i].req, err, sizeof err);
        if (rc) {
            if (rc == KILN_EFULL) {
                reply_error(rs, 503, NULL, "%s", err);
                rs->retry_after = 1;
            } else {
                reply_error(rs, 400, chat ? "messages" : "prompt", "%s", err);
            }
            job_free(j);
            return;
        }
    }
    if (j->p.stream) {
        if (chat)
            for (int i = 0; i < j->n_choices; i++) emit_chunk(j, i, 1);
        else if (j->p.echo) /* each choice's first chunk is its prompt, already in its delta */
            for (int i = 0; i < j->n_choices; i++) emit_chunk(j, i, 0);
        rs->status = 200;
        rs->stream = job_stream;
        rs->stream_free = job_stream_free;
        rs->cls = j;
        return;
    }
    /* wait for every choice, watching the client (tokens may arrive
     * faster than the timeout, so the check goes by the clock) */
    double next_check = kiln_now() + 0.2;
    int cancelled = 0;
    while (j->n_engine_done < j->n_choices) {
        struct kiln_event ev;
        if (!cancelled && kiln_now() >= next_check) {
            next_check = kiln_now() + 0.2;
            if (http_client_gone(j->fd)) {
                for (int i = 0; i < j->n_choices; i++) kiln_request_cancel(j->c[i].req);
                cancelled = 1;
            }
        }
        if (kiln_channel_next(j->ch, &ev, 0.2)) {
            job_event(j, &ev);
            struct choice *c = &j->c[ev.tag < 0 || ev.tag >= j->n_choices ? 0 : ev.tag];
            sb_put(&c->text, sb_str(&c->d_text), c->d_text.n);
            sb_put(&c->reasoning, sb_str(&c->d_reason), c->d_reason.n);
            sb_clear(&c->d_text);
            sb_clear(&c->d_reason);
        }
    }
    if (j->error) {
        const char *msg = "generation failed";
        for (int i = 0; i < j->n_choices; i++)
            if (j->c[i].error) msg = j->c[i].err;
        reply_error(rs, 500, NULL, "%s", msg);
    } else {
        reply_json(rs, 200, final_response(j));
    }
    job_free(j);
}

/* ==== other routes ==== */

static cJSON *model_json(struct openai_server *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "kiln");
    cJSON_AddNumberToObject(m, "max_model_len", kiln_serving_max_tokens(s->srv));
    return m;
}

static void handle_models(struct openai_server *s, struct http_response *rs) {
    cJSON *o = cJSON_CreateObject(), *d = cJSON_AddArrayToObject(o, "data");
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToArray(d, model_json(s));
    reply_json(rs, 200, o);
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* GET /v1/models/ID (the client's models.retrieve): ID percent-decoded, so
 * "Qwen/Qwen3-8B" matches sent raw or as Qwen%2FQwen3-8B */
static void handle_model(struct openai_server *s, const char *id, struct http_response *rs) {
    char dec[256];
    size_t k = 0;
    for (const char *p = id; *p && k + 1 < sizeof dec; p++) {
        int hi, lo;
        if (p[0] == '%' && (hi = hexval(p[1])) >= 0 && (lo = hexval(p[2])) >= 0) dec[k++] = (char)(hi * 16 + lo), p += 2;
        else dec[k++] = *p;
    }
    dec[k] = 0;
    if (strcmp(dec, s->model_name)) {
        reply_error(rs, 404, "model", "The model '%s' does not exist; this server serves '%s'", dec, s->model_name);
        return;
    }
    reply_json(rs, 200, model_json(s));
}

static void handle_health(struct openai_server *s, struct http_response *rs) {
    char err[256] = "";
    double t0 = kiln_now();
    cJSON *o = cJSON_CreateObject();
    if (kiln_serving_canary(s->srv, s->o.health_timeout, err, sizeof err)) {
        cJSON_AddStringToObject(o, "status", "unhealthy");
        cJSON_AddStringToObject(o, "message", err);
        reply_json(rs, 503, o);
        rs->retry_after = 5;
        return;
    }
    cJSON_AddStringToObject(o, "status", "ok");
    cJSON_AddNumberToObject(o, "canary_seconds", kiln_now() - t0);
    reply_json(rs, 200, o);
}

static void metric(struct strbuf *b, const char *name, const char *type, const char *help, double v) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static void histogram(struct strbuf *b, const char *name, const char *help, const struct kiln_histogram *h) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < h->n_bounds; i++) sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)h->counts[i]);
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)h->counts[h->n_bounds], name,
              h->sum, name, (unsigned long long)h->count);
}

static void handle_metrics(struct openai_server *s, struct http_response *rs) {
    struct kiln_serving_stats st;
    kiln_serving_stats(s->srv, &st);
    struct strbuf b = {0};
    static const char *fin[] = {"none", "stop", "length", "abort", "error"};
    sb_puts(&b, "# HELP kiln_requests_total Engine requests finished (one per choice), by finish reason.\n"
                "# TYPE kiln_requests_total counter\n");
    for (int i = 1; i < 5; i++) sb_printf(&b, "kiln_requests_total{finish=\"%s\"} %llu\n", fin[i], (unsigned long long)st.requests_finished[i]);
    static const char *codes[] = {"2xx", "400", "401", "404", "413", "5xx"};
    sb_puts(&b, "# HELP kiln_http_requests_total HTTP requests answered, by status.\n# TYPE kiln_http_requests_total counter\n");
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < 6; i++) sb_printf(&b, "kiln_http_requests_total{code=\"%s\"} %llu\n", codes[i], (unsigned long long)s->http_by_code[i]);
    pthread_mutex_unlock(&s->mu);
    metric(&b, "kiln_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", (double)st.prompt_tokens);
    metric(&b, "kiln_generation_tokens_total", "counter", "Tokens generated.", (double)st.generation_tokens);
    metric(&b, "kiln_prompt_tokens_cached_total", "counter", "Prompt tokens served from the prefix cache.", (double)st.cached_prompt_tokens);
    metric(&b, "kiln_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", (double)st.prefix_query_tokens);
    metric(&b, "kiln_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", (double)st.prefix_hit_tokens);
    metric(&b, "kiln_prefix_cache_hit_rate", "gauge", "hits / queries since start.",
           st.prefix_query_tokens ? (double)st.prefix_hit_tokens / (double)st.prefix_query_tokens : 0.0);
    metric(&b, "kiln_num_requests_running", "gauge", "Requests in the running batch.", st.running);
    metric(&b, "kiln_num_requests_waiting", "gauge", "Requests waiting for admission.", st.waiting);
    metric(&b, "kiln_kv_pages_total", "gauge", "KV cache pages in the pool.", st.kv_pages_total);
    metric(&b, "kiln_kv_pages_used", "gauge", "KV pages not on the free list (requests + prefix cache).", st.kv_pages_total - st.kv_pages_free);
    metric(&b, "kiln_kv_pages_cached", "gauge", "KV pages held by the prefix cache.", st.kv_pages_cached);
    metric(&b, "kiln_kv_pages_evictable", "gauge", "Prefix-cache pages no request uses (freed on demand).", st.kv_pages_evictable);
    metric(&b, "kiln_kv_pages_held", "gauge", "KV pages used by requests (used minus evictable); 0 when idle.",
           st.kv_pages_total - st.kv_pages_free - st.kv_pages_evictable);
    metric(&b, "kiln_kv_page_size_tokens", "gauge", "Tokens per KV page.", st.page_size);
    metric(&b, "kiln_preemptions_total", "counter", "Requests preempted for lack of KV pages (recomputed later).", (double)st.preemptions);
    metric(&b, "kiln_engine_steps_total", "counter", "Engine loop iterations.", (double)st.steps);
    histogram(&b, "kiln_time_to_first_token_seconds", "Submit to first sampled token.", &st.ttft);
    histogram(&b, "kiln_time_per_output_token_seconds", "Per request: (last - first token time) / (tokens - 1).", &st.tpot);
    histogram(&b, "kiln_e2e_request_latency_seconds", "Submit to finish.", &st.e2e);
    rs->status = 200;
    rs->content_type = "text/plain; version=0.0.4";
    rs->body = b.p ? b.p : kiln_strdup("");
    rs->body_len = b.n;
}

static void handle_tokenize(struct openai_server *s, const struct http_request *rq, struct http_response *rs) {
    cJSON *req = cJSON_ParseWithLength(rq->body, rq->body_len);
    if (!req) return reply_error(rs, 400, NULL, "the body is not valid JSON");
    struct gen_params p;
    struct param_error pe;
    int rc = params_tokenize(&s->pc, req, &p, &pe);
    cJSON_Delete(req);
    if (rc) {
        reply_error(rs, 400, pe.param, "%s", pe.msg);
        return params_free(&p);
    }
    const struct prompt *q = &p.prompts[0];
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "tokens");
    for (int i = 0; i < q->n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(q->ids[i]));
    cJSON_AddNumberToObject(o, "count", q->n);
    cJSON_AddNumberToObject(o, "max_model_len", kiln_serving_max_tokens(s->srv));
    params_free(&p);
    reply_json(rs, 200, o);
}

static void handle_detokenize(struct openai_server *s, const struct http_request *rq, struct http_response *rs) {
    cJSON *req = cJSON_ParseWithLength(rq->body, rq->body_len);
    if (!req) return reply_error(rs, 400, NULL, "the body is not valid JSON");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(req, "tokens");
    int32_t *ids = NULL;
    int n = 0;
    if (!cJSON_IsArray(t)) {
        cJSON_Delete(req);
        return reply_error(rs, 400, "tokens", "'tokens' must be an array of token ids");
    }
    struct param_error pe;
    int rc = params_ids(&s->pc, t, "tokens", &ids, &n, &pe);
    cJSON_Delete(req);
    if (rc) return reply_error(rs, 400, pe.param, "%s", pe.msg);
    if (!s->tok) {
        free(ids);
        return reply_error(rs, 400, "tokens", "this model has no tokenizer");
    }
    char err[256] = "";
    char *text = tok_decode(s->tok, ids, n, 0, NULL, err, sizeof err);
    free(ids);
    if (!text) return reply_error(rs, 400, "tokens", "%s", err);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", text);
    free(text);
    reply_json(rs, 200, o);
}

/* ==== dispatch ==== */

static int authorized(const struct openai_server *s, const char *h) {
    if (!s->o.api_key || !s->o.api_key[0]) return 1;
    if (!h || strncmp(h, "Bearer ", 7)) return 0;
    const char *k = h + 7, *want = s->o.api_key;
    size_t a = strlen(k), b = strlen(want);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(i < a ? k[i] : 0);
    return diff == 0;
}

static void route(void *ctx, const struct http_request *rq, struct http_response *rs) {
    struct openai_server *s = ctx;
    char path[256];
    size_t pl = strcspn(rq->url, "?");
    snprintf(path, sizeof path, "%.*s", (int)(pl < sizeof path ? pl : sizeof path - 1), rq->url);
    int get = !strcmp(rq->method, "GET"), post = !strcmp(rq->method, "POST");
    int open_route = !strcmp(path, "/health") || !strcmp(path, "/metrics");
    if (!open_route && !authorized(s, rq->authorization)) {
        reply_error(rs, 401, NULL, "Incorrect API key provided: send 'Authorization: Bearer KEY'");
        rs->www_authenticate = 1;
    } else if (!strcmp(path, "/v1/chat/completions") && post) {
        handle_generate(s, rq, rs, 1);
    } else if (!strcmp(path, "/v1/completions") && post) {
        handle_generate(s, rq, rs, 0);
    } else if (!strcmp(path, "/v1/models") && get) {
        handle_models(s, rs);
    } else if (!strncmp(path, "/v1/models/", 11) && path[11] && get) {
        handle_model(s, path + 11, rs);
    } else if (!strcmp(path, "/health") && get) {
        handle_health(s, rs);
    } else if (!strcmp(path, "/metrics") && get) {
        handle_metrics(s, rs);
    } else if (!strcmp(path, "/tokenize") && post) {
        handle_tokenize(s, rq, rs);
    } else if (!strcmp(path, "/detokenize") && post) {
        handle_detokenize(s, rq, rs);
    } else if (!strcmp(path, "/flush_cache") && post) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "freed_pages", kiln_serving_flush_cache(s->srv));
        reply_json(rs, 200, o);
    } else {
        static const char *known[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/tokenize",
                                      "/detokenize", "/flush_cache", NULL};
        int k = 0;
        while (known[k] && strcmp(known[k], path)) k++;
        if (known[k]) reply_error(rs, 405, NULL, "%s does not accept %s", path, rq->method);
        else reply_error(rs, 404, NULL, "no route %s %s", rq->method, path);
    }
    count_status(s, rs->status);
}

/* The bytes a token adds to the output text (json_vocab's view); NULL for
 * special tokens (skipped when decoding, so never part of the JSON). */
static const uint8_t *token_bytes(void *ctx, int32_t id, size_t *len) {
    const struct kiln_tokenizer *t = ctx;
    if (id >= tok_vocab_size(t) || tok_is_special(t, id)) return NULL;
    return tok_id_bytes(t, id, len);
}

struct openai_server *openai_start(kiln_engine *e, kiln_serving *srv, struct kiln_tokenizer *tok, const struct openai_opts *o,
                                   char *err, size_t errlen) {
    struct openai_server *s = kiln_calloc(1, sizeof *s);
    s->e = e;
    s->srv = srv;
    s->tok = tok;
    s->think_open = tok ? tok_token_id(tok, "<think>") : -1;
    s->think_close = tok ? tok_token_id(tok, "</think>") : -1;
    s->o = *o;
    if (s->o.health_timeout <= 0) s->o.health_timeout = 60;
    s->model_name = kiln_strdup(o->model_name ? o->model_name : "kiln");
    s->created = (long)time(NULL);
    atomic_init(&s->next_id, (unsigned long)s->created);
    const struct kiln_config *cfg = kiln_engine_config(e);
    s->pc = (struct params_ctx){.tok = tok, .model_name = s->model_name, .vocab = cfg->vocab, .max_len = kiln_serving_max_tokens(srv),
                                .has_think = tok && tok_token_id(tok, "<think>") >= 0 && tok_token_id(tok, "</think>") >= 0};
    if (tok) s->jv = json_vocab_new(cfg->vocab, token_bytes, tok, cfg->eos, cfg->n_eos < KILN_MAX_EOS ? cfg->n_eos : KILN_MAX_EOS);
    pthread_mutex_init(&s->mu, NULL);
    s->http = http_start(o->host, o->port, o->max_body, route, s, err, errlen);
    if (!s->http) {
        openai_stop(s);
        return NULL;
    }
    return s;
}

void openai_stop(struct openai_server *s) {
    if (!s) return;
    http_stop(s->http);
    json_vocab_free(s->jv);
    pthread_mutex_destroy(&s->mu);
    free(s->model_name);
    free(s);
}
