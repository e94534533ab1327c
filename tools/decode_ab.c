/*
 * decode_ab.c: a paired A/B of a CPU switch inside one process, for hosts
 * whose bandwidth drifts faster than whole runs can be alternated (a shared
 * VM: ±15% from one minute to the next).
 *
 *   make decode-ab
 *   ./build/decode-ab model MODEL[:QUANT] SWITCH A B [rounds] [steps] [past]
 *   ./build/decode-ab gemv K N SWITCH A B [rounds] [n] [bf16|f16]
 *   ./build/decode-ab att PAST HEAD_DIM SWITCH A B [rounds] [group]
 *
 * SWITCH is a setting the CPU backend can change between calls; today
 * `gemv-streams` (cpu_set_gemv_streams: 1 or 2 streams, 0 by row size) and
 * `isa` (cpu_set_isa: 0 scalar, 1 AVX2, 2 AVX-512 on x86), `gemv-pfd` (the
 * dense GEMV's prefetch distance in bytes, 0 none; `gemv-pfd-batch` the
 * same for 2+ activation rows; `b12-pfd` the AVX2 12-bit BF16 loop's at
 * batch 1), `b12-vbmi` (the AVX-512 12-bit decode with VBMI, 0 / 1),
 * `b12-pairs2` (the AVX2 12-bit loop's pairs of rows at batch 1, 0 / 1),
 * `moe-tasks` (an MoE layer's experts as lists of matmuls: 0 off, 1 on,
 * more: batches of that many gathered rows), `att-pfd` (how far ahead in
 * bytes decode attention's L2 prefetch runs, 0 none),
 * `gemv-rows` (the
 * L1D bytes a row must overflow for its batch-1 loop to read four rows at
 * a time, 0 never, nor AVX-512's pairs at 2-4 activation rows) and, on
 * x86, `qm-pfd`,
 * `qm-pf2` (the groups' L2 prefetch distance), `qm-streams` (1 or 2) and `vnni-dec` (0 or 1) of the int8 decode kernels;
 * and `env:NAME`, a setting read at load (KILN_CPU_X16, KILN_CPU_B12):
 * each arm decodes on its own engine, opened with NAME=A or NAME=B; and
 * `kv` (model, att), the KV cache's type: 0 f32, 1 f16, 2 bf16, 3 q8_0, an
 * engine (a cache) per arm. Each round times A and B
 * once each, in ABBA order across rounds, and the tool prints each arm's
 * median rate and the median and quartiles of the per-round B/A ratios:
 * a drift slower than one round cancels out of each ratio.
 *
 * model: `--dummy` MODEL (QUANT as --quant), or the checkpoint or .gguf file at
 *   MODEL when it holds a '/' (F16 KV cache, 2 threads), one
 *   untimed token (or `past` tokens of context, default 1, prefilled once),
 *   then per arm `steps` decode steps (default 32) with the last logits
 *   read, the sequence cut back to its context before each arm.
 * gemv: distinct BF16 (or F16) K x N matrices filling ~256 MB (walloc'd, as the
 *   model's), each arm one sweep of the decode GEMV over all of them, for
 *   n activation rows (1..7, default 1: a decode batch of n); rates in GB/s
 *   of the 16-bit matrices (weights per second x 2, whatever the backend
 *   stores: KILN_CPU_B12's 12-bit rows read 0.76 of that). env:NAME here
 *   prepares a set of matrices per arm (`env:KILN_CPU_B12 0 1`).
 * att: decode attention alone (be->attention), Qwen3-0.6B's shape (28
 *   layers, 8 KV heads of HEAD_DIM, `group` query heads each, default 2:
 *   Qwen3-0.6B / 1.7B; 4: 4B / 8B, 5: 14B, 8: 32B), one row after PAST
 *   cached tokens in pages of 16 scattered over the pool (F16 cache unless
 *   SWITCH is kv); each arm one step over the 28 layers; rates in steps/s.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "base/base.h"
#include "kiln.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int set_switch(const char *sw, int v) {
    if (!strcmp(sw, "gemv-streams")) return cpu_set_gemv_streams(v) == v ? 0 : -1;
    if (!strcmp(sw, "isa")) return cpu_set_isa(v) == v ? 0 : -1;
    if (!strcmp(sw, "gemv-pfd")) return cpu_set_gemv_pfd(v) == v ? 0 : -1;
    if (!strcmp(sw, "gemv-rows")) return cpu_set_gemv_rows(v) == v ? 0 : -1;
    if (!strcmp(sw, "gemv-pfd-batch")) return cpu_set_gemv_pfd_batch(v) == v ? 0 : -1;
    if (!strcmp(sw, "b12-pfd")) return cpu_set_b12_pfd(v) == v ? 0 : -1;
    if (!strcmp(sw, "b12-vbmi")) return cpu_set_b12_vbmi(v) == v ? 0 : -1;
    if (!strcmp(sw, "b12-pairs2")) return cpu_set_b12_pairs2(v) == v ? 0 : -1;
    if (!strcmp(sw, "moe-tasks")) return cpu_set_moe_tasks(v) == v ? 0 : -1;
    if (!strcmp(sw, "att-pfd")) return cpu_set_att_pfd(v) == v ? 0 : -1;
#if defined(__x86_64__)
    if (!strcmp(sw, "qm-pfd")) return cpu_set_qm_pfd(v) == v ? 0 : -1;
    if (!strcmp(sw, "qm-pf2")) return cpu_set_qm_pf2(v) == v ? 0 : -1;
    if (!strcmp(sw, "qm-streams")) return cpu_set_qm_two(v == 2) == (v == 2) ? 0 : -1;
    if (!strcmp(sw, "vnni-dec")) return cpu_set_vnni_dec(v) == v ? 0 : -1;
#endif
    return -1;
}

/* the rates of both arms per round: rate[0][r] (A), rate[1][r] (B) */
static void report(const char *what, const char *unit, int a, int b, double *const rate[2], int rounds) {
    double *ratio = kiln_malloc(sizeof(double) * (size_t)rounds);
    for (int r = 0; r < rounds; r++) ratio[r] = rate[1][r] / rate[0][r];
    qsort(rate[0], (size_t)rounds, sizeof(double), cmp), qsort(rate[1], (size_t)rounds, sizeof(double), cmp);
    qsort(ratio, (size_t)rounds, sizeof(double), cmp);
    printf("%s: A=%d median %.2f %s, B=%d median %.2f %s; B/A median %.3f [quartiles %.3f, %.3f] over %d rounds\n", what, a,
           rate[0][rounds / 2], unit, b, rate[1][rounds / 2], unit, ratio[rounds / 2], ratio[rounds / 4], ratio[3 * rounds / 4], rounds);
    free(ratio);
}

