/*
 * params.c: request bodies into struct gen_params (see params.h).
 *
 * The prompt is tokenized here, on the HTTP thread, so that a prompt that
 * cannot fit is refused before anything is queued. Chat messages are
 * copied before the template sees them, with the two normalizations vLLM
 * makes for tool use: tool-call arguments sent as JSON strings become
 * objects (Qwen's template prints them with tojson) and an assistant or
 * tool message without content gets "" (templates test it as a string).
 */
#include "server/params.h"
#include "tokenizer/json_scan.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tokenizer/tokenizer.h"

static int perr(struct param_error *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(struct param_error *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->param = param;
    return -1;
}

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static int absent(const cJSON *x) { return !x || cJSON_IsNull(x); }

/* ==== scalars ==== */

/* Reads an optional number: 0 absent or null, 1 set, -1 error. */
static int opt_num(const cJSON *o, const char *k, double lo, double hi, double *v, struct param_error *e) {
    const cJSON *x = get(o, k);
    if (absent(x)) return 0;
    if (!cJSON_IsNumber(x) || isnan(x->valuedouble)) return perr(e, k, "'%s' must be a number", k);
    if (x->valuedouble < lo || x->valuedouble > hi) return perr(e, k, "'%s' must be between %g and %g, got %g", k, lo, hi, x->valuedouble);
    *v = x->valuedouble;
    return 1;
}

static int opt_int(const cJSON *o, const char *k, double lo, double hi, long long *v, struct param_error *e) {
    double d;
    int r = opt_num(o, k, lo, hi, &d, e);
    if (r <= 0) return r;
    if (d != floor(d)) return perr(e, k, "'%s' must be an integer, got %g", k, d);
    *v = (long long)d;
    return 1;
}

static int opt_bool(const cJSON *o, const char *k, int *v, struct param_error *e) {
    const cJSON *x = get(o, k);
    if (absent(x)) return 0;
    if (!cJSON_IsBool(x)) return perr(e, k, "'%s' must be a boolean", k);
    *v = cJSON_IsTrue(x);
    return 1;
}

static int check_model(const struct params_ctx *c, const cJSON *req, struct param_error *e) {
    const cJSON *m = get(req, "model");
    if (absent(m)) return 0;
    if (!cJSON_IsString(m)) return perr(e, "model", "'model' must be a string");
    if (strcmp(m->valuestring, c->model_name))
        return perr(e, "model", "The model '%s' does not exist; this server serves '%s'", m->valuestring, c->model_name);
    return 0;
}

/* ==== prompts ==== */

int params_ids(const struct params_ctx *c, const cJSON *a, const char *param, int32_t **ids, int *n, struct param_error *e) {
    int cnt = cJSON_GetArraySize(a);
    *ids = kiln_malloc(sizeof(int32_t) * (size_t)(cnt ? cnt : 1));
    *n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 || x->valuedouble >= c->vocab) {
            free(*ids);
            *ids = NULL;
            *n = 0;
            return perr(e, param, "'%s' must hold token ids in [0, %d)", param, c->vocab);
        }
        (*ids)[(*n)++] = (int32_t)x->valuedouble;
    }
    return 0;
}

static int encode_text(const struct params_ctx *c, const char *text, struct prompt *out, struct param_error *e) {
    char err[512] = "";
    if (!c->tok) return perr(e, "prompt", "this model has no tokenizer: send token ids");
    int32_t *raw = NULL;
    int nr = 0;
    if (tok_encode(c->tok, text, strlen(text), &raw, &nr, err, sizeof err)) return perr(e, "prompt", "cannot tokenize the prompt: %s", err);
    int bos = tok_add_bos_token(c->tok) && tok_bos_token(c->tok) ? tok_token_id(c->tok, tok_bos_token(c->tok)) : -1;
    out->ids = kiln_malloc(sizeof(int32_t) * (size_t)(nr + 1));
    out->n = 0;
    if (bos >= 0) out->ids[out->n++] = bos;
    if (nr) memcpy(out->ids + out->n, raw, sizeof(int32_t) * (size_t)nr);
    out->n += nr;
    free(raw);
    return 0;
}

