// checksum.c: whole-file checksums (checksum.h), through xxHash.
#include "checksum.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

enum status checksum_file(const char *path, char *out, struct error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return error_set(err, STATUS_BAD_INPUT, "%s: cannot read: %s", path, strerror(errno));
    XXH3_state_t *state = XXH3_createState();
    CHECK(state, "XXH3_createState failed");
    XXH3_64bits_reset(state);
    size_t cap = 1 << 20, n;
    char *buf = xmalloc(cap);
    while ((n = fread(buf, 1, cap, f)) > 0) XXH3_64bits_update(state, buf, n);
    int bad = ferror(f);
    fclose(f);
    free(buf);
    XXH64_hash_t h = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    if (bad) return error_set(err, STATUS_BAD_INPUT, "%s: read error while checksumming", path);
    snprintf(out, 64, "xxh3-64:%016llx", (unsigned long long)h);
    return STATUS_OK;
}
