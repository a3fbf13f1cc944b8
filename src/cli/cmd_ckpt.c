// cmd_ckpt.c: `trident ckpt info DIR`, `trident ckpt verify DIR` and
// `trident ckpt export DIR OUT.h5` and `trident ckpt export DIR OUT --format hf
// [--dtype fp32|bf16|fp16] [--max-shard-size BYTES] [--tokenizer PATH]
// [--chat-template T]` (a
// Hugging Face LlamaForCausalLM folder, src/ckpt/hf.h; PATH is a dataset
// folder holding tokenizer.json or the file itself, and must be the
// tokenizer the checkpoint records; without it, cli_checkpoint_tokenizer's
// file when there is one; tokenizer_config.json's chat_template is T's Jinja
// text, default cli_chat_template_of the tokenizer), and `trident ckpt logits DIR --tokens
// IDS.txt --out LOGITS.safetensors` (the model's logits of given token
// sequences, for checks against other implementations). DIR is a checkpoint
// folder (step-NNNNNN) or a [checkpoint] dir holding `latest` (logits: or a
// Hugging Face folder). All validate the whole checkpoint (checkpoint_open)
// and exit 2 on a bad one (info first prints what the manifest says, when it
// reads: checkpoint_read_manifest); info and verify also check the
// manifest's layout against the rank files (checkpoint_check_layout), and
// verify reads every value and exits 2 naming each tensor that holds a NaN
// or an infinity.
#include <errno.h>
#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/h5util.h"
#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "data/chat.h"
#include "model/optimizer.h"
#include "cli.h"
#include "cli_flags.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "train/generate.h"
#include "train/train_state.h"

// What the manifest says: step, layout (in the words of the trainer's start
// line, topology_layout_line), model and tokenizer.
static void print_manifest(const struct ckpt_info *in) {
    const struct llama_config *m = &in->model;
    printf("checkpoint %s\n", in->path);
    printf("  format_version %d, step %lld\n", in->format_version, (long long)in->step);
    char grid[256];
    printf("  layout %s, zero_stage %d\n", topology_layout_line(&in->layout, grid, sizeof grid),
           in->zero_stage);
    printf("  model vocab_size=%d d_model=%d n_layers=%d n_heads=%d n_kv_heads=%d ffn_dim=%d "
           "tie_embeddings=%d\n", m->vocab_size, m->d_model, m->n_layers, m->n_heads,
           m->n_kv_heads, m->ffn_dim, m->tie_embeddings ? 1 : 0);
    printf("  head_dim=%d qkv_bias=%d qk_norm=%d rope_scaling=%s\n", llama_head_dim(m),
           m->qkv_bias ? 1 : 0, m->qk_norm ? 1 : 0, ckpt_rope_scaling_name(m->rope_scaling.type));
    if (m->moe_experts)
        printf("  moe_experts=%d moe_top_k=%d moe_ffn_dim=%d moe_shared_experts=%d "
               "moe_shared_ffn_dim=%d moe_shared_gate=%d moe_norm_topk=%d moe_first_dense_layers=%d\n",
               m->moe_experts, m->moe_top_k, m->moe_ffn_dim, m->moe_shared_experts,
               m->moe_shared_ffn_dim, m->moe_shared_gate ? 1 : 0, m->moe_norm_topk ? 1 : 0,
               m->moe_first_dense_layers);
    printf("  tokenizer %s\n", in->tokenizer_id[0] ? in->tokenizer_id : "(none)");
    if (in->weights_only)
        printf("  weights only (use as model.init_from): no optimizer state, not a checkpoint to resume\n");
}

static void print_info(const struct ckpt_reader *r) {
    print_manifest(checkpoint_info(r));
    printf("  %-60s %-12s %-5s %6s %12s\n", "tensor", "shape", "dtype", "pieces", "bytes");
    int n = checkpoint_n_pieces(r);
    size_t total = 0;
    for (int i = 0, j; i < n; i = j) {
        const struct ckpt_piece *p = checkpoint_piece_at(r, i, NULL);
        size_t bytes = 0;
        for (j = i; j < n; j++) {
            const struct ckpt_piece *q = checkpoint_piece_at(r, j, NULL);
            if (strcmp(q->name, p->name)) break;
            bytes += (q->flat_end - q->flat_begin) * dtype_size(q->dtype);
        }
        char shape[32];
        snprintf(shape, sizeof shape, "(%d, %d)", p->grows, p->gcols);
        printf("  %-60s %-12s %-5s %6d %12zu\n", p->name, shape, dtype_name(p->dtype), j - i,
               bytes);
        total += bytes;
    }
    printf("  total stored %.3f MB in %d pieces\n", total / 1e6, n);
}

