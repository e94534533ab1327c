/*
 * fuzz_tokenizer.c: libFuzzer entry for the tokenizer.
 *
 *   make fuzz                    (scripts/fuzz.sh builds every target), or by hand:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Isrc tools/fuzz/fuzz_tokenizer.c \
 *     src/tokenizer/load.c src/tokenizer/json_scan.c src/tokenizer/bpe.c src/tokenizer/stream.c \
 *     src/base/base.c -lcjson -lpcre2-8 -lutf8proc -lpthread -lm -o fuzz-tokenizer
 *   KILN_FUZZ_MODEL=tests/fixtures/qwen3-dense-tiny ./fuzz-tokenizer -max_total_time=120
 *
 * Inputs starting with '{' are loaded as a tokenizer.json (must not crash or
 * leak, whatever they hold). Other inputs are encoded with the Qwen3
 * tokenizer and checked: decode(encode(x)) == NFC(x) for valid UTF-8, and the
 * streaming decoder's chunks concatenate to decode.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/base.h"
#include "tokenizer/tokenizer.h"

static struct kiln_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    /* scripts/fuzz.sh runs targets from build-fuzz/, so look one level up too */
    const char *dirs[] = {getenv("KILN_FUZZ_MODEL"), "../shared/models/qwen3-tokenizer",
                          "../../shared/models/qwen3-tokenizer", "tests/fixtures/qwen3-dense-tiny",
                          "../tests/fixtures/qwen3-dense-tiny"};
    char err[512] = "no model directory";
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0] && !tok; i++)
        if (dirs[i]) tok = tok_load(dirs[i], err, sizeof err);
    if (!tok) {
        fprintf(stderr, "fuzz_tokenizer: %s (set KILN_FUZZ_MODEL)\n", err);
        abort();
    }
    return 0;
}

static int valid_utf8(const uint8_t *s, size_t n) {
    utf8proc_int32_t cp;
    for (size_t i = 0; i < n;) {
        utf8proc_ssize_t l = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (l <= 0) return 0;
        i += (size_t)l;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    if (size && data[0] == '{') {
        struct kiln_tokenizer *t = tok_load_json((const char *)data, size, err, sizeof err);
        if (t) {
            int32_t *ids;
            int n;
            if (!tok_encode(t, "Hello world 123 héllo", 21, &ids, &n, err, sizeof err)) free(ids);
            tok_free(t);
        }
        return 0;
    }
    int32_t *ids;
    int n;
    if (tok_encode(tok, (const char *)data, size, &ids, &n, err, sizeof err)) abort();
    size_t len;
    char *back = tok_decode(tok, ids, n, 0, &len, err, sizeof err);
    assert(back);
    if (valid_utf8(data, size) && !memchr(data, 0, size)) {
        char *z = kiln_malloc(size + 1);
        memcpy(z, data, size);
        z[size] = 0;
        char *nfc = (char *)utf8proc_NFC((const utf8proc_uint8_t *)z);
        assert(nfc && strlen(nfc) == len && !memcmp(nfc, back, len));
        free(nfc);
        free(z);
    }
    struct tok_stream *s = tok_stream_new(tok, 0);
    size_t off = 0;
    for (int i = 0; i <= n; i++) {
        char *out;
        size_t ol;
        int rc = i < n ? tok_stream_push(s, ids[i], &out, &ol) : tok_stream_flush(s, &out, &ol);
        assert(rc == 0);
        assert(off + ol <= len && !memcmp(back + off, out, ol));
        off += ol;
        free(out);
    }
    assert(off == len);
    tok_stream_free(s);
    free(back);
    free(ids);
    return 0;
}
