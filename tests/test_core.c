/*
 * test_core.c: unit tests for the foundation: number conversions and the
 * random generator (base), the safetensors parser and its errors, config.json
 * in both spellings, the sampler's kept sets and seeds, the CPU ops against
 * plain loops, and the KV page pool.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "base/base.h"
#include "engine/engine_internal.h"
#include "engine/kv.h"
#include "engine/sampler.h"
#include "format/config.h"
#include "format/safetensors.h"
#include "kiln.h"
#include "model/model.h"
#include "test.h"

/* ==== base ==== */

void test_base(void) {
    /* bf16: exact round trip of representable values; round to nearest even */
    CHECK(kiln_bf16_to_f32(kiln_f32_to_bf16(1.5f)) == 1.5f);
    CHECK(kiln_f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80, "ties go to even: %04x", kiln_f32_to_bf16(1.0f + 1.0f / 256));
    CHECK(kiln_f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82);
    CHECK(isnan(kiln_bf16_to_f32(kiln_f32_to_bf16(NAN))));
    /* f16: every one of the 65536 codes survives f16 -> f32 -> f16 (NaNs stay NaN) */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kiln_f16_to_f32((uint16_t)h);
        uint16_t back = kiln_f32_to_f16(f);
        if (isnan(f) ? !isnan(kiln_f16_to_f32(back)) : back != h) bad++;
    }
    CHECK(bad == 0, "%d f16 codes do not round-trip", bad);
    CHECK(kiln_f16_to_f32(0x3c00) == 1.0f && kiln_f16_to_f32(0xc000) == -2.0f && kiln_f16_to_f32(0x0001) == ldexpf(1, -24));
    CHECK(kiln_f32_to_f16(65520.0f) == 0x7c00, "overflow rounds to inf");
    /* kiln_widen16: every 16-bit code, in both formats, on the plain path and
     * (where the CPU has it) the AVX2 one, at lengths around its 8- and
     * 16-value steps; bit-exact against the scalar conversions (NaN codes
     * keep their bits: a shift, or F16C's quiet NaN of the same payload) */
    {
        enum { N = 65536 + 17 };
        uint16_t *src = kiln_malloc(sizeof(uint16_t) * N);
        float *dst = kiln_malloc(sizeof(float) * N);
        for (int i = 0; i < N; i++) src[i] = (uint16_t)(i * 40503u);
        const int avx2_max =
#if defined(__x86_64__)
            __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
            0;
#endif
        const int lens[] = {0, 1, 7, 8, 15, 16, 17, 33, N};
        for (int avx2 = 0; avx2 <= avx2_max; avx2++)
            for (int f16 = 0; f16 <= 1; f16++)
                for (int li = 0; li < (int)(sizeof lens / sizeof *lens); li++) {
                    const int n = lens[li];
                    for (int i = 0; i < n + 1 && i < N; i++) dst[i] = -7.0f; /* one past the end must stay */
                    kiln_widen16(dst, src, (size_t)n, f16, avx2);
                    int wrong = 0;
                    for (int i = 0; i < n; i++) {
                        const float r = f16 ? kiln_f16_to_f32(src[i]) : kiln_bf16_to_f32(src[i]);
                        wrong += isnan(r) ? !isnan(dst[i]) : memcmp(&r, &dst[i], 4) != 0;
                    }
                    CHECK(wrong == 0 && (n == N || dst[n] == -7.0f), "widen16 f16=%d avx2=%d n=%d: %d wrong", f16, avx2, n, wrong);
                }
        free(src), free(dst);
    }
    /* fp8 e4m3fn: known codes */
    CHECK(kiln_fp8e4m3_to_f32(0x38) == 1.0f && kiln_fp8e4m3_to_f32(0x7e) == 448.0f && kiln_fp8e4m3_to_f32(0x01) == ldexpf(1, -9));
    CHECK(kiln_fp8e4m3_to_f32(0xb8) == -1.0f && isnan(kiln_fp8e4m3_to_f32(0x7f)));
    bad = 0;
    for (int c = 0; c < 0x7f; c++) bad += kiln_f32_to_fp8e4m3(kiln_fp8e4m3_to_f32((uint8_t)c)) != c;
    CHECK(bad == 0, "%d fp8 codes do not round-trip", bad);
    /* rng: same seed same stream, different seed different stream, sane moments */
    struct kiln_rng a, b;
    kiln_rng_seed(&a, 42);
    kiln_rng_seed(&b, 42);
    int same = 1;
    for (int i = 0; i < 100; i++) same &= kiln_rng_next(&a) == kiln_rng_next(&b);
    CHECK(same);
    kiln_rng_seed(&b, 43);
    CHECK(kiln_rng_next(&a) != kiln_rng_next(&b));
    double s = 0, s2 = 0;
    for (int i = 0; i < 100000; i++) {
        double u = kiln_rng_uniform(&a);
        s += u, s2 += u * u;
    }
    CHECK(fabs(s / 1e5 - 0.5) < 0.01 && fabs(s2 / 1e5 - 1.0 / 3) < 0.01, "uniform mean %g", s / 1e5);
    char err[128];
    CHECK(kiln_read_file("/nonexistent/x", NULL, err, sizeof err) == NULL && strstr(err, "/nonexistent/x"));
    char *p = kiln_path_join("a/b", "c");
    CHECK(!strcmp(p, "a/b/c"));
    free(p);

    /* weight buffers (walloc.c): 64-byte aligned, disjoint, zeroed by
     * kiln_wcalloc, their bytes kept while neighbours are written and
     * freed; sizes from one byte past a chunk (a region of its own) */
    enum { NW = 40 };
    static const size_t wsz[10] = {1, 63, 64, 65, 4096, 1 << 20, 3 << 20, 7 << 20, 33 << 20, 100};
    uint8_t *wb[NW] = {0};
    size_t wn[NW];
    int walign = 0, wzero = 0, wkept = 0;
    for (int i = 0; i < NW; i++) {
        wn[i] = wsz[i % 10] + (size_t)i;
        wb[i] = i % 2 ? kiln_wcalloc(wn[i]) : kiln_walloc(wn[i]);
        if (!wb[i]) break;
        walign += (uintptr_t)wb[i] % 64 == 0;
        if (i % 2) wzero += wb[i][0] == 0 && wb[i][wn[i] - 1] == 0;
        memset(wb[i], i + 1, wn[i]);
        if (i % 3 == 2) kiln_wfree(wb[i - 1]), wb[i - 1] = NULL; /* a neighbour freed mid-chunk */
    }
    for (int i = 0; i < NW; i++)
        if (wb[i]) wkept += wb[i][0] == (uint8_t)(i + 1) && wb[i][wn[i] - 1] == (uint8_t)(i + 1);
    CHECK(walign == NW && wzero == NW / 2, "walloc: %d of %d aligned, %d of %d zeroed", walign, NW, wzero, NW / 2);
    CHECK(wkept == NW - NW / 3, "walloc: %d of %d buffers kept their bytes", wkept, NW - NW / 3);
    for (int i = 0; i < NW; i++) kiln_wfree(wb[i]);
    kiln_wfree(NULL);
}