static struct prompt *add_prompt(struct gen_params *p, int cap) {
    if (!p->prompts) p->prompts = kiln_calloc((size_t)cap, sizeof *p->prompts);
    return &p->prompts[p->n_prompts++];
}

/* A copy of the messages as the template wants them (see the top of the
 * file); NULL with e when a message is malformed. */
static cJSON *template_messages(const cJSON *msgs, struct param_error *e) {
    cJSON *out = cJSON_Duplicate(msgs, 1), *m;
    int i = 0;
    cJSON_ArrayForEach(m, out) {
        const cJSON *role = get(m, "role"), *content = get(m, "content");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            perr(e, "messages", "each message must be an object with a string 'role'");
            goto fail;
        }
        if (content && !cJSON_IsString(content) && !cJSON_IsArray(content) && !cJSON_IsNull(content)) {
            perr(e, "messages", "a message's 'content' must be a string or an array of parts");
            goto fail;
        }
        /* kiln has no image, audio or file encoder: a part of another type
         * is refused here by name, not left to fail inside the template */
        if (cJSON_IsArray(content)) {
            const cJSON *part;
            cJSON_ArrayForEach(part, content) {
                const cJSON *type = get(part, "type");
                if (!cJSON_IsObject(part) || !cJSON_IsString(type)) {
                    perr(e, "messages", "messages[%d]: each content part must be an object with a string 'type'", i);
                    goto fail;
                }
                if (strcmp(type->valuestring, "text")) {
                    perr(e, "messages", "messages[%d]: content parts of type '%.40s' are not supported: kiln serves text only", i,
                         type->valuestring);
                    goto fail;
                }
                if (!cJSON_IsString(get(part, "text"))) {
                    perr(e, "messages", "messages[%d]: a text part must have a string 'text'", i);
                    goto fail;
                }
            }
        }
        int assistant = !strcmp(role->valuestring, "assistant"), tool = !strcmp(role->valuestring, "tool");
        const cJSON *calls = get(m, "tool_calls");
        if (!absent(calls)) {
            if (!assistant || !cJSON_IsArray(calls)) {
                perr(e, "messages", "messages[%d]: 'tool_calls' must be an array, in an assistant message", i);
                goto fail;
            }
            cJSON *tc;
            cJSON_ArrayForEach(tc, calls) {
                cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
                cJSON *args = fn ? cJSON_GetObjectItemCaseSensitive(fn, "arguments") : NULL;
                if (!cJSON_IsObject(fn) || !cJSON_IsString(get(fn, "name"))) {
                    perr(e, "messages",
                         "messages[%d]: each tool call must be {\"type\": \"function\", \"function\": {\"name\": ..., \"arguments\": ...}}",
                         i);
                    goto fail;
                }
                if (cJSON_IsString(args)) {
                    cJSON *obj = cJSON_Parse(args->valuestring);
                    if (!cJSON_IsObject(obj)) {
                        cJSON_Delete(obj);
                        perr(e, "messages", "messages[%d]: a tool call's 'arguments' must be a JSON object (or a string holding one)", i);
                        goto fail;
                    }
                    cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", obj);
                } else if (!absent(args) && !cJSON_IsObject(args)) {
                    perr(e, "messages", "messages[%d]: a tool call's 'arguments' must be a JSON object (or a string holding one)", i);
                    goto fail;
                }
            }
        }
        if ((assistant || tool) && absent(content)) {
            if (content) cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(""));
            else cJSON_AddStringToObject(m, "content", "");
        }
        i++;
    }
    return out;
fail:
    cJSON_Delete(out);
    return NULL;
}

