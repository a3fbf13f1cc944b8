// checkpoint.c: writing checkpoints (checkpoint.h): rank files in HDF5, the
// manifest, the commit protocol and rotation. Every durable write goes
// through durable.c so that crash tests can fail or kill it.
#include "checkpoint_internal.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "base/checksum.h"
#include "base/h5util.h"
#include "durable.h"

// The system's reason for a failed HDF5 write (HDF5 leaves the errno of the
// call that failed): its text, or a plain statement when there is none.
static const char *os_reason(int e) {
    return e ? strerror(e) : "HDF5 reported no system error (see HDF5's error stack)";
}

static void tmp_dir_path(const struct ckpt_save_args *a, char *out) {
    char name[64];
    ckpt_step_name(name, sizeof name, a->step);
    snprintf(out, CKPT_PATH_MAX, "%s/%s.tmp", a->dir, name);
}

// Removing a step-N folder: first renamed out of the checkpoint namespace
// (to removing-step-N), then deleted, so that a kill during the removal
// leaves no half-removed step-N that resume or `ckpt verify` would refuse.
static enum status remove_step_folder(const char *dir, const char *name, struct error *err) {
    char from[CKPT_PATH_MAX], to[CKPT_PATH_MAX + 16];
    snprintf(from, sizeof from, "%s/%s", dir, name);
    snprintf(to, sizeof to, "%s/removing-%s", dir, name);
    enum status st = durable_rename(from, to, err);
    return st ? st : durable_remove_tree(to, err);
}

// Removes leftovers of crashed saves: step-*.tmp folders, latest.tmp and
// removing-step-* (a removal a kill interrupted).
static enum status remove_stale(const char *dir, struct error *err) {
    DIR *d = opendir(dir);
    if (!d) return error_set(err, STATUS_RUNTIME, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *e;
    enum status st = STATUS_OK;
    char path[CKPT_PATH_MAX];
    while (!st && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        int stale = (!strncmp(e->d_name, "step-", 5) && n > 4 && !strcmp(e->d_name + n - 4, ".tmp")) ||
                    !strcmp(e->d_name, "latest.tmp") || !strncmp(e->d_name, "removing-step-", 14);
        if (!stale) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        st = durable_remove_tree(path, err);
    }
    closedir(d);
    return st;
}

// prepare without the fsync of dir (with_fsync false: an asynchronous
// save's begin, whose rank-0 writer fsyncs it, off the training thread; the
// commit's renames come after it either way).
static enum status prepare(const struct ckpt_save_args *a, bool with_fsync, struct error *err) {
    char tmp[CKPT_PATH_MAX];
    tmp_dir_path(a, tmp);
    enum status st;
    if ((st = durable_mkdir(a->dir, err)) || (st = remove_stale(a->dir, err)) ||
        (st = durable_mkdir(tmp, err)) || (with_fsync && (st = durable_fsync_dir(a->dir, err))))
        return st;
    return STATUS_OK;
}

enum status checkpoint_prepare(const struct ckpt_save_args *a, struct error *err) {
    return prepare(a, true, err);
}

// Attribute helpers: scalars and small arrays on a group or dataset.
static int attr_write(hid_t loc, const char *name, hid_t type, size_t n, const void *v) {
    hsize_t dims = n;
    hid_t space = n == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &dims, NULL);
    hid_t attr = H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    int bad = attr < 0 || H5Awrite(attr, type, v) < 0;
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    return bad;
}

static int attr_write_str(hid_t loc, const char *name, const char *s) {
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, strlen(s) + 1);
    int bad = attr_write(loc, name, type, 1, s);
    H5Tclose(type);
    return bad;
}

