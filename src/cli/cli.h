/*
 * cli.h: the `kiln` subcommands. Each one parses its own arguments, prints
 * errors to stderr and returns the process exit status (0 ok, 1 runtime
 * error, 2 usage error). Only main.c exits.
 */
#ifndef KILN_CLI_H
#define KILN_CLI_H

int cli_run(int argc, char **argv);
int cli_logits(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_template(int argc, char **argv);
int cli_quantize(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_bench(int argc, char **argv);

#endif
