/*
 * test_json.c: the JSON validator of response_format json_object and the
 * per-step vocabulary mask built on it (engine/json_mask.h).
 *
 * The validator is checked on documents that must pass (and so must every
 * prefix of them) and on texts that must fail at a known byte. The mask is
 * checked against the definition it optimizes: token t is allowed iff
 * feeding t's bytes to a copy of the state succeeds (EOS iff the object is
 * done). Random walks through a small hand-made vocabulary and through
 * Qwen3's real 151k-token vocabulary compare the two at every step.
 * Last, the server's fast path for token-id prompts (params_scan_prompt_ids)
 * against what cJSON makes of the same bodies.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/json_mask.h"
#include "server/params.h"

#include <cjson/cJSON.h>
#include "test.h"
#include "tokenizer/tokenizer.h"

/* ==== the validator ==== */

/* -1 if the whole text is a valid prefix, else the offset of the first bad byte */
static int first_bad(const char *s, size_t n, int *done) {
    struct json_fsm f;
    json_fsm_init(&f);
    for (size_t i = 0; i < n; i++)
        if (json_fsm_feed(&f, (uint8_t)s[i])) return (int)i;
    *done = json_fsm_done(&f);
    return -1;
}

static void check_valid(const char *doc) {
    size_t n = strlen(doc);
    int done = 0, bad = first_bad(doc, n, &done);
    CHECK(bad < 0 && done, "'%s' should be a complete JSON object (bad at %d, done %d)", doc, bad, done);
    /* every proper prefix is valid and not done */
    int prefixes_ok = 1;
    for (size_t k = 0; k < n; k++) {
        int d = 0;
        prefixes_ok &= first_bad(doc, k, &d) < 0 && !d;
    }
    CHECK(prefixes_ok, "every prefix of '%s' is valid and unfinished", doc);
}

/* the text is valid up to byte at, which is rejected */
static void check_bad_at(const char *text, int at) {
    int done = 0, bad = first_bad(text, strlen(text), &done);
    CHECK(bad == at, "'%s': expected the byte at %d to be rejected, got %d", text, at, bad);
}

static void test_validator(void) {
    const char *valid[] = {
        "{}",
        "{\"a\":1}",
        "{ \"a\" : [ 1 , -2.5e+3 , 0 , -0.0 , 1E-2 , 10 ] , \"b\" : { } }",
        "{\"t\":true,\"f\":false,\"n\":null,\"e\":[],\"o\":{\"x\":[[],[{}]]}}",
        "{\"esc\":\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9\\uD83D\\uDE00\"}",
        "{\"utf8\":\"日本語 é 😀 \xc2\x80 \xef\xbf\xbf \xf4\x8f\xbf\xbf\"}",
        "{\n\t\"pretty\": [\n\t\t1,\n\t\t2\n\t]\n}",
        "{\"\":\"\"}",
    };
    for (size_t i = 0; i < sizeof valid / sizeof *valid; i++) check_valid(valid[i]);

    check_bad_at("[1]", 0);          /* the top level must be an object */
    check_bad_at("\"x\"", 0);
    check_bad_at(" {}", 0);          /* nothing before the '{' */
    check_bad_at("{,}", 1);
    check_bad_at("{\"a\"}", 4);      /* a key needs a value */
    check_bad_at("{\"a\":}", 5);
    check_bad_at("{\"a\":1,}", 7);   /* no trailing commas */
    check_bad_at("{\"a\":[1,]}", 8);
    check_bad_at("{1:2}", 1);        /* keys are strings */
    check_bad_at("{\"a\":01}", 6);   /* no leading zeros */
    check_bad_at("{\"a\":1.}", 7);
    check_bad_at("{\"a\":.5}", 5);
    check_bad_at("{\"a\":-}", 6);
    check_bad_at("{\"a\":1e}", 7);
    check_bad_at("{\"a\":1e+}", 8);
    check_bad_at("{\"a\":+1}", 5);
    check_bad_at("{\"a\":tru}", 8);
    check_bad_at("{\"a\":nul1}", 8);
    check_bad_at("{\"a\":True}", 5);
    check_bad_at("{\"a\":\"x\ny\"}", 7);   /* raw control characters */
    check_bad_at("{\"a\":\"\\x\"}", 7);    /* unknown escape */
    check_bad_at("{\"a\":\"\\u12g4\"}", 10);
    check_bad_at("{\"a\":\"\xc0\x80\"}", 6);     /* overlong */
    check_bad_at("{\"a\":\"\xed\xa0\x80\"}", 7); /* UTF-16 surrogate */
    check_bad_at("{\"a\":\"\xf4\x90\x80\x80\"}", 7); /* past U+10FFFF */
    check_bad_at("{\"a\":\"\xf5\"}", 6);
    check_bad_at("{\"a\":\"\x80\"}", 6);         /* lone continuation */
    check_bad_at("{\"a\":\"\xe6\x97x\"}", 8);    /* cut character */
    check_bad_at("{\"a\":1]", 6);                /* mismatched bracket */
    check_bad_at("{\"a\":[1}", 7);
    check_bad_at("{}}", 2);                      /* nothing after the close */
    check_bad_at("{} ", 2);
    check_bad_at("{\"a\":1}x", 7);
    check_bad_at("{\"a\" 1}", 5);
    check_bad_at("{\"a\":\"\xe9\"}", 7);         /* Latin-1, not UTF-8 */

    /* nesting: JSON_MAX_DEPTH levels pass, one more fails */
    char deep[2 * JSON_MAX_DEPTH + 16];
    int n = 0;
    deep[n++] = '{', deep[n++] = '"', deep[n++] = 'a', deep[n++] = '"', deep[n++] = ':';
    for (int i = 1; i < JSON_MAX_DEPTH; i++) deep[n++] = '[';
    deep[n] = 0;
    int done = 0;
    CHECK(first_bad(deep, (size_t)n, &done) < 0);
    deep[n] = '[';
    CHECK(first_bad(deep, (size_t)n + 1, &done) == n, "depth %d is refused", JSON_MAX_DEPTH + 1);

    /* whitespace runs are capped between tokens (not inside strings) */
    char ws[64 + JSON_MAX_WS];
    n = 0;
    ws[n++] = '{';
    for (int i = 0; i < JSON_MAX_WS; i++) ws[n++] = i % 2 ? ' ' : '\n';
    ws[n++] = '}';
    CHECK(first_bad(ws, (size_t)n, &done) < 0 && done, "%d whitespace bytes in a row are fine", JSON_MAX_WS);
    ws[n - 1] = ' ';
    CHECK(first_bad(ws, (size_t)n, &done) == n - 1, "the next one is not");
    char ss[16 + 2 * JSON_MAX_WS] = "{\"a\":\"";
    n = (int)strlen(ss);
    for (int i = 0; i < 2 * JSON_MAX_WS; i++) ss[n++] = ' ';
    CHECK(first_bad(ss, (size_t)n, &done) < 0, "spaces inside a string are text");
}