/* tools and tool_choice: sets p->tools when the output is to be parsed. */
static int parse_tools(const cJSON *req, int chat, struct gen_params *p, struct param_error *e) {
    const cJSON *tools = get(req, "tools"), *choice = get(req, "tool_choice");
    int n_tools = 0;
    if (!absent(tools)) {
        if (!chat) return perr(e, "tools", "'tools' is for /v1/chat/completions");
        if (!cJSON_IsArray(tools)) return perr(e, "tools", "'tools' must be an array of {\"type\": \"function\", \"function\": {...}}");
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *type = get(t, "type"), *fn = get(t, "function");
            if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsObject(fn) ||
                !cJSON_IsString(get(fn, "name")) || !get(fn, "name")->valuestring[0])
                return perr(e, "tools", "tools[%d] must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}",
                            n_tools);
            n_tools++;
        }
    }
    int parse = n_tools > 0;
    if (!absent(choice)) {
        const char *c = cJSON_IsString(choice) ? choice->valuestring : NULL;
        if (cJSON_IsObject(choice) || (c && !strcmp(c, "required")))
            return perr(e, "tool_choice",
                        "tool_choice \"required\" or a named function is not supported: kiln does not force a tool call; "
                        "use \"auto\" (the default with tools) or \"none\"");
        if (!c || (strcmp(c, "auto") && strcmp(c, "none")))
            return perr(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", ...}");
        if (!strcmp(c, "none")) parse = 0;
    }
    p->tools = parse;
    return 0;
}

/* The text continue_final_message continues: the content string, or the
 * last text part of a list (template_messages has checked the parts);
 * NULL when there is none */
static const char *final_text(const cJSON *m) {
    const cJSON *content = get(m, "content");
    if (cJSON_IsString(content)) return content->valuestring;
    const char *t = NULL;
    const cJSON *part;
    if (cJSON_IsArray(content)) cJSON_ArrayForEach(part, content) t = get(part, "text")->valuestring;
    return t;
}

/* continue_final_message, as transformers' apply_chat_template does it: the
 * rendered text is cut after the last occurrence of the final message's
 * trimmed text, keeping its trailing whitespace when the template kept it
 * (the rendered text there equals the message); 0, or -1 with e */
static int cut_after_final(char *text, const cJSON *msgs, struct param_error *e) {
    const char *fin = final_text(cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1));
    if (!fin) return perr(e, "continue_final_message", "the final message has no text to continue");
    const size_t len = strlen(fin);
    size_t lead = 0, end = len;
    while (lead < len && isspace((unsigned char)fin[lead])) lead++;
    while (end > lead && isspace((unsigned char)fin[end - 1])) end--;
    const size_t tn = end - lead; /* the trimmed text: fin + lead, tn bytes */
    char *loc = NULL; /* the last occurrence of the trimmed text */
    const size_t total = strlen(text);
    for (char *q = text; tn && (q = memmem(q, total - (size_t)(q - text), fin + lead, tn)); q++) loc = q;
    if (!tn || !loc)
        return perr(e, "continue_final_message",
                    "the final message does not appear in the rendered chat template, so it cannot be continued");
    const size_t keep = lead == 0 && total - (size_t)(loc - text) >= len && !memcmp(loc, fin, len) ? len : tn;
    loc[keep] = 0;
    return 0;
}

/* messages -> chat template -> ids. Sets think_in_reasoning when the
 * rendered prompt ends inside <think>. add_gen: add_generation_prompt;
 * cont: continue_final_message (the last message, an assistant's, is left
 * open) */
