// cmd_prep.c: `trident prep`: command line to struct prep_options (src/data/prep.h).
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "cli.h"
#include "data/chat.h"
#include "data/prep.h"

static const char *prep_usage =
    "usage: trident prep --input PATH... --output DIR [--tokenizer FILE | --vocab-size N]\n"
    "                    [--include GLOB]... [--no-recursive] [--doc-per-file]\n"
    "                    [--format auto|text|jsonl|chat] [--chat-template plain|llama3|chatml]\n"
    "                    [--text-key KEY] [--allow-special-tokens]\n"
    "                    [--val-fraction F] [--shard-tokens N] [--seed S] [--quiet]\n"
    "  --input PATH...     text files or folders of them (several allowed); a folder is read\n"
    "                      recursively (--recursive, the default), hidden files and folders\n"
    "                      skipped, each folder once (symlink loops are skipped), files in\n"
    "                      byte order of their paths (the same on any file system)\n"
    "  --include GLOB      a folder's files whose name matches GLOB (fnmatch, e.g. '*.txt'; quote\n"
    "                      it); repeatable; default: every regular, non-hidden file\n"
    "  --no-recursive      a folder's own files only, not its sub-folders'\n"
    "  --output DIR        dataset folder to create, parents too (refused if not empty);\n"
    "                      a failed or interrupted (Ctrl-C) prep removes what it wrote\n"
    "  --tokenizer FILE    use this tokenizer.json (copied to DIR)\n"
    "  --vocab-size N      or train a byte-level BPE of N ids on the input (DIR/tokenizer.json)\n"
    "  --format F          auto (default): JSON Lines for a file named *.jsonl or *.json whose first\n"
    "                      character is '{' (a note names them; one starting with '[', a JSON\n"
    "                      array, is refused), text otherwise, file by file;\n"
    "                      text: documents separated by blank lines; jsonl: one JSON object per\n"
    "                      line, the text in the field --text-key (default \"text\");\n"
    "                      chat: JSON Lines of {\"prompt\",\"response\"} or {\"messages\":[{\"role\",\n"
    "                      \"content\"}...]}, rendered \"User: P\\nAssistant: R\", shards with a\n"
    "                      /loss_mask of 1 on response tokens (docs/formats.md, \"Chat\")\n"
    "  --chat-template T   --format chat's template: plain (default, above), llama3 (Llama 3.1\n"
    "                      Instruct's header tokens) or chatml (<|im_start|>, Qwen2.5's), as\n"
    "                      transformers' apply_chat_template renders them; the loss mask on\n"
    "                      assistant contents and their end tokens; recorded in index.ini\n"
    "  --doc-per-file      text files: each file is one document (blank lines kept inside), so\n"
    "                      the end-of-text id goes between files; JSON Lines stay one per record\n"
    "  --allow-special-tokens  special-token text in documents (<|endoftext|>) becomes its id;\n"
    "                      by default it is encoded as ordinary text\n"
    "  --val-fraction F    share of documents for validation, in [0, 1) (default 0.01); a split\n"
    "                      too small for one global batch of configs/tiny.ini (the default run)\n"
    "                      is reported with the fraction that would fit one\n"
    "  --shard-tokens N    tokens per shard, about (default 16777216)\n"
    "  --seed S            seed of the train/validation split (default 1234)\n"
    "  --quiet             no progress lines on stderr\n"
    "Input must be UTF-8 text: a file with a NUL byte, compressed (gzip, zstd, xz, bzip2, zip),\n"
    "UTF-16, or more than 1% invalid UTF-8 is refused by name before anything is written (exit 2).\n"
    "Encodes on all cores (OMP_NUM_THREADS); the output does not depend on the thread count.\n"
    "stdout ends with a line 'prep_stats: {JSON}' (documents, tokens, bytes, seconds, threads,\n"
    "mb_per_s, peak_rss_bytes, files, jsonl_files, jsonl_detected, left_out, invalid_utf8_bytes,\n"
    "train_documents, train_tokens, val_documents, val_tokens, val_seq_len, val_sequences,\n"
    "val_sequences_needed).\n";

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

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-') return 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return 0;
    *out = v;
    return 1;
}

