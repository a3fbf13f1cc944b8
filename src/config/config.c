// config.c: reads INI files (inih) and command-line overrides into struct
// config through the key table of config_keys.c; prints the resolved config
// and generates docs/config.md. Syntax rules: the top of config.h.
//
// inih is fed through ini_parse_stream with our own line reader, which (a)
// counts lines, since the packaged inih calls handlers without a line number,
// (b) checks what inih would accept silently: indented lines (read as value
// continuations on Debian's build, INI_ALLOW_MULTILINE=1), `key: value`,
// text after `]`, unknown or empty section names; (c) hands inih a short
// stand-in for lines longer than its 200-byte buffer (see LONG_VALUE_MARK); and
// (d) stops at the first error.
// Inline comments: Debian's inih strips `;` after whitespace; the handler also
// strips `#` after whitespace, so the rule holds whatever inih was built with.
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <strings.h>

// ---- lookup and suggestions ---------------------------------------------------

int config_key_index(const char *section, const char *key) {
    for (int i = 0; i < config_n_keys; i++)
        if (!strcmp(config_keys[i].section, section) && !strcmp(config_keys[i].key, key)) return i;
    return -1;
}

static bool section_known(const char *section) {
    for (int s = 0; config_sections[s]; s++)
        if (!strcmp(config_sections[s], section)) return true;
    return false;
}

// Edit distance (insertions, deletions, substitutions, adjacent transpositions:
// "modle" -> "model" is 1) of the first 63 bytes of a and b.
static int edit_distance(const char *a, const char *b) {
    int na = (int)MIN(strlen(a), 63), nb = (int)MIN(strlen(b), 63);
    int d[64][64];
    for (int i = 0; i <= na; i++) d[i][0] = i;
    for (int j = 0; j <= nb; j++) d[0][j] = j;
    for (int i = 1; i <= na; i++)
        for (int j = 1; j <= nb; j++) {
            int v = MIN(d[i - 1][j - 1] + (a[i - 1] != b[j - 1]), MIN(d[i - 1][j], d[i][j - 1]) + 1);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) v = MIN(v, d[i - 2][j - 2] + 1);
            d[i][j] = v;
        }
    return d[na][nb];
}

// A known name close enough to a typo to suggest: a few edits, or one is a
// prefix of the other ("vocab" for "vocab_size"). Returns the distance or -1.
static int name_closeness(const char *typo, const char *known) {
    if (!strcasecmp(typo, known)) return 1;
    int d = edit_distance(typo, known);
    int limit = MAX(1, (int)strlen(typo) / 3);
    size_t nt = strlen(typo), nk = strlen(known);
    if (d <= limit) return d;
    if (nt >= 3 && nk >= 3 && (!strncmp(typo, known, MIN(nt, nk)))) return d;
    return -1;
}

// out = Megatron-LM's command-line flag of argument name: "--" and name with '-' for '_'.
static void megatron_flag(const char *name, char *out, size_t n) {
    size_t k = (size_t)snprintf(out, n, "--");
    for (; *name && k + 1 < n; name++) out[k++] = *name == '_' ? '-' : *name;
    out[MIN(k, n - 1)] = '\0';
}

bool config_alias_hint(const char *key, char *buf, size_t n) {
    char norm[64];
    size_t len = 0;
    const char *raw = key;
    while (*key == '-') key++;
    for (; *key && len + 1 < sizeof norm; key++) norm[len++] = *key == '-' ? '_' : *key;
    norm[len] = '\0';
    for (int a = 0; a < config_n_aliases; a++) {
        const struct config_alias *al = &config_aliases[a];
        if (strcasecmp(norm, al->name) && !(al->flag && !strcmp(raw, al->flag))) continue;
        char flag[80], mf[64];
        if (al->flag) snprintf(flag, sizeof flag, "llm.c's %s (%s)", al->flag, al->name);
        else megatron_flag(al->name, mf, sizeof mf), snprintf(flag, sizeof flag, "Megatron-LM's %s", mf);
        if (al->target)
            snprintf(buf, n, "; %s is %s here%s%s%s", flag, al->target, al->note ? " (" : "",
                     al->note ? al->note : "", al->note ? ")" : "");
        else snprintf(buf, n, "; %s has no key here: %s", flag, al->note);
        return true;
    }
    return false;
}

// "; did you mean train.lr?" for the closest key (same section preferred), or
// "; keys of [train]: ..." when none is close. Another trainer's name for a
// key (config_aliases) is answered with trident's key instead.
static void suggest_key(const char *section, const char *key, char *buf, size_t n) {
    if (config_alias_hint(key, buf, n)) return;
    int best = -1, best_score = INT_MAX;
    for (int i = 0; i < config_n_keys; i++) {
        int d = name_closeness(key, config_keys[i].key);
        if (d < 0) continue;
        int score = 2 * d + (strcmp(config_keys[i].section, section) != 0);
        if (score < best_score) best_score = score, best = i;
    }
    if (best >= 0) {
        snprintf(buf, n, "; did you mean %s.%s?", config_keys[best].section, config_keys[best].key);
        return;
    }
    size_t len = (size_t)snprintf(buf, n, "; keys of [%s]:", section);
    for (int i = 0; i < config_n_keys && len < n; i++)
        if (!strcmp(config_keys[i].section, section))
            len += (size_t)snprintf(buf + len, n - len, " %s", config_keys[i].key);
}

