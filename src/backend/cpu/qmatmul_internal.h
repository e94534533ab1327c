/*
 * qmatmul_internal.h: what the files of the quantized matmul share (not a
 * public API: the rest of the backend calls cpu_qprepare_linear,
 * cpu_qmatmul and cpu_qmatmul_multi, cpu.h). qmatmul.c's header comment
 * describes the numerics of the paths; the files:
 *
 *   qmatmul.c           prepare / release, the per-call buffer, the CPU
 *                       feature probes, the dispatch to a path
 *   qmatmul_exact.c     exact: f32 activations, weights dequantized to f32
 *                       (scalar, AVX2, AVX-512; elsewhere matmul.c's dot)
 *   qmatmul_int8.c      int8 for GGUF blocks: the activation quantizer, the
 *                       scalar and NEON row dots, the driver
 *   qmatmul_int8_x86.c  ... and its AVX2 / AVX-512 VNNI kernels (row dots,
 *                       GEMM, decode); empty off x86
 *   qmatmul_int8_neon.c the int8 GEMM on AArch64 (Q8_0, Q4_0, GPTQ / AWQ
 *                       4-bit prefill); empty elsewhere
 *   qmatmul_gptq.c      GPTQ / AWQ 4-bit with int8 activations, every ISA
 *
 * Names: cpu_* is the backend's (cpu.h), qm_* is shared between these files
 * only, and what one file alone uses stays static in it. Every x86 kernel
 * carries its own target attribute (declared here with it too); callers
 * check cpu_isa() and qm_have_vnni() / qm_have_vbmi() first.
 */
#ifndef KILN_CPU_QMATMUL_INTERNAL_H
#define KILN_CPU_QMATMUL_INTERNAL_H

#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/simd.h"
#include "base/base.h"
#include "format/quant.h"

/* what cpu_qprepare_linear keeps in w->be */
struct qprep {
    struct qgrp grp;    /* GPTQ / AWQ */
    float *fp8_scale;   /* FP8: [ceil(N/bn)][ceil(K/bk)] as f32 */
    int int8_act;       /* GGUF Q8_0/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K: int8 activation path */
    int gact;           /* GPTQ / AWQ 4-bit with int8 activations: the group size, or 0 */
    uint8_t *x16;       /* GGUF Q4_0 on x86, the int8 path: the weight in groups of 16 rows (below), or NULL */
    uint8_t *g16;       /* GPTQ / AWQ 4-bit on x86, the int8 path: likewise (qmatmul_gptq.c), or NULL; grp.q, grp.sb freed */
};

/* ==== Q4_0 and Q8_0 in groups of 16 rows (x86) ====
 *
 * cpu_qprepare_linear copies a Q4_0 or Q8_0 linear of the int8 path into
 * this layout once, and every x86 kernel (scalar, AVX2, VNNI; decode, a
 * few sequences, prefill) reads it instead of the stored blocks. Rows 16 g
 * .. 16 g + 15 form group g, whose K / 32 blocks follow each other, Q4X_BB
 * (Q8X_BB) bytes each:
 *
 *   bytes   0..31    the 16 rows' f16 scales, row order
 *   then             4 (Q8_0: 8) chunks of 64 bytes; chunk c holds code
 *                    bytes 4c .. 4c + 3 of each row, row r at 4r. Q4_0: a
 *                    code byte j keeps weight j in its low nibble and
 *                    weight 16 + j in its high one (as stored), so chunk
 *                    c's low nibbles are weights 4c .. 4c + 3 and its high
 *                    ones 16 + 4c ..; Q8_0: chunk c is weights 4c .. 4c + 3
 *                    as stored (s8).
 *
 * One 64-byte load is then 16 rows x 4 weights: a vpdpbusd against one
 * broadcast of 4 activation codes adds 4 products to each row's lane, and
 * a block's 16 scales convert as one vector; no row needs a horizontal
 * sum, and every group is one sequential stream. Rows past the last whole
 * group stay as stored after the groups, so row r >= 16 x groups is at r x
 * row_bytes as before; the copy is the stored size. Every kernel computes
 * a row as sum_b fma((float)(sum_i (q_i - 8) x_i), d_r xd_b) (Q8_0: sum_i
 * q_i x_i) in block order, so they agree to the bit on every ISA and n. */
enum { X16_R = 16, Q4X_BB = 288, Q8X_BB = 544, QKX_BB = 2368, Q5X_BB = 2880, Q6X_BB = 3392, IQX_BB = 2208, Q3X_BB = 1856, Q2X_BB = 1344 };
/* Q4_1, Q5_0 and Q5_1 (w = d q + m for the type-1 Q4_1 / Q5_1, d (q - 16)
 * for Q5_0) the same way, x16t_bb(t1, five) bytes per block:
 *
 *   bytes   0..31    the 16 rows' d (f16); type-1: 32..63 their m
 *   then             Q4_0's 4 chunks of 64 bytes (at x16t_codes(t1))
 *   Q5: then         64 bytes of fifth bits, row r's 4 bytes at 4r: bit k
 *                    of its byte j is weight 4k + j's fifth bit (chunk k's
 *                    low nibble j), bit 4 + k weight 16 + 4k + j's (its high
 *                    nibble), so chunk k's fifth bits come with one 16-bit
 *                    shift and a mask: (h << 4 - k) & 16 and (h >> k) & 16
 *                    (the bit that lands on bit 4 of a byte never comes
 *                    from the word's other byte)
 *
 * (the stored 20, 22 or 24 bytes per row and block: the copy is the
 * stored size). A row is sum_b fma((float)(sum_i q_i x_i + c), d xd_b,
 * acc), c = -16 x the code sum for Q5_0 (0 for type-1), then for type-1
 * fma(m, xd_b x code sum, acc), in block order, on every ISA. Q4_0 is t1 =
 * five = 0. IQ4_NL (X16_IQ4) is Q4_0's layout, its nibbles indices into
 * quant_iq4_kv: a row is sum_b fma((float)(sum_i kv[q_i] x_i), d xd_b,
 * acc). */
static inline int x16t_bb(int t1, int five) { return 288 + 32 * t1 + 64 * five; }
static inline int x16t_codes(int t1) { return 32 + 32 * t1; }
/* Q3_K as Q6_K (Q3X_BB bytes per superblock; the same kernels, q3 set):
 * bytes 0..31 d, 32..63 zero, 64..319 the scales less 32 as int8 (Q6_K's
 * places), 320..1343 2 regions c of 512 bytes (chunk k = code bytes 32 c
 * + 4k .. + 3 of each row), 1344..1855 the hmask in 8 chunks (bytes 4k ..
 * 4k + 3 of each row). Sub-block j = 4c + s takes bits 2s, 2s + 1 of
 * region c and bit j of the hmask chunks: u = q + 4 (0..7), the offset -4
 * x the half's code sum in the sums' start (Q6_K's -32). (The stored 110
 * bytes per row and superblock plus 6.) */
/* Q2_K on the same kernels (kv 2; Q2X_BB bytes, the stored size): bytes
 * 0..31 d, 32..63 dmin, 64..319 the stored scale / min byte (scale in the
 * low nibble) of the 16 rows in Q6_K's scale places, 320..1343 Q3_K's 2
 * regions of codes. The sums start at 0 (no offset), and per sub-block of
 * 16 the term dmin xd (m0 S0 + m1 S1) is taken off, S the halves' code
 * sums of the activation block. */
