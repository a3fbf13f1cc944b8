// checkpoint_format.c: what the checkpoint writer (checkpoint.c) and reader
// (checkpoint_read.c) share (checkpoint_internal.h): HDF5 types of dtypes, the
// piece tag checks, the block <-> global copy and the step folder names. Both
// depend on this file; it depends on neither.
#include "checkpoint_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

hid_t ckpt_h5_type(enum dtype dtype) {
    switch (dtype) {
    case DTYPE_FP32: return H5T_NATIVE_FLOAT;
    case DTYPE_FP64: return H5T_NATIVE_DOUBLE;
    case DTYPE_I32: return H5T_NATIVE_INT32;
    case DTYPE_I64: return H5T_NATIVE_INT64;
    case DTYPE_BF16:
    case DTYPE_FP16: return H5T_NATIVE_UINT16;
    case DTYPE_FP8_E4M3:
    case DTYPE_FP8_E5M2: return H5T_NATIVE_UINT8;
    }
    return H5T_NATIVE_FLOAT;
}

int ckpt_dtype_parse(const char *name) {
    static const enum dtype all[] = {DTYPE_FP32, DTYPE_BF16, DTYPE_FP16,
                                     DTYPE_FP64, DTYPE_I32,  DTYPE_I64};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(dtype_name(all[i]), name)) return (int)all[i];
    return -1;
}

void ckpt_block_copy(char *global, int gcols, int ro, int co, int cols, size_t fb, size_t fe,
                     char *flat, size_t es, int to_global) {
    for (size_t f = fb; f < fe;) {
        size_t r = f / (size_t)cols, c = f % (size_t)cols;
        size_t run = MIN((size_t)cols - c, fe - f); // to the end of this block row
        char *g = global + (((size_t)ro + r) * (size_t)gcols + (size_t)co + c) * es;
        char *l = flat + (f - fb) * es;
        if (to_global) memcpy(g, l, run * es);
        else memcpy(l, g, run * es);
        f += run;
    }
}

const char *ckpt_piece_tags_error(const struct ckpt_piece *p) {
    if (p->grows < 1 || p->gcols < 1) return "global shape is not positive";
    // In 64 bits: an offset of INT_MAX plus a small block wraps an int
    // negative and would pass (issue 18).
    if (p->rows < 0 || p->cols < 0 || p->row_offset < 0 || p->col_offset < 0 ||
        (int64_t)p->row_offset + p->rows > p->grows || (int64_t)p->col_offset + p->cols > p->gcols)
        return "block lies outside the global shape";
    if (p->flat_begin > p->flat_end || p->flat_end > (uint64_t)p->rows * (uint64_t)p->cols)
        return "flat range lies outside the block";
    return NULL;
}

void ckpt_step_name(char *out, size_t cap, int64_t step) {
    snprintf(out, cap, "step-%06lld", (long long)step);
}

// A bf16 or fp16 word is non-finite when its exponent bits are all ones.
static size_t count_nonfinite16(const uint16_t *x, uint16_t exp_mask, size_t n, size_t *first) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if ((x[i] & exp_mask) == exp_mask && !bad++) *first = i;
    return bad;
}

size_t ckpt_count_nonfinite(const void *data, enum dtype dtype, size_t n, size_t *first) {
    size_t bad = 0;
    switch (dtype) {
    case DTYPE_FP32: {
        const float *x = data;
        for (size_t i = 0; i < n; i++)
            if (!isfinite(x[i]) && !bad++) *first = i;
        return bad;
    }
    case DTYPE_FP64: {
        const double *x = data;
        for (size_t i = 0; i < n; i++)
            if (!isfinite(x[i]) && !bad++) *first = i;
        return bad;
    }
    case DTYPE_BF16: return count_nonfinite16(data, 0x7f80, n, first);
    case DTYPE_FP16: return count_nonfinite16(data, 0x7c00, n, first);
    case DTYPE_I32:
    case DTYPE_I64: return 0;
    case DTYPE_FP8_E4M3:
    case DTYPE_FP8_E5M2: {
        // E4M3: S.1111.111 is NaN; E5M2: exponent 11111 is inf or NaN.
        const uint8_t *x = data;
        uint8_t mask = dtype == DTYPE_FP8_E4M3 ? 0x7f : 0x7c;
        for (size_t i = 0; i < n; i++)
            if ((x[i] & mask) == mask && !bad++) *first = i;
        return bad;
    }
    }
    return 0;
}
