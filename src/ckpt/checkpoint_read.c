// checkpoint_read.c: opening, validating and resharding checkpoints
// (checkpoint.h). Every refusal is STATUS_BAD_INPUT naming the file.
#include "checkpoint_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "base/checksum.h"
#include "base/h5util.h"
#include "base/watchdog.h"
#include "model/moe.h"
#include "durable.h"

struct stored_piece {
    struct ckpt_piece p; // data NULL
    int file;            // world rank of the file
    int index;           // dataset pieces/%05d
};

struct ckpt_reader {
    struct ckpt_info info;
    char manifest[CKPT_PATH_MAX + 32];
    hid_t *files;              // (world_size,)
    struct stored_piece *pieces; // sorted by name, then file
    int n_pieces;
    // The last assembled global tensor: (grows * gcols,) of cache_dtype.
    char cache_name[CKPT_NAME_MAX];
    enum dtype cache_dtype;
    void *cache;
    size_t cache_bytes;
    unsigned char *mask;  // (grows * gcols,) 1 where the cache holds the element
    size_t mask_bytes;
    unsigned char *loaded; // (n_pieces,) stored piece already in the cache
    void *tmp; // one stored piece on its way into cache; kept to avoid page faults
    size_t tmp_bytes;
    unsigned char *ones; // (ones_bytes,) all 1: marks mask runs
    size_t ones_bytes;
};

struct manifest_file {
    uint64_t xxh3, bytes;
    int seen;
};

struct manifest_parse {
    struct ckpt_info *info;
    struct manifest_file *files; // (world_size,) once world_size is known
    int n_files;
    char bad[512];
    unsigned have; // bit per required key
    int sizes[GROUP_COUNT]; // the layout lines (topology_layout_sizes' names); 0: absent
};

static const char *required_keys[] = {"format_version", "step", "world_size", "tp", "pp", "dp",
                                      "zero_stage", "vocab_size", "d_model", "n_layers",
                                      "n_heads", "n_kv_heads", "ffn_dim", "tie_embeddings"};
enum { N_REQUIRED = sizeof required_keys / sizeof required_keys[0] };

static int manifest_handler(void *user, const char *section, const char *key, const char *value) {
    struct manifest_parse *mp = user;
    struct ckpt_info *in = mp->info;
    if (mp->bad[0]) return 1;
    for (int i = 0; i < N_REQUIRED; i++)
        if (!strcmp(key, required_keys[i])) mp->have |= 1u << i;
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    int is_int = end != value && !*end && errno == 0;
    // Every integer is range-checked against what it stands for before any
    // arithmetic (issue 18: tp = 4294967297 was silently 1, tp = pp = 65536
    // overflowed their product, zero_stage = 7 was accepted).
#define INT_KEY(sec, k, field, lo, hi)                                                          \
    if (!strcmp(section, sec) && !strcmp(key, k)) {                                             \
        if (!is_int || v < (lo) || v > (hi))                                                     \
            snprintf(mp->bad, sizeof mp->bad, "[%s] %s = '%s' is not an integer in [%lld, %lld]", \
                     sec, k, value, (long long)(lo), (long long)(hi));                           \
        else field = v;                                                                         \
        return 1;                                                                               \
    }
    INT_KEY("checkpoint", "format_version", in->format_version, 0, INT_MAX)
    INT_KEY("checkpoint", "step", in->step, 0, INT_MAX)
    for (int k = 0; k < GROUP_COUNT; k++) // the layout lines
        if (topology_group_is_size((enum group_kind)k))
            INT_KEY("checkpoint", topology_group_name((enum group_kind)k), mp->sizes[k], 1,
                    LLAMA_MAX_PARALLEL)
    INT_KEY("checkpoint", "zero_stage", in->zero_stage, 0, 3)
    INT_KEY("checkpoint", "weights_only", in->weights_only, 0, 1)
    INT_KEY("model", "vocab_size", in->model.vocab_size, 2, LLAMA_MAX_VOCAB)
    INT_KEY("model", "d_model", in->model.d_model, 1, LLAMA_MAX_D_MODEL)
    INT_KEY("model", "n_layers", in->model.n_layers, 1, LLAMA_MAX_LAYERS)
    INT_KEY("model", "n_heads", in->model.n_heads, 1, LLAMA_MAX_HEADS)
    INT_KEY("model", "n_kv_heads", in->model.n_kv_heads, 1, LLAMA_MAX_HEADS)
    INT_KEY("model", "ffn_dim", in->model.ffn_dim, 1, LLAMA_MAX_FFN)
    INT_KEY("model", "max_seq_len", in->model.max_seq_len, 1, LLAMA_MAX_SEQ_LEN)
    INT_KEY("model", "tie_embeddings", in->model.tie_embeddings, 0, 1)
    INT_KEY("model", "head_dim", in->model.head_dim, 0, LLAMA_MAX_HEAD_DIM)
    INT_KEY("model", "qkv_bias", in->model.qkv_bias, 0, 1)
    INT_KEY("model", "qk_norm", in->model.qk_norm, 0, 1)
    INT_KEY("model", "moe_experts", in->model.moe_experts, 0, MOE_MAX_EXPERTS)
    INT_KEY("model", "moe_top_k", in->model.moe_top_k, 1, MOE_MAX_EXPERTS)
    INT_KEY("model", "moe_ffn_dim", in->model.moe_ffn_dim, 1, LLAMA_MAX_FFN)
    INT_KEY("model", "moe_shared_experts", in->model.moe_shared_experts, 0, 1)
    INT_KEY("model", "moe_shared_ffn_dim", in->model.moe_shared_ffn_dim, 0, LLAMA_MAX_FFN)
    INT_KEY("model", "moe_shared_gate", in->model.moe_shared_gate, 0, 1)
    INT_KEY("model", "moe_norm_topk", in->model.moe_norm_topk, 0, 1)
    INT_KEY("model", "moe_first_dense_layers", in->model.moe_first_dense_layers, 0, LLAMA_MAX_LAYERS)
    INT_KEY("model", "rope_original_max_pos", in->model.rope_scaling.original_max_pos, 1,
            LLAMA_MAX_SEQ_LEN)
#undef INT_KEY
    if (!strcmp(section, "model") && !strcmp(key, "rope_scaling")) {
        int t = -1;
        for (int k = ROPE_SCALING_NONE; k <= ROPE_SCALING_LLAMA3; k++)
            if (!strcmp(value, ckpt_rope_scaling_name((enum rope_scaling_type)k))) t = k;
        if (t < 0)
            snprintf(mp->bad, sizeof mp->bad, "[model] rope_scaling = '%s' is not none, linear or "
                     "llama3", value);
        else
            in->model.rope_scaling.type = (enum rope_scaling_type)t;
        return 1;
    }
    static const char *rope_reals[] = {"rope_scaling_factor", "rope_low_freq_factor",
                                       "rope_high_freq_factor"};
    double *rope_fields[] = {&in->model.rope_scaling.factor, &in->model.rope_scaling.low_freq_factor,
                             &in->model.rope_scaling.high_freq_factor};
    for (int k = 0; k < 3; k++)
        if (!strcmp(section, "model") && !strcmp(key, rope_reals[k])) {
            double d = strtod(value, &end);
            if (end == value || *end || !(d > 0) || !isfinite(d))
                snprintf(mp->bad, sizeof mp->bad, "[model] %s = '%s' is not a number > 0",
                         rope_reals[k], value);
            else
                *rope_fields[k] = d;
            return 1;
        }
    // The load-balancing coefficient a MoE model was trained (or imported)
    // with: what a Hugging Face export writes as router_aux_loss_coef.
    if (!strcmp(section, "model") && !strcmp(key, "moe_aux_loss_coeff")) {
        double d = strtod(value, &end);
        if (end == value || *end || !(d >= 0) || !isfinite(d))
            snprintf(mp->bad, sizeof mp->bad, "[model] moe_aux_loss_coeff = '%s' is not a number "
                     ">= 0", value);
        else
            in->model.moe_aux_loss_coeff = d;
        return 1;
    }
    if (!strcmp(section, "checkpoint") && !strcmp(key, "world_size")) {
        if (!is_int || v < 1 || v > 1 << 20 || mp->files) {
            snprintf(mp->bad, sizeof mp->bad, "[checkpoint] world_size = '%s' is not valid", value);
            return 1;
        }
        in->world_size = (int)v;
        mp->n_files = (int)v;
        mp->files = xcalloc((size_t)v, sizeof *mp->files);
    } else if (!strcmp(section, "checkpoint") && !strcmp(key, "tokenizer")) {
        snprintf(in->tokenizer_id, sizeof in->tokenizer_id, "%s", value);
    } else if (!strcmp(section, "model") && !strcmp(key, "rope_theta")) {
        in->model.rope_theta = strtod(value, NULL);
    } else if (!strcmp(section, "model") && !strcmp(key, "norm_eps")) {
        in->model.norm_eps = strtof(value, NULL);
    } else if (!strcmp(section, "files")) {
        int r, used = 0;
        unsigned long long h, bytes;
        if (sscanf(key, "rank-%5d.h5%n", &r, &used) != 1 || key[used] ||
            sscanf(value, "xxh3-64:%16llx %llu", &h, &bytes) != 2) {
            snprintf(mp->bad, sizeof mp->bad, "[files] '%s = %s': expected rank-NNNNN.h5 = "
                     "xxh3-64:<16 hex digits> <bytes>", key, value);
        } else if (!mp->files || r < 0 || r >= mp->n_files) {
            snprintf(mp->bad, sizeof mp->bad, "[files] %s: rank outside world_size %d "
                     "(world_size must come first)", key, in->world_size);
        } else {
            mp->files[r] = (struct manifest_file){h, bytes, 1};
        }
    }
    return 1;
}

