/*
 * test_sched.c: the radix prefix cache and the scheduler, with no model.
 *
 * The scheduler is driven by a synthetic forward that checks the page
 * bookkeeping for real: it writes each new token id into a shadow copy of
 * the KV pool (one int per page slot) through the batch's page tables, and
 * the "sampled" token is a hash of the whole sequence read back through the
 * page table. A wrong page (a shared prefix that is not the same prefix, a
 * page swapped or freed too early, a bad recompute after preemption)
 * changes the hash and so the output; the expected output is computed from
 * the true token sequence alone.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/base.h"
#include "engine/kv.h"
#include "engine/radix.h"
#include "engine/sched.h"
#include "test.h"

#define PS 4 /* page size in these tests */

static int pool_open(struct kv_pool *p, struct kiln_backend **be, int n_pages) {
    char err[256];
    *be = backend_create("cpu", 1, err, sizeof err);
    if (!*be) return -1;
    return kv_pool_init(p, *be, 1, 1, 4, PS, n_pages, KILN_DTYPE_F32, err, sizeof err);
}

static void pool_close(struct kv_pool *p, struct kiln_backend *be) {
    kv_pool_free(p);
    be->destroy(be);
}

static void tree_ok(const struct radix *t) {
    char err[256] = "";
    int rc = radix_check(t, err, sizeof err);
    CHECK(rc == 0, "%s", err);
}

/* ==== radix ==== */

static void seq_tokens(int32_t *t, int n, int base) {
    for (int i = 0; i < n; i++) t[i] = base + i;
}

void test_radix(void) {
    struct kv_pool pool;
    struct kiln_backend *be;
    if (pool_open(&pool, &be, 32)) {
        CHECK(0, "cannot open a CPU page pool");
        return;
    }
    struct radix t;
    radix_init(&t, &pool);
    struct radix_node *n;
    int32_t a[12], pa[3], got[8];
    seq_tokens(a, 12, 100);
    /* A: 3 pages owned by a "request", inserted, then the request lets go */
    CHECK(kv_pool_alloc(&pool, 3, pa) == 0);
    CHECK(radix_insert(&t, a, 3, pa, &n) == 0);
    CHECK(t.n_pages == 3 && t.n_evictable == 3 && t.n_nodes == 1);
    for (int i = 0; i < 3; i++) {
        CHECK(pool.ref[pa[i]] == 2);
        kv_pool_release(&pool, pa[i]);
    }
    tree_ok(&t);

    /* full match, and a match capped below a page boundary */
    CHECK(radix_match(&t, a, 12, got, &n) == 3);
    CHECK(got[0] == pa[0] && got[1] == pa[1] && got[2] == pa[2]);
    CHECK(radix_match(&t, a, 11, got, &n) == 2, "11 tokens hold 2 full pages");
    /* the partial match split the node: [a0 a1][a2] */
    CHECK(t.n_nodes == 2 && n->n_pages == 2 && n->child && n->child->n_pages == 1);
    tree_ok(&t);

    /* B shares A's first page, then diverges; B computed its own copy of
     * page 0: insert swaps it for the tree's and frees the duplicate */
    int32_t b[8], pb[2];
    memcpy(b, a, sizeof(int32_t) * PS);
    seq_tokens(b + PS, PS, 900);
    CHECK(kv_pool_alloc(&pool, 2, pb) == 0);
    int dup = pb[0], free_before = kv_pool_n_free(&pool);
    CHECK(radix_insert(&t, b, 2, pb, &n) == 1, "one page was cached already");
    CHECK(pb[0] == pa[0], "B now uses the tree's page 0");
    CHECK(pool.ref[dup] == 0 && kv_pool_n_free(&pool) == free_before + 1, "the duplicate went back");
    CHECK(pool.ref[pa[0]] == 2, "tree + B");
    CHECK(t.n_pages == 4 && t.n_nodes == 4, "root-[a0]-{[a1]-[a2], [b1]}");
    tree_ok(&t);

    /* lock B's path: eviction takes only A's unlocked leaf pages */
    struct radix_node *nb = n;
    radix_lock(&t, nb);
    CHECK(t.n_evictable == 2, "a1, a2 evictable; a0 and b1 locked");
    for (int i = 0; i < 2; i++) kv_pool_release(&pool, pb[i]); /* B keeps only its lock for now */
    int freed = radix_evict(&t, 100);
    CHECK(freed == 2 && t.n_pages == 2, "freed %d", freed);
    CHECK(radix_match(&t, a, 12, got, &n) == 1, "A's tail is gone, its first page (shared with B) stays");
    CHECK(radix_match(&t, b, 8, got, &n) == 2);
    tree_ok(&t);
    radix_unlock(&t, nb);
    CHECK(t.n_evictable == 2);

    /* LRU order: B's path was last used before X, Y, Z were inserted in
     * turn; X is touched again. Evicting one page at a time takes B's leaf
     * [b1], then [a0] (a leaf now), then Y, the least recently used. */
    int32_t x[PS], y[PS], z[PS], px, py, pz;
    seq_tokens(x, PS, 2000), seq_tokens(y, PS, 3000), seq_tokens(z, PS, 4000);
    struct radix_node *nx, *ny, *nz;
    kv_pool_alloc(&pool, 1, &px), radix_insert(&t, x, 1, &px, &nx), kv_pool_release(&pool, px);
    kv_pool_alloc(&pool, 1, &py), radix_insert(&t, y, 1, &py, &ny), kv_pool_release(&pool, py);
    kv_pool_alloc(&pool, 1, &pz), radix_insert(&t, z, 1, &pz, &nz), kv_pool_release(&pool, pz);
    radix_match(&t, x, PS, got, &n);
    CHECK(radix_evict(&t, 1) == 1);
    CHECK(radix_match(&t, b, 8, got, &n) == 1, "B's leaf [b1] went first, [a0] stays");
    radix_match(&t, x, PS, got, &n); /* the match above touched [a0]: make X newer again */
    radix_match(&t, z, PS, got, &n);
    CHECK(radix_evict(&t, 1) == 1);
    CHECK(radix_match(&t, y, PS, got, &n) == 0, "then Y, the least recently used");
    CHECK(radix_match(&t, x, PS, got, &n) == 1 && radix_match(&t, z, PS, got, &n) == 1);
    /* a locked leaf is never evicted */
    radix_lock(&t, nx);
    radix_evict(&t, 1000);
    CHECK(radix_match(&t, x, PS, got, &n) == 1 && t.n_pages == 1, "only the locked X is left");
    radix_unlock(&t, nx);
    tree_ok(&t);

    /* everything out: the pool is whole again */
    radix_evict(&t, 1000);
    CHECK(t.n_pages == 0 && t.n_nodes == 0);
    CHECK(kv_pool_n_free(&pool) == 32, "%d free", kv_pool_n_free(&pool));
    radix_free(&t);
    pool_close(&pool, be);
}

