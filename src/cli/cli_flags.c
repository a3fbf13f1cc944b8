// cli_flags.c: the one parser of every subcommand's flag table, and the
// --help and docs/cli.md text made from the same rows (cli_flags.h).
#include "cli_flags.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FIELD(opts, row, T) ((T *)((char *)(opts) + (row)->offset))

static bool is_flag(const struct cli_flag *r) { return r->name[0] == '-'; }

// An integral value as digits, anything else as %g: "1048576", "0.01", "1e-05".
static void format_number(double v, char *buf, size_t n) {
    if (v == floor(v) && fabs(v) < 1e18) snprintf(buf, n, "%.0f", v);
    else snprintf(buf, n, "%g", v);
}

// "[1, 64]", "(0, 1)", ">= 0", "> 0", "<= 8", or "" when unbounded.
static void range_text(const struct cli_flag *r, char *buf, size_t n) {
    char a[40], b[40];
    format_number(r->min, a, sizeof a);
    format_number(r->max, b, sizeof b);
    bool lo = isfinite(r->min), hi = isfinite(r->max);
    bool lo_ex = r->flags & CLI_MIN_EXCLUSIVE, hi_ex = r->flags & CLI_MAX_EXCLUSIVE;
    if (lo && hi) snprintf(buf, n, "%c%s, %s%c", lo_ex ? '(' : '[', a, b, hi_ex ? ')' : ']');
    else if (lo) snprintf(buf, n, "%s %s", lo_ex ? ">" : ">=", a);
    else if (hi) snprintf(buf, n, "%s %s", hi_ex ? "<" : "<=", b);
    else buf[0] = '\0';
}