// Attribute readers; return non-zero when absent or of another size.
// The stored attribute must be of type's class (integer or float) and hold
// exactly n elements (h5util_attr_is) before it is read into out.
static int attr_read(hid_t loc, const char *name, hid_t type, size_t n, void *out) {
    if (!h5util_attr_is(loc, name, H5Tget_class(type), n)) return 1;
    hid_t attr = H5Aopen(loc, name, H5P_DEFAULT);
    int bad = attr < 0 || H5Aread(attr, type, out) < 0;
    if (attr >= 0) H5Aclose(attr);
    return bad;
}

// True when a dataset stored as file type `type` holds what dtype tags it
// as: fp32/fp64 as 4/8-byte floats, bf16/fp16 as 16-bit integers, i32/i64 as
// 4/8-byte integers (the types checkpoint.c writes).
static bool stored_type_matches(hid_t type, enum dtype dtype) {
    H5T_class_t cls = H5Tget_class(type);
    size_t size = H5Tget_size(type);
    switch (dtype) {
    case DTYPE_FP32: return cls == H5T_FLOAT && size == 4;
    case DTYPE_FP64: return cls == H5T_FLOAT && size == 8;
    case DTYPE_BF16:
    case DTYPE_FP16: return cls == H5T_INTEGER && size == 2;
    case DTYPE_I32: return cls == H5T_INTEGER && size == 4;
    case DTYPE_I64: return cls == H5T_INTEGER && size == 8;
    case DTYPE_FP8_E4M3:
    case DTYPE_FP8_E5M2: return cls == H5T_INTEGER && size == 1;
    }
    return false;
}

// /state of world rank `rank`'s file: present, its `step` one integer and
// the manifest's (issue 18: step = 2^31 trained from step -2^31). What else
// it holds is its owners' (checkpoint_read_entries; they judge it).
static enum status read_state_step(struct ckpt_reader *r, int rank, struct error *err) {
    hid_t g = H5Gopen2(r->files[rank], "state", H5P_DEFAULT);
    if (g < 0) return error_set(err, STATUS_BAD_INPUT, "%s/rank-%05d.h5: group /state missing", r->info.path, rank);
    int64_t step = 0;
    char what[128] = "";
    bool bad = attr_read(g, "step", H5T_NATIVE_INT64, 1, &step);
    if (bad) h5util_attr_describe(g, "step", what, sizeof what);
    H5Gclose(g);
    if (bad)
        return error_set(err, STATUS_BAD_INPUT, "%s/rank-%05d.h5: /state attribute step is %s, expected one number",
                         r->info.path, rank, what);
    if (step != r->info.step)
        return error_set(err, STATUS_BAD_INPUT, "%s/rank-%05d.h5: /state step = %" PRId64 ", expected %" PRId64
                         "..%" PRId64 " (the step manifest.ini names)", r->info.path, rank, step, r->info.step,
                         r->info.step);
    return STATUS_OK;
}

static int cmp_pieces(const void *a, const void *b) {
    const struct stored_piece *x = a, *y = b;
    int c = strcmp(x->p.name, y->p.name);
    return c ? c : x->file - y->file;
}

