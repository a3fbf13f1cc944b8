// checkpoint_layout.c: the manifest's layout lines against what the rank
// files hold (checkpoint_check_layout, checkpoint.h). The reader reassembles
// every tensor from its pieces' tags alone, so a hand-edited tp, ep or pp
// read the same data and passed `ckpt verify`; here each file's pieces must
// be the blocks that its world rank's grid coordinates under the manifest's
// layout give (topology_coord_of; the rank order of parallel/axes_list.h).
#include "checkpoint_internal.h"

#include <dirent.h>
#include <string.h>

struct layout_check {
    const struct ckpt_reader *r;
    const struct ckpt_info *in;
    char manifest[CKPT_PATH_MAX + 32];
    char line[256]; // the layout as topology_layout_line writes it
    const struct param_info *params;
    int n_params;
};

// The parameter table row of a stored piece's "<prefix>/<hf name>", NULL when
// none (an optional tensor, the FP8 scaling state; checkpoint_check_tensors
// judges the names).
static const struct param_info *param_of(const struct layout_check *c, const char *name) {
    const char *slash = strchr(name, '/');
    const char *hf = slash ? slash + 1 : name;
    for (int i = 0; i < c->n_params; i++)
        if (!strcmp(c->params[i].name, hf)) return &c->params[i];
    return NULL;
}

// The layer of "<prefix>/model.layers.N[.rest]" (parameters, moments and the
// FP8 scaling state alike), -1 for a tensor of no layer.
static int layer_of(const char *name) {
    const char *slash = strchr(name, '/');
    int layer, used = 0;
    if (sscanf(slash ? slash + 1 : name, "model.layers.%d%n", &layer, &used) != 1) return -1;
    const char *rest = (slash ? slash + 1 : name) + used;
    return *rest == '.' || *rest == '\0' ? layer : -1;
}

// No rank-NNNNN.h5 in the folder beyond the manifest's world_size: the
// layout's world is the number of rank files.
static enum status check_rank_files(const struct layout_check *c, struct error *err) {
    DIR *d = opendir(c->in->path);
    if (!d) return STATUS_OK; // the files were opened: a race, which the reads report
    enum status st = STATUS_OK;
    for (struct dirent *e; !st && (e = readdir(d));) {
        int rank, used = 0;
        if (sscanf(e->d_name, "rank-%5d.h5%n", &rank, &used) == 1 && !e->d_name[used] &&
            rank >= c->in->world_size)
            st = error_set(err, STATUS_BAD_INPUT, "%s: world_size = %d (%s), but the folder also "
                           "holds %s: the rank files are more than the manifest's world",
                           c->manifest, c->in->world_size, c->line, e->d_name);
    }
    closedir(d);
    return st;
}

// Each piece of a tensor split by rows over axis (the q_proj of every layer
// over tp, the routed experts over ep: which(param) says which tensors) is
// its file's block along that axis: rows grows / size at size's coordinate.
static enum status check_row_split(const struct layout_check *c, enum grid_axis axis,
                                   bool (*which)(const struct param_info *), const char *what,
                                   struct error *err) {
    int size = c->in->layout.size[axis], n = checkpoint_n_pieces(c->r);
    const struct param_info *p = NULL;
    const char *key = topology_axis_name(axis);
    for (int i = 0; i < n; i++) {
        int file;
        const struct ckpt_piece *q = checkpoint_piece_at(c->r, i, &file);
        if (i == 0 || strcmp(q->name, checkpoint_piece_at(c->r, i - 1, NULL)->name))
            p = param_of(c, q->name);
        if (!p || !which(p)) continue;
        if (q->grows % size)
            return error_set(err, STATUS_BAD_INPUT, "%s: %s = %d, which does not divide the %d rows "
                             "of %s (%d, %d), the %s split over %s", c->manifest, key, size,
                             q->grows, q->name, q->grows, q->gcols, what, key);
        int at = topology_coord_of(&c->in->layout, file).at[axis], rows = q->grows / size;
        if (q->rows == rows && q->row_offset == at * rows) continue;
        char found[96] = "";
        if (q->rows > 0 && q->grows % q->rows == 0)
            snprintf(found, sizeof found, " (blocks of %d rows: %d %s shards)", q->rows,
                     q->grows / q->rows, key);
        return error_set(err, STATUS_BAD_INPUT, "%s: %s = %d, but %s/rank-%05d.h5 holds rows "
                         "[%d, %d) of %s (%d, %d)%s; %s = %d (%s) gives that file (%s rank %d) "
                         "rows [%d, %d) of the %s", c->manifest, key, size, c->in->path, file,
                         q->row_offset, q->row_offset + q->rows, q->name, q->grows, q->gcols,
                         found, key, size, c->line, key, at, at * rows, at * rows + rows, what);
    }
    return STATUS_OK;
}

