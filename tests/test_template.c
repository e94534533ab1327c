/*
 * test_template.c: the `template` group.
 *
 * - every case of tests/fixtures/qwen3-dense-tiny/chat_template_vectors.json
 *   (the real Qwen3 template rendered by transformers) through
 *   tok_apply_chat_template, byte for byte;
 * - tests/fixtures/templates/cases.json: Qwen2.5, Llama 3.1 and Qwen3
 *   templates with tools and tool calls, and features.jinja (the Jinja subset:
 *   macros, call blocks, loop variables, filters, tests, slicing, whitespace
 *   control), all rendered by Python jinja2 with transformers' settings
 *   (tests/fixtures/templates/gen.py);
 * - errors: syntax errors and unsupported tags name the construct and line,
 *   raise_exception carries its message, bad messages JSON is refused.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

static const char *qwen3_model_dir(void) { return FIXTURES "/qwen3-dense-tiny"; }

static void check_text(const char *got, const char *want, const char *err, const char *what) {
    if (!got) {
        CHECK(got != NULL, "%s: %s", what, err);
        return;
    }
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    CHECK(!strcmp(got, want), "%s: differs at byte %zu: got '%.60s' want '%.60s'", what, i, got + i, want + i);
}

static void test_qwen3_vectors(void) {
    const char *dir = qwen3_model_dir();
    char err[512];
    struct kiln_tokenizer *t = tok_load(dir, err, sizeof err);
    CHECK(t != NULL, "%s", err);
    if (!t) return;
    char *text = kiln_read_file(FIXTURES "/qwen3-dense-tiny/chat_template_vectors.json", NULL, err, sizeof err);
    CHECK(text != NULL, "%s", err);
    cJSON *root = cJSON_Parse(text ? text : "");
    free(text);
    CHECK(cJSON_GetArraySize(root) == 12);
    int k = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, root) {
        char *msgs = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "messages"));
        int gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        int think = cJSON_IsTrue(cJSON_GetObjectItem(c, "enable_thinking"));
        char *out = tok_apply_chat_template(t, msgs, gen, think, err, sizeof err);
        char what[64];
        snprintf(what, sizeof what, "qwen3 vector %d", k++);
        check_text(out, cJSON_GetObjectItem(c, "text")->valuestring, err, what);
        free(out);
        free(msgs);
    }
    cJSON_Delete(root);

    /* enable_thinking left undefined renders like enable_thinking=true here */
    const char *hi = "[{\"role\": \"user\", \"content\": \"Hi\"}]";
    char *out = tok_apply_chat_template(t, hi, 1, -1, err, sizeof err);
    check_text(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", err, "thinking undefined");
    free(out);
    /* text parts are joined; the object form carries messages */
    const char *parts = "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi\"},"
                        " {\"type\": \"text\", \"text\": \" there\"}]}]}";
    out = tok_apply_chat_template(t, parts, 0, 0, err, sizeof err);
    check_text(out, "<|im_start|>user\nHi there<|im_end|>\n", err, "content parts");
    free(out);
    CHECK(tok_apply_chat_template(t, "{\"nope\": 1}", 0, 0, err, sizeof err) == NULL && strstr(err, "messages"));
    CHECK(tok_apply_chat_template(t, "[1, 2", 0, 0, err, sizeof err) == NULL);
    tok_free(t);
}

