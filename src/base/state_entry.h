// state_entry.h: one named value of a module's state as a checkpoint stores
// it (docs/design.md §7, "Who owns what a checkpoint holds"). The module that
// produces the value (its owner) describes it with a name, a type, a count,
// where it lives and what an older file without it means; the checkpoint
// layer (src/ckpt/: checkpoint_save_args.entries, checkpoint_read_entries)
// stores and finds it by name without knowing what it means. Here, below
// every owner (data/, model/, train/) and the checkpoint layer.
#ifndef TRIDENT_STATE_ENTRY_H
#define TRIDENT_STATE_ENTRY_H

#include <stdbool.h>

enum state_type { STATE_I64, STATE_U64, STATE_F64 };

struct state_entry {
    const char *name;     // unique within a checkpoint's /state: "<owner>_<what>" for new ones
    enum state_type type; // int64_t, uint64_t or double
    int count;            // elements: 1 a scalar, else a fixed-length array
    void *value;          // (count,) of type: read by a save, written by a load
    bool required;        // absent from a file: refused; else every element := dflt
    double dflt;          // what a file written before the entry existed means
};

#endif
