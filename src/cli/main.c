// main.c: the trident executable; dispatches to a subcommand (src/cli/cli.h).
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/version.h"
#include "cli.h"
#include "cli_flags.h"

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
};

static const struct command commands[] = {
    {"train", cmd_train},       {"plan", cmd_plan},     {"prep", cmd_prep},   {"data-check", cmd_data_check},
    {"ckpt", cmd_ckpt},         {"import", cmd_import}, {"generate", cmd_generate}, {"plot", cmd_plot},
    {"tokenize", cmd_tokenize},
};

// The flag tables, in the order of `trident --help` and docs/cli.md.
static const struct cli_command *const cli_tables[] = {
    &cli_train, &cli_plan, &cli_prep, &cli_data_check, &cli_ckpt_info, &cli_ckpt_verify, &cli_ckpt_export, &cli_ckpt_logits,
    &cli_import, &cli_generate, &cli_plot, &cli_tokenize,
};

// docs/cli.md: every command's flag table as Markdown (tests/e2e/cli_docs.sh
// compares the committed file with this text).
static void print_markdown(FILE *f) {
    fputs("# trident command line\n\n"
          "Generated from the flag tables of `src/cli/cmd_*.c` (`struct cli_command`, parsed by\n"
          "`cli_parse` in `src/cli/cli_flags.c`) by `build/trident --help-markdown > docs/cli.md`;\n"
          "`tests/e2e/cli_docs.sh` fails when this file and the tables disagree. `trident COMMAND\n"
          "--help` prints the same rows.\n\n"
          "A flag takes its value as the next argument (`--top-k 5`, never `--top-k=5`), whatever\n"
          "it starts with; a switch takes none. An unknown flag, a flag without its value, a value\n"
          "of the wrong type or out of its range, and a missing argument are refused with exit 2,\n"
          "naming the flag, the value found and what it takes. Settings of a training run are\n"
          "config keys (docs/config.md), not flags.\n", f);
    for (size_t i = 0; i < sizeof cli_tables / sizeof cli_tables[0]; i++) cli_write_markdown(cli_tables[i], f);
}

static void print_usage(FILE *f) {
    fprintf(f, "usage: trident COMMAND [ARGS]\n\ncommands:\n");
    fprintf(f, "  trident --version\n      this build's release and git commit\n");
    for (size_t i = 0; i < sizeof cli_tables / sizeof cli_tables[0]; i++) cli_print_synopsis(cli_tables[i], f);
    fprintf(f, "\n`trident COMMAND --help` (or -h anywhere on the line) prints a command's usage;\n"
               "`trident --help-markdown` every command's flags as Markdown (docs/cli.md)\n");
}

// --help or -h anywhere after the command name.
static bool wants_help(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    return false;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? STATUS_BAD_INPUT : STATUS_OK;
    }
    if (!strcmp(argv[1], "--help-markdown")) {
        print_markdown(stdout);
        return STATUS_OK;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("%s\n", version_string());
        return STATUS_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name)) continue;
        if (wants_help(argc, argv)) { // the command's usage, before any work (train: before MPI)
            char *help[] = {argv[1], "--help", NULL};
            return commands[i].run(2, help);
        }
        return commands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "trident: unknown command '%s'\n\n", argv[1]);
    print_usage(stderr);
    return STATUS_BAD_INPUT;
}
