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
 * - load and decode errors;
 * - the JSON scanner that reads model.vocab / model.merges (json_scan.h):
 *   escapes, \uXXXX and surrogate pairs, numbers, nesting, and errors for
 *   malformed and truncated input (every prefix of a tokenizer.json), plus
 *   the loader on escaped tokens, members in other orders, duplicate keys.
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
#include "tokenizer/json_scan.h"
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

/* ==== the JSON scanner ==== */

/* js_string on the JSON text j: 0 and the bytes, or -1 and the error */
static int scan_str(const char *j, uint8_t *out, size_t *len, struct js *s) {
    js_init(s, j, 0, strlen(j), 0);
    const uint8_t *o;
    int rc = js_string(s, &o, len);
    if (!rc) memcpy(out, o, *len);
    js_free(s);
    return rc;
}

static void test_json_scan(void) {
    struct { const char *json, *want; size_t len; } ok[] = {
        {"\"plain\"", "plain", 5},
        {"\"\"", "", 0},
        {"\"q\\\"b\\\\s\\/\\b\\f\\n\\r\\t\"", "q\"b\\s/\b\f\n\r\t", 11},
        {"\"\\u0041\\u00e9\\u00E9\"", "A\xC3\xA9\xC3\xA9", 5},            /* 1 and 2 bytes, either case */
        {"\"\\u4f60\\uFFFF\"", "\xE4\xBD\xA0\xEF\xBF\xBF", 6},           /* 3 bytes */
        {"\"\\ud83d\\ude00!\"", "\xF0\x9F\x98\x80!", 5},                  /* a pair: 4 bytes */
        {"\"\\uDBFF\\uDFFF\"", "\xF4\x8F\xBF\xBF", 4},                    /* U+10FFFF */
        {"\"a\\u0000b\"", "a\0b", 3},                                       /* NUL kept, length exact */
        {"\"\xC4\xA0raw \x01 bytes\"", "\xC4\xA0raw \x01 bytes", 13},      /* raw bytes as they are */
        {"\"0123456789abcdef\\n0123456789abcdef\"", "0123456789abcdef\n0123456789abcdef", 33},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint8_t out[64];
        size_t len = 0;
        struct js s;
        int rc = scan_str(ok[i].json, out, &len, &s);
        CHECK(rc == 0 && len == ok[i].len && !memcmp(out, ok[i].want, len), "string %zu (%s): rc %d len %zu %s", i,
              ok[i].json, rc, len, s.err ? s.err : "");
    }
    struct { const char *json, *err; size_t off; } bad[] = {
        {"\"\\ud83d\"", "high surrogate", 1},          /* lone high surrogate */
        {"\"\\ud83dx\\ude00\"", "high surrogate", 1}, /* not followed by \u */
        {"\"\\ud83d\\u0041\"", "high surrogate", 1},  /* followed by a non-low \u */
        {"\"ab\\ude00\"", "low surrogate", 3},          /* lone low surrogate */
        {"\"\\u12G4\"", "\\u escape", 1},
        {"\"\\u12\"", "\\u escape", 1},                /* cut by the closing quote */
        {"\"\\x\"", "invalid escape", 1},
        {"\"abc", "unterminated", 0},
        {"\"abc\\", "unterminated", 0},                /* a backslash as the last byte */
        {"\"abc\\\"", "unterminated", 0},
        {"abc", "expected a string", 0},
        {"", "end of input", 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t out[64];
        size_t len;
        struct js s;
        int rc = scan_str(bad[i].json, out, &len, &s);
        CHECK(rc == -1 && s.err && strstr(s.err, bad[i].err) && s.err_off == bad[i].off, "bad string %zu (%s): %s at %zu",
              i, bad[i].json, s.err ? s.err : "(accepted)", s.err_off);
    }

    /* numbers read as cJSON does: plain integers, and the rest through strtod */
    struct { const char *json; double v; } num[] = {
        {"0", 0}, {"151643,", 151643}, {"-0", 0}, {"-12", -12}, {"2.5e3}", 2500}, {"1E-2]", 0.01},
        {"007", 7}, {"123456789012345678", 123456789012345678.0}, {"1.", 1}, {"-.5", -0.5},
    };
    for (size_t i = 0; i < sizeof num / sizeof num[0]; i++) {
        struct js s;
        js_init(&s, num[i].json, 0, strlen(num[i].json), 0);
        double v = -99;
        CHECK(js_number(&s, &v) == 0 && v == num[i].v, "number %s: %g %s", num[i].json, v, s.err ? s.err : "");
    }
    const char *nan_[] = {"-", "1e", "1e+", "1.2.3", "--1", "+1", ".5", "x",
                          "1234567890123456789012345678901234567890123456789012345678901234"};
    for (size_t i = 0; i < sizeof nan_ / sizeof nan_[0]; i++) {
        struct js s;
        js_init(&s, nan_[i], 0, strlen(nan_[i]), 0);
        double v;
        CHECK(js_number(&s, &v) == -1 && s.err, "not a number accepted: %s", nan_[i]);
    }

    /* js_skip: values, counts, and refusals */
    struct { const char *json; int ok; size_t count; } sk[] = {
        {" {\"a\": [1, 2, {\"b\": null}], \"c\": \"\\u00e9\", \"d\": true, \"e\": false}", 1, 4},
        {"[]", 1, 0}, {"{}", 1, 0}, {"[[], {}, \"\", 0]", 1, 4}, {"\x01\x1f [1]\r\n", 1, 1},
        {"[1,]", 0, 0}, {"[,1]", 0, 0}, {"{\"a\":1,}", 0, 0}, {"{\"a\" 1}", 0, 0}, {"{1:2}", 0, 0},
        {"[1 2]", 0, 0}, {"[tru]", 0, 0}, {"[nul", 0, 0}, {"{\"a\":", 0, 0}, {"[\"\\ud800\"]", 0, 0},
        {"", 0, 0}, {"]", 0, 0},
    };
    for (size_t i = 0; i < sizeof sk / sizeof sk[0]; i++) {
        struct js s;
        js_init(&s, sk[i].json, 0, strlen(sk[i].json), 0);
        size_t n = 99;
        int rc = js_skip(&s, &n);
        js_free(&s);
        CHECK((rc == 0) == sk[i].ok && (!sk[i].ok || n == sk[i].count), "skip %zu (%s): rc %d count %zu %s", i,
              sk[i].json, rc, n, s.err ? s.err : "");
    }
    /* nesting: 1000 containers deep is fine, 1001 is refused (cJSON's limit) */
    for (int depth = 1000; depth <= 1001; depth++) {
        char *b = kiln_malloc(2 * (size_t)depth);
        memset(b, '[', (size_t)depth);
        memset(b + depth, ']', (size_t)depth);
        struct js s;
        js_init(&s, b, 0, 2 * (size_t)depth, 0);
        int rc = js_skip(&s, NULL);
        CHECK(depth == 1000 ? rc == 0 : rc == -1 && strstr(s.err, "deep"), "depth %d: %s", depth, s.err ? s.err : "ok");
        free(b);
    }
    /* the range is a hard limit: a value cut by it is an error, not a read beyond */
    const char *cut = "[\"abc\", 12345]";
    for (size_t n = 0; n < strlen(cut); n++) {
        struct js s;
        js_init(&s, cut, 0, n, 0);
        CHECK(js_skip(&s, NULL) == -1 && s.err && s.err_off <= n, "cut at %zu accepted", n);
    }
}

/* a valid synthetic tokenizer.json with the given pieces */
static char *synth_with(const char *model_extra, const char *merges) {
    return synth_json("null", bytelevel_pre, merges, model_extra, "");
}

static void test_load_json_scan(void) {
    char err[256];
    struct kiln_tokenizer *t;
    int32_t w1[] = {97, 94, 97, 94, 98, 100, 18, -1}; /* "abc abc  a123", as in test_synthetic */

    /* every prefix of a tokenizer.json is invalid JSON (the root object is
     * not closed), and is refused with a message, never a crash; bytes after
     * the root object are ignored, as cJSON does */
    char *s = synth_with("", merges_pairs);
    size_t n = strlen(s);
    int refused = 0;
    for (size_t i = 0; i < n; i++) {
        t = tok_load_json(s, i, err, sizeof err);
        refused += !t && strstr(err, "not valid JSON") != NULL;
        tok_free(t);
    }
    CHECK(refused == (int)n, "%d of %zu prefixes refused as invalid JSON", refused, n);
    t = tok_load_json(s, n, err, sizeof err);
    CHECK(t != NULL, "%s", err);
    tok_free(t);
    char *tail = kiln_malloc(n + 16);
    memcpy(tail, s, n);
    memcpy(tail + n, " trailing ]]", 12);
    t = tok_load_json(tail, n + 12, err, sizeof err);
    CHECK(t != NULL, "trailing bytes: %s", err);
    tok_free(t);
    free(tail);

    /* a UTF-8 BOM is skipped, as cJSON does */
    char *bom = kiln_malloc(n + 4);
    memcpy(bom, "\xEF\xBB\xBF", 3);
    memcpy(bom + 3, s, n);
    t = tok_load_json(bom, n + 3, err, sizeof err);
    CHECK(t != NULL, "BOM: %s", err);
    if (t) check_encode(t, "abc abc  a123", 13, w1, "BOM");
    tok_free(t);
    free(bom);

    /* syntax errors anywhere, inside vocab or merges or after them, name the byte */
    struct { const char *from, *to; } breaks[] = {
        {"\"abc\":97", "\"abc\" 97"},             /* in the vocab */
        {"[\"ab\",\"c\"]", "[\"ab\",\"c\",]"},    /* in the merges */
        {"\"a\":64,", "\"a\":64x,"},
        {"\"Ġab\":99", "\"Ġab\":\"\\ud800\""},
        {"\"decoder\":{", "\"decoder\":{{"},
    };
    for (size_t i = 0; i < sizeof breaks / sizeof breaks[0]; i++) {
        const char *at = strstr(s, breaks[i].from);
        CHECK(at != NULL, "break %zu: '%s' not in the test file", i, breaks[i].from);
        if (!at) continue;
        size_t pre = (size_t)(at - s), fl = strlen(breaks[i].from), tl = strlen(breaks[i].to);
        char *b = kiln_malloc(n + tl + 1);
        memcpy(b, s, pre);
        memcpy(b + pre, breaks[i].to, tl);
        memcpy(b + pre + tl, at + fl, n - pre - fl + 1);
        t = tok_load_json(b, strlen(b), err, sizeof err);
        CHECK(!t && strstr(err, "not valid JSON (near byte "), "break %zu: %s", i, t ? "loaded" : err);
        tok_free(t);
        free(b);
    }
    free(s);

    /* tokens spelled with escapes load as the same tokens: "a" as \u0061,
     * "Ġ" (U+0120) as \u0120, in vocab keys and in both merge spellings */
    const char *esc_merges[] = {
        "[\"\\u0061 b\",\"ab c\",\"\\u0120 a\",\"\\u0120a b\",\"1 2\",\"b c\",\"\\u0120ab c\"]",
        "[[\"\\u0061\",\"b\"],[\"ab\",\"c\"],[\"\\u0120\",\"a\"],[\"\\u0120a\",\"b\"],[\"1\",\"2\"],[\"b\",\"c\"],"
        "[\"\\u0120ab\",\"\\u0063\"]]",
    };
    for (int v = 0; v < 2; v++) {
        s = synth_with("", esc_merges[v]);
        /* the vocab key "ab" as "\u0061\u0062" */
        char *k = strstr(s, "\"ab\":96");
        CHECK(k != NULL);
        if (k) {
            size_t off = (size_t)(k - s);
            char *b = kiln_malloc(strlen(s) + 32);
            memcpy(b, s, off);
            strcpy(b + off, "\"\\u0061\\u0062\":96");
            strcat(b, k + strlen("\"ab\":96"));
            free(s);
            s = b;
        }
        t = tok_load_json(s, strlen(s), err, sizeof err);
        CHECK(t != NULL, "escaped tokens (%s): %s", v ? "pairs" : "strings", err);
        if (t) {
            check_encode(t, "abc abc  a123", 13, w1, v ? "escaped pairs" : "escaped strings");
            CHECK(tok_token_id(t, "ab") == 96 && tok_token_id(t, "Ġab") == 99);
            tok_free(t);
        }
        free(s);
    }

    /* a surrogate pair in a vocab key: a token outside the byte-level
     * alphabet, kept as its UTF-8 (4 bytes) */
    {
        char *a = synth_with("", merges_str);
        char *at = strstr(a, "\"xyz\":102");
        CHECK(at != NULL);
        if (at) {
            size_t off = (size_t)(at - a);
            char *b = kiln_malloc(strlen(a) + 32);
            memcpy(b, a, off);
            strcpy(b + off, "\"\\ud83d\\ude00\":102");
            strcat(b, at + strlen("\"xyz\":102"));
            t = tok_load_json(b, strlen(b), err, sizeof err);
            CHECK(t != NULL, "surrogate key: %s", err);
            if (t) {
                size_t len;
                const uint8_t *bytes = tok_id_bytes(t, 102, &len);
                CHECK(bytes && len == 4 && !memcmp(bytes, "\xF0\x9F\x98\x80", 4));
                tok_free(t);
            }
            free(b);
        }
        free(a);
    }

    /* merges before the vocab, and duplicate keys (the first one counts, as
     * in cJSON): the same tokenizer */
    {
        char *a = synth_with("", merges_pairs);
        char *v = strstr(a, "\"vocab\":"), *m = strstr(a, ",\"merges\":");
        CHECK(v && m && v < m);
        if (v && m) {
            size_t vl = (size_t)(m - v), ml = strlen(m) - 2; /* ,"merges":[...] without the final }} */
            char *b = kiln_malloc(strlen(a) + 256);
            size_t off = (size_t)(v - a);
            memcpy(b, a, off);
            memcpy(b + off, m + 1, ml - 1); /* "merges":[...] */
            b[off + ml - 1] = ',';
            memcpy(b + off + ml, v, vl); /* "vocab":{...} */
            strcpy(b + off + ml + vl, ",\"vocab\":{\"a\":5},\"merges\":[\"q q\"]}");
            strcat(b, ",\"model\":{\"type\":\"WordPiece\"}}");
            t = tok_load_json(b, strlen(b), err, sizeof err);
            CHECK(t != NULL, "merges first, duplicate keys: %s", err);
            if (t) check_encode(t, "abc abc  a123", 13, w1, "merges before vocab");
            tok_free(t);
            free(b);
        }
        free(a);
    }

    /* content errors keep their messages, and come after syntax errors */
    struct { const char *extra, *merges, *vocab_from, *vocab_to, *want; } ce[] = {
        {"", merges_str, "\"abc\":97", "\"abc\":\"97\"", "model.vocab['abc']: id is not a non-negative integer"},
        {"", merges_str, "\"abc\":97", "\"abc\":-1", "model.vocab['abc']: id is not a non-negative integer"},
        {"", merges_str, "\"abc\":97", "\"abc\":2147483647", "model.vocab['abc']: id is not a non-negative integer"},
        {"", "[\"a b\",\"ab q\"]", NULL, NULL, "merge 1 ('ab' + 'q'): token not in vocab"},
        {"", "[\"a b\",\"abc\"]", NULL, NULL, "merge 1 ('abc') is not two tokens"},
        {"", "[\"a b\",\"a b c\"]", NULL, NULL, "merge 1 ('a b c') is not two tokens"},
        {"", "[[\"a\",\"b\"],[\"a\"]]", NULL, NULL, "merge 1 is neither"},
        {"", "[[\"a\",\"b\"],[\"a\",\"b\",\"c\"]]", NULL, NULL, "merge 1 is neither"},
        {"", "[[\"a\",\"b\"],[\"a\",2]]", NULL, NULL, "merge 1 is neither"},
        {"", "[[\"a\",\"b\"],7]", NULL, NULL, "merge 1 is neither"},
        {"", "{}", NULL, NULL, "model.merges missing or not an array"},
        /* model-level checks come before the vocab's content */
        {"\"byte_fallback\":true,", merges_str, "\"abc\":97", "\"abc\":\"x\"", "byte_fallback"},
        /* and a bad vocab before bad merges */
        {"", "[\"a q\"]", "\"abc\":97", "\"abc\":null", "model.vocab['abc']"},
    };
    for (size_t i = 0; i < sizeof ce / sizeof ce[0]; i++) {
        char *a = synth_with(ce[i].extra, ce[i].merges);
        if (ce[i].vocab_from) {
            char *at = strstr(a, ce[i].vocab_from);
            size_t off = (size_t)(at - a);
            char *b = kiln_malloc(strlen(a) + 64);
            memcpy(b, a, off);
            strcpy(b + off, ce[i].vocab_to);
            strcat(b, at + strlen(ce[i].vocab_from));
            free(a);
            a = b;
        }
        t = tok_load_json(a, strlen(a), err, sizeof err);
        CHECK(!t && strstr(err, ce[i].want), "content error %zu: %s", i, t ? "loaded" : err);
        tok_free(t);
        /* the same file with a syntax error at its very end: that one wins */
        size_t al = strlen(a);
        a[al - 1] = ']';
        t = tok_load_json(a, al, err, sizeof err);
        CHECK(!t && strstr(err, "not valid JSON"), "content error %zu then bad JSON: %s", i, t ? "loaded" : err);
        tok_free(t);
        free(a);
    }
}

void test_tokenizer(void) {
    test_json_scan();
    test_load_json_scan();
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
