// cli_flags.h: a subcommand's command line as a table of flags (and
// positional arguments), parsed by one function, with its --help text and its
// section of docs/cli.md generated from the same rows. The shape follows the
// config key table (src/config/config_keys.c): name, type, range, default,
// doc, and the offset of the field that receives the value in the
// subcommand's own options struct.
//
// Syntax: `--name VALUE` (the value is the next argument whatever it starts
// with, so `--temperature -1` reaches the range check), `--name` for a switch;
// an argument not starting with '-' (or "-" alone) is the next positional.
// `--name=VALUE` and single-letter flags are not taken (docs/cli.md).
#ifndef TRIDENT_CLI_FLAGS_H
#define TRIDENT_CLI_FLAGS_H

#include <math.h> // INFINITY, for the tables
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/common.h"
#include "config/config.h" // struct config_choice

enum cli_type {
    CLI_SWITCH, // no value; bool: true (false with CLI_OFF)
    CLI_INT,    // int in [min, max]
    CLI_INT64,  // int64_t in [min, max]
    CLI_UINT64, // uint64_t in [min, max] (max INFINITY: up to 2^64 - 1); seeds
    CLI_FLOAT,  // double in [min, max], CLI_MIN/MAX_EXCLUSIVE
    CLI_SIZE,   // int64_t bytes: a number (fractions too) with an optional K, M,
                // G or T suffix (either case, powers of 1024; of 1000 with
                // CLI_SIZE_DECIMAL), a B after it allowed; a bare number is
                // bytes (GiB with CLI_SIZE_GIB); in [min, max] bytes
    CLI_ENUM,   // int: the value of one of choices, named as written
    CLI_STRING, // const char *: the argument itself (text)
    CLI_PATH,   // const char *: the argument itself (a file or folder)
    CLI_LIST,   // struct cli_list: each occurrence appends its value; several
                // rows may share one list (their values stay in command-line
                // order; cli_list.flag says which row gave each)
    CLI_PATHS,  // struct cli_list: one or more values, the arguments up to the
                // next one that starts with "--" (prep --input A B C)
};

#define CLI_MIN_EXCLUSIVE 1u // value > min rather than >= min
#define CLI_MAX_EXCLUSIVE 2u // value < max rather than <= max
#define CLI_OFF 4u           // a CLI_SWITCH that stores false (--no-recursive)
#define CLI_OPTIONAL 8u      // a positional that may be left out
#define CLI_HIDDEN_DEFAULT 16u // default not shown (documented in doc)
#define CLI_SIZE_DECIMAL 32u // CLI_SIZE suffixes are powers of 1000 (Hugging Face's "5GB")
#define CLI_SIZE_GIB 64u     // CLI_SIZE: a bare number is GiB

// One row. A name starting with '-' is a flag; any other name is a positional
// argument (in table order; a CLI_LIST positional takes every one left).
struct cli_flag {
    const char *name;    // "--max-new-tokens", or "MODEL_DIR"
    enum cli_type type;
    const char *metavar; // the value's name in usage ("N", "FILE"); NULL for a switch
    const char *def;     // default, written as on the command line; NULL: none
                         // (the field stays zero / NULL); switches: NULL or "true"
    double min, max;     // numeric bounds (-INFINITY / INFINITY: unbounded)
    unsigned flags;      // CLI_*
    const struct config_choice *choices; // CLI_ENUM: ends with {NULL, 0}
    const char *doc;     // meaning; '\n' not needed (wrapped by --help)
    size_t offset;       // of the receiving field in the options struct
};

// The values of a CLI_LIST or CLI_PATHS field, in command-line order.
struct cli_list {
    int n;
    const char **values; // n arguments (pointers into argv)
    int *flag;           // n: the table row that gave each value
};

// A subcommand: its table and the text around it in --help and docs/cli.md.
struct cli_command {
    const char *name;     // "generate", "ckpt export"
    const char *synopsis; // after "usage: trident NAME "
    const char *summary;  // a sentence or a paragraph: what it does
    const struct cli_flag *flags;
    int n_flags;
    const char *notes;    // after the flag list (may be NULL)
};

#define CLI_N(table) ((int)(sizeof(table) / sizeof((table)[0])))

// Parses argv[1..argc-1] (argv[0]: the subcommand's name) into opts, the
// options struct the table's offsets point into: first every row's default
// (def), then each argument in order. Lists are allocated (cli_free).
// Errors (STATUS_BAD_INPUT, err naming the flag, the value found and what was
// expected): "unknown option '--x'", "--x needs a value", "--x 'v': expected
// an integer in [1, 64]", "--f 'v': expected one of: a, b", "MODEL_DIR
// is required", "unexpected argument 'x'". A bad default in the table is a
// bug (CHECK).
enum status cli_parse(const struct cli_command *cmd, int argc, char **argv, void *opts, struct error *err);
// Frees the lists cli_parse allocated in opts (NULL-safe per list).
void cli_free(const struct cli_command *cmd, void *opts);

// True when argv is the subcommand's name and --help or -h (as main passes it).
bool cli_is_help(int argc, char **argv);
// The usage: "usage: trident NAME SYNOPSIS", the summary, each row with its
// type, range and default, the notes; wrapped at 100 columns.
void cli_print_help(const struct cli_command *cmd, FILE *f);
// Two or more lines of `trident --help`: "  trident NAME SYNOPSIS", then the
// summary's first sentence indented by 6.
void cli_print_synopsis(const struct cli_command *cmd, FILE *f);
// The command's section of docs/cli.md: a "## trident NAME" heading, the
// synopsis, summary, one Markdown table of its rows (argument, type, range,
// default, meaning), the notes.
void cli_write_markdown(const struct cli_command *cmd, FILE *f);

#endif
