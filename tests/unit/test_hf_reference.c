// test_hf_reference.c: Hugging Face folders read by src/ckpt/hf.c against
// transformers. The fixtures tests/reference/fixtures/llama_tiny_{untied,tied}.h5
// (tests/reference/llama_reference.py: LlamaForCausalLM, GQA 4 heads over 2
// key/value heads) hold HF-named weights and transformers' logits. This test
// writes each fixture's weights as an HF folder (config.json with the keys
// LlamaConfig saves, model.safetensors in F32, and a second folder sharded
// into 3 files with model.safetensors.index.json, in BF16 for the F32-exact
// check of widening), opens it with hf_open, loads every parameter through
// hf_read_piece into a model and requires fp32 logits within 1e-5 of
// transformers' (the BF16 folder: every value equal to the bf16 rounding).
// Partial reads: random blocks and flat ranges equal the same elements of the
// whole tensor. Refusals: a config.json differing from the run's model names
// the key and both values; a folder missing a tensor, holding one of a wrong
// shape, or with a bad architecture is refused naming it.
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llama_fixture.h"

#include "ckpt/hf.h"
#include "kernels/cpu/half.h"
#include "model/model.h"
#include "test.h"

#define FIXTURES "tests/reference/fixtures/"

static char dir[] = "/tmp/test_hf_reference.XXXXXX";

static void write_config(const char *folder, const struct llama_config *c, const char *arch) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", folder);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"attention_bias\": false,\n"
            "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n"
            "  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n"
            "  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n"
            "  \"max_position_embeddings\": %d,\n  \"mlp_bias\": false,\n"
            "  \"model_type\": \"llama\",\n  \"num_attention_heads\": %d,\n"
            "  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n"
            "  \"pretraining_tp\": 1,\n  \"rms_norm_eps\": %.9g,\n  \"rope_scaling\": null,\n"
            "  \"rope_theta\": %.1f,\n  \"tie_word_embeddings\": %s,\n"
            "  \"torch_dtype\": \"float32\",\n  \"transformers_version\": \"4.57.1\",\n"
            "  \"use_cache\": true,\n  \"vocab_size\": %d\n}\n",
            arch, c->d_model / c->n_heads, c->d_model, c->ffn_dim, c->max_seq_len, c->n_heads,
            c->n_layers, c->n_kv_heads, (double)c->norm_eps, c->rope_theta,
            c->tie_embeddings ? "true" : "false", c->vocab_size);
    fclose(f);
}

struct weights {
    int n;
    char names[64][128];
    int rows[64], cols[64];
    float *w[64];
};

static void read_fixture_weights(hid_t f, const struct model *m, struct weights *W) {
    int n;
    const struct param_info *p = model_params((struct model *)m, &n);
    W->n = n;
    for (int i = 0; i < n; i++) {
        char path[160];
        snprintf(path, sizeof path, "/weights/%s", p[i].name);
        struct h5fixture_shape shape;
        double *w = h5fixture_read_f64(f, path, &shape);
        snprintf(W->names[i], sizeof W->names[i], "%s", p[i].name);
        W->rows[i] = p[i].grows, W->cols[i] = p[i].gcols;
        W->w[i] = malloc(shape.numel * sizeof(float));
        for (size_t k = 0; k < shape.numel; k++) W->w[i][k] = (float)w[k];
        free(w);
    }
}

// Writes W into folder: one F32 file, or n_files BF16 files with an index.
static void write_folder(const char *folder, const struct weights *W, int n_files) {
    mkdir(folder, 0777);
    json_t *map = json_object();
    uint64_t total = 0;
    for (int s = 0; s < n_files; s++) {
        struct safetensors_entry e[64];
        uint16_t *bf[64] = {0};
        int m = 0;
        char name[64], path[512];
        if (n_files == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_files);
        for (int i = s; i < W->n; i += n_files) {
            size_t numel = (size_t)W->rows[i] * W->cols[i];
            e[m] = (struct safetensors_entry){.name = W->names[i], .dtype = DTYPE_FP32,
                                              .ndim = W->cols[i] == 1 ? 1 : 2,
                                              .shape = {W->rows[i], W->cols[i]}, .data = W->w[i]};
            if (n_files > 1) {
                bf[m] = malloc(numel * 2);
                for (size_t k = 0; k < numel; k++) bf[m][k] = bf16_from_f32(W->w[i][k]);
                e[m].dtype = DTYPE_BF16, e[m].data = bf[m];
            }
            total += numel * (n_files > 1 ? 2 : 4);
            json_object_set_new(map, W->names[i], json_string(name));
            m++;
        }
        snprintf(path, sizeof path, "%s/%s", folder, name);
        const char *meta[] = {"format", "pt"};
        struct error err;
        EXPECT(safetensors_write(path, e, m, meta, 1, &err) == STATUS_OK, "write %s", path);
        for (int i = 0; i < m; i++) free(bf[i]);
    }
    if (n_files > 1) {
        char path[512];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", folder);
        json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                                "weight_map", map);
        json_dump_file(idx, path, JSON_INDENT(2));
        json_decref(idx);
    } else {
        json_decref(map);
    }
}

