/*
 * moe.c: the sparse MoE FFN on the CPU (Qwen3-MoE semantics, as in
 * transformers' Qwen3MoeSparseMoeBlock):
 *
 *   logits = router(x); p = softmax(logits) in f32; top-k of p;
 *   if norm_topk: p_k /= sum(p_k);  y = sum_k p_k * expert_k(x)
 *
 * Decomposition: routing is per token (the pool, over tokens). Then the
 * tokens routed to each expert are gathered into a dense block, experts in
 * order, and a batch of experts (up to max(MOE_ROWS, tokens) gathered
 * rows: one expert always fits) goes through
 * gate / up as one list of matmuls, SwiGLU, then down as another
 * (cpu_matmul_tasks: one pool job per list where the weights' path allows
 * it, parallel over each expert's weight rows, so at prefill each expert's
 * weights are streamed once for all of its tokens; a decode step's 8
 * experts take 2 jobs instead of 24). Results are added back in expert
 * order, which is the order transformers sums them; the batches change no
 * bits (KILN_CPU_MOE_TASKS=0: each expert's matmuls one by one, with
 * buffers for one expert's rows).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* gathered rows per batch of experts (one expert with more rows is a batch
 * of its own) */
enum { MOE_ROWS = 512 };

/* 0: each expert's matmuls one by one; 1: batches of MOE_ROWS rows; more:
 * batches of that many rows (tests) */
static _Atomic int moe_tasks = -1;

static int moe_tasks_rows(void) {
    if (moe_tasks < 0) {
        const char *e = getenv("KILN_CPU_MOE_TASKS");
        moe_tasks = !(e && !strcmp(e, "0"));
    }
    return moe_tasks == 1 ? MOE_ROWS : moe_tasks;
}

int cpu_set_moe_tasks(int rows) { return moe_tasks = rows < 0 ? 0 : rows; }

/* a list of the experts' matmuls: one job, or (tasks off) one by one */
static void run_list(struct kiln_backend *be, const struct cpu_mm *mm, int c, int tasks) {
    if (tasks) cpu_matmul_tasks(be, mm, c);
    else
        for (int i = 0; i < c; i++) cpu_matmul(be, mm[i].out, mm[i].x, mm[i].w, mm[i].n);
}

void cpu_moe(struct kiln_backend *be, void *out_, const void *x_, const struct moe_ffn *m, int n, int dim) {
    float *out = out_;
    const float *x = x_;
    const int E = m->n_expert, K = m->n_used, F = m->ffn;
    /* rows a batch may gather: every (token, expert) pair of the call, at
     * most max(MOE_ROWS, n), since one expert has at most n */
    const int tasks = moe_tasks_rows(), cap = n > tasks ? n : tasks, B = n * K < cap ? n * K : cap;
    /* one scratch block of 4-byte words, each array 64-byte aligned:
     * logits [n][E] | sel, wsel [n][K] | start [E + 1] | rows, rw [n K] |
     * xg, y [B][dim] | g, u [B][F] | the matmul lists [2 E] */
    const size_t nn = (size_t)n, len[10] = {nn * E, nn * K, nn * K, (size_t)E + 1, nn * K, nn * K, (size_t)B * dim, (size_t)B * dim,
                                            (size_t)B * F, (size_t)B * F};
    size_t at[10], words = 0;
    for (int i = 0; i < 10; i++) at[i] = words, words += (len[i] + 15) & ~(size_t)15;
    const size_t mm_at = words;
    words += (sizeof(struct cpu_mm) * 2 * (size_t)E + 3) / 4;
    float *base = cpu_scratch_alloc(be, sizeof(float) * words);
    if (!base) return; /* reported by cpu_error */
    float *logits = base + at[0], *wsel = base + at[2], *rw = base + at[5], *xg = base + at[6], *y = base + at[7], *g = base + at[8],
          *u = base + at[9];
    int *sel = (int *)(base + at[1]), *start = (int *)(base + at[3]), *rows = (int *)(base + at[4]);
    struct cpu_mm *mm = (struct cpu_mm *)(base + mm_at);
    cpu_matmul(be, logits, x, &m->router, n);
    struct route_job rj = {logits, wsel, sel, E, K, m->norm_topk};
    cpu_parallel_for(be, n, 8, route_rows, &rj);

    /* the (token, expert) pairs by expert, tokens in order: expert e's are
     * rows / rw [start[e], start[e + 1]) */
    memset(start, 0, sizeof(int) * ((size_t)E + 1));
    for (size_t i = 0; i < nn * K; i++) start[sel[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    for (int i = 0; i < n; i++) /* start[e] as e's cursor: afterwards the end of e's pairs */
        for (int k = 0; k < K; k++) {
            const int e = sel[(size_t)i * K + k], at_e = start[e]++;
            rows[at_e] = i, rw[at_e] = wsel[(size_t)i * K + k];
        }
    for (int e = E; e > 0; e--) start[e] = start[e - 1];
    start[0] = 0;

    memset(out, 0, sizeof(float) * (size_t)n * dim);
    for (int e0 = 0; e0 < E;) {
        /* a batch: experts [e0, e1), their pairs [start[e0], start[e1]) */
        int e1 = e0 + 1;
        while (tasks && e1 < E && start[e1 + 1] - start[e0] <= B) e1++;
        const int p0 = start[e0], np = start[e1] - p0;
        if (np) {
            for (int r = 0; r < np; r++) memcpy(xg + (size_t)r * dim, x + (size_t)rows[p0 + r] * dim, sizeof(float) * (size_t)dim);
            int c = 0;
            for (int e = e0; e < e1; e++) {
                const int o = start[e] - p0, ne = start[e + 1] - start[e];
                if (!ne) continue;
                mm[c++] = (struct cpu_mm){&m->gate[e], xg + (size_t)o * dim, g + (size_t)o * F, ne};
                mm[c++] = (struct cpu_mm){&m->up[e], xg + (size_t)o * dim, u + (size_t)o * F, ne};
            }
            run_list(be, mm, c, tasks);
            /* one SwiGLU over the batch where F is a whole number of every
             * kernel's vectors, else per expert: the vector kernels' scalar
             * tail must fall on each expert's last elements, as one by one */
            if (F % 16 == 0) be->swiglu(be, g, g, u, np, F);
            else
                for (int e = e0; e < e1; e++)
                    if (start[e + 1] > start[e])
                        be->swiglu(be, g + (size_t)(start[e] - p0) * F, g + (size_t)(start[e] - p0) * F, u + (size_t)(start[e] - p0) * F,
                                   start[e + 1] - start[e], F);
            c = 0;
            for (int e = e0; e < e1; e++) {
                const int o = start[e] - p0, ne = start[e + 1] - start[e];
                if (ne) mm[c++] = (struct cpu_mm){&m->down[e], g + (size_t)o * F, y + (size_t)o * dim, ne};
            }
            run_list(be, mm, c, tasks);
            for (int r = 0; r < np; r++) { /* experts in order, each expert's tokens in order */
                float *orow = out + (size_t)rows[p0 + r] * dim;
                const float *yr = y + (size_t)r * dim, wr = rw[p0 + r];
                for (int d = 0; d < dim; d++) orow[d] += wr * yr[d];
            }
        }
        e0 = e1;
    }
    free(base);
}
