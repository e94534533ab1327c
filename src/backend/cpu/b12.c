/*
 * b12.c: BF16 weights in 12 bits, losslessly, for the CPU's decode GEMV.
 *
 * At batch 1 a decode step reads every weight once, and with 16-bit
 * weights the step is as fast as memory: the only way to go faster is to
 * read fewer bytes. A bf16 is a high byte (the sign and the exponent's top
 * 7 bits) and a low byte (the exponent's last bit and 7 mantissa bits).
 * The low byte is close to random; the high byte is not: within a block of
 * 64 weights of a trained matrix the exponents span a few binades, so its
 * 7 exponent bits are, almost always, one of 8 values above the block's
 * smallest. So a block of 64 is stored as:
 *
 *   base   1 byte: the smallest (high byte & 0x7F) in the block, or 0xFF
 *          for a block that does not fit (an escape, below)
 *   L[64]  the low bytes
 *   C[32]  4-bit codes, code = sign << 3 | ((high byte & 0x7F) - base)
 *
 * 97 bytes per 64 weights (12.1 bits), exact for every bit pattern (NaN,
 * infinities, subnormals and zeros included). A block whose exponents span
 * more than 8 values of (high byte & 0x7F) keeps its 64 bf16 as they are
 * in a separate array; the block's first 8 bytes hold the distance in
 * bytes from the block to them (a self-relative pointer, so the kernels
 * need no second base address). Normal weights of any scale escape about
 * 0.5% of blocks (a value 2^16 below the block's largest), an all-zero
 * block never.
 *
 * A row is its nb = n_in / 64 base bytes (padded to 8), then its nb
 * blocks of 96 bytes (L then C). Inside a block the bytes are placed so
 * that the x86 decode needs no shuffle of x: weight p = 16 v + 4 l + m
 * (v, l, m < 4) has its low byte at L[16 l + 8 (v >> 1) + 2 m + (v & 1)]
 * and its code in the low nibble of C[i] for L index i < 32, the high
 * nibble of C[i - 32] above. Decoding 64 weights on AVX-512 is then:
 * codes = (C & 15 | C >> 4 & 15) as 64 bytes, high bytes = vpshufb of a
 * 16-byte table (base + 0..7, with and without the sign bit) by the codes,
 * bf16 words = vpunpck{l,h}bw of L with them, and f32 = the even words
 * shifted up 16 bits and the odd words masked in place: four vectors
 * holding weights 0-15, 16-31, 32-47, 48-63 in order. On AVX2 the same
 * bytes in two 32-byte halves give weights 0-7, 16-23, 32-39, 48-55 (first
 * half) and 8-15, 24-31, 40-47, 56-63 (second half). Per 64 weights: two
 * vpshufb, four vpunpck, eight shifts or masks, a broadcast and an add
 * (until a shift / mask replaced them, eight more vpunpck*wd: the same
 * speed on a Zen 4, whose bound here is not known; docs/cpu.md). With
 * VBMI the codes take one vpmultishiftqb and the table one vpermb
 * (dec_avx512v): 1.033x the whole 0.6B decode on a Zen 4.
 *
 * Numerics do not move: each kernel here adds the same products into the
 * same accumulators in the same order as the plain BF16 kernel of its
 * instruction set (matmul.c: AVX-512 2 zmm accumulators per row over steps
 * of 32, AVX2 4 ymm over steps of 32, scalar one running sum), so a row
 * stored in 12 bits gives the same bits as the row stored as BF16
 * (tests/test_b12.c holds them to it). Rows whose n_in is not a multiple
 * of 64 stay BF16, and so does a linear whose escapes would leave it less
 * than 10% smaller (cpu.c).
 *
 * On AArch64 the low bytes are in weight order instead (b12_pos), the
 * codes' nibbles as above: vqtbl1q looks the codes up, vzip1q / vzip2q of
 * L with the high bytes give bf16 words in order, shll #16 widens them
 * (gemv1_b12_neon, with the NEON BF16 loop's accumulators: 8 x 4 lanes
 * over steps of 32).
 *
 * Where: x86 (AVX2 or AVX-512 kernels) and AArch64 (NEON; the scalar path
 * decodes a block at a time on both), dense BF16 linears, made at load
 * (cpu.c's prepare); the stored BF16 is then dropped (qlinear.repacked).
 * KILN_CPU_B12=0 keeps BF16. The prefill GEMM decodes its weight panels
 * from the same bytes (matmul.c). The layout exists only in memory: it is
 * made at every load, so x86 and AArch64 need not agree on it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/gemv.h"
#include "backend/cpu/qmatmul_internal.h"
#include "base/base.h"

/* L index of weight p of a block: x86's order (above); elsewhere weight
 * order, which the NEON decode wants (vzip of L with the high bytes gives
 * bf16 words in order) */
#if defined(KILN_X86)
static inline int b12_pos(int p) { return ((p >> 2) & 3) * 16 + ((p >> 5) & 1) * 8 + (p & 3) * 2 + ((p >> 4) & 1); }
#else
static inline int b12_pos(int p) { return p; }
#endif

static inline size_t b12_head(int nb) { return ((size_t)nb + 7) & ~(size_t)7; }

size_t cpu_b12_row_bytes(int n_in) { return b12_head(n_in / B12_K) + (size_t)B12_BB * (size_t)(n_in / B12_K); }

int cpu_b12_on(void) {
#if defined(KILN_X86) || defined(KILN_NEON)
    const char *e = getenv("KILN_CPU_B12");
    return !(e && !strcmp(e, "0"));
#else
    return 0; /* no vector kernels for it elsewhere */
#endif
}

/* The AVX2 kernel's prefetch distance at batch 1 (bytes, 0 none). On an
 * AMD CPU with AVX-512, where the 16-bit loops and the AVX-512 12-bit loop
 * stream fastest with none (cpu_gemv_pfd), the AVX2 12-bit loop wants one:
 * held to AVX2 on a Zen 4, 2 KiB ahead decoded 1.7B 1.28x and 0.6B 1.32x
 * faster (1-4 KiB alike), where the BF16 AVX2 loop lost 13% with it and the
 * AVX-512 12-bit loop 13% (`decode-ab model M gemv-pfd 0 2048`). Elsewhere
 * cpu_gemv_pfd(). KILN_CPU_B12_PFD=N forces N; chosen once, before any
 * pool job. */
