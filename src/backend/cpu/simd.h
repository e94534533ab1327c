/*
 * simd.h: small vector helpers shared by the CPU kernels (not a public API).
 * Every function carries its own target attribute, so a file includes this
 * without being compiled for AVX2/AVX-512; callers pick a path at run time
 * with cpu_isa() (cpu.h).
 *
 * exp: Cephes' expf: n = round(x log2 e), r = x - n ln 2 (ln 2 in two parts),
 * a degree-6 polynomial for e^r on [-ln2/2, ln2/2], times 2^n built in the
 * exponent bits. Within ~1-2 ulp of libm's expf over [-87.3, 88.3]; inputs
 * are clamped to that range (below it e^x is < 1.2e-38, and the softmax and
 * SiLU that use it only add it to 1 or to a sum that is >= 1).
 */
#ifndef KILN_CPU_SIMD_H
#define KILN_CPU_SIMD_H

#include "backend/cpu/cpu.h"

#if defined(KILN_X86)
#include <immintrin.h>
#else
/* the shared kernels' prefetches, spelled as on x86 */
#define _MM_HINT_T0 3
#define _MM_HINT_T1 2
#define _mm_prefetch(p, hint) __builtin_prefetch((const void *)(p), 0, (hint))
#endif
#if defined(KILN_NEON)
#include <arm_neon.h>
#endif

#if defined(KILN_X86)
#define KILN_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KILN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#endif

#define KILN_EXP_HI 88.3762626647949f
#define KILN_EXP_LO -87.3365447505531f
#define KILN_LOG2E 1.44269504088896341f
#define KILN_EXP_C1 0.693359375f
#define KILN_EXP_C2 -2.12194440e-4f
#define KILN_EXP_P0 1.9875691500E-4f
#define KILN_EXP_P1 1.3981999507E-3f
#define KILN_EXP_P2 8.3334519073E-3f
#define KILN_EXP_P3 4.1665795894E-2f
#define KILN_EXP_P4 1.6666665459E-1f
#define KILN_EXP_P5 5.0000001201E-1f

#if defined(KILN_X86)

KILN_AVX2 static inline __m256 kiln_exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(KILN_EXP_LO)), _mm256_set1_ps(KILN_EXP_HI));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(KILN_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(KILN_EXP_C1), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(KILN_EXP_C2), r);
    __m256 y = _mm256_set1_ps(KILN_EXP_P0);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(KILN_EXP_P1));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(KILN_EXP_P2));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(KILN_EXP_P3));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(KILN_EXP_P4));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(KILN_EXP_P5));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

KILN_AVX512 static inline __m512 kiln_exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(KILN_EXP_LO)), _mm512_set1_ps(KILN_EXP_HI));
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(KILN_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(KILN_EXP_C1), x);
    r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(KILN_EXP_C2), r);
    __m512 y = _mm512_set1_ps(KILN_EXP_P0);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(KILN_EXP_P1));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(KILN_EXP_P2));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(KILN_EXP_P3));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(KILN_EXP_P4));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(KILN_EXP_P5));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

KILN_AVX2 static inline float kiln_hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* The 8-lane sums of four vectors at once: lane i of the result is vector
 * i's ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), the same order in
 * whichever place a vector goes, so kiln_hsum8x4(v, v, v, v) gives a lone
 * row the sum it gets in a group of four (decode kernels that reduce rows
 * four at a time stay independent of how rows are split across threads). */
KILN_AVX2 static inline __m128 kiln_hsum8x4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* the 8 x 8 block of floats in r transposed in registers (r[i][j] <- r[j][i]) */
KILN_AVX2 static inline void kiln_transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

#endif /* KILN_X86 */

#if defined(KILN_NEON)
/* NEON (AArch64's Advanced SIMD: always present, no target attribute).
 * kiln_exp4 is kiln_exp8's arithmetic lane for lane (the same clamp,
 * round-to-nearest-even, fused multiply-adds in the same order, exponent
 * bits): its results are bit-identical to the AVX2 / AVX-512 ones. */
static inline float32x4_t kiln_exp4(float32x4_t x) {
    /* maxnm / minnm: a NaN input becomes KILN_EXP_LO, as x86's max_ps(x, lo) gives */
    x = vminnmq_f32(vmaxnmq_f32(x, vdupq_n_f32(KILN_EXP_LO)), vdupq_n_f32(KILN_EXP_HI));
    float32x4_t fx = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(KILN_LOG2E)));
    float32x4_t r = vfmsq_f32(x, fx, vdupq_n_f32(KILN_EXP_C1));
    r = vfmsq_f32(r, fx, vdupq_n_f32(KILN_EXP_C2));
    float32x4_t y = vdupq_n_f32(KILN_EXP_P0);
    y = vfmaq_f32(vdupq_n_f32(KILN_EXP_P1), y, r);
    y = vfmaq_f32(vdupq_n_f32(KILN_EXP_P2), y, r);
    y = vfmaq_f32(vdupq_n_f32(KILN_EXP_P3), y, r);
    y = vfmaq_f32(vdupq_n_f32(KILN_EXP_P4), y, r);
    y = vfmaq_f32(vdupq_n_f32(KILN_EXP_P5), y, r);
    y = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), y, vmulq_f32(r, r));
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(fx), vdupq_n_s32(127)), 23);
    return vmulq_f32(y, vreinterpretq_f32_s32(e));
}

/* 4 bf16 / f16 weights widened to f32 (exact) */
static inline float32x4_t kiln_bf16x4(const uint16_t *p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
static inline float32x4_t kiln_f16x4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
#endif /* KILN_NEON */

#endif