// Reads the piece table of rank file r into r->pieces.
static enum status read_piece_table(struct ckpt_reader *rd, int r, const char *path, int *cap,
                                    struct error *err) {
    hid_t f = rd->files[r];
    int version = -1;
    int64_t step = -1, rank = -1;
    const char *bad_attr = attr_read(f, "format_version", H5T_NATIVE_INT, 1, &version) ? "format_version"
                           : attr_read(f, "step", H5T_NATIVE_INT64, 1, &step)       ? "step"
                           : attr_read(f, "rank", H5T_NATIVE_INT64, 1, &rank)       ? "rank"
                                                                                    : NULL;
    if (bad_attr) {
        char what[128];
        return error_set(err, STATUS_BAD_INPUT, "%s: not a trident checkpoint rank file: attribute %s is %s, "
                         "expected one integer", path, bad_attr, h5util_attr_describe(f, bad_attr, what, sizeof what));
    }
    if (version != CKPT_FORMAT_VERSION || step != rd->info.step || rank != r)
        return error_set(err, STATUS_BAD_INPUT, "%s: holds format_version %d, step %lld, rank "
                         "%lld; manifest.ini expects %d, %lld, %d", path, version,
                         (long long)step, (long long)rank, CKPT_FORMAT_VERSION,
                         (long long)rd->info.step, r);
    hid_t g = H5Gopen2(f, "pieces", H5P_DEFAULT);
    if (g < 0) return error_set(err, STATUS_BAD_INPUT, "%s: group /pieces missing", path);
    H5G_info_t gi;
    H5Gget_info(g, &gi);
    enum status st = STATUS_OK;
    for (hsize_t i = 0; !st && i < gi.nlinks; i++) {
        char dname[16], dt[16];
        snprintf(dname, sizeof dname, "%05d", (int)i);
        if (rd->n_pieces == *cap) {
            *cap = *cap * 2 + 64;
            struct stored_piece *np = xmalloc((size_t)*cap * sizeof *np);
            if (rd->n_pieces) memcpy(np, rd->pieces, (size_t)rd->n_pieces * sizeof *np);
            free(rd->pieces);
            rd->pieces = np;
        }
        struct stored_piece *sp = &rd->pieces[rd->n_pieces];
        memset(sp, 0, sizeof *sp);
        sp->file = r;
        sp->index = (int)i;
        int64_t shape[6];
        uint64_t flat[2];
        const char *why_ds = "";
        hid_t ds = h5util_open_dataset(g, dname, H5P_DEFAULT, &why_ds);
        if (ds < 0) {
            st = error_set(err, STATUS_BAD_INPUT, "%s: /pieces/%s is %s", path, dname, why_ds);
            break;
        }
        const char *bad_attr = !h5util_read_attr_str(ds, "name", sp->p.name, sizeof sp->p.name) ? "name"
                               : !h5util_read_attr_str(ds, "dtype", dt, sizeof dt)             ? "dtype"
                               : attr_read(ds, "shape", H5T_NATIVE_INT64, 6, shape)           ? "shape"
                               : attr_read(ds, "flat_range", H5T_NATIVE_UINT64, 2, flat)      ? "flat_range"
                                                                                              : NULL;
        int bad = 0;
        if (bad_attr) {
            char what[128];
            const char *want = !strcmp(bad_attr, "shape")        ? "6 integers"
                               : !strcmp(bad_attr, "flat_range") ? "2 integers"
                                                                 : "one short string";
            st = error_set(err, STATUS_BAD_INPUT, "%s: /pieces/%s: attribute %s is %s, expected %s", path, dname,
                           bad_attr, h5util_attr_describe(ds, bad_attr, what, sizeof what), want);
        } else {
            int dtype = ckpt_dtype_parse(dt);
            for (int k = 0; k < 6; k++)
                if (shape[k] < 0 || shape[k] > INT32_MAX) bad = 1;
            sp->p.grows = (int)shape[0], sp->p.gcols = (int)shape[1];
            sp->p.row_offset = (int)shape[2], sp->p.col_offset = (int)shape[3];
            sp->p.rows = (int)shape[4], sp->p.cols = (int)shape[5];
            sp->p.flat_begin = flat[0], sp->p.flat_end = flat[1];
            sp->p.dtype = dtype < 0 ? DTYPE_FP32 : (enum dtype)dtype;
            const char *why = bad ? "shape out of range" : ckpt_piece_tags_error(&sp->p);
            hid_t space = H5Dget_space(ds), type = H5Dget_type(ds);
            hssize_t n = H5Sget_simple_extent_npoints(space);
            int ndims = H5Sget_simple_extent_ndims(space);
            H5Sclose(space);
            bool type_ok = dtype >= 0 && stored_type_matches(type, (enum dtype)dtype);
            uint64_t stored = H5Dget_storage_size(ds);
            uint64_t need = n > 0 ? (uint64_t)n * H5Tget_size(type) : 0;
            H5Tclose(type);
            if (!sp->p.name[0])
                st = error_set(err, STATUS_BAD_INPUT, "%s: /pieces/%s has an empty name", path, dname);
            else if (dtype < 0)
                st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: unknown dtype '%s'", path,
                               sp->p.name, dt);
            else if (!type_ok || ndims != 1)
                st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: dataset /pieces/%s is not a 1-D "
                               "array of the type its dtype tag '%s' stands for", path, sp->p.name,
                               dname, dt);
            else if (why)
                st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: %s", path, sp->p.name, why);
            else if (n < 0 || stored < need)
                st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: /pieces/%s claims %lld elements "
                               "but stores %llu bytes (sparse or compressed)", path, sp->p.name, dname,
                               (long long)n, (unsigned long long)stored);
            else if ((size_t)n != sp->p.flat_end - sp->p.flat_begin)
                st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s holds %lld elements, its "
                               "flat_range says %zu", path, sp->p.name, (long long)n,
                               sp->p.flat_end - sp->p.flat_begin);
            else
                rd->n_pieces++;
        }
        H5Dclose(ds);
    }
    H5Gclose(g);
    return st;
}

// Every element of every tensor is in some stored piece, with one global
// shape and dtype per name. pieces sorted by name.
static enum status check_coverage(struct ckpt_reader *rd, struct error *err) {
    unsigned char *mask = NULL;
    size_t mask_cap = 0;
    enum status st = STATUS_OK;
    for (int i = 0, j; !st && i < rd->n_pieces; i = j) {
        const struct ckpt_piece *p0 = &rd->pieces[i].p;
        size_t numel = (size_t)p0->grows * (size_t)p0->gcols;
        // The mask is sized by the tags; the pieces' stored elements (each
        // checked against its dataset's bytes in the file) must cover it, so
        // a tag of INT_MAX x INT_MAX allocates nothing (issue 18).
        uint64_t stored = 0;
        for (j = i; j < rd->n_pieces && !strcmp(rd->pieces[j].p.name, p0->name); j++)
            stored += rd->pieces[j].p.flat_end - rd->pieces[j].p.flat_begin;
        if (stored < numel && numel > 2 * stored + (1u << 20)) { // else the walk below names an element
            st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s (%d, %d): its pieces store %llu of "
                           "its %zu elements (incomplete checkpoint)", rd->info.path, p0->name,
                           p0->grows, p0->gcols, (unsigned long long)stored, numel);
            break;
        }
        if (numel > mask_cap) {
            free(mask);
            mask = xmalloc(mask_cap = numel);
        }
        memset(mask, 0, numel);
        for (j = i; j < rd->n_pieces && !strcmp(rd->pieces[j].p.name, p0->name); j++) {
            const struct stored_piece *s = &rd->pieces[j];
            if (s->p.grows != p0->grows || s->p.gcols != p0->gcols || s->p.dtype != p0->dtype) {
                st = error_set(err, STATUS_BAD_INPUT, "%s/rank-%05d.h5: tensor %s is (%d, %d) %s, "
                               "but (%d, %d) %s in rank-%05d.h5", rd->info.path, s->file,
                               p0->name, s->p.grows, s->p.gcols, dtype_name(s->p.dtype),
                               p0->grows, p0->gcols, dtype_name(p0->dtype), rd->pieces[i].file);
                break;
            }
            size_t n = s->p.flat_end - s->p.flat_begin;
            if (!n) continue;
            // Mark the run of ones through the byte copy: a source of n ones.
            unsigned char *ones = xmalloc(n);
            memset(ones, 1, n);
            ckpt_block_copy((char *)mask, s->p.gcols, s->p.row_offset, s->p.col_offset, s->p.cols,
                            s->p.flat_begin, s->p.flat_end, (char *)ones, 1, 1);
            free(ones);
        }
        for (size_t k = 0; !st && k < numel; k++)
            if (!mask[k])
                st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s (%d, %d): element (%zu, %zu) "
                               "is in no rank file (incomplete checkpoint)", rd->info.path,
                               p0->name, p0->grows, p0->gcols, k / (size_t)p0->gcols,
                               k % (size_t)p0->gcols);
    }
    free(mask);
    return st;
}

