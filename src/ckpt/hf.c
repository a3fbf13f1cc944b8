// hf.c: a checkpoint written as a Hugging Face LlamaForCausalLM folder (hf.h).
#include "hf.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_internal.h"
#include "kernels/cpu/half.h"
#include "safetensors.h"

enum { HF_MAX_FILES = 64 };

// The file names written so far under the .tmp folder (removed on failure).
struct written {
    char dir[CKPT_PATH_MAX];
    char names[HF_MAX_FILES + 8][64];
    int n;
};

static void written_path(struct written *w, const char *name, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", w->dir, name);
    if (w->n < HF_MAX_FILES + 8) snprintf(w->names[w->n++], sizeof w->names[0], "%s", name);
}

static enum status write_json(struct written *w, const char *name, json_t *j, struct error *err) {
    char path[CKPT_PATH_MAX + 64];
    written_path(w, name, path, sizeof path);
    int bad = json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(16));
    json_decref(j);
    return bad ? error_set(err, STATUS_RUNTIME, "%s: cannot write", path) : STATUS_OK;
}

// The shortest decimal that reads back as the float f (1e-05, not 9.99999975e-06).
static double shortest_float(float f) {
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

static const char *torch_dtype(enum dtype d) {
    return d == DTYPE_BF16 ? "bfloat16" : d == DTYPE_FP16 ? "float16" : "float32";
}

// config.json: the keys LlamaConfig reads (transformers'
// models/llama/configuration_llama.py); head_dim = C / H.
static json_t *config_json(const struct llama_config *m, enum dtype d, int bos, int eos) {
    json_t *j = json_object();
    json_object_set_new(j, "architectures", json_pack("[s]", "LlamaForCausalLM"));
    json_object_set_new(j, "model_type", json_string("llama"));
    json_object_set_new(j, "vocab_size", json_integer(m->vocab_size));
    json_object_set_new(j, "hidden_size", json_integer(m->d_model));
    json_object_set_new(j, "intermediate_size", json_integer(m->ffn_dim));
    json_object_set_new(j, "num_hidden_layers", json_integer(m->n_layers));
    json_object_set_new(j, "num_attention_heads", json_integer(m->n_heads));
    json_object_set_new(j, "num_key_value_heads", json_integer(m->n_kv_heads));
    json_object_set_new(j, "head_dim", json_integer(m->d_model / m->n_heads));
    json_object_set_new(j, "max_position_embeddings", json_integer(m->max_seq_len));
    json_object_set_new(j, "rope_theta", json_real(m->rope_theta));
    json_object_set_new(j, "rope_scaling", json_null());
    json_object_set_new(j, "rms_norm_eps", json_real(shortest_float(m->norm_eps)));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    json_object_set_new(j, "attention_bias", json_false());
    json_object_set_new(j, "attention_dropout", json_real(0.0));
    json_object_set_new(j, "mlp_bias", json_false());
    json_object_set_new(j, "pretraining_tp", json_integer(1));
    json_object_set_new(j, "tie_word_embeddings", json_boolean(m->tie_embeddings));
    json_object_set_new(j, "torch_dtype", json_string(torch_dtype(d)));
    json_object_set_new(j, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
    json_object_set_new(j, "eos_token_id", eos >= 0 ? json_integer(eos) : json_null());
    json_object_set_new(j, "use_cache", json_true());
    return j;
}

static enum status copy_file(const char *from, const char *to, struct error *err) {
    FILE *in = fopen(from, "rb");
    if (!in) return error_set(err, STATUS_BAD_INPUT, "%s: cannot open: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return error_set(err, STATUS_RUNTIME, "%s: cannot create: %s", to, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    int ok = 1;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    ok = !ferror(in) && ok;
    fclose(in);
    ok = (fclose(out) == 0) && ok;
    return ok ? STATUS_OK : error_set(err, STATUS_RUNTIME, "%s: cannot copy to %s", from, to);
}

// One parameter read whole and converted to the export dtype.
struct hf_tensor {
    char name[CKPT_NAME_MAX];
    int rows, cols;
    void *data; // (rows * cols,) of the export dtype
    uint64_t bytes;
};

static enum status read_params(struct ckpt_reader *r, int want_dtype, enum dtype *out_dtype,
                               struct hf_tensor **out, int *n_out, struct error *err) {
    int n = checkpoint_n_pieces(r), k = 0;
    struct hf_tensor *t = xcalloc((size_t)n + 1, sizeof *t);
    enum status st = STATUS_OK;
    enum dtype d = DTYPE_FP32;
    for (int i = 0; i < n && !st; i++) {
        const struct ckpt_piece *p = checkpoint_piece_at(r, i, NULL);
        if (strncmp(p->name, "param/", 6)) continue;
        if (i > 0 && !strcmp(checkpoint_piece_at(r, i - 1, NULL)->name, p->name)) continue;
        if (k == 0) d = want_dtype >= 0 ? (enum dtype)want_dtype : p->dtype;
        if (d != DTYPE_FP32 && d != DTYPE_BF16 && d != DTYPE_FP16) d = DTYPE_FP32;
        struct ckpt_piece want = *p;
        want.row_offset = want.col_offset = 0, want.rows = p->grows, want.cols = p->gcols;
        want.flat_begin = 0, want.flat_end = (size_t)p->grows * p->gcols;
        // Read as stored (fp32 as fp32, bf16 as bf16), then convert.
        want.dtype = (p->dtype == DTYPE_FP64) ? DTYPE_FP32 : p->dtype;
        want.data = xmalloc(want.flat_end * dtype_size(want.dtype));
        st = checkpoint_read_piece(r, &want, err);
        size_t numel = want.flat_end;
        void *conv = want.data;
        if (!st && want.dtype != d) {
            conv = xmalloc(numel * dtype_size(d));
            for (size_t e = 0; e < numel; e++) {
                float v = want.dtype == DTYPE_FP32   ? ((float *)want.data)[e]
                          : want.dtype == DTYPE_BF16 ? bf16_to_f32(((uint16_t *)want.data)[e])
                                                     : fp16_to_f32(((uint16_t *)want.data)[e]);
                if (d == DTYPE_FP32) ((float *)conv)[e] = v;
                else if (d == DTYPE_BF16) ((uint16_t *)conv)[e] = bf16_from_f32(v);
                else ((uint16_t *)conv)[e] = fp16_from_f32(v);
            }
            free(want.data);
        }
        if (st) {
            free(want.data);
            break;
        }
        snprintf(t[k].name, sizeof t[k].name, "%s", p->name + 6);
        t[k].rows = p->grows, t[k].cols = p->gcols, t[k].data = conv;
        t[k].bytes = numel * dtype_size(d);
        k++;
    }
    if (!st && k == 0)
        st = error_set(err, STATUS_BAD_INPUT, "%s: holds no parameters", checkpoint_info(r)->path);
    if (st) {
        for (int i = 0; i < k; i++) free(t[i].data);
        free(t);
        return st;
    }
    *out = t, *n_out = k, *out_dtype = d;
    return STATUS_OK;
}

static enum status write_weights(struct written *w, const struct hf_tensor *t, int n,
                                 enum dtype d, uint64_t max_shard, struct error *err) {
    // Greedy shards in name order: a new file when the next tensor would pass
    // max_shard (a tensor larger than max_shard gets a file of its own).
    int shard_of[n > 0 ? n : 1], n_shards = 0;
    uint64_t in_shard = 0, total = 0;
    for (int i = 0; i < n; i++) {
        if (i == 0 || (max_shard && in_shard > 0 && in_shard + t[i].bytes > max_shard))
            n_shards++, in_shard = 0;
        shard_of[i] = n_shards - 1;
        in_shard += t[i].bytes;
        total += t[i].bytes;
    }
    if (n_shards > HF_MAX_FILES)
        return error_set(err, STATUS_BAD_INPUT, "%s: --max-shard-size %llu makes %d files, at "
                         "most %d", w->dir, (unsigned long long)max_shard, n_shards, HF_MAX_FILES);
    const char *meta[] = {"format", "pt"};
    json_t *map = json_object();
    enum status st = STATUS_OK;
    for (int s = 0; s < n_shards && !st; s++) {
        char name[64], path[CKPT_PATH_MAX + 64];
        if (n_shards == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        struct safetensors_entry *e = xcalloc((size_t)n, sizeof *e);
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (shard_of[i] != s) continue;
            e[m] = (struct safetensors_entry){.name = t[i].name, .dtype = d, .data = t[i].data};
            e[m].ndim = t[i].cols == 1 ? 1 : 2;
            e[m].shape[0] = t[i].rows, e[m].shape[1] = t[i].cols;
            json_object_set_new(map, t[i].name, json_string(name));
            m++;
        }
        written_path(w, name, path, sizeof path);
        st = safetensors_write(path, e, m, meta, 1, err);
        free(e);
    }
    if (!st && n_shards > 1) {
        json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                                "weight_map", map);
        return write_json(w, "model.safetensors.index.json", idx, err);
    }
    json_decref(map);
    return st;
}

enum status hf_export(struct ckpt_reader *r, const struct hf_export_args *a, struct error *err) {
    struct stat sb;
    if (stat(a->out_dir, &sb) == 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: exists; export writes a new folder (remove "
                         "it or choose another name)", a->out_dir);
    struct written w = {.n = 0};
    snprintf(w.dir, sizeof w.dir, "%s.tmp", a->out_dir);
    if (stat(w.dir, &sb) == 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: exists (a failed export?); remove it",
                         w.dir);
    if (mkdir(w.dir, 0777))
        return error_set(err, STATUS_BAD_INPUT, "%s: cannot create: %s", w.dir, strerror(errno));
    struct hf_tensor *t = NULL;
    int n = 0;
    enum dtype d;
    const struct llama_config *m = &checkpoint_info(r)->model;
    enum status st = read_params(r, a->dtype, &d, &t, &n, err);
    if (!st) st = write_weights(&w, t, n, d, a->max_shard_bytes, err);
    if (!st) st = write_json(&w, "config.json", config_json(m, d, a->bos_id, a->eos_id), err);
    if (!st) {
        json_t *g = json_object();
        json_object_set_new(g, "bos_token_id", a->bos_id >= 0 ? json_integer(a->bos_id) : json_null());
        json_object_set_new(g, "eos_token_id", a->eos_id >= 0 ? json_integer(a->eos_id) : json_null());
        st = write_json(&w, "generation_config.json", g, err);
    }
    if (!st && a->tokenizer_json) {
        char path[CKPT_PATH_MAX + 64];
        written_path(&w, "tokenizer.json", path, sizeof path);
        st = copy_file(a->tokenizer_json, path, err);
        if (!st) {
            json_t *tc = json_object();
            json_object_set_new(tc, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
            if (a->eos_token) {
                json_object_set_new(tc, "bos_token", json_string(a->eos_token));
                json_object_set_new(tc, "eos_token", json_string(a->eos_token));
            }
            json_object_set_new(tc, "model_max_length", json_integer(m->max_seq_len));
            json_object_set_new(tc, "clean_up_tokenization_spaces", json_false());
            // what transformers' generate(**tok(text, return_tensors="pt")) accepts:
            // no token_type_ids (PreTrainedTokenizerFast's default returns them)
            json_object_set_new(tc, "model_input_names", json_pack("[s, s]", "input_ids", "attention_mask"));
            if (a->chat_template) json_object_set_new(tc, "chat_template", json_string(a->chat_template));
            st = write_json(&w, "tokenizer_config.json", tc, err);
        }
    }
    for (int i = 0; i < n; i++) free(t[i].data);
    free(t);
    if (!st && rename(w.dir, a->out_dir))
        st = error_set(err, STATUS_RUNTIME, "%s: cannot rename to %s: %s", w.dir, a->out_dir,
                       strerror(errno));
    if (st) {
        char path[CKPT_PATH_MAX + 80];
        for (int i = 0; i < w.n; i++) {
            snprintf(path, sizeof path, "%s/%s", w.dir, w.names[i]);
            unlink(path);
        }
        rmdir(w.dir);
    }
    return st;
}

// ---- reading a Hugging Face folder ----

enum { HF_READ_FILES = HF_MAX_FILES };

struct hf_entry {
    const struct safetensors_tensor *t;
    int file;
};

struct hf_model {
    char dir[CKPT_PATH_MAX];
    struct llama_config lc;
    int eos_id;
    long long head_dim; // config.json's head_dim: 0 absent or null, -1 not an integer
    int n_files;
    struct safetensors_file *files[HF_READ_FILES];
    char file_names[HF_READ_FILES][256];
    int n;
    struct hf_entry *e; // (n,) sorted by name
};

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const struct hf_entry *)a)->t->name, ((const struct hf_entry *)b)->t->name);
}