static const char *const kv_names[] = {"f32", "f16", "bf16", "q8_0"};
static const enum kiln_dtype kv_types[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_Q8_0};

/* one engine on the CPU (2 threads, KV cache of type kvt) with its sequence
 * after past untimed tokens (ids below the vocabulary); NULL with err */
static kiln_engine *open_one(const char *model, const char *quant, int file, int past, int steps, const char *kvt, kiln_seq **s,
                             char *err, size_t errlen) {
    struct kiln_engine_opts o = {.model = file ? model : NULL, .dummy = file ? NULL : model, .quant = file ? NULL : quant,
                                 .backend = "cpu", .n_threads = 2, .kv_dtype = kvt,
                                 .max_total_tokens = past + steps + 1024, .seed = 1};
    kiln_engine *e = kiln_engine_open(&o, err, errlen);
    if (!e) return NULL;
    const int vocab = kiln_engine_config(e)->vocab;
    int32_t *t = kiln_malloc(sizeof(int32_t) * (size_t)past);
    for (int i = 0; i < past; i++) t[i] = (int32_t)((1 + (int64_t)i * 7919) % vocab);
    const int bad = !(*s = kiln_seq_new(e, err, errlen)) || kiln_seq_eval(*s, t, past, NULL, 0, err, errlen);
    free(t);
    if (bad) {
        if (*s) kiln_seq_free(*s);
        kiln_engine_close(e);
        return NULL;
    }
    return e;
}