/* ==== scheduler ==== */

#define VOCAB 5000

/* the synthetic model: next token = hash of the whole sequence */
static int32_t next_of(const int32_t *seq, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)seq[i]) * 1099511628211ull;
    return (int32_t)(h % VOCAB);
}

struct world {
    struct kv_pool pool;
    struct kiln_backend *be;
    struct radix cache;
    struct sched s;
    struct sched_batch b;
    int32_t *shadow; /* [n_pages * PS] token written into each slot */
    int max_step_tokens, steps, mixed_steps;
};

static int world_open(struct world *w, int n_pages, int chunk, int max_running) {
    memset(w, 0, sizeof *w);
    if (pool_open(&w->pool, &w->be, n_pages)) return -1;
    radix_init(&w->cache, &w->pool);
    static const int32_t eos[] = {VOCAB - 1};
    struct sched_opts o = {.max_running = max_running, .chunk = chunk, .max_context = 100000, .eos = eos, .n_eos = 1};
    sched_init(&w->s, &o, &w->pool, &w->cache);
    w->shadow = kiln_malloc(sizeof(int32_t) * (size_t)n_pages * PS);
    return 0;
}

static void world_close(struct world *w) {
    sched_free(&w->s);
    sched_batch_free(&w->b);
    radix_free(&w->cache);
    pool_close(&w->pool, w->be);
    free(w->shadow);
}

/* One step: schedule, "forward" into the shadow pool, sample, commit.
 * Returns the tokens run. */
static int world_step(struct world *w) {
    struct sched_batch *b = &w->b;
    int n = sched_schedule(&w->s, b);
    if (n == 0) return 0;
    int decode = 0, prefill = 0;
    int32_t *seq = kiln_malloc(sizeof(int32_t) * 100000), *sampled = kiln_malloc(sizeof(int32_t) * (size_t)(b->n_out + 1));
    for (int i = 0; i < b->n; i++) {
        const struct kiln_seq_view *v = &b->views[i];
        CHECK(v->n_pages * PS >= v->n_past + v->n, "page table covers the step");
        for (int j = 0; j < v->n; j++) {
            int p = v->n_past + j;
            CHECK(b->pos[v->start + j] == p);
            w->shadow[v->pages[p / PS] * PS + p % PS] = b->tokens[v->start + j];
        }
        if (b->n_new[i] == 1 && b->reqs[i]->n_computed + 1 == b->reqs[i]->n_tokens && b->reqs[i]->n_tokens > b->reqs[i]->n_prompt) decode++;
        else prefill++;
    }
    for (int j = 0; j < b->n_out; j++) {
        const struct kiln_seq_view *v = &b->views[b->out_req[j]];
        int len = v->n_past + v->n;
        CHECK(b->out_rows[j] == v->start + v->n - 1);
        for (int p = 0; p < len; p++) seq[p] = w->shadow[v->pages[p / PS] * PS + p % PS];
        sampled[j] = next_of(seq, len);
    }
    sched_commit(&w->s, b, sampled);
    if (n > w->max_step_tokens) w->max_step_tokens = n;
    w->steps++;
    w->mixed_steps += decode > 0 && prefill > 0;
    free(seq);
    free(sampled);
    return n;
}