static void check_logits(hid_t f, const struct llama_config *cfg, const char *folder,
                         int B, int T, bool bf16, const struct weights *W) {
    struct backend *be = backend_cpu_init(2);
    struct model_shard shard = model_shard_full(cfg);
    struct model *m;
    struct error err = {0};
    if (model_init(&m, be, cfg, &shard, DTYPE_FP32, B, T, 99, &err)) {
        fprintf(stderr, "model_init: %s\n", err.msg);
        exit(1);
    }
    struct hf_model *h;
    EXPECT(hf_open(folder, NULL, &h, &err) == STATUS_OK, "hf_open %s: %s", folder, err.msg);
    if (!h) return;
    EXPECT(hf_check_model(h, cfg, &err) == STATUS_OK, "hf_check_model: %s", err.msg);
    int n;
    const struct param_info *p = model_params(m, &n);
    for (int i = 0; i < n; i++) {
        struct ckpt_piece want = {.grows = p[i].grows, .gcols = p[i].gcols, .rows = p[i].grows,
                                  .cols = p[i].gcols, .flat_end = (size_t)p[i].grows * p[i].gcols,
                                  .dtype = DTYPE_FP32};
        snprintf(want.name, sizeof want.name, "param/%s", p[i].name);
        float *buf = malloc(want.flat_end * sizeof(float));
        want.data = buf;
        EXPECT(hf_read_piece(h, &want, &err) == STATUS_OK, "read %s: %s", p[i].name, err.msg);
        bool same = true;
        for (size_t k = 0; k < want.flat_end; k++) {
            float ref = bf16 ? bf16_to_f32(bf16_from_f32(W->w[i][k])) : W->w[i][k];
            same = same && buf[k] == ref;
        }
        EXPECT(same, "%s %s: values differ from the fixture", folder, p[i].name);
        // Random blocks and flat ranges against the whole tensor.
        for (int trial = 0; trial < 4; trial++) {
            struct ckpt_piece part = want;
            part.row_offset = rand() % p[i].grows;
            part.rows = 1 + rand() % (p[i].grows - part.row_offset);
            part.col_offset = rand() % p[i].gcols;
            part.cols = 1 + rand() % (p[i].gcols - part.col_offset);
            size_t numel = (size_t)part.rows * part.cols;
            part.flat_begin = rand() % numel;
            part.flat_end = part.flat_begin + 1 + rand() % (numel - part.flat_begin);
            float *pb = malloc((part.flat_end - part.flat_begin) * sizeof(float));
            part.data = pb;
            EXPECT(hf_read_piece(h, &part, &err) == STATUS_OK, "partial %s: %s", p[i].name, err.msg);
            bool ok = true;
            for (size_t k = part.flat_begin; k < part.flat_end; k++) {
                size_t r = part.row_offset + k / part.cols, c = part.col_offset + k % part.cols;
                ok = ok && pb[k - part.flat_begin] == buf[r * p[i].gcols + c];
            }
            EXPECT(ok, "%s: block (%d+%d, %d+%d) range [%zu, %zu) differs", p[i].name,
                   part.row_offset, part.rows, part.col_offset, part.cols, part.flat_begin,
                   part.flat_end);
            free(pb);
        }
        model_set_param(m, &p[i], buf);
        free(buf);
    }
    if (!bf16) {
        struct h5fixture_shape shape;
        int32_t *tokens = h5fixture_read_i32(f, "/inputs/tokens", &shape);
        int32_t *targets = h5fixture_read_i32(f, "/inputs/targets", &shape);
        double loss;
        long count;
        model_forward(m, tokens, targets, &loss, &count);
        double *ref = h5fixture_read_f64(f, "/forward/logits", &shape);
        double *got = malloc(shape.numel * sizeof *got);
        model_get_logits(m, got);
        char what[600];
        snprintf(what, sizeof what, "%s: fp32 logits vs transformers", folder);
        EXPECT_REL(shape.numel, got, ref, 1e-5, what);
        printf("%s: fp32 logits relative error %.2e vs transformers\n", folder,
               REL_ERR(shape.numel, got, ref));
        free(tokens), free(targets), free(ref), free(got);
    }
    // A run of another model is refused, naming the key and both values.
    struct llama_config other = *cfg;
    other.n_kv_heads = cfg->n_heads;
    EXPECT(hf_check_model(h, &other, &err) == STATUS_BAD_INPUT &&
           strstr(err.msg, "num_key_value_heads = 2") && strstr(err.msg, "n_kv_heads = 4") &&
           strstr(err.msg, "config.json"), "n_kv_heads mismatch: %s", err.msg);
    other = *cfg;
    other.rope_theta = 500000;
    EXPECT(hf_check_model(h, &other, &err) == STATUS_BAD_INPUT && strstr(err.msg, "rope_theta"),
           "rope_theta mismatch: %s", err.msg);
    hf_close(h);
    model_free(m);
    backend_free(be);
}