static void suggest_section(const char *section, char *buf, size_t n) {
    int best = -1, best_d = INT_MAX;
    for (int s = 0; config_sections[s]; s++) {
        int d = name_closeness(section, config_sections[s]);
        if (d >= 0 && d < best_d) best_d = d, best = s;
    }
    if (best >= 0) {
        snprintf(buf, n, "; did you mean [%s]?", config_sections[best]);
        return;
    }
    size_t len = (size_t)snprintf(buf, n, "; sections are");
    for (int s = 0; config_sections[s] && len < n; s++)
        len += (size_t)snprintf(buf + len, n - len, " [%s]", config_sections[s]);
}

// ---- describing values --------------------------------------------------------

// Shortest decimal that reads back to v; integers without an exponent.
static void format_double(double v, char *buf, size_t n) {
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, n, "%.0f", v);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return;
    }
}

static const char size_suffixes[] = "KMGT";

static void format_size(int64_t v, char *buf, size_t n) {
    int s = -1;
    int64_t u = v;
    while (s < 3 && u != 0 && u % 1024 == 0) u /= 1024, s++;
    if (s < 0) snprintf(buf, n, "%lld", (long long)v);
    else snprintf(buf, n, "%lld%c", (long long)u, size_suffixes[s]);
}

// The range of a numeric key as text: "[0, 1)", "> 0", ">= 1", or "".
// full: also the implied 32-bit bounds of an int (error messages; docs omit them).
static void range_text(const struct config_key *k, enum config_type type, bool full, char *buf,
                       size_t n) {
    buf[0] = '\0';
    if (type != CONFIG_INT && type != CONFIG_INT64 && type != CONFIG_FLOAT && type != CONFIG_SIZE) return;
    double lo = k->min, hi = k->max;
    if (type == CONFIG_INT) lo = MAX(lo, (double)INT_MIN), hi = MIN(hi, (double)INT_MAX);
    char a[40], b[40];
    format_double(lo, a, sizeof a);
    format_double(hi, b, sizeof b);
    if (type == CONFIG_SIZE) format_size((int64_t)lo, a, sizeof a);
    bool has_lo = isfinite(lo) && (full || lo > (double)INT_MIN);
    bool has_hi = isfinite(hi) && (full || hi < (double)INT_MAX);
    bool lo_ex = k->flags & CONFIG_MIN_EXCLUSIVE, hi_ex = k->flags & CONFIG_MAX_EXCLUSIVE;
    if (has_lo && has_hi) snprintf(buf, n, "%c%s, %s%c", lo_ex ? '(' : '[', a, b, hi_ex ? ')' : ']');
    else if (has_lo) snprintf(buf, n, "%s %s", lo_ex ? ">" : ">=", a);
    else if (has_hi) snprintf(buf, n, "%s %s", hi_ex ? "<" : "<=", b);
    else buf[0] = '\0';
}

static void describe_scalar(const struct config_key *k, enum config_type type, char *buf, size_t n) {
    char range[96];
    range_text(k, type, true, range, sizeof range);
    const char *what = "?";
    switch (type) {
    case CONFIG_INT: what = "an integer"; break;
    case CONFIG_INT64: what = "a 64-bit integer"; break;
    case CONFIG_FLOAT: what = "a number"; break;
    case CONFIG_SIZE: what = "a size in bytes with an optional K, M, G or T suffix"; break;
    case CONFIG_BOOL: what = "true, false, 1 or 0"; break;
    case CONFIG_PATH: what = "a path"; break;
    case CONFIG_ENUM: break;
    }
    bool interval = range[0] == '[' || range[0] == '(';
    snprintf(buf, n, "%s%s%s", what, range[0] ? (interval ? " in " : " ") : "", range);
}

// What key k accepts, for error messages: "an integer >= 1", "one of: a, b".
static void describe_expected(const struct config_key *k, char *buf, size_t n) {
    if (k->type != CONFIG_ENUM) {
        describe_scalar(k, k->type, buf, n);
        return;
    }
    size_t len = (size_t)snprintf(buf, n, "one of:");
    for (int c = 0; k->choices[c].name && len < n; c++)
        len += (size_t)snprintf(buf + len, n - len, "%s %s", c ? "," : "", k->choices[c].name);
    if (k->has_alt && len < n) {
        char alt[160];
        describe_scalar(k, k->alt_type, alt, sizeof alt);
        snprintf(buf + len, n - len, ", or %s", alt);
    }
}

const char *config_format_value(const struct config *cfg, int i, char *buf, size_t n) {
    const struct config_key *k = &config_keys[i];
    const char *p = (const char *)cfg + k->offset;
    switch (k->type) {
    case CONFIG_INT: snprintf(buf, n, "%d", *(const int *)p); break;
    case CONFIG_INT64: snprintf(buf, n, "%lld", (long long)*(const int64_t *)p); break;
    case CONFIG_FLOAT: format_double(*(const double *)p, buf, n); break;
    case CONFIG_BOOL: snprintf(buf, n, "%s", *(const bool *)p ? "true" : "false"); break;
    case CONFIG_SIZE: format_size(*(const int64_t *)p, buf, n); break;
    case CONFIG_PATH: snprintf(buf, n, "%s", p); break;
    case CONFIG_ENUM: {
        int v = *(const int *)p;
        snprintf(buf, n, "?");
        for (int c = 0; k->choices[c].name; c++)
            if (k->choices[c].value == v) snprintf(buf, n, "%s", k->choices[c].name);
        if (k->has_alt && v == k->alt_value) {
            const char *alt = (const char *)cfg + k->alt_offset;
            if (k->alt_type == CONFIG_FLOAT) format_double(*(const double *)alt, buf, n);
            else snprintf(buf, n, "%s", alt);
        }
        break;
    }
    }
    return buf;
}

