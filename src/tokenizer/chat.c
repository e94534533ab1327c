/*
 * chat.c: renders a model's chat template for a list of OpenAI-style
 * messages, with the variables transformers' apply_chat_template passes:
 * messages, tools (None when absent), documents (None), add_generation_prompt,
 * the special tokens (bos_token, eos_token, pad_token when known) and any
 * extra keys of the request object (enable_thinking is set from the argument
 * unless it is -1).
 *
 * One normalization that transformers does not do: a message content that is
 * a list made only of {"type": "text", "text": ...} parts becomes the
 * concatenation of the texts. Templates that handle lists themselves (Qwen2-VL,
 * Qwen3-VL, Qwen3.5) concatenate text parts the same way, and string-only
 * templates (Qwen3, Llama 3) would otherwise fail, so OpenAI clients that send
 * parts still work. Lists with other part types are passed through untouched.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

static void flatten_content(cJSON *msg) {
    cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (!cJSON_IsArray(content) || !cJSON_GetArraySize(content)) return;
    size_t n = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) return;
        n += strlen(text->valuestring);
    }
    char *joined = kiln_malloc(n + 1), *p = joined;
    cJSON_ArrayForEach(part, content) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t k = strlen(t);
        memcpy(p, t, k);
        p += k;
    }
    *p = 0;
    cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", cJSON_CreateString(joined));
    free(joined);
}

static char *render(const char *template_text, const char *messages_json, int add_generation_prompt,
                    int enable_thinking, const char *bos, const char *eos, const char *pad, char *err,
                    size_t errlen) {
    if (!template_text) {
        kiln_errf(err, errlen, "the model has no chat template");
        return NULL;
    }
    cJSON *in = cJSON_Parse(messages_json ? messages_json : "");
    if (!in || (!cJSON_IsArray(in) && !cJSON_IsObject(in))) {
        cJSON_Delete(in);
        kiln_errf(err, errlen, "messages: not a JSON array or object");
        return NULL;
    }
    cJSON *vars = cJSON_CreateObject();
    if (cJSON_IsArray(in)) {
        cJSON_AddItemToObject(vars, "messages", in);
    } else {
        cJSON *msgs = cJSON_DetachItemFromObjectCaseSensitive(in, "messages");
        if (!cJSON_IsArray(msgs)) {
            cJSON_Delete(msgs);
            cJSON_Delete(in);
            cJSON_Delete(vars);
            kiln_errf(err, errlen, "messages: the object has no \"messages\" array");
            return NULL;
        }
        cJSON_AddItemToObject(vars, "messages", msgs);
        while (in->child) {
            cJSON *it = cJSON_DetachItemViaPointer(in, in->child);
            if (!strcmp(it->string, "add_generation_prompt") || !strcmp(it->string, "messages")) cJSON_Delete(it);
            else cJSON_AddItemToObject(vars, it->string, it);
        }
        cJSON_Delete(in);
    }
    cJSON *msg;
    cJSON_ArrayForEach(msg, cJSON_GetObjectItemCaseSensitive(vars, "messages")) {
        if (!cJSON_IsObject(msg)) {
            cJSON_Delete(vars);
            kiln_errf(err, errlen, "messages: every message must be an object");
            return NULL;
        }
        flatten_content(msg);
    }
    if (!cJSON_GetObjectItemCaseSensitive(vars, "tools")) cJSON_AddNullToObject(vars, "tools");
    if (!cJSON_GetObjectItemCaseSensitive(vars, "documents")) cJSON_AddNullToObject(vars, "documents");
    cJSON_AddBoolToObject(vars, "add_generation_prompt", add_generation_prompt);
    if (enable_thinking >= 0) {
        cJSON_DeleteItemFromObjectCaseSensitive(vars, "enable_thinking");
        cJSON_AddBoolToObject(vars, "enable_thinking", enable_thinking);
    }
    if (bos) cJSON_AddStringToObject(vars, "bos_token", bos);
    if (eos) cJSON_AddStringToObject(vars, "eos_token", eos);
    if (pad) cJSON_AddStringToObject(vars, "pad_token", pad);

    char *out = NULL;
    struct jinja_template *t = jinja_parse(template_text, strlen(template_text), err, errlen);
    if (t) out = jinja_render(t, vars, err, errlen);
    jinja_free(t);
    cJSON_Delete(vars);
    return out;
}

char *tok_render_template(const char *template_text, const char *messages_json, int add_generation_prompt,
                          int enable_thinking, const char *bos_token, const char *eos_token, char *err,
                          size_t errlen) {
    return render(template_text, messages_json, add_generation_prompt, enable_thinking, bos_token, eos_token,
                  NULL, err, errlen);
}

char *tok_apply_chat_template(const struct kiln_tokenizer *t, const char *messages_json, int add_generation_prompt,
                              int enable_thinking, char *err, size_t errlen) {
    return render(tok_chat_template(t), messages_json, add_generation_prompt, enable_thinking, tok_bos_token(t),
                  tok_eos_token(t), tok_pad_token(t), err, errlen);
}
