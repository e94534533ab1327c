/*
 * common.h: option parsing shared by the subcommands: the model options
 * (-m DIR | --dummy NAME [--dtype T] [--seed S], --backend, -t) and small
 * helpers for id lists.
 */
#ifndef KILN_CLI_COMMON_H
#define KILN_CLI_COMMON_H

#include <stdint.h>

#include "kiln.h"

/* If argv[*i] is a model option, consumes it (and its value) into o,
 * advances *i and returns 1; returns -1 on a missing value, 0 otherwise. */
int cli_model_opt(int argc, char **argv, int *i, struct kiln_engine_opts *o);
extern const char *cli_model_usage;

/* "1,2, 3" -> ids; returns -1 with a message on stderr for a bad list. */
int cli_parse_ids(const char *s, int32_t **ids, int *n);

/* Opens the engine, printing the error on failure. */
kiln_engine *cli_open_engine(const struct kiln_engine_opts *o, const char *cmd);

#endif
