// checkpoint_internal.h: what checkpoint.c (save) and checkpoint_read.c
// (load) share, implemented in checkpoint_format.c: HDF5 types of dtypes, the
// block <-> global copy, piece tag checks and step folder names.
#ifndef TRIDENT_CHECKPOINT_INTERNAL_H
#define TRIDENT_CHECKPOINT_INTERNAL_H

#include <hdf5.h>

#include "checkpoint.h"

// HDF5 memory type of dtype; bf16 and fp16 travel as raw 16-bit words.
hid_t ckpt_h5_type(enum dtype dtype);
// dtype of its dtype_name; -1 when unknown.
int ckpt_dtype_parse(const char *name);

// Copies between the flat range [fb, fe) of a (rows, cols) block at
// (ro, co) of a global row-major tensor with gcols columns and `flat`
// ((fe - fb,) elements of es bytes). to_global: flat -> global, else back.
void ckpt_block_copy(char *global, int gcols, int ro, int co, int cols, size_t fb, size_t fe,
                     char *flat, size_t es, int to_global);

// Checks a piece's tags: block inside the global shape, flat range inside
// the block. Returns NULL when fine, else a description.
const char *ckpt_piece_tags_error(const struct ckpt_piece *p);

// "step-%06lld"
void ckpt_step_name(char *out, size_t cap, int64_t step);

// NaNs and infinities among the n values of dtype at data (bf16 and fp16 as
// their 16-bit words); the index of the first in *first when there are any.
// Integer dtypes have none.
size_t ckpt_count_nonfinite(const void *data, enum dtype dtype, size_t n, size_t *first);

#endif
