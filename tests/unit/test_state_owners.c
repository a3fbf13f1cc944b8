// test_state_owners.c: the training state's owners save and load their own
// values through the checkpoint layer (docs/design.md §7, "Who owns what a
// checkpoint holds"). A one-rank save of every owner's entries, gathered as
// the trainer gathers them (trainer_state_entries), reads back equal entry by
// entry (trainer_state_read); the live loss scaler's values go out through
// its owner (loss_scaler_saved_of) and come back through it
// (loss_scaler_saved_restore); /state holds exactly the names, types and
// counts files have held since before the owners took them over (the table
// below), written in the same order (so a rank file's bytes are an earlier
// build's: checked by hand against the build before issue 27), so older
// builds' files and these read alike.
//
// Built a second time by tests/e2e/state_owner.sh with -DPLANTED against a
// copy of the tree where one scalar was added to the loss scaler's files
// alone (struct loss_scaler, its saved form and one entry): it must come
// back, and /state must hold it, with no change anywhere else (src/ckpt/ nor
// train_state.c).
#include <hdf5.h>
#include <string.h>

#include "ckpt/checkpoint.h"
#include "test.h"
#include "train/train_state.h"

static const struct llama_config model_cfg = {
    .vocab_size = 256, .d_model = 10, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1,
    .ffn_dim = 32, .max_seq_len = 64, .rope_theta = 10000, .norm_eps = 1e-5f,
    .tie_embeddings = true, .init_std = 0.02f};

// /state of a trainer's checkpoint, as written before the owners held it
// (docs/formats.md): name, integer (signed or not) or float, element count.
enum kind { I64, U64, F64 };
static const struct {
    const char *name;
    enum kind kind;
    int count;
} old_state[] = {
    {"step", I64, 1},           {"lr_step", I64, 1},          {"opt_steps", I64, 1},
    {"loader_samples", U64, 72}, {"loader_weights", F64, 32},  {"rng_seed", U64, 1},
    {"rng_state", U64, 4},      {"loss_scale", F64, 1},       {"loss_scale_good_steps", I64, 1},
    {"skipped_steps", I64, 1},  {"consecutive_skips", I64, 1}, {"train_steps", I64, 1},
    {"lr", F64, 1},             {"min_lr", F64, 1},           {"warmup_steps", I64, 1},
    {"lr_schedule", I64, 1},    {"lr_rebase_step", I64, 1},   {"lr_rebase_lr", F64, 1},
    {"loss_on", I64, 1},
};
enum { N_OLD = sizeof old_state / sizeof old_state[0] };

struct seen {
    int n, old_ok, planted_ok, in_order; // in_order: attributes in the old order so far
    char other[256];
};

static herr_t on_attr(hid_t loc, const char *name, const H5A_info_t *info, void *data) {
    struct seen *s = data;
    // Native order: the object header's, i.e. the order the attributes were
    // written in, which sets the file's bytes.
    if (s->n < N_OLD && s->in_order == s->n && !strcmp(name, old_state[s->n].name)) s->in_order++;
    s->n++;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT), t = H5Aget_type(a), sp = H5Aget_space(a);
    H5T_class_t cls = H5Tget_class(t);
    enum kind kind = cls == H5T_FLOAT ? F64 : H5Tget_sign(t) == H5T_SGN_NONE ? U64 : I64;
    int count = (int)H5Sget_simple_extent_npoints(sp);
    bool eight = H5Tget_size(t) == 8;
    H5Sclose(sp), H5Tclose(t), H5Aclose(a);
    for (int i = 0; i < N_OLD; i++)
        if (!strcmp(old_state[i].name, name)) {
            s->old_ok += eight && kind == old_state[i].kind && count == old_state[i].count;
            return 0;
        }
#ifdef PLANTED
    if (!strcmp(name, "loss_scaler_planted")) {
        s->planted_ok = eight && kind == I64 && count == 1;
        return 0;
    }
#endif
    size_t k = strlen(s->other);
    snprintf(s->other + k, sizeof s->other - k, " %s", name);
    return 0;
}