/* IQ4_XS likewise, a superblock of 256 weights per step (IQX_BB bytes):
 *
 *   bytes    0..31     the 16 rows' d (f16)
 *   bytes   32..159    sub-block j's scale of row r, ls - 32 as int8, at 32 + 16 j + r
 *   bytes  160..2207   8 sub-blocks of 256 bytes: IQ4_NL's 4 chunks of 64
 *                      (chunk k = index bytes 4k .. 4k + 3 of each row)
 *
 * (the stored 136 bytes per row plus 2); a row is sum over sub-blocks j of
 * fma((float)((ls_j - 32) sum_i kv[q_i] x_i), d xd_j, acc), in order (the
 * integer below 2^24: exact). */
/* the group formats of qm_x16_avx2 / qm_x16_vnni and the scalar kernel */
enum { X16_Q4 = 0, X16_Q8 = 1, X16_Q41 = 2, X16_Q50 = 3, X16_Q51 = 4, X16_IQ4 = 5 };
static inline int x16_t1(int fmt) { return fmt == X16_Q41 || fmt == X16_Q51; }
static inline int x16_five(int fmt) { return fmt == X16_Q50 || fmt == X16_Q51; }
static inline int x16_bb(int fmt) { return fmt == X16_Q8 ? Q8X_BB : x16t_bb(x16_t1(fmt), x16_five(fmt)); }
/* Q4_K the same way, a 256-weight superblock per step (QKX_BB bytes):
 *
 *   bytes    0..31     the 16 rows' d (f16), then 32..63 their dmin
 *   bytes   64..191    sub-block j's 6-bit scale of row r at 64 + 16 j + r
 *   bytes  192..319    ... its min at 192 + 16 j + r
 *   bytes  320..2367   4 sub-block pairs c of 512 bytes: 8 chunks of 64,
 *                      chunk k = code bytes 32 c + 4k .. + 3 of each row (low
 *                      nibbles: sub-block 2c, weights 4k ..; high: 2c + 1)
 *
 * (the stored 144 bytes per row and superblock plus 4 for the unpacked
 * scales); a row is sum over sub-blocks j of fma((float)(sum q x), (d sc_j)
 * xd_j, acc) then fma(-(dmin m_j), xd_j sum_j, acc), in order. Q5_K: the
 * same (Q5X_BB bytes) plus, at 2368..2879, 8 chunks of 64 bytes of its qh,
 * chunk k = qh bytes 4k .. 4k + 3 of each row: bit j is sub-block j's fifth
 * code bit (the stored 176 bytes plus 4). */
/* Q6_K likewise (Q6X_BB bytes per superblock: the stored 210 x 16 and 32
 * bytes that keep every chunk on a 64-byte line; split loads from DRAM
 * held the VNNI decode to 35 Gweights/s against 55-61 for AVX2's 32-byte
 * ones on a 255 MB lm_head, 2 threads):
 *
 *   bytes     0..31     the 16 rows' d (f16); 32..63 zero
 *   bytes    64..319    the int8 scale of weights 16 k .. 16 k + 15 of row r
 *                       at 64 + 16 k + r (k = 0..15)
 *   bytes   320..2367   4 regions c of 512 bytes: chunk k (64 bytes) holds
 *                       ql bytes 32 c + 4k .. + 3 of each row, row r at 4r
 *   bytes  2368..3391   2 regions h of 512 bytes, chunk k: qh bytes 32 h +
 *                       4k .. + 3 of each row
 *
 * Sub-block j = 4h + s (weights 32 j .. 32 j + 31, activation block 8i + j)
 * takes its low 4 bits from region 2h + (s & 1) (low nibbles for s < 2,
 * high ones for s >= 2) and its top 2 from bits 2s, 2s + 1 of region h: the
 * stored bits, only regrouped, so chunk k is weights 4k .. 4k + 3 of the
 * sub-block, chunks 0-3 its first scale's 16 and 4-7 its second's. Codes
 * q (0..63) enter the dots unsigned; the offset rides in the sums' start,
 * -32 x the half's activation code sum (h6 below), so a sub-block of a row
 * is the exact integer I = sc_2j (S_0 - 32 X_0) + sc_2j+1 (S_1 - 32 X_1)
 * and a row is sum over sub-blocks of fma((float) I, d xd_j, acc), in
 * order. */
/* the copy of Q4_0, Q8_0, Q4_1, Q5_0 or Q5_1 blocks W [N][K / 32] (fmt:
 * X16_*) in this layout (kiln_walloc'd; NULL when out of memory); qm_x16k_pack: Q4_K / Q5_K,
 * qm_x16q6_pack: Q6_K */
uint8_t *qm_x16_pack(const uint8_t *W, int N, int K, int fmt);
uint8_t *qm_x16k_pack(const uint8_t *W, int N, int K, int q5);
uint8_t *qm_x16q6_pack(const uint8_t *W, int N, int K);
/* ... qm_x16iq_pack: IQ4_XS */
uint8_t *qm_x16iq_pack(const uint8_t *W, int N, int K);
/* ... qm_x16q3_pack: Q3_K; qm_x16q2_pack: Q2_K */
uint8_t *qm_x16q3_pack(const uint8_t *W, int N, int K);
uint8_t *qm_x16q2_pack(const uint8_t *W, int N, int K);

/* FP8 e4m3 -> f32 of every byte: the exact path's (qmatmul_exact.c),
 * filled by cpu_qprepare_linear at the first FP8 linear */
extern float qm_fp8_lut[256];

#define AVX2 KILN_AVX2
#define AVX512 KILN_AVX512
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")))

/* prefetch distances of the GPTQ / AWQ code streams, measured on the exact
 * path's 4-bit lookup kernels (qmatmul_exact.c) and used by the int8 GPTQ
 * decode (qmatmul_gptq.c) too. QPFD_G, one level (6144x2048 from DRAM, 2
 * threads: 1 KiB 47-49, 4 KiB 53-58 GMAC/s); L128_PF1 / L128_PF2, the codes
 * 2 KiB ahead into L1 and 32 KiB ahead into L2 (see lut128_rows_512).
 * QPFD_G at 2 / 4 / 8 KiB tied with the weights in 2 MiB pages (Zen 3,
 * AVX2, gemv-bench builds alternated); -D overrides it for such sweeps */
#ifndef QPFD_G
#define QPFD_G 4096
#endif

/* x86, the int8 decode kernels' weight streams (qmatmul_int8_x86.c): the
 * software prefetch distance in bytes, 0 for none (KILN_PF), and QM_ROWS1's
 * row order, two streams (1) or one (0). qm_settle() settles them and the
 * VNNI-or-AVX2 decode choice (policy, then the environment; call it before
 * a pool job), the cpu_set_qm_* setters (cpu.h) change them for tests and
 * decode-ab; the kernels read the variables */
extern int qm_pfd_cur, qm_two_cur;
void qm_settle(void);
#define L128_PF1 2048
#define L128_PF2 32768

/* bytes a decode reads per repacked GPTQ / AWQ row: the codes and the
 * group scale pairs (the split's chunk size) */
static inline size_t qm_grp_row_bytes(const struct qgrp *g) { return g->row_bytes + sizeof(float) * 2 * (size_t)g->n_group; }

/* ==== the per-call buffer ==== */

/* The backend's reusable buffer for one call's activation-side arrays
 * (quantized / reordered x and the decode kernels' per-block vectors), cut
 * into 64-byte aligned pieces: qm_buf_get(be, sizes, ptrs, n) sets ptr[i]
 * to a piece of sz[i] bytes (NULL for 0). Only the calling thread uses it
 * (matmuls are not nested), so decode does not pay for 3-5 allocations per
 * matmul; the pieces live until the next call. -1 when it cannot grow (the
 * caller skips its work; cpu_error reports it). The GEMMs' per-thread
 * panels come from cpu_scratch_threads (cpu.h), allocated before the job.
 *
 * A task list (qm_int8_tasks) sets up several matmuls before one job, so
 * their pieces must all live at once: qm_buf_stack(be, bytes) makes room
 * for that many bytes and turns stacking on (each qm_buf_get then takes
 * the pieces after the previous call's); past the room qm_buf_get returns
 * -1 without growing and qm_buf_unstack(be) says so (1) and turns it off. */
