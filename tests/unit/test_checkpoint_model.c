// test_checkpoint_model.c: resharding through the real parameter table of
// model.c (checkpoint_pieces_from_params). Layout A: tp=2 x pp=2 x dp=2
// with ZeRO-1 (8 rank files, written by one process): parameters from
// model_init of each (tp, pp) shard, saved by DP rank 0; moments m and v with
// values from a closed form of (name, global row, col), each DP rank saving
// its half of the arena. The vocabulary (V = 51) does not divide by tp, so
// the embedding and lm_head blocks carry padding rows that must not be saved.
// Layout B: tp=1, pp=1, a model initialised from another seed loads the
// checkpoint; its parameters must equal those of a tp=1 model initialised
// from the saved seed (init depends only on seed, name, global index: an
// independent reference), and its moments the closed form; then 3 ZeRO
// ranks of layout B each read only their shard of m (arena cut mid-tensor).
// Layout checks (checkpoint_check_layout): layout A's files pass; copies
// whose manifest.ini says another tp or pp (the world kept, so that they
// still open and read the same values) or that hold one rank file more are
// refused naming the key and a file; so are an ep = 2 checkpoint of a MoE
// model (its expert tensors' row blocks on the files of ep ranks 0 and 1)
// relabelled ep = 1 and ep = 4. A truncated rank file: checkpoint_open
// refuses, checkpoint_read_manifest still gives the step and the layout.
#include <string.h>

#include "ckpt/checkpoint.h"
#include "test.h"

enum { TP = 2, PP = 2, DP = 2, B = 1, T = 8 };

static const struct llama_config cfg = {
    .vocab_size = 51, .d_model = 16, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
    .ffn_dim = 24, .max_seq_len = 16, .rope_theta = 10000, .norm_eps = 1e-5f,
    .tie_embeddings = false, .init_std = 0.02f};

