/*
 * qmatmul.c: y = x W^T + b on the CPU for the quantized formats (FP8 block,
 * GPTQ, AWQ, GGUF blocks). matmul.c hands every non-dense linear here.
 * Everything runs on the backend's worker pool (cpu_parallel_for), and each
 * kernel has a scalar reference path (KILN_CPU_ISA=scalar) that the tests
 * hold the AVX2 and AVX-512 paths to (test_quant.c, test_qgemm).
 *
 * Two numerics, both reading the weights as stored (or as repacked once at
 * load: GPTQ/AWQ into format/quant.h's struct qgrp, on x86 then with Q4_0
 * and Q8_0 into groups of 16 rows):
 *
 *   exact   (FP8, GPTQ/AWQ 8-bit or with groups the int8 path cannot take;
 *           anything with KILN_QACT=f32)
 *           f32 activations, weights dequantized to f32 (w = s * q + b), f32
 *           products: equal to the dequantized weights' matmul up to f32
 *           summation order.
 *             decode (n <= 4): fused dequantize + FMA per row, no scratch,
 *               one run of rows per thread (AVX2, NEON; AVX-512 one-row
 *               kernel for 4-bit GPTQ/AWQ; g128 in order: lut128_rows_512);
 *             prefill (n >= 8): a GEMM: NR weight rows dequantized once into
 *               an f32 panel [k][NR] (8 x 8 transposes; NEON 4 x 4), x packed
 *               once in tiles of MR tokens, an MR x NR register-tiled
 *               microkernel (AVX-512 12 x 32, AVX2 6 x 16, NEON 8 x 12:
 *               matmul.c's);
 *             otherwise (scalar, n 5..7): one row dequantized to scratch and
 *               matmul.c's f32 dots.
 *   int8    (GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, the llama.cpp way; GPTQ
 *           and AWQ 4-bit with groups of 32, 64 or k x 128: a file of its
 *           own, qmatmul_gptq.c)
 *           activations quantized once per call to int8 blocks of 32 (f32
 *           scale + the block's integer sum); integer dot products of the
 *           stored codes with the activation codes, scaled per block. Costs
 *           ~0.5% relative error per dot from rounding x: the tests bound it
 *           separately. KILN_QACT=f32 forces the exact path.
 *             Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K on x86 (the K formats from
 *               AVX2): the weight copied once at load into groups of 16
 *               rows (qmatmul_internal.h), one kernel family for every n
 *               (16 rows x up to 8 tokens per pass, VNNI or AVX2; the
 *               scalar one gives the same bits; Q4_K / Q5_K prefill without
 *               VNNI: the AVX2 GEMM on panels cut from the groups, the same
 *               bits); KILN_CPU_X16=0 keeps the stored blocks and the
 *               kernels below.
 *             decode (n = 1): one row at a time, 4+ independent accumulators,
 *               software prefetch, one contiguous run of rows per thread
 *               (cpu_parallel_for_split); AVX-512 VNNI kernels for Q8_0 / Q4_0
 *               (vpdpbusd, 8 block scales converted at once; Q4_0 two blocks
 *               per zmm);
 *             prefill (n >= 8, Q8_0 / Q4_0): the int8 GEMM (weights
 *               repacked per call into 4-byte-interleaved panels, VNNI or
 *               AVX2 microkernel over tiles of tokens);
 *             otherwise: row dots over up to 4 activation rows (AVX2).
 *
 * Act-order GPTQ: x is permuted once per call (x'[k] = x[perm[k]]) so the
 * repacked rows read groups contiguously.
 *
 * This file prepares and releases a linear, owns the per-call buffer and
 * the CPU feature probes, and sends each call to its path: qmatmul_exact.c
 * (exact), qmatmul_int8.c with its x86 kernels in qmatmul_int8_x86.c
 * (int8, GGUF blocks), qmatmul_gptq.c (int8, GPTQ / AWQ 4-bit). What they
 * share is in qmatmul_internal.h.
 */
#include "backend/cpu/qmatmul_internal.h"

