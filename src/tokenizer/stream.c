/*
 * stream.c: the incremental detokenizer.
 *
 * Byte-level BPE decodes by concatenating each token's bytes and repairing
 * invalid UTF-8 once at the end, so a stream only has to hold back a trailing
 * sequence that is valid UTF-8 so far but incomplete (at most 3 bytes).
 * Everything before it is final: a complete character, or an invalid stretch
 * that from_utf8_lossy would turn into U+FFFD whatever follows. That is why
 * the concatenation of all chunks equals tok_decode of all ids (the ByteLevel
 * decoder has no cross-token rules such as prefix-space stripping).
 */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tokenizer/tokenizer.h"

struct tok_stream {
    const struct kiln_tokenizer *t;
    int skip_special;
    uint8_t pending[8]; /* an incomplete UTF-8 tail, < 4 bytes */
    size_t n_pending;
};

struct tok_stream *tok_stream_new(const struct kiln_tokenizer *t, int skip_special) {
    struct tok_stream *s = kiln_calloc(1, sizeof *s);
    s->t = t;
    s->skip_special = skip_special;
    return s;
}

static int stream_emit(struct tok_stream *s, const uint8_t *b, size_t bl, int final, char **out, size_t *out_len) {
    size_t n = s->n_pending + bl;
    uint8_t stack[256];
    uint8_t *buf = n <= sizeof stack ? stack : kiln_malloc(n);
    memcpy(buf, s->pending, s->n_pending);
    if (bl) memcpy(buf + s->n_pending, b, bl);
    char *o = NULL;
    size_t ol = 0, cap = 0;
    size_t used = tok_utf8_repair(buf, n, final, &o, &ol, &cap);
    s->n_pending = n - used;
    memcpy(s->pending, buf + used, s->n_pending);
    if (buf != stack) free(buf);
    *out = o, *out_len = ol;
    return 0;
}

int tok_stream_push(struct tok_stream *s, int32_t id, char **out, size_t *out_len) {
    size_t bl;
    const uint8_t *b = tok_id_bytes(s->t, id, &bl);
    *out = NULL, *out_len = 0;
    if (!b) return -1;
    if (s->skip_special && tok_is_special(s->t, id)) bl = 0;
    return stream_emit(s, b, bl, 0, out, out_len);
}

int tok_stream_flush(struct tok_stream *s, char **out, size_t *out_len) {
    return stream_emit(s, NULL, 0, 1, out, out_len);
}

void tok_stream_free(struct tok_stream *s) { free(s); }
