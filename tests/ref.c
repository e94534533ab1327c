/* ref.c: see ref.h. */
#include "ref.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "engine/sampler.h"
#include "format/quant.h"
#include "kiln.h"

static void *qmem_alloc(void *ctx, size_t bytes) {
    struct ref_qmem *m = ctx;
    return m->n < 8 ? (m->p[m->n++] = kiln_malloc(bytes)) : NULL;
}

void ref_qmem_free(struct ref_qmem *m) {
    for (int i = 0; i < m->n; i++) free(m->p[i]);
    m->n = 0;
}

int ref_quant_linear(struct qlinear *w, struct ref_qmem *m, const char *fmt, int n_out, int n_in, int group, int act, int asym,
                     uint64_t seed, char *err, size_t errlen) {
    *w = (struct qlinear){.n_out = n_out, .n_in = n_in};
    if (quant_dummy_linear(w, fmt, group, seed, 0.05f, qmem_alloc, m, err, errlen)) return -1;
    struct kiln_rng r;
    kiln_rng_seed(&r, seed ^ 0x5bd1e995u);
    if (asym && w->zeros.data)
        for (int64_t i = 0; i < w->zeros.rows * w->zeros.cols * 4; i++) ((uint8_t *)w->zeros.data)[i] = (uint8_t)kiln_rng_next(&r);
    if (act) {
        int32_t *gi = qmem_alloc(m, sizeof(int32_t) * (size_t)n_in);
        if (!gi) return kiln_errf(err, errlen, "ref_quant_linear: more than 8 allocations");
        for (int k = 0; k < n_in; k++) gi[k] = k / w->group;
        for (int k = n_in - 1; k > 0; k--) { /* shuffle */
            const int j = (int)(kiln_rng_next(&r) % (uint64_t)(k + 1));
            const int32_t t = gi[k];
            gi[k] = gi[j], gi[j] = t;
        }
        w->g_idx = (struct ktensor){.dtype = KILN_DTYPE_I32, .rows = 1, .cols = n_in, .data = gi};
    }
    return 0;
}

int ref_load(const char *dir, struct ref *r) {
    char p[512], err[256];
    snprintf(p, sizeof p, "%s/reference.json", dir);
    char *txt = kiln_read_file(p, NULL, err, sizeof err);
    if (!txt) return -1;
    r->root = cJSON_Parse(txt);
    free(txt);
    cJSON *ll = cJSON_GetObjectItem(r->root, "last_logits");
    cJSON *shape = cJSON_GetObjectItem(ll, "shape");
    if (!shape || !cJSON_GetObjectItem(ll, "file")) return -1;
    r->n_prompts = cJSON_GetArrayItem(shape, 0)->valueint;
    r->vocab = cJSON_GetArrayItem(shape, 1)->valueint;
    snprintf(p, sizeof p, "%s/%s", dir, cJSON_GetObjectItem(ll, "file")->valuestring);
    size_t len;
    r->last = (float *)kiln_read_file(p, &len, err, sizeof err);
    return r->last && len == sizeof(float) * (size_t)r->n_prompts * r->vocab ? 0 : -1;
}

void ref_free(struct ref *r) {
    cJSON_Delete(r->root);
    free(r->last);
    r->root = NULL;
    r->last = NULL;
}

int32_t *ref_ids(const cJSON *a, int *n) {
    *n = cJSON_GetArraySize(a);
    int32_t *ids = kiln_malloc(sizeof(int32_t) * (size_t)(*n + 1));
    int i = 0;
    for (const cJSON *x = a->child; x; x = x->next) ids[i++] = x->valueint;
    return ids;
}

int ref_collect(int32_t id, void *ctx) {
    struct ref_collect *c = ctx;
    c->ids[c->n++] = id;
    return 0;
}

float *ref_prompt_logits(const char *path, const char *backend, const int32_t *ids, int n, int chunk, int *vocab, char *err,
                         size_t errlen) {
    struct kiln_engine_opts o = {.model = path, .backend = backend, .max_total_tokens = 256, .page_size = 16};
    kiln_engine *e = kiln_engine_open(&o, err, errlen);
    if (!e) return NULL;
    const int V = kiln_engine_config(e)->vocab;
    float *lg = kiln_malloc(sizeof(float) * (size_t)V * n);
    kiln_seq *s = kiln_seq_new(e, err, errlen);
    int rc = s ? 0 : -1;
    for (int off = 0; off < n && !rc; off += chunk)
        rc = kiln_seq_eval(s, ids + off, n - off < chunk ? n - off : chunk, lg + (size_t)off * V, 1, err, errlen);
    kiln_seq_free(s);
    kiln_engine_close(e);
    if (rc) {
        free(lg);
        return NULL;
    }
    *vocab = V;
    return lg;
}

int ref_stepwise(struct kiln_engine *e, const int32_t *ids, int n, float *out, char *err, size_t errlen) {
    kiln_seq *s = kiln_seq_new(e, err, errlen);
    if (!s) return -1;
    int rc = 0;
    for (int t = 0; t < n && !rc; t++) rc = kiln_seq_eval(s, ids + t, 1, out, 0, err, errlen);
    kiln_seq_free(s);
    return rc ? -1 : 0;
}

int ref_greedy_diff(struct kiln_engine *e, const int32_t *ids, int n, const int32_t *want, int ng, int32_t *got, char *err,
                    size_t errlen) {
    struct ref_collect c = {kiln_malloc(sizeof(int32_t) * (size_t)(ng + 1)), 0};
    struct kiln_sampling sp = sampling_default();
    sp.temperature = 0;
    const int n_got = kiln_generate(e, ids, n, ng, &sp, 1, ref_collect, &c, err, errlen);
    int first = n_got == ng ? -1 : -2;
    for (int i = 0; i < c.n && i < ng && first == -1; i++)
        if (c.ids[i] != want[i]) first = i, *got = c.ids[i];
    free(c.ids);
    return first;
}
