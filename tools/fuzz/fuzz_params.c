/*
 * fuzz_params.c: libFuzzer target for the body of a generation request, the
 * way kiln serve reads it (src/server/openai.c handle_generate): a
 * completion body first goes through the token-id scanner
 * (params_scan_prompt_ids), then cJSON, then params_parse or
 * params_parse_ids; a chat body straight to cJSON and params_parse, whose
 * messages go through the chat template of tests/fixtures/qwen3-dense-tiny.
 * The first input byte picks chat (odd) or completion (even); the rest is
 * the body. An accepted request must be one the scheduler can take: every
 * prompt id inside the vocabulary, counts within their limits.
 *
 *   make fuzz   (scripts/fuzz.sh builds every target and runs it from build-fuzz/)
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "server/params.h"
#include "tokenizer/tokenizer.h"

static struct params_ctx pc;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dirs[] = {getenv("KILN_FUZZ_MODEL"), "tests/fixtures/qwen3-dense-tiny", "../tests/fixtures/qwen3-dense-tiny"};
    char err[512] = "no model directory";
    struct kiln_tokenizer *tok = NULL;
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0] && !tok; i++)
        if (dirs[i]) tok = tok_load(dirs[i], err, sizeof err);
    if (!tok) {
        fprintf(stderr, "fuzz_params: %s (set KILN_FUZZ_MODEL)\n", err);
        abort();
    }
    pc = (struct params_ctx){tok, "m", tok_vocab_size(tok), 4096, 1};
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    const int chat = data[0] & 1;
    const size_t len = size - 1;
    char *body = kiln_malloc(len + 1);
    memcpy(body, data + 1, len);
    body[len] = 0;
    int32_t *ids = NULL;
    int n_ids = 0;
    const int scanned = !chat && params_scan_prompt_ids(body, len, &ids, &n_ids);
    cJSON *req = cJSON_ParseWithLength(body, len);
    free(body);
    if (!req) {
        free(ids);
        return 0;
    }
    struct gen_params p;
    struct param_error e;
    memset(&p, 0, sizeof p);
    const int rc = scanned ? params_parse_ids(&pc, req, ids, n_ids, &p, &e) : params_parse(&pc, req, chat, &p, &e);
    cJSON_Delete(req);
    if (rc == 0) {
        assert(p.n >= 1 && p.n <= PARAMS_MAX_N);
        assert(p.n_prompts >= 1 && (long)p.n_prompts * p.n <= PARAMS_MAX_CHOICES);
        assert(p.n_stops >= 0 && p.n_stops <= PARAMS_MAX_STOPS);
        assert(p.max_tokens >= -1);
        for (int i = 0; i < p.n_prompts; i++)
            for (int j = 0; j < p.prompts[i].n; j++) assert(p.prompts[i].ids[j] >= 0 && p.prompts[i].ids[j] < pc.vocab);
        for (int i = 0; i < p.n_stop_ids; i++) assert(p.stop_ids[i] >= 0 && p.stop_ids[i] < pc.vocab);
    } else {
        assert(e.msg[0]); /* a refusal always says why */
    }
    params_free(&p);
    return 0;
}
