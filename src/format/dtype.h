/*
 * dtype.h: element and block formats a tensor can be stored in.
 *
 * Plain element types come first (what safetensors stores). Block-quantized
 * formats (GGUF's Q8_0, Q4_K, ...) and the packed GPTQ/AWQ layouts are added
 * with the quantization work; each has a row in the table in dtype.c giving
 * its block size in elements and bytes.
 */
#ifndef KILN_DTYPE_H
#define KILN_DTYPE_H

#include <stddef.h>
#include <stdint.h>

enum kiln_dtype {
    KILN_DTYPE_NONE = 0,
    KILN_DTYPE_F32,
    KILN_DTYPE_F16,
    KILN_DTYPE_BF16,
    KILN_DTYPE_F64,
    KILN_DTYPE_F8_E4M3,
    KILN_DTYPE_F8_E5M2,
    KILN_DTYPE_I8,
    KILN_DTYPE_U8,
    KILN_DTYPE_I16,
    KILN_DTYPE_I32,
    KILN_DTYPE_I64,
    KILN_DTYPE_BOOL,
    /* GGUF blocks (format/quant.h has their sizes; dtype_size is 0) */
    KILN_DTYPE_Q8_0,
    KILN_DTYPE_Q4_0,
    KILN_DTYPE_Q4_1,
    KILN_DTYPE_Q5_0,
    KILN_DTYPE_Q5_1,
    KILN_DTYPE_Q4_K,
    KILN_DTYPE_Q5_K,
    KILN_DTYPE_Q6_K,
    KILN_DTYPE_IQ4_NL,
    KILN_DTYPE_IQ4_XS,
    KILN_DTYPE_Q2_K,
    KILN_DTYPE_Q3_K,
    KILN_DTYPE_COUNT
};

const char *dtype_name(enum kiln_dtype t);
/* Parses safetensors' spelling ("BF16", "F8_E4M3", ...); KILN_DTYPE_NONE if unknown. */
enum kiln_dtype dtype_from_safetensors(const char *s);
/* Bytes per element (plain types). */
size_t dtype_size(enum kiln_dtype t);

#endif