// Writes n elements of esize bytes into the 1-D dataset ds in slices of
// 8 MiB: the thread-safe HDF5 library holds one lock per call, and an
// asynchronous save's writer must not hold it for a whole large tensor while
// the training thread's loader waits to read its batch (src/data/shard.c).
// The file's bytes are those of one write. Returns nonzero on a failure.
static int write_slices(hid_t ds, hid_t type, hid_t space, hsize_t n, size_t esize, const void *data) {
    const hsize_t slice = (8u << 20) / esize;
    if (n <= slice) return n > 0 && H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0;
    int bad = 0;
    for (hsize_t at = 0; !bad && at < n; at += slice) {
        hsize_t count = MIN(slice, n - at);
        hid_t mem = H5Screate_simple(1, &count, NULL);
        bad = mem < 0 || H5Sselect_hyperslab(space, H5S_SELECT_SET, &at, NULL, &count, NULL) < 0 ||
              H5Dwrite(ds, type, mem, space, H5P_DEFAULT, (const char *)data + at * esize) < 0;
        if (mem >= 0) H5Sclose(mem);
    }
    return bad;
}

static int write_piece(hid_t group, int i, const struct ckpt_piece *p) {
    char dname[16];
    snprintf(dname, sizeof dname, "%05d", i);
    hsize_t n = p->flat_end - p->flat_begin;
    hid_t space = H5Screate_simple(1, &n, NULL);
    hid_t type = ckpt_h5_type(p->dtype);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_obj_track_times(dcpl, 0); // the same pieces give the same bytes (no object times)
    hid_t ds = H5Dcreate2(group, dname, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Pclose(dcpl);
    int bad = ds < 0 || write_slices(ds, type, space, n, dtype_size(p->dtype), p->data);
    int64_t shape[6] = {p->grows, p->gcols, p->row_offset, p->col_offset, p->rows, p->cols};
    uint64_t flat[2] = {p->flat_begin, p->flat_end};
    if (!bad)
        bad = attr_write_str(ds, "name", p->name) || attr_write_str(ds, "dtype", dtype_name(p->dtype)) ||
              attr_write(ds, "shape", H5T_NATIVE_INT64, 6, shape) ||
              attr_write(ds, "flat_range", H5T_NATIVE_UINT64, 2, flat);
    if (ds >= 0) H5Dclose(ds);
    H5Sclose(space);
    return bad;
}

// A group without object times (write_piece).
static hid_t group_create(hid_t loc, const char *name) {
    hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
    H5Pset_obj_track_times(gcpl, 0);
    hid_t g = H5Gcreate2(loc, name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
    H5Pclose(gcpl);
    return g;
}

// /state: the step (the layer's own, checked against the manifest on open)
// and the owners' named entries (base/state_entry.h), each under its name.
static int write_state(hid_t file, int64_t step, const struct state_entry *e, int n) {
    hid_t g = group_create(file, "state");
    if (g < 0) return 1;
    int bad = attr_write(g, "step", H5T_NATIVE_INT64, 1, &step);
    for (int i = 0; !bad && i < n; i++) {
        if (e[i].read_only) continue;
        CHECK(e[i].count >= 1 && H5Aexists(g, e[i].name) == 0, "checkpoint entry %s: count %d, or its name "
              "is taken", e[i].name, e[i].count);
        hid_t type = e[i].type == STATE_I64 ? H5T_NATIVE_INT64 : e[i].type == STATE_U64 ? H5T_NATIVE_UINT64
                                                                                      : H5T_NATIVE_DOUBLE;
        bad = attr_write(g, e[i].name, type, (size_t)e[i].count, e[i].value);
    }
    H5Gclose(g);
    return bad;
}

enum status checkpoint_write_rank(const struct ckpt_save_args *a, struct ckpt_file_sum *sum,
                                  struct error *err) {
    char path[CKPT_PATH_MAX + 32], tmp[CKPT_PATH_MAX];
    tmp_dir_path(a, tmp);
    snprintf(path, sizeof path, "%s/rank-%05d.h5", tmp, a->rank);
    for (int i = 0; i < a->n_pieces; i++) {
        const char *why = ckpt_piece_tags_error(&a->pieces[i]);
        CHECK(!why, "checkpoint piece %s: %s", a->pieces[i].name, why);
    }
    // Never a checkpoint with a NaN or an infinity: it would become `latest`
    // and rotation would delete the good ones before it.
    for (int i = 0; i < a->n_pieces; i++) {
        const struct ckpt_piece *p = &a->pieces[i];
        size_t first = 0, bad = ckpt_count_nonfinite(p->data, p->dtype, p->flat_end - p->flat_begin,
                                                     &first);
        if (bad)
            return error_set(err, STATUS_RUNTIME, "checkpoint step %lld refused: tensor %s holds "
                             "%zu non-finite values (the first at element %zu of its block); "
                             "nothing written", (long long)a->step, p->name, bad,
                             p->flat_begin + first);
    }
    enum status st = durable_point("h5_create", path, true, err);
    if (st) return st;
    h5util_quiet();
    errno = 0; // what a failed HDF5 call below leaves is the system's reason
    hid_t fapl = h5util_fapl();
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    h5util_fapl_close(fapl);
    if (file < 0) return error_set(err, STATUS_RUNTIME, "%s: cannot create HDF5 file: %s", path, os_reason(errno));
    int version = CKPT_FORMAT_VERSION;
    int64_t step = a->step, rank = a->rank;
    int bad = attr_write(file, "format_version", H5T_NATIVE_INT, 1, &version) ||
              attr_write(file, "step", H5T_NATIVE_INT64, 1, &step) ||
              attr_write(file, "rank", H5T_NATIVE_INT64, 1, &rank) ||
              write_state(file, step, a->entries, a->n_entries);
    hid_t g = bad ? -1 : group_create(file, "pieces");
    if (g < 0) bad = 1;
    for (int i = 0; !bad && i < a->n_pieces; i++) {
        if (write_piece(g, i, &a->pieces[i])) {
            int e = errno;
            H5Gclose(g), H5Fclose(file);
            return error_set(err, STATUS_RUNTIME, "%s: writing tensor %s failed: %s", path,
                             a->pieces[i].name, os_reason(e));
        }
    }
    if (g >= 0) H5Gclose(g);
    int e = errno;
    if (H5Fclose(file) < 0 || bad)
        return error_set(err, STATUS_RUNTIME, "%s: writing the HDF5 file failed: %s", path,
                         os_reason(bad ? e : errno));
    if ((st = durable_fsync_path(path, err))) return st;
    char sumtxt[64];
    if ((st = checksum_file(path, sumtxt, err))) return st;
    struct stat s;
    if (stat(path, &s)) return error_set(err, STATUS_RUNTIME, "%s: stat: %s", path, strerror(errno));
    sum->xxh3 = strtoull(sumtxt + strlen("xxh3-64:"), NULL, 16);
    sum->bytes = (uint64_t)s.st_size;
    return STATUS_OK;
}

// Appends printf text to a growing buffer.
struct text {
    char *buf;
    size_t len, cap;
};
__attribute__((format(printf, 2, 3))) static void text_add(struct text *t, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        t->cap = t->cap * 2 + (size_t)n + 256;
        char *nb = xmalloc(t->cap);
        memcpy(nb, t->buf, t->len);
        free(t->buf);
        t->buf = nb;
    }
}

static char *manifest_text(const struct ckpt_save_args *a, const struct ckpt_file_sum *sums,
                           size_t *len) {
    struct text t = {xmalloc(4096), 0, 4096};
    const struct llama_config *m = a->model;
    int world = topology_world_size(&a->layout);
    text_add(&t, "# trident checkpoint manifest (docs/formats.md)\n[checkpoint]\n");
    text_add(&t, "format_version = %d\nstep = %lld\nworld_size = %d\n", CKPT_FORMAT_VERSION,
             (long long)a->step, world);
    // The layout lines: every named size of the grid (tp, dp, dp_shard,
    // dp_replicate, pp: parallel/axes_list.h).
    const char *names[GROUP_COUNT];
    int sizes[GROUP_COUNT], n_sizes = topology_layout_sizes(&a->layout, false, names, sizes);
    for (int i = 0; i < n_sizes; i++) text_add(&t, "%s = %d\n", names[i], sizes[i]);
    text_add(&t, "zero_stage = %d\ntokenizer = %s\n", a->zero_stage,
             a->tokenizer_id ? a->tokenizer_id : "");
    if (a->weights_only) // only then: older readers see the manifests they know
        text_add(&t, "weights_only = 1\n");
    text_add(&t, "\n[model]\nvocab_size = %d\nd_model = %d\nn_layers = %d\nn_heads = %d\n",
             m->vocab_size, m->d_model, m->n_layers, m->n_heads);
    text_add(&t, "n_kv_heads = %d\nffn_dim = %d\nmax_seq_len = %d\nrope_theta = %.17g\n",
             m->n_kv_heads, m->ffn_dim, m->max_seq_len, m->rope_theta);
    text_add(&t, "norm_eps = %.9g\ntie_embeddings = %d\n", (double)m->norm_eps,
             m->tie_embeddings ? 1 : 0);
    // issue 28's options: the head size always (absent in older manifests:
    // d_model / n_heads), the rest 0 / none when off; the scaling's numbers
    // only with a scaling
    text_add(&t, "head_dim = %d\nqkv_bias = %d\nqk_norm = %d\nrope_scaling = %s\n",
             llama_head_dim(m), m->qkv_bias ? 1 : 0, m->qk_norm ? 1 : 0,
             ckpt_rope_scaling_name(m->rope_scaling.type));
    if (m->rope_scaling.type != ROPE_SCALING_NONE)
        text_add(&t, "rope_scaling_factor = %.17g\nrope_low_freq_factor = %.17g\n"
                 "rope_high_freq_factor = %.17g\nrope_original_max_pos = %d\n",
                 m->rope_scaling.factor, m->rope_scaling.low_freq_factor,
                 m->rope_scaling.high_freq_factor, m->rope_scaling.original_max_pos);
    // issue 31: the mixture-of-experts shape, only for a MoE model (older
    // readers see the manifests they know); the widths resolved (model.h)
    if (m->moe_experts)
        text_add(&t, "moe_experts = %d\nmoe_top_k = %d\nmoe_ffn_dim = %d\nmoe_shared_experts = %d\n"
                 "moe_shared_ffn_dim = %d\nmoe_shared_gate = %d\nmoe_norm_topk = %d\n"
                 "moe_first_dense_layers = %d\n", m->moe_experts, m->moe_top_k, llama_moe_ffn(m),
                 m->moe_shared_experts, llama_moe_shared_ffn(m), m->moe_shared_gate ? 1 : 0,
                 m->moe_norm_topk ? 1 : 0, m->moe_first_dense_layers);
    // the run's load-balancing coefficient (a training setting, not compared
    // on resume or init_from): a Hugging Face export's router_aux_loss_coef
    if (m->moe_experts) text_add(&t, "moe_aux_loss_coeff = %.17g\n", m->moe_aux_loss_coeff);
    text_add(&t, "\n[files]\n");
    for (int r = 0; r < world; r++)
        text_add(&t, "rank-%05d.h5 = xxh3-64:%016llx %llu\n", r, (unsigned long long)sums[r].xxh3,
                 (unsigned long long)sums[r].bytes);
    *len = t.len;
    return t.buf;
}

// The folder name `latest` holds, or "" when there is none.
static void latest_name(const char *dir, char *out, size_t cap) {
    char path[CKPT_PATH_MAX];
    snprintf(path, sizeof path, "%s/latest", dir);
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(out, (int)cap, f)) out[0] = 0;
    fclose(f);
    out[strcspn(out, "\r\n")] = 0;
}

