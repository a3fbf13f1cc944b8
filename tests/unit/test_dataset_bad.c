// test_dataset_bad.c: dataset_open (what is O(shards)) and then each shard's
// first read (dataset_validate_all; the loader for bad ids) refuse each kind
// of bad data before any of it is trained on, with STATUS_BAD_INPUT and a message that names the file and the
// problem (docs/design.md §8). Each case starts from a good dataset and breaks one
// thing.
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "data/dataset.h"
#include "test.h"

static char dir[256];

// Good dataset: 2 train shards (vocab, elem_bytes as given), 1 val shard.
// bad_token_at >= 0 puts id vocab at that offset of shard 1.
static void make_dataset(int64_t vocab, int elem_bytes, int64_t bad_token_at, const uint64_t *offsets_override) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0, "rm");
    struct dataset_writer w;
    struct error err = {0};
    EXPECT(dataset_writer_init(&w, dir, vocab, 1, "tok-abc", &err) == STATUS_OK, "%s", err.msg);
    w.force_elem_bytes = elem_bytes;
    int32_t t[100];
    for (int i = 0; i < 100; i++) t[i] = (int32_t)((i * 13) % 50);
    uint64_t off[3] = {0, 40, 100};
    EXPECT(dataset_writer_add(&w, SPLIT_TRAIN, t, 100, off, 2, &err) == STATUS_OK, "%s", err.msg);
    if (bad_token_at >= 0) t[bad_token_at] = (int32_t)vocab;
    EXPECT(dataset_writer_add(&w, SPLIT_TRAIN, t, 100, offsets_override ? offsets_override : off, 2, &err) ==
               STATUS_OK, "%s", err.msg);
    if (bad_token_at >= 0) t[bad_token_at] = 0;
    EXPECT(dataset_writer_add(&w, SPLIT_VAL, t, 30, (uint64_t[]){0, 30}, 1, &err) == STATUS_OK, "%s", err.msg);
    EXPECT(dataset_writer_finish(&w, &err) == STATUS_OK, "%s", err.msg);
}

static void shell(const char *fmt, const char *arg) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, fmt, arg, arg, arg);
    EXPECT(system(cmd) == 0, "command failed: %s", cmd);
}

