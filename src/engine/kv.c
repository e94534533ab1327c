/* kv.c: the KV page pool (see kv.h). */
#include "engine/kv.h"

#include <assert.h>
#include <stdlib.h>

#include "base/base.h"

size_t kv_bytes_per_token(int n_layer, int n_head_kv, int head_dim, enum kiln_dtype dtype) {
    return 2 * (size_t)n_layer * n_head_kv * kv_row_bytes(dtype, head_dim);
}

int kv_pool_init(struct kv_pool *p, struct kiln_backend *be, int n_layer, int n_head_kv, int head_dim, int page_size,
                 int n_pages, enum kiln_dtype dtype, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    if (n_pages <= 0 || page_size <= 0) return kiln_errf(err, errlen, "kv pool: %d pages of %d tokens is empty", n_pages, page_size);
    /* the CPU backend (f32 activations) reads F32, F16, BF16 or Q8_0 rows; CUDA's kernels read BF16 */
    if (be->act_size == 4 ? dtype != KILN_DTYPE_F32 && dtype != KILN_DTYPE_F16 && dtype != KILN_DTYPE_BF16 && dtype != KILN_DTYPE_Q8_0
                          : dtype != KILN_DTYPE_BF16)
        return kiln_errf(err, errlen, "kv pool: the %s backend keeps its KV cache in %s, not %s", be->name,
                         be->act_size == 4 ? "F32, F16, BF16 or Q8_0" : "BF16", dtype_name(dtype));
    if (dtype == KILN_DTYPE_Q8_0 && head_dim % 32)
        return kiln_errf(err, errlen, "kv pool: a Q8_0 cache holds rows of 32-element blocks; head_dim %d is not a multiple of 32",
                         head_dim);
    struct kv_cache *c = &p->cache;
    *c = (struct kv_cache){n_layer, n_head_kv, head_dim, page_size, n_pages, dtype, NULL, NULL};
    p->be = be;
    c->k = kiln_calloc((size_t)n_layer, sizeof *c->k);
    c->v = kiln_calloc((size_t)n_layer, sizeof *c->v);
    size_t bytes = (size_t)n_pages * page_size * n_head_kv * kv_row_bytes(dtype, head_dim);
    for (int l = 0; l < n_layer; l++) {
        c->k[l] = be->alloc(be, bytes);
        c->v[l] = be->alloc(be, bytes);
        if (!c->k[l] || !c->v[l]) {
            kv_pool_free(p);
            return kiln_errf(err, errlen, "kv pool: cannot allocate %d pages (%.1f MiB per layer for K and V) on %s", n_pages,
                             2.0 * bytes / (1 << 20), be->name);
        }
    }
    p->ref = kiln_calloc((size_t)n_pages, sizeof *p->ref);
    p->free_list = kiln_malloc(sizeof *p->free_list * (size_t)n_pages);
    /* the stack pops low page ids first */
    for (int i = 0; i < n_pages; i++) p->free_list[i] = n_pages - 1 - i;
    p->n_free = n_pages;
    return 0;
}

void kv_pool_free(struct kv_pool *p) {
    struct kv_cache *c = &p->cache;
    for (int l = 0; l < c->n_layer; l++) {
        if (c->k && c->k[l]) p->be->free(p->be, c->k[l]);
        if (c->v && c->v[l]) p->be->free(p->be, c->v[l]);
    }
    free(c->k);
    free(c->v);
    free(p->ref);
    free(p->free_list);
    memset(p, 0, sizeof *p);
}

int kv_pool_alloc(struct kv_pool *p, int n, int32_t *out) {
    if (n > p->n_free) return -1;
    for (int i = 0; i < n; i++) {
        int32_t pg = p->free_list[--p->n_free];
        assert(p->ref[pg] == 0);
        p->ref[pg] = 1;
        out[i] = pg;
    }
    return 0;
}

void kv_pool_ref(struct kv_pool *p, int32_t page) {
    assert(page >= 0 && page < p->cache.n_pages && p->ref[page] > 0);
    p->ref[page]++;
}

void kv_pool_release(struct kv_pool *p, int32_t page) {
    assert(page >= 0 && page < p->cache.n_pages && p->ref[page] > 0);
    if (--p->ref[page] == 0) p->free_list[p->n_free++] = page;
}
