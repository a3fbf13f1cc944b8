// safetensors.c: the safetensors reader and writer (safetensors.h).
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct safetensors_file {
    char path[4096];
    int fd;
    uint64_t data_start, data_size;
    int n;
    struct safetensors_tensor *t;
    json_t *metadata; // the __metadata__ object or NULL
};

static const struct {
    const char *name;
    enum dtype dtype;
} st_dtypes[] = {{"F32", DTYPE_FP32}, {"BF16", DTYPE_BF16}, {"F16", DTYPE_FP16},
                 {"F64", DTYPE_FP64}, {"I32", DTYPE_I32},   {"I64", DTYPE_I64}};

const char *safetensors_dtype_name(enum dtype dtype) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (st_dtypes[i].dtype == dtype) return st_dtypes[i].name;
    return NULL;
}

static int st_dtype_parse(const char *s) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (!strcmp(st_dtypes[i].name, s)) return (int)st_dtypes[i].dtype;
    return -1;
}

uint64_t safetensors_numel(int ndim, const int64_t *shape) {
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (uint64_t)shape[i];
    return n;
}

void safetensors_close(struct safetensors_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    json_decref(f->metadata);
    free(f->t);
    free(f);
}

static int cmp_begin(const void *a, const void *b) {
    const struct safetensors_tensor *x = *(struct safetensors_tensor *const *)a,
                                    *y = *(struct safetensors_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

// Fills t from one header entry; returns an error naming the tensor.
static enum status parse_entry(const char *path, const char *name, json_t *v, uint64_t data_size,
                               struct safetensors_tensor *t, struct error *err) {
    if (strlen(name) >= SAFETENSORS_NAME_MAX || !*name)
        return error_set(err, STATUS_BAD_INPUT, "%s: a tensor name is empty or longer than %d "
                         "bytes", path, SAFETENSORS_NAME_MAX - 1);
    snprintf(t->name, sizeof t->name, "%s", name);
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(shape) ||
        !json_is_array(off) || json_array_size(off) != 2)
        return error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: the header entry needs dtype, "
                         "shape and data_offsets [begin, end]", path, name);
    int d = st_dtype_parse(json_string_value(dt));
    if (d < 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: unknown or unsupported dtype "
                         "'%s' (supported: F32, BF16, F16, F64, I32, I64)", path, name,
                         json_string_value(dt));
    t->dtype = (enum dtype)d;
    if (json_array_size(shape) > SAFETENSORS_MAX_DIM)
        return error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: %zu dimensions, at most %d",
                         path, name, json_array_size(shape), SAFETENSORS_MAX_DIM);
    t->ndim = (int)json_array_size(shape);
    long double numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *s = json_array_get(shape, (size_t)i);
        if (!json_is_integer(s) || json_integer_value(s) < 0)
            return error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: shape[%d] is not a "
                             "non-negative integer", path, name, i);
        t->shape[i] = json_integer_value(s);
        numel *= (long double)t->shape[i];
    }
    json_t *b = json_array_get(off, 0), *e = json_array_get(off, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b))
        return error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: data_offsets must be integers "
                         "0 <= begin <= end", path, name);
    t->begin = (uint64_t)json_integer_value(b), t->end = (uint64_t)json_integer_value(e);
    if (t->end > data_size)
        return error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: data_offsets end %llu is past "
                         "the end of the data (%llu bytes; a truncated file?)", path, name,
                         (unsigned long long)t->end, (unsigned long long)data_size);
    if ((long double)(t->end - t->begin) != numel * (long double)dtype_size(t->dtype))
        return error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: data_offsets span %llu bytes, "
                         "its shape and dtype need %.0Lf", path, name,
                         (unsigned long long)(t->end - t->begin),
                         numel * (long double)dtype_size(t->dtype));
    return STATUS_OK;
}

