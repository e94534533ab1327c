/*
 * serve_engine.c: the thread-safe request API of kiln.h (kiln_serving_*):
 * one engine thread owns the backend and loops
 *
 *     take new requests and cancellations -> sched_schedule -> model_forward
 *     -> sample each finished row -> sched_commit -> post events
 *
 * while any number of other threads submit requests and wait on their
 * channels. Text never appears here: detokenizing, stop strings and the
 * reasoning split are the server's (src/server/), which cancels a request
 * once a stop string matched. (The JSON constraint sees token bytes, through
 * a table the server built from its tokenizer.)
 *
 * Locking: `mu` guards the inbox, the stop/flush flags and the statistics;
 * each channel has its own mutex. The scheduler, the radix cache and the
 * KV pool are touched by the engine thread only. A request is shared by
 * its submitter and the engine (refs = 2); cancellation is an atomic flag
 * the engine polls before every step.
 */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "base/base.h"
#include "engine/engine_internal.h"
#include "engine/radix.h"
#include "engine/sched.h"
#include "kiln.h"

struct kiln_channel {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct kiln_event *q; /* ring of cap events */
    int head, n, cap;
    int refs; /* the submitter + one per request posting here */
};

struct kiln_request {
    struct sched_req sr;
    struct kiln_sampler smp;
    int32_t *stop_ids; /* stop token ids */
    int n_stop_ids;
    const struct json_vocab *json; /* the JSON constraint, or NULL */
    struct json_fsm fsm;           /* its state after the tokens sampled so far */
    kiln_channel *ch;
    int tag, min_tokens, logprobs, canary, finished;
    atomic_int cancel, refs;
    double t_submit, t_first, t_last;
    int n_gen;
};

struct kiln_serving {
    kiln_engine *e;
    struct kiln_serving_opts o;
    struct radix cache;
    struct sched sched;
    struct sched_batch batch;
    int32_t eos[KILN_MAX_EOS];
    int max_tokens; /* prompt + max_tokens limit: min(context, pool) */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv, flush_cv;
    kiln_request **inbox;
    int n_inbox, cap_inbox, stop, started;
    int omp_threads; /* the CPU backend's thread count, as set on the opening thread */
    int flush_req, flush_freed;
    uint64_t flush_gen;
    struct kiln_serving_stats st;
    /* engine thread only */
    kiln_request **live;
    int n_live, cap_live;
    float *logits, *row_copy;
    int32_t *sampled;
    int32_t *argmax; /* [cap_out] the device's argmax of each out row */
    uint8_t *full;   /* [cap_out] whether the row's logits are copied out (else its argmax is the token) */
    int cap_out;
};

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160};
static const double tpot_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40};
static const double e2e_bounds[] = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 240, 480, 960, 1920, 3600, 7200, 14400};

static void hist_init(struct kiln_histogram *h, const double *b, int n) {
    memset(h, 0, sizeof *h);
    h->n_bounds = n;
    memcpy(h->bounds, b, sizeof(double) * (size_t)n);
}

static void hist_add(struct kiln_histogram *h, double v) {
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    for (; i <= h->n_bounds; i++) h->counts[i]++; /* cumulative */
    h->sum += v;
    h->count++;
}

/* ==== channels ==== */

kiln_channel *kiln_channel_new(void) {
    kiln_channel *c = kiln_calloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->refs = 1;
    return c;
}

static void channel_unref(kiln_channel *c) {
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left) return;
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->q);
    free(c);
}

void kiln_channel_release(kiln_channel *c) {
    if (c) channel_unref(c);
}

static void channel_post(kiln_channel *c, const struct kiln_event *ev) {
    pthread_mutex_lock(&c->mu);
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 16;
        struct kiln_event *q = kiln_malloc(sizeof *q * (size_t)cap);
        for (int i = 0; i < c->n; i++) q[i] = c->q[(c->head + i) % c->cap];
        free(c->q);
        c->q = q, c->cap = cap, c->head = 0;
    }
    c->q[(c->head + c->n++) % c->cap] = *ev;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

