/*
 * sched.h: the continuous-batching scheduler. It decides, step by step,
 * which requests run and how many tokens each appends, owns their KV pages
 * (through the pool and the radix prefix cache), and applies the stop
 * conditions that need no text (EOS, max_new, the context, and the
 * caller's stop_now flag: a stop token id, a completed JSON object). It
 * never runs the model and never samples: the caller (serve_engine.c, or a
 * test with synthetic tokens) does
 *
 *     sched_schedule(s, &b)  ->  forward b, sample b.n_out rows  ->  sched_commit(s, &b, sampled)
 *
 * A request's tokens are its prompt followed by what it generated; the
 * first n_computed of them have KV in its pages. Every step it appends
 * tokens[n_computed .. n_computed + k): k = 1 for a decoding request
 * (only the last sampled token is missing), a chunk of the prompt for a
 * prefilling one. When the step reaches the end of tokens, that row's
 * logits are sampled and the new token appended. So prefill, decode and
 * recompute after preemption are one rule.
 *
 * Each step:
 *   1. decode tokens always ride along (one per decoding request);
 *   2. prefilling requests take chunks from the per-step token budget
 *      (chunk - decode tokens), oldest first;
 *   3. waiting requests are admitted FCFS while the budget, max_running and
 *      the pages (free + evictable cache, minus a page of headroom per
 *      running request) allow; admission reuses the longest cached prefix;
 *   4. pages for the step are taken from the free list, evicting unlocked
 *      cache; if even that is short, the newest running request is
 *      preempted: its pages are freed and it goes back to waiting, to be
 *      recomputed from its tokens later (its sampled tokens are kept).
 *
 * Page bookkeeping of one running request (P = page size):
 *
 *   tokens:  |<------ n_prompt ------>|<-- generated -->|
 *   KV:      |<------------ n_computed ------------>|   (last token pending)
 *   pages:   [ locked prefix  | own, full | own, full | own, partial ]
 *            |<- from radix ->|
 *            node = deepest locked radix node (covers the first pages)
 *
 *   - the locked prefix pages are shared with the tree (one ref each held
 *     by the request, one by the tree);
 *   - when the prompt is done and when the request finishes, its full pages
 *     are inserted into the tree (radix_insert), the new deepest node is
 *     locked and the old one unlocked;
 *   - on finish, abort or preemption every page reference is released and
 *     the lock dropped: what the tree holds stays cached (evictable), the
 *     rest returns to the free list.
 *
 * Not thread-safe: one thread (the engine's) drives it.
 */
#ifndef KILN_SCHED_H
#define KILN_SCHED_H

#include <stdint.h>

#include "engine/kv.h"
#include "engine/radix.h"

enum sched_state { SCHED_NEW, SCHED_WAITING, SCHED_RUNNING, SCHED_DONE };
enum sched_finish { SCHED_FINISH_NONE, SCHED_FINISH_STOP, SCHED_FINISH_LENGTH, SCHED_FINISH_ABORT };

struct sched_req {
    uint64_t id;          /* arrival order (set by sched_add) */
    int32_t *tokens;      /* [cap] prompt then generated */
    int n_tokens, cap;
    int n_prompt;
    int max_new;          /* stop after this many generated tokens */
    int ignore_eos;
    int n_computed;       /* tokens with KV in pages */
    int32_t *pages;       /* [cap_pages] page table */
    int n_pages, cap_pages;
    struct radix_node *node; /* locked radix prefix, or NULL */
    int n_cached;         /* prompt tokens found in the prefix cache at first admission */
    int n_preempted;      /* times preempted */
    int prompt_done;      /* the prompt's pages were offered to the cache */
    int urgent;           /* queue ahead of everything waiting (health canary) */
    int stop_now;         /* set by the caller before sched_commit: the token it sampled ends the
                           * request (a stop token id, a completed JSON value) */
    enum sched_state state;
    enum sched_finish finish;
    void *user;           /* the caller's request */
};

struct sched_opts {
    int max_running; /* most running requests (0: 256) */
    int chunk;       /* per-step token budget (0: 512) */
    int max_context; /* most tokens in one sequence (prompt + generated) */
    const int32_t *eos; /* EOS ids */
    int n_eos;
};

struct sched {
    struct sched_opts o;
    struct kv_pool *pool;
    struct radix *cache;
    struct sched_req **waiting, **running; /* both sorted by id */
    int n_waiting, n_running, cap_waiting, cap_running;
    uint64_t next_id, next_urgent_id;
    /* counters */
    uint64_t n_preemptions, prefix_query_tokens, prefix_hit_tokens;
};

/* One step's plan: reqs[i] appends n_new[i] tokens; the flattened batch
 * arrays are filled for model_forward. Rows listed in out_rows are sampled,
 * out_req[j] is the index in reqs of out row j. Arrays are owned by the
 * batch and reused across steps. */
struct sched_batch {
    int n;
    struct sched_req **reqs;
    int *n_new;
    int n_tokens, n_out;
    int32_t *tokens, *pos, *out_rows, *out_req;
    struct kiln_seq_view *views;
    int cap_reqs, cap_tokens;
    /* requests that ended during the last commit or schedule (finished,
     * aborted): the caller reports and frees them */
    struct sched_req **done;
    int n_done, cap_done;
};

void sched_init(struct sched *s, const struct sched_opts *o, struct kv_pool *pool, struct radix *cache);
/* Aborts whatever is left (their pages released) and frees the queues. */
void sched_free(struct sched *s);

/* Prepares r for the queue: copies the prompt. The caller fills max_new,
 * ignore_eos, user. r must stay valid until it comes back in batch.done. */
void sched_req_init(struct sched_req *r, const int32_t *prompt, int n_prompt);
void sched_req_free(struct sched_req *r);

/* Appends r to the waiting queue (at its head when r->urgent). */
void sched_add(struct sched *s, struct sched_req *r);

/* Removes r from whichever queue holds it, releases its pages (its full
 * computed pages stay in the prefix cache) and marks it SCHED_DONE with
 * SCHED_FINISH_ABORT. */
void sched_abort(struct sched *s, struct sched_req *r);

/* Plans one step into b (b->done is cleared first). Returns the number of
 * tokens in the step (0: nothing runs). */
int sched_schedule(struct sched *s, struct sched_batch *b);

/* After the forward: the step's tokens are in the cache; sampled[j] is the
 * token drawn for out row j. Appends them, applies the stop conditions and
 * retires finished requests (pages released, full pages left in the
 * cache); they are listed in b->done. */
void sched_commit(struct sched *s, struct sched_batch *b, const int32_t *sampled);

/* The step failed (the forward returned an error): the step's requests are
 * aborted (listed in b->done) so that nothing waits forever. */
void sched_fail(struct sched *s, struct sched_batch *b);

void sched_batch_free(struct sched_batch *b);

static inline int sched_idle(const struct sched *s) { return s->n_waiting == 0 && s->n_running == 0; }

#endif
