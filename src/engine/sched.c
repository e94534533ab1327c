/*
 * sched.c: continuous batching with chunked prefill, FCFS admission,
 * prefix reuse through the radix cache and preemption by recompute (the
 * rules are in sched.h).
 *
 * Queues are arrays sorted by arrival id: a preempted request goes back to
 * its place in the waiting queue, so it is admitted again before anything
 * that arrived after it, and the newest running request is always the last
 * one, which is the preemption victim. Batches of a few hundred requests
 * make the O(n) inserts irrelevant next to a forward.
 */
#include "engine/sched.h"

#include <assert.h>
#include <stdlib.h>

#include "base/base.h"

/* ==== helpers ==== */

static int pages_for(const struct sched *s, int n_tokens) {
    const int P = s->pool->cache.page_size;
    return (n_tokens + P - 1) / P;
}

/* Pages the step can still get: free ones plus the unlocked cache. */
static int available(const struct sched *s) { return kv_pool_n_free(s->pool) + s->cache->n_evictable; }

static void q_insert(struct sched_req ***q, int *n, int *cap, struct sched_req *r) {
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        *q = kiln_realloc(*q, sizeof **q * (size_t)*cap);
    }
    int i = *n;
    while (i > 0 && (*q)[i - 1]->id > r->id) {
        (*q)[i] = (*q)[i - 1];
        i--;
    }
    (*q)[i] = r;
    (*n)++;
}

static void q_remove(struct sched_req **q, int *n, struct sched_req *r) {
    int i = 0;
    while (i < *n && q[i] != r) i++;
    assert(i < *n);
    memmove(q + i, q + i + 1, sizeof *q * (size_t)(*n - i - 1));
    (*n)--;
}

static void push_done(struct sched_batch *b, struct sched_req *r) {
    if (b->n_done == b->cap_done) {
        b->cap_done = b->cap_done ? b->cap_done * 2 : 16;
        b->done = kiln_realloc(b->done, sizeof *b->done * (size_t)b->cap_done);
    }
    b->done[b->n_done++] = r;
}

static void ensure_pages(struct sched_req *r, int n) {
    if (n <= r->cap_pages) return;
    r->cap_pages = n * 2 > 16 ? n * 2 : 16;
    r->pages = kiln_realloc(r->pages, sizeof *r->pages * (size_t)r->cap_pages);
}

static int is_eos(const struct sched *s, int32_t id) {
    for (int i = 0; i < s->o.n_eos; i++)
        if (s->o.eos[i] == id) return 1;
    return 0;
}

/* Drops every page reference and the radix lock; the KV is forgotten. */
static void release_pages(struct sched *s, struct sched_req *r) {
    for (int i = 0; i < r->n_pages; i++) kv_pool_release(s->pool, r->pages[i]);
    r->n_pages = 0;
    if (r->node) radix_unlock(s->cache, r->node);
    r->node = NULL;
    r->n_computed = 0;
}

/* Offers r's full computed pages to the prefix cache and moves its lock to
 * the deepest node they reach (radix_insert may swap r's pages for the
 * tree's identical ones). */
static void cache_pages(struct sched *s, struct sched_req *r) {
    int full = r->n_computed / s->pool->cache.page_size;
    if (full == 0) return;
    struct radix_node *n;
    radix_insert(s->cache, r->tokens, full, r->pages, &n);
    radix_lock(s->cache, n);
    if (r->node) radix_unlock(s->cache, r->node);
    r->node = n;
}

/* Takes n more pages for r, evicting unlocked cache if the free list is
 * short. The caller checked available() >= n. */
static void take_pages(struct sched *s, struct sched_req *r, int n) {
    if (n <= 0) return;
    int short_by = n - kv_pool_n_free(s->pool);
    if (short_by > 0) radix_evict(s->cache, short_by);
    ensure_pages(r, r->n_pages + n);
    int rc = kv_pool_alloc(s->pool, n, r->pages + r->n_pages);
    assert(rc == 0);
    (void)rc;
    r->n_pages += n;
}

static void preempt(struct sched *s, struct sched_req *r) {
    release_pages(s, r);
    q_remove(s->running, &s->n_running, r);
    r->state = SCHED_WAITING;
    r->n_preempted++;
    s->n_preemptions++;
    q_insert(&s->waiting, &s->n_waiting, &s->cap_waiting, r);
    kiln_log(KILN_LOG_DEBUG, "sched: preempted request %llu (%d tokens) for lack of KV pages", (unsigned long long)r->id,
             r->n_tokens);
}

/* keep: offer the computed pages to the prefix cache (their KV is valid
 * unless the forward failed), also for a cancelled request, so that a
 * client retrying after a disconnect finds its prompt cached */
