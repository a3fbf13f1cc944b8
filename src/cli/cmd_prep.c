// cmd_prep.c: `trident prep`: command line to struct prep_options (src/data/prep.h).
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "cli.h"
#include "cli_flags.h"
#include "data/chat.h"
#include "data/prep.h"

// The command line; copied into struct prep_options.
struct prep_args {
    struct cli_list inputs, includes;
    const char *output, *tokenizer, *text_key;
    int vocab_size, format, chat_template; // chat_template: 1 + enum chat_template, 0 when not given
    double val_fraction;
    uint64_t shard_tokens, seed;
    bool recursive, doc_per_file, allow_special, quiet;
};

static const struct config_choice prep_format_choices[] = {{"auto", PREP_FORMAT_AUTO},
                                                           {"text", PREP_FORMAT_TEXT},
                                                           {"jsonl", PREP_FORMAT_JSONL},
                                                           {"chat", PREP_FORMAT_CHAT},
                                                           {NULL, 0}};
static const struct config_choice prep_chat_template_choices[] = {{"plain", 1 + CHAT_TEMPLATE_PLAIN},
                                                                  {"llama3", 1 + CHAT_TEMPLATE_LLAMA3},
                                                                  {"chatml", 1 + CHAT_TEMPLATE_CHATML},
                                                                  {NULL, 0}};

#define P(field) offsetof(struct prep_args, field)
static const struct cli_flag prep_flags[] = {
    {"--input", CLI_PATHS, "PATH", NULL, 0, 0, 0, NULL,
     "text files or folders of them (several allowed, and --input again); a folder is read recursively "
     "(--recursive), hidden files and folders skipped, each folder once (symlink loops are skipped), files "
     "in byte order of their paths (the same on any file system); a file named twice (any spelling, or "
     "also inside a folder given) is read once, with a note; required", P(inputs)},
    {"--include", CLI_LIST, "GLOB", NULL, 0, 0, 0, NULL,
     "a folder's files whose name matches GLOB (fnmatch, e.g. '*.txt'; quote it); default: every regular, "
     "non-hidden file", P(includes)},
    {"--recursive", CLI_SWITCH, NULL, "true", 0, 0, 0, NULL, "a folder's sub-folders' files too", P(recursive)},
    {"--no-recursive", CLI_SWITCH, NULL, NULL, 0, 0, CLI_OFF, NULL,
     "a folder's own files only, not its sub-folders'", P(recursive)},
    {"--output", CLI_PATH, "DIR", NULL, 0, 0, 0, NULL,
     "dataset folder to create, parents too (refused if not empty); a failed or interrupted (Ctrl-C) prep "
     "removes what it wrote; required", P(output)},
    {"--tokenizer", CLI_PATH, "FILE", NULL, 0, 0, 0, NULL,
     "use this tokenizer.json (copied to DIR); exactly one of --tokenizer and --vocab-size", P(tokenizer)},
    {"--vocab-size", CLI_INT, "N", NULL, 257, 1 << 30, 0, NULL,
     "or train a byte-level BPE of N ids on the input (DIR/tokenizer.json)", P(vocab_size)},
    {"--format", CLI_ENUM, "F", "auto", 0, 0, 0, prep_format_choices,
     "auto: JSON Lines for a file named *.jsonl or *.json whose first character is '{' (a note names them; "
     "one starting with '[', a JSON array, is refused), text otherwise, file by file; text: documents "
     "separated by blank lines; jsonl: one JSON object per line, the text in the field --text-key; chat: "
     "JSON Lines of {\"prompt\",\"response\"} or {\"messages\":[{\"role\",\"content\"}...]}, rendered "
     "\"User: P\\nAssistant: R\", shards with a /loss_mask of 1 on response tokens (docs/formats.md, "
     "\"Chat\"; takes an existing --tokenizer and no --text-key)", P(format)},
    {"--chat-template", CLI_ENUM, "T", NULL, 0, 0, CLI_HIDDEN_DEFAULT, prep_chat_template_choices,
     "--format chat's template (default plain, above): llama3 (Llama 3.1 Instruct's header tokens) or chatml "
     "(<|im_start|>, Qwen2.5's), rendered as transformers' apply_chat_template renders them, the loss mask "
     "on assistant contents and their end tokens; the tokenizer must have the template's special tokens; "
     "recorded in index.ini (docs/formats.md, \"Chat\")", P(chat_template)},
    {"--text-key", CLI_STRING, "KEY", NULL, 0, 0, 0, NULL,
     "JSON Lines: the field holding a document's text (default \"text\")", P(text_key)},
    {"--doc-per-file", CLI_SWITCH, NULL, NULL, 0, 0, 0, NULL,
     "text files: each file is one document (blank lines kept inside), so the end-of-text id goes between "
     "files; JSON Lines stay one per record", P(doc_per_file)},
    {"--allow-special-tokens", CLI_SWITCH, NULL, NULL, 0, 0, 0, NULL,
     "special-token text in documents (<|endoftext|>) becomes its id; by default it is encoded as ordinary "
     "text", P(allow_special)},
    {"--val-fraction", CLI_FLOAT, "F", "0.01", 0, 1, CLI_MAX_EXCLUSIVE, NULL,
     "share of documents for validation; a split too small for one global batch of configs/tiny.ini (the "
     "default run) is reported with the fraction that would fit one", P(val_fraction)},
    {"--shard-tokens", CLI_UINT64, "N", "16777216", 1, INFINITY, 0, NULL, "tokens per shard, about",
     P(shard_tokens)},
    {"--seed", CLI_UINT64, "S", "1234", 0, INFINITY, 0, NULL, "seed of the train/validation split", P(seed)},
    {"--quiet", CLI_SWITCH, NULL, NULL, 0, 0, 0, NULL, "no progress lines on stderr", P(quiet)},
};
#undef P

