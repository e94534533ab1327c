/*
 * test_tokenizer.c: the `tokenizer` group.
 *
 * - every case of tests/fixtures/tokenizer/qwen3_vectors.json (made by HF
 *   tokenizers) encodes to exactly its ids and decodes back to NFC(text);
 * - added/special tokens, skip_special, invalid UTF-8 input;
 * - small synthetic tokenizer.json files for the options the Qwen3 file does
 *   not use (merges as pairs, ignore_merges, lstrip/rstrip/single_word,
 *   ByteLevel prefix space and regex, Digits); their expected ids were made
 *   with HF tokenizers 0.23 from the same JSON;
 * - the streaming detokenizer on seeded random id sequences: every chunk is
 *   valid UTF-8 and the chunks concatenate to tok_decode;
 * - load and decode errors.
 *
 * The Qwen3 tokenizer is read from tests/fixtures/qwen3-dense-tiny (the real
 * Qwen3 tokenizer.json, sha256 aeb13307...).
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/base.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

/* ==== helpers ==== */

static const char *qwen3_dir(void) { return FIXTURES "/qwen3-dense-tiny"; }

static int ids_equal(const int32_t *a, int na, const cJSON *arr) {
    if (na != cJSON_GetArraySize(arr)) return 0;
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) if (a[i++] != it->valueint) return 0;
    return 1;
}

static int utf8_ok(const char *s, size_t n) {
    utf8proc_int32_t cp;
    for (size_t i = 0; i < n;) {
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (l <= 0) return 0;
        i += (size_t)l;
    }
    return 1;
}

/* encodes text and compares with the expected ids (terminated by -1) */
static void check_encode(const struct kiln_tokenizer *t, const char *text, size_t len, const int32_t *want,
                         const char *what) {
    int32_t *ids;
    int n;
    char err[256];
    int rc = tok_encode(t, text, len, &ids, &n, err, sizeof err);
    CHECK(rc == 0, "%s: %s", what, err);
    if (rc) return;
    int nw = 0;
    while (want[nw] >= 0) nw++;
    int same = n == nw;
    for (int i = 0; same && i < n; i++) same = ids[i] == want[i];
    CHECK(same, "%s: got %d ids, first %d; want %d ids, first %d", what, n, n ? ids[0] : -1, nw, nw ? want[0] : -1);
    free(ids);
}

/* ==== Qwen3 vectors ==== */

static void test_vectors(const struct kiln_tokenizer *t) {
    char err[256];
    char *text = kiln_read_file(FIXTURES "/tokenizer/qwen3_vectors.json", NULL, err, sizeof err);
    CHECK(text != NULL, "%s", err);
    if (!text) return;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases"), *c;
    CHECK(cJSON_GetArraySize(cases) == 94, "expected 94 cases, got %d", cJSON_GetArraySize(cases));
    int k = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *s = cJSON_GetObjectItem(c, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(c, "ids");
        int32_t *ids;
        int n;
        CHECK(tok_encode(t, s, strlen(s), &ids, &n, err, sizeof err) == 0, "case %d: %s", k, err);
        CHECK(ids_equal(ids, n, want), "case %d (%.40s): ids differ (got %d, want %d)", k, s, n,
              cJSON_GetArraySize(want));
        size_t len;
        char *back = tok_decode(t, ids, n, 0, &len, err, sizeof err);
        char *nfc = (char *)utf8proc_NFC((const utf8proc_uint8_t *)s);
        CHECK(back && nfc && len == strlen(nfc) && !memcmp(back, nfc, len), "case %d (%.40s): decode differs", k, s);
        free(nfc);
        free(back);
        free(ids);
        k++;
    }
    cJSON_Delete(root);
}