// Writes every parameter as one whole float32 dataset named by its Hugging
// Face name (model.layers.0.mlp.up_proj.weight, ...), reassembled from the
// shards of whatever layout saved it: the weights of LlamaForCausalLM.
static enum status export_params(struct ckpt_reader *r, const char *out, struct error *err) {
    if (access(out, F_OK) == 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: exists; export writes a new file (remove it "
                         "or choose another name)", out);
    hid_t fapl = h5util_fapl();
    hid_t f = H5Fcreate(out, H5F_ACC_EXCL, H5P_DEFAULT, fapl);
    h5util_fapl_close(fapl);
    if (f < 0) return error_set(err, STATUS_BAD_INPUT, "%s: cannot create the HDF5 file", out);
    enum status st = STATUS_OK;
    int n = checkpoint_n_pieces(r), written = 0;
    for (int i = 0; i < n && !st; i++) {
        const struct ckpt_piece *p = checkpoint_piece_at(r, i, NULL);
        if (strncmp(p->name, "param/", 6)) continue;
        if (i > 0 && !strcmp(checkpoint_piece_at(r, i - 1, NULL)->name, p->name)) continue;
        struct ckpt_piece want = *p;
        want.row_offset = want.col_offset = 0, want.rows = p->grows, want.cols = p->gcols;
        want.flat_begin = 0, want.flat_end = (size_t)p->grows * p->gcols, want.dtype = DTYPE_FP32;
        want.data = xmalloc(want.flat_end * sizeof(float));
        st = checkpoint_read_piece(r, &want, err);
        if (!st) {
            hsize_t dims[2] = {(hsize_t)p->grows, (hsize_t)p->gcols};
            hid_t space = H5Screate_simple(p->gcols == 1 ? 1 : 2, dims, NULL);
            hid_t d = H5Dcreate2(f, p->name + 6, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT,
                                 H5P_DEFAULT);
            if (d < 0 || H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, want.data) < 0)
                st = error_set(err, STATUS_RUNTIME, "%s: cannot write %s", out, p->name + 6);
            if (d >= 0) H5Dclose(d);
            H5Sclose(space);
            written++;
        }
        free(want.data);
    }
    if (H5Fclose(f) < 0 && !st) st = error_set(err, STATUS_RUNTIME, "%s: cannot close", out);
    if (!st) printf("exported %d parameter tensors to %s\n", written, out);
    return st;
}

// Reads every stored piece; prints each tensor holding NaNs or infinities
// (its count over all pieces and the first one's place) to stderr. Returns
// the number of such tensors, or -1 on a read error (in err).
static int report_nonfinite(struct ckpt_reader *r, struct error *err) {
    int n = checkpoint_n_pieces(r), bad_tensors = 0;
    for (int i = 0, j; i < n; i = j) { // the pieces of one name are consecutive
        const struct ckpt_piece *p = checkpoint_piece_at(r, i, NULL);
        struct ckpt_nonfinite first = {0};
        size_t count = 0, stored = 0;
        for (j = i; j < n && !strcmp(checkpoint_piece_at(r, j, NULL)->name, p->name); j++) {
            struct ckpt_nonfinite nf;
            if (checkpoint_piece_nonfinite(r, j, &nf, err)) return -1;
            if (nf.count && !count) first = nf;
            count += nf.count;
            const struct ckpt_piece *q = checkpoint_piece_at(r, j, NULL);
            stored += q->flat_end - q->flat_begin;
        }
        if (!count) continue;
        if (!bad_tensors++)
            fprintf(stderr, "trident: ckpt verify: %s holds non-finite values:\n",
                    checkpoint_info(r)->path);
        fprintf(stderr, "  %s (%d, %d): %zu non-finite of %zu stored values, the first %g at "
                "(%d, %d)\n", p->name, p->grows, p->gcols, count, stored, first.value, first.row,
                first.col);
    }
    return bad_tensors;
}