const struct cli_command cli_prep = {
    .name = "prep",
    .synopsis = "--input PATH... --output DIR (--tokenizer FILE | --vocab-size N) [options]",
    .summary = "Raw text (plain, JSON Lines or chat conversations) to a dataset folder of HDF5 token shards.",
    .flags = prep_flags,
    .n_flags = CLI_N(prep_flags),
    .notes =
        "Input must be UTF-8 text: a file with a NUL byte, compressed (gzip, zstd, xz, bzip2, zip),\n"
        "UTF-16, or more than 1% invalid UTF-8 is refused by name before anything is written (exit 2);\n"
        "a UTF-8 byte-order mark at a file's start is skipped. --format chat input in which no\n"
        "conversation has an assistant turn (nothing to train on) is refused too.\n"
        "Encodes on all cores (OMP_NUM_THREADS); the output does not depend on the thread count.\n"
        "stdout ends with a line 'prep_stats: {JSON}' (documents, tokens, bytes, seconds, threads,\n"
        "mb_per_s, peak_rss_bytes, files, jsonl_files, jsonl_detected, left_out, duplicates,\n"
        "invalid_utf8_bytes, chat_no_assistant, train_documents, train_tokens, val_documents, val_tokens,\n"
        "val_seq_len, val_sequences, val_sequences_needed).\n",
};

// The default run (`make run`, scripts/run_default.sh) trains configs/tiny.ini;
// prep reports a validation split too small for one of its global batches.
// tests/e2e/prep_inputs.sh checks these against configs/tiny.ini.
#define PREP_DEFAULT_CONFIG "configs/tiny.ini"
#define PREP_DEFAULT_SEQ_LEN 128
#define PREP_DEFAULT_GLOBAL_BATCH 16

static int bad_arg(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "trident prep: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n(trident prep --help for usage)\n");
    return STATUS_BAD_INPUT;
}