static void test_qwen3_specials(const struct kiln_tokenizer *t) {
    char err[256];
    CHECK(tok_vocab_size(t) == 151669, "vocab size %d", tok_vocab_size(t));
    CHECK(tok_token_id(t, "<|im_end|>") == 151645);
    CHECK(tok_token_id(t, "<think>") == 151667);
    CHECK(tok_token_id(t, "Ġthe") == 279, "Ġthe -> %d", tok_token_id(t, "Ġthe"));
    CHECK(tok_token_id(t, "no such token, surely") == -1);
    CHECK(tok_is_special(t, 151645) && !tok_is_special(t, 151667) && !tok_is_special(t, 279));
    CHECK(tok_eos_token(t) && !strcmp(tok_eos_token(t), "<|im_end|>"));
    CHECK(tok_bos_token(t) == NULL);
    CHECK(tok_chat_template(t) && strstr(tok_chat_template(t), "<|im_start|>"));

    /* specials are matched inside words; skip_special drops only special ones */
    const char *s = "a<|im_start|>user<think>x</think><|im_end|>";
    int32_t *ids;
    int n;
    CHECK(tok_encode(t, s, strlen(s), &ids, &n, err, sizeof err) == 0);
    int32_t want[] = {64, 151644, 872, 151667, 87, 151668, 151645, -1};
    check_encode(t, s, strlen(s), want, "specials");
    size_t len;
    char *d = tok_decode(t, ids, n, 1, &len, err, sizeof err);
    CHECK(d && !strcmp(d, "auser<think>x</think>"), "skip_special: %s", d ? d : err);
    free(d);
    d = tok_decode(t, ids, n, 0, &len, err, sizeof err);
    CHECK(d && !strcmp(d, s));
    free(d);
    free(ids);

    /* out of range ids are an error */
    int32_t bad[] = {1, 151669};
    CHECK(tok_decode(t, bad, 2, 0, &len, err, sizeof err) == NULL && strstr(err, "151669"));
    int32_t neg[] = {-3};
    CHECK(tok_decode(t, neg, 1, 0, &len, err, sizeof err) == NULL);

    /* a lone byte token renders as U+FFFD, as from_utf8_lossy does */
    int32_t e4 = tok_token_id(t, "ä"); /* the byte-level char of byte 0xE4 */
    CHECK(e4 >= 0);
    d = tok_decode(t, &e4, 1, 0, &len, err, sizeof err);
    CHECK(d && !strcmp(d, "\xEF\xBF\xBD"));
    free(d);

    /* invalid UTF-8 input encodes like Python's decode(errors="replace") */
    struct { const char *bad, *fixed; } inv[] = {
        {"\xff", "\xEF\xBF\xBD"},
        {"a\xe4\xbd", "a\xEF\xBF\xBD"},
        {"\xe4\xbdx\xa0", "\xEF\xBF\xBDx\xEF\xBF\xBD"},
        {"\xf0\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xed\xa0\x80z", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDz"},
        {"ok\xc3", "ok\xEF\xBF\xBD"},
    };
    for (size_t i = 0; i < sizeof inv / sizeof inv[0]; i++) {
        int32_t *a, *b;
        int na, nb;
        CHECK(tok_encode(t, inv[i].bad, strlen(inv[i].bad), &a, &na, err, sizeof err) == 0);
        CHECK(tok_encode(t, inv[i].fixed, strlen(inv[i].fixed), &b, &nb, err, sizeof err) == 0);
        CHECK(na == nb && !memcmp(a, b, (size_t)na * 4), "invalid utf-8 case %zu", i);
        free(a);
        free(b);
    }
    /* embedded NUL and an empty string */
    int32_t want_nul[] = {64, 188, 65, -1};
    check_encode(t, "a\0b", 3, want_nul, "embedded NUL");
    int32_t none[] = {-1};
    check_encode(t, "", 0, none, "empty");
}

/* ==== synthetic tokenizer.json files ==== */

/* a byte-level vocab of printable ASCII plus a few merges; %s slots take the
 * normalizer, pre_tokenizer, model extras and added tokens */
static char *synth_json(const char *normalizer, const char *pre, const char *merges, const char *model_extra,
                        const char *added) {
    char vocab[8192];
    size_t k = 0;
    k += (size_t)snprintf(vocab + k, sizeof vocab - k, "{");
    int id = 0;
    for (int c = '!'; c <= '~'; c++) {
        if (c == '"' || c == '\\') k += (size_t)snprintf(vocab + k, sizeof vocab - k, "\"\\%c\":%d,", c, id++);
        else k += (size_t)snprintf(vocab + k, sizeof vocab - k, "\"%c\":%d,", c, id++);
    }
    /* Ġ (space) Ċ (newline) then merged tokens: ids 96.. */
    k += (size_t)snprintf(vocab + k, sizeof vocab - k,
                          "\"Ġ\":94,\"Ċ\":95,\"ab\":96,\"abc\":97,\"Ġa\":98,\"Ġab\":99,\"12\":100,"
                          "\"bc\":101,\"xyz\":102,\"Ġabc\":103}");
    size_t cap = strlen(vocab) + 4096;
    char *s = kiln_malloc(cap);
    snprintf(s, cap,
             "{\"version\":\"1.0\",\"added_tokens\":[%s],\"normalizer\":%s,\"pre_tokenizer\":%s,"
             "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
             "\"model\":{\"type\":\"BPE\",%s\"vocab\":%s,\"merges\":%s}}",
             added, normalizer, pre, model_extra, vocab, merges);
    return s;
}

static struct kiln_tokenizer *synth_load(const char *norm, const char *pre, const char *merges, const char *extra,
                                         const char *added, char *err, size_t errlen) {
    char *s = synth_json(norm, pre, merges, extra, added);
    struct kiln_tokenizer *t = tok_load_json(s, strlen(s), err, errlen);
    free(s);
    return t;
}

static const char merges_str[] = "[\"a b\",\"ab c\",\"Ġ a\",\"Ġa b\",\"1 2\",\"b c\",\"Ġab c\"]";
static const char merges_pairs[] = "[[\"a\",\"b\"],[\"ab\",\"c\"],[\"Ġ\",\"a\"],[\"Ġa\",\"b\"],[\"1\",\"2\"],[\"b\",\"c\"],[\"Ġab\",\"c\"]]";
static const char bytelevel_pre[] = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}";