int qm_buf_get(struct kiln_backend *be, const size_t *sz, void **ptr, int n);
int qm_buf_stack(struct kiln_backend *be, size_t bytes);
int qm_buf_unstack(struct kiln_backend *be);

/* whether the CPU has AVX-512 VNNI (with VL and BW) / VBMI, whatever
 * KILN_CPU_ISA says: callers also check cpu_isa() >= CPU_ISA_AVX512 */
#if defined(KILN_X86)
int qm_have_vnni(void);
int qm_have_vbmi(void);
#else
static inline int qm_have_vnni(void) { return 0; }
#endif

#if defined(KILN_X86)
/* the first n of 8 i32 lanes set (maskload / maskstore of a row tail) */
AVX2 static inline __m256i mask8(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

/* ==== the three paths: y = x W^T + b for n activation rows ====
 *
 * qm_matmul_*: the whole matmul of one linear on its path (cpu_qmatmul
 * picks it from w's struct qprep). qm_*_multi: the decode of count
 * linears (count <= MULTI_MAX, of one format, dtype and width, sharing x)
 * as one pool job; 0 when their shape or the path does not allow it
 * (nothing done: the caller runs them one by one), else 1. */
void qm_matmul_exact(struct kiln_backend *be, float *out, const float *x, const struct qlinear *w, int n);
int qm_exact_multi(struct kiln_backend *be, float *const *outs, const float *x, const struct qlinear *const *ws, int count, int n);
void qm_matmul_int8(struct kiln_backend *be, float *out, const float *x, const struct qlinear *w, int n);
int qm_int8_multi(struct kiln_backend *be, float *const *outs, const float *x, const struct qlinear *const *ws, int count, int n);
/* cpu_matmul_tasks on the int8 path (count linears of one format, dtype and
 * width, each with its own x): 1 when done, 0 when the caller must run them
 * one by one (a GEMM among them) */
int qm_int8_tasks(struct kiln_backend *be, const struct cpu_mm *t, int count);
/* ... on the GPTQ / AWQ int8 path (no act order) */
int qm_gact_tasks(struct kiln_backend *be, const struct cpu_mm *t, int count);

/* What the two paths hand qm_run_tasks, which sets up each task (its x
 * quantized into stacked pieces of the per-call buffer, at most bytes in
 * all), gives a task with the previous one's x that set-up, and runs the
 * tasks as one pool job; it returns as qm_int8_tasks does. */
struct qm_task_ops {
    size_t job_size; /* the path's job struct */
    /* t's job set up: 2 (groups of 16 rows), 0 (rows), 1 (a GEMM: the
     * list goes one by one) or -1 (failed), as the paths' set-ups return */
    int (*setup)(struct kiln_backend *be, void *job, const struct cpu_mm *t);
    /* job, a copy of the previous task's job, made t's (mode: its set-up's) */
    void (*share)(void *job, const struct cpu_mm *t, int mode);
    /* whether job needs a per-thread panel (512 bytes per activation
     * block); with out, its pool task, its panels scr */
    int (*task)(void *job, int mode, void **scr, struct cpu_task *out);
    /* bytes of one item of the tasks (cpu_split_chunk) */
    size_t (*unit_bytes)(const void *job, int mode);
};
int qm_run_tasks(struct kiln_backend *be, const struct cpu_mm *t, int count, size_t bytes, const struct qm_task_ops *ops);
void qm_matmul_gact(struct kiln_backend *be, float *out, const float *x, const struct qlinear *w, int n);
int qm_gact_multi(struct kiln_backend *be, float *const *outs, const float *x, const struct qlinear *const *ws, int count, int n);
/* the group size if GPTQ / AWQ weights repacked into g can take the int8
 * path (qmatmul_gptq.c), else 0 */
int qm_gact_group(const struct qgrp *g);
/* x86: g's rows copied into groups of 16 rows (qmatmul_gptq.c's layout;
 * kiln_walloc'd), g's codes and scales freed; NULL when out of memory (g
 * untouched) */
uint8_t *qm_g16_pack(struct qgrp *g);

/* ==== int8 activations (qmatmul_int8.c, qmatmul_gptq.c) ==== */

/* One activation block: 32 codes, scale d (x ~ d * qs), and sum(qs). */
struct q8a {
    float d;
    int32_t sum;
    int8_t qs[32];
};

/* The reference integer sums of one 32-weight block against one activation
 * block's codes xq: 16 bytes of nibbles (byte i: weight i low, 16 + i
 * high; Q4_0's codes, qgrp's 4-bit rows), or 32 s8 codes (Q8_0). The
 * scalar kernels of every layout use them. */
static inline int qm_isum_q4(const uint8_t *c, const int8_t *xq) {
    int s = 0;
    for (int i = 0; i < 16; i++) s += (c[i] & 15) * xq[i] + (c[i] >> 4) * xq[16 + i];
    return s;
}
/* Q4_0 / Q4_1 / Q5_0 / Q5_1 blocks of 32 (T1: d and m, else d; FIVE: a
 * 4-byte qh before the 16 bytes of nibbles): a block's bytes, and the
 * offset of its nibbles */
static inline int qm_q45_bytes(int t1, int five) { return 18 + 2 * t1 + 4 * five; }
static inline int qm_q45_codes_at(int t1, int five) { return 2 + 2 * t1 + 4 * five; }
/* Q5_0 / Q5_1: code i (0..31) is Q4_0's nibble i plus bit i of the
 * block's 32-bit qh (little-endian) as its bit 4 */
static inline uint32_t qm_q5_qh(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static inline int qm_isum_q5(const uint8_t *qh, const uint8_t *c, const int8_t *xq) {
    const uint32_t h = qm_q5_qh(qh);
    int s = 0;
    for (int i = 0; i < 16; i++)
        s += ((c[i] & 15) | (int)(h >> i & 1) << 4) * xq[i] + ((c[i] >> 4) | (int)(h >> (16 + i) & 1) << 4) * xq[16 + i];
    return s;
}
/* IQ4_NL / IQ4_XS: 16 bytes of indices (nibbles as Q4_0's) into
 * quant_iq4_kv */
static inline int qm_isum_iq4(const uint8_t *c, const int8_t *xq) {
    int s = 0;
    for (int i = 0; i < 16; i++) s += quant_iq4_kv[c[i] & 15] * xq[i] + quant_iq4_kv[c[i] >> 4] * xq[16 + i];
    return s;
}
static inline int qm_isum_q8(const uint8_t *c, const int8_t *xq) {
    int s = 0;
    for (int i = 0; i < 32; i++) s += (int8_t)c[i] * xq[i];
    return s;
}

/* x[K] (K a multiple of 32) quantized into the K / 32 blocks b[]: d = amax
 * / 127, codes x / d rounded to nearest even, their sum. The AVX2 one gives
 * the same blocks and puts block i at b[i * stride] (stride 1: row-major;
 * NT: a GEMM's tiles of NT tokens). */
void qm_quantize_act(const float *x, struct q8a *b, int K);
#if defined(KILN_NEON)
void qm_quantize_act_neon(const float *x, struct q8a *b, int K, int stride);
#endif
#if defined(KILN_X86)
AVX2 void qm_quantize_act_avx2(const float *x, struct q8a *b, int K, int stride);
#endif
/* token t of x [n][K] into its K / 32 blocks in xa: row-major, or (NT > 0)
 * a GEMM's tiles of NT tokens, block b of token t at [(t / NT) nb + b] NT +
 * t % NT (the blocks of a token then NT apart). A token t >= n (a tile's
 * padding) gets zero blocks. Returns the token's first block. Shared by the
 * GGUF and the GPTQ / AWQ int8 paths (qmatmul_int8.c, qmatmul_gptq.c). */
struct q8a *qm_quant_token(const float *x, struct q8a *xa, int64_t t, int n, int K, int NT, int isa);

#if defined(KILN_X86)
/* The AVX2 int8 GEMMs' shared steps (8 rows x 4 tokens; panel layout in
 * qmatmul_int8_x86.c). qm_u8_groups: h[t] += the int16 pair sums of code
 * groups q0..q1-1 of a panel block (32 bytes each: 4 unsigned codes of each
 * row) with token t's 4 activation codes of each group (one broadcast);
 * qm_s8_groups the same for signed codes (maddubs of |w| with x signed by
 * w). The caller keeps the int16 lanes from overflowing. */
AVX2 static inline __attribute__((always_inline)) void qm_u8_groups(const uint8_t *P, const struct q8a *xt, int q0, int q1, __m256i *h) {
    #pragma GCC unroll 16
    for (int q = q0; q < q1; q++) {
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(P + 32 * q));
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) {
            int32_t a;
            memcpy(&a, xt[t].qs + 4 * q, 4);
            h[t] = _mm256_add_epi16(h[t], _mm256_maddubs_epi16(wv, _mm256_set1_epi32(a)));
        }
    }
}

