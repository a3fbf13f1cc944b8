// blend.c: the dataset list of a blended run, `[data] paths = a:0.7, b:0.3`
// (the mixture rule is the loader's, dataset.h).
#include "dataset.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

// Copies [b, e) without surrounding whitespace into out (cap bytes); false
// when it does not fit.
static bool trimmed(const char *b, const char *e, char *out, size_t cap) {
    while (b < e && isspace((unsigned char)*b)) b++;
    while (e > b && isspace((unsigned char)e[-1])) e--;
    if ((size_t)(e - b) >= cap) return false;
    memcpy(out, b, (size_t)(e - b));
    out[e - b] = '\0';
    return true;
}

enum status blend_parse(const char *key, const char *text, struct blend_spec *out, struct error *err) {
    memset(out, 0, sizeof *out);
    const char *p = text;
    double sum = 0;
    int weighted = 0; // entries with a weight
    for (int i = 0;; i++) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        char entry[BLEND_PATH_MAX + 64];
        if (!trimmed(p, end, entry, sizeof entry))
            return error_set(err, STATUS_BAD_INPUT, "%s = %s: entry %d is longer than %d bytes", key, text, i + 1,
                             BLEND_PATH_MAX - 1);
        if (!entry[0])
            return error_set(err, STATUS_BAD_INPUT, "%s = %s: entry %d is empty (expected path:weight, "
                             "comma-separated)", key, text, i + 1);
        if (out->n == LOADER_MAX_DATASETS)
            return error_set(err, STATUS_BAD_INPUT, "%s = %s: more than %d datasets", key, text,
                             LOADER_MAX_DATASETS);
        char *colon = strrchr(entry, ':');
        double w = 1;
        if (colon) {
            char *num = colon + 1, *stop;
            while (isspace((unsigned char)*num)) num++;
            errno = 0;
            w = strtod(num, &stop);
            if (!*num || *stop || errno || !isfinite(w) || w <= 0)
                return error_set(err, STATUS_BAD_INPUT, "%s = %s: entry %d '%s': weight '%s' is not a number > 0",
                                 key, text, i + 1, entry, num);
            *colon = '\0';
            weighted++;
        }
        char *path = out->paths[out->n];
        if (!trimmed(entry, entry + strlen(entry), path, BLEND_PATH_MAX) || !path[0])
            return error_set(err, STATUS_BAD_INPUT, "%s = %s: entry %d has no path", key, text, i + 1);
        for (int k = 0; k < out->n; k++)
            if (!strcmp(out->paths[k], path))
                return error_set(err, STATUS_BAD_INPUT, "%s = %s: dataset %s is listed twice", key, text, path);
        out->weights[out->n++] = w;
        sum += w;
        if (!*end) break;
        p = end + 1;
    }
    if (out->n > 1 && weighted != out->n)
        return error_set(err, STATUS_BAD_INPUT, "%s = %s: give every dataset of a blend a weight "
                         "(path:weight)", key, text);
    for (int k = 0; k < out->n; k++) out->weights[k] /= sum;
    return STATUS_OK;
}