// The command lines of `ckpt info|verify|export|logits` and `import`.
struct ckpt_args {
    const char *dir, *out, *tokenizer, *tokens;
    int format, dtype;
    int chat_template; // 1 + enum chat_template; 0: not given (the tokenizer's dataset's)
    int64_t max_shard_bytes;
};

enum { CKPT_FORMAT_H5, CKPT_FORMAT_HF };
static const struct config_choice ckpt_format_choices[] = {
    {"h5", CKPT_FORMAT_H5}, {"hf", CKPT_FORMAT_HF}, {NULL, 0}};
static const struct config_choice ckpt_dtype_choices[] = {
    {"fp32", DTYPE_FP32}, {"bf16", DTYPE_BF16}, {"fp16", DTYPE_FP16}, {NULL, 0}};
static const struct config_choice ckpt_chat_template_choices[] = {
    {"plain", 1 + CHAT_TEMPLATE_PLAIN}, {"llama3", 1 + CHAT_TEMPLATE_LLAMA3}, {"chatml", 1 + CHAT_TEMPLATE_CHATML},
    {NULL, 0}};

#define C(field) offsetof(struct ckpt_args, field)
#define CKPT_DIR_ROW                                                                                    \
    {"DIR", CLI_PATH, NULL, NULL, 0, 0, 0, NULL,                                                        \
     "a checkpoint folder (step-NNNNNN) or a [checkpoint] dir holding 'latest'; the whole checkpoint is " \
     "validated (exit 2 for a bad one)", C(dir)}
static const struct cli_flag ckpt_dir_flags[] = {CKPT_DIR_ROW};
static const struct cli_flag ckpt_export_flags[] = {
    CKPT_DIR_ROW,
    {"OUT", CLI_PATH, NULL, NULL, 0, 0, 0, NULL, "the HDF5 file (--format h5) or folder (--format hf) to write",
     C(out)},
    {"--format", CLI_ENUM, "F", "h5", 0, 0, 0, ckpt_format_choices,
     "h5: every parameter as a whole float32 tensor named as in Hugging Face LlamaForCausalLM; hf: a folder "
     "transformers' from_pretrained loads (config.json, model.safetensors, tokenizer files)", C(format)},
    {"--dtype", CLI_ENUM, "D", NULL, 0, 0, 0, ckpt_dtype_choices,
     "--format hf: the tensors' dtype; default: the checkpoint's", C(dtype)},
    {"--max-shard-size", CLI_SIZE, "BYTES", NULL, 0, INFINITY, CLI_MIN_EXCLUSIVE | CLI_SIZE_DECIMAL, NULL,
     "--format hf: split the weights into safetensors shards of at most this size (K, M, G: powers of 1000, "
     "as Hugging Face's \"5GB\"); default: one model.safetensors", C(max_shard_bytes)},
    {"--tokenizer", CLI_PATH, "PATH", NULL, 0, 0, 0, NULL,
     "--format hf: a dataset folder holding tokenizer.json or the file itself, which must be the tokenizer "
     "the checkpoint records; default: the tokenizer.json next to the checkpoint (import's) or the one a "
     "run folder's config.ini above it names, as generate finds it", C(tokenizer)},
    {"--chat-template", CLI_ENUM, "T", NULL, 0, 0, CLI_HIDDEN_DEFAULT, ckpt_chat_template_choices,
     "--format hf: the template (prep --chat-template's) written as tokenizer_config.json's chat_template, "
     "so that apply_chat_template gives the training format; default: the one the tokenizer's dataset was "
     "prepared with (its index.ini), else plain", C(chat_template)},
};
static const struct cli_flag ckpt_logits_flags[] = {
    {"DIR", CLI_PATH, NULL, NULL, 0, 0, 0, NULL,
     "a checkpoint folder (step-NNNNNN), a [checkpoint] dir holding 'latest', or a Hugging Face folder",
     C(dir)},
    {"--tokens", CLI_PATH, "IDS.txt", NULL, 0, 0, 0, NULL,
     "one sequence of token ids a line, whitespace-separated, every line of the same length; required",
     C(tokens)},
    {"--out", CLI_PATH, "OUT.safetensors", NULL, 0, 0, 0, NULL,
     "the file to write (refused if it exists); required", C(out)},
};
static const struct cli_flag import_flags[] = {
    {"HF_DIR", CLI_PATH, NULL, NULL, 0, 0, 0, NULL,
     "a Hugging Face LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, "
     "MixtralForCausalLM or Qwen2MoeForCausalLM folder "
     "(config.json, safetensors; every config key read as docs/formats.md's table says); refused (exit 2, nothing written) "
     "for a NaN or an infinity in a tensor, a missing tensor or a bad file", C(dir)},
    {"OUT_DIR", CLI_PATH, NULL, NULL, 0, 0, 0, NULL,
     "a new [checkpoint] dir; gets step-000000 (weights only, FP32, marked so in its manifest) and latest, "
     "for [model] init_from, generate or ckpt export; a resume from it is refused (no optimizer state); "
     "HF_DIR's tokenizer.json is copied to OUT_DIR/tokenizer.json and its bos, pad and eos ids (every id of "
     "an eos_token_id list) written to OUT_DIR/generation_config.json, where generate and ckpt export find them",
     C(out)},
};
#undef CKPT_DIR_ROW
#undef C

