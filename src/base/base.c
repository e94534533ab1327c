/*
 * base.c: errors, logging, file mapping, clock, number conversions, random
 * numbers. See base.h for the contracts.
 */
#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ==== errors ==== */

int kiln_errf(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int kiln_err_prefix(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return -1;
    char pre[512], old[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    snprintf(old, sizeof old, "%s", err);
    snprintf(err, errlen, "%s%s", pre, old);
    return -1;
}

void kiln_fatal(const char *what, const char *file, int line) {
    fprintf(stderr, "kiln: fatal: %s failed at %s:%d\n", what, file, line);
    abort();
}

void *kiln_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) kiln_fatal("malloc", __FILE__, __LINE__);
    return p;
}

void *kiln_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) kiln_fatal("calloc", __FILE__, __LINE__);
    return p;
}

void *kiln_realloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) kiln_fatal("realloc", __FILE__, __LINE__);
    return p;
}

char *kiln_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = kiln_malloc(n);
    memcpy(d, s, n);
    return d;
}

/* ==== logging ==== */

int kiln_log_level = KILN_LOG_WARN;

void kiln_log(int level, const char *fmt, ...) {
    if (level > kiln_log_level) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "kiln: %s: ", names[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ==== files ==== */

int kiln_file_map(struct kiln_file *f, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return kiln_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kiln_errf(err, errlen, "%s: not a regular file", path);
    }
    f->size = (size_t)st.st_size;
    if (f->size > 0) {
        void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return kiln_errf(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
        }
        f->data = p;
    }
    close(fd); /* the mapping keeps its own reference to the file */
    f->path = kiln_strdup(path);
    return 0;
}

void kiln_file_unmap(struct kiln_file *f) {
    if (f->data) munmap((void *)f->data, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

char *kiln_read_file(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        kiln_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = kiln_malloc(cap);
    for (;;) {
        if (n + 1 >= cap) buf = kiln_realloc(buf, cap *= 2);
        size_t r = fread(buf + n, 1, cap - n - 1, fp);
        if (r == 0) break;
        n += r;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        kiln_errf(err, errlen, "%s: read error", path);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

char *kiln_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = kiln_malloc(a + b + 2);
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}

int kiln_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int kiln_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* ==== time ==== */

double kiln_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ==== numbers ==== */

static void widen16_plain(float *dst, const uint16_t *src, size_t n, int f16) {
    for (size_t i = 0; i < n; i++) dst[i] = f16 ? kiln_f16_to_f32(src[i]) : kiln_bf16_to_f32(src[i]);
}

#if defined(__x86_64__)
/* bf16: 16 values per step; each 128-bit lane interleaves zeros below its 8
 * values (elements 0-3 and 8-11 in lo, 4-7 and 12-15 in hi), and the lane
 * permutes put them back in order. One CUDA decode step's 152k logits on
 * the H200 machine's host: 83-90 us with the compiler's SSE2 loop, 22-52
 * us with this (docs/cuda.md). f16: the F16C conversion, 8 per step. */
__attribute__((target("avx2,f16c"))) static void widen16_avx2(float *dst, const uint16_t *src, size_t n, int f16) {
    size_t i = 0;
    if (f16)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    else {
        const __m256i z = _mm256_setzero_si256();
        for (; i + 16 <= n; i += 16) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
            const __m256i lo = _mm256_unpacklo_epi16(z, a), hi = _mm256_unpackhi_epi16(z, a);
            _mm256_storeu_si256((__m256i *)(dst + i), _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(dst + i + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
        }
    }
    widen16_plain(dst + i, src + i, n - i, f16);
}
#endif

void kiln_widen16(float *dst, const uint16_t *src, size_t n, int f16, int avx2) {
#if defined(__x86_64__)
    if (avx2) {
        widen16_avx2(dst, src, n, f16);
        return;
    }
#endif
    (void)avx2;
    widen16_plain(dst, src, n, f16);
}

float kiln_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t kiln_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffff;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into exp: correct */
    return (uint16_t)h;
}

/* e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities, S.1111.111 is NaN. */
float kiln_fp8e4m3_to_f32(uint8_t b) {
    int sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 7;
    float v;
    if (exp == 0xf && man == 7) return NAN;
    if (exp == 0)
        v = ldexpf((float)man / 8.0f, -6);
    else
        v = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return sign ? -v : v;
}

/* Round to nearest even, saturating at 448 (as torch's float8_e4m3fn cast of
 * finite values does when the caller clamps first). */
uint8_t kiln_f32_to_fp8e4m3(float f) {
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (isnan(f)) return 0x7f;
    if (a >= 448.0f) return sign | 0x7e;
    /* brute force over the 127 non-negative codes is simple and exact */
    uint8_t best = 0;
    float bestd = INFINITY;
    for (int c = 0; c < 0x7f; c++) {
        float d = fabsf(kiln_fp8e4m3_to_f32((uint8_t)c) - a);
        if (d < bestd || (d == bestd && (c & 1) == 0 && (best & 1))) {
            bestd = d;
            best = (uint8_t)c;
        }
    }
    return sign | best;
}

/* ==== random numbers: xoshiro256** seeded by splitmix64 ==== */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kiln_rng_seed(struct kiln_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}


float kiln_rng_normal(struct kiln_rng *r) {
    double u1 = kiln_rng_uniform(r), u2 = kiln_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* The first index of the largest value. Eight independent lanes (lane j
 * sees indices = j mod 8) so the compares do not wait on one another; each
 * lane keeps its first maximum, and the merge prefers the lower index on
 * ties: the same answer as the plain loop, at a fraction of its time on a
 * 152k vocabulary (it runs once per row per decode step). */
int32_t kiln_argmax(const float *l, int n) {
    if (n < 16) {
        int32_t b = 0;
        for (int i = 1; i < n; i++)
            if (l[i] > l[b]) b = i;
        return b;
    }
    float m[8];
    int32_t at[8];
    for (int j = 0; j < 8; j++) m[j] = l[j], at[j] = j;
    int i = 8;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            if (l[i + j] > m[j]) m[j] = l[i + j], at[j] = i + j;
    int32_t b = at[0];
    for (int j = 1; j < 8; j++)
        if (m[j] > l[b] || (m[j] == l[b] && at[j] < b)) b = at[j];
    for (; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}
