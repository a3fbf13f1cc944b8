// state_entry.c: what the owners of checkpointed state share when they
// judge the values a checkpoint gave back (state_entry.h).
#include "state_entry.h"

#include <inttypes.h>
#include <string.h>

enum status state_entry_range(const char *name, int64_t v, int64_t lo, int64_t hi, struct error *err) {
    if (v >= lo && v <= hi) return STATUS_OK;
    return error_set(err, STATUS_BAD_INPUT, "/state %s = %" PRId64 ", expected %" PRId64 "..%" PRId64, name, v,
                     lo, hi);
}

int state_entries_put(struct state_entry *out, int cap, const struct state_entry *mine, int n) {
    CHECK(n <= cap, "%d state entries (%s first) for room of %d", n, n ? mine[0].name : "", cap);
    memcpy(out, mine, (size_t)n * sizeof *mine);
    return n;
}
