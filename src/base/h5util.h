// h5util.h: small HDF5 helpers shared by the shard and checkpoint readers and writers.
#ifndef TRIDENT_H5UTIL_H
#define TRIDENT_H5UTIL_H

#include <hdf5.h>
#include <stdbool.h>
#include <stddef.h>

// Reads the string attribute `name` of loc (fixed- or variable-length) into
// out (cap bytes, NUL-terminated). False when it is missing, not a string,
// unreadable, or does not fit in cap - 1 bytes.
bool h5util_read_attr_str(hid_t loc, const char *name, char *out, size_t cap);

// Turns off HDF5's own error-stack printing: trident reports errors itself.
void h5util_quiet(void);

#endif
