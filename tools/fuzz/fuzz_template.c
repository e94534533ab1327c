/*
 * fuzz_template.c: libFuzzer entry for the chat template interpreter.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Isrc tools/fuzz/fuzz_template.c \
 *     src/tokenizer/jinja_*.c src/tokenizer/chat.c src/tokenizer/load.c src/tokenizer/bpe.c \
 *     src/tokenizer/stream.c src/base/base.c -lcjson -lpcre2-8 -lutf8proc -lpthread -lm -o fuzz-template
 *   ./fuzz-template -max_total_time=120 -dict=tools/fuzz/jinja.dict tests/fixtures/templates
 *
 * The input is a template; if it holds a NUL byte, what follows is the
 * messages JSON (else a fixed conversation). Rendering may fail, never crash,
 * leak or run away (the interpreter bounds recursion, output and loops).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static const char default_messages[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nx\\n</think>\\n\\nyo\", \"tool_calls\": [{\"function\":"
    " {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]}, {\"role\": \"tool\", \"content\": \"r\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *tpl = malloc(size + 1);
    memcpy(tpl, data, size);
    tpl[size] = 0;
    const char *msgs = default_messages;
    size_t tl = strlen(tpl);
    if (tl < size) msgs = tpl + tl + 1;
    char err[512];
    char *out = tok_render_template(tpl, msgs, size & 1, (int)(size % 3) - 1, "<s>", "</s>", err, sizeof err);
    free(out);
    free(tpl);
    return 0;
}