static void retire(struct sched *s, struct sched_req *r, enum sched_finish f, int keep) {
    if (r->state == SCHED_RUNNING) {
        if (keep) cache_pages(s, r);
        q_remove(s->running, &s->n_running, r);
    } else if (r->state == SCHED_WAITING) {
        q_remove(s->waiting, &s->n_waiting, r);
    }
    release_pages(s, r);
    r->state = SCHED_DONE;
    r->finish = f;
}

static void plan_add(struct sched_batch *b, struct sched_req *r, int k) {
    if (b->n == b->cap_reqs) {
        b->cap_reqs = b->cap_reqs ? b->cap_reqs * 2 : 64;
        b->reqs = kiln_realloc(b->reqs, sizeof *b->reqs * (size_t)b->cap_reqs);
        b->n_new = kiln_realloc(b->n_new, sizeof *b->n_new * (size_t)b->cap_reqs);
        b->out_rows = kiln_realloc(b->out_rows, sizeof *b->out_rows * (size_t)b->cap_reqs);
        b->out_req = kiln_realloc(b->out_req, sizeof *b->out_req * (size_t)b->cap_reqs);
        b->views = kiln_realloc(b->views, sizeof *b->views * (size_t)b->cap_reqs);
    }
    b->reqs[b->n] = r;
    b->n_new[b->n++] = k;
}

/* Flattens the plan into the arrays model_forward reads. Done last, when
 * no page table will be reallocated any more this step. */
static void plan_build(struct sched_batch *b) {
    int total = 0;
    for (int i = 0; i < b->n; i++) total += b->n_new[i];
    if (total > b->cap_tokens) {
        b->cap_tokens = total;
        b->tokens = kiln_realloc(b->tokens, sizeof *b->tokens * (size_t)total);
        b->pos = kiln_realloc(b->pos, sizeof *b->pos * (size_t)total);
    }
    int row = 0;
    b->n_out = 0;
    for (int i = 0; i < b->n; i++) {
        struct sched_req *r = b->reqs[i];
        int k = b->n_new[i];
        b->views[i] = (struct kiln_seq_view){.start = row, .n = k, .n_past = r->n_computed, .pages = r->pages, .n_pages = r->n_pages};
        for (int j = 0; j < k; j++, row++) {
            b->tokens[row] = r->tokens[r->n_computed + j];
            b->pos[row] = r->n_computed + j;
        }
        if (r->n_computed + k == r->n_tokens) {
            b->out_rows[b->n_out] = row - 1;
            b->out_req[b->n_out++] = i;
        }
    }
    b->n_tokens = total;
}

/* ==== public ==== */

void sched_init(struct sched *s, const struct sched_opts *o, struct kv_pool *pool, struct radix *cache) {
    memset(s, 0, sizeof *s);
    s->o = *o;
    if (s->o.max_running <= 0) s->o.max_running = 256;
    if (s->o.chunk <= 0) s->o.chunk = 512;
    if (s->o.max_context <= 0) s->o.max_context = 1 << 30;
    s->pool = pool;
    s->cache = cache;
}

void sched_free(struct sched *s) {
    while (s->n_running) retire(s, s->running[0], SCHED_FINISH_ABORT, 0);
    while (s->n_waiting) retire(s, s->waiting[0], SCHED_FINISH_ABORT, 0);
    free(s->waiting);
    free(s->running);
    memset(s, 0, sizeof *s);
}

void sched_req_init(struct sched_req *r, const int32_t *prompt, int n_prompt) {
    memset(r, 0, sizeof *r);
    r->cap = n_prompt + 16;
    r->tokens = kiln_malloc(sizeof(int32_t) * (size_t)r->cap);
    memcpy(r->tokens, prompt, sizeof(int32_t) * (size_t)n_prompt);
    r->n_tokens = r->n_prompt = n_prompt;
    r->max_new = 1 << 30;
}

void sched_req_free(struct sched_req *r) {
    assert(r->n_pages == 0 && !r->node);
    free(r->tokens);
    free(r->pages);
    memset(r, 0, sizeof *r);
}

void sched_add(struct sched *s, struct sched_req *r) {
    assert(r->n_prompt > 0);
    /* ids order both queues; an urgent request takes an id below every
     * normal one (they start at 2^32) */
    r->id = r->urgent ? s->next_urgent_id++ : (1ull << 32) + s->next_id++;
    r->state = SCHED_WAITING;
    q_insert(&s->waiting, &s->n_waiting, &s->cap_waiting, r);
}

