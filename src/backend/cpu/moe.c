/*
 * moe.c: the sparse MoE FFN on the CPU (Qwen3-MoE semantics, as in
 * transformers' Qwen3MoeSparseMoeBlock):
 *
 *   logits = router(x); p = softmax(logits) in f32; top-k of p;
 *   if norm_topk: p_k /= sum(p_k);  y = sum_k p_k * expert_k(x)
 *
 * Decomposition: routing is per token (the pool, over tokens). Then, expert by
 * expert, the tokens routed to it are gathered into a dense block and go
 * through the ordinary matmul (parallel over weight rows), so at prefill each
 * expert's weights are streamed once for all of its tokens. Results are
 * added back in expert order, which is the order transformers sums them.
 */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "base/base.h"

/* softmax and top-k of router logits rows [i0, i1) (a range of the pool) */
struct route_job {
    float *logits, *wsel;
    int *sel;
    int E, K, norm_topk;
};

static void route_rows(void *arg, int64_t i0, int64_t i1, int tid) {
    const struct route_job *j = arg;
    const int E = j->E, K = j->K;
    (void)tid;
    for (int64_t i = i0; i < i1; i++) {
        float *l = j->logits + (size_t)i * E, mx = l[0], sum = 0;
        int *sel = j->sel + (size_t)i * K;
        float *wsel = j->wsel + (size_t)i * K;
        for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < E; e++) sum += (l[e] = expf(l[e] - mx));
        for (int e = 0; e < E; e++) l[e] /= sum;
        /* top-k by repeated selection: K is small; ties go to the lower id */
        float tot = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int q = 0; q < k; q++) taken |= sel[q] == e;
                if (!taken && (best < 0 || l[e] > l[best])) best = e;
            }
            sel[k] = best;
            wsel[k] = l[best];
            tot += l[best];
        }
        if (j->norm_topk)
            for (int k = 0; k < K; k++) wsel[k] /= tot;
    }
}

void cpu_moe(struct kiln_backend *be, void *out_, const void *x_, const struct moe_ffn *m, int n, int dim) {
    float *out = out_;
    const float *x = x_;
    const int E = m->n_expert, K = m->n_used, F = m->ffn;
    /* one scratch block of 4-byte words, each array 64-byte aligned:
     * logits [n][E] | sel, wsel [n][K] | rows, rw [n] | xg, y [n][dim] | g, u [n][F] */
    const size_t nn = (size_t)n, len[9] = {nn * E, nn * K, nn * K, nn, nn, nn * dim, nn * dim, nn * F, nn * F};
    size_t at[9], words = 0;
    for (int i = 0; i < 9; i++) at[i] = words, words += (len[i] + 15) & ~(size_t)15;
    float *base = cpu_scratch_alloc(be, sizeof(float) * words);
    if (!base) return; /* reported by cpu_error */
    float *logits = base + at[0], *wsel = base + at[2], *rw = base + at[4], *xg = base + at[5], *y = base + at[6], *g = base + at[7],
          *u = base + at[8];
    int *sel = (int *)(base + at[1]), *rows = (int *)(base + at[3]);
    cpu_matmul(be, logits, x, &m->router, n);
    struct route_job rj = {logits, wsel, sel, E, K, m->norm_topk};
    cpu_parallel_for(be, n, 8, route_rows, &rj);

    memset(out, 0, sizeof(float) * (size_t)n * dim);
    for (int e = 0; e < E; e++) {
        int c = 0;
        for (int i = 0; i < n; i++)
            for (int k = 0; k < K; k++)
                if (sel[(size_t)i * K + k] == e) {
                    rows[c] = i;
                    rw[c++] = wsel[(size_t)i * K + k];
                }
        if (!c) continue;
        for (int j = 0; j < c; j++) memcpy(xg + (size_t)j * dim, x + (size_t)rows[j] * dim, sizeof(float) * (size_t)dim);
        cpu_matmul(be, g, xg, &m->gate[e], c);
        cpu_matmul(be, u, xg, &m->up[e], c);
        be->swiglu(be, g, g, u, c, F);
        cpu_matmul(be, y, g, &m->down[e], c);
        for (int j = 0; j < c; j++) {
            float *o = out + (size_t)rows[j] * dim;
            const float *yr = y + (size_t)j * dim;
            for (int d = 0; d < dim; d++) o[d] += rw[j] * yr[d];
        }
    }
    free(base);
}