static int qact_f32(void) {
    const char *e = getenv("KILN_QACT");
    return e && !strcmp(e, "f32");
}

static int want_int8(enum kiln_dtype t) {
    if (qact_f32()) return 0;
    return t == KILN_DTYPE_Q8_0 || t == KILN_DTYPE_Q4_0 || t == KILN_DTYPE_Q4_1 || t == KILN_DTYPE_Q5_0 || t == KILN_DTYPE_Q5_1 ||
           t == KILN_DTYPE_Q4_K || t == KILN_DTYPE_Q5_K || t == KILN_DTYPE_Q6_K || t == KILN_DTYPE_IQ4_NL || t == KILN_DTYPE_IQ4_XS ||
           t == KILN_DTYPE_Q2_K || t == KILN_DTYPE_Q3_K;
}

#if defined(KILN_X86)
/* Q4_0 and GPTQ / AWQ 4-bit linears of the int8 path go into groups of 16
 * rows at load (qmatmul_internal.h, qmatmul_gptq.c); KILN_CPU_X16=0 keeps
 * them as stored / as qgrp rows, for A/B runs */
static int x16_on(void) {
    const char *e = getenv("KILN_CPU_X16");
    return !(e && !strcmp(e, "0"));
}
#endif

int cpu_qprepare_linear(struct qlinear *w, char *err, size_t errlen) {
    if (quant_check_linear(w, "linear", err, errlen)) return -1;
    struct qprep *p = kiln_calloc(1, sizeof *p);
    switch (w->fmt) {
    case KILN_WFMT_FP8: {
        if (!qm_fp8_lut[0x38]) /* 0x38 = 1.0: the table is filled (idempotent, same values from any thread) */
            for (int i = 0; i < 256; i++) qm_fp8_lut[i] = kiln_fp8e4m3_to_f32((uint8_t)i);
        int64_t n = w->scales.rows * w->scales.cols;
        p->fp8_scale = kiln_malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) p->fp8_scale[i] = quant_scalar(&w->scales, i);
        break;
    }
    case KILN_WFMT_GPTQ:
    case KILN_WFMT_AWQ:
        if (qgrp_pack(&p->grp, w, err, errlen)) {
            free(p);
            return -1;
        }
        p->gact = qact_f32() ? 0 : qm_gact_group(&p->grp);
#if defined(KILN_X86)
        if (p->gact && x16_on() && !(p->g16 = qm_g16_pack(&p->grp))) {
            qgrp_free(&p->grp);
            free(p);
            return kiln_errf(err, errlen, "cpu: out of memory repacking a 4-bit linear (%d x %d)", w->n_out, w->n_in);
        }
#endif
        w->repacked = 1;
        break;
    case KILN_WFMT_GGUF:
        p->int8_act = want_int8(w->w.dtype);
#if defined(KILN_X86)
        /* Q4_K (and Q5_K, its kernel) from AVX2: decode on the group
         * kernels, prefill without VNNI on the 8 x 4 GEMM over panels cut
         * from the groups (qm_pack_i8_x16k; held to AVX2, decode-ab against
         * the stored rows: 0.6B / 1.7B Q4_K_M 1.062 / 1.088, Q5_K_M 1.040 /
         * 1.028, pp512 even; docs/cpu.md). Q6_K on AVX2 too: decode 4-9%
         * faster there, prefill even to 15% slower */
        if (p->int8_act && x16_on() &&
            (w->w.dtype == KILN_DTYPE_Q4_0 || w->w.dtype == KILN_DTYPE_Q8_0 || w->w.dtype == KILN_DTYPE_Q6_K || w->w.dtype == KILN_DTYPE_Q4_1 ||
             w->w.dtype == KILN_DTYPE_Q5_0 || w->w.dtype == KILN_DTYPE_Q5_1 || w->w.dtype == KILN_DTYPE_IQ4_NL || w->w.dtype == KILN_DTYPE_IQ4_XS ||
             w->w.dtype == KILN_DTYPE_Q3_K || w->w.dtype == KILN_DTYPE_Q2_K ||
             ((w->w.dtype == KILN_DTYPE_Q4_K || w->w.dtype == KILN_DTYPE_Q5_K) && cpu_isa() >= CPU_ISA_AVX2))) {
            p->x16 = w->w.dtype == KILN_DTYPE_Q4_K   ? qm_x16k_pack(w->w.data, w->n_out, w->n_in, 0)
                     : w->w.dtype == KILN_DTYPE_Q5_K ? qm_x16k_pack(w->w.data, w->n_out, w->n_in, 1)
                     : w->w.dtype == KILN_DTYPE_Q6_K ? qm_x16q6_pack(w->w.data, w->n_out, w->n_in)
                     : w->w.dtype == KILN_DTYPE_IQ4_XS ? qm_x16iq_pack(w->w.data, w->n_out, w->n_in)
                     : w->w.dtype == KILN_DTYPE_Q3_K ? qm_x16q3_pack(w->w.data, w->n_out, w->n_in)
                     : w->w.dtype == KILN_DTYPE_Q2_K ? qm_x16q2_pack(w->w.data, w->n_out, w->n_in)
                     : qm_x16_pack(w->w.data, w->n_out, w->n_in,
                                   w->w.dtype == KILN_DTYPE_Q8_0   ? X16_Q8
                                   : w->w.dtype == KILN_DTYPE_Q4_1 ? X16_Q41
                                   : w->w.dtype == KILN_DTYPE_Q5_0 ? X16_Q50
                                   : w->w.dtype == KILN_DTYPE_Q5_1 ? X16_Q51
                                   : w->w.dtype == KILN_DTYPE_IQ4_NL ? X16_IQ4
                                                                   : X16_Q4);
            if (!p->x16) {
                free(p);
                return kiln_errf(err, errlen, "cpu: out of memory repacking a %s linear (%d x %d)", dtype_name(w->w.dtype), w->n_out, w->n_in);
            }
            w->repacked = 1;
        }
#endif
        break;
    default: free(p); return kiln_errf(err, errlen, "cpu: weight format %d is not supported", (int)w->fmt);
    }
    w->be = p;
    return 0;
}

