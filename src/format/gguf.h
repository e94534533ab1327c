/*
 * gguf.h: GGUF v2/v3 files (llama.cpp's single-file format): the parser, the
 * metadata -> struct kiln_config mapping, the tensor name mapping to the
 * Hugging Face names load.c binds, and a tokenizer.json synthesized from
 * tokenizer.ggml.* so a GGUF file alone is enough to run.
 *
 *   +--------+---------+-----------+--------+------------------+-----+------------------+
 *   | "GGUF" | version | n_tensors | n_kv   | kv pairs ...     | tensor infos ...  |pad| data ... |
 *   | u32    | u32 (3) | u64       | u64    | key str, type, v | name, n_dims, ne[], type, offset |
 *   +--------+---------+-----------+--------+------------------+-----+------------------+
 *   str = u64 length + bytes (no NUL); data starts at the next multiple of
 *   general.alignment (default 32) after the infos; each tensor's offset is
 *   relative to it and aligned. ne[0] is the innermost (fastest) dimension:
 *   a [N][K] weight has ne = {K, N}.
 *
 * The parser takes (data, size), validates every length and offset against
 * size before reading, and never trusts a count to size an allocation
 * beyond what the bytes could hold (fuzzed by tools/fuzz/fuzz_gguf.c).
 */
#ifndef KILN_GGUF_H
#define KILN_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "format/config.h"
#include "format/safetensors.h"

enum gguf_type {
    GGUF_U8 = 0, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL,
    GGUF_STR, GGUF_ARR, GGUF_U64, GGUF_I64, GGUF_F64, GGUF_NTYPES
};

struct gguf_kv {
    char *key;
    enum gguf_type type;
    enum gguf_type arr_type; /* arrays */
    uint64_t n;              /* arrays: element count */
    const uint8_t *val;      /* the value's bytes in the file (arrays: first element) */
};

struct gguf_tinfo {
    char *name;
    int n_dims;
    int64_t ne[4];
    int ggml_type;
    uint64_t offset;
    const uint8_t *data;
    size_t nbytes;
};

struct gguf_file {
    const uint8_t *data;
    size_t size;
    uint32_t version;
    int64_t n_kv, n_tensors;
    struct gguf_kv *kv;
    struct gguf_tinfo *t;
    size_t alignment;
};

/* Parses and validates a whole file image. Tensors of types kiln cannot
 * compute with are accepted here (the loader names them if they are used).
 * g points into data, which must outlive it. Free with kiln_gguf_free. */
int kiln_gguf_parse(struct gguf_file *g, const uint8_t *data, size_t size, const char *fname, char *err, size_t errlen);
void kiln_gguf_free(struct gguf_file *g);

const struct gguf_kv *kiln_gguf_find(const struct gguf_file *g, const char *key);
/* Scalars: 0 ok, 1 absent, -1 present with the wrong type (err filled). */
int kiln_gguf_get_int(const struct gguf_file *g, const char *key, int64_t *out, char *err, size_t errlen);
int kiln_gguf_get_f64(const struct gguf_file *g, const char *key, double *out, char *err, size_t errlen);
/* A string value, malloc'd; NULL if absent or not a string. */
char *kiln_gguf_get_str(const struct gguf_file *g, const char *key);
/* Element i of a string array (pointer into the file, not NUL-terminated). */
int kiln_gguf_arr_str(const struct gguf_kv *kv, uint64_t i, const char **s, uint64_t *len);

/* Metadata -> config (general.architecture qwen3, qwen3moe, qwen2, llama).
 * cfg->quant.method is KILN_QUANT_GGUF. */
int kiln_gguf_to_config(const struct gguf_file *g, struct kiln_config *cfg, char *err, size_t errlen);

/* Adds the tensors to s under their Hugging Face names (file index `file`),
 * splitting merged expert tensors per expert and un-permuting the Llama q/k
 * rows (convert_hf_to_gguf permutes them for its interleaved RoPE). Copies
 * (only the permuted q/k) are made with alloc(ctx, bytes), which returns NULL
 * when out of memory (an error). */
int kiln_gguf_to_st(const struct gguf_file *g, const struct kiln_config *cfg, struct st_set *s, int file,
               void *(*alloc)(void *ctx, size_t bytes), void *ctx, char *err, size_t errlen);

/* Synthesizes tokenizer.json text equivalent to the tokenizer.ggml.* metadata
 * (BPE vocab and merges, added tokens with their special flags, the
 * pre-tokenizer of tokenizer.ggml.pre, a ByteLevel decoder), for
 * tok_load_json(). *json_out is malloc'd, *len_out its length. */
int kiln_gguf_tokenizer_json(const struct gguf_file *g, char **json_out, size_t *len_out, char *err, size_t errlen);

/* The same from a file path (maps, parses, synthesizes, unmaps). */
int kiln_gguf_tokenizer_json_file(const char *path, char **json_out, size_t *len_out, char *err, size_t errlen);

/* Does path name a GGUF file (by its magic)? */
int kiln_gguf_is_file(const char *path);

#endif
