/*
 * radix.h: the prefix cache. A radix tree over token ids at page
 * granularity: every edge is a whole number of KV pages, and a node's key
 * is the tokens of those pages, its value their page ids. Two requests that
 * share a prefix of k full pages share those k pages.
 *
 *   root
 *    +-- [sys prompt: pages 3 4 5] ---+-- [user A: pages 9]      (leaf)
 *    |                                +-- [user B: pages 12 13]  (leaf)
 *    +-- [other prompt: page 7]
 *
 * Ownership (with the page pool's reference counts, kv.h):
 *   - the tree holds ONE reference on every page it stores;
 *   - a request that reuses a matched prefix takes its own reference on
 *     each page and locks the deepest matched node (radix_lock), which
 *     counts one on that node and every ancestor;
 *   - only nodes with lock == 0 are evictable; evicting one drops the tree's
 *     reference, and since nobody else holds an unlocked node's pages, the
 *     pages return to the free list.
 * So at rest (no request running) every page is either free or held by the
 * tree alone, and radix_evict can free all of them.
 *
 * Locks are counted per node along the path, so a split node (below) copies
 * the lock count of the node it was cut from: every lock that covered the
 * whole key covers both halves.
 *
 *   split at page 2 of [a b c | pages 4 5 6]:
 *      parent -- [a b | 4 5] -- [c | 6] -- children...
 *                 lock = L       lock = L
 *
 * Not thread-safe: the engine thread alone uses it.
 */
#ifndef KILN_RADIX_H
#define KILN_RADIX_H

#include <stdint.h>

#include "engine/kv.h"

struct radix_node {
    struct radix_node *parent, *child, *next; /* first child, next sibling */
    int32_t *tokens;                          /* [n_pages * page_size] the edge's key */
    int32_t *pages;                           /* [n_pages] page ids, one pool ref each */
    int n_pages;
    int lock;          /* requests locking this node or a descendant */
    uint64_t last_use; /* the tree's clock at the last match/insert through it */
};

struct radix {
    struct kv_pool *pool;
    int page_size;
    struct radix_node root; /* empty key, never evicted */
    uint64_t clock;
    int n_pages;       /* pages the tree holds */
    int n_evictable;   /* of those, pages in nodes with lock == 0 */
    int n_nodes;
};

void radix_init(struct radix *t, struct kv_pool *pool);
/* Drops every node and the tree's page references (locks must be gone). */
void radix_free(struct radix *t);

/* Longest cached prefix of tokens[0..n_tokens) in whole pages. Writes the
 * page ids to pages[] (room for n_tokens / page_size) and the deepest
 * matched node to *last (the root when nothing matched); returns the number
 * of pages matched. Takes no references and no lock: the caller locks *last
 * and refs the pages if it keeps them. May split a node so that *last ends
 * exactly at the match; touches the matched path's LRU time. */
int radix_match(struct radix *t, const int32_t *tokens, int n_tokens, int32_t *pages, struct radix_node **last);

/* Adds the first n_pages pages of a sequence (tokens[0..n_pages*P),
 * pages[0..n_pages)) to the tree. The caller holds one reference on each of
 * pages[]; after the call it still does, and the tree holds its own:
 *   - where the tree already had the prefix with other pages (computed by
 *     another request), pages[i] is replaced by the tree's page: the
 *     caller's duplicate is released and the tree's page referenced;
 *   - new pages get one extra reference for the tree.
 * *last receives the node ending at page n_pages (for radix_lock). Returns
 * how many of the pages were already cached. */
int radix_insert(struct radix *t, const int32_t *tokens, int n_pages, int32_t *pages, struct radix_node **last);

/* lock + 1 on n and its ancestors (NULL or the root: nothing). */
void radix_lock(struct radix *t, struct radix_node *n);
void radix_unlock(struct radix *t, struct radix_node *n);

/* Evicts least-recently-used unlocked leaves until n_pages pages went back
 * to the free list or nothing is evictable; returns the pages freed. */
int radix_evict(struct radix *t, int n_pages);

/* Checks the tree's invariants (counts, locks, refs >= 1); returns 0 when
 * they hold, else -1 with a message in err. For tests. */
int radix_check(const struct radix *t, char *err, size_t errlen);

#endif
