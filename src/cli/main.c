// main.c: the trident executable; dispatches to a subcommand (src/cli/cli.h).
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/version.h"
#include "cli.h"

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage; // the line `trident --help` lists
};

static const struct command commands[] = {
    {"train", cmd_train, "train CONFIG.ini [section.key=value ...]     train a model (under mpirun/srun)"},
    {"plan", cmd_plan, "plan CONFIG.ini [section.key=value ...]      memory per rank, without running"},
    {"prep", cmd_prep, "prep --input PATH... --output DIR [options]   raw text to HDF5 shards"},
    {"data-check", cmd_data_check, "data-check DIR --seq-len N [--vocab-size V]   validate every shard of a dataset"},
    {"ckpt", cmd_ckpt, "ckpt info|verify DIR | ckpt export DIR OUT.h5 [--format hf] | ckpt logits DIR --tokens IDS.txt --out OUT.safetensors   inspect, check, export a checkpoint or compute its logits"},
    {"import", cmd_import, "import HF_DIR OUT_DIR       a Hugging Face LlamaForCausalLM folder as a checkpoint"},
    {"generate", cmd_generate, "generate MODEL_DIR --prompt TEXT [--chat] [options]   continue prompts (greedy or sampled), one process"},
    {"plot", cmd_plot, "plot RUN_DIR [--out PNG] [--data FILE]       loss, lr, grad norm, tokens/s curves as a PNG"},
    {"tokenize", cmd_tokenize, "tokenize --tokenizer FILE [--decode] | --train --vocab-size N --output FILE   text <-> ids"},
};

static void print_usage(FILE *f) {
    fprintf(f, "usage: trident COMMAND [ARGS]\n\ncommands:\n");
    fprintf(f, "  trident --version                              this build's release and git commit\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  trident %s\n", commands[i].usage);
    fprintf(f, "\n`trident COMMAND --help` (or -h anywhere on the line) prints a command's usage\n");
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