enum status checkpoint_resolve(const char *dir, enum resume_mode mode, const char *path,
                               char out[CKPT_PATH_MAX], struct error *err) {
    out[0] = 0;
    if (mode == RESUME_NONE) return STATUS_OK;
    const char *base = mode == RESUME_PATH ? path : dir;
    char latest[CKPT_PATH_MAX], manifest[CKPT_PATH_MAX];
    snprintf(manifest, sizeof manifest, "%s/manifest.ini", base);
    struct stat s;
    if (mode == RESUME_PATH && !stat(manifest, &s)) {
        snprintf(out, CKPT_PATH_MAX, "%s", path);
        return STATUS_OK;
    }
    snprintf(latest, sizeof latest, "%s/latest", base);
    FILE *f = fopen(latest, "r");
    if (!f) {
        if (mode == RESUME_AUTO && errno == ENOENT) return STATUS_OK; // a fresh run
        return error_set(err, STATUS_BAD_INPUT, "%s: not a checkpoint folder (no manifest.ini) "
                         "and no readable 'latest' in it: %s", base, strerror(errno));
    }
    char name[256] = "";
    if (!fgets(name, sizeof name, f)) name[0] = 0;
    fclose(f);
    name[strcspn(name, "\r\n")] = 0;
    long long step;
    int used = 0;
    if (sscanf(name, "step-%lld%n", &step, &used) != 1 || name[used])
        return error_set(err, STATUS_BAD_INPUT, "%s: holds '%s', expected step-NNNNNN", latest,
                         name);
    snprintf(out, CKPT_PATH_MAX, "%s/%s", base, name);
    if (stat(out, &s) || !S_ISDIR(s.st_mode))
        return error_set(err, STATUS_BAD_INPUT, "%s names %s, which does not exist", latest, out);
    return STATUS_OK;
}

static enum status open_files(struct ckpt_reader *rd, struct manifest_file *files,
                              bool checksums, struct error *err) {
    char path[CKPT_PATH_MAX + 32], sum[64];
    int cap = 0;
    for (int r = 0; r < rd->info.world_size; r++) {
        snprintf(path, sizeof path, "%s/rank-%05d.h5", rd->info.path, r);
        if (!files[r].seen)
            return error_set(err, STATUS_BAD_INPUT, "%s: [files] lacks rank-%05d.h5 (world_size "
                             "%d)", rd->manifest, r, rd->info.world_size);
        struct stat s;
        if (stat(path, &s))
            return error_set(err, STATUS_BAD_INPUT, "%s: missing (listed in %s): %s", path,
                             rd->manifest, strerror(errno));
        if ((uint64_t)s.st_size != files[r].bytes)
            return error_set(err, STATUS_BAD_INPUT, "%s: %lld bytes, manifest.ini says %llu "
                             "(truncated or replaced)", path, (long long)s.st_size,
                             (unsigned long long)files[r].bytes);
        enum status st = checksums ? checksum_file(path, sum, err) : STATUS_OK;
        if (st) return st;
        unsigned long long h = checksums ? strtoull(sum + strlen("xxh3-64:"), NULL, 16) : 0;
        if (checksums && h != files[r].xxh3)
            return error_set(err, STATUS_BAD_INPUT, "%s: checksum %s, manifest.ini says "
                             "xxh3-64:%016llx (the file is corrupt)", path, sum,
                             (unsigned long long)files[r].xxh3);
        hid_t fapl = h5util_fapl();
        rd->files[r] = H5Fopen(path, H5F_ACC_RDONLY, fapl);
        h5util_fapl_close(fapl);
        if (rd->files[r] < 0)
            return error_set(err, STATUS_BAD_INPUT, "%s: not an HDF5 file", path);
        if ((st = read_piece_table(rd, r, path, &cap, err))) return st;
    }
    return STATUS_OK;
}

// The grid of the manifest's layout lines (sizes by group kind, 0 absent;
// tp, pp and dp are required keys): those of tp, pp, dp, dp_shard (absent
// before dp_shard existed: dp, one shard group), cp (absent before cp
// existed: 1) and ep (absent before ep existed: 1), then every line present
// must be that layout's size and their world the manifest's world_size.
static enum status manifest_layout(const char *manifest, const int *sizes, struct ckpt_info *in,
                                   struct error *err) {
    int dp = sizes[GROUP_DP], dp_shard = sizes[GROUP_DP_SHARD];
    if (dp_shard && dp % dp_shard)
        return error_set(err, STATUS_BAD_INPUT, "%s: dp_shard = %d does not divide dp = %d",
                         manifest, dp_shard, dp);
    int ep = MAX(1, sizes[GROUP_EP]); // absent before ep existed: 1
    if ((dp_shard ? dp_shard : dp) % ep)
        return error_set(err, STATUS_BAD_INPUT, "%s: ep = %d does not divide dp_shard = %d",
                         manifest, ep, dp_shard ? dp_shard : dp);
    in->layout = topology_layout_ep(sizes[GROUP_TP], sizes[GROUP_PP], dp, dp_shard,
                                    MAX(1, sizes[GROUP_CP]), ep);
    char text[256];
    for (int k = 0; k < GROUP_COUNT; k++)
        if (sizes[k] && sizes[k] != topology_group_size(&in->layout, (enum group_kind)k))
            return error_set(err, STATUS_BAD_INPUT, "%s: %s = %d, but the layout %s makes it %d",
                             manifest, topology_group_name((enum group_kind)k), sizes[k],
                             topology_layout_line(&in->layout, text, sizeof text),
                             topology_group_size(&in->layout, (enum group_kind)k));
    if ((int64_t)topology_world_size(&in->layout) != in->world_size)
        return error_set(err, STATUS_BAD_INPUT, "%s: world_size = %d, but the layout lines make %s",
                         manifest, in->world_size, topology_layout_line(&in->layout, text, sizeof text));
    return STATUS_OK;
}