const struct cli_command cli_ckpt_info = {
    .name = "ckpt info", .synopsis = "DIR",
    .summary = "Prints a checkpoint's step, layout (as the training start line does), model, tokenizer and\n"
               "tensors; for one that does not open, what its manifest says, then why (exit 2).",
    .flags = ckpt_dir_flags, .n_flags = CLI_N(ckpt_dir_flags)};
const struct cli_command cli_ckpt_verify = {
    .name = "ckpt verify", .synopsis = "DIR",
    .summary = "Reads every value of a checkpoint: checksums, completeness, the manifest's layout against the\n"
               "rank files' blocks, and exit 2 naming each tensor that holds a NaN or an infinity.",
    .flags = ckpt_dir_flags, .n_flags = CLI_N(ckpt_dir_flags)};
const struct cli_command cli_ckpt_export = {
    .name = "ckpt export", .synopsis = "DIR OUT [--format h5 | --format hf [--dtype D] [--max-shard-size BYTES] [--tokenizer PATH] [--chat-template T]]",
    .summary = "Exports a checkpoint's parameters as one HDF5 file or a Hugging Face folder (Llama, Qwen2, Qwen3,\n"
               "Mistral, Mixtral or Qwen2-MoE).",
    .flags = ckpt_export_flags, .n_flags = CLI_N(ckpt_export_flags)};
const struct cli_command cli_ckpt_logits = {
    .name = "ckpt logits", .synopsis = "DIR --tokens IDS.txt --out OUT.safetensors",
    .summary = "The FP32 logits (N, T, V) of the N lines of T token ids of IDS.txt, one forward each on one\n"
               "rank, as the tensor \"logits\" of a safetensors file (for checks against other implementations);\n"
               "a mixture-of-experts model's routing too (moe_topk (N, MoE layers, T, k), moe_aux_loss (N,)).",
    .flags = ckpt_logits_flags, .n_flags = CLI_N(ckpt_logits_flags)};
const struct cli_command cli_import = {
    .name = "import", .synopsis = "HF_DIR OUT_DIR",
    .summary = "A Hugging Face Llama, Qwen2, Qwen3, Mistral, Mixtral or Qwen2-MoE folder as a trident checkpoint\n"
               "(weights only).",
    .flags = import_flags, .n_flags = CLI_N(import_flags)};