const char *config_origin(const struct config *cfg, int i, char *buf, size_t n) {
    int o = cfg->origin[i];
    if (o > 0) snprintf(buf, n, "%s:%d", cfg->file, o);
    else if (o < 0) snprintf(buf, n, "command line argument %d", -o);
    else snprintf(buf, n, "default");
    return buf;
}

// ---- parsing one value ----------------------------------------------------------

static enum status value_error(const struct config_key *k, const char *where, const char *text,
                               const char *problem, struct error *err) {
    char expected[256];
    describe_expected(k, expected, sizeof expected);
    return error_set(err, STATUS_BAD_INPUT, "%s: %s.%s = '%s': %s; expected %s", where, k->section,
                     k->key, text, problem, expected);
}

static bool in_range(const struct config_key *k, double v) {
    if (k->flags & CONFIG_MIN_EXCLUSIVE ? !(v > k->min) : !(v >= k->min)) return false;
    if (k->flags & CONFIG_MAX_EXCLUSIVE ? !(v < k->max) : !(v <= k->max)) return false;
    return true;
}

static const char *trailing_problem(const char *end, char *buf, size_t n) {
    snprintf(buf, n, "trailing text '%s' after the number (an inline comment needs whitespace, then # or ;)",
             end);
    return buf;
}

// Parses text as type into dst (written only on success).
static enum status parse_scalar(const struct config_key *k, enum config_type type, const char *text,
                                void *dst, const char *where, struct error *err) {
    char why[256];
    char *end;
    errno = 0;
    switch (type) {
    case CONFIG_INT:
    case CONFIG_INT64:
    case CONFIG_SIZE: {
        long long v = strtoll(text, &end, 10);
        if (end == text || !(isdigit((unsigned char)text[0]) || text[0] == '-' || text[0] == '+'))
            return value_error(k, where, text, "not an integer", err);
        if (errno == ERANGE) return value_error(k, where, text, "integer overflow", err);
        if (type == CONFIG_SIZE && *end) {
            const char *s = strchr(size_suffixes, toupper((unsigned char)*end));
            if (s && *s && end[1] == '\0') {
                for (int j = 0; j <= s - size_suffixes; j++) {
                    if (v > LLONG_MAX / 1024 || v < LLONG_MIN / 1024)
                        return value_error(k, where, text, "integer overflow", err);
                    v *= 1024;
                }
                end++;
            }
        }
        if (*end) return value_error(k, where, text, trailing_problem(end, why, sizeof why), err);
        if (type == CONFIG_SIZE && v < 0) return value_error(k, where, text, "a size cannot be negative", err);
        if (type == CONFIG_INT && (v < INT_MIN || v > INT_MAX))
            return value_error(k, where, text, "out of range", err);
        if (!in_range(k, (double)v)) return value_error(k, where, text, "out of range", err);
        if (type == CONFIG_INT) *(int *)dst = (int)v;
        else *(int64_t *)dst = (int64_t)v;
        return STATUS_OK;
    }
    case CONFIG_FLOAT: {
        double v = strtod(text, &end);
        if (end == text) return value_error(k, where, text, "not a number", err);
        if (*end) return value_error(k, where, text, trailing_problem(end, why, sizeof why), err);
        if (errno == ERANGE || !isfinite(v))
            return value_error(k, where, text, "not a finite double-precision number", err);
        if (!in_range(k, v)) return value_error(k, where, text, "out of range", err);
        *(double *)dst = v;
        return STATUS_OK;
    }
    case CONFIG_BOOL:
        if (!strcmp(text, "true") || !strcmp(text, "1")) *(bool *)dst = true;
        else if (!strcmp(text, "false") || !strcmp(text, "0")) *(bool *)dst = false;
        else return value_error(k, where, text, "not a boolean", err);
        return STATUS_OK;
    case CONFIG_PATH: {
        size_t len = strlen(text);
        if (len >= CONFIG_PATH_MAX) {
            snprintf(why, sizeof why, "%zu bytes long, the limit is %d", len, CONFIG_PATH_MAX - 1);
            return value_error(k, where, text, why, err);
        }
        if (text[0] == '#' || text[0] == ';')
            return value_error(k, where, text, "a value starting with # or ; would read back as a comment", err);
        if (text[0] == '"' || text[0] == '\'')
            return value_error(k, where, text, "values are not quoted: write the path without quotes", err);
        for (size_t j = 0; j < len; j++) {
            if (iscntrl((unsigned char)text[j]))
                return value_error(k, where, text, "contains a control character", err);
            if ((isspace((unsigned char)text[j]) && (j == 0 || j + 1 == len)) ||
                (isspace((unsigned char)text[j]) && (text[j + 1] == '#' || text[j + 1] == ';')))
                return value_error(k, where, text,
                                   "leading or trailing whitespace, or whitespace before # or ;, "
                                   "cannot be written back to an INI file",
                                   err);
        }
        memcpy(dst, text, len + 1);
        return STATUS_OK;
    }
    case CONFIG_ENUM: break;
    }
    CHECK(0, "config key %s.%s has type %d", k->section, k->key, (int)type);
}