// Reads and checks dir/manifest.ini (at manifest) into *in: the format
// version, every value's range, the required keys and the layout lines
// (manifest_layout). *files: the [files] entries ((world_size,), the
// caller frees; NULL when it fails).
static enum status read_manifest(const char *dir, const char *manifest, struct ckpt_info *in,
                                 struct manifest_file **files, struct error *err) {
    memset(in, 0, sizeof *in);
    snprintf(in->path, sizeof in->path, "%s", dir);
    struct manifest_parse mp = {.info = in};
    enum status st = STATUS_OK;
    *files = NULL;
    FILE *f = fopen(manifest, "r");
    if (!f) return error_set(err, STATUS_BAD_INPUT, "%s: cannot read: %s", manifest, strerror(errno));
    int line = ini_parse_file(f, manifest_handler, &mp);
    fclose(f);
    if (line)
        st = error_set(err, STATUS_BAD_INPUT, "%s: syntax error on line %d", manifest, line);
    else if (mp.have & 1 && in->format_version != CKPT_FORMAT_VERSION)
        st = error_set(err, STATUS_BAD_INPUT, "%s: format_version = %d; this trident reads "
                       "checkpoint format version %d", manifest, in->format_version,
                       CKPT_FORMAT_VERSION);
    else if (mp.bad[0])
        st = error_set(err, STATUS_BAD_INPUT, "%s: %s", manifest, mp.bad);
    for (int i = 0; !st && i < N_REQUIRED; i++)
        if (!(mp.have & (1u << i)))
            st = error_set(err, STATUS_BAD_INPUT, "%s: key %s missing", manifest, required_keys[i]);
    if (!st) st = manifest_layout(manifest, mp.sizes, in, err);
    if (st) free(mp.files);
    else *files = mp.files;
    return st;
}

enum status checkpoint_read_manifest(const char *path, struct ckpt_info *out, struct error *err) {
    char dir[CKPT_PATH_MAX], manifest[CKPT_PATH_MAX + 32];
    enum status st = checkpoint_resolve(NULL, RESUME_PATH, path, dir, err);
    if (st) return st;
    snprintf(manifest, sizeof manifest, "%s/manifest.ini", dir);
    struct manifest_file *files;
    st = read_manifest(dir, manifest, out, &files, err);
    free(files);
    return st;
}

static enum status open_reader(const char *path, bool checksums, struct ckpt_reader **out,
                               struct error *err) {
    *out = NULL;
    char dir[CKPT_PATH_MAX];
    enum status st = checkpoint_resolve(NULL, RESUME_PATH, path, dir, err);
    if (st) return st;
    h5util_quiet();
    struct ckpt_reader *rd = xcalloc(1, sizeof *rd);
    snprintf(rd->manifest, sizeof rd->manifest, "%s/manifest.ini", dir);
    struct manifest_file *files = NULL;
    if ((st = read_manifest(dir, rd->manifest, &rd->info, &files, err))) goto done;
    rd->files = xmalloc((size_t)rd->info.world_size * sizeof *rd->files);
    for (int r = 0; r < rd->info.world_size; r++) rd->files[r] = -1;
    if ((st = open_files(rd, files, checksums, err))) goto done;
    if (rd->n_pieces) qsort(rd->pieces, (size_t)rd->n_pieces, sizeof *rd->pieces, cmp_pieces);
    rd->loaded = xcalloc((size_t)rd->n_pieces + 1, 1);
    st = check_coverage(rd, err);
    // Every rank file's /state step, so that `ckpt verify` and every resuming
    // rank refuse the same files (the owners' entries: trainer_state_verify).
    for (int r = 0; !st && r < rd->info.world_size; r++) st = read_state_step(rd, r, err);
done:
    free(files);
    if (st) checkpoint_close(rd);
    else *out = rd;
    return st;
}

enum status checkpoint_open(const char *path, struct ckpt_reader **out, struct error *err) {
    return open_reader(path, true, out, err);
}

enum status checkpoint_open_trusted(const char *path, struct ckpt_reader **out,
                                    struct error *err) {
    return open_reader(path, false, out, err);
}

void checkpoint_close(struct ckpt_reader *r) {
    if (!r) return;
    for (int i = 0; r->files && i < r->info.world_size; i++)
        if (r->files[i] >= 0) H5Fclose(r->files[i]);
    free(r->files);
    free(r->pieces);
    free(r->cache);
    free(r->tmp);
    free(r->mask);
    free(r->loaded);
    free(r->ones);
    free(r);
}

const struct ckpt_info *checkpoint_info(const struct ckpt_reader *r) { return &r->info; }

const char *ckpt_rope_scaling_name(enum rope_scaling_type type) {
    switch (type) {
    case ROPE_SCALING_NONE: return "none";
    case ROPE_SCALING_LINEAR: return "linear";
    case ROPE_SCALING_LLAMA3: return "llama3";
    }
    return "?";
}
int checkpoint_n_pieces(const struct ckpt_reader *r) { return r->n_pieces; }
const struct ckpt_piece *checkpoint_piece_at(const struct ckpt_reader *r, int i, int *file_rank) {
    if (file_rank) *file_rank = r->pieces[i].file;
    return &r->pieces[i].p;
}

