// test_loss_mask.c: /loss_mask in shards (docs/formats.md): written by
// dataset_writer_add_masked, served by loader_next_masked aligned with the
// tokens (a sequence crossing a shard boundary included), all ones for a
// shard without one, and a value other than 0 or 1 refused on the shard's
// first read (dataset_validate_all, which data-check runs) naming
// /loss_mask and the offset.
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

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/test_loss_mask.%d", (int)getpid());
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