static bool is_q_proj(const struct param_info *p) {
    const char *s = strstr(p->name, ".self_attn.q_proj.");
    return s && (!strcmp(s, ".self_attn.q_proj.weight") || !strcmp(s, ".self_attn.q_proj.bias"));
}

static bool is_expert(const struct param_info *p) { return p->expert; }

// Every tensor of a layer lies in the files of one pipeline stage, and the
// layers lie on pp stages (every stage holds at least one layer:
// config_validate's n_layers >= pp x virtual stages).
static enum status check_stages(const struct layout_check *c, struct error *err) {
    int L = c->in->model.n_layers, pp = c->in->layout.size[AXIS_PP], n = checkpoint_n_pieces(c->r);
    int *file_of = xmalloc((size_t)L * sizeof *file_of); // the first file holding layer l, -1 none
    bool *used = xcalloc((size_t)pp, sizeof *used);
    for (int l = 0; l < L; l++) file_of[l] = -1;
    enum status st = STATUS_OK;
    for (int i = 0; !st && i < n; i++) {
        int file;
        const struct ckpt_piece *q = checkpoint_piece_at(c->r, i, &file);
        int l = layer_of(q->name);
        if (l < 0 || l >= L) continue; // checkpoint_check_tensors names a stranger
        int stage = topology_coord_of(&c->in->layout, file).at[AXIS_PP];
        used[stage] = true;
        if (file_of[l] < 0) file_of[l] = file;
        int first = topology_coord_of(&c->in->layout, file_of[l]).at[AXIS_PP];
        if (stage != first)
            st = error_set(err, STATUS_BAD_INPUT, "%s: pp = %d, but layer %d's tensors are in "
                           "%s/rank-%05d.h5 and rank-%05d.h5 (%s), which %s makes stages %d and %d "
                           "(a layer lives on one pipeline stage)", c->manifest, pp, l, c->in->path,
                           file_of[l], file, q->name, c->line, first, stage);
    }
    int stages = 0;
    for (int s = 0; s < pp; s++) stages += used[s];
    if (!st && stages != pp && stages > 0)
        st = error_set(err, STATUS_BAD_INPUT, "%s: pp = %d, but the rank files hold the %d layers "
                       "on %d of its stages (%s): every stage holds layers", c->manifest, pp, L,
                       stages, c->line);
    free(file_of), free(used);
    return st;
}

enum status checkpoint_check_layout(const struct ckpt_reader *r, struct error *err) {
    struct layout_check c = {.r = r, .in = checkpoint_info(r)};
    snprintf(c.manifest, sizeof c.manifest, "%s/manifest.ini", c.in->path);
    topology_layout_line(&c.in->layout, c.line, sizeof c.line);
    struct param_info *params;
    enum status st = model_param_table(&c.in->model, &params, &c.n_params, err);
    if (st) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return error_set(err, STATUS_BAD_INPUT, "%s: [model] is not a model trident builds: %s",
                         c.manifest, why);
    }
    c.params = params;
    // Axis by axis in rank order (tp fastest): an edited key moves the
    // coordinates of its own axis and of the slower ones, so the first
    // refusal names the key that differs.
    if (!st) st = check_rank_files(&c, err);
    if (!st) st = check_row_split(&c, AXIS_TP, is_q_proj, "attention heads", err);
    if (!st) st = check_row_split(&c, AXIS_EP, is_expert, "routed experts", err);
    if (!st) st = check_stages(&c, err);
    free(params);
    return st;
}