enum status safetensors_open(const char *path, struct safetensors_file **out,
                             struct error *err) {
    *out = NULL;
    struct safetensors_file *f = xcalloc(1, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    // A FIFO or a device is refused, not waited on (base/common.h).
    uint64_t size = 0, n = 0;
    f->fd = open_regular_file(path, NULL, NULL, &size, err);
    enum status st = STATUS_OK;
    char *hdr = NULL;
    json_t *root = NULL;
    unsigned char len8[8];
    if (f->fd < 0) {
        st = err->status;
        goto done;
    }
    if (size < 8 || pread(f->fd, len8, 8, 0) != 8) {
        st = error_set(err, STATUS_BAD_INPUT, "%s: %llu bytes, too short for the 8-byte header "
                       "length of a safetensors file", path, (unsigned long long)size);
        goto done;
    }
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    if (n > size - 8 || n > SAFETENSORS_HEADER_MAX || n < 2) {
        st = error_set(err, STATUS_BAD_INPUT, "%s: header length %llu does not fit in the file "
                       "of %llu bytes (at most %u; truncated or not safetensors)", path,
                       (unsigned long long)n, (unsigned long long)size, SAFETENSORS_HEADER_MAX);
        goto done;
    }
    hdr = xmalloc(n + 1);
    if (pread(f->fd, hdr, n, 8) != (ssize_t)n) {
        st = error_set(err, STATUS_RUNTIME, "%s: cannot read the header", path);
        goto done;
    }
    hdr[n] = 0;
    json_error_t je;
    root = json_loadb(hdr, n, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(root)) {
        st = error_set(err, STATUS_BAD_INPUT, "%s: the header is not a JSON object (%s at "
                       "position %d)", path, root ? "not an object" : je.text, je.position);
        goto done;
    }
    f->data_start = 8 + n, f->data_size = size - 8 - n;
    f->t = xcalloc(json_object_size(root) + 1, sizeof *f->t);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) goto bad_meta;
            json_object_foreach(v, mk, mv) if (!json_is_string(mv)) goto bad_meta;
            f->metadata = json_incref(v);
            continue;
        bad_meta:
            st = error_set(err, STATUS_BAD_INPUT, "%s: __metadata__ must map strings to "
                           "strings", path);
            goto done;
        }
        if ((st = parse_entry(path, key, v, f->data_size, &f->t[f->n], err))) goto done;
        f->n++;
    }
    // No two byte ranges overlap (empty tensors take no bytes).
    struct safetensors_tensor **by = xmalloc((size_t)(f->n + 1) * sizeof *by);
    for (int i = 0; i < f->n; i++) by[i] = &f->t[i];
    qsort(by, (size_t)f->n, sizeof *by, cmp_begin);
    const struct safetensors_tensor *prev = NULL;
    for (int i = 0; i < f->n && !st; i++) {
        if (by[i]->begin == by[i]->end) continue;
        if (prev && by[i]->begin < prev->end)
            st = error_set(err, STATUS_BAD_INPUT, "%s: tensors %s [%llu, %llu) and %s [%llu, "
                           "%llu) overlap", path, prev->name, (unsigned long long)prev->begin,
                           (unsigned long long)prev->end, by[i]->name,
                           (unsigned long long)by[i]->begin, (unsigned long long)by[i]->end);
        prev = by[i];
    }
    free(by);
done:
    json_decref(root);
    free(hdr);
    if (st) safetensors_close(f);
    else *out = f;
    return st;
}

int safetensors_n_tensors(const struct safetensors_file *f) { return f->n; }

const struct safetensors_tensor *safetensors_tensor_at(const struct safetensors_file *f, int i) {
    return i >= 0 && i < f->n ? &f->t[i] : NULL;
}