static int run_model(const char *spec, const char *sw, int A, int B, int rounds, int steps, int past) {
    char model[128], err[512];
    snprintf(model, sizeof model, "%s", spec);
    char *quant = strchr(model, ':');
    if (quant) *quant++ = 0;
    const int file = strchr(model, '/') != NULL; /* a checkpoint or .gguf path, else a --dummy name */
    /* env:NAME: a load-time setting; each arm its own engine, opened with NAME=A or NAME=B; kv: with that cache type */
    const char *env = !strncmp(sw, "env:", 4) ? sw + 4 : NULL;
    const int kv = !strcmp(sw, "kv"), two = env || kv;
    kiln_engine *e[2] = {NULL, NULL};
    kiln_seq *s[2] = {NULL, NULL};
    for (int arm = 0; arm < (two ? 2 : 1); arm++) {
        char v[32];
        snprintf(v, sizeof v, "%d", arm ? B : A);
        if (env) setenv(env, v, 1);
        if (!(e[arm] = open_one(model, quant, file, past, steps, kv ? kv_names[arm ? B : A] : "f16", &s[arm], err, sizeof err)))
            return fprintf(stderr, "decode-ab: %s\n", err), 1;
        if (env) unsetenv(env);
    }
    if (!two) e[1] = e[0], s[1] = s[0];
    const int vocab = kiln_engine_config(e[0])->vocab;
    float *lg = kiln_malloc(sizeof(float) * (size_t)vocab);
    int32_t t = 1;
    int rc = 0;
    double *rate[2] = {kiln_malloc(sizeof(double) * (size_t)rounds), kiln_malloc(sizeof(double) * (size_t)rounds)};
    for (int r = -1; r < rounds && !rc; r++) /* round -1: both arms once, untimed */
        for (int k = 0; k < 2 && !rc; k++) {
            const int arm = r & 1 ? 1 - k : k;
            if (!two && set_switch(sw, arm ? B : A)) return fprintf(stderr, "decode-ab: %s cannot be %d\n", sw, arm ? B : A), 1;
            kiln_seq_truncate(s[arm], past);
            const double t0 = kiln_now();
            for (int i = 0; i < steps && !rc; i++) {
                t = (int32_t)((t * 7919 + 13) % 100000 % vocab);
                rc = kiln_seq_eval(s[arm], &t, 1, lg, 0, err, sizeof err);
            }
            if (r >= 0) rate[arm][r] = steps / (kiln_now() - t0);
        }
    if (rc) return fprintf(stderr, "decode-ab: %s\n", err), 1;
    char what[256];
    snprintf(what, sizeof what, "%s decode, %s, %d steps per arm after %d tokens", spec, sw, steps, past);
    report(what, "tok/s", A, B, rate, rounds);
    free(rate[0]), free(rate[1]), free(lg);
    for (int arm = 0; arm < (two ? 2 : 1); arm++) kiln_seq_free(s[arm]), kiln_engine_close(e[arm]);
    return 0;
}

static int run_gemv(int K, int N, int n, int f16, const char *sw, int A, int B, int rounds) {
    char err[256];
    struct kiln_backend *be = backend_create("cpu", 2, err, sizeof err);
    if (!be) return fprintf(stderr, "decode-ab: %s\n", err), 1;
    const size_t bytes = (size_t)N * K * 2;
    const int cnt = (int)(256e6 / (double)bytes) + 1;
    /* env:NAME: a load-time setting; each arm its own matrices (the same
     * values), prepared with NAME=A or NAME=B */
    const char *env = !strncmp(sw, "env:", 4) ? sw + 4 : NULL;
    struct qlinear *ws[2];
    for (int arm = 0; arm < (env ? 2 : 1); arm++) {
        char v[32];
        snprintf(v, sizeof v, "%d", arm ? B : A);
        if (env) setenv(env, v, 1);
        ws[arm] = kiln_calloc((size_t)cnt, sizeof *ws[arm]);
        struct kiln_rng rng;
        kiln_rng_seed(&rng, 1);
        for (int i = 0; i < cnt; i++) {
            uint16_t *d = kiln_walloc(bytes);
            if (!d) return fprintf(stderr, "decode-ab: out of memory\n"), 1;
            for (size_t k = 0; k < bytes / 2; k++) {
                const float v = 0.05f * kiln_rng_normal(&rng);
                d[k] = f16 ? kiln_f32_to_f16(v) : kiln_f32_to_bf16(v);
            }
            ws[arm][i] = (struct qlinear){.n_out = N, .n_in = K, .fmt = KILN_WFMT_DENSE};
            ws[arm][i].w = (struct ktensor){.dtype = f16 ? KILN_DTYPE_F16 : KILN_DTYPE_BF16, .rows = N, .cols = K, .data = d};
            if (be->prepare_linear(be, &ws[arm][i], err, sizeof err)) return fprintf(stderr, "decode-ab: %s\n", err), 1;
            if (ws[arm][i].repacked) kiln_wfree(d); /* the backend reads its own copy, as a model's loader drops the stored one */
        }
        if (env) unsetenv(env);
    }
    if (!env) ws[1] = ws[0];
    float *x = kiln_malloc(sizeof(float) * (size_t)K * n), *y = kiln_malloc(sizeof(float) * (size_t)N * n);
    for (int i = 0; i < K * n; i++) x[i] = (float)((i * 37) % 17 - 8) * 0.1f;
    double *rate[2] = {kiln_malloc(sizeof(double) * (size_t)rounds), kiln_malloc(sizeof(double) * (size_t)rounds)};
    for (int r = -1; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
            const int arm = r & 1 ? 1 - k : k;
            if (!env && set_switch(sw, arm ? B : A)) return fprintf(stderr, "decode-ab: %s cannot be %d\n", sw, arm ? B : A), 1;
            const double t0 = kiln_now();
            for (int i = 0; i < cnt; i++) be->matmul(be, y, x, &ws[arm][i], n);
            if (r >= 0) rate[arm][r] = (double)cnt * (double)bytes / (kiln_now() - t0) / 1e9;
        }
    char what[256];
    snprintf(what, sizeof what, "%s GEMV K %d x N %d (%.1f MB x %d), n %d, %s (GB/s of the 16-bit matrices)", f16 ? "F16" : "BF16", K, N,
             bytes / 1e6, cnt, n, sw);
    report(what, "GB/s", A, B, rate, rounds);
    return 0; /* the matrices live until exit */
}