static void choices_text(const struct cli_flag *r, const char *sep, const char *quote, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    for (int c = 0; r->choices[c].name && len < n; c++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s%s%s", c ? sep : "", quote, r->choices[c].name, quote);
}

// What a row accepts, for errors and --help: "an integer in [1, 64]".
static void describe_expected(const struct cli_flag *r, char *buf, size_t n) {
    const char *what = "a value";
    switch (r->type) {
    case CLI_INT: what = "an integer"; break;
    case CLI_INT64: what = "a 64-bit integer"; break;
    case CLI_UINT64: what = "an unsigned 64-bit integer"; break;
    case CLI_FLOAT: what = "a number"; break;
    case CLI_SIZE:
        what = r->flags & CLI_SIZE_GIB      ? "a size in GiB, or with a K, M, G or T suffix"
               : r->flags & CLI_SIZE_DECIMAL ? "a size in bytes with an optional K, M, G or T suffix (powers of 1000)"
                                             : "a size in bytes with an optional K, M, G or T suffix (powers of 1024)";
        break;
    case CLI_ENUM: {
        char list[256];
        choices_text(r, ", ", "", list, sizeof list);
        snprintf(buf, n, "one of: %s", list);
        return;
    }
    case CLI_SWITCH: what = "no value"; break;
    case CLI_STRING: case CLI_LIST: what = "a value"; break;
    case CLI_PATH: case CLI_PATHS: what = "a path"; break;
    }
    char range[96] = "";
    if (r->type == CLI_INT || r->type == CLI_INT64 || r->type == CLI_UINT64 || r->type == CLI_FLOAT ||
        r->type == CLI_SIZE)
        range_text(r, range, sizeof range);
    bool interval = range[0] == '[' || range[0] == '(';
    snprintf(buf, n, "%s%s%s", what, range[0] ? (interval ? " in " : " ") : "", range);
}

static bool in_range(const struct cli_flag *r, double v) {
    if (r->flags & CLI_MIN_EXCLUSIVE ? !(v > r->min) : !(v >= r->min)) return false;
    if (r->flags & CLI_MAX_EXCLUSIVE ? !(v < r->max) : !(v <= r->max)) return false;
    return true;
}

static void list_append(struct cli_list *l, int cap, const char *v, int row) {
    if (!l->values) {
        l->values = xcalloc((size_t)cap, sizeof *l->values);
        l->flag = xcalloc((size_t)cap, sizeof *l->flag);
    }
    l->values[l->n] = v;
    l->flag[l->n++] = row;
}

// Stores the value s of row r (index row) into opts. cap: the most values
// a list can receive (argc). Errors: STATUS_BAD_INPUT naming the flag, s and
// what the row takes.
static enum status set_value(const struct cli_command *cmd, int row, const char *s, void *opts, int cap,
                             struct error *err) {
    const struct cli_flag *r = &cmd->flags[row];
    char *end = NULL;
    bool ok = *s && !isspace((unsigned char)s[0]);
    errno = 0;
    switch (r->type) {
    case CLI_SWITCH: *FIELD(opts, r, bool) = !(r->flags & CLI_OFF); return STATUS_OK;
    case CLI_STRING: case CLI_PATH: *FIELD(opts, r, const char *) = s; return STATUS_OK;
    case CLI_LIST: case CLI_PATHS: list_append(FIELD(opts, r, struct cli_list), cap, s, row); return STATUS_OK;
    case CLI_INT: case CLI_INT64: {
        long long v = strtoll(s, &end, 10);
        ok = ok && !*end && !errno && in_range(r, (double)v) &&
             (r->type != CLI_INT || (v >= INT_MIN && v <= INT_MAX));
        if (ok && r->type == CLI_INT) *FIELD(opts, r, int) = (int)v;
        else if (ok) *FIELD(opts, r, int64_t) = v;
        break;
    }
    case CLI_UINT64: {
        unsigned long long v = strtoull(s, &end, 10);
        ok = ok && s[0] != '-' && !*end && !errno && in_range(r, (double)v);
        if (ok) *FIELD(opts, r, uint64_t) = v;
        break;
    }
    case CLI_FLOAT: {
        double v = strtod(s, &end);
        ok = ok && !*end && isfinite(v) && in_range(r, v);
        if (ok) *FIELD(opts, r, double) = v;
        break;
    }
    case CLI_SIZE: {
        double v = strtod(s, &end), unit = r->flags & CLI_SIZE_GIB ? 1073741824.0 : 1;
        const char *units = "KMGT", *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
        if (u) {
            unit = pow(r->flags & CLI_SIZE_DECIMAL ? 1000.0 : 1024.0, (double)(u - units + 1));
            end++;
        }
        if (*end == 'B' || *end == 'b') end++;
        v *= unit;
        ok = ok && end != s && !*end && isfinite(v) && v < 9.2e18 && in_range(r, v);
        if (ok) *FIELD(opts, r, int64_t) = (int64_t)v;
        break;
    }
    case CLI_ENUM:
        ok = false;
        for (int c = 0; r->choices[c].name && !ok; c++)
            if (!strcmp(s, r->choices[c].name)) *FIELD(opts, r, int) = r->choices[c].value, ok = true;
        break;
    }
    if (ok) return STATUS_OK;
    char want[320];
    describe_expected(r, want, sizeof want);
    return error_set(err, STATUS_BAD_INPUT, "%s '%s': expected %s", r->name, s, want);
}

enum status cli_parse(const struct cli_command *cmd, int argc, char **argv, void *opts, struct error *err) {
    int cap = argc > 0 ? argc : 1;
    for (int k = 0; k < cmd->n_flags; k++) { // defaults
        const struct cli_flag *r = &cmd->flags[k];
        if (r->type == CLI_LIST || r->type == CLI_PATHS) *FIELD(opts, r, struct cli_list) = (struct cli_list){0};
        else if (r->type == CLI_SWITCH) {
            if (!(r->flags & CLI_OFF)) *FIELD(opts, r, bool) = r->def && !strcmp(r->def, "true");
        } else if (r->def) {
            struct error e = {0};
            CHECK(set_value(cmd, k, r->def, opts, cap, &e) == STATUS_OK, "trident %s: the table's default: %s",
                  cmd->name, e.msg);
        } else if (r->type == CLI_STRING || r->type == CLI_PATH) *FIELD(opts, r, const char *) = NULL;
    }
    int next_pos = 0; // the next positional row to fill (index among all rows)
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int row = -1;
        if (a[0] == '-' && a[1]) {
            for (int k = 0; k < cmd->n_flags && row < 0; k++)
                if (is_flag(&cmd->flags[k]) && !strcmp(a, cmd->flags[k].name)) row = k;
            if (row < 0) return error_set(err, STATUS_BAD_INPUT, "unknown option '%s'", a);
            const struct cli_flag *r = &cmd->flags[row];
            if (r->type == CLI_SWITCH) {
                set_value(cmd, row, "", opts, cap, err);
            } else if (r->type == CLI_PATHS) {
                int before = FIELD(opts, r, struct cli_list)->n;
                while (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) set_value(cmd, row, argv[++i], opts, cap, err);
                if (FIELD(opts, r, struct cli_list)->n == before)
                    return error_set(err, STATUS_BAD_INPUT, "%s needs at least one %s", a, r->metavar);
            } else {
                if (i + 1 >= argc) return error_set(err, STATUS_BAD_INPUT, "%s needs a value (%s)", a, r->metavar);
                if (set_value(cmd, row, argv[++i], opts, cap, err)) return err->status;
            }
            continue;
        }
        while (next_pos < cmd->n_flags && is_flag(&cmd->flags[next_pos])) next_pos++;
        if (next_pos >= cmd->n_flags) return error_set(err, STATUS_BAD_INPUT, "unexpected argument '%s'", a);
        set_value(cmd, next_pos, a, opts, cap, err);
        if (cmd->flags[next_pos].type != CLI_LIST) next_pos++;
    }
    for (int k = 0; k < cmd->n_flags; k++) { // positionals left out
        const struct cli_flag *r = &cmd->flags[k];
        if (is_flag(r) || (r->flags & CLI_OPTIONAL)) continue;
        bool given = r->type == CLI_LIST ? FIELD(opts, r, struct cli_list)->n > 0 : *FIELD(opts, r, const char *) != NULL;
        if (!given) return error_set(err, STATUS_BAD_INPUT, "%s is required", r->name);
    }
    return STATUS_OK;
}

