// safetensors.h: read and write the safetensors format of Hugging Face
// (the format's README, github.com/huggingface/safetensors, "Format"):
//
//   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
//   bytes [8, 8 + N)    a UTF-8 JSON object: for each tensor
//                       "name": {"dtype": "F32", "shape": [d0, ...],
//                                "data_offsets": [begin, end]}
//                       and optionally "__metadata__": {"key": "value", ...}
//   bytes [8 + N, EOF)  the data; offsets are relative to its start,
//                       tensors row-major, little-endian
//
// The writer pads the header with spaces so that the data starts on an
// 8-byte boundary, stores tensors in the order given, back to back, and
// writes path.tmp then renames it (a failure leaves no file at path).
// The reader validates the whole header on open (safetensors_open) and reads
// byte ranges of one tensor with pread, so that a rank reads only its shard.
#ifndef TRIDENT_SAFETENSORS_H
#define TRIDENT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/common.h"
#include "kernels/ops.h"

#define SAFETENSORS_NAME_MAX 256
#define SAFETENSORS_MAX_DIM 8
// The largest header the reader accepts (the reference implementation's
// limit is 100 MB as well).
#define SAFETENSORS_HEADER_MAX (100u * 1000u * 1000u)

// One tensor of a file. begin, end: byte offsets into the data section.
struct safetensors_tensor {
    char name[SAFETENSORS_NAME_MAX];
    enum dtype dtype; // F32, BF16, F16, F64, I32, I64 map to DTYPE_*
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIM];
    uint64_t begin, end;
};

struct safetensors_file;

// Opens path and validates its header: the length fits in the file and under
// SAFETENSORS_HEADER_MAX, the JSON parses to an object, every entry has a
// known dtype, a shape of non-negative sizes, offsets with begin <= end <=
// the data size and end - begin = numel * element size, and no two tensors'
// byte ranges overlap. Errors: STATUS_BAD_INPUT naming the file and, where
// one is at fault, the tensor; STATUS_RUNTIME on a read failure.
enum status safetensors_open(const char *path, struct safetensors_file **out,
                             struct error *err);
void safetensors_close(struct safetensors_file *f);

// The number of tensors and the i-th in the header's order, 0 <= i < n.
int safetensors_n_tensors(const struct safetensors_file *f);
const struct safetensors_tensor *safetensors_tensor_at(const struct safetensors_file *f, int i);
// The tensor named name, or NULL.
const struct safetensors_tensor *safetensors_find(const struct safetensors_file *f,
                                                  const char *name);
// The value of __metadata__[key], or NULL.
const char *safetensors_metadata(const struct safetensors_file *f, const char *key);

// Reads bytes [offset, offset + bytes) of tensor t into dst. Errors:
// STATUS_BAD_INPUT for a range past the tensor, STATUS_RUNTIME on a short read.
enum status safetensors_read(struct safetensors_file *f, const struct safetensors_tensor *t,
                             uint64_t offset, uint64_t bytes, void *dst, struct error *err);

// One tensor to write: data holds numel(shape) elements of dtype, row-major.
struct safetensors_entry {
    const char *name;
    enum dtype dtype;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIM];
    const void *data;
};

// Writes n tensors and the metadata pairs meta[0..2*n_meta) (key, value,
// key, value, ...) to path (via path.tmp and a rename). Errors:
// STATUS_BAD_INPUT for a duplicate, empty or invalid UTF-8 name or an unsupported dtype,
// STATUS_RUNTIME for a failed write.
enum status safetensors_write(const char *path, const struct safetensors_entry *e, int n,
                              const char *const *meta, int n_meta, struct error *err);

// The safetensors name of dtype ("F32", "BF16", ...), or NULL.
const char *safetensors_dtype_name(enum dtype dtype);
// The number of elements of a shape.
uint64_t safetensors_numel(int ndim, const int64_t *shape);

#endif
