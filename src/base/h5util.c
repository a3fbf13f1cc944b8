// h5util.c: HDF5 helpers (h5util.h).
#include "h5util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

bool h5util_attr_is(hid_t loc, const char *name, H5T_class_t cls, size_t n) {
    if (H5Aexists(loc, name) <= 0) return false;
    hid_t attr = H5Aopen(loc, name, H5P_DEFAULT);
    if (attr < 0) return false;
    hid_t type = H5Aget_type(attr), space = H5Aget_space(attr);
    int rank = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    hssize_t points = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
    bool ok = type >= 0 && H5Tget_class(type) == cls && points == (hssize_t)n &&
              (rank == 1 || (rank == 0 && n == 1));
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    H5Aclose(attr);
    return ok;
}

const char *h5util_attr_describe(hid_t loc, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "missing");
    if (H5Aexists(loc, name) <= 0) return out;
    hid_t attr = H5Aopen(loc, name, H5P_DEFAULT);
    if (attr < 0) return snprintf(out, cap, "unreadable"), out;
    hid_t type = H5Aget_type(attr), space = H5Aget_space(attr);
    H5T_class_t cls = type >= 0 ? H5Tget_class(type) : H5T_NO_CLASS;
    const char *kind = cls == H5T_INTEGER ? "integer" : cls == H5T_FLOAT ? "float" : cls == H5T_STRING ? "string"
                                                                                                  : "non-numeric";
    hsize_t dims[H5S_MAX_RANK];
    int rank = space >= 0 ? H5Sget_simple_extent_dims(space, dims, NULL) : -1;
    if (rank == 0) {
        snprintf(out, cap, "%s %s", cls == H5T_INTEGER ? "an" : "a", kind);
    } else if (rank > 0) {
        char shape[96] = "";
        size_t k = 0;
        for (int i = 0; i < rank && k < sizeof shape - 24; i++)
            k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%llu", i ? ", " : "", (unsigned long long)dims[i]);
        snprintf(out, cap, "a (%s) %s array", shape, kind);
    } else {
        snprintf(out, cap, "of an empty or unknown shape");
    }
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    H5Aclose(attr);
    return out;
}

bool h5util_read_attr_i64(hid_t loc, const char *name, int64_t *out) {
    if (!h5util_attr_is(loc, name, H5T_INTEGER, 1)) return false;
    hid_t attr = H5Aopen(loc, name, H5P_DEFAULT);
    int64_t v = 0;
    bool ok = attr >= 0 && H5Aread(attr, H5T_NATIVE_INT64, &v) >= 0;
    if (attr >= 0) H5Aclose(attr);
    if (ok) *out = v;
    return ok;
}

hid_t h5util_open_dataset(hid_t loc, const char *name, hid_t dapl, const char **why) {
    H5L_info_t li;
    if (H5Lexists(loc, name, H5P_DEFAULT) <= 0 || H5Lget_info(loc, name, &li, H5P_DEFAULT) < 0) {
        *why = "missing";
        return H5I_INVALID_HID;
    }
    if (li.type != H5L_TYPE_HARD) {
        *why = li.type == H5L_TYPE_SOFT ? "a soft link, not a dataset of its own"
                                        : "an external link (its data would lie outside this file)";
        return H5I_INVALID_HID;
    }
    hid_t ds = H5Dopen2(loc, name, dapl);
    if (ds < 0) {
        *why = "not a readable dataset";
        return H5I_INVALID_HID;
    }
    hid_t dcpl = H5Dget_create_plist(ds);
    H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
    int external = dcpl >= 0 ? H5Pget_external_count(dcpl) : -1;
    if (dcpl >= 0) H5Pclose(dcpl);
    if ((layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED) || external != 0) {
        *why = external ? "stored in external files (H5Pset_external), outside this file"
                        : "in a layout other than contiguous or chunked";
        H5Dclose(ds);
        return H5I_INVALID_HID;
    }
    return ds;
}

bool h5util_read_attr_str(hid_t loc, const char *name, char *out, size_t cap) {
    if (cap == 0 || !h5util_attr_is(loc, name, H5T_STRING, 1)) return false;
    hid_t attr = H5Aopen(loc, name, H5P_DEFAULT);
    if (attr < 0) return false;
    hid_t type = H5Aget_type(attr);
    char *s = NULL;
    bool ok = false;
    if (H5Tget_class(type) == H5T_STRING) {
        if (H5Tis_variable_str(type) > 0) {
            hid_t mem = H5Tcopy(H5T_C_S1);
            H5Tset_size(mem, H5T_VARIABLE);
            if (H5Aread(attr, mem, &s) >= 0 && s) {
                ok = strlen(s) < cap;
                if (ok) memcpy(out, s, strlen(s) + 1);
                H5free_memory(s);
            }
            H5Tclose(mem);
        } else {
            size_t size = H5Tget_size(type);
            s = xcalloc(size + 1, 1);
            hid_t mem = H5Tcopy(H5T_C_S1);
            H5Tset_size(mem, size + 1); // room for the NUL of a fixed string stored without one
            if (H5Aread(attr, mem, s) >= 0) {
                ok = strlen(s) < cap;
                if (ok) memcpy(out, s, strlen(s) + 1);
            }
            H5Tclose(mem);
            free(s);
        }
    }
    H5Tclose(type);
    H5Aclose(attr);
    return ok;
}

void h5util_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

hid_t h5util_fapl(void) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0) return H5P_DEFAULT;
    // use_file_locking = false: no flock/fcntl call at all; ignore_when_disabled
    // = true matters only if an environment setting turns locking back on.
    if (H5Pset_file_locking(fapl, false, true) < 0) {
        H5Pclose(fapl);
        return H5P_DEFAULT;
    }
    return fapl;
}

void h5util_fapl_close(hid_t fapl) {
    if (fapl != H5P_DEFAULT) H5Pclose(fapl);
}