int main(void) {
    char root[] = "/tmp/trident-state-owners-XXXXXX";
    if (!mkdtemp(root)) TEST_SKIP("cannot make a temporary folder");
    struct comm_group self;
    comm_self_init(&self);
    float w[12];
    for (int i = 0; i < 12; i++) w[i] = (float)i;
    struct ckpt_piece p = {.name = "param/w", .grows = 4, .gcols = 3, .rows = 4, .cols = 3, .flat_end = 12,
                           .dtype = DTYPE_FP32, .data = w};

    // Every owner's values, none of them a default: the loss scaler's from
    // a live scaler through its owner, the rest as their owners' saved forms.
    struct loss_scaler live = {.scale = 2048, .good_steps = 3, .dynamic = true};
#ifdef PLANTED
    live.planted = 4242;
#endif
    struct trainer_saved sv = {
        .step = 7,
        .progress = {.lr_step = 6, .skipped_steps = 1, .consecutive_skips = 1, .rng_seed = 99,
                     .rng_state = {5, 6, 7, 8}, .loss_on = 1},
        .opt = {.opt_steps = 6, .has_schedule = true, .steps = 50, .warmup_steps = 4, .schedule = 1,
                .rebase_step = 3, .lr = 3e-3, .min_lr = 3e-4, .rebase_lr = 1.5e-3},
        .loader = {.format = 2, .seed = 99, .epoch = 2, .sample = 40, .seq_len = 16, .n_datasets = 2,
                   .global_batch_size = 8, .counts = {25, 15}, .sequences = {100, 60}, .weights = {0.6, 0.4}},
    };
    loss_scaler_saved_of(&live, &sv.scaler);
    loader_saved_pack(&sv.loader, &sv.loader_saved);
    struct state_entry e[TRAINER_STATE_MAX_ENTRIES];
    int n = trainer_state_entries(&sv, e, TRAINER_STATE_MAX_ENTRIES);
    struct ckpt_save_args a = {.dir = root, .step = 7, .layout = topology_layout(1, 1, 1, 0, 1),
                               .model = &model_cfg, .tokenizer_id = "", .pieces = &p, .n_pieces = 1,
                               .entries = e, .n_entries = n};
    struct error err = {0};
    EXPECT(checkpoint_save(&a, &self, &err) == STATUS_OK, "save: %s", err.msg);

    char path[CKPT_PATH_MAX];
    snprintf(path, sizeof path, "%s/step-000007", root);
    struct ckpt_reader *r;
    if (checkpoint_open(path, &r, &err)) {
        EXPECT(0, "open: %s", err.msg);
        return test_finish("test_state_owners");
    }
    EXPECT(trainer_state_verify(r, &err) == STATUS_OK, "verify: %s", err.msg);
    struct trainer_saved back;
    EXPECT(trainer_state_read(r, 0, &back, &err) == STATUS_OK, "read: %s", err.msg);
    checkpoint_close(r);
    // Entry by entry, whatever the owners hold (a new entry included).
    struct state_entry eb[TRAINER_STATE_MAX_ENTRIES];
    EXPECT(trainer_state_entries(&back, eb, TRAINER_STATE_MAX_ENTRIES) == n, "entry count");
    int written = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].read_only) continue;
        written++;
        EXPECT(!strcmp(e[i].name, eb[i].name) && !memcmp(e[i].value, eb[i].value, (size_t)e[i].count * 8),
               "entry %s: not back as saved", e[i].name);
    }
    EXPECT(back.opt.has_schedule && back.loader.sample == 40 && back.loader.weights[1] == 0.4 &&
               back.progress.loss_on == 1, "unpacked: schedule %d, sample %llu", back.opt.has_schedule,
           (unsigned long long)back.loader.sample);
    struct loss_scaler again = {.scale = 1, .dynamic = true};
    loss_scaler_saved_restore(&again, &back.scaler);
    EXPECT(again.scale == 2048 && again.good_steps == 3, "the scaler restored: %g, %d", again.scale,
           again.good_steps);
#ifdef PLANTED
    EXPECT(again.planted == 4242, "the planted scalar came back as %lld, expected 4242", (long long)again.planted);
#endif

    // /state on disk: the old names, types and counts, and nothing else.
    snprintf(path, sizeof path, "%s/step-000007/rank-00000.h5", root);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), g = f >= 0 ? H5Gopen2(f, "state", H5P_DEFAULT) : -1;
    struct seen seen = {0};
    EXPECT(g >= 0 && H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_NATIVE, NULL, on_attr, &seen) >= 0, "listing /state");
    if (g >= 0) H5Gclose(g);
    if (f >= 0) H5Fclose(f);
    int planted = 0;
#ifdef PLANTED
    planted = 1;
    EXPECT(seen.planted_ok, "/state holds no int64 loss_scaler_planted");
#endif
    EXPECT(seen.old_ok == N_OLD && seen.n == N_OLD + planted && written + 1 == seen.n,
           "/state: %d of the %d old attributes as before, %d in all (%d entries written + step), others:%s",
           seen.old_ok, N_OLD, seen.n, written, seen.other);
    // In the old order (a newer entry after them): a rank file's bytes are
    // what builds before the owners held their state wrote.
    EXPECT(seen.in_order == N_OLD, "/state's first %d attributes are in the old order, expected all %d", seen.in_order,
           N_OLD);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
    return test_finish("test_state_owners");
}