const struct safetensors_tensor *safetensors_find(const struct safetensors_file *f,
                                                  const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

const char *safetensors_metadata(const struct safetensors_file *f, const char *key) {
    return f->metadata ? json_string_value(json_object_get(f->metadata, key)) : NULL;
}

enum status safetensors_read(struct safetensors_file *f, const struct safetensors_tensor *t,
                             uint64_t offset, uint64_t bytes, void *dst, struct error *err) {
    if (offset > t->end - t->begin || bytes > t->end - t->begin - offset)
        return error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: bytes [%llu, %llu) asked of "
                         "%llu", f->path, t->name, (unsigned long long)offset,
                         (unsigned long long)(offset + bytes),
                         (unsigned long long)(t->end - t->begin));
    uint64_t at = f->data_start + t->begin + offset, done = 0;
    while (done < bytes) {
        ssize_t r = pread(f->fd, (char *)dst + done, bytes - done, (off_t)(at + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return error_set(err, STATUS_RUNTIME, "%s: tensor %s: short read at byte %llu: %s",
                             f->path, t->name, (unsigned long long)(at + done),
                             r < 0 ? strerror(errno) : "end of file");
        done += (uint64_t)r;
    }
    return STATUS_OK;
}

static int write_all(FILE *fp, const void *p, size_t n) { return fwrite(p, 1, n, fp) == n; }

enum status safetensors_write(const char *path, const struct safetensors_entry *e, int n,
                              const char *const *meta, int n_meta, struct error *err) {
    json_t *root = json_object();
    enum status st = STATUS_OK;
    if (n_meta > 0) {
        json_t *m = json_object();
        for (int i = 0; i < n_meta; i++) json_object_set_new(m, meta[2 * i], json_string(meta[2 * i + 1]));
        json_object_set_new(root, "__metadata__", m);
    }
    uint64_t off = 0;
    for (int i = 0; i < n && !st; i++) {
        const char *dn = safetensors_dtype_name(e[i].dtype);
        if (!e[i].name || !*e[i].name || !strcmp(e[i].name, "__metadata__") ||
            json_object_get(root, e[i].name) || !dn || e[i].ndim < 0 ||
            e[i].ndim > SAFETENSORS_MAX_DIM) {
            st = error_set(err, STATUS_BAD_INPUT, "%s: tensor '%s': an empty, reserved or "
                           "duplicate name, an unsupported dtype or too many dimensions", path,
                           e[i].name ? e[i].name : "");
            break;
        }
        uint64_t bytes = safetensors_numel(e[i].ndim, e[i].shape) * dtype_size(e[i].dtype);
        json_t *shape = json_array();
        for (int d = 0; d < e[i].ndim; d++) json_array_append_new(shape, json_integer(e[i].shape[d]));
        json_t *t = json_pack("{s:s, s:o, s:[I, I]}", "dtype", dn, "shape", shape, "data_offsets",
                              (json_int_t)off, (json_int_t)(off + bytes)); // NULL: out of memory
        if (!t || json_object_set_new(root, e[i].name, t)) { // a key must be UTF-8 (jansson)
            st = error_set(err, t ? STATUS_BAD_INPUT : STATUS_RUNTIME, "%s: tensor '%s': %s", path,
                           e[i].name, t ? "a name of invalid UTF-8" : "out of memory");
            break;
        }
        off += bytes;
    }
    char *hdr = st ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (st) return st;
    size_t len = strlen(hdr), padded = (8 + len + 7) / 8 * 8 - 8;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        free(hdr);
        return error_set(err, STATUS_BAD_INPUT, "%s: cannot create: %s", tmp, strerror(errno));
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int ok = write_all(fp, len8, 8) && write_all(fp, hdr, len);
    for (size_t i = len; i < padded && ok; i++) ok = fputc(' ', fp) != EOF;
    for (int i = 0; i < n && ok; i++)
        ok = write_all(fp, e[i].data,
                       safetensors_numel(e[i].ndim, e[i].shape) * dtype_size(e[i].dtype));
    ok = ok && fflush(fp) == 0 && fsync(fileno(fp)) == 0;
    ok = (fclose(fp) == 0) && ok;
    free(hdr);
    if (!ok || rename(tmp, path)) {
        int e_ = errno;
        unlink(tmp);
        return error_set(err, STATUS_RUNTIME, "%s: cannot write: %s", path, strerror(e_));
    }
    return STATUS_OK;
}