static void test_synthetic(void) {
    char err[256];
    struct kiln_tokenizer *t;

    /* merges as "a b" strings and as pairs give the same result */
    for (int v = 0; v < 2; v++) {
        t = synth_load("null", bytelevel_pre, v ? merges_pairs : merges_str, "", "", err, sizeof err);
        CHECK(t != NULL, "%s", err);
        if (!t) continue;
        int32_t w1[] = {97, 94, 97, 94, 98, 100, 18, -1}; /* "abc abc  a123" */
        check_encode(t, "abc abc  a123", 13, w1, v ? "pairs" : "strings");
        tok_free(t);
    }

    /* ignore_merges: a word in the vocab is taken whole ("xyz" has no merges) */
    t = synth_load("null", bytelevel_pre, merges_str, "\"ignore_merges\":true,", "", err, sizeof err);
    CHECK(t != NULL, "%s", err);
    if (t) {
        int32_t w[] = {102, 94, 87, 88, 89, -1}; /* "Ġxyz" is not in the vocab */
        check_encode(t, "xyz xyz", 7, w, "ignore_merges");
        tok_free(t);
    }
    t = synth_load("null", bytelevel_pre, merges_str, "", "", err, sizeof err);
    if (t) {
        int32_t w[] = {87, 88, 89, 94, 87, 88, 89, -1};
        check_encode(t, "xyz xyz", 7, w, "no ignore_merges");
        tok_free(t);
    }

    /* ByteLevel add_prefix_space, Digits */
    t = synth_load("{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]}",
                   "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true},"
                   "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}]}",
                   merges_str, "", "", err, sizeof err);
    CHECK(t != NULL, "%s", err);
    if (t) {
        int32_t w[] = {94, 97, 94, 16, 94, 17, 98, -1}; /* every piece gets its own prefix space */
        check_encode(t, "abc12a", 6, w, "digits + prefix space");
        tok_free(t);
    }

    /* added tokens: lstrip / rstrip / single_word / normalized */
    t = synth_load("null", bytelevel_pre, merges_str, "",
                   "{\"id\":104,\"content\":\"<L>\",\"lstrip\":true,\"rstrip\":false,\"single_word\":false,"
                   "\"normalized\":false,\"special\":true},"
                   "{\"id\":105,\"content\":\"<R>\",\"lstrip\":false,\"rstrip\":true,\"single_word\":false,"
                   "\"normalized\":false,\"special\":false},"
                   "{\"id\":106,\"content\":\"cab\",\"lstrip\":false,\"rstrip\":false,\"single_word\":true,"
                   "\"normalized\":true,\"special\":false}",
                   err, sizeof err);
    CHECK(t != NULL, "%s", err);
    if (t) {
        CHECK(tok_vocab_size(t) == 107);
        int32_t w1[] = {64, 104, 65, -1};
        check_encode(t, "a  <L>b", 7, w1, "lstrip");
        int32_t w2[] = {64, 105, 65, 94, 65, -1};
        check_encode(t, "a<R>  b b", 9, w2, "rstrip");
        int32_t w3[] = {87, 94, 106, 11, 94, 106, -1};
        check_encode(t, "x cab, cab", 10, w3, "single_word between spaces and punctuation");
        int32_t w4[] = {106, 94, 106, -1};
        check_encode(t, "cab cab", 7, w4, "single_word alone");
        int32_t w5[] = {66, 97, 96, -1};
        check_encode(t, "cabcab", 6, w5, "single_word inside a word");
        size_t len;
        int32_t ids[] = {64, 104, 105, 106};
        char *d = tok_decode(t, ids, 4, 1, &len, err, sizeof err);
        CHECK(d && !strcmp(d, "a<R>cab"), "decode skip: %s", d ? d : err);
        free(d);
        tok_free(t);
    }
}