AVX2 static inline __attribute__((always_inline)) void qm_s8_groups(const uint8_t *P, const struct q8a *xt, int q0, int q1, __m256i *h) {
    #pragma GCC unroll 16
    for (int q = q0; q < q1; q++) {
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(P + 32 * q)), aw = _mm256_sign_epi8(wv, wv);
        #pragma GCC unroll 16
        for (int t = 0; t < 4; t++) {
            int32_t a;
            memcpy(&a, xt[t].qs + 4 * q, 4);
            h[t] = _mm256_add_epi16(h[t], _mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_set1_epi32(a), wv)));
        }
    }
}

/* the tile's result: out[t][0..nr-1] = f[t] + bias for the nt real tokens */
AVX2 static inline __attribute__((always_inline)) void qm_gemm_out4(const __m256 *f, float *out, size_t ldo, int nr, int nt, const float *bias) {
    const __m256i m = mask8(nr);
    const __m256 bv = bias ? _mm256_maskload_ps(bias, m) : _mm256_setzero_ps();
    #pragma GCC unroll 16
    for (int t = 0; t < 4; t++)
        if (t < nt) _mm256_maskstore_ps(out + t * ldo, m, _mm256_add_ps(f[t], bv));
}

/* The same two steps of the VNNI int8 GEMMs (16 rows x 8 tokens):
 * qm_dp_groups: s[t] += vpdpbusd of code groups q0..q1-1 of a panel block
 * (64 bytes each: 4 u8 codes of each row) with token t's 4 activation codes
 * of each group (exact in i32); qm_gemm_out8: the tile's result */
VNNI static inline __attribute__((always_inline)) void qm_dp_groups(const uint8_t *P, const struct q8a *xt, int q0, int q1, __m512i *s) {
    #pragma GCC unroll 16
    for (int q = q0; q < q1; q++) {
        const __m512i wv = _mm512_loadu_si512((const void *)(P + 64 * q));
        #pragma GCC unroll 16
        for (int t = 0; t < 8; t++) {
            int32_t a;
            memcpy(&a, xt[t].qs + 4 * q, 4);
            s[t] = _mm512_dpbusd_epi32(s[t], wv, _mm512_set1_epi32(a));
        }
    }
}

VNNI static inline __attribute__((always_inline)) void qm_gemm_out8(const __m512 *f, float *out, size_t ldo, int nr, int nt, const float *bias) {
    const __mmask16 m = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias) : _mm512_setzero_ps();
    #pragma GCC unroll 16
    for (int t = 0; t < 8; t++)
        if (t < nt) _mm512_mask_storeu_ps(out + t * ldo, m, _mm512_add_ps(f[t], bv));
}
#endif

/* Q4_K / Q5_K: sub-block j's 6-bit scale d and min m from the superblock's
 * packed 12-byte table q */
static inline void k4_scale_min(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63, *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The AVX2 kernels take up to 4 activation rows (nx) per pass over a weight
 * row, so at prefill each block is unpacked once per 4 tokens. */
#define NX 4

/* the int8 GEMM's panel modes (qm_pack_i8): Q8_0 codes as s8 (AVX2) or as
 * u8 = w + 128 (VNNI), Q4_0 nibbles, Q4_K / Q5_K codes (0..15 / 0..31) of
 * each 32-weight sub-block with its scale and min (qm_gemm_qk_avx2; Q4_1,
 * Q5_0 and Q5_1 blocks go into the same panel, w = d q - min with min -m
 * or 16 d), Q6_K codes - 32 (s8) with the scales of their two halves
 * (qm_gemm_q6k_avx2), or as stored, 0..63 (u8, qm_gemm_q6k_vnni). Modes
 * PK_Q4K .. PK_Q51 share qm_gemm_qk_*'s panel, codes up to 31 from
 * PK_Q5K. */
enum { PK_Q8_S8 = 0, PK_Q8_U8 = 1, PK_Q4 = 2, PK_Q4K = 3, PK_Q41 = 4, PK_Q5K = 5, PK_Q50 = 6, PK_Q51 = 7, PK_Q6K = 8, PK_Q6KU = 9 };
/* bytes of one block of 32 in a panel of R rows: 32 R codes, R scales (and
 * for the K formats R mins, or for Q6_K R scales of the second half) */
#define PK_BLOCK(mode, R) ((size_t)(R) * ((mode) >= PK_Q4K ? 40 : 36))

#if defined(KILN_X86)
/* ==== the int8 path's x86 kernels (qmatmul_int8_x86.c) ====
 *
 * Row dots of one weight row (nb blocks of 32, or superblocks of 256 for
 * the K formats) with nx <= NX activation rows a[0..nx-1], into out[nx]. */
AVX2 void qm_dot_q8_0_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out);
AVX2 void qm_dot_q4_0_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out);
AVX2 void qm_dot_q4_1_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out);
AVX2 void qm_dot_q5_0_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out);
AVX2 void qm_dot_q5_1_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out);
AVX2 void qm_dot_q6_k_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out);
AVX2 void qm_dot_iq4nl_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out);
AVX2 void qm_dot_iq4xs_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out);
AVX2 void qm_dot_q2_k_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out);
AVX2 void qm_dot_q3_k_avx2(const uint8_t *w, const struct q8a *const *a, int nx, int nb, float *out);

/* The int8 GEMM: qm_pack_i8 repacks R rows from r0 (nr real ones) of W
 * (row bytes rb, nb blocks) into the panel P; a microkernel runs P against
 * one tile of nt tokens' activations xt ([block][NT]) into out (row stride
 * ldo), adding bias[0..nr-1] when not NULL. VNNI: R = 16, NT = 8, corr
 * 128 (Q8_0 as u8) or 8 (Q4_0), or the K formats (qm_gemm_qk_vnni,
 * qm_gemm_q6k_vnni); AVX2: R = 8, NT = 4. */