int kiln_channel_next(kiln_channel *c, struct kiln_event *ev, double timeout_s) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_s > 0) {
        double t = dl.tv_sec + dl.tv_nsec * 1e-9 + timeout_s;
        dl.tv_sec = (time_t)t;
        dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
    }
    pthread_mutex_lock(&c->mu);
    while (c->n == 0) {
        if (timeout_s == 0) break;
        if (timeout_s < 0) pthread_cond_wait(&c->cv, &c->mu);
        else if (pthread_cond_timedwait(&c->cv, &c->mu, &dl)) break;
    }
    int got = c->n > 0;
    if (got) {
        *ev = c->q[c->head];
        c->head = (c->head + 1) % c->cap;
        c->n--;
    }
    pthread_mutex_unlock(&c->mu);
    return got;
}

/* ==== requests ==== */

static void request_unref(kiln_request *r) {
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    sched_req_free(&r->sr);
    sampler_free(&r->smp);
    free(r->stop_ids);
    channel_unref(r->ch);
    free(r);
}

void kiln_request_cancel(kiln_request *r) {
    if (r) atomic_store(&r->cancel, 1);
}

void kiln_request_release(kiln_request *r) {
    if (!r) return;
    atomic_store(&r->cancel, 1);
    request_unref(r);
}

/* ==== the engine thread ==== */

static void live_add(kiln_serving *s, kiln_request *r) {
    if (s->n_live == s->cap_live) {
        s->cap_live = s->cap_live ? s->cap_live * 2 : 64;
        s->live = kiln_realloc(s->live, sizeof *s->live * (size_t)s->cap_live);
    }
    s->live[s->n_live++] = r;
}

/* Posts r's finish event, records its statistics and drops the engine's
 * reference. r's pages were released by the scheduler already. */
static void finish_request(kiln_serving *s, kiln_request *r, int finish, const char *err) {
    if (r->finished) return;
    r->finished = 1;
    struct kiln_event ev = {.type = KILN_EVENT_FINISH, .tag = r->tag, .finish = finish, .n_prompt = r->sr.n_prompt,
                            .n_cached = r->sr.n_cached, .n_generated = r->n_gen};
    if (err) snprintf(ev.err, sizeof ev.err, "%s", err);
    channel_post(r->ch, &ev);
    if (!r->canary) {
        double now = kiln_now();
        pthread_mutex_lock(&s->mu);
        s->st.requests_finished[finish]++;
        s->st.prompt_tokens += (uint64_t)r->sr.n_prompt;
        s->st.cached_prompt_tokens += (uint64_t)r->sr.n_cached;
        s->st.generation_tokens += (uint64_t)r->n_gen;
        if (r->n_gen > 0) hist_add(&s->st.ttft, r->t_first - r->t_submit);
        if (r->n_gen > 1) hist_add(&s->st.tpot, (r->t_last - r->t_first) / (r->n_gen - 1));
        hist_add(&s->st.e2e, now - r->t_submit);
        pthread_mutex_unlock(&s->mu);
    }
    for (int i = 0; i < s->n_live; i++)
        if (s->live[i] == r) {
            s->live[i] = s->live[--s->n_live];
            break;
        }
    request_unref(r);
}

static void publish_stats(kiln_serving *s) {
    struct kiln_serving_stats *st = &s->st;
    st->running = s->sched.n_running;
    st->waiting = s->sched.n_waiting;
    st->kv_pages_free = kv_pool_n_free(&s->e->kv);
    st->kv_pages_cached = s->cache.n_pages;
    st->kv_pages_evictable = s->cache.n_evictable;
    st->prefix_query_tokens = s->sched.prefix_query_tokens;
    st->prefix_hit_tokens = s->sched.prefix_hit_tokens;
    st->preemptions = s->sched.n_preemptions;
}

static void grow_out(kiln_serving *s, int n_out) {
    if (n_out <= s->cap_out) return;
    const int V = s->e->model.cfg.vocab;
    s->cap_out = n_out * 2;
    free(s->logits), free(s->sampled), free(s->argmax), free(s->full);
    s->logits = kiln_malloc(sizeof(float) * (size_t)V * s->cap_out);
    s->sampled = kiln_malloc(sizeof(int32_t) * (size_t)s->cap_out);
    s->argmax = kiln_malloc(sizeof(int32_t) * (size_t)s->cap_out);
    s->full = kiln_malloc((size_t)s->cap_out);
}