static int b12_pfd = -1;

int cpu_b12_pfd(void) {
    if (b12_pfd < 0) b12_pfd = cpu_pfd_env(cpu_amd_avx512() ? 2048 : cpu_gemv_pfd(), "KILN_CPU_B12_PFD");
    return b12_pfd;
}

int cpu_set_b12_pfd(int d) { return b12_pfd = cpu_pfd_lines(d); }

/* whether the AVX2 12-bit loop takes pairs of rows half the run apart at
 * batch 1 (rows2_b12_avx2); KILN_CPU_B12_PAIRS2=0 / 1 */
static int b12_pairs2 = -1;

int cpu_b12_pairs2(void) {
    if (b12_pairs2 < 0) {
        const char *e = getenv("KILN_CPU_B12_PAIRS2");
        b12_pairs2 = e ? atoi(e) != 0 : 1;
    }
    return b12_pairs2;
}

int cpu_set_b12_pairs2(int on) { return b12_pairs2 = on != 0; }

/* whether the AVX-512 kernels decode with VBMI (dec_avx512v): where the
 * CPU has it, unless KILN_CPU_B12_VBMI=0 */
static int b12_vbmi = -1;

static int have_vbmi(void) {
#if defined(KILN_X86)
    return qm_have_vbmi();
#else
    return 0;
#endif
}

int cpu_b12_vbmi(void) {
    if (b12_vbmi < 0) {
        const char *e = getenv("KILN_CPU_B12_VBMI");
        b12_vbmi = have_vbmi() && !(e && !strcmp(e, "0"));
    }
    return b12_vbmi;
}

int cpu_set_b12_vbmi(int on) { return b12_vbmi = on && have_vbmi(); }

/* ==== the encoder ==== */

/* the block's base, or -1 when its exponents do not fit 8 codes */
static int block_base(const uint16_t *w) {
    int mn = 0x7F, mx = 0;
    for (int p = 0; p < B12_K; p++) {
        const int h = (w[p] >> 8) & 0x7F;
        mn = h < mn ? h : mn;
        mx = h > mx ? h : mx;
    }
    return mx - mn <= 7 ? mn : -1;
}

/* block v (64 bf16) into blk (96 bytes): its base, or -1 (nothing written) */
static int enc_block(const uint16_t *v, uint8_t *blk) {
    const int base = block_base(v);
    if (base < 0) return -1;
    memset(blk + B12_K, 0, B12_BB - B12_K);
    for (int p = 0; p < B12_K; p++) {
        const int i = b12_pos(p), code = (v[p] >> 12 & 8) | (((v[p] >> 8) & 0x7F) - base);
        blk[i] = (uint8_t)v[p];
        blk[B12_K + (i & 31)] |= (uint8_t)(i < 32 ? code : code << 4);
    }
    return base;
}

#if defined(KILN_X86)
/* 64 bytes in weight order (n[0]: weights 0-31, n[1]: 32-63) -> the
 * layout's order, as four 16-byte pieces (b12_pos: weight 16 v + 4 l + m
 * at 16 l + 8 (v >> 1) + 2 m + (v & 1)). Weights 16 v + 4 l + m for v = 2 vh
 * and 2 vh + 1 sit in the two 128-bit halves of n[vh]; vpunpck{l,h}bw of
 * the halves interleaves them (bytes 2 (4 l + m) + (v & 1)), and
 * vpunpck{l,h}qdq of the two vh puts each l's 8 + 8 bytes in a piece. */
KILN_AVX2 static inline void reorder(const __m256i n[2], __m128i out[4]) {
    __m128i ul[2], uh[2];
    for (int vh = 0; vh < 2; vh++) {
        const __m128i a = _mm256_castsi256_si128(n[vh]), b = _mm256_extracti128_si256(n[vh], 1);
        ul[vh] = _mm_unpacklo_epi8(a, b), uh[vh] = _mm_unpackhi_epi8(a, b); /* l = 0, 1 / l = 2, 3 */
    }
    out[0] = _mm_unpacklo_epi64(ul[0], ul[1]), out[1] = _mm_unpackhi_epi64(ul[0], ul[1]);
    out[2] = _mm_unpacklo_epi64(uh[0], uh[1]), out[3] = _mm_unpackhi_epi64(uh[0], uh[1]);
}

/* enc_block on AVX2 (at load: 0.6B's 600M weights in ~0.14 s on two
 * cores): low and high bytes split by vpackuswb (lane-interleaved, put back
 * in order by vpermq); the exponents' span by byte min / max folded to one
 * byte; the codes; then both into the layout's order (reorder). */
KILN_AVX2 static int enc_block_avx2(const uint16_t *v, uint8_t *blk) {
    const __m256i lo8 = _mm256_set1_epi16(0xFF), m7f = _mm256_set1_epi8(0x7F);
    __m256i a[4], L[2], H[2];
    for (int k = 0; k < 4; k++) a[k] = _mm256_loadu_si256((const __m256i *)(v + 16 * k));
    for (int h = 0; h < 2; h++) {
        L[h] = _mm256_permute4x64_epi64(_mm256_packus_epi16(_mm256_and_si256(a[2 * h], lo8), _mm256_and_si256(a[2 * h + 1], lo8)), 0xD8);
        H[h] = _mm256_permute4x64_epi64(_mm256_packus_epi16(_mm256_srli_epi16(a[2 * h], 8), _mm256_srli_epi16(a[2 * h + 1], 8)), 0xD8);
    }
    const __m256i e0 = _mm256_and_si256(H[0], m7f), e1 = _mm256_and_si256(H[1], m7f);
    __m128i mn = _mm_min_epu8(_mm256_castsi256_si128(_mm256_min_epu8(e0, e1)), _mm256_extracti128_si256(_mm256_min_epu8(e0, e1), 1));
    __m128i mx = _mm_max_epu8(_mm256_castsi256_si128(_mm256_max_epu8(e0, e1)), _mm256_extracti128_si256(_mm256_max_epu8(e0, e1), 1));
    /* fold 16 bytes to byte 0 (the shifts take immediates) */
    mn = _mm_min_epu8(mn, _mm_srli_si128(mn, 8)), mx = _mm_max_epu8(mx, _mm_srli_si128(mx, 8));
    mn = _mm_min_epu8(mn, _mm_srli_si128(mn, 4)), mx = _mm_max_epu8(mx, _mm_srli_si128(mx, 4));
    mn = _mm_min_epu8(mn, _mm_srli_si128(mn, 2)), mx = _mm_max_epu8(mx, _mm_srli_si128(mx, 2));
    mn = _mm_min_epu8(mn, _mm_srli_si128(mn, 1)), mx = _mm_max_epu8(mx, _mm_srli_si128(mx, 1));
    const int base = _mm_cvtsi128_si32(mn) & 0xFF, top = _mm_cvtsi128_si32(mx) & 0xFF;
    if (top - base > 7) return -1;
    const __m256i bv = _mm256_set1_epi8((char)base), s8 = _mm256_set1_epi8(8);
    const __m256i c0 = _mm256_or_si256(_mm256_sub_epi8(e0, bv), _mm256_and_si256(_mm256_srli_epi16(H[0], 4), s8));
    const __m256i c1 = _mm256_or_si256(_mm256_sub_epi8(e1, bv), _mm256_and_si256(_mm256_srli_epi16(H[1], 4), s8));
    __m128i lo[4], co[4];
    reorder(L, lo);
    const __m256i cc[2] = {c0, c1};
    reorder(cc, co);
    for (int k = 0; k < 2; k++) _mm_storeu_si128((__m128i *)(blk + 16 * k), lo[k]), _mm_storeu_si128((__m128i *)(blk + 32 + 16 * k), lo[2 + k]);
    for (int k = 0; k < 2; k++) _mm_storeu_si128((__m128i *)(blk + 64 + 16 * k), _mm_or_si128(co[k], _mm_slli_epi16(co[2 + k], 4)));
    return base;
}
#endif