/* ==== the mask against its definition ==== */

/* A small byte-level vocabulary: the 256 single bytes, then fragments */
struct tiny_vocab {
    uint8_t single[256];
    const char **frag; /* NULL: a token without bytes (a special token) */
    int n_frag;
};

static const uint8_t *tiny_bytes(void *ctx, int32_t id, size_t *len) {
    const struct tiny_vocab *v = ctx;
    if (id < 256) {
        *len = 1;
        return &v->single[id];
    }
    if (id - 256 >= v->n_frag || !v->frag[id - 256]) return NULL;
    *len = strlen(v->frag[id - 256]);
    return (const uint8_t *)v->frag[id - 256];
}

/* Compares json_vocab_mask with feeding every token to a copy of f.
 * Returns the number of allowed ids (-1 on a mismatch, reported). */
static int mask_matches(const struct json_vocab *jv, const struct json_fsm *f, int V, json_token_bytes get, void *ctx,
                        const int32_t *eos, int n_eos, float *l, const char *what) {
    for (int i = 0; i < V; i++) l[i] = 0;
    json_vocab_mask(jv, f, l);
    int allowed = 0, bad = -1;
    for (int id = 0; id < V; id++) {
        int is_eos = 0, want;
        for (int k = 0; k < n_eos; k++) is_eos |= eos[k] == id;
        if (is_eos) {
            want = json_fsm_done(f);
        } else {
            size_t n = 0;
            const uint8_t *b = get(ctx, id, &n);
            struct json_fsm g = *f;
            want = b && n > 0 && json_fsm_feed_bytes(&g, b, n) == 0;
        }
        int got = l[id] == 0;
        if (got != want && bad < 0) bad = id;
        if (!(got ? l[id] == 0 : l[id] == -INFINITY) && bad < 0) bad = id;
        allowed += got;
    }
    CHECK(bad < 0, "%s: the mask disagrees with feeding the bytes at id %d", what, bad);
    return bad < 0 ? allowed : -1;
}

