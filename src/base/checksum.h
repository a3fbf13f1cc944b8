// checksum.h: whole-file checksums, as recorded in a dataset's index.ini and a
// checkpoint's manifest.ini (docs/formats.md).
#ifndef TRIDENT_CHECKSUM_H
#define TRIDENT_CHECKSUM_H

#include "common.h"

// Longest checksum text checksum_file writes, with its NUL.
enum { CHECKSUM_TEXT_BYTES = 64 };

// xxHash XXH3-64 of the file's bytes as "xxh3-64:%016x" into out
// (CHECKSUM_TEXT_BYTES bytes). Errors: STATUS_BAD_INPUT naming path when it
// cannot be read.
enum status checksum_file(const char *path, char *out, struct error *err);

#endif