// `ckpt export DIR OUT --format hf ...`. Returns the exit code.
static int export_hf(const struct ckpt_args *o) {
    struct hf_export_args a = {.out_dir = o->out, .dtype = o->dtype, .bos_id = -1, .eos_id = -1,
                               .max_shard_bytes = (uint64_t)o->max_shard_bytes, .family = -1};
    const char *tok_path = o->tokenizer;
    struct error err = {0};
    struct ckpt_reader *r;
    if (checkpoint_open(o->dir, &r, &err)) {
        fprintf(stderr, "trident: ckpt export: %s\n", err.msg);
        return err.status;
    }
    char tok_file[4200] = "", searched[4096] = "", *eos_text = NULL;
    struct tokenizer *tok = NULL;
    if (!tok_path) {
        // generate's search: import's copy, or the run folder's [data] tokenizer.
        if (cli_checkpoint_tokenizer(o->dir, searched, sizeof searched)) tok_path = searched;
    }
    if (tok_path) {
        struct stat sb;
        bool dir = stat(tok_path, &sb) == 0 && S_ISDIR(sb.st_mode);
        int n = snprintf(tok_file, sizeof tok_file, "%s%s", tok_path, dir ? "/tokenizer.json" : "");
        if (n < 0 || (size_t)n >= sizeof tok_file)
            error_set(&err, STATUS_BAD_INPUT, "--tokenizer %.64s...: a path of %d bytes, expected under %zu",
                      tok_path, n, sizeof tok_file);
        const char *want = checkpoint_info(r)->tokenizer_id;
        if (!err.status && tokenizer_load(tok_file, &tok, &err) == STATUS_OK && want[0] &&
            strcmp(tokenizer_identity(tok), want))
            error_set(&err, STATUS_BAD_INPUT, "%s: tokenizer %s, the checkpoint was trained "
                      "with %s", tok_file, tokenizer_identity(tok), want);
        int t = o->chat_template ? o->chat_template - 1 : CHAT_TEMPLATE_PLAIN;
        if (!err.status && !o->chat_template) t = cli_chat_template_of(tok_file);
        if (!err.status && t != CHAT_TEMPLATE_PLAIN) chat_template_check(tok, t, &err);
        if (!err.status) {
            a.eos_id = a.bos_id = tokenizer_eot_id(tok);
            // A chat model ends its turn with the template's end token (trained
            // on; the end-of-text id after it is not): generate stops there, as
            // Llama 3.1 Instruct's (<|eot_id|>) and Qwen2.5 Instruct's (<|im_end|>)
            // folders say.
            const char *end = chat_template_end_token(t);
            int32_t *e = NULL;
            size_t k = 0;
            if (end && tokenizer_encode(tok, end, strlen(end), 1, &e, &k, &err) == STATUS_OK && k == 1)
                a.eos_id = a.bos_id = e[0];
            free(e);
            size_t len;
            if (a.eos_id >= 0 && tokenizer_decode(tok, &a.eos_id, 1, &eos_text, &len, &err) == STATUS_OK)
                a.eos_token = eos_text;
            a.tokenizer_json = tok_file;
            a.chat_template = chat_template_jinja(t);
        }
    }
    // The ids `trident import` kept next to the checkpoint (every eos id of
    // the source folder) before the tokenizer's end-of-text.
    struct hf_meta meta = {.bos_id = -1, .pad_id = -1};
    bool found = false;
    for (int up = 0; up <= 1 && !found && !err.status; up++) {
        char gc[4200];
        snprintf(gc, sizeof gc, "%s%s/generation_config.json", o->dir, up ? "/.." : "");
        hf_read_generation_config(gc, checkpoint_info(r)->model.vocab_size, &meta, &found, &err);
    }
    if (found) a.meta = &meta;
    if (!err.status) hf_export(r, &a, &err);
    free(eos_text);
    if (tok) tokenizer_free(tok);
    checkpoint_close(r);
    if (err.status) {
        fprintf(stderr, "trident: ckpt export: %s\n", err.msg);
        return err.status;
    }
    printf("exported %s as a Hugging Face folder %s%s\n", o->dir, o->out,
           tok_path ? "" : " (note: no tokenizer, none next to the checkpoint or named by a run "
                           "folder's config.ini above it: no tokenizer.json, bos/eos ids null; "
                           "--tokenizer DATASET_DIR adds it)");
    return STATUS_OK;
}

