/*
 * fuzz_gguf.c: libFuzzer target for the GGUF reader (format/gguf.c). The
 * input is a whole file: the parser must accept or reject it cleanly, every
 * accepted tensor must lie inside it, and what follows a successful parse
 * (metadata -> config, tensor-name mapping, tokenizer.json synthesis) must
 * not crash or leak either. Seeds: tools/fuzz/seeds/fuzz_gguf (tiny files
 * from tests/fixtures/quant/gguf).
 */
#include <assert.h>
#include <stdlib.h>

#include "format/gguf.h"

static void *fz_alloc(void *ctx, size_t n) {
    void ***list = ctx;
    size_t k = 0;
    while ((*list)[k]) k++;
    *list = realloc(*list, sizeof(void *) * (k + 2));
    (*list)[k] = malloc(n ? n : 1);
    (*list)[k + 1] = NULL;
    return (*list)[k];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct gguf_file g;
    char err[512];
    if (kiln_gguf_parse(&g, data, size, "fuzz.gguf", err, sizeof err)) return 0;
    for (int64_t i = 0; i < g.n_tensors; i++)
        if (g.t[i].data) assert(g.t[i].data >= data && g.t[i].data + g.t[i].nbytes <= data + size);
    struct kiln_config c;
    if (kiln_gguf_to_config(&g, &c, err, sizeof err) == 0) {
        struct st_set s = {0};
        void **owned = calloc(1, sizeof(void *));
        kiln_gguf_to_st(&g, &c, &s, 0, fz_alloc, &owned, err, sizeof err);
        for (int i = 0; i < s.n; i++) free(s.t[i].name);
        free(s.t);
        for (int i = 0; owned[i]; i++) free(owned[i]);
        free(owned);
        config_free(&c);
    }
    char *json = NULL;
    size_t len;
    if (kiln_gguf_tokenizer_json(&g, &json, &len, err, sizeof err) == 0) free(json);
    kiln_gguf_free(&g);
    return 0;
}
