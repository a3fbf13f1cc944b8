// test_checkpoint_entries.c: named state entries (base/state_entry.h) as the
// checkpoint layer stores them for their owners: a one-rank save with
// entries of every type (a scalar and arrays) reads back equal; an entry the
// file lacks takes its default (a file written before it existed), or is
// refused when required; one of another type or count is refused naming it;
// found says which were there; a read_only one (a name of older files) is
// not written; the layer's own /state step is there beside them.
#include <string.h>

#include "ckpt/checkpoint.h"
#include "test.h"

enum { R = 4, C = 3 };

static const struct llama_config model_cfg = {
    .vocab_size = 256, .d_model = 10, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1,
    .ffn_dim = 32, .max_seq_len = 64, .rope_theta = 10000, .norm_eps = 1e-5f,
    .tie_embeddings = true, .init_std = 0.02f};

int main(void) {
    char root[] = "/tmp/trident-ckpt-entries-XXXXXX";
    if (!mkdtemp(root)) TEST_SKIP("cannot make a temporary folder");
    struct comm_group self;
    comm_self_init(&self);
    float w[R * C];
    for (int i = 0; i < R * C; i++) w[i] = (float)i;
    struct ckpt_piece p = {.name = "param/w", .grows = R, .gcols = C, .rows = R, .cols = C,
                           .flat_end = R * C, .dtype = DTYPE_FP32, .data = w};
    int64_t scale_steps = -5;
    uint64_t words[3] = {1, UINT64_MAX, 7};
    double scales[2] = {0.5, 1e300};
    struct state_entry saved[] = {
        {.name = "owner_steps", .type = STATE_I64, .count = 1, .value = &scale_steps},
        {.name = "owner_words", .type = STATE_U64, .count = 3, .value = words},
        {.name = "owner_scales", .type = STATE_F64, .count = 2, .value = scales},
        {.name = "owner_older", .type = STATE_I64, .count = 1, .value = &scale_steps, .read_only = true},
    };
    struct ckpt_save_args a = {.dir = root, .step = 3, .layout = topology_layout(1, 1, 1, 0, 1),
                               .model = &model_cfg, .tokenizer_id = "", .pieces = &p, .n_pieces = 1,
                               .entries = saved, .n_entries = 4};
    struct error err = {0};
    EXPECT(checkpoint_save(&a, &self, &err) == STATUS_OK, "save: %s", err.msg);
    struct ckpt_reader *r;
    char path[CKPT_PATH_MAX];
    snprintf(path, sizeof path, "%s/step-000003", root);
    if (checkpoint_open(path, &r, &err)) {
        EXPECT(0, "open: %s", err.msg);
        return test_finish("test_checkpoint_entries");
    }
    // Back as saved, and the struct's attributes beside them.
    int64_t steps_back = 0;
    uint64_t words_back[3] = {0};
    double scales_back[2] = {0};
    struct state_entry back[] = {
        {.name = "owner_steps", .type = STATE_I64, .count = 1, .value = &steps_back, .required = true},
        {.name = "owner_words", .type = STATE_U64, .count = 3, .value = words_back},
        {.name = "owner_scales", .type = STATE_F64, .count = 2, .value = scales_back},
    };
    EXPECT(checkpoint_read_entries(r, 0, back, 3, &err) == STATUS_OK, "read: %s", err.msg);
    EXPECT(steps_back == -5 && !memcmp(words_back, words, sizeof words) && scales_back[0] == 0.5 &&
               scales_back[1] == 1e300, "values: %lld %llu %g", (long long)steps_back,
           (unsigned long long)words_back[1], scales_back[1]);
    // The layer's own step beside them (an entry of that name would be a CHECK).
    int64_t step_back = 0;
    struct state_entry step = {.name = "step", .type = STATE_I64, .count = 1, .value = &step_back, .required = true};
    EXPECT(checkpoint_read_entries(r, 0, &step, 1, &err) == STATUS_OK && step_back == 3, "step beside the entries: %s",
           err.msg);
    // found: which were there; a read_only entry was not written.
    bool found[2] = {false, true};
    int64_t older = 77;
    struct state_entry which[] = {
        {.name = "owner_steps", .type = STATE_I64, .count = 1, .value = &steps_back, .found = &found[0]},
        {.name = "owner_older", .type = STATE_I64, .count = 1, .value = &older, .dflt = 4, .found = &found[1]},
    };
    EXPECT(checkpoint_read_entries(r, 0, which, 2, &err) == STATUS_OK && found[0] && !found[1] && older == 4,
           "found %d %d, owner_older %lld (read_only: not written, its default): %s", found[0], found[1],
           (long long)older, err.msg);
    // Absent: the default (every element), or refused when required.
    double fp8[4] = {9, 9, 9, 9};
    struct state_entry newer = {.name = "fp8_scales", .type = STATE_F64, .count = 4, .value = fp8, .dflt = 1.0};
    EXPECT(checkpoint_read_entries(r, -1, &newer, 1, &err) == STATUS_OK && fp8[0] == 1.0 && fp8[3] == 1.0,
           "absent: default 1, got %g: %s", fp8[0], err.msg);
    newer.required = true;
    EXPECT(checkpoint_read_entries(r, 0, &newer, 1, &err) == STATUS_BAD_INPUT &&
               strstr(err.msg, "/state has no fp8_scales"), "required, absent: %s", err.msg);
    // Another type or count: refused, naming the entry.
    double as_float = 0;
    struct state_entry wrong = {.name = "owner_steps", .type = STATE_F64, .count = 1, .value = &as_float};
    EXPECT(checkpoint_read_entries(r, 0, &wrong, 1, &err) == STATUS_BAD_INPUT &&
               strstr(err.msg, "owner_steps"), "another type: %s", err.msg);
    uint64_t two[2];
    wrong = (struct state_entry){.name = "owner_words", .type = STATE_U64, .count = 2, .value = two};
    EXPECT(checkpoint_read_entries(r, 0, &wrong, 1, &err) == STATUS_BAD_INPUT &&
               strstr(err.msg, "owner_words"), "another count: %s", err.msg);
    checkpoint_close(r);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
    return test_finish("test_checkpoint_entries");
}
