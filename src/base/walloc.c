/*
 * walloc.c: memory for weights, in 2 MiB pages.
 *
 * A decode reads every weight once per token, front to back, so how the
 * weights sit in memory matters as much as the loop that reads them. In
 * 4 KiB pages the CPU's hardware prefetchers stop at every page end and
 * every 4 KiB is a TLB miss; in 2 MiB pages neither happens (docs/cpu.md,
 * "Weights in 2 MiB pages"). Linux gives 2 MiB pages to anonymous memory
 * when asked (MADV_HUGEPAGE; hosts often set THP to `madvise`), but only
 * for whole, aligned 2 MiB runs: a 1 MB matrix on its own never gets one.
 *
 * So weight buffers are carved, 64-byte aligned, out of shared chunks of
 * WCHUNK bytes, each WCHUNK-aligned and asked for in 2 MiB pages. A chunk
 * starts with a header that counts its live buffers; a buffer finds its
 * chunk by masking its address, and the chunk is freed when its count
 * drops to zero and it is no longer the one being filled. A buffer too big
 * for a chunk gets a region of its own, laid out the same way (header,
 * then the buffer), so kiln_wfree treats both alike.
 *
 * Under AddressSanitizer every buffer is a plain allocation of its exact
 * size, so that an overrun of one is caught rather than landing in the
 * next. A chunk's unused end is never touched, so it is not resident
 * (but for the 2 MiB page the last buffer ends in).
 *
 * Used for the model's own weights (model/load.c). Not for the CPU
 * backend's GPTQ repack (format/gptq.c): its codes in these chunks read
 * 50 / 64 / 72 / 80% of the probe at 0.3-19 MB (`gemv-bench gptq-int4`,
 * Zen 3, builds alternated 4 times) against 52 / 70 / 84 / 88% in their
 * own 4 KiB-page mappings, and whole 0.6B decodes tied (six pairs).
 * Not explained yet: power-of-two strides sharing DRAM banks once the
 * pages are physically contiguous would fit, but BF16 rows (also a power
 * of two wide) gained from the same pages.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"

enum { WCHUNK = 32 << 20, WHEAD = 64 };

struct whead {
    size_t live; /* buffers carved from this region and not freed */
};

#if !defined(__SANITIZE_ADDRESS__)
static pthread_mutex_t wlock = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *wcur; /* the chunk being filled, or NULL */
static size_t wused;  /* its bytes handed out, the header included */

static uint8_t *wregion(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, WCHUNK, bytes)) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes / ((size_t)2 << 20) * ((size_t)2 << 20), MADV_HUGEPAGE); /* advice only: 4 KiB pages if refused */
#endif
    ((struct whead *)p)->live = 0;
    return p;
}
#endif

void *kiln_walloc(size_t n) {
#if defined(__SANITIZE_ADDRESS__)
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 1) ? NULL : p;
#else
    n = n ? (n + 63) / 64 * 64 : 64;
    if (n > WCHUNK - WHEAD) { /* a region of its own */
        uint8_t *r = wregion(WHEAD + n);
        if (!r) return NULL;
        ((struct whead *)r)->live = 1;
        return r + WHEAD;
    }
    pthread_mutex_lock(&wlock);
    if (!wcur || wused + n > WCHUNK) {
        uint8_t *r = wregion(WCHUNK);
        if (!r) {
            pthread_mutex_unlock(&wlock);
            return NULL;
        }
        uint8_t *old = wcur;
        wcur = r, wused = WHEAD;
        if (old && ((struct whead *)old)->live == 0) free(old); /* emptied while it was being filled */
    }
    uint8_t *p = wcur + wused;
    wused += n;
    ((struct whead *)wcur)->live++;
    pthread_mutex_unlock(&wlock);
    return p;
#endif
}

void *kiln_wcalloc(size_t n) {
    void *p = kiln_walloc(n);
    if (p) memset(p, 0, n);
    return p;
}

void kiln_wfree(void *p) {
    if (!p) return;
#if defined(__SANITIZE_ADDRESS__)
    free(p);
#else
    uint8_t *r = (uint8_t *)((uintptr_t)p & ~(uintptr_t)(WCHUNK - 1));
    pthread_mutex_lock(&wlock);
    const size_t live = --((struct whead *)r)->live;
    if (live == 0 && r != wcur) free(r);
    pthread_mutex_unlock(&wlock);
#endif
}