AVX2 void qm_pack_i8(uint8_t *P, const uint8_t *W, size_t rb, int r0, int nr, int nb, int R, int mode);
/* the same AVX2 panel (R = 8, PK_Q4K / PK_Q5K) cut from a Q4_K / Q5_K
 * linear in groups of 16 rows (qm_x16k_pack's copy G, ng groups, then the
 * rows past them as stored, rb bytes each): r0 a multiple of 8, so a panel
 * is half a group or stored rows. Its scales are the products the group
 * kernels form (d sc, dmin m in f32), so qm_gemm_qk_avx2 over it gives
 * their bits. */
AVX2 void qm_pack_i8_x16k(uint8_t *P, const uint8_t *G, size_t rb, int64_t ng, int r0, int nr, int nb, int q5);
VNNI void qm_gemm_qk_vnni(const uint8_t *P, const struct q8a *xt, int nb, float *out, size_t ldo, int nr, int nt, const float *bias);
/* hs: per block and token of the tile, 32 x the sums of the activation
 * codes of its two halves (the offset of the u8 codes) */
VNNI void qm_gemm_q6k_vnni(const uint8_t *P, const struct q8a *xt, const int32_t *hs, int nb, float *out, size_t ldo, int nr, int nt,
                           const float *bias);
VNNI void qm_gemm_i8_vnni(const uint8_t *P, const struct q8a *xt, int nb, int corr, float *out, size_t ldo, int nr, int nt,
                          const float *bias);
AVX2 void qm_gemm_q4_0_avx2(const uint8_t *P, const struct q8a *xt, int nb, float *out, size_t ldo, int nr, int nt, const float *bias);
AVX2 void qm_gemm_q8_0_avx2(const uint8_t *P, const struct q8a *xt, int nb, float *out, size_t ldo, int nr, int nt, const float *bias);
AVX2 void qm_gemm_qk_avx2(const uint8_t *P, const struct q8a *xt, int nb, int q5, float *out, size_t ldo, int nr, int nt, const float *bias);
AVX2 void qm_gemm_q6k_avx2(const uint8_t *P, const struct q8a *xt, int nb, float *out, size_t ldo, int nr, int nt, const float *bias);

/* Decode (one activation row a of nb blocks) of one Q4_0 / Q8_0 weight row
 * w. dot1: on a alone. dot1v (VNNI): with the per-block vectors corr (lane
 * 0 = -8 or -128 x the block's activation sum) and xd (the activation
 * scales). dot1a (AVX2): with xd, and for Q4_0 act2 (block pairs laid out
 * as the weights' nibbles) and cs (-8 x sum per block). dot1z / dot1w
 * (VNNI): block pairs act2 with corr2; dot1q (VNNI + VBMI): groups of 4
 * blocks act4 with corr4. qmatmul_int8.c's int8_setup builds them. */
AVX2 float qm_dot1_q4_0_avx2(const uint8_t *w, const struct q8a *a, int nb);
VNNI float qm_dot1_q4_0_vnni(const uint8_t *w, const struct q8a *a, int nb);
AVX2 float qm_dot1_q8_0_avx2(const uint8_t *w, const struct q8a *a, int nb);
VNNI float qm_dot1_q8_0_vnni(const uint8_t *w, const struct q8a *a, int nb);
/* The integer sums of one block of a 16-row group (Q4_0's and GPTQ's
 * layouts alike: 4 chunks of 64 bytes at c, chunk k = code bytes 4k .. 4k +
 * 3 of each row) with the T tokens x[0 .. T-1]: s[t] lane r = c0[t] +
 * sum_i q_ri x_ti, exact (c0 NULL: 0; Q4_0 passes -8 x the token's code
 * sum). The codes are split into nibbles once for all tokens, or (pre) come
 * split from a panel x16_unpack wrote: low nibbles of chunk k at c + 64k,
 * high ones at c + 256 + 64k (a prefill splits each group once per call
 * instead of once per tile of tokens). Each token's activation codes enter
 * as 4-byte broadcast loads (from general registers they cost a move
 * each). VNNI: 8 vpdpbusd per token, as two chains for a lone token. AVX2:
 * rows 8e .. 8e + 7 (a chunk's halves) in s[t][e]; 8 maddubs per token and
 * half add in i16 (8 x 2 x 15 x 127 < 2^15), one madd. Q5_0 / Q5_1 (five;
 * VNNI: h5 not NULL) merge the block's fifth bits at h5 into the codes
 * (not with pre: a panel x16_unpack5 wrote holds them merged). */
#define BC4_512(p) _mm512_broadcastd_epi32(_mm_loadu_si32(p))
#define BC4_256(p) _mm256_broadcastd_epi32(_mm_loadu_si32(p))
/* AVX2's signed int8 dot (no vpdpbssd): per i32 lane the sum of 4 products
 * w x of signed bytes, as maddubs of |w| (aw, given: shared by tokens) with
 * x signed by w, then madd with 1 (exact: |w x| <= 128 x 127) */
AVX2 static inline __attribute__((always_inline)) __m256i i8dot_sign_avx2(__m256i aw, __m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}
/* chunk k of a block at c as VNNI takes it: low and high nibbles (or pre:
 * a panel's rows) */
VNNI static inline __attribute__((always_inline)) void x16_nibbles512(const uint8_t *c, int pre, int k, __m512i *lo, __m512i *hi) {
    if (pre) {
        *lo = _mm512_loadu_si512((const void *)(c + 64 * k)), *hi = _mm512_loadu_si512((const void *)(c + 256 + 64 * k));
        return;
    }
    const __m512i v = _mm512_loadu_si512((const void *)(c + 64 * k)), m4 = _mm512_set1_epi8(15);
    *lo = _mm512_and_si512(v, m4), *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
}
/* the block's sums from its 4 chunks' low and high codes (u8) against T
 * tokens: s[t] lane r = c0[t] + sum, exact (c0 NULL: 0) */
VNNI static inline __attribute__((always_inline)) void x16_dots_vnni(const __m512i *lo, const __m512i *hi, const struct q8a *x, const int32_t *c0,
                                                                     int T, __m512i *s) {
    if (T == 1) {
        const int8_t *qs = x[0].qs;
        __m512i s0 = c0 ? BC4_512(c0) : _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            s0 = _mm512_dpbusd_epi32(s0, lo[k], BC4_512(qs + 4 * k));
            s1 = _mm512_dpbusd_epi32(s1, hi[k], BC4_512(qs + 16 + 4 * k));
        }
        s[0] = _mm512_add_epi32(s0, s1);
        return;
    }
    /* several tokens: the tokens' chains interleaved in program order (8 apart, as the int8 GEMM's) */
    #pragma GCC unroll 8
    for (int t = 0; t < T; t++) s[t] = c0 ? BC4_512(c0 + t) : _mm512_setzero_si512();
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++) s[t] = _mm512_dpbusd_epi32(s[t], lo[k], BC4_512(x[t].qs + 4 * k));
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++) s[t] = _mm512_dpbusd_epi32(s[t], hi[k], BC4_512(x[t].qs + 16 + 4 * k));
    }
}
VNNI static inline __attribute__((always_inline)) void x16_isum_vnni(const uint8_t *c, int pre, const uint8_t *h5, const struct q8a *x,
                                                                     const int32_t *c0, int T, __m512i *s) {
    const __m512i m16 = _mm512_set1_epi8(16);
    __m512i lo[4], hi[4], h = _mm512_setzero_si512();
    if (h5 && !pre) h = _mm512_loadu_si512((const void *)h5);
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        x16_nibbles512(c, pre, k, &lo[k], &hi[k]);
        if (h5 && !pre) { /* the fifth bits (qmatmul_internal.h): q | (hb & 16) */
            lo[k] = _mm512_ternarylogic_epi32(lo[k], _mm512_slli_epi16(h, 4 - k), m16, 0xF8);
            hi[k] = _mm512_ternarylogic_epi32(hi[k], k ? _mm512_srli_epi16(h, k) : h, m16, 0xF8);
        }
    }
    x16_dots_vnni(lo, hi, x, c0, T, s);
}
/* chunk k's half e of a block at c: the low and high nibbles (or pre: a
 * panel's two 32-byte rows) */
