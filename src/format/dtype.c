/* dtype.c: names and sizes of the element formats (see dtype.h). */
#include "format/dtype.h"

#include <string.h>

static const struct {
    const char *name; /* safetensors spelling */
    size_t size;
} table[KILN_DTYPE_COUNT] = {
    [KILN_DTYPE_NONE] = {"NONE", 0},     [KILN_DTYPE_F32] = {"F32", 4},
    [KILN_DTYPE_F16] = {"F16", 2},       [KILN_DTYPE_BF16] = {"BF16", 2},
    [KILN_DTYPE_F64] = {"F64", 8},       [KILN_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [KILN_DTYPE_F8_E5M2] = {"F8_E5M2", 1}, [KILN_DTYPE_I8] = {"I8", 1},
    [KILN_DTYPE_U8] = {"U8", 1},         [KILN_DTYPE_I16] = {"I16", 2},
    [KILN_DTYPE_I32] = {"I32", 4},       [KILN_DTYPE_I64] = {"I64", 8},
    [KILN_DTYPE_BOOL] = {"BOOL", 1},
    /* block formats: not safetensors dtypes; size per element is not whole */
    [KILN_DTYPE_Q8_0] = {"Q8_0", 0},     [KILN_DTYPE_Q4_0] = {"Q4_0", 0},
    [KILN_DTYPE_Q4_1] = {"Q4_1", 0},     [KILN_DTYPE_Q4_K] = {"Q4_K", 0},
    [KILN_DTYPE_Q5_0] = {"Q5_0", 0},     [KILN_DTYPE_Q5_1] = {"Q5_1", 0},
    [KILN_DTYPE_Q5_K] = {"Q5_K", 0},     [KILN_DTYPE_Q6_K] = {"Q6_K", 0},
    [KILN_DTYPE_IQ4_NL] = {"IQ4_NL", 0}, [KILN_DTYPE_IQ4_XS] = {"IQ4_XS", 0},
    [KILN_DTYPE_Q2_K] = {"Q2_K", 0},     [KILN_DTYPE_Q3_K] = {"Q3_K", 0},
};

const char *dtype_name(enum kiln_dtype t) {
    return (unsigned)t < KILN_DTYPE_COUNT && table[t].name ? table[t].name : "?";
}

enum kiln_dtype dtype_from_safetensors(const char *s) {
    for (int t = 1; t < KILN_DTYPE_COUNT; t++)
        if (table[t].name && table[t].size && !strcmp(table[t].name, s)) return (enum kiln_dtype)t;
    return KILN_DTYPE_NONE;
}

size_t dtype_size(enum kiln_dtype t) { return (unsigned)t < KILN_DTYPE_COUNT ? table[t].size : 0; }