void cpu_qrelease_linear(struct qlinear *w) {
    struct qprep *p = w->be;
    if (!p) return;
    qgrp_free(&p->grp);
    free(p->fp8_scale);
    kiln_wfree(p->x16);
    kiln_wfree(p->g16);
    free(p);
    w->be = NULL;
}

/* ==== shared by the paths ==== */

int qm_buf_get(struct kiln_backend *be, const size_t *sz, void **ptr, int n) {
    struct cpu_ctx *c = be->ctx;
    size_t tot = 0;
    for (int i = 0; i < n; i++) tot += (sz[i] + 63) & ~(size_t)63;
    if (c->qscratch_top != (size_t)-1) { /* stacking: after the pieces already taken, never grown */
        if (tot > c->qscratch_cap - c->qscratch_top) {
            c->qscratch_full = 1;
            return -1;
        }
        char *p = (char *)c->qscratch + c->qscratch_top;
        for (int i = 0; i < n; i++) ptr[i] = sz[i] ? p : NULL, p += (sz[i] + 63) & ~(size_t)63;
        c->qscratch_top += tot;
        return 0;
    }
    if (tot > c->qscratch_cap) {
        free(c->qscratch);
        c->qscratch_cap = 0;
        if (!(c->qscratch = cpu_scratch_alloc(be, tot))) return -1; /* reported by cpu_error */
        c->qscratch_cap = tot;
    }
    char *p = c->qscratch;
    for (int i = 0; i < n; i++) ptr[i] = sz[i] ? p : NULL, p += (sz[i] + 63) & ~(size_t)63;
    return 0;
}

int qm_buf_stack(struct kiln_backend *be, size_t bytes) {
    struct cpu_ctx *c = be->ctx;
    if (bytes > c->qscratch_cap) {
        free(c->qscratch);
        c->qscratch_cap = 0;
        if (!(c->qscratch = cpu_scratch_alloc(be, bytes))) return -1; /* reported by cpu_error */
        c->qscratch_cap = bytes;
    }
    c->qscratch_top = 0, c->qscratch_full = 0;
    return 0;
}

