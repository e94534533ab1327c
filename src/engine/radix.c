/*
 * radix.c: the prefix cache (see radix.h for the ownership rules).
 *
 * Children are a singly linked list keyed by their first page of tokens: a
 * node has few children in practice (distinct continuations of one
 * prefix), and a page of 16 ids compares in one memcmp. Eviction scans the
 * tree for the least recently used unlocked leaf each time it frees one;
 * the tree holds at most one node per cached page, so the scan is bounded
 * by the pool size and runs only when the pool is short.
 */
#include "engine/radix.h"

#include <assert.h>
#include <stdlib.h>

#include "base/base.h"

/* ==== helpers ==== */

static int page_eq(const struct radix *t, const int32_t *a, const int32_t *b) {
    return !memcmp(a, b, sizeof(int32_t) * (size_t)t->page_size);
}

static struct radix_node *find_child(const struct radix *t, const struct radix_node *n, const int32_t *page) {
    for (struct radix_node *c = n->child; c; c = c->next)
        if (page_eq(t, c->tokens, page)) return c;
    return NULL;
}

/* How many leading pages of c's key equal tokens[0..n_pages*P). */
static int common_pages(const struct radix *t, const struct radix_node *c, const int32_t *tokens, int n_pages) {
    const int P = t->page_size;
    int k = 0;
    while (k < c->n_pages && k < n_pages && page_eq(t, c->tokens + (size_t)k * P, tokens + (size_t)k * P)) k++;
    return k;
}

static struct radix_node *node_new(const struct radix *t, const int32_t *tokens, const int32_t *pages, int n_pages) {
    struct radix_node *n = kiln_calloc(1, sizeof *n);
    n->tokens = kiln_malloc(sizeof(int32_t) * (size_t)n_pages * t->page_size);
    n->pages = kiln_malloc(sizeof(int32_t) * (size_t)n_pages);
    memcpy(n->tokens, tokens, sizeof(int32_t) * (size_t)n_pages * t->page_size);
    memcpy(n->pages, pages, sizeof(int32_t) * (size_t)n_pages);
    n->n_pages = n_pages;
    return n;
}

static void node_free(struct radix_node *n) {
    free(n->tokens);
    free(n->pages);
    free(n);
}

/* Cuts c after its first k pages (0 < k < c->n_pages): a new node m takes
 * the first k pages and takes c's place under the parent; c keeps the rest
 * as m's only child. Returns m. Page ownership does not change. */
static struct radix_node *split(struct radix *t, struct radix_node *c, int k) {
    assert(k > 0 && k < c->n_pages);
    const int P = t->page_size;
    struct radix_node *m = node_new(t, c->tokens, c->pages, k);
    m->lock = c->lock;
    m->last_use = c->last_use;
    m->parent = c->parent;
    /* m replaces c in the parent's child list */
    struct radix_node **pp = &c->parent->child;
    while (*pp != c) pp = &(*pp)->next;
    *pp = m;
    m->next = c->next;
    m->child = c;
    c->next = NULL;
    c->parent = m;
    /* c keeps pages k.. */
    int rest = c->n_pages - k;
    memmove(c->tokens, c->tokens + (size_t)k * P, sizeof(int32_t) * (size_t)rest * P);
    memmove(c->pages, c->pages + k, sizeof(int32_t) * (size_t)rest);
    c->n_pages = rest;
    t->n_nodes++;
    return m;
}

/* Pre-order successor without a stack (child, then sibling, then an
 * ancestor's sibling); NULL after the last node. */
static struct radix_node *next_node(const struct radix *t, struct radix_node *n) {
    if (n->child) return n->child;
    while (n && n != &t->root) {
        if (n->next) return n->next;
        n = n->parent;
    }
    return NULL;
}

/* ==== public ==== */

void radix_init(struct radix *t, struct kv_pool *pool) {
    memset(t, 0, sizeof *t);
    t->pool = pool;
    t->page_size = pool->cache.page_size;
}

void radix_free(struct radix *t) {
    /* post-order: free the deepest first */
    struct radix_node *n = t->root.child;
    while (n) {
        if (n->child) {
            n = n->child;
            continue;
        }
        struct radix_node *up = n->parent, *nx = n->next;
        for (int i = 0; i < n->n_pages; i++) kv_pool_release(t->pool, n->pages[i]);
        up->child = nx;
        node_free(n);
        n = nx ? nx : (up == &t->root ? NULL : up);
    }
    t->root.child = NULL;
    t->n_pages = t->n_evictable = t->n_nodes = 0;
}