#if defined(KILN_NEON)
/* enc_block on NEON: vld2q_u8 splits 16 bf16 into their low and high
 * bytes, both in weight order (the AArch64 layout); the exponents' span by
 * vminvq / vmaxvq; the codes of weights i and 32 + i share byte i of C */
static int enc_block_neon(const uint16_t *v, uint8_t *blk) {
    const uint8x16_t m7f = vdupq_n_u8(0x7F), s8 = vdupq_n_u8(8);
    uint8x16x2_t q[4];
    uint8x16_t e[4], code[4];
    for (int k = 0; k < 4; k++) q[k] = vld2q_u8((const uint8_t *)(v + 16 * k)), e[k] = vandq_u8(q[k].val[1], m7f);
    const int base = vminvq_u8(vminq_u8(vminq_u8(e[0], e[1]), vminq_u8(e[2], e[3])));
    const int top = vmaxvq_u8(vmaxq_u8(vmaxq_u8(e[0], e[1]), vmaxq_u8(e[2], e[3])));
    if (top - base > 7) return -1;
    for (int k = 0; k < 4; k++) {
        code[k] = vorrq_u8(vsubq_u8(e[k], vdupq_n_u8((uint8_t)base)), vandq_u8(vshrq_n_u8(q[k].val[1], 4), s8));
        vst1q_u8(blk + 16 * k, q[k].val[0]);
    }
    vst1q_u8(blk + B12_K, vorrq_u8(code[0], vshlq_n_u8(code[2], 4)));
    vst1q_u8(blk + B12_K + 16, vorrq_u8(code[1], vshlq_n_u8(code[3], 4)));
    return base;
}
#endif

struct pack_job {
    const uint16_t *w;
    struct cpu_b12 *b;
    int64_t *esc0; /* per row: its escapes' count (pass 0), then the index of its first (pass 1) */
    int pass, vec; /* vec: the vector encoder (the scalar one when the kernels are held to scalar: the tests) */
};

/* pass 0 encodes every block and counts the escapes; pass 1 copies the
 * escaped blocks out and points their blocks at them */
static void pack_rows(void *arg, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const struct pack_job *j = arg;
    const int n_in = j->b->n_in, nb = n_in / B12_K;
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *w = j->w + (size_t)r * (size_t)n_in;
        uint8_t *row = j->b->data + (size_t)r * j->b->rb, *blk = row + b12_head(nb);
        if (j->pass == 0) {
            int64_t n = 0;
            memset(row + nb, 0, b12_head(nb) - (size_t)nb);
            for (int k = 0; k < nb; k++) {
                const uint16_t *v = w + (size_t)k * B12_K;
                uint8_t *bk = blk + (size_t)k * B12_BB;
#if defined(KILN_X86)
                const int base = j->vec ? enc_block_avx2(v, bk) : enc_block(v, bk);
#elif defined(KILN_NEON)
                const int base = j->vec ? enc_block_neon(v, bk) : enc_block(v, bk);
#else
                const int base = enc_block(v, bk);
#endif
                row[k] = base < 0 ? 0xFF : (uint8_t)base;
                n += base < 0;
            }
            j->esc0[r] = n;
            continue;
        }
        int64_t e = j->esc0[r];
        for (int k = 0; k < nb && e < j->esc0[r + 1]; k++) {
            if (row[k] != 0xFF) continue;
            uint8_t *bk = blk + (size_t)k * B12_BB;
            uint16_t *raw = j->b->esc + (size_t)e++ * B12_K;
            memcpy(raw, w + (size_t)k * B12_K, sizeof(uint16_t) * B12_K);
            const int64_t d = (int64_t)((const uint8_t *)raw - bk);
            memset(bk, 0, B12_BB);
            memcpy(bk, &d, sizeof d);
        }
    }
}

struct cpu_b12 *cpu_b12_pack(struct kiln_backend *be, const uint16_t *w, int n_out, int n_in) {
    if (n_in <= 0 || n_in % B12_K || n_out <= 0) return NULL;
    struct cpu_b12 *b = calloc(1, sizeof *b);
    int64_t *esc0 = malloc(sizeof(int64_t) * ((size_t)n_out + 1));
    if (!b || !esc0) goto fail;
    *b = (struct cpu_b12){.n_out = n_out, .n_in = n_in, .rb = cpu_b12_row_bytes(n_in)};
    if (!(b->data = kiln_walloc(b->rb * (size_t)n_out))) goto fail;
    struct pack_job j = {.w = w, .b = b, .esc0 = esc0, .pass = 0};
#if defined(KILN_X86)
    j.vec = cpu_isa() >= CPU_ISA_AVX2;
#elif defined(KILN_NEON)
    j.vec = cpu_isa() >= CPU_ISA_NEON;
#endif
    cpu_parallel_for(be, n_out, 64, pack_rows, &j);
    for (int r = 0; r < n_out; r++) {
        const int64_t n = esc0[r];
        esc0[r] = b->n_esc;
        b->n_esc += n;
    }
    esc0[n_out] = b->n_esc;
    if (b->n_esc) {
        if (!(b->esc = kiln_walloc(sizeof(uint16_t) * B12_K * (size_t)b->n_esc))) goto fail;
        j.pass = 1;
        cpu_parallel_for(be, n_out, 64, pack_rows, &j);
    }
    free(esc0);
    return b;
fail:
    free(esc0);
    cpu_b12_free(b);
    return NULL;
}