void hf_close(struct hf_model *h) {
    if (!h) return;
    for (int i = 0; i < h->n_files; i++) safetensors_close(h->files[i]);
    free(h->e);
    free(h);
}

const struct llama_config *hf_config(const struct hf_model *h) { return &h->lc; }
int hf_eos_id(const struct hf_model *h) { return h->eos_id; }
int hf_n_tensors(const struct hf_model *h) { return h->n; }
const struct safetensors_tensor *hf_tensor_at(const struct hf_model *h, int i) {
    return i >= 0 && i < h->n ? h->e[i].t : NULL;
}

// Reads config.json into h->lc. Errors name the file and key.
static enum status read_config(struct hf_model *h, struct error *err) {
    char path[CKPT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", h->dir);
    if (access(path, F_OK))
        return error_set(err, STATUS_BAD_INPUT, "%s: no such file; a Hugging Face folder holds "
                         "config.json and model.safetensors (or its shards)", path);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        return error_set(err, STATUS_BAD_INPUT, "%s: cannot read a JSON object: %s (line %d)",
                         path, je.text, je.line);
    }
    enum status st = STATUS_OK;
    json_t *arch = json_object_get(j, "architectures"), *act = json_object_get(j, "hidden_act"),
           *rs = json_object_get(j, "rope_scaling");
    const char *a0 = json_string_value(json_array_get(arch, 0));
    if (!a0 || strcmp(a0, "LlamaForCausalLM"))
        st = error_set(err, STATUS_BAD_INPUT, "%s: architectures = %s, expected "
                       "[\"LlamaForCausalLM\"]", path, a0 ? a0 : "(absent)");
    else if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        st = error_set(err, STATUS_BAD_INPUT, "%s: hidden_act = %s, trident computes silu "
                       "(SwiGLU)", path, json_is_string(act) ? json_string_value(act) : "?");
    else if (json_is_true(json_object_get(j, "attention_bias")) ||
             json_is_true(json_object_get(j, "mlp_bias")))
        st = error_set(err, STATUS_BAD_INPUT, "%s: attention_bias or mlp_bias is true; trident's "
                       "LLaMA has no biases", path);
    else if (rs && !json_is_null(rs))
        st = error_set(err, STATUS_BAD_INPUT, "%s: rope_scaling is set; trident supports plain "
                       "RoPE only", path);
    struct {
        const char *key;
        int *dst;
    } ints[] = {{"vocab_size", &h->lc.vocab_size},       {"hidden_size", &h->lc.d_model},
                {"num_hidden_layers", &h->lc.n_layers},  {"num_attention_heads", &h->lc.n_heads},
                {"intermediate_size", &h->lc.ffn_dim},
                {"max_position_embeddings", &h->lc.max_seq_len}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !st; i++) {
        json_t *v = json_object_get(j, ints[i].key);
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX)
            st = error_set(err, STATUS_BAD_INPUT, "%s: %s must be a positive integer", path,
                           ints[i].key);
        else *ints[i].dst = (int)json_integer_value(v);
    }
    if (!st) {
        json_t *kv = json_object_get(j, "num_key_value_heads");
        h->lc.n_kv_heads = json_is_integer(kv) ? (int)json_integer_value(kv) : h->lc.n_heads;
        json_t *hd = json_object_get(j, "head_dim");
        h->head_dim = !hd || json_is_null(hd) ? 0 : json_is_integer(hd) ? json_integer_value(hd) : -1;
        json_t *th = json_object_get(j, "rope_theta"), *eps = json_object_get(j, "rms_norm_eps");
        h->lc.rope_theta = json_is_number(th) ? json_number_value(th) : 10000.0;
        h->lc.norm_eps = json_is_number(eps) ? (float)json_number_value(eps) : 1e-6f;
        json_t *tie = json_object_get(j, "tie_word_embeddings");
        h->lc.tie_embeddings = tie ? json_is_true(tie) : true; // PretrainedConfig's default
        json_t *eos = json_object_get(j, "eos_token_id");
        h->eos_id = json_is_integer(eos) ? (int)json_integer_value(eos) : -1;
    }
    json_decref(j);
    return st;
}

