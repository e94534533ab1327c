/*
 * openai.h: the OpenAI-compatible routes on top of http.h and the serving
 * API of kiln.h.
 *
 *   POST /v1/chat/completions, /v1/completions   (stream or not)
 *   GET  /v1/models, /health, /metrics
 *   POST /tokenize, /detokenize, /flush_cache
 *
 * Errors are OpenAI-shaped: {"error": {"message", "type", "param", "code"}}
 * with 400 (bad input), 401 (API key), 404 (route), 413 (body size, in
 * http.c), 503 (queue full, with Retry-After; health failure).
 */
#ifndef KILN_SERVER_OPENAI_H
#define KILN_SERVER_OPENAI_H

#include <stddef.h>

#include "kiln.h"

struct kiln_tokenizer;

struct openai_opts {
    const char *host;         /* NULL: 127.0.0.1 */
    int port;
    const char *api_key;      /* NULL or "": no authentication */
    size_t max_body;          /* request body limit in bytes */
    const char *model_name;   /* the served model id */
    double health_timeout;    /* seconds the /health canary may take */
};

struct openai_server;

/* Starts listening. The engine must already be serving (srv); tok may be
 * NULL (then only token-id prompts work and no text comes back). */
struct openai_server *openai_start(kiln_engine *e, kiln_serving *srv, struct kiln_tokenizer *tok, const struct openai_opts *o,
                                   char *err, size_t errlen);
void openai_stop(struct openai_server *s);

#endif