static void expect_refused(const char *folder, const char *needle) {
    struct hf_model *h = (void *)1;
    struct error err = {0};
    EXPECT(hf_open(folder, NULL, &h, &err) == STATUS_BAD_INPUT && h == NULL, "%s: opened", folder);
    EXPECT(strstr(err.msg, needle) != NULL, "%s: no '%s' in: %s", folder, needle, err.msg);
}

static void run_fixture(const char *path, const char *tag) {
    hid_t f = h5fixture_open(path);
    struct llama_config cfg = llama_fixture_config(f);
    int B = (int)h5fixture_attr_f64(f, "/", "batch"), T = (int)h5fixture_attr_f64(f, "/", "seq_len");
    // The weights in parameter-table order (a throwaway model gives the names).
    struct backend *be = backend_cpu_init(1);
    struct model_shard shard = model_shard_full(&cfg);
    struct model *m;
    struct error err;
    if (model_init(&m, be, &cfg, &shard, DTYPE_FP32, 1, T, 1, &err)) exit(1);
    struct weights W;
    read_fixture_weights(f, m, &W);
    model_free(m);
    backend_free(be);

    char folder[300];
    snprintf(folder, sizeof folder, "%s/%s", dir, tag);
    write_folder(folder, &W, 1);
    write_config(folder, &cfg, "LlamaForCausalLM");
    check_logits(f, &cfg, folder, B, T, false, &W);
    snprintf(folder, sizeof folder, "%s/%s-bf16-sharded", dir, tag);
    write_folder(folder, &W, 3);
    write_config(folder, &cfg, "LlamaForCausalLM");
    check_logits(f, &cfg, folder, B, T, true, &W);

    // Refusals: a missing tensor, a wrong shape, another architecture.
    struct weights bad = W;
    bad.n = W.n - 1; // drops the last parameter
    snprintf(folder, sizeof folder, "%s/%s-missing", dir, tag);
    write_folder(folder, &bad, 1);
    write_config(folder, &cfg, "LlamaForCausalLM");
    expect_refused(folder, "tensors LlamaForCausalLM needs");
    bad = W;
    bad.rows[0] = 1; // a (1, C) slice of the first tensor
    bad.cols[0] = W.cols[0];
    snprintf(folder, sizeof folder, "%s/%s-shape", dir, tag);
    write_folder(folder, &bad, 1);
    write_config(folder, &cfg, "LlamaForCausalLM");
    expect_refused(folder, W.names[0]);
    snprintf(folder, sizeof folder, "%s/%s-arch", dir, tag);
    write_folder(folder, &W, 1);
    write_config(folder, &cfg, "MistralForCausalLM");
    expect_refused(folder, "MistralForCausalLM");
    for (int i = 0; i < W.n; i++) free(W.w[i]);
    h5fixture_close(f);
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    srand(7);
    run_fixture(FIXTURES "llama_tiny_untied.h5", "untied");
    run_fixture(FIXTURES "llama_tiny_tied.h5", "tied");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", dir);
    return test_finish("test_hf_reference");
}