static void test_mask_tiny(void) {
    static const char *frags[] = {
        "{\"", "\"}", "\":", ",\"", "\":\"", "\"]", "}}", "]}", "},", "{}", "[]", "  ", "\n\n", " \"", "\t{", "abc",
        "key", " value", "x\"", "\"x", "12", "-1", ".5", "E+", "e-3", "true", "tr", "ue", "false", "fal", "null", "nu", "\\n",
        "\\u", "00e9", "\\\"", "\x97\xa5", "\xe6\x97\xa5", "日本", "\xf0\x9f", "\x98\x80", "\"\n", NULL, "\"}}", "1,", "1}",
        "true}", "\"a\":1}", "}\n", "{\"\"", "\"\"", NULL, "", "<|x|>",
    };
    struct tiny_vocab tv = {.frag = frags, .n_frag = (int)(sizeof frags / sizeof *frags)};
    for (int b = 0; b < 256; b++) tv.single[b] = (uint8_t)b;
    const int V = 256 + tv.n_frag + 2; /* two ids past the table: never allowed */
    int32_t eos[] = {256 + tv.n_frag - 1}; /* "<|x|>" as EOS */
    struct json_vocab *jv = json_vocab_new(V, tiny_bytes, &tv, eos, 1);
    float *l = kiln_malloc(sizeof(float) * (size_t)V);
    struct kiln_rng rng;
    kiln_rng_seed(&rng, 42);
    int walks_done = 0, steps = 0, mismatches = 0;
    for (int walk = 0; walk < 300; walk++) {
        struct json_fsm f;
        json_fsm_init(&f);
        for (int step = 0; step < 40; step++, steps++) {
            int allowed = mask_matches(jv, &f, V, tiny_bytes, &tv, eos, 1, l, "tiny vocabulary");
            if (allowed < 0) {
                mismatches++;
                break;
            }
            CHECK(allowed > 0, "some token is always allowed");
            if (json_fsm_done(&f)) {
                CHECK(allowed == 1 && l[eos[0]] == 0, "done: only EOS");
                walks_done++;
                break;
            }
            /* a random allowed token, never EOS here */
            int pick = (int)(kiln_rng_uniform(&rng) * allowed), id = 0;
            for (; id < V; id++)
                if (l[id] == 0 && pick-- == 0) break;
            CHECK(json_vocab_accept(jv, &f, id) == 0, "an allowed token is accepted");
        }
        if (mismatches > 3) break;
    }
    CHECK(walks_done > 20, "some walks closed the object (%d of 300, %d steps)", walks_done, steps);
    /* accept refuses what the mask refuses */
    struct json_fsm f;
    json_fsm_init(&f);
    CHECK(json_vocab_accept(jv, &f, '}') < 0, "'}' cannot start");
    json_fsm_init(&f);
    CHECK(json_vocab_accept(jv, &f, eos[0]) < 0, "EOS before the object");
    json_fsm_init(&f);
    CHECK(json_vocab_accept(jv, &f, 256 + 9) == 0 && json_fsm_done(&f) && json_vocab_accept(jv, &f, eos[0]) == 0, "'{}' then EOS");
    free(l);
    json_vocab_free(jv);
}

/* ==== Qwen3's vocabulary ==== */

static const uint8_t *qwen_bytes(void *ctx, int32_t id, size_t *len) {
    const struct kiln_tokenizer *t = ctx;
    if (id >= tok_vocab_size(t) || tok_is_special(t, id)) return NULL;
    return tok_id_bytes(t, id, len);
}

static void test_mask_qwen(void) {
    char err[512] = "";
    struct kiln_tokenizer *t = tok_load(FIXTURES "/qwen3-dense-tiny", err, sizeof err);
    if (!t) {
        CHECK(0, "%s", err);
        return;
    }
    const int V = 151936; /* the model's rows: 267 more than the tokenizer's ids */
    int32_t eos[] = {151645, 151643};
    struct json_vocab *jv = json_vocab_new(V, qwen_bytes, t, eos, 2);
    float *l = kiln_malloc(sizeof(float) * (size_t)V);
    struct kiln_rng rng;
    kiln_rng_seed(&rng, 7);
    struct json_fsm f;
    json_fsm_init(&f);
    int allowed = mask_matches(jv, &f, V, qwen_bytes, t, eos, 2, l, "qwen3: start");
    CHECK(allowed > 0 && l[90] == 0 && l[4913] == 0 && l[220] == -INFINITY, "start: '{' and '{\"' allowed, ' ' not (%d allowed)", allowed);
    CHECK(l[151645] == -INFINITY && l[151657] == -INFINITY && l[V - 1] == -INFINITY, "EOS, <tool_call>, padding ids masked");
    /* walks that prefer short tokens, so that strings close and structure
     * changes often; each step compared over the whole vocabulary */
    int steps = 0, closed = 0;
    for (int walk = 0; walk < 3 && steps < 90; walk++) {
        json_fsm_init(&f);
        for (int step = 0; step < 40; step++, steps++) {
            allowed = mask_matches(jv, &f, V, qwen_bytes, t, eos, 2, l, "qwen3 walk");
            if (allowed <= 0) break;
            if (json_fsm_done(&f)) {
                closed++;
                break;
            }
            int id;
            do {
                id = (int)(kiln_rng_uniform(&rng) * V);
                size_t n = 0;
                if (l[id] != 0) continue;
                if (qwen_bytes(t, id, &n) && n <= 2) break;
                if (kiln_rng_uniform(&rng) < 0.02) break;
            } while (1);
            CHECK(json_vocab_accept(jv, &f, id) == 0);
        }
    }
    CHECK(steps >= 40, "%d steps compared", steps);
    free(l);
    json_vocab_free(jv);
    tok_free(t);
}