enum status checkpoint_commit(const struct ckpt_save_args *a, const struct ckpt_file_sum *sums,
                              struct error *err) {
    char tmp[CKPT_PATH_MAX], final[CKPT_PATH_MAX], path[CKPT_PATH_MAX + 32], name[64], cur[256];
    tmp_dir_path(a, tmp);
    ckpt_step_name(name, sizeof name, a->step);
    snprintf(final, sizeof final, "%s/%s", a->dir, name);
    size_t len;
    char *text = manifest_text(a, sums, &len);
    snprintf(path, sizeof path, "%s/manifest.ini", tmp);
    enum status st = durable_write_file(path, text, len, err);
    free(text);
    if (st || (st = durable_fsync_dir(tmp, err))) return st;
    // The reader's checks on what was written (tags, one shape per tensor,
    // every element in some piece; metadata only), so that a caller's bad
    // pieces never become `latest`.
    struct ckpt_reader *r;
    struct error rerr;
    if (checkpoint_open_trusted(tmp, &r, &rerr))
        return error_set(err, STATUS_RUNTIME, "checkpoint step %lld not committed: %s",
                         (long long)a->step, rerr.msg);
    checkpoint_close(r);

    struct stat s;
    if (!stat(final, &s)) {
        // A complete folder of this step from a run that crashed before
        // updating `latest` (so not the latest): replaced. The latest one is
        // never replaced: that would leave `latest` dangling for a moment.
        latest_name(a->dir, cur, sizeof cur);
        if (!strcmp(cur, name))
            return error_set(err, STATUS_BAD_INPUT,
                             "%s: already exists and is the latest checkpoint; not overwritten",
                             final);
        if ((st = remove_step_folder(a->dir, name, err))) return st;
    }
    if ((st = durable_rename(tmp, final, err)) || (st = durable_fsync_dir(a->dir, err))) return st;
    if ((st = durable_point("ckpt_between_renames", final, false, err))) return st;

    char line[80];
    int n = snprintf(line, sizeof line, "%s\n", name);
    snprintf(path, sizeof path, "%s/latest.tmp", a->dir);
    char latest[CKPT_PATH_MAX];
    snprintf(latest, sizeof latest, "%s/latest", a->dir);
    if ((st = durable_write_file(path, line, (size_t)n, err)) ||
        (st = durable_rename(path, latest, err)) || (st = durable_fsync_dir(a->dir, err)))
        return st;

    if (checkpoint_rotate(a->dir, a->keep_last, &rerr))
        fprintf(stderr, "trident: warning: checkpoint rotation: %s\n", rerr.msg);
    return STATUS_OK;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int checkpoint_list_steps(const char *dir, int64_t **steps) {
    *steps = NULL;
    DIR *d = opendir(dir);
    if (!d) return -1;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long step;
        int used = 0;
        // Complete folders only: "step-" digits and nothing after (not .tmp).
        if (sscanf(e->d_name, "step-%lld%n", &step, &used) != 1 || e->d_name[used]) continue;
        if (n == cap) {
            cap = cap * 2 + 16;
            int64_t *ns = xmalloc(cap * sizeof *ns);
            if (n) memcpy(ns, *steps, n * sizeof *ns);
            free(*steps);
            *steps = ns;
        }
        (*steps)[n++] = step;
    }
    closedir(d);
    if (n) qsort(*steps, n, sizeof **steps, cmp_i64);
    return (int)n;
}