/* Samples out row j of the step; posts its token event later. Masks come
 * first (EOS and stop ids before min_tokens, the JSON constraint), then the
 * sampler's bias, penalties and draw. Sets stop_now when the token ends
 * the request (a stop id, the JSON object closed). */
/* whether row j's token must be drawn from its logits: anything but a plain
 * greedy pick (masks, bias, penalties, logprobs) needs them */
static int needs_logits(kiln_serving *s, const kiln_request *r) {
    if (!sampler_is_greedy(&r->smp) || r->logprobs >= 0 || r->json) return 1;
    return r->n_gen < r->min_tokens && ((!r->sr.ignore_eos && s->sched.o.n_eos > 0) || r->n_stop_ids > 0);
}

/* row j when its logits were not copied: the device's argmax is the greedy token */
static int32_t take_argmax(kiln_request *r, int32_t tok, struct kiln_event *ev) {
    sampler_accept(&r->smp, tok);
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == tok) r->sr.stop_now = 1;
    *ev = (struct kiln_event){.type = KILN_EVENT_TOKEN, .tag = r->tag, .id = tok};
    return tok;
}

static int32_t sample_row(kiln_serving *s, kiln_request *r, float *l, struct kiln_event *ev) {
    const int V = s->e->model.cfg.vocab;
    if (r->logprobs >= 0) memcpy(s->row_copy, l, sizeof(float) * (size_t)V);
    if (r->n_gen < r->min_tokens) {
        if (!r->sr.ignore_eos)
            for (int i = 0; i < s->sched.o.n_eos; i++) l[s->eos[i]] = -INFINITY;
        for (int i = 0; i < r->n_stop_ids; i++) l[r->stop_ids[i]] = -INFINITY;
    }
    if (r->json) json_vocab_mask(r->json, &r->fsm, l);
    int32_t tok = sampler_sample(&r->smp, l);
    sampler_accept(&r->smp, tok);
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == tok) r->sr.stop_now = 1;
    if (r->json && (json_vocab_accept(r->json, &r->fsm, tok) || json_fsm_done(&r->fsm))) r->sr.stop_now = 1;
    *ev = (struct kiln_event){.type = KILN_EVENT_TOKEN, .tag = r->tag, .id = tok};
    if (r->logprobs >= 0) {
        ev->n_top = r->logprobs;
        ev->logprob = sampler_logprobs(s->row_copy, V, tok, r->logprobs, ev->top_id, ev->top_logprob);
    }
    return tok;
}

static void step(kiln_serving *s) {
    struct sched_batch *b = &s->batch;
    kiln_engine *e = s->e;
    const int V = e->model.cfg.vocab;
    if (sched_schedule(&s->sched, b) == 0) return;
    grow_out(s, b->n_out);
    for (int j = 0; j < b->n_out; j++) s->full[j] = (uint8_t)needs_logits(s, b->reqs[b->out_req[j]]->user);
    struct kiln_batch kb = {.n_tokens = b->n_tokens, .tokens = b->tokens, .pos = b->pos, .n_seqs = b->n, .seqs = b->views,
                            .n_out = b->n_out, .out_rows = b->out_rows, .out_ids = s->argmax, .out_full = s->full};
    char err[256] = "";
    if (model_forward(&e->model, &e->kv.cache, &kb, s->logits, err, sizeof err)) {
        kiln_log(KILN_LOG_ERROR, "serving: forward of %d tokens failed: %s", b->n_tokens, err);
        sched_fail(&s->sched, b);
        for (int i = 0; i < b->n_done; i++) finish_request(s, b->done[i]->user, KILN_FINISH_ERROR, err);
        return;
    }
    struct kiln_event *evs = kiln_malloc(sizeof *evs * (size_t)(b->n_out ? b->n_out : 1));
    double now = kiln_now();
    for (int j = 0; j < b->n_out; j++) {
        kiln_request *r = b->reqs[b->out_req[j]]->user;
        s->sampled[j] = s->full[j] ? sample_row(s, r, s->logits + (size_t)j * V, &evs[j]) : take_argmax(r, s->argmax[j], &evs[j]);
        if (r->n_gen++ == 0) r->t_first = now;
        r->t_last = now;
    }
    sched_commit(&s->sched, b, s->sampled);
    /* publish before posting: a client that saw its finish event then
     * reads statistics that already count its pages as released */
    pthread_mutex_lock(&s->mu);
    publish_stats(s);
    pthread_mutex_unlock(&s->mu);
    for (int j = 0; j < b->n_out; j++) {
        kiln_request *r = b->reqs[b->out_req[j]]->user;
        channel_post(r->ch, &evs[j]);
    }
    free(evs);
    for (int i = 0; i < b->n_done; i++) {
        struct sched_req *sr = b->done[i];
        finish_request(s, sr->user, sr->finish == SCHED_FINISH_STOP ? KILN_FINISH_STOP : KILN_FINISH_LENGTH, NULL);
    }
}