/* the expected output of a request run alone */
static void expected(const int32_t *prompt, int n_prompt, int max_new, int32_t *out, int *n_out) {
    int32_t *seq = kiln_malloc(sizeof(int32_t) * (size_t)(n_prompt + max_new));
    memcpy(seq, prompt, sizeof(int32_t) * (size_t)n_prompt);
    int n = n_prompt, k = 0;
    while (k < max_new) {
        int32_t t = next_of(seq, n);
        seq[n++] = out[k++] = t;
        if (t == VOCAB - 1) break;
    }
    *n_out = k;
    free(seq);
}

static void check_rest(struct world *w) {
    tree_ok(&w->cache);
    CHECK(sched_idle(&w->s));
    CHECK(kv_pool_n_free(&w->pool) + w->cache.n_pages == w->pool.cache.n_pages, "every page free or cached: %d free, %d cached, %d total",
          kv_pool_n_free(&w->pool), w->cache.n_pages, w->pool.cache.n_pages);
    CHECK(w->cache.n_evictable == w->cache.n_pages, "nothing locked at rest");
    radix_evict(&w->cache, 1 << 30);
    CHECK(kv_pool_n_free(&w->pool) == w->pool.cache.n_pages);
}

/* Runs n requests (prompts of the given lengths over a shared prefix of
 * `shared` tokens) through the scheduler and compares every output with
 * the request run alone. */
static void run_mix(const char *what, int n_pages, int chunk, int max_running, int n, const int *lens, int shared, int max_new,
                    int arrive_every) {
    struct world w;
    if (world_open(&w, n_pages, chunk, max_running)) {
        CHECK(0, "world_open");
        return;
    }
    struct sched_req *r = kiln_calloc((size_t)n, sizeof *r);
    int32_t **prompts = kiln_calloc((size_t)n, sizeof *prompts);
    for (int i = 0; i < n; i++) {
        prompts[i] = kiln_malloc(sizeof(int32_t) * (size_t)lens[i]);
        for (int j = 0; j < lens[i]; j++) prompts[i][j] = j < shared ? 7 + j : 11 + (i * 131 + j * 17) % (VOCAB - 20);
        sched_req_init(&r[i], prompts[i], lens[i]);
        r[i].max_new = max_new;
    }
    int added = 0, done = 0, guard = 0;
    while (done < n && guard++ < 100000) {
        if (added < n && (arrive_every == 0 || w.steps % arrive_every == 0)) sched_add(&w.s, &r[added++]);
        if (added < n && arrive_every == 0) continue;
        world_step(&w);
        done += w.b.n_done;
        for (int i = 0; i < w.b.n_done; i++) CHECK(w.b.done[i]->finish == SCHED_FINISH_STOP || w.b.done[i]->finish == SCHED_FINISH_LENGTH);
        if (w.s.n_running == 0 && w.s.n_waiting == 0 && added < n) w.steps++;
    }
    CHECK(done == n, "%s: %d of %d finished", what, done, n);
    int32_t *want = kiln_malloc(sizeof(int32_t) * (size_t)max_new);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int nw;
        expected(prompts[i], lens[i], max_new, want, &nw);
        int got = r[i].n_tokens - r[i].n_prompt;
        if (got != nw || memcmp(want, r[i].tokens + r[i].n_prompt, sizeof(int32_t) * (size_t)nw)) bad++;
    }
    CHECK(bad == 0, "%s: %d requests differ from their solo run", what, bad);
    CHECK(w.max_step_tokens <= chunk + max_running, "%s: a step of %d tokens", what, w.max_step_tokens);
    check_rest(&w);
    if (!strcmp(what, "mixed")) CHECK(w.mixed_steps > 0, "prefill chunks and decode tokens shared a step");
    if (!strcmp(what, "preempt")) CHECK(w.s.n_preemptions > 0, "the small pool forced preemption");
    if (!strcmp(what, "prefix")) CHECK(w.s.prefix_hit_tokens > 0, "shared prefix reused: %llu tokens", (unsigned long long)w.s.prefix_hit_tokens);
    for (int i = 0; i < n; i++) sched_req_free(&r[i]), free(prompts[i]);
    free(r), free(prompts), free(want);
    world_close(&w);
}