// Reads IDS.txt of `ckpt logits`: one sequence a line, whitespace-separated
// decimal ids in [0, V), every line of the same length T in [1, max_T]
// (blank lines skipped). *ids: (*n_seq, *T) xmalloc'd. Errors:
// STATUS_BAD_INPUT naming the file and line.
static enum status read_token_lines(const char *path, int V, int max_T, int32_t **ids, int *n_seq,
                                    int *T, struct error *err) {
    FILE *f = fopen(path, "r");
    if (!f) return error_set(err, STATUS_BAD_INPUT, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 0, n = 0;
    int32_t *all = NULL;
    char *line = NULL;
    size_t line_cap = 0;
    int lineno = 0, rows = 0, width = -1;
    enum status st = STATUS_OK;
    while (!st && getline(&line, &line_cap, f) >= 0) {
        lineno++;
        int count = 0;
        for (char *p = line, *end;; p = end) {
            while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
            if (!*p) break;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v >= V || (*end && !strchr(" \t\r\n", *end))) {
                int len = (int)MIN(strcspn(p, " \t\r\n"), 20);
                st = error_set(err, STATUS_BAD_INPUT, "%s:%d: '%.*s' is not a token id in [0, %d)",
                               path, lineno, len, p, V);
                break;
            }
            if (n == cap) {
                all = realloc(all, (cap = cap ? 2 * cap : 1024) * sizeof *all);
                CHECK(all, "out of memory for %zu token ids", cap);
            }
            all[n++] = (int32_t)v, count++;
        }
        if (st || count == 0) continue;
        if (width < 0) width = count;
        if (count != width)
            st = error_set(err, STATUS_BAD_INPUT, "%s:%d: %d ids, the first line has %d (every "
                           "sequence must have the same length)", path, lineno, count, width);
        else if (count > max_T)
            st = error_set(err, STATUS_BAD_INPUT, "%s:%d: %d ids, more than the model's "
                           "max_seq_len %d", path, lineno, count, max_T);
        rows++;
    }
    free(line);
    fclose(f);
    if (!st && rows == 0) st = error_set(err, STATUS_BAD_INPUT, "%s: no token ids", path);
    if (st) {
        free(all);
        return st;
    }
    *ids = all, *n_seq = rows, *T = width;
    return STATUS_OK;
}

// `ckpt logits DIR --tokens IDS.txt --out OUT.safetensors`: the FP32 model of
// a checkpoint (any layout, reassembled) or a Hugging Face folder (config.json
// present) on one rank, the CPU backend; one forward per sequence, no KV
// cache (position t's logits depend on ids <= t only). Writes the tensor
// "logits" (N, T, V) F32, exactly the model's FP32 logits (the values
// model_get_logits_at widens to double), with __metadata__ format "trident-logits",
// version "1" and source DIR. Returns the exit code.
static int logits_cmd(const struct ckpt_args *o) {
    const char *tokens_path = o->tokens, *out = o->out;
    if (!tokens_path || !out) {
        fprintf(stderr, "trident: ckpt logits: --tokens IDS.txt and --out OUT.safetensors are both needed\n");
        return STATUS_BAD_INPUT;
    }
    struct error err = {0};
    if (access(out, F_OK) == 0) {
        fprintf(stderr, "trident: ckpt logits: %s: exists (remove it or choose another name)\n", out);
        return STATUS_BAD_INPUT;
    }
    // The weights whole on one rank: generate's loader (src/train/generate.h).
    struct generator g;
    int32_t *ids = NULL;
    int N = 0, T = 0, V = 0;
    float *logits = NULL;
    if (generator_open(o->dir, &g, &err)) {
        fprintf(stderr, "trident: ckpt logits: %s\n", err.msg);
        return err.status;
    }
    V = g.lc.vocab_size;
    if (read_token_lines(tokens_path, V, g.lc.max_seq_len, &ids, &N, &T, &err) ||
        generator_load(&g, T, 0, &err))
        goto done;
    struct model *m = g.m;
    logits = xmalloc((size_t)N * T * V * sizeof *logits);
    int32_t *targets = xmalloc((size_t)T * sizeof *targets);
    double *row = xmalloc((size_t)V * sizeof *row);
    for (int t = 0; t < T; t++) targets[t] = IGNORE_INDEX;
    // A mixture-of-experts model's routing too: each MoE layer's top-k
    // experts of every token, and the load-balancing loss of each sequence
    // (moe_aux_loss_layers over its MoE layers, taken after a backward).
    const int *moe_layers;
    int n_moe = g.lc.moe_experts ? model_moe_layers(m, &moe_layers) : 0, k = g.lc.moe_top_k;
    int32_t *topk = n_moe ? xmalloc((size_t)N * n_moe * T * k * sizeof *topk) : NULL;
    double *aux = n_moe ? xmalloc((size_t)N * sizeof *aux) : NULL;
    double *stats = n_moe ? xmalloc(model_moe_stats_numel(m) * sizeof *stats) : NULL;
    for (int s = 0; s < N; s++) {
        double loss;
        long count;
        model_forward(m, ids + (size_t)s * T, targets, &loss, &count);
        for (int t = 0; t < T; t++) {
            model_get_logits_at(m, 0, t, row);
            float *dst = logits + ((size_t)s * T + t) * V;
            for (int j = 0; j < V; j++) dst[j] = (float)row[j]; // FP32 values: exact
        }
        for (int b = 0; b < n_moe; b++) // one rank: local block b is layer moe_layers[b]
            model_moe_topk(m, 0, moe_layers[b], topk + ((size_t)s * n_moe + b) * T * k);
        if (n_moe) {
            model_zero_grad(m);
            model_backward(m, 1.0); // every target ignored: only the routing statistics
            model_moe_stats_take(m, stats);
            aux[s] = stats[1];
        }
    }
    free(targets), free(row), free(stats);
    struct safetensors_entry e[3] = {
        {.name = "logits", .dtype = DTYPE_FP32, .ndim = 3, .shape = {N, T, V}, .data = logits},
        {.name = "moe_topk", .dtype = DTYPE_I32, .ndim = 4, .shape = {N, n_moe, T, k}, .data = topk},
        {.name = "moe_aux_loss", .dtype = DTYPE_FP64, .ndim = 1, .shape = {N}, .data = aux}};
    char coeff[32];
    snprintf(coeff, sizeof coeff, "%.17g", g.lc.moe_aux_loss_coeff);
    const char *meta[] = {"format", "trident-logits", "version", "1", "source", o->dir,
                          "moe_aux_loss_coeff", coeff};
    safetensors_write(out, e, n_moe ? 3 : 1, meta, n_moe ? 4 : 3, &err);
    free(topk), free(aux);
done:
    generator_close(&g);
    free(ids), free(logits);
    if (err.status) {
        fprintf(stderr, "trident: ckpt logits: %s\n", err.msg);
        return err.status;
    }
    printf("wrote the logits (%d, %d, %d) of %s to %s\n", N, T, V, o->dir, out);
    return STATUS_OK;
}