/* F16 as BF16. An F16 checkpoint converted from a BF16 one (how F16 files
 * of Qwen's models are made) holds only bf16 values: a normal f16 keeps
 * bf16's 7 mantissa bits and three zeros, and a subnormal is a bf16's 8
 * significant bits rounded to a coarser grid, so at most 8 remain. Such a
 * linear is the same numbers as BF16, so it can take the 12-bit store and
 * its kernels: the F16 and BF16 kernels share their bodies (matmul.c:
 * DOT_AVX2, DOT_AVX512, the GEMVs' loads), so the outputs are the F16
 * path's bits. A weight is a bf16 value when its f32 (kiln_widen16, exact)
 * has 16 zero low bits and is not a NaN (payloads are not carried over). */
struct f16_job {
    const uint16_t *h;
    uint16_t *b;
    int n_in, avx2;
    int bad; /* a value that is not bf16 (written by any thread; only ever set) */
};

static void f16_rows(void *arg, int64_t r0, int64_t r1, int tid) {
    struct f16_job *j = arg;
    float *f = malloc(sizeof(float) * (size_t)j->n_in);
    int ok = f != NULL;
    for (int64_t r = r0; r < r1 && ok; r++) {
        const size_t k0 = (size_t)r * j->n_in;
        kiln_widen16(f, j->h + k0, (size_t)j->n_in, 1, j->avx2);
        for (int k = 0; k < j->n_in; k++) {
            uint32_t u;
            memcpy(&u, &f[k], 4);
            ok &= (u & 0xFFFF) == 0 && !isnan(f[k]);
            j->b[k0 + k] = (uint16_t)(u >> 16);
        }
    }
    free(f);
    if (!ok) __atomic_store_n(&j->bad, 1, __ATOMIC_RELAXED);
    (void)tid;
}

uint16_t *cpu_f16_as_bf16(struct kiln_backend *be, const uint16_t *h, int n_out, int n_in) {
    struct f16_job j = {.h = h, .b = malloc(sizeof(uint16_t) * (size_t)n_out * (size_t)n_in), .n_in = n_in};
    if (!j.b) return NULL;
#if defined(KILN_X86)
    j.avx2 = cpu_isa() >= CPU_ISA_AVX2;
#endif
    cpu_parallel_for(be, n_out, 64, f16_rows, &j);
    if (!j.bad) return j.b;
    free(j.b);
    return NULL;
}

void cpu_b12_free(struct cpu_b12 *b) {
    if (!b) return;
    if (b->data) kiln_wfree(b->data);
    if (b->esc) kiln_wfree(b->esc);
    free(b);
}

size_t cpu_b12_bytes(const struct cpu_b12 *b) {
    return b->rb * (size_t)b->n_out + sizeof(uint16_t) * B12_K * (size_t)b->n_esc;
}

/* ==== scalar: decode, dot ==== */

static inline const uint16_t *esc_of(const uint8_t *blk) {
    int64_t d;
    memcpy(&d, blk, sizeof d);
    return (const uint16_t *)(blk + d);
}

static void block_bf16(const uint8_t *blk, int base, uint16_t *dst) {
    if (base == 0xFF) {
        memcpy(dst, esc_of(blk), sizeof(uint16_t) * B12_K);
        return;
    }
    for (int p = 0; p < B12_K; p++) {
        const int i = b12_pos(p), c = i < 32 ? blk[B12_K + i] & 15 : blk[B12_K + i - 32] >> 4;
        dst[p] = (uint16_t)(((c & 8) << 12) | ((base + (c & 7)) << 8) | blk[i]);
    }
}

void cpu_b12_decode(const uint8_t *row, int n_in, int k0, int k, uint16_t *dst) {
    const int nb = n_in / B12_K;
    const uint8_t *blk = row + b12_head(nb);
    for (int c = k0 / B12_K; c < (k0 + k) / B12_K; c++, dst += B12_K) block_bf16(blk + (size_t)c * B12_BB, row[c], dst);
}

/* as matmul.c's scalar BF16 dot: one running sum per activation row */
void cpu_b12_dot_scalar(const void *row_, const float *const *x, int nx, int n_in, float *out) {
    const uint8_t *row = row_;
    const int nb = n_in / B12_K;
    float s[4] = {0, 0, 0, 0};
    uint16_t w[B12_K];
    for (int c = 0; c < nb; c++) {
        block_bf16(row + b12_head(nb) + (size_t)c * B12_BB, row[c], w);
        for (int j = 0; j < nx; j++)
            for (int p = 0; p < B12_K; p++) s[j] += kiln_bf16_to_f32(w[p]) * x[j][c * B12_K + p];
    }
    for (int j = 0; j < nx; j++) out[j] = s[j];
}

/* the lines pfd bytes past a block's 96, into L1 (0: none) */
static inline void pf_block(const uint8_t *blk, int pfd) {
    if (!pfd) return;
    _mm_prefetch((const char *)blk + pfd, _MM_HINT_T0);
    _mm_prefetch((const char *)blk + 64 + pfd, _MM_HINT_T0);
}

#if defined(KILN_X86)
/* ==== AVX-512 ==== */

#define AVX512 KILN_AVX512
#define AVX2 KILN_AVX2

/* the 16-byte table of high bytes by code, in each 128-bit lane */
#define B12_TAB 0x03020100, 0x07060504, (int)0x83828180, (int)0x87868584

/* the block's f32 from its low bytes l and high bytes h (both in L order):
 * bf16 words by vpunpck{l,h}bw, then the even words shifted up 16 bits and
 * the odd words masked in place */