// Sets key i of cfg from text (already stripped of whitespace and comments).
static enum status config_set(struct config *cfg, int i, const char *text, const char *where,
                              struct error *err) {
    const struct config_key *k = &config_keys[i];
    char *dst = (char *)cfg + k->offset;
    if (!text[0]) return value_error(k, where, text, "empty value", err);
    if (k->type != CONFIG_ENUM) return parse_scalar(k, k->type, text, dst, where, err);
    for (int c = 0; k->choices[c].name; c++) {
        if (strcmp(text, k->choices[c].name)) continue;
        *(int *)dst = k->choices[c].value;
        if (k->has_alt) // a keyword clears the alternative so print/load round-trips
            memset((char *)cfg + k->alt_offset, 0,
                   k->alt_type == CONFIG_PATH ? CONFIG_PATH_MAX : sizeof(double));
        return STATUS_OK;
    }
    if (!k->has_alt) return value_error(k, where, text, "not a known choice", err);
    if (k->alt_type == CONFIG_PATH && !strchr(text, '/')) {
        // "resume = Auto" or "autoo" is a typo, not a folder: insist on "./autoo".
        for (int c = 0; k->choices[c].name; c++)
            if (name_closeness(text, k->choices[c].name) >= 0 || !strcasecmp(text, k->choices[c].name)) {
                char why[160];
                snprintf(why, sizeof why, "did you mean %s? (write ./%s for a folder of that name)",
                         k->choices[c].name, text);
                return value_error(k, where, text, why, err);
            }
    }
    enum status st = parse_scalar(k, k->alt_type, text, (char *)cfg + k->alt_offset, where, err);
    if (st == STATUS_OK) *(int *)dst = k->alt_value;
    return st;
}

// ---- defaults, the INI reader, overrides -----------------------------------------

void config_defaults(struct config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < config_n_keys; i++) {
        if (!config_keys[i].def[0]) continue; // an unset optional path
        struct error err;
        enum status st = config_set(cfg, i, config_keys[i].def, "default", &err);
        CHECK(st == STATUS_OK, "bad default in config_keys.c: %s", err.msg);
    }
}

struct load_ctx {
    struct config *cfg;
    const char *path;
    FILE *f;
    int line;    // number of the line inih is processing
    char *raw;   // that line as read
    size_t cap;
    bool failed; // err holds the first error; the reader then reports EOF
    struct error *err;
    const char *long_value; // value of a line longer than inih's buffer, in raw
};

// inih reads into a fixed buffer (INI_MAX_LINE, 200 bytes on Debian). A longer
// `key = value` line reaches inih as `key=` plus this marker, and the handler
// takes the value from the raw line, so paths up to CONFIG_PATH_MAX fit.
#define LONG_VALUE_MARK "\x01"

static char *skip_space(const char *s) {
    while (isspace((unsigned char)*s)) s++;
    return (char *)s;
}

static void strip_right(char *s) {
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
}

// Checks one raw line (without its newline) for what inih would accept silently
// or report without a reason. Returns false after filling c->err.
static bool check_line(struct load_ctx *c, char *s) {
    const char *path = c->path;
    if (c->line == 1 && !strncmp(s, "\xEF\xBB\xBF", 3)) s += 3;
    char *t = skip_space(s);
    if (!*t || *t == '#' || *t == ';') return true;
    if (t != s) {
        error_set(c->err, STATUS_BAD_INPUT,
                  "%s:%d: indented line '%s': indentation is not allowed (inih would read it as a "
                  "continuation of the previous value); remove the leading whitespace",
                  path, c->line, t);
        return false;
    }
    if (*t == '[') {
        char *close = strchr(t, ']');
        if (!close) {
            error_set(c->err, STATUS_BAD_INPUT, "%s:%d: section header '%s' has no closing ']'; expected [section]",
                      path, c->line, t);
            return false;
        }
        char *after = skip_space(close + 1);
        if (*after && *after != '#' && *after != ';') {
            error_set(c->err, STATUS_BAD_INPUT, "%s:%d: text '%s' after the section header; expected [section]",
                      path, c->line, after);
            return false;
        }
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(close - t - 1), t + 1);
        strip_right(name);
        char *nm = skip_space(name);
        if (!section_known(nm)) {
            char hint[256];
            suggest_section(nm, hint, sizeof hint);
            error_set(c->err, STATUS_BAD_INPUT, "%s:%d: unknown section [%s]%s", path, c->line, nm, hint);
            return false;
        }
        return true;
    }
    char *sep = strpbrk(t, "=:");
    if (!sep) {
        error_set(c->err, STATUS_BAD_INPUT,
                  "%s:%d: malformed line '%s': expected 'key = value', '[section]' or a comment", path, c->line, t);
        return false;
    }
    if (*sep == ':') {
        error_set(c->err, STATUS_BAD_INPUT, "%s:%d: malformed line '%s': expected 'key = value' (with '=', not ':')",
                  path, c->line, t);
        return false;
    }
    if (sep == t) {
        error_set(c->err, STATUS_BAD_INPUT, "%s:%d: malformed line '%s': no key before '='", path, c->line, t);
        return false;
    }
    return true;
}