AVX2 static inline __attribute__((always_inline)) void x16_nibbles(const uint8_t *c, int pre, int k, int e, __m256i *lo, __m256i *hi) {
    if (pre) {
        *lo = _mm256_loadu_si256((const __m256i *)(c + 64 * k + 32 * e)), *hi = _mm256_loadu_si256((const __m256i *)(c + 256 + 64 * k + 32 * e));
        return;
    }
    const __m256i v = _mm256_loadu_si256((const __m256i *)(c + 64 * k + 32 * e)), m4 = _mm256_set1_epi8(15);
    *lo = _mm256_and_si256(v, m4), *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
}
AVX2 static inline __attribute__((always_inline)) void x16_isum_avx2(const uint8_t *c, int pre, int five, const uint8_t *h5, const struct q8a *x,
                                                                     const int32_t *c0, int T, __m256i (*s)[2]) {
    const __m256i m16 = _mm256_set1_epi8(16), one16 = _mm256_set1_epi16(1);
    __m256i h[2][2], g[2][2], hb[2];
    #pragma GCC unroll 2
    for (int t = 0; t < T; t++) h[t][0] = h[t][1] = g[t][0] = g[t][1] = _mm256_setzero_si256();
    #pragma GCC unroll 2
    for (int e = 0; e < 2; e++) hb[e] = five && !pre ? _mm256_loadu_si256((const __m256i *)(h5 + 32 * e)) : _mm256_setzero_si256();
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        #pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            __m256i lo, hi;
            x16_nibbles(c, pre, k, e, &lo, &hi);
            if (five && !pre) { /* the fifth bits (qmatmul_internal.h) */
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb[e], 4 - k), m16));
                hi = _mm256_or_si256(hi, _mm256_and_si256(k ? _mm256_srli_epi16(hb[e], k) : hb[e], m16));
            }
            #pragma GCC unroll 2
            for (int t = 0; t < T; t++) {
                const __m256i pl = _mm256_maddubs_epi16(lo, BC4_256(x[t].qs + 4 * k)), ph = _mm256_maddubs_epi16(hi, BC4_256(x[t].qs + 16 + 4 * k));
                if (five) /* 5-bit codes: the halves' sums apart (4 x 2 x 31 x 127 < 2^15) */
                    h[t][e] = _mm256_add_epi16(h[t][e], pl), g[t][e] = _mm256_add_epi16(g[t][e], ph);
                else
                    h[t][e] = _mm256_add_epi16(h[t][e], _mm256_add_epi16(pl, ph));
            }
        }
    }
    #pragma GCC unroll 2
    for (int t = 0; t < T; t++)
        #pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            s[t][e] = _mm256_madd_epi16(h[t][e], one16);
            if (five) s[t][e] = _mm256_add_epi32(s[t][e], _mm256_madd_epi16(g[t][e], one16));
            if (c0) s[t][e] = _mm256_add_epi32(s[t][e], BC4_256(c0 + t));
        }
}
/* IQ4_NL's (X16_IQ4): the 4 chunks' indices looked up in quant_iq4_kv,
 * or (pre) a panel x16_unpack_iq4 wrote with the values. VNNI takes them as
 * u8 (kv + 128, c0 = -128 x the code sum: exact, vpdpbusd does not
 * saturate); AVX2 as they are with Q8_0's sign trick (maddubs of |v| with
 * x signed by v; each maddubs to i32 at once: two pairs of 127 x 127 would
 * overflow i16) */
VNNI static inline __attribute__((always_inline)) void x16_isum_iq4_vnni(const uint8_t *c, int pre, const struct q8a *x, const int32_t *c0, int T,
                                                                         __m512i *s) {
    const __m512i kv = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)quant_iq4_kv)), _mm512_set1_epi8((char)0x80)); /* kv + 128 */
    __m512i lo[4], hi[4];
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        x16_nibbles512(c, pre, k, &lo[k], &hi[k]);
        if (!pre) lo[k] = _mm512_shuffle_epi8(kv, lo[k]), hi[k] = _mm512_shuffle_epi8(kv, hi[k]); /* the values */
    }
    x16_dots_vnni(lo, hi, x, c0, T, s);
}
AVX2 static inline __attribute__((always_inline)) void x16_isum_iq4_avx2(const uint8_t *c, int pre, const struct q8a *x, int T, __m256i (*s)[2]) {
    const __m256i kv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)quant_iq4_kv));
    #pragma GCC unroll 2
    for (int t = 0; t < T; t++) s[t][0] = s[t][1] = _mm256_setzero_si256();
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        #pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            __m256i lo, hi;
            x16_nibbles(c, pre, k, e, &lo, &hi);
            if (!pre) lo = _mm256_shuffle_epi8(kv, lo), hi = _mm256_shuffle_epi8(kv, hi); /* the values */
            const __m256i al = _mm256_sign_epi8(lo, lo), ah = _mm256_sign_epi8(hi, hi);
            #pragma GCC unroll 2
            for (int t = 0; t < T; t++)
                s[t][e] = _mm256_add_epi32(s[t][e], _mm256_add_epi32(i8dot_sign_avx2(al, lo, BC4_256(x[t].qs + 4 * k)),
                                                                     i8dot_sign_avx2(ah, hi, BC4_256(x[t].qs + 16 + 4 * k))));
        }
    }
}
/* one IQ4_NL block's 4 chunks at c as values into a panel (512 bytes at
 * P, x16_unpack's order): kv for AVX2, kv + 128 (u8) for VNNI */
AVX2 static inline void x16_unpack_iq4(const uint8_t *c, uint8_t *P, int vnni) {
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i kv = _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)quant_iq4_kv)),
                                        _mm256_set1_epi8(vnni ? (char)0x80 : 0));
    for (int o = 0; o < 256; o += 32) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(c + o));
        _mm256_storeu_si256((__m256i *)(P + o), _mm256_shuffle_epi8(kv, _mm256_and_si256(v, m4)));
        _mm256_storeu_si256((__m256i *)(P + 256 + o), _mm256_shuffle_epi8(kv, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)));
    }
}
/* Q8_0's: 8 chunks of s8 codes. VNNI takes them as u8 (q + 128: the xor
 * of the sign bit, or pre: from a panel x16_flip wrote), so c0 must hold
 * -128 x the token's code sum; AVX2 takes them as they are with the sign
 * trick (maddubs of |q| with x signed by q, one madd per chunk) and needs
 * no offset (c0 NULL). */