static void *engine_main(void *arg) {
    kiln_serving *s = arg;
    /* OpenMP's thread count is per calling thread: the CPU backend set it
     * on the thread that opened the engine; this thread now calls the
     * kernels, so it needs the same setting (else it gets every core and,
     * on a loaded machine, spinning barriers) */
    omp_set_num_threads(s->omp_threads);
    kiln_request **fresh = NULL;
    int cap_fresh = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stop && s->n_inbox == 0 && !s->flush_req && sched_idle(&s->sched)) pthread_cond_wait(&s->cv, &s->mu);
        if (s->stop) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        int n_fresh = s->n_inbox, flush = s->flush_req;
        if (n_fresh > cap_fresh) {
            cap_fresh = n_fresh * 2;
            fresh = kiln_realloc(fresh, sizeof *fresh * (size_t)cap_fresh);
        }
        memcpy(fresh, s->inbox, sizeof *fresh * (size_t)n_fresh);
        s->n_inbox = 0;
        pthread_mutex_unlock(&s->mu);

        for (int i = 0; i < n_fresh; i++) {
            sched_add(&s->sched, &fresh[i]->sr);
            live_add(s, fresh[i]);
        }
        for (int i = s->n_live - 1; i >= 0; i--) {
            if (i >= s->n_live) continue;
            kiln_request *r = s->live[i];
            if (atomic_load(&r->cancel)) {
                sched_abort(&s->sched, &r->sr);
                finish_request(s, r, KILN_FINISH_ABORT, NULL);
            }
        }
        if (flush) {
            int freed = radix_evict(&s->cache, 1 << 30);
            pthread_mutex_lock(&s->mu);
            s->flush_req = 0;
            s->flush_freed = freed;
            publish_stats(s);
            s->flush_gen++;
            pthread_cond_broadcast(&s->flush_cv);
            pthread_mutex_unlock(&s->mu);
        }
        step(s);
        pthread_mutex_lock(&s->mu);
        s->st.steps++;
        publish_stats(s);
        pthread_mutex_unlock(&s->mu);
    }
    free(fresh);
    return NULL;
}

/* ==== public ==== */

kiln_serving *kiln_serving_start(kiln_engine *e, const struct kiln_serving_opts *o, char *err, size_t errlen) {
    kiln_serving *s = kiln_calloc(1, sizeof *s);
    s->e = e;
    s->o = *o;
    if (s->o.max_running <= 0) s->o.max_running = 256;
    if (s->o.max_queued <= 0) s->o.max_queued = 1024;
    if (s->o.chunk <= 0) s->o.chunk = e->prefill_chunk;
    const struct kiln_config *c = &e->model.cfg;
    int pool_tokens = e->kv.cache.n_pages * e->kv.cache.page_size;
    s->max_tokens = c->max_pos < pool_tokens ? c->max_pos : pool_tokens;
    int n_eos = c->n_eos < KILN_MAX_EOS ? c->n_eos : KILN_MAX_EOS;
    for (int i = 0; i < n_eos; i++) s->eos[i] = c->eos[i];
    radix_init(&s->cache, &e->kv);
    struct sched_opts so = {.max_running = s->o.max_running, .chunk = s->o.chunk, .max_context = s->max_tokens, .eos = s->eos,
                            .n_eos = n_eos};
    sched_init(&s->sched, &so, &e->kv, &s->cache);
    s->row_copy = kiln_malloc(sizeof(float) * (size_t)c->vocab);
    s->omp_threads = omp_get_max_threads();
    hist_init(&s->st.ttft, ttft_bounds, KILN_HIST_BUCKETS);
    hist_init(&s->st.tpot, tpot_bounds, KILN_HIST_BUCKETS);
    hist_init(&s->st.e2e, e2e_bounds, KILN_HIST_BUCKETS);
    s->st.kv_pages_total = e->kv.cache.n_pages;
    s->st.page_size = e->kv.cache.page_size;
    publish_stats(s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->flush_cv, NULL);
    if (pthread_create(&s->th, NULL, engine_main, s)) {
        kiln_errf(err, errlen, "cannot start the engine thread");
        kiln_serving_free(s);
        return NULL;
    }
    s->started = 1;
    return s;
}

