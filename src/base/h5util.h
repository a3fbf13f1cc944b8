// h5util.h: small HDF5 helpers shared by the shard and checkpoint readers and writers.
#ifndef TRIDENT_H5UTIL_H
#define TRIDENT_H5UTIL_H

#include <hdf5.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Reads the string attribute `name` of loc (fixed- or variable-length) into
// out (cap bytes, NUL-terminated). False when it is missing, not a string,
// not one string (an array of them, however short), unreadable, or does not
// fit in cap - 1 bytes.
bool h5util_read_attr_str(hid_t loc, const char *name, char *out, size_t cap);

// True when the attribute `name` of loc exists, is of type class cls
// (H5T_INTEGER, H5T_FLOAT...) and holds n elements: a scalar or (1,) when
// n == 1, else a 1-D (n,) array. Every attribute read from a file trident did
// not just write is checked so before H5Aread (issue 18: an array where a
// scalar belongs overflows the caller's buffer).
bool h5util_attr_is(hid_t loc, const char *name, H5T_class_t cls, size_t n);

// What the attribute `name` of loc is, for a refusal's message: "missing",
// "a string", "an integer", "a (2, 3) integer array", ... in out (cap bytes).
// Returns out.
const char *h5util_attr_describe(hid_t loc, const char *name, char *out, size_t cap);

// Reads the scalar integer attribute `name` of loc into *out (int64; HDF5
// converts any integer type and fails on one out of range). False when
// h5util_attr_is(loc, name, H5T_INTEGER, 1) is false or the read fails.
bool h5util_read_attr_i64(hid_t loc, const char *name, int64_t *out);

// Opens the dataset at `name` (relative to loc) when it is stored inside this
// file: a hard link (no soft or external link), contiguous or chunked layout
// and no external storage (H5Pset_external), so that no byte of it lies
// outside the checksummed file. On refusal returns H5I_INVALID_HID with *why
// set to a description ("missing", "a soft link"...). dapl: the access
// property list (H5P_DEFAULT for none). The caller H5Dcloses the result.
hid_t h5util_open_dataset(hid_t loc, const char *name, hid_t dapl, const char **why);

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