/* ==== safetensors ==== */

static char tmpdir[256];

static void make_tmpdir(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln-test-%d", (int)getpid());
    mkdir(tmpdir, 0755);
}

static void write_bytes(const char *name, const void *data, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}

/* writes a safetensors file with the given header JSON and data_len bytes of data */
static void write_st(const char *name, const char *header, size_t data_len) {
    size_t h = strlen(header);
    uint8_t *buf = kiln_calloc(8 + h + data_len, 1);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < data_len; i++) buf[8 + h + i] = (uint8_t)i;
    write_bytes(name, buf, 8 + h + data_len);
    free(buf);
}

static void rm_tmp(const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    unlink(p);
}

/* parses a single-file dir and returns the error text ("" on success) */
static const char *st_try(const char *header, size_t data_len) {
    static char err[512];
    err[0] = 0;
    write_st("model.safetensors", header, data_len);
    struct st_set s;
    if (st_open_dir(&s, tmpdir, err, sizeof err) == 0) st_close(&s);
    rm_tmp("model.safetensors");
    return err;
}

void test_safetensors(void) {
    make_tmpdir();
    char err[512];
    struct st_set s;
    /* a good file */
    write_st("model.safetensors",
             "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]},"
             "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}",
             20);
    CHECK(st_open_dir(&s, tmpdir, err, sizeof err) == 0, "%s", err);
    const struct st_tensor *t = st_find(&s, "a");
    CHECK(t && t->dtype == KILN_DTYPE_BF16 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->nbytes == 12);
    t = st_find(&s, "b");
    CHECK(t && ((const uint8_t *)t->data)[0] == 12, "b's data starts at offset 12");
    CHECK(st_find(&s, "c") == NULL);
    st_close(&s);
    rm_tmp("model.safetensors");

    /* bad files: each error names the problem */
    const char *e;
    write_bytes("model.safetensors", "abc", 3);
    CHECK(st_open_dir(&s, tmpdir, err, sizeof err) < 0 && strstr(err, "truncated"), "%s", err);
    rm_tmp("model.safetensors");
    uint8_t big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
    write_bytes("model.safetensors", big, sizeof big);
    CHECK(st_open_dir(&s, tmpdir, err, sizeof err) < 0 && strstr(err, "past the end"), "%s", err);
    rm_tmp("model.safetensors");
    e = st_try("not json at all", 0);
    CHECK(strstr(e, "not a JSON object"), "%s", e);
    e = st_try("{\"a\":{\"dtype\":\"Q9\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    CHECK(strstr(e, "unknown dtype") && strstr(e, "Q9"), "%s", e);
    e = st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8);
    CHECK(strstr(e, "out of range"), "%s", e);
    e = st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12);
    CHECK(strstr(e, "overlap"), "%s", e);
    e = st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    CHECK(strstr(e, "need 12"), "%s", e);
    e = st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,8]}}", 8);
    CHECK(strstr(e, "shape[0]"), "%s", e);
    e = st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.5,8]}}", 8);
    CHECK(strstr(e, "data_offsets"), "%s", e);
    e = st_try("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8);
    CHECK(strstr(e, "data_offsets"), "%s", e);

    /* shards: duplicates across files, and an index naming a missing tensor */
    write_st("model-00001-of-00002.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    write_st("model-00002-of-00002.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    CHECK(st_open_dir(&s, tmpdir, err, sizeof err) < 0 && strstr(err, "appears twice"), "%s", err);
    write_st("model-00002-of-00002.safetensors", "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    const char *idx = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00002-of-00002.safetensors\","
                      "\"c\":\"model-00002-of-00002.safetensors\"}}";
    write_bytes("model.safetensors.index.json", idx, strlen(idx));
    CHECK(st_open_dir(&s, tmpdir, err, sizeof err) < 0 && strstr(err, "'c'") && strstr(err, "missing"), "%s", err);
    idx = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00002-of-00002.safetensors\"}}";
    write_bytes("model.safetensors.index.json", idx, strlen(idx));
    CHECK(st_open_dir(&s, tmpdir, err, sizeof err) == 0 && s.n == 2 && s.n_files == 2, "%s", err);
    if (s.n) st_close(&s);
    idx = "{\"weight_map\":{\"a\":\"model-00003-of-00002.safetensors\"}}";
    write_bytes("model.safetensors.index.json", idx, strlen(idx));
    CHECK(st_open_dir(&s, tmpdir, err, sizeof err) < 0 && strstr(err, "model-00003-of-00002.safetensors"), "%s", err);
    rm_tmp("model.safetensors.index.json");
    rm_tmp("model-00001-of-00002.safetensors");
    rm_tmp("model-00002-of-00002.safetensors");
    CHECK(st_open_dir(&s, tmpdir, err, sizeof err) < 0 && strstr(err, "no *.safetensors"), "%s", err);
    rmdir(tmpdir);
}

/* ==== config ==== */

static const char *cfg_try(struct kiln_config *c, const char *json) {
    static char err[512];
    err[0] = 0;
    if (config_parse(c, json, "config.json", err, sizeof err) == 0) return NULL;
    return err;
}

/* the CPU backend's prepare_linear, counted (the load-order check below) */
static int (*prep_inner)(struct kiln_backend *, struct qlinear *, char *, size_t);
static int n_prepared;
static int prep_counted(struct kiln_backend *be, struct qlinear *w, char *err, size_t errlen) {
    n_prepared++;
    return prep_inner(be, w, err, errlen);
}
/* a device with fake_free bytes free (the fit check below) */
static size_t fake_free;
static void fake_mem_info(struct kiln_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    *free_bytes = fake_free, *total_bytes = 2 * fake_free;
}
void test_config(void) {
    struct kiln_config c;
    /* transformers 4.x spelling */
    const char *v4 = "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":1024,\"num_hidden_layers\":28,"
                     "\"num_attention_heads\":16,\"num_key_value_heads\":8,\"head_dim\":128,\"intermediate_size\":3072,"
                     "\"vocab_size\":151936,\"rope_theta\":1000000,\"rms_norm_eps\":1e-6,\"torch_dtype\":\"bfloat16\","
                     "\"tie_word_embeddings\":true,\"eos_token_id\":151645,\"bos_token_id\":151643,\"max_position_embeddings\":40960}";
    CHECK(cfg_try(&c, v4) == NULL);
    CHECK(c.arch == KILN_ARCH_QWEN3 && c.dim == 1024 && c.head_dim == 128 && c.n_head * c.head_dim != c.dim && c.qk_norm);
    CHECK(c.rope.theta == 1e6 && c.tie_embed && c.dtype == KILN_DTYPE_BF16 && c.n_eos == 1 && c.eos[0] == 151645);
    config_free(&c);
    /* transformers 5.x spelling, MoE with num_local_experts, mlp_only_layers, sparse step */
    const char *v5 = "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":4,"
                     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":128,\"vocab_size\":1024,"
                     "\"rope_parameters\":{\"rope_theta\":10000.0,\"rope_type\":\"default\"},\"dtype\":\"float16\","
                     "\"num_local_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":32,\"norm_topk_prob\":true,"
                     "\"decoder_sparse_step\":2,\"mlp_only_layers\":[3],\"eos_token_id\":[1,2]}";
    CHECK(cfg_try(&c, v5) == NULL);
    CHECK(c.arch == KILN_ARCH_QWEN3_MOE && c.n_expert == 8 && c.n_expert_used == 2 && c.moe_ffn == 32 && c.norm_topk_prob);
    CHECK(c.head_dim == 16, "head_dim absent means hidden/heads");
    CHECK(!c.layer_moe[0] && c.layer_moe[1] && !c.layer_moe[2] && !c.layer_moe[3], "sparse step 2, layer 3 dense");
    CHECK(c.rope.theta == 10000.0 && c.dtype == KILN_DTYPE_F16 && c.n_eos == 2 && c.eos[1] == 2 && !c.tie_embed);
    config_free(&c);
    /* Qwen2 implies q/k/v bias; Llama 3 rope scaling */
    CHECK(cfg_try(&c, "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                      "\"intermediate_size\":8,\"vocab_size\":10}") == NULL);
    CHECK(c.qkv_bias && !c.qk_norm && c.n_head_kv == 4);
    config_free(&c);
    CHECK(cfg_try(&c, "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                      "\"intermediate_size\":8,\"vocab_size\":10,\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":8.0,"
                      "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192,"
                      "\"rope_type\":\"llama3\"}}") == NULL);
    CHECK(c.rope.type == KILN_ROPE_LLAMA3 && c.rope.factor == 8 && c.rope.original_max_pos == 8192);
    config_free(&c);
    /* bad configs name the field */
    const char *e;
    e = cfg_try(&c, "{\"architectures\":[\"GPT2LMHeadModel\"]}");
    CHECK(e && strstr(e, "unsupported architecture") && strstr(e, "GPT2LMHeadModel"), "%s", e);
    e = cfg_try(&c, "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64}");
    CHECK(e && strstr(e, "num_hidden_layers"), "%s", e);
    e = cfg_try(&c, "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":\"64\",\"num_hidden_layers\":1}");
    CHECK(e && strstr(e, "hidden_size"), "%s", e);
    e = cfg_try(&c, "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                    "\"num_key_value_heads\":3,\"intermediate_size\":8,\"vocab_size\":10}");
    CHECK(e && strstr(e, "num_key_value_heads"), "%s", e);
    e = cfg_try(&c, "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                    "\"intermediate_size\":8,\"vocab_size\":10,\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2}}");
    CHECK(e && strstr(e, "dynamic"), "%s", e);
    e = cfg_try(&c, "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                    "\"intermediate_size\":8,\"vocab_size\":10,\"hidden_act\":\"gelu\"}");
    CHECK(e && strstr(e, "gelu"), "%s", e);
    e = cfg_try(&c, "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                    "\"intermediate_size\":8,\"vocab_size\":10,\"num_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":8,"
                    "\"mlp_only_layers\":[5]}");
    CHECK(e && strstr(e, "mlp_only_layers"), "%s", e);
    e = cfg_try(&c, "[1,2]");
    CHECK(e && strstr(e, "not a JSON object"), "%s", e);

    /* a model directory whose tensors disagree with its config */
    char err[512];
    struct kiln_model m;
    struct kiln_backend *be = backend_create("cpu", 1, err, sizeof err);
    make_tmpdir();
    const char *cfg = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":4,\"num_hidden_layers\":1,\"num_attention_heads\":1,"
                      "\"intermediate_size\":4,\"vocab_size\":2,\"tie_word_embeddings\":true}";
    write_bytes("config.json", cfg, strlen(cfg));
    write_st("model.safetensors", "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,32]},"
                                  "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[32,52]}}", 52);
    CHECK(model_load_dir(&m, tmpdir, be, err, sizeof err) < 0 && strstr(err, "model.norm.weight") && strstr(err, "[5]"), "%s", err);
    write_st("model.safetensors", "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,32]},"
                                  "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[32,48]}}", 48);
    CHECK(model_load_dir(&m, tmpdir, be, err, sizeof err) < 0 && strstr(err, "missing tensor") &&
          strstr(err, "model.layers.0.input_layernorm.weight"), "%s", err);
    write_st("model.safetensors", "{\"model.embed_tokens.weight\":{\"dtype\":\"I32\",\"shape\":[2,4],\"data_offsets\":[0,32]}}", 32);
    CHECK(model_load_dir(&m, tmpdir, be, err, sizeof err) < 0 && strstr(err, "I32"), "%s", err);
    /* two layers (load.c finish_load binds a checkpoint's layers before
     * any weight goes to the backend): complete, the model loads; without
     * layer 1's down_proj the error names it and no linear was prepared,
     * and nothing of the half-loaded model stays (make test-asan: no leak) */
    prep_inner = be->prepare_linear;
    be->prepare_linear = prep_counted;
    const char *cfg2 = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":4,\"num_hidden_layers\":2,\"num_attention_heads\":1,"
                       "\"intermediate_size\":4,\"vocab_size\":2,\"tie_word_embeddings\":true}";
    write_bytes("config.json", cfg2, strlen(cfg2));
    for (int drop = 0; drop < 2; drop++) {
        static const char *const lin[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                          "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
        char hdr[4096];
        size_t off = 48;
        int hn = snprintf(hdr, sizeof hdr, "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,32]},"
                                           "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[32,48]}");
        for (int l = 0; l < 2; l++) {
            const char *norms[] = {"input_layernorm", "post_attention_layernorm"};
            for (int i = 0; i < 2; i++, off += 16)
                hn += snprintf(hdr + hn, sizeof hdr - (size_t)hn, ",\"model.layers.%d.%s.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[%zu,%zu]}",
                               l, norms[i], off, off + 16);
            for (int i = 0; i < 7; i++) {
                if (drop && l == 1 && i == 6) continue;
                hn += snprintf(hdr + hn, sizeof hdr - (size_t)hn, ",\"model.layers.%d.%s.weight\":{\"dtype\":\"F32\",\"shape\":[4,4],\"data_offsets\":[%zu,%zu]}",
                               l, lin[i], off, off + 64);
                off += 64;
            }
        }
        snprintf(hdr + hn, sizeof hdr - (size_t)hn, "}");
        write_st("model.safetensors", hdr, off);
        n_prepared = 0;
        const int rc = model_load_dir(&m, tmpdir, be, err, sizeof err);
        if (!drop) { /* the tied lm_head and 7 per layer */
            CHECK(rc == 0 && m.cfg.n_layer == 2 && m.layers[1].down.w.data && n_prepared == 15, "%s (%d linears prepared)", err, n_prepared);
            if (rc == 0) model_free(&m);
            /* on a device that holds its weights: refused before any
             * upload when the floor (2 bytes a dense element: embedding 8,
             * final norm 4, per layer 2 norms of 4 and 7 linears of 16, so
             * 504 bytes; the tied lm_head shares the embedding) is more
             * than is free, loaded when it is just that; the checkpoint,
             * then a --dummy of the same config (layer 0 generated, the
             * other counted as it) */
            void (*mem_info)(struct kiln_backend *, size_t *, size_t *) = be->mem_info;
            be->device_weights = 1, be->mem_info = fake_mem_info;
            char cfg_path[600];
            snprintf(cfg_path, sizeof cfg_path, "%s/config.json", tmpdir);
            for (int dummy = 0; dummy < 2; dummy++)
                for (fake_free = 503; fake_free <= 504; fake_free++) {
                    n_prepared = 0;
                    const int r2 = dummy ? model_load_dummy(&m, cfg_path, KILN_DTYPE_BF16, 0, be, err, sizeof err)
                                         : model_load_dir(&m, tmpdir, be, err, sizeof err);
                    if (fake_free == 503)
                        CHECK(r2 < 0 && strstr(err, "need at least") && strstr(err, "(504 bytes)") && n_prepared == 0,
                              "%s%s (%d linears prepared)", dummy ? "dummy: " : "", err, n_prepared);
                    else
                        CHECK(r2 == 0 && n_prepared == 15, "%s%s", dummy ? "dummy: " : "", err);
                    if (r2 == 0) model_free(&m);
                }
            be->device_weights = 0, be->mem_info = mem_info;
        } else {
            CHECK(rc < 0 && strstr(err, "missing tensor") && strstr(err, "model.layers.1.mlp.down_proj.weight"), "%s", err);
            CHECK(n_prepared == 0, "a broken checkpoint: %d linears went to the backend before the error", n_prepared);
        }
    }
    be->prepare_linear = prep_inner;
    rm_tmp("model.safetensors");
    CHECK(model_load_dir(&m, tmpdir, be, err, sizeof err) < 0 && strstr(err, "safetensors"), "%s", err);
    rm_tmp("config.json");
    CHECK(model_load_dir(&m, tmpdir, be, err, sizeof err) < 0 && strstr(err, "config.json"), "%s", err);
    rmdir(tmpdir);
    CHECK(model_load_dummy(&m, "qwen3-9000b", KILN_DTYPE_BF16, 0, be, err, sizeof err) < 0 && strstr(err, "qwen3-9000b"), "%s", err);
    be->destroy(be);
}

/* ==== sampler ==== */

void test_sampler(void) {
    enum { V = 8 };
    float base[V] = {1.0f, 3.0f, 2.0f, 0.5f, 3.0f, -1.0f, 2.5f, 0.0f};
    float l[V];
    int32_t ids[V];
    float pr[V];
    struct kiln_sampler s;
    struct kiln_sampling p = sampling_default();

    /* greedy: the first of tied maxima, like torch.argmax */
    p.temperature = 0;
    sampler_init(&s, &p, V);
    memcpy(l, base, sizeof l);
    CHECK(sampler_sample(&s, l) == 1);
    sampler_free(&s);

    /* top-k keeps exactly the k largest */
    p = sampling_default();
    p.top_k = 3;
    sampler_init(&s, &p, V);
    memcpy(l, base, sizeof l);
    int n = sampler_candidates(&s, l, ids, pr);
    CHECK(n == 3 && ids[0] == 1 && ids[1] == 4 && ids[2] == 6, "top-k set: n=%d %d %d %d", n, ids[0], ids[1], ids[2]);
    CHECK(fabsf(pr[0] + pr[1] + pr[2] - 1) < 1e-6f);
    sampler_free(&s);

    /* top-p: the smallest prefix whose mass reaches p */
    double e[V], z = 0;
    for (int i = 0; i < V; i++) z += (e[i] = exp(base[i]));
    double m3 = (e[1] + e[4] + e[6]) / z; /* 3, 3, 2.5 */
    p = sampling_default();
    p.top_p = (float)(m3 - 1e-4);
    sampler_init(&s, &p, V);
    memcpy(l, base, sizeof l);
    n = sampler_candidates(&s, l, ids, pr);
    CHECK(n == 3, "top_p just under the top-3 mass keeps 3, got %d", n);
    sampler_free(&s);
    p.top_p = (float)(m3 + 1e-4);
    sampler_init(&s, &p, V);
    memcpy(l, base, sizeof l);
    n = sampler_candidates(&s, l, ids, pr);
    CHECK(n == 4 && ids[3] == 2, "top_p just over keeps 4, got %d", n);
    sampler_free(&s);

    /* min-p: p >= min_p * p_max, i.e. logit >= max + log(min_p) */
    p = sampling_default();
    p.min_p = (float)exp(-1.0) + 1e-4f; /* keeps logits > 2.0 */
    sampler_init(&s, &p, V);
    memcpy(l, base, sizeof l);
    n = sampler_candidates(&s, l, ids, pr);
    CHECK(n == 3, "min_p keeps logits above max-1: %d", n);
    sampler_free(&s);

    /* temperature sharpens: at T=0.02 the two tied maxima take all the mass (the next is e^-25 as likely) */
    p = sampling_default();
    p.temperature = 0.02f;
    sampler_init(&s, &p, V);
    int count[V] = {0};
    for (int i = 0; i < 2000; i++) {
        memcpy(l, base, sizeof l);
        count[sampler_sample(&s, l)]++;
    }
    CHECK(count[1] + count[4] == 2000 && count[1] > 850 && count[4] > 850, "%d %d", count[1], count[4]);
    sampler_free(&s);

    /* seeds: same seed, same draws; different seed, different draws; and the
     * empirical distribution follows the softmax */
    p = sampling_default();
    p.seed = 7;
    struct kiln_sampler s2;
    sampler_init(&s, &p, V);
    sampler_init(&s2, &p, V);
    int same = 1, hist[V] = {0};
    for (int i = 0; i < 20000; i++) {
        float l2[V];
        memcpy(l, base, sizeof l);
        memcpy(l2, base, sizeof l2);
        int a = sampler_sample(&s, l), b = sampler_sample(&s2, l2);
        same &= a == b;
        hist[a]++;
    }
    CHECK(same, "same seed must give the same samples");
    double worst = 0;
    for (int i = 0; i < V; i++) {
        double d = fabs(hist[i] / 20000.0 - e[i] / z);
        worst = d > worst ? d : worst;
    }
    CHECK(worst < 0.015, "empirical vs softmax: worst |diff| %g", worst);
    sampler_free(&s);
    sampler_free(&s2);
    p.seed = 8;
    sampler_init(&s2, &p, V);
    p.seed = 7;
    sampler_init(&s, &p, V);
    int differ = 0;
    for (int i = 0; i < 50; i++) {
        float l2[V];
        memcpy(l, base, sizeof l);
        memcpy(l2, base, sizeof l2);
        differ |= sampler_sample(&s, l) != sampler_sample(&s2, l2);
    }
    CHECK(differ);
    sampler_free(&s);
    sampler_free(&s2);

    /* penalties: repetition divides positive / multiplies negative logits of
     * seen tokens; presence and frequency subtract for output tokens only */
    p = sampling_default();
    p.temperature = 0;
    p.repetition_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    sampler_init(&s, &p, V);
    int32_t prompt[] = {1};
    sampler_set_prompt(&s, prompt, 1);
    sampler_accept(&s, 4);
    sampler_accept(&s, 4);
    sampler_accept(&s, 5);
    memcpy(l, base, sizeof l);
    int32_t tok = sampler_sample(&s, l);
    CHECK(fabsf(l[1] - 1.5f) < 1e-6f, "prompt token: repetition only, %g", l[1]);
    CHECK(fabsf(l[4] - (1.5f - 0.5f - 0.5f)) < 1e-6f, "output token x2: %g", l[4]);
    CHECK(fabsf(l[5] - (-2.0f - 0.5f - 0.25f)) < 1e-6f, "negative logit multiplied: %g", l[5]);
    CHECK(tok == 6, "2.5 now wins, got %d", tok);
    sampler_free(&s);

    /* logit bias: +100 forces a token under greedy, -100 bans the greedy
     * one; the sampler keeps its own copy; ids outside are ignored */
    int32_t bias_ids[] = {7, 1, 99, -3};
    float bias[] = {100.0f, 0.0f, 100.0f, 100.0f};
    p = sampling_default();
    p.temperature = 0;
    p.n_bias = 4, p.bias_ids = bias_ids, p.bias = bias;
    sampler_init(&s, &p, V);
    bias_ids[0] = 0, bias[0] = -5.0f; /* the caller's arrays change: the sampler must not see it */
    memcpy(l, base, sizeof l);
    tok = sampler_sample(&s, l);
    CHECK(tok == 7 && fabsf(l[7] - 100.0f) < 1e-6f, "+100 on id 7 forces it, got %d", tok);
    sampler_free(&s);
    int32_t ban_ids[] = {1, 4};
    float ban[] = {-100.0f, -100.0f};
    p.n_bias = 2, p.bias_ids = ban_ids, p.bias = ban;
    sampler_init(&s, &p, V);
    memcpy(l, base, sizeof l);
    CHECK(sampler_sample(&s, l) == 6, "-100 on both maxima: 2.5 wins");
    sampler_free(&s);
    /* with sampling too: a banned token is (practically) never drawn */
    p.temperature = 1.0f, p.top_k = 4, p.seed = 3;
    sampler_init(&s, &p, V);
    int drawn_banned = 0;
    for (int i = 0; i < 2000; i++) {
        memcpy(l, base, sizeof l);
        int32_t t = sampler_sample(&s, l);
        drawn_banned += t == 1 || t == 4;
    }
    CHECK(drawn_banned == 0, "banned ids drawn %d times", drawn_banned);
    sampler_free(&s);

    /* masked (-inf) tokens are never drawn, even when top_k keeps more
     * tokens than remain */
    p = sampling_default();
    p.top_k = 6, p.seed = 11;
    sampler_init(&s, &p, V);
    int masked_drawn = 0;
    for (int i = 0; i < 5000; i++) {
        memcpy(l, base, sizeof l);
        for (int j = 0; j < V; j++)
            if (j != 3 && j != 5) l[j] = -INFINITY;
        int32_t t = sampler_sample(&s, l);
        masked_drawn += t != 3 && t != 5;
    }
    CHECK(masked_drawn == 0, "masked tokens drawn %d times", masked_drawn);
    sampler_free(&s);
}

/* ==== CPU ops ==== */

static float rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += (double)(a[i] - b[i]) * (a[i] - b[i]), den += (double)b[i] * b[i];
    return (float)sqrt(num / (den > 0 ? den : 1));
}

void test_ops(void) {
    char err[256];
    struct kiln_backend *be = backend_create("cpu", 2, err, sizeof err);
    CHECK(be != NULL, "%s", err);
    struct kiln_rng r;
    kiln_rng_seed(&r, 1);
    /* matmul in each dense dtype, odd sizes (tails), 1..9 rows, with bias */
    enum kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_F16};
    for (int ti = 0; ti < 3; ti++) {
        int n_out = 37, n_in = 83;
        size_t es = dtype_size(types[ti]);
        uint8_t *w = kiln_malloc((size_t)n_out * n_in * es);
        float *wf = kiln_malloc(sizeof(float) * (size_t)n_out * n_in);
        for (int i = 0; i < n_out * n_in; i++) {
            float v = kiln_rng_normal(&r);
            if (types[ti] == KILN_DTYPE_F32) ((float *)w)[i] = v, wf[i] = v;
            else if (types[ti] == KILN_DTYPE_BF16) ((uint16_t *)w)[i] = kiln_f32_to_bf16(v), wf[i] = kiln_bf16_to_f32(((uint16_t *)w)[i]);
            else ((uint16_t *)w)[i] = kiln_f32_to_f16(v), wf[i] = kiln_f16_to_f32(((uint16_t *)w)[i]);
        }
        float bias[37];
        for (int i = 0; i < n_out; i++) bias[i] = kiln_rng_normal(&r);
        struct qlinear q = {.n_out = n_out, .n_in = n_in, .fmt = KILN_WFMT_DENSE,
                            .w = {types[ti], n_out, n_in, w, NULL}, .bias = {KILN_DTYPE_F32, 1, n_out, bias, NULL}};
        CHECK(be->prepare_linear(be, &q, err, sizeof err) == 0, "%s", err);
        for (int n = 1; n <= 9; n += 4) {
            float *x = kiln_malloc(sizeof(float) * (size_t)n * n_in), *y = kiln_malloc(sizeof(float) * (size_t)n * n_out);
            float *ref = kiln_malloc(sizeof(float) * (size_t)n * n_out);
            for (int i = 0; i < n * n_in; i++) x[i] = kiln_rng_normal(&r);
            for (int t = 0; t < n; t++)
                for (int o = 0; o < n_out; o++) {
                    double s = bias[o];
                    for (int i = 0; i < n_in; i++) s += (double)wf[o * n_in + i] * x[t * n_in + i];
                    ref[t * n_out + o] = (float)s;
                }
            be->matmul(be, y, x, &q, n);
            float e = rel_err(y, ref, (size_t)n * n_out);
            CHECK(e < 1e-6f, "matmul %s n=%d rel err %g", dtype_name(types[ti]), n, e);
            free(x), free(y), free(ref);
        }
        be->release_linear(be, &q);
        free(w), free(wf);
    }
    /* rmsnorm and the fused add + rmsnorm */
    int n = 3, dim = 50;
    float x[150], y[150], out[150], ref[150], wv[50];
    for (int i = 0; i < n * dim; i++) x[i] = kiln_rng_normal(&r), y[i] = kiln_rng_normal(&r);
    for (int i = 0; i < dim; i++) wv[i] = 1 + 0.1f * kiln_rng_normal(&r);
    struct ktensor w = {KILN_DTYPE_F32, 1, dim, wv, NULL};
    be->prepare_tensor(be, &w, err, sizeof err);
    for (int t = 0; t < n; t++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)(x[t * dim + i] + y[t * dim + i]) * (x[t * dim + i] + y[t * dim + i]);
        for (int i = 0; i < dim; i++) ref[t * dim + i] = (float)((x[t * dim + i] + y[t * dim + i]) / sqrt(ss / dim + 1e-6) * wv[i]);
    }
    be->add_rmsnorm(be, x, out, y, &w, n, dim, 1e-6f);
    CHECK(rel_err(out, ref, (size_t)n * dim) < 1e-6f, "add_rmsnorm");
    be->rmsnorm(be, y, x, &w, n, dim, 1e-6f);
    CHECK(rel_err(y, ref, (size_t)n * dim) < 1e-6f, "rmsnorm on the updated residual");
    be->release_tensor(be, &w);
    /* swiglu */
    float g[4] = {-2, 0, 1, 3}, u[4] = {1, 2, 3, 4}, o[4];
    be->swiglu(be, o, g, u, 1, 4);
    CHECK(fabsf(o[0] - (-2 / (1 + expf(2)))) < 1e-6f && o[1] == 0 && fabsf(o[3] - 3 * 4 / (1 + expf(-3))) < 1e-5f);
    /* rope: position 0 is the identity; a rotation keeps each pair's norm */
    float inv[2] = {1.0f, 0.01f}, qv[4] = {1, 2, 3, 4}, kv4[4] = {1, 2, 3, 4};
    struct rope rp = {2, inv, 1.0f, NULL};
    be->prepare_rope(be, &rp, err, sizeof err);
    int32_t tok0 = 0, pos0 = 0, pos5 = 5;
    struct kiln_seq_view sv = {0, 1, 0, NULL, 0};
    struct kiln_batch b = {1, &tok0, &pos0, 1, &sv, 0, NULL, NULL, NULL};
    be->qk_norm_rope(be, qv, kv4, NULL, NULL, &rp, &b, 1, 1, 4, 1e-6f);
    CHECK(qv[0] == 1 && qv[1] == 2 && qv[2] == 3 && qv[3] == 4);
    b.pos = &pos5;
    be->qk_norm_rope(be, qv, kv4, NULL, NULL, &rp, &b, 1, 1, 4, 1e-6f);
    CHECK(fabsf(qv[0] - (1 * cosf(5) - 3 * sinf(5))) < 1e-6f && fabsf(qv[2] - (3 * cosf(5) + 1 * sinf(5))) < 1e-6f);
    CHECK(fabsf(qv[0] * qv[0] + qv[2] * qv[2] - 10) < 1e-5f && fabsf(qv[1] * qv[1] + qv[3] * qv[3] - 20) < 1e-5f);
    be->release_rope(be, &rp);

    /* attention over pages == attention over a contiguous cache: a sequence
     * of 37 tokens in scattered pages of 4, against a direct computation */
    {
        enum { T = 37, NH = 4, NKV = 2, HD = 8, P = 4 };
        struct kv_pool pool;
        CHECK(kv_pool_init(&pool, be, 1, NKV, HD, P, 16, KILN_DTYPE_F32, err, sizeof err) == 0, "%s", err);
        int32_t pages[10];
        int32_t tmp[16];
        kv_pool_alloc(&pool, 16, tmp);
        for (int i = 0; i < 10; i++) pages[i] = tmp[15 - i]; /* out of order on purpose */
        float *k = kiln_malloc(sizeof(float) * T * NKV * HD), *v = kiln_malloc(sizeof(float) * T * NKV * HD);
        float *q = kiln_malloc(sizeof(float) * T * NH * HD), *att = kiln_malloc(sizeof(float) * T * NH * HD);
        for (int i = 0; i < T * NKV * HD; i++) k[i] = kiln_rng_normal(&r), v[i] = kiln_rng_normal(&r);
        for (int i = 0; i < T * NH * HD; i++) q[i] = kiln_rng_normal(&r);
        int32_t toks[T], pos[T];
        for (int i = 0; i < T; i++) toks[i] = 0, pos[i] = i;
        /* 30 tokens as a prefill, then 7 more as a second chunk */
        struct kiln_seq_view s1 = {0, 30, 0, pages, 10};
        struct kiln_batch b1 = {30, toks, pos, 1, &s1, 0, NULL, NULL, NULL};
        be->kv_write(be, &pool.cache, 0, k, v, &b1);
        struct kiln_seq_view s2 = {0, 7, 30, pages, 10};
        struct kiln_batch b2 = {7, toks + 30, pos + 30, 1, &s2, 0, NULL, NULL, NULL};
        be->kv_write(be, &pool.cache, 0, k + 30 * NKV * HD, v + 30 * NKV * HD, &b2);
        be->attention(be, att, q + 30 * NH * HD, &pool.cache, 0, &b2, NH, 0.35f);
        float worst = 0;
        for (int i = 0; i < 7; i++)
            for (int h = 0; h < NH; h++) {
                int t = 30 + i, kh = h / (NH / NKV);
                double sc[T], mx = -1e30, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int c = 0; c < HD; c++) d += q[(t * NH + h) * HD + c] * k[(j * NKV + kh) * HD + c];
                    sc[j] = d * 0.35;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int j = 0; j <= t; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (int c = 0; c < HD; c++) {
                    double o2 = 0;
                    for (int j = 0; j <= t; j++) o2 += sc[j] / sum * v[(j * NKV + kh) * HD + c];
                    float d = fabsf((float)o2 - att[(i * NH + h) * HD + c]);
                    worst = d > worst ? d : worst;
                }
            }
        CHECK(worst < 1e-5f, "paged attention vs direct: %g", worst);
        free(k), free(v), free(q), free(att);
        kv_pool_free(&pool);
    }
    be->destroy(be);
}

