/*
 * kv.h: the KV page pool. The storage layout is struct kv_cache
 * (backend.h); this adds the bookkeeping: a free list and a reference count
 * per page, so that pages shared by several sequences (a cached prefix) are
 * freed only when the last holder lets go.
 *
 *   page state:  free (ref 0, on the free list) -> held (ref >= 1)
 *   kv_pool_alloc: free -> ref 1     kv_pool_ref: ref + 1
 *   kv_pool_release: ref - 1, back on the free list at 0
 */
#ifndef KILN_KV_H
#define KILN_KV_H

#include "backend/backend.h"

struct kv_pool {
    struct kv_cache cache;
    struct kiln_backend *be;
    int *ref;       /* [n_pages] */
    int *free_list; /* stack of free page ids */
    int n_free;
};

/* Allocates n_pages pages of page_size tokens for every layer on be.
 * Returns 0, or -1 with err if the backend cannot hold them. */
int kv_pool_init(struct kv_pool *p, struct kiln_backend *be, int n_layer, int n_head_kv, int head_dim, int page_size,
                 int n_pages, enum kiln_dtype dtype, char *err, size_t errlen);
void kv_pool_free(struct kv_pool *p);

/* Takes n free pages into out[]; returns 0, or -1 (nothing taken) if fewer
 * than n are free. */
int kv_pool_alloc(struct kv_pool *p, int n, int32_t *out);
void kv_pool_ref(struct kv_pool *p, int32_t page);
void kv_pool_release(struct kv_pool *p, int32_t page);
static inline int kv_pool_n_free(const struct kv_pool *p) { return p->n_free; }

/* Bytes of KV storage per token (all layers, K and V). */
size_t kv_bytes_per_token(int n_layer, int n_head_kv, int head_dim, enum kiln_dtype dtype);

#endif