enum status checkpoint_rotate(const char *dir, int keep_last, struct error *err) {
    if (keep_last <= 0) return STATUS_OK;
    int64_t *steps;
    int listed = checkpoint_list_steps(dir, &steps);
    if (listed < 0) return error_set(err, STATUS_RUNTIME, "%s: cannot list: %s", dir, strerror(errno));
    size_t n = (size_t)listed;
    char cur[256], name[64];
    latest_name(dir, cur, sizeof cur);
    enum status st = STATUS_OK;
    for (size_t i = 0; !st && i + (size_t)keep_last < n; i++) {
        ckpt_step_name(name, sizeof name, steps[i]);
        if (!strcmp(name, cur)) continue; // the one `latest` names is never removed
        st = remove_step_folder(dir, name, err);
    }
    free(steps);
    return st;
}

// All ranks learn whether any failed and why: comm_agree names each failing
// rank, its host and its message on every rank (the caller's rank 0 prints it).
static enum status agree(struct comm_group *world, enum status mine, const char *phase,
                         const struct ckpt_save_args *a, struct error *err) {
    char what[160];
    snprintf(what, sizeof what, "checkpoint step %lld: %s", (long long)a->step, phase);
    return comm_agree(world, mine, what, err);
}

// The check of checkpoint_save and checkpoint_save_begin: the world is the layout's.
static void check_world(const struct ckpt_save_args *a, struct comm_group *world) {
    char text[256];
    int n = topology_world_size(&a->layout);
    CHECK(world->size == n && world->rank == a->rank,
          "world %d/%d, layout %s, rank %d", world->rank, world->size,
          topology_layout_text(&a->layout, true, "=", " ", text, sizeof text), a->rank);
}