/* ==== streaming ==== */

static void test_stream(const struct kiln_tokenizer *t) {
    struct kiln_rng rng;
    kiln_rng_seed(&rng, 1234);
    /* a pool rich in partial UTF-8: byte tokens for 你 (E4 BD A0), 😀 (F0 9F 98 80),
     * a lone continuation byte, and specials */
    const char *pieces[] = {"ä", "½", "ł", "ð", "Ł", "ĺ", "Ģ", "Ġthe", "Hello", "ĠçļĦ", "ðŁĺĢ", "ÃĹ", "Ċ", "ÿ"};
    int32_t pool[64];
    int np = 0;
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        int id = tok_token_id(t, pieces[i]);
        CHECK(id >= 0, "pool token %s", pieces[i]);
        if (id >= 0) pool[np++] = id;
    }
    pool[np++] = 151645; /* <|im_end|> special */
    pool[np++] = 151667; /* <think> */
    int32_t ni_hao[] = {tok_token_id(t, "ä"), tok_token_id(t, "½"), tok_token_id(t, "ł")};
    char err[256];
    for (int round = 0; round < 400; round++) {
        int skip = round & 1;
        int n = 1 + (int)(kiln_rng_next(&rng) % 40);
        int32_t ids[48];
        for (int i = 0; i < n; i++) {
            uint64_t r = kiln_rng_next(&rng) % 10;
            ids[i] = r < 6 ? pool[kiln_rng_next(&rng) % (uint64_t)np]
                     : r < 9 ? (int32_t)(kiln_rng_next(&rng) % 151669) : ni_hao[i % 3];
        }
        struct tok_stream *s = tok_stream_new(t, skip);
        char *all = kiln_strdup("");
        size_t all_len = 0;
        int chunks_ok = 1;
        for (int i = 0; i <= n; i++) {
            char *out;
            size_t ol;
            int rc = i < n ? tok_stream_push(s, ids[i], &out, &ol) : tok_stream_flush(s, &out, &ol);
            CHECK(rc == 0);
            if (rc) break;
            chunks_ok &= utf8_ok(out, ol) && strlen(out) <= ol;
            all = kiln_realloc(all, all_len + ol + 1);
            memcpy(all + all_len, out, ol + 1);
            all_len += ol;
            free(out);
        }
        tok_stream_free(s);
        size_t dl;
        char *d = tok_decode(t, ids, n, skip, &dl, err, sizeof err);
        CHECK(chunks_ok, "round %d: a chunk was not valid UTF-8", round);
        CHECK(d && dl == all_len && !memcmp(d, all, dl), "round %d: stream != decode", round);
        free(d);
        free(all);
    }
    /* 你 in three byte tokens: nothing until the last byte arrives */
    struct tok_stream *s = tok_stream_new(t, 0);
    char *out;
    size_t ol;
    CHECK(tok_stream_push(s, ni_hao[0], &out, &ol) == 0 && ol == 0);
    free(out);
    CHECK(tok_stream_push(s, ni_hao[1], &out, &ol) == 0 && ol == 0);
    free(out);
    CHECK(tok_stream_push(s, ni_hao[2], &out, &ol) == 0 && !strcmp(out, "你"));
    free(out);
    CHECK(tok_stream_push(s, ni_hao[0], &out, &ol) == 0 && ol == 0);
    free(out);
    CHECK(tok_stream_push(s, 9707, &out, &ol) == 0 && !strcmp(out, "\xEF\xBF\xBDHello"), "%s", out);
    free(out);
    CHECK(tok_stream_push(s, 1 << 30, &out, &ol) == -1);
    CHECK(tok_stream_push(s, ni_hao[0], &out, &ol) == 0 && ol == 0);
    free(out);
    CHECK(tok_stream_flush(s, &out, &ol) == 0 && !strcmp(out, "\xEF\xBF\xBD"));
    free(out);
    tok_stream_free(s);
}