enum status checkpoint_check_model(const struct ckpt_reader *r, const struct llama_config *m,
                                   const char *tokenizer_id, struct error *err) {
    const struct llama_config *c = &r->info.model;
    const char *path = r->manifest;
#define SAME_INT(k)                                                                             \
    if (c->k != m->k)                                                                           \
        return error_set(err, STATUS_BAD_INPUT, "%s: [model] " #k " = %d, but the run has %d",  \
                         path, (int)c->k, (int)m->k);
    SAME_INT(vocab_size) SAME_INT(d_model) SAME_INT(n_layers) SAME_INT(n_heads)
    SAME_INT(n_kv_heads) SAME_INT(tie_embeddings)
    // ffn_dim is the dense blocks' width; a model whose every block is MoE
    // uses it only through llama_moe_ffn (compared below), so a Mixtral
    // import (ffn_dim = intermediate_size) matches a config that sets
    // moe_ffn_dim alone
    if (!m->moe_experts || m->moe_first_dense_layers > 0 || !c->moe_experts) SAME_INT(ffn_dim)
    if (llama_head_dim(c) != llama_head_dim(m))
        return error_set(err, STATUS_BAD_INPUT, "%s: [model] head_dim = %d, but the run has %d", path,
                         llama_head_dim(c), llama_head_dim(m));
    SAME_INT(qkv_bias) SAME_INT(qk_norm)
    SAME_INT(moe_experts)
    if (m->moe_experts) {
        SAME_INT(moe_top_k) SAME_INT(moe_shared_experts) SAME_INT(moe_first_dense_layers)
        SAME_INT(moe_norm_topk) // renormalising the top-k weights changes what they compute
        if (llama_moe_ffn(c) != llama_moe_ffn(m) || llama_moe_shared_ffn(c) != llama_moe_shared_ffn(m) ||
            (llama_moe_shared_ffn(m) && c->moe_shared_gate != m->moe_shared_gate))
            return error_set(err, STATUS_BAD_INPUT, "%s: [model] moe_ffn_dim = %d, moe_shared_ffn_dim "
                             "= %d, moe_shared_gate = %d, but the run has %d, %d, %d", path,
                             llama_moe_ffn(c), llama_moe_shared_ffn(c), (int)c->moe_shared_gate,
                             llama_moe_ffn(m), llama_moe_shared_ffn(m), (int)m->moe_shared_gate);
    }
#undef SAME_INT
    const struct rope_scaling *rc = &c->rope_scaling, *rm = &m->rope_scaling;
    if (rc->type != rm->type ||
        (rc->type != ROPE_SCALING_NONE &&
         (rc->factor != rm->factor || rc->low_freq_factor != rm->low_freq_factor ||
          rc->high_freq_factor != rm->high_freq_factor ||
          rc->original_max_pos != rm->original_max_pos)))
        return error_set(err, STATUS_BAD_INPUT, "%s: [model] rope_scaling = %s (factor %.17g, "
                         "low_freq_factor %.17g, high_freq_factor %.17g, original_max_pos %d), but "
                         "the run has %s (%.17g, %.17g, %.17g, %d)", path,
                         ckpt_rope_scaling_name(rc->type), rc->factor, rc->low_freq_factor,
                         rc->high_freq_factor, rc->original_max_pos,
                         ckpt_rope_scaling_name(rm->type), rm->factor, rm->low_freq_factor,
                         rm->high_freq_factor, rm->original_max_pos);
    if (c->rope_theta != m->rope_theta || c->norm_eps != m->norm_eps)
        return error_set(err, STATUS_BAD_INPUT, "%s: [model] rope_theta = %.17g, norm_eps = %.9g; "
                         "the run has %.17g, %.9g", path, c->rope_theta, (double)c->norm_eps,
                         m->rope_theta, (double)m->norm_eps);
    return checkpoint_check_tokenizer(path, r->info.tokenizer_id, tokenizer_id, err);
}

enum status checkpoint_check_tokenizer(const char *where, const char *have, const char *want,
                                       struct error *err) {
    if (have && *have && want && *want && strcmp(have, want))
        return error_set(err, STATUS_BAD_INPUT, "%s: tokenizer = '%s', but the run's data uses '%s'",
                         where, have, want);
    return STATUS_OK;
}

static int cmp_piece_name(const void *key, const void *elem) {
    return strcmp(key, ((const struct stored_piece *)elem)->p.name);
}

// Whether name is "<p>/..." for one of the n prefixes.
static bool has_prefix(const char *name, const char *const *prefixes, int n) {
    for (int k = 0; k < n; k++) {
        size_t len = strlen(prefixes[k]);
        if (!strncmp(name, prefixes[k], len) && name[len] == '/') return true;
    }
    return false;
}

enum status checkpoint_check_tensors(const struct ckpt_reader *r, const char *const *state_names, int n_state,
                                     const char *const *optional, int n_optional, struct error *err) {
    struct param_info *params;
    int n;
    enum status st = model_param_table(&r->info.model, &params, &n, err);
    if (st) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return error_set(err, STATUS_BAD_INPUT, "%s: [model] is not a model trident builds: %s", r->manifest, why);
    }
    CHECK(n_state >= 0 && n_state < 8, "checkpoint_check_tensors: %d state names", n_state);
    const char *prefixes[8] = {"param"};
    for (int k = 0; k < n_state; k++) prefixes[1 + k] = state_names[k];
    int kinds = r->info.weights_only ? 1 : 1 + n_state; // weights only: param/ alone
    char name[CKPT_NAME_MAX];
    for (int i = 0; !st && i < n; i++)
        for (int k = 0; !st && k < kinds; k++) {
            snprintf(name, sizeof name, "%s/%s", prefixes[k], params[i].name);
            const struct stored_piece *sp =
                r->n_pieces ? bsearch(name, r->pieces, (size_t)r->n_pieces, sizeof *r->pieces, cmp_piece_name)
                            : NULL;
            if (!sp)
                st = error_set(err, STATUS_BAD_INPUT, "%s: no tensor %s in any rank file, but the model of "
                               "manifest.ini has it (incomplete checkpoint)", r->info.path, name);
            else if (sp->p.grows != params[i].grows || sp->p.gcols != params[i].gcols ||
                     (sp->p.dtype != DTYPE_FP32 && sp->p.dtype != DTYPE_FP64))
                st = error_set(err, STATUS_BAD_INPUT, "%s/rank-%05d.h5: tensor %s is (%d, %d) %s; the model of "
                               "manifest.ini has it (%d, %d) fp32", r->info.path, sp->file, name, sp->p.grows,
                               sp->p.gcols, dtype_name(sp->p.dtype), params[i].grows, params[i].gcols);
        }
    // Every expected name is there: any other distinct name is one too many
    // (but the optional ones, fp32 or fp64).
    int distinct = 0;
    for (int i = 0; !st && i < r->n_pieces; i++) {
        const struct stored_piece *sp = &r->pieces[i];
        bool opt = has_prefix(sp->p.name, optional, n_optional);
        if (opt && sp->p.dtype != DTYPE_FP32 && sp->p.dtype != DTYPE_FP64)
            st = error_set(err, STATUS_BAD_INPUT, "%s/rank-%05d.h5: tensor %s is %s, expected fp32", r->info.path,
                           sp->file, sp->p.name, dtype_name(sp->p.dtype));
        distinct += !opt && (i == 0 || strcmp(sp->p.name, r->pieces[i - 1].p.name));
    }
    for (int i = 0; !st && distinct != kinds * n && i < r->n_pieces; i++) { // name the first stranger
        bool known = has_prefix(r->pieces[i].p.name, optional, n_optional);
        for (int j = 0; !known && j < n; j++)
            for (int k = 0; !known && k < kinds; k++) {
                snprintf(name, sizeof name, "%s/%s", prefixes[k], params[j].name);
                known = !strcmp(name, r->pieces[i].p.name);
            }
        if (!known)
            st = error_set(err, STATUS_BAD_INPUT, "%s/rank-%05d.h5: tensor '%s' is not one of the model of "
                           "manifest.ini", r->info.path, r->pieces[i].file, r->pieces[i].p.name);
    }
    free(params);
    return st;
}