void cli_free(const struct cli_command *cmd, void *opts) {
    for (int k = 0; k < cmd->n_flags; k++) {
        const struct cli_flag *r = &cmd->flags[k];
        if (r->type != CLI_LIST && r->type != CLI_PATHS) continue;
        struct cli_list *l = FIELD(opts, r, struct cli_list);
        free(l->values);
        free(l->flag);
        *l = (struct cli_list){0};
    }
}

bool cli_is_help(int argc, char **argv) {
    return argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
}

// ---- --help and docs/cli.md ----------------------------------------------------------------

// "--max-new-tokens N", "MODEL_DIR", "--input PATH..."
static void row_label(const struct cli_flag *r, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s%s", r->name, is_flag(r) && r->metavar ? " " : "", is_flag(r) && r->metavar ? r->metavar : "",
             r->type == CLI_PATHS || (!is_flag(r) && r->type == CLI_LIST) ? "..." : "");
}

// The help's parenthesis after a row's doc: what it takes and its default.
static void help_facts(const struct cli_flag *r, char *buf, size_t n) {
    char want[320] = "";
    if (r->type != CLI_SWITCH && r->type != CLI_STRING && r->type != CLI_PATH && r->type != CLI_LIST &&
        r->type != CLI_PATHS)
        describe_expected(r, want, sizeof want);
    if (r->type == CLI_LIST) snprintf(want, sizeof want, is_flag(r) ? "repeatable" : "any number");
    if (!is_flag(r)) {
        if (r->flags & CLI_OPTIONAL && r->type != CLI_LIST) snprintf(want, sizeof want, "optional");
    }
    bool show_def = r->def && !(r->flags & CLI_HIDDEN_DEFAULT) && r->type != CLI_SWITCH;
    if (!want[0] && !show_def) {
        buf[0] = '\0';
        return;
    }
    snprintf(buf, n, " (%s%s%s%s)", want, want[0] && show_def ? "; " : "", show_def ? "default " : "",
             show_def ? r->def : "");
}

// Writes text from column col, wrapping at 100 columns with continuation
// lines indented by indent; a word never breaks.
static void write_wrapped(FILE *f, const char *text, int col, int indent) {
    const int width = 100;
    const char *p = text;
    while (*p) {
        while (*p == ' ') p++;
        size_t w = strcspn(p, " ");
        if (!w) break;
        if (col > indent && col + 1 + (int)w > width) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fwrite(p, 1, w, f);
        col += (int)w;
        p += w;
    }
    fputc('\n', f);
}