// After this rank's write returned st (and mine): every rank's checksums
// into *sums ((world) entries, the caller frees) and the agreement; on a
// failure rank 0 removes the .tmp folder (best effort: a leftover is removed
// by the next save) and every rank holds the agreed reasons. Collective.
static enum status gather_written(const struct ckpt_save_args *a, struct comm_group *world,
                                  enum status st, struct ckpt_file_sum mine,
                                  struct ckpt_file_sum **sums_out, struct error *err) {
    int n = topology_world_size(&a->layout);
    uint64_t send[2] = {mine.xxh3, mine.bytes};
    uint64_t *all = xmalloc(2 * (size_t)n * sizeof *all);
    comm_all_gather(world, send, all, 2, DTYPE_I64);
    struct ckpt_file_sum *sums = xmalloc((size_t)n * sizeof *sums);
    for (int r = 0; r < n; r++) sums[r] = (struct ckpt_file_sum){all[2 * r], all[2 * r + 1]};
    free(all);
    *sums_out = sums;
    return agree(world, st, "writing the rank file", a, err);
}

static void remove_tmp(const struct ckpt_save_args *a) {
    char tmp[CKPT_PATH_MAX];
    struct error ignored;
    tmp_dir_path(a, tmp);
    durable_remove_tree(tmp, &ignored);
}