void test_sched(void) {
    int lens[24];
    for (int i = 0; i < 24; i++) lens[i] = 5 + (i * 37) % 60;
    /* everything at once, plenty of pages: chunking + continuous batching */
    run_mix("burst", 1024, 32, 64, 24, lens, 0, 20, 0);
    /* arrivals every 3 steps: new prompts prefill next to running decodes */
    run_mix("mixed", 1024, 16, 8, 24, lens, 0, 20, 3);
    /* a pool of 40 pages (160 tokens) for 24 requests of up to 85 tokens:
     * admission waits, running requests get preempted and recomputed */
    run_mix("preempt", 40, 32, 16, 24, lens, 0, 20, 2);
    /* a 24-token shared prefix: later requests hit the cache */
    run_mix("prefix", 512, 64, 4, 24, lens, 24, 8, 4);
    /* max_running 1: strictly one after another */
    run_mix("serial", 256, 8, 1, 6, lens, 0, 10, 0);

    /* admission respects max_running; chunks respect the budget */
    struct world w;
    if (world_open(&w, 256, 10, 2)) return;
    struct sched_req r[3];
    int32_t p[25];
    for (int i = 0; i < 25; i++) p[i] = 100 + i;
    for (int i = 0; i < 3; i++) sched_req_init(&r[i], p, 25), r[i].max_new = 3, sched_add(&w.s, &r[i]);
    int n = sched_schedule(&w.s, &w.b);
    CHECK(n == 10 && w.b.n == 1 && w.b.n_out == 0, "first step: one 10-token chunk (n=%d reqs=%d)", n, w.b.n);
    CHECK(w.s.n_running == 1 && w.s.n_waiting == 2);
    sched_commit(&w.s, &w.b, NULL);
    n = sched_schedule(&w.s, &w.b);
    CHECK(n == 10 && w.b.n == 1, "second chunk");
    sched_commit(&w.s, &w.b, NULL);
    n = sched_schedule(&w.s, &w.b);
    CHECK(n == 10 && w.b.n == 2 && w.b.n_out == 1, "last 5 tokens of r0 + the first 5 of r1 share a step");
    int32_t t = 1;
    sched_commit(&w.s, &w.b, &t);
    CHECK(r[0].n_tokens == 26 && r[0].prompt_done);
    /* r1 prefix-matched nothing (r0's pages were not cached when r1 was
     * admitted); r2 waits for a running slot */
    CHECK(w.s.n_running == 2 && w.s.n_waiting == 1);
    /* aborting a running request frees its slot and its own pages */
    sched_abort(&w.s, &r[1]);
    CHECK(r[1].state == SCHED_DONE && r[1].finish == SCHED_FINISH_ABORT && r[1].n_pages == 0);
    n = sched_schedule(&w.s, &w.b);
    CHECK(w.b.n == 2 && w.b.reqs[1] == &r[2], "r2 admitted");
    CHECK(r[2].n_cached == 24, "r2 reuses r0's 6 cached prompt pages (%d tokens)", r[2].n_cached);
    sched_abort(&w.s, &r[0]);
    sched_abort(&w.s, &r[2]);
    check_rest(&w);
    for (int i = 0; i < 3; i++) sched_req_free(&r[i]);
    world_close(&w);
}

/* ==== the serving loop on a real model ==== */

#include "kiln.h"
#include "tokenizer/tokenizer.h"

static int collect_tok(int32_t id, void *ctx) {
    int32_t **p = ctx;
    *(*p)++ = id;
    return 0;
}

/* Runs n greedy requests concurrently through kiln_serving and compares
 * each with kiln_generate of the same request alone. */
