/*
 * sampler.c: see sampler.h for the order of operations. The kept set is
 * found without sorting the whole vocabulary: quickselect the k most likely,
 * sort just those, and double k until the top-p mass is reached; so a top-p
 * of 0.95 over 152k tokens usually sorts a few hundred.
 */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>

struct kiln_sampling sampling_default(void) {
    return (struct kiln_sampling){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                                  .repetition_penalty = 1.0f, .presence_penalty = 0.0f, .frequency_penalty = 0.0f, .seed = 0};
}

static int penalties_on(const struct kiln_sampling *p) {
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

void sampler_init(struct kiln_sampler *s, const struct kiln_sampling *p, int vocab) {
    memset(s, 0, sizeof *s);
    s->p = *p;
    s->vocab = vocab;
    kiln_rng_seed(&s->rng, p->seed);
    if (p->n_bias > 0) {
        int32_t *ids = kiln_malloc(sizeof *ids * (size_t)p->n_bias);
        float *b = kiln_malloc(sizeof *b * (size_t)p->n_bias);
        memcpy(ids, p->bias_ids, sizeof *ids * (size_t)p->n_bias);
        memcpy(b, p->bias, sizeof *b * (size_t)p->n_bias);
        s->p.bias_ids = ids, s->p.bias = b;
    } else {
        s->p.n_bias = 0, s->p.bias_ids = NULL, s->p.bias = NULL;
    }
    if (penalties_on(p)) {
        s->count = kiln_calloc((size_t)vocab, sizeof *s->count);
        s->seen = kiln_calloc((size_t)vocab, 1);
    }
}

void sampler_free(struct kiln_sampler *s) {
    free((void *)s->p.bias_ids);
    free((void *)s->p.bias);
    free(s->count);
    free(s->seen);
    free(s->prob);
    free(s->idx);
    memset(s, 0, sizeof *s);
}

void sampler_set_prompt(struct kiln_sampler *s, const int32_t *ids, int n) {
    if (!s->seen) return;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->vocab) s->seen[ids[i]] = 1;
}

void sampler_accept(struct kiln_sampler *s, int32_t id) {
    if (!s->count || id < 0 || id >= s->vocab) return;
    s->count[id]++;
    s->seen[id] = 1;
}

int32_t sampler_argmax(const float *l, int n) { return kiln_argmax(l, n); }

int sampler_is_greedy(const struct kiln_sampler *s) {
    return (s->p.temperature <= 0 || s->p.top_k == 1) && s->p.n_bias == 0 && !s->count;
}

static void apply_bias(const struct kiln_sampler *s, float *l) {
    for (int i = 0; i < s->p.n_bias; i++) {
        int32_t id = s->p.bias_ids[i];
        if (id >= 0 && id < s->vocab) l[id] += s->p.bias[i];
    }
}

static void apply_penalties(struct kiln_sampler *s, float *l) {
    if (!s->count) return;
    const struct kiln_sampling *p = &s->p;
    for (int i = 0; i < s->vocab; i++) {
        if (s->seen[i] && p->repetition_penalty != 1.0f) l[i] = l[i] > 0 ? l[i] / p->repetition_penalty : l[i] * p->repetition_penalty;
        if (s->count[i]) l[i] -= p->presence_penalty + p->frequency_penalty * (float)s->count[i];
    }
}

