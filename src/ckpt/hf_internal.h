// hf_internal.h: what hf.c and hf_config.c share beyond hf.h.
#ifndef TRIDENT_HF_INTERNAL_H
#define TRIDENT_HF_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/common.h"

// Loads path as a JSON object (duplicate keys refused), reading only a
// regular file of at most max_bytes: opened with O_NONBLOCK and checked with
// fstat, so a FIFO or a device is refused, never waited on. absent: when not
// NULL, a missing file sets *absent and returns STATUS_OK with *out NULL.
// Errors: STATUS_BAD_INPUT naming path (cannot open, not a regular file, too
// large, not a JSON object with the parser's message and line).
enum status hf_load_json(const char *path, size_t max_bytes, json_t **out, bool *absent,
                         struct error *err);

#endif
