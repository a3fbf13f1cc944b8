// cmd_tokenize.c: placeholder until the tokenize subcommand lands.
#include <stdio.h>

#include "cli.h"
#include "common.h"

int cmd_tokenize(int argc, char **argv) {
    fprintf(stderr, "trident tokenize: not implemented yet\n");
    return STATUS_RUNTIME;
}