// Global rows [r0, r1] and columns [c0, c1) that a piece's flat range spans.
static void piece_bbox(const struct ckpt_piece *p, int *r0, int *r1, int *c0, int *c1) {
    *r0 = p->row_offset + (int)(p->flat_begin / (size_t)p->cols);
    *r1 = p->row_offset + (int)((p->flat_end - 1) / (size_t)p->cols);
    *c0 = p->col_offset, *c1 = p->col_offset + p->cols;
}

static int bbox_meet(const struct ckpt_piece *a, const struct ckpt_piece *b) {
    int ar0, ar1, ac0, ac1, br0, br1, bc0, bc1;
    piece_bbox(a, &ar0, &ar1, &ac0, &ac1);
    piece_bbox(b, &br0, &br1, &bc0, &bc1);
    return ar0 <= br1 && br0 <= ar1 && ac0 < bc1 && bc0 < ac1;
}

// The first element of want's range not yet in the cache (numel: none).
static size_t first_missing(const struct ckpt_reader *r, const struct ckpt_piece *want) {
    for (size_t f = want->flat_begin; f < want->flat_end;) {
        size_t row = f / (size_t)want->cols, c = f % (size_t)want->cols;
        size_t run = MIN((size_t)want->cols - c, want->flat_end - f);
        size_t g = ((size_t)want->row_offset + row) * (size_t)want->gcols + (size_t)want->col_offset + c;
        const unsigned char *z = memchr(r->mask + g, 0, run);
        if (z) return (size_t)(z - r->mask);
        f += run;
    }
    return SIZE_MAX;
}