int qm_buf_unstack(struct kiln_backend *be) {
    struct cpu_ctx *c = be->ctx;
    c->qscratch_top = (size_t)-1;
    return c->qscratch_full;
}

#if defined(KILN_X86)
int qm_have_vbmi(void) {
    static int v = -1;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512vbmi");
    }
    return v;
}

int qm_have_vnni(void) {
    static int v = -1;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    }
    return v;
}

#endif /* KILN_X86 */

/* ==== dispatch ==== */

int cpu_qmatmul_multi(struct kiln_backend *be, float *const *outs, const float *x, const struct qlinear *const *ws, int count,
                      int n) {
    const struct qprep *p0 = ws[0]->be;
    if (count > MULTI_MAX) return 0;
    if (p0->int8_act) return qm_int8_multi(be, outs, x, ws, count, n);
    if (p0->gact) return qm_gact_multi(be, outs, x, ws, count, n);
    return qm_exact_multi(be, outs, x, ws, count, n);
}

static _Atomic long tasks_jobs; /* task lists run as one job (tests) */

long cpu_test_tasks_jobs(void) { return tasks_jobs; }

int qm_run_tasks(struct kiln_backend *be, const struct cpu_mm *t, int count, size_t bytes, const struct qm_task_ops *ops) {
    const size_t js = ops->job_size;
    char *jobs = cpu_scratch_alloc(be, js * (size_t)count);
    struct cpu_task *tk = cpu_scratch_alloc(be, sizeof *tk * (size_t)count);
    if (!jobs || !tk || qm_buf_stack(be, bytes)) {
        free(jobs), free(tk);
        return 1; /* skipped; reported by cpu_error */
    }
    /* each distinct x set up (quantized) into its own pieces; a task with the
     * previous one's x takes its set-up, as the multi-linear jobs do */
    int mode = -1, bad = 0;
    for (int i = 0; i < count && !bad; i++) {
        void *j = jobs + js * (size_t)i;
        if (i && t[i].x == t[i - 1].x && t[i].n == t[i - 1].n) {
            memcpy(j, jobs + js * (size_t)(i - 1), js);
            ops->share(j, &t[i], mode);
            continue;
        }
        const int m = ops->setup(be, j, &t[i]);
        bad = m < 0 || m == 1 || (mode >= 0 && m != mode);
        mode = m;
    }
    if (qm_buf_unstack(be) || bad) {
        /* a piece past the bound (a set-up's only failure while stacking)
         * or a GEMM after all: nothing written yet, one by one */
        free(jobs), free(tk);
        return 0;
    }
    int panel = 0;
    for (int i = 0; i < count; i++) panel |= ops->task(jobs + js * (size_t)i, mode, NULL, NULL);
    void **scr = NULL;
    if (panel && !(scr = cpu_scratch_threads(be, 512 * (size_t)(t[0].w->n_in / 32)))) {
        free(jobs), free(tk);
        return 1; /* skipped; reported by cpu_error */
    }
    for (int i = 0; i < count; i++) ops->task(jobs + js * (size_t)i, mode, scr, &tk[i]);
    cpu_parallel_for_split_tasks(be, tk, count, ops->unit_bytes(jobs, mode));
    cpu_scratch_threads_free(be, scr);
    free(jobs), free(tk);
    tasks_jobs++;
    return 1;
}

int cpu_qmatmul_tasks(struct kiln_backend *be, const struct cpu_mm *t, int count) {
    const struct qprep *p0 = t[0].w->be;
    return p0->int8_act ? qm_int8_tasks(be, t, count) : p0->gact ? qm_gact_tasks(be, t, count) : 0;
}

void cpu_qmatmul(struct kiln_backend *be, void *out, const void *x, const struct qlinear *w, int n) {
    const struct qprep *p = w->be;
    if (p->int8_act) qm_matmul_int8(be, out, x, w, n);
    else if (p->gact) qm_matmul_gact(be, out, x, w, n);
    else qm_matmul_exact(be, out, x, w, n);
}
