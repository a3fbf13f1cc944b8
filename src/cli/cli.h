// cli.h: the subcommands of the trident executable. Each returns the process
// exit code (docs/design.md §8: 0 ok, 1 runtime failure, 2 bad input, 3 preempted).
// Each prints its usage and returns 0 when called with `--help` (or `-h`) as
// its only argument; main() calls it so for --help anywhere on its line.
#ifndef TRIDENT_CLI_H
#define TRIDENT_CLI_H

// trident tokenize --tokenizer FILE [--decode] | --train ...   (src/cli/cmd_tokenize.c)
int cmd_tokenize(int argc, char **argv);
// trident prep --input PATH... --output DIR ...   (src/cli/cmd_prep.c)
int cmd_prep(int argc, char **argv);
// trident data-check DIR --seq-len N ...   (src/cli/cmd_data.c; for debugging)
int cmd_data_check(int argc, char **argv);

// trident ckpt info|verify DIR | trident ckpt export DIR OUT.h5 | trident ckpt export
// DIR OUT --format hf [...] | trident ckpt logits DIR --tokens IDS.txt --out
// OUT.safetensors   (src/cli/cmd_ckpt.c)
int cmd_ckpt(int argc, char **argv);
// trident import HF_DIR OUT_DIR   (src/cli/cmd_ckpt.c)
int cmd_import(int argc, char **argv);

// trident generate MODEL_DIR --prompt TEXT ... [options]   (src/cli/cmd_generate.c; one process)
int cmd_generate(int argc, char **argv);

// trident train CONFIG.ini [section.key=value ...]   (src/cli/cmd_train.c; a failure
// ends every rank of the job from inside, mpi_exit_all)
int cmd_train(int argc, char **argv);

// trident plan CONFIG.ini [--world-size N] [section.key=value ...]   (src/cli/cmd_plan.c)
int cmd_plan(int argc, char **argv);

// trident plot RUN_DIR [--out PNG] [--data FILE]   (src/cli/cmd_plot.c; needs gnuplot)
int cmd_plot(int argc, char **argv);

#endif