int radix_match(struct radix *t, const int32_t *tokens, int n_tokens, int32_t *pages, struct radix_node **last) {
    const int P = t->page_size, n_full = n_tokens / P;
    struct radix_node *node = &t->root;
    int i = 0;
    t->root.last_use = ++t->clock;
    while (i < n_full) {
        struct radix_node *c = find_child(t, node, tokens + (size_t)i * P);
        if (!c) break;
        int k = common_pages(t, c, tokens + (size_t)i * P, n_full - i), whole = k == c->n_pages;
        memcpy(pages + i, c->pages, sizeof(int32_t) * (size_t)k);
        if (!whole) c = split(t, c, k);
        c->last_use = t->clock;
        node = c;
        i += k;
        if (!whole) break;
    }
    *last = node;
    return i;
}

int radix_insert(struct radix *t, const int32_t *tokens, int n_pages, int32_t *pages, struct radix_node **last) {
    const int P = t->page_size;
    struct radix_node *node = &t->root;
    int i = 0, cached = 0;
    t->root.last_use = ++t->clock;
    while (i < n_pages) {
        struct radix_node *c = find_child(t, node, tokens + (size_t)i * P);
        if (!c) { /* a new leaf for the rest; the tree refs its pages */
            c = node_new(t, tokens + (size_t)i * P, pages + i, n_pages - i);
            for (int j = 0; j < c->n_pages; j++) kv_pool_ref(t->pool, c->pages[j]);
            c->parent = node;
            c->next = node->child;
            node->child = c;
            c->last_use = t->clock;
            t->n_pages += c->n_pages;
            t->n_evictable += c->n_pages; /* a new leaf is unlocked */
            t->n_nodes++;
            node = c;
            break;
        }
        int k = common_pages(t, c, tokens + (size_t)i * P, n_pages - i);
        if (k < c->n_pages) c = split(t, c, k);
        /* the tree already has these pages: the caller switches to them */
        for (int j = 0; j < k; j++)
            if (c->pages[j] != pages[i + j]) {
                kv_pool_release(t->pool, pages[i + j]);
                kv_pool_ref(t->pool, c->pages[j]);
                pages[i + j] = c->pages[j];
            }
        c->last_use = t->clock;
        cached += k;
        node = c;
        i += k;
    }
    *last = node;
    return cached;
}

void radix_lock(struct radix *t, struct radix_node *n) {
    for (; n && n != &t->root; n = n->parent)
        if (n->lock++ == 0) t->n_evictable -= n->n_pages;
}

void radix_unlock(struct radix *t, struct radix_node *n) {
    for (; n && n != &t->root; n = n->parent) {
        assert(n->lock > 0);
        if (--n->lock == 0) t->n_evictable += n->n_pages;
    }
}

int radix_evict(struct radix *t, int n_pages) {
    int freed = 0;
    while (freed < n_pages) {
        struct radix_node *lru = NULL;
        for (struct radix_node *n = t->root.child; n; n = next_node(t, n))
            if (!n->child && n->lock == 0 && (!lru || n->last_use < lru->last_use)) lru = n;
        if (!lru) break;
        for (int i = 0; i < lru->n_pages; i++) {
            kv_pool_release(t->pool, lru->pages[i]);
            freed += t->pool->ref[lru->pages[i]] == 0;
        }
        t->n_pages -= lru->n_pages;
        t->n_evictable -= lru->n_pages;
        t->n_nodes--;
        struct radix_node **pp = &lru->parent->child;
        while (*pp != lru) pp = &(*pp)->next;
        *pp = lru->next;
        node_free(lru);
    }
    return freed;
}

int radix_check(const struct radix *t, char *err, size_t errlen) {
    int pages = 0, evictable = 0, nodes = 0;
    for (struct radix_node *n = t->root.child; n; n = next_node(t, n)) {
        nodes++;
        pages += n->n_pages;
        if (n->lock == 0) evictable += n->n_pages;
        if (n->n_pages <= 0) return kiln_errf(err, errlen, "radix: a node with %d pages", n->n_pages);
        int child_locks = 0;
        for (struct radix_node *c = n->child; c; c = c->next) child_locks += c->lock;
        if (n->lock < child_locks) return kiln_errf(err, errlen, "radix: lock %d below its children's %d", n->lock, child_locks);
        for (int i = 0; i < n->n_pages; i++)
            if (t->pool->ref[n->pages[i]] < 1) return kiln_errf(err, errlen, "radix: page %d has no reference", n->pages[i]);
        for (struct radix_node *c = n->child; c; c = c->next)
            for (struct radix_node *d = c->next; d; d = d->next)
                if (page_eq(t, c->tokens, d->tokens)) return kiln_errf(err, errlen, "radix: two children share a first page");
    }
    if (pages != t->n_pages) return kiln_errf(err, errlen, "radix: %d pages counted, %d recorded", pages, t->n_pages);
    if (evictable != t->n_evictable)
        return kiln_errf(err, errlen, "radix: %d evictable pages counted, %d recorded", evictable, t->n_evictable);
    if (nodes != t->n_nodes) return kiln_errf(err, errlen, "radix: %d nodes counted, %d recorded", nodes, t->n_nodes);
    return 0;
}