// After rank 0's commit returned st (others: STATUS_OK): on a failure rank 0
// removes the .tmp folder; the agreement. Collective.
static enum status agree_committed(const struct ckpt_save_args *a, struct comm_group *world,
                                   enum status st, struct error *err) {
    if (world->rank == 0 && st) remove_tmp(a);
    comm_barrier(world);
    return agree(world, st, "committing", a, err);
}

// The second half of a save, after this rank's write returned st (and
// mine): every rank's checksums, the agreement, rank 0's commit, the
// agreement on it. Collective.
static enum status save_tail(const struct ckpt_save_args *a, struct comm_group *world, enum status st,
                             struct ckpt_file_sum mine, struct error *err) {
    struct ckpt_file_sum *sums;
    st = gather_written(a, world, st, mine, &sums, err);
    if (st) {
        free(sums);
        if (world->rank == 0) remove_tmp(a);
        comm_barrier(world);
        return st; // every rank holds the agreed reasons already
    }
    if (world->rank == 0) st = checkpoint_commit(a, sums, err);
    free(sums);
    return agree_committed(a, world, st, err);
}

enum status checkpoint_save(const struct ckpt_save_args *a, struct comm_group *world,
                            struct error *err) {
    check_world(a, world);
    enum status st = world->rank == 0 ? checkpoint_prepare(a, err) : STATUS_OK;
    if ((st = agree(world, st, "creating the .tmp folder", a, err))) return st;

    struct ckpt_file_sum mine = {0, 0};
    st = checkpoint_write_rank(a, &mine, err);
    return save_tail(a, world, st, mine, err);
}

