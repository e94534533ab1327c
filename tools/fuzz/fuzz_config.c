/*
 * fuzz_config.c: libFuzzer target for config.json and generation_config.json
 * parsing. An accepted config must be self-consistent.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "format/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *txt = kiln_malloc(size + 1);
    memcpy(txt, data, size);
    txt[size] = 0;
    struct kiln_config c;
    char err[512];
    if (config_parse(&c, txt, "config.json", err, sizeof err) == 0) {
        assert(c.dim > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_head_kv > 0 && c.head_dim > 0);
        assert(c.n_head % c.n_head_kv == 0 && c.head_dim % 2 == 0);
        for (int l = 0; l < c.n_layer; l++) assert(c.layer_moe[l] ? c.n_expert > 0 && c.moe_ffn > 0 : c.ffn > 0);
        config_parse_generation(&c, txt, "generation_config.json", err, sizeof err);
        assert(c.n_eos <= KILN_MAX_EOS);
        config_free(&c);
    }
    free(txt);
    return 0;
}