// Reads stored piece k into the cache (as r->cache_dtype) and marks it.
static enum status load_stored(struct ckpt_reader *r, int k, struct error *err) {
    const struct stored_piece *s = &r->pieces[k];
    size_t es = dtype_size(r->cache_dtype), n = s->p.flat_end - s->p.flat_begin;
    size_t numel = (size_t)s->p.grows * (size_t)s->p.gcols;
    r->loaded[k] = 1;
    // A piece that is the whole tensor is read straight into the cache.
    int whole = n == numel;
    if (!whole && n * es > r->tmp_bytes) {
        free(r->tmp);
        r->tmp = xmalloc(r->tmp_bytes = n * es);
    }
    void *buf = whole ? r->cache : r->tmp;
    char dname[32];
    snprintf(dname, sizeof dname, "pieces/%05d", s->index);
    durable_hang_point("ckpt_read_piece", s->p.name); // TRIDENT_FAULT=hang:ckpt_read_piece (tests)
    hid_t ds = H5Dopen2(r->files[s->file], dname, H5P_DEFAULT);
    // HDF5 converts fp32 <-> fp64 on read.
    int bad = ds < 0 || H5Dread(ds, ckpt_h5_type(r->cache_dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                buf) < 0;
    if (ds >= 0) H5Dclose(ds);
    if (bad) {
        r->cache_name[0] = 0; // the cache may be half overwritten
        return error_set(err, STATUS_BAD_INPUT, "%s/rank-%05d.h5: reading tensor %s failed",
                         r->info.path, s->file, s->p.name);
    }
    if (whole) {
        memset(r->mask, 1, numel);
        return STATUS_OK;
    }
    ckpt_block_copy(r->cache, s->p.gcols, s->p.row_offset, s->p.col_offset, s->p.cols,
                    s->p.flat_begin, s->p.flat_end, buf, es, 1);
    if (n > r->ones_bytes) {
        free(r->ones);
        r->ones = xmalloc(r->ones_bytes = n);
        memset(r->ones, 1, n);
    }
    ckpt_block_copy((char *)r->mask, s->p.gcols, s->p.row_offset, s->p.col_offset, s->p.cols,
                    s->p.flat_begin, s->p.flat_end, (char *)r->ones, 1, 1);
    return STATUS_OK;
}

enum status checkpoint_read_piece(struct ckpt_reader *r, struct ckpt_piece *want,
                                  struct error *err) {
    const char *why = ckpt_piece_tags_error(want);
    CHECK(!why, "wanted piece %s: %s", want->name, why);
    int i = 0;
    while (i < r->n_pieces && strcmp(r->pieces[i].p.name, want->name)) i++;
    if (i == r->n_pieces)
        return error_set(err, STATUS_BAD_INPUT, "%s: no tensor %s in the checkpoint", r->info.path,
                         want->name);
    int j = i;
    while (j < r->n_pieces && !strcmp(r->pieces[j].p.name, want->name)) j++;
    const struct ckpt_piece *p0 = &r->pieces[i].p;
    if (p0->grows != want->grows || p0->gcols != want->gcols)
        return error_set(err, STATUS_BAD_INPUT, "%s: tensor %s is (%d, %d), the run expects (%d, %d)",
                         r->info.path, want->name, p0->grows, p0->gcols, want->grows, want->gcols);
    int fp = (p0->dtype == DTYPE_FP32 || p0->dtype == DTYPE_FP64) &&
             (want->dtype == DTYPE_FP32 || want->dtype == DTYPE_FP64);
    if (p0->dtype != want->dtype && !fp)
        return error_set(err, STATUS_BAD_INPUT, "%s: tensor %s is %s, the run expects %s",
                         r->info.path, want->name, dtype_name(p0->dtype), dtype_name(want->dtype));
    if (want->flat_begin == want->flat_end) return STATUS_OK;
    size_t numel = (size_t)p0->grows * (size_t)p0->gcols, es = dtype_size(want->dtype);
    if (strcmp(r->cache_name, want->name) || r->cache_dtype != want->dtype) {
        // A new tensor: an empty cache of its global shape.
        if (numel * es > r->cache_bytes) {
            free(r->cache);
            r->cache = xmalloc(r->cache_bytes = numel * es);
        }
        if (numel > r->mask_bytes) {
            free(r->mask);
            r->mask = xmalloc(r->mask_bytes = numel);
        }
        memset(r->mask, 0, numel);
        memset(r->loaded, 0, (size_t)r->n_pieces);
        snprintf(r->cache_name, sizeof r->cache_name, "%s", want->name);
        r->cache_dtype = want->dtype;
    }
    // Reads stored pieces that meet the wanted range until it is all there:
    // a copy held by several ranks (replicas, DP) is read once.
    size_t miss;
    int k = i;
    while ((miss = first_missing(r, want)) != SIZE_MAX) {
        while (k < j && (r->loaded[k] || r->pieces[k].p.flat_begin == r->pieces[k].p.flat_end ||
                         !bbox_meet(&r->pieces[k].p, want)))
            k++;
        if (k == j) // checkpoint_open checked coverage: only a changed file gets here
            return error_set(err, STATUS_BAD_INPUT, "%s: tensor %s: element (%zu, %zu) is in no "
                             "rank file", r->info.path, want->name, miss / (size_t)want->gcols,
                             miss % (size_t)want->gcols);
        enum status st = load_stored(r, k, err);
        if (st) return st;
    }
    ckpt_block_copy(r->cache, want->gcols, want->row_offset, want->col_offset, want->cols,
                    want->flat_begin, want->flat_end, want->data, es, 0);
    return STATUS_OK;
}

enum status checkpoint_read_entries(struct ckpt_reader *r, int rank, const struct state_entry *entries, int n,
                                    struct error *err) {
    if (rank < 0) rank = 0;
    CHECK(rank < r->info.world_size, "rank %d of %d", rank, r->info.world_size);
    hid_t g = H5Gopen2(r->files[rank], "state", H5P_DEFAULT);
    if (g < 0) return error_set(err, STATUS_BAD_INPUT, "%s/rank-%05d.h5: group /state missing", r->info.path, rank);
    enum status st = STATUS_OK;
    for (int i = 0; !st && i < n; i++) {
        const struct state_entry *e = &entries[i];
        htri_t exists = H5Aexists(g, e->name);
        if (exists < 0) { // a damaged object header: stop at its first error, as HDF5 may not survive more
            st = error_set(err, STATUS_BAD_INPUT, "%s/rank-%05d.h5: /state cannot be read (looking for %s)",
                           r->info.path, rank, e->name);
            break;
        }
        bool have = exists > 0;
        if (e->found) *e->found = have;
        if (!have) {
            if (e->required)
                st = error_set(err, STATUS_BAD_INPUT, "%s/rank-%05d.h5: /state has no %s", r->info.path, rank,
                               e->name);
            for (int k = 0; !st && k < e->count; k++) {
                if (e->type == STATE_I64) ((int64_t *)e->value)[k] = (int64_t)e->dflt;
                else if (e->type == STATE_U64) ((uint64_t *)e->value)[k] = (uint64_t)e->dflt;
                else ((double *)e->value)[k] = e->dflt;
            }
            continue;
        }
        hid_t type = e->type == STATE_I64 ? H5T_NATIVE_INT64 : e->type == STATE_U64 ? H5T_NATIVE_UINT64
                                                                                  : H5T_NATIVE_DOUBLE;
        if (attr_read(g, e->name, type, (size_t)e->count, e->value)) {
            char what[128] = "";
            h5util_attr_describe(g, e->name, what, sizeof what);
            st = error_set(err, STATUS_BAD_INPUT, "%s/rank-%05d.h5: /state attribute %s is %s, expected %d %s",
                           r->info.path, rank, e->name, what, e->count,
                           e->type == STATE_F64 ? "floating-point numbers" : "integers");
        }
    }
    H5Gclose(g);
    return st;
}

int checkpoint_pieces_from_params(const struct param_info *params, int n, const char *prefix,
                                  void *arena, enum dtype dtype, size_t begin, size_t end,
                                  struct ckpt_piece *out) {
    int k = 0;
    size_t es = dtype_size(dtype);
    for (int i = 0; i < n; i++) {
        const struct param_info *p = &params[i];
        // Valid rows come first in the block's row-major layout; padding after.
        size_t valid = (size_t)p->valid_rows * (size_t)p->cols;
        size_t lo = MAX(begin, p->offset), hi = MIN(end, p->offset + valid);
        if (lo >= hi) continue;
        struct ckpt_piece *q = &out[k++];
        memset(q, 0, sizeof *q);
        snprintf(q->name, sizeof q->name, "%s/%s", prefix, p->name);
        q->grows = p->grows, q->gcols = p->gcols;
        q->row_offset = p->row_offset, q->col_offset = p->col_offset;
        q->rows = p->valid_rows, q->cols = p->cols;
        q->flat_begin = lo - p->offset, q->flat_end = hi - p->offset;
        q->dtype = dtype;
        q->data = (char *)arena + (lo - begin) * es;
    }
    return k;
}

enum status checkpoint_piece_nonfinite(struct ckpt_reader *r, int i, struct ckpt_nonfinite *out,
                                       struct error *err) {
    CHECK(i >= 0 && i < r->n_pieces, "piece %d of %d", i, r->n_pieces);
    const struct stored_piece *s = &r->pieces[i];
    size_t n = s->p.flat_end - s->p.flat_begin, es = dtype_size(s->p.dtype);
    memset(out, 0, sizeof *out);
    if (n == 0 || s->p.dtype == DTYPE_I32 || s->p.dtype == DTYPE_I64) return STATUS_OK;
    if (n * es > r->tmp_bytes) { // the staging buffer of load_stored; holds nothing between calls
        free(r->tmp);
        r->tmp = xmalloc(r->tmp_bytes = n * es);
    }
    char dname[32];
    snprintf(dname, sizeof dname, "pieces/%05d", s->index);
    durable_hang_point("ckpt_read_piece", s->p.name); // TRIDENT_FAULT=hang:ckpt_read_piece (tests)
    hid_t ds = H5Dopen2(r->files[s->file], dname, H5P_DEFAULT);
    int bad = ds < 0 || H5Dread(ds, ckpt_h5_type(s->p.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                r->tmp) < 0;
    if (ds >= 0) H5Dclose(ds);
    if (bad)
        return error_set(err, STATUS_BAD_INPUT, "%s/rank-%05d.h5: reading tensor %s failed",
                         r->info.path, s->file, s->p.name);
    size_t first = 0;
    out->count = ckpt_count_nonfinite(r->tmp, s->p.dtype, n, &first);
    if (!out->count) return STATUS_OK;
    size_t f = s->p.flat_begin + first;
    out->row = s->p.row_offset + (int)(f / (size_t)s->p.cols);
    out->col = s->p.col_offset + (int)(f % (size_t)s->p.cols);
    const char *x = (const char *)r->tmp + first * es;
    if (s->p.dtype == DTYPE_FP32) out->value = *(const float *)x;
    else if (s->p.dtype == DTYPE_FP64) out->value = *(const double *)x;
    else out->value = (*(const uint16_t *)x & (s->p.dtype == DTYPE_BF16 ? 0x7f : 0x3ff)) ? NAN
                      : (*(const uint16_t *)x & 0x8000) ? -INFINITY : INFINITY;
    return STATUS_OK;
}

enum status checkpoint_read_pieces(struct ckpt_reader *r, struct ckpt_piece *pieces, int n,
                                   struct watchdog *wd, struct error *err) {
    enum status st = STATUS_OK;
    for (int i = 0; !st && i < n; i++) {
        st = checkpoint_read_piece(r, &pieces[i], err);
        watchdog_kick(wd); // a tensor piece read is progress
    }
    return st;
}