/* ==== KV page pool ==== */

void test_kv(void) {
    char err[256];
    struct kiln_backend *be = backend_create("cpu", 1, err, sizeof err);
    struct kv_pool p;
    CHECK(kv_pool_init(&p, be, 2, 2, 8, 16, 4, KILN_DTYPE_F32, err, sizeof err) == 0, "%s", err);
    int32_t a[4], b[2];
    CHECK(kv_pool_alloc(&p, 3, a) == 0 && kv_pool_n_free(&p) == 1);
    CHECK(a[0] != a[1] && a[1] != a[2] && a[0] != a[2]);
    CHECK(kv_pool_alloc(&p, 2, b) < 0 && kv_pool_n_free(&p) == 1, "all or nothing");
    kv_pool_ref(&p, a[0]);
    kv_pool_release(&p, a[0]);
    CHECK(kv_pool_n_free(&p) == 1, "still held once");
    kv_pool_release(&p, a[0]);
    CHECK(kv_pool_n_free(&p) == 2);
    CHECK(kv_pool_alloc(&p, 2, b) == 0 && (b[0] == a[0] || b[1] == a[0]), "freed page is reused");
    kv_pool_free(&p);
    CHECK(kv_pool_init(&p, be, 1, 1, 8, 16, 0, KILN_DTYPE_F32, err, sizeof err) < 0 && strstr(err, "empty"));
    CHECK(kv_pool_init(&p, be, 1, 1, 8, 16, 4, KILN_DTYPE_Q4_0, err, sizeof err) < 0 && strstr(err, "F32, F16, BF16 or Q8_0"), "%s", err);
    CHECK(kv_pool_init(&p, be, 1, 1, 8, 16, 4, KILN_DTYPE_Q8_0, err, sizeof err) < 0 && strstr(err, "head_dim 8"), "%s", err);
    CHECK(kv_pool_init(&p, be, 1, 1, 8, 16, 4, KILN_DTYPE_F16, err, sizeof err) == 0, "%s", err);
    kv_pool_free(&p);
    /* Q8_0 rows: head_dim / 32 blocks of 34 bytes */
    CHECK(kv_pool_init(&p, be, 1, 1, 64, 16, 4, KILN_DTYPE_Q8_0, err, sizeof err) == 0, "%s", err);
    CHECK(kv_row_bytes(KILN_DTYPE_Q8_0, 64) == 68 && kv_bytes_per_token(2, 3, 128, KILN_DTYPE_Q8_0) == 2 * 2 * 3 * 136);
    kv_pool_free(&p);
    be->destroy(be);

    /* the engine: several sequences in one forward equal each alone, and the
     * KV cache is full -> a clear error, nothing advanced */
    struct kiln_engine_opts o = {.model = FIXTURES "/qwen3-dense-small", .backend = "cpu", .max_total_tokens = 160, .page_size = 16};
    kiln_engine *e = kiln_engine_open(&o, err, sizeof err);
    CHECK(e != NULL, "%s", err);
    if (!e) return;
    int V = kiln_engine_config(e)->vocab;
    int32_t pa[] = {5, 9, 200, 31, 7, 8, 1}, pb[] = {100, 2, 3};
    float *la = kiln_malloc(sizeof(float) * V), *lb = kiln_malloc(sizeof(float) * V), *both = kiln_malloc(sizeof(float) * 2 * V);
    kiln_seq *sa = kiln_seq_new(e, err, sizeof err), *sb = kiln_seq_new(e, err, sizeof err);
    CHECK(kiln_seq_eval(sa, pa, 7, la, 0, err, sizeof err) == 0 && kiln_seq_eval(sb, pb, 3, lb, 0, err, sizeof err) == 0);
    kiln_seq_truncate(sa, 4);
    kiln_seq_truncate(sb, 0);
    kiln_seq *ss[2] = {sa, sb};
    const int32_t *ids[2] = {pa + 4, pb};
    int ns[2] = {3, 3};
    CHECK(kiln_seqs_eval(ss, 2, ids, ns, both, err, sizeof err) == 0, "%s", err);
    CHECK(rel_err(both, la, V) < 1e-6f && rel_err(both + V, lb, V) < 1e-6f, "batched == alone");
    CHECK(kiln_seq_len(sa) == 7 && kiln_seq_len(sb) == 3);
    /* the same step again, taking the backend's argmax instead of logits */
    kiln_seq_truncate(sa, 4);
    kiln_seq_truncate(sb, 0);
    int32_t next[2] = {-1, -1};
    CHECK(kiln_seqs_eval_argmax(ss, 2, ids, ns, next, err, sizeof err) == 0, "%s", err);
    CHECK(next[0] == sampler_argmax(la, V) && next[1] == sampler_argmax(lb, V), "argmax ids %d %d vs %d %d", next[0], next[1],
          sampler_argmax(la, V), sampler_argmax(lb, V));
    CHECK(kiln_seq_len(sa) == 7 && kiln_seq_len(sb) == 3);
    int32_t *many = kiln_calloc(200, sizeof(int32_t));
    CHECK(kiln_seq_eval(sb, many, 200, lb, 0, err, sizeof err) < 0 && strstr(err, "KV cache full"), "%s", err);
    CHECK(kiln_seq_len(sb) == 3);
    int32_t bad = V + 5;
    CHECK(kiln_seq_eval(sb, &bad, 1, lb, 0, err, sizeof err) < 0 && strstr(err, "vocabulary"), "%s", err);
    /* a fresh sequence whose first forward fails after its pages were
     * reserved gives every page back when freed */
    const int free0 = kv_pool_n_free(&e->kv);
    kiln_seq *sc = kiln_seq_new(e, err, sizeof err);
    int32_t fail_ids[40];
    for (int i = 0; i < 40; i++) fail_ids[i] = i == 39 ? V + 5 : i;
    CHECK(kiln_seq_eval(sc, fail_ids, 40, lb, 0, err, sizeof err) < 0 && strstr(err, "vocabulary"), "%s", err);
    CHECK(kiln_seq_len(sc) == 0);
    kiln_seq_free(sc);
    CHECK(kv_pool_n_free(&e->kv) == free0, "pages free after the failed sequence: %d, before it: %d", kv_pool_n_free(&e->kv), free0);
    free(many), free(la), free(lb), free(both);
    kiln_seq_free(sa);
    kiln_seq_free(sb);
    kiln_engine_close(e);

    /* --mem-fraction: below what is already in use is an error before
     * anything runs; above it, the pool gets what is left of the fraction */
    o.max_total_tokens = 0;
    o.mem_fraction = 1e-9;
    e = kiln_engine_open(&o, err, sizeof err);
    CHECK(e == NULL && strstr(err, "--mem-fraction") && strstr(err, "no room"), "%s", err);
    kiln_engine_close(e);
    struct kiln_backend *mb = backend_create("cpu", 1, err, sizeof err);
    size_t fr = 0, tot = 0;
    mb->mem_info(mb, &fr, &tot);
    mb->destroy(mb);
    CHECK(tot > 0 && fr > 0 && fr <= tot, "host memory %zu free of %zu", fr, tot);
    const double want = 64.0 * 1048576; /* bytes of KV the fraction leaves */
    o.mem_fraction = ((double)(tot - fr) + want) / (double)tot;
    e = kiln_engine_open(&o, err, sizeof err);
    CHECK(e != NULL, "%s", err);
    if (e) {
        const struct kiln_config *cf = kiln_engine_config(e);
        double per_tok = (double)kv_bytes_per_token(cf->n_layer, cf->n_head_kv, cf->head_dim, KILN_DTYPE_F32);
        double got = kiln_engine_max_tokens(e) * per_tok;
        /* other processes move the free figure between the two readings */
        CHECK(got > 0.25 * want && got < 4 * want, "KV pool %.1f MiB for a %.1f MiB budget", got / 1048576, want / 1048576);
        kiln_engine_close(e);
    }
    o.mem_fraction = 0;
}
