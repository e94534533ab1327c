/* ref.c: see ref.h. */
#include "ref.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"

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