// Moment value of element (r, c) of the global tensor `name` (which: 0 m, 1 v).
static float moment(const char *name, int which, int r, int c) {
    unsigned h = 2166136261u;
    for (const char *s = name; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return (float)((h % 97) + which * 1000 + r * 0.5 + c * 0.25);
}

// An arena-shaped host array of the moments of params (NaN in padding).
static float *moments_of(const struct param_info *p, int n, size_t len, int which) {
    float *a = xmalloc(len * sizeof *a);
    for (size_t i = 0; i < len; i++) a[i] = NAN;
    for (int i = 0; i < n; i++)
        for (int r = 0; r < p[i].valid_rows; r++)
            for (int c = 0; c < p[i].cols; c++)
                a[p[i].offset + (size_t)r * p[i].cols + c] =
                    moment(p[i].name, which, p[i].row_offset + r, p[i].col_offset + c);
    return a;
}

static struct model *init_model(struct backend *be, int t, int tp, int s, int pp, uint64_t seed) {
    struct model_shard shard = model_shard_pipeline(&cfg, PP_SCHEDULE_1F1B, pp, s, 1);
    shard.tp_rank = t, shard.tp_size = tp;
    struct model *m = NULL;
    struct error err = {0};
    if (model_init(&m, be, &cfg, &shard, DTYPE_FP32, B, T, seed, &err))
        fprintf(stderr, "model_init: %s\n", err.msg);
    return m;
}

static void run(const char *cmd) { EXPECT(system(cmd) == 0, "%s", cmd); }

// A copy of the checkpoint folder good, changed by cmd (run in the copy),
// opens (the manifest's own checks pass, the values read as before) but
// checkpoint_check_layout refuses it with a message holding each needle.
static void expect_layout_refused(const char *good, const char *name, const char *cmd,
                                  const char *needle, const char *needle2) {
    char buf[4096], copy[1024];
    snprintf(copy, sizeof copy, "%s-%s", good, name);
    snprintf(buf, sizeof buf, "cp -r %s %s && cd %s && %s", good, copy, copy, cmd);
    run(buf);
    struct ckpt_reader *r = NULL;
    struct error err = {0};
    EXPECT(checkpoint_open(copy, &r, &err) == STATUS_OK, "%s: open: %s", name, err.msg);
    if (!r) return;
    enum status st = checkpoint_check_layout(r, &err);
    EXPECT(st == STATUS_BAD_INPUT && strstr(err.msg, needle) && strstr(err.msg, needle2),
           "%s: status %d, message '%s' lacks '%s' or '%s'", name, st, st ? err.msg : "", needle,
           needle2);
    if (st) printf("  %-8s refused: %s\n", name, err.msg);
    checkpoint_close(r);
}

// A MoE model's checkpoint saved at dp 4 with ep 2, ZeRO 0, as the trainer
// writes it (train_ckpt.c save_args): rank 0 (ep rank 0) every tensor with
// rows [0, E F / 2) of the stacked experts, rank 1 (ep rank 1, expert_dp
// rank 0) only rows [E F / 2, E F) of each expert tensor, ranks 2 and 3
// nothing. Blocks of expert tensors other than those refused when relabelled.
static void test_moe_layout(const char *root) {
    static const struct llama_config moe = {
        .vocab_size = 32, .d_model = 8, .n_layers = 2, .n_heads = 2, .n_kv_heads = 2,
        .ffn_dim = 12, .max_seq_len = 16, .rope_theta = 10000, .norm_eps = 1e-5f,
        .moe_experts = 4, .moe_top_k = 2, .moe_ffn_dim = 6};
    char dir[512];
    snprintf(dir, sizeof dir, "%s/moe", root);
    struct error err = {0};
    struct param_info *p;
    int n;
    EXPECT(model_param_table(&moe, &p, &n, &err) == STATUS_OK, "%s", err.msg);
    static float zeros[32 * 8]; // the largest tensor: (vocab_size, d_model)
    struct ckpt_save_args a = {.dir = dir, .step = 3, .layout = topology_layout_ep(1, 1, 4, 0, 1, 2),
                               .zero_stage = 0, .model = &moe, .tokenizer_id = ""};
    struct ckpt_file_sum sums[4];
    EXPECT(checkpoint_prepare(&a, &err) == STATUS_OK, "%s", err.msg);
    struct ckpt_piece *pieces = xcalloc(3 * (size_t)n, sizeof *pieces);
    static const char *prefixes[3] = {"param", "adam_m", "adam_v"};
    int experts = 0;
    for (int rank = 0; rank < 4; rank++) {
        int k = 0, e = rank; // ep rank of world ranks 0 and 1
        for (int i = 0; rank < 2 && i < n; i++) {
            if (rank == 1 && !p[i].expert) continue;
            experts += rank == 0 && p[i].expert;
            for (int w = 0; w < 3; w++) {
                struct ckpt_piece *q = &pieces[k++];
                memset(q, 0, sizeof *q);
                snprintf(q->name, sizeof q->name, "%s/%s", prefixes[w], p[i].name);
                q->grows = q->rows = p[i].grows, q->gcols = q->cols = p[i].gcols;
                if (p[i].expert) q->rows = p[i].grows / 2, q->row_offset = e * q->rows;
                q->flat_end = (size_t)q->rows * q->cols;
                q->dtype = DTYPE_FP32, q->data = zeros;
            }
        }
        a.rank = rank, a.pieces = pieces, a.n_pieces = k;
        EXPECT(checkpoint_write_rank(&a, &sums[rank], &err) == STATUS_OK, "%s", err.msg);
    }
    EXPECT(experts == 6, "%d expert tensors, expected 3 in each of 2 layers", experts);
    a.rank = 0;
    EXPECT(checkpoint_commit(&a, sums, &err) == STATUS_OK, "%s", err.msg);
    free(pieces), free(p);
    char good[600];
    snprintf(good, sizeof good, "%s/step-000003", dir);
    struct ckpt_reader *r;
    EXPECT(checkpoint_open(good, &r, &err) == STATUS_OK, "%s", err.msg);
    EXPECT(checkpoint_check_layout(r, &err) == STATUS_OK, "ep 2 as saved: %s", err.msg);
    checkpoint_close(r);
    expect_layout_refused(good, "ep1", "sed -i 's/^ep = 2$/ep = 1/' manifest.ini",
                          "manifest.ini: ep = 1, but ",
                          "rank-00000.h5 holds rows [0, 16) of adam_m/model.layers.0.mlp.experts.down_proj.weight "
                          "(32, 6) (blocks of 16 rows: 2 ep shards); ep = 1");
    expect_layout_refused(good, "ep4", "sed -i 's/^ep = 2$/ep = 4/' manifest.ini",
                          "manifest.ini: ep = 4, but ",
                          "(blocks of 16 rows: 2 ep shards); ep = 4 (world 4 = tp 1 x cp 1 x ep 4 x dp_shard 1 x "
                          "dp_replicate 1 x pp 1) gives that file (ep rank 0) rows [0, 8) of the routed experts");
}

int main(void) {
    char root[] = "/tmp/trident-ckpt-model-XXXXXX";
    if (!mkdtemp(root)) TEST_SKIP("cannot make a temporary folder");
    struct backend *be = backend_cpu_init(1);
    struct error err = {0};
    struct ckpt_save_args a = {.dir = root, .step = 4, .layout = topology_layout(TP, PP, DP, 0, 1),
                               .zero_stage = 1, .model = &cfg, .tokenizer_id = ""};
    struct ckpt_file_sum sums[TP * PP * DP];
    EXPECT(checkpoint_prepare(&a, &err) == STATUS_OK, "%s", err.msg);
    int padded = 0;
    for (int s = 0; s < PP; s++)
        for (int t = 0; t < TP; t++) {
            struct model *m = init_model(be, t, TP, s, PP, 11);
            if (!m) return 1;
            int n;
            const struct param_info *p = model_params(m, &n);
            for (int i = 0; i < n; i++) padded += p[i].valid_rows < p[i].rows;
            struct tensor arena = model_param_arena(m); // host on the CPU backend
            float *mom[2] = {moments_of(p, n, arena.numel, 0), moments_of(p, n, arena.numel, 1)};
            struct ckpt_piece *pieces = xmalloc(3 * (size_t)n * sizeof *pieces);
            for (int d = 0; d < DP; d++) {
                size_t lo = arena.numel * d / DP, hi = arena.numel * (d + 1) / DP;
                int k = 0;
                if (d == 0)
                    k += checkpoint_pieces_from_params(p, n, "param", arena.data, DTYPE_FP32, 0,
                                                       SIZE_MAX, pieces);
                // The optimizer of a ZeRO rank holds only its shard: copy it out.
                float *shard[2];
                for (int w = 0; w < 2; w++) {
                    shard[w] = xmalloc((hi - lo) * sizeof(float));
                    memcpy(shard[w], mom[w] + lo, (hi - lo) * sizeof(float));
                }
                k += checkpoint_pieces_from_params(p, n, "adam_m", shard[0], DTYPE_FP32, lo, hi,
                                                   pieces + k);
                k += checkpoint_pieces_from_params(p, n, "adam_v", shard[1], DTYPE_FP32, lo, hi,
                                                   pieces + k);
                struct grid_coord at = {{0}}; // the world rank of (t, d, s): topology's order
                at.at[AXIS_TP] = t, at.at[AXIS_DP_SHARD] = d, at.at[AXIS_PP] = s;
                a.rank = topology_rank_of(&a.layout, at);
                a.pieces = pieces, a.n_pieces = k;
                EXPECT(checkpoint_write_rank(&a, &sums[a.rank], &err) == STATUS_OK, "%s", err.msg);
                free(shard[0]), free(shard[1]);
            }
            free(pieces), free(mom[0]), free(mom[1]);
            model_free(m);
        }
    EXPECT(padded >= 2, "only %d parameters with vocab padding: the test lost its point", padded);
    a.rank = 0;
    EXPECT(checkpoint_commit(&a, sums, &err) == STATUS_OK, "%s", err.msg);

    // Layout B.
    struct ckpt_reader *r;
    char path[CKPT_PATH_MAX];
    EXPECT(checkpoint_resolve(root, RESUME_AUTO, NULL, path, &err) == STATUS_OK, "%s", err.msg);
    if (checkpoint_open(path, &r, &err)) {
        EXPECT(0, "open: %s", err.msg);
        return test_finish("test_checkpoint_model");
    }
    EXPECT(checkpoint_check_model(r, &cfg, "", &err) == STATUS_OK, "%s", err.msg);
    EXPECT(checkpoint_check_layout(r, &err) == STATUS_OK, "layout A as saved: %s", err.msg);
    struct model *m = init_model(be, 0, 1, 0, 1, 999), *ref = init_model(be, 0, 1, 0, 1, 11);
    int n;
    const struct param_info *p = model_params(m, &n);
    struct tensor arena = model_param_arena(m);
    float *mom[2] = {xmalloc(arena.numel * sizeof(float)), xmalloc(arena.numel * sizeof(float))};
    for (size_t e = 0; e < arena.numel; e++) mom[0][e] = mom[1][e] = NAN; // gaps stay NaN
    struct ckpt_piece *pieces = xmalloc(3 * (size_t)n * sizeof *pieces);
    int k = checkpoint_pieces_from_params(p, n, "param", arena.data, DTYPE_FP32, 0, SIZE_MAX, pieces);
    k += checkpoint_pieces_from_params(p, n, "adam_m", mom[0], DTYPE_FP32, 0, SIZE_MAX, pieces + k);
    k += checkpoint_pieces_from_params(p, n, "adam_v", mom[1], DTYPE_FP32, 0, SIZE_MAX, pieces + k);
    EXPECT(k == 3 * n, "%d pieces for %d parameters", k, n);
    EXPECT(checkpoint_read_pieces(r, pieces, k, NULL, &err) == STATUS_OK, "%s", err.msg);
    for (int i = 0; i < n; i++) {
        double *got = xmalloc(p[i].numel * sizeof *got), *want = xmalloc(p[i].numel * sizeof *want);
        model_get_param(m, &p[i], got);
        model_get_param(ref, model_find_param(ref, p[i].name), want);
        int bad = 0;
        for (size_t e = 0; e < p[i].numel; e++) bad += got[e] != want[e];
        for (int which = 0; which < 2; which++)
            for (int row = 0; row < p[i].valid_rows; row++)
                for (int c = 0; c < p[i].cols; c++)
                    bad += mom[which][p[i].offset + (size_t)row * p[i].cols + c] !=
                           moment(p[i].name, which, row, c);
        EXPECT(!bad, "%s: %d values differ after resharding (2,2,2) -> (1,1,1)", p[i].name, bad);
        free(got), free(want);
    }
    // Layout B with ZeRO over 3 DP ranks: each reads only its shard of m.
    for (int d = 0; d < 3; d++) {
        size_t lo = arena.numel * d / 3, hi = arena.numel * (d + 1) / 3;
        float *shard = xmalloc((hi - lo) * sizeof *shard);
        for (size_t e = 0; e < hi - lo; e++) shard[e] = NAN;
        int ks = checkpoint_pieces_from_params(p, n, "adam_m", shard, DTYPE_FP32, lo, hi, pieces);
        EXPECT(checkpoint_read_pieces(r, pieces, ks, NULL, &err) == STATUS_OK, "%s", err.msg);
        int bad = 0, checked = 0;
        for (size_t e = lo; e < hi; e++) {
            float want = mom[0][e]; // the full read above, checked against the closed form
            if (isnan(want)) continue; // alignment gap or padding
            checked++;
            bad += shard[e - lo] != want;
        }
        EXPECT(!bad && checked > 0, "ZeRO shard %d of 3: %d of %d differ", d, bad, checked);
        free(shard);
    }
    free(pieces), free(mom[0]), free(mom[1]);
    checkpoint_close(r);
    model_free(m), model_free(ref);
    // Layout A relabelled: tp 1 x dp 4 (world 8 still), pp 4 x dp 1; a ninth rank file.
    expect_layout_refused(path, "tp1", "sed -i 's/^tp = 2$/tp = 1/; s/^dp = 2$/dp = 4/; "
                          "s/^dp_shard = 2$/dp_shard = 4/' manifest.ini", "manifest.ini: tp = 1, but ",
                          "rank-00000.h5 holds rows [0, 8) of adam_m/model.layers.0.self_attn.q_proj.weight (16, 16) "
                          "(blocks of 8 rows: 2 tp shards); tp = 1");
    expect_layout_refused(path, "pp4", "sed -i 's/^pp = 2$/pp = 4/; s/^dp = 2$/dp = 1/; "
                          "s/^dp_shard = 2$/dp_shard = 1/' manifest.ini", "manifest.ini: pp = 4, but layer 0's",
                          "which world 8 = tp 2 x cp 1 x ep 1 x dp_shard 1 x dp_replicate 1 x pp 4 makes stages 0 and 1");
    expect_layout_refused(path, "ranks9", "cp rank-00007.h5 rank-00008.h5", "manifest.ini: world_size = 8",
                          "also holds rank-00008.h5");
    // A truncated rank file: the manifest alone still reads.
    char cmd[4 * CKPT_PATH_MAX], cut[CKPT_PATH_MAX + 8];
    snprintf(cut, sizeof cut, "%s-cut", path);
    snprintf(cmd, sizeof cmd, "cp -r %s %s && truncate -s 1000 %s/rank-00003.h5", path, cut, cut);
    run(cmd);
    struct ckpt_info in;
    EXPECT(checkpoint_open(cut, &r, &err) == STATUS_BAD_INPUT && strstr(err.msg, "rank-00003.h5: 1000 bytes"),
           "truncated: %s", err.msg);
    EXPECT(checkpoint_read_manifest(cut, &in, &err) == STATUS_OK && in.step == 4 && in.world_size == 8 &&
               in.layout.size[AXIS_TP] == 2 && in.layout.size[AXIS_PP] == 2 && in.model.d_model == 16,
           "the manifest of a truncated checkpoint: %s", err.msg);
    test_moe_layout(root);
    backend_free(be);
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (!test_failures && system(cmd)) return 1;
    return test_finish("test_checkpoint_model");
}