int cmd_ckpt(int argc, char **argv) {
    static const struct cli_command *subs[] = {&cli_ckpt_info, &cli_ckpt_verify, &cli_ckpt_export,
                                               &cli_ckpt_logits};
    if (cli_is_help(argc, argv)) {
        for (int k = 0; k < 4; k++) {
            if (k) putchar('\n');
            cli_print_help(subs[k], stdout);
        }
        return STATUS_OK;
    }
    const struct cli_command *cmd = NULL;
    for (int k = 0; k < 4 && argc >= 2; k++)
        if (!strcmp(argv[1], subs[k]->name + 5)) cmd = subs[k]; // after "ckpt "
    if (!cmd) {
        fprintf(stderr, "trident ckpt: %s%s%s: expected info, verify, export or logits\n"
                "(trident ckpt --help for usage)\n", argc >= 2 ? "'" : "", argc >= 2 ? argv[1] : "no command",
                argc >= 2 ? "'" : "");
        return STATUS_BAD_INPUT;
    }
    struct ckpt_args o = {.dtype = -1};
    struct error err = {0};
    if (cli_parse(cmd, argc - 1, argv + 1, &o, &err)) {
        fprintf(stderr, "trident: %s: %s\n(trident ckpt --help for usage)\n", cmd->name, err.msg);
        return err.status;
    }
    bool export = cmd == &cli_ckpt_export;
    if (cmd == &cli_ckpt_logits) return logits_cmd(&o);
    if (export && o.format == CKPT_FORMAT_HF) return export_hf(&o);
    if (export && (o.dtype >= 0 || o.max_shard_bytes || o.tokenizer)) {
        fprintf(stderr, "trident: ckpt export: --dtype, --max-shard-size and --tokenizer are options of "
                "--format hf, not of the HDF5 export\n");
        return STATUS_BAD_INPUT;
    }
    if (export && o.chat_template) {
        fprintf(stderr, "trident: ckpt export: --chat-template is an option of --format hf (its "
                "tokenizer_config.json), not of the HDF5 export\n");
        return STATUS_BAD_INPUT;
    }
    struct ckpt_reader *r;
    if (checkpoint_open(o.dir, &r, &err)) {
        // info: what the manifest says, when it can be read, before the
        // reason (a truncated rank file printed nothing of the layout).
        struct ckpt_info in;
        struct error merr = {0};
        if (cmd == &cli_ckpt_info && checkpoint_read_manifest(o.dir, &in, &merr) == STATUS_OK) {
            print_manifest(&in);
            printf("  tensors: not listed, the checkpoint does not open (below)\n");
            fflush(stdout);
        }
        fprintf(stderr, "trident: %s: %s\n", cmd->name, err.msg);
        return err.status;
    }
    if (export) {
        if (export_params(r, o.out, &err)) {
            fprintf(stderr, "trident: ckpt export: %s\n", err.msg);
            checkpoint_close(r);
            return err.status;
        }
    } else if (cmd == &cli_ckpt_info) {
        print_info(r);
        if (checkpoint_check_layout(r, &err)) { // after what the files hold, which it names
            fflush(stdout);
            fprintf(stderr, "trident: ckpt info: %s\n", err.msg);
            checkpoint_close(r);
            return err.status;
        }
    } else {
        const struct ckpt_info *in = checkpoint_info(r);
        // Every rank file's /state first, judged by its owners (before any
        // tensor is read, as checkpoint_open once read it).
        if (trainer_state_verify(r, &err)) {
            fprintf(stderr, "trident: ckpt verify: %s\n", err.msg);
            checkpoint_close(r);
            return err.status;
        }
        int bad = report_nonfinite(r, &err);
        if (bad) {
            if (bad < 0) fprintf(stderr, "trident: ckpt verify: %s\n", err.msg);
            else fprintf(stderr, "trident: ckpt verify: %s: %d tensors with NaN or infinite "
                         "values; not a checkpoint to resume from\n", in->path, bad);
            checkpoint_close(r);
            return STATUS_BAD_INPUT;
        }
        const char *const *state_names;
        int n_state = optimizer_state_names(&state_names);
        const char *const fp8_optional[] = {MODEL_FP8_STATE_PREFIX}; // the model's FP8 scaling state
        // The tensors of the manifest's model, then its layout against their
        // pieces (metadata only).
        if (checkpoint_check_tensors(r, state_names, n_state, fp8_optional, 1, &err) ||
            checkpoint_check_layout(r, &err)) {
            fprintf(stderr, "trident: ckpt verify: %s\n", err.msg);
            checkpoint_close(r);
            return err.status;
        }
        printf("ok: %s: step %lld, %d rank files, %d pieces; checksums match, every tensor "
               "complete and finite, the tensors of the manifest's model in the blocks of its layout%s\n", in->path, (long long)in->step, in->world_size,
               checkpoint_n_pieces(r), in->weights_only ? "; weights only (use as model.init_from)" : "");
    }
    checkpoint_close(r);
    return STATUS_OK;
}

