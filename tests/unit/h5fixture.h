// h5fixture.h: read the PyTorch reference fixtures (tests/reference/fixtures/
// *.h5, written by tests/reference/*.py) in C tests, without torch.
//
// Every reader converts on read (HDF5 type conversion), so a float32 dataset
// can be read as double and an int64 attribute as double. Any failure (file,
// dataset or attribute missing, wrong rank) prints the file, the object and
// what was expected, then exits 1: a test with a broken fixture must fail, not
// skip.
#ifndef TRIDENT_H5FIXTURE_H
#define TRIDENT_H5FIXTURE_H

#include <hdf5.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { H5FIXTURE_MAX_DIMS = 8 };

// The shape of a dataset read: ndims 0 for a scalar (numel 1).
struct h5fixture_shape {
    int ndims;
    size_t dims[H5FIXTURE_MAX_DIMS];
    size_t numel;
};

#define h5fixture_fail(f, ...)                                                 \
    do {                                                                       \
        char path_[512] = "?";                                                 \
        H5Fget_name((f), path_, sizeof path_);                                 \
        fprintf(stderr, "%s:%d: fixture %s: ", __FILE__, __LINE__, path_);     \
        fprintf(stderr, __VA_ARGS__);                                          \
        fputc('\n', stderr);                                                   \
        exit(1);                                                               \
    } while (0)

// Opens a fixture read-only; exits 1 naming path when it cannot. HDF5's own
// error stack printing is turned off: the readers below say what failed.
static inline hid_t h5fixture_open(const char *path) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        fprintf(stderr, "%s:%d: cannot open fixture %s (run from the repository root; "
                "regenerate with tests/reference/*.py)\n", __FILE__, __LINE__, path);
        exit(1);
    }
    return f;
}

static inline void h5fixture_close(hid_t f) { H5Fclose(f); }

// True when every link of the slash-separated path name exists in f.
static inline bool h5fixture_exists(hid_t f, const char *name) {
    char prefix[512];
    size_t len = strlen(name);
    if (len >= sizeof prefix) return false;
    for (size_t i = 1; i <= len; i++) {
        if (i < len && name[i] != '/') continue;
        memcpy(prefix, name, i);
        prefix[i] = '\0';
        if (H5Lexists(f, prefix, H5P_DEFAULT) <= 0) return false;
    }
    return true;
}

// Reads dataset name into a malloc'd buffer of memtype (elsize bytes each);
// fills *shape when shape != NULL. Exits 1 naming the dataset on failure.
static inline void *h5fixture_read(hid_t f, const char *name, hid_t memtype, size_t elsize,
                                   struct h5fixture_shape *shape) {
    if (!h5fixture_exists(f, name)) h5fixture_fail(f, "dataset %s is missing", name);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    if (d < 0) h5fixture_fail(f, "%s is not a dataset", name);
    hid_t s = H5Dget_space(d);
    int nd = H5Sget_simple_extent_ndims(s);
    if (nd < 0 || nd > H5FIXTURE_MAX_DIMS)
        h5fixture_fail(f, "dataset %s has rank %d, expected 0..%d", name, nd, H5FIXTURE_MAX_DIMS);
    hsize_t dims[H5FIXTURE_MAX_DIMS];
    H5Sget_simple_extent_dims(s, dims, NULL);
    struct h5fixture_shape sh = {.ndims = nd, .numel = 1};
    for (int i = 0; i < nd; i++) {
        sh.dims[i] = (size_t)dims[i];
        sh.numel *= (size_t)dims[i];
    }
    void *buf = malloc(sh.numel ? sh.numel * elsize : 1);
    if (!buf) h5fixture_fail(f, "out of memory reading %s (%zu elements)", name, sh.numel);
    if (sh.numel && H5Dread(d, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
        h5fixture_fail(f, "cannot read dataset %s (type not convertible?)", name);
    H5Sclose(s);
    H5Dclose(d);
    if (shape) *shape = sh;
    return buf;
}

static inline double *h5fixture_read_f64(hid_t f, const char *name,
                                         struct h5fixture_shape *shape) {
    return (double *)h5fixture_read(f, name, H5T_NATIVE_DOUBLE, sizeof(double), shape);
}

static inline float *h5fixture_read_f32(hid_t f, const char *name,
                                        struct h5fixture_shape *shape) {
    return (float *)h5fixture_read(f, name, H5T_NATIVE_FLOAT, sizeof(float), shape);
}

static inline int32_t *h5fixture_read_i32(hid_t f, const char *name,
                                          struct h5fixture_shape *shape) {
    return (int32_t *)h5fixture_read(f, name, H5T_NATIVE_INT32, sizeof(int32_t), shape);
}

// Exits 1 unless shape is exactly (dims[0], ..., dims[ndims-1]).
static inline void h5fixture_expect_shape(hid_t f, const char *name,
                                          const struct h5fixture_shape *shape, int ndims,
                                          const size_t *dims) {
    bool ok = shape->ndims == ndims;
    for (int i = 0; ok && i < ndims; i++) ok = shape->dims[i] == dims[i];
    if (!ok) {
        char got[128] = "", want[128] = "";
        for (int i = 0; i < shape->ndims; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%zu", i ? ", " : "",
                     shape->dims[i]);
        for (int i = 0; i < ndims; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%zu", i ? ", " : "",
                     dims[i]);
        h5fixture_fail(f, "dataset %s has shape (%s), expected (%s)", name, got, want);
    }
}

// Reads the scalar attribute attr of object obj ("/" for the file) as a double.
static inline double h5fixture_attr_f64(hid_t f, const char *obj, const char *attr) {
    if (!h5fixture_exists(f, obj) && strcmp(obj, "/") != 0)
        h5fixture_fail(f, "object %s (holding attribute %s) is missing", obj, attr);
    if (H5Aexists_by_name(f, obj, attr, H5P_DEFAULT) <= 0)
        h5fixture_fail(f, "attribute %s of %s is missing", attr, obj);
    hid_t a = H5Aopen_by_name(f, obj, attr, H5P_DEFAULT, H5P_DEFAULT);
    hid_t s = H5Aget_space(a);
    hssize_t n = H5Sget_simple_extent_npoints(s);
    double value = 0;
    if (n != 1) h5fixture_fail(f, "attribute %s of %s has %lld values, expected 1", attr, obj,
                               (long long)n);
    if (H5Aread(a, H5T_NATIVE_DOUBLE, &value) < 0)
        h5fixture_fail(f, "cannot read attribute %s of %s as a number", attr, obj);
    H5Sclose(s);
    H5Aclose(a);
    return value;
}

// The same, for an integer attribute; exits 1 if the value is not integral.
static inline long h5fixture_attr_long(hid_t f, const char *obj, const char *attr) {
    double v = h5fixture_attr_f64(f, obj, attr);
    if (v != (double)(long)v)
        h5fixture_fail(f, "attribute %s of %s is %g, expected an integer", attr, obj, v);
    return (long)v;
}

#endif