// Expects dataset_open to fail with BAD_INPUT and the message to hold want1
// and want2.
static void expect_refused(const char *what, int seq_len, int vocab, const char *tok, const char *want1,
                           const char *want2) {
    struct dataset *ds = NULL;
    struct error err = {0};
    enum status s = dataset_open(dir, seq_len, vocab, tok, &ds, &err);
    // dataset_open checks what costs O(shards); the rest runs on each shard's
    // first read, which dataset_validate_all forces for every shard.
    if (s == STATUS_OK) s = dataset_validate_all(ds, &err);
    EXPECT(s == STATUS_BAD_INPUT, "%s: status %d, expected STATUS_BAD_INPUT", what, (int)s);
    EXPECT(strstr(err.msg, want1) && strstr(err.msg, want2), "%s: message '%s' lacks '%s' / '%s'", what, err.msg,
           want1, want2);
    if (getenv("TEST_VERBOSE")) printf("  %-24s %s\n", what, err.msg);
    dataset_close(ds);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/trident_test_bad_%d", (int)getpid());
    struct dataset *ds = NULL;
    struct error err = {0};

    make_dataset(50, 0, -1, NULL);
    EXPECT(dataset_open(dir, 8, 50, "tok-abc", &ds, &err) == STATUS_OK, "good dataset refused: %s", err.msg);
    dataset_close(ds);

    shell("rm '%s/shard-00001.h5'", dir);
    expect_refused("missing shard", 8, 0, NULL, "shard-00001.h5", "missing");

    make_dataset(50, 0, -1, NULL);
    shell("truncate -s 1000 '%s/shard-00001.h5'", dir);
    expect_refused("truncated shard", 8, 0, NULL, "shard-00001.h5", "truncated");

    make_dataset(50, 0, -1, NULL);
    // Same size, one byte near the end (inside the token data) changed.
    shell("f='%s/shard-00000.h5'; n=$(stat -c %%s \"$f\"); printf '\\377' | dd of=\"$f\" bs=1 seek=$((n-60)) conv=notrunc status=none", dir);
    expect_refused("corrupt bytes", 8, 0, NULL, "shard-00000.h5", "checksum");

    make_dataset(50, 0, 37, NULL);
    expect_refused("token id >= vocab", 8, 0, NULL, "shard-00001.h5", "token id 50 at offset 37");
    // Training's path: the open succeeds (O(shards)), the loader refuses the
    // shard on its first read and serves none of its tokens, ever.
    {
        EXPECT(dataset_open(dir, 8, 50, "tok-abc", &ds, &err) == STATUS_OK, "lazy open refused: %s", err.msg);
        struct loader ld;
        EXPECT(loader_init(&ld, ds, SPLIT_TRAIN, 0, 1, 1, 1, 3, &err) == STATUS_OK, "loader_init: %s", err.msg);
        int32_t seq[9];
        enum status s = STATUS_OK;
        uint64_t served = 0;
        for (uint64_t k = 0; k < ds->split_sequences[SPLIT_TRAIN] && !s; k++) {
            s = loader_next(&ld, seq, &err);
            for (int j = 0; !s && j < 9; j++) EXPECT(seq[j] < 50, "loader served id %d >= vocab", seq[j]);
            served += !s;
        }
        EXPECT(s == STATUS_BAD_INPUT && strstr(err.msg, "shard-00001.h5") && strstr(err.msg, "offset 37"),
               "loader over a bad shard: status %d, '%s' (after %llu sequences)", (int)s, err.msg,
               (unsigned long long)served);
        loader_free(&ld);
        dataset_close(ds);
        ds = NULL;
    }

    make_dataset(70000, 2, -1, NULL);
    expect_refused("uint16 with vocab > 65536", 8, 0, NULL, "shard-00000.h5", "uint16 but vocab_size is 70000");

    make_dataset(50, 0, -1, NULL);
    expect_refused("vocab mismatch", 8, 64, NULL, "index.ini", "vocab_size 50 but the model expects 64");
    expect_refused("tokenizer mismatch", 8, 0, "tok-xyz", "index.ini", "tokenizer 'tok-abc'");
    expect_refused("seq_len too long", 300, 0, NULL, "index.ini", "train split holds 200 tokens, fewer than seq_len + 1 = 301");
    expect_refused("seq_len too long: the fix", 300, 0, NULL, "--val-fraction", "shorter seq_len");
    // A val split shorter than one sequence is no validation, not an error:
    // it serves no sequence, and dataset_val_unusable says why and the fix.
    {
        EXPECT(dataset_open(dir, 40, 0, NULL, &ds, &err) == STATUS_OK, "val of 30 tokens at seq_len 40: %s", err.msg);
        char why[512] = "";
        EXPECT(ds->split_sequences[SPLIT_VAL] == 0 && ds->split_sequences[SPLIT_TRAIN] == 4,
               "sequences train %llu val %llu, expected 4 and 0",
               (unsigned long long)ds->split_sequences[SPLIT_TRAIN],
               (unsigned long long)ds->split_sequences[SPLIT_VAL]);
        EXPECT(dataset_val_unusable(ds, why, sizeof why) && strstr(why, "val split") &&
                   strstr(why, "holds 30 tokens, fewer than seq_len + 1 = 41") && strstr(why, "--val-fraction 0"),
               "dataset_val_unusable: '%s'", why);
        dataset_close(ds);
        EXPECT(dataset_open(dir, 8, 0, NULL, &ds, &err) == STATUS_OK, "%s", err.msg);
        EXPECT(!dataset_val_unusable(ds, why, sizeof why), "a val split of 3 sequences called unusable");
        dataset_close(ds);
        ds = NULL;
    }

    // Index lists a shard that is not on disk.
    shell("sed -i 's/^num_shards = 3/num_shards = 4/' '%s/index.ini' && printf '\\n[shard-00003]\\nfile = shard-00009.h5\\n"
          "split = train\\ntokens = 5\\ndocuments = 1\\nbytes = 100\\nchecksum = xxh3-64:0\\n' >> '%s/index.ini'", dir);
    expect_refused("index lists absent shard", 8, 0, NULL, "shard-00009.h5", "missing");

    make_dataset(50, 0, -1, NULL);
    shell("sed -i 's/^tokens = 100/tokens = 99/' '%s/index.ini'", dir);
    // The index no longer adds up: refused by dataset_open itself.
    expect_refused("index sum vs total", 8, 0, NULL, "index.ini", "total_tokens = 230 but the shards hold 228");
    // The index adds up but disagrees with the file: refused on the first read.
    shell("sed -i 's/^total_tokens = 230/total_tokens = 228/' '%s/index.ini'", dir);
    expect_refused("index vs file tokens", 8, 0, NULL, "shard-00000.h5", "index.ini says 99");

    make_dataset(50, 0, -1, (uint64_t[]){0, 60, 90});
    expect_refused("doc_offsets end", 8, 0, NULL, "shard-00001.h5", "/doc_offsets ends at 90");

    make_dataset(50, 0, -1, (uint64_t[]){0, 60, 10});
    expect_refused("doc_offsets order", 8, 0, NULL, "shard-00001.h5", "/doc_offsets[2] = 10");

    make_dataset(50, 0, -1, NULL);
    shell("sed -i 's/^format_version = 1/format_version = 7/' '%s/index.ini'", dir);
    expect_refused("format version", 8, 0, NULL, "index.ini", "format_version 7");

    make_dataset(50, 0, -1, NULL);
    shell("rm '%s/index.ini'", dir);
    expect_refused("no index", 8, 0, NULL, "index.ini", "cannot open");

    // A shard that is not HDF5 at all, with an index that agrees on its bytes:
    // the HDF5 layer's own check names it.
    make_dataset(50, 0, -1, NULL);
    shell("echo 'not an hdf5 file' > '%s/shard-00000.h5'", dir);
    {
        char ipath[300], spath[300];
        snprintf(ipath, sizeof ipath, "%s/index.ini", dir);
        snprintf(spath, sizeof spath, "%s/shard-00000.h5", dir);
        struct index ix;
        struct stat st;
        EXPECT(index_read(ipath, &ix, &err) == STATUS_OK, "%s", err.msg);
        EXPECT(stat(spath, &st) == 0, "stat");
        ix.shards[0].bytes = (uint64_t)st.st_size;
        EXPECT(checksum_file(spath, ix.shards[0].checksum, &err) == STATUS_OK, "%s", err.msg);
        EXPECT(index_write(ipath, &ix, &err) == STATUS_OK, "%s", err.msg);
        index_free(&ix);
    }
    expect_refused("not HDF5", 8, 0, NULL, "shard-00000.h5", "not an HDF5 file");

    // Empty dataset: an index with no shards.
    shell("rm -rf '%s'", dir);
    struct dataset_writer w;
    EXPECT(dataset_writer_init(&w, dir, 50, 1, "tok-abc", &err) == STATUS_OK, "%s", err.msg);
    EXPECT(dataset_writer_finish(&w, &err) == STATUS_OK, "%s", err.msg);
    expect_refused("empty dataset", 8, 0, NULL, "index.ini", "empty dataset");
    // ... and the writer refuses to overwrite it.
    EXPECT(dataset_writer_init(&w, dir, 50, 1, "tok-abc", &err) == STATUS_BAD_INPUT, "existing index overwritten");

    shell("rm -rf '%s'", dir);
    return test_finish("test_dataset_bad");
}
