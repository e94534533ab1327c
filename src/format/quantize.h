/*
 * quantize.h: `kiln quantize` (round-to-nearest) and the small GGUF writer
 * it uses (also used by the tests to build GGUF files in memory).
 */
#ifndef KILN_QUANTIZE_H
#define KILN_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

struct gguf_writer;

struct gguf_writer *kiln_gguf_writer_new(void);
void kiln_gguf_writer_free(struct gguf_writer *w);
void kiln_gguf_w_str(struct gguf_writer *w, const char *key, const char *val);
void kiln_gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v);
void kiln_gguf_w_f32(struct gguf_writer *w, const char *key, float v);
void kiln_gguf_w_bool(struct gguf_writer *w, const char *key, int v);
void kiln_gguf_w_arr_str(struct gguf_writer *w, const char *key, const char *const *s, size_t n);
void kiln_gguf_w_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, size_t n);
/* A tensor of ggml_type with dims ne[0..n_dims-1] (ne[0] innermost); the
 * bytes are copied. */
void kiln_gguf_w_tensor(struct gguf_writer *w, const char *name, int ggml_type, int n_dims, const int64_t *ne, const void *data,
                   size_t nbytes);
/* Serializes to a malloc'd buffer (*out, *len) or to a file. */
void kiln_gguf_writer_bytes(struct gguf_writer *w, uint8_t **out, size_t *len);
int kiln_gguf_writer_save(struct gguf_writer *w, const char *path, char *err, size_t errlen);

/* Writes tokenizer.ggml.* (model gpt2, pre, tokens, token_type, merges)
 * from dir/tokenizer.json; 0, or 1 when there is no usable tokenizer.json. */
int kiln_gguf_w_tokenizer(struct gguf_writer *w, const char *dir, int vocab);

/* Quantizes the model at src (a checkpoint folder or .gguf) to `to`:
 * q8_0 | q4_0 | q4_k (a GGUF file at out) or gptq-int4 | gptq-int8 | fp8 (a
 * Hugging Face folder at out). group: GPTQ group size (0 = 128, -1 per
 * channel). Round-to-nearest. */
int kiln_quantize(const char *src, const char *to, int group, const char *out, char *err, size_t errlen);

#endif