/* ==== errors ==== */

static void test_errors(void) {
    char err[256];
    struct kiln_tokenizer *t;
    t = tok_load_json("{\"model\": ", 10, err, sizeof err);
    CHECK(!t && strstr(err, "not valid JSON"), "%s", err);
    const char *wp = "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}},\"decoder\":{\"type\":\"ByteLevel\"}}";
    t = tok_load_json(wp, strlen(wp), err, sizeof err);
    CHECK(!t && strstr(err, "WordPiece"), "%s", err);
    t = synth_load("{\"type\":\"NFKC\"}", bytelevel_pre, merges_str, "", "", err, sizeof err);
    CHECK(!t && strstr(err, "NFKC"), "%s", err);
    t = synth_load("null", "{\"type\":\"Metaspace\"}", merges_str, "", "", err, sizeof err);
    CHECK(!t && strstr(err, "Metaspace"), "%s", err);
    t = synth_load("null", bytelevel_pre, "[\"a q\"]", "", "", err, sizeof err);
    CHECK(!t && strstr(err, "merge 0"), "%s", err);
    t = synth_load("null",
                   "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\",\"invert\":false}",
                   merges_str, "", "", err, sizeof err);
    CHECK(!t && strstr(err, "regex"), "%s", err);
    t = tok_load("tests/fixtures/no-such-model", err, sizeof err);
    CHECK(!t && strstr(err, "tokenizer.json"), "%s", err);
}

void test_tokenizer(void) {
    test_synthetic();
    test_errors();
    const char *dir = qwen3_dir();
    char err[256];
    struct kiln_tokenizer *t = tok_load(dir, err, sizeof err);
    CHECK(t != NULL, "%s", err);
    if (!t) return;
    test_vectors(t);
    test_vectors(t); /* again, now through the word cache */
    test_qwen3_specials(t);
    test_stream(t);
    tok_free(t);
}
