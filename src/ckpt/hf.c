// hf.c: a checkpoint written as a Hugging Face LlamaForCausalLM folder (hf.h).
#include "hf.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
