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

// A file access property list with HDF5's POSIX file locking off
// (H5Pset_file_locking, HDF5 >= 1.10.7): shard and checkpoint files live on
// NFS, Lustre or object-store mounts where flock/fcntl locks fail with ENOLCK
// or hang. trident never shares an HDF5 file between a writer and readers (a
// writer fills a private file that is published by rename; readers open it
// read-only afterwards), so the lock HDF5 takes to protect SWMR access guards
// nothing here. The caller closes the list with H5Pclose. Never fails: on a
// library error it returns H5P_DEFAULT, which H5Pclose must not be given, so
// use h5util_fapl_close.
hid_t h5util_fapl(void);
void h5util_fapl_close(hid_t fapl);

// Turns off HDF5's own error-stack printing: trident reports errors itself.
void h5util_quiet(void);

#endif