AVX512 static inline __attribute__((always_inline)) void widen_avx512(__m512i l, __m512i h, __m512 f[4]) {
    const __m512i w0 = _mm512_unpacklo_epi8(l, h), w1 = _mm512_unpackhi_epi8(l, h), hm = _mm512_set1_epi32((int)0xFFFF0000);
    f[0] = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));
    f[1] = _mm512_castsi512_ps(_mm512_and_si512(w0, hm));
    f[2] = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
    f[3] = _mm512_castsi512_ps(_mm512_and_si512(w1, hm));
}

/* weights 0-15, 16-31, 32-47, 48-63 of a block as f32 */
AVX512 static inline __attribute__((always_inline)) void dec_avx512(const uint8_t *blk, int base, __m512 f[4]) {
    if (__builtin_expect(base == 0xFF, 0)) {
        const uint16_t *raw = esc_of(blk);
        for (int v = 0; v < 4; v++)
            f[v] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(raw + 16 * v))), 16));
        return;
    }
    const __m512i t = _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_setr_epi32(B12_TAB)), _mm512_set1_epi8((char)base));
    const __m256i c = _mm256_loadu_si256((const __m256i *)(blk + B12_K)), m = _mm256_set1_epi8(15);
    const __m512i codes = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(c, m)), _mm256_and_si256(_mm256_srli_epi16(c, 4), m), 1);
    const __m512i h = _mm512_shuffle_epi8(t, codes), l = _mm512_loadu_si512((const void *)blk);
    widen_avx512(l, h, f);
}

/* The same with AVX-512 VBMI (Ice Lake, Zen 4 and later): the codes of
 * all 64 weights come from one vpmultishiftqb of C broadcast to both
 * halves (byte j of qword q: bits 8 j of the low half, the low nibbles;
 * 8 j + 4 of the high half, the high nibbles), whose bits 4-7 then hold a
 * neighbouring nibble: vpermb reads only bits 0-5 of an index, and the
 * 16-byte table repeated in each 128-bit lane is the same entry for every
 * value of bits 4-5. Two shuffles in place of the four ymm and / shift /
 * insert steps; the same vectors out. */
#define AVX512V __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")))

AVX512V static inline __attribute__((always_inline)) void dec_avx512v(const uint8_t *blk, int base, __m512 f[4]) {
    if (__builtin_expect(base == 0xFF, 0)) return dec_avx512(blk, base, f);
    const __m512i t = _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_setr_epi32(B12_TAB)), _mm512_set1_epi8((char)base));
    const __m512i sel = _mm512_set_epi64(0x3c342c241c140c04, 0x3c342c241c140c04, 0x3c342c241c140c04, 0x3c342c241c140c04,
                                         0x3830282018100800, 0x3830282018100800, 0x3830282018100800, 0x3830282018100800);
    const __m512i codes = _mm512_multishift_epi64_epi8(sel, _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + B12_K))));
    const __m512i h = _mm512_permutexvar_epi8(codes, t), l = _mm512_loadu_si512((const void *)blk);
    widen_avx512(l, h, f);
}

/* Rows r + q sd (q < R) for nx activation rows (GEMV_ROWS_AVX512's
 * contract, gemv.h): per block and row, weights 0-15 and 32-47 into the
 * first accumulator, 16-31 and 48-63 into the second, as the BF16 loop's
 * two steps of 32 do */
#define ROWS_B12_AVX512(NAME, ISA, DEC)                                                                                       \
    ISA static inline __attribute__((always_inline)) void NAME(const uint8_t *W, size_t rb, const float *x, int nx, int R,    \
                                                               int n_in, int64_t r, const float *bias, float *out, int n_out, \
                                                               int pfd, int64_t sd) {                                         \
        const int nb = n_in / B12_K;                                                                                          \
        const size_t hd = b12_head(nb);                                                                                       \
        const uint8_t *w[GEMV_R];                                                                                             \
        __m512 a[GEMV_R][4][2];                                                                                               \
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {                                                                 \
            w[q] = W + (size_t)(r + q * sd) * rb;                                                                             \
            _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++) a[q][j][0] = a[q][j][1] = _mm512_setzero_ps();               \
        }                                                                                                                     \
        for (int c = 0; c < nb; c++) {                                                                                        \
            _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {                                                             \
                const uint8_t *blk = w[q] + hd + (size_t)c * B12_BB;                                                          \
                pf_block(blk, pfd);                                                                                           \
                __m512 f[4];                                                                                                  \
                DEC(blk, w[q][c], f);                                                                                         \
                _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++) {                                                        \
                    const float *xj = x + (size_t)j * n_in + (size_t)c * B12_K;                                               \
                    a[q][j][0] = _mm512_fmadd_ps(f[0], _mm512_loadu_ps(xj), a[q][j][0]);                                      \
                    a[q][j][1] = _mm512_fmadd_ps(f[1], _mm512_loadu_ps(xj + 16), a[q][j][1]);                                 \
                    a[q][j][0] = _mm512_fmadd_ps(f[2], _mm512_loadu_ps(xj + 32), a[q][j][0]);                                 \
                    a[q][j][1] = _mm512_fmadd_ps(f[3], _mm512_loadu_ps(xj + 48), a[q][j][1]);                                 \
                }                                                                                                             \
            }                                                                                                                 \
        }                                                                                                                     \
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++)                                                                   \
            _Pragma("GCC unroll 4") for (int j = 0; j < nx; j++)                                                              \
                out[(size_t)j * n_out + r + q * sd] =                                                                         \
                    _mm512_reduce_add_ps(_mm512_add_ps(a[q][j][0], a[q][j][1])) + (bias ? bias[r + q * sd] : 0.0f);           \
    }
ROWS_B12_AVX512(rows_b12_avx512, AVX512, dec_avx512)
ROWS_B12_AVX512(rows_b12_avx512v, AVX512V, dec_avx512v)

/* ==== AVX2 ==== */

/* weights 8h + 0-7, 16-23, 32-39, 48-55 of a block (h = 0: the first 32
 * bytes of L and the low nibbles; h = 1 the second, the high nibbles) */