static void test_fixture_cases(void) {
    char err[512];
    char *text = kiln_read_file(FIXTURES "/templates/cases.json", NULL, err, sizeof err);
    CHECK(text != NULL, "%s", err);
    if (!text) return;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases"), *c;
    CHECK(cJSON_GetArraySize(cases) >= 10);
    int k = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItem(c, "template")->valuestring;
        char path[256];
        snprintf(path, sizeof path, FIXTURES "/templates/%s", name);
        char *tpl = kiln_read_file(path, NULL, err, sizeof err);
        CHECK(tpl != NULL, "%s", err);
        if (!tpl) continue;
        char *input = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "input"));
        const cJSON *bos = cJSON_GetObjectItem(c, "bos_token"), *eos = cJSON_GetObjectItem(c, "eos_token");
        char *out = tok_render_template(tpl, input, cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
                                        cJSON_GetObjectItem(c, "enable_thinking")->valueint,
                                        cJSON_IsString(bos) ? bos->valuestring : NULL,
                                        cJSON_IsString(eos) ? eos->valuestring : NULL, err, sizeof err);
        char what[96];
        snprintf(what, sizeof what, "case %d (%s)", k++, name);
        check_text(out, cJSON_GetObjectItem(c, "text")->valuestring, err, what);
        free(out);
        free(input);
        free(tpl);
    }
    cJSON_Delete(root);
}

/* renders tpl with messages [] and checks that it fails with every needle in err */
static void check_error(const char *tpl, const char *needle1, const char *needle2) {
    char err[512] = "";
    char *out = tok_render_template(tpl, "[]", 0, -1, NULL, NULL, err, sizeof err);
    CHECK(out == NULL, "template should fail: %.60s", tpl);
    free(out);
    CHECK(strstr(err, needle1) != NULL, "error '%s' lacks '%s'", err, needle1);
    if (needle2) CHECK(strstr(err, needle2) != NULL, "error '%s' lacks '%s'", err, needle2);
}

static void check_render(const char *tpl, const char *msgs, const char *want) {
    char err[512] = "";
    char *out = tok_render_template(tpl, msgs, 0, -1, "<s>", "</s>", err, sizeof err);
    check_text(out, want, err, tpl);
    free(out);
}

static void test_errors_and_small(void) {
    check_error("line one\n{% if x %}\n{{ y }\n{% endif %}", "line 3", NULL);
    check_error("a\nb\n{% include 'other.jinja' %}", "unsupported tag 'include'", "line 3");
    check_error("{% for x in y %}\n{{ x }}\n", "endfor", "line 1");
    check_error("{{ 'a' | frobnicate }}", "unsupported filter 'frobnicate'", "line 1");
    check_error("\n{{ raise_exception('bad role') }}", "raise_exception: bad role", "line 2");
    check_error("{{ x is frobbed }}", "unsupported test 'frobbed'", NULL);
    check_error("{% endif %}", "unexpected 'endif'", NULL);
    check_error("{{ 'a' + 1 }}", "unsupported operand", NULL);
    check_error("{{ undefined_thing + 1 }}", "'undefined_thing' is undefined", NULL);
    check_error("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "recursion", NULL);
    check_error("{{ 'unterminated }}", "unterminated string", NULL);
    check_error("{# no end", "comment", NULL);
    check_error("{{ 'ab' * 99999999999999 }}", "repetition too large", NULL);

    /* an empty string or list repeated any number of times is empty, at once
     * (the fuzzer's hang: "" * 7808781390095246 looped over the count) */
    check_render("{{ '' * 7808781390095246 }}|{{ ([] * 7808781390095246)|length }}|{{ 'ab' * 3 }}|{{ 'x' * -2 }}", "[]", "|0|ababab|");

    /* whitespace rules: trim_blocks, lstrip_blocks, - and + markers, one trailing newline dropped */
    check_render("{% if true %}\nA\n{% endif %}\n", "[]", "A\n");
    check_render("  {% if true %}x{% endif %}  \n", "[]", "x  ");
    check_render("a  {{- ' b ' -}}  c", "[]", "a b c");
    check_render("  {%+ if true %}x{% endif %}", "[]", "  x");
    check_render("{{ bos_token }}{{ eos_token }}{{ messages|length }}", "[{\"role\": \"user\", \"content\": \"x\"}]",
                 "<s></s>1");
    check_render("{{ {'a': {'b': 1}} }}", "[]", "{'a': {'b': 1}}");
    check_render("{{ tools }}|{{ tools is none }}|{{ documents is defined }}", "[]", "None|True|True");
}

void test_template(void) {
    test_errors_and_small();
    test_fixture_cases();
    test_qwen3_vectors();
}