static int chat_prompt(const struct params_ctx *c, const cJSON *req, int add_gen, int cont, struct gen_params *p,
                       struct param_error *e) {
    const cJSON *msgs = get(req, "messages");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) return perr(e, "messages", "'messages' must be a non-empty array of messages");
    if (cont) {
        const cJSON *role = get(cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1), "role");
        if (add_gen)
            return perr(e, "continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true");
        if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant"))
            return perr(e, "continue_final_message", "'continue_final_message' needs the last message to be the assistant's");
    }
    int thinking = -1;
    const cJSON *kw = get(req, "chat_template_kwargs");
    if (!absent(kw) && !cJSON_IsObject(kw)) return perr(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (!absent(kw) && opt_bool(kw, "enable_thinking", &thinking, e) < 0) return -1;
    cJSON *copy = template_messages(msgs, e);
    if (!copy) return -1;
    if (!c->tok || !tok_chat_template(c->tok)) {
        cJSON_Delete(copy);
        return perr(e, "messages", "this model has no chat template: use /v1/completions");
    }
    cJSON *wrap = cJSON_CreateObject();
    cJSON_AddItemToObject(wrap, "messages", copy);
    const cJSON *tools = get(req, "tools");
    if (cJSON_IsArray(tools)) cJSON_AddItemReferenceToObject(wrap, "tools", (cJSON *)tools);
    char *mj = cJSON_PrintUnformatted(wrap);
    cJSON_Delete(wrap);
    char err[512] = "";
    char *text = tok_apply_chat_template(c->tok, mj, add_gen, thinking, err, sizeof err);
    free(mj);
    if (!text) return perr(e, "messages", "cannot apply the chat template: %s", err);
    if (cont && cut_after_final(text, msgs, e)) {
        free(text);
        return -1;
    }
    size_t tl = strlen(text);
    while (tl && (text[tl - 1] == '\n' || text[tl - 1] == ' ')) tl--;
    p->think_in_reasoning = tl >= 7 && !memcmp(text + tl - 7, "<think>", 7);
    int rc = encode_text(c, text, add_prompt(p, 1), e);
    free(text);
    return rc;
}

/* chat_prompt with the request's add_generation_prompt (default true) and
 * continue_final_message (default false), as vLLM takes them */
static int chat_prompt_of(const struct params_ctx *c, const cJSON *req, struct gen_params *p, struct param_error *e) {
    int add_gen = -1, cont = 0;
    if (opt_bool(req, "add_generation_prompt", &add_gen, e) < 0 || opt_bool(req, "continue_final_message", &cont, e) < 0) return -1;
    if (add_gen < 0) add_gen = !cont; /* continuing a message adds no new turn unless asked (then refused) */
    return chat_prompt(c, req, add_gen, cont, p, e);
}

/* prompt: a string, an array of token ids (one prompt), or an array of
 * strings and token-id arrays (one prompt each). */
static int completion_prompt(const struct params_ctx *c, const cJSON *req, struct gen_params *p, struct param_error *e) {
    const cJSON *pr = get(req, "prompt");
    if (cJSON_IsString(pr)) {
        struct prompt *q = add_prompt(p, 1);
        if (p->echo) q->text = kiln_strdup(pr->valuestring);
        return encode_text(c, pr->valuestring, q, e);
    }
    if (!cJSON_IsArray(pr) || cJSON_GetArraySize(pr) == 0)
        return perr(e, "prompt", "'prompt' must be a string, an array of token ids, or an array of strings or token-id arrays");
    if (cJSON_IsNumber(cJSON_GetArrayItem(pr, 0))) {
        struct prompt *q = add_prompt(p, 1);
        return params_ids(c, pr, "prompt", &q->ids, &q->n, e);
    }
    int k = cJSON_GetArraySize(pr);
    if (k > PARAMS_MAX_CHOICES) return perr(e, "prompt", "at most %d prompts in one request, got %d", PARAMS_MAX_CHOICES, k);
    const cJSON *x;
    cJSON_ArrayForEach(x, pr) {
        struct prompt *q = add_prompt(p, k);
        if (cJSON_IsString(x)) {
            if (p->echo) q->text = kiln_strdup(x->valuestring);
            if (encode_text(c, x->valuestring, q, e)) return -1;
        } else if (cJSON_IsArray(x)) {
            if (params_ids(c, x, "prompt", &q->ids, &q->n, e)) return -1;
        } else {
            return perr(e, "prompt", "each element of 'prompt' must be a string or an array of token ids");
        }
    }
    return 0;
}