static enum status add_file(struct hf_model *h, const char *name, struct error *err) {
    if (h->n_files == HF_READ_FILES)
        return error_set(err, STATUS_BAD_INPUT, "%s: more than %d safetensors files", h->dir,
                         HF_READ_FILES);
    char path[CKPT_PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", h->dir, name);
    snprintf(h->file_names[h->n_files], sizeof h->file_names[0], "%s", name);
    return safetensors_open(path, &h->files[h->n_files++], err) ? (h->n_files--, err->status)
                                                                 : STATUS_OK;
}

// The shape LlamaForCausalLM gives a parameter name, or ndim 0 for a name it
// does not have.
static int expected_shape(const struct llama_config *m, const char *name, int64_t *shape) {
    int64_t C = m->d_model, D = llama_head_dim(m), F = m->ffn_dim, V = m->vocab_size;
    int l, used = 0;
    char rest[CKPT_NAME_MAX];
    if (!strcmp(name, "model.embed_tokens.weight") ||
        (!strcmp(name, "lm_head.weight") && !m->tie_embeddings))
        return shape[0] = V, shape[1] = C, 2;
    if (!strcmp(name, "model.norm.weight")) return shape[0] = C, 1;
    if (sscanf(name, "model.layers.%d.%127s%n", &l, rest, &used) != 2 || name[used] || l < 0 ||
        l >= m->n_layers)
        return 0;
    if (!strcmp(rest, "input_layernorm.weight") || !strcmp(rest, "post_attention_layernorm.weight"))
        return shape[0] = C, 1;
    if (!strcmp(rest, "self_attn.q_proj.weight")) return shape[0] = m->n_heads * D, shape[1] = C, 2;
    if (!strcmp(rest, "self_attn.k_proj.weight") || !strcmp(rest, "self_attn.v_proj.weight"))
        return shape[0] = m->n_kv_heads * D, shape[1] = C, 2;
    if (!strcmp(rest, "self_attn.o_proj.weight")) return shape[0] = C, shape[1] = m->n_heads * D, 2;
    // issue 28's options (model.h): Qwen2's biases, Qwen3's q/k norms
    if (m->qkv_bias && !strcmp(rest, "self_attn.q_proj.bias")) return shape[0] = m->n_heads * D, 1;
    if (m->qkv_bias && (!strcmp(rest, "self_attn.k_proj.bias") || !strcmp(rest, "self_attn.v_proj.bias")))
        return shape[0] = m->n_kv_heads * D, 1;
    if (m->qk_norm && (!strcmp(rest, "self_attn.q_norm.weight") || !strcmp(rest, "self_attn.k_norm.weight")))
        return shape[0] = D, 1;
    if (!strcmp(rest, "mlp.gate_proj.weight") || !strcmp(rest, "mlp.up_proj.weight"))
        return shape[0] = F, shape[1] = C, 2;
    if (!strcmp(rest, "mlp.down_proj.weight")) return shape[0] = C, shape[1] = F, 2;
    return 0;
}

static const struct hf_entry *hf_find(const struct hf_model *h, const char *name);

// The tensors LlamaForCausalLM needs (the model's parameter table: its
// names are Hugging Face's) that the folder lacks: how many, and the first
// few named in buf ("a, b, c, ..."); *need: how many it needs.
// Errors: model_param_table's (a config.json trident cannot build).
static enum status missing_tensors(const struct hf_model *h, char *buf, size_t cap, int *need,
                                   int *n_missing, struct error *err) {
    struct param_info *params;
    enum status st = model_param_table(&h->lc, &params, need, err);
    if (st) return st;
    size_t used = 0;
    buf[0] = '\0';
    *n_missing = 0;
    for (int i = 0; i < *need; i++) {
        if (hf_find(h, params[i].name)) continue;
        if (*n_missing < 3 && used < cap)
            used += (size_t)snprintf(buf + used, cap - used, "%s%s", *n_missing ? ", " : "", params[i].name);
        else if (*n_missing == 3 && used < cap) used += (size_t)snprintf(buf + used, cap - used, ", ...");
        (*n_missing)++;
    }
    free(params);
    return STATUS_OK;
}

enum status hf_open(const char *dir, const struct llama_config *expect, struct hf_model **out,
                    struct error *err) {
    *out = NULL;
    struct hf_model *h = xcalloc(1, sizeof *h);
    snprintf(h->dir, sizeof h->dir, "%s", dir);
    enum status st = read_config(h, err);
    // The run's model against config.json first: a wrong hidden_size is named
    // as such, not through head_dim or a tensor's shape.
    if (!st && expect) st = hf_check_model(h, expect, err);
    if (!st && h->head_dim && h->head_dim * h->lc.n_heads != h->lc.d_model)
        st = error_set(err, STATUS_BAD_INPUT, "%s/config.json: head_dim = %lld, trident needs "
                       "hidden_size / num_attention_heads = %d", dir, h->head_dim,
                       h->lc.d_model / h->lc.n_heads);
    char idx[CKPT_PATH_MAX + 40];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    json_t *j = NULL, *wm = NULL;
    if (!st && access(idx, F_OK) == 0) {
        json_error_t je;
        j = json_load_file(idx, 0, &je);
        wm = json_object_get(j, "weight_map");
        if (!json_is_object(wm)) {
            st = error_set(err, STATUS_BAD_INPUT, "%s: no weight_map object", idx);
        } else {
            // The distinct file names, in order of first mention.
            const char *k;
            json_t *v;
            json_object_foreach(wm, k, v) {
                const char *fn = json_string_value(v);
                if (!fn || strchr(fn, '/')) {
                    st = error_set(err, STATUS_BAD_INPUT, "%s: weight_map[%s] is not a file name",
                                   idx, k);
                    break;
                }
                bool seen = false;
                for (int i = 0; i < h->n_files && !seen; i++) seen = !strcmp(h->file_names[i], fn);
                if (!seen && (st = add_file(h, fn, err))) break;
            }
        }
    } else if (!st) {
        st = add_file(h, "model.safetensors", err);
    }
    int total = 0;
    for (int i = 0; i < h->n_files; i++) total += safetensors_n_tensors(h->files[i]);
    h->e = xcalloc((size_t)total + 1, sizeof *h->e);
    for (int i = 0; i < h->n_files && !st; i++)
        for (int k = 0; k < safetensors_n_tensors(h->files[i]); k++)
            h->e[h->n++] = (struct hf_entry){safetensors_tensor_at(h->files[i], k), i};
    qsort(h->e, (size_t)h->n, sizeof *h->e, cmp_entry);
    for (int i = 1; i < h->n && !st; i++)
        if (!strcmp(h->e[i].t->name, h->e[i - 1].t->name))
            st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s is in two safetensors files",
                           dir, h->e[i].t->name);
    // Every tensor is one LlamaForCausalLM has, of its shape, and none is missing.
    int want = 0;
    for (int i = 0; i < h->n && !st; i++) {
        const struct safetensors_tensor *t = h->e[i].t;
        int64_t shape[2];
        int nd = expected_shape(&h->lc, t->name, shape);
        if (!nd && !strcmp(t->name, "lm_head.weight")) continue; // tied: a saved copy
        if (!nd) {
            if (strstr(t->name, "rotary_emb.inv_freq")) continue; // older transformers saved it
            st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s is not a parameter of "
                           "LlamaForCausalLM with this config.json", dir, t->name);
        } else if (t->ndim != nd || t->shape[0] != shape[0] || (nd == 2 && t->shape[1] != shape[1]))
            st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s has %d dimensions (%lld, %lld), "
                           "config.json implies (%lld, %lld)", dir, t->name, t->ndim,
                           (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 1),
                           (long long)shape[0], (long long)(nd > 1 ? shape[1] : 1));
        else if (t->dtype != DTYPE_FP32 && t->dtype != DTYPE_BF16 && t->dtype != DTYPE_FP16)
            st = error_set(err, STATUS_BAD_INPUT, "%s: tensor %s is %s; expected F32, BF16 or F16",
                           dir, t->name, safetensors_dtype_name(t->dtype));
        else want++;
    }
    // Each tensor is in the shard the index names.
    const char *k;
    json_t *v;
    if (!st && json_is_object(wm)) json_object_foreach(wm, k, v) {
        const struct hf_entry *e = hf_find(h, k);
        const char *fn = json_string_value(v);
        if (!e || strcmp(h->file_names[e->file], fn)) {
            st = error_set(err, STATUS_BAD_INPUT, "%s: weight_map puts tensor %s in %s, which "
                           "does not hold it%s%s", idx, k, fn, e ? "; it is in " : "",
                           e ? h->file_names[e->file] : "");
            break;
        }
    }
    json_decref(j);
    char names[400];
    int need = 0, n_missing = 0;
    if (!st && missing_tensors(h, names, sizeof names, &need, &n_missing, err)) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        st = error_set(err, STATUS_BAD_INPUT, "%s/config.json: not a model trident builds: %s", dir, why);
    }
    if (!st && want != need)
        st = error_set(err, STATUS_BAD_INPUT, "%s: %d of the %d tensors LlamaForCausalLM needs "
                       "are present; missing: %s", dir, need - n_missing, need, names);
    if (st) hf_close(h);
    else *out = h;
    return st;
}