static void serve_vs_solo(const char *what, int max_total_tokens, int chunk, int n, int shared, int n_gen, int expect_preempt) {
    char err[512] = "";
    /* the CPU backend: its kernels are batch-invariant, so equality is exact */
    struct kiln_engine_opts eo = {.model = FIXTURES "/qwen3-dense-tiny", .backend = "cpu", .n_threads = 1, .page_size = 16,
                                  .max_total_tokens = max_total_tokens, .prefill_chunk = chunk};
    kiln_engine *e = kiln_engine_open(&eo, err, sizeof err);
    if (!e) {
        CHECK(0, "%s: %s", what, err);
        return;
    }
    struct kiln_sampling sp = sampling_default();
    sp.temperature = 0;
    int32_t *prompts = kiln_malloc(sizeof(int32_t) * (size_t)n * 200), *want = kiln_malloc(sizeof(int32_t) * (size_t)n * n_gen);
    int *len = kiln_malloc(sizeof(int) * (size_t)n), *n_want = kiln_malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) {
        len[i] = shared + 5 + (i * 29) % 70;
        for (int j = 0; j < len[i]; j++) prompts[i * 200 + j] = j < shared ? 1000 + j * 7 : 2000 + (i * 977 + j * 131) % 50000;
        int32_t *w = want + i * n_gen;
        n_want[i] = kiln_generate(e, prompts + i * 200, len[i], n_gen, &sp, 1, collect_tok, &w, err, sizeof err);
        CHECK(n_want[i] == n_gen, "%s: solo run %d: %s", what, i, err);
    }
    struct kiln_serving_opts so = {.max_running = 64, .chunk = chunk};
    kiln_serving *s = kiln_serving_start(e, &so, err, sizeof err);
    CHECK(s != NULL, "%s", err);
    if (!s) goto out;
    kiln_channel *ch = kiln_channel_new();
    kiln_request **rq = kiln_calloc((size_t)n, sizeof *rq);
    for (int i = 0; i < n; i++) {
        struct kiln_request_params p = {.prompt = prompts + i * 200, .n_prompt = len[i], .max_tokens = n_gen, .ignore_eos = 1,
                                        .logprobs = -1, .sampling = sp};
        CHECK(kiln_serving_submit(s, &p, ch, i, &rq[i], err, sizeof err) == 0, "%s", err);
    }
    int32_t *got = kiln_calloc((size_t)n * n_gen, sizeof(int32_t));
    int *n_got = kiln_calloc((size_t)n, sizeof(int)), finished = 0, cached = 0;
    struct kiln_event ev;
    while (finished < n && kiln_channel_next(ch, &ev, 60.0)) {
        if (ev.type == KILN_EVENT_TOKEN && n_got[ev.tag] < n_gen) got[ev.tag * n_gen + n_got[ev.tag]++] = ev.id;
        if (ev.type == KILN_EVENT_FINISH) {
            finished++;
            cached += ev.n_cached;
            CHECK(ev.finish == KILN_FINISH_LENGTH, "%s: request %d finished with %d", what, ev.tag, ev.finish);
        }
    }
    CHECK(finished == n, "%s: %d of %d finished", what, finished, n);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += n_got[i] != n_gen || memcmp(got + i * n_gen, want + i * n_gen, sizeof(int32_t) * (size_t)n_gen);
    CHECK(bad == 0, "%s: %d of %d concurrent greedy outputs differ from the solo runs", what, bad, n);
    struct kiln_serving_stats st;
    kiln_serving_stats(s, &st);
    if (shared) CHECK(cached > 0, "%s: the shared prefix was reused", what);
    if (expect_preempt) CHECK(st.preemptions > 0, "%s: preemption happened", what);
    CHECK(st.running == 0 && st.waiting == 0);
    CHECK(st.kv_pages_free + st.kv_pages_evictable == st.kv_pages_total, "%s: every page free or evictable (%d + %d of %d)", what,
          st.kv_pages_free, st.kv_pages_evictable, st.kv_pages_total);
    kiln_serving_flush_cache(s);
    kiln_serving_stats(s, &st);
    CHECK(st.kv_pages_free == st.kv_pages_total, "%s: all pages free after a flush", what);
    for (int i = 0; i < n; i++) kiln_request_release(rq[i]);
    kiln_channel_release(ch);
    kiln_serving_free(s);
    free(rq), free(got), free(n_got);
out:
    free(prompts), free(want), free(len), free(n_want);
    kiln_engine_close(e);
}

/* Collects one request's tokens; returns its finish reason. */
static int serve_collect(kiln_channel *ch, int32_t *out, int cap, int *n_out) {
    struct kiln_event ev;
    *n_out = 0;
    while (kiln_channel_next(ch, &ev, 60.0)) {
        if (ev.type == KILN_EVENT_TOKEN && *n_out < cap) out[(*n_out)++] = ev.id;
        if (ev.type == KILN_EVENT_FINISH) return ev.finish;
    }
    return -1;
}

static const uint8_t *serve_token_bytes(void *ctx, int32_t id, size_t *len) {
    const struct kiln_tokenizer *t = ctx;
    if (id >= tok_vocab_size(t) || tok_is_special(t, id)) return NULL;
    return tok_id_bytes(t, id, len);
}

/* stop token ids, min_tokens masking them, and the JSON constraint, on
 * the engine directly */