/* ==== the other structured fields ==== */

/* logit_bias: {"token id": bias in [-100, 100], ...} */
static int parse_logit_bias(const struct params_ctx *c, const cJSON *req, struct gen_params *p, struct param_error *e) {
    const cJSON *lb = get(req, "logit_bias"), *x;
    if (absent(lb)) return 0;
    if (!cJSON_IsObject(lb))
        return perr(e, "logit_bias", "'logit_bias' must be an object mapping token ids (as strings) to numbers in [-100, 100]");
    int cnt = cJSON_GetArraySize(lb);
    p->bias_ids = kiln_malloc(sizeof *p->bias_ids * (size_t)(cnt ? cnt : 1));
    p->bias = kiln_malloc(sizeof *p->bias * (size_t)(cnt ? cnt : 1));
    cJSON_ArrayForEach(x, lb) {
        const char *k = x->string;
        long long id = 0;
        size_t len = strlen(k);
        int ok = len > 0 && len <= 10;
        for (size_t i = 0; ok && i < len; i++) {
            ok = k[i] >= '0' && k[i] <= '9';
            id = id * 10 + (k[i] - '0');
        }
        if (!ok || id >= c->vocab) return perr(e, "logit_bias", "logit_bias: '%s' is not a token id in [0, %d)", k, c->vocab);
        if (!cJSON_IsNumber(x) || isnan(x->valuedouble) || x->valuedouble < -100 || x->valuedouble > 100)
            return perr(e, "logit_bias", "logit_bias: the bias of token %s must be a number in [-100, 100]", k);
        p->bias_ids[p->sp.n_bias] = (int32_t)id;
        p->bias[p->sp.n_bias++] = (float)x->valuedouble;
    }
    p->sp.bias_ids = p->bias_ids;
    p->sp.bias = p->bias;
    return 0;
}

static int parse_stops(const cJSON *req, struct gen_params *p, struct param_error *e) {
    const cJSON *st = get(req, "stop");
    if (cJSON_IsString(st)) {
        if (st->valuestring[0]) p->stops[p->n_stops++] = kiln_strdup(st->valuestring);
    } else if (cJSON_IsArray(st)) {
        if (cJSON_GetArraySize(st) > PARAMS_MAX_STOPS) return perr(e, "stop", "at most %d stop strings", PARAMS_MAX_STOPS);
        const cJSON *x;
        cJSON_ArrayForEach(x, st) {
            if (!cJSON_IsString(x)) return perr(e, "stop", "'stop' must be a string or an array of strings");
            if (x->valuestring[0]) p->stops[p->n_stops++] = kiln_strdup(x->valuestring);
        }
    } else if (!absent(st)) {
        return perr(e, "stop", "'stop' must be a string or an array of strings");
    }
    return 0;
}

static int parse_response_format(const struct params_ctx *c, const cJSON *req, struct gen_params *p, struct param_error *e) {
    const cJSON *rf = get(req, "response_format");
    if (absent(rf)) return 0;
    const cJSON *type = get(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
        return perr(e, "response_format", "'response_format' must be an object such as {\"type\": \"json_object\"}");
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) {
        if (!c->tok) return perr(e, "response_format", "response_format json_object needs the model's tokenizer");
        p->json = 1;
        return 0;
    }
    if (!strcmp(t, "json_schema"))
        return perr(e, "response_format",
                    "response_format type 'json_schema' is not supported: kiln can constrain the output to a JSON object "
                    "({\"type\": \"json_object\"}) but does not enforce a schema");
    return perr(e, "response_format", "unknown response_format type '%s': expected 'text' or 'json_object'", t);
}