/* PIN: the codes and low bytes pinned in registers (below) */
AVX2 static inline __attribute__((always_inline)) void dec_avx2(const uint8_t *blk, int base, __m256 f[2][4], const int PIN) {
    if (__builtin_expect(base == 0xFF, 0)) {
        const uint16_t *raw = esc_of(blk);
        for (int h = 0; h < 2; h++)
            for (int v = 0; v < 4; v++)
                f[h][v] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(raw + 16 * v + 8 * h))), 16));
        return;
    }
    const __m256i t = _mm256_add_epi8(_mm256_setr_epi32(B12_TAB, B12_TAB), _mm256_set1_epi8((char)base));
    /* Without the empty asm gcc loads the codes and each half's low bytes
     * twice from memory (once per vpand / vpunpck that reads them): 15 loads
     * per block and row instead of 12 at batch 1, where the loop is short of
     * load slots. Pinned: from L2 (two Zen 4 cores, AVX2) 46 -> 48 Gweights/s
     * at K 2,048, 44 -> 45.5 at K 6,144; at two activation rows (more x
     * loads than weight loads) no gain, 49.6 -> 48.9, so only at one. */
    __m256i c = _mm256_loadu_si256((const __m256i *)(blk + B12_K));
    if (PIN) __asm__("" : "+x"(c));
    const __m256i m = _mm256_set1_epi8(15), hm = _mm256_set1_epi32((int)0xFFFF0000);
    const __m256i codes[2] = {_mm256_and_si256(c, m), _mm256_and_si256(_mm256_srli_epi16(c, 4), m)};
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        const __m256i hi = _mm256_shuffle_epi8(t, codes[h]);
        __m256i l = _mm256_loadu_si256((const __m256i *)(blk + 32 * h));
        if (PIN) __asm__("" : "+x"(l));
        const __m256i w0 = _mm256_unpacklo_epi8(l, hi), w1 = _mm256_unpackhi_epi8(l, hi);
        f[h][0] = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16));
        f[h][1] = _mm256_castsi256_ps(_mm256_and_si256(w0, hm));
        f[h][2] = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
        f[h][3] = _mm256_castsi256_ps(_mm256_and_si256(w1, hm));
    }
}

/* Two rows r and r + sd at batch 1, half a block at a time so that both
 * rows' eight accumulators and the decode fit the 16 ymm registers: half
 * h of a block gives f[h][0..3] (dec_avx2), which feed accumulators h and
 * h + 2 in the order of the loop below (each accumulator still takes a
 * block's s = 0 product before its s = 1 product: the same bits). An
 * escaped block decodes whole, as there. */
AVX2 static inline __attribute__((always_inline)) void rows2_b12_avx2(const uint8_t *W, size_t rb, const float *x, int n_in, int64_t r,
                                                                       const float *bias, float *out, int pfd, int64_t sd) {
    const int nb = n_in / B12_K;
    const size_t hd = b12_head(nb);
    const uint8_t *w[2] = {W + (size_t)r * rb, W + (size_t)(r + sd) * rb};
    __m256 a[2][4];
    _Pragma("GCC unroll 2") for (int q = 0; q < 2; q++) a[q][0] = a[q][1] = a[q][2] = a[q][3] = _mm256_setzero_ps();
    const __m256i tab = _mm256_setr_epi32(B12_TAB, B12_TAB), m = _mm256_set1_epi8(15), hm = _mm256_set1_epi32((int)0xFFFF0000);
    for (int c = 0; c < nb; c++) {
        _Pragma("GCC unroll 2") for (int q = 0; q < 2; q++) {
            /* x's address hidden from the compiler per row: else it loads the block's 8 x vectors once for
             * both rows, into 8 registers, and spills the accumulators instead */
            const float *xc = x + (size_t)c * B12_K;
            __asm__("" : "+r"(xc));
            const uint8_t *blk = w[q] + hd + (size_t)c * B12_BB;
            const int base = w[q][c];
            pf_block(blk, pfd);
            if (__builtin_expect(base == 0xFF, 0)) {
                __m256 f[2][4];
                dec_avx2(blk, base, f, 0);
                _Pragma("GCC unroll 2") for (int s = 0; s < 2; s++)
                    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
                        a[q][u] = _mm256_fmadd_ps(f[u & 1][2 * s + (u >> 1)], _mm256_loadu_ps(xc + 32 * s + 8 * u), a[q][u]);
                continue;
            }
            const __m256i t = _mm256_add_epi8(tab, _mm256_set1_epi8((char)base));
            __m256i cb = _mm256_loadu_si256((const __m256i *)(blk + B12_K));
            __asm__("" : "+x"(cb)); /* loaded once, as in dec_avx2 */
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                const __m256i hi = _mm256_shuffle_epi8(t, _mm256_and_si256(h ? _mm256_srli_epi16(cb, 4) : cb, m));
                __m256i l = _mm256_loadu_si256((const __m256i *)(blk + 32 * h));
                __asm__("" : "+x"(l));
                const __m256i w0 = _mm256_unpacklo_epi8(l, hi), w1 = _mm256_unpackhi_epi8(l, hi);
                a[q][h] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)), _mm256_loadu_ps(xc + 8 * h), a[q][h]);
                a[q][h + 2] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w0, hm)), _mm256_loadu_ps(xc + 8 * h + 16), a[q][h + 2]);
                a[q][h] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)), _mm256_loadu_ps(xc + 32 + 8 * h), a[q][h]);
                a[q][h + 2] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w1, hm)), _mm256_loadu_ps(xc + 48 + 8 * h), a[q][h + 2]);
            }
        }
    }
    _Pragma("GCC unroll 2") for (int q = 0; q < 2; q++) {
        const float t = 0; /* the BF16 loop's tail sum, empty here */
        out[r + q * sd] = kiln_hsum8(_mm256_add_ps(_mm256_add_ps(a[q][0], a[q][1]), _mm256_add_ps(a[q][2], a[q][3]))) + t +
                          (bias ? bias[r + q * sd] : 0.0f);
    }
}

/* GEMV_ROWS_AVX2's contract: per block, accumulator u takes weights
 * 8u + 0-7 and 32 + 8u + 0-7, as the BF16 loop's two steps of 32 do */