void kiln_serving_stop(kiln_serving *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    int was = s->stop;
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_cond_broadcast(&s->flush_cv);
    pthread_mutex_unlock(&s->mu);
    if (was) return;
    if (s->started) pthread_join(s->th, NULL);
    /* the thread is gone and submit refuses new work (stop is set): finish
     * whatever is left, on this thread */
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_inbox; i++) live_add(s, s->inbox[i]);
    s->n_inbox = 0;
    pthread_mutex_unlock(&s->mu);
    while (s->n_live) {
        kiln_request *r = s->live[s->n_live - 1];
        if (r->sr.state != SCHED_NEW) sched_abort(&s->sched, &r->sr);
        finish_request(s, r, KILN_FINISH_ABORT, "the server is shutting down");
    }
}

void kiln_serving_free(kiln_serving *s) {
    if (!s) return;
    kiln_serving_stop(s);
    sched_free(&s->sched);
    sched_batch_free(&s->batch);
    radix_free(&s->cache);
    free(s->inbox), free(s->live), free(s->logits), free(s->row_copy), free(s->sampled), free(s->argmax), free(s->full);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->flush_cv);
    free(s);
}

int kiln_serving_max_tokens(const kiln_serving *s) { return s->max_tokens; }

static int submit(kiln_serving *s, const struct kiln_request_params *p, kiln_channel *ch, int tag, int canary, kiln_request **out,
                  char *err, size_t errlen) {
    const struct kiln_config *c = &s->e->model.cfg;
    *out = NULL;
    if (p->n_prompt <= 0) return kiln_errf(err, errlen, "the prompt is empty");
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= c->vocab)
            return kiln_errf(err, errlen, "token id %d is outside the vocabulary [0, %d)", p->prompt[i], c->vocab);
    if (p->max_tokens < 1) return kiln_errf(err, errlen, "max_tokens must be at least 1, got %d", p->max_tokens);
    if ((int64_t)p->n_prompt + p->max_tokens > s->max_tokens)
        return kiln_errf(err, errlen,
                         "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in the "
                         "prompt, %d for the completion). Please reduce the prompt or max_tokens.",
                         s->max_tokens, (long long)p->n_prompt + p->max_tokens, p->n_prompt, p->max_tokens);
    if (p->min_tokens < 0 || p->min_tokens > p->max_tokens)
        return kiln_errf(err, errlen, "min_tokens must be between 0 and max_tokens (%d), got %d", p->max_tokens, p->min_tokens);
    if (p->logprobs > KILN_MAX_TOP_LOGPROBS) return kiln_errf(err, errlen, "at most %d top logprobs, got %d", KILN_MAX_TOP_LOGPROBS, p->logprobs);
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= c->vocab)
            return kiln_errf(err, errlen, "stop token id %d is outside the vocabulary [0, %d)", p->stop_ids[i], c->vocab);
    for (int i = 0; i < p->sampling.n_bias; i++)
        if (p->sampling.bias_ids[i] < 0 || p->sampling.bias_ids[i] >= c->vocab || !isfinite(p->sampling.bias[i]))
            return kiln_errf(err, errlen, "logit bias %g for token id %d: the id must be in [0, %d) and the bias finite",
                             p->sampling.bias[i], p->sampling.bias_ids[i], c->vocab);
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        kiln_errf(err, errlen, "the server is shutting down");
        return KILN_EFULL;
    }
    if (!canary && s->n_inbox + s->st.waiting >= s->o.max_queued) {
        pthread_mutex_unlock(&s->mu);
        kiln_errf(err, errlen, "the queue is full (%d requests waiting); retry later", s->o.max_queued);
        return KILN_EFULL;
    }
    pthread_mutex_unlock(&s->mu);
    kiln_request *r = kiln_calloc(1, sizeof *r);
    sched_req_init(&r->sr, p->prompt, p->n_prompt);
    r->sr.max_new = p->max_tokens;
    r->sr.ignore_eos = p->ignore_eos;
    r->sr.user = r;
    r->sr.urgent = canary; /* /health must not wait behind the whole queue */
    sampler_init(&r->smp, &p->sampling, c->vocab);
    sampler_set_prompt(&r->smp, p->prompt, p->n_prompt);
    r->min_tokens = p->min_tokens;
    r->logprobs = p->logprobs < 0 ? -1 : p->logprobs;
    if (p->n_stop_ids > 0) {
        r->stop_ids = kiln_malloc(sizeof *r->stop_ids * (size_t)p->n_stop_ids);
        memcpy(r->stop_ids, p->stop_ids, sizeof *r->stop_ids * (size_t)p->n_stop_ids);
        r->n_stop_ids = p->n_stop_ids;
    }
    r->json = p->json;
    json_fsm_init(&r->fsm);
    r->ch = ch;
    r->tag = tag;
    r->canary = canary;
    r->t_submit = kiln_now();
    atomic_init(&r->refs, 2);
    atomic_init(&r->cancel, 0);
    pthread_mutex_lock(&ch->mu);
    ch->refs++;
    pthread_mutex_unlock(&ch->mu);
    pthread_mutex_lock(&s->mu);
    if (s->stop) { /* stopped meanwhile: finish it here */
        pthread_mutex_unlock(&s->mu);
        *out = r;
        finish_request(s, r, KILN_FINISH_ABORT, "the server is shutting down");
        return 0;
    }
    if (s->n_inbox == s->cap_inbox) {
        s->cap_inbox = s->cap_inbox ? s->cap_inbox * 2 : 64;
        s->inbox = kiln_realloc(s->inbox, sizeof *s->inbox * (size_t)s->cap_inbox);
    }
    s->inbox[s->n_inbox++] = r;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    *out = r;
    return 0;
}