/* ==== public ==== */

void params_free(struct gen_params *p) {
    for (int i = 0; i < p->n_prompts; i++) free(p->prompts[i].ids), free(p->prompts[i].text);
    free(p->prompts);
    free(p->bias_ids);
    free(p->bias);
    free(p->stop_ids);
    for (int i = 0; i < p->n_stops; i++) free(p->stops[i]);
    memset(p, 0, sizeof *p);
}

static int parse(const struct params_ctx *c, const cJSON *req, int chat, struct prompt *pre, struct gen_params *p,
                 struct param_error *e);

int params_parse(const struct params_ctx *c, const cJSON *req, int chat, struct gen_params *p, struct param_error *e) {
    return parse(c, req, chat, NULL, p, e);
}

int params_parse_ids(const struct params_ctx *c, const cJSON *req, int32_t *ids, int n, struct gen_params *p,
                     struct param_error *e) {
    struct prompt pre = {.ids = ids, .n = n};
    int rc = parse(c, req, 0, &pre, p, e);
    free(pre.ids); /* NULL once the prompt list took it */
    return rc;
}

/* the JSON scanner's walk of the top-level object: the one "prompt" member
 * (a second one makes cJSON's first-wins rule matter: not taken) */
int params_scan_prompt_ids(char *body, size_t len, int32_t **ids, int *n) {
    struct js s;
    js_init(&s, body, 0, len, 0);
    const uint8_t *k, *a0 = NULL, *a1 = NULL;
    size_t kl;
    int first = 1, r = 0, cnt = 0, cap = 0, ok = 1;
    int32_t *v = NULL;
    if (js_peek(&s) != '{' || js_obj_open(&s)) ok = 0;
    while (ok && (r = js_obj_next(&s, &first, &k, &kl)) == 1) {
        if (kl == 6 && !memcmp(k, "prompt", 6)) {
            if (a0 || js_peek(&s) != '[') {
                ok = 0;
                break;
            }
            a0 = s.p;
            int f2 = 1, r2 = 0;
            if (js_arr_open(&s)) ok = 0;
            while (ok && (r2 = js_arr_next(&s, &f2)) == 1) {
                const int c = js_peek(&s);
                const uint8_t *n0 = s.p;
                double d;
                if (c < '0' || c > '9' || js_number(&s, &d) || d > 2147483647.0) {
                    ok = 0;
                    break;
                }
                for (const uint8_t *q = n0; q < s.p; q++) /* plain digits only: fractions and exponents go to cJSON */
                    if (*q < '0' || *q > '9') ok = 0;
                if (!ok) break;
                if (cnt == cap) {
                    cap = cap ? 2 * cap : 1024;
                    v = kiln_realloc(v, sizeof *v * (size_t)cap);
                }
                v[cnt++] = (int32_t)d;
            }
            if (ok && r2 < 0) ok = 0;
            a1 = s.p;
        } else if (js_skip(&s, NULL)) {
            ok = 0;
        }
    }
    if (ok && (r < 0 || js_peek(&s) != -1)) ok = 0; /* an error, or bytes after the object */
    ok = ok && a0 && cnt > 0;
    js_free(&s);
    if (!ok) {
        free(v);
        return 0;
    }
    /* "prompt": [ ... ] becomes "prompt": []       (same length) */
    memset(body + (a0 - (const uint8_t *)body) + 1, ' ', (size_t)(a1 - a0) - 2);
    *ids = v, *n = cnt;
    return 1;
}

