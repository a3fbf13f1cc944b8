// shard.c: write and read one HDF5 token shard (layout in shard.h and
// docs/formats.md). All HDF5 calls of the data path live here.
#include "shard.h"

#include <string.h>

#include "base/h5util.h"

// Tokens per HDF5 chunk: 64 Ki ids (128 KiB as uint16), a few sequences per
// chunk so that a hyperslab read of one sequence touches one or two chunks.
#define SHARD_CHUNK_TOKENS 65536

static int write_attr_int(hid_t obj, const char *name, int64_t value) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    int ok = attr >= 0 && H5Awrite(attr, H5T_NATIVE_INT64, &value) >= 0;
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    return ok;
}

static int write_attr_str(hid_t obj, const char *name, const char *value) {
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, strlen(value) > 0 ? strlen(value) : 1);
    H5Tset_strpad(type, H5T_STR_NULLPAD);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    int ok = attr >= 0 && H5Awrite(attr, type, value[0] ? value : "") >= 0;
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(type);
    return ok;
}

// Writes a 1-D chunked dataset of n elements; file_type is what is stored,
// mem_type what data holds.
static int write_1d(hid_t file, const char *name, hid_t file_type, hid_t mem_type,
                    const void *data, uint64_t n) {
    hsize_t dims[1] = {n}, chunk[1] = {n < SHARD_CHUNK_TOKENS ? (n ? n : 1) : SHARD_CHUNK_TOKENS};
    hsize_t maxdims[1] = {n};
    hid_t space = H5Screate_simple(1, dims, maxdims);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, chunk);
    H5Pset_obj_track_times(dcpl, 0); // byte-identical files for identical data
    hid_t dset = H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    int ok = dset >= 0 && (n == 0 || H5Dwrite(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    if (dset >= 0) H5Dclose(dset);
    H5Pclose(dcpl);
    H5Sclose(space);
    return ok;
}

static enum status write_shard(const char *path, int elem_bytes, const int32_t *tokens,
                               const uint8_t *loss_mask, uint64_t n_tokens, const uint64_t *doc_offsets,
                               uint64_t n_docs, const struct shard_meta *meta, struct error *err) {
    h5util_quiet();
    hid_t fapl = h5util_fapl();
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    h5util_fapl_close(fapl);
    if (file < 0) return error_set(err, STATUS_RUNTIME, "%s: cannot create HDF5 file", path);
    // Narrow to the stored width here (HDF5 would convert too, but then an id
    // that does not fit would be clipped silently rather than kept for the
    // reader's range check).
    void *narrow = xmalloc(n_tokens * (size_t)elem_bytes);
    for (uint64_t i = 0; i < n_tokens; i++) {
        if (elem_bytes == 2) ((uint16_t *)narrow)[i] = (uint16_t)tokens[i];
        else ((uint32_t *)narrow)[i] = (uint32_t)tokens[i];
    }
    int ok = write_1d(file, "tokens", elem_bytes == 2 ? H5T_STD_U16LE : H5T_STD_U32LE,
                      elem_bytes == 2 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32, narrow, n_tokens) &&
             write_1d(file, "doc_offsets", H5T_STD_U64LE, H5T_NATIVE_UINT64, doc_offsets, n_docs + 1) &&
             write_attr_int(file, "vocab_size", meta->vocab_size) &&
             write_attr_int(file, "eot_id", meta->eot_id) &&
             write_attr_str(file, "tokenizer", meta->tokenizer) &&
             write_attr_int(file, "format_version", meta->format_version) &&
             (!loss_mask || write_1d(file, "loss_mask", H5T_STD_U8LE, H5T_NATIVE_UINT8, loss_mask, n_tokens));
    free(narrow);
    if (H5Fclose(file) < 0) ok = 0;
    if (!ok) return error_set(err, STATUS_RUNTIME, "%s: HDF5 write failed", path);
    return STATUS_OK;
}

enum status shard_write_typed(const char *path, int elem_bytes, const int32_t *tokens,
                              uint64_t n_tokens, const uint64_t *doc_offsets,
                              uint64_t n_docs, const struct shard_meta *meta,
                              struct error *err) {
    return write_shard(path, elem_bytes, tokens, NULL, n_tokens, doc_offsets, n_docs, meta, err);
}

enum status shard_write_masked(const char *path, int elem_bytes, const int32_t *tokens,
                               const uint8_t *loss_mask, uint64_t n_tokens, const uint64_t *doc_offsets,
                               uint64_t n_docs, const struct shard_meta *meta, struct error *err) {
    if (elem_bytes == 0) elem_bytes = meta->vocab_size <= 65536 ? 2 : 4;
    return write_shard(path, elem_bytes, tokens, loss_mask, n_tokens, doc_offsets, n_docs, meta, err);
}

enum status shard_write(const char *path, const int32_t *tokens, uint64_t n_tokens,
                        const uint64_t *doc_offsets, uint64_t n_docs,
                        const struct shard_meta *meta, struct error *err) {
    return shard_write_masked(path, 0, tokens, NULL, n_tokens, doc_offsets, n_docs, meta, err);
}

// Length of a 1-D dataset of unsigned integers; its element size in *bytes.
static enum status open_1d(struct shard *s, const char *name, hid_t *dset, uint64_t *n, int *bytes,
                           struct error *err) {
    if (H5Lexists(s->file, name, H5P_DEFAULT) <= 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: no dataset /%s (expected a trident shard)", s->path, name);
    // No chunk cache: the chunks are uncompressed, so HDF5 then reads just
    // the selected bytes of a random sequence instead of its whole chunk.
    hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
    H5Pset_chunk_cache(dapl, 0, 0, H5D_CHUNK_CACHE_W0_DEFAULT);
    const char *why = "";
    *dset = h5util_open_dataset(s->file, name, dapl, &why);
    H5Pclose(dapl);
    if (*dset < 0) return error_set(err, STATUS_BAD_INPUT, "%s: /%s is %s", s->path, name, why);
    hid_t type = H5Dget_type(*dset), space = H5Dget_space(*dset);
    int rank = H5Sget_simple_extent_ndims(space);
    hsize_t dims[1] = {0};
    if (rank == 1) H5Sget_simple_extent_dims(space, dims, NULL);
    int is_uint = H5Tget_class(type) == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_NONE;
    *bytes = (int)H5Tget_size(type);
    H5Tclose(type);
    H5Sclose(space);
    if (rank != 1) return error_set(err, STATUS_BAD_INPUT, "%s: /%s has rank %d, expected 1", s->path, name, rank);
    if (!is_uint)
        return error_set(err, STATUS_BAD_INPUT, "%s: /%s is not an unsigned integer dataset", s->path, name);
    // The elements it claims must lie in the file: a sparse or compressed
    // dataset of 2^61 elements costs nothing on disk, and its length sizes
    // the readers' buffers (issue 18).
    uint64_t stored = H5Dget_storage_size(*dset), claimed;
    if (__builtin_mul_overflow((uint64_t)dims[0], (uint64_t)*bytes, &claimed) || stored < claimed)
        return error_set(err, STATUS_BAD_INPUT,
                         "%s: /%s claims %llu elements of %d bytes but the file stores %llu bytes of it "
                         "(sparse, compressed or truncated)",
                         s->path, name, (unsigned long long)dims[0], *bytes, (unsigned long long)stored);
    *n = dims[0];
    return STATUS_OK;
}

void shard_init(struct shard *s) {
    memset(s, 0, sizeof *s);
    s->file = s->tokens = s->file_space = s->loss_mask = H5I_INVALID_HID;
}

enum status shard_open(const char *path, struct shard *s, struct error *err) {
    shard_init(s);
    snprintf(s->path, sizeof s->path, "%s", path);
    h5util_quiet();
    FILE *probe = fopen(path, "rb");
    if (!probe) return error_set(err, STATUS_BAD_INPUT, "%s: shard file missing or unreadable", path);
    fclose(probe);
    if (H5Fis_hdf5(path) <= 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: not an HDF5 file (truncated or corrupt?)", path);
    hid_t fapl = h5util_fapl();
    s->file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    h5util_fapl_close(fapl);
    if (s->file < 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: HDF5 cannot open the file (truncated or corrupt?)", path);
    enum status st;
    int bytes;
    hid_t offsets;
    if ((st = open_1d(s, "doc_offsets", &offsets, &s->n_docs, &bytes, err))) goto fail;
    H5Dclose(offsets);
    if (bytes != 8) {
        st = error_set(err, STATUS_BAD_INPUT, "%s: /doc_offsets has %d-byte integers, expected uint64", path, bytes);
        goto fail;
    }
    if (s->n_docs == 0) {
        st = error_set(err, STATUS_BAD_INPUT, "%s: /doc_offsets is empty, expected documents + 1 entries", path);
        goto fail;
    }
    s->n_docs -= 1;
    if ((st = open_1d(s, "tokens", &s->tokens, &s->n_tokens, &s->elem_bytes, err))) goto fail;
    if (s->elem_bytes != 2 && s->elem_bytes != 4) {
        st = error_set(err, STATUS_BAD_INPUT, "%s: /tokens has %d-byte integers, expected uint16 or uint32",
                       path, s->elem_bytes);
        goto fail;
    }
    s->file_space = H5Dget_space(s->tokens);
    if (H5Lexists(s->file, "loss_mask", H5P_DEFAULT) > 0) {
        uint64_t n_mask;
        int mask_bytes;
        if ((st = open_1d(s, "loss_mask", &s->loss_mask, &n_mask, &mask_bytes, err))) goto fail;
        if (mask_bytes != 1 || n_mask != s->n_tokens) {
            st = error_set(err, STATUS_BAD_INPUT, "%s: /loss_mask has %llu %d-byte entries, expected %llu uint8 "
                           "(one per token of /tokens)", path, (unsigned long long)n_mask, mask_bytes,
                           (unsigned long long)s->n_tokens);
            goto fail;
        }
    }
    const char *names[] = {"vocab_size", "eot_id", "format_version"};
    int64_t *values[] = {&s->meta.vocab_size, &s->meta.eot_id, &s->meta.format_version};
    for (int i = 0; i < 3; i++)
        if (!h5util_read_attr_i64(s->file, names[i], values[i])) {
            char what[128];
            st = error_set(err, STATUS_BAD_INPUT, "%s: attribute '%s' is %s, expected one integer", path, names[i],
                           h5util_attr_describe(s->file, names[i], what, sizeof what));
            goto fail;
        }
    if (!h5util_read_attr_str(s->file, "tokenizer", s->meta.tokenizer, sizeof s->meta.tokenizer)) {
        char what[128];
        st = error_set(err, STATUS_BAD_INPUT, "%s: attribute 'tokenizer' is %s, expected one string of at most %zu bytes",
                       path, h5util_attr_describe(s->file, "tokenizer", what, sizeof what),
                       sizeof s->meta.tokenizer - 1);
        goto fail;
    }
    return STATUS_OK;
fail:
    shard_close(s);
    return st;
}

void shard_close(struct shard *s) {
    if (s->loss_mask >= 0) H5Dclose(s->loss_mask);
    if (s->file_space >= 0) H5Sclose(s->file_space);
    if (s->tokens >= 0) H5Dclose(s->tokens);
    if (s->file >= 0) H5Fclose(s->file);
    s->file = s->tokens = s->file_space = s->loss_mask = H5I_INVALID_HID;
}

enum status shard_read_tokens(struct shard *s, uint64_t start, uint64_t count, int32_t *out,
                              void *buf, hid_t memspace, struct error *err) {
    CHECK(start + count <= s->n_tokens, "read [%llu, +%llu) past %llu tokens of %s",
          (unsigned long long)start, (unsigned long long)count, (unsigned long long)s->n_tokens, s->path);
    if (count == 0) return STATUS_OK;
    hsize_t off[1] = {start}, cnt[1] = {count}, zero[1] = {0};
    hid_t mem_type = s->elem_bytes == 2 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32;
    if (H5Sselect_hyperslab(s->file_space, H5S_SELECT_SET, off, NULL, cnt, NULL) < 0 ||
        H5Sselect_hyperslab(memspace, H5S_SELECT_SET, zero, NULL, cnt, NULL) < 0 ||
        H5Dread(s->tokens, mem_type, memspace, s->file_space, H5P_DEFAULT, buf) < 0)
        return error_set(err, STATUS_RUNTIME, "%s: reading /tokens[%llu, %llu) failed", s->path,
                         (unsigned long long)start, (unsigned long long)(start + count));
    // Widen in place from the back so buf may alias out.
    if (s->elem_bytes == 2) {
        const uint16_t *b = buf;
        for (uint64_t i = count; i-- > 0;) out[i] = (int32_t)b[i];
    } else {
        const uint32_t *b = buf;
        for (uint64_t i = 0; i < count; i++) out[i] = b[i] > INT32_MAX ? -1 : (int32_t)b[i];
    }
    return STATUS_OK;
}

enum status shard_read_doc_offsets(struct shard *s, uint64_t *out, struct error *err) {
    hid_t dset = H5Dopen2(s->file, "doc_offsets", H5P_DEFAULT);
    int ok = dset >= 0 && H5Dread(dset, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) >= 0;
    if (dset >= 0) H5Dclose(dset);
    if (!ok) return error_set(err, STATUS_BAD_INPUT, "%s: cannot read /doc_offsets", s->path);
    return STATUS_OK;
}

enum status shard_read_mask(struct shard *s, uint64_t start, uint64_t count, uint8_t *out, hid_t memspace,
                            struct error *err) {
    CHECK(start + count <= s->n_tokens, "mask read [%llu, +%llu) past %llu tokens of %s",
          (unsigned long long)start, (unsigned long long)count, (unsigned long long)s->n_tokens, s->path);
    if (s->loss_mask < 0) {
        memset(out, 1, count);
        return STATUS_OK;
    }
    if (count == 0) return STATUS_OK;
    hsize_t off[1] = {start}, cnt[1] = {count}, zero[1] = {0};
    hid_t space = H5Dget_space(s->loss_mask);
    int ok = space >= 0 && H5Sselect_hyperslab(space, H5S_SELECT_SET, off, NULL, cnt, NULL) >= 0 &&
             H5Sselect_hyperslab(memspace, H5S_SELECT_SET, zero, NULL, cnt, NULL) >= 0 &&
             H5Dread(s->loss_mask, H5T_NATIVE_UINT8, memspace, space, H5P_DEFAULT, out) >= 0;
    if (space >= 0) H5Sclose(space);
    if (!ok)
        return error_set(err, STATUS_RUNTIME, "%s: reading /loss_mask[%llu, %llu) failed", s->path,
                         (unsigned long long)start, (unsigned long long)(start + count));
    return STATUS_OK;
}