/* a cache of kvt rows for NL layers, NKV heads of hd, past + 1 tokens in
 * scattered pages, written from the same random rows whatever kvt is */
enum { ATT_NL = 28, ATT_NKV = 8, ATT_P = 16 };
static int att_cache(struct kiln_backend *be, struct kv_cache *kv, enum kiln_dtype kvt, int hd, int past, const int32_t *pages,
                     int n_pages) {
    *kv = (struct kv_cache){ATT_NL, ATT_NKV, hd, ATT_P, n_pages, kvt, kiln_calloc(ATT_NL, sizeof(void *)), kiln_calloc(ATT_NL, sizeof(void *))};
    const int T = past + 1;
    float *k = kiln_malloc(sizeof(float) * (size_t)T * ATT_NKV * hd), *v = kiln_malloc(sizeof(float) * (size_t)T * ATT_NKV * hd);
    struct kiln_rng rng;
    kiln_rng_seed(&rng, 3);
    for (size_t i = 0; i < (size_t)T * ATT_NKV * hd; i++) k[i] = kiln_rng_normal(&rng), v[i] = kiln_rng_normal(&rng);
    int32_t *zero = kiln_calloc((size_t)T, sizeof(int32_t));
    struct kiln_seq_view sw = {0, T, 0, pages, n_pages};
    struct kiln_batch bw = {.n_tokens = T, .tokens = zero, .pos = zero, .n_seqs = 1, .seqs = &sw};
    const size_t bytes = (size_t)n_pages * ATT_NKV * ATT_P * kv_row_bytes(kvt, hd);
    int rc = 0;
    for (int l = 0; l < ATT_NL && !rc; l++) {
        kv->k[l] = be->alloc(be, bytes), kv->v[l] = be->alloc(be, bytes);
        if (!kv->k[l] || !kv->v[l]) rc = -1;
        else be->kv_write(be, kv, l, k, v, &bw);
    }
    free(k), free(v), free(zero);
    return rc;
}

static int run_att(int past, int hd, int G, const char *sw, int A, int B, int rounds) {
    char err[256];
    struct kiln_backend *be = backend_create("cpu", 2, err, sizeof err);
    if (!be) return fprintf(stderr, "decode-ab: %s\n", err), 1;
    const int kv = !strcmp(sw, "kv");
    const int n_pages = (past + 1 + ATT_P - 1) / ATT_P;
    int32_t *pages = kiln_malloc(sizeof(int32_t) * (size_t)n_pages);
    for (int i = 0; i < n_pages; i++) pages[i] = (int32_t)((int64_t)i * 7919 % n_pages); /* scattered (n_pages not a multiple of 7919) */
    struct kv_cache c[2];
    for (int arm = 0; arm < (kv ? 2 : 1); arm++)
        if (att_cache(be, &c[arm], kv_types[kv ? (arm ? B : A) : 1], hd, past, pages, n_pages))
            return fprintf(stderr, "decode-ab: out of memory\n"), 1;
    if (!kv) c[1] = c[0];
    const int nh = ATT_NKV * G;
    float *q = kiln_malloc(sizeof(float) * (size_t)nh * hd), *o = kiln_malloc(sizeof(float) * (size_t)nh * hd);
    for (int i = 0; i < nh * hd; i++) q[i] = (float)((i * 37) % 17 - 8) * 0.1f;
    int32_t zero = 0;
    struct kiln_seq_view sa = {0, 1, past, pages, n_pages};
    struct kiln_batch ba = {.n_tokens = 1, .tokens = &zero, .pos = &zero, .n_seqs = 1, .seqs = &sa};
    double *rate[2] = {kiln_malloc(sizeof(double) * (size_t)rounds), kiln_malloc(sizeof(double) * (size_t)rounds)};
    const int reps = past >= 1024 ? 4 : 64; /* steps per arm and round */
    for (int r = -1; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
            const int arm = r & 1 ? 1 - k : k;
            if (!kv && set_switch(sw, arm ? B : A)) return fprintf(stderr, "decode-ab: %s cannot be %d\n", sw, arm ? B : A), 1;
            const double t0 = kiln_now();
            for (int i = 0; i < reps; i++)
                for (int l = 0; l < ATT_NL; l++) be->attention(be, o, q, &c[arm], l, &ba, nh, 0.0884f);
            if (r >= 0) rate[arm][r] = reps / (kiln_now() - t0);
        }
    char what[256];
    snprintf(what, sizeof what, "decode attention, 28 layers x 8 KV heads x %d, groups of %d, one row after %d tokens, %s (KV bytes per step: A %.1f MB, B %.1f MB)",
             hd, G, past, sw, 2.0 * ATT_NL * ATT_NKV * (past + 1) * kv_row_bytes(c[0].dtype, hd) / 1e6,
             2.0 * ATT_NL * ATT_NKV * (past + 1) * kv_row_bytes(c[1].dtype, hd) / 1e6);
    report(what, "steps/s", A, B, rate, rounds);
    return 0; /* the caches live until exit */
}