// Warns on stderr that the validation split (val_seq sequences) is too small
// for one global batch of the default config and what the default run does
// with it, naming the --val-fraction that would give one batch with a 25%
// margin, or saying the corpus is too small for that.
static void warn_val_split(const struct prep_options *opt, const struct prep_stats *s, uint64_t val_seq) {
    const double need = (double)PREP_DEFAULT_GLOBAL_BATCH * PREP_DEFAULT_SEQ_LEN + 1; // tokens
    double total = (double)(s->tokens[0] + s->tokens[1]);
    // Train skips validation when the split has fewer sequences than a
    // global batch, none at all when it holds 1..seq_len tokens.
    int none_fits = s->tokens[1] > 0 && s->tokens[1] < PREP_DEFAULT_SEQ_LEN + 1;
    fprintf(stderr, "prep: warning: the validation split holds %llu sequences of seq_len %d, fewer than one global "
            "batch (global_batch_size = %d) of %s, the default run, which would train without validation%s: ",
            (unsigned long long)val_seq, PREP_DEFAULT_SEQ_LEN, PREP_DEFAULT_GLOBAL_BATCH, PREP_DEFAULT_CONFIG,
            none_fits ? " (no validation sequence fits)" : "");
    // Documents go whole to a split, so tokens follow the fraction only about:
    // the fraction scaled by the tokens missing, with a 25% margin, rounded up
    // to two significant digits.
    double f = s->tokens[1] > 0 ? 1.25 * opt->val_fraction * need / (double)s->tokens[1]
                                : 1.25 * need / MAX(total, 1.0);
    double scale = 1;
    while (f * scale < 10) scale *= 10;
    f = ceil(f * scale) / scale;
    if (f < 0.5)
        fprintf(stderr, "--val-fraction %g (now %g) would give about %.0f tokens, enough for one batch; "
                "--val-fraction 0 makes no validation split\n", f, opt->val_fraction, f * total);
    else
        fprintf(stderr, "the whole corpus holds %.0f tokens, too few for a validation batch of %.0f tokens and a "
                "training split; --val-fraction 0 makes no validation split\n", total, need);
}

// SIGINT, SIGTERM, SIGHUP: prep stops at its next block and removes what it
// wrote (prep_options.stop); a second SIGINT within 5 s exits at once,
// leaving what is there.
static volatile sig_atomic_t prep_stop;
static volatile sig_atomic_t prep_first_sigint_s;
static void on_prep_signal(int sig) {
    if (sig == SIGINT) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long now = (long)ts.tv_sec + 1;
        if (prep_first_sigint_s && now - prep_first_sigint_s <= 5) {
            static const char msg[] = "trident prep: a second SIGINT: exiting without removing the output\n";
            ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
            (void)w;
            _exit(130);
        }
        prep_first_sigint_s = (sig_atomic_t)now;
    }
    prep_stop = sig;
}