static const struct hf_entry *hf_find(const struct hf_model *h, const char *name) {
    struct safetensors_tensor key;
    snprintf(key.name, sizeof key.name, "%s", name);
    struct hf_entry k = {&key, 0};
    return bsearch(&k, h->e, (size_t)h->n, sizeof *h->e, cmp_entry);
}

enum status hf_check_model(const struct hf_model *h, const struct llama_config *m,
                           struct error *err) {
    const struct llama_config *f = &h->lc;
    struct {
        const char *hf, *ours;
        int a, b;
    } ints[] = {{"hidden_size", "d_model", f->d_model, m->d_model},
                {"intermediate_size", "ffn_dim", f->ffn_dim, m->ffn_dim},
                {"num_attention_heads", "n_heads", f->n_heads, m->n_heads},
                {"num_key_value_heads", "n_kv_heads", f->n_kv_heads, m->n_kv_heads},
                {"num_hidden_layers", "n_layers", f->n_layers, m->n_layers},
                {"vocab_size", "vocab_size", f->vocab_size, m->vocab_size},
                {"tie_word_embeddings", "tie_embeddings", f->tie_embeddings, m->tie_embeddings}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].a != ints[i].b)
            return error_set(err, STATUS_BAD_INPUT, "%s/config.json: %s = %d, the run's [model] "
                             "%s = %d", h->dir, ints[i].hf, ints[i].a, ints[i].ours, ints[i].b);
    if (f->rope_theta != m->rope_theta)
        return error_set(err, STATUS_BAD_INPUT, "%s/config.json: rope_theta = %.17g, the run's "
                         "[model] rope_theta = %.17g", h->dir, f->rope_theta, m->rope_theta);
    if (f->norm_eps != m->norm_eps)
        return error_set(err, STATUS_BAD_INPUT, "%s/config.json: rms_norm_eps = %.9g, the run's "
                         "[model] norm_eps = %.9g", h->dir, (double)f->norm_eps,
                         (double)m->norm_eps);
    return STATUS_OK;
}