// `trident import HF_DIR OUT_DIR`: a Hugging Face folder (hf.h's families) as
// a trident checkpoint (hf_import); its tokenizer.json, when present, gives
// the checkpoint's tokenizer id and is kept as OUT_DIR/tokenizer.json.
int cmd_import(int argc, char **argv) {
    if (cli_is_help(argc, argv)) {
        cli_print_help(&cli_import, stdout);
        return STATUS_OK;
    }
    struct ckpt_args o = {0};
    struct error perr = {0};
    if (cli_parse(&cli_import, argc, argv, &o, &perr)) {
        fprintf(stderr, "trident: import: %s\n(trident import --help for usage)\n", perr.msg);
        return perr.status;
    }
    struct error err = {0};
    struct hf_model *h = NULL;
    char tok_id[64];
    if (hf_open(o.dir, NULL, &h, &err) == STATUS_OK &&
        tokenizer_folder_identity(o.dir, tok_id, sizeof tok_id, &err) == STATUS_OK)
        hf_import(h, o.out, tok_id, &err);
    hf_close(h);
    if (err.status) {
        fprintf(stderr, "trident: import: %s\n", err.msg);
        return err.status;
    }
    printf("imported %s as the checkpoint %s/step-000000 (weights only: use it as model.init_from)\n",
           o.dir, o.out);
    return STATUS_OK;
}
