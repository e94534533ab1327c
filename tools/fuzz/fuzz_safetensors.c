/*
 * fuzz_safetensors.c: libFuzzer target for the safetensors header parser.
 * The input is a whole file; every accepted tensor must lie inside it.
 */
#include <assert.h>
#include <stdlib.h>

#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct st_set s = {0};
    char err[512];
    if (st_parse_file(&s, 0, data, size, "fuzz.safetensors", err, sizeof err) == 0) {
        for (int i = 0; i < s.n; i++) {
            const uint8_t *p = s.t[i].data;
            assert(p >= data && p + s.t[i].nbytes <= data + size);
        }
    }
    for (int i = 0; i < s.n; i++) free(s.t[i].name);
    free(s.t);
    return 0;
}