enum status hf_read_piece(struct hf_model *h, struct ckpt_piece *want, struct error *err) {
    const char *name = strncmp(want->name, "param/", 6) ? want->name : want->name + 6;
    const struct hf_entry *e = hf_find(h, name);
    if (!e)
        return error_set(err, STATUS_BAD_INPUT, "%s: no tensor %s", h->dir, name);
    const struct safetensors_tensor *t = e->t;
    int64_t cols = t->ndim > 1 ? t->shape[1] : 1;
    if (t->shape[0] != want->grows || cols != want->gcols || want->dtype != DTYPE_FP32)
        return error_set(err, STATUS_BAD_INPUT, "%s: tensor %s is (%lld, %lld), the model's is "
                         "(%d, %d)", h->dir, name, (long long)t->shape[0], (long long)cols,
                         want->grows, want->gcols);
    size_t es = dtype_size(t->dtype);
    float *dst = want->data;
    uint16_t *row = xmalloc((size_t)want->cols * es);
    enum status st = STATUS_OK;
    for (size_t i = want->flat_begin; i < want->flat_end && !st;) {
        size_t br = i / (size_t)want->cols, bc = i % (size_t)want->cols;
        size_t run = MIN((size_t)want->cols - bc, want->flat_end - i);
        uint64_t at = ((uint64_t)(want->row_offset + br) * (uint64_t)cols + want->col_offset + bc) * es;
        st = safetensors_read(h->files[e->file], t, at, run * es, row, err);
        for (size_t k = 0; k < run && !st; k++) {
            float v = t->dtype == DTYPE_FP32   ? ((float *)row)[k]
                      : t->dtype == DTYPE_BF16 ? bf16_to_f32(row[k])
                                               : fp16_to_f32(row[k]);
            dst[i - want->flat_begin + k] = v;
        }
        i += run;
    }
    free(row);
    // A NaN or an infinity would train to a NaN loss or generate garbage; a
    // trident checkpoint never holds one (checkpoint_write_rank refuses it).
    size_t first = 0, bad = st ? 0 : ckpt_count_nonfinite(dst, DTYPE_FP32,
                                                          want->flat_end - want->flat_begin, &first);
    if (bad) {
        size_t f = want->flat_begin + first;
        size_t r = want->row_offset + f / (size_t)want->cols, c = want->col_offset + f % (size_t)want->cols;
        st = error_set(err, STATUS_BAD_INPUT, "%s/%s: tensor %s holds %zu non-finite values in "
                       "the part read; the first at element %zu (row %zu, column %zu): %g",
                       h->dir, h->file_names[e->file], name, bad, r * (size_t)cols + c, r, c,
                       (double)dst[first]);
    }
    return st;
}