int main(int argc, char **argv) {
    const int gemv = argc > 1 && !strcmp(argv[1], "gemv"), att = argc > 1 && !strcmp(argv[1], "att");
    const int base = gemv || att ? 5 : 4; /* index of A */
    if (argc < base + 2 || (!gemv && !att && strcmp(argv[1], "model"))) {
        fprintf(stderr, "usage: decode-ab model MODEL[:QUANT] SWITCH A B [rounds] [steps] [past]\n"
                        "       decode-ab gemv K N SWITCH A B [rounds] [n] [bf16|f16]\n"
                        "       decode-ab att PAST HEAD_DIM SWITCH A B [rounds] [group]\n"
                        "SWITCH: gemv-streams (1, 2, or 0: by row size), isa, gemv-pfd, gemv-pfd-batch, b12-pfd, b12-vbmi, b12-pairs2, moe-tasks, att-pfd, gemv-rows, qm-pfd, qm-pf2, qm-streams, vnni-dec,\n"
                        "        env:NAME (a load-time setting: an engine or set of matrices per arm, with NAME=A / NAME=B),\n"
                        "        kv (model, att: the KV cache's type per arm, 0 f32, 1 f16, 2 bf16, 3 q8_0)\n");
        return 2;
    }
    const int A = atoi(argv[base]), B = atoi(argv[base + 1]);
    const int rounds = argc > base + 2 ? atoi(argv[base + 2]) : 20;
    if (rounds < 4) return fprintf(stderr, "decode-ab: at least 4 rounds\n"), 2;
    if (!strcmp(argv[base - 1], "kv") && (A < 0 || A > 3 || B < 0 || B > 3))
        return fprintf(stderr, "decode-ab: kv is 0 f32, 1 f16, 2 bf16, 3 q8_0\n"), 2;
    if (att) {
        const int past = atoi(argv[2]), hd = atoi(argv[3]), G = argc > base + 3 ? atoi(argv[base + 3]) : 2;
        if (past < 1 || hd < 32 || hd % 32 || G < 1) return fprintf(stderr, "decode-ab: att PAST >= 1, HEAD_DIM a multiple of 32, group >= 1\n"), 2;
        return run_att(past, hd, G, argv[4], A, B, rounds);
    }
    if (gemv) {
        const int K = atoi(argv[2]), N = atoi(argv[3]);
        if (K < 32 || N < 1) return fprintf(stderr, "decode-ab: K >= 32, N >= 1\n"), 2;
        const int n = argc > base + 3 ? atoi(argv[base + 3]) : 1;
        if (n < 1 || n > 7) return fprintf(stderr, "decode-ab: gemv n is 1..7 (the decode GEMV's batch)\n"), 2;
        const int f16 = argc > base + 4 && !strcmp(argv[base + 4], "f16");
        return run_gemv(K, N, n, f16, argv[4], A, B, rounds);
    }
    const int steps = argc > base + 3 ? atoi(argv[base + 3]) : 32, past = argc > base + 4 ? atoi(argv[base + 4]) : 1;
    return run_model(argv[2], argv[3], A, B, rounds, steps < 1 ? 1 : steps, past < 1 ? 1 : past);
}