void sched_abort(struct sched *s, struct sched_req *r) {
    if (r->state == SCHED_DONE) return;
    retire(s, r, SCHED_FINISH_ABORT, 1);
}

int sched_schedule(struct sched *s, struct sched_batch *b) {
    b->n = 0;
    b->n_done = 0;
    int budget = s->o.chunk;
    /* 1. running requests, oldest first: decode tokens always, prefill
     * chunks while the budget lasts. Short of pages, preempt the newest. */
    for (int i = 0; i < s->n_running; i++) {
        struct sched_req *r = s->running[i];
        int rem = r->n_tokens - r->n_computed;
        assert(rem >= 1);
        int k = rem == 1 ? 1 : (rem < budget ? rem : budget);
        if (k <= 0) continue;
        int need = pages_for(s, r->n_computed + k) - r->n_pages;
        while (need > available(s)) {
            struct sched_req *victim = s->running[s->n_running - 1];
            preempt(s, victim);
            if (victim == r) break;
        }
        if (r->state != SCHED_RUNNING) break; /* r was the newest: nothing after it */
        take_pages(s, r, need);
        plan_add(b, r, k);
        budget -= k;
    }
    /* 2. admission, FCFS: the head waits until it fits */
    while (s->n_waiting > 0 && s->n_running < s->o.max_running && budget > 0) {
        struct sched_req *r = s->waiting[0];
        struct radix_node *node;
        ensure_pages(r, pages_for(s, r->n_tokens));
        /* keep at least one token to compute: its logits are sampled */
        int m = radix_match(s->cache, r->tokens, r->n_tokens - 1, r->pages, &node);
        radix_lock(s->cache, node);
        int need_all = pages_for(s, r->n_tokens) - m;
        if (need_all + s->n_running > available(s)) {
            radix_unlock(s->cache, node);
            break;
        }
        for (int j = 0; j < m; j++) kv_pool_ref(s->pool, r->pages[j]);
        r->n_pages = m;
        r->node = node == &s->cache->root ? NULL : node;
        r->n_computed = m * s->pool->cache.page_size;
        if (r->n_preempted == 0) {
            r->n_cached = r->n_computed;
            s->prefix_query_tokens += (uint64_t)r->n_prompt;
            s->prefix_hit_tokens += (uint64_t)r->n_computed;
        }
        q_remove(s->waiting, &s->n_waiting, r);
        r->state = SCHED_RUNNING;
        q_insert(&s->running, &s->n_running, &s->cap_running, r);
        int rem = r->n_tokens - r->n_computed, k = rem < budget ? rem : budget;
        take_pages(s, r, pages_for(s, r->n_computed + k) - r->n_pages);
        plan_add(b, r, k);
        budget -= k;
    }
    plan_build(b);
    return b->n_tokens;
}

void sched_commit(struct sched *s, struct sched_batch *b, const int32_t *sampled) {
    for (int i = 0; i < b->n; i++) b->reqs[i]->n_computed += b->n_new[i];
    for (int j = 0; j < b->n_out; j++) {
        struct sched_req *r = b->reqs[b->out_req[j]];
        int32_t tok = sampled[j];
        if (r->n_tokens == r->cap) {
            r->cap *= 2;
            r->tokens = kiln_realloc(r->tokens, sizeof(int32_t) * (size_t)r->cap);
        }
        r->tokens[r->n_tokens++] = tok;
        int n_gen = r->n_tokens - r->n_prompt;
        enum sched_finish f = SCHED_FINISH_NONE;
        if (r->stop_now || (!r->ignore_eos && is_eos(s, tok))) f = SCHED_FINISH_STOP;
        else if (n_gen >= r->max_new || r->n_tokens >= s->o.max_context) f = SCHED_FINISH_LENGTH;
        if (f != SCHED_FINISH_NONE) {
            retire(s, r, f, 1);
            push_done(b, r);
        } else if (!r->prompt_done) {
            /* the prompt is in: let later requests share it now */
            r->prompt_done = 1;
            cache_pages(s, r);
        }
    }
}

void sched_fail(struct sched *s, struct sched_batch *b) {
    for (int i = 0; i < b->n; i++) {
        struct sched_req *r = b->reqs[i];
        if (r->state == SCHED_DONE) continue;
        retire(s, r, SCHED_FINISH_ABORT, 0); /* the step's KV may be garbage: cache nothing */
        push_done(b, r);
    }
}

void sched_batch_free(struct sched_batch *b) {
    free(b->reqs), free(b->n_new), free(b->tokens), free(b->pos), free(b->out_rows), free(b->out_req), free(b->views);
    free(b->done);
    memset(b, 0, sizeof *b);
}