AVX2 static inline __attribute__((always_inline)) void rows_b12_avx2(const uint8_t *W, size_t rb, const float *x, int nx, int R,
                                                                      int n_in, int64_t r, const float *bias, float *out,
                                                                      int n_out, int pfd, int64_t sd) {
    /* R = 4 at batch 1 (rows past the L1 cache) spills accumulators (16 of
     * them, and the decode), yet ran 1.7B's decode 1.06x faster than two
     * adjacent pairs through rows2_b12_avx2 (0.944 [0.933, 0.954] the other
     * way, thirty-fourth session): it reads x once per four rows */
    if (R == 2 && nx == 1) return rows2_b12_avx2(W, rb, x, n_in, r, bias, out, pfd, sd);
    const int nb = n_in / B12_K;
    const size_t hd = b12_head(nb);
    const uint8_t *w[GEMV_R];
    __m256 a[GEMV_R][2][4];
    _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {
        w[q] = W + (size_t)(r + q * sd) * rb;
        _Pragma("GCC unroll 2") for (int j = 0; j < nx; j++) a[q][j][0] = a[q][j][1] = a[q][j][2] = a[q][j][3] = _mm256_setzero_ps();
    }
    for (int c = 0; c < nb; c++) {
        _Pragma("GCC unroll 4") for (int q = 0; q < R; q++) {
            const uint8_t *blk = w[q] + hd + (size_t)c * B12_BB;
            pf_block(blk, pfd);
            __m256 f[2][4];
            dec_avx2(blk, w[q][c], f, nx == 1);
            _Pragma("GCC unroll 2") for (int j = 0; j < nx; j++) {
                const float *xj = x + (size_t)j * n_in + (size_t)c * B12_K;
                /* weight 8u + 32s + 0-7 is f[u & 1][2 s + (u >> 1)] */
                _Pragma("GCC unroll 2") for (int s = 0; s < 2; s++)
                    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
                        a[q][j][u] = _mm256_fmadd_ps(f[u & 1][2 * s + (u >> 1)], _mm256_loadu_ps(xj + 32 * s + 8 * u), a[q][j][u]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int q = 0; q < R; q++)
        _Pragma("GCC unroll 2") for (int j = 0; j < nx; j++) {
            const float t = 0; /* the BF16 loop's tail sum, empty here */
            out[(size_t)j * n_out + r + q * sd] =
                kiln_hsum8(_mm256_add_ps(_mm256_add_ps(a[q][j][0], a[q][j][1]), _mm256_add_ps(a[q][j][2], a[q][j][3]))) + t +
                (bias ? bias[r + q * sd] : 0.0f);
        }
}

/* AVX-512 at batch 1: pairs of rows half the run apart (gemv.h), two
 * rows' decodes in flight per step: on a Zen 4, 0.6B 1.280 [1.264, 1.311],
 * 1.7B 1.288 [1.113, 1.320] over one row per pass (`decode-ab model`, the
 * BF16 loop gained nothing from them at batch 1); flat in GEMV sweeps
 * (1.00-1.03) in minutes when memory was the bound. AVX2 takes them too,
 * through rows2_b12_avx2 (its 16 registers hold both rows' accumulators
 * only half a block at a time): held to AVX2 on the Zen 4, 0.6B 1.062
 * [1.048, 1.079], 1.7B 1.139 / 1.131, 4B 1.098 (`decode-ab model M
 * b12-pairs2 0 1`); KILN_CPU_B12_PAIRS2=0 turns them off. */
GEMV1(gemv1_b12_avx512, AVX512, rows_b12_avx512, 4, cpu_gemv_pfd(), 1)
GEMV1(gemv1_b12_avx512v, AVX512V, rows_b12_avx512v, 4, cpu_gemv_pfd(), 1)
GEMV1(gemv1_b12_avx2, AVX2, rows_b12_avx2, 2, cpu_b12_pfd(), cpu_b12_pairs2())

/* the GEMM's panel packing: blocks [c0, c1) of a row as f32 */
AVX512 static void f32_avx512(const uint8_t *row, int nb, int c0, int c1, float *dst) {
    for (int c = c0; c < c1; c++, dst += B12_K) {
        __m512 f[4];
        dec_avx512(row + b12_head(nb) + (size_t)c * B12_BB, row[c], f);
        for (int v = 0; v < 4; v++) _mm512_storeu_ps(dst + 16 * v, f[v]);
    }
}

AVX2 static void f32_avx2(const uint8_t *row, int nb, int c0, int c1, float *dst) {
    for (int c = c0; c < c1; c++, dst += B12_K) {
        __m256 f[2][4];
        dec_avx2(row + b12_head(nb) + (size_t)c * B12_BB, row[c], f, 0);
        for (int h = 0; h < 2; h++)
            for (int v = 0; v < 4; v++) _mm256_storeu_ps(dst + 16 * v + 8 * h, f[h][v]);
    }
}
#endif /* KILN_X86 */

#if defined(KILN_NEON)
/* ==== NEON (AArch64) ==== */

/* the 16 high bytes by code less the block's base (B12_TAB's bytes) */
static const uint8_t b12_tab[16] = {0, 1, 2, 3, 4, 5, 6, 7, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87};

/* weights 32 s + 4 u + 0-3 of a block as f[u] (u < 8): the codes of C's
 * first 16 bytes c0 (weights 0-15 in the low nibbles, 32-47 in the high)
 * and of the next 16 c1 (16-31, 48-63) looked up by vqtbl1q into high
 * bytes, zipped with L's bytes into bf16 words in weight order, widened
 * by shll #16: per 32 weights two and-or-shift, two tbl, four zip, eight
 * shll */
static inline __attribute__((always_inline)) void half_neon(const uint8_t *blk, uint8x16_t t, uint8x16_t c0, uint8x16_t c1, int s,
                                                            float32x4_t f[8]) {
    const uint8x16_t m = vdupq_n_u8(15);
    const uint8x16_t h0 = vqtbl1q_u8(t, s ? vshrq_n_u8(c0, 4) : vandq_u8(c0, m));
    const uint8x16_t h1 = vqtbl1q_u8(t, s ? vshrq_n_u8(c1, 4) : vandq_u8(c1, m));
    const uint8x16_t l0 = vld1q_u8(blk + 32 * s), l1 = vld1q_u8(blk + 32 * s + 16);
    const uint16x8_t w[4] = {vreinterpretq_u16_u8(vzip1q_u8(l0, h0)), vreinterpretq_u16_u8(vzip2q_u8(l0, h0)),
                             vreinterpretq_u16_u8(vzip1q_u8(l1, h1)), vreinterpretq_u16_u8(vzip2q_u8(l1, h1))};
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        f[2 * k] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(w[k]), 16));
        f[2 * k + 1] = vreinterpretq_f32_u32(vshll_high_n_u16(w[k], 16));
    }
}