int cmd_prep(int argc, char **argv) {
    if (cli_is_help(argc, argv)) {
        cli_print_help(&cli_prep, stdout);
        return STATUS_OK;
    }
    struct prep_args o = {0};
    struct prep_options opt = {0};
    struct error perr = {0};
    int rc = STATUS_BAD_INPUT;
    if (cli_parse(&cli_prep, argc, argv, &o, &perr)) {
        rc = bad_arg("%s%s", perr.msg, "");
        goto out;
    }
    opt = (struct prep_options){.inputs = o.inputs.values, .n_inputs = o.inputs.n,
                                .includes = o.includes.values, .n_includes = o.includes.n,
                                .recursive = o.recursive, .doc_per_file = o.doc_per_file, .output = o.output,
                                .tokenizer_path = o.tokenizer, .vocab_size = o.vocab_size,
                                .format = (enum prep_format)o.format, .text_key = o.text_key,
                                .allow_special = o.allow_special, .val_fraction = o.val_fraction,
                                .shard_tokens = o.shard_tokens, .seed = o.seed, .quiet = o.quiet,
                                .chat_template = o.chat_template ? o.chat_template - 1 : CHAT_TEMPLATE_PLAIN};
    if (opt.n_inputs == 0 || !opt.output) {
        rc = bad_arg("--input and --output are required%s%s", "", "");
        goto out;
    }
    if ((opt.tokenizer_path != NULL) == (opt.vocab_size > 0)) {
        rc = bad_arg("give exactly one of --tokenizer FILE and --vocab-size N%s%s", "", "");
        goto out;
    }
    if (opt.format == PREP_FORMAT_CHAT && (opt.vocab_size > 0 || opt.text_key)) {
        rc = bad_arg("--format chat takes an existing --tokenizer (the chat template's marks would be trained "
                     "into a new one) and no --text-key%s%s", "", "");
        goto out;
    }
    if (o.chat_template && opt.format != PREP_FORMAT_CHAT) {
        rc = bad_arg("--chat-template needs --format chat%s%s", "", "");
        goto out;
    }
    if (opt.text_key && opt.format == PREP_FORMAT_TEXT) {
        rc = bad_arg("--text-key needs JSON Lines input, not --format text%s%s", "", "");
        goto out;
    }
    struct prep_stats stats;
    struct error err = {0};
    struct sigaction sa = {0};
    sa.sa_handler = on_prep_signal;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    opt.stop = &prep_stop;
    enum status st = prep_run(&opt, &stats, &err);
    if (st) {
        fprintf(stderr, "trident prep: %s\n", err.msg);
        rc = prep_stop ? 128 + (int)prep_stop : (int)st; // a stop: the shell's 128 + signal
        goto out;
    }
    printf("prep: %s: %d shards; train %llu documents, %llu tokens; val %llu documents, %llu tokens\n", opt.output,
           stats.shards, (unsigned long long)stats.documents[0], (unsigned long long)stats.tokens[0],
           (unsigned long long)stats.documents[1], (unsigned long long)stats.tokens[1]);
    // Validation sequences as dataset_open counts them for the default config.
    uint64_t val_seq = stats.tokens[1] > 0 ? (stats.tokens[1] - 1) / PREP_DEFAULT_SEQ_LEN : 0;
    if (opt.val_fraction > 0 && val_seq < PREP_DEFAULT_GLOBAL_BATCH) warn_val_split(&opt, &stats, val_seq);
    printf("prep_stats: {\"documents\": %llu, \"tokens\": %llu, \"bytes\": %llu, \"seconds\": %.3f, \"threads\": %d, "
           "\"mb_per_s\": %.3f, \"peak_rss_bytes\": %llu, \"files\": %d, \"jsonl_files\": %d, "
           "\"jsonl_detected\": %d, \"left_out\": %d, \"duplicates\": %d, \"invalid_utf8_bytes\": %llu, "
           "\"chat_no_assistant\": %llu, \"train_documents\": %llu, "
           "\"train_tokens\": %llu, \"val_documents\": %llu, \"val_tokens\": %llu, \"val_seq_len\": %d, "
           "\"val_sequences\": %llu, \"val_sequences_needed\": %d}\n",
           (unsigned long long)(stats.documents[0] + stats.documents[1]),
           (unsigned long long)(stats.tokens[0] + stats.tokens[1]), (unsigned long long)stats.bytes,
           stats.encode_seconds, stats.threads, (double)stats.bytes / 1e6 / MAX(stats.encode_seconds, 1e-9),
           (unsigned long long)stats.peak_rss_bytes, stats.files, stats.jsonl_files, stats.jsonl_detected,
           stats.left_out, stats.duplicates, (unsigned long long)stats.invalid_utf8_bytes,
           (unsigned long long)stats.chat_no_assistant, (unsigned long long)stats.documents[0],
           (unsigned long long)stats.tokens[0], (unsigned long long)stats.documents[1],
           (unsigned long long)stats.tokens[1], PREP_DEFAULT_SEQ_LEN, (unsigned long long)val_seq,
           PREP_DEFAULT_GLOBAL_BATCH);
    rc = STATUS_OK;
out:
    cli_free(&cli_prep, &o);
    return rc;
}