VNNI static inline __attribute__((always_inline)) void x16_isum8_vnni(const uint8_t *c, int pre, const struct q8a *x, const int32_t *c0, int T,
                                                                      __m512i *s) {
    const __m512i f = _mm512_set1_epi8((char)0x80);
    __m512i w[8];
    #pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        w[k] = _mm512_loadu_si512((const void *)(c + 64 * k));
        if (!pre) w[k] = _mm512_xor_si512(w[k], f);
    }
    if (T == 1) {
        __m512i s0 = BC4_512(c0), s1 = _mm512_setzero_si512();
        #pragma GCC unroll 4
        for (int k = 0; k < 8; k += 2) {
            s0 = _mm512_dpbusd_epi32(s0, w[k], BC4_512(x[0].qs + 4 * k));
            s1 = _mm512_dpbusd_epi32(s1, w[k + 1], BC4_512(x[0].qs + 4 * k + 4));
        }
        s[0] = _mm512_add_epi32(s0, s1);
        return;
    }
    #pragma GCC unroll 8
    for (int t = 0; t < T; t++) s[t] = BC4_512(c0 + t);
    #pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++) s[t] = _mm512_dpbusd_epi32(s[t], w[k], BC4_512(x[t].qs + 4 * k));
}
AVX2 static inline __attribute__((always_inline)) void x16_isum8_avx2(const uint8_t *c, const struct q8a *x, int T, __m256i (*s)[2]) {
    #pragma GCC unroll 2
    for (int t = 0; t < T; t++) s[t][0] = s[t][1] = _mm256_setzero_si256();
    #pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        #pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(c + 64 * k + 32 * e)), aw = _mm256_sign_epi8(w, w);
            #pragma GCC unroll 2
            for (int t = 0; t < T; t++)
                s[t][e] = _mm256_add_epi32(s[t][e], i8dot_sign_avx2(aw, w, BC4_256(x[t].qs + 4 * k)));
        }
    }
}
/* one Q8_0 block's 8 chunks at c as u8 codes (q + 128) into a panel (512
 * bytes at P), for x16_isum8_vnni with pre */
AVX2 static inline void x16_flip(const uint8_t *c, uint8_t *P) {
    const __m256i f = _mm256_set1_epi8((char)0x80);
    for (int o = 0; o < 512; o += 32) _mm256_storeu_si256((__m256i *)(P + o), _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(c + o)), f));
}
/* one block's 4 chunks at c split into the panel form x16_isum_* take with
 * pre (512 bytes at P) */
AVX2 static inline void x16_unpack(const uint8_t *c, uint8_t *P) {
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int o = 0; o < 256; o += 32) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(c + o));
        _mm256_storeu_si256((__m256i *)(P + o), _mm256_and_si256(v, m4));
        _mm256_storeu_si256((__m256i *)(P + 256 + o), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    }
}
/* ... Q5_0 / Q5_1: the codes (0..31) with their fifth bits from the 64
 * bytes at h5 (qmatmul_internal.h) */
AVX2 static inline void x16_unpack5(const uint8_t *c, const uint8_t *h5, uint8_t *P) {
    const __m256i m4 = _mm256_set1_epi8(15), m16 = _mm256_set1_epi8(16);
    for (int k = 0; k < 4; k++)
        for (int e = 0; e < 2; e++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(c + 64 * k + 32 * e)), h = _mm256_loadu_si256((const __m256i *)(h5 + 32 * e));
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4 - k), m16));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_and_si256(_mm256_srli_epi16(h, k), m16));
            _mm256_storeu_si256((__m256i *)(P + 64 * k + 32 * e), lo);
            _mm256_storeu_si256((__m256i *)(P + 256 + 64 * k + 32 * e), hi);
        }
}
/* group G (16 rows, nb blocks of format fmt, X16_*) against the
 * activation tile xt (block b of token t at xt[b NT + t], c8 likewise -8
 * (Q8_0: -128, Q5_0: -16) x its code sum; Q4_1 / Q5_1: the f32 xd x code
 * sum) for nt tokens: out[t ldo + r] = row r's sum (+ bias[r] when bias).
 * P: the group's codes split by x16_unpack (Q5_0 / Q5_1: x16_unpack5; Q8_0:
 * flipped by x16_flip, VNNI only), 512 bytes per block, or NULL to read
 * them here. VNNI: nt <= 8; AVX2: nt <= 2. */
VNNI void qm_x16_vnni(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *c8, int NT, int nt, int nb, int fmt, float *out,
                      size_t ldo, const float *bias);
/* Q4_K: group G of nsb superblocks, xs[b NT + t] = xd x code sum of token
 * t's block b */
VNNI void qm_x16k_vnni(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const float *xs, int NT, int nt, int nsb, int q5, float *out,
                       size_t ldo, const float *bias);
AVX2 void qm_x16k_avx2(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const float *xs, int NT, int nt, int nsb, int q5, float *out,
                       size_t ldo, const float *bias);
/* Q5_K (q5 = 1): P, when not NULL, holds the group's codes assembled by
 * qm_x16q5_unpack (4,096 bytes per superblock; Q4_K passes NULL) */
AVX2 void qm_x16q5_unpack(const uint8_t *p, uint8_t *P);
/* Q6_K: group G of nsb superblocks, h6[2 (b NT + t)] and [.. + 1] = -32 x
 * the code sums of the halves of token t's block b */
VNNI void qm_x16q6_vnni(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *h6, int NT, int nt, int nsb, int kv, float *out,
                        size_t ldo, const float *bias);
AVX2 void qm_x16q6_avx2(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *h6, int NT, int nt, int nsb, int kv, float *out,
                        size_t ldo, const float *bias);
/* ... P: the group's codes assembled by qm_x16q6_unpack (4,096 bytes per
 * superblock, 512 per sub-block), or NULL to assemble them per call */
AVX2 void qm_x16q6_unpack(const uint8_t *p, uint8_t *P, int kv);
/* IQ4_XS: group G of nsb superblocks, c8 as IQ4_NL's (-128 x each
 * activation block's code sum; VNNI only), P: the group's blocks as
 * x16_unpack_iq4 writes them (512 bytes per 32 weights), or NULL */
VNNI void qm_x16iq_vnni(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *c8, int NT, int nt, int nsb, float *out,
                        size_t ldo, const float *bias);
AVX2 void qm_x16iq_avx2(const uint8_t *G, const uint8_t *P, const struct q8a *xt, int NT, int nt, int nsb, float *out, size_t ldo,
                        const float *bias);
AVX2 void qm_x16_avx2(const uint8_t *G, const uint8_t *P, const struct q8a *xt, const int32_t *c8, int NT, int nt, int nb, int fmt, float *out,
                      size_t ldo, const float *bias);
VNNI float qm_dot1v_q4_0(const uint8_t *w, const __m256i *corr, const float *xd, const struct q8a *a, int nb);
VNNI float qm_dot1v_q8_0(const uint8_t *w, const __m256i *corr, const float *xd, const struct q8a *a, int nb);
/* The decode row kernels' loop over a chunk of rows 0 .. n-1: ROW(r) gives
 * row r's sum as 8 lanes, out[r] its total in kiln_hsum8x4's order. Each
 * row is one sequential pass (interleaving the steps of 2 or 4 adjacent
 * rows defeated the hardware prefetcher, 24 -> 10 GB/s on one core); the
 * rows come in a two-stream order (CPU_FOR_ROWS2, cpu.h): QM_ROWS4 takes
 * rows 0, h, 1, h + 1, then 2, h + 2, 3, h + 3, ... (h even). Looping in the kernel
 * instead of a call per row hoists the constants and the reduction: with
 * K = 1024 (4 steps of 8 blocks per row) a call per row ran at 39.5 GMAC/s
 * on one core in L2, against 48 for K = 4096.
 * QM_ROWS4 reduces four rows at a time; QM_ROWS1 each row on its own (the
 * same order per row, so results do not depend on how rows are split across
 * threads or chunks). AVX2 kernels take QM_ROWS4 (Q4_0 on one core, in L2
 * 48.7 against 43.0 GMAC/s, from DRAM 40.7-42.2 against 36.9-38.6), the
 * AVX-512 ones QM_ROWS1 (there QM_ROWS4 ran 8% slower from DRAM: Q4_0
 * K = 1024, 34-35 against 41-42 GMAC/s; in L2 both 52). */