/* the same for an escaped block, from its 64 bf16 */
static inline __attribute__((always_inline)) void half_esc_neon(const uint8_t *blk, int s, float32x4_t f[8]) {
    const uint16_t *raw = esc_of(blk) + 32 * s;
    _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) f[u] = kiln_bf16x4(raw + 4 * u);
}

/* Rows [r0, r1) for nx = 1 or 2 activation rows, one weight row at a time
 * in CPU_FOR_ROWS order: the BF16 NEON loop (matmul.c, GEMV1_NEON) with
 * each step of 32 weights decoded from 12 bits. Accumulator u takes
 * weights 4 u + 0-3 of every step, the same products in the same order
 * and the same reduction: the BF16 bits. */
static inline __attribute__((always_inline)) void gemv_b12_neon_(const uint8_t *W, size_t rb, const float *x, int nx, int n_in,
                                                                 int64_t r0, int64_t r1, const float *bias, float *out, int n_out) {
    const int two = gemv_two(rb), pfd = cpu_b12_pfd(), nb = n_in / B12_K;
    const size_t hd = b12_head(nb);
    const uint8x16_t tab = vld1q_u8(b12_tab);
    gemv_pf_start(W, rb, r0, r1, two, pfd);
    CPU_FOR_ROWS(r, r0, r1, two) {
        const uint8_t *row = W + (size_t)r * rb;
        float32x4_t a0[8], a1[8]; /* activation rows 0 and 1 (two arrays: one 2-d array was partly kept on the stack) */
        _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) a0[u] = a1[u] = vdupq_n_f32(0);
        for (int c = 0; c < nb; c++) {
            const uint8_t *blk = row + hd + (size_t)c * B12_BB;
            const int base = row[c];
            pf_block(blk, pfd);
            const uint8x16_t t = vaddq_u8(tab, vdupq_n_u8((uint8_t)base)), c0 = vld1q_u8(blk + B12_K), c1 = vld1q_u8(blk + B12_K + 16);
            _Pragma("GCC unroll 2") for (int s = 0; s < 2; s++) {
                float32x4_t f[8];
                if (__builtin_expect(base == 0xFF, 0)) half_esc_neon(blk, s, f);
                else half_neon(blk, t, c0, c1, s, f);
                const float *x0 = x + (size_t)c * B12_K + 32 * s, *x1 = x0 + n_in;
                _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) a0[u] = vfmaq_f32(a0[u], f[u], vld1q_f32(x0 + 4 * u));
                if (nx == 2) _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) a1[u] = vfmaq_f32(a1[u], f[u], vld1q_f32(x1 + 4 * u));
            }
        }
        const float t = 0; /* the BF16 loop's tail sum, empty here */
        _Pragma("GCC unroll 2") for (int j = 0; j < nx; j++) {
            const float32x4_t *a = j ? a1 : a0;
            const float32x4_t sum = vaddq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])),
                                              vaddq_f32(vaddq_f32(a[4], a[5]), vaddq_f32(a[6], a[7])));
            out[(size_t)j * n_out + r] = vaddvq_f32(sum) + t + (bias ? bias[r] : 0.0f);
        }
    }
}

static void gemv1_b12_neon(const uint8_t *W, size_t rb, const float *x, int nx, int n_in, int64_t r0, int64_t r1, const float *bias,
                           float *out, int n_out) {
    if (nx == 1) gemv_b12_neon_(W, rb, x, 1, n_in, r0, r1, bias, out, n_out);
    else gemv_b12_neon_(W, rb, x, 2, n_in, r0, r1, bias, out, n_out);
}

static void f32_neon(const uint8_t *row, int nb, int c0, int c1, float *dst) {
    for (int c = c0; c < c1; c++, dst += B12_K) {
        const uint8_t *blk = row + b12_head(nb) + (size_t)c * B12_BB;
        const int base = row[c];
        const uint8x16_t t = vaddq_u8(vld1q_u8(b12_tab), vdupq_n_u8((uint8_t)base)), k0 = vld1q_u8(blk + B12_K), k1 = vld1q_u8(blk + B12_K + 16);
        for (int s = 0; s < 2; s++) {
            float32x4_t f[8];
            if (base == 0xFF) half_esc_neon(blk, s, f);
            else half_neon(blk, t, k0, k1, s, f);
            for (int u = 0; u < 8; u++) vst1q_f32(dst + 32 * s + 4 * u, f[u]);
        }
    }
}
#endif /* KILN_NEON */

void cpu_b12_decode_f32(const uint8_t *row, int n_in, int k0, int k, float *dst) {
    const int nb = n_in / B12_K, c0 = k0 / B12_K, c1 = (k0 + k) / B12_K;
#if defined(KILN_X86)
    if (cpu_isa() == CPU_ISA_AVX512) return f32_avx512(row, nb, c0, c1, dst);
    if (cpu_isa() == CPU_ISA_AVX2) return f32_avx2(row, nb, c0, c1, dst);
#elif defined(KILN_NEON)
    if (cpu_isa() >= CPU_ISA_NEON) return f32_neon(row, nb, c0, c1, dst);
#endif
    uint16_t w[B12_K];
    for (int c = c0; c < c1; c++, dst += B12_K) {
        block_bf16(row + b12_head(nb) + (size_t)c * B12_BB, row[c], w);
        for (int p = 0; p < B12_K; p++) dst[p] = kiln_bf16_to_f32(w[p]);
    }
}

gemv1_fn cpu_b12_gemv1(void) {
#if defined(KILN_X86)
    const int v = cpu_isa();
    cpu_isa_note(v, 0);
    if (v == CPU_ISA_AVX512 && cpu_b12_vbmi()) {
        cpu_isa_note(v, CPU_USED_VBMI);
        return gemv1_b12_avx512v;
    }
    return v == CPU_ISA_AVX512 ? gemv1_b12_avx512 : v == CPU_ISA_AVX2 ? gemv1_b12_avx2 : NULL;
#elif defined(KILN_NEON)
    const int v = cpu_isa();
    cpu_isa_note(v, 0);
    return v >= CPU_ISA_NEON ? gemv1_b12_neon : NULL;
#else
    return NULL;
#endif
}
