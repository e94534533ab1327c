/*
 * base.h: the small things every module needs, and nothing model-specific.
 *
 *   errors   recoverable errors travel as (char *err, size_t errlen); a
 *            function fills the buffer and returns -1 (or NULL). Library code
 *            never exits; only the CLI does.
 *   logging  kiln_log(level, ...) to stderr, filtered by kiln_log_level.
 *   files    read-only mmap of a whole file (weights are never copied).
 *   time     a monotonic clock in seconds.
 *   numbers  bf16/f16/fp8 <-> f32 conversions, used by loaders and kernels.
 */
#ifndef KILN_BASE_H
#define KILN_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ==== errors ==== */

/* Formats the message into err (if err is not NULL) and returns -1. */
int kiln_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes an existing message with more context, returns -1:
 * "loading model: " + "config.json: missing hidden_size". */
int kiln_err_prefix(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A fatal platform failure (out of memory at start-up): print and abort. */
#define KILN_CHECK(x)                                                          \
    do {                                                                       \
        if (!(x)) kiln_fatal(#x, __FILE__, __LINE__);                          \
    } while (0)
void kiln_fatal(const char *what, const char *file, int line) __attribute__((noreturn));

/* malloc/calloc that abort on failure: for sizes we computed ourselves. */
void *kiln_malloc(size_t n);
void *kiln_calloc(size_t n, size_t size);
void *kiln_realloc(void *p, size_t n);
char *kiln_strdup(const char *s);

/* Memory for weights (base/walloc.c): 64-byte aligned, carved out of
 * shared chunks asked for in 2 MiB pages, so that a decode streams them
 * without 4 KiB page ends; NULL when out of memory (the caller reports it).
 * kiln_wcalloc zeroes. Free with kiln_wfree only. */
void *kiln_walloc(size_t n);
void *kiln_wcalloc(size_t n);
void kiln_wfree(void *p);

/* ==== logging ==== */

enum kiln_log_level { KILN_LOG_ERROR = 0, KILN_LOG_WARN, KILN_LOG_INFO, KILN_LOG_DEBUG };
extern int kiln_log_level;
void kiln_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ==== files ==== */

struct kiln_file {
    char *path;
    const uint8_t *data; /* read-only mapping of the whole file, or NULL if empty */
    size_t size;
};

/* Maps path read-only. The fd is closed once mapped: the mapping stays valid
 * until kiln_file_unmap. Returns 0 or -1 with err filled. */
int kiln_file_map(struct kiln_file *f, const char *path, char *err, size_t errlen);
void kiln_file_unmap(struct kiln_file *f);

/* Reads a whole (small) file into a NUL-terminated malloc'd buffer.
 * Returns NULL with err filled. *len gets the byte count if len is not NULL. */
char *kiln_read_file(const char *path, size_t *len, char *err, size_t errlen);

/* path_join("a/b", "c") -> "a/b/c", malloc'd. */
char *kiln_path_join(const char *dir, const char *name);
int kiln_is_dir(const char *path);
int kiln_file_exists(const char *path);

/* ==== time ==== */

double kiln_now(void); /* seconds, monotonic */
/* the first index of the largest of l[0..n) (n >= 1) */
int32_t kiln_argmax(const float *l, int n);

/* ==== numbers ==== */

static inline float kiln_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch does; NaN stays NaN. */
static inline uint16_t kiln_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float kiln_f16_to_f32(uint16_t h);
uint16_t kiln_f32_to_f16(float f);
/* n bf16 values (f16 = 0) or f16 values (f16 = 1) to f32, exact. avx2: the
 * caller has checked that the CPU runs AVX2 and F16C (x86 only; elsewhere
 * it is ignored). Used for the CUDA backend's logits and the CPU's 16-bit
 * KV rows. */
void kiln_widen16(float *dst, const uint16_t *src, size_t n, int f16, int avx2);
float kiln_fp8e4m3_to_f32(uint8_t b);
uint8_t kiln_f32_to_fp8e4m3(float f);

/* ==== splitmix / xoshiro random numbers (seeded, reproducible) ==== */

struct kiln_rng {
    uint64_t s[4];
};
void kiln_rng_seed(struct kiln_rng *r, uint64_t seed);
/* inline: the dummy-weight fill draws one per parameter */
static inline uint64_t kiln_rng_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static inline uint64_t kiln_rng_next(struct kiln_rng *r) {
    uint64_t *s = r->s;
    uint64_t res = kiln_rng_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = kiln_rng_rotl(s[3], 45);
    return res;
}
/* [0, 1) with 53 random bits */
static inline double kiln_rng_uniform(struct kiln_rng *r) { return (double)(kiln_rng_next(r) >> 11) * 0x1.0p-53; }
float kiln_rng_normal(struct kiln_rng *r);

#endif