// The longest config line read: far above any path or value (CONFIG_PATH_MAX),
// and a bound on what a file without newlines (/dev/zero) makes us allocate.
#define CONFIG_LINE_MAX (1 << 20)

// Reads the next line of c->f into c->raw (NUL-terminated, newline kept):
// its length, -1 at end of file, -2 after setting c->err (a read error, a
// NUL byte, a line longer than CONFIG_LINE_MAX; issue 18: a failed read was
// taken for the end of the file and the default config ran).
static ssize_t load_line(struct load_ctx *c) {
    size_t len = 0;
    int ch;
    errno = 0;
    while ((ch = getc(c->f)) != EOF) {
        if (ch == 0) {
            error_set(c->err, STATUS_BAD_INPUT, "%s:%d: line contains a NUL byte", c->path, c->line + 1);
            return -2;
        }
        if (len + 2 > c->cap) {
            if (c->cap >= CONFIG_LINE_MAX) {
                error_set(c->err, STATUS_BAD_INPUT, "%s:%d: line longer than %d bytes", c->path, c->line + 1,
                          CONFIG_LINE_MAX);
                return -2;
            }
            c->cap = c->cap ? 2 * c->cap : 256;
            c->raw = realloc(c->raw, c->cap);
            CHECK(c->raw, "out of memory reading %s", c->path);
        }
        c->raw[len++] = (char)ch;
        if (ch == '\n') break;
    }
    if (ferror(c->f)) {
        error_set(c->err, STATUS_BAD_INPUT, "%s:%d: read error: %s", c->path, c->line + 1,
                  strerror(errno ? errno : EIO));
        return -2;
    }
    if (ch == EOF && len == 0) return -1;
    c->raw[len] = '\0';
    return (ssize_t)len;
}

// The ini_reader: one line per call, counted and checked; EOF after an error.
static char *load_reader(char *buf, int num, void *stream) {
    struct load_ctx *c = stream;
    if (c->failed) return NULL;
    ssize_t len = load_line(c);
    if (len == -2) c->failed = true;
    if (len < 0) return NULL;
    c->line++;
    c->long_value = NULL;
    while (len && (c->raw[len - 1] == '\n' || c->raw[len - 1] == '\r')) c->raw[--len] = '\0';
    if (!check_line(c, c->raw)) {
        c->failed = true;
        return NULL;
    }
    if ((size_t)len + 2 < (size_t)num) {
        snprintf(buf, (size_t)num, "%s\n", c->raw);
        return buf;
    }
    // Too long for inih: a comment becomes an empty line; a key line passes its
    // key (check_line accepted it, so it has '=') and the marker.
    char *t = c->raw + (c->line == 1 && !strncmp(c->raw, "\xEF\xBB\xBF", 3) ? 3 : 0);
    t = skip_space(t);
    if (*t == '#' || *t == ';') {
        snprintf(buf, (size_t)num, "\n");
        return buf;
    }
    char *eq = strchr(t, '=');
    if (*t == '[' || !eq || eq - t + 8 > num) {
        error_set(c->err, STATUS_BAD_INPUT, "%s:%d: line is %zd bytes long; the limit is %d outside values",
                  c->path, c->line, len, num - 2);
        c->failed = true;
        return NULL;
    }
    c->long_value = skip_space(eq + 1);
    snprintf(buf, (size_t)num, "%.*s=%s\n", (int)(eq - t), t, LONG_VALUE_MARK);
    return buf;
}

static int load_handler(void *user, const char *section_in, const char *name, const char *value_in) {
    struct load_ctx *c = user;
    if (c->failed) return 0;
    char where[CONFIG_PATH_MAX + 32];
    snprintf(where, sizeof where, "%s:%d", c->path, c->line);
    char section[64];
    snprintf(section, sizeof section, "%s", skip_space(section_in));
    strip_right(section);
    if (!section[0]) {
        char hint[512] = "";
        config_alias_hint(name, hint, sizeof hint);
        error_set(c->err, STATUS_BAD_INPUT, "%s: key '%s' comes before any [section] header%s", where, name,
                  hint);
        c->failed = true;
        return 0;
    }
    int i = config_key_index(section, name);
    if (i < 0) {
        char hint[512];
        suggest_key(section, name, hint, sizeof hint);
        error_set(c->err, STATUS_BAD_INPUT, "%s: unknown key '%s' in [%s]%s", where, name, section, hint);
        c->failed = true;
        return 0;
    }
    // inih has stripped ' ;...' comments; strip ' #...' the same way.
    if (c->long_value && !strcmp(value_in, LONG_VALUE_MARK)) value_in = c->long_value;
    char value[CONFIG_PATH_MAX + 64];
    if (strlen(value_in) >= sizeof value) {
        error_set(c->err, STATUS_BAD_INPUT, "%s: %s.%s = '%.40s...': the value is %zu bytes long; the limit is %d",
                  where, section, name, value_in, strlen(value_in), CONFIG_PATH_MAX - 1);
        c->failed = true;
        return 0;
    }
    snprintf(value, sizeof value, "%s", value_in);
    for (char *p = value; *p; p++) // inih skipped the whitespace before value
        if ((*p == '#' || *p == ';') && (p == value || isspace((unsigned char)p[-1]))) {
            *p = '\0';
            break;
        }
    strip_right(value);
    if (c->cfg->origin[i] > 0) {
        error_set(c->err, STATUS_BAD_INPUT, "%s: %s.%s = '%s': the key is given twice in [%s] (lines %d and %d); "
                  "expected it once", where, section, name, value, section, c->cfg->origin[i], c->line);
        c->failed = true;
        return 0;
    }
    if (config_set(c->cfg, i, value, where, c->err) != STATUS_OK) {
        c->failed = true;
        return 0;
    }
    c->cfg->origin[i] = c->line;
    return 1;
}