static void serve_stop_ids_and_json(void) {
    char err[512] = "";
    struct kiln_engine_opts eo = {.model = FIXTURES "/qwen3-dense-tiny", .backend = "cpu", .n_threads = 1, .page_size = 16,
                                  .max_total_tokens = 2048, .prefill_chunk = 64};
    kiln_engine *e = kiln_engine_open(&eo, err, sizeof err);
    struct kiln_tokenizer *tok = tok_load(FIXTURES "/qwen3-dense-tiny", err, sizeof err);
    if (!e || !tok) {
        CHECK(0, "%s", err);
        kiln_engine_close(e);
        tok_free(tok);
        return;
    }
    const struct kiln_config *cfg = kiln_engine_config(e);
    struct kiln_sampling sp = sampling_default();
    sp.temperature = 0;
    int32_t prompt[] = {785, 6722, 315, 9625, 374}, want[16], got[64], *w = want;
    int n_want = kiln_generate(e, prompt, 5, 16, &sp, 1, collect_tok, &w, err, sizeof err), n_got;
    struct kiln_serving_opts so = {0};
    kiln_serving *s = kiln_serving_start(e, &so, err, sizeof err);
    CHECK(s && n_want == 16, "%s", err);
    if (!s) goto out;
    /* the first greedy token that did not occur before, as a stop id */
    int k = 2;
    for (;; k++) {
        int seen = 0;
        for (int i = 0; i < k; i++) seen |= want[i] == want[k];
        if (!seen || k == 15) break;
    }
    kiln_channel *ch = kiln_channel_new();
    kiln_request *r;
    struct kiln_request_params p = {.prompt = prompt, .n_prompt = 5, .max_tokens = 16, .ignore_eos = 1, .logprobs = -1, .sampling = sp,
                                    .stop_ids = &want[k], .n_stop_ids = 1};
    CHECK(kiln_serving_submit(s, &p, ch, 0, &r, err, sizeof err) == 0, "%s", err);
    int fin = serve_collect(ch, got, 64, &n_got);
    CHECK(fin == KILN_FINISH_STOP && n_got == k + 1 && !memcmp(got, want, sizeof(int32_t) * (size_t)(k + 1)),
          "stop id %d (greedy token %d): finish %d after %d tokens", want[k], k, fin, n_got);
    kiln_request_release(r);
    /* forced by a bias, a stop id still waits for min_tokens */
    int32_t x = want[k];
    float big = 100.0f;
    p.sampling.n_bias = 1, p.sampling.bias_ids = &x, p.sampling.bias = &big;
    p.min_tokens = 3;
    CHECK(kiln_serving_submit(s, &p, ch, 0, &r, err, sizeof err) == 0, "%s", err);
    fin = serve_collect(ch, got, 64, &n_got);
    CHECK(fin == KILN_FINISH_STOP && n_got == 4 && got[3] == x && got[0] != x && got[1] != x && got[2] != x,
          "min_tokens 3: finish %d after %d tokens", fin, n_got);
    kiln_request_release(r);

    /* JSON: greedy output is a valid prefix; with '}' favoured the object
     * closes and the request stops there */
    struct json_vocab *jv = json_vocab_new(cfg->vocab, serve_token_bytes, tok, cfg->eos, cfg->n_eos);
    for (int closing = 0; closing < 2; closing++) {
        int32_t brace = 92; /* "}" */
        struct kiln_request_params pj = {.prompt = prompt, .n_prompt = 5, .max_tokens = 40, .logprobs = -1, .sampling = sp, .json = jv};
        if (closing) pj.sampling.n_bias = 1, pj.sampling.bias_ids = &brace, pj.sampling.bias = &big;
        CHECK(kiln_serving_submit(s, &pj, ch, 0, &r, err, sizeof err) == 0, "%s", err);
        fin = serve_collect(ch, got, 64, &n_got);
        struct json_fsm f;
        json_fsm_init(&f);
        int valid = 1;
        for (int i = 0; i < n_got && valid; i++) {
            size_t n = 0;
            const uint8_t *b = serve_token_bytes(tok, got[i], &n);
            valid = b && json_fsm_feed_bytes(&f, b, n) == 0;
        }
        if (closing) CHECK(valid && json_fsm_done(&f) && fin == KILN_FINISH_STOP, "closed object: valid %d, finish %d", valid, fin);
        else CHECK(valid && n_got == 40 && fin == KILN_FINISH_LENGTH, "greedy JSON prefix: valid %d, %d tokens", valid, n_got);
        kiln_request_release(r);
    }
    json_vocab_free(jv);
    kiln_channel_release(ch);
    kiln_serving_free(s);
out:
    kiln_engine_close(e);
    tok_free(tok);
}

void test_serve(void) {
    serve_stop_ids_and_json();
    /* 12 requests at once, prompts chunked by 32 next to decodes */
    serve_vs_solo("batch", 4096, 32, 12, 0, 12, 0);
    /* a 48-token shared prefix: later requests reuse its pages */
    serve_vs_solo("prefix", 4096, 64, 12, 48, 8, 0);
    /* 320 tokens of KV for 12 requests of up to 122 tokens: preemption */
    serve_vs_solo("preempt", 320, 32, 12, 0, 48, 1);
}

/* ==== the server's text state machines (stop strings, <think>) ==== */

#include "server/text.h"

/* feeds pieces one by one through a stop matcher; returns the released text */
static char *run_stop(const char *const *pieces, int n, const char *const *stops, int n_stops, int *hit) {
    struct stop_matcher m;
    struct strbuf out = {0};
    stop_init(&m, stops, n_stops);
    *hit = 0;
    for (int i = 0; i < n && !*hit; i++) *hit = stop_feed(&m, pieces[i], strlen(pieces[i]), &out);
    if (!*hit) stop_flush(&m, &out);
    stop_free(&m);
    char *r = kiln_strdup(sb_str(&out));
    sb_free(&out);
    return r;
}

