// h5util.c: HDF5 helpers (h5util.h).
#include "h5util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

bool h5util_read_attr_str(hid_t loc, const char *name, char *out, size_t cap) {
    if (cap == 0 || H5Aexists(loc, name) <= 0) return false;
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