// An asynchronous save: copies of what checkpoint_write_rank reads, the
// writer thread and what it returned.
struct ckpt_async {
    struct ckpt_save_args a;
    char dir[CKPT_PATH_MAX], tokenizer[256];
    struct llama_config model;
    struct ckpt_piece *pieces; // copies of the caller's table
    struct state_entry *entries; // copies of the caller's entries, their values in entry_values
    uint64_t *entry_values;
    void *snapshot;            // with copy: the pieces' bytes; else NULL
    pthread_t thread;
    bool started;              // thread runs (else done = 2 from begin)
    int phase;                 // 1: the writer; 2: rank 0's commit (after every write agreed)
    atomic_int done;           // of this phase's thread: 0 running, 1 returned OK, 2 failed
    enum status st;
    struct error err;
    struct ckpt_file_sum sum;
    struct ckpt_file_sum *sums; // phase 2: every rank's
    double started_s, write_s; // when begin returned; the writer's seconds
};

static void *async_writer(void *arg) {
    struct ckpt_async *h = arg;
    double t0 = time_now_s();
    char what[CKPT_PATH_MAX + 32];
    snprintf(what, sizeof what, "%s (background writer)", h->dir);
    h->st = durable_point("ckpt_async_write", what, false, &h->err);
    if (!h->st && h->a.rank == 0) h->st = durable_fsync_dir(h->dir, &h->err); // prepare's
    if (!h->st) h->st = checkpoint_write_rank(&h->a, &h->sum, &h->err);
    h->write_s = time_now_s() - t0;
    atomic_store(&h->done, h->st ? 2 : 1);
    return NULL;
}

enum status checkpoint_save_begin(const struct ckpt_save_args *a, bool copy, struct comm_group *world,
                                  struct ckpt_async **out, struct error *err) {
    check_world(a, world);
    *out = NULL;
    enum status st = world->rank == 0 ? prepare(a, false, err) : STATUS_OK;
    if ((st = agree(world, st, "creating the .tmp folder", a, err))) return st;
    struct ckpt_async *h = xcalloc(1, sizeof *h);
    h->a = *a;
    snprintf(h->dir, sizeof h->dir, "%s", a->dir);
    snprintf(h->tokenizer, sizeof h->tokenizer, "%s", a->tokenizer_id ? a->tokenizer_id : "");
    h->model = *a->model;
    h->a.dir = h->dir, h->a.tokenizer_id = h->tokenizer, h->a.model = &h->model;
    h->pieces = xcalloc((size_t)(a->n_pieces ? a->n_pieces : 1), sizeof *h->pieces);
    size_t bytes = 0;
    for (int i = 0; i < a->n_pieces; i++)
        bytes += (a->pieces[i].flat_end - a->pieces[i].flat_begin) * dtype_size(a->pieces[i].dtype);
    if (copy && bytes) h->snapshot = xmalloc(bytes);
    size_t at = 0;
    char what[CKPT_PATH_MAX + 32];
    snprintf(what, sizeof what, "%s (snapshot)", a->dir);
    for (int i = 0; i < a->n_pieces && !st; i++) {
        h->pieces[i] = a->pieces[i];
        if (!copy) continue;
        // One named point per piece copied: a kill in the middle of the snapshot.
        if ((st = durable_point("ckpt_async_snapshot", what, false, err))) break;
        size_t nb = (a->pieces[i].flat_end - a->pieces[i].flat_begin) * dtype_size(a->pieces[i].dtype);
        if (nb) memcpy((char *)h->snapshot + at, a->pieces[i].data, nb);
        h->pieces[i].data = (char *)h->snapshot + at;
        at += nb;
    }
    h->a.pieces = h->pieces;
    // The owners' named entries, values and all: their owners go on training.
    size_t words = 0;
    for (int i = 0; i < a->n_entries; i++) words += (size_t)a->entries[i].count;
    h->entries = xcalloc((size_t)(a->n_entries ? a->n_entries : 1), sizeof *h->entries);
    h->entry_values = xcalloc(words ? words : 1, sizeof *h->entry_values);
    for (int i = 0, w = 0; i < a->n_entries; w += a->entries[i].count, i++) {
        h->entries[i] = a->entries[i];
        memcpy(h->entry_values + w, a->entries[i].value, (size_t)a->entries[i].count * sizeof *h->entry_values);
        h->entries[i].value = h->entry_values + w; // every type is 8 bytes
    }
    h->a.entries = h->entries;
    if (!st && pthread_create(&h->thread, NULL, async_writer, h))
        st = error_set(err, STATUS_RUNTIME, "checkpoint step %lld: cannot start the background writer",
                       (long long)a->step);
    h->started = !st;
    if (st) {
        // This rank's failure reaches the others at checkpoint_save_finish:
        // the handle holds it as the writer's result.
        h->st = st, h->err = *err;
        atomic_store(&h->done, 2);
    }
    h->phase = 1;
    h->started_s = time_now_s();
    *out = h;
    return STATUS_OK;
}

