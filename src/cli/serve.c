/*
 * serve.c: `kiln serve`, the OpenAI-compatible HTTP server.
 *
 *   kiln serve -m MODEL [--host 127.0.0.1] [--port 8000] [--api-key KEY]
 *
 * Opens the engine, starts the serving loop (one engine thread) and the
 * HTTP front, then waits for SIGINT/SIGTERM and shuts down in order: HTTP
 * first (no new requests; open streams end), then the engine (every
 * request left gets its finish event).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "cli/common.h"
#include "kiln.h"
#include "server/openai.h"
#include "tokenizer/tokenizer.h"

static void serve_usage(void) {
    fprintf(stderr,
            "usage: kiln serve -m MODEL [options]\n"
            "  --host ADDR                 address to listen on (default 127.0.0.1: this machine only)\n"
            "  --port N                    port (default 8000)\n"
            "  --api-key KEY               require 'Authorization: Bearer KEY' (default: env KILN_API_KEY)\n"
            "  --served-model-name NAME    the model id clients send (default: the model directory's name)\n"
            "  --tokenizer DIR             tokenizer.json / chat template from DIR (default: the model directory)\n"
            "  --max-running-requests N    most requests decoded together (default 256)\n"
            "  --max-queued-requests N     most waiting requests; more get 503 (default 1024)\n"
            "  --chunked-prefill-size N    per-step token budget: prefill chunks + decode tokens (default 512)\n"
            "  --max-body-bytes N          largest request body; more gets 413 (default 8 MiB)\n"
            "  --health-timeout S          seconds /health waits for its canary token (default 60)\n"
            "%s",
            cli_model_usage);
}

static int parse_pos(const char *opt, const char *v, long long *out) {
    char *end;
    long long x = v ? strtoll(v, &end, 10) : -1;
    if (!v || *end || x <= 0) {
        fprintf(stderr, "kiln serve: %s expects a positive integer\n", opt);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_serve(int argc, char **argv) {
    struct kiln_engine_opts eo = {0};
    struct kiln_serving_opts so = {0};
    struct openai_opts oo = {.host = "127.0.0.1", .port = 8000, .max_body = 8u << 20, .health_timeout = 60};
    const char *tok_dir = NULL;
    oo.api_key = getenv("KILN_API_KEY");
    for (int i = 1; i < argc; i++) {
        int r = cli_model_opt(argc, argv, &i, &eo);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return serve_usage(), 0;
        static const char *with_value[] = {"--host", "--port", "--api-key", "--served-model-name", "--tokenizer", "--max-running-requests",
                                           "--max-queued-requests", "--chunked-prefill-size", "--max-body-bytes", "--health-timeout", NULL};
        int k = 0;
        while (with_value[k] && strcmp(a, with_value[k])) k++;
        if (!with_value[k]) {
            fprintf(stderr, "kiln serve: unknown option '%s'\n", a);
            serve_usage();
            return 2;
        }
        if (!v) {
            fprintf(stderr, "kiln serve: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--host")) oo.host = v;
        else if (!strcmp(a, "--api-key")) oo.api_key = v;
        else if (!strcmp(a, "--served-model-name")) oo.model_name = v;
        else if (!strcmp(a, "--tokenizer")) tok_dir = v;
        else if (!strcmp(a, "--health-timeout")) oo.health_timeout = atof(v);
        else {
            if (parse_pos(a, v, &x)) return 2;
            if (!strcmp(a, "--port")) oo.port = (int)x;
            else if (!strcmp(a, "--max-running-requests")) so.max_running = (int)x;
            else if (!strcmp(a, "--max-queued-requests")) so.max_queued = (int)x;
            else if (!strcmp(a, "--chunked-prefill-size")) so.chunk = eo.prefill_chunk = (int)x;
            else if (!strcmp(a, "--max-body-bytes")) oo.max_body = (size_t)x;
        }
    }
    if (oo.port > 65535) {
        fprintf(stderr, "kiln serve: --port must be at most 65535\n");
        return 2;
    }
    kiln_engine *e = cli_open_engine(&eo, "serve");
    if (!e) return 1;

    char err[1024] = "", name[256];
    struct kiln_tokenizer *tok = NULL;
    const char *dir = tok_dir ? tok_dir : kiln_engine_model_dir(e);
    if (dir) {
        tok = tok_load(dir, err, sizeof err);
        if (!tok && tok_dir) {
            fprintf(stderr, "kiln serve: --tokenizer %s: %s\n", tok_dir, err);
            kiln_engine_close(e);
            return 1;
        }
        if (!tok) kiln_log(KILN_LOG_WARN, "serve: no tokenizer (%s): only token-id prompts will work", err);
    }
    if (!oo.model_name) { /* the directory's last component, or the dummy config's name */
        const char *src = kiln_engine_model_dir(e) ? kiln_engine_model_dir(e) : eo.dummy;
        snprintf(name, sizeof name, "%s", src ? src : "kiln");
        size_t n = strlen(name);
        while (n > 1 && name[n - 1] == '/') name[--n] = 0;
        const char *slash = strrchr(name, '/');
        memmove(name, slash ? slash + 1 : name, strlen(slash ? slash + 1 : name) + 1);
        oo.model_name = name;
    }

    /* SIGINT/SIGTERM are taken by sigwait below: block them before any
     * thread starts so that every thread inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    kiln_serving *srv = kiln_serving_start(e, &so, err, sizeof err);
    struct openai_server *http = NULL;
    if (!srv) {
        fprintf(stderr, "kiln serve: %s\n", err);
    } else if (!(http = openai_start(e, srv, tok, &oo, err, sizeof err))) {
        fprintf(stderr, "kiln serve: %s\n", err);
    } else {
        fprintf(stderr, "kiln serve: %s on %s backend, listening on http://%s:%d%s\n", oo.model_name, kiln_engine_backend(e), oo.host,
                oo.port, oo.api_key && oo.api_key[0] ? " (API key required)" : "");
        fprintf(stderr, "kiln serve: KV cache of %d tokens in %s rows, %.1f MiB\n", kiln_engine_max_tokens(e), kiln_engine_kv_dtype(e),
                kiln_engine_kv_token_bytes(e) * kiln_engine_max_tokens(e) / (1 << 20));
        int sig = 0;
        sigwait(&sigs, &sig);
        fprintf(stderr, "kiln serve: signal %d, shutting down\n", sig);
        rc = 0;
    }
    /* stop the engine first so blocked handlers get their finish events,
     * then the HTTP threads can end */
    if (srv) kiln_serving_stop(srv);
    openai_stop(http);
    kiln_serving_free(srv);
    tok_free(tok);
    kiln_engine_close(e);
    return rc;
}