void cli_print_help(const struct cli_command *cmd, FILE *f) {
    fprintf(f, "usage: trident %s %s\n", cmd->name, cmd->synopsis);
    if (cmd->summary) fprintf(f, "%s\n", cmd->summary);
    const int col = 26;
    for (int pass = 0; pass < 2; pass++) {
        bool any = false;
        for (int k = 0; k < cmd->n_flags; k++) {
            const struct cli_flag *r = &cmd->flags[k];
            if (is_flag(r) != (pass == 1)) continue;
            if (!any) fprintf(f, "\n%s:\n", pass ? "options" : "arguments");
            any = true;
            char label[128], facts[512], text[4096];
            row_label(r, label, sizeof label);
            help_facts(r, facts, sizeof facts);
            snprintf(text, sizeof text, "%s%s", r->doc, facts);
            int used = fprintf(f, "  %s", label);
            if (used + 2 > col) fprintf(f, "\n%*s", col, "");
            else fprintf(f, "%*s", col - used, "");
            write_wrapped(f, text, col, col);
        }
    }
    if (cmd->notes) fprintf(f, "\n%s", cmd->notes);
}

void cli_print_synopsis(const struct cli_command *cmd, FILE *f) {
    fprintf(f, "  trident %s %s\n", cmd->name, cmd->synopsis);
    if (!cmd->summary) return;
    char first[1024];
    size_t n = 0;
    for (const char *p = cmd->summary; *p && n + 1 < sizeof first; p++) {
        first[n++] = *p == '\n' ? ' ' : *p;
        if (*p == '.' && (!p[1] || p[1] == ' ' || p[1] == '\n')) break;
    }
    first[n] = '\0';
    fprintf(f, "      ");
    write_wrapped(f, first, 6, 6);
}

// s with '|' escaped for a Markdown table cell.
static void md_cell(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|') fputc('\\', f);
        fputc(*s == '\n' ? ' ' : *s, f);
    }
}

static const char *type_name(const struct cli_flag *r) {
    switch (r->type) {
    case CLI_SWITCH: return "switch";
    case CLI_INT: return "integer";
    case CLI_INT64: return "integer (64-bit)";
    case CLI_UINT64: return "integer (unsigned 64-bit)";
    case CLI_FLOAT: return "number";
    case CLI_SIZE: return "size";
    case CLI_ENUM: return "enum";
    case CLI_STRING: return "text";
    case CLI_PATH: return "path";
    case CLI_LIST: return is_flag(r) ? "text, repeatable" : "text, any number";
    case CLI_PATHS: return "paths, one or more";
    }
    return "?";
}

void cli_write_markdown(const struct cli_command *cmd, FILE *f) {
    fprintf(f, "\n## trident %s\n\n`trident %s %s`\n\n", cmd->name, cmd->name, cmd->synopsis);
    if (cmd->summary) fprintf(f, "%s\n", cmd->summary);
    if (cmd->n_flags) fprintf(f, "\n| argument | type | range | default | meaning |\n|---|---|---|---|---|\n");
    for (int k = 0; k < cmd->n_flags; k++) {
        const struct cli_flag *r = &cmd->flags[k];
        char label[128], range[256] = "";
        row_label(r, label, sizeof label);
        if (r->type == CLI_ENUM) choices_text(r, ", ", "`", range, sizeof range);
        else if (r->type != CLI_SWITCH && r->type != CLI_STRING && r->type != CLI_PATH && r->type != CLI_LIST &&
                 r->type != CLI_PATHS)
            range_text(r, range, sizeof range);
        fprintf(f, "| `%s` | %s | ", label, type_name(r));
        md_cell(f, range);
        fputs(" | ", f);
        if (!is_flag(r)) fputs(r->flags & CLI_OPTIONAL ? "(optional)" : "(required)", f);
        else if (r->type == CLI_SWITCH) fputs(r->flags & CLI_OFF ? "" : r->def ? "on" : "off", f);
        else if (r->def && !(r->flags & CLI_HIDDEN_DEFAULT)) fprintf(f, "`%s`", r->def);
        fputs(" | ", f);
        md_cell(f, r->doc);
        fputs(" |\n", f);
    }
    if (cmd->notes) fprintf(f, "\n%s", cmd->notes);
}