int checkpoint_save_writer_state(const struct ckpt_async *h) {
    return atomic_load(&((struct ckpt_async *)h)->done);
}

int64_t checkpoint_save_step(const struct ckpt_async *h) { return h->a.step; }

static void async_join(struct ckpt_async *h) {
    if (h->started) pthread_join(h->thread, NULL);
    h->started = false;
}

static void async_free(struct ckpt_async *h) {
    free(h->sums);
    free(h->snapshot);
    free(h->pieces);
    free(h->entries), free(h->entry_values);
    free(h);
}

// Rank 0's commit, phase 2's thread.
static void *async_committer(void *arg) {
    struct ckpt_async *h = arg;
    h->st = checkpoint_commit(&h->a, h->sums, &h->err);
    atomic_store(&h->done, h->st ? 2 : 1);
    return NULL;
}

enum status checkpoint_save_advance(struct ckpt_async **hp, struct comm_group *world, double *wait_s,
                                    struct error *err) {
    struct ckpt_async *h = *hp;
    double t0 = time_now_s();
    enum status st = STATUS_OK;
    if (h->phase == 2) {
        async_join(h); // rank 0's commit; the others have none
        if (wait_s) *wait_s = time_now_s() - t0;
        if ((st = h->st)) *err = h->err;
        st = agree_committed(&h->a, world, st, err);
        async_free(h);
        *hp = NULL;
        return st;
    }
    // The commit about to wait for (join) this rank's writer: at the next
    // save step, the end or the step boundary that saw every writer done.
    st = durable_point("ckpt_async_join", h->dir, false, err);
    async_join(h);
    if (!st && (st = h->st)) *err = h->err;
    if (wait_s) *wait_s = time_now_s() - t0;
    // All writes of this rank done: the last point before the commit's collectives.
    if (!st) st = durable_point("ckpt_async_written", h->dir, false, err);
    st = gather_written(&h->a, world, st, h->sum, &h->sums, err);
    if (st) {
        if (world->rank == 0) remove_tmp(&h->a);
        comm_barrier(world);
        async_free(h);
        *hp = NULL;
        return st;
    }
    // Phase 2: rank 0 commits on a thread of its own (manifest, the reader's
    // checks, renames, latest, rotation); the others have nothing to do.
    h->phase = 2;
    h->st = STATUS_OK;
    atomic_store(&h->done, 1);
    if (world->rank == 0) {
        atomic_store(&h->done, 0);
        h->started = !pthread_create(&h->thread, NULL, async_committer, h);
        if (!h->started) {
            h->st = error_set(&h->err, STATUS_RUNTIME, "checkpoint step %lld: cannot start the "
                              "commit's thread", (long long)h->a.step);
            atomic_store(&h->done, 2);
        }
    }
    return STATUS_OK;
}

enum status checkpoint_save_finish(struct ckpt_async *h, struct comm_group *world, double *wait_s,
                                   struct error *err) {
    double waited = 0, w;
    enum status st = STATUS_OK;
    while (h && !st) {
        st = checkpoint_save_advance(&h, world, &w, err);
        waited += w;
    }
    if (wait_s) *wait_s = waited;
    return st;
}

void checkpoint_save_abandon(struct ckpt_async *h) {
    if (!h) return;
    async_join(h);
    async_free(h);
}
