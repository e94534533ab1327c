/*
 * main.c: `kiln COMMAND ...`. Dispatches to the subcommands in src/cli/.
 */
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"run", cli_run, "generate from token ids or text: kiln run -m MODEL (--ids 1,2,3 | -p TEXT [--chat]) -n N"},
    {"logits", cli_logits, "write last-position logits: kiln logits -m MODEL --ids 1,2,3 --out FILE"},
    {"inspect", cli_inspect, "architecture, shapes, dtypes, parameter count: kiln inspect -m MODEL"},
    {"tokenize", cli_tokenize, "text on stdin to ids (or --decode ids to text): kiln tokenize -m MODEL"},
    {"serve", cli_serve, "OpenAI-compatible HTTP server: kiln serve -m MODEL [--host 127.0.0.1] [--port 8000]"},
    {"template", cli_template, "render the chat template: kiln template -m MODEL --messages FILE.json"},
    {"quantize", cli_quantize, "round-to-nearest: kiln quantize -m MODEL --to q8_0|q4_0|q4_k|gptq-int4|gptq-int8|fp8 -o OUT"},
    {"bench", cli_bench, "benchmarks: kiln bench [--profile prefix|speed|batch|pp-tg] | kiln bench serve --url URL"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: kiln COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nMODEL is a Hugging Face checkpoint directory; `--dummy NAME|CONFIG.json` in its\n"
               "place builds seeded random weights of that shape (names: qwen3-0.6b ... qwen3-235b-a22b).\n"
               "`kiln COMMAND --help` shows a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kiln: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