static enum status load_file(const char *path, struct config *cfg, struct error *err) {
    struct load_ctx c = {.cfg = cfg, .path = path, .err = err};
    c.f = fopen(path, "r");
    if (!c.f) return error_set(err, STATUS_BAD_INPUT, "cannot open config file '%s': %s", path, strerror(errno));
    snprintf(cfg->file, sizeof cfg->file, "%s", path);
    int rc = ini_parse_stream(load_reader, &c, load_handler, &c);
    bool read_error = ferror(c.f);
    int saved_errno = errno;
    fclose(c.f);
    free(c.raw);
    if (c.failed) return err->status;
    if (read_error)
        return error_set(err, STATUS_BAD_INPUT, "cannot read config file '%s': %s", path, strerror(saved_errno));
    if (rc > 0) return error_set(err, STATUS_BAD_INPUT, "%s:%d: malformed line", path, rc);
    if (rc < 0) return error_set(err, STATUS_RUNTIME, "inih failed on '%s' (code %d)", path, rc);
    return STATUS_OK;
}

static enum status apply_override(struct config *cfg, int n, const char *arg, struct error *err) {
    char where[160];
    snprintf(where, sizeof where, "command line argument %d '%.100s'", n, arg);
    const char *eq = strchr(arg, '=');
    const char *dot = eq ? memchr(arg, '.', (size_t)(eq - arg)) : NULL;
    if (!eq || !dot) {
        char name[64], hint[512] = "";
        snprintf(name, sizeof name, "%.*s", (int)(eq ? eq - arg : (ptrdiff_t)strlen(arg)), arg);
        config_alias_hint(name, hint, sizeof hint);
        return error_set(err, STATUS_BAD_INPUT, "%s: expected section.key=value, e.g. train.lr=3e-4%s", where,
                         hint);
    }
    char section[64], key[64], value[CONFIG_PATH_MAX + 64];
    snprintf(section, sizeof section, "%.*s", (int)(dot - arg), arg);
    snprintf(key, sizeof key, "%.*s", (int)(eq - dot - 1), dot + 1);
    if (strlen(eq + 1) >= sizeof value)
        return error_set(err, STATUS_BAD_INPUT, "%s: the value is %zu bytes long; the limit is %d", where,
                         strlen(eq + 1), CONFIG_PATH_MAX - 1);
    snprintf(value, sizeof value, "%s", skip_space(eq + 1));
    strip_right(value);
    if (!section_known(section)) {
        char hint[256];
        suggest_section(section, hint, sizeof hint);
        return error_set(err, STATUS_BAD_INPUT, "%s: unknown section [%s]%s", where, section, hint);
    }
    int i = config_key_index(section, key);
    if (i < 0) {
        char hint[512];
        suggest_key(section, key, hint, sizeof hint);
        return error_set(err, STATUS_BAD_INPUT, "%s: unknown key '%s' in [%s]%s", where, key, section, hint);
    }
    if (cfg->origin[i] < 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: %s.%s is given twice on the command line (arguments %d and %d)",
                         where, section, key, -cfg->origin[i], n);
    enum status st = config_set(cfg, i, value, where, err);
    if (st == STATUS_OK) cfg->origin[i] = -n;
    return st;
}

enum status config_load(const char *path, int n_overrides, char **overrides, struct config *out,
                        struct error *err) {
    config_defaults(out);
    if (path) {
        enum status st = load_file(path, out, err);
        if (st) return st;
    }
    for (int j = 0; j < n_overrides; j++) {
        enum status st = apply_override(out, j + 1, overrides[j], err);
        if (st) return st;
    }
    return STATUS_OK;
}

// ---- printing, comparing, docs ---------------------------------------------------