// Warns on stderr that the validation split (val_seq sequences) is too small
// for one global batch of the default config and what the default run does
// with it, naming the --val-fraction that would give one batch with a 25%
// margin, or saying the corpus is too small for that.
static void warn_val_split(const struct prep_options *opt, const struct prep_stats *s, uint64_t val_seq) {
    const double need = (double)PREP_DEFAULT_GLOBAL_BATCH * PREP_DEFAULT_SEQ_LEN + 1; // tokens
    double total = (double)(s->tokens[0] + s->tokens[1]);
    // dataset_open refuses a val split of 1..seq_len tokens; train skips
    // validation when the split has fewer sequences than a global batch.
    int refused = s->tokens[1] > 0 && s->tokens[1] < PREP_DEFAULT_SEQ_LEN + 1;
    fprintf(stderr, "prep: warning: the validation split holds %llu sequences of seq_len %d, fewer than one global "
            "batch (global_batch_size = %d) of %s, the default run, which %s: ",
            (unsigned long long)val_seq, PREP_DEFAULT_SEQ_LEN, PREP_DEFAULT_GLOBAL_BATCH, PREP_DEFAULT_CONFIG,
            refused ? "refuses the dataset (no validation sequence fits)" : "would train without validation");
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
    struct prep_options opt = {.format = PREP_FORMAT_AUTO, .val_fraction = 0.01, .shard_tokens = 1 << 24,
                               .seed = 1234, .recursive = 1};
    const char **inputs = xcalloc((size_t)argc, sizeof *inputs);
    const char **includes = xcalloc((size_t)argc, sizeof *includes);
    int rc = STATUS_BAD_INPUT, chat_template_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t u;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(prep_usage, stdout);
            rc = STATUS_OK;
            goto out;
        } else if (!strcmp(a, "--allow-special-tokens")) {
            opt.allow_special = 1;
            continue;
        } else if (!strcmp(a, "--recursive") || !strcmp(a, "--no-recursive")) {
            opt.recursive = a[2] == 'r';
            continue;
        } else if (!strcmp(a, "--doc-per-file")) {
            opt.doc_per_file = 1;
            continue;
        } else if (!strcmp(a, "--quiet")) {
            opt.quiet = 1;
            continue;
        } else if (!strcmp(a, "--input")) {
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) inputs[opt.n_inputs++] = argv[++i];
            if (opt.n_inputs == 0) {
                rc = bad_arg("%s needs at least one path%s", a, "");
                goto out;
            }
            continue;
        }
        if (!v) {
            rc = bad_arg("%s needs a value%s", a, "");
            goto out;
        }
        i++;
        if (!strcmp(a, "--output")) opt.output = v;
        else if (!strcmp(a, "--tokenizer")) opt.tokenizer_path = v;
        else if (!strcmp(a, "--text-key")) opt.text_key = v;
        else if (!strcmp(a, "--include")) includes[opt.n_includes++] = v;
        else if (!strcmp(a, "--vocab-size")) {
            if (!parse_u64(v, &u) || u < 257 || u > (1u << 30)) {
                rc = bad_arg("--vocab-size '%s': expected an integer in [257, 2^30]%s", v, "");
                goto out;
            }
            opt.vocab_size = (int)u;
        } else if (!strcmp(a, "--format")) {
            if (!strcmp(v, "text")) opt.format = PREP_FORMAT_TEXT;
            else if (!strcmp(v, "jsonl")) opt.format = PREP_FORMAT_JSONL;
            else if (!strcmp(v, "auto")) opt.format = PREP_FORMAT_AUTO;
            else if (!strcmp(v, "chat")) opt.format = PREP_FORMAT_CHAT;
            else {
                rc = bad_arg("--format '%s': expected auto, text, jsonl or chat%s", v, "");
                goto out;
            }
        } else if (!strcmp(a, "--chat-template")) {
            int t = chat_template_parse(v);
            if (t < 0) {
                rc = bad_arg("--chat-template '%s': expected plain, llama3 or chatml%s", v, "");
                goto out;
            }
            opt.chat_template = t, chat_template_given = 1;
        } else if (!strcmp(a, "--val-fraction")) {
            char *end;
            opt.val_fraction = strtod(v, &end);
            if (*end || !*v || !(opt.val_fraction >= 0 && opt.val_fraction < 1)) {
                rc = bad_arg("--val-fraction '%s': expected a number in [0, 1)%s", v, "");
                goto out;
            }
        } else if (!strcmp(a, "--shard-tokens")) {
            if (!parse_u64(v, &opt.shard_tokens) || opt.shard_tokens == 0) {
                rc = bad_arg("--shard-tokens '%s': expected a positive integer%s", v, "");
                goto out;
            }
        } else if (!strcmp(a, "--seed")) {
            if (!parse_u64(v, &opt.seed)) {
                rc = bad_arg("--seed '%s': expected a non-negative integer%s", v, "");
                goto out;
            }
        } else {
            rc = bad_arg("unknown option '%s'%s", a, "");
            goto out;
        }
    }
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
    if (chat_template_given && opt.format != PREP_FORMAT_CHAT) {
        rc = bad_arg("--chat-template needs --format chat%s%s", "", "");
        goto out;
    }
    if (opt.text_key && opt.format == PREP_FORMAT_TEXT) {
        rc = bad_arg("--text-key needs JSON Lines input, not --format text%s%s", "", "");
        goto out;
    }
    opt.inputs = inputs;
    opt.includes = includes;
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
           "\"jsonl_detected\": %d, \"left_out\": %d, \"invalid_utf8_bytes\": %llu, \"train_documents\": %llu, "
           "\"train_tokens\": %llu, \"val_documents\": %llu, \"val_tokens\": %llu, \"val_seq_len\": %d, "
           "\"val_sequences\": %llu, \"val_sequences_needed\": %d}\n",
           (unsigned long long)(stats.documents[0] + stats.documents[1]),
           (unsigned long long)(stats.tokens[0] + stats.tokens[1]), (unsigned long long)stats.bytes,
           stats.encode_seconds, stats.threads, (double)stats.bytes / 1e6 / MAX(stats.encode_seconds, 1e-9),
           (unsigned long long)stats.peak_rss_bytes, stats.files, stats.jsonl_files, stats.jsonl_detected,
           stats.left_out, (unsigned long long)stats.invalid_utf8_bytes, (unsigned long long)stats.documents[0],
           (unsigned long long)stats.tokens[0], (unsigned long long)stats.documents[1],
           (unsigned long long)stats.tokens[1], PREP_DEFAULT_SEQ_LEN, (unsigned long long)val_seq,
           PREP_DEFAULT_GLOBAL_BATCH);
    rc = STATUS_OK;
out:
    free(inputs);
    free(includes);
    return rc;
}
