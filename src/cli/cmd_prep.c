// cmd_prep.c: `trident prep`: command line to struct prep_options (src/data/prep.h).
#include <errno.h>
#include <string.h>

#include "base/common.h"
#include "cli.h"
#include "data/prep.h"

static const char *prep_usage =
    "usage: trident prep --input PATH... --output DIR [--tokenizer FILE | --vocab-size N]\n"
    "                    [--format text|jsonl [--text-key KEY]] [--allow-special-tokens]\n"
    "                    [--val-fraction F] [--shard-tokens N] [--seed S] [--quiet]\n"
    "  --input PATH...     text files or folders of them (several allowed)\n"
    "  --output DIR        dataset folder to create (refused if it holds an index.ini)\n"
    "  --tokenizer FILE    use this tokenizer.json (copied to DIR)\n"
    "  --vocab-size N      or train a byte-level BPE of N ids on the input (DIR/tokenizer.json)\n"
    "  --format F          text: documents separated by blank lines (default); jsonl: one JSON\n"
    "                      object per line, the text in the field --text-key (default \"text\")\n"
    "  --allow-special-tokens  special-token text in documents (<|endoftext|>) becomes its id;\n"
    "                      by default it is encoded as ordinary text\n"
    "  --val-fraction F    share of documents for validation, in [0, 1) (default 0.01)\n"
    "  --shard-tokens N    tokens per shard, about (default 16777216)\n"
    "  --seed S            seed of the train/validation split (default 1234)\n"
    "  --quiet             no progress lines on stderr\n"
    "Encodes on all cores (OMP_NUM_THREADS); the output does not depend on the thread count.\n"
    "stdout ends with a line 'prep_stats: {JSON}' (documents, tokens, bytes, seconds, threads,\n"
    "mb_per_s, peak_rss_bytes).\n";

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

int cmd_prep(int argc, char **argv) {
    struct prep_options opt = {.format = PREP_FORMAT_TEXT, .val_fraction = 0.01, .shard_tokens = 1 << 24,
                               .seed = 1234};
    const char **inputs = xcalloc((size_t)argc, sizeof *inputs);
    int rc = STATUS_BAD_INPUT;
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
        else if (!strcmp(a, "--vocab-size")) {
            if (!parse_u64(v, &u) || u < 257 || u > (1u << 30)) {
                rc = bad_arg("--vocab-size '%s': expected an integer in [257, 2^30]%s", v, "");
                goto out;
            }
            opt.vocab_size = (int)u;
        } else if (!strcmp(a, "--format")) {
            if (!strcmp(v, "text")) opt.format = PREP_FORMAT_TEXT;
            else if (!strcmp(v, "jsonl")) opt.format = PREP_FORMAT_JSONL;
            else {
                rc = bad_arg("--format '%s': expected text or jsonl%s", v, "");
                goto out;
            }
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
    if (opt.text_key && opt.format != PREP_FORMAT_JSONL) {
        rc = bad_arg("--text-key needs --format jsonl%s%s", "", "");
        goto out;
    }
    opt.inputs = inputs;
    struct prep_stats stats;
    struct error err = {0};
    enum status st = prep_run(&opt, &stats, &err);
    if (st) {
        fprintf(stderr, "trident prep: %s\n", err.msg);
        rc = st;
        goto out;
    }
    printf("prep: %s: %d shards; train %llu documents, %llu tokens; val %llu documents, %llu tokens\n", opt.output,
           stats.shards, (unsigned long long)stats.documents[0], (unsigned long long)stats.tokens[0],
           (unsigned long long)stats.documents[1], (unsigned long long)stats.tokens[1]);
    printf("prep_stats: {\"documents\": %llu, \"tokens\": %llu, \"bytes\": %llu, \"seconds\": %.3f, \"threads\": %d, "
           "\"mb_per_s\": %.3f, \"peak_rss_bytes\": %llu}\n",
           (unsigned long long)(stats.documents[0] + stats.documents[1]),
           (unsigned long long)(stats.tokens[0] + stats.tokens[1]), (unsigned long long)stats.bytes,
           stats.encode_seconds, stats.threads, (double)stats.bytes / 1e6 / MAX(stats.encode_seconds, 1e-9),
           (unsigned long long)stats.peak_rss_bytes);
    rc = STATUS_OK;
out:
    free(inputs);
    return rc;
}