static void run_think(const char *const *pieces, int n, int in_reasoning, char **reasoning, char **content) {
    struct think_splitter t;
    struct strbuf r = {0}, c = {0};
    think_init(&t, in_reasoning);
    for (int i = 0; i < n; i++) think_feed(&t, pieces[i], strlen(pieces[i]), &r, &c);
    think_flush(&t, &r, &c);
    think_free(&t);
    *reasoning = kiln_strdup(sb_str(&r));
    *content = kiln_strdup(sb_str(&c));
    sb_free(&r), sb_free(&c);
}

/* feeds pieces through a tool parser; returns the content, the calls as
 * "name(arguments);" each */
static void run_tools(const char *const *pieces, int n, char **content, char **calls) {
    struct tool_parser t;
    struct strbuf c = {0}, k = {0};
    tool_init(&t);
    for (int i = 0; i < n; i++) tool_feed(&t, pieces[i], strlen(pieces[i]), &c);
    tool_flush(&t, &c);
    for (int i = 0; i < t.n_calls; i++) sb_printf(&k, "%s(%s);", t.calls[i].name, t.calls[i].arguments);
    tool_free(&t);
    *content = kiln_strdup(sb_str(&c));
    *calls = kiln_strdup(sb_str(&k));
    sb_free(&c), sb_free(&k);
}

/* the same text fed whole and one byte at a time gives the same result */
static void check_tools(const char *text, const char *want_content, const char *want_calls) {
    const char *whole[] = {text};
    char *c, *k;
    run_tools(whole, 1, &c, &k);
    CHECK(!strcmp(c, want_content) && !strcmp(k, want_calls), "whole: content '%s' calls '%s'", c, k);
    free(c), free(k);
    size_t n = strlen(text);
    char **bytes = kiln_malloc(sizeof *bytes * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        bytes[i] = kiln_malloc(2);
        bytes[i][0] = text[i], bytes[i][1] = 0;
    }
    run_tools((const char *const *)bytes, (int)n, &c, &k);
    CHECK(!strcmp(c, want_content) && !strcmp(k, want_calls), "byte by byte: content '%s' calls '%s'", c, k);
    free(c), free(k);
    for (size_t i = 0; i < n; i++) free(bytes[i]);
    free(bytes);
}

