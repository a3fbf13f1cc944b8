// test_loss_mask.c: /loss_mask in shards (docs/formats.md): written by
// dataset_writer_add_masked, served by loader_next_masked aligned with the
// tokens (a sequence crossing a shard boundary included), all ones for a
// shard without one, and a value other than 0 or 1 refused on the shard's
// first read (dataset_validate_all, which data-check runs) naming
// /loss_mask and the offset. A mask read on the cold tier is retried on an
// I/O error as token reads are.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/dataset.h"
#include "test.h"

static char dir[256];

// Train: shard 0 (60 tokens, masked or not), shard 1 (60 tokens, masked);
// val: 30 tokens unmasked. Token i of the train stream is id i % 50 and its
// mask (i / 7) % 2 in the masked shards. bad_at >= 0 puts a 2 there in shard 1.
static void make(int mask_shard0, int bad_at) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0, "rm");
    struct dataset_writer w;
    struct error err = {0};
    EXPECT(dataset_writer_init(&w, dir, 64, 1, "tok-mask", &err) == STATUS_OK, "%s", err.msg);
    int32_t t[60];
    uint8_t m[60];
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 60; i++) t[i] = (60 * s + i) % 50, m[i] = (uint8_t)(((60 * s + i) / 7) % 2);
        if (s == 1 && bad_at >= 0) m[bad_at] = 2;
        EXPECT(dataset_writer_add_masked(&w, SPLIT_TRAIN, t, s == 0 && !mask_shard0 ? NULL : m, 60,
                                         (uint64_t[]){0, 25, 60}, 2, &err) == STATUS_OK, "%s", err.msg);
    }
    EXPECT(dataset_writer_add(&w, SPLIT_VAL, t, 30, (uint64_t[]){0, 30}, 1, &err) == STATUS_OK, "%s", err.msg);
    EXPECT(dataset_writer_finish(&w, &err) == STATUS_OK, "%s", err.msg);
}

// Every train sequence (T = 10) through the loader: mask matches the rule.
static void check_served(int mask_shard0) {
    make(mask_shard0, -1);
    struct dataset *ds;
    struct error err = {0};
    EXPECT(dataset_open(dir, 10, 64, "tok-mask", &ds, &err) == STATUS_OK, "%s", err.msg);
    struct loader ld;
    int n = (int)ds->split_sequences[SPLIT_TRAIN]; // (120 - 1) / 10 = 11
    EXPECT(loader_init(&ld, ds, SPLIT_TRAIN, 0, 1, 1, n, 5, &err) == STATUS_OK, "%s", err.msg);
    int32_t tok[11];
    uint8_t mask[11];
    int bad = 0, crossing = 0;
    for (int k = 0; k < n; k++) {
        uint64_t seq = loader_sequence_at(&ld, 0, (uint64_t)k);
        EXPECT(loader_next_masked(&ld, tok, mask, &err) == STATUS_OK, "%s", err.msg);
        for (int i = 0; i < 11; i++) {
            int at = (int)seq * 10 + i;
            int want = at < 60 && !mask_shard0 ? 1 : (at / 7) % 2;
            bad += tok[i] != at % 50 || mask[i] != want;
        }
        crossing += seq * 10 < 60 && seq * 10 + 10 >= 60;
    }
    EXPECT(bad == 0 && crossing == 1, "mask_shard0=%d: %d tokens or mask values wrong (%d crossing)", mask_shard0,
           bad, crossing);
    loader_free(&ld);
    dataset_close(ds);
}

// Mask reads on the cold tier go through the retry loop token reads use:
// with cold accesses 2..5 of shard 1 failing (TRIDENT_DATA_FAULT, set before
// any access), its open (access 1) succeeds, the mask read fails all
// CACHE_COLD_TRIES tries and gives up naming the shard and the cold tier
// (without the loop it never reached the fault and succeeded), and the next
// mask read (access 6) serves the right values.
static void check_cold_retry(void) {
    make(1, -1);
    struct dataset *ds;
    struct error err = {0};
    EXPECT(dataset_open(dir, 10, 64, "tok-mask", &ds, &err) == STATUS_OK, "%s", err.msg);
    struct shard *h5;
    EXPECT(dataset_shard_get(ds, 1, &h5, &err) == STATUS_OK, "open shard 1: %s", err.msg);
    uint8_t mask[60];
    hsize_t dims[1] = {60};
    hid_t space = H5Screate_simple(1, dims, NULL);
    enum status s = dataset_read_mask(ds, 1, 0, 60, mask, space, &err);
    EXPECT(s == STATUS_RUNTIME && strstr(err.msg, "shard-00001.h5") && strstr(err.msg, "cold tier") &&
               strstr(err.msg, "failed 4 reads"), "mask read under 4 EIOs: status %d, '%s'", (int)s, err.msg);
    memset(mask, 9, sizeof mask);
    s = dataset_read_mask(ds, 1, 0, 60, mask, space, &err);
    int bad = 0;
    for (int i = 0; i < 60; i++) bad += mask[i] != ((60 + i) / 7) % 2;
    EXPECT(s == STATUS_OK && bad == 0, "mask read after the EIOs: status %d, %d wrong", (int)s, bad);
    H5Sclose(space);
    dataset_close(ds);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/test_loss_mask.%d", (int)getpid());
    setenv("TRIDENT_DATA_FAULT", "cold_eio_at:1:2:4", 1); // before any cold access (read once)
    check_cold_retry();
    check_served(1);
    check_served(0);
    make(1, 17);
    struct dataset *ds;
    struct error err = {0};
    EXPECT(dataset_open(dir, 10, 64, "tok-mask", &ds, &err) == STATUS_OK, "%s", err.msg);
    enum status s = dataset_validate_all(ds, &err);
    EXPECT(s == STATUS_BAD_INPUT && strstr(err.msg, "/loss_mask[17] = 2") && strstr(err.msg, "shard-00001.h5"),
           "a mask value 2: status %d, '%s'", (int)s, err.msg);
    dataset_close(ds);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0, "rm");
    return test_finish("test_loss_mask");
}