// config_print's text; with origins, each key line ends in a comment naming
// where its value came from (an inline comment: config_load reads it back).
static void print_keys(const struct config *cfg, FILE *f, bool origins) {
    fprintf(f, "# trident resolved config: defaults, then %s%s, then command-line overrides\n",
            cfg->file[0] ? "file " : "no file", cfg->file);
    char buf[CONFIG_PATH_MAX + 32], origin[CONFIG_PATH_MAX + 32];
    for (int s = 0; config_sections[s]; s++) {
        fprintf(f, "\n[%s]\n", config_sections[s]);
        for (int i = 0; i < config_n_keys; i++) {
            const struct config_key *k = &config_keys[i];
            if (strcmp(k->section, config_sections[s])) continue;
            config_format_value(cfg, i, buf, sizeof buf);
            // With [data] paths set, path is unused and only its default is
            // allowed (config_validate): written as a comment, so that the
            // text loads and validates again (a run folder's config.ini).
            bool unused = cfg->data.paths[0] && !strcmp(k->section, "data") && !strcmp(k->key, "path") &&
                          !strcmp(config_origin(cfg, i, origin, sizeof origin), "default");
            if (buf[0] && unused) fprintf(f, "# %s = %s (unused: [data] paths is set)", k->key, buf);
            else if (buf[0]) fprintf(f, "%s = %s", k->key, buf);
            else fprintf(f, "# %s = (unset)", k->key);
            if (origins) fprintf(f, "%s# %s", buf[0] ? "    " : ", ", config_origin(cfg, i, origin, sizeof origin));
            fputc('\n', f);
        }
    }
}

struct grid_layout config_grid(const struct config *cfg) {
    const struct parallel_config *p = &cfg->parallel;
    return topology_layout_ep(p->tp, p->pp, p->dp, p->dp_shard, p->cp, MAX(1, p->ep));
}

void config_print(const struct config *cfg, FILE *f) { print_keys(cfg, f, false); }

void config_print_origins(const struct config *cfg, FILE *f) { print_keys(cfg, f, true); }

enum status config_write(const struct config *cfg, const char *header, const char *path,
                         struct error *err) {
    FILE *f = fopen(path, "w");
    if (!f) return error_set(err, STATUS_RUNTIME, "cannot write config '%s': %s", path, strerror(errno));
    for (const char *h = header; h && *h;) { // each line a full-line comment
        int n = (int)strcspn(h, "\n");
        fprintf(f, "# %.*s\n", n, h);
        h += n + (h[n] == '\n');
    }
    config_print(cfg, f);
    bool bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return error_set(err, STATUS_RUNTIME, "cannot write config '%s': %s", path, strerror(errno));
    return STATUS_OK;
}

bool config_equal(const struct config *a, const struct config *b) {
    char x[CONFIG_PATH_MAX + 32], y[CONFIG_PATH_MAX + 32];
    for (int i = 0; i < config_n_keys; i++) {
        const struct config_key *k = &config_keys[i];
        const char *pa = (const char *)a + k->offset, *pb = (const char *)b + k->offset;
        switch (k->type) {
        case CONFIG_FLOAT:
            if (*(const double *)pa != *(const double *)pb) return false;
            break;
        default: // every other type is compared by its canonical text
            if (strcmp(config_format_value(a, i, x, sizeof x), config_format_value(b, i, y, sizeof y)))
                return false;
        }
        if (k->has_alt && k->alt_type == CONFIG_FLOAT &&
            *(const double *)((const char *)a + k->alt_offset) != *(const double *)((const char *)b + k->alt_offset))
            return false;
    }
    return true;
}

static const char docs_header[] =
    "# trident configuration keys\n"
    "\n"
    "Generated from the key table in `src/config/config_keys.c` by `config_write_docs`;\n"
    "`tests/unit/test_config.c` fails when this file and the table disagree.\n"
    "Regenerate with `build/tests/test_config --write-docs`.\n"
    "\n"
    "## Syntax\n"
    "\n"
    "- `trident train CONFIG.ini [section.key=value ...]`: defaults, then the file, then\n"
    "  the overrides in order. An override names one key once.\n"
    "  `trident train --print-config CONFIG.ini [section.key=value ...]` prints the\n"
    "  resolved config, every key with its value and where it came from (`default`,\n"
    "  `FILE:LINE` or `command line argument N`) and exits 0 without training (no MPI;\n"
    "  2 for a bad config); with `--world-size N` it checks and infers the layout as a\n"
    "  run of N ranks would. A run saves the same resolved config as `config.ini` in\n"
    "  its `[log] run_dir`.\n"
    "- `[section]` headers and `key = value` lines. Values are not quoted. A key may\n"
    "  appear once per file. Unknown sections and keys are errors; a close key is\n"
    "  suggested, and a Megatron-LM or llm.c name is answered with trident's key\n"
    "  (the last section below).\n"
    "- A full-line comment starts with `#` or `;`. An inline comment is `#` or `;`\n"
    "  preceded by whitespace and runs to the end of the line. Any other text after a\n"
    "  value is part of it: `steps = 100 total` and `steps = 100abc` are errors.\n"
    "- Lines may not be indented; `key: value` is not accepted; an empty value is an\n"
    "  error (leave an optional key out to keep it unset).\n"
    "- Integers are decimal. Booleans are `true`, `false`, `1`, `0`. Sizes are bytes\n"
    "  with an optional `K`, `M`, `G` or `T` suffix, either case (powers of 1024).\n"
    "  Times are seconds. Enum values are lower case. Paths may not start with `#`,\n"
    "  `;` or a quote, and are at most 511 bytes.\n"
    "- `config_validate` then checks rules across keys: `tp * cp * pp * dp` equals\n"
    "  the number of ranks (`dp = 0` infers `dp = ranks / (tp * cp * pp)`; `ep`\n"
    "  divides dp and adds no ranks); `n_heads % tp == 0`; `n_kv_heads % tp == 0` or\n"
    "  `tp % n_kv_heads == 0`; `n_heads % n_kv_heads == 0`; `d_model % n_heads == 0`\n"
    "  unless `head_dim` is set, and an even head size; `rope_high_freq_factor >\n"
    "  rope_low_freq_factor` with `rope_scaling = llama3`, and the `rope_*` parameter\n"
    "  keys only with a `rope_scaling` that reads them;\n"
    "  `ffn_dim % tp == 0`; `n_layers >= pp * virtual_stages`;\n"
    "  `global_batch_size % (micro_batch_size * dp) == 0`; `seq_len <= max_seq_len`\n"
    "  (and `seq_len % tp == 0` with `sequence_parallel`); `min_lr <= lr`;\n"
    "  `warmup_steps <= steps`; `sample_top_k <= vocab_size`; `device = cuda` only in\n"
    "  a CUDA build and with a head size `<= 256`; `attention = cudnn`\n"
    "  only with `device = cuda`, `dtype = bf16` or `fp16` and `packing = concat`;\n"
    "  every rank of a job resolves the same config (compared at start).\n"
    "- Values that overflow or underflow fp32 by what they do are refused the same\n"
    "  way (exit 2 naming the key, its value and the limit; `check_fp32` in\n"
    "  src/config/config_validate.c): a key held as a float (`init_std`, `norm_eps`,\n"
    "  `lr`, `min_lr`, `weight_decay`, `adam_eps`, `grad_clip`, `label_smoothing`,\n"
    "  the loss scale keys) above FLT_MAX = 3.4e38, or, where it must be positive,\n"
    "  below FLT_MIN = 1.2e-38; `max(init_std, lr)^2 * d_model * head size <=\n"
    "  FLT_MAX * 1e-6` (the first layer's attention scores stay finite);\n"
    "  `rope_theta > 1` (RoPE's frequencies must decrease).\n";

