/*
 * safetensors.c: parse and validate safetensors files (see safetensors.h for
 * the layout). The header JSON is parsed with cJSON; all numbers in it are
 * checked to be exact non-negative integers before use, since a double that
 * is too big or fractional must not turn into a bogus offset.
 */
#include "format/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

/* largest header we accept: real ones are < 10 MB even for 1000s of tensors */
#define ST_MAX_HEADER (512ull << 20)

static int get_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double d = j->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return -1;
    *out = (uint64_t)d;
    return 0;
}

struct span {
    uint64_t begin, end;
    const char *name;
};

static int cmp_span(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

int st_parse_file(struct st_set *s, int file, const uint8_t *data, size_t size, const char *fname, char *err,
                  size_t errlen) {
    if (size < 8) return kiln_errf(err, errlen, "%s: truncated: %zu bytes, a safetensors file starts with an 8-byte header length", fname, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    if (hlen > size - 8)
        return kiln_errf(err, errlen, "%s: header length %llu runs past the end of the file (%zu bytes)", fname,
                         (unsigned long long)hlen, size);
    if (hlen > ST_MAX_HEADER) return kiln_errf(err, errlen, "%s: header length %llu is implausibly large", fname, (unsigned long long)hlen);
    if (hlen < 2) return kiln_errf(err, errlen, "%s: header of %llu bytes cannot hold a JSON object", fname, (unsigned long long)hlen);

    cJSON *root = cJSON_ParseWithLength((const char *)data + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kiln_errf(err, errlen, "%s: header is not a JSON object", fname);
    }
    const uint8_t *base = data + 8 + hlen;
    uint64_t dsize = size - 8 - hlen;
    int count = 0;
    for (cJSON *e = root->child; e; e = e->next) count++;
    struct span *spans = kiln_calloc((size_t)count + 1, sizeof *spans);
    int n_spans = 0, rc = -1, first = s->n;
    s->t = kiln_realloc(s->t, sizeof *s->t * (size_t)(s->n + count + 1));

    for (cJSON *e = root->child; e; e = e->next) {
        if (!e->string) goto bad_entry;
        if (!strcmp(e->string, "__metadata__")) continue;
        if (!cJSON_IsObject(e)) {
            kiln_errf(err, errlen, "%s: tensor '%s': entry is not an object", fname, e->string);
            goto out;
        }
        const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2) {
            kiln_errf(err, errlen, "%s: tensor '%s': expected \"dtype\" (string), \"shape\" (array) and \"data_offsets\" ([begin, end])", fname, e->string);
            goto out;
        }
        struct st_tensor t = {0};
        t.dtype = dtype_from_safetensors(jd->valuestring);
        if (t.dtype == KILN_DTYPE_NONE) {
            kiln_errf(err, errlen, "%s: tensor '%s': unknown dtype \"%s\"", fname, e->string, jd->valuestring);
            goto out;
        }
        t.ndim = cJSON_GetArraySize(js);
        if (t.ndim > ST_MAX_DIMS) {
            kiln_errf(err, errlen, "%s: tensor '%s': %d dimensions, at most %d supported", fname, e->string, t.ndim, ST_MAX_DIMS);
            goto out;
        }
        uint64_t numel = 1;
        int d = 0;
        for (cJSON *x = js->child; x; x = x->next, d++) {
            uint64_t v;
            if (get_u64(x, &v) || v > (1ull << 40)) {
                kiln_errf(err, errlen, "%s: tensor '%s': shape[%d] is not a valid dimension", fname, e->string, d);
                goto out;
            }
            t.shape[d] = (int64_t)v;
            if (v && numel > (1ull << 50) / v) {
                kiln_errf(err, errlen, "%s: tensor '%s': too many elements", fname, e->string);
                goto out;
            }
            numel *= v;
        }
        uint64_t b, en;
        if (get_u64(jo->child, &b) || get_u64(jo->child->next, &en)) {
            kiln_errf(err, errlen, "%s: tensor '%s': data_offsets are not non-negative integers", fname, e->string);
            goto out;
        }
        if (b > en || en > dsize) {
            kiln_errf(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] out of range (data section is %llu bytes; the file may be truncated)",
                      fname, e->string, (unsigned long long)b, (unsigned long long)en, (unsigned long long)dsize);
            goto out;
        }
        uint64_t want = numel * dtype_size(t.dtype);
        if (en - b != want) {
            kiln_errf(err, errlen, "%s: tensor '%s': %llu bytes at data_offsets but shape and dtype %s need %llu", fname,
                      e->string, (unsigned long long)(en - b), dtype_name(t.dtype), (unsigned long long)want);
            goto out;
        }
        t.numel = (int64_t)numel;
        t.nbytes = (size_t)want;
        t.data = base + b;
        t.file = file;
        t.name = kiln_strdup(e->string);
        s->t[s->n++] = t;
        if (want) spans[n_spans++] = (struct span){b, en, s->t[s->n - 1].name};
        continue;
    bad_entry:
        kiln_errf(err, errlen, "%s: malformed header entry", fname);
        goto out;
    }
    qsort(spans, (size_t)n_spans, sizeof *spans, cmp_span);
    for (int i = 1; i < n_spans; i++)
        if (spans[i].begin < spans[i - 1].end) {
            kiln_errf(err, errlen, "%s: tensors '%s' and '%s' overlap in the data section", fname, spans[i - 1].name, spans[i].name);
            goto out;
        }
    rc = 0;
out:
    if (rc) { /* drop what this file added: no half-loaded sets */
        for (int i = first; i < s->n; i++) free(s->t[i].name);
        s->n = first;
    }
    free(spans);
    cJSON_Delete(root);
    return rc;
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

int st_finish(struct st_set *s, char *err, size_t errlen) {
    qsort(s->t, (size_t)s->n, sizeof *s->t, cmp_tensor);
    for (int i = 1; i < s->n; i++)
        if (!strcmp(s->t[i].name, s->t[i - 1].name))
            return kiln_errf(err, errlen, "tensor '%s' appears twice (in %s and %s)", s->t[i].name,
                             s->files[s->t[i - 1].file].path, s->files[s->t[i].file].path);
    return 0;
}

const struct st_tensor *st_find(const struct st_set *s, const char *name) {
    struct st_tensor key = {.name = (char *)name};
    return bsearch(&key, s->t, (size_t)s->n, sizeof *s->t, cmp_tensor);
}

static int add_file(struct st_set *s, const char *path, char *err, size_t errlen) {
    s->files = kiln_realloc(s->files, sizeof *s->files * (size_t)(s->n_files + 1));
    struct kiln_file *f = &s->files[s->n_files];
    if (kiln_file_map(f, path, err, errlen)) return -1;
    s->n_files++;
    return st_parse_file(s, s->n_files - 1, f->data, f->size, path, err, errlen);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int st_open_dir(struct st_set *s, const char *dir, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    char *index = kiln_path_join(dir, "model.safetensors.index.json");
    int rc = -1;
    cJSON *root = NULL;
    char **names = NULL;
    int n_names = 0;
    if (kiln_file_exists(index)) {
        char *txt = kiln_read_file(index, NULL, err, errlen);
        if (!txt) goto out;
        root = cJSON_Parse(txt);
        free(txt);
        const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
        if (!cJSON_IsObject(wm)) {
            kiln_errf(err, errlen, "%s: expected a JSON object with \"weight_map\"", index);
            goto out;
        }
        for (cJSON *e = wm->child; e; e = e->next) {
            if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) {
                kiln_errf(err, errlen, "%s: weight_map entry '%s' is not a file name in this directory", index, e->string ? e->string : "?");
                goto out;
            }
            int seen = 0;
            for (int i = 0; i < n_names && !seen; i++) seen = !strcmp(names[i], e->valuestring);
            if (!seen) {
                names = kiln_realloc(names, sizeof *names * (size_t)(n_names + 1));
                names[n_names++] = kiln_strdup(e->valuestring);
            }
        }
    } else {
        DIR *d = opendir(dir);
        if (!d) {
            kiln_errf(err, errlen, "%s: cannot open model directory", dir);
            goto out;
        }
        struct dirent *de;
        while ((de = readdir(d))) {
            size_t l = strlen(de->d_name);
            if (l > 12 && !strcmp(de->d_name + l - 12, ".safetensors")) {
                names = kiln_realloc(names, sizeof *names * (size_t)(n_names + 1));
                names[n_names++] = kiln_strdup(de->d_name);
            }
        }
        closedir(d);
    }
    if (!n_names) {
        kiln_errf(err, errlen, "%s: no *.safetensors files (and no model.safetensors.index.json)", dir);
        goto out;
    }
    qsort(names, (size_t)n_names, sizeof *names, cmp_str);
    for (int i = 0; i < n_names; i++) {
        char *p = kiln_path_join(dir, names[i]);
        int r = add_file(s, p, err, errlen);
        free(p);
        if (r) goto out;
    }
    if (st_finish(s, err, errlen)) goto out;
    if (root) { /* every tensor the index names must be where it says */
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
        for (cJSON *e = wm->child; e; e = e->next) {
            const struct st_tensor *t = st_find(s, e->string);
            if (!t) {
                kiln_errf(err, errlen, "%s: tensor '%s' is listed in the index but missing from %s", dir, e->string, e->valuestring);
                goto out;
            }
            const char *fp = s->files[t->file].path, *slash = strrchr(fp, '/');
            if (strcmp(slash ? slash + 1 : fp, e->valuestring)) {
                kiln_errf(err, errlen, "%s: tensor '%s' is in %s, the index says %s", dir, e->string, fp, e->valuestring);
                goto out;
            }
        }
    }
    rc = 0;
out:
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(names);
    cJSON_Delete(root);
    free(index);
    if (rc) st_close(s);
    return rc;
}

void st_close(struct st_set *s) {
    for (int i = 0; i < s->n; i++) free(s->t[i].name);
    free(s->t);
    for (int i = 0; i < s->n_files; i++) kiln_file_unmap(&s->files[i]);
    free(s->files);
    memset(s, 0, sizeof *s);
}