#define QM_ROWS4(ROW, n, out)                                                                               \
    do {                                                                                                    \
        const int64_t h_ = ((n) / 2) & ~(int64_t)1;                                                         \
        int64_t a_ = 0, b_ = h_;                                                                            \
        for (; a_ + 2 <= h_ && b_ + 2 <= (n); a_ += 2, b_ += 2) {                                           \
            const __m256 v0_ = ROW(a_), v2_ = ROW(b_), v1_ = ROW(a_ + 1), v3_ = ROW(b_ + 1);                \
            const __m128 s_ = kiln_hsum8x4(v0_, v1_, v2_, v3_);                                             \
            _mm_storel_pi((__m64 *)((out) + a_), s_);                                                       \
            _mm_storeh_pi((__m64 *)((out) + b_), s_);                                                       \
        }                                                                                                   \
        for (; a_ < h_; a_++) {                                                                             \
            const __m256 v_ = ROW(a_);                                                                      \
            (out)[a_] = _mm_cvtss_f32(kiln_hsum8x4(v_, v_, v_, v_));                                        \
        }                                                                                                   \
        for (; b_ < (n); b_++) {                                                                            \
            const __m256 v_ = ROW(b_);                                                                      \
            (out)[b_] = _mm_cvtss_f32(kiln_hsum8x4(v_, v_, v_, v_));                                        \
        }                                                                                                   \
    } while (0)
#define QM_ROWS1(ROW, n, out)                                                                               \
    do {                                                                                                    \
        CPU_FOR_ROWS(r_, 0, (n), qm_two_cur) {                                                              \
            const __m256 v_ = ROW(r_);                                                                      \
            (out)[r_] = _mm_cvtss_f32(kiln_hsum8x4(v_, v_, v_, v_));                                        \
        }                                                                                                   \
    } while (0)
AVX2 void qm_rowsa_q8_0(const uint8_t *W, size_t rb, int64_t n, const float *xd, const struct q8a *a, int nb, float *out);
/* Q4_0 over nx <= NX activation rows (decode of 2-7 sequences): per row t
 * its pair vectors x2[t] (act2's layout), xd[t] and cs[t] as qm_rowsa_q4_0
 * takes them, into out[t] */
AVX2 void qm_rowm_q4_0(const uint8_t *w, const __m256i *const *x2, const float *const *xd, const float *const *cs, const struct q8a *const *a,
                       int nb, int nx, float *out);
/* ... Q8_0 (xd[t] as qm_rowsa_q8_0 takes it) */
AVX2 void qm_rowm_q8_0(const uint8_t *w, const float *const *xd, const struct q8a *const *a, int nb, int nx, float *out);
AVX2 void qm_rowsa_q4_0(const uint8_t *W, size_t rb, int64_t n, const void *act2, const float *xd, const float *cs, const struct q8a *a, int nb,
                        float *out);
/* Q4_K (q5 = 0) / Q5_K (q5 = 1) decode: xd per 32-block the activation
 * scale, xs that times the block's code sum */
AVX2 void qm_rowsk_qk(const uint8_t *W, size_t rb, int64_t n, const float *xd, const float *xs, const struct q8a *a, int nsb, int q5,
                      float *out);
/* Q6_K decode: xd per 32-block the activation scale */
AVX2 void qm_rowsk_q6k(const uint8_t *W, size_t rb, int64_t n, const float *xd, const struct q8a *a, int nsb, float *out);
/* ... (Q4_K / Q5_K) over nx <= 4 activation rows (prefill), xd / xs per row */
/* Q6_K over nx <= NX activation rows (decode of 2-7 sequences), xd per row */
AVX2 void qm_dotk_q6k(const uint8_t *w, const struct q8a *const *a, const float *const *xd, int nx, int nsb, float *out);
AVX2 void qm_dotk_qk(const uint8_t *w, const struct q8a *const *a, const float *const *xd, const float *const *xs, int nx, int nsb, int q5,
                     float *out);
VNNI float qm_dot1z_q4_0(const uint8_t *w, const __m512i *corr2, const __m512i *act2, const float *xd, const struct q8a *a, int nb);
VNNI void qm_rowsw_q8_0(const uint8_t *W, size_t rb, int64_t n, const __m512i *corr2, const __m512i *act2, const float *xd, const struct q8a *a,
                        int nb, float *out);

/* widest rows (in blocks of 32) given to qm_rowsq_q4_0: measured from DRAM
 * (2 threads, 1.77 MB matrices) it is 4-10% faster than qm_dot1z_q4_0 at
 * K = 1024 and 1536, but 6% slower at K = 2048 and 20-28% slower at 3072
 * and 4096 (one thread: 48 against 65 GMAC/s), though 25% faster at 3072
 * in L2; not understood */
#define Q4Q_MAX_NB 48
VBMI void qm_rowsq_q4_0(const uint8_t *W, size_t rb, int64_t n, const __m512i *corr4, const __m512i *act4, const float *xd, const struct q8a *a,
                        int nb, float *out);
#endif /* KILN_X86 */

#if defined(KILN_NEON)
/* The integer dot of 16 s8 pairs into 4 i32 lanes (added to acc), for the
 * NEON int8 dots (qmatmul_int8.c, qmatmul_gptq.c). Baseline NEON: smull /
 * smull2 (|a b| <= 128 x 127 fits i16) and sadalp; with dotprod: sdot. */
#define DP_ATTR __attribute__((target("arch=armv8.2-a+dotprod")))

static inline int32x4_t i8dot_neon(int32x4_t acc, int8x16_t a, int8x16_t b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}
DP_ATTR static inline int32x4_t i8dot_dp(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }

/* The NEON int8 GEMM (qmatmul_int8_neon.c; its header comment has the
 * tiles): from QN_MIN tokens, tokens in tiles of QN_NT (the activations
 * quantized by qm_quant_token with NT = QN_NT). The weights: GGUF Q8_0 /
 * Q4_0 rows W (rb bytes each; q4: Q4_0), or (G > 0) GPTQ / AWQ 4-bit rows
 * g with G groups of bpg blocks. */
/* QN_MIN from instruction counts (gcc 12 -O2; no ARM machine to time on),
 * per 32-weight block and row: the row dots take 15 / 18 (dotprod Q8_0 /
 * Q4_0) and 20.5 / 24 (neon) per token; the GEMM ~3.8 (dotprod) and 9.3 /
 * 7.9 (neon) per token slot of a tile of 4, plus ~8-20 to pack the row
 * once per call. From 4 tokens (one whole tile) it is 1.7-2.5x fewer;
 * at 3 (a tile with a padding token) still ahead but narrowly, at 2 behind. */
enum { QN_NT = 4, QN_MIN = 4 };
struct qn_src {
    const uint8_t *W;
    size_t rb;
    int q4;
    const struct qgrp *g;
    int G, bpg;
};
struct qn_gemm {
    struct qn_src src;
    const struct q8a *xa; /* [ntile][nb][QN_NT] */
    float *xd;            /* [ntile][nb][QN_NT]: filled by qm_neon_gemm */
    const float *sx;      /* GPTQ: SX_g per token, [ntile][G][QN_NT] */
    float *out;           /* [n][N] */
    const float *bias;    /* [N] or NULL */
    int64_t N;
    int n, nb, ntile, dp; /* dp: the sdot kernel (CPU_ISA_DOTPROD), else smull */
    void **scr;
};
/* out = x W^T (+ bias) for the job's n tokens, on the pool (the per-thread
 * panels from cpu_scratch_threads: when they cannot be had, nothing is
 * done and cpu_error reports it) */
void qm_neon_gemm(struct kiln_backend *be, struct qn_gemm *j);
#endif /* KILN_NEON */

#endif