static void test_tool_parser(void) {
    /* Qwen's format: content before, one call, whitespace around dropped */
    check_tools("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                "Let me check.", "get_weather({\"city\":\"Paris\"});");
    /* several calls, nothing else: no content at all */
    check_tools("<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>\n"
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"u\": \"日本\"}}\n</tool_call>\n",
                "", "add({\"a\":2,\"b\":3});get_weather({\"city\":\"Oslo\",\"u\":\"日本\"});");
    /* text between and after calls stays content */
    check_tools("A <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> B", "AB", "f({});");
    /* no arguments: {}; arguments as a string holding an object: accepted */
    check_tools("<tool_call>{\"name\": \"now\"}</tool_call>", "", "now({});");
    check_tools("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>", "", "f({\"x\":1});");
    /* not a call: bad JSON, no name, arguments not an object, trailing
     * junk: the block stays content, verbatim, with its whitespace */
    check_tools("Hi\n<tool_call>\n{bad json}\n</tool_call>", "Hi\n<tool_call>\n{bad json}\n</tool_call>", "");
    check_tools("<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>", "");
    check_tools("<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", "");
    check_tools("<tool_call>{\"name\": \"f\"} x</tool_call>", "<tool_call>{\"name\": \"f\"} x</tool_call>", "");
    /* a block never closed (max_tokens hit): content at the end */
    check_tools("ok <tool_call>\n{\"name\": \"f\", \"argu", "ok <tool_call>\n{\"name\": \"f\", \"argu", "");
    check_tools("<tool_call><tool_call><tool_call>", "<tool_call><tool_call><tool_call>", "");
    /* look-alikes are plain text */
    check_tools("<tools> and <tool_ca", "<tools> and <tool_ca", "");
    check_tools("x < y\n", "x < y\n", "");

    /* streaming: nothing of a tag leaks before it is decided */
    struct tool_parser t;
    struct strbuf out = {0};
    tool_init(&t);
    tool_feed(&t, "Sure.\n<tool", 11, &out);
    CHECK(!strcmp(sb_str(&out), "Sure."), "a possible tag and the newline before it are held: '%s'", sb_str(&out));
    tool_feed(&t, "_call>\n{\"name\": \"f\",", 20, &out);
    CHECK(!strcmp(sb_str(&out), "Sure.") && t.n_calls == 0, "inside the block: nothing released");
    tool_feed(&t, " \"arguments\": {}}\n</tool_call>", 30, &out);
    CHECK(t.n_calls == 1 && !strcmp(t.calls[0].name, "f") && !strcmp(sb_str(&out), "Sure."), "the call is out when its block closes");
    tool_feed(&t, "\nDone", 5, &out);
    CHECK(!strcmp(sb_str(&out), "Sure.Done"), "'%s'", sb_str(&out));
    tool_free(&t);
    sb_free(&out);

    /* the parser alone */
    struct tool_call c;
    const char *ok = " {\"name\": \"f\", \"arguments\": {\"q\": [1, 2.5, \"é\"]}} ";
    CHECK(tool_parse_call(ok, strlen(ok), &c) == 0 && !strcmp(c.name, "f") && !strcmp(c.arguments, "{\"q\":[1,2.5,\"é\"]}"), "%s", c.arguments);
    free(c.name), free(c.arguments);
    CHECK(tool_parse_call("{\"name\": \"\"}", 12, &c) < 0, "an empty name is no call");
    CHECK(tool_parse_call("[1]", 3, &c) < 0);
}

void test_serve_text(void) {
    test_tool_parser();
    int hit;
    char *s;
    /* a stop string split across three pieces is found and not returned */
    const char *p1[] = {"Hello wo", "rld, EN", "D here", " more"};
    const char *st1[] = {"END"};
    s = run_stop(p1, 4, st1, 1, &hit);
    CHECK(hit && !strcmp(s, "Hello world, "), "got '%s'", s);
    free(s);
    /* a false start ("EN" then "X") is released once it cannot match */
    const char *p2[] = {"aEN", "X b"};
    s = run_stop(p2, 2, st1, 1, &hit);
    CHECK(!hit && !strcmp(s, "aENX b"), "got '%s'", s);
    free(s);
    /* the earliest of several stop strings wins */
    const char *p3[] = {"one two three"};
    const char *st3[] = {"three", "two"};
    s = run_stop(p3, 1, st3, 2, &hit);
    CHECK(hit && !strcmp(s, "one "), "got '%s'", s);
    free(s);
    /* held-back text: nothing that could start a stop string leaks early */
    struct stop_matcher m;
    struct strbuf out = {0};
    const char *st4[] = {"\n\nUser:"};
    stop_init(&m, st4, 1);
    stop_feed(&m, "answer\n", 7, &out);
    CHECK(!strcmp(sb_str(&out), "answer"), "the newline is held: '%s'", sb_str(&out));
    stop_feed(&m, "\nUs", 3, &out);
    CHECK(!strcmp(sb_str(&out), "answer"));
    CHECK(stop_feed(&m, "er: hi", 6, &out) == 1 && !strcmp(sb_str(&out), "answer"));
    stop_free(&m);
    sb_free(&out);
    /* multi-byte text around a stop string stays whole */
    const char *p5[] = {"日本", "語。終", "わり"};
    const char *st5[] = {"終わり"};
    s = run_stop(p5, 3, st5, 1, &hit);
    CHECK(hit && !strcmp(s, "日本語。"), "got '%s'", s);
    free(s);

    char *r, *c;
    /* <think> split across pieces, newlines around the tags dropped */
    const char *t1[] = {"<th", "ink>\nLet me", " think.\n", "</thi", "nk>\n\nThe answer", " is 4."};
    run_think(t1, 6, 0, &r, &c);
    CHECK(!strcmp(r, "Let me think.") && !strcmp(c, "The answer is 4."), "reasoning '%s' content '%s'", r, c);
    free(r), free(c);
    /* no think block: everything is content, "<" is not swallowed */
    const char *t2[] = {"<", "b>bold</b>"};
    run_think(t2, 2, 0, &r, &c);
    CHECK(!strcmp(r, "") && !strcmp(c, "<b>bold</b>"), "reasoning '%s' content '%s'", r, c);
    free(r), free(c);
    /* enable_thinking=false prompts end with an empty think block: plain content */
    const char *t3[] = {"Hi", " there"};
    run_think(t3, 2, 0, &r, &c);
    CHECK(!strcmp(r, "") && !strcmp(c, "Hi there"));
    free(r), free(c);
    /* the prompt opened <think>: output starts as reasoning */
    const char *t4[] = {"hmm", "</think>", "ok"};
    run_think(t4, 3, 1, &r, &c);
    CHECK(!strcmp(r, "hmm") && !strcmp(c, "ok"), "reasoning '%s' content '%s'", r, c);
    free(r), free(c);
    /* unterminated reasoning (max_tokens hit while thinking) */
    const char *t5[] = {"<think>", "still going"};
    run_think(t5, 2, 0, &r, &c);
    CHECK(!strcmp(r, "still going") && !strcmp(c, ""), "reasoning '%s' content '%s'", r, c);
    free(r), free(c);
    /* one piece at a time gives what one big piece gives */
    const char *whole[] = {"<think>\nLet me think.\n</think>\n\nThe answer is 4."};
    run_think(whole, 1, 0, &r, &c);
    CHECK(!strcmp(r, "Let me think.") && !strcmp(c, "The answer is 4."));
    free(r), free(c);
}