int kiln_serving_submit(kiln_serving *s, const struct kiln_request_params *p, kiln_channel *ch, int tag, kiln_request **out,
                        char *err, size_t errlen) {
    return submit(s, p, ch, tag, 0, out, err, errlen);
}

void kiln_serving_stats(kiln_serving *s, struct kiln_serving_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    st->waiting += s->n_inbox;
    pthread_mutex_unlock(&s->mu);
}

int kiln_serving_canary(kiln_serving *s, double timeout_s, char *err, size_t errlen) {
    kiln_channel *ch = kiln_channel_new();
    kiln_request *r;
    int32_t tok = s->eos[0] >= 0 ? s->eos[0] : 0;
    struct kiln_request_params p = {.prompt = &tok, .n_prompt = 1, .max_tokens = 1, .logprobs = -1, .sampling = sampling_default()};
    p.sampling.temperature = 0;
    int rc = submit(s, &p, ch, 0, 1, &r, err, errlen);
    if (rc == 0) {
        double t_end = kiln_now() + timeout_s;
        struct kiln_event ev;
        int got_token = 0;
        rc = -1;
        for (;;) {
            double left = t_end - kiln_now();
            if (left <= 0 || !kiln_channel_next(ch, &ev, left)) {
                kiln_errf(err, errlen, "the engine did not generate a token within %.0f s", timeout_s);
                break;
            }
            if (ev.type == KILN_EVENT_TOKEN) got_token = 1;
            if (ev.type == KILN_EVENT_FINISH) {
                if (got_token) rc = 0;
                else kiln_errf(err, errlen, "the canary request ended without a token%s%s", ev.err[0] ? ": " : "", ev.err);
                break;
            }
        }
        kiln_request_release(r);
    }
    kiln_channel_release(ch);
    return rc;
}

int kiln_serving_flush_cache(kiln_serving *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t gen = s->flush_gen;
    s->flush_req = 1;
    pthread_cond_signal(&s->cv);
    while (s->flush_gen == gen && !s->stop) pthread_cond_wait(&s->flush_cv, &s->mu);
    int freed = s->flush_freed;
    pthread_mutex_unlock(&s->mu);
    return freed;
}