/* Moves the k largest prob[idx[.]] of idx[lo..hi) to the front (any order). */
static void select_top(const float *prob, int32_t *idx, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        float piv = prob[idx[(lo + hi) / 2]];
        int i = lo, j = hi;
        while (i <= j) {
            while (prob[idx[i]] > piv) i++;
            while (prob[idx[j]] < piv) j--;
            if (i <= j) {
                int32_t t = idx[i];
                idx[i++] = idx[j];
                idx[j--] = t;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

static _Thread_local const float *g_prob; /* qsort has no context argument */
static int cmp_desc(const void *a, const void *b) {
    float x = g_prob[*(const int32_t *)a], y = g_prob[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

int sampler_candidates(struct kiln_sampler *s, float *l, int32_t *out, float *outp) {
    const struct kiln_sampling *p = &s->p;
    const int V = s->vocab;
    if (!s->prob) {
        s->prob = kiln_malloc(sizeof(float) * (size_t)V);
        s->idx = kiln_malloc(sizeof(int32_t) * (size_t)V);
    }
    float *pr = s->prob;
    int32_t *idx = s->idx;
    float t = p->temperature > 0 ? p->temperature : 1.0f;
    float mx = l[sampler_argmax(l, V)];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += (pr[i] = expf((l[i] - mx) / t));
    for (int i = 0; i < V; i++) {
        pr[i] = (float)(pr[i] / sum);
        idx[i] = i;
    }
    int limit = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    /* grow the sorted head until it covers top_k or the top_p mass */
    int k = p->top_p < 1.0f && limit > 64 ? 64 : limit, keep;
    for (;;) {
        select_top(pr, idx, V, k);
        g_prob = pr;
        qsort(idx, (size_t)k, sizeof *idx, cmp_desc);
        double cum = 0;
        keep = k;
        if (p->top_p < 1.0f) {
            for (int i = 0; i < k; i++) {
                cum += pr[idx[i]];
                if (cum >= p->top_p) {
                    keep = i + 1;
                    break;
                }
            }
            if (cum < p->top_p && k < limit) {
                k = k * 8 < limit ? k * 8 : limit;
                continue;
            }
        }
        break;
    }
    if (p->min_p > 0) {
        float thr = p->min_p * pr[idx[0]];
        int j = 1;
        while (j < keep && pr[idx[j]] >= thr) j++;
        keep = j;
    }
    /* masked tokens (-inf) have probability 0: never keep them, so that
     * rounding in the draw cannot fall through to one */
    while (keep > 1 && pr[idx[keep - 1]] == 0) keep--;
    double tot = 0;
    for (int i = 0; i < keep; i++) tot += pr[idx[i]];
    for (int i = 0; i < keep; i++) {
        out[i] = idx[i];
        if (outp) outp[i] = (float)(pr[idx[i]] / tot);
    }
    return keep;
}

/* No top-k/top-p: draw over the whole vocabulary (minus min_p) unsorted. */
static int32_t sample_unsorted(struct kiln_sampler *s, const float *l) {
    const int V = s->vocab;
    float t = s->p.temperature, mx = l[sampler_argmax(l, V)];
    if (!s->prob) {
        s->prob = kiln_malloc(sizeof(float) * (size_t)V);
        s->idx = kiln_malloc(sizeof(int32_t) * (size_t)V);
    }
    float *pr = s->prob;
    double sum = 0;
    /* p_i / p_max = exp((l_i - max) / t) >= min_p */
    float thr = s->p.min_p > 0 ? s->p.min_p : 0.0f;
    for (int i = 0; i < V; i++) {
        float e = expf((l[i] - mx) / t);
        pr[i] = e >= thr ? e : 0.0f;
        sum += pr[i];
    }
    double u = kiln_rng_uniform(&s->rng) * sum, c = 0;
    int32_t last = 0;
    for (int i = 0; i < V; i++) {
        if (pr[i] == 0) continue;
        c += pr[i];
        last = i;
        if (u < c) return i;
    }
    return last;
}

int32_t sampler_sample(struct kiln_sampler *s, float *l) {
    apply_bias(s, l);
    apply_penalties(s, l);
    if (s->p.temperature <= 0 || s->p.top_k == 1) return sampler_argmax(l, s->vocab);
    if (s->p.top_k <= 0 && s->p.top_p >= 1.0f) return sample_unsorted(s, l);
    int32_t *ids = kiln_malloc(sizeof(int32_t) * (size_t)s->vocab);
    float *pr = kiln_malloc(sizeof(float) * (size_t)s->vocab);
    int n = sampler_candidates(s, l, ids, pr);
    double u = kiln_rng_uniform(&s->rng), c = 0;
    int32_t tok = ids[n - 1];
    for (int i = 0; i < n; i++) {
        c += pr[i];
        if (u < c) {
            tok = ids[i];
            break;
        }
    }
    free(ids);
    free(pr);
    return tok;
}

float sampler_logprobs(const float *l, int V, int32_t tok, int n_top, int32_t *top_ids, float *top_lp) {
    float mx = l[sampler_argmax(l, V)];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)(l[i] - mx));
    float lse = mx + (float)log(sum);
    /* top n_top by insertion into a short sorted list; ties keep the lower id */
    int k = 0;
    for (int i = 0; i < V && n_top > 0; i++) {
        if (k == n_top && l[i] <= l[top_ids[k - 1]]) continue;
        int j = k < n_top ? k++ : k - 1;
        while (j > 0 && l[top_ids[j - 1]] < l[i]) {
            top_ids[j] = top_ids[j - 1];
            j--;
        }
        top_ids[j] = i;
    }
    for (int j = 0; j < k; j++) top_lp[j] = l[top_ids[j]] - lse;
    return l[tok] - lse;
}