enum status hf_import(struct hf_model *h, const char *dir, const char *tokenizer_id,
                      struct error *err) {
    char latest[CKPT_PATH_MAX + 16];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    if (access(latest, F_OK) == 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: holds checkpoints (%s); import writes into "
                         "a new dir", dir, latest);
    struct ckpt_piece *p = xcalloc((size_t)h->n + 1, sizeof *p);
    int n = 0;
    enum status st = STATUS_OK;
    for (int i = 0; i < h->n && !st; i++) {
        const struct safetensors_tensor *t = h->e[i].t;
        int64_t shape[2];
        if (!expected_shape(&h->lc, t->name, shape)) continue; // a tied model's lm_head copy
        struct ckpt_piece *q = &p[n++];
        size_t len = MIN(strlen(t->name), sizeof q->name - 7); // a known name: it fits
        memcpy(q->name, "param/", 6);
        memcpy(q->name + 6, t->name, len);
        q->name[6 + len] = '\0';
        q->grows = q->rows = (int)t->shape[0];
        q->gcols = q->cols = t->ndim > 1 ? (int)t->shape[1] : 1;
        q->flat_end = (size_t)q->rows * q->cols, q->dtype = DTYPE_FP32;
        q->data = xmalloc(q->flat_end * sizeof(float));
        st = hf_read_piece(h, q, err);
    }
    struct ckpt_file_sum sum;
    struct ckpt_save_args a = {.dir = dir, .step = 0, .layout = topology_layout(1, 1, 1, 0, 1), .rank = 0,
                               .model = &h->lc, .tokenizer_id = tokenizer_id ? tokenizer_id : "",
                               .pieces = p, .n_pieces = n, .weights_only = true}; // no training state: /state holds step alone
    if (!st && mkdir(dir, 0777) && errno != EEXIST)
        st = error_set(err, STATUS_BAD_INPUT, "%s: cannot create: %s", dir, strerror(errno));
    // The folder's tokenizer.json kept next to step-000000, where generate and
    // ckpt export look for it (docs/formats.md "Hugging Face import").
    char tok_from[CKPT_PATH_MAX + 16], tok_to[CKPT_PATH_MAX + 16];
    snprintf(tok_from, sizeof tok_from, "%s/tokenizer.json", h->dir);
    snprintf(tok_to, sizeof tok_to, "%s/tokenizer.json", dir);
    if (!st && access(tok_from, F_OK) == 0) st = copy_file(tok_from, tok_to, err);
    if (!st) st = checkpoint_prepare(&a, err);
    if (!st) st = checkpoint_write_rank(&a, &sum, err);
    if (!st) st = checkpoint_commit(&a, &sum, err);
    for (int i = 0; i < n; i++) free(p[i].data);
    free(p);
    return st;
}
