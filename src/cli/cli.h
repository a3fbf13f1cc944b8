// cli.h: the subcommands of the trident executable. Each returns the process
// exit code (docs/design.md §8: 0 ok, 1 runtime failure, 2 bad input, 3 preempted).
// Each prints its usage and returns 0 when called with `--help` (or `-h`) as
// its only argument; main() calls it so for --help anywhere on its line.
#ifndef TRIDENT_CLI_H
#define TRIDENT_CLI_H

#include <stdbool.h>
#include <stddef.h>

// The flag tables of the subcommands (src/cli/cli_flags.h), for --help and
// docs/cli.md (`trident --help-markdown`).
struct cli_command;
extern const struct cli_command cli_generate, cli_prep, cli_plan, cli_import, cli_tokenize, cli_plot,
    cli_data_check, cli_train;
extern const struct cli_command cli_ckpt_info, cli_ckpt_verify, cli_ckpt_export, cli_ckpt_logits;

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
// The tokenizer.json of a trident checkpoint (model_dir: a [checkpoint] dir or
// its step-NNNNNN), for generate and ckpt export without --tokenizer: the copy
// `trident import` keeps next to step-000000 (model_dir/tokenizer.json or
// model_dir/../tokenizer.json), else the run folder's config.ini (docs/design.md
// §9) one or two levels above model_dir (RUN/checkpoints, or
// RUN/checkpoints/step-NNNNNN): its [data] tokenizer or else [data] path's
// tokenizer.json (relative paths as the run was launched: from the current
// folder). Writes the path to out (cap bytes) and returns true when that file
// exists; the caller still checks its identity against the checkpoint's.
// (src/cli/cmd_generate.c)
bool cli_checkpoint_tokenizer(const char *model_dir, char *out, size_t cap);

// The chat template (enum chat_template, data/chat.h) a model trained on the
// data of tokenizer file tok_file was trained with: the chat_template of the
// index.ini beside it (a dataset folder's, `prep --format chat`), else the
// template whose Jinja text the tokenizer_config.json beside it holds (an
// exported folder's), else llama3 or chatml when that text writes
// <|start_header_id|> or <|im_start|> (a Llama 3.x or Qwen folder's own
// template: the same text for conversations without tools, Qwen2.5's default
// system prompt aside), else plain. (src/cli/cmd_generate.c)
int cli_chat_template_of(const char *tok_file);

// trident train CONFIG.ini [section.key=value ...]   (src/cli/cmd_train.c; a failure
// ends every rank of the job from inside, mpi_exit_all)
int cmd_train(int argc, char **argv);

// trident plan CONFIG.ini [--world-size N] [section.key=value ...]   (src/cli/cmd_plan.c)
int cmd_plan(int argc, char **argv);

// trident plot RUN_DIR [--out PNG] [--data FILE]   (src/cli/cmd_plot.c; needs gnuplot)
int cmd_plot(int argc, char **argv);

#endif