static const char *type_name(const struct config_key *k, char *buf, size_t n) {
    switch (k->type) {
    case CONFIG_INT: return "integer";
    case CONFIG_INT64: return "integer (64-bit)";
    case CONFIG_FLOAT: return "number";
    case CONFIG_BOOL: return "bool";
    case CONFIG_SIZE: return "size";
    case CONFIG_PATH: return k->flags & CONFIG_OPTIONAL ? "path (optional)" : "path";
    case CONFIG_ENUM: break;
    }
    size_t len = 0;
    buf[0] = '\0';
    for (int c = 0; k->choices[c].name && len < n; c++)
        len += (size_t)snprintf(buf + len, n - len, "%s`%s`", c ? ", " : "", k->choices[c].name);
    if (k->has_alt && len < n)
        snprintf(buf + len, n - len, ", or a %s", k->alt_type == CONFIG_FLOAT ? "number" : "path");
    return buf;
}

void config_write_docs(FILE *f) {
    struct config def;
    config_defaults(&def);
    fputs(docs_header, f);
    char type[160], value[CONFIG_PATH_MAX + 32], range[96];
    for (int s = 0; config_sections[s]; s++) {
        fprintf(f, "\n## [%s]\n\n| key | type | default | range | unit | meaning |\n|---|---|---|---|---|---|\n",
                config_sections[s]);
        for (int i = 0; i < config_n_keys; i++) {
            const struct config_key *k = &config_keys[i];
            if (strcmp(k->section, config_sections[s])) continue;
            config_format_value(&def, i, value, sizeof value);
            range[0] = '\0';
            if (k->type != CONFIG_ENUM && k->type != CONFIG_BOOL && k->type != CONFIG_PATH)
                range_text(k, k->type, false, range, sizeof range);
            else if (k->has_alt && k->alt_type == CONFIG_FLOAT)
                range_text(k, k->alt_type, false, range, sizeof range);
            fprintf(f, "| `%s` | %s | %s%s%s | %s | %s | %s |\n", k->key, type_name(k, type, sizeof type),
                    value[0] ? "`" : "", value[0] ? value : "(unset)", value[0] ? "`" : "", range, k->unit,
                    k->doc);
        }
    }
    fputs("\n## Names from Megatron-LM and llm.c\n\n"
          "An unknown key spelt as one of these (Megatron-LM's argument with `_` for `-`, or\n"
          "llm.c's variable; case and `-` for `_` do not matter) is refused naming trident's\n"
          "key. Names trident shares (`lr`, `seed`, `zero_stage`, ...) are not listed.\n\n"
          "| name | Megatron-LM / llm.c flag | trident key | note |\n|---|---|---|---|\n", f);
    // The name column without backquotes: `| \`key\` |` rows are the key tables'
    // (tests/e2e/train_print_config.sh reads them).
    for (int a = 0; a < config_n_aliases; a++) {
        const struct config_alias *al = &config_aliases[a];
        char flag[80], mf[64];
        if (al->flag) snprintf(flag, sizeof flag, "llm.c `%s`", al->flag);
        else megatron_flag(al->name, mf, sizeof mf), snprintf(flag, sizeof flag, "`%s`", mf);
        fprintf(f, "| %s | %s | %s%s%s | %s |\n", al->name, flag, al->target ? "`" : "",
                al->target ? al->target : "(none)", al->target ? "`" : "", al->note ? al->note : "");
    }
}