/* ==== the server's token-id prompt scan ==== */

/* scan a copy of body: the ids it must find (n = 0: must decline and leave
 * the body alone); a taken body must parse with cJSON to the same members
 * and an empty "prompt" */
static void check_scan(const char *body, const int32_t *want, int n) {
    size_t len = strlen(body);
    char *b = kiln_malloc(len + 1);
    memcpy(b, body, len + 1);
    int32_t *ids = NULL;
    int got_n = 0, took = params_scan_prompt_ids(b, len, &ids, &got_n);
    if (!n) {
        CHECK(!took && !strcmp(b, body), "declined and untouched: %s (took %d)", body, took);
    } else {
        int same = took && got_n == n;
        for (int i = 0; same && i < n; i++) same = ids[i] == want[i];
        CHECK(same, "ids of %s (took %d, %d ids)", body, took, got_n);
        cJSON *a = cJSON_Parse(body), *c = cJSON_Parse(b);
        CHECK(a && c && strlen(b) == len, "the blanked body parses: %s -> %s", body, b);
        if (a && c) {
            const cJSON *pc = cJSON_GetObjectItemCaseSensitive(c, "prompt");
            CHECK(cJSON_IsArray(pc) && cJSON_GetArraySize(pc) == 0, "prompt blanked: %s", b);
            cJSON_DeleteItemFromObjectCaseSensitive(a, "prompt");
            cJSON_DeleteItemFromObjectCaseSensitive(c, "prompt");
            CHECK(cJSON_Compare(a, c, 1), "the other members unchanged: %s -> %s", body, b);
        }
        cJSON_Delete(a), cJSON_Delete(c);
    }
    free(ids);
    free(b);
}

static void test_prompt_scan(void) {
    static const int32_t a[] = {1, 2, 30000}, b[] = {5, 6, 7}, z[] = {0, 151935, 2147483647};
    check_scan("{\"model\": \"m\", \"prompt\": [1,2,30000], \"max_tokens\": 4}", a, 3);
    /* brackets, quotes and the key itself inside other strings; odd spacing */
    check_scan("{\"stop\": [\"\\\"prompt\\\": [9]\", \"]\"], \"x\": {\"prompt\": [8]},\n \"prompt\" :\t[ 5 ,6, 7 ] }", b, 3);
    check_scan("{\"pr\\u006fmpt\": [1,2,30000]}", a, 3); /* the key as cJSON reads it */
    check_scan("{\"prompt\":[0,151935,2147483647],\"stream\":true,\"stream_options\":{\"include_usage\":true}}", z, 3);
    /* anything else is cJSON's to judge */
    const char *no[] = {
        "{\"prompt\": \"text\"}",           "{\"prompt\": [[1, 2]]}",      "{\"prompt\": [1, -2]}",
        "{\"prompt\": [1, 2.5]}",          "{\"prompt\": [1, 2e3]}",     "{\"prompt\": [1, 2E3]}",
        "{\"prompt\": []}",                "{\"prompt\": [1], \"prompt\": [2]}", "{\"x\": {\"prompt\": [1]}}",
        "{\"prompt\": [1, 2}",             "{\"prompt\": [1]} x",        "[1, 2]",
        "{\"prompt\": [2147483648]}",      "{\"prompt\": [1, \"2\"]}",   "{\"prompt\": [1,]}",
        "",                                  "{\"prompt\": [1, null]}",
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) check_scan(no[i], NULL, 0);
}

void test_json(void) {
    test_prompt_scan();
    test_validator();
    test_mask_tiny();
    test_mask_qwen();
}