static int parse(const struct params_ctx *c, const cJSON *req, int chat, struct prompt *pre, struct gen_params *p,
                 struct param_error *e) {
    memset(p, 0, sizeof *p);
    p->chat = chat;
    p->sp = sampling_default();
    p->n = 1;
    p->max_tokens = -1;
    p->logprobs = -1;
    e->param = NULL;
    e->msg[0] = 0;
    if (!cJSON_IsObject(req)) return perr(e, NULL, "the body must be a JSON object");
    if (check_model(c, req, e)) return -1;
    double d;
    long long v;
    int r;
    if (opt_bool(req, "stream", &p->stream, e) < 0) return -1;
    const cJSON *so = get(req, "stream_options");
    if (!absent(so)) {
        if (!cJSON_IsObject(so)) return perr(e, "stream_options", "'stream_options' must be an object");
        if (opt_bool(so, "include_usage", &p->include_usage, e) < 0) return -1;
        if (opt_bool(so, "continuous_usage_stats", &p->continuous_usage, e) < 0) return -1;
        p->continuous_usage &= p->include_usage; /* as vLLM: only with include_usage */
    }
    if ((r = opt_num(req, "temperature", 0, 2, &d, e)) < 0) return -1;
    if (r) p->sp.temperature = (float)d;
    if ((r = opt_num(req, "top_p", 0, 1, &d, e)) < 0) return -1;
    if (r) {
        if (d <= 0) return perr(e, "top_p", "'top_p' must be in (0, 1]");
        p->sp.top_p = (float)d;
    }
    if ((r = opt_int(req, "top_k", -1, 1e9, &v, e)) < 0) return -1;
    if (r) p->sp.top_k = v < 0 ? 0 : (int)v;
    if ((r = opt_num(req, "min_p", 0, 1, &d, e)) < 0) return -1;
    if (r) p->sp.min_p = (float)d;
    if ((r = opt_num(req, "presence_penalty", -2, 2, &d, e)) < 0) return -1;
    if (r) p->sp.presence_penalty = (float)d;
    if ((r = opt_num(req, "frequency_penalty", -2, 2, &d, e)) < 0) return -1;
    if (r) p->sp.frequency_penalty = (float)d;
    if ((r = opt_num(req, "repetition_penalty", 0, 10, &d, e)) < 0) return -1;
    if (r) {
        if (d <= 0) return perr(e, "repetition_penalty", "'repetition_penalty' must be > 0");
        p->sp.repetition_penalty = (float)d;
    }
    if ((r = opt_int(req, "seed", -9.2e18, 9.2e18, &v, e)) < 0) return -1;
    if (r) p->sp.seed = (uint64_t)v, p->seed_set = 1;
    if ((r = opt_int(req, "n", 1, PARAMS_MAX_N, &v, e)) < 0) return -1;
    if (r) p->n = (int)v;
    if ((r = opt_int(req, "max_tokens", 1, 1e9, &v, e)) < 0) return -1;
    if (r) p->max_tokens = (int)v;
    if (chat) {
        if ((r = opt_int(req, "max_completion_tokens", 1, 1e9, &v, e)) < 0) return -1;
        if (r) p->max_tokens = (int)v;
    }
    if ((r = opt_int(req, "min_tokens", 0, 1e9, &v, e)) < 0) return -1;
    if (r) p->min_tokens = (int)v;
    if (opt_bool(req, "ignore_eos", &p->ignore_eos, e) < 0) return -1;
    if (chat) {
        int lp = 0;
        if (opt_bool(req, "logprobs", &lp, e) < 0) return -1;
        if ((r = opt_int(req, "top_logprobs", 0, KILN_MAX_TOP_LOGPROBS, &v, e)) < 0) return -1;
        if (r && !lp) return perr(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        if (lp) p->logprobs = 1, p->top_logprobs = r ? (int)v : 0;
    } else {
        if ((r = opt_int(req, "logprobs", 0, KILN_MAX_TOP_LOGPROBS, &v, e)) < 0) return -1;
        if (r) p->logprobs = 1, p->top_logprobs = (int)v;
    }
    if (!chat) {
        if (opt_bool(req, "echo", &p->echo, e) < 0) return -1;
        if (p->echo && !c->tok) return perr(e, "echo", "'echo' needs the model's tokenizer, which this server has not loaded");
        if (p->echo && p->logprobs >= 0)
            return perr(e, "echo", "'echo' with 'logprobs' is not supported: kiln does not return the prompt's logprobs");
        const cJSON *sfx = get(req, "suffix");
        if (!absent(sfx) && !(cJSON_IsString(sfx) && !*sfx->valuestring))
            return perr(e, "suffix", "'suffix' is not supported: these models do not fill in the middle");
    }
    if ((r = opt_int(req, "best_of", 1, PARAMS_MAX_N, &v, e)) < 0) return -1;
    if (r && v != p->n) return perr(e, "best_of", "'best_of' other than n is not supported (got best_of %lld, n %d)", v, p->n);
    if (chat) { /* text only: no audio out */
        const cJSON *mod = get(req, "modalities"), *x;
        if (!absent(get(req, "audio"))) return perr(e, "audio", "audio output is not supported: kiln serves text only");
        if (!absent(mod)) {
            if (!cJSON_IsArray(mod)) return perr(e, "modalities", "'modalities' must be an array");
            cJSON_ArrayForEach(x, mod) if (!cJSON_IsString(x) || strcmp(x->valuestring, "text"))
                return perr(e, "modalities", "only the 'text' modality is supported");
        }
    }
    if (parse_stops(req, p, e)) return -1;
    const cJSON *sti = get(req, "stop_token_ids");
    if (!absent(sti)) {
        if (!cJSON_IsArray(sti)) return perr(e, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
        if (params_ids(c, sti, "stop_token_ids", &p->stop_ids, &p->n_stop_ids, e)) return -1;
    }
    if (parse_logit_bias(c, req, p, e)) return -1;
    if (parse_response_format(c, req, p, e)) return -1;
    if (parse_tools(req, chat, p, e)) return -1;
    if (pre) { /* the ids params_scan_prompt_ids took out of the body */
        for (int i = 0; i < pre->n; i++)
            if (pre->ids[i] >= c->vocab) return perr(e, "prompt", "'prompt' must hold token ids in [0, %d)", c->vocab);
        *add_prompt(p, 1) = *pre;
        pre->ids = NULL;
    } else if (chat ? chat_prompt_of(c, req, p, e) : completion_prompt(c, req, p, e)) {
        return -1;
    }
    if ((long long)p->n_prompts * p->n > PARAMS_MAX_CHOICES)
        return perr(e, "n", "%d prompts x n = %d choices: at most %d in one request", p->n_prompts, p->n_prompts * p->n, PARAMS_MAX_CHOICES);
    const char *what = chat ? "messages" : "prompt";
    for (int i = 0; i < p->n_prompts; i++) {
        int n = p->prompts[i].n, room = c->max_len - n;
        if (n == 0) return perr(e, what, "the prompt is empty");
        if (room <= 0)
            return perr(e, what, "This model's maximum context length is %d tokens. However, your prompt has %d tokens.", c->max_len, n);
        int max = p->max_tokens > 0 ? p->max_tokens : room;
        if (p->min_tokens > max) return perr(e, "min_tokens", "'min_tokens' (%d) must not exceed max_tokens (%d)", p->min_tokens, max);
    }
    p->think = chat && c->has_think;
    if (p->json) p->think_in_reasoning = 0; /* JSON mode allows no reasoning: even after an open <think>, the output is content */
    return 0;
}

int params_tokenize(const struct params_ctx *c, const cJSON *req, struct gen_params *p, struct param_error *e) {
    memset(p, 0, sizeof *p);
    e->param = NULL;
    const cJSON *prompt = get(req, "prompt");
    if (get(req, "messages")) {
        return chat_prompt_of(c, req, p, e);
    }
    if (cJSON_IsString(prompt)) return encode_text(c, prompt->valuestring, add_prompt(p, 1), e);
    return perr(e, "prompt", "give 'prompt' (a string) or 'messages'");
}
