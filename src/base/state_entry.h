// state_entry.h: one named value of a module's state as a checkpoint stores
// it (docs/design.md §7, "Who owns what a checkpoint holds"). The module that
// produces the value (its owner: the loader, the optimizer and its LR
// schedule, the loss scaler, the trainer's progress) describes it with a
// name, a type, a count, where it lives and what an older file without it
// means; the checkpoint layer (src/ckpt/: ckpt_save_args.entries,
// checkpoint_read_entries) stores and finds it by name without knowing what
// it means, and the owner judges the values it gets back. Here, below every
// owner (data/, model/, train/) and the checkpoint layer.
#ifndef TRIDENT_STATE_ENTRY_H
#define TRIDENT_STATE_ENTRY_H

#include <stdbool.h>
#include <stdint.h>

#include "common.h"

enum state_type { STATE_I64, STATE_U64, STATE_F64 };

struct state_entry {
    const char *name;     // unique within a checkpoint's /state: "<owner>_<what>" for new ones
    enum state_type type; // int64_t, uint64_t or double
    int count;            // elements: 1 a scalar, else a fixed-length array
    void *value;          // (count,) of type: read by a save, written by a load
    bool required;        // absent from a file: refused; else every element := dflt
    double dflt;          // what a file written before the entry existed means
    bool read_only;       // read from older files only; a save does not write it
    bool *found;          // (may be NULL) a load sets it: whether the file held the entry
};

// An owner's range check of a value it read: STATUS_OK when lo <= v <= hi,
// else STATUS_BAD_INPUT "/state NAME = V, expected LO..HI" (the caller adds
// the file).
enum status state_entry_range(const char *name, int64_t v, int64_t lo, int64_t hi, struct error *err);

// Copies an owner's n entries into out (room for cap: a CHECK) and returns
// n: the tail of every owner's `*_state_entries`.
int state_entries_put(struct state_entry *out, int cap, const struct state_entry *mine, int n);

#endif
