/*
 * quantize.c: `kiln quantize -m MODEL --to FMT [--group-size G] -o OUT`,
 * round-to-nearest (format/quantize.c does the work).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "format/quantize.h"

int cli_quantize(int argc, char **argv) {
    const char *src = NULL, *to = NULL, *out = NULL;
    int group = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) src = argv[++i];
        else if (!strcmp(a, "--to") && has) to = argv[++i];
        else if ((!strcmp(a, "-o") || !strcmp(a, "--out")) && has) out = argv[++i];
        else if (!strcmp(a, "--group-size") && has) group = atoi(argv[++i]);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: kiln quantize -m MODEL --to q8_0|q4_0|q4_k|gptq-int4|gptq-int8|fp8 [--group-size G] -o OUT\n"
                   "  q formats write one GGUF file; gptq/fp8 write a Hugging Face folder. Round-to-nearest.\n"
                   "  --group-size: GPTQ group (default 128, -1 per channel)\n");
            return 0;
        } else {
            fprintf(stderr, "kiln quantize: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!src || !to || !out) {
        fprintf(stderr, "usage: kiln quantize -m MODEL --to FMT [--group-size G] -o OUT\n");
        return 2;
    }
    char err[1024] = "";
    if (kiln_quantize(src, to, group, out, err, sizeof err)) {
        fprintf(stderr, "kiln quantize: %s\n", err);
        return 1;
    }
    fprintf(stderr, "kiln quantize: wrote %s (%s)\n", out, to);
    return 0;
}
