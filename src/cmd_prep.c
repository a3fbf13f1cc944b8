// cmd_prep.c: placeholder until the prep subcommand lands.
#include <stdio.h>

#include "cli.h"
#include "common.h"

int cmd_prep(int argc, char **argv) {
    fprintf(stderr, "trident prep: not implemented yet\n");
    return STATUS_RUNTIME;
}
